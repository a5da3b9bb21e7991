//! Which filters on a table's one-column key a scan uses: point filters
//! (`key = const`, `key IN (...)`, an OR of those) become key lookups, and
//! ranges (`<`, `<=`, `>`, `>=`, `BETWEEN`) narrow the key bounds. A
//! literal counts only if the key's type holds it exactly; every filter
//! still applies above the scan.

use std::sync::Arc;

use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::{DataType, Field, SchemaRef};
use datafusion::common::ScalarValue;
use datafusion::error::Result;
use datafusion::logical_expr::{BinaryExpr, Expr, Operator};

use crate::read::KeyBounds;

/// The literal keys `filter` selects, if it is `key = const`,
/// `key IN (consts)` or an OR of those, on the one-column key `key_field`.
pub(super) fn point_keys(key_field: &Field, filter: &Expr) -> Option<Vec<ScalarValue>> {
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
            let mut keys = point_keys(key_field, left)?;
            keys.extend(point_keys(key_field, right)?);
            Some(keys)
        }
        _ => None,
    }
}

/// Narrows `bounds` by `filter` if it is a range on a one-column key
/// (`key > const`, `<`, `>=`, `<=`, either way round, or `BETWEEN`)
/// whose literal the key's type holds exactly; returns whether it did.
pub(super) fn narrow_key_bounds(key_field: &Field, filter: &Expr, bounds: &mut KeyBounds) -> bool {
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

/// The keys (a batch of `key_schema`, the one-column key) selected by
/// every point filter among `filters`: one of them is enough, as the
/// filters still apply above the scan.
pub(super) fn lookup_keys(key_schema: &SchemaRef, filters: &[Expr]) -> Result<Option<RecordBatch>> {
    let key_field = key_schema.field(0);
    let Some(values) = filters.iter().find_map(|f| point_keys(key_field, f)) else {
        return Ok(None);
    };
    let key_type = key_field.data_type();
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
    Ok(Some(RecordBatch::try_new(
        Arc::clone(key_schema),
        vec![array],
    )?))
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

#[cfg(test)]
mod tests {
    use datafusion::arrow::datatypes::Schema;
    use datafusion::logical_expr::{col, lit};

    use super::*;

    /// The key `id` of type `key_type`, and a schema of it alone.
    fn key(key_type: DataType) -> (Field, SchemaRef) {
        let field = Field::new("id", key_type, false);
        (field.clone(), Arc::new(Schema::new(vec![field])))
    }

    fn bounds(key: &Field, filters: &[Expr]) -> KeyBounds {
        let mut bounds = KeyBounds::all();
        for f in filters {
            narrow_key_bounds(key, f, &mut bounds);
        }
        bounds
    }

    #[test]
    fn point_filters_on_the_key_become_lookups() {
        let (t, key_schema) = key(DataType::Int64);
        assert_eq!(
            point_keys(&t, &col("id").eq(lit(7i64))),
            Some(vec![7i64.into()])
        );
        assert_eq!(
            point_keys(&t, &lit(7i64).eq(col("id"))),
            Some(vec![7i64.into()])
        );
        let list = col("id").in_list(vec![lit(1i64), lit(2i64), lit(1i64)], false);
        assert_eq!(point_keys(&t, &list).map(|k| k.len()), Some(3));
        let or = col("id").eq(lit(1i64)).or(col("id").eq(lit(5i64)));
        assert_eq!(point_keys(&t, &or), Some(vec![1i64.into(), 5i64.into()]));
        // Repeated keys are looked up once.
        let keys = lookup_keys(&key_schema, &[list]).unwrap().unwrap();
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
            assert_eq!(point_keys(&t, &f), None, "{f}");
        }
        // A literal the key's type cannot hold is no lookup.
        assert!(
            lookup_keys(&key_schema, &[col("id").eq(lit("seven"))])
                .unwrap()
                .is_none()
        );
    }

    #[test]
    fn ranges_on_the_key_narrow_the_bounds_exactly() {
        let (t, _) = key(DataType::Int32);
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
