//! [`SstableReader`]: streams and point lookups over SSTables in an object
//! store, with each file's Parquet footer and page index read once and
//! cached (SSTable names are never reused, so a cached footer never goes
//! stale).
//!
//! A lookup reads only what can hold the key: row groups whose statistics
//! cover it and whose key bloom filter may contain it, and within those the
//! pages (by the page index) whose key range covers it. A file a lookup
//! reads from is fetched whole, once, if it is small enough, and later
//! lookups read it from memory: on an object store, where a request costs
//! tens of milliseconds, one large request beats one small request per
//! lookup.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use datafusion::arrow::array::{
    Array, ArrayRef, AsArray, BooleanArray, FixedSizeListArray, Float32Array, RecordBatch, Scalar,
};
use datafusion::arrow::buffer::{NullBuffer, ScalarBuffer};
use datafusion::arrow::compute::kernels::cmp::{eq, gt_eq, lt_eq};
use datafusion::arrow::compute::{and, concat_batches};
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::datatypes::{DataType, Field};
use datafusion::execution::SendableRecordBatchStream;
use datafusion::parquet::arrow::ProjectionMask;
use datafusion::parquet::arrow::arrow_reader::statistics::StatisticsConverter;
use datafusion::parquet::arrow::arrow_reader::{
    ArrowReaderMetadata, ArrowReaderOptions, RowSelection, RowSelector,
};
use datafusion::parquet::arrow::async_reader::ParquetRecordBatchStreamBuilder;
use datafusion::parquet::bloom_filter::Sbbf;
use datafusion::parquet::file::metadata::PageIndexPolicy;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use futures::{StreamExt, TryStreamExt};
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt};

use super::merge::KeyRange;
use super::object::SstableObject;
use super::{DeletionVector, Deletions, ReadMetrics, SstableFile, checksum};
use crate::error::{Error, Result};
use crate::hnsw::Graph;
use crate::schema::{TableSchema, owned_row};
use crate::store::{paths, read_checked};
use datafusion::common::ScalarValue;

/// Rows per batch a stream yields.
const BATCH_ROWS: usize = 8192;
/// Memory of decoded pages lookups keep (per reader).
const CACHED_PAGE_BYTES: usize = 64 << 20;
/// Memory of whole files lookups keep (per reader).
const CACHED_FILE_BYTES: usize = 256 << 20;
/// Largest file a lookup fetches whole.
const WHOLE_FILE_BYTES: u64 = 64 << 20;
/// Memory of deletion vectors kept (per reader).
const CACHED_DELETION_BYTES: usize = 64 << 20;
/// Cached footers; the cache starts over when it grows past this.
const CACHED_FILES: usize = 4096;

/// Memory of decoded vector columns and their graphs (per reader); the cache starts over
/// when it grows past this.
const CACHED_VECTOR_BYTES: usize = 512 << 20;

/// A bloom filter's place: file, row group, column.
type BloomKey = (String, usize, usize);

/// Decoded vector columns by (file, column), and their bytes.
type VectorCache = (HashMap<(String, usize), Arc<VectorColumnData>>, usize);

/// One vector column of an SSTable, decoded, in file order, with its
/// persisted graph (whose nodes read these vectors by row position).
#[derive(Debug)]
pub struct VectorColumnData {
    pub dim: usize,
    /// `rows × dim` values; zeros where `live` is false.
    pub values: ScalarBuffer<f32>,
    /// Whether the row has a vector and is not a tombstone.
    pub live: Vec<bool>,
    /// How many rows are live.
    pub live_rows: usize,
    /// The column's HNSW graphs, each over some of the live rows and
    /// together over all of them, if the SSTable has an index (empty if
    /// not).
    pub graphs: Vec<Graph>,
}

impl VectorColumnData {
    /// Memory the vectors and the graph take.
    pub fn bytes(&self) -> usize {
        self.values.len() * 4 + self.graphs.iter().map(Graph::bytes).sum::<usize>()
    }

    /// The vector at `position`.
    pub fn vector(&self, position: usize) -> &[f32] {
        &self.values[position * self.dim..(position + 1) * self.dim]
    }

    /// The vector at `position` as a one-row array of `data_type` (the
    /// column's `FixedSizeList`), null unless the row is live.
    pub fn row(&self, position: usize, data_type: &DataType) -> ArrayRef {
        let DataType::FixedSizeList(item, dim) = data_type else {
            unreachable!("vector columns are FixedSizeList");
        };
        let values = self.values.slice(position * self.dim, self.dim);
        let nulls = (!self.live[position]).then(|| NullBuffer::new_null(1));
        Arc::new(FixedSizeListArray::new(
            Arc::clone(item),
            *dim,
            Arc::new(Float32Array::new(values, None)),
            nulls,
        ))
    }

    /// The vectors as an Arrow array (no copy); rows that are not live
    /// are null.
    pub fn to_array(&self) -> FixedSizeListArray {
        self.to_array_of(self.live.clone())
    }

    /// The vectors as an array whose valid rows are those where `rows` is
    /// true (live ones, or the array is wrong).
    pub fn to_array_of(&self, rows: Vec<bool>) -> FixedSizeListArray {
        FixedSizeListArray::new(
            Arc::new(Field::new_list_field(DataType::Float32, true)),
            self.dim as i32,
            Arc::new(Float32Array::new(self.values.clone(), None)),
            Some(NullBuffer::from(rows)),
        )
    }
}

/// A file's footer and the block checksums it lists.
#[derive(Clone)]
struct Footer {
    meta: ArrowReaderMetadata,
    blocks: Option<Arc<[u32]>>,
}

impl std::fmt::Debug for Footer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Footer").finish_non_exhaustive()
    }
}

/// Reads SSTables of one table. Cheap to share; caches footers.
#[derive(Debug)]
pub struct SstableReader {
    store: Arc<dyn ObjectStore>,
    schema: Arc<TableSchema>,
    footers: Mutex<HashMap<String, Footer>>,
    blooms: Mutex<HashMap<BloomKey, Option<Arc<Sbbf>>>>,
    pages: Mutex<BoundedCache<PageKey, RecordBatch>>,
    files: Mutex<BoundedCache<String, Bytes>>,
    vectors: Mutex<VectorCache>,
    deletion_vectors: Mutex<BoundedCache<String, Arc<DeletionVector>>>,
}

impl SstableReader {
    /// A reader of SSTables holding rows of `schema` in `store`.
    pub fn new(store: Arc<dyn ObjectStore>, schema: Arc<TableSchema>) -> Self {
        Self {
            store,
            schema,
            footers: Mutex::default(),
            blooms: Mutex::default(),
            pages: Mutex::new(BoundedCache::new(CACHED_PAGE_BYTES)),
            files: Mutex::new(BoundedCache::new(CACHED_FILE_BYTES)),
            vectors: Mutex::default(),
            deletion_vectors: Mutex::new(BoundedCache::new(CACHED_DELETION_BYTES)),
        }
    }

    /// The rows at `positions` (in file order, ascending, distinct) of
    /// `file`, one single-row batch each, stored form: the columns of
    /// `decoded` (decoded vector columns of this file, by column) from
    /// them, every other column from the pages holding the rows, read in
    /// one pass.
    pub async fn rows_at(
        &self,
        file: &SstableFile,
        positions: &[usize],
        decoded: &[(usize, &VectorColumnData)],
        metrics: &ReadMetrics,
    ) -> Result<Vec<RecordBatch>> {
        let stored = &self.schema.stored;
        let others: Vec<usize> = (0..stored.fields().len())
            .filter(|c| decoded.iter().all(|(d, _)| d != c))
            .collect();
        let footer = self.footer(file).await?;
        let meta = footer.meta.clone();
        let mut selectors = Vec::with_capacity(2 * positions.len());
        let mut next = 0;
        for &position in positions {
            if position < next {
                return Err(Error::invalid("row positions must ascend"));
            }
            if position > next {
                selectors.push(RowSelector::skip(position - next));
            }
            selectors.push(RowSelector::select(1));
            next = position + 1;
        }
        let mask = ProjectionMask::roots(meta.parquet_schema(), others.iter().copied());
        let stream = ParquetRecordBatchStreamBuilder::new_with_metadata(
            self.object(file, &footer, metrics)?,
            meta,
        )
        .with_projection(mask)
        .with_row_selection(RowSelection::from(selectors))
        .build()
        .map_err(|e| Self::corrupt(file, e))?;
        let batches: Vec<RecordBatch> = stream
            .try_collect()
            .await
            .map_err(|e| Self::read_error(file, e))?;
        let partial = concat_batches(&Arc::new(stored.project(&others)?), &batches)?;
        let beyond = |p: usize| Self::corrupt(file, format!("no row at position {p}"));
        if partial.num_rows() != positions.len() {
            return Err(beyond(next - 1));
        }
        let mut rows = Vec::with_capacity(positions.len());
        for (i, &position) in positions.iter().enumerate() {
            let read = owned_row(&partial, i)?;
            let mut columns = Vec::with_capacity(stored.fields().len());
            for (c, field) in stored.fields().iter().enumerate() {
                columns.push(match decoded.iter().find(|(d, _)| *d == c) {
                    None => {
                        let at = others.binary_search(&c).expect("projected");
                        Arc::clone(read.column(at))
                    }
                    Some((_, data)) if position < data.live.len() => {
                        data.row(position, field.data_type())
                    }
                    Some(_) => return Err(beyond(position)),
                });
            }
            rows.push(RecordBatch::try_new(Arc::clone(stored), columns)?);
        }
        Ok(rows)
    }

    /// Vector column `column` (a table schema index) of `file` with its
    /// persisted graph if the file has one, read once and cached (the
    /// bytes of a read counted in `metrics`).
    pub async fn vector_column(
        &self,
        file: &SstableFile,
        column: usize,
        metrics: &ReadMetrics,
    ) -> Result<Arc<VectorColumnData>> {
        if let Some(hit) = self
            .vectors
            .lock()
            .expect("vector cache poisoned")
            .0
            .get(&(file.path.clone(), column))
        {
            return Ok(Arc::clone(hit));
        }
        let mut data = self.read_vectors(file, column, metrics).await?;
        let name = self.schema.schema.field(column).name();
        if let Some(graph) = file.graphs.iter().find(|g| g.column() == name) {
            // A graph is an index: without it the column is searched
            // exactly (the same answer), so a missing or damaged one is a
            // warning.
            let loaded = async {
                let path = paths::graph_file(&file.path, name)?;
                self.load_graphs(&path, graph.crc32(), column, &data, metrics)
                    .await
            };
            match loaded.await {
                Ok(graphs) => data.graphs = graphs,
                Err(e) => log::warn!("searching {} exactly: {e}", file.path),
            }
        }
        let data = Arc::new(data);
        self.cache_vector_column(file, column, Arc::clone(&data));
        Ok(data)
    }

    /// The persisted graphs at `path` of vector column `column` over
    /// `data`, checked against `crc32` if the manifest records one.
    async fn load_graphs(
        &self,
        path: &Path,
        crc32: Option<u32>,
        column: usize,
        data: &VectorColumnData,
        metrics: &ReadMetrics,
    ) -> Result<Vec<Graph>> {
        let corrupt = |reason: String| Error::Corrupt {
            path: path.to_string(),
            reason: format!("HNSW graph: {reason}"),
        };
        let read = || async {
            let bytes = self.store.get(path).await?.bytes().await?;
            metrics.bytes_read.add(bytes.len());
            Ok(bytes)
        };
        let check = |bytes: Bytes| match crc32 {
            Some(crc) if Some(crc) != crate::hnsw::persist::checksum(&bytes) => Err(corrupt(
                "checksum mismatch: damaged, or not the graph of this SSTable".into(),
            )),
            _ => Ok(bytes),
        };
        let bytes = read_checked(read, check).await?;
        let graphs =
            crate::hnsw::persist::decode_set(&bytes, data.values.clone()).map_err(corrupt)?;
        let expected = self.schema.vectors.iter().find(|v| v.index == column);
        for graph in &graphs {
            if expected.is_none_or(|v| v.metric != graph.metric() || v.dim as usize != graph.dim())
            {
                return Err(corrupt(
                    "another metric or dimension than the column's".into(),
                ));
            }
        }
        Ok(graphs)
    }

    /// Keeps `data` as what [`SstableReader::vector_column`] returns for
    /// `column` of `file`.
    pub fn cache_vector_column(
        &self,
        file: &SstableFile,
        column: usize,
        data: Arc<VectorColumnData>,
    ) {
        let bytes = data.bytes();
        let mut cache = self.vectors.lock().expect("vector cache poisoned");
        if cache.1 + bytes > CACHED_VECTOR_BYTES {
            *cache = Default::default();
        }
        cache.1 += bytes;
        if let Some(old) = cache.0.insert((file.path.clone(), column), data) {
            cache.1 -= old.bytes();
        }
    }

    /// Vector column `column` of `file`, decoded (no graph, not cached).
    pub async fn read_vectors(
        &self,
        file: &SstableFile,
        column: usize,
        metrics: &ReadMetrics,
    ) -> Result<VectorColumnData> {
        let tombstone = self.schema.stored.fields().len() - 1;
        let mut stream = self
            .stream(file, None, &[column, tombstone], metrics)
            .await?;
        let (mut values, mut live) = (Vec::new(), Vec::new());
        let mut dim = 0;
        while let Some(batch) = stream.try_next().await? {
            let vectors = batch.column(0).as_fixed_size_list();
            let deleted = batch.column(1).as_boolean();
            dim = vectors.value_length() as usize;
            let floats = vectors
                .values()
                .as_primitive::<datafusion::arrow::datatypes::Float32Type>();
            for i in 0..batch.num_rows() {
                let present = !vectors.is_null(i) && !deleted.value(i);
                live.push(present);
                match present {
                    true => {
                        let start = vectors.value_offset(i) as usize;
                        values.extend_from_slice(&floats.values()[start..start + dim]);
                    }
                    false => values.extend(std::iter::repeat_n(0.0, dim)),
                }
            }
        }
        Ok(VectorColumnData {
            dim,
            values: values.into(),
            live_rows: live.iter().filter(|&&l| l).count(),
            live,
            graphs: Vec::new(),
        })
    }

    /// The file of `file` read in checked blocks, the block checksums
    /// taken from `footer`.
    fn object(
        &self,
        file: &SstableFile,
        footer: &Footer,
        metrics: &ReadMetrics,
    ) -> Result<SstableObject> {
        Ok(
            SstableObject::new(Arc::clone(&self.store), file, footer.blocks.clone())?
                .counting(&metrics.bytes_read),
        )
    }

    /// [`SstableReader::object`], read from memory if a lookup fetched the
    /// file whole.
    fn cached_object(
        &self,
        file: &SstableFile,
        footer: &Footer,
        metrics: &ReadMetrics,
    ) -> Result<SstableObject> {
        let object = self.object(file, footer, metrics)?;
        let cached = self.files.lock().expect("file cache poisoned");
        Ok(match cached.get(&file.path) {
            Some(whole) => object.in_memory(whole),
            None => object,
        })
    }

    /// [`SstableReader::cached_object`] for a lookup's rows: the file is
    /// fetched whole first if it is small enough.
    async fn lookup_object(
        &self,
        file: &SstableFile,
        footer: &Footer,
        metrics: &ReadMetrics,
    ) -> Result<SstableObject> {
        let mut object = self.cached_object(file, footer, metrics)?;
        if object.is_in_memory() || file.bytes > WHOLE_FILE_BYTES {
            return Ok(object);
        }
        let whole = object.whole().await?;
        let mut files = self.files.lock().expect("file cache poisoned");
        files.insert(file.path.clone(), whole.clone(), whole.len());
        Ok(object.in_memory(whole))
    }

    fn corrupt(file: &SstableFile, e: impl std::fmt::Display) -> Error {
        Error::Corrupt {
            path: file.path.clone(),
            reason: format!("SSTable: {e}"),
        }
    }

    /// The footer (with page index) of `file`, read on first use, and the
    /// block checksums it lists (which a file with a checksum must have).
    async fn footer(&self, file: &SstableFile) -> Result<Footer> {
        if let Some(footer) = self
            .footers
            .lock()
            .expect("footers poisoned")
            .get(&file.path)
        {
            return Ok(footer.clone());
        }
        let options = ArrowReaderOptions::new().with_page_index_policy(PageIndexPolicy::Optional);
        let mut object = SstableObject::new(Arc::clone(&self.store), file, None)?;
        let meta = ArrowReaderMetadata::load_async(&mut object, options)
            .await
            .map_err(|e| Self::read_error(file, e))?;
        let blocks = match file.checksum {
            Some(checksum) => Some(
                checksum::block_sums(meta.metadata(), checksum.tail_offset).ok_or_else(|| {
                    Self::corrupt(file, "its footer lacks the block checksums it should list")
                })?,
            ),
            None => None,
        };
        let footer = Footer { meta, blocks };
        let mut footers = self.footers.lock().expect("footers poisoned");
        if footers.len() >= CACHED_FILES {
            footers.clear();
        }
        footers.insert(file.path.clone(), footer.clone());
        Ok(footer)
    }

    /// Our own errors (a checksum mismatch, a missing object) pass as they
    /// are; anything else unreadable is corruption naming the file.
    fn read_error(file: &SstableFile, e: datafusion::parquet::errors::ParquetError) -> Error {
        match e {
            datafusion::parquet::errors::ParquetError::External(inner) => {
                match inner.downcast::<Error>() {
                    Ok(ours) => *ours,
                    Err(other) => match other.downcast::<object_store::Error>() {
                        Ok(store) => Error::from(*store),
                        Err(other) => Self::corrupt(file, other),
                    },
                }
            }
            other => Self::corrupt(file, other),
        }
    }

    /// The rows of each row group of `file`, in file order.
    pub async fn row_group_rows(&self, file: &SstableFile) -> Result<Vec<u64>> {
        let footer = self.footer(file).await?;
        let groups = footer.meta.metadata().row_groups();
        Ok(groups.iter().map(|g| g.num_rows() as u64).collect())
    }

    /// The rows of `file` (stored form projected to `columns`, indices
    /// into the stored schema) in file order (by key), as a stream: all of
    /// them, or those of `row_groups`.
    pub async fn stream(
        &self,
        file: &SstableFile,
        row_groups: Option<Vec<usize>>,
        columns: &[usize],
        metrics: &ReadMetrics,
    ) -> Result<SendableRecordBatchStream> {
        self.stream_selected(file, row_groups, None, columns, metrics)
            .await
    }

    /// [`SstableReader::stream`] of the rows `deleted` does not mark, of
    /// row group `row_group` or of the whole file.
    pub async fn stream_unmarked(
        &self,
        file: &SstableFile,
        row_group: Option<usize>,
        deleted: &DeletionVector,
        columns: &[usize],
        metrics: &ReadMetrics,
    ) -> Result<SendableRecordBatchStream> {
        let sizes = self.row_group_rows(file).await?;
        let (start, len) = match row_group {
            Some(g) => (sizes[..g].iter().sum(), sizes[g]),
            None => (0, sizes.iter().sum()),
        };
        let selection = deleted.selection(start, len);
        let groups = row_group.map(|g| vec![g]);
        self.stream_selected(file, groups, Some(selection), columns, metrics)
            .await
    }

    async fn stream_selected(
        &self,
        file: &SstableFile,
        row_groups: Option<Vec<usize>>,
        selection: Option<RowSelection>,
        columns: &[usize],
        metrics: &ReadMetrics,
    ) -> Result<SendableRecordBatchStream> {
        let footer = self.footer(file).await?;
        let meta = footer.meta.clone();
        let mask = ProjectionMask::roots(meta.parquet_schema(), columns.iter().copied());
        let schema: SchemaRef = Arc::new(self.schema.stored.project(columns)?);
        let mut builder = ParquetRecordBatchStreamBuilder::new_with_metadata(
            self.object(file, &footer, metrics)?,
            meta,
        )
        .with_projection(mask)
        .with_batch_size(BATCH_ROWS);
        if let Some(row_groups) = row_groups {
            builder = builder.with_row_groups(row_groups);
        }
        if let Some(selection) = selection {
            builder = builder.with_row_selection(selection);
        }
        let stream = builder.build().map_err(|e| Self::corrupt(file, e))?;
        let file = file.clone();
        let out_schema = Arc::clone(&schema);
        let stream = stream.map(move |batch| {
            let batch = batch.map_err(|e| Self::read_error(&file, e))?;
            Ok(RecordBatch::try_new(
                Arc::clone(&out_schema),
                batch.columns().to_vec(),
            )?)
        });
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            schema,
            stream.map_err(|e: Error| e.into()),
        )))
    }

    /// The deletion vector of `file`, if it has one: read once, checked
    /// against its manifest entry, and cached.
    pub async fn deletions(&self, file: &SstableFile) -> Result<Option<Arc<DeletionVector>>> {
        let Some(entry) = &file.deletions else {
            return Ok(None);
        };
        let cached = self
            .deletion_vectors
            .lock()
            .expect("deletions poisoned")
            .get(&entry.path);
        if let Some(vector) = cached {
            return Ok(Some(vector));
        }
        let path = paths::stored(&entry.path)?;
        let read = || async { Ok(self.store.get(&path).await?.bytes().await?) };
        let decode = |bytes: Bytes| DeletionVector::decode(entry, file.rows, &bytes);
        let vector = Arc::new(read_checked(read, decode).await?);
        self.cache_deletions(entry, Arc::clone(&vector));
        Ok(Some(vector))
    }

    /// Keeps `vector`, just written as `entry`, for later reads.
    pub fn cache_deletions(&self, entry: &Deletions, vector: Arc<DeletionVector>) {
        let bytes = vector.rows() as usize / 8 + 64;
        self.deletion_vectors
            .lock()
            .expect("deletions poisoned")
            .insert(entry.path.clone(), vector, bytes);
    }

    /// The positions (ascending) of the rows of `file` whose key is among
    /// `keys` (key columns, stored types, sorted by key with no key twice,
    /// as a flush writes them). Reads only the key columns of the row
    /// groups whose key range holds one of `keys` and, when few do, whose
    /// bloom filter may contain one.
    pub async fn rows_with_keys(&self, file: &SstableFile, keys: &[ArrayRef]) -> Result<Vec<u64>> {
        let found = self.find_keys(file, keys).await?;
        Ok(found.into_iter().map(|(row, _)| row).collect())
    }

    /// Which of `keys` (as for [`SstableReader::rows_with_keys`]) `file`
    /// holds a row of: their indices in `keys`, ascending.
    pub async fn keys_in(&self, file: &SstableFile, keys: &[ArrayRef]) -> Result<Vec<usize>> {
        let found = self.find_keys(file, keys).await?;
        Ok(found.into_iter().map(|(_, key)| key).collect())
    }

    /// The rows of `file` holding one of `keys`: `(position, index in
    /// keys)`, ascending.
    async fn find_keys(&self, file: &SstableFile, keys: &[ArrayRef]) -> Result<Vec<(u64, usize)>> {
        let schema = &self.schema;
        let converter = schema.key_converter()?;
        let wanted = converter.convert_columns(keys)?;
        if wanted.num_rows() == 0 {
            return Ok(Vec::new());
        }
        let sizes = self.row_group_rows(file).await?;
        let ranges = self.row_group_ranges(file).await?;
        let footer = self.footer(file).await?;
        let metrics = ReadMetrics::default();
        let mut hits = Vec::new();
        let mut start = 0u64;
        for (g, &rows) in sizes.iter().enumerate() {
            let first_row = start;
            start += rows;
            // The slice of `wanted` this row group's key range holds.
            let (lo, hi) = match &ranges {
                Some(ranges) => {
                    let ((lo, hi), _) = &ranges[g];
                    let bound = |v: &ScalarValue| -> Result<_> {
                        let rows = converter.convert_columns(&[v.to_array()?])?;
                        Ok(rows.row(0).owned())
                    };
                    let (lo, hi) = (bound(lo)?, bound(hi)?);
                    let from = partition_point(&wanted, |r| r < lo.row());
                    let to = partition_point(&wanted, |r| r <= hi.row());
                    (from, to)
                }
                None => (0, wanted.num_rows()),
            };
            if lo >= hi {
                continue;
            }
            if hi - lo <= FEW_KEYS {
                let mut any = false;
                for i in lo..hi {
                    let key: Vec<ArrayRef> = keys.iter().map(|k| k.slice(i, 1)).collect();
                    if self
                        .bloom_may_contain(file, &footer, g, &key, &metrics)
                        .await?
                    {
                        any = true;
                        break;
                    }
                }
                if !any {
                    continue;
                }
            }
            let mut batches = self
                .stream(file, Some(vec![g]), &schema.key, &metrics)
                .await?;
            let (mut at, mut w) = (first_row, lo);
            while let Some(batch) = batches.next().await {
                let batch = batch?;
                let found = converter.convert_columns(batch.columns())?;
                for row in found.iter() {
                    while w < hi && wanted.row(w) < row {
                        w += 1;
                    }
                    if w < hi && wanted.row(w) == row {
                        hits.push((at, w));
                    }
                    at += 1;
                }
            }
        }
        Ok(hits)
    }

    /// The smallest and largest key and the row count of each row group
    /// of `file` (from its statistics), for a table with a one-column key;
    /// `None` where statistics are missing.
    pub async fn row_group_ranges(
        &self,
        file: &SstableFile,
    ) -> Result<Option<Vec<(KeyRange, u64)>>> {
        let [key] = self.schema.key.as_slice() else {
            return Ok(None);
        };
        let footer = self.footer(file).await?;
        let meta = &footer.meta;
        let parquet = meta.metadata();
        let groups = parquet.row_groups();
        let stats = StatisticsConverter::try_new(
            self.schema.stored.field(*key).name(),
            meta.schema(),
            parquet.file_metadata().schema_descr(),
        )
        .map_err(|e| Self::corrupt(file, e))?;
        let mins = stats
            .row_group_mins(groups)
            .map_err(|e| Self::corrupt(file, e))?;
        let maxes = stats
            .row_group_maxes(groups)
            .map_err(|e| Self::corrupt(file, e))?;
        let mut ranges = Vec::with_capacity(groups.len());
        for (i, group) in groups.iter().enumerate() {
            if mins.is_null(i) || maxes.is_null(i) {
                return Ok(None);
            }
            let range = (
                ScalarValue::try_from_array(&mins, i)?,
                ScalarValue::try_from_array(&maxes, i)?,
            );
            ranges.push((range, group.num_rows() as u64));
        }
        Ok(Some(ranges))
    }

    /// The row of `file` whose key columns equal `key` (one row of the key
    /// columns, stored types), in stored form, or `None`. The row may be a
    /// tombstone.
    pub async fn lookup(
        &self,
        file: &SstableFile,
        key: &[ArrayRef],
        metrics: &ReadMetrics,
    ) -> Result<Option<RecordBatch>> {
        let footer = self.footer(file).await?;
        let meta = &footer.meta;
        let parquet = meta.metadata().clone();
        let arrow_schema = Arc::clone(meta.schema());
        let schema = &self.schema;
        let row_groups = parquet.row_groups();
        // Row groups whose statistics cover the key on every key column.
        let mut candidates = vec![true; row_groups.len()];
        let mut first_key_stats = None;
        for (i, &column) in schema.key.iter().enumerate() {
            let name = schema.stored.field(column).name();
            let stats = StatisticsConverter::try_new(
                name,
                &arrow_schema,
                parquet.file_metadata().schema_descr(),
            )
            .map_err(|e| Self::corrupt(file, e))?;
            let value = Scalar::new(Arc::clone(&key[i]));
            let mins = stats
                .row_group_mins(row_groups)
                .map_err(|e| Self::corrupt(file, e))?;
            let maxes = stats
                .row_group_maxes(row_groups)
                .map_err(|e| Self::corrupt(file, e))?;
            let covers = covers(&mins, &maxes, &value)?;
            for (rg, c) in candidates.iter_mut().enumerate() {
                *c &= covers.is_null(rg) || covers.value(rg);
            }
            if i == 0 {
                first_key_stats = Some(stats);
            }
        }
        let first_key_stats = first_key_stats.expect("a lookup needs a key");
        let covering = candidates.iter().filter(|&&c| c).count();
        metrics
            .row_groups_pruned_by_statistics
            .add(row_groups.len() - covering);
        for rg in (0..row_groups.len()).filter(|&rg| candidates[rg]) {
            if !self
                .bloom_may_contain(file, &footer, rg, key, metrics)
                .await?
            {
                metrics.row_groups_pruned_by_bloom_filter.add(1);
                continue;
            }
            let (selection, rows_read) = pages_covering(&parquet, &first_key_stats, rg, &key[0])?;
            let rows = row_groups[rg].num_rows() as usize;
            let (first, end) = (rows_read.0.min(rows), rows_read.1.min(rows));
            metrics
                .rows_pruned_by_page_index
                .add(rows - end.saturating_sub(first));
            let page_key = (file.path.clone(), rg, rows_read);
            let cached = self
                .pages
                .lock()
                .expect("page cache poisoned")
                .get(&page_key);
            let rows = match cached {
                Some(rows) => rows,
                None => {
                    let mut builder = ParquetRecordBatchStreamBuilder::new_with_metadata(
                        self.lookup_object(file, &footer, metrics).await?,
                        meta.clone(),
                    )
                    .with_row_groups(vec![rg])
                    // Buffers sized for one page, as cached.
                    .with_batch_size(super::PAGE_ROWS);
                    if let Some(selection) = selection {
                        builder = builder.with_row_selection(selection);
                    }
                    let batches: Vec<RecordBatch> = builder
                        .build()
                        .map_err(|e| Self::corrupt(file, e))?
                        .map_err(|e| Self::read_error(file, e))
                        .try_collect()
                        .await?;
                    let rows = concat_batches(&Arc::clone(meta.schema()), &batches)?;
                    let bytes = rows.get_array_memory_size();
                    self.pages.lock().expect("page cache poisoned").insert(
                        page_key,
                        rows.clone(),
                        bytes,
                    );
                    rows
                }
            };
            let mut matches: Option<BooleanArray> = None;
            for (i, &column) in schema.key.iter().enumerate() {
                let m = eq(rows.column(column), &Scalar::new(Arc::clone(&key[i])))?;
                matches = Some(match matches {
                    Some(prev) => and(&prev, &m)?,
                    None => m,
                });
            }
            let matches = matches.expect("a key column");
            if let Some(at) = matches.iter().position(|m| m == Some(true)) {
                let row = RecordBatch::try_new(
                    Arc::clone(&schema.stored),
                    owned_row(&rows, at)?.columns().to_vec(),
                )?;
                return Ok(Some(row));
            }
        }
        Ok(None)
    }

    /// Whether row group `rg`'s bloom filters may contain `key` (true when
    /// a filter is absent or the key type has none).
    async fn bloom_may_contain(
        &self,
        file: &SstableFile,
        footer: &Footer,
        rg: usize,
        key: &[ArrayRef],
        metrics: &ReadMetrics,
    ) -> Result<bool> {
        for (i, &column) in self.schema.key.iter().enumerate() {
            let cache_key = (file.path.clone(), rg, column);
            let cached = self
                .blooms
                .lock()
                .expect("blooms poisoned")
                .get(&cache_key)
                .cloned();
            let bloom = match cached {
                Some(bloom) => bloom,
                None => {
                    let mut builder = ParquetRecordBatchStreamBuilder::new_with_metadata(
                        self.cached_object(file, footer, metrics)?,
                        footer.meta.clone(),
                    );
                    let bloom = builder
                        .get_row_group_column_bloom_filter(rg, column)
                        .await
                        .map_err(|e| Self::read_error(file, e))?
                        .map(Arc::new);
                    let mut blooms = self.blooms.lock().expect("blooms poisoned");
                    if blooms.len() >= CACHED_FILES * 4 {
                        blooms.clear();
                    }
                    blooms.insert(cache_key, bloom.clone());
                    bloom
                }
            };
            if let Some(bloom) = bloom
                && bloom_check(&bloom, &key[i]) == Some(false)
            {
                return Ok(false);
            }
        }
        Ok(true)
    }
}

/// Per row group (or page): whether `min <= value <= max` (null where a
/// statistic is missing).
fn covers(mins: &ArrayRef, maxes: &ArrayRef, value: &Scalar<ArrayRef>) -> Result<BooleanArray> {
    Ok(and(&lt_eq(mins, value)?, &gt_eq(maxes, value)?)?)
}

/// The rows of row group `rg` on pages whose first-key-column range covers
/// `value`, and the range from the first to the last of them (which names
/// the selection: the pages are consecutive, the column being sorted); no
/// selection (the whole group) without a page index.
fn pages_covering(
    parquet: &datafusion::parquet::file::metadata::ParquetMetaData,
    stats: &StatisticsConverter<'_>,
    rg: usize,
    value: &ArrayRef,
) -> Result<(Option<RowSelection>, (usize, usize))> {
    let (Some(column_index), Some(offset_index)) = (parquet.column_index(), parquet.offset_index())
    else {
        return Ok((None, (0, usize::MAX)));
    };
    let pages = || -> datafusion::parquet::errors::Result<_> {
        Ok((
            stats.data_page_mins(column_index, offset_index, [&rg])?,
            stats.data_page_maxes(column_index, offset_index, [&rg])?,
            stats.data_page_row_counts(offset_index, parquet.row_groups(), [&rg])?,
        ))
    };
    let Ok((mins, maxes, Some(counts))) = pages() else {
        return Ok((None, (0, usize::MAX)));
    };
    let covering = covers(&mins, &maxes, &Scalar::new(Arc::clone(value)))?;
    let mut first = None;
    let mut end = 0;
    let mut row = 0;
    let selectors: Vec<RowSelector> = (0..counts.len())
        .map(|page| {
            let rows = counts.value(page) as usize;
            let selected = covering.is_null(page) || covering.value(page);
            if selected && first.is_none() {
                first = Some(row);
            }
            row += rows;
            if selected {
                end = row;
            }
            match selected {
                true => RowSelector::select(rows),
                false => RowSelector::skip(rows),
            }
        })
        .collect();
    Ok((
        Some(RowSelection::from(selectors)),
        (first.unwrap_or(row), end),
    ))
}

/// Whether `bloom` may contain the one value of `key` as Parquet hashes
/// it (its physical value), or `None` for a type this does not map.
/// Keys of a flush a row group's bloom filter is asked about before its
/// keys are read; more than that almost surely pass it anyway.
const FEW_KEYS: usize = 16;

/// The first index of `rows` (sorted) for which `before` is false.
fn partition_point(
    rows: &datafusion::arrow::row::Rows,
    before: impl Fn(datafusion::arrow::row::Row<'_>) -> bool,
) -> usize {
    let (mut lo, mut hi) = (0, rows.num_rows());
    while lo < hi {
        let mid = (lo + hi) / 2;
        match before(rows.row(mid)) {
            true => lo = mid + 1,
            false => hi = mid,
        }
    }
    lo
}

fn bloom_check(bloom: &Sbbf, key: &ArrayRef) -> Option<bool> {
    use datafusion::arrow::datatypes::*;
    if key.is_null(0) {
        return None;
    }
    Some(match key.data_type() {
        DataType::Int8 => bloom.check(&(key.as_primitive::<Int8Type>().value(0) as i32)),
        DataType::Int16 => bloom.check(&(key.as_primitive::<Int16Type>().value(0) as i32)),
        DataType::Int32 => bloom.check(&key.as_primitive::<Int32Type>().value(0)),
        DataType::Int64 => bloom.check(&key.as_primitive::<Int64Type>().value(0)),
        DataType::UInt8 => bloom.check(&(key.as_primitive::<UInt8Type>().value(0) as i32)),
        DataType::UInt16 => bloom.check(&(key.as_primitive::<UInt16Type>().value(0) as i32)),
        DataType::UInt32 => bloom.check(&(key.as_primitive::<UInt32Type>().value(0) as i32)),
        DataType::UInt64 => bloom.check(&(key.as_primitive::<UInt64Type>().value(0) as i64)),
        DataType::Date32 => bloom.check(&key.as_primitive::<Date32Type>().value(0)),
        DataType::Utf8 => bloom.check(key.as_string::<i32>().value(0)),
        DataType::LargeUtf8 => bloom.check(key.as_string::<i64>().value(0)),
        DataType::Utf8View => bloom.check(key.as_string_view().value(0)),
        DataType::Binary => bloom.check(key.as_binary::<i32>().value(0)),
        DataType::LargeBinary => bloom.check(key.as_binary::<i64>().value(0)),
        DataType::BinaryView => bloom.check(key.as_binary_view().value(0)),
        DataType::FixedSizeBinary(_) => bloom.check(key.as_fixed_size_binary().value(0)),
        _ => return None,
    })
}

/// File, row group, and the rows read (first and end).
type PageKey = (String, usize, (usize, usize));

/// Values of immutable things (SSTables are never rewritten, so never
/// stale), kept until their memory passes a budget; the oldest go first.
#[derive(Debug)]
struct BoundedCache<K, V> {
    values: HashMap<K, (V, usize)>,
    order: std::collections::VecDeque<K>,
    bytes: usize,
    budget: usize,
}

impl<K: std::hash::Hash + Eq + Clone, V: Clone> BoundedCache<K, V> {
    fn new(budget: usize) -> Self {
        Self {
            values: HashMap::new(),
            order: std::collections::VecDeque::new(),
            bytes: 0,
            budget,
        }
    }

    fn get(&self, key: &K) -> Option<V> {
        self.values.get(key).map(|(v, _)| v.clone())
    }

    /// Keeps `value`, of `bytes` bytes, under `key`.
    fn insert(&mut self, key: K, value: V, bytes: usize) {
        self.bytes += bytes;
        match self.values.insert(key.clone(), (value, bytes)) {
            Some((_, old)) => self.bytes -= old,
            None => self.order.push_back(key),
        }
        while self.bytes > self.budget {
            let Some(oldest) = self.order.pop_front() else {
                break;
            };
            if let Some((_, gone)) = self.values.remove(&oldest) {
                self.bytes -= gone;
            }
        }
    }
}
