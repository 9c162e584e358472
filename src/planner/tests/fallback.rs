//! The general fallback: reads no pushdown tier can split run in the
//! coordinator database over the foreign-table stand-ins of the shards,
//! each with the reason the cheaper tiers refused it. Joins of several
//! distributed tables may be broadcast at run time instead: the plan names
//! the candidates.

use crate::planner::{FallbackPlan, Plan};
use std::sync::Arc;

fn fallback(sql: &str) -> Arc<FallbackPlan> {
    planned_as!(sql, Plan::Fallback)
}

/// The names of the tables a broadcast may ship to the others' shards.
fn broadcast_candidates(plan: &FallbackPlan) -> Vec<&str> {
    plan.broadcast_candidates.iter().map(|t| t.name.as_str()).collect()
}

#[test]
fn shapes_no_tier_splits_fall_back_with_their_reason() {
    for (sql, reason, stand_in_sql) in [
        // Windows, ordered aggregates, several DISTINCT values and grouping
        // sets run over shipped columns; a star beside them cannot.
        (
            "SELECT *, rank() OVER (ORDER BY v) FROM ea",
            "cannot split over the shards: window functions across shards (* beside windows or aggregates across shards)",
            "SELECT *, rank() OVER (ORDER BY v) FROM tessera_fallback.dist_1 ea",
        ),
        (
            "WITH m AS (SELECT * FROM ea) SELECT count(*) FROM m",
            "WITH queries over distributed tables are supported only when every part reads one shard group, pinned by its own conditions on the distribution column",
            "WITH m AS (SELECT * FROM tessera_fallback.dist_1 ea) SELECT count(*) FROM m",
        ),
        // The local table stays itself in the coordinator database.
        (
            "SELECT e.k FROM ea e JOIN elocal l ON l.id = e.k",
            "queries that combine distributed tables with the local table \"elocal\" are not supported yet",
            "SELECT e.k FROM tessera_fallback.dist_1 e JOIN elocal l ON l.id = e.k",
        ),
    ] {
        let plan = fallback(sql);
        assert_eq!((plan.reason.as_str(), plan.read.sql.as_str()), (reason, stand_in_sql), "{sql}");
        assert!(broadcast_candidates(&plan).is_empty(), "{sql}: one distributed table, nothing to broadcast");
    }
}

#[test]
fn joins_of_distributed_tables_not_on_co_located_keys_may_be_broadcast() {
    for (sql, reason, candidates) in [
        ("SELECT * FROM ea JOIN ec ON ea.k = ec.k", "joins between distributed tables that are not co-located are not supported yet", ["ea", "ec"]),
        (
            "SELECT * FROM ea JOIN eb ON ea.g = eb.w",
            "joins between distributed tables that are not on their distribution columns are not supported yet",
            ["ea", "eb"],
        ),
    ] {
        let plan = fallback(sql);
        assert_eq!((plan.reason.as_str(), broadcast_candidates(&plan)), (reason, candidates.to_vec()), "{sql}");
    }
    // A subquery not row for row by key is read apart, then shipped.
    let plan = fallback("SELECT count(*) FROM ea WHERE k IN (SELECT max(k) FROM eb GROUP BY w)");
    assert!(plan.reason.starts_with("subqueries over distributed tables are only supported when each reads one shard group"), "{}", plan.reason);
    assert_eq!(broadcast_candidates(&plan), ["ea", "eb"]);
    assert_eq!(
        plan.read.sql,
        "SELECT count(*) FROM tessera_fallback.dist_1 ea WHERE k IN (SELECT max(k) FROM tessera_fallback.dist_2 eb GROUP BY w)"
    );
}

/// The stand-ins hold no transaction's uncommitted writes: a transaction
/// block that wrote reads its own copies of the tables instead.
#[test]
fn a_block_that_wrote_reads_its_own_copies() {
    let plan = fallback("SELECT * FROM ea JOIN ec ON ea.k = ec.k");
    assert_eq!(plan.read.block_sql, "SELECT * FROM pg_temp.tessera_block_1_0 ea JOIN pg_temp.tessera_block_3_0 ec ON ea.k = ec.k");
    assert_eq!(plan.read.tables.iter().map(|t| t.oid).collect::<Vec<_>>(), [1, 3]);
}

#[test]
fn cursors_and_copy_of_a_query_read_through_the_fallback() {
    let cursor = fallback("DECLARE c CURSOR FOR SELECT * FROM ea");
    assert_eq!(cursor.reason, "a cursor over distributed tables");
    // Foreign scans cannot run backward: the cursor keeps its rows.
    assert_eq!(cursor.read.sql, "DECLARE c SCROLL CURSOR FOR SELECT * FROM tessera_fallback.dist_1 ea");
    let copy = fallback("COPY (SELECT * FROM ea) TO STDOUT");
    assert_eq!(copy.read.sql, "COPY (SELECT * FROM tessera_fallback.dist_1 ea) TO STDOUT");
    // The cursor lives in the coordinator database, which fetches and closes it.
    assert!(matches!(super::plan("FETCH 10 FROM c"), Plan::Local));
    assert!(matches!(super::plan("CLOSE c"), Plan::Local));
}

/// Writes to distributed tables never go through the stand-ins, which would
/// bypass the coordinator's transactions: what no tier runs is refused.
#[test]
fn writes_no_tier_runs_are_refused() {
    let refusal = planned_as!("UPDATE ea SET v = ec.z FROM ec WHERE ec.k = ea.g", Plan::Unsupported);
    assert_eq!(refusal.message(), "joins between distributed tables that are not co-located are not supported yet");
}

#[test]
fn correlated_aggregates_are_grouped_for_the_keys_the_outer_rows_ask() {
    // `er.id`, the primary key of a table the outer WHERE restricts alone,
    // joins the grouped subquery with that restriction (TPC-H's Q17).
    let plan = fallback("SELECT count(*) FROM ea, er WHERE er.id = ea.g AND er.name = 'x' AND ea.v < (SELECT avg(eb.w) FROM eb WHERE eb.k = er.id)");
    assert_eq!(
        plan.read.sql,
        "SELECT count(*) FROM tessera_fallback.dist_1 ea CROSS JOIN tessera_fallback.dist_4 er LEFT JOIN (SELECT eb.k AS tessera_key_1, avg(eb.w) AS tessera_value FROM tessera_fallback.dist_2 eb, tessera_fallback.dist_4 er WHERE er.name = 'x' AND eb.k = er.id GROUP BY eb.k) tessera_grouped_1 ON tessera_grouped_1.tessera_key_1 = er.id WHERE er.id = ea.g AND er.name = 'x' AND ea.v < tessera_grouped_1.tessera_value"
    );
    // So does a call of an immutable function (TPC-H Q22's substring).
    let plan =
        fallback("SELECT count(*) FROM ea, er WHERE er.id = ea.g AND lower(er.name) = 'x' AND ea.v < (SELECT avg(eb.w) FROM eb WHERE eb.k = er.id)");
    assert!(plan.read.sql.contains("WHERE lower(er.name) = 'x' AND eb.k = er.id GROUP BY eb.k"), "{}", plan.read.sql);
    // Another call may be volatile, and ea.g is no primary key: neither narrows.
    for sql in [
        "SELECT count(*) FROM ea, er WHERE er.id = ea.g AND er.id < random() * 10 AND ea.v < (SELECT avg(eb.w) FROM eb WHERE eb.k = er.id)",
        "SELECT count(*) FROM ea, er WHERE er.id = ea.g AND ea.v = 3 AND er.id < (SELECT max(eb.w) FROM eb WHERE eb.k = ea.g)",
    ] {
        let plan = fallback(sql);
        assert!(plan.read.sql.contains("GROUP BY eb.k) tessera_grouped_1") && !plan.read.sql.contains("eb.k = "), "{sql}: {}", plan.read.sql);
    }
}
