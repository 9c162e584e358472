//! A multi-shard read outside a transaction block runs each worker's shard
//! tasks on several of its connections at once, up to
//! `citus.max_adaptive_executor_pool_size` per worker (issue 41, item 1):
//! the workers see several backends of the statement and it ends in a
//! fraction of the time its tasks take one after another; a block keeps
//! its one connection per worker and sees its own writes; a timeout, a
//! cancel request or one shard's error stops every connection's task and
//! the session goes on; a combine of every connection's rows past the
//! memory limit spills to disk; the pools' limits hold.
//!
//! One cluster serves every check, one check after another: the timings
//! must not overlap. Each of the 16 shards (8 per worker) holds one row,
//! so a statement sleeping per row sleeps once per shard task: 8 × 300 ms
//! per worker one after another. Bounds leave room for a shared two-core
//! machine running two tests at a time.

mod common;
use common::{error_text, placement_ports, shard_of_int4, sqlstate, text_rows, TestCluster};
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};
use tokio_postgres::Client;

const SHARDS: u32 = 16;
/// One sleep per shard task: each row's.
const SLEEPY: &str = "SELECT current_setting('port'), pg_backend_pid(), pg_sleep(0.3) FROM sleepy";
/// What the eight tasks of a worker take one after another.
const SEQUENTIAL: Duration = Duration::from_millis(8 * 300);

#[tokio::test]
async fn reads_run_on_several_connections_per_worker() {
    let cluster = TestCluster::start(2);
    let c = cluster.connect().await;
    let ids = one_key_per_shard();
    c.batch_execute(&format!(
        "SET citus.shard_count = {SHARDS};
         CREATE TABLE sleepy (id int PRIMARY KEY);
         SELECT create_distributed_table('sleepy', 'id');
         INSERT INTO sleepy VALUES ({});
         CREATE TABLE notes (id int PRIMARY KEY, v text);
         SELECT create_distributed_table('notes', 'id');",
        ids.iter().map(i32::to_string).collect::<Vec<_>>().join("), (")
    ))
    .await
    .unwrap();
    let ports = placement_ports(&c, "sleepy").await;
    for port in &ports {
        assert_eq!(ports.iter().filter(|p| *p == port).count(), 8, "8 shards per worker: {ports:?}");
    }
    several_backends_run_a_workers_tasks(&c).await;
    the_extended_protocol_shares_tasks_too(&c).await;
    a_block_keeps_one_connection_and_sees_its_writes(&c).await;
    statement_timeout_stops_every_connection(&cluster, &c).await;
    a_cancel_request_stops_every_connection(&cluster).await;
    one_shards_error_fails_the_statement_cleanly(&cluster, &c, ids[0]).await;
    a_combine_past_the_memory_limit_spills(&c).await;
    the_pools_limits_hold(&cluster).await;
}

/// A key of each shard of `sleepy`.
fn one_key_per_shard() -> Vec<i32> {
    let mut by_shard = BTreeMap::new();
    for id in 1.. {
        by_shard.entry(shard_of_int4(id, SHARDS)).or_insert(id);
        if by_shard.len() == SHARDS as usize {
            break;
        }
    }
    by_shard.into_values().collect()
}

/// Runs `sql` (rows of worker port, backend pid, …) and returns how long
/// it took and the distinct backends each worker ran it on.
async fn backends_per_worker(c: &Client, sql: &str) -> (Duration, BTreeMap<String, BTreeSet<String>>) {
    let started = Instant::now();
    let rows = text_rows(c, sql).await;
    let took = started.elapsed();
    assert_eq!(rows.len(), SHARDS as usize, "{sql}");
    let mut backends: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for row in rows {
        backends.entry(row[0].clone().unwrap()).or_default().insert(row[1].clone().unwrap());
    }
    assert_eq!(backends.len(), 2, "{sql}: rows from both workers");
    (took, backends)
}

/// At 4 connections per worker a worker's 8 tasks run on more than one
/// backend, and the statement takes far less than 8 sleeps; at 1, one
/// backend per worker runs them one after another, as before.
async fn several_backends_run_a_workers_tasks(c: &Client) {
    c.batch_execute("SET citus.max_adaptive_executor_pool_size = 4").await.unwrap();
    // The first run may open the connections; the second finds them idle.
    for _ in 0..2 {
        let (took, backends) = backends_per_worker(c, SLEEPY).await;
        for (port, pids) in &backends {
            assert!((2..=4).contains(&pids.len()), "worker {port} ran its tasks on {} backends", pids.len());
        }
        assert!(took < SEQUENTIAL * 2 / 3, "4 connections per worker: {took:?}");
    }
    c.batch_execute("SET citus.max_adaptive_executor_pool_size = 1").await.unwrap();
    let (took, backends) = backends_per_worker(c, SLEEPY).await;
    for (port, pids) in &backends {
        assert_eq!(pids.len(), 1, "worker {port} at one connection per worker");
    }
    assert!(took >= SEQUENTIAL, "one connection per worker: {took:?}");
    c.batch_execute("SET citus.max_adaptive_executor_pool_size = 'lots'").await.unwrap();
    let e = c.simple_query(SLEEPY).await.unwrap_err();
    assert_eq!(sqlstate(&e), "22023", "{}", error_text(&e));
    c.batch_execute("SET citus.max_adaptive_executor_pool_size = 4").await.unwrap();
}

/// Bound parameters reach every connection's tasks, which prepare the
/// statement each on their own; rows combined by the coordinator are
/// complete.
async fn the_extended_protocol_shares_tasks_too(c: &Client) {
    let started = Instant::now();
    let rows =
        c.query("SELECT current_setting('port'), pg_backend_pid() FROM sleepy WHERE pg_sleep(0.3) IS NOT NULL AND id > $1", &[&0i32]).await.unwrap();
    let took = started.elapsed();
    assert_eq!(rows.len(), SHARDS as usize);
    let mut backends: BTreeMap<String, BTreeSet<i32>> = BTreeMap::new();
    for row in &rows {
        backends.entry(row.get(0)).or_default().insert(row.get(1));
    }
    assert!(backends.values().all(|pids| pids.len() > 1), "extended protocol: {backends:?}");
    assert!(took < SEQUENTIAL * 2 / 3, "extended protocol: {took:?}");
    let totals = c.query("SELECT count(*), sum(id) FROM sleepy WHERE id > $1", &[&0i32]).await.unwrap();
    let expected: i64 = one_key_per_shard().iter().map(|id| i64::from(*id)).sum();
    assert_eq!((totals[0].get::<_, i64>(0), totals[0].get::<_, i64>(1)), (i64::from(SHARDS), expected));
}

/// Inside a block that wrote, reads see the block's uncommitted rows (they
/// run on the block's connections), and a block's reads run on one
/// backend per worker.
async fn a_block_keeps_one_connection_and_sees_its_writes(c: &Client) {
    c.batch_execute("BEGIN; INSERT INTO notes SELECT g, 'note ' || g FROM generate_series(1, 200) g").await.unwrap();
    assert_eq!(text_rows(c, "SELECT count(*), sum(id) FROM notes").await, vec![vec![Some("200".into()), Some("20100".into())]]);
    let mut ids: Vec<i32> = text_rows(c, "SELECT id FROM notes").await.iter().map(|r| r[0].as_deref().unwrap().parse().unwrap()).collect();
    ids.sort();
    assert_eq!(ids, (1..=200).collect::<Vec<_>>());
    let (_, backends) = backends_per_worker(c, "SELECT current_setting('port'), pg_backend_pid() FROM sleepy").await;
    assert!(backends.values().all(|pids| pids.len() == 1), "in a block: {backends:?}");
    c.batch_execute("ROLLBACK").await.unwrap();
    assert_eq!(text_rows(c, "SELECT count(*) FROM notes").await, vec![vec![Some("0".into())]]);
    // A read-only block keeps one connection per worker as well.
    c.batch_execute("BEGIN").await.unwrap();
    let (_, backends) = backends_per_worker(c, "SELECT current_setting('port'), pg_backend_pid() FROM sleepy").await;
    assert!(backends.values().all(|pids| pids.len() == 1), "in a read-only block: {backends:?}");
    c.batch_execute("COMMIT").await.unwrap();
}

/// The coordinator's backends on the workers still running a statement
/// (`pg_sleep`) or left inside a transaction.
async fn busy_backends(cluster: &TestCluster) -> Vec<String> {
    let mut busy = Vec::new();
    for w in 0..2 {
        let worker = cluster.connect_worker(w).await;
        for row in
            text_rows(&worker, "SELECT state || ': ' || query FROM pg_stat_activity WHERE application_name LIKE 'tessera:%' AND state <> 'idle'")
                .await
        {
            busy.push(row[0].clone().unwrap_or_default());
        }
    }
    busy
}

/// Waits up to `patience` for the workers to hold no busy coordinator backend.
async fn workers_go_quiet(cluster: &TestCluster, patience: Duration, after: &str) {
    let started = Instant::now();
    loop {
        let busy = busy_backends(cluster).await;
        if busy.is_empty() {
            return;
        }
        assert!(started.elapsed() < patience, "after {after}, the workers still run: {busy:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A statement whose tasks would sleep 3 s each fails 57014 soon after its
/// timeout, with nothing left running on any connection; the session goes on.
async fn statement_timeout_stops_every_connection(cluster: &TestCluster, c: &Client) {
    c.batch_execute("SET statement_timeout = '500ms'").await.unwrap();
    let started = Instant::now();
    let e = c.simple_query("SELECT pg_backend_pid(), pg_sleep(3) FROM sleepy").await.unwrap_err();
    let took = started.elapsed();
    assert_eq!(sqlstate(&e), "57014", "{}", error_text(&e));
    assert_eq!(e.as_db_error().unwrap().message(), "canceling statement due to statement timeout");
    assert!(took < Duration::from_millis(500 + 1500), "the timeout ended the statement after {took:?}");
    workers_go_quiet(cluster, Duration::from_secs(1), "the timeout").await;
    c.batch_execute("RESET statement_timeout").await.unwrap();
    assert_eq!(text_rows(c, "SELECT count(*) FROM sleepy").await, vec![vec![Some(SHARDS.to_string())]]);
}

/// A cancel request stops the statement's tasks on every connection, in
/// either protocol.
async fn a_cancel_request_stops_every_connection(cluster: &TestCluster) {
    for extended in [false, true] {
        let c = cluster.connect().await;
        c.batch_execute("SET citus.max_adaptive_executor_pool_size = 4").await.unwrap();
        let sql = "SELECT pg_backend_pid() FROM sleepy WHERE pg_sleep(3) IS NOT NULL";
        let after_cancel = common::cancelled_after_request(&c, sql, extended).await;
        assert!(after_cancel < Duration::from_millis(1500), "(extended: {extended}) ended {after_cancel:?} after the cancel request");
        workers_go_quiet(cluster, Duration::from_secs(1), "the cancel request").await;
        assert_eq!(text_rows(&c, "SELECT count(*) FROM sleepy").await, vec![vec![Some(SHARDS.to_string())]]);
    }
}

/// A division by zero on one shard fails the statement with the shard's
/// error; the other connections stop, go back clean, and the session's
/// next parallel read works.
async fn one_shards_error_fails_the_statement_cleanly(cluster: &TestCluster, c: &Client, zero_at: i32) {
    let sql = format!("SELECT pg_backend_pid(), pg_sleep(0.3), 1 / (id - {zero_at}) FROM sleepy");
    let e = c.simple_query(&sql).await.unwrap_err();
    assert_eq!(sqlstate(&e), "22012", "{}", error_text(&e));
    workers_go_quiet(cluster, Duration::from_secs(2), "the division by zero").await;
    let (_, backends) = backends_per_worker(c, SLEEPY).await;
    assert!(backends.values().all(|pids| pids.len() > 1), "after the error: {backends:?}");
}

/// Rows from every connection go into the one combine, which keeps at most
/// half the statement's memory limit and spills the rest to a file: a
/// DISTINCT whose shards send 1.6 million values to be combined answers
/// under a 4 MB limit, exactly, and the session goes on.
async fn a_combine_past_the_memory_limit_spills(c: &Client) {
    c.batch_execute("SET tessera.max_statement_memory = '4MB'").await.unwrap();
    let counted = text_rows(c, "SELECT count(DISTINCT id * 1000000 + g) FROM sleepy, generate_series(1, 100000) g").await;
    assert_eq!(counted, vec![vec![Some((SHARDS * 100_000).to_string())]]);
    c.batch_execute("RESET tessera.max_statement_memory").await.unwrap();
    assert_eq!(text_rows(c, "SELECT count(*) FROM sleepy").await, vec![vec![Some(SHARDS.to_string())]]);
}

/// With pools of 2 connections per worker and 3 allowed per statement, a
/// read runs on 2 (it takes what is free, never waits for more); `tessera
/// status` shows the configured limit.
async fn the_pools_limits_hold(cluster: &TestCluster) {
    cluster.restart_coordinator(|config| {
        config.connections.max_per_node = Some(2);
        config.connections.max_adaptive_executor_pool_size = Some(3);
    });
    let c = cluster.connect().await;
    let (took, backends) = backends_per_worker(&c, SLEEPY).await;
    assert!(backends.values().all(|pids| pids.len() == 2), "pools of two: {backends:?}");
    assert!(took < SEQUENTIAL * 3 / 4, "two connections per worker: {took:?}");
    // Another session's read meanwhile waits for no more than the pool holds.
    let other = cluster.connect().await;
    let (first, second) = tokio::join!(backends_per_worker(&c, SLEEPY), backends_per_worker(&other, SLEEPY));
    for (_, backends) in [first, second] {
        assert!(backends.values().all(|pids| !pids.is_empty() && pids.len() <= 2), "{backends:?}");
    }
    let status =
        std::process::Command::new(common::tessera_bin()).args(["status", "--data-dir"]).arg(cluster.data_dir()).output().expect("tessera status");
    let text = String::from_utf8_lossy(&status.stdout);
    assert!(text.contains("up to 3 connections per worker"), "{text}");
}
