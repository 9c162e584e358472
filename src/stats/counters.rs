//! Event counters (`citus_stat_counters`): plain atomics, added to from
//! wherever the event happens, reset together.

use super::Tier;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;
use std::time::SystemTime;

/// What is counted, in the order `citus_stat_counters` shows it: Citus's
/// columns first, then Tessera's own.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Counter {
    ConnectionEstablishmentSucceeded,
    ConnectionEstablishmentFailed,
    ConnectionReused,
    QueryExecutionSingleShard,
    QueryExecutionMultiShard,
    RowsCopied,
    TwoPhaseCommits,
    OnePhaseCommits,
    PreparedTransactionsRecovered,
    FallbackStatements,
}

impl Counter {
    pub const ALL: [Counter; 10] = [
        Counter::ConnectionEstablishmentSucceeded,
        Counter::ConnectionEstablishmentFailed,
        Counter::ConnectionReused,
        Counter::QueryExecutionSingleShard,
        Counter::QueryExecutionMultiShard,
        Counter::RowsCopied,
        Counter::TwoPhaseCommits,
        Counter::OnePhaseCommits,
        Counter::PreparedTransactionsRecovered,
        Counter::FallbackStatements,
    ];

    /// The column of `citus_stat_counters` (and the metric's name, after
    /// `tessera_`).
    pub fn name(self) -> &'static str {
        match self {
            Counter::ConnectionEstablishmentSucceeded => "connection_establishment_succeeded",
            Counter::ConnectionEstablishmentFailed => "connection_establishment_failed",
            Counter::ConnectionReused => "connection_reused",
            Counter::QueryExecutionSingleShard => "query_execution_single_shard",
            Counter::QueryExecutionMultiShard => "query_execution_multi_shard",
            Counter::RowsCopied => "rows_copied",
            Counter::TwoPhaseCommits => "two_phase_commits",
            Counter::OnePhaseCommits => "one_phase_commits",
            Counter::PreparedTransactionsRecovered => "prepared_transactions_recovered",
            Counter::FallbackStatements => "fallback_statements",
        }
    }
}

pub struct Counters {
    values: [AtomicU64; Counter::ALL.len()],
    by_tier: [AtomicU64; Tier::ALL.len()],
    reset_at: Mutex<SystemTime>,
}

impl Default for Counters {
    fn default() -> Self {
        Counters { values: Default::default(), by_tier: Default::default(), reset_at: Mutex::new(SystemTime::now()) }
    }
}

impl Counters {
    pub fn add(&self, counter: Counter, n: u64) {
        self.values[counter as usize].fetch_add(n, Relaxed);
    }

    pub fn get(&self, counter: Counter) -> u64 {
        self.values[counter as usize].load(Relaxed)
    }

    /// Counts a completed statement of `tier` (and the single- or
    /// multi-shard execution Citus counts).
    pub(super) fn add_tier(&self, tier: Tier) {
        self.by_tier[tier.index()].fetch_add(1, Relaxed);
        let kind = match tier {
            Tier::Router | Tier::FunctionCall => Some(Counter::QueryExecutionSingleShard),
            Tier::MultiShard | Tier::InsertSelect | Tier::Merge => Some(Counter::QueryExecutionMultiShard),
            Tier::Fallback => Some(Counter::FallbackStatements),
            Tier::Copy | Tier::Ddl | Tier::ClusterFunction | Tier::Explain => None,
        };
        if let Some(kind) = kind {
            self.add(kind, 1);
        }
    }

    /// Statements of `tier` completed since the process started (never
    /// reset: a Prometheus counter only grows).
    pub fn statements(&self, tier: Tier) -> u64 {
        self.by_tier[tier.index()].load(Relaxed)
    }

    /// The counters since `citus_stat_counters_reset()` (or the start).
    pub fn reset_at(&self) -> SystemTime {
        *self.reset_at.lock().unwrap()
    }

    /// `citus_stat_counters_reset()`: the view's counters start again. The
    /// metrics read the same counters, which Prometheus sees as a restart.
    pub fn reset(&self) {
        for value in &self.values {
            value.store(0, Relaxed);
        }
        *self.reset_at.lock().unwrap() = SystemTime::now();
    }
}
