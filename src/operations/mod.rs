//! Operations that reshape a running cluster: moving shard groups between
//! nodes, rebalancing (now or as a background job), cleaning up after
//! operations that did not finish, restore points for backups, and the
//! failover of workers to their standbys.

pub mod background;
pub mod cleanup;
pub mod failover;
pub mod rebalance;
pub mod restore_point;
pub mod shard_move;
