//! Multi-shard pushdown: a query over co-located tables joined on their
//! distribution columns, not pinned to one shard group, runs once per shard
//! group. Without GROUP BY, aggregates, ORDER BY, LIMIT or DISTINCT the rows
//! are simply concatenated. Otherwise each shard computes what it can (partial
//! aggregates per group, its own top rows for ORDER BY … LIMIT, its distinct
//! rows) and the coordinator database finishes the query over those rows with
//! a combining statement, so that types, NULL handling and arithmetic are
//! exactly PostgreSQL's. Shapes this cannot split exactly go to the general
//! fallback instead.

use super::deparse::{deparse_expression, deparse_statement, BUILT_TREE_VERSION};
use super::expression_types::{FromTables, FLOAT4, FLOAT8, INT2, INT4};
use super::fallback::{self, FallbackPlan};
use super::percentiles;
use super::rewrite::ShardTemplate;
use super::shipped_columns;
use super::walk::visit_mut;
use super::{plain_select, res_target, string_node, Command, Plan};
use crate::metadata::{Catalog, DistributedTable};
use pg_query::protobuf::{self, a_const, Node, SelectStmt};
use pg_query::NodeEnum;
use std::fmt;
use std::sync::Arc;

/// How an aggregate's per-shard values become its value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AggregateKind {
    Count,
    Sum,
    /// An aggregate whose per-shard results combine by the same aggregate
    /// (`min`, `max`, `bool_and` for `every` too, `bool_or`, `bit_and`,
    /// `bit_or`, `bit_xor`), by that name.
    Reapplied(&'static str),
    /// Sum and count per shard; divided after the combine.
    Avg,
    /// The variance and standard deviation family, from per-shard `sum(x)`
    /// (which tells the input's type), `count(x)`, and the exact numeric
    /// `sum(x)` and `sum(x * x)`.
    Variance {
        sample: bool,
        root: bool,
    },
    /// The same over float input: per-shard `count(x)`, `sum(x)` and
    /// `var_pop(x)` in float8, combined as PostgreSQL combines the states of
    /// its parallel workers.
    FloatVariance {
        sample: bool,
        root: bool,
    },
    /// An aggregate of the `tdigest` or `hll` extension: each shard builds
    /// its sketch, and the combine merges them with `combine`, which reads
    /// the answer with the call's trailing constant arguments (`constants`,
    /// SQL text after a comma: a quantile, a trimming range) where it has any.
    Sketch {
        combine: &'static str,
        constants: String,
    },
}

/// One aggregate of the query: its kind and the worker columns holding its
/// per-shard values (two for avg: sum, then count).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SplitAggregate {
    pub kind: AggregateKind,
    pub columns: Vec<usize>,
}

/// The coordinator database's half of a split query. `sql` reads the worker
/// rows from `tessera_partials`, whose columns are `tessera_p_NNN` (and
/// `tessera_s_NNN` for the trailing `hidden` sort keys); `tessera_agg_NNN`
/// stands for the combined value of aggregate NNN and `tessera_visible_columns`
/// for every non-hidden worker column under the worker's own column name.
#[derive(Debug)]
pub struct CombineQuery {
    pub sql: String,
    pub aggregates: Vec<SplitAggregate>,
    pub hidden: usize,
    /// Run instead when the shards' results cannot be combined exactly (a
    /// type whose partial sums lose precision).
    pub fallback: Option<Arc<FallbackPlan>>,
    /// The column of the query's one distributed table that every aggregate
    /// reads DISTINCT, when it is not the table's distribution column: the
    /// shards send its distinct values per group, as many as the column has
    /// in each shard; with many, the rows move node to node by the column's
    /// hash instead and each node aggregates its own (`fallback`'s statement
    /// over them; executor/repartition.rs `by_distinct_column`).
    pub distinct_column: Option<String>,
    /// The `count(DISTINCT …)` calls HyperLogLogs would estimate when the
    /// session sets `citus.count_distinct_error_rate` (approximate_distinct.rs),
    /// as expression keys: the replan of `fallback`'s statement has them.
    pub approximable_counts: Vec<String>,
}

#[derive(Debug)]
pub enum Combine {
    /// Rows from every shard, in no particular order.
    Concatenate,
    /// The coordinator database finishes the query over the shards' rows.
    Query(CombineQuery),
    /// Exact percentiles in two passes (percentiles.rs); `shipped` finishes
    /// the query over the rows the plan's own template ships, when a pass
    /// finds the shards' rows changed between the two.
    Percentiles { passes: Box<PercentilePasses>, shipped: CombineQuery },
}

impl Combine {
    /// For EXPLAIN.
    pub fn describe(&self) -> String {
        match self {
            Combine::Concatenate => "concatenate".into(),
            Combine::Query(q) => q.sql.clone(),
            Combine::Percentiles { .. } => {
                "percentiles in two passes: each task's count and 65 quantiles per group, then its values within each group's bracket of the wanted ranks".into()
            }
        }
    }

    /// The combining statement over rows the plan's template ships.
    pub fn query(&self) -> Option<&CombineQuery> {
        match self {
            Combine::Concatenate => None,
            Combine::Query(q) | Combine::Percentiles { shipped: q, .. } => Some(q),
        }
    }
}

/// The statements of the two percentile passes, as templates over the
/// plan's tables.
#[derive(Debug)]
pub struct PercentilePasses {
    /// Every task's counts and quantiles per group.
    pub points: ShardTemplate,
    /// Reads the first pass's rows: each group's brackets.
    pub brackets: CombineQuery,
    /// Every task's values within the brackets, which replace
    /// `percentiles::BRACKETS_PLACEHOLDER`; joined on `=` of the group
    /// keys, or on arrays of them when a key is NULL.
    pub values_by_equal_keys: ShardTemplate,
    pub values_by_same_keys: ShardTemplate,
    /// Reads the second pass's rows: how many ranks missed their bracket.
    pub misses: CombineQuery,
    /// Reads the second pass's rows: the statement's result.
    pub finish: CombineQuery,
    /// The group keys lead the brackets' rows.
    pub group_keys: usize,
    /// Columns of a brackets row.
    pub bracket_columns: usize,
}

#[derive(Debug)]
pub struct MultiShardPlan {
    pub command: Command,
    pub anchor: Arc<DistributedTable>,
    pub template: ShardTemplate,
    pub combine: Combine,
}

impl MultiShardPlan {
    pub fn is_write(&self) -> bool {
        self.command != Command::Select
    }
}

impl fmt::Display for MultiShardPlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}, {} tasks, {}", self.command, self.anchor.shard_count(), self.combine.describe())
    }
}

/// An UPDATE or DELETE that runs on every shard group (its rows and RETURNING
/// output concatenated), in one distributed transaction.
pub(super) fn plan_modify(command: Command, anchor: Arc<DistributedTable>, template: ShardTemplate) -> Plan {
    Plan::MultiShard(Arc::new(MultiShardPlan { command, anchor, template, combine: Combine::Concatenate }))
}

/// Why a query cannot be split over the shards; the general fallback takes it.
pub(super) type Refusal = String;

/// The column references whose value a row takes from its shard group
/// (router.rs `shard_keys`): a GROUP BY or window PARTITION BY holding one
/// keeps each group, or partition, within one shard group.
#[derive(Default)]
pub(super) struct ShardKeys {
    /// `qualifier.column` pairs.
    pub qualified: Vec<(String, String)>,
    /// Columns an unqualified name of which is such a key.
    pub unqualified: Vec<String>,
}

impl ShardKeys {
    pub(super) fn is_key(&self, node: &Node) -> bool {
        let Some(NodeEnum::ColumnRef(c)) = node.node.as_ref() else { return false };
        match super::column_ref_names(c).as_deref() {
            Some([column]) => self.unqualified.iter().any(|u| u == column),
            Some([qualifier, column]) => self.qualified.iter().any(|(q, c)| q == qualifier && c == column),
            _ => false,
        }
    }
}

/// Plans a SELECT whose distributed tables form one co-located join group.
pub(super) fn plan_select(select: &SelectStmt, anchor: Arc<DistributedTable>, template: ShardTemplate, keys: &ShardKeys, catalog: &Catalog) -> Plan {
    let (template, combine) = match split(select, keys, catalog) {
        Err(refusal) => return super::not_supported(format!("cannot split over the shards: {refusal}")),
        Ok(None) => (template, Combine::Concatenate),
        Ok(Some((worker, sql, aggregates, hidden))) => {
            let reason = "the shards' rows cannot be combined exactly";
            let fallback = match fallback::plan(template.version(), &NodeEnum::SelectStmt(Box::new(select.clone())), catalog, reason) {
                Some(Plan::Fallback(f)) => Some(f),
                _ => None,
            };
            let passes = if aggregates.is_empty() { percentiles::plan(select, &worker, &sql, catalog) } else { None };
            let distinct_column = if aggregates.is_empty() { distinct_column(select, &anchor, keys, catalog) } else { None };
            let approximable_counts = if fallback.is_some() { super::approximate_distinct::approximable_counts(select, keys) } else { vec![] };
            let query = CombineQuery { sql, aggregates, hidden, fallback, distinct_column, approximable_counts };
            let combine = match passes {
                Some(passes) => Combine::Percentiles { passes: Box::new(percentile_passes(passes, &template)), shipped: query },
                None => Combine::Query(query),
            };
            (template.with_statement(worker), combine)
        }
    };
    Plan::MultiShard(Arc::new(MultiShardPlan { command: Command::Select, anchor, template, combine }))
}

/// The column of `anchor` the DISTINCT aggregates of `select` read (see
/// `CombineQuery::distinct_column`), when `select` reads `anchor` alone, all
/// its DISTINCT aggregates read that one column, and it is not a
/// distribution column.
fn distinct_column(select: &SelectStmt, anchor: &DistributedTable, keys: &ShardKeys, catalog: &Catalog) -> Option<String> {
    let [item] = &select.from_clause[..] else { return None };
    let Some(NodeEnum::RangeVar(rv)) = item.node.as_ref() else { return None };
    if super::resolve_range_var(rv, catalog).is_none_or(|t| t.oid != anchor.oid) {
        return None;
    }
    // Beside a DISTINCT aggregate of the key, which would no longer be one
    // after the move, moving gains nothing.
    let (value, _) = distinct_value(select, &ShardKeys::default(), catalog).ok()??;
    if keys.is_key(&value) {
        return None;
    }
    let Some(NodeEnum::ColumnRef(c)) = value.node.as_ref() else { return None };
    let column = super::column_ref_names(c)?.last()?.to_string();
    anchor.columns.contains(&column).then_some(column)
}

/// The passes' statements over the tables of `template`.
fn percentile_passes(statements: percentiles::PassStatements, template: &ShardTemplate) -> PercentilePasses {
    let over_rows =
        |sql: String| CombineQuery { sql, aggregates: vec![], hidden: 0, fallback: None, distinct_column: None, approximable_counts: vec![] };
    PercentilePasses {
        points: template.clone().with_statement(statements.points),
        brackets: over_rows(statements.brackets_sql),
        values_by_equal_keys: template.clone().with_statement(statements.values_by_equal_keys),
        values_by_same_keys: template.clone().with_statement(statements.values_by_same_keys),
        misses: over_rows(statements.misses_sql),
        finish: over_rows(statements.finish_sql),
        group_keys: statements.group_keys,
        bracket_columns: statements.bracket_columns,
    }
}

/// The worker statement, the combining SQL, its aggregates and hidden sort
/// columns; None when plain concatenation answers the query.
type Split = Option<(NodeEnum, String, Vec<SplitAggregate>, usize)>;

fn split(select: &SelectStmt, keys: &ShardKeys, catalog: &Catalog) -> Result<Split, Refusal> {
    if !select.locking_clause.is_empty() && (!select.sort_clause.is_empty() || select.limit_count.is_some()) {
        return Err("FOR UPDATE with ORDER BY or LIMIT across shards".into());
    }
    if select.into_clause.is_some() {
        return Err("SELECT INTO across shards".into());
    }
    if is_distinct_on(select) {
        return ship_columns(select, catalog, "DISTINCT ON across shards");
    }
    let (aggregate, window) = calls_in(select, catalog);
    let window = window || !select.window_clause.is_empty();
    let aggregated = !select.group_clause.is_empty() || select.having_clause.is_some() || aggregate;
    // Groups, and window partitions, that a shard group holds whole are
    // computed there as the query says; only ordering, limits and DISTINCT
    // across shard groups remain.
    let groups_whole = !aggregated || grouped_by_key(select, keys);
    if window && !(groups_whole && windows_by_key(select, keys)) {
        return ship_columns(select, catalog, "window functions across shards");
    }
    if (window || aggregated) && groups_whole {
        return if !select.sort_clause.is_empty()
            || select.limit_count.is_some()
            || select.limit_offset.is_some()
            || !select.distinct_clause.is_empty()
        {
            split_rows(select).map(Some)
        } else {
            Ok(None)
        };
    }
    if aggregated {
        match split_aggregation(select, keys, catalog) {
            Ok(split) => Ok(Some(split)),
            Err(refusal) => ship_columns(select, catalog, &refusal),
        }
    } else if !select.sort_clause.is_empty() || select.limit_count.is_some() || select.limit_offset.is_some() || !select.distinct_clause.is_empty() {
        split_rows(select).map(Some)
    } else {
        Ok(None)
    }
}

/// The split that ships the columns the query reads (shipped_columns.rs),
/// for a query the partial forms cannot take; refused with `refusal` (why
/// they cannot) when that split cannot take it either.
fn ship_columns(select: &SelectStmt, catalog: &Catalog, refusal: &str) -> Result<Split, Refusal> {
    match shipped_columns::split(select, catalog) {
        Ok((worker, sql)) => Ok(Some((worker, sql, vec![], 0))),
        Err(also) => Err(format!("{refusal} ({also})")),
    }
}

/// Whether the GROUP BY has a distribution column (plainly, not in a
/// grouping set), so that no group spans shard groups.
pub(super) fn grouped_by_key(select: &SelectStmt, keys: &ShardKeys) -> bool {
    select.group_clause.iter().any(|g| match position(g) {
        Some(p) => select.target_list.get(p - 1).and_then(target_value).is_some_and(|v| keys.is_key(v)),
        None => keys.is_key(g),
    })
}

/// Whether every window of the query partitions by a distribution column,
/// so that each partition lies in one shard group. A window naming another
/// (`OVER (w ORDER BY …)`) takes that one's partitioning.
pub(super) fn windows_by_key(select: &SelectStmt, keys: &ShardKeys) -> bool {
    let named: Vec<&protobuf::WindowDef> = select
        .window_clause
        .iter()
        .filter_map(|w| match w.node.as_ref() {
            Some(NodeEnum::WindowDef(w)) => Some(w.as_ref()),
            _ => None,
        })
        .collect();
    let partitioned = |w: &protobuf::WindowDef| {
        let own = w.partition_clause.iter().any(|p| keys.is_key(p));
        let inherited =
            !w.refname.is_empty() && named.iter().find(|n| n.name == w.refname).is_some_and(|n| n.partition_clause.iter().any(|p| keys.is_key(p)));
        own || inherited
    };
    let mut all = named.iter().all(|w| partitioned(w));
    for node in select.target_list.iter().chain(&select.sort_clause) {
        if let Some(mut n) = node.node.clone() {
            visit_mut(&mut n, &mut |n| {
                if let NodeEnum::FuncCall(call) = n {
                    if let Some(over) = call.over.as_deref() {
                        let by_name = over.partition_clause.is_empty() && over.refname.is_empty() && !over.name.is_empty();
                        all &= if by_name { named.iter().find(|w| w.name == over.name).is_some_and(|w| partitioned(w)) } else { partitioned(over) };
                    }
                }
            });
        }
    }
    all
}

fn is_distinct_on(select: &SelectStmt) -> bool {
    !select.distinct_clause.is_empty() && select.distinct_clause.iter().any(|n| n.node.is_some())
}

/// Whether the output or ORDER BY calls an aggregate, and a window function.
pub(super) fn calls_in(select: &SelectStmt, catalog: &Catalog) -> (bool, bool) {
    let (mut aggregate, mut window) = (false, false);
    let mut check = |n: &mut NodeEnum| {
        if let NodeEnum::FuncCall(call) = n {
            window |= call.over.is_some();
            aggregate |= call.over.is_none() && (call.agg_star || catalog.is_aggregate(function_name(call).unwrap_or_default()));
        }
    };
    for node in select.target_list.iter().chain(&select.sort_clause) {
        if let Some(n) = node.node.clone().as_mut() {
            visit_mut(n, &mut check);
        }
    }
    (aggregate, window)
}

pub(super) fn function_name(call: &protobuf::FuncCall) -> Option<&str> {
    match call.funcname.last()?.node.as_ref()? {
        NodeEnum::String(s) => Some(&s.sval),
        _ => None,
    }
}

fn column_ref(name: &str) -> Node {
    super::column_ref(&[name])
}

/// The relation the combining statement reads the shards' rows from.
pub const PARTIALS_RELATION: &str = "tessera_partials";
/// Stands for every non-hidden worker column under the worker's column name.
pub const VISIBLE_COLUMNS: &str = "tessera_visible_columns";

/// Column `i` of the shards' rows, as the combining statement names it.
pub fn partial_column(i: usize) -> String {
    format!("tessera_p_{i:03}")
}

/// Hidden sort key `i`, after the worker's own columns.
pub fn sort_column(i: usize) -> String {
    format!("tessera_s_{i:03}")
}

/// Where the combined value of aggregate `j` goes in the combining statement.
pub fn aggregate_placeholder(j: usize) -> String {
    format!("tessera_agg_{j:03}")
}

/// An expression's text, to tell equal expressions apart from different ones.
pub(super) fn expression_key(node: &NodeEnum) -> Option<String> {
    deparse_expression(node).ok()
}

fn is_expression(node: &NodeEnum) -> bool {
    use NodeEnum::*;
    matches!(
        node,
        ColumnRef(_)
            | FuncCall(_)
            | AExpr(_)
            | TypeCast(_)
            | CaseExpr(_)
            | CoalesceExpr(_)
            | MinMaxExpr(_)
            | BoolExpr(_)
            | NullTest(_)
            | BooleanTest(_)
            | AIndirection(_)
            | CollateClause(_)
            | RowExpr(_)
            | AArrayExpr(_)
            | SqlvalueFunction(_)
    )
}

/// The integer of `ORDER BY 2` / `GROUP BY 2`.
pub(super) fn position(node: &Node) -> Option<usize> {
    match node.node.as_ref()? {
        NodeEnum::AConst(c) => match c.val.as_ref()? {
            a_const::Val::Ival(i) if i.ival > 0 => Some(i.ival as usize),
            _ => None,
        },
        _ => None,
    }
}

/// A bare name in ORDER BY that names an output column.
pub(super) fn output_alias(node: &Node, targets: &[Node]) -> Option<usize> {
    let NodeEnum::ColumnRef(c) = node.node.as_ref()? else { return None };
    let [field] = c.fields.as_slice() else { return None };
    let NodeEnum::String(name) = field.node.as_ref()? else { return None };
    targets.iter().position(|t| matches!(t.node.as_ref(), Some(NodeEnum::ResTarget(r)) if r.name == name.sval))
}

/// A bare name in ORDER BY that names one output column, by its alias or by
/// the name PostgreSQL gives an unnamed one (`o.user_id` is `user_id`):
/// PostgreSQL looks ORDER BY names up among the output columns before the
/// input columns. None when no column, or several, go by the name.
pub(super) fn sort_output(node: &Node, targets: &[Node]) -> Option<usize> {
    let NodeEnum::ColumnRef(c) = node.node.as_ref()? else { return None };
    let [field] = c.fields.as_slice() else { return None };
    let NodeEnum::String(name) = field.node.as_ref()? else { return None };
    let named = |t: &Node| match t.node.as_ref() {
        Some(NodeEnum::ResTarget(r)) if !r.name.is_empty() => r.name == name.sval,
        Some(NodeEnum::ResTarget(r)) => !is_star(t) && r.val.as_deref().and_then(output_name).is_some_and(|n| n == name.sval),
        _ => false,
    };
    let mut matching = targets.iter().enumerate().filter(|(_, t)| named(t)).map(|(i, _)| i);
    match (matching.next(), matching.next()) {
        (Some(i), None) => Some(i),
        _ => None,
    }
}

pub(super) fn target_value(t: &Node) -> Option<&Node> {
    match t.node.as_ref()? {
        NodeEnum::ResTarget(r) => r.val.as_deref(),
        _ => None,
    }
}

fn is_star(t: &Node) -> bool {
    matches!(target_value(t).and_then(|v| v.node.as_ref()), Some(NodeEnum::ColumnRef(c)) if c.fields.iter().any(|f| matches!(f.node, Some(NodeEnum::AStar(_)))))
}

/// `tessera_partials` as a FROM item.
pub(super) fn partials_relation() -> Node {
    relation_named(PARTIALS_RELATION)
}

/// The relation `name` (unqualified) as a FROM item.
pub(super) fn relation_named(name: &str) -> Node {
    Node {
        node: Some(NodeEnum::RangeVar(protobuf::RangeVar {
            relname: name.into(),
            inh: true,
            relpersistence: "p".into(),
            location: -1,
            ..Default::default()
        })),
    }
}

/// Builds the combining statement: `targets` over `tessera_partials`.
fn combine_statement(
    select: &SelectStmt,
    target_list: Vec<Node>,
    group_clause: Vec<Node>,
    having: Option<Box<Node>>,
    sort_clause: Vec<Node>,
) -> Result<String, Refusal> {
    let combine = SelectStmt {
        distinct_clause: select.distinct_clause.clone(),
        target_list,
        from_clause: vec![partials_relation()],
        group_clause,
        having_clause: having,
        sort_clause,
        limit_count: select.limit_count.clone(),
        limit_offset: select.limit_offset.clone(),
        limit_option: select.limit_option,
        ..plain_select()
    };
    deparse_statement(BUILT_TREE_VERSION, NodeEnum::SelectStmt(Box::new(combine))).map_err(|e| e.message().to_string())
}

// ---------------------------------------------------------------- rows

/// ORDER BY / LIMIT / OFFSET / DISTINCT without aggregation: each shard sends
/// its distinct rows, or its first LIMIT + OFFSET rows in order; the combine
/// sorts, de-duplicates and cuts again.
fn split_rows(select: &SelectStmt) -> Result<(NodeEnum, String, Vec<SplitAggregate>, usize), Refusal> {
    let star_seen_before = |i: usize| select.target_list[..i.min(select.target_list.len())].iter().any(is_star);
    let mut worker = select.clone();
    let mut combine_sorts = Vec::new();
    let mut hidden = 0;
    for sort in &select.sort_clause {
        let Some(NodeEnum::SortBy(by)) = sort.node.as_ref() else { return Err("unusual ORDER BY".into()) };
        let key = by.node.as_deref().ok_or("empty ORDER BY")?;
        let output = position(key).map(|p| p - 1).or_else(|| sort_output(key, &select.target_list)).or_else(|| {
            // With DISTINCT, ORDER BY must name output columns; find the one it equals.
            let wanted = key.node.as_ref().and_then(expression_key);
            (!select.distinct_clause.is_empty())
                .then(|| {
                    select
                        .target_list
                        .iter()
                        .position(|t| target_value(t).and_then(|v| v.node.as_ref()).and_then(expression_key) == wanted && wanted.is_some())
                })
                .flatten()
        });
        let column = match output {
            Some(i) if star_seen_before(i) => return Err("ORDER BY an output column after * across shards".into()),
            Some(i) => Node {
                node: Some(NodeEnum::AConst(protobuf::AConst {
                    isnull: false,
                    location: -1,
                    val: Some(a_const::Val::Ival(protobuf::Integer { ival: i as i32 + 1 })),
                })),
            },
            None if !select.distinct_clause.is_empty() => return Err("DISTINCT with ORDER BY on other expressions".into()),
            None => {
                let name = sort_column(hidden);
                worker.target_list.push(res_target(&name, key.clone()));
                hidden += 1;
                column_ref(&name)
            }
        };
        let mut by = by.as_ref().clone();
        by.node = Some(Box::new(column));
        combine_sorts.push(Node { node: Some(NodeEnum::SortBy(Box::new(by))) });
    }
    // Each shard's first LIMIT + OFFSET rows contain every row the query can return.
    worker.limit_offset = None;
    worker.limit_count = match (&select.limit_count, &select.limit_offset) {
        (Some(count), Some(offset)) => Some(Box::new(plus(count, offset))),
        (count, _) => count.clone(),
    };
    if worker.limit_count.is_none() {
        worker.sort_clause.clear();
    }
    let targets = vec![res_target("", column_ref(VISIBLE_COLUMNS))];
    let sql = combine_statement(select, targets, vec![], None, combine_sorts)?;
    Ok((NodeEnum::SelectStmt(Box::new(worker)), sql, vec![], hidden))
}

fn product(a: &Node, b: &Node) -> Node {
    operation("*", a, b)
}

fn plus(a: &Node, b: &Node) -> Node {
    operation("+", a, b)
}

fn operation(operator: &str, a: &Node, b: &Node) -> Node {
    Node {
        node: Some(NodeEnum::AExpr(Box::new(protobuf::AExpr {
            kind: protobuf::AExprKind::AexprOp as i32,
            name: vec![string_node(operator)],
            lexpr: Some(Box::new(a.clone())),
            rexpr: Some(Box::new(b.clone())),
            location: -1,
        }))),
    }
}

// ---------------------------------------------------------------- aggregation

struct Aggregation<'c> {
    catalog: &'c Catalog,
    /// The distribution columns: a DISTINCT aggregate of one has disjoint
    /// values in each shard group (`disjoint_distinct`).
    keys: &'c ShardKeys,
    /// The query's tables, for the types of aggregate arguments.
    from: FromTables,
    /// GROUP BY expressions (worker columns 0..n) and their keys.
    groups: Vec<(Node, Option<String>)>,
    /// Per-shard aggregate calls, as worker columns after the groups.
    partials: Vec<Node>,
    aggregates: Vec<SplitAggregate>,
    /// Keys of aggregates seen, to compute each once.
    aggregate_keys: Vec<String>,
    /// The one argument of the query's DISTINCT aggregates, with its key:
    /// the shards group by it too (after the GROUP BY expressions), so each
    /// sends every distinct value of its groups once, and the combine
    /// computes the DISTINCT aggregates over those values.
    distinct_value: Option<(Node, String)>,
}

/// GROUP BY and aggregates: the shards group and aggregate their rows; the
/// combine groups again and combines each aggregate's per-shard values, then
/// applies HAVING, DISTINCT, ORDER BY and LIMIT.
fn split_aggregation(select: &SelectStmt, keys: &ShardKeys, catalog: &Catalog) -> Result<(NodeEnum, String, Vec<SplitAggregate>, usize), Refusal> {
    // The shards' partial values of a DISTINCT aggregate of a key add up
    // only over groups that hold each key's rows whole: not where a grouping
    // set joins finer groups, nor where the shards also group by another
    // DISTINCT aggregate's value.
    let no_keys = ShardKeys::default();
    let grouping_sets = select.group_clause.iter().any(|g| matches!(g.node, Some(NodeEnum::GroupingSet(_))));
    let apart = if grouping_sets { None } else { Some(distinct_value(select, keys, catalog)?) };
    let (keys, distinct_value) = match apart {
        Some(None) => (keys, None),
        _ => (&no_keys, distinct_value(select, &no_keys, catalog)?),
    };
    let mut agg = Aggregation {
        catalog,
        keys,
        from: FromTables::of(select, catalog),
        groups: vec![],
        partials: vec![],
        aggregates: vec![],
        aggregate_keys: vec![],
        distinct_value,
    };
    for g in &select.group_clause {
        if let Some(NodeEnum::GroupingSet(set)) = g.node.as_ref() {
            // The shards group by every expression of every set; the
            // combine forms the sets from those finest groups.
            for expr in grouping_set_expressions(set)? {
                let key = expr.node.as_ref().and_then(expression_key);
                if key.is_none() || !agg.groups.iter().any(|(_, k)| *k == key) {
                    agg.groups.push((expr, key));
                }
            }
            continue;
        }
        let expr = match position(g) {
            Some(p) => target_value(select.target_list.get(p - 1).ok_or("GROUP BY position out of range")?).ok_or("GROUP BY a star")?.clone(),
            None => {
                if output_alias(g, &select.target_list).is_some() {
                    return Err("GROUP BY an output column name".into());
                }
                g.clone()
            }
        };
        let key = expr.node.as_ref().and_then(expression_key);
        agg.groups.push((expr, key));
    }
    let mut targets = Vec::new();
    for t in &select.target_list {
        let Some(NodeEnum::ResTarget(r)) = t.node.as_ref() else { return Err("unusual target".into()) };
        if is_star(t) {
            return Err("* with aggregates".into());
        }
        let mut val = r.val.as_deref().ok_or("empty target")?.clone();
        let name = if r.name.is_empty() { output_name(&val).ok_or("an output column whose name is hard to tell")? } else { r.name.clone() };
        agg.rewrite(&mut val)?;
        targets.push(res_target(&name, val));
    }
    let having = match select.having_clause.as_deref() {
        Some(h) => {
            let mut h = h.clone();
            agg.rewrite(&mut h)?;
            Some(Box::new(h))
        }
        None => None,
    };
    let mut sorts = Vec::new();
    for sort in &select.sort_clause {
        let Some(NodeEnum::SortBy(by)) = sort.node.as_ref() else { return Err("unusual ORDER BY".into()) };
        let mut by = by.as_ref().clone();
        let key = by.node.as_deref_mut().ok_or("empty ORDER BY")?;
        if position(key).is_none() && sort_output(key, &select.target_list).is_none() {
            agg.rewrite(key)?;
        }
        sorts.push(Node { node: Some(NodeEnum::SortBy(Box::new(by))) });
    }
    let group_columns: Vec<Node> = if select.group_clause.iter().any(|g| matches!(g.node, Some(NodeEnum::GroupingSet(_)))) {
        let mut sets = select.group_clause.clone();
        for set in &mut sets {
            if position(set).is_some() {
                return Err("GROUP BY a position beside grouping sets".into());
            }
            agg.rewrite(set)?;
        }
        sets
    } else {
        (0..agg.groups.len()).map(|i| column_ref(&partial_column(i))).collect()
    };
    let sql = combine_statement(select, targets, group_columns, having, sorts)?;
    // The worker groups by the same expressions (and the DISTINCT
    // aggregates' value) and computes the partials.
    let worker_groups: Vec<Node> = agg.groups.iter().map(|(g, _)| g.clone()).chain(agg.distinct_value.iter().map(|(v, _)| v.clone())).collect();
    let mut worker_targets: Vec<Node> = worker_groups.iter().enumerate().map(|(i, g)| res_target(&partial_column(i), g.clone())).collect();
    let offset = worker_targets.len();
    worker_targets.extend(agg.partials.iter().enumerate().map(|(i, p)| res_target(&partial_column(offset + i), p.clone())));
    let worker = SelectStmt {
        target_list: worker_targets,
        from_clause: select.from_clause.clone(),
        where_clause: select.where_clause.clone(),
        group_clause: worker_groups,
        with_clause: select.with_clause.clone(),
        ..plain_select()
    };
    let aggregates =
        agg.aggregates.into_iter().map(|a| SplitAggregate { kind: a.kind, columns: a.columns.into_iter().map(|c| c + offset).collect() }).collect();
    Ok((NodeEnum::SelectStmt(Box::new(worker)), sql, aggregates, 0))
}

impl Aggregation<'_> {
    /// Rewrites an expression over the query's rows into one over the partial
    /// rows: GROUP BY expressions become their columns, aggregates their
    /// combined values. Anything else reading the rows cannot be combined.
    fn rewrite(&mut self, node: &mut Node) -> Result<(), Refusal> {
        let mut refusal = None;
        if let Some(n) = node.node.as_mut() {
            visit_mut(n, &mut |n| {
                if refusal.is_some() {
                    return;
                }
                match self.replace(n) {
                    Ok(Some(replacement)) => *n = replacement,
                    Ok(None) => {}
                    Err(e) => refusal = Some(e),
                }
            });
        }
        refusal.map_or(Ok(()), Err)
    }

    fn replace(&mut self, n: &NodeEnum) -> Result<Option<NodeEnum>, Refusal> {
        if is_expression(n) && !self.groups.is_empty() {
            if let Some(key) = expression_key(n) {
                if let Some(i) = self.groups.iter().position(|(_, k)| k.as_deref() == Some(key.as_str())) {
                    return Ok(column_ref(&partial_column(i)).node);
                }
            }
        }
        match n {
            NodeEnum::FuncCall(call) if call.over.is_some() => Err("window functions across shards".into()),
            NodeEnum::FuncCall(call) if call.agg_distinct && !disjoint_distinct(call, self.keys) => self.distinct_over_values(call).map(Some),
            NodeEnum::FuncCall(call) if call.agg_star || self.catalog.is_aggregate(function_name(call).unwrap_or_default()) => {
                let j = self.aggregate(call)?;
                Ok(column_ref(&aggregate_placeholder(j)).node)
            }
            // A DISTINCT aggregate's rewritten call reads the shards' values.
            NodeEnum::ColumnRef(c)
                if self.distinct_value.is_some()
                    && super::column_ref_names(c).as_deref() == Some(&[partial_column(self.groups.len()).as_str()][..]) =>
            {
                Ok(None)
            }
            NodeEnum::ColumnRef(_) => Err("a column outside GROUP BY and aggregates".into()),
            NodeEnum::SubLink(_) => Err("a subquery over the grouped rows".into()),
            _ => Ok(None),
        }
    }

    /// A DISTINCT aggregate as the combine computes it: over the distinct
    /// values the shards sent, in the column after the GROUP BY columns.
    fn distinct_over_values(&self, call: &protobuf::FuncCall) -> Result<NodeEnum, Refusal> {
        let Some((_, key)) = &self.distinct_value else { return Err("DISTINCT aggregates across shards".into()) };
        let column = column_ref(&partial_column(self.groups.len()));
        let mut combined = call.clone();
        for arg in combined.args.iter_mut().chain(combined.agg_order.iter_mut().filter_map(|o| match o.node.as_mut() {
            Some(NodeEnum::SortBy(by)) => by.node.as_deref_mut(),
            _ => None,
        })) {
            if arg.node.as_ref().and_then(expression_key).as_deref() == Some(key.as_str()) {
                *arg = column.clone();
            }
        }
        Ok(NodeEnum::FuncCall(Box::new(combined)))
    }

    /// The index of the aggregate `call` in the plan, adding it if new.
    fn aggregate(&mut self, call: &protobuf::FuncCall) -> Result<usize, Refusal> {
        let key = expression_key(&NodeEnum::FuncCall(Box::new(call.clone()))).ok_or("an aggregate that cannot be printed")?;
        if let Some(j) = self.aggregate_keys.iter().position(|k| *k == key) {
            return Ok(j);
        }
        if (call.agg_distinct && !disjoint_distinct(call, self.keys))
            || !call.agg_order.is_empty()
            || call.agg_within_group
            || call.func_variadic
            || call.funcname.len() > 1
        {
            return Err(format!("{key} across shards"));
        }
        let mut nested = false;
        for arg in call.args.iter().chain(call.agg_filter.as_deref()) {
            if let Some(mut a) = arg.node.clone() {
                visit_mut(&mut a, &mut |n| {
                    nested |= matches!(n, NodeEnum::SubLink(_))
                        || matches!(n, NodeEnum::FuncCall(c) if c.agg_star || c.over.is_some() || self.catalog.is_aggregate(function_name(c).unwrap_or_default()));
                });
            }
        }
        if nested {
            return Err(format!("{key} across shards"));
        }
        if let Some((kind, partial)) = sketch(call, &key)? {
            self.partials.push(partial);
            self.aggregates.push(SplitAggregate { kind, columns: vec![self.partials.len() - 1] });
            self.aggregate_keys.push(key);
            return Ok(self.aggregates.len() - 1);
        }
        let kind = match (function_name(call).unwrap_or_default(), call.args.len()) {
            ("count", 0 | 1) => AggregateKind::Count,
            ("sum", 1) => AggregateKind::Sum,
            ("min", 1) => AggregateKind::Reapplied("min"),
            ("max", 1) => AggregateKind::Reapplied("max"),
            ("avg", 1) => AggregateKind::Avg,
            ("bool_and" | "every", 1) => AggregateKind::Reapplied("bool_and"),
            ("bool_or", 1) => AggregateKind::Reapplied("bool_or"),
            ("bit_and", 1) => AggregateKind::Reapplied("bit_and"),
            ("bit_or", 1) => AggregateKind::Reapplied("bit_or"),
            ("bit_xor", 1) => AggregateKind::Reapplied("bit_xor"),
            ("var_samp" | "variance", 1) => AggregateKind::Variance { sample: true, root: false },
            ("var_pop", 1) => AggregateKind::Variance { sample: false, root: false },
            ("stddev_samp" | "stddev", 1) => AggregateKind::Variance { sample: true, root: true },
            ("stddev_pop", 1) => AggregateKind::Variance { sample: false, root: true },
            _ => return Err(format!("{key} across shards")),
        };
        let input = match kind {
            AggregateKind::Variance { .. } => self.from.type_of(&call.args[0]),
            _ => None,
        };
        let kind = match (kind, input) {
            (AggregateKind::Variance { sample, root }, Some(FLOAT4 | FLOAT8)) => AggregateKind::FloatVariance { sample, root },
            (kind, _) => kind,
        };
        let renamed = |name: &str| {
            let mut c = call.clone();
            c.funcname = vec![string_node(name)];
            Node { node: Some(NodeEnum::FuncCall(Box::new(c))) }
        };
        let first = self.partials.len();
        match kind {
            AggregateKind::Avg => {
                self.partials.push(renamed("sum"));
                self.partials.push(renamed("count"));
            }
            AggregateKind::Reapplied(name) => self.partials.push(renamed(name)),
            AggregateKind::Variance { .. } => {
                // Squares of int2 and int4 fit int8, whose sums PostgreSQL
                // keeps exactly in 128 bits: far faster than numeric.
                let wide = if matches!(input, Some(INT2 | INT4)) { "int8" } else { "numeric" };
                let exact = |square: bool| {
                    let value = super::cast_to_catalog_type(call.args[0].clone(), wide);
                    let value = if square { product(&value, &value) } else { value };
                    let mut c = call.clone();
                    c.funcname = vec![string_node("sum")];
                    c.args = vec![value];
                    Node { node: Some(NodeEnum::FuncCall(Box::new(c))) }
                };
                self.partials.extend([renamed("sum"), renamed("count"), exact(false), exact(true)]);
            }
            AggregateKind::FloatVariance { .. } => {
                // float4 is summed in float8, as PostgreSQL's float4 variances accumulate.
                let mut in_float8 = call.clone();
                if input == Some(FLOAT4) {
                    in_float8.args = vec![super::cast_to_catalog_type(call.args[0].clone(), "float8")];
                }
                self.partials.push(renamed("count"));
                for name in ["sum", "var_pop"] {
                    let mut c = in_float8.clone();
                    c.funcname = vec![string_node(name)];
                    self.partials.push(Node { node: Some(NodeEnum::FuncCall(Box::new(c))) });
                }
            }
            _ => self.partials.push(Node { node: Some(NodeEnum::FuncCall(Box::new(call.clone()))) }),
        }
        self.aggregates.push(SplitAggregate { kind, columns: (first..self.partials.len()).collect() });
        self.aggregate_keys.push(key);
        Ok(self.aggregates.len() - 1)
    }
}

/// An aggregate of the `tdigest` or `hll` extension as the sketch each shard
/// builds and the kind that combines the sketches, None for other
/// aggregates. Digests and HyperLogLogs merge (`tdigest(tdigest)`,
/// `hll_union_agg`), so the combine reads its answer from the merge of the
/// shards' sketches with the call's trailing arguments: a HyperLogLog's
/// cardinality is the one of all rows, a digest's percentiles are as
/// approximate as one digest's (they differ from a single node's in the
/// last digits, as Citus's do).
fn sketch(call: &protobuf::FuncCall, key: &str) -> Result<Option<(AggregateKind, Node)>, Refusal> {
    // (the shard's aggregate, the combine's, how many trailing arguments the combine takes)
    let (builder, combine, trailing) = match function_name(call).unwrap_or_default() {
        "tdigest" => ("tdigest", "tdigest", 0),
        "tdigest_percentile" => ("tdigest", "tdigest_percentile", 1),
        "tdigest_percentile_of" => ("tdigest", "tdigest_percentile_of", 1),
        "tdigest_avg" => ("tdigest", "tdigest_avg", 2),
        "tdigest_sum" => ("tdigest", "tdigest_sum", 2),
        "hll_add_agg" => ("hll_add_agg", "hll_union_agg", 0),
        "hll_union_agg" => ("hll_union_agg", "hll_union_agg", 0),
        _ => return Ok(None),
    };
    let Some(built) = call.args.len().checked_sub(trailing).filter(|n| *n > 0) else { return Err(format!("{key} across shards")) };
    let mut constants = String::new();
    for arg in &call.args[built..] {
        let Some(mut value) = arg.node.clone() else { return Err(format!("{key} across shards")) };
        let mut reads_rows = false;
        visit_mut(&mut value, &mut |n| {
            reads_rows |= matches!(n, NodeEnum::ColumnRef(_) | NodeEnum::SubLink(_) | NodeEnum::ParamRef(_) | NodeEnum::FuncCall(_))
        });
        if reads_rows {
            return Err(format!("{key} across shards with an argument that is not a constant"));
        }
        let text = super::deparse::deparse_expression(&value).map_err(|_| format!("{key} across shards"))?;
        constants.push_str(&format!(", {text}"));
    }
    let mut partial = call.clone();
    partial.funcname = vec![string_node(builder)];
    partial.args.truncate(built);
    Ok(Some((AggregateKind::Sketch { combine, constants }, Node { node: Some(NodeEnum::FuncCall(Box::new(partial))) })))
}

/// The expressions a grouping set groups by, nested sets and the
/// parenthesised lists of ROLLUP, CUBE and GROUPING SETS opened.
pub(super) fn grouping_set_expressions(set: &protobuf::GroupingSet) -> Result<Vec<Node>, Refusal> {
    let mut expressions = Vec::new();
    for item in &set.content {
        match item.node.as_ref() {
            Some(NodeEnum::GroupingSet(inner)) => expressions.extend(grouping_set_expressions(inner)?),
            Some(NodeEnum::RowExpr(row)) if row.row_format == protobuf::CoercionForm::CoerceImplicitCast as i32 => {
                expressions.extend(row.args.iter().cloned())
            }
            Some(NodeEnum::AConst(_)) => return Err("a position in a grouping set".into()),
            Some(_) => expressions.push(item.clone()),
            None => {}
        }
    }
    Ok(expressions)
}

/// Whether `call` is a DISTINCT aggregate that each shard group can compute
/// over its own rows and the combine can sum up like its plain form:
/// `count`, `sum`, `avg`, `min` or `max` of DISTINCT values of a
/// distribution column. A value of that column lives in one shard group
/// only, so the groups' distinct values are disjoint and no value has to
/// travel (`count(DISTINCT key)` over 5 M rows: 2.3 s shipping every key,
/// as fast as `count(key)` instead).
pub(super) fn disjoint_distinct(call: &protobuf::FuncCall, keys: &ShardKeys) -> bool {
    call.agg_distinct
        && call.agg_order.is_empty()
        && call.funcname.len() == 1
        && matches!(function_name(call), Some("count" | "sum" | "avg" | "min" | "max"))
        && matches!(&call.args[..], [value] if keys.is_key(value))
}

/// The one value every DISTINCT aggregate of the query aggregates (its
/// first argument; the others, such as string_agg's delimiter, constants),
/// with its key; None when there are no DISTINCT aggregates. Refused when
/// they aggregate different values, or filter rows (FILTER reads the rows
/// the combine no longer has).
fn distinct_value(select: &SelectStmt, keys: &ShardKeys, catalog: &Catalog) -> Result<Option<(Node, String)>, Refusal> {
    let mut value: Option<(Node, String)> = None;
    let mut refusal = None;
    let sources = select.target_list.iter().chain(select.having_clause.as_deref()).chain(&select.sort_clause);
    for node in sources {
        let Some(mut n) = node.node.clone() else { continue };
        visit_mut(&mut n, &mut |n| {
            let NodeEnum::FuncCall(call) = n else { return };
            if !call.agg_distinct || disjoint_distinct(call, keys) || refusal.is_some() {
                return;
            }
            let constant = |a: &Node| matches!(a.node.as_ref(), Some(NodeEnum::AConst(_) | NodeEnum::TypeCast(_)));
            let first = call.args.first().filter(|_| call.args[1..].iter().all(constant) && call.agg_filter.is_none() && !call.agg_within_group);
            let first = first.filter(|a| {
                let mut plain = true;
                if let Some(mut a) = a.node.clone() {
                    visit_mut(&mut a, &mut |n| plain &= !matches!(n, NodeEnum::SubLink(_)) && !matches!(n, NodeEnum::FuncCall(c) if c.agg_star || c.over.is_some() || catalog.is_aggregate(function_name(c).unwrap_or_default())));
                }
                plain
            });
            match (first.and_then(|a| Some((a.clone(), a.node.as_ref().and_then(expression_key)?))), &value) {
                (Some((arg, key)), None) => value = Some((arg, key)),
                (Some((_, key)), Some((_, seen))) if key == *seen => {}
                _ => refusal = Some("DISTINCT aggregates of different values, or with FILTER, across shards".to_string()),
            }
        });
    }
    refusal.map_or(Ok(value), Err)
}

/// The column name PostgreSQL gives an unnamed output expression (its
/// FigureColname), when it is one of the common cases.
fn output_name(node: &Node) -> Option<String> {
    name_strength(node.node.as_ref()?).0
}

/// A name and how strongly the expression suggests it (2: a column or function
/// name; 1: a fallback such as "case"; 0: none).
pub(super) fn name_strength(node: &NodeEnum) -> (Option<String>, u8) {
    let last_string = |nodes: &[Node]| {
        nodes.iter().rev().find_map(|n| match n.node.as_ref() {
            Some(NodeEnum::String(s)) => Some(s.sval.clone()),
            _ => None,
        })
    };
    match node {
        NodeEnum::ColumnRef(c) => match c.fields.last().and_then(|f| f.node.as_ref()) {
            Some(NodeEnum::String(s)) => (Some(s.sval.clone()), 2),
            _ => (None, 0),
        },
        NodeEnum::FuncCall(c) => (last_string(&c.funcname), 2),
        NodeEnum::TypeCast(t) => match t.arg.as_deref().and_then(|a| a.node.as_ref()).map(name_strength) {
            Some((name, 2)) => (name, 2),
            _ => (t.type_name.as_ref().and_then(|tn| last_string(&tn.names)), 1),
        },
        NodeEnum::CollateClause(c) => c.arg.as_deref().and_then(|a| a.node.as_ref()).map(name_strength).unwrap_or((None, 0)),
        NodeEnum::CaseExpr(c) => match c.defresult.as_deref().and_then(|d| d.node.as_ref()).map(name_strength) {
            Some((name, 2)) => (name, 2),
            _ => (Some("case".into()), 1),
        },
        NodeEnum::CoalesceExpr(_) => (Some("coalesce".into()), 2),
        NodeEnum::GroupingFunc(_) => (Some("grouping".into()), 2),
        // A scalar subquery is named as its one output column.
        NodeEnum::SubLink(link) if link.sub_link_type == protobuf::SubLinkType::ExprSublink as i32 => {
            let target = match link.subselect.as_deref().and_then(|s| s.node.as_ref()) {
                Some(NodeEnum::SelectStmt(query)) => query.target_list.first().and_then(|t| t.node.as_ref()),
                _ => None,
            };
            match target {
                Some(NodeEnum::ResTarget(t)) if !t.name.is_empty() => (Some(t.name.clone()), 2),
                Some(NodeEnum::ResTarget(t)) => t.val.as_deref().and_then(|v| v.node.as_ref()).map_or((None, 0), name_strength),
                _ => (None, 0),
            }
        }
        NodeEnum::SubLink(link) if link.sub_link_type == protobuf::SubLinkType::ExistsSublink as i32 => (Some("exists".into()), 2),
        NodeEnum::SubLink(link) if link.sub_link_type == protobuf::SubLinkType::ArraySublink as i32 => (Some("array".into()), 2),
        NodeEnum::AArrayExpr(_) => (Some("array".into()), 2),
        NodeEnum::RowExpr(_) => (Some("row".into()), 2),
        NodeEnum::MinMaxExpr(m) => (Some(if m.op == protobuf::MinMaxOp::IsGreatest as i32 { "greatest" } else { "least" }.into()), 2),
        NodeEnum::AExpr(e) if e.kind == protobuf::AExprKind::AexprNullif as i32 => (Some("nullif".into()), 2),
        NodeEnum::AExpr(_)
        | NodeEnum::BoolExpr(_)
        | NodeEnum::NullTest(_)
        | NodeEnum::BooleanTest(_)
        | NodeEnum::AConst(_)
        | NodeEnum::ParamRef(_) => (Some("?column?".into()), 0),
        _ => (None, 0),
    }
}
