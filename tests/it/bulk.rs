//! Bulk loads (`Table::put_stream`, SQL `INSERT ... SELECT`): a write larger
//! than `load_memory_bytes` goes to SSTables in runs and is committed per
//! shard at once. It upserts exactly like a small write, orders with the
//! puts around it, writes nothing when it fails, and keeps memory bounded
//! whatever its size (20 M rows through a `memwal` process under 1 GB).
//! Crashes in the middle of a load are in `atomic.rs`.

use std::collections::BTreeMap;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use datafusion::arrow::array::{
    AsArray, FixedSizeListArray, Float32Array, Int64Array, RecordBatch,
};
use datafusion::arrow::datatypes::{DataType, Field, Float32Type, Int64Type, SchemaRef};
use datafusion::arrow::util::pretty::pretty_format_batches;
use futures::{StreamExt, TryStreamExt};
use memwal::testing::{Fault, FaultyStore, OpKind};
use memwal::{Catalog, CatalogOptions, MemwalSession, ObjectRoot, Table, WriterOptions};
use object_store::ObjectStore;
use object_store::memory::InMemory;

use crate::helpers::{files, pause_at, run, scanned_rows};

const DIM: i32 = 4;

fn options() -> WriterOptions {
    let mut o = WriterOptions::default();
    o.wal_flush_interval = Duration::ZERO;
    o.load_memory_bytes = 16 << 10;
    o
}

/// Rows `(id, v, [id, v, 0, 0])` for every id.
fn batch(schema: &SchemaRef, ids: impl IntoIterator<Item = i64>, v: i64) -> RecordBatch {
    let ids: Vec<i64> = ids.into_iter().collect();
    let values: Vec<f32> = ids
        .iter()
        .flat_map(|&id| [id as f32, v as f32, 0.0, 0.0])
        .collect();
    let emb = FixedSizeListArray::new(
        Arc::new(Field::new("item", DataType::Float32, true)),
        DIM,
        Arc::new(Float32Array::from(values)),
        None,
    );
    RecordBatch::try_new(
        Arc::clone(schema),
        vec![
            Arc::new(Int64Array::from(ids.clone())),
            Arc::new(Int64Array::from(vec![v; ids.len()])),
            Arc::new(emb),
        ],
    )
    .unwrap()
}

/// id → v of every live row, checking each vector against its row.
async fn rows(table: &Table) -> BTreeMap<i64, i64> {
    let mut out = BTreeMap::new();
    for b in table.scan().await.unwrap() {
        let ids = b.column(0).as_primitive::<Int64Type>();
        let vs = b.column(1).as_primitive::<Int64Type>();
        let emb = b.column(2).as_fixed_size_list();
        for i in 0..b.num_rows() {
            let e = emb.value(i);
            let e = e.as_primitive::<Float32Type>();
            assert_eq!(
                (e.value(0), e.value(1)),
                (ids.value(i) as f32, vs.value(i) as f32)
            );
            assert!(out.insert(ids.value(i), vs.value(i)).is_none());
        }
    }
    out
}

/// A session on `root` whose tables write with [`options`].
async fn open(root: &str) -> MemwalSession {
    MemwalSession::builder(root)
        .writer_options(options())
        .open()
        .await
        .unwrap()
}

/// A session writing with `options` on a fault-injecting store in memory.
async fn on_faulty_store(options: WriterOptions) -> (Arc<FaultyStore>, MemwalSession) {
    let faulty = FaultyStore::new(Arc::new(InMemory::new()));
    let root = ObjectRoot::new(faulty.clone(), "memory://faulty");
    let catalog = Catalog::open(root, CatalogOptions::default())
        .await
        .unwrap();
    (faulty, MemwalSession::new(catalog, options))
}

async fn create(session: &MemwalSession, name: &str, key: bool) -> Arc<Table> {
    let key = if key { ", PRIMARY KEY (id)" } else { "" };
    session
        .sql(&format!(
            "CREATE TABLE {name} (id BIGINT NOT NULL, v BIGINT NOT NULL, emb FLOAT[{DIM}]{key}) \
             WITH ('shards' = '4')"
        ))
        .await
        .unwrap();
    session.table(name).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_load_upserts_like_a_put_and_orders_with_the_puts_around_it() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_str().unwrap();
    let session = open(root).await;
    let table = create(&session, "t", true).await;
    let schema = table.schema();
    // Rows in MemTables before the load, which the load overwrites.
    assert_eq!(table.put(&batch(&schema, 0..500, -1)).await.unwrap(), 500);
    // 40 batches of 1,000 rows over 25,000 keys: keys repeat across the
    // runs the 16 KiB budget cuts (one per batch and shard, the oldest
    // merged before the commit to leave 16), and the last batch of a key wins.
    let mut model: BTreeMap<i64, i64> = (0..500).map(|id| (id, -1)).collect();
    let batches: Vec<RecordBatch> = (0..40)
        .map(|i| {
            let ids: Vec<i64> = (0..1000).map(|j| (i * 617 + j * 7) % 25_000).collect();
            for &id in &ids {
                model.insert(id, i);
            }
            batch(&schema, ids, i)
        })
        .collect();
    let distinct = {
        let mut ids: Vec<i64> = batches
            .iter()
            .flat_map(|b| b.column(0).as_primitive::<Int64Type>().values().to_vec())
            .collect();
        ids.sort_unstable();
        ids.dedup();
        ids.len() as u64
    };
    let stream = futures::stream::iter(batches.into_iter().map(Ok));
    assert_eq!(table.put_stream(stream).await.unwrap(), distinct);
    let mut loaded = 0;
    for shard in 0..4 {
        loaded += table.writer(shard).await.unwrap().stats().sstables;
    }
    assert!(loaded >= 4, "the load went to SSTables ({loaded})");
    // A put after the load overwrites it.
    table.put(&batch(&schema, [7, 30_000], 99)).await.unwrap();
    model.insert(7, 99);
    model.insert(30_000, 99);
    assert_eq!(rows(&table).await, model);

    // Vector search finds loaded rows through their SSTables' graphs.
    let query = format!(
        "SELECT id FROM vector_search('t', 'emb', [123.0, {}.0, 0.0, 0.0], 3) \
         WHERE v >= 0 ORDER BY _distance",
        model[&123]
    );
    let hits = run(&session, &query).await;
    let first = hits[0].column(0).as_primitive::<Int64Type>().value(0);
    assert_eq!(
        first, 123,
        "row 123 is nearest to its own vector ({hits:?})"
    );

    // Another process sees the same rows.
    session.close().await.unwrap();
    let other = MemwalSession::open(root).await.unwrap();
    assert_eq!(rows(&other.table("t").await.unwrap()).await, model);
    other.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_load_without_a_key_appends_every_row() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_str().unwrap();
    let session = open(root).await;
    let table = create(&session, "log", false).await;
    let schema = table.schema();
    let stream = futures::stream::iter((0..30).map(|i| Ok(batch(&schema, 0..1000, i))));
    assert_eq!(table.put_stream(stream).await.unwrap(), 30_000);
    let count = run(&session, "SELECT count(*), count(DISTINCT v) FROM log").await;
    assert_eq!(
        count[0].column(0).as_primitive::<Int64Type>().value(0),
        30_000
    );
    assert_eq!(count[0].column(1).as_primitive::<Int64Type>().value(0), 30);
    session.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_load_that_fails_writes_nothing_and_leaves_no_objects() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_str().unwrap();
    let session = open(root).await;
    let table = create(&session, "t", true).await;
    let schema = table.schema();
    table.put(&batch(&schema, 0..10, 1)).await.unwrap();
    let before = rows(&table).await;
    let objects = || {
        files(dir.path())
            .iter()
            .map(|p| p.to_string_lossy().into_owned())
            .filter(|p| p.contains("/sst/") || p.contains("/load/"))
            .count()
    };
    let sstables_before = objects();
    // Many runs are written before the bad batch arrives.
    let good = (0..30).map(|i| Ok(batch(&schema, i * 1000..(i + 1) * 1000, 2)));
    // A batch without the vector column.
    let bad = batch(&schema, [1, 2], 3).project(&[0, 1]).unwrap();
    let stream = futures::stream::iter(good.chain([Ok(bad)]));
    let err = table.put_stream(stream).await.unwrap_err();
    assert!(matches!(err, memwal::Error::InvalidInput(_)), "{err}");
    // A failure in the input stream itself.
    let failing = (0..30)
        .map(|i| Ok(batch(&schema, 0..1000, i)))
        .chain([Err(memwal::Error::invalid("the source broke"))]);
    let err = table
        .put_stream(futures::stream::iter(failing))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("the source broke"), "{err}");
    assert_eq!(rows(&table).await, before);
    assert_eq!(
        objects(),
        sstables_before,
        "runs of failed loads are deleted"
    );
    session.close().await.unwrap();
}

/// A load writes its runs while its shards' writers still open (a run
/// needs no writer, the commit does): on an object store the requests of
/// the opens do not come before the rows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_load_writes_its_runs_while_its_writers_open() {
    let (faulty, session) = on_faulty_store(options()).await;
    let table = create(&session, "t", true).await;
    let schema = table.schema();
    // A writer's open claims its shard with a manifest version.
    let claims = faulty.gate(OpKind::Put, "/manifest/v");
    let runs = faulty.gate(OpKind::Put, "/data.parquet");
    let input = (0..30).map(move |i| Ok(batch(&schema, i * 1000..(i + 1) * 1000, 1)));
    let load = tokio::spawn({
        let table = Arc::clone(&table);
        async move { table.put_stream(futures::stream::iter(input)).await }
    });
    claims.arrived(1).await;
    let wait = Duration::from_secs(30);
    tokio::time::timeout(wait, runs.arrived(1))
        .await
        .expect("a run is written while the writers open");
    claims.open();
    runs.open();
    assert_eq!(load.await.unwrap().unwrap(), 30_000);
    assert_eq!(rows(&table).await.len(), 30_000);
    session.close().await.unwrap();
}

/// A write whose part fails in one shard and takes effect in the others
/// (a put, then a bulk load) says which shards hold it, and they do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_that_fails_in_one_shard_names_the_shards_that_hold_it() {
    let mut o = options();
    o.append_retries = 1;
    let (faulty, session) = on_faulty_store(o).await;
    let table = create(&session, "t", true).await;
    let schema = table.schema();
    table.put(&batch(&schema, 0..100, 1)).await.unwrap();
    // Shard 1 can append to its WAL no more.
    faulty.inject(
        Fault::nth(OpKind::Put, 1)
            .times(u64::MAX)
            .on_paths_containing("/shards/1/wal/"),
    );
    let partly = |err: memwal::Error, v: i64, rows: &BTreeMap<i64, i64>| match err {
        memwal::Error::PartlyWritten {
            written,
            rows: held,
            failed,
            unknown,
            ..
        } => {
            assert_eq!((written, failed), (vec![0, 2, 3], vec![1]));
            assert!(unknown.is_empty());
            let new = rows.values().filter(|&&x| x == v).count() as u64;
            assert_eq!(held, new, "the rows the written shards hold");
            assert!(
                new > 0 && (new as usize) < rows.len(),
                "{new} of {}",
                rows.len()
            );
        }
        other => panic!("{other}"),
    };
    let err = table.put(&batch(&schema, 0..100, 2)).await.unwrap_err();
    assert!(err.to_string().contains("shards [0, 2, 3]"), "{err}");
    let got = rows(&table).await;
    assert_eq!(got.len(), 100);
    partly(err, 2, &got);
    // The next write opens shard 1 again; then its manifest takes no
    // commit, and a load larger than its memory budget commits the others.
    faulty.clear();
    table.put(&batch(&schema, 0..100, 1)).await.unwrap();
    faulty.inject(
        Fault::nth(OpKind::Put, 1)
            .times(u64::MAX)
            .on_paths_containing("/shards/1/manifest/"),
    );
    let load = (0..20).map(|i| Ok(batch(&schema, i * 500..(i + 1) * 500, 3)));
    let err = table
        .put_stream(futures::stream::iter(load))
        .await
        .unwrap_err();
    partly(err, 3, &rows(&table).await);
    // A commit that timed out may still land (found from outside over S3,
    // where it did): shard 1's part of a load whose commit timed out, then
    // failed quickly, has an unknown outcome.
    faulty.clear();
    table.put(&batch(&schema, 0..100, 1)).await.unwrap();
    faulty.inject(
        Fault::nth(OpKind::Put, 1)
            .times(u64::MAX)
            .slowly(Duration::from_millis(1100))
            .on_paths_containing("/shards/1/manifest/"),
    );
    let load = (0..20).map(|i| Ok(batch(&schema, i * 500..(i + 1) * 500, 5)));
    let err = table.put_stream(futures::stream::iter(load)).await;
    match err.unwrap_err() {
        memwal::Error::PartlyWritten {
            written,
            failed,
            unknown,
            ..
        } => assert_eq!((written, failed, unknown), (vec![0, 2, 3], vec![], vec![1])),
        other => panic!("{other}"),
    }
    faulty.clear();
    table.put(&batch(&schema, 0..10_000, 4)).await.unwrap();
    assert!(rows(&table).await.values().all(|&v| v == 4));
    session.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_load_survives_another_writer_taking_its_shards_over() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_str().unwrap();
    // The load's markers name a grace of 60 s and are rewritten every
    // 15 s: while it runs they grow older than the other writers'
    // `load_grace` (1 s), and so do its runs. Writers that take a shard
    // over, and the other process's own load (which looks at every
    // shard first), must judge the load by the grace its markers name,
    // and keep its runs.
    let mut options = options();
    options.load_grace = Duration::from_secs(60);
    let session = MemwalSession::builder(root)
        .writer_options(options.clone())
        .open()
        .await
        .unwrap();
    let table = create(&session, "t", true).await;
    let schema = table.schema();
    // Handles of their own: writes through them take the shards over,
    // like another process's.
    options.load_grace = Duration::from_secs(1);
    let other = MemwalSession::new(session.catalog().await.unwrap(), options);
    let other_table = other.table("t").await.unwrap();
    // A load that takes a while: a batch every 20 ms, 3 s in all.
    let load_schema = Arc::clone(&schema);
    let slow = futures::stream::iter(0..150).then(move |i| {
        let schema = Arc::clone(&load_schema);
        async move {
            tokio::time::sleep(Duration::from_millis(20)).await;
            Ok(batch(&schema, i * 1000..(i + 1) * 1000, 1))
        }
    });
    let load = tokio::spawn({
        let table = Arc::clone(&table);
        async move { table.put_stream(Box::pin(slow)).await }
    });
    // Puts of other keys meanwhile, each taking the shards over, and once
    // the markers are 1.5 s old a load of other keys.
    let mut model: BTreeMap<i64, i64> = (0..150_000).map(|id| (id, 1)).collect();
    let (started, mut loaded_too) = (std::time::Instant::now(), false);
    let mut i = 0;
    while !load.is_finished() {
        if !loaded_too && started.elapsed() > Duration::from_millis(1500) {
            let ids = 2_000_000..2_010_000;
            let batches = ids
                .clone()
                .step_by(1000)
                .map(|at| Ok(batch(&schema, at..at + 1000, 3)));
            let other_load = other_table.put_stream(futures::stream::iter(batches));
            assert_eq!(other_load.await.unwrap(), 10_000);
            model.extend(ids.map(|id| (id, 3)));
            loaded_too = true;
            continue;
        }
        let ids = (0..8).map(|j| 1_000_000 + i * 8 + j);
        other_table
            .put(&batch(&schema, ids.clone(), 2))
            .await
            .unwrap();
        model.extend(ids.map(|id| (id, 2)));
        i += 1;
    }
    assert_eq!(load.await.unwrap().unwrap(), 150_000);
    assert!(
        i >= 2 && loaded_too,
        "puts ran during the load ({i}, {loaded_too})"
    );
    assert_eq!(rows(&table).await, model);
    other.close().await.unwrap();
    session.close().await.unwrap();
}

/// A load stalled past its grace, which a writer of its shards takes for
/// crashed while the load commits, either commits first (and the writer
/// keeps its runs) or commits nothing: never runs the writer deletes. (A
/// look for the runs before the commit was no guard: the writer could
/// delete them between the look and the commit, and the table could not
/// be read since.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_load_taken_for_crashed_as_it_commits_never_names_deleted_runs() {
    let mut options = options();
    options.load_grace = Duration::from_secs(1);
    let (faulty, session) = on_faulty_store(options).await;
    let table = create(&session, "t", true).await;
    let schema = table.schema();
    // Every writer open, the table empty.
    table.compact().await.unwrap();
    // The host stalls: the markers are written (4 shards) and never again,
    // and the commits of the runs wait.
    faulty.inject(
        Fault::nth(OpKind::Put, 5)
            .times(u64::MAX)
            .on_paths_containing(".alive"),
    );
    let commits = faulty.gate(OpKind::Put, "/manifest/");
    let started = std::time::Instant::now();
    let load = tokio::spawn({
        let table = Arc::clone(&table);
        let batches: Vec<_> = (0..10)
            .map(|i| Ok(batch(&schema, i * 1000..(i + 1) * 1000, 1)))
            .collect();
        async move { table.put_stream(futures::stream::iter(batches)).await }
    });
    commits.arrived(4).await;
    // Once the markers are stale, the writers sweep (a compaction does).
    tokio::time::sleep(Duration::from_millis(1100).saturating_sub(started.elapsed())).await;
    let sweep = tokio::spawn({
        let table = Arc::clone(&table);
        async move { table.compact().await }
    });
    tokio::select! {
        () = commits.arrived(5) => {}
        swept = tokio::time::timeout(Duration::from_secs(30), async {
            while !sweep.is_finished() {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }) => swept.expect("the sweep ends or commits"),
    }
    commits.open();
    let loaded = load.await.unwrap();
    sweep.await.unwrap().unwrap();
    faulty.clear();
    // Every shard's part is all there or not at all; the table reads.
    let got = rows(&table).await;
    match loaded {
        Ok(n) => assert_eq!((n, got.len()), (10_000, 10_000)),
        Err(e) => {
            let e = e.to_string();
            assert!(e.contains("crashed load"), "{e}");
            assert!(got.len() < 10_000, "{e}");
        }
    }
    assert!(got.values().all(|&v| v == 1));
    session.close().await.unwrap();
}

/// A load paused while it commits (its future not polled) holds up no
/// put: a shard's commit holds its puts until it lands, and it lands
/// whether or not the load is polled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_load_paused_as_it_commits_holds_up_no_put() {
    let (faulty, session) = on_faulty_store(options()).await;
    let table = create(&session, "t", true).await;
    let schema = table.schema();
    // Every writer open, the table empty.
    table.compact().await.unwrap();
    let commits = faulty.gate(OpKind::Put, "/manifest/");
    let batches: Vec<_> = (0..10)
        .map(|i| Ok(batch(&schema, i * 1000..(i + 1) * 1000, 1)))
        .collect();
    let load = table.put_stream(futures::stream::iter(batches));
    tokio::pin!(load);
    pause_at(&mut load, commits.arrived(1), "it committed").await;
    commits.open();
    // Rows in every shard, one of them committing; `load` is not polled
    // again until they are in (a minute is a hang, not a slow store).
    let put = tokio::time::timeout(
        Duration::from_secs(60),
        table.put(&batch(&schema, 20_000..20_100, 2)),
    )
    .await
    .expect("the put waited for the paused load");
    assert_eq!(put.unwrap(), 100);
    assert_eq!(load.await.unwrap(), 10_000);
    assert_eq!(rows(&table).await.len(), 10_100);
    session.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_insert_keeps_the_key_order_of_its_input_and_sorts_no_other() {
    // Rows in key order over four partitions are merged in that order (no
    // interleaving, so the load's runs need no sort); rows in no key order
    // are not sorted by the plan (the load sorts each run in its budget).
    let dir = tempfile::tempdir().unwrap();
    let mut options = options();
    options.load_memory_bytes = 2 << 20;
    let session = MemwalSession::builder(dir.path().to_str().unwrap())
        .writer_options(options)
        .open()
        .await
        .unwrap();
    run(&session, "SET datafusion.execution.target_partitions = 4").await;
    run(
        &session,
        "CREATE TABLE k (id BIGINT PRIMARY KEY, v BIGINT NOT NULL) WITH ('shards' = '4')",
    )
    .await;
    let ordered = "INSERT INTO k SELECT value AS id, value AS v FROM generate_series(1, 300000)";
    let shuffled = "INSERT INTO k SELECT (value * 7919) % 300000, -value \
                    FROM generate_series(1, 150000)";
    let plan = |sql: &str| {
        let session = &session;
        let sql = format!("EXPLAIN {sql}");
        async move {
            let batches = run(session, &sql).await;
            pretty_format_batches(&batches).unwrap().to_string()
        }
    };
    let text = plan(ordered).await;
    assert!(text.contains("SortPreservingMergeExec"), "{text}");
    assert!(
        !text.contains("CoalescePartitionsExec") && !text.contains("SortExec"),
        "{text}"
    );
    let text = plan(shuffled).await;
    assert!(
        !text.contains("SortExec") && !text.contains("SortPreservingMergeExec"),
        "{text}"
    );

    let mut model: BTreeMap<i64, i64> = (1..=300_000).map(|v| (v, v)).collect();
    for value in 1..=150_000i64 {
        model.insert((value * 7919) % 300_000, -value);
    }
    assert_eq!(count(&run(&session, ordered).await), 300_000);
    assert_eq!(count(&run(&session, shuffled).await), 150_000);
    let table = session.table("k").await.unwrap();
    let mut got = BTreeMap::new();
    for b in table.scan().await.unwrap() {
        let (ids, vs) = (
            b.column(0).as_primitive::<Int64Type>(),
            b.column(1).as_primitive::<Int64Type>(),
        );
        for i in 0..b.num_rows() {
            assert!(got.insert(ids.value(i), vs.value(i)).is_none());
        }
    }
    assert_eq!(got, model);
    session.close().await.unwrap();
}

/// The count an INSERT returns.
fn count(out: &[RecordBatch]) -> u64 {
    out[0]
        .column(0)
        .as_primitive::<datafusion::arrow::datatypes::UInt64Type>()
        .value(0)
}

/// Loads into `k` (see [`one_shard_table`]) the values 0..600,000 in order
/// as `(key_of(v), v)`, with one `put_stream`; returns the newest value of
/// each key.
async fn load_keyed(table: &Table, key_of: impl Fn(i64) -> i64) -> BTreeMap<i64, i64> {
    let schema = table.schema();
    let mut model = BTreeMap::new();
    let batches: Vec<RecordBatch> = (0..60i64)
        .map(|b| {
            let values: Vec<i64> = (b * 10_000..(b + 1) * 10_000).collect();
            let ids: Vec<i64> = values.iter().map(|&v| key_of(v)).collect();
            for (&id, &v) in ids.iter().zip(&values) {
                model.insert(id, v);
            }
            RecordBatch::try_new(
                Arc::clone(&schema),
                vec![
                    Arc::new(Int64Array::from(ids)),
                    Arc::new(Int64Array::from(values)),
                ],
            )
            .unwrap()
        })
        .collect();
    let stream = futures::stream::iter(batches.into_iter().map(Ok));
    assert_eq!(table.put_stream(stream).await.unwrap(), model.len() as u64);
    model
}

/// Creates the one-shard table `k (id BIGINT PRIMARY KEY, v BIGINT NOT
/// NULL)`.
async fn create_k(session: &MemwalSession) -> Arc<Table> {
    run(
        session,
        "CREATE TABLE k (id BIGINT PRIMARY KEY, v BIGINT NOT NULL) WITH ('shards' = '1')",
    )
    .await;
    session.table("k").await.unwrap()
}

/// A session on `root` loading with `load_memory_bytes`, and its
/// one-shard table `k (id BIGINT PRIMARY KEY, v BIGINT NOT NULL)`.
async fn one_shard_table(
    root: &std::path::Path,
    load_memory_bytes: usize,
) -> (MemwalSession, Arc<Table>) {
    let mut options = options();
    options.load_memory_bytes = load_memory_bytes;
    let session = MemwalSession::builder(root.to_str().unwrap())
        .writer_options(options)
        .open()
        .await
        .unwrap();
    let table = create_k(&session).await;
    (session, table)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_load_counts_keys_that_runs_overlapping_in_part_both_hold() {
    // Runs of about 100 K rows (two row groups and a part), keys ascending
    // but every 1,000th row repeating a key 150 K rows back, in an earlier
    // run: only the row groups that meet another run's keys are merged to
    // count, and the count must still be exact.
    let dir = tempfile::tempdir().unwrap();
    let (session, table) = one_shard_table(dir.path(), 4 << 20).await;
    let model = load_keyed(&table, |v| if v % 1000 == 7 { v - 150_001 } else { v }).await;
    let stats = table.stats(0).unwrap().unwrap();
    assert!(
        stats.sstables >= 4,
        "the load wrote several runs ({stats:?})"
    );
    let got = run(&session, "SELECT count(*), sum(v) FROM k").await;
    assert_eq!(
        (
            got[0].column(0).as_primitive::<Int64Type>().value(0),
            got[0].column(1).as_primitive::<Int64Type>().value(0)
        ),
        (model.len() as i64, model.values().sum::<i64>())
    );
    session.close().await.unwrap();
}

/// The codec of every column chunk of each Parquet file under `dir`.
fn codecs(dir: &std::path::Path) -> Vec<String> {
    use datafusion::parquet::file::reader::{FileReader, SerializedFileReader};
    let mut out = Vec::new();
    for path in files(dir) {
        if path.extension().is_some_and(|e| e == "parquet") {
            let bytes = bytes::Bytes::from(std::fs::read(&path).unwrap());
            let file = SerializedFileReader::new(bytes).unwrap();
            for group in file.metadata().row_groups() {
                out.extend(group.columns().iter().map(|c| c.compression().to_string()));
            }
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_loads_runs_are_written_fast_and_compacted_small() {
    // A load's runs are LZ4 (compaction soon merges them); what a
    // compaction writes is zstd, like a flush.
    let dir = tempfile::tempdir().unwrap();
    let mut options = options();
    options.load_memory_bytes = 4 << 20;
    options.max_sstables = 64;
    options.sstable_grace = Duration::ZERO;
    let session = MemwalSession::builder(dir.path().to_str().unwrap())
        .writer_options(options)
        .open()
        .await
        .unwrap();
    let table = create_k(&session).await;
    let model = load_keyed(&table, |v| v).await;
    assert!(
        table.stats(0).unwrap().unwrap().sstables >= 3,
        "several runs"
    );
    let loaded = codecs(dir.path());
    assert!(
        !loaded.is_empty() && loaded.iter().all(|c| c == "LZ4_RAW"),
        "{loaded:?}"
    );
    table.writer(0).await.unwrap().compact().await.unwrap();
    let compacted = codecs(dir.path());
    assert!(
        !compacted.is_empty() && compacted.iter().all(|c| c.starts_with("ZSTD")),
        "{compacted:?}"
    );
    assert_eq!(rows_of_k(&session).await, model);
    session.close().await.unwrap();
}

/// id → v of every row of `k`.
async fn rows_of_k(session: &MemwalSession) -> BTreeMap<i64, i64> {
    let mut out = BTreeMap::new();
    for b in run(session, "SELECT id, v FROM k").await {
        let ids = b.column(0).as_primitive::<Int64Type>();
        let vs = b.column(1).as_primitive::<Int64Type>();
        for i in 0..b.num_rows() {
            assert!(out.insert(ids.value(i), vs.value(i)).is_none());
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_load_of_keys_in_no_order_is_scanned_unmerged_through_its_marks() {
    // Keys in no order, most in several runs: every run's range overlaps
    // every other's. The load marks in each run the rows whose keys a
    // later run holds, so a scan reads the runs as they are (no merge by
    // key) and still sees each key once, with its newest value, also
    // after the table is opened again.
    let dir = tempfile::tempdir().unwrap();
    let mut options = options();
    options.load_memory_bytes = 4 << 20;
    // No compaction: the runs stay as the load wrote them.
    options.max_sstables = 64;
    let open = || {
        MemwalSession::builder(dir.path().to_str().unwrap())
            .writer_options(options.clone())
            .open()
    };
    let session = open().await.unwrap();
    let table = create_k(&session).await;
    let model = load_keyed(&table, |v| (v * 7_919) % 250_007).await;
    let stats = table.stats(0).unwrap().unwrap();
    assert!(stats.sstables >= 3, "several runs ({stats:?})");
    let marks = files(dir.path())
        .into_iter()
        .filter(|f| f.to_string_lossy().contains("/deletions-"))
        .count();
    assert!(marks >= 2, "every run but the last has marks: {marks}");
    let expected = (model.len() as i64, model.values().sum::<i64>());
    assert_eq!(count_and_sum_unmerged(&session).await, expected);
    session.close().await.unwrap();
    let session = open().await.unwrap();
    assert_eq!(count_and_sum_unmerged(&session).await, expected);
    session.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flush_that_never_commits_leaves_no_vector_beside_loaded_runs() {
    // Loaded runs stay in their `load/` directories. A flush marks rows of
    // them in new vectors written there, then fails to commit: the next
    // writer deletes those vectors and keeps the ones the manifest names.
    let faulty = FaultyStore::new(Arc::new(InMemory::new()));
    let open = || async {
        let root = ObjectRoot::new(faulty.clone(), "memory://faulty");
        let catalog = Catalog::open(root, CatalogOptions::default())
            .await
            .unwrap();
        let mut options = options();
        options.load_memory_bytes = 4 << 20;
        options.max_sstables = 64;
        MemwalSession::new(catalog, options)
    };
    let vectors = || async {
        let listed: Vec<String> = faulty
            .list(None)
            .map_ok(|meta| meta.location.to_string())
            .try_collect()
            .await
            .unwrap();
        let mut vectors: Vec<String> = listed
            .into_iter()
            .filter(|p| p.contains("/load/") && p.contains("/deletions-"))
            .collect();
        vectors.sort();
        vectors
    };
    let session = open().await;
    let table = create_k(&session).await;
    let model = load_keyed(&table, |v| (v * 7_919) % 250_007).await;
    let committed = vectors().await;
    assert!(!committed.is_empty(), "the load marked its runs");
    // Keys every run may hold; no shard manifest commit lands from now on.
    faulty.inject(
        Fault::nth(OpKind::Put, 1)
            .times(u64::MAX)
            .on_paths_containing("/manifest/"),
    );
    run(&session, "INSERT INTO k VALUES (1, -1), (2, -2), (3, -3)").await;
    assert!(session.close().await.is_err(), "the flush cannot commit");
    let failed: Vec<String> = vectors()
        .await
        .into_iter()
        .filter(|v| !committed.contains(v))
        .collect();
    assert!(
        !failed.is_empty(),
        "the flush wrote vectors beside the runs"
    );
    faulty.clear();
    // The next writer (a put opens it) deletes them; every row is there.
    let session = open().await;
    run(&session, "INSERT INTO k VALUES (4, -4)").await;
    session.close().await.unwrap();
    let left = vectors().await;
    assert!(
        failed.iter().all(|v| !left.contains(v)),
        "{failed:?} in {left:?}"
    );
    let mut model = model;
    model.extend([(1, -1), (2, -2), (3, -3), (4, -4)]);
    let session = open().await;
    let got = run(&session, "SELECT count(*), sum(v) FROM k").await;
    assert_eq!(
        (
            got[0].column(0).as_primitive::<Int64Type>().value(0),
            got[0].column(1).as_primitive::<Int64Type>().value(0),
        ),
        (model.len() as i64, model.values().sum::<i64>())
    );
    session.close().await.unwrap();
}

/// `count(*)` and `sum(v)` of `k`, checking that the scan reads its
/// SSTables unmerged.
async fn count_and_sum_unmerged(session: &MemwalSession) -> (i64, i64) {
    let plan = run(session, "EXPLAIN SELECT count(*), sum(v) FROM k").await;
    let text = pretty_format_batches(&plan).unwrap().to_string();
    assert!(text.contains("unmerged: deletion vectors"), "{text}");
    let got = run(session, "SELECT count(*), sum(v) FROM k").await;
    (
        got[0].column(0).as_primitive::<Int64Type>().value(0),
        got[0].column(1).as_primitive::<Int64Type>().value(0),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_small_rows_are_loaded_before_a_put_would_outgrow_the_budget() {
    // 300,000 rows of 17 bytes of Arrow: 5 MB, well within a 32 MiB
    // budget, but a put would also hold a key index entry a row (over
    // 100 bytes each), so the write is a bulk load: in SSTables at once.
    let dir = tempfile::tempdir().unwrap();
    let (session, table) = one_shard_table(dir.path(), 32 << 20).await;
    let schema = table.schema();
    let batches: Vec<Result<RecordBatch, memwal::Error>> = (0..30i64)
        .map(|b| {
            let ids: Vec<i64> = (b * 10_000..(b + 1) * 10_000).collect();
            Ok(RecordBatch::try_new(
                Arc::clone(&schema),
                vec![
                    Arc::new(Int64Array::from(ids.clone())),
                    Arc::new(Int64Array::from(ids)),
                ],
            )
            .unwrap())
        })
        .collect();
    let loaded = table.put_stream(futures::stream::iter(batches)).await;
    assert_eq!(loaded.unwrap(), 300_000);
    let stats = table.stats(0).unwrap().unwrap();
    assert!(stats.sstables >= 1, "loaded into SSTables ({stats:?})");
    assert_eq!(stats.rows, 0, "no put ({stats:?})");
    session.close().await.unwrap();
}

/// Starts a `memwal` load into `t` at `root` far from its commit (a 1 MiB
/// budget, 3 M rows, markers naming a grace of 1 s), kills it once it has
/// written runs, and returns its id (as its objects' names start).
async fn kill_a_load(root: &str, loads: &impl Fn() -> Vec<String>) -> String {
    let load = "INSERT INTO t SELECT value, 1 FROM generate_series(1, 3000000)";
    let before = loads();
    let mut child = Command::new(env!("CARGO_BIN_EXE_memwal"))
        .args(["--root", root, "-q", "-c", load])
        .args([
            "--option",
            "load_memory_bytes=1MiB",
            "--option",
            "load_grace=1s",
        ])
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let ours = || -> Vec<String> {
        let now = loads();
        now.into_iter().filter(|p| !before.contains(p)).collect()
    };
    while !ours().iter().any(|p| p.ends_with("data.parquet")) {
        assert!(std::time::Instant::now() < deadline, "no run written");
        assert!(child.try_wait().unwrap().is_none(), "the load ended");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    child.kill().unwrap();
    child.wait().unwrap();
    let markers: Vec<String> = ours()
        .iter()
        .filter_map(|p| p.strip_suffix(".alive"))
        .map(|p| p.rsplit_once('/').unwrap().1[..16].to_string())
        .collect();
    assert_eq!(markers.len(), 4, "a marker per shard: {:?}", ours());
    markers[0].clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_runs_of_a_killed_load_are_deleted_once_its_markers_age() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_str().unwrap();
    let create = "CREATE TABLE t (id BIGINT PRIMARY KEY, v BIGINT) WITH ('shards' = '4')";
    run_measured(&["--root", root, "-q", "-c", create]);
    let loads = || -> Vec<String> {
        files(dir.path())
            .iter()
            .map(|p| p.to_string_lossy().into_owned())
            // Not the staging files of writes the kill cut short (`<name>#<n>`),
            // which the local store lists as nothing.
            .filter(|p| p.contains("/load/") && !p.contains('#'))
            .collect()
    };
    let left_of = |id: &str| -> Vec<String> {
        let left = loads();
        left.into_iter().filter(|p| p.contains(id)).collect()
    };

    // Once its markers are older than the grace they name, the killed
    // load is deleted in every shard by the next load (of another process,
    // with its default grace) before it starts; the table never held it.
    let killed = kill_a_load(root, &loads).await;
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let session = open(root).await;
    run(
        &session,
        "INSERT INTO t SELECT value, 2 FROM generate_series(1, 10000)",
    )
    .await;
    assert_eq!(left_of(&killed), Vec::<String>::new());
    assert!(
        !loads().iter().any(|p| p.ends_with(".alive")),
        "{:?}",
        loads()
    );
    let table = session.table("t").await.unwrap();
    assert_eq!(scanned_rows(&table).await, 10_000);

    // And by a compaction of the table (in a session opened after the
    // kill: this one's writers were fenced by the killed process).
    session.close().await.unwrap();
    let killed = kill_a_load(root, &loads).await;
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let session = open(root).await;
    let table = session.table("t").await.unwrap();
    table.compact().await.unwrap();
    assert_eq!(left_of(&killed), Vec::<String>::new());
    assert_eq!(scanned_rows(&table).await, 10_000);
    session.close().await.unwrap();
}

/// Runs `memwal` with `args`, returning its stdout and peak RSS in bytes.
fn run_measured(args: &[&str]) -> (String, u64) {
    // Reaped below by wait4, which std's wait cannot stand in for.
    #[allow(clippy::zombie_processes)]
    let child = Command::new(env!("CARGO_BIN_EXE_memwal"))
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let pid = child.id() as libc::pid_t;
    let mut stdout = child.stdout.unwrap();
    let mut out = String::new();
    std::io::Read::read_to_string(&mut stdout, &mut out).unwrap();
    let (mut status, mut usage) = (0, unsafe { std::mem::zeroed::<libc::rusage>() });
    // wait4: this child's own peak RSS (ru_maxrss is in KiB on Linux).
    let waited = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
    assert_eq!(waited, pid);
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "memwal {args:?} failed: {out}"
    );
    (out, usage.ru_maxrss as u64 * 1024)
}

#[test]
fn twenty_million_rows_load_with_one_insert_in_bounded_memory() {
    const ROWS: u64 = 20_000_000;
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_str().unwrap();
    let create =
        "CREATE TABLE big (id BIGINT PRIMARY KEY, v VARCHAR NOT NULL) WITH ('shards' = '4')";
    run_measured(&["--root", root, "-q", "-c", create]);
    // About 100 bytes a row: 2 GB of Arrow.
    let insert = format!(
        "INSERT INTO big SELECT value, concat(repeat('x', 84), CAST(value AS VARCHAR)) \
         FROM generate_series(1, {ROWS})"
    );
    let (out, rss) = run_measured(&["--root", root, "-q", "--format", "csv", "-c", &insert]);
    eprintln!("loaded {ROWS} rows with a peak RSS of {} MiB", rss >> 20);
    assert_eq!(out.trim().lines().last(), Some(ROWS.to_string().as_str()));
    assert!(rss < 1 << 30, "peak RSS {} MiB", rss >> 20);
    let check = "SELECT count(*), min(id), max(id), sum(length(v)) FROM big";
    let (out, _) = run_measured(&["--root", root, "-q", "--format", "csv", "-c", check]);
    let digits: u64 = (1..=ROWS).map(|i| i.to_string().len() as u64).sum();
    assert_eq!(
        out.trim().lines().last().unwrap(),
        format!("{ROWS},1,{ROWS},{}", 84 * ROWS + digits)
    );
}

/// A panic in a load's commit (a bug, here a store client's) stops that
/// shard's writer, whose state it may have left half changed, instead of
/// leaving it running: the load fails (that shard's part of it) as
/// poisoned, and the table goes on through a writer opened afresh.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panic_in_a_loads_commit_stops_the_shards_writer() {
    let mut options = options();
    options.load_grace = Duration::from_secs(1);
    let (faulty, session) = on_faulty_store(options).await;
    let table = create(&session, "t", true).await;
    let schema = table.schema();
    let mut writers = Vec::new();
    for shard in 0..4 {
        writers.push(table.writer(shard).await.unwrap());
    }
    // A load whose markers (4 shards) are written once and never again,
    // silent for longer than `load_grace`: each shard's commit first
    // checks that its runs are there, and the first such check panics.
    faulty.inject(
        Fault::nth(OpKind::Put, 5)
            .times(u64::MAX)
            .on_paths_containing(".alive"),
    );
    faulty.inject(
        Fault::nth(OpKind::Head, 1)
            .on_paths_containing("/load/")
            .panicking(),
    );
    let load = |v, pause| {
        let schema = Arc::clone(&schema);
        let batches = futures::stream::iter(0..10).then(move |i| {
            let schema = Arc::clone(&schema);
            async move {
                if i == 5 {
                    tokio::time::sleep(pause).await;
                }
                Ok(batch(&schema, i * 1000..(i + 1) * 1000, v))
            }
        });
        table.put_stream(Box::pin(batches))
    };
    let failed = load(1, Duration::from_millis(1100)).await.unwrap_err();
    assert!(
        failed.to_string().contains("a load's commit panicked"),
        "{failed}"
    );
    let stopped = writers
        .iter()
        .filter(|w| matches!(w.stopped(), Some(memwal::Error::Poisoned(_))))
        .count();
    assert_eq!(stopped, 1);
    faulty.clear();
    assert_eq!(load(2, Duration::ZERO).await.unwrap(), 10_000);
    let got = rows(&table).await;
    assert_eq!(got.len(), 10_000);
    assert!(got.values().all(|&v| v == 2));
    session.close().await.unwrap();
}

/// A `CREATE TABLE ... AS SELECT` killed midway leaves no table: its rows
/// are written before the catalog names the table. Once its load's markers
/// age, a sweep deletes what it wrote, and the same statement then
/// succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_table_as_killed_midway_leaves_no_table() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_str().unwrap();
    let ctas = |rows: u64| {
        format!(
            "CREATE TABLE t (id BIGINT PRIMARY KEY, v BIGINT) WITH ('shards' = '4') \
             AS SELECT value, 1 FROM generate_series(1, {rows})"
        )
    };
    let tables = dir.path().join("tables");
    // Not the staging files of writes the kill cut short (`<name>#<n>`),
    // which the local store lists as nothing.
    let written = || -> Vec<_> {
        match tables.exists() {
            true => files(&tables)
                .into_iter()
                .filter(|p| !p.to_string_lossy().contains('#'))
                .collect(),
            false => Vec::new(),
        }
    };
    let mut child = Command::new(env!("CARGO_BIN_EXE_memwal"))
        .args(["--root", root, "-q", "-c", &ctas(3_000_000)])
        .args(["--option", "load_memory_bytes=1MiB"])
        .args(["--option", "load_grace=1s"])
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while !files(dir.path())
        .iter()
        .any(|p| p.to_string_lossy().ends_with("data.parquet"))
    {
        assert!(std::time::Instant::now() < deadline, "no run written");
        assert!(child.try_wait().unwrap().is_none(), "the statement ended");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(!written().is_empty());

    let session = open(root).await;
    let missing = session.table("t").await.map(|_| ()).unwrap_err();
    assert!(matches!(missing, memwal::Error::NotFound(_)), "{missing}");
    // Once its markers are older than the grace they name, by the store's
    // clock (the newest object a sweep sees: a catalog commit).
    tokio::time::sleep(Duration::from_millis(1100)).await;
    run(&session, "CREATE TABLE later (id BIGINT)").await;
    let catalog = session.catalog().await.unwrap();
    catalog
        .collect_dropped_tables(&[], Duration::ZERO)
        .await
        .unwrap();
    assert_eq!(written(), Vec::<std::path::PathBuf>::new());
    run(&session, &ctas(10_000)).await;
    let table = session.table("t").await.unwrap();
    assert_eq!(scanned_rows(&table).await, 10_000);
    session.close().await.unwrap();
}

/// A `CREATE TABLE ... AS SELECT` that fails midway (here in its query,
/// after a bulk load wrote runs) leaves no table and no object.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_create_table_as_leaves_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let session = open(dir.path().to_str().unwrap()).await;
    let ctas = "CREATE TABLE t (id BIGINT PRIMARY KEY, v BIGINT) WITH ('shards' = '4') \
                AS SELECT value, 1 / (value - 90000) FROM generate_series(1, 100000)";
    // DDL runs as it is planned.
    let failed = session.sql(ctas).await.unwrap_err().to_string();
    assert!(failed.contains("Divide by zero"), "{failed}");
    let missing = session.table("t").await.map(|_| ()).unwrap_err();
    assert!(matches!(missing, memwal::Error::NotFound(_)), "{missing}");
    let tables = dir.path().join("tables");
    let left = match tables.exists() {
        true => files(&tables),
        false => Vec::new(),
    };
    assert_eq!(left, Vec::<std::path::PathBuf>::new());
    session.close().await.unwrap();
}

/// Found from outside over S3: a CREATE TABLE AS whose write failed in one
/// shard said it "took effect in shards [1, 2, 3]", of a table that was
/// never created.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_table_as_that_fails_in_one_shard_says_no_table_was_created() {
    let (faulty, session) = on_faulty_store(options()).await;
    faulty.inject(
        Fault::nth(OpKind::Put, 1)
            .times(u64::MAX)
            .on_paths_containing("/shards/0/wal/"),
    );
    let ctas = "CREATE TABLE c (id BIGINT PRIMARY KEY) WITH ('shards' = '4') \
                AS SELECT value FROM generate_series(1, 300)";
    let failed = session.sql(ctas).await.unwrap_err();
    let message = failed.to_string();
    assert!(
        matches!(failed, memwal::Error::NotWritten { .. }),
        "{message}"
    );
    assert!(
        message.starts_with(
            "CREATE TABLE c AS failed; nothing of it was written: no table was created"
        ),
        "{message}"
    );
    let missing = session.table("c").await.map(|_| ()).unwrap_err();
    assert!(matches!(missing, memwal::Error::NotFound(_)), "{missing}");
    faulty.clear();
    session.close().await.unwrap();
}
