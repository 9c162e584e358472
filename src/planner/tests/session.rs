//! Statements about the session and the cluster more than about rows:
//! empty and local ones, transaction control, cluster functions, SQL-level
//! prepared statements, EXPLAIN, calls delegated to a distributed
//! function's node, and statements the coordinator database runs over
//! data the cluster lends it.

use super::{plan, plan_over, shard_of, CatalogBuilder};
use crate::planner::{ClusterFunction, Command, KeyValue, Plan, ShardTarget, TransactionCommand};

#[test]
fn nothing_to_run_and_local_statements() {
    assert!(matches!(plan(""), Plan::Empty));
    assert!(matches!(plan(";"), Plan::Empty));
    for sql in ["SELECT 1", "SELECT * FROM elocal", "EXPLAIN SELECT * FROM elocal", "PREPARE p AS SELECT * FROM elocal"] {
        assert!(matches!(plan(sql), Plan::Local), "{sql}: planned {}", plan(sql));
    }
    // The parser's errors are the coordinator database's to report.
    assert!(matches!(plan("SELEC 1"), Plan::Local));
    // Without distributed tables, a distributed name is just a local one.
    assert!(matches!(plan_over("SELECT * FROM ea", &CatalogBuilder::new().build()), Plan::Local));
}

#[test]
fn transaction_control_is_the_coordinators() {
    for (sql, command) in [
        ("BEGIN ISOLATION LEVEL REPEATABLE READ", TransactionCommand::Begin { sql: "BEGIN ISOLATION LEVEL REPEATABLE READ".into() }),
        ("COMMIT", TransactionCommand::Commit),
        ("ROLLBACK", TransactionCommand::Rollback),
        ("SAVEPOINT s", TransactionCommand::Savepoint("s".into())),
        ("RELEASE SAVEPOINT s", TransactionCommand::Release("s".into())),
        ("ROLLBACK TO SAVEPOINT s", TransactionCommand::RollbackTo("s".into())),
    ] {
        assert_eq!(planned_as!(sql, Plan::Transaction), command, "{sql}");
    }
    let refusal = planned_as!("ROLLBACK AND CHAIN", Plan::Unsupported);
    assert_eq!(refusal.message(), "\"ROLLBACK AND CHAIN\" is not supported through the Tessera coordinator");
}

#[test]
fn cluster_functions_are_carried_out_by_the_coordinator() {
    for (sql, function) in [
        ("SELECT create_distributed_table('t', 'k')", ClusterFunction::CreateDistributedTable),
        ("SELECT rebalance_table_shards()", ClusterFunction::RebalanceTableShards),
        ("SELECT run_command_on_workers('SELECT 1')", ClusterFunction::RunCommandOnWorkers),
    ] {
        assert_eq!(planned_as!(sql, Plan::ClusterFunction).function, function, "{sql}");
    }
}

#[test]
fn sql_prepared_statements_over_distributed_tables_are_the_sessions() {
    let prepare = planned_as!("PREPARE q (int) AS SELECT * FROM ea WHERE k = $1", Plan::SqlPrepare);
    assert_eq!((prepare.name.as_str(), prepare.statement.as_str()), ("q", "SELECT * FROM ea WHERE k = $1"));
    let execute = planned_as!("EXECUTE q(5)", Plan::SqlExecute);
    assert_eq!((execute.name.as_str(), execute.arguments.as_slice()), ("q", &["5".to_string()][..]));
    assert_eq!(planned_as!("DEALLOCATE q", Plan::SqlDeallocate).as_deref(), Some("q"));
    assert_eq!(planned_as!("DEALLOCATE ALL", Plan::SqlDeallocate), None);
    // A statement no tier runs is refused when prepared, not when executed.
    let refusal = planned_as!("PREPARE r AS UPDATE ea SET k = 2 WHERE k = 1", Plan::Unsupported);
    assert_eq!(refusal.message(), "modifying the partition value of rows is not allowed");
}

#[test]
fn explain_shows_the_plan_of_the_statement_it_explains() {
    for (sql, shown) in [
        ("EXPLAIN SELECT * FROM ea WHERE k = 5", format!("Router(Select shard {})", shard_of(5))),
        ("EXPLAIN (COSTS OFF) SELECT count(*) FROM ea", "MultiShard(Select, 4 tasks, SELECT tessera_agg_000 AS count FROM tessera_partials)".into()),
        ("EXPLAIN UPDATE ea SET v = r.rate FROM elocal r WHERE r.id = ea.k", "WithLocalRows(with the rows of elocal)".into()),
    ] {
        assert_eq!(planned_as!(sql, Plan::Explain).inner.to_string(), shown, "{sql}");
    }
    assert!(planned_as!("EXPLAIN ANALYZE SELECT count(*) FROM ea", Plan::Explain).analyze());
    let json = planned_as!("EXPLAIN (ANALYZE, FORMAT JSON) SELECT count(*) FROM ea", Plan::Explain);
    assert!(json.json());
    assert_eq!(json.explain_sql("SELECT 1"), "EXPLAIN (ANALYZE, FORMAT json) SELECT 1");
    for (sql, refusal) in [
        ("EXPLAIN (FORMAT YAML) SELECT count(*) FROM ea", "EXPLAIN of distributed statements supports FORMAT TEXT and FORMAT JSON only"),
        (
            "EXPLAIN ANALYZE INSERT INTO eb (k, w) SELECT g, count(*) FROM ea GROUP BY g",
            "EXPLAIN ANALYZE of an INSERT … SELECT that passes rows through the coordinator is not supported yet",
        ),
        // Its query runs in the coordinator database, over lent shards.
        ("EXPLAIN CREATE TABLE t AS SELECT * FROM ea", "EXPLAIN of this statement is not supported through the Tessera coordinator"),
    ] {
        assert_eq!(planned_as!(sql, Plan::Unsupported).message(), refusal, "{sql}");
    }
}

/// A call of a distributed function goes whole to the node of its
/// distribution argument's shard; the plan keeps what runs otherwise.
#[test]
fn calls_of_distributed_functions_are_delegated_by_their_argument() {
    for (sql, key) in [
        ("SELECT ea_credit(5, 10)", KeyValue::Literal { text: "5".into(), type_oid: 23, cast_to_key: false }),
        ("SELECT ea_credit($1, 10)", KeyValue::Param(0)),
        ("CALL ea_credit(5, 10)", KeyValue::Literal { text: "5".into(), type_oid: 23, cast_to_key: false }),
    ] {
        let delegated = planned_as!(sql, Plan::Delegated);
        assert_eq!((delegated.call.command, &delegated.call.target), (Command::WholeOnWorker, &ShardTarget::Key(key)), "{sql}");
        assert_eq!(delegated.call.anchor.as_ref().map(|t| t.name.as_str()), Some("ea"));
        assert!(delegated.copy.is_some(), "{sql}: a PL/pgSQL function's per-shard copy");
        assert!(matches!(delegated.otherwise, Plan::Local), "{sql}");
    }
    // A NULL argument picks no shard.
    assert!(matches!(plan("SELECT ea_credit(NULL, 10)"), Plan::Local));
}

#[test]
fn the_coordinator_database_runs_some_statements_over_cluster_data() {
    let needs = planned_as!("SELECT * FROM citus_stat_activity", Plan::LocalWithClusterData);
    assert!(needs.activity && !needs.sizes);
    // Stored query results: the shells lend the shards' rows to the query.
    for (sql, statement) in [
        ("CREATE MATERIALIZED VIEW mv AS SELECT * FROM ea JOIN ec USING (k)", "CREATE MATERIALIZED VIEW"),
        ("CREATE TABLE t2 AS SELECT * FROM ea", "CREATE TABLE AS"),
        ("SELECT * INTO t3 FROM ea", "SELECT INTO"),
    ] {
        let lent = planned_as!(sql, Plan::LocalOverShards);
        assert_eq!((lent.statement, lent.reader.as_str()), (statement, "current_user"), "{sql}");
    }
    assert_eq!(planned_as!("CREATE MATERIALIZED VIEW mv AS SELECT * FROM ea JOIN ec USING (k)", Plan::LocalOverShards).tables, [1, 3]);
}
