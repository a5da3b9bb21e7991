//! Files and an embedded session (issue 12 §5): without
//! `allow_file_access` SQL reads and writes no file outside memwal's
//! tables; with it, everything but the root itself; `CREATE EXTERNAL TABLE`
//! is refused before its location is read.

use std::path::Path;

use memwal::{Error, MemwalSession};

/// A CSV file outside the root whose header must never leak.
fn secret(dir: &Path) -> String {
    let path = dir.join("secret.csv");
    std::fs::write(&path, "secret_column\n42\n").unwrap();
    path.to_str().unwrap().to_string()
}

async fn sql_err(session: &MemwalSession, sql: &str) -> Error {
    match session.sql(sql).await {
        Err(e) => e,
        Ok(df) => df.collect().await.expect_err(sql).into(),
    }
}

#[tokio::test]
async fn an_embedded_session_touches_no_files_by_default() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    let secret = secret(dir.path());
    let session = MemwalSession::open(root.to_str().unwrap()).await.unwrap();

    // URL tables are off: the path is just an unknown table name.
    let err = sql_err(&session, &format!("SELECT * FROM '{secret}'")).await;
    assert!(err.to_string().contains("not found"), "{err}");
    assert!(!err.to_string().contains("secret_column"), "{err}");

    // Writing a file is refused, and says how to allow it.
    let out = dir.path().join("out.csv");
    let err = sql_err(
        &session,
        &format!("COPY (SELECT 1 AS x) TO '{}'", out.display()),
    )
    .await;
    assert!(matches!(err, Error::InvalidInput(_)), "{err}");
    assert!(err.to_string().contains("allow_file_access(true)"), "{err}");
    assert!(!out.exists());

    // CREATE EXTERNAL TABLE is refused before the file is read.
    let err = sql_err(
        &session,
        &format!("CREATE EXTERNAL TABLE s STORED AS CSV LOCATION '{secret}'"),
    )
    .await;
    assert!(err.to_string().contains("was not read"), "{err}");
    assert!(!err.to_string().contains("secret_column"), "{err}");
}

#[tokio::test]
async fn file_access_reaches_everything_but_the_root() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    let secret = secret(dir.path());
    let session = MemwalSession::builder(root.to_str().unwrap())
        .allow_file_access(true)
        .open()
        .await
        .unwrap();
    session
        .sql("CREATE TABLE t (id BIGINT PRIMARY KEY)")
        .await
        .unwrap();
    session
        .sql("INSERT INTO t VALUES (1), (2)")
        .await
        .unwrap()
        .collect()
        .await
        .unwrap();

    let batches = session
        .sql(&format!("SELECT count(*) AS n FROM '{secret}'"))
        .await
        .unwrap()
        .collect()
        .await
        .unwrap();
    assert_eq!(batches[0].num_rows(), 1);

    let out = dir.path().join("out.csv");
    session
        .sql(&format!("COPY t TO '{}'", out.display()))
        .await
        .unwrap()
        .collect()
        .await
        .unwrap();
    assert!(out.exists());

    // Into the root: refused however the path is spelled.
    let link = dir.path().join("link");
    std::os::unix::fs::symlink(&root, &link).unwrap();
    let manifest = root.join("__manifest");
    let before = std::fs::read_dir(&manifest).unwrap().count();
    for target in [
        manifest.join("evil.csv").display().to_string(),
        format!("{}/new/../__manifest/evil.csv", root.display()),
        format!("{}/../root/__manifest/evil.csv", root.display()),
        link.join("__manifest/evil.csv").display().to_string(),
        format!("file://{}/evil.csv", root.display()),
    ] {
        let err = sql_err(&session, &format!("COPY t TO '{target}'")).await;
        assert!(
            err.to_string()
                .contains("would write inside the memwal root"),
            "{target}: {err}"
        );
    }
    assert_eq!(std::fs::read_dir(&manifest).unwrap().count(), before);
    assert!(!root.join("new").exists());

    // The catalog is intact.
    let batches = session
        .sql("SELECT count(*) FROM t")
        .await
        .unwrap()
        .collect()
        .await
        .unwrap();
    assert_eq!(
        datafusion::arrow::util::pretty::pretty_format_batches(&batches)
            .unwrap()
            .to_string()
            .lines()
            .nth(3),
        Some("| 2        |")
    );
}
