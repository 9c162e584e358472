//! Runs a materialized view's CREATE or REFRESH in the coordinator database
//! while the shells of the distributed tables its query reads lend it their
//! shards' rows (planner/materialized_views.rs). Lending, the statement and
//! the return go in one query string, so that outside a transaction block
//! they share one implicit transaction: the foreign-table children the
//! lending adds are never seen by any other transaction.

use super::fallback::prepare_to_read;
use super::relay_local_answer;
use crate::connection::client::ClientConn;
use crate::error::PgResult;
use crate::metadata::Catalog;
use crate::planner::LentShards;
use crate::process::Coordinator;
use crate::protocol::frontend;
use crate::transaction::Participants;

pub async fn run(
    lent: &LentShards,
    sql: &str,
    coordinator: &Coordinator,
    catalog: &Catalog,
    parts: &mut Participants,
    client: &mut ClientConn,
) -> PgResult<()> {
    // The lent shards are read as the fallback tier's stand-ins are: through
    // its foreign servers, with a user mapping per role.
    prepare_to_read(lent.statement, coordinator, catalog, parts).await?;
    let tables = lent.tables.iter().map(u32::to_string).collect::<Vec<_>>().join(",");
    let text = format!("SELECT tessera.lend_shards(ARRAY[{tables}]::oid[], {});\n{sql}\n;\nSELECT tessera.return_shards()", lent.reader);
    frontend::query(parts.local().await?.out(), &text);
    // Only the statement's own answer (the second of three) reaches the
    // client; notices from any of them do.
    let mut completed = 0;
    relay_local_answer(parts, client, |msg, out| match msg.tag() {
        b'N' => out.extend_from_slice(msg.frame()),
        b'C' => {
            if completed == 1 {
                out.extend_from_slice(msg.frame());
            }
            completed += 1;
        }
        _ => {}
    })
    .await
}
