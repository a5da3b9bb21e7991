//! Versioned copy-on-write objects: the one commit primitive (DESIGN.md §4).
//!
//! A versioned object is a directory of immutable versions
//! `v<20 digits>.<ext>` plus a best-effort `_hint` naming a recent version.
//!
//! Invariants this module keeps:
//! - **One winner per version.** Version N+1 is only ever created with
//!   put-if-absent, so of any number of writers that build on version N,
//!   exactly one commits N+1; the others see `Taken`, reload the tip, rebase
//!   their change on it and retry (jittered exponential backoff, for at
//!   least [`CommitOptions::retry_budget`] attempts and
//!   [`CommitOptions::retry_for`], then [`Error::CommitConflict`]).
//! - **Ambiguous writes are resolved before anything is retried.** When a
//!   put fails with anything but "already exists", the version is read back:
//!   our bytes there means we committed; other bytes means we lost the race;
//!   nothing there means the write has not landed and the same version is
//!   tried again (the same bytes: a retry that lands first leaves a late
//!   original only "already exists"). A write that failed slowly (timed
//!   out) may still land after the read-back: past its retries, its
//!   outcome is [`Error::CommitOutcomeUnknown`], as when the read-back
//!   fails too; never "not written". Encoders must make every attempt's
//!   bytes unique (the catalog embeds a random commit id), or two writers of
//!   identical bytes could not be told apart.
//! - **The tip is always found.** Readers start from the larger of what they
//!   know and the hint, then probe forward until a version is missing. A
//!   hint that is stale, missing, garbage or points at a collected version
//!   falls back to a listing. A failed hint write is never an error.
//! - **A version number is never used twice.** Garbage collection keeps the
//!   newest [`CommitOptions::keep_versions`] (or, for versions kept as a
//!   log, [`VersionedObjects::into_log`], what their owner asks to
//!   [`VersionedObjects::collect`]) and empties older ones into
//!   0-byte tombstones instead of deleting them, so a stale writer's
//!   put-if-absent of a collected number still fails and it rebases. (With
//!   plain deletes, a writer that loaded version N long ago could create a
//!   collected N+1 "successfully" and its change would be lost.) Tombstones
//!   are deleted once older than [`CommitOptions::tombstone_ttl`] (by the
//!   store's clock, in a sweep); a writer whose base was last confirmed as
//!   the tip more than half that long ago re-reads the tip before it writes,
//!   and a write that landed that late counts only if it is the tip, so it
//!   never commits into a number whose tombstone may be gone.
//! - **Collection never fails a reader.** A reader that finds a tombstone (or
//!   nothing) where it resolved the tip re-resolves the tip and loads that.
//!   A tombstone with no version after it is damage, not collection (the
//!   newest versions are never collected): [`Error::Corrupt`].
//! - **A damaged or misplaced version is an error, never another state.**
//!   Every version ends with a trailer: its version number and the CRC-32
//!   of its directory, number and body ([`seal`]). A version that fails the
//!   check (a flipped bit, a truncation, a copy of another version or of
//!   another object's version) is [`Error::Corrupt`] naming it. (Versions
//!   written before the trailer existed are read as they are.)

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutPayload};

use crate::error::{Error, Result};
use crate::store::{AfterFailure, SameBytesRetries, paths, read_checked};

/// Knobs of the commit protocol. The defaults suit local disks and S3 alike.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct CommitOptions {
    /// Attempts at committing one change before [`Error::CommitConflict`]
    /// (default 20), once [`CommitOptions::retry_for`] has passed too.
    pub retry_budget: u32,
    /// How long a change keeps trying after lost races, whatever its
    /// attempts (default 30 s): on a store whose requests take tens of
    /// milliseconds, many processes committing at once take turns slowly,
    /// and a change waits for its turn rather than fail.
    pub retry_for: Duration,
    /// First backoff after losing a race (default 1 ms); doubles per attempt.
    pub backoff_base: Duration,
    /// Ceiling of the backoff (default 500 ms).
    pub backoff_max: Duration,
    /// Retries of one version write that failed without landing (default
    /// 3), if it failed within a second: the store's client already
    /// retried a slower failure, within its timeout.
    pub transient_retries: u32,
    /// Versions kept by garbage collection, newest first (default 5).
    pub keep_versions: u64,
    /// How long the tombstone of a collected version stays (default 10 min).
    /// A writer re-checks that its base is still the tip when it was last
    /// confirmed more than half of this ago, and a version that landed more
    /// than half of this after its base was confirmed counts only if it is
    /// the tip (otherwise its outcome is unknown), so no stale writer ever
    /// commits into a collected number, however long its requests take.
    pub tombstone_ttl: Duration,
    /// Every this many versions a committer lists the directory and
    /// deletes expired tombstones other handles left behind (short-lived
    /// or crashed ones) and empties old versions a crashed committer left
    /// with content (default 16,384; each handle deletes the tombstones it
    /// made itself without a listing). With few commits per handle (shard
    /// manifests, written by short-lived writers) a small value keeps the
    /// directory small.
    pub sweep_every: u64,
}

impl Default for CommitOptions {
    fn default() -> Self {
        Self {
            retry_budget: 20,
            retry_for: Duration::from_secs(30),
            backoff_base: Duration::from_millis(1),
            backoff_max: Duration::from_millis(500),
            transient_retries: 3,
            keep_versions: 5,
            tombstone_ttl: Duration::from_secs(600),
            sweep_every: 16_384,
        }
    }
}

impl CommitOptions {
    /// The backoff before attempt `attempt` (1-based): "full jitter", a
    /// uniform draw below an exponentially growing, capped ceiling. The wide
    /// spread keeps many losers of one race from colliding again.
    pub fn backoff(&self, attempt: u32) -> Duration {
        let ceiling = self
            .backoff_base
            .saturating_mul(1u32 << attempt.min(16))
            .min(self.backoff_max);
        ceiling.mul_f64(rand::random::<f64>())
    }
}

/// Last bytes of every sealed version.
const SEAL_MAGIC: &[u8; 4] = b"MWV2";
/// Nonce (u64), version number (u64), CRC-32 (u32), magic, little-endian.
const SEAL_LEN: usize = 24;
/// The trailer of versions written before the nonce: version number,
/// CRC-32, magic.
const SEAL_MAGIC_V1: &[u8; 4] = b"MWV1";
const SEAL_LEN_V1: usize = 16;

/// `body` as stored as version `version` in `dir`: followed by a random
/// nonce, the version number and a CRC-32 over `dir`, the number, the
/// nonce and `body`. The nonce makes the bytes of every write unique, so
/// a writer that finds a version equal to its own bytes knows the write
/// landed (see [`VersionedObjects::put_version`]), even where another
/// writer made the same change at the same time.
pub fn seal(dir: &Path, version: u64, body: &[u8]) -> Bytes {
    let nonce: u64 = rand::random();
    let mut out = Vec::with_capacity(body.len() + SEAL_LEN);
    out.extend_from_slice(body);
    out.extend_from_slice(&nonce.to_le_bytes());
    out.extend_from_slice(&version.to_le_bytes());
    out.extend_from_slice(&seal_crc(dir, version, Some(nonce), body).to_le_bytes());
    out.extend_from_slice(SEAL_MAGIC);
    out.into()
}

fn seal_crc(dir: &Path, version: u64, nonce: Option<u64>, body: &[u8]) -> u32 {
    let mut crc = crc32fast::Hasher::new();
    crc.update(dir.as_ref().as_bytes());
    crc.update(&version.to_le_bytes());
    if let Some(nonce) = nonce {
        crc.update(&nonce.to_le_bytes());
    }
    crc.update(body);
    crc.finalize()
}

/// The body of version `version` in `dir` read from `path`, checked (see
/// [`seal`]; versions sealed without a nonce are read too); bytes without
/// a trailer are returned whole (written before versions were sealed).
pub fn unseal(dir: &Path, version: u64, path: &Path, bytes: Bytes) -> Result<Bytes> {
    let (body_len, nonce, trailer) = if bytes.len() >= SEAL_LEN && bytes.ends_with(SEAL_MAGIC) {
        let body_len = bytes.len() - SEAL_LEN;
        let nonce = u64::from_le_bytes(bytes[body_len..body_len + 8].try_into().expect("8 bytes"));
        (body_len, Some(nonce), &bytes[body_len + 8..])
    } else if bytes.len() >= SEAL_LEN_V1 && bytes.ends_with(SEAL_MAGIC_V1) {
        let body_len = bytes.len() - SEAL_LEN_V1;
        (body_len, None, &bytes[body_len..])
    } else {
        return Ok(bytes);
    };
    let stored_version = u64::from_le_bytes(trailer[..8].try_into().expect("8 bytes"));
    let stored_crc = u32::from_le_bytes(trailer[8..12].try_into().expect("4 bytes"));
    let corrupt = |reason: String| Error::Corrupt {
        path: path.to_string(),
        reason,
    };
    if stored_crc != seal_crc(dir, stored_version, nonce, &bytes[..body_len]) {
        return Err(corrupt("checksum mismatch: the version is damaged".into()));
    }
    if stored_version != version {
        return Err(corrupt(format!(
            "holds version {stored_version}, not {version}: a copy of another version"
        )));
    }
    Ok(bytes.slice(..body_len))
}

/// What became of one put-if-absent of a version.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PutOutcome {
    /// Our bytes are that version now.
    Written,
    /// Another writer's bytes are that version.
    Taken,
}

/// What a version's name holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Slot {
    /// Nothing: never written (past the tip), or collected long ago.
    Absent,
    /// A tombstone: the version was collected.
    Collected,
    /// The version's body.
    Version(Bytes),
}

/// A decoded state together with the version it was read from (0: the
/// object has no version yet) and when that version was last known to be
/// the tip.
#[derive(Debug)]
pub struct Versioned<S> {
    pub version: u64,
    pub state: Arc<S>,
    checked_at: Instant,
}

impl<S> Versioned<S> {
    /// `state` as of `version`, known to be the tip now.
    pub fn new(version: u64, state: Arc<S>) -> Self {
        Self {
            version,
            state,
            checked_at: Instant::now(),
        }
    }

    /// Records that `version` was confirmed to be the tip just now.
    pub fn confirmed(mut self) -> Self {
        self.checked_at = Instant::now();
        self
    }
}

impl<S> Clone for Versioned<S> {
    fn clone(&self) -> Self {
        Self {
            version: self.version,
            state: Arc::clone(&self.state),
            checked_at: self.checked_at,
        }
    }
}

/// The versions of one copy-on-write object in one directory.
#[derive(Debug, Clone)]
pub struct VersionedObjects {
    store: Arc<dyn ObjectStore>,
    dir: Path,
    ext: &'static str,
    options: CommitOptions,
    /// Tombstones this handle made, oldest first, to delete once expired.
    tombstones: Arc<std::sync::Mutex<std::collections::VecDeque<(u64, Instant)>>>,
    /// Whether a commit writes the hint and collects old versions (see
    /// [`VersionedObjects::into_log`]).
    collects: bool,
    /// Those follow-ups of commits made through this handle (and its
    /// clones) that may still run (see [`VersionedObjects::settle`]).
    follow_ups: Arc<std::sync::Mutex<Vec<tokio::task::JoinHandle<()>>>>,
}

/// How often a reader re-resolves the tip when versions vanish under it.
const RELOAD_ATTEMPTS: u32 = 50;

impl VersionedObjects {
    /// The versioned object whose versions are `<dir>/v<N>.<ext>`.
    pub fn new(
        store: Arc<dyn ObjectStore>,
        dir: Path,
        ext: &'static str,
        options: CommitOptions,
    ) -> Self {
        Self {
            store,
            dir,
            ext,
            options,
            tombstones: Default::default(),
            collects: true,
            follow_ups: Default::default(),
        }
    }

    /// The same versions kept as a log whose owner reads them in order and
    /// collects them itself ([`VersionedObjects::collect`]): a commit writes
    /// one object, no hint, and collects nothing.
    pub fn into_log(mut self) -> Self {
        self.collects = false;
        self
    }

    /// The directory of the versions.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The path of version `version`.
    pub fn path_of(&self, version: u64) -> Path {
        paths::version_file(&self.dir, version, self.ext)
    }

    /// Whether version `version` exists (a tombstone counts).
    pub async fn exists(&self, version: u64) -> Result<bool> {
        Ok(self.size(version).await?.is_some())
    }

    /// Whether `base` was confirmed as the tip more than half the tombstone
    /// TTL ago: too long to trust that its successor, if collected, still
    /// has its tombstone (see the module doc).
    pub fn is_stale<S>(&self, base: &Versioned<S>) -> bool {
        base.checked_at.elapsed() > self.options.tombstone_ttl / 2
    }

    /// Whether a version after `base` exists. While `base` was confirmed as
    /// the tip less than half the tombstone TTL ago this is one existence
    /// check (a successor made since cannot have lost its tombstone yet);
    /// after that the tip is resolved in full, since N+1 may be gone.
    pub async fn has_newer<S>(&self, base: &Versioned<S>) -> Result<bool> {
        if !self.is_stale(base) {
            self.exists(base.version + 1).await
        } else {
            Ok(self.latest_version(base.version).await? > base.version)
        }
    }

    /// Reads one version's body, checked (see [`seal`]); `None` if it does
    /// not exist (never written, or collected: a tombstone is empty).
    pub async fn read(&self, version: u64) -> Result<Option<Bytes>> {
        Ok(self.read_body(version).await?.filter(|b| !b.is_empty()))
    }

    /// What is stored at a version's name, its body checked (see [`seal`]).
    pub async fn slot(&self, version: u64) -> Result<Slot> {
        Ok(match self.read_body(version).await? {
            None => Slot::Absent,
            Some(bytes) if bytes.is_empty() => Slot::Collected,
            Some(bytes) => Slot::Version(bytes),
        })
    }

    /// The object at a version's name, its body checked and read once more
    /// if it fails the check (see [`read_checked`]): `None` if absent,
    /// empty if a tombstone.
    async fn read_body(&self, version: u64) -> Result<Option<Bytes>> {
        let path = self.path_of(version);
        read_checked(
            || self.read_slot(version),
            |stored: Option<Bytes>| match stored {
                Some(bytes) if !bytes.is_empty() => {
                    unseal(&self.dir, version, &path, bytes).map(Some)
                }
                other => Ok(other),
            },
        )
        .await
    }

    /// The size of what is stored at a version's name (0: collected), or
    /// `None` if nothing is.
    pub async fn size(&self, version: u64) -> Result<Option<u64>> {
        match self.store.head(&self.path_of(version)).await {
            Ok(meta) => Ok(Some(meta.size)),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// The object at a version's name: `None` if absent, empty if a tombstone.
    async fn read_slot(&self, version: u64) -> Result<Option<Bytes>> {
        match self.store.get(&self.path_of(version)).await {
            Ok(got) => Ok(Some(got.bytes().await?)),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    async fn read_hint(&self) -> Option<u64> {
        let got = self.store.get(&paths::hint_file(&self.dir)).await.ok()?;
        let bytes = got.bytes().await.ok()?;
        std::str::from_utf8(&bytes).ok()?.trim().parse().ok()
    }

    /// Every version present (tombstones included), ascending, with its
    /// size and age.
    async fn list_metas(&self) -> Result<Vec<(u64, object_store::ObjectMeta)>> {
        let mut versions: Vec<_> = self
            .store
            .list(Some(&self.dir))
            .map_ok(|meta| {
                // Not what lies in directories below.
                let here = meta.location.as_ref().rsplit_once('/').map(|(dir, _)| dir)
                    == Some(self.dir.as_ref());
                let version = meta
                    .location
                    .filename()
                    .and_then(|name| paths::parse_version_file(name, self.ext));
                version.filter(|_| here).map(|v| (v, meta))
            })
            .try_filter_map(|v| async move { Ok(v) })
            .try_collect()
            .await?;
        versions.sort_unstable_by_key(|(v, _)| *v);
        Ok(versions)
    }

    /// Every version present (tombstones included), ascending, with its
    /// size in bytes.
    pub async fn list_sizes(&self) -> Result<Vec<(u64, u64)>> {
        Ok(self
            .list_metas()
            .await?
            .into_iter()
            .map(|(v, meta)| (v, meta.size))
            .collect())
    }

    /// Every version number present (tombstones included), ascending.
    pub async fn list_versions(&self) -> Result<Vec<u64>> {
        Ok(self
            .list_metas()
            .await?
            .into_iter()
            .map(|(v, _)| v)
            .collect())
    }

    /// The newest version (0 if none), starting from `known` (a version the
    /// caller has seen; 0 if none) or the hint, whichever is larger.
    pub async fn latest_version(&self, known: u64) -> Result<u64> {
        let start = self.read_hint().await.unwrap_or(0).max(known);
        self.tip_from(start).await
    }

    /// The newest version, from `start` (a version thought to exist, or 0).
    async fn tip_from(&self, start: u64) -> Result<u64> {
        let mut tip = if start > 0 && self.exists(start).await? {
            start
        } else {
            // No hint, or one past the tip or at a collected version: list.
            self.list_versions().await?.last().copied().unwrap_or(0)
        };
        while self.exists(tip + 1).await? {
            tip += 1;
        }
        Ok(tip)
    }

    /// Loads and decodes the newest version at or after `known`; a state of
    /// `S::default()` at version 0 if there is none.
    pub async fn load_latest<S: Default>(
        &self,
        known: u64,
        decode: impl Fn(&Path, Bytes) -> Result<S>,
    ) -> Result<Versioned<S>> {
        // Most often the hint names the tip: its body and the absence of
        // the version after it, asked at once. Whichever answer came
        // first, the version read was the tip at some moment in between.
        let hinted = self.read_hint().await.unwrap_or(0).max(known);
        if hinted > 0 {
            let (body, newer) = futures::join!(self.read(hinted), self.exists(hinted + 1));
            if !newer? && let Some(bytes) = body? {
                let state = decode(&self.path_of(hinted), bytes)?;
                return Ok(Versioned::new(hinted, Arc::new(state)));
            }
        }
        for attempt in 0..RELOAD_ATTEMPTS {
            let version = match attempt {
                0 => self.tip_from(hinted).await?,
                _ => self.latest_version(known).await?,
            };
            if version == 0 {
                return Ok(Versioned::new(0, Arc::new(S::default())));
            }
            // A version collected between resolving and reading sends us
            // back to resolve the tip again.
            if let Some(bytes) = self.read(version).await? {
                let state = decode(&self.path_of(version), bytes)?;
                return Ok(Versioned::new(version, Arc::new(state)));
            }
            // Collection empties only versions with newer ones after them.
            if !self.exists(version + 1).await? && self.read_slot(version).await?.is_some() {
                return Err(Error::Corrupt {
                    path: self.path_of(version).to_string(),
                    reason: "the newest version is empty (damaged: collection never \
                             empties the newest version)"
                        .into(),
                });
            }
        }
        Err(Error::CommitConflict {
            what: format!("loading the newest version in {}", self.dir),
            attempts: RELOAD_ATTEMPTS,
        })
    }

    /// Creates `version` with `body` (sealed, see [`seal`]) if it does not
    /// exist yet, resolving ambiguous failures by reading the version back
    /// (see the module doc).
    pub async fn put_version(&self, version: u64, body: Bytes) -> Result<PutOutcome> {
        let path = self.path_of(version);
        let bytes = seal(&self.dir, version, &body);
        let mut failures = SameBytesRetries::new(self.options.transient_retries);
        loop {
            let payload = PutPayload::from_bytes(bytes.clone());
            let started = Instant::now();
            let err = match self
                .store
                .put_opts(&path, payload, PutMode::Create.into())
                .await
            {
                Ok(_) => return Ok(PutOutcome::Written),
                // "Exists" may be our own write, landed by an attempt whose
                // answer was lost (the client retries a PUT itself, and its
                // retry then meets the first one): read back below.
                Err(e) => Error::from(e),
            };
            let failed_after = started.elapsed();
            // What is there, its check passed (or a tombstone).
            let read_back = read_checked(
                || self.read_slot(version),
                |stored: Option<Bytes>| match stored {
                    Some(s) if !s.is_empty() => {
                        unseal(&self.dir, version, &path, s.clone()).map(|_| Some(s))
                    }
                    other => Ok(other),
                },
            );
            match read_back.await {
                Ok(Some(stored)) if stored == bytes => return Ok(PutOutcome::Written),
                // Damaged twice: it says nothing of whose version it is.
                Err(Error::Corrupt { .. }) => {
                    return Err(Error::CommitOutcomeUnknown {
                        path: path.to_string(),
                        write: err.to_string(),
                        read_back: "what is there fails its checksum".into(),
                    });
                }
                // Another writer's version, or its tombstone.
                Ok(Some(_)) => return Ok(PutOutcome::Taken),
                Ok(None) => match failures.failed(failed_after, err.to_string()) {
                    AfterFailure::Retry => {
                        log::debug!("retrying write of {path} after: {err}");
                        tokio::time::sleep(self.options.backoff(failures.failures())).await;
                    }
                    AfterFailure::Unknown(write) => {
                        return Err(Error::CommitOutcomeUnknown {
                            path: path.to_string(),
                            write,
                            read_back: "nothing there yet, but a write that timed out may \
                                        still land (the next commit of this version settles it)"
                                .into(),
                        });
                    }
                    AfterFailure::Failed => {
                        return Err(Error::NotWritten {
                            what: format!("the commit of {path}"),
                            cause: format!(
                                "{err} (attempts: {}; reading it back found nothing)",
                                failures.failures()
                            ),
                        });
                    }
                },
                Err(read_back) => {
                    return Err(Error::CommitOutcomeUnknown {
                        path: path.to_string(),
                        write: err.to_string(),
                        read_back: read_back.to_string(),
                    });
                }
            }
        }
    }

    /// Commits a change: `next` turns the current state into the next state
    /// and its encoding (or `None`: nothing to write). On a lost race the tip
    /// is reloaded with `decode` and `next` runs again on it (rebase).
    /// Returns the state now current (the base itself if `next` had nothing
    /// to write).
    pub async fn commit<S: Default>(
        &self,
        base: Versioned<S>,
        decode: impl Fn(&Path, Bytes) -> Result<S>,
        next: impl FnMut(&S) -> Result<Option<(S, Bytes)>>,
    ) -> Result<Versioned<S>> {
        let decode = &decode;
        let reload = |base: Versioned<S>, stale: bool| async move {
            // Too old to trust that N+1's tombstone (if any) still exists.
            if stale && !self.has_newer(&base).await? {
                return Ok(base.confirmed());
            }
            self.load_latest(base.version + 1, decode).await
        };
        self.commit_with(base, reload, next).await
    }

    /// [`VersionedObjects::commit`] for a state that is not read from one
    /// version alone: `reload(base, stale)` returns the tip, `base` being
    /// too old to trust (`stale`: more than half the tombstone TTL since it
    /// was confirmed) or its successor taken.
    pub async fn commit_with<S, F>(
        &self,
        mut base: Versioned<S>,
        mut reload: impl FnMut(Versioned<S>, bool) -> F,
        mut next: impl FnMut(&S) -> Result<Option<(S, Bytes)>>,
    ) -> Result<Versioned<S>>
    where
        F: std::future::Future<Output = Result<Versioned<S>>>,
    {
        let (mut attempt, started) = (0, Instant::now());
        loop {
            if self.is_stale(&base) {
                base = reload(base, true).await?;
            }
            let Some((state, bytes)) = next(&base.state)? else {
                return Ok(base);
            };
            let version = base.version + 1;
            let confirmed = base.checked_at;
            match self.put_version(version, bytes).await? {
                PutOutcome::Written => {
                    // Landed more than half a TTL after the base was the
                    // tip: the number may have been collected meanwhile, so
                    // the write counts only if it is the tip.
                    if confirmed.elapsed() > self.options.tombstone_ttl / 2 {
                        let tip = self.latest_version(version).await?;
                        if tip > version {
                            return Err(Error::CommitOutcomeUnknown {
                                path: self.path_of(version).to_string(),
                                write: format!(
                                    "it landed more than {:?} after its base was read, and version {tip} exists",
                                    self.options.tombstone_ttl / 2
                                ),
                                read_back: "the version may be one that was collected".into(),
                            });
                        }
                    }
                    self.after_commit(version);
                    return Ok(Versioned::new(version, Arc::new(state)));
                }
                PutOutcome::Taken => {
                    attempt += 1;
                    if attempt >= self.options.retry_budget
                        && started.elapsed() >= self.options.retry_for
                    {
                        return Err(Error::CommitConflict {
                            what: self.dir.to_string(),
                            attempts: attempt,
                        });
                    }
                    tokio::time::sleep(self.options.backoff(attempt)).await;
                    base = reload(base, false).await?;
                }
            }
        }
    }

    /// Starts the best-effort follow-ups of a commit, the hint and then
    /// garbage collection (see the module doc), on a task of their own:
    /// the commit does not wait for their requests (see
    /// [`VersionedObjects::settle`]).
    fn after_commit(&self, version: u64) {
        if !self.collects {
            return;
        }
        let this = self.clone();
        let follow_up = tokio::spawn(async move { this.hint_and_collect(version).await });
        let mut pending = self.follow_ups.lock().expect("follow-up list poisoned");
        pending.retain(|task| !task.is_finished());
        pending.push(follow_up);
    }

    /// Waits for the follow-ups of the commits made so far through this
    /// handle and its clones (before a process that made them ends).
    pub async fn settle(&self) {
        let pending =
            std::mem::take(&mut *self.follow_ups.lock().expect("follow-up list poisoned"));
        for follow_up in pending {
            let _ = follow_up.await;
        }
    }

    /// The follow-ups of the commit of `version`. Failures are logged,
    /// never returned: the commit already happened.
    async fn hint_and_collect(&self, version: u64) {
        let hint = PutPayload::from(version.to_string());
        if let Err(e) = self.store.put(&paths::hint_file(&self.dir), hint).await {
            log::debug!("hint write in {} failed: {e}", self.dir);
        }
        let keep = self.options.keep_versions.max(1);
        if version > keep {
            let oldest_kept = version + 1 - keep;
            self.collect(oldest_kept - 1..=oldest_kept - 1).await;
        }
    }

    /// Collects `versions` (each must have newer versions after it): empties
    /// them into tombstones, deletes this handle's expired tombstones, and,
    /// when the range reaches a multiple of
    /// [`CommitOptions::sweep_every`], lists the directory to empty older
    /// versions left with content and delete expired tombstones. Failures
    /// are logged and left to a later collection.
    pub async fn collect(&self, versions: std::ops::RangeInclusive<u64>) {
        let (first, last) = (*versions.start(), *versions.end());
        futures::stream::iter(versions)
            .for_each_concurrent(16, |v| self.tombstone(v))
            .await;
        let mut expired = Vec::new();
        {
            let mut own = self.tombstones.lock().expect("tombstone list poisoned");
            while let Some(&(v, at)) = own.front()
                && at.elapsed() > self.options.tombstone_ttl
            {
                expired.push(self.path_of(v));
                own.pop_front();
            }
        }
        self.delete_all(expired).await;
        let every = self.options.sweep_every.max(1);
        if first <= last && last / every != first.saturating_sub(1) / every {
            self.sweep(last).await;
        }
    }

    /// Lists the directory to empty the versions up to `last` left with
    /// content (those a collection skipped or did not finish) and to delete
    /// expired tombstones, whoever made them. Failures are logged and left
    /// to a later sweep.
    pub async fn sweep(&self, last: u64) {
        let metas = match self.list_metas().await {
            Ok(metas) => metas,
            Err(e) => {
                log::debug!("listing {} for collection failed: {e}", self.dir);
                return;
            }
        };
        // Ages by the store's clock: the newest version was just written.
        let Some(now_ms) = metas
            .last()
            .map(|(_, m)| m.last_modified.timestamp_millis())
        else {
            return;
        };
        let ttl_ms = self.options.tombstone_ttl.as_millis() as i64;
        let (mut full, mut expired) = (Vec::new(), Vec::new());
        for (v, meta) in metas.into_iter().take_while(|(v, _)| *v <= last) {
            if meta.size > 0 {
                full.push(v);
            } else if now_ms - meta.last_modified.timestamp_millis() > ttl_ms {
                expired.push(meta.location);
            }
        }
        futures::stream::iter(full)
            .for_each_concurrent(16, |v| self.tombstone(v))
            .await;
        self.delete_all(expired).await;
    }

    /// Deletes `paths` (in batches where the store takes them: a thousand
    /// a request on S3); failures are logged.
    async fn delete_all(&self, paths: Vec<Path>) {
        if paths.is_empty() {
            return;
        }
        let locations = futures::stream::iter(paths.into_iter().map(Ok)).boxed();
        self.store
            .delete_stream(locations)
            .for_each(|done| async move {
                match done {
                    Ok(_) | Err(object_store::Error::NotFound { .. }) => {}
                    Err(e) => log::debug!("deleting in {} failed: {e}", self.dir),
                }
            })
            .await;
    }

    /// Deletes `version` (for objects that are not a chain: see
    /// [`VersionedObjects::into_log`]); a failure is logged.
    pub async fn delete(&self, version: u64) {
        self.delete_all(vec![self.path_of(version)]).await;
    }

    /// Empties a collected version, keeping its number taken.
    async fn tombstone(&self, version: u64) {
        let path = self.path_of(version);
        match self.store.put(&path, PutPayload::new()).await {
            Ok(_) => self
                .tombstones
                .lock()
                .expect("tombstone list poisoned")
                .push_back((version, Instant::now())),
            Err(e) => log::debug!("collecting {path} failed: {e}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{Fault, FaultyStore, OpKind, QUICK_FAILURE};
    use object_store::memory::InMemory;

    /// A counter state: bytes are "<value>:<random id>" so each attempt's
    /// bytes are unique.
    fn encode(v: u64) -> Bytes {
        Bytes::from(format!("{v}:{:x}", rand::random::<u64>()))
    }

    fn decode(path: &Path, b: Bytes) -> Result<u64> {
        let corrupt = || Error::Corrupt {
            path: path.to_string(),
            reason: "not a counter".into(),
        };
        let s = std::str::from_utf8(&b).map_err(|_| corrupt())?;
        let (n, id) = s.split_once(':').ok_or_else(corrupt)?;
        if !id.bytes().all(|c| c.is_ascii_hexdigit()) {
            return Err(corrupt());
        }
        n.parse().map_err(|_| corrupt())
    }

    fn objects(store: Arc<dyn ObjectStore>) -> VersionedObjects {
        VersionedObjects::new(store, Path::from("m"), "txt", CommitOptions::default())
    }

    async fn increment(objs: &VersionedObjects) -> Result<Versioned<u64>> {
        let base = objs.load_latest(0, decode).await?;
        objs.commit(base, decode, |n| Ok(Some((n + 1, encode(n + 1)))))
            .await
    }

    #[tokio::test]
    async fn concurrent_increments_are_never_lost() {
        let objs = objects(Arc::new(InMemory::new()));
        let tasks: Vec<_> = (0..16)
            .map(|_| {
                let objs = objs.clone();
                tokio::spawn(async move {
                    for _ in 0..5 {
                        increment(&objs).await.unwrap();
                    }
                })
            })
            .collect();
        for t in tasks {
            t.await.unwrap();
        }
        objs.settle().await;
        let tip = objs.load_latest(0, decode).await.unwrap();
        assert_eq!(*tip.state, 80);
        assert_eq!(tip.version, 80);
        // Collection kept only the newest versions; the others are empty.
        let mut kept = 0;
        for v in objs.list_versions().await.unwrap() {
            kept += u64::from(objs.read(v).await.unwrap().is_some());
        }
        assert_eq!(kept, objs.options.keep_versions);
    }

    #[tokio::test]
    async fn a_stale_writer_rebases_instead_of_reusing_a_collected_version() {
        let objs = objects(Arc::new(InMemory::new()));
        increment(&objs).await.unwrap();
        let stale = objs.load_latest(0, decode).await.unwrap();
        for _ in 0..10 {
            increment(&objs).await.unwrap();
        }
        objs.settle().await;
        // Version 2 is collected now; the stale writer must not recreate it.
        assert!(objs.read(2).await.unwrap().is_none());
        let done = objs
            .commit(stale, decode, |n| Ok(Some((n + 1, encode(n + 1)))))
            .await
            .unwrap();
        assert_eq!((done.version, *done.state), (12, 12));
    }

    #[tokio::test]
    async fn a_long_idle_writer_rebases_even_after_tombstones_expired() {
        let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        let ttl = Duration::from_millis(20);
        let options = CommitOptions {
            tombstone_ttl: ttl,
            ..Default::default()
        };
        let idle =
            VersionedObjects::new(Arc::clone(&store), Path::from("m"), "txt", options.clone());
        let busy = VersionedObjects::new(store, Path::from("m"), "txt", options);
        increment(&idle).await.unwrap();
        let stale = idle.load_latest(0, decode).await.unwrap();
        for _ in 0..10 {
            increment(&busy).await.unwrap();
        }
        busy.settle().await;
        tokio::time::sleep(ttl * 3).await;
        // This commit deletes busy's expired tombstones, version 2's included.
        increment(&busy).await.unwrap();
        busy.settle().await;
        assert!(!busy.list_versions().await.unwrap().contains(&2));
        let done = idle
            .commit(stale, decode, |n| Ok(Some((n + 1, encode(n + 1)))))
            .await
            .unwrap();
        assert_eq!((done.version, *done.state), (13, 13));
    }

    #[tokio::test]
    async fn expired_tombstones_are_deleted() {
        let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        let options = |ttl| CommitOptions {
            tombstone_ttl: ttl,
            ..Default::default()
        };
        let dir = || Path::from("m");
        // A handle whose tombstones live long keeps every number taken...
        let keeper = VersionedObjects::new(
            Arc::clone(&store),
            dir(),
            "txt",
            options(Duration::from_secs(600)),
        );
        for _ in 0..20 {
            increment(&keeper).await.unwrap();
        }
        keeper.settle().await;
        assert_eq!(keeper.list_versions().await.unwrap().len(), 20);
        // ...one whose tombstones expire at once deletes its own right away.
        let quick = VersionedObjects::new(store, dir(), "txt", options(Duration::ZERO));
        for _ in 0..20 {
            increment(&quick).await.unwrap();
        }
        quick.settle().await;
        // The keeper's tombstones 1..=15 stay; the quick one's 16..=35 went.
        let left = quick.list_versions().await.unwrap();
        assert_eq!(left, (1..=15).chain(36..=40).collect::<Vec<_>>());
        assert_eq!(quick.latest_version(0).await.unwrap(), 40);
    }

    #[tokio::test]
    async fn damaged_copied_or_emptied_versions_are_named_errors() {
        let inner: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        let objs = objects(Arc::clone(&inner));
        for _ in 0..3 {
            increment(&objs).await.unwrap();
        }
        let tip = objs.path_of(3);
        let good = inner.get(&tip).await.unwrap().bytes().await.unwrap();
        let mut flipped = good.to_vec();
        flipped[0] ^= 0x10;
        let other_dir = seal(&Path::from("other"), 3, b"3:x");
        let damaged: [(&str, Bytes); 4] = [
            ("a flipped bit", flipped.into()),
            ("a truncation", good.slice(..good.len() - 3)),
            (
                "version 2's bytes",
                inner
                    .get(&objs.path_of(2))
                    .await
                    .unwrap()
                    .bytes()
                    .await
                    .unwrap(),
            ),
            ("another directory's version", other_dir),
        ];
        for (what, bytes) in damaged {
            inner.put(&tip, bytes.into()).await.unwrap();
            let err = objs.load_latest(0, decode).await.map(|v| v.version);
            // (A truncated trailer reads as an unsealed body, which the
            // decoder refuses.)
            match err {
                Err(Error::Corrupt { ref path, .. }) => assert_eq!(path, tip.as_ref(), "{what}"),
                other => panic!("{what}: {other:?}"),
            }
        }
        // An empty newest version is damage, not collection.
        inner.put(&tip, PutPayload::new()).await.unwrap();
        let err = objs.load_latest(0, decode).await.unwrap_err();
        assert!(
            matches!(err, Error::Corrupt { ref path, .. } if path == tip.as_ref()),
            "{err}"
        );
        // Versions before the seal existed are read as they are.
        inner.put(&tip, PutPayload::from("7:1e9acc")).await.unwrap();
        assert_eq!(*objs.load_latest(0, decode).await.unwrap().state, 7);
    }

    /// Versions sealed before the trailer carried a nonce are read, and
    /// checked, as they were; two seals of one body differ.
    #[tokio::test]
    async fn versions_sealed_without_a_nonce_are_read_and_checked() {
        let inner: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        let objs = objects(Arc::clone(&inner));
        increment(&objs).await.unwrap();
        let (dir, body) = (Path::from("m"), b"2:ab".as_slice());
        let mut v1 = body.to_vec();
        v1.extend_from_slice(&2u64.to_le_bytes());
        v1.extend_from_slice(&seal_crc(&dir, 2, None, body).to_le_bytes());
        v1.extend_from_slice(SEAL_MAGIC_V1);
        inner
            .put(&objs.path_of(2), v1.clone().into())
            .await
            .unwrap();
        assert_eq!(*objs.load_latest(0, decode).await.unwrap().state, 2);
        v1[0] ^= 0x04;
        inner.put(&objs.path_of(2), v1.into()).await.unwrap();
        assert!(matches!(
            objs.load_latest(0, decode).await,
            Err(Error::Corrupt { .. })
        ));
        assert_ne!(seal(&dir, 2, body), seal(&dir, 2, body));
    }

    #[tokio::test]
    async fn stale_missing_or_garbage_hints_still_find_the_tip() {
        let inner: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        let objs = objects(Arc::clone(&inner));
        for _ in 0..12 {
            increment(&objs).await.unwrap();
        }
        let hint = paths::hint_file(&Path::from("m"));
        for bad in ["3", "999", "garbage"] {
            inner.put(&hint, PutPayload::from(bad)).await.unwrap();
            assert_eq!(objs.latest_version(0).await.unwrap(), 12, "hint {bad}");
        }
        inner.delete(&hint).await.unwrap();
        assert_eq!(objs.latest_version(0).await.unwrap(), 12);
    }

    #[tokio::test]
    async fn ambiguous_write_that_landed_counts_once() {
        let faulty = FaultyStore::new(Arc::new(InMemory::new()));
        let objs = objects(faulty.clone());
        increment(&objs).await.unwrap();
        faulty.inject(
            Fault::nth(OpKind::Put, 1)
                .after_write()
                .on_paths_containing(".txt"),
        );
        let done = increment(&objs).await.unwrap();
        assert_eq!((done.version, *done.state), (2, 2));
        assert_eq!(faulty.injected(), 1);
        let tip = objs.load_latest(0, decode).await.unwrap();
        assert_eq!((tip.version, *tip.state), (2, 2));
    }

    #[tokio::test]
    async fn failed_write_is_retried_at_the_same_version() {
        let faulty = FaultyStore::new(Arc::new(InMemory::new()));
        let objs = objects(faulty.clone());
        faulty.inject(
            Fault::nth(OpKind::Put, 1)
                .times(2)
                .on_paths_containing(".txt"),
        );
        let done = increment(&objs).await.unwrap();
        assert_eq!((done.version, *done.state), (1, 1));
        assert_eq!(faulty.injected(), 2);
    }

    /// A write that failed slowly (a timeout: the store's client retried
    /// it already) may still land after it is read back: it is tried once
    /// more, which decides it, and then its outcome is unknown, never
    /// "not written" (found from outside: a DROP TABLE whose catalog PUT
    /// was held 2 s failed as not written, then took effect).
    #[tokio::test]
    async fn a_write_that_failed_slowly_is_tried_once_more_then_unknown() {
        for (failures, written) in [(1, true), (2, false)] {
            let faulty = FaultyStore::new(Arc::new(InMemory::new()));
            let objs = objects(faulty.clone());
            let base = objs.load_latest(0, decode).await.unwrap();
            faulty.inject(
                Fault::nth(OpKind::Put, 1)
                    .times(failures)
                    .on_paths_containing(".txt"),
            );
            faulty.set_latency(QUICK_FAILURE);
            let done = objs
                .commit(base, decode, |n| Ok(Some((n + 1, encode(n + 1)))))
                .await;
            assert_eq!(faulty.calls(OpKind::Put), 2);
            match done {
                Ok(done) => assert!(written && done.version == 1),
                Err(err) => assert!(
                    !written
                        && matches!(err, Error::CommitOutcomeUnknown { .. })
                        && err.to_string().contains("may still land"),
                    "{err}"
                ),
            }
        }
    }

    /// Found from outside over S3: a slow attempt, then quick failures,
    /// said nothing was written, and the slow one landed later.
    #[tokio::test]
    async fn quick_failures_after_a_slow_one_leave_the_outcome_unknown() {
        let faulty = FaultyStore::new(Arc::new(InMemory::new()));
        let objs = objects(faulty.clone());
        let base = objs.load_latest(0, decode).await.unwrap();
        // The first attempt fails slowly, the rest quickly.
        faulty.inject(Fault::nth(OpKind::Put, 1).slowly(QUICK_FAILURE));
        faulty.inject(Fault::nth(OpKind::Put, 2).times(u64::MAX));
        let err = objs
            .commit(base, decode, |n| Ok(Some((n + 1, encode(n + 1)))))
            .await
            .unwrap_err();
        assert!(faulty.calls(OpKind::Put) >= 2);
        assert!(matches!(err, Error::CommitOutcomeUnknown { .. }), "{err}");
        // The slow failure is said first: it is what leaves it unknown.
        let message = err.to_string();
        assert!(message.contains("); tried again: "), "{message}");
        assert!(message.contains("the next commit of this version settles it"));
    }

    /// A read-back that fails its checksum is no other writer's version:
    /// taken for one, the commit would rebase over its own version if
    /// that had landed and only its reading was damaged.
    #[tokio::test]
    async fn a_damaged_read_back_leaves_the_outcome_unknown() {
        let inner = Arc::new(InMemory::new());
        let faulty = FaultyStore::new(inner.clone());
        let objs = objects(faulty.clone());
        let base = objs.load_latest(0, decode).await.unwrap();
        let mut damaged = seal(&Path::from("m"), 1, &encode(1)).to_vec();
        damaged[0] ^= 0xff;
        inner
            .put(&objs.path_of(1), Bytes::from(damaged).into())
            .await
            .unwrap();
        let err = objs
            .commit(base, decode, |n| Ok(Some((n + 1, encode(n + 1)))))
            .await
            .unwrap_err();
        assert!(matches!(err, Error::CommitOutcomeUnknown { .. }), "{err}");
        assert!(err.to_string().contains("fails its checksum"), "{err}");
    }

    #[tokio::test]
    async fn unknown_outcome_is_reported_as_such() {
        let faulty = FaultyStore::new(Arc::new(InMemory::new()));
        let objs = objects(faulty.clone());
        faulty.inject(Fault::nth(OpKind::Put, 1).on_paths_containing(".txt"));
        faulty.inject(
            Fault::nth(OpKind::Get, 1)
                .times(u64::MAX)
                .on_paths_containing(".txt"),
        );
        let base = Versioned::new(0, Arc::new(0));
        let err = objs
            .commit(base, decode, |n| Ok(Some((n + 1, encode(n + 1)))))
            .await
            .unwrap_err();
        assert!(matches!(err, Error::CommitOutcomeUnknown { .. }), "{err}");
        assert!(err.to_string().contains("v00000000000000000001.txt"));
    }

    /// Commits one change against a competitor that wins the first `wins`
    /// races; the outcome and how many times the change was built.
    async fn racing(options: CommitOptions, wins: usize) -> (Result<Versioned<u64>>, usize) {
        let inner: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        let objs = VersionedObjects::new(Arc::clone(&inner), Path::from("m"), "txt", options);
        let competitor = objects(inner);
        let base = objs.load_latest(0, decode).await.unwrap();
        let mut calls = 0;
        let outcome = objs
            .commit(base, decode, |n| {
                calls += 1;
                if calls <= wins {
                    futures::executor::block_on(competitor.put_version(n + 1, encode(n + 1)))?;
                }
                Ok(Some((n + 1, encode(n + 1))))
            })
            .await;
        (outcome, calls)
    }

    #[tokio::test]
    async fn a_change_past_its_attempts_keeps_trying_for_its_time() {
        let options = CommitOptions {
            retry_budget: 2,
            retry_for: Duration::from_secs(60),
            ..Default::default()
        };
        let (committed, calls) = racing(options, 5).await;
        assert_eq!((calls, committed.unwrap().version), (6, 6));
    }

    #[tokio::test]
    async fn exhausted_budget_is_a_typed_conflict() {
        let options = CommitOptions {
            retry_budget: 3,
            retry_for: Duration::ZERO,
            ..Default::default()
        };
        // The competitor wins every race.
        let (err, calls) = racing(options, usize::MAX).await;
        let err = err.unwrap_err();
        assert!(
            matches!(err, Error::CommitConflict { attempts: 3, .. }),
            "{err}"
        );
        assert_eq!(calls, 3);
    }
}
