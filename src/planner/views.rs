//! Views over distributed tables live in the coordinator database, over the
//! shells, so a query that reads one is planned with the view's query in its
//! place. A simple view (columns and a filter over its FROM list) read alone
//! in a FROM clause is merged into the query, as PostgreSQL's planner pulls
//! up such subqueries, so that the query takes the tier its written-out form
//! would (a filter on the distribution key routes to one shard). Any other
//! use becomes a subquery under the view's name.

use super::walk::visit_mut;
use super::{not_supported, Plan};
use crate::metadata::user_code::View;
use crate::metadata::Catalog;
use pg_query::protobuf::{self, Node};
use pg_query::NodeEnum;
use std::collections::HashMap;

/// Views within views deeper than this are refused (PostgreSQL itself stops
/// recursive views; this keeps a catalog mistake from looping).
const MAX_VIEW_DEPTH: usize = 32;

/// The statement with every view over distributed tables it reads expanded,
/// or None when it reads none. Only queries are expanded: other statements
/// name views as objects.
pub(super) fn expand(node: &NodeEnum, catalog: &Catalog) -> Option<Result<NodeEnum, Plan>> {
    if !catalog.user_code.has_views()
        || !matches!(
            node,
            NodeEnum::SelectStmt(_) | NodeEnum::InsertStmt(_) | NodeEnum::UpdateStmt(_) | NodeEnum::DeleteStmt(_) | NodeEnum::MergeStmt(_) | NodeEnum::DeclareCursorStmt(_) | NodeEnum::CopyStmt(_)
        )
    {
        return None;
    }
    let mut stmt = node.clone();
    let mut ctes = Vec::new();
    visit_mut(&mut stmt, &mut |n| {
        if let NodeEnum::CommonTableExpr(c) = n {
            ctes.push(c.ctename.clone());
        }
    });
    let mut expander = Expander { catalog, ctes, expanded: false, too_deep: false };
    expander.expand(&mut stmt, 0);
    if expander.too_deep {
        return Some(Err(not_supported("views nested deeper than 32 levels over distributed tables are not supported")));
    }
    expander.expanded.then_some(Ok(stmt))
}

struct Expander<'c> {
    catalog: &'c Catalog,
    /// The statement's CTE names: an unqualified one is not a view.
    ctes: Vec<String>,
    expanded: bool,
    too_deep: bool,
}

impl Expander<'_> {
    /// Expands the views `node` reads. In a view's query (`depth` > 0) every
    /// relation is schema-qualified, so an unqualified name is a CTE's there.
    fn expand(&mut self, node: &mut NodeEnum, depth: usize) {
        visit_mut(node, &mut |n| match n {
            NodeEnum::SelectStmt(select) => self.merge(select, depth),
            NodeEnum::RangeVar(rv) => {
                if let Some((view, query)) = self.view_query(rv, depth) {
                    *n = subselect(&view, query, rv);
                }
            }
            _ => {}
        });
    }

    /// The view `rv` names, with its own views expanded.
    fn view_query(&mut self, rv: &protobuf::RangeVar, depth: usize) -> Option<(std::sync::Arc<View>, NodeEnum)> {
        if rv.schemaname.is_empty() && (depth > 0 || self.ctes.contains(&rv.relname)) {
            return None;
        }
        let view = self.catalog.user_code.view((!rv.schemaname.is_empty()).then_some(rv.schemaname.as_str()), &rv.relname)?.clone();
        if depth >= MAX_VIEW_DEPTH {
            self.too_deep = true;
            return None;
        }
        let mut query = view.query.clone();
        self.expand(&mut query, depth + 1);
        self.expanded = true;
        Some((view, query))
    }

    /// Merges a simple view that is the only item of `select`'s FROM clause
    /// into `select`; leaves it for the subquery form otherwise.
    fn merge(&mut self, select: &mut protobuf::SelectStmt, depth: usize) {
        let [item] = select.from_clause.as_slice() else { return };
        let Some(NodeEnum::RangeVar(rv)) = item.node.as_ref() else { return };
        if select.op != protobuf::SetOperation::SetopNone as i32 || rv.alias.as_ref().is_some_and(|a| !a.colnames.is_empty()) {
            return;
        }
        let rv = rv.clone();
        if self.catalog.user_code.view((!rv.schemaname.is_empty()).then_some(rv.schemaname.as_str()), &rv.relname).is_none() {
            return;
        }
        let Some((_, NodeEnum::SelectStmt(query))) = self.view_query(&rv, depth) else { return };
        let Some(columns) = simple_columns(&query) else { return };
        let name = rv.alias.as_ref().map_or(rv.relname.as_str(), |a| a.aliasname.as_str());
        let inner_names = from_names(&query.from_clause);
        if let Some(merged) = merged(select, &query, &columns, name, &inner_names) {
            *select = merged;
        }
    }
}

/// A simple view's columns (name → the column of its FROM list it shows),
/// or None when the view does more than pick columns and filter rows.
fn simple_columns(query: &protobuf::SelectStmt) -> Option<Vec<(String, Node)>> {
    let plain = query.op == protobuf::SetOperation::SetopNone as i32
        && query.distinct_clause.is_empty()
        && query.group_clause.is_empty()
        && query.having_clause.is_none()
        && query.window_clause.is_empty()
        && query.sort_clause.is_empty()
        && query.limit_count.is_none()
        && query.limit_offset.is_none()
        && query.locking_clause.is_empty()
        && query.with_clause.is_none()
        && query.values_lists.is_empty()
        && query.into_clause.is_none()
        && !query.from_clause.is_empty();
    if !plain {
        return None;
    }
    query
        .target_list
        .iter()
        .map(|t| {
            let Some(NodeEnum::ResTarget(r)) = t.node.as_ref() else { return None };
            let value = r.val.as_deref()?;
            let Some(NodeEnum::ColumnRef(c)) = value.node.as_ref() else { return None };
            let names = super::column_ref_names(c)?;
            let name = if r.name.is_empty() { names.last()?.to_string() } else { r.name.clone() };
            Some((name, value.clone()))
        })
        .collect()
}

/// The names a FROM list's items go by (aliases, or table names).
fn from_names(items: &[Node]) -> Vec<String> {
    let mut names = Vec::new();
    for item in items {
        match item.node.as_ref() {
            Some(NodeEnum::RangeVar(rv)) => names.push(rv.alias.as_ref().map_or(rv.relname.clone(), |a| a.aliasname.clone())),
            Some(NodeEnum::RangeSubselect(s)) => names.extend(s.alias.as_ref().map(|a| a.aliasname.clone())),
            Some(NodeEnum::RangeFunction(f)) => names.extend(f.alias.as_ref().map(|a| a.aliasname.clone())),
            Some(NodeEnum::JoinExpr(j)) => {
                names.extend(j.alias.as_ref().map(|a| a.aliasname.clone()));
                names.extend(from_names(j.larg.as_deref().into_iter().chain(j.rarg.as_deref()).cloned().collect::<Vec<_>>().as_slice()));
            }
            _ => {}
        }
    }
    names
}

/// `select` over the view `name` rewritten to read the view's FROM list
/// directly: its columns replaced by the view's, the view's filter added to
/// its own. None when a reference could change meaning: a subquery (its
/// unqualified names might be the view's columns or its own), a name the
/// view does not show, or an outer reference that a name inside the view
/// would capture.
fn merged(select: &protobuf::SelectStmt, view: &protobuf::SelectStmt, columns: &[(String, Node)], name: &str, inner_names: &[String]) -> Option<protobuf::SelectStmt> {
    let by_name: HashMap<&str, &NodeEnum> = columns.iter().filter_map(|(n, v)| Some((n.as_str(), v.node.as_ref()?))).collect();
    // ORDER BY and GROUP BY may name the query's own output columns.
    let output_names: Vec<&str> = select
        .target_list
        .iter()
        .filter_map(|t| match t.node.as_ref() {
            Some(NodeEnum::ResTarget(r)) if !r.name.is_empty() => Some(r.name.as_str()),
            _ => None,
        })
        .collect();
    let mut ok = true;
    let mut rewrite = |n: &mut NodeEnum| match n {
        NodeEnum::SubLink(_) | NodeEnum::SelectStmt(_) => ok = false,
        NodeEnum::ColumnRef(c) => {
            let column = match super::column_ref_names(c).as_deref() {
                Some([column]) => column.to_string(),
                Some([qualifier, column]) if *qualifier == name => column.to_string(),
                Some([qualifier, _]) if !inner_names.iter().any(|i| i == qualifier) => return,
                _ => {
                    ok = false;
                    return;
                }
            };
            match by_name.get(column.as_str()) {
                Some(value) => *n = (*value).clone(),
                None if c.fields.len() == 1 && output_names.contains(&column.as_str()) => {}
                None => ok = false,
            }
        }
        _ => {}
    };
    let mut out = select.clone();
    out.from_clause = view.from_clause.clone();
    out.target_list = Vec::with_capacity(select.target_list.len());
    for t in &select.target_list {
        let Some(NodeEnum::ResTarget(r)) = t.node.as_ref() else { return None };
        let mut r = r.clone();
        match r.val.as_deref().and_then(|v| v.node.as_ref()) {
            Some(NodeEnum::ColumnRef(c)) if is_star(c, name) => {
                out.target_list.extend(columns.iter().map(|(n, v)| super::res_target(n, v.clone())));
                continue;
            }
            // The output keeps the name the view's column gave it.
            Some(NodeEnum::ColumnRef(c)) if r.name.is_empty() => r.name = super::column_ref_names(c)?.last()?.to_string(),
            _ => {}
        }
        if let Some(v) = r.val.as_deref_mut().and_then(|v| v.node.as_mut()) {
            visit_mut(v, &mut rewrite);
        }
        out.target_list.push(Node { node: Some(NodeEnum::ResTarget(r)) });
    }
    for list in [&mut out.group_clause, &mut out.sort_clause, &mut out.distinct_clause, &mut out.window_clause] {
        for n in list.iter_mut().filter_map(|item| item.node.as_mut()) {
            visit_mut(n, &mut rewrite);
        }
    }
    for n in [&mut out.where_clause, &mut out.having_clause].into_iter().filter_map(|e| e.as_deref_mut().and_then(|e| e.node.as_mut())) {
        visit_mut(n, &mut rewrite);
    }
    if !ok {
        return None;
    }
    out.where_clause = match (view.where_clause.clone(), out.where_clause.take()) {
        (Some(v), Some(s)) => Some(Box::new(Node {
            node: Some(NodeEnum::BoolExpr(Box::new(protobuf::BoolExpr { xpr: None, boolop: protobuf::BoolExprType::AndExpr as i32, args: vec![*v, *s], location: -1 }))),
        })),
        (v, s) => v.or(s),
    };
    Some(out)
}

/// `*` or `name.*`.
fn is_star(c: &protobuf::ColumnRef, name: &str) -> bool {
    match c.fields.as_slice() {
        [star] => matches!(star.node, Some(NodeEnum::AStar(_))),
        [qualifier, star] => matches!(star.node, Some(NodeEnum::AStar(_))) && matches!(qualifier.node.as_ref(), Some(NodeEnum::String(s)) if s.sval == name),
        _ => false,
    }
}

/// The view's query as a FROM item known by the name (and column aliases)
/// the statement gave the view.
fn subselect(view: &View, query: NodeEnum, rv: &protobuf::RangeVar) -> NodeEnum {
    let alias = match &rv.alias {
        Some(a) => a.clone(),
        None => protobuf::Alias { aliasname: view.name.clone(), colnames: vec![] },
    };
    NodeEnum::RangeSubselect(Box::new(protobuf::RangeSubselect { lateral: false, subquery: Some(Box::new(Node { node: Some(query) })), alias: Some(alias) }))
}
