//! Tessera: a distributed PostgreSQL. A Rust coordinator speaks the PostgreSQL
//! wire protocol to clients and shards tables across stock PostgreSQL workers.
//! See docs/architecture.md for the map of these modules.

pub mod certificates;
pub mod cluster;
pub mod commands;
pub mod config;
pub mod connection;
pub mod copy;
pub mod error;
pub mod executor;
pub mod hash;
pub mod load;
pub mod metadata;
pub mod operations;
pub mod planner;
pub mod process;
pub mod protocol;
pub mod server;
pub mod stats;
pub mod transaction;
pub mod transport;
pub mod walk;
