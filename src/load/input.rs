//! The loader's input side: which bytes each reader takes, and how a reader
//! turns them into per-shard batches of rows.

use super::writer::{Batch, Rejects, Shipment};
use crate::copy::{field, CopyFormat, Format, KeyField, RowReader};
use crate::hash::{self, HashType};
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use tokio::sync::mpsc::Sender;

/// Plain files at least this large are split between readers.
const SPLIT_MIN_BYTES: u64 = 16 << 20;

#[derive(Clone, Debug)]
pub enum Source {
    Stdin,
    File(PathBuf),
}

/// A piece of input one reader takes on its own.
#[derive(Clone, Debug)]
pub struct Unit {
    pub source: Source,
    /// For messages: the file name, or "stdin".
    pub name: String,
    /// Byte range of a plain file (None: all of it, decompressed as needed).
    pub range: Option<(u64, u64)>,
    /// Lines before the range, so that line numbers are the file's.
    pub lines_before: u64,
    /// The range starts the file, whose first line is a header.
    pub header: bool,
    /// Bytes to read, when known (for the ETA).
    pub len: Option<u64>,
}

/// Expands the inputs (globs, `-`) into units; plain files large enough are
/// split at row boundaries so that `jobs` readers can share them.
pub fn units(inputs: &[String], format: &CopyFormat, header: bool, jobs: usize) -> anyhow::Result<Vec<Unit>> {
    let mut files = Vec::new();
    for input in inputs {
        if input == "-" {
            files.push(Source::Stdin);
            continue;
        }
        let matches: Vec<PathBuf> = glob::glob(input)?.collect::<Result<_, _>>()?;
        if matches.is_empty() {
            anyhow::bail!("no input matches {input}");
        }
        files.extend(matches.into_iter().map(Source::File));
    }
    let mut units = Vec::new();
    for source in files {
        let Source::File(path) = &source else {
            units.push(Unit { source, name: "stdin".into(), range: None, lines_before: 0, header, len: None });
            continue;
        };
        let name = path.display().to_string();
        let compressed = is_compressed(path);
        let len = std::fs::metadata(path)?.len();
        if compressed || jobs <= 1 || len < SPLIT_MIN_BYTES || format.format == Format::Binary {
            units.push(Unit { source: source.clone(), name, range: None, lines_before: 0, header, len: (!compressed).then_some(len) });
            continue;
        }
        let cuts = row_boundaries(path, format, len, jobs)?;
        let mut start = (0u64, 0u64);
        for (i, end) in cuts.into_iter().chain(std::iter::once((len, 0))).enumerate() {
            if end.0 > start.0 {
                units.push(Unit { source: source.clone(), name: name.clone(), range: Some((start.0, end.0)), lines_before: start.1, header: header && i == 0, len: Some(end.0 - start.0) });
            }
            start = end;
        }
    }
    // Readers pop from the end: take the inputs in the order given.
    units.reverse();
    Ok(units)
}

fn is_compressed(path: &std::path::Path) -> bool {
    matches!(path.extension().and_then(|e| e.to_str()), Some("gz" | "zst"))
}

/// Offsets (with the line count before each) where rows start, near every
/// `len / parts` bytes: after a line feed, outside CSV quotes.
fn row_boundaries(path: &std::path::Path, format: &CopyFormat, len: u64, parts: usize) -> anyhow::Result<Vec<(u64, u64)>> {
    let step = len / parts as u64;
    let mut targets = (1..parts as u64).map(|i| i * step).peekable();
    let mut cuts = Vec::new();
    let mut file = std::io::BufReader::with_capacity(1 << 20, File::open(path)?);
    let (mut offset, mut lines, mut in_quote) = (0u64, 0u64, false);
    let mut buf = vec![0u8; 1 << 20];
    let csv = format.format == Format::Csv;
    while targets.peek().is_some() {
        let n = file.read(&mut buf)?;
        if n == 0 {
            break;
        }
        for &b in &buf[..n] {
            offset += 1;
            if csv && b == format.quote {
                in_quote = !in_quote;
            } else if b == b'\n' {
                lines += 1;
                if !in_quote && targets.peek().is_some_and(|t| offset >= *t) {
                    cuts.push((offset, lines));
                    while targets.peek().is_some_and(|t| offset >= *t) {
                        targets.next();
                    }
                }
            }
        }
    }
    Ok(cuts)
}

/// Splits rows by shard for one load.
pub struct Router {
    pub format: CopyFormat,
    /// None for a reference table: every row to its one shard.
    pub key: Option<(KeyField, HashType)>,
    pub shard_count: u32,
    pub columns: usize,
    pub batch_rows: usize,
}

impl Router {
    /// Reads one unit, sending full batches to the shards' writers. Returns
    /// the rows rejected here (bad key values), which only happens with a
    /// reject file; otherwise the first bad row is an error.
    pub fn read_unit(&self, unit: &Unit, senders: &[Vec<(Arc<str>, Sender<Shipment>)>], progress: &super::Progress, rejects: Option<&Rejects>) -> anyhow::Result<u64> {
        let mut input = open(unit)?;
        let mut format = self.format.clone();
        format.header = unit.header;
        let mut reader = RowReader::new(format, self.columns);
        let mut batches: Vec<Batch> = (0..self.shard_count).map(|_| Batch::default()).collect();
        let mut buf = vec![0u8; 256 * 1024];
        let mut rejected = 0;
        loop {
            let n = input.read(&mut buf)?;
            if n == 0 {
                reader.finish();
            } else {
                reader.push(&buf[..n]);
                progress.bytes.fetch_add(n as u64, Ordering::Relaxed);
            }
            while let Some(row) = reader.next().map_err(|e| anyhow::anyhow!("{}:{}: {e}", unit.name, unit.lines_before + reader.current_line()))? {
                let line = unit.lines_before + row.line;
                let shard = match self.shard_of(row.content()) {
                    Ok(shard) => shard,
                    Err(reason) => match rejects {
                        Some(r) => {
                            r.write(&unit.name, line, &reason, row.content())?;
                            rejected += 1;
                            continue;
                        }
                        None => anyhow::bail!("{}:{line}: {reason}", unit.name),
                    },
                };
                let batch = &mut batches[shard as usize];
                batch.push(&row.data, &unit.name, line);
                progress.rows.fetch_add(1, Ordering::Relaxed);
                if batch.rows() >= self.batch_rows {
                    send(senders, shard, std::mem::take(batch))?;
                }
            }
            if n == 0 {
                break;
            }
        }
        for (shard, batch) in batches.into_iter().enumerate() {
            if batch.rows() > 0 {
                send(senders, shard as u32, batch)?;
            }
        }
        Ok(rejected)
    }

    fn shard_of(&self, content: &[u8]) -> Result<u32, String> {
        let Some((key, hash_type)) = self.key else { return Ok(0) };
        let value = field(&self.format, content, key).map_err(|e| e.to_string())?.ok_or("the distribution column is NULL")?;
        let text = std::str::from_utf8(&value).map_err(|_| "the distribution column is not valid UTF-8".to_string())?;
        let h = hash::hash_text(hash_type, text).map_err(|e| format!("cannot hash the distribution column value \"{text}\": {e}"))?;
        Ok(hash::shard_index(hash::row_hash(Some(h)), self.shard_count))
    }
}

/// Hands a batch to every placement of its shard; fails when a writer gave up
/// (its own error is the one reported).
fn send(senders: &[Vec<(Arc<str>, Sender<Shipment>)>], shard: u32, batch: Batch) -> anyhow::Result<()> {
    let batch = Arc::new(batch);
    for (shard_table, tx) in &senders[shard as usize] {
        tx.blocking_send(Shipment { shard_table: shard_table.clone(), batch: batch.clone() }).map_err(|_| anyhow::anyhow!("a shard writer stopped"))?;
    }
    Ok(())
}

fn open(unit: &Unit) -> anyhow::Result<Box<dyn Read + Send>> {
    let path = match &unit.source {
        Source::Stdin => return Ok(Box::new(std::io::stdin())),
        Source::File(path) => path,
    };
    let mut file = File::open(path).map_err(|e| anyhow::anyhow!("{}: {e}", unit.name))?;
    if let Some((start, end)) = unit.range {
        file.seek(SeekFrom::Start(start))?;
        return Ok(Box::new(std::io::BufReader::new(file).take(end - start)));
    }
    Ok(match path.extension().and_then(|e| e.to_str()) {
        Some("gz") => Box::new(flate2::read::MultiGzDecoder::new(std::io::BufReader::new(file))),
        Some("zst") => Box::new(zstd::stream::read::Decoder::new(file)?),
        _ => Box::new(file),
    })
}
