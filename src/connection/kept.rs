//! Service connections that a background task keeps from one round to the
//! next (prepared-transaction recovery, deadlock detection). A round asks
//! every node a few questions; a connection per question and round would
//! start a backend on every node several times a second, per coordinator
//! process.

use super::PgConnection;
use crate::config::{Login, ServerAddr};
use crate::error::{sqlstate, PgError, PgResult};
use futures::future::BoxFuture;
use std::collections::{HashMap, HashSet};
use std::time::Duration;

pub struct KeptConnections {
    login: Login,
    /// How long `on` waits for a node's answer. A host gone without closing
    /// its connections would otherwise hold every later round for TCP's
    /// retransmission timeout, many minutes.
    patience: Duration,
    open: HashMap<ServerAddr, PgConnection>,
    /// The servers asked since the last `end_round`.
    asked: HashSet<ServerAddr>,
}

impl KeptConnections {
    /// Connections that log in as `login` under the application_name
    /// `name`, which tells them apart in the nodes' `pg_stat_activity`, and
    /// give up on a node that takes longer than `patience` to answer.
    pub fn new(mut login: Login, name: &str, patience: Duration) -> Self {
        login.options.retain(|(option, _)| option != "application_name");
        login.options.push(("application_name".into(), name.into()));
        KeptConnections { login, patience, open: HashMap::new(), asked: HashSet::new() }
    }

    /// The kept connection to `addr` (a new one if there is none, or if the
    /// server closed it, e.g. on a restart); hand it back with `give_back`.
    pub async fn take(&mut self, addr: &ServerAddr) -> PgResult<PgConnection> {
        self.asked.insert(addr.clone());
        if let Some(mut conn) = self.open.remove(addr) {
            if !conn.is_dead_while_idle() {
                return Ok(conn);
            }
        }
        PgConnection::connect(addr, &self.login).await
    }

    /// Keeps `conn` for later, unless a failure left it broken, inside a
    /// transaction or in the middle of an exchange.
    pub async fn give_back(&mut self, addr: &ServerAddr, conn: PgConnection) {
        if !conn.is_reusable() {
            conn.terminate().await;
        } else if let Some(replaced) = self.open.insert(addr.clone(), conn) {
            replaced.terminate().await;
        }
    }

    /// Runs `work` on the kept connection to `addr`; past the patience, the
    /// connection is dropped, whatever state it is in, and `work` fails.
    pub async fn on<T>(&mut self, addr: &ServerAddr, work: impl for<'c> FnOnce(&'c mut PgConnection) -> BoxFuture<'c, PgResult<T>>) -> PgResult<T> {
        let patience = self.patience;
        let silent = || PgError::new(sqlstate::CONNECTION_FAILURE, format!("node {addr} did not answer within {} s", patience.as_secs_f64()));
        let mut conn = match tokio::time::timeout(patience, self.take(addr)).await {
            Ok(conn) => conn?,
            Err(_) => return Err(silent()),
        };
        match tokio::time::timeout(patience, work(&mut conn)).await {
            Ok(result) => {
                self.give_back(addr, conn).await;
                result
            }
            Err(_) => Err(silent()),
        }
    }

    /// Closes the connections the round that just ended did not use: to
    /// nodes that left the cluster or moved to another address.
    pub async fn end_round(&mut self) {
        let unused: Vec<ServerAddr> = self.open.keys().filter(|addr| !self.asked.contains(*addr)).cloned().collect();
        for addr in unused {
            if let Some(conn) = self.open.remove(&addr) {
                conn.terminate().await;
            }
        }
        self.asked.clear();
    }

    pub async fn close(self) {
        for conn in self.open.into_values() {
            conn.terminate().await;
        }
    }
}
