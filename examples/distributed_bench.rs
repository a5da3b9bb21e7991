//! Queries across worker processes: a table of `--rows` rows (`id` key,
//! `g` = id % 1000, `v` = id / 2) in `--shards` shards on a local
//! directory, loaded by one `INSERT ... SELECT`; then, in turn for
//! `--runs` rounds, each query in one process (`local`, no workers) and
//! across 1, 2 and 4 `memwal worker` processes on 127.0.0.1 (the
//! coordinator is this process). The queries:
//!
//! - `aggregate`: a full scan grouped by `g % 10`;
//! - `key_range`: 10,000 consecutive keys (the scan reads only the pages
//!   that can hold them);
//! - `filter`: a full scan keeping 0.1 % of the rows (`g = 7`);
//! - `aggregate_memtable`: `aggregate` again after `--memtable-rows`
//!   upserts that live only in this process's MemTables, so every task
//!   of a distributed scan carries them (Arrow IPC).
//!
//! Prints one JSON object: per query and mode, milliseconds (median, min,
//! max over the runs) and the ratio of each mode's median to `local`.
//! Needs the release `memwal` binary next to the example's directory (or
//! `--memwal PATH`):
//!
//! ```text
//! cargo build --release --bin memwal && cargo run --release --example distributed_bench
//! ```

use std::path::PathBuf;
use std::time::Instant;

use clap::Parser;
use memwal::MemwalSession;
use memwal::testing::WorkerProcess;

#[derive(Debug, Parser)]
struct Args {
    #[arg(long, default_value_t = 10_000_000)]
    rows: u64,
    #[arg(long, default_value_t = 8)]
    shards: u32,
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Upserts put through this process's MemTables for the last query.
    #[arg(long, default_value_t = 100_000)]
    memtable_rows: u64,
    /// Worker counts to compare with one process.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4")]
    workers: Vec<usize>,
    /// The `memwal` binary the workers run (default: the release build
    /// next to this example's directory).
    #[arg(long)]
    memwal: Option<PathBuf>,
    /// Where the table is (a fresh temporary directory by default).
    #[arg(long)]
    dir: Option<String>,
}

async fn run(session: &MemwalSession, sql: &str) -> usize {
    let batches = session.sql(sql).await.unwrap().collect().await.unwrap();
    batches.iter().map(|b| b.num_rows()).sum()
}

/// Milliseconds: median, min, max.
fn summary(ms: &mut [f64]) -> serde_json::Value {
    ms.sort_by(f64::total_cmp);
    let round = |x: f64| (x * 10.0).round() / 10.0;
    serde_json::json!({
        "ms_median": round(ms[ms.len() / 2]),
        "ms_min": round(ms[0]),
        "ms_max": round(ms[ms.len() - 1]),
    })
}

/// `sql` in every mode, in turn: a warm-up round, then `runs` timed
/// rounds. Every mode must return as many rows.
async fn measure(
    name: &str,
    sql: &str,
    modes: &[(String, MemwalSession)],
    runs: usize,
) -> serde_json::Value {
    let mut by_mode: Vec<Vec<f64>> = vec![Vec::new(); modes.len()];
    let mut rows = Vec::new();
    for round in 0..=runs {
        for (m, (_, session)) in modes.iter().enumerate() {
            let started = Instant::now();
            rows.push(run(session, sql).await);
            if round > 0 {
                by_mode[m].push(started.elapsed().as_secs_f64() * 1e3);
            }
        }
    }
    assert!(rows.windows(2).all(|w| w[0] == w[1]), "{name}: {rows:?}");
    let mut out = serde_json::Map::new();
    let mut local_median = None;
    for ((mode, _), ms) in modes.iter().zip(&mut by_mode) {
        let mut figures = summary(ms);
        let median = figures["ms_median"].as_f64().unwrap();
        let local = *local_median.get_or_insert(median);
        figures["over_local"] = ((median / local * 100.0).round() / 100.0).into();
        out.insert(mode.clone(), figures);
    }
    serde_json::Value::Object(out)
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    let memwal = args.memwal.clone().unwrap_or_else(|| {
        let exe = std::env::current_exe().unwrap();
        exe.parent().unwrap().parent().unwrap().join("memwal")
    });
    let dir = match &args.dir {
        Some(dir) => {
            std::fs::create_dir_all(dir).unwrap();
            tempfile::tempdir_in(dir).unwrap()
        }
        None => tempfile::tempdir().unwrap(),
    };
    let root = dir.path().to_str().unwrap().to_string();

    let local = MemwalSession::open(&root).await.unwrap();
    let create = format!(
        "CREATE TABLE t (id BIGINT PRIMARY KEY, g BIGINT, v DOUBLE) WITH ('shards' = '{}')",
        args.shards
    );
    run(&local, &create).await;
    let started = Instant::now();
    let load = format!(
        "INSERT INTO t SELECT value, value % 1000, value / 2.0 FROM generate_series(0, {})",
        args.rows - 1
    );
    run(&local, &load).await;
    let load_s = started.elapsed().as_secs_f64();

    let most = args.workers.iter().copied().max().unwrap_or(0);
    let workers: Vec<WorkerProcess> = (0..most)
        .map(|_| WorkerProcess::start(&memwal, &root))
        .collect();
    let mut modes = vec![("local".to_string(), local)];
    for &n in &args.workers {
        let urls = workers[..n].iter().map(|w| w.url.clone()).collect();
        let session = MemwalSession::builder(&root).workers(urls);
        modes.push((format!("workers_{n}"), session.open().await.unwrap()));
    }

    let from = args.rows / 2;
    let queries = [
        (
            "aggregate",
            "SELECT g % 10 AS b, count(*), sum(v), avg(id) FROM t GROUP BY b ORDER BY b"
                .to_string(),
        ),
        (
            "key_range",
            format!(
                "SELECT count(*), sum(v) FROM t WHERE id BETWEEN {from} AND {}",
                from + 9_999
            ),
        ),
        ("filter", "SELECT id, v FROM t WHERE g = 7".to_string()),
    ];
    let mut times = serde_json::Map::new();
    for (name, sql) in &queries {
        let figures = measure(name, sql, &modes, args.runs).await;
        times.insert(name.to_string(), figures);
    }
    if args.memtable_rows > 0 {
        let upsert = format!(
            "INSERT INTO t SELECT value, value % 1000, -1.0 FROM generate_series(0, {})",
            args.memtable_rows - 1
        );
        run(&modes[0].1, &upsert).await;
        let figures = measure("aggregate_memtable", &queries[0].1, &modes, args.runs).await;
        times.insert("aggregate_memtable".to_string(), figures);
    }
    let report = serde_json::json!({
        "bench": "distributed_queries",
        "rows": args.rows,
        "shards": args.shards,
        "runs": args.runs,
        "memtable_rows": args.memtable_rows,
        "load_s": (load_s * 10.0).round() / 10.0,
        "cores": std::thread::available_parallelism().map_or(1, |n| n.get()),
        "queries": times,
    });
    println!("{}", serde_json::to_string_pretty(&report).unwrap());
    drop(workers);
}
