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
    /// WAL entries at positions at or below this are in SSTables (or
    /// garbage); replay starts after it.
    pub replay_after: u64,
    /// Generation of the active MemTable.
    pub generation: u64,
    /// The shard's SSTables, oldest generation first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sstables: Vec<SstableFile>,
}

impl ShardManifest {
    /// Decodes version bytes read from `path`.
    pub fn decode(path: &Path, bytes: Bytes) -> Result<Self> {
        serde_json::from_slice(&bytes).map_err(|e| Error::Corrupt {
            path: path.to_string(),
            reason: format!("shard manifest: {e}"),
        })
    }

    fn encode(&self) -> Result<Bytes> {
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
