//! Blob columns: binary values above a size limit stored out of line, the
//! values of one WAL group commit in one pack object, and named in stored
//! rows by a descriptor.
//!
//! A blob column `c` is stored as two columns: `c` itself, holding values
//! up to the inline limit (and every value of a MemTable row whose group
//! commit has not packed it yet), and `_blob_c`, a struct
//! naming where a packed value lives: `(pack, epoch, offset, length,
//! crc32)`. A row's value is `c` where the descriptor is NULL, otherwise
//! the `length` bytes at `offset` of the pack written at WAL position
//! `pack` by the writer of `epoch` (see [`pack_path`]), whose CRC-32
//! is `crc32`. A pack is raw bytes: the values one after another.
//!
//! A group commit's pack that fits one request is the front of its WAL
//! entry's object ([`IN_WAL`]): one object a group, written at once, so
//! no entry ever names a pack that is not there. A larger pack is an
//! object of its own, written (in parts) before the entry that names it.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Range;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use datafusion::arrow::array::{
    Array, ArrayRef, AsArray, Int64Array, LargeBinaryBuilder, RecordBatch, StructArray,
    UInt32Array, UInt64Array,
};
use datafusion::arrow::buffer::Buffer;
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::DataType;
use datafusion::physical_plan::metrics::Count;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutPayload};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::schema::{BlobColumn, TableSchema, blob_descriptor_fields};
use crate::store::paths;

/// Packs some rows name: WAL positions `first..=last` of the writer of
/// `epoch` (those of them that have a pack). Stored as `[epoch, first,
/// last]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "[u64; 3]", into = "[u64; 3]")]
pub struct PackRun {
    pub epoch: u64,
    pub first: u64,
    pub last: u64,
}

/// Why a read of a pack that is not in the store fails.
const MISSING_PACK: &str = "a row names a blob pack that does not exist";

/// The pack and epoch of the pack a read found missing, if `error` is
/// that (for a pack inside a WAL entry, any epoch: see
/// [`PackRun::contains`]).
pub(crate) fn missing_pack(error: &Error) -> Option<(u64, u64)> {
    match error {
        Error::Corrupt { path, reason } if reason == MISSING_PACK => {
            let name = path.rsplit('/').next()?;
            let in_entry = || Some((paths::parse_wal_file(name)? | IN_WAL, 0));
            paths::parse_blob_pack(name).or_else(in_entry)
        }
        _ => None,
    }
}

impl From<[u64; 3]> for PackRun {
    fn from([epoch, first, last]: [u64; 3]) -> Self {
        Self { epoch, first, last }
    }
}

impl From<PackRun> for [u64; 3] {
    fn from(r: PackRun) -> Self {
        [r.epoch, r.first, r.last]
    }
}

impl PackRun {
    /// Whether the pack `pack` of `epoch` is in this run. A pack inside a
    /// WAL entry is named by its position alone (a position holds one
    /// entry, whoever wrote it).
    pub fn contains(&self, epoch: u64, pack: u64) -> bool {
        (self.epoch == epoch || in_wal(pack)) && (self.first..=self.last).contains(&pack)
    }
}

/// The ids of packs at the front of their WAL entry's object have this
/// bit set over the entry's position (and [`UNLOGGED`] clear).
pub const IN_WAL: u64 = 1 << 62;

/// Whether pack `pack` is the front of the WAL entry at its position.
pub fn in_wal(pack: u64) -> bool {
    pack & (UNLOGGED | IN_WAL) == IN_WAL
}

/// The object holding pack `pack` of the writer of `epoch` in the shard
/// at `shard_dir`: its WAL entry (see [`IN_WAL`]) or a pack object of its
/// own ([`paths::blob_pack`]).
pub fn pack_path(shard_dir: &Path, pack: u64, epoch: u64) -> Path {
    match in_wal(pack) {
        true => paths::wal_file(&paths::wal_dir(shard_dir), pack & !IN_WAL),
        false => paths::blob_pack(shard_dir, pack, epoch),
    }
}

/// The bytes the rows of some batches name in each pack, by `(epoch,
/// pack)`.
pub type Named = BTreeMap<(u64, u64), u64>;

/// Adds to `named` the bytes every row of `batch` (stored form) names in
/// each pack.
pub fn collect_named(schema: &TableSchema, batch: &RecordBatch, named: &mut Named) {
    for blob in &schema.blobs {
        count_named(batch.column(blob.descriptor).as_struct(), named);
    }
}

/// Adds to `named` the bytes each descriptor of `descriptors` names.
pub fn count_named(descriptors: &StructArray, named: &mut Named) {
    if descriptors.null_count() == descriptors.len() {
        return;
    }
    for (_, d) in Descriptors::of(descriptors).iter() {
        *named.entry((d.epoch, d.pack)).or_default() += d.length;
    }
}

/// Where one packed value lives, and its checksum.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Descriptor {
    pub pack: u64,
    pub epoch: u64,
    pub offset: u64,
    pub length: u64,
    pub crc32: u32,
}

/// The fields of a descriptor column.
struct Descriptors<'a> {
    valid: &'a StructArray,
    pack: &'a UInt64Array,
    epoch: &'a UInt64Array,
    offset: &'a UInt64Array,
    length: &'a UInt64Array,
    crc32: &'a UInt32Array,
}

impl<'a> Descriptors<'a> {
    fn of(array: &'a StructArray) -> Self {
        let field = |i: usize| array.column(i).as_primitive();
        Self {
            valid: array,
            pack: field(0),
            epoch: field(1),
            offset: field(2),
            length: field(3),
            crc32: array.column(4).as_primitive(),
        }
    }

    /// Each row that names a packed value, and its descriptor.
    fn iter(&self) -> impl Iterator<Item = (usize, Descriptor)> + '_ {
        (0..self.valid.len())
            .filter(|&row| self.valid.is_valid(row))
            .map(|row| {
                let d = Descriptor {
                    pack: self.pack.value(row),
                    epoch: self.epoch.value(row),
                    offset: self.offset.value(row),
                    length: self.length.value(row),
                    crc32: self.crc32.value(row),
                };
                (row, d)
            })
    }
}

/// The packs of `named` as runs of consecutive positions.
pub fn runs(named: &Named) -> Vec<PackRun> {
    let mut out: Vec<PackRun> = Vec::new();
    for &(epoch, position) in named.keys() {
        match out.last_mut() {
            Some(run) if run.epoch == epoch && run.last + 1 == position => run.last = position,
            _ => out.push(PackRun {
                epoch,
                first: position,
                last: position,
            }),
        }
    }
    out
}

/// A group commit's batches with their long blob values moved into a pack.
#[derive(Debug)]
pub struct Packed {
    /// The pack's bytes: slices of the batches' own value buffers, in
    /// order (nothing is copied).
    pub bytes: PutPayload,
    /// The batches with the moved values' inline slots NULL; their
    /// descriptors are made by [`Packed::into_batches`].
    batches: Vec<RecordBatch>,
    moved: Vec<Moved>,
    /// The pack's WAL position and its writer's epoch.
    pack: u64,
    epoch: u64,
}

/// A blob column of one of [`Packed`]'s batches that had values moved.
#[derive(Debug)]
struct Moved {
    batch: usize,
    descriptor: usize,
    /// The column as it was, which still holds the moved values.
    values: ArrayRef,
    /// Where each row's value is in the pack; `None` if it stayed inline.
    at: Vec<Option<(u64, u64)>>,
}

impl Packed {
    /// Makes the pack the front of its WAL entry's object (see
    /// [`IN_WAL`]) instead of an object of its own.
    pub fn inside_wal_entry(&mut self) {
        self.pack |= IN_WAL;
    }

    /// The batches with descriptors in place of the moved values. It
    /// reads every moved value once (for its checksum): a writer runs it
    /// while the pack is being written.
    pub fn into_batches(self) -> Result<Vec<RecordBatch>> {
        let mut batches = self.batches;
        for moved in self.moved {
            let rows = moved.at.len();
            let (mut offsets, mut lengths, mut crcs) = (
                Vec::with_capacity(rows),
                Vec::with_capacity(rows),
                Vec::with_capacity(rows),
            );
            for (row, at) in moved.at.iter().enumerate() {
                let (offset, length, crc) = match at {
                    Some((offset, length)) => {
                        let value = binary_value(moved.values.as_ref(), row)
                            .expect("a moved value is not NULL");
                        (*offset, *length, crc32fast::hash(value))
                    }
                    None => (0, 0, 0),
                };
                offsets.push(offset);
                lengths.push(length);
                crcs.push(crc);
            }
            let descriptors = StructArray::try_new(
                blob_descriptor_fields(),
                vec![
                    Arc::new(UInt64Array::from(vec![self.pack; rows])),
                    Arc::new(UInt64Array::from(vec![self.epoch; rows])),
                    Arc::new(UInt64Array::from(offsets)),
                    Arc::new(UInt64Array::from(lengths)),
                    Arc::new(UInt32Array::from(crcs)),
                ],
                Some(moved.at.iter().map(Option::is_some).collect()),
            )?;
            let batch = &batches[moved.batch];
            let mut columns = batch.columns().to_vec();
            columns[moved.descriptor] = Arc::new(descriptors);
            batches[moved.batch] = RecordBatch::try_new(batch.schema(), columns)?;
        }
        Ok(batches)
    }
}

/// Row `row` of a binary column (`Binary`, `LargeBinary` or
/// `BinaryView`, the types a blob column may have); `None` if NULL.
fn binary_value(values: &dyn Array, row: usize) -> Option<&[u8]> {
    if values.is_null(row) {
        return None;
    }
    Some(match values.data_type() {
        DataType::Binary => values.as_binary::<i32>().value(row),
        DataType::LargeBinary => values.as_binary::<i64>().value(row),
        DataType::BinaryView => values.as_binary_view().value(row),
        other => unreachable!("a blob column of type {other}"),
    })
}

/// Owns a slice of an Arrow buffer for [`Bytes::from_owner`].
struct Shared(Buffer);

impl AsRef<[u8]> for Shared {
    fn as_ref(&self) -> &[u8] {
        self.0.as_slice()
    }
}

/// A pack's bytes gathered as slices of the buffers the values already
/// live in: neighbouring values of one buffer become one slice.
#[derive(Default)]
struct PackBytes {
    chunks: Vec<Bytes>,
    len: u64,
    /// The slice being extended: a buffer and a range of it.
    run: Option<(Buffer, Range<usize>)>,
}

impl PackBytes {
    /// Appends `value`, which lies inside one of `buffers` (a value of an
    /// array whose buffers they are).
    fn push(&mut self, buffers: &[Buffer], value: &[u8]) {
        self.len += value.len() as u64;
        let at = value.as_ptr() as usize;
        let holder = buffers.iter().find_map(|b| {
            let start = b.as_ptr() as usize;
            (start <= at && at + value.len() <= start + b.len()).then(|| (b, at - start))
        });
        let Some((buffer, start)) = holder else {
            self.end_run();
            self.chunks.push(Bytes::copy_from_slice(value));
            return;
        };
        let range = start..start + value.len();
        match &mut self.run {
            Some((b, run)) if b.as_ptr() == buffer.as_ptr() && run.end == range.start => {
                run.end = range.end;
            }
            _ => {
                self.end_run();
                self.run = Some((buffer.clone(), range));
            }
        }
    }

    fn end_run(&mut self) {
        if let Some((buffer, range)) = self.run.take() {
            let slice = buffer.slice_with_length(range.start, range.len());
            self.chunks.push(Bytes::from_owner(Shared(slice)));
        }
    }

    fn finish(mut self) -> PutPayload {
        self.end_run();
        PutPayload::from_iter(self.chunks)
    }
}

/// Moves every value of a blob column of `batches` (stored form) longer
/// than `inline_limit` bytes into one pack, to be written at WAL position
/// `pack` by the writer of `epoch`. `None` if no value is that long (no
/// pack is needed; the batches are as they were). The pack shares the
/// batches' buffers: it copies no value.
pub fn pack(
    schema: &TableSchema,
    batches: &[RecordBatch],
    pack: u64,
    epoch: u64,
    inline_limit: usize,
) -> Result<Option<Packed>> {
    if schema.blobs.is_empty() {
        return Ok(None);
    }
    let mut bytes = PackBytes::default();
    let (mut out, mut moved) = (Vec::with_capacity(batches.len()), Vec::new());
    for (at_batch, batch) in batches.iter().enumerate() {
        let mut columns = batch.columns().to_vec();
        for blob in &schema.blobs {
            let values = batch.column(blob.index);
            let value = |row: usize| binary_value(values.as_ref(), row);
            let long = |row: usize| value(row).is_some_and(|v| v.len() > inline_limit);
            if !(0..values.len()).any(long) {
                continue;
            }
            let buffers = values.to_data().buffers().to_vec();
            let mut inline = LargeBinaryBuilder::new();
            let mut at = Vec::with_capacity(values.len());
            for row in 0..values.len() {
                match value(row) {
                    Some(v) if v.len() > inline_limit => {
                        at.push(Some((bytes.len, v.len() as u64)));
                        bytes.push(&buffers, v);
                        inline.append_null();
                    }
                    v => {
                        at.push(None);
                        inline.append_option(v);
                    }
                }
            }
            let inline: ArrayRef = Arc::new(inline.finish());
            columns[blob.index] = cast(&inline, values.data_type())?;
            moved.push(Moved {
                batch: at_batch,
                descriptor: blob.descriptor,
                values: Arc::clone(values),
                at,
            });
        }
        out.push(RecordBatch::try_new(batch.schema(), columns)?);
    }
    if bytes.len == 0 {
        return Ok(None);
    }
    Ok(Some(Packed {
        bytes: bytes.finish(),
        batches: out,
        moved,
        pack,
        epoch,
    }))
}

/// Parts of a pack's multipart upload: a pack up to this size is one PUT,
/// a larger one uploads in parts of this size (S3's floor is 5 MiB), so no
/// request carries more than this.
pub const PACK_PART_BYTES: usize = 16 << 20;

/// Writes `bytes` as the pack at `path`: one PUT, or a multipart upload
/// above [`PACK_PART_BYTES`] that is aborted (its parts deleted) when a
/// part fails. A completion that fails is checked: a pack of the full size
/// at `path` is written.
pub async fn put_pack(store: &Arc<dyn ObjectStore>, path: &Path, bytes: PutPayload) -> Result<()> {
    use tokio::io::AsyncWriteExt;
    let size = bytes.content_length() as u64;
    let mut object = object_store::buffered::BufWriter::with_capacity(
        Arc::clone(store),
        path.clone(),
        PACK_PART_BYTES,
    );
    let mut completing = false;
    let written = async {
        for chunk in &bytes {
            object.put(chunk.clone()).await?;
        }
        completing = true;
        object.shutdown().await?;
        Ok::<_, Error>(())
    };
    match written.await {
        Ok(()) => Ok(()),
        Err(e) if completing => {
            // A failed completion cleans up its own parts; it may have
            // landed with its answer lost.
            if crate::store::landed(store.as_ref(), path, size).await {
                log::debug!("pack {path} was written, though its completion failed: {e}");
                return Ok(());
            }
            Err(e)
        }
        Err(e) => {
            let _ = object.abort().await;
            Err(e)
        }
    }
}

/// The size of each value of a blob column, from the column's inline
/// values and descriptors (stored form): a descriptor's length where the
/// row names one (no pack is read), the inline value's otherwise; NULL for
/// NULL.
pub fn sizes(inline: &dyn Array, descriptors: &StructArray) -> Int64Array {
    let lengths: &UInt64Array = descriptors.column(3).as_primitive();
    (0..inline.len())
        .map(|row| match descriptors.is_valid(row) {
            true => Some(lengths.value(row) as i64),
            false => binary_value(inline, row).map(|v| v.len() as i64),
        })
        .collect()
}

/// One blob value's bytes in the chunks the store delivers them in, as
/// [`crate::Table::read_blob`] returns it: a damaged value ends it with an
/// error.
pub type BlobStream = futures::stream::BoxStream<'static, Result<Bytes>>;

/// Row `row`'s value of blob column `blob` of `stored` (stored form, every
/// column) as the row holds it: `Ok(bytes)` if inline, `Err(descriptor)`
/// if packed; `None` if NULL.
pub fn stored_value(
    blob: &BlobColumn,
    stored: &RecordBatch,
    row: usize,
) -> Option<std::result::Result<Bytes, Descriptor>> {
    let descriptors = stored.column(blob.descriptor).as_struct();
    if let Some((_, d)) = Descriptors::of(descriptors).iter().find(|(r, _)| *r == row) {
        return Some(Err(d));
    }
    binary_value(stored.column(blob.index).as_ref(), row).map(|v| Ok(Bytes::copy_from_slice(v)))
}

/// Reads packed values back into the rows that name them.
#[derive(Debug, Clone)]
pub struct PackReader {
    store: Arc<dyn ObjectStore>,
    /// Shared, so that a reader counting for one read is a cheap copy.
    shard_dir: Arc<Path>,
    /// Where the bytes read are counted, if anywhere.
    bytes_read: Option<Count>,
}

impl PackReader {
    /// Reads the packs of the shard at `shard_dir`.
    pub fn new(store: Arc<dyn ObjectStore>, shard_dir: Path) -> Self {
        Self {
            store,
            shard_dir: Arc::new(shard_dir),
            bytes_read: None,
        }
    }

    /// This reader, counting the bytes it reads into `bytes_read` (an
    /// operator's metric, for `EXPLAIN ANALYZE`).
    pub fn counting(&self, bytes_read: &Count) -> Self {
        Self {
            bytes_read: Some(bytes_read.clone()),
            ..self.clone()
        }
    }

    /// `batch` (stored form projected to `columns`, ascending stored
    /// column indices) with the packed values of every blob column it
    /// holds together with its descriptors read back into the column:
    /// one ranged read per pack (neighbouring ranges coalesced by the
    /// store), none when no row names a pack. A value whose bytes do not
    /// match its descriptor's length and CRC-32 is an error.
    pub async fn resolve(
        &self,
        schema: &TableSchema,
        columns: &[usize],
        batch: RecordBatch,
    ) -> Result<RecordBatch> {
        self.resolve_except(schema, columns, batch, &[]).await
    }

    /// Like [`PackReader::resolve`], leaving the blob columns `except`
    /// (table column indices) as they are.
    pub async fn resolve_except(
        &self,
        schema: &TableSchema,
        columns: &[usize],
        batch: RecordBatch,
        except: &[usize],
    ) -> Result<RecordBatch> {
        let mut out: Option<Vec<ArrayRef>> = None;
        for blob in schema.blobs.iter().filter(|b| !except.contains(&b.index)) {
            let (Ok(at), Ok(descriptor_at)) = (
                columns.binary_search(&blob.index),
                columns.binary_search(&blob.descriptor),
            ) else {
                continue;
            };
            let descriptors = batch.column(descriptor_at).as_struct();
            if descriptors.null_count() == descriptors.len() {
                continue;
            }
            let values = self.read_values(batch.column(at), descriptors).await?;
            out.get_or_insert_with(|| batch.columns().to_vec())[at] = values;
        }
        match out {
            None => Ok(batch),
            Some(columns) => Ok(RecordBatch::try_new(batch.schema(), columns)?),
        }
    }

    /// The error of a failed read of `ranges` of the pack at `path`: a
    /// corrupt object if the pack is missing or shorter than the ranges,
    /// the store's error otherwise.
    async fn read_error(
        &self,
        path: &Path,
        ranges: &[Range<u64>],
        e: object_store::Error,
    ) -> Error {
        let corrupt = |reason: String| Error::Corrupt {
            path: path.to_string(),
            reason,
        };
        let missing = || corrupt(MISSING_PACK.into());
        if matches!(e, object_store::Error::NotFound { .. }) {
            return missing();
        }
        let end = ranges.iter().map(|r| r.end).max().unwrap_or(0);
        match self.store.head(path).await {
            Ok(meta) if meta.size < end => corrupt(format!(
                "the object holds {} bytes, its rows' packed values end at byte {end} (damaged, or cut short)",
                meta.size
            )),
            Err(object_store::Error::NotFound { .. }) => missing(),
            _ => e.into(),
        }
    }

    /// The packed values `wanted` names, each with the row it is for,
    /// checked against their length and CRC-32: one ranged read per pack
    /// (neighbouring ranges coalesced by the store). A damaged value is an
    /// error.
    async fn fetch(
        &self,
        wanted: impl IntoIterator<Item = (usize, Descriptor)>,
    ) -> Result<Vec<(usize, Bytes)>> {
        let values = self.fetch_each(wanted).await?.into_iter();
        values.map(|(row, value)| Ok((row, value?))).collect()
    }

    /// Like [`PackReader::fetch`], but a damaged value ([`Error::Corrupt`]:
    /// a missing or short pack, a checksum that fails) is that value's
    /// error alone; only a failed request fails the whole.
    async fn fetch_each(
        &self,
        wanted: impl IntoIterator<Item = (usize, Descriptor)>,
    ) -> Result<Vec<(usize, Result<Bytes>)>> {
        let mut by_pack: BTreeMap<(u64, u64), Vec<(usize, Descriptor)>> = BTreeMap::new();
        for (row, d) in wanted {
            by_pack.entry((d.pack, d.epoch)).or_default().push((row, d));
        }
        let reads = by_pack.into_iter().map(|((pack, epoch), rows)| {
            let path = pack_path(&self.shard_dir, pack, epoch);
            async move {
                let ranges: Vec<Range<u64>> = rows
                    .iter()
                    .map(|(_, d)| d.offset..d.offset + d.length)
                    .collect();
                let read = || async {
                    let values = match self.store.get_ranges(&path, &ranges).await {
                        Ok(values) => {
                            if let Some(counter) = &self.bytes_read {
                                counter.add(values.iter().map(Bytes::len).sum());
                            }
                            values
                        }
                        Err(e) => match self.read_error(&path, &ranges, e).await {
                            Error::Corrupt { path, reason } => {
                                let each = rows.iter().map(|&(row, _)| {
                                    let (path, reason) = (path.clone(), reason.clone());
                                    (row, Err(Error::Corrupt { path, reason }))
                                });
                                return Ok(each.collect());
                            }
                            e => return Err(e),
                        },
                    };
                    let checked = rows.iter().zip(values).map(|(&(row, d), value)| {
                        if value.len() as u64 == d.length && crc32fast::hash(&value) == d.crc32 {
                            return (row, Ok(value));
                        }
                        let reason = format!(
                            "the blob value at offset {} ({} bytes) does not match its checksum: damaged",
                            d.offset, d.length
                        );
                        let path = path.to_string();
                        (row, Err(Error::Corrupt { path, reason }))
                    });
                    Ok::<_, Error>(checked.collect::<Vec<_>>())
                };
                // Damaged values are read once more (see
                // `store::read_checked`): damage on the way reads right then.
                let first = read().await?;
                match first.iter().any(|(_, value)| value.is_err()) {
                    true => read().await,
                    false => Ok(first),
                }
            }
        });
        let fetched = futures::future::try_join_all(reads).await?;
        Ok(fetched.into_iter().flatten().collect())
    }

    /// The value `d` names, read in chunks as the store delivers them (one
    /// ranged GET; the value is never held whole). The stream ends with
    /// [`Error::Corrupt`] if the bytes do not match the value's length and
    /// CRC-32 (its chunks were then not the value).
    pub async fn stream(&self, d: Descriptor) -> Result<BlobStream> {
        use futures::StreamExt;
        let path = pack_path(&self.shard_dir, d.pack, d.epoch);
        let range = d.offset..d.offset + d.length;
        let options = object_store::GetOptions {
            range: Some(range.clone().into()),
            ..Default::default()
        };
        let chunks = match self.store.get_opts(&path, options).await {
            Ok(got) => got.into_stream(),
            Err(e) => return Err(self.read_error(&path, &[range], e).await),
        };
        let state = (chunks, crc32fast::Hasher::new(), 0u64);
        let stream = futures::stream::try_unfold(state, move |(mut chunks, mut crc, seen)| {
            let path = path.clone();
            async move {
                match chunks.next().await {
                    Some(chunk) => {
                        let chunk = chunk?;
                        crc.update(&chunk);
                        let seen = seen + chunk.len() as u64;
                        Ok(Some((chunk, (chunks, crc, seen))))
                    }
                    None if seen == d.length && crc.finalize() == d.crc32 => Ok(None),
                    None => Err(Error::Corrupt {
                        path: path.to_string(),
                        reason: format!(
                            "the blob value at offset {} ({} bytes) does not match its checksum: damaged",
                            d.offset, d.length
                        ),
                    }),
                }
            }
        });
        Ok(stream.boxed())
    }

    /// `inline` with each row that `descriptors` names replaced by its
    /// packed value.
    async fn read_values(&self, inline: &ArrayRef, descriptors: &StructArray) -> Result<ArrayRef> {
        let mut value_of: Vec<Option<Bytes>> = vec![None; descriptors.len()];
        for (row, value) in self.fetch(Descriptors::of(descriptors).iter()).await? {
            value_of[row] = Some(value);
        }
        // Built with 64-bit offsets: a batch's values may pass 2 GiB (a
        // column of 32-bit offsets then fails to cast, it does not wrap).
        let inline_values = cast(inline, &DataType::LargeBinary)?;
        let inline_values = inline_values.as_binary::<i64>();
        let mut values = LargeBinaryBuilder::new();
        for (row, packed) in value_of.iter().enumerate() {
            match packed {
                Some(value) => values.append_value(value),
                None => values.append_option(
                    inline_values
                        .is_valid(row)
                        .then(|| inline_values.value(row)),
                ),
            }
        }
        let values: ArrayRef = Arc::new(values.finish());
        Ok(cast(&values, inline.data_type())?)
    }
}

/// The ids of packs no WAL entry names — a compaction's copies (see
/// [`Repacker`]) and the packs of bulk loads' runs — have this bit set,
/// which no WAL position has; the rest is random (see [`unlogged_id`]),
/// so they never share a name.
pub const UNLOGGED: u64 = 1 << 63;

/// A fresh id for a pack no WAL entry names (see [`UNLOGGED`]).
pub fn unlogged_id() -> u64 {
    UNLOGGED | (rand::random::<u64>() >> 1)
}

/// The low bits of a [`load_pack_id`] that number the load's run.
const LOAD_RUN_BITS: u32 = 24;

/// The id of the pack of run `run` of bulk load `load` (one a shard):
/// unlogged (see [`UNLOGGED`]), with the load's [`load_tag`] above the
/// run's number, so that pack collection tells whose it is.
pub fn load_pack_id(load: u64, run: u64) -> u64 {
    UNLOGGED | (load_tag(load) << LOAD_RUN_BITS) | (run & ((1 << LOAD_RUN_BITS) - 1))
}

/// The bits of a load's id that the ids of its packs hold.
pub fn load_tag(load: u64) -> u64 {
    load & ((UNLOGGED - 1) >> LOAD_RUN_BITS)
}

/// The [`load_tag`] of the load whose pack has id `pack` (one of
/// [`load_pack_id`]).
pub fn load_tag_of_pack(pack: u64) -> u64 {
    (pack & !UNLOGGED) >> LOAD_RUN_BITS
}

/// How often a repacked pack's upload is tried before the compaction fails
/// (and is retried as a whole).
const REPACK_PUT_ATTEMPTS: u32 = 3;

/// Moves the values a compaction keeps of some packs (`moving`, by
/// `(epoch, pack)`: packs mostly dead) into new packs of the compacting
/// writer: a row naming a moving pack gets a descriptor of the copy
/// instead, and the old pack is left to pack collection once no SSTable
/// names it.
///
/// The copy streams through the client in bounded memory: values are
/// read at most `budget` bytes at a time and gathered into new packs of
/// at most `budget` bytes each (a single longer value gets a pack of its
/// own), each written once full, so a repack holds about twice `budget`
/// (plus one value) at a time. A new pack is written put-if-absent under
/// a fresh name; a retried upload that finds its own pack (same name, same
/// size) goes on. A value that is damaged (its checksum fails, its pack is
/// missing or short) is not moved: its row keeps naming the old pack.
#[derive(Debug)]
pub struct Repacker {
    reader: PackReader,
    epoch: u64,
    moving: BTreeSet<(u64, u64)>,
    budget: usize,
    /// The new pack being gathered: its id and bytes.
    current: Option<(u64, BytesMut)>,
    /// New packs written, and their bytes.
    pub packs_written: u64,
    /// See [`Repacker::packs_written`].
    pub bytes_written: u64,
}

impl Repacker {
    /// A repacker of the shard `reader` reads, writing as the writer of
    /// `epoch`.
    pub fn new(
        reader: PackReader,
        epoch: u64,
        moving: BTreeSet<(u64, u64)>,
        budget: usize,
    ) -> Self {
        Self {
            reader,
            epoch,
            moving,
            budget: budget.max(1),
            current: None,
            packs_written: 0,
            bytes_written: 0,
        }
    }

    /// `batch` (stored form, every column) with each row that names a
    /// moving pack naming its value's copy instead.
    pub async fn rewrite(
        &mut self,
        schema: &TableSchema,
        batch: RecordBatch,
    ) -> Result<RecordBatch> {
        let mut columns = batch.columns().to_vec();
        for blob in &schema.blobs {
            let descriptors = batch.column(blob.descriptor).as_struct();
            let d = Descriptors::of(descriptors);
            let moving: Vec<(usize, Descriptor)> = d
                .iter()
                .filter(|(_, d)| self.moving.contains(&(d.epoch, d.pack)))
                .collect();
            if moving.is_empty() {
                continue;
            }
            let mut packs = d.pack.values().to_vec();
            let mut epochs = d.epoch.values().to_vec();
            let mut offsets = d.offset.values().to_vec();
            let mut start = 0;
            while start < moving.len() {
                // At most `budget` bytes read at a time (one value more if
                // it alone is longer).
                let (mut end, mut bytes) = (start, 0);
                while end < moving.len()
                    && (end == start || bytes + moving[end].1.length <= self.budget as u64)
                {
                    bytes += moving[end].1.length;
                    end += 1;
                }
                let values = self.reader.fetch_each(moving[start..end].iter().copied());
                for (row, value) in values.await? {
                    match value {
                        Ok(value) => {
                            let (pack, offset) = self.append(&value).await?;
                            (packs[row], epochs[row], offsets[row]) = (pack, self.epoch, offset);
                        }
                        // A damaged value stays where it is (its old pack
                        // then stays too): it reads as the error it is, and
                        // the compaction goes on.
                        Err(e) => log::warn!("a repack leaves a damaged blob value in place: {e}"),
                    }
                }
                start = end;
            }
            columns[blob.descriptor] = Arc::new(StructArray::try_new(
                blob_descriptor_fields(),
                vec![
                    Arc::new(UInt64Array::from(packs)),
                    Arc::new(UInt64Array::from(epochs)),
                    Arc::new(UInt64Array::from(offsets)),
                    Arc::new(d.length.clone()),
                    Arc::new(d.crc32.clone()),
                ],
                descriptors.nulls().cloned(),
            )?);
        }
        Ok(RecordBatch::try_new(batch.schema(), columns)?)
    }

    /// Writes the pack being gathered, if any: call once every batch is
    /// rewritten, before anything names the copies.
    pub async fn finish(&mut self) -> Result<()> {
        self.write_current().await
    }

    /// Appends `value` to the pack being gathered (writing that one first
    /// if `value` would take it past the budget); the pack and offset of
    /// the copy.
    async fn append(&mut self, value: &[u8]) -> Result<(u64, u64)> {
        let full = |(_, b): &(u64, BytesMut)| !b.is_empty() && b.len() + value.len() > self.budget;
        if self.current.as_ref().is_some_and(full) {
            self.write_current().await?;
        }
        let (id, bytes) = self
            .current
            .get_or_insert_with(|| (unlogged_id(), BytesMut::new()));
        let offset = bytes.len() as u64;
        bytes.extend_from_slice(value);
        Ok((*id, offset))
    }

    async fn write_current(&mut self) -> Result<()> {
        let Some((id, bytes)) = self.current.take() else {
            return Ok(());
        };
        let path = paths::blob_pack(&self.reader.shard_dir, id, self.epoch);
        let bytes = bytes.freeze();
        let store = &self.reader.store;
        let mut attempt = 1;
        loop {
            let put = store
                .put_opts(&path, bytes.clone().into(), PutMode::Create.into())
                .await;
            match put {
                Ok(_) => break,
                // An attempt whose outcome was unknown landed: the name is
                // this repack's alone, so the same size is the same bytes.
                Err(object_store::Error::AlreadyExists { .. })
                    if store.head(&path).await?.size == bytes.len() as u64 =>
                {
                    break;
                }
                Err(e) if attempt < REPACK_PUT_ATTEMPTS => {
                    log::debug!("retrying repacked blob pack {path}: {e}");
                    tokio::time::sleep(std::time::Duration::from_millis(50 << attempt)).await;
                    attempt += 1;
                }
                Err(e) => return Err(e.into()),
            }
        }
        self.packs_written += 1;
        self.bytes_written += bytes.len() as u64;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use datafusion::arrow::array::{BinaryArray, Int64Array};
    use datafusion::arrow::datatypes::{Field, Schema};
    use object_store::memory::InMemory;
    use object_store::{ObjectStoreExt, PutPayload};

    use super::*;
    use crate::schema::TableMeta;

    #[test]
    fn a_load_pack_names_its_load_and_run() {
        for load in [0, 1, 0xabc, u64::MAX, rand::random()] {
            let ids: Vec<u64> = (1..4).map(|run| load_pack_id(load, run)).collect();
            for &id in &ids {
                assert_ne!(id & UNLOGGED, 0);
                assert_eq!(load_tag_of_pack(id), load_tag(load));
            }
            assert!(ids.windows(2).all(|w| w[0] != w[1]), "{ids:x?}");
        }
        assert_ne!(load_tag(0xabc), load_tag(0xabd));
    }

    fn table() -> TableSchema {
        let schema = Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("raw", DataType::Binary, true),
        ]);
        let options = [("raw.blob".to_string(), "true".to_string())];
        TableSchema::new(&TableMeta::new(&schema, vec!["id".into()], &options).unwrap())
    }

    fn rows(t: &TableSchema, values: Vec<Option<&[u8]>>) -> RecordBatch {
        let ids = Int64Array::from_iter_values(0..values.len() as i64);
        let user = RecordBatch::try_new(
            Arc::clone(&t.schema),
            vec![Arc::new(ids), Arc::new(BinaryArray::from(values))],
        )
        .unwrap();
        t.to_stored(&user).unwrap()
    }

    #[test]
    fn only_values_longer_than_the_limit_move_into_the_pack_in_order() {
        let t = table();
        let (long, longer) = (vec![7u8; 5], vec![9u8; 8]);
        let batches = [
            rows(&t, vec![Some(b"abc"), Some(&long), None]),
            rows(&t, vec![Some(b""), Some(&longer)]),
        ];
        let packed = pack(&t, &batches, 12, 3, 4).unwrap().unwrap();
        assert_eq!(
            Bytes::from(packed.bytes.clone()),
            [long.clone(), longer.clone()].concat()
        );
        // Shared with the batches, not copied: one slice of each batch's
        // value buffer.
        assert_eq!(packed.bytes.iter().count(), 2);
        let blob = t.blobs[0];
        let batches = packed.into_batches().unwrap();
        let descriptors: Vec<_> = batches
            .iter()
            .flat_map(|b| {
                let d = b.column(blob.descriptor).as_struct();
                let at = |i: usize| {
                    d.column(i)
                        .as_primitive::<datafusion::arrow::datatypes::UInt64Type>()
                        .clone()
                };
                let (pack, epoch, offset, length) = (at(0), at(1), at(2), at(3));
                (0..b.num_rows())
                    .map(|r| {
                        d.is_valid(r).then(|| {
                            (
                                pack.value(r),
                                epoch.value(r),
                                offset.value(r),
                                length.value(r),
                            )
                        })
                    })
                    .collect::<Vec<_>>()
            })
            .collect();
        assert_eq!(
            descriptors,
            [None, Some((12, 3, 0, 5)), None, None, Some((12, 3, 5, 8))]
        );
        let inline: Vec<Option<Vec<u8>>> = batches
            .iter()
            .flat_map(|b| {
                let c = b.column(blob.index).as_binary::<i32>();
                (0..c.len())
                    .map(|r| c.is_valid(r).then(|| c.value(r).to_vec()))
                    .collect::<Vec<_>>()
            })
            .collect();
        assert_eq!(
            inline,
            [Some(b"abc".to_vec()), None, None, Some(vec![]), None]
        );
        // Nothing long: no pack.
        assert!(pack(&t, &batches[..1], 1, 1, 5).unwrap().is_none());
    }

    #[test]
    fn named_packs_are_kept_as_runs_of_consecutive_positions_per_epoch() {
        let named = Named::from([(1, 3), (1, 4), (1, 6), (2, 7), (2, 8)].map(|p| (p, 10)));
        let runs = runs(&named);
        let as_arrays: Vec<[u64; 3]> = runs.iter().map(|&r| r.into()).collect();
        assert_eq!(as_arrays, [[1, 3, 4], [1, 6, 6], [2, 7, 8]]);
        for &(epoch, position) in named.keys() {
            assert!(runs.iter().any(|r| r.contains(epoch, position)));
        }
        assert!(!runs.iter().any(|r| r.contains(1, 5) || r.contains(2, 6)));
        assert_eq!(serde_json::to_string(&runs[0]).unwrap(), "[1,3,4]");
        assert_eq!(
            paths::parse_blob_pack(
                paths::blob_pack(&Path::from("s"), 12, 3)
                    .filename()
                    .unwrap()
            ),
            Some((12, 3))
        );
    }

    #[tokio::test]
    async fn resolving_reads_the_values_back_and_refuses_a_damaged_one() {
        let t = table();
        let values = [vec![1u8; 10], vec![2u8; 20]];
        let batch = rows(&t, vec![Some(&values[0]), Some(b"x"), Some(&values[1])]);
        let packed = pack(&t, std::slice::from_ref(&batch), 4, 2, 4)
            .unwrap()
            .unwrap();
        let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        let dir = Path::from("shard");
        let path = paths::blob_pack(&dir, 4, 2);
        let bytes = packed.bytes.clone();
        let packed = packed.into_batches().unwrap().remove(0);
        store.put(&path, bytes.clone()).await.unwrap();
        let reader = PackReader::new(Arc::clone(&store), dir);
        let every: Vec<usize> = (0..t.stored.fields().len()).collect();
        let resolved = reader.resolve(&t, &every, packed.clone()).await.unwrap();
        assert_eq!(t.to_user(&resolved).unwrap(), t.to_user(&batch).unwrap());

        let mut damaged = Bytes::from(bytes).to_vec();
        damaged[15] ^= 0x40;
        store.put(&path, PutPayload::from(damaged)).await.unwrap();
        let err = reader
            .resolve(&t, &every, packed.clone())
            .await
            .unwrap_err();
        assert!(matches!(err, Error::Corrupt { .. }), "{err}");
    }
}
