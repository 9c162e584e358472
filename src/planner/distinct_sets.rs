//! DISTINCT aggregates of several values across shards, each value once
//! per shard. `count(DISTINCT a), count(DISTINCT b)` needs every distinct
//! `a` and every distinct `b`, not every distinct pair (a, b), which is
//! what the shipped-columns split sends when every aggregate ignores
//! repeated values: for a thousand `a` and ten `b`, ten thousand rows a
//! shard where one thousand and ten do. Each shard groups its rows by one
//! grouping set per aggregated value (with the query's GROUP BY keys), and
//! says which set a row is of (`GROUPING(…)`); each aggregate of the
//! combining statement reads its own set's rows.

use super::multi_shard::{function_name, partial_column, target_value};
use super::shipped_columns::{combine_group_columns, shipped_column};
use super::walk::visit_mut;
use super::{parsed_select, res_target};
use crate::metadata::Catalog;
use pg_query::protobuf::{self, Node, SelectStmt};
use pg_query::NodeEnum;

/// Makes `worker` (the query's shipped columns) group by one set per
/// aggregated value, and each aggregate of `combine` read its set's rows;
/// false, changing nothing, when the query is not made only of
/// single-value DISTINCT aggregates of two values or more, without FILTER
/// or ORDER BY, and its grouping keys.
pub(super) fn group_by_sets(combine: &mut SelectStmt, worker: &mut SelectStmt, catalog: &Catalog) -> bool {
    let Some((keys, values)) = keys_and_values(combine, catalog) else { return false };
    let columns = &worker.target_list;
    // Every column the shards send is a grouping key or an aggregated value.
    if values.len() < 2 || keys.iter().any(|k| values.contains(k)) || keys.len() + values.len() != columns.len() {
        return false;
    }
    let expression = |name: &String| (0..columns.len()).find(|i| partial_column(*i) == *name).and_then(|i| target_value(&columns[i]).cloned());
    let (Some(key_expressions), Some(value_expressions)) =
        (keys.iter().map(expression).collect::<Option<Vec<_>>>(), values.iter().map(expression).collect::<Option<Vec<_>>>())
    else {
        return false;
    };
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
    worker.target_list.push(res_target(&set_column, Node { node: Some(NodeEnum::GroupingFunc(Box::new(grouping))) }));
    worker.distinct_clause.clear();
    let grouping_sets = protobuf::GroupingSet { kind: protobuf::GroupingSetKind::GroupingSetSets as i32, content: sets, location: -1 };
    worker.group_clause = vec![Node { node: Some(NodeEnum::GroupingSet(grouping_sets)) }];
    // GROUPING(v1, …, vn) sets the bit of each value not grouped, the
    // first value's the highest: in value j's set, every bit but j's.
    let n = values.len();
    let set_id = |j: usize| ((1u64 << n) - 1) - (1u64 << (n - 1 - j));
    for part in combine.target_list.iter_mut().chain(combine.having_clause.as_deref_mut()).chain(combine.sort_clause.iter_mut()) {
        let Some(n) = part.node.as_mut() else { continue };
        visit_mut(n, &mut |n| {
            let NodeEnum::FuncCall(call) = n else { return };
            let Some(j) = argument_column(call).and_then(|c| values.iter().position(|v| *v == c)) else { return };
            let filter = format!("SELECT WHERE {set_column} = {}", set_id(j));
            call.agg_filter = parsed_select(&filter).and_then(|s| s.where_clause);
        });
    }
    true
}

/// The combine's grouping key columns and its aggregated value columns;
/// None unless every aggregate is DISTINCT of one column, plain.
fn keys_and_values(combine: &SelectStmt, catalog: &Catalog) -> Option<(Vec<String>, Vec<String>)> {
    let keys = combine_group_columns(combine)?;
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
        [arg] => shipped_column(arg),
        _ => None,
    }
}
