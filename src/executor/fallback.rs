//! The general fallback tier at run time: the coordinator database runs the
//! rewritten statement over the foreign-table stand-ins of the shards.

use super::{run_on_coordinator_db, Mode};
use crate::error::{PgError, PgResult};
use crate::planner::FallbackPlan;
use crate::server::client::ClientConn;
use crate::server::Coordinator;
use crate::transaction::Participants;

pub async fn run(plan: &FallbackPlan, coordinator: &Coordinator, catalog_version: i64, parts: &mut Participants, mode: &Mode<'_>, client: &mut ClientConn) -> PgResult<()> {
    if parts.wrote_on_workers() {
        // postgres_fdw reads through connections of its own, which cannot see
        // this block's uncommitted writes: its answer would be wrong.
        return Err(PgError::not_supported(format!(
            "this query runs in the coordinator's general fallback ({}), which cannot see the writes this transaction has already made on the workers",
            plan.reason
        ))
        .with_hint("Run the query before the writes, or in its own transaction."));
    }
    let role = parts.login().user.clone();
    coordinator.prepare_fallback(catalog_version, &role).await?;
    tracing::debug!("fallback: {}", plan.reason);
    run_on_coordinator_db(parts, &plan.sql, mode, true, client).await
}
