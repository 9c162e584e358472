//! Unit tests of the planner as a whole: SQL text and an in-memory catalog
//! in, a `Plan` out, no server anywhere. Each file covers one planner
//! concern; this one holds the catalog they all plan against.

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

use super::{plan_query, Plan};
use crate::connection::ServerAddr;
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
    distribution: Option<(usize, String)>,
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
            distribution: Some((argument, colocated_with.into())),
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
            let distribution = spec.distribution.map(|(argument, table)| {
                (argument, catalog.table("public", &table).unwrap_or_else(|| panic!("{table} is not in the catalog")).clone())
            });
            let signature = format!("public.{}({})", spec.name, vec!["integer"; spec.arg_names.len()].join(", "));
            catalog.add_function_for_tests(Arc::new(DistributedFunction {
                schema: "public".into(),
                name: spec.name,
                arg_names: spec.arg_names,
                defaults: 0,
                distribution,
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
/// keyed by a serial column. `elocal` and any other name is a local table.
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
        .function("ea_credit", &["key", "amount"], 0, "ea")
        .aggregates(&["count", "sum", "avg", "min", "max", "bool_and", "string_agg", "percentile_cont", "rank", "row_number"])
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
