//! Connections a read outside a transaction block takes besides the
//! session's own to a node, so that the node runs its shard tasks on
//! several backends at once (`citus.max_adaptive_executor_pool_size`).
//! Each acts as the session does and is a target of its cancel requests
//! while the statement holds it, and goes back to its pool when the
//! statement is done with it.

use super::*;
use crate::connection::pool::NodePool;
use tokio::sync::oneshot;

/// A connection for a statement besides the session's own to a node.
pub enum ExtraWorker {
    /// An idle connection of the pool, ready now.
    Ready(Box<ExtraConnection>),
    /// A connection being opened; the statement uses it if it arrives
    /// while tasks still wait, else it goes to the pool idle, for the
    /// next statement (the sender is gone when opening failed).
    Opening(oneshot::Receiver<ExtraConnection>),
}

/// An extra connection held by a statement. Given back with `finish`;
/// dropped without, it closes (it may be in the middle of an answer).
pub struct ExtraConnection {
    worker: Option<WorkerConnection>,
    pool: Arc<NodePool<WorkerConnection>>,
    pool_key: Arc<str>,
    cancel_targets: CancelTargets,
    backend: (ServerAddr, (i32, i32)),
}

impl ExtraConnection {
    fn new(
        worker: WorkerConnection,
        pool: Arc<NodePool<WorkerConnection>>,
        pool_key: Arc<str>,
        cancel_targets: CancelTargets,
        addr: ServerAddr,
    ) -> Self {
        let backend = (addr, worker.conn.backend_key());
        cancel_targets.lock().unwrap().push(backend.clone());
        ExtraConnection { worker: Some(worker), pool, pool_key, cancel_targets, backend }
    }

    pub fn worker(&mut self) -> &mut WorkerConnection {
        self.worker.as_mut().expect("an extra connection is taken only by finish or drop")
    }

    /// The statement is done with it: back to the pool if it is in step and
    /// outside any transaction, else closed.
    pub fn finish(mut self) {
        let Some(mut worker) = self.worker.take() else { return };
        self.forget_backend();
        if !worker.needs_sync && worker.conn.is_reusable() {
            worker.running = None;
            self.pool.give_back(&self.pool_key, worker);
        }
    }

    fn forget_backend(&self) {
        let key = self.backend.1;
        self.cancel_targets.lock().unwrap().retain(|(_, k)| *k != key);
    }
}

impl Drop for ExtraConnection {
    fn drop(&mut self) {
        if self.worker.is_some() {
            self.forget_backend();
        }
    }
}

impl Participants {
    /// One more connection to `node` for the statement running now, if it
    /// may share the node's tasks and one is free without waiting
    /// (`NodePool::try_checkout` says why it never waits). Only outside a
    /// block, and only while the session's own connection to the node is
    /// between exchanges: a block's work on a node is in the one backend
    /// that joined the block (its writes, snapshot and locks), and so is
    /// an unsynced pipeline's.
    pub fn try_extra_worker(&mut self, node: &Node) -> Option<ExtraWorker> {
        if self.block.is_some() || !node.active || self.workers.get(&node.group_id).is_none_or(|own| own.needs_sync) {
            return None;
        }
        let pool = self.node_pool(node.group_id);
        let label = node.addr.to_string();
        loop {
            let (checkout, running) = pool.try_checkout(&self.pool_key)?;
            match checkout {
                Checkout::Idle(mut worker) => {
                    if !self.adopt(&mut worker, &label) {
                        continue;
                    }
                    worker.running = running;
                    worker.last_used = std::time::Instant::now();
                    if !Arc::ptr_eq(&worker.type_oids, &node.type_oids) {
                        worker.type_oids = node.type_oids.clone();
                    }
                    let extra = ExtraConnection::new(worker, pool, self.pool_key.clone(), self.cancel_targets.clone(), node.addr.clone());
                    return Some(ExtraWorker::Ready(Box::new(extra)));
                }
                Checkout::Open(slot) => {
                    let open = self.open_worker(node, slot, running);
                    let (pool_key, cancel_targets, addr) = (self.pool_key.clone(), self.cancel_targets.clone(), node.addr.clone());
                    let (arrived, opening) = oneshot::channel();
                    // A task of its own: a statement that no longer needs
                    // the connection when it arrives does not wait for it.
                    tokio::spawn(async move {
                        match open.await {
                            Ok(worker) => {
                                if let Err(unused) = arrived.send(ExtraConnection::new(worker, pool, pool_key, cancel_targets, addr)) {
                                    unused.finish();
                                }
                            }
                            Err(e) => tracing::debug!("an extra connection to {addr} failed to open: {e}"),
                        }
                    });
                    return Some(ExtraWorker::Opening(opening));
                }
            }
        }
    }

    /// While `on`, reads run on the session's own connection to each node
    /// (see `executor_pool_size`).
    pub fn use_session_connections_only(&mut self, on: bool) {
        self.session_connections_only = on;
    }

    /// How many connections per node a read outside a block may run its
    /// tasks on: the session's `citus.max_adaptive_executor_pool_size`,
    /// else the process's, and no more than a node's pool holds.
    pub async fn executor_pool_size(&mut self) -> PgResult<usize> {
        if self.session_connections_only {
            return Ok(1);
        }
        match self.citus_settings().await?.executor_pool_size {
            PoolSizeSetting::Unset => Ok(self.pools.statement_share(self.pools.per_statement)),
            PoolSizeSetting::Size(size) => Ok(self.pools.statement_share(size)),
            PoolSizeSetting::Invalid => {
                Err(PgError::new(sqlstate::INVALID_PARAMETER_VALUE, "invalid value for parameter \"citus.max_adaptive_executor_pool_size\"")
                    .with_hint("Give a whole number of connections per worker, 1 or more (1 runs a node's shard tasks one after another)."))
            }
        }
    }
}
