//! Distributed deadlock detection. Each node's own detector sees only its local
//! waits; a cycle that runs through two workers (A waits for B on one, B for A on
//! the other) would hang forever. Every few seconds this gathers who waits for
//! whom on every worker, maps worker backends to distributed transactions by the
//! session name their connections carry as application_name (a worker's link to
//! another node, `links`, by the session of the backend that opened it), and
//! cancels the youngest transaction of each cycle on the nodes where it waits.

use super::{links, TRANSACTION_ID_PREFIX};
use crate::config::ServerAddr;
use crate::connection::kept::KeptConnections;
use crate::connection::quote_literal;
use crate::error::PgResult;
use crate::metadata::Catalog;
use std::collections::{BTreeMap, BTreeSet, HashMap};

/// One wait: on `node`, backend `pid` of session `waiter` waits for a lock
/// that session `holder` holds. Both sides' transaction start times on that
/// node (µs since the epoch) tell which distributed transaction is younger,
/// and pin the cancellation to the transaction that was seen waiting.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Wait {
    pub node: ServerAddr,
    pub pid: i32,
    /// The waiting backend's application_name (a link's own name, where
    /// `waiter` is the session it acts for).
    pub backend: String,
    pub waiter: String,
    pub waiter_started: i64,
    pub holder: String,
    pub holder_started: i64,
}

/// The transaction chosen to break a cycle (by its session's name), the
/// backends where it waits (node, pid, that backend's transaction start and
/// application_name), and the cycle.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Victim {
    pub session: String,
    pub waits: Vec<(ServerAddr, i32, i64, String)>,
    pub cycle: Vec<String>,
}

/// A transaction start as an integer number of µs since the epoch, in SQL.
fn started_us(column: &str) -> String {
    format!("(extract(epoch FROM {column}) * 1000000)::int8")
}

/// Reads the waits between distributed transactions on every active worker,
/// over the connections `nodes` keeps.
pub async fn gather_waits(catalog: &Catalog, nodes: &mut KeptConnections) -> PgResult<Vec<Wait>> {
    let mut waits = Vec::new();
    let ours = |column: &str| format!("(starts_with({column}, {}) OR starts_with({column}, 'tessera_link_'))", quote_literal(TRANSACTION_ID_PREFIX));
    let sql = format!(
        "SELECT w.pid, w.application_name, {}, h.application_name, {}
         FROM pg_stat_activity w
         CROSS JOIN LATERAL unnest(pg_blocking_pids(w.pid)) AS b(pid)
         JOIN pg_stat_activity h ON h.pid = b.pid
         WHERE {} AND {}
           AND w.application_name <> h.application_name
           AND w.xact_start IS NOT NULL AND h.xact_start IS NOT NULL",
        started_us("w.xact_start"),
        started_us("h.xact_start"),
        ours("w.application_name"),
        ours("h.application_name"),
    );
    for node in catalog.active_nodes() {
        let sql = sql.clone();
        for r in nodes.on(&node.addr, |conn| Box::pin(async move { conn.query(&sql).await })).await? {
            let number = |i: usize| r[i].as_deref().and_then(|v| v.parse::<i64>().ok());
            if let (Some(pid), Some(waiter), Some(waiter_started), Some(holder), Some(holder_started)) =
                (number(0), r[1].clone(), number(2), r[3].clone(), number(4))
            {
                waits.push(Wait {
                    node: node.addr.clone(),
                    pid: pid as i32,
                    backend: waiter.clone(),
                    waiter,
                    waiter_started,
                    holder,
                    holder_started,
                });
            }
        }
    }
    resolve_links(&mut waits, catalog, nodes).await;
    Ok(waits)
}

/// Puts the session a link acts for in place of the link's name: the
/// session of the worker backend that opened it, as that worker shows it.
/// A link opened by a backend of no coordinator session (a client on the
/// worker) stays a transaction of its own.
async fn resolve_links(waits: &mut [Wait], catalog: &Catalog, nodes: &mut KeptConnections) {
    let mut sessions: HashMap<String, String> = HashMap::new();
    for name in waits.iter().flat_map(|w| [w.waiter.clone(), w.holder.clone()]) {
        let Some((from, pid)) = links::link_origin(&name) else { continue };
        if sessions.contains_key(&name) {
            continue;
        }
        let Some(node) = catalog.node_for_group(from) else { continue };
        let sql = format!("SELECT application_name FROM pg_stat_activity WHERE pid = {pid}");
        let session = nodes.on(&node.addr, |conn| Box::pin(async move { conn.query_value(&sql).await })).await;
        if let Ok(Some(session)) = session.map(|s| s.filter(|s| s.starts_with(TRANSACTION_ID_PREFIX))) {
            sessions.insert(name, session);
        }
    }
    for w in waits {
        for name in [&mut w.waiter, &mut w.holder] {
            if let Some(session) = sessions.get(name.as_str()) {
                *name = session.clone();
            }
        }
    }
}

/// Cancels the victim's statements where it was seen waiting, provided the
/// backend is still in that same transaction. Returns how many it cancelled.
pub async fn cancel(victim: &Victim, nodes: &mut KeptConnections) -> PgResult<u64> {
    let mut cancelled = 0;
    for (addr, pid, started, backend) in &victim.waits {
        let sql = format!(
            "SELECT pg_cancel_backend(pid) FROM pg_stat_activity WHERE pid = {pid} AND application_name = {} AND {} = {started}",
            quote_literal(backend),
            started_us("xact_start")
        );
        let rows = nodes.on(addr, |conn| Box::pin(async move { conn.query(&sql).await })).await;
        cancelled += rows?.iter().filter(|r| r[0].as_deref() == Some("t")).count() as u64;
    }
    Ok(cancelled)
}

/// The youngest transaction of every cycle in the wait-for graph. A
/// distributed transaction started when its first backend did.
pub fn choose_victims(waits: &[Wait]) -> Vec<Victim> {
    let mut graph: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    let mut started: BTreeMap<&str, i64> = BTreeMap::new();
    for w in waits {
        graph.entry(&w.waiter).or_default().insert(&w.holder);
        for (session, at) in [(&w.waiter, w.waiter_started), (&w.holder, w.holder_started)] {
            let earliest = started.entry(session).or_insert(at);
            *earliest = (*earliest).min(at);
        }
    }
    let mut victims: Vec<Victim> = Vec::new();
    let mut broken: BTreeSet<String> = BTreeSet::new();
    for start in graph.keys().copied() {
        if broken.contains(start) {
            continue;
        }
        if let Some(cycle) = find_cycle(&graph, start, &broken) {
            let youngest = cycle.iter().max_by_key(|t| (started.get(t.as_str()).copied().unwrap_or(0), t.to_string())).unwrap().clone();
            let where_waiting =
                waits.iter().filter(|w| w.waiter == youngest).map(|w| (w.node.clone(), w.pid, w.waiter_started, w.backend.clone())).collect();
            broken.insert(youngest.clone());
            victims.push(Victim { session: youngest, waits: where_waiting, cycle });
        }
    }
    victims
}

/// A cycle through `start`, avoiding transactions already chosen as victims.
fn find_cycle(graph: &BTreeMap<&str, BTreeSet<&str>>, start: &str, broken: &BTreeSet<String>) -> Option<Vec<String>> {
    let mut path = vec![start.to_string()];
    let mut seen = BTreeSet::new();
    fn walk(
        graph: &BTreeMap<&str, BTreeSet<&str>>,
        start: &str,
        path: &mut Vec<String>,
        seen: &mut BTreeSet<String>,
        broken: &BTreeSet<String>,
    ) -> bool {
        let current = path.last().unwrap().clone();
        for next in graph.get(current.as_str()).into_iter().flatten() {
            if *next == start {
                return true;
            }
            if broken.contains(*next) || !seen.insert(next.to_string()) {
                continue;
            }
            path.push(next.to_string());
            if walk(graph, start, path, seen, broken) {
                return true;
            }
            path.pop();
        }
        false
    }
    walk(graph, start, &mut path, &mut seen, broken).then_some(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// On node `port`, session `waiter` (its transaction there began at
    /// `waiter_started`; its pid is the port) waits for `holder`.
    fn wait(waiter: (&str, i64), holder: (&str, i64), port: u16) -> Wait {
        Wait {
            node: ServerAddr { host: "127.0.0.1".into(), port },
            pid: port as i32,
            backend: waiter.0.into(),
            waiter: waiter.0.into(),
            waiter_started: waiter.1,
            holder: holder.0.into(),
            holder_started: holder.1,
        }
    }

    #[test]
    fn the_youngest_transaction_of_a_cycle_is_chosen() {
        let waits = vec![wait(("tessera:1:1", 100), ("tessera:1:2", 200), 1), wait(("tessera:1:2", 250), ("tessera:1:1", 150), 2)];
        let victims = choose_victims(&waits);
        assert_eq!(victims.len(), 1);
        assert_eq!(victims[0].session, "tessera:1:2");
        assert_eq!(victims[0].waits, vec![(ServerAddr { host: "127.0.0.1".into(), port: 2 }, 2, 250, "tessera:1:2".to_string())]);
    }

    #[test]
    fn a_transaction_is_as_old_as_its_first_backend() {
        // a began on node 1 at 50, so it is older than b although its backend
        // on node 2 began after b's.
        let waits = vec![wait(("b", 200), ("a", 50), 1), wait(("a", 300), ("b", 200), 2)];
        assert_eq!(choose_victims(&waits)[0].session, "b");
    }

    #[test]
    fn a_transaction_waiting_for_itself_is_cancelled() {
        // Its link to node 2 waits for its own connection there.
        let victims = choose_victims(&[wait(("a", 1), ("a", 1), 2)]);
        assert_eq!(victims.len(), 1);
        assert_eq!(victims[0].session, "a");
    }

    #[test]
    fn waits_without_a_cycle_cancel_nothing() {
        let waits = vec![wait(("a", 1), ("b", 2), 1), wait(("b", 2), ("c", 3), 2)];
        assert!(choose_victims(&waits).is_empty());
    }

    #[test]
    fn each_cycle_loses_one_transaction() {
        let waits = vec![wait(("a", 1), ("b", 2), 1), wait(("b", 2), ("a", 1), 2), wait(("c", 3), ("d", 4), 1), wait(("d", 4), ("c", 3), 2)];
        let mut victims: Vec<String> = choose_victims(&waits).into_iter().map(|v| v.session).collect();
        victims.sort();
        assert_eq!(victims, vec!["b".to_string(), "d".to_string()]);
    }
}
