//! Multi-shard SELECT: one task per shard group, pipelined on each node's
//! connection; rows are concatenated, or partial aggregates are combined by the
//! coordinator database so that types and arithmetic are exactly PostgreSQL's.

use super::Mode;
use crate::connection::{quote_ident, quote_literal};
use crate::error::{PgError, PgResult};
use crate::metadata::{Catalog, Node};
use crate::planner::{Combine, MultiShardPlan};
use crate::protocol::backend;
use crate::protocol::frontend::{self, Target};
use crate::server::client::ClientConn;
use crate::transaction::{Access, Participants};
use std::sync::Arc;

/// What a node's results are for.
enum Sink<'a> {
    /// Forwarded to the client; `describe` says whether a RowDescription is still owed.
    Client { client: &'a mut ClientConn, describe: bool },
    /// Collected as text rows with their column types and names.
    Partials { rows: Vec<Vec<Option<String>>>, fields: Vec<backend::FieldDescription> },
}

pub async fn run(plan: &MultiShardPlan, parts: &mut Participants, catalog: &Catalog, mode: &Mode<'_>, client: &mut ClientConn) -> PgResult<()> {
    let mut by_node: Vec<(Node, Vec<Arc<str>>)> = Vec::new();
    for shard in &plan.anchor.shards {
        let group = *shard.placements.first().ok_or_else(|| PgError::internal(format!("shard {} has no placement", shard.id)))?;
        let node = catalog.node_for_group(group).ok_or_else(|| PgError::internal(format!("no node for group {group}")))?;
        let sql: Arc<str> = Arc::from(plan.template.sql_for_shard(shard.index)?);
        match by_node.iter_mut().find(|(n, _)| n.group_id == group) {
            Some((_, list)) => list.push(sql),
            None => by_node.push((node.clone(), vec![sql])),
        }
    }
    match &plan.combine {
        Combine::Concatenate => {
            let access = if plan.is_write() { Access::Write } else { Access::Read };
            // A write on several shards is one distributed transaction.
            let implicit = plan.is_write() && parts.begin_implicit();
            let mut sink = Sink::Client { client, describe: matches!(mode, Mode::Simple) };
            let mut result = Ok(0);
            for (node, sqls) in &by_node {
                match run_on_node(parts, node, access, sqls, mode, &mut sink).await {
                    Ok(rows) => result = result.map(|total| total + rows),
                    Err(e) => {
                        result = Err(e);
                        break;
                    }
                }
            }
            if implicit {
                if result.is_ok() {
                    parts.commit().await?;
                } else {
                    parts.rollback().await.ok();
                }
            }
            let total = result?;
            let Sink::Client { client, .. } = sink else { unreachable!() };
            backend::command_complete(client.out(), &format!("{} {total}", plan.command.tag()));
            Ok(())
        }
        Combine::Aggregate(kinds) => {
            let mut sink = Sink::Partials { rows: Vec::new(), fields: Vec::new() };
            for (node, sqls) in &by_node {
                run_on_node(parts, node, Access::Read, sqls, mode, &mut sink).await?;
            }
            let Sink::Partials { rows, fields } = sink else { unreachable!() };
            let sql = combine_sql(kinds, &fields, &rows)?;
            super::run_on_coordinator_db(parts, &sql, mode, false, client).await
        }
    }
}

/// Sends every task for one node at once and reads the results in order.
async fn run_on_node(parts: &mut Participants, node: &Node, access: Access, sqls: &[Arc<str>], mode: &Mode<'_>, sink: &mut Sink<'_>) -> PgResult<u64> {
    let w = parts.worker(node, access).await?;
    let text_results = matches!(sink, Sink::Partials { .. });
    for sql in sqls {
        match mode {
            Mode::Simple => frontend::query(w.conn.out(), sql),
            Mode::Extended { bind, param_types, .. } => {
                frontend::parse(w.conn.out(), "", sql, param_types);
                let formats: &[i16] = if text_results { &[] } else { &bind.result_formats };
                frontend::bind(w.conn.out(), "", "", &bind.param_formats, &bind.params, formats);
                if text_results {
                    frontend::describe(w.conn.out(), Target::Portal, "");
                }
                frontend::execute(w.conn.out(), "", 0);
                frontend::sync(w.conn.out());
            }
        }
    }
    let mut pending = sqls.len();
    let mut rows = 0u64;
    let mut error = None;
    while pending > 0 {
        let msg = match w.conn.recv().await {
            Ok(m) => m,
            Err(e) => {
                parts.discard_broken();
                return Err(e);
            }
        };
        match (msg.tag(), &mut *sink) {
            (b'Z', _) => pending -= 1,
            (b'E', _) => {
                error.get_or_insert_with(|| w.conn.server_error(&msg));
            }
            (b'C', _) => rows += backend::rows_in_tag(backend::decode_command_complete(&msg)?).unwrap_or(0),
            (b'T', Sink::Client { client, describe }) => {
                if *describe {
                    client.out().extend_from_slice(msg.frame());
                    *describe = false;
                }
            }
            (b'D', Sink::Client { client, .. }) => {
                client.out().extend_from_slice(msg.frame());
                client.flush_if_large().await?;
            }
            (b'N', Sink::Client { client, .. }) => client.out().extend_from_slice(msg.frame()),
            (b'T', Sink::Partials { fields, .. }) => *fields = backend::decode_row_description(&msg)?,
            (b'D', Sink::Partials { rows: collected, .. }) => collected.push(
                backend::decode_data_row(&msg)?.into_iter().map(|v| v.map(|b| String::from_utf8_lossy(&b).into_owned())).collect(),
            ),
            _ => {}
        }
    }
    match error {
        Some(e) => Err(e),
        None => Ok(rows),
    }
}

/// Names of the built-in types partial aggregates come back as.
fn type_name(oid: u32) -> Option<&'static str> {
    Some(match oid {
        16 => "bool",
        20 => "int8",
        21 => "int2",
        23 => "int4",
        25 => "text",
        700 => "float4",
        701 => "float8",
        790 => "money",
        1042 => "bpchar",
        1043 => "varchar",
        1082 => "date",
        1083 => "time",
        1114 => "timestamp",
        1184 => "timestamptz",
        1186 => "interval",
        1700 => "numeric",
        2950 => "uuid",
        26 => "oid",
        _ => return None,
    })
}

/// `SELECT sum(c1)::int8 AS "count", … FROM (VALUES …) AS partials(c1, …)`.
fn combine_sql(kinds: &[crate::planner::PartialAggregate], fields: &[backend::FieldDescription], rows: &[Vec<Option<String>>]) -> PgResult<String> {
    if fields.len() != kinds.len() {
        return Err(PgError::internal("partial aggregate results do not match the plan"));
    }
    let types: Vec<&str> = fields
        .iter()
        .map(|f| type_name(f.type_oid).ok_or_else(|| PgError::not_supported(format!("combining aggregates of type oid {} across shards is not supported yet", f.type_oid))))
        .collect::<PgResult<_>>()?;
    let columns: Vec<String> = (1..=kinds.len()).map(|i| format!("c{i}")).collect();
    let targets: Vec<String> = kinds
        .iter()
        .zip(&types)
        .zip(fields)
        .enumerate()
        .map(|(i, ((k, t), f))| format!("{}(c{})::{t} AS {}", k.combine_function(), i + 1, quote_ident(&f.name)))
        .collect();
    let values: Vec<String> = rows
        .iter()
        .map(|r| {
            let items: Vec<String> = r
                .iter()
                .zip(&types)
                .map(|(v, t)| match v {
                    Some(v) => format!("{}::{t}", quote_literal(v)),
                    None => format!("NULL::{t}"),
                })
                .collect();
            format!("({})", items.join(", "))
        })
        .collect();
    Ok(format!("SELECT {} FROM (VALUES {}) AS partials({})", targets.join(", "), values.join(", "), columns.join(", ")))
}
