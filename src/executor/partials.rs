//! Hands the shards' rows to the coordinator database's combining statement.
//! A few rows go in as a VALUES list of literals. Many go into a temporary
//! table through COPY instead: PostgreSQL parses a million typed literals
//! about seven times slower than it copies the same rows, and the literal
//! text costs the coordinator memory besides. The table lives in a
//! transaction of its own on the coordinator database connection, so it is
//! gone when the statement ends, whatever happens.

use super::multi_shard::rows_as_relation;
use crate::connection::{quote_ident, TextRow};
use crate::copy::{write_field, CopyFormat, Format};
use crate::error::PgResult;
use crate::protocol::backend::TxStatus;
use crate::transaction::limits::StatementLimits;
use crate::transaction::Participants;
use bytes::{Bytes, BytesMut};

/// Above this many rows the rows are copied into a temporary table.
const VALUES_ROWS_MAX: usize = 2_000;

/// The temporary table's name.
const STAGED_TABLE: &str = "tessera_staged_rows";

/// COPY data chunks of about this size.
const CHUNK_BYTES: usize = 256 * 1024;

/// Where the rows are for the combining statement.
pub(super) struct Staged {
    /// A relation to read them from; the caller names its columns.
    pub relation: String,
    /// The rows were copied in a transaction of ours, which `release` ends.
    in_own_transaction: bool,
}

/// Makes `rows` (of column `types`) readable by the next statement the
/// coordinator database connection runs. A session in a transaction block
/// gets the VALUES list: its block may be read-only, where no table can be
/// made, and its end is the client's to decide.
pub(super) async fn stage(parts: &mut Participants, types: &[String], rows: &[TextRow]) -> PgResult<Staged> {
    if rows.len() <= VALUES_ROWS_MAX || parts.in_block() || parts.local().await?.tx_status() != TxStatus::Idle {
        return Ok(Staged { relation: rows_as_relation(types, rows, parts.limits())?, in_own_transaction: false });
    }
    let columns: Vec<String> = types.iter().enumerate().map(|(i, t)| format!("c{i} {t}")).collect();
    let create = format!("BEGIN READ WRITE; CREATE TEMP TABLE {STAGED_TABLE} ({}) ON COMMIT DROP", columns.join(", "));
    let chunks = copy_chunks(rows, parts.limits())?;
    parts.begin_local_work(true);
    let local = parts.local().await?;
    let copied = match local.execute(&create).await {
        Ok(_) => local.copy_in(&format!("COPY pg_temp.{} FROM STDIN", quote_ident(STAGED_TABLE)), chunks).await.map(|_| ()),
        Err(e) => Err(e),
    };
    let staged = Staged { relation: format!("pg_temp.{STAGED_TABLE}"), in_own_transaction: true };
    match copied {
        Ok(()) => Ok(staged),
        Err(e) => release(parts, staged, Err(e)).await,
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

/// The rows in COPY's text format, in chunks, counted against the
/// statement's memory.
fn copy_chunks(rows: &[TextRow], limits: &StatementLimits) -> PgResult<Vec<Bytes>> {
    let format = CopyFormat::new(Format::Text);
    let mut chunks = Vec::new();
    let mut chunk = BytesMut::with_capacity(CHUNK_BYTES + 1024);
    for row in rows {
        for (i, value) in row.iter().enumerate() {
            if i > 0 {
                chunk.extend_from_slice(b"\t");
            }
            write_field(&format, value.as_deref().map(str::as_bytes), &mut chunk);
        }
        chunk.extend_from_slice(b"\n");
        if chunk.len() >= CHUNK_BYTES {
            limits.charge(chunk.len())?;
            limits.check()?;
            chunks.push(chunk.split().freeze());
        }
    }
    if !chunk.is_empty() {
        limits.charge(chunk.len())?;
        chunks.push(chunk.freeze());
    }
    Ok(chunks)
}
