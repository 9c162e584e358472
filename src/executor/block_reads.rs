//! Statements the coordinator database runs over distributed tables
//! (`CoordinatorRead`: the general fallback, the rows of INSERT … SELECT and
//! of MERGE through the coordinator, COPY of a query). Outside a block that
//! wrote on the workers they read the foreign-table stand-ins. Inside one
//! they cannot: postgres_fdw reads through connections of its own, which do
//! not see the block's uncommitted writes. So the tables such a statement
//! reads are first copied, through the block's own worker connections,
//! into temporary tables of the block's coordinator database connection
//! (dropped when the block ends), and the statement reads those: it sees
//! the block's writes, as PostgreSQL would show them. The copies cost a
//! full read of each table per statement; they are made only in this case.

use super::router::node_of_group;
use crate::connection::quote_ident;
use crate::error::{PgError, PgResult};
use crate::metadata::{Catalog, DistributedTable};
use crate::planner::{block_copy_name, CoordinatorRead};
use crate::process::Coordinator;
use crate::transaction::{Access, Participants};

/// The form of `read` the coordinator database can run now, with what it
/// needs made ready: the stand-ins (brought up to the catalog, mapped for
/// the acting role), or the block's copies of the tables.
pub async fn ready<'r>(read: &'r CoordinatorRead, coordinator: &Coordinator, catalog: &Catalog, parts: &mut Participants) -> PgResult<&'r str> {
    if read.tables.is_empty() {
        return Ok(&read.sql);
    }
    if parts.wrote_on_workers() {
        for table in &read.tables {
            copy_into_block(table, catalog, parts).await?;
        }
        return Ok(&read.block_sql);
    }
    coordinator.prepare_fallback(catalog.version, &parts.acting_role().await?).await?;
    Ok(&read.sql)
}

/// Fills `table`'s block copy afresh with every shard's rows as the block's
/// connections see them. An earlier statement's copy is emptied, not
/// dropped: a cursor may still read it, and sees the rows of its own
/// snapshot.
async fn copy_into_block(table: &DistributedTable, catalog: &Catalog, parts: &mut Participants) -> PgResult<()> {
    let columns: Vec<String> = table.columns.iter().map(|c| quote_ident(c)).collect();
    let columns = columns.join(", ");
    let copy = quote_ident(&block_copy_name(table, catalog.version));
    parts
        .local()
        .await?
        .execute(&format!(
            "CREATE TEMP TABLE IF NOT EXISTS {copy} ON COMMIT DROP AS SELECT {columns} FROM {} WITH NO DATA; DELETE FROM pg_temp.{copy}",
            table.qualified_name()
        ))
        .await?;
    for shard in &table.shards {
        let group = *shard
            .placements
            .first()
            .ok_or_else(|| PgError::internal(format!("shard {} of {} has no placement", shard.id, table.qualified_name())))?;
        let limits = parts.limits().clone();
        let worker = parts.worker(node_of_group(catalog, group)?, Access::Read).await?;
        let mut chunks = Vec::new();
        let mut held = 0;
        worker
            .conn
            .copy_out(&format!("COPY (SELECT {columns} FROM {}) TO STDOUT", table.qualified_shard_name(shard)), |chunk| {
                held += chunk.len();
                limits.charge(chunk.len())?;
                chunks.push(chunk);
                Ok(())
            })
            .await?;
        if !chunks.is_empty() {
            parts.local().await?.copy_in(&format!("COPY pg_temp.{copy} ({columns}) FROM STDIN"), chunks).await?;
        }
        // A shard's rows are held only until they are copied.
        limits.release(held);
    }
    parts.observe_local_status();
    Ok(())
}
