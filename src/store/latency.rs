//! An [`ObjectStore`] wrapper with the request latency of a named profile
//! (S3 Standard, S3 Express One Zone), for benchmarks: every request waits
//! a delay drawn from the profile's log-normal distribution for its kind,
//! plus its bytes at the profile's per-request bandwidth, and is counted.
//!
//! The profiles' parameters sit inside public figures (see `PEERS.md` of the
//! team and BENCHMARKS.md): SlateDB's tuning guide gives PUT latencies of
//! 50–100 ms on S3 Standard and 5–10 ms on S3 Express One Zone; AWS's
//! performance guidance gives 100–200 ms first-byte latency for S3 Standard
//! requests in general; SlateDB's published S3 benchmark has durable puts at
//! p50 115 ms and p99 220 ms (a put there is a PUT plus its wait for a
//! flush). Requests never queue behind each other (S3 serves thousands of
//! requests a second per prefix). Draws come from one seeded generator, so
//! a run that makes its requests in the same order sees the same delays.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use futures::stream::BoxStream;
use futures::{FutureExt, StreamExt};
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
    PutMultipartOptions, PutOptions, PutPayload, PutResult, UploadPart,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::{ObjectRoot, OpKind};
use crate::error::{Error, Result};

/// The latency of one kind of request: log-normal, through a median and a
/// 99th percentile (draws are capped at 10× the 99th percentile).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Delay {
    /// Median.
    pub p50: Duration,
    /// 99th percentile (at least the median).
    pub p99: Duration,
}

impl Delay {
    const fn ms(p50: u64, p99: u64) -> Self {
        Self {
            p50: Duration::from_millis(p50),
            p99: Duration::from_millis(p99),
        }
    }

    /// One draw: `exp(mu + sigma * z)` with `z` standard normal, `exp(mu)`
    /// the median and `exp(mu + 2.326 sigma)` the 99th percentile.
    fn sample(&self, rng: &mut StdRng) -> Duration {
        let p50 = self.p50.as_secs_f64();
        if p50 <= 0.0 {
            return Duration::ZERO;
        }
        let sigma = (self.p99.as_secs_f64() / p50).max(1.0).ln() / Z_99;
        // Box–Muller: two uniforms in (0, 1] to one standard normal.
        let (u1, u2): (f64, f64) = (1.0 - rng.random::<f64>(), rng.random::<f64>());
        let z = (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos();
        let cap = 10.0 * self.p99.as_secs_f64().max(p50);
        Duration::from_secs_f64((p50 * (sigma * z).exp()).min(cap))
    }
}

/// The standard normal's 99th percentile.
const Z_99: f64 = 2.326_347_874;

/// The latencies and bandwidth of one object store.
#[derive(Debug, Clone, PartialEq)]
pub struct LatencyProfile {
    /// The profile's name, as benchmarks print it.
    pub name: &'static str,
    /// A PUT until acknowledged (creating a multipart upload, each of its
    /// parts and its completion count as one each).
    pub put: Delay,
    /// A GET or HEAD until its first byte.
    pub get: Delay,
    /// A LIST until its first page.
    pub list: Delay,
    /// A DELETE or COPY.
    pub delete: Delay,
    /// Bytes per second of one request's body, either way.
    pub bytes_per_s: u64,
}

impl LatencyProfile {
    /// S3 Standard in the region of the client: PUT p50 50 ms / p99 150 ms,
    /// GET first byte 25 / 100 ms, LIST 40 / 120 ms, DELETE 30 / 100 ms,
    /// 80 MB/s per request.
    pub const S3_STANDARD: Self = Self {
        name: "s3-standard",
        put: Delay::ms(50, 150),
        get: Delay::ms(25, 100),
        list: Delay::ms(40, 120),
        delete: Delay::ms(30, 100),
        bytes_per_s: 80_000_000,
    };

    /// S3 Express One Zone in the client's zone: PUT p50 6 ms / p99 15 ms,
    /// GET first byte 3 / 8 ms, LIST 5 / 15 ms, DELETE 4 / 10 ms, 100 MB/s
    /// per request.
    pub const S3_EXPRESS: Self = Self {
        name: "s3-express",
        put: Delay::ms(6, 15),
        get: Delay::ms(3, 8),
        list: Delay::ms(5, 15),
        delete: Delay::ms(4, 10),
        bytes_per_s: 100_000_000,
    };

    /// The profile called `name` (`s3-standard`, `s3-express`).
    pub fn named(name: &str) -> Option<Self> {
        [Self::S3_STANDARD, Self::S3_EXPRESS]
            .into_iter()
            .find(|p| p.name == name)
    }

    fn delay(&self, kind: OpKind) -> &Delay {
        match kind {
            OpKind::Put | OpKind::Complete => &self.put,
            OpKind::Get | OpKind::Head => &self.get,
            OpKind::List => &self.list,
            OpKind::Delete | OpKind::Copy => &self.delete,
        }
    }
}

/// Objects in one page of a LIST, and paths in one bulk DELETE (S3's
/// most).
const LIST_PAGE: usize = 1000;

const KINDS: [OpKind; 6] = [
    OpKind::Put,
    OpKind::Get,
    OpKind::Head,
    OpKind::List,
    OpKind::Delete,
    OpKind::Copy,
];

/// The index of `kind` in [`KINDS`] (and in the counters).
fn slot(kind: OpKind) -> usize {
    KINDS.iter().position(|k| *k == kind).expect("every kind")
}

/// Requests, body bytes and delays of one kind so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RequestCount {
    /// Requests made (failed ones included).
    pub requests: u64,
    /// Bytes sent (PUT) or received (GET).
    pub bytes: u64,
    /// The delays these requests waited, in all.
    pub waited: Duration,
}

#[derive(Debug)]
struct Model {
    profile: LatencyProfile,
    rng: Mutex<StdRng>,
    requests: [AtomicU64; KINDS.len()],
    bytes: [AtomicU64; KINDS.len()],
    waited_ns: [AtomicU64; KINDS.len()],
}

impl Model {
    /// Counts a request of `kind` with `bytes` of body and waits its delay.
    async fn wait(&self, kind: OpKind, bytes: u64) {
        let at = slot(kind);
        self.requests[at].fetch_add(1, Ordering::Relaxed);
        self.bytes[at].fetch_add(bytes, Ordering::Relaxed);
        let delay = {
            let mut rng = self.rng.lock().expect("latency generator poisoned");
            self.profile.delay(kind).sample(&mut rng)
        };
        let transfer =
            Duration::from_secs_f64(bytes as f64 / self.profile.bytes_per_s.max(1) as f64);
        let waited = delay + transfer;
        self.waited_ns[at].fetch_add(waited.as_nanos() as u64, Ordering::Relaxed);
        tokio::time::sleep(waited).await;
    }
}

/// Wraps a store; every request waits as the profile says (see the module
/// documentation) and is counted.
#[derive(Debug, Clone)]
pub struct LatencyStore {
    inner: Arc<dyn ObjectStore>,
    model: Arc<Model>,
}

impl LatencyStore {
    /// `inner` with the latency of `profile`, drawn from a generator seeded
    /// with `seed`.
    pub fn new(inner: Arc<dyn ObjectStore>, profile: LatencyProfile, seed: u64) -> Arc<Self> {
        Arc::new(Self {
            inner,
            model: Arc::new(Model {
                profile,
                rng: Mutex::new(StdRng::seed_from_u64(seed)),
                requests: Default::default(),
                bytes: Default::default(),
                waited_ns: Default::default(),
            }),
        })
    }

    /// The profile requests wait by.
    pub fn profile(&self) -> &LatencyProfile {
        &self.model.profile
    }

    /// Requests and bytes of `kind` so far.
    pub fn count(&self, kind: OpKind) -> RequestCount {
        let at = slot(kind);
        RequestCount {
            requests: self.model.requests[at].load(Ordering::Relaxed),
            bytes: self.model.bytes[at].load(Ordering::Relaxed),
            waited: Duration::from_nanos(self.model.waited_ns[at].load(Ordering::Relaxed)),
        }
    }

    /// [`LatencyStore::count`] of every kind.
    pub fn counts(&self) -> Vec<(OpKind, RequestCount)> {
        KINDS.iter().map(|&k| (k, self.count(k))).collect()
    }
}

/// Where a benchmark keeps its root, from its `--store` argument: `local`
/// (the directory `dir`), a profile's name (`dir` behind a
/// [`LatencyStore`] of that profile, seeded with `seed`; also returned, for
/// its counts), or any root URL [`ObjectRoot::open`] takes.
pub fn bench_root(
    store: &str,
    dir: &std::path::Path,
    seed: u64,
) -> Result<(ObjectRoot, Option<Arc<LatencyStore>>)> {
    let local = || ObjectRoot::open(&dir.to_string_lossy());
    if store == "local" {
        return Ok((local()?, None));
    }
    if let Some(profile) = LatencyProfile::named(store) {
        let local = local()?;
        let slow = LatencyStore::new(Arc::clone(local.store()), profile, seed);
        let url = format!("{store}+{}", local.url());
        return Ok((ObjectRoot::new(slow.clone(), url), Some(slow)));
    }
    if store.contains("://") {
        return Ok((ObjectRoot::open(store)?, None));
    }
    Err(Error::invalid(format!(
        "unknown store {store:?}: local, s3-standard, s3-express or a root URL"
    )))
}

impl LatencyStore {
    /// The listing `list` makes, one LIST request per page of
    /// [`LIST_PAGE`] objects.
    fn paged(
        &self,
        list: impl FnOnce() -> BoxStream<'static, object_store::Result<ObjectMeta>> + Send + 'static,
    ) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        let (model, first) = (Arc::clone(&self.model), Arc::clone(&self.model));
        futures::stream::once(async move {
            first.wait(OpKind::List, 0).await;
            list()
        })
        .flatten()
        .enumerate()
        .then(move |(i, object)| {
            let model = Arc::clone(&model);
            async move {
                if i > 0 && i % LIST_PAGE == 0 {
                    model.wait(OpKind::List, 0).await;
                }
                object
            }
        })
        .boxed()
    }
}

impl fmt::Display for LatencyStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "LatencyStore({}, {})",
            self.model.profile.name, self.inner
        )
    }
}

/// A multipart upload whose parts and completion wait like PUTs.
#[derive(Debug)]
struct LatencyUpload {
    inner: Box<dyn MultipartUpload>,
    model: Arc<Model>,
}

#[async_trait]
impl MultipartUpload for LatencyUpload {
    fn put_part(&mut self, data: PutPayload) -> UploadPart {
        let (model, bytes) = (Arc::clone(&self.model), data.content_length() as u64);
        let part = self.inner.put_part(data);
        async move {
            model.wait(OpKind::Put, bytes).await;
            part.await
        }
        .boxed()
    }

    async fn complete(&mut self) -> object_store::Result<PutResult> {
        self.model.wait(OpKind::Put, 0).await;
        self.inner.complete().await
    }

    async fn abort(&mut self) -> object_store::Result<()> {
        self.model.wait(OpKind::Delete, 0).await;
        self.inner.abort().await
    }
}

#[async_trait]
impl ObjectStore for LatencyStore {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        let bytes = payload.content_length() as u64;
        self.model.wait(OpKind::Put, bytes).await;
        self.inner.put_opts(location, payload, opts).await
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        // Creating the upload is a request of its own.
        self.model.wait(OpKind::Put, 0).await;
        let inner = self.inner.put_multipart_opts(location, opts).await?;
        Ok(Box::new(LatencyUpload {
            inner,
            model: Arc::clone(&self.model),
        }))
    }

    async fn get_opts(
        &self,
        location: &Path,
        options: GetOptions,
    ) -> object_store::Result<GetResult> {
        let kind = match options.head {
            true => OpKind::Head,
            false => OpKind::Get,
        };
        let result = self.inner.get_opts(location, options).await;
        let bytes = match (&result, kind) {
            (Ok(r), OpKind::Get) => r.range.end - r.range.start,
            _ => 0,
        };
        self.model.wait(kind, bytes).await;
        result
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, object_store::Result<Path>>,
    ) -> BoxStream<'static, object_store::Result<Path>> {
        // One request per batch of up to LIST_PAGE deletes, as S3's
        // DeleteObjects takes them.
        let (model, inner) = (Arc::clone(&self.model), Arc::clone(&self.inner));
        locations
            .ready_chunks(LIST_PAGE)
            .then(move |batch| {
                let (model, inner) = (Arc::clone(&model), Arc::clone(&inner));
                async move {
                    model.wait(OpKind::Delete, 0).await;
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
        self.model.wait(OpKind::List, 0).await;
        self.inner.list_with_delimiter(prefix).await
    }

    async fn copy_opts(
        &self,
        from: &Path,
        to: &Path,
        options: CopyOptions,
    ) -> object_store::Result<()> {
        self.model.wait(OpKind::Copy, 0).await;
        self.inner.copy_opts(from, to, options).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use object_store::ObjectStoreExt;
    use object_store::memory::InMemory;

    fn quantile(sorted: &[Duration], q: f64) -> Duration {
        sorted[((sorted.len() - 1) as f64 * q) as usize]
    }

    #[test]
    fn draws_have_the_profiles_median_and_tail_and_repeat_by_seed() {
        let delay = LatencyProfile::S3_STANDARD.put;
        let draws = |seed| {
            let mut rng = StdRng::seed_from_u64(seed);
            let mut d: Vec<Duration> = (0..40_000).map(|_| delay.sample(&mut rng)).collect();
            d.sort();
            d
        };
        let d = draws(7);
        let within = |got: Duration, want: Duration| {
            (got.as_secs_f64() / want.as_secs_f64() - 1.0).abs() < 0.08
        };
        assert!(
            within(quantile(&d, 0.5), delay.p50),
            "{:?}",
            quantile(&d, 0.5)
        );
        assert!(
            within(quantile(&d, 0.99), delay.p99),
            "{:?}",
            quantile(&d, 0.99)
        );
        assert!(*d.last().unwrap() <= delay.p99 * 10);
        assert_eq!(d, draws(7));
        assert_ne!(d, draws(8));
    }

    /// A profile whose every request of a kind takes the same delay.
    fn fixed(put_ms: u64, get_ms: u64, bytes_per_s: u64) -> LatencyProfile {
        LatencyProfile {
            name: "fixed",
            put: Delay::ms(put_ms, put_ms),
            get: Delay::ms(get_ms, get_ms),
            list: Delay::ms(1, 1),
            delete: Delay::ms(1, 1),
            bytes_per_s,
        }
    }

    #[tokio::test]
    async fn requests_wait_their_delay_and_bandwidth_and_are_counted() {
        let store = LatencyStore::new(Arc::new(InMemory::new()), fixed(4, 2, 100_000_000), 1);
        let path = Path::from("a/b");
        let started = std::time::Instant::now();
        store
            .put(&path, PutPayload::from(vec![0u8; 100_000]))
            .await
            .unwrap();
        assert!(started.elapsed() >= Duration::from_millis(5));
        let got = store.get_range(&path, 0..50_000).await.unwrap();
        assert_eq!(got.len(), 50_000);
        assert!(store.head(&path).await.is_ok());
        assert_eq!(store.list(None).collect::<Vec<_>>().await.len(), 1);
        store.delete(&path).await.unwrap();
        assert!(store.head(&path).await.is_err());
        let count = |kind| store.count(kind);
        // 4 ms, and 100 kB at 100 MB/s.
        let put = RequestCount {
            requests: 1,
            bytes: 100_000,
            waited: Duration::from_millis(5),
        };
        assert_eq!(count(OpKind::Put), put);
        let get = RequestCount {
            requests: 1,
            bytes: 50_000,
            waited: Duration::from_micros(2500),
        };
        assert_eq!(count(OpKind::Get), get);
        let head = RequestCount {
            requests: 2,
            bytes: 0,
            waited: Duration::from_millis(4),
        };
        assert_eq!(count(OpKind::Head), head);
        assert_eq!(count(OpKind::List).requests, 1);
        assert_eq!(count(OpKind::Delete).requests, 1);
        assert_eq!(count(OpKind::Copy).requests, 0);
    }

    #[tokio::test]
    async fn multipart_parts_and_completion_wait_like_puts() {
        let store = LatencyStore::new(Arc::new(InMemory::new()), fixed(1, 1, u64::MAX), 1);
        let mut upload = store.put_multipart(&Path::from("big")).await.unwrap();
        upload
            .put_part(PutPayload::from(vec![1u8; 10]))
            .await
            .unwrap();
        upload
            .put_part(PutPayload::from(vec![2u8; 10]))
            .await
            .unwrap();
        upload.complete().await.unwrap();
        // Create, two parts, complete.
        let put = store.count(OpKind::Put);
        assert_eq!((put.requests, put.bytes), (4, 20));
        assert_eq!(put.waited, Duration::from_millis(4));
        let got = store.get(&Path::from("big")).await.unwrap().bytes().await;
        assert_eq!(got.unwrap().len(), 20);
    }

    #[tokio::test]
    async fn a_listing_and_a_bulk_delete_are_one_request_per_page() {
        let inner = Arc::new(InMemory::new());
        let paths: Vec<Path> = (0..2500).map(|i| Path::from(format!("o/{i}"))).collect();
        for path in &paths {
            inner.put(path, PutPayload::new()).await.unwrap();
        }
        let store = LatencyStore::new(inner, fixed(1, 1, u64::MAX), 1);
        assert_eq!(store.list(None).collect::<Vec<_>>().await.len(), 2500);
        assert_eq!(store.count(OpKind::List).requests, 3);
        let empty = Path::from("none");
        assert_eq!(store.list(Some(&empty)).collect::<Vec<_>>().await.len(), 0);
        assert_eq!(store.count(OpKind::List).requests, 4);
        let deletes = futures::stream::iter(paths.into_iter().map(Ok)).boxed();
        let deleted: Vec<_> = store.delete_stream(deletes).collect().await;
        assert_eq!(deleted.len(), 2500);
        assert!(deleted.iter().all(|d| d.is_ok()));
        assert!(store.count(OpKind::Delete).requests >= 3);
        assert_eq!(store.list(None).collect::<Vec<_>>().await.len(), 0);
    }

    #[test]
    fn profiles_are_found_by_name() {
        assert_eq!(
            LatencyProfile::named("s3-express"),
            Some(LatencyProfile::S3_EXPRESS)
        );
        assert_eq!(LatencyProfile::named("s3"), None);
    }
}
