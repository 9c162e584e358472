//! Correlated subqueries rewritten so that they no longer run once per
//! outer row: scalar aggregates as grouped outer joins (for the statements
//! the coordinator database runs over the shards, and to be computed
//! first), `[NOT] EXISTS` as sets of keys (`semi_joins`, below).
//!
//! There a correlated subquery runs once per outer row, and every run is a
//! remote scan of each shard its filters cannot prune: "each customer's
//! balance equals the sum of its payments", with payments distributed by
//! another column, costs a round trip per shard per customer. A subquery that
//! aggregates the rows matched to the outer row by equalities alone,
//!
//! ```sql
//! (SELECT sum(p.amount) FROM payments p WHERE p.customer = c.id AND p.kind = 'card')
//! ```
//!
//! has the value of a column of a grouped outer join, which reads each shard
//! once:
//!
//! ```sql
//! … LEFT JOIN (SELECT p.customer, sum(p.amount) FROM payments p WHERE p.kind = 'card'
//!              GROUP BY p.customer) g ON g.customer = c.id
//! ```
//!
//! The two agree only when the aggregate is NULL over no rows, as a missing
//! match leaves the joined column NULL; so only sum, avg, min and max of
//! columns are rewritten, alone or in arithmetic with constants (count, being
//! 0 there, stays correlated). Anything this module is unsure of is left as
//! it was: the correlated form is slow, never wrong.
//!
//! `semi_joins` rewrites `EXISTS` and `NOT EXISTS` correlated by one
//! equality as membership in the set of the subquery's keys,
//!
//! ```sql
//! NOT EXISTS (SELECT * FROM orders o WHERE o.customer = c.id AND o.kind = 'web')
//! -- becomes
//! (c.id IS NULL OR NOT c.id IN (SELECT DISTINCT o.customer FROM orders o
//!                               WHERE o.kind = 'web' AND o.customer IS NOT NULL))
//! ```
//!
//! which no longer names the outer row: the set can be computed once, over
//! the shards, and written into the statement (executor/fallback.rs).

use super::uncorrelated_subqueries::is_uncorrelated;
use super::walk::visit_mut;
use super::{
    column_ref, column_ref_names, conjunction, function_names, has_nested_query, is_equals, is_immutable_text_or_number_function, only_filters,
    plain_select, res_target, resolve_range_var,
};
use crate::metadata::Catalog;
use pg_query::protobuf::{self, Node};
use pg_query::NodeEnum;

/// The grouped subqueries' aliases: this prefix and a number unique in the statement.
const ALIAS_PREFIX: &str = "tessera_grouped_";
const KEY_PREFIX: &str = "tessera_key_";
const VALUE_COLUMN: &str = "tessera_value";
/// The output column of a semi-join's set of keys.
const SEMI_JOIN_KEY: &str = "tessera_semi_join_key";

/// Rewrites every correlated scalar aggregate subquery of `stmt` that has
/// a grouped form; returns how many it rewrote.
pub fn decorrelate(stmt: &mut NodeEnum, catalog: &Catalog) -> usize {
    let mut rewritten = 0;
    // Parents first: a level's new grouped subqueries are walked after it,
    // and hold nothing correlated to rewrite.
    visit_mut(stmt, &mut |n| {
        if let NodeEnum::SelectStmt(select) = n {
            rewritten += decorrelate_level(select, catalog, rewritten);
        }
    });
    rewritten
}

/// Rewrites the subqueries in one SELECT's target list and WHERE clause that
/// are correlated to its own FROM items; numbers their aliases after
/// `numbered`.
fn decorrelate_level(select: &mut protobuf::SelectStmt, catalog: &Catalog, numbered: usize) -> usize {
    // Row locks would apply to the joined subqueries too, and a bare `*`
    // would show their columns.
    if select.op != protobuf::SetOperation::SetopNone as i32
        || select.from_clause.is_empty()
        || !select.locking_clause.is_empty()
        || select.target_list.iter().any(is_bare_star)
    {
        return 0;
    }
    // In a grouped query only WHERE sees rows before grouping.
    let grouped = !select.group_clause.is_empty() || select.having_clause.is_some();
    let outer = OuterScope::of(select, catalog);
    let mut joins: Vec<(Node, Node)> = Vec::new();
    let mut replace = |n: &mut NodeEnum| {
        let NodeEnum::SubLink(link) = n else { return };
        let Some(grouped) = grouped_form(link, &outer, catalog) else { return };
        let alias = format!("{ALIAS_PREFIX}{}", numbered + joins.len() + 1);
        joins.push(grouped.join_parts(&alias));
        if let Some(NodeEnum::ColumnRef(value)) = column_ref(&[&alias, VALUE_COLUMN]).node {
            *n = NodeEnum::ColumnRef(value);
        }
    };
    for target in select.target_list.iter_mut().filter(|_| !grouped) {
        let Some(NodeEnum::ResTarget(target)) = target.node.as_mut() else { continue };
        let Some(val) = target.val.as_deref_mut() else { continue };
        let name = column_name_of_sublink(val);
        subqueries_of_level(val, &mut replace);
        // The column keeps the name PostgreSQL gives the subquery.
        if target.name.is_empty() && is_grouped_value(val) {
            target.name = name.unwrap_or_else(|| "?column?".to_string());
        }
    }
    if let Some(filter) = select.where_clause.as_deref_mut() {
        subqueries_of_level(filter, &mut replace);
    }
    if joins.is_empty() {
        return 0;
    }
    let count = joins.len();
    let mut items = std::mem::take(&mut select.from_clause).into_iter();
    let first = items.next().expect("FROM checked not empty");
    let crossed = items.fold(first, |left, right| join(protobuf::JoinType::JoinInner, left, right, None));
    let joined = joins.into_iter().fold(crossed, |left, (grouped, on)| join(protobuf::JoinType::JoinLeft, left, grouped, Some(on)));
    select.from_clause = vec![joined];
    count
}

/// Calls `replace` on each subquery of an expression that belongs to this
/// query level, not on those nested in another subquery: a subquery it keeps
/// is set aside during the walk, so the walk does not enter it.
fn subqueries_of_level(expr: &mut Node, replace: &mut dyn FnMut(&mut NodeEnum)) {
    let Some(expr) = expr.node.as_mut() else { return };
    let mut kept = Vec::new();
    visit_mut(expr, &mut |n| {
        replace(n);
        if let NodeEnum::SubLink(link) = n {
            kept.push(link.subselect.take());
        }
    });
    put_back_subqueries(expr, kept);
}

/// Gives the subqueries taken out of an expression's SubLinks back to
/// them, in the order of the walk that took them.
fn put_back_subqueries(expr: &mut NodeEnum, kept: Vec<Option<Box<Node>>>) {
    let mut kept = kept.into_iter();
    visit_mut(expr, &mut |n| {
        if let NodeEnum::SubLink(link) = n {
            if link.subselect.is_none() {
                link.subselect = kept.next().flatten();
            }
        }
    });
}

/// A subquery's grouped form: the subquery without its correlated equalities,
/// grouped by their inner sides, and the outer sides they were equal to.
struct Grouped {
    select: protobuf::SelectStmt,
    outer_keys: Vec<Node>,
}

impl Grouped {
    /// The FROM item `(…) AS alias` and its join condition.
    fn join_parts(self, alias: &str) -> (Node, Node) {
        let on = self
            .outer_keys
            .into_iter()
            .enumerate()
            .map(|(i, outer)| equals(column_ref(&[alias, &format!("{KEY_PREFIX}{}", i + 1)]), outer))
            .collect();
        let subquery = protobuf::RangeSubselect {
            lateral: false,
            subquery: Some(Box::new(Node { node: Some(NodeEnum::SelectStmt(Box::new(self.select))) })),
            alias: Some(protobuf::Alias { aliasname: alias.to_string(), colnames: vec![] }),
        };
        (Node { node: Some(NodeEnum::RangeSubselect(Box::new(subquery))) }, conjunction(on))
    }
}

/// Where a column reference inside a subquery points.
#[derive(PartialEq)]
enum Side {
    Inner,
    /// A FROM item of the level the subquery is in.
    Outer,
    /// Further out, or not known: the subquery is left alone.
    Unknown,
}

/// The FROM items of the level a subquery is in: the names they make
/// visible, all their tables' columns when the catalog knows every one, the
/// tables that are FROM items of their own, and the level's ANDed WHERE
/// conditions.
struct OuterScope {
    names: Vec<String>,
    columns: Option<Vec<String>>,
    tables: Vec<protobuf::RangeVar>,
    conditions: Vec<Node>,
}

impl OuterScope {
    fn of(select: &protobuf::SelectStmt, catalog: &Catalog) -> Self {
        let mut outer = OuterScope { names: Vec::new(), columns: Some(Vec::new()), tables: Vec::new(), conditions: Vec::new() };
        for item in &select.from_clause {
            from_item_names(item, &mut outer.names);
            outer.columns = outer.columns.take().and_then(|mut columns| outer_columns(item, catalog, &mut columns).map(|()| columns));
            if let Some(NodeEnum::RangeVar(rv)) = item.node.as_ref() {
                outer.tables.push(rv.clone());
            }
        }
        if let Some(filter) = select.where_clause.as_deref() {
            let mut conditions = Vec::new();
            flatten_and(filter, &mut conditions);
            outer.conditions = conditions.into_iter().cloned().collect();
        }
        outer
    }

    /// Whether exactly one of the level's tables has a column of this name,
    /// so that the unqualified name, where no inner table has it, is that
    /// table's.
    fn one_table_has(&self, column: &str) -> bool {
        self.columns.as_ref().is_some_and(|columns| columns.iter().filter(|c| *c == column).count() == 1)
    }

    /// The table of `tables` a column reference of this level names.
    fn owner(&self, c: &protobuf::ColumnRef, catalog: &Catalog) -> Option<(&protobuf::RangeVar, String)> {
        let has = |rv: &protobuf::RangeVar, column: &str| resolve_range_var(rv, catalog).is_some_and(|t| t.columns.iter().any(|c| c == column));
        match column_ref_names(c).as_deref()? {
            [column] if self.one_table_has(column) => self.tables.iter().find(|rv| has(rv, column)).map(|rv| (rv, column.to_string())),
            [table, column] => self.tables.iter().find(|rv| name_of(rv) == *table && has(rv, column)).map(|rv| (rv, column.to_string())),
            _ => None,
        }
    }
}

fn name_of(rv: &protobuf::RangeVar) -> &str {
    rv.alias.as_ref().map_or(rv.relname.as_str(), |a| a.aliasname.as_str())
}

/// The subquery's tables: their names in it and all their columns.
struct InnerScope {
    names: Vec<String>,
    columns: Vec<String>,
}

impl InnerScope {
    fn side(&self, c: &protobuf::ColumnRef, outer: &OuterScope) -> Side {
        match column_ref_names(c).as_deref() {
            Some([column]) if self.columns.iter().any(|c| c == column) => Side::Inner,
            // TPC-H's `l_partkey = p_partkey`.
            Some([column]) if outer.one_table_has(column) => Side::Outer,
            Some([table, _]) if self.names.iter().any(|n| n == table) => Side::Inner,
            Some([table, _]) if outer.names.iter().any(|n| n == table) => Side::Outer,
            _ => Side::Unknown,
        }
    }

    /// Whether every column an expression reads is the subquery's own.
    fn only_inner(&self, expr: &Node, outer: &OuterScope) -> bool {
        column_refs(expr).iter().all(|c| self.side(c, outer) == Side::Inner)
    }
}

fn grouped_form(link: &protobuf::SubLink, outer: &OuterScope, catalog: &Catalog) -> Option<Grouped> {
    if link.sub_link_type != protobuf::SubLinkType::ExprSublink as i32 {
        return None;
    }
    let Some(NodeEnum::SelectStmt(query)) = link.subselect.as_deref()?.node.as_ref() else { return None };
    if !only_filters(query) || query.target_list.len() != 1 || has_nested_query(query) {
        return None;
    }
    let mut scope = InnerScope { names: Vec::new(), columns: Vec::new() };
    for item in &query.from_clause {
        inner_tables(item, catalog, &mut scope)?;
    }
    let from_inner = query.from_clause.iter().all(|item| scope.only_inner(item, outer));
    let Some(NodeEnum::ResTarget(target)) = query.target_list[0].node.as_ref() else { return None };
    let value = target.val.as_deref()?;
    if !from_inner || !scope.only_inner(value, outer) || null_over_no_rows(value) != Some(true) {
        return None;
    }
    let mut filters = Vec::new();
    let mut from_clause = query.from_clause.clone();
    let (mut inner_keys, mut outer_keys) = (Vec::new(), Vec::new());
    let mut conjuncts = Vec::new();
    if let Some(filter) = query.where_clause.as_deref() {
        flatten_and(filter, &mut conjuncts);
    }
    for conjunct in conjuncts {
        if scope.only_inner(conjunct, outer) {
            filters.push(conjunct.clone());
            continue;
        }
        let (inner, outer) = correlating_equality(conjunct, &scope, outer)?;
        inner_keys.push(inner.clone());
        outer_keys.push(outer.clone());
    }
    if outer_keys.is_empty() {
        return None;
    }
    if let Some(narrowing) = narrowing(&inner_keys, &outer_keys, &scope, outer, catalog) {
        filters.extend(narrowing.conditions);
        from_clause.push(narrowing.table);
    }
    let mut targets: Vec<Node> = inner_keys.iter().enumerate().map(|(i, key)| res_target(&format!("{KEY_PREFIX}{}", i + 1), key.clone())).collect();
    targets.push(res_target(VALUE_COLUMN, value.clone()));
    let select = protobuf::SelectStmt {
        target_list: targets,
        from_clause,
        where_clause: (!filters.is_empty()).then(|| Box::new(conjunction(filters))),
        group_clause: inner_keys,
        ..plain_select()
    };
    Some(Grouped { select, outer_keys })
}

/// Rewrites each `EXISTS` and `NOT EXISTS` of `stmt` that is one of its
/// level's ANDed WHERE conditions and has a semi-join form (see the
/// module's header); returns how many it rewrote.
pub fn semi_joins(stmt: &mut NodeEnum, catalog: &Catalog) -> usize {
    let mut rewritten = 0;
    visit_mut(stmt, &mut |n| {
        let NodeEnum::SelectStmt(select) = n else { return };
        if select.op != protobuf::SetOperation::SetopNone as i32 || select.from_clause.is_empty() {
            return;
        }
        let outer = OuterScope::of(select, catalog);
        if let Some(filter) = select.where_clause.as_deref_mut() {
            rewritten += semi_joins_of_conjuncts(filter, &outer, catalog);
        }
    });
    rewritten
}

/// Whether `stmt` still has a semi-join's set of keys as a subquery.
pub fn has_semi_join(stmt: &NodeEnum) -> bool {
    let mut found = false;
    visit_mut(&mut stmt.clone(), &mut |n| {
        if let NodeEnum::ResTarget(target) = n {
            found |= target.name == SEMI_JOIN_KEY;
        }
    });
    found
}

fn semi_joins_of_conjuncts(expr: &mut Node, outer: &OuterScope, catalog: &Catalog) -> usize {
    let negated = |b: &protobuf::BoolExpr| b.boolop == protobuf::BoolExprType::NotExpr as i32 && b.args.len() == 1;
    let rewritten = match expr.node.as_mut() {
        Some(NodeEnum::BoolExpr(b)) if b.boolop == protobuf::BoolExprType::AndExpr as i32 => {
            return b.args.iter_mut().map(|arg| semi_joins_of_conjuncts(arg, outer, catalog)).sum();
        }
        Some(NodeEnum::SubLink(link)) => semi_join_form(link, outer, catalog).map(SemiJoin::exists),
        Some(NodeEnum::BoolExpr(b)) if negated(b) => match b.args[0].node.as_ref() {
            Some(NodeEnum::SubLink(link)) => semi_join_form(link, outer, catalog).map(SemiJoin::not_exists),
            _ => None,
        },
        _ => None,
    };
    match rewritten {
        Some(rewritten) => {
            *expr = rewritten;
            1
        }
        None => 0,
    }
}

/// An EXISTS subquery as a set of keys: the subquery without its one
/// correlated equality, giving the distinct non-null values of that
/// equality's inner side, and the outer side they are compared with.
struct SemiJoin {
    keys: protobuf::SelectStmt,
    outer_key: Node,
}

impl SemiJoin {
    /// `outer IN (keys)`: true where EXISTS is, NULL (not true) for a NULL
    /// outer key where EXISTS is false, which as a WHERE condition is the same.
    fn exists(self) -> Node {
        let link = protobuf::SubLink {
            sub_link_type: protobuf::SubLinkType::AnySublink as i32,
            testexpr: Some(Box::new(self.outer_key)),
            subselect: Some(Box::new(Node { node: Some(NodeEnum::SelectStmt(Box::new(self.keys))) })),
            ..Default::default()
        };
        Node { node: Some(NodeEnum::SubLink(Box::new(link))) }
    }

    /// `outer IS NULL OR NOT outer IN (keys)`: the keys hold no NULL, so the
    /// membership is true or false for a non-null outer key.
    fn not_exists(self) -> Node {
        let is_null = null_test(self.outer_key.clone(), protobuf::NullTestType::IsNull);
        bool_expr(protobuf::BoolExprType::OrExpr, vec![is_null, bool_expr(protobuf::BoolExprType::NotExpr, vec![self.exists()])])
    }
}

fn semi_join_form(link: &protobuf::SubLink, outer: &OuterScope, catalog: &Catalog) -> Option<SemiJoin> {
    if link.sub_link_type != protobuf::SubLinkType::ExistsSublink as i32 {
        return None;
    }
    let Some(NodeEnum::SelectStmt(query)) = link.subselect.as_deref()?.node.as_ref() else { return None };
    // A set-returning call in the select list could make an EXISTS false.
    let plain_output = |t: &Node| {
        matches!(t.node.as_ref(), Some(NodeEnum::ResTarget(t))
            if matches!(t.val.as_deref().and_then(|v| v.node.as_ref()), Some(NodeEnum::ColumnRef(_) | NodeEnum::AConst(_))))
    };
    if !only_filters(query) || has_nested_query(query) || !query.target_list.iter().all(plain_output) {
        return None;
    }
    let mut scope = InnerScope { names: Vec::new(), columns: Vec::new() };
    for item in &query.from_clause {
        inner_tables(item, catalog, &mut scope)?;
    }
    if !query.from_clause.iter().all(|item| scope.only_inner(item, outer)) {
        return None;
    }
    let mut conjuncts = Vec::new();
    if let Some(filter) = query.where_clause.as_deref() {
        flatten_and(filter, &mut conjuncts);
    }
    let (mut filters, mut keys) = (Vec::new(), None);
    for conjunct in conjuncts {
        if scope.only_inner(conjunct, outer) {
            filters.push(conjunct.clone());
        } else if keys.replace(correlating_equality(conjunct, &scope, outer)?).is_some() {
            return None;
        }
    }
    let (inner_key, outer_key) = keys?;
    let mut from_clause = query.from_clause.clone();
    if let Some(narrowing) = narrowing(std::slice::from_ref(inner_key), std::slice::from_ref(outer_key), &scope, outer, catalog) {
        filters.extend(narrowing.conditions);
        from_clause.push(narrowing.table);
    }
    filters.push(null_test(inner_key.clone(), protobuf::NullTestType::IsNotNull));
    let keys = protobuf::SelectStmt {
        distinct_clause: vec![Node { node: None }],
        target_list: vec![res_target(SEMI_JOIN_KEY, inner_key.clone())],
        from_clause,
        where_clause: Some(Box::new(conjunction(filters))),
        ..plain_select()
    };
    Some(SemiJoin { keys, outer_key: outer_key.clone() })
}

/// A table of the outer level joined into a grouped subquery, and the
/// conditions that come with it.
struct Narrowing {
    table: Node,
    conditions: Vec<Node>,
}

/// Only the groups of keys some outer row may ask for: when the subquery is
/// correlated to the whole primary key of an outer table that the outer
/// level's WHERE restricts by conditions on it alone (TPC-H's Q17: `part`
/// by brand and container), that table joins the grouped subquery on those
/// keys, with those conditions. Each inner row meets at most one of its
/// rows, so a group keeps its rows and its value; the groups left out are
/// of keys whose outer rows the outer WHERE drops. Computed first, the
/// grouped subquery then gives hundreds of rows where it gave a group per
/// key of the whole inner table.
fn narrowing(inner_keys: &[Node], outer_keys: &[Node], scope: &InnerScope, outer: &OuterScope, catalog: &Catalog) -> Option<Narrowing> {
    let owners: Vec<(&protobuf::RangeVar, String)> = outer_keys
        .iter()
        .map(|key| match key.node.as_ref() {
            Some(NodeEnum::ColumnRef(c)) => outer.owner(c, catalog),
            _ => None,
        })
        .collect::<Option<_>>()?;
    let (owner, _) = owners.first()?;
    let table = resolve_range_var(owner, catalog)?;
    let name = name_of(owner);
    let keyed = |column: &String| owners.iter().any(|(rv, c)| name_of(rv) == name && c == column);
    if table.primary_key.is_empty() || !table.primary_key.iter().all(keyed) || scope.names.iter().any(|n| n == name) {
        return None;
    }
    let mut conditions: Vec<Node> = outer.conditions.iter().filter_map(|c| on_table_alone(c, owner, outer, catalog)).collect();
    if conditions.is_empty() {
        return None;
    }
    for (inner, (rv, column)) in inner_keys.iter().zip(&owners) {
        if name_of(rv) == name {
            conditions.push(equals(inner.clone(), column_ref(&[name, column])));
        }
    }
    Some(Narrowing { table: Node { node: Some(NodeEnum::RangeVar((*owner).clone())) }, conditions })
}

/// A condition of the outer level that reads columns of `table` alone,
/// with constants, operators, a few immutable functions (no other calls:
/// a volatile or stable one may give another answer in the statement that
/// computes the subquery first) and uncorrelated subqueries (TPC-H's Q20:
/// `ps_partkey IN (SELECT p_partkey FROM part WHERE …)`), its columns
/// qualified by the table's name.
fn on_table_alone(condition: &Node, table: &protobuf::RangeVar, outer: &OuterScope, catalog: &Catalog) -> Option<Node> {
    let mut copy = condition.clone();
    // The subqueries' own columns are theirs: they are set aside while the
    // condition's are looked at.
    let mut set_aside = Vec::new();
    visit_mut(copy.node.as_mut()?, &mut |n| {
        if let NodeEnum::SubLink(link) = n {
            set_aside.push(link.subselect.take());
        }
    });
    let uncorrelated = |sub: &Option<Box<Node>>| matches!(sub.as_deref().and_then(|s| s.node.as_ref()), Some(NodeEnum::SelectStmt(s)) if is_uncorrelated(s, catalog));
    if !set_aside.iter().all(uncorrelated) {
        return None;
    }
    let mut alone = true;
    let mut columns = 0;
    visit_mut(copy.node.as_mut()?, &mut |n| match n {
        NodeEnum::ColumnRef(c) => {
            columns += 1;
            match outer.owner(c, catalog) {
                Some((rv, column)) if name_of(rv) == name_of(table) => {
                    if let Some(NodeEnum::ColumnRef(qualified)) = column_ref(&[name_of(table), &column]).node {
                        *c = qualified;
                    }
                }
                _ => alone = false,
            }
        }
        NodeEnum::AExpr(_) | NodeEnum::BoolExpr(_) | NodeEnum::AConst(_) | NodeEnum::TypeCast(_) | NodeEnum::TypeName(_) | NodeEnum::NullTest(_) => {}
        NodeEnum::String(_) | NodeEnum::List(_) | NodeEnum::Integer(_) => {}
        // TPC-H's `substring(c_phone from 1 for 2) IN (…)`.
        NodeEnum::FuncCall(call) if is_immutable_text_or_number_function(call) => {}
        NodeEnum::SubLink(link) if link.subselect.is_none() => {}
        _ => alone = false,
    });
    put_back_subqueries(copy.node.as_mut()?, set_aside);
    (alone && columns > 0).then_some(copy)
}

/// `inner = outer` or `outer = inner`, each side a plain column.
fn correlating_equality<'a>(conjunct: &'a Node, scope: &InnerScope, outer: &OuterScope) -> Option<(&'a Node, &'a Node)> {
    let Some(NodeEnum::AExpr(e)) = conjunct.node.as_ref() else { return None };
    if e.kind != protobuf::AExprKind::AexprOp as i32 || !is_equals(&e.name) {
        return None;
    }
    let (left, right) = (e.lexpr.as_deref()?, e.rexpr.as_deref()?);
    let side = |n: &Node| match n.node.as_ref() {
        Some(NodeEnum::ColumnRef(c)) => scope.side(c, outer),
        _ => Side::Unknown,
    };
    match (side(left), side(right)) {
        (Side::Inner, Side::Outer) => Some((left, right)),
        (Side::Outer, Side::Inner) => Some((right, left)),
        _ => None,
    }
}

/// Adds the tables of a subquery's FROM item to its scope; None for anything
/// whose columns the catalog does not know.
fn inner_tables(item: &Node, catalog: &Catalog, scope: &mut InnerScope) -> Option<()> {
    match item.node.as_ref()? {
        NodeEnum::RangeVar(rv) => {
            if rv.alias.as_ref().is_some_and(|a| !a.colnames.is_empty()) {
                return None;
            }
            let table = resolve_range_var(rv, catalog)?;
            scope.names.push(rv.alias.as_ref().map_or_else(|| rv.relname.clone(), |a| a.aliasname.clone()));
            scope.columns.extend(table.columns.iter().cloned());
            Some(())
        }
        NodeEnum::JoinExpr(j) if j.alias.is_none() => {
            inner_tables(j.larg.as_deref()?, catalog, scope)?;
            inner_tables(j.rarg.as_deref()?, catalog, scope)
        }
        _ => None,
    }
}

/// Adds the columns of a FROM item's tables; None for anything whose
/// columns the catalog does not know (a subquery, a function, column
/// aliases).
fn outer_columns(item: &Node, catalog: &Catalog, columns: &mut Vec<String>) -> Option<()> {
    let mut scope = InnerScope { names: Vec::new(), columns: Vec::new() };
    inner_tables(item, catalog, &mut scope)?;
    columns.append(&mut scope.columns);
    Some(())
}

/// The names a FROM item makes visible to its level's expressions.
fn from_item_names(item: &Node, names: &mut Vec<String>) {
    match item.node.as_ref() {
        Some(NodeEnum::RangeVar(rv)) => names.push(rv.alias.as_ref().map_or_else(|| rv.relname.clone(), |a| a.aliasname.clone())),
        Some(NodeEnum::RangeSubselect(s)) => names.extend(s.alias.as_ref().map(|a| a.aliasname.clone())),
        Some(NodeEnum::RangeFunction(f)) => names.extend(f.alias.as_ref().map(|a| a.aliasname.clone())),
        Some(NodeEnum::JoinExpr(j)) => {
            names.extend(j.alias.as_ref().map(|a| a.aliasname.clone()));
            for side in [j.larg.as_deref(), j.rarg.as_deref()].into_iter().flatten() {
                from_item_names(side, names);
            }
        }
        _ => {}
    }
}

/// Whether a value expression is NULL when its aggregates saw no rows
/// (Some(true)), a constant (Some(false)), or neither (None).
fn null_over_no_rows(expr: &Node) -> Option<bool> {
    match expr.node.as_ref()? {
        NodeEnum::FuncCall(call) => {
            let name = match function_names(call).as_slice() {
                [name] | ["pg_catalog", name] => *name,
                _ => return None,
            };
            let plain = !call.agg_star
                && call.agg_filter.is_none()
                && call.agg_order.is_empty()
                && call.over.is_none()
                && !call.agg_within_group
                && !call.func_variadic;
            let of_column = matches!(call.args.as_slice(), [arg] if matches!(arg.node, Some(NodeEnum::ColumnRef(_))));
            (plain && of_column && matches!(name, "sum" | "avg" | "min" | "max")).then_some(true)
        }
        NodeEnum::AConst(c) => {
            (!c.isnull && matches!(c.val, Some(protobuf::a_const::Val::Ival(_) | protobuf::a_const::Val::Fval(_)))).then_some(false)
        }
        NodeEnum::TypeCast(cast) => null_over_no_rows(cast.arg.as_deref()?),
        NodeEnum::AExpr(e) if e.kind == protobuf::AExprKind::AexprOp as i32 => {
            let operator = match e.name.as_slice() {
                [n] => match n.node.as_ref() {
                    Some(NodeEnum::String(s)) => s.sval.as_str(),
                    _ => return None,
                },
                _ => return None,
            };
            let right = null_over_no_rows(e.rexpr.as_deref()?)?;
            let left = match e.lexpr.as_deref() {
                Some(l) => null_over_no_rows(l)?,
                None if matches!(operator, "+" | "-") => false,
                None => return None,
            };
            // Over groups no outer row asks for, a division by zero would
            // fail where the correlated form never divides.
            let divisor_safe = operator != "/" || (!right && !is_zero(e.rexpr.as_deref()?));
            (matches!(operator, "+" | "-" | "*" | "/") && divisor_safe).then_some(left || right)
        }
        _ => None,
    }
}

/// Whether a constant may be zero (anything not a plain number counts).
fn is_zero(constant: &Node) -> bool {
    match constant.node.as_ref() {
        // Stored view definitions cast their constants: `(2)::numeric`.
        Some(NodeEnum::TypeCast(cast)) => cast.arg.as_deref().is_none_or(is_zero),
        Some(NodeEnum::AConst(c)) => match &c.val {
            Some(protobuf::a_const::Val::Ival(i)) => i.ival == 0,
            Some(protobuf::a_const::Val::Fval(f)) => f.fval.parse::<f64>().map_or(true, |v| v == 0.0),
            _ => true,
        },
        _ => true,
    }
}

/// The column name PostgreSQL gives an expression that is a scalar
/// subquery: its one output column's, or None for `?column?`.
fn column_name_of_sublink(expr: &Node) -> Option<String> {
    let Some(NodeEnum::SubLink(link)) = expr.node.as_ref() else { return None };
    let Some(NodeEnum::SelectStmt(query)) = link.subselect.as_deref()?.node.as_ref() else { return None };
    let Some(NodeEnum::ResTarget(target)) = query.target_list.first()?.node.as_ref() else { return None };
    if !target.name.is_empty() {
        return Some(target.name.clone());
    }
    column_name(target.val.as_deref()?)
}

fn column_name(expr: &Node) -> Option<String> {
    match expr.node.as_ref()? {
        NodeEnum::FuncCall(call) => function_names(call).last().map(|n| n.to_string()),
        NodeEnum::ColumnRef(c) => column_ref_names(c)?.last().map(|n| n.to_string()),
        NodeEnum::TypeCast(cast) => column_name(cast.arg.as_deref()?).or_else(|| {
            let type_name = cast.type_name.as_ref()?;
            match type_name.names.last()?.node.as_ref()? {
                NodeEnum::String(s) => Some(s.sval.clone()),
                _ => None,
            }
        }),
        _ => None,
    }
}

fn is_grouped_value(expr: &Node) -> bool {
    matches!(expr.node.as_ref(), Some(NodeEnum::ColumnRef(c)) if column_ref_names(c).is_some_and(|n| n.len() == 2 && n[0].starts_with(ALIAS_PREFIX) && n[1] == VALUE_COLUMN))
}

/// `*` alone as a select-list entry.
pub(super) fn is_bare_star(target: &Node) -> bool {
    let Some(NodeEnum::ResTarget(t)) = target.node.as_ref() else { return false };
    matches!(t.val.as_deref().and_then(|v| v.node.as_ref()), Some(NodeEnum::ColumnRef(c)) if matches!(c.fields.as_slice(), [f] if matches!(f.node, Some(NodeEnum::AStar(_)))))
}

fn column_refs(expr: &Node) -> Vec<protobuf::ColumnRef> {
    let mut out = Vec::new();
    if let Some(node) = expr.node.as_ref() {
        visit_mut(&mut node.clone(), &mut |n| {
            if let NodeEnum::ColumnRef(c) = n {
                out.push(c.clone());
            }
        });
    }
    out
}

pub(super) fn flatten_and<'a>(expr: &'a Node, out: &mut Vec<&'a Node>) {
    match expr.node.as_ref() {
        Some(NodeEnum::BoolExpr(b)) if b.boolop == protobuf::BoolExprType::AndExpr as i32 => b.args.iter().for_each(|a| flatten_and(a, out)),
        _ => out.push(expr),
    }
}

fn equals(left: Node, right: Node) -> Node {
    let e = protobuf::AExpr {
        kind: protobuf::AExprKind::AexprOp as i32,
        name: vec![super::string_node("=")],
        lexpr: Some(Box::new(left)),
        rexpr: Some(Box::new(right)),
        location: -1,
    };
    Node { node: Some(NodeEnum::AExpr(Box::new(e))) }
}

fn bool_expr(op: protobuf::BoolExprType, args: Vec<Node>) -> Node {
    Node { node: Some(NodeEnum::BoolExpr(Box::new(protobuf::BoolExpr { xpr: None, boolop: op as i32, args, location: -1 }))) }
}

fn null_test(arg: Node, test: protobuf::NullTestType) -> Node {
    let test = protobuf::NullTest { arg: Some(Box::new(arg)), nulltesttype: test as i32, location: -1, ..Default::default() };
    Node { node: Some(NodeEnum::NullTest(Box::new(test))) }
}

fn join(kind: protobuf::JoinType, left: Node, right: Node, on: Option<Node>) -> Node {
    let j = protobuf::JoinExpr {
        jointype: kind as i32,
        larg: Some(Box::new(left)),
        rarg: Some(Box::new(right)),
        quals: on.map(Box::new),
        ..Default::default()
    };
    Node { node: Some(NodeEnum::JoinExpr(Box::new(j))) }
}
