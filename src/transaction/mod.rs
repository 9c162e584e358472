//! The connections a client session uses and the transaction that spans them.
//! A transaction block is opened lazily: BEGIN is answered by the coordinator,
//! and each node (the coordinator database or a worker) is sent the BEGIN — plus
//! any savepoints already taken — only when a statement first reaches it. Each
//! node keeps the one connection for the whole block (read-your-writes), and
//! COMMIT/ROLLBACK go to exactly the nodes that were touched.

mod block;
pub mod coordinator_db;
pub mod deadlock;
pub mod decided;
pub mod extra;
pub mod limits;
pub mod links;
pub mod recovery;
mod session_settings;

use crate::config::Fault;
use crate::config::{Login, ServerAddr};
use crate::connection::PgConnection;
use crate::connection::FOLLOWED_SETTINGS;
use crate::error::{sqlstate, PgError, PgResult};
use crate::metadata::{Node, TypeOids, FIRST_USER_OID};
use crate::protocol::backend::{self, TxStatus};
use crate::protocol::{frontend, Message};
use decided::{DecidingTransaction, Decision};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Settings whose values shape how data is formatted or parsed; worker
/// connections follow the client's values for them.
/// (application_name is not among them: worker connections carry the
/// session's name instead, see `TwoPhase::session_name`.)
pub const WORKER_PARAMETERS: &[&str] = &["DateStyle", "TimeZone", "IntervalStyle", "extra_float_digits", "client_encoding", "bytea_output"];

/// Test-only: dies like a `kill -9` at `at` when `configured` names it and
/// enough commits got there first. Abort runs no destructors, flushes
/// nothing and says goodbye to no client or node, so whatever is in flight
/// stays as a crash would leave it.
pub(crate) fn inject_fault(configured: Option<(Fault, u32)>, at: Fault) {
    let Some((fault, after)) = configured else { return };
    if fault == at && FAULT_POINT_REACHED.fetch_add(1, std::sync::atomic::Ordering::SeqCst) >= after {
        tracing::error!("fault injection: stopping at {at:?}");
        std::process::abort();
    }
}

/// Two-phase commit settings and session naming, shared by a process's sessions.
#[derive(Clone, Debug)]
pub struct TwoPhase {
    /// How long the `StallAfterPrepare` fault pauses a commit.
    stall: std::time::Duration,
    /// Test-only: where the process dies, and how many commits (of all
    /// sessions) get past that point first.
    fault: Option<(Fault, u32)>,
    /// `tessera:<process>:<session>`: the application_name of the session's
    /// worker connections, set when they open. A session runs one transaction
    /// at a time, so the deadlock detector tells distributed transactions apart
    /// by it (and by the backends' transaction start times) without a SET per
    /// transaction on every worker.
    session_name: Arc<str>,
    /// The relay of the workers' links, whose prepared parts the session
    /// settles once its worker transactions end.
    links: Arc<links::LinkRelay>,
}

/// Test-only: how many commits of this process have reached the injected fault
/// point. Process-wide, so a workload spread over many sessions can crash the
/// coordinator part-way through.
static FAULT_POINT_REACHED: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

impl TwoPhase {
    pub fn new(
        process_id: u32,
        session_id: i32,
        recovery_interval: std::time::Duration,
        fault: Option<(Fault, u32)>,
        links: Arc<links::LinkRelay>,
    ) -> Self {
        TwoPhase { stall: recovery_interval * 10, fault, session_name: Arc::from(format!("{TRANSACTION_ID_PREFIX}{process_id}:{session_id}")), links }
    }

    pub fn session_name(&self) -> &str {
        &self.session_name
    }

    fn inject(&self, at: Fault) {
        inject_fault(self.fault, at);
    }

    async fn stall(&self, at: Fault) {
        if self.fault.is_some_and(|(fault, _)| fault == at) {
            tokio::time::sleep(self.stall).await;
        }
    }
}

/// postgres_fdw refuses PREPARE in a worker transaction whose user code
/// used links (`links`), and only one worker can decide instead of
/// preparing: says what the block did, and what to do.
fn explain_unpreparable(e: PgError) -> PgError {
    if e.code() != sqlstate::FEATURE_NOT_SUPPORTED || !e.message().contains("postgres_fdw") {
        return e;
    }
    PgError::not_supported(
        "the transaction wrote on several nodes, and user code it ran on more than one of them reached other nodes' shards: it cannot commit atomically yet, and was rolled back",
    )
    .with_hint("Run such calls on one node per transaction, or each in a transaction of its own.")
}

/// Worker backends of client sessions carry an application_name with this
/// prefix.
pub const TRANSACTION_ID_PREFIX: &str = "tessera:";

/// Backends a client's CancelRequest must reach.
pub type CancelTargets = Arc<Mutex<Vec<(ServerAddr, (i32, i32))>>>;

/// A shard statement's parameter types, and the name it is prepared under.
type PreparedAs = (Box<[u32]>, String);

/// One worker connection and the statements prepared on it.
pub struct WorkerConnection {
    pub conn: PgConnection,
    pub group_id: i32,
    /// The node's user-defined type oids, as of the catalog that last asked
    /// for this connection.
    type_oids: Arc<TypeOids>,
    in_block: bool,
    /// The current block wrote through this connection, so committing it needs
    /// the same atomicity as the other writers'.
    wrote: bool,
    /// The block's transaction here as a deciding transaction, when the
    /// worker told it ahead of the commit (taken from the connection then).
    decider: Option<DecidingTransaction>,
    /// Shard statement text → per parameter-type list it was parsed with, the
    /// name of the statement prepared on this connection, for the catalog
    /// version the session last ran under. The types are part of the key: a
    /// client may bind the same text with an int2 once and an int4 next
    /// (psycopg picks the type by the value), in binary.
    prepared: HashMap<Arc<str>, Vec<PreparedAs>>,
    /// Statements ever prepared here: names are never reused, since those
    /// forgotten after a catalog change still exist on the worker.
    statements_made: u32,
    /// True while an extended-protocol exchange awaits its Sync.
    pub needs_sync: bool,
    /// The session's settings count this connection follows (`follow_session_settings`).
    settings_epoch: u64,
    last_used: std::time::Instant,
    /// The session that used the connection last.
    owner: Arc<str>,
    /// The role and settings the connection acts with (`login_state`); a
    /// session with others resets it when it takes it from the pool.
    login_state: u64,
    /// The session whose name the connection carries as application_name,
    /// which the deadlock detector reads: set when it joins a block.
    named: Arc<str>,
    /// The catalog version `prepared` holds statements for.
    prepared_version: i64,
    /// The right to run statements outside a block on the node
    /// (`NodePool::run_outside_block`), while taken for that.
    running: Option<tokio::sync::OwnedSemaphorePermit>,
    /// Its place among the node's connections.
    _slot: tokio::sync::OwnedSemaphorePermit,
}

/// The pools of worker connections a coordinator process shares among its sessions.
pub type WorkerPools = crate::connection::pool::Pools<WorkerConnection>;
use crate::connection::pool::Checkout;
use crate::stats::Counter;

/// How long a worker connection must have been idle before it is probed for a
/// server that went away meanwhile.
const IDLE_PROBE_AFTER: std::time::Duration = std::time::Duration::from_millis(50);

impl WorkerConnection {
    /// The prepared-statement name for `sql` with parameters of `param_types`,
    /// and whether it must be parsed first.
    fn statement_name(&mut self, sql: &Arc<str>, param_types: &[u32]) -> (String, bool) {
        if let Some((_, name)) = self.prepared.get(sql).and_then(|variants| variants.iter().find(|(types, _)| **types == *param_types)) {
            return (name.clone(), false);
        }
        self.statements_made += 1;
        let name = format!("tessera_{}", self.statements_made);
        self.prepared.entry(sql.clone()).or_default().push((param_types.into(), name.clone()));
        (name, true)
    }
    /// Queues the Parse of `sql` unless this connection has it prepared
    /// already; returns the statement's name and whether a Parse was queued.
    /// Parameters of user-defined types go as unknown, for the node to infer:
    /// the client gave the coordinator database's oids, and the node numbers
    /// the same types differently.
    pub fn prepare(&mut self, sql: &Arc<str>, param_types: &[u32]) -> (String, bool) {
        let (name, needs_parse) = self.statement_name(sql, param_types);
        if needs_parse {
            if param_types.iter().any(|t| *t >= FIRST_USER_OID) {
                let node_types: Vec<u32> = param_types.iter().map(|t| if *t >= FIRST_USER_OID { 0 } else { *t }).collect();
                frontend::parse(self.conn.out(), &name, sql, &node_types);
            } else {
                frontend::parse(self.conn.out(), &name, sql, param_types);
            }
        }
        (name, needs_parse)
    }

    /// A RowDescription from the node as the client must see it: with the
    /// coordinator database's oids for user-defined types.
    pub fn client_row_description(&self, msg: Message) -> PgResult<Message> {
        if self.type_oids.is_empty() {
            return Ok(msg);
        }
        let mut fields = backend::decode_row_description(&msg)?;
        let mut changed = false;
        for f in fields.iter_mut().filter(|f| f.type_oid >= FIRST_USER_OID) {
            if let Some(oid) = self.type_oids.to_coordinator(f.type_oid) {
                f.type_oid = oid;
                changed = true;
            }
        }
        if !changed {
            return Ok(msg);
        }
        let mut frame = bytes::BytesMut::new();
        backend::row_description(&mut frame, &fields);
        Ok(Message::from_frame(frame.freeze()))
    }

    /// Forgets a statement whose Parse failed (with every parameter-type
    /// variant), so it is parsed again next time.
    pub fn forget_statement(&mut self, sql: &Arc<str>) {
        self.prepared.remove(sql);
    }

    /// Whether the node closed this connection while it held nothing of ours:
    /// outside a block and between exchanges, replacing it loses nothing. Once
    /// it has joined a block, the block's work on that node died with it, and
    /// the next statement must fail.
    fn died_while_idle(&mut self) -> bool {
        // Only connections that sat idle are checked: the probe costs a syscall,
        // and it clears the socket's readiness, which delays the next read.
        let idle = self.last_used.elapsed() > IDLE_PROBE_AFTER;
        idle && !self.in_block && !self.needs_sync && self.conn.is_dead_while_idle()
    }
}

#[derive(Debug)]
struct Block {
    begin_sql: String,
    /// When the block began: a deadlock victim chosen after this is this block.
    started: std::time::Instant,
    /// Opened by the coordinator for one multi-node statement, not by the client.
    implicit: bool,
    failed: bool,
    savepoints: Vec<String>,
}

/// Whether a statement only reads through a worker connection or may write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    Read,
    Write,
}

pub struct Participants {
    /// The session's coordinator database connection, held while needed.
    local: coordinator_db::CoordinatorDb,
    local_in_block: bool,
    /// The coordinator database connection is in a transaction the
    /// executor began for its own work (see `begin_local_work`), not the
    /// client's.
    local_in_own_work: bool,
    /// The worker connections the session holds now (taken from `pools`).
    workers: HashMap<i32, WorkerConnection>,
    pools: Arc<WorkerPools>,
    /// The pools of the nodes the session used, kept at hand: looking them
    /// up takes the pools' shared lock.
    node_pools: HashMap<i32, Arc<crate::connection::pool::NodePool<WorkerConnection>>>,
    /// The backend of the connection to each node group the session held
    /// last: taken again if still idle, it needs no reset.
    last_backends: HashMap<i32, (i32, i32)>,
    /// The catalog version the session runs under, for the statements
    /// prepared on the connections it takes.
    catalog_version: i64,
    /// `login_state` of `login` (settings the workers follow, role), and
    /// of the login as the session began.
    login_state: u64,
    startup_state: u64,
    /// Which pooled connections the session may take: those logged in as
    /// its user with its start-up settings, which `RESET ALL` returns them
    /// to before the session's own are applied.
    pool_key: Arc<str>,
    /// The login as the session began: new connections log in with it, so
    /// that `RESET ALL` takes every connection of a key to the same state.
    startup_login: Login,
    login: Login,
    block: Option<Block>,
    cancel_targets: CancelTargets,
    two_phase: TwoPhase,
    /// The session's `citus.*` settings, once read; forgotten whenever a
    /// statement may have changed them.
    settings: Option<CitusSettings>,
    /// The role (SET ROLE) the worker connections act as; None for the
    /// role the client logged in as. The workers check privileges, so they
    /// must act as whoever the coordinator database acts as.
    worker_role: Option<String>,
    /// A statement may have changed the session's role: find out which it
    /// is before the workers are next used.
    role_unknown: bool,
    /// The current block changed the role, which its end may undo.
    role_changed_in_block: bool,
    /// Counts the statements that may have changed the session's settings;
    /// each worker connection remembers the count it last followed.
    settings_epoch: u64,
    /// The current block may have changed settings, which its end may undo.
    settings_changed_in_block: bool,
    /// A statement may have changed the settings the worker connections
    /// follow (`FOLLOWED_SETTINGS`): read them before the workers are next used.
    followed_unknown: bool,
    /// The current block may have changed them, which its end may undo.
    followed_changed_in_block: bool,
    /// The `set_config` calls that give a connection the session's settings
    /// (each after "; "), as read at which `settings_epoch`.
    session_settings: Option<(u64, Arc<str>)>,
    /// The block's place among those holding worker connections (see `BlockGate`).
    admission: Option<crate::connection::pool::Admission>,
    /// What bounds the statement running now (shared with the coordinator's
    /// list of sessions, for cancel requests).
    limits: limits::StatementLimits,
    /// `statement_timeout` as the coordinator database had it when the
    /// session began or last read the followed settings (None: no limit).
    statement_timeout: Option<std::time::Duration>,
    /// Reads run on the session's own connection to each node only: they
    /// read temporary tables that other connections cannot see.
    session_connections_only: bool,
}

/// The `citus.*` settings (kept by the coordinator database, where SET runs)
/// that change how the coordinator works, and `tessera.max_statement_memory`.
#[derive(Clone, Copy, Debug)]
pub struct CitusSettings {
    /// `citus.multi_shard_commit_protocol` is not '1pc'.
    pub two_phase: bool,
    /// `citus.multi_shard_modify_mode = 'sequential'`: multi-shard writes go
    /// one node at a time.
    pub sequential_modify: bool,
    /// `citus.enable_function_delegation` is not off: calls of distributed
    /// functions go to their shard's node.
    pub function_delegation: bool,
    /// The most memory the coordinator may hold for one statement.
    pub max_statement_memory: limits::MemorySetting,
    /// `citus.max_adaptive_executor_pool_size`.
    pub executor_pool_size: PoolSizeSetting,
    /// `tessera.merge_shard_tasks` is not off: a read's task covers several
    /// of a node's shard groups (see `ShardTemplate::sql_for_shards`).
    pub merge_shard_tasks: bool,
    /// `citus.count_distinct_error_rate`.
    pub count_distinct_error_rate: ErrorRateSetting,
}

/// `citus.max_adaptive_executor_pool_size` as the session has it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PoolSizeSetting {
    /// Not set: the configuration's `[connections] max_adaptive_executor_pool_size`.
    Unset,
    Size(usize),
    /// Set to what is not a positive whole number.
    Invalid,
}

impl PoolSizeSetting {
    /// From `current_setting(…, true)`: NULL while never set, empty once reset.
    fn from_value(value: Option<&str>) -> Self {
        match value.map(str::trim) {
            None | Some("") => PoolSizeSetting::Unset,
            Some(value) => value.parse().ok().filter(|n| *n > 0).map_or(PoolSizeSetting::Invalid, PoolSizeSetting::Size),
        }
    }
}

/// `citus.count_distinct_error_rate` as the session has it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ErrorRateSetting {
    /// Not set, or 0: DISTINCT counts are exact.
    Exact,
    /// Counts across shards may err by about this fraction.
    Rate(f64),
    /// Set to what is not a number from 0 to 1.
    Invalid,
}

impl ErrorRateSetting {
    fn from_value(value: Option<&str>) -> Self {
        match value.map(str::trim) {
            None | Some("") => ErrorRateSetting::Exact,
            Some(value) => match value.parse::<f64>() {
                Ok(0.0) => ErrorRateSetting::Exact,
                Ok(rate) if rate > 0.0 && rate <= 1.0 => ErrorRateSetting::Rate(rate),
                _ => ErrorRateSetting::Invalid,
            },
        }
    }

    /// The error the session accepts of a DISTINCT count; None for exact counts.
    pub fn rate(self) -> PgResult<Option<f64>> {
        match self {
            ErrorRateSetting::Exact => Ok(None),
            ErrorRateSetting::Rate(rate) => Ok(Some(rate)),
            ErrorRateSetting::Invalid => {
                Err(PgError::new(sqlstate::INVALID_PARAMETER_VALUE, "invalid value for parameter \"citus.count_distinct_error_rate\"")
                    .with_hint("Give a fraction from 0 (exact counts) to 1, such as 0.005 for counts within about half a percent."))
            }
        }
    }
}

impl CitusSettings {
    /// The select list that reads them.
    pub const COLUMNS: &'static str =
        "current_setting('citus.multi_shard_commit_protocol', true), current_setting('citus.multi_shard_modify_mode', true), current_setting('citus.enable_function_delegation', true), current_setting('tessera.max_statement_memory', true), current_setting('citus.max_adaptive_executor_pool_size', true), current_setting('tessera.merge_shard_tasks', true), current_setting('citus.count_distinct_error_rate', true)";

    /// From the values `COLUMNS` gives, in order.
    pub fn from_values(values: &[Option<String>]) -> Self {
        let value = |i: usize| values.get(i).cloned().flatten();
        let off = |v: Option<String>| v.is_some_and(|v| matches!(v.to_ascii_lowercase().as_str(), "off" | "false" | "0" | "no"));
        CitusSettings {
            two_phase: value(0).as_deref() != Some("1pc"),
            sequential_modify: value(1).as_deref() == Some("sequential"),
            function_delegation: !off(value(2)),
            max_statement_memory: limits::MemorySetting::from_value(value(3).as_deref()),
            executor_pool_size: PoolSizeSetting::from_value(value(4).as_deref()),
            merge_shard_tasks: !off(value(5)),
            count_distinct_error_rate: ErrorRateSetting::from_value(value(6).as_deref()),
        }
    }
}

impl Participants {
    pub fn new(
        local: coordinator_db::CoordinatorDb,
        login: Login,
        cancel_targets: CancelTargets,
        limits: limits::StatementLimits,
        two_phase: TwoPhase,
        pools: Arc<WorkerPools>,
    ) -> Self {
        let mut startup: Vec<String> = login
            .options
            .iter()
            .filter(|(name, _)| WORKER_PARAMETERS.iter().any(|p| p.eq_ignore_ascii_case(name)))
            .map(|(name, value)| format!("{}={value}", name.to_lowercase()))
            .collect();
        startup.sort();
        let pool_key: Arc<str> = Arc::from(format!("{}\0{}", login.user, startup.join("\0")));
        let startup_state = login_state(&login);
        Participants {
            pool_key,
            startup_login: login.clone(),
            local,
            local_in_block: false,
            local_in_own_work: false,
            workers: HashMap::new(),
            pools,
            node_pools: HashMap::new(),
            last_backends: HashMap::new(),
            catalog_version: 0,
            login_state: startup_state,
            startup_state,
            login,
            block: None,
            cancel_targets,
            two_phase,
            settings: None,
            worker_role: None,
            role_unknown: false,
            role_changed_in_block: false,
            settings_epoch: 0,
            settings_changed_in_block: false,
            followed_unknown: false,
            followed_changed_in_block: false,
            session_settings: None,
            admission: None,
            limits,
            statement_timeout: None,
            session_connections_only: false,
        }
    }

    /// The identity worker connections log in with.
    pub fn login(&self) -> &Login {
        &self.login
    }

    pub fn status(&self) -> TxStatus {
        match &self.block {
            None => TxStatus::Idle,
            Some(b) if b.implicit => TxStatus::Idle,
            Some(b) if b.failed => TxStatus::Failed,
            Some(_) => TxStatus::InBlock,
        }
    }

    /// When the open block began.
    pub fn block_started(&self) -> Option<std::time::Instant> {
        self.block.as_ref().map(|b| b.started)
    }

    /// Outside any block, holding no node's connection (nor the
    /// coordinator database's): the next statement is its nodes' whole
    /// transaction.
    pub fn holds_no_connection(&self) -> bool {
        self.block.is_none() && self.workers.is_empty() && !self.local.is_held()
    }

    pub fn in_block(&self) -> bool {
        self.block.is_some()
    }

    /// Whether the current block wrote on node group `group`.
    pub fn wrote_on(&self, group: i32) -> bool {
        self.workers.get(&group).is_some_and(|w| w.in_block && w.wrote)
    }

    /// True inside a client's transaction block that an error has aborted.
    pub fn is_failed(&self) -> bool {
        self.block.as_ref().is_some_and(|b| b.failed)
    }

    pub fn mark_failed(&mut self) {
        if let Some(b) = &mut self.block {
            b.failed = true;
        }
    }

    pub fn failed_error() -> PgError {
        PgError::new(sqlstate::IN_FAILED_TRANSACTION, "current transaction is aborted, commands ignored until end of transaction block")
    }

    /// The coordinator database connection, inside the block if there is one.
    pub async fn local(&mut self) -> PgResult<&mut PgConnection> {
        self.limits.check()?;
        let join = match &self.block {
            Some(block) if !self.local_in_block => Some(replay_sql(block)),
            _ => None,
        };
        let local = self.local_outside_block().await?;
        if let Some(sql) = join {
            local.execute(&sql).await?;
            self.local_in_block = true;
        }
        Ok(self.local.held().expect("taken above"))
    }

    /// The coordinator database connection, without joining the block: for
    /// reading the session's settings and role.
    pub async fn local_outside_block(&mut self) -> PgResult<&mut PgConnection> {
        let addr = self.local.addr();
        let holds_block_connections = self.holds_block_connections();
        let limits = self.limits.clone();
        let (conn, taken) = limits.unless_stopped(self.local.acquire(&self.two_phase.session_name, holds_block_connections)).await?;
        if let Some(key) = taken {
            self.cancel_targets.lock().unwrap().push((addr, key));
        }
        Ok(conn)
    }

    /// The coordinator database connection the session holds in the middle
    /// of an exchange with it (after `local()` started the exchange).
    pub fn held_local(&mut self) -> PgResult<&mut PgConnection> {
        self.local
            .held()
            .ok_or_else(|| PgError::internal("the session holds no coordinator database connection in the middle of an exchange with it"))
    }

    /// The coordinator database connection for describing a statement: the
    /// block's if the block reached it (it may have made what the statement
    /// names), else any.
    pub async fn local_for_describe(&mut self) -> PgResult<&mut PgConnection> {
        if self.local_in_block {
            self.local().await
        } else {
            self.local_outside_block().await
        }
    }

    /// The coordinator database connection, if the session holds it now.
    pub fn local_if_held(&mut self) -> Option<&mut PgConnection> {
        self.local.held()
    }

    /// Logs in to the coordinator database as the client, which checks the
    /// role, the database and CONNECT, and reads what the session needs.
    pub async fn check_login(&mut self) -> PgResult<coordinator_db::LoginFacts> {
        self.local_outside_block().await?;
        let facts = self.local.read_login_facts().await?;
        self.settings = Some(facts.citus);
        self.statement_timeout = facts.statement_timeout;
        Ok(facts)
    }

    /// Takes an earlier login's facts when the coordinator database is down.
    pub fn assume_login(&mut self, facts: &coordinator_db::LoginFacts) {
        self.local.assume_login(facts);
        self.settings = Some(facts.citus);
        self.statement_timeout = facts.statement_timeout;
    }

    /// The limits of the statement running now.
    pub fn limits(&self) -> &limits::StatementLimits {
        &self.limits
    }

    /// The session's `statement_timeout` now (None: no limit).
    pub async fn statement_timeout(&mut self) -> PgResult<Option<std::time::Duration>> {
        if self.followed_unknown {
            self.read_followed_settings().await?;
        }
        Ok(self.statement_timeout)
    }

    pub fn login_key(&self) -> &str {
        self.local.login_key()
    }

    /// How long the client may leave its transaction block idle (None: no limit).
    pub fn idle_in_transaction_timeout(&self) -> Option<std::time::Duration> {
        self.local.idle_in_transaction_timeout()
    }

    /// The session made state only its coordinator database backend has.
    pub fn pin_local(&mut self, why: &'static str) {
        self.local.pin(why);
    }

    /// Begins (`true`) or ends a transaction on the coordinator database
    /// connection that holds the executor's own work inside one statement,
    /// outside any block: the session does not take it for a block the
    /// statement opened.
    pub fn begin_local_work(&mut self, begun: bool) {
        self.local_in_own_work = begun;
    }

    /// Called after forwarding client SQL (which may itself hold BEGIN/COMMIT, e.g.
    /// inside a function) to keep our view in line with the coordinator database.
    pub fn observe_local_status(&mut self) {
        self.follow_settings();
        let Some(status) = self.local.held().map(|l| l.tx_status()) else { return };
        if self.block.is_none() && status != TxStatus::Idle && !self.local_in_own_work {
            // The statement opened a block on its own (e.g. a procedure); follow it.
            self.block =
                Some(Block { begin_sql: "BEGIN".into(), started: std::time::Instant::now(), implicit: false, failed: false, savepoints: vec![] });
            self.local_in_block = true;
        }
        if self.local_in_block && status == TxStatus::Failed {
            self.mark_failed();
        }
    }

    /// A worker connection for `node`, opened on first use and joined to the
    /// block if there is one. The BEGIN is pipelined ahead of the caller's first
    /// statement rather than waited for.
    pub async fn worker(&mut self, node: &Node, access: Access) -> PgResult<&mut WorkerConnection> {
        self.limits.check()?;
        if self.role_unknown {
            self.follow_role().await?;
        }
        if self.followed_unknown {
            self.read_followed_settings().await?;
        }
        // A connection held from before the node moved (a failover,
        // citus_update_node) or was disabled is not used for it again,
        // unless a block under way needs it to the end.
        if self
            .workers
            .get_mut(&node.group_id)
            .is_some_and(|w| (!w.in_block && !w.needs_sync && (!node.active || !names(w.conn.label(), &node.addr))) || w.died_while_idle())
        {
            self.drop_worker(node.group_id);
        }
        let limits = self.limits.clone();
        if self.block.is_some() && self.admission.is_none() {
            self.admission = Some(limits.unless_stopped(self.pools.blocks.admit(self.pools.wait)).await?);
        }
        if !self.workers.contains_key(&node.group_id) {
            if !node.active {
                return Err(node.disabled_error());
            }
            let worker = limits.unless_stopped(self.take_worker(node)).await?;
            self.cancel_targets.lock().unwrap().push((node.addr.clone(), worker.conn.backend_key()));
            self.workers.insert(node.group_id, worker);
        }
        // A second writer makes the block two-phase, and its first writing
        // worker a candidate to decide it (see `deciding_worker`): that
        // worker's transaction (`decided::IDENTITY_SQL`) names the others'
        // parts, learnt now in the same flight as its first write rather
        // than asked for at COMMIT (assigning its id early costs nothing, as
        // the write is about to).
        let second_writer = self.block.is_some() && access == Access::Write && self.workers.values().filter(|w| w.wrote).count() == 1;
        let worker = self.workers.get_mut(&node.group_id).unwrap();
        worker.last_used = std::time::Instant::now();
        if !Arc::ptr_eq(&worker.type_oids, &node.type_oids) {
            worker.type_oids = node.type_oids.clone();
        }
        if let Some(block) = &self.block {
            if !worker.in_block {
                if *worker.named != *self.two_phase.session_name() {
                    worker.conn.queue_silent(&format!("SET application_name TO {}", crate::connection::quote_literal(self.two_phase.session_name())));
                    worker.named = self.two_phase.session_name.clone();
                }
                worker.conn.queue_silent(&replay_sql(block));
                worker.in_block = true;
                // Nothing an earlier block's transaction told may name this one's.
                worker.conn.take_captured();
                worker.decider = None;
            }
            if access == Access::Write && !worker.wrote {
                worker.wrote = true;
                if second_writer {
                    worker.conn.queue_capture(decided::IDENTITY_SQL);
                }
            }
        }
        Ok(worker)
    }

    /// A connection to `node` from its pool, made to carry this session's
    /// state, or a new one when none is idle (waiting for room if the node
    /// has its limit of connections open).
    async fn take_worker(&mut self, node: &Node) -> PgResult<WorkerConnection> {
        let pool = self.node_pool(node.group_id);
        let last = self.last_backends.get(&node.group_id).copied();
        let label = node.addr.to_string();
        let holds_block_connections = self.holds_block_connections();
        // A session already holding a connection (another node's for a
        // multi-shard statement or a pipeline before its Sync, the
        // coordinator database's for a statement it describes) does not wait
        // for this one to run: a session running here might wait for that.
        let holds_nothing = self.holds_no_connection();
        let running = if holds_nothing { pool.run_outside_block(self.pools.wait, &label).await? } else { None };
        let slot = loop {
            let mut worker = match pool
                .checkout(
                    &self.pool_key,
                    &|w: &WorkerConnection| Some(w.conn.backend_key()) == last,
                    self.pools.wait,
                    holds_block_connections,
                    &label,
                )
                .await?
            {
                Checkout::Open(slot) => break slot,
                Checkout::Idle(worker) => worker,
            };
            if !self.adopt(&mut worker, &label) {
                continue;
            }
            worker.running = running;
            return Ok(worker);
        };
        let mut worker = self.open_worker(node, slot, running).await?;
        self.pools.size_from(&pool, &mut worker.conn).await?;
        Ok(worker)
    }

    /// The pool of node group `group`, kept at hand.
    fn node_pool(&mut self, group: i32) -> Arc<crate::connection::pool::NodePool<WorkerConnection>> {
        self.node_pools.entry(group).or_insert_with(|| self.pools.node(group)).clone()
    }

    /// Makes an idle connection to the node at `label` carry this session's
    /// state (queued, sent ahead of its next statement); false when it is
    /// no use: closed by the node meanwhile, or to the node's old address
    /// (citus_update_node moved it).
    fn adopt(&self, worker: &mut WorkerConnection, label: &str) -> bool {
        if worker.died_while_idle() || **worker.conn.label() != *label {
            return false;
        }
        self.pools.stats.counters.add(Counter::ConnectionReused, 1);
        if worker.login_state != self.login_state {
            worker.conn.queue_silent(&self.handover_sql());
            worker.login_state = self.login_state;
            worker.named = self.two_phase.session_name.clone();
        }
        if *worker.owner != *self.two_phase.session_name() {
            worker.owner = self.two_phase.session_name.clone();
            worker.settings_epoch = u64::MAX;
        }
        if worker.prepared_version != self.catalog_version {
            worker.prepared.clear();
            worker.prepared_version = self.catalog_version;
        }
        true
    }

    /// Opens a new connection to `node` in `slot` of its pool, acting as
    /// this session does. The future borrows nothing of the session, so
    /// that it may run on while the session does other work.
    fn open_worker(
        &self,
        node: &Node,
        slot: tokio::sync::OwnedSemaphorePermit,
        running: Option<tokio::sync::OwnedSemaphorePermit>,
    ) -> impl std::future::Future<Output = PgResult<WorkerConnection>> + Send + 'static {
        let (addr, mut login) = (node.addr.clone(), self.startup_login.clone());
        // A task reading several shard groups is a UNION ALL of small shards,
        // which a Parallel Append would give parallel workers that tables of
        // their size never get: the node's cores already run one task per
        // connection, and PostgreSQL's parallel hash aggregates can spill
        // pathologically slowly over such input. Shards large enough for
        // parallel scans of their own still get them.
        login.options.push(("enable_parallel_append".into(), "off".into()));
        let handover = (self.login_state != self.startup_state).then(|| self.handover_sql());
        let (group_id, type_oids, name) = (node.group_id, node.type_oids.clone(), self.two_phase.session_name.clone());
        let (login_state, catalog_version) = (self.login_state, self.catalog_version);
        let stats = self.pools.stats.clone();
        async move {
            let connected = PgConnection::connect(&addr, &login).await;
            let outcome = if connected.is_ok() { Counter::ConnectionEstablishmentSucceeded } else { Counter::ConnectionEstablishmentFailed };
            stats.counters.add(outcome, 1);
            let mut conn = connected?;
            if let Some(sql) = handover {
                conn.queue_silent(&sql);
            }
            Ok(WorkerConnection {
                conn,
                group_id,
                type_oids,
                in_block: false,
                wrote: false,
                decider: None,
                prepared: HashMap::new(),
                statements_made: 0,
                needs_sync: false,
                settings_epoch: 0,
                last_used: std::time::Instant::now(),
                owner: name.clone(),
                login_state,
                named: name,
                prepared_version: catalog_version,
                running,
                _slot: slot,
            })
        }
    }

    /// The login of connections that act as this session does (its role, the
    /// settings it logged in with) but belong to no pool and no block: for
    /// run_command_on_workers and its kin, whose commands may SET things or
    /// leave a transaction open. Their `application_name` lacks the prefix
    /// that marks the session's own backends (deadlock detection and
    /// recovery read it).
    pub async fn separate_login(&mut self) -> PgResult<Login> {
        if self.role_unknown {
            self.follow_role().await?;
        }
        let mut login = self.startup_login.clone();
        login.options = self.login.options.iter().filter(|(name, _)| name != "application_name").cloned().collect();
        login.options.push(("application_name".into(), format!("run_command of {}", self.two_phase.session_name())));
        Ok(login)
    }

    /// Where the session's cancel requests go, for connections of its own
    /// that a command opens.
    pub fn cancel_targets(&self) -> CancelTargets {
        self.cancel_targets.clone()
    }

    /// What makes a connection another session left carry this session's
    /// state: its settings as at login (and as SET since, for those the
    /// workers follow), its role, and its name.
    fn handover_sql(&self) -> String {
        let mut sql =
            vec!["RESET ALL".to_string(), format!("SET application_name TO {}", crate::connection::quote_literal(self.two_phase.session_name()))];
        let mut role = "SET ROLE NONE".to_string();
        for (name, value) in &self.login.options {
            if name == "role" {
                role = format!("SET ROLE {}", crate::connection::quote_ident(value));
            } else {
                sql.push(format!("SET {} TO {}", crate::connection::quote_ident(name), crate::connection::quote_literal(value)));
            }
        }
        sql.push(role);
        sql.join("; ")
    }

    /// Once the client has its answer: gives the connections the session
    /// holds back to their pools, those of a transaction block excepted. The
    /// coordinator database's only when `local_too` (no exchange with it is
    /// unfinished); in a block, when the block has not reached it.
    pub async fn release_connections(&mut self, local_too: bool) {
        self.release_workers();
        if local_too && !self.local_in_block {
            if let Some(key) = self.local.release().await {
                self.cancel_targets.lock().unwrap().retain(|(_, k)| *k != key);
            }
        }
    }

    /// Whether the session holds worker connections in its block: it then
    /// must not wait for a pool (see `NodePool::checkout`).
    fn holds_block_connections(&self) -> bool {
        self.block.is_some() && self.workers.values().any(|w| w.in_block)
    }

    /// Gives the worker connections the session holds back to their pools,
    /// between transactions: those in no block and in no unfinished
    /// exchange. A connection a statement stopped reading halfway (see
    /// `PgConnection::is_in_step`) is broken: closed outside a block, and
    /// inside one kept until the block ends, which then cannot commit. One
    /// left inside a transaction outside a block is closed too: a cancel
    /// request that lands after its statement ended can fail the ROLLBACK
    /// that follows, and the next block's BEGIN there would fail with 25P02.
    fn release_workers(&mut self) {
        for w in self.workers.values_mut().filter(|w| !w.needs_sync) {
            w.conn.break_if_out_of_step();
        }
        let closed: Vec<i32> = self
            .workers
            .iter()
            .filter(|(_, w)| !w.in_block && (w.conn.is_broken() || (!w.needs_sync && !w.conn.is_reusable())))
            .map(|(group, _)| *group)
            .collect();
        for group in closed {
            self.drop_worker(group);
        }
        if self.block.is_some() {
            return;
        }
        self.admission = None;
        // The broken ones outside a block are gone: the rest may go back.
        let idle: Vec<i32> = self.workers.iter().filter(|(_, w)| !w.in_block && !w.needs_sync).map(|(group, _)| *group).collect();
        for group in idle {
            let Some(mut w) = self.workers.remove(&group) else { continue };
            w.running = None;
            let key = w.conn.backend_key();
            self.cancel_targets.lock().unwrap().retain(|(_, k)| *k != key);
            self.last_backends.insert(group, key);
            match self.node_pools.get(&group) {
                Some(pool) => pool.give_back(&self.pool_key, w),
                None => self.pools.node(group).give_back(&self.pool_key, w),
            }
        }
    }

    /// The session's name, which its worker connections carry.
    pub fn session_name(&self) -> &str {
        self.two_phase.session_name()
    }

    /// Forgets the statements prepared on the workers (they stay there until
    /// the connection closes, under names never used again), so that the
    /// next use prepares them afresh.
    pub fn forget_prepared_statements(&mut self, catalog_version: i64) {
        self.catalog_version = catalog_version;
        for w in self.workers.values_mut() {
            w.prepared.clear();
            w.prepared_version = catalog_version;
        }
    }

    /// Whether the current block has already touched this node group.
    pub fn has_worker_in_block(&self, group_id: i32) -> bool {
        self.workers.get(&group_id).is_some_and(|w| w.in_block)
    }

    /// The open connections to these node groups, to use side by side.
    pub fn workers_for(&mut self, groups: &[i32]) -> Vec<&mut WorkerConnection> {
        self.workers.iter_mut().filter(|(group, _)| groups.contains(group)).map(|(_, w)| w).collect()
    }

    /// The node groups the current block has written through.
    pub fn block_writers(&self) -> Vec<i32> {
        self.workers.values().filter(|w| w.in_block && w.wrote).map(|w| w.group_id).collect()
    }

    /// Whether the current block has written through any worker connection
    /// (writes that connections other than the session's cannot see yet).
    pub fn wrote_on_workers(&self) -> bool {
        self.workers.values().any(|w| w.in_block && w.wrote)
    }

    /// Drops the worker connections an I/O failure broke.
    pub fn discard_broken(&mut self) {
        let broken: Vec<i32> = self.workers.iter().filter(|(_, w)| w.conn.is_broken()).map(|(group, _)| *group).collect();
        for group in broken {
            self.drop_worker(group);
        }
    }

    /// Forgets a worker connection, and its backend as a target for the
    /// client's cancel requests.
    fn drop_worker(&mut self, group_id: i32) {
        if let Some(w) = self.workers.remove(&group_id) {
            let key = w.conn.backend_key();
            self.cancel_targets.lock().unwrap().retain(|(_, k)| *k != key);
        }
    }

    pub fn workers_needing_sync(&mut self) -> impl Iterator<Item = &mut WorkerConnection> {
        self.workers.values_mut().filter(|w| w.needs_sync)
    }
}

/// A fingerprint of the role and settings a worker connection logged in
/// with `login` acts with; the name (application_name) aside, which only
/// matters inside blocks.
fn login_state(login: &Login) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut options: Vec<&(String, String)> = login.options.iter().filter(|(name, _)| name != "application_name").collect();
    options.sort();
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    options.hash(&mut hasher);
    hasher.finish()
}

/// BEGIN plus the savepoints taken so far, for a node joining the block late.
fn replay_sql(block: &Block) -> String {
    let mut sql = block.begin_sql.clone();
    for s in &block.savepoints {
        sql.push_str(&format!("; SAVEPOINT {}", crate::connection::quote_ident(s)));
    }
    sql
}

/// Whether a connection's label ("host:port") names `addr`, without
/// formatting the address (the check runs for every statement).
fn names(label: &str, addr: &ServerAddr) -> bool {
    label.rsplit_once(':').is_some_and(|(host, port)| host == addr.host && port.parse() == Ok(addr.port))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_executor_pool_size_setting() {
        assert_eq!(PoolSizeSetting::from_value(None), PoolSizeSetting::Unset);
        assert_eq!(PoolSizeSetting::from_value(Some("")), PoolSizeSetting::Unset, "after RESET");
        assert_eq!(PoolSizeSetting::from_value(Some("4")), PoolSizeSetting::Size(4));
        assert_eq!(PoolSizeSetting::from_value(Some("0")), PoolSizeSetting::Invalid);
        assert_eq!(PoolSizeSetting::from_value(Some("lots")), PoolSizeSetting::Invalid);
    }
}
