//! Utility statements on distributed tables: DDL that must reach the shell table
//! on the coordinator database and every shard, atomically.

use super::rewrite::ShardTemplate;
use super::{not_supported, referenced_tables, resolve_range_var, Plan};
use crate::error::PgError;
use crate::metadata::{Catalog, Distribution, DistributedTable};
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
    Propagate { table: Arc<DistributedTable>, template: ShardTemplate, catalog_sql: Option<String> },
    /// DROP TABLE of distributed tables (possibly with local ones).
    Drop { tables: Vec<Arc<DistributedTable>> },
    /// TRUNCATE of distributed tables (possibly with local ones).
    Truncate { tables: Vec<Arc<DistributedTable>> },
    /// VACUUM / ANALYZE: per shard, outside any transaction.
    Vacuum { tables: Vec<Arc<DistributedTable>>, analyze_only: bool, options: String },
}

impl fmt::Display for DdlPlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names = |ts: &[Arc<DistributedTable>]| ts.iter().map(|t| t.name.clone()).collect::<Vec<_>>().join(",");
        match self {
            DdlPlan::Propagate { table, .. } => write!(f, "propagate to {}", table.name),
            DdlPlan::Drop { tables } => write!(f, "drop {}", names(tables)),
            DdlPlan::Truncate { tables } => write!(f, "truncate {}", names(tables)),
            DdlPlan::Vacuum { tables, .. } => write!(f, "vacuum {}", names(tables)),
        }
    }
}

impl DdlPlan {
    /// The statement for shard `index` of a propagated DDL.
    pub fn shard_sql(table: &DistributedTable, template: &ShardTemplate, index: u32) -> Result<String, PgError> {
        let shard = &table.shards[index as usize];
        let suffix = format!("_{}", shard.id);
        template.sql_with(index, |node| match node.node.as_mut() {
            Some(NodeEnum::IndexStmt(ix)) if !ix.idxname.is_empty() => ix.idxname.push_str(&suffix),
            Some(NodeEnum::AlterTableStmt(alter)) => {
                for cmd in &mut alter.cmds {
                    if let Some(NodeEnum::AlterTableCmd(cmd)) = cmd.node.as_mut() {
                        if let Some(NodeEnum::Constraint(c)) = cmd.def.as_mut().and_then(|d| d.node.as_mut()) {
                            if !c.conname.is_empty() {
                                c.conname.push_str(&suffix);
                            }
                        }
                        if cmd.subtype == AlterTableType::AtDropConstraint as i32 && !cmd.name.is_empty() {
                            cmd.name.push_str(&suffix);
                        }
                    }
                }
            }
            _ => {}
        })
    }
}

fn dist_column(table: &DistributedTable) -> Option<&str> {
    match &table.distribution {
        Distribution::Hash { column, .. } => Some(column),
        Distribution::Reference => None,
    }
}

fn names_of(nodes: &[protobuf::Node]) -> Vec<String> {
    nodes
        .iter()
        .filter_map(|n| match n.node.as_ref() {
            Some(NodeEnum::String(s)) => Some(s.sval.clone()),
            Some(NodeEnum::IndexElem(e)) => Some(e.name.clone()),
            _ => None,
        })
        .collect()
}

fn unique_without_key() -> Plan {
    Plan::Unsupported(PgError::not_supported("creating unique indexes on non-partition columns is currently unsupported").with_hint(
        "Include the distribution column in the PRIMARY KEY or UNIQUE constraint; uniqueness is enforced per shard.",
    ))
}

pub(super) fn plan_utility(version: i32, raw: &protobuf::RawStmt, catalog: &Catalog) -> Option<Plan> {
    let node = raw.stmt.as_ref()?.node.as_ref()?;
    let propagate = |table: &Arc<DistributedTable>, catalog_sql: Option<String>| {
        Plan::Ddl(Arc::new(DdlPlan::Propagate {
            table: table.clone(),
            template: ShardTemplate::for_utility(version, raw.clone(), referenced_tables(raw, catalog)),
            catalog_sql,
        }))
    };
    match node {
        NodeEnum::IndexStmt(ix) => {
            let table = resolve_range_var(ix.relation.as_ref()?, catalog)?;
            if ix.concurrent {
                return Some(not_supported("CREATE INDEX CONCURRENTLY on distributed tables is not supported yet; use CREATE INDEX"));
            }
            if let Some(col) = dist_column(table) {
                if (ix.unique || ix.primary) && !names_of(&ix.index_params).iter().any(|n| n == col) {
                    return Some(unique_without_key());
                }
            }
            Some(propagate(table, None))
        }
        NodeEnum::AlterTableStmt(alter) => {
            let table = resolve_range_var(alter.relation.as_ref()?, catalog)?;
            let col = dist_column(table);
            for cmd in &alter.cmds {
                let Some(NodeEnum::AlterTableCmd(cmd)) = cmd.node.as_ref() else { continue };
                let subtype = AlterTableType::from_i32(cmd.subtype);
                if matches!(subtype, Some(AlterTableType::AtDropColumn | AlterTableType::AtAlterColumnType)) && Some(cmd.name.as_str()) == col {
                    return Some(not_supported("cannot execute ALTER TABLE command involving partition column"));
                }
                if let Some(NodeEnum::Constraint(c)) = cmd.def.as_deref().and_then(|d| d.node.as_ref()) {
                    match ConstrType::from_i32(c.contype) {
                        Some(ConstrType::ConstrPrimary | ConstrType::ConstrUnique) => {
                            if let Some(col) = col {
                                if !names_of(&c.keys).iter().any(|k| k == col) {
                                    return Some(unique_without_key());
                                }
                            }
                        }
                        Some(ConstrType::ConstrExclusion) => return Some(not_supported("exclusion constraints on distributed tables are not supported yet")),
                        Some(ConstrType::ConstrForeign) => {
                            let target = c.pktable.as_ref().and_then(|p| resolve_range_var(p, catalog));
                            let ok = target.is_some_and(|t| t.is_reference() || (t.colocation_id == table.colocation_id && !table.is_reference()));
                            if !ok {
                                return Some(not_supported(
                                    "foreign keys from a distributed table must reference a reference table or a co-located distributed table",
                                ));
                            }
                        }
                        _ => {}
                    }
                }
            }
            Some(propagate(table, None))
        }
        NodeEnum::RenameStmt(r) => {
            let table = resolve_range_var(r.relation.as_ref()?, catalog)?;
            match ObjectType::from_i32(r.rename_type) {
                Some(ObjectType::ObjectColumn) => {
                    let catalog_sql = (dist_column(table) == Some(r.subname.as_str())).then(|| {
                        format!(
                            "UPDATE tessera.pg_dist_partition SET partkey = {} WHERE logicalrelid = {}::regclass",
                            crate::connection::quote_literal(&r.newname),
                            table.oid
                        )
                    });
                    Some(propagate(table, catalog_sql))
                }
                _ => Some(not_supported("renaming distributed tables or their constraints is not supported yet")),
            }
        }
        NodeEnum::DropStmt(d) if d.remove_type == ObjectType::ObjectTable as i32 => {
            let tables = referenced_dropped_tables(&d.objects, catalog);
            (!tables.is_empty()).then(|| Plan::Ddl(Arc::new(DdlPlan::Drop { tables })))
        }
        NodeEnum::TruncateStmt(t) => {
            let tables: Vec<_> = t
                .relations
                .iter()
                .filter_map(|n| match n.node.as_ref() {
                    Some(NodeEnum::RangeVar(rv)) => resolve_range_var(rv, catalog).cloned(),
                    _ => None,
                })
                .collect();
            (!tables.is_empty()).then(|| Plan::Ddl(Arc::new(DdlPlan::Truncate { tables })))
        }
        NodeEnum::VacuumStmt(v) => {
            let tables: Vec<_> = v
                .rels
                .iter()
                .filter_map(|n| match n.node.as_ref() {
                    Some(NodeEnum::VacuumRelation(vr)) => vr.relation.as_ref().and_then(|rv| resolve_range_var(rv, catalog)).cloned(),
                    _ => None,
                })
                .collect();
            if tables.is_empty() {
                return None;
            }
            let options = vacuum_options(v);
            Some(Plan::Ddl(Arc::new(DdlPlan::Vacuum { tables, analyze_only: !v.is_vacuumcmd, options })))
        }
        NodeEnum::CopyStmt(c) => {
            let touches = c.relation.as_ref().and_then(|r| resolve_range_var(r, catalog)).is_some() || !referenced_tables(raw, catalog).is_empty();
            touches.then(|| not_supported("COPY to or from distributed tables is not supported yet"))
        }
        NodeEnum::ExplainStmt(_) => {
            (!referenced_tables(raw, catalog).is_empty()).then(|| not_supported("EXPLAIN of queries over distributed tables is not supported yet"))
        }
        _ => None,
    }
}

fn referenced_dropped_tables(objects: &[protobuf::Node], catalog: &Catalog) -> Vec<Arc<DistributedTable>> {
    objects
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
        .collect()
}

/// VACUUM/ANALYZE options as SQL, e.g. "(VERBOSE, ANALYZE)"; empty when none.
fn vacuum_options(v: &protobuf::VacuumStmt) -> String {
    let opts: Vec<String> = v
        .options
        .iter()
        .filter_map(|o| match o.node.as_ref() {
            Some(NodeEnum::DefElem(d)) => Some(d.defname.to_uppercase()),
            _ => None,
        })
        .collect();
    if opts.is_empty() {
        String::new()
    } else {
        format!("({})", opts.join(", "))
    }
}
