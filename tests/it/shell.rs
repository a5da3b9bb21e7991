//! The `memwal` shell as a user runs it.

use std::process::Command;

fn memwal(root: &str, args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_memwal"))
        .args(["--root", root])
        .args(args)
        .output()
        .expect("run memwal");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn catalog_survives_between_shell_runs() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_str().unwrap();
    let (ok, _, err) = memwal(
        root,
        &[
            "-q",
            "-c",
            "CREATE SCHEMA shop",
            "-c",
            "CREATE TABLE shop.items (id BIGINT PRIMARY KEY, title TEXT, emb FLOAT[3]) WITH ('shards' = '2', 'emb.metric' = 'cosine')",
        ],
    );
    assert!(ok, "{err}");
    let (ok, out, err) = memwal(
        root,
        &[
            "-q",
            "--format",
            "csv",
            "-c",
            "SELECT table_schema, table_name FROM information_schema.tables WHERE table_schema = 'shop'",
        ],
    );
    assert!(ok, "{err}");
    assert_eq!(out.trim(), "table_schema,table_name\nshop,items");
}

#[test]
fn files_run_statement_by_statement_and_errors_do_not_stop_them() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("data");
    let sql = dir.path().join("demo.sql");
    std::fs::write(
        &sql,
        "-- a comment\nCREATE SCHEMA a;\nCREATE SCHEMA a;\nCREATE TABLE a.t (id BIGINT\n  PRIMARY KEY);\nSELECT count(*) AS n FROM a.t;\n",
    )
    .unwrap();
    let (ok, out, err) = memwal(
        root.to_str().unwrap(),
        &["-q", "--format", "csv", "-f", sql.to_str().unwrap()],
    );
    assert!(ok, "{err}");
    assert!(err.contains("namespace 'a' already exists"), "{err}");
    assert!(out.contains("n\n0"), "{out}");
}

#[test]
fn bad_statement_with_c_fails_the_process() {
    let dir = tempfile::tempdir().unwrap();
    let (ok, _, err) = memwal(
        dir.path().to_str().unwrap(),
        &[
            "-q",
            "-c",
            "CREATE TABLE t (id BIGINT) WITH ('colour' = 'red')",
        ],
    );
    assert!(!ok);
    assert!(err.contains("unknown table option 'colour'"), "{err}");
}

#[test]
fn root_comes_from_the_environment_and_maxrows_limits_tables() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_memwal"))
        .env("MEMWAL_ROOT", dir.path())
        .args([
            "--maxrows",
            "2",
            "-c",
            "SELECT * FROM (VALUES (1), (2), (3)) AS v(x)",
        ])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success());
    assert!(
        stdout.contains(dir.path().canonicalize().unwrap().to_str().unwrap()),
        "{stdout}"
    );
    assert!(
        stdout.contains("3 row(s) fetched. (First 2 displayed."),
        "{stdout}"
    );
}
