//! Two-phase commit: who prepares, and recovery after the coordinator dies in
//! the middle of a commit (fault injection) or a worker restarts.

mod common;
use common::{text_rows, TestCluster};
use tessera::config::Fault;

/// Two keys whose shards live on different workers (shard count 4 over 2
/// workers puts shards 0 and 2 on one, 1 and 3 on the other).
async fn setup(cluster: &TestCluster) -> (tokio_postgres::Client, i32, i32) {
    let c = cluster.connect().await;
    c.batch_execute(
        "CREATE TABLE bank (id int PRIMARY KEY, balance int NOT NULL);
         INSERT INTO bank SELECT g, 100 FROM generate_series(1, 40) g;
         SELECT create_distributed_table('bank', 'id', shard_count => 4);",
    )
    .await
    .unwrap();
    let ports = common::placement_ports(&c, "bank").await;
    assert_ne!(ports[0], ports[1], "shards 0 and 1 sit on different workers");
    // One key per worker.
    let mut keys = (None, None);
    for id in 1..=40 {
        let port = ports[common::shard_of_int4(id, 4)];
        if port == ports[0] && keys.0.is_none() {
            keys.0 = Some(id);
        } else if port != ports[0] && keys.1.is_none() {
            keys.1 = Some(id);
        }
    }
    (c, keys.0.unwrap(), keys.1.unwrap())
}

#[tokio::test]
async fn only_transactions_writing_on_several_nodes_prepare() {
    let cluster = TestCluster::start(2);
    // Keep commit records around so that they can be counted.
    cluster.restart_coordinator(|c| c.transactions.recovery_interval_secs = 3600.0);
    let (c, a, b) = setup(&cluster).await;
    // Distributing the table wrote on both workers and the coordinator database
    // in one block: the coordinator database's transaction decided, with
    // one commit record there.
    let base = cluster.commit_records().await;
    assert_eq!(base, 1, "create_distributed_table commits atomically across nodes");
    assert_eq!(cluster.worker_commit_records().await, 0);
    c.batch_execute(&format!("BEGIN; SELECT * FROM bank WHERE id = {a}; SELECT * FROM bank WHERE id = {b}; COMMIT")).await.unwrap();
    c.batch_execute(&format!("BEGIN; UPDATE bank SET balance = balance - 1 WHERE id = {a}; SELECT * FROM bank WHERE id = {b}; COMMIT"))
        .await
        .unwrap();
    // Two writing workers: one prepares, the other decides by committing
    // (how many prepare is shown by the crash tests below); no record.
    c.batch_execute(&format!(
        "BEGIN; UPDATE bank SET balance = balance - 1 WHERE id = {a}; UPDATE bank SET balance = balance + 1 WHERE id = {b}; COMMIT"
    ))
    .await
    .unwrap();
    assert_eq!(cluster.commit_records().await, base, "the coordinator database is off the write path");
    assert_eq!(cluster.worker_commit_records().await, 1, "the deciding worker recorded its commit");
    c.batch_execute(&format!("SET citus.multi_shard_commit_protocol = '1pc'; BEGIN; UPDATE bank SET balance = balance - 1 WHERE id = {a}; UPDATE bank SET balance = balance + 1 WHERE id = {b}; COMMIT; RESET citus.multi_shard_commit_protocol")).await.unwrap();
    // A block that wrote in the coordinator database too: its transaction
    // there decides, with one record for both prepared workers.
    c.batch_execute(&format!("CREATE TABLE audit (note text); BEGIN; INSERT INTO audit VALUES ('moved'); UPDATE bank SET balance = balance - 1 WHERE id = {a}; UPDATE bank SET balance = balance + 1 WHERE id = {b}; COMMIT")).await.unwrap();
    assert_eq!(cluster.commit_records().await, base + 1, "one record for the block");
    assert_eq!(cluster.prepared_on_workers().await, 0);
    // Recovery finds nothing in doubt and drops the finished records.
    assert_eq!(text_rows(&c, "SELECT recover_prepared_transactions()").await, vec![vec![Some("0".into())]]);
    assert_eq!(cluster.commit_records().await, 0);
    assert_eq!(cluster.worker_commit_records().await, 0);
    assert_eq!(text_rows(&c, "SELECT sum(balance), (SELECT count(*) FROM audit) FROM bank").await, vec![vec![Some("3999".into()), Some("1".into())]]);
}

/// Moves 30 from `a` to `b` in a block (`before` runs first in it) while
/// the coordinator is set to die after the decision; checks how many parts
/// were left prepared, then that recovery commits them and forgets the
/// records. Returns a connection to the restarted coordinator.
async fn crash_after_decision(cluster: &TestCluster, before: &str, left_prepared: i64) -> tokio_postgres::Client {
    let (c, a, b) = setup(cluster).await;
    c.batch_execute("CREATE TABLE audit (note text)").await.unwrap();
    cluster.restart_coordinator(|c| c.transactions.fault_injection = Some(Fault::AfterDecision));
    let c2 = cluster.connect().await;
    drop(c);
    let result = c2
        .batch_execute(&format!(
            "BEGIN; {before} UPDATE bank SET balance = balance - 30 WHERE id = {a}; UPDATE bank SET balance = balance + 30 WHERE id = {b}; COMMIT"
        ))
        .await;
    assert!(result.is_err(), "the coordinator died during COMMIT");
    cluster.wait_for_coordinator_exit();
    assert_eq!(cluster.prepared_on_workers().await, left_prepared);
    cluster.restart_coordinator(|c| c.transactions.fault_injection = None);
    let c = cluster.connect().await;
    // Recovery runs at start-up; run it again on demand to be sure it is done.
    c.batch_execute("SELECT recover_prepared_transactions()").await.unwrap();
    assert_eq!(cluster.prepared_on_workers().await, 0);
    assert_eq!(text_rows(&c, &format!("SELECT balance FROM bank WHERE id = {a}")).await, vec![vec![Some("70".into())]]);
    assert_eq!(text_rows(&c, &format!("SELECT balance FROM bank WHERE id = {b}")).await, vec![vec![Some("130".into())]]);
    assert_eq!(cluster.commit_records().await, 0);
    c
}

/// The coordinator dies once the deciding worker committed: the other
/// writer, the only one prepared (two writers, one PREPARE), is committed
/// by recovery.
#[tokio::test]
async fn a_crash_after_the_deciding_commit_is_committed_by_recovery() {
    let cluster = TestCluster::start(2);
    crash_after_decision(&cluster, "", 1).await;
}

/// The same when the block's first writes on both workers were rolled back
/// to a savepoint: the deciding worker's record is written at the commit,
/// not with the writes, so the savepoint could not take it along.
#[tokio::test]
async fn a_crash_after_the_deciding_commit_past_a_rolled_back_savepoint_is_committed_by_recovery() {
    let cluster = TestCluster::start(2);
    crash_after_decision(&cluster, "SAVEPOINT s; UPDATE bank SET balance = balance + 1000; ROLLBACK TO SAVEPOINT s;", 1).await;
}

/// The same when the coordinator database took part and its transaction
/// decided: both workers were prepared.
#[tokio::test]
async fn a_crash_after_the_commit_records_is_committed_by_recovery() {
    let cluster = TestCluster::start(2);
    let c = crash_after_decision(&cluster, "INSERT INTO audit VALUES ('moved');", 2).await;
    assert_eq!(text_rows(&c, "SELECT count(*) FROM audit").await, vec![vec![Some("1".into())]]);
}

/// The coordinator dies between the PREPARE and the deciding commit: the
/// deciding worker's transaction ends with its connection, and recovery
/// rolls the prepared part back as soon as it sees that — no grace period.
#[tokio::test]
async fn a_crash_before_the_deciding_commit_is_rolled_back_by_recovery() {
    let cluster = TestCluster::start(2);
    let (c, a, b) = setup(&cluster).await;
    cluster.restart_coordinator(|c| c.transactions.fault_injection = Some(Fault::AfterPrepare));
    let c2 = cluster.connect().await;
    drop(c);
    let result =
        c2.batch_execute(&format!("BEGIN; UPDATE bank SET balance = 0 WHERE id = {a}; UPDATE bank SET balance = 0 WHERE id = {b}; COMMIT")).await;
    assert!(result.is_err());
    cluster.wait_for_coordinator_exit();
    assert_eq!(cluster.prepared_on_workers().await, 1);
    cluster.restart_coordinator(|c| {
        c.transactions.fault_injection = None;
        c.transactions.recovery_interval_secs = 0.5;
    });
    let start = std::time::Instant::now();
    while cluster.prepared_on_workers().await > 0 {
        assert!(start.elapsed() < std::time::Duration::from_secs(20), "recovery did not roll back the orphan");
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    let c = cluster.connect().await;
    assert_eq!(text_rows(&c, "SELECT sum(balance), count(*) FROM bank").await, vec![vec![Some("4000".into()), Some("40".into())]]);
}

/// Moves 30 from `a` to `b` in a block (`before` runs first in it) while
/// the coordinator stalls between the PREPAREs and its deciding commit for
/// ten recovery intervals, with recovery passes running: the `prepared`
/// parts are left alone (their deciding transaction is still running), and
/// the transaction commits everywhere once the coordinator goes on.
async fn stalled_commit(before: &str, prepared: i64) {
    let cluster = TestCluster::start(2);
    let (c, a, b) = setup(&cluster).await;
    c.batch_execute("CREATE TABLE audit (note text)").await.unwrap();
    cluster.restart_coordinator(|c| {
        c.transactions.fault_injection = Some(Fault::StallAfterPrepare);
        c.transactions.recovery_interval_secs = 0.3;
    });
    let c2 = cluster.connect().await;
    drop(c);
    let started = std::time::Instant::now();
    let block = format!(
        "BEGIN; {before} UPDATE bank SET balance = balance - 30 WHERE id = {a}; UPDATE bank SET balance = balance + 30 WHERE id = {b}; COMMIT"
    );
    let commit = tokio::spawn(async move {
        let r = c2.batch_execute(&block).await;
        (c2, r)
    });
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    assert_eq!(cluster.prepared_on_workers().await, prepared, "several recovery passes later, the parts are still prepared");
    let (c2, r) = commit.await.unwrap();
    r.unwrap();
    assert!(started.elapsed() >= std::time::Duration::from_secs(3), "the commit stalled");
    assert_eq!(cluster.prepared_on_workers().await, 0);
    assert_eq!(text_rows(&c2, &format!("SELECT balance FROM bank WHERE id = {a}")).await, vec![vec![Some("70".into())]]);
    assert_eq!(text_rows(&c2, &format!("SELECT balance FROM bank WHERE id = {b}")).await, vec![vec![Some("130".into())]]);
    let audited = if before.is_empty() { "0" } else { "1" };
    assert_eq!(text_rows(&c2, "SELECT count(*) FROM audit").await, vec![vec![Some(audited.into())]]);
}

#[tokio::test]
async fn a_stalled_commit_is_not_rolled_back_behind_its_back() {
    stalled_commit("", 1).await;
}

/// The same when the coordinator database took part and decides: both
/// workers wait prepared. (Versions that decided such blocks by rows in
/// `pg_dist_transaction` rolled the parts back after a grace period, and
/// refused to commit this late.)
#[tokio::test]
async fn a_stalled_commit_decided_by_the_coordinator_database_is_not_rolled_back() {
    stalled_commit("INSERT INTO audit VALUES ('moved');", 2).await;
}

/// Recovery decides a part by its deciding transaction's commit record, not
/// by the transaction id alone: a worker restarted after a crash hands out
/// ids again whose WAL never reached disk, so the id in a part's name may
/// belong to another transaction by then. Parts are made by hand on one
/// worker, named after transactions on the other.
#[tokio::test]
async fn recovery_decides_by_the_commit_record_not_the_transaction_id() {
    let cluster = TestCluster::start(2);
    let c = cluster.connect().await;
    let decider_port = cluster.workers()[0].port;
    let group: i32 = c.query_one(&format!("SELECT groupid FROM pg_dist_node WHERE nodeport = {decider_port}"), &[]).await.unwrap().get(0);
    let decider = cluster.connect_worker(0).await;
    let other = cluster.connect_worker(1).await;
    other.batch_execute("CREATE TABLE parts (name text)").await.unwrap();
    // Recovery reads outcomes under READ COMMITTED whatever a node's default.
    decider.batch_execute("ALTER DATABASE postgres SET default_transaction_isolation TO 'repeatable read'").await.unwrap();
    let prepare = |name: &str, xid: &str, started: &str| {
        format!("BEGIN; INSERT INTO parts VALUES ('{name}'); PREPARE TRANSACTION 'tessera.decided_{group}_{xid}_{started}_{name}'")
    };
    let record = "SELECT tessera_commit.record_commit();
                  SELECT pg_current_xact_id()::text, (extract(epoch FROM backend_start) * 1000000)::bigint::text FROM pg_stat_activity WHERE pid = pg_backend_pid()";
    let one_row = |rows: Vec<Vec<Option<String>>>| (rows[1][0].clone().unwrap(), rows[1][1].clone().unwrap());

    // Committed with its record: committed.
    decider.batch_execute("BEGIN").await.unwrap();
    let (xid, started) = one_row(text_rows(&decider, record).await);
    decider.batch_execute("COMMIT").await.unwrap();
    other.batch_execute(&prepare("recorded", &xid, &started)).await.unwrap();
    // The same id, but from a backend that started earlier: the transaction
    // a crash ended before its id was handed out again. Rolled back.
    let earlier = (started.parse::<i64>().unwrap() - 1).to_string();
    other.batch_execute(&prepare("reused", &xid, &earlier)).await.unwrap();
    // An id not handed out yet (the node forgot it in a crash): rolled back.
    let future = (xid.parse::<u64>().unwrap() + 1_000_000).to_string();
    other.batch_execute(&prepare("future", &future, &started)).await.unwrap();
    // Committed without a record: rolled back.
    let bare = text_rows(&decider, "SELECT pg_current_xact_id()::text").await[0][0].clone().unwrap();
    other.batch_execute(&prepare("unrecorded", &bare, &started)).await.unwrap();
    // Still running with its record: waits for it.
    decider.batch_execute("BEGIN").await.unwrap();
    let (running, running_started) = one_row(text_rows(&decider, record).await);
    other.batch_execute(&prepare("running", &running, &running_started)).await.unwrap();

    let prepared = || async { text_rows(&other, "SELECT gid FROM pg_prepared_xacts ORDER BY gid").await };
    let parts = || async { text_rows(&other, "SELECT name FROM parts ORDER BY name").await };
    c.batch_execute("SELECT recover_prepared_transactions()").await.unwrap();
    assert_eq!(prepared().await, vec![vec![Some(format!("tessera.decided_{group}_{running}_{running_started}_running"))]]);
    assert_eq!(parts().await, vec![vec![Some("recorded".into())]]);
    decider.batch_execute("COMMIT").await.unwrap();
    c.batch_execute("SELECT recover_prepared_transactions()").await.unwrap();
    assert!(prepared().await.is_empty());
    assert_eq!(parts().await, vec![vec![Some("recorded".into())], vec![Some("running".into())]]);
    // The records go once no prepared part names them (a pass after the
    // one that committed the last part).
    c.batch_execute("SELECT recover_prepared_transactions()").await.unwrap();
    assert_eq!(text_rows(&decider, "SELECT count(*) FROM tessera_commit.commit_records").await, vec![vec![Some("0".into())]]);
}

/// A deciding transaction's backend start is read from the backend table
/// once per session and cached in a setting; a role that sets that setting
/// itself (made up, or copied from another backend) does not change what
/// its transactions record, and cannot read the key that tells them apart.
#[tokio::test]
async fn the_cached_backend_start_cannot_be_forged() {
    let cluster = TestCluster::start(2);
    let worker_port = cluster.workers()[0].port;
    cluster.connect_worker(0).await.batch_execute("CREATE ROLE tp_app LOGIN").await.unwrap();
    let app = common::connect_as(worker_port, "tp_app").await;
    let other = common::connect_as(worker_port, "tp_app").await;
    let truth = "SELECT (extract(epoch FROM backend_start) * 1000000)::bigint::text FROM pg_stat_activity WHERE pid = pg_backend_pid()";
    async fn started(c: &tokio_postgres::Client) -> String {
        text_rows(c, "SELECT tessera_commit.backend_started()::text").await[0][0].clone().unwrap()
    }
    let real = text_rows(&app, truth).await[0][0].clone().unwrap();
    assert_eq!(started(&app).await, real);
    let cached = text_rows(&app, "SELECT current_setting('tessera_commit.backend')").await[0][0].clone().unwrap();
    let (cached_start, mac) = cached.split_once(':').unwrap();
    assert_eq!(cached_start, real, "the setting caches the start");
    assert_eq!(started(&app).await, real, "read from the cache");

    // Another start with this backend's MAC, and another backend's value as
    // it stands: both ignored.
    let forged = real.parse::<i64>().unwrap() - 1;
    app.batch_execute(&format!("SET tessera_commit.backend = '{forged}:{mac}'")).await.unwrap();
    assert_eq!(started(&app).await, real);
    let other_real = text_rows(&other, truth).await[0][0].clone().unwrap();
    started(&other).await;
    let other_cached = text_rows(&other, "SELECT current_setting('tessera_commit.backend')").await[0][0].clone().unwrap();
    app.batch_execute(&format!("SET tessera_commit.backend = '{other_cached}'")).await.unwrap();
    assert_ne!(other_real, real);
    assert_eq!(started(&app).await, real);
    app.batch_execute("SET tessera_commit.backend = 'nonsense'").await.unwrap();
    assert_eq!(started(&app).await, real);
    // What a transaction records is its own start.
    app.batch_execute("SET tessera_commit.backend = '1:x'").await.unwrap();
    let rows = text_rows(&app, "BEGIN; SELECT tessera_commit.record_commit(); SELECT pg_current_xact_id()::text").await;
    app.batch_execute("COMMIT").await.unwrap();
    let xid = rows[1][0].clone().unwrap();
    let worker = cluster.connect_worker(0).await;
    let recorded = text_rows(&worker, &format!("SELECT backend_started::text FROM tessera_commit.commit_records WHERE xid = '{xid}'")).await;
    assert_eq!(recorded, vec![vec![Some(real)]]);

    let e = app.batch_execute("SELECT * FROM tessera_commit.mac_key").await.unwrap_err();
    assert_eq!(common::sqlstate(&e), "42501", "{e}");
}

/// Workers that were down when the coordinator started, and so missed what
/// this version makes on them (here the function that reads the backend
/// start), are made ready once they answer again: blocks writing on both
/// commit without another restart.
#[tokio::test]
async fn workers_down_at_coordinator_start_are_prepared_once_back() {
    let cluster = TestCluster::start(2);
    let (c, a, b) = setup(&cluster).await;
    drop(c);
    for i in 0..2 {
        cluster.connect_worker(i).await.batch_execute("DROP FUNCTION tessera_commit.backend_started()").await.unwrap();
        cluster.kill_worker(i);
    }
    cluster.restart_coordinator(|config| config.transactions.recovery_interval_secs = 0.5);
    assert!(cluster.coordinator_log().contains("trying again every recovery interval"), "{}", cluster.coordinator_log_tail());
    for i in 0..2 {
        cluster.start_worker(i);
    }
    let c = cluster.connect().await;
    let transfer =
        format!("BEGIN; UPDATE bank SET balance = balance - 1 WHERE id = {a}; UPDATE bank SET balance = balance + 1 WHERE id = {b}; COMMIT");
    let started = std::time::Instant::now();
    loop {
        match c.batch_execute(&transfer).await {
            Ok(()) => break,
            Err(e) => {
                c.batch_execute("ROLLBACK").await.ok();
                assert!(started.elapsed() < std::time::Duration::from_secs(30), "still failing after 30 s: {}", common::error_text(&e));
                tokio::time::sleep(std::time::Duration::from_millis(200)).await;
            }
        }
    }
    for i in 0..2 {
        let w = cluster.connect_worker(i).await;
        assert_eq!(text_rows(&w, "SELECT count(*) FROM pg_proc WHERE proname = 'backend_started'").await, vec![vec![Some("1".into())]]);
    }
    assert_eq!(text_rows(&c, "SELECT sum(balance) FROM bank").await, vec![vec![Some("4000".into())]]);
    assert!(cluster.coordinator_log().contains("answers again"), "{}", cluster.coordinator_log_tail());
}

/// Recovery and deadlock detection keep one connection per node from one
/// round to the next, also through rounds that commit, roll back and delete
/// records: rounds every 100 ms are served by the same two backends on each
/// worker, and after a worker restarts they connect again.
#[tokio::test]
async fn background_rounds_keep_their_node_connections() {
    let cluster = TestCluster::start(2);
    let (c, a, b) = setup(&cluster).await;
    cluster.restart_coordinator(|config| {
        config.transactions.recovery_interval_secs = 0.1;
        config.transactions.deadlock_check_interval_secs = 0.1;
    });
    let c2 = cluster.connect().await;
    drop(c);
    let background = "SELECT application_name, pid FROM pg_stat_activity
                       WHERE application_name IN ('tessera recovery', 'tessera deadlock detection') ORDER BY 1";
    let served_by = |w: tokio_postgres::Client| async move {
        let started = std::time::Instant::now();
        loop {
            let rows = text_rows(&w, background).await;
            if rows.len() == 2 {
                return (w, rows);
            }
            assert!(started.elapsed() < std::time::Duration::from_secs(10), "the background connections never stayed: {rows:?}");
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    };
    let (w, first) = served_by(cluster.connect_worker(0).await).await;
    // Work for the rounds: commit records on the deciding worker to read
    // and delete, and a prepared part named after a transaction of the
    // coordinator database that ended long ago without a record, which
    // recovery rolls back.
    let transfer =
        format!("BEGIN; UPDATE bank SET balance = balance - 1 WHERE id = {a}; UPDATE bank SET balance = balance + 1 WHERE id = {b}; COMMIT");
    for _ in 0..20 {
        c2.batch_execute(&transfer).await.unwrap();
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    w.batch_execute("CREATE TABLE orphan (x int); BEGIN; INSERT INTO orphan VALUES (1); PREPARE TRANSACTION 'tessera.decided_0_3_1_orphan'")
        .await
        .unwrap();
    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    assert_eq!(text_rows(&w, background).await, first, "the same backends served every round");
    assert_eq!(cluster.prepared_on_workers().await, 0, "the orphan was rolled back");
    assert_eq!(cluster.worker_commit_records().await, 0, "the rounds deleted the finished records");
    drop(w);
    cluster.kill_worker(0);
    cluster.start_worker(0);
    let (w, again) = served_by(cluster.connect_worker(0).await).await;
    assert_ne!(again, first, "new backends after the restart");
    assert_eq!(text_rows(&c2, "SELECT sum(balance) FROM bank").await, vec![vec![Some("4000".into())]]);

    // A backend that stops answering (as a host gone without closing its
    // connections would) is given up after ten rounds, and the next round
    // connects again instead of waiting for it for ever.
    let stuck = again.iter().find(|r| r[0].as_deref() == Some("tessera deadlock detection")).unwrap()[1].clone().unwrap();
    let signal = |sig: &str| assert!(std::process::Command::new("kill").args([sig, &stuck]).status().unwrap().success());
    signal("-STOP");
    let started = std::time::Instant::now();
    loop {
        let now = text_rows(&w, "SELECT pid::text FROM pg_stat_activity WHERE application_name = 'tessera deadlock detection'").await;
        if now.iter().any(|r| r[0].as_deref() != Some(stuck.as_str())) {
            break;
        }
        if started.elapsed() > std::time::Duration::from_secs(10) {
            signal("-CONT");
            panic!("deadlock detection still waits for the stopped backend {stuck}");
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    signal("-CONT");
}

/// Two sessions update the same two rows, on different workers, in opposite
/// order: each worker sees only one wait, so only the distributed detector can
/// break the cycle. Exactly one session gets 40P01; the other commits.
#[tokio::test(flavor = "multi_thread")]
async fn a_deadlock_across_workers_is_broken() {
    let cluster = TestCluster::start(2);
    let (c, a, b) = setup(&cluster).await;
    drop(c);
    let s1 = cluster.connect().await;
    let s2 = cluster.connect().await;
    s1.batch_execute(&format!("BEGIN; UPDATE bank SET balance = balance + 1 WHERE id = {a}")).await.unwrap();
    s2.batch_execute(&format!("BEGIN; UPDATE bank SET balance = balance + 10 WHERE id = {b}")).await.unwrap();
    let started = std::time::Instant::now();
    let first = tokio::spawn(async move {
        let r = s1.batch_execute(&format!("UPDATE bank SET balance = balance + 1 WHERE id = {b}")).await;
        (s1, r)
    });
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    let second = tokio::spawn(async move {
        let r = s2.batch_execute(&format!("UPDATE bank SET balance = balance + 10 WHERE id = {a}")).await;
        (s2, r)
    });
    let ((s1, r1), (s2, r2)) = (first.await.unwrap(), second.await.unwrap());
    assert!(started.elapsed() < std::time::Duration::from_secs(15), "the deadlock took {:?} to break", started.elapsed());
    let failures: Vec<&tokio_postgres::Error> = [&r1, &r2].into_iter().filter_map(|r| r.as_ref().err()).collect();
    assert_eq!(failures.len(), 1, "exactly one session loses: {r1:?} {r2:?}");
    assert_eq!(common::sqlstate(failures[0]), "40P01");
    assert!(r1.is_ok(), "the second session's transaction began later, so it is the one cancelled: {r2:?}");
    assert!(common::error_text(failures[0]).contains("tessera:"), "the message names the cycle: {}", common::error_text(failures[0]));
    // The survivor commits; the victim rolls back.
    let (winner, loser, delta) = if r1.is_ok() { (s1, s2, 1) } else { (s2, s1, 10) };
    loser.batch_execute("ROLLBACK").await.unwrap();
    winner.batch_execute("COMMIT").await.unwrap();
    let c = cluster.connect().await;
    let expected = (100 + delta).to_string();
    assert_eq!(text_rows(&c, &format!("SELECT balance FROM bank WHERE id = {a}")).await, vec![vec![Some(expected.clone())]]);
    assert_eq!(text_rows(&c, &format!("SELECT balance FROM bank WHERE id = {b}")).await, vec![vec![Some(expected)]]);
}

/// The same cycle between sessions of two coordinator processes: each
/// process cancels only its own sessions' transactions, so the victim's
/// process is the one that cancels it, and its client hears 40P01 (not a
/// bare 57014) — even when the other process looks for cycles far more often.
#[tokio::test(flavor = "multi_thread")]
async fn a_deadlock_across_coordinator_processes_reports_40p01() {
    let cluster = TestCluster::start(2);
    let (c, a, b) = setup(&cluster).await;
    drop(c);
    cluster.restart_coordinator(|c| c.transactions.deadlock_check_interval_secs = 0.2);
    // A second coordinator process over the same nodes, on a port of its own.
    let (_second, port) = cluster.start_second_coordinator(|config| config.transactions.deadlock_check_interval_secs = 1.0).await;
    let s2 = common::connect(port).await;
    let s1 = cluster.connect().await;
    s1.batch_execute(&format!("BEGIN; UPDATE bank SET balance = balance + 1 WHERE id = {a}")).await.unwrap();
    s2.batch_execute(&format!("BEGIN; UPDATE bank SET balance = balance + 10 WHERE id = {b}")).await.unwrap();
    let first = tokio::spawn(async move {
        let r = s1.batch_execute(&format!("UPDATE bank SET balance = balance + 1 WHERE id = {b}")).await;
        (s1, r)
    });
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    let r2 = s2.batch_execute(&format!("UPDATE bank SET balance = balance + 10 WHERE id = {a}")).await;
    let e = r2.expect_err("the later transaction is the victim");
    assert_eq!(common::sqlstate(&e), "40P01", "{}", common::error_text(&e));
    s2.batch_execute("ROLLBACK").await.unwrap();
    let (s1, r1) = first.await.unwrap();
    r1.unwrap();
    s1.batch_execute("COMMIT").await.unwrap();
    assert_eq!(
        text_rows(&s1, &format!("SELECT balance FROM bank WHERE id IN ({a}, {b}) ORDER BY id = {a}")).await,
        vec![vec![Some("101".into())], vec![Some("101".into())]]
    );
}

/// With the coordinator database stopped, clients it let in before log in
/// again (with SCRAM, against the remembered verifier), and statements on
/// distributed tables that need nothing from it keep committing, two-phase
/// blocks included. What needs it fails naming it, and the session goes on.
#[tokio::test]
async fn distributed_writes_commit_while_the_coordinator_database_is_down() {
    let cluster = TestCluster::start(2);
    let (c, a, b) = setup(&cluster).await;
    c.batch_execute(
        "CREATE ROLE teller LOGIN PASSWORD 'teller-secret';
         GRANT SELECT, UPDATE ON bank TO teller;
         ALTER ROLE postgres PASSWORD 'postgres-secret';",
    )
    .await
    .unwrap();
    drop(c);
    cluster.restart_coordinator(|c| c.auth = tessera::config::AuthMethod::ScramSha256);
    let port = cluster.port;
    let admin = common::try_login(port, "postgres", "postgres-secret").await.unwrap();
    drop(common::try_login(port, "teller", "teller-secret").await.unwrap());

    cluster.cluster.coordinator_db().stop().unwrap();
    let teller = common::try_login(port, "teller", "teller-secret").await.expect("a login seen before gets in");
    let wrong = common::try_login(port, "teller", "wrong").await.expect_err("a wrong password is refused");
    assert_eq!(common::sqlstate(&wrong), "28P01");
    let unseen = common::try_login(port, "nobody", "secret").await.expect_err("a login never seen is refused");
    assert!(
        common::sqlstate(&unseen).starts_with("08") && common::error_text(&unseen).contains("coordinator database"),
        "{}",
        common::error_text(&unseen)
    );

    teller.batch_execute(&format!("UPDATE bank SET balance = balance - 5 WHERE id = {a}")).await.unwrap();
    teller
        .batch_execute(&format!(
            "BEGIN; UPDATE bank SET balance = balance - 1 WHERE id = {a}; UPDATE bank SET balance = balance + 1 WHERE id = {b}; COMMIT"
        ))
        .await
        .unwrap();
    teller.batch_execute("UPDATE bank SET balance = balance + 1").await.unwrap();
    assert_eq!(text_rows(&teller, &format!("SELECT balance FROM bank WHERE id = {a}")).await, vec![vec![Some("95".into())]]);
    assert_eq!(text_rows(&teller, "SELECT id, balance FROM bank WHERE balance > 0").await.len(), 40);
    for (client, sql) in [(&teller, "SELECT now()"), (&teller, "SELECT sum(balance) FROM bank"), (&admin, "CREATE TABLE more (id int)")] {
        let e = client.batch_execute(sql).await.err().unwrap_or_else(|| panic!("{sql} ran without the coordinator database"));
        let text = common::error_text(&e);
        assert!(common::sqlstate(&e).starts_with("08") && text.contains("coordinator database"), "{sql}: {text}");
    }
    teller.batch_execute(&format!("UPDATE bank SET balance = balance + 5 WHERE id = {a}")).await.unwrap();

    cluster.cluster.coordinator_db().start().unwrap();
    assert_eq!(text_rows(&teller, "SELECT sum(balance) FROM bank").await, vec![vec![Some("4040".into())]]);
    admin.batch_execute("CREATE TABLE more (id int)").await.unwrap();
    assert_eq!(cluster.prepared_on_workers().await, 0);
}
