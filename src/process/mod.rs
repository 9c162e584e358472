//! The state one coordinator process shares among its sessions, executors,
//! commands and background loops: the configuration, the catalog snapshot
//! and its reload, the node pools, the session registry, fences and the
//! deadlock detector's victims. It is one handle (`Coordinator`), passed down
//! explicitly; none of it has to survive a restart, since the catalog is
//! reloaded from the coordinator database.

mod catalog_reload;
pub mod context;
pub mod fence;
pub mod report;
mod sessions;

use crate::config::Config;
use crate::connection::kept::KeptConnections;
use crate::connection::PgConnection;
use crate::error::{PgError, PgResult};
use crate::metadata::{self, CatalogHandle};
use crate::transaction::limits::ProcessMemory;
pub use sessions::new_session_key;
use sessions::SessionEntry;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// State shared by every session of one coordinator process.
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
    /// The worker connections the sessions share.
    pub worker_pools: Arc<crate::transaction::WorkerPools>,
    /// The coordinator database connections the sessions share.
    pub local_pool: Arc<crate::transaction::coordinator_db::LocalPool>,
    /// Clients connected now.
    pub clients: std::sync::atomic::AtomicUsize,
    /// The relay of the workers' postgres_fdw links to other nodes.
    pub links: Arc<crate::transaction::links::LinkRelay>,
    /// Writes held back while this process cuts shard groups over to other nodes.
    pub fences: fence::Fences,
    /// Woken when a session schedules a background job, so it starts now.
    pub jobs_scheduled: tokio::sync::Notify,
    /// The memory the sessions' running statements hold together.
    statement_memory: Arc<ProcessMemory>,
    /// What the process counts of its work (`citus_stat_*`, `/metrics`).
    pub stats: Arc<crate::stats::Stats>,
}

impl Coordinator {
    /// Connects to the coordinator database (waiting for it to come up), installs
    /// or upgrades the catalog, registers configured workers and loads the catalog.
    pub async fn start(config: Config) -> anyhow::Result<Arc<Coordinator>> {
        crate::connection::set_connect_timeout(Duration::from_secs_f64(config.connections.node_connect_timeout_secs.max(0.001)));
        crate::transport::set_node_silence_timeout(Duration::from_secs_f64(config.connections.node_silence_timeout_secs.max(1.0)));
        let mut conn = connect_with_retry(&config, Duration::from_secs(60)).await?;
        metadata::install(&mut conn, &crate::transaction::decided::deciding_objects_sql())
            .await
            .map_err(|e| anyhow::anyhow!("could not install the catalog: {e}"))?;
        for w in &config.workers {
            conn.execute(&format!(
                "INSERT INTO tessera.pg_dist_node (nodename, nodeport) VALUES ({}, {}) ON CONFLICT (nodename, nodeport) DO NOTHING",
                crate::connection::quote_literal(&w.host),
                w.port
            ))
            .await
            .map_err(|e| anyhow::anyhow!("could not register worker {}:{}: {e}", w.host, w.port))?;
        }
        let catalog = metadata::load_since(&mut conn, &config.service_login(), &metadata::Catalog::default())
            .await
            .map_err(|e| anyhow::anyhow!("could not load the catalog: {e}"))?;
        conn.terminate().await;
        let pool_wait = Duration::from_secs_f64(config.connections.pool_wait_secs.max(0.0));
        let stats = Arc::new(crate::stats::Stats::new(config.stats.clone()));
        let worker_pools =
            crate::transaction::WorkerPools::new(config.connections.max_per_node, config.connections.active_per_node(), pool_wait, stats.clone())
                .with_per_statement(config.connections.executor_pool_size());
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
            worker_pools: Arc::new(worker_pools),
            local_pool: Arc::new(local_pool),
            clients: std::sync::atomic::AtomicUsize::new(0),
            links,
            fences: Default::default(),
            jobs_scheduled: Default::default(),
            statement_memory,
            stats,
        }))
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

    /// One pass of prepared-transaction recovery over every worker, on
    /// connections of its own (`recover_prepared_transactions()`).
    pub async fn recover_prepared_transactions(&self) -> PgResult<u64> {
        let mut nodes = self.recovery_connections();
        let settled = self.recover_on(&mut nodes).await;
        nodes.close().await;
        settled
    }

    /// One pass of prepared-transaction recovery on `nodes`, counted.
    pub async fn recover_on(&self, nodes: &mut KeptConnections) -> PgResult<u64> {
        let settled = crate::transaction::recovery::recover(&self.config, &self.catalog.snapshot(), nodes).await;
        if let Ok(n) = settled {
            self.stats.counters.add(crate::stats::Counter::PreparedTransactionsRecovered, n);
        }
        settled
    }

    pub fn recovery_connections(&self) -> KeptConnections {
        self.service_connections("tessera recovery", self.config.transactions.recovery_interval_secs)
    }

    /// Service connections for a background task named `name` that runs a
    /// round every `interval_secs`. A question a node leaves unanswered for
    /// ten rounds is given up (see `KeptConnections`).
    pub fn service_connections(&self, name: &str, interval_secs: f64) -> KeptConnections {
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
