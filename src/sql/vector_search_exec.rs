//! [`VectorSearchExec`]: one `vector_search` call, run over every shard
//! of its table at `execute()`, nearest rows first.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use datafusion::arrow::array::{Float32Array, RecordBatch, RecordBatchOptions};
use datafusion::arrow::compute::concat_batches;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_expr::expressions::Column;
use datafusion::physical_expr::{
    EquivalenceProperties, Partitioning, PhysicalExpr, PhysicalSortExpr,
};
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::metrics::{BaselineMetrics, ExecutionPlanMetricsSet, MetricsSet};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties};
use futures::StreamExt;

use super::streams::observed;
use super::vector::DISTANCE_COLUMN;
use crate::read::{Neighbour, VectorQuery};
use crate::table::Table;

/// Runs a vector search over every shard of a table and yields the
/// nearest rows, nearest first (one partition).
#[derive(Debug)]
pub struct VectorSearchExec {
    name: String,
    table: Arc<Table>,
    query: VectorQuery,
    /// The table's columns and `_distance` (the last).
    full: SchemaRef,
    /// Indices into `full`.
    projection: Vec<usize>,
    properties: Arc<PlanProperties>,
    metrics: ExecutionPlanMetricsSet,
}

impl VectorSearchExec {
    /// A search of `table` (named `name`) producing `projection` of the
    /// table's columns plus `_distance` (`full`).
    pub(crate) fn new(
        name: String,
        table: Arc<Table>,
        query: VectorQuery,
        full: &SchemaRef,
        projection: Option<Vec<usize>>,
    ) -> Result<Self> {
        let projection = projection.unwrap_or_else(|| (0..full.fields().len()).collect());
        let schema = Arc::new(full.project(&projection)?);
        let mut equivalence = EquivalenceProperties::new(Arc::clone(&schema));
        if let Ok(at) = schema.index_of(DISTANCE_COLUMN) {
            let distance: Arc<dyn PhysicalExpr> = Arc::new(Column::new(DISTANCE_COLUMN, at));
            equivalence.add_orderings([[PhysicalSortExpr::new_default(distance)]]);
        }
        let properties = Arc::new(PlanProperties::new(
            equivalence,
            Partitioning::UnknownPartitioning(1),
            EmissionType::Final,
            Boundedness::Bounded,
        ));
        Ok(Self {
            name,
            table,
            query,
            full: Arc::clone(full),
            projection,
            properties,
            metrics: ExecutionPlanMetricsSet::new(),
        })
    }
}

impl VectorSearchExec {
    /// What it was made of: the table's name and handle, the query, the
    /// full schema and the projection (see [`VectorSearchExec::new`]).
    pub(crate) fn parts(&self) -> (&str, &Arc<Table>, &VectorQuery, &SchemaRef, &[usize]) {
        (
            &self.name,
            &self.table,
            &self.query,
            &self.full,
            &self.projection,
        )
    }
}

impl DisplayAs for VectorSearchExec {
    fn fmt_as(&self, format: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        let column = self
            .table
            .table_schema()
            .schema
            .field(self.query.column)
            .name();
        if let DisplayFormatType::TreeRender = format {
            writeln!(f, "table={}", self.name)?;
            writeln!(f, "column={column}")?;
            writeln!(f, "k={}", self.query.k)?;
            writeln!(f, "ef={}", self.query.ef)?;
            if let Some(filter) = &self.query.filter {
                writeln!(f, "filter={filter}")?;
            }
            return Ok(());
        }
        write!(
            f,
            "MemwalVectorSearchExec: table={}, column={column}, k={}, ef={}",
            self.name, self.query.k, self.query.ef
        )?;
        if let Some(filter) = &self.query.filter {
            write!(f, ", filter={filter}")?;
        }
        Ok(())
    }
}

impl ExecutionPlan for VectorSearchExec {
    fn name(&self) -> &str {
        "MemwalVectorSearchExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![]
    }

    fn with_new_children(
        self: Arc<Self>,
        _: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        Ok(self)
    }

    fn apply_expressions(
        &self,
        visit: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
    ) -> Result<TreeNodeRecursion> {
        match &self.query.filter {
            Some(filter) => visit(filter),
            None => Ok(TreeNodeRecursion::Continue),
        }
    }

    fn metrics(&self) -> Option<MetricsSet> {
        Some(self.metrics.clone_inner())
    }

    fn execute(&self, partition: usize, _: Arc<TaskContext>) -> Result<SendableRecordBatchStream> {
        let baseline = BaselineMetrics::new(&self.metrics, partition);
        let table = Arc::clone(&self.table);
        let query = self.query.clone();
        let projection = self.projection.clone();
        let schema = self.schema();
        let out_schema = Arc::clone(&schema);
        let rows = async move {
            // Each neighbour with the snapshot of its shard.
            let mut nearest: Vec<(Neighbour, usize)> = Vec::new();
            let mut snapshots = Vec::with_capacity(table.shard_count());
            for shard in 0..table.shard_count() {
                let snapshot = table.snapshot(shard as u32, Duration::ZERO).await?;
                let found = snapshot.vector_search(&query).await?;
                nearest.extend(found.into_iter().map(|n| (n, shard)));
                snapshots.push(snapshot);
            }
            nearest.sort_by(|a, b| a.0.distance.total_cmp(&b.0.distance));
            nearest.truncate(query.k);
            // Long blob values are read for the rows returned, and only
            // when the query selects their column.
            let blobs = &table.table_schema().blobs;
            let with_blobs = blobs.iter().any(|b| projection.contains(&b.index));
            let mut rows: Vec<RecordBatch> = Vec::with_capacity(nearest.len());
            for (n, shard) in &nearest {
                rows.push(match with_blobs {
                    true => snapshots[*shard].read_blobs(n.row.clone()).await?,
                    false => n.row.clone(),
                });
            }
            let nearest: Vec<Neighbour> = nearest.into_iter().map(|(n, _)| n).collect();
            let stored_schema = Arc::clone(&table.table_schema().stored);
            let stored = concat_batches(&stored_schema, &rows)?;
            let mut columns = table.table_schema().to_user(&stored)?.columns().to_vec();
            columns.push(Arc::new(Float32Array::from_iter_values(
                nearest.iter().map(|n| n.distance),
            )));
            let columns = projection
                .iter()
                .map(|&i| Arc::clone(&columns[i]))
                .collect();
            let batch = RecordBatch::try_new_with_options(
                out_schema,
                columns,
                &RecordBatchOptions::new().with_row_count(Some(nearest.len())),
            )?;
            Ok::<_, DataFusionError>(batch)
        };
        let rows = RecordBatchStreamAdapter::new(schema, futures::stream::once(rows).boxed());
        Ok(observed(Box::pin(rows), baseline))
    }
}
