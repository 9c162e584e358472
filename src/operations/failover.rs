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
struct Pair {
    node_id: i32,
    group_id: i32,
    primary: ServerAddr,
    standby_id: i32,
    standby: ServerAddr,
}

/// Advisory lock class of failovers (the key's second half is the node group).
const FAILOVER_LOCK: i32 = 7482912;

/// The workers with a standby: each primary with its first secondary.
async fn pairs(catalog: &mut PgConnection) -> PgResult<Vec<Pair>> {
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

/// What the coordinator last knew of a primary with a standby.
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

impl Watched {
    fn new(primary: ServerAddr) -> Watched {
        Watched { primary, answered: Instant::now(), in_sync: false, standby_missing: None }
    }

    /// Starts over when the primary is another server now (a failover).
    fn follow(&mut self, primary: &ServerAddr) {
        if self.primary != *primary {
            *self = Watched::new(primary.clone());
        }
    }

    /// Takes what the primary said of its standby.
    fn answered(&mut self, health: &Health) {
        self.answered = Instant::now();
        self.in_sync = health.standby.as_deref() == Some("sync");
    }
}

/// What a primary says of its standby.
#[derive(Default)]
struct Health {
    /// `pg_stat_replication.sync_state` of the standby, if it is connected.
    standby: Option<String>,
    /// Whether commits wait for the standby (`synchronous_standby_names`).
    waits: bool,
}

/// What one round reads from the coordinator database.
struct Survey {
    pairs: Vec<Pair>,
    fenced: Vec<ServerAddr>,
    /// The coordinator database's own standby, and what it says of it.
    standby: Option<ServerAddr>,
    health: Health,
}

/// Watches the primaries that have a standby — the workers' and the
/// coordinator database — for as long as the process runs: fails over
/// those that stop answering, lets a primary whose standby is gone commit
/// without it until it is back (else every commit there would wait for it),
/// and stops fenced former primaries found answering again.
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
    let mut database = Watched::new(coordinator.config.coordinator_db_addr());
    let mut database_standby: Option<ServerAddr> = None;
    loop {
        tokio::time::sleep(interval).await;
        let coordinator_db = coordinator.config.coordinator_db_addr();
        database.follow(&coordinator_db);
        let survey = match catalog.on(&coordinator_db, |conn| Box::pin(survey(conn))).await {
            Ok(survey) => survey,
            Err(e) => {
                let silent = database.answered.elapsed();
                match &database_standby {
                    Some(standby) if silent >= timeout && database.in_sync => {
                        if let Err(e) = move_coordinator_db(&coordinator, standby, silent).await {
                            tracing::warn!("failover of the coordinator database ({coordinator_db} -> {standby}) failed, trying again: {e}");
                        }
                    }
                    Some(standby) if silent >= timeout => tracing::error!(
                        "the coordinator database at {coordinator_db} does not answer ({e}), but its standby {standby} was not in sync when it last did: not failing over"
                    ),
                    _ => tracing::debug!("failover: the coordinator database does not answer: {e}"),
                }
                continue;
            }
        };
        database.answered(&survey.health);
        database_standby = survey.standby.clone();
        if let Some(standby) = &survey.standby {
            keep_commits_going(&mut primaries, standby, "the coordinator database", &survey.health, &mut database, timeout).await;
            // Another coordinator promoted it: this one follows.
            if answers_as_primary(&mut primaries, standby).await {
                let _ = move_coordinator_db(&coordinator, standby, Duration::ZERO).await;
                continue;
            }
        }
        watched.retain(|id, _| survey.pairs.iter().any(|p| p.node_id == *id));
        for pair in &survey.pairs {
            let seen = watched.entry(pair.node_id).or_insert_with(|| Watched::new(pair.primary.clone()));
            seen.follow(&pair.primary);
            let what = format!("node {}", pair.node_id);
            match health(&mut primaries, &pair.primary).await {
                Ok(health) => {
                    seen.answered(&health);
                    keep_commits_going(&mut primaries, &pair.standby, &what, &health, seen, timeout).await;
                }
                Err(_) if seen.answered.elapsed() < timeout => {}
                Err(e) if !seen.in_sync => tracing::error!(
                    "{what} at {} does not answer ({e}), but its standby {} was not in sync when it last did: not failing over, since commits would be lost; fail over by hand with citus_update_node if that is acceptable",
                    pair.primary,
                    pair.standby
                ),
                Err(_) => match fail_over(&coordinator, pair, seen.answered.elapsed()).await {
                    Ok(true) => {
                        watched.remove(&pair.node_id);
                        // The node's catalog row changed: every coordinator
                        // reloads (the trigger's NOTIFY); this one at once.
                        let _ = coordinator.reload_after_commit().await;
                    }
                    Ok(false) => {}
                    Err(e) => tracing::warn!("failover of {what} ({} -> {}) failed, trying again: {e}", pair.primary, pair.standby),
                },
            }
        }
        for addr in &survey.fenced {
            stop_if_primary(&mut primaries, addr).await;
        }
        primaries.end_round().await;
    }
}

/// One round's look at the catalog: the workers with a standby, the fenced
/// servers, and the coordinator database's standby with its state.
async fn survey(conn: &mut PgConnection) -> PgResult<Survey> {
    let pairs = pairs(conn).await?;
    let fenced = fenced(conn).await?;
    let rows = conn
        .query(&format!(
            "SELECT s.nodename, s.nodeport, {}
               FROM (SELECT 1) AS one LEFT JOIN (SELECT nodename, nodeport FROM tessera.pg_dist_node WHERE groupid = 0 AND noderole = 'secondary' ORDER BY nodeid LIMIT 1) AS s ON true",
            health_columns()
        ))
        .await?;
    let row = rows.into_iter().next().unwrap_or_default();
    let standby = match (row.first().cloned().flatten(), row.get(1).cloned().flatten().and_then(|p| p.parse().ok())) {
        (Some(host), Some(port)) => Some(ServerAddr { host, port }),
        _ => None,
    };
    Ok(Survey { pairs, fenced, standby, health: health_of(&row[2.min(row.len())..]) })
}

/// What a primary says of its standby, as columns: its `sync_state` and
/// whether commits wait for it.
fn health_columns() -> String {
    format!(
        "(SELECT max(sync_state) FROM pg_catalog.pg_stat_replication WHERE application_name = {}),
         pg_catalog.current_setting('synchronous_standby_names') <> ''",
        quote_literal(STANDBY_NAME)
    )
}

fn health_of(columns: &[Option<String>]) -> Health {
    Health { standby: columns.first().cloned().flatten(), waits: columns.get(1).cloned().flatten().as_deref() == Some("t") }
}

/// Asks the primary at `addr` about its standby.
async fn health(nodes: &mut KeptConnections, addr: &ServerAddr) -> PgResult<Health> {
    let sql = format!("SELECT {}", health_columns());
    let rows = nodes.on(addr, |conn| Box::pin(async move { conn.query(&sql).await })).await?;
    Ok(health_of(&rows.into_iter().next().unwrap_or_default()))
}

/// Stops a primary (`seen`) waiting for a standby that has been gone for
/// `timeout` (its commits would wait forever), and makes it wait again once
/// the standby streams. Failing over is refused meanwhile (`in_sync`).
async fn keep_commits_going(nodes: &mut KeptConnections, standby: &ServerAddr, what: &str, health: &Health, seen: &mut Watched, timeout: Duration) {
    let setting = match (health.waits, health.standby.is_some()) {
        (true, false) => {
            let since = *seen.standby_missing.get_or_insert_with(Instant::now);
            if since.elapsed() < timeout {
                return;
            }
            tracing::warn!(
                "the standby {standby} of {what} has been gone for {:.1} s: its primary {} commits without waiting for it until it is back (no failover meanwhile)",
                since.elapsed().as_secs_f64(),
                seen.primary
            );
            "''".to_string()
        }
        (false, true) => {
            tracing::info!("the standby {standby} of {what} streams again: its primary {} waits for it again", seen.primary);
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
        .on(&seen.primary, |conn| {
            Box::pin(async move {
                conn.execute(&sql).await?;
                conn.execute("SELECT pg_catalog.pg_reload_conf()").await
            })
        })
        .await;
    if let Err(e) = changed {
        tracing::warn!("could not change synchronous replication on {}: {e}", seen.primary);
    }
}

/// Whether the server at `addr` answers and is a primary.
async fn answers_as_primary(nodes: &mut KeptConnections, addr: &ServerAddr) -> bool {
    let primary = nodes.on(addr, |conn| Box::pin(async move { conn.query_value("SELECT NOT pg_catalog.pg_is_in_recovery()").await })).await;
    primary.is_ok_and(|p| p.as_deref() == Some("t"))
}

/// Makes the coordinator database's standby at `standby` the coordinator
/// database of this process: promoted (unless another coordinator did
/// that), the old one fenced and its standby row gone, the catalog read
/// again from there. Every coordinator that knew the standby moves on its
/// own: the silent primary, or the standby found promoted, tells it to.
async fn move_coordinator_db(coordinator: &Coordinator, standby: &ServerAddr, silent: Duration) -> PgResult<()> {
    let old = coordinator.config.coordinator_db_addr();
    let login = coordinator.config.service_login();
    promote(standby, &login).await?;
    crate::config::move_coordinator_db(standby.clone());
    tracing::warn!(
        "the coordinator database did not answer at {old} for {:.1} s: its standby {standby} is the coordinator database now",
        silent.as_secs_f64()
    );
    let mut catalog = PgConnection::connect(standby, &login).await?;
    let recorded = catalog
        .execute(&format!(
            "BEGIN; DELETE FROM tessera.pg_dist_node WHERE groupid = 0 AND noderole = 'secondary' AND nodename = {host} AND nodeport = {port};
             INSERT INTO tessera.fenced_nodes (nodename, nodeport) VALUES ({old_host}, {old_port}) ON CONFLICT DO NOTHING; COMMIT",
            host = quote_literal(&standby.host),
            port = standby.port,
            old_host = quote_literal(&old.host),
            old_port = old.port
        ))
        .await;
    catalog.terminate().await;
    recorded?;
    let _ = coordinator.reload_after_commit().await;
    Ok(())
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
    if !answers_as_primary(nodes, addr).await {
        return;
    }
    // A fast shutdown (SIGINT to the postmaster), not waited for: it ends
    // this very connection.
    const STOP: &str = "DO $tessera$ BEGIN
         EXECUTE pg_catalog.format('COPY (SELECT) TO PROGRAM %L',
           'kill -INT ' || pg_catalog.split_part(pg_catalog.pg_read_file('postmaster.pid'), E'\\n', 1)::int);
       END $tessera$";
    tracing::warn!("{addr} answers as a primary after its node failed over to its standby: stopping it");
    // The shutdown may end the connection before the statement returns;
    // the next round finds the server gone, or tries again.
    if let Err(e) = nodes.on(addr, |conn| Box::pin(async move { conn.execute(STOP).await })).await {
        tracing::debug!("stopping {addr}: {e}");
    }
}

/// Promotes `pair`'s standby and points the node at it, unless another
/// coordinator did so first; true when this call did.
async fn fail_over(coordinator: &Coordinator, pair: &Pair, silent: Duration) -> PgResult<bool> {
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
    promote(&pair.standby, login).await.map_err(|e| e.map_message(|m| format!("{m} (node {})", pair.node_id)))?;
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

/// Promotes the standby at `addr` (unless it is a primary already, promoted
/// by an attempt that failed later or by another coordinator) and lets it
/// commit without a standby of its own.
async fn promote(addr: &ServerAddr, login: &crate::config::Login) -> PgResult<()> {
    let on_standby = |e: PgError| e.map_message(|m| format!("{m} (promoting the standby {addr})"));
    let mut standby = PgConnection::connect(addr, login).await.map_err(on_standby)?;
    let promoted = async {
        if standby.query_value("SELECT pg_catalog.pg_is_in_recovery()").await?.as_deref() == Some("t") {
            let done = standby.query_value("SELECT pg_catalog.pg_promote(true, 60)").await?;
            if done.as_deref() != Some("t") {
                return Err(PgError::internal("the standby did not finish its promotion within 60 s"));
            }
        }
        standby.execute("ALTER SYSTEM RESET synchronous_standby_names").await?;
        standby.execute("SELECT pg_catalog.pg_reload_conf()").await?;
        Ok(())
    }
    .await
    .map_err(on_standby);
    standby.terminate().await;
    promoted
}
