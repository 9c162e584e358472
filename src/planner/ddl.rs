//! Utility statements on distributed tables: DDL that must reach the shell table
//! on the coordinator database and every shard, atomically.

use super::ddl_plan::*;
use super::rewrite::ShardTemplate;
use super::{not_supported, referenced_tables, resolve_range_var, Plan};
use crate::connection::quote_literal;
use crate::error::PgResult;
use crate::metadata::{Catalog, DistributedTable};
use pg_query::protobuf::{self, AlterTableType, ObjectType};
use pg_query::NodeEnum;
use std::collections::BTreeSet;
use std::sync::Arc;

/// The distributed tables among a statement's relations, with the names it
/// gives them.
fn distributed_relations(relations: &[protobuf::Node], catalog: &Catalog) -> Vec<(Arc<DistributedTable>, protobuf::RangeVar)> {
    relations
        .iter()
        .filter_map(|n| match n.node.as_ref() {
            Some(NodeEnum::RangeVar(rv)) => resolve_range_var(rv, catalog).map(|table| (table.clone(), rv.clone())),
            _ => None,
        })
        .collect()
}

/// Node groups holding a placement of any of `tables`.
pub fn placement_groups<'a>(tables: impl IntoIterator<Item = &'a Arc<DistributedTable>>) -> BTreeSet<i32> {
    tables.into_iter().flat_map(|t| t.shards.iter().flat_map(|s| s.placements.iter().copied())).collect()
}

pub(super) fn plan_utility(version: i32, raw: &protobuf::RawStmt, catalog: &Catalog) -> Option<Plan> {
    let node = raw.stmt.as_ref()?.node.as_ref()?;
    // `also`: tables the statement names where the generic walk behind
    // referenced_tables does not look (RENAME's table, foreign-key targets).
    let propagate = |table: &Arc<DistributedTable>, also: Vec<Arc<DistributedTable>>, catalog_sql: Option<String>, relations: RelationChanges| {
        if let Err(refusal) = super::deparse::deparse_faithfully(&protobuf::ParseResult { version, stmts: vec![raw.clone()] }) {
            return Plan::Unsupported(refusal);
        }
        let mut tables = referenced_tables(raw, catalog);
        for t in std::iter::once(table.clone()).chain(also) {
            if !tables.iter().any(|o| o.oid == t.oid) {
                tables.push(t);
            }
        }
        Plan::Ddl(Arc::new(DdlPlan::Propagate {
            table: table.clone(),
            template: ShardTemplate::for_utility(version, raw.clone(), tables),
            catalog_sql,
            relations,
        }))
    };
    match node {
        // A new local table may reference distributed tables as its foreign
        // keys' targets and copy them with LIKE (the shell has their
        // definition), but not inherit from them or be their partition.
        NodeEnum::CreateStmt(create) => {
            let parent = create.inh_relations.iter().find_map(|n| match n.node.as_ref() {
                Some(NodeEnum::RangeVar(rv)) => resolve_range_var(rv, catalog),
                _ => None,
            });
            Some(match (parent, &create.relation) {
                (None, _) => Plan::Local,
                (Some(parent), Some(partition)) if create.partbound.is_some() && !parent.is_reference() => {
                    Plan::Ddl(Arc::new(DdlPlan::AddPartition { parent: parent.clone(), partition: partition.clone() }))
                }
                _ => not_supported("tables that inherit from distributed tables are not supported; partitions of distributed tables are"),
            })
        }
        NodeEnum::IndexStmt(ix) => {
            let table = resolve_range_var(ix.relation.as_ref()?, catalog)?;
            if let Some(col) = dist_column(table) {
                if (ix.unique || ix.primary) && !names_of(&ix.index_params).iter().any(|n| n == col) {
                    return Some(unique_without_key());
                }
            }
            Some(propagate(table, vec![], None, RelationChanges::default()))
        }
        // A view over distributed tables exists on the workers too.
        NodeEnum::AlterTableStmt(a) if names_view(a.relation.as_ref(), catalog) => Some(everywhere(
            version,
            NodeEnum::AlterTableStmt(protobuf::AlterTableStmt {
                missing_ok: true,
                relation: qualified_view(a.relation.as_ref(), catalog),
                ..a.clone()
            }),
        )),
        NodeEnum::AlterTableStmt(alter) => {
            let table = resolve_range_var(alter.relation.as_ref()?, catalog)?;
            let col = dist_column(table);
            let mut referenced = Vec::new();
            let mut relations = RelationChanges::default();
            for cmd in &alter.cmds {
                let Some(NodeEnum::AlterTableCmd(cmd)) = cmd.node.as_ref() else { continue };
                let subtype = AlterTableType::from_i32(cmd.subtype);
                if let Some(NodeEnum::PartitionCmd(p)) = cmd.def.as_deref().and_then(|d| d.node.as_ref()) {
                    match plan_partition_command(table, p, subtype, alter.cmds.len(), catalog) {
                        Ok(Some(partition)) => {
                            relations.reshaped = std::iter::once(partition.clone()).chain(catalog.partitions_under(partition.oid)).collect();
                            referenced.push(partition)
                        }
                        Ok(None) => return Some(Plan::Ddl(Arc::new(DdlPlan::AddPartition { parent: table.clone(), partition: p.name.clone()? }))),
                        Err(refusal) => return Some(refusal),
                    }
                    continue;
                }
                if matches!(subtype, Some(AlterTableType::AtDropColumn | AlterTableType::AtAlterColumnType)) && Some(cmd.name.as_str()) == col {
                    return Some(not_supported("cannot execute ALTER TABLE command involving partition column"));
                }
                for (c, column) in added_constraints(cmd) {
                    match check_constraint(table, c, column, catalog) {
                        Ok(target) => referenced.extend(target),
                        Err(refusal) => return Some(refusal),
                    }
                }
            }
            if table.has_worker_parent() {
                let mut parent = alter.clone();
                parent.relation = alter.relation.as_ref().map(|rv| qualified(rv, &table.schema));
                parent.cmds = parent_commands(&alter.cmds);
                relations.foreign_retype = ForeignRetype::of(version, &parent);
                if !parent.cmds.is_empty() {
                    match super::deparse::deparse_statement(version, NodeEnum::AlterTableStmt(parent)) {
                        Ok(sql) => relations.parent_sql = Some(sql),
                        Err(refusal) => return Some(Plan::Unsupported(refusal)),
                    }
                }
            }
            if alter.cmds.iter().any(|cmd| matches!(cmd.node.as_ref(), Some(NodeEnum::AlterTableCmd(c)) if changes_columns(c))) {
                relations.rebuild_views = views_listing_columns(table, catalog);
            }
            Some(propagate(table, referenced, None, relations))
        }
        // Views over distributed tables exist on the workers too: changes
        // of them follow (where a worker has the view).
        NodeEnum::RenameStmt(r) if names_view(r.relation.as_ref(), catalog) => Some(everywhere(
            version,
            NodeEnum::RenameStmt(Box::new(protobuf::RenameStmt {
                missing_ok: true,
                relation: qualified_view(r.relation.as_ref(), catalog),
                ..r.as_ref().clone()
            })),
        )),
        NodeEnum::AlterObjectSchemaStmt(a) if names_view(a.relation.as_ref(), catalog) => Some(everywhere(
            version,
            NodeEnum::AlterObjectSchemaStmt(Box::new(protobuf::AlterObjectSchemaStmt {
                missing_ok: true,
                relation: qualified_view(a.relation.as_ref(), catalog),
                ..a.as_ref().clone()
            })),
        )),
        NodeEnum::RenameStmt(r) if r.rename_type == ObjectType::ObjectIndex as i32 => {
            Some(Plan::Ddl(Arc::new(DdlPlan::DropIndex(DropIndex { version, stmt: IndexStatement::Rename(r.clone()) }))))
        }
        NodeEnum::RenameStmt(r) => {
            let table = resolve_range_var(r.relation.as_ref()?, catalog)?;
            let kind = ObjectType::from_i32(r.rename_type);
            // The parent repeats the table's name, columns and policies.
            let mut relations = RelationChanges::default();
            if matches!(kind, Some(ObjectType::ObjectTable | ObjectType::ObjectColumn | ObjectType::ObjectPolicy)) && table.has_worker_parent() {
                let parent = protobuf::RenameStmt { relation: r.relation.as_ref().map(|rv| qualified(rv, &table.schema)), ..r.as_ref().clone() };
                relations.parent_sql = Some(super::deparse::deparse_statement(version, NodeEnum::RenameStmt(Box::new(parent))).ok()?);
            }
            match kind {
                Some(ObjectType::ObjectColumn) => relations.rebuild_views = views_listing_columns(table, catalog),
                Some(ObjectType::ObjectTable) if !table.has_worker_parent() => relations.rebuild_views = vec![table.clone()],
                _ => {}
            }
            if kind == Some(ObjectType::ObjectTable) && table.has_worker_parent() {
                relations.renamed_to = Some(r.newname.clone());
            }
            match kind {
                Some(ObjectType::ObjectTable | ObjectType::ObjectTabconstraint | ObjectType::ObjectTrigger | ObjectType::ObjectPolicy) => {
                    Some(propagate(table, vec![], None, relations))
                }
                Some(ObjectType::ObjectColumn) => {
                    let catalog_sql = (dist_column(table) == Some(r.subname.as_str())).then(|| {
                        format!("SELECT tessera.rename_distribution_column({1}, {0})", crate::connection::quote_literal(&r.newname), table.oid)
                    });
                    Some(propagate(table, vec![], catalog_sql, relations))
                }
                _ => Some(not_supported("this kind of RENAME on distributed tables is not supported yet")),
            }
        }
        NodeEnum::DropStmt(d) if d.remove_type == ObjectType::ObjectTable as i32 => {
            let tables = referenced_dropped_tables(&d.objects, catalog);
            (!tables.is_empty()).then(|| Plan::Ddl(Arc::new(DdlPlan::Drop { tables })))
        }
        NodeEnum::DropStmt(d) if d.remove_type == ObjectType::ObjectIndex as i32 || d.remove_type == ObjectType::ObjectStatisticExt as i32 => {
            Some(Plan::Ddl(Arc::new(DdlPlan::DropIndex(DropIndex { version, stmt: IndexStatement::Drop(d.clone()) }))))
        }
        NodeEnum::DropStmt(d) if d.remove_type == ObjectType::ObjectTrigger as i32 || d.remove_type == ObjectType::ObjectPolicy as i32 => {
            // One object per statement, named (schema.)table.name.
            let Some(NodeEnum::List(names)) = d.objects.first().and_then(|o| o.node.as_ref()) else { return None };
            let parts = names_of(&names.items);
            let table = match parts.as_slice() {
                [table, _] => catalog.resolve(None, table),
                [schema, table, _] => catalog.resolve(Some(schema), table),
                _ => None,
            }?;
            Some(Plan::Ddl(Arc::new(DdlPlan::DropFromTable { version, stmt: d.clone(), table: table.clone() })))
        }
        NodeEnum::CreateTrigStmt(t) => {
            let table = resolve_range_var(t.relation.as_ref()?, catalog)?;
            if t.isconstraint {
                return Some(not_supported("constraint triggers on distributed tables are not supported yet; use an ordinary AFTER trigger"));
            }
            Some(propagate(table, vec![], None, RelationChanges::default()))
        }
        NodeEnum::CreateStatsStmt(st) => {
            let table = st.relations.iter().find_map(|n| match n.node.as_ref() {
                Some(NodeEnum::RangeVar(rv)) => resolve_range_var(rv, catalog),
                _ => None,
            })?;
            if st.defnames.is_empty() {
                return Some(not_supported("CREATE STATISTICS on a distributed table needs a name for the statistics object"));
            }
            Some(propagate(table, vec![], None, RelationChanges::default()))
        }
        // Queries through a worker-side parent see its policies, not its partitions'.
        NodeEnum::CreatePolicyStmt(_) | NodeEnum::AlterPolicyStmt(_) => {
            let rv = match node {
                NodeEnum::CreatePolicyStmt(p) => p.table.as_ref(),
                NodeEnum::AlterPolicyStmt(p) => p.table.as_ref(),
                _ => None,
            }?;
            let table = resolve_range_var(rv, catalog)?;
            let mut relations = RelationChanges::default();
            if table.has_worker_parent() {
                let parent = match node {
                    NodeEnum::CreatePolicyStmt(p) => NodeEnum::CreatePolicyStmt(Box::new(protobuf::CreatePolicyStmt {
                        table: Some(qualified(rv, &table.schema)),
                        ..p.as_ref().clone()
                    })),
                    NodeEnum::AlterPolicyStmt(p) => NodeEnum::AlterPolicyStmt(Box::new(protobuf::AlterPolicyStmt {
                        table: Some(qualified(rv, &table.schema)),
                        ..p.as_ref().clone()
                    })),
                    _ => return None,
                };
                relations.parent_sql = Some(super::deparse::deparse_statement(version, parent).ok()?);
            }
            Some(propagate(table, vec![], None, relations))
        }
        // Comments describe the table, which the coordinator database does.
        NodeEnum::CommentStmt(_) => Some(Plan::Local),
        NodeEnum::TruncateStmt(t) => {
            let tables = distributed_relations(&t.relations, catalog);
            (!tables.is_empty()).then(|| Plan::Ddl(Arc::new(DdlPlan::Truncate { version, stmt: t.clone(), tables })))
        }
        NodeEnum::LockStmt(l) => {
            let tables = distributed_relations(&l.relations, catalog);
            (!tables.is_empty()).then(|| Plan::Ddl(Arc::new(DdlPlan::Lock { version, stmt: l.clone(), tables })))
        }
        NodeEnum::VacuumStmt(v) if v.rels.is_empty() => {
            // A bare VACUUM or ANALYZE means every table of the database:
            // the coordinator database's own, and every shard. A partition
            // is reached through its parent, which PostgreSQL recurses into.
            let mut tables: Vec<&Arc<DistributedTable>> = catalog.tables().filter(|t| t.partition_of.is_none()).collect();
            tables.sort_by(|a, b| (&a.schema, &a.name).cmp(&(&b.schema, &b.name)));
            let rels: Vec<_> = tables
                .into_iter()
                .map(|t| {
                    let relation = protobuf::RangeVar {
                        schemaname: t.schema.clone(),
                        relname: t.name.clone(),
                        inh: true,
                        relpersistence: "p".into(),
                        ..Default::default()
                    };
                    (t.clone(), protobuf::VacuumRelation { relation: Some(relation), ..Default::default() })
                })
                .collect();
            (!rels.is_empty()).then(|| Plan::Ddl(Arc::new(DdlPlan::Vacuum { version, stmt: v.clone(), rels })))
        }
        NodeEnum::VacuumStmt(v) => {
            let rels: Vec<_> = v
                .rels
                .iter()
                .filter_map(|n| match n.node.as_ref() {
                    Some(NodeEnum::VacuumRelation(vr)) => {
                        vr.relation.as_ref().and_then(|rv| resolve_range_var(rv, catalog)).map(|table| (table.clone(), vr.clone()))
                    }
                    _ => None,
                })
                .collect();
            (!rels.is_empty()).then(|| Plan::Ddl(Arc::new(DdlPlan::Vacuum { version, stmt: v.clone(), rels })))
        }
        NodeEnum::GrantStmt(g) => plan_grant(version, g, node, catalog),
        // Queries that read a view over distributed tables are planned with
        // its query expanded (planner/views.rs); the workers get the view too,
        // over their worker-side relations, for the user code that runs there.
        NodeEnum::ViewStmt(v) => Some(match v.view.as_ref() {
            Some(view) if view.relpersistence != "t" && view_runs_on_workers(node, catalog) => view_everywhere(version, node.clone()),
            _ => Plan::Local,
        }),
        // Any view may have been made on the workers too (`view_runs_on_workers`
        // judged it by the catalog of its day).
        NodeEnum::DropStmt(d) if d.remove_type == ObjectType::ObjectView as i32 => {
            Some(everywhere(version, NodeEnum::DropStmt(protobuf::DropStmt { missing_ok: true, ..d.clone() })))
        }
        NodeEnum::ExplainStmt(_) => {
            (!referenced_tables(raw, catalog).is_empty()).then(|| not_supported("EXPLAIN of queries over distributed tables is not supported yet"))
        }
        _ => None,
    }
}

/// Whether a statement's relation is a view over distributed tables.
fn names_view(relation: Option<&protobuf::RangeVar>, catalog: &Catalog) -> bool {
    relation.is_some_and(|rv| catalog.view(super::schema_of(rv), &rv.relname).is_some())
}

/// A statement's relation named with `schema`, where the session's
/// search_path found it: on the nodes it must name the same relation.
fn qualified(rv: &protobuf::RangeVar, schema: &str) -> protobuf::RangeVar {
    protobuf::RangeVar { schemaname: schema.to_string(), ..rv.clone() }
}

/// `qualified` for a view over distributed tables.
fn qualified_view(relation: Option<&protobuf::RangeVar>, catalog: &Catalog) -> Option<protobuf::RangeVar> {
    let rv = relation?;
    Some(match catalog.view(super::schema_of(rv), &rv.relname) {
        Some(view) => qualified(rv, &view.schema),
        None => rv.clone(),
    })
}

/// Every node makes the view; a worker lacking what it reads (a view over
/// other views that live only in the coordinator database) goes without, as
/// it lacks them.
fn view_everywhere(version: i32, stmt: NodeEnum) -> Plan {
    match node_text(version, stmt) {
        Ok(sql) => Plan::Ddl(Arc::new(DdlPlan::Everywhere {
            sql: format!("DO $tessera$ BEGIN EXECUTE {}; EXCEPTION WHEN undefined_table THEN NULL; END $tessera$", quote_literal(&sql)),
            forget: vec![],
            roles: RoleChange::None,
        })),
        Err(e) => Plan::Unsupported(e),
    }
}

/// Whether a new view reads distributed tables (or views of them) and no
/// table the workers lack, so that it can exist on the workers too.
fn view_runs_on_workers(node: &NodeEnum, catalog: &Catalog) -> bool {
    let NodeEnum::ViewStmt(v) = node else { return false };
    let Some(query) = v.query.as_ref().and_then(|q| q.node.as_ref()) else { return false };
    let (views, others): (Vec<protobuf::RangeVar>, Vec<protobuf::RangeVar>) =
        super::walk::range_vars(query).into_iter().partition(|rv| catalog.view(super::schema_of(rv), &rv.relname).is_some());
    let reaches = !views.is_empty()
        || others.iter().any(|rv| resolve_range_var(rv, catalog).is_some())
        || super::walk::called_functions(query).iter().any(|f| catalog.user_code.touching(f).is_some());
    reaches && super::dml::first_local_table(query, &others, catalog).is_none()
}

/// Statements that every node must run, whether or not tables are
/// distributed yet: CHECKPOINT; those about roles (which every node checks
/// privileges against) and default privileges; and those creating, changing
/// or dropping the objects tables and queries depend on (schemas, types,
/// domains, extensions, functions, collations, operators, casts …), so that
/// shards can use them and queries on the shards find them.
pub(super) fn plan_cluster_wide(version: i32, node: &NodeEnum, catalog: &Catalog) -> Option<Plan> {
    Some(match node {
        NodeEnum::CheckPointStmt(_) => Plan::Ddl(Arc::new(DdlPlan::Checkpoint)),
        NodeEnum::CreateRoleStmt(_)
        | NodeEnum::AlterRoleStmt(_)
        | NodeEnum::AlterRoleSetStmt(_)
        | NodeEnum::DropRoleStmt(_)
        | NodeEnum::GrantRoleStmt(_)
        | NodeEnum::AlterDefaultPrivilegesStmt(_)
        | NodeEnum::ReassignOwnedStmt(_)
        | NodeEnum::DropOwnedStmt(_)
        | NodeEnum::CompositeTypeStmt(_)
        | NodeEnum::CreateEnumStmt(_)
        | NodeEnum::CreateRangeStmt(_)
        | NodeEnum::AlterEnumStmt(_)
        | NodeEnum::CreateDomainStmt(_)
        | NodeEnum::AlterDomainStmt(_)
        | NodeEnum::AlterTypeStmt(_)
        | NodeEnum::AlterExtensionStmt(_)
        | NodeEnum::AlterExtensionContentsStmt(_)
        | NodeEnum::DefineStmt(_)
        | NodeEnum::CreateCastStmt(_)
        | NodeEnum::AlterCollationStmt(_) => everywhere(version, node.clone()),
        // Workers may have the schema already (shards create their table's
        // schema) or the extension (installed by default, like plpgsql).
        NodeEnum::CreateSchemaStmt(s) => {
            // Tables created with the schema stay local to the coordinator
            // database, as any new table does.
            let stmt = protobuf::CreateSchemaStmt { schema_elts: vec![], if_not_exists: true, ..s.clone() };
            everywhere(version, NodeEnum::CreateSchemaStmt(stmt))
        }
        NodeEnum::CreateExtensionStmt(e) => {
            everywhere(version, NodeEnum::CreateExtensionStmt(protobuf::CreateExtensionStmt { if_not_exists: true, ..e.clone() }))
        }
        NodeEnum::CreateFunctionStmt(_) | NodeEnum::AlterFunctionStmt(_) => routine_everywhere(version, node.clone()),
        NodeEnum::GrantStmt(g) if is_routine(g.objtype) => routine_everywhere(version, node.clone()),
        // A database's privileges (CREATE for schemas and trusted
        // extensions) matter on every node's database of that name.
        NodeEnum::GrantStmt(g)
            if ObjectType::from_i32(g.objtype)
                .is_some_and(|t| matches!(t, ObjectType::ObjectSchema | ObjectType::ObjectDatabase) || is_shared_object(t)) =>
        {
            everywhere(version, node.clone())
        }
        NodeEnum::DropStmt(d) if ObjectType::from_i32(d.remove_type).is_some_and(|t| t == ObjectType::ObjectSchema || is_shared_object(t)) => {
            plan_drop_everywhere(version, d, catalog)
        }
        NodeEnum::RenameStmt(r) if is_routine(r.rename_type) => routine_everywhere(version, node.clone()),
        NodeEnum::AlterOwnerStmt(a) if is_routine(a.object_type) => routine_everywhere(version, node.clone()),
        NodeEnum::AlterObjectSchemaStmt(a) if is_routine(a.object_type) => routine_everywhere(version, node.clone()),
        NodeEnum::CommentStmt(c) if is_routine(c.objtype) => routine_everywhere(version, node.clone()),
        NodeEnum::RenameStmt(r) if renames_shared_object(r) => everywhere(version, node.clone()),
        NodeEnum::AlterOwnerStmt(a) if ObjectType::from_i32(a.object_type).is_some_and(|t| t == ObjectType::ObjectSchema || is_shared_object(t)) => {
            everywhere(version, node.clone())
        }
        NodeEnum::AlterObjectSchemaStmt(a) if ObjectType::from_i32(a.object_type).is_some_and(is_shared_object) => everywhere(version, node.clone()),
        NodeEnum::CommentStmt(c) if ObjectType::from_i32(c.objtype).is_some_and(|t| t == ObjectType::ObjectSchema || is_shared_object(t)) => {
            everywhere(version, node.clone())
        }
        _ => return None,
    })
}

/// Object kinds (other than schemas and roles) that exist alike on every
/// node: what shard columns, defaults, checks, triggers and pushed-down
/// queries may use.
fn is_shared_object(t: ObjectType) -> bool {
    use protobuf::ObjectType::*;
    matches!(
        t,
        protobuf::ObjectType::ObjectType
            | ObjectDomain
            | ObjectDomconstraint
            | ObjectExtension
            | ObjectFunction
            | ObjectProcedure
            | ObjectRoutine
            | ObjectAggregate
            | ObjectCollation
            | ObjectOperator
            | ObjectCast
            | ObjectTsconfiguration
            | ObjectTsdictionary
            | ObjectLanguage
    )
}

fn renames_shared_object(r: &protobuf::RenameStmt) -> bool {
    match ObjectType::from_i32(r.rename_type) {
        Some(ObjectType::ObjectSchema) => true,
        // ALTER TYPE … RENAME ATTRIBUTE (of a composite type, not a table's column).
        Some(ObjectType::ObjectAttribute) => ObjectType::from_i32(r.relation_type) == Some(ObjectType::ObjectType),
        Some(t) => is_shared_object(t),
        None => false,
    }
}

/// DROP of schemas and shared objects. Nodes that never got the object
/// (it predates its propagation) are fine without it. Distributed tables in
/// a schema dropped with CASCADE leave the catalog with their shells.
fn plan_drop_everywhere(version: i32, drop: &protobuf::DropStmt, catalog: &Catalog) -> Plan {
    let mut forget = Vec::new();
    if drop.remove_type == ObjectType::ObjectSchema as i32 {
        let schemas: Vec<String> = drop
            .objects
            .iter()
            .filter_map(|o| match o.node.as_ref() {
                Some(NodeEnum::String(s)) => Some(s.sval.clone()),
                _ => None,
            })
            .collect();
        forget = catalog.tables().filter(|t| schemas.contains(&t.schema)).cloned().collect();
    }
    let stmt = protobuf::DropStmt { missing_ok: true, ..drop.clone() };
    match node_text(version, NodeEnum::DropStmt(stmt)) {
        Ok(sql) => Plan::Ddl(Arc::new(DdlPlan::Everywhere { sql, forget, roles: RoleChange::None })),
        Err(e) => Plan::Unsupported(e),
    }
}

/// Every node runs `stmt`.
fn everywhere(version: i32, stmt: NodeEnum) -> Plan {
    let roles = match &stmt {
        // DROP OWNED drops a role's user mappings with what it owns.
        NodeEnum::CreateRoleStmt(c) => RoleChange::Named(vec![c.role.clone()]),
        NodeEnum::DropOwnedStmt(_) => RoleChange::Named(Vec::new()),
        NodeEnum::RenameStmt(r) if r.rename_type == ObjectType::ObjectRole as i32 => RoleChange::Named(vec![r.newname.clone()]),
        NodeEnum::DropRoleStmt(d) => RoleChange::Dropped(
            d.roles
                .iter()
                .filter_map(|r| match r.node.as_ref() {
                    Some(NodeEnum::RoleSpec(spec)) => Some(spec.rolename.clone()),
                    _ => None,
                })
                .collect(),
        ),
        _ => RoleChange::None,
    };
    match node_text(version, stmt) {
        Ok(sql) => Plan::Ddl(Arc::new(DdlPlan::Everywhere { sql, forget: vec![], roles })),
        Err(e) => Plan::Unsupported(e),
    }
}

fn is_routine(object_type: i32) -> bool {
    use protobuf::ObjectType::*;
    matches!(protobuf::ObjectType::from_i32(object_type), Some(ObjectFunction | ObjectProcedure | ObjectRoutine | ObjectAggregate))
}

/// Every node runs `stmt`, about a function or procedure. Its body may use
/// tables that exist on a worker only as shards (so bodies go unchecked
/// there), and its signature may name a table's row type, which a worker
/// lacks: such a routine is left out on the workers rather than failing
/// the statement (queries sent to the shards cannot use it anyway).
fn routine_everywhere(version: i32, stmt: NodeEnum) -> Plan {
    match node_text(version, stmt) {
        Ok(sql) => Plan::Ddl(Arc::new(DdlPlan::Everywhere {
            sql: format!(
                "SET LOCAL check_function_bodies = off; DO $tessera$ BEGIN EXECUTE {}; EXCEPTION WHEN undefined_object THEN NULL; END $tessera$",
                quote_literal(&sql)
            ),
            forget: vec![],
            roles: RoleChange::None,
        })),
        Err(e) => Plan::Unsupported(e),
    }
}

/// A statement's text for the nodes, refused if it would not say the same.
fn node_text(version: i32, stmt: NodeEnum) -> PgResult<String> {
    let tree = protobuf::ParseResult { version, stmts: vec![protobuf::RawStmt { stmt: Some(Box::new(node(stmt))), stmt_location: 0, stmt_len: 0 }] };
    super::deparse::deparse_faithfully(&tree)
}

/// GRANT/REVOKE of privileges on tables: the distributed ones' shards get
/// them too; on all tables of a schema: every node. Grants on schemas are
/// cluster-wide (`plan_cluster_wide`); on other objects (sequences and
/// functions live in the coordinator database, and so do databases' own
/// grants) the coordinator database's alone.
fn plan_grant(version: i32, grant: &protobuf::GrantStmt, node: &NodeEnum, catalog: &Catalog) -> Option<Plan> {
    let target = protobuf::GrantTargetType::from_i32(grant.targtype);
    let objtype = ObjectType::from_i32(grant.objtype);
    if target == Some(protobuf::GrantTargetType::AclTargetAllInSchema) && objtype == Some(ObjectType::ObjectTable) {
        return catalog.has_tables().then(|| everywhere(version, node.clone()));
    }
    match objtype {
        Some(ObjectType::ObjectTable) => {
            let tables = distributed_relations(&grant.objects, catalog);
            (!tables.is_empty()).then(|| Plan::Ddl(Arc::new(DdlPlan::Grant { version, stmt: grant.clone(), tables })))
        }
        _ => None,
    }
}

/// ATTACH or DETACH PARTITION on a distributed table: the partition's shards
/// are attached to (or detached from) the parent's. Returns the partition
/// when it is distributed already, None for a local table to attach (to be
/// distributed with the parent), or the refusal.
fn plan_partition_command(
    parent: &DistributedTable,
    command: &protobuf::PartitionCmd,
    subtype: Option<AlterTableType>,
    commands: usize,
    catalog: &Catalog,
) -> Result<Option<Arc<DistributedTable>>, Plan> {
    if command.concurrent || subtype == Some(AlterTableType::AtDetachPartitionFinalize) {
        return Err(not_supported("DETACH PARTITION CONCURRENTLY on distributed tables is not supported yet; use DETACH PARTITION"));
    }
    if commands > 1 {
        return Err(not_supported("ATTACH/DETACH PARTITION on a distributed table must be the statement's only command"));
    }
    match command.name.as_ref().and_then(|rv| resolve_range_var(rv, catalog)) {
        Some(partition) if partition.colocation_id == parent.colocation_id => Ok(Some(partition.clone())),
        Some(partition) => Err(not_supported(format!(
            "\"{}\" is not co-located with \"{}\"; only co-located tables can be its partitions",
            partition.name, parent.name
        ))),
        None if subtype == Some(AlterTableType::AtAttachPartition) && !parent.is_reference() => Ok(None),
        None => Err(not_supported("this partition command on a distributed table is not supported")),
    }
}

/// The distributed tables a DROP TABLE names, and their partitions, which
/// go with them.
fn referenced_dropped_tables(objects: &[protobuf::Node], catalog: &Catalog) -> Vec<Arc<DistributedTable>> {
    let named: Vec<Arc<DistributedTable>> = objects
        .iter()
        .filter_map(|o| match o.node.as_ref() {
            Some(NodeEnum::List(l)) => {
                let parts = names_of(&l.items);
                match parts.as_slice() {
                    [name] => catalog.resolve(None, name).cloned(),
                    [schema, name] => catalog.resolve(Some(schema), name).cloned(),
                    _ => None,
                }
            }
            _ => None,
        })
        .collect();
    let mut tables = named.clone();
    for table in &named {
        for partition in catalog.partitions_under(table.oid) {
            if !tables.iter().any(|t| t.oid == partition.oid) {
                tables.push(partition);
            }
        }
    }
    tables
}

/// The tables whose worker-side views list `table`'s columns: a reference
/// table's own view, a partitioned table's partitions' views.
fn views_listing_columns(table: &Arc<DistributedTable>, catalog: &Catalog) -> Vec<Arc<DistributedTable>> {
    if table.is_reference() {
        vec![table.clone()]
    } else {
        catalog.partitions_under(table.oid)
    }
}

/// Whether an ALTER TABLE subcommand changes something about the table
/// that a worker-side parent repeats, as well as its shards do.
fn changes_table_settings(cmd: &protobuf::AlterTableCmd) -> bool {
    use AlterTableType as T;
    AlterTableType::from_i32(cmd.subtype).is_some_and(|t| {
        matches!(t, T::AtChangeOwner | T::AtEnableRowSecurity | T::AtDisableRowSecurity | T::AtForceRowSecurity | T::AtNoForceRowSecurity)
    })
}

/// The subcommands of an ALTER TABLE that the worker-side parent runs: column
/// changes (a new column without its table-level constraints, which each
/// shard adds on its own) and table settings.
fn parent_commands(cmds: &[protobuf::Node]) -> Vec<protobuf::Node> {
    let mut out = Vec::new();
    for node in cmds {
        let Some(NodeEnum::AlterTableCmd(cmd)) = node.node.as_ref() else { continue };
        if !changes_columns(cmd) && !changes_table_settings(cmd) {
            continue;
        }
        let mut cmd = cmd.clone();
        if let Some(NodeEnum::ColumnDef(col)) = cmd.def.as_deref_mut().and_then(|d| d.node.as_mut()) {
            col.constraints.retain(|c| !matches!(c.node.as_ref(), Some(NodeEnum::Constraint(c)) if constraint_kind(c).is_some()));
        }
        out.push(self::node(NodeEnum::AlterTableCmd(cmd)));
    }
    out
}
