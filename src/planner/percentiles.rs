//! Exact percentiles across shards in two passes, so that no shard sends
//! its rows. `percentile_cont(f)` and `percentile_disc(f)` read the values
//! at one or two ranks of each group's sorted values. In the first pass
//! every task sends, per group, how many values it holds and 65 of its own
//! quantiles (`percentile_disc` at 0, 1/64, …, 1). A task's quantiles tell,
//! for any value, at least and at most how many of its values lie below
//! it; summed over the tasks, that bounds each wanted rank between two of
//! the values seen (its bracket), which the coordinator database finds
//! with window sums. In the second pass every task counts its values below
//! each group's bracket and sends only those inside it (a 32nd of the
//! group's values at most), and the coordinator database reads the ranks
//! off the sorted brackets and interpolates as PostgreSQL does. Rows
//! written between the passes can move a rank out of its bracket; the
//! executor then sees a miss and runs the statement with the rows shipped
//! (shipped_columns.rs) instead.
//!
//! Only the sort-key types whose order is the same on every node and in
//! the coordinator database qualify (numbers, dates and times: no
//! collation); the statement may group by plain expressions and read the
//! percentiles anywhere in its output, HAVING and ORDER BY, but have no
//! other aggregate.

use super::expression_types::{FromTables, FLOAT4, FLOAT8, INT2, INT4, INT8};
use super::multi_shard::{expression_key, function_name, partial_column, relation_named, target_value, PARTIALS_RELATION};
use super::shipped_columns::{combine_group_columns, shipped_column};
use super::walk::visit_mut;
use super::{around, parsed_select};
use crate::metadata::Catalog;
use pg_query::protobuf::{self, a_const, Node, SelectStmt};
use pg_query::NodeEnum;

const NUMERIC: u32 = 1700;
const DATE: u32 = 1082;
const TIMESTAMP: u32 = 1114;
const TIMESTAMPTZ: u32 = 1184;

/// Quantiles per task and group in the first pass, less one: a bracket
/// holds at most 2/`STEPS` of its group's values.
const STEPS: usize = 64;

/// Where the second pass's statement takes the brackets.
pub const BRACKETS_PLACEHOLDER: &str = "tessera_brackets";

/// The two passes' statements, as `plan` makes them.
#[derive(Debug)]
pub struct PassStatements {
    /// Per task and group: the group keys, then per percentile its count
    /// and quantiles.
    pub points: NodeEnum,
    /// Over the first pass's rows: per group, the keys, then per percentile
    /// the low and high ends of its bracket.
    pub brackets_sql: String,
    /// Per task and group, with the brackets in place of the placeholder,
    /// joined on equal keys: the keys, per percentile its count and the
    /// count below the bracket, then the values inside, one per row.
    pub values_by_equal_keys: NodeEnum,
    /// The same joined on keys where NULL meets NULL, for groups with a
    /// NULL key (an array comparison, which is slower than `=`).
    pub values_by_same_keys: NodeEnum,
    /// Over the second pass's rows: how many percentiles missed their bracket.
    pub misses_sql: String,
    /// Over the second pass's rows: the statement's own result.
    pub finish_sql: String,
    /// Group keys, which lead every pass's rows.
    pub group_keys: usize,
    /// Columns of the brackets relation.
    pub bracket_columns: usize,
}

/// One percentile of the statement.
struct Percentile {
    continuous: bool,
    /// The fraction's text (a constant from 0 to 1).
    fraction: String,
    /// The combine's column holding the sort key.
    column: String,
}

/// The two passes for a statement whose shipped-columns split is
/// (`shipped`, `combine_sql`); None when its shape or types do not qualify.
pub(super) fn plan(select: &SelectStmt, shipped: &NodeEnum, combine_sql: &str, catalog: &Catalog) -> Option<PassStatements> {
    if !select.distinct_clause.is_empty() || !select.window_clause.is_empty() || select.locking_clause.len() + select.values_lists.len() > 0 {
        return None;
    }
    let from = FromTables::of(select, catalog);
    let original = percentile_calls(select, catalog, |call| {
        let continuous = function_name(call) == Some("percentile_cont");
        let sort_key = sort_key(call)?;
        let allowed: &[u32] = if continuous {
            &[INT2, INT4, INT8, FLOAT4, FLOAT8, NUMERIC]
        } else {
            &[INT2, INT4, INT8, FLOAT4, FLOAT8, NUMERIC, DATE, TIMESTAMP, TIMESTAMPTZ]
        };
        allowed.contains(&from.type_of(sort_key)?).then_some(())?;
        Some((continuous, fraction(call)?))
    })?;
    let mut combine = parsed_select(combine_sql)?;
    let shipped_names = percentile_calls(&combine, catalog, |call| shipped_column(sort_key(call)?))?;
    if original.is_empty() || original.len() != shipped_names.len() {
        return None;
    }
    let percentiles: Vec<Percentile> =
        original.into_iter().zip(shipped_names).map(|((continuous, fraction), column)| Percentile { continuous, fraction, column }).collect();
    let keys = combine_group_columns(&combine)?;
    let NodeEnum::SelectStmt(shipped) = shipped else { return None };
    let with_rows = |sql: String| around(&sql, "tessera_rows", shipped).map(|s| NodeEnum::SelectStmt(Box::new(s)));
    let points = with_rows(points_sql(&keys, &percentiles))?;
    let values_by_equal_keys = with_rows(values_sql(&keys, &percentiles, false))?;
    let values_by_same_keys = with_rows(values_sql(&keys, &percentiles, true))?;
    let finished_values = values_relation(&keys, &percentiles);
    // The statement itself reads the values, each percentile from its column.
    let mut j = 0;
    for part in combine.target_list.iter_mut().chain(combine.having_clause.as_deref_mut()).chain(combine.sort_clause.iter_mut()) {
        if let Some(n) = part.node.as_mut() {
            visit_mut(n, &mut |n| {
                if matches!(n, NodeEnum::FuncCall(call) if is_percentile(call)) {
                    *n = expression(&format!("min({})", value_column(j))).expect("a call parses");
                    j += 1;
                }
            });
        }
    }
    combine.from_clause = vec![relation_named("tessera_values")];
    let statement = super::deparse::deparse_statement(super::deparse::BUILT_TREE_VERSION, NodeEnum::SelectStmt(Box::new(combine))).ok()?;
    let misses: Vec<String> = (0..percentiles.len()).map(|i| format!("tessera_missed_{i}")).collect();
    Some(PassStatements {
        points,
        brackets_sql: brackets_sql(keys.len(), &percentiles),
        values_by_equal_keys,
        values_by_same_keys,
        misses_sql: format!("{finished_values} SELECT count(*) FROM tessera_values WHERE {}", misses.join(" OR ")),
        finish_sql: format!("{finished_values} {statement}"),
        group_keys: keys.len(),
        bracket_columns: keys.len() + 2 * percentiles.len(),
    })
}

/// What `each` says of every aggregate call of the statement's output,
/// HAVING and ORDER BY, in that order; None if one is not a percentile of
/// one constant fraction and one ascending sort key, or `each` refuses it.
fn percentile_calls<T>(select: &SelectStmt, catalog: &Catalog, mut each: impl FnMut(&protobuf::FuncCall) -> Option<T>) -> Option<Vec<T>> {
    let mut found = Some(Vec::new());
    for part in select.target_list.iter().chain(select.having_clause.as_deref()).chain(&select.sort_clause) {
        let Some(mut n) = part.node.clone() else { continue };
        visit_mut(&mut n, &mut |n| {
            let NodeEnum::FuncCall(call) = n else { return };
            let name = function_name(call).unwrap_or_default();
            if call.over.is_some() || !(call.agg_star || catalog.is_aggregate(name) || is_percentile(call)) {
                return;
            }
            let value = is_percentile(call).then(|| each(call)).flatten();
            match (value, found.as_mut()) {
                (Some(v), Some(list)) => list.push(v),
                _ => found = None,
            }
        });
    }
    found
}

fn is_percentile(call: &protobuf::FuncCall) -> bool {
    let plain = call.agg_within_group && !call.agg_distinct && call.agg_filter.is_none() && call.over.is_none() && call.args.len() == 1;
    plain && call.funcname.len() <= 2 && matches!(function_name(call), Some("percentile_cont" | "percentile_disc"))
}

/// The one ascending sort key of a percentile.
fn sort_key(call: &protobuf::FuncCall) -> Option<&Node> {
    let [order] = call.agg_order.as_slice() else { return None };
    let NodeEnum::SortBy(by) = order.node.as_ref()? else { return None };
    let ascending = matches!(protobuf::SortByDir::from_i32(by.sortby_dir), Some(protobuf::SortByDir::SortbyDefault | protobuf::SortByDir::SortbyAsc));
    (ascending && by.use_op.is_empty()).then_some(by.node.as_deref()?)
}

/// A percentile's fraction, when it is a constant from 0 to 1 (others go
/// the way that reports PostgreSQL's own error).
fn fraction(call: &protobuf::FuncCall) -> Option<String> {
    let arg = call.args.first()?;
    let NodeEnum::AConst(c) = arg.node.as_ref()? else { return None };
    let value: f64 = match c.val.as_ref()? {
        a_const::Val::Ival(i) => i.ival as f64,
        a_const::Val::Fval(f) => f.fval.parse().ok()?,
        _ => return None,
    };
    (0.0..=1.0).contains(&value).then(|| expression_key(arg.node.as_ref()?)).flatten()
}

/// `SELECT keys, count(k), percentile_disc(<fractions>) WITHIN GROUP (ORDER BY k), … FROM rows GROUP BY keys`.
fn points_sql(keys: &[String], percentiles: &[Percentile]) -> String {
    let fractions: Vec<String> = (0..=STEPS).map(|j| (j as f64 / STEPS as f64).to_string()).collect();
    let mut columns: Vec<String> = keys.iter().map(|k| format!("tessera_rows.{k}")).collect();
    for p in percentiles {
        columns.push(format!("count(tessera_rows.{})", p.column));
        columns.push(format!("percentile_disc('{{{}}}'::float8[]) WITHIN GROUP (ORDER BY tessera_rows.{})", fractions.join(","), p.column));
    }
    format!("SELECT {} FROM (SELECT) AS tessera_rows{}", columns.join(", "), group_by_columns(keys, "tessera_rows."))
}

/// The second pass: per group, each percentile's count and count below its
/// bracket and the values inside, unnested one per row (`o` numbers them;
/// the counts hold on the first row).
fn values_sql(keys: &[String], percentiles: &[Percentile], null_safe: bool) -> String {
    let mut inner: Vec<String> = keys.iter().map(|k| format!("tessera_rows.{k}")).collect();
    let mut outer: Vec<String> = keys.iter().map(|k| format!("s.{k}")).collect();
    let mut arrays = Vec::new();
    for (i, p) in percentiles.iter().enumerate() {
        let x = format!("tessera_rows.{}", p.column);
        inner.push(format!("count({x}) AS n_{i}"));
        inner.push(format!("count(*) FILTER (WHERE {x} < b.lo_{i}) AS below_{i}"));
        inner.push(format!("array_agg({x}) FILTER (WHERE {x} >= b.lo_{i} AND {x} <= b.hi_{i}) AS a_{i}"));
        outer.push(format!("s.n_{i}"));
        outer.push(format!("s.below_{i}"));
        arrays.push(format!("s.a_{i}"));
    }
    outer.extend((0..percentiles.len()).map(|i| format!("u.v_{i}")));
    outer.push("u.o".into());
    let mut bracket_names: Vec<String> = (0..keys.len()).map(|j| format!("k_{j}")).collect();
    bracket_names.extend((0..percentiles.len()).flat_map(|i| [format!("lo_{i}"), format!("hi_{i}")]));
    let on: Vec<String> = keys
        .iter()
        .enumerate()
        .map(|(j, k)| if null_safe { format!("ARRAY[tessera_rows.{k}] = ARRAY[b.k_{j}]") } else { format!("tessera_rows.{k} = b.k_{j}") })
        .collect();
    let on = if on.is_empty() { "true".to_string() } else { on.join(" AND ") };
    let placeholder = super::rewrite::rows_placeholder(BRACKETS_PLACEHOLDER, bracket_names.len());
    let unnested: Vec<String> = (0..percentiles.len()).map(|i| format!("v_{i}")).collect();
    format!(
        "SELECT {} FROM (SELECT {} FROM (SELECT) AS tessera_rows LEFT JOIN {placeholder} AS b({}) ON {on}{}) AS s \
         LEFT JOIN LATERAL unnest({}) WITH ORDINALITY AS u({}, o) ON true",
        outer.join(", "),
        inner.join(", "),
        bracket_names.join(", "),
        group_by_columns(keys, "tessera_rows."),
        arrays.join(", "),
        unnested.join(", ")
    )
}

/// The brackets from the first pass's rows (keys, then count and quantiles
/// per percentile). For percentile i, each quantile `v` of a task with `n`
/// values sits at rank `r` (PostgreSQL's percentile_disc rank), and:
/// - at least `le_least(v)` values of the group are ≤ v: the sum over the
///   group's quantiles up to v of how far each rank passes the task's
///   previous one;
/// - at most `lt_most(v)` values are < v: the sum over the quantiles below
///   v of the gap to the task's next rank (or to `n`): the running sum up
///   to v less v's own quantiles' share (a frame excluding them would sum
///   every frame anew).
///
/// The bracket is [the largest v with lt_most(v) ≤ first wanted rank, the
/// smallest v with le_least(v) > last wanted rank]; the group's least and
/// greatest values always qualify.
fn brackets_sql(group_keys: usize, percentiles: &[Percentile]) -> String {
    let keys: Vec<String> = (0..group_keys).map(partial_column).collect();
    let key_list = |prefix: &str| keys.iter().map(|k| format!("{prefix}{k}")).collect::<Vec<_>>().join(", ");
    let with_keys = |prefix: &str| if keys.is_empty() { String::new() } else { format!("{}, ", key_list(prefix)) };
    let partition = if keys.is_empty() { String::new() } else { format!("PARTITION BY {}", key_list("")) };
    let mut ctes = vec![format!("tessera_parts AS (SELECT row_number() OVER () AS tessera_part, * FROM {PARTIALS_RELATION})")];
    let mut joins = Vec::new();
    let mut ends = Vec::new();
    for (i, p) in percentiles.iter().enumerate() {
        let (count, quantiles) = (partial_column(group_keys + 2 * i), partial_column(group_keys + 2 * i + 1));
        ctes.push(format!(
            "tessera_points_{i} AS (SELECT {k}u.v, r.r - coalesce(lag(r.r) OVER w, -1) AS le_step, \
             coalesce(lead(r.r) OVER w, p.{count}) - r.r AS lt_step, CASE WHEN u.j = 1 THEN p.{count} ELSE 0 END AS n_once \
             FROM tessera_parts AS p, LATERAL unnest(p.{quantiles}) WITH ORDINALITY AS u(v, j), \
             LATERAL (SELECT (greatest(((u.j - 1) * p.{count} + {last}) / {STEPS}, 1) - 1)::int8 AS r) AS r \
             WHERE p.{count} > 0 WINDOW w AS (PARTITION BY p.tessera_part ORDER BY u.j))",
            k = with_keys("p."),
            last = STEPS - 1,
        ));
        let (first, last) = ranks(p, "t.total");
        ctes.push(format!(
            "tessera_bracket_{i} AS (SELECT {k}max(t.v) FILTER (WHERE t.lt_most <= {first}) AS lo, \
             min(t.v) FILTER (WHERE t.le_least > {last}) AS hi \
             FROM (SELECT {k0}v, sum(n_once) OVER g AS total, \
             sum(lt_step) OVER (g ORDER BY v) - sum(lt_step) OVER (PARTITION BY {k0}v) AS lt_most, \
             sum(le_step) OVER (g ORDER BY v) AS le_least FROM tessera_points_{i} WINDOW g AS ({partition})) AS t{group})",
            k = with_keys("t."),
            k0 = with_keys(""),
            group = group_by_columns(&keys, "t."),
        ));
        let on: Vec<String> = keys.iter().map(|k| format!("g.{k} IS NOT DISTINCT FROM b{i}.{k}")).collect();
        joins.push(format!(" LEFT JOIN tessera_bracket_{i} AS b{i} ON {}", if on.is_empty() { "true".to_string() } else { on.join(" AND ") }));
        ends.push(format!("b{i}.lo, b{i}.hi"));
    }
    let groups = if keys.is_empty() { "(SELECT) AS g".to_string() } else { format!("(SELECT DISTINCT {} FROM tessera_parts) AS g", key_list("")) };
    format!("WITH {} SELECT {}{} FROM {groups}{}", ctes.join(", "), with_keys("g."), ends.join(", "), joins.join(""))
}

/// The second pass's rows as `tessera_values`: per group, the keys under
/// the combine's own names, then per percentile its value and whether its
/// ranks missed the bracket. The rows are: keys, then count and count
/// below per percentile, then the values inside per percentile, then `o`.
fn values_relation(keys: &[String], percentiles: &[Percentile]) -> String {
    let n = percentiles.len();
    let column = |i: usize| partial_column(i);
    let key_columns: Vec<String> = (0..keys.len()).map(column).collect();
    let first_row = format!("coalesce({}, 1) = 1", column(keys.len() + 3 * n));
    let mut grouped: Vec<String> = key_columns.clone();
    let mut values: Vec<String> = key_columns.iter().zip(keys).map(|(c, name)| format!("{c} AS {name}")).collect();
    for (i, p) in percentiles.iter().enumerate() {
        let (count, below, value) = (column(keys.len() + 2 * i), column(keys.len() + 2 * i + 1), column(keys.len() + 2 * n + i));
        grouped.push(format!("sum({count}) FILTER (WHERE {first_row})::int8 AS total_{i}"));
        grouped.push(format!("coalesce(sum({below}) FILTER (WHERE {first_row}), 0)::int8 AS below_{i}"));
        grouped.push(format!("array_agg({value} ORDER BY {value}) FILTER (WHERE {value} IS NOT NULL) AS sorted_{i}"));
        let total = format!("total_{i}");
        let (first, last) = ranks(p, &total);
        let at = |rank: &str| format!("sorted_{i}[(({rank}) - below_{i} + 1)::int4]");
        let value = if p.continuous {
            // PostgreSQL: lo + (pos - floor(pos)) * (hi - lo), in float8.
            let position = format!("(({})::float8 * ({total} - 1)::float8)", p.fraction);
            let (lo, hi) = (format!("{}::float8", at(&first)), format!("{}::float8", at(&last)));
            format!("CASE WHEN {first} = {last} THEN {lo} ELSE {lo} + (({position} - floor({position})) * ({hi} - {lo})) END")
        } else {
            at(&first)
        };
        values.push(format!("CASE WHEN coalesce({total}, 0) = 0 THEN NULL ELSE {value} END AS {}", value_column(i)));
        values.push(format!(
            "coalesce({total}, 0) > 0 AND ({first} < below_{i} OR {last} - below_{i} + 1 > coalesce(cardinality(sorted_{i}), 0)) AS tessera_missed_{i}"
        ));
    }
    format!(
        "WITH tessera_groups AS (SELECT {} FROM {PARTIALS_RELATION}{}), tessera_values AS (SELECT {} FROM tessera_groups)",
        grouped.join(", "),
        group_by_columns(&key_columns, ""),
        values.join(", ")
    )
}

/// The first and last 0-based ranks a percentile reads among `total`
/// values, computed as PostgreSQL computes them.
fn ranks(p: &Percentile, total: &str) -> (String, String) {
    let f = format!("({})::float8", p.fraction);
    if p.continuous {
        let position = format!("({f} * ({total} - 1)::float8)");
        (format!("floor({position})::int8"), format!("ceil({position})::int8"))
    } else {
        let rank = format!("(greatest(ceil({f} * ({total})::float8), 1) - 1)::int8");
        (rank.clone(), rank)
    }
}

fn value_column(i: usize) -> String {
    format!("tessera_percentile_{i}")
}

fn group_by_columns(keys: &[String], prefix: &str) -> String {
    if keys.is_empty() {
        String::new()
    } else {
        format!(" GROUP BY {}", keys.iter().map(|k| format!("{prefix}{k}")).collect::<Vec<_>>().join(", "))
    }
}

/// The parse tree of expression `sql`.
fn expression(sql: &str) -> Option<NodeEnum> {
    let select = parsed_select(&format!("SELECT {sql}"))?;
    target_value(select.target_list.first()?)?.node.clone()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pass_statements_parse_and_join_their_brackets() {
        let p = [Percentile { continuous: true, fraction: "0.5".into(), column: "tessera_p_001".into() }];
        let sql = values_sql(&["tessera_p_000".into()], &p, false);
        assert!(sql.contains(&super::super::rewrite::rows_placeholder(BRACKETS_PLACEHOLDER, 3)), "{sql}");
        assert!(sql.contains("tessera_rows.tessera_p_000 = b.k_0"), "{sql}");
        assert!(parsed_select(&sql).is_some());
        assert!(parsed_select(&brackets_sql(1, &p)).is_some());
        assert!(parsed_select(&format!("{} SELECT 1", values_relation(&["tessera_p_000".into()], &p))).is_some());
    }
}
