//! memwal across DataFusion's FFI (`datafusion-ffi`): the catalog, one
//! table and `vector_search` as the C-ABI structs that another build of
//! DataFusion 55 loads. datafusion-python does, through PyCapsules (the
//! `python/` package wraps these functions).
//!
//! The other side polls our futures on its own executor, where this
//! library's tokio finds no runtime. Every call it makes is therefore run
//! inside `runtime` (entered while a future is polled), so the writers'
//! tasks, timers and object-store I/O live on memwal's runtime whoever
//! drives the query. DELETE is not forwarded by DataFusion 55's FFI; use
//! [`crate::Table::delete`] or SQL through [`MemwalSession`].

use std::fmt;
use std::future::Future;
use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::catalog::{
    CatalogProvider, SchemaProvider, Session, TableFunctionArgs, TableFunctionImpl,
};
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::{Constraints, Statistics, TableReference};
use datafusion::datasource::{TableProvider, TableType};
use datafusion::error::Result as DfResult;
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::logical_expr::dml::InsertOp;
use datafusion::logical_expr::{Expr, LogicalPlan, TableProviderFilterPushDown};
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_plan::ChildrenPropertiesMode::Recompute;
use datafusion::physical_plan::execution_plan::EmissionType;
use datafusion::physical_plan::metrics::MetricsSet;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, ExecutionPlanProperties,
    InputDistributionRequirements, PlanProperties, ReplaceChildrenOptions,
};
use datafusion_ffi::catalog_provider::FFI_CatalogProvider;
use datafusion_ffi::proto::logical_extension_codec::FFI_LogicalExtensionCodec;
use datafusion_ffi::table_provider::{FFI_TableProvider, ForeignTableProvider};
use datafusion_ffi::udtf::FFI_TableFunction;
use tokio::runtime::Handle;

use crate::catalog::{Catalog, ObjectPath, ObjectType};
use crate::error::{Error, Result};
use crate::sql::{
    CATALOG_NAME, MemwalSession, namespace_to_schema, plan_properties, schema_to_namespace,
    table_path,
};

/// The session's catalog (namespaces as schemas, tables with INSERT) for
/// a foreign session whose logical codec is `codec`; every call runs on
/// `runtime`. Loads the catalog first if the session has not.
pub async fn catalog_provider(
    session: &MemwalSession,
    runtime: Handle,
    codec: FFI_LogicalExtensionCodec,
) -> Result<FFI_CatalogProvider> {
    let catalog = session.catalog().await?;
    let provider = session
        .context()
        .catalog(CATALOG_NAME)
        .expect("registered when the catalog loads");
    let provider: Arc<dyn CatalogProvider> = Arc::new(CatalogOnRuntime {
        inner: OnRuntime::new(provider, &runtime),
        catalog,
    });
    Ok(FFI_CatalogProvider::new_with_ffi_codec(
        provider,
        Some(runtime),
        codec,
    ))
}

/// The table `name` (dotted, as [`MemwalSession::table`] takes it) as a
/// provider for a foreign session whose logical codec is `codec`.
pub async fn table_provider(
    session: &MemwalSession,
    name: &str,
    runtime: Handle,
    codec: FFI_LogicalExtensionCodec,
) -> Result<FFI_TableProvider> {
    // The catalog provider's lookup refreshes the catalog on a miss.
    let path = table_path(name)?;
    let reference = TableReference::full(
        CATALOG_NAME,
        namespace_to_schema(&path.parent()),
        path.name(),
    );
    let table =
        session
            .context()
            .table_provider(reference)
            .await
            .map_err(|e| match Error::from(e) {
                // DataFusion's "no table named": ours, worded as memwal's.
                Error::DataFusion(_) => Error::NotFound(format!("table {name}")),
                ours => ours,
            })?;
    let table: Arc<dyn TableProvider> = Arc::new(OnRuntime::new(table, &runtime));
    Ok(FFI_TableProvider::new_with_ffi_codec(
        table,
        true,
        Some(runtime),
        codec,
    ))
}

/// `vector_search(table, column, query, k [, ef])` over the session's
/// catalog, for a foreign session whose logical codec is `codec`.
pub async fn vector_search(
    session: &MemwalSession,
    runtime: Handle,
    codec: FFI_LogicalExtensionCodec,
) -> Result<FFI_TableFunction> {
    session.catalog().await?;
    let function = session
        .context()
        .state()
        .table_functions()
        .get("vector_search")
        .map(|f| Arc::clone(f.function()))
        .expect("registered when the catalog loads");
    let search = Arc::new(SearchOnRuntime {
        inner: OnRuntime::new(function, &runtime),
        codec: codec.clone(),
    });
    Ok(FFI_TableFunction::new_with_ffi_codec(
        search,
        Some(runtime),
        codec,
    ))
}

/// `vector_search` on the runtime. DataFusion 55's FFI exports a table
/// function's result without filter pushdown, so a `WHERE` would filter
/// the k nearest rows instead of searching the rows that match (fewer
/// than k rows back). The result is therefore exported here, with
/// pushdown, and handed over as already foreign, which the FFI passes on
/// as it is.
#[derive(Debug)]
struct SearchOnRuntime {
    inner: OnRuntime<dyn TableFunctionImpl>,
    codec: FFI_LogicalExtensionCodec,
}

impl TableFunctionImpl for SearchOnRuntime {
    fn call_with_args(&self, args: TableFunctionArgs) -> DfResult<Arc<dyn TableProvider>> {
        let runtime = &self.inner.runtime;
        let _entered = runtime.enter();
        let table = self.inner.inner.call_with_args(args)?;
        let table: Arc<dyn TableProvider> = Arc::new(self.inner.wrap(table));
        let exported = FFI_TableProvider::new_with_ffi_codec(
            table,
            true,
            Some(runtime.clone()),
            self.codec.clone(),
        );
        Ok(Arc::new(ForeignTableProvider(exported)))
    }
}

/// A provider whose every call runs inside `runtime`, and whose results
/// (schemas, tables) do too.
#[derive(Debug)]
struct OnRuntime<T: ?Sized> {
    inner: Arc<T>,
    runtime: Handle,
}

impl<T: ?Sized> OnRuntime<T> {
    fn new(inner: Arc<T>, runtime: &Handle) -> Self {
        Self {
            inner,
            runtime: runtime.clone(),
        }
    }

    fn wrap<U: ?Sized>(&self, inner: Arc<U>) -> OnRuntime<U> {
        OnRuntime::new(inner, &self.runtime)
    }

    /// `future`, polled inside the runtime.
    fn on<F: Future>(&self, future: F) -> impl Future<Output = F::Output> {
        let runtime = self.runtime.clone();
        let mut future = Box::pin(future);
        std::future::poll_fn(move |cx| {
            let _entered = runtime.enter();
            future.as_mut().poll(cx)
        })
    }
}

/// A plan (INSERT's `DataSinkExec`) whose input is kept to one partition,
/// as it requires: a foreign session's optimizer does not see that
/// requirement (DataFusion 55's FFI does not carry
/// `required_input_distribution`), spread the input over partitions
/// round-robin, and the sink, which reads the first, lost every other
/// batch of an `INSERT ... SELECT` without an error. Inputs with more
/// than one partition are merged inside this plan: the foreign side sees
/// its own inputs as the children (a merge it saw would be planned and
/// run as a foreign plan, off memwal's runtime).
#[derive(Debug)]
struct OneInputPartition {
    /// The plan, its inputs merged.
    plan: Arc<dyn ExecutionPlan>,
    /// The inputs as given.
    inputs: Vec<Arc<dyn ExecutionPlan>>,
}

impl OneInputPartition {
    fn wrap(plan: Arc<dyn ExecutionPlan>) -> DfResult<Arc<dyn ExecutionPlan>> {
        let inputs: Vec<_> = plan.children().into_iter().cloned().collect();
        let spread = |c: &Arc<dyn ExecutionPlan>| c.output_partitioning().partition_count() > 1;
        let plan = match inputs.iter().any(spread) {
            true => {
                let merged = inputs.iter().cloned().map(merged).collect();
                plan.replace_children(merged, ReplaceChildrenOptions::new(Recompute))?
            }
            false => plan,
        };
        Ok(Arc::new(Self { plan, inputs }))
    }
}

/// `plan` with one output partition.
fn merged(plan: Arc<dyn ExecutionPlan>) -> Arc<dyn ExecutionPlan> {
    match plan.output_partitioning().partition_count() > 1 {
        true => Arc::new(Merged::new(plan)),
        false => plan,
    }
}

/// The partitions of a foreign plan as one, polled in the task that polls
/// this plan's stream. DataFusion's `CoalescePartitionsExec` would poll
/// them on tasks of memwal's runtime, where the foreign plan's operators
/// (a `RepartitionExec` that spawns on first poll) find no runtime of
/// their own.
#[derive(Debug)]
struct Merged {
    input: Arc<dyn ExecutionPlan>,
    properties: Arc<PlanProperties>,
}

impl Merged {
    fn new(input: Arc<dyn ExecutionPlan>) -> Self {
        let properties = plan_properties(input.schema(), 1, EmissionType::Incremental);
        Self { input, properties }
    }
}

impl DisplayAs for Merged {
    fn fmt_as(&self, _: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "MemwalMergedInput")
    }
}

impl ExecutionPlan for Merged {
    fn name(&self) -> &str {
        "MemwalMergedInput"
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
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        Ok(Arc::new(Self::new(children.remove(0))))
    }

    fn apply_expressions(
        &self,
        _: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> DfResult<TreeNodeRecursion>,
    ) -> DfResult<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }

    fn execute(
        &self,
        _partition: usize,
        context: Arc<TaskContext>,
    ) -> DfResult<SendableRecordBatchStream> {
        let parts = self.input.output_partitioning().partition_count();
        let streams = (0..parts)
            .map(|p| self.input.execute(p, Arc::clone(&context)))
            .collect::<DfResult<Vec<_>>>()?;
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            self.input.schema(),
            futures::stream::select_all(streams),
        )))
    }
}

impl DisplayAs for OneInputPartition {
    fn fmt_as(&self, format: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        self.plan.fmt_as(format, f)
    }
}

impl ExecutionPlan for OneInputPartition {
    fn name(&self) -> &str {
        self.plan.name()
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        self.plan.properties()
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        self.inputs.iter().collect()
    }

    fn replace_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
        options: ReplaceChildrenOptions,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        Self::wrap(Arc::clone(&self.plan).replace_children(children, options)?)
    }

    fn with_new_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        self.replace_children(children, ReplaceChildrenOptions::new(Recompute))
    }

    fn input_distribution_requirements(&self) -> InputDistributionRequirements {
        self.plan.input_distribution_requirements()
    }

    fn apply_expressions(
        &self,
        f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> DfResult<TreeNodeRecursion>,
    ) -> DfResult<TreeNodeRecursion> {
        self.plan.apply_expressions(f)
    }

    fn metrics(&self) -> Option<MetricsSet> {
        self.plan.metrics()
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> DfResult<SendableRecordBatchStream> {
        self.plan.execute(partition, context)
    }
}

/// The catalog on the runtime. Unlike memwal's own session, which plans
/// DDL itself, a foreign session plans `CREATE SCHEMA` and `DROP TABLE`
/// from what the provider answers; so a schema is answered only for a
/// namespace that exists (after a refresh of the catalog), and the DDL
/// reaches memwal's refusal, which names the way to run it.
#[derive(Debug)]
struct CatalogOnRuntime {
    inner: OnRuntime<dyn CatalogProvider>,
    catalog: Arc<Catalog>,
}

impl CatalogOnRuntime {
    fn namespace_exists(&self, path: &ObjectPath) -> bool {
        let known = |catalog: &Catalog| {
            path.is_root()
                || catalog
                    .snapshot()
                    .get(path)
                    .is_some_and(|e| e.object_type == ObjectType::Namespace)
        };
        if known(&self.catalog) {
            return true;
        }
        // Made by another process since? This call is synchronous and on
        // the other side's thread: refresh on a thread of our own.
        let (catalog, runtime) = (&self.catalog, &self.inner.runtime);
        let refreshed = std::thread::scope(|s| {
            s.spawn(|| runtime.block_on(catalog.refresh()))
                .join()
                .is_ok_and(|r| r.is_ok())
        });
        refreshed && known(&self.catalog)
    }
}

impl CatalogProvider for CatalogOnRuntime {
    fn schema_names(&self) -> Vec<String> {
        let _entered = self.inner.runtime.enter();
        self.inner.inner.schema_names()
    }

    fn schema(&self, name: &str) -> Option<Arc<dyn SchemaProvider>> {
        let path = schema_to_namespace(name).ok()?;
        if !self.namespace_exists(&path) {
            return None;
        }
        let _entered = self.inner.runtime.enter();
        let schema = self.inner.inner.schema(name)?;
        Some(Arc::new(self.inner.wrap(schema)))
    }

    fn register_schema(
        &self,
        name: &str,
        schema: Arc<dyn SchemaProvider>,
    ) -> DfResult<Option<Arc<dyn SchemaProvider>>> {
        self.inner.inner.register_schema(name, schema)
    }

    fn deregister_schema(
        &self,
        name: &str,
        cascade: bool,
    ) -> DfResult<Option<Arc<dyn SchemaProvider>>> {
        self.inner.inner.deregister_schema(name, cascade)
    }
}

#[async_trait]
impl SchemaProvider for OnRuntime<dyn SchemaProvider> {
    fn table_names(&self) -> Vec<String> {
        let _entered = self.runtime.enter();
        self.inner.table_names()
    }

    async fn table(&self, name: &str) -> DfResult<Option<Arc<dyn TableProvider>>> {
        let table = self.on(self.inner.table(name)).await?;
        Ok(table.map(|t| Arc::new(self.wrap(t)) as Arc<dyn TableProvider>))
    }

    fn table_exist(&self, name: &str) -> bool {
        let _entered = self.runtime.enter();
        self.inner.table_exist(name)
    }

    fn register_table(
        &self,
        name: String,
        table: Arc<dyn TableProvider>,
    ) -> DfResult<Option<Arc<dyn TableProvider>>> {
        self.inner.register_table(name, table)
    }

    fn deregister_table(&self, name: &str) -> DfResult<Option<Arc<dyn TableProvider>>> {
        self.inner.deregister_table(name)
    }
}

#[async_trait]
impl TableProvider for OnRuntime<dyn TableProvider> {
    fn schema(&self) -> SchemaRef {
        self.inner.schema()
    }

    fn constraints(&self) -> Option<&Constraints> {
        self.inner.constraints()
    }

    fn table_type(&self) -> TableType {
        self.inner.table_type()
    }

    fn get_logical_plan(&self) -> Option<std::borrow::Cow<'_, LogicalPlan>> {
        self.inner.get_logical_plan()
    }

    fn get_column_default(&self, column: &str) -> Option<&Expr> {
        self.inner.get_column_default(column)
    }

    async fn scan(
        &self,
        state: &dyn Session,
        projection: Option<&Vec<usize>>,
        filters: &[Expr],
        limit: Option<usize>,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        self.on(self.inner.scan(state, projection, filters, limit))
            .await
    }

    fn supports_filters_pushdown(
        &self,
        filters: &[&Expr],
    ) -> DfResult<Vec<TableProviderFilterPushDown>> {
        self.inner.supports_filters_pushdown(filters)
    }

    fn statistics(&self) -> Option<Statistics> {
        self.inner.statistics()
    }

    async fn insert_into(
        &self,
        state: &dyn Session,
        input: Arc<dyn ExecutionPlan>,
        insert_op: InsertOp,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        let plan = self
            .on(self.inner.insert_into(state, input, insert_op))
            .await?;
        OneInputPartition::wrap(plan)
    }

    async fn delete_from(
        &self,
        state: &dyn Session,
        filters: Vec<Expr>,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        self.on(self.inner.delete_from(state, filters)).await
    }

    async fn truncate(&self, state: &dyn Session) -> DfResult<Arc<dyn ExecutionPlan>> {
        self.on(self.inner.truncate(state)).await
    }
}
