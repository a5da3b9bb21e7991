//! [`MemwalSession`]: a DataFusion `SessionContext` with the memwal catalog
//! registered as the default catalog, plus the DDL DataFusion cannot run.

use std::sync::Arc;

use datafusion::dataframe::DataFrame;
use datafusion::logical_expr::LogicalPlanBuilder;
use datafusion::prelude::{SessionConfig, SessionContext};
use datafusion::sql::parser::{DFParser, Statement as DFStatement};
use datafusion::sql::sqlparser::dialect::dialect_from_str;

use super::catalog_provider::MemwalCatalogProvider;
use super::ddl;
use super::{CATALOG_NAME, ROOT_SCHEMA};
use crate::catalog::{Catalog, CatalogOptions};
use crate::error::{Error, Result};
use crate::store::ObjectRoot;

/// A SQL session over one root. Plain DataFusion for queries; memwal runs
/// `CREATE/DROP SCHEMA` and `CREATE/DROP TABLE` (with `WITH (...)`
/// options) itself and persists them in the catalog. Before each statement
/// the catalog catches up with changes made elsewhere.
#[derive(Clone)]
pub struct MemwalSession {
    ctx: SessionContext,
    catalog: Arc<Catalog>,
}

impl std::fmt::Debug for MemwalSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemwalSession")
            .field("catalog", &self.catalog)
            .finish()
    }
}

impl MemwalSession {
    /// Opens the root at `location` (see [`ObjectRoot::open`]) with default
    /// options and starts a session on it.
    pub async fn open(location: &str) -> Result<Self> {
        let root = ObjectRoot::open(location)?;
        let catalog = Catalog::open(root, CatalogOptions::default()).await?;
        Ok(Self::new(catalog))
    }

    /// A session over an open catalog.
    pub fn new(catalog: Arc<Catalog>) -> Self {
        let config = SessionConfig::new()
            .with_information_schema(true)
            .with_create_default_catalog_and_schema(false)
            .with_default_catalog_and_schema(CATALOG_NAME, ROOT_SCHEMA);
        let ctx = SessionContext::new_with_config(config);
        ctx.register_catalog(
            CATALOG_NAME,
            Arc::new(MemwalCatalogProvider::new(Arc::clone(&catalog))),
        );
        Self { ctx, catalog }
    }

    /// The DataFusion context, for everything that is not memwal DDL.
    pub fn context(&self) -> &SessionContext {
        &self.ctx
    }

    /// The catalog this session serves.
    pub fn catalog(&self) -> &Arc<Catalog> {
        &self.catalog
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
    pub async fn execute(&self, statement: DFStatement) -> Result<DataFrame> {
        self.catalog.refresh().await?;
        let state = self.ctx.state();
        if ddl::try_execute(&self.catalog, &state, &statement).await? {
            let done = LogicalPlanBuilder::empty(false).build()?;
            return Ok(DataFrame::new(state, done));
        }
        let plan = state.statement_to_plan(statement).await?;
        Ok(self.ctx.execute_logical_plan(plan).await?)
    }
}
