//! The catalog on a fault-injecting store: a failed or ambiguous version
//! write never loses or duplicates a change, and the error says what
//! happened.

use std::sync::Arc;

use crate::helpers::catalog_ids as ids;
use memwal::catalog::Outcome;
use memwal::testing::{Fault, FaultyStore, OpKind};
use memwal::{Catalog, CatalogOptions, Error, ObjectPath, ObjectRoot};
use object_store::memory::InMemory;

const VERSION: &str = "__manifest/v";

fn ns(name: &str) -> ObjectPath {
    ObjectPath::new([name]).unwrap()
}

async fn setup() -> (Arc<FaultyStore>, Arc<Catalog>) {
    let store = FaultyStore::new(Arc::new(InMemory::new()));
    let root = ObjectRoot::new(store.clone(), "memory://faulty");
    let catalog = Catalog::open(root, CatalogOptions::default())
        .await
        .unwrap();
    (store, catalog)
}

/// A fresh handle on the same store, without faults: what a restart sees.
async fn reopen(store: &Arc<FaultyStore>) -> Arc<Catalog> {
    store.clear();
    Catalog::open(
        ObjectRoot::new(store.clone(), "memory://faulty"),
        CatalogOptions::default(),
    )
    .await
    .unwrap()
}

#[tokio::test]
async fn failed_version_write_is_retried_at_the_same_version() {
    let (store, catalog) = setup().await;
    store.inject(
        Fault::nth(OpKind::Put, 1)
            .times(2)
            .on_paths_containing(VERSION),
    );
    assert_eq!(
        catalog.create_namespace(ns("a"), false).await.unwrap(),
        Outcome::Created
    );
    assert_eq!(store.injected(), 2);
    let after = reopen(&store).await;
    assert_eq!(ids(&after), ["a"]);
    assert_eq!(after.version(), 1);
}

/// A version write that landed, though its caller was told it failed, or
/// which the store's client retried after losing its answer (the retry
/// then finds the version there): the change is committed, once, and not
/// refused as another writer's (a CREATE said "already exists").
#[tokio::test]
async fn ambiguous_write_that_landed_is_committed_once() {
    for retried in [false, true] {
        let (store, catalog) = setup().await;
        catalog.create_namespace(ns("a"), false).await.unwrap();
        let fault = Fault::nth(OpKind::Put, 1).on_paths_containing(VERSION);
        store.inject(match retried {
            false => fault.after_write(),
            true => fault.retried(),
        });
        assert_eq!(
            catalog.create_namespace(ns("b"), false).await.unwrap(),
            Outcome::Created,
            "retried: {retried}"
        );
        assert_eq!(store.injected(), 1);
        // Not applied twice: version 2 holds it and no version 3 was made.
        let after = reopen(&store).await;
        assert_eq!(ids(&after), ["a", "b"]);
        assert_eq!(after.version(), 2);
        assert_eq!(catalog.version(), 2);
    }
}

#[tokio::test]
async fn unknown_outcome_is_reported_and_resolves_on_reopen() {
    let (store, catalog) = setup().await;
    store.inject(
        Fault::nth(OpKind::Put, 1)
            .after_write()
            .on_paths_containing(VERSION),
    );
    store.inject(
        Fault::nth(OpKind::Get, 1)
            .times(u64::MAX)
            .on_paths_containing(VERSION),
    );
    let err = catalog.create_namespace(ns("a"), false).await.unwrap_err();
    assert!(matches!(err, Error::CommitOutcomeUnknown { .. }), "{err}");
    let msg = err.to_string();
    assert!(
        msg.contains("unknown") && msg.contains("v00000000000000000001.arrow"),
        "{msg}"
    );
    // The write had landed: a reader sees it exactly once, and a retry with
    // IF NOT EXISTS finds it rather than duplicating it.
    let after = reopen(&store).await;
    assert_eq!(ids(&after), ["a"]);
    assert_eq!(
        after.create_namespace(ns("a"), true).await.unwrap(),
        Outcome::AlreadyThere
    );
    assert_eq!(after.version(), 1);
}

#[tokio::test]
async fn write_that_never_lands_fails_and_leaves_nothing() {
    let (store, catalog) = setup().await;
    store.inject(
        Fault::nth(OpKind::Put, 1)
            .times(u64::MAX)
            .on_paths_containing(VERSION),
    );
    let err = catalog.create_namespace(ns("a"), false).await.unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, Error::NotWritten { .. }), "{msg}");
    assert!(
        msg.contains("nothing of it was written") && msg.contains("injected Put fault"),
        "{msg}"
    );
    // Said once, not wrapped again on the way to the waiter.
    assert_eq!(msg.matches("object store").count(), 1, "{msg}");
    let after = reopen(&store).await;
    assert!(ids(&after).is_empty());
    assert_eq!(after.version(), 0);
    // The handle that failed is still usable once the store recovers.
    assert_eq!(
        catalog.create_namespace(ns("a"), false).await.unwrap(),
        Outcome::Created
    );
    assert_eq!(ids(&*reopen(&store).await), ["a"]);
}

#[tokio::test]
async fn hint_failures_are_not_errors() {
    let (store, catalog) = setup().await;
    store.inject(
        Fault::nth(OpKind::Put, 1)
            .times(u64::MAX)
            .on_paths_containing("_hint"),
    );
    for name in ["a", "b", "c"] {
        catalog.create_namespace(ns(name), false).await.unwrap();
    }
    assert_eq!(ids(&*reopen(&store).await), ["a", "b", "c"]);
}

#[tokio::test]
async fn failed_listing_when_the_hint_is_gone_is_a_clear_error() {
    let (store, catalog) = setup().await;
    for i in 0..8 {
        catalog
            .create_namespace(ns(&format!("n{i}")), false)
            .await
            .unwrap();
    }
    // Without a hint the tip is found by listing, which fails.
    use object_store::ObjectStoreExt;
    store.delete(&"__manifest/_hint".into()).await.unwrap();
    store.inject(Fault::nth(OpKind::List, 1));
    let err = Catalog::open(
        ObjectRoot::new(store.clone(), "memory://faulty"),
        CatalogOptions::default(),
    )
    .await
    .unwrap_err();
    assert!(err.to_string().contains("injected List fault"), "{err}");
    // Without the fault the listing finds the tip.
    assert_eq!(reopen(&store).await.version(), 8);
}

#[tokio::test]
async fn lost_races_rebase_instead_of_overwriting() {
    let (store, a) = setup().await;
    let b = reopen(&store).await;
    a.create_namespace(ns("x"), false).await.unwrap();
    // b's snapshot is stale: its commit must rebase onto a's, not replace it.
    b.create_namespace(ns("y"), false).await.unwrap();
    assert_eq!(ids(&b), ["x", "y"]);
    // And b learns that x exists even though it decided on a stale snapshot.
    let err = b.create_namespace(ns("x"), false).await.unwrap_err();
    assert!(matches!(err, Error::AlreadyExists(_)));
    assert_eq!(ids(&*reopen(&store).await), ["x", "y"]);
}

/// A writer whose snapshot is many versions old (older than the versions
/// kept by collection) must not reuse a collected version number: its
/// change rebases onto the tip instead of vanishing.
#[tokio::test]
async fn stale_writer_cannot_reuse_a_collected_version() {
    let (store, stale) = setup().await;
    stale.create_namespace(ns("first"), false).await.unwrap();
    let busy = reopen(&store).await;
    for i in 0..20 {
        busy.create_namespace(ns(&format!("n{i}")), false)
            .await
            .unwrap();
    }
    // `stale` still believes version 1 is the tip; version 2 was collected.
    assert_eq!(stale.version(), 1);
    stale.create_namespace(ns("late"), false).await.unwrap();
    let after = reopen(&store).await;
    assert_eq!(after.version(), 22);
    let all = ids(&after);
    assert_eq!(all.len(), 22);
    assert!(all.contains(&"late".to_string()) && all.contains(&"n0".to_string()));
}

/// A caller cancelled in the middle of a commit (a Ctrl-C in the shell, a
/// dropped query) neither aborts that commit nor strands the mutations that
/// were batched with its own.
#[tokio::test]
async fn cancelled_caller_does_not_abort_the_group_commit() {
    let (store, catalog) = setup().await;
    let versions = store.gate(OpKind::Put, "__manifest/v");
    let first = tokio::spawn({
        let catalog = Arc::clone(&catalog);
        async move { catalog.create_namespace(ns("a"), false).await }
    });
    // The commit of "a" is writing its version, held at the gate.
    versions.arrived(1).await;
    let second = tokio::spawn({
        let catalog = Arc::clone(&catalog);
        async move { catalog.create_namespace(ns("b"), false).await }
    });
    // On this one-thread runtime the yield runs the second caller until it
    // waits: "b" is queued behind the commit in flight.
    tokio::task::yield_now().await;
    first.abort();
    versions.open();
    assert_eq!(second.await.unwrap().unwrap(), Outcome::Created);
    assert_eq!(ids(&*reopen(&store).await), ["a", "b"]);
}
