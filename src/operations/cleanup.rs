//! What operations leave on the nodes, recorded in `pg_dist_cleanup` before
//! it is made, and removed once the operation has ended: objects of policy
//! "always" whichever way it ended, those of policy "on failure" only when
//! it did not finish (a finished move deletes their records in the same
//! transaction that switches the catalog). A running operation holds an
//! advisory lock in the coordinator database, so any coordinator process
//! can tell a dead operation from a running one, including after a crash.

use crate::config::Config;
use crate::connection::{quote_ident, quote_literal, PgConnection};
use crate::error::{PgError, PgResult};
use crate::metadata::Catalog;

/// The advisory-lock class (first key) that operations hold their id under.
const OPERATION_LOCK_CLASS: i32 = 0x7e55;
/// The second key a cleanup pass holds (operation ids start at 1).
const CLEANUP_PASS: i32 = 0;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Object {
    /// A shard table (schema-qualified name).
    Shard = 1,
    Subscription = 2,
    ReplicationSlot = 3,
    Publication = 4,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Policy {
    OnFailure = 1,
    Always = 2,
}

/// A running operation: its id, and the coordinator database connection
/// that holds its lock (closing it ends the operation).
pub struct Operation {
    pub id: i64,
    conn: PgConnection,
}

impl Operation {
    pub async fn start(config: &Config) -> PgResult<Operation> {
        let mut conn = PgConnection::connect(&config.coordinator_db_addr(), &config.service_login()).await?;
        let id: i64 = conn
            .query_value(&format!("SELECT id, pg_advisory_lock({OPERATION_LOCK_CLASS}, id::int) FROM nextval('tessera.pg_dist_operationid_seq') id"))
            .await?
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| PgError::internal("no operation id"))?;
        Ok(Operation { id, conn })
    }

    /// Records `name` on node group `group`, committed before the caller makes it.
    pub async fn record(&mut self, object: Object, name: &str, group: i32, policy: Policy) -> PgResult<()> {
        self.conn.execute(&record_sql(self.id, object, name, group, policy)).await?;
        Ok(())
    }

    /// Ends the operation (its records become cleanup's to settle).
    pub async fn end(mut self) {
        let _ = self.conn.execute(&format!("SELECT pg_advisory_unlock({OPERATION_LOCK_CLASS}, {}::int)", self.id)).await;
        self.conn.terminate().await;
    }
}

/// The INSERT recording an object (for use inside another transaction too).
pub fn record_sql(operation: i64, object: Object, name: &str, group: i32, policy: Policy) -> String {
    format!(
        "INSERT INTO tessera.pg_dist_cleanup (operation_id, object_type, object_name, node_group_id, policy_type) VALUES ({operation}, {}, {}, {group}, {})",
        object as i32,
        quote_literal(name),
        policy as i32
    )
}

/// Removes what ended operations left, subscriptions first (they hold
/// slots), then slots, publications and shard tables. An object that
/// cannot go yet (a node down, a shard still being read) keeps its record
/// for a later pass. Returns how many objects went.
pub async fn run(config: &Config, catalog: &Catalog) -> PgResult<u64> {
    let mut local = PgConnection::connect(&config.coordinator_db_addr(), &config.service_login()).await?;
    let result = run_on(&mut local, config, catalog).await;
    local.terminate().await;
    result
}

async fn run_on(local: &mut PgConnection, config: &Config, catalog: &Catalog) -> PgResult<u64> {
    // One pass at a time (a pass asked for waits for one under way, so
    // that it finds its work done); then an operation lock this session can
    // take belongs to no running operation.
    local.execute(&format!("SELECT pg_advisory_lock({OPERATION_LOCK_CLASS}, {CLEANUP_PASS})")).await?;
    let records = local
        .query(&format!(
            "SELECT record_id, object_type, object_name, node_group_id FROM tessera.pg_dist_cleanup
              WHERE operation_id IN (SELECT DISTINCT operation_id FROM tessera.pg_dist_cleanup WHERE pg_try_advisory_lock({OPERATION_LOCK_CLASS}, operation_id::int))
              ORDER BY CASE object_type WHEN 2 THEN 0 WHEN 3 THEN 1 WHEN 4 THEN 2 ELSE 3 END, record_id"
        ))
        .await?;
    let mut removed = 0;
    for row in records {
        let text = |i: usize| row[i].clone().unwrap_or_default();
        let (record, name, group) = (text(0), text(2), text(3).parse::<i32>().unwrap_or_default());
        let Some(node) = catalog.node_for_group(group) else {
            tracing::warn!("cleanup: node group {group} of {name} is no longer in the cluster; forgetting the record");
            local.execute(&format!("DELETE FROM tessera.pg_dist_cleanup WHERE record_id = {record}")).await?;
            continue;
        };
        let sql = match text(1).as_str() {
            "1" => {
                // Never a placement the catalog names: that would be data.
                let shard_id = name.rsplit('_').next().and_then(|id| id.trim_matches('"').parse::<i64>().ok()).unwrap_or(-1);
                let placed = local
                    .query_value(&format!("SELECT count(*) FROM tessera.pg_dist_placement WHERE shardid = {shard_id} AND groupid = {group}"))
                    .await?;
                if placed.as_deref() != Some("0") {
                    tracing::warn!("cleanup: {name} on {} is a placement in the catalog; kept", node.addr);
                    local.execute(&format!("DELETE FROM tessera.pg_dist_cleanup WHERE record_id = {record}")).await?;
                    continue;
                }
                // A move that ended before the workers' partitions followed
                // it left the old placement attached: they follow first.
                if let Some((table, shard)) = catalog.shard(shard_id) {
                    if let Some(&to) = shard.placements.first() {
                        if let Err(e) = super::shard_move::repoint_partitions(config, catalog, table, shard, group, to).await {
                            tracing::warn!("cleanup: the workers' partitions of {name} do not follow its move yet: {}", e.message());
                            continue;
                        }
                    }
                }
                format!("SET lock_timeout = '2s'; DROP TABLE IF EXISTS {name}; RESET lock_timeout")
            }
            "2" => format!(
                "DO $tessera$ BEGIN
                   IF EXISTS (SELECT FROM pg_subscription WHERE subname = {lit}) THEN
                     ALTER SUBSCRIPTION {ident} DISABLE;
                     ALTER SUBSCRIPTION {ident} SET (slot_name = NONE);
                   END IF;
                 END $tessera$; DROP SUBSCRIPTION IF EXISTS {ident}",
                lit = quote_literal(&name),
                ident = quote_ident(&name)
            ),
            "3" => format!(
                "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = {lit} AND active_pid IS NOT NULL;
                 SELECT pg_sleep(0.1) FROM pg_replication_slots WHERE slot_name = {lit} AND active;
                 SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = {lit}",
                lit = quote_literal(&name)
            ),
            "4" => format!("DROP PUBLICATION IF EXISTS {}", quote_ident(&name)),
            other => {
                tracing::warn!("cleanup: unknown object type {other} of {name}; forgetting the record");
                local.execute(&format!("DELETE FROM tessera.pg_dist_cleanup WHERE record_id = {record}")).await?;
                continue;
            }
        };
        let dropped = PgConnection::query_once(&node.addr, &config.service_login(), &sql).await;
        match dropped {
            Ok(_) => {
                local.execute(&format!("DELETE FROM tessera.pg_dist_cleanup WHERE record_id = {record}")).await?;
                tracing::info!("cleanup: removed {name} on {}", node.addr);
                removed += 1;
            }
            Err(e) => tracing::warn!("cleanup: could not remove {name} on {} yet: {}", node.addr, e.message()),
        }
    }
    Ok(removed)
}
