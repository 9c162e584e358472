//! Distributed deadlock detection. Each node's own detector sees only its local
//! waits; a cycle that runs through two workers (A waits for B on one, B for A on
//! the other) would hang forever. Every few seconds this gathers who waits for
//! whom on every worker, maps worker backends to distributed transactions by the
//! application_name a block sets on them, and cancels the youngest transaction of
//! each cycle on the nodes where it waits.

use super::TRANSACTION_ID_PREFIX;
use crate::config::Config;
use crate::connection::{quote_literal, PgConnection, ServerAddr};
use crate::error::PgResult;
use crate::metadata::Catalog;
use std::collections::{BTreeMap, BTreeSet};

/// One wait: on `node`, backend `pid` of transaction `waiter` waits for a lock
/// that transaction `holder` holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Wait {
    pub node: ServerAddr,
    pub pid: i32,
    pub waiter: String,
    pub holder: String,
}

/// The transaction chosen to break a cycle, where it waits, and the cycle.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Victim {
    pub transaction: String,
    pub waits: Vec<(ServerAddr, i32)>,
    pub cycle: Vec<String>,
}

/// Reads the waits between distributed transactions on every active worker.
pub async fn gather_waits(config: &Config, catalog: &Catalog) -> PgResult<Vec<Wait>> {
    let login = config.service_login();
    let mut waits = Vec::new();
    for node in catalog.active_nodes() {
        let mut conn = PgConnection::connect(&node.addr, &login).await?;
        let rows = conn
            .query(&format!(
                "SELECT w.pid, w.application_name, h.application_name
                 FROM pg_stat_activity w
                 CROSS JOIN LATERAL unnest(pg_blocking_pids(w.pid)) AS b(pid)
                 JOIN pg_stat_activity h ON h.pid = b.pid
                 WHERE starts_with(w.application_name, {0}) AND starts_with(h.application_name, {0})
                   AND w.application_name <> h.application_name",
                quote_literal(TRANSACTION_ID_PREFIX)
            ))
            .await;
        conn.terminate().await;
        for r in rows? {
            if let (Some(pid), Some(waiter), Some(holder)) = (r[0].as_deref().and_then(|p| p.parse().ok()), r[1].clone(), r[2].clone()) {
                waits.push(Wait { node: node.addr.clone(), pid, waiter, holder });
            }
        }
    }
    Ok(waits)
}

/// When a transaction started, from its id (`tessera:<process>:<session>:<n>:<ms>`).
fn started_ms(transaction: &str) -> u128 {
    transaction.rsplit(':').next().and_then(|t| t.parse().ok()).unwrap_or(0)
}

/// The youngest transaction of every cycle in the wait-for graph.
pub fn choose_victims(waits: &[Wait]) -> Vec<Victim> {
    let mut graph: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for w in waits {
        graph.entry(&w.waiter).or_default().insert(&w.holder);
    }
    let mut victims: Vec<Victim> = Vec::new();
    let mut broken: BTreeSet<String> = BTreeSet::new();
    for start in graph.keys().copied() {
        if broken.contains(start) {
            continue;
        }
        if let Some(cycle) = find_cycle(&graph, start, &broken) {
            let youngest = cycle.iter().max_by_key(|t| (started_ms(t), t.to_string())).unwrap().clone();
            let where_waiting = waits.iter().filter(|w| w.waiter == youngest).map(|w| (w.node.clone(), w.pid)).collect();
            broken.insert(youngest.clone());
            victims.push(Victim { transaction: youngest, waits: where_waiting, cycle });
        }
    }
    victims
}

/// A cycle through `start`, avoiding transactions already chosen as victims.
fn find_cycle(graph: &BTreeMap<&str, BTreeSet<&str>>, start: &str, broken: &BTreeSet<String>) -> Option<Vec<String>> {
    let mut path = vec![start.to_string()];
    let mut seen = BTreeSet::new();
    fn walk(graph: &BTreeMap<&str, BTreeSet<&str>>, start: &str, path: &mut Vec<String>, seen: &mut BTreeSet<String>, broken: &BTreeSet<String>) -> bool {
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

    fn wait(waiter: &str, holder: &str, port: u16) -> Wait {
        Wait { node: ServerAddr { host: "127.0.0.1".into(), port }, pid: port as i32, waiter: waiter.into(), holder: holder.into() }
    }

    #[test]
    fn the_youngest_transaction_of_a_cycle_is_chosen() {
        let waits = vec![wait("tessera:1:1:0:100", "tessera:1:2:0:200", 1), wait("tessera:1:2:0:200", "tessera:1:1:0:100", 2)];
        let victims = choose_victims(&waits);
        assert_eq!(victims.len(), 1);
        assert_eq!(victims[0].transaction, "tessera:1:2:0:200");
        assert_eq!(victims[0].waits, vec![(ServerAddr { host: "127.0.0.1".into(), port: 2 }, 2)]);
    }

    #[test]
    fn waits_without_a_cycle_cancel_nothing() {
        let waits = vec![wait("a:1", "b:2", 1), wait("b:2", "c:3", 2)];
        assert!(choose_victims(&waits).is_empty());
    }

    #[test]
    fn each_cycle_loses_one_transaction() {
        let waits = vec![wait("a:1", "b:2", 1), wait("b:2", "a:1", 2), wait("c:3", "d:4", 1), wait("d:4", "c:3", 2)];
        let mut victims: Vec<String> = choose_victims(&waits).into_iter().map(|v| v.transaction).collect();
        victims.sort();
        assert_eq!(victims, vec!["b:2".to_string(), "d:4".to_string()]);
    }
}
