//! [`MemwalSession`]: a DataFusion `SessionContext` with the memwal catalog
//! registered as the default catalog, plus the DDL DataFusion cannot run.
//!
//! A session opens even when its catalog cannot be loaded (a corrupt newest
//! version, an unreachable store): statements that do not touch the
//! catalog (`SELECT 1`, `SET`, `SHOW <variable>`) still run, and every
//! statement that does (names a table, runs DDL, lists tables) fails with
//! the error that kept the catalog from loading. Loading is retried before
//! each statement, so a repaired catalog is picked up.

use std::sync::Arc;

use datafusion::catalog::TableProvider;
use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
use datafusion::dataframe::DataFrame;
use datafusion::datasource::{provider_as_source, source_as_provider};
use datafusion::error::DataFusionError;
use datafusion::execution::{SessionState, SessionStateBuilder};
use datafusion::logical_expr::{
    DmlStatement, Expr, LogicalPlan, LogicalPlanBuilder, Statement, WriteOp,
};
use datafusion::physical_planner::{DefaultPhysicalPlanner, PhysicalPlanner};
use datafusion::prelude::{SessionConfig, SessionContext};
use datafusion::sql::parser::{DFParser, Statement as DFStatement};
use datafusion::sql::sqlparser::ast::{Statement as SqlStatement, TableFactor};
use datafusion::sql::sqlparser::dialect::dialect_from_str;
use tokio::sync::OnceCell;

use super::blob_size::{BlobSizePushdown, NullChecksBySize, blob_size_function};
use super::catalog_provider::MemwalCatalogProvider;
use datafusion::common::config::ConfigExtension;

use super::config::MemwalConfig;
use super::delete_exec::{DeleteExec, PlannedStatement};
use super::files::FileAccess;
use super::insert_sink::InsertProgress;
use super::prepared_delete::PreparedDeletes;
use super::scan_exec::MinPartitions;
use super::statement::{StatementPlanner, one_statement};
use super::stats::StatsFunction;
use super::table::{MemwalTable, update_refused};
use super::vector::{VectorSearchFunction, distance_functions};
use super::{CATALOG_NAME, ROOT_SCHEMA, ddl, delete_alias, describe, insert_checks};
use crate::catalog::{Catalog, CatalogOptions, ObjectPath};
use crate::error::{Error, Result};
use crate::store::ObjectRoot;
use crate::table::{Table, TableCache, seal_dropped};
use crate::writer::WriterOptions;

/// How long a table's data must have been untouched before a sweep deletes
/// it when the catalog no longer names it (tables dropped by this session
/// are deleted at once).
const DROPPED_TABLE_GRACE: std::time::Duration = std::time::Duration::from_secs(600);

/// A SQL session over one root. Plain DataFusion for queries; memwal runs
/// `CREATE/DROP SCHEMA` and `CREATE/DROP TABLE` (with `WITH (...)`
/// options, and `AS SELECT`) itself and persists them in the catalog, and
/// answers `SHOW CREATE TABLE` and `DESCRIBE` for its tables. Before each
/// statement the catalog catches up with changes made elsewhere.
///
/// Files outside the root's tables are off limits unless the session was
/// opened with [`SessionBuilder::allow_file_access`]; writes inside the
/// root are refused either way (see `files.rs`).
#[derive(Clone)]
pub struct MemwalSession {
    ctx: SessionContext,
    root: ObjectRoot,
    catalog: Arc<OnceCell<Arc<Catalog>>>,
    tables: Arc<TableCache>,
    /// The writer options the session opened with: what `RESET
    /// memwal.<option>` goes back to.
    opened_with: WriterOptions,
    files: FileAccess,
    /// Shared by clones, like the prepared statements of `ctx`.
    prepared_deletes: Arc<PreparedDeletes>,
}

impl std::fmt::Debug for MemwalSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemwalSession")
            .field("root", &self.root.url())
            .field("catalog", &self.catalog.get())
            .finish()
    }
}

/// How to open a [`MemwalSession`]; made by [`MemwalSession::builder`].
#[derive(Debug, Clone)]
pub struct SessionBuilder {
    location: String,
    writer: WriterOptions,
    file_access: bool,
    progress: Option<Arc<InsertProgress>>,
    workers: Vec<url::Url>,
    min_scan_tasks: usize,
    store_timeout: std::time::Duration,
}

impl SessionBuilder {
    /// Runs queries across the `memwal worker` processes at `workers`
    /// (default: none, every query runs in this process); see
    /// [`super::distributed`]. Every worker must serve this session's root.
    /// A URL other than `http://host:port` fails [`SessionBuilder::open`].
    #[cfg(feature = "distributed")]
    pub fn workers(mut self, workers: Vec<url::Url>) -> Self {
        self.workers = workers;
        self
    }

    /// Plans every full scan and `vector_search` in at least `tasks`
    /// partitions (default 1), the ones beyond the table's own reading
    /// nothing: with two [`SessionBuilder::workers`] or more, even a scan
    /// of one part then runs on a worker (the coordinator only gathers),
    /// where otherwise a plan of one task stays in this process. Key
    /// lookups stay one task; a search that selects a blob column reads
    /// its values in one of its tasks.
    #[cfg(feature = "distributed")]
    pub fn min_scan_tasks(mut self, tasks: usize) -> Self {
        self.min_scan_tasks = tasks;
        self
    }

    /// The options the session's tables write with (default:
    /// [`WriterOptions::default`]).
    pub fn writer_options(mut self, options: WriterOptions) -> Self {
        self.writer = options;
        self
    }

    /// Requests to an `s3://` root fail once they have not succeeded within
    /// about this long, retries included (default 60 s; see
    /// [`ObjectRoot::open_with_timeout`]).
    pub fn store_timeout(mut self, timeout: std::time::Duration) -> Self {
        self.store_timeout = timeout;
        self
    }

    /// Lets SQL read and write files that are not memwal tables (default:
    /// off): `SELECT ... FROM '<path or URL>'` (DataFusion's URL tables),
    /// `COPY ... TO` and `INSERT INTO '<path>'`. Writes inside the root are
    /// refused even so. The `memwal` shell turns this on; an application
    /// embedding memwal should only if its SQL comes from someone allowed
    /// to touch the machine's files.
    pub fn allow_file_access(mut self, allow: bool) -> Self {
        self.file_access = allow;
        self
    }

    /// Calls `report(rows, elapsed)` about once a second while an `INSERT`
    /// of this session runs longer than a second (the shell prints it).
    pub fn on_insert_progress(
        mut self,
        report: impl Fn(u64, std::time::Duration) + Send + Sync + 'static,
    ) -> Self {
        self.progress = Some(Arc::new(InsertProgress(Box::new(report))));
        self
    }

    /// Opens the root (see [`ObjectRoot::open`]) and starts the session.
    /// Sessions opened on the same root with the same writer options in one
    /// process share their table handles, so a table has one writer per
    /// shard in the process however many sessions write it. The catalog
    /// is loaded by the first statement that uses it (or by
    /// [`MemwalSession::catalog`]), so one that cannot be loaded does not
    /// fail the open (see the module doc); a root that cannot be opened
    /// does.
    pub async fn open(self) -> Result<MemwalSession> {
        #[cfg(feature = "distributed")]
        for url in &self.workers {
            super::distributed::check_worker_url(url)?;
        }
        let root = ObjectRoot::open_with_timeout(&self.location, self.store_timeout)?;
        let tables = TableCache::shared(root.url(), self.writer.clone());
        let session = MemwalSession::with_tables(
            root,
            tables,
            self.writer,
            self.file_access,
            self.progress,
            self.workers,
        );
        if self.min_scan_tasks > 1 {
            let state = session.ctx.state_ref();
            let mut state = state.write();
            state
                .config_mut()
                .set_extension(Arc::new(MinPartitions(self.min_scan_tasks)));
        }
        Ok(session)
    }
}

/// The scalar functions memwal adds to DataFusion's: the distances,
/// `blob_size`, and the checks of inserted rows.
pub(crate) fn memwal_functions() -> Vec<datafusion::logical_expr::ScalarUDF> {
    let mut functions = distance_functions();
    functions.push(blob_size_function());
    functions.extend(insert_checks::check_functions());
    functions
}

impl MemwalSession {
    /// How to open a session on the root at `location`, for options beyond
    /// [`MemwalSession::open`]'s.
    pub fn builder(location: &str) -> SessionBuilder {
        SessionBuilder {
            location: location.to_string(),
            writer: WriterOptions::default(),
            file_access: false,
            progress: None,
            workers: Vec::new(),
            min_scan_tasks: 1,
            store_timeout: crate::store::DEFAULT_STORE_TIMEOUT,
        }
    }

    /// Opens the root at `location` with default options (no file access).
    pub async fn open(location: &str) -> Result<Self> {
        Self::builder(location).open().await
    }

    /// Opens the root at `location`; tables write with `options` (no file
    /// access).
    pub async fn open_with(location: &str, options: WriterOptions) -> Result<Self> {
        Self::builder(location).writer_options(options).open().await
    }

    /// A session over an open catalog with table handles of its own: its
    /// writers behave like another process's (a write through it fences the
    /// writers of other sessions on the same tables). No file access.
    pub fn new(catalog: Arc<Catalog>, options: WriterOptions) -> Self {
        let session = Self::with_tables(
            catalog.root().clone(),
            Arc::new(TableCache::new(options.clone())),
            options,
            false,
            None,
            Vec::new(),
        );
        session.register(&catalog);
        session
            .catalog
            .set(catalog)
            .expect("a new session has no catalog yet");
        session
    }

    fn with_tables(
        root: ObjectRoot,
        tables: Arc<TableCache>,
        opened_with: WriterOptions,
        file_access: bool,
        progress: Option<Arc<InsertProgress>>,
        workers: Vec<url::Url>,
    ) -> Self {
        let mut config = SessionConfig::new()
            .with_information_schema(true)
            .with_create_default_catalog_and_schema(false)
            .with_default_catalog_and_schema(CATALOG_NAME, ROOT_SCHEMA)
            .with_option_extension(MemwalConfig {
                writer: tables.options(),
            });
        if let Some(progress) = progress {
            config = config.with_extension(progress);
        }
        // DataFusion's defaults, and `blob_size` (null checks of binary
        // columns too) answered by scans.
        let state = SessionStateBuilder::new()
            .with_config(config)
            .with_default_features()
            .with_query_planner(Arc::new(StatementPlanner))
            .with_analyzer_rule(Arc::new(NullChecksBySize))
            .with_physical_optimizer_rule(Arc::new(BlobSizePushdown));
        #[cfg(feature = "distributed")]
        let state = match workers.is_empty() {
            true => state,
            false => {
                let store = Arc::clone(root.store());
                let codec = super::distributed::MemwalCodec::new(store, Arc::clone(&tables));
                super::distributed::coordinate(state, workers, codec)
            }
        };
        #[cfg(not(feature = "distributed"))]
        let _ = workers;
        let mut ctx = SessionContext::new_with_state(state.build());
        for function in memwal_functions() {
            ctx.register_udf(function);
        }
        let files = FileAccess::new(&root, file_access);
        if files.allowed() {
            // `SELECT ... FROM 'path/'` reads files, an SSTable directory
            // included (SSTables are plain Parquet).
            ctx = ctx.enable_url_table();
        }
        Self {
            ctx,
            root,
            catalog: Arc::new(OnceCell::new()),
            opened_with,
            prepared_deletes: Arc::default(),
            tables,
            files,
        }
    }

    /// Registers what needs the loaded catalog: the catalog provider,
    /// `vector_search` and `memwal_stats`.
    fn register(&self, catalog: &Arc<Catalog>) {
        self.ctx.register_catalog(
            CATALOG_NAME,
            Arc::new(MemwalCatalogProvider::new(
                Arc::clone(catalog),
                Arc::clone(&self.tables),
            )),
        );
        self.ctx.register_udtf(
            "vector_search",
            Arc::new(VectorSearchFunction::new(
                Arc::clone(catalog),
                Arc::clone(&self.tables),
            )),
        );
        self.ctx.register_udtf(
            "memwal_stats",
            Arc::new(StatsFunction::new(
                Arc::clone(catalog),
                Arc::clone(&self.tables),
            )),
        );
    }

    /// After a `SET` or `RESET` of `memwal.*`: the tables write with the
    /// options the statement left, if they fit together (otherwise the
    /// change is undone and the error names the conflict). Open tables are
    /// closed first (their writes made durable) and reopen with the new
    /// options on next use, in every session sharing this one's table
    /// handles (see [`SessionBuilder::open`]); the reopened writers'
    /// counters (`memwal_stats`) start from zero.
    async fn apply_writer_options(&self) -> Result<()> {
        let wanted = {
            let state = self.ctx.state_ref();
            let mut state = state.write();
            let extensions = &mut state.config_mut().options_mut().extensions;
            let wanted = extensions
                .get::<MemwalConfig>()
                .expect("registered at open")
                .writer
                .clone();
            if let Err(e) = wanted.check() {
                extensions.insert(MemwalConfig {
                    writer: self.tables.options(),
                });
                // Worded like a value `SET` refuses (see `MemwalConfig::set`).
                return Err(DataFusionError::Configuration(e.to_string()).into());
            }
            wanted
        };
        self.tables.reconfigure(wanted).await
    }

    /// `RESET memwal.<option>`: the value the session opened with, like
    /// PostgreSQL's session default (DataFusion resets no extension's
    /// option itself).
    fn reset_writer_option(&self, variable: &str) -> Result<()> {
        let name = &variable[MemwalConfig::PREFIX.len() + 1..];
        let default = self.opened_with.get(name).ok_or_else(|| {
            Error::invalid(format!(
                "unknown writer option '{name}'; the options are: {}",
                WriterOptions::NAMES.join(", ")
            ))
        })?;
        let state = self.ctx.state_ref();
        let mut state = state.write();
        Ok(state.config_mut().options_mut().set(variable, &default)?)
    }

    /// The catalog, loaded now if it has not been yet; the error that keeps
    /// it from loading otherwise.
    pub async fn catalog(&self) -> Result<Arc<Catalog>> {
        let catalog = self
            .catalog
            .get_or_try_init(|| async {
                let catalog = Catalog::open(self.root.clone(), CatalogOptions::default()).await?;
                self.register(&catalog);
                Ok::<_, Error>(catalog)
            })
            .await?;
        Ok(Arc::clone(catalog))
    }

    /// The catalog, caught up with changes made elsewhere.
    async fn fresh_catalog(&self) -> Result<Arc<Catalog>> {
        let catalog = self.catalog().await?;
        catalog.refresh().await?;
        Ok(catalog)
    }

    /// The root this session serves.
    pub fn root(&self) -> &ObjectRoot {
        &self.root
    }

    /// The table `name` (`table`, `schema.table`, or a dotted namespace path
    /// ending in the table; `public.table` is `table`, as in SQL) for the
    /// Rust API: put, delete, get, scan. The catalog catches up first, as
    /// it does before a statement.
    pub async fn table(&self, name: &str) -> Result<Arc<Table>> {
        let path = table_path(name)?;
        let catalog = self.fresh_catalog().await?;
        let (entry, meta) = catalog
            .table(&path)
            .await?
            .ok_or_else(|| Error::NotFound(format!("table {path}")))?;
        let location = entry
            .location
            .as_deref()
            .ok_or_else(|| Error::NotFound(format!("location of table {path}")))?;
        Ok(self
            .tables
            .get_or_open(catalog.root().store(), location, &meta, Some(&catalog)))
    }

    /// Makes everything written through this session durable and closes
    /// its writers (those of every session sharing its table handles: see
    /// [`SessionBuilder::open`]); reports the first error. The data of a
    /// table written through them that another process dropped meanwhile
    /// (closing may just have flushed some) is deleted. Last, waits for a
    /// catalog checkpoint being written in the background (see
    /// [`Catalog::close`]).
    pub async fn close(&self) -> Result<()> {
        let written = self.tables.locations();
        let closed = self.tables.close().await;
        if !written.is_empty()
            && let Ok(catalog) = self.fresh_catalog().await
        {
            let snapshot = catalog.snapshot();
            let dropped: Vec<String> = written
                .into_iter()
                .filter(|l| !snapshot.holds_location(l))
                .collect();
            if !dropped.is_empty()
                && let Err(e) = catalog
                    .collect_dropped_tables(&dropped, DROPPED_TABLE_GRACE)
                    .await
            {
                log::warn!("deleting the data of dropped tables failed: {e}");
            }
        }
        if let Some(catalog) = self.catalog.get() {
            catalog.close().await;
        }
        closed
    }

    /// The DataFusion context, for everything that is not memwal DDL.
    pub fn context(&self) -> &SessionContext {
        &self.ctx
    }

    /// Splits SQL text into statements with the session's dialect.
    pub fn parse(&self, sql: &str) -> Result<Vec<DFStatement>> {
        let state = self.ctx.state();
        let name = &state.config().options().sql_parser.dialect;
        let dialect = dialect_from_str(name)
            .ok_or_else(|| Error::invalid(format!("unknown SQL dialect {name}")))?;
        Ok(DFParser::parse_sql_with_dialect(sql, dialect.as_ref())?.into())
    }

    /// Runs exactly one SQL statement. DDL runs (and is durable) before this
    /// returns; a query returns a lazy `DataFrame`.
    pub async fn sql(&self, sql: &str) -> Result<DataFrame> {
        let mut statements = self.parse(sql)?;
        if statements.len() != 1 {
            return Err(Error::invalid(format!(
                "expected exactly one SQL statement, got {}",
                statements.len()
            )));
        }
        self.execute(statements.remove(0)).await
    }

    /// Runs one parsed statement (see [`MemwalSession::sql`]).
    pub async fn execute(&self, mut statement: DFStatement) -> Result<DataFrame> {
        let normalize = (self.ctx.state_ref().read())
            .config_options()
            .sql_parser
            .enable_ident_normalization;
        if let Some(delete) = self.prepared_deletes.expand(&statement, normalize)? {
            return Box::pin(self.execute(delete)).await;
        }
        delete_alias::unalias_delete(&mut statement, normalize)?;
        // Refusals that must come before anything is read.
        self.files.check_statement(&statement)?;
        ddl::refuse_explain(&statement)?;
        ddl::refuse_create_view(&statement)?;
        refuse_update(&statement, &self.ctx.state())?;
        let prepares = matches!(&statement, DFStatement::Statement(s)
            if matches!(s.as_ref(), SqlStatement::Prepare { .. } | SqlStatement::Deallocate { .. }))
        .then(|| statement.clone());
        // A statement that names no table and is no memwal DDL (`SELECT 1`,
        // `SET`) does not wait for the store.
        let ran = if !uses_catalog(&self.ctx.state(), &statement)? {
            self.plan(statement, None).await
        } else {
            let catalog = self.fresh_catalog().await?;
            (catalog.in_statement(self.plan(statement, Some(&catalog)))).await
        };
        if let (Ok(_), Some(statement)) = (&ran, prepares) {
            self.prepared_deletes.ran(&statement, normalize);
        }
        ran
    }

    /// Plans (and runs, if DDL) a statement that passed the refusals of
    /// [`MemwalSession::execute`], with the `catalog` it refreshed if it
    /// names a table.
    async fn plan(
        &self,
        statement: DFStatement,
        catalog: Option<&Arc<Catalog>>,
    ) -> Result<DataFrame> {
        let state = self.ctx.state();
        if let Some(catalog) = catalog {
            if let Some(batch) = describe::try_describe(catalog, &state, &statement).await? {
                return Ok(self.ctx.read_batch(batch)?);
            }
            if let Some(dropped) =
                ddl::try_execute(catalog, &self.tables, &state, &statement).await?
            {
                // A dropped table's writers stop with the statement, and its
                // data is deleted (failures there are no failure of the
                // committed statement: a later sweep finds the data).
                let snapshot = catalog.snapshot();
                let live = |location: &str| snapshot.holds_location(location);
                if let Err(e) = self.tables.close_unless(live).await {
                    log::warn!("closing the writers of dropped tables failed: {e}");
                }
                let commit = self.tables.options().commit;
                for location in &dropped {
                    if let Err(e) = seal_dropped(catalog.root().store(), location, &commit).await {
                        log::warn!("sealing the shards of dropped table {location} failed: {e}");
                    }
                }
                if !dropped.is_empty()
                    && let Err(e) = catalog
                        .collect_dropped_tables(&dropped, DROPPED_TABLE_GRACE)
                        .await
                {
                    log::warn!("deleting the data of dropped tables failed: {e}");
                }
                let done = LogicalPlanBuilder::empty(false).build()?;
                return Ok(DataFrame::new(state, done));
            }
        }
        let delete = delete_kind(&statement);
        let insert = insert_checks::InsertSource::of(&statement);
        let plan = match (state.statement_to_plan(statement).await, insert) {
            (Ok(plan), _) => plan,
            (Err(e), Some(insert)) => return Err(insert.name_column(&state, e).await),
            (Err(e), None) => return Err(e.into()),
        };
        self.files.check_plan(&plan)?;
        let writer_option = |variable: &str| {
            let variable = variable.to_ascii_lowercase();
            variable
                .strip_prefix(MemwalConfig::PREFIX)
                .is_some_and(|rest| rest.starts_with('.'))
                .then_some(variable)
        };
        let (set, reset) = match &plan {
            LogicalPlan::Statement(Statement::SetVariable(set)) => {
                (writer_option(&set.variable), None)
            }
            LogicalPlan::Statement(Statement::ResetVariable(reset)) => {
                (None, writer_option(&reset.variable))
            }
            _ => (None, None),
        };
        if set.is_some() {
            let done = self.ctx.execute_logical_plan(plan).await?;
            self.apply_writer_options().await?;
            return Ok(done);
        }
        if let Some(variable) = reset {
            self.reset_writer_option(&variable)?;
            self.apply_writer_options().await?;
            let done = LogicalPlanBuilder::empty(false).build()?;
            return Ok(DataFrame::new(self.ctx.state(), done));
        }
        let plan = insert_checks::check_inserts(plan)?;
        let plan = match delete {
            Some(every_row) => self.plan_delete(&state, plan, every_row).await?,
            None => plan,
        };
        Ok(self.ctx.execute_logical_plan(plan).await?)
    }

    /// The plan of a `DELETE` (of `every_row` or not), also under
    /// `EXPLAIN [ANALYZE]`, so that what EXPLAIN shows is what runs:
    /// without `WHERE` and `LIMIT` a `TRUNCATE`, otherwise see
    /// [`Self::plan_delete_by_rows`].
    async fn plan_delete(
        &self,
        state: &SessionState,
        plan: LogicalPlan,
        every_row: bool,
    ) -> Result<LogicalPlan> {
        Ok(match plan {
            LogicalPlan::Explain(mut explain) => {
                let dml = Arc::unwrap_or_clone(explain.plan);
                let planned = Box::pin(self.plan_delete(state, dml, every_row)).await?;
                explain.plan = Arc::new(planned);
                LogicalPlan::Explain(explain)
            }
            LogicalPlan::Analyze(mut analyze) => {
                let dml = Arc::unwrap_or_clone(analyze.input);
                let planned = Box::pin(self.plan_delete(state, dml, every_row)).await?;
                analyze.input = Arc::new(planned);
                LogicalPlan::Analyze(analyze)
            }
            LogicalPlan::Dml(dml) if every_row => {
                require_key(&dml)?;
                LogicalPlan::Dml(DmlStatement::new(
                    dml.table_name,
                    dml.target,
                    WriteOp::Truncate,
                    dml.input,
                ))
            }
            plan => match self.plan_delete_by_rows(state, plan).await? {
                Ok(rows) => {
                    LogicalPlanBuilder::scan("delete", provider_as_source(rows), None)?.build()?
                }
                Err(plan) => plan,
            },
        })
    }

    /// A `DELETE` DataFusion 55 would not hand to `delete_from` whole: under
    /// a `LIMIT` (which `delete_from` never sees), or with a predicate
    /// folded to an empty relation (`WHERE false`) or to nothing (`WHERE
    /// true`), or turned into a join (`WHERE id IN
    /// (SELECT ...)`): `delete_from` would get no filter, or only some, and
    /// delete rows the statement did not select; or holding a subquery
    /// that stayed an expression (`WHERE id < (SELECT min(a) ...)`), which
    /// `delete_from` cannot evaluate; or over a projection that computes
    /// a subexpression the predicate repeats, which the filter then names
    /// as a column the table does not have. Such a statement becomes a
    /// [`DeleteExec`] over the rows its optimized plan yields. Any other
    /// plan is handed back as is.
    async fn plan_delete_by_rows(
        &self,
        state: &SessionState,
        plan: LogicalPlan,
    ) -> Result<Result<Arc<dyn TableProvider>, LogicalPlan>> {
        let LogicalPlan::Dml(dml) = state.optimize(&plan)? else {
            return Ok(Err(plan));
        };
        let (mut whole, mut filtered) = (true, false);
        dml.input.apply(|node| {
            match node {
                LogicalPlan::Filter(filter) => {
                    filtered = true;
                    whole &= !filter.predicate.exists(|e| {
                        Ok(matches!(
                            e,
                            Expr::ScalarSubquery(_) | Expr::Exists(_) | Expr::InSubquery(_)
                        ))
                    })?;
                }
                LogicalPlan::TableScan(scan) => filtered |= !scan.filters.is_empty(),
                // One that computes (the optimizer's `__common_expr_*`
                // under a filter repeating a subexpression) leaves the
                // filter naming a column the table does not have.
                LogicalPlan::Projection(projection) => {
                    whole &= projection.expr.iter().all(|e| matches!(e, Expr::Column(_)));
                }
                LogicalPlan::SubqueryAlias(_) => {}
                _ => whole = false,
            }
            Ok(TreeNodeRecursion::Continue)
        })?;
        if whole && filtered {
            return Ok(Err(plan));
        }
        let provider = source_as_provider(&dml.target)?;
        let Some(table) = provider.downcast_ref::<MemwalTable>() else {
            return Ok(Err(plan));
        };
        // DataFusion's planner, not the session's: the statement is planned
        // again as a whole (across workers, if any) when it runs.
        // Planned in the same statement as the rows: it deletes only the
        // versions their snapshots hold.
        let delete = one_statement(async {
            let planner = DefaultPhysicalPlanner::default();
            let rows = planner.create_physical_plan(&dml.input, state).await?;
            Ok::<_, Error>(DeleteExec::new(Arc::clone(table.table()), rows))
        })
        .await?;
        Ok(Ok(Arc::new(PlannedStatement(Arc::new(delete)))))
    }
}

/// Refuses a `DELETE` of a memwal table without a key (see
/// [`MemwalTable::require_key`]) while planning, not under the
/// "TRUNCATE operation" DataFusion's planner would wrap the refusal in.
fn require_key(dml: &DmlStatement) -> Result<()> {
    let provider = source_as_provider(&dml.target)?;
    match provider.downcast_ref::<MemwalTable>() {
        Some(table) => Ok(table.require_key()?),
        None => Ok(()),
    }
}

/// For a `DELETE` (also under `EXPLAIN`), whether it deletes every row:
/// no `WHERE` and no `LIMIT`; `None` for any other statement.
fn delete_kind(statement: &DFStatement) -> Option<bool> {
    match statement {
        DFStatement::Statement(s) => match s.as_ref() {
            SqlStatement::Delete(delete) => {
                Some(delete.selection.is_none() && delete.limit.is_none())
            }
            _ => None,
        },
        DFStatement::Explain(explain) => delete_kind(&explain.statement),
        _ => None,
    }
}

/// Refuses `UPDATE` of a memwal table before DataFusion plans it (its
/// optimizer fails first, in words about casts, on a constant of another
/// shape than the column's): memwal tables have none. A table of another
/// catalog the application registered is left to DataFusion.
fn refuse_update(statement: &DFStatement, state: &SessionState) -> Result<()> {
    let DFStatement::Statement(s) = statement else {
        return Ok(());
    };
    let update = match s.as_ref() {
        SqlStatement::Update(update) => update,
        SqlStatement::Prepare { statement, .. } => match statement.as_ref() {
            SqlStatement::Update(update) => update,
            _ => return Ok(()),
        },
        _ => return Ok(()),
    };
    let TableFactor::Table { name, .. } = &update.table.relation else {
        return Ok(());
    };
    let catalog = match ddl::name_parts(name)?.as_slice() {
        [catalog, _, _] => catalog.clone(),
        _ => state.config().options().catalog.default_catalog.clone(),
    };
    match catalog == CATALOG_NAME {
        true => Err(Error::invalid(update_refused(name))),
        false => Ok(()),
    }
}

/// Whether `statement` needs the memwal catalog: memwal DDL, or any table
/// reference except `information_schema`'s settings and functions (the
/// `SHOW <variable>` family names every `information_schema` table, and
/// needs none of memwal's).
fn uses_catalog(state: &SessionState, statement: &DFStatement) -> Result<bool> {
    if ddl::is_memwal_ddl(statement) {
        return Ok(true);
    }
    if let DFStatement::Statement(s) = statement
        && matches!(
            s.as_ref(),
            SqlStatement::ShowVariable { .. }
                | SqlStatement::ShowVariables { .. }
                | SqlStatement::ShowFunctions { .. }
                | SqlStatement::ShowStatus { .. }
                | SqlStatement::ShowCollation { .. }
        )
    {
        return Ok(false);
    }
    Ok(state.resolve_table_references(statement)?.iter().any(|r| {
        !(r.schema() == Some("information_schema")
            && matches!(r.table(), "df_settings" | "routines" | "parameters"))
    }))
}

/// The path of table `name` as [`MemwalSession::table`] takes it.
pub(crate) fn table_path(name: &str) -> Result<ObjectPath> {
    let in_root = name
        .strip_prefix(ROOT_SCHEMA)
        .and_then(|rest| rest.strip_prefix('.'));
    ObjectPath::parse_dotted(in_root.unwrap_or(name))
}
