//! The embedded cluster's standbys (`tessera up --standbys 1`): each worker
//! and the coordinator database get a second server, `<name>-standby`, a
//! synchronous streaming standby registered as their secondary
//! (`citus_add_secondary_node`), which the coordinator promotes when the
//! primary stops answering (`operations::failover`). Which of a worker's
//! two servers is its primary is the catalog's to say; of the coordinator
//! database's, the one on the newer timeline (a promotion starts one). After
//! a failover the old primary is not started again, and `--standbys 1`
//! makes it the new primary's standby, from a fresh base backup.

use super::instance::Instance;
use super::{admin_login, LocalCluster, COORDINATOR_DB, STATE_FILE};
use crate::config::{Config, ServerAddr, STANDBY_NAME};
use crate::connection::{quote_literal, PgConnection};
use anyhow::{bail, Context, Result};
use std::collections::HashMap;

/// A worker or the coordinator database with a standby: its two servers,
/// the first as created.
pub struct Pair {
    pub name: String,
    pub servers: [Instance; 2],
}

impl Pair {
    /// The server that is the primary now, if either is (`roles`: what the
    /// catalog says of each port).
    fn primary(&self, roles: &HashMap<u16, String>) -> Option<&Instance> {
        if self.name == COORDINATOR_DB {
            return Some(newest(&self.servers));
        }
        self.servers.iter().find(|s| roles.get(&s.port).map(String::as_str) == Some("primary"))
    }

    fn other(&self, primary: &Instance) -> &Instance {
        self.servers.iter().find(|s| s.port != primary.port).expect("two servers")
    }
}

impl LocalCluster {
    /// The coordinator database and the workers that have a second server.
    pub fn pairs(&self) -> Vec<Pair> {
        std::iter::once(self.configured_coordinator_db())
            .chain(self.workers())
            .filter_map(|first| {
                let name = first.data_dir.file_name()?.to_string_lossy().to_string();
                let port = *self.state.standby_ports.get(&name)?;
                let second = Instance::new(self.dir.join(format!("{name}-standby")), port);
                Some(Pair { name, servers: [first, second] })
            })
            .collect()
    }
}

/// Of the coordinator database's two servers, the primary: the one on the
/// newer timeline (a promoted standby starts a new one, its old primary
/// stays behind), or the one that is not a standby.
pub fn newest(servers: &[Instance; 2]) -> &Instance {
    let rank = |s: &Instance| (timeline(s), !s.data_dir.join("standby.signal").exists());
    if rank(&servers[1]) > rank(&servers[0]) {
        &servers[1]
    } else {
        &servers[0]
    }
}

/// The newest timeline a server has a history file of (1 without any).
fn timeline(server: &Instance) -> u32 {
    let Ok(files) = std::fs::read_dir(server.data_dir.join("pg_wal")) else { return 0 };
    files
        .flatten()
        .filter_map(|f| f.file_name().to_str()?.strip_suffix(".history").and_then(|hex| u32::from_str_radix(hex, 16).ok()))
        .max()
        .unwrap_or(1)
}

/// What the catalog says of each port: `primary` or `secondary`.
async fn catalog_roles(cluster: &LocalCluster) -> crate::error::PgResult<HashMap<u16, String>> {
    let rows = PgConnection::query_once(
        &LocalCluster::socket_addr(&cluster.coordinator_db()),
        &admin_login("tessera up"),
        "SELECT nodeport, noderole FROM pg_catalog.pg_dist_node WHERE nodename IN ('127.0.0.1', 'localhost')",
    )
    .await?;
    Ok(rows.into_iter().filter_map(|r| Some((r[0].as_deref()?.parse().ok()?, r[1].clone()?))).collect())
}

/// One line per server with a standby: which server is primary, which
/// standby, and how the standby follows (`tessera status`).
pub async fn describe(cluster: &LocalCluster) -> Vec<String> {
    let pairs = cluster.pairs();
    if pairs.is_empty() {
        return Vec::new();
    }
    let Ok(roles) = catalog_roles(cluster).await else { return vec!["standbys        unknown: the coordinator database does not answer".into()] };
    let mut lines = Vec::new();
    for pair in &pairs {
        let Some(primary) = pair.primary(&roles) else { continue };
        let other = pair.other(primary);
        let following = PgConnection::query_once(
            &LocalCluster::socket_addr(primary),
            &admin_login("tessera status"),
            &format!(
                "SELECT state, sync_state, pg_catalog.pg_wal_lsn_diff(pg_catalog.pg_current_wal_lsn(), replay_lsn) FROM pg_catalog.pg_stat_replication WHERE application_name = {}",
                quote_literal(STANDBY_NAME)
            ),
        )
        .await;
        let standby = match (roles.get(&other.port).map(String::as_str), following.ok().and_then(|rows| rows.into_iter().next())) {
            (Some("secondary"), Some(row)) => format!(
                "standby 127.0.0.1:{} {}, {}, {} bytes behind",
                other.port,
                row[0].as_deref().unwrap_or("?"),
                row[1].as_deref().unwrap_or("?"),
                row[2].as_deref().unwrap_or("?")
            ),
            (Some("secondary"), None) => format!("standby 127.0.0.1:{} not streaming", other.port),
            _ => format!("no standby: 127.0.0.1:{} failed over (tessera up --standbys 1 makes it one)", other.port),
        };
        lines.push(format!("{:<16} primary 127.0.0.1:{}, {standby}", pair.name, primary.port));
    }
    lines
}

/// Starts the standbys the catalog knows; a server it has dropped is a
/// primary that failed over, and stays down until `--standbys` makes it a
/// standby again. The primaries are started already.
pub fn start(cluster: &LocalCluster) -> Result<()> {
    let pairs = cluster.pairs();
    if pairs.is_empty() {
        return Ok(());
    }
    let roles = block_on(catalog_roles(cluster))?;
    for pair in &pairs {
        let Some(primary) = pair.primary(&roles) else { continue };
        primary.start()?;
        let other = pair.other(primary);
        if roles.get(&other.port).map(String::as_str) == Some("secondary") {
            other.start()?;
        } else if !other.is_running() {
            eprintln!(
                "note: {} (port {}) was {}'s primary before a failover; `tessera up --standbys 1` makes it a standby again",
                other.data_dir.display(),
                other.port,
                pair.name
            );
        }
    }
    Ok(())
}

/// Gives the coordinator database and every worker a running standby: a
/// new second server, or the one it has made again from its primary when
/// it is not a standby (a primary that failed over). Only one standby each
/// is supported.
pub fn ensure(cluster: &mut LocalCluster, standbys: usize) -> Result<()> {
    if standbys > 1 {
        bail!("only one standby per node is supported (--standbys 1)");
    }
    if standbys == 0 {
        return Ok(());
    }
    for first in std::iter::once(cluster.configured_coordinator_db()).chain(cluster.workers()) {
        let name = first.data_dir.file_name().context("a node's directory")?.to_string_lossy().to_string();
        if !cluster.state.standby_ports.contains_key(&name) {
            cluster.state.standby_ports.insert(name.clone(), super::instance::free_port()?);
            std::fs::write(cluster.dir.join(STATE_FILE), toml::to_string(&cluster.state)?)?;
        }
    }
    let roles = block_on(catalog_roles(cluster))?;
    for pair in cluster.pairs() {
        let Some(primary) = pair.primary(&roles) else {
            bail!("the catalog names neither server of {} as its primary", pair.name);
        };
        let other = pair.other(primary);
        if roles.get(&other.port).map(String::as_str) == Some("secondary") && other.data_dir.join("standby.signal").exists() {
            other.start()?;
            continue;
        }
        make_standby(cluster, &pair.name, primary, other)?;
    }
    Ok(())
}

/// Makes `standby` (stopped and emptied first) a synchronous standby of
/// `primary` and registers it as its secondary.
fn make_standby(cluster: &LocalCluster, name: &str, primary: &Instance, standby: &Instance) -> Result<()> {
    eprintln!("making {} a standby of {name} ({} -> port {})", standby.data_dir.display(), primary.port, standby.port);
    standby.kill()?;
    if standby.data_dir.exists() {
        std::fs::remove_dir_all(&standby.data_dir)?;
    }
    let at_primary = LocalCluster::socket_addr(primary);
    let login = admin_login("tessera up");
    block_on(PgConnection::query_once(
        &at_primary,
        &login,
        &format!(
            "SELECT pg_catalog.pg_drop_replication_slot(slot_name) FROM pg_catalog.pg_replication_slots WHERE slot_name = {}",
            quote_literal(STANDBY_NAME)
        ),
    ))?;
    standby.init_standby_of(primary)?;
    standby.start()?;
    // Commits on the primary wait for the standby from now on.
    block_on(PgConnection::query_once(
        &at_primary,
        &login,
        &format!("ALTER SYSTEM SET synchronous_standby_names = {}", quote_literal(STANDBY_NAME)),
    ))?;
    block_on(PgConnection::query_once(&at_primary, &login, "SELECT pg_catalog.pg_reload_conf()"))?;
    let coordinator = ServerAddr { host: "127.0.0.1".into(), port: cluster.state.coordinator_port };
    block_on(PgConnection::query_once(
        &coordinator,
        &login,
        &format!("SELECT citus_add_secondary_node('127.0.0.1', {}, '127.0.0.1', {})", standby.port, primary.port),
    ))?;
    // The coordinator reaches it over its socket once it restarts.
    let mut config = Config::load(&cluster.config_path())?;
    let dir = standby.data_dir.display().to_string();
    if !config.node_socket_directories.contains(&dir) {
        config.node_socket_directories.push(dir);
        std::fs::write(cluster.config_path(), toml::to_string(&config)?)?;
    }
    Ok(())
}

fn block_on<T>(work: impl std::future::Future<Output = crate::error::PgResult<T>>) -> Result<T> {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    runtime.block_on(work).map_err(|e| anyhow::anyhow!("{e}"))
}
