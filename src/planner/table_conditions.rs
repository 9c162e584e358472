//! What a SELECT's WHERE says about one of the tables in its FROM: the
//! conditions that read that table's columns alone, and the equalities
//! joining one of its columns to a distributed table's, each either a
//! top-level conjunct or implied by every branch of an OR. Moving rows
//! (executor/repartition.rs) filters them by the first before they move;
//! reading a reference table's keys first (executor/reference_keys.rs)
//! needs both.

use super::expression_types::FromTables;
use super::{is_equals, is_immutable_text_or_number_function};
use crate::metadata::{Catalog, DistributedTable};
use crate::walk::visit_mut;
use pg_query::protobuf::{self, SelectStmt};
use pg_query::NodeEnum;

/// The top-level ANDed conditions of the WHERE clause.
fn conjuncts(select: &SelectStmt) -> Vec<&NodeEnum> {
    select.where_clause.as_deref().and_then(|w| w.node.as_ref()).map(and_args).unwrap_or_default()
}

/// The arguments of an AND, or the one condition that is not one.
fn and_args(condition: &NodeEnum) -> Vec<&NodeEnum> {
    match condition {
        NodeEnum::BoolExpr(b) if b.boolop == protobuf::BoolExprType::AndExpr as i32 => b.args.iter().filter_map(|a| a.node.as_ref()).collect(),
        other => vec![other],
    }
}

/// The branches of an OR, if the condition is one.
fn or_branches(condition: &NodeEnum) -> Option<Vec<&NodeEnum>> {
    match condition {
        NodeEnum::BoolExpr(b) if b.boolop == protobuf::BoolExprType::OrExpr as i32 => Some(b.args.iter().filter_map(|a| a.node.as_ref()).collect()),
        _ => None,
    }
}

/// The conjuncts of the WHERE that read nothing but `table`'s columns, as
/// SQL over the name the query gives the table, with that name; None when
/// there are none, or when filtering the table's rows before the join could
/// change the answer: it is read twice, or an outer join might pad its
/// missing rows (`LEFT JOIN t … WHERE t.x IS NULL`). Calls, which may be
/// volatile, subqueries and parameters stay out.
pub fn own_conditions(select: &SelectStmt, table: &DistributedTable, catalog: &Catalog) -> Option<(String, String)> {
    let from = FromTables::of(select, catalog);
    let [name] = from.names_of(table.oid)[..] else { return None };
    if from.outer_joins {
        return None;
    }
    let own = |conjunct: &NodeEnum| reads_only(conjunct, table, &from);
    let sql = |c: &NodeEnum| super::deparse::deparse_expression(c).ok().map(|c| format!("({c})"));
    // Of its own, or an OR each of whose branches has conditions of its own
    // (TPC-H's Q19): a row that passes the OR passes one branch, hence that
    // branch's own conditions.
    let own_sql = |conjunct: &NodeEnum| -> Option<String> {
        if own(conjunct) {
            return sql(conjunct);
        }
        let branches: Option<Vec<String>> = or_branches(conjunct)?
            .into_iter()
            .map(|branch| {
                let kept: Option<Vec<String>> = and_args(branch).into_iter().filter(|c| own(c)).map(sql).collect();
                kept.filter(|k| !k.is_empty()).map(|k| format!("({})", k.join(" AND ")))
            })
            .collect();
        branches.map(|b| format!("({})", b.join(" OR ")))
    };
    let kept: Vec<String> = conjuncts(select).into_iter().filter_map(own_sql).collect();
    (!kept.is_empty()).then(|| (name.to_string(), kept.join(" AND ")))
}

/// Whether `conjunct` reads columns of `table` and nothing else: no other
/// table's column, no subquery or parameter, and no call but of the
/// built-in immutable ones `is_immutable_text_or_number_function` knows
/// (others may be volatile).
fn reads_only(conjunct: &NodeEnum, table: &DistributedTable, from: &FromTables) -> bool {
    let (mut columns, mut other) = (0, false);
    let mut conjunct = conjunct.clone();
    visit_mut(&mut conjunct, &mut |n| match n {
        NodeEnum::ColumnRef(c) => match from.column_of(c) {
            Some((t, _)) if t.oid == table.oid => columns += 1,
            _ => other = true,
        },
        NodeEnum::FuncCall(call) => other |= !is_immutable_text_or_number_function(call),
        NodeEnum::SubLink(_) | NodeEnum::ParamRef(_) | NodeEnum::SqlvalueFunction(_) => other = true,
        _ => {}
    });
    columns > 0 && !other
}

/// Removes from the WHERE the conjuncts that read only `table` (those
/// `own_conditions` gives, less ORs), for a caller that has put an
/// equivalent condition in their place.
pub fn drop_own_conditions(select: &mut SelectStmt, table: &DistributedTable, catalog: &Catalog) {
    let from = FromTables::of(select, catalog);
    let Some(filter) = select.where_clause.as_deref_mut() else { return };
    match filter.node.as_mut() {
        Some(NodeEnum::BoolExpr(b)) if b.boolop == protobuf::BoolExprType::AndExpr as i32 => {
            b.args.retain(|a| !a.node.as_ref().is_some_and(|c| reads_only(c, table, &from)));
            if b.args.is_empty() {
                select.where_clause = None;
            }
        }
        Some(condition) if reads_only(condition, table, &from) => select.where_clause = None,
        _ => {}
    }
}

/// The columns of `table` that the WHERE equates with a column of a
/// distributed (not reference) table of the same FROM: by a top-level
/// conjunct, or in every branch of an OR.
pub fn joined_to_distributed<'s>(select: &'s SelectStmt, table: &DistributedTable, catalog: &Catalog) -> Vec<&'s str> {
    let from = FromTables::of(select, catalog);
    let mut columns: Vec<&str> = Vec::new();
    for conjunct in conjuncts(select) {
        for column in equated_to_distributed(conjunct, table, &from) {
            if !columns.contains(&column) {
                columns.push(column);
            }
        }
    }
    columns
}

/// The columns of `table` that `condition` requires to equal a column of a
/// distributed table of `from`.
fn equated_to_distributed<'s>(condition: &'s NodeEnum, table: &DistributedTable, from: &FromTables) -> Vec<&'s str> {
    if let Some(branches) = or_branches(condition) {
        let mut each =
            branches.into_iter().map(|branch| and_args(branch).into_iter().flat_map(|c| equated_to_distributed(c, table, from)).collect::<Vec<_>>());
        let first = each.next().unwrap_or_default();
        let rest: Vec<Vec<&str>> = each.collect();
        return first.into_iter().filter(|c| rest.iter().all(|r| r.contains(c))).collect();
    }
    let NodeEnum::AExpr(e) = condition else { return Vec::new() };
    if e.kind != protobuf::AExprKind::AexprOp as i32 || !is_equals(&e.name) {
        return Vec::new();
    }
    let side = |n: Option<&'s protobuf::Node>| match n.and_then(|n| n.node.as_ref()) {
        Some(NodeEnum::ColumnRef(c)) => from.column_of(c).map(|(t, column)| (t.oid, t.is_reference(), column)),
        _ => None,
    };
    let (Some(l), Some(r)) = (side(e.lexpr.as_deref()), side(e.rexpr.as_deref())) else { return Vec::new() };
    [(l, r), (r, l)]
        .into_iter()
        .filter(|((oid, _, _), (other, other_is_reference, _))| *oid == table.oid && *other != table.oid && !other_is_reference)
        .map(|((_, _, column), _)| column)
        .collect()
}
