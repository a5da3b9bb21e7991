//! [`MemwalTable`]: a memwal table as a DataFusion `TableProvider`.
//!
//! Scans read the live rows (newest version per key, no tombstones; shards
//! are partitions). `key = const` and `key IN (...)` on a one-column key
//! become key lookups, and key ranges skip SSTable row groups (and
//! MemTables) outside them; every filter, and LIMIT, DataFusion still
//! applies after de-duplication. INSERT goes to the shard writers through
//! [`InsertSink`]; DELETE and TRUNCATE write tombstones in `execute()`.

use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::datatypes::{Field, SchemaRef};
use datafusion::catalog::Session;
use datafusion::common::{Constraint, Constraints, DFSchema};
use datafusion::datasource::sink::DataSinkExec;
use datafusion::datasource::{TableProvider, TableType};
use datafusion::error::{DataFusionError, Result};
use datafusion::logical_expr::dml::InsertOp;
use datafusion::logical_expr::utils::conjunction;
use datafusion::logical_expr::{Expr, TableProviderFilterPushDown};
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::filter::FilterExec;

use super::delete_exec::DeleteExec;
use super::insert_sink::{InsertSink, key_order_of};
use super::key_filters::{lookup_keys, narrow_key_bounds, point_keys};
use super::scan_exec::{MinPartitions, ScanExec, ScanMode};
use crate::catalog::ObjectPath;
use crate::read::KeyBounds;
use crate::schema::TableMeta;
use crate::table::Table;

/// A table of the catalog, backed by this process's [`Table`].
#[derive(Debug)]
pub struct MemwalTable {
    path: ObjectPath,
    meta: TableMeta,
    table: Arc<Table>,
    constraints: Constraints,
}

impl MemwalTable {
    /// The provider for the table at `path` with metadata `meta`.
    pub fn new(path: ObjectPath, meta: TableMeta, table: Arc<Table>) -> Self {
        let key = meta.primary_key_indices();
        let constraints = if key.is_empty() {
            Constraints::default()
        } else {
            Constraints::new_unverified(vec![Constraint::PrimaryKey(key)])
        };
        Self {
            path,
            meta,
            table,
            constraints,
        }
    }

    /// The table's path in the catalog.
    pub fn path(&self) -> &ObjectPath {
        &self.path
    }

    /// The table's catalog metadata.
    pub fn meta(&self) -> &TableMeta {
        &self.meta
    }

    /// The table this provider reads and writes.
    pub fn table(&self) -> &Arc<Table> {
        &self.table
    }

    /// The key column, if the key has exactly one.
    fn key_field(&self) -> Option<&Field> {
        let [key] = self.table.table_schema().key.as_slice() else {
            return None;
        };
        Some(self.table.table_schema().schema.field(*key))
    }
}

#[async_trait]
impl TableProvider for MemwalTable {
    fn schema(&self) -> SchemaRef {
        Arc::clone(&self.table.table_schema().schema)
    }

    fn constraints(&self) -> Option<&Constraints> {
        Some(&self.constraints)
    }

    fn table_type(&self) -> TableType {
        TableType::Base
    }

    fn supports_filters_pushdown(
        &self,
        filters: &[&Expr],
    ) -> Result<Vec<TableProviderFilterPushDown>> {
        let used = |f: &Expr| {
            self.key_field().is_some_and(|key| {
                point_keys(key, f).is_some() || narrow_key_bounds(key, f, &mut KeyBounds::all())
            })
        };
        Ok(filters
            .iter()
            .map(|f| match used(f) || self.filters_before_blobs(f) {
                true => TableProviderFilterPushDown::Inexact,
                false => TableProviderFilterPushDown::Unsupported,
            })
            .collect())
    }

    async fn scan(
        &self,
        state: &dyn Session,
        projection: Option<&Vec<usize>>,
        filters: &[Expr],
        _limit: Option<usize>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let (mut mode, mut bounds) = (ScanMode::All, KeyBounds::all());
        if let Some(key) = self.key_field() {
            let schema = &self.table.table_schema();
            let key_schema = Arc::new(schema.schema.project(&schema.key)?);
            if let Some(keys) = lookup_keys(&key_schema, filters)? {
                mode = ScanMode::Keys(keys);
            }
            for filter in filters {
                narrow_key_bounds(key, filter, &mut bounds);
            }
        }
        // Filters a scan applies before it reads blob values (the filter
        // above applies them again): rows they drop cost no pack read.
        let projected = match projection {
            Some(p) => Arc::new(self.schema().project(p)?),
            None => self.schema(),
        };
        let df_schema = DFSchema::try_from(projected.as_ref().clone())?;
        // Only what plans over the projection (the filter above has the
        // rest).
        let early = filters.iter().filter(|f| {
            self.filters_before_blobs(f)
                && state.create_physical_expr((*f).clone(), &df_schema).is_ok()
        });
        let early = conjunction(early.cloned())
            .map(|predicate| state.create_physical_expr(predicate, &df_schema))
            .transpose()?;
        let scan = ScanExec::new(
            Arc::clone(&self.table),
            projection.cloned(),
            mode,
            bounds,
            state.config().target_partitions(),
            MinPartitions::of(state.config()),
        )
        .await?;
        Ok(Arc::new(scan.with_early_filter(early)))
    }

    async fn insert_into(
        &self,
        _state: &dyn Session,
        input: Arc<dyn ExecutionPlan>,
        insert_op: InsertOp,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        if insert_op != InsertOp::Append {
            return Err(DataFusionError::NotImplemented(format!(
                "{insert_op} is not supported by memwal tables; INSERT INTO appends (upserts by primary key)"
            )));
        }
        let order = key_order_of(input.as_ref(), &self.meta.primary_key_indices())?;
        let sink = InsertSink::new(Arc::clone(&self.table));
        Ok(Arc::new(DataSinkExec::new(input, Arc::new(sink), order)))
    }

    /// Refused: memwal has no UPDATE; an INSERT of the whole row replaces
    /// the row with the same primary key.
    async fn update(
        &self,
        _state: &dyn Session,
        _assignments: Vec<(String, Expr)>,
        _filters: Vec<Expr>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        Err(DataFusionError::NotImplemented(update_refused(&self.path)))
    }

    /// Deletes the live rows matching every filter. An empty filter list is
    /// refused: DataFusion 55 also passes one for `WHERE false` and for
    /// predicates it turned into joins (`WHERE id IN (SELECT ...)`), where
    /// deleting every row would be wrong. [`crate::MemwalSession`] plans
    /// those statements itself (and `DELETE` without `WHERE` as `TRUNCATE`);
    /// a plain `SessionContext` is safe only for predicates on the table's
    /// own columns, without `LIMIT` (which DataFusion does not pass on).
    async fn delete_from(
        &self,
        state: &dyn Session,
        filters: Vec<Expr>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let Some(predicate) = conjunction(filters) else {
            return Err(DataFusionError::Plan(
                "memwal refuses a DELETE without a usable filter: DataFusion drops \
                 WHERE false and subquery predicates. memwal's session plans such a \
                 DELETE itself (the memwal shell, MemwalSession::sql, Root.sql), a plain \
                 DataFusion SessionContext does not; TRUNCATE deletes every row"
                    .into(),
            ));
        };
        self.require_key()?;
        // The key and what the predicate reads, nothing else (no blob
        // value is read unless the predicate needs it).
        let schema = self.schema();
        let mut columns = self.table.table_schema().key.clone();
        for column in predicate.column_refs() {
            columns.push(schema.index_of(&column.name)?);
        }
        columns.sort_unstable();
        columns.dedup();
        let df_schema = DFSchema::try_from(schema.project(&columns)?)?;
        let predicate = state.create_physical_expr(predicate, &df_schema)?;
        let scan = self.scan(state, Some(&columns), &[], None).await?;
        let matching = Arc::new(FilterExec::try_new(predicate, scan)?);
        Ok(Arc::new(DeleteExec::new(Arc::clone(&self.table), matching)))
    }

    /// Deletes every live row (reading only their keys).
    async fn truncate(&self, state: &dyn Session) -> Result<Arc<dyn ExecutionPlan>> {
        self.require_key()?;
        let key = self.table.table_schema().key.clone();
        let scan = self.scan(state, Some(&key), &[], None).await?;
        Ok(Arc::new(DeleteExec::new(Arc::clone(&self.table), scan)))
    }
}

impl MemwalTable {
    /// Whether a scan applies `filter` before it reads blob values: the
    /// table has blob columns, and the filter reads none of them and gives
    /// the same answer when evaluated twice.
    fn filters_before_blobs(&self, filter: &Expr) -> bool {
        let schema = self.table.table_schema();
        let blob = |name: &str| {
            let index = schema.schema.index_of(name).ok();
            schema.blobs.iter().any(|b| Some(b.index) == index)
        };
        !schema.blobs.is_empty()
            && !filter.is_volatile()
            && !filter.column_refs().iter().any(|c| blob(&c.name))
    }

    /// Refuses to delete from a table without a key: rows are deleted by
    /// key (tombstones), and an append-only table has none.
    pub(super) fn require_key(&self) -> Result<()> {
        if self.table.table_schema().has_key() {
            Ok(())
        } else {
            Err(DataFusionError::Plan(format!(
                "table {} has no primary key: it is append-only, rows cannot be deleted \
                 (DELETE and TRUNCATE alike); DROP TABLE and CREATE TABLE give an empty one",
                self.path
            )))
        }
    }
}

/// Why an `UPDATE` of `table` is refused, and what to do instead.
pub(crate) fn update_refused(table: &dyn std::fmt::Display) -> String {
    format!(
        "UPDATE is not supported by memwal tables: INSERT INTO {table} the whole new row \
         (an INSERT replaces the row with the same primary key)"
    )
}

#[cfg(test)]
mod tests {
    use datafusion::arrow::datatypes::{DataType, Schema};
    use datafusion::logical_expr::{col, lit};
    use object_store::memory::InMemory;

    use super::*;
    use crate::writer::WriterOptions;

    /// A provider of a table keyed by `id` of type `key`, with a `v` column
    /// (or keyed by both if `compound`).
    fn provider(key: DataType, compound: bool) -> MemwalTable {
        let schema = Schema::new(vec![
            Field::new("id", key, false),
            Field::new("v", DataType::Int64, false),
        ]);
        let key: Vec<String> = match compound {
            true => vec!["id".into(), "v".into()],
            false => vec!["id".into()],
        };
        let meta = TableMeta::new(&schema, key, &[]).unwrap();
        let table = Table::new(
            Arc::new(InMemory::new()),
            "tables/t",
            &meta,
            WriterOptions::default(),
        );
        MemwalTable::new(ObjectPath::new(["t"]).unwrap(), meta, Arc::new(table))
    }

    fn pushdown(t: &MemwalTable, filter: &Expr) -> TableProviderFilterPushDown {
        t.supports_filters_pushdown(&[filter]).unwrap().remove(0)
    }

    #[test]
    fn filters_on_a_one_column_key_are_pushed_inexactly() {
        use TableProviderFilterPushDown::{Inexact, Unsupported};
        let t = provider(DataType::Int64, false);
        // Pushed filters are still applied above the scan.
        assert_eq!(pushdown(&t, &col("id").eq(lit(7i64))), Inexact);
        assert_eq!(pushdown(&t, &col("id").gt(lit(7i64))), Inexact);
        assert_eq!(pushdown(&t, &col("v").eq(lit(7i64))), Unsupported);
        // A compound key is never a lookup or a range.
        let t = provider(DataType::Int64, true);
        assert_eq!(pushdown(&t, &col("id").eq(lit(7i64))), Unsupported);
        assert_eq!(pushdown(&t, &col("id").gt(lit(7i64))), Unsupported);
    }
}
