//! Calls of distributed functions (`create_distributed_function`) run on
//! the node holding their distribution argument's shard: each execution of
//! a prepared call decides anew from its bound value.

mod common;
use common::{connect_as, placement_ports, shard_of_int4, sqlstate, text_rows, TestCluster};
use tessera::config::Fault;

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
    // By name too, and with an argument left to its default.
    c.batch_execute(
        "CREATE FUNCTION dl_where_named(k int, label text DEFAULT 'x') RETURNS int LANGUAGE sql AS $$ SELECT current_setting('port')::int $$;
         SELECT create_distributed_function('dl_where_named(int,text)', 'k', colocate_with => 'dl_t');",
    )
    .await
    .unwrap();
    for id in [3, 8, 21] {
        assert_eq!(answer(&c, &format!("SELECT dl_where_named(label => 'y', k => {id})")).await, node_of(id), "key {id}, by name");
        assert_eq!(answer(&c, &format!("SELECT dl_where_named({id})")).await, node_of(id), "key {id}, default label");
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
        text_rows(&c, "SELECT type, object_names::text, object_args::text, distribution_argument_index, force_delegation FROM pg_dist_object WHERE object_names[2] = 'dl_where'").await,
        vec![vec![Some("function".into()), Some("{public,dl_where}".into()), Some("{integer}".into()), Some("0".into()), Some("t".into())]]
    );
    c.batch_execute("DROP FUNCTION dl_where(int); DROP FUNCTION dl_where_named(int, text)").await.unwrap();
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
    assert_eq!(
        answer(&c, "SELECT distribution_argument_index::text || ' ' || colocationid::text FROM pg_dist_object").await,
        answer(&c, "SELECT '0 ' || colocationid FROM pg_dist_partition WHERE logicalrelid = 'dl_k'::regclass").await
    );
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

/// A table of accounts and a delegated transfer between two of them that
/// sit on different workers; returns (a client, the two account ids).
async fn transfer_setup(cluster: &TestCluster) -> (tokio_postgres::Client, i32, i32) {
    let c = cluster.connect().await;
    c.batch_execute(
        "CREATE TABLE dl_acct (id int PRIMARY KEY, balance int NOT NULL); SELECT create_distributed_table('dl_acct', 'id');
         INSERT INTO dl_acct SELECT g, 100 FROM generate_series(1, 40) g;
         CREATE FUNCTION dl_transfer(src int, dst int, amount int) RETURNS void LANGUAGE plpgsql AS $$
         BEGIN
             UPDATE dl_acct SET balance = balance - amount WHERE id = src;
             UPDATE dl_acct SET balance = balance + amount WHERE id = dst;
         END $$;
         SELECT create_distributed_function('dl_transfer(int,int,int)', 'src', colocate_with => 'dl_acct');
         CREATE ROLE dl_app LOGIN; GRANT SELECT, UPDATE ON dl_acct TO dl_app;",
    )
    .await
    .unwrap();
    let ports = placement_ports(&c, "dl_acct").await;
    let port_of = |id: i32| ports[shard_of_int4(id, ports.len() as u32)];
    let a = 1;
    let b = (2..=40).find(|id| port_of(*id) != port_of(a)).unwrap();
    (c, a, b)
}

async fn balances(c: &tokio_postgres::Client, a: i32, b: i32) -> (i32, i32) {
    let rows = c.query(&format!("SELECT id, balance FROM dl_acct WHERE id IN ({a}, {b})"), &[]).await.unwrap();
    let of = |id: i32| rows.iter().find(|r| r.get::<_, i32>(0) == id).unwrap().get::<_, i32>(1);
    (of(a), of(b))
}

/// A delegated call writing on its own node and on the other commits both
/// before the client hears back (nothing is left prepared), for a role
/// that is not a superuser, over the extended protocol too; one failing
/// after its writes leaves nothing anywhere.
#[tokio::test]
async fn a_delegated_call_writing_on_two_nodes_commits_both_parts() {
    let cluster = TestCluster::start(2);
    let (c, a, b) = transfer_setup(&cluster).await;
    let app = connect_as(cluster.port, "dl_app").await;
    // An older transaction still running on the call's worker: the call's
    // xid is then above every snapshot's xmax there.
    let ports = placement_ports(&c, "dl_acct").await;
    let home = cluster.cluster.state.worker_ports.iter().position(|p| i32::from(*p) == ports[shard_of_int4(a, ports.len() as u32)]).unwrap();
    let older = cluster.connect_worker(home).await;
    older.batch_execute("BEGIN; SELECT pg_current_xact_id()").await.unwrap();
    app.batch_execute(&format!("SELECT dl_transfer({a}, {b}, 10)")).await.unwrap();
    assert_eq!(cluster.prepared_on_workers().await, 0, "settled before the answer");
    assert_eq!(balances(&c, a, b).await, (90, 110));
    older.batch_execute("COMMIT").await.unwrap();
    let call = app.prepare("SELECT dl_transfer($1, $2, $3)").await.unwrap();
    for _ in 0..5 {
        app.query(&call, &[&a, &b, &1]).await.unwrap();
        app.query(&call, &[&b, &a, &2]).await.unwrap();
    }
    assert_eq!(balances(&app, a, b).await, (95, 105), "each call reads the one before");
    assert_eq!(cluster.prepared_on_workers().await, 0);
    // The balance check fails on the worker after both updates ran.
    c.batch_execute("ALTER TABLE dl_acct ADD CONSTRAINT dl_positive CHECK (balance >= 0)").await.unwrap();
    let e = app.batch_execute(&format!("SELECT dl_transfer({b}, {a}, 500)")).await.unwrap_err();
    assert_eq!(sqlstate(&e), "23514", "{e}");
    assert_eq!(balances(&c, a, b).await, (95, 105));
    assert_eq!(cluster.prepared_on_workers().await, 0);
}

/// The link relay answers postgres_fdw's bookkeeping statements (opening
/// the remote transaction, closing a cursor) at once and sends them to the
/// node with the link's next request, one round trip each fewer; they still
/// run in order, and one that fails makes that next request fail with its
/// error. The test speaks to the relay as a worker's link would.
#[tokio::test]
async fn the_link_relay_sends_bookkeeping_with_the_next_request() {
    let cluster = TestCluster::start(2);
    let worker = cluster.connect_worker(0).await;
    let row = worker
        .query_one(
            "SELECT max(option_value) FILTER (WHERE option_name = 'host'), max(option_value) FILTER (WHERE option_name = 'port'),
                    max(option_value) FILTER (WHERE option_name = 'application_name')
               FROM pg_foreign_server, pg_options_to_table(srvoptions) WHERE srvname LIKE 'tessera_node_%'",
            &[],
        )
        .await
        .unwrap();
    let (host, port, name): (String, String, String) = (row.get(0), row.get(1), row.get(2));
    let link = common::connect_with_certificate(
        &cluster,
        &format!("host={host} port={port} user=postgres dbname=postgres sslmode=require application_name={}", name.replace("%p", "4242")),
        "postgres",
    )
    .await
    .unwrap();
    let node = cluster.connect_worker(1).await;
    let last_statement = |pid: i32| {
        let node = &node;
        async move { node.query_one("SELECT query FROM pg_stat_activity WHERE pid = $1", &[&pid]).await.unwrap().get::<_, String>(0) }
    };

    link.batch_execute("START TRANSACTION ISOLATION LEVEL SERIALIZABLE").await.unwrap();
    let row = link.query_one("SELECT current_setting('transaction_isolation'), pg_backend_pid()", &[]).await.unwrap();
    assert_eq!(row.get::<_, String>(0), "serializable", "the first query runs in the transaction opened ahead of it");
    let pid: i32 = row.get(1);
    link.batch_execute("DECLARE c1 CURSOR FOR SELECT 1").await.unwrap();
    link.batch_execute("CLOSE c1").await.unwrap();
    assert!(last_statement(pid).await.starts_with("DECLARE"), "the CLOSE waits for the next request");
    let e = link.batch_execute("FETCH 1 FROM c1").await.unwrap_err();
    assert_eq!(sqlstate(&e), "34000", "the cursor was closed before the FETCH ran: {e}");
    link.batch_execute("ROLLBACK").await.unwrap();

    link.batch_execute("START TRANSACTION ISOLATION LEVEL REPEATABLE READ").await.unwrap();
    let isolation: String = link.query_one("SELECT current_setting('transaction_isolation')", &[]).await.unwrap().get(0);
    assert_eq!(isolation, "read committed", "postgres_fdw's REPEATABLE READ becomes the sessions' READ COMMITTED");
    link.batch_execute("ROLLBACK").await.unwrap();

    link.batch_execute("START TRANSACTION ISOLATION LEVEL REPEATABLE READ").await.unwrap();
    link.batch_execute("CLOSE no_such_cursor").await.unwrap();
    let e = link.batch_execute("SELECT 1").await.unwrap_err();
    assert_eq!(sqlstate(&e), "34000", "{e}");
    assert!(e.as_db_error().unwrap().message().contains("no_such_cursor"), "{e}");
    assert!(link.batch_execute("SELECT 1").await.is_err(), "the relay dropped the link whose node connection failed");
}

/// A SECURITY DEFINER function owned by a role that may not log in writes
/// through a link as that role: the relay takes on the role's identity on
/// the other node, whose privileges then decide, and both parts commit.
#[tokio::test]
async fn a_definer_that_cannot_log_in_writes_through_a_link() {
    let cluster = TestCluster::start(2);
    let (c, a, b) = transfer_setup(&cluster).await;
    c.batch_execute(
        "CREATE ROLE dl_keeper NOLOGIN; GRANT SELECT, UPDATE ON dl_acct TO dl_keeper;
         CREATE FUNCTION dl_kept_transfer(src int, dst int, amount int) RETURNS text LANGUAGE plpgsql SECURITY DEFINER AS $$
         BEGIN
             UPDATE dl_acct SET balance = balance - amount WHERE id = src;
             UPDATE dl_acct SET balance = balance + amount WHERE id = dst;
             RETURN current_user;
         END $$;
         ALTER FUNCTION dl_kept_transfer(int, int, int) OWNER TO dl_keeper;
         SELECT create_distributed_function('dl_kept_transfer(int,int,int)', 'src', colocate_with => 'dl_acct');
         CREATE ROLE dl_clerk LOGIN;",
    )
    .await
    .unwrap();
    let clerk = connect_as(cluster.port, "dl_clerk").await;
    let e = clerk.batch_execute(&format!("UPDATE dl_acct SET balance = 0 WHERE id = {a}")).await.unwrap_err();
    assert_eq!(sqlstate(&e), "42501", "the clerk may not update the table itself: {e}");
    assert_eq!(answer(&clerk, &format!("SELECT dl_kept_transfer({a}, {b}, 7)")).await, "dl_keeper");
    assert_eq!(balances(&c, a, b).await, (93, 107));
    assert_eq!(cluster.prepared_on_workers().await, 0);
    // The other node checks the role's own privileges: without UPDATE on
    // the shard there (revoked on that node alone), the write through the
    // link is refused and nothing stays.
    let ports = placement_ports(&c, "dl_acct").await;
    let other = cluster.cluster.state.worker_ports.iter().position(|p| i32::from(*p) == ports[shard_of_int4(b, ports.len() as u32)]).unwrap();
    let other = cluster.connect_worker(other).await;
    let shard = answer(&other, &format!("SELECT tableoid::regclass::text FROM dl_acct WHERE id = {b}")).await;
    other.batch_execute(&format!("REVOKE UPDATE ON {shard} FROM dl_keeper")).await.unwrap();
    let e = clerk.batch_execute(&format!("SELECT dl_kept_transfer({a}, {b}, 5)")).await.unwrap_err();
    assert_eq!(sqlstate(&e), "42501", "{e}");
    assert_eq!(balances(&c, a, b).await, (93, 107));
    assert_eq!(cluster.prepared_on_workers().await, 0);
}

/// Kills the coordinator at `fault` during a delegated transfer of 30 from
/// one node's account to the other's; after a restart and recovery, nothing
/// is left prepared and the balances are `expected`.
async fn crash_during_transfer(fault: Fault, expected: (i32, i32)) {
    let cluster = TestCluster::start(2);
    let (c, a, b) = transfer_setup(&cluster).await;
    cluster.restart_coordinator(|c| c.transactions.fault_injection = Some(fault));
    drop(c);
    let c = cluster.connect().await;
    assert!(c.batch_execute(&format!("SELECT dl_transfer({a}, {b}, 30)")).await.is_err(), "the coordinator died during the call");
    cluster.wait_for_coordinator_exit();
    assert_eq!(cluster.prepared_on_workers().await, 1, "the other node's part is left prepared");
    cluster.restart_coordinator(|c| c.transactions.fault_injection = None);
    let c = cluster.connect().await;
    // Recovery leaves the part while the worker still runs its deciding
    // transaction (it may take a moment to notice the link is gone).
    let started = std::time::Instant::now();
    loop {
        c.batch_execute("SELECT recover_prepared_transactions()").await.unwrap();
        if cluster.prepared_on_workers().await == 0 {
            break;
        }
        assert!(started.elapsed() < std::time::Duration::from_secs(20), "recovery did not settle the prepared part");
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    assert_eq!(balances(&c, a, b).await, expected);
}

/// The coordinator dies right after the other node's part was prepared,
/// before the worker heard back: the call's transaction aborts on its
/// worker, and recovery rolls the prepared part back.
#[tokio::test]
async fn a_crash_before_the_worker_commits_rolls_back_both_parts() {
    crash_during_transfer(Fault::AfterLinkPrepare, (100, 100)).await;
}

/// The coordinator dies once the worker was told the other node's part is
/// safe: the worker commits the call, and recovery commits the prepared
/// part after it.
#[tokio::test]
async fn a_crash_after_the_worker_heard_back_commits_both_parts() {
    crash_during_transfer(Fault::AfterLinkReply, (70, 130)).await;
}

/// A cycle through a link: a delegated call in one session's block waits,
/// through its worker's link, for a row another session holds on the other
/// node, while that session waits for the first one's row. The distributed
/// detector sees the link as the first session and breaks the cycle.
#[tokio::test(flavor = "multi_thread")]
async fn a_deadlock_through_a_link_is_broken() {
    let cluster = TestCluster::start(2);
    let (c, a, b) = transfer_setup(&cluster).await;
    let s1 = cluster.connect().await;
    let s2 = cluster.connect().await;
    s1.batch_execute(&format!("BEGIN; UPDATE dl_acct SET balance = balance + 1 WHERE id = {a}")).await.unwrap();
    s2.batch_execute(&format!("BEGIN; UPDATE dl_acct SET balance = balance + 10 WHERE id = {b}")).await.unwrap();
    let started = std::time::Instant::now();
    let first = tokio::spawn(async move {
        let r = s1.batch_execute(&format!("SELECT dl_transfer({a}, {b}, 1)")).await;
        (s1, r)
    });
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let r2 = s2.batch_execute(&format!("UPDATE dl_acct SET balance = balance + 10 WHERE id = {a}")).await;
    let e = r2.expect_err("the later transaction is the victim");
    assert_eq!(sqlstate(&e), "40P01", "{e}");
    s2.batch_execute("ROLLBACK").await.unwrap();
    let (s1, r1) = first.await.unwrap();
    r1.unwrap();
    assert!(started.elapsed() < std::time::Duration::from_secs(15), "the deadlock took {:?} to break", started.elapsed());
    s1.batch_execute("COMMIT").await.unwrap();
    assert_eq!(balances(&c, a, b).await, (100, 101));
    assert_eq!(cluster.prepared_on_workers().await, 0);
}

/// A delegated call updating a row on the other node that another session
/// has updated and not yet committed waits for that session, as the same
/// call does on plain PostgreSQL, and then applies its change to the row's
/// new version: the link's remote transaction is READ COMMITTED, not
/// postgres_fdw's REPEATABLE READ, which fails the call with 40001.
#[tokio::test(flavor = "multi_thread")]
async fn a_call_writing_through_a_link_waits_for_a_concurrent_update() {
    let cluster = TestCluster::start(2);
    let (c, a, b) = transfer_setup(&cluster).await;
    let other = cluster.connect().await;
    other.batch_execute(&format!("BEGIN; UPDATE dl_acct SET balance = balance + 10 WHERE id = {b}")).await.unwrap();
    let app = connect_as(cluster.port, "dl_app").await;
    let call = tokio::spawn(async move { app.batch_execute(&format!("SELECT dl_transfer({a}, {b}, 1)")).await });
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    assert!(!call.is_finished(), "the call waits for the other session's row");
    other.batch_execute("COMMIT").await.unwrap();
    call.await.unwrap().unwrap();
    assert_eq!(balances(&c, a, b).await, (99, 111), "both updates count");
    assert_eq!(cluster.prepared_on_workers().await, 0);
}

/// Another account on the worker of account `id`.
async fn neighbour(c: &tokio_postgres::Client, id: i32) -> i32 {
    let ports = placement_ports(c, "dl_acct").await;
    let port_of = |id: i32| ports[shard_of_int4(id, ports.len() as u32)];
    (2..=40).find(|other| *other != id && port_of(*other) == port_of(id)).unwrap()
}

/// A block that writes on two nodes itself and runs a call writing through
/// a link: the call's worker cannot PREPARE (postgres_fdw refuses), so it is
/// the one whose commit decides; everything commits, atomically.
#[tokio::test]
async fn a_block_writing_on_two_nodes_and_through_a_link_commits() {
    let cluster = TestCluster::start(2);
    let (c, a, b) = transfer_setup(&cluster).await;
    let other = neighbour(&c, b).await;
    c.batch_execute(&format!("BEGIN; UPDATE dl_acct SET balance = 0 WHERE id = {other}; SELECT dl_transfer({a}, {b}, 5); COMMIT")).await.unwrap();
    assert_eq!(balances(&c, a, b).await, (95, 105));
    assert_eq!(text_rows(&c, &format!("SELECT balance FROM dl_acct WHERE id = {other}")).await, vec![vec![Some("0".into())]]);
    assert_eq!(cluster.prepared_on_workers().await, 0);
}

/// Calls using links on two workers in one block: only one of them can
/// decide, the other cannot PREPARE. COMMIT says so, and nothing of the
/// block stays anywhere.
#[tokio::test]
async fn a_block_whose_calls_use_links_on_two_workers_is_refused_at_commit() {
    let cluster = TestCluster::start(2);
    let (c, a, b) = transfer_setup(&cluster).await;
    let (near_a, near_b) = (neighbour(&c, a).await, neighbour(&c, b).await);
    c.batch_execute(&format!("BEGIN; SELECT dl_transfer({a}, {b}, 5); SELECT dl_transfer({near_b}, {near_a}, 7)")).await.unwrap();
    let e = c.batch_execute("COMMIT").await.unwrap_err();
    assert_eq!(sqlstate(&e), "0A000", "{e}");
    assert!(common::error_text(&e).contains("user code"), "{}", common::error_text(&e));
    assert_eq!(balances(&c, a, b).await, (100, 100));
    assert_eq!(balances(&c, near_a, near_b).await, (100, 100));
    assert_eq!(cluster.prepared_on_workers().await, 0);
}

/// The copy schemas (planner/function_copy.rs) on each worker, with the
/// routines in them.
async fn copies_on_workers(cluster: &TestCluster) -> Vec<Vec<String>> {
    let mut all = Vec::new();
    for i in 0..cluster.workers().len() {
        let w = cluster.connect_worker(i).await;
        let rows = text_rows(&w, "SELECT n.nspname || '.' || p.proname FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname LIKE 'tessera\\_shard\\_%' ORDER BY 1").await;
        all.push(rows.into_iter().map(|r| r[0].clone().unwrap_or_default()).collect());
    }
    all
}

/// A distributed SQL helper called from a PL/pgSQL function's copy runs on
/// its own copy (on the shards) when the value is in the call's shard group
/// and as itself otherwise, with its owner and privileges either way; a
/// name another function has too is called as written.
#[tokio::test]
async fn helpers_called_from_a_copy_run_on_their_own_copies() {
    let cluster = TestCluster::start(2);
    let c = cluster.connect().await;
    c.batch_execute(
        "CREATE TABLE dl_h (id int PRIMARY KEY, v int NOT NULL); SELECT create_distributed_table('dl_h', 'id', shard_count => 4);
         INSERT INTO dl_h SELECT g, 0 FROM generate_series(1, 20) g;
         CREATE ROLE dl_hown LOGIN; CREATE ROLE dl_huser LOGIN;
         GRANT SELECT ON dl_h TO dl_hown; GRANT SELECT, UPDATE ON dl_h TO dl_huser;
         CREATE FUNCTION dl_peek(k int) RETURNS int LANGUAGE sql STABLE SECURITY DEFINER AS 'SELECT v FROM dl_h WHERE id = k';
         ALTER FUNCTION dl_peek(int) OWNER TO dl_hown;
         REVOKE ALL ON FUNCTION dl_peek(int) FROM PUBLIC; GRANT EXECUTE ON FUNCTION dl_peek(int) TO dl_huser;
         SELECT create_distributed_function('dl_peek(int)', 'k', colocate_with => 'dl_h');
         CREATE FUNCTION dl_bump(k int, other int) RETURNS int LANGUAGE plpgsql AS $$
         BEGIN
             UPDATE dl_h SET v = v + 1 WHERE id = k;
             RETURN dl_peek(k) * 1000 + coalesce(dl_peek(other), -1);
         END $$;
         SELECT create_distributed_function('dl_bump(int,int)', 'k', colocate_with => 'dl_h');",
    )
    .await
    .unwrap();
    let user = connect_as(cluster.port, "dl_huser").await;
    let call = user.prepare("SELECT dl_bump($1, $2)").await.unwrap();
    let mut v = [0; 21];
    for round in 0..2 {
        for k in 1..=20i32 {
            let other = (k * 7 + round) % 21;
            v[k as usize] += 1;
            let expected = v[k as usize] * 1000 + if other == 0 { -1 } else { v[other as usize] };
            assert_eq!(user.query_one(&call, &[&k, &other]).await.unwrap().get::<_, i32>(0), expected, "dl_bump({k}, {other})");
        }
    }
    let copies = copies_on_workers(&cluster).await;
    let all: Vec<&String> = copies.iter().flatten().collect();
    assert_eq!(
        (all.iter().filter(|c| c.ends_with(".dl_bump")).count(), all.iter().filter(|c| c.ends_with(".dl_peek")).count()),
        (4, 4),
        "{copies:?}"
    );
    // Each copy of dl_bump calls the helper's copies.
    let copies_calling_copies = || async {
        let mut found = (0, 0);
        for i in 0..cluster.workers().len() {
            let w = cluster.connect_worker(i).await;
            let rows = text_rows(&w, "SELECT count(*), count(*) FILTER (WHERE prosrc LIKE '%tessera\\_shard\\_%.dl_peek(%') FROM pg_proc WHERE proname = 'dl_bump' AND pronamespace <> 'public'::regnamespace").await;
            found.0 += rows[0][0].as_deref().unwrap().parse::<i32>().unwrap();
            found.1 += rows[0][1].as_deref().unwrap().parse::<i32>().unwrap();
        }
        found
    };
    assert_eq!(copies_calling_copies().await, (4, 4));
    let w = cluster.connect_worker(copies.iter().position(|c| !c.is_empty()).unwrap()).await;
    assert_eq!(
        text_rows(&w, "SELECT DISTINCT proowner::regrole::text, proacl::text, prosecdef, prosrc ~ 'dl_h_[0-9]+' FROM pg_proc WHERE proname = 'dl_peek' AND pronamespace <> 'public'::regnamespace").await,
        vec![vec![Some("dl_hown".into()), Some("{dl_hown=X/dl_hown,dl_huser=X/dl_hown}".into()), Some("t".into()), Some("t".into())]],
        "the helper's copies read its shard, with its owner, privileges and SECURITY DEFINER"
    );
    // Without EXECUTE on the helper, the caller fails as the function itself does.
    // (Prepared again: the first run of a statement prepared before a
    // catalog change describes it again and calls the function itself.)
    c.batch_execute("REVOKE EXECUTE ON FUNCTION dl_peek(int) FROM dl_huser").await.unwrap();
    let call = user.prepare("SELECT dl_bump($1, $2)").await.unwrap();
    let e = user.query_one(&call, &[&3, &4]).await.unwrap_err();
    assert_eq!(
        (sqlstate(&e), e.as_db_error().unwrap().message().to_string()),
        ("42501".to_string(), "permission denied for function dl_peek".to_string())
    );
    assert_eq!(answer(&c, "SELECT sum(v) FROM dl_h").await, "40", "the refused call wrote nothing");
    assert_eq!(copies_calling_copies().await, (1, 1), "the refused call ran on the copies");
    // Once another function has the name, a bare call of it may mean that
    // one (by the caller's search_path): copies call the name as written.
    c.batch_execute("GRANT EXECUTE ON FUNCTION dl_peek(int) TO dl_huser; CREATE SCHEMA dl_app; CREATE FUNCTION dl_app.dl_peek(k int) RETURNS int LANGUAGE sql AS 'SELECT -k'").await.unwrap();
    v[3] += 1;
    let call = user.prepare("SELECT dl_bump($1, $2)").await.unwrap();
    assert_eq!(user.query_one(&call, &[&3, &4]).await.unwrap().get::<_, i32>(0), v[3] * 1000 + v[4]);
    assert_eq!(copies_calling_copies().await, (1, 0));
}

/// Calls outside blocks run per-shard copies of a PL/pgSQL function, made
/// on demand with its owner and privileges; errors and notices name the
/// function and its lines as the function itself does; a changed function,
/// a REVOKE, a dropped owner and a moved shard are followed.
#[tokio::test]
async fn calls_run_on_per_shard_copies_that_follow_the_function() {
    let cluster = TestCluster::start(2);
    let c = cluster.connect().await;
    c.batch_execute(
        "CREATE TABLE dl_c (id int PRIMARY KEY, v int NOT NULL); SELECT create_distributed_table('dl_c', 'id', shard_count => 4);
         INSERT INTO dl_c SELECT g, 0 FROM generate_series(1, 40) g;
         CREATE ROLE dl_owner; CREATE ROLE dl_user LOGIN; CREATE ROLE dl_other LOGIN;
         GRANT SELECT, UPDATE ON dl_c TO dl_owner;
         CREATE FUNCTION dl_add(k int, amount int) RETURNS int LANGUAGE plpgsql SECURITY DEFINER AS $$
         DECLARE
             now_v int;
         BEGIN
             UPDATE dl_c SET v = v + amount WHERE id = k RETURNING v INTO now_v;
             RAISE NOTICE 'now %', now_v;
             IF now_v > 100 THEN
                 UPDATE dl_c SET v = 1 / 0 WHERE id = k;
             END IF;
             RETURN now_v;
         END $$;
         ALTER FUNCTION dl_add(int, int) OWNER TO dl_owner;
         REVOKE ALL ON FUNCTION dl_add(int, int) FROM PUBLIC; GRANT EXECUTE ON FUNCTION dl_add(int, int) TO dl_user;
         SELECT create_distributed_function('dl_add(int,int)', 'k', colocate_with => 'dl_c');",
    )
    .await
    .unwrap();
    let user = connect_as(cluster.port, "dl_user").await;
    let call = user.prepare("SELECT dl_add($1, $2)").await.unwrap();
    for k in 1..=40 {
        assert_eq!(user.query_one(&call, &[&k, &k]).await.unwrap().get::<_, i32>(0), k, "key {k}");
    }
    let copies = copies_on_workers(&cluster).await;
    assert_eq!(copies.iter().map(Vec::len).sum::<usize>(), 4, "one copy per shard: {copies:?}");
    assert!(copies.iter().flatten().all(|c| c.ends_with(".dl_add")), "{copies:?}");
    let w = cluster.connect_worker(copies.iter().position(|c| !c.is_empty()).unwrap()).await;
    assert_eq!(
        text_rows(&w, "SELECT DISTINCT proowner::regrole::text, proacl::text, prosecdef FROM pg_proc WHERE proname = 'dl_add'").await,
        vec![vec![Some("dl_owner".into()), Some("{dl_owner=X/dl_owner,dl_user=X/dl_owner}".into()), Some("t".into())]],
        "the copies have the function's owner, privileges and SECURITY DEFINER"
    );
    // Errors and notices: the same text as from the function itself, which
    // a call in a transaction block runs.
    let failure = |e: tokio_postgres::Error| {
        let db = e.as_db_error().unwrap().clone();
        (db.code().code().to_string(), db.message().to_string(), db.where_().unwrap_or_default().to_string())
    };
    let from_copy = failure(user.query_one(&call, &[&5, &200]).await.unwrap_err());
    user.batch_execute("BEGIN").await.unwrap();
    let from_function = failure(user.query_one(&call, &[&5, &200]).await.unwrap_err());
    user.batch_execute("ROLLBACK").await.unwrap();
    assert_eq!(from_copy, from_function);
    assert!(
        from_copy.2.starts_with(
            "SQL statement \"UPDATE dl_c SET v = 1 / 0 WHERE id = k\"\nPL/pgSQL function dl_add(integer,integer) line 8 at SQL statement"
        ),
        "{}",
        from_copy.2
    );
    let psql = std::process::Command::new("psql")
        .args([
            "-h",
            "127.0.0.1",
            "-p",
            &cluster.port.to_string(),
            "-U",
            "dl_user",
            "-d",
            "postgres",
            "-X",
            "-v",
            "SHOW_CONTEXT=always",
            "-c",
            "SELECT dl_add(6, 1)",
        ])
        .output()
        .unwrap();
    let (ok, stderr) = (psql.status.success(), String::from_utf8_lossy(&psql.stderr));
    assert!(ok && stderr.contains("NOTICE:  now 7") && stderr.contains("PL/pgSQL function dl_add(integer,integer) line 6 at RAISE"), "{stderr}");
    // Another role may not call it; once granted, it may.
    let other = connect_as(cluster.port, "dl_other").await;
    let e = other.batch_execute("SELECT dl_add(1, 1)").await.unwrap_err();
    assert_eq!(
        (sqlstate(&e), e.as_db_error().unwrap().message().to_string()),
        ("42501".to_string(), "permission denied for function dl_add".to_string())
    );
    c.batch_execute("GRANT EXECUTE ON FUNCTION dl_add(int, int) TO dl_other").await.unwrap();
    assert_eq!(answer(&other, "SELECT dl_add(1, 1)").await, "2");
    c.batch_execute("REVOKE EXECUTE ON FUNCTION dl_add(int, int) FROM dl_user").await.unwrap();
    assert_eq!(sqlstate(&user.query_one(&call, &[&1, &1]).await.unwrap_err()), "42501");
    // A new body takes effect at once.
    c.batch_execute(
        "CREATE OR REPLACE FUNCTION dl_add(k int, amount int) RETURNS int LANGUAGE plpgsql SECURITY DEFINER AS $$
         BEGIN
             UPDATE dl_c SET v = v - amount WHERE id = k;
             RETURN -1;
         END $$",
    )
    .await
    .unwrap();
    assert_eq!(answer(&other, "SELECT dl_add(1, 1)").await, "-1");
    assert_eq!(answer(&c, "SELECT v FROM dl_c WHERE id = 1").await, "1");
    // A moved shard: the call follows it and gets a copy on its new node.
    let (shard, from, to): (i64, i32, i32) = {
        let rows = text_rows(&c, "SELECT s.shardid, p.nodeport FROM pg_dist_shard s JOIN pg_dist_placement pl USING (shardid) JOIN pg_dist_node p USING (groupid) WHERE s.logicalrelid = 'dl_c'::regclass AND p.nodeport IS NOT NULL ORDER BY 1 LIMIT 1").await;
        let from: i32 = rows[0][1].clone().unwrap().parse().unwrap();
        let to = cluster.cluster.state.worker_ports.iter().map(|p| i32::from(*p)).find(|p| *p != from).unwrap();
        (rows[0][0].clone().unwrap().parse().unwrap(), from, to)
    };
    c.batch_execute(&format!("SELECT citus_move_shard_placement({shard}, '127.0.0.1', {from}, '127.0.0.1', {to})")).await.unwrap();
    for k in 1..=40 {
        answer(&other, &format!("SELECT dl_add({k}, 0)")).await;
    }
    assert_eq!(answer(&c, "SELECT sum(v) FROM dl_c").await, ((1..=40).sum::<i32>() + 1).to_string(), "key 6 got one more");
    // Dropping the function drops its copies, so its owner can go.
    c.batch_execute("DROP FUNCTION dl_add(int, int); REVOKE ALL ON dl_c FROM dl_owner; DROP ROLE dl_owner").await.unwrap();
    assert_eq!(copies_on_workers(&cluster).await.iter().map(Vec::len).sum::<usize>(), 0);
}
