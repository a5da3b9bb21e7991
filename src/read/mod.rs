//! The read path over one shard's layers (DESIGN.md §2, §7): a
//! [`ShardSnapshot`] (MemTables over SSTables) answers scans with the
//! newest version of each key and point lookups newest layer first;
//! [`WalTail`] is the durable WAL after the replay cursor, as a process that
//! does not write the shard sees it; [`ShardSnapshot::vector_search`] finds
//! the nearest live rows across the layers.

mod vector;
mod wal_tail;

use std::cmp::Ordering;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use datafusion::arrow::array::{ArrayRef, AsArray, BooleanArray, RecordBatch, RecordBatchOptions};
use datafusion::arrow::compute::{concat_batches, filter_record_batch};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::arrow::row::RowConverter;
use datafusion::common::ScalarValue;
use datafusion::error::DataFusionError;
use datafusion::execution::SendableRecordBatchStream;
use datafusion::execution::memory_pool::MemoryPool;
use datafusion::physical_plan::PhysicalExpr;
use datafusion::physical_plan::metrics::{
    BaselineMetrics, Count, ExecutionPlanMetricsSet, MetricBuilder,
};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use futures::{StreamExt, TryStreamExt};
use serde::{Deserialize, Serialize};

pub use vector::{Neighbour, SearchMetrics, VectorQuery};
pub use wal_tail::WalTail;

use crate::blob::{self, PackReader};
use crate::error::Result;
use crate::memtable::{MemLayer, Watermark};
use crate::schema::{BlobColumn, TableSchema, owned_row};
use crate::sstable::merge::{self, KeyRange, Run};
use crate::sstable::{
    DeletionVector, ReadMetrics, SstableFile, SstableReader, deletions_complete,
    newest_per_key_sorted,
};

/// What a reader sees of one shard at one moment: MemTable layers (the
/// writer's frozen and active MemTables, or the durable WAL after the
/// replay cursor) over the SSTables of one shard manifest version. Rows of
/// a later layer are newer than every row of an earlier one.
#[derive(Debug, Clone)]
pub struct ShardSnapshot {
    /// The table's schema and stored row form.
    pub schema: Arc<TableSchema>,
    /// Reads the SSTables (its caches are the shard's).
    pub reader: Arc<SstableReader>,
    /// Reads the shard's blob packs.
    pub packs: PackReader,
    /// Oldest first.
    pub memtables: Vec<MemLayer>,
    /// Oldest generations first.
    pub sstables: Arc<Vec<SstableFile>>,
    /// How far it reaches into the shard's log (`None` if not known: rows
    /// shipped from another process).
    pub seen: Option<Watermark>,
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
    /// SSTable reads are counted in `metrics`.
    pub async fn get(
        &self,
        encoded: &[u8],
        key: &[ArrayRef],
        metrics: &ReadMetrics,
    ) -> Result<Option<RecordBatch>> {
        match self.get_stored(encoded, key, metrics).await? {
            Some(row) => {
                let row = self.read_blobs(row).await?;
                Ok(Some(self.schema.to_user(&row)?))
            }
            None => Ok(None),
        }
    }

    /// Like [`ShardSnapshot::get`], the columns `projection` (table column
    /// indices) of the row, with the blob columns `sizes` among them as
    /// the `Int64` sizes of their values (see [`blob::sizes`]): packs are
    /// read only for the other blob columns of `projection`.
    pub(crate) async fn get_sized(
        &self,
        encoded: &[u8],
        key: &[ArrayRef],
        projection: &[usize],
        sizes: &[usize],
        metrics: &ReadMetrics,
    ) -> Result<Option<Vec<ArrayRef>>> {
        let Some(row) = self.get_stored(encoded, key, metrics).await? else {
            return Ok(None);
        };
        let sized: Vec<(usize, ArrayRef)> = self
            .schema
            .blobs
            .iter()
            .filter(|b| sizes.contains(&b.index))
            .map(|b| {
                let descriptors = row.column(b.descriptor).as_struct();
                let sizes: ArrayRef = Arc::new(blob::sizes(row.column(b.index), descriptors));
                (b.index, sizes)
            })
            .collect();
        let every: Vec<usize> = (0..row.num_columns()).collect();
        let unread: Vec<usize> = (self.schema.blobs.iter())
            .map(|b| b.index)
            .filter(|c| !projection.contains(c) || sizes.contains(c))
            .collect();
        let row = (self.packs.counting(&metrics.bytes_read))
            .resolve_except(&self.schema, &every, row, &unread)
            .await?;
        let user = self.schema.to_user(&row)?;
        Ok(Some(
            projection
                .iter()
                .map(|&c| match sized.iter().find(|(b, _)| *b == c) {
                    Some((_, sizes)) => Arc::clone(sizes),
                    None => Arc::clone(user.column(c)),
                })
                .collect(),
        ))
    }

    /// Like [`ShardSnapshot::get`], in stored form, long blob values not
    /// read (their descriptors name them).
    pub(crate) async fn get_stored(
        &self,
        encoded: &[u8],
        key: &[ArrayRef],
        metrics: &ReadMetrics,
    ) -> Result<Option<RecordBatch>> {
        let hit = 'found: {
            for layer in self.memtables.iter().rev() {
                if let Some((batch, row)) = layer.memtable.get_within(encoded, layer.batches) {
                    break 'found Some(owned_row(&batch, row)?);
                }
            }
            for file in self.sstables.iter().rev() {
                if let Some(row) = self.reader.lookup(file, key, metrics).await? {
                    break 'found Some(row);
                }
            }
            None
        };
        Ok(hit.filter(|row| !self.schema.tombstone_flags(row).value(0)))
    }

    /// The value of blob column `blob` in `row` (stored form, one row, as
    /// [`ShardSnapshot::get_stored`] returns it) as a stream of chunks: a
    /// packed value is read with one ranged GET and never held whole; see
    /// [`blob::PackReader::stream`]. `None` if NULL.
    pub(crate) async fn stream_blob(
        &self,
        blob: &BlobColumn,
        row: &RecordBatch,
    ) -> Result<Option<blob::BlobStream>> {
        Ok(match blob::stored_value(blob, row, 0) {
            None => None,
            Some(Ok(inline)) => Some(futures::stream::once(async { Ok(inline) }).boxed()),
            Some(Err(packed)) => Some(self.packs.stream(packed).await?),
        })
    }

    /// `rows` (stored form, every column, of this snapshot's shard) with
    /// their long blob values read back from the packs.
    pub async fn read_blobs(&self, rows: RecordBatch) -> Result<RecordBatch> {
        self.read_blobs_counted(rows, &Count::new()).await
    }

    /// [`ShardSnapshot::read_blobs`], counting the bytes read in
    /// `bytes_read`.
    pub(crate) async fn read_blobs_counted(
        &self,
        rows: RecordBatch,
        bytes_read: &Count,
    ) -> Result<RecordBatch> {
        let every: Vec<usize> = (0..rows.num_columns()).collect();
        let packs = self.packs.counting(bytes_read);
        packs.resolve(&self.schema, &every, rows).await
    }

    /// The visible MemTable rows, stored form, oldest first.
    pub(crate) fn memtable_batches(&self) -> Vec<RecordBatch> {
        self.memtables
            .iter()
            .flat_map(|l| l.memtable.batches(0, l.batches))
            .map(|b| b.batch)
            .collect()
    }

    /// How to scan this snapshot in at most `parts` partitions, each over
    /// a key range of its own (see `ScanPart`).
    ///
    /// Rows of a key can be in every run (each SSTable, and the MemTables
    /// together), but runs written at different times mostly cover
    /// different keys. So the pieces of the runs — SSTable row groups and
    /// the MemTable rows — are grouped into clusters of overlapping key
    /// ranges: a cluster of one piece is read as it is, only the others
    /// are merged. Without known key ranges (a composite key, missing
    /// statistics) the whole snapshot is one merged cluster; an
    /// append-only table's rows are read one layer after another.
    ///
    /// Pieces whose key range lies outside `bounds` (the keys a pushed-down
    /// filter on the key can accept) are skipped: no row in them can pass
    /// that filter, and no newer version of one of their keys can either.
    pub async fn parts(&self, parts: usize, bounds: &KeyBounds) -> Result<Vec<ScanPart>> {
        let whole = |pieces: Vec<Piece>| ScanPart {
            snapshot: self.clone(),
            rows: self.stored_rows(),
            clusters: match pieces.is_empty() {
                true => Vec::new(),
                false => vec![pieces],
            },
            unmerged: None,
        };
        let mut all: Vec<Piece> = (0..self.sstables.len()).map(Piece::File).collect();
        let memtable_rows: u64 = self
            .memtable_batches()
            .iter()
            .map(|b| b.num_rows() as u64)
            .sum();
        if memtable_rows > 0 {
            all.push(Piece::Memtable);
        }
        if !self.schema.has_key() {
            return Ok(vec![whole(all)]);
        }
        // (piece, key range, rows), for every piece.
        let mut pieces = Vec::new();
        for (i, file) in self.sstables.iter().enumerate() {
            let Some(groups) = self.reader.row_group_ranges(file).await? else {
                return Ok(vec![whole(all)]);
            };
            for (g, (range, rows)) in groups.into_iter().enumerate() {
                pieces.push((Piece::RowGroup(i, g), range, rows));
            }
        }
        if memtable_rows > 0 {
            let Some(range) = memtable_key_range(&self.schema, &self.memtable_batches())? else {
                return Ok(vec![whole(all)]);
            };
            pieces.push((Piece::Memtable, range, memtable_rows));
        }
        pieces.retain(|(_, (lo, hi), _)| bounds.may_overlap(lo, hi));
        pieces.sort_by(|a, b| a.1.0.partial_cmp(&b.1.0).unwrap_or(Ordering::Equal));
        let piece_rows: HashMap<Piece, u64> = pieces.iter().map(|(p, _, r)| (*p, *r)).collect();
        // Sweep in key order: a piece that starts at or before the largest
        // key seen so far joins the current cluster.
        let mut clusters: Vec<(Vec<Piece>, u64)> = Vec::new();
        let mut reach: Option<ScalarValue> = None;
        for (piece, (lo, hi), rows) in pieces {
            let joins = reach
                .as_ref()
                .is_some_and(|r| lo.partial_cmp(r) != Some(Ordering::Greater));
            match (joins, clusters.last_mut()) {
                (true, Some((cluster, total))) => {
                    cluster.push(piece);
                    *total += rows;
                }
                _ => clusters.push((vec![piece], rows)),
            }
            if reach
                .as_ref()
                .is_none_or(|r| hi.partial_cmp(r) == Some(Ordering::Greater))
            {
                reach = Some(hi);
            }
        }
        // Overlapping runs need no merge if the deletion vectors mark every
        // row a newer SSTable holds: each piece is read on its own, minus
        // its marked rows and (if the MemTables' keys overlap it) the rows
        // whose keys the MemTables hold. That costs the order by key, so
        // only where most rows would be merged (random keys) rather than a
        // few at the edges of runs (keys written in order).
        let total: u64 = clusters.iter().map(|c| c.1).sum();
        let merged: u64 = clusters
            .iter()
            .filter(|(c, _)| c.len() > 1)
            .map(|c| c.1)
            .sum();
        let mut unmerged = None;
        if 2 * merged > total && deletions_complete(&self.sstables) {
            let deletions = futures::future::try_join_all(
                self.sstables.iter().map(|f| self.reader.deletions(f)),
            )
            .await?;
            let under_memtable = clusters
                .iter()
                .filter(|(c, _)| c.len() > 1 && c.contains(&Piece::Memtable))
                .flat_map(|(c, _)| c.iter().copied())
                .filter(|p| *p != Piece::Memtable)
                .collect();
            unmerged = Some(Arc::new(Unmerged {
                deletions: tokio::sync::OnceCell::new_with(Some(deletions)),
                under_memtable,
                memtable: tokio::sync::OnceCell::new(),
            }));
            clusters = clusters
                .into_iter()
                .flat_map(|(c, _)| c)
                .map(|p| (vec![p], piece_rows[&p]))
                .collect();
        }
        // Consecutive clusters into parts of about equal rows.
        let per_part = total.div_ceil(parts.max(1) as u64).max(1);
        let mut out: Vec<ScanPart> = Vec::new();
        let mut rows_in_last = u64::MAX;
        for (cluster, rows) in clusters {
            if rows_in_last >= per_part {
                out.push(ScanPart {
                    snapshot: self.clone(),
                    rows: 0,
                    clusters: Vec::new(),
                    unmerged: unmerged.clone(),
                });
                rows_in_last = 0;
            }
            let part = out.last_mut().expect("pushed above");
            part.clusters.push(cluster);
            part.rows += rows;
            rows_in_last += rows;
        }
        if out.is_empty() {
            out.push(whole(Vec::new()));
        }
        Ok(out)
    }

    /// Every live row, collected (user form, all columns).
    pub async fn collect(&self, pool: &Arc<dyn MemoryPool>) -> Result<Vec<RecordBatch>> {
        let mut out = Vec::new();
        for part in self.parts(1, &KeyBounds::all()).await? {
            let stream = part.scan(None, pool, &ScanMetrics::unrecorded()).await?;
            out.extend(futures::TryStreamExt::try_collect::<Vec<_>>(stream).await?);
        }
        Ok(out)
    }
}

/// The keys a scan needs (of a one-column key): every row outside is
/// filtered out above the scan.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct KeyBounds {
    /// The smallest key and whether it is included.
    pub lower: Option<(ScalarValue, bool)>,
    /// The largest key and whether it is included.
    pub upper: Option<(ScalarValue, bool)>,
}

impl KeyBounds {
    /// No bound: every key.
    pub fn all() -> Self {
        Self::default()
    }

    /// Narrows the bounds by `key > value` (`inclusive`: `>=`).
    pub fn above(&mut self, value: ScalarValue, inclusive: bool) {
        tighten(&mut self.lower, value, inclusive, Ordering::Greater);
    }

    /// Narrows the bounds by `key < value` (`inclusive`: `<=`).
    pub fn below(&mut self, value: ScalarValue, inclusive: bool) {
        tighten(&mut self.upper, value, inclusive, Ordering::Less);
    }

    /// Whether keys in `lo..=hi` may be within the bounds (an
    /// incomparable bound never excludes anything).
    pub fn may_overlap(&self, lo: &ScalarValue, hi: &ScalarValue) -> bool {
        let below_lower =
            self.lower
                .as_ref()
                .is_some_and(|(v, inclusive)| match hi.partial_cmp(v) {
                    Some(Ordering::Less) => true,
                    Some(Ordering::Equal) => !inclusive,
                    _ => false,
                });
        let above_upper =
            self.upper
                .as_ref()
                .is_some_and(|(v, inclusive)| match lo.partial_cmp(v) {
                    Some(Ordering::Greater) => true,
                    Some(Ordering::Equal) => !inclusive,
                    _ => false,
                });
        !below_lower && !above_upper
    }
}

/// Replaces `bound` by `(value, inclusive)` if that admits fewer keys:
/// `value` lies further in direction `inward`, or equal and exclusive.
fn tighten(
    bound: &mut Option<(ScalarValue, bool)>,
    value: ScalarValue,
    inclusive: bool,
    inward: Ordering,
) {
    let tighter = match bound {
        None => true,
        Some((v, inc)) => match value.partial_cmp(v) {
            Some(o) if o == inward => true,
            Some(Ordering::Equal) => *inc && !inclusive,
            _ => false,
        },
    };
    if tighter {
        *bound = Some((value, inclusive));
    }
}

/// What a scan records for `EXPLAIN ANALYZE` (DataFusion metrics; clones
/// count into the same ones).
#[derive(Debug, Clone)]
pub struct ScanMetrics {
    /// The SSTable reads.
    pub read: ReadMetrics,
    /// Rows read from the MemTables (newest version per key among them)
    /// and from SSTables, before the merge.
    pub memtable_rows: Count,
    /// See [`ScanMetrics::memtable_rows`].
    pub sstable_rows: Count,
    /// The merges of overlapping runs: their time and the rows they ordered
    /// (older versions are dropped after).
    pub merge: BaselineMetrics,
}

impl ScanMetrics {
    /// Metrics of `partition` registered in `set`; the merge's in
    /// `merge_set` (their names are DataFusion's operator names).
    pub fn new(
        set: &ExecutionPlanMetricsSet,
        merge_set: &ExecutionPlanMetricsSet,
        partition: usize,
    ) -> Self {
        Self {
            read: ReadMetrics::new(set, partition),
            memtable_rows: MetricBuilder::new(set).counter("memtable_rows", partition),
            sstable_rows: MetricBuilder::new(set).counter("sstable_rows", partition),
            merge: BaselineMetrics::new(merge_set, partition),
        }
    }

    /// Metrics recorded nowhere.
    pub fn unrecorded() -> Self {
        let set = ExecutionPlanMetricsSet::new();
        Self::new(&set, &set, 0)
    }
}

/// A piece of a shard's rows for a scan.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
enum Piece {
    /// A whole SSTable (by index in the snapshot).
    File(usize),
    /// One row group of an SSTable.
    RowGroup(usize, usize),
    /// The MemTables' rows, sorted (newest version per key).
    Memtable,
}

/// What one scan partition reads of a shard snapshot: clusters of pieces,
/// in key order for a table with a key; the pieces of a cluster are
/// merged, and no key is in two clusters (or two parts). Unless the
/// pieces are read `unmerged`: then each cluster is one piece, whose rows
/// no other piece holds a newer version of once its deletion vector's
/// marks (and the MemTables' keys) are left out.
#[derive(Debug, Clone)]
pub struct ScanPart {
    snapshot: ShardSnapshot,
    /// Rows in the pieces, before de-duplication.
    rows: u64,
    clusters: Vec<Vec<Piece>>,
    unmerged: Option<Arc<Unmerged>>,
}

/// How a [`ScanPart`] reads its snapshot, without the snapshot: what a
/// part carries to another process (see `crate::sql::distributed`), which reads
/// the same SSTables and MemTable rows.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PartLayout {
    rows: u64,
    clusters: Vec<Vec<Piece>>,
    /// Read unmerged: the SSTable pieces under the MemTables' rows.
    unmerged: Option<Vec<Piece>>,
}

/// What reading the pieces of a snapshot unmerged needs.
#[derive(Debug)]
struct Unmerged {
    /// The deletion vector of each SSTable of the snapshot (read when first
    /// needed by a part that was shipped).
    deletions: tokio::sync::OnceCell<Vec<Option<Arc<DeletionVector>>>>,
    /// The SSTable pieces whose key ranges overlap the MemTables' rows.
    under_memtable: HashSet<Piece>,
    /// See [`Unmerged::memtable`].
    memtable: tokio::sync::OnceCell<Arc<MemtableRows>>,
}

impl ScanPart {
    /// Rows in the pieces, before de-duplication.
    pub fn stored_rows(&self) -> u64 {
        self.rows
    }

    /// The snapshot it reads.
    pub fn snapshot(&self) -> &ShardSnapshot {
        &self.snapshot
    }

    /// How it reads its snapshot; [`ScanPart::from_layout`] takes it back.
    pub fn layout(&self) -> PartLayout {
        PartLayout {
            rows: self.rows,
            clusters: self.clusters.clone(),
            unmerged: (self.unmerged.as_ref()).map(|u| u.under_memtable.iter().copied().collect()),
        }
    }

    /// The part of `snapshot` laid out as `layout` says (the layout of a
    /// part of a snapshot with the same SSTables and MemTable rows).
    pub fn from_layout(snapshot: ShardSnapshot, layout: PartLayout) -> Result<Self> {
        let files = snapshot.sstables.len();
        let pieces = layout.clusters.iter().flatten();
        if let Some(bad) = pieces
            .chain(layout.unmerged.iter().flatten())
            .find(|p| match p {
                Piece::File(i) | Piece::RowGroup(i, _) => *i >= files,
                Piece::Memtable => false,
            })
        {
            return Err(crate::error::Error::invalid(format!(
                "a scan part names {bad:?} of a snapshot of {files} SSTables"
            )));
        }
        Ok(Self {
            snapshot,
            rows: layout.rows,
            clusters: layout.clusters,
            unmerged: layout.unmerged.map(|under| {
                Arc::new(Unmerged {
                    deletions: tokio::sync::OnceCell::new(),
                    under_memtable: under.into_iter().collect(),
                    memtable: tokio::sync::OnceCell::new(),
                })
            }),
        })
    }

    /// A part of `snapshot` that reads nothing.
    pub fn empty(snapshot: ShardSnapshot) -> Self {
        Self {
            snapshot,
            rows: 0,
            clusters: Vec::new(),
            unmerged: None,
        }
    }

    /// Whether reading it reads the snapshot's MemTable rows.
    pub fn reads_memtables(&self) -> bool {
        let under = self.unmerged.as_ref();
        self.clusters
            .iter()
            .flatten()
            .any(|p| *p == Piece::Memtable || under.is_some_and(|u| u.under_memtable.contains(p)))
    }

    /// Whether the rows come sorted by key (a table with a key, read
    /// merged).
    pub fn sorted(&self) -> bool {
        self.snapshot.schema.has_key() && self.unmerged.is_none()
    }

    /// A one-line description of the layers and the merging (for
    /// `EXPLAIN`).
    pub fn describe(&self) -> String {
        if self.clusters.is_empty() && self.unmerged.is_none() {
            // An empty shard, or a part that pads a plan to more tasks.
            return "reads nothing".into();
        }
        let merged = self.clusters.iter().filter(|c| c.len() > 1).count();
        let pieces: Vec<&Piece> = self.clusters.iter().flatten().collect();
        let groups = pieces
            .iter()
            .filter(|p| matches!(p, Piece::RowGroup(..)))
            .count();
        let files = pieces
            .iter()
            .filter(|p| matches!(p, Piece::File(_)))
            .count();
        let memtable = pieces.contains(&&Piece::Memtable);
        let how = match self.unmerged {
            Some(_) => "unmerged: deletion vectors".to_string(),
            None => format!("{merged} merged"),
        };
        format!(
            "{}; reads {groups} row groups, {files} whole SSTables{} in {} clusters ({how})",
            self.snapshot.describe(),
            if memtable { ", the MemTables" } else { "" },
            self.clusters.len()
        )
    }

    /// The live rows (newest version per key, no tombstones) of this part,
    /// user form projected to `projection` (all columns if `None`); sorted
    /// by key for a table with a key, in write order for an append-only
    /// one.
    pub async fn scan(
        &self,
        projection: Option<&[usize]>,
        pool: &Arc<dyn MemoryPool>,
        metrics: &ScanMetrics,
    ) -> Result<SendableRecordBatchStream> {
        self.scan_sizes(projection, &[], None, pool, metrics).await
    }

    /// Like [`ScanPart::scan`], with the blob columns `sizes` (table
    /// column indices, projected) as the `Int64` sizes of their values,
    /// read from their descriptors: no pack is read for them (see
    /// [`blob::sizes`]); and only the rows `early` (a predicate over the
    /// output, reading no blob column) keeps get their blob values read,
    /// the others are dropped.
    pub async fn scan_sizes(
        &self,
        projection: Option<&[usize]>,
        sizes: &[usize],
        early: Option<&Arc<dyn PhysicalExpr>>,
        pool: &Arc<dyn MemoryPool>,
        metrics: &ScanMetrics,
    ) -> Result<SendableRecordBatchStream> {
        let snapshot = &self.snapshot;
        let schema = &snapshot.schema;
        let user: Vec<usize> = match projection {
            Some(p) => p.to_vec(),
            None => (0..schema.schema.fields().len()).collect(),
        };
        let tombstone = schema.stored.fields().len() - 1;
        // What every cluster yields: the projection, the descriptors of its
        // blob columns, and `_tombstone`.
        let mut columns = user.clone();
        columns.extend(
            schema
                .blobs
                .iter()
                .filter(|b| user.contains(&b.index))
                .map(|b| b.descriptor),
        );
        columns.push(tombstone);
        columns.sort_unstable();
        columns.dedup();
        // What a merge reads besides: the key.
        let mut merge_columns = columns.clone();
        merge_columns.extend(schema.key.iter().copied());
        merge_columns.sort_unstable();
        merge_columns.dedup();
        let drop_keys: Vec<usize> = columns
            .iter()
            .map(|c| merge_columns.binary_search(c).expect("a subset"))
            .collect();

        let projected = Arc::new(schema.stored.project(&columns)?);
        let mut streams = Vec::with_capacity(self.clusters.len());
        if let Some(unmerged) = &self.unmerged {
            let needs_memtable = self
                .clusters
                .iter()
                .flatten()
                .any(|p| *p == Piece::Memtable || unmerged.under_memtable.contains(p));
            let memtable = match needs_memtable {
                true => Some(unmerged.memtable(snapshot).await?),
                false => None,
            };
            for &piece in self.clusters.iter().flatten() {
                streams.push(
                    self.unmerged_piece(
                        piece,
                        unmerged,
                        (&columns, &merge_columns, &drop_keys),
                        memtable.as_deref(),
                        metrics,
                    )
                    .await?,
                );
            }
        }
        let memtable = self.unmerged.is_none()
            && self
                .clusters
                .iter()
                .flatten()
                .any(|p| *p == Piece::Memtable);
        let memtable = match memtable {
            true if schema.has_key() => {
                Some(newest_per_key_sorted(schema, &snapshot.memtable_batches())?)
            }
            true => Some(concat_batches(
                &schema.stored,
                &snapshot.memtable_batches(),
            )?),
            false => None,
        };
        for cluster in self.clusters.iter().filter(|_| self.unmerged.is_none()) {
            if !schema.has_key() || cluster.len() == 1 {
                for &piece in cluster {
                    streams.push(
                        self.piece(piece, &columns, memtable.as_ref(), metrics)
                            .await?,
                    );
                }
                continue;
            }
            let mut runs = Vec::with_capacity(cluster.len());
            for &piece in cluster {
                runs.push(Run {
                    rows: self
                        .piece(piece, &merge_columns, memtable.as_ref(), metrics)
                        .await?,
                    seq: match piece {
                        Piece::File(i) | Piece::RowGroup(i, _) => snapshot.sstables[i].generation,
                        Piece::Memtable => u64::MAX,
                    },
                    deleted: None,
                });
            }
            let merged = merge::merge_runs(
                schema,
                &merge_columns,
                runs,
                true,
                pool,
                metrics.merge.clone(),
            )?;
            let positions = drop_keys.clone();
            let out = Arc::clone(&projected);
            let merged = merged.map(move |b| {
                Ok(RecordBatch::try_new(
                    Arc::clone(&out),
                    b?.project(&positions)?.columns().to_vec(),
                )?)
            });
            streams.push(Box::pin(RecordBatchStreamAdapter::new(
                Arc::clone(&projected),
                merged,
            )));
        }
        let at_tombstone = columns.binary_search(&tombstone).expect("read");
        let rows =
            merge::drop_tombstones(merge::concat(Arc::clone(&projected), streams), at_tombstone);
        // The projection's positions among `columns`, in user form.
        let positions: Vec<usize> = user
            .iter()
            .map(|c| {
                columns
                    .binary_search(c)
                    .expect("projected columns are read")
            })
            .collect();
        // Each size column: where it goes, and where its values and
        // descriptors are read.
        let mut sized = Vec::new();
        let mut fields: Vec<Field> = schema
            .schema
            .project(&user)?
            .fields()
            .iter()
            .map(|f| f.as_ref().clone())
            .collect();
        for blob in schema.blobs.iter().filter(|b| sizes.contains(&b.index)) {
            let read = |c: usize| columns.binary_search(&c).expect("read");
            for (at, _) in user.iter().enumerate().filter(|(_, c)| **c == blob.index) {
                sized.push((at, read(blob.index), read(blob.descriptor)));
                fields[at] = Field::new(fields[at].name(), DataType::Int64, true);
            }
        }
        let out: SchemaRef = Arc::new(Schema::new(fields));
        let out_schema = Arc::clone(&out);
        let to_user = Arc::new(move |batch: RecordBatch| {
            let options = RecordBatchOptions::new().with_row_count(Some(batch.num_rows()));
            let mut projected = batch.project(&positions)?.columns().to_vec();
            for &(at, values, descriptors) in &sized {
                let descriptors = batch.column(descriptors).as_struct();
                projected[at] = Arc::new(blob::sizes(batch.column(values), descriptors));
            }
            Ok::<_, DataFusionError>(RecordBatch::try_new_with_options(
                Arc::clone(&out_schema),
                projected,
                &options,
            )?)
        });
        // Packs are read only for a projected blob column, not for its
        // sizes.
        let fetched = |b: &&BlobColumn| user.contains(&b.index) && !sizes.contains(&b.index);
        let rows = match schema.blobs.iter().any(|b| fetched(&b)) {
            false => rows.map(move |batch| to_user(batch?)).boxed(),
            true => {
                let packs = snapshot.packs.counting(&metrics.read.bytes_read);
                let schema = Arc::clone(schema);
                let (columns, sizes) = (Arc::new(columns), Arc::new(sizes.to_vec()));
                let early = early.cloned();
                rows.and_then(move |batch| {
                    let (packs, schema) = (packs.clone(), Arc::clone(&schema));
                    let (columns, to_user) = (Arc::clone(&columns), Arc::clone(&to_user));
                    let (sizes, early) = (Arc::clone(&sizes), early.clone());
                    async move {
                        // The predicate reads no blob column, whose
                        // values are not read yet.
                        let batch = match early {
                            Some(early) => {
                                let keep = early.evaluate(&to_user(batch.clone())?)?;
                                let keep = keep.into_array(batch.num_rows())?;
                                filter_record_batch(&batch, keep.as_boolean())?
                            }
                            None => batch,
                        };
                        let batch = packs.resolve_except(&schema, &columns, batch, &sizes);
                        to_user(batch.await?)
                    }
                })
                .boxed()
            }
        };
        Ok(Box::pin(RecordBatchStreamAdapter::new(out, rows)))
    }

    /// The rows of one piece, stored form projected to `columns`, counted
    /// in `metrics`.
    async fn piece(
        &self,
        piece: Piece,
        columns: &[usize],
        memtable: Option<&RecordBatch>,
        metrics: &ScanMetrics,
    ) -> Result<SendableRecordBatchStream> {
        let snapshot = &self.snapshot;
        let (rows, counter) = match piece {
            Piece::File(i) => (
                snapshot
                    .reader
                    .stream(&snapshot.sstables[i], None, columns, &metrics.read)
                    .await?,
                &metrics.sstable_rows,
            ),
            Piece::RowGroup(i, g) => (
                snapshot
                    .reader
                    .stream(&snapshot.sstables[i], Some(vec![g]), columns, &metrics.read)
                    .await?,
                &metrics.sstable_rows,
            ),
            Piece::Memtable => {
                let rows = memtable.expect("sorted above").project(columns)?;
                (
                    one_batch(Arc::new(snapshot.schema.stored.project(columns)?), rows),
                    &metrics.memtable_rows,
                )
            }
        };
        let (schema, counter) = (rows.schema(), counter.clone());
        let counted = rows.inspect(move |batch| {
            if let Ok(batch) = batch {
                counter.add(batch.num_rows());
            }
        });
        Ok(Box::pin(RecordBatchStreamAdapter::new(schema, counted)))
    }
}

impl ScanPart {
    /// The rows of one piece read unmerged (stored form projected to
    /// `columns`): an SSTable piece without the rows its deletion vector
    /// marks and, if it lies under the MemTables, without the rows whose
    /// keys they hold (`memtable_keys`; read with the key columns, at
    /// `merge_columns`, which `drop_keys` projects away again).
    async fn unmerged_piece(
        &self,
        piece: Piece,
        unmerged: &Unmerged,
        (columns, merge_columns, drop_keys): (&[usize], &[usize], &[usize]),
        memtable: Option<&MemtableRows>,
        metrics: &ScanMetrics,
    ) -> Result<SendableRecordBatchStream> {
        let snapshot = &self.snapshot;
        let (i, group) = match piece {
            Piece::Memtable => {
                let rows = memtable.map(|m| &m.rows);
                return self.piece(piece, columns, rows, metrics).await;
            }
            Piece::File(i) => (i, None),
            Piece::RowGroup(i, g) => (i, Some(g)),
        };
        let shadowed = memtable
            .filter(|_| unmerged.under_memtable.contains(&piece))
            .map(|m| &m.keys);
        let read = match shadowed {
            Some(_) => merge_columns,
            None => columns,
        };
        let file = &snapshot.sstables[i];
        let rows = match &unmerged.deletions(snapshot).await?[i] {
            Some(deleted) => {
                snapshot
                    .reader
                    .stream_unmarked(file, group, deleted, read, &metrics.read)
                    .await?
            }
            None => {
                snapshot
                    .reader
                    .stream(file, group.map(|g| vec![g]), read, &metrics.read)
                    .await?
            }
        };
        let counter = metrics.sstable_rows.clone();
        let rows = rows.inspect(move |batch| {
            if let Ok(batch) = batch {
                counter.add(batch.num_rows());
            }
        });
        let Some(keys) = shadowed else {
            let schema = Arc::new(snapshot.schema.stored.project(columns)?);
            return Ok(Box::pin(RecordBatchStreamAdapter::new(schema, rows)));
        };
        let keys = Arc::clone(keys);
        let positions: Vec<usize> = snapshot
            .schema
            .key
            .iter()
            .map(|k| merge_columns.binary_search(k).expect("keys are read"))
            .collect();
        let drop_keys = drop_keys.to_vec();
        let out = Arc::new(snapshot.schema.stored.project(columns)?);
        let schema = Arc::clone(&out);
        let rows = rows.map(move |batch| {
            let batch = batch?;
            let key_columns: Vec<ArrayRef> = positions
                .iter()
                .map(|&k| Arc::clone(batch.column(k)))
                .collect();
            let keep = keys.absent(&key_columns)?;
            let batch = filter_record_batch(&batch, &keep)?;
            Ok(RecordBatch::try_new(
                Arc::clone(&schema),
                batch.project(&drop_keys)?.columns().to_vec(),
            )?)
        });
        Ok(Box::pin(RecordBatchStreamAdapter::new(out, rows)))
    }
}

impl Unmerged {
    /// The deletion vector of each SSTable of `snapshot`.
    async fn deletions(&self, snapshot: &ShardSnapshot) -> Result<&[Option<Arc<DeletionVector>>]> {
        let read = self.deletions.get_or_try_init(|| {
            futures::future::try_join_all(
                snapshot
                    .sstables
                    .iter()
                    .map(|f| snapshot.reader.deletions(f)),
            )
        });
        Ok(read.await?)
    }

    /// The MemTables' rows of `snapshot` (newest version per key, sorted)
    /// and their keys, made once for every part of the scan.
    async fn memtable(&self, snapshot: &ShardSnapshot) -> Result<Arc<MemtableRows>> {
        let made = self.memtable.get_or_try_init(|| async {
            let schema = &snapshot.schema;
            let rows = newest_per_key_sorted(schema, &snapshot.memtable_batches())?;
            let keys = Arc::new(KeySet::new(schema, &rows)?);
            Ok::<_, crate::error::Error>(Arc::new(MemtableRows { rows, keys }))
        });
        Ok(Arc::clone(made.await?))
    }
}

/// The MemTables' rows a scan reads, and their keys.
#[derive(Debug)]
struct MemtableRows {
    rows: RecordBatch,
    keys: Arc<KeySet>,
}

/// The keys of a set of rows, to tell rows of other layers with those keys.
#[derive(Debug)]
struct KeySet {
    converter: RowConverter,
    keys: HashSet<Box<[u8]>>,
}

impl KeySet {
    /// The keys of `rows` (stored form).
    fn new(schema: &TableSchema, rows: &RecordBatch) -> Result<Self> {
        let converter = schema.key_converter()?;
        let keys = converter
            .convert_columns(&schema.key_columns(rows))?
            .iter()
            .map(|r| r.as_ref().into())
            .collect();
        Ok(Self { converter, keys })
    }

    /// Per row of `key_columns`: whether its key is not in the set.
    fn absent(&self, key_columns: &[ArrayRef]) -> Result<BooleanArray> {
        let rows = self.converter.convert_columns(key_columns)?;
        Ok(rows
            .iter()
            .map(|r| Some(!self.keys.contains(r.as_ref())))
            .collect())
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memtable::MemTable;
    use crate::schema::{KeyedBatch, TableMeta};
    use crate::sstable::{self, ROW_GROUP_ROWS};
    use datafusion::arrow::array::{AsArray, Int64Array};
    use datafusion::arrow::datatypes::{DataType, Field, Int64Type, Schema};
    use datafusion::execution::memory_pool::UnboundedMemoryPool;
    use object_store::ObjectStore;
    use object_store::path::Path;
    use std::collections::BTreeMap;

    fn table() -> Arc<TableSchema> {
        let schema = Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("v", DataType::Int64, false),
        ]);
        Arc::new(TableSchema::new(
            &TableMeta::new(&schema, vec!["id".into()], &[]).unwrap(),
        ))
    }

    fn rows(t: &TableSchema, ids: &[i64], v: i64) -> RecordBatch {
        let b = RecordBatch::try_new(
            Arc::clone(&t.schema),
            vec![
                Arc::new(Int64Array::from(ids.to_vec())),
                Arc::new(Int64Array::from(vec![v; ids.len()])),
            ],
        )
        .unwrap();
        t.to_stored(&b).unwrap()
    }

    /// Runs with several row groups, overlapping in places (some keys in
    /// every run, deleted in some), over a MemTable: every partitioning
    /// yields exactly the newest live version of each key, in key order
    /// within a part, no key in two parts.
    #[tokio::test]
    async fn clusters_merge_only_where_runs_overlap_and_parts_split_the_keys() {
        let t = table();
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn ObjectStore> =
            Arc::new(object_store::local::LocalFileSystem::new_with_prefix(dir.path()).unwrap());
        let shard = crate::store::paths::shard_dir("t", 0);
        let n = ROW_GROUP_ROWS as i64 + 1000;
        let mut model = BTreeMap::new();
        let mut files = Vec::new();
        // Generation g covers keys [g * n - 500, (g + 1) * n): each run
        // overlaps the one before in its last row group; generation 2
        // deletes some keys, in its range and the one before.
        for g in 0..3i64 {
            let ids: Vec<i64> = ((g * n - 500).max(0)..(g + 1) * n).collect();
            let mut batches = vec![rows(&t, &ids, g)];
            for &id in &ids {
                model.insert(id, g);
            }
            if g == 2 {
                let gone: Vec<i64> = (2 * n - 1000..2 * n + 5000).step_by(7).collect();
                let keys = RecordBatch::try_new(
                    Arc::new(t.schema.project(&[0]).unwrap()),
                    vec![Arc::new(Int64Array::from(gone.clone()))],
                )
                .unwrap();
                batches.push(t.tombstones(&keys).unwrap());
                for id in gone {
                    model.remove(&id);
                }
            }
            files.push(
                sstable::write(
                    &store,
                    &shard,
                    (1, g as u64 + 1),
                    &sstable::encode_batches(&t, &batches).unwrap().0,
                    &[],
                )
                .await
                .unwrap(),
            );
        }
        // The MemTable: new keys and versions at the end, and a delete.
        let memtable = Arc::new(MemTable::new(Arc::clone(&t)));
        let put = |b: RecordBatch| -> KeyedBatch { t.keyed(b).unwrap() };
        let ids = [3 * n - 1, 3 * n + 5, 3 * n + 9];
        memtable.append(vec![put(rows(&t, &ids, 9))]);
        for id in ids {
            model.insert(id, 9);
        }
        let keys = RecordBatch::try_new(
            Arc::new(t.schema.project(&[0]).unwrap()),
            vec![Arc::new(Int64Array::from(vec![3 * n - 2]))],
        )
        .unwrap();
        memtable.append(vec![put(t.tombstones(&keys).unwrap())]);
        model.remove(&(3 * n - 2));
        let snapshot = ShardSnapshot {
            schema: Arc::clone(&t),
            reader: Arc::new(SstableReader::new(Arc::clone(&store), Arc::clone(&t))),
            packs: PackReader::new(Arc::clone(&store), Path::from("shard")),
            memtables: vec![MemLayer {
                batches: 2,
                memtable,
            }],
            sstables: Arc::new(files),
            seen: None,
        };
        let pool: Arc<dyn MemoryPool> = Arc::new(UnboundedMemoryPool::default());
        for parts in [1, 2, 5] {
            let planned = snapshot.parts(parts, &KeyBounds::all()).await.unwrap();
            assert!(planned.len() <= parts, "{} parts", planned.len());
            let clusters: Vec<&Vec<Piece>> = planned.iter().flat_map(|p| &p.clusters).collect();
            assert!(
                clusters.iter().any(|c| c.len() == 1),
                "nothing read unmerged"
            );
            assert!(clusters.iter().any(|c| c.len() > 1), "nothing merged");
            let mut seen = BTreeMap::new();
            for part in &planned {
                let batches: Vec<RecordBatch> = futures::TryStreamExt::try_collect(
                    part.scan(None, &pool, &ScanMetrics::unrecorded())
                        .await
                        .unwrap(),
                )
                .await
                .unwrap();
                let mut last = None;
                for b in batches {
                    let ids = b.column(0).as_primitive::<Int64Type>();
                    let vs = b.column(1).as_primitive::<Int64Type>();
                    for i in 0..b.num_rows() {
                        let id = ids.value(i);
                        assert!(last < Some(id), "part not sorted by key at {id}");
                        last = Some(id);
                        assert!(seen.insert(id, vs.value(i)).is_none(), "key {id} twice");
                    }
                }
            }
            assert_eq!(seen, model, "{parts} parts");
        }

        // A key range reads only the pieces that can hold it, and every
        // live row in it.
        let mut bounds = KeyBounds::all();
        bounds.above(ScalarValue::Int64(Some(2 * n + 10)), false);
        bounds.below(ScalarValue::Int64(Some(3 * n + 5)), true);
        let planned = snapshot.parts(2, &bounds).await.unwrap();
        let pieces: usize = planned.iter().flat_map(|p| &p.clusters).map(Vec::len).sum();
        assert_eq!(
            pieces, 3,
            "the last SSTable's two row groups and the MemTable"
        );
        let mut seen = BTreeMap::new();
        for part in &planned {
            let batches: Vec<RecordBatch> = futures::TryStreamExt::try_collect(
                part.scan(None, &pool, &ScanMetrics::unrecorded())
                    .await
                    .unwrap(),
            )
            .await
            .unwrap();
            for b in batches {
                let ids = b.column(0).as_primitive::<Int64Type>();
                let vs = b.column(1).as_primitive::<Int64Type>();
                for i in 0..b.num_rows() {
                    seen.insert(ids.value(i), vs.value(i));
                }
            }
        }
        let wanted: BTreeMap<i64, i64> = model
            .range(2 * n + 11..=3 * n + 5)
            .map(|(k, v)| (*k, *v))
            .collect();
        assert!(
            wanted.iter().all(|(k, v)| seen.get(k) == Some(v)),
            "a live row in range is missing"
        );
        assert!(seen.len() < model.len(), "nothing pruned");
    }
}
