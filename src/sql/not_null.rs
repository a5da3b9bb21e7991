//! INSERT into a memwal table: a NULL in a primary-key or NOT NULL column
//! is an error that names the column.
//!
//! DataFusion checks NOT NULL columns itself, but by position or by the
//! name of a `VALUES` column (`Column 'column1' is declared as non-nullable
//! ...`), before memwal's own check (which names the column) can run. So
//! the session rewrites an insert into a memwal table: `VALUES` rows no
//! longer claim the target's nullability, and each NOT NULL column passes
//! through [`NotNull`], which fails with the column's name.

use std::sync::Arc;

use datafusion::arrow::datatypes::{DataType, Field, FieldRef};
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::common::{Column, DFSchema};
use datafusion::datasource::source_as_provider;
use datafusion::error::Result;
use datafusion::logical_expr::{
    ColumnarValue, DmlStatement, Expr, LogicalPlan, LogicalPlanBuilder, ReturnFieldArgs,
    ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature, Values, Volatility, WriteOp,
};

use super::MemwalTable;
use crate::error::Error;

/// Rewrites every insert into a memwal table in `plan` (see the module
/// doc); other plans are returned as they are.
pub(crate) fn name_null_violations(plan: LogicalPlan) -> Result<LogicalPlan> {
    plan.transform_up(|node| match node {
        LogicalPlan::Dml(dml) if matches!(dml.op, WriteOp::Insert(_)) => check_insert(dml),
        other => Ok(Transformed::no(other)),
    })
    .map(|t| t.data)
}

fn check_insert(dml: DmlStatement) -> Result<Transformed<LogicalPlan>> {
    let provider = source_as_provider(&dml.target)?;
    let Some(table) = provider.downcast_ref::<MemwalTable>() else {
        return Ok(Transformed::no(LogicalPlan::Dml(dml)));
    };
    let target = dml.target.schema();
    let input = Arc::unwrap_or_clone(dml.input).transform_up(|node| match node {
        LogicalPlan::Values(values) => Ok(Transformed::yes(LogicalPlan::Values(nullable(values)?))),
        other => other.recompute_schema().map(Transformed::yes),
    })?;
    let input = input.data;
    if input.schema().fields().len() != target.fields().len() {
        // Not the shape DataFusion's INSERT planning makes: leave it.
        let dml = DmlStatement::new(dml.table_name, dml.target, dml.op, Arc::new(input));
        return Ok(Transformed::yes(LogicalPlan::Dml(dml)));
    }
    let key = table.meta().primary_key_indices();
    let exprs: Vec<Expr> = input
        .schema()
        .iter()
        .zip(target.fields())
        .enumerate()
        .map(|(i, ((qualifier, field), target))| {
            let column = Expr::Column(Column::from((qualifier, field)));
            if target.is_nullable() {
                return column;
            }
            let what = if key.contains(&i) {
                "primary key column"
            } else {
                "NOT NULL column"
            };
            ScalarUDF::from(NotNull {
                message: format!("{what} '{}' holds NULL", target.name()),
            })
            .call(vec![column])
            .alias(field.name())
        })
        .collect();
    let input = LogicalPlanBuilder::from(input).project(exprs)?.build()?;
    let dml = DmlStatement::new(dml.table_name, dml.target, dml.op, Arc::new(input));
    Ok(Transformed::yes(LogicalPlan::Dml(dml)))
}

/// `values` with every column nullable: the rows are checked above them.
fn nullable(values: Values) -> Result<Values> {
    let fields = values
        .schema
        .iter()
        .map(|(qualifier, field)| {
            let field: FieldRef = Arc::new(field.as_ref().clone().with_nullable(true));
            (qualifier.cloned(), field)
        })
        .collect();
    let schema = DFSchema::new_with_metadata(fields, values.schema.metadata().clone())?;
    Ok(Values {
        schema: Arc::new(schema),
        values: values.values,
    })
}

/// `not_null(value)`: the value itself, or the error `message` if any row
/// is NULL. Volatile, so the check runs when the insert runs, never while
/// planning (an `EXPLAIN` of a bad insert still explains it).
#[derive(Debug, PartialEq, Eq, Hash)]
struct NotNull {
    message: String,
}

impl ScalarUDFImpl for NotNull {
    fn name(&self) -> &str {
        "not_null"
    }

    fn signature(&self) -> &Signature {
        static SIGNATURE: std::sync::LazyLock<Signature> =
            std::sync::LazyLock::new(|| Signature::any(1, Volatility::Volatile));
        &SIGNATURE
    }

    fn return_type(&self, args: &[DataType]) -> Result<DataType> {
        Ok(args[0].clone())
    }

    fn return_field_from_args(&self, args: ReturnFieldArgs) -> Result<FieldRef> {
        let arg = &args.arg_fields[0];
        Ok(Arc::new(Field::new(
            self.name(),
            arg.data_type().clone(),
            false,
        )))
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let value = args.args.into_iter().next().expect("one argument");
        let has_null = match &value {
            ColumnarValue::Array(array) => array.logical_null_count() > 0,
            ColumnarValue::Scalar(scalar) => scalar.is_null(),
        };
        if has_null {
            return Err(Error::invalid(self.message.clone()).into());
        }
        Ok(value)
    }
}
