//! create_distributed_table, create_reference_table and undistribute_table:
//! creating shards on the workers, moving existing rows into them (or back), and
//! recording it all in the catalog in the same transaction.

use super::table_ddl::TableDefinition;
use super::{delete_catalog_rows_sql, read_shard_rows, run_per_node};
use crate::connection::{quote_ident, quote_literal, PgConnection, QUALIFIED_NAMES};
use crate::error::{sqlstate, PgError, PgResult};
use crate::hash::{self, HashType};
use crate::metadata::{Catalog, DistributedTable, Distribution, Node, ALLOW_SHELL_WRITES};
use crate::planner::DdlPlan;
use crate::process::context::CommandContext;
use crate::transaction::Access;
use bytes::Bytes;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

const DEFAULT_SHARD_COUNT: i32 = 32;

const MAX_SHARD_COUNT: i32 = 64000;
/// Tables with more rows than this get progress notices while their rows move.
const PROGRESS_ROWS: u64 = 100_000;

struct LocalTable {
    oid: u32,
    schema: String,
    name: String,
    /// A partitioned table (its rows are in its partitions).
    partitioned: bool,
    /// The table it is a partition of, if any.
    parent: Option<String>,
    /// Columns COPY reads and writes (all but generated ones), quoted.
    copy_columns: Vec<String>,
}

impl LocalTable {
    fn qualified(&self) -> String {
        format!("{}.{}", quote_ident(&self.schema), quote_ident(&self.name))
    }
    fn qualified_shard(&self, shard_id: i64) -> String {
        format!("{}.{}", quote_ident(&self.schema), quote_ident(&format!("{}_{shard_id}", self.name)))
    }
}

async fn resolve_table(conn: &mut PgConnection, name: &str) -> PgResult<LocalTable> {
    let oid = conn
        .query_value(&format!("SELECT oid FROM pg_class WHERE oid = to_regclass({})", quote_literal(name)))
        .await?
        .ok_or_else(|| PgError::new(sqlstate::UNDEFINED_TABLE, format!("relation \"{name}\" does not exist")))?;
    table_by_oid(conn, oid.parse().unwrap_or(0)).await
}

async fn table_by_oid(conn: &mut PgConnection, oid: u32) -> PgResult<LocalTable> {
    let rows = conn
        .query(&format!(
            "SELECT n.nspname, c.relname, c.relkind,
                    (SELECT i.inhparent::regclass::text FROM pg_inherits i WHERE i.inhrelid = c.oid AND c.relispartition),
                    (SELECT json_agg(quote_ident(a.attname) ORDER BY a.attnum) FROM pg_attribute a
                      WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped AND a.attgenerated = '')
             FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = {oid}"
        ))
        .await?;
    let r = rows.into_iter().next().ok_or_else(|| PgError::new(sqlstate::UNDEFINED_TABLE, format!("relation {oid} does not exist")))?;
    let name = r[1].clone().unwrap_or_default();
    if !matches!(r[2].as_deref(), Some("r" | "p")) {
        return Err(PgError::new(sqlstate::WRONG_OBJECT_TYPE, format!("\"{name}\" is not a table; only tables can be distributed")));
    }
    Ok(LocalTable {
        oid,
        schema: r[0].clone().unwrap_or_default(),
        name,
        partitioned: r[2].as_deref() == Some("p"),
        parent: r[3].clone(),
        copy_columns: serde_json::from_str(r[4].as_deref().unwrap_or("[]")).unwrap_or_default(),
    })
}

/// Partitions are distributed with their parent, never on their own.
fn refuse_partition(table: &LocalTable) -> PgResult<()> {
    match &table.parent {
        Some(parent) => Err(PgError::not_supported(format!("\"{}\" is a partition of \"{parent}\"", table.name))
            .with_hint(format!("Distribute \"{parent}\": its partitions follow it."))),
        None => Ok(()),
    }
}

/// Every partition under `oid`, parents before their partitions, with the
/// oid of the table each is a partition of.
async fn partition_tree(conn: &mut PgConnection, oid: u32) -> PgResult<Vec<(LocalTable, u32)>> {
    let rows = conn
        .query(&format!(
            "WITH RECURSIVE tree(relid, parent, depth) AS (
                 SELECT inhrelid, inhparent, 1 FROM pg_inherits WHERE inhparent = {oid}
                 UNION ALL
                 SELECT i.inhrelid, i.inhparent, t.depth + 1 FROM pg_inherits i JOIN tree t ON i.inhparent = t.relid)
             SELECT relid, parent FROM tree ORDER BY depth, relid"
        ))
        .await?;
    let mut tree = Vec::new();
    for r in rows {
        let table = table_by_oid(conn, r[0].as_deref().unwrap_or("0").parse().unwrap_or(0)).await?;
        tree.push((table, r[1].as_deref().unwrap_or("0").parse().unwrap_or(0)));
    }
    Ok(tree)
}

/// The nodes new shard groups are spread over (`for_shards`), or that hold
/// reference tables: every active one.
fn active_nodes(ctx: &CommandContext<'_>, for_shards: bool) -> PgResult<Vec<Node>> {
    let nodes: Vec<Node> = ctx.catalog.active_nodes().filter(|n| n.should_have_shards || !for_shards).cloned().collect();
    if nodes.is_empty() {
        return Err(PgError::new("55000", "there are no active worker nodes that should have shards")
            .with_hint("Add workers with SELECT citus_add_node('host', port), or let one have shards with citus_set_node_property(host, port, 'shouldhaveshards', true)."));
    }
    Ok(nodes)
}

async fn check_distributable(ctx: &mut CommandContext<'_>, table: &LocalTable) -> PgResult<()> {
    if ctx.catalog.table_by_oid(table.oid).is_some() {
        return Err(PgError::new(sqlstate::INVALID_TABLE_DEFINITION, format!("table \"{}\" is already distributed", table.name)));
    }
    let local = ctx.parts.local().await?;
    local.execute(&format!("SELECT tessera.check_owner({})", table.oid)).await?;
    // Foreign keys to tables that are already distributed or reference tables
    // follow the table onto its shards (whether they fit is checked as for
    // ALTER TABLE … ADD FOREIGN KEY); others cannot be enforced there. Keys
    // from tables not distributed yet are fine while those are empty (an
    // ORM's fresh schema, distributed referenced tables first): no row of
    // theirs loses what it references when the rows move to the shards.
    let mut blocking = local
        .query(&format!(
            "SELECT conname, conrelid::regclass::text, confrelid::regclass::text, true FROM pg_constraint
             WHERE contype = 'f' AND conrelid = {0} AND confrelid <> {0} AND confrelid NOT IN (SELECT logicalrelid FROM pg_catalog.pg_dist_partition)
             UNION ALL
             SELECT conname, conrelid::regclass::text, confrelid::regclass::text, false FROM pg_constraint
             WHERE contype = 'f' AND confrelid = {0} AND conrelid <> {0}
             ORDER BY 4 DESC, 1",
            table.oid
        ))
        .await?;
    let mut referencing_rows = Vec::new();
    for fk in blocking.iter().filter(|fk| fk[3].as_deref() == Some("f")) {
        let from = fk[1].clone().unwrap_or_default();
        referencing_rows.push(local.query_value(&format!("SELECT EXISTS (SELECT 1 FROM ONLY {from})")).await?.as_deref() == Some("t"));
    }
    let mut has_rows = referencing_rows.into_iter();
    blocking.retain(|fk| fk[3].as_deref() == Some("t") || has_rows.next().unwrap_or(true));
    if let Some(fk) = blocking.into_iter().next() {
        let (name, from, to) = (fk[0].clone().unwrap_or_default(), fk[1].clone().unwrap_or_default(), fk[2].clone().unwrap_or_default());
        let hint = if fk[3].as_deref() == Some("t") {
            format!(
                "Distribute \"{to}\" first (create_reference_table for a small shared table, or create_distributed_table co-located with this one)."
            )
        } else {
            format!("Distribute \"{from}\" while it is still empty, after this table; or drop the foreign key first.")
        };
        return Err(PgError::not_supported(format!(
            "cannot distribute \"{}\": foreign key \"{name}\" from \"{from}\" references \"{to}\", which is not distributed",
            table.name
        ))
        .with_hint(hint));
    }
    Ok(())
}

/// What the shell carries besides its definition and rows follows it onto
/// the shards once they hold the rows: its foreign keys (each shard
/// references the co-located shard, or the reference table's copy on its own
/// node), triggers, row-level security and its policies, and the privileges
/// granted on it and its columns (the workers check them). Each is planned
/// as the client's own statement would be. `only_group`: a node that got a
/// copy of a reference table, the only one to bring up to date.
pub(super) async fn follow_shell_onto_shards(ctx: &mut CommandContext<'_>, oid: u32, qualified: &str, only_group: Option<i32>) -> PgResult<()> {
    let local = ctx.parts.local().await?;
    let saved = local.set_for_now(&QUALIFIED_NAMES).await?;
    let statements = shell_statements(local, oid, qualified).await;
    let statements = local.restore_after(saved, statements).await?;
    if statements.is_empty() {
        return Ok(());
    }
    // The catalog as this transaction sees it: with the table distributed
    // (or the new node holding its copy).
    let catalog = Arc::new(crate::metadata::load_tables_in_block(local, &ctx.catalog, &[oid]).await?);
    let committed = std::mem::replace(&mut ctx.catalog, catalog.clone());
    let result = carry_statements(ctx, &catalog, &statements, only_group).await;
    ctx.catalog = committed;
    result
}

/// The statements giving table `oid`'s shards what its shell carries
/// (`follow_shell_onto_shards`), every name in them qualified.
async fn shell_statements(local: &mut PgConnection, oid: u32, qualified: &str) -> PgResult<Vec<String>> {
    let mut statements = Vec::new();
    for key in local
        .query(&format!("SELECT conname, pg_get_constraintdef(oid) FROM pg_constraint WHERE contype = 'f' AND conrelid = {} ORDER BY conname", oid))
        .await?
    {
        let (name, definition) = (key[0].clone().unwrap_or_default(), key[1].clone().unwrap_or_default());
        statements.push(format!("ALTER TABLE {} ADD CONSTRAINT {} {definition}", qualified, quote_ident(&name)));
    }
    let triggers = format!("SELECT pg_get_triggerdef(oid) FROM pg_trigger WHERE tgrelid = {oid} AND NOT tgisinternal AND tgname NOT LIKE 'tessera\\_distributed\\_shell%' ORDER BY tgname");
    for trigger in local.query(&triggers).await? {
        statements.extend(trigger.into_iter().flatten());
    }
    let security = local
        .query(&format!(
            "SELECT format('ALTER TABLE %s ENABLE ROW LEVEL SECURITY', c.oid::regclass) FROM pg_class c WHERE c.oid = {oid} AND c.relrowsecurity
             UNION ALL
             SELECT format('ALTER TABLE %s FORCE ROW LEVEL SECURITY', c.oid::regclass) FROM pg_class c WHERE c.oid = {oid} AND c.relforcerowsecurity
             UNION ALL
             SELECT format('CREATE POLICY %I ON %s AS %s FOR %s TO %s', p.policyname, {oid}::regclass, p.permissive, p.cmd,
                           array_to_string(ARRAY(SELECT CASE r WHEN 'public' THEN 'PUBLIC' ELSE quote_ident(r) END FROM unnest(p.roles) r), ', '))
                    || coalesce(' USING (' || p.qual || ')', '') || coalesce(' WITH CHECK (' || p.with_check || ')', '')
             FROM pg_policies p WHERE (p.schemaname, p.tablename) = (SELECT n.nspname, c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = {oid})",
            oid = oid
        ))
        .await?;
    statements.extend(security.into_iter().flatten().flatten());
    // The owner's own privileges too, as the shards belong to whoever
    // distributes; grants to that role itself would change nothing.
    let grants = local
        .query(&format!(
            "SELECT a.privilege_type, NULL, a.grantee = 0, pg_get_userbyid(a.grantee), a.is_grantable
               FROM pg_class c, aclexplode(coalesce(c.relacl, acldefault('r', c.relowner))) a
              WHERE c.oid = {oid} AND a.grantee <> current_user::regrole
             UNION ALL
             SELECT a.privilege_type, att.attname, a.grantee = 0, pg_get_userbyid(a.grantee), a.is_grantable
               FROM pg_attribute att, aclexplode(att.attacl) a
              WHERE att.attrelid = {oid} AND att.attnum > 0 AND NOT att.attisdropped AND a.grantee <> current_user::regrole",
            oid = oid
        ))
        .await?;
    for g in grants {
        let text = |i: usize| g[i].clone().unwrap_or_default();
        let column = g[1].as_deref().map(|c| format!(" ({})", quote_ident(c))).unwrap_or_default();
        let grantee = if text(2) == "t" { "PUBLIC".to_string() } else { quote_ident(&text(3)) };
        let option = if text(4) == "t" { " WITH GRANT OPTION" } else { "" };
        statements.push(format!("GRANT {}{column} ON TABLE {} TO {grantee}{option}", text(0), qualified));
    }
    Ok(statements)
}

async fn carry_statements(ctx: &mut CommandContext<'_>, catalog: &Catalog, statements: &[String], only_group: Option<i32>) -> PgResult<()> {
    for sql in statements {
        match crate::planner::plan_query(sql, catalog).into_iter().next().map(|p| p.plan) {
            Some(crate::planner::Plan::Ddl(ddl)) => match ddl.as_ref() {
                DdlPlan::Propagate { table, template, relations, .. } => {
                    super::propagate_to_nodes(ctx, table, template, relations, &Default::default(), only_group).await?;
                }
                grant @ DdlPlan::Grant { .. } => super::grant_on_nodes(grant, ctx, only_group).await?,
                other => return Err(PgError::internal(format!("carrying \"{sql}\" over to the shards gave the plan {other}"))),
            },
            Some(crate::planner::Plan::Unsupported(e)) => return Err(e),
            _ => return Err(PgError::internal(format!("carrying \"{sql}\" over to the shards did not give a DDL plan"))),
        }
    }
    Ok(())
}

pub async fn create_distributed_table(
    ctx: &mut CommandContext<'_>,
    table_name: &str,
    column: &str,
    colocate_with: &str,
    shard_count: Option<i32>,
) -> PgResult<()> {
    if shard_count.is_some() {
        shard_count_setting(ctx, shard_count).await?;
    }
    let local = ctx.parts.local().await?;
    let table = resolve_table(local, table_name).await?;
    refuse_partition(&table)?;
    let partitions = if table.partitioned { partition_tree(local, table.oid).await? } else { Vec::new() };
    let attr = local
        .query(&format!(
            "SELECT atttypid, attcollation, attnum, format_type(atttypid, atttypmod) FROM pg_attribute WHERE attrelid = {} AND attname = {} AND attnum > 0 AND NOT attisdropped",
            table.oid,
            quote_literal(column)
        ))
        .await?;
    let Some(attr) = attr.into_iter().next() else {
        return Err(PgError::new(sqlstate::UNDEFINED_COLUMN, format!("column \"{column}\" of relation \"{}\" does not exist", table.name)));
    };
    let type_oid: u32 = attr[0].as_deref().unwrap_or("0").parse().unwrap_or(0);
    let collation = attr[1].clone().unwrap_or_else(|| "0".into());
    let Some(column_type) = HashType::from_type_oid(type_oid) else {
        return Err(PgError::not_supported(format!(
            "the distribution column type {} is not supported; use an integer, text, uuid, numeric, date, timestamp, boolean or bytea column, or an array of one",
            attr[3].as_deref().unwrap_or("?")
        )));
    };
    let bad_unique = local
        .query_value(&format!(
            "SELECT string_agg(indexrelid::regclass::text, ', ') FROM pg_index WHERE indrelid = {} AND indisunique AND NOT ({} = ANY (indkey::int2[]))",
            table.oid,
            attr[2].as_deref().unwrap_or("0")
        ))
        .await?;
    if let Some(indexes) = bad_unique {
        return Err(PgError::not_supported(format!(
            "cannot distribute relation \"{}\": unique index {indexes} does not include the distribution column",
            table.name
        ))
        .with_detail("Distributed relations cannot have UNIQUE, EXCLUDE, or PRIMARY KEY constraints that do not include the partition column."));
    }
    check_distributable(ctx, &table).await?;
    for (partition, _) in &partitions {
        check_distributable(ctx, partition).await?;
    }
    let nodes = active_nodes(ctx, true)?;

    // Co-location: an existing group's shard count and placements, or a new group.
    let mut colocated: Option<Arc<DistributedTable>> = None;
    let mut colocation_id: Option<i32> = None;
    let count = match colocate_with {
        "none" => shard_count_setting(ctx, shard_count).await?,
        "default" => {
            let n = shard_count_setting(ctx, shard_count).await?;
            let existing = ctx
                .parts
                .local()
                .await?
                .query_value(&format!(
                    "SELECT min(colocationid) FROM pg_catalog.pg_dist_colocation WHERE shardcount = {n} AND distributioncolumntype = {type_oid} AND distributioncolumncollation = {collation}"
                ))
                .await?;
            if let Some(id) = existing.and_then(|v| v.parse::<i32>().ok()) {
                colocation_id = Some(id);
                colocated = ctx.catalog.tables().find(|t| t.colocation_id == id && !t.is_reference()).cloned();
            }
            n
        }
        other => {
            let target = resolve_table(ctx.parts.local().await?, other).await?;
            let t = ctx.catalog.table_by_oid(target.oid).filter(|t| !t.is_reference()).cloned().ok_or_else(|| {
                PgError::new(sqlstate::INVALID_TABLE_DEFINITION, format!("cannot colocate with \"{other}\": it is not a distributed table"))
            })?;
            if let Distribution::Hash { column_type: other_type, .. } = &t.distribution {
                if *other_type != column_type {
                    return Err(PgError::new(sqlstate::DATATYPE_MISMATCH, format!("cannot colocate tables {} and {}", table.name, t.name))
                        .with_detail("Distribution column types don't match."));
                }
            }
            if shard_count.is_some_and(|n| n as u32 != t.shard_count()) {
                return Err(PgError::new(
                    sqlstate::INVALID_PARAMETER_VALUE,
                    format!("cannot colocate with \"{}\": it has {} shards", t.name, t.shard_count()),
                ));
            }
            colocation_id = Some(t.colocation_id);
            let n = t.shard_count() as i32;
            colocated = Some(t);
            n
        }
    };
    let placements: Vec<Vec<i32>> = (0..count as usize)
        .map(|i| match &colocated {
            Some(t) => t.shards[i].placements.clone(),
            None => vec![nodes[i % nodes.len()].group_id],
        })
        .collect();

    let implicit = ctx.parts.begin_implicit();
    let result = async {
        let local = ctx.parts.local().await?;
        let colocation_id = match colocation_id {
            Some(id) => id,
            None => new_colocation(local, count, 1, type_oid, &collation).await?,
        };
        bring_nodes_up_to_date(ctx, &placements).await?;
        let mut per_node = BTreeMap::new();
        let shard_ids = create_shards(ctx, &table, Some(column), colocation_id, &placements, None, &mut per_node).await?;
        create_partition_shards(ctx, &table, &shard_ids, &partitions, column, colocation_id, &placements, &mut per_node).await?;
        let oids: Vec<u32> = std::iter::once(table.oid).chain(partitions.iter().map(|(p, _)| p.oid)).collect();
        add_relation_statements(ctx, &oids, &mut per_node).await?;
        run_per_node(ctx, per_node).await?;
        move_rows_into_shards(ctx, &table, &shard_ids, &placements, by_hash(&table, column, column_type, count as u32)?).await?;
        follow_shell_onto_shards(ctx, table.oid, &table.qualified(), None).await?;
        for (partition, _) in &partitions {
            follow_shell_onto_shards(ctx, partition.oid, &partition.qualified(), None).await?;
        }
        Ok(())
    }
    .await;
    ctx.finish_block(implicit, result).await
}

/// Which of `shards` shards a COPY text row of `table` goes to, by its
/// distribution column's hash.
fn by_hash(table: &LocalTable, column: &str, column_type: HashType, shards: u32) -> PgResult<impl Fn(&[u8]) -> PgResult<usize>> {
    let column_index = table
        .copy_columns
        .iter()
        .position(|c| *c == quote_ident(column))
        .ok_or_else(|| PgError::new(sqlstate::UNDEFINED_COLUMN, format!("column \"{column}\" of relation \"{}\" does not exist", table.name)))?;
    let column = column.to_string();
    Ok(move |row: &[u8]| {
        let value = crate::copy::text_field(row, column_index).ok_or_else(|| {
            PgError::new(sqlstate::NOT_NULL_VIOLATION, format!("cannot distribute a row with NULL in the distribution column \"{column}\""))
        })?;
        let h = hash::hash_text(column_type, &value).map_err(|e| PgError::internal(format!("could not hash distribution value: {e}")))?;
        Ok(hash::shard_index(hash::row_hash(Some(h)), shards) as usize)
    })
}

/// Distributes the partitions under `root` (whose shards are `root_shards`)
/// co-located with it: each shard of a partition is a partition of its
/// parent's shard of the same index, on the same node. Their statements
/// go to `per_node`.
#[allow(clippy::too_many_arguments)]
async fn create_partition_shards(
    ctx: &mut CommandContext<'_>,
    root: &LocalTable,
    root_shards: &[i64],
    partitions: &[(LocalTable, u32)],
    column: &str,
    colocation_id: i32,
    placements: &[Vec<i32>],
    per_node: &mut BTreeMap<i32, Vec<String>>,
) -> PgResult<()> {
    let mut shards_of: HashMap<u32, Vec<String>> = HashMap::from([(root.oid, root_shards.iter().map(|id| root.qualified_shard(*id)).collect())]);
    for (partition, parent) in partitions {
        let parent_shards =
            shards_of.get(parent).ok_or_else(|| PgError::internal(format!("partition {} comes before its parent", partition.name)))?.clone();
        let ids = create_shards(ctx, partition, Some(column), colocation_id, placements, Some(&parent_shards), per_node).await?;
        shards_of.insert(partition.oid, ids.iter().map(|id| partition.qualified_shard(*id)).collect());
    }
    Ok(())
}

/// A new partition of a distributed table (CREATE TABLE … PARTITION OF, or
/// a local table just attached to it), with any partitions of its own: they
/// are distributed co-located with the parent, and whatever rows they hold
/// move into their shards.
pub(super) async fn distribute_partition(ctx: &mut CommandContext<'_>, parent: &DistributedTable, oid: u32) -> PgResult<()> {
    let Distribution::Hash { column, column_type, .. } = &parent.distribution else {
        return Err(PgError::not_supported("reference tables cannot have partitions"));
    };
    let local = ctx.parts.local().await?;
    let table = table_by_oid(local, oid).await?;
    let partitions = if table.partitioned { partition_tree(local, table.oid).await? } else { Vec::new() };
    check_distributable(ctx, &table).await?;
    for (partition, _) in &partitions {
        check_distributable(ctx, partition).await?;
    }
    let placements: Vec<Vec<i32>> = parent.shards.iter().map(|s| s.placements.clone()).collect();
    let parent_shards: Vec<String> = parent.shards.iter().map(|s| parent.qualified_shard_name(s)).collect();
    let mut per_node = BTreeMap::new();
    let shard_ids = create_shards(ctx, &table, Some(column), parent.colocation_id, &placements, Some(&parent_shards), &mut per_node).await?;
    create_partition_shards(ctx, &table, &shard_ids, &partitions, column, parent.colocation_id, &placements, &mut per_node).await?;
    let oids: Vec<u32> = std::iter::once(table.oid).chain(partitions.iter().map(|(p, _)| p.oid)).collect();
    add_relation_statements(ctx, &oids, &mut per_node).await?;
    run_per_node(ctx, per_node).await?;
    move_rows_into_shards(ctx, &table, &shard_ids, &placements, by_hash(&table, column, *column_type, parent.shard_count())?).await?;
    follow_shell_onto_shards(ctx, table.oid, &table.qualified(), None).await?;
    for (partition, _) in &partitions {
        follow_shell_onto_shards(ctx, partition.oid, &partition.qualified(), None).await?;
    }
    Ok(())
}

pub async fn create_reference_table(ctx: &mut CommandContext<'_>, table_name: &str) -> PgResult<()> {
    let table = resolve_table(ctx.parts.local().await?, table_name).await?;
    refuse_partition(&table)?;
    if table.partitioned {
        return Err(PgError::not_supported(format!("\"{}\" is a partitioned table; reference tables cannot be partitioned", table.name))
            .with_hint("Distribute it with create_distributed_table instead."));
    }
    check_distributable(ctx, &table).await?;
    let nodes = active_nodes(ctx, false)?;
    let implicit = ctx.parts.begin_implicit();
    let result = async {
        let local = ctx.parts.local().await?;
        let existing = local
            .query_value("SELECT min(colocationid) FROM pg_catalog.pg_dist_colocation WHERE shardcount = 1 AND distributioncolumntype = 0")
            .await?;
        let colocation_id: i32 = match existing {
            Some(id) => id.parse().unwrap_or(0),
            None => new_colocation(local, 1, nodes.len(), 0, "0").await?,
        };
        let placements = vec![nodes.iter().map(|n| n.group_id).collect::<Vec<_>>()];
        bring_nodes_up_to_date(ctx, &placements).await?;
        let mut per_node = BTreeMap::new();
        let shard_ids = create_shards(ctx, &table, None, colocation_id, &placements, None, &mut per_node).await?;
        add_relation_statements(ctx, &[table.oid], &mut per_node).await?;
        run_per_node(ctx, per_node).await?;
        move_rows_into_shards(ctx, &table, &shard_ids, &placements, |_| Ok(0)).await?;
        follow_shell_onto_shards(ctx, table.oid, &table.qualified(), None).await
    }
    .await;
    ctx.finish_block(implicit, result).await
}

async fn shard_count_setting(ctx: &mut CommandContext<'_>, explicit: Option<i32>) -> PgResult<i32> {
    let n = match explicit {
        Some(n) => n,
        None => ctx
            .parts
            .local()
            .await?
            .query_value("SELECT current_setting('citus.shard_count', true)")
            .await?
            .filter(|v| !v.is_empty())
            .map(|v| v.parse::<i32>().map_err(|_| PgError::new(sqlstate::INVALID_PARAMETER_VALUE, format!("invalid citus.shard_count \"{v}\""))))
            .transpose()?
            .unwrap_or(DEFAULT_SHARD_COUNT),
    };
    if !(1..=MAX_SHARD_COUNT).contains(&n) {
        return Err(PgError::new(sqlstate::INVALID_PARAMETER_VALUE, format!("shard_count must be between 1 and {MAX_SHARD_COUNT}")));
    }
    Ok(n)
}

/// Creates on the nodes that get shards whatever shared objects (schemas,
/// types, extensions, functions …) the table may use and they lack.
async fn bring_nodes_up_to_date(ctx: &mut CommandContext<'_>, placements: &[Vec<i32>]) -> PgResult<()> {
    let groups: std::collections::BTreeSet<i32> = placements.iter().flatten().copied().collect();
    let nodes: Vec<Node> = groups.iter().filter_map(|g| ctx.catalog.node_for_group(*g).cloned()).collect();
    let objects = super::objects::read(ctx.parts.local().await?, false).await?;
    super::objects::create_missing(ctx, &nodes, &objects).await
}

/// A new co-location group; returns its id.
async fn new_colocation(local: &mut PgConnection, shards: i32, replicas: usize, column_type: u32, collation: &str) -> PgResult<i32> {
    let id = local.query_value(&format!("SELECT tessera.new_colocation({shards}, {replicas}, {column_type}, {collation})")).await?;
    Ok(id.unwrap_or_default().parse().unwrap_or(0))
}

/// Records the table as hash-distributed on `key` (a reference table when
/// None) in the catalog, with one shard per entry of `placements`, and
/// adds the statements creating each shard to its nodes' in `per_node`;
/// returns the new shard ids.
/// `parent_shards`: for a partition, its parent's shards, by index.
async fn create_shards(
    ctx: &mut CommandContext<'_>,
    table: &LocalTable,
    key: Option<&str>,
    colocation_id: i32,
    placements: &[Vec<i32>],
    parent_shards: Option<&[String]>,
    per_node: &mut BTreeMap<i32, Vec<String>>,
) -> PgResult<Vec<i64>> {
    let local = ctx.parts.local().await?;
    let rows: Vec<String> =
        placements.iter().map(|groups| format!("[{}]", groups.iter().map(i32::to_string).collect::<Vec<_>>().join(","))).collect();
    let (method, key) = match key {
        Some(column) => ("h", quote_literal(column)),
        None => ("n", "NULL".to_string()),
    };
    let ids = local
        .query_value(&format!(
            "SELECT tessera.guard_shell({0});
             SELECT array_to_string(tessera.record_distribution({0}, '{method}', {key}, {colocation_id}, ARRAY[{1}]::int[]), ',')",
            table.oid,
            rows.join(",")
        ))
        .await?
        .unwrap_or_default();
    let ids: Vec<i64> = ids.split(',').map(|id| id.parse().unwrap_or(0)).collect();
    let definition = TableDefinition::read(local, table.oid).await?;
    for (index, (groups, id)) in placements.iter().zip(&ids).enumerate() {
        let ddl = definition.shard_ddl(&format!("{}_{id}", table.name), *id, parent_shards.map(|p| p[index].as_str()))?;
        for g in groups {
            per_node.entry(*g).or_default().extend(ddl.iter().cloned());
        }
    }
    Ok(ids)
}

/// Adds to `per_node` the statements making the worker-side relations of
/// the tables `oids`, distributed in the current block (after their shards'
/// statements, which they attach), and then the functions over their row
/// types.
async fn add_relation_statements(ctx: &mut CommandContext<'_>, oids: &[u32], per_node: &mut BTreeMap<i32, Vec<String>>) -> PgResult<()> {
    let catalog = crate::metadata::load_tables_in_block(ctx.parts.local().await?, &ctx.catalog, oids).await?;
    for oid in oids {
        for (group, statements) in super::worker_relations::create_statements(ctx, &catalog, *oid, None).await? {
            per_node.entry(group).or_default().extend(statements);
        }
    }
    let functions = super::objects::functions_over_tables(ctx.parts.local().await?, oids).await?;
    if !functions.is_empty() {
        for statements in per_node.values_mut() {
            // A body may read what only the coordinator database has.
            statements.push("SET LOCAL check_function_bodies = off".into());
            statements.extend(functions.iter().cloned());
        }
    }
    Ok(())
}

/// Streams the local table's rows out of the coordinator database and into the
/// shards (`shard_of` picks a shard index per COPY text row), then empties the
/// local table: from now on the shell only describes the table.
async fn move_rows_into_shards(
    ctx: &mut CommandContext<'_>,
    table: &LocalTable,
    shard_ids: &[i64],
    placements: &[Vec<i32>],
    shard_of: impl Fn(&[u8]) -> PgResult<usize>,
) -> PgResult<()> {
    let local = ctx.parts.local().await?;
    local.execute(&format!("LOCK TABLE {} IN EXCLUSIVE MODE", table.qualified())).await?;
    let mut buffers: Vec<Vec<Bytes>> = vec![Vec::new(); shard_ids.len()];
    let columns = table.copy_columns.join(", ");
    // A partitioned table's rows are its partitions'; COPY reads them only
    // through a query. The parent's shards route them to their partitions.
    let copy_out = if table.partitioned {
        format!("COPY (SELECT {columns} FROM {}) TO STDOUT", table.qualified())
    } else {
        format!("COPY {} ({columns}) TO STDOUT", table.qualified())
    };
    let total = local
        .copy_out(&copy_out, |row| {
            let i = shard_of(&row)?;
            buffers[i].push(row);
            Ok(())
        })
        .await?;
    if total == 0 {
        return Ok(());
    }
    if total >= PROGRESS_ROWS {
        ctx.notice(format!("moving {total} rows of {} into {} shards", table.qualified(), shard_ids.len())).await;
    }
    let mut moved = 0u64;
    let mut next_report = total / 10;
    for (i, rows) in buffers.into_iter().enumerate() {
        if rows.is_empty() {
            continue;
        }
        let n = rows.len() as u64;
        let shard = table.qualified_shard(shard_ids[i]);
        for g in &placements[i] {
            let node = ctx.catalog.node_for_group(*g).ok_or_else(|| PgError::internal(format!("no node for group {g}")))?.clone();
            let worker = ctx.parts.worker(&node, Access::Write).await?;
            worker.conn.copy_in(&format!("COPY {shard} ({columns}) FROM STDIN"), rows.iter().cloned()).await?;
        }
        moved += n;
        if total >= PROGRESS_ROWS && moved >= next_report {
            ctx.notice(format!("moved {moved} of {total} rows ({}%)", moved * 100 / total)).await;
            next_report += total / 10;
        }
    }
    // TRUNCATE is refused while (empty) tables still reference this one.
    let local = ctx.parts.local().await?;
    let referenced = local
        .query_value(&format!("SELECT EXISTS (SELECT 1 FROM pg_constraint WHERE contype = 'f' AND confrelid = {0} AND conrelid <> {0})", table.oid))
        .await?;
    let empty_out = match (referenced.as_deref() == Some("t"), table.partitioned) {
        (true, false) => "DELETE FROM ONLY",
        (true, true) => "DELETE FROM",
        (false, false) => "TRUNCATE ONLY",
        (false, true) => "TRUNCATE",
    };
    local.execute(&format!("{ALLOW_SHELL_WRITES}; {empty_out} {}", table.qualified())).await?;
    ctx.notice(format!("copied {total} rows of {} into its shards", table.qualified())).await;
    Ok(())
}

pub async fn undistribute_table(ctx: &mut CommandContext<'_>, table_name: &str) -> PgResult<()> {
    let oid = resolve_table(ctx.parts.local().await?, table_name).await?.oid;
    let table = ctx
        .catalog
        .table_by_oid(oid)
        .cloned()
        .ok_or_else(|| PgError::new(sqlstate::INVALID_TABLE_DEFINITION, format!("table \"{table_name}\" is not distributed")))?;
    if table.partition_of.is_some() {
        return Err(PgError::not_supported(format!("\"{table_name}\" is a partition of a distributed table; undistribute its parent")));
    }
    ctx.parts.local().await?.execute(&format!("SELECT tessera.check_owner({oid})")).await?;
    // A partitioned table goes with its partitions: the leaves hold the rows.
    let tables: Vec<Arc<DistributedTable>> = std::iter::once(table.clone()).chain(ctx.catalog.partitions_under(oid)).collect();
    let leaves: Vec<Arc<DistributedTable>> = tables.iter().filter(|t| ctx.catalog.partitions_under(t.oid).is_empty()).cloned().collect();
    let implicit = ctx.parts.begin_implicit();
    let result = async {
        ctx.parts.local().await?.execute(ALLOW_SHELL_WRITES).await?;
        for leaf in &leaves {
            let qualified = leaf.qualified_name();
            for shard in &leaf.shards {
                let group = *shard.placements.first().ok_or_else(|| PgError::internal(format!("shard {} has no placement", shard.id)))?;
                let node = ctx.catalog.node_for_group(group).ok_or_else(|| PgError::internal(format!("no node for group {group}")))?.clone();
                // Writes routed to the shard wait from here on rather than land
                // after its rows were read; once it is dropped, they are planned
                // again (outside a block) or fail.
                ctx.parts
                    .worker(&node, Access::Write)
                    .await?
                    .conn
                    .execute(&format!("LOCK TABLE {} IN EXCLUSIVE MODE", leaf.qualified_shard_name(shard)))
                    .await?;
                let rows = read_shard_rows(ctx, &node, leaf, shard).await?;
                if !rows.is_empty() {
                    ctx.parts.local().await?.copy_in(&format!("COPY {qualified} FROM STDIN"), rows).await?;
                }
            }
        }
        let mut per_node: BTreeMap<i32, Vec<String>> = ctx
            .catalog
            .active_nodes()
            .map(|n| (n.group_id, tables.iter().flat_map(|t| crate::planner::worker_relations::drop_sql(t)).collect()))
            .collect();
        for t in &tables {
            for shard in &t.shards {
                for g in &shard.placements {
                    per_node.entry(*g).or_default().push(format!("DROP TABLE IF EXISTS {}", t.qualified_shard_name(shard)));
                }
            }
        }
        run_per_node(ctx, per_node).await?;
        let local = ctx.parts.local().await?;
        for t in tables.iter().rev() {
            local.execute(&delete_catalog_rows_sql(t)).await?;
            let name = t.qualified_name();
            local
                .execute(&format!(
                    "DROP TRIGGER IF EXISTS tessera_distributed_shell ON {name}; DROP TRIGGER IF EXISTS tessera_distributed_shell_rows ON {name}"
                ))
                .await?;
        }
        Ok(())
    }
    .await;
    ctx.finish_block(implicit, result).await
}

/// What `alter_distributed_table` is asked to change; None keeps it as it is.
pub struct TableChange {
    pub distribution_column: Option<String>,
    pub shard_count: Option<i32>,
    pub colocate_with: Option<String>,
    /// Whether a new shard count applies to the tables co-located with this
    /// one too (true) or takes the table out of their group (false).
    pub cascade_to_colocated: Option<bool>,
}

/// Distributes a table anew, with another distribution column, shard count or
/// co-location, as `undistribute_table` and `create_distributed_table` would
/// one after the other, in one distributed transaction: the rows pass
/// through the coordinator database and go into new shards, and writes to
/// the table wait meanwhile.
pub async fn alter_distributed_table(ctx: &mut CommandContext<'_>, table_name: &str, change: TableChange) -> PgResult<()> {
    let oid = resolve_table(ctx.parts.local().await?, table_name).await?.oid;
    let table = ctx.catalog.table_by_oid(oid).cloned().ok_or_else(|| {
        PgError::new(sqlstate::INVALID_TABLE_DEFINITION, format!("table \"{table_name}\" is not distributed"))
            .with_hint("Distribute it with create_distributed_table.")
    })?;
    let Distribution::Hash { column: current_column, key, .. } = &table.distribution else {
        return Err(PgError::not_supported(format!(
            "\"{table_name}\" is a reference table; alter_distributed_table changes hash-distributed tables"
        ))
        .with_hint("Run undistribute_table, then create_distributed_table."));
    };
    let column = change.distribution_column.clone().unwrap_or_else(|| current_column.clone());
    // A table named in colocate_with decides the shard count, unless one is given.
    let target = match change.colocate_with.as_deref() {
        None | Some("default") | Some("none") => None,
        Some(other) => {
            let other = resolve_table(ctx.parts.local().await?, other).await?;
            let known = ctx.catalog.table_by_oid(other.oid).filter(|t| !t.is_reference()).cloned();
            Some(known.ok_or_else(|| {
                PgError::new(sqlstate::INVALID_TABLE_DEFINITION, format!("cannot colocate with \"{}\": it is not a distributed table", other.name))
            })?)
        }
    };
    let shard_count = match (change.shard_count, &target) {
        (Some(n), _) => shard_count_setting(ctx, Some(n)).await?,
        (None, Some(target)) => target.shard_count() as i32,
        (None, None) => table.shard_count() as i32,
    };
    let local = ctx.parts.local().await?;
    let column_type = local
        .query_value(&format!(
            "SELECT atttypid FROM pg_attribute WHERE attrelid = {oid} AND attname = {} AND attnum > 0 AND NOT attisdropped",
            quote_literal(&column)
        ))
        .await?
        .ok_or_else(|| PgError::new(sqlstate::UNDEFINED_COLUMN, format!("column \"{column}\" of relation \"{}\" does not exist", table.name)))?;
    let type_changes = column_type.parse::<u32>().ok() != Some(key.oid);
    let shape_changes = type_changes || shard_count as u32 != table.shard_count();
    let joins_own_group = match (&change.colocate_with, &target) {
        (None, _) => true,
        (Some(_), Some(target)) => target.colocation_id == table.colocation_id,
        (Some(_), None) => false,
    };
    if column == *current_column && !shape_changes && joins_own_group {
        return Err(PgError::new(sqlstate::INVALID_PARAMETER_VALUE, format!("alter_distributed_table would change nothing about \"{table_name}\""))
            .with_hint("Give a new distribution_column, shard_count or colocate_with."));
    }
    let group: Vec<Arc<DistributedTable>> =
        ctx.catalog.tables().filter(|t| t.colocation_id == table.colocation_id && t.oid != oid && t.partition_of.is_none()).cloned().collect();
    let cascade = match change.cascade_to_colocated {
        Some(cascade) if shape_changes && !group.is_empty() => cascade,
        None if shape_changes && !group.is_empty() => {
            return Err(PgError::new(sqlstate::INVALID_PARAMETER_VALUE, format!("\"{table_name}\" is co-located with {}: say what happens to them", names(&group)))
                .with_hint("cascade_to_colocated => true changes their shard count too; cascade_to_colocated => false takes this table out of their co-location group."));
        }
        _ => false,
    };
    if cascade && (type_changes || change.colocate_with.is_some()) {
        return Err(PgError::new(
            sqlstate::INVALID_PARAMETER_VALUE,
            "cascade_to_colocated => true changes only the shard count of a co-location group",
        )
        .with_hint("Change the distribution column or the co-location of each table on its own, with cascade_to_colocated => false."));
    }
    refuse_foreign_keys(ctx, &table).await?;
    if cascade {
        for other in &group {
            refuse_foreign_keys(ctx, other).await?;
        }
    }
    // Stay with the group when its shape does not change.
    let colocate_with = match &change.colocate_with {
        Some(other) => other.clone(),
        None if !shape_changes => group.first().map_or_else(|| "default".to_string(), |t| t.qualified_name()),
        None => "default".to_string(),
    };
    ctx.notice(format!("distributing {} anew: by \"{column}\" in {shard_count} shards", table.qualified_name())).await;
    let implicit = ctx.parts.begin_implicit();
    let result = async {
        redistribute(ctx, &table, &column, &colocate_with, shard_count).await?;
        if cascade {
            for other in &group {
                let Distribution::Hash { column, .. } = &other.distribution else { continue };
                ctx.notice(format!("distributing co-located {} anew in {shard_count} shards", other.qualified_name())).await;
                redistribute(ctx, other, column, &table.qualified_name(), shard_count).await?;
            }
        }
        // Distributed functions of a group left without tables follow the
        // table, so that their calls are still delegated.
        let now = ctx.catalog.table_by_oid(oid).map(|t| t.colocation_id);
        if let Some(new_group) = now.filter(|g| *g != table.colocation_id) {
            ctx.parts.local().await?.execute(&format!("SELECT tessera.follow_colocation({}, {new_group})", table.colocation_id)).await?;
            reload_block_catalog(ctx).await?;
        }
        Ok(())
    }
    .await;
    ctx.finish_block(implicit, result).await
}

/// `undistribute_table` then `create_distributed_table`, each seeing what
/// the other did in this transaction.
async fn redistribute(ctx: &mut CommandContext<'_>, table: &DistributedTable, column: &str, colocate_with: &str, shard_count: i32) -> PgResult<()> {
    let qualified = table.qualified_name();
    undistribute_table(ctx, &qualified).await?;
    reload_block_catalog(ctx).await?;
    create_distributed_table(ctx, &qualified, column, colocate_with, Some(shard_count)).await?;
    reload_block_catalog(ctx).await
}

pub(super) async fn reload_block_catalog(ctx: &mut CommandContext<'_>) -> PgResult<()> {
    let local = ctx.parts.local().await?;
    ctx.catalog = Arc::new(crate::metadata::load_in_block(local, ctx.catalog.version, &ctx.catalog).await?);
    Ok(())
}

/// Foreign keys between this table and other hash-distributed tables hold
/// shard by shard, which a new shard count or column would break: they go
/// first (keys to reference tables follow the table onto its new shards).
async fn refuse_foreign_keys(ctx: &mut CommandContext<'_>, table: &DistributedTable) -> PgResult<()> {
    let own: Vec<u32> = std::iter::once(table.oid).chain(ctx.catalog.partitions_under(table.oid).iter().map(|p| p.oid)).collect();
    let hash_tables: Vec<String> = ctx.catalog.tables().filter(|t| !t.is_reference() && !own.contains(&t.oid)).map(|t| t.oid.to_string()).collect();
    if hash_tables.is_empty() {
        return Ok(());
    }
    let key = ctx
        .parts
        .local()
        .await?
        .query(&format!(
            "SELECT conname, conrelid::regclass::text, confrelid::regclass::text FROM pg_constraint
             WHERE contype = 'f' AND ((conrelid = {0} AND confrelid IN ({1})) OR (confrelid = {0} AND conrelid IN ({1}))) ORDER BY conname LIMIT 1",
            table.oid,
            hash_tables.join(", ")
        ))
        .await?;
    if let Some(key) = key.into_iter().next() {
        let text = |i: usize| key[i].clone().unwrap_or_default();
        return Err(PgError::not_supported(format!(
            "cannot distribute \"{}\" anew: foreign key \"{}\" from \"{}\" references \"{}\"",
            table.name,
            text(0),
            text(1),
            text(2)
        ))
        .with_hint("Drop the foreign key, alter the table, then add the key again."));
    }
    Ok(())
}

fn names(tables: &[Arc<DistributedTable>]) -> String {
    tables.iter().map(|t| t.qualified_name()).collect::<Vec<_>>().join(", ")
}
