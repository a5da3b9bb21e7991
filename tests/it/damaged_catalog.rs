//! A damaged catalog (issue 12 §4): the session still opens and runs what
//! does not need the catalog; everything that does fails with the typed
//! `Corrupt` error naming the damaged version; once repaired, it works.

use std::path::{Path, PathBuf};

use memwal::{Error, MemwalSession};

/// Writes garbage over what a reader of the catalog needs most recently:
/// the newest version, or the newest checkpoint if it is that version's;
/// returns its path and its good bytes.
fn corrupt_newest(root: &Path) -> (PathBuf, Vec<u8>) {
    let newest = |dir: PathBuf| {
        std::fs::read_dir(dir)
            .map(|read| {
                read.map(|e| e.unwrap().path())
                    .filter(|p| p.extension().is_some_and(|e| e == "arrow"))
                    .max()
            })
            .ok()
            .flatten()
    };
    let version = newest(root.join("__manifest")).unwrap();
    let newest = match newest(root.join("__manifest/checkpoints")) {
        Some(checkpoint) if checkpoint.file_name() == version.file_name() => checkpoint,
        _ => version,
    };
    let good = std::fs::read(&newest).unwrap();
    std::fs::write(&newest, b"garbage, not an Arrow file").unwrap();
    (newest, good)
}

async fn run(session: &MemwalSession, sql: &str) -> Result<usize, Error> {
    let batches = session.sql(sql).await?.collect().await?;
    Ok(batches.iter().map(|b| b.num_rows()).sum())
}

/// Statements that need the catalog, each of which must fail.
const USES_CATALOG: [&str; 9] = [
    "SELECT * FROM t",
    "INSERT INTO t VALUES (2)",
    "SHOW TABLES",
    "SELECT * FROM information_schema.tables",
    "DESCRIBE t",
    "SHOW CREATE TABLE t",
    "CREATE TABLE u (id BIGINT)",
    "DROP TABLE t",
    "SELECT * FROM vector_search('t', 'v', [1.0], 1)",
];

async fn assert_only_catalog_statements_fail(session: &MemwalSession, damaged: &Path) {
    let name = damaged.file_name().unwrap().to_str().unwrap();
    for sql in [
        "SELECT 1",
        "SET datafusion.execution.batch_size = 100",
        "SHOW datafusion.execution.batch_size",
        "EXPLAIN SELECT 1",
        "SELECT name FROM information_schema.df_settings LIMIT 1",
    ] {
        run(session, sql)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
    }
    for sql in USES_CATALOG {
        match run(session, sql).await {
            Err(Error::Corrupt { path, .. }) => assert!(path.ends_with(name), "{sql}: {path}"),
            other => panic!("{sql}: expected Corrupt, got {other:?}"),
        }
    }
    assert!(matches!(
        session.table("t").await,
        Err(Error::Corrupt { .. })
    ));
}

#[tokio::test]
async fn a_session_opens_on_a_corrupt_catalog() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_str().unwrap();
    {
        let session = MemwalSession::open(root).await.unwrap();
        run(
            &session,
            "CREATE TABLE t (id BIGINT PRIMARY KEY, v FLOAT[1])",
        )
        .await
        .unwrap();
        run(&session, "INSERT INTO t VALUES (1, [1.0])")
            .await
            .unwrap();
        session.close().await.unwrap();
    }
    let (damaged, good) = corrupt_newest(dir.path());

    let session = MemwalSession::open(root).await.unwrap();
    assert!(matches!(
        session.catalog().await,
        Err(Error::Corrupt { .. })
    ));
    assert_only_catalog_statements_fail(&session, &damaged).await;

    // Repaired: the same session picks the catalog up.
    std::fs::write(&damaged, good).unwrap();
    assert_eq!(run(&session, "SELECT * FROM t").await.unwrap(), 1);
    session.close().await.unwrap();
}

#[tokio::test]
async fn a_catalog_damaged_under_an_open_session() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_str().unwrap();
    let session = MemwalSession::open(root).await.unwrap();
    run(
        &session,
        "CREATE TABLE t (id BIGINT PRIMARY KEY, v FLOAT[1])",
    )
    .await
    .unwrap();
    // A newer version appears, damaged: the session's refresh finds it.
    let next = dir
        .path()
        .join("__manifest")
        .join(format!("v{:020}.arrow", 2));
    std::fs::write(&next, b"garbage, not an Arrow file").unwrap();
    assert_only_catalog_statements_fail(&session, &next).await;

    std::fs::remove_file(&next).unwrap();
    assert_eq!(run(&session, "SELECT * FROM t").await.unwrap(), 0);
    session.close().await.unwrap();
}
