//! Automatic failover of the workers that have a standby, a streaming
//! replica registered as their secondary (`citus_add_secondary_node`,
//! `tessera up --standbys 1`). The coordinator asks each such worker's
//! primary a trivial question every `[failover] health_check_interval_secs`;
//! once the primary has not answered for `failure_timeout_secs`, it
//! promotes the standby and points the node at it, as `citus_update_node`
//! would: same node id, group and shards.
//!
//! Nothing acknowledged is lost: the primaries replicate synchronously, so a
//! commit (and a PREPARE TRANSACTION) was on the standby before its client
//! heard of it. The old primary is fenced: with its standby gone no commit
//! of its can ever be acknowledged, the catalog no longer leads to it, and
//! a coordinator that finds it answering again as a primary (it was cut
//! off, not dead) stops it (`tessera.fenced_nodes`); `tessera up` does not
//! start it again, and `--standbys 1` makes it the new primary's standby. The transactions in doubt on it were replicated too,
//! and the next recovery round settles them on the promoted standby.
//! Coordinators sharing one catalog take turns through an advisory lock in
//! the coordinator database, and only one finds the node still pointing at
//! the failed server. Only a standby that was replicating synchronously when
//! the primary last answered is promoted; a primary whose standby is gone
//! commits without it until it is back, rather than not at all.

use crate::config::{ServerAddr, STANDBY_NAME};
use crate::connection::kept::KeptConnections;
use crate::connection::{quote_literal, PgConnection};
use crate::error::{PgError, PgResult};
use crate::process::Coordinator;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A worker with a standby, as the catalog has it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pair {
    pub node_id: i32,
    pub group_id: i32,
    pub primary: ServerAddr,
    pub standby_id: i32,
    pub standby: ServerAddr,
}

/// Advisory lock class of failovers (the key's second half is the node group).
const FAILOVER_LOCK: i32 = 7482912;

/// The workers with a standby: each primary with its first secondary.
pub async fn pairs(catalog: &mut PgConnection) -> PgResult<Vec<Pair>> {
    let rows = catalog
        .query(
            "SELECT DISTINCT ON (p.nodeid) p.nodeid, p.groupid, p.nodename, p.nodeport, s.nodeid, s.nodename, s.nodeport
               FROM tessera.pg_dist_node p JOIN tessera.pg_dist_node s ON s.groupid = p.groupid AND s.noderole = 'secondary'
              WHERE p.noderole = 'primary' AND p.isactive ORDER BY p.nodeid, s.nodeid",
        )
        .await?;
    let int = |v: &Option<String>| v.as_deref().unwrap_or("0").parse::<i32>().unwrap_or(0);
    let addr = |host: &Option<String>, port: &Option<String>| ServerAddr { host: host.clone().unwrap_or_default(), port: int(port) as u16 };
    Ok(rows
        .iter()
        .map(|r| Pair { node_id: int(&r[0]), group_id: int(&r[1]), primary: addr(&r[2], &r[3]), standby_id: int(&r[4]), standby: addr(&r[5], &r[6]) })
        .collect())
}

/// What the coordinator last knew of a worker with a standby.
struct Watched {
    primary: ServerAddr,
    /// When the primary last answered.
    answered: Instant,
    /// Whether its standby was replicating synchronously then: only such a
    /// standby has every acknowledged commit.
    in_sync: bool,
    /// Since when the primary has waited for a standby that is not there.
    standby_missing: Option<Instant>,
}

/// What a primary says of its standby.
struct Health {
    /// `pg_stat_replication.sync_state` of the standby, if it is connected.
    standby: Option<String>,
    /// Whether commits wait for the standby (`synchronous_standby_names`).
    waits: bool,
}

/// Watches the primaries of workers with a standby for as long as the
/// process runs: fails over those that stop answering, and lets a primary
/// whose standby is gone commit without it until it is back (else every
/// commit there would wait for it).
pub async fn watch(coordinator: Arc<Coordinator>) {
    let settings = &coordinator.config.failover;
    let interval = Duration::from_secs_f64(settings.health_check_interval_secs.max(0.05));
    let timeout = Duration::from_secs_f64(settings.failure_timeout_secs.max(0.1));
    let login = coordinator.config.service_login();
    // A check waits at most one interval (at least a second) for its answer.
    let patience = interval.max(Duration::from_secs(1));
    let mut catalog = KeptConnections::new(login.clone(), "tessera failover", patience);
    let mut primaries = KeptConnections::new(login, "tessera health check", patience);
    let mut watched: HashMap<i32, Watched> = HashMap::new();
    let coordinator_db = coordinator.config.coordinator_db_addr();
    loop {
        tokio::time::sleep(interval).await;
        let pairs = match catalog.on(&coordinator_db, |conn| Box::pin(pairs(conn))).await {
            Ok(pairs) => pairs,
            Err(e) => {
                tracing::debug!("failover: the catalog's standbys are unknown: {e}");
                continue;
            }
        };
        watched.retain(|id, _| pairs.iter().any(|p| p.node_id == *id));
        for pair in &pairs {
            let now = Instant::now();
            let seen = watched.entry(pair.node_id).or_insert_with(|| Watched {
                primary: pair.primary.clone(),
                answered: now,
                in_sync: false,
                standby_missing: None,
            });
            if seen.primary != pair.primary {
                *seen = Watched { primary: pair.primary.clone(), answered: now, in_sync: false, standby_missing: None };
            }
            match health(&mut primaries, &pair.primary).await {
                Ok(health) => {
                    seen.answered = now;
                    seen.in_sync = health.standby.as_deref() == Some("sync");
                    keep_commits_going(&mut primaries, pair, &health, seen, timeout).await;
                }
                Err(_) if now.duration_since(seen.answered) < timeout => {}
                Err(e) if !seen.in_sync => tracing::error!(
                    "node {} at {} does not answer ({e}), but its standby {} was not in sync when it last did: not failing over, since commits would be lost; fail over by hand with citus_update_node if that is acceptable",
                    pair.node_id,
                    pair.primary,
                    pair.standby
                ),
                Err(_) => match fail_over(&coordinator, pair, now.duration_since(seen.answered)).await {
                    Ok(true) => {
                        watched.remove(&pair.node_id);
                        // The node's catalog row changed: every coordinator
                        // reloads (the trigger's NOTIFY); this one at once.
                        let _ = coordinator.reload_after_commit().await;
                    }
                    Ok(false) => {}
                    Err(e) => tracing::warn!("failover of node {} ({} -> {}) failed, trying again: {e}", pair.node_id, pair.primary, pair.standby),
                },
            }
        }
        match catalog.on(&coordinator_db, |conn| Box::pin(fenced(conn))).await {
            Ok(fenced) => {
                for addr in fenced {
                    stop_if_primary(&mut primaries, &addr).await;
                }
            }
            Err(e) => tracing::debug!("failover: the fenced servers are unknown: {e}"),
        }
        primaries.end_round().await;
    }
}

/// The former primaries that failovers left behind.
async fn fenced(catalog: &mut PgConnection) -> PgResult<Vec<ServerAddr>> {
    let rows = catalog.query("SELECT nodename, nodeport FROM tessera.fenced_nodes").await?;
    Ok(rows.into_iter().filter_map(|r| Some(ServerAddr { host: r[0].clone()?, port: r[1].as_deref()?.parse().ok()? })).collect())
}

/// Stops the server at `addr` if it answers as a primary: a former primary
/// cut off while its standby was promoted, back on the network. It could
/// take no acknowledged commit (its standby is gone), but it must not take
/// any write at all, nor look like the node to anyone reaching it directly.
async fn stop_if_primary(nodes: &mut KeptConnections, addr: &ServerAddr) {
    let Ok(primary) = nodes.on(addr, |conn| Box::pin(async move { conn.query_value("SELECT NOT pg_catalog.pg_is_in_recovery()").await })).await
    else {
        return;
    };
    if primary.as_deref() != Some("t") {
        return;
    }
    // A fast shutdown, not waited for: it ends this very connection.
    const STOP: &str = "DO $tessera$ BEGIN
         EXECUTE pg_catalog.format('COPY (SELECT) TO PROGRAM %L', pg_catalog.format('%s -D %s -m fast -W stop',
           tessera_remote.shell_word((SELECT setting FROM pg_catalog.pg_config WHERE name = 'BINDIR') || '/pg_ctl'),
           tessera_remote.shell_word(pg_catalog.current_setting('data_directory'))));
       END $tessera$";
    tracing::warn!("{addr} answers as a primary after its node failed over to its standby: stopping it");
    // The shutdown may end the connection before the statement returns;
    // the next round finds the server gone, or tries again.
    if let Err(e) = nodes.on(addr, |conn| Box::pin(async move { conn.execute(STOP).await })).await {
        tracing::debug!("stopping {addr}: {e}");
    }
}

/// Asks the primary at `addr` about its standby.
async fn health(nodes: &mut KeptConnections, addr: &ServerAddr) -> PgResult<Health> {
    let sql = format!(
        "SELECT (SELECT max(sync_state) FROM pg_catalog.pg_stat_replication WHERE application_name = {}), pg_catalog.current_setting('synchronous_standby_names') <> ''",
        quote_literal(STANDBY_NAME)
    );
    let rows = nodes.on(addr, |conn| Box::pin(async move { conn.query(&sql).await })).await?;
    let row = rows.into_iter().next().unwrap_or_default();
    Ok(Health { standby: row.first().cloned().flatten(), waits: row.get(1).cloned().flatten().as_deref() == Some("t") })
}

/// Stops a primary waiting for a standby that has been gone for `timeout`
/// (its commits would wait forever), and makes it wait again once the
/// standby streams. Failing over is refused meanwhile (`in_sync`).
async fn keep_commits_going(nodes: &mut KeptConnections, pair: &Pair, health: &Health, seen: &mut Watched, timeout: Duration) {
    let setting = match (health.waits, health.standby.is_some()) {
        (true, false) => {
            let since = *seen.standby_missing.get_or_insert_with(Instant::now);
            if since.elapsed() < timeout {
                return;
            }
            tracing::warn!(
                "the standby {} of node {} has been gone for {:.1} s: its primary {} commits without waiting for it until it is back (no failover meanwhile)",
                pair.standby,
                pair.node_id,
                since.elapsed().as_secs_f64(),
                pair.primary
            );
            "''".to_string()
        }
        (false, true) => {
            tracing::info!("the standby {} of node {} streams again: its primary {} waits for it again", pair.standby, pair.node_id, pair.primary);
            quote_literal(STANDBY_NAME)
        }
        _ => {
            seen.standby_missing = None;
            return;
        }
    };
    seen.standby_missing = None;
    let sql = format!("ALTER SYSTEM SET synchronous_standby_names = {setting}");
    let changed = nodes
        .on(&pair.primary, |conn| {
            Box::pin(async move {
                conn.execute(&sql).await?;
                conn.execute("SELECT pg_catalog.pg_reload_conf()").await
            })
        })
        .await;
    if let Err(e) = changed {
        tracing::warn!("could not change synchronous replication on {}: {e}", pair.primary);
    }
}

/// Promotes `pair`'s standby and points the node at it, unless another
/// coordinator did so first; true when this call did.
pub async fn fail_over(coordinator: &Coordinator, pair: &Pair, silent: Duration) -> PgResult<bool> {
    let login = coordinator.config.service_login();
    let mut catalog = PgConnection::connect(&coordinator.config.coordinator_db_addr(), &login).await?;
    catalog.execute(&format!("SELECT pg_catalog.pg_advisory_lock({FAILOVER_LOCK}, {})", pair.group_id)).await?;
    let outcome = promote_and_repoint(&mut catalog, &login, pair).await;
    let _ = catalog.execute(&format!("SELECT pg_catalog.pg_advisory_unlock({FAILOVER_LOCK}, {})", pair.group_id)).await;
    catalog.terminate().await;
    if outcome.as_ref().is_ok_and(|done| *done) {
        tracing::warn!(
            "node {} (group {}) did not answer at {} for {:.1} s: promoted its standby {} and pointed the node at it",
            pair.node_id,
            pair.group_id,
            pair.primary,
            silent.as_secs_f64(),
            pair.standby
        );
    }
    outcome
}

async fn promote_and_repoint(catalog: &mut PgConnection, login: &crate::config::Login, pair: &Pair) -> PgResult<bool> {
    let still = catalog
        .query_value(&format!(
            "SELECT count(*) FROM tessera.pg_dist_node p JOIN tessera.pg_dist_node s ON s.groupid = p.groupid
              WHERE p.nodeid = {} AND p.nodename = {} AND p.nodeport = {} AND s.nodeid = {} AND s.noderole = 'secondary'",
            pair.node_id,
            quote_literal(&pair.primary.host),
            pair.primary.port,
            pair.standby_id
        ))
        .await?;
    if still.as_deref() != Some("1") {
        return Ok(false);
    }
    let on_standby = |e: PgError| e.map_message(|m| format!("{m} (promoting the standby {} of node {})", pair.standby, pair.node_id));
    let mut standby = PgConnection::connect(&pair.standby, login).await.map_err(on_standby)?;
    let promoted = async {
        // A standby promoted by an attempt that failed later is a primary already.
        if standby.query_value("SELECT pg_catalog.pg_is_in_recovery()").await?.as_deref() == Some("t") {
            let done = standby.query_value("SELECT pg_catalog.pg_promote(true, 60)").await?;
            if done.as_deref() != Some("t") {
                return Err(PgError::internal("the standby did not finish its promotion within 60 s"));
            }
        }
        // It has no standby of its own to wait for.
        standby.execute("ALTER SYSTEM RESET synchronous_standby_names").await?;
        standby.execute("SELECT pg_catalog.pg_reload_conf()").await?;
        Ok(())
    }
    .await
    .map_err(on_standby);
    standby.terminate().await;
    promoted?;
    catalog
        .execute(&format!(
            "BEGIN; DELETE FROM tessera.pg_dist_node WHERE nodeid = {standby_id};
             UPDATE tessera.pg_dist_node SET nodename = {host}, nodeport = {port} WHERE nodeid = {node_id};
             INSERT INTO tessera.fenced_nodes (nodename, nodeport) VALUES ({old_host}, {old_port}) ON CONFLICT DO NOTHING; COMMIT",
            standby_id = pair.standby_id,
            host = quote_literal(&pair.standby.host),
            port = pair.standby.port,
            node_id = pair.node_id,
            old_host = quote_literal(&pair.primary.host),
            old_port = pair.primary.port,
        ))
        .await?;
    Ok(true)
}
