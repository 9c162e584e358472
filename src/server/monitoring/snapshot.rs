//! What the monitoring listener reads from the servers at each request: the
//! nodes (registered in the catalog, and the coordinator database), whether
//! each answers and its database's size, optionally the size of each shard
//! table there, and the background jobs with their tasks' progress. Each
//! node is asked on a connection of its own, all at once, within a timeout,
//! so that a node that does not answer only shows as down.

use crate::connection::PgConnection;
use crate::process::Coordinator;
use std::collections::HashMap;
use std::time::Duration;

/// How long a node may take to answer before it shows as down.
const NODE_TIMEOUT: Duration = Duration::from_secs(2);

pub struct NodeView {
    /// Its `pg_dist_node` id (0 for the coordinator database).
    pub id: i32,
    pub address: String,
    /// "coordinator database", "worker", "standby" or "disabled worker".
    pub role: &'static str,
    pub up: bool,
    pub database_bytes: Option<i64>,
    /// Sizes of the shard tables it holds, by qualified name.
    pub shard_bytes: HashMap<String, i64>,
}

pub struct JobView {
    pub id: i64,
    pub state: String,
    pub description: String,
    pub tasks: i64,
    pub done: i64,
    pub running: i64,
    pub failed: i64,
}

/// The nodes as they answer now, the coordinator database first.
pub async fn nodes(coordinator: &Coordinator, with_shard_sizes: bool) -> Vec<NodeView> {
    let catalog = coordinator.catalog.snapshot();
    let mut listed: Vec<(i32, crate::config::ServerAddr, &'static str)> = vec![(0, coordinator.config.coordinator_db_addr(), "coordinator database")];
    listed.extend(catalog.nodes.iter().map(|n| (n.id, n.addr.clone(), if n.active { "worker" } else { "disabled worker" })));
    for row in
        coordinator_db_rows(coordinator, "SELECT nodeid, nodename, nodeport FROM tessera.pg_dist_node WHERE noderole = 'secondary' ORDER BY nodeid")
            .await
    {
        if let (Some(id), Some(host), Some(port)) = (int(&row, 0), row.get(1).cloned().flatten(), int(&row, 2)) {
            listed.push((id as i32, crate::config::ServerAddr { host, port: port as u16 }, "standby"));
        }
    }
    let sql = if with_shard_sizes {
        "SELECT NULL::text, pg_catalog.pg_database_size(pg_catalog.current_database())
         UNION ALL
         SELECT format('%I.%I', n.nspname, c.relname), pg_catalog.pg_total_relation_size(c.oid)
           FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
          WHERE c.relkind = 'r' AND c.relname ~ '_[0-9]+$' AND n.nspname NOT IN ('pg_catalog', 'information_schema', 'tessera', 'tessera_remote')"
    } else {
        "SELECT NULL::text, pg_catalog.pg_database_size(pg_catalog.current_database())"
    };
    let login = coordinator.config.service_login();
    let asked = listed.into_iter().map(|(id, addr, role)| {
        let login = login.clone();
        async move {
            let answer = tokio::time::timeout(NODE_TIMEOUT, PgConnection::query_once(&addr, &login, sql)).await;
            let rows = match answer {
                Ok(Ok(rows)) => Some(rows),
                _ => None,
            };
            let mut view = NodeView { id, address: addr.to_string(), role, up: rows.is_some(), database_bytes: None, shard_bytes: HashMap::new() };
            for row in rows.unwrap_or_default() {
                match row.first().cloned().flatten() {
                    None => view.database_bytes = int(&row, 1),
                    Some(name) => {
                        view.shard_bytes.insert(name, int(&row, 1).unwrap_or(0));
                    }
                }
            }
            view
        }
    });
    futures::future::join_all(asked).await
}

/// Background jobs still under way or finished in the last hour, newest first.
pub async fn jobs(coordinator: &Coordinator) -> Vec<JobView> {
    let rows = coordinator_db_rows(
        coordinator,
        "SELECT j.job_id, j.state, j.description, count(t.task_id), count(t.task_id) FILTER (WHERE t.status = 'done'),
                count(t.task_id) FILTER (WHERE t.status = 'running'), count(t.task_id) FILTER (WHERE t.status = 'error')
           FROM tessera.pg_dist_background_job j LEFT JOIN tessera.pg_dist_background_task t USING (job_id)
          WHERE j.finished_at IS NULL OR j.finished_at > now() - interval '1 hour'
          GROUP BY j.job_id ORDER BY j.job_id DESC LIMIT 20",
    )
    .await;
    rows.iter()
        .map(|row| JobView {
            id: int(row, 0).unwrap_or(0),
            state: text(row, 1),
            description: text(row, 2),
            tasks: int(row, 3).unwrap_or(0),
            done: int(row, 4).unwrap_or(0),
            running: int(row, 5).unwrap_or(0),
            failed: int(row, 6).unwrap_or(0),
        })
        .collect()
}

async fn coordinator_db_rows(coordinator: &Coordinator, sql: &str) -> crate::connection::TextRows {
    let addr = coordinator.config.coordinator_db_addr();
    match tokio::time::timeout(NODE_TIMEOUT, PgConnection::query_once(&addr, &coordinator.config.service_login(), sql)).await {
        Ok(Ok(rows)) => rows,
        _ => Vec::new(),
    }
}

fn int(row: &[Option<String>], i: usize) -> Option<i64> {
    row.get(i)?.as_deref()?.parse().ok()
}

fn text(row: &[Option<String>], i: usize) -> String {
    row.get(i).cloned().flatten().unwrap_or_default()
}
