//! Storage stays bounded: a table written by a thousand short-lived
//! writers (each a claim, a fence, a put and a close) keeps a bounded
//! number of objects, and a dropped table's objects are deleted.

use std::sync::Arc;
use std::time::Duration;

use crate::helpers::scanned_rows;
use datafusion::arrow::array::{Int64Array, RecordBatch};
use memwal::{MemwalSession, WriterOptions};
use object_store::ObjectStoreExt;

/// Files under `dir` by kind: manifest versions, WAL objects, SSTables.
fn kinds(dir: &std::path::Path) -> std::collections::BTreeMap<&'static str, usize> {
    let mut out = std::collections::BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let path = e.unwrap().path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            let p = path.to_string_lossy();
            let kind = if p.contains("/manifest/") {
                "manifest"
            } else if p.contains("/wal/") {
                "wal"
            } else {
                "sst"
            };
            *out.entry(kind).or_default() += 1;
        }
    }
    out
}

fn count_files(dir: &std::path::Path) -> usize {
    if !dir.exists() {
        return 0;
    }
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let path = e.unwrap().path();
            if path.is_dir() { count_files(&path) } else { 1 }
        })
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_short_lived_writers_leave_a_bounded_number_of_objects() {
    let writers: i64 = std::env::var("MEMWAL_GC_WRITERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000);
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_str().unwrap().to_string();
    let session = MemwalSession::open(&root).await.unwrap();
    session
        .sql("CREATE TABLE t (id BIGINT PRIMARY KEY, v BIGINT) WITH ('shards' = '2')")
        .await
        .unwrap();
    // Short grace periods so that collection happens within the test.
    let options = {
        let mut o = WriterOptions::default();
        o.fence_grace = Duration::from_millis(100);
        o.sstable_grace = Duration::ZERO;
        o.commit.tombstone_ttl = Duration::from_millis(100);
        o
    };
    let tables = dir.path().join("tables");
    // The most objects seen in the first and in the second half of the run.
    let (mut first, mut second) = (0, 0);
    for w in 0..writers {
        // A session with table handles of its own: a new writer per shard.
        let one_shot = MemwalSession::new(session.catalog().await.unwrap(), options.clone());
        let table = one_shot.table("t").await.unwrap();
        let batch = RecordBatch::try_new(
            table.schema(),
            vec![
                Arc::new(Int64Array::from(vec![w, w + writers])),
                Arc::new(Int64Array::from(vec![w, w])),
            ],
        )
        .unwrap();
        table.put(&batch).await.unwrap();
        one_shot.close().await.unwrap();
        let objects = count_files(&tables);
        let most = if w < writers / 2 {
            &mut first
        } else {
            &mut second
        };
        if w >= 50 && objects > *most {
            *most = objects;
        }
    }
    eprintln!(
        "{writers} writers: at most {first} objects in the first half, {second} in the second; at the end {:?}",
        kinds(&tables)
    );
    // Without collection each writer leaves a fence and a few manifest
    // versions behind: thousands of objects. With it, per shard: the kept
    // manifest versions, those between sweeps (64) and tombstones younger
    // than their TTL; at most `max_sstables` SSTables; fences younger than
    // their grace period.
    assert!(second < 400, "{second} objects");
    assert!(second <= first + 50, "still growing: {first} then {second}");
    let table = session.table("t").await.unwrap();
    assert_eq!(scanned_rows(&table).await as i64, 2 * writers);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_tables_leave_nothing_behind() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_str().unwrap().to_string();
    let session = MemwalSession::open(&root).await.unwrap();
    session.sql("CREATE SCHEMA s").await.unwrap();
    session
        .sql("CREATE TABLE keep (id BIGINT PRIMARY KEY)")
        .await
        .unwrap();
    session
        .sql("INSERT INTO keep VALUES (1)")
        .await
        .unwrap()
        .collect()
        .await
        .unwrap();
    let tables = dir.path().join("tables");
    for round in 0..20 {
        for ddl in [
            "CREATE TABLE gone (id BIGINT PRIMARY KEY, v TEXT) WITH ('shards' = '3')",
            "CREATE TABLE s.gone (id BIGINT PRIMARY KEY)",
            "INSERT INTO gone VALUES (1, 'a'), (2, 'b'), (3, 'c')",
            "INSERT INTO s.gone VALUES (1)",
        ] {
            session.sql(ddl).await.unwrap().collect().await.unwrap();
        }
        // Flushed to SSTables too.
        session
            .table("gone")
            .await
            .unwrap()
            .compact()
            .await
            .unwrap();
        let drop = match round % 2 {
            0 => "DROP TABLE gone",
            _ => "DROP TABLE IF EXISTS gone",
        };
        session.sql(drop).await.unwrap();
        session.sql("DROP SCHEMA s CASCADE").await.unwrap();
        session.sql("CREATE SCHEMA s").await.unwrap();
        // The data goes at once; each shard's seal (its newest manifest
        // version and WAL fence, which stop writers elsewhere) stays for
        // the grace period.
        let dirs = table_dirs(&tables);
        assert_eq!(dirs.iter().filter(|d| d.starts_with("keep-")).count(), 1);
        for dropped in dirs.iter().filter(|d| !d.starts_with("keep-")) {
            let left = crate::helpers::files(&tables.join(dropped));
            let seal = |f: &std::path::PathBuf| {
                let f = f.to_string_lossy();
                f.contains("/manifest/v") || f.contains("/wal/")
            };
            assert!(left.iter().all(seal), "round {round}: {left:?}");
            assert!(left.len() <= 2 * 3, "round {round}: {left:?}");
        }
    }
    // Once the grace is over, the seals go too.
    let catalog = session.catalog().await.unwrap();
    let sweep = async |grace| catalog.collect_dropped_tables(&[], grace).await.unwrap();
    sweep(Duration::ZERO).await;
    let dirs = table_dirs(&tables);
    assert_eq!(dirs.len(), 1, "{dirs:?}");
    assert!(dirs[0].starts_with("keep-"), "{dirs:?}");
    // What a writer that missed the drop wrote later is swept too, once
    // it has been quiet for the grace period.
    let store = session.root().store();
    let stray = object_store::path::Path::from("tables/stray-0000000000000001/shards/0/wal/x");
    store.put(&stray, "x".into()).await.unwrap();
    assert_eq!(
        sweep(Duration::from_secs(3600)).await,
        0,
        "too fresh to sweep"
    );
    assert_eq!(sweep(Duration::ZERO).await, 1);
    assert_eq!(count_files(&tables.join("stray-0000000000000001")), 0);
    // Data that a bulk load's marker names stays as long as the marker
    // says (a `CREATE TABLE ... AS SELECT` loads before its table exists).
    let loading = |name: &str| {
        object_store::path::Path::from(format!(
            "tables/loading-0000000000000002/shards/0/load/{name}"
        ))
    };
    let marker = loading("0000000000000001-3600000.alive");
    for object in [&marker, &loading("run")] {
        store.put(object, "x".into()).await.unwrap();
    }
    assert_eq!(sweep(Duration::ZERO).await, 0, "a load runs");
    // The marker, rewritten naming no grace, has aged at once.
    store.delete(&marker).await.unwrap();
    let aged = loading("0000000000000001-0.alive");
    store.put(&aged, "x".into()).await.unwrap();
    assert_eq!(sweep(Duration::ZERO).await, 2);
    let kept: usize = session
        .sql("SELECT * FROM keep")
        .await
        .unwrap()
        .collect()
        .await
        .unwrap()
        .iter()
        .map(|b| b.num_rows())
        .sum();
    assert_eq!(kept, 1);
}

/// The directories under the tables directory that hold a file.
fn table_dirs(tables: &std::path::Path) -> Vec<String> {
    std::fs::read_dir(tables)
        .unwrap()
        .map(|e| e.unwrap())
        .filter(|e| !crate::helpers::files(&e.path()).is_empty())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect()
}

/// A table handle held across a DROP in another process, whose location
/// was then collected, refuses a put once its lease runs out instead of
/// acknowledging rows into a location no table has (found by review: the
/// writer saw no manifest version after its own and appended).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_whose_dropped_table_was_collected_refuses_puts() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_str().unwrap();
    let mut options = WriterOptions::default();
    options.fence_grace = Duration::from_millis(200);
    let writer = MemwalSession::builder(root)
        .writer_options(options)
        .open()
        .await
        .unwrap();
    writer
        .sql("CREATE TABLE kv (id BIGINT PRIMARY KEY)")
        .await
        .unwrap();
    let table = writer.table("kv").await.unwrap();
    let rows = |id: i64| {
        RecordBatch::try_new(table.schema(), vec![Arc::new(Int64Array::from(vec![id]))]).unwrap()
    };
    table.put(&rows(1)).await.unwrap();
    // Another session (as another process would) drops the table and
    // collects its location at once.
    let other = MemwalSession::open(root).await.unwrap();
    other.sql("DROP TABLE kv").await.unwrap();
    let catalog = other.catalog().await.unwrap();
    catalog
        .collect_dropped_tables(&[], Duration::ZERO)
        .await
        .unwrap();
    assert_eq!(count_files(&dir.path().join("tables")), 0);
    // Past the writer's lease (a quarter of its fence grace).
    tokio::time::sleep(Duration::from_millis(100)).await;
    let refused = table.put(&rows(2)).await.unwrap_err();
    assert!(refused.to_string().contains("dropped"), "{refused}");
    assert_eq!(count_files(&dir.path().join("tables")), 0);
}

/// A writer with a shorter fence grace than the one it took the shard
/// from keeps the fence as long as the longer grace: the older writer,
/// still inside its lease, appends at the fence's position, and must
/// collide with it (found by review: the fence went after the shorter
/// grace, the stale append landed below the new writer's replay cursor
/// and its acknowledged row was never read).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shorter_fence_grace_elsewhere_keeps_the_fence_an_older_writer_needs() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_str().unwrap();
    let with_grace = |grace: Duration| {
        let mut options = WriterOptions::default();
        options.fence_grace = grace;
        MemwalSession::builder(root).writer_options(options).open()
    };
    let first = with_grace(Duration::from_secs(3600)).await.unwrap();
    first
        .sql("CREATE TABLE kv (id BIGINT PRIMARY KEY)")
        .await
        .unwrap();
    let table = first.table("kv").await.unwrap();
    let rows = |id: i64| {
        RecordBatch::try_new(table.schema(), vec![Arc::new(Int64Array::from(vec![id]))]).unwrap()
    };
    table.put(&rows(1)).await.unwrap();
    // Another process takes the shard over, flushes past its fence and,
    // its own grace long over, collects.
    let second = with_grace(Duration::from_millis(100)).await.unwrap();
    let taking_over = second.table("kv").await.unwrap();
    taking_over.put(&rows(2)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(150)).await;
    second.close().await.unwrap();
    // The first writer's lease (a quarter of an hour) has not run out.
    table.put(&rows(3)).await.unwrap();
    first.close().await.unwrap();
    let reader = MemwalSession::open(root).await.unwrap();
    let table = reader.table("kv").await.unwrap();
    assert_eq!(scanned_rows(&table).await, 3, "every acknowledged row");
}
