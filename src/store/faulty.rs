//! A fault-injecting [`ObjectStore`] wrapper for tests: fail the Nth call of
//! a kind (before the operation, or after it took effect so the caller sees
//! an ambiguous failure), hold calls at a [`Gate`] until a test opens it, and
//! add latency to every call.

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, GetResultPayload, ListResult, MultipartUpload, ObjectMeta,
    ObjectStore, ObjectStoreExt, PutMultipartOptions, PutOptions, PutPayload, PutResult,
};

/// The kinds of call a [`Fault`] can target.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OpKind {
    /// `put_opts`, the start of a multipart upload and each of its parts.
    Put,
    /// `get_opts` (not `head`) and `get_ranges`.
    Get,
    /// `head` (a `get_opts` with `head` set).
    Head,
    /// `list` and `list_with_delimiter`.
    List,
    /// each path of `delete_stream`.
    Delete,
    /// `copy_opts`.
    Copy,
    /// The completion of a multipart upload (`After` and `Retried`: it
    /// completes, and its answer is lost).
    Complete,
}

/// When the injected failure happens relative to the real operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultMode {
    /// Fail without touching the inner store.
    Before,
    /// Perform the operation, then report a failure: the caller cannot tell
    /// whether it took effect (a lost acknowledgement). A read's body is
    /// cut short instead, with an error that names no object, as an HTTP
    /// client's does.
    After,
    /// Perform the operation, lose its answer, and perform it again, as an
    /// HTTP client retrying by itself does: a put-if-absent then reports
    /// that the object exists, though it is the caller's own.
    Retried,
    /// Panic in the call, before the operation: a bug in a store client
    /// (or in the code that called it).
    Panic,
    /// A read whose body arrives with one bit flipped, the object intact:
    /// bytes damaged on their way (a store reached over plain HTTP). Calls
    /// other than reads fail before the operation.
    Garbled,
}

/// One rule: fail calls number `nth ..= nth + times - 1` (1-based) among the
/// calls of `kind` whose path contains `path_contains`.
#[derive(Debug, Clone)]
pub struct Fault {
    /// The kind of call that fails.
    pub kind: OpKind,
    /// The first failing call (1-based).
    pub nth: u64,
    /// How many calls in a row fail.
    pub times: u64,
    /// How a call fails.
    pub mode: FaultMode,
    /// Only calls on paths containing this count.
    pub path_contains: Option<String>,
    /// How long a failing call waits before it fails (see
    /// [`Fault::slowly`]).
    pub delay: Duration,
}

impl Fault {
    /// Fail the `nth` call (1-based) of `kind`, before it happens.
    pub fn nth(kind: OpKind, nth: u64) -> Self {
        Self {
            kind,
            nth: nth.max(1),
            times: 1,
            mode: FaultMode::Before,
            path_contains: None,
            delay: Duration::ZERO,
        }
    }

    /// Fail only after `delay`, as a request that timed out does (a caller
    /// cannot tell it from one that may still land). Not for the parts
    /// and completion of a multipart upload.
    pub fn slowly(mut self, delay: Duration) -> Self {
        self.delay = delay;
        self
    }

    /// Let the operation happen, then report failure.
    pub fn after_write(mut self) -> Self {
        self.mode = FaultMode::After;
        self
    }

    /// Let the operation happen, then happen again (see
    /// [`FaultMode::Retried`]); calls other than puts fail after it.
    pub fn retried(mut self) -> Self {
        self.mode = FaultMode::Retried;
        self
    }

    /// Fail this many consecutive matching calls (`u64::MAX`: all of them).
    pub fn times(mut self, times: u64) -> Self {
        self.times = times.max(1);
        self
    }

    /// Damage the body of a read on its way (see [`FaultMode::Garbled`]).
    pub fn garbled(mut self) -> Self {
        self.mode = FaultMode::Garbled;
        self
    }

    /// Panic instead of failing (see [`FaultMode::Panic`]).
    pub fn panicking(mut self) -> Self {
        self.mode = FaultMode::Panic;
        self
    }

    /// Count only calls whose path contains `needle`.
    pub fn on_paths_containing(mut self, needle: impl Into<String>) -> Self {
        self.path_contains = Some(needle.into());
        self
    }
}

/// Calls of one kind on matching paths wait here until [`Gate::open`]; a
/// test sees how many arrived, so it can act while they are held instead of
/// sleeping and hoping. Made by [`FaultyStore::gate`].
#[derive(Debug)]
pub struct Gate {
    open: tokio::sync::watch::Sender<bool>,
    arrived: tokio::sync::watch::Receiver<u64>,
}

impl Gate {
    /// Waits until `calls` calls have arrived at the gate (held, or passed
    /// once it is open).
    pub async fn arrived(&self, calls: u64) {
        let mut arrived = self.arrived.clone();
        arrived
            .wait_for(|n| *n >= calls)
            .await
            .expect("the store outlives its gates");
    }

    /// Lets the held calls, and every later one, through.
    pub fn open(&self) {
        self.open.send_replace(true);
    }
}

/// The store's side of a [`Gate`].
#[derive(Debug)]
struct GateRule {
    kind: OpKind,
    path_contains: String,
    open: tokio::sync::watch::Receiver<bool>,
    arrived: tokio::sync::watch::Sender<u64>,
}

#[derive(Debug, Default)]
struct State {
    faults: Vec<(Fault, u64)>,
    gates: Vec<GateRule>,
    /// Objects whose paths contain the needle are left out of this many
    /// more listings.
    hidden: Vec<(String, u64)>,
    latency: Duration,
    calls: Vec<(OpKind, u64)>,
    injected: u64,
}

impl State {
    /// Counts the call and returns the mode of the fault that fires, if any.
    fn on_call(&mut self, kind: OpKind, path: &str) -> Option<FaultMode> {
        self.on_timed_call(kind, path).map(|(mode, _)| mode)
    }

    /// [`State::on_call`], with the fired fault's delay.
    fn on_timed_call(&mut self, kind: OpKind, path: &str) -> Option<(FaultMode, Duration)> {
        match self.calls.iter_mut().find(|(k, _)| *k == kind) {
            Some((_, n)) => *n += 1,
            None => self.calls.push((kind, 1)),
        }
        let mut fired = None;
        for (fault, seen) in &mut self.faults {
            let matches = fault.kind == kind
                && fault
                    .path_contains
                    .as_deref()
                    .is_none_or(|needle| path.contains(needle));
            if !matches {
                continue;
            }
            *seen += 1;
            if fired.is_none() && *seen >= fault.nth && *seen - fault.nth < fault.times {
                fired = Some((fault.mode, fault.delay));
            }
        }
        if fired.is_some() {
            self.injected += 1;
        }
        fired
    }
}

/// Wraps a store and injects the configured faults. Cheap to clone handles
/// via `Arc`; rules can change while the store is in use.
#[derive(Debug)]
pub struct FaultyStore {
    inner: Arc<dyn ObjectStore>,
    state: Arc<Mutex<State>>,
}

impl FaultyStore {
    /// A wrapper with no faults and no latency.
    pub fn new(inner: Arc<dyn ObjectStore>) -> Arc<Self> {
        Arc::new(Self {
            inner,
            state: Default::default(),
        })
    }

    /// Adds a rule.
    pub fn inject(&self, fault: Fault) {
        self.lock().faults.push((fault, 0));
    }

    /// Removes every rule and gate (calls already held stay held until their
    /// gate opens; latency stays).
    pub fn clear(&self) {
        let mut state = self.lock();
        state.faults.clear();
        state.gates.clear();
    }

    /// Holds calls of `kind` whose path contains `path_contains` until the
    /// returned gate is opened or dropped.
    pub fn gate(&self, kind: OpKind, path_contains: impl Into<String>) -> Gate {
        let (open_tx, open_rx) = tokio::sync::watch::channel(false);
        let (arrived_tx, arrived_rx) = tokio::sync::watch::channel(0);
        self.lock().gates.push(GateRule {
            kind,
            path_contains: path_contains.into(),
            open: open_rx,
            arrived: arrived_tx,
        });
        Gate {
            open: open_tx,
            arrived: arrived_rx,
        }
    }

    /// Leaves objects whose paths contain `needle` out of the next
    /// `listings` listings, as a listing of a local directory can miss a
    /// file renamed into it while it runs (it is no snapshot).
    pub fn hide_from_listings(&self, needle: impl Into<String>, listings: u64) {
        self.lock().hidden.push((needle.into(), listings));
    }

    /// Adds `latency` before every call.
    pub fn set_latency(&self, latency: Duration) {
        self.lock().latency = latency;
    }

    /// How many calls of `kind` were made so far (failed ones included).
    pub fn calls(&self, kind: OpKind) -> u64 {
        let state = self.lock();
        state
            .calls
            .iter()
            .find(|(k, _)| *k == kind)
            .map_or(0, |(_, n)| *n)
    }

    /// How many calls matched the rules (kind and path) so far, over all
    /// rules: with one rule that never fires, how many calls it could
    /// target.
    pub fn matched_calls(&self) -> u64 {
        self.lock().faults.iter().map(|(_, seen)| seen).sum()
    }

    /// How many faults fired so far.
    pub fn injected(&self) -> u64 {
        self.lock().injected
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().expect("fault state poisoned")
    }

    async fn enter(&self, kind: OpKind, path: &Path) -> Option<FaultMode> {
        let (latency, mode, gates) = {
            let mut state = self.lock();
            let gates: Vec<_> = state
                .gates
                .iter()
                .filter(|g| g.kind == kind && path.as_ref().contains(&g.path_contains))
                .map(|g| {
                    g.arrived.send_modify(|n| *n += 1);
                    g.open.clone()
                })
                .collect();
            (
                state.latency,
                state.on_timed_call(kind, path.as_ref()),
                gates,
            )
        };
        for mut open in gates {
            // A dropped gate (or cleared rules) lets the call through.
            let _ = open.wait_for(|open| *open).await;
        }
        let delay = mode.map_or(Duration::ZERO, |(_, delay)| delay);
        if !(latency + delay).is_zero() {
            tokio::time::sleep(latency + delay).await;
        }
        let mode = mode.map(|(mode, _)| mode);
        if mode == Some(FaultMode::Panic) {
            panic!("injected {kind:?} panic on {path}");
        }
        mode
    }
}

/// A multipart upload of a [`FaultyStore`]: each part counts as an
/// [`OpKind::Put`] call on the upload's path (faults only: no gate, no
/// latency), after the one that started the upload.
#[derive(Debug)]
struct FaultyUpload {
    inner: Box<dyn MultipartUpload>,
    state: Arc<Mutex<State>>,
    path: Path,
}

#[async_trait]
impl MultipartUpload for FaultyUpload {
    fn put_part(&mut self, data: PutPayload) -> object_store::UploadPart {
        let fired = self
            .state
            .lock()
            .expect("fault state poisoned")
            .on_call(OpKind::Put, self.path.as_ref());
        let err = |mode| injected(OpKind::Put, &self.path, mode);
        match fired {
            None => self.inner.put_part(data),
            Some(FaultMode::Panic) => panic!("injected Put panic on a part of {}", self.path),
            Some(FaultMode::Before | FaultMode::Garbled) => {
                let err = err(FaultMode::Before);
                Box::pin(async move { Err(err) })
            }
            Some(FaultMode::After | FaultMode::Retried) => {
                let (part, err) = (self.inner.put_part(data), err(FaultMode::After));
                Box::pin(async move {
                    part.await?;
                    Err(err)
                })
            }
        }
    }

    async fn complete(&mut self) -> object_store::Result<PutResult> {
        let fired = self
            .state
            .lock()
            .expect("fault state poisoned")
            .on_call(OpKind::Complete, self.path.as_ref());
        match fired {
            None => self.inner.complete().await,
            Some(FaultMode::Panic) => panic!("injected Complete panic on {}", self.path),
            Some(FaultMode::Before | FaultMode::Garbled) => {
                Err(injected(OpKind::Complete, &self.path, FaultMode::Before))
            }
            Some(mode) => {
                self.inner.complete().await?;
                Err(injected(OpKind::Complete, &self.path, mode))
            }
        }
    }

    async fn abort(&mut self) -> object_store::Result<()> {
        self.inner.abort().await
    }
}

fn injected(kind: OpKind, path: &Path, mode: FaultMode) -> object_store::Error {
    let when = match mode {
        FaultMode::Before | FaultMode::Garbled => "before the operation",
        FaultMode::After | FaultMode::Retried => "after the operation took effect",
        FaultMode::Panic => unreachable!("a panicking call panics in `enter`"),
    };
    object_store::Error::Generic {
        store: "FaultyStore",
        source: format!("injected {kind:?} fault on {path} ({when})").into(),
    }
}

/// `bytes` with one bit of its middle byte flipped (none if it is empty).
fn garble(bytes: Bytes) -> Bytes {
    let mut garbled = bytes.to_vec();
    if let Some(byte) = garbled.get_mut(bytes.len() / 2) {
        *byte ^= 0x10;
    }
    garbled.into()
}

/// A response body cut short, as the HTTP client reports it: naming no
/// object.
fn cut_body() -> object_store::Error {
    object_store::Error::Generic {
        store: "FaultyStore",
        source: "injected: request or response body error".into(),
    }
}

impl fmt::Display for FaultyStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "FaultyStore({})", self.inner)
    }
}

#[async_trait]
impl ObjectStore for FaultyStore {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        match self.enter(OpKind::Put, location).await {
            None => self.inner.put_opts(location, payload, opts).await,
            Some(FaultMode::Panic) => unreachable!("it panicked in `enter`"),
            Some(FaultMode::Before | FaultMode::Garbled) => {
                Err(injected(OpKind::Put, location, FaultMode::Before))
            }
            Some(FaultMode::After) => {
                self.inner.put_opts(location, payload, opts).await?;
                Err(injected(OpKind::Put, location, FaultMode::After))
            }
            Some(FaultMode::Retried) => {
                self.inner
                    .put_opts(location, payload.clone(), opts.clone())
                    .await?;
                self.inner.put_opts(location, payload, opts).await
            }
        }
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        match self.enter(OpKind::Put, location).await {
            Some(mode) => Err(injected(OpKind::Put, location, mode)),
            None => Ok(Box::new(FaultyUpload {
                inner: self.inner.put_multipart_opts(location, opts).await?,
                state: Arc::clone(&self.state),
                path: location.clone(),
            })),
        }
    }

    async fn get_opts(
        &self,
        location: &Path,
        options: GetOptions,
    ) -> object_store::Result<GetResult> {
        let kind = if options.head {
            OpKind::Head
        } else {
            OpKind::Get
        };
        match self.enter(kind, location).await {
            Some(FaultMode::After | FaultMode::Retried) if kind == OpKind::Get => {
                let mut got = self.inner.get_opts(location, options).await?;
                got.payload =
                    GetResultPayload::Stream(futures::stream::iter([Err(cut_body())]).boxed());
                Ok(got)
            }
            Some(FaultMode::Garbled) if kind == OpKind::Get => {
                let got = self.inner.get_opts(location, options).await?;
                let (meta, range, attributes) =
                    (got.meta.clone(), got.range.clone(), got.attributes.clone());
                let garbled = futures::stream::iter([Ok(garble(got.bytes().await?))]);
                Ok(GetResult {
                    payload: GetResultPayload::Stream(garbled.boxed()),
                    meta,
                    range,
                    attributes,
                })
            }
            Some(mode) => Err(injected(kind, location, mode)),
            None => self.inner.get_opts(location, options).await,
        }
    }

    async fn get_ranges(
        &self,
        location: &Path,
        ranges: &[std::ops::Range<u64>],
    ) -> object_store::Result<Vec<Bytes>> {
        match self.enter(OpKind::Get, location).await {
            Some(FaultMode::After | FaultMode::Retried) => {
                self.inner.get_ranges(location, ranges).await?;
                Err(cut_body())
            }
            Some(FaultMode::Garbled) => {
                let mut got = self.inner.get_ranges(location, ranges).await?;
                if let Some(first) = got.iter_mut().find(|b| !b.is_empty()) {
                    *first = garble(first.clone());
                }
                Ok(got)
            }
            Some(mode) => Err(injected(OpKind::Get, location, mode)),
            None => self.inner.get_ranges(location, ranges).await,
        }
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, object_store::Result<Path>>,
    ) -> BoxStream<'static, object_store::Result<Path>> {
        let this = Self {
            inner: Arc::clone(&self.inner),
            state: Arc::clone(&self.state),
        };
        let this = Arc::new(this);
        locations
            .then(move |location| {
                let this = Arc::clone(&this);
                async move {
                    let location = location?;
                    match this.enter(OpKind::Delete, &location).await {
                        None => this.inner.delete(&location).await.map(|_| location),
                        Some(FaultMode::Panic) => unreachable!("it panicked in `enter`"),
                        Some(FaultMode::Before | FaultMode::Garbled) => {
                            Err(injected(OpKind::Delete, &location, FaultMode::Before))
                        }
                        Some(FaultMode::After | FaultMode::Retried) => {
                            this.inner.delete(&location).await?;
                            Err(injected(OpKind::Delete, &location, FaultMode::After))
                        }
                    }
                }
            })
            .boxed()
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        let this = Self {
            inner: Arc::clone(&self.inner),
            state: Arc::clone(&self.state),
        };
        let prefix = prefix.cloned();
        futures::stream::once(async move {
            let at = prefix.clone().unwrap_or_default();
            if let Some(mode) = this.enter(OpKind::List, &at).await {
                return futures::stream::once(
                    async move { Err(injected(OpKind::List, &at, mode)) },
                )
                .boxed();
            }
            let hidden: Vec<String> = {
                let mut state = this.lock();
                state.hidden.retain(|(_, left)| *left > 0);
                state
                    .hidden
                    .iter_mut()
                    .map(|(needle, left)| {
                        *left -= 1;
                        needle.clone()
                    })
                    .collect()
            };
            this.inner
                .list(prefix.as_ref())
                .try_filter(move |meta| {
                    let path = meta.location.as_ref();
                    futures::future::ready(!hidden.iter().any(|n| path.contains(n.as_str())))
                })
                .boxed()
        })
        .flatten()
        .boxed()
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> object_store::Result<ListResult> {
        let at = prefix.cloned().unwrap_or_default();
        match self.enter(OpKind::List, &at).await {
            Some(mode) => Err(injected(OpKind::List, &at, mode)),
            None => self.inner.list_with_delimiter(prefix).await,
        }
    }

    async fn copy_opts(
        &self,
        from: &Path,
        to: &Path,
        options: CopyOptions,
    ) -> object_store::Result<()> {
        match self.enter(OpKind::Copy, to).await {
            None => self.inner.copy_opts(from, to, options).await,
            Some(FaultMode::Panic) => unreachable!("it panicked in `enter`"),
            Some(FaultMode::Before | FaultMode::Garbled) => {
                Err(injected(OpKind::Copy, to, FaultMode::Before))
            }
            Some(FaultMode::After | FaultMode::Retried) => {
                self.inner.copy_opts(from, to, options).await?;
                Err(injected(OpKind::Copy, to, FaultMode::After))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use object_store::memory::InMemory;

    #[tokio::test]
    async fn fails_the_nth_call_and_after_write_still_writes() {
        let store = FaultyStore::new(Arc::new(InMemory::new()));
        store.inject(Fault::nth(OpKind::Put, 2));
        store.inject(Fault::nth(OpKind::Put, 3).after_write());
        let p = |s: &str| Path::from(s);
        assert!(
            store
                .put(&p("a"), PutPayload::from_static(b"1"))
                .await
                .is_ok()
        );
        let err = store.put(&p("b"), PutPayload::from_static(b"1")).await;
        assert!(
            err.unwrap_err()
                .to_string()
                .contains("before the operation")
        );
        assert!(
            store.head(&p("b")).await.is_err(),
            "a failed-before put wrote"
        );
        let err = store.put(&p("c"), PutPayload::from_static(b"1")).await;
        assert!(err.unwrap_err().to_string().contains("after the operation"));
        assert!(
            store.head(&p("c")).await.is_ok(),
            "an after-write put did not write"
        );
        assert!(
            store
                .put(&p("d"), PutPayload::from_static(b"1"))
                .await
                .is_ok()
        );
        assert_eq!(store.calls(OpKind::Put), 4);
        assert_eq!(store.injected(), 2);
    }

    #[tokio::test]
    async fn fails_listings_and_filters_by_path() {
        let store = FaultyStore::new(Arc::new(InMemory::new()));
        store.inject(Fault::nth(OpKind::List, 1));
        store.inject(Fault::nth(OpKind::Get, 1).on_paths_containing("secret"));
        store
            .put(&Path::from("x"), PutPayload::from_static(b"1"))
            .await
            .unwrap();
        store
            .put(&Path::from("secret"), PutPayload::from_static(b"1"))
            .await
            .unwrap();
        let first: Vec<_> = store.list(None).collect().await;
        assert!(first[0].is_err());
        let second: Vec<_> = store.list(None).collect().await;
        assert_eq!(second.len(), 2);
        assert!(store.get(&Path::from("x")).await.is_ok());
        assert!(store.get(&Path::from("secret")).await.is_err());
        assert!(store.get(&Path::from("secret")).await.is_ok());
    }
}
