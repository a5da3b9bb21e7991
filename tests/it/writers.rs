//! Several `memwal` shell processes write one table at the same time: every
//! statement of every process succeeds (a shard taken over by another
//! writer is taken back and the statement's part put again), and nothing
//! acknowledged is lost. Writer processes that each own a slice of the
//! shards (`owned_shards`) never trade shards, and a reader in another
//! process sees every row they acknowledged, also after one was killed.

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::Arc;

use datafusion::arrow::array::{AsArray, Int64Array, RecordBatch};
use datafusion::arrow::datatypes::{DataType, Field, Int64Type, Schema};
use memwal::testing::{LatencyProfile, LatencyStore};
use memwal::{Catalog, CatalogOptions, MemwalSession, ObjectRoot, WriterOptions};
use object_store::ObjectStore;
use object_store::memory::InMemory;

use crate::helpers::run;

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

/// Keys `0..` in order, split by which of `slices` writers owns their
/// shard (shard modulo `slices`), `per_slice` each.
async fn keys_by_slice(table: &memwal::Table, slices: u32, per_slice: usize) -> Vec<Vec<i64>> {
    let schema = Arc::new(Schema::new(vec![Field::new("id", DataType::Int64, false)]));
    let mut keys = vec![Vec::new(); slices as usize];
    for id in 0.. {
        let key = RecordBatch::try_new(
            Arc::clone(&schema),
            vec![Arc::new(Int64Array::from(vec![id]))],
        );
        let slice = table.shard_of(&key.unwrap()).unwrap() % slices;
        if keys[slice as usize].len() < per_slice {
            keys[slice as usize].push(id);
        }
        if keys.iter().all(|k| k.len() == per_slice) {
            return keys;
        }
    }
    unreachable!()
}

/// A shell writing shards `slice/3` of `t`: one INSERT of 5 of `keys` per
/// statement, `writer` and the statement's number in the other columns.
fn writer_shell(root: &str, slice: usize, writer: i64, keys: &[i64]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_memwal"));
    command.args(["--root", root, "-q", "--format", "csv"]);
    command.args(["--option", &format!("owned_shards={slice}/3")]);
    for (n, ids) in keys.chunks(5).enumerate() {
        let rows: Vec<String> = ids
            .iter()
            .map(|id| format!("({id}, {writer}, {n})"))
            .collect();
        command.args(["-c", &format!("INSERT INTO t VALUES {}", rows.join(", "))]);
    }
    command
}

/// `id -> (writer, n)` of every row of `t`, read by `session`.
async fn rows_of_t(session: &MemwalSession) -> HashMap<i64, (i64, i64)> {
    let batches = session.sql("SELECT id, writer, n FROM t").await.unwrap();
    let mut rows = HashMap::new();
    for b in batches.collect().await.unwrap() {
        let [id, writer, n] = [0, 1, 2].map(|c| b.column(c).as_primitive::<Int64Type>());
        for i in 0..b.num_rows() {
            let row = (writer.value(i), n.value(i));
            assert!(rows.insert(id.value(i), row).is_none(), "key twice");
        }
    }
    rows
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writer_processes_owning_disjoint_shards_and_a_reader_sees_their_union() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_str().unwrap().to_string();
    let session = MemwalSession::open(&root).await.unwrap();
    let create = "CREATE TABLE t (id BIGINT PRIMARY KEY, writer BIGINT, n BIGINT) \
                  WITH ('shards' = '6')";
    session.sql(create).await.unwrap();
    let table = session.table("t").await.unwrap();
    let statements = 40;
    let keys = keys_by_slice(&table, 3, 5 * statements).await;

    // A writer refuses rows of a shard it does not own, writing none.
    let mixed = [keys[0][0], keys[1][0]];
    let out = writer_shell(&root, 0, 9, &mixed).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("not written by this process"), "{stderr}");
    assert!(rows_of_t(&session).await.is_empty());

    // Three writers, one per slice; the third is killed once 10 of its
    // statements were acknowledged.
    let survivors: Vec<_> = (0..2)
        .map(|slice| {
            let mut shell = writer_shell(&root, slice, slice as i64, &keys[slice]);
            std::thread::spawn(move || shell.output().unwrap())
        })
        .collect();
    let mut victim = writer_shell(&root, 2, 2, &keys[2])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut acknowledged = 0;
    let mut lines = BufReader::new(victim.stdout.take().unwrap()).lines();
    while acknowledged < 10 {
        match lines.next() {
            // Each statement prints its count, 5.
            Some(Ok(line)) if line == "5" => acknowledged += 1,
            Some(_) => {}
            None => panic!("the writer ended early: {:?}", victim.wait()),
        }
    }
    victim.kill().unwrap();
    victim.wait().unwrap();
    for (slice, survivor) in survivors.into_iter().enumerate() {
        let out = survivor.join().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "writer {slice}: {stderr}");
    }

    // A reader in this process, and one whose scans run on workers, see
    // every acknowledged row; each writer wrote only its own shards.
    let (urls, _stop) = memwal::testing::start_workers(&root, 2).await;
    let cluster = MemwalSession::builder(&root)
        .workers(urls)
        .open()
        .await
        .unwrap();
    for reader in [&session, &cluster] {
        let rows = rows_of_t(reader).await;
        for (writer, keys) in keys.iter().enumerate() {
            let acknowledged = match writer {
                2 => 5 * acknowledged,
                _ => keys.len(),
            };
            for (i, id) in keys[..acknowledged].iter().enumerate() {
                assert_eq!(
                    rows.get(id),
                    Some(&(writer as i64, (i / 5) as i64)),
                    "row {id}"
                );
            }
        }
        assert!(rows.values().all(|(writer, _)| *writer < 3));
        assert!(rows.len() <= 3 * 5 * statements, "{}", rows.len());
    }
    // Another writer takes the killed one's shards over and finishes.
    let out = writer_shell(&root, 2, 2, &keys[2]).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(rows_of_t(&cluster).await.len(), 3 * 5 * statements);
}

/// A session on `store` of its own (one more writer of the root).
async fn session_on(store: Arc<dyn ObjectStore>) -> MemwalSession {
    let root = ObjectRoot::new(store, "memory://contended");
    let catalog = Catalog::open(root, CatalogOptions::default())
        .await
        .unwrap();
    MemwalSession::new(catalog, WriterOptions::default())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writers_taking_a_shard_back_on_a_slow_store_all_succeed() {
    // Behind S3 Standard's latency, taking back a shard with 240 unflushed
    // WAL entries (claim, fence, replay) takes longer than the configured
    // turn (300 ms). A writer taking the shard back must get a turn that
    // covers its open as well as its put: otherwise writers taking the
    // shard back fence each other after every replay, before any put (over
    // S3, statements failed after `TAKEOVER_PATIENCE`).
    let memory: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    {
        let fast = session_on(Arc::clone(&memory)).await;
        run(
            &fast,
            "CREATE TABLE t (id BIGINT PRIMARY KEY, writer BIGINT) WITH ('shards' = '1')",
        )
        .await;
        for id in 0..240 {
            run(&fast, &format!("INSERT INTO t VALUES ({id}, -1)")).await;
        }
        // Not closed: the 150 entries stay in the WAL, unflushed.
    }
    let slow: Arc<dyn ObjectStore> =
        LatencyStore::new(Arc::clone(&memory), LatencyProfile::S3_STANDARD, 7);
    const STATEMENTS: i64 = 4;
    let writers: Vec<_> = (0..3)
        .map(|w| {
            let slow = Arc::clone(&slow);
            tokio::spawn(async move {
                let session = session_on(slow).await;
                for n in 0..STATEMENTS {
                    let id = 1000 * (w + 1) + n;
                    let insert = format!("INSERT INTO t VALUES ({id}, {w})");
                    session.sql(&insert).await?.collect().await?;
                }
                Ok::<_, datafusion::error::DataFusionError>(())
            })
        })
        .collect();
    for (w, writer) in writers.into_iter().enumerate() {
        writer
            .await
            .unwrap()
            .unwrap_or_else(|e| panic!("writer {w}: {e}"));
    }
    let session = session_on(memory).await;
    run(&session, "INSERT INTO t VALUES (0, 0)").await;
    let rows = run(&session, "SELECT count(*) AS n FROM t").await;
    let n = rows[0].column(0).as_primitive::<Int64Type>().value(0);
    assert_eq!(n, 240 + 3 * STATEMENTS);
    // Epochs claimed: the first writer's, this session's, and those of
    // the contest, which must not thrash: at most two claims a statement
    // (before, the writers claimed the shard every turn, from each other,
    // for half a minute).
    let epoch = session
        .table("t")
        .await
        .unwrap()
        .stats(0)
        .unwrap()
        .unwrap()
        .epoch;
    eprintln!("epochs claimed: {epoch}");
    assert!(epoch <= 2 + 2 * 3 * STATEMENTS as u64, "{epoch} claims");
}
