//! Cluster-management functions and distributed DDL: the statements the
//! coordinator carries out itself, across the coordinator database and workers.

pub(crate) mod distribute;
pub(crate) mod nodes;
mod objects;
mod run_command;
pub mod table_ddl;
mod time_partitions;
pub mod worker_relations;

use crate::config::ServerAddr;
use crate::error::{sqlstate, PgError, PgResult};
use crate::metadata::DistributedTable;
use crate::planner::rewrite::ShardTemplate;
use crate::planner::{placement_groups, ChosenNames, ClusterCall, ClusterFunction, DdlPlan, DropIndex, RelationChanges, RoleChange};
use crate::process::context::{Caller, CommandContext};
use crate::protocol::backend::{self, FieldDescription};
use crate::protocol::frontend::{self, Bind};
use crate::transaction::{Access, Participants, WorkerConnection};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

const VOID_OID: u32 = 2278;
const BOOL_OID: u32 = 16;
const RECORD_OID: u32 = 2249;
const INT4_OID: u32 = 23;
const INT8_OID: u32 = 20;
const TEXT_OID: u32 = 25;
const PG_LSN_OID: u32 = 3220;

/// Runs a cluster function and writes its result set (the RowDescription only
/// when `describe` is set, as the extended protocol has described it already).
/// `bound` holds the client's Bind and parameter types for an extended-protocol
/// call (its arguments may be parameters).
pub async fn run_cluster_function(call: &ClusterCall, ctx: &mut CommandContext<'_>, bound: Option<(&Bind, &[u32])>) -> PgResult<()> {
    if ctx.parts.in_block() && !call.function.changes_tables() {
        return Err(PgError::new(sqlstate::ACTIVE_SQL_TRANSACTION, format!("{} cannot run inside a transaction block", call.column_name)));
    }
    if call.function.superuser_only() {
        require_superuser(ctx, &call.column_name).await?;
    }
    let args = evaluate_arguments(call, ctx, bound).await?;
    let arg = |i: usize| args.get(i).cloned().flatten();
    let (fields, rows): (Vec<FieldDescription>, Vec<Vec<Option<String>>>) = match call.function {
        ClusterFunction::CreateDistributedTable | ClusterFunction::CreateDistributedTableConcurrently => {
            if call.function == ClusterFunction::CreateDistributedTableConcurrently && ctx.parts.in_block() {
                return Err(PgError::new(
                    sqlstate::ACTIVE_SQL_TRANSACTION,
                    "create_distributed_table_concurrently cannot run inside a transaction block",
                ));
            }
            let table = arg(0).ok_or_else(|| null_argument("table_name"))?;
            let column = arg(1).ok_or_else(|| null_argument("distribution_column"))?;
            if let Some(kind) = arg(2) {
                if kind != "hash" {
                    return Err(PgError::not_supported(format!("distribution_type '{kind}' is not supported; only 'hash' is")));
                }
            }
            let colocate_with = arg(3).unwrap_or_else(|| "default".into());
            let shard_count = match arg(4) {
                Some(n) => Some(n.parse::<i32>().map_err(|_| invalid("shard_count must be an integer"))?),
                None => None,
            };
            distribute::create_distributed_table(ctx, &table, &column, &colocate_with, shard_count).await?;
            void_result(&call.column_name)
        }
        ClusterFunction::CreateReferenceTable => {
            let table = arg(0).ok_or_else(|| null_argument("table_name"))?;
            distribute::create_reference_table(ctx, &table).await?;
            void_result(&call.column_name)
        }
        ClusterFunction::UndistributeTable => {
            let table = arg(0).ok_or_else(|| null_argument("table_name"))?;
            distribute::undistribute_table(ctx, &table).await?;
            void_result(&call.column_name)
        }
        ClusterFunction::AlterDistributedTable => {
            let table = arg(0).ok_or_else(|| null_argument("table_name"))?;
            let shard_count = match arg(2) {
                Some(n) => Some(n.parse::<i32>().map_err(|_| invalid("shard_count must be an integer"))?),
                None => None,
            };
            let change = distribute::TableChange {
                distribution_column: arg(1),
                shard_count,
                colocate_with: arg(3),
                cascade_to_colocated: arg(4).map(|v| v == "t"),
            };
            distribute::alter_distributed_table(ctx, &table, change).await?;
            void_result(&call.column_name)
        }
        ClusterFunction::CreateTimePartitions => {
            let table = arg(0).ok_or_else(|| null_argument("table_name"))?;
            let interval = arg(1).ok_or_else(|| null_argument("partition_interval"))?;
            let end_at = arg(2).ok_or_else(|| null_argument("end_at"))?;
            let created = time_partitions::create(ctx, &table, &interval, &end_at, arg(3).as_deref()).await?;
            (vec![FieldDescription::computed(&call.column_name, BOOL_OID, 1)], vec![vec![Some(if created { "t" } else { "f" }.to_string())]])
        }
        ClusterFunction::DropOldTimePartitions => {
            let table = arg(0).ok_or_else(|| null_argument("table_name"))?;
            let older_than = arg(1).ok_or_else(|| null_argument("older_than"))?;
            time_partitions::drop_old(ctx, &table, &older_than).await?;
            (Vec::new(), Vec::new())
        }
        ClusterFunction::AddNode => {
            let name = arg(0).ok_or_else(|| null_argument("nodename"))?;
            let port = parse_port(arg(1))?;
            let id = nodes::add_node(ctx, &name, port).await?;
            (vec![FieldDescription::computed(&call.column_name, INT4_OID, 4)], vec![vec![Some(id.to_string())]])
        }
        ClusterFunction::RecoverPreparedTransactions => {
            let settled = ctx.coordinator.recover_prepared_transactions().await?;
            (vec![FieldDescription::computed(&call.column_name, INT4_OID, 4)], vec![vec![Some(settled.to_string())]])
        }
        ClusterFunction::MoveShardPlacement => {
            let shard_id = arg(0).ok_or_else(|| null_argument("shard_id"))?.parse::<i64>().map_err(|_| invalid("shard_id must be a bigint"))?;
            let source = (arg(1).ok_or_else(|| null_argument("source_node_name"))?, parse_port(arg(2))?);
            let target = (arg(3).ok_or_else(|| null_argument("target_node_name"))?, parse_port(arg(4))?);
            let mode = crate::operations::shard_move::TransferMode::parse(arg(5).as_deref())?;
            crate::operations::shard_move::move_shard_placement(ctx, shard_id, (&source.0, source.1), (&target.0, target.1), mode).await?;
            void_result(&call.column_name)
        }
        ClusterFunction::CleanupOrphanedResources => {
            let removed = crate::operations::cleanup::run(&ctx.coordinator.config, &ctx.catalog).await?;
            ctx.notice(format!("cleaned up {removed} orphaned resources")).await;
            void_result(&call.column_name)
        }
        ClusterFunction::GetRebalancePlan | ClusterFunction::RebalanceTableShards => {
            let rebalancing = call.function == ClusterFunction::RebalanceTableShards;
            // Arguments by position: relation, threshold, max_shard_moves,
            // excluded_shard_list, then (rebalance_table_shards only)
            // shard_transfer_mode; then drain_only, rebalance_strategy.
            let tail = if rebalancing { 5 } else { 4 };
            let moves = planned_moves(ctx, arg(0), arg(2), arg(3), arg(tail).as_deref() == Some("t"), arg(tail + 1)).await?;
            if rebalancing {
                let mode = crate::operations::shard_move::TransferMode::parse(arg(4).as_deref())?;
                crate::operations::rebalance::run(ctx, &moves, mode).await?;
                void_result(&call.column_name)
            } else {
                let sizes = crate::operations::rebalance::sizes(ctx, &moves).await;
                let fields = vec![
                    FieldDescription::computed("table_name", TEXT_OID, -1),
                    FieldDescription::computed("shardid", INT8_OID, 8),
                    FieldDescription::computed("shard_size", INT8_OID, 8),
                    FieldDescription::computed("sourcename", TEXT_OID, -1),
                    FieldDescription::computed("sourceport", INT4_OID, 4),
                    FieldDescription::computed("targetname", TEXT_OID, -1),
                    FieldDescription::computed("targetport", INT4_OID, 4),
                ];
                let rows = moves
                    .iter()
                    .zip(sizes)
                    .map(|(m, size)| {
                        [
                            m.table.clone(),
                            m.shard_id.to_string(),
                            size.to_string(),
                            m.source.addr.host.clone(),
                            m.source.addr.port.to_string(),
                            m.target.addr.host.clone(),
                            m.target.addr.port.to_string(),
                        ]
                        .into_iter()
                        .map(Some)
                        .collect()
                    })
                    .collect();
                (fields, rows)
            }
        }
        ClusterFunction::DrainNode => {
            let name = arg(0).ok_or_else(|| null_argument("nodename"))?;
            let port = parse_port(arg(1))?;
            let mode = crate::operations::shard_move::TransferMode::parse(arg(2).as_deref())?;
            nodes::set_should_have_shards(ctx, &name, port, false).await?;
            let moves = planned_moves(ctx, None, None, None, true, arg(3)).await?;
            crate::operations::rebalance::run(ctx, &moves, mode).await?;
            void_result(&call.column_name)
        }
        ClusterFunction::SetNodeProperty => {
            let name = arg(0).ok_or_else(|| null_argument("nodename"))?;
            let port = parse_port(arg(1))?;
            let property = arg(2).ok_or_else(|| null_argument("property"))?;
            if property != "shouldhaveshards" {
                return Err(invalid(&format!("unsupported node property \"{property}\"; the one property is \"shouldhaveshards\"")));
            }
            let value = arg(3).ok_or_else(|| null_argument("value"))?;
            nodes::set_should_have_shards(ctx, &name, port, value == "t").await?;
            void_result(&call.column_name)
        }
        ClusterFunction::CopyShardPlacement => {
            let shard_id = arg(0).ok_or_else(|| null_argument("shard_id"))?.parse::<i64>().map_err(|_| invalid("shard_id must be a bigint"))?;
            let source = (arg(1).ok_or_else(|| null_argument("source_node_name"))?, parse_port(arg(2))?);
            let target = (arg(3).ok_or_else(|| null_argument("target_node_name"))?, parse_port(arg(4))?);
            crate::operations::shard_move::TransferMode::parse(arg(5).as_deref())?;
            nodes::copy_shard_placement(ctx, shard_id, (&source.0, source.1), (&target.0, target.1)).await?;
            void_result(&call.column_name)
        }
        ClusterFunction::ReplicateReferenceTables => {
            crate::operations::shard_move::TransferMode::parse(arg(0).as_deref())?;
            let copies = nodes::replicate_reference_tables(ctx).await?;
            ctx.notice(format!("made {copies} copies of reference tables")).await;
            void_result(&call.column_name)
        }
        ClusterFunction::RebalanceStart => {
            let mode = crate::operations::shard_move::TransferMode::parse(arg(2).as_deref())?;
            let drain_only = arg(1).as_deref() == Some("t");
            let moves = planned_moves(ctx, None, None, None, drain_only, arg(0)).await?;
            let job = if moves.is_empty() {
                ctx.notice("No moves available for rebalancing".into()).await;
                None
            } else {
                let description = if drain_only { "Drain the nodes that should have no shards" } else { "Rebalance all colocation groups" };
                let job = crate::operations::background::schedule_rebalance(&ctx.coordinator.config, &moves, mode, description).await?;
                ctx.coordinator.jobs_scheduled.notify_one();
                ctx.notice(format!("Scheduled {} moves as job {job}; to follow it, run SELECT * FROM citus_rebalance_status()", moves.len())).await;
                Some(job.to_string())
            };
            (vec![FieldDescription::computed(&call.column_name, INT8_OID, 8)], vec![vec![job]])
        }
        ClusterFunction::RunCommandOnWorkers
        | ClusterFunction::RunCommandOnAllNodes
        | ClusterFunction::RunCommandOnShards
        | ClusterFunction::RunCommandOnPlacements
        | ClusterFunction::RunCommandOnColocatedPlacements => run_command::run(call.function, &args, ctx).await?,
        ClusterFunction::UpdateNode => {
            let node_id = arg(0).ok_or_else(|| null_argument("node_id"))?.parse::<i32>().map_err(|_| invalid("node_id must be an integer"))?;
            let name = arg(1).ok_or_else(|| null_argument("new_node_name"))?;
            let port = parse_port(Some(arg(2).ok_or_else(|| null_argument("new_node_port"))?))?;
            nodes::update_node(ctx, node_id, &name, port).await?;
            void_result(&call.column_name)
        }
        ClusterFunction::CreateRestorePoint => {
            let name = arg(0).ok_or_else(|| null_argument("name"))?;
            let lsn = crate::operations::restore_point::create(&ctx.coordinator.config, &ctx.catalog, &name).await?;
            (vec![FieldDescription::computed(&call.column_name, PG_LSN_OID, 8)], vec![vec![Some(lsn)]])
        }
        ClusterFunction::StatStatementsReset => {
            ctx.coordinator.stats.statements.reset();
            void_result(&call.column_name)
        }
        ClusterFunction::StatTenantsReset => {
            ctx.coordinator.stats.tenants.reset();
            void_result(&call.column_name)
        }
        ClusterFunction::StatCountersReset => {
            ctx.coordinator.stats.counters.reset();
            void_result(&call.column_name)
        }
        ClusterFunction::DisableNode => {
            let name = arg(0).ok_or_else(|| null_argument("nodename"))?;
            let port = parse_port(arg(1))?;
            nodes::disable_node(ctx, &name, port).await?;
            void_result(&call.column_name)
        }
        ClusterFunction::ActivateNode => {
            let name = arg(0).ok_or_else(|| null_argument("nodename"))?;
            let port = parse_port(arg(1))?;
            let id = nodes::activate_node(ctx, &name, port).await?;
            (vec![FieldDescription::computed(&call.column_name, INT4_OID, 4)], vec![vec![Some(id.to_string())]])
        }
        ClusterFunction::RemoveNode => {
            let name = arg(0).ok_or_else(|| null_argument("nodename"))?;
            let port = parse_port(arg(1))?;
            nodes::remove_node(ctx, &name, port).await?;
            void_result(&call.column_name)
        }
    };
    if call.function.is_procedure() {
        backend::command_complete(ctx.client()?.out(), "CALL");
        return Ok(());
    }
    let names: Vec<&str> = fields.iter().map(|f| f.name.as_str()).collect();
    if let Some(sql) = call.around_rows(&names, &rows_query(&fields, &rows))? {
        let mode = match bound {
            Some((bind, param_types)) => crate::executor::Mode::Extended { bind, param_types, sync: false },
            None => crate::executor::Mode::Simple,
        };
        let Caller::Client(client) = &mut ctx.caller else { return Err(PgError::internal("a background job has no client to answer")) };
        return crate::executor::run_on_coordinator_db(ctx.parts, &sql, &mode, client).await;
    }
    let client = ctx.client()?;
    let formats = bound.map(|(bind, _)| bind.result_formats.as_slice()).unwrap_or(&[]);
    if call.in_select_list && fields.len() > 1 {
        // PostgreSQL gives a function returning several columns, called in
        // the select list, one column of records.
        if bound.is_none() {
            backend::row_description(client.out(), &[FieldDescription::computed(&call.column_name, RECORD_OID, -1)]);
        }
        for row in &rows {
            let record = encode_record(row, &fields, column_format(formats, 0));
            backend::data_row(client.out(), std::iter::once(Some(record.as_slice())));
        }
    } else {
        if bound.is_none() {
            // The extended protocol described the result already.
            backend::row_description(client.out(), &fields);
        }
        for row in &rows {
            let values: Vec<Option<Vec<u8>>> =
                row.iter().zip(&fields).enumerate().map(|(i, (v, f))| encode_value(v.as_deref(), f.type_oid, column_format(formats, i))).collect();
            backend::data_row(client.out(), values.iter().map(|v| v.as_deref()));
        }
    }
    backend::command_complete(client.out(), &format!("SELECT {}", rows.len()));
    Ok(())
}

/// The rebalancer's plan for the arguments Citus's functions take: only the
/// co-location group of `relation` (when given), at most `max_moves`,
/// leaving out the shard groups of `excluded` shards.
async fn planned_moves(
    ctx: &mut CommandContext<'_>,
    relation: Option<String>,
    max_moves: Option<String>,
    excluded: Option<String>,
    drain_only: bool,
    strategy: Option<String>,
) -> PgResult<Vec<crate::operations::rebalance::PlannedMove>> {
    if let Some(strategy) = strategy.filter(|s| s != "by_shard_count") {
        return Err(PgError::not_supported(format!("rebalance strategy \"{strategy}\" is not supported"))
            .with_hint("Tessera balances by shard count (\"by_shard_count\")."));
    }
    let colocation = match relation {
        Some(relation) => {
            let table = named_table(ctx, &relation).await?;
            Some(table.ok_or_else(|| invalid(&format!("\"{relation}\" is not a distributed table")))?.colocation_id)
        }
        None => None,
    };
    let scope = crate::operations::rebalance::Scope { colocation, drain_only };
    let mut moves = crate::operations::rebalance::plan(&ctx.catalog, scope)?;
    if let Some(excluded) = excluded {
        let excluded: Vec<i64> = excluded.trim_matches(|c| c == '{' || c == '}').split(',').filter_map(|v| v.trim().parse().ok()).collect();
        let catalog = ctx.catalog.clone();
        let group_of = |shard: i64| catalog.shard(shard).map(|(t, s)| (t.colocation_id, s.index));
        let excluded_groups: Vec<_> = excluded.iter().filter_map(|s| group_of(*s)).collect();
        moves.retain(|m| group_of(m.shard_id).is_none_or(|g| !excluded_groups.contains(&g)));
    }
    if let Some(max) = max_moves.and_then(|v| v.parse::<usize>().ok()) {
        moves.truncate(max);
    }
    Ok(moves)
}

/// The format code the client asked for column `i` (protocol rules: none, one
/// for all, or one per column).
fn column_format(formats: &[i16], i: usize) -> i16 {
    match formats.len() {
        0 => 0,
        1 => formats[0],
        _ => formats.get(i).copied().unwrap_or(0),
    }
}

/// A result value of a cluster function in text or binary format.
fn encode_value(text: Option<&str>, type_oid: u32, format: i16) -> Option<Vec<u8>> {
    let text = text?;
    if format == 0 {
        return Some(text.as_bytes().to_vec());
    }
    Some(match type_oid {
        INT4_OID => text.parse::<i32>().unwrap_or_default().to_be_bytes().to_vec(),
        INT8_OID => text.parse::<i64>().unwrap_or_default().to_be_bytes().to_vec(),
        TEXT_OID => text.as_bytes().to_vec(),
        BOOL_OID => vec![u8::from(text == "t")],
        _ => Vec::new(), // void's binary form is empty
    })
}

/// The one empty value a function returning void gives.
fn void_result(column: &str) -> (Vec<FieldDescription>, Vec<Vec<Option<String>>>) {
    (vec![FieldDescription::computed(column, VOID_OID, 4)], vec![vec![Some(String::new())]])
}

/// The distributed or reference table `name` (a regclass argument's text)
/// names, if it is one.
async fn named_table(ctx: &mut CommandContext<'_>, name: &str) -> PgResult<Option<Arc<DistributedTable>>> {
    let oid = ctx.parts.local().await?.query_value(&format!("SELECT {}::regclass::oid", crate::connection::quote_literal(name))).await?;
    Ok(oid.and_then(|o| o.parse().ok()).and_then(|o| ctx.catalog.table_by_oid(o).cloned()))
}

/// A query yielding a function's rows, typed as its columns are.
fn rows_query(fields: &[FieldDescription], rows: &[Vec<Option<String>>]) -> String {
    let type_name = |field: &FieldDescription| match field.type_oid {
        INT4_OID => "int4",
        INT8_OID => "int8",
        BOOL_OID => "bool",
        _ => "text",
    };
    let value = |v: &Option<String>, field: &FieldDescription| {
        format!("{}::{}", v.as_deref().map_or("NULL".into(), crate::connection::quote_literal), type_name(field))
    };
    if rows.is_empty() {
        let nulls: Vec<String> = fields.iter().map(|f| value(&None, f)).collect();
        return format!("SELECT {} WHERE false", nulls.join(", "));
    }
    let rows: Vec<String> =
        rows.iter().map(|row| format!("({})", row.iter().zip(fields).map(|(v, f)| value(v, f)).collect::<Vec<_>>().join(", "))).collect();
    format!("VALUES {}", rows.join(", "))
}

/// A row as one value of type record: in text, PostgreSQL's `(a,b,"c d")`
/// (a value quoted when empty or holding a delimiter, quote, backslash or
/// space; NULL as nothing); in binary, the column count, then each
/// column's type, length and binary value.
fn encode_record(row: &[Option<String>], fields: &[FieldDescription], format: i16) -> Vec<u8> {
    if format != 0 {
        let mut out = (row.len() as i32).to_be_bytes().to_vec();
        for (value, field) in row.iter().zip(fields) {
            out.extend(field.type_oid.to_be_bytes());
            match encode_value(value.as_deref(), field.type_oid, 1) {
                Some(bytes) => {
                    out.extend((bytes.len() as i32).to_be_bytes());
                    out.extend(bytes);
                }
                None => out.extend((-1i32).to_be_bytes()),
            }
        }
        return out;
    }
    let mut out = String::from("(");
    for (i, value) in row.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        let Some(value) = value else { continue };
        if value.is_empty() || value.chars().any(|c| matches!(c, '"' | '\\' | '(' | ')' | ',') || c.is_ascii_whitespace()) {
            out.push('"');
            for c in value.chars() {
                if matches!(c, '"' | '\\') {
                    out.push(c);
                }
                out.push(c);
            }
            out.push('"');
        } else {
            out.push_str(value);
        }
    }
    out.push(')');
    out.into_bytes()
}

/// Node management changes the cluster for every database user: only a
/// superuser may, as in Citus.
async fn require_superuser(ctx: &mut CommandContext<'_>, function: &str) -> PgResult<()> {
    let superuser = ctx.parts.local().await?.query_value("SELECT rolsuper FROM pg_catalog.pg_roles WHERE rolname = current_user").await?;
    if superuser.as_deref() != Some("t") {
        return Err(PgError::new(sqlstate::INSUFFICIENT_PRIVILEGE, format!("permission denied for function {function}"))
            .with_hint("Only a superuser may add or remove nodes."));
    }
    Ok(())
}

fn null_argument(name: &str) -> PgError {
    PgError::new(sqlstate::INVALID_PARAMETER_VALUE, format!("{name} cannot be NULL"))
}

fn invalid(message: &str) -> PgError {
    PgError::new(sqlstate::INVALID_PARAMETER_VALUE, message)
}

fn parse_port(value: Option<String>) -> PgResult<u16> {
    match value {
        None => Ok(5432),
        Some(v) => v.parse().map_err(|_| invalid(&format!("invalid port \"{v}\""))),
    }
}

/// Has the coordinator database evaluate the call's argument expressions, so
/// casts, named arguments and parameters all behave as in PostgreSQL.
async fn evaluate_arguments(call: &ClusterCall, ctx: &mut CommandContext<'_>, bound: Option<(&Bind, &[u32])>) -> PgResult<Vec<Option<String>>> {
    if call.arguments_sql.is_empty() {
        return Ok(Vec::new());
    }
    let local = ctx.parts.local().await?;
    let Some((bind, param_types)) = bound else {
        let rows = local.query(&call.arguments_sql).await?;
        return Ok(rows.into_iter().next().unwrap_or_default());
    };
    frontend::parse(local.out(), "", &call.arguments_sql, param_types);
    frontend::bind(local.out(), "", "", &bind.param_formats, &bind.params, &[]);
    frontend::execute(local.out(), "", 0);
    frontend::sync(local.out());
    let mut row = Vec::new();
    let mut error = None;
    loop {
        let msg = local.recv().await?;
        match msg.tag() {
            b'D' => row = backend::decode_text_row(&msg)?,
            b'E' => error = Some(local.server_error(&msg)),
            b'Z' => break,
            _ => {}
        }
    }
    match error {
        Some(e) => Err(e),
        None => Ok(row),
    }
}

/// Runs distributed DDL and writes its CommandComplete.
pub async fn run_ddl(plan: &DdlPlan, sql: &str, ctx: &mut CommandContext<'_>) -> PgResult<()> {
    refuse_disabled_placements(plan, &ctx.catalog)?;
    let tag = match plan {
        DdlPlan::Vacuum { stmt, .. } => run_vacuum(plan, stmt.is_vacuumcmd, sql, ctx).await?,
        DdlPlan::Checkpoint => run_everywhere(plan, sql, ctx).await?,
        DdlPlan::Lock { .. } => {
            if !ctx.parts.in_block() {
                return Err(PgError::new(sqlstate::NO_ACTIVE_SQL_TRANSACTION, "LOCK TABLE can only be used in transaction blocks"));
            }
            let tag = ctx.parts.local().await?.execute(sql).await?;
            run_node_statements(plan, ctx).await?;
            tag
        }
        DdlPlan::Propagate { .. } if plan.creates_index_concurrently() => create_index_concurrently(plan, sql, ctx).await?,
        DdlPlan::DropIndex(drop) if drop.is_concurrent() => {
            if ctx.parts.in_block() {
                return Err(PgError::new(sqlstate::ACTIVE_SQL_TRANSACTION, "DROP INDEX CONCURRENTLY cannot run inside a transaction block"));
            }
            let indexes = distributed_indexes(drop, ctx).await?;
            let tag = ctx.parts.local().await?.execute(sql).await?;
            let per_node = placement_groups(indexes.iter().map(|(_, t)| t))
                .into_iter()
                .map(|group| Ok((group, drop.shard_statements(&indexes, group)?)))
                .collect::<PgResult<_>>()?;
            if let Some((node, e)) = run_one_at_a_time(ctx, per_node).await?.into_iter().next() {
                return Err(e.with_context(format!("while dropping the index's copy on {node}")));
            }
            tag
        }
        DdlPlan::DropIndex(drop) => {
            let indexes = distributed_indexes(drop, ctx).await?;
            if indexes.is_empty() {
                // Indexes of local tables only: the coordinator database's business.
                ctx.parts.local().await?.execute(sql).await?
            } else {
                let implicit = ctx.parts.begin_implicit();
                let result = drop_distributed_indexes(drop, &indexes, sql, ctx).await;
                ctx.finish_block(implicit, result).await?
            }
        }
        _ => {
            let implicit = ctx.parts.begin_implicit();
            let result = run_ddl_in_block(plan, sql, ctx).await;
            ctx.finish_block(implicit, result).await?
        }
    };
    backend::command_complete(ctx.client()?.out(), &tag);
    Ok(())
}

/// VACUUM and ANALYZE: the coordinator database runs the statement, each node
/// its version for the shards it holds. VACUUM cannot run inside a transaction
/// block; ANALYZE can, and then runs through the block's connections.
async fn run_vacuum(plan: &DdlPlan, vacuum: bool, sql: &str, ctx: &mut CommandContext<'_>) -> PgResult<String> {
    if vacuum && ctx.parts.in_block() {
        return Err(PgError::new(sqlstate::ACTIVE_SQL_TRANSACTION, "VACUUM cannot run inside a transaction block"));
    }
    let tag = ctx.parts.local().await?.execute(sql).await?;
    run_node_statements(plan, ctx).await?;
    Ok(tag)
}

/// The indexes a DROP INDEX names that belong to distributed or reference
/// tables, with their table; the coordinator database knows whose they are.
async fn distributed_indexes(drop: &DropIndex, ctx: &mut CommandContext<'_>) -> PgResult<Vec<(String, Arc<DistributedTable>)>> {
    let rows = ctx.parts.local().await?.query(&drop.tables_sql()).await?;
    Ok(drop
        .index_names()
        .into_iter()
        .zip(rows)
        .filter_map(|(index, row)| {
            let oid = row.into_iter().next().flatten()?.parse().ok()?;
            Some((index, ctx.catalog.table_by_oid(oid)?.clone()))
        })
        .collect())
}

/// Drops (or renames) the indexes on the shell tables and their copies on
/// every shard.
async fn drop_distributed_indexes(
    drop: &DropIndex,
    indexes: &[(String, Arc<DistributedTable>)],
    sql: &str,
    ctx: &mut CommandContext<'_>,
) -> PgResult<String> {
    let tag = ctx.parts.local().await?.execute(sql).await?;
    run_per_group(ctx, placement_groups(indexes.iter().map(|(_, t)| t)), |group| drop.node_sql(indexes, group)).await?;
    Ok(tag)
}

async fn run_ddl_in_block(plan: &DdlPlan, sql: &str, ctx: &mut CommandContext<'_>) -> PgResult<String> {
    match plan {
        DdlPlan::Propagate { table, template, catalog_sql, relations } => {
            let (tag, chosen) = run_on_shell(plan, table, sql, ctx).await?;
            propagate_to_nodes(ctx, table, template, relations, &chosen, None).await?;
            let local = ctx.parts.local().await?;
            if let Some(catalog_sql) = catalog_sql {
                local.execute(catalog_sql).await?;
            }
            // Columns may have changed: coordinators read the table again,
            // and the fallback tier's foreign tables get rebuilt. Its
            // partitions are named as they were before the statement, which
            // may have detached one.
            let changed: Vec<String> =
                std::iter::once(table.oid).chain(ctx.catalog.partitions_under(table.oid).iter().map(|t| t.oid)).map(|oid| oid.to_string()).collect();
            local.execute(&format!("SELECT tessera.tables_changed('{{{}}}')", changed.join(","))).await?;
            Ok(tag)
        }
        DdlPlan::Drop { tables } => {
            for t in tables {
                run_on_nodes(ctx, None, |_| Ok(crate::planner::worker_relations::drop_sql(t))).await?;
            }
            run_node_statements(plan, ctx).await?;
            let local = ctx.parts.local().await?;
            for t in tables {
                local.execute(&delete_catalog_rows_sql(t)).await?;
            }
            local.execute(sql).await
        }
        DdlPlan::AddPartition { parent, partition } => {
            let local = ctx.parts.local().await?;
            let tag = local.execute(sql).await?;
            let name = match partition.schemaname.as_str() {
                "" => crate::connection::quote_ident(&partition.relname),
                schema => format!("{}.{}", crate::connection::quote_ident(schema), crate::connection::quote_ident(&partition.relname)),
            };
            let oid = local.query_value(&format!("SELECT {}::regclass::oid", crate::connection::quote_literal(&name))).await?;
            distribute::distribute_partition(ctx, parent, oid.and_then(|o| o.parse().ok()).unwrap_or(0)).await?;
            Ok(tag)
        }
        DdlPlan::DropFromTable { table, .. } => {
            let tag = ctx.parts.local().await?.execute(sql).await?;
            if let Some(parent_sql) = plan.parent_sql() {
                run_on_nodes(ctx, None, |_| Ok(vec![parent_sql.clone()])).await?;
            }
            let mut per_node: BTreeMap<i32, Vec<String>> = BTreeMap::new();
            for shard in &table.shards {
                let stmt = plan.drop_from_shard_sql(shard)?;
                for group in &shard.placements {
                    per_node.entry(*group).or_default().push(stmt.clone());
                }
            }
            run_per_node(ctx, per_node).await?;
            Ok(tag)
        }
        DdlPlan::Truncate { .. } | DdlPlan::Grant { .. } => {
            let sql =
                if matches!(plan, DdlPlan::Truncate { .. }) { format!("{}; {sql}", crate::metadata::ALLOW_SHELL_WRITES) } else { sql.to_string() };
            let tag = ctx.parts.local().await?.execute(&sql).await?;
            grant_on_nodes(plan, ctx, None).await?;
            Ok(tag)
        }
        DdlPlan::Everywhere { .. } => run_everywhere(plan, sql, ctx).await,
        DdlPlan::DropIndex(_) | DdlPlan::Vacuum { .. } | DdlPlan::Checkpoint | DdlPlan::Lock { .. } => unreachable!("{plan} runs on its own"),
    }
}

/// Refuses DDL on a table with shards on a disabled node, which would leave
/// them behind (a column change reaches the shards through each node's
/// worker-side parent, on the active nodes only).
fn refuse_disabled_placements(plan: &DdlPlan, catalog: &crate::metadata::Catalog) -> PgResult<()> {
    let groups = placement_groups(plan.tables());
    match catalog.nodes.iter().find(|n| !n.active && groups.contains(&n.group_id)) {
        Some(node) => Err(node.disabled_error()),
        None => Ok(()),
    }
}

/// Carries a propagated statement over to the nodes: to the worker-side
/// relations it changes (`RelationChanges`) and to every shard of `table`
/// (only those on node group `only_group`, when set).
pub(crate) async fn propagate_to_nodes(
    ctx: &mut CommandContext<'_>,
    table: &DistributedTable,
    template: &ShardTemplate,
    relations: &RelationChanges,
    chosen: &ChosenNames,
    only_group: Option<i32>,
) -> PgResult<()> {
    for table in relations.reshaped.iter().chain(&relations.rebuild_views) {
        run_on_nodes(ctx, only_group, |group| Ok(crate::planner::worker_relations::release_sql(table, group))).await?;
    }
    if let Some(parent_sql) = &relations.parent_sql {
        run_on_nodes(ctx, only_group, |group| {
            let mut statements = Vec::new();
            if relations.foreign_retype.is_some() {
                statements.extend(crate::planner::worker_relations::detach_foreign_sql(table, group));
            }
            statements.push(parent_sql.clone());
            if let Some(new_name) = &relations.renamed_to {
                statements.extend(crate::planner::worker_relations::rename_foreign_sql(table, new_name, group));
            }
            if let Some(retype) = &relations.foreign_retype {
                statements.extend(crate::planner::worker_relations::reattach_foreign_sql(table, retype, group)?);
            }
            Ok(statements)
        })
        .await?;
    }
    let mut per_node = shard_statements(table, template, chosen)?;
    if let Some(group) = only_group {
        per_node.retain(|g, _| *g == group);
    }
    run_per_node(ctx, per_node).await?;
    for table in relations.reshaped.iter().chain(&relations.rebuild_views) {
        worker_relations::create(ctx, table.oid, only_group).await?;
    }
    Ok(())
}

/// Runs on every active node (only on node group `only_group`, when set)
/// the statements `sql_for` gives for it, inside the current block: what
/// the worker-side relations need.
pub(crate) async fn run_on_nodes(
    ctx: &mut CommandContext<'_>,
    only_group: Option<i32>,
    sql_for: impl Fn(i32) -> PgResult<Vec<String>>,
) -> PgResult<()> {
    let mut per_node = BTreeMap::new();
    for node in ctx.catalog.active_nodes().filter(|n| only_group.is_none_or(|g| g == n.group_id)) {
        let statements = sql_for(node.group_id)?;
        if !statements.is_empty() {
            per_node.insert(node.group_id, statements);
        }
    }
    run_per_node(ctx, per_node).await
}

/// Runs a propagated statement on the coordinator database. Returns its
/// command tag and the names PostgreSQL chose for what it created without
/// a name (an index, constraints), found by comparing the table's indexes
/// and constraints before and after.
async fn run_on_shell(plan: &DdlPlan, table: &DistributedTable, sql: &str, ctx: &mut CommandContext<'_>) -> PgResult<(String, ChosenNames)> {
    let local = ctx.parts.local().await?;
    let unnamed_index = plan.creates_unnamed_index();
    let unnamed_constraints = plan.unnamed_constraint_kinds();
    if !unnamed_index && unnamed_constraints.is_empty() {
        return Ok((local.execute(sql).await?, ChosenNames::default()));
    }
    let names_sql = format!(
        "SELECT c.relname, 'i' FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid WHERE i.indrelid = {0} AND NOT EXISTS (SELECT FROM pg_constraint k WHERE k.conindid = i.indexrelid)
         UNION ALL
         SELECT * FROM (SELECT conname::text, contype::text FROM pg_constraint WHERE conrelid = {0} ORDER BY oid) k",
        table.oid
    );
    let before = local.query(&names_sql).await?;
    let tag = local.execute(sql).await?;
    let mut new: Vec<(String, String)> = local
        .query(&names_sql)
        .await?
        .into_iter()
        .filter(|row| !before.contains(row))
        .filter_map(|row| match row.as_slice() {
            [Some(name), Some(kind)] => Some((name.clone(), kind.clone())),
            _ => None,
        })
        .collect();
    let mut chosen = ChosenNames::default();
    if unnamed_index {
        chosen.index = new.iter().find(|(_, kind)| kind == "i").map(|(name, _)| name.clone());
    }
    for kind in unnamed_constraints {
        if let Some(at) = new.iter().position(|(_, k)| k.starts_with(kind)) {
            chosen.constraints.push(new.remove(at).0);
        }
    }
    Ok((tag, chosen))
}

/// CREATE INDEX CONCURRENTLY: the shell's index, then each shard's, one at
/// a time and each in its own transaction, as PostgreSQL builds one.
/// Writes go on meanwhile. Shards where the build failed are reported
/// together; their copies are left invalid, as PostgreSQL leaves its own.
async fn create_index_concurrently(plan: &DdlPlan, sql: &str, ctx: &mut CommandContext<'_>) -> PgResult<String> {
    let DdlPlan::Propagate { table, template, .. } = plan else { unreachable!("{plan} creates no index") };
    if ctx.parts.in_block() {
        return Err(PgError::new(sqlstate::ACTIVE_SQL_TRANSACTION, "CREATE INDEX CONCURRENTLY cannot run inside a transaction block"));
    }
    let (tag, chosen) = run_on_shell(plan, table, sql, ctx).await?;
    let failures = run_one_at_a_time(ctx, labeled_shard_statements(table, template, &chosen)?).await?;
    if failures.is_empty() {
        return Ok(tag);
    }
    let name = chosen.index.unwrap_or_else(|| "the index".into());
    Err(PgError::new(
        failures[0].1.code(),
        format!("CREATE INDEX CONCURRENTLY failed on {} of {} shards of \"{}\"", failures.len(), table.shards.len(), table.name),
    )
    .with_detail(failures.iter().map(|(at, e)| format!("{at}: {}", e.message())).collect::<Vec<_>>().join("\n"))
    .with_hint(format!("Fix the cause, then DROP INDEX CONCURRENTLY {name} and create it again.")))
}

/// Runs each statement on its own (outside any transaction block, as
/// CONCURRENTLY requires), going on past failures; returns them, each with
/// the shard (the statement's label) and node it happened on.
async fn run_one_at_a_time(ctx: &mut CommandContext<'_>, per_node: BTreeMap<i32, Vec<(String, String)>>) -> PgResult<Vec<(String, PgError)>> {
    let mut failures = Vec::new();
    for (group, statements) in per_node {
        let node = ctx.catalog.node_for_group(group).ok_or_else(|| PgError::internal(format!("no node for group {group}")))?.clone();
        for (shard, sql) in statements {
            let worker = ctx.parts.worker(&node, Access::Write).await?;
            if let Err(e) = worker.conn.execute(&sql).await {
                failures.push((format!("shard {shard} on node {}", node.addr), e));
            }
        }
    }
    Ok(failures)
}

/// Catalog rows of a table, for DROP TABLE and undistribute_table.
pub(crate) fn delete_catalog_rows_sql(t: &DistributedTable) -> String {
    format!("SELECT tessera.forget_distribution({})", t.oid)
}

/// Runs the statement on the coordinator database, then on every active
/// worker (CHECKPOINT, statements about roles).
async fn run_everywhere(plan: &DdlPlan, sql: &str, ctx: &mut CommandContext<'_>) -> PgResult<String> {
    let local = ctx.parts.local().await?;
    if let DdlPlan::Everywhere { forget, .. } = plan {
        for t in forget {
            local.execute(&delete_catalog_rows_sql(t)).await?;
        }
    }
    let roles = match plan {
        DdlPlan::Everywhere { roles, .. } => roles,
        _ => &RoleChange::None,
    };
    if let RoleChange::Dropped(names) = roles {
        local.execute(&crate::metadata::forget_roles_sql("tessera", names)).await?;
    }
    let tag = local.execute(sql).await?;
    if let RoleChange::Named(names) = roles {
        // The nodes' links log in as the new roles with these certificates.
        let mut nodes: Vec<ServerAddr> = ctx.catalog.active_nodes().map(|n| n.addr.clone()).collect();
        nodes.push(ctx.coordinator.config.coordinator_db_addr());
        crate::connection::node_tls::provide_on_nodes(&nodes, &ctx.coordinator.config.service_login(), Some(names)).await?;
    }
    let mut per_node = BTreeMap::new();
    for node in ctx.catalog.active_nodes() {
        // Function copies may follow what changes; they are made again on demand.
        let mut statements = vec![crate::planner::function_copy::drop_all_sql()];
        if let RoleChange::Dropped(names) = roles {
            statements.push(crate::planner::worker_relations::forget_roles_sql(names));
        }
        statements.push(plan.node_sql(node.group_id)?);
        if matches!(roles, RoleChange::Named(_)) {
            statements.push(crate::planner::worker_relations::MAP_ROLES_SQL.to_string());
        }
        per_node.insert(node.group_id, statements);
    }
    run_per_node(ctx, per_node).await?;
    if matches!(plan, DdlPlan::Everywhere { .. }) {
        // Coordinators learn the nodes' oids of new types, and which
        // functions reach distributed tables, when they reload.
        ctx.parts.local().await?.execute("SELECT tessera.user_code_changed()").await?;
    }
    Ok(tag)
}

/// Runs a DROP TABLE, TRUNCATE, VACUUM or GRANT on every node holding shards
/// of its tables, each node naming its own shards.
async fn run_node_statements(plan: &DdlPlan, ctx: &mut CommandContext<'_>) -> PgResult<()> {
    run_per_group(ctx, placement_groups(plan.tables()), |group| plan.node_sql(group)).await
}

/// Carries a GRANT/REVOKE (or TRUNCATE) to the shards and to the worker-side
/// relations, on every node or only on node group `only_group`.
pub(crate) async fn grant_on_nodes(plan: &DdlPlan, ctx: &mut CommandContext<'_>, only_group: Option<i32>) -> PgResult<()> {
    let groups = placement_groups(plan.tables()).into_iter().filter(|g| only_group.is_none_or(|only| only == *g)).collect();
    run_per_group(ctx, groups, |group| plan.node_sql(group)).await?;
    if let Some(parent_sql) = plan.parent_sql() {
        run_on_nodes(ctx, only_group, |_| Ok(vec![parent_sql.clone()])).await?;
    }
    Ok(())
}

/// Runs on each node group the statement `sql_for` gives for it (inside the
/// current block, if any).
async fn run_per_group(ctx: &mut CommandContext<'_>, groups: BTreeSet<i32>, sql_for: impl Fn(i32) -> PgResult<String>) -> PgResult<()> {
    let per_node = groups.into_iter().map(|group| Ok((group, vec![sql_for(group)?]))).collect::<PgResult<_>>()?;
    run_per_node(ctx, per_node).await
}

/// Every row of one shard placement, in COPY text format.
pub(crate) async fn read_shard_rows(
    ctx: &mut CommandContext<'_>,
    node: &crate::metadata::Node,
    table: &DistributedTable,
    shard: &crate::metadata::Shard,
) -> PgResult<Vec<bytes::Bytes>> {
    let mut rows = Vec::new();
    let worker = ctx.parts.worker(node, Access::Read).await?;
    worker
        .conn
        .copy_out(&format!("COPY {} TO STDOUT", table.qualified_shard_name(shard)), |row| {
            rows.push(row);
            Ok(())
        })
        .await?;
    Ok(rows)
}

/// A propagated statement for every shard of `table`, by the node group that
/// runs it.
fn shard_statements(table: &DistributedTable, template: &ShardTemplate, chosen: &ChosenNames) -> PgResult<BTreeMap<i32, Vec<String>>> {
    let labeled = labeled_shard_statements(table, template, chosen)?;
    Ok(labeled.into_iter().map(|(group, statements)| (group, statements.into_iter().map(|(_, sql)| sql).collect())).collect())
}

/// `shard_statements`, each with the name of the shard it is for.
fn labeled_shard_statements(
    table: &DistributedTable,
    template: &ShardTemplate,
    chosen: &ChosenNames,
) -> PgResult<BTreeMap<i32, Vec<(String, String)>>> {
    let mut per_node: BTreeMap<i32, Vec<(String, String)>> = BTreeMap::new();
    for shard in &table.shards {
        let Some(stmt) = DdlPlan::shard_sql(table, template, shard.index, chosen)? else { continue };
        for group in &shard.placements {
            per_node.entry(*group).or_default().push((table.shard_relname(shard), stmt.clone()));
        }
    }
    Ok(per_node)
}

/// Runs each node's statements as one batch on the session's connection to it
/// (inside the current block), all nodes at once; the first error by node
/// group, which names its node, is the outcome.
pub(crate) async fn run_per_node(ctx: &mut CommandContext<'_>, mut per_node: BTreeMap<i32, Vec<String>>) -> PgResult<()> {
    if let Some(search_path) = ctx.search_path_sql().await? {
        for statements in per_node.values_mut() {
            statements.insert(0, search_path.clone());
        }
    }
    let nodes = per_node
        .keys()
        .map(|group| ctx.catalog.node_for_group(*group).cloned().ok_or_else(|| PgError::internal(format!("no node for group {group}"))))
        .collect::<PgResult<Vec<_>>>()?;
    let runs = connections_to(ctx.parts, &nodes).await?.into_iter().map(|worker| {
        let batch = per_node[&worker.group_id].join(";\n");
        async move { worker.conn.execute(&batch).await }
    });
    // In node-group order, as the connections are.
    futures::future::join_all(runs).await.into_iter().try_for_each(|outcome| outcome.map(|_| ()))
}

/// The session's connections to `nodes` (inside the current block), to use
/// side by side, in node-group order: they are taken in that order, as
/// every statement takes them.
pub(crate) async fn connections_to<'p>(parts: &'p mut Participants, nodes: &[crate::metadata::Node]) -> PgResult<Vec<&'p mut WorkerConnection>> {
    let mut nodes: Vec<&crate::metadata::Node> = nodes.iter().collect();
    nodes.sort_by_key(|node| node.group_id);
    for node in &nodes {
        parts.worker(node, Access::Write).await?;
    }
    let groups: Vec<i32> = nodes.iter().map(|node| node.group_id).collect();
    let mut connections = parts.workers_for(&groups);
    connections.sort_by_key(|worker| worker.group_id);
    Ok(connections)
}
