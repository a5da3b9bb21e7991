//! Lance's shard-writer workload on one shard of a `--store` (a local
//! directory, or it behind the latency of `s3-standard` / `s3-express`):
//! rows of the FineWeb shape (`id BIGINT PRIMARY KEY, text STRING, emb
//! FLOAT[1024]`, about 1.6 KiB of text a row, ≈ 5,760 B) or the vector-only
//! shape (`id`, `emb`: ≈ 4,104 B), every vector inserted into the
//! MemTable's HNSW graph, every put durable (a put is acknowledged once its
//! rows are in the WAL and indexed, i.e. visible to `vector_search`).
//!
//! Puts of `--batch` rows are issued at `--rate` rows/s (each on its
//! schedule whether or not earlier ones were acknowledged, so a writer that
//! falls behind shows it as a growing queue rather than a slower issuer),
//! or, with `--rate 0`, as fast as `--window` puts in flight allow. Every
//! 10 ms the bench samples the WAL queue (rows accepted into the MemTable
//! and not yet in the WAL) and the rows issued and not yet acknowledged
//! (WAL and index both). It reports achieved rows/s and MB/s (of the rows'
//! Arrow bytes), put latency from each put's scheduled time to its
//! acknowledgement, both queues at the end of the issuing and at their
//! maximum (in rows, in seconds of the target rate, and as a share of the
//! rows the run writes), and the process CPU time per row. Prints one JSON
//! object.
//!
//! ```text
//! cargo run --release --example shard_writer_bench -- --rate 4000 --seconds 30
//! cargo run --release --example shard_writer_bench -- --rate 0 --rows 50000
//! cargo run --release --example shard_writer_bench -- --store s3-standard --batch 1000
//! ```

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use clap::{Parser, ValueEnum};
use datafusion::arrow::array::{ArrayRef, Int64Array, RecordBatch, StringViewArray};
use datafusion::arrow::datatypes::SchemaRef;
use memwal::testing::bench_root;
use memwal::testing::dataset::{Shape, to_array, vectors};
use memwal::{Catalog, CatalogOptions, MemwalSession, WriterOptions};
use rand::{Rng, SeedableRng};
use tokio::sync::Semaphore;

#[derive(Debug, Clone, Copy, PartialEq, ValueEnum)]
enum RowShape {
    /// `id`, about 1.5 KiB of text, a 1024-d vector.
    Fineweb,
    /// `id` and a 1024-d vector.
    Vector,
}

#[derive(Debug, Parser)]
struct Args {
    #[arg(long, value_enum, default_value = "fineweb")]
    shape: RowShape,
    /// Rows per put.
    #[arg(long, default_value_t = 100)]
    batch: usize,
    /// Target rows per second; 0 issues puts as fast as `--window` allows.
    #[arg(long, default_value_t = 4_000)]
    rate: u64,
    /// Length of a paced run (rows = rate × seconds).
    #[arg(long, default_value_t = 30)]
    seconds: u64,
    /// Rows of an unpaced run.
    #[arg(long, default_value_t = 50_000)]
    rows: usize,
    /// Puts in flight in an unpaced run.
    #[arg(long, default_value_t = 32)]
    window: usize,
    #[arg(long, default_value_t = 1024)]
    dim: usize,
    /// MemTable size threshold in MiB.
    #[arg(long, default_value_t = 64)]
    memtable_mb: usize,
    /// Directory for the root (a fresh subdirectory is made in it).
    #[arg(long, default_value = "target/shard-writer-bench")]
    dir: String,
    /// `local`, `s3-standard`, `s3-express` or a root URL.
    #[arg(long, default_value = "local")]
    store: String,
    /// Seed of the data and of the latency profile's draws.
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

/// Words the text column is made of: lower-case, 2–10 letters.
fn vocabulary(rng: &mut rand::rngs::StdRng) -> Vec<String> {
    (0..2_000)
        .map(|_| {
            let len = rng.random_range(2..=10);
            (0..len)
                .map(|_| (b'a' + rng.random_range(0..26u8)) as char)
                .collect()
        })
        .collect()
}

/// About 1.6 KiB of words (a FineWeb row is ≈ 5,760 B with its vector).
fn text(rng: &mut rand::rngs::StdRng, words: &[String]) -> String {
    let mut s = String::with_capacity(1_664);
    while s.len() < 1_650 {
        if !s.is_empty() {
            s.push(' ');
        }
        s.push_str(&words[rng.random_range(0..words.len())]);
    }
    s
}

/// The run's puts, made before the clock starts: `rows` rows in puts of
/// `batch`, clustered vectors (100 centres), ids in order.
fn make_puts(args: &Args, rows: usize, schema: SchemaRef) -> Vec<RecordBatch> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(args.seed);
    let words = vocabulary(&mut rng);
    let shape = Shape::Clustered {
        clusters: 100,
        spread: 0.5,
    };
    (0..rows)
        .step_by(args.batch)
        .enumerate()
        .map(|(i, start)| {
            let n = args.batch.min(rows - start);
            let data = vectors(shape, n, args.dim, args.seed, i as u64);
            let mut columns: Vec<ArrayRef> = vec![Arc::new(Int64Array::from_iter_values(
                start as i64..(start + n) as i64,
            ))];
            if args.shape == RowShape::Fineweb {
                let texts: Vec<String> = (0..n).map(|_| text(&mut rng, &words)).collect();
                columns.push(Arc::new(StringViewArray::from(texts)));
            }
            columns.push(Arc::new(to_array(&data, args.dim)));
            RecordBatch::try_new(Arc::clone(&schema), columns).unwrap()
        })
        .collect()
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// The largest value of each queue seen by the sampler, and how often it
/// sampled.
#[derive(Default)]
struct Peaks {
    wal_rows: AtomicU64,
    unacked_rows: AtomicU64,
    frozen_memtables: AtomicU64,
    samples: AtomicU64,
}

#[tokio::main]
async fn main() {
    let _ = env_logger::try_init();
    let args = Args::parse();
    let paced = args.rate > 0;
    let rows = match paced {
        true => (args.rate * args.seconds) as usize,
        false => args.rows,
    };
    std::fs::create_dir_all(&args.dir).unwrap();
    let dir = tempfile::tempdir_in(&args.dir).unwrap();
    let (root, latency) = bench_root(&args.store, dir.path(), args.seed).unwrap();
    let options = {
        let mut o = WriterOptions::default();
        o.memtable_bytes = args.memtable_mb << 20;
        o
    };
    let catalog = Catalog::open(root.clone(), CatalogOptions::default())
        .await
        .unwrap();
    let session = MemwalSession::new(catalog, options.clone());
    let text_column = match args.shape {
        RowShape::Fineweb => "text STRING, ",
        RowShape::Vector => "",
    };
    session
        .sql(&format!(
            "CREATE TABLE docs (id BIGINT PRIMARY KEY, {text_column}emb FLOAT[{}])",
            args.dim
        ))
        .await
        .unwrap()
        .collect()
        .await
        .unwrap();
    let table = session.table("docs").await.unwrap();
    let writer = table.writer(0).await.unwrap();
    let puts = make_puts(&args, rows, table.schema());
    let bytes: usize = puts.iter().map(|b| b.get_array_memory_size()).sum();

    let issued = Arc::new(AtomicU64::new(0));
    let acked = Arc::new(AtomicU64::new(0));
    let peaks = Arc::new(Peaks::default());
    let issuing = Arc::new(AtomicBool::new(true));
    let sampler = {
        let (writer, issued, acked, peaks, issuing) = (
            Arc::clone(&writer),
            Arc::clone(&issued),
            Arc::clone(&acked),
            Arc::clone(&peaks),
            Arc::clone(&issuing),
        );
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(10));
            while issuing.load(Ordering::Relaxed) {
                tick.tick().await;
                let stats = writer.stats();
                let unacked = issued.load(Ordering::Relaxed) - acked.load(Ordering::Relaxed);
                peaks
                    .wal_rows
                    .fetch_max(stats.pending_rows, Ordering::Relaxed);
                peaks.unacked_rows.fetch_max(unacked, Ordering::Relaxed);
                peaks
                    .frozen_memtables
                    .fetch_max(stats.frozen_memtables, Ordering::Relaxed);
                peaks.samples.fetch_add(1, Ordering::Relaxed);
            }
        })
    };

    let window = Arc::new(Semaphore::new(match paced {
        true => Semaphore::MAX_PERMITS,
        false => args.window,
    }));
    let interval = Duration::from_secs_f64(args.batch as f64 / args.rate.max(1) as f64);
    let cpu_before = memwal::testing::process_cpu_time();
    let started = Instant::now();
    let mut waiters = Vec::with_capacity(puts.len());
    for (i, put) in puts.iter().enumerate() {
        let permit = Arc::clone(&window).acquire_owned().await.unwrap();
        let scheduled = match paced {
            true => {
                let at = started + interval * i as u32;
                tokio::time::sleep_until(at.into()).await;
                at
            }
            false => Instant::now(),
        };
        let n = put.num_rows() as u64;
        issued.fetch_add(n, Ordering::Relaxed);
        let durability = writer.put_nowait(std::slice::from_ref(put)).await.unwrap();
        let acked = Arc::clone(&acked);
        waiters.push(tokio::spawn(async move {
            durability.wait().await.unwrap();
            acked.fetch_add(n, Ordering::Relaxed);
            drop(permit);
            scheduled.elapsed().as_secs_f64() * 1e3
        }));
    }
    let issue_seconds = started.elapsed().as_secs_f64();
    let at_end = writer.stats();
    let final_unacked = issued.load(Ordering::Relaxed) - acked.load(Ordering::Relaxed);
    let mut latencies = Vec::with_capacity(waiters.len());
    for w in waiters {
        latencies.push(w.await.unwrap());
    }
    let write_seconds = started.elapsed().as_secs_f64();
    let cpu_seconds = (memwal::testing::process_cpu_time() - cpu_before).as_secs_f64();
    issuing.store(false, Ordering::Relaxed);
    sampler.await.unwrap();
    latencies.sort_by(f64::total_cmp);
    let stats = writer.stats();
    let close_started = Instant::now();
    table.close().await.unwrap();
    let close_seconds = close_started.elapsed().as_secs_f64();
    let after_close = writer.stats();

    // Queues in rows, in seconds of the target rate, and as a share of the
    // rows the run writes.
    let target = if paced { args.rate as f64 } else { f64::NAN };
    let queue = |rows_queued: u64| {
        serde_json::json!({
            "rows": rows_queued,
            "seconds_of_target": rows_queued as f64 / target,
            "share_of_run": rows_queued as f64 / rows as f64,
        })
    };
    let report = serde_json::json!({
        "system": "memwal",
        "debug_assertions": cfg!(debug_assertions),
        "settings": format!(
            "memtable {} MiB; HNSW M=16, ef_construction=100 (defaults); durable; \
             WAL interval 100 ms (default); all else default",
            args.memtable_mb
        ),
        "shape": format!("{:?}", args.shape).to_lowercase(),
        "store": args.store,
        "store_profile": latency.as_ref().map(|l| format!("{:?}", l.profile())),
        "seed": args.seed,
        "dim": args.dim,
        "rows": rows,
        "batch": args.batch,
        "target_rows_per_s": paced.then_some(args.rate),
        "window": (!paced).then_some(args.window),
        "row_bytes": bytes as f64 / rows as f64,
        "issue_seconds": issue_seconds,
        "write_seconds": write_seconds,
        "rows_per_s": rows as f64 / write_seconds,
        "mb_per_s": bytes as f64 / 1e6 / write_seconds,
        "put_ms_p50": percentile(&latencies, 0.5),
        "put_ms_p99": percentile(&latencies, 0.99),
        "put_ms_max": latencies.last().copied().unwrap_or(0.0),
        "slow_puts_1s": latencies.iter().filter(|&&ms| ms >= 1e3).count(),
        "wal_queue_final": queue(at_end.pending_rows),
        "wal_queue_max": queue(peaks.wal_rows.load(Ordering::Relaxed)),
        "unacked_final": queue(final_unacked),
        "unacked_max": queue(peaks.unacked_rows.load(Ordering::Relaxed)),
        "queue_samples": peaks.samples.load(Ordering::Relaxed),
        "frozen_memtables_max": peaks.frozen_memtables.load(Ordering::Relaxed),
        "cpu_seconds": cpu_seconds,
        "rows_per_cpu_second": rows as f64 / cpu_seconds,
        "wal_appends": stats.wal_appends,
        "wal_bytes": stats.wal_bytes,
        "append_ms_p50": stats.append_latency_p50.as_secs_f64() * 1e3,
        "append_ms_p99": stats.append_latency_p99.as_secs_f64() * 1e3,
        "flushes": after_close.flushes,
        "close_seconds": close_seconds,
    });
    println!("{report}");
}
