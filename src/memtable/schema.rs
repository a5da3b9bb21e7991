//! [`TableSchema`]: a table's user schema, the stored form of its rows, and
//! the checks a batch must pass before anything is written.

use std::sync::Arc;

use datafusion::arrow::array::{
    Array, ArrayRef, AsArray, BooleanArray, RecordBatch, new_null_array,
};
use datafusion::arrow::datatypes::{DataType, Float32Type, SchemaRef};

use super::{KeyedBatch, key};
use crate::catalog::TableMeta;
use crate::error::{Error, Result};
use crate::hnsw::{HnswParams, Metric};
use crate::wal::entry_schema;

/// What the write and read paths need to know about one table's rows.
///
/// Stored rows (MemTable batches, WAL entries) have the table's columns,
/// every one nullable (a tombstone carries only its key), plus
/// [`TOMBSTONE_COLUMN`].
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
    pub shards: u32,
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
            .columns
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
        Self {
            stored: entry_schema(&schema),
            key: meta.primary_key_indices(),
            vectors,
            shards: meta.shards,
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
            )?;
        }
        let mut columns = batch.columns().to_vec();
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

    /// The canonical key encoding of each row of a batch (stored or user
    /// form).
    pub fn encode_keys(&self, stored: &RecordBatch) -> Result<Vec<Box<[u8]>>> {
        key::encode_keys(&self.key_columns(stored), stored.num_rows())
    }

    /// A stored batch with its rows' key encodings, as the MemTable takes
    /// it (`None` for an append-only table).
    pub fn keyed(&self, stored: RecordBatch) -> Result<KeyedBatch> {
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

    /// Rows of stored batch `stored` as user rows (drops the tombstone
    /// column; the rows must be live).
    pub fn to_user(&self, stored: &RecordBatch) -> Result<RecordBatch> {
        let columns = stored.columns()[..stored.num_columns() - 1].to_vec();
        Ok(RecordBatch::try_new(Arc::clone(&self.schema), columns)?)
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
        Err(Error::invalid(format!(
            "batch columns ({}) do not match the table's ({})",
            describe(
                got.fields()
                    .iter()
                    .map(|f| (f.name(), f.data_type()))
                    .collect()
            ),
            describe(expected.iter().map(|f| (f.name(), f.data_type())).collect()),
        )))
    }
}

/// Every non-null vector of `column` must have `dim` finite values.
fn check_vectors(name: &str, column: &ArrayRef, dim: i32) -> Result<()> {
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
        let start = (list.offset() + row) * width;
        let slice = &values.values()[start..start + width];
        if let Some(bad) = slice.iter().find(|v| !v.is_finite()) {
            return Err(Error::invalid(format!(
                "vector column '{name}' holds a non-finite value ({bad}) in row {row}"
            )));
        }
    }
    Ok(())
}
