//! WITH queries that write (`WITH gone AS (DELETE … RETURNING *) INSERT INTO
//! archive SELECT * FROM gone`), and INSERTs with any WITH clause, that the
//! router cannot send to one shard group: unpinned, pinned to two groups, or
//! an INSERT whose rows' keys it cannot tell apart. The general fallback does
//! not write, so such a statement runs unchanged on one worker, over the
//! worker-side relations (commands/worker_relations.rs), which show it whole
//! tables: the rows of its own shards are read and written there, the others
//! through the link relay, whose writes commit with the worker's transaction.
//! The worker is the one holding the statement's pinned shard group when all
//! its parts agree on one, so that a tenant's statement stays local.

use super::dml::{first_local_table, modifying_cte, top_level_with, whole_on_any_worker};
use super::rewrite::ShardTemplate;
use super::router::{nested_pins, router, sets_distribution_column, Command};
use super::{resolve_range_var, walk, Plan};
use crate::metadata::{Catalog, Distribution};
use pg_query::protobuf;
use pg_query::NodeEnum;

/// The plan running `node` whole on a worker, when it is such a statement
/// and everything it writes can be written there: distributed tables that are
/// not partitions, without defaults the coordinator fills in (sequences,
/// identity columns), their distribution columns unchanged.
pub(super) fn on_worker(version: i32, raw: &protobuf::RawStmt, node: &NodeEnum, catalog: &Catalog) -> Option<Plan> {
    // A read-only query's WITH clause is the fallback's to answer.
    let with = top_level_with(node)?;
    if matches!(node, NodeEnum::SelectStmt(_)) && modifying_cte(with).is_none() {
        return None;
    }
    let range_vars = walk::range_vars(node);
    if first_local_table(node, &range_vars, catalog).is_some() || !writable_on_a_worker(node, &range_vars, catalog) {
        return None;
    }
    let template = ShardTemplate::unchanged(version, raw.clone());
    if let Some((tables, pins)) = nested_pins(node, catalog) {
        let colocated = tables.windows(2).all(|w| w[0].colocation_id == w[1].colocation_id);
        if let (Some(anchor), Some((target, _))) = (tables.first(), pins.first()) {
            if colocated && pins.iter().all(|(t, _)| t == target) {
                return Some(router(Command::WholeOnWorker, target.clone(), Some(anchor.clone()), template));
            }
        }
    }
    whole_on_any_worker(catalog, template)
}

/// Whether every table `node` writes into (at any depth) is a distributed
/// table a worker's parent relation takes the write for as the coordinator
/// would: not a reference table (only the coordinator writes every copy), not
/// a partition, no default computed in the coordinator database, and no
/// UPDATE of its distribution column. Nor may the statement name a table it
/// writes anywhere else (`range_vars` are all the tables it names): postgres_fdw
/// runs a statement's scans and writes of another node's shard as separate
/// commands of one remote transaction, so a scan there could see the
/// statement's own write, which in PostgreSQL it never does.
fn writable_on_a_worker(node: &NodeEnum, range_vars: &[protobuf::RangeVar], catalog: &Catalog) -> bool {
    let writable_table = |relation: Option<&protobuf::RangeVar>, inserts: bool| {
        relation.and_then(|r| resolve_range_var(r, catalog)).is_some_and(|t| {
            matches!(t.distribution, Distribution::Hash { .. })
                && t.partition_of.is_none()
                && (!inserts || (t.key_default.is_none() && t.sequence_columns.is_empty() && t.always_identity.is_empty()))
                && range_vars.iter().filter(|rv| resolve_range_var(rv, catalog).is_some_and(|named| named.oid == t.oid)).count() == 1
        })
    };
    node.nodes().into_iter().all(|(n, _, _)| match n {
        pg_query::NodeRef::InsertStmt(s) => writable_table(s.relation.as_ref(), true),
        pg_query::NodeRef::UpdateStmt(s) => writable_table(s.relation.as_ref(), false) && !sets_distribution_column(s, catalog),
        pg_query::NodeRef::DeleteStmt(s) => writable_table(s.relation.as_ref(), false),
        pg_query::NodeRef::MergeStmt(_) => false,
        _ => true,
    })
}
