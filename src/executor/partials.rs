//! Hands the shards' rows to the coordinator database's combining statement.
//! A few rows go in as a VALUES list of literals. Many go into a temporary
//! table through COPY instead: PostgreSQL parses a million typed literals
//! about seven times slower than it copies the same rows, and the literal
//! text costs the coordinator memory besides. The table lives in a
//! transaction of its own on the coordinator database connection, so it is
//! gone when the statement ends, whatever happens. COPY lines beyond a
//! few megabytes wait in an unnamed temporary file rather than in memory,
//! so a combine of any size stays within the statement's memory limit.

use super::multi_shard::rows_as_relation;
use crate::connection::{quote_ident, text_row_size, PgConnection, TextRows};
use crate::copy::{text_field, write_field, CopyFormat, Format};
use crate::error::{PgError, PgResult};
use crate::protocol::backend::{self, TxStatus};
use crate::protocol::Message;
use crate::transaction::limits::StatementLimits;
use crate::transaction::Participants;
use bytes::{Bytes, BytesMut};
use std::fs::File;
use std::io::{Read, Seek, Write};
use std::sync::Mutex;

/// Above this many rows the rows are copied into a temporary table.
const VALUES_ROWS_MAX: usize = 2_000;

/// The temporary table's name.
const STAGED_TABLE: &str = "tessera_staged_rows";

/// COPY data chunks of about this size.
const CHUNK_BYTES: usize = 256 * 1024;

/// COPY lines held in memory at most (half the statement's memory limit when
/// that is less); more go to the spill file.
const SPILL_BYTES: usize = 16 << 20;

/// The shards' rows as they arrive: text values, for statements that read
/// them as such and for combines inside transaction blocks; else lines of
/// COPY's text format, which take no allocation per value and a fraction
/// of the memory.
pub(super) enum PartialRows {
    Text(TextRows),
    Copy { data: BytesMut, rows: usize, format: CopyFormat, spilled: Option<File> },
}

impl PartialRows {
    pub fn new(as_copy_lines: bool) -> Self {
        if as_copy_lines {
            PartialRows::Copy { data: BytesMut::new(), rows: 0, format: CopyFormat::new(Format::Text), spilled: None }
        } else {
            PartialRows::Text(Vec::new())
        }
    }

    /// Adds a DataRow of text values, counted against the statement's memory.
    pub fn push(&mut self, msg: &Message, limits: &StatementLimits) -> PgResult<()> {
        match self {
            PartialRows::Text(rows) => {
                let row = backend::decode_text_row(msg)?;
                limits.charge(text_row_size(&row))?;
                rows.push(row);
            }
            PartialRows::Copy { data, rows, format, spilled } => {
                let before = data.len();
                backend::each_data_row_value(msg, |i, value| {
                    if i > 0 {
                        data.extend_from_slice(b"\t");
                    }
                    write_field(format, value, data);
                })?;
                data.extend_from_slice(b"\n");
                *rows += 1;
                limits.charge(data.len() - before)?;
                if data.len() >= SPILL_BYTES.min(limits.memory_limit() / 2) {
                    spill(data, spilled)?;
                    limits.release(data.len());
                    data.clear();
                }
            }
        }
        Ok(())
    }

    /// How many rows came.
    pub fn len(&self) -> usize {
        match self {
            PartialRows::Text(rows) => rows.len(),
            PartialRows::Copy { rows, .. } => *rows,
        }
    }

    /// The rows as text values, for statements that take them as such.
    pub fn into_text(self) -> PgResult<TextRows> {
        match self {
            PartialRows::Text(rows) => Ok(rows),
            PartialRows::Copy { .. } => Err(PgError::internal("shard rows kept as COPY lines where text rows were wanted")),
        }
    }
}

/// Appends `data` to the statement's spill file, made on first use.
fn spill(data: &BytesMut, spilled: &mut Option<File>) -> PgResult<()> {
    let failed = |e: std::io::Error| {
        PgError::internal(format!("cannot write a combine's shard rows to a temporary file in {}: {e}", std::env::temp_dir().display()))
    };
    super::off_the_runtime(|| {
        if spilled.is_none() {
            *spilled = Some(tempfile::tempfile().map_err(failed)?);
        }
        spilled.as_mut().expect("made above").write_all(data).map_err(failed)
    })
}

/// Where the rows are for the combining statement.
pub(super) struct Staged {
    /// A relation to read them from; the caller names its columns.
    pub relation: String,
    /// The rows were copied in a transaction of ours, which `release` ends.
    in_own_transaction: bool,
}

/// Makes `rows` (of column `types`) readable by the next statement the
/// coordinator database connection runs. The rows were kept as COPY lines
/// only outside a transaction block (a block may be read-only, where no
/// table can be made, and its end is the client's to decide); a few of them
/// still become a VALUES list.
pub(super) async fn stage(parts: &mut Participants, types: &[String], rows: PartialRows) -> PgResult<Staged> {
    let (data, count, spilled) = match rows {
        PartialRows::Text(rows) => return Ok(Staged { relation: rows_as_relation(types, &rows, parts.limits())?, in_own_transaction: false }),
        PartialRows::Copy { data, rows, spilled, .. } => (data, rows, spilled),
    };
    if count <= VALUES_ROWS_MAX && spilled.is_none() {
        let text: TextRows = data[..]
            .split(|b| *b == b'\n')
            .take(count)
            .map(|line| (0..types.len()).map(|i| text_field(line, i).map(|v| v.into_owned())).collect())
            .collect();
        return Ok(Staged { relation: rows_as_relation(types, &text, parts.limits())?, in_own_transaction: false });
    }
    if parts.in_block() || parts.local().await?.tx_status() != TxStatus::Idle {
        return Err(PgError::internal("shard rows to copy into a temporary table inside a transaction block"));
    }
    let columns: Vec<String> = types.iter().enumerate().map(|(i, t)| format!("c{i} {t}")).collect();
    let create = format!("BEGIN READ WRITE; CREATE TEMP TABLE {STAGED_TABLE} ({}) ON COMMIT DROP", columns.join(", "));
    parts.begin_local_work(true);
    let local = parts.local().await?;
    let copied = match local.execute(&create).await {
        Ok(_) => copy_into(local, &format!("COPY pg_temp.{} FROM STDIN", quote_ident(STAGED_TABLE)), data, spilled).await.map(|_| ()),
        Err(e) => Err(e),
    };
    let staged = Staged { relation: format!("pg_temp.{STAGED_TABLE}"), in_own_transaction: true };
    match copied {
        Ok(()) => Ok(staged),
        Err(e) => release(parts, staged, Err(e)).await,
    }
}

/// Runs `copy` (a COPY … FROM STDIN in text format) on `conn` with COPY
/// lines: those of `spilled` first, then `data`. Returns the rows copied.
async fn copy_into(conn: &mut PgConnection, copy: &str, data: BytesMut, spilled: Option<File>) -> PgResult<u64> {
    let read_failure = Mutex::new(None);
    let mut file = spilled.map(|mut f| f.rewind().map(|_| f));
    let from_file = std::iter::from_fn(|| {
        let f = match file.as_mut()? {
            Ok(f) => f,
            Err(_) => {
                *read_failure.lock().unwrap() = file.take().and_then(|r| r.err());
                return None;
            }
        };
        let mut chunk = vec![0; CHUNK_BYTES];
        match super::off_the_runtime(|| f.read(&mut chunk)) {
            Ok(0) => None,
            Ok(n) => {
                chunk.truncate(n);
                Some(Bytes::from(chunk))
            }
            Err(e) => {
                *read_failure.lock().unwrap() = Some(e);
                None
            }
        }
    });
    let mut data = data.freeze();
    let from_memory = std::iter::from_fn(move || (!data.is_empty()).then(|| data.split_to(CHUNK_BYTES.min(data.len()))));
    let copied = conn.copy_in(copy, from_file.chain(from_memory)).await;
    // A spill file that could not be read back must not leave a part of the rows looking like all of them.
    match read_failure.into_inner().unwrap() {
        Some(e) => Err(PgError::internal(format!("cannot read shard rows back from their temporary file: {e}"))),
        None => copied,
    }
}

/// Ends what `stage` began once the combining statement gave `outcome`:
/// commits the staging transaction (dropping the table), or rolls it back.
pub(super) async fn release<T>(parts: &mut Participants, staged: Staged, outcome: PgResult<T>) -> PgResult<T> {
    if !staged.in_own_transaction {
        parts.observe_local_status();
        return outcome;
    }
    let end = if outcome.is_ok() { "COMMIT" } else { "ROLLBACK" };
    let ended = match parts.local().await {
        Ok(local) => local.execute(end).await.map(|_| ()),
        Err(e) => Err(e),
    };
    parts.begin_local_work(false);
    parts.observe_local_status();
    let value = outcome?;
    ended?;
    Ok(value)
}
