//! The KV protocol of memwal's `examples/kv_bench.rs` on SlateDB, over the
//! same store model: `--rows` rows of the KV schema (an 8-byte integer or a
//! 16-byte UUID key; the value holds the int64, int32 and float64 columns
//! and the 72-character string) in `--put-rows`-row write batches,
//! `--window` batches in flight, each awaited until durable, WAL flush
//! interval `--interval-ms`. Then the database is closed, its objects
//! counted, and point reads of random written keys are timed after a
//! reopen. Prints one JSON object with kv_bench's field names.
//!
//! `--workload multimodal` writes the rows of memwal's
//! `examples/multimodal_bench.rs` instead (a 100-byte caption, a 768-d
//! embedding and a 20–100 KB image per row, derived from the row number
//! with SplitMix64 as there; the value is the three concatenated), reads
//! `--reads` of them back and checks them, and reports the payload's MB/s,
//! the PUTs until close and persisted bytes over payload bytes.
//!
//! `--store s3-standard|s3-express` puts the directory behind [`Latency`],
//! which mirrors `memwal::testing::LatencyStore` (same profiles, same
//! log-normal draws, same request shapes); keep the two in step.
//!
//! ```text
//! cargo run --release -- --keys uuid --window 32 --store s3-standard
//! ```

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use clap::Parser;
use futures::stream::{BoxStream, FuturesUnordered, StreamExt, TryStreamExt};
use object_store::local::LocalFileSystem;
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
    PutMultipartOptions, PutOptions, PutPayload, PutResult, UploadPart,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use slatedb::config::{GarbageCollectorOptions, Settings};
use slatedb::{Db, WriteBatch};

#[derive(Debug, Parser)]
struct Args {
    /// `kv` or `multimodal`.
    #[arg(long, default_value = "kv")]
    workload: String,
    /// `int` or `uuid`.
    #[arg(long, default_value = "int")]
    keys: String,
    #[arg(long, default_value_t = 1_000_000)]
    rows: u64,
    #[arg(long, default_value_t = 1_000)]
    put_rows: u64,
    #[arg(long, default_value_t = 32)]
    window: usize,
    /// SlateDB's `flush_interval` (its WAL cadence).
    #[arg(long, default_value_t = 100)]
    interval_ms: u64,
    #[arg(long, default_value_t = 10_000)]
    reads: usize,
    /// Directory for the database (a fresh subdirectory is made in it).
    #[arg(long, default_value = "/tmp/slatedb-kv-bench")]
    dir: String,
    /// `local`, `s3-standard` or `s3-express`.
    #[arg(long, default_value = "local")]
    store: String,
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

/// The same keys kv_bench writes: the row number big-endian, or the UUID
/// kv_bench derives from it.
fn key(uuid: bool, i: u64) -> Vec<u8> {
    if !uuid {
        return i.to_be_bytes().to_vec();
    }
    let mut b: [u8; 16] = StdRng::seed_from_u64(i).random();
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    b.to_vec()
}

/// kv_bench's non-key columns of row `i`, as fixed-width bytes.
fn value(i: u64) -> Vec<u8> {
    let mut v = Vec::with_capacity(8 + 4 + 8 + 72);
    v.extend_from_slice(&(i as i64 * 7).to_le_bytes());
    v.extend_from_slice(&(i as i32).to_le_bytes());
    v.extend_from_slice(&(i as f64 * 0.5).to_le_bytes());
    v.extend_from_slice(&[b'x'; 72]);
    v
}

/// SplitMix64, as memwal's multimodal_bench.
fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Row `i` of multimodal_bench: caption, embedding and image bytes, one
/// after another (the same draws, in the same order, as its `Row::new`).
fn multimodal_value(i: u64) -> Vec<u8> {
    let mut s = i;
    let len = 20_000 + (splitmix(&mut s) % 80_001) as usize;
    let mut image = Vec::with_capacity(len + 8);
    while image.len() < len {
        image.extend_from_slice(&splitmix(&mut s).to_le_bytes());
    }
    image.truncate(len);
    let embedding: Vec<u8> = (0..768)
        .map(|_| (splitmix(&mut s) >> 40) as f32 / (1u64 << 24) as f32 - 0.5)
        .flat_map(f32::to_le_bytes)
        .collect();
    let mut caption = format!("a synthetic photograph, number {i}, of a cat on a windowsill; ");
    caption.extend(std::iter::repeat_n(
        'x',
        100usize.saturating_sub(caption.len()),
    ));
    caption.truncate(100);
    [caption.into_bytes(), embedding, image].concat()
}

fn settings(interval_ms: u64) -> Settings {
    let mut s = Settings::default();
    s.flush_interval = Some(Duration::from_millis(interval_ms));
    let mut gc = GarbageCollectorOptions::default();
    // LocalFileSystem cannot do PutMode::Update, which boundary files need.
    gc.boundary_files_enabled = false;
    s.garbage_collector_options = Some(gc);
    s
}

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i].as_secs_f64() * 1e3
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    let uuid = match args.keys.as_str() {
        "int" => false,
        "uuid" => true,
        other => panic!("--keys {other}: int or uuid"),
    };
    let multimodal = match args.workload.as_str() {
        "kv" => false,
        "multimodal" => true,
        other => panic!("--workload {other}: kv or multimodal"),
    };
    let value = |i: u64| match multimodal {
        true => multimodal_value(i),
        false => value(i),
    };
    let dir = std::path::Path::new(&args.dir).join(format!("run-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let local: Arc<dyn ObjectStore> = Arc::new(LocalFileSystem::new_with_prefix(&dir).unwrap());
    // A local store is counted too, with no delays.
    let latency = Latency::new(
        Arc::clone(&local),
        Profile::named(&args.store).unwrap_or_else(|| panic!("--store {}: unknown", args.store)),
        args.seed,
    );
    let store: Arc<dyn ObjectStore> = latency.clone();
    let open = || {
        Db::builder("db", Arc::clone(&store))
            .with_settings(settings(args.interval_ms))
            .build()
    };

    let db = Arc::new(open().await.unwrap());
    // Every batch is made before the clock starts, as in kv_bench.
    let batches: Vec<WriteBatch> = (0..args.rows.div_ceil(args.put_rows))
        .map(|b| {
            let mut wb = WriteBatch::new();
            for i in b * args.put_rows..((b + 1) * args.put_rows).min(args.rows) {
                wb.put(key(uuid, i), value(i));
            }
            wb
        })
        .collect();
    let payload_bytes: usize = (0..args.rows).map(|i| value(i).len()).sum();
    let started = Instant::now();
    let mut batches = batches.into_iter();
    let mut inflight = FuturesUnordered::new();
    loop {
        while inflight.len() < args.window {
            let Some(wb) = batches.next() else { break };
            let db = Arc::clone(&db);
            inflight.push(tokio::spawn(async move {
                db.write(wb).await.unwrap().await_durable().await.unwrap();
            }));
        }
        match inflight.next().await {
            Some(done) => done.unwrap(),
            None => break,
        }
    }
    let write_seconds = started.elapsed().as_secs_f64();
    let puts_until_ack = latency.counts[PUT].requests.load(Ordering::Relaxed);
    db.close().await.unwrap();
    let close_seconds = started.elapsed().as_secs_f64();
    let puts_until_close = latency.counts[PUT].requests.load(Ordering::Relaxed);
    let written = requests(&latency);
    let (disk_files, disk_bytes, wal_files) = stored(local.as_ref()).await;
    drop(db);

    let db = open().await.unwrap();
    let mut rng = StdRng::seed_from_u64(42);
    let mut gets = Vec::with_capacity(args.reads);
    for _ in 0..args.reads {
        let i = rng.random_range(0..args.rows);
        let k = key(uuid, i);
        let t = Instant::now();
        let got = db.get(&k).await.unwrap();
        gets.push(t.elapsed());
        assert_eq!(got.as_deref(), Some(&value(i)[..]), "key {i}");
    }
    db.close().await.unwrap();
    gets.sort_unstable();
    if multimodal {
        let report = serde_json::json!({
            "system": "slatedb-0.18.0",
            "workload": "multimodal",
            "debug_assertions": cfg!(debug_assertions),
            "settings": "flush_interval = --interval-ms; gc boundary files off (LocalFileSystem lacks PutMode::Update); all else default",
            "store": args.store,
            "seed": args.seed,
            "rows": args.rows,
            "put_rows": args.put_rows,
            "window": args.window,
            "wal_interval_ms": args.interval_ms,
            "payload_bytes": payload_bytes,
            "write_seconds": write_seconds,
            "rows_per_s": args.rows as f64 / write_seconds,
            "mb_per_s": payload_bytes as f64 / 1e6 / write_seconds,
            "rows_per_s_including_close": args.rows as f64 / close_seconds,
            "objects_written_until_ack": puts_until_ack,
            "objects_written": puts_until_close,
            "disk_files": disk_files,
            "disk_wal_files": wal_files,
            "disk_bytes": disk_bytes,
            "persisted_over_payload": disk_bytes as f64 / payload_bytes as f64,
            "get_p50_ms": percentile(&gets, 0.5),
            "get_p99_ms": percentile(&gets, 0.99),
        });
        println!("{report}");
        let _ = std::fs::remove_dir_all(&dir);
        return;
    }
    let report = serde_json::json!({
        "system": "slatedb-0.18.0",
        "keys": args.keys,
        "store": args.store,
        "store_profile": (args.store != "local").then(|| format!("{:?}", latency.profile)),
        "seed": args.seed,
        "debug_assertions": cfg!(debug_assertions),
        "settings": "flush_interval = --interval-ms; gc boundary files off (LocalFileSystem lacks PutMode::Update); all else default",
        "requests_until_close": written,
        "requests_in_all": requests(&latency),
        "rows": args.rows,
        "put_rows": args.put_rows,
        "window": args.window,
        "wal_interval_ms": args.interval_ms,
        "durable": true,
        "write_seconds": write_seconds,
        "rows_per_s": args.rows as f64 / write_seconds,
        "rows_per_s_including_close": args.rows as f64 / close_seconds,
        "disk_files": disk_files,
        "disk_wal_files": wal_files,
        "disk_bytes": disk_bytes,
        "disk_bytes_per_row": disk_bytes as f64 / args.rows as f64,
        "rust_get_p50_ms": percentile(&gets, 0.5),
        "rust_get_p99_ms": percentile(&gets, 0.99),
    });
    println!("{report}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Objects, bytes and WAL objects in the store (read without the model).
async fn stored(store: &dyn ObjectStore) -> (u64, u64, u64) {
    let all: Vec<ObjectMeta> = store.list(None).try_collect().await.unwrap();
    let wal = all
        .iter()
        .filter(|o| o.location.as_ref().contains("/wal/"))
        .count();
    (
        all.len() as u64,
        all.iter().map(|o| o.size).sum(),
        wal as u64,
    )
}

/// The requests of each kind; null on a local store (as kv_bench reports).
fn requests(l: &Latency) -> serde_json::Value {
    if l.profile.name == "local" {
        return serde_json::Value::Null;
    }
    let kinds = KINDS.iter().enumerate().map(|(at, kind)| {
        let c = &l.counts[at];
        let value = serde_json::json!({
            "requests": c.requests.load(Ordering::Relaxed),
            "bytes": c.bytes.load(Ordering::Relaxed),
            "waited_ms": c.waited_ns.load(Ordering::Relaxed) as f64 / 1e6,
        });
        (kind.to_string(), value)
    });
    serde_json::Value::Object(kinds.collect())
}

/// Log-normal through a median and a 99th percentile, capped at 10× p99.
#[derive(Debug, Clone, Copy)]
struct Delay {
    p50_ms: f64,
    p99_ms: f64,
}

impl Delay {
    fn sample(&self, rng: &mut StdRng) -> Duration {
        let sigma = (self.p99_ms / self.p50_ms).max(1.0).ln() / 2.326_347_874;
        let (u1, u2): (f64, f64) = (1.0 - rng.random::<f64>(), rng.random::<f64>());
        let z = (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos();
        let ms = (self.p50_ms * (sigma * z).exp()).min(10.0 * self.p99_ms);
        Duration::from_secs_f64(ms / 1e3)
    }
}

/// memwal's `LatencyProfile`: the delays of PUT, GET/HEAD, LIST and
/// DELETE/COPY, and bytes per second per request.
#[derive(Debug)]
struct Profile {
    name: &'static str,
    delays: [Delay; 4],
    bytes_per_s: f64,
}

impl Profile {
    fn named(name: &str) -> Option<Self> {
        let d = |p50_ms, p99_ms| Delay { p50_ms, p99_ms };
        match name {
            "local" => Some(Self {
                name: "local",
                delays: [d(0., 0.); 4],
                bytes_per_s: f64::INFINITY,
            }),
            "s3-standard" => Some(Self {
                name: "s3-standard",
                delays: [d(50., 150.), d(25., 100.), d(40., 120.), d(30., 100.)],
                bytes_per_s: 80e6,
            }),
            "s3-express" => Some(Self {
                name: "s3-express",
                delays: [d(6., 15.), d(3., 8.), d(5., 15.), d(4., 10.)],
                bytes_per_s: 100e6,
            }),
            _ => None,
        }
    }
}

const KINDS: [&str; 6] = ["put", "get", "head", "list", "delete", "copy"];
const PUT: usize = 0;
const GET: usize = 1;
const HEAD: usize = 2;
const LIST: usize = 3;
const DELETE: usize = 4;
const COPY: usize = 5;
/// Objects per LIST page and paths per bulk DELETE, as on S3.
const PAGE: usize = 1000;

#[derive(Debug, Default)]
struct Count {
    requests: AtomicU64,
    bytes: AtomicU64,
    waited_ns: AtomicU64,
}

#[derive(Debug)]
struct Model {
    profile: Profile,
    rng: Mutex<StdRng>,
    counts: [Count; 6],
}

impl Model {
    async fn wait(&self, kind: usize, bytes: u64) {
        let delay_kind = match kind {
            PUT => 0,
            GET | HEAD => 1,
            LIST => 2,
            _ => 3,
        };
        let delay = self.profile.delays[delay_kind].sample(&mut self.rng.lock().unwrap());
        let waited = delay + Duration::from_secs_f64(bytes as f64 / self.profile.bytes_per_s);
        let c = &self.counts[kind];
        c.requests.fetch_add(1, Ordering::Relaxed);
        c.bytes.fetch_add(bytes, Ordering::Relaxed);
        c.waited_ns
            .fetch_add(waited.as_nanos() as u64, Ordering::Relaxed);
        if !waited.is_zero() {
            tokio::time::sleep(waited).await;
        }
    }
}

/// A store whose every request waits as its profile says, and is counted.
#[derive(Debug)]
struct Latency {
    inner: Arc<dyn ObjectStore>,
    model: Arc<Model>,
}

impl std::ops::Deref for Latency {
    type Target = Model;
    fn deref(&self) -> &Model {
        &self.model
    }
}

impl Latency {
    fn new(inner: Arc<dyn ObjectStore>, profile: Profile, seed: u64) -> Arc<Self> {
        Arc::new(Self {
            inner,
            model: Arc::new(Model {
                profile,
                rng: Mutex::new(StdRng::seed_from_u64(seed)),
                counts: Default::default(),
            }),
        })
    }

    fn paged(
        &self,
        list: impl FnOnce() -> BoxStream<'static, object_store::Result<ObjectMeta>> + Send + 'static,
    ) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        let (model, first) = (Arc::clone(&self.model), Arc::clone(&self.model));
        futures::stream::once(async move {
            first.wait(LIST, 0).await;
            list()
        })
        .flatten()
        .enumerate()
        .then(move |(i, object)| {
            let model = Arc::clone(&model);
            async move {
                if i > 0 && i % PAGE == 0 {
                    model.wait(LIST, 0).await;
                }
                object
            }
        })
        .boxed()
    }
}

impl fmt::Display for Latency {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Latency({}, {})", self.model.profile.name, self.inner)
    }
}

#[derive(Debug)]
struct Upload {
    inner: Box<dyn MultipartUpload>,
    model: Arc<Model>,
}

#[async_trait]
impl MultipartUpload for Upload {
    fn put_part(&mut self, data: PutPayload) -> UploadPart {
        let (model, bytes) = (Arc::clone(&self.model), data.content_length() as u64);
        let part = self.inner.put_part(data);
        Box::pin(async move {
            model.wait(PUT, bytes).await;
            part.await
        })
    }

    async fn complete(&mut self) -> object_store::Result<PutResult> {
        self.model.wait(PUT, 0).await;
        self.inner.complete().await
    }

    async fn abort(&mut self) -> object_store::Result<()> {
        self.model.wait(DELETE, 0).await;
        self.inner.abort().await
    }
}

#[async_trait]
impl ObjectStore for Latency {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        self.model.wait(PUT, payload.content_length() as u64).await;
        self.inner.put_opts(location, payload, opts).await
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        self.model.wait(PUT, 0).await;
        let inner = self.inner.put_multipart_opts(location, opts).await?;
        Ok(Box::new(Upload {
            inner,
            model: Arc::clone(&self.model),
        }))
    }

    async fn get_opts(
        &self,
        location: &Path,
        options: GetOptions,
    ) -> object_store::Result<GetResult> {
        let kind = if options.head { HEAD } else { GET };
        let result = self.inner.get_opts(location, options).await;
        let bytes = match &result {
            Ok(r) if kind == GET => r.range.end - r.range.start,
            _ => 0,
        };
        self.model.wait(kind, bytes).await;
        result
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, object_store::Result<Path>>,
    ) -> BoxStream<'static, object_store::Result<Path>> {
        let (model, inner) = (Arc::clone(&self.model), Arc::clone(&self.inner));
        locations
            .ready_chunks(PAGE)
            .then(move |batch| {
                let (model, inner) = (Arc::clone(&model), Arc::clone(&inner));
                async move {
                    model.wait(DELETE, 0).await;
                    let done: Vec<_> = inner
                        .delete_stream(futures::stream::iter(batch).boxed())
                        .collect()
                        .await;
                    futures::stream::iter(done)
                }
            })
            .flatten()
            .boxed()
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        let (inner, prefix) = (Arc::clone(&self.inner), prefix.cloned());
        self.paged(move || inner.list(prefix.as_ref()))
    }

    fn list_with_offset(
        &self,
        prefix: Option<&Path>,
        offset: &Path,
    ) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        let (inner, prefix, offset) = (Arc::clone(&self.inner), prefix.cloned(), offset.clone());
        self.paged(move || inner.list_with_offset(prefix.as_ref(), &offset))
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> object_store::Result<ListResult> {
        self.model.wait(LIST, 0).await;
        self.inner.list_with_delimiter(prefix).await
    }

    async fn copy_opts(
        &self,
        from: &Path,
        to: &Path,
        options: CopyOptions,
    ) -> object_store::Result<()> {
        self.model.wait(COPY, 0).await;
        self.inner.copy_opts(from, to, options).await
    }
}
