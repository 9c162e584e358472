//! Unit tests of the planner as a whole: SQL text and an in-memory catalog
//! in, a `Plan` out, no server anywhere. Each file covers one planner
//! concern; this one holds the catalog they all plan against.
//!
//! Where each `Plan` variant is shown (`every_plan_variant_is_planned`
//! below fails to compile when a variant is added, until it is listed):
//!
//! | variant                 | tests                                                                  |
//! |-------------------------|------------------------------------------------------------------------|
//! | Empty, Local            | session::nothing_to_run_and_local_statements                           |
//! | LocalWithClusterData    | session::the_coordinator_database_runs_some_statements_over_cluster_data |
//! | LocalOverShards         | session::the_coordinator_database_runs_some_statements_over_cluster_data |
//! | Transaction             | session::transaction_control_is_the_coordinators                       |
//! | ClusterFunction         | session::cluster_functions_are_carried_out_by_the_coordinator          |
//! | Ddl                     | ddl.rs                                                                 |
//! | Router                  | router.rs                                                              |
//! | Delegated               | session::calls_of_distributed_functions_are_delegated_by_their_argument |
//! | KeysMeet                | router::keys_known_only_at_run_time_meet_or_fall_back                  |
//! | MultiShard              | multi_shard.rs, insert_select.rs, merge.rs                             |
//! | Fallback                | fallback.rs                                                            |
//! | Explain                 | session::explain_shows_the_plan_of_the_statement_it_explains           |
//! | InsertSelect            | insert_select.rs                                                       |
//! | MergeThroughCoordinator | merge::a_merge_from_other_rows_sends_each_to_its_shard                 |
//! | WithLocalRows           | merge::writes_reading_local_tables_wait_for_their_rows                 |
//! | Copy                    | copy.rs                                                                |
//! | SqlPrepare, SqlExecute, SqlDeallocate | session::sql_prepared_statements_over_distributed_tables_are_the_sessions |
//! | Unsupported             | the refusals of every file                                             |

/// The inner plan of `sql`'s plan, which must be of `variant`
/// (`planned_as!("SELECT …", Plan::Router)`); the test fails naming the
/// plan it got otherwise.
macro_rules! planned_as {
    ($sql:expr, $variant:path) => {
        match crate::planner::tests::plan($sql) {
            $variant(inner) => inner,
            other => panic!("{}\n  expected {}, planned {other}", $sql, stringify!($variant)),
        }
    };
}

mod copy;
mod ddl;
mod fallback;
mod insert_select;
mod merge;
mod multi_shard;
mod plan;
mod router;
mod session;

use super::{plan_query, Plan};
use crate::config::ServerAddr;
use crate::hash::{self, HashType};
use crate::metadata::{Catalog, Coercion, CopiedLanguage, DistributedFunction, DistributedTable, Distribution, KeyType, Node, Shard};
use std::sync::Arc;

/// Shards of every distributed table the builder makes.
pub(crate) const SHARD_COUNT: u32 = 4;

/// Builds a catalog of two worker nodes (groups 1 and 2) and the tables and
/// functions added to it. Tables live in `public`; each is numbered in the
/// order it is added, which is its oid, and shard `i` of table `n` has id
/// `100 * n + i` (table 2's shards are `t_200` … `t_203`) and lives on node
/// group `1 + i % 2`. Distribution columns are `integer`.
#[derive(Default)]
pub(crate) struct CatalogBuilder {
    tables: Vec<DistributedTable>,
    functions: Vec<FunctionSpec>,
    aggregates: Vec<&'static str>,
}

/// A distributed function: its arguments, and which of them picks the
/// shard of which table's co-location group.
struct FunctionSpec {
    name: String,
    arg_names: Vec<String>,
    distribution: (usize, String),
}

impl CatalogBuilder {
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// A hash-distributed table of `SHARD_COUNT` shards keyed by `key`, in
    /// co-location group `colocation`.
    pub(crate) fn distributed(self, name: &str, columns: &[&str], key: &str, colocation: i32) -> Self {
        let column_index = columns.iter().position(|c| *c == key).unwrap_or_else(|| panic!("{key} is not a column of {name}"));
        let distribution = Distribution::Hash {
            column: key.into(),
            column_index,
            column_type: HashType::Int4,
            key: KeyType { sql: "integer".into(), base_sql: "integer".into(), oid: 23, coercion: Coercion::None },
        };
        self.table(name, columns, distribution, colocation, SHARD_COUNT)
    }

    /// A reference table: one shard, placed on both nodes.
    pub(crate) fn reference(self, name: &str, columns: &[&str]) -> Self {
        self.table(name, columns, Distribution::Reference, 0, 1)
    }

    fn table(mut self, name: &str, columns: &[&str], distribution: Distribution, colocation_id: i32, shard_count: u32) -> Self {
        let oid = self.tables.len() as u32 + 1;
        let placements = |index: u32| match distribution {
            Distribution::Reference => vec![1, 2],
            Distribution::Hash { .. } => vec![1 + (index % 2) as i32],
        };
        let shards = (0..shard_count).map(|index| Shard { id: 100 * oid as i64 + index as i64, index, placements: placements(index) }).collect();
        let columns: Vec<String> = columns.iter().map(|c| c.to_string()).collect();
        self.tables.push(DistributedTable {
            oid,
            schema: "public".into(),
            name: name.into(),
            distribution,
            colocation_id,
            copy_columns: columns.clone(),
            // Unknown types: aggregates take their type-blind partial forms.
            column_type_oids: vec![0; columns.len()],
            columns,
            key_default: None,
            sequence_columns: vec![],
            always_identity: vec![],
            shards,
            partition_of: None,
            primary_key: vec![],
        });
        self
    }

    /// The last table added has this primary key.
    pub(crate) fn primary_key(mut self, columns: &[&str]) -> Self {
        self.last_table().primary_key = columns.iter().map(|c| c.to_string()).collect();
        self
    }

    /// The last table added has `column` filled from a sequence of the
    /// coordinator database, as `serial` does.
    pub(crate) fn serial(mut self, column: &str) -> Self {
        let table = self.last_table();
        let default = format!("nextval('{}_{column}_seq'::regclass)", table.name);
        if matches!(&table.distribution, Distribution::Hash { column: key, .. } if key == column) {
            table.key_default = Some(default.clone());
        }
        table.sequence_columns.push((column.into(), default));
        self
    }

    fn last_table(&mut self) -> &mut DistributedTable {
        self.tables.last_mut().expect("a table added first")
    }

    /// A PL/pgSQL function made distributed, its argument `argument` (from 0)
    /// picking the shard group of `colocated_with`'s co-location group.
    pub(crate) fn function(mut self, name: &str, arg_names: &[&str], argument: usize, colocated_with: &str) -> Self {
        self.functions.push(FunctionSpec {
            name: name.into(),
            arg_names: arg_names.iter().map(|a| a.to_string()).collect(),
            distribution: (argument, colocated_with.into()),
        });
        self
    }

    /// These names are aggregates, as `pg_proc` tells the catalog's loader.
    pub(crate) fn aggregates(mut self, names: &[&'static str]) -> Self {
        self.aggregates.extend(names);
        self
    }

    pub(crate) fn build(self) -> Catalog {
        let nodes = (1..=2).map(|n| Node {
            id: n,
            group_id: n,
            addr: ServerAddr { host: format!("worker{n}"), port: 5432 },
            active: true,
            should_have_shards: true,
            type_oids: Arc::default(),
        });
        let mut catalog = Catalog::for_tests(nodes.collect(), self.tables.into_iter().map(Arc::new).collect());
        catalog.add_aggregates_for_tests(&self.aggregates);
        for spec in self.functions {
            let (argument, table) = spec.distribution;
            let table = catalog.table("public", &table).unwrap_or_else(|| panic!("{table} is not in the catalog")).clone();
            let signature = format!("public.{}({})", spec.name, vec!["integer"; spec.arg_names.len()].join(", "));
            catalog.add_function_for_tests(Arc::new(DistributedFunction {
                schema: "public".into(),
                name: spec.name,
                arg_names: spec.arg_names,
                defaults: 0,
                distribution: Some((argument, table)),
                force_delegation: false,
                signature,
                copied_per_shard: Some(CopiedLanguage::PlPgSql),
            }));
        }
        catalog
    }
}

/// The catalog most tests plan against, the cluster of tests/explain.rs:
/// `ea` and `eb` co-located, `ec` in a group of its own, `er` a reference
/// table; `items` co-located with them, its `id` from a sequence; `events`
/// keyed by a serial column; `eo` and `el` co-located with `ea`, their
/// columns named TPC-H style (unique across tables). `elocal` and any other
/// name is a local table.
pub(crate) fn catalog() -> Catalog {
    CatalogBuilder::new()
        .distributed("ea", &["k", "g", "v"], "k", 1)
        .primary_key(&["k"])
        .distributed("eb", &["k", "w"], "k", 1)
        .primary_key(&["k"])
        .distributed("ec", &["k", "z"], "k", 2)
        .reference("er", &["id", "name"])
        .primary_key(&["id"])
        .distributed("items", &["id", "k", "note"], "k", 1)
        .serial("id")
        .distributed("events", &["id", "payload"], "id", 3)
        .serial("id")
        .distributed("eo", &["o_key", "o_note"], "o_key", 1)
        .distributed("el", &["l_key", "l_qty"], "l_key", 1)
        .function("ea_credit", &["key", "amount"], 0, "ea")
        .aggregates(&[
            "count",
            "sum",
            "avg",
            "min",
            "max",
            "bool_and",
            "string_agg",
            "percentile_cont",
            "rank",
            "row_number",
            "stddev",
            "var_pop",
            "variance",
            "hll_add_agg",
            "hll_union_agg",
        ])
        .build()
}

/// The plan of `sql`, one statement, over `catalog()`.
pub(crate) fn plan(sql: &str) -> Plan {
    plan_over(sql, &catalog())
}

/// The plan of `sql`, one statement, over `catalog`.
pub(crate) fn plan_over(sql: &str, catalog: &Catalog) -> Plan {
    let mut planned = plan_query(sql, catalog);
    assert_eq!(planned.len(), 1, "{sql} is one statement");
    planned.remove(0).plan
}

/// The index of the shard an `integer` key value hashes to, among
/// `SHARD_COUNT`.
pub(crate) fn shard_of(key: i32) -> u32 {
    let hashed = hash::hash_text(HashType::Int4, &key.to_string()).expect("an integer");
    hash::shard_index(hash::row_hash(Some(hashed)), SHARD_COUNT)
}

/// The tests name shards by index where a key routes a statement; these are
/// the places of the keys they use.
#[test]
fn the_keys_the_tests_use_land_where_they_say() {
    assert_eq!([1, 2, 3, 5].map(shard_of), [0, 2, 1, 1]);
}

/// One statement planned as each variant. The match lists every variant,
/// so a new one fails to compile until a statement planning it is here.
#[test]
fn every_plan_variant_is_planned() {
    let variant = |plan: &Plan| match plan {
        Plan::Empty => "Empty",
        Plan::Local => "Local",
        Plan::LocalWithClusterData(_) => "LocalWithClusterData",
        Plan::LocalOverShards(_) => "LocalOverShards",
        Plan::Transaction(_) => "Transaction",
        Plan::ClusterFunction(_) => "ClusterFunction",
        Plan::Ddl(_) => "Ddl",
        Plan::Router(_) => "Router",
        Plan::Delegated(_) => "Delegated",
        Plan::KeysMeet(_) => "KeysMeet",
        Plan::MultiShard(_) => "MultiShard",
        Plan::Fallback(_) => "Fallback",
        Plan::Explain(_) => "Explain",
        Plan::InsertSelect(_) => "InsertSelect",
        Plan::MergeThroughCoordinator(_) => "MergeThroughCoordinator",
        Plan::WithLocalRows(_) => "WithLocalRows",
        Plan::Copy(_) => "Copy",
        Plan::SqlPrepare(_) => "SqlPrepare",
        Plan::SqlExecute(_) => "SqlExecute",
        Plan::SqlDeallocate(_) => "SqlDeallocate",
        Plan::Unsupported(_) => "Unsupported",
    };
    for (sql, expected) in [
        ("", "Empty"),
        ("SELECT * FROM elocal", "Local"),
        ("SELECT * FROM citus_stat_activity", "LocalWithClusterData"),
        ("CREATE MATERIALIZED VIEW mv AS SELECT * FROM ea", "LocalOverShards"),
        ("BEGIN", "Transaction"),
        ("SELECT create_reference_table('t')", "ClusterFunction"),
        ("CREATE INDEX ea_v ON ea (v)", "Ddl"),
        ("SELECT * FROM ea WHERE k = 5", "Router"),
        ("SELECT ea_credit(5, 10)", "Delegated"),
        ("SELECT * FROM ea a, eb b WHERE a.k = $1 AND b.k = $2", "KeysMeet"),
        ("SELECT count(*) FROM ea", "MultiShard"),
        ("SELECT *, rank() OVER (ORDER BY v) FROM ea", "Fallback"),
        ("EXPLAIN SELECT count(*) FROM ea", "Explain"),
        ("INSERT INTO ea (k) SELECT id FROM elocal", "InsertSelect"),
        ("MERGE INTO ea USING (VALUES (1, 2)) s(k, v) ON ea.k = s.k WHEN NOT MATCHED THEN INSERT VALUES (s.k, 0, s.v)", "MergeThroughCoordinator"),
        ("DELETE FROM ea WHERE g IN (SELECT id FROM elocal)", "WithLocalRows"),
        ("COPY ea FROM STDIN", "Copy"),
        ("PREPARE q AS SELECT * FROM ea", "SqlPrepare"),
        ("EXECUTE q", "SqlExecute"),
        ("DEALLOCATE q", "SqlDeallocate"),
        ("UPDATE ea SET k = 2 WHERE k = 1", "Unsupported"),
    ] {
        let planned = plan(sql);
        assert_eq!(variant(&planned), expected, "{sql}: planned {planned}");
    }
}
