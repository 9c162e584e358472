//! The last minutes of statements per second and mean latency per tier,
//! sampled from the process's counters at a fixed interval, for the
//! dashboard's charts.

use crate::stats::{Stats, Tier};
use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

pub const SAMPLE_EVERY: Duration = Duration::from_secs(2);
/// Samples kept: ten minutes' worth.
const KEPT: usize = 300;

#[derive(Clone)]
struct Sample {
    /// Seconds since the Unix epoch.
    at: f64,
    counts: [u64; Tier::ALL.len()],
    /// Seconds spent, per tier.
    sums: [f64; Tier::ALL.len()],
}

#[derive(Default)]
pub struct History {
    samples: Mutex<VecDeque<Sample>>,
}

impl History {
    pub fn sample(&self, stats: &Stats) {
        let at = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default().as_secs_f64();
        let mut sample = Sample { at, counts: [0; Tier::ALL.len()], sums: [0.0; Tier::ALL.len()] };
        for (i, tier) in Tier::ALL.iter().enumerate() {
            let (sum, count, _) = stats.latency(*tier).snapshot();
            sample.counts[i] = count;
            sample.sums[i] = sum;
        }
        let mut samples = self.samples.lock().unwrap();
        if samples.len() == KEPT {
            samples.pop_front();
        }
        samples.push_back(sample);
    }

    /// Per interval between samples: its end, and per tier that ran
    /// anything in the window, statements per second and their mean
    /// latency in milliseconds (null where none ran).
    pub fn series(&self) -> serde_json::Value {
        let samples: Vec<Sample> = self.samples.lock().unwrap().iter().cloned().collect();
        let active: Vec<usize> =
            (0..Tier::ALL.len()).filter(|&i| samples.first().zip(samples.last()).is_some_and(|(a, b)| b.counts[i] > a.counts[i])).collect();
        let points: Vec<serde_json::Value> = samples
            .windows(2)
            .map(|pair| {
                let (before, after) = (&pair[0], &pair[1]);
                let seconds = (after.at - before.at).max(1e-3);
                let mut rates = serde_json::Map::new();
                let mut latency = serde_json::Map::new();
                for &i in &active {
                    let ran = after.counts[i].saturating_sub(before.counts[i]);
                    let name = Tier::ALL[i].name().to_string();
                    rates.insert(name.clone(), (ran as f64 / seconds).into());
                    let mean = (ran > 0).then(|| (after.sums[i] - before.sums[i]) / ran as f64 * 1000.0);
                    latency.insert(name, mean.map_or(serde_json::Value::Null, Into::into));
                }
                serde_json::json!({ "at": after.at, "rates": rates, "latency_ms": latency })
            })
            .collect();
        serde_json::json!({
            "tiers": active.iter().map(|&i| Tier::ALL[i].name()).collect::<Vec<_>>(),
            "interval_seconds": SAMPLE_EVERY.as_secs_f64(),
            "points": points,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_and_latencies_come_from_the_differences_between_samples() {
        let stats = Stats::new(Default::default());
        let history = History::default();
        history.sample(&stats);
        for _ in 0..4 {
            stats.observe(Tier::Router, Duration::from_millis(2), 1);
        }
        history.sample(&stats);
        let series = history.series();
        assert_eq!(series["tiers"], serde_json::json!(["router"]));
        let point = &series["points"][0];
        assert!(point["rates"]["router"].as_f64().unwrap() > 0.0);
        assert!((point["latency_ms"]["router"].as_f64().unwrap() - 2.0).abs() < 1e-6);
    }
}
