//! Arguments of memwal's table functions (`vector_search`, `memwal_stats`):
//! constants, strings, and tables named by a string. Every error names the
//! function.

use std::sync::Arc;

use datafusion::arrow::array::{RecordBatch, RecordBatchOptions};
use datafusion::arrow::datatypes::Schema;
use datafusion::catalog::Session;
use datafusion::common::{DFSchema, ScalarValue, TableReference, plan_err};
use datafusion::error::{DataFusionError, Result};
use datafusion::logical_expr::{ColumnarValue, Expr};

use super::{CATALOG_NAME, ROOT_SCHEMA, schema_to_namespace};
use crate::catalog::{Catalog, ObjectPath, ObjectType};
use crate::schema::TableMeta;
use crate::table::{Table, TableCache};

/// The value of a constant argument of `function`.
pub(super) fn constant(session: &dyn Session, expr: &Expr, function: &str) -> Result<ScalarValue> {
    let physical = session
        .create_physical_expr(expr.clone(), &DFSchema::empty())
        .map_err(|e| {
            DataFusionError::Plan(format!(
                "{function} arguments must be constants ({expr}): {e}"
            ))
        })?;
    let one_row = RecordBatch::try_new_with_options(
        Arc::new(Schema::empty()),
        vec![],
        &RecordBatchOptions::new().with_row_count(Some(1)),
    )?;
    match physical.evaluate(&one_row)? {
        ColumnarValue::Scalar(s) => Ok(s),
        ColumnarValue::Array(a) => ScalarValue::try_from_array(&a, 0),
    }
}

/// A string argument (`what`) of `function`.
pub(super) fn text(value: ScalarValue, what: &str, function: &str) -> Result<String> {
    match value {
        ScalarValue::Utf8(Some(s))
        | ScalarValue::LargeUtf8(Some(s))
        | ScalarValue::Utf8View(Some(s)) => Ok(s),
        other => plan_err!("{function}: {what} must be a string, got {other}"),
    }
}

/// The table named `name` in `catalog`, opened through `tables`: dotted
/// (`shop.eu.items`, where a level may hold any other character, quotes
/// too), or else as SQL names it (`"shop.eu".items`,
/// `memwal."shop.eu"."Items"`); a bare name is in `session`'s default
/// schema, as in a query.
pub(super) fn named_table(
    catalog: &Arc<Catalog>,
    tables: &TableCache,
    name: &str,
    session: &dyn Session,
    function: &str,
) -> Result<(TableMeta, Arc<Table>)> {
    let default_schema = &session.config_options().catalog.default_schema;
    let snapshot = catalog.snapshot();
    let table = |path: &ObjectPath| {
        snapshot
            .get(path)
            .filter(|e| e.object_type == ObjectType::Table)
            .cloned()
    };
    // A bare name is in the session's default schema, as in a query.
    let dotted = match name.contains(['.', '"']) {
        true => ObjectPath::parse_dotted(name.strip_prefix("public.").unwrap_or(name)),
        false => schema_to_namespace(default_schema).and_then(|schema| schema.child(name)),
    };
    let found = match dotted.ok().and_then(|p| Some((table(&p)?, p))) {
        Some(found) => Some(found),
        None if name.contains('"') => {
            let path = sql_path(name, default_schema, function)?;
            table(&path).map(|entry| (entry, path))
        }
        None => None,
    };
    let (entry, path) = found
        .ok_or_else(|| DataFusionError::Plan(format!("{function}: table '{name}' not found")))?;
    let meta = TableMeta::from_json(&entry.metadata, &path.to_string())?;
    let location = entry.location.as_deref().ok_or_else(|| {
        DataFusionError::Internal(format!("catalog entry of table {path} has no location"))
    })?;
    let table = tables.get_or_open(catalog.root().store(), location, &meta, Some(catalog));
    Ok((meta, table))
}

/// The path of a table as SQL names it: the schema (`default_schema`
/// for a bare name) is a namespace path (dotted), `public` the root,
/// `memwal` the only catalog.
fn sql_path(name: &str, default_schema: &str, function: &str) -> Result<ObjectPath> {
    let reference = TableReference::parse_str(name);
    if reference.catalog().is_some_and(|c| c != CATALOG_NAME) {
        return plan_err!("{function}: table '{name}' not found (the catalog is {CATALOG_NAME})");
    }
    let mut levels: Vec<&str> = match reference.schema().unwrap_or(default_schema) {
        ROOT_SCHEMA => Vec::new(),
        schema => schema.split('.').collect(),
    };
    levels.push(reference.table());
    Ok(ObjectPath::new(levels)?)
}
