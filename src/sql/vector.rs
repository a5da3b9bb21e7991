//! Vector search in SQL: the `vector_search(table, column, query, k [, ef])`
//! table function (every column of the table plus `_distance`, nearest
//! first; a `WHERE` on the table's columns is pushed into the search) and
//! the exact distance functions `l2_distance`, `cosine_distance` and
//! `inner_product`, the ground truth for `ORDER BY ... LIMIT k`.

use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::array::{Array, ArrayRef, AsArray, Float32Array};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{DataType, Field, Float32Type, Schema, SchemaRef};
use datafusion::catalog::{Session, TableFunctionArgs, TableFunctionImpl, TableProvider};
use datafusion::common::{DFSchema, ScalarValue, exec_err, plan_err};
use datafusion::datasource::TableType;
use datafusion::error::{DataFusionError, Result};
use datafusion::logical_expr::utils::conjunction;
use datafusion::logical_expr::{
    ColumnarValue, Expr, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature,
    TableProviderFilterPushDown, Volatility,
};
use datafusion::physical_expr::expressions::Column;
use datafusion::physical_expr::{PhysicalExpr, PhysicalSortExpr};
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::projection::ProjectionExec;
use datafusion::physical_plan::sorts::sort_preserving_merge::SortPreservingMergeExec;

use super::function_args::{constant, named_table, text};
use super::scan_exec::MinPartitions;
use super::vector_search_exec::VectorSearchExec;
use crate::catalog::Catalog;
use crate::read::VectorQuery;
use crate::schema::{Metric, vector_fault};
use crate::table::{Table, TableCache};

const FUNCTION: &str = "vector_search";

/// The name of the distance column `vector_search` adds.
pub const DISTANCE_COLUMN: &str = "_distance";

/// The candidate list size of a search when the call gives none.
pub const DEFAULT_EF: usize = 64;

/// Largest `k` (and `ef`) a search accepts.
pub const MAX_K: usize = 100_000;

/// `vector_search(table, column, query, k [, ef])`.
#[derive(Debug)]
pub struct VectorSearchFunction {
    catalog: Arc<Catalog>,
    tables: Arc<TableCache>,
}

impl VectorSearchFunction {
    /// The function over the tables of `catalog`, opened in `tables`.
    pub fn new(catalog: Arc<Catalog>, tables: Arc<TableCache>) -> Self {
        Self { catalog, tables }
    }
}

impl TableFunctionImpl for VectorSearchFunction {
    fn call_with_args(&self, args: TableFunctionArgs) -> Result<Arc<dyn TableProvider>> {
        let exprs = args.exprs();
        if !(4..=5).contains(&exprs.len()) {
            return plan_err!(
                "vector_search(table, column, query, k [, ef]) takes 4 or 5 arguments, got {}",
                exprs.len()
            );
        }
        let value = |i: usize| constant(args.session(), &exprs[i], FUNCTION);
        let name = text(value(0)?, "table", FUNCTION)?;
        let column = text(value(1)?, "column", FUNCTION)?;
        let (meta, table) =
            named_table(&self.catalog, &self.tables, &name, args.session(), FUNCTION)?;
        let index = meta.schema().index_of(&column).map_err(|_| {
            DataFusionError::Plan(format!(
                "vector_search: table '{name}' has no column '{column}'"
            ))
        })?;
        let Some(vector) = table
            .table_schema()
            .vectors
            .iter()
            .find(|v| v.index == index)
        else {
            return plan_err!(
                "vector_search: column '{column}' of table '{name}' is not a FLOAT[n] vector column"
            );
        };
        let query = query_vector(value(2)?, vector.dim as usize)?;
        let k = count(value(3)?, "k")?;
        let ef = match exprs.len() {
            5 => count(value(4)?, "ef")?,
            _ => DEFAULT_EF,
        };
        let mut fields = meta.schema().fields().to_vec();
        fields.push(Arc::new(Field::new(
            DISTANCE_COLUMN,
            DataType::Float32,
            false,
        )));
        Ok(Arc::new(VectorSearchTable {
            name,
            table,
            schema: Arc::new(Schema::new(fields)),
            query: VectorQuery {
                column: index,
                vector: query,
                k,
                ef: ef.max(k),
                filter: None,
            },
        }))
    }
}

fn count(value: ScalarValue, what: &str) -> Result<usize> {
    let n = match value.cast_to(&DataType::Int64) {
        Ok(ScalarValue::Int64(Some(n))) if value.data_type().is_integer() => n,
        _ => {
            return plan_err!(
                "vector_search: {what} must be an integer, got {value} ({})",
                value.data_type()
            );
        }
    };
    if !(1..=MAX_K as i64).contains(&n) {
        return plan_err!("vector_search: {what} must be in 1..={MAX_K}, got {n}");
    }
    Ok(n as usize)
}

/// The query vector: a list of `dim` finite numbers.
fn query_vector(value: ScalarValue, dim: usize) -> Result<Vec<f32>> {
    let list: ArrayRef = match &value {
        ScalarValue::List(a) if !a.is_null(0) => a.value(0),
        ScalarValue::LargeList(a) if !a.is_null(0) => a.value(0),
        ScalarValue::FixedSizeList(a) if !a.is_null(0) => a.value(0),
        other => {
            return plan_err!("vector_search: the query must be a list of numbers, got {other}");
        }
    };
    if !list.data_type().is_numeric() && !list.data_type().is_null() {
        return plan_err!(
            "vector_search: the query must be a list of numbers, got a list of {}",
            list.data_type()
        );
    }
    if list.len() != dim {
        return plan_err!(
            "vector_search: the query has {} values, the column has dimension {dim}",
            list.len()
        );
    }
    let values = cast(&list, &DataType::Float32)?;
    let values = values.as_primitive::<Float32Type>();
    if let Some(at) = (0..values.len()).find(|&i| values.is_null(i)) {
        return plan_err!(
            "vector_search: the query vector holds NULL at element {} of {dim}",
            at + 1
        );
    }
    if let Some(fault) = vector_fault(values.values()) {
        return plan_err!("vector_search: the query holds {fault}");
    }
    Ok(values.values().to_vec())
}

/// One `vector_search` call as a table.
#[derive(Debug)]
struct VectorSearchTable {
    name: String,
    table: Arc<Table>,
    schema: SchemaRef,
    query: VectorQuery,
}

#[async_trait]
impl TableProvider for VectorSearchTable {
    fn schema(&self) -> SchemaRef {
        Arc::clone(&self.schema)
    }

    fn table_type(&self) -> TableType {
        TableType::Temporary
    }

    /// Filters on the table's columns are applied inside the search, so
    /// the result is the k nearest matching rows; one on `_distance` is
    /// left to DataFusion.
    fn supports_filters_pushdown(
        &self,
        filters: &[&Expr],
    ) -> Result<Vec<TableProviderFilterPushDown>> {
        Ok(filters
            .iter()
            .map(|f| {
                let on_distance = f.column_refs().iter().any(|c| c.name == DISTANCE_COLUMN);
                match on_distance {
                    true => TableProviderFilterPushDown::Unsupported,
                    false => TableProviderFilterPushDown::Exact,
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
        let mut query = self.query.clone();
        if let Some(filter) = conjunction(filters.iter().cloned()) {
            let table_schema = DFSchema::try_from(Arc::clone(&self.table.table_schema().schema))?;
            query.filter = Some(state.create_physical_expr(filter, &table_schema)?);
        }
        let table = &self.table;
        let shards = 0..table.shard_count() as u32;
        let taken = super::statement::snapshots(table, shards.clone()).await?;
        let snapshots: Vec<_> = shards.zip(taken).collect();
        let wanted: Vec<usize> = match projection {
            Some(p) => p.clone(),
            None => (0..self.schema.fields().len()).collect(),
        };
        // A search per shard, merged by distance; but long blob values
        // are read by the partition that finds their rows, so a search
        // that selects a blob column searches every shard in one
        // partition (the others, if the session asks for more, are
        // empty) and reads only the k rows returned.
        let with_blobs = (table.table_schema().blobs.iter()).any(|b| wanted.contains(&b.index));
        let mut partitions: Vec<_> = match with_blobs {
            true => vec![snapshots],
            false => snapshots.into_iter().map(|s| vec![s]).collect(),
        };
        let min = MinPartitions::of(state.config());
        partitions.resize(partitions.len().max(min), Vec::new());
        if partitions.len() == 1 {
            let search = VectorSearchExec::new(
                self.name.clone(),
                Arc::clone(table),
                query,
                &self.schema,
                wanted,
                partitions,
            )?;
            return Ok(Arc::new(search));
        }
        // The merge orders by `_distance`: searched even if not selected.
        let distance = self.schema.fields().len() - 1;
        let mut searched = wanted.clone();
        if !searched.contains(&distance) {
            searched.push(distance);
        }
        let k = query.k;
        let search: Arc<dyn ExecutionPlan> = Arc::new(VectorSearchExec::new(
            self.name.clone(),
            Arc::clone(table),
            query,
            &self.schema,
            searched.clone(),
            partitions,
        )?);
        let at = searched.iter().position(|&c| c == distance).expect("added");
        let order = PhysicalSortExpr::new_default(Arc::new(Column::new(DISTANCE_COLUMN, at)));
        let merged = SortPreservingMergeExec::new([order].into(), search).with_fetch(Some(k));
        if searched.len() == wanted.len() {
            return Ok(Arc::new(merged));
        }
        let schema = merged.schema();
        let columns = (0..wanted.len()).map(|i| {
            let column = Arc::new(Column::new(schema.field(i).name(), i)) as Arc<dyn PhysicalExpr>;
            (column, schema.field(i).name().clone())
        });
        Ok(Arc::new(ProjectionExec::try_new(
            columns,
            Arc::new(merged),
        )?))
    }
}

/// The distance functions.
pub fn distance_functions() -> Vec<ScalarUDF> {
    [
        ("l2_distance", Kind::L2, vec![]),
        ("cosine_distance", Kind::Cosine, vec![]),
        // DataFusion's own `inner_product` (f64) has this alias: ours
        // takes both names, or the session state's next rebuild (which
        // registers its functions in no fixed order) may bring DataFusion's
        // back under `inner_product`.
        (
            "inner_product",
            Kind::InnerProduct,
            vec!["dot_product".into()],
        ),
    ]
    .into_iter()
    .map(|(name, kind, aliases)| {
        ScalarUDF::from(DistanceFunction {
            name,
            kind,
            aliases,
            signature: Signature::any(2, Volatility::Immutable),
        })
    })
    .collect()
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Kind {
    /// Euclidean distance (the `_distance` of an `l2` column).
    L2,
    /// 1 − cosine similarity (the `_distance` of a `cosine` column).
    Cosine,
    /// The inner product (the negated `_distance` of a `dot` column).
    InnerProduct,
}

/// `name(a, b)` of two vectors (FLOAT[n] columns or number lists) of equal
/// length: exact, `f32` like the search; NULL if either is NULL. A vector
/// holding a NULL element, or values writes and `vector_search` refuse
/// (see [`vector_fault`]), is an error.
#[derive(Debug, PartialEq, Eq, Hash)]
struct DistanceFunction {
    name: &'static str,
    kind: Kind,
    aliases: Vec<String>,
    signature: Signature,
}

impl ScalarUDFImpl for DistanceFunction {
    fn name(&self) -> &str {
        self.name
    }

    fn aliases(&self) -> &[String] {
        &self.aliases
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _: &[DataType]) -> Result<DataType> {
        Ok(DataType::Float32)
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let rows = args.number_rows;
        // A constant (the query of `ORDER BY cosine_distance(emb, [...])`)
        // is the same vector on every row: checked once.
        let constant = args
            .args
            .iter()
            .map(|a| matches!(a, ColumnarValue::Scalar(_)))
            .collect::<Vec<_>>();
        let mut checked = [false; 2];
        let list_type = DataType::List(Arc::new(Field::new_list_field(DataType::Float32, true)));
        let lists = args
            .args
            .iter()
            .map(|a| {
                let array = a.to_array(rows)?;
                cast(&array, &list_type).map_err(|_| {
                    DataFusionError::Plan(format!(
                        "{}: arguments must be vectors (FLOAT[n] or lists of numbers), got {}",
                        self.name,
                        array.data_type()
                    ))
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let (a, b) = (lists[0].as_list::<i32>(), lists[1].as_list::<i32>());
        let (va, vb) = (
            a.values().as_primitive::<Float32Type>().values(),
            b.values().as_primitive::<Float32Type>().values(),
        );
        let (oa, ob) = (a.value_offsets(), b.value_offsets());
        let mut out = Vec::with_capacity(rows);
        for i in 0..rows {
            if a.is_null(i) || b.is_null(i) {
                out.push(None);
                continue;
            }
            for (which, list, offsets) in [("first", a, oa), ("second", b, ob)] {
                let values = list.values();
                let range = offsets[i] as usize..offsets[i + 1] as usize;
                if values.null_count() > 0
                    && let Some(at) = range.clone().find(|&j| values.is_null(j))
                {
                    return exec_err!(
                        "{}: the {which} vector holds NULL at element {} of {}",
                        self.name,
                        at - range.start + 1,
                        range.len()
                    );
                }
            }
            let x = &va[oa[i] as usize..oa[i + 1] as usize];
            let y = &vb[ob[i] as usize..ob[i + 1] as usize];
            for (arg, (which, vector)) in [("first", x), ("second", y)].into_iter().enumerate() {
                if checked[arg] {
                    continue;
                }
                if let Some(fault) = vector_fault(vector) {
                    return exec_err!("{}: the {which} vector holds {fault}", self.name);
                }
                checked[arg] = constant[arg];
            }
            if x.len() != y.len() {
                return exec_err!(
                    "{}: vectors of different dimensions ({} and {})",
                    self.name,
                    x.len(),
                    y.len()
                );
            }
            out.push(Some(match self.kind {
                Kind::L2 => Metric::L2.reported(Metric::L2.distance(x, y)),
                Kind::Cosine => Metric::Cosine.distance(x, y),
                Kind::InnerProduct => -Metric::Dot.distance(x, y),
            }));
        }
        Ok(ColumnarValue::Array(Arc::new(Float32Array::from(out))))
    }
}
