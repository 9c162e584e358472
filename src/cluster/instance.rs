//! One local PostgreSQL server that Tessera created: initdb, configuration, start
//! and stop. Used by `tessera up` for the embedded cluster and by the test harness.
//! PostgreSQL refuses to run as root, so as root every server command runs as the
//! `postgres` OS user and the data directories belong to it.

use crate::config::STANDBY_NAME;
use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// Settings every node gets: loopback only, room for many client and coordinator
/// connections, prepared transactions for two-phase commit, logical WAL for
/// online shard moves (whose subscriptions' workers PostgreSQL otherwise
/// starts at most one per 5 s), and no JIT compilation: LLVM compiles a plan
/// without looking at cancel requests or timeouts, half a second and more
/// for the plans of the general fallback, which a statement's timeout or
/// cancellation would have to wait out. Random reads are priced as on
/// solid-state disks: a shard is small enough to be read from memory, and
/// at PostgreSQL's default (4, for spinning disks) the worker hashes a whole
/// shard rather than probe its index a few thousand times (TPC-H's Q4: a
/// task 2.7x slower).
const NODE_SETTINGS: &str = "\
listen_addresses = '127.0.0.1'
max_connections = 300
shared_buffers = 256MB
random_page_cost = 1.1
max_prepared_transactions = 200
wal_level = logical
wal_retrieve_retry_interval = 100ms
max_wal_size = 4GB
checkpoint_timeout = 30min
log_line_prefix = '%m [%p] %q%u@%d '
jit = off
";

/// Settings a worker adds: no parallel workers within a statement. A
/// multi-shard read already runs as many of its tasks at once on a node as
/// the node has cores (`citus.max_adaptive_executor_pool_size`), so parallel
/// workers inside each task only add processes to start and coordinate on
/// the same cores (TPC-H on 2 cores: q3, q9, q10 and q18 about twice as
/// fast without them; q16, one statement on one node, 1.3x slower). And
/// half the buffer pool: the embedded cluster's workers share one machine,
/// and PostgreSQL reads a table larger than a quarter of its pool through a
/// small ring of buffers, but a smaller one into the pool, evicting a page
/// for every page read once the shards outgrow it. 40 MB shards (10 M
/// accounts over 32) churned 256 MB pools; 128 MB ones read them through
/// the ring, as a single server's 256 MB pool reads the one 1.3 GB table:
/// count(*) 1.14x plain's time -> 0.97x (docs/benchmarks.md).
const WORKER_SETTINGS: &str = "\
max_parallel_workers_per_gather = 0
shared_buffers = 128MB
";

#[derive(Clone, Debug)]
pub struct Instance {
    pub data_dir: PathBuf,
    pub port: u16,
}

/// The directory holding initdb, pg_ctl and postgres: `TESSERA_PG_BIN`, Debian's
/// PostgreSQL 15, or whatever `pg_config` reports.
pub fn pg_bin_dir() -> Result<PathBuf> {
    if let Ok(dir) = std::env::var("TESSERA_PG_BIN") {
        return Ok(PathBuf::from(dir));
    }
    let debian = PathBuf::from("/usr/lib/postgresql/15/bin");
    if debian.join("initdb").exists() {
        return Ok(debian);
    }
    let out = Command::new("pg_config").arg("--bindir").output().context("PostgreSQL 15 not found: install postgresql-15 or set TESSERA_PG_BIN")?;
    Ok(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
}

fn running_as_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// Runs a PostgreSQL program, as the `postgres` user when we are root.
fn run_pg(program: &str, args: &[&str]) -> Result<Output> {
    let bin = pg_bin_dir()?.join(program);
    let mut cmd = if running_as_root() {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--"]).arg(&bin);
        c
    } else {
        Command::new(&bin)
    };
    cmd.args(args).current_dir("/");
    let out = cmd.output().with_context(|| format!("could not run {}", bin.display()))?;
    Ok(out)
}

fn check(out: Output, what: &str) -> Result<Output> {
    if !out.status.success() {
        bail!("{what} failed: {}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    }
    Ok(out)
}

/// Makes `dir` (and its new parents) and, as root, gives it to the postgres user.
pub fn prepare_dir(dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("could not create {}", dir.display()))?;
    if running_as_root() {
        let out = Command::new("chown").args(["-R", "postgres:postgres"]).arg(dir).output()?;
        check(out, "chown")?;
        // The postgres user must be able to reach the directory through its parents.
        let postgres_uid = postgres_uid()?;
        let mut p = dir.parent();
        while let Some(parent) = p {
            if let Ok(meta) = std::fs::metadata(parent) {
                use std::os::unix::fs::{MetadataExt, PermissionsExt};
                let mode = meta.permissions().mode();
                let searchable = if meta.uid() == postgres_uid { mode & 0o100 != 0 } else { mode & 0o001 != 0 };
                if !searchable {
                    bail!(
                        "{} is not searchable by the postgres user; choose a data directory elsewhere (e.g. under /tmp or /var/lib)",
                        parent.display()
                    );
                }
            }
            p = parent.parent();
        }
    }
    Ok(())
}

/// Writes a file only its owner may read (a private key).
pub fn write_private(path: &Path, contents: &str) -> Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(path)?.write_all(contents.as_bytes())?;
    Ok(())
}

fn postgres_uid() -> Result<u32> {
    let out = check(Command::new("id").args(["-u", "postgres"]).output()?, "id -u postgres")?;
    String::from_utf8_lossy(&out.stdout).trim().parse().context("unexpected output of id -u postgres")
}

/// Who may connect to a node of a cluster with a CA: anyone on the node's
/// own Unix socket, whose directory (the data directory) only the server's
/// OS user may enter; over TCP, only by TLS with a client certificate of the
/// cluster's CA made out to the role logging in (`cert` checks the common
/// name against the role).
const SECURE_HBA: &str = "\
# Written by tessera: trust on this node's own Unix socket only; over TCP,
# TLS with a client certificate of the cluster's CA naming the role.
local   all          all                trust
local   replication  all                trust
hostssl all          all  0.0.0.0/0     cert
hostssl all          all  ::/0          cert
hostssl replication  all  0.0.0.0/0     cert
hostssl replication  all  ::/0          cert
";

/// The names a local node's certificate is made out to.
pub fn local_host_names() -> Vec<String> {
    vec!["127.0.0.1".into(), "localhost".into()]
}

impl Instance {
    pub fn new(data_dir: impl Into<PathBuf>, port: u16) -> Self {
        Instance { data_dir: data_dir.into(), port }
    }

    /// initdb plus our settings. The port lives in the configuration so that a
    /// plain `pg_ctl start` brings the node back where the catalog expects it.
    pub fn init(&self) -> Result<()> {
        self.init_with("")
    }

    /// `init` for a worker, with the settings only workers take.
    pub fn init_worker(&self) -> Result<()> {
        self.init_with(WORKER_SETTINGS)
    }

    fn init_with(&self, extra: &str) -> Result<()> {
        prepare_dir(&self.data_dir)?;
        let dir = self.data_dir.to_string_lossy();
        check(run_pg("initdb", &["-D", &dir, "-U", "postgres", "-A", "trust", "-E", "UTF8", "--locale=C", "--no-sync"])?, "initdb")?;
        let conf = format!("{NODE_SETTINGS}{extra}port = {}\nunix_socket_directories = '{}'\n", self.port, dir);
        let conf_path = self.data_dir.join("postgresql.conf");
        let mut existing = std::fs::read_to_string(&conf_path)?;
        existing.push_str("\n# Written by tessera\n");
        existing.push_str(&conf);
        std::fs::write(&conf_path, existing)?;
        Ok(())
    }

    /// Makes an initialized node accept TCP connections only over TLS, with
    /// a server certificate `ca` signs and client certificates of `ca`
    /// (`SECURE_HBA`). Takes effect at the next start.
    pub fn secure(&self, ca: &crate::certificates::ClusterCa) -> Result<()> {
        let issued = ca.server_certificate(&local_host_names())?;
        std::fs::write(self.data_dir.join("server.crt"), &issued.certificate_pem)?;
        write_private(&self.data_dir.join("server.key"), &issued.key_pem)?;
        std::fs::write(self.data_dir.join("root.crt"), ca.certificate_pem())?;
        std::fs::write(self.data_dir.join("pg_hba.conf"), SECURE_HBA)?;
        let conf_path = self.data_dir.join("postgresql.conf");
        let mut conf = std::fs::read_to_string(&conf_path)?;
        conf.push_str("ssl = on\nssl_cert_file = 'server.crt'\nssl_key_file = 'server.key'\nssl_ca_file = 'root.crt'\n");
        std::fs::write(&conf_path, conf)?;
        prepare_dir(&self.data_dir)
    }

    /// Makes this (new) instance a streaming standby of `primary`, from a
    /// base backup taken over the primary's socket. It replays through
    /// replication slot `STANDBY_NAME`, which keeps the WAL it has not had
    /// yet, and names itself so (`application_name`) for the primary's
    /// synchronous replication. A standby promoted later waits for no
    /// standby of its own until it is given one.
    pub fn init_standby_of(&self, primary: &Instance) -> Result<()> {
        let (dir, source) = (self.data_dir.to_string_lossy(), primary.data_dir.to_string_lossy());
        let port = primary.port.to_string();
        let backup = ["-h", &source, "-p", &port, "-U", "postgres", "-D", &dir, "-X", "stream", "-c", "fast", "--no-sync", "-C", "-S", STANDBY_NAME];
        check(run_pg("pg_basebackup", &backup)?, &format!("copying {source} for its standby"))?;
        std::fs::write(self.data_dir.join("standby.signal"), "")?;
        let conf_path = self.data_dir.join("postgresql.conf");
        let mut conf = std::fs::read_to_string(&conf_path)?;
        conf.push_str(&format!(
            "\n# Written by tessera: a standby of {source}\nport = {}\nunix_socket_directories = '{dir}'\n\
             primary_conninfo = 'host=''{source}'' port={port} user=postgres application_name={STANDBY_NAME}'\n\
             primary_slot_name = '{STANDBY_NAME}'\nsynchronous_standby_names = ''\n",
            self.port
        ));
        std::fs::write(&conf_path, conf)?;
        // The primary's own setting may have come along.
        let auto_path = self.data_dir.join("postgresql.auto.conf");
        let auto = std::fs::read_to_string(&auto_path).unwrap_or_default();
        let kept: Vec<&str> = auto.lines().filter(|line| !line.trim_start().starts_with("synchronous_standby_names")).collect();
        std::fs::write(&auto_path, kept.join("\n") + "\n")?;
        prepare_dir(&self.data_dir)
    }

    pub fn start(&self) -> Result<()> {
        if self.is_running() {
            return Ok(());
        }
        let dir = self.data_dir.to_string_lossy();
        let log = self.data_dir.join("server.log");
        check(run_pg("pg_ctl", &["-D", &dir, "-l", &log.to_string_lossy(), "-w", "-t", "60", "start"])?, &format!("starting PostgreSQL in {dir}"))
            .with_context(|| format!("see {}", log.display()))?;
        Ok(())
    }

    /// Fast shutdown: open transactions are rolled back, clients disconnected.
    pub fn stop(&self) -> Result<()> {
        if !self.is_running() {
            return Ok(());
        }
        let dir = self.data_dir.to_string_lossy();
        check(run_pg("pg_ctl", &["-D", &dir, "-m", "fast", "-w", "-t", "60", "stop"])?, &format!("stopping PostgreSQL in {dir}"))?;
        Ok(())
    }

    /// Immediate shutdown, as after a crash (for fault tests).
    pub fn kill(&self) -> Result<()> {
        let dir = self.data_dir.to_string_lossy();
        run_pg("pg_ctl", &["-D", &dir, "-m", "immediate", "-w", "stop"])?;
        Ok(())
    }

    pub fn is_running(&self) -> bool {
        let dir = self.data_dir.to_string_lossy();
        run_pg("pg_ctl", &["-D", &dir, "status"]).map(|o| o.status.success()).unwrap_or(false)
    }
}

/// A TCP port on the loopback interface that nobody listens on right now,
/// below the kernel's ephemeral range: a server port from that range can be
/// handed to some outgoing connection while its server restarts, and the
/// server then cannot listen on it again.
pub fn free_port() -> Result<u16> {
    let first_ephemeral = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32768);
    const LOWEST: u16 = 10000;
    if first_ephemeral > LOWEST + 1000 {
        for _ in 0..200 {
            let port = rand::Rng::gen_range(&mut rand::thread_rng(), LOWEST..first_ephemeral);
            if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
                return Ok(port);
            }
        }
    }
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(listener.local_addr()?.port())
}
