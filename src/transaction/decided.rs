//! Prepared transactions decided by another node's local transaction: the
//! last-agent form of two-phase commit. One participant, the *deciding*
//! node, commits its own part one-phase; every other part was prepared
//! before, under a name that identifies the deciding transaction. That
//! transaction writes a commit record on its own node (`record_commit`),
//! so the record exists exactly when it committed: the decision is the
//! deciding node's commit, with no extra round trip or fsync anywhere else.
//!
//! A transaction id alone cannot name the deciding transaction: a node
//! restarted after a crash hands out again ids whose WAL never reached
//! disk. The name adds when the deciding backend started, which no backend
//! after the crash shares. A prepared part is committed once the record is
//! there; rolled back once the id's transaction on the deciding node has
//! ended (or the id is not handed out yet) and there is no record; and left
//! alone while the id's transaction runs, however long that takes, so no
//! age-based rollback applies to these names. Records are deleted by
//! prepared-transaction recovery once no prepared part names them.
//!
//! Three kinds of transaction commit this way: a session's block that wrote
//! on several nodes (`Participants::commit_two_phase`; the coordinator
//! database decides when it took part, as `COORDINATOR_GROUP`), a parallel
//! load (`load::writer`), and a worker's transaction whose user code wrote
//! on other nodes through links (`links`).

use crate::connection::{quote_literal, PgConnection};
use crate::error::{PgError, PgResult};
use crate::protocol::backend::TxStatus;

/// Names of parts decided by another node's transaction.
pub const GID_PREFIX: &str = "tessera.decided_";

/// The node group that stands for the coordinator database in part names,
/// when its transaction decides: workers' groups are numbered from 1, and
/// Citus numbers its coordinator 0.
pub const COORDINATOR_GROUP: i32 = 0;

/// The transaction on the deciding node that decides a part.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct DecidingTransaction {
    /// Its id, as xid8.
    pub xid: u64,
    /// When its backend started, in microseconds since the Unix epoch.
    pub backend_started: i64,
}

/// `<xid>_<backend start>`: how part names and `IDENTITY_SQL` write it.
impl std::fmt::Display for DecidingTransaction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}_{}", self.xid, self.backend_started)
    }
}

impl DecidingTransaction {
    /// Reads what `Display` writes.
    pub fn parse(text: &str) -> Option<DecidingTransaction> {
        let (xid, started) = text.split_once('_')?;
        Some(DecidingTransaction { xid: xid.parse().ok()?, backend_started: started.parse().ok()? })
    }
}

/// The schema on every worker and in the coordinator database that holds the
/// commit records, made with the node's other Tessera objects
/// (`commands::worker_relations`, `metadata::install`). Roles may
/// use it but not create in it, so nobody else can make its table first.
/// (A macro, so that the statements below can be built from it at compile
/// time.)
macro_rules! schema {
    () => {
        "tessera_commit"
    };
}
const SCHEMA: &str = schema!();

/// The table of commit records on each node: a deciding transaction's row,
/// written as it commits, is its decision (`citus_create_restore_point`
/// locks it to hold decisions back).
pub const COMMIT_RECORDS: &str = concat!(schema!(), ".commit_records");

/// A backend's start in `pg_stat_activity`'s `backend_start` column, in
/// microseconds since the Unix epoch: the second half of a deciding
/// transaction, wherever it is read.
pub const BACKEND_START_US: &str = "(extract(epoch FROM backend_start) * 1000000)::bigint";

/// The current transaction as a deciding transaction (`Display`'s form);
/// gives the transaction an id if it has none.
pub const IDENTITY_SQL: &str = concat!("SELECT pg_catalog.pg_current_xact_id()::text || '_' || ", schema!(), ".backend_started()");

/// The name of a part decided by transaction `decider` on node group
/// `group`; `part` tells the parts of that transaction apart on one node.
pub fn gid(group: i32, decider: &DecidingTransaction, part: &str) -> String {
    format!("{GID_PREFIX}{group}_{decider}_{part}")
}

/// The deciding node group and transaction a part's name carries.
pub fn parse_gid(gid: &str) -> Option<(i32, DecidingTransaction)> {
    let (group, rest) = gid.strip_prefix(GID_PREFIX)?.split_once('_')?;
    let (decider, _part) = rest.rsplit_once('_')?;
    Some((group.parse().ok()?, DecidingTransaction::parse(decider)?))
}

/// Sent with the deciding node's COMMIT, in the same flight: its commit
/// record, then the commit. Recorded here and not earlier, since a
/// savepoint rolled back after an earlier record would take it along.
pub const RECORD_AND_COMMIT_SQL: &str = concat!("SELECT ", schema!(), ".record_commit(); COMMIT");

/// How a two-phase commit's decision went, when it did not commit.
pub enum Decision {
    /// Certainly not committed: the prepared parts are rolled back.
    RolledBack(PgError),
    /// The connection broke while the decision was on its way: recovery
    /// learns the outcome and settles the prepared parts.
    InDoubt(PgError),
}

/// The deciding node's one-phase COMMIT with its commit record
/// (`RECORD_AND_COMMIT_SQL`) on `conn`, which holds the deciding
/// transaction. A failure that leaves the transaction open there rolls it
/// back.
pub async fn commit(conn: &mut PgConnection) -> Result<(), Decision> {
    match conn.execute(RECORD_AND_COMMIT_SQL).await {
        Ok(_) => Ok(()),
        // The COMMIT may or may not have reached the node: its
        // transaction's record there decides, later.
        Err(e) if conn.is_broken() => Err(Decision::InDoubt(e)),
        Err(e) => {
            // A failed record leaves the block open there, failed.
            if conn.tx_status() != TxStatus::Idle {
                conn.execute("ROLLBACK").await.ok();
            }
            Err(Decision::RolledBack(e))
        }
    }
}

/// What the trigger on foreign tables runs for every row it sees written
/// (`commands::worker_relations`): the transaction's record, once.
pub const RECORD_ONCE_SQL: &str = concat!("PERFORM ", schema!(), ".record_commit_once()");

/// What a node (a worker, or the coordinator database) needs to decide
/// transactions, made by the service role (a superuser); idempotent. Any role may record its own transaction's
/// commit, and only that: `record_commit` takes no arguments.
pub fn deciding_objects_sql() -> String {
    format!(
        "CREATE SCHEMA IF NOT EXISTS {SCHEMA};
         REVOKE CREATE ON SCHEMA {SCHEMA} FROM PUBLIC;
         GRANT USAGE ON SCHEMA {SCHEMA} TO PUBLIC;
         CREATE TABLE IF NOT EXISTS {COMMIT_RECORDS} (xid xid8 PRIMARY KEY, backend_started bigint NOT NULL);
         REVOKE ALL ON {COMMIT_RECORDS} FROM PUBLIC;
         -- The backend's start, read from the backend table once per
         -- session: a copy of that whole table (hundreds of kilobytes at a
         -- few hundred connections, fresh pages each time) cost more than
         -- the rest of a commit record. The cache is a setting, which any
         -- role can set, so it carries a MAC under a key only this
         -- schema's owner reads, bound to the backend's pid: a value the
         -- function did not make for this backend is ignored.
         CREATE TABLE IF NOT EXISTS {SCHEMA}.mac_key (one boolean PRIMARY KEY DEFAULT true CHECK (one), key text NOT NULL);
         REVOKE ALL ON {SCHEMA}.mac_key FROM PUBLIC;
         INSERT INTO {SCHEMA}.mac_key (key) SELECT gen_random_uuid()::text || gen_random_uuid()::text ON CONFLICT DO NOTHING;
         CREATE OR REPLACE FUNCTION {SCHEMA}.backend_started() RETURNS bigint
           LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $tessera$
         DECLARE
           cached text := current_setting('tessera_commit.backend', true);
           started text := split_part(cached, ':', 1);
           signed_by text := (SELECT k.key FROM {SCHEMA}.mac_key k) || ':' || pg_backend_pid() || ':';
         BEGIN
           IF cached IS NULL OR split_part(cached, ':', 2) <> encode(sha256(convert_to(signed_by || started, 'UTF8')), 'hex') THEN
             started := (SELECT {BACKEND_START_US} FROM pg_stat_get_activity(pg_backend_pid()));
             PERFORM set_config('tessera_commit.backend', started || ':' || encode(sha256(convert_to(signed_by || started, 'UTF8')), 'hex'), false);
           END IF;
           RETURN started::bigint;
         END $tessera$;
         DROP FUNCTION IF EXISTS {SCHEMA}.record_commit(OUT xid8, OUT bigint);
         CREATE OR REPLACE FUNCTION {SCHEMA}.record_commit() RETURNS void
           LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $tessera$
         BEGIN
           INSERT INTO {COMMIT_RECORDS} VALUES (pg_current_xact_id(), {SCHEMA}.backend_started()) ON CONFLICT DO NOTHING;
         END $tessera$;
         -- Once per transaction, for the trigger on foreign tables (`links`).
         -- Kept in a transaction-local setting, which a rolled-back
         -- subtransaction takes back together with the record.
         -- (No SET clause: it would take the setting back at the return.)
         CREATE OR REPLACE FUNCTION {SCHEMA}.record_commit_once() RETURNS void LANGUAGE plpgsql AS $tessera$
         BEGIN
           IF pg_catalog.current_setting('tessera_commit.recorded', true) IS DISTINCT FROM pg_catalog.pg_current_xact_id()::text THEN
             PERFORM {SCHEMA}.record_commit();
             PERFORM pg_catalog.set_config('tessera_commit.recorded', pg_catalog.pg_current_xact_id()::text, true);
           END IF;
         END $tessera$;
         CREATE OR REPLACE FUNCTION {SCHEMA}.commit_outcome(x xid8, started bigint) RETURNS text
           LANGUAGE plpgsql SET search_path = pg_catalog AS $tessera$
         DECLARE status text;
         BEGIN
           -- The record is read after the status, in a snapshot of its own:
           -- a commit the status saw shows its record there.
           IF current_setting('transaction_isolation') <> 'read committed' THEN
             RAISE EXCEPTION 'the outcome of a transaction can only be read under READ COMMITTED';
           END IF;
           BEGIN
             status := pg_xact_status(x);
           EXCEPTION WHEN invalid_parameter_value THEN
             status := NULL; -- not handed out since a crash ended its transaction
           END;
           IF status = 'in progress' THEN
             RETURN NULL;
           ELSIF EXISTS (SELECT FROM {COMMIT_RECORDS} r WHERE r.xid = x AND r.backend_started = started) THEN
             RETURN 'committed';
           END IF;
           RETURN 'aborted';
         END $tessera$;"
    )
}

/// The connection's current transaction as a deciding transaction.
pub async fn identify(conn: &mut PgConnection) -> PgResult<DecidingTransaction> {
    let text = conn.query_value(IDENTITY_SQL).await?;
    text.as_deref()
        .and_then(DecidingTransaction::parse)
        .ok_or_else(|| PgError::internal(format!("the deciding transaction could not be read on {}", conn.label())))
}

/// What to do with the parts of deciding transactions `deciders`, in
/// order: COMMIT PREPARED when one committed, ROLLBACK PREPARED when it
/// ended without committing, None while it runs.
pub async fn decide(conn: &mut PgConnection, deciders: &[DecidingTransaction]) -> PgResult<Vec<Option<&'static str>>> {
    let xids = deciders.iter().map(|d| d.xid.to_string()).collect::<Vec<_>>().join(",");
    let started = deciders.iter().map(|d| d.backend_started.to_string()).collect::<Vec<_>>().join(",");
    // READ COMMITTED whatever the node's default: the outcome function
    // needs a snapshot of its own for the record.
    let sql = format!(
        "BEGIN ISOLATION LEVEL READ COMMITTED;
         SELECT {SCHEMA}.commit_outcome(x, s) FROM unnest('{{{xids}}}'::xid8[], '{{{started}}}'::bigint[]) WITH ORDINALITY AS u(x, s, i) ORDER BY i;
         COMMIT"
    );
    let rows = match conn.query(&sql).await {
        Ok(rows) => rows,
        Err(e) => {
            if !conn.is_broken() && conn.tx_status() != TxStatus::Idle {
                conn.execute("ROLLBACK").await.ok();
            }
            return Err(e);
        }
    };
    Ok(rows
        .into_iter()
        .map(|row| match row.into_iter().next().flatten().as_deref() {
            Some("committed") => Some("COMMIT PREPARED"),
            Some("aborted") => Some("ROLLBACK PREPARED"),
            _ => None,
        })
        .collect())
}

/// The commit records on a node, by transaction id.
pub async fn commit_records(conn: &mut PgConnection) -> PgResult<Vec<u64>> {
    let rows = conn.query(&format!("SELECT xid::text FROM {COMMIT_RECORDS}")).await?;
    Ok(rows.into_iter().filter_map(|r| r.into_iter().next().flatten()?.parse().ok()).collect())
}

/// Deletes the commit records of transactions `xids` on a node.
pub async fn forget_commit_records(conn: &mut PgConnection, xids: &[u64]) -> PgResult<()> {
    for batch in xids.chunks(10_000) {
        let list = batch.iter().map(u64::to_string).collect::<Vec<_>>().join(",");
        conn.execute(&format!("DELETE FROM {COMMIT_RECORDS} WHERE xid = ANY ('{{{list}}}'::xid8[])")).await?;
    }
    Ok(())
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
        let decider = DecidingTransaction { xid: 4294967311, backend_started: 1_795_000_000_123_456 };
        assert_eq!(parse_gid(&gid(2, &decider, "9")), Some((2, decider.clone())));
        assert_eq!(parse_gid(&gid(2, &decider, "block")), Some((2, decider.clone())));
        assert_eq!(DecidingTransaction::parse("4294967311_1795000000123456"), Some(decider));
        // Names from before the backend's start was part of them.
        assert_eq!(parse_gid("tessera.decided_2_4294967311_s3"), None);
        assert_eq!(parse_gid("tessera_123_4_5"), None);
    }
}
