//! Configuration of `tessera serve`: where to listen, the coordinator database,
//! and the workers to register at start-up. `tessera up` writes one of these for
//! the embedded cluster; multi-host clusters write their own.

use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Config {
    /// Address the coordinator accepts clients on, e.g. "127.0.0.1:5432".
    pub listen: String,
    /// Directories where the coordinator also listens on a Unix-domain
    /// socket, `.s.PGSQL.<port>` as PostgreSQL names it, so that `psql -p
    /// <port>` without a host reaches it. Missing directories are skipped.
    #[serde(default = "default_unix_socket_directories")]
    pub unix_socket_directories: Vec<String>,
    /// Directories where nodes on this host have their Unix-domain sockets:
    /// a node registered at a loopback address whose socket is found in one
    /// of them is reached over it rather than over TCP.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub node_socket_directories: Vec<String>,
    /// How clients prove who they are to the coordinator. Absent means trust,
    /// so configurations written before the setting existed keep working.
    #[serde(default, skip_serializing_if = "AuthMethod::is_trust")]
    pub auth: AuthMethod,
    /// TLS for clients (`[tls]`); without it SSLRequest is declined, as by
    /// PostgreSQL with `ssl = off`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<TlsConfig>,
    /// The cluster's certificate authority (`[node_tls]`): with it the
    /// coordinator reaches nodes over TCP only by TLS, verifying them
    /// against the CA and logging in with certificates it signs for each
    /// role, and hands the nodes the certificates their own links log in
    /// with. Without it, node connections over TCP are in the clear and
    /// nodes must trust them (or take `coordinator_db.password`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_tls: Option<NodeTlsConfig>,
    pub coordinator_db: DatabaseConfig,
    /// Where the coordinator relays the workers' postgres_fdw links to other
    /// nodes (`transaction::links`), e.g. "10.0.0.5:6433": an address of
    /// this host the workers reach. Absent: the host of `listen`, on a free
    /// port chosen at each start (told to the workers by this host's name
    /// when `listen` names every interface).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worker_links: Option<String>,
    /// Where the coordinator serves `/metrics` (OpenMetrics) and the
    /// dashboard over HTTP, e.g. "127.0.0.1:9187"; absent: nowhere. An
    /// address other than loopback needs `metrics_password` and `[tls]`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metrics_listen: Option<String>,
    /// The password the HTTP listener asks for (Basic authentication, any
    /// user name); required when it listens beyond loopback.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metrics_password: Option<String>,
    /// Workers registered at start-up if the catalog does not know them yet.
    #[serde(default)]
    pub workers: Vec<NodeConfig>,
    #[serde(default)]
    pub transactions: TransactionConfig,
    #[serde(default)]
    pub connections: ConnectionConfig,
    #[serde(default)]
    pub statements: StatementConfig,
    #[serde(default)]
    pub failover: FailoverConfig,
    #[serde(default)]
    pub stats: StatsConfig,
}

/// The limits and switches of the statistics (`[stats]` in the
/// configuration; Citus's `citus.stat_statements_max`,
/// `citus.stat_tenants_limit`, `citus.stat_tenants_period`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StatsConfig {
    /// Whether statements and tenants are tracked at all (the counters and
    /// histograms always are).
    pub track: bool,
    /// Statement entries kept at most; the least-called go first.
    pub statements_max: usize,
    /// Tenants `citus_stat_tenants` shows at most (three times as many are
    /// tracked, so that a rising tenant is not evicted before it shows).
    pub tenants_limit: usize,
    /// The length of a tenant statistics period, in seconds.
    pub tenants_period_secs: u64,
}

impl Default for StatsConfig {
    fn default() -> Self {
        StatsConfig { track: true, statements_max: 50_000, tenants_limit: 100, tenants_period_secs: 60 }
    }
}

/// The name a worker's standby gives itself on its primary: its replication
/// slot and, for synchronous replication, its `application_name`.
pub const STANDBY_NAME: &str = "tessera_standby";

/// Automatic failover of workers that have a standby (`[failover]`).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct FailoverConfig {
    /// How often the coordinator asks each such worker's primary whether it answers.
    #[serde(default = "default_health_check_interval")]
    pub health_check_interval_secs: f64,
    /// How long a primary may go without answering before its standby is promoted.
    #[serde(default = "default_failure_timeout")]
    pub failure_timeout_secs: f64,
}

impl Default for FailoverConfig {
    fn default() -> Self {
        FailoverConfig { health_check_interval_secs: default_health_check_interval(), failure_timeout_secs: default_failure_timeout() }
    }
}

fn default_health_check_interval() -> f64 {
    1.0
}

fn default_failure_timeout() -> f64 {
    4.0
}

/// What one statement may take of the coordinator process (`[statements]`).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct StatementConfig {
    /// Memory the coordinator holds for one statement at most (rows it
    /// combines, broadcasts or passes on), in MB; beyond it the statement
    /// fails with 53200. A session may set its own with `SET
    /// tessera.max_statement_memory`. 0: no limit of a statement's own.
    #[serde(default = "default_statement_memory")]
    pub max_memory_mb: u64,
    /// Memory all running statements together hold at most, in MB: the
    /// statement that would go past it fails with 53200, whatever the
    /// sessions set.
    #[serde(default = "default_total_statement_memory")]
    pub max_total_memory_mb: u64,
}

impl Default for StatementConfig {
    fn default() -> Self {
        StatementConfig { max_memory_mb: default_statement_memory(), max_total_memory_mb: default_total_statement_memory() }
    }
}

impl StatementConfig {
    /// `max_memory_mb` in bytes; None for no limit.
    pub fn memory_limit(&self) -> Option<usize> {
        (self.max_memory_mb > 0).then(|| megabytes(self.max_memory_mb))
    }

    /// `max_total_memory_mb` in bytes.
    pub fn total_memory_limit(&self) -> usize {
        megabytes(self.max_total_memory_mb)
    }
}

fn megabytes(mb: u64) -> usize {
    usize::try_from(mb.saturating_mul(1 << 20)).unwrap_or(usize::MAX)
}

fn default_statement_memory() -> u64 {
    256
}

fn default_total_statement_memory() -> u64 {
    2048
}

/// Clients and the connections to the nodes (`[connections]`).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ConnectionConfig {
    /// Connections the coordinator process keeps open to each node at most,
    /// shared by its sessions; absent: 80% of the node's `max_connections`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_per_node: Option<usize>,
    /// The same for the coordinator database, whose connections sessions
    /// hold while they run local statements or blocks, or for good once
    /// pinned (a temporary table, LISTEN, …).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_coordinator_db: Option<usize>,
    /// Statements outside transaction blocks running at once on each worker
    /// at most (blocks are bounded apart, see `BlockGate`); absent: four per
    /// CPU of the coordinator's host. Beyond a few per core, more backends
    /// running at once only share the same CPUs less efficiently.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub active_per_node: Option<usize>,
    /// Connections to each worker that one read outside a transaction
    /// block runs its shard tasks on at most (Citus's name; a session may
    /// set its own with `SET citus.max_adaptive_executor_pool_size`); 1
    /// runs them one after another on the session's one connection.
    /// Absent: the CPUs of the coordinator's host, which are the workers'
    /// in the embedded cluster; set it to the workers' core count when
    /// they run elsewhere.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_adaptive_executor_pool_size: Option<usize>,
    /// How long a statement waits for a node connection when the node has
    /// its limit open and all busy, before failing with 53300.
    #[serde(default = "default_pool_wait")]
    pub pool_wait_secs: f64,
    /// Clients connected at once at most; more are turned away with 53300.
    #[serde(default = "default_max_clients")]
    pub max_clients: usize,
    /// How long making a connection to a node (and logging in) may take
    /// before the statement that needed it fails with 08001.
    #[serde(default = "default_node_connect_timeout")]
    pub node_connect_timeout_secs: f64,
    /// How long a TCP connection to a node may go unanswered (keepalive
    /// probes on an idle one, unacknowledged data on a busy one) before it
    /// counts as lost: what a statement waiting on a node that the network
    /// cut off waits at most.
    #[serde(default = "default_node_silence_timeout")]
    pub node_silence_timeout_secs: f64,
}

impl Default for ConnectionConfig {
    fn default() -> Self {
        ConnectionConfig {
            max_per_node: None,
            max_coordinator_db: None,
            active_per_node: None,
            max_adaptive_executor_pool_size: None,
            pool_wait_secs: default_pool_wait(),
            max_clients: default_max_clients(),
            node_connect_timeout_secs: default_node_connect_timeout(),
            node_silence_timeout_secs: default_node_silence_timeout(),
        }
    }
}

impl ConnectionConfig {
    /// `active_per_node`, or its default for this host.
    pub fn active_per_node(&self) -> usize {
        self.active_per_node.unwrap_or_else(|| 4 * host_cpus()).max(1)
    }

    /// `max_adaptive_executor_pool_size`, or its default for this host.
    pub fn executor_pool_size(&self) -> usize {
        self.max_adaptive_executor_pool_size.unwrap_or_else(host_cpus).max(1)
    }
}

/// The CPUs this process may run on (2 when unknown).
fn host_cpus() -> usize {
    std::thread::available_parallelism().map_or(2, |n| n.get())
}

fn default_pool_wait() -> f64 {
    30.0
}

fn default_max_clients() -> usize {
    10_000
}

fn default_node_silence_timeout() -> f64 {
    20.0
}

fn default_node_connect_timeout() -> f64 {
    10.0
}

/// Two-phase commit and its recovery (`[transactions]`).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct TransactionConfig {
    /// How often recovery looks for prepared transactions left behind.
    #[serde(default = "default_recovery_interval")]
    pub recovery_interval_secs: f64,
    /// How often waits across workers are checked for distributed deadlocks.
    #[serde(default = "default_deadlock_interval")]
    pub deadlock_check_interval_secs: f64,
    /// For fault-injection tests only: make the process die at this point of
    /// two-phase commit ("after-prepare" or "after-decision"; "stall-after-prepare"
    /// only pauses the committing session for ten recovery intervals), of a
    /// worker link's commit ("after-link-prepare", "after-link-reply") or of a
    /// shard move ("move-after-subscribe", "move-before-switch", "move-after-switch").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fault_injection: Option<Fault>,
    /// For fault-injection tests only: how many commits get past the fault point
    /// before it fires, so that the crash lands in the middle of a workload.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub fault_after_commits: u32,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

impl TransactionConfig {
    /// The fault to inject, with the commits to let past it first.
    pub fn fault(&self) -> Option<(Fault, u32)> {
        self.fault_injection.map(|f| (f, self.fault_after_commits))
    }
}

impl Default for TransactionConfig {
    fn default() -> Self {
        TransactionConfig {
            recovery_interval_secs: default_recovery_interval(),
            deadlock_check_interval_secs: default_deadlock_interval(),
            fault_injection: None,
            fault_after_commits: 0,
        }
    }
}

fn default_recovery_interval() -> f64 {
    5.0
}

fn default_deadlock_interval() -> f64 {
    2.0
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct TlsConfig {
    /// The certificate chain, PEM.
    pub cert_file: String,
    /// Its private key, PEM.
    pub key_file: String,
    #[serde(default)]
    pub mode: TlsMode,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct NodeTlsConfig {
    /// The CA's certificate, PEM: nodes' certificates must chain to it.
    pub ca_file: String,
    /// The CA's private key, PEM: only the coordinator needs it.
    pub ca_key_file: String,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum TlsMode {
    /// TLS for the clients that ask for it (`sslmode=prefer`, `require`, …).
    #[default]
    #[serde(rename = "allow")]
    Allow,
    /// Clients over TCP must use TLS, as PostgreSQL's `hostssl` lines ask;
    /// Unix-socket clients are local and need none.
    #[serde(rename = "require")]
    Require,
}

/// Client authentication at the coordinator (`auth = "…"`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum AuthMethod {
    /// Every client is accepted under the user name it asks for.
    #[default]
    #[serde(rename = "trust")]
    Trust,
    /// Clients prove their password with SASL SCRAM-SHA-256 against the role's
    /// verifier in the coordinator database's `pg_authid`.
    #[serde(rename = "scram-sha-256")]
    ScramSha256,
}

impl AuthMethod {
    pub fn is_trust(&self) -> bool {
        *self == AuthMethod::Trust
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct DatabaseConfig {
    pub host: String,
    pub port: u16,
    #[serde(default = "default_user")]
    pub user: String,
    #[serde(default = "default_user")]
    pub database: String,
    #[serde(default)]
    pub password: Option<String>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct NodeConfig {
    pub host: String,
    pub port: u16,
}

/// Debian's libpq looks in /var/run/postgresql, upstream's in /tmp.
pub fn default_unix_socket_directories() -> Vec<String> {
    vec!["/var/run/postgresql".into(), "/tmp".into()]
}

fn default_user() -> String {
    "postgres".into()
}

impl Config {
    pub fn load(path: &std::path::Path) -> anyhow::Result<Config> {
        let text = std::fs::read_to_string(path).map_err(|e| anyhow::anyhow!("could not read {}: {e}", path.display()))?;
        toml::from_str(&text).map_err(|e| anyhow::anyhow!("invalid configuration {}: {e}", path.display()))
    }

    /// Where the coordinator database is: as configured, or where a
    /// failover moved it since this process started (`move_coordinator_db`).
    pub fn coordinator_db_addr(&self) -> ServerAddr {
        coordinator_db_now(&ServerAddr { host: self.coordinator_db.host.clone(), port: self.coordinator_db.port })
    }

    /// The address to relay worker links on (`worker_links`).
    pub fn worker_links_listen(&self) -> String {
        if let Some(addr) = &self.worker_links {
            return addr.clone();
        }
        let host = self.listen.rsplit_once(':').map_or(self.listen.as_str(), |(host, _)| host);
        format!("{host}:0")
    }

    /// The identity the coordinator uses for its own catalog work.
    pub fn service_login(&self) -> Login {
        Login {
            user: self.coordinator_db.user.clone(),
            database: self.coordinator_db.database.clone(),
            password: self.coordinator_db.password.clone(),
            options: vec![("application_name".into(), "tessera".into())],
        }
    }
}

/// The coordinator database's address after a failover to its standby
/// (`operations::failover`), for the rest of the process's life; the
/// configuration names the server it started with.
static MOVED_COORDINATOR_DB: arc_swap::ArcSwapOption<ServerAddr> = arc_swap::ArcSwapOption::const_empty();

/// The coordinator database's address now: `configured`, unless a
/// failover moved it.
pub fn coordinator_db_now(configured: &ServerAddr) -> ServerAddr {
    match MOVED_COORDINATOR_DB.load_full() {
        Some(moved) => (*moved).clone(),
        None => configured.clone(),
    }
}

/// Makes `addr` the coordinator database of this process from now on.
pub fn move_coordinator_db(addr: ServerAddr) {
    MOVED_COORDINATOR_DB.store(Some(std::sync::Arc::new(addr)));
}

/// Where a PostgreSQL server listens.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ServerAddr {
    pub host: String,
    pub port: u16,
}

impl std::fmt::Display for ServerAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.host, self.port)
    }
}

/// Login details shared by every connection a session opens.
#[derive(Clone, Debug)]
pub struct Login {
    pub user: String,
    pub database: String,
    pub password: Option<String>,
    /// Extra start-up parameters (DateStyle, TimeZone, application_name, …).
    pub options: Vec<(String, String)>,
}

/// Points in two-phase commit and in shard moves where a test can make the
/// coordinator process die, as it might crash in production. Test-only: set by
/// `[transactions] fault_injection` (and `fault_after_commits`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Fault {
    /// After every writer but the deciding node prepared, before the
    /// deciding commit.
    AfterPrepare,
    /// After the deciding commit (a worker's or the coordinator database's),
    /// before COMMIT PREPARED.
    AfterDecision,
    /// Not a crash: after the PREPAREs the committing session stalls for ten
    /// recovery intervals (as a coordinator might, swapped out or paused),
    /// then goes on.
    StallAfterPrepare,
    /// After a worker link's remote transaction is prepared, before
    /// postgres_fdw on the worker hears back (`links`).
    AfterLinkPrepare,
    /// After postgres_fdw on the worker heard that commit went through (the
    /// part prepared), before the part is settled.
    AfterLinkReply,
    /// A shard move: the subscription copying the shard group is made.
    MoveAfterSubscribe,
    /// A shard move: writes to the old shards are locked and the new ones
    /// complete, before the catalog switch commits.
    MoveBeforeSwitch,
    /// A shard move: the catalog names the new placement; the workers'
    /// partitions and the old shards are not dealt with yet.
    MoveAfterSwitch,
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINIMAL: &str = "listen = \"127.0.0.1:5432\"\n[coordinator_db]\nhost = \"127.0.0.1\"\nport = 5433\n";

    #[test]
    fn worker_links_default_to_the_listen_host() {
        let mut config: Config = toml::from_str(MINIMAL).unwrap();
        assert_eq!(config.worker_links_listen(), "127.0.0.1:0");
        assert!(!toml::to_string(&config).unwrap().contains("worker_links"));
        config.worker_links = Some("10.0.0.5:6433".into());
        assert_eq!(config.worker_links_listen(), "10.0.0.5:6433");
    }

    #[test]
    fn auth_defaults_to_trust_and_is_not_written_then() {
        let config: Config = toml::from_str(MINIMAL).unwrap();
        assert_eq!(config.auth, AuthMethod::Trust);
        assert!(!toml::to_string(&config).unwrap().contains("auth"));
    }

    #[test]
    fn auth_scram_round_trips() {
        let config: Config = toml::from_str(&format!("auth = \"scram-sha-256\"\n{MINIMAL}")).unwrap();
        assert_eq!(config.auth, AuthMethod::ScramSha256);
        let again: Config = toml::from_str(&toml::to_string(&config).unwrap()).unwrap();
        assert_eq!(again.auth, AuthMethod::ScramSha256);
        assert!(toml::from_str::<Config>(&format!("auth = \"md5\"\n{MINIMAL}")).is_err());
    }
}
