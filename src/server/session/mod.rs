//! One client session: its state, and the loop reading the client's messages
//! and handing each to the part of the session that deals with it. Each job
//! has a file: start-up and authentication (`startup`), the catalog and plan
//! cache (`catalog`), the simple protocol (`simple`), the extended protocol
//! and portals (`extended`), from plan to execution (`execute`), and the
//! relay to the coordinator database (`relay`).

mod catalog;
mod execute;
mod extended;
mod relay;
mod simple;
mod startup;
mod statistics;

use super::auth;
use super::login_memory::LoginMemory;
use super::Front;
use crate::commands;
use crate::config::Login;
use crate::config::{AuthMethod, TlsMode};
use crate::connection::client::MemoryCharge;
use crate::connection::client::{client_lost, ClientConn};
use crate::connection::{quote_literal, PgConnection};
use crate::error::{sqlstate, PgError, PgResult};
use crate::executor::stream::{self as row_stream, Progress, RowStream};
use crate::executor::{self, Mode};
use crate::executor::{Executed, ExecutionContext};
use crate::metadata::{self, Catalog, FoundRelation, UnqualifiedNames};
use crate::planner::{self, Plan, PlannedStatement, SqlExecute, TransactionCommand};
use crate::process::context::{Caller, CommandContext};
use crate::process::Coordinator;
use crate::protocol::backend::{self, FieldDescription};
use crate::protocol::frontend::{self, Bind, StartupPacket, Target};
use crate::protocol::Message;
use crate::transaction::{Participants, WORKER_PARAMETERS};
use crate::transport::Stream;
use futures::FutureExt;
pub use startup::run;
use std::collections::HashMap;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

/// Cached plans per session; cleared when it grows past this (statements that
/// embed literals never repeat).
const PLAN_CACHE_LIMIT: usize = 2000;
/// How the shells' guard (schema.sql, `tessera.refuse_shell_write`) ends its
/// message when a write that waited for a table being distributed reaches it.
const DISTRIBUTED_MEANWHILE: &str = "was distributed while this statement waited for it";

/// The statements of one query string, planned against one catalog version.
struct CachedPlan {
    version: i64,
    /// `SearchPath::generation` when planned.
    search_path: u64,
    statements: Vec<PlannedStatement>,
}

/// Parameter types and result columns of a distributed statement, as the
/// coordinator database describes it against the shell tables.
struct Shape {
    param_types: Vec<u32>,
    fields: Option<Vec<FieldDescription>>,
}

/// What the coordinator database answered about statements against the
/// shell tables, until the catalog or the search_path changes.
#[derive(Default)]
struct ShellAnswers {
    shapes: HashMap<(String, Vec<u32>), Arc<Shape>>,
    /// Statements it found right (names, types, privileges): see `check_on_shells`.
    checked: std::collections::HashSet<(String, Vec<u32>)>,
}

impl ShellAnswers {
    fn clear(&mut self) {
        self.shapes.clear();
        self.checked.clear();
    }
}

struct DistributedStatement {
    plan: Arc<CachedPlan>,
    shape: Arc<Shape>,
}

enum Statement {
    /// Prepared on the coordinator database under the client's name.
    Local,
    Distributed(Arc<DistributedStatement>),
}

enum Portal {
    Local,
    /// `pending`: what is left of a run that an Execute's row limit suspended.
    Distributed {
        statement: Arc<DistributedStatement>,
        bind: Bind,
        pending: Option<PendingRows>,
    },
}

/// The rows of a suspended portal not yet sent, and its CommandComplete.
struct PendingRows {
    rows: std::collections::VecDeque<bytes::Bytes>,
    complete: bytes::Bytes,
}

/// Why a statement did not complete.
enum Failure {
    /// The error has already been relayed to the client (it came from the
    /// coordinator database while forwarding).
    Reported,
    Error(PgError),
}

impl From<PgError> for Failure {
    fn from(e: PgError) -> Self {
        Failure::Error(e)
    }
}

struct Session {
    coordinator: Arc<Coordinator>,
    client: ClientConn,
    parts: Participants,
    /// False for sessions on a database other than the one holding the catalog:
    /// those are plain pass-through.
    distributed: bool,
    plans: HashMap<String, Arc<CachedPlan>>,
    shells: ShellAnswers,
    /// The catalog version `shells` and the statements prepared on the
    /// workers were made under; see `catalog_to_run_under`.
    catalog_version: i64,
    statements: HashMap<String, Statement>,
    portals: HashMap<String, Portal>,
    /// SQL PREPAREd statements over distributed tables: name → (the PREPARE's
    /// text, the prepared statement's text).
    sql_prepared: HashMap<String, (String, String)>,
    /// Extended-protocol responses the coordinator database still owes us.
    local_expected: usize,
    /// Something was forwarded to the coordinator database since the last Sync.
    local_unsynced: bool,
    /// A forwarded statement may change which user code reaches distributed
    /// tables: the catalog is refreshed at the next Sync.
    user_code_unsynced: bool,
    /// After an error in an extended-protocol batch, messages up to Sync are ignored.
    skip_until_sync: bool,
    /// A deadlock victim's work must be rolled back on every node before the
    /// client hears back.
    release_work: bool,
    /// Ended by an internal error: its node connections are in an unknown
    /// state and are dropped rather than spoken to.
    abandoned: bool,
    /// The catalog as this transaction block sees it, once the block has
    /// distributed or undistributed a table.
    block_catalog: Option<Arc<Catalog>>,
    /// The portal whose rows are streaming from the workers, at most one:
    /// its worker connections are mid-answer until it is read to the end.
    stream: Option<(String, RowStream)>,
    block_catalog_loads: i64,
    search_path: SearchPath,
    /// The client's text of what runs now (a simple query's whole string,
    /// an extended-protocol statement), which error positions refer to.
    query_text: String,
    /// The tier of the plan that ran last (a plan may hand over to another).
    ran_tier: Option<crate::stats::Tier>,
    /// Statements' ids and normalised texts, by their text.
    normalized: HashMap<Box<str>, (i64, Arc<str>), foldhash::fast::RandomState>,
    /// The role statements are counted under: the one the client logged in as.
    stats_user: Arc<str>,
}

/// Where the session's search_path leads unqualified names of distributed
/// tables, when that is not `public` alone.
#[derive(Default)]
struct SearchPath {
    /// Read from the coordinator database (None: `public` alone).
    unqualified: Option<Arc<UnqualifiedNames>>,
    /// The catalog version `unqualified` was read under.
    read_at: i64,
    /// A statement may have changed the search_path since it was read.
    stale: bool,
    /// One may have since the last block ended, which could undo it.
    changed_since_block_end: bool,
    /// Counts changes of `unqualified`: plans made before one are made again.
    generation: u64,
    /// The catalog with `unqualified` applied, and the one it was made from.
    catalog: std::cell::RefCell<Option<(Arc<Catalog>, Arc<Catalog>)>>,
}

/// How the executor runs a statement: with the statement text, or with the
/// client's Bind values (`sync`: the client's Sync follows at once).
fn execution_mode<'a>(extended: Option<(&'a Bind, &'a Shape)>, sync: bool) -> Mode<'a> {
    match extended {
        None => Mode::Simple,
        Some((bind, shape)) => Mode::Extended { bind, param_types: &shape.param_types, sync },
    }
}

/// How the coordinator database checks a statement before its rows move
/// (`Session::check_on_shells`).
#[derive(Clone, Copy)]
enum ShellCheck {
    Explain,
    Parse,
}

/// Whether a plan moves rows through the coordinator before the statement
/// can fail on a wrong name, type or privilege (a broadcast, partial results
/// to combine, rows to route), and how to check it first. Router and
/// concatenating plans need no check: their one round of shard statements
/// fails at once, and the fast path keeps its single round trip.
fn shell_check(plan: &Plan) -> Option<ShellCheck> {
    match plan {
        Plan::Fallback(fallback) => match &fallback.statement {
            pg_query::NodeEnum::SelectStmt(_)
            | pg_query::NodeEnum::InsertStmt(_)
            | pg_query::NodeEnum::UpdateStmt(_)
            | pg_query::NodeEnum::DeleteStmt(_)
            | pg_query::NodeEnum::DeclareCursorStmt(_) => Some(ShellCheck::Explain),
            _ => Some(ShellCheck::Parse),
        },
        Plan::MultiShard(multi) if matches!(multi.combine, planner::Combine::Query(_)) => Some(ShellCheck::Explain),
        Plan::InsertSelect(_) | Plan::MergeThroughCoordinator(_) | Plan::WithLocalRows(_) => Some(ShellCheck::Explain),
        // EXPLAIN cannot explain itself; Parse analyses the explained statement.
        Plan::Explain(_) => Some(ShellCheck::Parse),
        _ => None,
    }
}

/// Whether a plan runs under the statement's limits (see
/// `Session::execute_distributed`): its work spans several nodes or passes
/// through the coordinator. A statement routed to one node is bounded by
/// that node, and a cancel request reaches it there.
fn watched(plan: &Plan) -> bool {
    matches!(
        plan,
        Plan::MultiShard(_)
            | Plan::Fallback(_)
            | Plan::KeysMeet(_)
            | Plan::Explain(_)
            | Plan::InsertSelect(_)
            | Plan::MergeThroughCoordinator(_)
            | Plan::WithLocalRows(_)
            | Plan::LocalWithClusterData(_)
            | Plan::LocalOverShards(_)
    )
}

/// Ends the session with `e`, sent as FATAL.
async fn refuse(client: &mut ClientConn, e: PgError) -> anyhow::Result<()> {
    let fatal =
        PgError::from_fields(e.fields().map(|(c, v)| (c, if c == b'S' || c == b'V' { "FATAL".to_string() } else { v.to_string() })).collect());
    backend::error_response(client.out(), &fatal);
    client.flush().await?;
    Ok(())
}

impl Session {
    async fn serve(&mut self) -> anyhow::Result<()> {
        while let Some(msg) = self.next_message().await? {
            match AssertUnwindSafe(self.dispatch(&msg)).catch_unwind().await {
                Ok(Ok(true)) => {}
                Ok(Ok(false)) => return Ok(()),
                Ok(Err(e)) => return Err(e),
                Err(panic) => return self.end_after_panic(planner::panic_message(panic.as_ref())).await,
            }
        }
        Ok(())
    }

    /// The client's next message. While the session waits for it, what the
    /// coordinator database sends unasked (a NOTIFY for this session's LISTEN,
    /// a notice, a changed parameter) goes to the client at once, as
    /// PostgreSQL would send it.
    async fn next_message(&mut self) -> anyhow::Result<Option<Message>> {
        // Messages the client sent together (Bind, Execute, Sync) are handled
        // together, and their answers leave in one write.
        if let Some(msg) = self.client.buffered()? {
            return Ok(Some(msg));
        }
        // A client idle in its transaction block holds connections on every
        // node it touched: PostgreSQL's limit on that idleness applies here.
        let in_block = matches!(self.parts.status(), backend::TxStatus::InBlock | backend::TxStatus::Failed);
        let deadline = self.parts.idle_in_transaction_timeout().filter(|_| in_block).map(|limit| tokio::time::Instant::now() + limit);
        loop {
            // Neither read below may be cancelled in the middle of a write.
            self.client.flush().await?;
            // Only a session that holds its coordinator database connection
            // between statements (pinned: LISTEN among the reasons) hears from it.
            let listening = match self.parts.local_if_held() {
                Some(local) => !(self.local_expected > 0 || self.local_unsynced || local.is_broken() || local.flush().await.is_err()),
                None => false,
            };
            let client = &mut self.client;
            let next = async move {
                match deadline {
                    Some(deadline) => tokio::time::timeout_at(deadline, client.recv()).await.ok(),
                    None => Some(client.recv().await),
                }
            };
            if !listening {
                return match next.await {
                    Some(msg) => Ok(msg?),
                    None => self.end_idle_in_transaction().await,
                };
            }
            let local = self.parts.local_if_held().expect("held: checked above");
            tokio::select! {
                msg = next => return match msg {
                    Some(msg) => Ok(msg?),
                    None => self.end_idle_in_transaction().await,
                },
                unasked = local.recv() => match unasked {
                    Ok(msg) if matches!(msg.tag(), b'A' | b'N' | b'S') => self.client.out().extend_from_slice(msg.frame()),
                    Ok(msg) => tracing::debug!("unexpected message {:?} from the coordinator database while idle", msg.tag() as char),
                    // The connection is broken now; the next statement reports it.
                    Err(e) => tracing::debug!("coordinator database connection while idle: {}", e.message()),
                },
            }
        }
    }

    /// Ends a session left idle in its transaction block too long, as
    /// PostgreSQL does: FATAL 25P03; its work is rolled back everywhere.
    async fn end_idle_in_transaction(&mut self) -> anyhow::Result<Option<Message>> {
        refuse(&mut self.client, PgError::new("25P03", "terminating connection due to idle-in-transaction timeout")).await?;
        Ok(None)
    }

    /// Handles one client message; false once the session is over.
    async fn dispatch(&mut self, msg: &Message) -> anyhow::Result<bool> {
        match msg.tag() {
            b'Q' => self.simple_query(msg).await?,
            b'X' => return Ok(false),
            b'S' => self.sync().await?,
            _ if self.skip_until_sync => {}
            b'P' => self.on_parse(msg).await?,
            b'B' => self.on_bind(msg).await?,
            b'D' => self.on_describe(msg).await?,
            b'E' => self.on_execute(msg).await?,
            b'C' => self.on_close(msg).await?,
            b'H' => {
                self.drain_local().await?;
                self.client.flush().await?;
            }
            b'd' | b'c' | b'f' => {} // stray COPY data after an aborted COPY
            other => {
                let e = PgError::new(sqlstate::PROTOCOL_VIOLATION, format!("invalid frontend message type {}", other as char));
                backend::error_response(self.client.out(), &e);
                self.client.flush().await?;
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// A bug hit while this session's statement ran: its connections to the
    /// nodes may be mid-exchange, so the session ends (closing them rolls its
    /// work back) and only this client hears about it.
    async fn end_after_panic(&mut self, why: &str) -> anyhow::Result<()> {
        self.abandoned = true;
        let e = PgError::internal(format!("the coordinator failed while running this statement: {why}"))
            .with_detail("This session ends; its open transaction is rolled back. Other sessions are not affected.")
            .with_hint("This is a bug in Tessera; please report the statement.");
        refuse(&mut self.client, e).await?;
        Err(anyhow::anyhow!("session ended by an internal error: {why}"))
    }

    fn report(&mut self, failure: Failure) {
        let failure = self.as_deadlock(failure);
        if let Failure::Error(e) = failure {
            // Clients (and ORMs mapping errors to fields) know the tables, not their shards.
            let catalog = self.catalog();
            let e = e.rename(|name| catalog.name_without_shard(name)).relocate_position(&self.query_text);
            backend::error_response(self.client.out(), &e);
        }
        self.parts.mark_failed();
    }

    /// A statement cancelled by the distributed deadlock detector reports the
    /// deadlock, as PostgreSQL does for one it breaks itself.
    fn as_deadlock(&mut self, failure: Failure) -> Failure {
        let Failure::Error(e) = &failure else { return failure };
        if e.code() != sqlstate::QUERY_CANCELED {
            return failure;
        }
        let cycle = self.parts.block_started().and_then(|started| self.coordinator.take_deadlock_victim(self.parts.session_name(), started));
        match cycle {
            Some(cycle) => {
                self.release_work = true;
                Failure::Error(
                    PgError::new(sqlstate::DEADLOCK_DETECTED, "deadlock detected")
                        .with_detail(format!("Distributed transactions wait for each other across workers: {cycle}; this one was cancelled."))
                        .with_hint("Retry the transaction."),
                )
            }
            None => failure,
        }
    }
}
