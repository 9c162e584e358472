//! The coordinator process: accepts client connections and runs one session per
//! connection; keeps the catalog snapshot fresh.

mod auth;
mod login_memory;
mod session;

use crate::config::Config;
use crate::connection::kept::KeptConnections;
use crate::connection::Login;
use crate::connection::{send_cancel, PgConnection};
use crate::error::{sqlstate, PgError, PgResult};
use crate::executor::cluster_views::{ClientSession, PoolUsage, ProcessReport};
use crate::metadata::{self, CatalogHandle};
use crate::transaction::coordinator_db::{CoordinatorDb, LocalSource, PinReason};
use crate::transaction::limits::{CancelOutcome, ProcessMemory, StatementLimits};
use crate::transaction::{CancelTargets, Participants, TwoPhase};
use crate::transport::{Stream, UnixSocket};
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::net::TcpListener;

/// State shared by every session of one coordinator process. None of it has to
/// survive a restart: the catalog is reloaded from the coordinator database.
pub struct Coordinator {
    pub config: Config,
    pub catalog: Arc<CatalogHandle>,
    /// The client sessions, by their (process id, secret key).
    sessions: Mutex<HashMap<(i32, i32), SessionEntry>>,
    /// The connection catalog reloads run on, kept from one to the next (a
    /// new backend plans the catalog's queries with cold caches, which took
    /// longer than running them); holding it makes one reload at a time.
    reloads: tokio::sync::Mutex<KeptConnections>,
    /// Why the catalog could not be reloaded although the coordinator
    /// database answered, while no reload has succeeded since: the snapshot
    /// may miss a change that committed (see `check_catalog`).
    unreliable_catalog: Mutex<Option<PgError>>,
    /// Distinguishes this process's prepared transactions from other coordinators'.
    pub process_id: u32,
    /// Sessions whose transaction the deadlock detector cancelled, with the
    /// cycle and when, so they can report a deadlock instead of a plain
    /// cancellation.
    deadlock_victims: Mutex<HashMap<String, (String, std::time::Instant)>>,
    /// The catalog version the fallback tier's objects were last brought up to
    /// by this process, and the roles given user mappings since.
    fallback_ready: tokio::sync::Mutex<(i64, HashSet<String>)>,
    /// TLS for the clients that ask for it, when configured.
    pub tls: Option<tokio_rustls::TlsAcceptor>,
    /// The worker connections the sessions share.
    pub worker_pools: Arc<crate::transaction::WorkerPools>,
    /// The coordinator database connections the sessions share.
    pub local_pool: Arc<crate::transaction::coordinator_db::LocalPool>,
    /// Clients connected now.
    pub clients: std::sync::atomic::AtomicUsize,
    /// The relay of the workers' postgres_fdw links to other nodes.
    pub links: Arc<crate::transaction::links::LinkRelay>,
    /// What logins learnt, for logging in while the coordinator database is down.
    logins: login_memory::LoginMemory,
    /// Writes held back while this process cuts shard groups over to other nodes.
    pub fences: crate::operations::fence::Fences,
    /// Woken when a session schedules a background job, so it starts now.
    pub jobs_scheduled: tokio::sync::Notify,
    /// The memory the sessions' running statements hold together.
    statement_memory: Arc<ProcessMemory>,
}

impl Coordinator {
    /// Connects to the coordinator database (waiting for it to come up), installs
    /// or upgrades the catalog, registers configured workers and loads the catalog.
    pub async fn start(config: Config) -> anyhow::Result<Arc<Coordinator>> {
        crate::connection::set_connect_timeout(Duration::from_secs_f64(config.connections.node_connect_timeout_secs.max(0.001)));
        let tls = match &config.tls {
            Some(tls) => Some(crate::transport::tls_acceptor(std::path::Path::new(&tls.cert_file), std::path::Path::new(&tls.key_file))?),
            None => None,
        };
        let mut conn = connect_with_retry(&config, Duration::from_secs(60)).await?;
        metadata::install(&mut conn).await.map_err(|e| anyhow::anyhow!("could not install the catalog: {e}"))?;
        for w in &config.workers {
            conn.execute(&format!(
                "INSERT INTO tessera.pg_dist_node (nodename, nodeport) VALUES ({}, {}) ON CONFLICT (nodename, nodeport) DO NOTHING",
                crate::connection::quote_literal(&w.host),
                w.port
            ))
            .await
            .map_err(|e| anyhow::anyhow!("could not register worker {}:{}: {e}", w.host, w.port))?;
        }
        let catalog = metadata::load(&mut conn).await.map_err(|e| anyhow::anyhow!("could not load the catalog: {e}"))?;
        conn.terminate().await;
        let pool_wait = Duration::from_secs_f64(config.connections.pool_wait_secs.max(0.0));
        let worker_pools = crate::transaction::WorkerPools::new(config.connections.max_per_node, config.connections.active_per_node(), pool_wait);
        let local_pool = crate::connection::pool::NodePool::new(config.connections.max_coordinator_db);
        let catalog = Arc::new(CatalogHandle::new(catalog));
        let transactions = &config.transactions;
        let fault = transactions.fault();
        let links = crate::transaction::links::LinkRelay::start(
            &config.worker_links_listen(),
            catalog.clone(),
            config.service_login(),
            config.coordinator_db.password.clone(),
            fault,
        )
        .await?;
        let reloads = tokio::sync::Mutex::new(KeptConnections::new(config.service_login(), "tessera catalog reload", Duration::from_secs(60)));
        let statement_memory = ProcessMemory::new(config.statements.total_memory_limit());
        Ok(Arc::new(Coordinator {
            config,
            catalog,
            sessions: Mutex::new(HashMap::new()),
            reloads,
            unreliable_catalog: Mutex::new(None),
            process_id: rand::random(),
            deadlock_victims: Mutex::new(HashMap::new()),
            fallback_ready: tokio::sync::Mutex::new((0, HashSet::new())),
            tls,
            worker_pools: Arc::new(worker_pools),
            local_pool: Arc::new(local_pool),
            clients: std::sync::atomic::AtomicUsize::new(0),
            links,
            logins: Default::default(),
            fences: Default::default(),
            jobs_scheduled: Default::default(),
            statement_memory,
        }))
    }

    /// Loads the catalog afresh and swaps it in (never replacing a newer one).
    /// A failure while the coordinator database answers leaves the catalog
    /// unreliable until a reload succeeds (`check_catalog`); one because it
    /// cannot be reached does not: nothing can read a shell then, and
    /// statements that need no coordinator database go on under the last
    /// snapshot.
    pub async fn reload_catalog(&self) -> PgResult<()> {
        let result = self.load_catalog().await;
        match &result {
            Ok(()) => *self.unreliable_catalog.lock().unwrap() = None,
            Err(e) if !e.is_node_unreachable() => *self.unreliable_catalog.lock().unwrap() = Some(self.catalog_refusal(e)),
            Err(_) => {}
        }
        result
    }

    /// Whether statements may be planned under the catalog snapshot: after
    /// a failed reload it may miss a change that committed (a table just
    /// distributed, a view over one), and a statement planned under it
    /// could read a distributed table's empty shell for its rows. Then the
    /// reload is tried again, and while it fails, statements are refused
    /// with the reason.
    pub async fn check_catalog(&self) -> PgResult<()> {
        if self.unreliable_catalog.lock().unwrap().is_none() {
            return Ok(());
        }
        match self.reload_catalog().await {
            Err(e) if !e.is_node_unreachable() => Err(self.catalog_refusal(&e)),
            _ => Ok(()),
        }
    }

    /// Whether a reload failed and none succeeded since (`check_catalog`).
    pub fn catalog_unreliable(&self) -> bool {
        self.unreliable_catalog.lock().unwrap().is_some()
    }

    /// Reloads the catalog after a change that committed: its outcome
    /// stands whatever the reload does, so a failure is the WARNING this
    /// returns for the client, and statements are refused until a reload
    /// succeeds (`check_catalog`).
    pub async fn reload_after_commit(&self) -> Option<PgError> {
        let e = self.reload_catalog().await.err()?;
        tracing::warn!("could not reload the catalog after a change committed: {}", e.message());
        let refusal = self.catalog_refusal(&e);
        Some(
            PgError::warning("01000", format!("the change committed, but {}", refusal.message())).with_hint(
                "Statements that could read a distributed table are refused until the catalog can be reloaded; each statement tries again.",
            ),
        )
    }

    /// The error refusing statements while the catalog cannot be reloaded
    /// because of `cause`.
    pub fn catalog_refusal(&self, cause: &PgError) -> PgError {
        PgError::new(
            sqlstate::OBJECT_NOT_IN_PREREQUISITE_STATE,
            format!("the catalog could not be reloaded from the coordinator database at {}: {}; retry", self.config.coordinator_db_addr(), cause.message()),
        )
        .with_detail("The coordinator's catalog may miss a change that committed; a statement planned under it could read a distributed table's empty shell in the coordinator database.")
        .with_hint("Statements are refused until a reload succeeds; each one tries again. Look at the coordinator database's log for why the reload failed.")
    }

    /// `reload_catalog`'s work.
    async fn load_catalog(&self) -> PgResult<()> {
        let mut kept = self.reloads.lock().await;
        let addr = self.config.coordinator_db_addr();
        let mut conn = kept.take(&addr).await?;
        let fresh = self.load_fresh(&mut conn).await;
        kept.give_back(&addr, conn).await;
        let Some(fresh) = fresh? else { return Ok(()) };
        if fresh.version >= self.catalog.snapshot().version {
            self.catalog.replace(fresh);
        }
        Ok(())
    }

    /// The catalog as committed now, or None when the snapshot is of that
    /// version already.
    async fn load_fresh(&self, conn: &mut PgConnection) -> PgResult<Option<metadata::Catalog>> {
        let current = self.catalog.snapshot();
        if !current.type_oids_incomplete && metadata::committed_version(conn).await? == current.version {
            return Ok(None);
        }
        let mut fresh = metadata::load(conn).await?;
        metadata::load_type_oids(&mut fresh, conn, &self.config.service_login(), &current).await?;
        Ok(Some(fresh))
    }

    /// Makes the fallback tier's foreign tables match catalog `version` and lets
    /// `role` use them. Runs on a service connection of its own, so the rebuild
    /// never becomes part of (or waits for) a client's transaction.
    pub async fn prepare_fallback(&self, version: i64, role: &str) -> PgResult<()> {
        let mut ready = self.fallback_ready.lock().await;
        if ready.0 >= version && ready.1.contains(role) {
            return Ok(());
        }
        let password = match &self.config.coordinator_db.password {
            Some(p) => crate::connection::quote_literal(p),
            None => "NULL".into(),
        };
        let sql = format!("SELECT tessera.prepare_fallback({}, {password})", crate::connection::quote_literal(role));
        PgConnection::query_once(&self.config.coordinator_db_addr(), &self.config.service_login(), &sql).await?;
        if ready.0 < version {
            *ready = (version, HashSet::new());
        }
        ready.1.insert(role.to_string());
        Ok(())
    }

    /// The participants of a session of this process, registered under
    /// `key` (for cancellation and the process report); its workers learn
    /// the session's two-phase name as their application_name.
    fn participants(&self, key: (i32, i32), local_login: Login, mut worker_login: Login) -> Participants {
        let local_source = LocalSource { pool: self.local_pool.clone(), addr: self.config.coordinator_db_addr(), wait: self.worker_pools.wait };
        let transactions = &self.config.transactions;
        let two_phase = TwoPhase::new(
            self.process_id,
            key.0,
            Duration::from_secs_f64(transactions.recovery_interval_secs),
            transactions.fault(),
            self.links.clone(),
        );
        worker_login.options.push(("application_name".into(), two_phase.session_name().to_string()));
        let (cancel_targets, limits, pinned) = self.register_session(key, two_phase.session_name(), &worker_login.user);
        Participants::new(
            CoordinatorDb::new(local_source, local_login, pinned),
            worker_login,
            cancel_targets,
            limits,
            two_phase,
            self.worker_pools.clone(),
        )
    }

    /// A session of the service role for work no client asked for (a
    /// background job); `end_service_session(key)` forgets it.
    pub fn service_session(&self) -> ((i32, i32), Participants) {
        let key = new_session_key();
        let login = self.config.service_login();
        let worker_login = Login { options: Vec::new(), ..login.clone() };
        (key, self.participants(key, login, worker_login))
    }

    pub fn end_service_session(&self, key: (i32, i32)) {
        self.unregister_session(key);
    }

    fn register_session(&self, key: (i32, i32), name: &str, user: &str) -> (CancelTargets, StatementLimits, PinReason) {
        let cancel_targets = CancelTargets::default();
        let limits = StatementLimits::new(cancel_targets.clone(), self.statement_memory.clone());
        let entry = SessionEntry { name: name.to_string(), user: user.to_string(), cancel_targets, limits, pinned: PinReason::default() };
        let shared = (entry.cancel_targets.clone(), entry.limits.clone(), entry.pinned.clone());
        self.sessions.lock().unwrap().insert(key, entry);
        shared
    }

    fn unregister_session(&self, key: (i32, i32)) {
        self.sessions.lock().unwrap().remove(&key);
    }

    /// One pass of prepared-transaction recovery over every worker, on
    /// connections of its own (`recover_prepared_transactions()`).
    pub async fn recover_prepared_transactions(&self) -> PgResult<u64> {
        let mut nodes = self.recovery_connections();
        let settled = crate::transaction::recovery::recover(&self.config, &self.catalog.snapshot(), &mut nodes).await;
        nodes.close().await;
        settled
    }

    fn recovery_connections(&self) -> KeptConnections {
        self.service_connections("tessera recovery", self.config.transactions.recovery_interval_secs)
    }

    /// Service connections for a background task named `name` that runs a
    /// round every `interval_secs`. A question a node leaves unanswered for
    /// ten rounds is given up (see `KeptConnections`).
    fn service_connections(&self, name: &str, interval_secs: f64) -> KeptConnections {
        KeptConnections::new(self.config.service_login(), name, Duration::from_secs_f64(interval_secs.max(0.1) * 10.0))
    }

    /// One round of distributed deadlock detection: cancels the youngest
    /// transaction of each cycle where it waits — when it is one of this
    /// process's sessions. Every coordinator process sees the same cycles
    /// and picks the same victims; leaving each victim to its own process
    /// means the one that cancels it is the one that can tell its session
    /// why (40P01 rather than a bare cancellation).
    pub async fn break_deadlocks(&self, nodes: &mut KeptConnections) -> PgResult<()> {
        let catalog = self.catalog.snapshot();
        let waits = crate::transaction::deadlock::gather_waits(&catalog, nodes).await;
        nodes.end_round().await;
        let waits = waits?;
        let own = format!("{}{}:", crate::transaction::TRANSACTION_ID_PREFIX, self.process_id);
        for victim in crate::transaction::deadlock::choose_victims(&waits).into_iter().filter(|v| v.session.starts_with(&own)) {
            let cycle = victim.cycle.join(" -> ");
            tracing::warn!("distributed deadlock {cycle}: cancelling the transaction of {}", victim.session);
            // Recorded first: the victim's session may see its cancellation
            // before this loop does.
            self.deadlock_victims.lock().unwrap().insert(victim.session.clone(), (cycle, std::time::Instant::now()));
            let cancelled = crate::transaction::deadlock::cancel(&victim, nodes).await;
            if !matches!(cancelled, Ok(n) if n > 0) {
                // The transaction had moved on; nothing of it was cancelled.
                self.deadlock_victims.lock().unwrap().remove(&victim.session);
            }
            cancelled?;
        }
        Ok(())
    }

    /// The cycle, if the deadlock detector cancelled the transaction that
    /// `session` began at `block_started`.
    pub fn take_deadlock_victim(&self, session: &str, block_started: std::time::Instant) -> Option<String> {
        let (cycle, cancelled_at) = self.deadlock_victims.lock().unwrap().remove(session)?;
        (cancelled_at >= block_started).then_some(cycle)
    }

    /// A client's cancel request for session `key`: a statement its limits
    /// watch is stopped as a whole (see `transaction::limits`); otherwise
    /// the request goes to the node backends the session holds.
    async fn cancel(&self, key: (i32, i32)) {
        let Some((targets, limits)) = self.sessions.lock().unwrap().get(&key).map(|s| (s.cancel_targets.clone(), s.limits.clone())) else { return };
        if limits.cancel() != CancelOutcome::NotWatched {
            return;
        }
        let targets = targets.lock().unwrap().clone();
        for (addr, backend_key) in targets {
            send_cancel(&addr, backend_key).await;
        }
    }
}

/// What the coordinator knows of one client session.
struct SessionEntry {
    /// The name its worker connections carry (`TwoPhase::session_name`).
    name: String,
    user: String,
    /// The node connections it holds now, which its cancel requests reach.
    cancel_targets: CancelTargets,
    /// What bounds its running statement.
    limits: StatementLimits,
    pinned: PinReason,
}

impl Coordinator {
    /// The process's connection pools and client sessions as they are now,
    /// for `tessera.connection_pools` and `tessera.client_sessions`.
    pub fn process_report(&self, catalog: &crate::metadata::Catalog) -> ProcessReport {
        let pool = |node: String, pool: (usize, usize, Option<usize>)| PoolUsage { node, open: pool.0, idle: pool.1, limit: pool.2 };
        let mut pools = vec![pool(format!("{} (coordinator database)", self.config.coordinator_db_addr()), self.local_pool.usage())];
        let mut workers: Vec<(i32, _)> = self.worker_pools.all();
        workers.sort_by_key(|(group, _)| *group);
        for (group, node_pool) in workers {
            let node =
                catalog.nodes.iter().find(|n| n.group_id == group).map(|n| n.addr.to_string()).unwrap_or_else(|| format!("node group {group}"));
            pools.push(pool(node, node_pool.usage()));
        }
        let (blocks, blocks_limit) = self.worker_pools.blocks.usage();
        let mut sessions: Vec<ClientSession> = self
            .sessions
            .lock()
            .unwrap()
            .values()
            .map(|s| ClientSession {
                name: s.name.clone(),
                user: s.user.clone(),
                connections: s.cancel_targets.lock().unwrap().len(),
                pinned: s.pinned.get().copied(),
            })
            .collect();
        sessions.sort_by(|a, b| a.name.cmp(&b.name));
        ProcessReport { pools, sessions, blocks, blocks_limit }
    }
}

/// A new session's key: its BackendKeyData (process id, secret).
fn new_session_key() -> (i32, i32) {
    (rand::random::<i32>() & 0x7fff_ffff, rand::random::<i32>())
}

async fn connect_with_retry(config: &Config, patience: Duration) -> anyhow::Result<PgConnection> {
    let deadline = tokio::time::Instant::now() + patience;
    loop {
        match PgConnection::connect(&config.coordinator_db_addr(), &config.service_login()).await {
            Ok(c) => return Ok(c),
            Err(e) if tokio::time::Instant::now() >= deadline => {
                return Err(anyhow::anyhow!("could not reach the coordinator database at {}: {e}", config.coordinator_db_addr()))
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}

/// Follows catalog changes made by any process: the catalog triggers NOTIFY
/// `tessera_catalog`, and each notification triggers a reload.
async fn follow_catalog(coordinator: Arc<Coordinator>) {
    loop {
        let result: PgResult<()> = async {
            let mut conn = PgConnection::connect(&coordinator.config.coordinator_db_addr(), &coordinator.config.service_login()).await?;
            conn.execute("LISTEN tessera_catalog").await?;
            // Changes made while we were not listening.
            coordinator.reload_catalog().await?;
            loop {
                let msg = conn.recv().await?;
                if msg.tag() == b'A' {
                    coordinator.reload_catalog().await?;
                }
            }
        }
        .await;
        if let Err(e) = result {
            tracing::warn!("catalog listener: {e}; reconnecting");
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// Runs recovery, and the cleanup of what unfinished operations left, at
/// start-up and then at the configured interval.
async fn recover_periodically(coordinator: Arc<Coordinator>) {
    let interval = Duration::from_secs_f64(coordinator.config.transactions.recovery_interval_secs.max(0.1));
    let mut nodes = coordinator.recovery_connections();
    loop {
        if let Err(e) = crate::transaction::recovery::recover(&coordinator.config, &coordinator.catalog.snapshot(), &mut nodes).await {
            tracing::warn!("prepared-transaction recovery: {e}");
        }
        if let Err(e) = crate::operations::cleanup::run(&coordinator.config, &coordinator.catalog.snapshot()).await {
            tracing::debug!("cleanup of unfinished operations: {e}");
        }
        tokio::time::sleep(interval).await;
    }
}

/// Prepares the active nodes among `groups` for worker-side relations and
/// two-phase commits (`worker_relations::prepare_node`), each with its outcome.
async fn prepare_nodes(coordinator: &Coordinator, groups: &[i32]) -> Vec<(metadata::Node, PgResult<()>)> {
    let nodes: Vec<_> = coordinator.catalog.snapshot().active_nodes().cloned().collect();
    let mut outcomes = Vec::new();
    for node in nodes.iter().filter(|n| groups.contains(&n.group_id)) {
        let outcome = crate::commands::worker_relations::prepare_node(&coordinator.config, &coordinator.links.addr, node, &nodes).await;
        outcomes.push((node.clone(), outcome));
    }
    outcomes
}

/// Prepares the nodes (by group) that were down when this process started,
/// each as soon as it answers, until none is left or they left the cluster.
async fn prepare_when_back(coordinator: Arc<Coordinator>, mut groups: Vec<i32>) {
    let interval = Duration::from_secs_f64(coordinator.config.transactions.recovery_interval_secs.max(0.1));
    while !groups.is_empty() {
        tokio::time::sleep(interval).await;
        groups = prepare_nodes(&coordinator, &groups)
            .await
            .into_iter()
            .filter_map(|(node, outcome)| match outcome {
                Ok(()) => {
                    tracing::info!("node {} answers again: prepared for worker-side relations and two-phase commits", node.addr);
                    None
                }
                Err(e) => {
                    tracing::debug!("{e}");
                    Some(node.group_id)
                }
            })
            .collect();
    }
}

async fn detect_deadlocks_periodically(coordinator: Arc<Coordinator>) {
    let interval = Duration::from_secs_f64(coordinator.config.transactions.deadlock_check_interval_secs.max(0.1));
    let mut nodes = coordinator.service_connections("tessera deadlock detection", coordinator.config.transactions.deadlock_check_interval_secs);
    loop {
        tokio::time::sleep(interval).await;
        if let Err(e) = coordinator.break_deadlocks(&mut nodes).await {
            tracing::warn!("distributed deadlock detection: {e}");
        }
    }
}

/// Serves clients until the process is stopped.
pub async fn serve(config: Config) -> anyhow::Result<()> {
    raise_file_limit();
    crate::transport::use_node_socket_directories(config.node_socket_directories.iter().map(std::path::PathBuf::from).collect());
    let coordinator = Coordinator::start(config).await?;
    // Before clients come: their first distributed table needs every node
    // ready for its worker-side relations, and its two-phase commits need
    // the node's `tessera_commit` objects. A node that is down now is made
    // ready once it answers again.
    let groups: Vec<i32> = coordinator.catalog.snapshot().active_nodes().map(|n| n.group_id).collect();
    let mut unprepared = Vec::new();
    for (node, outcome) in prepare_nodes(&coordinator, &groups).await {
        if let Err(e) = outcome {
            tracing::warn!("{e}; trying again every recovery interval");
            unprepared.push(node.group_id);
        }
    }
    if !unprepared.is_empty() {
        tokio::spawn(prepare_when_back(coordinator.clone(), unprepared));
    }
    let listen = &coordinator.config.listen;
    let listener = TcpListener::bind(listen).await.map_err(|e| anyhow::anyhow!("could not listen on {listen}: {e}"))?;
    let port = listener.local_addr()?.port();
    let sockets = unix_sockets(&coordinator.config.unix_socket_directories, port);
    tokio::spawn(follow_catalog(coordinator.clone()));
    tokio::spawn(recover_periodically(coordinator.clone()));
    tokio::spawn(detect_deadlocks_periodically(coordinator.clone()));
    tokio::spawn(crate::operations::background::run_jobs(coordinator.clone()));
    tracing::info!(
        "tessera coordinator listening on {}{}",
        coordinator.config.listen,
        sockets.iter().map(|s| format!(" and {}", s.path.display())).collect::<String>()
    );
    use tokio::signal::unix::{signal, SignalKind};
    let (mut terminate, mut interrupt) = (signal(SignalKind::terminate())?, signal(SignalKind::interrupt())?);
    loop {
        let accepted: std::io::Result<(Stream, String)> = tokio::select! {
            accepted = listener.accept() => accepted.map(|(stream, peer)| (stream.into(), peer.to_string())),
            accepted = accept_unix(&sockets) => accepted.map(|stream| (stream.into(), "the Unix socket".to_string())),
            // Stopping removes the socket files (dropping `sockets`).
            _ = terminate.recv() => return Ok(()),
            _ = interrupt.recv() => return Ok(()),
        };
        let (stream, peer) = match accepted {
            Ok(accepted) => accepted,
            // Out of file descriptors, say: the clients already in are served
            // on; new ones are taken again after a pause.
            Err(e) => {
                tracing::warn!("could not accept a client: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let coordinator = coordinator.clone();
        tokio::spawn(async move {
            if let Err(e) = session::run(coordinator, stream).await {
                tracing::debug!("session from {peer} ended: {e}");
            }
        });
    }
}

/// Every client and every pooled node connection is a file descriptor: the
/// soft limit (often 1,024) goes up to the hard one.
fn raise_file_limit() {
    // SAFETY: getrlimit/setrlimit only read and write the struct passed.
    unsafe {
        let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0 && limit.rlim_cur < limit.rlim_max {
            limit.rlim_cur = limit.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
        }
    }
}

/// The Unix sockets in `directories` that could be made; the others are
/// named in the log.
fn unix_sockets(directories: &[String], port: u16) -> Vec<UnixSocket> {
    let mut sockets = Vec::new();
    for dir in directories {
        match UnixSocket::bind(std::path::Path::new(dir), port) {
            Ok(socket) => sockets.push(socket),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => tracing::debug!("no Unix socket in {dir}: it does not exist"),
            Err(e) => tracing::warn!("no Unix socket in {dir}: {e}"),
        }
    }
    sockets
}

/// The next client on any of the Unix sockets (never, without any).
async fn accept_unix(sockets: &[UnixSocket]) -> std::io::Result<tokio::net::UnixStream> {
    if sockets.is_empty() {
        return std::future::pending().await;
    }
    let (accepted, _, _) = futures::future::select_all(sockets.iter().map(|s| Box::pin(s.listener.accept()))).await;
    Ok(accepted?.0)
}
