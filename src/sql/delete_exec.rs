//! [`DeleteExec`] (tombstones for the rows its input yields) and
//! [`PlannedStatement`], which hands a planned DELETE back to DataFusion as
//! a lazy table.

use std::fmt;
use std::sync::Arc;

use datafusion::arrow::array::{ArrayRef, RecordBatch, UInt64Array};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::catalog::Session;
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::datasource::{TableProvider, TableType};
use datafusion::error::Result;
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::logical_expr::Expr;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_plan::execution_plan::EmissionType;
use datafusion::physical_plan::metrics::{BaselineMetrics, ExecutionPlanMetricsSet, MetricsSet};
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, Distribution, ExecutionPlan, ExecutionPlanProperties,
    PlanProperties,
};
use futures::StreamExt;

use super::streams::{observed, properties, stream_of};
use crate::memtable::Watermark;
use crate::table::Table;

/// The `count` schema DML statements return.
fn count_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![Field::new(
        "count",
        DataType::UInt64,
        false,
    )]))
}

/// Deletes the rows its input yields (by their key columns) and returns
/// their count, once the tombstones are durable. The input is read whole
/// first, then every key is deleted in one put per shard: like an INSERT,
/// a DELETE is all or nothing per shard, across crashes. A key written
/// since the snapshot the input read (by another statement, here or in
/// another process) is not deleted, nor counted: a DELETE deletes the
/// versions it read.
#[derive(Debug)]
pub struct DeleteExec {
    table: Arc<Table>,
    /// Rows of the table to delete (at least its key columns, named as in
    /// the table).
    input: Arc<dyn ExecutionPlan>,
    /// How far the input's snapshot of each shard reached (see
    /// [`Table::delete_seen`]).
    seen: Vec<Option<Watermark>>,
    properties: Arc<PlanProperties>,
    metrics: ExecutionPlanMetricsSet,
}

impl DeleteExec {
    /// Deletes from `table` the rows `input` produces; planned in the same
    /// statement as `input`, whose snapshots it takes the reach of.
    pub fn new(table: Arc<Table>, input: Arc<dyn ExecutionPlan>) -> Self {
        let seen = super::statement::seen(&table);
        Self::with_seen(table, input, seen)
    }

    fn with_seen(
        table: Arc<Table>,
        input: Arc<dyn ExecutionPlan>,
        seen: Vec<Option<Watermark>>,
    ) -> Self {
        Self {
            table,
            input,
            seen,
            properties: properties(count_schema(), 1, EmissionType::Final),
            metrics: ExecutionPlanMetricsSet::new(),
        }
    }
}

impl DisplayAs for DeleteExec {
    fn fmt_as(&self, format: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        match format {
            DisplayFormatType::TreeRender => writeln!(f, "shards={}", self.table.shard_count()),
            _ => write!(f, "MemwalDeleteExec: shards={}", self.table.shard_count()),
        }
    }
}

impl ExecutionPlan for DeleteExec {
    fn name(&self) -> &str {
        "MemwalDeleteExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.input]
    }

    fn with_new_children(
        self: Arc<Self>,
        mut children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        Ok(Arc::new(Self::with_seen(
            Arc::clone(&self.table),
            children.remove(0),
            self.seen.clone(),
        )))
    }

    // One partition in: the optimizer gathers the rows before a
    // distributed plan is split into tasks, so the task that deletes gets
    // every row (not only its own partitions of the input).
    fn required_input_distribution(&self) -> Vec<Distribution> {
        vec![Distribution::SinglePartition]
    }

    fn apply_expressions(
        &self,
        _: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
    ) -> Result<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }

    fn metrics(&self) -> Option<MetricsSet> {
        Some(self.metrics.clone_inner())
    }

    fn execute(
        &self,
        partition: usize,
        ctx: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        let baseline = BaselineMetrics::new(&self.metrics, partition);
        let table = Arc::clone(&self.table);
        let input = Arc::clone(&self.input);
        let schema = self.schema();
        let seen = self.seen.clone();
        let deleted = async move {
            let key_schema = Arc::new(
                table
                    .table_schema()
                    .schema
                    .project(&table.table_schema().key)?,
            );
            let mut keys = Vec::new();
            for p in 0..input.output_partitioning().partition_count() {
                let mut rows = input.execute(p, Arc::clone(&ctx))?;
                while let Some(batch) = rows.next().await {
                    let batch = batch?;
                    if batch.num_rows() == 0 {
                        continue;
                    }
                    let columns: Vec<ArrayRef> = key_schema
                        .fields()
                        .iter()
                        .map(|f| {
                            batch.column_by_name(f.name()).cloned().ok_or_else(|| {
                                crate::Error::invalid(format!(
                                    "DELETE input lacks key column {}",
                                    f.name()
                                ))
                            })
                        })
                        .collect::<crate::Result<_>>()?;
                    keys.push(RecordBatch::try_new(Arc::clone(&key_schema), columns)?);
                }
            }
            let count = match keys.is_empty() {
                true => 0,
                false => table.delete_seen(&keys, &seen).await?,
            };
            let count: ArrayRef = Arc::new(UInt64Array::from(vec![count]));
            Ok(vec![RecordBatch::try_new(count_schema(), vec![count])?])
        };
        Ok(observed(stream_of(schema, deleted), baseline))
    }
}

/// A statement planned ahead (a [`DeleteExec`] over the rows to delete) as
/// a one-use table, so the session can return it as a lazy `DataFrame`:
/// nothing runs until the frame is collected.
#[derive(Debug)]
pub struct PlannedStatement(pub Arc<dyn ExecutionPlan>);

#[async_trait::async_trait]
impl TableProvider for PlannedStatement {
    fn schema(&self) -> SchemaRef {
        self.0.schema()
    }

    fn table_type(&self) -> TableType {
        TableType::Temporary
    }

    async fn scan(
        &self,
        _state: &dyn Session,
        _projection: Option<&Vec<usize>>,
        _filters: &[Expr],
        _limit: Option<usize>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        Ok(Arc::clone(&self.0))
    }
}
