//! SQL-level `PREPARE`, `EXECUTE` and `DEALLOCATE` (psycopg2 and hand-written
//! SQL use them). A statement prepared over distributed tables is also
//! prepared on the coordinator database, against the shells, so PostgreSQL
//! checks it, resolves its parameter types and lists it in
//! `pg_prepared_statements`; the session keeps its text and runs each EXECUTE
//! as an extended-protocol execution with the evaluated arguments.

use super::deparse::{deparse_expression, deparse_statement};
use super::{plan_tree, Plan};
use crate::error::PgResult;
use crate::metadata::Catalog;
use pg_query::protobuf;

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

#[cfg(test)]
mod tests {
    use super::*;
    use pg_query::NodeEnum;

    #[test]
    fn execute_keeps_each_argument_as_sql() {
        let parsed = pg_query::parse("EXECUTE q(1 + 2, 'x''y', ARRAY[1, 2], now())").unwrap();
        let Some(NodeEnum::ExecuteStmt(e)) = parsed.protobuf.stmts[0].stmt.as_ref().and_then(|n| n.node.as_ref()) else { panic!() };
        let Plan::SqlExecute(execute) = plan_execute(e) else { panic!() };
        assert_eq!(execute.name, "q");
        assert_eq!(execute.arguments, ["1 + 2", "'x''y'", "ARRAY[1, 2]", "now()"]);
    }
}
