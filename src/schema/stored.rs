//! [`TableSchema`]: a table's user schema, the stored form of its rows, and
//! the checks a batch must pass before anything is written.

use std::collections::HashSet;
use std::sync::Arc;

use datafusion::arrow::array::{
    Array, ArrayData, ArrayRef, AsArray, BooleanArray, RecordBatch, UInt32Array, new_null_array,
};
use datafusion::arrow::compute::take_record_batch;
use datafusion::arrow::datatypes::{DataType, Float32Type, SchemaRef};
use datafusion::arrow::row::{RowConverter, Rows, SortField};

use datafusion::arrow::datatypes::{Field, Fields, Schema};

use super::{HnswParams, Metric, TableMeta, key};
use crate::error::{Error, Result};

/// The column marking deleted keys in stored rows (true: tombstone).
pub const TOMBSTONE_COLUMN: &str = "_tombstone";

/// One stored batch of a put with each row's key encoding (`None` for an
/// append-only table).
pub type KeyedBatch = (RecordBatch, Option<Vec<Box<[u8]>>>);

/// The schema of stored rows (MemTable batches, WAL data entries): the
/// table's columns, all nullable (a tombstone carries only its key), then
/// the descriptors of the blob columns `blobs` (see [`crate::blob`]), then
/// [`TOMBSTONE_COLUMN`].
pub fn stored_schema(table: &Schema, blobs: &[usize]) -> SchemaRef {
    let mut fields: Vec<Arc<Field>> = table
        .fields()
        .iter()
        .map(|f| Arc::new(f.as_ref().clone().with_nullable(true)))
        .collect();
    for &b in blobs {
        fields.push(Arc::new(blob_descriptor_field(table.field(b).name())));
    }
    fields.push(Arc::new(Field::new(
        TOMBSTONE_COLUMN,
        DataType::Boolean,
        false,
    )));
    Arc::new(Schema::new(fields))
}

/// The fields of a blob descriptor (see [`crate::blob`]), in order.
pub fn blob_descriptor_fields() -> Fields {
    Fields::from(vec![
        Field::new("pack", DataType::UInt64, false),
        Field::new("epoch", DataType::UInt64, false),
        Field::new("offset", DataType::UInt64, false),
        Field::new("length", DataType::UInt64, false),
        Field::new("crc32", DataType::UInt32, false),
    ])
}

/// The stored field `_blob_<column>` of the descriptors of blob column
/// `column` (NULL: the value is inline).
pub fn blob_descriptor_field(column: &str) -> Field {
    Field::new(
        format!("_blob_{column}"),
        DataType::Struct(blob_descriptor_fields()),
        true,
    )
}

/// What the write and read paths need to know about one table's rows.
///
/// Stored rows (MemTable batches, WAL entries) have the table's columns,
/// every one nullable (a tombstone carries only its key), the descriptors
/// of its blob columns, and [`TOMBSTONE_COLUMN`] last.
#[derive(Debug)]
pub struct TableSchema {
    /// The table's schema as users see it.
    pub schema: SchemaRef,
    /// The schema of stored rows.
    pub stored: SchemaRef,
    /// Indices of the primary-key columns, in key order (empty: append-only).
    pub key: Vec<usize>,
    /// `(column index, dimension)` of every vector column.
    pub vectors: Vec<VectorColumn>,
    /// Number of shards rows are routed to.
    pub shards: u32,
    /// The blob columns (see [`crate::blob`]).
    pub blobs: Vec<BlobColumn>,
}

/// A binary column whose long values are stored in packs.
#[derive(Debug, Clone, Copy)]
pub struct BlobColumn {
    /// Column index in the table schema (and in the stored form).
    pub index: usize,
    /// Stored index of its descriptors.
    pub descriptor: usize,
}

/// A `FLOAT[dim]` column and how its MemTable graph is built.
#[derive(Debug, Clone)]
pub struct VectorColumn {
    /// Column index in the table schema.
    pub index: usize,
    pub dim: i32,
    pub metric: Metric,
    pub params: HnswParams,
}

impl TableSchema {
    /// The schema of a table described by `meta`.
    pub fn new(meta: &TableMeta) -> Self {
        let schema = meta.schema_ref();
        let vectors = meta
            .columns()
            .iter()
            .filter_map(|(name, options)| {
                let vector = options.vector.as_ref()?;
                Some(VectorColumn {
                    index: schema.index_of(name).ok()?,
                    dim: vector.dim,
                    metric: vector.metric,
                    params: vector.hnsw,
                })
            })
            .collect();
        let mut blob_indices: Vec<usize> = meta
            .columns()
            .iter()
            .filter(|(_, options)| options.blob)
            .filter_map(|(name, _)| schema.index_of(name).ok())
            .collect();
        blob_indices.sort_unstable();
        let blobs = blob_indices
            .iter()
            .enumerate()
            .map(|(i, &index)| BlobColumn {
                index,
                descriptor: schema.fields().len() + i,
            })
            .collect();
        Self {
            stored: stored_schema(&schema, &blob_indices),
            blobs,
            key: meta.primary_key_indices(),
            vectors,
            shards: meta.shards(),
            schema,
        }
    }

    /// Whether the table has a primary key (otherwise it is append-only).
    pub fn has_key(&self) -> bool {
        !self.key.is_empty()
    }

    /// Checks `batch` against the table (column names and types, no NULL in
    /// a NOT NULL column, vectors finite, at least one row) and returns it in
    /// stored form. Nothing is written when this fails.
    pub fn to_stored(&self, batch: &RecordBatch) -> Result<RecordBatch> {
        self.to_stored_at(batch, 0)
    }

    /// [`TableSchema::to_stored`] for a batch that follows `rows_before`
    /// rows of the same write: errors number rows from the write's first
    /// (1-based).
    pub fn to_stored_at(&self, batch: &RecordBatch, rows_before: usize) -> Result<RecordBatch> {
        if batch.num_rows() == 0 {
            return Err(Error::invalid("a put needs at least one row"));
        }
        self.check_columns(batch, &self.schema.fields().iter().collect::<Vec<_>>())?;
        for (field, column) in self.schema.fields().iter().zip(batch.columns()) {
            if !field.is_nullable() && column.null_count() > 0 {
                let what = if self
                    .key
                    .iter()
                    .any(|&k| self.schema.field(k).name() == field.name())
                {
                    "primary key column"
                } else {
                    "NOT NULL column"
                };
                return Err(Error::invalid(format!(
                    "{what} '{}' holds NULL",
                    field.name()
                )));
            }
        }
        for v in &self.vectors {
            check_vectors(
                self.schema.field(v.index).name(),
                batch.column(v.index),
                v.dim,
                rows_before,
            )?;
        }
        let mut columns = batch.columns().to_vec();
        self.push_inline_descriptors(&mut columns, batch.num_rows());
        columns.push(Arc::new(BooleanArray::from(vec![false; batch.num_rows()])));
        Ok(RecordBatch::try_new(Arc::clone(&self.stored), columns)?)
    }

    /// Turns `keys` (exactly the key columns, in key order) into stored
    /// tombstone rows.
    pub fn tombstones(&self, keys: &RecordBatch) -> Result<RecordBatch> {
        if !self.has_key() {
            return Err(Error::invalid(
                "the table has no primary key: rows cannot be deleted by key",
            ));
        }
        if keys.num_rows() == 0 {
            return Err(Error::invalid("a delete needs at least one key"));
        }
        let fields: Vec<_> = self.key.iter().map(|&k| &self.schema.fields()[k]).collect();
        self.check_columns(keys, &fields)?;
        let rows = keys.num_rows();
        let mut columns: Vec<ArrayRef> = self
            .schema
            .fields()
            .iter()
            .map(|f| new_null_array(f.data_type(), rows))
            .collect();
        for (column, &k) in keys.columns().iter().zip(&self.key) {
            if column.null_count() > 0 {
                return Err(Error::invalid(format!(
                    "primary key column '{}' holds NULL",
                    self.schema.field(k).name()
                )));
            }
            columns[k] = Arc::clone(column);
        }
        self.push_inline_descriptors(&mut columns, rows);
        columns.push(Arc::new(BooleanArray::from(vec![true; rows])));
        Ok(RecordBatch::try_new(Arc::clone(&self.stored), columns)?)
    }

    /// The key columns of a batch (stored or user form).
    pub fn key_columns(&self, stored: &RecordBatch) -> Vec<ArrayRef> {
        self.key
            .iter()
            .map(|&k| Arc::clone(stored.column(k)))
            .collect()
    }

    /// The keys of a batch's rows (stored or user form) in Arrow's row
    /// format: rows compare as their keys sort (the SSTable order).
    pub fn key_rows(&self, stored: &RecordBatch) -> Result<Rows> {
        Ok(self
            .key_converter()?
            .convert_columns(&self.key_columns(stored))?)
    }

    /// Converts key columns (in key order) to Arrow's row format, whose
    /// rows compare as their keys sort.
    pub fn key_converter(&self) -> Result<RowConverter> {
        let fields = self
            .key
            .iter()
            .map(|&k| SortField::new(self.schema.field(k).data_type().clone()))
            .collect();
        Ok(RowConverter::new(fields)?)
    }

    /// The canonical key encoding of each row of a batch (stored or user
    /// form).
    pub fn encode_keys(&self, stored: &RecordBatch) -> Result<Vec<Box<[u8]>>> {
        key::encode_keys(&self.key_columns(stored), stored.num_rows())
    }

    /// A stored batch with its rows' key encodings, as the MemTable takes
    /// it (`None` for an append-only table). The batch is copied if it keeps
    /// far more memory alive than its rows take (see `compacted`).
    pub fn keyed(&self, stored: RecordBatch) -> Result<KeyedBatch> {
        let stored = compacted(stored)?;
        let keys = if self.has_key() {
            Some(self.encode_keys(&stored)?)
        } else {
            None
        };
        Ok((stored, keys))
    }

    /// The tombstone flags of a stored batch.
    pub fn tombstone_flags<'a>(&self, stored: &'a RecordBatch) -> &'a BooleanArray {
        stored.column(stored.num_columns() - 1).as_boolean()
    }

    /// Rows of stored batch `stored` as user rows (drops the descriptors
    /// and the tombstone column; the rows must be live, and their blob
    /// values read back, see [`crate::blob::PackReader::resolve`]).
    pub fn to_user(&self, stored: &RecordBatch) -> Result<RecordBatch> {
        let columns = stored.columns()[..self.schema.fields().len()].to_vec();
        Ok(RecordBatch::try_new(Arc::clone(&self.schema), columns)?)
    }

    /// Appends to `columns` (a batch's user columns) a NULL descriptor of
    /// each blob column for each of `rows`: every value inline.
    fn push_inline_descriptors(&self, columns: &mut Vec<ArrayRef>, rows: usize) {
        for blob in &self.blobs {
            columns.push(new_null_array(
                self.stored.field(blob.descriptor).data_type(),
                rows,
            ));
        }
    }

    fn check_columns(
        &self,
        batch: &RecordBatch,
        expected: &[&Arc<datafusion::arrow::datatypes::Field>],
    ) -> Result<()> {
        let got = batch.schema();
        let matches = got.fields().len() == expected.len()
            && got
                .fields()
                .iter()
                .zip(expected)
                .all(|(g, e)| g.name() == e.name() && g.data_type() == e.data_type());
        if matches {
            return Ok(());
        }
        let describe = |fields: Vec<(&String, &DataType)>| {
            fields
                .iter()
                .map(|(n, t)| format!("{n} {t}"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let missing: Vec<&str> = expected
            .iter()
            .filter(|e| got.field_with_name(e.name()).is_err())
            .map(|e| e.name().as_str())
            .collect();
        let unknown: Vec<&str> = got
            .fields()
            .iter()
            .filter(|g| !expected.iter().any(|e| e.name() == g.name()))
            .map(|g| g.name().as_str())
            .collect();
        let retyped: Vec<String> = got
            .fields()
            .iter()
            .filter_map(|g| {
                let e = expected.iter().find(|e| e.name() == g.name())?;
                (e.data_type() != g.data_type())
                    .then(|| format!("{} is {}, not {}", g.name(), g.data_type(), e.data_type()))
            })
            .collect();
        let mut why = retyped;
        if !missing.is_empty() {
            why.push(format!("missing {}", missing.join(", ")));
        }
        if !unknown.is_empty() {
            why.push(format!("not in the table: {}", unknown.join(", ")));
        }
        // The batch's own columns only when what differs is their order
        // (a caller may have added some: they would read as given).
        let given = match why.is_empty() {
            true => {
                why.push("the order differs".to_string());
                let fields = got.fields().iter();
                format!(
                    " ({})",
                    describe(fields.map(|f| (f.name(), f.data_type())).collect())
                )
            }
            false => String::new(),
        };
        Err(Error::invalid(format!(
            "the batch's columns{given} do not match the table's ({}): {}",
            describe(expected.iter().map(|f| (f.name(), f.data_type())).collect()),
            why.join("; "),
        )))
    }
}

/// Every non-null vector of `column` must have `dim` finite, non-null
/// values. A NULL vector (the row has none) is fine: it is stored, not
/// indexed, and never found by a search. Errors number rows from 1 after
/// `rows_before`.
fn check_vectors(name: &str, column: &ArrayRef, dim: i32, rows_before: usize) -> Result<()> {
    let DataType::FixedSizeList(_, got) = column.data_type() else {
        return Err(Error::invalid(format!(
            "vector column '{name}' is not FLOAT[{dim}]"
        )));
    };
    if *got != dim {
        return Err(Error::invalid(format!(
            "vector column '{name}' expects dimension {dim}, got {got}"
        )));
    }
    let list = column.as_fixed_size_list();
    let values = list.values().as_primitive::<Float32Type>();
    let width = dim as usize;
    for row in 0..list.len() {
        if list.is_null(row) {
            continue;
        }
        let start = list.value_offset(row) as usize;
        let number = rows_before + row + 1;
        if let Some(nulls) = values.nulls()
            && let Some(at) = (0..width).find(|&i| nulls.is_null(start + i))
        {
            return Err(Error::invalid(format!(
                "vector column '{name}' holds NULL at element {} of {dim} in row {number} \
                 (a vector is all numbers, or NULL as a whole)",
                at + 1
            )));
        }
        if let Some(fault) = super::vector_fault(&values.values()[start..start + width]) {
            return Err(Error::invalid(format!(
                "vector column '{name}' holds {fault} in row {number}"
            )));
        }
    }
    Ok(())
}

/// Bytes of memory `batch` keeps alive: the capacity of every buffer it
/// references, a buffer several columns share (the columns of one decoded
/// WAL entry share one) counted once. What a MemTable counts its batches
/// by.
pub fn held_bytes(batch: &RecordBatch) -> usize {
    fn add(data: &ArrayData, seen: &mut HashSet<usize>, total: &mut usize) {
        let nulls = data.nulls().map(|n| n.buffer());
        for buffer in data.buffers().iter().chain(nulls) {
            if seen.insert(buffer.data_ptr().as_ptr() as usize) {
                *total += buffer.capacity();
            }
        }
        for child in data.child_data() {
            add(child, seen, total);
        }
    }
    let (mut seen, mut total) = (HashSet::new(), 0);
    for column in batch.columns() {
        add(&column.to_data(), &mut seen, &mut total);
    }
    total
}

/// Memory a batch may keep alive beyond twice what its rows take before
/// [`compacted`] copies it: less than a one-row WAL entry decoded in
/// replay keeps (its buffers padded for alignment), so those are copied
/// too and a replayed MemTable holds about what the live one did.
const SLACK_BYTES: usize = 512;

/// Bytes the rows of `column` take: its slice of each buffer, and for a
/// string or binary view column the views and the bytes they name out of
/// line. `None` if Arrow cannot say (the column is then never copied).
fn used_bytes(column: &ArrayRef) -> Option<usize> {
    let nulls = column.nulls().map_or(0, |n| n.len().div_ceil(8));
    match column.data_type() {
        DataType::Utf8View => {
            let views = column.as_string_view();
            Some(16 * views.len() + views.total_buffer_bytes_used() + nulls)
        }
        DataType::BinaryView => {
            let views = column.as_binary_view();
            Some(16 * views.len() + views.total_buffer_bytes_used() + nulls)
        }
        _ => column.to_data().get_slice_memory_size().ok(),
    }
}

/// `batch` as it is, or its rows copied into buffers of their own when it
/// keeps far more memory alive than they take (a few rows sliced out of a
/// larger batch, as a DELETE's keys are out of the scan's): a MemTable
/// holding it then holds what it counts, not a whole scanned batch per
/// deleted row.
fn compacted(batch: RecordBatch) -> Result<RecordBatch> {
    let used: Option<usize> = batch.columns().iter().map(used_bytes).sum();
    if used.is_none_or(|used| held_bytes(&batch) <= 2 * used + SLACK_BYTES) {
        return Ok(batch);
    }
    let all = UInt32Array::from_iter_values(0..batch.num_rows() as u32);
    // A take copies views but shares the bytes they name.
    compact_views(take_record_batch(&batch, &all)?)
}

/// Row `row` of `batch`, its values copied into buffers of its own. A
/// slice would share the batch's buffers: it would keep the whole batch
/// alive, and arrow-rs casts a sliced binary column to a string by
/// validating the bytes of every row of the buffer, so that one other
/// row's non-UTF-8 bytes failed `CAST(b AS VARCHAR)` of a valid value.
pub fn owned_row(batch: &RecordBatch, row: usize) -> Result<RecordBatch> {
    Ok(take_record_batch(
        batch,
        &UInt32Array::from(vec![row as u32]),
    )?)
}

/// `batch` with its string and binary view columns copied into buffers
/// of their own, holding only the bytes their rows name, in row order.
pub fn compact_views(batch: RecordBatch) -> Result<RecordBatch> {
    let view = |c: &ArrayRef| matches!(c.data_type(), DataType::Utf8View | DataType::BinaryView);
    if !batch.columns().iter().any(view) {
        return Ok(batch);
    }
    let columns = batch
        .columns()
        .iter()
        .map(|c| -> ArrayRef {
            match c.data_type() {
                DataType::Utf8View => Arc::new(c.as_string_view().gc()),
                DataType::BinaryView => Arc::new(c.as_binary_view().gc()),
                _ => Arc::clone(c),
            }
        })
        .collect();
    Ok(RecordBatch::try_new(batch.schema(), columns)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::{FixedSizeListArray, Float32Array, Int64Array};
    use datafusion::arrow::buffer::NullBuffer;
    use datafusion::arrow::datatypes::Int64Type;
    use datafusion::arrow::datatypes::{Field, Schema};

    fn table() -> TableSchema {
        let item = Arc::new(Field::new("item", DataType::Float32, true));
        let schema = Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("emb", DataType::FixedSizeList(item, 3), true),
        ]);
        TableSchema::new(&TableMeta::new(&schema, vec!["id".into()], &[]).unwrap())
    }

    /// Two rows of `values` (three each), `vectors` saying which rows have
    /// a vector, `elements` which values are non-null.
    fn batch(
        t: &TableSchema,
        values: [f32; 6],
        vectors: [bool; 2],
        elements: [bool; 6],
    ) -> RecordBatch {
        let emb = FixedSizeListArray::new(
            Arc::new(Field::new("item", DataType::Float32, true)),
            3,
            Arc::new(Float32Array::new(
                values.to_vec().into(),
                Some(NullBuffer::from(elements.to_vec())),
            )),
            Some(NullBuffer::from(vectors.to_vec())),
        );
        RecordBatch::try_new(
            Arc::clone(&t.schema),
            vec![Arc::new(Int64Array::from(vec![1, 2])), Arc::new(emb)],
        )
        .unwrap()
    }

    #[test]
    fn vectors_must_be_all_numbers_or_null_as_a_whole() {
        let t = table();
        let all = [true; 6];
        t.to_stored(&batch(&t, [1.0; 6], [true; 2], all)).unwrap();
        // A NULL vector is a row without one: stored.
        t.to_stored(&batch(&t, [1.0; 6], [true, false], all))
            .unwrap();
        // A NULL element inside a NULL vector is no element of a vector.
        let hidden = [true, true, true, false, true, true];
        t.to_stored(&batch(&t, [1.0; 6], [true, false], hidden))
            .unwrap();

        let null_inside = [true, true, true, true, false, true];
        let err = t
            .to_stored(&batch(&t, [1.0; 6], [true; 2], null_inside))
            .unwrap_err();
        assert!(matches!(err, Error::InvalidInput(_)), "{err:?}");
        let text = err.to_string();
        assert!(
            text.contains("vector column 'emb' holds NULL at element 2 of 3 in row 2"),
            "{text}"
        );
        // Whatever value the NULL slot holds (0, or NaN).
        let mut values = [1.0; 6];
        values[4] = f32::NAN;
        let err = t
            .to_stored(&batch(&t, values, [true; 2], null_inside))
            .unwrap_err();
        assert!(err.to_string().contains("holds NULL at element 2"), "{err}");
        // A slice of a batch reports its own row numbers.
        let first_bad = [false, true, true, true, true, true];
        let sliced = batch(&t, [1.0; 6], [true; 2], first_bad).slice(1, 1);
        t.to_stored(&sliced).unwrap();
        let sliced = batch(&t, [1.0; 6], [true; 2], null_inside).slice(1, 1);
        let err = t.to_stored(&sliced).unwrap_err();
        assert!(err.to_string().contains("in row 1"), "{err}");

        let mut values = [1.0; 6];
        values[2] = f32::INFINITY;
        let err = t.to_stored(&batch(&t, values, [true; 2], all)).unwrap_err();
        assert!(
            err.to_string()
                .contains("beyond the range of FLOAT (inf) in row 1"),
            "{err}"
        );
    }

    #[test]
    fn columns_that_do_not_match_are_named_and_only_those() {
        let t = table();
        let ids: ArrayRef = Arc::new(Int64Array::from(vec![1]));
        let put = |fields: Vec<Field>, columns: Vec<ArrayRef>| {
            let batch = RecordBatch::try_new(Arc::new(Schema::new(fields)), columns).unwrap();
            t.to_stored(&batch).unwrap_err().to_string()
        };
        let id = || Field::new("id", DataType::Int64, false);
        let zzz = Field::new("zzz", DataType::Int64, true);
        let err = put(vec![id(), zzz], vec![Arc::clone(&ids), Arc::clone(&ids)]);
        assert_eq!(
            err,
            "invalid input: the batch's columns do not match the table's (id Int64, emb \
             FixedSizeList(3 x Float32)): missing emb; not in the table: zzz"
        );
        let wide = Field::new("id", DataType::Int32, false);
        let int32: ArrayRef = Arc::new(datafusion::arrow::array::Int32Array::from(vec![1]));
        let err = put(vec![wide], vec![int32]);
        assert!(
            err.ends_with("): id is Int32, not Int64; missing emb"),
            "{err}"
        );
        let emb = batch(&t, [1.0; 6], [true; 2], [true; 6]).slice(0, 1);
        let swapped = put(
            vec![emb.schema().field(1).clone(), id()],
            vec![Arc::clone(emb.column(1)), ids],
        );
        assert!(
            swapped.contains("columns (emb FixedSizeList(3 x Float32), id Int64) do not match")
                && swapped.ends_with(": the order differs"),
            "{swapped}"
        );
    }

    #[test]
    fn a_batch_is_counted_by_the_memory_it_keeps_alive_and_a_wasteful_slice_is_copied() {
        use datafusion::arrow::ipc::reader::StreamReader;
        use datafusion::arrow::ipc::writer::StreamWriter;

        let t = table();
        // A DELETE's key: one row sliced out of a scanned 8,192-row batch.
        let scanned = Int64Array::from_iter_values(0..8192);
        let key_schema = Arc::new(Schema::new(vec![Field::new("id", DataType::Int64, false)]));
        let keys = RecordBatch::try_new(key_schema, vec![Arc::new(scanned)])
            .unwrap()
            .slice(4000, 1);
        let tombstone = t.tombstones(&keys).unwrap();
        assert!(held_bytes(&tombstone) >= 8192 * 8);
        let (kept, _) = t.keyed(tombstone).unwrap();
        assert!(held_bytes(&kept) < 1024, "{}", held_bytes(&kept));
        assert_eq!(kept.column(0).as_primitive::<Int64Type>().value(0), 4000);
        assert!(kept.column(1).is_null(0));

        // Columns decoded from one IPC message share its buffer: counted
        // once, and kept as they are.
        let rows = 1000;
        let stored = t
            .to_stored(
                &RecordBatch::try_new(
                    Arc::clone(&t.schema),
                    vec![
                        Arc::new(Int64Array::from_iter_values(0..rows)),
                        Arc::new(FixedSizeListArray::new(
                            Arc::new(Field::new("item", DataType::Float32, true)),
                            3,
                            Arc::new(Float32Array::from(vec![0.5; 3 * rows as usize])),
                            None,
                        )),
                    ],
                )
                .unwrap(),
            )
            .unwrap();
        let mut encoded = Vec::new();
        let mut writer = StreamWriter::try_new(&mut encoded, &stored.schema()).unwrap();
        writer.write(&stored).unwrap();
        writer.finish().unwrap();
        drop(writer);
        let decoded = StreamReader::try_new(encoded.as_slice(), None)
            .unwrap()
            .next()
            .unwrap()
            .unwrap();
        let payload = rows as usize * (8 + 3 * 4);
        let held = held_bytes(&decoded);
        assert!(
            (payload..2 * payload).contains(&held),
            "{held} held for {payload} bytes of values ({} by capacity per column)",
            decoded.get_array_memory_size()
        );
        let (kept, _) = t.keyed(decoded.clone()).unwrap();
        assert!(
            kept.column(0).to_data().buffers()[0].ptr_eq(&decoded.column(0).to_data().buffers()[0])
        );
    }

    #[test]
    fn view_columns_count_the_bytes_they_name_and_are_copied_only_when_wasteful() {
        use datafusion::arrow::array::StringViewArray;

        let schema = Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("doc", DataType::Utf8View, true),
        ]);
        let t = TableSchema::new(&TableMeta::new(&schema, vec!["id".into()], &[]).unwrap());
        let doc = "d".repeat(2000);
        let batch = |rows: i64| {
            // (A builder's 8 KiB blocks, not the values, would be copied.)
            let docs = StringViewArray::from_iter_values((0..rows).map(|_| doc.as_str())).gc();
            let user = RecordBatch::try_new(
                Arc::clone(&t.schema),
                vec![
                    Arc::new(Int64Array::from_iter_values(0..rows)),
                    Arc::new(docs),
                ],
            )
            .unwrap();
            t.to_stored(&user).unwrap()
        };
        let data = |b: &RecordBatch| b.column(1).to_data().buffers()[1].clone();
        // One long value: its bytes are what the row takes, kept as they are.
        let one = batch(1);
        let (kept, _) = t.keyed(one.clone()).unwrap();
        assert!(data(&kept).ptr_eq(&data(&one)));
        // One row of a hundred: copied, the other values' bytes let go.
        let hundred = batch(100);
        let (kept, _) = t.keyed(hundred.slice(7, 1)).unwrap();
        assert!(held_bytes(&kept) < 4000, "{}", held_bytes(&kept));
        assert_eq!(kept.column(1).as_string_view().value(0), doc);
    }
}
