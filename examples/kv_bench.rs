//! The seed's KV write protocol on one shard of a `--store` (a local
//! directory; the same behind the latency of `s3-standard` or `s3-express`,
//! see `memwal::testing::LatencyProfile`; or a root URL): `--rows`
//! rows of the PEERS.md KV schema (`id` key + int64, int32, float64, a
//! 72-character string) in `--put-rows`-row puts, `--window` puts in flight
//! (each awaiting durability), WAL interval `--interval-ms` (0: latency
//! mode), durable unless `--non-durable`; integer or 16-byte UUID keys;
//! MemTables of `--memtable-mb`, compaction above `--max-sstables`.
//! Writes run with flushes and compactions in the background; the table is
//! then closed (everything flushed, WAL entries deleted) and reopened, and
//! the read phase measures bytes on disk per row, point reads through the
//! Rust API and through SQL (served from SSTables), and a full-table
//! `count(*), sum(a)` through memwal against DataFusion reading the same
//! SSTable files as a plain Parquet listing table — over the SSTables as
//! flushed, then again after a major compaction (on a local store only).
//! Under a latency profile it also prints the requests, bytes and delays
//! of each kind. Prints one JSON object.
//!
//! ```text
//! cargo run --example kv_bench -- --keys int --window 32
//! cargo run --release --example kv_bench -- --store s3-standard --rows 100000
//! ```

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use clap::{Parser, ValueEnum};
use datafusion::arrow::array::{
    ArrayRef, FixedSizeBinaryArray, Float64Array, Int32Array, Int64Array, RecordBatch, StringArray,
};
use memwal::testing::{LatencyStore, bench_root};
use memwal::{Catalog, CatalogOptions, MemwalSession, ObjectRoot, Table, WriterOptions};
use object_store::ObjectStore;
use rand::{Rng, SeedableRng};

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Keys {
    Int,
    Uuid,
}

#[derive(Debug, Parser)]
struct Args {
    #[arg(long, value_enum, default_value = "int")]
    keys: Keys,
    #[arg(long, default_value_t = 1_000_000)]
    rows: usize,
    #[arg(long, default_value_t = 1_000)]
    put_rows: usize,
    #[arg(long, default_value_t = 32)]
    window: usize,
    #[arg(long, default_value_t = 100)]
    interval_ms: u64,
    #[arg(long)]
    non_durable: bool,
    /// Point reads through the Rust API (and a tenth of that through SQL).
    #[arg(long, default_value_t = 10_000)]
    reads: usize,
    /// MemTable size threshold in MiB.
    #[arg(long, default_value_t = 64)]
    memtable_mb: usize,
    /// Compaction keeps at most this many SSTables per shard.
    #[arg(long, default_value_t = 8)]
    max_sstables: usize,
    /// Full-table scans per engine in the read phase.
    #[arg(long, default_value_t = 5)]
    scans: usize,
    /// Directory for the root (a fresh subdirectory is made in it).
    #[arg(long, default_value = "target/kv-bench")]
    dir: String,
    /// `local` (that directory), `s3-standard` or `s3-express` (that
    /// directory with the latency of the profile), or a root URL.
    #[arg(long, default_value = "local")]
    store: String,
    /// Seed of the latency profile's draws.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Any other writer option, as the shell's `--option NAME=VALUE`
    /// (repeatable; named in the JSON's settings).
    #[arg(long = "option", value_name = "NAME=VALUE")]
    options: Vec<String>,
}

const STRING_LEN: usize = 72;

fn key_array(keys: Keys, ids: &[u64]) -> ArrayRef {
    match keys {
        Keys::Int => Arc::new(Int64Array::from_iter_values(ids.iter().map(|&i| i as i64))),
        Keys::Uuid => {
            Arc::new(FixedSizeBinaryArray::try_from_iter(ids.iter().map(|&i| uuid_of(i))).unwrap())
        }
    }
}

/// A random-looking (v4-shaped) UUID derived from the row number, so reads
/// can name keys that were written.
fn uuid_of(i: u64) -> [u8; 16] {
    let mut rng = rand::rngs::StdRng::seed_from_u64(i);
    let mut b: [u8; 16] = rng.random();
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    b
}

fn batch(table: &Table, keys: Keys, ids: &[u64]) -> RecordBatch {
    let n = ids.len();
    let text: String = "x".repeat(STRING_LEN);
    RecordBatch::try_new(
        table.schema(),
        vec![
            key_array(keys, ids),
            Arc::new(Int64Array::from_iter_values(
                ids.iter().map(|&i| i as i64 * 7),
            )),
            Arc::new(Int32Array::from_iter_values(ids.iter().map(|&i| i as i32))),
            Arc::new(Float64Array::from_iter_values(
                ids.iter().map(|&i| i as f64 * 0.5),
            )),
            Arc::new(StringArray::from(vec![text.as_str(); n])),
        ],
    )
    .unwrap()
}

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i].as_secs_f64() * 1e3
}

/// Bytes and objects under the root.
async fn stored_bytes_and_objects(store: &dyn ObjectStore) -> (u64, u64) {
    use futures::TryStreamExt;
    let objects: Vec<_> = store.list(None).try_collect().await.unwrap();
    (objects.iter().map(|o| o.size).sum(), objects.len() as u64)
}

async fn open_session(root: &ObjectRoot, options: &WriterOptions) -> MemwalSession {
    let catalog = Catalog::open(root.clone(), CatalogOptions::default())
        .await
        .unwrap();
    MemwalSession::new(catalog, options.clone())
}

/// The requests, bytes and delays of each kind the latency store counted.
fn requests(latency: &Option<Arc<LatencyStore>>) -> serde_json::Value {
    let Some(latency) = latency else {
        return serde_json::Value::Null;
    };
    let counts = latency.counts().into_iter().map(|(kind, c)| {
        let kind = format!("{kind:?}").to_lowercase();
        (
            kind,
            serde_json::json!({
                "requests": c.requests,
                "bytes": c.bytes,
                "waited_ms": c.waited.as_secs_f64() * 1e3,
            }),
        )
    });
    serde_json::Value::Object(counts.collect())
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    let _ = env_logger::Builder::from_default_env()
        .format_timestamp_millis()
        .try_init();
    std::fs::create_dir_all(&args.dir).unwrap();
    let dir = tempfile::tempdir_in(&args.dir).unwrap();
    let (root, latency) = bench_root(&args.store, dir.path(), args.seed).unwrap();
    let options = {
        let mut o = WriterOptions::default();
        o.durable = !args.non_durable;
        o.wal_flush_interval = Duration::from_millis(args.interval_ms);
        o.memtable_bytes = args.memtable_mb << 20;
        o.max_sstables = args.max_sstables;
        // Nothing reads while the bench writes: compaction inputs go at
        // once, so the bytes on disk are the live ones.
        o.sstable_grace = Duration::ZERO;
        for option in &args.options {
            let (name, value) = option.split_once('=').expect("--option takes NAME=VALUE");
            o.set(name, value).unwrap();
        }
        o
    };
    let session = open_session(&root, &options).await;
    let table = create_table(&session, args.keys).await;

    // Every batch is made before the clock starts.
    let batches: Arc<Vec<RecordBatch>> = Arc::new(
        (0..args.rows as u64)
            .collect::<Vec<_>>()
            .chunks(args.put_rows)
            .map(|ids| batch(&table, args.keys, ids))
            .collect(),
    );
    // The writer opens (claims the shard, fences, replays) before the
    // clock starts, as the peers open their databases first.
    table.writer(0).await.unwrap();
    let next = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let workers: Vec<_> = (0..args.window)
        .map(|_| {
            let (table, batches, next) =
                (Arc::clone(&table), Arc::clone(&batches), Arc::clone(&next));
            tokio::spawn(async move {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(b) = batches.get(i) else { return };
                    table.put(b).await.unwrap();
                }
            })
        })
        .collect();
    for w in workers {
        w.await.unwrap();
    }
    let write_seconds = started.elapsed().as_secs_f64();
    let writer = table.writer(0).await.unwrap();
    let stats = writer.stats();
    table.close().await.unwrap();
    let close_seconds = started.elapsed().as_secs_f64();
    let after_close = writer.stats();
    let written = requests(&latency);
    let (disk_bytes, disk_files) = stored_bytes_and_objects(root.store().as_ref()).await;
    drop((session, table, writer));

    // Read phase: a fresh session on the closed table; the writer is
    // reopened (nothing to replay) so reads come from the SSTables.
    let session = open_session(&root, &options).await;
    let table = session.table("kv").await.unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(42);
    let pick = |rng: &mut rand::rngs::StdRng| rng.random_range(0..args.rows as u64);
    let key_schema = Arc::new(table.schema().project(&[0]).unwrap());
    let mut rust = Vec::with_capacity(args.reads);
    let reopened = table.writer(0).await.unwrap();
    let sstables = reopened.stats().sstables;
    for _ in 0..args.reads {
        let id = pick(&mut rng);
        let key = RecordBatch::try_new(Arc::clone(&key_schema), vec![key_array(args.keys, &[id])])
            .unwrap();
        let t = Instant::now();
        let row = table.get(&key).await.unwrap();
        rust.push(t.elapsed());
        assert!(row.is_some(), "key {id} missing");
    }
    rust.sort_unstable();
    let mut sql = Vec::with_capacity(args.reads / 10 + 1);
    for _ in 0..(args.reads / 10).max(1) {
        let id = pick(&mut rng);
        let literal = match args.keys {
            Keys::Int => id.to_string(),
            Keys::Uuid => {
                let hex: String = uuid_of(id).iter().map(|b| format!("{b:02x}")).collect();
                format!("X'{hex}'")
            }
        };
        let t = Instant::now();
        let rows = session
            .sql(&format!("SELECT * FROM kv WHERE id = {literal}"))
            .await
            .unwrap()
            .collect()
            .await
            .unwrap();
        sql.push(t.elapsed());
        assert_eq!(rows.iter().map(|b| b.num_rows()).sum::<usize>(), 1);
    }
    sql.sort_unstable();
    // Plain Parquet reads the files from the directory, so scans are
    // compared on a local store only.
    let scan = |files: Arc<Vec<memwal::testing::SstableFile>>| {
        let local = args.store == "local";
        let (session, dir) = (&session, dir.path());
        async move {
            match local {
                true => Some(full_scans(session, dir, &files, args.rows, args.scans).await),
                false => None,
            }
        }
    };
    let (memwal_scan, plain_scan) = scan(reopened.snapshot().sstables).await.unzip();
    // A major compaction leaves one SSTable: scans read it with no merge.
    let t = Instant::now();
    table.compact().await.unwrap();
    let compact_seconds = t.elapsed().as_secs_f64();
    let (memwal_compacted, plain_compacted) = scan(reopened.snapshot().sstables).await.unzip();
    let (compacted_bytes, compacted_files) = stored_bytes_and_objects(root.store().as_ref()).await;
    let ms = |s: Option<f64>| s.map(|s| s * 1e3);
    let ratio = |plain: Option<f64>, ours: Option<f64>| Some(plain? / ours?);
    let report = serde_json::json!({
        "system": "memwal",
        "debug_assertions": cfg!(debug_assertions),
        "settings": format!(
            "sstable_grace = 0 (compaction inputs deleted at once); memtable {} MiB; \
             compaction above {} SSTables; {}all else default",
            args.memtable_mb,
            args.max_sstables,
            args.options.iter().map(|o| format!("{o}; ")).collect::<String>()
        ),
        "keys": format!("{:?}", args.keys).to_lowercase(),
        "store": args.store,
        "store_profile": latency.as_ref().map(|l| format!("{:?}", l.profile())),
        "seed": args.seed,
        "requests_until_close": written,
        "requests_in_all": requests(&latency),
        "rows": args.rows,
        "put_rows": args.put_rows,
        "window": args.window,
        "wal_interval_ms": args.interval_ms,
        "durable": !args.non_durable,
        "write_seconds": write_seconds,
        "rows_per_s": args.rows as f64 / write_seconds,
        "rows_per_s_including_close": args.rows as f64 / close_seconds,
        "wal_appends": stats.wal_appends,
        "wal_bytes": stats.wal_bytes,
        "append_latency_avg_ms": stats.append_latency_total.as_secs_f64() * 1e3 / stats.wal_appends.max(1) as f64,
        "append_latency_max_ms": stats.append_latency_max.as_secs_f64() * 1e3,
        "flushes": after_close.flushes,
        "compactions": after_close.compactions,
        "sstables": sstables,
        "disk_files": disk_files,
        "disk_bytes": disk_bytes,
        "disk_bytes_per_row": disk_bytes as f64 / args.rows as f64,
        "full_scan_memwal_ms": ms(memwal_scan),
        "full_scan_plain_parquet_ms": ms(plain_scan),
        "full_scan_speed_vs_plain": ratio(plain_scan, memwal_scan),
        "major_compaction_seconds": compact_seconds,
        "compacted_disk_files": compacted_files,
        "compacted_disk_bytes_per_row": compacted_bytes as f64 / args.rows as f64,
        "compacted_full_scan_memwal_ms": ms(memwal_compacted),
        "compacted_full_scan_plain_parquet_ms": ms(plain_compacted),
        "compacted_full_scan_speed_vs_plain": ratio(plain_compacted, memwal_compacted),
        "rust_get_p50_ms": percentile(&rust, 0.5),
        "rust_get_p99_ms": percentile(&rust, 0.99),
        "sql_point_p50_ms": percentile(&sql, 0.5),
        "sql_point_p99_ms": percentile(&sql, 0.99),
    });
    println!("{report}");
}

/// The KV table `kv`, with an `Int64` or `FixedSizeBinary(16)` key.
async fn create_table(session: &MemwalSession, keys: Keys) -> Arc<Table> {
    use datafusion::arrow::datatypes::{DataType, Field, Schema};
    let key_type = match keys {
        Keys::Int => DataType::Int64,
        Keys::Uuid => DataType::FixedSizeBinary(16),
    };
    let schema = Schema::new(vec![
        Field::new("id", key_type, false),
        Field::new("a", DataType::Int64, true),
        Field::new("b", DataType::Int32, true),
        Field::new("c", DataType::Float64, true),
        Field::new("s", DataType::Utf8, true),
    ]);
    let meta = memwal::TableMeta::new(&schema, vec!["id".into()], &[]).unwrap();
    let path = memwal::ObjectPath::new(["kv"]).unwrap();
    session
        .catalog()
        .await
        .unwrap()
        .create_table(path, meta, false)
        .await
        .unwrap();
    session.table("kv").await.unwrap()
}

/// Median seconds of `count(*), sum(a)` over the whole table through memwal
/// and through DataFusion reading the table's SSTable files as a plain
/// Parquet listing table, alternating, `scans` times each.
async fn full_scans(
    session: &MemwalSession,
    root: &std::path::Path,
    files: &[memwal::testing::SstableFile],
    rows: usize,
    scans: usize,
) -> (f64, f64) {
    use datafusion::datasource::file_format::parquet::ParquetFormat;
    use datafusion::datasource::listing::{
        ListingOptions, ListingTable, ListingTableConfig, ListingTableUrl,
    };
    use datafusion::prelude::SessionContext;
    let plain = SessionContext::new();
    // Exactly the SSTables the manifest lists (not compaction inputs still
    // in their grace period).
    let urls = files
        .iter()
        .map(|f| ListingTableUrl::parse(root.join(&f.path).to_str().unwrap()).unwrap())
        .collect();
    let options = ListingOptions::new(Arc::new(ParquetFormat::default()));
    let config = ListingTableConfig::new_with_multi_paths(urls)
        .with_listing_options(options)
        .infer_schema(&plain.state())
        .await
        .unwrap();
    plain
        .register_table("kv", Arc::new(ListingTable::try_new(config).unwrap()))
        .unwrap();
    let query = "SELECT count(*), sum(a) FROM kv";
    let expected = (0..rows as i64).map(|i| i * 7).sum::<i64>();
    let (mut ours, mut theirs) = (Vec::new(), Vec::new());
    for _ in 0..scans.max(1) {
        for (engine, df, times) in [
            ("memwal", session.sql(query).await.unwrap(), &mut ours),
            ("plain", plain.sql(query).await.unwrap(), &mut theirs),
        ] {
            let t = Instant::now();
            let out = df.collect().await.unwrap();
            times.push(t.elapsed().as_secs_f64());
            let sum = out[0]
                .column(1)
                .as_any()
                .downcast_ref::<Int64Array>()
                .unwrap()
                .value(0);
            assert_eq!(sum, expected, "wrong full-scan result from {engine}");
        }
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    (median(&mut ours), median(&mut theirs))
}
