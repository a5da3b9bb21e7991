//! The read path over one shard's layers (DESIGN.md §2, §7): a
//! [`ShardSnapshot`] (MemTables over SSTables) answers scans with the
//! newest version of each key and point lookups newest layer first;
//! [`WalTail`] is the durable WAL after the replay cursor, as a process that
//! does not write the shard sees it.

mod wal_tail;

use std::sync::Arc;

use datafusion::arrow::array::{ArrayRef, RecordBatch, RecordBatchOptions};
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::execution::SendableRecordBatchStream;
use datafusion::execution::memory_pool::MemoryPool;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use futures::StreamExt;

pub use wal_tail::WalTail;

use crate::error::Result;
use crate::memtable::{MemTable, TableSchema};
use crate::sstable::merge::{self, KeyRange, Run};
use crate::sstable::{SstableFile, SstableReader, key_range, newest_per_key_sorted};

/// A MemTable as a snapshot sees it: its first `batches` batches.
#[derive(Debug, Clone)]
pub struct MemLayer {
    pub memtable: Arc<MemTable>,
    pub batches: usize,
}

/// What a reader sees of one shard at one moment: MemTable layers (the
/// writer's frozen and active MemTables, or the durable WAL after the
/// replay cursor) over the SSTables of one shard manifest version. Rows of
/// a later layer are newer than every row of an earlier one.
#[derive(Debug, Clone)]
pub struct ShardSnapshot {
    pub schema: Arc<TableSchema>,
    pub reader: Arc<SstableReader>,
    /// Oldest first.
    pub memtables: Vec<MemLayer>,
    /// Oldest generations first.
    pub sstables: Arc<Vec<SstableFile>>,
}

impl ShardSnapshot {
    /// Rows in every layer, before de-duplication.
    pub fn stored_rows(&self) -> u64 {
        let memtable_rows: usize = self
            .memtables
            .iter()
            .flat_map(|l| l.memtable.batches(0, l.batches))
            .map(|b| b.batch.num_rows())
            .sum();
        memtable_rows as u64 + self.sstables.iter().map(|f| f.rows).sum::<u64>()
    }

    /// A one-line description of the layers (for `EXPLAIN`).
    pub fn describe(&self) -> String {
        let batches: usize = self.memtables.iter().map(|l| l.batches).sum();
        let sstable_rows: u64 = self.sstables.iter().map(|f| f.rows).sum();
        format!(
            "memtables={} ({batches} batches), sstables={} ({sstable_rows} rows)",
            self.memtables.len(),
            self.sstables.len()
        )
    }

    /// The newest version of the key whose encoding is `encoded` and whose
    /// key columns (one row, stored types) are `key`: newest layer first,
    /// stopping at the first hit. A tombstone means absent. User form.
    pub async fn get(&self, encoded: &[u8], key: &[ArrayRef]) -> Result<Option<RecordBatch>> {
        let hit = 'found: {
            for layer in self.memtables.iter().rev() {
                if let Some((batch, row)) = layer.memtable.get_within(encoded, layer.batches) {
                    break 'found Some(batch.slice(row, 1));
                }
            }
            for file in self.sstables.iter().rev() {
                if let Some(row) = self.reader.lookup(file, key).await? {
                    break 'found Some(row);
                }
            }
            None
        };
        match hit {
            Some(row) if !self.schema.tombstone_flags(&row).value(0) => {
                Ok(Some(self.schema.to_user(&row)?))
            }
            _ => Ok(None),
        }
    }

    /// The key ranges of the runs a scan merges: each SSTable's, and the
    /// MemTables' together (absent when empty); `None` where unknown.
    async fn ranges(&self) -> Result<(Vec<Option<KeyRange>>, Option<KeyRange>)> {
        let mut files = Vec::with_capacity(self.sstables.len());
        for file in self.sstables.iter() {
            files.push(self.reader.key_range(file).await?);
        }
        Ok((
            files,
            memtable_key_range(&self.schema, &self.memtable_batches())?,
        ))
    }

    fn memtable_batches(&self) -> Vec<RecordBatch> {
        self.memtables
            .iter()
            .flat_map(|l| l.memtable.batches(0, l.batches))
            .map(|b| b.batch)
            .collect()
    }

    /// This snapshot as at most `parts` snapshots of disjoint key ranges,
    /// in key order, each complete for its range (so each can be scanned
    /// on its own, in parallel): possible when no two runs' key ranges
    /// overlap. Otherwise the snapshot itself.
    pub async fn split(&self, parts: usize) -> Result<Vec<ShardSnapshot>> {
        let (files, memtable) = self.ranges().await?;
        let has_memtable = !self.memtables.is_empty();
        // Runs in key order: `Some(i)` an SSTable, `None` the MemTables.
        let mut runs: Vec<(Option<usize>, KeyRange)> = Vec::new();
        for (i, range) in files.into_iter().enumerate() {
            match range {
                Some(range) => runs.push((Some(i), range)),
                None => return Ok(vec![self.clone()]),
            }
        }
        if let Some(range) = memtable {
            runs.push((None, range));
        } else if has_memtable && self.memtable_batches().iter().any(|b| b.num_rows() > 0) {
            return Ok(vec![self.clone()]);
        }
        if parts < 2
            || runs.len() < 2
            || merge::disjoint_ranges(runs.iter().map(|r| &r.1)).is_none()
        {
            return Ok(vec![self.clone()]);
        }
        runs.sort_by(|a, b| {
            a.1.0
                .partial_cmp(&b.1.0)
                .unwrap_or(std::cmp::Ordering::Equal)
        });
        let per_part = runs.len().div_ceil(parts);
        Ok(runs
            .chunks(per_part)
            .map(|chunk| {
                let with_memtable = chunk.iter().any(|(i, _)| i.is_none());
                ShardSnapshot {
                    schema: Arc::clone(&self.schema),
                    reader: Arc::clone(&self.reader),
                    memtables: if with_memtable {
                        self.memtables.clone()
                    } else {
                        Vec::new()
                    },
                    sstables: Arc::new(
                        chunk
                            .iter()
                            .filter_map(|(i, _)| i.map(|i| self.sstables[i].clone()))
                            .collect(),
                    ),
                }
            })
            .collect())
    }

    /// The live rows (newest version per key, no tombstones), user form
    /// projected to `projection` (all columns if `None`); sorted by key
    /// for a table with a key, in write order for an append-only one.
    pub async fn scan(
        &self,
        projection: Option<&[usize]>,
        pool: &Arc<dyn MemoryPool>,
    ) -> Result<SendableRecordBatchStream> {
        let schema = &self.schema;
        let user: Vec<usize> = match projection {
            Some(p) => p.to_vec(),
            None => (0..schema.schema.fields().len()).collect(),
        };
        let tombstone = schema.stored.fields().len() - 1;
        let (file_ranges, _) = self.ranges().await?;
        let memtable = self.memtable_batches();
        let sorted = match schema.has_key() && !memtable.is_empty() {
            true => Some(newest_per_key_sorted(schema, &memtable)?),
            false => None,
        };
        let memtable_range = match &sorted {
            Some(sorted) => key_range(schema, sorted)?,
            None => None,
        };
        // Overlapping runs are merged by key; disjoint ones need no key.
        let ranges: Option<Vec<&KeyRange>> = file_ranges
            .iter()
            .map(Option::as_ref)
            .chain(sorted.as_ref().map(|_| memtable_range.as_ref()))
            .collect();
        let overlapping = schema.has_key()
            && ranges
                .and_then(|r| merge::disjoint_ranges(r.into_iter()))
                .is_none();
        let mut columns: Vec<usize> = user.clone();
        if overlapping {
            columns.extend(schema.key.iter().copied());
        }
        columns.push(tombstone);
        columns.sort_unstable();
        columns.dedup();

        let mut streams = Vec::with_capacity(self.sstables.len() + 1);
        for file in self.sstables.iter() {
            streams.push(self.reader.stream(file, &columns).await?);
        }
        let rows = if schema.has_key() {
            let mut runs = Vec::with_capacity(streams.len() + 1);
            for ((rows, file), keys) in streams
                .into_iter()
                .zip(self.sstables.iter())
                .zip(file_ranges)
            {
                runs.push(Run {
                    rows,
                    seq: file.generation,
                    keys,
                });
            }
            if let Some(sorted) = sorted {
                let keys = memtable_range;
                let sorted = sorted.project(&columns)?;
                runs.push(Run {
                    rows: one_batch(Arc::new(schema.stored.project(&columns)?), sorted),
                    seq: u64::MAX,
                    keys,
                });
            }
            merge::merge_runs(schema, &columns, runs, false, pool)?
        } else {
            let projected = Arc::new(schema.stored.project(&columns)?);
            for batch in memtable {
                streams.push(one_batch(Arc::clone(&projected), batch.project(&columns)?));
            }
            merge::concat(projected, streams)
        };
        // The projection's positions among `columns`, in user form.
        let positions: Vec<usize> = user
            .iter()
            .map(|c| {
                columns
                    .binary_search(c)
                    .expect("projected columns are read")
            })
            .collect();
        let out: SchemaRef = Arc::new(schema.schema.project(&user)?);
        let out_schema = Arc::clone(&out);
        let rows = rows.map(move |batch| {
            let batch = batch?;
            let options = RecordBatchOptions::new().with_row_count(Some(batch.num_rows()));
            Ok(RecordBatch::try_new_with_options(
                Arc::clone(&out_schema),
                batch.project(&positions)?.columns().to_vec(),
                &options,
            )?)
        });
        Ok(Box::pin(RecordBatchStreamAdapter::new(out, rows)))
    }

    /// Every live row, collected (user form, all columns).
    pub async fn collect(&self, pool: &Arc<dyn MemoryPool>) -> Result<Vec<RecordBatch>> {
        let stream = self.scan(None, pool).await?;
        Ok(futures::TryStreamExt::try_collect(stream).await?)
    }
}

fn one_batch(schema: SchemaRef, batch: RecordBatch) -> SendableRecordBatchStream {
    Box::pin(RecordBatchStreamAdapter::new(
        schema,
        futures::stream::once(async move { Ok(batch) }),
    ))
}

/// The smallest and largest key among `batches` (stored form, tombstones
/// included), for a table with a one-column key.
fn memtable_key_range(schema: &TableSchema, batches: &[RecordBatch]) -> Result<Option<KeyRange>> {
    use datafusion::functions_aggregate::min_max::{MaxAccumulator, MinAccumulator};
    use datafusion::logical_expr::Accumulator;
    let [key] = schema.key.as_slice() else {
        return Ok(None);
    };
    if batches.iter().all(|b| b.num_rows() == 0) {
        return Ok(None);
    }
    let data_type = schema.stored.field(*key).data_type();
    let mut min = MinAccumulator::try_new(data_type)?;
    let mut max = MaxAccumulator::try_new(data_type)?;
    for batch in batches {
        let column = Arc::clone(batch.column(*key));
        min.update_batch(std::slice::from_ref(&column))?;
        max.update_batch(&[column])?;
    }
    Ok(Some((min.evaluate()?, max.evaluate()?)))
}
