//! [`VectorSearchExec`]: one `vector_search` call over the snapshots it
//! was planned with, nearest rows first in each partition.

use std::fmt;
use std::sync::Arc;

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

use super::scan_exec::explain_missing;
use super::streams::observed;
use super::vector::DISTANCE_COLUMN;
use crate::read::{Neighbour, SearchMetrics, ShardSnapshot, VectorQuery};
use crate::table::Table;

/// Runs a vector search over snapshots of a table's shards: each partition
/// yields the `k` rows nearest to the query among its shards, nearest
/// first (a merge with a fetch of `k` above several partitions gives the
/// table's nearest).
#[derive(Debug)]
pub struct VectorSearchExec {
    name: String,
    table: Arc<Table>,
    query: VectorQuery,
    /// The table's columns and `_distance` (the last).
    #[cfg_attr(not(feature = "distributed"), allow(dead_code))]
    full: SchemaRef,
    /// Indices into `full`.
    projection: Vec<usize>,
    /// Per partition, the shards it searches (none: an empty partition).
    partitions: Vec<Vec<(u32, ShardSnapshot)>>,
    properties: Arc<PlanProperties>,
    metrics: ExecutionPlanMetricsSet,
}

impl VectorSearchExec {
    /// A search of `table` (named `name`) producing `projection` of the
    /// table's columns plus `_distance` (`full`), one partition per entry
    /// of `partitions` searching the shard snapshots in it.
    pub(crate) fn new(
        name: String,
        table: Arc<Table>,
        query: VectorQuery,
        full: &SchemaRef,
        projection: Vec<usize>,
        partitions: Vec<Vec<(u32, ShardSnapshot)>>,
    ) -> Result<Self> {
        let schema = Arc::new(full.project(&projection)?);
        let mut equivalence = EquivalenceProperties::new(Arc::clone(&schema));
        if let Ok(at) = schema.index_of(DISTANCE_COLUMN) {
            let distance: Arc<dyn PhysicalExpr> = Arc::new(Column::new(DISTANCE_COLUMN, at));
            equivalence.add_orderings([[PhysicalSortExpr::new_default(distance)]]);
        }
        let properties = Arc::new(PlanProperties::new(
            equivalence,
            Partitioning::UnknownPartitioning(partitions.len()),
            EmissionType::Final,
            Boundedness::Bounded,
        ));
        Ok(Self {
            name,
            table,
            query,
            full: Arc::clone(full),
            projection,
            partitions,
            properties,
            metrics: ExecutionPlanMetricsSet::new(),
        })
    }

    /// What it was made of: the table's name and handle, the query, the
    /// full schema, the projection and the partitions (see
    /// [`VectorSearchExec::new`]).
    #[allow(clippy::type_complexity)]
    #[cfg_attr(not(feature = "distributed"), allow(dead_code))]
    pub(crate) fn parts(
        &self,
    ) -> (
        &str,
        &Arc<Table>,
        &VectorQuery,
        &SchemaRef,
        &[usize],
        &[Vec<(u32, ShardSnapshot)>],
    ) {
        (
            &self.name,
            &self.table,
            &self.query,
            &self.full,
            &self.projection,
            &self.partitions,
        )
    }

    /// This search with other partitions (for a task of a distributed
    /// query).
    #[cfg_attr(not(feature = "distributed"), allow(dead_code))]
    pub(crate) fn with_partitions(
        &self,
        partitions: Vec<Vec<(u32, ShardSnapshot)>>,
    ) -> Result<Self> {
        Self::new(
            self.name.clone(),
            Arc::clone(&self.table),
            self.query.clone(),
            &self.full,
            self.projection.clone(),
            partitions,
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
        write!(f, ", partitions={}", self.partitions.len())
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
        let search = SearchMetrics::new(&self.metrics, partition);
        let table = Arc::clone(&self.table);
        let shards = self.partitions.get(partition).cloned().ok_or_else(|| {
            DataFusionError::Internal(format!("{}: no partition {partition}", self.name()))
        })?;
        let first_shard = shards.first().map_or(0, |(shard, _)| *shard);
        let query = self.query.clone();
        let projection = self.projection.clone();
        let schema = self.schema();
        let out_schema = Arc::clone(&schema);
        let rows = async move {
            // Each neighbour with the snapshot of its shard.
            let mut nearest: Vec<(Neighbour, usize)> = Vec::new();
            for (at, (_, snapshot)) in shards.iter().enumerate() {
                let found = snapshot.vector_search_recorded(&query, &search).await?;
                nearest.extend(found.into_iter().map(|n| (n, at)));
            }
            nearest.sort_by(|a, b| a.0.distance.total_cmp(&b.0.distance));
            nearest.truncate(query.k);
            // Long blob values are read for the rows returned, and only
            // when the query selects their column.
            let blobs = &table.table_schema().blobs;
            let with_blobs = blobs.iter().any(|b| projection.contains(&b.index));
            let mut rows: Vec<RecordBatch> = Vec::with_capacity(nearest.len());
            for (n, at) in &nearest {
                rows.push(match with_blobs {
                    true => {
                        let bytes_read = &search.read.bytes_read;
                        (shards[*at].1)
                            .read_blobs_counted(n.row.clone(), bytes_read)
                            .await?
                    }
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
        let rows = explain_missing(Box::pin(rows), Arc::clone(&self.table), first_shard);
        Ok(observed(rows, baseline))
    }
}
