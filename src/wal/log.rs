//! [`WalLog`]: the WAL entries of one shard as numbered immutable objects.
//!
//! Invariants:
//! - an entry is only ever created with put-if-absent at the next position,
//!   so two writers can never both own a position; a writer that finds its
//!   position taken is fenced ([`Error::Fenced`]), unless the bytes there
//!   are exactly its own (an earlier attempt that landed after all);
//! - a new writer fences older ones by writing a fence entry at the first
//!   free position after the tip: an older writer's next append collides
//!   with it or with something after it;
//! - positions are dense, with one exception: a writer may have a few
//!   appends in flight, and a later one can land before an earlier one (or
//!   the earlier one never lands, if the writer dies). The entry that
//!   overtook says so ([`WalEntry::landed_through`]); the writer
//!   acknowledges nothing at or after a position that has not landed; the
//!   next writer plugs such a gap with its fence before it replays, so the
//!   missing append can never land afterwards. Any other missing position
//!   is reported as corruption, never skipped.

use std::ops::Range;
use std::sync::Arc;

use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use object_store::path::Path;
use object_store::{GetOptions, GetRange, ObjectStore, ObjectStoreExt, PutMode, PutPayload};

use super::entry::{WalEntry, head_len};
use crate::error::{Error, Result};
use crate::store::{paths, read_checked};

/// WAL objects read at the same time during replay.
const REPLAY_READS: usize = 16;

/// The bytes at the end of an entry a WAL of a table with blob columns
/// reads first (see [`WalLog::reading_heads`]).
const HEAD_READ: u64 = 64 << 10;

/// The WAL of one shard.
#[derive(Debug, Clone)]
pub struct WalLog {
    store: Arc<dyn ObjectStore>,
    dir: Path,
    /// Whether entries are read by their end (see [`WalLog::reading_heads`]).
    heads: bool,
}

impl WalLog {
    /// The WAL in directory `dir` (see [`paths::wal_dir`]).
    pub fn new(store: Arc<dyn ObjectStore>, dir: Path) -> Self {
        Self {
            store,
            dir,
            heads: false,
        }
    }

    /// This WAL, reading an entry by its end when `heads` (a table with
    /// blob columns, whose entries may carry a pack): the last 64 KiB, and
    /// then the whole head if it is longer, so that reading an entry reads
    /// at most 64 KiB of its pack (in the same request as its head),
    /// however large the pack. An entry without a pack larger than that
    /// takes a second read for the rest.
    pub fn reading_heads(self, heads: bool) -> Self {
        Self { heads, ..self }
    }

    /// The object of position `position`.
    pub fn path_of(&self, position: u64) -> Path {
        paths::wal_file(&self.dir, position)
    }

    /// `entry` encoded as the object of `position` (see [`WalEntry::encode`]).
    pub fn encode(&self, position: u64, entry: &WalEntry) -> Result<Bytes> {
        entry.encode(self.path_of(position).as_ref())
    }

    /// The head of `entry` as the object of `position` after a pack (see
    /// [`WalEntry::encode_after_pack`]).
    pub fn encode_after_pack(&self, position: u64, entry: &WalEntry) -> Result<Bytes> {
        entry.encode_after_pack(self.path_of(position).as_ref())
    }

    /// An entry without a pack: [`WalLog::append_after_pack`] of `bytes`
    /// alone.
    #[cfg(test)]
    pub async fn append(&self, position: u64, epoch: u64, bytes: Bytes) -> Result<()> {
        self.append_after_pack(position, epoch, PutPayload::new(), bytes)
            .await
    }

    /// Creates the entry whose object is `pack` and then `head` (an
    /// encoded [`WalEntry`] of `epoch`: [`WalEntry::encode_after_pack`],
    /// or with an empty `pack` [`WalEntry::encode`]) at `position`. A
    /// taken position is [`Error::Fenced`], unless it holds this very
    /// entry (its stored head, see [`WalLog::read_bytes`], is `head`). Any
    /// other failure is returned as is: whether the write landed is then
    /// unknown, and the caller decides (retry the same position, or give
    /// up).
    pub async fn append_after_pack(
        &self,
        position: u64,
        epoch: u64,
        pack: PutPayload,
        head: Bytes,
    ) -> Result<()> {
        let path = self.path_of(position);
        let payload = PutPayload::from_iter(pack.into_iter().chain([head.clone()]));
        match self.create(&path, payload).await {
            Ok(()) => Ok(()),
            Err(object_store::Error::AlreadyExists { .. }) => {
                let stored = self.read_bytes(position).await?.unwrap_or_default();
                if stored == head {
                    return Ok(());
                }
                let by_epoch = WalEntry::decode(path.as_ref(), stored)?.epoch;
                Err(Error::Fenced {
                    path: path.to_string(),
                    epoch,
                    by_epoch,
                })
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Put-if-absent of `payload` at `path`.
    async fn create(&self, path: &Path, payload: PutPayload) -> object_store::Result<()> {
        self.store
            .put_opts(path, payload, PutMode::Create.into())
            .await
            .map(|_| ())
    }

    /// The stored entry at `position`, if there is one: the whole object,
    /// or, for an entry with a pack read by its end (see
    /// [`WalLog::reading_heads`]), its head alone.
    pub async fn read_bytes(&self, position: u64) -> Result<Option<Bytes>> {
        let path = self.path_of(position);
        let got = match self.heads {
            false => self.store.get(&path).await,
            true => {
                let suffix = GetOptions {
                    range: Some(GetRange::Suffix(HEAD_READ)),
                    ..Default::default()
                };
                self.store.get_opts(&path, suffix).await
            }
        };
        let got = match got {
            Ok(got) => got,
            Err(object_store::Error::NotFound { .. }) => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        let (start, size) = (got.range.start, got.meta.size);
        let end = got.bytes().await?;
        let read = |range: Range<u64>| self.store.get_range(&path, range);
        Ok(Some(match head_len(&end) {
            // Damage: decoding says so.
            Some(head) if head > size => end,
            Some(head) if head <= end.len() as u64 => end.slice(end.len() - head as usize..),
            Some(head) => read(size - head..size).await?,
            None if start == 0 => end,
            None => Bytes::from([read(0..start).await?, end].concat()),
        }))
    }

    /// Whether an object is at `position`.
    pub async fn exists(&self, position: u64) -> Result<bool> {
        match self.store.head(&self.path_of(position)).await {
            Ok(_) => Ok(true),
            Err(object_store::Error::NotFound { .. }) => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    /// The entry at `position`, if there is one; one that fails its
    /// checksum is read once more before it is reported (see
    /// [`read_checked`]).
    pub async fn read(&self, position: u64) -> Result<Option<WalEntry>> {
        let path = self.path_of(position);
        read_checked(
            || self.read_bytes(position),
            |stored: Option<Bytes>| {
                stored
                    .map(|bytes| WalEntry::decode(path.as_ref(), bytes))
                    .transpose()
            },
        )
        .await
    }

    /// Positions present after `after`, ascending.
    pub async fn positions_after(&self, after: u64) -> Result<Vec<u64>> {
        let offset = self.path_of(after);
        let mut positions: Vec<u64> = self
            .store
            .list_with_offset(Some(&self.dir), &offset)
            .map_ok(|meta| meta.location.filename().and_then(paths::parse_wal_file))
            .try_filter_map(|p| async move { Ok(p) })
            .try_collect()
            .await?;
        positions.sort_unstable();
        positions.retain(|p| *p > after);
        Ok(positions)
    }

    /// Every entry after `after` and before `below` (a fence this writer
    /// wrote, see [`WalLog::fence`]), in position order, read a few at a
    /// time without a listing: every position below a fence holds an
    /// entry, so one that holds none, or an entry that fails its checksum,
    /// is an error naming the object.
    pub async fn replay(&self, after: u64, below: u64) -> Result<Vec<(u64, WalEntry)>> {
        futures::stream::iter(after + 1..below)
            .map(|position| async move {
                let entry = self.read(position).await?.ok_or_else(|| Error::Corrupt {
                    path: self.path_of(position).to_string(),
                    reason: format!("WAL position missing (the fence is at {below})"),
                })?;
                Ok((position, entry))
            })
            .buffered(REPLAY_READS)
            .try_collect()
            .await
    }

    /// Writes a fence of `epoch` at the first free position after the tip
    /// (at or after `after`) and returns its position. Older writers' later
    /// appends collide with it. Fences land in epoch order: finding an entry
    /// of a newer epoch at the tip or in the way means a newer writer owns
    /// the shard, and this one is [`Error::Fenced`] before it starts.
    ///
    /// First, every gap after `after` that the entry after it explains as
    /// appends in flight ([`WalEntry::explains_gap_from`]) gets the same
    /// fence, so an older writer's append still on its way there fails
    /// instead of landing (and being acknowledged) out of this writer's
    /// sight. A gap nothing explains is left for [`WalLog::replay`] to
    /// report.
    pub async fn fence(&self, epoch: u64, after: u64) -> Result<u64> {
        let fence = WalEntry::fence(epoch);
        let positions = self.positions_after(after).await?;
        let tip = positions.last().copied().unwrap_or(after);
        if tip > after {
            self.check_not_newer(tip, epoch).await?;
        }
        let mut expected = after + 1;
        for &present in &positions {
            if present > expected && self.explains_gap(present, expected).await? {
                for missing in expected..present {
                    self.plug(missing, &fence, epoch).await?;
                }
            }
            expected = present + 1;
        }
        let mut position = tip + 1;
        loop {
            let bytes = self.encode(position, &fence)?;
            match self.create(&self.path_of(position), bytes.into()).await {
                Ok(()) => return Ok(position),
                // Another writer appended or fenced meanwhile.
                Err(object_store::Error::AlreadyExists { .. }) => {
                    self.check_not_newer(position, epoch).await?;
                    position += 1;
                }
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Whether the entry at `present` explains the positions from
    /// `first_missing` up to it as appends that were in flight when it was
    /// written. A damaged or vanished entry explains nothing.
    pub async fn explains_gap(&self, present: u64, first_missing: u64) -> Result<bool> {
        match self.read(present).await {
            Ok(Some(entry)) => Ok(entry.explains_gap_from(first_missing)),
            Ok(None) | Err(Error::Corrupt { .. }) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Writes `fence` (of `epoch`) at the missing `position`, unless the
    /// append on its way there landed first.
    async fn plug(&self, position: u64, fence: &WalEntry, epoch: u64) -> Result<()> {
        let bytes = self.encode(position, fence)?;
        match self.create(&self.path_of(position), bytes.into()).await {
            Ok(()) => Ok(()),
            Err(object_store::Error::AlreadyExists { .. }) => {
                self.check_not_newer(position, epoch).await
            }
            Err(e) => Err(e.into()),
        }
    }

    /// [`Error::Fenced`] if the entry at `position` is of an epoch newer
    /// than `epoch`.
    async fn check_not_newer(&self, position: u64, epoch: u64) -> Result<()> {
        match self.read(position).await? {
            Some(entry) if entry.epoch > epoch => Err(Error::Fenced {
                path: self.path_of(position).to_string(),
                epoch,
                by_epoch: entry.epoch,
            }),
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::stored_schema;
    use crate::wal::entry::EntryKind;
    use datafusion::arrow::array::{BooleanArray, Int64Array, RecordBatch};
    use datafusion::arrow::datatypes::{DataType, Field, Schema};
    use object_store::memory::InMemory;

    fn entry(epoch: u64, ids: &[i64]) -> WalEntry {
        let table = Schema::new(vec![Field::new("id", DataType::Int64, false)]);
        let batch = RecordBatch::try_new(
            stored_schema(&table, &[]),
            vec![
                Arc::new(Int64Array::from(ids.to_vec())),
                Arc::new(BooleanArray::from(vec![false; ids.len()])),
            ],
        )
        .unwrap();
        WalEntry::data(epoch, 1, vec![batch])
    }

    fn log() -> (Arc<dyn ObjectStore>, WalLog) {
        let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        let wal = WalLog::new(
            Arc::clone(&store),
            paths::wal_dir(&paths::shard_dir("t", 0)),
        );
        (store, wal)
    }

    #[tokio::test]
    async fn appends_replay_in_order_and_a_retry_of_the_same_bytes_is_ok() {
        let (_, wal) = log();
        for (i, ids) in [[1, 2], [3, 4], [5, 6]].iter().enumerate() {
            let bytes = wal.encode(i as u64 + 1, &entry(1, ids)).unwrap();
            wal.append(i as u64 + 1, 1, bytes.clone()).await.unwrap();
            // An attempt that landed, retried: not a fence.
            wal.append(i as u64 + 1, 1, bytes).await.unwrap();
        }
        let replayed = wal.replay(1, 4).await.unwrap();
        assert_eq!(replayed.iter().map(|(p, _)| *p).collect::<Vec<_>>(), [2, 3]);
        assert_eq!(replayed[1].1, entry(1, &[5, 6]));
        assert_eq!(wal.positions_after(0).await.unwrap(), [1, 2, 3]);
        assert!(wal.positions_after(3).await.unwrap().is_empty());
    }

    #[tokio::test]
    async fn a_fence_stops_the_older_writer() {
        let (_, wal) = log();
        wal.append(1, 1, wal.encode(1, &entry(1, &[1])).unwrap())
            .await
            .unwrap();
        // Epoch 2 fences after the tip; epoch 1's next append collides.
        assert_eq!(wal.fence(2, 0).await.unwrap(), 2);
        let err = wal
            .append(2, 1, wal.encode(2, &entry(1, &[2])).unwrap())
            .await
            .unwrap_err();
        match err {
            Error::Fenced {
                epoch,
                by_epoch,
                ref path,
            } => {
                assert_eq!((epoch, by_epoch), (1, 2));
                assert!(path.ends_with("00000000000000000002.arrow"));
            }
            other => panic!("expected Fenced, got {other}"),
        }
        let replayed = wal.replay(0, 3).await.unwrap();
        assert_eq!(replayed.len(), 2);
        assert_eq!(replayed[1].1.kind, EntryKind::Fence);
        // A second fence goes after the first.
        assert_eq!(wal.fence(3, 0).await.unwrap(), 3);
    }

    #[tokio::test]
    async fn a_fence_plugs_a_gap_an_overtaking_entry_explains_and_no_other() {
        let (_, wal) = log();
        let data = |position: u64, landed_through: Option<u64>| WalEntry {
            landed_through,
            ..entry(1, &[position as i64])
        };
        // Epoch 1 had 2 and 3 in flight; 3 landed first, then the writer
        // died. 5 overtook 4 too, but says 4 had landed: 4 was lost.
        for (position, landed_through) in [(1, None), (3, Some(1)), (5, Some(4))] {
            let bytes = wal
                .encode(position, &data(position, landed_through))
                .unwrap();
            wal.append(position, 1, bytes).await.unwrap();
        }
        assert_eq!(wal.fence(2, 0).await.unwrap(), 6);
        // 2 now holds epoch 2's fence: epoch 1's append on its way there
        // fails instead of landing unseen.
        let late = wal.encode(2, &data(2, None)).unwrap();
        assert!(matches!(
            wal.append(2, 1, late).await.unwrap_err(),
            Error::Fenced { by_epoch: 2, .. }
        ));
        // 4 is not plugged: replay reports it.
        let err = wal.replay(0, 6).await.unwrap_err().to_string();
        assert!(err.contains("00000000000000000004.arrow"), "{err}");
        assert!(wal.explains_gap(3, 2).await.unwrap());
        assert!(!wal.explains_gap(5, 4).await.unwrap());
        assert!(!wal.explains_gap(4, 4).await.unwrap(), "absent");
    }

    #[tokio::test]
    async fn a_plug_gives_way_to_an_append_that_landed_first_unless_newer() {
        let (_, wal) = log();
        wal.append(1, 1, wal.encode(1, &entry(1, &[1])).unwrap())
            .await
            .unwrap();
        wal.append(2, 3, wal.encode(2, &entry(3, &[2])).unwrap())
            .await
            .unwrap();
        let fence = WalEntry::fence(2);
        // Epoch 1's append landed between the listing and the plug: kept.
        wal.plug(1, &fence, 2).await.unwrap();
        assert_eq!(wal.read(1).await.unwrap().unwrap(), entry(1, &[1]));
        // Epoch 3 is newer: this writer is fenced.
        assert!(matches!(
            wal.plug(2, &fence, 2).await.unwrap_err(),
            Error::Fenced { by_epoch: 3, .. }
        ));
        wal.plug(3, &fence, 2).await.unwrap();
        assert_eq!(wal.read(3).await.unwrap().unwrap(), fence);
    }

    #[tokio::test]
    async fn replay_reads_an_entry_a_listing_misses() {
        let store = crate::store::FaultyStore::new(Arc::new(InMemory::new()));
        let wal = WalLog::new(store.clone(), paths::wal_dir(&paths::shard_dir("t", 0)));
        for position in 1..=3 {
            let bytes = wal.encode(position, &entry(1, &[position as i64])).unwrap();
            wal.append(position, 1, bytes).await.unwrap();
        }
        store.hide_from_listings(wal.path_of(2).to_string(), 1);
        let replayed = wal.replay(0, 4).await.unwrap();
        assert_eq!(
            replayed.iter().map(|(p, _)| *p).collect::<Vec<_>>(),
            [1, 2, 3]
        );
        assert_eq!(replayed[1].1, entry(1, &[2]));
    }

    #[tokio::test]
    async fn gaps_and_corrupt_entries_fail_replay_naming_the_object() {
        let (store, wal) = log();
        wal.append(1, 1, wal.encode(1, &entry(1, &[1])).unwrap())
            .await
            .unwrap();
        wal.append(3, 1, wal.encode(3, &entry(1, &[3])).unwrap())
            .await
            .unwrap();
        let err = wal.replay(0, 4).await.unwrap_err().to_string();
        assert!(
            err.contains("00000000000000000002.arrow") && err.contains("missing"),
            "{err}"
        );

        let good = wal.encode(2, &entry(1, &[2])).unwrap();
        store
            .put(
                &wal.path_of(2),
                PutPayload::from_bytes(good.slice(..good.len() - 3)),
            )
            .await
            .unwrap();
        let err = wal.replay(0, 4).await.unwrap_err();
        assert!(matches!(err, Error::Corrupt { .. }));
        assert!(
            err.to_string().contains("00000000000000000002.arrow"),
            "{err}"
        );
    }

    #[tokio::test]
    async fn an_entry_after_a_pack_is_read_by_its_head_alone() {
        use crate::store::{Delay, LatencyProfile, LatencyStore, OpKind};
        let none = Delay {
            p50: std::time::Duration::ZERO,
            p99: std::time::Duration::ZERO,
        };
        let counted = LatencyStore::new(
            Arc::new(InMemory::new()),
            LatencyProfile {
                name: "counted",
                put: none,
                get: none,
                list: none,
                delete: none,
                bytes_per_s: u64::MAX,
            },
            1,
        );
        let store: Arc<dyn ObjectStore> = counted.clone();
        let dir = paths::wal_dir(&paths::shard_dir("t", 0));
        let wal = WalLog::new(Arc::clone(&store), dir.clone()).reading_heads(true);
        let got = || counted.count(OpKind::Get);
        // A small head after a 1 MiB pack (read with the pack's last
        // bytes, 64 KiB in all); a head over 64 KiB after one; an entry
        // without a pack over 64 KiB.
        let small = entry(1, &[1, 2]);
        let ids: Vec<i64> = (0..20_000).collect();
        let large = entry(1, &ids);
        let pack = || PutPayload::from(vec![9u8; 1 << 20]);
        let head = wal.encode_after_pack(1, &small).unwrap();
        wal.append_after_pack(1, 1, pack(), head.clone())
            .await
            .unwrap();
        let big_head = wal.encode_after_pack(2, &large).unwrap();
        assert!(big_head.len() > HEAD_READ as usize);
        wal.append_after_pack(2, 1, pack(), big_head.clone())
            .await
            .unwrap();
        let plain = wal.encode(3, &large).unwrap();
        wal.append(3, 1, plain.clone()).await.unwrap();
        for (position, want, bytes, requests) in [
            (1, &small, HEAD_READ, 1),
            (2, &large, HEAD_READ + big_head.len() as u64, 2),
            (3, &large, plain.len() as u64, 2),
        ] {
            let before = got();
            assert_eq!(&wal.read(position).await.unwrap().unwrap(), want);
            let after = got();
            assert_eq!(after.requests - before.requests, requests, "{position}");
            assert_eq!(after.bytes - before.bytes, bytes, "{position}");
        }
        // The same bytes again are its own append; replay reads them all.
        wal.append_after_pack(1, 1, pack(), head).await.unwrap();
        assert_eq!(wal.replay(0, 4).await.unwrap().len(), 3);
        // Read whole, the object decodes the same.
        let whole = WalLog::new(store, dir);
        assert_eq!(whole.read(2).await.unwrap().unwrap(), large);
    }
}
