//! DISTINCT aggregates of several values across shards, each value once
//! per shard. `count(DISTINCT a), count(DISTINCT b)` needs every distinct
//! `a` and every distinct `b`, not every distinct pair (a, b), which is
//! what the shipped-columns split sends when every aggregate ignores
//! repeated values: for a thousand `a` and ten `b`, ten thousand rows a
//! shard where one thousand and ten do. Each shard groups its rows by one
//! grouping set per aggregated value (with the query's GROUP BY keys), and
//! says which set a row is of (`GROUPING(…)`); each aggregate of the
//! combining statement reads its own set's rows.

use super::multi_shard::{function_name, partial_column, position, target_value};
use super::res_target;
use super::walk::visit_mut;
use crate::metadata::Catalog;
use pg_query::protobuf::{self, Node, SelectStmt};
use pg_query::NodeEnum;

/// Makes `worker` (the shipped columns, `columns`, of the query) group by
/// one set per aggregated value, and each aggregate of `combine` read its
/// set's rows; false, changing nothing, when the query is not made only of
/// single-value DISTINCT aggregates of two values or more, without FILTER
/// or ORDER BY, and its grouping keys.
pub(super) fn group_by_sets(combine: &mut SelectStmt, worker: &mut SelectStmt, columns: &[Node], catalog: &Catalog) -> bool {
    let Some((keys, values)) = keys_and_values(combine, catalog) else { return false };
    // Every column the shards send is a grouping key or an aggregated value.
    let index = |name: &str| (0..columns.len()).find(|i| partial_column(*i) == name);
    let (Some(keys), Some(values)) =
        (keys.iter().map(|k| index(k)).collect::<Option<Vec<_>>>(), values.iter().map(|v| index(v)).collect::<Option<Vec<_>>>())
    else {
        return false;
    };
    if values.len() < 2 || keys.iter().any(|k| values.contains(k)) || keys.len() + values.len() != columns.len() {
        return false;
    }
    let expression = |i: usize| target_value(&columns[i]).cloned();
    let Some(value_expressions) = values.iter().map(|v| expression(*v)).collect::<Option<Vec<_>>>() else { return false };
    let Some(key_expressions) = keys.iter().map(|k| expression(*k)).collect::<Option<Vec<_>>>() else { return false };
    let sets: Vec<Node> = value_expressions
        .iter()
        .map(|value| {
            if key_expressions.is_empty() {
                return value.clone();
            }
            let items = key_expressions.iter().cloned().chain([value.clone()]).collect();
            let row_format = protobuf::CoercionForm::CoerceImplicitCast as i32;
            Node { node: Some(NodeEnum::RowExpr(Box::new(protobuf::RowExpr { args: items, row_format, location: -1, ..Default::default() }))) }
        })
        .collect();
    let set_column = partial_column(columns.len());
    let grouping = protobuf::GroupingFunc { args: value_expressions.clone(), location: -1, ..Default::default() };
    worker.target_list = columns.to_vec();
    worker.target_list.push(res_target(&set_column, Node { node: Some(NodeEnum::GroupingFunc(Box::new(grouping))) }));
    worker.distinct_clause.clear();
    let grouping_sets = protobuf::GroupingSet { kind: protobuf::GroupingSetKind::GroupingSetSets as i32, content: sets, location: -1 };
    worker.group_clause = vec![Node { node: Some(NodeEnum::GroupingSet(grouping_sets)) }];
    // GROUPING(v1, …, vn) sets the bit of each value not grouped, the
    // first value's the highest: in value j's set, every bit but j's.
    let n = values.len();
    let set_id = |j: usize| ((1u64 << n) - 1) - (1u64 << (n - 1 - j));
    let value_names: Vec<String> = values.iter().map(|v| partial_column(*v)).collect();
    for part in combine.target_list.iter_mut().chain(combine.having_clause.as_deref_mut()).chain(combine.sort_clause.iter_mut()) {
        let Some(n) = part.node.as_mut() else { continue };
        visit_mut(n, &mut |n| {
            let NodeEnum::FuncCall(call) = n else { return };
            let Some(j) = argument_column(call).and_then(|c| value_names.iter().position(|v| *v == c)) else { return };
            let filter = format!("SELECT 1 WHERE {set_column} = {}", set_id(j));
            call.agg_filter = condition(&filter).map(Box::new);
        });
    }
    true
}

/// The combine's grouping key columns and its aggregated value columns;
/// None unless every aggregate is DISTINCT of one column, plain.
fn keys_and_values(combine: &SelectStmt, catalog: &Catalog) -> Option<(Vec<String>, Vec<String>)> {
    let mut keys = Vec::new();
    for group in &combine.group_clause {
        let key = match position(group) {
            Some(p) => target_value(combine.target_list.get(p - 1)?)?,
            None => group,
        };
        keys.push(column_name(key)?);
    }
    let mut values: Option<Vec<String>> = Some(Vec::new());
    for part in combine.target_list.iter().chain(combine.having_clause.as_deref()).chain(&combine.sort_clause) {
        let Some(mut n) = part.node.clone() else { continue };
        visit_mut(&mut n, &mut |n| {
            let NodeEnum::FuncCall(call) = n else { return };
            let aggregate = call.agg_star || catalog.is_aggregate(function_name(call).unwrap_or_default());
            if call.over.is_some() {
                values = None;
            } else if aggregate {
                let plain = call.agg_distinct && call.agg_filter.is_none() && call.agg_order.is_empty() && !call.agg_within_group;
                match (plain.then(|| argument_column(call)).flatten(), values.as_mut()) {
                    (Some(column), Some(list)) if !list.contains(&column) => list.push(column),
                    (Some(_), Some(_)) => {}
                    _ => values = None,
                }
            }
        });
    }
    Some((keys, values?))
}

/// The one column a call reads, when its only argument is a column.
fn argument_column(call: &protobuf::FuncCall) -> Option<String> {
    match call.args.as_slice() {
        [arg] => column_name(arg),
        _ => None,
    }
}

fn column_name(node: &Node) -> Option<String> {
    let NodeEnum::ColumnRef(c) = node.node.as_ref()? else { return None };
    match super::column_ref_names(c)?.as_slice() {
        [name] => Some(name.to_string()),
        _ => None,
    }
}

/// The WHERE condition of `sql`.
fn condition(sql: &str) -> Option<Node> {
    match pg_query::parse(sql).ok()?.protobuf.stmts.into_iter().next()?.stmt?.node? {
        NodeEnum::SelectStmt(s) => s.where_clause.map(|w| *w),
        _ => None,
    }
}
