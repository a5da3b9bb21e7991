//! Bulk load: one `INSERT INTO t SELECT ...` of `--rows` rows (an `id`
//! key and a ~90-character string, ~100 bytes of Arrow a row) into a
//! memwal table of `--shards` shards on a local directory, against
//! DataFusion writing the same rows to Parquet
//! (`COPY (SELECT ...) TO 'x.parquet'`, DataFusion's defaults: parallel
//! single-file writer, zstd), and writing them as memwal's SSTables are
//! written (sorted by key, small pages with statistics, a bloom filter on
//! the key). Each engine runs `--runs` times, alternating;
//! every run starts on an empty directory. memwal's load is durable when
//! the statement returns: sorted, de-duplicated SSTables (bloom filters,
//! page index; LZ4, which the compaction after the load rewrites as zstd)
//! committed per shard; its peak memory is bounded by
//! `--load-memory-mib` (the default `load_memory_bytes`, 256 MiB). Prints
//! one JSON object: rows/s per engine (median, min, max), the CPU seconds
//! the process spent in each (median: all engines here are CPU-bound on
//! two cores) and the ratio of the medians.
//!
//! `--store s3-standard` (or `s3-express`) puts both engines' writes
//! behind the same latency model (`memwal::testing::LatencyStore`).
//!
//! ```text
//! cargo run --release --example bulk_bench -- --rows 10000000
//! cargo run --release --example bulk_bench -- --rows 2000000 --store s3-standard
//! ```

use std::sync::Arc;
use std::time::Instant;

use clap::Parser;
use datafusion::prelude::SessionContext;
use memwal::testing::{LatencyProfile, LatencyStore, bench_root, process_cpu_time};
use memwal::{Catalog, CatalogOptions, MemwalSession, WriterOptions};

#[derive(Debug, Parser)]
struct Args {
    #[arg(long, default_value_t = 10_000_000)]
    rows: u64,
    #[arg(long, default_value_t = 4)]
    shards: u32,
    #[arg(long, default_value_t = 3)]
    runs: usize,
    #[arg(long, default_value_t = 256)]
    load_memory_mib: usize,
    /// Where the runs write (a fresh temporary directory by default).
    #[arg(long)]
    dir: Option<String>,
    /// Runs only memwal's load (for profiling it); prints its figures alone.
    #[arg(long)]
    memwal_only: bool,
    /// `local`, or `s3-standard` / `s3-express`: the directory with the
    /// latency of that profile, for memwal and DataFusion alike.
    #[arg(long, default_value = "local")]
    store: String,
    /// Seed of the latency profile's draws.
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

/// The rows both engines write.
fn source(rows: u64) -> String {
    format!(
        "SELECT value AS id, concat(repeat('x', 84), CAST(value AS VARCHAR)) AS v \
         FROM generate_series(1, {rows})"
    )
}

/// Wall and CPU seconds of one run.
type Timed = (f64, f64);

async fn memwal_load(args: &Args, dir: &std::path::Path) -> Timed {
    let options = {
        let mut o = WriterOptions::default();
        o.load_memory_bytes = args.load_memory_mib << 20;
        o
    };
    let (root, latency) = bench_root(&args.store, dir, args.seed).unwrap();
    let catalog = Catalog::open(root, CatalogOptions::default())
        .await
        .unwrap();
    let session = MemwalSession::new(catalog, options);
    session
        .sql(&format!(
            "CREATE TABLE t (id BIGINT PRIMARY KEY, v VARCHAR NOT NULL) WITH ('shards' = '{}')",
            args.shards
        ))
        .await
        .unwrap();
    let (started, cpu) = (Instant::now(), process_cpu_time());
    let out = session
        .sql(&format!("INSERT INTO t {}", source(args.rows)))
        .await
        .unwrap()
        .collect()
        .await
        .unwrap();
    let timed = (
        started.elapsed().as_secs_f64(),
        (process_cpu_time() - cpu).as_secs_f64(),
    );
    if let Some(latency) = latency {
        // Where the load waited: the requests of each kind it made.
        for (kind, c) in latency.counts() {
            eprintln!(
                "memwal load, {kind:?}: {} requests, {:.1} MB, {:.2} s waited in all",
                c.requests,
                c.bytes as f64 / 1e6,
                c.waited.as_secs_f64()
            );
        }
    }
    let count = datafusion::arrow::array::AsArray::as_primitive::<
        datafusion::arrow::datatypes::UInt64Type,
    >(out[0].column(0))
    .value(0);
    assert_eq!(count, args.rows);
    session.close().await.unwrap();
    timed
}

/// DataFusion writing the rows to one Parquet file: with its defaults, or
/// (`like_sstables`) sorted by key with the Parquet settings of memwal's
/// SSTables (zstd(3), 1,024-row pages with page statistics, 64 Ki-row row
/// groups, a bloom filter on the key), as an SSTable of one shard is.
async fn datafusion_write(args: &Args, dir: &std::path::Path, like_sstables: bool) -> Timed {
    let ctx = SessionContext::new();
    let file = match LatencyProfile::named(&args.store) {
        None => dir.join("rows.parquet").display().to_string(),
        // The same directory behind the same latency model as memwal's.
        Some(profile) => {
            let local = object_store::local::LocalFileSystem::new_with_prefix(dir).unwrap();
            let store = LatencyStore::new(Arc::new(local), profile, args.seed);
            ctx.register_object_store(&url::Url::parse("bench://store/").unwrap(), store);
            "bench://store/rows.parquet".to_string()
        }
    };
    let (order, options) = match like_sstables {
        false => ("", ""),
        true => (
            " ORDER BY id",
            " OPTIONS ('format.compression' 'zstd(3)', \
             'format.data_page_row_count_limit' '1024', \
             'format.statistics_enabled' 'page', \
             'format.max_row_group_size' '65536', \
             'format.bloom_filter_enabled::id' 'true')",
        ),
    };
    let (started, cpu) = (Instant::now(), process_cpu_time());
    ctx.sql(&format!(
        "COPY ({}{order}) TO '{}' STORED AS PARQUET{options}",
        source(args.rows),
        file
    ))
    .await
    .unwrap()
    .collect()
    .await
    .unwrap();
    (
        started.elapsed().as_secs_f64(),
        (process_cpu_time() - cpu).as_secs_f64(),
    )
}

/// Median, min and max of rows/s over the runs, and their median CPU seconds.
fn summary(rows: u64, runs: &[Timed]) -> serde_json::Value {
    let mut rates: Vec<f64> = runs.iter().map(|(s, _)| rows as f64 / s).collect();
    rates.sort_by(f64::total_cmp);
    let mut cpu: Vec<f64> = runs.iter().map(|&(_, c)| c).collect();
    cpu.sort_by(f64::total_cmp);
    serde_json::json!({
        "rows_per_s_median": rates[rates.len() / 2].round(),
        "rows_per_s_min": rates[0].round(),
        "rows_per_s_max": rates[rates.len() - 1].round(),
        "cpu_s_median": (cpu[cpu.len() / 2] * 100.0).round() / 100.0,
    })
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    assert!(
        args.store == "local" || LatencyProfile::named(&args.store).is_some(),
        "--store takes local, s3-standard or s3-express"
    );
    let base = match &args.dir {
        Some(dir) => {
            std::fs::create_dir_all(dir).unwrap();
            tempfile::tempdir_in(dir).unwrap()
        }
        None => tempfile::tempdir().unwrap(),
    };
    let (mut memwal, mut datafusion, mut sorted) = (Vec::new(), Vec::new(), Vec::new());
    for run in 0..args.runs {
        let dir = base.path().join(format!("memwal-{run}"));
        std::fs::create_dir_all(&dir).unwrap();
        memwal.push(memwal_load(&args, &dir).await);
        std::fs::remove_dir_all(&dir).unwrap();
        if args.memwal_only {
            continue;
        }
        let dir = base.path().join(format!("datafusion-{run}"));
        std::fs::create_dir_all(&dir).unwrap();
        datafusion.push(datafusion_write(&args, &dir, false).await);
        std::fs::remove_dir_all(&dir).unwrap();
        let dir = base.path().join(format!("datafusion-sorted-{run}"));
        std::fs::create_dir_all(&dir).unwrap();
        sorted.push(datafusion_write(&args, &dir, true).await);
        std::fs::remove_dir_all(&dir).unwrap();
    }
    if args.memwal_only {
        println!("{}", summary(args.rows, &memwal));
        return;
    }
    let (m, d, o) = (
        summary(args.rows, &memwal),
        summary(args.rows, &datafusion),
        summary(args.rows, &sorted),
    );
    let median = |v: &serde_json::Value| v["rows_per_s_median"].as_f64().unwrap();
    let ratio = |a: &serde_json::Value, b: &serde_json::Value| {
        (median(a) / median(b) * 100.0).round() / 100.0
    };
    let report = serde_json::json!({
        "bench": "bulk_load",
        "store": args.store,
        "seed": args.seed,
        "rows": args.rows,
        "shards": args.shards,
        "runs": args.runs,
        "load_memory_mib": args.load_memory_mib,
        "memwal_insert_select": m,
        "datafusion_copy_to_parquet": d,
        "datafusion_copy_sorted_like_sstables": o,
        "memwal_over_datafusion": ratio(&m, &d),
        "memwal_over_datafusion_sorted_like_sstables": ratio(&m, &o),
    });
    println!("{report}");
}
