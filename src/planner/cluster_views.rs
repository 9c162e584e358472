//! Statements that read what only the nodes know: the `citus_stat_activity`
//! and `citus_lock_waits` views, the size functions (`citus_table_size()` and friends)
//! and `citus_check_cluster_node_health()`. They run in
//! the coordinator database like any local statement, once the executor has
//! gathered that data from every node into the session's temporary tables,
//! which the view and the functions read.

use super::walk::visit_mut;
use super::{function_names, string_node};
use pg_query::protobuf::{self, a_const, Node};
use pg_query::NodeEnum;

/// The size functions, by the name users call them.
pub const SIZE_FUNCTIONS: [&str; 3] = ["citus_relation_size", "citus_table_size", "citus_total_relation_size"];

/// PostgreSQL's own size functions and the size each gives. Called on a
/// distributed table they would measure its empty shell; the coordinator
/// has them call `tessera.size_of` instead, which gives the shards' size
/// for distributed tables and PostgreSQL's answer for any other relation.
const POSTGRES_SIZE_FUNCTIONS: [(&str, &str); 4] =
    [("pg_relation_size", "relation"), ("pg_table_size", "table"), ("pg_total_relation_size", "total"), ("pg_indexes_size", "indexes")];

/// What a statement needs gathered from the nodes before it runs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClusterData {
    /// Every node's `pg_stat_activity`.
    pub activity: bool,
    /// Which backend waits for which on every node (`citus_lock_waits`).
    pub lock_waits: bool,
    /// The on-disk sizes of every distributed table's shards, per table and
    /// per placement.
    pub sizes: bool,
    /// The coordinator process's connection pools (`tessera.connection_pools`).
    pub pools: bool,
    /// The coordinator process's client sessions (`tessera.client_sessions`).
    pub sessions: bool,
    /// Whether each node reaches every node (`citus_check_cluster_node_health()`).
    pub node_health: bool,
    /// The process's statement statistics (`citus_stat_statements`).
    pub statements: bool,
    /// The process's tenant statistics (`citus_stat_tenants`).
    pub tenants: bool,
    /// The process's event counters (`citus_stat_counters`).
    pub counters: bool,
    /// The statement with PostgreSQL's size functions redirected, when it
    /// calls them.
    pub rewritten: Option<String>,
}

/// What the local statement `text` reads of the nodes' data, if anything.
/// `distributed_tables`: whether any exist (else PostgreSQL's own size
/// functions are right as they are).
pub(super) fn needed(text: &str, distributed_tables: bool) -> Option<ClusterData> {
    // Most local statements mention no such name at all: no second parse.
    let mentions = |word: &[u8]| text.as_bytes().windows(word.len()).any(|w| w.eq_ignore_ascii_case(word));
    let postgres_sizes = distributed_tables && mentions(b"_size");
    if !mentions(b"citus_") && !mentions(b"tessera.") && !postgres_sizes {
        return None;
    }
    let parsed = pg_query::parse(text).ok()?;
    let version = parsed.protobuf.version;
    let mut stmt = parsed.protobuf.stmts.into_iter().next()?.stmt?.node?;
    let mut needs = ClusterData::default();
    let mut redirected = false;
    visit_mut(&mut stmt, &mut |node| match node {
        // The column keeps the name PostgreSQL gives it (parents come first).
        NodeEnum::ResTarget(target) if target.name.is_empty() && postgres_sizes => {
            if let Some(NodeEnum::FuncCall(call)) = target.val.as_deref().and_then(|v| v.node.as_ref()) {
                if let [name] | ["pg_catalog", name] = function_names(call).as_slice() {
                    if call.args.len() == 1 && POSTGRES_SIZE_FUNCTIONS.iter().any(|(f, _)| f == name) {
                        target.name = name.to_string();
                    }
                }
            }
        }
        NodeEnum::RangeVar(rv) if rv.relname == "citus_stat_activity" && matches!(rv.schemaname.as_str(), "" | "pg_catalog") => needs.activity = true,
        // The waits' statements come from the activity.
        NodeEnum::RangeVar(rv) if rv.relname == "citus_lock_waits" && matches!(rv.schemaname.as_str(), "" | "pg_catalog") => {
            needs.activity = true;
            needs.lock_waits = true;
        }
        // Their table_size and shard_size columns read the gathered sizes.
        NodeEnum::RangeVar(rv)
            if matches!(rv.relname.as_str(), "citus_tables" | "citus_shards") && matches!(rv.schemaname.as_str(), "" | "pg_catalog") =>
        {
            needs.sizes = true
        }
        NodeEnum::RangeVar(rv) if rv.relname == "connection_pools" && rv.schemaname == "tessera" => needs.pools = true,
        NodeEnum::RangeVar(rv) if rv.relname == "client_sessions" && rv.schemaname == "tessera" => needs.sessions = true,
        NodeEnum::RangeVar(rv) if matches!(rv.schemaname.as_str(), "" | "pg_catalog") => match rv.relname.as_str() {
            "citus_stat_statements" => needs.statements = true,
            "citus_stat_tenants" => needs.tenants = true,
            "citus_stat_counters" => needs.counters = true,
            _ => {}
        },
        NodeEnum::FuncCall(call) => {
            let name = match function_names(call).as_slice() {
                [name] | ["pg_catalog", name] => name.to_string(),
                _ => return,
            };
            if SIZE_FUNCTIONS.contains(&name.as_str()) {
                needs.sizes = true;
            }
            if name == "citus_check_cluster_node_health" {
                needs.node_health = true;
            }
            let kind = POSTGRES_SIZE_FUNCTIONS.iter().find(|(f, _)| *f == name).map(|(_, kind)| *kind);
            if let (Some(kind), true, 1) = (kind, postgres_sizes, call.args.len()) {
                call.funcname = vec![string_node("tessera"), string_node("size_of")];
                call.args.push(string_constant(kind));
                needs.sizes = true;
                redirected = true;
            }
        }
        _ => {}
    });
    if redirected {
        needs.rewritten = Some(super::deparse::deparse_statement(version, stmt).ok()?);
    }
    (needs != ClusterData::default()).then_some(needs)
}

fn string_constant(value: &str) -> Node {
    Node {
        node: Some(NodeEnum::AConst(protobuf::AConst {
            isnull: false,
            val: Some(a_const::Val::Sval(protobuf::String { sval: value.to_string() })),
            location: -1,
        })),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn needs(activity: bool, sizes: bool) -> Option<ClusterData> {
        Some(ClusterData { activity, sizes, ..Default::default() })
    }

    #[test]
    fn names_anywhere_in_the_statement_count() {
        assert_eq!(needed("SELECT 1", true), None);
        assert_eq!(needed("SELECT citus_version()", true), None);
        assert_eq!(needed("SELECT * FROM citus_stat_activity WHERE state = 'active'", true), needs(true, false));
        assert_eq!(needed("SELECT table_name, pg_size_pretty(CITUS_TOTAL_RELATION_SIZE(table_name)) FROM citus_tables", true), needs(false, true));
        assert_eq!(
            needed("WITH a AS (SELECT count(*) FROM pg_catalog.citus_stat_activity) SELECT pg_catalog.citus_table_size('t'), * FROM a", true),
            needs(true, true)
        );
        assert_eq!(needed("SELECT * FROM other.citus_stat_activity", true), None);
        assert_eq!(needed("SELECT table_name, table_size FROM citus_tables", false), needs(false, true));
        assert_eq!(needed("SELECT shardid, shard_size FROM pg_catalog.citus_shards", false), needs(false, true));
        assert_eq!(needed("SELECT * FROM citus_lock_waits", false), Some(ClusterData { activity: true, lock_waits: true, ..Default::default() }));
        let process = needed("SELECT s.pinned, p.node FROM tessera.client_sessions s, tessera.connection_pools p", false).unwrap();
        assert!(process.sessions && process.pools && !process.activity);
        assert_eq!(needed("SELECT * FROM connection_pools", false), None);
    }

    #[test]
    fn postgres_size_functions_are_redirected_while_tables_are_distributed() {
        let psql = "SELECT c.relname, pg_catalog.pg_size_pretty(pg_catalog.pg_table_size(c.oid)) FROM pg_catalog.pg_class c";
        let found = needed(psql, true).unwrap();
        assert!(found.sizes);
        assert_eq!(
            found.rewritten.as_deref(),
            Some("SELECT c.relname, pg_catalog.pg_size_pretty(tessera.size_of(c.oid, 'table')) FROM pg_catalog.pg_class c")
        );
        assert_eq!(needed(psql, false), None);
        // Two arguments (a fork) and other schemas' functions stay as they are.
        assert_eq!(needed("SELECT pg_relation_size('t', 'fsm'), app.pg_table_size('t')", true), None);
        assert_eq!(
            needed("SELECT pg_total_relation_size('t')", true).and_then(|n| n.rewritten),
            Some("SELECT tessera.size_of('t', 'total') AS pg_total_relation_size".to_string())
        );
    }
}
