//! A latency histogram of atomic buckets: observing is a few relaxed adds,
//! and the `/metrics` endpoint reads it as a Prometheus histogram.

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

    /// The sum of the observations in seconds, their count, and the count
    /// in each bucket by its upper bound (not cumulative), the last one's
    /// bound infinite: as OpenMetrics encoders take them.
    pub fn snapshot(&self) -> (f64, u64, Vec<(f64, u64)>) {
        let bounds = LATENCY_BUCKETS_SECONDS.iter().copied().chain([f64::INFINITY]);
        let buckets: Vec<(f64, u64)> = bounds.zip(&self.buckets).map(|(bound, count)| (bound, count.load(Relaxed))).collect();
        let count = buckets.iter().map(|(_, n)| n).sum();
        (self.sum_nanos.load(Relaxed) as f64 / 1e9, count, buckets)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn observations_land_in_their_buckets_and_the_slowest_past_every_bound() {
        let h = Histogram::default();
        for micros in [50, 50, 700, 3_000, 60_000_000] {
            h.observe(Duration::from_micros(micros));
        }
        let (sum, count, buckets) = h.snapshot();
        assert_eq!(count, 5);
        assert!((sum - 60.0038).abs() < 1e-6, "{sum}");
        let at = |bound: f64| buckets.iter().find(|(b, _)| *b == bound).unwrap().1;
        assert_eq!((at(0.0001), at(0.001), at(0.005), at(f64::INFINITY)), (2, 1, 1, 1));
        assert_eq!(buckets.iter().map(|(_, n)| n).sum::<u64>(), 5);
    }
}
