//! The physical operators memwal adds to DataFusion: [`ScanExec`] (the live
//! rows of a table, one partition per shard — the shard's layers merged by
//! key, see [`crate::read`] — or a few keys looked up) and
//! [`DeleteExec`] (tombstones for the rows its input yields). Both do their
//! work in `execute()`, never while planning. [`PlannedStatement`] hands a
//! planned statement back to DataFusion as a lazy table.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use datafusion::arrow::compute::SortOptions;
use datafusion::common::stats::Precision;
use datafusion::common::{DataFusionError, Statistics};
use datafusion::physical_expr::PhysicalSortExpr;
use datafusion::physical_expr::expressions::Column;

use datafusion::arrow::array::{ArrayRef, RecordBatch, UInt64Array};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::error::Result;
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_expr::{EquivalenceProperties, Partitioning, PhysicalExpr};
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, ExecutionPlanProperties, PlanProperties,
};
use futures::{StreamExt, TryStreamExt};

use crate::read::{KeyBounds, ScanPart, ShardSnapshot};
use crate::table::Table;
use datafusion::catalog::Session;
use datafusion::datasource::{TableProvider, TableType};
use datafusion::logical_expr::Expr;

fn properties(schema: SchemaRef, partitions: usize, emission: EmissionType) -> Arc<PlanProperties> {
    Arc::new(PlanProperties::new(
        EquivalenceProperties::new(schema),
        Partitioning::UnknownPartitioning(partitions),
        emission,
        Boundedness::Bounded,
    ))
}

/// A stream of the batches one future produces.
fn stream_of(
    schema: SchemaRef,
    batches: impl Future<Output = crate::Result<Vec<RecordBatch>>> + Send + 'static,
) -> SendableRecordBatchStream {
    let stream = futures::stream::once(batches)
        .map_ok(|batches| futures::stream::iter(batches.into_iter().map(Ok)))
        .map_err(datafusion::error::DataFusionError::from)
        .try_flatten();
    Box::pin(RecordBatchStreamAdapter::new(schema, stream))
}

/// What a scan reads.
#[derive(Debug, Clone)]
pub enum ScanMode {
    /// Every live row; partition `p` is shard `p`.
    All,
    /// Only the rows with these keys (one row per key, key columns only);
    /// one partition.
    Keys(RecordBatch),
}

/// The live rows of a table (newest version per key, no tombstones) as of
/// snapshots of its shards taken when the plan was made: one partition
/// per shard (or per key range of a shard whose runs do not overlap),
/// each sorted by key, or a few keys looked up newest layer first.
#[derive(Debug)]
pub struct ScanExec {
    table: Arc<Table>,
    projection: Option<Vec<usize>>,
    mode: ScanMode,
    /// A full scan: one partition per part (a shard, or a key range of a
    /// shard whose runs do not overlap).
    parts: Vec<ScanPart>,
    /// Key lookups: by shard; `None` for shards no key is in.
    snapshots: Vec<Option<ShardSnapshot>>,
    properties: Arc<PlanProperties>,
}

impl ScanExec {
    /// A scan of `table` producing the columns `projection` (all if
    /// `None`); takes the snapshots it reads.
    pub async fn new(
        table: Arc<Table>,
        projection: Option<Vec<usize>>,
        mode: ScanMode,
        bounds: KeyBounds,
        target_partitions: usize,
    ) -> Result<Self> {
        let schema = match &projection {
            Some(p) => Arc::new(table.table_schema().schema.project(p)?),
            None => Arc::clone(&table.table_schema().schema),
        };
        let mut needed = vec![false; table.shard_count()];
        match &mode {
            ScanMode::All => needed.fill(true),
            ScanMode::Keys(keys) => {
                for row in 0..keys.num_rows() {
                    needed[table.shard_of(&keys.slice(row, 1))? as usize] = true;
                }
            }
        }
        let mut snapshots = Vec::with_capacity(needed.len());
        for (shard, needed) in needed.into_iter().enumerate() {
            snapshots.push(match needed {
                true => Some(table.snapshot(shard as u32, Duration::ZERO).await?),
                false => None,
            });
        }
        let mut parts = Vec::new();
        if let ScanMode::All = mode {
            // Shards are partitions; spare partitions split shards whose
            // runs are disjoint.
            let per_shard = target_partitions.div_ceil(snapshots.len()).max(1);
            for snapshot in std::mem::take(&mut snapshots).into_iter().flatten() {
                parts.extend(snapshot.parts(per_shard, &bounds).await?);
            }
        }
        let (partitions, ordering) = match mode {
            ScanMode::All => (parts.len(), key_ordering(&table, &schema)),
            ScanMode::Keys(_) => (1, None),
        };
        let equivalence = match ordering {
            Some(ordering) => {
                EquivalenceProperties::new_with_orderings(Arc::clone(&schema), [ordering])
            }
            None => EquivalenceProperties::new(Arc::clone(&schema)),
        };
        Ok(Self {
            properties: Arc::new(PlanProperties::new(
                equivalence,
                Partitioning::UnknownPartitioning(partitions),
                EmissionType::Incremental,
                Boundedness::Bounded,
            )),
            table,
            projection,
            mode,
            parts,
            snapshots,
        })
    }
}

/// Each shard's rows are sorted by key: the ordering, if the projection
/// keeps every key column.
fn key_ordering(table: &Table, projected: &SchemaRef) -> Option<Vec<PhysicalSortExpr>> {
    let schema = table.table_schema();
    if !schema.has_key() {
        return None;
    }
    schema
        .key
        .iter()
        .map(|&k| {
            let name = schema.schema.field(k).name();
            let at = projected.index_of(name).ok()?;
            Some(PhysicalSortExpr::new(
                Arc::new(Column::new(name, at)),
                SortOptions::new(false, false),
            ))
        })
        .collect()
}

impl DisplayAs for ScanExec {
    fn fmt_as(&self, _: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        match &self.mode {
            ScanMode::All => write!(f, "MemwalScanExec: shards={}", self.table.shard_count())?,
            ScanMode::Keys(keys) => write!(f, "MemwalScanExec: key lookups={}", keys.num_rows())?,
        }
        if let Some(p) = &self.projection {
            write!(f, ", projection={p:?}")?;
        }
        for (part, snapshot) in self.parts.iter().enumerate() {
            write!(f, ", part {part}: [{}]", snapshot.describe())?;
        }
        for (shard, snapshot) in self.snapshots.iter().enumerate() {
            if let Some(snapshot) = snapshot {
                write!(f, ", shard {shard}: [{}]", snapshot.describe())?;
            }
        }
        Ok(())
    }
}

impl ExecutionPlan for ScanExec {
    fn name(&self) -> &str {
        "MemwalScanExec"
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
        _: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
    ) -> Result<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }

    fn partition_statistics(&self, partition: Option<usize>) -> Result<Arc<Statistics>> {
        // Rows before de-duplication: an upper bound.
        let rows: u64 = match (&self.mode, partition) {
            (ScanMode::All, Some(p)) => self.parts[p].stored_rows(),
            (ScanMode::Keys(keys), _) => keys.num_rows() as u64,
            (ScanMode::All, None) => self.parts.iter().map(|s| s.stored_rows()).sum(),
        };
        let mut stats = Statistics::new_unknown(&self.schema());
        stats.num_rows = Precision::Inexact(rows as usize);
        Ok(Arc::new(stats))
    }

    fn execute(
        &self,
        partition: usize,
        ctx: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        let projection = self.projection.clone();
        match &self.mode {
            ScanMode::All => {
                let snapshot = self.parts[partition].clone();
                let pool = Arc::clone(ctx.memory_pool());
                let stream = async move { snapshot.scan(projection.as_deref(), &pool).await };
                Ok(Box::pin(RecordBatchStreamAdapter::new(
                    self.schema(),
                    futures::stream::once(stream)
                        .map_err(DataFusionError::from)
                        .try_flatten(),
                )))
            }
            ScanMode::Keys(keys) => {
                let table = Arc::clone(&self.table);
                let keys = keys.clone();
                let snapshots = self.snapshots.clone();
                let rows = async move {
                    let mut found = Vec::new();
                    for row in 0..keys.num_rows() {
                        let key = keys.slice(row, 1);
                        let shard = table.shard_of(&key)? as usize;
                        let snapshot = snapshots[shard].as_ref().expect("taken for this key");
                        if let Some(row) = table.get_in(snapshot, &key).await? {
                            found.push(match &projection {
                                Some(p) => row.project(p)?,
                                None => row,
                            });
                        }
                    }
                    Ok(found)
                };
                Ok(stream_of(self.schema(), rows))
            }
        }
    }
}

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
/// a DELETE is all or nothing per shard, across crashes.
#[derive(Debug)]
pub struct DeleteExec {
    table: Arc<Table>,
    /// Rows of the table to delete (at least its key columns, named as in
    /// the table).
    input: Arc<dyn ExecutionPlan>,
    properties: Arc<PlanProperties>,
}

impl DeleteExec {
    /// Deletes from `table` the rows `input` produces.
    pub fn new(table: Arc<Table>, input: Arc<dyn ExecutionPlan>) -> Self {
        Self {
            table,
            input,
            properties: properties(count_schema(), 1, EmissionType::Final),
        }
    }
}

impl DisplayAs for DeleteExec {
    fn fmt_as(&self, _: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "MemwalDeleteExec")
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
        Ok(Arc::new(Self::new(
            Arc::clone(&self.table),
            children.remove(0),
        )))
    }

    fn apply_expressions(
        &self,
        _: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
    ) -> Result<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }

    fn execute(
        &self,
        partition: usize,
        ctx: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        let table = Arc::clone(&self.table);
        let input = Arc::clone(&self.input);
        let schema = self.schema();
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
                false => table.delete_all(&keys).await?,
            };
            let count: ArrayRef = Arc::new(UInt64Array::from(vec![count]));
            Ok(vec![RecordBatch::try_new(count_schema(), vec![count])?])
        };
        let _ = partition;
        Ok(stream_of(schema, deleted))
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
