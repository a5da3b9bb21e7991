//! SSTables (DESIGN.md §2, §6): the rows of flushed MemTable generations
//! as one plain Parquet file, sorted by primary key, one row per key — its
//! newest version, tombstones kept (they hide older SSTables' versions
//! until a compaction that includes the oldest data drops them).
//!
//! The file is readable by any Parquet reader: the table's columns plus
//! `_tombstone`, zstd-compressed (LZ4 for a bulk load's runs: see
//! [`Codec`]), page-level statistics (page index) on
//! every column with small pages, a Parquet bloom filter on each key
//! column, and row groups of at most [`ROW_GROUP_ROWS`] rows so key
//! predicates can prune them. Append-only tables keep insert order and
//! every row.
//!
//! Next to `data.parquet`, in the SSTable's own directory, a
//! `<column>.hnsw` per vector column holds the column's HNSW graph over the
//! file's row positions ([`crate::hnsw::persist`]); the manifest entry
//! lists the columns that have one, with each graph file's CRC-32. The
//! directory is deleted as a whole.
//!
//! Every file is checked when read: the Parquet file by block checksums in
//! its footer and the checksum of its footer in the manifest entry
//! ([`checksum`]), a graph by its CRC-32 in the manifest entry.
//!
//! [`reader`] streams and looks up keys in SSTables and loads their
//! vector columns with their graphs; [`merge`] merges sorted runs into the
//! newest version of each key, for scans and compaction alike.

mod checksum;
pub mod deletions;
pub mod merge;
mod object;
mod reader;

pub use checksum::FileChecksum;
pub use deletions::{DeletionVector, Deletions};
pub use reader::{SstableReader, VectorColumnData};

/// What reading SSTables cost, for `EXPLAIN ANALYZE` (DataFusion metric
/// counters; clones count into the same ones, and a default one counts
/// for nobody).
#[derive(Debug, Clone, Default)]
pub struct ReadMetrics {
    /// Bytes fetched from the store (cached footers are not fetched again).
    pub bytes_read: Count,
    /// Row groups a lookup skipped because their key statistics exclude
    /// the key.
    pub row_groups_pruned_by_statistics: Count,
    /// Row groups a lookup skipped because their bloom filter excludes the
    /// key.
    pub row_groups_pruned_by_bloom_filter: Count,
    /// Rows of the row groups a lookup read that the page index let it
    /// skip.
    pub rows_pruned_by_page_index: Count,
}

impl ReadMetrics {
    /// Counters registered in `set` for `partition`.
    pub fn new(set: &ExecutionPlanMetricsSet, partition: usize) -> Self {
        let counter = |name: &'static str| MetricBuilder::new(set).counter(name, partition);
        Self {
            bytes_read: counter("bytes_read"),
            row_groups_pruned_by_statistics: counter("row_groups_pruned_by_statistics"),
            row_groups_pruned_by_bloom_filter: counter("row_groups_pruned_by_bloom_filter"),
            rows_pruned_by_page_index: counter("rows_pruned_by_page_index"),
        }
    }
}

use std::sync::Arc;

use bytes::Bytes;
use datafusion::arrow::array::{RecordBatch, UInt32Array, new_null_array};
use datafusion::arrow::compute::{concat_batches, take_record_batch};
use datafusion::arrow::datatypes::{DataType, Schema};
use datafusion::parquet::arrow::ArrowWriter;
use datafusion::parquet::basic::{Compression, ZstdLevel};
use datafusion::parquet::errors::ParquetError;
use datafusion::parquet::file::metadata::SortingColumn;
use datafusion::parquet::file::properties::{EnabledStatistics, WriterProperties};
use datafusion::parquet::schema::types::ColumnPath;
use datafusion::physical_plan::metrics::{Count, ExecutionPlanMetricsSet, MetricBuilder};

use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutPayload};
use serde::{Deserialize, Serialize};

use crate::blob::PackRun;
use crate::error::{Error, Result};
use crate::schema::TableSchema;
use crate::schema::key::{self, IntegerKeys};
use crate::store::paths;

/// Rows per Parquet row group: small enough for key predicates to skip
/// most of a large SSTable, large enough to compress well.
pub const ROW_GROUP_ROWS: usize = 64 * 1024;

/// Rows per data page: a key lookup decodes about this many rows.
pub const PAGE_ROWS: usize = 1024;

/// The rows of `batches` (stored form, oldest first) as an SSTable body:
/// for a table with a key, sorted by key with only each key's newest row
/// (a tombstone included); for an append-only table, every row in order.
pub fn newest_per_key_sorted(schema: &TableSchema, batches: &[RecordBatch]) -> Result<RecordBatch> {
    Ok(sorted(schema, batches)?.0)
}

/// [`newest_per_key_sorted`], and for each of its rows the index of the
/// input row (counting through `batches`) it is.
pub fn sorted(schema: &TableSchema, batches: &[RecordBatch]) -> Result<(RecordBatch, Vec<u32>)> {
    let all = concat_batches(&schema.stored, batches)?;
    if !schema.has_key() || all.num_rows() == 0 {
        let order = (0..all.num_rows() as u32).collect();
        return Ok((all, order));
    }
    let columns = schema.key_columns(&all);
    let integers = match columns.as_slice() {
        [column] => key::integer_keys(column)?,
        _ => None,
    };
    let order = match integers {
        Some(IntegerKeys::Signed(values)) => newest_per_value(&values),
        Some(IntegerKeys::Unsigned(values)) => newest_per_value(&values),
        None => {
            let keys = schema.key_rows(&all)?;
            // By key, and within a key newest (highest position) first.
            let mut order: Vec<u32> = (0..all.num_rows() as u32).collect();
            order.sort_unstable_by(|&a, &b| {
                keys.row(a as usize)
                    .cmp(&keys.row(b as usize))
                    .then(b.cmp(&a))
            });
            order.dedup_by(|later, first| keys.row(*later as usize) == keys.row(*first as usize));
            order
        }
    };
    // Rows given in key order, each key once, are the body as they are.
    if order.len() == all.num_rows() && order.iter().enumerate().all(|(at, &o)| o == at as u32) {
        return Ok((all, order));
    }
    let body = take_record_batch(&all, &UInt32Array::from(order.clone()))?;
    Ok((body, order))
}

/// The position of the newest (last) row of each distinct value, in
/// value order: a sort of `(value, position)` pairs, which for a
/// one-column integer key is several times faster than comparing rows.
fn newest_per_value<T: Ord + Copy>(values: &[T]) -> Vec<u32> {
    if values.is_sorted_by(|a, b| a < b) {
        return (0..values.len() as u32).collect();
    }
    let mut pairs: Vec<(T, u32)> = values
        .iter()
        .enumerate()
        // Newest first within a value: positions counted down.
        .map(|(at, &v)| (v, u32::MAX - at as u32))
        .collect();
    pairs.sort_unstable();
    pairs.dedup_by(|later, first| later.0 == first.0);
    pairs.into_iter().map(|(_, at)| u32::MAX - at).collect()
}

/// An SSTable encoded in memory, not yet written.
#[derive(Debug, Clone)]
pub struct Encoded {
    /// The Parquet file.
    pub bytes: Bytes,
    /// For each row of the file, the input row it holds (counting through
    /// the batches given to [`encode_batches`]).
    pub source: Vec<u32>,
    /// What the manifest entry records to check the file.
    pub checksum: FileChecksum,
}

/// Sorts `batches` (stored form, oldest first) into an SSTable body (see
/// [`newest_per_key_sorted`]) and encodes it; also returns the body.
pub fn encode_batches(
    schema: &TableSchema,
    batches: &[RecordBatch],
) -> Result<(Encoded, RecordBatch)> {
    let (body, source) = sorted(schema, batches)?;
    let (bytes, checksum) = encode(schema, &body)?;
    Ok((
        Encoded {
            bytes,
            source,
            checksum,
        },
        body,
    ))
}

/// Encodes an SSTable body (see [`newest_per_key_sorted`]) as Parquet,
/// with the checksum its manifest entry records.
pub fn encode(schema: &TableSchema, rows: &RecordBatch) -> Result<(Bytes, FileChecksum)> {
    let mut encoder = checksum::Encoder::new(schema, rows.num_rows(), Codec::Small)?;
    encoder.write(rows)?;
    encoder.finish()
}

/// Whether SSTables can hold values of every column of `schema`: an error
/// naming the first column whose type Parquet cannot store (an interval
/// of months, days and nanoseconds, a union), so that a table is refused
/// when it is created rather than when its first flush fails.
pub fn check_storable(schema: &Schema) -> Result<()> {
    for field in schema.fields() {
        let refused = |why: &dyn std::fmt::Display| {
            Error::invalid(format!(
                "column '{}' has type {}, which an SSTable (Parquet) cannot store: {why}",
                field.name(),
                field.data_type()
            ))
        };
        if has_union(field.data_type()) {
            return Err(refused(&"unions are not supported"));
        }
        // One NULL of the column's type, written for real.
        let probe = Arc::new(Schema::new(vec![
            field.as_ref().clone().with_nullable(true),
        ]));
        let column = new_null_array(field.data_type(), 1);
        let written = RecordBatch::try_new(Arc::clone(&probe), vec![column])
            .map_err(ParquetError::from)
            .and_then(|batch| {
                let mut writer = ArrowWriter::try_new(Vec::new(), probe, None)?;
                writer.write(&batch)?;
                writer.close().map(|_| ())
            });
        written.map_err(|e| refused(&e))?;
    }
    Ok(())
}

/// Whether values of type `data_type` hold a union anywhere (Parquet's
/// schema conversion does not return an error for one: it panics).
fn has_union(data_type: &DataType) -> bool {
    match data_type {
        DataType::Union(..) => true,
        DataType::List(f)
        | DataType::LargeList(f)
        | DataType::ListView(f)
        | DataType::LargeListView(f)
        | DataType::FixedSizeList(f, _)
        | DataType::Map(f, _)
        | DataType::RunEndEncoded(_, f) => has_union(f.data_type()),
        DataType::Struct(fields) => fields.iter().any(|f| has_union(f.data_type())),
        DataType::Dictionary(_, values) => has_union(values),
        _ => false,
    }
}

/// How an SSTable's pages are compressed. Readers read either.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Codec {
    /// zstd(3): flushes and compactions, the SSTables a shard keeps.
    Small,
    /// LZ4 and no string dictionaries: a bulk load's runs, which
    /// compaction soon merges (and writes [`Codec::Small`]). Encoding a
    /// load's runs costs about a fifth less CPU this way, for files about
    /// twice as large meanwhile.
    Fast,
}

/// The Parquet settings of an SSTable of about `rows` rows.
fn properties(schema: &TableSchema, rows: usize, codec: Codec) -> WriterProperties {
    let compression = match codec {
        Codec::Small => Compression::ZSTD(ZstdLevel::try_new(3).expect("3 is a valid zstd level")),
        Codec::Fast => Compression::LZ4_RAW,
    };
    let mut props = WriterProperties::builder()
        .set_compression(compression)
        .set_statistics_enabled(EnabledStatistics::Page)
        .set_max_row_group_row_count(Some(ROW_GROUP_ROWS))
        .set_data_page_row_count_limit(PAGE_ROWS)
        // A dictionary page is decoded whole before any row of its column
        // chunk: for high-cardinality columns (keys, numbers) that is the
        // whole chunk again, which a lookup of one page cannot afford.
        // Strings keep dictionaries, except in a load's runs: compaction
        // reads those once, soon, and interning their strings cost about
        // 7 % of the load's CPU.
        .set_dictionary_enabled(false)
        .set_write_batch_size(PAGE_ROWS.min(1024));
    for (i, field) in schema.stored.fields().iter().enumerate() {
        let string = matches!(
            field.data_type(),
            DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View
        );
        if string && !schema.key.contains(&i) && codec == Codec::Small {
            props =
                props.set_column_dictionary_enabled(ColumnPath::from(field.name().as_str()), true);
        }
    }
    if schema.has_key() {
        props = props.set_sorting_columns(Some(
            schema
                .key
                .iter()
                .map(|&k| SortingColumn {
                    column_idx: k as i32,
                    descending: false,
                    nulls_first: false,
                })
                .collect(),
        ));
        for &k in &schema.key {
            let column = ColumnPath::from(schema.schema.field(k).name().as_str());
            // Sized for one row group's keys, not Parquet's default of a
            // million (which would cost a megabyte per row group).
            props = props
                .set_column_bloom_filter_enabled(column.clone(), true)
                .set_column_bloom_filter_max_ndv(column, rows.clamp(1, ROW_GROUP_ROWS) as u64);
        }
    }
    props.build()
}

/// The CRC-32 of any data that ends with its own CRC-32 (little-endian).
const CRC32_RESIDUE: u32 = 0x2144_DF1C;

/// What a shard manifest records about one SSTable.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SstableFile {
    /// Object path, relative to the root.
    pub path: String,
    /// The newest MemTable generation it holds.
    pub generation: u64,
    /// The oldest generation it holds (a compaction's output holds a range).
    #[serde(default)]
    pub first_generation: u64,
    /// Rows in the file (tombstones included).
    pub rows: u64,
    /// Size of the file.
    pub bytes: u64,
    /// What the file is checked against (`None` for files written before
    /// SSTables had checksums).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checksum: Option<FileChecksum>,
    /// The vector columns with a persisted graph next to the file.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub graphs: Vec<GraphFile>,
    /// The rows a newer SSTable of the shard holds a version of, as far as
    /// they are marked (see [`deletions`]); `None`: none marked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deletions: Option<Deletions>,
    /// Every row whose key an SSTable newer than this one and of a
    /// generation up to this holds is marked in `deletions` (0 for files
    /// written before deletion vectors: none known).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub checked_through: u64,
    /// The blob packs its rows name (see [`crate::blob`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub packs: Vec<PackRun>,
    /// The bytes its rows name in those packs.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub blob_bytes: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// Whether the deletion vectors of `files` (one shard's, oldest first)
/// mark every row a newer file holds a version of: their unmarked rows are
/// then the newest version of each key.
pub fn deletions_complete(files: &[SstableFile]) -> bool {
    let Some((newest, older)) = files.split_last() else {
        return true;
    };
    older.iter().all(|f| f.checked_through >= newest.generation)
}

/// [`Error::Corrupt`] naming the object if `error` is a store's "not
/// found" of an object one of `live` (the SSTables shard manifest version
/// `version` names) names: its file, its deletion vector or a graph. Such
/// an object is deleted only once no manifest names it, so this one was
/// lost. `None` for any other error, an older deletion vector of a live
/// SSTable (replaced by a newer one) included.
pub fn lost(error: &Error, live: &[SstableFile], version: u64) -> Option<Error> {
    let Error::Store(object_store::Error::NotFound { path, .. }) = error else {
        return None;
    };
    let missing = paths::sstable_dir_of_object(path)?;
    let name = path.rsplit('/').next().unwrap_or_default();
    let file = (live.iter()).find(|f| missing.ends_with(paths::sstable_dir(&f.path)))?;
    let named = |object: &str| object.rsplit('/').next() == Some(name);
    let graph =
        |g: &GraphFile| paths::graph_file(&file.path, g.column()).is_ok_and(|p| named(p.as_ref()));
    let deletions = file.deletions.as_ref().is_some_and(|d| named(&d.path));
    if !(named(&file.path) || deletions || file.graphs.iter().any(graph)) {
        return None;
    }
    Some(Error::Corrupt {
        path: format!("{}/{name}", paths::sstable_dir(&file.path)),
        reason: format!("missing, though shard manifest version {version} names its SSTable"),
    })
}

/// How far the marks of `files[i]` are complete (see
/// [`SstableFile::checked_through`]): the newest file has nothing newer.
pub fn checked_through(files: &[SstableFile], i: usize) -> u64 {
    match i + 1 == files.len() {
        true => files[i].checked_through.max(files[i].generation),
        false => files[i].checked_through,
    }
}

/// A persisted graph next to an SSTable: its vector column and, for graphs
/// written since they have one, the CRC-32 of the graph file (which also
/// tells a graph of another SSTable from this one's).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum GraphFile {
    /// A graph of `column` whose bytes have this CRC-32 (written by this
    /// version or later).
    Checked {
        /// The vector column.
        column: String,
        /// CRC-32 of the whole graph file.
        crc32: u32,
    },
    /// A graph of the named column recorded before graphs had checksums.
    Unchecked(String),
}

impl GraphFile {
    /// The vector column the graph indexes.
    pub fn column(&self) -> &str {
        match self {
            GraphFile::Checked { column, .. } | GraphFile::Unchecked(column) => column,
        }
    }

    /// The graph file's CRC-32, if recorded.
    pub fn crc32(&self) -> Option<u32> {
        match self {
            // Recorded before graphs were told apart by their trailer: the
            // CRC-32 of any graph file (which ends with its own CRC) is
            // this residue, so it checks nothing.
            GraphFile::Checked { crc32, .. } if *crc32 == CRC32_RESIDUE => None,
            GraphFile::Checked { crc32, .. } => Some(*crc32),
            GraphFile::Unchecked(_) => None,
        }
    }
}

/// Writes `sstable` as the SSTable of `generation` into the shard at
/// `shard_dir` as the writer of `epoch`, under a fresh name created with
/// put-if-absent, with the persisted graphs `(column, bytes)` next to it.
/// Nothing is part of the table until a shard manifest names the file; a
/// failed write deletes what it wrote (best effort).
pub async fn write(
    store: &Arc<dyn ObjectStore>,
    shard_dir: &Path,
    (epoch, generation): (u64, u64),
    sstable: &Encoded,
    graphs: &[(String, Bytes)],
) -> Result<SstableFile> {
    let path = paths::new_sstable_file(shard_dir, generation, epoch);
    let mut file = SstableFile {
        path: path.to_string(),
        generation,
        first_generation: generation,
        rows: sstable.source.len() as u64,
        bytes: sstable.bytes.len() as u64,
        checksum: Some(sstable.checksum),
        graphs: Vec::new(),
        deletions: None,
        checked_through: generation,
        packs: Vec::new(),
        blob_bytes: 0,
    };
    let written = async {
        let payload = PutPayload::from_bytes(sstable.bytes.clone());
        store
            .put_opts(&path, payload, PutMode::Create.into())
            .await?;
        for (column, bytes) in graphs {
            write_graph(store, &mut file, column, bytes.clone()).await?;
        }
        Ok(())
    };
    if let Err(e) = written.await {
        discard(store, &file.path).await;
        return Err(e);
    }
    Ok(file)
}

/// Deletes an SSTable no manifest names after a failed write, logging a
/// failure (a later writer's start collects what is left).
pub async fn discard(store: &Arc<dyn ObjectStore>, path: &str) {
    if let Err(e) = delete(store, path).await {
        log::debug!("deleting the unused SSTable {path} failed: {e}");
    }
}

/// [`discard`] for each of `files`, 16 at a time.
pub async fn discard_all(store: &Arc<dyn ObjectStore>, files: &[SstableFile]) {
    use futures::StreamExt;
    futures::stream::iter(files)
        .for_each_concurrent(16, |file| discard(store, &file.path))
        .await;
}

/// Writes `graph` (see [`crate::hnsw::Graph::encode`]) as the persisted
/// graph of `column` next to `file`, which then lists it.
pub async fn write_graph(
    store: &Arc<dyn ObjectStore>,
    file: &mut SstableFile,
    column: &str,
    graph: Bytes,
) -> Result<()> {
    let path = paths::graph_file(&file.path, column)?;
    let crc32 = crate::hnsw::persist::checksum(&graph)
        .ok_or_else(|| Error::invalid("an encoded graph has a checksum"))?;
    store.put(&path, PutPayload::from_bytes(graph)).await?;
    file.graphs.retain(|g| g.column() != column);
    file.graphs.push(GraphFile::Checked {
        column: column.to_string(),
        crc32,
    });
    Ok(())
}

/// Deletes the SSTable at `path` and everything next to it (its graphs);
/// objects already gone are no error.
pub async fn delete(store: &Arc<dyn ObjectStore>, path: &str) -> Result<()> {
    use futures::TryStreamExt;
    let objects: Vec<Path> = match paths::own_sstable_dir(path) {
        Some(dir) => {
            store
                .list(Some(&paths::stored(dir)?))
                .map_ok(|meta| meta.location)
                .try_collect()
                .await?
        }
        None => vec![paths::stored(path)?],
    };
    for object in objects {
        crate::store::delete_if_present(store.as_ref(), &object).await?;
    }
    Ok(())
}

/// Writes the rows of `rows` (stored form, already in SSTable order: see
/// [`merge::merge_runs`]) as an SSTable holding generations
/// `first_generation..=generation` at `path` (a fresh name: see
/// [`paths::new_sstable_file`] and [`paths::new_load_run`]), streaming:
/// memory stays bounded by one row group whatever the size. `encoded` is
/// called once every row is encoded, before the upload's last requests.
pub async fn write_stream(
    store: &Arc<dyn ObjectStore>,
    path: Path,
    (first_generation, generation): (u64, u64),
    (schema, codec): (&TableSchema, Codec),
    mut rows: datafusion::execution::SendableRecordBatchStream,
    encoded: impl FnOnce() + Send,
) -> Result<SstableFile> {
    use futures::StreamExt;
    use tokio::io::AsyncWriteExt;
    let mut object = object_store::buffered::BufWriter::new(Arc::clone(store), path.clone());
    let mut encoder = checksum::Encoder::new(schema, ROW_GROUP_ROWS, codec)?;
    let (mut count, mut bytes) = (0u64, 0u64);
    let (mut sealed, mut shutting_down) = (None, false);
    let written = async {
        while let Some(batch) = rows.next().await {
            let batch = batch?;
            count += batch.num_rows() as u64;
            encoder.write(&batch)?;
            let done = encoder.take()?;
            bytes += done.len() as u64;
            object.put(done).await?;
        }
        let (rest, checksum) = encoder.finish()?;
        bytes += rest.len() as u64;
        object.put(rest).await?;
        encoded();
        (sealed, shutting_down) = (Some(checksum), true);
        object.shutdown().await?;
        Ok::<_, Error>(())
    };
    let checksum = match written.await {
        Ok(()) => sealed.expect("set before the upload completes"),
        // A completion whose answer was lost after it landed.
        Err(e) if shutting_down && crate::store::landed(store.as_ref(), &path, bytes).await => {
            log::debug!("SSTable {path} was written, though its completion failed: {e}");
            sealed.expect("set before the upload completes")
        }
        Err(e) => {
            // Nothing names it yet: no upload part or object stays behind
            // (a failed completion cleans up its own parts).
            if !shutting_down {
                let _ = object.abort().await;
            }
            discard(store, path.as_ref()).await;
            return Err(e);
        }
    };
    Ok(SstableFile {
        path: path.to_string(),
        generation,
        first_generation,
        rows: count,
        bytes,
        checksum: Some(checksum),
        graphs: Vec::new(),
        deletions: None,
        checked_through: 0,
        packs: Vec::new(),
        blob_bytes: 0,
    })
}

/// Decodes a whole SSTable (stored form), naming `path` in errors.
#[cfg(test)]
fn decode(schema: &TableSchema, path: &str, bytes: Bytes) -> Result<Vec<RecordBatch>> {
    use datafusion::parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
    let corrupt = |e: &dyn std::fmt::Display| Error::Corrupt {
        path: path.to_string(),
        reason: format!("SSTable: {e}"),
    };
    let reader = ParquetRecordBatchReaderBuilder::try_new(bytes)
        .map_err(|e| corrupt(&e))?
        .build()
        .map_err(|e| corrupt(&e))?;
    reader
        .map(|batch| {
            let batch = batch.map_err(|e| corrupt(&e))?;
            RecordBatch::try_new(Arc::clone(&schema.stored), batch.columns().to_vec())
                .map_err(|e| corrupt(&e))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::TableMeta;
    use datafusion::arrow::array::{Array, AsArray, Int64Array};
    use datafusion::arrow::datatypes::{DataType, Field, Int64Type, Schema};
    use datafusion::parquet::file::reader::{FileReader, SerializedFileReader};

    fn table(key: bool) -> TableSchema {
        let schema = Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("v", DataType::Int64, false),
        ]);
        let key = if key { vec!["id".into()] } else { vec![] };
        TableSchema::new(&TableMeta::new(&schema, key, &[]).unwrap())
    }

    fn put(t: &TableSchema, ids: &[i64], v: i64) -> RecordBatch {
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

    fn triples(t: &TableSchema, b: &RecordBatch) -> Vec<(i64, Option<i64>, bool)> {
        let ids = b.column(0).as_primitive::<Int64Type>();
        let vs = b.column(1).as_primitive::<Int64Type>();
        let dead = t.tombstone_flags(b);
        (0..b.num_rows())
            .map(|i| {
                (
                    ids.value(i),
                    vs.is_valid(i).then(|| vs.value(i)),
                    dead.value(i),
                )
            })
            .collect()
    }

    #[test]
    fn sorted_newest_per_key_with_tombstones_kept() {
        let t = table(true);
        let keys = RecordBatch::try_new(
            Arc::new(Schema::new(vec![Field::new("id", DataType::Int64, false)])),
            vec![Arc::new(Int64Array::from(vec![2]))],
        )
        .unwrap();
        let batches = vec![
            put(&t, &[5, 2, 9], 1),
            put(&t, &[9, 5], 2),
            t.tombstones(&keys).unwrap(),
            put(&t, &[5, 1], 3),
        ];
        let body = newest_per_key_sorted(&t, &batches).unwrap();
        assert_eq!(
            triples(&t, &body),
            [
                (1, Some(3), false),
                (2, None, true),
                (5, Some(3), false),
                (9, Some(2), false)
            ]
        );
    }

    #[test]
    fn rows_already_in_key_order_keep_each_key_newest() {
        let t = table(true);
        // Strictly increasing across batches: the rows are the body.
        let body = newest_per_key_sorted(&t, &[put(&t, &[1, 2], 1), put(&t, &[4], 2)]).unwrap();
        assert_eq!(
            triples(&t, &body),
            [
                (1, Some(1), false),
                (2, Some(1), false),
                (4, Some(2), false)
            ]
        );
        // In order but a key given twice: the later row alone is kept.
        let body = newest_per_key_sorted(&t, &[put(&t, &[1, 2], 1), put(&t, &[2, 3], 2)]).unwrap();
        assert_eq!(
            triples(&t, &body),
            [
                (1, Some(1), false),
                (2, Some(2), false),
                (3, Some(2), false)
            ]
        );
    }

    #[test]
    fn append_only_keeps_every_row_in_order() {
        let t = table(false);
        let body = newest_per_key_sorted(&t, &[put(&t, &[3, 1], 1), put(&t, &[3], 2)]).unwrap();
        assert_eq!(
            triples(&t, &body),
            [
                (3, Some(1), false),
                (1, Some(1), false),
                (3, Some(2), false)
            ]
        );
    }

    #[test]
    fn parquet_round_trip_with_bloom_filter_zstd_and_page_index() {
        let t = table(true);
        let ids: Vec<i64> = (0..(ROW_GROUP_ROWS as i64 + 10)).rev().collect();
        let body = newest_per_key_sorted(&t, &[put(&t, &ids, 7)]).unwrap();
        let bytes = encode(&t, &body).unwrap().0;
        let decoded = decode(&t, "sst/1/data.parquet", bytes.clone()).unwrap();
        let rows: usize = decoded.iter().map(RecordBatch::num_rows).sum();
        assert_eq!(rows, ids.len());
        assert_eq!(decoded[0].column(0).as_primitive::<Int64Type>().value(0), 0);

        let file = SerializedFileReader::new(bytes.clone()).unwrap();
        let meta = file.metadata();
        assert_eq!(meta.num_row_groups(), 2, "row groups sized for pruning");
        let id = meta.row_group(0).column(0);
        // The file records the codec, not its level.
        assert!(matches!(id.compression(), Compression::ZSTD(_)));
        assert!(
            id.bloom_filter_offset().is_some(),
            "no bloom filter on the key"
        );
        assert!(id.offset_index_offset().is_some(), "no page index");
        assert!(meta.row_group(0).column(1).bloom_filter_offset().is_none());

        let indexed = datafusion::parquet::file::metadata::ParquetMetaDataReader::new()
            .with_page_index_policy(datafusion::parquet::file::metadata::PageIndexPolicy::Required)
            .parse_and_finish(&bytes)
            .unwrap();
        let pages = indexed.offset_index().unwrap()[0][0].page_locations().len();
        assert_eq!(pages, ROW_GROUP_ROWS / PAGE_ROWS, "pages sized for lookups");

        let err = decode(&t, "sst/1/data.parquet", bytes.slice(..bytes.len() / 2)).unwrap_err();
        assert!(err.to_string().contains("sst/1/data.parquet"), "{err}");
    }

    #[test]
    fn a_loads_runs_keep_no_string_dictionaries() {
        // Compaction reads a run once, soon: interning its strings buys
        // nothing. The SSTables a shard keeps have them.
        let schema = Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("s", DataType::Utf8, false),
        ]);
        let t = TableSchema::new(&TableMeta::new(&schema, vec!["id".into()], &[]).unwrap());
        let batch = RecordBatch::try_new(
            Arc::clone(&t.schema),
            vec![
                Arc::new(Int64Array::from(vec![1, 2, 3])),
                Arc::new(datafusion::arrow::array::StringArray::from(vec![
                    "a", "b", "a",
                ])),
            ],
        )
        .unwrap();
        let stored = t.to_stored(&batch).unwrap();
        for (codec, dictionary) in [(Codec::Small, true), (Codec::Fast, false)] {
            let mut encoder = checksum::Encoder::new(&t, 3, codec).unwrap();
            encoder.write(&stored).unwrap();
            let file = SerializedFileReader::new(encoder.finish().unwrap().0).unwrap();
            let group = file.metadata().row_group(0);
            let s = group
                .columns()
                .iter()
                .find(|c| c.column_path().string() == "s")
                .unwrap();
            assert_eq!(
                s.dictionary_page_offset().is_some(),
                dictionary,
                "{codec:?}"
            );
        }
    }

    #[tokio::test]
    async fn a_merge_keeps_the_newest_version_whatever_order_its_runs_come_in() {
        use datafusion::execution::memory_pool::{MemoryPool, UnboundedMemoryPool};
        use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
        let t = table(true);
        let all: Vec<usize> = (0..t.stored.fields().len()).collect();
        let pool: Arc<dyn MemoryPool> = Arc::new(UnboundedMemoryPool::default());
        for order in [[1, 2, 3], [3, 2, 1], [2, 3, 1]] {
            let runs = order
                .iter()
                .map(|&seq| {
                    // Run `seq` writes value `seq` for keys 1..=3 and 4 + seq.
                    let rows = put(&t, &[1, 2, 3, 4 + seq], seq);
                    merge::Run {
                        rows: Box::pin(RecordBatchStreamAdapter::new(
                            Arc::clone(&t.stored),
                            futures::stream::iter([Ok(rows)]),
                        )),
                        seq: seq as u64,
                        deleted: None,
                    }
                })
                .collect();
            let merged = merge::merge_runs(&t, &all, runs, false, &pool, merge::unrecorded());
            let batches: Vec<RecordBatch> = futures::TryStreamExt::try_collect(merged.unwrap())
                .await
                .unwrap();
            let rows: Vec<_> = batches.iter().flat_map(|b| triples(&t, b)).collect();
            assert_eq!(
                rows,
                [
                    (1, Some(3), false),
                    (2, Some(3), false),
                    (3, Some(3), false),
                    (5, Some(1), false),
                    (6, Some(2), false),
                    (7, Some(3), false),
                ],
                "runs in order {order:?}"
            );
            // Where the rows of each run went (keys 1, 2, 3, 5, 6, 7 out).
            let runs = order
                .iter()
                .map(|&seq| merge::Run {
                    rows: Box::pin(RecordBatchStreamAdapter::new(
                        Arc::clone(&t.stored),
                        futures::stream::iter([Ok(put(&t, &[1, 2, 3, 4 + seq], seq))]),
                    )),
                    seq: seq as u64,
                    deleted: None,
                })
                .collect();
            let (merged, trace) = merge::merge_runs_traced(&t, &all, runs, false, &pool).unwrap();
            let batches: Vec<RecordBatch> =
                futures::TryStreamExt::try_collect(merged).await.unwrap();
            assert_eq!(batches.iter().map(|b| b.num_rows()).sum::<usize>(), 6);
            assert_eq!(batches[0].schema(), t.stored, "no trace columns left");
            assert_eq!(trace.pairs(1), [(3, 3)], "order {order:?}");
            assert_eq!(trace.pairs(2), [(3, 4)], "order {order:?}");
            assert_eq!(trace.pairs(3), [(0, 0), (1, 1), (2, 2), (3, 5)]);
            assert_eq!(
                (trace.position(3, 3), trace.position(2, 0)),
                (Some(5), None)
            );
        }
    }

    #[tokio::test]
    async fn written_sstables_are_plain_parquet_datafusion_reads() {
        use datafusion::prelude::{ParquetReadOptions, SessionContext};
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn ObjectStore> =
            Arc::new(object_store::local::LocalFileSystem::new_with_prefix(dir.path()).unwrap());
        let t = Arc::new(table(true));
        let shard = paths::shard_dir("tables/t-1", 0);
        let batches = [put(&t, &[3, 1, 2], 1), put(&t, &[2], 2)];
        let (encoded, _) = encode_batches(&t, &batches).unwrap();
        // Position 1 holds key 2's newer version: input row 3.
        assert_eq!(encoded.source, [1, 3, 0]);
        let file = write(&store, &shard, (1, 7), &encoded, &[]).await.unwrap();
        assert_eq!((file.generation, file.rows), (7, 3));
        assert!(
            file.path
                .starts_with("tables/t-1/shards/0/sst/00000000000000000007-")
        );
        let reader = SstableReader::new(Arc::clone(&store), Arc::clone(&t));
        let all: Vec<usize> = (0..t.stored.fields().len()).collect();
        let back: Vec<RecordBatch> = futures::TryStreamExt::try_collect(
            reader
                .stream(&file, None, &all, &ReadMetrics::default())
                .await
                .unwrap(),
        )
        .await
        .unwrap();
        assert_eq!(
            triples(&t, &back[0]),
            [
                (1, Some(1), false),
                (2, Some(2), false),
                (3, Some(1), false)
            ]
        );
        // A second flush of the same generation gets its own name.
        let again = write(&store, &shard, (1, 7), &encoded, &[]).await.unwrap();
        assert_ne!(again.path, file.path);

        let ctx = SessionContext::new();
        let local = dir.path().join(&file.path);
        let df = ctx
            .read_parquet(local.to_str().unwrap(), ParquetReadOptions::default())
            .await
            .unwrap();
        let rows = df
            .filter(datafusion::prelude::col("id").gt_eq(datafusion::prelude::lit(2i64)))
            .unwrap()
            .collect()
            .await
            .unwrap();
        assert_eq!(rows.iter().map(RecordBatch::num_rows).sum::<usize>(), 2);
        assert!(rows[0].schema().column_with_name("_tombstone").is_some());
    }

    #[tokio::test]
    async fn lookups_fetch_a_file_whole_once_then_read_it_from_memory() {
        let store: Arc<dyn ObjectStore> = Arc::new(object_store::memory::InMemory::new());
        let t = Arc::new(table(true));
        let ids: Vec<i64> = (0..3 * ROW_GROUP_ROWS as i64).collect();
        let (encoded, _) = encode_batches(&t, &[put(&t, &ids, 1)]).unwrap();
        let shard = paths::shard_dir("tables/t-1", 0);
        let file = write(&store, &shard, (1, 1), &encoded, &[]).await.unwrap();
        let reader = SstableReader::new(Arc::clone(&store), Arc::clone(&t));
        let lookup = |id: i64| {
            let (reader, file, t) = (&reader, &file, &t);
            async move {
                let metrics = ReadMetrics::default();
                let key: Vec<datafusion::arrow::array::ArrayRef> =
                    vec![Arc::new(Int64Array::from(vec![id]))];
                let row = reader.lookup(file, &key, &metrics).await.unwrap();
                (row.map(|r| triples(t, &r)[0]), metrics.bytes_read.value())
            }
        };
        // The first lookup fetches the file: its data and its tail (the
        // footer was read before, for the plan).
        let (row, first) = lookup(5).await;
        assert_eq!(row, Some((5, Some(1), false)));
        assert!(first as u64 >= file.bytes / 2, "{first} of {}", file.bytes);
        // Keys in other row groups and pages: no request.
        for id in [ROW_GROUP_ROWS as i64 + 3, 3 * ROW_GROUP_ROWS as i64 - 1] {
            assert_eq!(lookup(id).await, (Some((id, Some(1), false)), 0));
        }
        assert_eq!(lookup(-1).await, (None, 0));
    }
}
