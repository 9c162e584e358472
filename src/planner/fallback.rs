//! The general fallback tier: a statement that reads distributed data in a way
//! no cheaper tier can split over the shards (a join on other columns, a window
//! over all rows, a correlated subquery, …) runs in the coordinator database.
//! There each distributed table has a stand-in in the schema `tessera_fallback`:
//! a hash-partitioned table whose partitions are postgres_fdw foreign tables over
//! the shards, partitioned exactly as the shards are, so PostgreSQL's own planner
//! prunes partitions, joins co-located tables partition by partition and pushes
//! filters to the workers. Slower than pushdown, but PostgreSQL computes every
//! row, so it is never wrong.
//!
//! Only reads of distributed tables go this way: writes to them would bypass the
//! coordinator's transaction handling, so those stay refused.

use super::decorrelate::decorrelate;
use super::deparse::deparse_statement as deparse;
use super::rewrite::unqualify_schema;
use super::walk::{range_vars, references_mut, visit_mut, Reference};
use super::{resolve_range_var, Plan};
use crate::error::PgResult;
use crate::metadata::{Catalog, DistributedTable};
use pg_query::protobuf;
use pg_query::NodeEnum;
use std::fmt;
use std::sync::Arc;

/// The schema holding the foreign-table stand-ins (see metadata/schema.sql).
pub const FALLBACK_SCHEMA: &str = "tessera_fallback";

#[derive(Debug)]
pub struct FallbackPlan {
    /// The statement over the tables' stand-ins.
    pub read: CoordinatorRead,
    /// Why no pushdown tier took the statement (for EXPLAIN and the log).
    pub reason: String,
    /// The statement as written, with its parse tree's version.
    pub statement: NodeEnum,
    pub version: i32,
    /// Hash-distributed tables of a SELECT that joins several: if all but one
    /// are small, shipping their rows to the shards of the largest may let
    /// the query run as a pushdown after all (decided at run time).
    pub broadcast_candidates: Vec<Arc<DistributedTable>>,
}

impl fmt::Display for FallbackPlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.reason)
    }
}

/// The stand-in's name for a distributed or reference table.
pub fn stand_in_name(table: &DistributedTable) -> String {
    format!("dist_{}", table.oid)
}

/// What the coordinator database reads in a distributed table's place.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StandIn {
    /// The foreign tables over the shards, in `FALLBACK_SCHEMA`: what the
    /// shards hold as other transactions see them.
    ForeignTables,
    /// A temporary copy made in the session's transaction block through its
    /// own worker connections, which sees the block's writes
    /// (executor/block_reads.rs).
    BlockCopy,
}

/// The temporary table holding a block's copy of a table's rows, with the
/// columns the table has in catalog `version` (a block may change them).
pub fn block_copy_name(table: &DistributedTable, version: i64) -> String {
    format!("tessera_block_{}_{}", table.oid, version.unsigned_abs())
}

/// A statement the coordinator database runs over distributed tables, in
/// both forms: over the foreign-table stand-ins, and over the copies a
/// block that wrote on the workers makes first.
#[derive(Clone, Debug)]
pub struct CoordinatorRead {
    pub sql: String,
    pub block_sql: String,
    /// The distributed and reference tables it reads, each once.
    pub tables: Vec<Arc<DistributedTable>>,
}

impl CoordinatorRead {
    /// `build` makes the statement with the tables read from a stand-in of
    /// the kind given (see `over_stand_ins`); None when it cannot.
    pub(super) fn build(
        version: i32,
        tables: Vec<Arc<DistributedTable>>,
        build: impl Fn(StandIn) -> Option<NodeEnum>,
    ) -> Option<PgResult<CoordinatorRead>> {
        let sql = deparse(version, build(StandIn::ForeignTables)?);
        let block_sql = deparse(version, build(StandIn::BlockCopy)?);
        Some(sql.and_then(|sql| Ok(CoordinatorRead { sql, block_sql: block_sql?, tables })))
    }
}

/// A fallback plan for a statement the other tiers refused with `reason`, if
/// the statement only reads distributed tables.
pub(super) fn plan(version: i32, node: &NodeEnum, catalog: &Catalog, reason: &str) -> Option<Plan> {
    let read =
        CoordinatorRead::build(version, super::distributed_among(&range_vars(node), catalog), |stand_in| over_stand_ins(node, catalog, stand_in))?;
    let mut broadcast_candidates: Vec<Arc<DistributedTable>> = Vec::new();
    if matches!(node, NodeEnum::SelectStmt(_)) {
        for rv in range_vars(node) {
            if let Some(t) = resolve_range_var(&rv, catalog).filter(|t| !t.is_reference()) {
                if !broadcast_candidates.iter().any(|c| c.oid == t.oid) {
                    broadcast_candidates.push(t.clone());
                }
            }
        }
    }
    if broadcast_candidates.len() < 2 {
        broadcast_candidates.clear();
    }
    Some(match read {
        Ok(read) => {
            Plan::Fallback(Arc::new(FallbackPlan { read, reason: reason.to_string(), statement: node.clone(), version, broadcast_candidates }))
        }
        Err(e) => Plan::Unsupported(e),
    })
}

/// The statement with every distributed table replaced by its stand-in, if
/// it only reads distributed tables.
pub(super) fn over_stand_ins(node: &NodeEnum, catalog: &Catalog, stand_in: StandIn) -> Option<NodeEnum> {
    if !only_reads_distributed_tables(node, catalog) || shadows_distributed_table(node, catalog) {
        return None;
    }
    let mut stmt = node.clone();
    decorrelate(&mut stmt, catalog);
    references_mut(&mut stmt, |r| match r {
        Reference::Table(rv) => point_at_stand_in(rv, catalog, stand_in),
        Reference::Column(c) => unqualify_schema(c, |schema, table| catalog.table(schema, table).is_some()),
    });
    if let NodeEnum::DeclareCursorStmt(declare) = &mut stmt {
        scroll_unless_told(declare);
    }
    Some(stmt)
}

/// `CURSOR_OPT_SCROLL` and `CURSOR_OPT_NO_SCROLL` of PostgreSQL's parsenodes.h.
const CURSOR_SCROLL: i32 = 0x0002;
const CURSOR_NO_SCROLL: i32 = 0x0004;

/// A cursor declared with neither SCROLL nor NO SCROLL fetches backward on
/// plain PostgreSQL whenever its plan can run backward, which a sort or a
/// scan of one table can; over foreign tables the plan cannot, so such a
/// cursor is declared SCROLL (PostgreSQL then keeps the rows it passed).
/// Not one FOR UPDATE, which cannot scroll.
fn scroll_unless_told(declare: &mut protobuf::DeclareCursorStmt) {
    let locks = matches!(declare.query.as_deref().and_then(|q| q.node.as_ref()), Some(NodeEnum::SelectStmt(s)) if !s.locking_clause.is_empty());
    if declare.options & (CURSOR_SCROLL | CURSOR_NO_SCROLL) == 0 && !locks {
        declare.options |= CURSOR_SCROLL;
    }
}

/// SELECTs, cursors over them, and writes to local tables, whose distributed
/// tables are only read.
fn only_reads_distributed_tables(node: &NodeEnum, catalog: &Catalog) -> bool {
    if !matches!(
        node,
        NodeEnum::SelectStmt(_) | NodeEnum::InsertStmt(_) | NodeEnum::UpdateStmt(_) | NodeEnum::DeleteStmt(_) | NodeEnum::DeclareCursorStmt(_)
    ) {
        return false;
    }
    let targets_distributed = |rv: Option<&protobuf::RangeVar>| rv.is_some_and(|rv| resolve_range_var(rv, catalog).is_some());
    let mut writes_distributed = false;
    visit_mut(&mut node.clone(), &mut |n| {
        writes_distributed |= match n {
            NodeEnum::InsertStmt(s) => targets_distributed(s.relation.as_ref()),
            NodeEnum::UpdateStmt(s) => targets_distributed(s.relation.as_ref()),
            NodeEnum::DeleteStmt(s) => targets_distributed(s.relation.as_ref()),
            _ => false,
        }
    });
    !writes_distributed
}

/// A WITH query named like a distributed table, referenced without a schema:
/// which one a reference means depends on scoping this rewrite does not model.
fn shadows_distributed_table(node: &NodeEnum, catalog: &Catalog) -> bool {
    let mut cte_names = Vec::new();
    visit_mut(&mut node.clone(), &mut |n| {
        if let NodeEnum::CommonTableExpr(c) = n {
            cte_names.push(c.ctename.clone());
        }
    });
    range_vars(node).iter().any(|rv| rv.schemaname.is_empty() && cte_names.contains(&rv.relname) && resolve_range_var(rv, catalog).is_some())
}

fn point_at_stand_in(rv: &mut protobuf::RangeVar, catalog: &Catalog, stand_in: StandIn) {
    let Some(table) = resolve_range_var(rv, catalog) else { return };
    if rv.alias.is_none() {
        // Column references qualified with the table's name keep resolving.
        rv.alias = Some(protobuf::Alias { aliasname: rv.relname.clone(), colnames: vec![] });
    }
    if stand_in == StandIn::BlockCopy {
        // The copy holds the rows of the table's partitions too (as a
        // reference without ONLY reads them).
        rv.relname = block_copy_name(table, catalog.version);
        rv.schemaname = "pg_temp".to_string();
        rv.inh = true;
        return;
    }
    rv.relname = stand_in_name(table);
    rv.schemaname = FALLBACK_SCHEMA.to_string();
    // The stand-in is partitioned over the shards: ONLY would read its
    // empty parent alone. That is right only for a partitioned table (its
    // own rows are none; its partitions' shards are in its shards).
    rv.inh = rv.inh || catalog.partitions_under(table.oid).is_empty();
}
