//! [`InsertSink`]: the INSERT half of a memwal table, under DataFusion's
//! `DataSinkExec` (which counts its rows and time).

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use datafusion::arrow::compute::SortOptions;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::datasource::sink::DataSink;
use datafusion::error::Result;
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_expr::expressions::Column;
use datafusion::physical_expr::{LexRequirement, PhysicalSortExpr};
use datafusion::physical_plan::{DisplayAs, DisplayFormatType, ExecutionPlan};
use futures::StreamExt;

use crate::table::Table;

/// How often [`InsertProgress`] hears of a running INSERT.
const PROGRESS_EVERY: Duration = Duration::from_secs(1);

/// Told how far a running `INSERT` got (rows read from its input so far,
/// time since it started) about once a second, from its first second on.
/// Install it with [`crate::SessionBuilder::on_insert_progress`].
pub struct InsertProgress(pub Box<dyn Fn(u64, Duration) + Send + Sync>);

impl fmt::Debug for InsertProgress {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("InsertProgress")
    }
}

/// The key order an insert's `input` already has, to be kept when the
/// plan merges its partitions (a sorted file, a generated series): a bulk
/// load of rows in key order needs no sort, and its runs do not overlap.
/// `None` for input in no such order (which is not sorted for the load).
pub(crate) fn key_order_of(
    input: &dyn ExecutionPlan,
    key: &[usize],
) -> Result<Option<LexRequirement>> {
    let schema = input.schema();
    if key.iter().any(|&k| k >= schema.fields().len()) {
        return Ok(None);
    }
    let order: Vec<PhysicalSortExpr> = key
        .iter()
        .map(|&k| {
            let column = Arc::new(Column::new(schema.field(k).name(), k));
            PhysicalSortExpr::new(column, SortOptions::new(false, false))
        })
        .collect();
    if order.is_empty()
        || !input
            .properties()
            .equivalence_properties()
            .ordering_satisfy(order.clone())?
    {
        return Ok(None);
    }
    Ok(LexRequirement::new(order.into_iter().map(Into::into)))
}

/// Routes inserted rows to the shard writers (see [`Table::put_stream`]);
/// reports the count once every row is durable (at once in non-durable
/// mode). Within a shard a statement becomes visible and durable all at
/// once, also across a crash; a statement that fails (bad input, say)
/// writes nothing. Memory stays bounded however large the input. The count is the rows
/// the statement leaves in the table: one per distinct primary key (the
/// statement's last row of a key wins; an insert of an existing key is an
/// update and counts), every row for a table without a key.
#[derive(Debug)]
pub struct InsertSink {
    table: Arc<Table>,
}

impl InsertSink {
    /// Inserts into `table`.
    pub(super) fn new(table: Arc<Table>) -> Self {
        Self { table }
    }
}

impl DisplayAs for InsertSink {
    fn fmt_as(&self, format: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        match format {
            DisplayFormatType::TreeRender => writeln!(f, "shards={}", self.table.shard_count()),
            _ => write!(f, "MemwalInsertSink: shards={}", self.table.shard_count()),
        }
    }
}

#[async_trait]
impl DataSink for InsertSink {
    fn schema(&self) -> &SchemaRef {
        &self.table.table_schema().schema
    }

    async fn write_all(
        &self,
        data: SendableRecordBatchStream,
        context: &Arc<TaskContext>,
    ) -> Result<u64> {
        let progress = context.session_config().get_extension::<InsertProgress>();
        let started = Instant::now();
        let (mut rows, mut reported) = (0u64, Duration::ZERO);
        let data = data.map(|batch| {
            let batch = batch?;
            rows += batch.num_rows() as u64;
            let elapsed = started.elapsed();
            if let Some(progress) = &progress
                && elapsed >= reported + PROGRESS_EVERY
            {
                reported = elapsed;
                (progress.0)(rows, elapsed);
            }
            Ok::<_, crate::Error>(batch)
        });
        Ok(self.table.put_stream(data).await?)
    }
}
