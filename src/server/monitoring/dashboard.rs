//! The dashboard's data (`/api/overview`): nodes with health, role and
//! disk used; tables with their shards' sizes per node and how uneven they
//! are; the top statements and tenants; background jobs; pools.

use super::snapshot;
use crate::process::Coordinator;
use serde_json::{json, Value};
use std::collections::BTreeMap;

/// Rows the top-statement and top-tenant lists show.
const TOP: usize = 10;

/// A statement's entries of every partition key, added up.
#[derive(Default)]
struct StatementTotals {
    query: std::sync::Arc<str>,
    calls: u64,
    total: std::time::Duration,
    rows: u64,
    /// Partition keys it ran for.
    keys: usize,
}

pub async fn overview(coordinator: &Coordinator) -> Value {
    let (nodes, jobs) = futures::join!(snapshot::nodes(coordinator, true), snapshot::jobs(coordinator));
    let catalog = coordinator.catalog.snapshot();
    let address_of_group = |group: i32| catalog.node_for_group(group).map(|n| n.addr.to_string());
    let shard_bytes =
        |address: &str, shard_name: &str| nodes.iter().find(|n| n.address == address).and_then(|n| n.shard_bytes.get(shard_name).copied());

    let mut tables: Vec<Value> = Vec::new();
    for table in catalog.tables() {
        let mut per_node: BTreeMap<String, i64> = BTreeMap::new();
        let mut total = 0;
        for shard in &table.shards {
            let name = table.qualified_shard_name(shard);
            for (i, address) in shard.placements.iter().filter_map(|g| address_of_group(*g)).enumerate() {
                let bytes = shard_bytes(&address, &name).unwrap_or(0);
                *per_node.entry(address).or_default() += bytes;
                // A reference table's copies are one table's size.
                if i == 0 {
                    total += bytes;
                }
            }
        }
        let mean = per_node.values().sum::<i64>() as f64 / per_node.len().max(1) as f64;
        let skew = per_node.values().max().map(|max| if mean > 0.0 { *max as f64 / mean } else { 1.0 });
        tables.push(json!({
            "name": table.qualified_name(),
            "kind": if table.is_reference() { "reference" } else { "distributed" },
            "colocation_id": table.colocation_id,
            "shards": table.shards.len(),
            "bytes": total,
            "bytes_per_node": per_node,
            "skew": skew,
        }));
    }

    let stats = &coordinator.stats;
    // One line per statement and tier, its partition keys added up.
    let mut by_statement: BTreeMap<(i64, &'static str), StatementTotals> = BTreeMap::new();
    for row in stats.statements.rows() {
        let totals = by_statement
            .entry((row.key.queryid, row.key.tier.name()))
            .or_insert_with(|| StatementTotals { query: row.query.clone(), ..Default::default() });
        totals.calls += row.calls;
        totals.total += row.total;
        totals.rows += row.rows;
        totals.keys += usize::from(row.key.partition_key.is_some());
    }
    let mut statements: Vec<_> = by_statement.into_iter().collect();
    statements.sort_by_key(|(_, totals)| std::cmp::Reverse(totals.total));
    let statements: Vec<Value> = statements
        .into_iter()
        .take(TOP)
        .map(|((_, executor), t)| {
            json!({
                "query": &*t.query,
                "executor": executor,
                "partition_keys": t.keys,
                "calls": t.calls,
                "total_ms": t.total.as_secs_f64() * 1000.0,
                "mean_ms": t.total.as_secs_f64() * 1000.0 / t.calls.max(1) as f64,
                "rows": t.rows,
            })
        })
        .collect();
    let tenants: Vec<Value> = stats
        .tenants
        .rows()
        .into_iter()
        .take(TOP)
        .map(|t| {
            json!({
                "tenant": &*t.tenant,
                "colocation_id": t.colocation_id,
                "queries_this_period": t.this.queries,
                "reads_this_period": t.this.reads,
                "queries_last_period": t.last.queries,
                "seconds_this_period": t.this.time.as_secs_f64(),
            })
        })
        .collect();

    let report = coordinator.process_report(&catalog);
    let pools: Vec<Value> =
        report.pools.iter().map(|p| json!({ "node": p.node, "open": p.open, "idle": p.idle, "limit": p.limit, "waiting": p.waiting })).collect();

    json!({
        "clients": coordinator.clients.load(std::sync::atomic::Ordering::Relaxed),
        "blocks": report.blocks,
        "nodes": nodes.iter().map(|n| json!({ "id": n.id, "address": n.address, "role": n.role, "up": n.up, "database_bytes": n.database_bytes })).collect::<Vec<_>>(),
        "tables": tables,
        "statements": statements,
        "tenants": tenants,
        "jobs": jobs.iter().map(|j| json!({ "id": j.id, "state": j.state, "description": j.description, "tasks": j.tasks, "done": j.done, "running": j.running, "failed": j.failed })).collect::<Vec<_>>(),
        "pools": pools,
    })
}
