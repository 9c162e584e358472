//! Utility statements on distributed tables: DDL propagated to every shard
//! (renamed for it), and the plans of DROP, TRUNCATE, LOCK, VACUUM, GRANT,
//! partitions, and statements every node runs.

use crate::planner::{ChosenNames, DdlPlan, Plan};

/// Each shard's statement of a propagated DDL, in shard order (None where
/// the table's worker-side parent passes the change on to the shard).
fn shard_statements(sql: &str) -> Vec<Option<String>> {
    let ddl = planned_as!(sql, Plan::Ddl);
    let DdlPlan::Propagate { table, template, .. } = ddl.as_ref() else { panic!("{sql}: expected a propagated DDL, planned {ddl}") };
    (0..table.shard_count()).map(|i| DdlPlan::shard_sql(table, template, i, &ChosenNames::default()).unwrap()).collect()
}

#[test]
fn an_index_is_made_on_every_shard_under_the_shards_name() {
    assert_eq!(planned_as!("CREATE INDEX ea_v ON ea (v)", Plan::Ddl).to_string(), "propagate to ea");
    assert_eq!(
        shard_statements("CREATE INDEX ea_v ON ea (v)"),
        (0..4).map(|i| Some(format!("CREATE INDEX ea_v_10{i} ON public.ea_10{i} USING btree (v)"))).collect::<Vec<_>>()
    );
    let concurrently = planned_as!("CREATE UNIQUE INDEX CONCURRENTLY ea_kg ON ea (k, g)", Plan::Ddl);
    assert!(concurrently.creates_index_concurrently());
    let unnamed = planned_as!("CREATE INDEX ON ea (g)", Plan::Ddl);
    assert!(unnamed.creates_unnamed_index());
}

#[test]
fn alter_table_reaches_the_shards_or_their_worker_side_parent() {
    // Column changes of a hash table go through its worker-side parent.
    let ddl = planned_as!("ALTER TABLE ea ADD COLUMN extra int", Plan::Ddl);
    let DdlPlan::Propagate { relations, catalog_sql, .. } = ddl.as_ref() else { panic!("planned {ddl}") };
    assert_eq!((relations.parent_sql.as_deref(), catalog_sql.as_deref()), (Some("ALTER TABLE public.ea ADD COLUMN extra int"), None));
    assert_eq!(shard_statements("ALTER TABLE ea ADD COLUMN extra int"), vec![None; 4]);
    // A constraint is each shard's own, named after it.
    assert_eq!(
        shard_statements("ALTER TABLE ea ADD CONSTRAINT ea_g_positive CHECK (g > 0)")[0].as_deref(),
        Some("ALTER TABLE public.ea_100 ADD CONSTRAINT ea_g_positive_100 CHECK (g > 0)")
    );
    assert_eq!(planned_as!("ALTER TABLE ea ADD CHECK (g > 0)", Plan::Ddl).unnamed_constraint_kinds(), ['c']);
    // A reference table's one shard.
    assert_eq!(shard_statements("ALTER TABLE er ADD COLUMN extra int"), [Some("ALTER TABLE public.er_400 ADD COLUMN extra int".to_string())]);
}

#[test]
fn renaming_the_distribution_column_updates_the_catalog() {
    let ddl = planned_as!("ALTER TABLE ea RENAME COLUMN k TO key", Plan::Ddl);
    let DdlPlan::Propagate { catalog_sql, .. } = ddl.as_ref() else { panic!("planned {ddl}") };
    assert_eq!(catalog_sql.as_deref(), Some("SELECT tessera.rename_distribution_column(1, 'key')"));
    assert!(ddl.changes_catalog());
}

#[test]
fn other_utility_statements_name_the_distributed_tables_they_reach() {
    for (sql, shown) in [
        ("DROP TABLE ea, elocal", "drop ea"),
        ("TRUNCATE ea, elocal CASCADE", "truncate ea"),
        ("LOCK TABLE ea IN SHARE MODE", "lock ea"),
        ("ANALYZE ea, elocal", "vacuum ea"),
        ("GRANT SELECT ON ea, eb TO PUBLIC", "grant on ea,eb"),
        ("CREATE TABLE ea_2024 PARTITION OF ea FOR VALUES FROM (1) TO (2)", "add a partition to ea"),
        ("DROP TRIGGER t ON ea", "drop from ea"),
        // Which index is a distributed table's is found out running it.
        ("DROP INDEX ea_v", "drop or rename index"),
        ("CHECKPOINT", "checkpoint every node"),
        ("CREATE ROLE app", "run on every node"),
    ] {
        assert_eq!(planned_as!(sql, Plan::Ddl).to_string(), shown, "{sql}");
    }
}
