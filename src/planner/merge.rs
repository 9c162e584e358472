//! MERGE through the coordinator: when each shard group cannot run a MERGE on
//! its own (its source is constants, reference tables or other tables, and it
//! may insert), but its ON condition ties the target's distribution column to
//! a value of each source row, the coordinator database computes the source
//! rows with that value; each row goes to the shard its value hashes to, and
//! each shard runs the MERGE over its own rows, given as VALUES.

use super::deparse::{deparse_expression, deparse_statement};
use super::rewrite::name_shard;
use super::{column_ref_names, fallback, is_equals, not_supported, res_target, string_node, Plan};
use crate::error::{PgError, PgResult};
use crate::metadata::{Catalog, DistributedTable, Distribution};
use pg_query::protobuf::{self, Node};
use pg_query::NodeEnum;
use std::fmt;
use std::sync::Arc;

/// Stands for the source in the statement kept for the shards, until a
/// shard's rows replace it.
const SOURCE_PLACEHOLDER: &str = "tessera_merge_source_rows";

#[derive(Debug)]
pub struct MergePlan {
    pub target: Arc<DistributedTable>,
    version: i32,
    /// The MERGE, its source replaced by the placeholder.
    stmt: protobuf::MergeStmt,
    /// What the coordinator database runs for the source rows: the key value
    /// (in the distribution column's type) first, then the source's columns.
    pub source: fallback::CoordinatorRead,
    /// The name the statement gives the source.
    alias: String,
}

impl fmt::Display for MergePlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "merge into {} through the coordinator", self.target.qualified_name())
    }
}

impl MergePlan {
    /// The MERGE for shard `index`, over `rows` (a VALUES list's rows) with
    /// the source's `columns` (quoted).
    pub fn shard_sql(&self, index: usize, rows: &str, columns: &[String]) -> PgResult<String> {
        let mut stmt = self.stmt.clone();
        if let Some(rv) = stmt.relation.as_mut() {
            // The statement's references to the target by its name must
            // still resolve once it names the shard.
            if rv.alias.is_none() {
                rv.alias = Some(protobuf::Alias { aliasname: rv.relname.clone(), colnames: vec![] });
            }
            name_shard(rv, &self.target, &self.target.shards[index]);
        }
        let sql = deparse_statement(self.version, NodeEnum::MergeStmt(Box::new(stmt)))?;
        let source = format!("(VALUES {rows}) AS {}({})", crate::connection::quote_ident(&self.alias), columns.join(", "));
        Ok(sql.replacen(SOURCE_PLACEHOLDER, &source, 1))
    }
}

/// Plans `merge` into the distributed `target` through the coordinator, or
/// refuses it (`why`) when no distribution value ties each source row to
/// one shard group.
pub(super) fn through_coordinator(version: i32, merge: &protobuf::MergeStmt, target: &Arc<DistributedTable>, catalog: &Catalog, why: &str) -> Plan {
    let refuse = || {
        Plan::Unsupported(PgError::not_supported(why.to_string()).with_hint(
            "Join the target's distribution column to a value of the source in ON (ON t.key = s.key), or use INSERT … ON CONFLICT DO UPDATE.",
        ))
    };
    let Distribution::Hash { column, key, .. } = &target.distribution else {
        return refuse();
    };
    let (Some(rel), Some(source)) = (merge.relation.as_ref(), merge.source_relation.as_deref()) else {
        return refuse();
    };
    let target_name = rel.alias.as_ref().map(|a| a.aliasname.clone()).unwrap_or_else(|| rel.relname.clone());
    let Some(alias) = source_name(source) else {
        return refuse();
    };
    let Some(key_value) = merge.join_condition.as_deref().and_then(|on| key_equality(on, &target_name, column)) else {
        return refuse();
    };
    let Ok(key_text) = deparse_expression(key_value) else {
        return refuse();
    };
    // A row an INSERT action adds must belong where its source row went.
    for clause in merge.merge_when_clauses.iter().filter_map(|n| match n.node.as_ref() {
        Some(NodeEnum::MergeWhenClause(c)) if c.command_type == protobuf::CmdType::CmdInsert as i32 => Some(c),
        _ => None,
    }) {
        let position = if clause.target_list.is_empty() {
            target.columns.iter().position(|c| c == column)
        } else {
            clause.target_list.iter().position(|n| matches!(n.node.as_ref(), Some(NodeEnum::ResTarget(r)) if r.name == *column))
        };
        let given = position.and_then(|i| clause.values.get(i)).and_then(|v| v.node.as_ref()).and_then(|v| deparse_expression(v).ok());
        if given.as_deref() != Some(key_text.as_str()) {
            return refuse();
        }
    }
    // Only the source may read other tables: the shards see just their own.
    let mut rest = merge.clone();
    rest.source_relation = None;
    if super::distributed_among(&super::walk::range_vars(&NodeEnum::MergeStmt(Box::new(rest))), catalog).iter().any(|t| t.oid != target.oid) {
        return not_supported("MERGE whose conditions or actions read other distributed tables is not supported yet");
    }
    if contains_param(&NodeEnum::MergeStmt(Box::new(merge.clone()))) {
        return not_supported("MERGE through the coordinator with bind parameters is not supported yet; give the values in the statement");
    }
    let Some(type_name) = super::keys::key_type_name(key) else {
        return refuse();
    };
    let select = protobuf::SelectStmt {
        target_list: vec![
            res_target("", super::cast_to_catalog_type(node(key_value.clone()), type_name)),
            res_target(
                "",
                node(NodeEnum::ColumnRef(protobuf::ColumnRef {
                    fields: vec![string_node(&alias), node(NodeEnum::AStar(protobuf::AStar {}))],
                    location: -1,
                })),
            ),
        ],
        from_clause: vec![source.clone()],
        ..super::plain_select()
    };
    let select = NodeEnum::SelectStmt(Box::new(select));
    let tables = super::distributed_among(&super::walk::range_vars(&select), catalog);
    let reads_tables = !tables.is_empty();
    let over = |stand_in| if reads_tables { fallback::over_stand_ins(&select, catalog, stand_in) } else { Some(select.clone()) };
    let source = match fallback::CoordinatorRead::build(version, tables, over) {
        Some(Ok(source)) => source,
        Some(Err(e)) => return Plan::Unsupported(e),
        None => return refuse(),
    };
    let mut stmt = merge.clone();
    stmt.source_relation = Some(Box::new(node(NodeEnum::RangeVar(protobuf::RangeVar {
        relname: SOURCE_PLACEHOLDER.to_string(),
        inh: true,
        relpersistence: "p".into(),
        location: -1,
        ..Default::default()
    }))));
    Plan::MergeThroughCoordinator(Arc::new(MergePlan { target: target.clone(), version, stmt, source, alias }))
}

/// The name a MERGE's source goes by: its alias, or a table's name.
fn source_name(source: &Node) -> Option<String> {
    match source.node.as_ref()? {
        NodeEnum::RangeVar(rv) => Some(rv.alias.as_ref().map(|a| a.aliasname.clone()).unwrap_or_else(|| rv.relname.clone())),
        NodeEnum::RangeSubselect(s) => s.alias.as_ref().map(|a| a.aliasname.clone()),
        _ => None,
    }
}

/// In ON, `target.key = <value>` (either way round) where the value does not
/// read the target: the source's distribution value for a row.
fn key_equality<'a>(on: &'a Node, target: &str, column: &str) -> Option<&'a NodeEnum> {
    match on.node.as_ref()? {
        NodeEnum::BoolExpr(b) if b.boolop == protobuf::BoolExprType::AndExpr as i32 => b.args.iter().find_map(|a| key_equality(a, target, column)),
        NodeEnum::AExpr(e) if e.kind == protobuf::AExprKind::AexprOp as i32 && is_equals(&e.name) => {
            let (l, r) = (e.lexpr.as_deref()?.node.as_ref()?, e.rexpr.as_deref()?.node.as_ref()?);
            if is_target_key(l, target, column) && !mentions(r, target) {
                Some(r)
            } else if is_target_key(r, target, column) && !mentions(l, target) {
                Some(l)
            } else {
                None
            }
        }
        _ => None,
    }
}

fn is_target_key(n: &NodeEnum, target: &str, column: &str) -> bool {
    matches!(n, NodeEnum::ColumnRef(c) if column_ref_names(c).is_some_and(|names| names == [target, column]))
}

/// Whether an expression names the target (qualified columns only: an
/// unqualified one could be either side's, so it counts as the target's).
fn mentions(n: &NodeEnum, target: &str) -> bool {
    let mut found = false;
    let mut copy = n.clone();
    super::walk::visit_mut(&mut copy, &mut |n| {
        if let NodeEnum::ColumnRef(c) = n {
            // `t.*` has no names to compare.
            let names = column_ref_names(c).unwrap_or_default();
            found |= names.len() < 2 || names.first() == Some(&target);
        }
    });
    found
}

fn contains_param(n: &NodeEnum) -> bool {
    let mut found = false;
    let mut copy = n.clone();
    super::walk::visit_mut(&mut copy, &mut |n| found |= matches!(n, NodeEnum::ParamRef(_)));
    found
}

fn node(n: NodeEnum) -> Node {
    Node { node: Some(n) }
}
