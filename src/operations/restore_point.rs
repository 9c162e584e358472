//! `citus_create_restore_point`: one named restore point on every node (the
//! coordinator database and each active worker), taken while no distributed
//! transaction can be decided, so that restoring every node to it gives a
//! cluster in which each transaction committed everywhere or nowhere.
//!
//! A multi-node commit is decided by its deciding node's commit record
//! (`transaction::decided`), a row written into that node's commit-record
//! table inside the deciding transaction. Locking that table against writes
//! on every node holds back every decision and waits for those under way.
//! While all the locks are held, a transaction is either decided (its other
//! parts were prepared before that, so every node's restore point sees them
//! prepared or committed) or undecided everywhere; recovery after a restore
//! settles the prepared parts by the records it finds. One-node commits need
//! nothing: each node's restore point is consistent in itself.

use crate::config::Config;
use crate::config::ServerAddr;
use crate::connection::{quote_literal, PgConnection};
use crate::error::{sqlstate, PgError, PgResult};
use crate::metadata::Catalog;
use crate::protocol::backend::TxStatus;
use crate::transaction::decided;
use std::time::{Duration, Instant};

/// PostgreSQL keeps restore point names in a 64-byte buffer, NUL included.
const MAX_NAME_BYTES: usize = 63;

/// How long one attempt waits for a node's commits under way. Waiting on
/// one node while holding others' locks can close a cycle (a decision held
/// back on a node that a transaction on the other node waits for), so an
/// attempt that waits longer lets go of every lock and starts again.
const ATTEMPT_LOCK_TIMEOUT: &str = "2s";

/// How long to keep trying before giving up.
const PATIENCE: Duration = Duration::from_secs(60);

const LOCK_NOT_AVAILABLE: &str = "55P03";

/// Creates restore point `name` on every node; returns the coordinator
/// database's WAL location of it, as Citus returns its coordinator's.
pub async fn create(config: &Config, catalog: &Catalog, name: &str) -> PgResult<String> {
    if name.len() > MAX_NAME_BYTES {
        return Err(PgError::new(
            sqlstate::INVALID_PARAMETER_VALUE,
            format!("value too long for restore point (maximum {MAX_NAME_BYTES} characters)"),
        ));
    }
    let mut nodes: Vec<(String, ServerAddr)> = vec![("the coordinator database".to_string(), config.coordinator_db_addr())];
    nodes.extend(catalog.active_nodes().map(|n| (format!("node {}", n.addr), n.addr.clone())));
    let mut conns = Vec::with_capacity(nodes.len());
    for (_, addr) in &nodes {
        conns.push(PgConnection::connect(addr, &config.service_login()).await?);
    }
    let started = Instant::now();
    let result = loop {
        match hold_decisions(&mut conns, &nodes).await {
            Err(e) if e.code() == LOCK_NOT_AVAILABLE && started.elapsed() < PATIENCE => {
                release(&mut conns).await;
                tracing::info!("citus_create_restore_point: {}; trying again", e.message());
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => break Err(e),
            // In parallel: the locks keep decisions out however long it
            // takes, but the closer the points, the less WAL each restore
            // replays past the others'. PostgreSQL does not flush a restore
            // point's WAL; the locking transaction is given an id so that
            // its COMMIT, which comes after the point, flushes it.
            Ok(()) => {
                let sql =
                    format!("SELECT pg_catalog.pg_create_restore_point({})::text, pg_catalog.pg_current_xact_id(); COMMIT", quote_literal(name));
                let created = futures::future::join_all(conns.iter_mut().map(|c| c.query(&sql))).await;
                break created
                    .into_iter()
                    .zip(&nodes)
                    .map(|(rows, (label, _))| rows.map_err(|e| on_node(e, label)))
                    .collect::<PgResult<Vec<_>>>()
                    .map(|rows| rows[0].first().and_then(|r| r[0].clone()).unwrap_or_default());
            }
        }
    };
    release(&mut conns).await;
    for conn in conns {
        conn.terminate().await;
    }
    result
}

/// Locks every node's commit records against writes, in one transaction
/// per node, in the order of `conns`.
async fn hold_decisions(conns: &mut [PgConnection], nodes: &[(String, ServerAddr)]) -> PgResult<()> {
    let sql = format!(
        "BEGIN; SET LOCAL lock_timeout = '{ATTEMPT_LOCK_TIMEOUT}'; SET LOCAL synchronous_commit = on; LOCK TABLE {} IN EXCLUSIVE MODE",
        decided::COMMIT_RECORDS
    );
    for (conn, (label, _)) in conns.iter_mut().zip(nodes) {
        conn.execute(&sql).await.map_err(|e| on_node(e, label))?;
    }
    Ok(())
}

/// Ends the locking transactions still open (after a failure).
async fn release(conns: &mut [PgConnection]) {
    for conn in conns.iter_mut().filter(|c| c.tx_status() != TxStatus::Idle) {
        conn.execute("ROLLBACK").await.ok();
    }
}

fn on_node(e: PgError, label: &str) -> PgError {
    e.map_message(|m| format!("{m} (on {label})"))
}
