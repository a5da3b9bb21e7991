//! Indexed ingest through the ShardWriter on a local directory, one shard:
//! `--rows` rows of `id BIGINT PRIMARY KEY, emb FLOAT[--dim]` (clustered
//! vectors from `memwal::testing::dataset`) in `--put-rows`-row puts,
//! `--window` puts in flight, each awaiting durability *and* indexing (a
//! put returns once its rows are visible to `vector_search`, so its latency
//! is the visible lag). MemTables freeze at `--memtable-mb` and flush while
//! the writes run. Then `--queries` searches through SQL on the freshly
//! written table (MemTables and SSTables) measure recall@10 against the
//! exact answer; the same searches through the Rust API run over the
//! MemTables and, after a restart, over the flushed SSTables and their
//! persisted graphs. Prints one JSON object.
//!
//! ```text
//! cargo run --example vector_ingest -- --rows 20000 --dim 1024
//! ```

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use clap::Parser;
use datafusion::arrow::array::{AsArray, Int64Array, RecordBatch};
use datafusion::arrow::datatypes::Int64Type;
use memwal::Table;
use memwal::VectorQuery;
use memwal::testing::dataset::{Shape, exact_neighbours, recall, to_array, vectors};
use memwal::testing::distance;
use memwal::{MemwalSession, WriterOptions};

#[derive(Debug, Parser)]
struct Args {
    #[arg(long, default_value_t = 20_000)]
    rows: usize,
    #[arg(long, default_value_t = 1024)]
    dim: usize,
    #[arg(long, default_value_t = 1_000)]
    put_rows: usize,
    #[arg(long, default_value_t = 4)]
    window: usize,
    #[arg(long, default_value_t = 64)]
    memtable_mb: usize,
    #[arg(long, default_value_t = 100)]
    queries: usize,
    /// Directory for the table (default: a fresh temporary one).
    #[arg(long)]
    dir: Option<std::path::PathBuf>,
}

/// Searches `queries` (k = 10, ef = 64) through each shard's snapshot;
/// the searches per second and the ids found.
async fn api_searches(table: &Table, queries: &[f32], dim: usize) -> (f64, Vec<Vec<u32>>) {
    let started = Instant::now();
    let mut found = Vec::new();
    for q in queries.chunks(dim) {
        let query = VectorQuery {
            column: 1,
            vector: q.to_vec(),
            k: 10,
            ef: 64,
            filter: None,
        };
        let mut hits = Vec::new();
        for shard in 0..table.shard_count() as u32 {
            let snapshot = table
                .snapshot(shard, Duration::from_secs(60))
                .await
                .unwrap();
            hits.extend(snapshot.vector_search(&query).await.unwrap());
        }
        hits.sort_by(|a, b| a.distance.total_cmp(&b.distance));
        found.push(
            hits.iter()
                .take(10)
                .map(|h| h.row.column(0).as_primitive::<Int64Type>().value(0) as u32)
                .collect(),
        );
    }
    let rate = (queries.len() / dim) as f64 / started.elapsed().as_secs_f64();
    (rate, found)
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    let dim = args.dim;
    let dir = args.dir.clone().unwrap_or_else(std::env::temp_dir);
    std::fs::create_dir_all(&dir).unwrap();
    let dir = tempfile::tempdir_in(dir).unwrap();
    let root = dir.path().to_str().unwrap().to_string();
    let options = {
        let mut o = WriterOptions::default();
        o.memtable_bytes = args.memtable_mb << 20;
        o
    };
    let session = MemwalSession::open_with(&root, options.clone())
        .await
        .unwrap();
    session
        .sql(&format!(
            "CREATE TABLE vec (id BIGINT PRIMARY KEY, emb FLOAT[{dim}])"
        ))
        .await
        .unwrap()
        .collect()
        .await
        .unwrap();
    let table = session.table("vec").await.unwrap();

    let shape = Shape::Clustered {
        clusters: 100,
        spread: 0.5,
    };
    let data = vectors(shape, args.rows, dim, 42, 0);
    let schema = table.schema();
    let batches: Arc<Vec<RecordBatch>> = Arc::new(
        (0..args.rows)
            .step_by(args.put_rows)
            .map(|start| {
                let n = args.put_rows.min(args.rows - start);
                let ids = Int64Array::from_iter_values(start as i64..(start + n) as i64);
                let emb = to_array(&data[start * dim..(start + n) * dim], dim);
                RecordBatch::try_new(Arc::clone(&schema), vec![Arc::new(ids), Arc::new(emb)])
                    .unwrap()
            })
            .collect(),
    );

    let next = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let workers: Vec<_> = (0..args.window)
        .map(|_| {
            let (table, batches, next) =
                (Arc::clone(&table), Arc::clone(&batches), Arc::clone(&next));
            tokio::spawn(async move {
                let mut latencies = Vec::new();
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(b) = batches.get(i) else {
                        return latencies;
                    };
                    let at = Instant::now();
                    table.put(b).await.unwrap();
                    latencies.push(at.elapsed().as_secs_f64() * 1e3);
                }
            })
        })
        .collect();
    let mut latencies = Vec::new();
    for w in workers {
        latencies.extend(w.await.unwrap());
    }
    let write_seconds = started.elapsed().as_secs_f64();
    latencies.sort_by(f64::total_cmp);
    let stats = table.writer(0).await.unwrap().stats();

    // Searches right after the writes, over whatever layers there are.
    let queries = vectors(shape, args.queries, dim, 42, 1);
    let truth = exact_neighbours(&data, &queries, dim, 10, distance::l2);
    let mut found = Vec::new();
    let search_started = Instant::now();
    for q in queries.chunks(dim) {
        let list = q
            .iter()
            .map(|x| format!("{x}"))
            .collect::<Vec<_>>()
            .join(",");
        let sql = format!("SELECT id FROM vector_search('vec', 'emb', [{list}], 10)");
        let batches = session.sql(&sql).await.unwrap().collect().await.unwrap();
        found.push(
            batches
                .iter()
                .flat_map(|b| b.column(0).as_primitive::<Int64Type>().values().to_vec())
                .map(|id| id as u32)
                .collect::<Vec<_>>(),
        );
    }
    let search_seconds = search_started.elapsed().as_secs_f64();
    // The same queries through the Rust API (no SQL planning): over the
    // MemTables, then, after a restart, over the SSTables the close
    // flushed, through their persisted graphs.
    let (memtable_rate, _) = api_searches(&table, &queries, dim).await;
    table.close().await.unwrap();
    session.close().await.unwrap();
    let session = MemwalSession::open_with(&root, options).await.unwrap();
    let table = session.table("vec").await.unwrap();
    let load = Instant::now();
    let first = &queries[..dim];
    api_searches(&table, first, dim).await;
    let load_ms = load.elapsed().as_secs_f64() * 1e3;
    let (sstable_rate, sstable_found) = api_searches(&table, &queries, dim).await;
    table.close().await.unwrap();
    session.close().await.unwrap();
    let out = serde_json::json!({
        "rows": args.rows,
        "dim": dim,
        "put_rows": args.put_rows,
        "window": args.window,
        "rows_per_s": args.rows as f64 / write_seconds,
        "put_visible_ms_p50": percentile(&latencies, 0.5),
        "put_visible_ms_p99": percentile(&latencies, 0.99),
        "put_visible_ms_max": latencies.last().copied().unwrap_or(0.0),
        "flushes_during_writes": stats.flushes,
        "sql_searches_per_s": args.queries as f64 / search_seconds,
        "recall_at_10_ef_64": recall(&found, &truth),
        "api_searches_per_s_memtables": memtable_rate,
        "sstable_first_search_ms": load_ms,
        "api_searches_per_s_sstables": sstable_rate,
        "recall_at_10_ef_64_sstables": recall(&sstable_found, &truth),
    });
    println!("{out}");
}
