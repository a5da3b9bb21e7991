//! The shard manifest: the small copy-on-write document that says who owns
//! a shard (the epoch) and where WAL replay starts.
//!
//! Stored as `<shard>/manifest/v<N>.json` through [`VersionedObjects`], so
//! every change is a put-if-absent of the next version.

use bytes::Bytes;
use object_store::path::Path;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::sstable::SstableFile;
use crate::store::{Versioned, VersionedObjects};

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
    /// SSTables a compaction replaced, kept for running queries until
    /// their grace period ends; no new snapshot reads them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub retired: Vec<RetiredFile>,
    /// WAL positions at or below `replay_after` that hold fences. They are
    /// never deleted: a stale writer's next append is always at a later
    /// epoch's fence, and must keep colliding with it (see
    /// [`crate::wal::WalLog::fence`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub fences: Vec<u64>,
    /// WAL data entries at or below this are deleted.
    #[serde(default)]
    pub wal_deleted_through: u64,
}

/// An SSTable no longer part of the shard, and when it stopped being.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RetiredFile {
    pub path: String,
    /// Milliseconds since the Unix epoch.
    pub retired_at_ms: u64,
}

impl ShardManifest {
    /// Decodes version bytes read from `path`.
    pub fn decode(path: &Path, bytes: Bytes) -> Result<Self> {
        serde_json::from_slice(&bytes).map_err(|e| Error::Corrupt {
            path: path.to_string(),
            reason: format!("shard manifest: {e}"),
        })
    }

    /// The encoding of this version.
    pub fn encode(&self) -> Result<Bytes> {
        Ok(Bytes::from(
            serde_json::to_vec(self).expect("a shard manifest always serializes"),
        ))
    }
}

/// Claims the shard whose manifest versions are `versions`: commits a new
/// version with the epoch one above the newest, racing claimers included
/// (each gets its own epoch). Returns the committed version.
pub async fn claim(versions: &VersionedObjects) -> Result<Versioned<ShardManifest>> {
    let base = versions.load_latest(0, ShardManifest::decode).await?;
    versions
        .commit(base, ShardManifest::decode, |current| {
            let next = ShardManifest {
                epoch: current.epoch + 1,
                generation: current.generation.max(1),
                ..current.clone()
            };
            let bytes = next.encode()?;
            Ok(Some((next, bytes)))
        })
        .await
}

/// Commits `change` (which returns whether it changed anything) to the
/// shard manifest on top of `base` as the writer of `epoch`: fails with [`Error::Fenced`] if a newer epoch claimed the shard
/// (checked against the version the commit lands on, so a fenced writer
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
                    path: versions.path_of(0).to_string(),
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
