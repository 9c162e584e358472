//! Settles prepared transactions that two-phase commit left behind (a crashed
//! coordinator or loader, a worker restarted before COMMIT PREPARED). Every
//! part is decided by another node's transaction (`decided`: last-agent
//! commits of blocks, loads and worker transactions' links), the coordinator
//! database's or a worker's: it is committed once that transaction's commit
//! record is there, rolled back once the transaction ended without one, and
//! left alone while it runs, however long. Commit records are deleted once
//! no prepared part names them.

use super::decided::{self, DecidingTransaction};
use crate::config::Config;
use crate::config::ServerAddr;
use crate::connection::kept::KeptConnections;
use crate::connection::{quote_literal, PgConnection};
use crate::error::PgResult;
use crate::metadata::{Catalog, Node};
use std::collections::{HashMap, HashSet};

/// One pass over every active worker, over the connections `nodes` keeps
/// (one per node); returns how many prepared transactions it committed or
/// rolled back.
pub async fn recover(config: &Config, catalog: &Catalog, nodes: &mut KeptConnections) -> PgResult<u64> {
    let deciders = deciding_nodes(config, catalog);
    let mut settled = 0;
    let mut first_error = None;
    // Read before any prepared part is listed: a record read then whose
    // transaction has parts left shows them in the lists.
    let mut records = commit_records(nodes, &deciders, catalog).await;
    let mut named = HashSet::new();
    for node in catalog.active_nodes() {
        match recover_decided_parts(nodes, &deciders, node, &mut named).await {
            Ok(n) => settled += n,
            Err(e) => {
                // Its parts are unknown, so every record stays.
                records.clear();
                tracing::warn!("prepared-transaction recovery on {}: {e}", node.addr);
                first_error.get_or_insert(e);
            }
        }
    }
    // A node out of service may still hold parts: their records stay until
    // its list can be read.
    for node in catalog.nodes.iter().filter(|n| !n.active) {
        match nodes.on(&node.addr, |conn| Box::pin(decided_parts(conn))).await {
            Ok(parts) => named.extend(parts.into_iter().map(|(_, group, decider)| (group, decider.xid))),
            Err(_) => records.clear(),
        }
    }
    forget_commit_records(nodes, &deciders, records, &named).await;
    nodes.end_round().await;
    match first_error {
        Some(e) if settled == 0 => Err(e),
        _ => Ok(settled),
    }
}

/// Where each node group that may decide parts is: the coordinator
/// database (`decided::COORDINATOR_GROUP`) and every node of the catalog.
fn deciding_nodes(config: &Config, catalog: &Catalog) -> HashMap<i32, ServerAddr> {
    let mut deciders: HashMap<i32, ServerAddr> = catalog.nodes.iter().map(|n| (n.group_id, n.addr.clone())).collect();
    deciders.insert(decided::COORDINATOR_GROUP, config.coordinator_db_addr());
    deciders
}

/// The commit records of deciding transactions on the coordinator database
/// and every active node that answer, by node group.
async fn commit_records(nodes: &mut KeptConnections, deciders: &HashMap<i32, ServerAddr>, catalog: &Catalog) -> HashMap<i32, Vec<u64>> {
    let mut records = HashMap::new();
    let active = catalog.active_nodes().map(|n| n.group_id).chain([decided::COORDINATOR_GROUP]);
    for group in active {
        let Some(addr) = deciders.get(&group) else { continue };
        match nodes.on(addr, |conn| Box::pin(decided::commit_records(conn))).await {
            Ok(xids) if !xids.is_empty() => {
                records.insert(group, xids);
            }
            Ok(_) => {}
            Err(e) => tracing::warn!("recovery: could not read the commit records on {addr}: {e}"),
        }
    }
    records
}

/// Deletes the commit records no prepared part `named` (node group, xid):
/// their transactions' parts are all finished.
async fn forget_commit_records(
    nodes: &mut KeptConnections,
    deciders: &HashMap<i32, ServerAddr>,
    records: HashMap<i32, Vec<u64>>,
    named: &HashSet<(i32, u64)>,
) {
    for (group, xids) in records {
        let finished: Vec<u64> = xids.into_iter().filter(|xid| !named.contains(&(group, *xid))).collect();
        let Some(addr) = deciders.get(&group) else { continue };
        if finished.is_empty() {
            continue;
        }
        let forgotten = nodes.on(addr, |conn| Box::pin(async move { decided::forget_commit_records(conn, &finished).await })).await;
        if let Err(e) = forgotten {
            tracing::warn!("recovery: could not delete finished commit records on {addr}: {e}");
        }
    }
}

/// The prepared parts on a node decided by another node's transaction:
/// name, deciding node group, deciding transaction.
async fn decided_parts(conn: &mut PgConnection) -> PgResult<Vec<(String, i32, DecidingTransaction)>> {
    let gids = conn
        .query(&format!(
            "SELECT gid FROM pg_prepared_xacts WHERE database = current_database() AND starts_with(gid, {})",
            quote_literal(decided::GID_PREFIX)
        ))
        .await?;
    Ok(gids
        .into_iter()
        .filter_map(|r| r.into_iter().next().flatten())
        .filter_map(|gid| decided::parse_gid(&gid).map(|(group, decider)| (gid, group, decider)))
        .collect())
}

/// Settles the prepared parts on `node` whose deciding transaction (see
/// `decided`) has ended: committed with it, or rolled back. Adds every
/// deciding transaction its parts name to `named`.
async fn recover_decided_parts(
    nodes: &mut KeptConnections,
    deciders: &HashMap<i32, ServerAddr>,
    node: &Node,
    named: &mut HashSet<(i32, u64)>,
) -> PgResult<u64> {
    let parts = nodes.on(&node.addr, |conn| Box::pin(decided_parts(conn))).await?;
    let mut by_decider: HashMap<i32, Vec<(String, DecidingTransaction)>> = HashMap::new();
    for (gid, from, decider) in parts {
        named.insert((from, decider.xid));
        by_decider.entry(from).or_default().push((gid, decider));
    }
    let mut settled = 0;
    for (from, parts) in by_decider {
        let Some(decider) = deciders.get(&from) else { continue };
        let transactions: Vec<DecidingTransaction> = parts.iter().map(|(_, decider)| decider.clone()).collect();
        let decisions = nodes.on(decider, |d| Box::pin(async move { decided::decide(d, &transactions).await })).await;
        let decisions = match decisions {
            Ok(decisions) => decisions,
            Err(e) => {
                tracing::warn!("recovery: the outcome of transactions on {decider} is unknown for now: {e}");
                continue;
            }
        };
        for ((gid, _), decision) in parts.iter().zip(decisions) {
            let Some(command) = decision else { continue };
            let sql = decided::finish_sql(command, gid);
            match nodes.on(&node.addr, |conn| Box::pin(async move { decided::finish_prepared(conn, &sql).await })).await {
                Ok(()) => {
                    tracing::info!("recovery: {command} '{gid}' on {} (its deciding transaction on {decider} ended)", node.addr);
                    settled += 1;
                }
                Err(e) => tracing::warn!("recovery: {command} '{gid}' on {}: {e}", node.addr),
            }
        }
    }
    Ok(settled)
}
