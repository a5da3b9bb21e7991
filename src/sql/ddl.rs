//! DDL that memwal runs itself instead of DataFusion: `CREATE/DROP SCHEMA`
//! and `CREATE/DROP TABLE`, including the `WITH (...)` table options that
//! DataFusion's planner rejects. Column types and key constraints are still
//! planned by DataFusion, from the statement with its options removed.
//!
//! `CREATE TABLE ... AS SELECT` writes the query's rows, then creates the
//! table over them (append-only, or keyed when its column list declares a
//! `PRIMARY KEY`): the table appears with all of its rows or not at all.
//! DDL runs outside DataFusion's planner, so it cannot be `EXPLAIN`ed.

use std::sync::Arc;

use datafusion::arrow::datatypes::Schema;
use datafusion::common::{Constraint, TableReference};
use datafusion::datasource::provider_as_source;
use datafusion::execution::SessionState;
use datafusion::logical_expr::dml::InsertOp;
use datafusion::logical_expr::{DdlStatement, LogicalPlan, LogicalPlanBuilder};
use datafusion::sql::parser::Statement as DFStatement;
use datafusion::sql::sqlparser::ast::{
    self, CreateTableOptions, Expr, Ident, ObjectName, ObjectNamePart, SchemaName, SqlOption,
    Statement, Value,
};

use super::table::MemwalTable;
use super::{CATALOG_NAME, insert_checks, namespace_to_schema, schema_to_namespace};
use crate::catalog::{Catalog, Mutation, ObjectPath, Outcome};
use crate::error::{Error, Result};
use crate::schema::TableMeta;
use crate::store::paths;
use crate::table::{Table, TableCache};

/// Whether `statement` is DDL that memwal runs (see [`try_execute`]).
pub(crate) fn is_memwal_ddl(statement: &DFStatement) -> bool {
    let DFStatement::Statement(statement) = statement else {
        return false;
    };
    matches!(
        statement.as_ref(),
        Statement::CreateSchema { .. }
            | Statement::CreateTable(_)
            | Statement::Drop {
                object_type: ast::ObjectType::Schema | ast::ObjectType::Table,
                ..
            }
    )
}

/// Refuses `CREATE VIEW`: the memwal catalog holds tables and namespaces
/// only.
pub(crate) fn refuse_create_view(statement: &DFStatement) -> Result<()> {
    if let DFStatement::Statement(statement) = statement
        && let Statement::CreateView(view) = statement.as_ref()
    {
        return Err(Error::invalid(format!(
            "CREATE VIEW {} is not supported: the memwal catalog holds tables and \
             namespaces only; write the query as a subquery or a WITH clause",
            view.name
        )));
    }
    Ok(())
}

/// Refuses `EXPLAIN` (and `EXPLAIN ANALYZE`, `DESCRIBE <statement>`) of
/// memwal DDL: DataFusion would explain a plan memwal does not run.
pub(crate) fn refuse_explain(statement: &DFStatement) -> Result<()> {
    let inner = match statement {
        DFStatement::Explain(explain) => explain.statement.as_ref().clone(),
        DFStatement::Statement(s) => match s.as_ref() {
            Statement::Explain { statement, .. } => DFStatement::Statement(statement.clone()),
            _ => return Ok(()),
        },
        _ => return Ok(()),
    };
    if is_memwal_ddl(&inner) {
        return Err(Error::invalid(format!(
            "EXPLAIN is not supported for CREATE/DROP SCHEMA/TABLE: memwal runs them \
             itself, outside DataFusion's planner (statement: {inner})"
        )));
    }
    refuse_explain(&inner)
}

/// Runs `statement` if it is memwal DDL and returns the data locations of
/// the tables it dropped; `Ok(None)` if it is not memwal DDL (the caller
/// hands it to DataFusion).
pub(crate) async fn try_execute(
    catalog: &Arc<Catalog>,
    tables: &TableCache,
    state: &SessionState,
    statement: &DFStatement,
) -> Result<Option<Vec<String>>> {
    let DFStatement::Statement(statement) = statement else {
        return Ok(None);
    };
    let mut dropped = Vec::new();
    match statement.as_ref() {
        Statement::CreateSchema {
            schema_name,
            if_not_exists,
            ..
        } => {
            let SchemaName::Simple(name) = schema_name else {
                return Err(Error::invalid(
                    "CREATE SCHEMA ... AUTHORIZATION is not supported",
                ));
            };
            let path = schema_path(name)?;
            if path.name() == INFORMATION_SCHEMA {
                return Err(Error::invalid(format!(
                    "'{INFORMATION_SCHEMA}' is DataFusion's own schema: a namespace of \
                     that name could not be queried"
                )));
            }
            catalog.create_namespace(path, *if_not_exists).await?;
        }
        Statement::Drop {
            object_type: ast::ObjectType::Schema,
            if_exists,
            names,
            cascade,
            ..
        } => {
            let mut drops = Vec::new();
            for path in distinct(names.iter().map(schema_path))? {
                drops.push(Mutation::DropNamespace {
                    path,
                    if_exists: *if_exists,
                    cascade: *cascade,
                });
            }
            dropped.extend(dropped_tables(catalog.mutate(Mutation::All(drops)).await?));
        }
        Statement::Drop {
            object_type: ast::ObjectType::Table,
            if_exists,
            names,
            ..
        } => {
            let mut drops = Vec::new();
            for path in distinct(names.iter().map(|name| table_path(name, state)))? {
                drops.push(Mutation::DropTable {
                    path,
                    if_exists: *if_exists,
                });
            }
            dropped.extend(dropped_tables(catalog.mutate(Mutation::All(drops)).await?));
        }
        Statement::CreateTable(create) => {
            let (path, meta, if_not_exists, rows) = plan_create_table(state, create).await?;
            match rows {
                None => {
                    catalog.create_table(path, meta, if_not_exists).await?;
                }
                Some(rows) => {
                    create_table_as(catalog, tables, state, path, meta, if_not_exists, rows).await?
                }
            }
        }
        _ => return Ok(None),
    }
    Ok(Some(dropped))
}

/// The paths of a statement's names, each once (`DROP TABLE a, a` drops
/// `a`), in the order given.
fn distinct(paths: impl Iterator<Item = Result<ObjectPath>>) -> Result<Vec<ObjectPath>> {
    let mut out: Vec<ObjectPath> = Vec::new();
    for path in paths {
        let path = path?;
        if !out.contains(&path) {
            out.push(path);
        }
    }
    Ok(out)
}

/// The data locations of the tables a catalog change removed.
fn dropped_tables(outcome: Outcome) -> Vec<String> {
    match outcome {
        Outcome::Dropped { tables, .. } => tables,
        _ => Vec::new(),
    }
}

/// `CREATE TABLE ... AS SELECT`: the query's rows are written to a new
/// location that no catalog entry names yet, and made durable there, then
/// one catalog commit creates the table over them. A statement that fails,
/// or is killed, midway leaves no table. Its data, which no entry names,
/// is deleted on failure, and by a later sweep after a kill (see
/// [`Catalog::collect_dropped_tables`]; a load's markers keep its data
/// while it runs).
async fn create_table_as(
    catalog: &Arc<Catalog>,
    tables: &TableCache,
    state: &SessionState,
    path: ObjectPath,
    meta: TableMeta,
    if_not_exists: bool,
    query: LogicalPlan,
) -> Result<()> {
    // Checked before the query runs (the commit checks again).
    if catalog.table_creation(&path, &meta, if_not_exists)? == Outcome::AlreadyThere {
        return Ok(());
    }
    let location = paths::new_table_location(path.name());
    let store = catalog.root().store();
    // Not in the session's cache, so no statement meanwhile finds it, or
    // closes it as a dropped table's: the catalog does not name it yet.
    let table = Arc::new(Table::new(
        Arc::clone(store),
        &location,
        &meta,
        tables.options(),
    ));
    let written = insert_rows(state, &path, &meta, Arc::clone(&table), query).await;
    // Everything written is durable once closed; the table is opened
    // afresh (through the catalog) by the statements after this one.
    let closed = table.close().await;
    let failed = match written.and(closed) {
        Ok(()) => {
            let created = catalog
                .mutate(Mutation::CreateTable {
                    path,
                    meta: Box::new(meta),
                    location: location.clone(),
                    if_not_exists,
                })
                .await;
            match created {
                Ok(Outcome::Created) => return Ok(()),
                // Created meanwhile by another statement: this one's rows
                // are not its.
                Ok(_) => None,
                Err(
                    e @ (Error::AlreadyExists(_) | Error::NotFound(_) | Error::InvalidInput(_)),
                ) => Some(e),
                // The commit's outcome is not known (a store error): its
                // rows stay until a sweep finds that no entry names them.
                Err(e) => return Err(e),
            }
        }
        Err(e) => Some(no_table(&path, e)),
    };
    if let Err(e) = catalog.delete_unnamed(&location).await {
        log::warn!("deleting the rows of a failed CREATE TABLE AS at {location}: {e}");
    }
    failed.map_or(Ok(()), Err)
}

/// The failure of a `CREATE TABLE ... AS` as such: a write's own words
/// ("took effect in shards ...", "the table's next write ...") would
/// describe a table there is none of. Bad input and name errors stay.
fn no_table(path: &ObjectPath, e: Error) -> Error {
    match e {
        Error::InvalidInput(_)
        | Error::DataFusion(_)
        | Error::Arrow(_)
        | Error::AlreadyExists(_)
        | Error::NotFound(_) => e,
        write => Error::NotWritten {
            what: format!("CREATE TABLE {path} AS"),
            cause: format!(
                "no table was created, and the rows written for it were deleted ({write})"
            ),
        },
    }
}

/// Inserts the rows of `query` into `table` (to be named `path`) and waits
/// until they are durable.
async fn insert_rows(
    state: &SessionState,
    path: &ObjectPath,
    meta: &TableMeta,
    table: Arc<Table>,
    query: LogicalPlan,
) -> Result<()> {
    let reference = TableReference::partial(namespace_to_schema(&path.parent()), path.name());
    let provider = Arc::new(MemwalTable::new(path.clone(), meta.clone(), table));
    let plan = LogicalPlanBuilder::insert_into(
        query,
        reference,
        provider_as_source(provider),
        InsertOp::Append,
    )?
    .build()?;
    let plan = insert_checks::check_inserts(plan)?;
    let plan = state.create_physical_plan(&plan).await?;
    datafusion::physical_plan::collect(plan, state.task_ctx()).await?;
    Ok(())
}

/// Turns `CREATE TABLE` into the table's path, validated metadata, `IF NOT
/// EXISTS`, and for `CREATE TABLE ... AS` the query whose rows fill it.
async fn plan_create_table(
    state: &SessionState,
    create: &ast::CreateTable,
) -> Result<(ObjectPath, TableMeta, bool, Option<LogicalPlan>)> {
    if create.or_replace {
        return Err(Error::invalid("CREATE OR REPLACE TABLE is not supported"));
    }
    let options = match &create.table_options {
        CreateTableOptions::None => Vec::new(),
        CreateTableOptions::With(options)
        | CreateTableOptions::Options(options)
        | CreateTableOptions::Plain(options)
        | CreateTableOptions::TableProperties(options) => table_options(options)?,
    };
    let path = table_path(&create.name, state)?;

    // Let DataFusion plan the rest: SQL types to Arrow, key constraints.
    let mut bare = create.clone();
    bare.table_options = CreateTableOptions::None;
    let plan = state
        .statement_to_plan(DFStatement::Statement(Box::new(Statement::CreateTable(
            bare,
        ))))
        .await?;
    let LogicalPlan::Ddl(DdlStatement::CreateMemoryTable(cmd)) = plan else {
        return Err(Error::invalid("unexpected plan for CREATE TABLE"));
    };
    if !cmd.column_defaults.is_empty() {
        return Err(Error::invalid("column DEFAULT values are not supported"));
    }
    let mut schema = cmd.input.schema().as_arrow().clone();
    if create.query.is_some() {
        // Like PostgreSQL, a table made from a query takes the query's
        // column types, not its constraints: a column is NOT NULL only if
        // the column list says so (key columns always are).
        let fields: Vec<_> = schema
            .fields()
            .iter()
            .enumerate()
            .map(|(i, f)| {
                let not_null = create.columns.get(i).is_some_and(|c| {
                    c.options
                        .iter()
                        .any(|o| matches!(o.option, ast::ColumnOption::NotNull))
                });
                f.as_ref().clone().with_nullable(!not_null)
            })
            .collect();
        schema = Schema::new_with_metadata(fields, schema.metadata().clone());
    }
    // `CREATE TABLE t AS SELECT NULL AS x`: a column no SQL type names,
    // which could only ever hold NULL.
    if let Some(untyped) = schema.fields().iter().find(|f| f.data_type().is_null()) {
        return Err(Error::invalid(format!(
            "column '{}' has no type (the query gives it only NULL): give it one, as in \
             CAST(NULL AS INT)",
            untyped.name()
        )));
    }
    let mut primary_key = Vec::new();
    for constraint in cmd.constraints.iter() {
        match constraint {
            Constraint::PrimaryKey(indices) if primary_key.is_empty() => {
                primary_key = indices
                    .iter()
                    .map(|i| schema.field(*i).name().clone())
                    .collect();
            }
            Constraint::PrimaryKey(_) => {
                return Err(Error::invalid("a table can have only one PRIMARY KEY"));
            }
            Constraint::Unique(_) => {
                return Err(Error::invalid("UNIQUE constraints are not supported"));
            }
        }
    }
    let meta = TableMeta::new(&schema, primary_key, &options)?;
    let rows = create
        .query
        .is_some()
        .then(|| Arc::unwrap_or_clone(cmd.input));
    Ok((path, meta, cmd.if_not_exists, rows))
}

/// `WITH ('k' = 'v', ...)` as key/value strings.
fn table_options(options: &[SqlOption]) -> Result<Vec<(String, String)>> {
    options
        .iter()
        .map(|option| match option {
            SqlOption::KeyValue { key, value } => Ok((key.value.clone(), option_value(value)?)),
            other => Err(Error::invalid(format!("unsupported table option: {other}"))),
        })
        .collect()
}

fn option_value(value: &Expr) -> Result<String> {
    match value {
        Expr::Value(v) => match &v.value {
            Value::SingleQuotedString(s) | Value::DoubleQuotedString(s) => Ok(s.clone()),
            Value::Number(n, _) => Ok(n.to_string()),
            Value::Boolean(b) => Ok(b.to_string()),
            other => Err(Error::invalid(format!("unsupported option value: {other}"))),
        },
        Expr::Identifier(ident) => Ok(ident.value.clone()),
        other => Err(Error::invalid(format!("unsupported option value: {other}"))),
    }
}

/// An identifier as DataFusion normalizes it: unquoted ones are lowercased.
fn normalize(ident: &Ident) -> String {
    match ident.quote_style {
        Some(_) => ident.value.clone(),
        None => ident.value.to_lowercase(),
    }
}

/// The parts of a dotted SQL name, each as DataFusion reads it (unquoted
/// ones lower-cased).
pub(crate) fn name_parts(name: &ObjectName) -> Result<Vec<String>> {
    name.0
        .iter()
        .map(|part| match part {
            ObjectNamePart::Identifier(ident) => Ok(normalize(ident)),
            other => Err(Error::invalid(format!("unsupported name part {other}"))),
        })
        .collect()
}

fn check_catalog(catalog: &str) -> Result<()> {
    if catalog == CATALOG_NAME {
        Ok(())
    } else {
        Err(Error::NotFound(format!(
            "catalog '{catalog}' (only '{CATALOG_NAME}' is served)"
        )))
    }
}

/// The schema DataFusion answers itself in every catalog.
const INFORMATION_SCHEMA: &str = "information_schema";

/// `shop`, `"shop.eu"` or `memwal."shop.eu"` to a namespace path.
fn schema_path(name: &ObjectName) -> Result<ObjectPath> {
    match name_parts(name)?.as_slice() {
        [schema] => schema_to_namespace(schema),
        [catalog, schema] => {
            check_catalog(catalog)?;
            schema_to_namespace(schema)
        }
        _ => Err(Error::invalid(format!(
            "schema name {name} has too many parts; nested namespaces are written \"a.b\""
        ))),
    }
}

/// `t`, `schema.t` or `memwal.schema.t` to a table path. A bare or
/// partial name resolves as DataFusion resolves it in a query, in the
/// session's `datafusion.catalog.default_catalog` and `default_schema`:
/// a DDL statement and a query of the same name mean the same table.
pub(crate) fn table_path(name: &ObjectName, state: &SessionState) -> Result<ObjectPath> {
    let parts = name_parts(name)?;
    let reference = match parts.as_slice() {
        [table] => TableReference::bare(table.as_str()),
        [schema, table] => TableReference::partial(schema.as_str(), table.as_str()),
        [catalog, schema, table] => {
            TableReference::full(catalog.as_str(), schema.as_str(), table.as_str())
        }
        _ => {
            return Err(Error::invalid(format!(
                "table name {name} has too many parts"
            )));
        }
    };
    let defaults = &state.config_options().catalog;
    let resolved = reference.resolve(&defaults.default_catalog, &defaults.default_schema);
    check_catalog(&resolved.catalog)?;
    schema_to_namespace(&resolved.schema)?.child(&resolved.table)
}
