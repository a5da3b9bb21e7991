//! The catalog's delta versions and checkpoints: a catalog written before
//! them opens and moves on; a failure at any store call of a commit or a
//! checkpoint loses no acknowledged change and leaves a catalog every
//! reader loads alike; handles committing while checkpoints are written in
//! the background agree.

use std::collections::BTreeSet;
use std::sync::Arc;

use crate::helpers::catalog_ids as ids;
use datafusion::arrow::array::AsArray;
use datafusion::arrow::datatypes::Int64Type;
use memwal::catalog::Outcome;
use memwal::testing::{Fault, FaultyStore, OpKind};
use memwal::{Catalog, CatalogOptions, MemwalSession, ObjectPath, ObjectRoot};
use object_store::ObjectStore;
use object_store::memory::InMemory;

fn ns(name: &str) -> ObjectPath {
    ObjectPath::parse_dotted(name).unwrap()
}

async fn open(store: Arc<dyn ObjectStore>, options: &CatalogOptions) -> Arc<Catalog> {
    Catalog::open(ObjectRoot::new(store, "memory://catalog"), options.clone())
        .await
        .unwrap()
}

/// The names of the objects under `prefix` with content.
async fn with_content(store: &Arc<dyn ObjectStore>, prefix: &str) -> Vec<String> {
    use futures::TryStreamExt;
    let listed: Vec<_> = store
        .list(Some(&prefix.into()))
        .try_collect()
        .await
        .unwrap();
    listed
        .into_iter()
        .filter(|o| o.size > 0)
        .map(|o| o.location.to_string())
        .collect()
}

#[tokio::test]
async fn a_catalog_of_the_previous_format_opens_and_moves_on() {
    // Written by memwal at 1a683c7 (every version a full catalog):
    // namespaces `sales` and `odd name` (dropped), tables `sales.orders`
    // (rows 1, 2, 3) and `t`.
    let dir = crate::helpers::fixture_root("catalog-format-1");
    let root = dir.path().to_str().unwrap();
    let session = MemwalSession::open(root).await.unwrap();
    let ids_of = |batches: &[datafusion::arrow::array::RecordBatch]| -> Vec<i64> {
        batches
            .iter()
            .flat_map(|b| b.column(0).as_primitive::<Int64Type>().values().to_vec())
            .collect()
    };
    let rows = crate::helpers::run(&session, "SELECT id FROM sales.orders ORDER BY id").await;
    assert_eq!(ids_of(&rows), [1, 2, 3]);
    crate::helpers::run(&session, "CREATE SCHEMA fresh").await;
    crate::helpers::run(&session, "INSERT INTO sales.orders VALUES (4, 'd')").await;
    drop(session);

    let catalog = Catalog::open(ObjectRoot::open(root).unwrap(), CatalogOptions::default())
        .await
        .unwrap();
    assert_eq!(ids(&catalog), ["fresh", "sales", "sales$orders", "t"]);
    // The first commit on it wrote a checkpoint (in the background): a
    // handle opening after one more commit finds it, or reads on from the
    // newest full version; either way the same catalog.
    catalog
        .create_namespace(ns("fresh.er"), false)
        .await
        .unwrap();
    assert!(catalog.checkpoint().await.unwrap() > 5);
    let again = Catalog::open(ObjectRoot::open(root).unwrap(), CatalogOptions::default())
        .await
        .unwrap();
    assert_eq!(
        ids(&again),
        ["fresh", "fresh$er", "sales", "sales$orders", "t"]
    );
    let session = MemwalSession::open(root).await.unwrap();
    let rows = crate::helpers::run(&session, "SELECT id FROM sales.orders ORDER BY id").await;
    assert_eq!(ids_of(&rows), [1, 2, 3, 4]);
}

#[tokio::test]
async fn a_catalog_with_arrow_deltas_opens_and_moves_on() {
    // Written by memwal at 577ab93 (deltas as Arrow IPC files, format 2):
    // a checkpoint at version 1 (three namespaces), then three versions
    // of one namespace each.
    let dir = crate::helpers::fixture_root("catalog-format-2");
    let open = || crate::helpers::open_catalog(dir.path());
    let old = [
        "seed00000000",
        "seed00000001",
        "seed00000002",
        "t0_d1c4f53b_1",
        "t0_d1c4f53b_2",
        "t0_d1c4f53b_3",
    ];
    let catalog = open().await;
    assert_eq!(ids(&catalog), old);
    // A JSON delta on top: a reader loads the old checkpoint, the Arrow
    // deltas and it.
    catalog.create_namespace(ns("fresh"), false).await.unwrap();
    let reader = open().await;
    let mut all = old.to_vec();
    all.insert(0, "fresh");
    assert_eq!(ids(&reader), all);
    assert_eq!(reader.version(), 5);
    // And one from a checkpoint written now.
    catalog.checkpoint().await.unwrap();
    reader
        .drop_namespace(ns("seed00000000"), false, false)
        .await
        .unwrap();
    all.remove(1);
    assert_eq!(ids(&*open().await), all);
}

/// What a workload had acknowledged when it stopped.
#[derive(Default, Debug)]
struct Acked {
    created: BTreeSet<String>,
    dropped: BTreeSet<String>,
}

/// Creates namespaces and drops some, writing checkpoints between, with a
/// second handle following by refreshes; stops at the first error.
async fn workload(store: Arc<dyn ObjectStore>, options: &CatalogOptions) -> (Acked, bool) {
    let mut acked = Acked::default();
    let (Ok(writer), Ok(reader)) = (
        Catalog::open(
            ObjectRoot::new(Arc::clone(&store), "memory://c"),
            options.clone(),
        )
        .await,
        Catalog::open(ObjectRoot::new(store, "memory://c"), options.clone()).await,
    ) else {
        return (acked, true);
    };
    for i in 0..18 {
        let name = format!("n{i:02}");
        match writer.create_namespace(ns(&name), false).await {
            Ok(_) => acked.created.insert(name),
            Err(_) => return (acked, true),
        };
        if i % 4 == 3 {
            let old = format!("n{:02}", i - 2);
            match writer.drop_namespace(ns(&old), false, false).await {
                Ok(_) => acked.dropped.insert(old),
                Err(_) => return (acked, true),
            };
        }
        if i % 6 == 5 && writer.checkpoint().await.is_err() {
            return (acked, true);
        }
        if reader.refresh().await.is_err() {
            return (acked, true);
        }
    }
    (acked, false)
}

#[tokio::test]
async fn a_failure_at_any_store_call_of_a_commit_or_checkpoint_loses_nothing() {
    // Checkpoints only where the workload writes them, so that a clean run
    // and a faulty one make the same calls; versions collected two behind.
    let mut options = CatalogOptions::default();
    (options.checkpoint_every, options.keep_behind) = (0, 2);
    let targets = [
        (OpKind::Put, "__manifest/v"),
        (OpKind::Get, "__manifest/v"),
        (OpKind::Head, "__manifest/"),
        (OpKind::List, "__manifest"),
        (OpKind::Put, "__manifest/checkpoints/"),
        (OpKind::Get, "__manifest/checkpoints/"),
        (OpKind::Delete, "__manifest/"),
    ];
    let clean = FaultyStore::new(Arc::new(InMemory::new()));
    let (acked, failed) = workload(clean.clone(), &options).await;
    assert!(!failed && acked.created.len() == 18 && acked.dropped.len() == 4);
    let (mut cases, mut stopped) = (0, 0);
    for (kind, needle) in targets {
        let probe = FaultyStore::new(Arc::new(InMemory::new()));
        probe.inject(Fault::nth(kind, u64::MAX).on_paths_containing(needle));
        workload(probe.clone(), &options).await;
        for nth in 1..=probe.matched_calls() {
            for after in [false, true] {
                cases += 1;
                let inner: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
                let faulty = FaultyStore::new(Arc::clone(&inner));
                // This call and every later one like it fail: nothing
                // retries its way past the failure.
                let fault = Fault::nth(kind, nth)
                    .on_paths_containing(needle)
                    .times(u64::MAX);
                faulty.inject(if after { fault.after_write() } else { fault });
                let (acked, failed) = workload(faulty.clone(), &options).await;
                stopped += usize::from(failed);
                let case = format!("{kind:?} #{nth} on {needle} (after: {after})");

                // Without faults: every acknowledged change holds...
                let first = open(Arc::clone(&inner), &options).await;
                let present: BTreeSet<String> = ids(&first).into_iter().collect();
                for name in &acked.created {
                    assert!(
                        present.contains(name) || acked.dropped.contains(name),
                        "{case}: acknowledged {name} lost"
                    );
                }
                for name in &acked.dropped {
                    assert!(!present.contains(name), "{case}: dropped {name} is back");
                }
                // ...commits go on, and every reader, fresh or not, loads
                // the same catalog.
                first.create_namespace(ns("after"), false).await.unwrap();
                first.checkpoint().await.unwrap();
                first
                    .create_namespace(ns("after.more"), false)
                    .await
                    .unwrap();
                let second = open(Arc::clone(&inner), &options).await;
                assert_eq!(ids(&second), ids(&first), "{case}");
                assert_eq!(second.version(), first.version(), "{case}");
            }
        }
    }
    assert!(cases > 60, "only {cases} cases");
    assert!(
        stopped > cases / 2,
        "most faults should stop the workload ({stopped} of {cases})"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handles_committing_while_checkpoints_are_written_agree() {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let mut options = CatalogOptions::default();
    (options.checkpoint_every, options.keep_behind) = (8, 4);
    let handles =
        futures::future::join_all((0..4).map(|_| open(Arc::clone(&store), &options))).await;
    let tasks: Vec<_> = handles
        .iter()
        .enumerate()
        .map(|(h, catalog)| {
            let catalog = Arc::clone(catalog);
            tokio::spawn(async move {
                for i in 0..40 {
                    let name = ns(&format!("h{h}_{i:02}"));
                    assert_eq!(
                        catalog.create_namespace(name.clone(), false).await.unwrap(),
                        Outcome::Created
                    );
                    if i % 2 == 1 {
                        catalog.drop_namespace(name, false, false).await.unwrap();
                    }
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    // Each handle's own background checkpoint ends first.
    for h in &handles[1..] {
        h.checkpoint().await.unwrap();
    }
    // Twice: the second collects what the first covers.
    let last = handles[0].checkpoint().await.unwrap();
    assert_eq!(handles[0].checkpoint().await.unwrap(), last);
    assert!(last >= 240, "{last} versions");
    let fresh = open(Arc::clone(&store), &options).await;
    assert_eq!(fresh.snapshot().len(), 80);
    for h in &handles {
        h.refresh().await.unwrap();
        assert_eq!(ids(h), ids(&fresh));
    }
    // One checkpoint is left, and only the versions it cannot spare
    // keep their content.
    let checkpoints = with_content(&store, "__manifest/checkpoints").await;
    assert_eq!(
        checkpoints,
        [format!("__manifest/checkpoints/v{last:020}.arrow")]
    );
    let versions = with_content(&store, "__manifest").await.len() - 1;
    // Collections reached up to 4 behind the last checkpoint, and took in
    // what those of handles that had missed a checkpoint left.
    assert!(
        versions == 4,
        "{versions} versions of {last} keep their content"
    );
}

#[tokio::test]
async fn close_waits_for_the_checkpoint_the_last_commit_began() {
    let faulty = FaultyStore::new(Arc::new(InMemory::new()));
    let store: Arc<dyn ObjectStore> = faulty.clone();
    let catalog = open(Arc::clone(&store), &CatalogOptions::default()).await;
    // The first commit on a catalog makes a checkpoint due; its write is
    // held.
    let held = faulty.gate(OpKind::Put, "__manifest/checkpoints/");
    catalog.create_namespace(ns("first"), false).await.unwrap();
    // It began before the commit returned: closing waits for it.
    use futures::FutureExt;
    assert!(catalog.close().now_or_never().is_none());
    let closing = tokio::spawn({
        let catalog = Arc::clone(&catalog);
        async move { catalog.close().await }
    });
    held.arrived(1).await;
    assert!(!closing.is_finished());
    held.open();
    closing.await.unwrap();
    assert_eq!(
        with_content(&store, "__manifest/checkpoints").await,
        [format!("__manifest/checkpoints/v{:020}.arrow", 1)]
    );
    // The handle stays usable.
    catalog.create_namespace(ns("second"), false).await.unwrap();
    assert_eq!(ids(&catalog), ["first", "second"]);
}
