//! What the process reports of its pools and sessions, for
//! `tessera.connection_pools` and `tessera.client_sessions`.

use super::Coordinator;

/// One node's connection pool in this coordinator process.
pub struct PoolUsage {
    pub node: String,
    /// Connections open, in use or idle.
    pub open: usize,
    pub idle: usize,
    /// None until the pool has read the node's `max_connections`.
    pub limit: Option<usize>,
    /// Sessions waiting for one of its connections now.
    pub waiting: usize,
    /// Times a session had to wait, since the start.
    pub waits: u64,
}

/// One client session of this coordinator process.
pub struct ClientSession {
    pub name: String,
    pub user: String,
    /// Node connections it holds now (coordinator database included).
    pub connections: usize,
    /// Why it keeps its coordinator database connection, if it does.
    pub pinned: Option<&'static str>,
}

/// What the coordinator process knows of its pools and sessions.
pub struct ProcessReport {
    pub pools: Vec<PoolUsage>,
    pub sessions: Vec<ClientSession>,
    /// Transaction blocks holding worker connections, and the most admitted at once.
    pub blocks: usize,
    pub blocks_limit: usize,
}

impl Coordinator {
    /// The process's connection pools and client sessions as they are now,
    /// for `tessera.connection_pools` and `tessera.client_sessions`.
    pub fn process_report(&self, catalog: &crate::metadata::Catalog) -> ProcessReport {
        let pool = |node: String, (open, idle, limit): (usize, usize, Option<usize>), (waiting, waits): (usize, u64)| PoolUsage {
            node,
            open,
            idle,
            limit,
            waiting,
            waits,
        };
        let mut pools =
            vec![pool(format!("{} (coordinator database)", self.config.coordinator_db_addr()), self.local_pool.usage(), self.local_pool.waits())];
        let mut workers: Vec<(i32, _)> = self.worker_pools.all();
        workers.sort_by_key(|(group, _)| *group);
        for (group, node_pool) in workers {
            let node =
                catalog.nodes.iter().find(|n| n.group_id == group).map(|n| n.addr.to_string()).unwrap_or_else(|| format!("node group {group}"));
            pools.push(pool(node, node_pool.usage(), node_pool.waits()));
        }
        let (blocks, blocks_limit) = self.worker_pools.blocks.usage();
        let mut sessions: Vec<ClientSession> = self
            .sessions
            .lock()
            .unwrap()
            .values()
            .map(|s| ClientSession {
                name: s.name.clone(),
                user: s.user.clone(),
                connections: s.cancel_targets.lock().unwrap().len(),
                pinned: s.pinned.get().copied(),
            })
            .collect();
        sessions.sort_by(|a, b| a.name.cmp(&b.name));
        ProcessReport { pools, sessions, blocks, blocks_limit }
    }
}
