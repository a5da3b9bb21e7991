//! The catalog and the SQL session on an S3-compatible server, at the
//! bucket `MEMWAL_TEST_S3_BUCKET` names. Ignored by a plain `cargo test`
//! (reported as such); `.ci/run` starts a server on 127.0.0.1 and runs
//! them with `cargo test --test it s3:: -- --ignored`.

use futures::TryStreamExt;
use memwal::catalog::Outcome;
use memwal::{Catalog, CatalogOptions, MemwalSession, ObjectPath, ObjectRoot};
use object_store::ObjectStore;
use object_store::aws::AmazonS3Builder;

fn bucket() -> String {
    std::env::var("MEMWAL_TEST_S3_BUCKET")
        .expect("MEMWAL_TEST_S3_BUCKET is not set (bash .ci/run starts a server and sets it)")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs MEMWAL_TEST_S3_BUCKET (bash .ci/run starts a server)"]
async fn catalog_commits_and_survives_reopen_on_s3() {
    let bucket = bucket();
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
    assert_eq!(again.snapshot().len(), 12);
    assert_eq!(again.version(), 12);
    let err = again
        .create_namespace(ObjectPath::new(["n3"]).unwrap(), false)
        .await
        .unwrap_err();
    assert!(matches!(err, memwal::Error::AlreadyExists(_)), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs MEMWAL_TEST_S3_BUCKET (bash .ci/run starts a server)"]
async fn sql_ddl_persists_on_s3() {
    let bucket = bucket();
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs MEMWAL_TEST_S3_BUCKET (bash .ci/run starts a server)"]
async fn a_root_prefix_holds_the_objects_under_the_name_it_was_given() {
    let bucket = bucket();
    // Not percent-encoded a second time (`m%25C3%25A9%2520x`).
    let top = format!("odd-{:016x}", rand::random::<u64>());
    let prefix = format!("{top}/mé x");
    let session = MemwalSession::open(&format!("s3://{bucket}/{prefix}"))
        .await
        .unwrap();
    session.sql("CREATE SCHEMA s").await.unwrap();
    let store = AmazonS3Builder::from_env()
        .with_bucket_name(&bucket)
        .build()
        .unwrap();
    let keys: Vec<String> = store
        .list(None)
        .map_ok(|meta| meta.location.to_string())
        .try_collect()
        .await
        .unwrap();
    let ours: Vec<&String> = keys.iter().filter(|k| k.starts_with(&top)).collect();
    assert!(!ours.is_empty(), "{keys:?}");
    for key in ours {
        assert!(key.starts_with(&format!("{prefix}/")), "{key}");
    }
}
