//! The shard manifest: the small copy-on-write document that says who owns
//! a shard (the epoch) and where WAL replay starts.
//!
//! Stored as `<shard>/manifest/v<N>.json` through [`VersionedObjects`], so
//! every change is a put-if-absent of the next version.

use bytes::Bytes;
use object_store::path::Path;
use serde::{Deserialize, Serialize};

use crate::blob::PackRun;
use crate::error::{Error, Result};
use crate::sstable::SstableFile;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use object_store::ObjectStore;

use crate::store::{CommitOptions, Versioned, VersionedObjects, paths};

/// One version of a shard manifest.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardManifest {
    /// Epoch of the newest writer to claim the shard (0: never claimed).
    pub epoch: u64,
    /// WAL entries at positions at or below this are in SSTables; replay
    /// starts after it.
    pub replay_after: u64,
    /// The lowest generation not yet in an SSTable.
    pub generation: u64,
    /// The shard's SSTables, oldest generations first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sstables: Vec<SstableFile>,
    /// SSTables a compaction replaced and deletion vectors a flush
    /// replaced, kept for running queries until their grace period ends;
    /// no new snapshot reads them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub retired: Vec<RetiredFile>,
    /// Fences at or below `replay_after`, by position. A stale writer's
    /// next append is at a later epoch's fence and must collide with it
    /// (see [`crate::wal::WalLog::fence`]), so a fence is deleted only
    /// [`ShardManifest::fence_grace_ms`] after it was written, when no
    /// writer can still be about to append there (see the writer's module
    /// doc).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub fences: Vec<Fence>,
    /// The longest [`super::WriterOptions::fence_grace`] (ms) of the
    /// writers that claimed the shard: fences are kept at least that
    /// long, so a writer whose lease is longer than its successor's still
    /// collides with the fence that ends it. 0: none recorded.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub fence_grace_ms: u64,
    /// WAL data entries at or below this are deleted.
    #[serde(default)]
    pub wal_deleted_through: u64,
    /// The recent flushes, oldest first: the position each moved
    /// `replay_after` to and when (see [`ShardManifest::record_flush`]).
    /// A blob pack (or a WAL entry of a table with blob columns) that no
    /// SSTable names is kept until the flush that passed its position is
    /// a grace period old: a statement's snapshot from before that flush
    /// may still read the rows that name it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub flushed: Vec<Flushed>,
    /// Until when (ms since the Unix epoch) the writer of `epoch` has its
    /// turn: a writer that took the shard over from another one holds it
    /// this long before others take it again (a courtesy that keeps
    /// takeovers from thrashing; fencing never depends on it). 0: none.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub turn_until_ms: u64,
    /// Set by `DROP TABLE` ([`seal`]): no writer claims the shard again,
    /// so one still running elsewhere stops at its next WAL append.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub dropped: bool,
    /// Bulk loads of the shard a writer took for crashed (the latest
    /// [`MAX_DEAD_LOADS`], oldest first), listed before it deleted their
    /// runs and packs: a load listed here commits nothing, however late
    /// it comes back (see `super::load`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dead_loads: Vec<u64>,
}

/// How many [`ShardManifest::dead_loads`] a manifest lists. A load older
/// than that many crashed ones still finds its runs gone before it
/// commits (see `super::ShardWriter::ingest`).
pub const MAX_DEAD_LOADS: usize = 64;

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// Milliseconds since the Unix epoch, by this machine's clock.
pub(super) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// A fence entry of the WAL and when it was written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "FenceRepr")]
pub struct Fence {
    /// The WAL position the fence holds.
    pub position: u64,
    /// Milliseconds since the Unix epoch by the clock of the writer that
    /// recorded it (0: unknown, for fences listed before times were).
    pub at_ms: u64,
}

/// A fence as stored: a bare position in older manifests.
#[derive(Deserialize)]
#[serde(untagged)]
enum FenceRepr {
    Timed { position: u64, at_ms: u64 },
    Bare(u64),
}

impl From<FenceRepr> for Fence {
    fn from(repr: FenceRepr) -> Self {
        match repr {
            FenceRepr::Timed { position, at_ms } => Fence { position, at_ms },
            FenceRepr::Bare(position) => Fence { position, at_ms: 0 },
        }
    }
}

/// A flush of a shard: the WAL position it moved the cursor to, and when
/// (ms since the Unix epoch, by the clock of its writer). Stored as
/// `[through, at_ms]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "[u64; 2]", into = "[u64; 2]")]
pub struct Flushed {
    pub through: u64,
    pub at_ms: u64,
}

impl From<[u64; 2]> for Flushed {
    fn from([through, at_ms]: [u64; 2]) -> Self {
        Self { through, at_ms }
    }
}

impl From<Flushed> for [u64; 2] {
    fn from(f: Flushed) -> Self {
        [f.through, f.at_ms]
    }
}

/// An SSTable (or a deletion vector) no longer part of the shard, and
/// when it stopped being.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RetiredFile {
    pub path: String,
    /// Milliseconds since the Unix epoch.
    pub retired_at_ms: u64,
    /// The blob packs its rows name, kept until it is deleted.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub packs: Vec<PackRun>,
}

impl ShardManifest {
    /// The directories of the SSTables it names, live or retired (an
    /// SSTable is its directory: the file and its graphs).
    pub fn named_dirs(&self) -> std::collections::HashSet<&str> {
        let live = self.sstables.iter().map(|f| paths::sstable_dir(&f.path));
        live.chain(self.retired.iter().map(|f| paths::sstable_dir(&f.path)))
            .collect()
    }

    /// Whether an SSTable it names, live or retired, names the blob pack
    /// at `position` of `epoch`.
    pub fn names_pack(&self, epoch: u64, position: u64) -> bool {
        let live = self.sstables.iter().flat_map(|f| &f.packs);
        live.chain(self.retired.iter().flat_map(|f| &f.packs))
            .any(|run| run.contains(epoch, position))
    }

    /// Records a flush that moved the cursor to `through` at `at_ms`,
    /// forgetting the flushes more than `grace_ms` older but the newest
    /// of them (which still dates every position at or below its own).
    pub fn record_flush(&mut self, through: u64, at_ms: u64, grace_ms: u64) {
        self.flushed.push(Flushed { through, at_ms });
        let old = (self.flushed.iter())
            .filter(|f| f.at_ms.saturating_add(grace_ms) < at_ms)
            .count();
        self.flushed.drain(..old.saturating_sub(1));
    }

    /// Whether the flush that passed WAL position `position` (at or below
    /// `replay_after`) was at least `grace_ms` before `now_ms`; also when
    /// no flush is recorded (a manifest older than the record).
    pub fn flushed_before(&self, position: u64, now_ms: u64, grace_ms: u64) -> bool {
        match self.flushed.iter().find(|f| f.through >= position) {
            Some(f) => f.at_ms.saturating_add(grace_ms) <= now_ms,
            None => true,
        }
    }

    /// Decodes version bytes read from `path`.
    pub fn decode(path: &Path, bytes: Bytes) -> Result<Self> {
        serde_json::from_slice(&bytes).map_err(|e| Error::Corrupt {
            path: path.to_string(),
            reason: format!("not a readable shard manifest (damaged, or cut short): {e}"),
        })
    }

    /// The encoding of this version.
    pub fn encode(&self) -> Result<Bytes> {
        Ok(Bytes::from(
            serde_json::to_vec(self).expect("a shard manifest always serializes"),
        ))
    }
}

/// The versions of the shard manifest of the shard at `shard_dir`.
pub fn versions(
    store: Arc<dyn ObjectStore>,
    shard_dir: &Path,
    commit: &CommitOptions,
) -> VersionedObjects {
    VersionedObjects::new(
        store,
        paths::shard_manifest_dir(shard_dir),
        "json",
        commit.clone(),
    )
}

/// Claims the shard whose manifest versions are `versions`: commits a new
/// version with the epoch one above the newest, racing claimers included
/// (each gets its own epoch). Returns the committed version.
///
/// While another writer's turn lasts ([`ShardManifest::turn_until_ms`])
/// the claim waits for its end (at most `patience` in all, then claims
/// anyway). With `turn`, the claim takes a turn of that length itself: a
/// writer taking the shard back from another one does, so that writers
/// contending for a shard take turns instead of fencing each other at
/// every write. The claim records `fence_grace` if it is longer than any
/// recorded ([`ShardManifest::fence_grace_ms`]).
pub async fn claim(
    versions: &VersionedObjects,
    turn: Option<Duration>,
    patience: Duration,
    fence_grace: Duration,
) -> Result<Versioned<ShardManifest>> {
    let started = Instant::now();
    loop {
        let base = versions.load_latest(0, ShardManifest::decode).await?;
        let waited_enough = started.elapsed() >= patience;
        // Whether the last run of the change wrote a claim (a rebase runs
        // it again).
        let mut wrote = false;
        let claimed = versions
            .commit(base, ShardManifest::decode, |current| {
                if current.dropped {
                    let dir = versions.dir().as_ref();
                    return Err(Error::table_dropped(
                        paths::table_of(dir).unwrap_or(dir),
                        "dropped before this write reached it; nothing was written",
                    ));
                }
                let now = now_ms();
                wrote = current.turn_until_ms <= now || waited_enough;
                if !wrote {
                    return Ok(None);
                }
                let next = ShardManifest {
                    epoch: current.epoch + 1,
                    generation: current.generation.max(1),
                    turn_until_ms: turn.map_or(0, |t| now + t.as_millis() as u64),
                    fence_grace_ms: current.fence_grace_ms.max(fence_grace.as_millis() as u64),
                    ..current.clone()
                };
                let bytes = next.encode()?;
                Ok(Some((next, bytes)))
            })
            .await?;
        if wrote {
            return Ok(claimed);
        }
        // Another writer's turn: wait for its end (and a little, so the
        // waiters do not all claim at once).
        let left = Duration::from_millis(claimed.state.turn_until_ms.saturating_sub(now_ms()));
        let jitter = Duration::from_millis(rand::random::<u64>() % 20);
        tokio::time::sleep(left.min(patience) + jitter).await;
    }
}

/// Claims the next epoch of the shard for good, marked dropped (after
/// `DROP TABLE` committed): [`claim`] refuses from then on. The caller
/// then fences the WAL at that epoch, so a writer still running elsewhere
/// fails its next append instead of acknowledging rows no table holds.
pub async fn seal(versions: &VersionedObjects) -> Result<Versioned<ShardManifest>> {
    let base = versions.load_latest(0, ShardManifest::decode).await?;
    versions
        .commit(base, ShardManifest::decode, |current| {
            if current.dropped {
                return Ok(None);
            }
            let next = ShardManifest {
                epoch: current.epoch + 1,
                turn_until_ms: 0,
                dropped: true,
                ..current.clone()
            };
            let bytes = next.encode()?;
            Ok(Some((next, bytes)))
        })
        .await
}

/// [`Error::Fenced`] if a writer newer than `epoch` has claimed the shard
/// whose manifest versions are `versions`.
pub async fn newer_claim(versions: &VersionedObjects, epoch: u64) -> Result<Option<Error>> {
    let latest = versions.load_latest(0, ShardManifest::decode).await?;
    Ok((latest.state.epoch > epoch).then(|| Error::Fenced {
        path: versions.path_of(latest.version).to_string(),
        epoch,
        by_epoch: latest.state.epoch,
    }))
}

/// Commits `change` (which returns whether it changed anything) to the
/// shard manifest on top of `base` as the writer of `epoch`: fails with
/// [`Error::Fenced`] if a newer epoch claimed the shard (checked against the version the commit lands on, so a fenced writer
/// never changes the manifest).
pub async fn commit_as(
    versions: &VersionedObjects,
    base: Versioned<ShardManifest>,
    epoch: u64,
    change: impl Fn(&mut ShardManifest) -> bool,
) -> Result<Versioned<ShardManifest>> {
    versions
        .commit(base, ShardManifest::decode, |current| {
            if current.epoch != epoch {
                return Err(Error::Fenced {
                    path: versions.dir().to_string(),
                    epoch,
                    by_epoch: current.epoch,
                });
            }
            let mut next = current.clone();
            if !change(&mut next) {
                return Ok(None);
            }
            let bytes = next.encode()?;
            Ok(Some((next, bytes)))
        })
        .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use object_store::memory::InMemory;

    #[tokio::test]
    async fn a_claim_waits_for_the_turn_of_a_writer_that_took_the_shard_back() {
        let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        let versions = versions(store, &Path::from("s"), &CommitOptions::default());
        let patience = Duration::from_secs(30);
        let first = claim(&versions, None, patience, MINUTE).await.unwrap();
        assert_eq!((first.state.epoch, first.state.turn_until_ms), (1, 0));
        // No turn: the next claim goes ahead at once and takes one.
        let turn = Duration::from_millis(300);
        let before = now_ms();
        let second = claim(&versions, Some(turn), patience, MINUTE)
            .await
            .unwrap();
        assert_eq!(second.state.epoch, 2);
        assert!(second.state.turn_until_ms >= before + 300);
        // The third waits for the end of that turn.
        let third = claim(&versions, None, patience, MINUTE).await.unwrap();
        assert_eq!((third.state.epoch, third.state.turn_until_ms), (3, 0));
        assert!(now_ms() >= second.state.turn_until_ms);
        // Unless it has waited long enough already.
        claim(&versions, Some(Duration::from_secs(3600)), patience, MINUTE)
            .await
            .unwrap();
        let impatient = claim(&versions, None, Duration::ZERO, MINUTE)
            .await
            .unwrap();
        assert_eq!(impatient.state.epoch, 5);
    }

    const MINUTE: Duration = Duration::from_secs(60);

    #[tokio::test]
    async fn claims_record_the_longest_fence_grace_of_any_writer() {
        let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        let versions = versions(store, &Path::from("s"), &CommitOptions::default());
        let patience = Duration::from_secs(30);
        let mut recorded = Vec::new();
        for grace in [MINUTE, Duration::from_millis(1), 10 * MINUTE, MINUTE] {
            let claimed = claim(&versions, None, patience, grace).await.unwrap();
            recorded.push(claimed.state.fence_grace_ms);
        }
        assert_eq!(recorded, [60_000, 60_000, 600_000, 600_000]);
    }
}
