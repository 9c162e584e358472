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
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
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
    /// Admits the transaction blocks that hold these connections.
    pub blocks: Arc<BlockGate>,
    /// Where connections opened, failed and reused are counted.
    pub stats: Arc<crate::stats::Stats>,
    /// Statements outside blocks running at once per node at most.
    active: usize,
    /// Connections one read outside a block may run its tasks on per node
    /// at most, unless the session sets `citus.max_adaptive_executor_pool_size`
    /// (1: the session's own connection only).
    pub per_statement: usize,
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
    /// The limit: configured, or read from the node's own by its first
    /// connection (0 until then).
    limit: AtomicUsize,
    /// Permits for statements outside transaction blocks to run (see
    /// `run_outside_block`); None: unbounded but for the limit.
    running: Option<Arc<Semaphore>>,
    /// Sessions waiting for a connection now, and how many waits there
    /// have been (`/metrics`).
    waiting: AtomicUsize,
    waits: AtomicU64,
}

/// Counts a session among those waiting for a connection while it lives.
struct Waiting<'a>(&'a AtomicUsize);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
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
    /// Pools counting into `stats`.
    pub fn new(limit: Option<usize>, active: usize, wait: Duration, stats: Arc<crate::stats::Stats>) -> Self {
        let blocks = Arc::new(BlockGate::new());
        if let Some(limit) = limit {
            blocks.fit(limit.max(1));
        }
        Pools { nodes: Mutex::new(HashMap::new()), limit, wait, blocks, stats, active, per_statement: 1 }
    }

    /// Lets a statement run on up to `per_statement` connections per node.
    pub fn with_per_statement(mut self, per_statement: usize) -> Self {
        self.per_statement = per_statement.max(1);
        self
    }

    /// Connections one statement could ever hold on a node: `n`, or fewer
    /// when the configured pools are smaller.
    pub fn statement_share(&self, n: usize) -> usize {
        self.limit.map_or(n, |limit| n.min(limit.max(1)))
    }

    /// Sizes `pool` as `NodePool::size_from` does, and the block gate to
    /// the smallest pool.
    pub async fn size_from(&self, pool: &NodePool<T>, conn: &mut PgConnection) -> PgResult<()> {
        if let Some(size) = pool.size_from(conn).await? {
            self.blocks.fit(size);
        }
        Ok(())
    }

    /// The node groups with a pool, and their pools.
    pub fn all(&self) -> Vec<(i32, Arc<NodePool<T>>)> {
        self.nodes.lock().unwrap().iter().map(|(group, pool)| (*group, pool.clone())).collect()
    }

    /// The pool of node group `group`.
    pub fn node(&self, group: i32) -> Arc<NodePool<T>> {
        let mut nodes = self.nodes.lock().unwrap();
        nodes.entry(group).or_insert_with(|| Arc::new(NodePool::new(self.limit).with_active_limit(self.active))).clone()
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
            limit: AtomicUsize::new(if sized { permits } else { 0 }),
            running: None,
            waiting: AtomicUsize::new(0),
            waits: AtomicU64::new(0),
        }
    }

    /// Lets at most `active` statements outside blocks run at once.
    pub fn with_active_limit(mut self, active: usize) -> Self {
        self.running = Some(Arc::new(Semaphore::new(active.max(1))));
        self
    }

    /// The right to run a statement outside a transaction block on this
    /// node, for a session holding no other connection, waiting up
    /// to `wait` while as many run as the pool allows. Held
    /// with the connection until it is given back. A pool of a few hundred
    /// connections lets a thousand clients keep a few hundred backends busy
    /// at once, which on a node of a few cores is much slower than running
    /// a few per core and queueing the rest here (pgbench select-only with
    /// 1,000 clients on this project's 2-core machines: 9k TPS against 14k).
    pub async fn run_outside_block(&self, wait: Duration, node: &str) -> PgResult<Option<OwnedSemaphorePermit>> {
        let Some(running) = &self.running else { return Ok(None) };
        if let Ok(permit) = running.clone().try_acquire_owned() {
            return Ok(Some(permit));
        }
        match tokio::time::timeout(wait, running.clone().acquire_owned()).await {
            Ok(Ok(permit)) => Ok(Some(permit)),
            _ => Err(PgError::new(
                sqlstate::TOO_MANY_CONNECTIONS,
                format!("too many statements waiting for node {node}: none could start in {wait:.0?}"),
            )
            .with_hint("Raise [connections] active_per_node, or lower the load on the node.")),
        }
    }

    /// One more connection for a statement that already holds this node's
    /// connection (and maybe others), to share its tasks: an idle one of
    /// `key`, else room to open one, with the right to run outside a block,
    /// all only if free right now. Never waits: the session holds
    /// connections already, and a session waiting for more while holding
    /// some could wait on another that waits for what this one holds, as
    /// the pool fills with such sessions; not waiting, a statement runs its
    /// tasks on what it has, and its own connection can always run them
    /// all. Takes no overflow slot either: those are for blocks that
    /// cannot do without.
    pub fn try_checkout(&self, key: &str) -> Option<(Checkout<T>, Option<OwnedSemaphorePermit>)> {
        let running = match &self.running {
            Some(running) => Some(running.clone().try_acquire_owned().ok()?),
            None => None,
        };
        if let Some(conn) = self.take_idle(key, &|_| false) {
            return Some((Checkout::Idle(conn), running));
        }
        let slot = self.slots.clone().try_acquire_owned().ok()?;
        Some((Checkout::Open(slot), running))
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
    pub async fn checkout(
        &self,
        key: &str,
        prefer: &(dyn Fn(&T) -> bool + Sync),
        wait: Duration,
        may_exceed: bool,
        node: &str,
    ) -> PgResult<Checkout<T>> {
        let deadline = tokio::time::Instant::now() + wait;
        let mut waiting = None;
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
            waiting.get_or_insert_with(|| {
                self.waits.fetch_add(1, Ordering::Relaxed);
                self.waiting.fetch_add(1, Ordering::Relaxed);
                Waiting(&self.waiting)
            });
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
    /// Returns the size when this call set it.
    pub async fn size_from(&self, conn: &mut PgConnection) -> PgResult<Option<usize>> {
        if self.limit.load(Ordering::Acquire) != 0 {
            return Ok(None);
        }
        let node_max_connections: usize = conn.query_value("SHOW max_connections").await?.and_then(|v| v.parse().ok()).unwrap_or(100);
        let size = (((node_max_connections as f64) * SHARE_OF_NODE) as usize).max(1);
        if self.limit.compare_exchange(0, size, Ordering::AcqRel, Ordering::Acquire).is_err() {
            return Ok(None);
        }
        self.slots.add_permits(size - 1);
        self.overflow.add_permits(overflow_for(size));
        Ok(Some(size))
    }

    /// The connections open (idle or in use) and idle now, and the limit
    /// (None until the pool is sized).
    pub fn usage(&self) -> (usize, usize, Option<usize>) {
        let idle = self.idle.lock().unwrap().values().map(Vec::len).sum();
        let limit = self.limit.load(Ordering::Acquire);
        let (size, overflow) = if limit == 0 { (1, 0) } else { (limit, overflow_for(limit)) };
        let open = size - self.slots.available_permits() + overflow - self.overflow.available_permits();
        (open, idle, (limit > 0).then_some(limit))
    }

    /// Sessions waiting for a connection now, and the waits so far.
    pub fn waits(&self) -> (usize, u64) {
        (self.waiting.load(Ordering::Relaxed), self.waits.load(Ordering::Relaxed))
    }

    fn close_one_idle(&self) -> bool {
        let mut idle = self.idle.lock().unwrap();
        idle.values_mut().find_map(|list| list.pop()).is_some()
    }
}

/// Bounds the transaction blocks that hold worker connections at once. A
/// block keeps its connections across statements and may take another
/// node's at any time; unbounded, the blocks could come to hold every
/// connection of two nodes, each block waiting for the other node (pgbench
/// TPC-B with 1,000 clients did, until the pools' wait ran out). Admitted
/// blocks number three quarters of the smallest pool, so a block that waits
/// for a connection waits for statements that end, never for other blocks
/// only. A block is admitted when it first takes a worker connection, and
/// leaves at its end.
pub struct BlockGate {
    permits: Arc<Semaphore>,
    /// Blocks admitted at once, as the smallest pool sized so far allows
    /// (0: no pool sized yet, one block at a time).
    size: Mutex<usize>,
    /// Permits to retire as they come back: a smaller pool shrank the gate
    /// while they were out.
    owed: Arc<AtomicUsize>,
}

/// A block's place in the gate, given back when dropped.
pub struct Admission {
    permit: Option<OwnedSemaphorePermit>,
    owed: Arc<AtomicUsize>,
}

impl Drop for Admission {
    fn drop(&mut self) {
        let Some(permit) = self.permit.take() else { return };
        if self.owed.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1)).is_ok() {
            permit.forget();
        }
    }
}

/// The blocks a pool of `pool_size` connections admits at once: the rest
/// serves statements outside blocks, which give their connections back.
fn blocks_for(pool_size: usize) -> usize {
    (pool_size * 3 / 4).max(1)
}

impl BlockGate {
    fn new() -> Self {
        BlockGate { permits: Arc::new(Semaphore::new(1)), size: Mutex::new(0), owed: Arc::new(AtomicUsize::new(0)) }
    }

    /// Fits the gate to a pool of `pool_size` connections, if it is the smallest yet.
    fn fit(&self, pool_size: usize) {
        let wanted = blocks_for(pool_size);
        let mut size = self.size.lock().unwrap();
        if *size == 0 {
            self.permits.add_permits(wanted - 1);
        } else if wanted < *size {
            let retired = self.permits.forget_permits(*size - wanted);
            self.owed.fetch_add(*size - wanted - retired, Ordering::AcqRel);
        } else {
            return;
        }
        *size = wanted;
    }

    /// Admits a block, waiting up to `wait` for one to end when the gate is full.
    pub async fn admit(&self, wait: Duration) -> PgResult<Admission> {
        match tokio::time::timeout(wait, self.permits.clone().acquire_owned()).await {
            Ok(Ok(permit)) => Ok(Admission { permit: Some(permit), owed: self.owed.clone() }),
            _ => Err(PgError::new(sqlstate::TOO_MANY_CONNECTIONS, format!("too many transaction blocks at once: no block of this coordinator ended in {wait:.0?}"))
                .with_hint("Raise the workers' max_connections or [connections] max_per_node (blocks may hold three quarters of a pool), or lower the number of clients in transaction blocks at once.")),
        }
    }

    /// Blocks admitted now, and the most the gate admits.
    pub fn usage(&self) -> (usize, usize) {
        let size = (*self.size.lock().unwrap()).max(1);
        (size.saturating_sub(self.permits.available_permits()), size)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn try_checkout_takes_only_what_is_free_now() {
        let pool: NodePool<&str> = NodePool::new(Some(2)).with_active_limit(10);
        pool.give_back("alice", "idle of alice");
        let Some((Checkout::Idle(conn), Some(_running))) = pool.try_checkout("alice") else { panic!("alice's idle connection first") };
        assert_eq!(conn, "idle of alice");
        let first = pool.try_checkout("bob").expect("a free slot");
        let second = pool.try_checkout("bob").expect("the second slot");
        assert!(matches!((&first.0, &second.0), (Checkout::Open(_), Checkout::Open(_))));
        assert!(pool.try_checkout("bob").is_none(), "every slot taken: no overflow slot, no waiting");
        drop(first);
        assert!(pool.try_checkout("bob").is_some());
        let busy: NodePool<&str> = NodePool::new(Some(5)).with_active_limit(1);
        let _running = busy.try_checkout("bob").expect("the one run permit");
        assert!(busy.try_checkout("bob").is_none(), "slots are free, but the run permit is taken");
    }

    #[tokio::test]
    async fn the_block_gate_shrinks_to_the_smallest_pool() {
        let gate = BlockGate::new();
        let first = gate.admit(Duration::from_millis(10)).await.unwrap();
        assert!(gate.admit(Duration::from_millis(10)).await.is_err(), "one block at a time before any pool is sized");
        gate.fit(8);
        assert_eq!(gate.usage(), (1, 6));
        let mut held: Vec<Admission> = Vec::new();
        for _ in 0..5 {
            held.push(gate.admit(Duration::from_millis(10)).await.unwrap());
        }
        assert!(gate.admit(Duration::from_millis(10)).await.is_err());
        // A smaller pool while every place is taken: the places retire as they come back.
        gate.fit(4);
        drop(first);
        drop(held.pop());
        drop(held.pop());
        assert!(gate.admit(Duration::from_millis(10)).await.is_err(), "three blocks still in, the gate admits three");
        drop(held.pop());
        assert!(gate.admit(Duration::from_millis(10)).await.is_ok());
        gate.fit(40);
        assert_eq!(gate.usage().1, 3, "a larger pool never widens the gate");
    }
}
