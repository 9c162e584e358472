//! What a SELECT's WHERE says about one of the tables in its FROM: the
//! conditions that read that table's columns alone, and the equalities
//! joining one of its columns to a distributed table's. Moving rows
//! (executor/repartition.rs) filters them by the first before they move;
//! reading a reference table's keys first (executor/reference_keys.rs)
//! needs both.

use super::expression_types::FromTables;
use super::is_equals;
use crate::metadata::{Catalog, DistributedTable};
use crate::walk::visit_mut;
use pg_query::protobuf::{self, SelectStmt};
use pg_query::NodeEnum;

/// The top-level ANDed conditions of the WHERE clause.
fn conjuncts(select: &SelectStmt) -> Vec<&NodeEnum> {
    match select.where_clause.as_deref().and_then(|w| w.node.as_ref()) {
        Some(NodeEnum::BoolExpr(b)) if b.boolop == protobuf::BoolExprType::AndExpr as i32 => b.args.iter().filter_map(|a| a.node.as_ref()).collect(),
        Some(other) => vec![other],
        None => Vec::new(),
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
    let own = |conjunct: &NodeEnum| {
        let (mut columns, mut other) = (0, false);
        let mut conjunct = conjunct.clone();
        visit_mut(&mut conjunct, &mut |n| match n {
            NodeEnum::ColumnRef(c) => match from.column_of(c) {
                Some((t, _)) if t.oid == table.oid => columns += 1,
                _ => other = true,
            },
            NodeEnum::FuncCall(_) | NodeEnum::SubLink(_) | NodeEnum::ParamRef(_) | NodeEnum::SqlvalueFunction(_) => other = true,
            _ => {}
        });
        columns > 0 && !other
    };
    let kept: Vec<String> = conjuncts(select).into_iter().filter(|c| own(c)).filter_map(|c| super::deparse::deparse_expression(c).ok()).collect();
    (!kept.is_empty()).then(|| (name.to_string(), kept.iter().map(|c| format!("({c})")).collect::<Vec<_>>().join(" AND ")))
}

/// The columns of `table` that a top-level conjunct of the WHERE equates
/// with a column of a distributed (not reference) table of the same FROM.
pub fn joined_to_distributed<'s>(select: &'s SelectStmt, table: &DistributedTable, catalog: &Catalog) -> Vec<&'s str> {
    let from = FromTables::of(select, catalog);
    let mut columns: Vec<&str> = Vec::new();
    for conjunct in conjuncts(select) {
        let NodeEnum::AExpr(e) = conjunct else { continue };
        if e.kind != protobuf::AExprKind::AexprOp as i32 || !is_equals(&e.name) {
            continue;
        }
        let side = |n: Option<&'s protobuf::Node>| match n.and_then(|n| n.node.as_ref()) {
            Some(NodeEnum::ColumnRef(c)) => from.column_of(c).map(|(t, column)| (t.oid, t.is_reference(), column)),
            _ => None,
        };
        let (Some(l), Some(r)) = (side(e.lexpr.as_deref()), side(e.rexpr.as_deref())) else { continue };
        for ((oid, _, column), (other, other_is_reference, _)) in [(l, r), (r, l)] {
            if oid == table.oid && other != table.oid && !other_is_reference && !columns.contains(&column) {
                columns.push(column);
            }
        }
    }
    columns
}
