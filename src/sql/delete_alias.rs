//! `DELETE FROM t AS a WHERE a.x ...`: DataFusion 55 plans a DELETE
//! over its table's own name and drops the alias, so that the alias named
//! no relation. [`unalias_delete`] writes the statement over the table's
//! name before DataFusion plans it.

use std::ops::ControlFlow;

use datafusion::sql::parser::Statement as DFStatement;
use datafusion::sql::sqlparser::ast::{
    Expr, FromTable, Ident, ObjectNamePart, Statement, TableFactor, TableWithJoins, Visit, Visitor,
    visit_expressions_mut,
};

use crate::error::{Error, Result};

/// Rewrites a `DELETE` (also under `EXPLAIN`) whose table has an alias:
/// the alias goes, and `alias.column` in its `WHERE` becomes
/// `table.column`. Refused, with a typed error, when the alias names
/// columns or a relation of a subquery goes by the same name (which the
/// rewrite would otherwise confuse with the table). `normalize` is
/// DataFusion's `enable_ident_normalization`: unquoted names compare
/// case-insensitively.
pub(super) fn unalias_delete(statement: &mut DFStatement, normalize: bool) -> Result<()> {
    let delete = match statement {
        DFStatement::Explain(explain) => return unalias_delete(&mut explain.statement, normalize),
        DFStatement::Statement(statement) => match statement.as_mut() {
            Statement::Delete(delete) => delete,
            _ => return Ok(()),
        },
        _ => return Ok(()),
    };
    let (FromTable::WithFromKeyword(from) | FromTable::WithoutKeyword(from)) = &mut delete.from;
    let [
        TableWithJoins {
            relation: TableFactor::Table { name, alias, .. },
            joins,
        },
    ] = from.as_mut_slice()
    else {
        return Ok(());
    };
    if !joins.is_empty() {
        return Ok(());
    }
    let Some(table_alias) = alias.take() else {
        return Ok(());
    };
    if !table_alias.columns.is_empty() {
        return Err(Error::invalid(format!(
            "DELETE FROM {name} AS {table_alias}: a DELETE's alias cannot rename columns"
        )));
    }
    let alias = table_alias.name;
    let key = |ident: &Ident| normalized(ident, normalize);
    let Some(selection) = &mut delete.selection else {
        return Ok(());
    };
    let table: Vec<Ident> = name
        .0
        .iter()
        .filter_map(ObjectNamePart::as_ident)
        .cloned()
        .collect();
    // After the rewrite `alias.x` reads `table.x`: a subquery's relation
    // named either would take it over.
    let mut shadowed = Shadowed {
        names: [Some(&alias), table.last()]
            .into_iter()
            .flatten()
            .map(&key)
            .collect(),
        key: &key,
    };
    if selection.visit(&mut shadowed).is_break() {
        return Err(Error::invalid(format!(
            "DELETE FROM {name} AS {alias}: a subquery of its WHERE reads a relation \
             named {alias} or {name} too, which memwal could not tell from the table; \
             write the statement without the alias, or name the subquery's relation \
             otherwise"
        )));
    }
    let _ = visit_expressions_mut(selection, |expr| {
        if let Expr::CompoundIdentifier(parts) = expr
            && parts.len() >= 2
            && key(&parts[0]) == key(&alias)
        {
            parts.splice(0..1, table.iter().cloned());
        }
        ControlFlow::<()>::Continue(())
    });
    Ok(())
}

/// A name as DataFusion compares it: unquoted names fold to lower case
/// when `normalize` (its `enable_ident_normalization`) is on.
pub(super) fn normalized(name: &Ident, normalize: bool) -> String {
    match name.quote_style {
        None if normalize => name.value.to_lowercase(),
        _ => name.value.clone(),
    }
}

/// Breaks at a relation that goes by one of `names` (its own alias, or
/// the last part of its name without one).
struct Shadowed<'a, F> {
    names: Vec<String>,
    key: &'a F,
}

impl<F: Fn(&Ident) -> String> Visitor for Shadowed<'_, F> {
    type Break = ();

    fn pre_visit_table_factor(&mut self, factor: &TableFactor) -> ControlFlow<()> {
        let named = match factor {
            TableFactor::Table {
                alias: Some(alias), ..
            }
            | TableFactor::Derived {
                alias: Some(alias), ..
            }
            | TableFactor::Function {
                alias: Some(alias), ..
            }
            | TableFactor::UNNEST {
                alias: Some(alias), ..
            }
            | TableFactor::NestedJoin {
                alias: Some(alias), ..
            } => Some(&alias.name),
            TableFactor::Table {
                name, alias: None, ..
            } => name.0.last().and_then(ObjectNamePart::as_ident),
            _ => None,
        };
        match named {
            Some(name) if self.names.contains(&(self.key)(name)) => ControlFlow::Break(()),
            _ => ControlFlow::Continue(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use datafusion::sql::parser::DFParser;

    use super::*;

    fn rewritten(sql: &str) -> Result<String> {
        let mut statement = DFParser::parse_sql(sql).unwrap().pop_front().unwrap();
        unalias_delete(&mut statement, true)?;
        Ok(statement.to_string())
    }

    #[test]
    fn a_deletes_alias_becomes_its_tables_name() {
        assert_eq!(
            rewritten("DELETE FROM s.t AS A WHERE a.id = 1 AND v > 2").unwrap(),
            "DELETE FROM s.t WHERE s.t.id = 1 AND v > 2"
        );
        assert_eq!(
            rewritten("DELETE FROM t x WHERE EXISTS (SELECT 1 FROM u WHERE u.k = x.id)").unwrap(),
            "DELETE FROM t WHERE EXISTS (SELECT 1 FROM u WHERE u.k = t.id)"
        );
        assert_eq!(
            rewritten("EXPLAIN DELETE FROM t AS a WHERE a.id = 1").unwrap(),
            "EXPLAIN DELETE FROM t WHERE t.id = 1"
        );
        // A quoted alias keeps its case.
        assert_eq!(
            rewritten(r#"DELETE FROM t AS "A" WHERE "A".id = 1 AND a.id = 2"#).unwrap(),
            "DELETE FROM t WHERE t.id = 1 AND a.id = 2"
        );
        // Nothing to do.
        for sql in ["DELETE FROM t WHERE t.id = 1", "SELECT a.x FROM t AS a"] {
            assert_eq!(rewritten(sql).unwrap(), sql);
        }
    }

    #[test]
    fn an_alias_a_subquery_also_uses_is_refused() {
        for sql in [
            "DELETE FROM t AS a WHERE id IN (SELECT a.id FROM u AS a)",
            "DELETE FROM t AS a WHERE id IN (SELECT id FROM a)",
            "DELETE FROM t AS a WHERE EXISTS (SELECT 1 FROM t WHERE t.id = a.id + 1)",
            "DELETE FROM s.T AS a WHERE a.id IN (SELECT id FROM u AS t)",
            "DELETE FROM t AS a(x) WHERE x = 1",
        ] {
            let e = rewritten(sql).unwrap_err();
            assert!(matches!(e, Error::InvalidInput(_)), "{sql}: {e}");
        }
    }
}
