//! SQL-level `PREPARE`, `EXECUTE` and `DEALLOCATE` (psycopg2 and hand-written
//! SQL use them). A statement prepared over distributed tables is also
//! prepared on the coordinator database, against the shells, so PostgreSQL
//! checks it, resolves its parameter types and lists it in
//! `pg_prepared_statements`; the session keeps its text and runs each EXECUTE
//! as an extended-protocol execution with the evaluated arguments.

use super::deparse::deparse_statement;
use super::{plan_tree, Plan};
use crate::metadata::Catalog;
use pg_query::protobuf::{self, Node};
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
pub(super) fn plan_execute(version: i32, execute: &protobuf::ExecuteStmt) -> Plan {
    let mut arguments = Vec::with_capacity(execute.params.len());
    for param in &execute.params {
        let target = protobuf::ResTarget { name: String::new(), indirection: vec![], val: Some(Box::new(param.clone())), location: -1 };
        let select = protobuf::SelectStmt {
            target_list: vec![Node { node: Some(NodeEnum::ResTarget(Box::new(target))) }],
            op: protobuf::SetOperation::SetopNone as i32,
            limit_option: protobuf::LimitOption::Default as i32,
            ..Default::default()
        };
        match deparse_statement(version, NodeEnum::SelectStmt(Box::new(select))) {
            Ok(sql) => arguments.push(sql.trim_start_matches("SELECT ").to_string()),
            Err(e) => return Plan::Unsupported(e),
        }
    }
    Plan::SqlExecute(SqlExecute { name: execute.name.clone(), arguments })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn execute_keeps_each_argument_as_sql() {
        let parsed = pg_query::parse("EXECUTE q(1 + 2, 'x''y', ARRAY[1, 2], now())").unwrap();
        let Some(NodeEnum::ExecuteStmt(e)) = parsed.protobuf.stmts[0].stmt.as_ref().and_then(|n| n.node.as_ref()) else { panic!() };
        let Plan::SqlExecute(execute) = plan_execute(parsed.protobuf.version, e) else { panic!() };
        assert_eq!(execute.name, "q");
        assert_eq!(execute.arguments, ["1 + 2", "'x''y'", "ARRAY[1, 2]", "now()"]);
    }
}
