//! INSERT … SELECT through the coordinator: the coordinator database computes
//! the rows (running the SELECT, or the INSERT into the target's empty shell
//! and forgetting it: see `RowSource`); they are routed to their shards as
//! multi-row INSERTs, in batches, all in one distributed transaction.

use super::multi_shard::{type_names, values_list};
use super::router::{add_row_to_shard, evaluate_defaults, node_of_group, plan_tasks, RoutedInsert, Task};
use super::Mode;
use crate::connection::client::ClientConn;
use crate::connection::{quote_ident, text_row_size, TextRow, TextRows};
use crate::error::{PgError, PgResult};
use crate::metadata::Catalog;
use crate::metadata::Distribution;
use crate::planner::{plan_query, InsertSelectPlan, KeyRouting, Plan, ShardTarget};
use crate::process::Coordinator;
use crate::protocol::backend::{self, FieldDescription};
use crate::protocol::frontend::{self, Bind};
use crate::transaction::Participants;

/// Rows per routed INSERT: large enough to amortise planning, small enough
/// to keep each statement's text modest.
const BATCH_ROWS: usize = 1000;

pub async fn run(
    plan: &InsertSelectPlan,
    coordinator: &Coordinator,
    catalog: &Catalog,
    parts: &mut Participants,
    mode: &Mode<'_>,
    client: &mut ClientConn,
) -> PgResult<()> {
    let rows_sql = super::block_reads::ready(&plan.rows, coordinator, catalog, parts).await?;
    let (fields, rows) = rows_to_insert(plan, rows_sql, parts, mode).await?;
    let types = type_names(parts, &fields).await?;
    let columns: Vec<String> = match &plan.columns {
        Some(named) if !named.is_empty() => named.iter().map(|c| quote_ident(c)).collect(),
        Some(_) => plan.target.columns.iter().take(fields.len()).map(|c| quote_ident(c)).collect(),
        None => fields.iter().map(|f| quote_ident(&f.name)).collect(),
    };

    let implicit = parts.begin_implicit();
    let result = insert_batches(plan, &columns, &types, &rows, catalog, parts, mode, client).await;
    let result = parts.end_implicit(implicit, result).await;
    backend::command_complete(client.out(), &format!("INSERT 0 {}", result?));
    Ok(())
}

/// Routes the rows as multi-row INSERTs, all nodes at once; rows the
/// statement returns reach the client in the order of `rows`.
#[allow(clippy::too_many_arguments)]
async fn insert_batches(
    plan: &InsertSelectPlan,
    columns: &[String],
    types: &[String],
    rows: &[TextRow],
    catalog: &Catalog,
    parts: &mut Participants,
    mode: &Mode<'_>,
    client: &mut ClientConn,
) -> PgResult<u64> {
    let mut routed = RoutedInsert::default();
    // The values of GENERATED ALWAYS identity columns came from the shell.
    let overriding = if plan.target.always_identity.is_empty() { "" } else { " OVERRIDING SYSTEM VALUE" };
    let direct = DirectRouting::new(plan, columns);
    for (batch_index, batch) in rows.chunks(BATCH_ROWS).enumerate() {
        // Writing a million rows' statements takes a while: other sessions
        // get the runtime's thread between batches, and the statement's
        // timeout or cancellation ends the work.
        tokio::task::yield_now().await;
        parts.limits().check()?;
        let first_row = batch_index * BATCH_ROWS;
        if let Some(by_shard) = direct.as_ref().and_then(|d| d.shards_of(batch)) {
            for (shard, rows) in by_shard {
                let shard = &plan.target.shards[shard as usize];
                let values = values_list(types, rows.iter().map(|&r| &batch[r]), parts.limits())?;
                let sql: std::sync::Arc<str> =
                    format!("INSERT INTO {} ({}){overriding} VALUES {values}", plan.target.qualified_shard_name(shard), columns.join(", ")).into();
                for (i, group) in shard.placements.iter().enumerate() {
                    let task = Task { group: *group, sql: sql.clone(), rows: rows.clone() };
                    routed.add(node_of_group(catalog, *group)?, task, first_row, i > 0);
                }
            }
            continue;
        }
        // Literals of the columns' own types: the router hashes keys exactly.
        let sql = format!(
            "INSERT INTO {} ({}){overriding} VALUES {}{}",
            plan.target.qualified_name(),
            columns.join(", "),
            values_list(types, batch.iter(), parts.limits())?,
            plan.shard_clauses
        );
        let router = match plan_query(&sql, catalog).into_iter().next().map(|p| p.plan) {
            Some(Plan::Router(router)) => router,
            // A row the router refuses (a NULL distribution column value).
            Some(Plan::Unsupported(e)) => return Err(e),
            _ => return Err(PgError::internal("routing INSERT … SELECT rows did not give a router plan")),
        };
        let defaults = evaluate_defaults(&router, parts).await?;
        for (i, mut task) in plan_tasks(&router, parts, &Mode::Simple, defaults).await?.into_iter().enumerate() {
            if task.rows.is_empty() {
                task.rows = (0..batch.len()).collect();
            }
            let replica = router.target == ShardTarget::Reference && i > 0;
            routed.add(node_of_group(catalog, task.group)?, task, first_row, replica);
        }
    }
    if routed.is_empty() {
        return Ok(0);
    }
    // Text results arrive in either protocol; binary ones need the extended one.
    let results_only;
    let run_mode = match mode {
        Mode::Extended { bind, .. } if plan.returns_rows && bind.result_formats.contains(&1) => {
            results_only = Bind { result_formats: bind.result_formats.clone(), ..Bind::default() };
            Mode::Extended { bind: &results_only, param_types: &[], sync: true }
        }
        _ => Mode::Simple,
    };
    routed.run(parts, &run_mode, matches!(mode, Mode::Simple), client).await
}

/// Rows that need no parsing to reach their shards: without ON CONFLICT or
/// RETURNING to rewrite and with every sequence column given, each row's
/// shard is found by hashing its key text here, and each shard's INSERT is
/// written as text. (Parsing a 1,000-row INSERT and deparsing it per shard
/// cost the coordinator far more than the workers' inserts.)
struct DirectRouting<'p> {
    /// How keys hash, and the key's position among a row's fields; None for
    /// a reference table (one shard).
    key: Option<(KeyRouting<'p>, usize)>,
}

impl<'p> DirectRouting<'p> {
    fn new(plan: &'p InsertSelectPlan, columns: &[String]) -> Option<Self> {
        let table = &plan.target;
        let all_given = table.sequence_columns.iter().all(|(name, _)| columns.contains(&quote_ident(name)));
        if !plan.shard_clauses.is_empty() || !all_given {
            return None;
        }
        let key = match (&table.distribution, KeyRouting::new(table, true)) {
            (Distribution::Hash { column, .. }, Some(routing)) => Some((routing, columns.iter().position(|c| *c == quote_ident(column))?)),
            _ => None,
        };
        Some(DirectRouting { key })
    }

    /// The batch's rows by shard index, in row order; None when a key is NULL
    /// or needs the coordinator database to convert it (the router path
    /// handles those, with its errors).
    fn shards_of(&self, batch: &[TextRow]) -> Option<Vec<(u32, Vec<usize>)>> {
        let Some((routing, key)) = &self.key else { return Some(vec![(0, (0..batch.len()).collect())]) };
        let mut by_shard = Vec::new();
        for (r, row) in batch.iter().enumerate() {
            let value = row.get(*key)?.as_deref()?;
            add_row_to_shard(&mut by_shard, routing.local_shard(value.as_bytes(), 0, false)?, r);
        }
        Some(by_shard)
    }
}

/// The rows the INSERT would store, from the coordinator database, which
/// runs it against the shell table and rolls it back.
async fn rows_to_insert(
    plan: &InsertSelectPlan,
    rows_sql: &str,
    parts: &mut Participants,
    mode: &Mode<'_>,
) -> PgResult<(Vec<FieldDescription>, TextRows)> {
    const SAVEPOINT: &str = "tessera_insert_select";
    // Inside the session's block (which the coordinator database joins
    // now), a savepoint keeps the block, where BEGIN … ROLLBACK would end it.
    let in_block = parts.in_block();
    let limits = parts.limits().clone();
    let local = parts.local().await?;
    let allow = crate::metadata::ALLOW_SHELL_WRITES;
    local.execute(&if in_block { format!("SAVEPOINT {SAVEPOINT}; {allow}") } else { format!("BEGIN; {allow}") }).await?;
    let out = local.out();
    if let Some(check) = &plan.check_sql {
        let param_types: &[u32] = match mode {
            Mode::Extended { param_types, .. } => param_types,
            Mode::Simple => &[],
        };
        frontend::parse(out, "", check, param_types);
    }
    match mode {
        Mode::Extended { bind, param_types, .. } => {
            frontend::parse(out, "", rows_sql, param_types);
            frontend::bind(out, "", "", &bind.param_formats, &bind.params, &[]);
        }
        Mode::Simple => {
            frontend::parse(out, "", rows_sql, &[]);
            frontend::bind(out, "", "", &[], &[], &[]);
        }
    }
    frontend::describe(out, frontend::Target::Portal, "");
    frontend::execute(out, "", 0);
    frontend::sync(out);
    let result = local.read_result(|row| limits.charge(text_row_size(row))).await;
    local
        .execute(&if in_block { format!("ROLLBACK TO SAVEPOINT {SAVEPOINT}; RELEASE SAVEPOINT {SAVEPOINT}") } else { "ROLLBACK".to_string() })
        .await?;
    parts.observe_local_status();
    result
}
