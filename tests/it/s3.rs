//! The catalog and the SQL session on an S3-compatible server. Runs when
//! `MEMWAL_TEST_S3_BUCKET` names a bucket (`.ci/run` starts one on
//! 127.0.0.1 and sets it); prints a notice and passes vacuously otherwise.

use memwal::catalog::Outcome;
use memwal::{Catalog, CatalogOptions, MemwalSession, ObjectPath, ObjectRoot};

fn bucket() -> Option<String> {
    let bucket = std::env::var("MEMWAL_TEST_S3_BUCKET").ok();
    if bucket.is_none() {
        eprintln!("MEMWAL_TEST_S3_BUCKET is not set: S3 test not run");
    }
    bucket
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn catalog_commits_and_survives_reopen_on_s3() {
    let Some(bucket) = bucket() else { return };
    let url = format!("s3://{bucket}/it-{:016x}", rand::random::<u64>());
    let open = || async {
        Catalog::open(ObjectRoot::open(&url).unwrap(), CatalogOptions::default())
            .await
            .unwrap()
    };
    let a = open().await;
    let b = open().await;
    for i in 0..12 {
        let who = if i % 2 == 0 { &a } else { &b };
        let got = who
            .create_namespace(ObjectPath::new([format!("n{i}")]).unwrap(), false)
            .await
            .unwrap();
        assert_eq!(got, Outcome::Created);
    }
    // b's commits rebased onto a's (and back): nothing lost.
    let again = open().await;
    assert_eq!(again.snapshot().entries().len(), 12);
    assert_eq!(again.version(), 12);
    let err = again
        .create_namespace(ObjectPath::new(["n3"]).unwrap(), false)
        .await
        .unwrap_err();
    assert!(matches!(err, memwal::Error::AlreadyExists(_)), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sql_ddl_persists_on_s3() {
    let Some(bucket) = bucket() else { return };
    let url = format!("s3://{bucket}/sql-{:016x}", rand::random::<u64>());
    let session = MemwalSession::open(&url).await.unwrap();
    session.sql("CREATE SCHEMA shop").await.unwrap();
    session
        .sql("CREATE TABLE shop.items (id BIGINT PRIMARY KEY, emb FLOAT[3]) WITH ('shards' = '2')")
        .await
        .unwrap();
    drop(session);
    let session = MemwalSession::open(&url).await.unwrap();
    let batches = session
        .sql("SELECT table_name FROM information_schema.tables WHERE table_schema = 'shop'")
        .await
        .unwrap()
        .collect()
        .await
        .unwrap();
    let rows: usize = batches.iter().map(|b| b.num_rows()).sum();
    assert_eq!(rows, 1);
}
