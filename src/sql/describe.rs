//! `SHOW CREATE TABLE` and `DESCRIBE` for memwal tables, which DataFusion
//! answers from `information_schema` without what memwal adds to a table:
//! its primary key and its `WITH (...)` options.
//!
//! - `SHOW CREATE TABLE t` has DataFusion's columns (`table_catalog`,
//!   `table_schema`, `table_name`, `definition`); `definition` is a
//!   `CREATE TABLE` statement that recreates the table: columns with SQL
//!   types (`FLOAT[n]` for vector columns), `NOT NULL`, `PRIMARY KEY` and
//!   every option, defaults included.
//! - `DESCRIBE t` has DataFusion's columns (`column_name`, `data_type`,
//!   `is_nullable`) plus `primary_key` (the column's 1-based position in the
//!   key, NULL if it is not part of it) and `options` (the column's options,
//!   such as `metric = cosine, m = 16, ef_construction = 100`, NULL if none).
//!
//! Names that are not memwal tables are left to DataFusion.

use std::sync::Arc;

use datafusion::arrow::array::{ArrayRef, RecordBatch, StringArray, UInt32Array};
use datafusion::arrow::datatypes::{DataType, Field, Schema, TimeUnit};
use datafusion::execution::SessionState;
use datafusion::sql::parser::Statement as DFStatement;
use datafusion::sql::sqlparser::ast::{ShowCreateObject, Statement};
use datafusion::sql::sqlparser::keywords::{
    ALL_KEYWORDS, ALL_KEYWORDS_INDEX, Keyword, RESERVED_FOR_COLUMN_ALIAS, RESERVED_FOR_TABLE_ALIAS,
};

use super::{CATALOG_NAME, ddl, namespace_to_schema};
use crate::catalog::{Catalog, ObjectPath};
use crate::error::{Error, Result};
use crate::schema::TableMeta;

/// The answer to `statement` if it is `SHOW CREATE TABLE` or `DESCRIBE` of
/// a memwal table; `None` otherwise.
pub(crate) async fn try_describe(
    catalog: &Catalog,
    state: &SessionState,
    statement: &DFStatement,
) -> Result<Option<RecordBatch>> {
    let DFStatement::Statement(statement) = statement else {
        return Ok(None);
    };
    let (name, show_create) = match statement.as_ref() {
        Statement::ShowCreate {
            obj_type: ShowCreateObject::Table,
            obj_name,
        } => (obj_name, true),
        Statement::ExplainTable { table_name, .. } => (table_name, false),
        _ => return Ok(None),
    };
    // A name memwal cannot hold (another catalog, information_schema, a
    // file) is DataFusion's to answer.
    let Ok(path) = ddl::table_path(name, state) else {
        return Ok(None);
    };
    let Some((_, meta)) = catalog.table(&path).await? else {
        return Ok(None);
    };
    if show_create {
        show_create_table(&path, &meta).map(Some)
    } else {
        describe(&meta).map(Some)
    }
}

fn show_create_table(path: &ObjectPath, meta: &TableMeta) -> Result<RecordBatch> {
    let schema = Arc::new(Schema::new(vec![
        Field::new("table_catalog", DataType::Utf8, false),
        Field::new("table_schema", DataType::Utf8, false),
        Field::new("table_name", DataType::Utf8, false),
        Field::new("definition", DataType::Utf8, false),
    ]));
    let columns: Vec<ArrayRef> = [
        CATALOG_NAME.to_string(),
        namespace_to_schema(&path.parent()),
        path.name().to_string(),
        create_table_sql(path, meta)?,
    ]
    .into_iter()
    .map(|value| Arc::new(StringArray::from(vec![value])) as ArrayRef)
    .collect();
    Ok(RecordBatch::try_new(schema, columns)?)
}

/// The `CREATE TABLE` statement that recreates the table at `path`. SQL
/// writes a timestamp with a zone as `TIMESTAMP WITH TIME ZONE`, which
/// takes the session's zone: the statement sets the zone first if the
/// table's timestamps have one (and fails if they have several).
pub(crate) fn create_table_sql(path: &ObjectPath, meta: &TableMeta) -> Result<String> {
    let parent = path.parent();
    let name = if parent.is_root() {
        ident(path.name())
    } else {
        format!(
            "{}.{}",
            ident(&namespace_to_schema(&parent)),
            ident(path.name())
        )
    };
    let (mut items, mut zone) = (Vec::new(), None);
    for field in meta.schema().fields() {
        let data_type = sql_type(field.data_type(), &mut zone)?;
        let mut column = format!("{} {data_type}", ident(field.name()));
        if !field.is_nullable() && !meta.primary_key().contains(field.name()) {
            column.push_str(" NOT NULL");
        }
        items.push(column);
    }
    if !meta.primary_key().is_empty() {
        let key: Vec<String> = meta.primary_key().iter().map(|k| ident(k)).collect();
        items.push(format!("PRIMARY KEY ({})", key.join(", ")));
    }
    let options: Vec<String> = meta
        .options()
        .iter()
        .map(|(k, v)| format!("{} = {}", quote(k), quote(v)))
        .collect();
    let set_zone = zone.map(|z| format!("SET datafusion.execution.time_zone = {}; ", quote(&z)));
    Ok(format!(
        "{}CREATE TABLE {name} ({}) WITH ({})",
        set_zone.unwrap_or_default(),
        items.join(", "),
        options.join(", ")
    ))
}

fn describe(meta: &TableMeta) -> Result<RecordBatch> {
    let schema = Arc::new(Schema::new(vec![
        Field::new("column_name", DataType::Utf8, false),
        Field::new("data_type", DataType::Utf8, false),
        Field::new("is_nullable", DataType::Utf8, false),
        Field::new("primary_key", DataType::UInt32, true),
        Field::new("options", DataType::Utf8, true),
    ]));
    let fields = meta.schema().fields();
    let names: StringArray = fields.iter().map(|f| Some(f.name().as_str())).collect();
    let types: StringArray = fields
        .iter()
        .map(|f| Some(f.data_type().to_string()))
        .collect();
    let nullable: StringArray = fields
        .iter()
        .map(|f| Some(if f.is_nullable() { "YES" } else { "NO" }))
        .collect();
    let key: UInt32Array = fields
        .iter()
        .map(|f| {
            let position = meta.primary_key().iter().position(|k| k == f.name())?;
            Some(position as u32 + 1)
        })
        .collect();
    let options: StringArray = fields
        .iter()
        .map(|f| {
            let options = meta.columns().get(f.name())?;
            let mut parts = Vec::new();
            if let Some(vector) = &options.vector {
                parts.push(format!("metric = {}", vector.metric.name()));
                parts.push(format!("m = {}", vector.hnsw.m));
                parts.push(format!("ef_construction = {}", vector.hnsw.ef_construction));
            }
            if options.blob {
                parts.push("blob = true".to_string());
            }
            (!parts.is_empty()).then(|| parts.join(", "))
        })
        .collect();
    let columns: Vec<ArrayRef> = vec![
        Arc::new(names),
        Arc::new(types),
        Arc::new(nullable),
        Arc::new(key),
        Arc::new(options),
    ];
    Ok(RecordBatch::try_new(schema, columns)?)
}

/// The SQL name of `t` (as `SHOW CREATE TABLE` writes it), for messages;
/// the Arrow name of a type SQL has none for.
pub(super) fn type_name(t: &DataType) -> String {
    sql_type(t, &mut None).unwrap_or_else(|_| t.to_string())
}

/// The SQL type DataFusion plans back to `t` in a session whose time zone
/// is `zone`, which the first timestamp with a zone sets.
fn sql_type(t: &DataType, zone: &mut Option<String>) -> Result<String> {
    use DataType::*;
    Ok(match t {
        Boolean => "BOOLEAN".into(),
        Int8 => "TINYINT".into(),
        Int16 => "SMALLINT".into(),
        Int32 => "INT".into(),
        Int64 => "BIGINT".into(),
        UInt8 => "TINYINT UNSIGNED".into(),
        UInt16 => "SMALLINT UNSIGNED".into(),
        UInt32 => "INT UNSIGNED".into(),
        UInt64 => "BIGINT UNSIGNED".into(),
        Float32 => "FLOAT".into(),
        Float64 => "DOUBLE".into(),
        Utf8 | LargeUtf8 | Utf8View => "TEXT".into(),
        Binary | LargeBinary | BinaryView => "BYTEA".into(),
        Date32 => "DATE".into(),
        Time64(TimeUnit::Nanosecond) => "TIME".into(),
        Timestamp(unit, tz) => {
            let precision = match unit {
                TimeUnit::Second => "(0)",
                TimeUnit::Millisecond => "(3)",
                TimeUnit::Microsecond => "(6)",
                TimeUnit::Nanosecond => "",
            };
            let with_zone = match (tz, zone.as_deref()) {
                (None, _) => "",
                (Some(tz), Some(z)) if z != tz.as_ref() => {
                    return Err(Error::invalid(format!(
                        "SHOW CREATE TABLE: timestamps in time zones '{z}' and '{tz}' have \
                         no SQL definition (TIMESTAMP WITH TIME ZONE takes the session's zone)"
                    )));
                }
                (Some(tz), _) => {
                    *zone = Some(tz.to_string());
                    " WITH TIME ZONE"
                }
            };
            format!("TIMESTAMP{precision}{with_zone}")
        }
        Decimal128(p, s) | Decimal256(p, s) => format!("DECIMAL({p}, {s})"),
        Interval(datafusion::arrow::datatypes::IntervalUnit::MonthDayNano) => "INTERVAL".into(),
        FixedSizeList(item, n) => format!("{}[{n}]", sql_type(item.data_type(), zone)?),
        List(item) => format!("{}[]", sql_type(item.data_type(), zone)?),
        Struct(fields) => {
            let fields = fields
                .iter()
                .map(|f| {
                    Ok(format!(
                        "{} {}",
                        ident(f.name()),
                        sql_type(f.data_type(), zone)?
                    ))
                })
                .collect::<Result<Vec<_>>>()?;
            format!("STRUCT<{}>", fields.join(", "))
        }
        // A column the table holds as its values' type.
        Dictionary(_, value) => sql_type(value, zone)?,
        other => {
            return Err(Error::invalid(format!(
                "SHOW CREATE TABLE: no SQL type for Arrow type {other}"
            )));
        }
    })
}

/// `name` as an SQL identifier: bare if DataFusion reads it back unchanged
/// (lower case, and not a keyword that ends an expression or starts a
/// constraint), double-quoted otherwise.
fn ident(name: &str) -> String {
    let simple = name
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_lowercase() || c == '_')
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    let reserved = ALL_KEYWORDS
        .binary_search(&name.to_ascii_uppercase().as_str())
        .is_ok_and(|i| {
            let keyword = ALL_KEYWORDS_INDEX[i];
            RESERVED_FOR_COLUMN_ALIAS.contains(&keyword)
                || RESERVED_FOR_TABLE_ALIAS.contains(&keyword)
                || matches!(
                    keyword,
                    Keyword::PRIMARY
                        | Keyword::UNIQUE
                        | Keyword::FOREIGN
                        | Keyword::CHECK
                        | Keyword::CONSTRAINT
                        | Keyword::KEY
                        | Keyword::INDEX
                )
        });
    if simple && !reserved {
        name.to_string()
    } else {
        format!("\"{}\"", name.replace('"', "\"\""))
    }
}

/// `s` as a single-quoted SQL string.
fn quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identifiers_are_quoted_only_when_needed() {
        assert_eq!(ident("items"), "items");
        assert_eq!(ident("id"), "id");
        assert_eq!(ident("primary"), "\"primary\"");
        assert_eq!(ident("Items"), "\"Items\"");
        assert_eq!(ident("select"), "\"select\"");
        assert_eq!(ident("shop.eu"), "\"shop.eu\"");
        assert_eq!(ident("a\"b"), "\"a\"\"b\"");
        assert_eq!(quote("it's"), "'it''s'");
    }
}
