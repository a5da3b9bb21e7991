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
use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::{DataType, Field, SchemaRef};
use datafusion::catalog::Session;
use datafusion::common::{Constraint, Constraints, DFSchema, ScalarValue};
use datafusion::datasource::sink::DataSinkExec;
use datafusion::datasource::{TableProvider, TableType};
use datafusion::error::{DataFusionError, Result};
use datafusion::logical_expr::dml::InsertOp;
use datafusion::logical_expr::utils::conjunction;
use datafusion::logical_expr::{BinaryExpr, Expr, Operator, TableProviderFilterPushDown};
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::filter::FilterExec;

use super::delete_exec::DeleteExec;
use super::insert_sink::{InsertSink, key_order_of};
use super::scan_exec::{ScanExec, ScanMode};
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

    /// The literal keys `filter` selects, if it is `key = const`,
    /// `key IN (consts)` or an OR of those, on a one-column key.
    fn point_keys(&self, filter: &Expr) -> Option<Vec<ScalarValue>> {
        let key_field = self.key_field()?;
        let is_key = |e: &Expr| is_key(e, key_field);
        let literal = |e: &Expr| match e {
            Expr::Literal(v, _) if !v.is_null() => Some(v.clone()),
            _ => None,
        };
        match filter {
            Expr::BinaryExpr(BinaryExpr {
                left,
                op: Operator::Eq,
                right,
            }) => {
                if is_key(left) {
                    Some(vec![literal(right)?])
                } else if is_key(right) {
                    Some(vec![literal(left)?])
                } else {
                    None
                }
            }
            Expr::InList(list) if !list.negated && is_key(&list.expr) => {
                list.list.iter().map(literal).collect()
            }
            // DataFusion rewrites a short `IN` list to `=` terms joined by OR.
            Expr::BinaryExpr(BinaryExpr {
                left,
                op: Operator::Or,
                right,
            }) => {
                let mut keys = self.point_keys(left)?;
                keys.extend(self.point_keys(right)?);
                Some(keys)
            }
            _ => None,
        }
    }

    /// Narrows `bounds` by `filter` if it is a range on a one-column key
    /// (`key > const`, `<`, `>=`, `<=`, either way round, or `BETWEEN`)
    /// whose literal the key's type holds exactly; returns whether it did.
    fn narrow_key_bounds(&self, filter: &Expr, bounds: &mut KeyBounds) -> bool {
        let Some(key_field) = self.key_field() else {
            return false;
        };
        let is_key = |e: &Expr| is_key(e, key_field);
        // The literal as a key value, if it converts both ways unchanged.
        let exact = |e: &Expr| match e {
            Expr::Literal(v, _) if !v.is_null() => {
                let key = v.cast_to(key_field.data_type()).ok()?;
                (key.cast_to(&v.data_type()).ok()? == *v).then_some(key)
            }
            _ => None,
        };
        match filter {
            Expr::BinaryExpr(BinaryExpr { left, op, right }) => {
                let (op, value) = if is_key(left) {
                    (*op, right)
                } else if is_key(right) {
                    let Some(swapped) = op.swap() else {
                        return false;
                    };
                    (swapped, left)
                } else {
                    return false;
                };
                let Some(value) = exact(value) else {
                    return false;
                };
                match op {
                    Operator::Gt => bounds.above(value, false),
                    Operator::GtEq => bounds.above(value, true),
                    Operator::Lt => bounds.below(value, false),
                    Operator::LtEq => bounds.below(value, true),
                    _ => return false,
                }
                true
            }
            Expr::Between(between) if !between.negated && is_key(&between.expr) => {
                let (Some(low), Some(high)) = (exact(&between.low), exact(&between.high)) else {
                    return false;
                };
                bounds.above(low, true);
                bounds.below(high, true);
                true
            }
            _ => false,
        }
    }

    /// The keys selected by every point filter among `filters` (their
    /// intersection is what matters; using one of them is enough, the
    /// filters still apply above the scan).
    fn lookup_keys(&self, filters: &[Expr]) -> Result<Option<RecordBatch>> {
        let Some(values) = filters.iter().find_map(|f| self.point_keys(f)) else {
            return Ok(None);
        };
        let schema = &self.table.table_schema().schema;
        let key_type = schema.field(self.table.table_schema().key[0]).data_type();
        let mut keys = Vec::with_capacity(values.len());
        let mut seen = std::collections::HashSet::new();
        for value in values {
            // A literal the key's type cannot hold: scan instead.
            let Ok(key) = value.cast_to(key_type) else {
                return Ok(None);
            };
            if key.is_null() {
                return Ok(None);
            }
            if seen.insert(key.clone()) {
                keys.push(key);
            }
        }
        let array = ScalarValue::iter_to_array(keys)?;
        let key_schema = Arc::new(schema.project(&self.table.table_schema().key)?);
        Ok(Some(RecordBatch::try_new(key_schema, vec![array])?))
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
        Ok(filters
            .iter()
            .map(|f| {
                let range = self.narrow_key_bounds(f, &mut KeyBounds::all());
                match self.point_keys(f).is_some() || range {
                    true => TableProviderFilterPushDown::Inexact,
                    false => TableProviderFilterPushDown::Unsupported,
                }
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
        let mode = match self.lookup_keys(filters)? {
            Some(keys) => ScanMode::Keys(keys),
            None => ScanMode::All,
        };
        let mut bounds = KeyBounds::all();
        for filter in filters {
            self.narrow_key_bounds(filter, &mut bounds);
        }
        Ok(Arc::new(
            ScanExec::new(
                Arc::clone(&self.table),
                projection.cloned(),
                mode,
                bounds,
                state.config().target_partitions(),
            )
            .await?,
        ))
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

    /// Deletes the live rows matching every filter. An empty filter list is
    /// refused: DataFusion 55 also passes one for `WHERE false` and for
    /// predicates it turned into joins (`WHERE id IN (SELECT ...)`), where
    /// deleting every row would be wrong. [`crate::MemwalSession`] plans
    /// those statements itself (and `DELETE` without `WHERE` as `TRUNCATE`);
    /// a plain `SessionContext` is safe only for predicates on the table's
    /// own columns.
    async fn delete_from(
        &self,
        state: &dyn Session,
        filters: Vec<Expr>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let Some(predicate) = conjunction(filters) else {
            return Err(DataFusionError::Plan(
                "memwal refuses a DELETE without a usable filter (DataFusion drops \
                 WHERE false and subquery predicates); run it through MemwalSession, \
                 or use TRUNCATE to delete every row"
                    .into(),
            ));
        };
        let df_schema = DFSchema::try_from(self.schema())?;
        let predicate = state.create_physical_expr(predicate, &df_schema)?;
        let scan = self.scan(state, None, &[], None).await?;
        let matching = Arc::new(FilterExec::try_new(predicate, scan)?);
        self.require_key()?;
        Ok(Arc::new(DeleteExec::new(Arc::clone(&self.table), matching)))
    }

    /// Deletes every live row.
    async fn truncate(&self, state: &dyn Session) -> Result<Arc<dyn ExecutionPlan>> {
        self.require_key()?;
        let scan = self.scan(state, None, &[], None).await?;
        Ok(Arc::new(DeleteExec::new(Arc::clone(&self.table), scan)))
    }
}

/// Whether `e` is the key column `key`, or a cast of it that keeps
/// distinct keys distinct and in order (DataFusion adds one to compare a
/// fixed-size binary key with a binary literal, or a narrow integer with a
/// wide one).
fn is_key(e: &Expr, key: &Field) -> bool {
    match e {
        Expr::Column(c) => c.name == *key.name(),
        Expr::Cast(cast) => {
            matches!(cast.expr.as_ref(), Expr::Column(c) if c.name == *key.name())
                && injective_cast(key.data_type(), cast.field.data_type())
        }
        _ => false,
    }
}

/// Whether casting `from` to `to` keeps distinct values distinct, so a
/// literal cast back to `from` names the one key that can match.
fn injective_cast(from: &DataType, to: &DataType) -> bool {
    use DataType::*;
    let binary = |t: &DataType| matches!(t, Binary | LargeBinary | BinaryView | FixedSizeBinary(_));
    let string = |t: &DataType| matches!(t, Utf8 | LargeUtf8 | Utf8View);
    let signed = |t: &DataType| matches!(t, Int8 | Int16 | Int32 | Int64);
    let unsigned = |t: &DataType| matches!(t, UInt8 | UInt16 | UInt32 | UInt64);
    (binary(from) && binary(to))
        || (string(from) && string(to))
        || (signed(from) && *to == Int64)
        || (unsigned(from) && (*to == UInt64 || *to == Int64 && *from != UInt64))
}

impl MemwalTable {
    fn require_key(&self) -> Result<()> {
        if self.table.table_schema().has_key() {
            Ok(())
        } else {
            Err(DataFusionError::Plan(format!(
                "table {} has no primary key: it is append-only, rows cannot be deleted",
                self.path
            )))
        }
    }
}

#[cfg(test)]
mod tests {
    use datafusion::arrow::datatypes::Schema;
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

    fn bounds(t: &MemwalTable, filters: &[Expr]) -> KeyBounds {
        let mut bounds = KeyBounds::all();
        for f in filters {
            t.narrow_key_bounds(f, &mut bounds);
        }
        bounds
    }

    #[test]
    fn point_filters_on_the_key_become_lookups() {
        let t = provider(DataType::Int64, false);
        assert_eq!(
            t.point_keys(&col("id").eq(lit(7i64))),
            Some(vec![7i64.into()])
        );
        assert_eq!(
            t.point_keys(&lit(7i64).eq(col("id"))),
            Some(vec![7i64.into()])
        );
        let list = col("id").in_list(vec![lit(1i64), lit(2i64), lit(1i64)], false);
        assert_eq!(t.point_keys(&list).map(|k| k.len()), Some(3));
        let or = col("id").eq(lit(1i64)).or(col("id").eq(lit(5i64)));
        assert_eq!(t.point_keys(&or), Some(vec![1i64.into(), 5i64.into()]));
        // Repeated keys are looked up once.
        let keys = t.lookup_keys(&[list]).unwrap().unwrap();
        assert_eq!(keys.num_rows(), 2);

        // Not a point filter: another column, a negation, an OR with a
        // non-key term, NULL, a comparison.
        for f in [
            col("v").eq(lit(7i64)),
            col("id").in_list(vec![lit(1i64)], true),
            col("id").eq(lit(1i64)).or(col("v").eq(lit(2i64))),
            col("id").eq(lit(ScalarValue::Int64(None))),
            col("id").gt(lit(3i64)),
            col("id").eq(col("v")),
        ] {
            assert_eq!(t.point_keys(&f), None, "{f}");
        }
        assert_eq!(
            pushdown(&t, &col("v").eq(lit(7i64))),
            TableProviderFilterPushDown::Unsupported
        );
        // Pushed filters are still applied above the scan.
        assert_eq!(
            pushdown(&t, &col("id").eq(lit(7i64))),
            TableProviderFilterPushDown::Inexact
        );
        // A literal the key's type cannot hold is no lookup.
        assert!(
            t.lookup_keys(&[col("id").eq(lit("seven"))])
                .unwrap()
                .is_none()
        );
    }

    #[test]
    fn a_compound_key_is_never_a_lookup_or_a_range() {
        let t = provider(DataType::Int64, true);
        assert_eq!(t.point_keys(&col("id").eq(lit(7i64))), None);
        assert_eq!(bounds(&t, &[col("id").gt(lit(7i64))]), KeyBounds::all());
        assert_eq!(
            pushdown(&t, &col("id").eq(lit(7i64))),
            TableProviderFilterPushDown::Unsupported
        );
    }

    #[test]
    fn ranges_on_the_key_narrow_the_bounds_exactly() {
        let t = provider(DataType::Int32, false);
        let b = bounds(&t, &[col("id").gt(lit(3i32)), col("id").lt_eq(lit(9i32))]);
        assert_eq!(b.lower, Some((3i32.into(), false)));
        assert_eq!(b.upper, Some((9i32.into(), true)));
        // Either way round, the operator swapped.
        let b = bounds(&t, &[lit(3i32).lt(col("id"))]);
        assert_eq!(b.lower, Some((3i32.into(), false)));
        // BETWEEN is inclusive; the tighter of two bounds wins.
        let b = bounds(
            &t,
            &[
                col("id").between(lit(1i32), lit(100i32)),
                col("id").gt_eq(lit(5i32)),
            ],
        );
        assert_eq!(b.lower, Some((5i32.into(), true)));
        assert_eq!(b.upper, Some((100i32.into(), true)));
        // A literal the key cannot hold exactly narrows nothing: 3.5 is no
        // Int32, and 2^40 overflows it.
        assert_eq!(bounds(&t, &[col("id").gt(lit(3.5f64))]), KeyBounds::all());
        assert_eq!(
            bounds(&t, &[col("id").lt(lit(1i64 << 40))]),
            KeyBounds::all()
        );
        // A wider literal that converts both ways unchanged does.
        assert_eq!(
            bounds(&t, &[col("id").lt(lit(40i64))]).upper,
            Some((40i32.into(), false))
        );
        // Not ranges: NOT BETWEEN, <>, another column.
        for f in [
            col("id").not_between(lit(1i32), lit(5i32)),
            col("id").not_eq(lit(1i32)),
            col("v").gt(lit(1i64)),
        ] {
            assert_eq!(
                bounds(&t, std::slice::from_ref(&f)),
                KeyBounds::all(),
                "{f}"
            );
        }
    }

    #[test]
    fn only_casts_that_keep_keys_distinct_count_as_the_key() {
        use DataType::*;
        for (from, to) in [
            (Int8, Int64),
            (Int32, Int64),
            (UInt32, Int64),
            (UInt64, UInt64),
            (Utf8, Utf8View),
            (FixedSizeBinary(16), Binary),
        ] {
            assert!(injective_cast(&from, &to), "{from} -> {to}");
        }
        for (from, to) in [
            (Int64, Int32),
            (UInt64, Int64),
            (Int64, Float64),
            (Int64, Utf8),
            (Utf8, Binary),
            (Float64, Int64),
        ] {
            assert!(!injective_cast(&from, &to), "{from} -> {to}");
        }
    }
}
