//! What the coordinator process counts of its own work, for the SQL views
//! (`citus_stat_statements`, `citus_stat_tenants`, `citus_stat_counters`)
//! and the `/metrics` endpoint: statements by normalised text, tier and
//! partition key, tenants by distribution-key value, event counters, and
//! latency histograms per tier. Recording a statement that succeeds takes
//! atomics and one stripe of a striped map, never a lock the whole process
//! waits on (failed statements, which are rare, share one); the views read
//! copies.

mod counters;
mod histogram;
mod statements;
mod striped;
mod tenants;

pub use counters::{Counter, Counters};
pub use histogram::Histogram;
pub use statements::{queryid_of, StatementKey, StatementRow, StatementStats};
pub use tenants::{TenantRow, TenantStats};

pub use crate::config::StatsConfig;
use std::time::Duration;

/// How a statement ran: the executor tier that carried it out. A label of
/// the metrics and the `executor` column of `citus_stat_statements`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Tier {
    /// One shard group (or the reference tables' placements).
    Router,
    /// Every shard group, combined by the coordinator (repartitions too).
    MultiShard,
    /// The coordinator database over the shards (the general fallback).
    Fallback,
    /// A distributed function's call sent to the node of its argument.
    FunctionCall,
    /// INSERT … SELECT through the coordinator.
    InsertSelect,
    /// MERGE through the coordinator.
    Merge,
    /// COPY into or out of distributed and reference tables.
    Copy,
    /// DDL carried to the shards.
    Ddl,
    /// A cluster function (`create_distributed_table`, `citus_add_node` …).
    ClusterFunction,
    /// EXPLAIN of a distributed statement.
    Explain,
}

impl Tier {
    pub const ALL: [Tier; 10] = [
        Tier::Router,
        Tier::MultiShard,
        Tier::Fallback,
        Tier::FunctionCall,
        Tier::InsertSelect,
        Tier::Merge,
        Tier::Copy,
        Tier::Ddl,
        Tier::ClusterFunction,
        Tier::Explain,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Tier::Router => "router",
            Tier::MultiShard => "multi-shard",
            Tier::Fallback => "fallback",
            Tier::FunctionCall => "function-call",
            Tier::InsertSelect => "insert-select",
            Tier::Merge => "merge",
            Tier::Copy => "copy",
            Tier::Ddl => "ddl",
            Tier::ClusterFunction => "cluster-function",
            Tier::Explain => "explain",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// The process's statistics, shared by every session.
pub struct Stats {
    pub config: StatsConfig,
    pub counters: Counters,
    pub statements: StatementStats,
    pub tenants: TenantStats,
    latency: [Histogram; Tier::ALL.len()],
    /// Statements that failed, by the first two characters of their SQLSTATE.
    errors: std::sync::Mutex<std::collections::BTreeMap<[u8; 2], u64>>,
}

/// What a completed statement is counted under in the statement and tenant
/// statistics.
pub struct Tracked<'a> {
    pub key: &'a StatementKey,
    /// The statement's text with its constants replaced by `$n` (asked
    /// for only when the statement has no entry yet).
    pub normalized: &'a dyn Fn() -> std::sync::Arc<str>,
    /// The co-location group and distribution-key value of a routed statement.
    pub tenant: Option<(i32, std::sync::Arc<str>)>,
    pub is_write: bool,
}

impl Stats {
    pub fn new(config: StatsConfig) -> Self {
        Stats {
            statements: StatementStats::new(config.statements_max),
            tenants: TenantStats::new(config.tenants_limit, Duration::from_secs(config.tenants_period_secs.max(1))),
            config,
            counters: Counters::default(),
            latency: std::array::from_fn(|_| Histogram::default()),
            errors: Default::default(),
        }
    }

    /// Counts a statement of `tier` that completed: its latency, and the
    /// rows of a COPY.
    pub fn observe(&self, tier: Tier, elapsed: Duration, rows: u64) {
        self.latency[tier.index()].observe(elapsed);
        self.counters.add_tier(tier);
        if tier == Tier::Copy {
            self.counters.add(Counter::RowsCopied, rows);
        }
    }

    /// Counts a completed statement in the statement and tenant statistics
    /// (when tracked: see `StatsConfig::track`).
    pub fn track(&self, statement: Tracked<'_>, elapsed: Duration, rows: u64) {
        self.statements.record(statement.key, statement.normalized, elapsed, rows);
        if let Some((colocation, tenant)) = statement.tenant {
            self.tenants.record(colocation, tenant, statement.is_write, elapsed);
        }
    }

    /// Counts a statement that failed with SQLSTATE `code`.
    pub fn record_error(&self, code: &str) {
        let class: [u8; 2] = match code.as_bytes() {
            [a, b, ..] => [*a, *b],
            _ => *b"XX",
        };
        *self.errors.lock().unwrap().entry(class).or_default() += 1;
    }

    /// Failed statements by SQLSTATE class ("23", "40" …).
    pub fn errors_by_class(&self) -> Vec<(String, u64)> {
        self.errors.lock().unwrap().iter().map(|(class, n)| (String::from_utf8_lossy(class).into_owned(), *n)).collect()
    }

    pub fn latency(&self, tier: Tier) -> &Histogram {
        &self.latency[tier.index()]
    }
}
