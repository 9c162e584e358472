//! Runs router plans on worker connections and forwards their results to the
//! client. Result rows are passed on as the frames the worker sent, never
//! decoded; only command tags are combined when a statement ran as several
//! tasks. Multi-row INSERTs are split by shard here too.

use super::{function_copies, multi_shard, Mode};
use crate::connection::client::ClientConn;
use crate::error::{sqlstate, PgError, PgResult};
use crate::metadata::{Catalog, Node};
use crate::planner::{Command, Delegation, FilledValues, KeyRouting, KeyValue, RouterPlan, ShardTarget};
use crate::protocol::backend;
use crate::protocol::frontend::{self, Target};
use crate::transaction::{Access, Participants, WorkerConnection};
use bytes::Bytes;
use std::sync::Arc;

/// One statement for one node.
pub(super) struct Task {
    pub(super) group: i32,
    pub(super) sql: Arc<str>,
    /// The VALUES rows of a multi-row INSERT this task carries, in order
    /// (empty when it carries the whole statement).
    pub(super) rows: Vec<usize>,
}

/// Runs a router plan and writes its rows and CommandComplete to the client.
pub async fn run_router(plan: &RouterPlan, parts: &mut Participants, catalog: &Catalog, mode: &Mode<'_>, client: &mut ClientConn) -> PgResult<()> {
    let tag = run_router_for_tag(plan, parts, catalog, mode, client).await?;
    backend::command_complete(client.out(), &tag);
    Ok(())
}

/// Runs a router plan, writing its rows (if any) to the client; returns the
/// command tag for the caller to report or add up.
pub(crate) async fn run_router_for_tag(
    plan: &RouterPlan,
    parts: &mut Participants,
    catalog: &Catalog,
    mode: &Mode<'_>,
    client: &mut ClientConn,
) -> PgResult<String> {
    let defaults = evaluate_defaults(plan, parts).await?;
    let tasks = plan_tasks(plan, parts, mode, defaults).await?;
    let implicit = tasks.len() > 1 && plan.is_write() && parts.begin_implicit();
    let result = if tasks.len() > 1 && matches!(plan.target, ShardTarget::InsertRows(_)) {
        // Rows for several shards: every node's part at once, not shard by shard.
        run_insert_tasks(tasks, parts, catalog, mode, client).await
    } else {
        run_tasks(plan, tasks, parts, catalog, mode, client).await
    };
    parts.end_implicit(implicit, result).await
}

/// Values of the sequence defaults an INSERT leaves to the coordinator, in
/// one round trip to the coordinator database: the distribution column's
/// (one per row that leaves it to its default) and each other filled
/// column's (one per row the fill lists). As in PostgreSQL, a role that may
/// not insert into the table hears so, not that it may not use the sequence.
pub(super) async fn evaluate_defaults(plan: &RouterPlan, parts: &mut Participants) -> PgResult<Defaults> {
    let Some(insert) = plan.insert_key.as_ref() else { return Ok(Defaults::default()) };
    let key_rows = match &plan.target {
        ShardTarget::InsertRows(keys) => keys.iter().filter(|k| matches!(k, KeyValue::Default)).count(),
        _ => 0,
    };
    let mut parts_sql = Vec::new();
    if let (Some(default_sql), true) = (&insert.default_sql, key_rows > 0) {
        parts_sql.push((0, default_sql.as_str(), key_rows));
    }
    for (i, fill) in insert.fills.iter().enumerate() {
        parts_sql.push((i + 1, fill.default_sql.as_str(), fill.rows.len()));
    }
    if parts_sql.is_empty() {
        return Ok(Defaults::default());
    }
    let sql = parts_sql
        .iter()
        .map(|(i, default_sql, n)| {
            format!("(SELECT {i}, ({default_sql})::text FROM generate_series(1, {n}) WHERE has_table_privilege({}, 'INSERT'))", insert.table.0)
        })
        .collect::<Vec<_>>()
        .join(" UNION ALL ");
    let mut defaults = Defaults { key: Vec::new(), others: vec![Vec::new(); insert.fills.len()] };
    let rows = parts.local().await?.query(&sql).await?;
    if rows.is_empty() {
        return Err(PgError::new(sqlstate::INSUFFICIENT_PRIVILEGE, format!("permission denied for table {}", insert.table.1)));
    }
    for row in rows {
        let mut row = row.into_iter();
        let which: usize = row.next().flatten().and_then(|i| i.parse().ok()).unwrap_or_default();
        let value = row.next().flatten().ok_or_else(null_key)?;
        match which {
            0 => defaults.key.push(value),
            i => defaults.others[i - 1].push(value),
        }
    }
    Ok(defaults)
}

/// Sequence values the coordinator drew for an INSERT: see `evaluate_defaults`.
#[derive(Default)]
pub(super) struct Defaults {
    key: Vec<String>,
    others: Vec<Vec<String>>,
}

fn null_key() -> PgError {
    PgError::new(sqlstate::NOT_NULL_VIOLATION, "cannot perform an INSERT with NULL in the partition column")
}

/// The node user code runs on. Inside a block, the one node the block wrote
/// on, if any: on another, its reads of that node's shards would go through
/// postgres_fdw's own transaction, which cannot see the block's writes.
/// Otherwise the first node, always the same one, so that a call that
/// succeeds (its writes reaching only that node's shards) always does.
fn user_code_node(groups: &[i32], parts: &Participants) -> PgResult<i32> {
    match parts.block_writers().as_slice() {
        [] => groups
            .iter()
            .copied()
            .find(|g| parts.has_worker_in_block(*g))
            .or(groups.first().copied())
            .ok_or_else(|| PgError::internal("no active node to run user code on")),
        [one] => Ok(*one),
        _ => Err(PgError::not_supported(
            "this transaction has written on several nodes, and user code running on one of them would not see the others' writes",
        )
        .with_hint("Call the function before the transaction's writes, or in a transaction of its own.")),
    }
}

pub(super) fn node_of_group(catalog: &Catalog, group: i32) -> PgResult<&Node> {
    catalog.node_for_group(group).ok_or_else(|| PgError::internal(format!("no node for group {group} in the catalog")))
}

/// A key value as the executor sees it: bytes, their type and format.
struct KeyInput<'a> {
    value: Option<&'a [u8]>,
    type_oid: u32,
    binary: bool,
}

fn key_input<'a>(key: &'a KeyValue, mode: &'a Mode<'_>) -> PgResult<KeyInput<'a>> {
    match key {
        KeyValue::Literal { text, type_oid, .. } => Ok(KeyInput { value: Some(text.as_bytes()), type_oid: *type_oid, binary: false }),
        KeyValue::Param(index) => match mode {
            Mode::Extended { bind, param_types, .. } => {
                let value = bind
                    .params
                    .get(*index)
                    .ok_or_else(|| PgError::new(sqlstate::PROTOCOL_VIOLATION, format!("no value bound for parameter ${}", index + 1)))?;
                Ok(KeyInput {
                    value: value.as_deref(),
                    type_oid: param_types.get(*index).copied().unwrap_or(0),
                    binary: bind.param_format(*index) == 1,
                })
            }
            Mode::Simple => Err(PgError::new(sqlstate::PROTOCOL_VIOLATION, format!("there is no parameter ${}", index + 1))),
        },
        KeyValue::Default => Err(PgError::internal("column default reached key resolution unevaluated")),
    }
}

/// The shard group of a key value: hashed here when that is exact, otherwise
/// first coerced to the column type by the coordinator database (which also
/// raises PostgreSQL's own error for a value the type rejects). None for NULL.
async fn shard_of(plan: &RouterPlan, parts: &mut Participants, input: KeyInput<'_>) -> PgResult<Option<u32>> {
    let Some(value) = input.value else { return Ok(None) };
    let routing = plan.key_routing().ok_or_else(|| PgError::internal("router plan without a key"))?;
    if let Some(shard) = routing.local_shard(value, input.type_oid, input.binary) {
        return Ok(Some(shard));
    }
    let coerced = coerce_keys(parts, &routing, input.type_oid, input.binary, &[value]).await.map_err(|(_, e)| e)?;
    coerced.into_iter().next().flatten().map(|v| routing.shard_for_coerced(&v)).transpose()
}

/// Converts key values (all of one type and format) to the distribution
/// column's type in the coordinator database, in one round trip: the
/// conversion is parsed once and bound once per value. Returns the converted
/// values in binary form, or the position of the first value the type
/// rejected with PostgreSQL's error.
pub(super) async fn coerce_keys(
    parts: &mut Participants,
    routing: &KeyRouting<'_>,
    type_oid: u32,
    binary: bool,
    values: &[&[u8]],
) -> Result<Vec<Option<Bytes>>, (usize, PgError)> {
    const NAME: &str = "tessera_key";
    let local = parts.local().await.map_err(|e| (0, e))?;
    let out = local.out();
    frontend::close(out, Target::Statement, NAME);
    frontend::parse(out, NAME, &routing.coercion_sql(), &[type_oid]);
    for value in values {
        frontend::bind(out, "", NAME, &[i16::from(binary)], &[Some(Bytes::copy_from_slice(value))], &[1]);
        frontend::execute(out, "", 0);
    }
    frontend::close(out, Target::Statement, NAME);
    frontend::sync(out);
    let mut coerced = Vec::with_capacity(values.len());
    let mut error = None;
    loop {
        let msg = match local.recv().await {
            Ok(msg) => msg,
            Err(e) => return Err((coerced.len(), e)),
        };
        match msg.tag() {
            b'D' => match backend::decode_data_row(&msg) {
                Ok(row) => coerced.push(row.into_iter().next().flatten()),
                Err(e) => error = error.or(Some(e.into())),
            },
            b'E' => error = error.or(Some(local.server_error(&msg))),
            b'Z' => break,
            _ => {}
        }
    }
    parts.observe_local_status();
    match error {
        Some(e) => Err((coerced.len(), e)),
        None => Ok(coerced),
    }
}

pub(super) async fn plan_tasks(plan: &RouterPlan, parts: &mut Participants, mode: &Mode<'_>, defaults: Defaults) -> PgResult<Vec<Task>> {
    let group_node = |index: u32| -> PgResult<i32> {
        let anchor = plan.anchor.as_ref().ok_or_else(|| PgError::internal("sharded plan without anchor table"))?;
        let shard = anchor.shards.get(index as usize).ok_or_else(|| PgError::internal(format!("shard index {index} missing")))?;
        shard.placements.first().copied().ok_or_else(|| PgError::internal(format!("shard {} has no placement", shard.id)))
    };
    Ok(match &plan.target {
        ShardTarget::Shard(i) => vec![Task { group: group_node(*i)?, sql: plan.sql_for_shard(*i)?, rows: Vec::new() }],
        ShardTarget::Key(key) => {
            let i = match shard_of(plan, parts, key_input(key, mode)?).await? {
                Some(i) => i,
                None if plan.command == crate::planner::Command::Insert => return Err(null_key()),
                // `dist_col = NULL` matches no row; any shard answers that correctly.
                None => 0,
            };
            vec![Task { group: group_node(i)?, sql: plan.sql_for_shard(i)?, rows: Vec::new() }]
        }
        ShardTarget::Reference => {
            let sql = match plan.insert_key.as_ref().filter(|_| defaults.others.iter().any(|v| !v.is_empty())) {
                Some(insert) => {
                    plan.insert_rows_sql(0, &(0..insert.rows).collect::<Vec<_>>(), &FilledValues { key: Vec::new(), others: defaults.others })?
                }
                None => plan.sql_for_shard(0)?,
            };
            let table = plan
                .template
                .tables()
                .iter()
                .find(|t| t.is_reference())
                .ok_or_else(|| PgError::internal("reference plan without a reference table"))?;
            let groups = &table.shards.first().ok_or_else(|| PgError::internal("reference table without shard"))?.placements;
            if plan.is_write() {
                groups.iter().map(|g| Task { group: *g, sql: sql.clone(), rows: Vec::new() }).collect()
            } else {
                // Prefer a node this transaction already uses, so it sees its own writes.
                let g = groups
                    .iter()
                    .find(|g| parts.has_worker_in_block(**g))
                    .or(groups.first())
                    .ok_or_else(|| PgError::internal("reference table without placement"))?;
                vec![Task { group: *g, sql, rows: Vec::new() }]
            }
        }
        ShardTarget::SameKeys(keys) => {
            let i = shard_of_all(plan, parts, keys, mode)
                .await?
                .ok_or_else(|| PgError::internal("key values in different shard groups reached the router"))?;
            vec![Task { group: group_node(i)?, sql: plan.sql_for_shard(i)?, rows: Vec::new() }]
        }
        ShardTarget::AnyNode(groups) => vec![Task { group: user_code_node(groups, parts)?, sql: plan.sql_for_shard(0)?, rows: Vec::new() }],
        ShardTarget::InsertRows(keys) => {
            let mut by_shard: Vec<(u32, Vec<usize>)> = Vec::new();
            let mut key_defaults = defaults.key.into_iter();
            let mut filled = FilledValues { key: Vec::new(), others: defaults.others };
            for (row, key) in keys.iter().enumerate() {
                let shard = match key {
                    KeyValue::Default => {
                        let value = key_defaults.next().ok_or_else(|| PgError::internal("missing default value for INSERT row"))?;
                        let input = KeyInput { value: Some(value.as_bytes()), type_oid: 0, binary: false };
                        let shard = shard_of(plan, parts, input).await?;
                        filled.key.push((row, value));
                        shard
                    }
                    other => shard_of(plan, parts, key_input(other, mode)?).await?,
                }
                .ok_or_else(null_key)?;
                add_row_to_shard(&mut by_shard, shard, row);
            }
            match by_shard.as_slice() {
                [(shard, rows)] if filled.is_empty() => {
                    vec![Task { group: group_node(*shard)?, sql: plan.sql_for_shard(*shard)?, rows: rows.clone() }]
                }
                _ => by_shard
                    .into_iter()
                    .map(|(shard, rows)| Ok(Task { group: group_node(shard)?, sql: plan.insert_rows_sql(shard, &rows, &filled)?, rows }))
                    .collect::<PgResult<_>>()?,
            }
        }
    })
}

/// Files statement row `row` under its shard, keeping shards in the order
/// their first rows came and each shard's rows in statement order.
pub(super) fn add_row_to_shard(by_shard: &mut Vec<(u32, Vec<usize>)>, shard: u32, row: usize) {
    match by_shard.iter_mut().find(|(s, _)| *s == shard) {
        Some((_, rows)) => rows.push(row),
        None => by_shard.push((shard, vec![row])),
    }
}

/// Runs the tasks of a multi-row INSERT that reaches several shard groups:
/// each node gets its shards' INSERTs in one write and the nodes work in
/// parallel, as multi-shard statements do.
async fn run_insert_tasks(
    tasks: Vec<Task>,
    parts: &mut Participants,
    catalog: &Catalog,
    mode: &Mode<'_>,
    client: &mut ClientConn,
) -> PgResult<String> {
    let mut routed = RoutedInsert::default();
    for task in tasks {
        routed.add(node_of_group(catalog, task.group)?, task, 0, false);
    }
    let rows = routed.run(parts, mode, matches!(mode, Mode::Simple), client).await?;
    Ok(format!("INSERT 0 {rows}"))
}

/// The INSERT tasks that carry a statement's rows to the shards, by node,
/// with the statement row behind each row a node's tasks will return.
#[derive(Default)]
pub(super) struct RoutedInsert {
    by_node: multi_shard::TasksByNode,
    /// Per node; None for a node whose rows repeat another's.
    input_rows: Vec<Option<Vec<usize>>>,
}

impl RoutedInsert {
    /// Adds a task whose rows are the statement's from `first_row` on;
    /// `replica`: another placement of a reference table, whose returned rows
    /// the first placement already gives.
    pub(super) fn add(&mut self, node: &Node, task: Task, first_row: usize, replica: bool) {
        multi_shard::add_task(&mut self.by_node, node, task.sql);
        let slot = self.by_node.iter().position(|(n, _)| n.group_id == node.group_id).unwrap_or_default();
        self.input_rows.resize(self.by_node.len(), Some(Vec::new()));
        match (&mut self.input_rows[slot], replica) {
            (Some(inputs), false) => inputs.extend(task.rows.into_iter().map(|r| first_row + r)),
            (slot, _) => *slot = None,
        }
    }

    pub(super) fn is_empty(&self) -> bool {
        self.by_node.is_empty()
    }

    /// Runs every task; returns the rows inserted.
    pub(super) async fn run(&self, parts: &mut Participants, mode: &Mode<'_>, describe: bool, client: &mut ClientConn) -> PgResult<u64> {
        multi_shard::run_in_input_order(parts, &self.by_node, &self.input_rows, mode, describe, client).await
    }
}

/// Runs the tasks one after another and returns the combined command tag.
async fn run_tasks(
    plan: &RouterPlan,
    tasks: Vec<Task>,
    parts: &mut Participants,
    catalog: &Catalog,
    mode: &Mode<'_>,
    client: &mut ClientConn,
) -> PgResult<String> {
    // Writes to every placement of a reference table return the same rows from
    // each; the client sees them once.
    let replicated = matches!(plan.target, ShardTarget::Reference) && plan.is_write();
    let mut total: u64 = 0;
    let mut tag_prefix = String::new();
    for (i, task) in tasks.iter().enumerate() {
        let access = if plan.is_write() { Access::Write } else { Access::Read };
        let node = node_of_group(catalog, task.group)?;
        if plan.command == Command::WholeOnWorker {
            parts.follow_session_settings(node, access).await?;
        }
        let worker = parts.worker(node, access).await?;
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
async fn run_task(
    w: &mut WorkerConnection,
    sql: &Arc<str>,
    mode: &Mode<'_>,
    client: &mut ClientConn,
    relay_rows: bool,
    first: bool,
) -> PgResult<String> {
    let mut parse_pending = false;
    let synced = match mode {
        Mode::Simple => {
            frontend::query(w.conn.out(), sql);
            true
        }
        Mode::Extended { bind, param_types, sync } => {
            let (name, needs_parse) = w.prepare(sql, param_types);
            parse_pending |= needs_parse;
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
            b'T' if relay_rows && first => {
                client.out().extend_from_slice(w.client_row_description(msg)?.frame());
            }
            b'D' if relay_rows => {
                client.out().extend_from_slice(msg.frame());
                client.flush_if_large().await?;
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
            b'N' => function_copies::relay_notice(&msg, client),
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

/// Whether the key values of a `ShardTarget::SameKeys` plan fall in one
/// shard group this execution, so that the router plan may run.
pub async fn keys_meet(plan: &RouterPlan, parts: &mut Participants, mode: &Mode<'_>) -> PgResult<bool> {
    let ShardTarget::SameKeys(keys) = &plan.target else { return Ok(true) };
    Ok(shard_of_all(plan, parts, keys, mode).await?.is_some())
}

/// The one shard group all `keys` hash to (a NULL key matches no row, so it
/// goes anywhere), or None when they fall in several.
async fn shard_of_all(plan: &RouterPlan, parts: &mut Participants, keys: &[KeyValue], mode: &Mode<'_>) -> PgResult<Option<u32>> {
    let mut found = None;
    for key in keys {
        match (shard_of(plan, parts, key_input(key, mode)?).await?, found) {
            (Some(shard), Some(earlier)) if shard != earlier => return Ok(None),
            (Some(shard), _) => found = Some(shard),
            (None, _) => {}
        }
    }
    Ok(Some(found.unwrap_or(0)))
}

/// Whether a call of a distributed function goes to its shard's node now:
/// outside transaction blocks, or inside with `force_delegation`, or when
/// it would run on some worker anyway (it reaches distributed tables: the
/// node its argument picks is the one whose shards it mostly reads); unless
/// the session set `citus.enable_function_delegation` off.
pub async fn delegates(delegation: &Delegation, parts: &mut Participants) -> PgResult<bool> {
    if !parts.citus_settings().await?.function_delegation {
        return Ok(false);
    }
    let runs_on_a_worker = matches!(&delegation.otherwise, crate::planner::Plan::Router(r) if r.command == Command::WholeOnWorker);
    Ok(delegation.force_delegation || !parts.in_block() || runs_on_a_worker)
}
