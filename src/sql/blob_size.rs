//! `blob_size(column)`: the size in bytes of a binary value, NULL for
//! NULL. Over a memwal scan it reads no blob bytes: DataFusion moves the
//! call out of filters, sorts, limits and aggregates into a projection
//! over the scan (the function's placement is `MoveTowardsLeafNodes`), and
//! [`ScanExec`] takes that projection over (see its
//! `try_swapping_with_projection` and [`BlobSizePushdown`]) and answers
//! from the column's descriptors. Where the values are read anyway
//! (selected beside the size, a key lookup) it measures them.
//! [`NullChecksBySize`] has `col IS [NOT] NULL` and `count(col)` of a
//! binary column asked through `blob_size` too, so they read no value
//! either.

use std::sync::Arc;

use datafusion::arrow::array::{Array, AsArray, Int64Array};
use datafusion::arrow::datatypes::DataType;
use datafusion::common::DFSchemaRef;
use datafusion::common::config::ConfigOptions;
use datafusion::common::plan_err;
use datafusion::common::tree_node::{Transformed, TransformedResult, TreeNode};
use datafusion::error::Result;
use datafusion::logical_expr::expr::AggregateFunction;
use datafusion::logical_expr::expr_rewriter::NamePreserver;
use datafusion::logical_expr::{
    ColumnarValue, Expr, ExpressionPlacement, LogicalPlan, ScalarFunctionArgs, ScalarUDF,
    ScalarUDFImpl, Signature, Volatility,
};
use datafusion::optimizer::AnalyzerRule;
use datafusion::physical_expr::expressions::Column;
use datafusion::physical_expr::{Partitioning, ScalarFunctionExpr};
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::execution_plan::{ChildrenPropertiesMode, ReplaceChildrenOptions};
use datafusion::physical_plan::projection::ProjectionExec;
use datafusion::physical_plan::repartition::RepartitionExec;
use datafusion::physical_plan::{ExecutionPlan, PhysicalExpr};

use super::scan_exec::ScanExec;

/// The function's name in SQL.
pub const BLOB_SIZE: &str = "blob_size";

/// The `blob_size` function.
pub fn blob_size_function() -> ScalarUDF {
    ScalarUDF::from(BlobSize {
        signature: Signature::any(1, Volatility::Immutable),
    })
}

/// The column `expr` takes the size of, if it is `blob_size(<column>)`.
pub fn blob_size_of(expr: &Arc<dyn PhysicalExpr>) -> Option<&Column> {
    let call = expr.downcast_ref::<ScalarFunctionExpr>()?;
    match call.args() {
        [arg] if call.name() == BLOB_SIZE => arg.downcast_ref::<Column>(),
        _ => None,
    }
}

#[derive(Debug, PartialEq, Eq, Hash)]
struct BlobSize {
    signature: Signature,
}

impl ScalarUDFImpl for BlobSize {
    fn name(&self) -> &str {
        BLOB_SIZE
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    /// Of a column: moves towards the scan (DataFusion's leaf expression
    /// pushdown lifts it out of filters, sorts, limits and aggregates
    /// into a projection there), where a memwal scan answers it.
    fn placement(&self, args: &[ExpressionPlacement]) -> ExpressionPlacement {
        match args {
            [ExpressionPlacement::Column] => ExpressionPlacement::MoveTowardsLeafNodes,
            _ => ExpressionPlacement::KeepInPlace,
        }
    }

    fn return_type(&self, args: &[DataType]) -> Result<DataType> {
        match &args[0] {
            DataType::Binary | DataType::LargeBinary | DataType::BinaryView | DataType::Null => {
                Ok(DataType::Int64)
            }
            other => plan_err!("{BLOB_SIZE} takes a binary value, got {other}"),
        }
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let values = args.args[0].to_array(args.number_rows)?;
        let size = |len: usize| len as i64;
        let sizes: Int64Array = match values.data_type() {
            DataType::Binary => values
                .as_binary::<i32>()
                .iter()
                .map(|v| v.map(|v| size(v.len())))
                .collect(),
            DataType::LargeBinary => values
                .as_binary::<i64>()
                .iter()
                .map(|v| v.map(|v| size(v.len())))
                .collect(),
            DataType::BinaryView => values
                .as_binary_view()
                .iter()
                .map(|v| v.map(|v| size(v.len())))
                .collect(),
            _ => Int64Array::new_null(values.len()),
        };
        Ok(ColumnarValue::Array(Arc::new(sizes)))
    }
}

/// Rewrites `x IS NULL`, `x IS NOT NULL` and `count(x)` (not DISTINCT)
/// of a binary column `x` to the same over `blob_size(x)`, which is NULL
/// exactly where `x` is, keeping their output names: over a memwal scan
/// they are then answered from descriptors, reading no blob value.
#[derive(Debug, Default)]
pub struct NullChecksBySize;

impl AnalyzerRule for NullChecksBySize {
    fn name(&self) -> &str {
        "memwal_null_checks_by_size"
    }

    fn analyze(&self, plan: LogicalPlan, _: &ConfigOptions) -> Result<LogicalPlan> {
        plan.transform_up_with_subqueries(|plan| {
            let inputs: Vec<DFSchemaRef> = plan
                .inputs()
                .iter()
                .map(|i| Arc::clone(i.schema()))
                .collect();
            let binary = |e: &Expr| {
                let Expr::Column(column) = e else {
                    return false;
                };
                inputs.iter().any(|schema| {
                    schema
                        .field_with_name(column.relation.as_ref(), &column.name)
                        .is_ok_and(|f| {
                            matches!(
                                f.data_type(),
                                DataType::Binary | DataType::LargeBinary | DataType::BinaryView
                            )
                        })
                })
            };
            let size = |e: Expr| blob_size_function().call(vec![e]);
            let names = NamePreserver::new(&plan);
            plan.map_expressions(|expr| {
                let name = names.save(&expr);
                let rewritten = expr.transform_up(|e| {
                    Ok(match e {
                        Expr::IsNull(x) if binary(&x) => {
                            Transformed::yes(Expr::IsNull(Box::new(size(*x))))
                        }
                        Expr::IsNotNull(x) if binary(&x) => {
                            Transformed::yes(Expr::IsNotNull(Box::new(size(*x))))
                        }
                        Expr::AggregateFunction(mut f)
                            if f.func.name() == "count"
                                && !f.params.distinct
                                && matches!(f.params.args.as_slice(), [x] if binary(x)) =>
                        {
                            let x = f.params.args.remove(0);
                            f.params.args.push(size(x));
                            Transformed::yes(Expr::AggregateFunction(AggregateFunction { ..f }))
                        }
                        e => Transformed::no(e),
                    })
                })?;
                Ok(rewritten.update_data(|e| name.restore(e)))
            })
        })
        .data()
    }
}

/// Lets a memwal scan answer `blob_size` from descriptors where
/// DataFusion's own projection pushdown stops: a projection of columns
/// and `blob_size` calls over a scan, with only round-robin repartitions
/// (which do not look at columns) between them, becomes the scan itself
/// (see `ScanExec::try_swapping_with_projection`) under those operators.
#[derive(Debug, Default)]
pub struct BlobSizePushdown;

impl PhysicalOptimizerRule for BlobSizePushdown {
    fn optimize(
        &self,
        plan: Arc<dyn ExecutionPlan>,
        _: &ConfigOptions,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        plan.transform_down(|node| {
            let Some(projection) = node.downcast_ref::<ProjectionExec>() else {
                return Ok(Transformed::no(node));
            };
            let mut between = Vec::new();
            let mut child = Arc::clone(projection.input());
            while let Some(repartition) = child.downcast_ref::<RepartitionExec>()
                && matches!(repartition.partitioning(), Partitioning::RoundRobinBatch(_))
            {
                between.push(Arc::clone(&child));
                child = Arc::clone(repartition.input());
            }
            if child.downcast_ref::<ScanExec>().is_none() {
                return Ok(Transformed::no(node));
            }
            let Some(mut plan) = child.try_swapping_with_projection(projection)? else {
                return Ok(Transformed::no(node));
            };
            for operator in between.into_iter().rev() {
                let recompute = ReplaceChildrenOptions::new(ChildrenPropertiesMode::Recompute);
                plan = operator.replace_children(vec![plan], recompute)?;
            }
            Ok(Transformed::yes(plan))
        })
        .data()
    }

    fn name(&self) -> &str {
        "memwal_blob_size_pushdown"
    }

    fn schema_check(&self) -> bool {
        true
    }
}
