//! Top ranks per partition sent alone. A query across shard groups that
//! orders by `rank()`, `dense_rank()` or `row_number()` over a window not
//! partitioned by a distribution column and keeps the first k rows
//! (`ORDER BY r LIMIT k`, the "top k per group" shape) needs from each
//! shard only its rows ranked k or better there: a row's rank within one
//! shard's rows is never worse than its rank among all rows, so every row
//! ranked k or better overall, and every row before it in its partition,
//! is among them, and the coordinator database ranks those rows exactly.
//! The rows it ranks worse than k it also ranks worse than k, so the
//! first k rows of the answer are PostgreSQL's.

use super::multi_shard::{expression_key, function_name, position, sort_output, target_value};
use super::res_target;
use super::walk::visit_mut;
use crate::metadata::Catalog;
use pg_query::protobuf::{self, a_const, Node, SelectStmt};
use pg_query::NodeEnum;

/// The shipped-columns `worker` of `select` keeping only each shard's
/// rows ranked within the query's LIMIT (and OFFSET); `worker` unchanged
/// when the query is not of that shape.
pub(super) fn keep_top_ranks(select: &SelectStmt, worker: SelectStmt, catalog: &Catalog) -> SelectStmt {
    match ranked_worker(select, &worker, catalog) {
        Some(ranked) => ranked,
        None => worker,
    }
}

fn ranked_worker(select: &SelectStmt, worker: &SelectStmt, catalog: &Catalog) -> Option<SelectStmt> {
    let plain = select.group_clause.is_empty() && select.having_clause.is_none() && select.distinct_clause.is_empty();
    if !plain || !worker.distinct_clause.is_empty() {
        return None;
    }
    let bound = constant(select.limit_count.as_deref())?.checked_add(match select.limit_offset.as_deref() {
        Some(offset) => constant(Some(offset))?,
        None => 0,
    })?;
    // Every window call of the query ranks over the same window.
    let mut window: Option<(String, protobuf::WindowDef)> = None;
    let mut others = false;
    for part in select.target_list.iter().chain(&select.sort_clause) {
        let Some(mut n) = part.node.clone() else { continue };
        visit_mut(&mut n, &mut |n| {
            let NodeEnum::FuncCall(call) = n else { return };
            let Some(over) = call.over.as_deref() else {
                // An aggregate reads every row.
                others |= call.agg_star || catalog.is_aggregate(function_name(call).unwrap_or_default());
                return;
            };
            match (ranking(call), resolved(over, select).and_then(|def| Some((window_key(&def)?, def)))) {
                (true, Some((key, def))) => match &window {
                    Some((seen, _)) if *seen != key => others = true,
                    Some(_) => {}
                    None => window = Some((key, def)),
                },
                _ => others = true,
            }
        });
    }
    let (_, def) = window.filter(|_| !others)?;
    let first = select.sort_clause.first()?;
    let NodeEnum::SortBy(by) = first.node.as_ref()? else { return None };
    let ascending = matches!(protobuf::SortByDir::from_i32(by.sortby_dir), Some(protobuf::SortByDir::SortbyDefault | protobuf::SortByDir::SortbyAsc));
    let key = by.node.as_deref()?;
    let sorted = match position(key).or_else(|| sort_output(key, &select.target_list).map(|i| i + 1)) {
        Some(p) => target_value(select.target_list.get(p - 1)?)?,
        None => key,
    };
    let NodeEnum::FuncCall(call) = sorted.node.as_ref()? else { return None };
    if !ascending || !ranking(call) || call.over.is_none() {
        return None;
    }
    // The worker ranks its rows as the query does, and keeps the first ones.
    let mut rank = call.clone();
    rank.over = Some(Box::new(protobuf::WindowDef { name: String::new(), refname: String::new(), ..def }));
    let mut inner = worker.clone();
    inner.target_list.push(res_target(RANK_COLUMN, Node { node: Some(NodeEnum::FuncCall(rank)) }));
    let names: Vec<String> = worker.target_list.iter().map(output_name).collect::<Option<_>>()?;
    let sql = format!("SELECT {} FROM (SELECT) AS tessera_ranked WHERE {RANK_COLUMN} <= {bound}", names.join(", "));
    super::around(&sql, "tessera_ranked", &inner)
}

/// The worker's column with each row's rank among its shard's rows.
const RANK_COLUMN: &str = "tessera_rank";

fn ranking(call: &protobuf::FuncCall) -> bool {
    call.args.is_empty() && !call.agg_star && call.funcname.len() <= 2 && matches!(function_name(call), Some("rank" | "dense_rank" | "row_number"))
}

/// A call's window with a named window's definition in place; None for a
/// window that refines another (`OVER (w ORDER BY …)`).
fn resolved(over: &protobuf::WindowDef, select: &SelectStmt) -> Option<protobuf::WindowDef> {
    if !over.refname.is_empty() {
        return None;
    }
    if over.name.is_empty() || !over.partition_clause.is_empty() || !over.order_clause.is_empty() {
        return Some(over.clone());
    }
    select.window_clause.iter().find_map(|w| match w.node.as_ref() {
        Some(NodeEnum::WindowDef(def)) if def.name == over.name && def.refname.is_empty() => Some((**def).clone()),
        _ => None,
    })
}

/// The partitioning and ordering of a window, as text.
fn window_key(def: &protobuf::WindowDef) -> Option<String> {
    let mut key = String::from("PARTITION BY");
    for n in &def.partition_clause {
        key.push_str(&format!(" {},", expression_key(n.node.as_ref()?)?));
    }
    key.push_str(" ORDER BY");
    for n in &def.order_clause {
        let NodeEnum::SortBy(by) = n.node.as_ref()? else { return None };
        if !by.use_op.is_empty() {
            return None;
        }
        key.push_str(&format!(" {} {} {},", expression_key(by.node.as_deref()?.node.as_ref()?)?, by.sortby_dir, by.sortby_nulls));
    }
    Some(key)
}

/// A non-negative integer constant.
fn constant(node: Option<&Node>) -> Option<i64> {
    match node?.node.as_ref()? {
        NodeEnum::AConst(c) => match c.val.as_ref()? {
            a_const::Val::Ival(i) if i.ival >= 0 => Some(i64::from(i.ival)),
            _ => None,
        },
        _ => None,
    }
}

/// A worker column's name (`tessera_p_NNN`, which needs no quoting).
fn output_name(target: &Node) -> Option<String> {
    match target.node.as_ref()? {
        NodeEnum::ResTarget(t) if !t.name.is_empty() => Some(t.name.clone()),
        _ => None,
    }
}
