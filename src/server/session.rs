//! One client session: start-up, then the simple and extended query protocols.
//! Each statement is planned (plans are cached by text) and dispatched: local
//! statements are forwarded to the coordinator database message by message, the
//! rest run through the executor or the command layer.

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
use crate::metadata::{self, Catalog, FoundRelation, UnqualifiedNames};
use crate::planner::{self, Plan, PlannedStatement, RouterPlan, SqlExecute, TransactionCommand};
use crate::process::context::{Caller, CommandContext};
use crate::process::Coordinator;
use crate::protocol::backend::{self, FieldDescription};
use crate::protocol::frontend::{self, Bind, StartupPacket, Target};
use crate::protocol::Message;
use crate::transaction::{Participants, WORKER_PARAMETERS};
use crate::transport::Stream;
use futures::FutureExt;
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

pub async fn run(coordinator: Arc<Coordinator>, front: Arc<Front>, stream: Stream) -> anyhow::Result<()> {
    let mut client = ClientConn::new(stream);
    let counted = ClientCount::enter(&coordinator);
    let params = loop {
        let Some(packet) = client.recv_startup().await? else { return Ok(()) };
        match frontend::decode_startup(&packet)? {
            StartupPacket::SslRequest => match &front.tls {
                Some(tls) if client.is_clear_tcp() => {
                    client.write_now(b"S").await?;
                    client = ClientConn::new(client.into_stream()?.accept_tls(tls).await?);
                }
                _ => client.write_now(b"N").await?,
            },
            StartupPacket::GssEncRequest => client.write_now(b"N").await?,
            StartupPacket::Cancel { process_id, secret_key } => {
                coordinator.cancel((process_id, secret_key)).await;
                return Ok(());
            }
            StartupPacket::Startup { params } => break params,
        }
    };
    let get = |k: &str| params.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
    let user = get("user").unwrap_or_default();
    let database = get("database").unwrap_or_else(|| user.clone());
    if user.is_empty() {
        return refuse(&mut client, PgError::new("28000", "no PostgreSQL user name specified in startup packet")).await;
    }
    if counted.over_limit {
        return refuse(
            &mut client,
            PgError::new(sqlstate::TOO_MANY_CONNECTIONS, "sorry, too many clients already").with_hint(format!(
                "The coordinator accepts {} clients at once ([connections] max_clients).",
                coordinator.config.connections.max_clients
            )),
        )
        .await;
    }
    if client.is_clear_tcp() && coordinator.config.tls.as_ref().is_some_and(|tls| tls.mode == TlsMode::Require) {
        return refuse(
            &mut client,
            PgError::new("28000", format!("the coordinator accepts user \"{user}\" over TCP only with TLS (tls.mode = \"require\")"))
                .with_hint("Connect with sslmode=require, or over the Unix socket."),
        )
        .await;
    }
    if get("replication").is_some() {
        return refuse(&mut client, PgError::not_supported("replication connections are not supported by the Tessera coordinator")).await;
    }
    if coordinator.config.auth == AuthMethod::ScramSha256 {
        let outcome = tokio::time::timeout(AUTH_TIMEOUT, scram_login(&coordinator, &front.logins, &mut client, &user)).await;
        match outcome {
            Ok(Ok(Authentication::Passed)) => {}
            Ok(Ok(Authentication::Refused(e))) => return refuse(&mut client, e).await,
            Ok(Ok(Authentication::Abandoned)) => return Ok(()),
            Ok(Err(e)) => return Err(e.context("during authentication")),
            Err(_) => return Err(anyhow::anyhow!("authentication of user \"{user}\" timed out")),
        }
    }
    let options: Vec<(String, String)> = params.iter().filter(|(k, _)| k != "user" && k != "database").cloned().collect();
    let local_login = Login {
        user: user.clone(),
        database: database.clone(),
        password: coordinator.config.coordinator_db.password.clone(),
        options: options.clone(),
    };
    let key = crate::process::new_session_key();
    let worker_options: Vec<(String, String)> =
        options.into_iter().filter(|(k, _)| WORKER_PARAMETERS.iter().any(|p| p.eq_ignore_ascii_case(k))).collect();
    let worker_login = Login {
        user,
        database: coordinator.config.coordinator_db.database.clone(),
        password: coordinator.config.coordinator_db.password.clone(),
        options: worker_options,
    };
    let mut parts = coordinator.participants(key, local_login, worker_login);
    let facts = match parts.check_login().await {
        Ok(facts) => {
            front.logins.remember_login(parts.login_key(), &facts);
            facts
        }
        Err(e) => match front.logins.recall_login(parts.login_key()).filter(|_| e.is_node_unreachable()) {
            Some(facts) => {
                tracing::warn!(
                    "the coordinator database is unreachable ({}); a login of user \"{}\" goes ahead as the last one did",
                    e.message(),
                    parts.login().user
                );
                parts.assume_login(&facts);
                facts
            }
            None => {
                coordinator.unregister_session(key);
                return refuse(&mut client, e).await;
            }
        },
    };
    client.authenticated();
    backend::authentication_ok(client.out());
    for (k, v) in &facts.server_params {
        backend::parameter_status(client.out(), k, v);
    }
    backend::backend_key_data(client.out(), key.0, key.1);
    backend::ready_for_query(client.out(), backend::TxStatus::Idle);
    client.flush().await?;
    let distributed = database == coordinator.config.coordinator_db.database;
    let mut session = Session {
        coordinator: coordinator.clone(),
        client,
        parts,
        distributed,
        plans: HashMap::new(),
        block_catalog: None,
        block_catalog_loads: 0,
        stream: None,
        shells: ShellAnswers::default(),
        catalog_version: 0,
        statements: HashMap::new(),
        portals: HashMap::new(),
        sql_prepared: HashMap::new(),
        local_expected: 0,
        local_unsynced: false,
        user_code_unsynced: false,
        skip_until_sync: false,
        release_work: false,
        abandoned: false,
        search_path: SearchPath { stale: !facts.search_path_public, ..SearchPath::default() },
        query_text: String::new(),
    };
    // A client that logs in and waits holds no connection meanwhile.
    session.parts.release_connections(true).await;
    let result = session.serve().await;
    coordinator.unregister_session(key);
    if !session.abandoned {
        if session.parts.in_block() {
            session.parts.rollback().await.ok();
        }
        session.parts.close().await;
    }
    result
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

/// How long a client may take to authenticate (PostgreSQL's `authentication_timeout`).
const AUTH_TIMEOUT: Duration = Duration::from_secs(60);

/// AuthenticationSASL, AuthenticationSASLContinue and AuthenticationSASLFinal.
const AUTH_SASL: i32 = 10;
const AUTH_SASL_CONTINUE: i32 = 11;
const AUTH_SASL_FINAL: i32 = 12;

/// How a client's password exchange ended.
enum Authentication {
    /// AuthenticationSASLFinal is buffered; AuthenticationOk follows once the
    /// session's connections are up.
    Passed,
    /// Refuse the connection with this error.
    Refused(PgError),
    /// The client hung up part-way (as libpq does to prompt for a password).
    Abandoned,
}

/// Runs SASL SCRAM-SHA-256 with the client against the role's verifier in the
/// coordinator database. Every way of failing looks the same to the client,
/// as in PostgreSQL; the reason goes to the log.
async fn scram_login(coordinator: &Coordinator, logins: &LoginMemory, client: &mut ClientConn, user: &str) -> anyhow::Result<Authentication> {
    let stored = match stored_password(coordinator, user).await {
        Ok(stored) => {
            logins.remember_verifier(user, stored.clone());
            stored
        }
        Err(e) => match logins.recall_verifier(user).filter(|_| e.is_node_unreachable()) {
            Some(stored) => {
                tracing::warn!(
                    "the coordinator database is unreachable ({}); user \"{user}\" is checked against the password it had last time",
                    e.message()
                );
                stored
            }
            None => {
                tracing::warn!("could not look up the password of user \"{user}\": {e}");
                return Ok(Authentication::Refused(e));
            }
        },
    };
    let mut exchange = auth::ScramExchange::for_role(stored.as_deref(), user, auth::new_server_nonce());
    backend::authentication_sasl(client.out(), AUTH_SASL, &auth::mechanism_list());
    client.flush().await?;
    let Some(msg) = client.recv().await? else { return Ok(Authentication::Abandoned) };
    let server_first = match (msg.tag(), frontend::decode_sasl_initial_response(&msg)) {
        (b'p', Ok((mechanism, data))) => exchange.client_first(mechanism, data.unwrap_or_default()),
        _ => Err(auth::Rejected("expected a SASLInitialResponse message")),
    };
    let server_first = match server_first {
        Ok(message) => message,
        Err(why) => return Ok(password_failed(user, why)),
    };
    backend::authentication_sasl(client.out(), AUTH_SASL_CONTINUE, server_first.as_bytes());
    client.flush().await?;
    let Some(msg) = client.recv().await? else { return Ok(Authentication::Abandoned) };
    let server_final = match msg.tag() {
        b'p' => exchange.client_final(msg.body()),
        _ => Err(auth::Rejected("expected a SASLResponse message")),
    };
    match server_final {
        Ok(message) => {
            backend::authentication_sasl(client.out(), AUTH_SASL_FINAL, message.as_bytes());
            Ok(Authentication::Passed)
        }
        Err(why) => Ok(password_failed(user, why)),
    }
}

fn password_failed(user: &str, why: auth::Rejected) -> Authentication {
    tracing::info!("password authentication failed for user \"{user}\": {why}");
    Authentication::Refused(PgError::new(sqlstate::INVALID_PASSWORD, format!("password authentication failed for user \"{user}\"")))
}

/// The role's `rolpassword` unless it has expired; None for unknown roles.
/// Read with the coordinator's own login, which must be allowed to read
/// `pg_authid` (a superuser).
async fn stored_password(coordinator: &Coordinator, user: &str) -> PgResult<Option<String>> {
    let config = &coordinator.config;
    let addr = config.coordinator_db_addr();
    let mut conn =
        PgConnection::connect(&addr, &config.service_login()).await.map_err(|e| crate::transaction::coordinator_db::unavailable(&addr, e))?;
    let sql = format!(
        "SELECT rolpassword FROM pg_catalog.pg_authid WHERE rolname = {} AND (rolvaliduntil IS NULL OR rolvaliduntil > now())",
        quote_literal(user)
    );
    let stored = conn.query_value(&sql).await;
    conn.terminate().await;
    stored
}

/// Counts a client among those connected, for as long as it lives.
struct ClientCount<'a> {
    coordinator: &'a Coordinator,
    over_limit: bool,
}

impl<'a> ClientCount<'a> {
    fn enter(coordinator: &'a Coordinator) -> Self {
        let before = coordinator.clients.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        ClientCount { coordinator, over_limit: before >= coordinator.config.connections.max_clients }
    }
}

impl Drop for ClientCount<'_> {
    fn drop(&mut self) {
        self.coordinator.clients.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
    }
}

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

    fn catalog(&self) -> Arc<Catalog> {
        let base = self.base_catalog();
        let Some(unqualified) = &self.search_path.unqualified else { return base };
        let mut derived = self.search_path.catalog.borrow_mut();
        match derived.as_ref() {
            Some((from, catalog)) if Arc::ptr_eq(from, &base) => catalog.clone(),
            _ => {
                let catalog = Arc::new(base.with_search_path(unqualified.clone()));
                *derived = Some((base, catalog.clone()));
                catalog
            }
        }
    }

    /// The catalog before the session's search_path is applied.
    fn base_catalog(&self) -> Arc<Catalog> {
        if let Some(catalog) = self.block_catalog.as_ref().filter(|_| self.parts.in_block()) {
            return catalog.clone();
        }
        if self.distributed {
            self.coordinator.catalog.snapshot()
        } else {
            Arc::new(Catalog::default())
        }
    }

    /// Reads where the session's search_path leads distributed tables'
    /// unqualified names, if a statement may have changed it, or if it leads
    /// elsewhere than `public` and the catalog changed since. A temporary
    /// relation counts as leading elsewhere: PostgreSQL looks in the
    /// session's temporary schema first, so a temporary table can hide a
    /// distributed one, and a temporary view is the session's alone. Plans
    /// made under another answer are dropped.
    async fn follow_search_path(&mut self) -> Result<(), Failure> {
        let base = self.base_catalog();
        let outdated = self.search_path.unqualified.is_some() && self.search_path.read_at != base.version;
        if !self.distributed || !(self.search_path.stale || outdated) || self.parts.is_failed() {
            return Ok(());
        }
        let names: Vec<String> = base.relation_names().into_iter().map(quote_literal).collect();
        // One row at least, saying whether unqualified names may lead
        // elsewhere than `public` (a path elsewhere, or temporary relations,
        // which come first); the names only then. Such a session follows the
        // path even while no name needs it, so that names distributed later
        // are looked up.
        let rows = self
            .parts
            .local_for_describe()
            .await?
            .query(&format!(
                "SELECT p.follows, n, s.nspname, c.oid
                   FROM (SELECT pg_catalog.current_schemas(false) <> ARRAY['public']::name[]
                                OR EXISTS (SELECT FROM pg_catalog.pg_class t WHERE t.relnamespace = pg_catalog.pg_my_temp_schema()) AS follows) p
                   LEFT JOIN unnest(ARRAY[{}]::text[]) n ON p.follows
                   LEFT JOIN pg_catalog.pg_class c ON c.oid = pg_catalog.to_regclass(pg_catalog.quote_ident(n))
                   LEFT JOIN pg_catalog.pg_namespace s ON s.oid = c.relnamespace",
                names.join(", ")
            ))
            .await?;
        let follows = rows.first().and_then(|row| row.first().cloned().flatten()).as_deref() == Some("t");
        let unqualified = follows.then(|| {
            let found: UnqualifiedNames = rows
                .into_iter()
                .filter_map(|row| {
                    let mut columns = row.into_iter().skip(1);
                    let name = columns.next().flatten()?;
                    let schema = columns.next().flatten();
                    let oid = columns.next().flatten().and_then(|oid| oid.parse().ok());
                    Some((name, schema.zip(oid).map(|(schema, oid)| FoundRelation { schema, oid })))
                })
                .collect();
            Arc::new(found)
        });
        self.search_path.stale = false;
        self.search_path.read_at = base.version;
        if unqualified != self.search_path.unqualified {
            self.search_path.unqualified = unqualified;
            self.search_path.generation += 1;
            *self.search_path.catalog.borrow_mut() = None;
            self.plans.clear();
            self.shells.clear();
        }
        Ok(())
    }

    /// The catalog to run under. After a catalog change (DDL above all) the
    /// statement descriptions and the statements prepared on the workers are
    /// made afresh: a statement such as `SELECT *` described or prepared before
    /// an ALTER TABLE would show or return the old columns, where a client that
    /// parses its statement again expects the new ones.
    fn catalog_to_run_under(&mut self) -> Arc<Catalog> {
        let catalog = self.catalog();
        if catalog.version != self.catalog_version {
            self.catalog_version = catalog.version;
            self.shells.clear();
            self.parts.forget_prepared_statements(catalog.version);
        }
        catalog
    }

    fn plan(&mut self, sql: &str) -> Arc<CachedPlan> {
        let planned = self.plan_cached(sql);
        if planned.statements.iter().any(|s| s.changes_settings) {
            let custom: Vec<String> = planned.statements.iter().flat_map(|s| s.custom_settings.iter().cloned()).collect();
            let followed = planned.statements.iter().any(|s| s.changes_followed_settings);
            self.parts.settings_may_have_changed(&custom, followed);
        }
        if let Some(why) = planned.statements.iter().find_map(|s| s.pins) {
            self.parts.pin_local(why);
        }
        if planned.statements.iter().any(|s| s.changes_role) {
            self.parts.role_may_have_changed();
        }
        // The end of a block (or of a savepoint) may undo a SET in it.
        let undoes = |s: &PlannedStatement| {
            matches!(s.plan, Plan::Transaction(TransactionCommand::Commit | TransactionCommand::Rollback | TransactionCommand::RollbackTo(_)))
        };
        if self.search_path.changed_since_block_end && planned.statements.iter().any(undoes) {
            self.search_path.stale = true;
            self.search_path.changed_since_block_end = false;
        }
        if planned.statements.iter().any(|s| self.moves_names(s)) {
            self.search_path.stale = true;
            self.search_path.changed_since_block_end = true;
        }
        planned
    }

    /// Whether a statement may change which relation an unqualified name
    /// finds: a change of the search_path (or of relations' names), or, on a
    /// path other than `public` alone, a relation created (a new table in an
    /// earlier schema hides a distributed one of its name).
    fn moves_names(&self, statement: &PlannedStatement) -> bool {
        statement.changes_search_path || (statement.changes_relations && self.search_path.unqualified.is_some())
    }

    fn plan_cached(&mut self, sql: &str) -> Arc<CachedPlan> {
        let catalog = self.catalog();
        if let Some(p) = self.plans.get(sql) {
            if p.version == catalog.version && p.search_path == self.search_path.generation {
                return p.clone();
            }
        }
        if self.plans.len() >= PLAN_CACHE_LIMIT {
            self.plans.clear();
        }
        let planned = Arc::new(CachedPlan {
            version: catalog.version,
            search_path: self.search_path.generation,
            statements: planner::plan_query(sql, &catalog),
        });
        self.plans.insert(sql.to_string(), planned.clone());
        planned
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

    // ---- simple query protocol ----

    async fn simple_query(&mut self, msg: &Message) -> anyhow::Result<()> {
        self.settle_stream().await;
        let sql = frontend::decode_query(msg)?.to_string();
        self.query_text.clear();
        self.query_text.push_str(&sql);
        if let Err(f) = self.follow_search_path().await {
            self.report(f);
            backend::ready_for_query(self.client.out(), self.parts.status());
            return Ok(self.client.flush().await?);
        }
        if let Err(f) = self.check_catalog(&sql).await {
            self.report(f);
            backend::ready_for_query(self.client.out(), self.parts.status());
            return Ok(self.client.flush().await?);
        }
        let mut planned = self.plan(&sql);
        // A search_path change before the last statement may make a later
        // one distributed: those go one by one.
        let path_changes_midway = planned.statements.iter().rev().skip(1).any(|s| self.moves_names(s));
        let all_local = !path_changes_midway && planned.statements.iter().all(|s| matches!(s.plan, Plan::Local | Plan::Empty));
        let mut one_by_one = !all_local || self.parts.is_failed();
        if !one_by_one {
            // The common pass-through case: the whole string, in one message.
            // A lone write outside a block that waited for the lock of a
            // table being distributed is sent again, to the shards, once the
            // distribution has committed.
            let lone_statement = planned.statements.len() == 1 && !self.parts.in_block();
            let distributed_meanwhile = match self.parts.local().await {
                Ok(local) => {
                    local.out().extend_from_slice(msg.frame());
                    self.relay_local_until_ready(lone_statement).await.unwrap_or_else(|f| {
                        self.report(f);
                        false
                    })
                }
                Err(e) => {
                    self.report(e.into());
                    false
                }
            };
            if planned.statements.iter().any(|s| s.changes_user_code) {
                if let Err(f) = self.see_user_code_change().await {
                    self.report(f);
                }
            }
            if distributed_meanwhile {
                // Sent again only under a catalog that knows the distribution.
                match self.coordinator.reload_catalog().await {
                    Ok(()) => {
                        planned = self.plan(&sql);
                        one_by_one = true;
                    }
                    Err(e) => self.report(self.coordinator.catalog_refusal(&e).into()),
                }
            }
        }
        if one_by_one {
            let mut i = 0;
            let mut retried = false;
            while let Some(stmt) = planned.statements.get(i) {
                if self.hold_for_fences(&stmt.plan).await {
                    planned = self.plan(&sql);
                    continue;
                }
                let written = self.client.out().len();
                let result = self.execute_simple(stmt).await;
                if let Err(f) = &result {
                    if planned.statements.len() == 1 && !retried && self.client.out().len() == written && self.shard_gone(f, planned.version).await {
                        retried = true;
                        planned = self.plan(&sql);
                        continue;
                    }
                }
                // Outside a block, distributed DDL has reloaded the catalog already.
                let mut result = result;
                if stmt.changes_user_code && (self.parts.in_block() || !matches!(stmt.plan, Plan::Ddl(_))) {
                    if let Err(f) = self.see_user_code_change().await {
                        result = result.and(Err(f));
                    }
                }
                if let Err(f) = result {
                    self.report(f);
                    break;
                }
                self.parts.settle_links().await;
                i += 1;
                // A statement that changed the catalog (create_distributed_table,
                // DROP TABLE, …) or the search_path changes how the statements
                // after it must run.
                // Read again after each such statement, not once per string.
                self.search_path.stale |= self.moves_names(stmt);
                if self.search_path.stale {
                    if let Err(f) = self.follow_search_path().await {
                        self.report(f);
                        break;
                    }
                }
                if self.catalog().version != planned.version || self.search_path.generation != planned.search_path {
                    planned = self.plan(&sql);
                }
            }
        }
        self.parts.observe_local_status();
        self.release_deadlocked_work().await;
        self.parts.settle_links().await;
        backend::ready_for_query(self.client.out(), self.parts.status());
        self.client.flush().await?;
        self.parts.release_connections(true).await;
        Ok(())
    }

    /// Whether a statement outside a block failed because a shard it reads or
    /// writes was dropped while it waited for it (undistribute_table,
    /// alter_distributed_table), and the catalog, reloaded now, has changed
    /// since `planned_version`: planned again, it goes where the table is now.
    async fn shard_gone(&mut self, failure: &Failure, planned_version: i64) -> bool {
        let Failure::Error(e) = failure else { return false };
        if e.code() != sqlstate::UNDEFINED_TABLE || self.parts.in_block() || self.coordinator.reload_catalog().await.is_err() {
            return false;
        }
        self.catalog().version != planned_version
    }

    /// Waits while a shard group the statement may write to is being cut
    /// over to another node (see `operations::fence`). True when it waited:
    /// the catalog changed, and the statement must be planned again.
    async fn hold_for_fences(&mut self, plan: &Plan) -> bool {
        let parts = &self.parts;
        let wrote_on = |group: i32| parts.wrote_on(group);
        let block = parts.block_started().map(|started| (started, &wrote_on as &dyn Fn(i32) -> bool));
        let Some(mut lifted) = self.coordinator.fences.holding(plan, block) else { return false };
        let _ = lifted.wait_for(|lifted| *lifted).await;
        true
    }

    async fn release_deadlocked_work(&mut self) {
        if std::mem::take(&mut self.release_work) {
            self.parts.release_failed_work().await;
        }
    }

    async fn execute_simple(&mut self, stmt: &PlannedStatement) -> Result<(), Failure> {
        self.check_not_failed(&stmt.plan)?;
        match &stmt.plan {
            Plan::Empty => backend::empty_query_response(self.client.out()),
            Plan::Local => {
                let local = self.parts.local().await?;
                frontend::query(local.out(), &stmt.sql);
                self.relay_local_until_ready(false).await?;
                self.parts.observe_local_status();
                // Known only now that it ran (statements before it in the
                // same query string may have used the workers, or begun the
                // block whose end may undo it).
                if stmt.changes_role {
                    self.parts.role_may_have_changed();
                }
                if stmt.changes_settings {
                    self.parts.settings_may_have_changed(&stmt.custom_settings, stmt.changes_followed_settings);
                }
            }
            other => self.execute_distributed(&stmt.sql, other, None).await?,
        }
        Ok(())
    }

    fn check_not_failed(&self, plan: &Plan) -> Result<(), Failure> {
        let ends_block =
            matches!(plan, Plan::Transaction(TransactionCommand::Commit | TransactionCommand::Rollback | TransactionCommand::RollbackTo(_)));
        if self.parts.is_failed() && !ends_block {
            return Err(Participants::failed_error().into());
        }
        Ok(())
    }

    async fn run_router(&mut self, router: &RouterPlan, catalog: &Catalog, extended: Option<(&Bind, &Shape)>) -> Result<(), Failure> {
        let mode = execution_mode(extended, self.client.peek_tag() == Some(b'S'));
        let result = executor::run_router(router, &mut self.parts, catalog, &mode, &mut self.client).await;
        if result.is_err() {
            self.parts.discard_broken();
        }
        Ok(result?)
    }

    /// Runs a statement that is not plain pass-through. `extended` carries the
    /// client's Bind and the statement's shape for the extended protocol.
    /// One whose work spans several nodes or the coordinator runs under its
    /// limits (`transaction::limits`): its timeout, the client's cancel
    /// request and its memory stop all of it.
    async fn execute_distributed(&mut self, sql: &str, plan: &Plan, extended: Option<(&Bind, &Shape)>) -> Result<(), Failure> {
        let limits = self.parts.limits().clone();
        if !watched(plan) || limits.is_armed() {
            return self.execute_plan(sql, plan, extended).await;
        }
        let timeout = self.parts.statement_timeout().await?;
        let memory = self.parts.citus_settings().await?.max_statement_memory.limit(self.coordinator.config.statements.memory_limit())?;
        limits.arm(sql, timeout, memory);
        let result = limits.enforce(self.execute_plan(sql, plan, extended)).await;
        let result = match result {
            Err(Failure::Error(e)) => Err(Failure::Error(limits.reported(e))),
            other => other,
        };
        limits.disarm();
        result
    }

    async fn execute_plan(&mut self, sql: &str, plan: &Plan, extended: Option<(&Bind, &Shape)>) -> Result<(), Failure> {
        let catalog = self.catalog_to_run_under();
        if let Some(check) = shell_check(plan) {
            let param_types = extended.map_or(&[][..], |(_, shape)| shape.param_types.as_slice());
            self.check_on_shells(sql, param_types, check).await?;
        }
        match plan {
            Plan::Empty | Plan::Local => unreachable!("pass-through statements are forwarded"),
            Plan::Unsupported(e) => {
                // PostgreSQL's own complaint (an unknown column, say) is the more
                // useful one; the coordinator database checks against the shells.
                if extended.is_none() {
                    self.describe_shape(sql, &[]).await?;
                }
                return Err(e.clone().into());
            }
            Plan::Transaction(command) => {
                let tag = self.transaction_command(command).await?;
                backend::command_complete(self.client.out(), tag);
            }
            Plan::Router(router) => self.run_router(router, &catalog, extended).await?,
            Plan::Delegated(delegation) => {
                if executor::delegates(delegation, &mut self.parts).await? {
                    let mode = execution_mode(extended, self.client.peek_tag() == Some(b'S'));
                    let result = executor::function_copies::run_delegated(
                        delegation,
                        &mut self.parts,
                        &catalog,
                        &mode,
                        &mut self.client,
                        &self.coordinator.config,
                    )
                    .await;
                    if result.is_err() {
                        self.parts.discard_broken();
                    }
                    result?;
                } else if matches!(delegation.otherwise, Plan::Local) {
                    executor::run_on_coordinator_db(&mut self.parts, sql, &execution_mode(extended, false), &mut self.client).await?;
                } else {
                    Box::pin(self.execute_distributed(sql, &delegation.otherwise, extended)).await?;
                }
            }
            Plan::KeysMeet(meet) => {
                let meets = executor::keys_meet(&meet.route, &mut self.parts, &execution_mode(extended, false)).await?;
                if meets {
                    self.run_router(&meet.route, &catalog, extended).await?;
                } else {
                    Box::pin(self.execute_distributed(sql, &meet.otherwise, extended)).await?;
                }
            }
            Plan::MultiShard(multi) => {
                let mode = execution_mode(extended, false);
                let result = executor::multi_shard::run(multi, &self.coordinator, &mut self.parts, &catalog, &mode, &mut self.client).await;
                if result.is_err() {
                    self.parts.discard_broken();
                }
                result?;
            }
            Plan::LocalWithClusterData(needs) => {
                let mode = execution_mode(extended, false);
                let report = (needs.pools || needs.sessions).then(|| self.coordinator.process_report(&catalog));
                executor::cluster_views::run(needs, report.as_ref(), sql, &catalog, &mut self.parts, &mode, &mut self.client).await?;
            }
            Plan::LocalOverShards(lent) => {
                executor::materialized_views::run(lent, sql, &self.coordinator, &catalog, &mut self.parts, &mut self.client).await?
            }
            Plan::Fallback(fallback) => {
                let mode = execution_mode(extended, false);
                executor::fallback::run(fallback, &self.coordinator, &catalog, &mut self.parts, &mode, &mut self.client).await?;
            }
            Plan::Copy(copy) => {
                let result = executor::copy::run(copy, &mut self.parts, &catalog, &mut self.client).await;
                if result.is_err() {
                    self.parts.discard_broken();
                }
                result?;
            }
            Plan::Explain(explain) => {
                let mode = execution_mode(extended, false);
                executor::explain::run(explain, &self.coordinator, &catalog, &mut self.parts, &mode, &mut self.client).await?;
            }
            Plan::InsertSelect(insert) => {
                let mode = execution_mode(extended, false);
                executor::insert_select::run(insert, &self.coordinator, &catalog, &mut self.parts, &mode, &mut self.client).await?;
            }
            Plan::MergeThroughCoordinator(merge) => {
                executor::merge::run(merge, &self.coordinator, &catalog, &mut self.parts, &mut self.client).await?
            }
            Plan::WithLocalRows(local) => {
                let replanned = executor::local_rows::replanned(local, &catalog, &mut self.parts).await?;
                Box::pin(self.execute_distributed(sql, &replanned, extended)).await?;
            }
            Plan::SqlPrepare(prepare) => {
                // Prepared on the coordinator database too: checked against the
                // shells, typed, and listed in pg_prepared_statements.
                let tag = self.parts.local().await?.execute(sql).await?;
                self.sql_prepared.insert(prepare.name.clone(), (sql.to_string(), prepare.statement.clone()));
                backend::command_complete(self.client.out(), &tag);
            }
            Plan::SqlExecute(execute) => self.execute_prepared(sql, execute, extended).await?,
            Plan::SqlDeallocate(name) => {
                let tag = self.parts.local().await?.execute(sql).await?;
                match name {
                    Some(name) => {
                        self.sql_prepared.remove(name);
                    }
                    None => self.sql_prepared.clear(),
                }
                backend::command_complete(self.client.out(), &tag);
            }
            Plan::ClusterFunction(_) if !self.distributed => {
                let home = &self.coordinator.config.coordinator_db.database;
                let refusal = PgError::not_supported(format!(
                    "Tessera distributes the tables of database \"{home}\" only; this session's database is a plain PostgreSQL database without workers"
                ))
                .with_hint(format!("Connect to database \"{home}\" to distribute tables (for test runners, see \"Other databases\" in docs/operations.md)."));
                return Err(refusal.into());
            }
            Plan::ClusterFunction(call) => {
                let mut ctx =
                    CommandContext { coordinator: &self.coordinator, parts: &mut self.parts, caller: Caller::Client(&mut self.client), catalog };
                let bound = extended.map(|(bind, shape)| (bind, shape.param_types.as_slice()));
                commands::run_cluster_function(call, &mut ctx, bound).await?;
                if call.function.changes_tables() && self.parts.in_block() {
                    self.load_block_catalog().await?;
                }
            }
            Plan::Ddl(ddl) => {
                let mut ctx =
                    CommandContext { coordinator: &self.coordinator, parts: &mut self.parts, caller: Caller::Client(&mut self.client), catalog };
                commands::run_ddl(ddl, sql, &mut ctx).await?;
                if ddl.changes_catalog() && self.parts.in_block() {
                    self.load_block_catalog().await?;
                }
            }
        }
        Ok(())
    }

    /// SQL EXECUTE. A statement prepared over distributed tables runs like an
    /// extended-protocol execution, with the arguments evaluated (and typed) by
    /// the coordinator database; any other is the coordinator database's own.
    async fn execute_prepared(&mut self, sql: &str, execute: &SqlExecute, extended: Option<(&Bind, &Shape)>) -> Result<(), Failure> {
        let Some((prepared_by, statement)) = self.sql_prepared.get(&execute.name).cloned() else {
            let mode = execution_mode(extended, false);
            return Ok(executor::run_on_coordinator_db(&mut self.parts, sql, &mode, &mut self.client).await?);
        };
        if extended.is_some() {
            return Err(PgError::not_supported(
                "EXECUTE of a statement prepared over distributed tables works through the simple query protocol only",
            )
            .with_hint("Use the extended protocol's own prepared statements (Parse/Bind/Execute).")
            .into());
        }
        let local = self.parts.local().await?;
        // One row per parameter (one with NULLs when there are none); no row
        // when the statement is gone or was replaced (DISCARD ALL, then a new
        // PREPARE over local tables): then it is the coordinator database's.
        let rows = local
            .query(&format!(
                "SELECT t::oid, format_type(t, NULL) FROM pg_catalog.pg_prepared_statements p
                 LEFT JOIN LATERAL unnest(p.parameter_types) WITH ORDINALITY u(t, i) ON true WHERE p.name = {} AND p.statement = {} ORDER BY i",
                quote_literal(&execute.name),
                quote_literal(&prepared_by)
            ))
            .await?;
        if rows.is_empty() {
            self.sql_prepared.remove(&execute.name);
            return Ok(executor::run_on_coordinator_db(&mut self.parts, sql, &Mode::Simple, &mut self.client).await?);
        }
        let types: Vec<_> = rows.into_iter().filter(|r| r[0].is_some()).collect();
        if types.len() != execute.arguments.len() {
            return Err(PgError::new(sqlstate::SYNTAX_ERROR, format!("wrong number of parameters for prepared statement \"{}\"", execute.name))
                .with_detail(format!("Expected {} parameters but got {}.", types.len(), execute.arguments.len()))
                .into());
        }
        let param_types: Vec<u32> = types.iter().map(|t| t[0].as_deref().and_then(|oid| oid.parse().ok()).unwrap_or(0)).collect();
        let params = if types.is_empty() {
            Vec::new()
        } else {
            let casts: Vec<String> =
                execute.arguments.iter().zip(&types).map(|(arg, t)| format!("(({arg})::{})::text", t[1].as_deref().unwrap_or("text"))).collect();
            let values = local.query(&format!("SELECT {}", casts.join(", "))).await?;
            values.into_iter().next().unwrap_or_default().into_iter().map(|v| v.map(bytes::Bytes::from)).collect()
        };
        let planned = self.plan(&statement);
        let Some(inner) = planned.statements.first() else { return Err(PgError::internal("a prepared statement without a statement").into()) };
        if matches!(inner.plan, Plan::Local | Plan::Empty) {
            // No longer over distributed tables (one was undistributed).
            return Ok(executor::run_on_coordinator_db(&mut self.parts, sql, &Mode::Simple, &mut self.client).await?);
        }
        let shape = self.describe_shape(&statement, &param_types).await?;
        if let Some(fields) = &shape.fields {
            backend::row_description(self.client.out(), fields);
        }
        let bind = Bind { portal: String::new(), statement: String::new(), param_formats: Vec::new(), params, result_formats: Vec::new() };
        Box::pin(self.execute_distributed(&statement, &inner.plan, Some((&bind, &shape)))).await
    }

    /// After this block distributed or undistributed a table, the session runs
    /// under the catalog its block sees (no other session sees it before the
    /// commit). Marked with versions no committed catalog has, so that plans
    /// made under it are never taken for plans under a committed one.
    async fn load_block_catalog(&mut self) -> PgResult<()> {
        self.block_catalog_loads += 1;
        let version = -self.block_catalog_loads;
        let committed = self.coordinator.catalog.snapshot();
        self.block_catalog = Some(Arc::new(metadata::load_in_block(self.parts.local().await?, version, &committed).await?));
        Ok(())
    }

    /// After a statement that may have changed which views and functions
    /// reach distributed tables: the session's next statements are planned
    /// knowing the change (other sessions learn it from the change notice).
    /// Inside a block, a catalog that cannot be loaded fails the block: its
    /// next statements could not be planned knowing the change. Outside
    /// one the change has committed, and the client hears of a failed
    /// reload as a WARNING.
    async fn see_user_code_change(&mut self) -> Result<(), Failure> {
        if self.parts.is_failed() {
            return Ok(());
        }
        if self.parts.in_block() {
            return self.load_block_catalog().await.map_err(|e| {
                Failure::Error(e.with_context("while loading the catalog as this transaction block sees it, after a change of views or functions"))
            });
        }
        self.reload_after_commit().await;
        Ok(())
    }

    /// Reloads the catalog after a change committed, telling the client
    /// when that failed (`Coordinator::reload_after_commit`).
    async fn reload_after_commit(&mut self) {
        if let Some(warning) = self.coordinator.reload_after_commit().await {
            backend::notice_response(self.client.out(), &warning);
        }
    }

    /// A block that changed the catalog has ended: the committed catalog
    /// (reloaded now, not when the change notice arrives) applies again.
    async fn end_block_catalog(&mut self) {
        if self.block_catalog.take().is_some() {
            self.reload_after_commit().await;
        }
    }

    /// Refuses to plan `sql` while the catalog may miss a committed change
    /// (`Coordinator::check_catalog`), unless none of its statements reads
    /// or writes relations (transaction control, SET, SHOW …).
    async fn check_catalog(&mut self, sql: &str) -> Result<(), Failure> {
        if !self.coordinator.catalog_unreliable() || self.plan(sql).statements.iter().all(|s| !s.uses_relations) {
            return Ok(());
        }
        Ok(self.coordinator.check_catalog().await?)
    }

    async fn transaction_command(&mut self, command: &TransactionCommand) -> PgResult<&'static str> {
        Ok(match command {
            TransactionCommand::Begin { sql } => {
                if let Some(warning) = self.parts.begin(sql) {
                    backend::notice_response(self.client.out(), &warning);
                }
                "BEGIN"
            }
            TransactionCommand::Commit => {
                if !self.parts.in_block() {
                    backend::notice_response(self.client.out(), &PgError::warning("25P01", "there is no transaction in progress"));
                }
                let tag = self.parts.commit().await;
                self.end_block_catalog().await;
                tag?
            }
            TransactionCommand::Rollback => {
                if !self.parts.in_block() {
                    backend::notice_response(self.client.out(), &PgError::warning("25P01", "there is no transaction in progress"));
                }
                let result = self.parts.rollback().await;
                self.end_block_catalog().await;
                result?;
                "ROLLBACK"
            }
            TransactionCommand::Savepoint(name) => {
                self.parts.savepoint(name).await?;
                "SAVEPOINT"
            }
            TransactionCommand::Release(name) => {
                self.parts.release(name).await?;
                "RELEASE"
            }
            TransactionCommand::RollbackTo(name) => {
                self.parts.rollback_to(name).await?;
                if self.block_catalog.is_some() {
                    self.load_block_catalog().await?;
                }
                "ROLLBACK"
            }
        })
    }

    /// Forwards the coordinator database's responses to the client up to its
    /// ReadyForQuery, feeding it the client's COPY data when it asks for some.
    /// With `withhold_distributed`, an error saying the statement's table was
    /// distributed while it waited (the shell's guard, schema.sql
    /// `tessera.refuse_shell_write`) is kept back when nothing but notices
    /// came before it: true then, for the caller to send the statement again.
    async fn relay_local_until_ready(&mut self, withhold_distributed: bool) -> Result<bool, Failure> {
        let mut failed = false;
        let mut answered = false;
        let mut withheld = false;
        loop {
            let msg = self.parts.held_local()?.recv().await?;
            match msg.tag() {
                b'Z' => break,
                b'E' => {
                    if withhold_distributed
                        && !answered
                        && !failed
                        && backend::decode_error_fields(&msg).is_ok_and(|e| e.code() == "40001" && e.message().ends_with(DISTRIBUTED_MEANWHILE))
                    {
                        withheld = true;
                        continue;
                    }
                    failed = true;
                    self.client.out().extend_from_slice(msg.frame());
                }
                b'G' => {
                    answered = true;
                    self.client.out().extend_from_slice(msg.frame());
                    self.client.flush().await.map_err(client_lost)?;
                    self.pump_copy_in().await?;
                }
                tag => {
                    answered |= !matches!(tag, b'N' | b'S');
                    self.client.out().extend_from_slice(msg.frame());
                    self.client.flush_if_large().await?;
                }
            }
        }
        match (withheld, failed) {
            (true, _) => Ok(true),
            (false, true) => Err(Failure::Reported),
            (false, false) => Ok(false),
        }
    }

    /// Passes the client's CopyData through to the coordinator database until
    /// CopyDone or CopyFail.
    async fn pump_copy_in(&mut self) -> PgResult<()> {
        loop {
            let Some(msg) = self.client.recv().await.map_err(client_lost)? else {
                let local = self.parts.held_local()?;
                frontend::copy_fail(local.out(), "client connection lost");
                local.flush().await?;
                return Err(client_lost("end of stream"));
            };
            let local = self.parts.held_local()?;
            match msg.tag() {
                b'd' => {
                    local.out().extend_from_slice(msg.frame());
                    if local.out().len() >= 256 * 1024 {
                        local.flush().await?;
                    }
                }
                b'c' | b'f' => {
                    local.out().extend_from_slice(msg.frame());
                    local.flush().await?;
                    return Ok(());
                }
                _ => {} // Flush and Sync are ignored during COPY, as PostgreSQL does
            }
        }
    }

    // ---- extended query protocol ----

    /// Forwards one extended-protocol message to the coordinator database; its
    /// response is relayed later, in order.
    async fn forward_local(&mut self, msg: &Message) -> anyhow::Result<()> {
        match self.parts.local().await {
            Ok(local) => {
                local.out().extend_from_slice(msg.frame());
                self.local_expected += 1;
                self.local_unsynced = true;
            }
            Err(e) => self.extended_error(Failure::Error(e)),
        }
        Ok(())
    }

    /// Relays what the coordinator database owes for forwarded messages, so that
    /// a response we produce ourselves goes out in the right order.
    async fn drain_local(&mut self) -> anyhow::Result<()> {
        if self.local_expected == 0 {
            return Ok(());
        }
        let flushed = self.parts.held_local().map(|local| frontend::flush(local.out()));
        if let Err(e) = flushed {
            self.local_expected = 0;
            self.extended_error(Failure::Error(e));
            return Ok(());
        }
        while self.local_expected > 0 {
            let msg = match self.parts.held_local()?.recv().await {
                Ok(m) => m,
                Err(e) => {
                    self.local_expected = 0;
                    self.extended_error(Failure::Error(e));
                    return Ok(());
                }
            };
            if msg.tag() == b'G' {
                self.client.out().extend_from_slice(msg.frame());
                self.client.flush().await?;
                self.pump_copy_in().await?;
                continue;
            }
            match msg.tag() {
                b'1' | b'2' | b'3' | b'T' | b'n' | b'C' | b'I' | b's' => self.local_expected -= 1,
                b'E' => {
                    self.local_expected = 0;
                    self.skip_until_sync = true;
                }
                _ => {}
            }
            self.client.out().extend_from_slice(msg.frame());
            self.client.flush_if_large().await?;
        }
        Ok(())
    }

    fn extended_error(&mut self, failure: Failure) {
        self.report(failure);
        self.skip_until_sync = true;
    }

    async fn on_parse(&mut self, msg: &Message) -> anyhow::Result<()> {
        let parse = frontend::decode_parse(msg)?;
        self.query_text.clear();
        self.query_text.push_str(&parse.sql);
        if let Err(f) = self.follow_search_path().await {
            self.extended_error(f);
            return Ok(());
        }
        if let Err(f) = self.check_catalog(&parse.sql).await {
            self.extended_error(f);
            return Ok(());
        }
        let planned = self.plan(&parse.sql);
        let distributed = planned.statements.len() == 1 && !matches!(planned.statements[0].plan, Plan::Local | Plan::Empty);
        if !distributed {
            self.user_code_unsynced |= planned.statements.iter().any(|s| s.changes_user_code);
            if !parse.name.is_empty() {
                self.parts.pin_local("a prepared statement");
            }
            self.statements.insert(parse.name.clone(), Statement::Local);
            return self.forward_local(msg).await;
        }
        self.drain_local().await?;
        match self.describe_shape(&parse.sql, &parse.param_types).await {
            Ok(shape) => {
                self.statements.insert(parse.name, Statement::Distributed(Arc::new(DistributedStatement { plan: planned, shape })));
                backend::parse_complete(self.client.out());
            }
            Err(e) => self.extended_error(Failure::Error(e)),
        }
        Ok(())
    }

    /// Parameter types and result columns of a distributed statement: the shell
    /// tables let the coordinator database describe it exactly as PostgreSQL would.
    async fn describe_shape(&mut self, sql: &str, param_types: &[u32]) -> PgResult<Arc<Shape>> {
        self.catalog_to_run_under();
        let key = (sql.to_string(), param_types.to_vec());
        if let Some(shape) = self.shells.shapes.get(&key) {
            return Ok(shape.clone());
        }
        const NAME: &str = "tessera_describe";
        let local = self.parts.local_for_describe().await?;
        frontend::close(local.out(), Target::Statement, NAME);
        frontend::parse(local.out(), NAME, sql, param_types);
        frontend::describe(local.out(), Target::Statement, NAME);
        frontend::close(local.out(), Target::Statement, NAME);
        frontend::sync(local.out());
        let mut shape = Shape { param_types: param_types.to_vec(), fields: None };
        let mut error = None;
        loop {
            let msg = local.recv().await?;
            match msg.tag() {
                b't' => shape.param_types = backend::decode_parameter_description(&msg)?,
                b'T' => shape.fields = Some(backend::decode_row_description(&msg)?),
                b'E' => error = Some(backend::decode_error_fields(&msg)?),
                b'Z' => break,
                _ => {}
            }
        }
        self.parts.observe_local_status();
        if let Some(e) = error {
            return Err(e);
        }
        let shape = Arc::new(shape);
        self.shells.shapes.insert(key, shape.clone());
        Ok(shape)
    }

    /// Has the coordinator database check a statement whose rows move
    /// through the coordinator before it finishes, so that one PostgreSQL
    /// rejects fails at once, with PostgreSQL's error, before any rows move.
    /// EXPLAIN against the shells checks names, types and privileges and
    /// reads nothing (parameters are bound as NULLs); for what EXPLAIN does
    /// not take, Parse checks names and types. Statements found right are
    /// remembered until the catalog changes: the nodes check privileges
    /// again as they run the statement, so a stale entry costs only time.
    async fn check_on_shells(&mut self, sql: &str, param_types: &[u32], check: ShellCheck) -> PgResult<()> {
        let key = (sql.to_string(), param_types.to_vec());
        if self.shells.checked.contains(&key) {
            return Ok(());
        }
        match check {
            ShellCheck::Parse => {
                self.describe_shape(sql, param_types).await?;
            }
            ShellCheck::Explain => {
                let local = self.parts.local_for_describe().await?;
                frontend::parse(local.out(), "", &format!("EXPLAIN (COSTS OFF) {sql}"), param_types);
                frontend::bind(local.out(), "", "", &[], &vec![None; param_types.len()], &[]);
                frontend::execute(local.out(), "", 0);
                frontend::sync(local.out());
                let mut error = None;
                loop {
                    let msg = local.recv().await?;
                    match msg.tag() {
                        b'E' => error = error.or(Some(backend::decode_error_fields(&msg)?)),
                        b'Z' => break,
                        _ => {}
                    }
                }
                self.parts.observe_local_status();
                if let Some(e) = error {
                    return Err(e);
                }
            }
        }
        self.shells.checked.insert(key);
        Ok(())
    }

    async fn on_bind(&mut self, msg: &Message) -> anyhow::Result<()> {
        let bind = frontend::decode_bind(msg)?;
        self.end_stream_of(&bind.portal).await;
        match self.statements.get(&bind.statement) {
            Some(Statement::Distributed(statement)) => {
                let statement = statement.clone();
                self.drain_local().await?;
                self.portals.insert(bind.portal.clone(), Portal::Distributed { statement, bind, pending: None });
                backend::bind_complete(self.client.out());
                Ok(())
            }
            _ => {
                self.portals.insert(bind.portal, Portal::Local);
                self.forward_local(msg).await
            }
        }
    }

    async fn on_describe(&mut self, msg: &Message) -> anyhow::Result<()> {
        let (target, name) = frontend::decode_describe_or_close(msg)?;
        let described = match target {
            Target::Statement => match self.statements.get(&name) {
                Some(Statement::Distributed(s)) => Some((s.shape.clone(), None)),
                _ => None,
            },
            Target::Portal => match self.portals.get(&name) {
                Some(Portal::Distributed { statement, bind, .. }) => Some((statement.shape.clone(), Some(bind.result_formats.clone()))),
                _ => None,
            },
        };
        let Some((shape, formats)) = described else {
            return self.forward_local(msg).await;
        };
        self.drain_local().await?;
        let out = self.client.out();
        if formats.is_none() {
            backend::parameter_description(out, &shape.param_types);
        }
        match &shape.fields {
            None => backend::no_data(out),
            Some(fields) => {
                let formats = formats.unwrap_or_default();
                let fields: Vec<FieldDescription> = fields
                    .iter()
                    .enumerate()
                    .map(|(i, f)| FieldDescription {
                        format: match formats.len() {
                            0 => 0,
                            1 => formats[0],
                            _ => formats.get(i).copied().unwrap_or(0),
                        },
                        ..f.clone()
                    })
                    .collect();
                backend::row_description(out, &fields);
            }
        }
        Ok(())
    }

    async fn on_execute(&mut self, msg: &Message) -> anyhow::Result<()> {
        let (portal, max_rows) = frontend::decode_execute(msg)?;
        if !matches!(self.portals.get(&portal), Some(Portal::Distributed { .. })) {
            return self.forward_local(msg).await;
        }
        if let Some((name, mut stream)) = self.stream.take() {
            if name == portal {
                self.drain_local().await?;
                let progress = stream.read(&mut self.parts, max_rows, &mut self.client).await;
                self.after_stream_read(portal, stream, progress);
                return Ok(());
            }
            self.stream = Some((name, stream));
            self.settle_stream().await;
        }
        // Taken out for the execution and put back after (a named portal can be
        // executed again), which spares copying its parameters.
        let Some(Portal::Distributed { statement, bind, pending }) = self.portals.remove(&portal) else { unreachable!() };
        if let Some(pending) = pending {
            let pending = Some(self.send_rows(pending, max_rows));
            self.portals.insert(portal, Portal::Distributed { statement, bind, pending });
            return Ok(());
        }
        self.drain_local().await?;
        self.query_text.clear();
        self.query_text.push_str(&statement.plan.statements[0].sql);
        let limited = max_rows > 0;
        let plan = match self.current_plan(&statement).await {
            Ok(plan) => plan,
            Err(f) => {
                self.extended_error(f);
                self.portals.insert(portal, Portal::Distributed { statement, bind, pending: None });
                return Ok(());
            }
        };
        let stmt = &plan.statements[0];
        if limited && row_stream::streams(&stmt.plan) && self.check_not_failed(&stmt.plan).is_ok() {
            // Rows are read from the workers as the client asks for them.
            let started = {
                let catalog = self.catalog_to_run_under();
                let mode = Mode::Extended { bind: &bind, param_types: &statement.shape.param_types, sync: false };
                RowStream::start(&stmt.plan, &mut self.parts, &catalog, &mode).await
            };
            self.portals.insert(portal.clone(), Portal::Distributed { statement, bind, pending: None });
            match started {
                Ok(mut stream) => {
                    let progress = stream.read(&mut self.parts, max_rows, &mut self.client).await;
                    self.after_stream_read(portal, stream, progress);
                }
                Err(e) => {
                    self.parts.discard_broken();
                    self.extended_error(e.into());
                }
            }
            return Ok(());
        }
        // Otherwise, with a row limit, the whole result is held here and handed
        // out max_rows at a time, as a suspended portal of PostgreSQL's would.
        let start = self.client.out().len();
        self.client.hold_output(limited.then(|| Box::new(self.parts.limits().clone()) as Box<dyn MemoryCharge>));
        let mut result = match self.check_not_failed(&stmt.plan) {
            Ok(()) => self.execute_distributed(&stmt.sql, &stmt.plan, Some((&bind, &statement.shape))).await,
            Err(f) => Err(f),
        };
        if let Err(f) = &result {
            if self.client.out().len() == start && self.shard_gone(f, plan.version).await {
                result = match self.current_plan(&statement).await {
                    Ok(again) => self.execute_distributed(&again.statements[0].sql, &again.statements[0].plan, Some((&bind, &statement.shape))).await,
                    Err(f) => Err(f),
                };
            }
        }
        self.client.hold_output(None);
        let mut pending = None;
        match result {
            Err(f) => self.extended_error(f),
            Ok(()) if limited => pending = self.hold_back_rows(start).map(|rows| self.send_rows(rows, max_rows)),
            Ok(()) => {}
        }
        self.portals.insert(portal, Portal::Distributed { statement, bind, pending });
        Ok(())
    }

    /// Keeps a suspended stream for the portal's next Execute; a finished one
    /// leaves the portal exhausted (executing it again gives no rows).
    fn after_stream_read(&mut self, portal: String, stream: RowStream, progress: PgResult<Progress>) {
        match progress {
            Ok(Progress::Suspended) => self.stream = Some((portal, stream)),
            Ok(Progress::Done) => {
                if let Some(Portal::Distributed { pending, .. }) = self.portals.get_mut(&portal) {
                    let mut complete = bytes::BytesMut::new();
                    backend::command_complete(&mut complete, "SELECT 0");
                    *pending = Some(PendingRows { rows: Default::default(), complete: complete.freeze() });
                }
            }
            Err(e) => self.extended_error(e.into()),
        }
    }

    /// Frees the worker connections of the streaming portal for other work:
    /// its remaining rows are read into memory and handed out from there.
    async fn settle_stream(&mut self) {
        let Some((name, stream)) = self.stream.take() else { return };
        let (rows, complete) = stream.hold_rest(&mut self.parts).await;
        if let Some(Portal::Distributed { pending, .. }) = self.portals.get_mut(&name) {
            *pending = Some(PendingRows { rows, complete });
        }
    }

    /// The portal `name` is going away (closed, bound anew, or its implicit
    /// transaction ended): the rest of its stream is read and dropped.
    async fn end_stream_of(&mut self, name: &str) {
        if self.stream.as_ref().is_some_and(|(streaming, _)| streaming == name) {
            if let Some((_, stream)) = self.stream.take() {
                stream.hold_rest(&mut self.parts).await;
            }
        }
    }

    /// Takes the DataRows and the CommandComplete written since `start` back
    /// out of the client's buffer; None (and the output left alone) when the
    /// statement did not answer with rows.
    fn hold_back_rows(&mut self, start: usize) -> Option<PendingRows> {
        let mut produced = self.client.out().split_off(start);
        let mut messages = Vec::new();
        while let Ok(Some(msg)) = crate::protocol::take_message(&mut produced) {
            messages.push(msg);
        }
        let Some(complete) = messages.iter().position(|m| m.tag() == b'C') else {
            for msg in &messages {
                self.client.out().extend_from_slice(msg.frame());
            }
            return None;
        };
        let complete = messages.remove(complete).frame_bytes();
        let mut rows = std::collections::VecDeque::new();
        for msg in messages {
            match msg.tag() {
                b'D' => rows.push_back(msg.frame_bytes()),
                // Notices go out now.
                _ => self.client.out().extend_from_slice(msg.frame()),
            }
        }
        Some(PendingRows { rows, complete })
    }

    /// Sends up to `max_rows` (0: all) of `pending`'s rows. Having sent a full
    /// batch the portal is suspended, as in PostgreSQL (which cannot know
    /// whether more rows follow); otherwise it completes, and stays behind
    /// exhausted: executing it again gives no more rows.
    fn send_rows(&mut self, mut pending: PendingRows, max_rows: i32) -> PendingRows {
        let batch = if max_rows > 0 { (max_rows as usize).min(pending.rows.len()) } else { pending.rows.len() };
        for row in pending.rows.drain(..batch) {
            self.client.out().extend_from_slice(&row);
        }
        if max_rows > 0 && batch == max_rows as usize {
            backend::portal_suspended(self.client.out());
        } else {
            let complete = crate::protocol::Message::from_frame(pending.complete.clone());
            match complete.tag() {
                b'C' => {
                    let tag = String::from_utf8_lossy(complete.body().strip_suffix(&[0]).unwrap_or(complete.body()));
                    backend::command_complete(self.client.out(), &backend::tag_with_count(&tag, batch as u64));
                }
                _ => self.client.out().extend_from_slice(&pending.complete),
            }
        }
        pending
    }

    /// The plan a prepared statement runs with now. After a catalog change it
    /// is planned again (shards, columns and placements may have moved), and,
    /// as PostgreSQL does for a prepared statement, it fails if its result
    /// columns changed under it.
    async fn current_plan(&mut self, statement: &DistributedStatement) -> Result<Arc<CachedPlan>, Failure> {
        if let Some(planned) = statement.plan.statements.first() {
            self.hold_for_fences(&planned.plan).await;
        }
        self.follow_search_path().await?;
        if statement.plan.version == self.catalog().version && statement.plan.search_path == self.search_path.generation {
            return Ok(statement.plan.clone());
        }
        let sql = statement.plan.statements[0].sql.clone();
        let shape = self.describe_shape(&sql, &statement.shape.param_types).await?;
        let columns = |s: &Shape| s.fields.as_ref().map(|f| f.iter().map(|c| (c.type_oid, c.type_modifier)).collect::<Vec<_>>());
        if columns(&shape) != columns(&statement.shape) {
            return Err(PgError::new(sqlstate::FEATURE_NOT_SUPPORTED, "cached plan must not change result type").into());
        }
        Ok(self.plan(&sql))
    }

    async fn on_close(&mut self, msg: &Message) -> anyhow::Result<()> {
        let (target, name) = frontend::decode_describe_or_close(msg)?;
        if target == Target::Portal {
            self.end_stream_of(&name).await;
        }
        let was_distributed = match target {
            Target::Statement => matches!(self.statements.remove(&name), Some(Statement::Distributed(_))),
            Target::Portal => matches!(self.portals.remove(&name), Some(Portal::Distributed { .. })),
        };
        if !was_distributed {
            return self.forward_local(msg).await;
        }
        self.drain_local().await?;
        backend::close_complete(self.client.out());
        Ok(())
    }

    async fn sync(&mut self) -> anyhow::Result<()> {
        self.skip_until_sync = false;
        if self.local_unsynced {
            self.local_unsynced = false;
            self.local_expected = 0;
            frontend::sync(self.parts.held_local()?.out());
            // Everything still owed, then ReadyForQuery (not forwarded: ours follows).
            loop {
                match self.parts.held_local()?.recv().await {
                    Ok(msg) if msg.tag() == b'Z' => break,
                    Ok(msg) if msg.tag() == b'G' => {
                        // COPY FROM STDIN through the extended protocol: PostgreSQL
                        // ignored the Sync we passed on; the client sends another
                        // after its CopyDone/CopyFail.
                        self.client.out().extend_from_slice(msg.frame());
                        self.client.flush().await?;
                        self.pump_copy_in().await?;
                        if let Some(next) = self.client.recv().await? {
                            self.parts.held_local()?.out().extend_from_slice(next.frame());
                        }
                    }
                    Ok(msg) => self.client.out().extend_from_slice(msg.frame()),
                    Err(e) => {
                        self.report(Failure::Error(e));
                        break;
                    }
                }
            }
            self.parts.observe_local_status();
        }
        if std::mem::take(&mut self.user_code_unsynced) {
            if let Err(f) = self.see_user_code_change().await {
                self.report(f);
            }
        }
        let mut errors = Vec::new();
        for worker in self.parts.workers_needing_sync() {
            worker.needs_sync = false;
            frontend::sync(worker.conn.out());
            if let Err(e) = worker.conn.drain_until_ready().await {
                errors.push(e);
            }
        }
        if !errors.is_empty() {
            self.parts.discard_broken();
            for e in errors {
                self.report(Failure::Error(e));
            }
        }
        self.release_deadlocked_work().await;
        // Portals live until the end of the transaction; outside one, until Sync.
        if !self.parts.in_block() {
            self.end_stream_of("").await;
            self.portals.retain(|name, _| !name.is_empty());
        }
        self.parts.settle_links().await;
        backend::ready_for_query(self.client.out(), self.parts.status());
        self.client.flush().await?;
        if self.stream.is_none() {
            self.parts.release_connections(self.local_expected == 0 && !self.local_unsynced).await;
        }
        Ok(())
    }
}
