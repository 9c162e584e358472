//! The embedded cluster's standbys (`tessera up --standbys 1`): each worker
//! gets a second server, `<worker>-standby`, a synchronous streaming standby
//! registered as the worker's secondary, which the coordinator promotes when
//! the primary stops answering (`operations::failover`). Which of a worker's
//! two servers is its primary is the catalog's to say: after a failover the
//! old primary is not started again, and `--standbys 1` makes it the new
//! primary's standby, from a fresh base backup.

use super::instance::Instance;
use super::{admin_login, LocalCluster, STATE_FILE};
use crate::config::{Config, ServerAddr, STANDBY_NAME};
use crate::connection::{quote_literal, PgConnection};
use anyhow::{bail, Context, Result};
use std::collections::HashMap;

/// A worker with a standby: its two servers, the first as created.
pub struct Pair {
    pub name: String,
    pub servers: [Instance; 2],
}

impl LocalCluster {
    /// The workers that have a second server.
    pub fn pairs(&self) -> Vec<Pair> {
        self.workers()
            .into_iter()
            .filter_map(|worker| {
                let name = worker.data_dir.file_name()?.to_string_lossy().to_string();
                let port = *self.state.standby_ports.get(&name)?;
                let standby = Instance::new(self.dir.join(format!("{name}-standby")), port);
                Some(Pair { name, servers: [worker, standby] })
            })
            .collect()
    }
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

/// One line per worker with a standby: which server is primary, which
/// standby, and how the standby follows (`tessera status`).
pub async fn describe(cluster: &LocalCluster) -> Vec<String> {
    let pairs = cluster.pairs();
    if pairs.is_empty() {
        return Vec::new();
    }
    let Ok(roles) = catalog_roles(cluster).await else { return vec!["standbys        unknown: the coordinator database does not answer".into()] };
    let mut lines = Vec::new();
    for pair in &pairs {
        let role = |server: &Instance| roles.get(&server.port).map(String::as_str);
        let Some(primary) = pair.servers.iter().find(|s| role(s) == Some("primary")) else { continue };
        let other = pair.servers.iter().find(|s| s.port != primary.port).expect("two servers");
        let following = PgConnection::query_once(
            &LocalCluster::socket_addr(primary),
            &admin_login("tessera status"),
            &format!(
                "SELECT state, sync_state, pg_catalog.pg_wal_lsn_diff(pg_catalog.pg_current_wal_lsn(), replay_lsn) FROM pg_catalog.pg_stat_replication WHERE application_name = {}",
                quote_literal(STANDBY_NAME)
            ),
        )
        .await;
        let standby = match (role(other), following.ok().and_then(|rows| rows.into_iter().next())) {
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

/// Starts each pair's servers that the catalog knows (a primary, and a
/// standby); a server it has dropped is a primary that failed over, and
/// stays down until `--standbys` makes it a standby again.
pub fn start(cluster: &LocalCluster) -> Result<()> {
    let pairs = cluster.pairs();
    if pairs.is_empty() {
        return Ok(());
    }
    let roles = block_on(catalog_roles(cluster))?;
    for pair in &pairs {
        for server in &pair.servers {
            if roles.contains_key(&server.port) || !roles.values().any(|r| r == "primary") {
                server.start()?;
            } else if !server.is_running() {
                eprintln!(
                    "note: {} (port {}) was {}'s primary before a failover; `tessera up --standbys 1` makes it a standby again",
                    server.data_dir.display(),
                    server.port,
                    pair.name
                );
            }
        }
    }
    Ok(())
}

/// Gives every worker a running standby: a new second server, or the one it
/// has made again from its primary when it is not a standby (a primary that
/// failed over). Only one standby per worker is supported.
pub fn ensure(cluster: &mut LocalCluster, standbys: usize) -> Result<()> {
    if standbys > 1 {
        bail!("only one standby per worker is supported (--standbys 1)");
    }
    if standbys == 0 {
        return Ok(());
    }
    for worker in cluster.workers() {
        let name = worker.data_dir.file_name().context("a worker's directory")?.to_string_lossy().to_string();
        if !cluster.state.standby_ports.contains_key(&name) {
            cluster.state.standby_ports.insert(name.clone(), super::instance::free_port()?);
            std::fs::write(cluster.dir.join(STATE_FILE), toml::to_string(&cluster.state)?)?;
        }
    }
    let roles = block_on(catalog_roles(cluster))?;
    for pair in cluster.pairs() {
        let Some(primary) = pair.servers.iter().find(|s| roles.get(&s.port).map(String::as_str) == Some("primary")) else {
            bail!("the catalog names neither server of {} as its primary", pair.name);
        };
        let other = pair.servers.iter().find(|s| s.port != primary.port).expect("two servers");
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
