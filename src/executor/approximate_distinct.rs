//! DISTINCT counts across shards as HyperLogLogs, when the session sets
//! `citus.count_distinct_error_rate` (planner/approximate_distinct.rs): the
//! statement is planned again with its approximable counts replaced, at run
//! time, where the session's settings are known (plans are cached by their
//! text alone).

use crate::error::{sqlstate, PgError, PgResult};
use crate::metadata::Catalog;
use crate::planner::approximate_distinct::{approximate_counts, hll_log2m};
use crate::planner::{plan_tree, CombineQuery, MultiShardPlan, Plan};
use crate::transaction::Participants;
use std::sync::Arc;

/// The plan that estimates `query`'s DISTINCT counts, when it has counts
/// to estimate and the session accepts an error; None otherwise.
pub(super) async fn replanned(query: &CombineQuery, catalog: &Catalog, parts: &mut Participants) -> PgResult<Option<Arc<MultiShardPlan>>> {
    let Some(exact) = query.fallback.as_ref().filter(|_| !query.approximable_counts.is_empty()) else { return Ok(None) };
    let Some(rate) = parts.citus_settings().await?.count_distinct_error_rate.rate()? else { return Ok(None) };
    if !catalog.is_aggregate("hll_add_agg") {
        return Err(PgError::new(sqlstate::FEATURE_NOT_SUPPORTED, "cannot compute count (distinct) approximation")
            .with_hint("Install the hll extension (CREATE EXTENSION hll), or SET citus.count_distinct_error_rate = 0 for exact counts."));
    }
    let statement = approximate_counts(&exact.statement, &query.approximable_counts, hll_log2m(rate))?;
    match plan_tree(exact.version, statement, catalog) {
        Plan::MultiShard(multi) => Ok(Some(multi)),
        other => Err(PgError::internal(format!("the approximate DISTINCT counts planned as {other}, not across the shards"))),
    }
}
