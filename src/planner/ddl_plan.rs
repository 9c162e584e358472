//! What a DDL plan is (`DdlPlan` and the parts it names: relation changes,
//! role changes, index names chosen, column retypes for foreign tables),
//! and the statements a plan gives each shard and node. `ddl.rs` decides
//! which plan a utility statement gets.

use super::rewrite::{name_shard, ShardTemplate};
use super::{not_supported, resolve_range_var, Plan};
use crate::connection::{quote_ident, quote_literal};
use crate::error::{PgError, PgResult};
use crate::metadata::{Catalog, DistributedTable, Distribution, Shard};
use pg_query::protobuf::{self, AlterTableType, ConstrType, ObjectType};
use pg_query::NodeEnum;
use std::fmt;
use std::sync::Arc;
#[derive(Debug)]
pub enum DdlPlan {
    /// Run the statement on the coordinator database, then on every shard of
    /// `table` rewritten for that shard (index and constraint names get the shard
    /// id appended, as table names do). `catalog_sql` updates our catalog in the
    /// same transaction (e.g. a renamed distribution column).
    /// `relations`: what the statement does to the worker-side relations.
    Propagate { table: Arc<DistributedTable>, template: ShardTemplate, catalog_sql: Option<String>, relations: RelationChanges },
    /// DROP TABLE of distributed tables (possibly with local ones).
    Drop { tables: Vec<Arc<DistributedTable>> },
    /// TRUNCATE of distributed tables (possibly with local ones): each node
    /// truncates its shards of them, with the statement's CASCADE. `tables` are
    /// the statement's references to distributed tables.
    Truncate { version: i32, stmt: protobuf::TruncateStmt, tables: Vec<(Arc<DistributedTable>, protobuf::RangeVar)> },
    /// LOCK TABLE: the shell tables in the coordinator database, then every
    /// shard, in the statement's mode (routed writes never touch the shells,
    /// so only the shards' locks hold them off). Transaction blocks only.
    Lock { version: i32, stmt: protobuf::LockStmt, tables: Vec<(Arc<DistributedTable>, protobuf::RangeVar)> },
    /// DROP INDEX or ALTER INDEX … RENAME, when distributed tables exist:
    /// which indexes are theirs is only found out at execution.
    DropIndex(DropIndex),
    /// CREATE TABLE … PARTITION OF a distributed table, or ALTER TABLE …
    /// ATTACH PARTITION of a local table: the coordinator database runs the
    /// statement, then the new partition (`partition`, as the statement names
    /// it) is distributed co-located with `parent`, its shards partitions of
    /// the parent's.
    AddPartition { parent: Arc<DistributedTable>, partition: protobuf::RangeVar },
    /// DROP TRIGGER / DROP POLICY on a distributed table: the coordinator
    /// database drops the shell's, each shard its own.
    DropFromTable { version: i32, stmt: protobuf::DropStmt, table: Arc<DistributedTable> },
    /// VACUUM / ANALYZE: each node runs the statement, options and all, for its
    /// shards. `rels` are the statement's relations that are distributed tables.
    Vacuum { version: i32, stmt: protobuf::VacuumStmt, rels: Vec<(Arc<DistributedTable>, protobuf::VacuumRelation)> },
    /// CHECKPOINT: the coordinator database and every active worker, as a
    /// user of one database expects (and as Greenplum does).
    Checkpoint,
    /// Statements about what every node must know alike: roles and their
    /// memberships, default privileges, grants on schemas or on all tables
    /// of a schema. The coordinator database and every active worker run
    /// `sql` (the statement deparsed) in one distributed transaction, so
    /// that the workers, which check privileges themselves, agree with it.
    /// `forget`: distributed tables the statement drops along with their
    /// schema, whose catalog rows go first. `roles`: what the statement does
    /// to roles, which the workers' user mappings follow.
    Everywhere { sql: String, forget: Vec<Arc<DistributedTable>>, roles: RoleChange },
    /// GRANT/REVOKE on tables some of which are distributed: the coordinator
    /// database runs the statement (shells and local tables), each node the
    /// statement for the shards it holds.
    Grant { version: i32, stmt: protobuf::GrantStmt, tables: Vec<(Arc<DistributedTable>, protobuf::RangeVar)> },
}

/// What a propagated statement does to the tables' relations on the workers
/// (commands/worker_relations.rs), besides what it does to the shards.
#[derive(Debug, Default)]
pub struct RelationChanges {
    /// Run on every node before the shards' statements, on the table's
    /// worker-side parent: column changes (which reach the attached shards
    /// and the foreign tables from there) and the table-level settings the
    /// parent must repeat (owner, row-level security, policies, name).
    pub parent_sql: Option<String>,
    /// The table's new name, when the statement renames it: the foreign
    /// tables standing for its shards follow.
    pub renamed_to: Option<String>,
    /// Tables whose worker-side views change with the statement (a reference
    /// table's columns or name, a partitioned table's columns, which its
    /// partitions' views list): dropped before the shards change, made
    /// again after.
    pub rebuild_views: Vec<Arc<DistributedTable>>,
    /// Tables that become a partition (ATTACH) or stop being one (DETACH),
    /// with the partitions under them: their relations go first (a parent
    /// lets go of its shards, so that they can be attached elsewhere) and are
    /// made again, of the new kind, after.
    pub reshaped: Vec<Arc<DistributedTable>>,
    /// Columns retyped with a USING conversion, which PostgreSQL makes only
    /// on plain tables: the parent's foreign tables leave it for the
    /// change, are retyped as this says (they hold no rows), and come back.
    pub foreign_retype: Option<ForeignRetype>,
}

/// The column changes of an ALTER TABLE … ALTER COLUMN … TYPE … USING, as
/// the foreign tables standing for a table's shards elsewhere take them:
/// without the USING.
#[derive(Debug)]
pub struct ForeignRetype {
    version: i32,
    stmt: Box<protobuf::AlterTableStmt>,
}

impl ForeignRetype {
    /// The foreign tables' part of `alter`, a worker-side parent's
    /// statement, when it converts a column with USING.
    pub(super) fn of(version: i32, alter: &protobuf::AlterTableStmt) -> Option<ForeignRetype> {
        let mut converts = false;
        let mut cmds = Vec::new();
        for node in &alter.cmds {
            let Some(NodeEnum::AlterTableCmd(cmd)) = node.node.as_ref() else { continue };
            if cmd.subtype != AlterTableType::AtAlterColumnType as i32 {
                continue;
            }
            let mut cmd = cmd.clone();
            if let Some(NodeEnum::ColumnDef(col)) = cmd.def.as_deref_mut().and_then(|d| d.node.as_mut()) {
                converts |= col.raw_default.take().is_some();
            }
            cmds.push(self::node(NodeEnum::AlterTableCmd(cmd)));
        }
        converts.then(|| ForeignRetype {
            version,
            stmt: Box::new(protobuf::AlterTableStmt { cmds, objtype: ObjectType::ObjectForeignTable as i32, ..alter.clone() }),
        })
    }

    /// The statement retyping the columns of foreign table `schema`.`name`.
    pub fn sql_for(&self, schema: &str, name: &str) -> PgResult<String> {
        let relation = protobuf::RangeVar {
            schemaname: schema.to_string(),
            relname: name.to_string(),
            inh: true,
            relpersistence: "p".into(),
            ..Default::default()
        };
        super::deparse::deparse_statement(
            self.version,
            NodeEnum::AlterTableStmt(protobuf::AlterTableStmt { relation: Some(relation), ..self.stmt.as_ref().clone() }),
        )
    }
}

/// What a statement run on every node does to roles: each role has a user
/// mapping on every worker for the other workers' foreign tables
/// (commands/worker_relations.rs), made when the role is and dropped first
/// when it is.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub enum RoleChange {
    #[default]
    None,
    /// Created or renamed: the new names (none after DROP OWNED, which
    /// drops user mappings with what it owns).
    Named(Vec<String>),
    /// Dropped: these roles.
    Dropped(Vec<String>),
}

/// The names the coordinator database chose for what a statement created
/// without naming it: the shards' copies are named after them, so that later
/// statements naming them reach the copies too.
#[derive(Debug, Default)]
pub struct ChosenNames {
    /// The index of a CREATE INDEX without a name.
    pub index: Option<String>,
    /// The constraints an ALTER TABLE adds without names, in the order the
    /// statement gives them.
    pub constraints: Vec<String>,
}

/// DROP INDEX or ALTER INDEX … RENAME: the parse tree names indexes, not
/// their tables.
#[derive(Debug)]
pub struct DropIndex {
    pub(super) version: i32,
    pub(super) stmt: IndexStatement,
}

#[derive(Debug)]
pub(super) enum IndexStatement {
    Drop(protobuf::DropStmt),
    Rename(Box<protobuf::RenameStmt>),
}

impl fmt::Display for DdlPlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names = self.tables().iter().map(|t| t.name.clone()).collect::<Vec<_>>().join(",");
        match self {
            DdlPlan::Propagate { .. } => write!(f, "propagate to {names}"),
            DdlPlan::Drop { .. } => write!(f, "drop {names}"),
            DdlPlan::Truncate { .. } => write!(f, "truncate {names}"),
            DdlPlan::Lock { .. } => write!(f, "lock {names}"),
            DdlPlan::DropIndex(_) => write!(f, "drop or rename index"),
            DdlPlan::DropFromTable { .. } => write!(f, "drop from {names}"),
            DdlPlan::AddPartition { .. } => write!(f, "add a partition to {names}"),
            DdlPlan::Vacuum { .. } => write!(f, "vacuum {names}"),
            DdlPlan::Checkpoint => write!(f, "checkpoint every node"),
            DdlPlan::Everywhere { .. } => write!(f, "run on every node"),
            DdlPlan::Grant { .. } => write!(f, "grant on {names}"),
        }
    }
}

impl DdlPlan {
    /// Whether the plan is a CREATE INDEX CONCURRENTLY.
    pub fn creates_index_concurrently(&self) -> bool {
        let DdlPlan::Propagate { template, .. } = self else { return false };
        matches!(template.statement(), Some(NodeEnum::IndexStmt(ix)) if ix.concurrent)
    }

    /// The kinds (`pg_constraint.contype`) of the constraints an ALTER TABLE
    /// adds without naming them, in the statement's order.
    pub fn unnamed_constraint_kinds(&self) -> Vec<char> {
        let DdlPlan::Propagate { template, .. } = self else { return vec![] };
        let Some(NodeEnum::AlterTableStmt(alter)) = template.statement() else { return vec![] };
        alter
            .cmds
            .iter()
            .filter_map(|cmd| match cmd.node.as_ref() {
                Some(NodeEnum::AlterTableCmd(cmd)) => Some(added_constraints(cmd)),
                _ => None,
            })
            .flatten()
            .filter(|(c, _)| c.conname.is_empty())
            .filter_map(|(c, _)| constraint_kind(c))
            .collect()
    }

    /// Whether the plan creates an index without naming it.
    pub fn creates_unnamed_index(&self) -> bool {
        let DdlPlan::Propagate { template, .. } = self else { return false };
        matches!(template.statement(), Some(NodeEnum::IndexStmt(ix)) if ix.idxname.is_empty())
    }

    /// Whether the statement changes what the catalog says about distributed
    /// tables (their columns, defaults, existence).
    pub fn changes_catalog(&self) -> bool {
        matches!(self, DdlPlan::Propagate { .. } | DdlPlan::Drop { .. } | DdlPlan::AddPartition { .. })
            || matches!(self, DdlPlan::Everywhere { forget, .. } if !forget.is_empty())
    }

    /// The statement for shard `index` of a propagated DDL. pg_query 0.8's
    /// generic walk misses RENAME's table and foreign keys' referenced tables, so
    /// the relations utility statements name are pointed at the shard here (the
    /// walk then finds them renamed already).
    /// `chosen`: the names the coordinator database gave what the statement
    /// creates without naming it; each shard's copy is named after them.
    /// None when the shard has nothing to do: what the statement changes
    /// reaches it through its worker-side parent (`RelationChanges`).
    pub fn shard_sql(table: &DistributedTable, template: &ShardTemplate, index: u32, chosen: &ChosenNames) -> PgResult<Option<String>> {
        let through_parent = table.has_worker_parent();
        match template.statement() {
            Some(NodeEnum::RenameStmt(r)) if through_parent && r.rename_type == ObjectType::ObjectColumn as i32 => return Ok(None),
            Some(NodeEnum::AlterTableStmt(alter)) if through_parent && shard_commands(alter.cmds.clone()).is_empty() => return Ok(None),
            _ => {}
        }
        let shard = &table.shards[index as usize];
        let suffix = format!("_{}", shard.id);
        let point = |rv: &mut Option<protobuf::RangeVar>| {
            if let Some(rv) = rv {
                template.point_at_shard(rv, index);
            }
        };
        let sql = template.sql_with(index, |node| match node.node.as_mut() {
            Some(NodeEnum::IndexStmt(ix)) => {
                if let (true, Some(name)) = (ix.idxname.is_empty(), &chosen.index) {
                    ix.idxname = name.clone();
                }
                if !ix.idxname.is_empty() {
                    ix.idxname.push_str(&suffix);
                }
                if let Some(rv) = &ix.relation {
                    unqualify_index_columns(ix, &rv.relname.clone());
                }
                point(&mut ix.relation);
            }
            Some(NodeEnum::AlterTableStmt(alter)) => {
                point(&mut alter.relation);
                if through_parent {
                    alter.cmds = shard_commands(std::mem::take(&mut alter.cmds));
                }
                let mut chosen_constraints = chosen.constraints.iter();
                for cmd in &mut alter.cmds {
                    let Some(NodeEnum::AlterTableCmd(cmd)) = cmd.node.as_mut() else { continue };
                    if cmd.subtype == AlterTableType::AtDropConstraint as i32 && !cmd.name.is_empty() {
                        cmd.name.push_str(&suffix);
                    }
                    if let Some(NodeEnum::PartitionCmd(partition)) = cmd.def.as_deref_mut().and_then(|d| d.node.as_mut()) {
                        point(&mut partition.name);
                    }
                    for c in added_constraints_mut(cmd) {
                        if c.conname.is_empty() && constraint_kind(c).is_some() {
                            if let Some(name) = chosen_constraints.next() {
                                c.conname = name.clone();
                            }
                        }
                        if !c.conname.is_empty() {
                            c.conname.push_str(&suffix);
                        }
                        point(&mut c.pktable);
                    }
                }
            }
            Some(NodeEnum::RenameStmt(r)) => {
                point(&mut r.relation);
                match ObjectType::from_i32(r.rename_type) {
                    Some(ObjectType::ObjectTable) => r.newname.push_str(&suffix),
                    Some(ObjectType::ObjectTabconstraint) => {
                        r.subname.push_str(&suffix);
                        r.newname.push_str(&suffix);
                    }
                    _ => {}
                }
            }
            Some(NodeEnum::CreateTrigStmt(t)) => point(&mut t.relation),
            // Statistics objects live in a schema, not a table: each shard's
            // is named after it, in the table's schema (as its indexes are).
            Some(NodeEnum::CreateStatsStmt(st)) => {
                for rel in &mut st.relations {
                    if let Some(NodeEnum::RangeVar(rv)) = rel.node.as_mut() {
                        template.point_at_shard(rv, index);
                    }
                }
                if let Some(name) = names_of(&st.defnames).pop() {
                    let string = |s: String| self::node(NodeEnum::String(protobuf::String { sval: s }));
                    st.defnames = vec![string(table.schema.clone()), string(format!("{name}{suffix}"))];
                }
            }
            Some(NodeEnum::CreatePolicyStmt(p)) => point(&mut p.table),
            Some(NodeEnum::AlterPolicyStmt(p)) => point(&mut p.table),
            _ => {}
        })?;
        Ok(Some(sql))
    }

    /// The statement for shard `shard` of a DROP TRIGGER / DROP POLICY: the
    /// object's name list ends with the table's name and the object's.
    pub fn drop_from_shard_sql(&self, shard: &Shard) -> PgResult<String> {
        let DdlPlan::DropFromTable { version, stmt, table } = self else { unreachable!("{self} drops nothing from a table") };
        let mut stmt = stmt.clone();
        for object in &mut stmt.objects {
            let Some(NodeEnum::List(names)) = object.node.as_mut() else { continue };
            let table_at = names.items.len().saturating_sub(2);
            if let Some(NodeEnum::String(s)) = names.items.get_mut(table_at).and_then(|n| n.node.as_mut()) {
                s.sval = table.shard_relname(shard);
            }
            if table_at == 0 {
                // Unqualified: the shard lives in its table's schema.
                names.items.insert(0, node(NodeEnum::String(protobuf::String { sval: table.schema.clone() })));
            }
        }
        super::deparse::deparse_statement(*version, NodeEnum::DropStmt(stmt))
    }

    /// The statement the worker-side parents of a GRANT's tables, or of a
    /// DROP POLICY's, run on every node: queries through a parent are
    /// checked against its privileges and policies, not its partitions'.
    pub fn parent_sql(&self) -> Option<String> {
        let qualified = |t: &DistributedTable| protobuf::RangeVar {
            schemaname: t.schema.clone(),
            relname: t.name.clone(),
            inh: true,
            relpersistence: "p".into(),
            ..Default::default()
        };
        match self {
            DdlPlan::Grant { version, stmt, tables } => {
                let mut stmt = stmt.clone();
                stmt.objects = tables.iter().filter(|(t, _)| t.has_worker_parent()).map(|(t, _)| node(NodeEnum::RangeVar(qualified(t)))).collect();
                if stmt.objects.is_empty() {
                    return None;
                }
                super::deparse::deparse_statement(*version, NodeEnum::GrantStmt(stmt)).ok()
            }
            DdlPlan::DropFromTable { version, stmt, table } if stmt.remove_type == ObjectType::ObjectPolicy as i32 && table.has_worker_parent() => {
                let mut stmt = stmt.clone();
                stmt.missing_ok = true;
                for object in &mut stmt.objects {
                    let Some(NodeEnum::List(names)) = object.node.as_mut() else { continue };
                    let policy = names.items.pop()?;
                    let string = |s: &str| node(NodeEnum::String(protobuf::String { sval: s.to_string() }));
                    names.items = vec![string(&table.schema), string(&table.name), policy];
                }
                super::deparse::deparse_statement(*version, NodeEnum::DropStmt(stmt)).ok()
            }
            _ => None,
        }
    }

    /// The distributed tables the plan reaches (those of a DROP INDEX are only
    /// known at execution).
    pub fn tables(&self) -> Vec<&Arc<DistributedTable>> {
        match self {
            DdlPlan::Propagate { table, .. } | DdlPlan::DropFromTable { table, .. } | DdlPlan::AddPartition { parent: table, .. } => vec![table],
            DdlPlan::Drop { tables } => tables.iter().collect(),
            DdlPlan::Truncate { tables, .. } | DdlPlan::Lock { tables, .. } | DdlPlan::Grant { tables, .. } => {
                tables.iter().map(|(t, _)| t).collect()
            }
            DdlPlan::DropIndex(_) | DdlPlan::Checkpoint | DdlPlan::Everywhere { .. } => vec![],
            DdlPlan::Vacuum { rels, .. } => rels.iter().map(|(t, _)| t).collect(),
        }
    }

    /// The statement for node group `group` of a DROP TABLE, TRUNCATE,
    /// VACUUM, GRANT (they name the shards the node holds instead of the
    /// distributed tables), CHECKPOINT or a statement for every node.
    pub fn node_sql(&self, group: i32) -> PgResult<String> {
        match self {
            DdlPlan::Drop { tables } => {
                let shards: Vec<String> = tables.iter().flat_map(|t| shards_on(t, group).map(|s| t.qualified_shard_name(s))).collect();
                Ok(format!("DROP TABLE IF EXISTS {} CASCADE", shards.join(", ")))
            }
            DdlPlan::Truncate { version, stmt, tables } => {
                let mut stmt = stmt.clone();
                stmt.relations = for_shards_on(tables, group, |rv| Some(rv)).into_iter().map(|rv| node(NodeEnum::RangeVar(rv))).collect();
                // Sequences live on the coordinator database, which restarts them.
                stmt.restart_seqs = false;
                super::deparse::deparse_statement(*version, NodeEnum::TruncateStmt(stmt))
            }
            DdlPlan::Lock { version, stmt, tables } => {
                let mut stmt = stmt.clone();
                stmt.relations = for_shards_on(tables, group, |rv| Some(rv)).into_iter().map(|rv| node(NodeEnum::RangeVar(rv))).collect();
                super::deparse::deparse_statement(*version, NodeEnum::LockStmt(stmt))
            }
            DdlPlan::Vacuum { version, stmt, rels } => {
                let mut stmt = stmt.clone();
                stmt.rels = for_shards_on(rels, group, |vr| vr.relation.as_mut()).into_iter().map(|vr| node(NodeEnum::VacuumRelation(vr))).collect();
                super::deparse::deparse_statement(*version, NodeEnum::VacuumStmt(stmt))
            }
            DdlPlan::Grant { version, stmt, tables } => {
                let mut stmt = stmt.clone();
                stmt.objects = for_shards_on(tables, group, |rv| Some(rv)).into_iter().map(|rv| node(NodeEnum::RangeVar(rv))).collect();
                super::deparse::deparse_statement(*version, NodeEnum::GrantStmt(stmt))
            }
            DdlPlan::Checkpoint => Ok("CHECKPOINT".into()),
            DdlPlan::Everywhere { sql, .. } => Ok(sql.clone()),
            DdlPlan::Propagate { .. } | DdlPlan::DropIndex(_) | DdlPlan::DropFromTable { .. } | DdlPlan::AddPartition { .. } => {
                unreachable!("{self} has no statement per node")
            }
        }
    }
}

impl DropIndex {
    pub fn is_concurrent(&self) -> bool {
        matches!(&self.stmt, IndexStatement::Drop(d) if d.concurrent)
    }

    /// The names of the indexes, as written (optionally schema-qualified).
    fn names(&self) -> Vec<Vec<String>> {
        match &self.stmt {
            IndexStatement::Drop(d) => d
                .objects
                .iter()
                .filter_map(|o| match o.node.as_ref() {
                    Some(NodeEnum::List(l)) => Some(names_of(&l.items)),
                    _ => None,
                })
                .collect(),
            IndexStatement::Rename(r) => r
                .relation
                .iter()
                .map(|rv| if rv.schemaname.is_empty() { vec![rv.relname.clone()] } else { vec![rv.schemaname.clone(), rv.relname.clone()] })
                .collect(),
        }
    }

    /// A query for the coordinator database: one row per index named, in order,
    /// holding the oid of its table (NULL where there is no such index).
    pub fn tables_sql(&self) -> String {
        let names: Vec<String> =
            self.names().iter().map(|parts| quote_literal(&parts.iter().map(|p| quote_ident(p)).collect::<Vec<_>>().join("."))).collect();
        if matches!(&self.stmt, IndexStatement::Drop(d) if d.remove_type == ObjectType::ObjectStatisticExt as i32) {
            return format!(
                "SELECT (SELECT s.stxrelid FROM pg_statistic_ext s
                         WHERE format('%I.%I', s.stxnamespace::regnamespace, s.stxname) = n.name
                            OR (quote_ident(s.stxname) = n.name AND pg_statistics_obj_is_visible(s.oid)) LIMIT 1)
                 FROM unnest(ARRAY[{}]::text[]) WITH ORDINALITY AS n(name, ord) ORDER BY n.ord",
                names.join(", ")
            );
        }
        format!(
            "SELECT i.indrelid FROM unnest(ARRAY[{}]::text[]) WITH ORDINALITY AS n(name, ord) LEFT JOIN pg_index i ON i.indexrelid = to_regclass(n.name) ORDER BY n.ord",
            names.join(", ")
        )
    }

    /// The names of the indexes to drop, in order, without their schema (an
    /// index lives in its table's).
    pub fn index_names(&self) -> Vec<String> {
        self.names().into_iter().filter_map(|mut parts| parts.pop()).collect()
    }

    /// DROP INDEX CONCURRENTLY for each shard copy of `indexes` on node group
    /// `group`: it drops one index per statement.
    pub fn shard_statements(&self, indexes: &[(String, Arc<DistributedTable>)], group: i32) -> PgResult<Vec<(String, String)>> {
        let IndexStatement::Drop(stmt) = &self.stmt else { unreachable!("only DROP INDEX CONCURRENTLY goes shard by shard") };
        let string = |s: String| node(NodeEnum::String(protobuf::String { sval: s }));
        let mut statements = Vec::new();
        for (index, table) in indexes {
            for shard in shards_on(table, group) {
                let names = protobuf::List { items: vec![string(table.schema.clone()), string(format!("{index}_{}", shard.id))] };
                let stmt = protobuf::DropStmt { objects: vec![node(NodeEnum::List(names))], missing_ok: true, ..stmt.clone() };
                statements.push((table.shard_relname(shard), super::deparse::deparse_statement(self.version, NodeEnum::DropStmt(stmt))?));
            }
        }
        Ok(statements)
    }

    /// The statement for node group `group`: it drops or renames the shards'
    /// copies (`<index>_<shardid>`, in their table's schema) of `indexes` there.
    pub fn node_sql(&self, indexes: &[(String, Arc<DistributedTable>)], group: i32) -> PgResult<String> {
        let string = |s: String| node(NodeEnum::String(protobuf::String { sval: s }));
        match &self.stmt {
            IndexStatement::Drop(stmt) => {
                let mut stmt = stmt.clone();
                stmt.objects = indexes
                    .iter()
                    .flat_map(|(index, table)| {
                        shards_on(table, group).map(move |shard| {
                            node(NodeEnum::List(protobuf::List {
                                items: vec![string(table.schema.clone()), string(format!("{index}_{}", shard.id))],
                            }))
                        })
                    })
                    .collect();
                super::deparse::deparse_statement(self.version, NodeEnum::DropStmt(stmt))
            }
            IndexStatement::Rename(stmt) => {
                let mut statements = Vec::new();
                for (index, table) in indexes {
                    for shard in shards_on(table, group) {
                        let mut stmt = stmt.clone();
                        if let Some(rv) = stmt.relation.as_mut() {
                            rv.schemaname = table.schema.clone();
                            rv.relname = format!("{index}_{}", shard.id);
                        }
                        stmt.newname = format!("{}_{}", stmt.newname, shard.id);
                        statements.push(super::deparse::deparse_statement(self.version, NodeEnum::RenameStmt(stmt))?);
                    }
                }
                Ok(statements.join(";\n"))
            }
        }
    }
}

/// The shards of `table` with a placement on node group `group`.
pub(super) fn shards_on(table: &DistributedTable, group: i32) -> impl Iterator<Item = &Shard> {
    table.shards.iter().filter(move |s| s.placements.contains(&group))
}

/// Copies of a statement's `items` that name distributed tables, one per shard
/// of the table on node group `group`, renamed to that shard.
pub(super) fn for_shards_on<T: Clone>(
    items: &[(Arc<DistributedTable>, T)],
    group: i32,
    relation: impl Fn(&mut T) -> Option<&mut protobuf::RangeVar>,
) -> Vec<T> {
    let mut out = Vec::new();
    for (table, item) in items {
        for shard in shards_on(table, group) {
            let mut item = item.clone();
            if let Some(rv) = relation(&mut item) {
                name_shard(rv, table, shard);
            }
            out.push(item);
        }
    }
    out
}

/// Index expressions and predicates may qualify columns with the table's
/// name (`WHERE t.v > 0`); on a shard that name means nothing, and an index
/// reads only its own table, so the qualifier goes.
pub(super) fn unqualify_index_columns(ix: &mut protobuf::IndexStmt, table: &str) {
    let mut unqualify = |n: &mut NodeEnum| {
        if let NodeEnum::ColumnRef(c) = n {
            let names = super::column_ref_names(c);
            if names.as_deref().is_some_and(|names| names.len() >= 2 && names[names.len() - 2] == table) {
                c.fields.drain(..c.fields.len() - 1);
            }
        }
    };
    for part in ix.where_clause.iter_mut().map(|w| w.as_mut()).chain(ix.index_params.iter_mut()) {
        if let Some(n) = part.node.as_mut() {
            crate::walk::visit_mut(n, &mut unqualify);
        }
    }
}

pub(super) fn node(n: NodeEnum) -> protobuf::Node {
    protobuf::Node { node: Some(n) }
}

pub(super) fn names_of(nodes: &[protobuf::Node]) -> Vec<String> {
    nodes
        .iter()
        .filter_map(|n| match n.node.as_ref() {
            Some(NodeEnum::String(s)) => Some(s.sval.clone()),
            Some(NodeEnum::IndexElem(e)) => Some(e.name.clone()),
            _ => None,
        })
        .collect()
}

/// The subcommands of an ALTER TABLE that each shard of a table with a
/// worker-side parent runs: column changes reach it through the parent, so
/// a new column's table-level constraints (CHECK, UNIQUE, REFERENCES …)
/// become constraints of their own here, naming the column.
pub(super) fn shard_commands(cmds: Vec<protobuf::Node>) -> Vec<protobuf::Node> {
    let mut out = Vec::new();
    for node in cmds {
        let Some(NodeEnum::AlterTableCmd(cmd)) = node.node.as_ref() else { continue };
        if !changes_columns(cmd) {
            out.push(node);
            continue;
        }
        let Some(NodeEnum::ColumnDef(col)) = cmd.def.as_deref().and_then(|d| d.node.as_ref()) else { continue };
        for c in &col.constraints {
            let Some(NodeEnum::Constraint(c)) = c.node.as_ref() else { continue };
            if constraint_kind(c).is_none() {
                continue;
            }
            let mut c = c.as_ref().clone();
            let column = self::node(NodeEnum::String(protobuf::String { sval: col.colname.clone() }));
            match ConstrType::from_i32(c.contype) {
                Some(ConstrType::ConstrForeign) => c.fk_attrs = vec![column],
                Some(ConstrType::ConstrPrimary | ConstrType::ConstrUnique) => c.keys = vec![column],
                _ => {}
            }
            let add = protobuf::AlterTableCmd {
                subtype: AlterTableType::AtAddConstraint as i32,
                def: Some(Box::new(self::node(NodeEnum::Constraint(Box::new(c))))),
                behavior: cmd.behavior,
                ..Default::default()
            };
            out.push(self::node(NodeEnum::AlterTableCmd(Box::new(add))));
        }
    }
    out
}

/// The constraints an ALTER TABLE subcommand adds: a table constraint, or those
/// of a new column, with that column (which they constrain).
pub(super) fn added_constraints(cmd: &protobuf::AlterTableCmd) -> Vec<(&protobuf::Constraint, Option<&str>)> {
    match cmd.def.as_deref().and_then(|d| d.node.as_ref()) {
        Some(NodeEnum::Constraint(c)) => vec![(c, None)],
        Some(NodeEnum::ColumnDef(col)) => col
            .constraints
            .iter()
            .filter_map(|n| match n.node.as_ref() {
                Some(NodeEnum::Constraint(c)) => Some((c.as_ref(), Some(col.colname.as_str()))),
                _ => None,
            })
            .collect(),
        _ => vec![],
    }
}

/// A constraint's `pg_constraint.contype`; None for what PostgreSQL 15 does
/// not keep there (NOT NULL, DEFAULT, …).
pub(super) fn constraint_kind(c: &protobuf::Constraint) -> Option<char> {
    Some(match ConstrType::from_i32(c.contype)? {
        ConstrType::ConstrCheck => 'c',
        ConstrType::ConstrPrimary => 'p',
        ConstrType::ConstrUnique => 'u',
        ConstrType::ConstrForeign => 'f',
        ConstrType::ConstrExclusion => 'x',
        _ => return None,
    })
}

/// `added_constraints`, to edit them.
pub(super) fn added_constraints_mut(cmd: &mut protobuf::AlterTableCmd) -> Vec<&mut protobuf::Constraint> {
    match cmd.def.as_deref_mut().and_then(|d| d.node.as_mut()) {
        Some(NodeEnum::Constraint(c)) => vec![c],
        Some(NodeEnum::ColumnDef(col)) => col
            .constraints
            .iter_mut()
            .filter_map(|n| match n.node.as_mut() {
                Some(NodeEnum::Constraint(c)) => Some(c.as_mut()),
                _ => None,
            })
            .collect(),
        _ => vec![],
    }
}

/// Refuses a constraint the shards cannot enforce on their own. `column` is set
/// for a column constraint. Returns the table a foreign key references.
pub(super) fn check_constraint(
    table: &DistributedTable,
    c: &protobuf::Constraint,
    column: Option<&str>,
    catalog: &Catalog,
) -> Result<Option<Arc<DistributedTable>>, Plan> {
    match ConstrType::from_i32(c.contype) {
        Some(ConstrType::ConstrPrimary | ConstrType::ConstrUnique) => {
            let keys = match column {
                Some(column) => vec![column.to_string()],
                None => names_of(&c.keys),
            };
            match dist_column(table) {
                Some(col) if !keys.iter().any(|k| k == col) => Err(unique_without_key()),
                _ => Ok(None),
            }
        }
        Some(ConstrType::ConstrExclusion) => Err(not_supported("exclusion constraints on distributed tables are not supported yet")),
        Some(ConstrType::ConstrForeign) => {
            let target = c.pktable.as_ref().and_then(|p| resolve_range_var(p, catalog));
            match target {
                Some(t) if t.is_reference() => Ok(Some(t.clone())),
                Some(t) if t.colocation_id == table.colocation_id && !table.is_reference() => {
                    // Each shard can only check the rows of its own shard group.
                    let from = match column {
                        Some(column) => vec![column.to_string()],
                        None => names_of(&c.fk_attrs),
                    };
                    let to = names_of(&c.pk_attrs);
                    let (Some(key), Some(target_key)) = (dist_column(table), dist_column(t)) else { return Ok(Some(t.clone())) };
                    let pairs_keys =
                        if to.is_empty() { from.iter().any(|f| f == key) } else { from.iter().zip(&to).any(|(f, p)| f == key && p == target_key) };
                    if pairs_keys {
                        Ok(Some(t.clone()))
                    } else {
                        Err(not_supported(format!("a foreign key between distributed tables must include the distribution column \"{key}\", referencing \"{target_key}\" of {}", t.name)))
                    }
                }
                _ => Err(not_supported("foreign keys from a distributed table must reference a reference table or a co-located distributed table")),
            }
        }
        _ => Ok(None),
    }
}

pub(super) fn dist_column(table: &DistributedTable) -> Option<&str> {
    match &table.distribution {
        Distribution::Hash { column, .. } => Some(column),
        Distribution::Reference => None,
    }
}

pub(super) fn unique_without_key() -> Plan {
    Plan::Unsupported(
        PgError::not_supported("creating unique indexes on non-partition columns is currently unsupported")
            .with_hint("Include the distribution column in the PRIMARY KEY or UNIQUE constraint; uniqueness is enforced per shard."),
    )
}

/// Whether an ALTER TABLE subcommand changes a column's existence, type,
/// default or nullability: PostgreSQL forbids most of that on a partition
/// alone, and a worker-side parent needs the defaults itself (rows inserted
/// through it take its defaults, not their partition's).
pub(super) fn changes_columns(cmd: &protobuf::AlterTableCmd) -> bool {
    use AlterTableType as T;
    AlterTableType::from_i32(cmd.subtype).is_some_and(|t| {
        matches!(
            t,
            T::AtAddColumn | T::AtDropColumn | T::AtAlterColumnType | T::AtColumnDefault | T::AtSetNotNull | T::AtDropNotNull | T::AtDropExpression
        )
    })
}
