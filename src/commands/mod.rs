//! Cluster-management functions and distributed DDL: the statements the
//! coordinator carries out itself, across the coordinator database and workers.

mod distribute;
mod nodes;
pub mod table_ddl;

use crate::error::{sqlstate, PgError, PgResult};
use crate::metadata::{Catalog, DistributedTable};
use crate::planner::{ClusterCall, ClusterFunction, DdlPlan};
use crate::protocol::backend::{self, FieldDescription};
use crate::protocol::frontend::{self, Bind};
use crate::server::client::ClientConn;
use crate::server::Coordinator;
use crate::transaction::Participants;
use std::collections::BTreeMap;
use std::sync::Arc;

/// What a command needs from the session running it.
pub struct CommandContext<'a> {
    pub coordinator: &'a Coordinator,
    pub parts: &'a mut Participants,
    pub client: &'a mut ClientConn,
    pub catalog: Arc<Catalog>,
}

impl CommandContext<'_> {
    /// Sends a NOTICE to the client right away (progress of long operations).
    pub async fn notice(&mut self, message: String) {
        backend::notice_response(self.client.out(), &PgError::notice(message));
        let _ = self.client.flush().await;
    }
}

const VOID_OID: u32 = 2278;
const INT4_OID: u32 = 23;

/// Runs a cluster function and writes its result set (the RowDescription only
/// when `describe` is set, as the extended protocol has described it already).
/// `bound` holds the client's Bind and parameter types for an extended-protocol
/// call (its arguments may be parameters).
pub async fn run_cluster_function(call: &ClusterCall, ctx: &mut CommandContext<'_>, bound: Option<(&Bind, &[u32])>) -> PgResult<()> {
    if ctx.parts.in_block() {
        return Err(PgError::new(
            sqlstate::INVALID_TRANSACTION_STATE,
            format!("{} cannot run inside a transaction block", call.column_name),
        ));
    }
    let args = evaluate_arguments(call, ctx, bound).await?;
    let arg = |i: usize| args.get(i).cloned().flatten();
    let (fields, rows): (Vec<FieldDescription>, Vec<Vec<Option<String>>>) = match call.function {
        ClusterFunction::CreateDistributedTable => {
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
            (vec![FieldDescription::computed(&call.column_name, VOID_OID, 4)], vec![vec![Some(String::new())]])
        }
        ClusterFunction::CreateReferenceTable => {
            let table = arg(0).ok_or_else(|| null_argument("table_name"))?;
            distribute::create_reference_table(ctx, &table).await?;
            (vec![FieldDescription::computed(&call.column_name, VOID_OID, 4)], vec![vec![Some(String::new())]])
        }
        ClusterFunction::UndistributeTable => {
            let table = arg(0).ok_or_else(|| null_argument("table_name"))?;
            distribute::undistribute_table(ctx, &table).await?;
            (vec![FieldDescription::computed(&call.column_name, VOID_OID, 4)], vec![vec![Some(String::new())]])
        }
        ClusterFunction::AddNode => {
            let name = arg(0).ok_or_else(|| null_argument("nodename"))?;
            let port = parse_port(arg(1))?;
            let id = nodes::add_node(ctx, &name, port).await?;
            (vec![FieldDescription::computed(&call.column_name, INT4_OID, 4)], vec![vec![Some(id.to_string())]])
        }
        ClusterFunction::RemoveNode => {
            let name = arg(0).ok_or_else(|| null_argument("nodename"))?;
            let port = parse_port(arg(1))?;
            nodes::remove_node(ctx, &name, port).await?;
            (vec![FieldDescription::computed(&call.column_name, VOID_OID, 4)], vec![vec![Some(String::new())]])
        }
    };
    if bound.is_none() {
        // The extended protocol described the result already.
        backend::row_description(ctx.client.out(), &fields);
    }
    let formats = bound.map(|(bind, _)| bind.result_formats.as_slice()).unwrap_or(&[]);
    for row in &rows {
        let values: Vec<Option<Vec<u8>>> = row.iter().zip(&fields).enumerate().map(|(i, (v, f))| encode_value(v.as_deref(), f.type_oid, column_format(formats, i))).collect();
        backend::data_row(ctx.client.out(), values.iter().map(|v| v.as_deref()));
    }
    backend::command_complete(ctx.client.out(), &format!("SELECT {}", rows.len()));
    Ok(())
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
        _ => Vec::new(), // void's binary form is empty
    })
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
            b'D' => row = backend::decode_data_row(&msg)?.into_iter().map(|v| v.map(|b| String::from_utf8_lossy(&b).into_owned())).collect(),
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
    if let DdlPlan::Vacuum { tables, analyze_only, options } = plan {
        if ctx.parts.in_block() {
            let what = if *analyze_only { "ANALYZE" } else { "VACUUM" };
            return Err(PgError::new(sqlstate::INVALID_TRANSACTION_STATE, format!("{what} cannot run inside a transaction block")));
        }
        let tag = ctx.parts.local().await?.execute(sql).await?;
        let command = if *analyze_only { "ANALYZE" } else { "VACUUM" };
        for (node, shards) in shards_by_node(&ctx.catalog, tables)? {
            let worker = ctx.parts.worker(&node).await?;
            worker.conn.execute(&format!("{command} {options} {}", shards.join(", "))).await?;
        }
        backend::command_complete(ctx.client.out(), &tag);
        return Ok(());
    }
    let implicit = ctx.parts.begin_implicit();
    let result = run_ddl_in_block(plan, sql, ctx).await;
    let tag = finish_block(ctx, implicit, result).await?;
    backend::command_complete(ctx.client.out(), &tag);
    Ok(())
}

/// Commits (or rolls back) the block a command opened for itself, then refreshes
/// the catalog snapshot so the session's next statement sees the change.
pub(crate) async fn finish_block<T>(ctx: &mut CommandContext<'_>, implicit: bool, result: PgResult<T>) -> PgResult<T> {
    if implicit {
        if result.is_ok() {
            ctx.parts.commit().await?;
        } else {
            ctx.parts.rollback().await.ok();
        }
    }
    let value = result?;
    ctx.coordinator.reload_catalog().await?;
    Ok(value)
}

async fn run_ddl_in_block(plan: &DdlPlan, sql: &str, ctx: &mut CommandContext<'_>) -> PgResult<String> {
    match plan {
        DdlPlan::Propagate { table, template, catalog_sql } => {
            let tag = ctx.parts.local().await?.execute(sql).await?;
            let mut per_node: BTreeMap<i32, Vec<String>> = BTreeMap::new();
            for shard in &table.shards {
                let stmt = DdlPlan::shard_sql(table, template, shard.index)?;
                for group in &shard.placements {
                    per_node.entry(*group).or_default().push(stmt.clone());
                }
            }
            run_per_node(ctx, per_node).await?;
            if let Some(catalog_sql) = catalog_sql {
                ctx.parts.local().await?.execute(catalog_sql).await?;
            }
            Ok(tag)
        }
        DdlPlan::Drop { tables } => {
            let mut per_node: BTreeMap<i32, Vec<String>> = BTreeMap::new();
            for (node, shards) in shards_by_node(&ctx.catalog, tables)? {
                per_node.insert(node.group_id, vec![format!("DROP TABLE IF EXISTS {} CASCADE", shards.join(", "))]);
            }
            run_per_node(ctx, per_node).await?;
            let local = ctx.parts.local().await?;
            for t in tables {
                local.execute(&delete_catalog_rows_sql(t)).await?;
            }
            local.execute(sql).await
        }
        DdlPlan::Truncate { tables } => {
            let tag = ctx.parts.local().await?.execute(sql).await?;
            let mut per_node: BTreeMap<i32, Vec<String>> = BTreeMap::new();
            for (node, shards) in shards_by_node(&ctx.catalog, tables)? {
                per_node.insert(node.group_id, vec![format!("TRUNCATE TABLE {}", shards.join(", "))]);
            }
            run_per_node(ctx, per_node).await?;
            Ok(tag)
        }
        DdlPlan::Vacuum { .. } => unreachable!("VACUUM runs outside a transaction block"),
    }
}

/// Catalog rows of a table, for DROP TABLE and undistribute_table.
pub(crate) fn delete_catalog_rows_sql(t: &DistributedTable) -> String {
    format!(
        "DELETE FROM tessera.pg_dist_placement WHERE shardid IN (SELECT shardid FROM tessera.pg_dist_shard WHERE logicalrelid = {oid}::regclass);
         DELETE FROM tessera.pg_dist_shard WHERE logicalrelid = {oid}::regclass;
         DELETE FROM tessera.pg_dist_partition WHERE logicalrelid = {oid}::regclass;",
        oid = t.oid
    )
}

/// Every shard placement of the tables, grouped by the node holding it.
fn shards_by_node(catalog: &Catalog, tables: &[Arc<DistributedTable>]) -> PgResult<Vec<(crate::metadata::Node, Vec<String>)>> {
    let mut out: Vec<(crate::metadata::Node, Vec<String>)> = Vec::new();
    for t in tables {
        for shard in &t.shards {
            for group in &shard.placements {
                let node = catalog.node_for_group(*group).ok_or_else(|| PgError::internal(format!("no node for group {group}")))?;
                match out.iter_mut().find(|(n, _)| n.group_id == *group) {
                    Some((_, list)) => list.push(t.qualified_shard_name(shard)),
                    None => out.push((node.clone(), vec![t.qualified_shard_name(shard)])),
                }
            }
        }
    }
    Ok(out)
}

/// Runs each node's statements as one batch on the session's connection to it
/// (inside the current block), naming the node in any error.
async fn run_per_node(ctx: &mut CommandContext<'_>, per_node: BTreeMap<i32, Vec<String>>) -> PgResult<()> {
    for (group, statements) in per_node {
        let node = ctx.catalog.node_for_group(group).ok_or_else(|| PgError::internal(format!("no node for group {group}")))?.clone();
        let worker = ctx.parts.worker(&node).await?;
        worker.conn.execute(&statements.join(";\n")).await?;
    }
    Ok(())
}
