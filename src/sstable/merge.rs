//! Merging sorted runs of one shard into the newest version of each key
//! (DESIGN.md §7): each run (an SSTable, or a MemTable snapshot sorted by
//! [`super::newest_per_key_sorted`]) is sorted by key with one row per key
//! and tagged with a sequence number (newer runs higher). DataFusion's
//! streaming merge orders the runs by (key, sequence descending); the one
//! operator DataFusion lacks, [`newest_per_key`], keeps the first row of
//! each key and drops tombstones. Memory stays bounded by a few batches per
//! run, however large the runs are.

use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, BooleanArray, RecordBatch, UInt64Array};
use datafusion::arrow::compute::{SortOptions, filter_record_batch};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::arrow::row::{OwnedRow, RowConverter, SortField};
use datafusion::execution::SendableRecordBatchStream;
use datafusion::execution::memory_pool::{MemoryConsumer, MemoryPool};
use datafusion::physical_expr::expressions::Column;
use datafusion::physical_expr::{LexOrdering, PhysicalSortExpr};
use datafusion::physical_plan::metrics::{BaselineMetrics, ExecutionPlanMetricsSet};
use datafusion::physical_plan::sorts::streaming_merge::StreamingMergeBuilder;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use futures::StreamExt;

use crate::error::{Error, Result};
use crate::memtable::TableSchema;

/// The run-order column added to each run: higher is newer.
pub const SEQ: &str = "_seq";

/// Rows per merged batch.
const BATCH_ROWS: usize = 8192;

/// The columns of a run: the stored columns `columns` (which include the
/// key columns and `_tombstone`) and [`SEQ`].
pub fn run_schema(schema: &TableSchema, columns: &[usize]) -> Result<SchemaRef> {
    let mut fields: Vec<Field> = schema
        .stored
        .project(columns)?
        .fields()
        .iter()
        .map(|f| f.as_ref().clone())
        .collect();
    fields.push(Field::new(SEQ, DataType::UInt64, false));
    Ok(Arc::new(Schema::new(fields)))
}

/// `stream` (stored form projected to `columns`) as a run with sequence
/// number `seq`.
pub fn as_run(
    schema: &TableSchema,
    columns: &[usize],
    stream: SendableRecordBatchStream,
    seq: u64,
) -> Result<SendableRecordBatchStream> {
    let out = run_schema(schema, columns)?;
    let schema = Arc::clone(&out);
    let stream = stream.map(move |batch| {
        let batch = batch?;
        let mut columns = batch.columns().to_vec();
        columns.push(Arc::new(UInt64Array::from_value(seq, batch.num_rows())) as ArrayRef);
        Ok(RecordBatch::try_new(Arc::clone(&schema), columns)?)
    });
    Ok(Box::pin(RecordBatchStreamAdapter::new(out, stream)))
}

/// Merges `runs` (see the module doc; schema [`run_schema`] of `columns`)
/// into the newest row of each key, sorted by key, in stored form
/// projected to `columns`. Tombstones are dropped unless `keep_tombstones`.
pub fn merge_runs(
    schema: &TableSchema,
    columns: &[usize],
    mut runs: Vec<SendableRecordBatchStream>,
    keep_tombstones: bool,
    pool: &Arc<dyn MemoryPool>,
) -> Result<SendableRecordBatchStream> {
    let run_schema = run_schema(schema, columns)?;
    let position = |stored: usize| {
        columns
            .iter()
            .position(|&c| c == stored)
            .ok_or_else(|| Error::invalid("a merge needs the key columns and _tombstone"))
    };
    let keys = schema
        .key
        .iter()
        .map(|&k| position(k))
        .collect::<Result<Vec<_>>>()?;
    let tombstone = position(schema.stored.fields().len() - 1)?;
    let merged = if runs.len() == 1 {
        runs.pop().expect("one run")
    } else if runs.is_empty() {
        return Ok(Box::pin(RecordBatchStreamAdapter::new(
            Arc::new(schema.stored.project(columns)?),
            futures::stream::empty(),
        )));
    } else {
        let mut order: Vec<PhysicalSortExpr> = keys
            .iter()
            .map(|&k| {
                PhysicalSortExpr::new(
                    Arc::new(Column::new(run_schema.field(k).name(), k)),
                    SortOptions::new(false, false),
                )
            })
            .collect();
        let seq = run_schema.fields().len() - 1;
        order.push(PhysicalSortExpr::new(
            Arc::new(Column::new(SEQ, seq)),
            SortOptions::new(true, false),
        ));
        let order = LexOrdering::new(order).expect("at least one sort column");
        StreamingMergeBuilder::new()
            .with_streams(runs)
            .with_schema(Arc::clone(&run_schema))
            .with_expressions(&order)
            .with_metrics(BaselineMetrics::new(&ExecutionPlanMetricsSet::new(), 0))
            .with_batch_size(BATCH_ROWS)
            .with_reservation(MemoryConsumer::new("memwal merge").register(pool))
            .build()?
    };
    newest_per_key(merged, &keys, tombstone, keep_tombstones)
}

/// Keeps the first row of each key of `merged` (sorted by key, newest
/// first within a key) and, unless `keep_tombstones`, drops it if it is a
/// tombstone; removes [`SEQ`].
pub fn newest_per_key(
    merged: SendableRecordBatchStream,
    keys: &[usize],
    tombstone: usize,
    keep_tombstones: bool,
) -> Result<SendableRecordBatchStream> {
    let in_schema = merged.schema();
    let out_columns: Vec<usize> = (0..in_schema.fields().len() - 1).collect();
    let out = Arc::new(in_schema.project(&out_columns)?);
    let converter = RowConverter::new(
        keys.iter()
            .map(|&k| SortField::new(in_schema.field(k).data_type().clone()))
            .collect(),
    )?;
    let keys = keys.to_vec();
    let mut last: Option<OwnedRow> = None;
    let stream = merged.map(move |batch| {
        let batch = batch?;
        let n = batch.num_rows();
        if n == 0 {
            return Ok(batch.project(&out_columns)?);
        }
        let columns: Vec<ArrayRef> = keys.iter().map(|&k| Arc::clone(batch.column(k))).collect();
        let rows = converter.convert_columns(&columns)?;
        let dead = batch
            .column(tombstone)
            .as_any()
            .downcast_ref::<BooleanArray>()
            .expect("_tombstone is boolean");
        let keep: BooleanArray = (0..n)
            .map(|i| {
                let first = match i {
                    0 => last.as_ref().is_none_or(|l| l.row() != rows.row(0)),
                    _ => rows.row(i) != rows.row(i - 1),
                };
                let live = keep_tombstones || !(dead.is_valid(i) && dead.value(i));
                Some(first && live)
            })
            .collect();
        last = Some(rows.row(n - 1).owned());
        let kept = filter_record_batch(&batch, &keep)?;
        Ok(kept.project(&out_columns)?)
    });
    Ok(Box::pin(RecordBatchStreamAdapter::new(out, stream)))
}

/// The rows of `streams` one after another (append-only tables).
pub fn concat(
    schema: SchemaRef,
    streams: Vec<SendableRecordBatchStream>,
) -> SendableRecordBatchStream {
    Box::pin(RecordBatchStreamAdapter::new(
        schema,
        futures::stream::iter(streams).flatten(),
    ))
}
