//! The statements that make, change and drop worker-side relations (see
//! `commands::worker_relations`, which runs them): a distributed table's
//! partitioned parent on each worker, its foreign partitions over the other
//! nodes' shards, the views of reference tables and partitions, and how they
//! follow shard moves and renames. Text only; nothing here talks to a node.

use crate::connection::{quote_ident, quote_literal};
use crate::error::PgResult;
use crate::metadata::{DistributedTable, Distribution, Shard};
use crate::planner::ForeignRetype;

/// Where the foreign tables standing for other nodes' shards live.
pub const REMOTE_SCHEMA: &str = "tessera_remote";

pub fn server_name(group: i32) -> String {
    format!("tessera_node_{group}")
}

pub fn foreign_table_name(table: &DistributedTable, shard: &Shard) -> String {
    format!("{REMOTE_SCHEMA}.{}", quote_ident(&table.shard_relname(shard)))
}

/// What a distributed table is on a worker.
pub enum Shape {
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
pub fn create_sql(table: &DistributedTable, shape: &Shape, group: i32) -> Vec<String> {
    let name = table.qualified_name();
    match shape {
        Shape::ReferenceView => {
            let Some(shard) = table.shards.first() else { return Vec::new() };
            vec![
                format!("CREATE VIEW {name} WITH (security_invoker = true) AS SELECT * FROM {}", table.qualified_shard_name(shard)),
                format!("GRANT ALL ON {name} TO PUBLIC"),
                link_reference_sql(table, group),
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
pub fn partition_sql(table: &DistributedTable, shard: &Shard, placements: &[i32], group: i32) -> Vec<String> {
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

/// The statement on node `group` that makes reference table `table`'s view
/// there write every copy: the local one and, through foreign tables, the
/// other nodes' (`REFERENCE_WRITES_SQL` in `commands::worker_relations`).
/// Run again whenever the copies' nodes or columns change.
pub fn link_reference_sql(table: &DistributedTable, group: i32) -> String {
    let Some(shard) = table.shards.first() else { return String::new() };
    let others: Vec<String> = shard.placements.iter().filter(|g| **g != group).map(|g| g.to_string()).collect();
    format!(
        "SELECT {REMOTE_SCHEMA}.link_reference_copies({}::regclass, {}::regclass, '{{{}}}')",
        quote_literal(&table.qualified_name()),
        quote_literal(&table.qualified_shard_name(shard)),
        others.join(",")
    )
}

/// What a shard of `table` holds, as a partition of its parent.
pub fn partition_bound(table: &DistributedTable, shard: &Shard) -> String {
    format!("FOR VALUES WITH (MODULUS {}, REMAINDER {})", table.shard_count(), shard.index)
}

/// The shards of `table` that are foreign tables of its parent on node
/// group `group`: those placed elsewhere.
pub fn foreign_shards(table: &DistributedTable, group: i32) -> impl Iterator<Item = &Shard> {
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

/// Statements on node `group`, which holds shards of `table`, making the
/// foreign tables of the table's other shards there over their placements
/// as the catalog has them now: shards moved between other nodes while it
/// was disabled.
pub fn refresh_foreign_sql(table: &DistributedTable, group: i32) -> Vec<String> {
    if !table.has_worker_parent() {
        return Vec::new();
    }
    foreign_shards(table, group)
        .flat_map(|shard| {
            std::iter::once(format!("DROP FOREIGN TABLE IF EXISTS {}", foreign_table_name(table, shard))).chain(partition_sql(
                table,
                shard,
                &shard.placements,
                group,
            ))
        })
        .collect()
}

/// The statement dropping, on a node, the worker-side parents of tables that
/// are no longer distributed (dropped while the node was disabled): the
/// partitioned tables outside `known` (schema and name of every distributed
/// table) whose partitions are all foreign tables over other nodes' shards.
pub fn drop_strays_sql(known: &[(&str, &str)]) -> String {
    let known: Vec<String> = known.iter().map(|(schema, name)| format!("({}, {})", quote_literal(schema), quote_literal(name))).collect();
    let known = if known.is_empty() { String::new() } else { format!("AND (n.nspname, c.relname) NOT IN ({})", known.join(", ")) };
    format!(
        "DO $tessera$ DECLARE stray regclass;
         BEGIN
           FOR stray IN SELECT c.oid FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
                         WHERE c.relkind = 'p' {known}
                           AND EXISTS (SELECT FROM pg_inherits i JOIN pg_class p ON p.oid = i.inhrelid
                                        WHERE i.inhparent = c.oid AND p.relnamespace = '{REMOTE_SCHEMA}'::regnamespace)
                           AND NOT EXISTS (SELECT FROM pg_inherits i JOIN pg_class p ON p.oid = i.inhrelid
                                            WHERE i.inhparent = c.oid AND p.relnamespace <> '{REMOTE_SCHEMA}'::regnamespace) LOOP
             EXECUTE format('DROP TABLE %s CASCADE', stray);
           END LOOP;
         END $tessera$"
    )
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

/// The statements dropping `table`'s relation on a node, and what depends on
/// it there (as DROP TABLE … CASCADE or undistribute_table drop it), with
/// the table's shards: attached ones go with their parent.
pub fn drop_sql(table: &DistributedTable) -> Vec<String> {
    if table.has_worker_parent() {
        return vec![format!("DROP TABLE IF EXISTS {} CASCADE", table.qualified_name())];
    }
    let mut out = vec![format!("DROP VIEW IF EXISTS {} CASCADE", table.qualified_name())];
    out.extend(drop_reference_links_sql(table));
    out
}

/// The statement dropping the foreign tables over the other nodes' copies
/// of `table`, when it is a reference table.
fn drop_reference_links_sql(table: &DistributedTable) -> Option<String> {
    let shard = table.shards.first().filter(|_| table.is_reference())?;
    Some(format!("SELECT {REMOTE_SCHEMA}.drop_reference_links({})", quote_literal(&table.shard_relname(shard))))
}

/// Statements dropping `table`'s relation on node `group` while keeping its
/// shards there, to be made again of another kind or with other columns: a
/// parent lets go of its shards (about to be attached elsewhere); a view
/// another view depends on is not dropped silently.
pub fn release_sql(table: &DistributedTable, group: i32) -> Vec<String> {
    let name = table.qualified_name();
    if !table.has_worker_parent() {
        return std::iter::once(format!("DROP VIEW IF EXISTS {name}")).chain(drop_reference_links_sql(table)).collect();
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
pub fn remote_write_trigger_sql(foreign: &str) -> String {
    format!("CREATE TRIGGER tessera_remote_write BEFORE INSERT OR UPDATE OR DELETE ON {foreign} FOR EACH ROW EXECUTE FUNCTION {REMOTE_SCHEMA}.remote_write()")
}

/// Gives roles created or renamed in the current transaction their user
/// mappings on a node (a no-op on a node not prepared yet).
pub const MAP_ROLES_SQL: &str =
    "DO $tessera$ BEGIN IF to_regprocedure('tessera_remote.map_roles()') IS NOT NULL THEN PERFORM tessera_remote.map_roles(); END IF; END $tessera$";

/// Drops the user mappings of roles about to be dropped on a node.
pub fn forget_roles_sql(roles: &[String]) -> String {
    crate::metadata::forget_roles_sql(REMOTE_SCHEMA, roles)
}
