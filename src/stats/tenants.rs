//! `citus_stat_tenants`: reads, statements and time per tenant (a routed
//! statement's distribution-key value in its co-location group), in the
//! current period and the one before, for the busiest tenants.

use super::striped::{Striped, STRIPES};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct PeriodCounts {
    pub reads: u64,
    pub queries: u64,
    pub time: Duration,
}

#[derive(Clone, Copy, Debug)]
struct Entry {
    /// The number of the period `this` counts.
    period: u64,
    this: PeriodCounts,
    last: PeriodCounts,
}

impl Entry {
    /// The entry as of period `now`: counts of periods gone by move back.
    fn as_of(self, now: u64) -> Entry {
        match now.saturating_sub(self.period) {
            0 => self,
            1 => Entry { period: now, this: PeriodCounts::default(), last: self.this },
            _ => Entry { period: now, this: PeriodCounts::default(), last: PeriodCounts::default() },
        }
    }

    fn score(&self) -> u64 {
        self.this.queries + self.last.queries
    }
}

/// One row of the view, before the coordinator adds the tenant's node.
#[derive(Clone, Debug, PartialEq)]
pub struct TenantRow {
    pub colocation_id: i32,
    pub tenant: Arc<str>,
    pub this: PeriodCounts,
    pub last: PeriodCounts,
}

pub struct TenantStats {
    entries: Striped<(i32, Arc<str>), Entry>,
    limit: usize,
    per_stripe: usize,
    period: Duration,
    started: Instant,
}

impl TenantStats {
    pub fn new(limit: usize, period: Duration) -> Self {
        TenantStats { entries: Striped::default(), limit, per_stripe: (3 * limit).div_ceil(STRIPES).max(1), period, started: Instant::now() }
    }

    fn period_now(&self) -> u64 {
        (self.started.elapsed().as_nanos() / self.period.as_nanos().max(1)) as u64
    }

    /// Counts a statement for a tenant. When the tenants are many, one seen
    /// for the first time lately is not taken in: only tenants that come
    /// back can be among the busiest, and a stream of tenants that never
    /// do would otherwise evict one on every call.
    pub(super) fn record(&self, colocation: i32, tenant: Arc<str>, is_write: bool, elapsed: Duration) {
        let now = self.period_now();
        let key = (colocation, tenant);
        let hash = self.entries.hash(&key);
        let mut stripe = self.entries.stripe(hash);
        if !stripe.map.contains_key(&key) && stripe.map.len() >= self.per_stripe {
            if !stripe.seen_lately(hash) {
                return;
            }
            // The quietest tenant makes room.
            if let Some(quietest) = stripe.map.iter().min_by_key(|(_, e)| e.as_of(now).score()).map(|(k, _)| k.clone()) {
                stripe.map.remove(&quietest);
            }
        }
        let entry = stripe.map.entry(key).or_insert(Entry { period: now, this: PeriodCounts::default(), last: PeriodCounts::default() });
        *entry = entry.as_of(now);
        entry.this.queries += 1;
        entry.this.reads += u64::from(!is_write);
        entry.this.time += elapsed;
    }

    /// The busiest tenants (by statements in this period and the last), at
    /// most the limit, busiest first.
    pub fn rows(&self) -> Vec<TenantRow> {
        let now = self.period_now();
        let mut entries = Vec::new();
        for stripe in self.entries.stripes() {
            entries.extend(stripe.map.iter().map(|(k, e)| (k.clone(), e.as_of(now))));
        }
        entries.sort_by(|a, b| b.1.score().cmp(&a.1.score()).then_with(|| a.0.cmp(&b.0)));
        entries
            .into_iter()
            .filter(|(_, e)| e.score() > 0)
            .take(self.limit)
            .map(|((colocation_id, tenant), e)| TenantRow { colocation_id, tenant, this: e.this, last: e.last })
            .collect()
    }

    /// `citus_stat_tenants_reset()`.
    pub fn reset(&self) {
        self.entries.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_move_to_the_last_period_and_the_busiest_show() {
        let stats = TenantStats::new(2, Duration::from_millis(200));
        for _ in 0..3 {
            stats.record(1, Arc::from("7"), false, Duration::from_millis(1));
        }
        stats.record(1, Arc::from("7"), true, Duration::from_millis(1));
        stats.record(1, Arc::from("8"), false, Duration::from_millis(1));
        stats.record(1, Arc::from("9"), false, Duration::from_millis(1));
        stats.record(1, Arc::from("9"), false, Duration::from_millis(1));
        let rows = stats.rows();
        assert_eq!(rows.iter().map(|r| &*r.tenant).collect::<Vec<_>>(), ["7", "9"]);
        assert_eq!((rows[0].this.queries, rows[0].this.reads), (4, 3));
        // Wait into the next period: this period's counts become the last's.
        let period = stats.period_now();
        while stats.period_now() == period {
            std::thread::sleep(Duration::from_millis(10));
        }
        let rows = stats.rows();
        if stats.period_now() == period + 1 {
            assert_eq!((rows[0].this.queries, rows[0].last.queries), (0, 4));
        }
        stats.reset();
        assert!(stats.rows().is_empty());
    }
}
