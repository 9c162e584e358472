//! The multi-shard tier: a query over co-located tables (and reference
//! tables) joined on their keys but not pinned to one shard group runs on
//! every shard group; the coordinator database combines what the shards
//! computed, or the rows are concatenated when each group's are final.

use super::SHARD_COUNT;
use crate::planner::{Command, MultiShardPlan, Plan};

/// The plan's tier line (as `Plan`'s Display prints it) and the statement
/// shard 0 runs, in which the others differ only by their shards' names.
fn planned(sql: &str) -> (String, String) {
    let multi: std::sync::Arc<MultiShardPlan> = planned_as!(sql, Plan::MultiShard);
    assert_eq!(multi.anchor.shard_count(), SHARD_COUNT, "{sql}: one task per shard group");
    (multi.to_string(), multi.template.sql_for_shard(0).unwrap())
}

#[test]
fn aggregates_are_computed_per_shard_and_combined() {
    assert_eq!(
        planned("SELECT count(*), sum(v) FROM ea"),
        (
            "Select, 4 tasks, SELECT tessera_agg_000 AS count, tessera_agg_001 AS sum FROM tessera_partials".into(),
            "SELECT count(*) AS tessera_p_000, sum(v) AS tessera_p_001 FROM public.ea_100 ea".into()
        )
    );
    // avg from a sum and a count per shard.
    assert_eq!(
        planned("SELECT avg(v), min(v), max(v), bool_and(v > 0) FROM ea"),
        (
            "Select, 4 tasks, SELECT tessera_agg_000 AS avg, tessera_agg_001 AS min, tessera_agg_002 AS max, tessera_agg_003 AS bool_and FROM tessera_partials".into(),
            "SELECT sum(v) AS tessera_p_000, count(v) AS tessera_p_001, min(v) AS tessera_p_002, max(v) AS tessera_p_003, bool_and(v > 0) AS tessera_p_004 FROM public.ea_100 ea".into()
        )
    );
}

#[test]
fn variances_take_the_partial_form_their_input_type_allows() {
    let worker_sql = |sql: &str| planned(sql).1;
    // Float input: PostgreSQL's own float8 state per shard.
    assert_eq!(
        worker_sql("SELECT stddev(v::float8) FROM ea"),
        "SELECT count(v::float8) AS tessera_p_000, sum(v::float8) AS tessera_p_001, var_pop(v::float8) AS tessera_p_002 FROM public.ea_100 ea"
    );
    let sql = worker_sql("SELECT stddev(v::float8 * 2 + 1.5) FROM ea");
    assert!(sql.contains("var_pop((v::float8 * 2) + 1.5)"), "{sql}");
    // int4 input: exact sums of squares in int8.
    assert_eq!(
        worker_sql("SELECT var_pop(v::int4) FROM ea"),
        "SELECT sum(v::int4) AS tessera_p_000, count(v::int4) AS tessera_p_001, sum(v::int4::bigint) AS tessera_p_002, \
         sum(v::int4::bigint * v::int4::bigint) AS tessera_p_003 FROM public.ea_100 ea"
    );
    // Of a type the catalog does not tell: exact numeric sums.
    assert!(worker_sql("SELECT variance(v) FROM ea").contains("sum(v::numeric * v::numeric)"));
}

#[test]
fn groups_across_shards_are_merged_by_the_combine() {
    assert_eq!(
        planned("SELECT g, count(*), avg(v) FROM ea GROUP BY g HAVING sum(v) > 1 ORDER BY 3 DESC LIMIT 2"),
        (
            "Select, 4 tasks, SELECT tessera_p_000 AS g, tessera_agg_000 AS count, tessera_agg_001 AS avg FROM tessera_partials GROUP BY tessera_p_000 HAVING tessera_agg_002 > 1 ORDER BY 3 DESC LIMIT 2".into(),
            "SELECT g AS tessera_p_000, count(*) AS tessera_p_001, sum(v) AS tessera_p_002, count(v) AS tessera_p_003, sum(v) AS tessera_p_004 FROM public.ea_100 ea GROUP BY g".into()
        )
    );
}

/// Grouped or partitioned by the distribution column, each group lives in
/// one shard group: its rows are final there, however heavy the aggregate.
#[test]
fn groups_and_windows_by_the_key_are_pushed_down_whole() {
    for sql in ["SELECT k, count(*) FROM ea GROUP BY k", "SELECT k, rank() OVER (PARTITION BY k ORDER BY v) FROM ea"] {
        let (tier, shard_sql) = planned(sql);
        assert_eq!(tier, "Select, 4 tasks, concatenate", "{sql}");
        assert_eq!(shard_sql, sql.replace("FROM ea", "FROM public.ea_100 ea"));
    }
    // An ordered-set aggregate too; the primary key's table may have its
    // other columns grouped along (tests of planner/group_keys.rs).
    let (tier, shard_sql) = planned("SELECT k, percentile_cont(0.5) WITHIN GROUP (ORDER BY v) FROM ea GROUP BY k");
    assert_eq!(tier, "Select, 4 tasks, concatenate");
    assert!(shard_sql.starts_with("SELECT k, percentile_cont(0.5) WITHIN GROUP (ORDER BY v) FROM public.ea_100 ea GROUP BY k"), "{shard_sql}");
}

#[test]
fn distinct_aggregates_of_one_value_run_in_two_phases() {
    // Each shard gives its distinct values; the combine counts them.
    assert_eq!(
        planned("SELECT count(DISTINCT g) FROM ea"),
        (
            "Select, 4 tasks, SELECT count(DISTINCT tessera_p_000) AS count FROM tessera_partials".into(),
            "SELECT g AS tessera_p_000 FROM public.ea_100 ea GROUP BY g".into()
        )
    );
    assert_eq!(
        planned("SELECT DISTINCT g FROM ea"),
        ("Select, 4 tasks, SELECT DISTINCT tessera_visible_columns FROM tessera_partials".into(), "SELECT DISTINCT g FROM public.ea_100 ea".into())
    );
}

#[test]
fn distinct_aggregates_of_one_other_column_may_move_the_rows() {
    let distinct_column = |sql: &str| {
        let multi: std::sync::Arc<MultiShardPlan> = planned_as!(sql, Plan::MultiShard);
        match &multi.combine {
            crate::planner::Combine::Query(query) => query.distinct_column.clone(),
            other => panic!("{sql}: {other:?}"),
        }
    };
    assert_eq!(distinct_column("SELECT count(DISTINCT g) FROM ea"), Some("g".to_string()));
    assert_eq!(distinct_column("SELECT v, count(DISTINCT g), sum(DISTINCT g) FROM ea GROUP BY v"), Some("g".to_string()));
    // A partial aggregate, another DISTINCT value (here the key's), a join.
    assert_eq!(distinct_column("SELECT count(DISTINCT g), count(*) FROM ea"), None);
    assert_eq!(distinct_column("SELECT count(DISTINCT g), count(DISTINCT k) FROM ea"), None);
    assert_eq!(distinct_column("SELECT count(DISTINCT ea.g) FROM ea JOIN eb ON eb.k = ea.k"), None);
}

#[test]
fn distinct_counts_of_other_values_may_be_estimated() {
    use crate::planner::approximate_distinct::{approximate_counts, hll_log2m};
    let counts = |sql: &str| {
        let multi: std::sync::Arc<MultiShardPlan> = planned_as!(sql, Plan::MultiShard);
        match &multi.combine {
            crate::planner::Combine::Query(query) => (query.approximable_counts.clone(), query.fallback.clone()),
            other => panic!("{sql}: {other:?}"),
        }
    };
    // Counts of the key are exact already; other DISTINCT aggregates stay as they are.
    let sql = "SELECT g, count(DISTINCT v), count(DISTINCT k), sum(DISTINCT v) FROM ea GROUP BY g HAVING count(DISTINCT v) > 1";
    let (found, fallback) = counts(sql);
    assert_eq!(found, vec!["count(DISTINCT v)".to_string()]);
    assert_eq!(counts("SELECT count(DISTINCT k) FROM ea").0, Vec::<String>::new());
    // Grouped by the key, each group's count is whole, ordered and limited or not.
    assert_eq!(counts("SELECT k, count(DISTINCT v) FROM ea GROUP BY k ORDER BY 2 DESC LIMIT 5").0, Vec::<String>::new());
    // Two values' counts, a FILTER kept: after the rewrite no DISTINCT is
    // left but the key's, and each shard builds HyperLogLogs.
    let sql = "SELECT count(DISTINCT v) FILTER (WHERE k > 2), count(DISTINCT g) + 1, count(DISTINCT k) FROM ea";
    let (found, fallback2) = counts(sql);
    assert_eq!(found.len(), 2, "{found:?}");
    let exact = fallback2.expect("a statement to plan again");
    let estimated = approximate_counts(&exact.statement, &found, 12).unwrap();
    let multi: std::sync::Arc<MultiShardPlan> = match crate::planner::plan_tree(exact.version, estimated, &super::catalog()) {
        Plan::MultiShard(multi) => multi,
        other => panic!("{other}"),
    };
    assert_eq!(
        multi.template.sql_for_shard(0).unwrap(),
        "SELECT hll_add_agg(hll_hash_any(v), 12) FILTER (WHERE k > 2) AS tessera_p_000, hll_add_agg(hll_hash_any(g), 12) AS tessera_p_001, \
         count(DISTINCT k) AS tessera_p_002 FROM public.ea_100 ea"
    );
    assert_eq!(
        multi.to_string(),
        "Select, 4 tasks, SELECT COALESCE(hll_cardinality(tessera_agg_000)::bigint, 0) AS count, COALESCE(hll_cardinality(tessera_agg_001)::bigint, 0) + 1 AS \"?column?\", \
         tessera_agg_002 AS count FROM tessera_partials"
    );
    assert!(fallback.is_some());
    // About 1.04/sqrt(2^log2m) standard error, within hll's sizes.
    assert_eq!((hll_log2m(0.005), hll_log2m(0.0001), hll_log2m(0.5), hll_log2m(1.0)), (15, 17, 4, 4));
}

#[test]
fn each_shard_sends_its_own_top_rows() {
    // With OFFSET, a shard's top rows must cover the skipped ones too.
    assert_eq!(
        planned("SELECT k, v FROM ea ORDER BY v DESC, k LIMIT 5 OFFSET 1"),
        (
            "Select, 4 tasks, SELECT tessera_visible_columns FROM tessera_partials ORDER BY 2 DESC, 1 LIMIT 5 OFFSET 1".into(),
            "SELECT k, v FROM public.ea_100 ea ORDER BY v DESC, k LIMIT 5 + 1".into()
        )
    );
    // A sort key the output hides travels as a hidden column.
    assert_eq!(
        planned("SELECT * FROM ea ORDER BY k LIMIT 3"),
        (
            "Select, 4 tasks, SELECT tessera_visible_columns FROM tessera_partials ORDER BY tessera_s_000 LIMIT 3".into(),
            "SELECT *, k AS tessera_s_000 FROM public.ea_100 ea ORDER BY k LIMIT 3".into()
        )
    );
}

#[test]
fn co_located_and_reference_joins_run_per_shard_group() {
    for (sql, shard_sql) in [
        ("SELECT ea.k, eb.w FROM ea JOIN eb ON ea.k = eb.k", "SELECT ea.k, eb.w FROM public.ea_100 ea JOIN public.eb_200 eb ON ea.k = eb.k"),
        ("SELECT ea.k, er.name FROM ea JOIN er ON er.id = ea.g", "SELECT ea.k, er.name FROM public.ea_100 ea JOIN public.er_400 er ON er.id = ea.g"),
        // A subquery joined on the key to the query around it goes along.
        (
            "SELECT ea.k FROM ea WHERE EXISTS (SELECT 1 FROM eb WHERE eb.k = ea.k AND eb.w > 1)",
            "SELECT ea.k FROM public.ea_100 ea WHERE EXISTS (SELECT 1 FROM public.eb_200 eb WHERE eb.k = ea.k AND eb.w > 1)",
        ),
        // An outer join keeping the rows of a distributed table's join with
        // a reference table keeps each once: they are in one shard group.
        (
            "SELECT ea.k, x.name FROM ea JOIN er ON er.id = ea.g LEFT JOIN er x ON x.id = ea.v",
            "SELECT ea.k, x.name FROM public.ea_100 ea JOIN public.er_400 er ON er.id = ea.g LEFT JOIN public.er_400 x ON x.id = ea.v",
        ),
        // Also when the columns are not qualified, but no table inside has
        // the outer one (TPC-H's Q4).
        (
            "SELECT o_note FROM eo WHERE EXISTS (SELECT 1 FROM el WHERE l_key = o_key AND l_qty > 1)",
            "SELECT o_note FROM public.eo_700 eo WHERE EXISTS (SELECT 1 FROM public.el_800 el WHERE l_key = o_key AND l_qty > 1)",
        ),
    ] {
        assert_eq!(planned(sql), ("Select, 4 tasks, concatenate".into(), shard_sql.into()), "{sql}");
    }
}

#[test]
fn unpinned_writes_run_on_every_shard_group() {
    for (sql, command, shard_sql) in [
        ("UPDATE ea SET v = v + 1", Command::Update, "UPDATE public.ea_100 ea SET v = v + 1"),
        ("DELETE FROM ea WHERE v > 10", Command::Delete, "DELETE FROM public.ea_100 ea WHERE v > 10"),
        (
            "UPDATE ea SET v = eb.w FROM eb WHERE eb.k = ea.k",
            Command::Update,
            "UPDATE public.ea_100 ea SET v = eb.w FROM public.eb_200 eb WHERE eb.k = ea.k",
        ),
        (
            "DELETE FROM ea USING er WHERE er.id = ea.g AND er.name = 'x'",
            Command::Delete,
            "DELETE FROM public.ea_100 ea USING public.er_400 er WHERE er.id = ea.g AND er.name = 'x'",
        ),
    ] {
        assert_eq!(planned(sql), (format!("{command:?}, 4 tasks, concatenate"), shard_sql.into()), "{sql}");
    }
}

/// A key compared with a value of another type is not hashed when planning
/// (the comparison converts it first): the query reads every shard group
/// rather than risk routing to the wrong one.
#[test]
fn a_key_compared_across_types_reads_every_shard() {
    assert_eq!(planned("SELECT * FROM ea WHERE k = 5::bigint").0, "Select, 4 tasks, concatenate");
}

#[test]
fn a_from_subquery_each_shard_group_computes_runs_with_the_statement() {
    // TPC-H's Q7-Q9 shape: the join is written as a FROM subquery.
    assert_eq!(
        planned("SELECT note, sum(qty) FROM (SELECT o_note AS note, l_qty AS qty FROM eo, el, er WHERE o_key = l_key AND er.id = l_qty) AS s GROUP BY note ORDER BY note"),
        (
            "Select, 4 tasks, SELECT tessera_p_000 AS note, tessera_agg_000 AS sum FROM tessera_partials GROUP BY tessera_p_000 ORDER BY note".into(),
            "SELECT note AS tessera_p_000, sum(qty) AS tessera_p_001 FROM (SELECT o_note AS note, l_qty AS qty FROM public.eo_700 eo, public.el_800 el, public.er_400 er WHERE o_key = l_key AND er.id = l_qty) s GROUP BY note".into()
        )
    );
    // Subqueries whose rows the shard groups cannot compute alone: grouped,
    // limited, ordered, not joined on the keys, not co-located, or with the only
    // distributed tables outside them.
    for sql in [
        "SELECT count(*) FROM (SELECT o_note FROM eo GROUP BY o_note) s",
        "SELECT count(*) FROM (SELECT o_note FROM eo ORDER BY o_note LIMIT 3) s",
        "SELECT * FROM (SELECT o_note FROM eo ORDER BY o_note) s",
        "SELECT count(*) FROM (SELECT o_note FROM eo, el WHERE o_note = l_qty::text) s",
        "SELECT count(*) FROM (SELECT ea.v FROM ea JOIN ec ON ea.k = ec.k) s",
        "SELECT count(*) FROM (SELECT o_note FROM eo) s, ea",
        "SELECT count(*) FROM (SELECT o_note FROM eo) s, (SELECT l_qty FROM el) t",
        "SELECT count(*) FROM (SELECT o_note FROM eo WHERE o_key IN (SELECT l_key FROM el)) s",
        "SELECT count(*) FROM er LEFT JOIN (SELECT o_key FROM eo) s ON s.o_key = er.id",
    ] {
        planned_as!(sql, Plan::Fallback);
    }
}

#[test]
fn a_task_reads_several_shard_groups_through_a_union_of_their_shards() {
    let merged = |sql: &str| {
        let multi: std::sync::Arc<MultiShardPlan> = planned_as!(sql, Plan::MultiShard);
        multi.template.merged_read().map(|read| multi.template.sql_for_shards(&read, &[0, 2]).unwrap())
    };
    // The distributed table gives only the columns the statement names;
    // the reference table stays its one shard.
    assert_eq!(
        merged("SELECT er.name, sum(ea.v) FROM ea JOIN er ON er.id = ea.g GROUP BY er.name").as_deref(),
        Some(
            "SELECT er.name AS tessera_p_000, sum(ea.v) AS tessera_p_001 FROM (SELECT g, v FROM public.ea_100 UNION ALL SELECT g, v FROM public.ea_102) ea \
             JOIN public.er_400 er ON er.id = ea.g GROUP BY er.name"
        )
    );
    // Stars and USING columns count.
    assert_eq!(
        merged("SELECT * FROM ea JOIN er ON er.id = ea.g WHERE ea.g > 1").as_deref(),
        Some("SELECT * FROM (SELECT k, g, v FROM public.ea_100 UNION ALL SELECT k, g, v FROM public.ea_102) ea JOIN public.er_400 er ON er.id = ea.g WHERE ea.g > 1")
    );
    assert_eq!(
        merged("SELECT count(*) FROM ea e JOIN (SELECT id AS g FROM er) r USING (g)").as_deref(),
        Some("SELECT count(*) AS tessera_p_000 FROM (SELECT g FROM public.ea_100 UNION ALL SELECT g FROM public.ea_102) e JOIN (SELECT id AS g FROM public.er_400 er) r USING (g)")
    );
    // Two co-located tables joined on their distribution columns: each arm
    // joins one group's pair of shards, and the second table's columns are
    // named through the first's (renamed where both have one of that name).
    assert_eq!(
        merged("SELECT er.name, sum(l_qty) FROM eo, el, er WHERE o_key = l_key AND er.id = l_qty GROUP BY er.name").as_deref(),
        Some(
            "SELECT er.name AS tessera_p_000, sum(l_qty) AS tessera_p_001 FROM (SELECT tessera_first.o_key, tessera_second.l_key AS l_key, tessera_second.l_qty AS l_qty \
             FROM public.eo_700 tessera_first JOIN public.el_800 tessera_second ON tessera_first.o_key = tessera_second.l_key UNION ALL \
             SELECT tessera_first.o_key, tessera_second.l_key AS l_key, tessera_second.l_qty AS l_qty \
             FROM public.eo_702 tessera_first JOIN public.el_802 tessera_second ON tessera_first.o_key = tessera_second.l_key) eo, \
             public.er_400 er WHERE o_key = l_key AND er.id = l_qty GROUP BY er.name"
        )
    );
    assert_eq!(
        merged("SELECT count(*) FROM ea a, er, eb b WHERE b.k = a.k AND er.id = b.w AND a.v > 3").as_deref(),
        Some(
            "SELECT count(*) AS tessera_p_000 FROM (SELECT tessera_first.k, tessera_first.v, tessera_second.k AS tessera_pair_k, tessera_second.w AS w \
             FROM public.ea_100 tessera_first JOIN public.eb_200 tessera_second ON tessera_first.k = tessera_second.k UNION ALL \
             SELECT tessera_first.k, tessera_first.v, tessera_second.k AS tessera_pair_k, tessera_second.w AS w \
             FROM public.ea_102 tessera_first JOIN public.eb_202 tessera_second ON tessera_first.k = tessera_second.k) a, \
             public.er_400 er WHERE a.tessera_pair_k = a.k AND er.id = a.w AND a.v > 3"
        )
    );
    // A table alone, two distributed tables not joined so (or where a
    // subquery could name either), and what only a table has: a statement
    // per shard group.
    for sql in [
        "SELECT count(*) FROM ea",
        "SELECT count(*) FROM ea JOIN eb ON eb.k = ea.k",
        "SELECT count(*) FROM ea JOIN eb ON eb.k = ea.k JOIN er ON er.id = eb.w",
        "SELECT count(*) FROM ea, eb, er WHERE eb.k = ea.k AND er.id = ea.g AND ea.v > (SELECT 1)",
        "SELECT * FROM eo, el, er WHERE o_key = l_key AND er.id = l_qty",
        "SELECT eo.*, l_qty FROM eo, el, er WHERE o_key = l_key AND er.id = l_qty",
        "SELECT count(*) FROM ea a WHERE EXISTS (SELECT 1 FROM ea b WHERE b.k = a.k AND b.v > a.v)",
        "SELECT count(*) FROM ea WHERE ctid IS NOT NULL",
        "SELECT tableoid, k FROM ea",
        "SELECT count(*) FROM ea NATURAL JOIN er",
        "SELECT x.a FROM ea AS x(a, b, c)",
        "SELECT count(*) FROM ONLY ea",
    ] {
        assert_eq!(merged(sql), None, "{sql}");
    }
}
