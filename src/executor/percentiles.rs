//! Runs exact percentiles in two passes (planner/percentiles.rs): the
//! shards' counts and quantiles give each group's brackets, which go into
//! the second pass's statement as a VALUES list; the coordinator database
//! checks that every wanted rank fell inside its bracket before it answers.
//! When one did not (rows changed between the passes), or the first pass
//! found too many groups for brackets to pay, the statement runs with the
//! shards' rows shipped instead.

use super::fallback::{combined_query_rows, combined_rows};
use super::multi_shard::{collect_partials, combine_sql, read_tasks_by_node, rows_as_relation, run_combined, shard_type_names, type_names};
use super::partials;
use super::Mode;
use crate::connection::client::ClientConn;
use crate::error::{PgError, PgResult};
use crate::metadata::Catalog;
use crate::planner::percentiles::BRACKETS_PLACEHOLDER;
use crate::planner::rewrite::{rows_placeholder, ShardTemplate};
use crate::planner::{CombineQuery, MultiShardPlan, PercentilePasses};
use crate::process::Coordinator;
use crate::transaction::Participants;
use std::sync::Arc;

/// Above this many groups summed over the tasks the first pass's quantiles
/// outnumber the rows they stand for, and the rows are shipped instead.
const MOST_TASK_GROUPS: usize = 10_000;

#[allow(clippy::too_many_arguments)]
pub(super) async fn run(
    plan: &MultiShardPlan,
    passes: &PercentilePasses,
    shipped: &CombineQuery,
    coordinator: &Coordinator,
    parts: &mut Participants,
    catalog: &Catalog,
    mode: &Mode<'_>,
    client: &mut ClientConn,
) -> PgResult<()> {
    if let Some(values) = second_pass(plan, passes, parts, catalog, mode).await? {
        if answer(plan, passes, &values, parts, catalog, mode, client).await? {
            return Ok(());
        }
        tracing::info!(
            "a percentile's rank left its bracket between the passes (rows written meanwhile); its statement reads the shards' rows instead"
        );
    }
    run_combined(plan, shipped, coordinator, parts, catalog, mode, client).await
}

/// The second pass's statement, with the brackets the first pass found in
/// place; None when there are too many groups.
async fn second_pass(
    plan: &MultiShardPlan,
    passes: &PercentilePasses,
    parts: &mut Participants,
    catalog: &Catalog,
    mode: &Mode<'_>,
) -> PgResult<Option<ShardTemplate>> {
    let by_node = read_tasks_by_node(parts, &passes.points, &plan.anchor, catalog).await?;
    let Some((fields, brackets)) = combined_query_rows(parts, &by_node, &passes.brackets, catalog, mode, MOST_TASK_GROUPS).await? else {
        return Ok(None);
    };
    let null_key = brackets.iter().any(|row| row[..passes.group_keys].iter().any(Option::is_none));
    let types = type_names(parts, &fields).await?;
    let relation = rows_as_relation(&types, &brackets, parts.limits())?;
    let mut values = if null_key { passes.values_by_same_keys.clone() } else { passes.values_by_equal_keys.clone() };
    values.fill(rows_placeholder(BRACKETS_PLACEHOLDER, passes.bracket_columns), Arc::from(relation));
    Ok(Some(values))
}

/// Runs the second pass and, when no rank missed its bracket, sends the
/// statement's result; false when one missed.
async fn answer(
    plan: &MultiShardPlan,
    passes: &PercentilePasses,
    values: &ShardTemplate,
    parts: &mut Participants,
    catalog: &Catalog,
    mode: &Mode<'_>,
    client: &mut ClientConn,
) -> PgResult<bool> {
    let by_node = read_tasks_by_node(parts, values, &plan.anchor, catalog).await?;
    let (fields, rows) = collect_partials(parts, &by_node, mode).await?;
    let types = shard_type_names(parts, catalog, &fields).await?;
    let misses = combine_sql(&passes.misses, &fields, &types)?;
    let finish = combine_sql(&passes.finish, &fields, &types)?;
    let (Some(misses), Some(finish)) = (misses, finish) else { return Err(PgError::internal("percentile values without a combine")) };
    let staged = partials::stage(parts, &types, rows).await?;
    let outcome = async {
        let (_, counted) = combined_rows(parts, &misses.read_from(&staged.relation, parts.limits())?).await?;
        let missed = counted.first().and_then(|row| row.first()).and_then(|v| v.as_deref()) != Some("0");
        if !missed {
            super::run_on_coordinator_db(parts, &finish.read_from(&staged.relation, parts.limits())?, mode, client).await?;
        }
        Ok(!missed)
    }
    .await;
    partials::release(parts, staged, outcome).await
}
