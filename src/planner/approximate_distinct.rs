//! Approximate DISTINCT counts across shards, as Citus gives them when a
//! session sets `citus.count_distinct_error_rate`: a `count(DISTINCT x)`
//! that the shards cannot count alone becomes the cardinality of a
//! HyperLogLog of `x` (the `hll` extension), which each shard builds and
//! the combine merges (the sketches' split in multi_shard.rs). No value
//! travels, whatever the number of distinct values. Counts the shards
//! compute whole (grouped by, or counting, a distribution column) stay exact.

use super::multi_shard::{disjoint_distinct, expression_key, function_name, grouped_by_key, name_strength, target_value, ShardKeys};
use super::walk::visit_mut;
use super::{cast_to_catalog_type, parsed_select};
use crate::error::{PgError, PgResult};
use pg_query::protobuf::{Node, SelectStmt};
use pg_query::NodeEnum;

/// HyperLogLog sizes `hll` accepts as `log2m` that Citus also chooses from:
/// 16 registers (26 % standard error) to 131,072 (0.29 %).
const LOG2M_RANGE: (f64, f64) = (4.0, 17.0);

/// Stands for the counted value in the replacement's text.
const COUNTED: &str = "tessera_counted_value";

/// The `log2m` of a HyperLogLog whose standard error is about `error_rate`:
/// one of `m` registers errs by 1.04/√m, so m = (1.04 / rate)², rounded to a
/// power of two within `LOG2M_RANGE`.
pub fn hll_log2m(error_rate: f64) -> u8 {
    let registers = (1.04 / error_rate).powi(2);
    registers.log2().round().clamp(LOG2M_RANGE.0, LOG2M_RANGE.1) as u8
}

/// The `count(DISTINCT …)` calls of `select` that an approximation would
/// replace, as their expression keys: those of one value that is not a
/// distribution column (`keys`), without ORDER BY inside, of a value that
/// is not a row; none where the query groups by a distribution column
/// (each group's count is then computed whole, exactly).
pub(super) fn approximable_counts(select: &SelectStmt, keys: &ShardKeys) -> Vec<String> {
    let mut counts = Vec::new();
    if grouped_by_key(select, keys) {
        return counts;
    }
    for node in select.target_list.iter().chain(select.having_clause.as_deref()).chain(&select.sort_clause) {
        let Some(mut n) = node.node.clone() else { continue };
        visit_mut(&mut n, &mut |n| {
            if let NodeEnum::FuncCall(call) = n {
                let counted = matches!(&call.args[..], [value] if !matches!(value.node, Some(NodeEnum::RowExpr(_))));
                if call.agg_distinct
                    && call.funcname.len() == 1
                    && function_name(call) == Some("count")
                    && call.agg_order.is_empty()
                    && call.over.is_none()
                    && counted
                    && !disjoint_distinct(call, keys)
                {
                    if let Some(key) = expression_key(n).filter(|k| !counts.contains(k)) {
                        counts.push(key);
                    }
                }
            }
        });
    }
    counts
}

/// `statement` (a SELECT) with each of its `counts` (`approximable_counts`)
/// replaced by the count a HyperLogLog of `log2m` estimates:
/// `COALESCE(hll_cardinality(hll_add_agg(hll_hash_any(x), log2m))::int8, 0)`,
/// FILTER kept (no rows give no HyperLogLog, and a count of none is 0). An
/// unnamed output keeps the name PostgreSQL gives the count.
pub fn approximate_counts(statement: &NodeEnum, counts: &[String], log2m: u8) -> PgResult<NodeEnum> {
    let NodeEnum::SelectStmt(select) = statement else { return Err(PgError::internal("an approximate count outside a SELECT")) };
    let mut select = select.clone();
    let replacement = estimate(log2m)?;
    // Whether it replaced a count in `node`.
    let rewrite = |node: &mut Node| {
        let mut replaced = false;
        if let Some(n) = node.node.as_mut() {
            visit_mut(n, &mut |n| {
                if !matches!(n, NodeEnum::FuncCall(_)) || !expression_key(n).is_some_and(|k| counts.contains(&k)) {
                    return;
                }
                let NodeEnum::FuncCall(call) = n else { unreachable!("matched above") };
                let (value, filter) = (call.args[0].node.clone(), call.agg_filter.clone());
                let mut estimate = replacement.clone();
                visit_mut(&mut estimate, &mut |e| match e {
                    NodeEnum::FuncCall(built) if function_name(built) == Some("hll_add_agg") => built.agg_filter = filter.clone(),
                    NodeEnum::ColumnRef(c) if super::column_ref_names(c).as_deref() == Some(&[COUNTED][..]) => {
                        if let Some(v) = value.clone() {
                            *e = v;
                        }
                    }
                    _ => {}
                });
                *n = estimate;
                replaced = true;
            });
        }
        replaced
    };
    for target in &mut select.target_list {
        let Some(NodeEnum::ResTarget(t)) = target.node.as_mut() else { continue };
        let Some(value) = t.val.as_deref_mut() else { continue };
        // PostgreSQL names an unnamed output after what it computes.
        let name = value.node.as_ref().and_then(|v| name_strength(v).0);
        if rewrite(value) && t.name.is_empty() {
            t.name = name.ok_or_else(|| PgError::internal("an approximate count in an output whose name is hard to tell"))?;
        }
    }
    if let Some(having) = select.having_clause.as_deref_mut() {
        rewrite(having);
    }
    for sort in &mut select.sort_clause {
        rewrite(sort);
    }
    Ok(NodeEnum::SelectStmt(select))
}

/// The estimate's expression, reading `COUNTED`.
fn estimate(log2m: u8) -> PgResult<NodeEnum> {
    let sql = format!("SELECT COALESCE(hll_cardinality(hll_add_agg(hll_hash_any({COUNTED}), {log2m})), 0)");
    let parsed = parsed_select(&sql).and_then(|s| s.target_list.into_iter().next()).and_then(|t| target_value(&t).cloned());
    let Some(NodeEnum::CoalesceExpr(mut coalesce)) = parsed.and_then(|v| v.node) else {
        return Err(PgError::internal("the approximate count's expression did not parse"));
    };
    // hll_cardinality gives float8; a count is int8.
    let cardinality = coalesce.args.remove(0);
    coalesce.args.insert(0, cast_to_catalog_type(cardinality, "int8"));
    Ok(NodeEnum::CoalesceExpr(coalesce))
}
