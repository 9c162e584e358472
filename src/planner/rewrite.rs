//! Rewriting a statement's parse tree for one shard group: every reference to a
//! distributed or reference table is pointed at the shard that lives on the
//! target node, then the tree is deparsed back to SQL for the worker.

use crate::error::{PgError, PgResult};
use crate::metadata::DistributedTable;
use pg_query::protobuf::{self, Alias};
use pg_query::NodeMut;
use std::sync::Arc;

/// The tables a statement references, and the parse tree to rewrite.
#[derive(Debug)]
pub struct ShardTemplate {
    tree: protobuf::ParseResult,
    tables: Vec<Arc<DistributedTable>>,
}

impl ShardTemplate {
    pub fn new(version: i32, stmt: protobuf::RawStmt, tables: Vec<Arc<DistributedTable>>) -> Self {
        ShardTemplate { tree: protobuf::ParseResult { version, stmts: vec![stmt] }, tables }
    }

    pub fn tables(&self) -> &[Arc<DistributedTable>] {
        &self.tables
    }

    /// SQL for shard group `index`: hash tables use their shard with that index,
    /// reference tables their single shard.
    pub fn sql_for_shard(&self, index: u32) -> PgResult<String> {
        self.sql_with(index, |_| {})
    }

    /// Like `sql_for_shard`, after `edit` has changed the statement (used to keep
    /// only some VALUES rows of a multi-row INSERT).
    pub fn sql_with(&self, index: u32, edit: impl FnOnce(&mut protobuf::Node)) -> PgResult<String> {
        let mut tree = self.tree.clone();
        if let Some(node) = tree.stmts[0].stmt.as_deref_mut() {
            edit(node);
        }
        // SAFETY: the tree is owned by this function and only modified in place;
        // no node is removed while the returned references are alive.
        unsafe {
            for (node, _, _) in tree.nodes_mut() {
                if let NodeMut::RangeVar(rv) = node {
                    let rv = &mut *rv;
                    self.point_at_shard(rv, index);
                }
            }
        }
        pg_query::deparse(&tree).map_err(|e| PgError::internal(format!("could not deparse the statement for a shard: {e}")))
    }

    fn point_at_shard(&self, rv: &mut protobuf::RangeVar, index: u32) {
        let schema = if rv.schemaname.is_empty() { None } else { Some(rv.schemaname.as_str()) };
        let Some(table) = self.tables.iter().find(|t| t.name == rv.relname && schema.is_none_or(|s| s == t.schema)) else {
            return;
        };
        let shard = if table.is_reference() { table.shards.first() } else { table.shards.get(index as usize) };
        let Some(shard) = shard else { return };
        if rv.alias.is_none() {
            // Column references qualified with the table name keep resolving.
            rv.alias = Some(Alias { aliasname: rv.relname.clone(), colnames: vec![] });
        }
        rv.relname = table.shard_relname(shard);
        rv.schemaname = table.schema.clone();
    }
}
