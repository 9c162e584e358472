//! Views over distributed tables live in the coordinator database, over the
//! shells, so a query that reads one is planned with the view's query in its
//! place. A simple view (columns and a filter over its FROM list) read alone
//! in a FROM clause is merged into the query, as PostgreSQL's planner pulls
//! up such subqueries, so that the query takes the tier its written-out form
//! would (a filter on the distribution key routes to one shard). Any other
//! use becomes a subquery under the view's name.

use super::walk::{is_query, visit_mut};
use super::{not_supported, schema_of, Plan};
use crate::metadata::user_code::View;
use crate::metadata::Catalog;
use pg_query::protobuf::{self, Node};
use pg_query::NodeEnum;

/// Views within views deeper than this are refused (PostgreSQL itself stops
/// recursive views; this keeps a catalog mistake from looping).
const MAX_VIEW_DEPTH: usize = 32;

/// The statement with every view over distributed tables it reads expanded,
/// or None when it reads none. Only queries are expanded: other statements
/// name views as objects.
pub(super) fn expand(node: &NodeEnum, catalog: &Catalog) -> Option<Result<NodeEnum, Plan>> {
    if !catalog.user_code.has_views() || !(is_query(node) || matches!(node, NodeEnum::CopyStmt(_))) {
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
        let view = self.catalog.view(schema_of(rv), &rv.relname)?.clone();
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
        let Some((view, query)) = self.view_query(&rv, depth) else { return };
        let merged = match &query {
            NodeEnum::SelectStmt(q) => SimpleView::new((**q).clone(), &rv).and_then(|simple| simple.merged(select)),
            _ => None,
        };
        match merged {
            Some(merged) => *select = merged,
            // The subquery form, with the view already expanded.
            None => select.from_clause[0] = Node { node: Some(subselect(&view, query, &rv)) },
        }
    }
}

/// A view that only picks columns of its FROM list and filters its rows, as
/// a statement names it.
struct SimpleView {
    /// The name the statement gives the view.
    name: String,
    /// Its columns: each name, and the column of the FROM list it shows.
    columns: Vec<(String, Node)>,
    /// The names the view's FROM items go by.
    inner_names: Vec<String>,
    query: protobuf::SelectStmt,
}

impl SimpleView {
    /// None when the view does more than pick columns and filter rows.
    fn new(query: protobuf::SelectStmt, rv: &protobuf::RangeVar) -> Option<SimpleView> {
        if !super::only_filters(&query) {
            return None;
        }
        let columns = query
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
            .collect::<Option<Vec<_>>>()?;
        let name = rv.alias.as_ref().map_or(rv.relname.clone(), |a| a.aliasname.clone());
        Some(SimpleView { name, columns, inner_names: from_names(&query.from_clause), query })
    }

    /// Replaces the view's columns in `n` by the columns they show. False
    /// when a reference could change meaning: a subquery (its unqualified
    /// names might be the view's columns or its own), a name the view does
    /// not show (`outputs`, the statement's own output names, excepted), or
    /// an outer reference that a name inside the view would capture.
    fn rewrite(&self, n: &mut NodeEnum, outputs: &[String]) -> bool {
        let mut ok = true;
        visit_mut(n, &mut |n| match n {
            NodeEnum::SubLink(_) | NodeEnum::SelectStmt(_) => ok = false,
            NodeEnum::ColumnRef(c) => {
                let column = match super::column_ref_names(c).as_deref() {
                    Some([column]) => column.to_string(),
                    Some([qualifier, column]) if *qualifier == self.name => column.to_string(),
                    Some([qualifier, _]) if !self.inner_names.iter().any(|i| i == qualifier) => return,
                    _ => {
                        ok = false;
                        return;
                    }
                };
                match self.columns.iter().find(|(name, _)| *name == column).and_then(|(_, v)| v.node.clone()) {
                    Some(value) => *n = value,
                    None if c.fields.len() == 1 && outputs.contains(&column) => {}
                    None => ok = false,
                }
            }
            _ => {}
        });
        ok
    }

    /// A target list with `*` (or `view.*`) spelled out as the view's
    /// columns, and a bare column keeping the name the view gave it, the
    /// rest rewritten.
    fn targets(&self, list: &[Node]) -> Option<Vec<Node>> {
        let mut out = Vec::with_capacity(list.len());
        for t in list {
            let Some(NodeEnum::ResTarget(r)) = t.node.as_ref() else { return None };
            let mut r = r.clone();
            match r.val.as_deref().and_then(|v| v.node.as_ref()) {
                Some(NodeEnum::ColumnRef(c)) if is_star(c, &self.name) => {
                    out.extend(self.columns.iter().map(|(n, v)| super::res_target(n, v.clone())));
                    continue;
                }
                Some(NodeEnum::ColumnRef(c)) if r.name.is_empty() => r.name = super::column_ref_names(c)?.last()?.to_string(),
                _ => {}
            }
            if !self.rewrite_boxed(&mut r.val, &[]) {
                return None;
            }
            out.push(Node { node: Some(NodeEnum::ResTarget(r)) });
        }
        Some(out)
    }

    fn rewrite_boxed(&self, n: &mut Option<Box<Node>>, outputs: &[String]) -> bool {
        n.as_deref_mut().and_then(|n| n.node.as_mut()).is_none_or(|n| self.rewrite(n, outputs))
    }

    fn rewrite_all(&self, list: &mut [Node], outputs: &[String]) -> bool {
        list.iter_mut().filter_map(|item| item.node.as_mut()).all(|n| self.rewrite(n, outputs))
    }

    /// The view's filter and `filter`, both.
    fn and_filter(&self, filter: Option<Box<Node>>) -> Option<Box<Node>> {
        match (self.query.where_clause.clone(), filter) {
            (Some(v), Some(s)) => Some(Box::new(super::conjunction(vec![*v, *s]))),
            (v, s) => v.or(s),
        }
    }

    /// `select`, the view the only item of its FROM clause, rewritten to read
    /// the view's FROM list directly.
    fn merged(&self, select: &protobuf::SelectStmt) -> Option<protobuf::SelectStmt> {
        // ORDER BY and GROUP BY may name the query's own output columns.
        let outputs: Vec<String> = select
            .target_list
            .iter()
            .filter_map(|t| match t.node.as_ref() {
                Some(NodeEnum::ResTarget(r)) if !r.name.is_empty() => Some(r.name.clone()),
                _ => None,
            })
            .collect();
        let mut out = select.clone();
        out.from_clause = self.query.from_clause.clone();
        out.target_list = self.targets(&select.target_list)?;
        let ok = self.rewrite_all(&mut out.group_clause, &outputs)
            && self.rewrite_all(&mut out.sort_clause, &outputs)
            && self.rewrite_all(&mut out.distinct_clause, &outputs)
            && self.rewrite_all(&mut out.window_clause, &outputs)
            && self.rewrite_boxed(&mut out.where_clause, &[])
            && self.rewrite_boxed(&mut out.having_clause, &outputs);
        if !ok {
            return None;
        }
        out.where_clause = self.and_filter(out.where_clause.take());
        Some(out)
    }

    /// The table a write through the view writes, and the name of its
    /// column that view column `name` shows.
    fn base_column(&self, name: &str) -> Option<String> {
        let (_, value) = self.columns.iter().find(|(n, _)| n == name)?;
        let Some(NodeEnum::ColumnRef(c)) = value.node.as_ref() else { return None };
        Some(super::column_ref_names(c)?.last()?.to_string())
    }

    /// INSERT, UPDATE or DELETE through the view, as a write of its one
    /// table; the reason when it cannot be one.
    fn write(&self, node: &NodeEnum) -> Result<NodeEnum, &'static str> {
        let one_table = "it reads more than one table";
        let [base] = self.query.from_clause.as_slice() else { return Err(one_table) };
        let Some(NodeEnum::RangeVar(base)) = base.node.clone() else { return Err(one_table) };
        let unsupported = "the statement has a subquery, or names a column the view does not show";
        let columns = |targets: &mut Vec<Node>| -> Result<(), &'static str> {
            for t in targets.iter_mut() {
                let Some(NodeEnum::ResTarget(r)) = t.node.as_mut() else { return Err(unsupported) };
                r.name = self.base_column(&r.name).ok_or(unsupported)?;
                if !self.rewrite_boxed(&mut r.val, &[]) {
                    return Err(unsupported);
                }
            }
            Ok(())
        };
        // UPDATE and DELETE see only the rows the view shows.
        let filter_rows = |filter: &mut Option<Box<Node>>, returning: &mut Vec<Node>| -> Result<(), &'static str> {
            *returning = self.targets(returning).ok_or(unsupported)?;
            if !self.rewrite_boxed(filter, &[]) {
                return Err(unsupported);
            }
            *filter = self.and_filter(filter.take());
            Ok(())
        };
        match node {
            NodeEnum::UpdateStmt(u) if u.from_clause.is_empty() && u.with_clause.is_none() => {
                let mut u = u.clone();
                u.relation = Some(base);
                columns(&mut u.target_list)?;
                filter_rows(&mut u.where_clause, &mut u.returning_list)?;
                Ok(NodeEnum::UpdateStmt(u))
            }
            NodeEnum::DeleteStmt(d) if d.using_clause.is_empty() && d.with_clause.is_none() => {
                let mut d = d.clone();
                d.relation = Some(base);
                filter_rows(&mut d.where_clause, &mut d.returning_list)?;
                Ok(NodeEnum::DeleteStmt(d))
            }
            NodeEnum::InsertStmt(i) if i.on_conflict_clause.is_none() && i.with_clause.is_none() => {
                let mut i = i.clone();
                i.relation = Some(base);
                if i.cols.is_empty() {
                    let column = |name: &String| Node {
                        node: Some(NodeEnum::ResTarget(Box::new(protobuf::ResTarget {
                            name: name.clone(),
                            indirection: vec![],
                            val: None,
                            location: -1,
                        }))),
                    };
                    i.cols = self.columns.iter().map(|(name, _)| column(name)).collect();
                    if let Some(width) = values_width(&i.select_stmt) {
                        i.cols.truncate(width);
                    }
                }
                columns(&mut i.cols)?;
                i.returning_list = self.targets(&i.returning_list).ok_or(unsupported)?;
                Ok(NodeEnum::InsertStmt(i))
            }
            _ => Err("WITH, UPDATE … FROM, DELETE … USING and ON CONFLICT are not supported through it"),
        }
    }
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
                let sides: Vec<Node> = j.larg.as_deref().into_iter().chain(j.rarg.as_deref()).cloned().collect();
                names.extend(from_names(&sides));
            }
            _ => {}
        }
    }
    names
}

/// The row width of an INSERT's VALUES, when it is a VALUES list.
fn values_width(select: &Option<Box<Node>>) -> Option<usize> {
    let Some(NodeEnum::SelectStmt(s)) = select.as_deref()?.node.as_ref() else { return None };
    let Some(NodeEnum::List(row)) = s.values_lists.first()?.node.as_ref() else { return None };
    Some(row.items.len())
}

/// An INSERT, UPDATE or DELETE whose target is a view over distributed
/// tables, rewritten to write the view's table when the view is simple
/// enough for PostgreSQL to write through it; a refusal otherwise. None when
/// the target is no such view.
pub(super) fn write_through(node: &NodeEnum, catalog: &Catalog) -> Option<Result<NodeEnum, Plan>> {
    let rv = match node {
        NodeEnum::InsertStmt(s) => s.relation.as_ref(),
        NodeEnum::UpdateStmt(s) => s.relation.as_ref(),
        NodeEnum::DeleteStmt(s) => s.relation.as_ref(),
        _ => None,
    }?;
    let view = catalog.view(schema_of(rv), &rv.relname)?;
    let refuse = |why: &str| {
        Some(Err(Plan::Unsupported(
            crate::error::PgError::not_supported(format!(
                "writing through the view \"{}\", which reads distributed tables, is not supported: {why}",
                view.name
            ))
            .with_hint("Write to the view's table itself."),
        )))
    };
    if view.check_option {
        return refuse("it has WITH CHECK OPTION");
    }
    let mut expander = Expander { catalog, ctes: Vec::new(), expanded: false, too_deep: false };
    let mut query = view.query.clone();
    expander.expand(&mut query, 1);
    let NodeEnum::SelectStmt(query) = query else { return refuse("it is not a plain SELECT") };
    let Some(simple) = SimpleView::new(*query, rv) else { return refuse("it does more than pick columns of one table and filter its rows") };
    match simple.write(node) {
        Ok(stmt) => Some(Ok(stmt)),
        Err(why) => refuse(why),
    }
}

/// `*` or `name.*`.
fn is_star(c: &protobuf::ColumnRef, name: &str) -> bool {
    match c.fields.as_slice() {
        [star] => matches!(star.node, Some(NodeEnum::AStar(_))),
        [qualifier, star] => {
            matches!(star.node, Some(NodeEnum::AStar(_))) && matches!(qualifier.node.as_ref(), Some(NodeEnum::String(s)) if s.sval == name)
        }
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
    NodeEnum::RangeSubselect(Box::new(protobuf::RangeSubselect {
        lateral: false,
        subquery: Some(Box::new(Node { node: Some(query) })),
        alias: Some(alias),
    }))
}
