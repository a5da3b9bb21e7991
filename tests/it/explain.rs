//! `EXPLAIN ANALYZE` on a memwal scan shows where the time went: rows per
//! layer, SSTable bytes read, the merge of overlapping layers, and for a
//! key lookup what the statistics, bloom filters and page index pruned;
//! on a vector search, the layers, how each was searched, and the
//! candidates a newer layer superseded.

use std::sync::Arc;
use std::time::Duration;

use datafusion::arrow::util::pretty::pretty_format_batches;
use datafusion::physical_plan::{ExecutionPlan, collect};
use memwal::{MemwalSession, WriterOptions};

/// The memwal scan's metrics after running `sql`, summed over partitions
/// (`name` → value).
async fn scan_metrics(session: &MemwalSession, sql: &str) -> impl Fn(&str) -> usize {
    metrics_of(session, sql, "MemwalScanExec").await
}

/// The metrics of the `operator` in the plan of `sql` after running it,
/// summed over partitions (`name` → value).
async fn metrics_of(
    session: &MemwalSession,
    sql: &str,
    operator: &'static str,
) -> impl Fn(&str) -> usize {
    let plan = session
        .sql(sql)
        .await
        .unwrap()
        .create_physical_plan()
        .await
        .unwrap();
    collect(Arc::clone(&plan), session.context().task_ctx())
        .await
        .unwrap();
    fn find(plan: &Arc<dyn ExecutionPlan>, name: &str) -> Option<Arc<dyn ExecutionPlan>> {
        if plan.name() == name {
            return Some(Arc::clone(plan));
        }
        plan.children().into_iter().find_map(|c| find(c, name))
    }
    let found = find(&plan, operator).unwrap_or_else(|| panic!("no {operator}"));
    let metrics = found.metrics().expect("metrics").aggregate_by_name();
    move |name| match name {
        "output_rows" => metrics.output_rows().expect("output rows"),
        "elapsed_compute" => metrics.elapsed_compute().expect("compute time"),
        _ => metrics
            .sum_by_name(name)
            .unwrap_or_else(|| panic!("no metric {name} in {metrics}"))
            .as_usize(),
    }
}

/// A session on `dir` whose puts append at once, and whose loads above
/// 16 KiB go straight to SSTables.
async fn open(dir: &tempfile::TempDir) -> MemwalSession {
    let mut options = WriterOptions::default();
    options.wal_flush_interval = Duration::ZERO;
    options.load_memory_bytes = 16 << 10;
    MemwalSession::open_with(dir.path().to_str().unwrap(), options)
        .await
        .unwrap()
}

/// The text of what `sql` (an `EXPLAIN`) prints.
async fn explained(session: &MemwalSession, sql: &str) -> String {
    let batches = session.sql(sql).await.unwrap().collect().await.unwrap();
    pretty_format_batches(&batches).unwrap().to_string()
}

#[tokio::test]
async fn explain_analyze_shows_layers_bytes_merge_and_pruning() {
    let dir = tempfile::tempdir().unwrap();
    let session = open(&dir).await;
    for sql in [
        "CREATE TABLE t (id BIGINT PRIMARY KEY, v BIGINT) WITH ('shards' = '1')",
        // 100,000 rows (even keys) in SSTables, then 3 newer versions of
        // which 2 replace SSTable rows, in the MemTable: all in the range
        // of the second row group.
        "INSERT INTO t SELECT 2 * value, 0 FROM generate_series(1, 100000)",
        "INSERT INTO t VALUES (150000, 1), (150002, 1), (200002, 1)",
    ] {
        session.sql(sql).await.unwrap().collect().await.unwrap();
        // The load's runs are merged into one SSTable (row groups of
        // 65,536 and 34,464 rows) before the put, whatever the background
        // compaction got to.
        let table = session.table("t").await.unwrap();
        table.compact().await.unwrap();
        let sstables = table.stats(0).unwrap().map_or(0, |s| s.sstables);
        assert!(sstables <= 1, "{sstables} SSTables");
    }

    let scan = scan_metrics(&session, "SELECT sum(v), count(*) FROM t").await;
    assert_eq!(scan("output_rows"), 100_001);
    assert_eq!(scan("memtable_rows"), 3);
    assert_eq!(scan("sstable_rows"), 100_000);
    // The rows of the second row group and the MemTable go through the
    // merge; 2 older versions are dropped after.
    assert_eq!(scan("merged_rows"), 34_464 + 3);
    assert!(scan("bytes_read") > 65_536, "{}", scan("bytes_read"));
    assert!(scan("merge_time") > 0);
    assert!(scan("elapsed_compute") > 0);

    // A key lookup reads one page (1,024 rows) of the one row group whose
    // statistics cover the key (the second: 34,464 rows).
    let found = scan_metrics(&session, "SELECT v FROM t WHERE id = 140000").await;
    assert_eq!(found("output_rows"), 1);
    assert_eq!(found("row_groups_pruned_by_statistics"), 1);
    assert_eq!(found("rows_pruned_by_page_index"), 34_464 - 1_024);
    // An odd key is in range but in no row group: the bloom filter says so.
    let absent = scan_metrics(&session, "SELECT v FROM t WHERE id = 140001").await;
    assert_eq!(absent("output_rows"), 0);
    assert_eq!(absent("row_groups_pruned_by_bloom_filter"), 1);

    // Once the MemTable's keys span the SSTable, nothing is merged: the
    // SSTable's rows whose keys the MemTable holds are left out instead.
    session
        .sql("INSERT INTO t VALUES (10, 1)")
        .await
        .unwrap()
        .collect()
        .await
        .unwrap();
    let unmerged = scan_metrics(&session, "SELECT sum(v), count(*) FROM t").await;
    assert_eq!(unmerged("output_rows"), 100_001);
    assert_eq!(unmerged("memtable_rows"), 4);
    assert_eq!(unmerged("sstable_rows"), 100_000);
    assert_eq!(unmerged("merged_rows"), 0);
    let text = explained(&session, "EXPLAIN SELECT count(*) FROM t").await;
    assert!(text.contains("unmerged: deletion vectors"), "{text}");

    // And EXPLAIN ANALYZE prints them.
    let text = explained(&session, "EXPLAIN ANALYZE SELECT count(*) FROM t").await;
    for name in [
        "memtable_rows=",
        "sstable_rows=",
        "bytes_read=",
        "merge_time=",
    ] {
        assert!(text.contains(name), "no {name} in\n{text}");
    }
}

#[tokio::test]
async fn a_part_that_pads_a_plan_says_it_reads_nothing() {
    // A plan padded to more tasks than the table has parts: the padding
    // reads nothing, and EXPLAIN says so rather than describe the shard.
    let dir = tempfile::tempdir().unwrap();
    let session = MemwalSession::builder(dir.path().to_str().unwrap())
        .min_scan_tasks(3)
        .open()
        .await
        .unwrap();
    for sql in [
        "CREATE TABLE t (id BIGINT PRIMARY KEY) WITH ('shards' = '1')",
        "INSERT INTO t VALUES (1), (2)",
    ] {
        session.sql(sql).await.unwrap().collect().await.unwrap();
    }
    let text = explained(&session, "EXPLAIN SELECT * FROM t").await;
    assert!(text.contains("part 0: [memtables=1"), "{text}");
    for part in [1, 2] {
        assert!(
            text.contains(&format!("part {part}: [reads nothing]")),
            "{text}"
        );
    }
}

/// A vector search records its layers, how each was searched (a graph
/// walk, or an exact comparison of every row), the candidates a newer
/// version dropped, and the bytes of the SSTable rows it read back.
#[tokio::test]
async fn explain_analyze_of_a_vector_search_shows_its_layers() {
    let dir = tempfile::tempdir().unwrap();
    let session = open(&dir).await;
    for sql in [
        "CREATE TABLE v (id BIGINT PRIMARY KEY, emb FLOAT[4]) WITH ('shards' = '1')",
        // Row i at distance i from the origin, in one SSTable with a graph.
        "INSERT INTO v SELECT value, [CAST(value AS FLOAT), 0.0, 0.0, 0.0] \
         FROM generate_series(1, 2000)",
    ] {
        session.sql(sql).await.unwrap().collect().await.unwrap();
    }
    let table = session.table("v").await.unwrap();
    table.compact().await.unwrap();
    // The 5 nearest moved far away, by newer versions in the MemTable.
    session
        .sql(
            "INSERT INTO v SELECT value, [CAST(value + 5000 AS FLOAT), 0.0, 0.0, 0.0] \
             FROM generate_series(1, 5)",
        )
        .await
        .unwrap()
        .collect()
        .await
        .unwrap();
    let sql = "SELECT id FROM vector_search('v', 'emb', [0.0, 0.0, 0.0, 0.0], 3) ORDER BY id";
    let ids = explained(&session, sql).await;
    for id in ["| 6 ", "| 7 ", "| 8 "] {
        assert!(ids.contains(id), "{ids}");
    }
    let search = metrics_of(&session, sql, "MemwalVectorSearchExec").await;
    assert_eq!(search("output_rows"), 3);
    assert_eq!(search("memtable_layers"), 1);
    assert_eq!(search("sstable_layers"), 1);
    // The SSTable through its graph, the MemTable (5 rows) exactly.
    assert!(search("graph_searches") >= 1);
    assert!(search("exact_scans") >= 1);
    // The 3 nearest in the SSTable, and then more, were superseded: the
    // layers were asked again.
    assert!(search("superseded") >= 3, "{}", search("superseded"));
    assert!(search("more_rounds") >= 1);
    assert!(search("bytes_read") > 0);
    let text = explained(&session, &format!("EXPLAIN ANALYZE {sql}")).await;
    assert!(text.contains("sstable_layers=1"), "{text}");
    session.close().await.unwrap();
}

/// The bytes a read takes from blob packs count in its `bytes_read`: a key
/// lookup that selects a blob column reads its value's bytes, one that
/// does not reads none of them.
#[tokio::test]
async fn bytes_read_counts_the_blob_values_read() {
    let dir = tempfile::tempdir().unwrap();
    let session = open(&dir).await;
    for sql in [
        "CREATE TABLE b (id BIGINT PRIMARY KEY, img BYTEA) WITH ('img.blob' = 'true')",
        "INSERT INTO b VALUES (1, CAST(repeat('x', 100000) AS BYTEA))",
    ] {
        session.sql(sql).await.unwrap().collect().await.unwrap();
    }
    let with = scan_metrics(&session, "SELECT img FROM b WHERE id = 1").await;
    assert_eq!(with("output_rows"), 1);
    assert!(with("bytes_read") >= 100_000, "{}", with("bytes_read"));
    let without = scan_metrics(&session, "SELECT id FROM b WHERE id = 1").await;
    assert_eq!(without("output_rows"), 1);
    assert!(without("bytes_read") < 100_000, "{}", without("bytes_read"));
    let scan = scan_metrics(&session, "SELECT img FROM b").await;
    assert!(scan("bytes_read") >= 100_000, "{}", scan("bytes_read"));
    session.close().await.unwrap();
}
