//! Prepared transactions decided by another node's local transaction: the
//! last-agent form of two-phase commit. One participant, the *deciding*
//! node, commits its own part one-phase; every other part was prepared
//! before, under a name that carries the deciding node's group and its
//! transaction's id (xid8). The deciding commit is the decision, recorded
//! nowhere else: a prepared part is committed once `pg_xact_status` on the
//! deciding node says its transaction committed, rolled back once it says
//! it aborted (a crash counts), and left alone while it runs — however long
//! that takes, so no age-based rollback applies to these names.
//!
//! Two kinds of transaction commit this way: a session's block that wrote
//! on several workers (`Participants::commit_last_agent`), and a worker's
//! transaction whose user code wrote on other nodes through links (`links`).

use crate::connection::{quote_literal, PgConnection};
use crate::error::PgResult;

/// Names of parts decided by another node's transaction. Deliberately not
/// under `GID_PREFIX`, whose transactions recovery settles by commit records.
pub const GID_PREFIX: &str = "tessera.decided_";

/// The name of a part decided by transaction `xid` on node group `decider`;
/// `part` tells the parts of that transaction apart on one node.
pub fn gid(decider: i32, xid: &str, part: &str) -> String {
    format!("{GID_PREFIX}{decider}_{xid}_{part}")
}

/// The deciding node group and xid8 a part's name carries.
pub fn parse_gid(gid: &str) -> Option<(i32, String)> {
    let mut parts = gid.strip_prefix(GID_PREFIX)?.split('_');
    let decider = parts.next()?.parse().ok()?;
    let xid: u64 = parts.next()?.parse().ok()?;
    Some((decider, xid.to_string()))
}

/// What to do with the parts of deciding transactions `xids` (as xid8), in
/// order: COMMIT PREPARED when it committed, ROLLBACK PREPARED when it
/// aborted, None while it runs — or when it is too old for the node to
/// know, which is left to an operator.
pub async fn decide(conn: &mut PgConnection, xids: Vec<String>) -> PgResult<Vec<Option<&'static str>>> {
    let list = xids.iter().map(|x| quote_literal(x)).collect::<Vec<_>>().join(", ");
    let rows = conn.query(&format!("SELECT pg_xact_status(x::xid8) FROM unnest(ARRAY[{list}]::text[]) WITH ORDINALITY AS u(x, i) ORDER BY i")).await?;
    Ok(rows
        .into_iter()
        .map(|row| match row.into_iter().next().flatten().as_deref() {
            Some("committed") => Some("COMMIT PREPARED"),
            Some("aborted") => Some("ROLLBACK PREPARED"),
            _ => None,
        })
        .collect())
}

pub fn finish_sql(command: &str, gid: &str) -> String {
    format!("{command} {}", quote_literal(gid))
}

/// Runs COMMIT/ROLLBACK PREPARED; one already finished (by recovery, or by
/// another pass) counts as done.
pub async fn finish_prepared(conn: &mut PgConnection, sql: &str) -> PgResult<()> {
    match conn.execute(sql).await {
        Ok(_) => Ok(()),
        Err(e) if e.code() == "42704" => Ok(()),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_carry_their_deciding_transaction() {
        assert_eq!(parse_gid(&gid(2, "4294967311", "9")), Some((2, "4294967311".into())));
        assert_eq!(parse_gid("tessera.decided_2_4294967311_s3"), Some((2, "4294967311".into())));
        assert_eq!(parse_gid("tessera_123_4_5"), None);
        assert!(!GID_PREFIX.starts_with(super::super::GID_PREFIX));
    }
}
