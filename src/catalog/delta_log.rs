//! The catalog's versions as a log of deltas over checkpoints.
//!
//! Version N+1 is committed through `VersionedObjects::commit_with` (the one
//! commit primitive) and holds only the changes it made to version N (a
//! delta, [`format::Stored::Delta`]). Now and then, in the background, a
//! process writes a checkpoint: the full state as of a version it
//! committed, under `__manifest/checkpoints/`. So:
//! - a commit writes one small object, whatever the catalog's size, and a
//!   lost race reads only the versions committed since its base;
//! - a reader with no state loads the newest checkpoint and the deltas
//!   after it; a reader with a state reads the deltas after it (one request
//!   when nothing changed);
//! - writing a checkpoint collects what it makes unneeded: older
//!   checkpoints, and versions more than [`CatalogOptions::keep_behind`]
//!   behind the checkpoint before it (as tombstones, so that no version
//!   number is ever used twice), so that a handle behind by up to an
//!   interval between checkpoints still catches up by reading versions. A
//!   reader that finds a version collected loads the newest checkpoint
//!   instead.
//!
//! Catalogs written before deltas (every version a full state) open as
//! they are: a version read in full replaces the state, and the first
//! commit on such a catalog writes its first checkpoint.

use std::sync::{Arc, Mutex};

use bytes::Bytes;
use object_store::ObjectStore;
use object_store::path::Path;

use super::CatalogOptions;
use super::format::{self, Stored};
use super::state::{CatalogState, Change};
use crate::error::{Error, Result};
use crate::store::{CommitOptions, Slot, Versioned, VersionedObjects, paths};

/// A checkpoint is due once the deltas after the newest one hold a quarter
/// of its bytes (and at least this many), or are
/// [`CatalogOptions::checkpoint_every`] many.
const CHECKPOINT_MIN_DELTA_BYTES: u64 = 256 << 10;
/// Versions read at once when catching up (the window doubles from one up
/// to this while versions keep coming).
const READ_AHEAD: u64 = 32;
/// Attempts at a full load when versions are collected under it.
const LOAD_ATTEMPTS: u32 = 50;

/// A state read to the tip and its version, or the first version found
/// collected on the way.
type Loaded = std::result::Result<(u64, Arc<CatalogState>), u64>;

/// What a process knows of the log, to decide when a checkpoint is due.
#[derive(Debug, Default)]
struct Progress {
    /// The newest checkpoint known and its size (`None`: none is known;
    /// the next commit writes one).
    checkpoint: Option<(u64, u64)>,
    /// The checkpoint known before it.
    before: Option<u64>,
    /// The newest version whose delta is counted below.
    counted: u64,
    /// Deltas read or written after the checkpoint, and their bytes.
    deltas: u64,
    delta_bytes: u64,
}

impl Progress {
    /// Takes the checkpoint at `at` (`len` bytes) as the newest known, if
    /// it is newer than the one known; whether it was.
    fn advance(&mut self, at: u64, len: u64) -> bool {
        let known = self.checkpoint.map(|(known, _)| known);
        if known.is_some_and(|known| known >= at) {
            return false;
        }
        self.before = known;
        self.checkpoint = Some((at, len));
        self.deltas = self.counted.saturating_sub(at).min(self.deltas);
        self.delta_bytes = 0;
        self.counted = self.counted.max(at);
        true
    }
}

/// The versions and checkpoints of one catalog.
#[derive(Debug)]
pub struct DeltaLog {
    versions: VersionedObjects,
    checkpoints: VersionedObjects,
    /// See [`CatalogOptions::checkpoint_every`] and
    /// [`CatalogOptions::keep_behind`].
    checkpoint_every: u64,
    keep_behind: u64,
    /// How much later than due (1 to 2 times) this handle writes a
    /// checkpoint: the handles of one catalog spread theirs, and the first
    /// one written spares the others theirs (see [`DeltaLog::adopt_newer`]).
    patience: f64,
    progress: Mutex<Progress>,
}

fn corrupt(path: &Path, reason: impl Into<String>) -> Error {
    Error::Corrupt {
        path: path.to_string(),
        reason: reason.into(),
    }
}

impl DeltaLog {
    /// The log of the catalog in `store`.
    pub fn new(store: Arc<dyn ObjectStore>, options: &CatalogOptions) -> Self {
        let dir = |d: &str| Path::from(d);
        let commit: &CommitOptions = &options.commit;
        Self {
            checkpoint_every: options.checkpoint_every,
            keep_behind: options.keep_behind,
            patience: 1.0 + rand::random::<f64>(),
            versions: VersionedObjects::new(
                Arc::clone(&store),
                dir(paths::CATALOG_DIR),
                paths::CATALOG_EXT,
                commit.clone(),
            )
            .into_log(),
            checkpoints: VersionedObjects::new(
                store,
                dir(paths::CATALOG_CHECKPOINTS_DIR),
                paths::CATALOG_EXT,
                commit.clone(),
            )
            .into_log(),
            progress: Mutex::default(),
        }
    }

    /// The catalog's versions.
    pub fn versions(&self) -> &VersionedObjects {
        &self.versions
    }

    fn progress(&self) -> std::sync::MutexGuard<'_, Progress> {
        self.progress.lock().expect("catalog log progress poisoned")
    }

    /// Counts the delta of `version` (`bytes` long), read or written.
    pub fn counted(&self, version: u64, bytes: usize) {
        let mut p = self.progress();
        if version > p.counted {
            p.counted = version;
            p.deltas += 1;
            p.delta_bytes += bytes as u64;
        }
    }

    /// Whether a checkpoint of the state at `version` is due (never with
    /// [`CatalogOptions::checkpoint_every`] 0).
    pub fn checkpoint_due(&self, version: u64) -> bool {
        let p = self.progress();
        if self.checkpoint_every == 0 {
            return false;
        }
        match p.checkpoint {
            None => version > 0,
            Some((at, bytes)) => {
                let later = |n: u64| (n as f64 * self.patience) as u64;
                version > at
                    && (p.deltas >= later(self.checkpoint_every)
                        || p.delta_bytes >= later((bytes / 4).max(CHECKPOINT_MIN_DELTA_BYTES)))
            }
        }
    }

    /// Takes a checkpoint newer than the one known, if one was written
    /// (by another handle) since, as the newest known; whether there was.
    pub async fn adopt_newer(&self) -> Result<bool> {
        let Some(&(at, len)) = self.checkpoints.list_sizes().await?.last() else {
            return Ok(false);
        };
        Ok(self.progress().advance(at, len))
    }

    /// The tip: from `base` when it can be trusted (not `stale`), else
    /// from the newest checkpoint (see [`DeltaLog::catch_up`], [`DeltaLog::load`]).
    pub async fn reload(
        &self,
        base: Versioned<CatalogState>,
        stale: bool,
    ) -> Result<Versioned<CatalogState>> {
        if stale {
            return self.load().await;
        }
        self.catch_up(base).await
    }

    /// The tip from `base` on: the versions after it, read in order (a
    /// window of them at a time) until one is missing. One request when
    /// none is newer. Loads the newest checkpoint when one was collected.
    pub async fn catch_up(&self, base: Versioned<CatalogState>) -> Result<Versioned<CatalogState>> {
        match self.read_after(base.version, &base.state).await? {
            Ok((version, state)) => Ok(Versioned::new(version, state)),
            Err(_) => self.load().await,
        }
    }

    /// The versions after `version` (whose state is `state`) up to the tip
    /// applied; or the first of them found collected.
    async fn read_after(&self, mut version: u64, state: &Arc<CatalogState>) -> Result<Loaded> {
        let mut state = Arc::clone(state);
        let mut window = 1;
        loop {
            let slots = futures::future::try_join_all(
                (version + 1..=version + window).map(|v| self.versions.slot(v)),
            )
            .await?;
            for slot in slots {
                let next = version + 1;
                let bytes = match slot {
                    Slot::Absent => return Ok(Ok((version, state))),
                    Slot::Collected => return Ok(Err(next)),
                    Slot::Version(bytes) => bytes,
                };
                state = self.apply(next, &state, bytes)?;
                version = next;
            }
            window = (window * 2).min(READ_AHEAD);
        }
    }

    /// The state of version `version` (`bytes`) made from the state before.
    fn apply(
        &self,
        version: u64,
        before: &Arc<CatalogState>,
        bytes: Bytes,
    ) -> Result<Arc<CatalogState>> {
        let path = self.versions.path_of(version);
        let len = bytes.len();
        match format::decode(path.as_ref(), bytes)? {
            // A catalog written before deltas.
            Stored::Full(entries) => Ok(Arc::new(CatalogState::from_entries(entries))),
            Stored::Delta(changes) => self.replay(version, before, &changes, len),
        }
    }

    /// The state of version `version`, whose delta (`len` bytes) holds
    /// `changes`, made from the state before.
    fn replay(
        &self,
        version: u64,
        before: &Arc<CatalogState>,
        changes: &[Change],
        len: usize,
    ) -> Result<Arc<CatalogState>> {
        let mut state = (**before).clone();
        state.replay(changes).map_err(|reason| {
            corrupt(
                &self.versions.path_of(version),
                format!("does not follow its version before: {reason}"),
            )
        })?;
        self.counted(version, len);
        Ok(Arc::new(state))
    }

    /// The tip read afresh: the newest checkpoint and the versions after
    /// it, or, before the first checkpoint, the versions from the newest
    /// full one (or the first).
    pub async fn load(&self) -> Result<Versioned<CatalogState>> {
        for _ in 0..LOAD_ATTEMPTS {
            let newest = self.checkpoints.list_versions().await?.last().copied();
            let loaded = match newest {
                Some(at) => self.load_checkpoint(at).await?,
                None => self.load_versions().await?,
            };
            let collected = match loaded {
                Ok((version, state)) => return Ok(Versioned::new(version, state)),
                Err(collected) => collected,
            };
            // Collection empties only versions behind a checkpoint newer
            // than what was read: with none, the version is damaged.
            if self.checkpoints.list_versions().await?.last().copied() == newest {
                return Err(corrupt(
                    &self.versions.path_of(collected),
                    "the version is empty, and no checkpoint covers it \
                     (damaged: collection empties only versions a checkpoint covers)",
                ));
            }
        }
        Err(Error::CommitConflict {
            what: format!(
                "loading the catalog in {} (versions kept being collected)",
                self.versions.dir()
            ),
            attempts: LOAD_ATTEMPTS,
        })
    }

    /// The tip from the checkpoint at `at`; or the first version found
    /// collected (0: the checkpoint itself was deleted meanwhile).
    async fn load_checkpoint(&self, at: u64) -> Result<Loaded> {
        let path = self.checkpoints.path_of(at);
        let bytes = match self.checkpoints.slot(at).await? {
            Slot::Absent => return Ok(Err(0)),
            Slot::Collected => return Err(corrupt(&path, "the checkpoint is empty (damaged)")),
            Slot::Version(bytes) => bytes,
        };
        let len = bytes.len() as u64;
        let Stored::Full(entries) = format::decode(path.as_ref(), bytes)? else {
            return Err(corrupt(&path, "a checkpoint holds a delta"));
        };
        self.progress().advance(at, len);
        let state = Arc::new(CatalogState::from_entries(entries));
        self.read_after(at, &state).await
    }

    /// The tip without a checkpoint: back from the newest version to a full
    /// one (or the first), then forward; or the first version found
    /// collected (a checkpoint was written meanwhile, or damage).
    async fn load_versions(&self) -> Result<Loaded> {
        let tip = self.versions.latest_version(0).await?;
        // Deltas read, newest first, down to a full version.
        let mut deltas = Vec::new();
        let mut state = Arc::new(CatalogState::default());
        let mut below = tip;
        'back: while below > 0 {
            let from = below.saturating_sub(READ_AHEAD) + 1;
            let slots =
                futures::future::try_join_all((from..=below).rev().map(|v| self.versions.slot(v)))
                    .await?;
            for slot in slots {
                let Slot::Version(bytes) = slot else {
                    return Ok(Err(below));
                };
                let (path, len) = (self.versions.path_of(below), bytes.len());
                match format::decode(path.as_ref(), bytes)? {
                    Stored::Full(entries) => {
                        state = Arc::new(CatalogState::from_entries(entries));
                        break 'back;
                    }
                    Stored::Delta(changes) => deltas.push((below, changes, len)),
                }
                below -= 1;
            }
        }
        for (version, changes, len) in deltas.into_iter().rev() {
            state = self.replay(version, &state, &changes, len)?;
        }
        self.read_after(tip, &state).await
    }

    /// Writes the checkpoint of `state`, the catalog at `version`, unless
    /// one is there already; then deletes older checkpoints and collects
    /// the versions more than [`CatalogOptions::keep_behind`] behind the
    /// checkpoint known before (failures there are logged and left to a
    /// later collection); with `sweep`, also lists the versions to collect
    /// what earlier collections left (see [`VersionedObjects::sweep`]). A
    /// checkpoint is never needed for correctness, only for speed.
    pub async fn checkpoint(
        &self,
        version: u64,
        state: Arc<CatalogState>,
        sweep: bool,
    ) -> Result<()> {
        let bytes = tokio::task::spawn_blocking(move || format::encode_full(state.iter()))
            .await
            .map_err(|e| Error::Poisoned(format!("encoding a catalog checkpoint: {e}")))??;
        let len = bytes.len() as u64;
        // Taken: another process wrote the same version's.
        self.checkpoints.put_version(version, bytes).await?;
        // Versions the checkpoint known before this one covers, from where
        // the one before it stopped (and below, those an earlier collection
        // skipped): handles behind this checkpoint by up to an interval
        // still catch up by reading versions. (Those of a writer that
        // stopped while collecting are left to the periodic sweep.)
        let (before, known) = {
            let mut p = self.progress();
            let (before, known) = (p.before, p.checkpoint.map(|(at, _)| at));
            p.advance(version, len);
            (before, known)
        };
        for old in self.checkpoints.list_versions().await? {
            if old < version {
                self.checkpoints.delete(old).await;
            }
        }
        let keep = self.keep_behind;
        let Some(last) = known
            .filter(|&k| k <= version)
            .map(|k| k.saturating_sub(keep))
        else {
            return Ok(());
        };
        let reach = last.saturating_sub(4 * (self.checkpoint_every.max(1) + keep)) + 1;
        let first = before
            .map_or(1, |at| at.saturating_sub(keep) + 1)
            .max(reach);
        if first <= last {
            let first = self.content_below(first, reach).await;
            self.versions.collect(first..=last).await;
        }
        if sweep {
            self.versions.sweep(last).await;
        }
        Ok(())
    }

    /// How far below `first` (down to `floor`) versions next to it keep
    /// their content: those no collection took (the handle collecting
    /// before this one had missed a checkpoint, and collected less). Probes
    /// one version, then windows that double; a failed probe ends the walk.
    async fn content_below(&self, mut first: u64, floor: u64) -> u64 {
        let mut window = 1;
        while first > floor {
            let from = first.saturating_sub(window).max(floor);
            let sizes =
                futures::future::join_all((from..first).rev().map(|v| self.versions.size(v))).await;
            for size in sizes {
                match size {
                    Ok(Some(len)) if len > 0 => first -= 1,
                    _ => return first,
                }
            }
            window = (window * 2).min(READ_AHEAD);
        }
        first
    }
}
