//! A bad or heavy statement never takes the coordinator down (issue 39,
//! item 11): a statement PostgreSQL rejects fails before any rows move; an
//! uncorrelated scalar subquery is computed once and routes the statement;
//! statement_timeout and a cancel request stop every part of a statement
//! at once and leave the session usable, its connections in step; another
//! client's `SELECT 1` stays fast while heavy statements run; a combine
//! larger than its memory limit spills to disk, and rows a statement must
//! hold past its limit fail it with 53200 while the process lives on with
//! its memory given back.
//!
//! One cluster serves every check, one check after another: the timings
//! must not overlap. Bounds leave several times the expected time (the
//! suite runs on a shared two-core machine, two tests at a time), and the
//! code before these fixes broke every one by far (measured on the test
//! machine): the typo failed after 87 s, the scalar subquery took 108 s, a
//! 300 ms timeout ended the fallback join after 101 s, a cancelled join ran
//! to its end (117 s), the DISTINCT over a million rows ran with no limit,
//! and the probes beside four heavy joins did not finish in 240 s.

mod common;
use common::{error_text, sqlstate, text_rows, TestCluster};
use std::time::{Duration, Instant};
use tokio_postgres::Client;

/// Rows of each table: moving them through the coordinator takes seconds.
const ROWS: i32 = 10_000;

/// A join on a two-valued column: 50 million rows to count, seconds of work
/// wherever it runs (the coordinator database, over the shards).
const HEAVY_JOIN: &str = "SELECT count(*) FROM a JOIN b ON a.two = b.two";
/// Hundreds of billions of rows to count: runs until it is cancelled.
const ENDLESS_JOIN: &str = "SELECT count(*) FROM a JOIN b ON a.two = b.two JOIN b c ON c.two = b.two";
/// Ten milliseconds per row on every shard, about three seconds per shard
/// statement: a multi-shard statement whose parts run one after another on
/// each worker.
const HEAVY_SHARDS: &str = "SELECT count(pg_sleep(0.01)) FROM a";

#[tokio::test]
async fn a_bad_or_heavy_statement_never_takes_the_coordinator_down() {
    let cluster = TestCluster::start(2);
    let c = cluster.connect().await;
    c.batch_execute(&format!(
        "CREATE TABLE a (id int PRIMARY KEY, two int, ten int, v text);
         CREATE TABLE b (id int PRIMARY KEY, two int, ten int, v text);
         INSERT INTO a SELECT g, g % 2, g % 10, 'row ' || g FROM generate_series(1, {ROWS}) g;
         INSERT INTO b SELECT g, g % 2, g % 10, 'row ' || g FROM generate_series(1, {ROWS}) g;
         SELECT create_distributed_table('a', 'id');
         SELECT create_distributed_table('b', 'id');
         CREATE ROLE outsider LOGIN;
         GRANT SELECT ON a TO outsider;"
    ))
    .await
    .unwrap();
    a_wrong_statement_fails_before_rows_move(&cluster, &c).await;
    a_scalar_subquery_is_computed_once(&c).await;
    statement_timeout_stops_every_part(&cluster).await;
    a_stopped_statement_leaves_no_answers_behind(&cluster).await;
    a_cancel_request_stops_every_part(&cluster).await;
    other_clients_stay_responsive(&cluster).await;
    memory_per_statement_is_bounded(&cluster).await;
}

/// Fails with `state` within `limit`: the error and how long it took.
async fn fails_within(c: &Client, sql: &str, state: &str, limit: Duration) -> tokio_postgres::Error {
    let started = Instant::now();
    let e = c.simple_query(sql).await.map(|_| ()).expect_err(sql);
    let took = started.elapsed();
    assert_eq!(sqlstate(&e), state, "{sql}: {}", error_text(&e));
    assert!(took < limit, "{sql} failed after {took:?}, more than {limit:?}");
    e
}

/// A typo or a missing privilege fails as PostgreSQL fails it, at once,
/// in either protocol: the coordinator database checks the statement
/// against the shells before a broadcast or the fallback moves rows.
async fn a_wrong_statement_fails_before_rows_move(cluster: &TestCluster, c: &Client) {
    let e = fails_within(c, "SELECT a.nope FROM a JOIN b ON a.two = b.two", "42703", Duration::from_secs(1)).await;
    assert_eq!(e.as_db_error().unwrap().message(), "column a.nope does not exist");
    fails_within(c, "SELECT count(*) FROM a JOIN b ON a.ten = b.ten WHERE b.v = 7", "42883", Duration::from_secs(1)).await;
    let started = Instant::now();
    let e = c.query("SELECT a.nope FROM a JOIN b ON a.two = b.two", &[]).await.unwrap_err();
    assert_eq!(sqlstate(&e), "42703");
    assert!(started.elapsed() < Duration::from_secs(1), "extended protocol: {:?}", started.elapsed());
    let outsider = common::connect_as(cluster.port, "outsider").await;
    let e = fails_within(&outsider, "SELECT count(*) FROM a JOIN b ON a.two = b.two", "42501", Duration::from_secs(1)).await;
    assert_eq!(e.as_db_error().unwrap().message(), "permission denied for table b");
    assert_eq!(text_rows(&outsider, "SELECT count(*) FROM a").await, vec![vec![Some(ROWS.to_string())]], "the session goes on");
}

/// `a.id = (SELECT max(b.id) FROM b)`: the subquery runs once, as a
/// multi-shard statement of its own, and its value routes the statement to
/// one shard group, as EXPLAIN shows.
async fn a_scalar_subquery_is_computed_once(c: &Client) {
    let sql = "SELECT count(*) FROM a WHERE a.id = (SELECT max(b.id) FROM b)";
    let started = Instant::now();
    assert_eq!(text_rows(c, sql).await, vec![vec![Some("1".into())]]);
    assert!(started.elapsed() < Duration::from_secs(2), "took {:?}", started.elapsed());
    let plan: Vec<String> =
        text_rows(c, &format!("EXPLAIN (COSTS OFF) {sql}")).await.into_iter().filter_map(|r| r.into_iter().next().flatten()).collect();
    let plan = plan.join("\n");
    assert!(plan.starts_with("Custom Scan (Tessera Subqueries First)"), "{plan}");
    assert!(plan.contains("Subquery 1: SELECT max(b.id) FROM b") && plan.contains("->  Custom Scan (Tessera Multi-Shard)"), "{plan}");
    assert!(
        plan.contains("->  Custom Scan (Tessera Router)") && plan.contains("Task Count: 1") && plan.contains(&format!("(id = {ROWS})")),
        "{plan}"
    );
}

/// `statement_timeout` stops a statement in the coordinator database and
/// one whose parts queue on the workers alike, shortly after it fires, with
/// PostgreSQL's error; the session's next statement works.
async fn statement_timeout_stops_every_part(cluster: &TestCluster) {
    let c = cluster.connect().await;
    c.batch_execute("SET statement_timeout = '300ms'").await.unwrap();
    for heavy in [HEAVY_JOIN, HEAVY_SHARDS] {
        let e = fails_within(&c, heavy, "57014", Duration::from_millis(300 + 1500)).await;
        assert_eq!(e.as_db_error().unwrap().message(), "canceling statement due to statement timeout", "{heavy}");
        assert_eq!(text_rows(&c, "SELECT count(*) FROM a").await, vec![vec![Some(ROWS.to_string())]], "after {heavy}");
    }
    // lock_timeout: one shard statement waits for a row another session
    // holds; the statement fails with that node's 55P03 and stops the rest.
    let holder = cluster.connect().await;
    holder.batch_execute("BEGIN; UPDATE a SET ten = ten WHERE id = 1").await.unwrap();
    c.batch_execute("RESET statement_timeout; SET lock_timeout = '200ms'").await.unwrap();
    let e = fails_within(&c, "UPDATE a SET ten = ten WHERE two = 1", "55P03", Duration::from_millis(200 + 1500)).await;
    assert!(e.as_db_error().unwrap().message().contains("lock timeout"), "{}", error_text(&e));
    holder.batch_execute("ROLLBACK").await.unwrap();
    c.batch_execute("RESET lock_timeout; SET statement_timeout = '300ms'").await.unwrap();
    // In a block, which the timeout aborts as PostgreSQL would.
    c.batch_execute("BEGIN").await.unwrap();
    fails_within(&c, HEAVY_SHARDS, "57014", Duration::from_millis(300 + 1500)).await;
    assert_eq!(sqlstate(&c.simple_query("SELECT 1").await.unwrap_err()), "25P02");
    c.batch_execute("ROLLBACK").await.unwrap();
    assert_eq!(text_rows(&c, "SELECT count(*) FROM b").await, vec![vec![Some(ROWS.to_string())]]);
}

/// A statement stopped at any point (the sweep of timeouts lands in every
/// phase of the repartition join: reading the shards, creating and filling
/// the temporary tables, the join) leaves no connection in the middle of an
/// exchange: the statements after it get their own answers. Before the
/// fix, a copy abandoned when the other node's failed left its answers on
/// the connection, and the next statements counted 7,493 rows of 10,000.
async fn a_stopped_statement_leaves_no_answers_behind(cluster: &TestCluster) {
    let c = cluster.connect().await;
    for timeout_ms in (30..=480).step_by(30) {
        c.batch_execute(&format!("SET statement_timeout = '{timeout_ms}ms'")).await.unwrap();
        if let Err(e) = c.simple_query(HEAVY_JOIN).await {
            assert_eq!(sqlstate(&e), "57014", "after {timeout_ms} ms: {}", error_text(&e));
        }
        c.batch_execute("RESET statement_timeout").await.unwrap();
        for table in ["a", "b"] {
            let sql = format!("SELECT count(*) FROM {table}");
            assert_eq!(text_rows(&c, &sql).await, vec![vec![Some(ROWS.to_string())]], "{sql} after a stop at {timeout_ms} ms");
        }
    }
}

/// A cancel request stops every part of the statement it reaches, in
/// either protocol, shortly after it arrives.
async fn a_cancel_request_stops_every_part(cluster: &TestCluster) {
    for heavy in [HEAVY_JOIN, HEAVY_SHARDS] {
        for extended in [false, true] {
            let c = cluster.connect().await;
            let after_cancel = common::cancelled_after_request(&c, heavy, extended).await;
            assert!(after_cancel < Duration::from_millis(1500), "{heavy} (extended: {extended}) ended {after_cancel:?} after the cancel request");
            assert_eq!(text_rows(&c, "SELECT count(*) FROM a").await, vec![vec![Some(ROWS.to_string())]]);
        }
    }
}

/// While four clients run heavy statements (more than the coordinator has
/// runtime threads), a fifth one's `SELECT 1` is answered without waiting
/// for them: 300 probes, their 99th percentile and the slowest.
async fn other_clients_stay_responsive(cluster: &TestCluster) {
    let mut heavy = Vec::new();
    for _ in 0..4 {
        let c = cluster.connect().await;
        let token = c.cancel_token();
        let running = tokio::spawn(async move { c.simple_query(ENDLESS_JOIN).await.map(|_| ()) });
        heavy.push((token, running));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let probe = cluster.connect().await;
    let mut latencies = Vec::new();
    for _ in 0..300 {
        let started = Instant::now();
        probe.simple_query("SELECT 1").await.unwrap();
        latencies.push(started.elapsed());
        // The probes cover three seconds or more of the heavy statements' run.
        tokio::time::sleep(Duration::from_millis(15)).await;
    }
    latencies.sort();
    let p99 = latencies[latencies.len() * 99 / 100];
    assert!(heavy.iter().all(|(_, running)| !running.is_finished()), "a heavy statement ended before the probes did");
    let slowest = latencies[latencies.len() - 1];
    assert!(
        p99 < Duration::from_millis(250) && slowest < Duration::from_secs(1),
        "SELECT 1 took {p99:?} at the 99th percentile, {slowest:?} at most (median {:?})",
        latencies[latencies.len() / 2]
    );
    for (token, running) in heavy {
        token.cancel_query(tokio_postgres::NoTls).await.unwrap();
        let outcome = tokio::time::timeout(Duration::from_secs(10), running).await.expect("a heavy statement outlived its cancel request").unwrap();
        assert!(outcome.is_ok() || outcome.as_ref().is_err_and(|e| sqlstate(e) == "57014"), "{outcome:?}");
    }
}

/// The coordinator's resident memory, from /proc.
fn resident_kb(pid: i32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status.lines().find_map(|l| l.strip_prefix("VmRSS:")).and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok()).unwrap()
}

/// A combine of a million distinct values (about 16 MB of shard rows) runs
/// under an 8 MB limit: what does not fit goes to a temporary file, and the
/// answer is whole. Inside a transaction block, where the rows are held in
/// memory, the same rows fail with 53200 naming the statement once they
/// pass the limit; the process neither grows nor goes away, and the session
/// goes on. An invalid setting is refused with 22023.
async fn memory_per_statement_is_bounded(cluster: &TestCluster) {
    let pid = cluster.cluster.coordinator_pid().unwrap();
    let c = cluster.connect().await;
    let before = resident_kb(pid);
    c.batch_execute("SET tessera.max_statement_memory = '8MB'").await.unwrap();
    let spilled = "SELECT count(DISTINCT a.v || '/' || g) FROM a, generate_series(1, 100) g";
    assert_eq!(text_rows(&c, spilled).await, vec![vec![Some((ROWS * 100).to_string())]]);
    let grown = resident_kb(pid).saturating_sub(before);
    assert!(grown < 64 * 1024, "the coordinator grew by {grown} kB");
    c.batch_execute("BEGIN").await.unwrap();
    let sql = "SELECT DISTINCT a.v || g FROM a, generate_series(1, 100) g";
    let e = fails_within(&c, sql, "53200", Duration::from_secs(10)).await;
    let message = e.as_db_error().unwrap().message();
    assert!(message.contains("more than 8 MB") && message.contains(sql), "{message}");
    c.batch_execute("ROLLBACK").await.unwrap();
    let grown = resident_kb(pid).saturating_sub(before);
    assert!(grown < 64 * 1024, "the coordinator grew by {grown} kB");
    assert_eq!(cluster.cluster.coordinator_pid(), Some(pid));
    assert_eq!(text_rows(&c, "SELECT count(*) FROM a").await, vec![vec![Some(ROWS.to_string())]]);
    c.batch_execute("SET tessera.max_statement_memory = 'lots'").await.unwrap();
    fails_within(&c, "SELECT DISTINCT two FROM a", "22023", Duration::from_secs(1)).await;
    c.batch_execute("RESET tessera.max_statement_memory").await.unwrap();
    assert_eq!(text_rows(&c, "SELECT DISTINCT two FROM a ORDER BY two").await, vec![vec![Some("0".into())], vec![Some("1".into())]]);
}
