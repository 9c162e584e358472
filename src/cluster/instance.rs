//! One local PostgreSQL server that Tessera created: initdb, configuration, start
//! and stop. Used by `tessera up` for the embedded cluster and by the test harness.
//! PostgreSQL refuses to run as root, so as root every server command runs as the
//! `postgres` OS user and the data directories belong to it.

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

fn postgres_uid() -> Result<u32> {
    let out = check(Command::new("id").args(["-u", "postgres"]).output()?, "id -u postgres")?;
    String::from_utf8_lossy(&out.stdout).trim().parse().context("unexpected output of id -u postgres")
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
