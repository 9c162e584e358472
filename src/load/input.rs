//! The loader's input side: which bytes each reader takes, and how a reader
//! turns them into per-shard batches of rows.

use super::writer::{Batch, Rejects, Shipment};
use crate::copy::{field, CopyFormat, Format, KeyField, RowReader, BATCH_BYTES};
use crate::hash::{self, HashType};
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use tokio::sync::mpsc::Sender;

/// Plain files at least this large are split between readers.
const SPLIT_MIN_BYTES: u64 = 16 << 20;
/// About how much of a split file one reader takes at a time: small enough
/// that readers finish their pieces at about the same time, large enough to
/// fill several batches per shard.
const CHUNK_BYTES: u64 = 8 << 20;

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
    /// For a piece of a split file: its place among the file's pieces, whose
    /// rows reach the writers in file order.
    pub order: Option<(Arc<InOrder>, usize)>,
}

/// Lets the readers of one split file's pieces hand their rows to the writers
/// in file order: each shard then receives the file's rows in the file's own
/// order, as one reader would send them. Sorted input interleaved from
/// several readers instead would arrive as ascending runs side by side, and a
/// B-tree filled that way splits its pages in the middle and ends up about
/// half as dense (+50% for the primary key of a sorted pgbench_accounts).
#[derive(Debug)]
pub struct InOrder {
    /// The piece whose rows go next; None once a reader failed, so that no
    /// one waits for its turn for ever.
    next: std::sync::Mutex<Option<usize>>,
    turn: std::sync::Condvar,
}

impl InOrder {
    fn new() -> Arc<InOrder> {
        Arc::new(InOrder { next: std::sync::Mutex::new(Some(0)), turn: Default::default() })
    }

    /// Waits until the pieces before `piece` have handed over their rows;
    /// false when a reader failed instead (the load fails with its error).
    fn wait_for(&self, piece: usize) -> bool {
        let mut next = self.next.lock().unwrap();
        loop {
            match *next {
                Some(n) if n == piece => return true,
                Some(_) => next = self.turn.wait(next).unwrap(),
                None => return false,
            }
        }
    }

    /// `piece` handed over its rows (or, on failure, never will).
    fn finished(&self, piece: usize, ok: bool) {
        let mut next = self.next.lock().unwrap();
        *next = if ok { next.map(|_| piece + 1) } else { None };
        self.turn.notify_all();
    }
}

/// Expands the inputs (globs, `-`).
pub fn sources(inputs: &[String]) -> anyhow::Result<Vec<Source>> {
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
    Ok(files)
}

/// Bytes to read in all, when known (no standard input, nothing compressed).
pub fn total_len(sources: &[Source]) -> anyhow::Result<Option<u64>> {
    let mut total = 0;
    for source in sources {
        match source {
            Source::File(path) if !is_compressed(path) => total += std::fs::metadata(path)?.len(),
            _ => return Ok(None),
        }
    }
    Ok(Some(total))
}

/// Hands the units to the readers through `out`, in input order. Plain files
/// large enough are split at row boundaries into pieces that the readers
/// share; each piece goes out as soon as the scan has found where it ends, so
/// the first readers start while the rest of the file is still being scanned.
pub fn produce_units(sources: Vec<Source>, format: &CopyFormat, header: bool, jobs: usize, out: std::sync::mpsc::Sender<Unit>) -> anyhow::Result<()> {
    let send = |unit: Unit| out.send(unit).map_err(|_| anyhow::anyhow!("the readers stopped"));
    for source in sources {
        let Source::File(path) = &source else {
            send(Unit { source, name: "stdin".into(), range: None, lines_before: 0, header, order: None })?;
            continue;
        };
        let name = path.display().to_string();
        let compressed = is_compressed(path);
        let len = std::fs::metadata(path)?.len();
        if compressed || jobs <= 1 || len < SPLIT_MIN_BYTES || format.format == Format::Binary {
            send(Unit { source: source.clone(), name, range: None, lines_before: 0, header, order: None })?;
            continue;
        }
        let pieces = (len / CHUNK_BYTES).max(jobs as u64) as usize;
        let order = InOrder::new();
        let (mut start, mut piece) = ((0u64, 0u64), 0);
        let mut piece_until = |end: (u64, u64)| -> anyhow::Result<()> {
            if end.0 > start.0 {
                send(Unit {
                    source: source.clone(),
                    name: name.clone(),
                    range: Some((start.0, end.0)),
                    lines_before: start.1,
                    header: header && start.0 == 0,
                    order: Some((order.clone(), piece)),
                })?;
                piece += 1;
            }
            start = end;
            Ok(())
        };
        scan_row_boundaries(path, format, len, pieces, &mut piece_until)?;
        piece_until((len, 0))?;
    }
    Ok(())
}

fn is_compressed(path: &std::path::Path) -> bool {
    matches!(path.extension().and_then(|e| e.to_str()), Some("gz" | "zst"))
}

/// Finds where rows start near every `len / parts` bytes — after a line feed
/// that ends a row: outside CSV quotes, not escaped by a backslash in text
/// format — and gives each such offset, with the line count before it, to
/// `cut`. It jumps from one interesting byte to the next rather than looking
/// at each, as the readers wait for it.
fn scan_row_boundaries(
    path: &std::path::Path,
    format: &CopyFormat,
    len: u64,
    parts: usize,
    cut: &mut dyn FnMut((u64, u64)) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    let step = len / parts as u64;
    let mut targets = (1..parts as u64).map(|i| i * step).peekable();
    let mut file = File::open(path)?;
    let csv = format.format == Format::Csv;
    // The byte that changes how line feeds count: the quote in CSV, the escape in text.
    let special = if csv { format.quote } else { b'\\' };
    let (mut read, mut lines, mut in_quote, mut escaped) = (0u64, 0u64, false, false);
    let mut buf = vec![0u8; 1 << 20];
    while targets.peek().is_some() {
        let n = file.read(&mut buf)?;
        if n == 0 {
            break;
        }
        let chunk = &buf[..n];
        // A backslash ended the previous read: this byte is data.
        let mut i = usize::from(std::mem::take(&mut escaped));
        while let Some(found) = memchr::memchr2(special, b'\n', &chunk[i..]) {
            let at = i + found;
            i = at + 1;
            if chunk[at] == b'\n' {
                // Line feeds inside quotes count as lines, as PostgreSQL counts them.
                lines += 1;
                let offset = read + i as u64;
                if !in_quote && targets.peek().is_some_and(|t| offset >= *t) {
                    cut((offset, lines))?;
                    while targets.peek().is_some_and(|t| offset >= *t) {
                        targets.next();
                    }
                }
            } else if csv {
                in_quote = !in_quote;
            } else if i < n {
                i += 1;
            } else {
                escaped = true;
            }
        }
        read += n as u64;
    }
    Ok(())
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
    pub fn read_unit(
        &self,
        unit: &Unit,
        senders: &[Vec<(Arc<str>, Sender<Shipment>)>],
        progress: &super::Progress,
        rejects: Option<&Rejects>,
    ) -> anyhow::Result<u64> {
        let Some((order, piece)) = &unit.order else {
            return self.route_unit(unit, &mut |shard, batch| send(senders, shard, batch), progress, rejects);
        };
        // A piece's batches wait for its turn, then go out together.
        let mut held = Vec::new();
        let routed = self.route_unit(
            unit,
            &mut |shard, batch| {
                held.push((shard, batch));
                Ok(())
            },
            progress,
            rejects,
        );
        let handed_over = routed.and_then(|rejected| {
            if order.wait_for(*piece) {
                held.into_iter().try_for_each(|(shard, batch)| send(senders, shard, batch))?;
            }
            Ok(rejected)
        });
        order.finished(*piece, handed_over.is_ok());
        handed_over
    }

    /// Reads one unit, giving each full batch (and at the end each partial
    /// one) to `out`.
    fn route_unit(
        &self,
        unit: &Unit,
        out: &mut dyn FnMut(u32, Batch) -> anyhow::Result<()>,
        progress: &super::Progress,
        rejects: Option<&Rejects>,
    ) -> anyhow::Result<u64> {
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
            let mut routed = 0;
            loop {
                let line_if_bad = unit.lines_before + reader.current_line();
                let Some(row) = reader.next_in_place().map_err(|e| anyhow::anyhow!("{}:{line_if_bad}: {e}", unit.name))? else { break };
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
                batch.push(row.data, &unit.name, line);
                routed += 1;
                if batch.rows() >= self.batch_rows || batch.bytes() >= BATCH_BYTES {
                    out(shard, std::mem::take(batch))?;
                }
            }
            // Counted per read, not per row: readers on every core share the counter.
            progress.rows.fetch_add(routed, Ordering::Relaxed);
            if n == 0 {
                break;
            }
        }
        for (shard, batch) in batches.into_iter().enumerate() {
            if batch.rows() > 0 {
                out(shard as u32, batch)?;
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
        tx.blocking_send(Shipment { shard_table: shard_table.clone(), batch: batch.clone() })
            .map_err(|_| anyhow::anyhow!("a shard writer stopped"))?;
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    /// Where each row starts, as the row reader splits the input.
    fn row_starts(format: &CopyFormat, input: &[u8]) -> Vec<u64> {
        let mut reader = RowReader::new(format.clone(), 2);
        reader.push(input);
        reader.finish();
        let (mut starts, mut at) = (Vec::new(), 0u64);
        while let Some(row) = reader.next_in_place().unwrap() {
            starts.push(at);
            at += row.data.len() as u64;
        }
        starts
    }

    #[test]
    fn cuts_fall_on_row_starts_with_the_lines_before_them() {
        let csv = CopyFormat::new(Format::Csv);
        let text = CopyFormat::new(Format::Text);
        let mut csv_input = Vec::new();
        let mut text_input = Vec::new();
        for i in 0..3000 {
            match i % 4 {
                0 => writeln!(csv_input, "{i},\"two\nlines\"").unwrap(),
                1 => writeln!(csv_input, "{i},\"a \"\" quote, a comma\"").unwrap(),
                _ => writeln!(csv_input, "{i},plain").unwrap(),
            }
            match i % 3 {
                0 => writeln!(text_input, "{i}\tescaped\\\nline feed").unwrap(),
                1 => writeln!(text_input, "{i}\ta backslash\\\\").unwrap(),
                _ => writeln!(text_input, "{i}\tplain").unwrap(),
            }
        }
        for (format, input) in [(csv, csv_input), (text, text_input)] {
            let mut file = tempfile::NamedTempFile::new().unwrap();
            file.write_all(&input).unwrap();
            let starts = row_starts(&format, &input);
            for parts in [2, 3, 7, 64] {
                let mut cuts = Vec::new();
                scan_row_boundaries(file.path(), &format, input.len() as u64, parts, &mut |c| {
                    cuts.push(c);
                    Ok(())
                })
                .unwrap();
                assert!(!cuts.is_empty(), "{parts} parts: no cut");
                for &(offset, lines) in &cuts {
                    let row = starts.iter().position(|&start| start == offset);
                    assert!(row.is_some(), "{:?}, {parts} parts: {offset} is not a row start", format.format);
                    // Lines as PostgreSQL numbers them: every line feed in CSV
                    // (quoted ones too), only the rows' own in text format.
                    let expected = if format.format == Format::Csv {
                        input[..offset as usize].iter().filter(|&&b| b == b'\n').count() as u64
                    } else {
                        row.unwrap() as u64
                    };
                    assert_eq!(lines, expected, "{:?}, {parts} parts: lines before {offset}", format.format);
                }
            }
        }
    }
}
