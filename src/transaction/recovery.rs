//! Settles prepared transactions that two-phase commit left behind (a crashed
//! coordinator, a worker restarted before COMMIT PREPARED): those with a commit
//! record in `pg_dist_transaction` are committed, those without one are rolled
//! back once they are older than the grace period, and records nobody needs any
//! more are deleted. Parts decided by another node's transaction (`decided`:
//! last-agent commits of blocks and of worker transactions' links) are
//! settled by that transaction's outcome on its node.

use super::{decided, GID_PREFIX};
use crate::config::Config;
use crate::connection::{quote_literal, Login, PgConnection};
use crate::error::PgResult;
use crate::metadata::Catalog;
use std::collections::{HashMap, HashSet};

/// One pass over every active worker; returns how many prepared transactions
/// it committed or rolled back.
pub async fn recover(config: &Config, catalog: &Catalog) -> PgResult<u64> {
    let login = config.service_login();
    let mut settled = 0;
    let mut first_error = None;
    // Without the coordinator database only the parts it decides must wait.
    let mut local = match PgConnection::connect(&config.coordinator_db_addr(), &login).await {
        Ok(local) => Some(local),
        Err(e) => {
            tracing::warn!("prepared-transaction recovery: the coordinator database ({}) is unavailable, its records wait: {e}", config.coordinator_db_addr());
            first_error = Some(e);
            None
        }
    };
    for node in catalog.active_nodes() {
        let by_record = match local.as_mut() {
            Some(local) => recover_node(local, &login, node, config.transactions.grace_secs).await,
            None => Ok(0),
        };
        let by_decision = recover_decided_parts(&login, catalog, node).await;
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
    if let Some(local) = local {
        local.terminate().await;
    }
    match first_error {
        Some(e) if settled == 0 => Err(e),
        _ => Ok(settled),
    }
}

async fn recover_node(local: &mut PgConnection, login: &Login, node: &crate::metadata::Node, grace_secs: f64) -> PgResult<u64> {
    // Records first: one read before the prepared list belongs to a transaction
    // whose decision was already taken, so absence from the list means finished.
    let records: HashSet<String> = local
        .query(&format!("SELECT gid FROM tessera.pg_dist_transaction WHERE groupid = {}", node.group_id))
        .await?
        .into_iter()
        .filter_map(|r| r.into_iter().next().flatten())
        .collect();
    let mut worker = PgConnection::connect(&node.addr, login).await?;
    let prepared = worker
        .query(&format!(
            "SELECT gid, now() - prepared > make_interval(secs => {grace_secs}) FROM pg_prepared_xacts
             WHERE database = current_database() AND starts_with(gid, {})",
            quote_literal(GID_PREFIX)
        ))
        .await?;
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
        match worker.execute(&format!("{command} {}", quote_literal(&gid))).await {
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
    worker.terminate().await;
    let finished: Vec<String> = records.iter().filter(|g| !still_prepared.contains(*g)).map(|g| quote_literal(g)).collect();
    if !finished.is_empty() {
        local
            .execute(&format!("DELETE FROM tessera.pg_dist_transaction WHERE groupid = {} AND gid IN ({})", node.group_id, finished.join(", ")))
            .await?;
    }
    Ok(settled)
}

/// Settles the prepared parts on `node` whose deciding transaction (see
/// `decided`) has ended: committed with it, or rolled back.
async fn recover_decided_parts(login: &Login, catalog: &Catalog, node: &crate::metadata::Node) -> PgResult<u64> {
    let mut conn = PgConnection::connect(&node.addr, login).await?;
    let gids = conn
        .query(&format!("SELECT gid FROM pg_prepared_xacts WHERE database = current_database() AND starts_with(gid, {})", quote_literal(decided::GID_PREFIX)))
        .await?;
    let mut by_decider: HashMap<i32, Vec<(String, String)>> = HashMap::new();
    for gid in gids.into_iter().filter_map(|r| r.into_iter().next().flatten()) {
        if let Some((from, xid)) = decided::parse_gid(&gid) {
            by_decider.entry(from).or_default().push((gid, xid));
        }
    }
    let mut settled = 0;
    for (from, parts) in by_decider {
        let Some(decider) = catalog.node_for_group(from) else { continue };
        let decisions = match PgConnection::connect(&decider.addr, login).await {
            Ok(mut d) => {
                let decisions = decided::decide(&mut d, parts.iter().map(|(_, xid)| xid.clone()).collect()).await;
                d.terminate().await;
                decisions
            }
            Err(e) => Err(e),
        };
        let decisions = match decisions {
            Ok(decisions) => decisions,
            Err(e) => {
                tracing::warn!("recovery: the outcome of transactions on {} is unknown for now: {e}", decider.addr);
                continue;
            }
        };
        for ((gid, _), decision) in parts.iter().zip(decisions) {
            let Some(command) = decision else { continue };
            match decided::finish_prepared(&mut conn, &decided::finish_sql(command, gid)).await {
                Ok(()) => {
                    tracing::info!("recovery: {command} '{gid}' on {} (its deciding transaction on {} ended)", node.addr, decider.addr);
                    settled += 1;
                }
                Err(e) => tracing::warn!("recovery: {command} '{gid}' on {}: {e}", node.addr),
            }
        }
    }
    conn.terminate().await;
    Ok(settled)
}
