//! Worker-side relations. On every worker, each distributed table also exists
//! under its own schema and name: a hash-partitioned parent whose partitions
//! are the worker's own shards (attached as they are) and, for the shards on
//! other nodes, `postgres_fdw` foreign tables in the `tessera_remote` schema.
//! A reference table is a view of the worker's own copy, a partition of a
//! distributed table a view of its rows in its root's parent. User code that runs
//! on a worker (functions, procedures, DO blocks, triggers) therefore sees
//! whole tables, and partition pruning takes `WHERE key = $1` straight to the
//! local shard.
//!
//! The parents are created in the same distributed transaction as the shards
//! and dropped with them. Column changes go through the parent (PostgreSQL
//! forbids them on a partition alone), which passes them on to the local
//! shards and the foreign tables; see `planner::ddl` for which commands.
//!
//! The foreign servers do not lead to the other nodes directly but through
//! the coordinator's link relay (`transaction::links`), which makes writes
//! into foreign partitions commit with the worker's own transaction, all or
//! nothing; a trigger on each foreign table gives that transaction the xid
//! the relay names the writes after. Reference tables are written only
//! through the coordinator, which writes every copy: their views refuse
//! writes.

use super::table_ddl::TableDefinition;
use super::{run_per_node, CommandContext};
use crate::config::Config;
use crate::connection::{quote_ident, quote_literal, PgConnection, ServerAddr, QUALIFIED_NAMES};
use crate::error::{PgError, PgResult};
use crate::metadata::{Catalog, DistributedTable, Distribution, Node, Shard};
use crate::planner::ForeignRetype;
use crate::transaction::links::link_application_name;
use std::collections::BTreeMap;

/// Where the foreign tables standing for other nodes' shards live.
const REMOTE_SCHEMA: &str = "tessera_remote";

fn server_name(group: i32) -> String {
    format!("tessera_node_{group}")
}

fn foreign_table_name(table: &DistributedTable, shard: &Shard) -> String {
    format!("{REMOTE_SCHEMA}.{}", quote_ident(&table.shard_relname(shard)))
}

/// What a distributed table is on a worker.
enum Shape {
    /// Hash-distributed and not a partition: a partitioned parent of the
    /// shards, with these column definitions (the shards' own), owned by
    /// the shell's owner (queries through it are checked against it).
    Parent { columns: Vec<String>, owner: String },
    /// A reference table: a view of the worker's copy.
    ReferenceView,
    /// A partition of a distributed table: a view of its rows in its root's
    /// parent (which reaches them by partition pruning), with its columns in
    /// its own order. A hash partition's constraint names its parent by
    /// oid, the coordinator's: `hash_parents` are those tables (coordinator
    /// oid, and the table), whose local shards stand in for them.
    PartitionView { root: String, columns: String, constraint: String, hash_parents: Vec<(u32, std::sync::Arc<DistributedTable>)> },
}

/// Statements creating `table`'s relation on node `group`. A parent is made
/// inside the distributing transaction, when the shards are new and empty,
/// so attaching them scans nothing.
fn create_sql(table: &DistributedTable, shape: &Shape, group: i32) -> Vec<String> {
    let name = table.qualified_name();
    match shape {
        Shape::ReferenceView => {
            let Some(shard) = table.shards.first() else { return Vec::new() };
            vec![
                format!("CREATE VIEW {name} WITH (security_invoker = true) AS SELECT * FROM {}", table.qualified_shard_name(shard)),
                format!("GRANT ALL ON {name} TO PUBLIC"),
                format!(
                    "CREATE TRIGGER tessera_reference_write INSTEAD OF INSERT OR UPDATE OR DELETE ON {name} FOR EACH ROW EXECUTE FUNCTION {REMOTE_SCHEMA}.refuse_reference_write({})",
                    quote_literal(&name)
                ),
            ]
        }
        Shape::PartitionView { root, columns, constraint, hash_parents } => {
            let mut constraint = constraint.clone();
            for (oid, parent) in hash_parents {
                // Any shard of the parent has its partition key; a node with
                // none of them goes without the view.
                let Some(shard) = parent.shards.iter().find(|s| s.placements.contains(&group)) else { return Vec::new() };
                constraint =
                    constraint.replace(&format!("'{oid}'::oid"), &format!("{}::regclass::oid", quote_literal(&parent.qualified_shard_name(shard))));
            }
            vec![
                format!("CREATE VIEW {name} WITH (security_invoker = true) AS SELECT {columns} FROM {root} WHERE {constraint} WITH CHECK OPTION"),
                format!("GRANT ALL ON {name} TO PUBLIC"),
            ]
        }
        Shape::Parent { columns, owner } => {
            let Distribution::Hash { column: key, .. } = &table.distribution else { return Vec::new() };
            let mut out = vec![
                format!("CREATE TABLE {name} ({}) PARTITION BY HASH ({})", columns.join(", "), quote_ident(key)),
                format!("ALTER TABLE {name} OWNER TO {}", quote_ident(owner)),
            ];
            for shard in &table.shards {
                out.extend(partition_sql(table, shard, &shard.placements, group));
            }
            out
        }
    }
}

/// Statements on node `group` making shard `shard`, placed on `placements`,
/// a partition of `table`'s parent there: the shard itself where it is
/// local, else a foreign table over its placement.
fn partition_sql(table: &DistributedTable, shard: &Shard, placements: &[i32], group: i32) -> Vec<String> {
    let name = table.qualified_name();
    let bound = partition_bound(table, shard);
    if placements.contains(&group) {
        return vec![format!("ALTER TABLE {name} ATTACH PARTITION {} {bound}", table.qualified_shard_name(shard))];
    }
    let Some(g) = placements.first() else { return Vec::new() };
    let foreign = foreign_table_name(table, shard);
    vec![
        format!(
            "CREATE FOREIGN TABLE {foreign} PARTITION OF {name} {bound} SERVER {} OPTIONS (schema_name {}, table_name {})",
            server_name(*g),
            quote_literal(&table.schema),
            quote_literal(&table.shard_relname(shard))
        ),
        remote_write_trigger_sql(&foreign),
    ]
}

/// What a shard of `table` holds, as a partition of its parent.
fn partition_bound(table: &DistributedTable, shard: &Shard) -> String {
    format!("FOR VALUES WITH (MODULUS {}, REMAINDER {})", table.shard_count(), shard.index)
}

/// The shards of `table` that are foreign tables of its parent on node
/// group `group`: those placed elsewhere.
fn foreign_shards(table: &DistributedTable, group: i32) -> impl Iterator<Item = &Shard> {
    table.shards.iter().filter(move |s| !s.placements.contains(&group))
}

/// Statements on node group `group` taking the foreign tables out of
/// `table`'s parent ahead of a column change it cannot pass on to them
/// (`ForeignRetype`); `reattach_foreign_sql` brings them back.
pub fn detach_foreign_sql(table: &DistributedTable, group: i32) -> Vec<String> {
    foreign_shards(table, group)
        .map(|shard| format!("ALTER TABLE {} DETACH PARTITION {}", table.qualified_name(), foreign_table_name(table, shard)))
        .collect()
}

/// Statements on node group `group` giving the foreign tables detached
/// from `table`'s parent the parent's new column types, then attaching
/// them again (a foreign table is attached without a scan).
pub fn reattach_foreign_sql(table: &DistributedTable, retype: &ForeignRetype, group: i32) -> PgResult<Vec<String>> {
    let mut out = Vec::new();
    for shard in foreign_shards(table, group) {
        out.push(retype.sql_for(REMOTE_SCHEMA, &table.shard_relname(shard))?);
        out.push(format!(
            "ALTER TABLE {} ATTACH PARTITION {} {}",
            table.qualified_name(),
            foreign_table_name(table, shard),
            partition_bound(table, shard)
        ));
    }
    Ok(out)
}

/// Statements on node `group` pointing the partition of `table`'s parent
/// for `shard` at its placement on node group `to` instead of `from` (after
/// a shard move). They may run again after a partial run: each step checks
/// whether it is still needed.
pub fn repoint_sql(table: &DistributedTable, shard: &Shard, from: i32, to: i32, group: i32) -> Vec<String> {
    if !table.has_worker_parent() {
        return Vec::new();
    }
    let parent = table.qualified_name();
    let local = table.qualified_shard_name(shard);
    let attached = |shard_table: &str| {
        format!("EXISTS (SELECT FROM pg_catalog.pg_inherits WHERE inhrelid = pg_catalog.to_regclass({}))", quote_literal(shard_table))
    };
    let mut out = Vec::new();
    if group == from {
        out.push(format!("DO $tessera$ BEGIN IF {} THEN ALTER TABLE {parent} DETACH PARTITION {local}; END IF; END $tessera$", attached(&local)));
    }
    out.push(format!("DROP FOREIGN TABLE IF EXISTS {}", foreign_table_name(table, shard)));
    if group == to {
        let attach = partition_sql(table, shard, &[to], group).join("; ");
        out.push(format!("DO $tessera$ BEGIN IF NOT {} THEN {attach}; END IF; END $tessera$", attached(&local)));
    } else {
        out.extend(partition_sql(table, shard, &[to], group));
    }
    out
}

/// A trigger making a shard's old placement refuse writes once the catalog
/// names its new one: statements that were already on their way to it (from
/// other coordinator processes, or user code on its node) fail rather than
/// write where nobody reads.
pub fn refuse_writes_sql(table: &DistributedTable, shard: &Shard) -> String {
    format!(
        "CREATE TRIGGER tessera_moved BEFORE INSERT OR UPDATE OR DELETE OR TRUNCATE ON {} FOR EACH STATEMENT EXECUTE FUNCTION {REMOTE_SCHEMA}.refuse_moved_write({})",
        table.qualified_shard_name(shard),
        quote_literal(&table.qualified_name())
    )
}

/// Creates the relation of table `oid` on every active node (only on node
/// group `only_group`, when set), as the catalog stands in the current
/// block: when a node, a partition attached or detached, or a change of
/// columns needs one.
pub(super) async fn create(ctx: &mut CommandContext<'_>, oid: u32, only_group: Option<i32>) -> PgResult<()> {
    let catalog = crate::metadata::load_tables_in_block(ctx.parts.local().await?, &ctx.catalog, &[oid]).await?;
    let per_node = create_statements(ctx, &catalog, oid, only_group).await?;
    let committed = std::mem::replace(&mut ctx.catalog, std::sync::Arc::new(catalog));
    let result = run_per_node(ctx, per_node).await;
    ctx.catalog = committed;
    result
}

/// The statements creating the relation of table `oid` on every active
/// node of `catalog` (a catalog of the current block, which knows the
/// table), or only on node group `only_group`, by node group.
pub(super) async fn create_statements(
    ctx: &mut CommandContext<'_>,
    catalog: &Catalog,
    oid: u32,
    only_group: Option<i32>,
) -> PgResult<BTreeMap<i32, Vec<String>>> {
    let local = ctx.parts.local().await?;
    let table = catalog.table_by_oid(oid).cloned().ok_or_else(|| PgError::internal(format!("table {oid} is not in the catalog")))?;
    let shape = if table.is_reference() {
        Shape::ReferenceView
    } else if table.partition_of.is_some() {
        let mut root = table.clone();
        let mut ancestors = Vec::new();
        while let Some(parent) = root.partition_of.and_then(|p| catalog.table_by_oid(p)) {
            root = parent.clone();
            ancestors.push((root.oid, root.clone()));
        }
        let saved = local.set_for_now(&QUALIFIED_NAMES).await?;
        let row = local
            .query(&format!(
                "SELECT pg_get_partition_constraintdef({oid}),
                        (SELECT string_agg(quote_ident(attname), ', ' ORDER BY attnum) FROM pg_attribute WHERE attrelid = {oid} AND attnum > 0 AND NOT attisdropped)"
            ))
            .await;
        let row = local.restore_after(saved, row).await?;
        let value = |i: usize| {
            row.first()
                .and_then(|r| r.get(i).cloned().flatten())
                .ok_or_else(|| PgError::internal(format!("partition {oid} has no constraint or columns")))
        };
        let constraint = value(0)?;
        let hash_parents = ancestors.into_iter().filter(|(oid, _)| constraint.contains(&format!("'{oid}'::oid"))).collect();
        Shape::PartitionView { root: root.qualified_name(), constraint, columns: value(1)?, hash_parents }
    } else {
        let owner = local.query(&format!("SELECT pg_get_userbyid(relowner) FROM pg_class WHERE oid = {oid}")).await?;
        let owner = owner.first().and_then(|r| r.first().cloned().flatten()).ok_or_else(|| PgError::internal(format!("table {oid} has no owner")))?;
        Shape::Parent { columns: TableDefinition::read(local, oid).await?.columns().to_vec(), owner }
    };
    Ok(catalog
        .active_nodes()
        .filter(|n| only_group.is_none_or(|g| g == n.group_id))
        .map(|n| (n.group_id, create_sql(&table, &shape, n.group_id)))
        .collect())
}

/// The statement dropping `table`'s relation on a node, and what depends on
/// it there (as DROP TABLE … CASCADE or undistribute_table drop it), with
/// the table's shards: attached ones go with their parent.
pub fn drop_sql(table: &DistributedTable) -> String {
    let kind = if table.has_worker_parent() { "TABLE" } else { "VIEW" };
    format!("DROP {kind} IF EXISTS {} CASCADE", table.qualified_name())
}

/// Statements dropping `table`'s relation on node `group` while keeping its
/// shards there, to be made again of another kind or with other columns: a
/// parent lets go of its shards (about to be attached elsewhere); a view
/// another view depends on is not dropped silently.
pub fn release_sql(table: &DistributedTable, group: i32) -> Vec<String> {
    let name = table.qualified_name();
    if !table.has_worker_parent() {
        return vec![format!("DROP VIEW IF EXISTS {name}")];
    }
    let mut out: Vec<String> = table
        .shards
        .iter()
        .filter(|s| s.placements.contains(&group))
        .map(|s| format!("ALTER TABLE {name} DETACH PARTITION {}", table.qualified_shard_name(s)))
        .collect();
    out.push(format!("DROP TABLE IF EXISTS {name} CASCADE"));
    out
}

/// Statements on node `group` pointing the foreign tables of `table`'s
/// shards elsewhere at their new names after the table was renamed to
/// `new_name` (its shards were renamed with it).
pub fn rename_foreign_sql(table: &DistributedTable, new_name: &str, group: i32) -> Vec<String> {
    let mut out = Vec::new();
    for shard in foreign_shards(table, group) {
        let renamed = format!("{new_name}_{}", shard.id);
        let foreign = foreign_table_name(table, shard);
        out.push(format!("ALTER FOREIGN TABLE {foreign} OPTIONS (SET table_name {})", quote_literal(&renamed)));
        out.push(format!("ALTER FOREIGN TABLE {foreign} RENAME TO {}", quote_ident(&renamed)));
    }
    out
}

/// The trigger that gives a worker transaction writing through foreign
/// table `foreign` an xid and a commit record (`transaction::decided`),
/// even when it writes nothing locally: the link relay names the remote
/// part after it, and the record decides that part.
fn remote_write_trigger_sql(foreign: &str) -> String {
    format!("CREATE TRIGGER tessera_remote_write BEFORE INSERT OR UPDATE OR DELETE ON {foreign} FOR EACH ROW EXECUTE FUNCTION {REMOTE_SCHEMA}.remote_write()")
}

/// What every worker needs before relations can be built on it, made by
/// the coordinator's service role (a superuser): postgres_fdw, the schema
/// for foreign tables, a foreign server for every other node, and for each
/// role a user mapping that logs in as that role (so the other node checks
/// its privileges, as the coordinator's own connections do). Idempotent.
fn setup_sql(node: &Node, nodes: &[Node], relay: &ServerAddr) -> String {
    let mut sql = format!(
        "{decisions}
         CREATE EXTENSION IF NOT EXISTS postgres_fdw;
         CREATE SCHEMA IF NOT EXISTS {REMOTE_SCHEMA};
         GRANT USAGE, CREATE ON SCHEMA {REMOTE_SCHEMA} TO PUBLIC;
         CREATE OR REPLACE FUNCTION {REMOTE_SCHEMA}.remote_write() RETURNS trigger LANGUAGE plpgsql AS $tessera$
         BEGIN
           {record_once};
           IF TG_OP = 'DELETE' THEN RETURN OLD; END IF;
           RETURN NEW;
         END $tessera$;
         -- Before the link relay, a trigger of this name refused such writes.
         DO $tessera$ DECLARE t regclass;
         BEGIN
           IF to_regprocedure('{REMOTE_SCHEMA}.refuse_write()') IS NOT NULL THEN
             FOR t IN SELECT tgrelid::regclass FROM pg_trigger WHERE tgfoid = '{REMOTE_SCHEMA}.refuse_write()'::regprocedure LOOP
               EXECUTE format('DROP TRIGGER tessera_remote_write ON %s', t);
               EXECUTE format('CREATE TRIGGER tessera_remote_write BEFORE INSERT OR UPDATE OR DELETE ON %s FOR EACH ROW EXECUTE FUNCTION {REMOTE_SCHEMA}.remote_write()', t);
             END LOOP;
             DROP FUNCTION {REMOTE_SCHEMA}.refuse_write();
           END IF;
         END $tessera$;
         CREATE OR REPLACE FUNCTION {REMOTE_SCHEMA}.refuse_moved_write() RETURNS trigger LANGUAGE plpgsql AS $tessera$
         BEGIN
           RAISE EXCEPTION 'this shard of % moved to another node while the statement waited for it', TG_ARGV[0]
             USING ERRCODE = '40001', HINT = 'Retry the transaction: the coordinator now routes it to the new node.';
         END $tessera$;
         CREATE OR REPLACE FUNCTION {REMOTE_SCHEMA}.refuse_reference_write() RETURNS trigger LANGUAGE plpgsql AS $tessera$
         BEGIN
           RAISE EXCEPTION 'the reference table % cannot be written on a worker: every node holds a copy of it', TG_ARGV[0]
             USING ERRCODE = '0A000', HINT = 'Write to it through the Tessera coordinator, which writes every copy in one transaction.';
         END $tessera$;
         {forget_roles}
         -- Every role gets a mapping that logs it in as itself, so that the
         -- other node checks its privileges. Only a superuser may waive the
         -- password for non-superusers; the nodes trust each other's network.
         CREATE OR REPLACE FUNCTION {REMOTE_SCHEMA}.map_roles() RETURNS void LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $tessera$
         DECLARE r record;
         BEGIN
           FOR r IN SELECT s.srvname, a.rolname, m.umoptions IS NOT NULL AS mapped
                      FROM pg_foreign_server s CROSS JOIN pg_roles a
                      LEFT JOIN pg_user_mappings m ON m.srvid = s.oid AND m.umuser = a.oid
                     WHERE s.srvname LIKE 'tessera\\_node\\_%' AND a.rolname !~ '^pg_'
                       AND (m.umoptions IS NULL OR NOT (format('user=%s', a.rolname) = ANY (m.umoptions))) LOOP
             IF r.mapped THEN
               EXECUTE format('ALTER USER MAPPING FOR %I SERVER %I OPTIONS (SET user %L)', r.rolname, r.srvname, r.rolname);
             ELSE
               EXECUTE format('CREATE USER MAPPING FOR %I SERVER %I OPTIONS (user %L, password_required ''false'')', r.rolname, r.srvname, r.rolname);
             END IF;
           END LOOP;
         END $tessera$;",
        forget_roles = crate::metadata::forget_roles_function(REMOTE_SCHEMA),
        decisions = crate::transaction::decided::deciding_objects_sql(),
        record_once = crate::transaction::decided::RECORD_ONCE_SQL,
    );
    for other in nodes.iter().filter(|n| n.group_id != node.group_id) {
        let server = server_name(other.group_id);
        // The relay tells the other node by the link's name; postgres_fdw
        // puts its backend's pid in place of %p.
        sql.push_str(&format!(
            "\nDO $tessera$ BEGIN
               IF NOT EXISTS (SELECT FROM pg_foreign_server WHERE srvname = {server_literal}) THEN
                 EXECUTE format('CREATE SERVER {server} FOREIGN DATA WRAPPER postgres_fdw OPTIONS (host %L, port %L, dbname %L, application_name %L)', {host}, {port}, current_database(), {name});
                 GRANT USAGE ON FOREIGN SERVER {server} TO PUBLIC;
               ELSIF NOT EXISTS (SELECT FROM pg_foreign_server WHERE srvname = {server_literal} AND srvoptions @> ARRAY['application_name=' || {name}]) THEN
                 ALTER SERVER {server} OPTIONS (SET host {host}, SET port {port}, ADD application_name {name});
               ELSE
                 ALTER SERVER {server} OPTIONS (SET host {host}, SET port {port});
               END IF;
             END $tessera$;",
            server_literal = quote_literal(&server),
            host = quote_literal(&relay.host),
            port = quote_literal(&relay.port.to_string()),
            name = quote_literal(&link_application_name(node.group_id, other.group_id)),
        ));
    }
    sql.push_str(&format!("\nSELECT {REMOTE_SCHEMA}.map_roles();"));
    sql
}

/// Gives roles created or renamed in the current transaction their user
/// mappings on a node (a no-op on a node not prepared yet).
pub const MAP_ROLES_SQL: &str =
    "DO $tessera$ BEGIN IF to_regprocedure('tessera_remote.map_roles()') IS NOT NULL THEN PERFORM tessera_remote.map_roles(); END IF; END $tessera$";

/// Drops the user mappings of roles about to be dropped on a node.
pub fn forget_roles_sql(roles: &[String]) -> String {
    crate::metadata::forget_roles_sql(REMOTE_SCHEMA, roles)
}

/// Makes `nodes` ready for worker-side relations among each other
/// (`setup_sql`) inside the current block, on the session's connections:
/// `citus_add_node`, which only a superuser may run.
pub(super) async fn prepare_in_block(ctx: &mut CommandContext<'_>, nodes: &[Node]) -> PgResult<()> {
    let relay = ctx.coordinator.links.addr.clone();
    for node in nodes {
        let worker = ctx.parts.worker(node, crate::transaction::Access::Write).await?;
        worker.conn.execute(&setup_sql(node, nodes, &relay)).await?;
    }
    Ok(())
}

/// Makes `node` ready for worker-side relations among `all` (`setup_sql`),
/// on a service connection of its own, when the coordinator starts or the
/// node answers again. The error names the node.
pub async fn prepare_node(config: &Config, relay: &ServerAddr, node: &Node, all: &[Node]) -> PgResult<()> {
    PgConnection::query_once(&node.addr, &config.service_login(), &setup_sql(node, all, relay))
        .await
        .map(|_| ())
        .map_err(|e| e.with_context(format!("while preparing node {} for worker-side relations", node.addr)))
}
