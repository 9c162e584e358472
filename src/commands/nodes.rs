//! citus_add_node, citus_remove_node, citus_update_node, citus_disable_node,
//! citus_activate_node and citus_set_node_property.

use super::read_shard_rows;
use super::table_ddl::TableDefinition;
use crate::config::ServerAddr;
use crate::connection::{quote_literal, PgConnection};
use crate::error::{sqlstate, PgError, PgResult};
use crate::metadata::{DistributedTable, Node, Shard};
use crate::process::context::CommandContext;
use crate::transaction::Access;
use std::sync::Arc;

/// Registers a worker (idempotent) and copies every reference table to it.
/// Returns its node id.
pub async fn add_node(ctx: &mut CommandContext<'_>, host: &str, port: u16) -> PgResult<i32> {
    if let Some(n) = ctx.catalog.node_at(host, port) {
        return Ok(n.id);
    }
    let addr = ServerAddr { host: host.to_string(), port };
    reach(ctx, &addr).await?;
    let implicit = ctx.parts.begin_implicit();
    let result = async {
        let local = ctx.parts.local().await?;
        let row = local
            .query(&format!(
                "INSERT INTO tessera.pg_dist_node (nodename, nodeport) VALUES ({}, {port}) RETURNING nodeid, groupid",
                quote_literal(host)
            ))
            .await?;
        let id: i32 = row[0][0].as_deref().unwrap_or("0").parse().unwrap_or(0);
        let group: i32 = row[0][1].as_deref().unwrap_or("0").parse().unwrap_or(0);
        let node = Node { id, group_id: group, addr: addr.clone(), active: true, should_have_shards: true, type_oids: Default::default() };
        let mut catalog = (*ctx.catalog).clone();
        catalog.nodes.push(node.clone());
        bring_up_to_date(ctx, catalog, &node).await?;
        Ok(id)
    }
    .await;
    ctx.finish_block(implicit, result).await
}

/// Fails early, naming the node, when the node at `addr` cannot be reached.
/// Its links log in with the roles' certificates, as the other nodes' do.
async fn reach(ctx: &mut CommandContext<'_>, addr: &ServerAddr) -> PgResult<()> {
    let roles = crate::connection::node_tls::role_names(ctx.parts.local().await?).await?;
    crate::connection::node_tls::provide_on_nodes(std::slice::from_ref(addr), &ctx.coordinator.config.service_login(), Some(&roles)).await?;
    PgConnection::connect(addr, ctx.parts.login()).await?.terminate().await;
    Ok(())
}

/// `citus_disable_node`: takes a node out of service (maintenance, or a
/// server that is down). Its copies of reference tables are forgotten (the
/// others take the writes and the reads), statements that need its shards
/// of distributed tables fail naming it, and nothing new is placed on it.
pub async fn disable_node(ctx: &mut CommandContext<'_>, host: &str, port: u16) -> PgResult<()> {
    let node = ctx.catalog.registered_node(host, port)?;
    if !node.active {
        return Ok(());
    }
    let other_copy = |shard: &Shard| shard.placements.iter().any(|g| *g != node.group_id && ctx.catalog.node_for_group(*g).is_some_and(|n| n.active));
    let references: Vec<Arc<DistributedTable>> = ctx.catalog.tables().filter(|t| t.is_reference()).cloned().collect();
    let only_copies: Vec<&str> = references
        .iter()
        .filter(|t| t.shards.first().is_some_and(|s| s.placements.contains(&node.group_id) && !other_copy(s)))
        .map(|t| t.name.as_str())
        .collect();
    if !only_copies.is_empty() {
        return Err(PgError::new(
            sqlstate::OBJECT_IN_USE,
            format!("cannot disable node {host}:{port}: it holds the only active copy of reference table {}", only_copies.join(", ")),
        )
        .with_hint("Add another node first (citus_add_node copies the reference tables to it)."));
    }
    let forget = forget_reference_copies_sql(&ctx.catalog, node.group_id);
    let implicit = ctx.parts.begin_implicit();
    let result = async {
        ctx.parts.local().await?.execute(&format!("UPDATE tessera.pg_dist_node SET isactive = false WHERE nodeid = {};{forget}", node.id)).await?;
        let oids: Vec<u32> = references.iter().map(|t| t.oid).collect();
        super::worker_relations::link_reference_copies(ctx, &oids).await
    }
    .await;
    ctx.finish_block(implicit, result).await?;
    ctx.catalog = ctx.coordinator.catalog.snapshot();
    let holding = shards_held(&ctx.catalog, node.group_id);
    if !holding.is_empty() {
        ctx.notice(format!(
            "node {host}:{port} holds shards of {}: statements that need them fail until SELECT citus_activate_node('{host}', {port})",
            holding.join(", ")
        ))
        .await;
    }
    Ok(())
}

/// `citus_activate_node`: puts a node back in service and brings it up to
/// date with what changed while it was disabled. Returns its node id.
pub async fn activate_node(ctx: &mut CommandContext<'_>, host: &str, port: u16) -> PgResult<i32> {
    let node = Node { active: true, ..ctx.catalog.registered_node(host, port)? };
    reach(ctx, &node.addr).await?;
    // Its reference copies are made afresh (it may be active already).
    let forget = forget_reference_copies_sql(&ctx.catalog, node.group_id);
    let implicit = ctx.parts.begin_implicit();
    let result = async {
        ctx.parts.local().await?.execute(&format!("UPDATE tessera.pg_dist_node SET isactive = true WHERE nodeid = {};{forget}", node.id)).await?;
        let mut catalog = (*ctx.catalog).clone();
        catalog.nodes.iter_mut().filter(|n| n.id == node.id).for_each(|n| n.active = true);
        bring_up_to_date(ctx, catalog, &node).await
    }
    .await;
    ctx.finish_block(implicit, result).await?;
    ctx.catalog = ctx.coordinator.catalog.snapshot();
    Ok(node.id)
}

/// The distributed tables with shards on node group `group`, each as
/// "name (shards 102008, 102012)".
fn shards_held(catalog: &crate::metadata::Catalog, group: i32) -> Vec<String> {
    catalog
        .tables()
        .filter(|t| !t.is_reference())
        .filter_map(|t| {
            let shards: Vec<String> = t.shards.iter().filter(|s| s.placements.contains(&group)).map(|s| s.id.to_string()).collect();
            (!shards.is_empty()).then(|| format!("{} (shards {})", t.name, shards.join(", ")))
        })
        .collect()
}

/// The statement forgetting node group `group`'s copies of reference tables
/// (empty when there are no reference tables).
fn forget_reference_copies_sql(catalog: &crate::metadata::Catalog, group: i32) -> String {
    let shards: Vec<String> = catalog.tables().filter(|t| t.is_reference()).filter_map(|t| t.shards.first()).map(|s| s.id.to_string()).collect();
    if shards.is_empty() {
        return String::new();
    }
    format!(" DELETE FROM tessera.pg_dist_placement WHERE groupid = {group} AND shardid IN ({})", shards.join(", "))
}

/// Gives `node` (new, or back from being disabled) inside the current block
/// what the cluster has: the shared objects, foreign servers for every other
/// node, a fresh copy of every reference table, and the worker-side
/// relations of every table. `catalog` is the committed one with `node` in
/// service. Tables with shards on `node` kept their shards (statements that
/// would change them failed while it was disabled); their foreign tables
/// follow shards moved meanwhile. The relations of the other tables, which
/// may have changed, are made again, and those of tables dropped meanwhile go.
async fn bring_up_to_date(ctx: &mut CommandContext<'_>, catalog: crate::metadata::Catalog, node: &Node) -> PgResult<()> {
    let committed = std::mem::replace(&mut ctx.catalog, Arc::new(catalog));
    let result = async {
        let group = node.group_id;
        // Roles and shared objects first: the tables' copies use them, and
        // each role gets its user mappings below.
        let objects = super::objects::read(ctx.parts.local().await?, true).await?;
        super::objects::create_missing(ctx, std::slice::from_ref(node), &objects).await?;
        // Every node needs a foreign server for every other one before the
        // node's relations can be made (and before shards land on it).
        super::worker_relations::prepare_in_block(ctx).await?;
        let (held, rebuilt): (Vec<Arc<DistributedTable>>, Vec<Arc<DistributedTable>>) =
            ctx.catalog.tables().cloned().partition(|t| !t.is_reference() && t.shards.iter().any(|s| s.placements.contains(&group)));
        let known: Vec<(&str, &str)> = ctx.catalog.tables().map(|t| (t.schema.as_str(), t.name.as_str())).collect();
        let mut cleanup = vec![crate::planner::function_copy::drop_all_sql(), crate::planner::worker_relations::drop_strays_sql(&known)];
        for table in &rebuilt {
            cleanup.extend(crate::planner::worker_relations::release_sql(table, group));
            if let Some(shard) = table.shards.first().filter(|_| table.is_reference()) {
                cleanup.push(format!("DROP TABLE IF EXISTS {} CASCADE", table.qualified_shard_name(shard)));
            }
        }
        for table in &held {
            cleanup.extend(crate::planner::worker_relations::refresh_foreign_sql(table, group));
        }
        super::run_per_node(ctx, [(group, cleanup)].into()).await?;
        for table in rebuilt.iter().filter(|t| t.is_reference()) {
            let Some(shard) = table.shards.first() else { continue };
            let Some(source) = shard.placements.iter().filter(|g| **g != group).find_map(|g| ctx.catalog.node_for_group(*g)).cloned() else {
                continue;
            };
            copy_reference_shard(ctx, table, shard, &source, node).await?;
        }
        // Partitions' views read their roots' parents: roots first.
        let mut tables: Vec<_> = rebuilt.iter().map(|t| (t.partition_of.is_some(), t.oid, t.qualified_name())).collect();
        tables.sort();
        for (_, oid, _) in &tables {
            super::worker_relations::create(ctx, *oid, Some(group)).await?;
        }
        // The reference copies' constraints, triggers and privileges, and
        // the privileges and row security of every table's relation there.
        for (_, oid, name) in &tables {
            super::distribute::follow_shell_onto_shards(ctx, *oid, name, Some(group)).await?;
        }
        let references: Vec<u32> = ctx.catalog.tables().filter(|t| t.is_reference()).map(|t| t.oid).collect();
        super::worker_relations::link_reference_copies(ctx, &references).await
    }
    .await;
    ctx.catalog = committed;
    result
}

/// Makes `node` hold a copy of reference table `table` (shard `shard`), read
/// from `source` under a lock that holds writes back until the block ends,
/// and records the placement, in the caller's block.
async fn copy_reference_shard(ctx: &mut CommandContext<'_>, table: &DistributedTable, shard: &Shard, source: &Node, node: &Node) -> PgResult<()> {
    let definition = TableDefinition::read(ctx.parts.local().await?, table.oid).await?;
    let ddl = definition.shard_ddl(&table.shard_relname(shard), shard.id, None)?.join(";\n");
    let name = table.qualified_shard_name(shard);
    ctx.parts.worker(source, Access::Write).await?.conn.execute(&format!("LOCK TABLE {name} IN EXCLUSIVE MODE")).await?;
    let rows = read_shard_rows(ctx, source, table, shard).await?;
    let target = ctx.parts.worker(node, Access::Write).await?;
    target.conn.execute(&ddl).await?;
    target.conn.copy_in(&format!("COPY {name} FROM STDIN"), rows).await?;
    ctx.parts
        .local()
        .await?
        .execute(&format!("INSERT INTO tessera.pg_dist_placement (shardid, groupid) VALUES ({}, {})", shard.id, node.group_id))
        .await?;
    Ok(())
}

/// `citus_copy_shard_placement`: gives `target` the missing copy of a
/// reference table's shard (distributed tables keep one placement per
/// shard, so theirs move instead). The copy is made under a write block
/// whatever the transfer mode.
pub async fn copy_shard_placement(ctx: &mut CommandContext<'_>, shard_id: i64, source: (&str, u16), target: (&str, u16)) -> PgResult<()> {
    let (table, shard) = ctx.catalog.existing_shard(shard_id)?;
    if !table.is_reference() {
        return Err(PgError::not_supported(format!(
            "shard {shard_id} belongs to distributed table {}, which keeps one placement per shard",
            table.name
        ))
        .with_hint("Copies are made of reference tables only; to move the shard, use citus_move_shard_placement."));
    }
    let source = ctx.catalog.active_node(source.0, source.1)?;
    let target = ctx.catalog.active_node(target.0, target.1)?;
    shard.check_movable(&source, &target)?;
    copy_reference_placements(ctx, &[(table, shard, source, target)]).await
}

/// `replicate_reference_tables`: copies every reference table to each
/// active node that lacks it. Returns how many copies were made.
pub async fn replicate_reference_tables(ctx: &mut CommandContext<'_>) -> PgResult<usize> {
    let mut copies = Vec::new();
    for table in ctx.catalog.tables().filter(|t| t.is_reference()) {
        let Some(shard) = table.shards.first() else { continue };
        let Some(source) = shard.placements.first().and_then(|g| ctx.catalog.node_for_group(*g)) else { continue };
        for node in ctx.catalog.active_nodes().filter(|n| !shard.placements.contains(&n.group_id)) {
            copies.push((table.clone(), shard.clone(), source.clone(), node.clone()));
        }
    }
    copy_reference_placements(ctx, &copies).await?;
    Ok(copies.len())
}

/// Makes each copy in one distributed transaction, with the node's view of
/// the table and the table's constraints, triggers and grants there.
async fn copy_reference_placements(ctx: &mut CommandContext<'_>, copies: &[(Arc<DistributedTable>, Shard, Node, Node)]) -> PgResult<()> {
    if copies.is_empty() {
        return Ok(());
    }
    let implicit = ctx.parts.begin_implicit();
    let result = async {
        for (table, shard, source, target) in copies {
            ctx.notice(format!("copying {} (shard {}) from {} to {}", table.name, shard.id, source.addr, target.addr)).await;
            copy_reference_shard(ctx, table, shard, source, target).await?;
            super::worker_relations::create(ctx, table.oid, Some(target.group_id)).await?;
            super::distribute::follow_shell_onto_shards(ctx, table.oid, &table.qualified_name(), Some(target.group_id)).await?;
        }
        let copied: Vec<u32> = copies.iter().map(|(table, ..)| table.oid).collect();
        super::worker_relations::link_reference_copies(ctx, &copied).await
    }
    .await;
    ctx.finish_block(implicit, result).await
}

/// Unregisters a worker that holds no shards of distributed tables; its copies
/// of reference tables are forgotten.
pub async fn remove_node(ctx: &mut CommandContext<'_>, host: &str, port: u16) -> PgResult<()> {
    let node = ctx.catalog.registered_node(host, port)?;
    let holding = shards_held(&ctx.catalog, node.group_id);
    if !holding.is_empty() {
        return Err(PgError::new(sqlstate::OBJECT_IN_USE, format!("cannot remove node {host}:{port}: it holds shards of {}", holding.join("; ")))
            .with_hint(format!("Move them to other nodes first: SELECT citus_drain_node('{host}', {port}).")));
    }
    let implicit = ctx.parts.begin_implicit();
    let result = async {
        ctx.parts
            .local()
            .await?
            .execute(&format!(
                "DELETE FROM tessera.pg_dist_placement WHERE groupid = {0}; DELETE FROM tessera.pg_dist_node WHERE nodeid = {1}",
                node.group_id, node.id
            ))
            .await?;
        let references: Vec<u32> = ctx.catalog.tables().filter(|t| t.is_reference()).map(|t| t.oid).collect();
        super::worker_relations::link_reference_copies(ctx, &references).await
    }
    .await;
    ctx.finish_block(implicit, result).await
}

/// `citus_set_node_property(…, 'shouldhaveshards', value)`: whether new
/// shard groups land on the node and the rebalancer leaves shards there.
pub async fn set_should_have_shards(ctx: &mut CommandContext<'_>, host: &str, port: u16, value: bool) -> PgResult<()> {
    let node = ctx.catalog.registered_node(host, port)?;
    ctx.parts.local().await?.execute(&format!("UPDATE tessera.pg_dist_node SET shouldhaveshards = {value} WHERE nodeid = {}", node.id)).await?;
    ctx.reload_after_commit().await;
    ctx.catalog = ctx.coordinator.catalog.snapshot();
    Ok(())
}

/// `citus_update_node`: node `node_id` is now reached at `host`:`port` (a
/// standby promoted in its place, a new address). Connections pooled to the
/// old address are not used again; blocks under way keep theirs to the end.
pub async fn update_node(ctx: &mut CommandContext<'_>, node_id: i32, host: &str, port: u16) -> PgResult<()> {
    if !ctx.catalog.nodes.iter().any(|n| n.id == node_id) {
        return Err(PgError::new(sqlstate::UNDEFINED_OBJECT, format!("node {node_id} does not exist"))
            .with_hint("SELECT nodeid, nodename, nodeport FROM pg_dist_node lists the nodes."));
    }
    if let Some(other) = ctx.catalog.node_at(host, port).filter(|n| n.id != node_id) {
        return Err(PgError::new(sqlstate::INVALID_PARAMETER_VALUE, format!("node {} is at {host}:{port} already", other.id)));
    }
    let sql =
        format!("UPDATE tessera.pg_dist_node SET nodename = {}, nodeport = {port} WHERE nodeid = {node_id}", crate::connection::quote_literal(host));
    ctx.parts.local().await?.execute(&sql).await?;
    ctx.reload_after_commit().await;
    ctx.catalog = ctx.coordinator.catalog.snapshot();
    Ok(())
}
