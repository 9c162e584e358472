//! Multi-shard SELECT: a query over co-located tables joined on their
//! distribution columns, not pinned to one shard group, runs once per shard
//! group; the coordinator concatenates the rows or combines partial aggregates.
//! Shapes whose combination needs more than that (GROUP BY, ORDER BY, LIMIT,
//! DISTINCT, HAVING, window functions, other aggregates) are refused for now.

use super::rewrite::ShardTemplate;
use super::{not_supported, Command, Plan};
use crate::metadata::{Catalog, DistributedTable};
use pg_query::protobuf::{self, SelectStmt};
use pg_query::{NodeEnum, NodeRef};
use std::fmt;
use std::sync::Arc;

/// How one output column's per-shard values become the final value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PartialAggregate {
    /// count(…): the counts add up.
    Count,
    /// sum(…): the sums add up (NULL when every shard saw no rows).
    Sum,
    Min,
    Max,
}

impl PartialAggregate {
    /// The aggregate that combines the partial values on the coordinator.
    pub fn combine_function(self) -> &'static str {
        match self {
            PartialAggregate::Count | PartialAggregate::Sum => "sum",
            PartialAggregate::Min => "min",
            PartialAggregate::Max => "max",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Combine {
    /// Rows from every shard, in no particular order.
    Concatenate,
    /// One row: each column combined from the shards' partial aggregates.
    Aggregate(Vec<PartialAggregate>),
}

impl Combine {
    /// For EXPLAIN.
    pub fn describe(&self) -> String {
        match self {
            Combine::Concatenate => "concatenate".into(),
            Combine::Aggregate(kinds) => {
                let names: Vec<&str> = kinds.iter().map(|k| k.combine_function()).collect();
                format!("aggregate ({})", names.join(", "))
            }
        }
    }
}

#[derive(Debug)]
pub struct MultiShardPlan {
    pub command: Command,
    pub anchor: Arc<DistributedTable>,
    pub template: ShardTemplate,
    pub combine: Combine,
}

impl MultiShardPlan {
    pub fn is_write(&self) -> bool {
        self.command != Command::Select
    }
}

impl fmt::Display for MultiShardPlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}, {} tasks, {:?}", self.command, self.anchor.shard_count(), self.combine)
    }
}

/// An UPDATE or DELETE that runs on every shard group (its rows and RETURNING
/// output concatenated), in one distributed transaction.
pub(super) fn plan_modify(command: Command, anchor: Arc<DistributedTable>, template: ShardTemplate) -> Plan {
    Plan::MultiShard(Arc::new(MultiShardPlan { command, anchor, template, combine: Combine::Concatenate }))
}

/// Plans a SELECT whose distributed tables form one co-located join group.
pub(super) fn plan_select(select: &SelectStmt, anchor: Arc<DistributedTable>, template: ShardTemplate, catalog: &Catalog) -> Plan {
    let unsupported_clause = if !select.group_clause.is_empty() {
        Some("GROUP BY")
    } else if select.having_clause.is_some() {
        Some("HAVING")
    } else if !select.sort_clause.is_empty() {
        Some("ORDER BY")
    } else if select.limit_count.is_some() || select.limit_offset.is_some() {
        Some("LIMIT/OFFSET")
    } else if !select.distinct_clause.is_empty() {
        Some("DISTINCT")
    } else if !select.window_clause.is_empty() {
        Some("WINDOW")
    } else if !select.locking_clause.is_empty() {
        Some("FOR UPDATE/SHARE")
    } else if select.into_clause.is_some() {
        Some("SELECT INTO")
    } else {
        None
    };
    if let Some(clause) = unsupported_clause {
        return not_supported(format!("{clause} in queries across shards of distributed tables is not supported yet"));
    }
    let mut partials = Vec::new();
    let mut plain = 0;
    for target in &select.target_list {
        let Some(NodeEnum::ResTarget(t)) = target.node.as_ref() else { continue };
        let Some(val) = t.val.as_deref() else { continue };
        match simple_aggregate(val, catalog) {
            Some(p) => partials.push(p),
            None if contains_aggregate_or_window(val, catalog) => {
                return not_supported("this aggregate across shards of distributed tables is not supported yet; count, sum, min and max are");
            }
            None => plain += 1,
        }
    }
    let combine = match (partials.is_empty(), plain) {
        (true, _) => Combine::Concatenate,
        (false, 0) => Combine::Aggregate(partials),
        (false, _) => return not_supported("mixing aggregates and plain columns across shards needs GROUP BY, which is not supported yet"),
    };
    Plan::MultiShard(Arc::new(MultiShardPlan { command: Command::Select, anchor, template, combine }))
}

fn function_name(call: &protobuf::FuncCall) -> Option<&str> {
    match call.funcname.last()?.node.as_ref()? {
        NodeEnum::String(s) => Some(&s.sval),
        _ => None,
    }
}

/// count/sum/min/max with no DISTINCT, FILTER, ORDER BY or OVER.
fn simple_aggregate(node: &protobuf::Node, catalog: &Catalog) -> Option<PartialAggregate> {
    let Some(NodeEnum::FuncCall(call)) = node.node.as_ref() else { return None };
    if call.agg_distinct || call.agg_filter.is_some() || !call.agg_order.is_empty() || call.over.is_some() || call.agg_within_group {
        return None;
    }
    let kind = match function_name(call)? {
        "count" => PartialAggregate::Count,
        "sum" => PartialAggregate::Sum,
        "min" => PartialAggregate::Min,
        "max" => PartialAggregate::Max,
        _ => return None,
    };
    // Nested aggregates or subqueries in the argument cannot be split this way.
    let nested = call.args.iter().any(|a| contains_aggregate_or_window(a, catalog) || contains_subquery(a));
    (!nested && catalog.is_aggregate(function_name(call)?)).then_some(kind)
}

fn contains_aggregate_or_window(node: &protobuf::Node, catalog: &Catalog) -> bool {
    let Some(n) = node.node.as_ref() else { return false };
    let is_agg = |call: &protobuf::FuncCall| call.over.is_some() || call.agg_star || function_name(call).is_some_and(|name| catalog.is_aggregate(name));
    if let NodeEnum::FuncCall(call) = n {
        if is_agg(call) {
            return true;
        }
    }
    n.nodes().into_iter().any(|(child, _, _)| matches!(child, NodeRef::FuncCall(call) if is_agg(call)))
}

fn contains_subquery(node: &protobuf::Node) -> bool {
    node.node.as_ref().is_some_and(|n| n.nodes().into_iter().any(|(child, _, _)| matches!(child, NodeRef::SubLink(_))))
}
