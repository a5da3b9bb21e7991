//! [`WalTail`]: the durable WAL of a shard after the manifest's replay
//! cursor, as a process that does not write the shard sees it. Entries are
//! immutable, so each is read and decoded once and kept (in a MemTable, so
//! lookups use its key index) until the cursor passes it.

use std::sync::Arc;

use futures::{StreamExt, TryStreamExt};

use crate::error::{Error, Result};
use crate::memtable::{MemLayer, MemTable, Watermark};
use crate::schema::TableSchema;
use crate::wal::{EntryKind, WalLog};

/// WAL objects read at the same time by a refresh.
const READS: usize = 16;

/// The data entries of one shard's WAL after a replay cursor, in position
/// order, cached.
#[derive(Debug)]
pub struct WalTail {
    wal: WalLog,
    schema: Arc<TableSchema>,
    /// The replay cursor the cached entries are after.
    cursor: u64,
    /// The highest position read so far (at least `cursor`).
    read_through: u64,
    memtable: Arc<MemTable>,
    /// Every cached data entry, in position order.
    entries: Vec<Cached>,
    /// The newest writer epoch of the entries read.
    epoch: u64,
}

/// A data entry of the tail.
#[derive(Debug, Clone, Copy)]
struct Cached {
    position: u64,
    /// MemTable batches up to and including the entry's.
    end: usize,
    /// The MemTable generation its rows belong to, and how many it holds.
    generation: u64,
    rows: u64,
}

impl WalTail {
    /// The tail of `wal` (nothing read yet).
    pub fn new(wal: WalLog, schema: Arc<TableSchema>) -> Self {
        Self {
            memtable: Arc::new(MemTable::new(Arc::clone(&schema))),
            wal,
            schema,
            cursor: 0,
            read_through: 0,
            entries: Vec::new(),
            epoch: 0,
        }
    }

    /// The newest writer epoch of the entries read: one newer than the
    /// shard manifest a refresh used says a writer claimed the shard since.
    pub fn newest_epoch(&self) -> u64 {
        self.epoch
    }

    /// Brings the tail to the entries after `cursor` (a replay cursor of
    /// the shard manifest) that exist now. Returns the position of an
    /// entry after `cursor` that is gone, if one is: a writer moved it into
    /// an SSTable and a newer manifest (the caller should read that and
    /// refresh again) or, if the manifest did not change, it is lost.
    pub async fn refresh(&mut self, cursor: u64) -> Result<Option<u64>> {
        self.forget_through(cursor)?;
        let positions = match self.readable().await? {
            Ok(positions) => positions,
            Err(gone) => return Ok(Some(gone)),
        };
        let wal = &self.wal;
        let entries: Vec<_> = futures::stream::iter(positions)
            .map(|position| async move { Ok::<_, Error>((position, wal.read(position).await?)) })
            .buffered(READS)
            .try_collect()
            .await?;
        for (position, entry) in entries {
            let Some(entry) = entry else {
                return Ok(Some(position));
            };
            self.epoch = self.epoch.max(entry.epoch);
            if entry.kind == EntryKind::Data {
                let mut put = Vec::with_capacity(entry.batches.len());
                for batch in entry.batches {
                    let batch = datafusion::arrow::array::RecordBatch::try_new(
                        Arc::clone(&self.schema.stored),
                        batch.columns().to_vec(),
                    )
                    .map_err(|e| Error::Corrupt {
                        path: self.wal.path_of(position).to_string(),
                        reason: format!("rows do not fit the table: {e}"),
                    })?;
                    put.push(self.schema.keyed(batch)?);
                }
                let rows = put.iter().map(|(b, _)| b.num_rows() as u64).sum();
                let (end, _) = self.memtable.append(put);
                self.memtable.mark_durable(end);
                self.entries.push(Cached {
                    position,
                    end,
                    generation: entry.generation,
                    rows,
                });
            }
            self.read_through = position;
        }
        Ok(None)
    }

    /// The positions after those read that the tail can read now, or
    /// `Err` with the first one that is gone.
    ///
    /// A listing is dense unless entries were deleted under the cursor we
    /// were given, or the writer has appends in flight (or had, when it
    /// died) and a later one landed first. Nothing at or after such a gap
    /// is acknowledged: the tail ends before it until it fills. A listing
    /// of a local directory is no snapshot either: it can miss an entry
    /// renamed into it while it ran and show a later one, so a position
    /// the listing lacks is asked for before it counts as missing.
    async fn readable(&self) -> Result<std::result::Result<Vec<u64>, u64>> {
        let listed = self.wal.positions_after(self.read_through).await?;
        let mut positions = Vec::with_capacity(listed.len());
        let mut expected = self.read_through + 1;
        for present in listed {
            while expected < present {
                if self.wal.exists(expected).await? {
                    positions.push(expected);
                } else if self.wal.explains_gap(present, expected).await? {
                    return Ok(Ok(positions));
                } else {
                    return Ok(Err(expected));
                }
                expected += 1;
            }
            positions.push(present);
            expected = present + 1;
        }
        Ok(Ok(positions))
    }

    /// Forgets the entries at or below `cursor` (a newer manifest's
    /// replay cursor: its SSTables hold them).
    pub fn forget_through(&mut self, cursor: u64) -> Result<()> {
        if cursor <= self.cursor {
            return Ok(());
        }
        let gone = self.entries.partition_point(|e| e.position <= cursor);
        let memtable = Arc::new(MemTable::new(Arc::clone(&self.schema)));
        if gone < self.entries.len() {
            let from = if gone == 0 {
                0
            } else {
                self.entries[gone - 1].end
            };
            let mut start = from;
            let mut kept = Vec::with_capacity(self.entries.len() - gone);
            for entry in &self.entries[gone..] {
                let put = self
                    .memtable
                    .batches(start, entry.end)
                    .into_iter()
                    .map(|b| self.schema.keyed(b.batch))
                    .collect::<Result<Vec<_>>>()?;
                kept.push(Cached {
                    end: memtable.append(put).0,
                    ..*entry
                });
                start = entry.end;
            }
            memtable.mark_durable(memtable.written_batches());
            self.entries = kept;
        } else {
            self.entries.clear();
        }
        self.memtable = memtable;
        self.cursor = cursor;
        self.read_through = self.read_through.max(cursor);
        Ok(())
    }

    /// The object of WAL position `position`.
    pub fn path_of(&self, position: u64) -> object_store::path::Path {
        self.wal.path_of(position)
    }

    /// How far the cached rows reach (see [`Watermark`]); `None` if no
    /// data entry is cached.
    pub fn seen(&self) -> Option<Watermark> {
        let generation = self.entries.last()?.generation;
        let rows = (self.entries.iter().rev())
            .take_while(|e| e.generation == generation)
            .map(|e| e.rows)
            .sum();
        Some(Watermark { generation, rows })
    }

    /// The cached rows as a MemTable layer.
    pub fn layer(&self) -> MemLayer {
        MemLayer {
            memtable: Arc::clone(&self.memtable),
            batches: self.memtable.written_batches(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::TableMeta;
    use crate::store::paths;
    use crate::wal::WalEntry;
    use datafusion::arrow::array::{Int64Array, RecordBatch};
    use datafusion::arrow::datatypes::{DataType, Field, Schema};
    use object_store::memory::InMemory;

    fn table() -> Arc<TableSchema> {
        let schema = Schema::new(vec![Field::new("id", DataType::Int64, false)]);
        let meta = TableMeta::new(&schema, vec!["id".into()], &[]).unwrap();
        Arc::new(TableSchema::new(&meta))
    }

    async fn append(wal: &WalLog, t: &TableSchema, position: u64, landed_through: Option<u64>) {
        let rows = RecordBatch::try_new(
            Arc::clone(&t.schema),
            vec![Arc::new(Int64Array::from(vec![position as i64]))],
        )
        .unwrap();
        let entry = WalEntry {
            landed_through,
            ..WalEntry::data(1, 1, vec![t.to_stored(&rows).unwrap()])
        };
        let bytes = wal.encode(position, &entry).unwrap();
        wal.append(position, 1, bytes).await.unwrap();
    }

    fn rows(tail: &WalTail) -> usize {
        let layer = tail.layer();
        let batches = layer.memtable.batches(0, layer.batches);
        batches.iter().map(|b| b.batch.num_rows()).sum()
    }

    #[tokio::test]
    async fn the_tail_ends_before_an_append_in_flight_and_reports_a_lost_entry() {
        let t = table();
        let wal = WalLog::new(
            Arc::new(InMemory::new()),
            paths::wal_dir(&paths::shard_dir("t", 0)),
        );
        append(&wal, &t, 1, None).await;
        // 3 overtook 2, still in flight: nothing from 2 on is acknowledged.
        append(&wal, &t, 3, Some(1)).await;
        let mut tail = WalTail::new(wal.clone(), Arc::clone(&t));
        assert_eq!(tail.refresh(0).await.unwrap(), None);
        assert_eq!(rows(&tail), 1);
        // 2 lands: the tail goes on through 3.
        append(&wal, &t, 2, None).await;
        assert_eq!(tail.refresh(0).await.unwrap(), None);
        assert_eq!(rows(&tail), 3);
        // 5 says 4 had landed: 4 is gone, not in flight.
        append(&wal, &t, 5, None).await;
        assert_eq!(tail.refresh(0).await.unwrap(), Some(4));
        assert_eq!(rows(&tail), 3);
    }

    #[tokio::test]
    async fn an_entry_a_listing_missed_is_read_not_reported_lost() {
        let t = table();
        let store = crate::store::FaultyStore::new(Arc::new(InMemory::new()));
        let wal = WalLog::new(store.clone(), paths::wal_dir(&paths::shard_dir("t", 0)));
        for position in 1..=3 {
            append(&wal, &t, position, None).await;
        }
        // The first listing misses 2, which had landed before 3.
        store.hide_from_listings(wal.path_of(2).to_string(), 1);
        let mut tail = WalTail::new(wal.clone(), Arc::clone(&t));
        assert_eq!(tail.refresh(0).await.unwrap(), None);
        assert_eq!(rows(&tail), 3);
    }
}
