//! Gathers what only the nodes know, for statements that read
//! `citus_stat_activity` or call the size functions (or check the nodes'
//! connections to each other): every node's
//! `pg_stat_activity` and the sizes of every distributed table's shards are
//! read through the session's own connections (so they show what this role
//! may see) into temporary tables of the session's coordinator-database
//! connection, where the view and the functions find them. Then the statement
//! runs there like any local one. The coordinator process's own state
//! (`tessera.connection_pools`, `tessera.client_sessions`) arrives the same
//! way, from the report the session hands over.

use super::{run_on_coordinator_db, Mode};
use crate::connection::client::ClientConn;
use crate::connection::{quote_ident, quote_literal, PgConnection};
use crate::error::PgResult;
use crate::metadata::{Catalog, DistributedTable};
use crate::planner::ClusterData;
use crate::process::report::ProcessReport;
use crate::stats::{Counter, Stats};
use crate::transaction::{Access, Participants};
use std::fmt::Write as _;
use std::sync::Arc;

/// Citus numbers a backend cluster-wide as node id × 10¹⁰ + process id.
const GLOBAL_PID_FACTOR: i64 = 10_000_000_000;

#[allow(clippy::too_many_arguments)]
pub async fn run(
    needs: &ClusterData,
    report: Option<&ProcessReport>,
    stats: &Stats,
    sql: &str,
    catalog: &Catalog,
    parts: &mut Participants,
    mode: &Mode<'_>,
    client: &mut ClientConn,
) -> PgResult<()> {
    let mut script = String::new();
    if let Some(report) = report {
        script.push_str(&report_script(needs, report));
    }
    script.push_str(&stats_script(needs, stats));
    if needs.sizes {
        script.push_str(&sizes_script(catalog, parts).await?);
    }
    // The waits first: a backend waiting then is still waiting when the
    // activity is read after, so its statement shows there.
    if needs.lock_waits {
        script.push_str(&lock_waits_script(catalog, parts).await?);
    }
    if needs.activity {
        script.push_str(&activity_script(catalog, parts).await?);
    }
    if needs.node_health {
        script.push_str(&node_health_script(catalog, parts.login()).await);
    }
    parts.local().await?.execute(&script).await?;
    run_on_coordinator_db(parts, needs.rewritten.as_deref().unwrap_or(sql), mode, client).await
}

/// On-disk sizes of one distributed table, summed over one copy of each shard.
#[derive(Clone, Copy, Debug, Default)]
pub struct TableSizes {
    /// The main fork, as `pg_relation_size`.
    pub relation: i64,
    /// Without indexes, as `pg_table_size`.
    pub table: i64,
    /// Indexes and TOAST included, as `pg_total_relation_size`.
    pub total: i64,
}

/// On-disk sizes of one shard placement, as `pg_relation_size`,
/// `pg_table_size` and `pg_total_relation_size` give them on its node.
#[derive(Clone, Copy, Debug)]
struct PlacementSize {
    /// The position of its table in the list asked about.
    table: usize,
    shard_id: i64,
    group_id: i32,
    /// The shard's first placement: the one its table's size counts (a
    /// reference table counts once, not once per copy).
    first_copy: bool,
    sizes: TableSizes,
}

/// The sizes of every placement of `tables`' shards, read from every node
/// in one statement per node.
async fn placement_sizes(tables: &[Arc<DistributedTable>], catalog: &Catalog, parts: &mut Participants) -> PgResult<Vec<PlacementSize>> {
    let mut placements = Vec::new();
    for node in catalog.active_nodes() {
        // The node answers by position in `asked`.
        let mut asked = Vec::new();
        let mut shards = String::new();
        for (i, table) in tables.iter().enumerate() {
            for shard in table.shards.iter().filter(|s| s.placements.contains(&node.group_id)) {
                let sep = if shards.is_empty() { "" } else { ", " };
                let _ = write!(shards, "{sep}({}, {})", asked.len(), quote_literal(&table.qualified_shard_name(shard)));
                asked.push((i, shard.id, shard.placements.first() == Some(&node.group_id)));
            }
        }
        if asked.is_empty() {
            continue;
        }
        let sql = format!(
            "SELECT k, pg_relation_size(r), pg_table_size(r), pg_total_relation_size(r)
             FROM (VALUES {shards}) v(k, shard), LATERAL to_regclass(shard) r WHERE r IS NOT NULL"
        );
        let worker = parts.worker(node, Access::Read).await?;
        for row in worker.conn.query(&sql).await? {
            let number = |k: usize| row.get(k).and_then(|v| v.as_deref()).and_then(|v| v.parse::<i64>().ok()).unwrap_or(0);
            let Some(&(table, shard_id, first_copy)) = asked.get(number(0) as usize) else { continue };
            placements.push(PlacementSize {
                table,
                shard_id,
                group_id: node.group_id,
                first_copy,
                sizes: TableSizes { relation: number(1), table: number(2), total: number(3) },
            });
        }
    }
    Ok(placements)
}

/// The sizes of `tables`, summed over their shards' first placements.
pub async fn table_sizes(tables: &[Arc<DistributedTable>], catalog: &Catalog, parts: &mut Participants) -> PgResult<Vec<TableSizes>> {
    let placements = placement_sizes(tables, catalog, parts).await?;
    Ok(sum_by_table(tables.len(), &placements))
}

fn sum_by_table(tables: usize, placements: &[PlacementSize]) -> Vec<TableSizes> {
    let mut sizes = vec![TableSizes::default(); tables];
    for p in placements.iter().filter(|p| p.first_copy) {
        if let Some(size) = sizes.get_mut(p.table) {
            size.relation += p.sizes.relation;
            size.table += p.sizes.table;
            size.total += p.sizes.total;
        }
    }
    sizes
}

/// Fills the session's temporary tables of table sizes (`citus_tables`, the
/// size functions) and of placement sizes (`citus_shards`).
async fn sizes_script(catalog: &Catalog, parts: &mut Participants) -> PgResult<String> {
    let tables: Vec<Arc<DistributedTable>> = catalog.tables().cloned().collect();
    let placements = placement_sizes(&tables, catalog, parts).await?;
    let sizes = sum_by_table(tables.len(), &placements);
    let mut script = String::from(
        "CREATE TEMP TABLE IF NOT EXISTS tessera_shard_sizes (logicalrelid oid PRIMARY KEY, relation_size bigint, table_size bigint, total_size bigint);
         DELETE FROM pg_temp.tessera_shard_sizes;
         CREATE TEMP TABLE IF NOT EXISTS tessera_placement_sizes (shardid bigint, groupid int, total_size bigint, PRIMARY KEY (shardid, groupid));
         DELETE FROM pg_temp.tessera_placement_sizes;",
    );
    if !tables.is_empty() {
        let rows: Vec<String> = tables.iter().zip(&sizes).map(|(t, s)| format!("({}, {}, {}, {})", t.oid, s.relation, s.table, s.total)).collect();
        let _ = write!(script, "INSERT INTO pg_temp.tessera_shard_sizes VALUES {};", rows.join(", "));
    }
    if !placements.is_empty() {
        let rows: Vec<String> = placements.iter().map(|p| format!("({}, {}, {})", p.shard_id, p.group_id, p.sizes.total)).collect();
        let _ = write!(script, "INSERT INTO pg_temp.tessera_placement_sizes VALUES {};", rows.join(", "));
    }
    Ok(script)
}

fn report_script(needs: &ClusterData, report: &ProcessReport) -> String {
    let number = |n: Option<usize>| n.map_or_else(|| "NULL".to_string(), |n| n.to_string());
    let mut script = String::new();
    let mut fill = |name: &str, rows: Vec<String>| fill_gathered(&mut script, name, &rows);
    if needs.pools {
        let rows = report
            .pools
            .iter()
            .map(|p| format!("({}, {}, {}, {}, {}, {})", quote_literal(&p.node), p.open, p.idle, number(p.limit), report.blocks, report.blocks_limit))
            .collect();
        fill("pool_usage", rows);
    }
    if needs.sessions {
        let rows = report
            .sessions
            .iter()
            .map(|s| {
                format!(
                    "({}, {}, {}, {})",
                    quote_literal(&s.name),
                    quote_literal(&s.user),
                    s.connections,
                    s.pinned.map_or_else(|| "NULL".to_string(), quote_literal)
                )
            })
            .collect();
        fill("client_session", rows);
    }
    script
}

/// Appends to `script` the statements that fill the session's temporary
/// table `tessera_<name>` (shaped like `tessera.<name>`) with `rows`, each
/// a VALUES row, anew; the rows go in batches, as there may be many.
fn fill_gathered(script: &mut String, name: &str, rows: &[String]) {
    let _ = write!(script, "CREATE TEMP TABLE IF NOT EXISTS tessera_{name} (LIKE tessera.{name}); DELETE FROM pg_temp.tessera_{name};");
    for chunk in rows.chunks(1000) {
        let _ = write!(script, "INSERT INTO pg_temp.tessera_{name} VALUES {};", chunk.join(", "));
    }
}

/// The process's statistics, into the temporary tables the
/// `citus_stat_*` views read.
fn stats_script(needs: &ClusterData, stats: &Stats) -> String {
    let mut script = String::new();
    let mut fill = |name: &str, rows: Vec<String>| fill_gathered(&mut script, name, &rows);
    const DATABASE: &str = "(SELECT oid FROM pg_catalog.pg_database WHERE datname = pg_catalog.current_database())";
    let millis = |d: std::time::Duration| d.as_secs_f64() * 1000.0;
    if needs.statements {
        let rows = stats
            .statements
            .rows()
            .into_iter()
            .map(|r| {
                format!(
                    "({}, coalesce(pg_catalog.to_regrole({})::oid, 0), {DATABASE}, {}, {}, {}, {}, {}, {}, {})",
                    r.key.queryid,
                    quote_literal(&quote_ident(&r.key.user)),
                    quote_literal(&r.query),
                    quote_literal(r.key.tier.name()),
                    r.key.partition_key.as_deref().map_or_else(|| "NULL".to_string(), quote_literal),
                    r.calls,
                    millis(r.total),
                    millis(r.total) / r.calls.max(1) as f64,
                    r.rows
                )
            })
            .collect();
        fill("stat_statement", rows);
    }
    if needs.tenants {
        let seconds = |d: std::time::Duration| d.as_secs_f64();
        let rows = stats
            .tenants
            .rows()
            .into_iter()
            .map(|r| {
                format!(
                    "({}, {}, {}, {}, {}, {}, {}, {})",
                    r.colocation_id,
                    quote_literal(&r.tenant),
                    r.this.reads,
                    r.last.reads,
                    r.this.queries,
                    r.last.queries,
                    seconds(r.this.time),
                    seconds(r.last.time)
                )
            })
            .collect();
        fill("stat_tenant", rows);
    }
    if needs.counters {
        let values: Vec<String> = Counter::ALL.iter().map(|c| stats.counters.get(*c).to_string()).collect();
        let reset = stats.counters.reset_at().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_secs_f64();
        fill("stat_counter", vec![format!("({DATABASE}, pg_catalog.current_database(), {}, pg_catalog.to_timestamp({reset}))", values.join(", "))]);
    }
    script
}

async fn activity_script(catalog: &Catalog, parts: &mut Participants) -> PgResult<String> {
    // The coordinator database is node 0, as the coordinator is in Citus.
    let script = String::from(
        "CREATE TEMP TABLE IF NOT EXISTS tessera_cluster_activity (LIKE tessera.cluster_activity);
         DELETE FROM pg_temp.tessera_cluster_activity;
         INSERT INTO pg_temp.tessera_cluster_activity SELECT pid, 0, false, * FROM pg_catalog.pg_stat_activity;",
    );
    let prefix = crate::transaction::TRANSACTION_ID_PREFIX;
    node_rows_script(script, "tessera_cluster_activity", catalog, parts, |id| {
        format!("SELECT {id}::bigint * {GLOBAL_PID_FACTOR} + pid, {id}, coalesce(application_name LIKE '{prefix}%', false), * FROM pg_catalog.pg_stat_activity")
    })
    .await
}

/// Every node's waiting backends and the backends they wait for, by global pid.
async fn lock_waits_script(catalog: &Catalog, parts: &mut Participants) -> PgResult<String> {
    const WAITS: &str =
        "SELECT pid, unnest(pg_catalog.pg_blocking_pids(pid)) AS blocker FROM pg_catalog.pg_stat_activity WHERE wait_event_type = 'Lock'";
    let script = format!(
        "CREATE TEMP TABLE IF NOT EXISTS tessera_cluster_lock_wait (LIKE tessera.cluster_lock_wait);
         DELETE FROM pg_temp.tessera_cluster_lock_wait;
         INSERT INTO pg_temp.tessera_cluster_lock_wait SELECT w.pid, w.blocker, 0, 0 FROM ({WAITS}) w;"
    );
    node_rows_script(script, "tessera_cluster_lock_wait", catalog, parts, |id| {
        format!("SELECT {id}::bigint * {GLOBAL_PID_FACTOR} + w.pid, {id}::bigint * {GLOBAL_PID_FACTOR} + w.blocker, {id}, {id} FROM ({WAITS}) w")
    })
    .await
}

/// Whether each active node reaches every active node, itself included, as
/// the session's role: each node tries a connection of its own to each
/// (`tessera_remote.reaches`, with the role's certificate where the cluster
/// has a CA). A node the coordinator cannot reach reaches nothing (NULL,
/// as Citus reports it).
async fn node_health_script(catalog: &Catalog, login: &crate::config::Login) -> String {
    let nodes: Vec<_> = catalog.active_nodes().collect();
    let targets: Vec<String> = nodes.iter().map(|n| format!("({}, {})", quote_literal(&n.addr.host), n.addr.port)).collect();
    let mut script = String::from(
        "CREATE TEMP TABLE IF NOT EXISTS tessera_node_health (LIKE tessera.node_health);
         DELETE FROM pg_temp.tessera_node_health;",
    );
    for from in &nodes {
        let answers = match PgConnection::connect(&from.addr, login).await {
            Ok(mut conn) => {
                let sql = format!("SELECT t.port, tessera_remote.reaches(t.host, t.port) FROM (VALUES {}) AS t (host, port)", targets.join(", "));
                let rows = conn.query(&sql).await.ok();
                conn.terminate().await;
                rows
            }
            Err(_) => None,
        };
        for to in &nodes {
            let result = answers
                .as_ref()
                .and_then(|rows| rows.iter().find(|r| r[0].as_deref() == Some(to.addr.port.to_string().as_str())))
                .and_then(|r| r[1].clone())
                .map_or_else(|| "NULL".to_string(), |value| quote_literal(&value));
            let _ = write!(
                script,
                "INSERT INTO pg_temp.tessera_node_health VALUES ({}, {}, {}, {}, {result});",
                quote_literal(&from.addr.host),
                from.addr.port,
                quote_literal(&to.addr.host),
                to.addr.port
            );
        }
    }
    script
}

/// `script` followed by an INSERT into the session's temporary table `table`
/// of the rows `sql(node id)` gives on every active node, read through the
/// session's connections.
async fn node_rows_script(
    mut script: String,
    table: &str,
    catalog: &Catalog,
    parts: &mut Participants,
    sql: impl Fn(i32) -> String,
) -> PgResult<String> {
    for node in catalog.active_nodes() {
        let worker = parts.worker(node, Access::Read).await?;
        let rows = worker.conn.query(&sql(node.id)).await?;
        if rows.is_empty() {
            continue;
        }
        let values: Vec<String> = rows
            .iter()
            .map(|row| {
                let fields: Vec<String> = row.iter().map(|v| v.as_deref().map_or_else(|| "NULL".to_string(), quote_literal)).collect();
                format!("({})", fields.join(", "))
            })
            .collect();
        let _ = write!(script, "INSERT INTO pg_temp.{table} VALUES {};", values.join(", "));
    }
    Ok(script)
}
