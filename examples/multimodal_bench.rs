//! Issue 15's multimodal workload on one shard of a `--store` (a local
//! directory, or the same behind the latency of `s3-standard` or
//! `s3-express`): `--rows` LAION-like rows (`id`, a 100-byte caption, a
//! 768-d embedding indexed by HNSW, an image of 20–100 KB of random size
//! and random bytes, stored as a blob column) in `--put-rows`-row puts,
//! `--window` puts in flight, each awaited until durable, WAL interval
//! `--interval-ms`. The table is then closed (everything flushed) and the
//! store's objects counted: persisted bytes over payload bytes (caption,
//! embedding and image bytes) is the write amplification. After a reopen,
//! `--reads` random rows are read back through the Rust API and checked
//! byte for byte, and a scan that does not select the image is timed and
//! its GETs counted.
//!
//! On a local store the same run also writes the same payload as plain
//! files through the same object store (each put's payload one file,
//! `--window` in flight; the median of `--plain-runs` after memwal's,
//! and one more before it that is not counted), the physical limit of
//! that disk for this pattern, and reports memwal's MB/s as a share of it: until the writes
//! return (the page cache's speed, for a payload that fits in it), and
//! until a `sync` after them returns (the disk's).
//!
//! The rows are those of the SlateDB peer's `--workload multimodal`
//! (benches/peers/slatedb): both derive them from the row number with
//! SplitMix64 ([`Row`]); keep the two in step. Prints one JSON object.
//!
//! ```text
//! cargo run --release --example multimodal_bench -- --window 32
//! cargo run --release --example multimodal_bench -- --store s3-standard --window 1 --rows 1000
//! ```

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use bytes::Bytes;
use clap::Parser;
use datafusion::arrow::array::{
    ArrayRef, AsArray, BinaryArray, FixedSizeListArray, Float32Array, Int64Array, RecordBatch,
    StringArray,
};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{DataType, Field};
use futures::TryStreamExt;
use memwal::testing::{FaultyStore, LatencyStore, OpKind, bench_root, process_cpu_time};
use memwal::{Catalog, CatalogOptions, MemwalSession, ObjectRoot, Table, WriterOptions};
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt};

#[derive(Debug, Parser)]
struct Args {
    #[arg(long, default_value_t = 5_000)]
    rows: usize,
    #[arg(long, default_value_t = 10)]
    put_rows: usize,
    #[arg(long, default_value_t = 32)]
    window: usize,
    #[arg(long, default_value_t = 100)]
    interval_ms: u64,
    /// Rows read back (and checked) after the reopen.
    #[arg(long, default_value_t = 200)]
    reads: usize,
    /// Directory for the root (a fresh subdirectory is made in it).
    #[arg(long, default_value = "target/multimodal-bench")]
    dir: String,
    /// `local`, `s3-standard` or `s3-express`.
    #[arg(long, default_value = "local")]
    store: String,
    /// `hnsw`: the embedding is a `FLOAT[768]` vector column, indexed as
    /// it is written; `bytes`: its 3,072 bytes in a `BYTEA` column, stored
    /// inline and not indexed (what the SlateDB peer stores).
    #[arg(long, value_enum, default_value = "hnsw")]
    embedding: Embedding,
    /// Runs of the plain-file write on a local store (their median is
    /// reported; 0 skips it).
    #[arg(long, default_value_t = 3)]
    plain_runs: usize,
    /// Seed of the latency profile's draws.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Any other writer option, as the shell's `--option NAME=VALUE`
    /// (repeatable; named in the JSON's settings).
    #[arg(long = "option", value_name = "NAME=VALUE")]
    options: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Embedding {
    Hnsw,
    Bytes,
}

const DIM: usize = 768;
const CAPTION: usize = 100;

/// SplitMix64: the generator both harnesses derive rows from.
fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Row `i` of the workload.
struct Row {
    caption: String,
    embedding: Vec<f32>,
    image: Vec<u8>,
}

impl Row {
    fn new(i: u64) -> Self {
        let mut s = i;
        let len = 20_000 + (splitmix(&mut s) % 80_001) as usize;
        let mut image = Vec::with_capacity(len + 8);
        while image.len() < len {
            image.extend_from_slice(&splitmix(&mut s).to_le_bytes());
        }
        image.truncate(len);
        let embedding = (0..DIM)
            .map(|_| (splitmix(&mut s) >> 40) as f32 / (1u64 << 24) as f32 - 0.5)
            .collect();
        let mut caption = format!("a synthetic photograph, number {i}, of a cat on a windowsill; ");
        caption.extend(std::iter::repeat_n(
            'x',
            CAPTION.saturating_sub(caption.len()),
        ));
        caption.truncate(CAPTION);
        Self {
            caption,
            embedding,
            image,
        }
    }

    fn embedding_bytes(&self) -> Vec<u8> {
        self.embedding
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect()
    }

    fn payload_bytes(&self) -> usize {
        self.caption.len() + 4 * self.embedding.len() + self.image.len()
    }
}

fn batch(table: &Table, embedding: Embedding, rows: &[(u64, Row)]) -> RecordBatch {
    let emb: ArrayRef = match embedding {
        Embedding::Hnsw => {
            let values = rows.iter().flat_map(|(_, r)| r.embedding.clone());
            let values = Arc::new(Float32Array::from_iter_values(values));
            let item = Arc::new(Field::new("item", DataType::Float32, true));
            Arc::new(FixedSizeListArray::new(item, DIM as i32, values, None))
        }
        Embedding::Bytes => Arc::new(BinaryArray::from_iter_values(
            rows.iter().map(|(_, r)| r.embedding_bytes()),
        )),
    };
    let schema = table.schema();
    let columns: [ArrayRef; 4] = [
        Arc::new(Int64Array::from_iter_values(
            rows.iter().map(|(i, _)| *i as i64),
        )),
        Arc::new(StringArray::from_iter_values(
            rows.iter().map(|(_, r)| r.caption.as_str()),
        )),
        emb,
        Arc::new(BinaryArray::from_iter_values(
            rows.iter().map(|(_, r)| r.image.as_slice()),
        )),
    ];
    // SQL's STRING and BYTEA may be view types: each column as the table has it.
    let columns = columns
        .iter()
        .zip(schema.fields())
        .map(|(c, f)| cast(c, f.data_type()).unwrap())
        .collect();
    RecordBatch::try_new(schema, columns).unwrap()
}

/// PUTs (multipart parts included) and GETs made so far.
#[derive(Clone)]
enum Counter {
    Local(Arc<FaultyStore>),
    Latency(Arc<LatencyStore>),
}

impl Counter {
    fn calls(&self, kind: OpKind) -> u64 {
        match self {
            Self::Local(s) => s.calls(kind),
            Self::Latency(s) => s.count(kind).requests,
        }
    }
}

async fn bytes_and_objects(store: &dyn ObjectStore) -> (u64, u64) {
    let objects: Vec<_> = store.list(None).try_collect().await.unwrap();
    (objects.iter().map(|o| o.size).sum(), objects.len() as u64)
}

fn sync_disk() {
    let _ = std::process::Command::new("sync").status();
}

/// Seconds to write `payloads` as one file each into a fresh directory
/// in `dir` after a sync, `window` in flight, and until a sync after
/// that returns.
async fn plain_files(dir: &str, payloads: &[Bytes], window: usize) -> (f64, f64) {
    let dir = tempfile::tempdir_in(dir).unwrap();
    let root = ObjectRoot::open(&dir.path().to_string_lossy()).unwrap();
    sync_disk();
    let started = Instant::now();
    write_plain_files(Arc::clone(root.store()), payloads, window).await;
    let written = started.elapsed().as_secs_f64();
    sync_disk();
    (written, started.elapsed().as_secs_f64())
}

/// Writes `payloads` as one object each under `plain/`, `window` in
/// flight.
async fn write_plain_files(store: Arc<dyn ObjectStore>, payloads: &[Bytes], window: usize) {
    let payloads = Arc::new(payloads.to_vec());
    in_window(window, payloads.len(), move |i| {
        let (store, payloads) = (Arc::clone(&store), Arc::clone(&payloads));
        async move {
            let path = Path::from(format!("plain/{i:08}"));
            store.put(&path, payloads[i].clone().into()).await.unwrap();
        }
    })
    .await;
}

/// Runs `work(0..n)`, `window` at a time: each of `window` tasks takes
/// the next number when its last one is done.
async fn in_window<F, Fut>(window: usize, n: usize, work: F)
where
    F: Fn(usize) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let (next, work) = (Arc::new(AtomicUsize::new(0)), Arc::new(work));
    let workers: Vec<_> = (0..window)
        .map(|_| {
            let (next, work) = (Arc::clone(&next), Arc::clone(&work));
            tokio::spawn(async move {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= n {
                        return;
                    }
                    work(i).await;
                }
            })
        })
        .collect();
    for w in workers {
        w.await.unwrap();
    }
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    let _ = env_logger::Builder::from_default_env()
        .format_timestamp_millis()
        .try_init();
    std::fs::create_dir_all(&args.dir).unwrap();
    let dir = tempfile::tempdir_in(&args.dir).unwrap();
    let (root, counter) = match bench_root(&args.store, dir.path(), args.seed).unwrap() {
        (root, Some(latency)) => (root, Counter::Latency(latency)),
        (root, None) => {
            let counted = FaultyStore::new(Arc::clone(root.store()));
            let url = root.url().to_string();
            (
                ObjectRoot::new(counted.clone(), url),
                Counter::Local(counted),
            )
        }
    };
    let options = {
        let mut o = WriterOptions::default();
        o.wal_flush_interval = std::time::Duration::from_millis(args.interval_ms);
        for option in &args.options {
            let (name, value) = option.split_once('=').expect("--option takes NAME=VALUE");
            o.set(name, value).unwrap();
        }
        o
    };
    let open = || async {
        let catalog = Catalog::open(root.clone(), CatalogOptions::default())
            .await
            .unwrap();
        MemwalSession::new(catalog, options.clone())
    };
    let session = open().await;
    let emb = match args.embedding {
        Embedding::Hnsw => format!("FLOAT[{DIM}]"),
        Embedding::Bytes => "BYTEA".into(),
    };
    session
        .sql(&format!(
            "CREATE TABLE items (id BIGINT PRIMARY KEY, caption STRING, emb {emb}, \
             image BYTEA) WITH ('image.blob' = 'true')"
        ))
        .await
        .unwrap()
        .collect()
        .await
        .unwrap();
    let table = session.table("items").await.unwrap();

    // Every batch is made before the clock starts.
    let (mut batches, mut payloads, mut payload_bytes) = (Vec::new(), Vec::new(), 0);
    for start in (0..args.rows).step_by(args.put_rows) {
        let rows: Vec<_> = (start..(start + args.put_rows).min(args.rows))
            .map(|i| (i as u64, Row::new(i as u64)))
            .collect();
        let mut payload = Vec::new();
        for (_, r) in &rows {
            payload_bytes += r.payload_bytes();
            payload.extend_from_slice(r.caption.as_bytes());
            payload.extend(r.embedding_bytes());
            payload.extend_from_slice(&r.image);
        }
        payloads.push(Bytes::from(payload));
        batches.push(batch(&table, args.embedding, &rows));
    }
    let batches = Arc::new(batches);

    // The first write of the process runs slower whatever writes (page
    // cache warm-up): a plain-file run that is not counted goes first.
    let local = args.store == "local";
    if local && args.plain_runs > 0 {
        plain_files(&args.dir, &payloads, args.window).await;
    }
    table.writer(0).await.unwrap();
    sync_disk();
    let puts_before = counter.calls(OpKind::Put);
    let (cpu_before, started) = (process_cpu_time(), Instant::now());
    let puts = {
        let (table, batches) = (Arc::clone(&table), Arc::clone(&batches));
        move |i: usize| {
            let (table, batches) = (Arc::clone(&table), Arc::clone(&batches));
            async move {
                table.put(&batches[i]).await.unwrap();
            }
        }
    };
    in_window(args.window, batches.len(), puts).await;
    let write_seconds = started.elapsed().as_secs_f64();
    let cpu_seconds = process_cpu_time() - cpu_before;
    // On a local disk, also until what was acknowledged is on the disk.
    let synced_seconds = local.then(|| {
        sync_disk();
        started.elapsed().as_secs_f64()
    });
    let puts_until_ack = counter.calls(OpKind::Put) - puts_before;
    let writer = table.writer(0).await.unwrap();
    let stats = writer.stats();
    table.close().await.unwrap();
    let close_seconds = started.elapsed().as_secs_f64();
    let after_close = writer.stats();
    let puts_until_close = counter.calls(OpKind::Put) - puts_before;
    let (disk_bytes, disk_files) = bytes_and_objects(root.store().as_ref()).await;
    drop((session, table, writer));

    // Read phase: a fresh session; reads come from the SSTables and packs.
    let session = open().await;
    let table = session.table("items").await.unwrap();
    let key_schema = Arc::new(table.schema().project(&[0]).unwrap());
    let mut gets = Vec::with_capacity(args.reads);
    let mut s = 42u64;
    for _ in 0..args.reads {
        let i = splitmix(&mut s) % args.rows as u64;
        let key = RecordBatch::try_new(
            Arc::clone(&key_schema),
            vec![Arc::new(Int64Array::from(vec![i as i64]))],
        )
        .unwrap();
        let t = Instant::now();
        let row = table.get(&key).await.unwrap().expect("row written");
        gets.push(t.elapsed().as_secs_f64() * 1e3);
        let image = cast(row.column(3), &DataType::Binary).unwrap();
        let image = image.as_binary::<i32>();
        assert_eq!(image.value(0), Row::new(i).image.as_slice(), "row {i}");
    }
    gets.sort_by(f64::total_cmp);
    let gets_before = counter.calls(OpKind::Get);
    let t = Instant::now();
    let out = session
        .sql("SELECT count(*), sum(length(caption)) FROM items")
        .await
        .unwrap()
        .collect()
        .await
        .unwrap();
    let scan_ms = t.elapsed().as_secs_f64() * 1e3;
    let scan_gets = counter.calls(OpKind::Get) - gets_before;
    let count = out[0]
        .column(0)
        .as_primitive::<datafusion::arrow::datatypes::Int64Type>();
    assert_eq!(count.value(0) as usize, args.rows);
    drop((session, table));

    // The physical limit: the same payload as plain files, local only; the
    // median of the runs.
    let mut plain_runs = Vec::new();
    for _ in 0..if local { args.plain_runs } else { 0 } {
        plain_runs.push(plain_files(&args.dir, &payloads, args.window).await);
    }
    let median = |mut runs: Vec<f64>| {
        runs.sort_by(f64::total_cmp);
        runs.get(runs.len() / 2).copied()
    };
    let plain_seconds = median(plain_runs.iter().map(|r| r.0).collect());
    let plain_synced_seconds = median(plain_runs.iter().map(|r| r.1).collect());
    let mb = payload_bytes as f64 / 1e6;
    let mb_per_s = mb / write_seconds;
    let synced_mb_per_s = synced_seconds.map(|s| mb / s);
    let pct = |p: f64| gets[((gets.len() as f64 - 1.0) * p).round() as usize];
    let report = serde_json::json!({
        "system": "memwal",
        "workload": "multimodal",
        "debug_assertions": cfg!(debug_assertions),
        "settings": format!(
            "{}all else default",
            args.options.iter().map(|o| format!("{o}; ")).collect::<String>()
        ),
        "store": args.store,
        "seed": args.seed,
        "rows": args.rows,
        "put_rows": args.put_rows,
        "window": args.window,
        "embedding": format!("{:?}", args.embedding).to_lowercase(),
        "wal_interval_ms": args.interval_ms,
        "payload_bytes": payload_bytes,
        "write_seconds": write_seconds,
        "cpu_seconds": cpu_seconds.as_secs_f64(),
        "rows_per_s": args.rows as f64 / write_seconds,
        "mb_per_s": mb_per_s,
        "rows_per_s_including_close": args.rows as f64 / close_seconds,
        "objects_written_until_ack": puts_until_ack,
        "objects_written": puts_until_close,
        "wal_appends": stats.wal_appends,
        "wal_bytes": stats.wal_bytes,
        "blob_packs": stats.blob_packs,
        "blob_pack_bytes": stats.blob_pack_bytes,
        "flushes": after_close.flushes,
        "compactions": after_close.compactions,
        "disk_files": disk_files,
        "disk_bytes": disk_bytes,
        "persisted_over_payload": disk_bytes as f64 / payload_bytes as f64,
        "get_p50_ms": pct(0.5),
        "get_p99_ms": pct(0.99),
        "scan_without_image_ms": scan_ms,
        "scan_without_image_gets": scan_gets,
        "plain_files_mb_per_s": plain_seconds.map(|s| mb / s),
        "mb_per_s_over_plain_files": plain_seconds.map(|s| mb_per_s / (mb / s)),
        "synced_mb_per_s": synced_mb_per_s,
        "plain_files_synced_mb_per_s": plain_synced_seconds.map(|s| mb / s),
        "synced_mb_per_s_over_plain_files": plain_synced_seconds
            .zip(synced_mb_per_s)
            .map(|(s, m)| m / (mb / s)),
    });
    println!("{report}");
}
