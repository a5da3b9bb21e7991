//! Replay at open: the WAL entries after the manifest's replay cursor
//! become MemTables again, one per recorded generation, in WAL order.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use datafusion::arrow::array::RecordBatch;

use super::{Generation, SEAL_REPLAYED_ENTRIES, ShardManifest, WriterOptions, manifest};
use crate::error::{Error, Result};
use crate::schema::TableSchema;
use crate::store::{VersionedObjects, paths};
use crate::wal::{EntryKind, WalLog};

/// What a replay rebuilt.
pub(super) struct Replayed {
    /// Oldest first; the last one is active, every other one sealed. All
    /// indexed and marked durable.
    pub generations: Vec<Arc<Generation>>,
    /// Fences seen (position to when, ms; replayed ones count as written
    /// now, so they are never deleted early), the new one included.
    pub fences: BTreeMap<u64, u64>,
    /// Rows and bytes replayed.
    pub rows: u64,
    pub bytes: u64,
}

/// Replays every entry of `wal` after `claimed.replay_after` and before this
/// writer's `fence`. A corrupt entry fails the replay, naming it, unless a
/// newer writer flushed and deleted it under the replay (then this writer
/// is fenced).
pub(super) async fn replay(
    wal: &WalLog,
    versions: &VersionedObjects,
    claimed: &ShardManifest,
    fence: u64,
    schema: &Arc<TableSchema>,
    options: &WriterOptions,
    taking_back: bool,
) -> Result<Replayed> {
    let (epoch, replay_after, generation) =
        (claimed.epoch, claimed.replay_after, claimed.generation);
    // One MemTable per recorded generation, in WAL order.
    let mut generations: Vec<Arc<Generation>> = Vec::new();
    // Replayed fences count as written now: later than they were, so
    // never deleted early.
    let now_ms = manifest::now_ms();
    let mut fences = BTreeMap::from([(fence, now_ms)]);
    let (mut rows, mut bytes) = (0, 0);
    let replayed = match wal.replay(replay_after, fence).await {
        Ok(replayed) => replayed,
        // Entries that vanished under the replay were flushed and
        // deleted by a newer writer: this one is fenced, the WAL fine.
        // Damage the newer writer's replay has not passed is damage.
        Err(Error::Corrupt { path, reason }) => {
            let latest = versions.load_latest(0, ShardManifest::decode).await?;
            let flushed = object_store::path::Path::parse(&path)
                .ok()
                .and_then(|p| p.filename().and_then(paths::parse_wal_file))
                .is_some_and(|position| position <= latest.state.replay_after);
            if latest.state.epoch > epoch && flushed {
                return Err(Error::Fenced {
                    path: versions.path_of(latest.version).to_string(),
                    epoch,
                    by_epoch: latest.state.epoch,
                });
            }
            return Err(Error::Corrupt { path, reason });
        }
        Err(e) => return Err(e),
    };
    for (position, entry) in replayed {
        if entry.kind != EntryKind::Data {
            fences.insert(position, now_ms);
            continue;
        }
        let corrupt = |reason: String| Error::Corrupt {
            path: wal.path_of(position).to_string(),
            reason,
        };
        let current = match generations.last() {
            Some(g) if g.number == entry.generation => Arc::clone(g),
            Some(g) if g.number > entry.generation => {
                return Err(corrupt(format!(
                    "generation {} after generation {}",
                    entry.generation, g.number
                )));
            }
            _ => {
                let g = Generation::new(entry.generation, schema);
                generations.push(Arc::clone(&g));
                g
            }
        };
        let mut put = Vec::with_capacity(entry.batches.len());
        for batch in entry.batches {
            let batch = RecordBatch::try_new(Arc::clone(&schema.stored), batch.columns().to_vec())
                .map_err(|e| corrupt(format!("rows do not fit the table: {e}")))?;
            rows += batch.num_rows() as u64;
            put.push(schema.keyed(batch)?);
        }
        bytes += current.memtable.append(put).1 as u64;
        current.last_position.store(position, Ordering::Relaxed);
    }
    // The newest replayed generation stays active unless the manifest
    // is past it or it is full; every other one is sealed and flushes
    // at once.
    match generations.last() {
        None => generations.push(Generation::new(generation.max(1), schema)),
        Some(g) if g.number < generation => generations.push(Generation::new(generation, schema)),
        Some(g) if g.memtable.bytes() >= options.memtable_bytes => {
            let next = g.number + 1;
            generations.push(Generation::new(next, schema));
        }
        // Taken back in a contest: the writers may keep fencing each
        // other before any of them fills a MemTable, so flush a long
        // tail now rather than replay it at every takeover.
        Some(g) if taking_back && fence - replay_after > SEAL_REPLAYED_ENTRIES => {
            let next = g.number + 1;
            generations.push(Generation::new(next, schema));
        }
        Some(_) => {}
    }
    let active_number = generations.last().expect("pushed above").number;
    // Replayed rows were visible before (to readers of the WAL): they
    // are indexed before the writer serves anyone, so they stay so.
    for g in &generations {
        let (memtable, threads) = (Arc::clone(&g.memtable), options.index_threads);
        let written = memtable.written_batches();
        tokio::task::spawn_blocking(move || memtable.index_to(written, threads))
            .await
            .map_err(|e| Error::Poisoned(format!("indexing replayed rows failed: {e}")))?;
    }
    for g in &generations {
        g.memtable.mark_durable(g.memtable.written_batches());
        if g.number != active_number {
            g.sealed.store(true, Ordering::Release);
        }
    }
    Ok(Replayed {
        generations,
        fences,
        rows,
        bytes,
    })
}
