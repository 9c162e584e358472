//! Commit records in the coordinator database's `pg_dist_transaction`: the
//! decision of a two-phase commit whose deciding node is the coordinator
//! database (a block that wrote there too, a parallel load), written in the
//! same local transaction as its own part. Recovery commits the prepared
//! parts that have a record and drops records nobody needs any more.

use crate::connection::quote_literal;

/// The statement recording commit decisions in `pg_dist_transaction`. It
/// goes through a function because a client's own transaction writes them
/// when the coordinator database took part, as whatever role the client is.
pub fn insert_records<'a>(records: impl IntoIterator<Item = &'a (i32, String)>) -> String {
    let (groups, gids): (Vec<String>, Vec<String>) = records.into_iter().map(|(group, gid)| (group.to_string(), quote_literal(gid))).unzip();
    format!("SELECT tessera.record_commits(ARRAY[{}]::int[], ARRAY[{}]::text[])", groups.join(", "), gids.join(", "))
}
