//! Merging sorted runs of one shard into the newest version of each key
//! (DESIGN.md §7). Each run (SSTable row groups, or a MemTable snapshot
//! sorted by [`super::newest_per_key_sorted`]) is sorted by key with one
//! row per key and has a sequence number, higher for newer runs. Each
//! row carries its run's sequence into DataFusion's streaming merge, which
//! orders by key and then by sequence, newest first: the newest version of
//! a key comes first by the sort order itself, whatever order the merge
//! takes its inputs in. The one operator DataFusion lacks,
//! [`newest_per_key`], keeps that row. (Runs whose key ranges do not
//! overlap need no merge at all: see the read path.)
//!
//! Memory stays bounded by a few batches per run, however large the runs.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use datafusion::arrow::array::{Array, ArrayRef, AsArray, BooleanArray, RecordBatch, UInt64Array};
use datafusion::arrow::compute::kernels::boolean::{not, or};
use datafusion::arrow::compute::kernels::cmp::distinct;
use datafusion::arrow::compute::{SortOptions, filter_record_batch};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef, UInt64Type};
use datafusion::common::ScalarValue;
use datafusion::execution::SendableRecordBatchStream;
use datafusion::execution::memory_pool::{MemoryConsumer, MemoryPool};
use datafusion::physical_expr::expressions::Column;
use datafusion::physical_expr::{LexOrdering, PhysicalSortExpr};
use datafusion::physical_plan::metrics::{BaselineMetrics, ExecutionPlanMetricsSet};
use datafusion::physical_plan::sorts::streaming_merge::StreamingMergeBuilder;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use futures::StreamExt;

use super::DeletionVector;
use crate::error::{Error, Result};
use crate::schema::TableSchema;

/// Rows per merged batch.
const BATCH_ROWS: usize = 8192;

/// The smallest and largest key of a run.
pub type KeyRange = (ScalarValue, ScalarValue);

/// One sorted run of a merge: rows in stored form projected to the
/// merge's columns, sorted by key with one row per key.
pub struct Run {
    /// The rows.
    pub rows: SendableRecordBatchStream,
    /// Newer runs have higher numbers; no two runs of a merge share one.
    pub seq: u64,
    /// Rows of the run (by position in it) to leave out: a newer run
    /// holds their keys.
    pub deleted: Option<Arc<DeletionVector>>,
}

/// Metrics for a merge nobody measures (the writer's flushes and loads).
pub fn unrecorded() -> BaselineMetrics {
    BaselineMetrics::new(&ExecutionPlanMetricsSet::new(), 0)
}

/// The column carrying a row's run sequence through a merge.
const SEQ_COLUMN: &str = "_seq";
/// The column carrying a row's position in its run through a traced merge.
const ROW_COLUMN: &str = "_row";

/// `run`'s rows without its deleted ones, with its sequence as a last
/// column and, if `rows`, each row's position in the run after it
/// (`schema`).
fn with_seq(run: Run, schema: SchemaRef, rows: bool) -> SendableRecordBatchStream {
    let Run {
        rows: batches,
        seq,
        deleted,
    } = run;
    let out = Arc::clone(&schema);
    let mut next = 0u64;
    let batches = batches.map(move |batch| {
        let batch = batch?;
        let n = batch.num_rows();
        let mut columns = batch.columns().to_vec();
        columns.push(Arc::new(UInt64Array::from_value(seq, n)));
        if rows {
            columns.push(Arc::new(UInt64Array::from_iter_values(
                next..next + n as u64,
            )));
        }
        let batch = RecordBatch::try_new(Arc::clone(&out), columns)?;
        let first = next;
        next += n as u64;
        match &deleted {
            Some(d) if (first..next).any(|r| d.contains(r)) => {
                let keep: BooleanArray = (first..next).map(|r| Some(!d.contains(r))).collect();
                Ok(filter_record_batch(&batch, &keep)?)
            }
            _ => Ok(batch),
        }
    });
    Box::pin(RecordBatchStreamAdapter::new(schema, batches))
}

/// Where the rows of a merge's runs went: for each run (by sequence), each
/// row that reached the output and its position there, filled as the
/// merged stream is read (complete once it has been read to the end).
#[derive(Clone, Debug, Default)]
pub struct RowTrace(Arc<Mutex<HashMap<u64, Moves>>>);

/// `(row of a run, output position)` of the rows of a run that reached the
/// output, in order.
type Moves = Vec<(u64, u64)>;

impl RowTrace {
    /// The trace of runs `(seq, rows)` whose rows follow one another in
    /// the output, in this order.
    pub fn concatenated(runs: &[(u64, u64)]) -> Self {
        let mut at = 0;
        let mut trace = HashMap::new();
        for &(seq, rows) in runs {
            trace.insert(seq, (0..rows).map(|r| (r, at + r)).collect());
            at += rows;
        }
        Self(Arc::new(Mutex::new(trace)))
    }

    /// The output position of row `row` of run `seq`, if it reached the
    /// output.
    pub fn position(&self, seq: u64, row: u64) -> Option<u64> {
        let trace = self.0.lock().expect("row trace poisoned");
        let pairs = trace.get(&seq)?;
        let at = pairs.binary_search_by_key(&row, |&(r, _)| r).ok()?;
        Some(pairs[at].1)
    }

    /// Every `(row of the run, output position)` of run `seq`, in order.
    #[cfg(test)]
    pub fn pairs(&self, seq: u64) -> Vec<(u64, u64)> {
        let trace = self.0.lock().expect("row trace poisoned");
        trace.get(&seq).cloned().unwrap_or_default()
    }

    /// The rows of each run (by sequence) that reached the output since
    /// the last call, emptying the trace: for a caller that needs only
    /// which rows reached it, in memory bounded by what was read between
    /// calls.
    pub fn take(&self) -> Vec<(u64, Vec<u64>)> {
        let mut trace = self.0.lock().expect("row trace poisoned");
        trace
            .drain()
            .map(|(seq, moves)| (seq, moves.into_iter().map(|(row, _)| row).collect()))
            .collect()
    }
}

/// Merges `runs` into the newest row of each key, sorted by key, in stored
/// form projected to `columns` (which include the key columns and
/// `_tombstone`). Tombstones are dropped unless `keep_tombstones`. The
/// merge's time and rows are recorded in `metrics`.
pub fn merge_runs(
    schema: &TableSchema,
    columns: &[usize],
    runs: Vec<Run>,
    keep_tombstones: bool,
    pool: &Arc<dyn MemoryPool>,
    metrics: BaselineMetrics,
) -> Result<SendableRecordBatchStream> {
    let (rows, _) = merge(schema, columns, runs, keep_tombstones, pool, metrics, false)?;
    Ok(rows)
}

/// [`merge_runs`] that also traces where the rows of each run go (indexes
/// built over the runs can then be carried over to the output).
pub fn merge_runs_traced(
    schema: &TableSchema,
    columns: &[usize],
    runs: Vec<Run>,
    keep_tombstones: bool,
    pool: &Arc<dyn MemoryPool>,
) -> Result<(SendableRecordBatchStream, RowTrace)> {
    let (rows, trace) = merge(
        schema,
        columns,
        runs,
        keep_tombstones,
        pool,
        unrecorded(),
        true,
    )?;
    Ok((rows, trace.expect("a traced merge")))
}

fn merge(
    schema: &TableSchema,
    columns: &[usize],
    mut runs: Vec<Run>,
    keep_tombstones: bool,
    pool: &Arc<dyn MemoryPool>,
    metrics: BaselineMetrics,
    traced: bool,
) -> Result<(SendableRecordBatchStream, Option<RowTrace>)> {
    let projected = Arc::new(schema.stored.project(columns)?);
    let position = |stored: usize| {
        columns
            .iter()
            .position(|&c| c == stored)
            .ok_or_else(|| Error::invalid("a merge needs the key columns and _tombstone"))
    };
    let tombstone = position(schema.stored.fields().len() - 1)?;
    let keys = schema
        .key
        .iter()
        .map(|&k| position(k))
        .collect::<Result<Vec<_>>>()?;
    if runs.len() == 1 && !traced && runs[0].deleted.is_none() {
        let rows = runs.pop().expect("one run").rows;
        return Ok((
            match keep_tombstones {
                true => rows,
                false => drop_tombstones(rows, tombstone),
            },
            None,
        ));
    }
    if keys.is_empty() {
        return Err(Error::invalid("a merge needs a key"));
    }
    let mut fields = projected.fields().to_vec();
    fields.push(Arc::new(Field::new(SEQ_COLUMN, DataType::UInt64, false)));
    if traced {
        fields.push(Arc::new(Field::new(ROW_COLUMN, DataType::UInt64, false)));
    }
    let sequenced = Arc::new(Schema::new(fields));
    let seq = projected.fields().len();
    let order = LexOrdering::new(
        keys.iter()
            .map(|&k| (projected.field(k).name(), k, false))
            .chain([(&SEQ_COLUMN.to_string(), seq, true)])
            .map(|(name, at, descending)| {
                PhysicalSortExpr::new(
                    Arc::new(Column::new(name, at)),
                    SortOptions::new(descending, false),
                )
            }),
    )
    .expect("a key column");
    let merged = StreamingMergeBuilder::new()
        .with_streams(
            runs.into_iter()
                .map(|r| with_seq(r, Arc::clone(&sequenced), traced))
                .collect(),
        )
        .with_schema(sequenced)
        .with_expressions(&order)
        .with_metrics(metrics)
        .with_batch_size(BATCH_ROWS)
        .with_reservation(MemoryConsumer::new("memwal merge").register(pool))
        .build()?;
    let mut rows = newest_per_key(merged, keys);
    if !keep_tombstones {
        // Before the trace counts output positions.
        rows = drop_tombstones(rows, tombstone);
    }
    let mut trace = None;
    if traced {
        let t = RowTrace::default();
        rows = record(rows, seq, t.clone());
        trace = Some(t);
    }
    let without_seq: Vec<usize> = (0..seq).collect();
    let rows = rows.map(move |batch| Ok(batch?.project(&without_seq)?));
    Ok((
        Box::pin(RecordBatchStreamAdapter::new(projected, rows)),
        trace,
    ))
}

/// `rows` (with `_seq` at `seq` and `_row` after it), recording in `trace`
/// the output position of each row.
fn record(
    rows: SendableRecordBatchStream,
    seq: usize,
    trace: RowTrace,
) -> SendableRecordBatchStream {
    let schema = rows.schema();
    let mut position = 0u64;
    let rows = rows.inspect(move |batch| {
        let Ok(batch) = batch else { return };
        let seqs = batch.column(seq).as_primitive::<UInt64Type>();
        let runs_rows = batch.column(seq + 1).as_primitive::<UInt64Type>();
        let mut trace = trace.0.lock().expect("row trace poisoned");
        for i in 0..batch.num_rows() {
            let run = trace.entry(seqs.value(i)).or_default();
            run.push((runs_rows.value(i), position + i as u64));
        }
        position += batch.num_rows() as u64;
    });
    Box::pin(RecordBatchStreamAdapter::new(schema, rows))
}

/// `rows` without the rows whose `_tombstone` (at `tombstone`) is set.
pub fn drop_tombstones(
    rows: SendableRecordBatchStream,
    tombstone: usize,
) -> SendableRecordBatchStream {
    let schema = rows.schema();
    let rows = rows.map(move |batch| {
        let batch = batch?;
        let dead = batch
            .column(tombstone)
            .as_any()
            .downcast_ref::<BooleanArray>()
            .expect("_tombstone is boolean");
        if dead.true_count() == 0 {
            return Ok(batch);
        }
        // Never null: a stored row is a tombstone or it is not.
        let live = not(dead)?;
        Ok(filter_record_batch(&batch, &live)?)
    });
    Box::pin(RecordBatchStreamAdapter::new(schema, rows))
}

/// Keeps the first row of each key of `merged` (sorted by the columns at
/// `keys`, newest first within a key).
pub fn newest_per_key(
    merged: SendableRecordBatchStream,
    keys: Vec<usize>,
) -> SendableRecordBatchStream {
    let schema = merged.schema();
    // The key of the previous batch's last row.
    let mut last: Option<Vec<ArrayRef>> = None;
    let rows = merged.map(move |batch| {
        let batch = batch?;
        let n = batch.num_rows();
        if n == 0 {
            return Ok(batch);
        }
        // Row i starts a key if any key column differs from row i - 1.
        let mut first: Option<BooleanArray> = None;
        for (i, &k) in keys.iter().enumerate() {
            let column = batch.column(k);
            let previous: ArrayRef = match &last {
                Some(last) => datafusion::arrow::compute::concat(&[
                    last[i].as_ref(),
                    column.slice(0, n - 1).as_ref(),
                ])?,
                None => column.slice(0, n - 1),
            };
            let current = match &last {
                Some(_) => Arc::clone(column),
                None => column.slice(1, n - 1),
            };
            let differs = distinct(&current, &previous)?;
            first = Some(match first {
                Some(f) => or(&f, &differs)?,
                None => differs,
            });
        }
        let mut first = first.expect("at least one key column");
        if last.is_none() {
            // The very first row starts a key.
            let head = BooleanArray::from(vec![true]);
            first = datafusion::arrow::compute::concat(&[&head, &first])?
                .as_any()
                .downcast_ref::<BooleanArray>()
                .expect("booleans")
                .clone();
        }
        last = Some(
            keys.iter()
                .map(|&k| batch.column(k).slice(n - 1, 1))
                .collect(),
        );
        if first.true_count() == n {
            return Ok(batch);
        }
        Ok(filter_record_batch(&batch, &first)?)
    });
    Box::pin(RecordBatchStreamAdapter::new(schema, rows))
}

/// The rows of `streams` one after another (disjoint runs, or an
/// append-only table's layers).
pub fn concat(
    schema: SchemaRef,
    streams: Vec<SendableRecordBatchStream>,
) -> SendableRecordBatchStream {
    Box::pin(RecordBatchStreamAdapter::new(
        schema,
        futures::stream::iter(streams).flatten(),
    ))
}
