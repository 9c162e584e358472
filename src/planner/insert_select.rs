//! INSERT … SELECT into a distributed table. When the SELECT reads tables
//! co-located with the target and produces the target's distribution column
//! from their distribution column, every row stays in its shard group: the
//! statement runs per shard group. Otherwise the coordinator reads the
//! SELECT's rows (from local tables directly, from distributed ones through
//! the general fallback) and routes them as a multi-row INSERT.

use super::fallback;
use super::rewrite::ShardTemplate;
use super::{not_supported, plan_tree, resolve_range_var, Combine, Command, MultiShardPlan, Plan};
use crate::metadata::{Catalog, Distribution, DistributedTable};
use pg_query::protobuf::{self, InsertStmt, SelectStmt};
use pg_query::NodeEnum;
use std::fmt;
use std::sync::Arc;

/// An INSERT … SELECT whose rows pass through the coordinator.
#[derive(Debug)]
pub struct InsertSelectPlan {
    pub target: Arc<DistributedTable>,
    /// The INSERT as the coordinator database runs it into the (empty) shell
    /// table, `RETURNING *`: the rows come back exactly as PostgreSQL would
    /// store them (defaults filled in, assignment casts applied, the shell's
    /// constraints checked), ready to be routed. Its effect is rolled back.
    pub coordinator_sql: String,
    /// The SELECT reads distributed tables (through the fallback's stand-ins).
    pub reads_distributed: bool,
}

impl fmt::Display for InsertSelectPlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "into {} through the coordinator", self.target.qualified_name())
    }
}

pub(super) fn plan(insert: &InsertStmt, select: &SelectStmt, target: Arc<DistributedTable>, template: ShardTemplate, catalog: &Catalog) -> Plan {
    let version = template.version();
    let source = plan_tree(version, NodeEnum::SelectStmt(Box::new(select.clone())), catalog);
    let stays_in_shard_group = match (&target.distribution, &source) {
        (Distribution::Reference, Plan::Router(r)) => r.template.tables().iter().all(|t| t.is_reference()),
        (Distribution::Hash { column, .. }, Plan::MultiShard(m)) => {
            matches!(m.combine, Combine::Concatenate) && m.anchor.colocation_id == target.colocation_id && produces_key(insert, select, column, &target, catalog)
        }
        (Distribution::Hash { column, .. }, Plan::Router(r)) => {
            r.anchor.as_ref().is_some_and(|a| a.colocation_id == target.colocation_id) && produces_key(insert, select, column, &target, catalog)
        }
        _ => false,
    };
    if stays_in_shard_group {
        return match &target.distribution {
            Distribution::Reference => super::router::reference_write(Command::Insert, template),
            Distribution::Hash { .. } => Plan::MultiShard(Arc::new(MultiShardPlan { command: Command::Insert, anchor: target, template, combine: Combine::Concatenate })),
        };
    }
    if insert.with_clause.is_some() || insert.on_conflict_clause.is_some() || !insert.returning_list.is_empty() {
        return not_supported("INSERT … SELECT that must pass its rows through the coordinator does not support WITH, ON CONFLICT or RETURNING yet");
    }
    let columns: Vec<String> = insert
        .cols
        .iter()
        .filter_map(|c| match c.node.as_ref() {
            Some(NodeEnum::ResTarget(r)) if r.indirection.is_empty() => Some(crate::connection::quote_ident(&r.name)),
            _ => None,
        })
        .collect();
    if columns.len() != insert.cols.len() {
        return not_supported("INSERT … SELECT into subfields or array elements of a distributed table is not supported yet");
    }
    let select_node = NodeEnum::SelectStmt(Box::new(select.clone()));
    let (select_sql, reads_distributed) = match &source {
        Plan::Local => match super::deparse::deparse_statement(version, select_node.clone()) {
            Ok(sql) => (sql, false),
            Err(e) => return not_supported(format!("could not print the SELECT: {e}")),
        },
        _ => match fallback::plan(version, &select_node, catalog, "INSERT … SELECT") {
            Some(Plan::Fallback(f)) => (f.sql.clone(), true),
            _ => return not_supported("this INSERT … SELECT into a distributed table is not supported yet"),
        },
    };
    let column_list = if columns.is_empty() { String::new() } else { format!(" ({})", columns.join(", ")) };
    let coordinator_sql = format!("INSERT INTO {}{column_list} {select_sql} RETURNING *", target.qualified_name());
    Plan::InsertSelect(Arc::new(InsertSelectPlan { target, coordinator_sql, reads_distributed }))
}

/// Whether the SELECT's output for the target's distribution column is the
/// distribution column of a table it reads (so each row stays in its group).
fn produces_key(insert: &InsertStmt, select: &SelectStmt, key: &str, target: &DistributedTable, catalog: &Catalog) -> bool {
    let position = if insert.cols.is_empty() {
        target.columns.iter().position(|c| c == key)
    } else {
        insert.cols.iter().position(|n| matches!(n.node.as_ref(), Some(NodeEnum::ResTarget(r)) if r.name == key))
    };
    let Some(item) = position.and_then(|p| select.target_list.get(p)) else { return false };
    let Some(NodeEnum::ResTarget(r)) = item.node.as_ref() else { return false };
    let Some(NodeEnum::ColumnRef(c)) = r.val.as_deref().and_then(|v| v.node.as_ref()) else { return false };
    let Some(names) = super::column_ref_names(c) else { return false };
    let mut sources = Vec::new();
    from_tables(&select.from_clause, catalog, &mut sources);
    let Some(sources) = sources.into_iter().collect::<Option<Vec<_>>>() else {
        // A subquery or function in FROM could produce a column of that name.
        return false;
    };
    let is_key_of = |t: &DistributedTable, column: &str| matches!(&t.distribution, Distribution::Hash { column: k, .. } if k == column) && t.colocation_id == target.colocation_id;
    match names.as_slice() {
        [qualifier, column] => sources.iter().any(|(name, t)| name == qualifier && is_key_of(t, column)),
        [column] => {
            let having: Vec<_> = sources.iter().filter(|(_, t)| t.columns.iter().any(|c| c == column)).collect();
            !having.is_empty() && having.iter().all(|(_, t)| is_key_of(t, column))
        }
        _ => false,
    }
}

/// The tables of a FROM list with the names the query knows them by; None for
/// an item that is not a distributed or reference table.
fn from_tables(items: &[protobuf::Node], catalog: &Catalog, out: &mut Vec<Option<(String, Arc<DistributedTable>)>>) {
    for item in items {
        match item.node.as_ref() {
            Some(NodeEnum::RangeVar(rv)) => out.push(resolve_range_var(rv, catalog).map(|t| {
                let name = rv.alias.as_ref().map(|a| a.aliasname.clone()).unwrap_or_else(|| rv.relname.clone());
                (name, t.clone())
            })),
            Some(NodeEnum::JoinExpr(j)) => {
                for side in [j.larg.as_deref(), j.rarg.as_deref()].into_iter().flatten() {
                    from_tables(std::slice::from_ref(side), catalog, out);
                }
            }
            _ => out.push(None),
        }
    }
}
