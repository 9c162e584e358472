//! A latency histogram of atomic buckets: observing is a few relaxed adds,
//! and the `/metrics` endpoint reads it as Prometheus's cumulative buckets.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

/// The buckets' upper bounds, in seconds: from a routed point read (well
/// under a millisecond) to a heavy analytical query.
pub const LATENCY_BUCKETS_SECONDS: [f64; 14] = [0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 5.0, 30.0];

#[derive(Default)]
pub struct Histogram {
    /// Observations per bucket (not cumulative), the last past every bound.
    buckets: [AtomicU64; LATENCY_BUCKETS_SECONDS.len() + 1],
    sum_nanos: AtomicU64,
}

impl Histogram {
    pub fn observe(&self, elapsed: Duration) {
        let seconds = elapsed.as_secs_f64();
        let bucket = LATENCY_BUCKETS_SECONDS.iter().position(|bound| seconds <= *bound).unwrap_or(LATENCY_BUCKETS_SECONDS.len());
        self.buckets[bucket].fetch_add(1, Relaxed);
        self.sum_nanos.fetch_add(elapsed.as_nanos().min(u64::MAX as u128) as u64, Relaxed);
    }

    /// The sum of the observations in seconds, their count, and the
    /// cumulative count at each bound.
    pub fn snapshot(&self) -> (f64, u64, Vec<(f64, u64)>) {
        let mut cumulative = 0;
        let mut buckets = Vec::with_capacity(LATENCY_BUCKETS_SECONDS.len());
        for (bound, count) in LATENCY_BUCKETS_SECONDS.iter().zip(&self.buckets) {
            cumulative += count.load(Relaxed);
            buckets.push((*bound, cumulative));
        }
        let count = cumulative + self.buckets[LATENCY_BUCKETS_SECONDS.len()].load(Relaxed);
        (self.sum_nanos.load(Relaxed) as f64 / 1e9, count, buckets)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_cumulative_and_the_count_includes_the_slowest() {
        let h = Histogram::default();
        for micros in [50, 50, 700, 3_000, 60_000_000] {
            h.observe(Duration::from_micros(micros));
        }
        let (sum, count, buckets) = h.snapshot();
        assert_eq!(count, 5);
        assert!((sum - 60.0038).abs() < 1e-6, "{sum}");
        assert_eq!(buckets[0], (0.0001, 2));
        assert_eq!(buckets.iter().find(|(b, _)| *b == 0.001).unwrap().1, 3);
        assert_eq!(buckets.iter().find(|(b, _)| *b == 0.005).unwrap().1, 4);
        assert_eq!(buckets.last().unwrap().1, 4);
    }
}
