//! [`WalTail`]: the durable WAL of a shard as a process that does not write
//! it sees it. Entries are immutable, so each is read and decoded once and
//! kept; a refresh reads only positions it has not seen.

use std::sync::Arc;

use datafusion::arrow::array::RecordBatch;
use futures::{StreamExt, TryStreamExt};

use crate::error::{Error, Result};
use crate::memtable::TableSchema;
use crate::wal::{EntryKind, WalLog};

/// WAL objects read at the same time by a refresh.
const READS: usize = 16;

/// The data entries of one shard's WAL after a replay cursor, in position
/// order, cached.
#[derive(Debug)]
pub struct WalTail {
    wal: WalLog,
    schema: Arc<TableSchema>,
    /// The highest position read so far.
    after: u64,
    batches: Vec<RecordBatch>,
}

impl WalTail {
    /// The tail of `wal` after position `after` (nothing read yet).
    pub fn new(wal: WalLog, schema: Arc<TableSchema>, after: u64) -> Self {
        Self {
            wal,
            schema,
            after,
            batches: Vec::new(),
        }
    }

    /// Reads the entries written since the last refresh. Stops before a
    /// missing position (an append still in flight) and picks up from there
    /// next time, so rows are always a prefix of the log.
    pub async fn refresh(&mut self) -> Result<()> {
        let mut dense = Vec::new();
        for position in self.wal.positions_after(self.after).await? {
            if position != self.after + 1 + dense.len() as u64 {
                break;
            }
            dense.push(position);
        }
        let wal = &self.wal;
        let entries: Vec<_> = futures::stream::iter(dense)
            .map(|position| async move {
                let entry = wal.read(position).await?.ok_or_else(|| Error::Corrupt {
                    path: wal.path_of(position).to_string(),
                    reason: "WAL entry vanished".into(),
                })?;
                Ok::<_, Error>((position, entry))
            })
            .buffered(READS)
            .try_collect()
            .await?;
        for (position, entry) in entries {
            if entry.kind == EntryKind::Data {
                for batch in entry.batches {
                    let batch = RecordBatch::try_new(
                        Arc::clone(&self.schema.stored),
                        batch.columns().to_vec(),
                    )
                    .map_err(|e| Error::Corrupt {
                        path: self.wal.path_of(position).to_string(),
                        reason: format!("rows do not fit the table: {e}"),
                    })?;
                    self.batches.push(batch);
                }
            }
            self.after = position;
        }
        Ok(())
    }

    /// The stored batches read so far, oldest first.
    pub fn batches(&self) -> &[RecordBatch] {
        &self.batches
    }
}
