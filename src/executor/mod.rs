//! Runs router plans on worker connections and forwards their results to the
//! client. Result rows are passed on as the frames the worker sent, never
//! decoded; only command tags are combined when a statement ran as several tasks.

use crate::error::{PgError, PgResult};
use crate::metadata::{Catalog, Node};
use crate::planner::{KeyValue, RouterPlan, ShardTarget};
use crate::protocol::backend;
use crate::protocol::frontend::{self, Bind};
use crate::server::client::ClientConn;
use crate::transaction::{Participants, WorkerConnection};
use std::sync::Arc;

pub mod multi_shard;

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

/// One statement for one node.
struct Task {
    node: Node,
    sql: Arc<str>,
}

/// Runs a router plan and writes its rows and CommandComplete to the client.
pub async fn run_router(plan: &RouterPlan, parts: &mut Participants, catalog: &Catalog, mode: &Mode<'_>, client: &mut ClientConn) -> PgResult<()> {
    let defaults = evaluate_key_defaults(plan, parts).await?;
    let tasks = plan_tasks(plan, parts, catalog, mode, defaults)?;
    let implicit = tasks.len() > 1 && plan.is_write() && parts.begin_implicit();
    let result = run_tasks(plan, tasks, parts, mode, client).await;
    if implicit {
        if result.is_ok() {
            parts.commit().await?;
        } else {
            parts.rollback().await.ok();
        }
    }
    let tag = result?;
    backend::command_complete(client.out(), &tag);
    Ok(())
}

/// Values for INSERT rows that leave the distribution column to its default
/// (typically a sequence living in the coordinator database), one per such row.
async fn evaluate_key_defaults(plan: &RouterPlan, parts: &mut Participants) -> PgResult<Vec<String>> {
    let ShardTarget::InsertRows(keys) = &plan.target else { return Ok(Vec::new()) };
    let n = keys.iter().filter(|k| matches!(k, KeyValue::Default)).count();
    let Some(default_sql) = plan.insert_key.as_ref().and_then(|k| k.default_sql.as_deref()).filter(|_| n > 0) else {
        return Ok(Vec::new());
    };
    let rows = parts.local().await?.query(&format!("SELECT ({default_sql})::text FROM generate_series(1, {n})")).await?;
    rows.into_iter()
        .map(|r| r.into_iter().next().flatten().ok_or_else(|| PgError::new(crate::error::sqlstate::NOT_NULL_VIOLATION, "cannot perform an INSERT with NULL in the partition column")))
        .collect()
}

fn node_of_group<'c>(catalog: &'c Catalog, group: i32) -> PgResult<&'c Node> {
    catalog.node_for_group(group).ok_or_else(|| PgError::internal(format!("no node for group {group} in the catalog")))
}

fn plan_tasks(plan: &RouterPlan, parts: &Participants, catalog: &Catalog, mode: &Mode<'_>, defaults: Vec<String>) -> PgResult<Vec<Task>> {
    let group_node = |index: u32| -> PgResult<Node> {
        let anchor = plan.anchor.as_ref().ok_or_else(|| PgError::internal("sharded plan without anchor table"))?;
        let shard = anchor.shards.get(index as usize).ok_or_else(|| PgError::internal(format!("shard index {index} missing")))?;
        let group = *shard.placements.first().ok_or_else(|| PgError::internal(format!("shard {} has no placement", shard.id)))?;
        Ok(node_of_group(catalog, group)?.clone())
    };
    let param = |index: usize| -> PgResult<(Option<&[u8]>, bool)> {
        match mode {
            Mode::Extended { bind, .. } => {
                let value = bind.params.get(index).ok_or_else(|| PgError::new(crate::error::sqlstate::PROTOCOL_VIOLATION, format!("no value bound for parameter ${}", index + 1)))?;
                Ok((value.as_deref(), bind.param_format(index) == 1))
            }
            Mode::Simple => Err(PgError::new(crate::error::sqlstate::PROTOCOL_VIOLATION, format!("there is no parameter ${}", index + 1))),
        }
    };
    Ok(match &plan.target {
        ShardTarget::Shard(i) => vec![Task { node: group_node(*i)?, sql: plan.sql_for_shard(*i)? }],
        ShardTarget::Param { index } => {
            let (value, binary) = param(*index)?;
            let i = plan.shard_for_param(value, binary)?;
            vec![Task { node: group_node(i)?, sql: plan.sql_for_shard(i)? }]
        }
        ShardTarget::Reference => {
            let sql = plan.sql_for_shard(0)?;
            let table = plan.template.tables().iter().find(|t| t.is_reference()).ok_or_else(|| PgError::internal("reference plan without a reference table"))?;
            let groups = &table.shards.first().ok_or_else(|| PgError::internal("reference table without shard"))?.placements;
            if plan.is_write() {
                groups.iter().map(|g| Ok(Task { node: node_of_group(catalog, *g)?.clone(), sql: sql.clone() })).collect::<PgResult<_>>()?
            } else {
                // Prefer a node this transaction already uses, so it sees its own writes.
                let g = groups.iter().find(|g| parts.has_worker_in_block(**g)).or(groups.first()).ok_or_else(|| PgError::internal("reference table without placement"))?;
                vec![Task { node: node_of_group(catalog, *g)?.clone(), sql }]
            }
        }
        ShardTarget::InsertRows(keys) => {
            let mut by_shard: Vec<(u32, Vec<usize>)> = Vec::new();
            let mut defaults = defaults.into_iter();
            let mut filled: Vec<(usize, String)> = Vec::new();
            for (row, key) in keys.iter().enumerate() {
                let shard = match key {
                    KeyValue::Literal(text) => plan.shard_for_text(text)?,
                    KeyValue::Default => {
                        let value = defaults.next().ok_or_else(|| PgError::internal("missing default value for INSERT row"))?;
                        let shard = plan.shard_for_text(&value)?;
                        filled.push((row, value));
                        shard
                    }
                    KeyValue::Param(index) => {
                        let (value, binary) = param(*index)?;
                        if value.is_none() {
                            return Err(PgError::new(crate::error::sqlstate::NOT_NULL_VIOLATION, "cannot perform an INSERT with NULL in the partition column"));
                        }
                        plan.shard_for_param(value, binary)?
                    }
                };
                match by_shard.iter_mut().find(|(s, _)| *s == shard) {
                    Some((_, rows)) => rows.push(row),
                    None => by_shard.push((shard, vec![row])),
                }
            }
            match by_shard.as_slice() {
                [(shard, _)] if filled.is_empty() => vec![Task { node: group_node(*shard)?, sql: plan.sql_for_shard(*shard)? }],
                _ => by_shard
                    .into_iter()
                    .map(|(shard, rows)| Ok(Task { node: group_node(shard)?, sql: Arc::from(plan.insert_rows_sql(shard, &rows, &filled)?) }))
                    .collect::<PgResult<_>>()?,
            }
        }
    })
}

/// Runs the tasks one after another and returns the combined command tag.
async fn run_tasks(plan: &RouterPlan, tasks: Vec<Task>, parts: &mut Participants, mode: &Mode<'_>, client: &mut ClientConn) -> PgResult<String> {
    // Writes to every placement of a reference table return the same rows from
    // each; the client sees them once.
    let replicated = matches!(plan.target, ShardTarget::Reference) && plan.is_write();
    let mut total: u64 = 0;
    let mut tag_prefix = String::new();
    for (i, task) in tasks.iter().enumerate() {
        let worker = parts.worker(&task.node).await?;
        let relay_rows = !replicated || i == 0;
        let result = run_task(worker, &task.sql, mode, client, relay_rows, i == 0).await;
        if result.is_err() {
            parts.discard_broken();
        }
        let tag = result?;
        let (prefix, count) = split_tag(&tag);
        if i == 0 {
            tag_prefix = prefix.to_string();
        }
        if !replicated || i == 0 {
            total += count.unwrap_or(0);
        }
        if tasks.len() == 1 {
            return Ok(tag);
        }
    }
    Ok(if tag_prefix.is_empty() { total.to_string() } else { format!("{tag_prefix} {total}") })
}

fn split_tag(tag: &str) -> (&str, Option<u64>) {
    match tag.rsplit_once(' ') {
        Some((prefix, n)) if n.parse::<u64>().is_ok() => (prefix, n.parse().ok()),
        _ => (tag, None),
    }
}

/// Sends one statement to a worker and forwards its result rows.
async fn run_task(w: &mut WorkerConnection, sql: &Arc<str>, mode: &Mode<'_>, client: &mut ClientConn, relay_rows: bool, first: bool) -> PgResult<String> {
    let mut parse_pending = false;
    let synced = match mode {
        Mode::Simple => {
            frontend::query(w.conn.out(), sql);
            true
        }
        Mode::Extended { bind, param_types, sync } => {
            let (name, needs_parse) = w.statement_name(sql);
            if needs_parse {
                frontend::parse(w.conn.out(), &name, sql, param_types);
                parse_pending = true;
            }
            frontend::bind(w.conn.out(), "", &name, &bind.param_formats, &bind.params, &bind.result_formats);
            frontend::execute(w.conn.out(), "", 0);
            if *sync {
                frontend::sync(w.conn.out());
            } else {
                frontend::flush(w.conn.out());
                w.needs_sync = true;
            }
            *sync
        }
    };
    let mut tag = None;
    let mut error = None;
    loop {
        let msg = w.conn.recv().await?;
        match msg.tag() {
            b'1' => parse_pending = false,
            b'T' => {
                if relay_rows && first {
                    client.out().extend_from_slice(msg.frame());
                }
            }
            b'D' => {
                if relay_rows {
                    client.out().extend_from_slice(msg.frame());
                    client.flush_if_large().await?;
                }
            }
            b'C' => {
                tag = Some(backend::decode_command_complete(&msg)?.to_string());
                if !synced {
                    break;
                }
            }
            b'I' => {
                tag = Some(String::new());
                if !synced {
                    break;
                }
            }
            b'N' => client.out().extend_from_slice(msg.frame()),
            b'E' => {
                if parse_pending {
                    // A failed Parse leaves no statement behind; parse again next time.
                    w.forget_statement(sql);
                }
                error = Some(w.conn.server_error(&msg));
                if !synced {
                    break;
                }
            }
            b'Z' => break,
            _ => {}
        }
    }
    match (error, tag) {
        (Some(e), _) => Err(e),
        (None, Some(tag)) => Ok(tag),
        (None, None) => Err(PgError::internal(format!("node {} ended a statement without a command tag", w.conn.label()))),
    }
}
