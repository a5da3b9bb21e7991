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
//! `pack` by the writer of `epoch` (see [`paths::blob_pack`]), whose CRC-32
//! is `crc32`. A pack is raw bytes: the values one after another.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Range;
use std::sync::Arc;

use bytes::Bytes;
use datafusion::arrow::array::{
    Array, ArrayRef, AsArray, LargeBinaryBuilder, RecordBatch, StructArray, UInt32Array,
    UInt64Array,
};
use datafusion::arrow::buffer::{Buffer, NullBuffer};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::DataType;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::schema::{TableSchema, blob_descriptor_fields};
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
    /// Whether the pack at `position` of `epoch` is in this run.
    pub fn contains(&self, epoch: u64, position: u64) -> bool {
        self.epoch == epoch && (self.first..=self.last).contains(&position)
    }
}

/// Adds to `named` the `(epoch, position)` of every pack a row of `batch`
/// (stored form) names.
pub fn collect_named(schema: &TableSchema, batch: &RecordBatch, named: &mut BTreeSet<(u64, u64)>) {
    for blob in &schema.blobs {
        let descriptors = batch.column(blob.descriptor).as_struct();
        if descriptors.null_count() == descriptors.len() {
            continue;
        }
        let packs: &UInt64Array = descriptors.column(0).as_primitive();
        let epochs: &UInt64Array = descriptors.column(1).as_primitive();
        for row in (0..descriptors.len()).filter(|&r| descriptors.is_valid(r)) {
            named.insert((epochs.value(row), packs.value(row)));
        }
    }
}

/// `named` (as [`collect_named`] gathers it) as runs of consecutive
/// positions.
pub fn runs(named: &BTreeSet<(u64, u64)>) -> Vec<PackRun> {
    let mut out: Vec<PackRun> = Vec::new();
    for &(epoch, position) in named {
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
    /// The batches with descriptors in place of the moved values.
    pub batches: Vec<RecordBatch>,
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
    let mut out = Vec::with_capacity(batches.len());
    for batch in batches {
        let mut columns = batch.columns().to_vec();
        for blob in &schema.blobs {
            let values = batch.column(blob.index);
            let value = |row: usize| binary_value(values.as_ref(), row);
            let long = |row: usize| value(row).is_some_and(|v| v.len() > inline_limit);
            if !(0..values.len()).any(long) {
                continue;
            }
            let buffers = values.to_data().buffers().to_vec();
            let rows = values.len();
            let (mut offsets, mut lengths, mut crcs) = (
                Vec::with_capacity(rows),
                Vec::with_capacity(rows),
                Vec::with_capacity(rows),
            );
            let mut inline = LargeBinaryBuilder::new();
            let mut packed = Vec::with_capacity(rows);
            for row in 0..rows {
                match value(row) {
                    Some(v) if v.len() > inline_limit => {
                        offsets.push(bytes.len);
                        lengths.push(v.len() as u64);
                        crcs.push(crc32fast::hash(v));
                        bytes.push(&buffers, v);
                        inline.append_null();
                        packed.push(true);
                    }
                    v => {
                        offsets.push(0);
                        lengths.push(0);
                        crcs.push(0);
                        inline.append_option(v);
                        packed.push(false);
                    }
                }
            }
            let descriptors = StructArray::try_new(
                blob_descriptor_fields(),
                vec![
                    Arc::new(UInt64Array::from(vec![pack; rows])),
                    Arc::new(UInt64Array::from(vec![epoch; rows])),
                    Arc::new(UInt64Array::from(offsets)),
                    Arc::new(UInt64Array::from(lengths)),
                    Arc::new(UInt32Array::from(crcs)),
                ],
                Some(NullBuffer::from(packed)),
            )?;
            let inline: ArrayRef = Arc::new(inline.finish());
            columns[blob.index] = cast(&inline, values.data_type())?;
            columns[blob.descriptor] = Arc::new(descriptors);
        }
        out.push(RecordBatch::try_new(batch.schema(), columns)?);
    }
    if bytes.len == 0 {
        return Ok(None);
    }
    Ok(Some(Packed {
        bytes: bytes.finish(),
        batches: out,
    }))
}

/// The byte ranges read from one pack, and the row each is for.
type Wanted = (Vec<Range<u64>>, Vec<usize>);

/// Parts of a pack's multipart upload: a pack up to this size is one PUT,
/// a larger one uploads in parts of this size (S3's floor is 5 MiB), so no
/// request carries more than this.
pub const PACK_PART_BYTES: usize = 16 << 20;

/// Writes `bytes` as the pack at `path`: one PUT, or a multipart upload
/// above [`PACK_PART_BYTES`] that is aborted (its parts deleted) when a
/// part fails.
pub async fn put_pack(store: &Arc<dyn ObjectStore>, path: &Path, bytes: PutPayload) -> Result<()> {
    use tokio::io::AsyncWriteExt;
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
    let result = written.await;
    if result.is_err() && !completing {
        // A failed completion cleans up its own parts.
        let _ = object.abort().await;
    }
    result
}

/// Reads packed values back into the rows that name them.
#[derive(Debug, Clone)]
pub struct PackReader {
    store: Arc<dyn ObjectStore>,
    shard_dir: Path,
}

impl PackReader {
    /// Reads the packs of the shard at `shard_dir`.
    pub fn new(store: Arc<dyn ObjectStore>, shard_dir: Path) -> Self {
        Self { store, shard_dir }
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
        let mut out: Option<Vec<ArrayRef>> = None;
        for blob in &schema.blobs {
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
        let missing = || corrupt("a row names a blob pack that does not exist".into());
        if matches!(e, object_store::Error::NotFound { .. }) {
            return missing();
        }
        let end = ranges.iter().map(|r| r.end).max().unwrap_or(0);
        match self.store.head(path).await {
            Ok(meta) if meta.size < end => corrupt(format!(
                "the pack holds {} bytes, its rows name bytes up to {end}",
                meta.size
            )),
            Err(object_store::Error::NotFound { .. }) => missing(),
            _ => e.into(),
        }
    }

    /// `inline` with each row that `descriptors` names replaced by its
    /// packed value.
    async fn read_values(&self, inline: &ArrayRef, descriptors: &StructArray) -> Result<ArrayRef> {
        let field = |i: usize| descriptors.column(i).as_primitive();
        let (packs, epochs, offsets, lengths): (
            &UInt64Array,
            &UInt64Array,
            &UInt64Array,
            &UInt64Array,
        ) = (field(0), field(1), field(2), field(3));
        let crcs: &UInt32Array = descriptors.column(4).as_primitive();
        // Each pack's ranges, and the row each range is for.
        let mut wanted: BTreeMap<(u64, u64), Wanted> = BTreeMap::new();
        for row in (0..descriptors.len()).filter(|&r| descriptors.is_valid(r)) {
            let (offset, length) = (offsets.value(row), lengths.value(row));
            let entry = wanted
                .entry((packs.value(row), epochs.value(row)))
                .or_default();
            entry.0.push(offset..offset + length);
            entry.1.push(row);
        }
        let reads = wanted.into_iter().map(|((pack, epoch), (ranges, rows))| {
            let path = paths::blob_pack(&self.shard_dir, pack, epoch);
            async move {
                let values = match self.store.get_ranges(&path, &ranges).await {
                    Ok(values) => values,
                    Err(e) => return Err(self.read_error(&path, &ranges, e).await),
                };
                Ok::<_, Error>((path, rows, values))
            }
        });
        let mut value_of: Vec<Option<Bytes>> = vec![None; descriptors.len()];
        for (path, rows, values) in futures::future::try_join_all(reads).await? {
            for (row, value) in rows.into_iter().zip(values) {
                if value.len() as u64 != lengths.value(row)
                    || crc32fast::hash(&value) != crcs.value(row)
                {
                    return Err(Error::Corrupt {
                        path: path.to_string(),
                        reason: format!(
                            "the blob value at offset {} ({} bytes) does not match its checksum",
                            offsets.value(row),
                            lengths.value(row)
                        ),
                    });
                }
                value_of[row] = Some(value);
            }
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

#[cfg(test)]
mod tests {
    use datafusion::arrow::array::{BinaryArray, Int64Array};
    use datafusion::arrow::datatypes::{Field, Schema};
    use object_store::memory::InMemory;
    use object_store::{ObjectStoreExt, PutPayload};

    use super::*;
    use crate::schema::TableMeta;

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
        let descriptors: Vec<_> = packed
            .batches
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
        let inline: Vec<Option<Vec<u8>>> = packed
            .batches
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
        let named = BTreeSet::from([(1, 3), (1, 4), (1, 6), (2, 7), (2, 8)]);
        let runs = runs(&named);
        let as_arrays: Vec<[u64; 3]> = runs.iter().map(|&r| r.into()).collect();
        assert_eq!(as_arrays, [[1, 3, 4], [1, 6, 6], [2, 7, 8]]);
        for &(epoch, position) in &named {
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
        store.put(&path, packed.bytes.clone()).await.unwrap();
        let reader = PackReader::new(Arc::clone(&store), dir);
        let every: Vec<usize> = (0..t.stored.fields().len()).collect();
        let resolved = reader
            .resolve(&t, &every, packed.batches[0].clone())
            .await
            .unwrap();
        assert_eq!(t.to_user(&resolved).unwrap(), t.to_user(&batch).unwrap());

        let mut damaged = Bytes::from(packed.bytes.clone()).to_vec();
        damaged[15] ^= 0x40;
        store.put(&path, PutPayload::from(damaged)).await.unwrap();
        let err = reader
            .resolve(&t, &every, packed.batches[0].clone())
            .await
            .unwrap_err();
        assert!(matches!(err, Error::Corrupt { .. }), "{err}");
    }
}
