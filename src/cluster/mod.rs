//! The embedded cluster: `tessera up` creates and starts a coordinator database,
//! N workers and the coordinator process under one data directory; `down` stops
//! them and `status` reports on them. The directory's `cluster.toml` remembers
//! the ports, so a second `up` restarts the same cluster instead of creating one.

pub mod instance;
pub mod standbys;

use crate::certificates::ClusterCa;
use crate::config::{Config, DatabaseConfig, NodeConfig, NodeTlsConfig, TlsConfig, TlsMode};
use crate::config::{Login, ServerAddr};
use crate::connection::PgConnection;
use anyhow::{bail, Context, Result};
use instance::{free_port, Instance};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const STATE_FILE: &str = "cluster.toml";
const CONFIG_FILE: &str = "tessera.toml";
const PID_FILE: &str = "coordinator.pid";
const LOG_FILE: &str = "coordinator.log";
const CA_FILE: &str = "ca.crt";
/// The coordinator database's directory (its standby's has `-standby`).
const COORDINATOR_DB: &str = "coordinator-db";
const CA_KEY_FILE: &str = "ca.key";

#[derive(Debug, Serialize, Deserialize)]
pub struct ClusterState {
    pub coordinator_port: u16,
    pub coordinator_db_port: u16,
    pub worker_ports: Vec<u16>,
    /// The port of each worker's second server (`<worker>-standby`), by the
    /// worker's directory name (`standbys`).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub standby_ports: std::collections::BTreeMap<String, u16>,
}

pub struct LocalCluster {
    pub dir: PathBuf,
    pub state: ClusterState,
}

impl LocalCluster {
    pub fn open(dir: &Path) -> Result<Option<LocalCluster>> {
        let dir = absolute(dir)?;
        let path = dir.join(STATE_FILE);
        if !path.exists() {
            return Ok(None);
        }
        let state: ClusterState = toml::from_str(&std::fs::read_to_string(&path)?).with_context(|| format!("invalid {}", path.display()))?;
        Ok(Some(LocalCluster { dir, state }))
    }

    /// The coordinator database's primary: the server it was made with,
    /// or, with a standby, whichever of the two is primary now.
    pub fn coordinator_db(&self) -> Instance {
        match self.state.standby_ports.get(COORDINATOR_DB) {
            Some(port) => {
                let servers = [self.configured_coordinator_db(), Instance::new(self.dir.join(format!("{COORDINATOR_DB}-standby")), *port)];
                standbys::newest(&servers).clone()
            }
            None => self.configured_coordinator_db(),
        }
    }

    /// The coordinator database's server as `tessera up` made it.
    fn configured_coordinator_db(&self) -> Instance {
        Instance::new(self.dir.join(COORDINATOR_DB), self.state.coordinator_db_port)
    }

    pub fn workers(&self) -> Vec<Instance> {
        self.state.worker_ports.iter().enumerate().map(|(i, p)| Instance::new(self.dir.join(format!("worker-{}", i + 1)), *p)).collect()
    }

    /// The cluster's CA, when it was made with one.
    pub fn ca(&self) -> Result<Option<ClusterCa>> {
        let (certificate, key) = (self.dir.join(CA_FILE), self.dir.join(CA_KEY_FILE));
        if !certificate.exists() {
            return Ok(None);
        }
        ClusterCa::load(&certificate, &key).map(Some)
    }

    /// How this host's commands reach a node of the cluster: over its Unix
    /// socket (TCP would need a certificate).
    pub(crate) fn socket_addr(node: &Instance) -> ServerAddr {
        ServerAddr { host: node.data_dir.display().to_string(), port: node.port }
    }

    pub fn config_path(&self) -> PathBuf {
        self.dir.join(CONFIG_FILE)
    }

    /// Waits until this cluster's own coordinator process accepts
    /// connections on its port. Another cluster's server that took the port
    /// while ours was starting answers too, so the listening socket must be
    /// one our process holds; a coordinator that exited fails at once.
    pub fn wait_for_coordinator(&self, patience: Duration) -> Result<()> {
        let port = self.state.coordinator_port;
        let start = Instant::now();
        loop {
            let Some(pid) = self.coordinator_pid() else { bail!("the coordinator process exited before it listened on port {port}") };
            if process_listens_on(pid, port) && coordinator_answers(port) {
                return Ok(());
            }
            if start.elapsed() > patience {
                bail!("the coordinator did not start listening on port {port}");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    pub fn coordinator_pid(&self) -> Option<i32> {
        let pid: i32 = std::fs::read_to_string(self.dir.join(PID_FILE)).ok()?.trim().parse().ok()?;
        // A process that exited but was not yet reaped by its parent is a zombie:
        // it still exists, but it is not running.
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        let state = stat.rsplit_once(')').map(|(_, rest)| rest.trim_start().chars().next())?;
        (state != Some('Z')).then_some(pid)
    }
}

fn absolute(dir: &Path) -> Result<PathBuf> {
    Ok(if dir.is_absolute() { dir.to_path_buf() } else { std::env::current_dir()?.join(dir) })
}

/// Creates (first time) or restarts the embedded cluster and returns once the
/// coordinator accepts connections. `exe` is the tessera binary that runs the
/// coordinator process.
/// A running cluster with fewer workers than asked for gets new ones,
/// added with `citus_add_node` (shards stay where they are until
/// `tessera rebalance`). `executor_pool_size`, when given, is written to
/// the configuration as `[connections] max_adaptive_executor_pool_size`.
pub fn up(dir: &Path, port: u16, workers: usize, executor_pool_size: Option<usize>, exe: &Path) -> Result<LocalCluster> {
    let mut cluster = match LocalCluster::open(dir)? {
        Some(c) => {
            if c.state.worker_ports.len() > workers {
                eprintln!(
                    "note: {} holds a cluster with {} workers; keeping them all (empty one with citus_drain_node, then citus_remove_node)",
                    c.dir.display(),
                    c.state.worker_ports.len()
                );
            }
            c
        }
        None => create(dir, port, workers)?,
    };
    if let Some(size) = executor_pool_size {
        let mut config = Config::load(&cluster.config_path())?;
        if config.connections.max_adaptive_executor_pool_size != Some(size) {
            config.connections.max_adaptive_executor_pool_size = Some(size);
            std::fs::write(cluster.config_path(), toml::to_string(&config)?)?;
            if cluster.coordinator_pid().is_some() {
                eprintln!("note: the running coordinator keeps its executor pool size until it restarts (tessera down, then up)");
            }
        }
    }
    cluster.coordinator_db().start()?;
    let paired: Vec<u16> = cluster.pairs().iter().map(|pair| pair.servers[0].port).collect();
    for w in cluster.workers().into_iter().filter(|w| !paired.contains(&w.port)) {
        w.start()?;
    }
    standbys::start(&cluster)?;
    // After a failover of the coordinator database, a coordinator starts on
    // its promoted standby.
    let mut config = Config::load(&cluster.config_path())?;
    let coordinator_db_port = cluster.coordinator_db().port;
    if config.coordinator_db.port != coordinator_db_port {
        config.coordinator_db.port = coordinator_db_port;
        std::fs::write(cluster.config_path(), toml::to_string(&config)?)?;
    }
    if cluster.coordinator_pid().is_none() {
        start_coordinator(&cluster, exe)?;
    }
    cluster.wait_for_coordinator(Duration::from_secs(60)).with_context(|| format!("see {}", cluster.dir.join(LOG_FILE).display()))?;
    while cluster.state.worker_ports.len() < workers {
        add_worker(&mut cluster)?;
    }
    Ok(cluster)
}

/// Initializes and starts one more worker, and adds it to the running cluster.
fn add_worker(cluster: &mut LocalCluster) -> Result<()> {
    let port = free_port()?;
    let n = cluster.state.worker_ports.len() + 1;
    let worker = Instance::new(cluster.dir.join(format!("worker-{n}")), port);
    eprintln!("initializing {} (new worker {n})", worker.data_dir.display());
    worker.init_worker()?;
    if let Some(ca) = cluster.ca()? {
        worker.secure(&ca)?;
    }
    worker.start()?;
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    runtime
        .block_on(async {
            let coordinator = ServerAddr { host: "127.0.0.1".into(), port: cluster.state.coordinator_port };
            PgConnection::query_once(&coordinator, &admin_login("tessera up"), &format!("SELECT citus_add_node('127.0.0.1', {port})")).await
        })
        .map_err(|e| anyhow::anyhow!("adding worker 127.0.0.1:{port}: {e}"))?;
    // Remembered only once it is part of the cluster; a restart registers
    // configured workers, which now finds it there.
    cluster.state.worker_ports.push(port);
    std::fs::write(cluster.dir.join(STATE_FILE), toml::to_string(&cluster.state)?)?;
    let mut config = Config::load(&cluster.config_path())?;
    config.workers.push(NodeConfig { host: "127.0.0.1".into(), port });
    config.node_socket_directories.push(worker.data_dir.display().to_string());
    std::fs::write(cluster.config_path(), toml::to_string(&config)?)?;
    eprintln!("added worker 127.0.0.1:{port}; run `tessera rebalance` to move shards onto it");
    Ok(())
}

fn admin_login(application: &str) -> Login {
    Login { user: "postgres".into(), database: "postgres".into(), password: None, options: vec![("application_name".into(), application.into())] }
}

/// Runs the rebalancer through the coordinator one move at a time, printing
/// progress: moves, megabytes, time left.
pub async fn rebalance(dir: &Path) -> Result<()> {
    let Some(cluster) = LocalCluster::open(dir)? else {
        bail!("no Tessera cluster in {}", dir.display());
    };
    let mut conn =
        PgConnection::connect(&ServerAddr { host: "127.0.0.1".into(), port: cluster.state.coordinator_port }, &admin_login("tessera rebalance"))
            .await?;
    // table_name, shardid, shard_size, sourcename, sourceport, targetname, targetport
    let plan = conn.query("SELECT * FROM get_rebalance_table_shards_plan()").await?;
    if plan.is_empty() {
        println!("the shards are balanced; nothing to move");
        return Ok(());
    }
    let text = |row: &Vec<Option<String>>, i: usize| row.get(i).cloned().flatten().unwrap_or_default();
    let megabytes = |row: &Vec<Option<String>>| text(row, 2).parse::<f64>().unwrap_or(0.0) / 1_048_576.0;
    let total: f64 = plan.iter().map(megabytes).sum();
    let started = Instant::now();
    let mut moved = 0.0;
    for (i, row) in plan.iter().enumerate() {
        let size = megabytes(row);
        let (source, target) = (format!("{}:{}", text(row, 3), text(row, 4)), format!("{}:{}", text(row, 5), text(row, 6)));
        print!("[{}/{}] shard {} of {} ({size:.1} MB) {source} -> {target} ... ", i + 1, plan.len(), text(row, 1), text(row, 0));
        use std::io::Write;
        std::io::stdout().flush()?;
        let step = Instant::now();
        conn.execute(&format!(
            "SELECT citus_move_shard_placement({}, {}, {}, {}, {})",
            text(row, 1),
            crate::connection::quote_literal(&text(row, 3)),
            text(row, 4),
            crate::connection::quote_literal(&text(row, 5)),
            text(row, 6)
        ))
        .await
        .map_err(|e| anyhow::anyhow!("moving shard {} from {source} to {target}: {e}", text(row, 1)))?;
        moved += size;
        let elapsed = started.elapsed().as_secs_f64();
        let left = if moved > 0.0 { elapsed * (total - moved) / moved } else { elapsed / (i + 1) as f64 * (plan.len() - i - 1) as f64 };
        println!("{:.1} s; {moved:.1} of {total:.1} MB moved, about {left:.0} s left", step.elapsed().as_secs_f64());
    }
    conn.terminate().await;
    println!("rebalanced: {} shard groups moved in {:.1} s", plan.len(), started.elapsed().as_secs_f64());
    Ok(())
}

fn create(dir: &Path, port: u16, workers: usize) -> Result<LocalCluster> {
    let dir = absolute(dir)?;
    if std::net::TcpListener::bind(("127.0.0.1", port)).is_err() {
        bail!("port {port} is already in use; choose another with --port");
    }
    instance::prepare_dir(&dir)?;
    let state = ClusterState {
        coordinator_port: port,
        coordinator_db_port: free_port()?,
        worker_ports: (0..workers).map(|_| free_port()).collect::<Result<_>>()?,
        standby_ports: Default::default(),
    };
    let cluster = LocalCluster { dir, state };
    let mut all = vec![cluster.coordinator_db()];
    all.extend(cluster.workers());
    // The cluster's CA: it signs every server's certificate, and the
    // coordinator logs in to the nodes with role certificates it signs.
    let ca = ClusterCa::create()?;
    let (ca_file, ca_key_file) = (cluster.dir.join(CA_FILE), cluster.dir.join(CA_KEY_FILE));
    std::fs::write(&ca_file, ca.certificate_pem())?;
    instance::write_private(&ca_key_file, &ca.key_pem())?;
    for (i, node) in all.iter().enumerate() {
        eprintln!("initializing {} ({}/{})", node.data_dir.display(), i + 1, all.len());
        // The first is the coordinator database, the others workers.
        if i == 0 {
            node.init()?;
        } else {
            node.init_worker()?;
        }
        node.secure(&ca)?;
    }
    // So that clients may ask for TLS at once, and verify the coordinator
    // against the cluster's CA (`sslmode=verify-full sslrootcert=ca.crt`).
    let issued = ca.server_certificate(&instance::local_host_names())?;
    let (cert_file, key_file) = (cluster.dir.join("server.crt"), cluster.dir.join("server.key"));
    std::fs::write(&cert_file, issued.certificate_pem)?;
    instance::write_private(&key_file, &issued.key_pem)?;
    let config = Config {
        listen: format!("127.0.0.1:{port}"),
        tls: Some(TlsConfig { cert_file: cert_file.display().to_string(), key_file: key_file.display().to_string(), mode: TlsMode::Allow }),
        unix_socket_directories: crate::config::default_unix_socket_directories(),
        // Each node keeps its socket in its data directory.
        node_socket_directories: all.iter().map(|node| node.data_dir.display().to_string()).collect(),
        auth: Default::default(),
        node_tls: Some(NodeTlsConfig { ca_file: ca_file.display().to_string(), ca_key_file: ca_key_file.display().to_string() }),
        coordinator_db: DatabaseConfig {
            host: "127.0.0.1".into(),
            port: cluster.state.coordinator_db_port,
            user: "postgres".into(),
            database: "postgres".into(),
            password: None,
        },
        worker_links: None,
        // The dashboard and /metrics, on loopback only.
        metrics_listen: Some(format!("127.0.0.1:{}", free_port()?)),
        metrics_password: None,
        workers: cluster.state.worker_ports.iter().map(|p| NodeConfig { host: "127.0.0.1".into(), port: *p }).collect(),
        transactions: Default::default(),
        connections: Default::default(),
        statements: Default::default(),
        failover: Default::default(),
        stats: Default::default(),
    };
    std::fs::write(cluster.config_path(), toml::to_string(&config)?)?;
    std::fs::write(cluster.dir.join(STATE_FILE), toml::to_string(&cluster.state)?)?;
    Ok(cluster)
}

/// Starts the coordinator process in the background (e.g. again after a crash).
pub fn start_coordinator(cluster: &LocalCluster, exe: &Path) -> Result<()> {
    use std::os::unix::process::CommandExt;
    let log = std::fs::OpenOptions::new().create(true).append(true).open(cluster.dir.join(LOG_FILE))?;
    let mut cmd = std::process::Command::new(exe);
    cmd.arg("serve").arg("--config").arg(cluster.config_path()).stdin(std::process::Stdio::null()).stdout(log.try_clone()?).stderr(log);
    // SAFETY: setsid is async-signal-safe; it detaches the coordinator from our
    // terminal so it outlives this command.
    unsafe {
        cmd.pre_exec(|| {
            libc::setsid();
            Ok(())
        });
    }
    let child = cmd.spawn().context("could not start the coordinator process")?;
    std::fs::write(cluster.dir.join(PID_FILE), child.id().to_string())?;
    Ok(())
}

/// Whether process `pid` holds the socket listening on loopback `port`
/// (from /proc: the socket's inode in net/tcp among the process's fds).
fn process_listens_on(pid: i32, port: u16) -> bool {
    const LISTEN: &str = "0A";
    let Ok(table) = std::fs::read_to_string("/proc/net/tcp") else { return false };
    let suffix = format!(":{port:04X}");
    let Some(inode) = table.lines().skip(1).find_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        (fields.len() > 9 && fields[1].ends_with(&suffix) && fields[3] == LISTEN).then(|| fields[9].to_string())
    }) else {
        return false;
    };
    let wanted = format!("socket:[{inode}]");
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else { return false };
    fds.flatten().any(|fd| std::fs::read_link(fd.path()).is_ok_and(|target| target.as_os_str() == wanted.as_str()))
}

/// Whether the coordinator answers on the loopback port: it must reply to an
/// SSLRequest. A bare connect is not proof: while nothing listens, a connect
/// to a port in the ephemeral range can pick that very port as its own and
/// connect to itself.
fn coordinator_answers(port: u16) -> bool {
    use std::io::{Read, Write};
    let Ok(mut stream) = std::net::TcpStream::connect(("127.0.0.1", port)) else { return false };
    if stream.local_addr().ok() == stream.peer_addr().ok() {
        return false;
    }
    let mut request = bytes::BytesMut::new();
    crate::protocol::frontend::ssl_request(&mut request);
    let mut answer = [0u8; 1];
    stream.set_read_timeout(Some(Duration::from_secs(5))).is_ok()
        && stream.write_all(&request).is_ok()
        && stream.read_exact(&mut answer).is_ok()
        && matches!(answer[0], b'N' | b'S')
}

/// Stops the coordinator process and every node.
pub fn down(dir: &Path) -> Result<()> {
    let Some(cluster) = LocalCluster::open(dir)? else {
        bail!("no Tessera cluster in {}", dir.display());
    };
    if let Some(pid) = cluster.coordinator_pid() {
        // SAFETY: plain signal delivery to a process we started.
        unsafe { libc::kill(pid, libc::SIGTERM) };
        let start = Instant::now();
        while cluster.coordinator_pid().is_some() && start.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    let _ = std::fs::remove_file(cluster.dir.join(PID_FILE));
    for w in cluster.workers() {
        w.stop()?;
    }
    for pair in cluster.pairs() {
        for server in &pair.servers {
            server.stop()?;
        }
    }
    cluster.coordinator_db().stop()?;
    Ok(())
}

/// Prints the cluster's processes and, when the coordinator database is up,
/// each worker's shard count. `env` prints shell assignments for scripts.
pub async fn status(dir: &Path, env: bool) -> Result<()> {
    let Some(cluster) = LocalCluster::open(dir)? else {
        bail!("no Tessera cluster in {}", dir.display());
    };
    let pid = cluster.coordinator_pid();
    if env {
        println!("COORDINATOR_PORT={}", cluster.state.coordinator_port);
        println!("COORDINATOR_PID={}", pid.map(|p| p.to_string()).unwrap_or_default());
        println!("COORDINATOR_DB_PORT={}", cluster.state.coordinator_db_port);
        println!("WORKER_PORTS=\"{}\"", cluster.state.worker_ports.iter().map(|p| p.to_string()).collect::<Vec<_>>().join(" "));
        return Ok(());
    }
    let up = |b: bool| if b { "up" } else { "down" };
    println!("data directory   {}", cluster.dir.display());
    println!(
        "coordinator      127.0.0.1:{:<5}  {}",
        cluster.state.coordinator_port,
        pid.map(|p| format!("up (pid {p})")).unwrap_or_else(|| "down".into())
    );
    let db = cluster.coordinator_db();
    println!("coordinator db   127.0.0.1:{:<5}  {}", db.port, up(db.is_running()));
    let placements = shard_placements(&cluster).await.unwrap_or_default();
    for w in cluster.workers() {
        let names: Vec<String> = placements.iter().filter(|(p, _)| *p == w.port).map(|(_, name)| name.clone()).collect();
        let addr = LocalCluster::socket_addr(&w);
        let bytes = if names.is_empty() || !w.is_running() {
            None
        } else {
            crate::operations::rebalance::shard_bytes(&addr, &admin_login("tessera status"), &names).await.ok()
        };
        let shards = match bytes {
            Some(bytes) => format!("{} shard placements, {:.1} MB", names.len(), bytes as f64 / 1_048_576.0),
            None => format!("{} shard placements", names.len()),
        };
        println!("worker           127.0.0.1:{:<5}  {:<5} {}", w.port, up(w.is_running()), shards);
    }
    for line in standbys::describe(&cluster).await {
        println!("{line}");
    }
    if let Ok(config) = Config::load(&cluster.config_path()) {
        if let Some(listen) = &config.metrics_listen {
            println!("dashboard        http://{listen}/  (Prometheus: http://{listen}/metrics)");
        }
        let source = match config.connections.max_adaptive_executor_pool_size {
            Some(_) => "[connections] max_adaptive_executor_pool_size",
            None => "this machine's CPUs",
        };
        println!(
            "parallel reads   up to {} connections per worker for one statement's shard tasks ({source}; a session may SET citus.max_adaptive_executor_pool_size)",
            config.connections.executor_pool_size()
        );
    }
    if pid.is_some() {
        match coordinator_report(&cluster).await {
            Ok(lines) => lines.iter().for_each(|line| println!("{line}")),
            Err(e) => println!("coordinator's pools and clients unknown: {e}"),
        }
    }
    Ok(())
}

/// The running coordinator's clients (how many, which pinned and why) and
/// its connection pools, one line each.
async fn coordinator_report(cluster: &LocalCluster) -> Result<Vec<String>> {
    let mut conn =
        PgConnection::connect(&ServerAddr { host: "127.0.0.1".into(), port: cluster.state.coordinator_port }, &admin_login("tessera status")).await?;
    let clients = conn
        .query(
            "SELECT count(*) - 1, count(pinned_by), coalesce(string_agg(session_name || ' (' || user_name || ', ' || pinned_by || ')', ', ' ORDER BY session_name), '')
             FROM tessera.client_sessions",
        )
        .await?;
    let pools = conn
        .query(
            "SELECT node, open_connections, idle_connections, coalesce(max_connections::text, '?'), blocks, max_blocks FROM tessera.connection_pools",
        )
        .await?;
    conn.terminate().await;
    let text = |row: &Vec<Option<String>>, i: usize| row.get(i).cloned().flatten().unwrap_or_default();
    let mut lines = Vec::new();
    if let Some(row) = clients.first() {
        let pinned = text(row, 1);
        let which = if pinned == "0" { String::new() } else { format!(": {}", text(row, 2)) };
        lines.push(format!(
            "clients          {} connected besides this one, {pinned} pinned to their coordinator database connection{which}",
            text(row, 0)
        ));
    }
    if let Some(row) = pools.first() {
        lines.push(format!("blocks           {} holding worker connections (at most {} at once)", text(row, 4), text(row, 5)));
    }
    for row in &pools {
        lines.push(format!("pool             {:<22} {} open, {} idle, at most {}", text(row, 0), text(row, 1), text(row, 2), text(row, 3)));
    }
    Ok(lines)
}

/// Every shard placement: its worker's port and the shard's qualified name.
async fn shard_placements(cluster: &LocalCluster) -> Result<Vec<(u16, String)>> {
    let mut conn = PgConnection::connect(&LocalCluster::socket_addr(&cluster.coordinator_db()), &admin_login("tessera status")).await?;
    let rows = conn
        .query(
            "SELECT n.nodeport, format('%I.%I', ns.nspname, c.relname || '_' || s.shardid) FROM tessera.pg_dist_placement p
               JOIN tessera.pg_dist_node n ON n.groupid = p.groupid AND n.noderole = 'primary' JOIN tessera.pg_dist_shard s ON s.shardid = p.shardid
               JOIN pg_class c ON c.oid = s.logicalrelid JOIN pg_namespace ns ON ns.oid = c.relnamespace",
        )
        .await?;
    conn.terminate().await;
    Ok(rows.into_iter().map(|r| (r[0].as_deref().unwrap_or("0").parse().unwrap_or(0), r[1].clone().unwrap_or_default())).collect())
}
