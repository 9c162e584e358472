//! The split of a multi-shard SELECT that the partial forms cannot take:
//! windows over rows of several shard groups, aggregates with no partial form
//! (percentiles, mode, array_agg or string_agg with their ORDER BY, DISTINCT
//! aggregates of several values), grouping sets, DISTINCT ON. The shards run
//! the FROM and WHERE, joins and filters included, and send only the columns
//! the rest of the query reads; the coordinator database computes the rest
//! over those rows, exactly as PostgreSQL would over the table. Unlike the
//! general fallback, the shards read in parallel and only the needed columns
//! of the matching rows move.

use super::multi_shard::{
    expression_key, grouping_set_expressions, name_strength, output_alias, partial_column, partials_relation, position, sort_output, target_value,
    Refusal,
};
use super::walk::visit_mut;
use super::{column_ref_names, deparse, plain_select, res_target};
use crate::metadata::Catalog;
use pg_query::protobuf::{self, Node, SelectStmt};
use pg_query::NodeEnum;

/// The worker statement and the combining statement.
pub(super) fn split(select: &SelectStmt, catalog: &Catalog) -> Result<(NodeEnum, String), Refusal> {
    if select.op != protobuf::SetOperation::SetopNone as i32 || !select.values_lists.is_empty() {
        return Err("a set operation across shards".into());
    }
    if select.target_list.iter().any(|t| target_value(t).is_none_or(is_star)) {
        return Err("* beside windows or aggregates across shards".into());
    }
    let mut whole = Vec::new();
    for group in &select.group_clause {
        let expressions = match group.node.as_ref() {
            Some(NodeEnum::GroupingSet(set)) => grouping_set_expressions(set)?,
            _ => match position(group) {
                Some(p) => target_value(select.target_list.get(p - 1).ok_or("GROUP BY position out of range")?).into_iter().cloned().collect(),
                None => vec![group.clone()],
            },
        };
        whole.extend(expressions.iter().filter_map(|e| e.node.as_ref().and_then(expression_key)));
    }
    let mut shipped = Shipped { catalog, columns: vec![], whole, row_names: from_names(&select.from_clause), refusal: None };
    let mut combine = select.clone();
    for target in &mut combine.target_list {
        if let Some(NodeEnum::ResTarget(t)) = target.node.as_mut() {
            if t.name.is_empty() {
                // The combine's expression names no column of the query.
                let value = t.val.as_deref().and_then(|v| v.node.as_ref()).ok_or("an empty target")?;
                t.name = name_strength(value).0.ok_or("an output column whose name is hard to tell")?;
            }
            shipped.rewrite(t.val.as_deref_mut());
        }
    }
    for group in &mut combine.group_clause {
        if position(group).is_none() {
            if output_alias(group, &select.target_list).is_some() {
                return Err("GROUP BY an output column name".into());
            }
            shipped.rewrite(Some(group));
        }
    }
    shipped.rewrite(combine.having_clause.as_deref_mut());
    for window in &mut combine.window_clause {
        shipped.rewrite(Some(window));
    }
    // ORDER BY and DISTINCT ON may name output columns, which the combine still has.
    for sort in &mut combine.sort_clause {
        if let Some(NodeEnum::SortBy(by)) = sort.node.as_mut() {
            let key = by.node.as_deref_mut().ok_or("empty ORDER BY")?;
            if position(key).is_none() && sort_output(key, &select.target_list).is_none() {
                shipped.rewrite(Some(key));
            }
        }
    }
    for on in combine.distinct_clause.iter_mut().filter(|n| n.node.is_some()) {
        if position(on).is_none() && sort_output(on, &select.target_list).is_none() {
            shipped.rewrite(Some(on));
        }
    }
    if let Some(refusal) = shipped.refusal {
        return Err(refusal);
    }
    let mut columns: Vec<Node> = shipped.columns.into_iter().enumerate().map(|(i, (column, _))| res_target(&partial_column(i), column)).collect();
    if columns.is_empty() {
        // Only the number of rows counts (count(*) alone).
        let one = protobuf::AConst { isnull: false, location: -1, val: Some(protobuf::a_const::Val::Ival(protobuf::Integer { ival: 1 })) };
        columns.push(res_target(&partial_column(0), Node { node: Some(NodeEnum::AConst(one)) }));
    }
    // When every aggregate ignores repeated inputs, each shard sends each
    // combination of values once.
    let distinct = if only_repeat_blind_aggregates(select, catalog) { vec![Node { node: None }] } else { vec![] };
    let mut worker = SelectStmt {
        distinct_clause: distinct,
        target_list: columns,
        from_clause: select.from_clause.clone(),
        where_clause: select.where_clause.clone(),
        with_clause: select.with_clause.clone(),
        ..plain_select()
    };
    // Several DISTINCT aggregates: each value once, not each combination.
    super::distinct_sets::group_by_sets(&mut combine, &mut worker, catalog);
    let worker = super::top_ranks::keep_top_ranks(select, worker, catalog);
    combine.from_clause = vec![partials_relation()];
    combine.where_clause = None;
    combine.with_clause = None;
    let sql =
        deparse::deparse_statement(deparse::BUILT_TREE_VERSION, NodeEnum::SelectStmt(Box::new(combine))).map_err(|e| e.message().to_string())?;
    Ok((NodeEnum::SelectStmt(Box::new(worker)), sql))
}

/// The shipped columns a combining statement groups by (GROUP BY
/// expressions are shipped whole, so each is one column); None when one is
/// not a plain column, as in a grouping set.
pub(super) fn combine_group_columns(combine: &SelectStmt) -> Option<Vec<String>> {
    let mut columns = Vec::new();
    for group in &combine.group_clause {
        let key = match position(group) {
            Some(p) => target_value(combine.target_list.get(p - 1)?)?,
            None => group,
        };
        columns.push(shipped_column(key)?);
    }
    Some(columns)
}

/// The name of the shipped column `node` reads, when it is one bare column.
pub(super) fn shipped_column(node: &Node) -> Option<String> {
    let NodeEnum::ColumnRef(c) = node.node.as_ref()? else { return None };
    match column_ref_names(c)?.as_slice() {
        [name] => Some(name.to_string()),
        _ => None,
    }
}

/// The columns the combine reads, each sent once.
struct Shipped<'c> {
    catalog: &'c Catalog,
    /// The expressions sent (column references, and the whole GROUP BY
    /// expressions and aggregate arguments), with their text.
    columns: Vec<(Node, String)>,
    /// The text of expressions sent whole wherever they appear: the
    /// GROUP BY expressions, which the combine must group by as they are.
    whole: Vec<String>,
    /// The FROM items' names: a bare one of these is a whole row.
    row_names: Vec<String>,
    refusal: Option<Refusal>,
}

impl Shipped<'_> {
    /// Makes every column reference under `node` read its shipped column;
    /// GROUP BY expressions and aggregates' arguments are read whole, so
    /// that shards send (and de-duplicate) their values rather than the
    /// columns under them.
    fn rewrite(&mut self, node: Option<&mut Node>) {
        let Some(n) = node.and_then(|n| n.node.as_mut()) else { return };
        visit_mut(n, &mut |n| {
            if self.refusal.is_some() || self.is_shipped_column(n) {
                return;
            }
            if let Some(key) = expression_key(n).filter(|k| self.whole.contains(k)) {
                *n = self.ship(n.clone(), key);
                return;
            }
            match n {
                NodeEnum::SubLink(_) => self.refusal = Some("a subquery over the shards' rows".into()),
                NodeEnum::FuncCall(call) if call.over.is_none() && (call.agg_star || self.catalog.is_aggregate(function_name(call))) => {
                    let sort_keys = call.agg_order.iter_mut().filter_map(|o| match o.node.as_mut() {
                        Some(NodeEnum::SortBy(by)) => by.node.as_deref_mut(),
                        _ => None,
                    });
                    for arg in call.args.iter_mut().chain(sort_keys).chain(call.agg_filter.as_deref_mut()) {
                        let Some(value) = arg.node.as_ref().filter(|v| self.row_level(v)) else { continue };
                        if let Some(key) = expression_key(value) {
                            arg.node = Some(self.ship(value.clone(), key));
                        }
                    }
                }
                NodeEnum::ColumnRef(c) => match column_ref_names(c) {
                    Some(_) if self.is_row_name(c) => self.refusal = Some("a whole row across shards".into()),
                    Some(_) => match expression_key(n) {
                        Some(key) => *n = self.ship(n.clone(), key),
                        None => self.refusal = Some("a column that cannot be printed".into()),
                    },
                    None => self.refusal = Some("a whole row across shards".into()),
                },
                _ => {}
            }
        });
    }

    /// The column the combine reads `value` from, sending it if new.
    fn ship(&mut self, value: NodeEnum, key: String) -> NodeEnum {
        let i = match self.columns.iter().position(|(_, k)| *k == key) {
            Some(i) => i,
            None => {
                self.columns.push((Node { node: Some(value) }, key));
                self.columns.len() - 1
            }
        };
        super::column_ref(&[&partial_column(i)]).node.expect("a column reference")
    }

    /// A bare name that names a FROM item: its whole row.
    fn is_row_name(&self, c: &protobuf::ColumnRef) -> bool {
        matches!(column_ref_names(c).as_deref(), Some([name]) if self.row_names.iter().any(|r| r == name))
    }

    /// A column this rewrite already put in place.
    fn is_shipped_column(&self, n: &NodeEnum) -> bool {
        let NodeEnum::ColumnRef(c) = n else { return false };
        matches!(column_ref_names(c).as_deref(), Some([name]) if (0..self.columns.len()).any(|i| partial_column(i) == *name))
    }

    /// Whether the shards can compute `value` per row and it reads a
    /// column: no aggregate, window or subquery in it.
    fn row_level(&self, value: &NodeEnum) -> bool {
        let (mut reads, mut plain) = (false, true);
        let mut value = value.clone();
        visit_mut(&mut value, &mut |n| match n {
            NodeEnum::ColumnRef(c) => {
                reads = true;
                // A whole row is refused where the column references are.
                plain &= column_ref_names(c).is_some() && !self.is_row_name(c);
            }
            NodeEnum::SubLink(_) => plain = false,
            NodeEnum::FuncCall(c) => plain &= c.over.is_none() && !c.agg_star && !self.catalog.is_aggregate(function_name(c)),
            _ => {}
        });
        reads && plain
    }
}

fn function_name(call: &protobuf::FuncCall) -> &str {
    super::multi_shard::function_name(call).unwrap_or_default()
}

/// Whether the query aggregates, has no window, and each of its aggregates
/// gives the same value when an input row is repeated: DISTINCT ones, and
/// min, max and the boolean and bitwise AND/OR.
fn only_repeat_blind_aggregates(select: &SelectStmt, catalog: &Catalog) -> bool {
    let (mut aggregates, mut blind) = (0, true);
    let parts = select.target_list.iter().chain(select.having_clause.as_deref()).chain(&select.sort_clause);
    for part in parts {
        let Some(mut n) = part.node.clone() else { continue };
        visit_mut(&mut n, &mut |n| {
            let NodeEnum::FuncCall(call) = n else { return };
            let name = function_name(call);
            if call.over.is_some() {
                blind = false;
            } else if call.agg_star || catalog.is_aggregate(name) {
                aggregates += 1;
                let repeat_blind =
                    matches!(name, "min" | "max" | "bool_and" | "bool_or" | "every" | "bit_and" | "bit_or") && call.funcname.len() == 1;
                blind &= (call.agg_distinct && !call.agg_within_group) || repeat_blind;
            }
        });
    }
    blind && aggregates > 0
}

fn is_star(value: &Node) -> bool {
    matches!(value.node.as_ref(), Some(NodeEnum::ColumnRef(c)) if c.fields.iter().any(|f| matches!(f.node, Some(NodeEnum::AStar(_)))))
}

/// The names the FROM items go by (aliases, else relation names).
fn from_names(from: &[Node]) -> Vec<String> {
    let mut names = Vec::new();
    for item in from {
        let mut item = item.node.clone();
        let Some(item) = item.as_mut() else { continue };
        visit_mut(item, &mut |n| match n {
            NodeEnum::RangeVar(r) => names.push(r.alias.as_ref().map_or_else(|| r.relname.clone(), |a| a.aliasname.clone())),
            NodeEnum::RangeSubselect(s) => names.extend(s.alias.as_ref().map(|a| a.aliasname.clone())),
            NodeEnum::RangeFunction(f) => names.extend(f.alias.as_ref().map(|a| a.aliasname.clone())),
            NodeEnum::JoinExpr(j) => names.extend(j.alias.as_ref().map(|a| a.aliasname.clone())),
            _ => {}
        });
    }
    names
}
