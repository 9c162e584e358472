//! Test harness: real PostgreSQL servers and real Tessera clusters in temporary
//! directories on free ports, torn down when the handle drops.
#![allow(dead_code)]

pub mod slt;

use std::path::{Path, PathBuf};
use std::process::Command;
use tessera::cluster::instance::{free_port, Instance};
use tessera::cluster::{self, LocalCluster};
use tokio_postgres::{Client, NoTls};

pub fn tessera_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_tessera"))
}

fn temp_dir(prefix: &str) -> tempfile::TempDir {
    let dir = tempfile::Builder::new().prefix(prefix).tempdir_in("/tmp").expect("temp dir");
    // The postgres OS user (when we run as root) must be able to enter it.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    dir
}

/// A Tessera cluster: coordinator database, workers and coordinator process.
pub struct TestCluster {
    pub cluster: LocalCluster,
    pub port: u16,
    _dir: tempfile::TempDir,
}

impl TestCluster {
    pub fn start(workers: usize) -> TestCluster {
        // A free port can be taken by a concurrently starting server before we
        // bind it; try again with fresh ports rather than fail the test.
        let mut last_error = None;
        for _ in 0..3 {
            let dir = temp_dir("tessera-test-");
            let data = dir.path().join("cluster");
            let port = free_port().unwrap();
            match cluster::up(&data, port, workers, None, &tessera_bin()) {
                Ok(cluster) => {
                    reach_nodes_by_socket(&cluster);
                    return TestCluster { cluster, port, _dir: dir };
                }
                Err(e) => {
                    eprintln!("tessera up failed, retrying: {e:#}");
                    let _ = cluster::down(&data);
                    last_error = Some(e);
                }
            }
        }
        panic!("tessera up: {:#}", last_error.unwrap());
    }

    /// `tessera up --standbys 1` on the running cluster: every worker gets
    /// a synchronous standby. Returns the cluster as it is then.
    pub async fn add_standbys(&self) -> LocalCluster {
        let dir = self.cluster.dir.clone();
        let cluster = tokio::task::spawn_blocking(move || {
            let mut cluster = LocalCluster::open(&dir).unwrap().expect("the test's cluster");
            cluster::standbys::ensure(&mut cluster, 1).expect("tessera up --standbys 1");
            cluster
        })
        .await
        .unwrap();
        reach_nodes_by_socket(&cluster);
        cluster
    }

    pub fn data_dir(&self) -> &Path {
        &self.cluster.dir
    }

    pub async fn connect(&self) -> Client {
        connect(self.port).await
    }

    pub fn conn_string(&self) -> String {
        format!("host=127.0.0.1 port={} user=postgres dbname=postgres", self.port)
    }

    pub fn workers(&self) -> Vec<Instance> {
        self.cluster.workers()
    }

    /// A direct connection to worker `i` (0-based), bypassing the coordinator.
    pub async fn connect_worker(&self, i: usize) -> Client {
        connect(self.cluster.state.worker_ports[i]).await
    }

    /// A direct connection to the coordinator database.
    pub async fn connect_coordinator_db(&self) -> Client {
        connect(self.cluster.state.coordinator_db_port).await
    }

    /// Stops the coordinator process, changes its configuration and starts it
    /// again, waiting until it accepts connections.
    pub fn restart_coordinator(&self, edit: impl FnOnce(&mut tessera::config::Config)) {
        self.stop_coordinator();
        self.start_coordinator(edit);
        self.wait_for_coordinator();
    }

    /// Stops the coordinator process and waits until it has exited.
    pub fn stop_coordinator(&self) {
        use std::time::{Duration, Instant};
        if let Some(pid) = self.cluster.coordinator_pid() {
            // SAFETY: plain signal delivery to the coordinator process the harness started.
            unsafe { libc::kill(pid, libc::SIGTERM) };
        }
        let start = Instant::now();
        while self.cluster.coordinator_pid().is_some() {
            assert!(start.elapsed() < Duration::from_secs(20), "the coordinator did not stop");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Waits until a started coordinator accepts connections.
    pub fn wait_for_coordinator(&self) {
        if let Err(e) = self.cluster.wait_for_coordinator(std::time::Duration::from_secs(60)) {
            panic!("the coordinator did not come back ({e}); its log ends:\n{}", self.coordinator_log_tail());
        }
    }

    /// Changes the configuration of the stopped coordinator and starts it
    /// without waiting: with a fault injected, it may die before anyone sees
    /// it accept a connection.
    pub fn start_coordinator(&self, edit: impl FnOnce(&mut tessera::config::Config)) {
        let path = self.cluster.config_path();
        let mut config = tessera::config::Config::load(&path).unwrap();
        edit(&mut config);
        std::fs::write(&path, toml::to_string(&config).unwrap()).unwrap();
        cluster::start_coordinator(&self.cluster, &tessera_bin()).unwrap();
    }

    /// Starts a second coordinator process over the same catalog and nodes,
    /// on a port of its own (the configuration as `edit` leaves it), and
    /// waits until it accepts clients; it stops when the handle drops.
    pub async fn start_second_coordinator(&self, edit: impl FnOnce(&mut tessera::config::Config)) -> (StopOnDrop, u16) {
        let port = free_port().unwrap();
        let mut config = tessera::config::Config::load(&self.cluster.config_path()).unwrap();
        config.listen = format!("127.0.0.1:{port}");
        config.unix_socket_directories.clear();
        // The first coordinator's monitoring port is taken.
        config.metrics_listen = None;
        edit(&mut config);
        let path = self.data_dir().join("second.toml");
        std::fs::write(&path, toml::to_string(&config).unwrap()).unwrap();
        let log = std::fs::File::create(self.data_dir().join("second.log")).unwrap();
        let process =
            Command::new(tessera_bin()).arg("serve").arg("--config").arg(&path).stdout(log.try_clone().unwrap()).stderr(log).spawn().unwrap();
        let second = StopOnDrop(process);
        let waiting = std::time::Instant::now();
        while try_connect(port).await.is_err() {
            assert!(waiting.elapsed() < std::time::Duration::from_secs(30), "the second coordinator did not start");
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        (second, port)
    }

    /// Everything the coordinator processes of this cluster logged.
    pub fn coordinator_log(&self) -> String {
        std::fs::read_to_string(self.data_dir().join("coordinator.log")).unwrap_or_default()
    }

    /// The last lines of the coordinator's log, for failure messages.
    pub fn coordinator_log_tail(&self) -> String {
        let log = self.coordinator_log();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }

    /// Waits until the coordinator process has exited (e.g. at a fault-injection point).
    pub fn wait_for_coordinator_exit(&self) {
        let start = std::time::Instant::now();
        while self.cluster.coordinator_pid().is_some() {
            assert!(start.elapsed() < std::time::Duration::from_secs(20), "the coordinator did not exit");
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    }

    /// Stops worker `i` as a crash would (immediate shutdown): its open
    /// transactions are lost, its prepared ones survive.
    pub fn kill_worker(&self, i: usize) {
        self.workers()[i].kill().expect("immediate shutdown of a worker");
    }

    /// Starts worker `i` again, waiting until it accepts connections.
    pub fn start_worker(&self, i: usize) {
        self.workers()[i].start().expect("starting a worker");
    }

    /// Prepared transactions on all workers together.
    pub async fn prepared_on_workers(&self) -> i64 {
        self.count_on_workers("SELECT count(*) FROM pg_prepared_xacts").await
    }

    /// Deciding transactions' commit records on all workers together
    /// (`transaction::decided`) that recovery has not deleted yet.
    pub async fn worker_commit_records(&self) -> i64 {
        self.count_on_workers("SELECT count(*) FROM tessera_commit.commit_records").await
    }

    /// The sum over all workers of the count `sql` gives on each.
    async fn count_on_workers(&self, sql: &str) -> i64 {
        let mut n = 0;
        for i in 0..self.cluster.state.worker_ports.len() {
            let w = self.connect_worker(i).await;
            n += w.query_one(sql, &[]).await.unwrap().get::<_, i64>(0);
        }
        n
    }

    /// Commit records of transactions the coordinator database decided
    /// (`transaction::decided`) that recovery has not deleted yet.
    pub async fn commit_records(&self) -> i64 {
        let local = self.connect_coordinator_db().await;
        local.query_one("SELECT count(*) FROM tessera_commit.commit_records", &[]).await.unwrap().get(0)
    }

    /// Runs psql against the coordinator; returns (success, stdout, stderr).
    pub fn psql(&self, sql: &str) -> (bool, String, String) {
        let out = Command::new("psql")
            .args([
                "-h",
                "127.0.0.1",
                "-p",
                &self.port.to_string(),
                "-U",
                "postgres",
                "-d",
                "postgres",
                "-X",
                "-A",
                "-t",
                "-v",
                "ON_ERROR_STOP=1",
                "-c",
                sql,
            ])
            .output()
            .expect("psql");
        (out.status.success(), String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

impl Drop for TestCluster {
    fn drop(&mut self) {
        let _ = cluster::down(&self.cluster.dir);
    }
}

/// A process the test started, stopped when the test ends (passing or not).
pub struct StopOnDrop(pub std::process::Child);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.kill().ok();
        self.0.wait().ok();
    }
}

/// One plain PostgreSQL server: the differential tests' oracle.
pub struct PlainPostgres {
    pub instance: Instance,
    _dir: tempfile::TempDir,
}

impl PlainPostgres {
    pub fn start() -> PlainPostgres {
        let dir = temp_dir("tessera-plain-");
        let instance = Instance::new(dir.path().join("pg"), free_port().unwrap());
        instance.init().expect("initdb");
        instance.start().expect("start");
        PlainPostgres { instance, _dir: dir }
    }

    pub async fn connect(&self) -> Client {
        connect(self.instance.port).await
    }

    /// A server ready to join `cluster` as a node: it takes TCP connections
    /// only with certificates of the cluster's CA, as `tessera up` makes its
    /// nodes; the test reaches it by its socket.
    pub fn start_node_for(cluster: &TestCluster) -> PlainPostgres {
        let dir = temp_dir("tessera-node-");
        let instance = Instance::new(dir.path().join("pg"), free_port().unwrap());
        instance.init_worker().expect("initdb");
        if let Some(ca) = cluster.cluster.ca().expect("the cluster's CA") {
            instance.secure(&ca).expect("the node's certificates");
        }
        instance.start().expect("start");
        reach_by_socket(instance.port, &instance.data_dir);
        PlainPostgres { instance, _dir: dir }
    }
}

impl Drop for PlainPostgres {
    fn drop(&mut self) {
        let _ = self.instance.stop();
    }
}

pub async fn connect(port: u16) -> Client {
    try_connect(port).await.expect("connect")
}

/// A connection to `port` as `user`, without a password.
pub async fn connect_as(port: u16, user: &str) -> Client {
    try_connect_as(port, user).await.unwrap_or_else(|e| panic!("connect as {user}: {e}"))
}

/// A connection to whatever listens on `port`, or the error (e.g. while the
/// server restarts).
pub async fn try_connect(port: u16) -> Result<Client, tokio_postgres::Error> {
    try_connect_as(port, "postgres").await
}

async fn try_connect_as(port: u16, user: &str) -> Result<Client, tokio_postgres::Error> {
    connect_with(&format!("host={} port={port} user={user} dbname=postgres", host_for(port))).await
}

/// A connection to `port` as `user` with `password`, or the error.
pub async fn try_login(port: u16, user: &str, password: &str) -> Result<Client, tokio_postgres::Error> {
    connect_with(&format!("host={} port={port} user={user} password={password} dbname=postgres", host_for(port))).await
}

/// Nodes of the clusters this test process made, by port: their Unix
/// socket's directory. Over TCP a node takes only TLS with a certificate
/// of its cluster's CA; tests reach it as its operator would, on its host.
static NODE_SOCKETS: std::sync::Mutex<Vec<(u16, String)>> = std::sync::Mutex::new(Vec::new());

/// Where a test connects for `port`: a node's socket directory, or the
/// loopback address (the coordinator, a plain server, a node gone whose
/// port another server took).
fn host_for(port: u16) -> String {
    let sockets = NODE_SOCKETS.lock().unwrap();
    let node = sockets.iter().find(|(p, dir)| *p == port && Path::new(dir).join(format!(".s.PGSQL.{port}")).exists());
    node.map(|(_, dir)| dir.clone()).unwrap_or_else(|| "127.0.0.1".into())
}

/// Makes direct connections to `port` go over the socket in `dir`.
pub fn reach_by_socket(port: u16, dir: &Path) {
    let mut sockets = NODE_SOCKETS.lock().unwrap();
    sockets.retain(|(p, _)| *p != port);
    sockets.push((port, dir.display().to_string()));
}

/// Makes direct connections to `cluster`'s nodes go over their sockets.
pub fn reach_nodes_by_socket(cluster: &LocalCluster) {
    let standbys = cluster.pairs().into_iter().map(|pair| pair.servers[1].clone());
    for node in std::iter::once(cluster.coordinator_db()).chain(cluster.workers()).chain(standbys) {
        reach_by_socket(node.port, &node.data_dir);
    }
}

/// `tessera up` on an existing test cluster (with more workers), whose
/// nodes are then reached by socket too.
pub fn grow(dir: &Path, port: u16, workers: usize) -> LocalCluster {
    let grown = cluster::up(dir, port, workers, None, &tessera_bin()).expect("tessera up with more workers");
    reach_nodes_by_socket(&grown);
    grown
}

/// A connection made from a libpq-style connection string, or the error.
pub async fn connect_with(conn_str: &str) -> Result<Client, tokio_postgres::Error> {
    let (client, conn) = tokio_postgres::connect(conn_str, NoTls).await?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok(client)
}

/// A connection over TLS for `role`, as a node's link makes one: it
/// verifies the server against `cluster`'s CA and presents a certificate
/// the CA made out to `role`.
pub async fn connect_with_certificate(cluster: &TestCluster, conn_str: &str, role: &str) -> Result<Client, tokio_postgres::Error> {
    let ca = cluster.cluster.ca().unwrap().expect("the cluster's CA");
    let issued = ca.role_certificate(role).unwrap();
    let roots = std::sync::Arc::new(tessera::transport::root_store(&ca.certificate_pem()).unwrap());
    let config = tessera::transport::tls_client_config(roots, &issued.certificate_pem, &issued.key_pem).unwrap();
    let (client, conn) = tokio_postgres::connect(conn_str, tokio_postgres_rustls::MakeRustlsConnect::new((*config).clone())).await?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok(client)
}

/// The port of the worker holding each shard of `table`, by shard index.
pub async fn placement_ports(client: &Client, table: &str) -> Vec<i32> {
    let rows = client
        .query(
            "SELECT n.nodeport FROM pg_dist_shard s JOIN pg_dist_placement p USING (shardid) JOIN pg_dist_node n ON n.groupid = p.groupid
             WHERE s.logicalrelid = $1::text::regclass ORDER BY s.shardindex",
            &[&table],
        )
        .await
        .unwrap();
    rows.iter().map(|r| r.get(0)).collect()
}

/// The index of the shard that holds int4 key `id` among `shard_count` shards,
/// worked out with the same hash module the coordinator routes with.
pub fn shard_of_int4(id: i32, shard_count: u32) -> usize {
    let h = tessera::hash::hash_text(tessera::hash::HashType::Int4, &id.to_string()).unwrap();
    tessera::hash::shard_index(tessera::hash::row_hash(Some(h)), shard_count) as usize
}

/// The SQLSTATE of a failed statement.
pub fn sqlstate(e: &tokio_postgres::Error) -> String {
    e.as_db_error().map(|d| d.code().code().to_string()).unwrap_or_else(|| format!("not a server error: {e}"))
}

/// Rows of a simple-protocol query as text, for easy comparison.
pub async fn text_rows(client: &Client, sql: &str) -> Vec<Vec<Option<String>>> {
    let messages = client.simple_query(sql).await.unwrap_or_else(|e| panic!("{sql}: {}", error_text(&e)));
    messages
        .into_iter()
        .filter_map(|m| match m {
            tokio_postgres::SimpleQueryMessage::Row(r) => Some((0..r.len()).map(|i| r.get(i).map(str::to_string)).collect()),
            _ => None,
        })
        .collect()
}

/// What a statement gave: its rows (text, in order), or its SQLSTATE and
/// message — what differential tests compare.
pub async fn outcome(c: &Client, sql: &str) -> Result<Vec<Vec<Option<String>>>, (String, String)> {
    match c.simple_query(sql).await {
        Ok(messages) => Ok(messages
            .into_iter()
            .filter_map(|m| match m {
                tokio_postgres::SimpleQueryMessage::Row(r) => Some((0..r.len()).map(|i| r.get(i).map(str::to_string)).collect()),
                _ => None,
            })
            .collect()),
        Err(e) => {
            let db = e.as_db_error().unwrap_or_else(|| panic!("{sql}: {e}"));
            Err((db.code().code().to_string(), db.message().to_string()))
        }
    }
}

/// Runs `sql` on `c` (in the extended protocol or the simple one), sends a
/// cancel request for it half a second in, and checks that the statement
/// failed as PostgreSQL's cancelled statements do; returns how long after
/// the request it ended.
pub async fn cancelled_after_request(c: &Client, sql: &str, extended: bool) -> std::time::Duration {
    let token = c.cancel_token();
    let cancelled = tokio::spawn(async move {
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
        token.cancel_query(NoTls).await.unwrap();
        std::time::Instant::now()
    });
    let result = if extended { c.query(sql, &[]).await.map(|_| ()) } else { c.simple_query(sql).await.map(|_| ()) };
    let ended = std::time::Instant::now();
    let e = result.expect_err(sql);
    assert_eq!(sqlstate(&e), "57014", "{sql}: {}", error_text(&e));
    assert_eq!(e.as_db_error().unwrap().message(), "canceling statement due to user request");
    ended.saturating_duration_since(cancelled.await.unwrap())
}

/// A server error's message, detail, hint and context, for assertions on wording.
pub fn error_text(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(d) => format!("{} | {} | {} | {}", d.message(), d.detail().unwrap_or(""), d.hint().unwrap_or(""), d.where_().unwrap_or("")),
        None => e.to_string(),
    }
}
