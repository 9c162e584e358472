//! Statements that read what only the nodes know: the `citus_stat_activity`
//! view and the size functions (`citus_table_size()` and friends). They run in
//! the coordinator database like any local statement, once the executor has
//! gathered that data from every node into the session's temporary tables,
//! which the view and the functions read.

use super::function_names;
use super::walk::visit_mut;
use pg_query::NodeEnum;

/// The size functions, by the name users call them.
pub const SIZE_FUNCTIONS: [&str; 3] = ["citus_relation_size", "citus_table_size", "citus_total_relation_size"];

/// What a statement needs gathered from the nodes before it runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ClusterData {
    /// Every node's `pg_stat_activity`.
    pub activity: bool,
    /// The on-disk sizes of every distributed table's shards.
    pub sizes: bool,
}

/// What the local statement `text` reads of the nodes' data, if anything.
pub(super) fn needed(text: &str) -> Option<ClusterData> {
    // Most local statements mention no Citus name at all: no second parse.
    if !text.as_bytes().windows(6).any(|w| w.eq_ignore_ascii_case(b"citus_")) {
        return None;
    }
    let parsed = pg_query::parse(text).ok()?;
    let mut stmt = parsed.protobuf.stmts.into_iter().next()?.stmt?.node?;
    let mut needs = ClusterData::default();
    visit_mut(&mut stmt, &mut |node| match node {
        NodeEnum::RangeVar(rv) if rv.relname == "citus_stat_activity" && matches!(rv.schemaname.as_str(), "" | "pg_catalog") => needs.activity = true,
        NodeEnum::FuncCall(call) => {
            if matches!(function_names(call).as_slice(), [name] | ["pg_catalog", name] if SIZE_FUNCTIONS.contains(name)) {
                needs.sizes = true;
            }
        }
        _ => {}
    });
    (needs != ClusterData::default()).then_some(needs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_anywhere_in_the_statement_count() {
        assert_eq!(needed("SELECT 1"), None);
        assert_eq!(needed("SELECT citus_version()"), None);
        assert_eq!(needed("SELECT * FROM citus_stat_activity WHERE state = 'active'"), Some(ClusterData { activity: true, sizes: false }));
        assert_eq!(
            needed("SELECT table_name, pg_size_pretty(CITUS_TOTAL_RELATION_SIZE(table_name)) FROM citus_tables"),
            Some(ClusterData { activity: false, sizes: true })
        );
        assert_eq!(
            needed("WITH a AS (SELECT count(*) FROM pg_catalog.citus_stat_activity) SELECT pg_catalog.citus_table_size('t'), * FROM a"),
            Some(ClusterData { activity: true, sizes: true })
        );
        assert_eq!(needed("SELECT * FROM other.citus_stat_activity"), None);
    }
}
