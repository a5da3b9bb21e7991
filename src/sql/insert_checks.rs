//! INSERT into a memwal table: a NULL in a primary-key or NOT NULL column
//! is an error that names the column, and so are a vector of the wrong
//! length and a number beyond `FLOAT`'s range.
//!
//! DataFusion checks NOT NULL columns itself, but by position or by the
//! name of a `VALUES` column (`Column 'column1' is declared as non-nullable
//! ...`), before memwal's own check (which names the column) can run. So
//! the session rewrites an insert into a memwal table: `VALUES` rows no
//! longer claim the target's nullability, and each NOT NULL column passes
//! through [`NotNull`], which fails with the column's name.
//!
//! Both checks are functions of their arguments alone (the error, the
//! vector type), registered by name like memwal's other functions, so a
//! plan that checks rows on a worker carries them (see
//! `crate::sql::distributed`).
//!
//! DataFusion turns a list into a `FLOAT[n]` vector with a cast, which
//! fails on a list of another length with Arrow's words, while planning
//! for a constant (`Optimizer rule 'simplify_expressions' failed ...
//! Cannot cast to FixedSizeList(3): value at index 0 has length 2`). The
//! rewrite replaces each such cast in the insert's input with
//! [`ToVector`], which checks the lengths when the insert runs. Vectors
//! of another fixed size (`INSERT ... SELECT` from another vector column)
//! DataFusion refuses while planning (`Cannot automatically convert
//! FixedSizeList(2 x Float32) to FixedSizeList(3 x Float32)`); that
//! error is replaced by one naming the column ([`InsertSource`]).
//!
//! A number cast to `FLOAT` (a `DOUBLE`, a decimal, text) beyond its range
//! would be stored as infinity, as DataFusion casts it; the rewrite
//! replaces such casts with [`ToFloat`], which refuses the value instead
//! (as an INSERT does for an integer out of its column's range).

use std::collections::HashMap;
use std::sync::Arc;

use datafusion::arrow::array::{Array, AsArray};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{DataType, Field, FieldRef, Float32Type, Float64Type};
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::common::{Column, DFSchema, ScalarValue, internal_datafusion_err, plan_err};
use datafusion::datasource::source_as_provider;
use datafusion::error::Result;
use datafusion::logical_expr::expr::Alias;
use datafusion::logical_expr::expr_rewriter::NamePreserver;
use datafusion::logical_expr::sort_properties::{ExprProperties, SortProperties};
use datafusion::logical_expr::{
    Cast, ColumnarValue, DmlStatement, Expr, LogicalPlan, LogicalPlanBuilder, Projection,
    ReturnFieldArgs, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature, Values, Volatility,
    WriteOp, lit,
};

use datafusion::error::DataFusionError;
use datafusion::execution::SessionState;
use datafusion::sql::parser::Statement as DFStatement;
use datafusion::sql::planner::object_name_to_table_reference;
use datafusion::sql::sqlparser::ast::{ObjectName, Query, SetExpr, Statement, TableObject};

use super::MemwalTable;
use super::ddl::name_parts;
use crate::error::Error;

/// The functions the rewrite calls, to register by name.
pub(crate) fn check_functions() -> [ScalarUDF; 3] {
    [
        ScalarUDF::from(NotNull),
        ScalarUDF::from(ToVector),
        ScalarUDF::from(ToFloat),
    ]
}

/// Rewrites every insert into a memwal table in `plan` (see the module
/// doc); other plans are returned as they are.
pub(crate) fn check_inserts(plan: LogicalPlan) -> Result<LogicalPlan> {
    plan.transform_up(|node| match node {
        LogicalPlan::Dml(dml) if matches!(dml.op, WriteOp::Insert(_)) => check_insert(dml),
        other => Ok(Transformed::no(other)),
    })
    .map(|t| t.data)
}

/// What names the column of an `INSERT ... SELECT` given vectors of
/// another fixed size, which DataFusion refuses while planning without
/// naming it: the target, its column list and the source query. (A
/// `VALUES` source holds lists, whose lengths [`ToVector`] checks.)
pub(crate) struct InsertSource {
    table: ObjectName,
    columns: Vec<ObjectName>,
    source: Box<Query>,
}

impl InsertSource {
    /// The parts of `statement` if it is an `INSERT` from a query.
    pub(crate) fn of(statement: &DFStatement) -> Option<Self> {
        let DFStatement::Statement(statement) = statement else {
            return None;
        };
        let Statement::Insert(insert) = statement.as_ref() else {
            return None;
        };
        let (TableObject::TableName(table), Some(source)) = (&insert.table, &insert.source) else {
            return None;
        };
        if matches!(*source.body, SetExpr::Values(_)) {
            return None;
        }
        Some(Self {
            table: table.clone(),
            columns: insert.columns.clone(),
            source: source.clone(),
        })
    }

    /// `error`, from planning this insert, as an error naming the column
    /// if DataFusion refused vectors of another size; otherwise unchanged.
    pub(crate) async fn name_column(self, state: &SessionState, error: DataFusionError) -> Error {
        if !error
            .to_string()
            .contains("Cannot automatically convert FixedSizeList")
        {
            return error.into();
        }
        match self.mismatch(state).await {
            Some(message) => Error::invalid(message),
            None => error.into(),
        }
    }

    /// The first target column whose vectors the source gives in another
    /// size, described.
    async fn mismatch(&self, state: &SessionState) -> Option<String> {
        let normalize = state
            .config()
            .options()
            .sql_parser
            .enable_ident_normalization;
        let table = object_name_to_table_reference(self.table.clone(), normalize).ok()?;
        let schema = state.schema_for_ref(table.clone()).ok()?;
        let target = schema.table(table.table()).await.ok()??.schema();
        let targets: Vec<FieldRef> = match self.columns.is_empty() {
            true => target.fields().iter().cloned().collect(),
            false => (self.columns.iter())
                .map(|c| {
                    let name = name_parts(c).ok()?.pop()?;
                    Some(Arc::new(target.field_with_name(&name).ok()?.clone()))
                })
                .collect::<Option<_>>()?,
        };
        let query = DFStatement::Statement(Box::new(Statement::Query(self.source.clone())));
        let source = state.statement_to_plan(query).await.ok()?;
        targets
            .iter()
            .zip(source.schema().fields())
            .find_map(|(to, from)| match (to.data_type(), from.data_type()) {
                (DataType::FixedSizeList(_, dim), DataType::FixedSizeList(_, given))
                    if dim != given =>
                {
                    Some(wrong_length(
                        Some(to.name()),
                        to.data_type(),
                        *given as usize,
                        true,
                    ))
                }
                _ => None,
            })
    }
}

fn check_insert(dml: DmlStatement) -> Result<Transformed<LogicalPlan>> {
    let provider = source_as_provider(&dml.target)?;
    let Some(table) = provider.downcast_ref::<MemwalTable>() else {
        return Ok(Transformed::no(LogicalPlan::Dml(dml)));
    };
    let target = dml.target.schema();
    let columns = values_columns(&dml.input);
    // The casts DataFusion's insert planning makes, each aliased to its
    // target column in the projection at the top of the input, know their
    // column; any other cast to a vector type (the user's own, which an
    // alias of theirs may name) does not.
    let input = match Arc::unwrap_or_clone(dml.input) {
        LogicalPlan::Projection(projection) => {
            let expr = projection
                .expr
                .into_iter()
                .map(named_checked_cast)
                .collect::<Result<Vec<_>>>()?;
            let projection =
                Projection::try_new_with_schema(expr, projection.input, projection.schema)?;
            LogicalPlan::Projection(projection)
        }
        other => other,
    };
    let input = input.transform_up(|node| {
        let node = match node {
            LogicalPlan::Values(values) => LogicalPlan::Values(named_casts(values, &columns)?),
            other => other,
        };
        // Under the names they had: a node above names its input's
        // columns by them.
        let names = NamePreserver::new(&node);
        let node = node
            .map_expressions(|e| {
                let name = names.save(&e);
                Ok(e.transform_up(checked_cast)?
                    .update_data(|e| name.restore(e)))
            })?
            .data;
        match node {
            LogicalPlan::Values(values) => {
                Ok(Transformed::yes(LogicalPlan::Values(nullable(values)?)))
            }
            other => other.recompute_schema().map(Transformed::yes),
        }
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
            let message = format!("{what} '{}' holds NULL", target.name());
            ScalarUDF::from(NotNull)
                .call(vec![column, lit(message)])
                .alias(field.name())
        })
        .collect();
    let input = LogicalPlanBuilder::from(input).project(exprs)?.build()?;
    let dml = DmlStatement::new(dml.table_name, dml.target, dml.op, Arc::new(input));
    Ok(Transformed::yes(LogicalPlan::Dml(dml)))
}

/// The target column of each `VALUES` column: DataFusion plans `INSERT ...
/// VALUES` as the rows, typed like the columns they go to, under a
/// projection that names each target column (`column2 AS emb`). Empty for
/// an insert of another shape.
fn values_columns(input: &LogicalPlan) -> HashMap<String, String> {
    let LogicalPlan::Projection(projection) = input else {
        return HashMap::new();
    };
    if !matches!(projection.input.as_ref(), LogicalPlan::Values(_)) {
        return HashMap::new();
    }
    let mut columns = HashMap::new();
    for expr in &projection.expr {
        if let Expr::Alias(Alias { expr, name, .. }) = expr
            && let Expr::Column(column) = expr.as_ref()
        {
            columns.insert(column.name.clone(), name.clone());
        }
    }
    columns
}

/// `values` with each cast of a whole value to a vector type or `FLOAT`
/// a [`ToVector`] or [`ToFloat`] told its target column (see
/// [`values_columns`]).
fn named_casts(mut values: Values, columns: &HashMap<String, String>) -> Result<Values> {
    for row in &mut values.values {
        for (value, field) in row.iter_mut().zip(values.schema.fields()) {
            if let Some(column) = columns.get(field.name())
                && is_checked_cast(value)
            {
                let Expr::Cast(cast) = std::mem::replace(value, lit(ScalarValue::Null)) else {
                    unreachable!("checked above")
                };
                *value = checked(cast, lit(column.clone()))?;
            }
        }
    }
    Ok(values)
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

/// `not_null(value, message)`: the value itself, or the error `message`
/// (a string) if any row is NULL. Volatile, so the check runs when the
/// insert runs, never while planning (an `EXPLAIN` of a bad insert still
/// explains it).
#[derive(Debug, PartialEq, Eq, Hash)]
struct NotNull;

impl ScalarUDFImpl for NotNull {
    fn name(&self) -> &str {
        "not_null"
    }

    fn signature(&self) -> &Signature {
        static SIGNATURE: std::sync::LazyLock<Signature> =
            std::sync::LazyLock::new(|| Signature::any(2, Volatility::Volatile));
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

    // The value itself: rows in order by it stay in order (an insert of
    // rows in key order is loaded without a sort), whatever the message.
    fn output_ordering(&self, args: &[ExprProperties]) -> Result<SortProperties> {
        Ok(args
            .first()
            .map_or(SortProperties::Singleton, |value| value.sort_properties))
    }

    fn preserves_lex_ordering(&self, _: &[ExprProperties]) -> Result<bool> {
        Ok(true)
    }

    fn strictly_order_preserving(&self, _: &[ExprProperties]) -> Result<bool> {
        Ok(true)
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let [value, message] = two(args.args)?;
        let has_null = match &value {
            ColumnarValue::Array(array) => array.logical_null_count() > 0,
            ColumnarValue::Scalar(scalar) => scalar.is_null(),
        };
        if has_null {
            let message = match &message {
                ColumnarValue::Scalar(scalar) => scalar.try_as_str().flatten(),
                ColumnarValue::Array(_) => None,
            };
            let message = message.unwrap_or("a NOT NULL column holds NULL");
            return Err(Error::invalid(message).into());
        }
        Ok(value)
    }
}

/// The two arguments of a function of two.
fn two(args: Vec<ColumnarValue>) -> Result<[ColumnarValue; 2]> {
    args.try_into().map_err(|args: Vec<_>| {
        internal_datafusion_err!("two arguments expected, got {}", args.len())
    })
}

/// A cast aliased to a target column (see [`check_insert`]) becomes a
/// [`ToVector`] or [`ToFloat`] told that column; other expressions stay
/// as they are.
fn named_checked_cast(expr: Expr) -> Result<Expr> {
    match expr {
        Expr::Alias(Alias {
            expr,
            relation,
            name,
            metadata,
        }) if is_checked_cast(&expr) => {
            let Expr::Cast(cast) = *expr else {
                unreachable!("checked above")
            };
            let checked = checked(cast, lit(name.clone()))?;
            Ok(Expr::Alias(Alias {
                expr: Box::new(checked),
                relation,
                name,
                metadata,
            }))
        }
        other => Ok(other),
    }
}

/// A cast to a vector type or `FLOAT` becomes a [`ToVector`] or
/// [`ToFloat`] that does not know its column.
fn checked_cast(expr: Expr) -> Result<Transformed<Expr>> {
    match expr {
        Expr::Cast(cast) if is_checked(&cast) => Ok(Transformed::yes(checked(
            cast,
            lit(ScalarValue::Utf8(None)),
        )?)),
        other => Ok(Transformed::no(other)),
    }
}

fn is_checked_cast(expr: &Expr) -> bool {
    matches!(expr, Expr::Cast(cast) if is_checked(cast))
}

/// Whether `cast` is one to a vector type or to `FLOAT`.
fn is_checked(cast: &Cast) -> bool {
    matches!(
        cast.field.data_type(),
        DataType::FixedSizeList(..) | DataType::Float32
    )
}

/// `cast` as the function that checks it, told `column`.
fn checked(cast: Cast, column: Expr) -> Result<Expr> {
    match cast.field.data_type() {
        DataType::Float32 => Ok(ScalarUDF::from(ToFloat).call(vec![*cast.expr, column])),
        _ => to_vector(cast, column),
    }
}

/// Why a list of `length` values (several lists, if `lists`) does not fit
/// `column` (if known) of type `list`, a fixed-size list: a `FLOAT[n]` is
/// a vector column, given vectors; any other is given lists.
fn wrong_length(column: Option<&str>, list: &DataType, length: usize, lists: bool) -> String {
    let vector =
        matches!(list, DataType::FixedSizeList(item, _) if *item.data_type() == DataType::Float32);
    let given = match (vector, lists) {
        (true, false) => "a vector",
        (true, true) => "vectors",
        (false, false) => "a list",
        (false, true) => "lists",
    };
    let list = super::describe::type_name(list);
    match column {
        Some(column) if vector => {
            format!("vector column '{column}' is {list} and was given {given} of length {length}")
        }
        Some(column) => {
            format!("column '{column}' is {list} and was given {given} of length {length}")
        }
        None => format!("a {list} column was given {given} of length {length}"),
    }
}

/// `to_vector(value, <the cast's type>, column)`.
fn to_vector(cast: Cast, column: Expr) -> Result<Expr> {
    let vector = Expr::Literal(ScalarValue::try_from(cast.field.data_type())?, None);
    Ok(ScalarUDF::from(ToVector).call(vec![*cast.expr, vector, column]))
}

/// `to_vector(list, vector, column)`: the cast of a list to the type of
/// `vector` (a `FixedSizeList(item, dim)`, NULL), or an error naming the
/// column (a string, or NULL when not known), the length and the dimension
/// if a list has another length. Volatile, like [`NotNull`].
#[derive(Debug, PartialEq, Eq, Hash)]
struct ToVector;

impl ScalarUDFImpl for ToVector {
    fn name(&self) -> &str {
        "to_vector"
    }

    fn signature(&self) -> &Signature {
        static SIGNATURE: std::sync::LazyLock<Signature> =
            std::sync::LazyLock::new(|| Signature::any(3, Volatility::Volatile));
        &SIGNATURE
    }

    fn return_type(&self, args: &[DataType]) -> Result<DataType> {
        match &args[1] {
            vector @ DataType::FixedSizeList(..) => Ok(vector.clone()),
            other => plan_err!("to_vector casts to a FixedSizeList, not {other}"),
        }
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let rows = args.number_rows;
        let vector = args.return_field.data_type().clone();
        let DataType::FixedSizeList(_, dim) = vector else {
            return plan_err!("to_vector casts to a FixedSizeList, not {vector}");
        };
        let [value, _, column]: [ColumnarValue; 3] =
            args.args.try_into().map_err(|args: Vec<_>| {
                internal_datafusion_err!("three arguments expected, got {}", args.len())
            })?;
        let column = match &column {
            ColumnarValue::Scalar(scalar) => scalar.try_as_str().flatten(),
            ColumnarValue::Array(_) => None,
        };
        let array = value.into_array(rows)?;
        let lengths: Box<dyn Iterator<Item = Option<usize>>> = match array.data_type() {
            DataType::List(_) => {
                Box::new(array.as_list::<i32>().iter().map(|l| l.map(|l| l.len())))
            }
            DataType::LargeList(_) => {
                Box::new(array.as_list::<i64>().iter().map(|l| l.map(|l| l.len())))
            }
            _ => Box::new(std::iter::empty()),
        };
        for length in lengths.flatten() {
            if length != dim as usize {
                let message = wrong_length(column, &vector, length, false);
                return Err(Error::invalid(message).into());
            }
        }
        Ok(ColumnarValue::Array(cast(&array, &vector)?))
    }
}

/// `to_float(value, column)`: `value` cast to `FLOAT`, or an error naming
/// the column (a string, or NULL when not known) and the value if a
/// finite value is beyond `FLOAT`'s range (the cast would make it
/// infinite). Volatile, like [`NotNull`].
#[derive(Debug, PartialEq, Eq, Hash)]
struct ToFloat;

impl ScalarUDFImpl for ToFloat {
    fn name(&self) -> &str {
        "to_float"
    }

    fn signature(&self) -> &Signature {
        static SIGNATURE: std::sync::LazyLock<Signature> =
            std::sync::LazyLock::new(|| Signature::any(2, Volatility::Volatile));
        &SIGNATURE
    }

    fn return_type(&self, _: &[DataType]) -> Result<DataType> {
        Ok(DataType::Float32)
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let rows = args.number_rows;
        let [value, column] = two(args.args)?;
        let column = match &column {
            ColumnarValue::Scalar(scalar) => scalar.try_as_str().flatten(),
            ColumnarValue::Array(_) => None,
        };
        let array = value.into_array(rows)?;
        let floats = cast(&array, &DataType::Float32)?;
        // Integers and narrower floats are never beyond its range.
        if array.data_type().is_integer() || *array.data_type() == DataType::Float16 {
            return Ok(ColumnarValue::Array(floats));
        }
        let wide = cast(&array, &DataType::Float64)?;
        let beyond = (floats.as_primitive::<Float32Type>().iter())
            .zip(wide.as_primitive::<Float64Type>().iter())
            .find_map(|(narrow, wide)| match (narrow, wide) {
                (Some(narrow), Some(wide)) if narrow.is_infinite() && wide.is_finite() => {
                    Some(wide)
                }
                _ => None,
            });
        if let Some(value) = beyond {
            let message = match column {
                Some(column) => {
                    format!("column '{column}' is FLOAT and was given {value:e}, beyond its range")
                }
                None => format!("a FLOAT was given {value:e}, beyond its range"),
            };
            return Err(Error::invalid(message).into());
        }
        Ok(ColumnarValue::Array(floats))
    }
}
