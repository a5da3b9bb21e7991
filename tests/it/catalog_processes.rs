//! Many processes and many tasks changing one catalog at the same time.

use std::collections::BTreeSet;
use std::process::{Command, Stdio};
use std::sync::Arc;

use memwal::catalog::{ObjectType, Outcome};
use memwal::{Catalog, CatalogOptions, ObjectPath, ObjectRoot};

const PROCESSES: usize = 8;
const PER_PROCESS: usize = 50;

/// 8 shells each create 50 namespaces on one local root at the same time:
/// afterwards exactly the 400 namespaces exist, none lost, none twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_processes_create_400_namespaces() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_str().unwrap().to_string();
    let children: Vec<_> = (0..PROCESSES)
        .map(|p| {
            let mut cmd = Command::new(env!("CARGO_BIN_EXE_memwal"));
            cmd.args(["-q", "--format", "csv", "--root", &root]);
            for i in 0..PER_PROCESS {
                cmd.arg("-c").arg(format!("CREATE SCHEMA p{p}_n{i}"));
            }
            cmd.stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .expect("spawn memwal")
        })
        .collect();
    for child in children {
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "a writer failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    let catalog = Catalog::open(ObjectRoot::open(&root).unwrap(), CatalogOptions::default())
        .await
        .unwrap();
    let snapshot = catalog.snapshot();
    let ids: Vec<&str> = snapshot.iter().map(|e| e.object_id.as_str()).collect();
    let unique: BTreeSet<&str> = ids.iter().copied().collect();
    assert_eq!(ids.len(), PROCESSES * PER_PROCESS, "entries lost or added");
    assert_eq!(unique.len(), ids.len(), "an entry appears twice");
    for p in 0..PROCESSES {
        for i in 0..PER_PROCESS {
            assert!(
                unique.contains(format!("p{p}_n{i}").as_str()),
                "p{p}_n{i} lost"
            );
        }
    }
    assert!(
        snapshot
            .iter()
            .all(|e| e.object_type == ObjectType::Namespace)
    );
    // A checkpoint now leaves itself alone: those the shells wrote are gone.
    let at = catalog.checkpoint().await.unwrap();
    let checkpoints: Vec<_> = std::fs::read_dir(dir.path().join("__manifest/checkpoints"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(checkpoints, [format!("v{at:020}.arrow")]);
}

/// Concurrent mutations in one process share versions (group commit), and
/// each gets its own result.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn group_commit_shares_versions_and_keeps_results() {
    let dir = tempfile::tempdir().unwrap();
    let root = ObjectRoot::open(dir.path().to_str().unwrap()).unwrap();
    let catalog = Catalog::open(root, CatalogOptions::default())
        .await
        .unwrap();
    catalog
        .create_namespace(ObjectPath::new(["dup"]).unwrap(), false)
        .await
        .unwrap();
    let tasks: Vec<_> = (0..64)
        .map(|i| {
            let catalog = Arc::clone(&catalog);
            tokio::spawn(async move {
                // Every 8th task creates the existing namespace again.
                let name = if i % 8 == 0 {
                    "dup".to_string()
                } else {
                    format!("n{i}")
                };
                catalog
                    .create_namespace(ObjectPath::new([name]).unwrap(), false)
                    .await
            })
        })
        .collect();
    let mut created = 0;
    let mut duplicates = 0;
    for t in tasks {
        match t.await.unwrap() {
            Ok(Outcome::Created) => created += 1,
            Err(memwal::Error::AlreadyExists(what)) => {
                assert_eq!(what, "namespace 'dup'");
                duplicates += 1;
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!((created, duplicates), (56, 8));
    assert_eq!(catalog.snapshot().len(), 57);
    assert!(
        catalog.version() < 57,
        "64 concurrent mutations took {} versions: no group commit",
        catalog.version()
    );
}

/// Two handles (as two processes would) race to create one id: exactly one
/// wins, the other is told it exists.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_creators_exactly_one_wins() {
    let dir = tempfile::tempdir().unwrap();
    let open = || crate::helpers::open_catalog(dir.path());
    for round in 0..20 {
        let (a, b) = (open().await, open().await);
        let name = format!("race{round}");
        let pa = ObjectPath::new([name.clone()]).unwrap();
        let pb = pa.clone();
        let (ra, rb) = tokio::join!(
            tokio::spawn(async move { a.create_namespace(pa, false).await }),
            tokio::spawn(async move { b.create_namespace(pb, false).await })
        );
        let results = [ra.unwrap(), rb.unwrap()];
        let wins = results
            .iter()
            .filter(|r| matches!(r, Ok(Outcome::Created)))
            .count();
        let told = results
            .iter()
            .filter(|r| matches!(r, Err(memwal::Error::AlreadyExists(_))))
            .count();
        assert_eq!((wins, told), (1, 1), "round {round}: {results:?}");
    }
    assert_eq!(open().await.snapshot().len(), 20);
}
