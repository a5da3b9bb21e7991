//! [`ScanExec`]: the live rows of a table, one partition per shard (or
//! key range of a shard) — the shard's layers merged by key, see
//! `crate::read` — or a few keys looked up. The snapshots are taken when
//! the plan is made; the reading happens in `execute()`.

use std::fmt;
use std::sync::Arc;

use datafusion::arrow::array::{RecordBatch, RecordBatchOptions};
use datafusion::arrow::compute::SortOptions;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::common::stats::Precision;
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::{DataFusionError, Statistics};
use datafusion::error::Result;
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_expr::expressions::Column;
use datafusion::physical_expr::{
    EquivalenceProperties, Partitioning, PhysicalExpr, PhysicalSortExpr,
};
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::metrics::{
    BaselineMetrics, ExecutionPlanMetricsSet, Metric, MetricValue, MetricsSet,
};
use datafusion::physical_plan::projection::ProjectionExec;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties};
use futures::{StreamExt, TryStreamExt};

use super::blob_size::blob_size_of;
use super::streams::{observed, stream_of};
use crate::read::{KeyBounds, ScanMetrics, ScanPart, ShardSnapshot};
use crate::sstable::ReadMetrics;
use crate::table::Table;

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
    /// Blob columns of the projection that the scan yields as the sizes of
    /// their values (`blob_size`, taken over from a projection above).
    sizes: Vec<usize>,
    /// A predicate over the projection that rows must pass before their
    /// blob values are read (a filter above applies it again).
    early: Option<Arc<dyn PhysicalExpr>>,
    mode: ScanMode,
    /// A full scan: one partition per part (a shard, or a key range of a
    /// shard whose runs do not overlap), with the shard it is of.
    parts: Vec<(u32, ScanPart)>,
    /// Key lookups: by shard; `None` for shards no key is in.
    snapshots: Vec<Option<ShardSnapshot>>,
    /// Whether each partition's rows come sorted by key.
    sorted: bool,
    /// The keys the query keeps (a filter above drops the others).
    bounds: KeyBounds,
    properties: Arc<PlanProperties>,
    /// The scan's metrics, and its merges' (reported as `merge_time` and
    /// `merged_rows`).
    metrics: ExecutionPlanMetricsSet,
    merge_metrics: ExecutionPlanMetricsSet,
}

impl ScanExec {
    /// This scan, dropping the rows `early` (over its output columns) does
    /// not keep before it reads their blob values.
    pub fn with_early_filter(mut self, early: Option<Arc<dyn PhysicalExpr>>) -> Self {
        self.early = early;
        self
    }

    /// A scan of `table` producing the columns `projection` (all if
    /// `None`); takes the snapshots it reads.
    pub async fn new(
        table: Arc<Table>,
        projection: Option<Vec<usize>>,
        mode: ScanMode,
        bounds: KeyBounds,
        target_partitions: usize,
        min_partitions: usize,
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
        let wanted = (0..needed.len() as u32).filter(|&s| needed[s as usize]);
        let mut taken = super::statement::snapshots(&table, wanted)
            .await?
            .into_iter();
        let mut snapshots: Vec<Option<ShardSnapshot>> = (needed.iter())
            .map(|&needed| needed.then(|| taken.next().expect("one per shard needed")))
            .collect();
        let mut parts = Vec::new();
        if let ScanMode::All = mode {
            // Shards are partitions; spare partitions split shards whose
            // runs are disjoint.
            let per_shard = target_partitions.div_ceil(snapshots.len()).max(1);
            for (shard, snapshot) in std::mem::take(&mut snapshots).into_iter().enumerate() {
                let snapshot = snapshot.expect("taken for every shard");
                // Reads the footers of the snapshot's SSTables.
                let shard_parts = match snapshot.parts(per_shard, &bounds).await {
                    Ok(shard_parts) => shard_parts,
                    Err(e) => return Err(table.explain_missing(shard as u32, e).await.into()),
                };
                for part in shard_parts {
                    parts.push((shard as u32, part));
                }
            }
            if let Some((shard, first)) = parts.first() {
                let filler = (*shard, ScanPart::empty(first.snapshot().clone()));
                parts.resize(parts.len().max(min_partitions), filler);
            }
        }
        let sorted = matches!(mode, ScanMode::All) && parts.iter().all(|(_, p)| p.sorted());
        Ok(Self::assemble(ScanPlan {
            table,
            schema,
            projection,
            sizes: Vec::new(),
            early: None,
            mode,
            parts,
            snapshots,
            sorted,
            bounds,
        }))
    }

    /// The scan `plan` describes, with fresh metrics.
    pub(crate) fn assemble(plan: ScanPlan) -> Self {
        let ScanPlan {
            table,
            schema,
            projection,
            sizes,
            early,
            mode,
            parts,
            snapshots,
            sorted,
            bounds,
        } = plan;
        let columns: Vec<usize> = match &projection {
            Some(p) => p.clone(),
            None => (0..table.table_schema().schema.fields().len()).collect(),
        };
        // Each part's rows are sorted by key: the ordering, if the output
        // has every key column (values, not sizes of values).
        let key = table.table_schema().key.iter().map(|&k| {
            let at = (columns.iter()).position(|&c| c == k && !sizes.contains(&c))?;
            Some(PhysicalSortExpr::new(
                Arc::new(Column::new(schema.field(at).name(), at)),
                SortOptions::new(false, false),
            ))
        });
        let ordering: Option<Vec<_>> = match table.table_schema().has_key() && sorted {
            true => key.collect(),
            false => None,
        };
        let equivalence = match ordering {
            Some(ordering) => {
                EquivalenceProperties::new_with_orderings(Arc::clone(&schema), [ordering])
            }
            None => EquivalenceProperties::new(Arc::clone(&schema)),
        };
        let partitions = match mode {
            ScanMode::All => parts.len(),
            ScanMode::Keys(_) => 1,
        };
        Self {
            properties: Arc::new(PlanProperties::new(
                equivalence,
                Partitioning::UnknownPartitioning(partitions),
                EmissionType::Incremental,
                Boundedness::Bounded,
            )),
            table,
            projection,
            sizes,
            early,
            mode,
            parts,
            snapshots,
            sorted,
            bounds,
            metrics: ExecutionPlanMetricsSet::new(),
            merge_metrics: ExecutionPlanMetricsSet::new(),
        }
    }

    /// What the scan is made of (see [`ScanExec::assemble`]).
    pub(crate) fn plan(&self) -> ScanPlan {
        ScanPlan {
            table: Arc::clone(&self.table),
            schema: self.schema(),
            projection: self.projection.clone(),
            sizes: self.sizes.clone(),
            early: self.early.clone(),
            mode: self.mode.clone(),
            parts: self.parts.clone(),
            snapshots: self.snapshots.clone(),
            sorted: self.sorted,
            bounds: self.bounds.clone(),
        }
    }
}

/// The fewest partitions a session plans a full scan or a vector search
/// in (a session config extension, see
/// [`crate::SessionBuilder::min_scan_tasks`]): partitions beyond the
/// table's own read nothing.
#[derive(Debug, Clone, Copy)]
pub(crate) struct MinPartitions(pub usize);

impl MinPartitions {
    /// The session's, or 1.
    pub(crate) fn of(config: &datafusion::prelude::SessionConfig) -> usize {
        config.get_extension::<Self>().map_or(1, |min| min.0)
    }
}

/// The pieces of a [`ScanExec`]: what it reads and yields, without its
/// metrics; what `crate::sql::distributed` ships to workers and splits into
/// tasks.
#[derive(Debug, Clone)]
pub(crate) struct ScanPlan {
    /// The table read.
    pub table: Arc<Table>,
    /// The output schema.
    pub schema: SchemaRef,
    /// The table columns yielded (all if `None`).
    pub projection: Option<Vec<usize>>,
    /// Blob columns of the projection yielded as the sizes of their values.
    pub sizes: Vec<usize>,
    /// See [`ScanExec::with_early_filter`].
    pub early: Option<Arc<dyn PhysicalExpr>>,
    /// A full scan or key lookups.
    pub mode: ScanMode,
    /// A full scan: one partition per part, with the shard it is of.
    pub parts: Vec<(u32, ScanPart)>,
    /// Key lookups: by shard; `None` for shards no key is in.
    pub snapshots: Vec<Option<ShardSnapshot>>,
    /// Whether each partition's rows come sorted by key (then every part's
    /// are).
    pub sorted: bool,
    /// The keys the query keeps, of a one-column key: rows outside may be
    /// left out (a filter above drops them).
    pub bounds: KeyBounds,
}

impl DisplayAs for ScanExec {
    fn fmt_as(&self, format: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        if let DisplayFormatType::TreeRender = format {
            match &self.mode {
                ScanMode::All => {
                    writeln!(f, "shards={}", self.table.shard_count())?;
                    writeln!(f, "partitions={}", self.parts.len())?;
                }
                ScanMode::Keys(keys) => writeln!(f, "key_lookups={}", keys.num_rows())?,
            }
            if let Some(p) = &self.projection {
                writeln!(f, "projection={p:?}")?;
            }
            if !self.sizes.is_empty() {
                writeln!(f, "sizes_of={:?}", self.sizes)?;
            }
            return Ok(());
        }
        match &self.mode {
            ScanMode::All => write!(f, "MemwalScanExec: shards={}", self.table.shard_count())?,
            ScanMode::Keys(keys) => write!(f, "MemwalScanExec: key lookups={}", keys.num_rows())?,
        }
        if let Some(p) = &self.projection {
            write!(f, ", projection={p:?}")?;
        }
        if !self.sizes.is_empty() {
            write!(f, ", sizes of={:?}", self.sizes)?;
        }
        if let Some(early) = &self.early {
            write!(f, ", before blobs: {early}")?;
        }
        for (part, (_, snapshot)) in self.parts.iter().enumerate() {
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

    fn metrics(&self) -> Option<MetricsSet> {
        let mut metrics = self.metrics.clone_inner();
        for merge in self.merge_metrics.clone_inner().iter() {
            let value = match merge.value() {
                MetricValue::ElapsedCompute(time) => MetricValue::Time {
                    name: "merge_time".into(),
                    time: time.clone(),
                },
                MetricValue::OutputRows(rows) => MetricValue::Count {
                    name: "merged_rows".into(),
                    count: rows.clone(),
                },
                _ => continue,
            };
            metrics.push(Arc::new(Metric::new(value, merge.partition())));
        }
        Some(metrics)
    }

    /// Takes over a projection of columns and `blob_size(<blob column>)`
    /// calls (a full scan only): the sizes then come from descriptors, and
    /// no pack is read for them.
    fn try_swapping_with_projection(
        &self,
        projection: &ProjectionExec,
    ) -> Result<Option<Arc<dyn ExecutionPlan>>> {
        // Sizes are taken over once: a projection above them would see
        // sizes where this code expects values.
        if !self.sizes.is_empty() {
            return Ok(None);
        }
        let schema = self.table.table_schema();
        let current: Vec<usize> = match &self.projection {
            Some(p) => p.clone(),
            None => (0..schema.schema.fields().len()).collect(),
        };
        let (mut columns, mut sizes, mut plain) = (Vec::new(), Vec::new(), Vec::new());
        for item in projection.expr() {
            if let Some(column) = item.expr.downcast_ref::<Column>() {
                plain.push(current[column.index()]);
                columns.push(current[column.index()]);
            } else if let Some(column) = blob_size_of(&item.expr)
                && schema
                    .blobs
                    .iter()
                    .any(|b| b.index == current[column.index()])
            {
                sizes.push(current[column.index()]);
                columns.push(current[column.index()]);
            } else {
                return Ok(None);
            }
        }
        // A column both read and measured is read; nothing to take over.
        if sizes.is_empty() || sizes.iter().any(|c| plain.contains(c)) {
            return Ok(None);
        }
        Ok(Some(Arc::new(Self::assemble(ScanPlan {
            projection: Some(columns),
            sizes,
            // It was over the columns the projection replaced.
            early: None,
            schema: projection.schema(),
            ..self.plan()
        }))))
    }

    fn partition_statistics(&self, partition: Option<usize>) -> Result<Arc<Statistics>> {
        // Rows before de-duplication: an upper bound.
        let rows: u64 = match (&self.mode, partition) {
            (ScanMode::All, Some(p)) => self.parts[p].1.stored_rows(),
            (ScanMode::Keys(keys), _) => keys.num_rows() as u64,
            (ScanMode::All, None) => self.parts.iter().map(|(_, p)| p.stored_rows()).sum(),
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
        let baseline = BaselineMetrics::new(&self.metrics, partition);
        let rows: SendableRecordBatchStream = match &self.mode {
            ScanMode::All => {
                let snapshot = self.parts[partition].1.clone();
                // Held to the stream's end: the writer of this process
                // deletes no SSTable of a snapshot still held.
                let held = snapshot.clone();
                let pool = Arc::clone(ctx.memory_pool());
                let metrics = ScanMetrics::new(&self.metrics, &self.merge_metrics, partition);
                let (sizes, early) = (self.sizes.clone(), self.early.clone());
                let stream = async move {
                    let projection = projection.as_deref();
                    let (sizes, early) = (&sizes, early.as_ref());
                    snapshot
                        .scan_sizes(projection, sizes, early, &pool, &metrics)
                        .await
                };
                let batches = futures::stream::once(stream)
                    .map_err(DataFusionError::from)
                    .try_flatten()
                    .inspect(move |_| {
                        let _held = &held;
                    });
                if self.sizes.is_empty() {
                    Box::pin(RecordBatchStreamAdapter::new(self.schema(), batches))
                } else {
                    // A projection taken over names its columns: the plan's
                    // names on the scan's columns.
                    let schema = self.schema();
                    let named = move |batch: RecordBatch| {
                        let options =
                            RecordBatchOptions::new().with_row_count(Some(batch.num_rows()));
                        let columns = batch.columns().to_vec();
                        RecordBatch::try_new_with_options(Arc::clone(&schema), columns, &options)
                    };
                    Box::pin(RecordBatchStreamAdapter::new(
                        self.schema(),
                        batches.and_then(move |b| std::future::ready(named(b).map_err(Into::into))),
                    ))
                }
            }
            ScanMode::Keys(keys) => {
                let table = Arc::clone(&self.table);
                let keys = keys.clone();
                let snapshots = self.snapshots.clone();
                let metrics = ReadMetrics::new(&self.metrics, partition);
                let (schema, sizes) = (self.schema(), self.sizes.clone());
                let columns = projection
                    .unwrap_or_else(|| (0..table.table_schema().schema.fields().len()).collect());
                let rows = async move {
                    let mut found = Vec::new();
                    let one = RecordBatchOptions::new().with_row_count(Some(1));
                    for row in 0..keys.num_rows() {
                        let key = keys.slice(row, 1);
                        let shard = table.shard_of(&key)? as usize;
                        let snapshot = snapshots[shard].as_ref().expect("taken for this key");
                        let read = (columns.as_slice(), sizes.as_slice());
                        if let Some(row) = table.get_in(snapshot, &key, read, &metrics).await? {
                            let row =
                                RecordBatch::try_new_with_options(Arc::clone(&schema), row, &one)?;
                            found.push(row);
                        }
                    }
                    Ok(found)
                };
                stream_of(self.schema(), rows)
            }
        };
        // Every shard of a dropped table is sealed before its data goes:
        // any shard tells.
        let shard = self.parts.get(partition).map_or(0, |(shard, _)| *shard);
        let rows = explain_missing(rows, Arc::clone(&self.table), shard);
        Ok(observed(rows, baseline))
    }
}

/// `rows`, with an object found missing because the table was dropped
/// while the statement read it, or an SSTable replaced and deleted
/// meanwhile, reported as that (see [`Table::explain_missing`]).
pub(super) fn explain_missing(
    rows: SendableRecordBatchStream,
    table: Arc<Table>,
    shard: u32,
) -> SendableRecordBatchStream {
    let schema = rows.schema();
    let rows = rows.then(move |item| {
        // Only an error needs the table.
        let table = item.is_err().then(|| Arc::clone(&table));
        async move {
            let Some(table) = table else {
                return item;
            };
            let Err(DataFusionError::External(e)) = item else {
                return item;
            };
            match e.downcast::<crate::Error>() {
                Ok(e) => Err(table.explain_missing(shard, *e).await.into()),
                Err(e) => Err(DataFusionError::External(e)),
            }
        }
    });
    Box::pin(RecordBatchStreamAdapter::new(schema, rows))
}
