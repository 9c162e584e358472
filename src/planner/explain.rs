//! EXPLAIN of a statement over distributed tables shows the distributed plan
//! the way Citus does: the tier as a custom scan, the task count, and one
//! task's plan from the worker that runs it (for the fallback, the coordinator
//! database's plan).

use super::deparse::deparse_statement as deparse;
use super::{not_supported, plan_statement, Plan};
use crate::error::{PgError, PgResult};
use crate::metadata::Catalog;
use pg_query::protobuf::{self, ExplainStmt};
use pg_query::NodeEnum;
use std::fmt;
use std::sync::Arc;

#[derive(Debug)]
pub struct ExplainPlan {
    /// EXPLAIN's options (ANALYZE, COSTS OFF, …), passed on to the node that
    /// explains the task.
    options: Vec<protobuf::Node>,
    /// `EXPLAIN (options) `, the text put before a task's SQL: the SQL is
    /// not parsed again (a task carrying computed rows as text, hundreds of
    /// kilobytes, cost the coordinator 300 MB to parse and deparse).
    prefix: String,
    /// How the explained statement itself runs.
    pub inner: Plan,
}

impl fmt::Display for ExplainPlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.inner)
    }
}

impl ExplainPlan {
    /// `EXPLAIN (options) sql`, for the node that runs `sql`.
    pub fn explain_sql(&self, sql: &str) -> String {
        format!("{}{sql}", self.prefix)
    }

    pub fn analyze(&self) -> bool {
        self.options.iter().any(|o| matches!(o.node.as_ref(), Some(NodeEnum::DefElem(d)) if d.defname == "analyze" && !is_off(d)))
    }

    /// FORMAT JSON: the plan is one JSON document (the nodes explain their
    /// parts in JSON too).
    pub fn json(&self) -> bool {
        format_of(&self.options).is_some_and(|f| f.eq_ignore_ascii_case("json"))
    }
}

/// The FORMAT option's value, if given (the last one counts).
fn format_of(options: &[protobuf::Node]) -> Option<&str> {
    options.iter().rev().find_map(|o| match o.node.as_ref() {
        Some(NodeEnum::DefElem(d)) if d.defname == "format" => match d.arg.as_deref().and_then(|a| a.node.as_ref()) {
            Some(NodeEnum::String(s)) => Some(s.sval.as_str()),
            _ => None,
        },
        _ => None,
    })
}

/// The text of `EXPLAIN (options) ` for any statement after it.
fn explain_prefix(version: i32, options: &[protobuf::Node]) -> PgResult<String> {
    const PLACEHOLDER: &str = "SELECT 1";
    let parsed = pg_query::parse(PLACEHOLDER).map_err(|e| PgError::internal(format!("could not parse {PLACEHOLDER}: {e}")))?;
    let query = parsed.protobuf.stmts.into_iter().next().and_then(|s| s.stmt);
    let explain = deparse(version, NodeEnum::ExplainStmt(Box::new(ExplainStmt { query, options: options.to_vec() })))?;
    explain.strip_suffix(PLACEHOLDER).map(str::to_string).ok_or_else(|| PgError::internal(format!("EXPLAIN deparsed as {explain}")))
}

fn is_off(d: &protobuf::DefElem) -> bool {
    match d.arg.as_deref().and_then(|a| a.node.as_ref()) {
        Some(NodeEnum::String(s)) => matches!(s.sval.to_lowercase().as_str(), "false" | "off" | "0" | "no"),
        Some(NodeEnum::Integer(i)) => i.ival == 0,
        _ => false,
    }
}

/// Plans EXPLAIN of a statement that touches distributed tables; None when
/// the explained statement is local (the coordinator database explains it).
pub(super) fn plan(version: i32, e: &ExplainStmt, text: &str, catalog: &Catalog) -> Option<Plan> {
    let raw = protobuf::RawStmt { stmt: e.query.clone(), stmt_location: 0, stmt_len: 0 };
    let inner = plan_statement(version, raw, text, catalog);
    let shown = format_of(&e.options).is_none_or(|f| f.eq_ignore_ascii_case("text") || f.eq_ignore_ascii_case("json"));
    let explain = match explain_prefix(version, &e.options) {
        Ok(prefix) => ExplainPlan { options: e.options.clone(), prefix, inner },
        Err(e) => return Some(Plan::Unsupported(e)),
    };
    // EXECUTE: the session explains its statement with the arguments written
    // in, or has the coordinator database explain its own.
    let explained_here = matches!(
        explain.inner,
        Plan::Router(_)
            | Plan::Delegated(_)
            | Plan::MultiShard(_)
            | Plan::Fallback(_)
            | Plan::InsertSelect(_)
            | Plan::WithLocalRows(_)
            | Plan::SqlExecute(_)
    );
    let refusal = match &explain.inner {
        Plan::Local | Plan::Empty => return None,
        Plan::Unsupported(e) => return Some(Plan::Unsupported(e.clone())),
        _ if !explained_here => "EXPLAIN of this statement is not supported through the Tessera coordinator",
        _ if !shown => "EXPLAIN of distributed statements supports FORMAT TEXT and FORMAT JSON only",
        // Its rows are computed by inserting into the shell table: not for ANALYZE.
        Plan::InsertSelect(_) if explain.analyze() => {
            "EXPLAIN ANALYZE of an INSERT … SELECT that passes rows through the coordinator is not supported yet"
        }
        _ => return Some(Plan::Explain(Arc::new(explain))),
    };
    Some(not_supported(refusal))
}
