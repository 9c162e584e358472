//! Connections to the nodes shared by the sessions of one coordinator
//! process. A session holds a node connection only while it needs it (for
//! its transaction block, or the exchange in progress) and gives it back
//! between transactions; each node has a bounded number of them open, as
//! Citus's `citus.max_shared_pool_size` bounds its coordinator's. What the
//! pool keeps is generic (`T`), so that this module knows nothing of the
//! state a session leaves on a connection.

use super::PgConnection;
use crate::error::{sqlstate, PgError, PgResult};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The shared connections of every node, by node group.
pub struct Pools<T> {
    nodes: Mutex<HashMap<i32, Arc<NodePool<T>>>>,
    /// Connections open per node at most; None: sized from the node's
    /// `max_connections` once the first connection tells it.
    limit: Option<usize>,
    /// How long a session waits for a connection when its node has none free.
    pub wait: Duration,
}

/// One node's connections: the idle ones, by what they logged in with (the
/// role and start-up settings: the caller's key), and one permit per
/// connection open.
pub struct NodePool<T> {
    idle: Mutex<HashMap<String, Vec<T>>>,
    slots: Arc<Semaphore>,
    /// Slots beyond the limit for sessions that may not wait (`checkout`'s
    /// `may_exceed`): a fifth of the limit more, short of the node's own.
    overflow: Arc<Semaphore>,
    /// Wakes a session waiting for a connection when one is given back.
    returned: tokio::sync::Notify,
    /// Set once the node's own limit has been read (or a configured one applied).
    sized: std::sync::atomic::AtomicBool,
}

fn overflow_for(limit: usize) -> usize {
    limit / 5 + 1
}

/// What `NodePool::checkout` found.
pub enum Checkout<T> {
    /// An idle connection to reuse.
    Idle(T),
    /// Room to open a new connection: its slot.
    Open(OwnedSemaphorePermit),
}

/// The node's share of connections a pool takes when sized from its
/// `max_connections`: the rest stays for other clients of the node
/// (worker-to-worker foreign scans, maintenance, psql).
const SHARE_OF_NODE: f64 = 0.8;

impl<T> Pools<T> {
    pub fn new(limit: Option<usize>, wait: Duration) -> Self {
        Pools { nodes: Mutex::new(HashMap::new()), limit, wait }
    }

    /// The pool of node group `group`.
    pub fn node(&self, group: i32) -> Arc<NodePool<T>> {
        let mut nodes = self.nodes.lock().unwrap();
        nodes.entry(group).or_insert_with(|| Arc::new(NodePool::new(self.limit))).clone()
    }
}

impl<T> NodePool<T> {
    /// A pool of `limit` connections; None: sized from the node's
    /// `max_connections` by its first connection (which until then is the
    /// only one that may be opened).
    pub fn new(limit: Option<usize>) -> Self {
        let (permits, sized) = match limit {
            Some(n) => (n.max(1), true),
            None => (1, false),
        };
        let overflow = if sized { overflow_for(permits) } else { 0 };
        NodePool {
            idle: Mutex::new(HashMap::new()),
            slots: Arc::new(Semaphore::new(permits)),
            overflow: Arc::new(Semaphore::new(overflow)),
            returned: tokio::sync::Notify::new(),
            sized: sized.into(),
        }
    }

    fn take_idle(&self, key: &str, prefer: &(dyn Fn(&T) -> bool + Sync)) -> Option<T> {
        let mut idle = self.idle.lock().unwrap();
        let list = idle.get_mut(key)?;
        match list.iter().rposition(prefer) {
            Some(at) => Some(list.swap_remove(at)),
            None => list.pop(),
        }
    }

    /// Gives a connection back for other sessions.
    pub fn give_back(&self, key: &str, conn: T) {
        let mut idle = self.idle.lock().unwrap();
        match idle.get_mut(key) {
            Some(list) => list.push(conn),
            None => {
                idle.insert(key.to_string(), vec![conn]);
            }
        }
        drop(idle);
        self.returned.notify_one();
    }

    /// A connection for a session whose connections log in with `key`: an
    /// idle one (preferring the one `prefer` picks, the session's own from
    /// last time, whose state needs no reset), else room to open one. When
    /// the node has its limit open, idle connections of other keys are
    /// closed to make room; failing that, the session waits up to `wait` for
    /// a connection to come back or close. `may_exceed`: the session already
    /// holds another node's connection in its block, and waiting could wait
    /// forever on sessions waiting for that node in turn; it opens one over
    /// the limit instead, while the overflow lasts.
    pub async fn checkout(&self, key: &str, prefer: &(dyn Fn(&T) -> bool + Sync), wait: Duration, may_exceed: bool, node: &str) -> PgResult<Checkout<T>> {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let returned = self.returned.notified();
            tokio::pin!(returned);
            returned.as_mut().enable();
            if let Some(conn) = self.take_idle(key, prefer) {
                return Ok(Checkout::Idle(conn));
            }
            if let Ok(permit) = self.slots.clone().try_acquire_owned() {
                return Ok(Checkout::Open(permit));
            }
            if self.close_one_idle() {
                continue;
            }
            if may_exceed {
                if let Ok(permit) = self.overflow.clone().try_acquire_owned() {
                    return Ok(Checkout::Open(permit));
                }
            }
            tokio::select! {
                Ok(permit) = self.slots.clone().acquire_owned() => return Ok(Checkout::Open(permit)),
                _ = &mut returned => continue,
                _ = tokio::time::sleep_until(deadline) => {
                    return Err(PgError::new(sqlstate::TOO_MANY_CONNECTIONS, format!("too many connections to node {node}: every one of its pooled connections stayed busy for {wait:.0?}"))
                        .with_hint("Raise the node's max_connections (the pool takes 80% of it) or [connections] max_per_node, or lower the number of clients in transaction blocks at once."));
                }
            }
        }
    }

    /// Sizes the pool (unless configured, and once) from the node's
    /// `max_connections`, read on `conn`, the pool's first connection.
    pub async fn size_from(&self, conn: &mut PgConnection) -> PgResult<()> {
        if self.sized.load(std::sync::atomic::Ordering::Acquire) {
            return Ok(());
        }
        let node_max_connections: usize = conn.query_value("SHOW max_connections").await?.and_then(|v| v.parse().ok()).unwrap_or(100);
        if self.sized.swap(true, std::sync::atomic::Ordering::AcqRel) {
            return Ok(());
        }
        let size = ((node_max_connections as f64) * SHARE_OF_NODE) as usize;
        self.slots.add_permits(size.saturating_sub(1));
        self.overflow.add_permits(overflow_for(size.max(1)));
        Ok(())
    }

    fn close_one_idle(&self) -> bool {
        let mut idle = self.idle.lock().unwrap();
        idle.values_mut().find_map(|list| list.pop()).is_some()
    }
}
