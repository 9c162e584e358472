//! SQL-level `PREPARE`, `EXECUTE` and `DEALLOCATE` (psycopg2 and hand-written
//! SQL use them). A statement prepared over distributed tables is also
//! prepared on the coordinator database, against the shells, so PostgreSQL
//! checks it, resolves its parameter types and lists it in
//! `pg_prepared_statements`; the session keeps its text and runs each EXECUTE
//! as an extended-protocol execution with the evaluated arguments.

use super::deparse::{deparse_expression, deparse_statement, deparse_tree};
use super::uncorrelated_subqueries::typed_constant;
use super::walk::visit_mut;
use super::{plan_tree, Plan};
use crate::error::{PgError, PgResult};
use crate::metadata::Catalog;
use pg_query::protobuf;
use pg_query::NodeEnum;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SqlPrepare {
    pub name: String,
    /// The prepared statement's own text, with its `$n` parameters.
    pub statement: String,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SqlExecute {
    pub name: String,
    /// Each argument expression as SQL text.
    pub arguments: Vec<String>,
}

/// A PREPARE whose statement involves distributed tables; None for one that
/// runs on local tables only (it passes through).
pub(super) fn plan_prepare(version: i32, prepare: &protobuf::PrepareStmt, catalog: &Catalog) -> Option<Plan> {
    let query = prepare.query.as_deref()?.node.clone()?;
    match plan_tree(version, query.clone(), catalog) {
        Plan::Local | Plan::Empty => None,
        refused @ Plan::Unsupported(_) => Some(refused),
        _ => Some(match deparse_statement(version, query) {
            Ok(statement) => Plan::SqlPrepare(SqlPrepare { name: prepare.name.clone(), statement }),
            Err(e) => Plan::Unsupported(e),
        }),
    }
}

/// Every EXECUTE: the session knows whether the name is one of its
/// distributed statements.
pub(super) fn plan_execute(execute: &protobuf::ExecuteStmt) -> Plan {
    let arguments: PgResult<Vec<String>> = execute.params.iter().filter_map(|p| p.node.as_ref()).map(deparse_expression).collect();
    match arguments {
        Ok(arguments) => Plan::SqlExecute(SqlExecute { name: execute.name.clone(), arguments }),
        Err(e) => Plan::Unsupported(e),
    }
}

/// A prepared statement's text with its arguments written in: each `$n`
/// becomes the n-th value as a literal of the parameter's type (SQL name),
/// for EXPLAIN EXECUTE, which explains the statement with those values.
pub fn statement_with_arguments(statement: &str, arguments: &[(Option<String>, String)]) -> PgResult<String> {
    let mut parsed = pg_query::parse(statement).map_err(|e| PgError::internal(format!("could not parse a prepared statement: {e}")))?.protobuf;
    let mut failure = None;
    for stmt in parsed.stmts.iter_mut().filter_map(|s| s.stmt.as_mut()).filter_map(|n| n.node.as_mut()) {
        visit_mut(stmt, &mut |n| {
            let NodeEnum::ParamRef(param) = n else { return };
            let Some((value, type_name)) = usize::try_from(param.number - 1).ok().and_then(|i| arguments.get(i)) else { return };
            match typed_constant(value.as_deref(), type_name) {
                Ok(constant) => *n = constant,
                Err(e) => failure = Some(e),
            }
        });
    }
    match failure {
        Some(e) => Err(e),
        None => deparse_tree(&parsed),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn execute_keeps_each_argument_as_sql() {
        let parsed = pg_query::parse("EXECUTE q(1 + 2, 'x''y', ARRAY[1, 2], now())").unwrap();
        let Some(NodeEnum::ExecuteStmt(e)) = parsed.protobuf.stmts[0].stmt.as_ref().and_then(|n| n.node.as_ref()) else { panic!() };
        let Plan::SqlExecute(execute) = plan_execute(e) else { panic!() };
        assert_eq!(execute.name, "q");
        assert_eq!(execute.arguments, ["1 + 2", "'x''y'", "ARRAY[1, 2]", "now()"]);
    }

    #[test]
    fn arguments_are_written_in_as_typed_literals() {
        let args = [(Some("5".to_string()), "integer".to_string()), (None, "text".to_string())];
        let sql = statement_with_arguments("SELECT * FROM t WHERE k = $1 AND (v = $2 OR $1 > 3)", &args).unwrap();
        assert_eq!(sql, "SELECT * FROM t WHERE k = '5'::int AND (v = NULL::text OR '5'::int > 3)");
    }
}
