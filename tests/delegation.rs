//! Calls of distributed functions (`create_distributed_function`) run on
//! the node holding their distribution argument's shard: each execution of
//! a prepared call decides anew from its bound value.

mod common;
use common::{connect_as, placement_ports, shard_of_int4, sqlstate, text_rows, TestCluster};

async fn answer(c: &tokio_postgres::Client, sql: &str) -> String {
    text_rows(c, sql).await[0][0].clone().unwrap_or_default()
}

#[tokio::test]
async fn calls_run_on_the_node_of_their_argument() {
    let cluster = TestCluster::start(2);
    let c = cluster.connect().await;
    c.batch_execute(
        "CREATE TABLE dl_t (id int PRIMARY KEY); SELECT create_distributed_table('dl_t', 'id');
         CREATE FUNCTION dl_where(k int) RETURNS int LANGUAGE sql AS $$ SELECT current_setting('port')::int $$;
         SELECT create_distributed_function('dl_where(int)', 'k', colocate_with => 'dl_t');",
    )
    .await
    .unwrap();
    let ports = placement_ports(&c, "dl_t").await;
    let node_of = |id: i32| ports[shard_of_int4(id, ports.len() as u32)].to_string();
    let coordinator_db = cluster.cluster.state.coordinator_db_port.to_string();
    let call = c.prepare("SELECT dl_where($1)").await.unwrap();
    for id in 1..=30 {
        assert_eq!(answer(&c, &format!("SELECT dl_where({id})")).await, node_of(id), "key {id}");
        // Every execution of the one prepared call goes where its value says.
        let bound: i32 = c.query_one(&call, &[&id]).await.unwrap().get(0);
        assert_eq!(bound.to_string(), node_of(id), "key {id}, bound");
    }
    let plan: Vec<String> = text_rows(&c, "EXPLAIN SELECT dl_where(7)").await.into_iter().map(|r| r[0].clone().unwrap_or_default()).collect();
    assert!(plan[0].contains("Delegated Function Call") && plan.iter().any(|l| l.contains(&format!("port={}", node_of(7)))), "{plan:?}");
    // Not delegated: in a block (the function reaches no distributed
    // table, so it runs in the coordinator database), or when switched off.
    c.batch_execute("BEGIN").await.unwrap();
    assert_eq!(answer(&c, "SELECT dl_where(7)").await, coordinator_db);
    c.batch_execute("COMMIT; SET citus.enable_function_delegation = off").await.unwrap();
    assert_eq!(answer(&c, "SELECT dl_where(7)").await, coordinator_db);
    c.batch_execute("RESET citus.enable_function_delegation").await.unwrap();
    assert_eq!(answer(&c, "SELECT dl_where(7)").await, node_of(7));
    // force_delegation: in blocks too.
    c.batch_execute("SELECT create_distributed_function('dl_where(int)', 'k', colocate_with => 'dl_t', force_delegation => true)").await.unwrap();
    c.batch_execute("BEGIN").await.unwrap();
    assert_eq!(answer(&c, "SELECT dl_where(7)").await, node_of(7));
    c.batch_execute("COMMIT").await.unwrap();
    assert_eq!(
        text_rows(&c, "SELECT type, object_names::text, object_args::text, distribution_argument_index, force_delegation FROM pg_dist_object").await,
        vec![vec![Some("function".into()), Some("{public,dl_where}".into()), Some("{integer}".into()), Some("0".into()), Some("t".into())]]
    );
    c.batch_execute("DROP FUNCTION dl_where(int)").await.unwrap();
    assert_eq!(answer(&c, "SELECT count(*) FROM pg_dist_object").await, "0");
}

#[tokio::test]
async fn distributing_a_function_is_checked() {
    let cluster = TestCluster::start(2);
    let c = cluster.connect().await;
    c.batch_execute(
        "CREATE TABLE dl_k (id int PRIMARY KEY); SELECT create_distributed_table('dl_k', 'id');
         CREATE TABLE dl_local (id int);
         CREATE FUNCTION dl_f(k int, label text) RETURNS int LANGUAGE sql AS $$ SELECT k $$;
         CREATE ROLE dl_other LOGIN; GRANT USAGE ON SCHEMA public TO dl_other;",
    )
    .await
    .unwrap();
    let cases = [
        ("SELECT create_distributed_function('dl_f(int,text)', 'nope', colocate_with => 'dl_k')", "42602"),
        ("SELECT create_distributed_function('dl_f(int,text)', '$3', colocate_with => 'dl_k')", "42602"),
        ("SELECT create_distributed_function('dl_f(int,text)', 'label', colocate_with => 'dl_k')", "0A000"),
        ("SELECT create_distributed_function('dl_f(int,text)', 'k', colocate_with => 'dl_local')", "0A000"),
        ("SELECT create_distributed_function('dl_f(int,text)', 'label')", "0A000"),
    ];
    for (sql, code) in cases {
        let e = c.batch_execute(sql).await.unwrap_err();
        assert_eq!(sqlstate(&e), code, "{sql}: {e}");
    }
    let other = connect_as(cluster.port, "dl_other").await;
    let e = other.batch_execute("SELECT create_distributed_function('dl_f(int,text)', 'k')").await.unwrap_err();
    assert_eq!(sqlstate(&e), "42501", "{e}");
    c.batch_execute("SELECT create_distributed_function('dl_f(int,text)', '$1')").await.unwrap();
    assert_eq!(answer(&c, "SELECT distribution_argument_index::text || ' ' || colocationid::text FROM pg_dist_object").await, answer(&c, "SELECT '0 ' || colocationid FROM pg_dist_partition WHERE logicalrelid = 'dl_k'::regclass").await);
    assert_eq!(answer(&other, "SELECT dl_f(5, 'x')").await, "5");
}

/// A delegated call is one statement on the worker holding its shard and
/// nothing anywhere else: the servers' own statement logs count them.
#[tokio::test]
async fn a_delegated_call_is_one_statement_on_one_worker() {
    let cluster = TestCluster::start(2);
    let c = cluster.connect().await;
    c.batch_execute(
        "CREATE TABLE dl_r (id int PRIMARY KEY, v int); SELECT create_distributed_table('dl_r', 'id'); INSERT INTO dl_r SELECT g, 0 FROM generate_series(1, 100) g;
         CREATE FUNCTION dl_bump(k int) RETURNS int LANGUAGE plpgsql AS $$
         DECLARE bumped int;
         BEGIN
             UPDATE dl_r SET v = v + 1 WHERE id = k RETURNING v INTO bumped;
             RETURN bumped;
         END $$;
         SELECT create_distributed_function('dl_bump(int)', 'k', colocate_with => 'dl_r');",
    )
    .await
    .unwrap();
    let ports = placement_ports(&c, "dl_r").await;
    let target = ports[0];
    let keys: Vec<i32> = (1..=100).filter(|id| ports[shard_of_int4(*id, ports.len() as u32)] == target).take(10).collect();
    let call = c.prepare("SELECT dl_bump($1)").await.unwrap();
    // The first call reads the session's settings and prepares the statement.
    assert_eq!(c.query_one(&call, &[&keys[0]]).await.unwrap().get::<_, i32>(0), 1);
    let mut logs = vec![(cluster.cluster.state.coordinator_db_port, cluster.cluster.coordinator_db().data_dir.join("server.log"))];
    logs.extend(cluster.workers().iter().map(|w| (w.port, w.data_dir.join("server.log"))));
    for (port, _) in &logs {
        let server = common::connect(*port).await;
        server.batch_execute("ALTER SYSTEM SET log_statement = 'all'").await.unwrap();
        server.batch_execute("SELECT pg_reload_conf()").await.unwrap();
    }
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    let before: Vec<usize> = logs.iter().map(|(_, path)| std::fs::read_to_string(path).unwrap_or_default().len()).collect();
    for key in &keys[1..] {
        assert_eq!(c.query_one(&call, &[key]).await.unwrap().get::<_, i32>(0), 1, "key {key}");
    }
    for ((port, path), start) in logs.iter().zip(before) {
        let text = std::fs::read_to_string(path).unwrap();
        let added = &text[start..];
        let calls = added.lines().filter(|l| l.contains("dl_bump(")).count();
        let settings = added.lines().filter(|l| l.contains("set_config") || l.contains("RESET ALL") || l.contains("current_setting")).count();
        let expected = if *port == target as u16 { keys.len() - 1 } else { 0 };
        assert_eq!((calls, settings), (expected, 0), "statements logged by the server on port {port}:\n{added}");
    }
}
