//! MERGE through the coordinator (see `planner::MergePlan`): the coordinator
//! database computes the source rows with each row's distribution value;
//! every shard that gets rows runs the MERGE over them, all in one
//! distributed transaction.

use super::multi_shard::{type_names, values_list};
use super::router::node_of_group;
use crate::connection::client::ClientConn;
use crate::connection::{quote_ident, text_row_size, TextRow};
use crate::error::{PgError, PgResult};
use crate::hash;
use crate::metadata::{Catalog, Distribution};
use crate::planner::MergePlan;
use crate::process::Coordinator;
use crate::protocol::{backend, frontend};
use crate::transaction::{Access, Participants};

pub async fn run(plan: &MergePlan, coordinator: &Coordinator, catalog: &Catalog, parts: &mut Participants, client: &mut ClientConn) -> PgResult<()> {
    let Distribution::Hash { column_type, .. } = &plan.target.distribution else {
        return Err(PgError::internal("MERGE through the coordinator into a reference table"));
    };
    let source_sql = super::block_reads::ready(&plan.source, coordinator, catalog, parts).await?;
    let limits = parts.limits().clone();
    let local = parts.local().await?;
    frontend::query(local.out(), source_sql);
    let (fields, rows) = local.read_result(|row| limits.charge(text_row_size(row))).await?;
    parts.observe_local_status();
    let types = type_names(parts, &fields[1..]).await?;
    let columns: Vec<String> = fields[1..].iter().map(|f| quote_ident(&f.name)).collect();
    let shard_count = plan.target.shard_count();
    let mut by_shard: Vec<Vec<TextRow>> = vec![Vec::new(); shard_count as usize];
    for mut row in rows {
        // A NULL value matches no target row: any shard answers for it.
        let shard = match row.first().cloned().flatten() {
            Some(key) => {
                let h = hash::hash_text(*column_type, &key).map_err(|e| PgError::internal(format!("could not hash distribution value: {e}")))?;
                hash::shard_index(hash::row_hash(Some(h)), shard_count) as usize
            }
            None => 0,
        };
        row.remove(0);
        by_shard[shard].push(row);
    }
    let implicit = parts.begin_implicit();
    let result = async {
        let mut merged = 0;
        for (index, rows) in by_shard.iter().enumerate().filter(|(_, rows)| !rows.is_empty()) {
            let sql = plan.shard_sql(index, &values_list(&types, rows.iter(), parts.limits())?, &columns)?;
            let group = *plan.target.shards[index].placements.first().ok_or_else(|| PgError::internal(format!("shard {index} has no placement")))?;
            let worker = parts.worker(node_of_group(catalog, group)?, Access::Write).await?;
            let tag = worker.conn.execute(&sql).await?;
            merged += backend::rows_in_tag(&tag).unwrap_or(0);
        }
        PgResult::Ok(merged)
    }
    .await;
    let result = parts.end_implicit(implicit, result).await;
    backend::command_complete(client.out(), &format!("MERGE {}", result?));
    Ok(())
}
