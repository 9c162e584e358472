//! `tessera load`: bulk loading that bypasses the coordinator. The catalog is
//! read from the coordinator once; then parallel readers split the input at
//! row boundaries, hash each row's distribution column with the shard hash,
//! and stream rows per shard straight to the workers with COPY, one
//! connection per worker (per shard placement with compression). Without a
//! reject file the load is one
//! distributed transaction (two-phase commit with commit records, like the
//! coordinator's own); with one, bad rows are set aside and the rest loads.

mod input;
mod writer;

use crate::config::{Login, ServerAddr};
use crate::connection::{quote_literal, PgConnection};
use crate::copy::{CopyFormat, Format, KeyField};
use crate::hash::HashType;
use input::Unit;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
pub use writer::receive;
use writer::{Placement, Rejects, Shipment};

pub struct LoadOptions {
    /// Files, glob patterns, or `-` for standard input; `.gz` and `.zst`
    /// files are decompressed.
    pub inputs: Vec<String>,
    pub table: String,
    pub format: Format,
    /// The first line of each input names the columns (skipped).
    pub header: bool,
    pub delimiter: Option<u8>,
    pub jobs: usize,
    /// Bad rows go here (with their input and line number and the reason)
    /// and the rest loads; without it, one bad row fails the whole load.
    pub reject_file: Option<PathBuf>,
    /// Rows per COPY batch sent to a shard.
    pub batch_rows: usize,
    /// Send rows zstd-compressed to a `tessera receive` the worker starts
    /// itself (COPY … FROM PROGRAM; needs a superuser and this binary on the
    /// workers' hosts, as in the embedded cluster).
    pub compress: bool,
    pub coordinator: ServerAddr,
    pub user: String,
    pub database: String,
}

/// What a load did.
#[derive(Debug)]
pub struct Summary {
    pub rows: u64,
    pub rejected: u64,
    /// Input bytes read (after decompressing input files).
    pub bytes: u64,
    /// Row data sent to the workers (after compressing, with --compress).
    pub bytes_sent: u64,
    pub elapsed: Duration,
}

impl Summary {
    pub fn line(&self, table: &str) -> String {
        let secs = self.elapsed.as_secs_f64().max(1e-6);
        let mut line = format!(
            "loaded {} rows ({:.1} MB) into {table} in {secs:.2} s: {:.0} rows/s, {:.1} MB/s",
            self.rows,
            self.bytes as f64 / 1e6,
            self.rows as f64 / secs,
            self.bytes as f64 / 1e6 / secs
        );
        line.push_str(&format!(", {:.1} MB sent to the workers", self.bytes_sent as f64 / 1e6));
        if self.rejected > 0 {
            line.push_str(&format!(", {} rows rejected", self.rejected));
        }
        line
    }
}

/// Where rows of the table go.
struct Target {
    /// Placements by shard index (a reference table has one shard).
    shards: Vec<Vec<Placement>>,
    key: Option<(KeyField, HashType)>,
    columns: usize,
}

/// Counters the progress display reads.
#[derive(Default)]
struct Progress {
    rows: AtomicU64,
    bytes: AtomicU64,
}

pub async fn run(options: LoadOptions) -> anyhow::Result<Summary> {
    let started = Instant::now();
    let login = Login {
        user: options.user.clone(),
        database: options.database.clone(),
        password: None,
        options: vec![("application_name".into(), "tessera load".into())],
    };
    let mut coordinator = PgConnection::connect(&options.coordinator, &login).await.map_err(|e| anyhow::anyhow!("{e}"))?;
    let target = read_target(&mut coordinator, &options.table).await?;
    let mut format = CopyFormat::new(options.format);
    if let Some(d) = options.delimiter {
        format.delimiter = d;
    }
    let sources = input::sources(&options.inputs)?;
    let total_bytes = input::total_len(&sources)?;
    if options.compress && options.reject_file.is_some() {
        anyhow::bail!("--compress cannot be combined with --reject-file yet");
    }
    let rejects = options.reject_file.as_ref().map(|path| Rejects::create(path)).transpose()?;
    let mut receivers = if options.compress { Some(writer::Receivers::listen().await?) } else { None };

    // One writer per node (compressed: per shard placement, as each needs a
    // COPY … FROM PROGRAM of its own), fed through bounded channels; every
    // shard knows the writers of its placements.
    let mut senders: Vec<Vec<(Arc<str>, tokio::sync::mpsc::Sender<Shipment>)>> = Vec::new();
    // Writers by node group, and (compressed) by shard table too.
    let mut writer_for: std::collections::HashMap<(i32, Option<String>), tokio::sync::mpsc::Sender<Shipment>> = Default::default();
    let mut writers = Vec::new();
    for placements in &target.shards {
        let mut shard_senders = Vec::new();
        for placement in placements {
            let key = (placement.group_id, receivers.is_some().then(|| placement.shard_table.clone()));
            let tx = match writer_for.entry(key) {
                std::collections::hash_map::Entry::Occupied(e) => e.get().clone(),
                std::collections::hash_map::Entry::Vacant(e) => {
                    let (tx, rx) = tokio::sync::mpsc::channel(8);
                    let route = match receivers.as_mut() {
                        None => writer::Route::Copy { copy_options: copy_options(&format) },
                        Some(r) => r.route(placement, &copy_options(&format))?,
                    };
                    writers.push(tokio::spawn(writer::write_placement(placement.clone(), login.clone(), route, rx, rejects.clone())));
                    e.insert(tx).clone()
                }
            };
            shard_senders.push((Arc::from(placement.shard_table.as_str()), tx));
        }
        senders.push(shard_senders);
    }
    drop(writer_for);
    if let Some(r) = receivers {
        tokio::spawn(r.accept());
    }

    let progress = Arc::new(Progress::default());
    let show = tokio::spawn(show_progress(progress.clone(), total_bytes, started));
    let (unit_tx, units) = std::sync::mpsc::channel();
    let producer = {
        let (format, header, jobs) = (format.clone(), options.header, options.jobs);
        tokio::task::spawn_blocking(move || input::produce_units(sources, &format, header, jobs, unit_tx))
    };
    let queue = Arc::new(std::sync::Mutex::new(units));
    let router = Arc::new(input::Router {
        format: format.clone(),
        key: target.key,
        shard_count: target.shards.len() as u32,
        columns: target.columns,
        batch_rows: options.batch_rows,
    });
    let mut readers = Vec::new();
    for _ in 0..options.jobs.max(1) {
        let (queue, router, senders, progress, rejects) = (queue.clone(), router.clone(), senders.clone(), progress.clone(), rejects.clone());
        readers.push(tokio::task::spawn_blocking(move || -> anyhow::Result<u64> {
            let mut rejected = 0;
            loop {
                let next = queue.lock().unwrap().recv();
                let Ok(unit): Result<Unit, _> = next else { return Ok(rejected) };
                rejected += router.read_unit(&unit, &senders, &progress, rejects.as_ref())?;
            }
        }));
    }
    drop(senders);
    let mut failure: Option<anyhow::Error> = None;
    let mut rejected = 0;
    for reader in readers {
        match reader.await? {
            Ok(n) => rejected += n,
            Err(e) => {
                failure.get_or_insert(e);
            }
        }
    }
    // A scan that failed part-way left the rest of its file unread.
    if let Err(e) = producer.await? {
        failure.get_or_insert(e);
    }
    let mut connections = Vec::new();
    for w in writers {
        match w.await? {
            Ok(done) => {
                rejected += done.rejected;
                connections.push(done);
            }
            Err(e) => {
                // A writer's own failure explains a reader's "channel closed".
                failure = Some(e);
            }
        }
    }
    show.abort();
    if let Some(e) = failure {
        writer::roll_back(connections).await;
        coordinator.terminate().await;
        return Err(e);
    }
    let bytes_sent = connections.iter().map(|w| w.bytes_sent).sum();
    let rows = writer::commit(connections).await?;
    coordinator.terminate().await;
    if std::io::stderr().is_terminal() {
        eprintln!();
    }
    // Reference-table rows were written once per placement.
    let per_row = target.shards.first().map(|p| p.len()).unwrap_or(1).max(1) as u64;
    let rows = if target.key.is_none() { rows / per_row } else { rows };
    Ok(Summary { rows, rejected, bytes: progress.bytes.load(Ordering::Relaxed), bytes_sent, elapsed: started.elapsed() })
}

fn copy_options(format: &CopyFormat) -> String {
    let name = match format.format {
        Format::Csv => "csv",
        Format::Text => "text",
        Format::Binary => "binary",
    };
    format!("FORMAT {name}, DELIMITER {}", quote_literal(&(format.delimiter as char).to_string()))
}

/// The table's shards, placements and distribution column, from the catalog.
async fn read_target(coordinator: &mut PgConnection, table: &str) -> anyhow::Result<Target> {
    let rel = format!("{}::regclass", quote_literal(table));
    let rows = coordinator
        .query(&format!(
            "SELECT p.partmethod,
                    (SELECT a.atttypid FROM pg_attribute a WHERE a.attrelid = p.logicalrelid AND a.attname = p.partkey),
                    (SELECT count(*) FROM pg_attribute a WHERE a.attrelid = p.logicalrelid AND a.attnum > 0 AND NOT a.attisdropped),
                    (SELECT count(*) FROM pg_attribute a WHERE a.attrelid = p.logicalrelid AND a.attnum > 0 AND NOT a.attisdropped
                        AND a.attnum < (SELECT k.attnum FROM pg_attribute k WHERE k.attrelid = p.logicalrelid AND k.attname = p.partkey))
             FROM tessera.pg_dist_partition p
             WHERE p.logicalrelid = {rel}"
        ))
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let Some(row) = rows.into_iter().next() else {
        anyhow::bail!(
            "\"{table}\" is not a distributed or reference table; distribute it first with create_distributed_table() or create_reference_table()"
        );
    };
    let text = |i: usize| row[i].clone().unwrap_or_default();
    let columns: usize = text(2).parse()?;
    let key = if text(0) == "h" {
        let type_oid: u32 = text(1).parse()?;
        let hash_type = HashType::from_type_oid(type_oid)
            .ok_or_else(|| anyhow::anyhow!("tessera load cannot hash distribution columns of type oid {type_oid}"))?;
        Some((KeyField { index: text(3).parse()?, ..Default::default() }, hash_type))
    } else {
        None
    };
    let placements = coordinator
        .query(&format!(
            "SELECT s.shardindex, format('%I.%I', n2.nspname, c.relname || '_' || s.shardid), n.nodename, n.nodeport, n.groupid
             FROM tessera.pg_dist_shard s
             JOIN tessera.pg_dist_placement pl USING (shardid)
             JOIN tessera.pg_dist_node n ON n.groupid = pl.groupid AND n.noderole = 'primary'
             JOIN pg_class c ON c.oid = s.logicalrelid JOIN pg_namespace n2 ON n2.oid = c.relnamespace
             WHERE s.logicalrelid = {rel}
             ORDER BY s.shardindex, n.nodeid"
        ))
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let mut shards: Vec<Vec<Placement>> = Vec::new();
    for p in placements {
        let index: usize = p[0].as_deref().unwrap_or("0").parse()?;
        while shards.len() <= index {
            shards.push(Vec::new());
        }
        shards[index].push(Placement {
            shard_table: p[1].clone().unwrap_or_default(),
            addr: ServerAddr { host: p[2].clone().unwrap_or_default(), port: p[3].as_deref().unwrap_or("0").parse()? },
            group_id: p[4].as_deref().unwrap_or("0").parse()?,
        });
    }
    if shards.is_empty() || shards.iter().any(|s| s.is_empty()) {
        anyhow::bail!("table \"{table}\" has a shard without an active placement");
    }
    Ok(Target { shards, key, columns })
}

/// A progress line on a terminal: rows, MB, MB/s and (for plain files) ETA.
async fn show_progress(progress: Arc<Progress>, total_bytes: Option<u64>, started: Instant) {
    if !std::io::stderr().is_terminal() {
        return;
    }
    loop {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let (rows, bytes) = (progress.rows.load(Ordering::Relaxed), progress.bytes.load(Ordering::Relaxed));
        let secs = started.elapsed().as_secs_f64().max(1e-6);
        let rate = bytes as f64 / secs;
        let eta = match total_bytes {
            Some(total) if rate > 0.0 && total >= bytes => format!(", ETA {:.0} s", (total - bytes) as f64 / rate),
            _ => String::new(),
        };
        eprint!("\r{rows} rows, {:.1} MB, {:.1} MB/s{eta}    ", bytes as f64 / 1e6, rate / 1e6);
    }
}
