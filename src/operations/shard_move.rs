//! `citus_move_shard_placement`: moves a shard, with every co-located shard
//! of its group, from one node to another while the cluster runs.
//!
//! 1. The shard tables are made on the target as the source has them
//!    (columns, constraints, indexes, replica identity; partitions attached
//!    to their partitioned shard), recorded for cleanup first so that an
//!    interrupted move leaves nothing behind.
//! 2. Logical (the default): a publication on the source and a subscription
//!    on the target copy the rows and then follow every write. Tables
//!    without a primary key get `REPLICA IDENTITY FULL` on the source so
//!    their updates and deletes replicate. `block_writes` copies under the
//!    write block instead.
//! 3. Cut-over: this process holds back new writes to the co-location group
//!    (`fence`), waits a moment for transactions already writing on the
//!    source, locks the source shards against writes (`EXCLUSIVE`: reads go
//!    on), waits for the target to replay everything up to then, and in one
//!    distributed transaction switches the placements in the catalog and
//!    makes the old shards refuse writes. The held-back statements then run
//!    on the new node. The cut-over takes no lock on the workers' parents:
//!    statements waiting at the fence may hold some.
//! 4. Then each worker's partitions are pointed at the new placement, and
//!    the old shards, the publication, the subscription and its slot go
//!    through cleanup, which drops the old shards once no one reads them
//!    (and re-points the partitions first if the move could not).

use super::cleanup::{self, Object, Operation, Policy};
use crate::config::Config;
use crate::config::Fault;
use crate::connection::{quote_ident, quote_literal, PgConnection};
use crate::error::{sqlstate, PgError, PgResult};
use crate::metadata::{Catalog, DistributedTable, Node, Shard};
use crate::planner::worker_relations::{refuse_writes_sql, repoint_sql};
use crate::process::context::CommandContext;
use crate::transaction::Access;
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TransferMode {
    /// Logical replication (Citus's "auto" and "force_logical").
    Logical,
    /// A plain copy while writes to the shard group wait.
    BlockWrites,
}

impl TransferMode {
    pub fn parse(mode: Option<&str>) -> PgResult<TransferMode> {
        match mode.unwrap_or("auto") {
            "auto" | "force_logical" => Ok(TransferMode::Logical),
            "block_writes" => Ok(TransferMode::BlockWrites),
            other => Err(PgError::new(sqlstate::INVALID_PARAMETER_VALUE, format!("invalid shard_transfer_mode \"{other}\""))
                .with_hint("Use 'auto', 'force_logical' or 'block_writes'.")),
        }
    }

    /// The mode as `shard_transfer_mode` names it.
    pub fn name(self) -> &'static str {
        match self {
            TransferMode::Logical => "auto",
            TransferMode::BlockWrites => "block_writes",
        }
    }
}

/// How long blocks that wrote on the source before the fence may take to
/// finish before the cut-over locks the shards anyway.
const DRAIN_PATIENCE: Duration = Duration::from_secs(5);
/// How long the target may take to replay what the source wrote before the
/// lock; past it the move gives up (and can be started again).
const CATCH_UP_PATIENCE: Duration = Duration::from_secs(30);

/// The shards that move together: one per table of the co-location group.
struct Group {
    colocation: i32,
    index: u32,
    members: Vec<(Arc<DistributedTable>, Shard)>,
}

impl Group {
    fn names(&self) -> Vec<String> {
        self.members.iter().map(|(t, s)| t.qualified_shard_name(s)).collect()
    }
    fn shard_ids(&self) -> String {
        self.members.iter().map(|(_, s)| s.id.to_string()).collect::<Vec<_>>().join(", ")
    }
}

/// The shard `shard_id` and its co-located shards, on `source` now.
fn shard_group(ctx: &CommandContext<'_>, shard_id: i64, source: &Node, target: &Node) -> PgResult<Group> {
    let (table, shard) = ctx.catalog.existing_shard(shard_id)?;
    if table.is_reference() {
        return Err(PgError::not_supported(format!("shard {shard_id} belongs to reference table {}, which every node holds a copy of", table.name))
            .with_hint("Reference tables are copied to nodes when they are added; they do not move."));
    }
    shard.check_movable(source, target)?;
    let mut members = Vec::new();
    for t in ctx.catalog.tables().filter(|t| t.colocation_id == table.colocation_id && !t.is_reference()) {
        if let Some(s) = t.shards.get(shard.index as usize) {
            members.push((t.clone(), s.clone()));
        }
    }
    // Partitioned tables before their partitions, which are attached to them.
    let depth = |t: &DistributedTable| std::iter::successors(t.partition_of, |p| ctx.catalog.table_by_oid(*p).and_then(|t| t.partition_of)).count();
    members.sort_by_cached_key(|(t, _)| (depth(t), t.qualified_name()));
    Ok(Group { colocation: table.colocation_id, index: shard.index, members })
}

pub async fn move_shard_placement(
    ctx: &mut CommandContext<'_>,
    shard_id: i64,
    source: (&str, u16),
    target: (&str, u16),
    mode: TransferMode,
) -> PgResult<()> {
    let source = ctx.catalog.active_node(source.0, source.1)?;
    let target = ctx.catalog.active_node(target.0, target.1)?;
    let group = shard_group(ctx, shard_id, &source, &target)?;
    let config = &ctx.coordinator.config;
    // Leftovers of earlier moves first: they may hold the names this one uses.
    cleanup::run(config, &ctx.catalog).await?;
    let mut op = Operation::start(config).await?;
    let started = Instant::now();
    ctx.notice(format!(
        "moving shard group {} of co-location group {} ({}) from {} to {}",
        group.index,
        group.colocation,
        group.names().join(", "),
        source.addr,
        target.addr
    ))
    .await;
    let result = transfer(ctx, &mut op, &group, &source, &target, mode).await;
    op.end().await;
    // Whatever happened, what the move no longer needs goes now (the old
    // shards only once nobody reads them; later passes retry).
    if let Err(e) = cleanup::run(&ctx.coordinator.config, &ctx.coordinator.catalog.snapshot()).await {
        tracing::warn!("cleanup after moving shard {shard_id}: {}", e.message());
    }
    result?;
    ctx.notice(format!("moved shard group {} to {} in {:.1} s", group.index, target.addr, started.elapsed().as_secs_f64())).await;
    Ok(())
}

async fn transfer(ctx: &mut CommandContext<'_>, op: &mut Operation, group: &Group, source: &Node, target: &Node, mode: TransferMode) -> PgResult<()> {
    let login = ctx.coordinator.config.service_login();
    let mut source_conn = PgConnection::connect(&source.addr, &login).await?;
    let mut target_conn = PgConnection::connect(&target.addr, &login).await?;
    // Definitions read with pg_catalog alone on the path come out fully qualified.
    source_conn.execute("SET search_path = pg_catalog").await?;
    let mut after_data = Vec::new();
    let mut validate = Vec::new();
    // The tables that hold rows (not the partitioned ones), with their columns.
    let mut copy_columns = Vec::new();
    for (table, shard) in &group.members {
        let name = table.qualified_shard_name(shard);
        let definition = read_definition(&mut source_conn, &name, table.partition_of.is_some()).await.map_err(|e| on_node(e, source, &name))?;
        op.record(Object::Shard, &name, target.group_id, Policy::OnFailure).await?;
        target_conn.execute(&format!("BEGIN; {}; COMMIT", definition.schema.join(";\n"))).await.map_err(|e| on_node(e, target, &name))?;
        after_data.extend(definition.after_data);
        validate.extend(definition.validate);
        if !definition.copy_columns.is_empty() {
            copy_columns.push((name, definition.copy_columns));
        }
    }
    let leaves: Vec<&str> = copy_columns.iter().map(|(name, _)| name.as_str()).collect();
    let names = format!("tessera_move_{}", op.id);
    if mode == TransferMode::Logical {
        for (object, group_id) in
            [(Object::Subscription, target.group_id), (Object::ReplicationSlot, source.group_id), (Object::Publication, source.group_id)]
        {
            op.record(object, &names, group_id, Policy::Always).await?;
        }
        let unidentified = source_conn
            .query(&format!(
                "SELECT c.oid::regclass FROM pg_class c WHERE c.oid = ANY (ARRAY[{}]::regclass[]) AND c.relreplident = 'd'
                   AND NOT EXISTS (SELECT FROM pg_index i WHERE i.indrelid = c.oid AND i.indisprimary)",
                leaves.iter().map(|n| quote_literal(n)).collect::<Vec<_>>().join(", ")
            ))
            .await?;
        for row in unidentified {
            source_conn.execute(&format!("ALTER TABLE {} REPLICA IDENTITY FULL", row[0].clone().unwrap_or_default())).await?;
        }
        source_conn
            .execute(&format!("CREATE PUBLICATION {} FOR TABLE {}", quote_ident(&names), leaves.join(", ")))
            .await
            .map_err(|e| on_node(e, source, &names))?;
        let password = login.password.as_deref().map(|p| format!(" password={}", conninfo_value(p))).unwrap_or_default();
        // With the role's certificate where the cluster has a CA.
        let conninfo = target_conn
            .query_value(&format!(
                "SELECT tessera_remote.link_conninfo({}, {}, {}, {})",
                quote_literal(&source.addr.host),
                source.addr.port,
                quote_literal(&login.database),
                quote_literal(&login.user)
            ))
            .await
            .map_err(|e| on_node(e, target, &names))?
            .unwrap_or_default()
            + &password;
        target_conn
            .execute(&format!(
                "CREATE SUBSCRIPTION {sub} CONNECTION {conn} PUBLICATION {sub} WITH (slot_name = {slot}, copy_data = true)",
                sub = quote_ident(&names),
                conn = quote_literal(&conninfo),
                slot = quote_literal(&names)
            ))
            .await
            .map_err(|e| on_node(e, target, &names))?;
        fault(ctx, Fault::MoveAfterSubscribe);
        wait_for_initial_copy(ctx, &mut target_conn, &names, group, leaves.len(), target).await?;
    }
    if !after_data.is_empty() {
        target_conn.execute(&after_data.join(";\n")).await.map_err(|e| on_node(e, target, "the shards' keys, triggers and grants"))?;
    }
    // A check constraint matching each partition bound lets the cut-over
    // attach the new shards without scanning them under the lock.
    for (table, shard) in group.members.iter().filter(|(t, _)| t.has_worker_parent()) {
        let parent = target_conn.query_value(&format!("SELECT {}::regclass::oid", quote_literal(&table.qualified_name()))).await?.unwrap_or_default();
        target_conn.execute(&bound_check_sql(table, shard, &parent)).await.map_err(|e| on_node(e, target, &table.qualified_shard_name(shard)))?;
    }
    source_conn.terminate().await;
    ctx.check_stopped()?;

    let raised = ctx.coordinator.fences.raise(group.colocation, source.group_id);
    // The cut-over's commit reloads this process's catalog before the
    // held-back statements are planned again.
    let result = cut_over(ctx, op, group, source, target, mode, &mut target_conn, &copy_columns).await;
    drop(raised);
    if result.is_ok() && !validate.is_empty() {
        if let Err(e) = target_conn.execute(&validate.join(";\n")).await {
            tracing::warn!("validating the foreign keys of shard group {} on {}: {}", group.index, target.addr, e.message());
        }
    }
    target_conn.terminate().await;
    result?;
    fault(ctx, Fault::MoveAfterSwitch);
    // The workers' partitions follow outside the fence: the statements that
    // waited there may hold locks on the parents. Until then, user code on
    // the workers reads the old placement and its writes there fail; a
    // pass that cannot finish now is left to cleanup, which repeats it.
    let catalog = ctx.coordinator.catalog.snapshot();
    for (table, shard) in &group.members {
        if let Err(e) = repoint_partitions(&ctx.coordinator.config, &catalog, table, shard, source.group_id, target.group_id).await {
            tracing::warn!(
                "re-pointing the workers' partitions of {} after its move: {}; cleanup retries",
                table.qualified_shard_name(shard),
                e.message()
            );
        }
    }
    Ok(())
}

/// Points every node's partition of `table` for `shard` at its placement on
/// node group `to` instead of `from`, one node at a time.
pub(super) async fn repoint_partitions(
    config: &Config,
    catalog: &Catalog,
    table: &DistributedTable,
    shard: &Shard,
    from: i32,
    to: i32,
) -> PgResult<()> {
    for node in catalog.active_nodes() {
        let mut statements = repoint_sql(table, shard, from, to, node.group_id);
        if node.group_id == to && table.has_worker_parent() {
            statements.push(format!("ALTER TABLE {} DROP CONSTRAINT IF EXISTS {BOUND_CHECK}", table.qualified_shard_name(shard)));
        }
        if statements.is_empty() {
            continue;
        }
        let mut conn = PgConnection::connect(&node.addr, &config.service_login()).await?;
        // The parent's exclusive lock queues every statement on its shards
        // behind it: rather than wait long enough for the node's deadlock
        // detector to pick a client, give way and try again.
        let sql = format!("BEGIN; SET LOCAL lock_timeout = '{}ms'; {}; COMMIT", REPOINT_LOCK_WAIT.as_millis(), statements.join(";\n"));
        let mut attempts = 0;
        let result = loop {
            attempts += 1;
            match conn.execute(&sql).await {
                Err(e) if e.code() == "55P03" && attempts < REPOINT_ATTEMPTS => {
                    conn.execute("ROLLBACK").await.ok();
                    tokio::time::sleep(REPOINT_LOCK_WAIT).await;
                }
                other => break other,
            }
        };
        conn.terminate().await;
        result.map_err(|e| on_node(e, node, &table.qualified_shard_name(shard)))?;
    }
    Ok(())
}

/// How long re-pointing a worker's partition waits for the parent's lock
/// at a time (well below `deadlock_timeout`), and how often it tries.
const REPOINT_LOCK_WAIT: Duration = Duration::from_millis(100);
const REPOINT_ATTEMPTS: u32 = 100;

#[allow(clippy::too_many_arguments)]
async fn cut_over(
    ctx: &mut CommandContext<'_>,
    op: &Operation,
    group: &Group,
    source: &Node,
    target: &Node,
    mode: TransferMode,
    target_conn: &mut PgConnection,
    copy_columns: &[(String, String)],
) -> PgResult<()> {
    let cut_started = Instant::now();
    drain_writers(ctx, source).await?;
    let implicit = ctx.parts.begin_implicit();
    let result = async {
        let worker = ctx.parts.worker(source, Access::Write).await?;
        worker
            .conn
            .execute(&format!("SET LOCAL lock_timeout = '10s'; LOCK TABLE {} IN EXCLUSIVE MODE", group.names().join(", ")))
            .await
            .map_err(|e| on_node(e, source, "the shards"))?;
        match mode {
            TransferMode::Logical => {
                let lsn = worker.conn.query_value("SELECT pg_current_wal_lsn()").await?.unwrap_or_default();
                wait_for_replay(target_conn, &format!("tessera_move_{}", op.id), &lsn, target).await?;
                target_conn.execute(&format!("ALTER SUBSCRIPTION {} DISABLE", quote_ident(&format!("tessera_move_{}", op.id)))).await?;
            }
            TransferMode::BlockWrites => {
                // As logical replication applies rows: no triggers, no key checks.
                target_conn.execute("SET session_replication_role = replica").await?;
                for (name, columns) in copy_columns {
                    let mut rows = Vec::new();
                    worker
                        .conn
                        .copy_out(&format!("COPY {name} ({columns}) TO STDOUT"), |row| {
                            rows.push(row);
                            Ok(())
                        })
                        .await?;
                    target_conn.copy_in(&format!("COPY {name} ({columns}) FROM STDIN"), rows).await.map_err(|e| on_node(e, target, name))?;
                }
                target_conn.execute("RESET session_replication_role").await?;
            }
        }
        let refuse: Vec<String> = group.members.iter().map(|(table, shard)| refuse_writes_sql(table, shard)).collect();
        worker.conn.execute(&refuse.join(";\n")).await?;
        let local = ctx.parts.local().await?;
        let mut catalog_sql = vec![
            format!(
                "UPDATE tessera.pg_dist_placement SET groupid = {} WHERE groupid = {} AND shardid IN ({})",
                target.group_id,
                source.group_id,
                group.shard_ids()
            ),
            format!("DELETE FROM tessera.pg_dist_cleanup WHERE operation_id = {} AND policy_type = {}", op.id, Policy::OnFailure as i32),
        ];
        catalog_sql.extend(group.names().iter().map(|name| cleanup::record_sql(op.id, Object::Shard, name, source.group_id, Policy::Always)));
        local.execute(&catalog_sql.join(";\n")).await?;
        fault(ctx, Fault::MoveBeforeSwitch);
        Ok(())
    }
    .await;
    ctx.finish_block(implicit, result).await?;
    tracing::info!(
        "shard group {} of co-location group {} moved from {} to {}; writes waited {} ms",
        group.index,
        group.colocation,
        source.addr,
        target.addr,
        cut_started.elapsed().as_millis()
    );
    Ok(())
}

/// Waits (a little) for transactions that wrote on `source` before the
/// fence went up: they may still write to the moving shards, which the
/// lock would make them wait for until after the switch.
async fn drain_writers(ctx: &CommandContext<'_>, source: &Node) -> PgResult<()> {
    let mut conn = PgConnection::connect(&source.addr, &ctx.coordinator.config.service_login()).await?;
    let since = conn.query_value("SELECT clock_timestamp()").await?.unwrap_or_default();
    let deadline = Instant::now() + DRAIN_PATIENCE;
    let sql = format!(
        "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()
           AND backend_xid IS NOT NULL AND xact_start < {}::timestamptz",
        quote_literal(&since)
    );
    while Instant::now() < deadline && conn.query_value(&sql).await?.as_deref() != Some("0") {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    conn.terminate().await;
    Ok(())
}

/// Waits until the subscription has copied every table, telling the client
/// how far it got.
async fn wait_for_initial_copy(
    ctx: &mut CommandContext<'_>,
    target_conn: &mut PgConnection,
    subscription: &str,
    group: &Group,
    tables: usize,
    target: &Node,
) -> PgResult<()> {
    let sql = format!(
        "SELECT count(*) FILTER (WHERE r.srsubstate IN ('r', 's')), count(*),
                (SELECT coalesce(sum(sync_error_count + apply_error_count), 0) FROM pg_stat_subscription_stats WHERE subname = {name})
           FROM pg_subscription s JOIN pg_subscription_rel r ON r.srsubid = s.oid WHERE s.subname = {name}",
        name = quote_literal(subscription)
    );
    let mut reported = None;
    loop {
        let row = target_conn.query(&sql).await?.into_iter().next().unwrap_or_default();
        let number = |i: usize| row.get(i).cloned().flatten().and_then(|v| v.parse::<usize>().ok()).unwrap_or(0);
        let (ready, total, errors) = (number(0), number(1), number(2));
        if errors > 0 {
            return Err(PgError::new(
                sqlstate::INTERNAL_ERROR,
                format!("the subscription copying shard group {} to {} failed", group.index, target.addr),
            )
            .with_hint(format!("See the server log of {}; the move can be started again.", target.addr)));
        }
        if reported != Some(ready) {
            ctx.notice(format!("copying shard group {}: {ready} of {tables} tables copied", group.index)).await;
            reported = Some(ready);
        }
        if total == tables && ready == total {
            return Ok(());
        }
        ctx.check_stopped()?;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until the target has replayed the source's WAL up to `lsn`.
async fn wait_for_replay(target_conn: &mut PgConnection, subscription: &str, lsn: &str, target: &Node) -> PgResult<()> {
    let sql = format!(
        "SELECT coalesce(bool_and(latest_end_lsn >= {lsn}::pg_lsn), false) FROM pg_stat_subscription WHERE subname = {name} AND relid IS NULL",
        lsn = quote_literal(lsn),
        name = quote_literal(subscription)
    );
    let deadline = Instant::now() + CATCH_UP_PATIENCE;
    while target_conn.query_value(&sql).await?.as_deref() != Some("t") {
        if Instant::now() > deadline {
            return Err(PgError::new(
                sqlstate::INTERNAL_ERROR,
                format!("{} did not catch up with the source within {} s", target.addr, CATCH_UP_PATIENCE.as_secs()),
            )
            .with_hint("The move was rolled back; start it again when the target is less busy."));
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    Ok(())
}

/// The constraint `bound_check_sql` adds, dropped once the shard is attached.
const BOUND_CHECK: &str = "tessera_move_bound";

/// A check constraint equal to the partition bound the new shard will be
/// attached with under the target's parent (oid `parent`), so PostgreSQL
/// skips the scan.
fn bound_check_sql(table: &DistributedTable, shard: &Shard, parent: &str) -> String {
    let key = match &table.distribution {
        crate::metadata::Distribution::Hash { column, .. } => quote_ident(column),
        crate::metadata::Distribution::Reference => String::new(),
    };
    format!(
        "ALTER TABLE {} ADD CONSTRAINT {BOUND_CHECK} CHECK (satisfies_hash_partition({}::oid, {}, {}, {key}))",
        table.qualified_shard_name(shard),
        quote_literal(parent),
        table.shard_count(),
        shard.index
    )
}

/// Test-only: dies here when the configuration says so (see `Fault`).
fn fault(ctx: &CommandContext<'_>, at: Fault) {
    crate::transaction::inject_fault(ctx.coordinator.config.transactions.fault(), at);
}

/// Names the node and object an error came from.
fn on_node(e: PgError, node: &Node, what: &str) -> PgError {
    e.map_message(|m| format!("{m} (on {}, {what})", node.addr))
}

/// A value for a libpq connection string.
fn conninfo_value(value: &str) -> String {
    format!("'{}'", value.replace('\\', "\\\\").replace('\'', "\\'"))
}

/// A shard table as its node has it: what makes it, what follows once the
/// copy has begun (foreign keys, not validated yet, and triggers, which do
/// not act on replicated or replica-role rows; grants, row security), the
/// columns a COPY carries, and the validation of the foreign keys.
struct Definition {
    schema: Vec<String>,
    after_data: Vec<String>,
    copy_columns: String,
    validate: Vec<String>,
}

/// Reads `name`'s definition on a connection whose search_path is
/// pg_catalog alone (so every name comes out qualified). A partition
/// (`partition`) is attached to its parent's shard, which then gives it
/// the keys, indexes and triggers it inherits; a partitioned table holds
/// no rows to copy.
async fn read_definition(conn: &mut PgConnection, name: &str, partition: bool) -> PgResult<Definition> {
    let rel = format!("{}::regclass", quote_literal(name));
    // Inside format() string literals below.
    let name = name.replace('\'', "''").replace('%', "%%");
    let rows = conn
        .query(&format!(
            "SELECT 0, 0, format('CREATE TABLE {name} (%s)%s', string_agg(format('%I %s%s%s%s', a.attname, format_type(a.atttypid, a.atttypmod),
                        CASE WHEN a.attcollation <> 0 AND a.attcollation <> t.typcollation THEN ' COLLATE ' || a.attcollation::regcollation::text ELSE '' END,
                        CASE WHEN a.attgenerated = 's' THEN format(' GENERATED ALWAYS AS (%s) STORED', pg_get_expr(d.adbin, d.adrelid))
                             WHEN d.adbin IS NOT NULL THEN ' DEFAULT ' || pg_get_expr(d.adbin, d.adrelid) ELSE '' END,
                        CASE WHEN a.attnotnull THEN ' NOT NULL' ELSE '' END), ', ' ORDER BY a.attnum),
                        (SELECT CASE WHEN c.relkind = 'p' THEN ' PARTITION BY ' || pg_get_partkeydef(c.oid) ELSE '' END FROM pg_class c WHERE c.oid = {rel}))
               FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
              WHERE a.attrelid = {rel} AND a.attnum > 0 AND NOT a.attisdropped
             UNION ALL
             SELECT 0, 1, format('ALTER TABLE {name} OWNER TO %I', pg_get_userbyid(c.relowner)) FROM pg_class c WHERE c.oid = {rel}
             UNION ALL
             SELECT 0, 2, format('ALTER TABLE {name} SET (%s)', array_to_string(c.reloptions, ', ')) FROM pg_class c WHERE c.oid = {rel} AND c.reloptions IS NOT NULL
             UNION ALL
             SELECT 0, 3, format('ALTER TABLE {name} ADD CONSTRAINT %I %s', conname, pg_get_constraintdef(oid)) FROM pg_constraint
              WHERE conrelid = {rel} AND contype IN ('p', 'u', 'x', 'c') AND conparentid = 0
             UNION ALL
             SELECT 0, 4, pg_get_indexdef(i.indexrelid) FROM pg_index i
              WHERE i.indrelid = {rel} AND NOT EXISTS (SELECT FROM pg_constraint k WHERE k.conindid = i.indexrelid AND k.conrelid = {rel})
                AND NOT EXISTS (SELECT FROM pg_inherits x WHERE x.inhrelid = i.indexrelid)
             UNION ALL
             SELECT 0, 5, CASE c.relreplident WHEN 'f' THEN 'ALTER TABLE {name} REPLICA IDENTITY FULL' WHEN 'n' THEN 'ALTER TABLE {name} REPLICA IDENTITY NOTHING'
                          ELSE format('ALTER TABLE {name} REPLICA IDENTITY USING INDEX %I', (SELECT ic.relname FROM pg_index i JOIN pg_class ic ON ic.oid = i.indexrelid WHERE i.indrelid = c.oid AND i.indisreplident)) END
               FROM pg_class c WHERE c.oid = {rel} AND c.relreplident <> 'd'
             UNION ALL
             SELECT 0, 6, format('ALTER TABLE %s ATTACH PARTITION {name} %s', x.inhparent::regclass, pg_get_expr(c.relpartbound, c.oid))
               FROM pg_class c JOIN pg_inherits x ON x.inhrelid = c.oid WHERE c.oid = {rel} AND {partition}
             UNION ALL
             SELECT 1, 0, format('ALTER TABLE {name} ADD CONSTRAINT %I %s%s', conname, pg_get_constraintdef(oid), CASE WHEN convalidated THEN ' NOT VALID' ELSE '' END)
               FROM pg_constraint WHERE conrelid = {rel} AND contype = 'f' AND conparentid = 0
             UNION ALL
             SELECT 3, 0, format('ALTER TABLE {name} VALIDATE CONSTRAINT %I', conname) FROM pg_constraint WHERE conrelid = {rel} AND contype = 'f' AND convalidated AND conparentid = 0
             UNION ALL
             SELECT 1, 1, pg_get_triggerdef(oid) FROM pg_trigger WHERE tgrelid = {rel} AND NOT tgisinternal AND tgparentid = 0
             UNION ALL
             SELECT 1, 2, format('ALTER TABLE {name} %s TRIGGER %I', CASE tgenabled WHEN 'D' THEN 'DISABLE' WHEN 'R' THEN 'ENABLE REPLICA' ELSE 'ENABLE ALWAYS' END, tgname)
               FROM pg_trigger WHERE tgrelid = {rel} AND NOT tgisinternal AND tgenabled <> 'O' AND tgparentid = 0
             UNION ALL
             SELECT 1, 3, 'ALTER TABLE {name} ENABLE ROW LEVEL SECURITY' FROM pg_class WHERE oid = {rel} AND relrowsecurity
             UNION ALL
             SELECT 1, 3, 'ALTER TABLE {name} FORCE ROW LEVEL SECURITY' FROM pg_class WHERE oid = {rel} AND relforcerowsecurity
             UNION ALL
             SELECT 1, 4, format('CREATE POLICY %I ON {name} AS %s FOR %s TO %s', pol.polname, CASE WHEN pol.polpermissive THEN 'PERMISSIVE' ELSE 'RESTRICTIVE' END,
                                 CASE pol.polcmd WHEN 'r' THEN 'SELECT' WHEN 'a' THEN 'INSERT' WHEN 'w' THEN 'UPDATE' WHEN 'd' THEN 'DELETE' ELSE 'ALL' END,
                                 array_to_string(ARRAY(SELECT CASE r WHEN 0 THEN 'PUBLIC' ELSE quote_ident(pg_get_userbyid(r)) END FROM unnest(pol.polroles) r), ', '))
                    || coalesce(' USING (' || pg_get_expr(pol.polqual, pol.polrelid) || ')', '') || coalesce(' WITH CHECK (' || pg_get_expr(pol.polwithcheck, pol.polrelid) || ')', '')
               FROM pg_policy pol WHERE pol.polrelid = {rel}
             UNION ALL
             SELECT 1, 5, format('GRANT %s%s ON TABLE {name} TO %s%s', g.privilege_type, coalesce(' (' || quote_ident(g.attname) || ')', ''),
                                 CASE g.grantee WHEN 0 THEN 'PUBLIC' ELSE quote_ident(pg_get_userbyid(g.grantee)) END, CASE WHEN g.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END)
               FROM (SELECT a.privilege_type, NULL::name AS attname, a.grantee, a.is_grantable FROM pg_class c, aclexplode(c.relacl) a WHERE c.oid = {rel} AND a.grantee <> c.relowner
                     UNION ALL
                     SELECT a.privilege_type, att.attname, a.grantee, a.is_grantable FROM pg_attribute att, aclexplode(att.attacl) a WHERE att.attrelid = {rel} AND att.attnum > 0 AND NOT att.attisdropped) g
             UNION ALL
             SELECT 2, 0, string_agg(quote_ident(attname), ', ' ORDER BY attnum) FROM pg_attribute WHERE attrelid = {rel} AND attnum > 0 AND NOT attisdropped AND attgenerated = ''
                AND (SELECT relkind FROM pg_class WHERE oid = {rel}) = 'r'
             ORDER BY 1, 2"
        ))
        .await?;
    let mut definition = Definition { schema: Vec::new(), after_data: Vec::new(), copy_columns: String::new(), validate: Vec::new() };
    for row in rows {
        let Some(sql) = row[2].clone() else { continue };
        match row[0].as_deref() {
            Some("0") => definition.schema.push(sql),
            Some("1") => definition.after_data.push(sql),
            Some("2") => definition.copy_columns = sql,
            _ => definition.validate.push(sql),
        }
    }
    if definition.schema.is_empty() {
        return Err(PgError::internal(format!("shard {name} has no definition on its node")));
    }
    if definition.schema[0].contains(" PARTITION BY HASH") {
        // The workers' views of its partitions name its shards.
        return Err(PgError::not_supported(format!("moving shard {name}, which is partitioned by hash, is not supported"))
            .with_hint("Shard groups whose tables are unpartitioned or partitioned by range or list can move."));
    }
    Ok(definition)
}
