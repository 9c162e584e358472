//! Operations that reshape a running cluster: moving shard groups between
//! nodes, rebalancing (now or as a background job), and cleaning up after
//! operations that did not finish.

pub mod background;
pub mod cleanup;
pub mod fence;
pub mod rebalance;
pub mod shard_move;
