//! `/metrics`: the process's counters, pools and latency histograms and the
//! nodes' health, in the OpenMetrics text format (encoded by the
//! `prometheus-client` crate). Labels are bounded: nodes, tiers, SQLSTATE
//! classes and job states, never query text or tenant values.

use super::snapshot::{JobView, NodeView};
use crate::process::Coordinator;
use crate::stats::{Counter, Tier};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::{Registry, Unit};
use std::fmt::Error;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// The content type of the OpenMetrics text format.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The page `/metrics` serves now.
pub async fn render(coordinator: &Arc<Coordinator>) -> String {
    let nodes = super::snapshot::nodes(coordinator, false).await;
    let jobs = super::snapshot::jobs(coordinator).await;
    let mut registry = Registry::default();
    registry.register_collector(Box::new(Scrape { coordinator: coordinator.clone(), nodes, jobs }));
    let mut page = String::new();
    // Writing to a String cannot fail.
    let _ = prometheus_client::encoding::text::encode(&mut page, &registry);
    page
}

/// One scrape's view: the process's own state is read as it is encoded.
struct Scrape {
    coordinator: Arc<Coordinator>,
    nodes: Vec<NodeView>,
    jobs: Vec<JobView>,
}

impl std::fmt::Debug for Scrape {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Scrape")
    }
}

/// Writes one metric of `kind` with the values of `samples` under their labels.
fn family<L: prometheus_client::encoding::EncodeLabelSet>(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    kind: MetricType,
    samples: impl IntoIterator<Item = (L, u64)>,
) -> Result<(), Error> {
    let mut metric = encoder.encode_descriptor(name, help, None, kind)?;
    for (labels, value) in samples {
        value_of(kind, value, metric.encode_family(&labels)?)?;
    }
    Ok(())
}

/// Writes one metric of `kind` without labels.
fn single(encoder: &mut DescriptorEncoder, name: &str, help: &str, kind: MetricType, value: u64) -> Result<(), Error> {
    value_of(kind, value, encoder.encode_descriptor(name, help, None, kind)?)
}

/// Writes a counter's or a gauge's value.
fn value_of(kind: MetricType, value: u64, sample: MetricEncoder) -> Result<(), Error> {
    match kind {
        MetricType::Counter => ConstCounter::new(value).encode(sample),
        _ => ConstGauge::new(value as i64).encode(sample),
    }
}

impl Collector for Scrape {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), Error> {
        let coordinator = &self.coordinator;
        let stats = &coordinator.stats;
        let counters = &stats.counters;
        single(
            &mut encoder,
            "tessera_clients",
            "Client sessions connected to this coordinator.",
            MetricType::Gauge,
            coordinator.clients.load(Ordering::Relaxed) as u64,
        )?;

        let report = coordinator.process_report(&coordinator.catalog.snapshot());
        let pools: Vec<_> = report.pools.iter().collect();
        family(
            &mut encoder,
            "tessera_pool_connections",
            "Pooled connections to each node, open (in use or idle) and idle.",
            MetricType::Gauge,
            pools.iter().flat_map(|p| {
                [
                    ([("node", p.node.clone()), ("state", "open".into())], p.open as u64),
                    ([("node", p.node.clone()), ("state", "idle".into())], p.idle as u64),
                ]
            }),
        )?;
        family(
            &mut encoder,
            "tessera_pool_max_connections",
            "The most connections each node's pool opens (once sized from the node).",
            MetricType::Gauge,
            pools.iter().filter_map(|p| Some(([("node", p.node.clone())], p.limit? as u64))),
        )?;
        family(
            &mut encoder,
            "tessera_pool_waiting_sessions",
            "Sessions waiting now for a connection to each node.",
            MetricType::Gauge,
            pools.iter().map(|p| ([("node", p.node.clone())], p.waiting as u64)),
        )?;
        family(
            &mut encoder,
            "tessera_pool_waits",
            "Times a session had to wait for a connection to each node.",
            MetricType::Counter,
            pools.iter().map(|p| ([("node", p.node.clone())], p.waits)),
        )?;
        single(
            &mut encoder,
            "tessera_transaction_blocks",
            "Transaction blocks holding worker connections.",
            MetricType::Gauge,
            report.blocks as u64,
        )?;

        family(
            &mut encoder,
            "tessera_statements",
            "Distributed statements completed, by the tier that ran them.",
            MetricType::Counter,
            Tier::ALL.iter().map(|tier| ([("tier", tier.name())], counters.statements(*tier))),
        )?;
        let mut histogram = encoder.encode_descriptor(
            "tessera_statement_duration",
            "Time from a distributed statement's start to its last result, at the coordinator.",
            Some(&Unit::Seconds),
            MetricType::Histogram,
        )?;
        for tier in Tier::ALL {
            let (sum, count, buckets) = stats.latency(tier).snapshot();
            histogram.encode_family(&[("tier", tier.name())])?.encode_histogram::<NoLabelSet>(sum, count, &buckets, None)?;
        }
        family(
            &mut encoder,
            "tessera_commits",
            "Transaction blocks committed on workers, by commit protocol.",
            MetricType::Counter,
            [
                ([("protocol", "two_phase")], counters.get(Counter::TwoPhaseCommits)),
                ([("protocol", "one_phase")], counters.get(Counter::OnePhaseCommits)),
            ],
        )?;
        single(
            &mut encoder,
            "tessera_prepared_transactions_recovered",
            "Prepared transactions recovery committed or rolled back.",
            MetricType::Counter,
            counters.get(Counter::PreparedTransactionsRecovered),
        )?;
        family(
            &mut encoder,
            "tessera_connection_establishments",
            "Connections to workers opened, by outcome.",
            MetricType::Counter,
            [
                ([("outcome", "succeeded")], counters.get(Counter::ConnectionEstablishmentSucceeded)),
                ([("outcome", "failed")], counters.get(Counter::ConnectionEstablishmentFailed)),
            ],
        )?;
        single(
            &mut encoder,
            "tessera_connections_reused",
            "Pooled worker connections taken again.",
            MetricType::Counter,
            counters.get(Counter::ConnectionReused),
        )?;
        single(
            &mut encoder,
            "tessera_rows_copied",
            "Rows COPY moved into or out of distributed tables.",
            MetricType::Counter,
            counters.get(Counter::RowsCopied),
        )?;
        family(
            &mut encoder,
            "tessera_statement_errors",
            "Distributed statements that failed, by SQLSTATE class.",
            MetricType::Counter,
            stats.errors_by_class().into_iter().map(|(class, n)| ([("class", class)], n)),
        )?;
        family(
            &mut encoder,
            "tessera_node_up",
            "Whether each node answered this scrape (1) or not (0).",
            MetricType::Gauge,
            self.nodes.iter().map(|n| ([("node", n.address.clone()), ("role", n.role.to_string())], u64::from(n.up))),
        )?;
        family(
            &mut encoder,
            "tessera_node_database_bytes",
            "The size of each node's database.",
            MetricType::Gauge,
            self.nodes.iter().filter_map(|n| Some(([("node", n.address.clone())], n.database_bytes? as u64))),
        )?;
        let mut tasks: std::collections::BTreeMap<&str, u64> = ["done", "running", "error", "other"].into_iter().map(|s| (s, 0)).collect();
        for job in self.jobs.iter().filter(|j| !matches!(j.state.as_str(), "finished" | "cancelled" | "failed")) {
            *tasks.entry("done").or_default() += job.done as u64;
            *tasks.entry("running").or_default() += job.running as u64;
            *tasks.entry("error").or_default() += job.failed as u64;
            *tasks.entry("other").or_default() += (job.tasks - job.done - job.running - job.failed).max(0) as u64;
        }
        family(
            &mut encoder,
            "tessera_background_tasks",
            "Tasks (shard moves) of the background jobs under way, by status.",
            MetricType::Gauge,
            tasks.into_iter().map(|(status, n)| ([("status", status)], n)),
        )
    }
}
