//! The context a command or an operation runs in (`CommandContext`): the
//! process, the session's participants, the catalog it plans with, and who
//! it works for — a client, which gets results and progress NOTICEs, or a
//! background job, whose progress goes into its task's row.

use crate::connection::client::ClientConn;
use crate::connection::{quote_literal, PgConnection};
use crate::error::{sqlstate, PgError, PgResult};
use crate::metadata::Catalog;
use crate::process::Coordinator;
use crate::protocol::backend;
use crate::transaction::Participants;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// What a command needs from the session running it.
pub struct CommandContext<'a> {
    pub coordinator: &'a Coordinator,
    pub parts: &'a mut Participants,
    pub caller: Caller<'a>,
    pub catalog: Arc<Catalog>,
}

/// Who a command works for: a client, which gets its results and progress
/// NOTICEs, or a background job, whose progress goes into its task's row.
pub enum Caller<'a> {
    Client(&'a mut ClientConn),
    Job(&'a mut TaskProgress),
}

impl CommandContext<'_> {
    /// Tells the caller how a long operation is getting on, right away.
    pub async fn notice(&mut self, message: String) {
        match &mut self.caller {
            Caller::Client(client) => {
                backend::notice_response(client.out(), &PgError::notice(message));
                let _ = client.flush().await;
            }
            Caller::Job(task) => task.report(message).await,
        }
    }

    /// Reloads the catalog once the command's change has committed. A
    /// failure does not undo the change: the caller hears it as a WARNING
    /// (`Coordinator::reload_after_commit`).
    pub async fn reload_after_commit(&mut self) {
        let Some(warning) = self.coordinator.reload_after_commit().await else { return };
        match &mut self.caller {
            Caller::Client(client) => backend::notice_response(client.out(), &warning),
            Caller::Job(task) => task.report(warning.message().to_string()).await,
        }
    }

    /// The error that ends a background job's operation at a safe point once
    /// the job has been stopped (clients cancel through their workers).
    pub fn check_stopped(&self) -> PgResult<()> {
        match &self.caller {
            Caller::Job(task) if task.stop_requested() => {
                Err(PgError::new(sqlstate::QUERY_CANCELED, "the background job was stopped (citus_rebalance_stop)"))
            }
            _ => Ok(()),
        }
    }

    /// The statement giving a node's connection the session's search_path
    /// for the rest of its transaction, when that is not `public` alone and
    /// a block is open (statements that cannot run in one name everything
    /// they use): what a node runs of a client's statement (a function it
    /// creates, a function a column's default or an index expression calls)
    /// then names what it named in the coordinator database.
    pub async fn search_path_sql(&mut self) -> PgResult<Option<String>> {
        if !self.catalog.follows_search_path() || !self.parts.in_block() {
            return Ok(None);
        }
        let path = self.parts.local().await?.query_value("SELECT pg_catalog.current_setting('search_path')").await?.unwrap_or_default();
        Ok(Some(format!("SELECT pg_catalog.set_config('search_path', {}, true)", crate::connection::quote_literal(&path))))
    }

    /// The client's connection, for the results of a statement it sent.
    pub fn client(&mut self) -> PgResult<&mut ClientConn> {
        match &mut self.caller {
            Caller::Client(client) => Ok(client),
            Caller::Job(_) => Err(PgError::internal("a background job has no client to answer")),
        }
    }

    /// Commits (or rolls back) the block a command opened for itself, then refreshes
    /// the catalog snapshot so the session's next statement sees the change. Inside
    /// the client's own block the session loads the block's catalog instead: a
    /// reload from another connection would not see the change, and would wait on
    /// the locks the block holds.
    pub async fn finish_block<T>(&mut self, implicit: bool, result: PgResult<T>) -> PgResult<T> {
        if !implicit {
            return result;
        }
        let value = self.parts.end_implicit(implicit, result).await?;
        self.reload_after_commit().await;
        Ok(value)
    }
}

/// Where a running task reports: its row in `pg_dist_background_task`
/// (the message `citus_rebalance_status` shows) and the log. The connection
/// holds the job's lock.
pub struct TaskProgress {
    pub conn: PgConnection,
    pub job_id: i64,
    pub task_id: i64,
    pub stop: Arc<AtomicBool>,
}

impl TaskProgress {
    pub async fn report(&mut self, message: String) {
        tracing::info!("rebalance job {} task {}: {message}", self.job_id, self.task_id);
        let sql = format!("UPDATE tessera.pg_dist_background_task SET message = {} WHERE task_id = {}", quote_literal(&message), self.task_id);
        if let Err(e) = self.conn.execute(&sql).await {
            tracing::warn!("recording the progress of rebalance job {}: {}", self.job_id, e.message());
        }
    }

    pub fn stop_requested(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }
}
