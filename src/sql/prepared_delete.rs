//! `PREPARE name AS DELETE ...` and its `EXECUTE`. DataFusion 55 runs a
//! prepared DELETE through `delete_from`, which never sees its `LIMIT` and
//! gets no filter for a predicate folded away (`id = $1` given NULL) or
//! turned into a join (`id IN (SELECT $1)`). So the session keeps each
//! prepared DELETE's statement and runs an `EXECUTE` of it as that DELETE
//! with its parameters in place, planned like any other DELETE.

use std::collections::HashMap;
use std::ops::ControlFlow;
use std::sync::Mutex;

use datafusion::sql::parser::Statement as DFStatement;
use datafusion::sql::sqlparser::ast::{
    CastKind, DataType, Expr, Statement, Value, visit_expressions_mut,
};

use super::delete_alias::normalized;
use crate::error::{Error, Result};

/// The prepared DELETEs of a session, by name.
#[derive(Debug, Default)]
pub(super) struct PreparedDeletes {
    by_name: Mutex<HashMap<String, Prepared>>,
}

#[derive(Debug)]
struct Prepared {
    /// The declared parameter types (none: as DataFusion infers them).
    types: Vec<DataType>,
    delete: Statement,
}

impl PreparedDeletes {
    /// Keeps up with `statement`, which DataFusion ran without error: a
    /// `PREPARE` of a DELETE is kept, a `DEALLOCATE` forgets its name.
    /// `normalize` is DataFusion's `enable_ident_normalization`.
    pub(super) fn ran(&self, statement: &DFStatement, normalize: bool) {
        let DFStatement::Statement(s) = statement else {
            return;
        };
        let mut by_name = self.by_name.lock().expect("prepared deletes poisoned");
        match s.as_ref() {
            Statement::Prepare {
                name,
                data_types,
                statement,
            } if matches!(statement.as_ref(), Statement::Delete(_)) => {
                let prepared = Prepared {
                    types: data_types.clone(),
                    delete: statement.as_ref().clone(),
                };
                by_name.insert(normalized(name, normalize), prepared);
            }
            Statement::Deallocate { name, .. } => {
                by_name.remove(&normalized(name, normalize));
            }
            _ => {}
        }
    }

    /// The DELETE an `EXECUTE` of a prepared DELETE runs, each `$n` given
    /// its parameter (cast to the declared type, if any); `None` for any
    /// other statement.
    pub(super) fn expand(
        &self,
        statement: &DFStatement,
        normalize: bool,
    ) -> Result<Option<DFStatement>> {
        let DFStatement::Statement(s) = statement else {
            return Ok(None);
        };
        let Statement::Execute {
            name: Some(name),
            parameters,
            using,
            ..
        } = s.as_ref()
        else {
            return Ok(None);
        };
        let [part] = name.0.as_slice() else {
            return Ok(None);
        };
        let Some(ident) = part.as_ident() else {
            return Ok(None);
        };
        let by_name = self.by_name.lock().expect("prepared deletes poisoned");
        let Some(prepared) = by_name.get(&normalized(ident, normalize)) else {
            return Ok(None);
        };
        if !using.is_empty()
            || (!prepared.types.is_empty() && parameters.len() != prepared.types.len())
        {
            return Err(Error::invalid(format!(
                "EXECUTE {name}: the prepared DELETE takes {} parameters, got {}",
                prepared.types.len(),
                parameters.len()
            )));
        }
        let argument = |n: usize| -> Option<Expr> {
            let value = parameters.get(n.checked_sub(1)?)?.clone();
            Some(match prepared.types.get(n - 1) {
                Some(data_type) => Expr::Cast {
                    kind: CastKind::Cast,
                    expr: Box::new(value),
                    data_type: data_type.clone(),
                    array: false,
                    format: None,
                },
                None => value,
            })
        };
        let mut delete = prepared.delete.clone();
        let mut missing = None;
        let _ = visit_expressions_mut(&mut delete, |expr| {
            if let Expr::Value(value) = expr
                && let Value::Placeholder(placeholder) = &value.value
                && let Some(n) = placeholder.strip_prefix('$')
                && let Ok(n) = n.parse::<usize>()
            {
                match argument(n) {
                    Some(argument) => *expr = Expr::Nested(Box::new(argument)),
                    None => missing = Some(placeholder.clone()),
                }
            }
            ControlFlow::<()>::Continue(())
        });
        if let Some(placeholder) = missing {
            return Err(Error::invalid(format!(
                "EXECUTE {name}: the prepared DELETE reads {placeholder}, and {} parameters \
                 were given",
                parameters.len()
            )));
        }
        Ok(Some(DFStatement::Statement(Box::new(delete))))
    }
}
