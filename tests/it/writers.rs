//! Several `memwal` shell processes write one table at the same time: every
//! statement of every process succeeds (a shard taken over by another
//! writer is taken back and the statement's part put again), and nothing
//! acknowledged is lost.

use std::collections::HashMap;
use std::process::Command;

use datafusion::arrow::array::AsArray;
use datafusion::arrow::datatypes::Int64Type;
use memwal::MemwalSession;

/// `processes` shells each run `statements` INSERTs of their own keys and
/// upserts of keys every process writes; all must succeed.
async fn concurrent_shells(processes: i64, statements: i64) {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_str().unwrap().to_string();
    {
        let session = MemwalSession::open(&root).await.unwrap();
        session
            .sql("CREATE TABLE t (id BIGINT PRIMARY KEY, writer BIGINT, n BIGINT) WITH ('shards' = '2')")
            .await
            .unwrap();
    }
    let handles: Vec<_> = (0..processes)
        .map(|p| {
            let root = root.clone();
            std::thread::spawn(move || {
                let mut command = Command::new(env!("CARGO_BIN_EXE_memwal"));
                command.args(["--root", &root, "-q", "--format", "csv"]);
                for n in 0..statements {
                    let own: Vec<String> = (0..5)
                        .map(|i| format!("({}, {p}, {n})", 1_000_000 * (p + 1) + 5 * n + i))
                        .collect();
                    command.args([
                        "-c",
                        &format!(
                            "INSERT INTO t VALUES {}, ({}, {p}, {n})",
                            own.join(", "),
                            n % 7
                        ),
                    ]);
                }
                command.output().unwrap()
            })
        })
        .collect();
    for (p, handle) in handles.into_iter().enumerate() {
        let out = handle.join().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "process {p} failed: {stderr}");
        // Each statement reports the six rows it wrote.
        assert_eq!(
            stdout.matches("count\n6\n").count(),
            statements as usize,
            "process {p}: {stdout}{stderr}"
        );
    }

    let session = MemwalSession::open(&root).await.unwrap();
    let batches = session
        .sql("SELECT id, writer, n FROM t")
        .await
        .unwrap()
        .collect()
        .await
        .unwrap();
    let mut rows: HashMap<i64, (i64, i64)> = HashMap::new();
    for b in &batches {
        let [id, writer, n] = [0, 1, 2].map(|c| b.column(c).as_primitive::<Int64Type>());
        for i in 0..b.num_rows() {
            let row = (writer.value(i), n.value(i));
            assert!(rows.insert(id.value(i), row).is_none(), "key twice");
        }
    }
    for p in 0..processes {
        for n in 0..statements {
            for i in 0..5 {
                let id = 1_000_000 * (p + 1) + 5 * n + i;
                assert_eq!(rows.get(&id), Some(&(p, n)), "row {id} lost");
            }
        }
    }
    // Shared keys hold one writer's row for that key.
    for key in 0..7.min(statements) {
        let (writer, n) = rows[&key];
        assert!(
            (0..processes).contains(&writer) && n % 7 == key,
            "key {key}: {writer} {n}"
        );
    }
    assert_eq!(
        rows.len() as i64,
        5 * processes * statements + 7.min(statements)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_shells_writing_one_table_all_succeed() {
    concurrent_shells(2, 40).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_shells_writing_one_table_all_succeed() {
    // Long enough that writers taking the shard from each other at every
    // statement would thrash (thousands of takeovers, minutes).
    concurrent_shells(8, 30).await;
}
