//! Row-limited Execute of a distributed read (JDBC's fetch size, asyncpg's
//! cursors): the shard statements are sent to every node at once, but their
//! results are read only as far as each Execute asks. The rows not yet asked
//! for wait in the worker connections, and a worker whose socket buffer fills
//! simply waits too, so the coordinator holds no more than one Execute's rows
//! however large the result.
//!
//! While a stream is open its worker connections are mid-answer: before the
//! session runs anything else on the workers it reads the rest into memory
//! (`hold_rest`), the way the whole result was held before streaming.

use super::multi_shard::{add_task, read_tasks_by_node, send_tasks, take_connections, SentBatch, TasksByNode};
use super::router::{node_of_group, plan_tasks, Defaults};
use super::Mode;
use crate::connection::client::ClientConn;
use crate::error::{PgError, PgResult};
use crate::metadata::Catalog;
use crate::planner::{Combine, Command, Plan};
use crate::protocol::{backend, Message};
use crate::transaction::{Access, Participants};
use bytes::Bytes;
use std::collections::VecDeque;

/// A distributed read whose rows are read as the client asks for them.
pub struct RowStream {
    /// Per node still to read, in reading order: its group and its batch.
    nodes: VecDeque<(i32, SentBatch)>,
    error: Option<PgError>,
}

/// How far an Execute got.
pub enum Progress {
    /// It sent as many rows as it asked for: the portal is suspended.
    Suspended,
    /// The statement is done; its CommandComplete (or error) was written.
    Done,
}

/// Whether a plan's rows can be streamed: reads that run on the workers and
/// whose rows pass through unchanged.
pub fn streams(plan: &Plan) -> bool {
    match plan {
        Plan::Router(router) => router.command == Command::Select,
        Plan::MultiShard(multi) => multi.command == Command::Select && matches!(multi.combine, Combine::Concatenate),
        _ => false,
    }
}

impl RowStream {
    /// Sends the plan's tasks to the workers, reading nothing yet.
    pub async fn start(plan: &Plan, parts: &mut Participants, catalog: &Catalog, mode: &Mode<'_>) -> PgResult<RowStream> {
        let by_node: TasksByNode = match plan {
            Plan::Router(router) => {
                let mut by_node = Vec::new();
                for task in plan_tasks(router, parts, mode, Defaults::default()).await? {
                    add_task(&mut by_node, node_of_group(catalog, task.group)?, task.sql);
                }
                by_node
            }
            Plan::MultiShard(multi) => read_tasks_by_node(parts, &multi.template, &multi.anchor, catalog).await?,
            _ => return Err(PgError::internal("this plan's rows cannot be streamed")),
        };
        take_connections(parts, &by_node, Access::Read).await?;
        let mut nodes = VecDeque::new();
        for (node, sqls) in &by_node {
            let worker = parts.worker(node, Access::Read).await?;
            // The batch's Sync also ends an exchange the connection still had open.
            worker.needs_sync = false;
            let batch = send_tasks(worker, sqls, mode, false);
            worker.conn.flush().await?;
            nodes.push_back((node.group_id, batch));
        }
        Ok(RowStream { nodes, error: None })
    }

    /// Sends the client up to `max_rows` more rows (0: all that are left).
    pub async fn read(&mut self, parts: &mut Participants, max_rows: i32, client: &mut ClientConn) -> PgResult<Progress> {
        let mut sent = 0i64;
        let result = self
            .read_messages(parts, |msg| {
                match msg.tag() {
                    b'D' => {
                        client.out().extend_from_slice(msg.frame());
                        sent += 1;
                    }
                    b'N' => client.out().extend_from_slice(msg.frame()),
                    _ => {}
                }
                max_rows > 0 && sent >= i64::from(max_rows)
            })
            .await;
        let progress = self.finish(result, sent, client);
        client.flush_if_large().await?;
        progress
    }

    /// Reads every row left into memory (for the session to hand out later),
    /// so the worker connections are free for other statements. Returns the
    /// rows and the CommandComplete (or ErrorResponse) that ends them.
    pub async fn hold_rest(mut self, parts: &mut Participants) -> (VecDeque<Bytes>, Bytes) {
        let mut rows = VecDeque::new();
        let result = self
            .read_messages(parts, |msg| {
                if msg.tag() == b'D' {
                    rows.push_back(msg.frame_bytes());
                }
                false
            })
            .await;
        let mut end = bytes::BytesMut::new();
        match result.and_then(|_| self.error.take().map_or(Ok(()), Err)) {
            Ok(()) => backend::command_complete(&mut end, &format!("SELECT {}", rows.len())),
            Err(e) => backend::error_response(&mut end, &e),
        }
        (rows, end.freeze())
    }

    /// Reads the workers' messages, passing each on to `take` until it says
    /// stop (after the message it was given) or every task has ended.
    async fn read_messages(&mut self, parts: &mut Participants, mut take: impl FnMut(&Message) -> bool) -> PgResult<()> {
        while let Some((group, batch)) = self.nodes.front_mut() {
            let group = *group;
            let Some(worker) = parts.workers_for(&[group]).into_iter().next() else {
                return Err(PgError::internal(format!("the connection to node group {group} closed while rows were streaming")));
            };
            let msg = match worker.conn.recv().await {
                Ok(msg) => msg,
                Err(e) => {
                    self.nodes.clear();
                    parts.discard_broken();
                    return Err(e);
                }
            };
            if batch.note(&msg) {
                if let Some((_, batch)) = self.nodes.pop_front() {
                    batch.finish(worker);
                }
                continue;
            }
            match msg.tag() {
                b'E' => {
                    let e = worker.conn.server_error(&msg);
                    self.error.get_or_insert(e);
                }
                b'D' if take(&msg) => {
                    return Ok(());
                }
                b'N' => {
                    take(&msg);
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// Writes how the Execute ended: PortalSuspended, or once every task has
    /// ended, the CommandComplete (counting the rows of this Execute, as
    /// PostgreSQL's does) or the first error.
    fn finish(&mut self, result: PgResult<()>, sent: i64, client: &mut ClientConn) -> PgResult<Progress> {
        result?;
        if !self.nodes.is_empty() {
            backend::portal_suspended(client.out());
            return Ok(Progress::Suspended);
        }
        if let Some(e) = self.error.take() {
            return Err(e);
        }
        backend::command_complete(client.out(), &format!("SELECT {sent}"));
        Ok(Progress::Done)
    }
}
