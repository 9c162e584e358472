//! INSERT … SELECT through the coordinator: the coordinator database runs the
//! INSERT into the target's empty shell table and hands back the rows it would
//! store (then forgets them); those rows are routed to their shards as
//! multi-row INSERTs, in batches, all in one distributed transaction.

use super::multi_shard::{type_names, values_list};
use super::{run_router_for_tag, Mode};
use crate::connection::{quote_ident, TextRow, TextRows};
use crate::error::{PgError, PgResult};
use crate::metadata::Catalog;
use crate::planner::{plan_query, InsertSelectPlan, Plan};
use crate::protocol::backend::{self, FieldDescription};
use crate::protocol::frontend;
use crate::server::client::ClientConn;
use crate::server::Coordinator;
use crate::transaction::Participants;

/// Rows per routed INSERT: large enough to amortise planning, small enough
/// to keep each statement's text modest.
const BATCH_ROWS: usize = 1000;

pub async fn run(plan: &InsertSelectPlan, coordinator: &Coordinator, catalog: &Catalog, parts: &mut Participants, mode: &Mode<'_>, client: &mut ClientConn) -> PgResult<()> {
    if plan.reads_distributed {
        if parts.wrote_on_workers() {
            return Err(PgError::not_supported(
                "this INSERT … SELECT reads distributed tables through the coordinator's general fallback, which cannot see the writes this transaction has already made on the workers",
            )
            .with_hint("Run it before the writes, or in its own transaction."));
        }
        coordinator.prepare_fallback(catalog.version, &parts.login().user.clone()).await?;
    }
    let (fields, rows) = rows_to_insert(plan, parts, mode).await?;
    let types = type_names(parts, &fields).await?;
    let columns: Vec<String> = fields.iter().map(|f| quote_ident(&f.name)).collect();
    let implicit = parts.begin_implicit();
    let result = insert_batches(plan, &columns, &types, &rows, catalog, parts, client).await;
    if implicit {
        if result.is_ok() {
            parts.commit().await?;
        } else {
            parts.rollback().await.ok();
        }
    }
    backend::command_complete(client.out(), &format!("INSERT 0 {}", result?));
    Ok(())
}

async fn insert_batches(plan: &InsertSelectPlan, columns: &[String], types: &[String], rows: &[TextRow], catalog: &Catalog, parts: &mut Participants, client: &mut ClientConn) -> PgResult<u64> {
    let mut inserted = 0;
    for batch in rows.chunks(BATCH_ROWS) {
        // Literals of the columns' own types: the router hashes keys exactly.
        let sql = format!("INSERT INTO {} ({}) VALUES {}", plan.target.qualified_name(), columns.join(", "), values_list(types, batch));
        let router = match plan_query(&sql, catalog).into_iter().next().map(|p| p.plan) {
            Some(Plan::Router(router)) => router,
            // A row the router refuses (a NULL distribution column value).
            Some(Plan::Unsupported(e)) => return Err(e),
            _ => return Err(PgError::internal("routing INSERT … SELECT rows did not give a router plan")),
        };
        let tag = run_router_for_tag(&router, parts, catalog, &Mode::Simple, client).await?;
        inserted += backend::rows_in_tag(&tag).unwrap_or(0);
    }
    Ok(inserted)
}

/// The rows the INSERT would store, from the coordinator database, which
/// runs it against the shell table and rolls it back.
async fn rows_to_insert(plan: &InsertSelectPlan, parts: &mut Participants, mode: &Mode<'_>) -> PgResult<(Vec<FieldDescription>, TextRows)> {
    const SAVEPOINT: &str = "tessera_insert_select";
    let in_block = parts.local_in_block();
    let local = parts.local().await?;
    local.execute(&if in_block { format!("SAVEPOINT {SAVEPOINT}") } else { "BEGIN".to_string() }).await?;
    let out = local.out();
    match mode {
        Mode::Extended { bind, param_types, .. } => {
            frontend::parse(out, "", &plan.coordinator_sql, param_types);
            frontend::bind(out, "", "", &bind.param_formats, &bind.params, &[]);
        }
        Mode::Simple => {
            frontend::parse(out, "", &plan.coordinator_sql, &[]);
            frontend::bind(out, "", "", &[], &[], &[]);
        }
    }
    frontend::describe(out, frontend::Target::Portal, "");
    frontend::execute(out, "", 0);
    frontend::sync(out);
    let result = local.read_result().await;
    local.execute(&if in_block { format!("ROLLBACK TO SAVEPOINT {SAVEPOINT}; RELEASE SAVEPOINT {SAVEPOINT}") } else { "ROLLBACK".to_string() }).await?;
    parts.observe_local_status();
    result
}
