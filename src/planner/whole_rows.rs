//! Whole-row references to distributed tables (`SELECT f(t) FROM orders t`,
//! `count(t.*)`, `row_to_json(t)`). A shard's row type is its own (on a
//! worker, `orders_102008`; in the general fallback, the stand-in's), so a
//! function declared over the table's row type finds no match there, and
//! the value's type is not the one the client was told. Spelled out as
//! `ROW(t.*)::schema.orders` the value has the table's type everywhere: the
//! coordinator database has it (the shell's), and so does every worker (its
//! worker-side relation's).
//!
//! Only statements whose every relation is a distributed or reference table
//! (or a subquery over them) are rewritten, and only names no column of
//! theirs has: there a bare name is surely the relation's row, as
//! PostgreSQL resolves it.

use super::walk::{range_vars, visit_mut};
use super::{resolve_range_var, string_node};
use crate::metadata::Catalog;
use pg_query::protobuf::{self, Node};
use pg_query::NodeEnum;

/// The statement with its whole-row references spelled out, or None when it
/// has none (or is not one this rewrite can be sure of).
pub(super) fn spell_out(node: &NodeEnum, catalog: &Catalog) -> Option<NodeEnum> {
    if !matches!(node, NodeEnum::SelectStmt(_) | NodeEnum::UpdateStmt(_) | NodeEnum::DeleteStmt(_)) {
        return None;
    }
    let mut aliases: Vec<(String, String)> = Vec::new();
    let mut columns: Vec<&str> = Vec::new();
    for rv in range_vars(node) {
        let table = resolve_range_var(&rv, catalog)?;
        let alias = rv.alias.as_ref().map_or(rv.relname.clone(), |a| a.aliasname.clone());
        if rv.alias.as_ref().is_some_and(|a| !a.colnames.is_empty()) || aliases.iter().any(|(a, _)| *a == alias) {
            return None;
        }
        aliases.push((alias, table.qualified_name()));
        columns.extend(table.columns.iter().map(String::as_str));
    }
    let subquery_columns = subquery_columns(node)?;
    // Names only a relation goes by, never a column.
    aliases.retain(|(alias, _)| !columns.contains(&alias.as_str()) && !subquery_columns.contains(alias));
    if aliases.is_empty() || !only_tables(node) {
        return None;
    }
    let mut stmt = node.clone();
    let mut found = false;
    visit_mut(&mut stmt, &mut |n| match n {
        // A bare row in the output keeps its name, which `ROW(…)` would change.
        NodeEnum::ResTarget(target) if target.name.is_empty() => {
            if let Some(alias) = target.val.as_deref().and_then(|v| whole_row_of(v, &aliases, false)) {
                target.name = alias;
            }
        }
        NodeEnum::FuncCall(call) => {
            for arg in &mut call.args {
                if let Some(alias) = whole_row_of(arg, &aliases, true) {
                    *arg = spelled(&alias, &aliases);
                    found = true;
                }
            }
        }
        _ => {
            let replace = matches!(n, NodeEnum::ColumnRef(_)) && whole_row_of(&Node { node: Some(n.clone()) }, &aliases, false).is_some();
            if let (true, NodeEnum::ColumnRef(c)) = (replace, &*n) {
                let alias = super::column_ref_names(c).and_then(|names| names.first().map(|a| a.to_string())).unwrap_or_default();
                if let Some(NodeEnum::TypeCast(cast)) = spelled(&alias, &aliases).node {
                    *n = NodeEnum::TypeCast(cast);
                    found = true;
                }
            }
        }
    });
    found.then_some(stmt)
}

/// The alias a whole-row reference names: a bare `t`, or `t.*` where
/// `star` allows it (a function's argument; elsewhere `t.*` expands to the
/// columns).
fn whole_row_of(node: &Node, aliases: &[(String, String)], star: bool) -> Option<String> {
    let Some(NodeEnum::ColumnRef(c)) = node.node.as_ref() else { return None };
    let alias = match c.fields.as_slice() {
        [name] => match name.node.as_ref()? {
            NodeEnum::String(s) => s.sval.clone(),
            _ => return None,
        },
        [name, all] if star && matches!(all.node, Some(NodeEnum::AStar(_))) => match name.node.as_ref()? {
            NodeEnum::String(s) => s.sval.clone(),
            _ => return None,
        },
        _ => return None,
    };
    aliases.iter().any(|(a, _)| *a == alias).then_some(alias)
}

/// `ROW(alias.*)::schema.table`.
fn spelled(alias: &str, aliases: &[(String, String)]) -> Node {
    let table = aliases.iter().find(|(a, _)| a == alias).map(|(_, t)| t.clone()).unwrap_or_default();
    let star = Node {
        node: Some(NodeEnum::ColumnRef(protobuf::ColumnRef {
            fields: vec![string_node(alias), Node { node: Some(NodeEnum::AStar(protobuf::AStar {})) }],
            location: -1,
        })),
    };
    let row = Node {
        node: Some(NodeEnum::RowExpr(Box::new(protobuf::RowExpr {
            args: vec![star],
            row_format: protobuf::CoercionForm::CoerceExplicitCall as i32,
            location: -1,
            ..Default::default()
        }))),
    };
    let names = pg_query::parse(&format!("SELECT NULL::{table}")).ok().and_then(|p| {
        let select = p.protobuf.stmts.into_iter().next()?.stmt?.node?;
        let NodeEnum::SelectStmt(s) = select else { return None };
        let Some(NodeEnum::ResTarget(r)) = s.target_list.into_iter().next()?.node else { return None };
        let Some(NodeEnum::TypeCast(cast)) = r.val?.node else { return None };
        cast.type_name
    });
    Node { node: Some(NodeEnum::TypeCast(Box::new(protobuf::TypeCast { arg: Some(Box::new(row)), type_name: names, location: -1 }))) }
}

/// The output column names of the statement's FROM subqueries (a view
/// read in a query becomes one); None when one is not plain to see (`*`).
fn subquery_columns(node: &NodeEnum) -> Option<Vec<String>> {
    let mut names = Some(Vec::new());
    visit_mut(&mut node.clone(), &mut |n| {
        let NodeEnum::RangeSubselect(sub) = n else { return };
        let Some(found) = names.as_mut() else { return };
        if let Some(alias) = sub.alias.as_ref().filter(|a| !a.colnames.is_empty()) {
            found.extend(super::qualified_name(&alias.colnames).into_iter().map(str::to_string));
            return;
        }
        let Some(NodeEnum::SelectStmt(select)) = sub.subquery.as_deref().and_then(|q| q.node.as_ref()) else {
            names = None;
            return;
        };
        for target in &select.target_list {
            let Some(NodeEnum::ResTarget(r)) = target.node.as_ref() else { continue };
            let implicit = match r.val.as_deref().and_then(|v| v.node.as_ref()) {
                Some(NodeEnum::ColumnRef(c)) => match c.fields.last().and_then(|f| f.node.as_ref()) {
                    Some(NodeEnum::String(s)) => Some(s.sval.clone()),
                    _ => None,
                },
                Some(NodeEnum::FuncCall(call)) => super::function_names(call).last().map(|s| s.to_string()),
                _ => Some(String::new()),
            };
            match (r.name.is_empty(), implicit) {
                (false, _) => found.push(r.name.clone()),
                (true, Some(name)) => found.push(name),
                (true, None) => {
                    names = None;
                    return;
                }
            }
        }
    });
    names
}

/// Whether every FROM item of every level is a table or a subquery (no
/// function or VALUES whose output columns this rewrite would not know), no
/// WITH query could be named like a table, and no outer join makes a
/// table's row NULL (which `ROW(t.*)`, a row of NULLs, is not).
fn only_tables(node: &NodeEnum) -> bool {
    let mut only = true;
    visit_mut(&mut node.clone(), &mut |n| {
        only &= !matches!(n, NodeEnum::RangeFunction(_) | NodeEnum::RangeTableFunc(_) | NodeEnum::CommonTableExpr(_));
        only &= !matches!(n, NodeEnum::JoinExpr(j) if j.jointype != protobuf::JoinType::JoinInner as i32);
        if let NodeEnum::SelectStmt(s) = n {
            only &= s.values_lists.is_empty();
        }
    });
    only
}
