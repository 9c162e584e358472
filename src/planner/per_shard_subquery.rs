//! A SELECT whose only distributed tables sit in one subquery of its FROM
//! clause (TPC-H's Q7, Q8 and Q9 aggregate a join written as such a
//! subquery; Q13 aggregates counts made per customer). When every shard
//! group can compute the subquery for its own rows, the subquery's rows are
//! the union of the shard groups' and the statement runs shard group by
//! shard group like one over a table: its aggregates split in two phases,
//! its ORDER BY and LIMIT merged.

use super::multi_shard::{calls_in, grouped_by_key, windows_by_key};
use super::router::{collect_from, flatten_and, pinning, shard_keys, Pinning, ScopeEntry};
use super::{count_hash_references, filters_and_groups_only, has_nested_query};
use crate::metadata::{Catalog, DistributedTable};
use pg_query::protobuf::{self, SelectStmt};
use pg_query::NodeEnum;
use std::sync::Arc;

/// The table to run `select` by, shard group by shard group (one of the
/// subquery's), or None when the statement is not of that shape:
/// its FROM clause holds exactly one subquery that names distributed tables,
/// all `references` of the statement (none at the top level or in other
/// subqueries), and the subquery splits over the shard groups
/// (`splits_per_shard_group`). The top level may join reference tables, but
/// not outer joins that keep their rows (`replicated_preserved`): each shard
/// group would return them.
pub(super) fn anchor(
    select: &SelectStmt,
    references: usize,
    scope: &[ScopeEntry],
    replicated_preserved: bool,
    catalog: &Catalog,
) -> Option<Arc<DistributedTable>> {
    if replicated_preserved || scope.iter().any(|e| e.table.as_ref().is_some_and(|t| !t.is_reference())) {
        return None;
    }
    let mut subqueries = Vec::new();
    from_subqueries(&select.from_clause, &mut subqueries);
    let mut naming = subqueries
        .into_iter()
        .map(|s| (s, count_hash_references(&NodeEnum::SelectStmt(Box::new(s.clone())), catalog)))
        .filter(|&(_, count)| count > 0);
    match (naming.next(), naming.next()) {
        (Some((subquery, count)), None) if count == references => splits_per_shard_group(subquery, catalog),
        _ => None,
    }
}

/// The SELECTs of the subqueries in a FROM list, in joins too; LATERAL ones
/// are left out (they read the rows around them).
fn from_subqueries<'a>(items: &'a [protobuf::Node], out: &mut Vec<&'a SelectStmt>) {
    for item in items {
        match item.node.as_ref() {
            Some(NodeEnum::RangeSubselect(sub)) if !sub.lateral => {
                if let Some(NodeEnum::SelectStmt(s)) = sub.subquery.as_deref().and_then(|n| n.node.as_ref()) {
                    out.push(s);
                }
            }
            Some(NodeEnum::JoinExpr(j)) => {
                for side in [j.larg.as_deref(), j.rarg.as_deref()].into_iter().flatten() {
                    from_subqueries(std::slice::from_ref(side), out);
                }
            }
            _ => {}
        }
    }
}

/// One of the subquery's distributed tables when its rows are the union of
/// what each shard group computes alone: a SELECT … FROM … WHERE over tables
/// whose columns are all known, its distributed tables co-located and joined
/// on their distribution columns into one group, with no outer join keeping
/// rows of a reference table, and no query of its own. It may group and
/// aggregate when a GROUP BY item is a distribution column that no outer join
/// pads with NULLs (each group then lies in one shard group), and compute
/// windows partitioned that way; no DISTINCT, ordering, LIMIT, set
/// operations or WITH. An ORDER BY there would order only each shard group's
/// rows, where PostgreSQL hands them on in order.
fn splits_per_shard_group(subquery: &SelectStmt, catalog: &Catalog) -> Option<Arc<DistributedTable>> {
    if !filters_and_groups_only(subquery) || has_nested_query(subquery) {
        return None;
    }
    let mut scope = Vec::new();
    let mut conjuncts = Vec::new();
    if collect_from(&subquery.from_clause, catalog, &mut scope, &mut conjuncts) || scope.iter().any(|e| e.table.is_none()) {
        return None;
    }
    let keys = shard_keys(&scope);
    let grouped = grouped_by_key(subquery, &keys);
    let (aggregates, windows) = calls_in(subquery, catalog);
    let groups_whole = if subquery.group_clause.is_empty() && subquery.having_clause.is_none() { !aggregates } else { grouped };
    if !groups_whole || (windows && !windows_by_key(subquery, &keys)) {
        return None;
    }
    if let Some(condition) = subquery.where_clause.as_deref() {
        flatten_and(condition, &mut conjuncts, true);
    }
    let hash_entries: Vec<usize> =
        scope.iter().enumerate().filter(|(_, e)| e.table.as_ref().is_some_and(|t| !t.is_reference())).map(|(i, _)| i).collect();
    let anchor = scope[*hash_entries.first()?].table.clone()?;
    if hash_entries.iter().any(|&i| scope[i].table.as_ref().is_some_and(|t| t.colocation_id != anchor.colocation_id)) {
        return None;
    }
    match pinning(&scope, &conjuncts, &hash_entries) {
        Pinning::Groups(groups) if groups.len() == 1 => Some(anchor),
        _ => None,
    }
}
