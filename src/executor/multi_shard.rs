//! Multi-shard statements: one task per shard group, pipelined on each node's
//! connection (a read's shared among several connections per node), all
//! nodes at once; rows are concatenated, or the shards' partial results are
//! combined by the coordinator database so that types and arithmetic are
//! exactly PostgreSQL's.

use super::partials::{self, PartialRows};
use super::Mode;
use crate::connection::client::ClientConn;
use crate::connection::{quote_ident, quote_literal, TextRow, TextRows};
use crate::error::{PgError, PgResult};
use crate::metadata::{Catalog, DistributedTable, Node};
use crate::planner::rewrite::ShardTemplate;
use crate::planner::{
    aggregate_placeholder, partial_column, sort_column, AggregateKind, Combine, CombineQuery, MultiShardPlan, PARTIALS_RELATION, VISIBLE_COLUMNS,
};
use crate::process::Coordinator;
use crate::protocol::backend;
use crate::protocol::frontend::{self, Target};
use crate::protocol::Message;
use crate::transaction::extra::ExtraWorker;
use crate::transaction::limits::StatementLimits;
use crate::transaction::{Access, Participants, WorkerConnection};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What a node's results are for.
enum Sink<'a> {
    /// Forwarded to the client; `describe` says whether a RowDescription is still owed.
    Client { client: &'a mut ClientConn, describe: bool },
    /// Collected, with their column types and names.
    Partials { rows: PartialRows, fields: Vec<backend::FieldDescription> },
    /// Held per node (by its index in the task list), to reach the client in
    /// the order of the rows the statement was given.
    PerNode { description: Option<Message>, rows: Vec<Vec<Message>> },
    /// Counted per node and dropped (EXPLAIN ANALYZE).
    Counted { started: Instant, nodes: Vec<NodeActivity> },
}

/// What a read's tasks did on one node, for EXPLAIN ANALYZE.
#[derive(Clone, Default)]
pub(super) struct NodeActivity {
    pub tasks: usize,
    pub connections: usize,
    pub rows: u64,
    /// DataRow bytes received.
    pub bytes: u64,
    /// When the node's last message came, from the start of the read.
    pub done: Duration,
}

/// Runs the tasks, counting what each node sends and dropping the rows:
/// EXPLAIN ANALYZE's figures, per node in `by_node` order.
pub(super) async fn count_activity(
    parts: &mut Participants,
    by_node: TasksByNode,
    access: Access,
    mode: &Mode<'_>,
) -> PgResult<Vec<(Node, NodeActivity)>> {
    let nodes = by_node.iter().map(|(_, sqls)| NodeActivity { tasks: sqls.len(), ..Default::default() }).collect();
    let mut sink = Sink::Counted { started: Instant::now(), nodes };
    run_on_nodes(parts, &by_node, access, mode, &mut sink).await?;
    let Sink::Counted { nodes, .. } = sink else { unreachable!() };
    Ok(by_node.into_iter().map(|(node, _)| node).zip(nodes).collect())
}

/// Each node with the SQL of the shard tasks it runs.
/// One node and the shard statements it runs.
pub(super) type NodeTasks = (Node, Vec<Arc<str>>);
pub(super) type TasksByNode = Vec<NodeTasks>;

/// One task per shard of `anchor` (and its co-located shard group).
pub(super) fn tasks_by_node(template: &ShardTemplate, anchor: &DistributedTable, catalog: &Catalog) -> PgResult<TasksByNode> {
    let mut by_node: TasksByNode = Vec::new();
    for (node, indexes) in shard_groups_by_node(anchor, catalog)? {
        for index in indexes {
            add_task(&mut by_node, node, Arc::from(template.sql_for_shard(index)?));
        }
    }
    Ok(by_node)
}

/// A read's tasks. Each node's shard groups are split into as many tasks as
/// connections the read may use there, each task reading its groups in one
/// statement (`ShardTemplate::sql_for_shards`): what every shard group's
/// statement would repeat, such as scanning and hashing a joined reference
/// table, a node then does once per connection, and a two-phase aggregate
/// sends one partial row per group per task. Statements that cannot read
/// several groups at once, and sessions with `tessera.merge_shard_tasks`
/// off, get a task per shard group.
pub(super) async fn read_tasks_by_node(
    parts: &mut Participants,
    template: &ShardTemplate,
    anchor: &DistributedTable,
    catalog: &Catalog,
) -> PgResult<TasksByNode> {
    let narrowed = super::reference_keys::narrowed(parts, template, catalog).await?;
    let template = narrowed.as_ref().unwrap_or(template);
    let merged = match template.merged_read() {
        Some(read) if parts.citus_settings().await?.merge_shard_tasks => read,
        _ => return tasks_by_node(template, anchor, catalog),
    };
    // A block's EXPLAIN that failed (a statement with parameters) would
    // abort the block's transaction on the node: no pair merged there.
    if merged.joins_pair() && parts.in_block() {
        return tasks_by_node(template, anchor, catalog);
    }
    // A block reads on its one connection per node.
    let per_node = if parts.in_block() { 1 } else { parts.executor_pool_size().await? };
    let mut by_node: TasksByNode = Vec::new();
    let mut first_chunk: &[u32] = &[];
    let groups = shard_groups_by_node(anchor, catalog)?;
    for (node, indexes) in &groups {
        for chunk in indexes.chunks(indexes.len().div_ceil(per_node)) {
            if first_chunk.is_empty() {
                first_chunk = chunk;
            }
            add_task(&mut by_node, node, Arc::from(template.sql_for_shards(&merged, chunk)?));
        }
    }
    if merged.joins_pair() && !merging_pays(parts, template, &by_node, first_chunk).await {
        return tasks_by_node(template, anchor, catalog);
    }
    Ok(by_node)
}

/// Whether the first of the `merged` tasks, over shard groups `chunk` of
/// two co-located tables, costs less by its node's own estimates than a
/// statement per group. The union of the pairs' joins makes PostgreSQL join
/// each pair before the reference tables: cheaper where hashing the
/// reference tables once per group is what costs (TPC-H q3, q9), dearer
/// where they narrow the pairs' rows most (q7, q8: lineitem joined with
/// orders in full before `part` keeps one row in 150). A statement the
/// node cannot explain (it holds parameters) is not merged.
async fn merging_pays(parts: &mut Participants, template: &ShardTemplate, merged: &TasksByNode, chunk: &[u32]) -> bool {
    let Some((node, together)) = merged.first().and_then(|(node, sqls)| Some((node, sqls.first()?))) else { return false };
    let Some(Ok(alone)) = chunk.first().map(|first| template.sql_for_shard(*first)) else { return false };
    let Ok(worker) = parts.worker(node, Access::Read).await else { return false };
    let mut cost = async |sql: &str| {
        let plan = worker.conn.query_value(&format!("EXPLAIN {sql}")).await.ok().flatten()?;
        plan.split_once("..")?.1.split_whitespace().next()?.parse::<f64>().ok()
    };
    match (cost(together).await, cost(&alone).await) {
        (Some(together), Some(alone)) => together < alone * chunk.len() as f64,
        _ => false,
    }
}

/// The shard group indexes of `anchor` on each node, in shard order.
pub(super) fn shard_groups_by_node<'c>(anchor: &DistributedTable, catalog: &'c Catalog) -> PgResult<Vec<(&'c Node, Vec<u32>)>> {
    let mut groups: Vec<(&Node, Vec<u32>)> = Vec::new();
    for shard in &anchor.shards {
        let group = *shard.placements.first().ok_or_else(|| PgError::internal(format!("shard {} has no placement", shard.id)))?;
        let node = catalog.node_for_group(group).ok_or_else(|| PgError::internal(format!("no node for group {group}")))?;
        match groups.iter_mut().find(|(n, _)| n.group_id == group) {
            Some((_, indexes)) => indexes.push(shard.index),
            None => groups.push((node, vec![shard.index])),
        }
    }
    Ok(groups)
}

/// Adds a task for `node`, after the node's earlier ones.
pub(super) fn add_task(by_node: &mut TasksByNode, node: &Node, sql: Arc<str>) {
    match by_node.iter_mut().find(|(n, _)| n.group_id == node.group_id) {
        Some((_, list)) => list.push(sql),
        None => by_node.push((node.clone(), vec![sql])),
    }
}

/// Takes the session's connections to the nodes of `by_node` in node-group
/// order, whatever order the tasks run in (which decides the order of rows
/// RETURNING gives): every statement takes them in that one order, so that
/// waiting for a node's pool never closes a cycle of sessions waiting for
/// each other.
pub(super) async fn take_connections(parts: &mut Participants, by_node: &[NodeTasks], access: Access) -> PgResult<()> {
    let mut nodes: Vec<&Node> = by_node.iter().map(|(node, _)| node).collect();
    nodes.sort_by_key(|node| node.group_id);
    for node in nodes {
        parts.worker(node, access).await?;
    }
    Ok(())
}

/// Runs the tasks and collects their rows as text, with the columns.
pub(super) async fn collect_rows(
    parts: &mut Participants,
    by_node: &TasksByNode,
    mode: &Mode<'_>,
) -> PgResult<(Vec<backend::FieldDescription>, TextRows)> {
    let (fields, rows) = collect(parts, by_node, mode, PartialRows::new(false)).await?;
    Ok((fields, rows.into_text()?))
}

/// Runs the tasks and collects their rows for a combining statement
/// (`partials::stage`), with the columns.
pub(super) async fn collect_partials(
    parts: &mut Participants,
    by_node: &TasksByNode,
    mode: &Mode<'_>,
) -> PgResult<(Vec<backend::FieldDescription>, PartialRows)> {
    let rows = PartialRows::new(!parts.in_block());
    collect(parts, by_node, mode, rows).await
}

async fn collect(
    parts: &mut Participants,
    by_node: &TasksByNode,
    mode: &Mode<'_>,
    rows: PartialRows,
) -> PgResult<(Vec<backend::FieldDescription>, PartialRows)> {
    let mut sink = Sink::Partials { rows, fields: Vec::new() };
    run_on_nodes(parts, by_node, Access::Read, mode, &mut sink).await?;
    let Sink::Partials { rows, fields } = sink else { unreachable!() };
    Ok((fields, rows))
}

pub async fn run(
    plan: &MultiShardPlan,
    coordinator: &Coordinator,
    parts: &mut Participants,
    catalog: &Catalog,
    mode: &Mode<'_>,
    client: &mut ClientConn,
) -> PgResult<()> {
    match &plan.combine {
        Combine::Concatenate => {
            let by_node = match plan.is_write() {
                true => tasks_by_node(&plan.template, &plan.anchor, catalog)?,
                false => read_tasks_by_node(parts, &plan.template, &plan.anchor, catalog).await?,
            };
            // A write on several shards is one distributed transaction.
            let implicit = plan.is_write() && parts.begin_implicit();
            let result = run_concatenated(parts, &by_node, plan.is_write(), mode, client).await;
            let total = parts.end_implicit(implicit, result).await?;
            backend::command_complete(client.out(), &format!("{} {total}", plan.command.tag()));
            Ok(())
        }
        Combine::Query(query) => run_combined(plan, query, coordinator, parts, catalog, mode, client).await,
        Combine::Percentiles { passes, shipped } => super::percentiles::run(plan, passes, shipped, coordinator, parts, catalog, mode, client).await,
    }
}

/// Runs a read whose shards' rows the coordinator database's `query`
/// finishes, sending its rows to the client.
pub(super) async fn run_combined(
    plan: &MultiShardPlan,
    query: &CombineQuery,
    coordinator: &Coordinator,
    parts: &mut Participants,
    catalog: &Catalog,
    mode: &Mode<'_>,
    client: &mut ClientConn,
) -> PgResult<()> {
    if let Some(approximate) = super::approximate_distinct::replanned(query, catalog, parts).await? {
        return Box::pin(run(&approximate, coordinator, parts, catalog, mode, client)).await;
    }
    if let Some(moved) = super::repartition::by_distinct_column(query, &plan.anchor, catalog, parts).await? {
        return Box::pin(super::repartition::run(moved, coordinator, catalog, parts, mode, client)).await;
    }
    let by_node = read_tasks_by_node(parts, &plan.template, &plan.anchor, catalog).await?;
    let (fields, rows) = collect_partials(parts, &by_node, mode).await?;
    let types = shard_type_names(parts, catalog, &fields).await?;
    match combine_sql(query, &fields, &types)? {
        Some(combine) => {
            let staged = partials::stage(parts, &types, rows).await?;
            let outcome = match combine.read_from(&staged.relation, parts.limits()) {
                Ok(sql) => super::run_on_coordinator_db(parts, &sql, mode, client).await,
                Err(e) => Err(e),
            };
            partials::release(parts, staged, outcome).await
        }
        None => match &query.fallback {
            Some(fallback) => Box::pin(super::fallback::run(fallback, coordinator, catalog, parts, mode, client)).await,
            None => Err(PgError::not_supported("these aggregates cannot be combined exactly across shards")),
        },
    }
}

/// Runs the nodes' tasks with their rows going straight to the client: all
/// nodes at once, or one after another for writes when the session asked for
/// sequential multi-shard writes. Returns the rows the command tags report.
pub(super) async fn run_concatenated(
    parts: &mut Participants,
    by_node: &TasksByNode,
    write: bool,
    mode: &Mode<'_>,
    client: &mut ClientConn,
) -> PgResult<u64> {
    let access = if write { Access::Write } else { Access::Read };
    let mut sink = Sink::Client { client, describe: matches!(mode, Mode::Simple) };
    let sequential = write && parts.citus_settings().await?.sequential_modify;
    let rounds: Vec<&[NodeTasks]> = if sequential { by_node.chunks(1).collect() } else { vec![by_node] };
    let mut total = 0;
    for round in rounds {
        total += run_on_nodes(parts, round, access, mode, &mut sink).await?.iter().sum::<u64>();
    }
    Ok(total)
}

/// Runs the INSERT tasks that route a statement's rows to the shards and
/// sends the rows they return in the order of the statement's own rows, as
/// PostgreSQL would (ORMs match RETURNING rows to their objects by position).
/// `input_rows[i]` gives, for node `i`, the input row behind each row its
/// tasks return, or None for a node whose rows repeat another's (reference
/// table replicas). When a node returns a different number of rows (ON
/// CONFLICT DO NOTHING), its rows follow in the order they came.
/// `describe`: the client still needs the RowDescription.
pub(super) async fn run_in_input_order(
    parts: &mut Participants,
    by_node: &TasksByNode,
    input_rows: &[Option<Vec<usize>>],
    mode: &Mode<'_>,
    describe: bool,
    client: &mut ClientConn,
) -> PgResult<u64> {
    let sequential = parts.citus_settings().await?.sequential_modify;
    let round_size = if sequential { 1 } else { by_node.len().max(1) };
    let (mut description, mut rows, mut counts) = (None, Vec::new(), Vec::new());
    for round in by_node.chunks(round_size) {
        let mut sink = Sink::PerNode { description: None, rows: vec![Vec::new(); round.len()] };
        counts.extend(run_on_nodes(parts, round, Access::Write, mode, &mut sink).await?);
        let Sink::PerNode { description: round_description, rows: round_rows } = sink else { unreachable!() };
        description = description.or(round_description);
        rows.extend(round_rows);
    }
    let total = counts.iter().zip(input_rows).filter(|(_, inputs)| inputs.is_some()).map(|(n, _)| n).sum();
    if let (Some(description), true) = (description, describe) {
        client.out().extend_from_slice(description.frame());
    }
    let mut in_order: Vec<Option<Message>> = Vec::new();
    let mut unordered: Vec<Message> = Vec::new();
    for (node_rows, inputs) in rows.into_iter().zip(input_rows) {
        match inputs {
            None => {}
            Some(inputs) if inputs.len() == node_rows.len() => {
                for (input, row) in inputs.iter().zip(node_rows) {
                    if in_order.len() <= *input {
                        in_order.resize(*input + 1, None);
                    }
                    in_order[*input] = Some(row);
                }
            }
            Some(_) => unordered.extend(node_rows),
        }
    }
    for row in in_order.into_iter().flatten().chain(unordered) {
        client.out().extend_from_slice(row.frame());
        client.flush_if_large().await?;
    }
    Ok(total)
}

impl Sink<'_> {
    /// Takes a message of node `node`; rows it holds count against the
    /// statement's memory.
    async fn accept(&mut self, node: usize, msg: &Message, limits: &StatementLimits) -> PgResult<()> {
        match (msg.tag(), self) {
            (b'T', Sink::PerNode { description, .. }) => {
                description.get_or_insert_with(|| msg.clone());
            }
            (b'D', Sink::PerNode { rows, .. }) => {
                limits.charge(msg.frame().len())?;
                rows[node].push(msg.clone());
            }
            (b'T', Sink::Client { client, describe }) if *describe => {
                client.out().extend_from_slice(msg.frame());
                *describe = false;
            }
            (b'D', Sink::Client { client, .. }) => {
                client.out().extend_from_slice(msg.frame());
                client.flush_if_large().await?;
            }
            (b'N', Sink::Client { client, .. }) => client.out().extend_from_slice(msg.frame()),
            (b'T', Sink::Partials { fields, .. }) => *fields = backend::decode_row_description(msg)?,
            (b'D', Sink::Partials { rows, .. }) => rows.push(msg, limits)?,
            (b'D', Sink::Counted { started, nodes }) => {
                nodes[node].rows += 1;
                nodes[node].bytes += msg.frame().len() as u64;
                nodes[node].done = started.elapsed();
            }
            (_, Sink::Counted { started, nodes }) => nodes[node].done = started.elapsed(),
            _ => {}
        }
        Ok(())
    }
}

/// Runs every node's tasks at once, and their rows reach the sink as they
/// arrive. A read may run a node's tasks on several connections (see
/// `SharedTasks`); anything else sends all of a node's tasks in one write
/// on the session's connection. The first part to fail stops the others
/// (through the statement's limits), whose work would be wasted. Returns
/// the rows each node's command tags report.
async fn run_on_nodes(parts: &mut Participants, by_node: &[NodeTasks], access: Access, mode: &Mode<'_>, sink: &mut Sink<'_>) -> PgResult<Vec<u64>> {
    let per_node = if access == Access::Read { parts.executor_pool_size().await? } else { 1 };
    take_connections(parts, by_node, access).await?;
    let limits = parts.limits().clone();
    let text_results = matches!(sink, Sink::Partials { .. });
    let groups: Vec<i32> = by_node.iter().map(|(n, _)| n.group_id).collect();
    let mut extras: Vec<Vec<ExtraWorker>> = by_node.iter().map(|_| Vec::new()).collect();
    for ((node, sqls), extras) in by_node.iter().zip(&mut extras) {
        while extras.len() + 1 < per_node.min(sqls.len()) {
            match parts.try_extra_worker(node) {
                Some(extra) => extras.push(extra),
                None => break,
            }
        }
    }
    let shared: Vec<SharedTasks> = by_node.iter().zip(&extras).map(|((_, sqls), extras)| SharedTasks::new(sqls, 1 + extras.len())).collect();
    if let Sink::Counted { nodes, .. } = sink {
        for (activity, extras) in nodes.iter_mut().zip(&extras) {
            activity.connections = 1 + extras.len();
        }
    }
    let (tx, mut rx) = tokio::sync::mpsc::channel::<(usize, Message)>(1024);
    let tasks = parts.workers_for(&groups).into_iter().filter_map(|w| {
        let node = by_node.iter().position(|(n, _)| n.group_id == w.group_id)?;
        let node_extras = std::mem::take(&mut extras[node]);
        let (tasks, tx, limits) = (&shared[node], tx.clone(), &limits);
        Some(async move {
            let run = NodeRun { node, tasks, mode, text_results, rows_to: &tx, limits };
            let own = run_shared(w, &run);
            let others = futures::future::join_all(node_extras.into_iter().map(|extra| run_extra(extra, &run)));
            let (own, others) = tokio::join!(own, others);
            let result = others.into_iter().fold(own, |sum, other| match (sum, other) {
                (Ok(a), Ok(b)) => Ok(a + b),
                (Err(e), _) | (_, Err(e)) => Err(e),
            });
            (node, result)
        })
    });
    let tasks = futures::future::join_all(tasks);
    drop(tx);
    let consume = async {
        // Keep draining after a failure so no node waits on a full channel.
        let mut failure = Ok(());
        while let Some((node, msg)) = rx.recv().await {
            if failure.is_ok() {
                failure = sink.accept(node, &msg, &limits).await;
            }
        }
        failure
    };
    let (results, consumed) = tokio::join!(tasks, consume);
    let mut rows = vec![0; by_node.len()];
    let mut first_error = consumed.err();
    for (node, result) in results {
        match result {
            Ok(n) => rows[node] = n,
            Err(e) => {
                first_error.get_or_insert(e);
            }
        }
    }
    parts.discard_broken();
    match first_error {
        Some(e) => Err(limits.reported(e)),
        None => Ok(rows),
    }
}

/// One node's tasks, taken in chunks by the connections that run them (as
/// in guided self-scheduling): each takes its share of the tasks left,
/// `left / sharers` rounded up, as one batch, and comes back for more when
/// it is done. With one connection that is every task in one batch, as
/// the node runs them in one backend anyway; with several, a slower shard
/// holds up only its chunk, while the last chunks, small, even out the
/// connections' ends. All connections of a statement are driven by the
/// session's one task, so the counters need no more than relaxed atomics.
struct SharedTasks<'a> {
    sqls: &'a [Arc<str>],
    /// The first task no connection has taken.
    next: AtomicUsize,
    /// Connections running the tasks, or about to (being opened).
    sharers: AtomicUsize,
    /// A task failed: the rest are not taken.
    failed: AtomicBool,
    /// Wakes connections still being opened once nothing is left to take.
    drained: tokio::sync::Notify,
}

impl<'a> SharedTasks<'a> {
    fn new(sqls: &'a [Arc<str>], sharers: usize) -> Self {
        SharedTasks {
            sqls,
            next: AtomicUsize::new(0),
            sharers: AtomicUsize::new(sharers),
            failed: AtomicBool::new(false),
            drained: tokio::sync::Notify::new(),
        }
    }

    /// The next chunk for a connection to run; None once every task is taken or one failed.
    fn take(&self) -> Option<&'a [Arc<str>]> {
        let start = self.next.load(Ordering::Relaxed);
        if start >= self.sqls.len() || self.failed.load(Ordering::Relaxed) {
            return None;
        }
        let end = start + (self.sqls.len() - start).div_ceil(self.sharers.load(Ordering::Relaxed).max(1));
        self.next.store(end, Ordering::Relaxed);
        if end == self.sqls.len() {
            self.drained.notify_waiters();
        }
        Some(&self.sqls[start..end])
    }

    fn is_drained(&self) -> bool {
        self.next.load(Ordering::Relaxed) >= self.sqls.len() || self.failed.load(Ordering::Relaxed)
    }

    fn fail(&self) {
        self.failed.store(true, Ordering::Relaxed);
        self.drained.notify_waiters();
    }

    /// A connection being opened will not come (it failed to open): the
    /// others take larger shares.
    fn lose_sharer(&self) {
        self.sharers.fetch_sub(1, Ordering::Relaxed);
    }

    /// Resolves once nothing is left to take.
    async fn until_drained(&self) {
        loop {
            let woken = self.drained.notified();
            tokio::pin!(woken);
            woken.as_mut().enable();
            if self.is_drained() {
                return;
            }
            woken.await;
        }
    }
}

/// One node's part of a statement, as each connection running its tasks
/// sees it: the node's index in the task list, its shared tasks, and where
/// their results go.
struct NodeRun<'r, 'm> {
    node: usize,
    tasks: &'r SharedTasks<'r>,
    mode: &'r Mode<'m>,
    text_results: bool,
    rows_to: &'r tokio::sync::mpsc::Sender<(usize, Message)>,
    limits: &'r StatementLimits,
}

/// Runs chunks of a node's tasks on `w` while any are left. A failure
/// stops the statement's other parts and leaves the node's remaining
/// tasks untaken.
async fn run_shared(w: &mut WorkerConnection, run: &NodeRun<'_, '_>) -> PgResult<u64> {
    let NodeRun { node, tasks, mode, text_results, rows_to, limits } = *run;
    let mut rows = 0;
    loop {
        // A cancel request sent between two chunks found nothing to cancel.
        if limits.is_stopped() {
            tasks.fail();
            limits.check()?;
        }
        let Some(chunk) = tasks.take() else { return Ok(rows) };
        let batch = send_tasks(w, chunk, mode, text_results);
        match read_results(w, node, batch, rows_to).await {
            Ok(n) => rows += n,
            Err(e) => {
                tasks.fail();
                limits.part_failed(&e);
                return Err(e);
            }
        }
    }
}

/// Runs chunks of a node's tasks on an extra connection, once it is there
/// and while tasks are left, then gives it back to the pool.
async fn run_extra(extra: ExtraWorker, run: &NodeRun<'_, '_>) -> PgResult<u64> {
    let tasks = run.tasks;
    let mut conn = match extra {
        ExtraWorker::Ready(conn) => *conn,
        ExtraWorker::Opening(mut opening) => {
            tokio::select! {
                arrived = &mut opening => match arrived {
                    Ok(conn) => conn,
                    Err(_) => {
                        tasks.lose_sharer();
                        return Ok(0);
                    }
                },
                _ = tasks.until_drained() => {
                    // Not needed after all: it goes to the pool when it arrives.
                    opening.close();
                    if let Ok(conn) = opening.try_recv() {
                        conn.finish();
                    }
                    return Ok(0);
                }
            }
        }
    };
    let rows = run_shared(conn.worker(), run).await;
    conn.finish();
    rows
}

/// A node's tasks as sent in one batch: the statements whose Parse it
/// carries, in order, and how many of those completed so far. A Parse the
/// batch's error cut short left no statement behind, so the connection
/// forgets it and parses it again next time.
pub(super) struct SentBatch {
    parsed: Vec<Arc<str>>,
    parses_completed: usize,
}

impl SentBatch {
    /// Notes a message of the batch's answer; true for its ReadyForQuery, which ends it.
    pub(super) fn note(&mut self, msg: &Message) -> bool {
        match msg.tag() {
            b'1' => self.parses_completed += 1,
            b'Z' => return true,
            _ => {}
        }
        false
    }

    /// The batch has ended on `w`.
    pub(super) fn finish(self, w: &mut WorkerConnection) {
        for sql in self.parsed.get(self.parses_completed..).unwrap_or_default() {
            w.forget_statement(sql);
        }
    }
}

/// Queues a node's tasks as one batch, which the node runs in one
/// transaction (its own, or the session's block) and ends at the first
/// error: one cancel request ends the whole batch, where tasks sent one by
/// one would each run after the one cancelled. In the simple protocol the
/// tasks go as one query string; in the extended protocol each task's
/// statement is prepared once per connection and bound by name afterwards
/// (so a worker parses and plans a repeated shard statement only once), and
/// one Sync ends the batch.
pub(super) fn send_tasks(w: &mut WorkerConnection, sqls: &[Arc<str>], mode: &Mode<'_>, text_results: bool) -> SentBatch {
    let mut parsed = Vec::new();
    match mode {
        Mode::Simple => match sqls {
            [one] => frontend::query(w.conn.out(), one),
            _ => frontend::query(w.conn.out(), &sqls.iter().map(|sql| &**sql).collect::<Vec<&str>>().join(";\n")),
        },
        Mode::Extended { bind, param_types, .. } => {
            for sql in sqls {
                let (name, needs_parse) = w.prepare(sql, param_types);
                if needs_parse {
                    parsed.push(sql.clone());
                }
                let formats: &[i16] = if text_results { &[] } else { &bind.result_formats };
                frontend::bind(w.conn.out(), "", &name, &bind.param_formats, &bind.params, formats);
                if text_results {
                    frontend::describe(w.conn.out(), Target::Portal, "");
                }
                frontend::execute(w.conn.out(), "", 0);
            }
            frontend::sync(w.conn.out());
        }
    }
    SentBatch { parsed, parses_completed: 0 }
}

/// Reads the results of node `node` (its index in the task list) up to the
/// batch's ReadyForQuery, passing rows on.
async fn read_results(
    w: &mut WorkerConnection,
    node: usize,
    mut batch: SentBatch,
    rows_to: &tokio::sync::mpsc::Sender<(usize, Message)>,
) -> PgResult<u64> {
    let mut rows = 0u64;
    let mut error = None;
    loop {
        let msg = match w.conn.recv().await {
            Ok(msg) => msg,
            Err(e) => {
                batch.finish(w);
                return Err(e);
            }
        };
        if batch.note(&msg) {
            break;
        }
        match msg.tag() {
            b'E' => {
                error.get_or_insert_with(|| w.conn.server_error(&msg));
            }
            b'C' => rows += backend::rows_in_tag(backend::decode_command_complete(&msg)?).unwrap_or(0),
            b'T' => {
                rows_to.send((node, w.client_row_description(msg)?)).await.ok();
            }
            b'D' | b'N' => {
                // A closed channel means the consumer failed; keep reading to stay in step.
                rows_to.send((node, msg)).await.ok();
            }
            _ => {}
        }
    }
    batch.finish(w);
    match error {
        Some(e) => Err(e),
        None => Ok(rows),
    }
}

/// Names of the common built-in types, known without asking.
fn builtin_type_name(oid: u32) -> Option<&'static str> {
    Some(match oid {
        16 => "bool",
        20 => "int8",
        21 => "int2",
        23 => "int4",
        25 => "text",
        26 => "oid",
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
        _ => return None,
    })
}

/// `record`, the type of anonymous row values, which no literal can spell.
const RECORD_OID: u32 = 2249;

/// SQL names of the column types of rows the shards gave, for typed
/// literals. A user-defined type's oid was turned into the coordinator
/// database's where the node has the type under the same name; any other
/// user oid is one only the node has (a shard's own row type, from a
/// whole-row reference), which must not be looked up here, where the same
/// oid may name another type.
pub(super) async fn shard_type_names(parts: &mut Participants, catalog: &Catalog, fields: &[backend::FieldDescription]) -> PgResult<Vec<String>> {
    if let Some(f) = fields.iter().find(|f| f.type_oid >= crate::metadata::FIRST_USER_OID && !catalog.is_user_type(f.type_oid)) {
        return Err(PgError::not_supported(format!(
            "the column \"{}\" has a type only the shards have (a table's whole row), which cannot be combined across shards",
            f.name
        ))
        .with_hint("Select the table's columns instead of its whole row."));
    }
    type_names(parts, fields).await
}

/// SQL names of the column types of rows the coordinator database gave (or,
/// through `shard_type_names`, the shards), for typed literals.
pub(super) async fn type_names(parts: &mut Participants, fields: &[backend::FieldDescription]) -> PgResult<Vec<String>> {
    if let Some(f) = fields.iter().find(|f| f.type_oid == RECORD_OID) {
        return Err(PgError::not_supported(format!(
            "the row value \"{}\" cannot be combined across shards: anonymous row values have no literal form",
            f.name
        ))
        .with_hint("Select the row's fields as columns of their own, or cast the row to a composite type."));
    }
    let unknown: Vec<String> =
        fields.iter().filter(|f| builtin_type_name(f.type_oid).is_none()).map(|f| format!("({}::oid, {})", f.type_oid, f.type_modifier)).collect();
    let mut looked_up = std::collections::HashMap::new();
    if !unknown.is_empty() {
        // With the column's modifier where it has one: `'0101'::bit` would
        // be a bit(1); a bit string of unknown length is a varbit.
        let sql = format!(
            "SELECT v.oid, v.m, CASE WHEN v.oid = 'bit'::regtype AND v.m < 0 THEN 'varbit' ELSE format_type(v.oid, nullif(v.m, -1)) END
               FROM (VALUES {}) AS v(oid, m)",
            unknown.join(", ")
        );
        let rows = parts.local().await?.query(&sql).await;
        parts.observe_local_status();
        for row in rows? {
            if let [Some(oid), Some(modifier), Some(name)] = row.as_slice() {
                looked_up.insert((oid.parse::<u32>().unwrap_or_default(), modifier.parse::<i32>().unwrap_or(-1)), name.clone());
            }
        }
    }
    fields
        .iter()
        .map(|f| {
            builtin_type_name(f.type_oid)
                .map(str::to_string)
                .or_else(|| looked_up.get(&(f.type_oid, f.type_modifier)).cloned())
                .ok_or_else(|| PgError::internal(format!("unknown type oid {} of column \"{}\"", f.type_oid, f.name)))
        })
        .collect()
}

/// Rows as a relation the coordinator database or a worker can read: a
/// VALUES list of typed literals (an empty SELECT of typed NULLs for no rows).
/// The caller names its columns with an alias.
pub(super) fn rows_as_relation(types: &[String], rows: &[TextRow], limits: &StatementLimits) -> PgResult<String> {
    if rows.is_empty() {
        let nulls: Vec<String> = types.iter().map(|t| format!("NULL::{t}")).collect();
        return Ok(format!("(SELECT {} WHERE false)", nulls.join(", ")));
    }
    if types.is_empty() {
        // VALUES cannot make rows without columns (`SELECT FROM t`).
        return Ok(format!("(SELECT FROM generate_series(1, {}))", rows.len()));
    }
    Ok(format!("(VALUES {})", values_list(types, rows.iter(), limits)?))
}

/// Rows per step of `values_list` between looks at the statement's limits.
const ROWS_PER_CHECK: usize = 1024;

/// `(lit::type, …), (…)` for a VALUES clause; `rows` must not be empty. The
/// text counts against the statement's memory, and the statement's stop
/// ends the work; a long list is written off the async runtime's thread,
/// so that other sessions' tasks do not wait for it.
pub(super) fn values_list<'r>(types: &[String], rows: impl ExactSizeIterator<Item = &'r TextRow>, limits: &StatementLimits) -> PgResult<String> {
    let estimate = rows.len() * types.len() * 16;
    let write = move || {
        let mut values = String::with_capacity(estimate);
        let mut counted = 0;
        for (r, row) in rows.enumerate() {
            if r % ROWS_PER_CHECK == 0 {
                limits.charge(values.capacity() - counted)?;
                counted = values.capacity();
                limits.check()?;
            }
            values.push_str(if r == 0 { "(" } else { ", (" });
            for (i, (v, t)) in row.iter().zip(types).enumerate() {
                if i > 0 {
                    values.push_str(", ");
                }
                match v {
                    Some(v) => values.push_str(&quote_literal(v)),
                    None => values.push_str("NULL"),
                }
                values.push_str("::");
                values.push_str(t);
            }
            values.push(')');
        }
        limits.charge(values.capacity() - counted)?;
        Ok(values)
    };
    if estimate >= super::LONG_WORK_BYTES {
        super::off_the_runtime(write)
    } else {
        write()
    }
}

/// The combining statement for shard rows of these columns and types, or
/// None when an aggregate cannot be combined exactly from these partial
/// types. It still reads `tessera_partials`, which `read_from` names.
pub(super) fn combine_sql(query: &CombineQuery, fields: &[backend::FieldDescription], types: &[String]) -> PgResult<Option<CombineSql>> {
    let visible = fields.len().saturating_sub(query.hidden);
    let columns: Vec<String> = (0..fields.len()).map(|i| if i < visible { partial_column(i) } else { sort_column(i - visible) }).collect();
    let mut sql = query.sql.clone();
    if sql.contains(VISIBLE_COLUMNS) {
        let list: Vec<String> =
            fields[..visible].iter().enumerate().map(|(i, f)| format!("{} AS {}", partial_column(i), quote_ident(&f.name))).collect();
        sql = sql.replacen(VISIBLE_COLUMNS, &list.join(", "), 1);
    }
    for (j, aggregate) in query.aggregates.iter().enumerate().rev() {
        let col = |k: usize| partial_column(aggregate.columns[k]);
        let expr = match aggregate.kind {
            // A grouping set's total over shards that had no rows has no partial count.
            AggregateKind::Count => format!("coalesce(sum({}), 0)::int8", col(0)),
            AggregateKind::Sum => format!("sum({})::{}", col(0), types[aggregate.columns[0]]),
            AggregateKind::Reapplied(name) => format!("{name}({})", col(0)),
            AggregateKind::Sketch { combine, ref constants } => format!("{combine}({}{constants})", col(0)),
            AggregateKind::Variance { sample, root } => {
                // From exact numeric sums, (N·Σx² − (Σx)²) / (N·(N−1)). For
                // integer and numeric input in numeric, whose SQL division rounds
                // as PostgreSQL's internal one does, the root at the variance's
                // scale. For float8 input the exact numerator and denominator
                // are divided in float8, where PostgreSQL's own float8 steps
                // differ in the last digits only; float4 input was widened to
                // float8 bit for bit there, which a numeric cast does not repeat.
                let float = match types[aggregate.columns[0]].as_str() {
                    "float4" | "real" => return Ok(None),
                    "float8" | "double precision" => true,
                    _ => false,
                };
                let (n, s, q) = (format!("sum({})", col(1)), format!("sum({})", col(2)), format!("sum({})", col(3)));
                let denominator = if sample { format!("{n} * ({n} - 1)") } else { format!("{n} * {n}") };
                let numerator = format!("({n} * {q} - {s} * {s})");
                let fewest = if sample { 1 } else { 0 };
                if float {
                    let variance = format!("({numerator})::float8 / ({denominator})::float8");
                    let value = if root { format!("sqrt({variance})") } else { variance };
                    format!("CASE WHEN coalesce({n}, 0) <= {fewest} THEN NULL::float8 ELSE {value} END")
                } else {
                    let variance = format!("{numerator} / ({denominator})::numeric");
                    let value = if root { format!("round(sqrt({variance}), scale({variance}))") } else { variance };
                    format!("CASE WHEN coalesce({n}, 0) <= {fewest} THEN NULL::numeric WHEN {numerator} <= 0 THEN 0::numeric ELSE {value} END")
                }
            }
            AggregateKind::FloatVariance { sample, root } => {
                // Each shard's float8 state as PostgreSQL's own variance
                // aggregates keep it ({N, Σx, Σ(x − mean)²}), combined by
                // the function its parallel workers' states go through.
                let (n, s, v) = (col(0), col(1), col(2));
                let state = format!("tessera.float8_combined(ARRAY[{n}::float8, coalesce({s}, 0), coalesce({v} * {n}, 0)])");
                let last = match (sample, root) {
                    (true, false) => "float8_var_samp",
                    (false, false) => "float8_var_pop",
                    (true, true) => "float8_stddev_samp",
                    (false, true) => "float8_stddev_pop",
                };
                format!("pg_catalog.{last}({state})")
            }
            AggregateKind::Avg => match types[aggregate.columns[0]].as_str() {
                // PostgreSQL averages float4 in float8; partial float4 sums lost that precision.
                "float4" | "real" => return Ok(None),
                "float8" | "interval" => format!("sum({}) / nullif(sum({}), 0)::float8", col(0), col(1)),
                _ => format!("sum({})::numeric / nullif(sum({}), 0)", col(0), col(1)),
            },
        };
        sql = sql.replace(&aggregate_placeholder(j), &format!("({expr})"));
    }
    Ok(Some(CombineSql { sql, columns }))
}

/// A combining statement and the names it gives the shard rows' columns.
pub(super) struct CombineSql {
    sql: String,
    columns: Vec<String>,
}

impl CombineSql {
    /// The statement reading the shards' rows from `relation`. The rows'
    /// text goes in last, so that nothing searches it.
    pub(super) fn read_from(&self, relation: &str, limits: &StatementLimits) -> PgResult<String> {
        let from = format!("FROM {PARTIALS_RELATION}");
        let Some(at) = self.sql.find(&from) else { return Err(PgError::internal("a combining statement without its partial results")) };
        let mut filled = String::with_capacity(self.sql.len() + relation.len() + 64);
        filled.push_str(&self.sql[..at]);
        filled.push_str(&format!("FROM {relation} AS {PARTIALS_RELATION}"));
        if !self.columns.is_empty() {
            filled.push_str(&format!("({})", self.columns.join(", ")));
        }
        filled.push_str(&self.sql[at + from.len()..]);
        limits.charge(filled.capacity())?;
        Ok(filled)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunk_sizes(tasks: &SharedTasks) -> Vec<usize> {
        std::iter::from_fn(|| tasks.take().map(<[_]>::len)).collect()
    }

    #[test]
    fn one_connection_takes_every_task_in_one_batch() {
        let sqls: Vec<Arc<str>> = (0..16).map(|i| Arc::from(format!("SELECT {i}"))).collect();
        assert_eq!(chunk_sizes(&SharedTasks::new(&sqls, 1)), vec![16]);
    }

    #[test]
    fn shares_shrink_as_the_tasks_run_out() {
        let sqls: Vec<Arc<str>> = (0..8).map(|i| Arc::from(format!("SELECT {i}"))).collect();
        let tasks = SharedTasks::new(&sqls, 4);
        assert_eq!(chunk_sizes(&tasks), vec![2, 2, 1, 1, 1, 1]);
        assert!(tasks.is_drained());
        let tasks = SharedTasks::new(&sqls, 3);
        assert_eq!(tasks.take().map(<[_]>::len), Some(3));
        tasks.lose_sharer();
        tasks.lose_sharer();
        assert_eq!(tasks.take().map(<[_]>::len), Some(5), "alone, a connection takes the rest");
    }

    #[test]
    fn a_failure_leaves_the_rest_untaken() {
        let sqls: Vec<Arc<str>> = (0..8).map(|i| Arc::from(format!("SELECT {i}"))).collect();
        let tasks = SharedTasks::new(&sqls, 2);
        assert!(tasks.take().is_some());
        tasks.fail();
        assert!(tasks.take().is_none() && tasks.is_drained());
    }
}
