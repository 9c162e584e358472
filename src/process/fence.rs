//! Write fences: while a shard group is cut over to another node, this
//! coordinator process holds back every statement that may write to its
//! co-location group, so that no write reaches the old placement after the
//! catalog names the new one. A statement held back waits until the fence
//! is lifted and is then planned again under the new catalog.
//!
//! Blocks that wrote on the source node before the fence went up pass it:
//! they may hold locks the cut-over waits for, and their writes reach the
//! new placement through replication before the switch.

use crate::planner::Plan;
use arc_swap::ArcSwap;
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::watch;

struct Fence {
    id: u64,
    colocation: i32,
    source_group: i32,
    raised: Instant,
    lifted: watch::Receiver<bool>,
}

#[derive(Default)]
pub struct Fences {
    current: ArcSwap<Vec<Arc<Fence>>>,
}

/// Lifts its fence when dropped, however the cut-over ended.
pub struct Raised<'a> {
    fences: &'a Fences,
    id: u64,
    lift: watch::Sender<bool>,
}

impl Drop for Raised<'_> {
    fn drop(&mut self) {
        self.fences.current.rcu(|list| list.iter().filter(|f| f.id != self.id).cloned().collect::<Vec<_>>());
        let _ = self.lift.send(true);
    }
}

impl Fences {
    /// Holds back writes to co-location group `colocation`, whose shard group
    /// leaves node group `source_group`, until the returned guard is dropped.
    pub fn raise(&self, colocation: i32, source_group: i32) -> Raised<'_> {
        let (lift, lifted) = watch::channel(false);
        let fence = Arc::new(Fence { id: rand::random(), colocation, source_group, raised: Instant::now(), lifted });
        let id = fence.id;
        self.current.rcu(|list| {
            let mut list = list.to_vec();
            list.push(fence.clone());
            list
        });
        Raised { fences: self, id, lift }
    }

    /// What a statement planned as `plan` must wait for before it runs, if
    /// anything: `block` says when the session's block began and whether it
    /// wrote on a node group.
    pub fn holding(&self, plan: &Plan, block: Option<(Instant, &dyn Fn(i32) -> bool)>) -> Option<watch::Receiver<bool>> {
        let list = self.current.load();
        if list.is_empty() {
            return None;
        }
        list.iter()
            .find(|f| {
                plan.may_write_colocation(f.colocation) && !block.is_some_and(|(started, wrote_on)| started < f.raised && wrote_on(f.source_group))
            })
            .map(|f| f.lifted.clone())
    }
}
