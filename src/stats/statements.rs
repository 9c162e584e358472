//! `citus_stat_statements`: calls, time and rows per normalised statement,
//! role, tier and partition key, in a striped map of bounded size.

use super::striped::{Striped, STRIPES};
use super::Tier;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

/// What one row of the view counts.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct StatementKey {
    /// The normalised text's hash (stable within the process).
    pub queryid: i64,
    pub user: Arc<str>,
    pub tier: Tier,
    /// The distribution-key value of a routed statement.
    pub partition_key: Option<Arc<str>>,
}

struct Entry {
    query: Arc<str>,
    calls: u64,
    total: Duration,
    rows: u64,
}

impl Entry {
    fn add(&mut self, elapsed: Duration, rows: u64) {
        self.calls += 1;
        self.total += elapsed;
        self.rows += rows;
    }
}

/// One row of `citus_stat_statements`.
#[derive(Clone, Debug)]
pub struct StatementRow {
    pub key: StatementKey,
    pub query: Arc<str>,
    pub calls: u64,
    pub total: Duration,
    pub rows: u64,
}

pub struct StatementStats {
    entries: Striped<StatementKey, Entry>,
    per_stripe: usize,
}

impl StatementStats {
    pub fn new(max: usize) -> Self {
        StatementStats { entries: Striped::default(), per_stripe: max.div_ceil(STRIPES).max(1) }
    }

    /// Counts a call. When the entries are many, a partition key seen for
    /// the first time lately is counted in its statement's entry without
    /// one: a stream of keys that never recur (a uniform spread over a
    /// million tenants) would otherwise evict and insert on every call.
    pub(super) fn record(&self, key: &StatementKey, query: &dyn Fn() -> Arc<str>, elapsed: Duration, rows: u64) {
        let hash = self.entries.hash(key);
        let mut stripe = self.entries.stripe(hash);
        if let Some(entry) = stripe.map.get_mut(key) {
            entry.add(elapsed, rows);
            return;
        }
        if stripe.map.len() >= self.per_stripe / 2 && key.partition_key.is_some() && !stripe.seen_lately(hash) {
            drop(stripe);
            let general = StatementKey { queryid: key.queryid, user: key.user.clone(), tier: key.tier, partition_key: None };
            return self.record(&general, query, elapsed, rows);
        }
        if stripe.map.len() >= self.per_stripe {
            evict_least_called(&mut stripe.map);
        }
        stripe.map.insert(key.clone(), Entry { query: query(), calls: 1, total: elapsed, rows });
    }

    /// A copy of every entry.
    pub fn rows(&self) -> Vec<StatementRow> {
        let mut rows = Vec::new();
        for stripe in self.entries.stripes() {
            rows.extend(stripe.map.iter().map(|(key, e)| StatementRow {
                key: key.clone(),
                query: e.query.clone(),
                calls: e.calls,
                total: e.total,
                rows: e.rows,
            }));
        }
        rows
    }

    /// `citus_stat_statements_reset()`.
    pub fn reset(&self) {
        self.entries.clear();
    }
}

/// Makes room in a full stripe: the tenth of its entries called least go at
/// once, so that a stream of new keys does not scan it on every insert.
fn evict_least_called<S: std::hash::BuildHasher>(stripe: &mut HashMap<StatementKey, Entry, S>) {
    let mut calls: Vec<u64> = stripe.values().map(|e| e.calls).collect();
    let cut = (calls.len() / 10).max(1) - 1;
    let (_, threshold, _) = calls.select_nth_unstable(cut);
    let threshold = *threshold;
    let mut dropped = 0;
    let limit = cut + 1;
    stripe.retain(|_, e| {
        if dropped < limit && e.calls <= threshold {
            dropped += 1;
            return false;
        }
        true
    });
}

/// A statement's id for the view: a hash of its normalised text.
pub fn queryid_of(normalized: &str) -> i64 {
    // FNV-1a: stable across processes and runs, unlike the std hasher.
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in normalized.bytes() {
        hash ^= byte as u64;
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    hash as i64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(queryid: i64, partition_key: Option<&str>) -> StatementKey {
        StatementKey { queryid, user: Arc::from("alice"), tier: Tier::Router, partition_key: partition_key.map(Arc::from) }
    }

    #[test]
    fn calls_add_up_per_key_and_the_least_called_go_when_full() {
        let stats = StatementStats::new(STRIPES * 10);
        let text = || Arc::<str>::from("SELECT $1");
        for _ in 0..5 {
            stats.record(&key(1, Some("7")), &text, Duration::from_millis(2), 1);
        }
        stats.record(&key(1, Some("8")), &text, Duration::from_millis(1), 0);
        let rows = stats.rows();
        let seven = rows.iter().find(|r| r.key.partition_key.as_deref() == Some("7")).unwrap();
        assert_eq!((seven.calls, seven.total, seven.rows), (5, Duration::from_millis(10), 5));
        // Far more keys than room, each seen twice: the busy one stays, the
        // total is bounded, keys that recur get entries of their own and
        // first sights count in the statement's entry without a key.
        for i in 0..10_000 {
            for _ in 0..2 {
                stats.record(&key(2, Some(&i.to_string())), &text, Duration::from_micros(1), 0);
            }
        }
        let rows = stats.rows();
        assert!(rows.len() <= STRIPES * 10, "{}", rows.len());
        assert!(rows.iter().any(|r| r.key.partition_key.as_deref() == Some("7")));
        assert!(rows.iter().filter(|r| r.key.queryid == 2 && r.key.partition_key.is_some()).count() > STRIPES);
        assert!(rows.iter().any(|r| r.key.queryid == 2 && r.key.partition_key.is_none() && r.calls >= 100));
        stats.reset();
        assert!(stats.rows().is_empty());
    }

    #[test]
    fn queryids_are_stable() {
        assert_eq!(queryid_of("SELECT $1"), queryid_of("SELECT $1"));
        assert_ne!(queryid_of("SELECT $1"), queryid_of("SELECT $2"));
    }
}
