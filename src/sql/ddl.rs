//! DDL that memwal runs itself instead of DataFusion: `CREATE/DROP SCHEMA`
//! and `CREATE/DROP TABLE`, including the `WITH (...)` table options that
//! DataFusion's planner rejects. Column types and key constraints are still
//! planned by DataFusion, from the statement with its options removed.

use std::sync::Arc;

use datafusion::common::{Constraint, TableReference};
use datafusion::logical_expr::{DdlStatement, LogicalPlan};
use datafusion::sql::parser::Statement as DFStatement;
use datafusion::sql::sqlparser::ast::{
    self, CreateTableOptions, Expr, Ident, ObjectName, ObjectNamePart, SchemaName, SqlOption,
    Statement, Value,
};

use super::{CATALOG_NAME, schema_to_namespace};
use crate::catalog::{Catalog, ObjectPath, TableMeta};
use crate::error::{Error, Result};

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

/// Runs `statement` if it is memwal DDL; `Ok(false)` if it is not (the
/// caller hands it to DataFusion).
pub(crate) async fn try_execute(
    catalog: &Arc<Catalog>,
    state: &datafusion::execution::SessionState,
    statement: &DFStatement,
) -> Result<bool> {
    let DFStatement::Statement(statement) = statement else {
        return Ok(false);
    };
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
            catalog
                .create_namespace(schema_path(name)?, *if_not_exists)
                .await?;
        }
        Statement::Drop {
            object_type: ast::ObjectType::Schema,
            if_exists,
            names,
            cascade,
            ..
        } => {
            for name in names {
                catalog
                    .drop_namespace(schema_path(name)?, *if_exists, *cascade)
                    .await?;
            }
        }
        Statement::Drop {
            object_type: ast::ObjectType::Table,
            if_exists,
            names,
            ..
        } => {
            for name in names {
                catalog.drop_table(table_path(name)?, *if_exists).await?;
            }
        }
        Statement::CreateTable(create) => {
            let (path, meta, if_not_exists) = plan_create_table(state, create).await?;
            catalog.create_table(path, meta, if_not_exists).await?;
        }
        _ => return Ok(false),
    }
    Ok(true)
}

/// Turns `CREATE TABLE` into the table's path and validated metadata.
async fn plan_create_table(
    state: &datafusion::execution::SessionState,
    create: &ast::CreateTable,
) -> Result<(ObjectPath, TableMeta, bool)> {
    if create.query.is_some() {
        return Err(Error::invalid(
            "CREATE TABLE ... AS SELECT is not supported yet: rows cannot be written \
             until the write path lands; create the table first",
        ));
    }
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
    let path = table_path(&create.name)?;

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
    let schema = cmd.input.schema().as_arrow().clone();
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
    Ok((path, meta, cmd.if_not_exists))
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

fn name_parts(name: &ObjectName) -> Result<Vec<String>> {
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

/// `t`, `schema.t` or `memwal.schema.t` to a table path.
pub(crate) fn table_path(name: &ObjectName) -> Result<ObjectPath> {
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
    if let Some(catalog) = reference.catalog() {
        check_catalog(catalog)?;
    }
    let namespace = schema_to_namespace(reference.schema().unwrap_or(super::ROOT_SCHEMA))?;
    namespace.child(reference.table())
}
