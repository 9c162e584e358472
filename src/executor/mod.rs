//! The executor: runs a plan against its execution context and writes the
//! results to the client. `execute` is the one entry point for the plans the
//! executor owns; each tier has a file (router, multi-shard, streaming,
//! fallback, COPY, EXPLAIN, INSERT … SELECT, MERGE, the cluster views).

mod approximate_distinct;
pub mod block_reads;
pub mod cluster_views;
pub mod copy;
pub mod explain;
mod explain_format;
pub mod fallback;
pub mod function_copies;
pub mod insert_select;
pub mod local_rows;
pub mod materialized_views;
pub mod merge;
pub mod multi_shard;
mod partials;
mod percentiles;
mod reference_keys;
mod repartition;
pub mod router;
pub mod stream;

use crate::connection::client::ClientConn;
use crate::error::{PgError, PgResult};
use crate::metadata::Catalog;
use crate::planner::Plan;
use crate::process::Coordinator;
use crate::protocol::frontend::{self, Bind};
use crate::protocol::Message;
use crate::transaction::Participants;
use bytes::BytesMut;

/// What a plan runs with: the process, the catalog it was planned under,
/// the session's participants and client, the statement's text, and how the
/// client asked for it (`mode`, whose `sync` only the router and delegated
/// calls use: they sync their one worker in the same round trip).
pub struct ExecutionContext<'a> {
    pub coordinator: &'a Coordinator,
    pub catalog: &'a Catalog,
    pub parts: &'a mut Participants,
    pub client: &'a mut ClientConn,
    pub sql: &'a str,
    pub mode: Mode<'a>,
}

/// How `execute` left a plan.
pub enum Executed<'p> {
    Done,
    /// At run time the statement turned out to need this other plan (keys
    /// that do not meet, a call that is not delegated): the caller runs it as
    /// it runs any statement.
    Instead(&'p Plan),
    /// The statement planned again with what only run time knew (a local
    /// table's rows), for the caller to run likewise.
    Replanned(Plan),
}

/// Runs one of the executor's plans. A failure drops the worker connections
/// it left broken, so the session's next statement starts on sound ones.
/// Plans the session or the command layer carry out (transaction control,
/// SQL PREPARE/EXECUTE, cluster functions, DDL, refusals) are not given here.
pub async fn execute<'p>(plan: &'p Plan, ctx: &mut ExecutionContext<'_>) -> PgResult<Executed<'p>> {
    let result = run(plan, ctx).await;
    if result.is_err() {
        ctx.parts.discard_broken();
    }
    result
}

async fn run<'p>(plan: &'p Plan, ctx: &mut ExecutionContext<'_>) -> PgResult<Executed<'p>> {
    let (coordinator, catalog) = (ctx.coordinator, ctx.catalog);
    let unsynced = ctx.mode.without_sync();
    match plan {
        Plan::Router(router) => router::run_router(router, ctx.parts, catalog, &ctx.mode, ctx.client).await?,
        Plan::Delegated(delegation) => {
            if !router::delegates(delegation, ctx.parts).await? {
                return Ok(match &delegation.otherwise {
                    Plan::Local => {
                        run_on_coordinator_db(ctx.parts, ctx.sql, &unsynced, ctx.client).await?;
                        Executed::Done
                    }
                    otherwise => Executed::Instead(otherwise),
                });
            }
            function_copies::run_delegated(delegation, ctx.parts, catalog, &ctx.mode, ctx.client, &coordinator.config).await?
        }
        Plan::KeysMeet(meet) => {
            if !router::keys_meet(&meet.route, ctx.parts, &unsynced).await? {
                return Ok(Executed::Instead(&meet.otherwise));
            }
            router::run_router(&meet.route, ctx.parts, catalog, &ctx.mode, ctx.client).await?
        }
        Plan::MultiShard(multi) => multi_shard::run(multi, coordinator, ctx.parts, catalog, &unsynced, ctx.client).await?,
        Plan::LocalWithClusterData(needs) => {
            let report = (needs.pools || needs.sessions).then(|| coordinator.process_report(catalog));
            cluster_views::run(needs, report.as_ref(), &coordinator.stats, ctx.sql, catalog, ctx.parts, &unsynced, ctx.client).await?
        }
        Plan::LocalOverShards(lent) => materialized_views::run(lent, ctx.sql, coordinator, catalog, ctx.parts, ctx.client).await?,
        Plan::Fallback(fallback) => fallback::run(fallback, coordinator, catalog, ctx.parts, &unsynced, ctx.client).await?,
        Plan::Copy(copy) => copy::run(copy, ctx.parts, catalog, ctx.client).await?,
        Plan::Explain(explain) => explain::run(explain, coordinator, catalog, ctx.parts, &unsynced, ctx.client).await?,
        Plan::InsertSelect(insert) => insert_select::run(insert, coordinator, catalog, ctx.parts, &unsynced, ctx.client).await?,
        Plan::MergeThroughCoordinator(merge) => merge::run(merge, coordinator, catalog, ctx.parts, ctx.client).await?,
        Plan::WithLocalRows(local) => return Ok(Executed::Replanned(local_rows::replanned(local, catalog, ctx.parts).await?)),
        other => return Err(PgError::internal(format!("the executor was given a plan it does not run: {other}"))),
    }
    Ok(Executed::Done)
}

/// Work on this many bytes or more (a statement written from many rows) runs
/// off the async runtime's thread: see `off_the_runtime`.
const LONG_WORK_BYTES: usize = 1 << 20;

/// Runs CPU-heavy work of a statement without holding up other sessions:
/// the tasks waiting on this runtime thread move to another one meanwhile.
/// (On a single-threaded runtime, as in unit tests, it simply runs.)
fn off_the_runtime<T>(work: impl FnOnce() -> T) -> T {
    match tokio::runtime::Handle::try_current() {
        Ok(runtime) if runtime.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => tokio::task::block_in_place(work),
        _ => work(),
    }
}

/// How the client asked for the statement to be run.
pub enum Mode<'a> {
    /// Simple query protocol: the statement text carries its values; the worker's
    /// RowDescription is forwarded.
    Simple,
    /// Extended protocol: the client's Bind values, with the statement prepared once
    /// per worker connection. `sync` says the client's Sync follows right away, so
    /// the worker can be synced in the same round trip.
    Extended { bind: &'a Bind, param_types: &'a [u32], sync: bool },
}

impl<'a> Mode<'a> {
    /// The same, without syncing in the same round trip: for every tier but
    /// the router's, whose statements take more than one round trip.
    pub fn without_sync(&self) -> Mode<'a> {
        match *self {
            Mode::Simple => Mode::Simple,
            Mode::Extended { bind, param_types, .. } => Mode::Extended { bind, param_types, sync: false },
        }
    }
}

/// Runs a statement on the coordinator database in the client's protocol and
/// result formats, with the client's Bind values, forwarding its rows.
pub(crate) async fn run_on_coordinator_db(parts: &mut Participants, sql: &str, mode: &Mode<'_>, client: &mut ClientConn) -> PgResult<()> {
    let local = parts.local().await?;
    match mode {
        Mode::Simple => frontend::query(local.out(), sql),
        Mode::Extended { bind, param_types, .. } => {
            frontend::parse(local.out(), "", sql, param_types);
            frontend::bind(local.out(), "", "", &bind.param_formats, &bind.params, &bind.result_formats);
            frontend::execute(local.out(), "", 0);
            frontend::sync(local.out());
        }
    }
    relay_local_answer(parts, client, |msg, out| {
        // COPY (query) TO STDOUT answers with CopyOutResponse, CopyData, CopyDone.
        if matches!(msg.tag(), b'T' | b'D' | b'C' | b'N' | b'H' | b'd' | b'c') {
            out.extend_from_slice(msg.frame());
        }
    })
    .await
}

/// Reads the coordinator database's answer up to ReadyForQuery, handing
/// every other message to `relay`, which writes what the client gets of it;
/// returns the first error.
pub(crate) async fn relay_local_answer(
    parts: &mut Participants,
    client: &mut ClientConn,
    mut relay: impl FnMut(&Message, &mut BytesMut),
) -> PgResult<()> {
    let mut error = None;
    loop {
        let local = parts.held_local()?;
        let msg = local.recv().await?;
        match msg.tag() {
            b'E' => error = error.or(Some(local.server_error(&msg))),
            b'Z' => break,
            _ => {
                relay(&msg, client.out());
                client.flush_if_large().await?;
            }
        }
    }
    parts.observe_local_status();
    match error {
        Some(e) => Err(e),
        None => Ok(()),
    }
}
