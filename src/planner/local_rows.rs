//! Writes to distributed tables that read tables of the coordinator
//! database: `UPDATE orders … FROM local_rates`, `MERGE INTO orders USING
//! staging`, `DELETE … WHERE id IN (SELECT id FROM local_blocklist)`. The
//! shards cannot read those tables, so at run time the coordinator database
//! gives their rows (as the statement's transaction sees them), the
//! statement is planned again with each of them replaced by its rows as
//! VALUES, and runs as that plan says (executor/local_rows.rs).

use super::walk::range_vars;
use super::{resolve_range_var, Plan};
use crate::metadata::Catalog;
use pg_query::protobuf;
use pg_query::NodeEnum;
use std::fmt;
use std::sync::Arc;

#[derive(Debug)]
pub struct LocalRowsPlan {
    pub statement: NodeEnum,
    pub version: i32,
    /// The local relations it reads, each once, as the statement names them.
    pub relations: Vec<protobuf::RangeVar>,
}

impl fmt::Display for LocalRowsPlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = self.relations.iter().map(|rv| rv.relname.as_str()).collect();
        write!(f, "with the rows of {}", names.join(", "))
    }
}

/// The plan of an UPDATE, DELETE or MERGE of a distributed table that reads
/// local relations; None for any other statement.
pub(super) fn plan(version: i32, node: &NodeEnum, catalog: &Catalog) -> Option<Plan> {
    let target = match node {
        NodeEnum::UpdateStmt(s) => s.relation.as_ref(),
        NodeEnum::DeleteStmt(s) => s.relation.as_ref(),
        NodeEnum::MergeStmt(s) => s.relation.as_ref(),
        _ => None,
    }?;
    resolve_range_var(target, catalog)?;
    let mut ctes = Vec::new();
    // A sample of a local table would have to be taken where its rows are:
    // such statements keep their refusal rather than read every row.
    let mut samples_local = false;
    super::walk::visit_mut(&mut node.clone(), &mut |n| match n {
        NodeEnum::CommonTableExpr(c) => ctes.push(c.ctename.clone()),
        NodeEnum::RangeTableSample(sample) => {
            if let Some(NodeEnum::RangeVar(rv)) = sample.relation.as_deref().and_then(|r| r.node.as_ref()) {
                samples_local |= resolve_range_var(rv, catalog).is_none();
            }
        }
        _ => {}
    });
    if samples_local {
        return None;
    }
    let mut relations: Vec<protobuf::RangeVar> = Vec::new();
    for rv in range_vars(node) {
        let names_cte = rv.schemaname.is_empty() && ctes.contains(&rv.relname);
        let known = relations.iter().any(|r| r.schemaname == rv.schemaname && r.relname == rv.relname);
        if resolve_range_var(&rv, catalog).is_none() && !names_cte && !known {
            relations.push(protobuf::RangeVar { alias: None, location: -1, ..rv });
        }
    }
    (!relations.is_empty()).then(|| Plan::WithLocalRows(Arc::new(LocalRowsPlan { statement: node.clone(), version, relations })))
}
