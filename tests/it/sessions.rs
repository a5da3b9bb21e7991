//! Sessions on one root. Made with `MemwalSession::new` they act like two
//! shells (each has its own table handles and writers): each sees the
//! other's durable rows, and when both write one table a statement whose
//! writer was fenced re-opens it and succeeds. Opened with `MemwalSession::open` in one process they share one
//! writer per shard.

use std::sync::Arc;

use datafusion::arrow::array::{AsArray, Int64Array, RecordBatch};
use datafusion::arrow::datatypes::Int64Type;
use datafusion::arrow::util::pretty::pretty_format_batches;
use memwal::{Catalog, CatalogOptions, MemwalSession, ObjectRoot, WriterOptions};

use crate::helpers::pause_at;

/// A session with writers of its own, as another process would have.
async fn isolated(root: &str) -> MemwalSession {
    let catalog = Catalog::open(ObjectRoot::open(root).unwrap(), CatalogOptions::default())
        .await
        .unwrap();
    MemwalSession::new(catalog, WriterOptions::default())
}

/// A session over `store`, opened as the root `url`.
async fn session_over(
    store: Arc<dyn object_store::ObjectStore>,
    url: &str,
    catalog: CatalogOptions,
    writer: WriterOptions,
) -> MemwalSession {
    let catalog = Catalog::open(ObjectRoot::new(store, url), catalog)
        .await
        .unwrap();
    MemwalSession::new(catalog, writer)
}

async fn query(session: &MemwalSession, sql: &str) -> String {
    let batches = session.sql(sql).await.unwrap().collect().await.unwrap();
    pretty_format_batches(&batches).unwrap().to_string()
}

async fn count(session: &MemwalSession, table: &str) -> String {
    query(
        session,
        &format!("SELECT count(*) AS n, sum(v) AS s FROM {table}"),
    )
    .await
}

#[tokio::test]
async fn two_sessions_on_one_table_both_keep_working() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_str().unwrap();
    let a = isolated(root).await;
    let b = isolated(root).await;
    query(&a, "CREATE TABLE t (id BIGINT PRIMARY KEY, v BIGINT)").await;

    query(&a, "INSERT INTO t VALUES (1, 10), (2, 20)").await;
    // B reads A's durable rows from the WAL.
    assert!(count(&b, "t").await.contains("| 2 | 30 |"));

    // B writes: it claims the shard and fences A's writer.
    query(&b, "INSERT INTO t VALUES (3, 30)").await;
    // A sees B's rows: its writer no longer owns the shard, so A reads the WAL.
    assert!(count(&a, "t").await.contains("| 3 | 60 |"));

    // A key lookup in A sees B's newest version too.
    query(&b, "INSERT INTO t VALUES (1, 15)").await;
    assert!(
        query(&a, "SELECT v FROM t WHERE id = 1")
            .await
            .contains("| 15 |")
    );
    query(&b, "INSERT INTO t VALUES (1, 10)").await;

    // A's next write hits the fence, which proves it wrote nothing: the
    // statement re-opens A's writer (new epoch, replay first) and succeeds.
    let epoch = a.table("t").await.unwrap().writer(0).await.unwrap().epoch();
    query(&a, "INSERT INTO t VALUES (4, 40), (1, 11)").await;
    let writer = a.table("t").await.unwrap().writer(0).await.unwrap();
    assert!(writer.epoch() > epoch, "A did not take the shard back");
    assert!(count(&a, "t").await.contains("| 4 | 101 |"));
    assert!(count(&b, "t").await.contains("| 4 | 101 |"));
    // And B's next write takes it back again.
    query(&b, "INSERT INTO t VALUES (5, 50)").await;
    assert!(count(&a, "t").await.contains("| 5 | 151 |"));

    // A third session opened afterwards (a restart) sees the same.
    drop((a, b));
    let c = MemwalSession::open(root).await.unwrap();
    assert!(count(&c, "t").await.contains("| 5 | 151 |"));
}

#[tokio::test]
async fn compacting_a_table_another_session_took_over_takes_it_back() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_str().unwrap();
    let a = isolated(root).await;
    let b = isolated(root).await;
    query(&a, "CREATE TABLE t (id BIGINT PRIMARY KEY, v BIGINT)").await;
    let table = a.table("t").await.unwrap();
    // Two SSTables (a close flushes), then a writer of A that owns the
    // shard with a row in its MemTable.
    for row in ["(1, 10)", "(2, 20)"] {
        query(&a, &format!("INSERT INTO t VALUES {row}")).await;
        table.close().await.unwrap();
    }
    query(&a, "INSERT INTO t VALUES (3, 30)").await;
    let fenced = table.writer(0).await.unwrap();
    assert_eq!(fenced.stats().sstables, 2);
    // B takes the shard over; A's writer does not know yet.
    query(&b, "INSERT INTO t VALUES (4, 40)").await;
    let b_epoch = b.table("t").await.unwrap().writer(0).await.unwrap().epoch();

    // A's compaction finds the fence at its commit: the fenced writer
    // stops, and the compaction takes the shard back and runs again.
    table.compact().await.unwrap();
    assert!(fenced.stopped().is_some(), "the fenced writer still runs");
    let writer = table.writer(0).await.unwrap();
    assert!(writer.epoch() > b_epoch, "A did not take the shard back");
    assert_eq!(writer.stats().sstables, 1);
    assert!(count(&a, "t").await.contains("| 4 | 100 |"));
    assert!(count(&b, "t").await.contains("| 4 | 100 |"));
}

#[tokio::test]
async fn sessions_opened_in_one_process_share_one_writer_per_shard() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_str().unwrap();
    let a = MemwalSession::open(root).await.unwrap();
    let b = MemwalSession::open(root).await.unwrap();
    query(&a, "CREATE TABLE t (id BIGINT PRIMARY KEY, v BIGINT)").await;
    for (i, session) in [&a, &b, &a, &b].into_iter().enumerate() {
        query(session, &format!("INSERT INTO t VALUES ({i}, {i})")).await;
    }
    assert!(count(&b, "t").await.contains("| 4 | 6 |"));
    let writer = a.table("t").await.unwrap().writer(0).await.unwrap();
    assert_eq!(writer.epoch(), 1, "the sessions fenced each other");
    assert_eq!(writer.stats().puts, 4);
}

#[tokio::test]
async fn drop_table_stops_its_writers_and_a_new_table_of_that_name_starts_empty() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_str().unwrap();
    let a = MemwalSession::open(root).await.unwrap();
    query(&a, "CREATE TABLE t (id BIGINT PRIMARY KEY, v BIGINT)").await;
    query(&a, "INSERT INTO t VALUES (1, 1)").await;
    let old = a.table("t").await.unwrap();
    let writer = old.writer(0).await.unwrap();
    query(&a, "DROP TABLE t").await;
    assert!(writer.is_closed(), "the dropped table's writer still runs");
    // The old handle refuses writes (it would open a writer on the dropped
    // data and acknowledge rows no table holds) and reads.
    let row = old.schema();
    let batch = RecordBatch::try_new(
        row,
        vec![
            Arc::new(Int64Array::from(vec![3])),
            Arc::new(Int64Array::from(vec![3])),
        ],
    )
    .unwrap();
    let err = old.put(&batch).await.unwrap_err().to_string();
    assert!(err.contains("dropped"), "{err}");
    assert!(old.scan().await.is_err());
    query(&a, "CREATE TABLE t (id BIGINT PRIMARY KEY, v BIGINT)").await;
    assert!(count(&a, "t").await.contains("| 0 |"));
    query(&a, "INSERT INTO t VALUES (2, 2)").await;
    assert!(count(&a, "t").await.contains("| 1 | 2 |"));
    assert!(old.put(&batch).await.is_err());
}

/// The row (`id`, `id`) of a table of two BIGINT columns.
fn id_row(table: &memwal::Table, id: i64) -> RecordBatch {
    let column = || Arc::new(Int64Array::from(vec![id])) as _;
    RecordBatch::try_new(table.schema(), vec![column(), column()]).unwrap()
}

#[tokio::test]
async fn a_drop_in_another_process_stops_this_ones_writers() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_str().unwrap();
    let (a, b) = (isolated(root).await, isolated(root).await);
    query(
        &a,
        "CREATE TABLE t (id BIGINT PRIMARY KEY, v BIGINT) WITH ('shards' = '2')",
    )
    .await;
    let old = a.table("t").await.unwrap();
    let row = |id| id_row(&old, id);
    // A's writers are open and writing when B drops the table.
    for id in 0..8 {
        old.put(&row(id)).await.unwrap();
    }
    query(&b, "DROP TABLE t").await;
    // No put through A's writers is acknowledged after the DROP returned:
    // their next append meets the drop's fence, and no writer reopens.
    for id in 100..108 {
        let err = old.put(&row(id)).await.unwrap_err().to_string();
        assert!(err.contains("dropped"), "{err}");
    }
    query(
        &b,
        "CREATE TABLE t (id BIGINT PRIMARY KEY, v BIGINT) WITH ('shards' = '2')",
    )
    .await;
    assert!(count(&b, "t").await.contains("| 0 |"));
    query(&a, "INSERT INTO t VALUES (1, 1)").await;
    assert!(count(&b, "t").await.contains("| 1 | 1 |"));
}

/// A write that reaches a shard nobody wrote before only after another
/// process dropped the table (which sealed only the shards it found) fails
/// as well, instead of being acknowledged into no table.
#[tokio::test]
async fn a_drop_in_another_process_stops_writes_to_shards_nobody_wrote() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_str().unwrap();
    let (a, b) = (isolated(root).await, isolated(root).await);
    query(
        &a,
        "CREATE TABLE t (id BIGINT PRIMARY KEY, v BIGINT) WITH ('shards' = '4')",
    )
    .await;
    // One shard written before the drop; the handle is taken before it.
    query(&a, "INSERT INTO t VALUES (0, 0)").await;
    let old = isolated(root).await.table("t").await.unwrap();
    query(&b, "DROP TABLE t").await;
    for id in 1..17 {
        let err = old.put(&id_row(&old, id)).await.unwrap_err();
        assert!(
            matches!(&err, memwal::Error::NotFound(m) if m.contains("dropped")),
            "{id}: {err}"
        );
    }
    query(&b, "CREATE TABLE t (id BIGINT PRIMARY KEY, v BIGINT)").await;
    assert!(count(&b, "t").await.contains("| 0 |"));
}

/// A handle that only reads a table another process drops says so when
/// it reads next (not that the table's WAL is damaged).
#[tokio::test]
async fn reading_a_table_another_process_dropped_says_it_was_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_str().unwrap();
    let (a, b) = (isolated(root).await, isolated(root).await);
    query(&b, "CREATE TABLE t (id BIGINT PRIMARY KEY, v BIGINT)").await;
    // Handles that read the table before know a manifest version the drop
    // deleted: one read it empty (the WAL has a gap for it after the
    // drop), one with a row (it caches the WAL's rows). One never read.
    let early = isolated(root).await.table("t").await.unwrap();
    assert!(early.scan().await.unwrap().is_empty());
    query(&b, "INSERT INTO t VALUES (1, 1)").await;
    let read = a.table("t").await.unwrap();
    assert_eq!(read.scan().await.unwrap()[0].num_rows(), 1);
    let unread = isolated(root).await.table("t").await.unwrap();
    query(&b, "DROP TABLE t").await;
    for handle in [early, read, unread] {
        let err = handle.scan().await.unwrap_err();
        assert!(
            matches!(&err, memwal::Error::NotFound(m) if m.contains("dropped")),
            "{err}"
        );
    }
}

#[tokio::test]
async fn a_shard_the_table_does_not_have_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let session = MemwalSession::open(dir.path().to_str().unwrap())
        .await
        .unwrap();
    query(
        &session,
        "CREATE TABLE t (id BIGINT PRIMARY KEY, v BIGINT) WITH ('shards' = '2')",
    )
    .await;
    let table = session.table("t").await.unwrap();
    let needle = "shard 2 does not exist: the table has 2";
    let err = table.writer(2).await.unwrap_err().to_string();
    assert!(err.contains(needle), "{err}");
    let err = table.scan_shard(2).await.unwrap_err().to_string();
    assert!(err.contains(needle), "{err}");
    let err = table
        .snapshot(u32::MAX, std::time::Duration::ZERO)
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("does not exist"), "{err}");
    assert!(table.writer(1).await.is_ok());
}

#[tokio::test]
async fn set_memwal_options_apply_to_the_tables_the_session_uses_next() {
    let dir = tempfile::tempdir().unwrap();
    // Not durable: acknowledged rows may be only in memory when the SET
    // comes, and must survive the switch.
    let mut options = WriterOptions::default();
    options.durable = false;
    options.wal_flush_interval = std::time::Duration::from_secs(3600);
    let session = MemwalSession::open_with(dir.path().to_str().unwrap(), options)
        .await
        .unwrap();
    // A second session sharing the table handles.
    let other = MemwalSession::open_with(dir.path().to_str().unwrap(), {
        let mut options = WriterOptions::default();
        options.durable = false;
        options.wal_flush_interval = std::time::Duration::from_secs(3600);
        options
    })
    .await
    .unwrap();
    let run = |sql: &'static str| {
        let session = session.clone();
        async move {
            session
                .sql(sql)
                .await?
                .collect()
                .await
                .map_err(memwal::Error::from)
        }
    };
    run("CREATE TABLE t (id BIGINT PRIMARY KEY, v BIGINT) WITH ('shards' = '1')")
        .await
        .unwrap();
    // 10,000 rows fit in memory by default: no SSTable yet.
    run("INSERT INTO t SELECT value, 0 FROM generate_series(1, 10000)")
        .await
        .unwrap();
    let stats = |session: &MemwalSession| {
        let session = session.clone();
        async move {
            let table = session.table("t").await.unwrap();
            table.stats(0).unwrap().expect("a writer is open")
        }
    };
    assert_eq!(stats(&session).await.sstables, 0);
    let epoch = stats(&session).await.epoch;
    // With 16 KiB for a load, the next 10,000 go through SSTables.
    run("SET memwal.load_memory_bytes = '16KiB'").await.unwrap();
    run("INSERT INTO t SELECT value, 1 FROM generate_series(10001, 20000)")
        .await
        .unwrap();
    assert!(stats(&session).await.sstables > 0);
    assert_eq!(
        count(&session, "t").await,
        query(&session, "SELECT 20000 AS n, 10000 AS s").await
    );
    // The sessions sharing the handles share the new writer: writing
    // through the other one takes nothing over.
    other
        .sql("INSERT INTO t VALUES (1, 5)")
        .await
        .unwrap()
        .collect()
        .await
        .unwrap();
    let after = stats(&session).await;
    assert!(after.epoch > epoch, "the SET reopened the writer");
    assert_eq!(stats(&other).await.epoch, after.epoch);
    // A refused SET changes nothing; RESET restores the default.
    let err = run("SET memwal.memtable_bytes = '1GiB'").await.unwrap_err();
    assert!(err.to_string().contains("max_unflushed_bytes"), "{err}");
    assert!(
        query(&session, "SHOW memwal.memtable_bytes")
            .await
            .contains("67108864")
    );
    run("RESET memwal.load_memory_bytes").await.unwrap();
    assert!(
        query(&session, "SHOW memwal.load_memory_bytes")
            .await
            .contains("268435456")
    );
    session.close().await.unwrap();
}

/// `RESET memwal.<option>` goes back to the value the session opened with
/// (the shell's `--option`), not to the built-in default.
#[tokio::test]
async fn reset_goes_back_to_the_options_the_session_opened_with() {
    let dir = tempfile::tempdir().unwrap();
    let mut options = WriterOptions::default();
    options.wal_flush_interval = std::time::Duration::from_millis(250);
    let session = MemwalSession::open_with(dir.path().to_str().unwrap(), options)
        .await
        .unwrap();
    let shown = || query(&session, "SHOW memwal.wal_flush_interval");
    assert!(shown().await.contains("| 250"), "{}", shown().await);
    for sql in [
        "SET memwal.wal_flush_interval = '1s'",
        "RESET memwal.wal_flush_interval",
    ] {
        session.sql(sql).await.unwrap().collect().await.unwrap();
    }
    assert!(shown().await.contains("| 250"), "{}", shown().await);
    session.close().await.unwrap();
}

/// DataFusion has its own `inner_product` (and alias `dot_product`) and
/// `cosine_distance`, in f64. Every session answers with memwal's, in f32,
/// under every name, also after a rebuild of its state (file access
/// rebuilds it, registering the functions in no fixed order: it used to
/// bring DataFusion's `inner_product` back in about half the sessions, and
/// a worker then refused the plan).
#[tokio::test]
async fn every_session_calls_memwals_distance_functions() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_str().unwrap();
    let sql = "SELECT arrow_typeof(inner_product([1, 2], [3, 4])) AS a, \
               arrow_typeof(dot_product([1, 2], [3, 4])) AS b, \
               arrow_typeof(cosine_distance([1, 2], [3, 4])) AS c, \
               arrow_typeof(l2_distance([1, 2], [3, 4])) AS d";
    for _ in 0..8 {
        let session = MemwalSession::builder(root)
            .allow_file_access(true)
            .open()
            .await
            .unwrap();
        let batches = session.sql(sql).await.unwrap().collect().await.unwrap();
        let text = pretty_format_batches(&batches).unwrap().to_string();
        assert_eq!(text.matches("Float32").count(), 4, "{text}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_statement_reads_one_snapshot_of_a_shard_however_often_it_scans_it() {
    use memwal::testing::{Fault, FaultyStore, OpKind};
    let inner: Arc<dyn object_store::ObjectStore> = Arc::new(object_store::memory::InMemory::new());
    let session_on = |store: Arc<dyn object_store::ObjectStore>| {
        let (catalog, writer) = (CatalogOptions::default(), WriterOptions::default());
        session_over(store, "memory://snapshots", catalog, writer)
    };
    let writer = session_on(Arc::clone(&inner)).await;
    query(
        &writer,
        "CREATE TABLE t (id BIGINT PRIMARY KEY, v BIGINT) WITH ('shards' = '2')",
    )
    .await;
    query(&writer, "INSERT INTO t VALUES (1, 10), (2, 20), (3, 30)").await;
    // Another process's reader: it refreshes its view of each shard from
    // the WAL, listing it. A rule that never fires counts those listings.
    let faulty = FaultyStore::new(Arc::clone(&inner));
    faulty.inject(Fault::nth(OpKind::List, u64::MAX).on_paths_containing("/wal"));
    let reader = session_on(faulty.clone()).await;
    let listings = |sql: &'static str| {
        let (reader, faulty) = (&reader, &faulty);
        async move {
            let before = faulty.matched_calls();
            let answer = query(reader, sql).await;
            (faulty.matched_calls() - before, answer)
        }
    };
    let (once, answer) = listings("SELECT count(*) FROM t").await;
    assert!(answer.contains("| 3 "), "{answer}");
    assert!(once >= 2, "a listing per shard: {once}");
    // Three scans of both shards, one snapshot each: as many listings.
    let (thrice, answer) = listings(
        "SELECT count(*) FROM t WHERE id > (SELECT max(id) FROM t) - 1 \
         OR id IN (SELECT id FROM t WHERE v < 15)",
    )
    .await;
    assert!(answer.contains("| 2 "), "{answer}");
    assert_eq!(thrice, once);
}

/// Another process (a `memwal` shell) writes row `id` of table `t` at
/// `root`, taking its shard over.
fn write_from_another_process(root: &str, id: i64) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_memwal"))
        .args(["--root", root, "-q", "-c"])
        .arg(format!("INSERT INTO t VALUES ({id}, 0)"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
}

/// The ids of table `t` at `root`, read by a fresh session.
async fn ids_at(root: &str) -> Vec<i64> {
    let session = isolated(root).await;
    let batches = session
        .sql("SELECT id FROM t ORDER BY id")
        .await
        .unwrap()
        .collect()
        .await
        .unwrap();
    batches
        .iter()
        .flat_map(|b| b.column(0).as_primitive::<Int64Type>().values().to_vec())
        .collect()
}

/// A session like another process's whose writers acknowledge puts
/// before they are durable, with a WAL interval of an hour (and `more`
/// options), and its one-shard table `t (id, v)`.
async fn non_durable(root: &str, more: impl FnOnce(&mut WriterOptions)) -> MemwalSession {
    let mut options = WriterOptions::default();
    options.durable = false;
    options.wal_flush_interval = std::time::Duration::from_secs(3600);
    more(&mut options);
    let catalog = Catalog::open(ObjectRoot::open(root).unwrap(), CatalogOptions::default())
        .await
        .unwrap();
    let session = MemwalSession::new(catalog, options);
    query(
        &session,
        "CREATE TABLE t (id BIGINT PRIMARY KEY, v BIGINT) WITH ('shards' = '1')",
    )
    .await;
    session
}

/// A writer that acknowledges puts before they are durable (durable =
/// false; a WAL interval of an hour keeps a put pending) loses
/// those rows when another process takes its shard over: closing the table
/// says how many, counting every acknowledged row a fresh reader does not
/// find.
#[tokio::test]
async fn rows_a_non_durable_writer_loses_to_a_takeover_are_reported_at_close() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_str().unwrap();
    let a = non_durable(root, |_| {}).await;
    // A put with no append in flight starts one at once; one that comes
    // while an append is in flight waits for the interval: put two at a
    // time until one waits (still pending once any append in flight has
    // landed).
    let table = a.table("t").await.unwrap();
    let put = |id: i64| {
        let batch = RecordBatch::try_new(
            table.schema(),
            vec![
                Arc::new(Int64Array::from(vec![id])),
                Arc::new(Int64Array::from(vec![1])),
            ],
        )
        .unwrap();
        let table = Arc::clone(&table);
        async move { table.put(&batch).await.unwrap() }
    };
    let mut acknowledged = 0;
    loop {
        put(acknowledged + 1).await;
        put(acknowledged + 2).await;
        acknowledged += 2;
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        if table.stats(0).unwrap().unwrap().pending_rows > 0 {
            break;
        }
        assert!(
            acknowledged < 200,
            "no put ever waited: the test proves nothing"
        );
    }

    write_from_another_process(root, 100_000);
    let lost = match table.close().await {
        Err(memwal::Error::LostRows { rows, .. }) => rows,
        other => panic!("expected LostRows, got {other:?}"),
    };
    let found = ids_at(root).await;
    // Every acknowledged row missing is counted; the count may also hold
    // rows of an append that landed but was not yet acknowledged when the
    // writer stopped (hence "up to").
    let missing = (1..=acknowledged).filter(|id| !found.contains(id)).count() as u64;
    assert!(
        missing > 0 && missing <= lost && lost <= acknowledged as u64,
        "found {found:?}, lost {lost}"
    );
    assert!(found.contains(&100_000), "{found:?}");
}

/// The same loss noticed while the process keeps writing: the next write
/// fails, writing nothing, and the one after it works on a new writer.
#[tokio::test]
async fn the_next_write_after_a_non_durable_writer_lost_rows_fails_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_str().unwrap();
    // Pending rows past 64 KiB start an append: how this test makes the
    // writer find out it was fenced.
    let a = non_durable(root, |o| o.wal_flush_bytes = 64 << 10).await;
    query(&a, "INSERT INTO t VALUES (1, 1)").await;
    query(&a, "INSERT INTO t VALUES (2, 1)").await;
    write_from_another_process(root, 100);
    // 10,000 rows (about 160 KiB): their append finds the shard taken.
    query(
        &a,
        "INSERT INTO t SELECT value, 2 FROM generate_series(1000, 10999)",
    )
    .await;
    let mut acknowledged: Vec<i64> = [1, 2].into_iter().chain(1000..11000).collect();
    let mut next = 20_000;
    let lost = loop {
        match a
            .sql(&format!("INSERT INTO t VALUES ({next}, 3)"))
            .await
            .unwrap()
            .collect()
            .await
        {
            Ok(_) => acknowledged.push(next),
            Err(e)
                if e.to_string()
                    .contains("acknowledged before they were durable") =>
            {
                break e.to_string();
            }
            Err(e) => panic!("{e}"),
        }
        assert!(next < 20_500, "the loss was never reported");
        next += 1;
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    };
    // The write that reported it wrote nothing; the next one works.
    query(&a, "INSERT INTO t VALUES (30000, 4)").await;
    a.table("t").await.unwrap().close().await.unwrap();
    let found = ids_at(root).await;
    assert!(!found.contains(&next), "the failed write wrote {next}");
    assert!(found.contains(&30000) && found.contains(&100), "{found:?}");
    let missing = acknowledged.iter().filter(|id| !found.contains(id)).count();
    let reported: usize = lost
        .split("up to ")
        .nth(1)
        .and_then(|rest| rest.split(' ').next()?.parse().ok())
        .unwrap_or_else(|| panic!("no count in: {lost}"));
    // 10,000 rows at least went with the fenced append.
    assert!(
        missing >= 10_000 && missing <= reported && reported <= acknowledged.len(),
        "{missing} missing: {lost}"
    );
}

/// The same loss reported even when the open that found it was dropped
/// before it finished (a cancelled statement, or a load's other opens
/// when one fails): a dropped open never takes the report with it.
#[tokio::test]
async fn a_loss_is_reported_after_the_open_that_found_it_was_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_str().unwrap();
    let a = non_durable(root, |o| o.wal_flush_bytes = 64 << 10).await;
    query(&a, "INSERT INTO t VALUES (1, 1)").await;
    let table = a.table("t").await.unwrap();
    let writer = table.writer(0).await.unwrap();
    write_from_another_process(root, 100);
    // About 160 KiB of rows: their append finds the shard taken.
    query(
        &a,
        "INSERT INTO t SELECT value, 2 FROM generate_series(1000, 10999)",
    )
    .await;
    for _ in 0..500 {
        if writer.stopped().is_some() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert!(writer.lost_rows().is_some(), "{:?}", writer.stopped());
    // An open polled once and dropped; then what it spawned, if anything,
    // runs (this runtime has one thread).
    let mut open = Box::pin(table.writer(0));
    let first = futures::poll!(open.as_mut());
    drop(open);
    tokio::task::yield_now().await;
    let lost = |r: &memwal::Result<_>| matches!(r, Err(memwal::Error::LostRows { .. }));
    let reported = match first {
        std::task::Poll::Ready(r) => lost(&r.map(|_| ())),
        std::task::Poll::Pending => false,
    };
    let ids = Int64Array::from(vec![20_000]);
    let row =
        RecordBatch::try_new(table.schema(), vec![Arc::new(ids.clone()), Arc::new(ids)]).unwrap();
    let next = table.put(&row).await.map(|_| ());
    assert!(
        reported ^ lost(&next),
        "reported by the dropped open: {reported}; the next write: {next:?}"
    );
}

/// A query that another process's DROP TABLE overtakes fails saying so,
/// not with an internal object's "not found".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_query_overtaken_by_a_drop_in_another_process_says_the_table_was_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_str().unwrap();
    let shell = |sql: &str| shell(root, &[], sql);
    let out = shell(
        "CREATE TABLE t (id BIGINT PRIMARY KEY, name TEXT) WITH ('shards' = '4'); \
         INSERT INTO t SELECT value, 'n' || value FROM generate_series(1, 2000000)",
    )
    .wait_with_output()
    .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // A scan slow enough (md5 over every row) that the drop comes first.
    let slow = format!("SELECT count(*) FROM t WHERE {} < '8'", {
        (0..6).fold("name".to_string(), |e, _| format!("md5({e})"))
    });
    let query = shell(&slow);
    tokio::time::sleep(std::time::Duration::from_millis(700)).await;
    let dropped = shell("DROP TABLE t").wait_with_output().unwrap();
    assert!(dropped.status.success());
    let out = query.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "the query finished before the drop");
    assert!(
        stderr.contains("dropped while this statement ran"),
        "{stderr}"
    );
}

/// Two sessions like two processes on one in-memory root: another
/// process's, and this one's, whose requests go through a fault-injecting
/// store (its gates hold them while the other acts).
async fn two_processes() -> (
    MemwalSession,
    Arc<memwal::testing::FaultyStore>,
    MemwalSession,
) {
    let inner: Arc<dyn object_store::ObjectStore> = Arc::new(object_store::memory::InMemory::new());
    let faulty = memwal::testing::FaultyStore::new(Arc::clone(&inner));
    let (catalog, writer) = (CatalogOptions::default(), WriterOptions::default());
    let other = session_over(inner, "memory://two", catalog.clone(), writer.clone()).await;
    let this = session_over(faulty.clone(), "memory://two", catalog, writer).await;
    (other, faulty, this)
}

/// A `memwal` shell on `root` (with `args` before `-c`) running `sql`,
/// its stderr piped.
fn shell(root: &str, args: &[&str], sql: &str) -> std::process::Child {
    std::process::Command::new(env!("CARGO_BIN_EXE_memwal"))
        .args(["--root", root, "-q"])
        .args(args)
        .args(["-c", sql])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap()
}

/// A bulk load overtaken by a DROP TABLE in another process says the
/// table was dropped (found from outside: "Object at location
/// .../load/.../data.parquet not found", a run deleted under it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_load_overtaken_by_a_drop_in_another_process_says_the_table_was_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_str().unwrap();
    let created = shell(root, &[], "CREATE TABLE t (id BIGINT PRIMARY KEY, v TEXT)");
    assert!(created.wait_with_output().unwrap().status.success());
    let load = shell(
        root,
        &["--option", "load_memory_bytes=2MiB"],
        "INSERT INTO t SELECT value, 'bulk' FROM generate_series(1, 3000000) ORDER BY random()",
    );
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    let dropped = shell(root, &[], "DROP TABLE t").wait_with_output().unwrap();
    assert!(dropped.status.success());
    let out = load.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "the load finished before the drop");
    assert!(stderr.contains("dropped"), "{stderr}");
    assert!(!stderr.contains("not found"), "{stderr}");
}

/// A write that took effect in some shards before a DROP TABLE in another
/// process failed it in the others says the table was dropped, not which
/// shards took it (found from outside: "the write took effect in shards
/// [0] (1482 rows) and failed in shards [1]", rows no one can read).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_cut_off_by_a_drop_in_another_process_says_the_table_was_dropped() {
    use memwal::testing::OpKind;
    let (other, faulty, this) = two_processes().await;
    let create = "CREATE TABLE t (id BIGINT PRIMARY KEY, v BIGINT) WITH ('shards' = '2')";
    query(&other, create).await;
    let held = faulty.gate(OpKind::Put, "/shards/1/wal/");
    let writing = tokio::spawn(async move {
        let values: Vec<String> = (0..20).map(|id| format!("({id}, 1)")).collect();
        let insert = format!("INSERT INTO t VALUES {}", values.join(", "));
        match this.sql(&insert).await {
            Ok(rows) => rows.collect().await.map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        }
    });
    held.arrived(1).await;
    // Shard 0's part is durable (a shard's part is all or nothing).
    while count(&other, "t").await.contains("| 0 ") {
        tokio::task::yield_now().await;
    }
    query(&other, "DROP TABLE t").await;
    held.open();
    let err = writing.await.unwrap().unwrap_err();
    assert!(err.contains("dropped while this statement ran"), "{err}");
}

/// A write whose shard a DROP TABLE in another process sealed while the
/// write's writer was claiming it says the table was dropped and that
/// nothing was written (found from outside: "the shard at
/// '.../shards/0/manifest' (its table was dropped) does not exist", said
/// neither).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_whose_shard_is_dropped_during_its_claim_says_nothing_was_written() {
    use memwal::testing::OpKind;
    let (other, faulty, this) = two_processes().await;
    query(&other, "CREATE TABLE t (id BIGINT PRIMARY KEY, v BIGINT)").await;
    query(&other, "INSERT INTO t VALUES (1, 1)").await;
    // This process's claim of the shard is held until the drop is done.
    let held = faulty.gate(OpKind::Put, "/shards/0/manifest/v");
    let writing = tokio::spawn(async move {
        match this.sql("INSERT INTO t VALUES (2, 2)").await {
            Ok(rows) => rows.collect().await.map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        }
    });
    held.arrived(1).await;
    query(&other, "DROP TABLE t").await;
    held.open();
    let err = writing.await.unwrap().unwrap_err();
    assert!(
        err.contains("(dropped before this write reached it; nothing was written)"),
        "{err}"
    );
}

/// A read in one process completes while another process's writer
/// flushes (and deletes the WAL it flushed) each time the read lists the
/// WAL (found from outside: a `SELECT count(*)` beside a shell with
/// `memtable_bytes=1` failed half the time with "commit conflict on a
/// consistent snapshot ... gave up after 10 attempts").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_completes_while_another_process_flushes_under_every_listing() {
    use memwal::testing::OpKind;
    let (other, faulty, reader) = two_processes().await;
    query(
        &other,
        "CREATE TABLE t (id BIGINT PRIMARY KEY, v BIGINT) WITH ('shards' = '1')",
    )
    .await;
    query(&other, "INSERT INTO t VALUES (0, 0)").await;
    let mut listing = faulty.gate(OpKind::List, "/wal");
    let mut read = tokio::spawn(async move { count(&reader, "t").await });
    let mut written = 1;
    let answer = loop {
        tokio::select! {
            answer = &mut read => break answer.unwrap(),
            () = listing.arrived(1) => {
                assert!(written <= 20, "the read never completed");
                // While the read lists the WAL, the other process writes
                // a row and flushes it (its close), deleting the WAL.
                query(&other, &format!("INSERT INTO t VALUES ({written}, 1)")).await;
                other.table("t").await.unwrap().close().await.unwrap();
                written += 1;
                let next = faulty.gate(OpKind::List, "/wal");
                listing.open();
                listing = next;
            }
        }
    };
    listing.open();
    assert!(written > 1, "the read did not list the WAL");
    // What it read is a prefix of the writes: row 0 and the next n - 1.
    let n = written - 1;
    assert!(
        answer.contains(&format!("| {}", n + 1)) && answer.contains(&format!("| {n} |")),
        "{answer}"
    );
}

/// A statement whose snapshot reads an SSTable that another process's
/// writer replaced and deleted meanwhile (its `sstable_grace` shorter than
/// the statement) fails saying so, not with a bare "not found" (found from
/// outside: DELETEs beside a shell with `sstable_grace=0ms`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_statement_whose_sstables_were_compacted_away_meanwhile_says_so() {
    use memwal::testing::{FaultyStore, OpKind};
    use object_store::ObjectStore;
    let inner: Arc<dyn ObjectStore> = Arc::new(object_store::memory::InMemory::new());
    let session_on = |store: Arc<dyn object_store::ObjectStore>| {
        let mut options = WriterOptions::default();
        options.sstable_grace = std::time::Duration::ZERO;
        session_over(
            store,
            "memory://compacted",
            CatalogOptions::default(),
            options,
        )
    };
    let writer = session_on(Arc::clone(&inner)).await;
    query(&writer, "CREATE TABLE t (id BIGINT PRIMARY KEY, v BIGINT)").await;
    // Two SSTables: a close flushes.
    for id in 0..2 {
        query(&writer, &format!("INSERT INTO t VALUES ({id}, {id})")).await;
        writer.table("t").await.unwrap().close().await.unwrap();
    }
    let faulty = FaultyStore::new(Arc::clone(&inner));
    let held = faulty.gate(OpKind::Get, "/sst/");
    let reader = session_on(faulty.clone()).await;
    let reading = tokio::spawn(async move {
        match reader.sql("SELECT * FROM t").await {
            Ok(rows) => rows.collect().await.map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        }
    });
    held.arrived(1).await;
    // Merged into one, the two deleted at once.
    writer.table("t").await.unwrap().compact().await.unwrap();
    held.open();
    let err = reading.await.unwrap().unwrap_err();
    assert!(
        err.contains("replaced since by the shard's writer, and deleted after its sstable_grace"),
        "{err}"
    );
    writer.close().await.unwrap();
}

/// Like SSTables, the deletion vectors and blob packs a statement's
/// snapshot reads may be replaced and deleted meanwhile (found from
/// outside: scans beside a shell with `sstable_grace=0ms` that upserted
/// blobs and flushed were told those objects were corrupt).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_statement_whose_deletion_vector_or_blob_pack_was_replaced_meanwhile_says_so() {
    let rows = |keys: std::ops::Range<u32>, value: &str| {
        let rows: Vec<String> = keys.map(|k| format!("({k}, {value})")).collect();
        format!("INSERT INTO t VALUES {}", rows.join(", "))
    };
    let packed = "repeat('v', 5000)::bytea";
    // Each case: the statements of its SSTables (each flushed on its own),
    // the object the read is held at, what replaces that meanwhile, and
    // whether a compaction follows.
    let cases = [
        // The second SSTable marks a fifth of the first one's rows, the
        // third another fifth: the first one, still live (less than half
        // of it marked), has a new deletion vector.
        (
            vec![rows(0..100, "'x'"), rows(0..20, "'y'")],
            "deletions-",
            rows(20..40, "'z'"),
            false,
        ),
        // The only row naming the pack is deleted, and compacted away: a
        // pack of its own, and one inside its WAL entry (the default).
        (
            vec![rows(0..1, packed)],
            "/blobs/",
            "DELETE FROM t WHERE id = 0".to_string(),
            true,
        ),
        (
            vec![rows(0..1, packed)],
            "/wal/",
            "DELETE FROM t WHERE id = 0".to_string(),
            true,
        ),
    ];
    for (written, held, replace, compact) in cases {
        let inner: Arc<dyn object_store::ObjectStore> =
            Arc::new(object_store::memory::InMemory::new());
        let session_on = |store: Arc<dyn object_store::ObjectStore>| {
            let mut options = WriterOptions::default();
            if held == "/blobs/" {
                options.blob_wal_pack_bytes = 0;
            }
            options.sstable_grace = std::time::Duration::ZERO;
            // No compaction but the test's.
            options.max_sstables = 100;
            session_over(
                store,
                "memory://replaced",
                CatalogOptions::default(),
                options,
            )
        };
        let writer = session_on(Arc::clone(&inner)).await;
        let create = "CREATE TABLE t (id BIGINT PRIMARY KEY, raw BYTEA) \
                      WITH ('raw.blob' = 'true', 'shards' = '1')";
        query(&writer, create).await;
        for statement in written {
            query(&writer, &statement).await;
            writer.table("t").await.unwrap().close().await.unwrap();
        }
        let faulty = memwal::testing::FaultyStore::new(Arc::clone(&inner));
        let gate = faulty.gate(memwal::testing::OpKind::Get, held);
        let reader = session_on(faulty.clone()).await;
        let reading = tokio::spawn(async move {
            match reader.sql("SELECT id, raw FROM t").await {
                Ok(rows) => rows.collect().await.map_err(|e| e.to_string()),
                Err(e) => Err(e.to_string()),
            }
        });
        tokio::time::timeout(std::time::Duration::from_secs(10), gate.arrived(1))
            .await
            .unwrap_or_else(|_| panic!("{held}: never read"));
        query(&writer, &replace).await;
        let t = writer.table("t").await.unwrap();
        t.close().await.unwrap();
        if compact {
            t.compact().await.unwrap();
        }
        gate.open();
        let err = reading.await.unwrap().unwrap_err();
        assert!(
            err.contains("replaced since by the shard's writer") && err.contains(held),
            "{held}: {err}"
        );
        writer.close().await.unwrap();
    }
}

/// A statement paused while it opens a shard's writer (its future not
/// polled) holds up no other statement on the shard: the open goes on,
/// on a task of its own (found in CI: a bulk load's test hung where the
/// load it held back was opening the writers its next put needed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_statement_paused_while_it_opens_a_writer_holds_up_no_other() {
    use memwal::testing::{FaultyStore, OpKind};
    let faulty = FaultyStore::new(Arc::new(object_store::memory::InMemory::new()));
    let (catalog, writer) = (CatalogOptions::default(), WriterOptions::default());
    let session = session_over(faulty.clone(), "memory://paused", catalog, writer).await;
    query(&session, "CREATE TABLE t (id BIGINT PRIMARY KEY)").await;
    // A writer's open claims the shard in its manifest.
    let opens = faulty.gate(OpKind::Put, "/manifest/");
    let first = session
        .sql("INSERT INTO t VALUES (1)")
        .await
        .unwrap()
        .collect();
    tokio::pin!(first);
    pause_at(&mut first, opens.arrived(1), "its writer opened").await;
    opens.open();
    // `first` is not polled again until the second statement is done (a
    // minute is a hang, not a slow store).
    let second = tokio::time::timeout(
        std::time::Duration::from_secs(60),
        query(&session, "INSERT INTO t VALUES (2)"),
    )
    .await;
    assert!(
        second.is_ok(),
        "the second insert waited for the paused one"
    );
    first.await.unwrap();
    let count = query(&session, "SELECT count(*) AS n FROM t").await;
    assert!(count.contains("| 2 |"), "{count}");
}

/// Likewise a read paused while it reads a shard's manifest, in a
/// process that does not write the shard, holds up no other read of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_paused_while_it_reads_a_shard_holds_up_no_other() {
    use memwal::testing::{FaultyStore, OpKind};
    let inner: Arc<dyn object_store::ObjectStore> = Arc::new(object_store::memory::InMemory::new());
    let session_on = |store: Arc<dyn object_store::ObjectStore>| {
        let (catalog, writer) = (CatalogOptions::default(), WriterOptions::default());
        session_over(store, "memory://paused-read", catalog, writer)
    };
    let writer = session_on(Arc::clone(&inner)).await;
    query(&writer, "CREATE TABLE t (id BIGINT PRIMARY KEY)").await;
    query(&writer, "INSERT INTO t VALUES (1), (2)").await;
    writer.close().await.unwrap();
    let faulty = FaultyStore::new(inner);
    let reader = session_on(faulty.clone()).await;
    let reads = faulty.gate(OpKind::Get, "/manifest/");
    let first = reader
        .sql("SELECT count(*) AS n FROM t")
        .await
        .unwrap()
        .collect();
    tokio::pin!(first);
    pause_at(&mut first, reads.arrived(1), "it read the shard").await;
    reads.open();
    let second = tokio::time::timeout(
        std::time::Duration::from_secs(60),
        query(&reader, "SELECT count(*) AS n FROM t"),
    )
    .await
    .expect("the second read waited for the paused one");
    assert!(second.contains("| 2 |"), "{second}");
    let first = pretty_format_batches(&first.await.unwrap())
        .unwrap()
        .to_string();
    assert!(first.contains("| 2 |"), "{first}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_statement_that_names_no_memwal_table_does_not_touch_the_store() {
    use memwal::testing::{FaultyStore, OpKind};
    // So `SELECT 1` and `SET` answer at once however slowly, or not at
    // all, the store answers.
    let faulty = FaultyStore::new(Arc::new(object_store::memory::InMemory::new()));
    // No checkpoint written in the background to count.
    let mut options = CatalogOptions::default();
    options.checkpoint_every = 0;
    let session = session_over(
        faulty.clone(),
        "memory://untouched",
        options,
        WriterOptions::default(),
    )
    .await;
    query(&session, "CREATE TABLE t (id BIGINT PRIMARY KEY)").await;
    let kinds = [OpKind::Get, OpKind::Head, OpKind::List, OpKind::Put];
    let calls = || kinds.map(|k| faulty.calls(k));
    let before = calls();
    let answer = query(&session, "SELECT 1 AS one").await;
    assert!(answer.contains("| 1 "), "{answer}");
    query(&session, "SET datafusion.execution.batch_size = 4096").await;
    assert_eq!(calls(), before);
    // A statement on a memwal table reads the catalog's newest version.
    query(&session, "SELECT count(*) FROM t").await;
    assert_ne!(calls(), before);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_statement_reads_the_catalog_once_whatever_names_it_misses() {
    use memwal::testing::{Fault, FaultyStore, OpKind};
    let inner: Arc<dyn object_store::ObjectStore> = Arc::new(object_store::memory::InMemory::new());
    let session_on = |store: Arc<dyn object_store::ObjectStore>| {
        // No checkpoint written in the background to count.
        let mut options = CatalogOptions::default();
        options.checkpoint_every = 0;
        session_over(store, "memory://once", options, WriterOptions::default())
    };
    let faulty = FaultyStore::new(Arc::clone(&inner));
    let session = session_on(faulty.clone()).await;
    query(&session, "CREATE TABLE t (id BIGINT PRIMARY KEY)").await;
    query(&session, "INSERT INTO t VALUES (1)").await;
    // A rule that never fires counts the catalog's reads. The name of a
    // table function misses the catalog, which the statement read as it
    // began: it is not read again for that.
    faulty.inject(Fault::nth(OpKind::Get, u64::MAX).on_paths_containing("__manifest"));
    let sql = "SELECT count(*) AS n FROM t, generate_series(1, 3)";
    let answer = query(&session, sql).await;
    assert!(answer.contains("| 3 "), "{answer}");
    assert_eq!(faulty.matched_calls(), 1, "one read of the catalog");
    // A table another process creates meanwhile is the next statement's.
    let other = session_on(inner).await;
    query(&other, "CREATE TABLE u (id BIGINT PRIMARY KEY)").await;
    query(&other, "INSERT INTO u VALUES (1), (2)").await;
    other.close().await.unwrap();
    let answer = query(
        &session,
        "SELECT count(*) AS n FROM u, generate_series(1, 3)",
    )
    .await;
    assert!(answer.contains("| 6 "), "{answer}");
    session.close().await.unwrap();
}

/// `UPDATE` is refused with memwal's hint for a memwal table, and left to
/// DataFusion for a table of another catalog.
#[tokio::test]
async fn update_is_refused_for_memwal_tables_only() {
    let dir = tempfile::tempdir().unwrap();
    let session = MemwalSession::open(dir.path().to_str().unwrap())
        .await
        .unwrap();
    let refusal = "UPDATE is not supported by memwal tables: INSERT INTO kv the whole new row";
    session
        .sql("CREATE TABLE kv (id BIGINT PRIMARY KEY, v BIGINT)")
        .await
        .unwrap();
    for sql in [
        "UPDATE kv SET v = 1",
        "UPDATE kv AS k SET v = 1 WHERE k.id = 1",
    ] {
        let refused = session.sql(sql).await.unwrap_err().to_string();
        assert!(refused.contains(refusal), "{sql}: {refused}");
    }
    let elsewhere = session.sql("UPDATE elsewhere.s.kv SET v = 1").await;
    let elsewhere = match elsewhere {
        Ok(frame) => frame.collect().await.unwrap_err().to_string(),
        Err(e) => e.to_string(),
    };
    assert!(!elsewhere.contains("memwal tables"), "{elsewhere}");
    session.close().await.unwrap();
}

/// A `DELETE ... WHERE` deletes the versions it read, as another session
/// (process) sees it: rows upserted out of its predicate while it runs
/// survive, whether they were flushed meanwhile (a shell's close) or are
/// still in the WAL, and rows inserted meanwhile are not its; it counts
/// only what it deleted (found from outside: an upsert was acknowledged,
/// read back, and then gone).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delete_deletes_only_the_versions_it_read() {
    use memwal::testing::OpKind;
    let (other, faulty, deleting) = two_processes().await;
    query(&other, "CREATE TABLE t (id BIGINT PRIMARY KEY, p BIGINT)").await;
    query(
        &other,
        "INSERT INTO t SELECT value, 3 FROM generate_series(1, 1000)",
    )
    .await;
    other.table("t").await.unwrap().close().await.unwrap();
    // The DELETE's rows are read from the SSTable once it took its snapshot.
    let reads = faulty.gate(OpKind::Get, "/sst/");
    let delete = tokio::spawn(async move { query(&deleting, "DELETE FROM t WHERE p = 3").await });
    reads.arrived(1).await;
    query(&other, "INSERT INTO t VALUES (7, 4), (1001, 3)").await;
    other.table("t").await.unwrap().close().await.unwrap();
    query(&other, "INSERT INTO t VALUES (8, 4)").await;
    reads.open();
    let deleted = delete.await.unwrap();
    assert!(deleted.contains("| 998   |"), "{deleted}");
    let rows = query(&other, "SELECT id, p FROM t ORDER BY id").await;
    let expected = "\
+------+---+
| id   | p |
+------+---+
| 7    | 4 |
| 8    | 4 |
| 1001 | 3 |
+------+---+";
    assert_eq!(rows, expected);
}

/// Two identical DELETEs at once (two processes) delete each row once:
/// their counts add up to the rows deleted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn identical_deletes_at_once_count_each_row_once() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_str().unwrap();
    let (a, b) = (isolated(root).await, isolated(root).await);
    query(
        &a,
        "CREATE TABLE t (id BIGINT PRIMARY KEY) WITH ('shards' = '2')",
    )
    .await;
    query(
        &a,
        "INSERT INTO t SELECT value FROM generate_series(1, 20000)",
    )
    .await;
    let count = |out: String| -> u64 {
        out.lines()
            .nth(3)
            .unwrap()
            .trim_matches(|c| c == '|' || c == ' ')
            .parse()
            .unwrap()
    };
    let (x, y) = tokio::join!(
        query(&a, "DELETE FROM t WHERE id <= 10000"),
        query(&b, "DELETE FROM t WHERE id <= 10000")
    );
    assert_eq!(count(x) + count(y), 10000);
    assert!(
        query(&a, "SELECT count(*) AS n FROM t")
            .await
            .contains("| 10000 |")
    );
}

/// Found from outside over S3: a write whose shard could not be opened
/// (its fence's PUT timed out) gave the bare store error, and a scan
/// whose response body stalled named no object.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_open_says_nothing_was_written_and_a_cut_read_names_its_object() {
    use memwal::testing::{Fault, FaultyStore, OpKind};
    let faulty = FaultyStore::new(Arc::new(object_store::memory::InMemory::new()));
    let session = session_over(
        faulty.clone(),
        "memory://named",
        CatalogOptions::default(),
        WriterOptions::default(),
    )
    .await;
    query(&session, "CREATE TABLE t (id BIGINT PRIMARY KEY)").await;
    faulty.inject(
        Fault::nth(OpKind::Put, 1)
            .times(u64::MAX)
            .on_paths_containing("/wal/"),
    );
    let failed = session.sql("INSERT INTO t VALUES (1)").await.unwrap();
    let message = failed.collect().await.unwrap_err().to_string();
    assert!(
        message.contains("the write to shard 0 of the table at 'tables/t-")
            && message.contains("failed; nothing of it was written: opening the shard: "),
        "{message}"
    );
    faulty.clear();
    query(&session, "INSERT INTO t VALUES (2)").await;
    session.close().await.unwrap();
    let answer = query(&session, "SELECT id FROM t").await;
    assert!(
        answer.contains("| 2 ") && !answer.contains("| 1 "),
        "{answer}"
    );
    // The SSTable's body is cut short.
    faulty.inject(
        Fault::nth(OpKind::Get, 1)
            .times(u64::MAX)
            .after_write()
            .on_paths_containing("/sst/"),
    );
    let cut = session.sql("SELECT id FROM t").await.unwrap();
    let message = cut.collect().await.unwrap_err().to_string();
    assert!(
        message.contains("reading tables/t-") && message.contains("/data.parquet: injected"),
        "{message}"
    );
}
