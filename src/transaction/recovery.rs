//! Settles prepared transactions that two-phase commit left behind (a crashed
//! coordinator, a worker restarted before COMMIT PREPARED): those with a commit
//! record in `pg_dist_transaction` are committed, those without one are rolled
//! back once they are older than the grace period, and records nobody needs any
//! more are deleted. Parts decided by another node's transaction (`decided`:
//! last-agent commits of blocks and of worker transactions' links) are
//! settled by that transaction's outcome on its node, and the commit records
//! there are deleted once no prepared part names them.

use super::decided::{self, DecidingTransaction};
use super::GID_PREFIX;
use crate::config::Config;
use crate::connection::kept::KeptConnections;
use crate::connection::{quote_literal, PgConnection};
use crate::error::PgResult;
use crate::metadata::{Catalog, Node};
use std::collections::{HashMap, HashSet};

/// One pass over every active worker, over the connections `nodes` keeps
/// (one per node); returns how many prepared transactions it committed or
/// rolled back.
pub async fn recover(config: &Config, catalog: &Catalog, nodes: &mut KeptConnections) -> PgResult<u64> {
    let mut settled = 0;
    let mut first_error = None;
    // Without the coordinator database only the parts it decides must wait.
    let local_addr = config.coordinator_db_addr();
    let mut local = match nodes.take(&local_addr).await {
        Ok(local) => Some(local),
        Err(e) => {
            tracing::warn!("prepared-transaction recovery: the coordinator database ({}) is unavailable, its records wait: {e}", config.coordinator_db_addr());
            first_error = Some(e);
            None
        }
    };
    // Read before any prepared part is listed: a record read then whose
    // transaction has parts left shows them in the lists.
    let mut records = commit_records(nodes, catalog).await;
    let mut named = HashSet::new();
    for node in catalog.active_nodes() {
        let by_record = match local.as_mut() {
            Some(local) => recover_node(local, nodes, node, config.transactions.grace_secs).await,
            None => Ok(0),
        };
        let by_decision = recover_decided_parts(nodes, catalog, node, &mut named).await;
        if by_decision.is_err() {
            // Its parts are unknown, so every record stays.
            records.clear();
        }
        for recovered in [by_record, by_decision] {
            match recovered {
                Ok(n) => settled += n,
                Err(e) => {
                    tracing::warn!("prepared-transaction recovery on {}: {e}", node.addr);
                    first_error.get_or_insert(e);
                }
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
    forget_commit_records(nodes, catalog, records, &named).await;
    if let Some(local) = local {
        nodes.give_back(&local_addr, local).await;
    }
    nodes.end_round().await;
    match first_error {
        Some(e) if settled == 0 => Err(e),
        _ => Ok(settled),
    }
}

async fn recover_node(local: &mut PgConnection, nodes: &mut KeptConnections, node: &Node, grace_secs: f64) -> PgResult<u64> {
    // Records first: one read before the prepared list belongs to a transaction
    // whose decision was already taken, so absence from the list means finished.
    let records: HashSet<String> = local
        .query(&format!("SELECT gid FROM tessera.pg_dist_transaction WHERE groupid = {}", node.group_id))
        .await?
        .into_iter()
        .filter_map(|r| r.into_iter().next().flatten())
        .collect();
    let list = format!(
        "SELECT gid, now() - prepared > make_interval(secs => {grace_secs}) FROM pg_prepared_xacts
         WHERE database = current_database() AND starts_with(gid, {})",
        quote_literal(GID_PREFIX)
    );
    let prepared = nodes.on(&node.addr, |worker| Box::pin(async move { worker.query(&list).await })).await?;
    let mut settled = 0;
    let mut still_prepared = HashSet::new();
    for row in prepared {
        let (Some(gid), old) = (row[0].clone(), row[1].as_deref() == Some("t")) else { continue };
        let command = if records.contains(&gid) {
            "COMMIT PREPARED"
        } else if old {
            "ROLLBACK PREPARED"
        } else {
            still_prepared.insert(gid);
            continue;
        };
        let sql = format!("{command} {}", quote_literal(&gid));
        match nodes.on(&node.addr, |worker| Box::pin(async move { worker.execute(&sql).await })).await {
            Ok(_) => {
                tracing::info!("recovery: {command} '{gid}' on {}", node.addr);
                settled += 1;
            }
            Err(e) => {
                tracing::warn!("recovery: {command} '{gid}' on {}: {e}", node.addr);
                still_prepared.insert(gid);
            }
        }
    }
    let finished: Vec<String> = records.iter().filter(|g| !still_prepared.contains(*g)).map(|g| quote_literal(g)).collect();
    if !finished.is_empty() {
        local
            .execute(&format!("DELETE FROM tessera.pg_dist_transaction WHERE groupid = {} AND gid IN ({})", node.group_id, finished.join(", ")))
            .await?;
    }
    Ok(settled)
}

/// The commit records of deciding transactions (`decided`) on every active
/// node that answers, by node group.
async fn commit_records(nodes: &mut KeptConnections, catalog: &Catalog) -> HashMap<i32, Vec<u64>> {
    let mut records = HashMap::new();
    for node in catalog.active_nodes() {
        match nodes.on(&node.addr, |conn| Box::pin(decided::commit_records(conn))).await {
            Ok(xids) if !xids.is_empty() => {
                records.insert(node.group_id, xids);
            }
            Ok(_) => {}
            Err(e) => tracing::warn!("recovery: could not read the commit records on {}: {e}", node.addr),
        }
    }
    records
}

/// Deletes the commit records no prepared part `named` (node group, xid):
/// their transactions' parts are all finished.
async fn forget_commit_records(nodes: &mut KeptConnections, catalog: &Catalog, records: HashMap<i32, Vec<u64>>, named: &HashSet<(i32, u64)>) {
    for (group, xids) in records {
        let finished: Vec<u64> = xids.into_iter().filter(|xid| !named.contains(&(group, *xid))).collect();
        let Some(node) = catalog.node_for_group(group) else { continue };
        if finished.is_empty() {
            continue;
        }
        let forgotten = nodes.on(&node.addr, |conn| Box::pin(async move { decided::forget_commit_records(conn, &finished).await })).await;
        if let Err(e) = forgotten {
            tracing::warn!("recovery: could not delete finished commit records on {}: {e}", node.addr);
        }
    }
}

/// The prepared parts on a node decided by another node's transaction:
/// name, deciding node group, deciding transaction.
async fn decided_parts(conn: &mut PgConnection) -> PgResult<Vec<(String, i32, DecidingTransaction)>> {
    let gids = conn
        .query(&format!("SELECT gid FROM pg_prepared_xacts WHERE database = current_database() AND starts_with(gid, {})", quote_literal(decided::GID_PREFIX)))
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
async fn recover_decided_parts(nodes: &mut KeptConnections, catalog: &Catalog, node: &Node, named: &mut HashSet<(i32, u64)>) -> PgResult<u64> {
    let parts = nodes.on(&node.addr, |conn| Box::pin(decided_parts(conn))).await?;
    let mut by_decider: HashMap<i32, Vec<(String, DecidingTransaction)>> = HashMap::new();
    for (gid, from, decider) in parts {
        named.insert((from, decider.xid));
        by_decider.entry(from).or_default().push((gid, decider));
    }
    let mut settled = 0;
    for (from, parts) in by_decider {
        let Some(decider) = catalog.node_for_group(from) else { continue };
        let deciders: Vec<DecidingTransaction> = parts.iter().map(|(_, decider)| decider.clone()).collect();
        let decisions = nodes.on(&decider.addr, |d| Box::pin(async move { decided::decide(d, &deciders).await })).await;
        let decisions = match decisions {
            Ok(decisions) => decisions,
            Err(e) => {
                tracing::warn!("recovery: the outcome of transactions on {} is unknown for now: {e}", decider.addr);
                continue;
            }
        };
        for ((gid, _), decision) in parts.iter().zip(decisions) {
            let Some(command) = decision else { continue };
            let sql = decided::finish_sql(command, gid);
            match nodes.on(&node.addr, |conn| Box::pin(async move { decided::finish_prepared(conn, &sql).await })).await {
                Ok(()) => {
                    tracing::info!("recovery: {command} '{gid}' on {} (its deciding transaction on {} ended)", node.addr, decider.addr);
                    settled += 1;
                }
                Err(e) => tracing::warn!("recovery: {command} '{gid}' on {}: {e}", node.addr),
            }
        }
    }
    Ok(settled)
}
