//! `citus_create_restore_point` under a running workload, and a real
//! point-in-time restore of every node to it: transfers between accounts on
//! different workers (each a two-phase commit) keep committing while the
//! point is made; afterwards every node is stopped as a crash would stop it
//! and recovered to the named point, the coordinator starts again, and the
//! cluster it shows is consistent: no money made or lost, every account's
//! balance matching its ledger, the reference table alike on every worker,
//! what was written before the point there and what came after it gone.

mod common;

use common::TestCluster;
use rand::{Rng, SeedableRng};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tessera::cluster::instance::Instance;

const ACCOUNTS: i32 = 100;
const INITIAL_BALANCE: i64 = 1000;
const CLIENTS: u64 = 4;
const POINT: &str = "before_the_mistake";

/// Transfers money between a worker-0 account and a worker-1 account until
/// told to stop; returns how many committed.
async fn transfer_until(port: u16, accounts: Arc<[Vec<i32>; 2]>, seed: u64, stop: Arc<AtomicBool>, committed: Arc<AtomicU64>) {
    let c = common::connect(port).await;
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    while !stop.load(SeqCst) {
        let a = accounts[0][rng.gen_range(0..accounts[0].len())];
        let b = accounts[1][rng.gen_range(0..accounts[1].len())];
        let amount: i64 = rng.gen_range(1..=50);
        // Worker-0 rows first in every transfer, so transfers never deadlock.
        let sql = format!(
            "BEGIN;
             UPDATE accounts SET balance = balance - {amount} WHERE id = {a};
             UPDATE accounts SET balance = balance + {amount} WHERE id = {b};
             INSERT INTO ledger (account, amount) VALUES ({a}, -{amount}), ({b}, {amount});
             COMMIT"
        );
        c.batch_execute(&sql).await.unwrap_or_else(|e| panic!("transfer: {}", common::error_text(&e)));
        committed.fetch_add(1, SeqCst);
    }
}

/// Where `node`'s base backup goes.
fn backup_dir(node: &Instance) -> PathBuf {
    node.data_dir.with_extension("backup")
}

/// A base backup of running `node`, as an operator takes them for
/// point-in-time recovery.
fn take_base_backup(node: &Instance) {
    let basebackup = tessera::cluster::instance::pg_bin_dir().unwrap().join("pg_basebackup");
    let dir = backup_dir(node);
    // Over the node's socket: over TCP it takes only the cluster's certificates.
    let socket = node.data_dir.to_string_lossy().to_string();
    let status = std::process::Command::new(basebackup)
        .args([
            "-h",
            &socket,
            "-p",
            &node.port.to_string(),
            "-U",
            "postgres",
            "-D",
            &dir.to_string_lossy(),
            "-X",
            "stream",
            "-c",
            "fast",
            "--no-sync",
        ])
        .status()
        .unwrap();
    assert!(status.success(), "pg_basebackup of {}", node.data_dir.display());
    // The backup copies the lock file of the socket in the data directory.
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.file_name().unwrap().to_string_lossy().starts_with(".s.PGSQL.") {
            std::fs::remove_file(path).unwrap();
        }
    }
    tessera::cluster::instance::prepare_dir(&dir).unwrap();
}

/// Stops `node` as a crash would, puts its base backup in its place and
/// makes its next start replay the crashed server's WAL up to the restore
/// point named `POINT`, then promote.
fn restore_to_point(node: &Instance) {
    node.kill().expect("immediate shutdown");
    let crashed = node.data_dir.with_extension("crashed");
    std::fs::rename(&node.data_dir, &crashed).unwrap();
    std::fs::rename(backup_dir(node), &node.data_dir).unwrap();
    let conf = node.data_dir.join("postgresql.conf");
    let mut text = std::fs::read_to_string(&conf).unwrap();
    // The crashed server's pg_wal serves as the WAL archive.
    text.push_str(&format!(
        "\nrestore_command = 'cp {}/pg_wal/%f %p'\nrecovery_target_name = '{POINT}'\nrecovery_target_action = 'promote'\n",
        crashed.display()
    ));
    std::fs::write(&conf, text).unwrap();
    std::fs::write(node.data_dir.join("recovery.signal"), "").unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restore_to_the_point_gives_a_consistent_cluster() {
    let cluster = TestCluster::start(2);
    let c = cluster.connect().await;
    c.batch_execute(&format!(
        "CREATE TABLE accounts (id int PRIMARY KEY, balance bigint NOT NULL);
         SELECT create_distributed_table('accounts', 'id', shard_count => 8);
         INSERT INTO accounts SELECT g, {INITIAL_BALANCE} FROM generate_series(1, {ACCOUNTS}) g;
         CREATE TABLE ledger (account int NOT NULL, amount bigint NOT NULL);
         SELECT create_distributed_table('ledger', 'account', colocate_with => 'accounts');
         CREATE TABLE markers (name text PRIMARY KEY);
         SELECT create_reference_table('markers');
         INSERT INTO markers VALUES ('before');
         CREATE ROLE app LOGIN"
    ))
    .await
    .unwrap();

    // What a caller gets wrong is refused before anything is done.
    let app = common::connect_as(cluster.port, "app").await;
    let e = app.simple_query(&format!("SELECT citus_create_restore_point('{POINT}')")).await.unwrap_err();
    assert_eq!(common::sqlstate(&e), "42501", "{}", common::error_text(&e));
    c.batch_execute("BEGIN").await.unwrap();
    let e = c.simple_query(&format!("SELECT citus_create_restore_point('{POINT}')")).await.unwrap_err();
    assert_eq!(common::sqlstate(&e), "25001", "{}", common::error_text(&e));
    c.batch_execute("ROLLBACK").await.unwrap();
    let e = c.simple_query(&format!("SELECT citus_create_restore_point('{}')", "x".repeat(64))).await.unwrap_err();
    assert_eq!(common::sqlstate(&e), "22023", "{}", common::error_text(&e));

    // A decision under way on a worker (its commit record written, its
    // COMMIT not yet through) holds the point back, past the first
    // attempt's lock timeout, until it is through.
    let w = cluster.connect_worker(1).await;
    w.batch_execute("BEGIN; SELECT tessera_commit.record_commit()").await.unwrap();
    let port = cluster.port;
    let waiting = tokio::spawn(async move {
        common::connect(port).await.simple_query("SELECT citus_create_restore_point('held_back')").await.map(|_| Instant::now())
    });
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert!(!waiting.is_finished(), "the restore point did not wait for the decision under way");
    let decided = Instant::now();
    w.batch_execute("COMMIT").await.unwrap();
    let made = waiting.await.unwrap().unwrap_or_else(|e| panic!("{}", common::error_text(&e)));
    assert!(made > decided);
    drop(w);

    let ports = common::placement_ports(&c, "accounts").await;
    let worker_ports: Vec<i32> = cluster.cluster.state.worker_ports.iter().map(|p| i32::from(*p)).collect();
    let mut accounts = [Vec::new(), Vec::new()];
    for id in 1..=ACCOUNTS {
        let port = ports[common::shard_of_int4(id, 8)];
        accounts[worker_ports.iter().position(|p| *p == port).unwrap()].push(id);
    }
    assert!(!accounts[0].is_empty() && !accounts[1].is_empty(), "accounts on both workers");
    let accounts = Arc::new(accounts);

    let nodes: Vec<Instance> = std::iter::once(cluster.cluster.coordinator_db()).chain(cluster.workers()).collect();
    for node in &nodes {
        take_base_backup(node);
    }

    let stop = Arc::new(AtomicBool::new(false));
    let committed = Arc::new(AtomicU64::new(0));
    let clients: Vec<_> =
        (0..CLIENTS).map(|n| tokio::spawn(transfer_until(cluster.port, accounts.clone(), n, stop.clone(), committed.clone()))).collect();
    let wait_for_transfers = |n: u64| {
        let committed = committed.clone();
        async move {
            let target = committed.load(SeqCst) + n;
            let start = Instant::now();
            while committed.load(SeqCst) < target {
                assert!(start.elapsed() < Duration::from_secs(60), "transfers stopped committing");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    };
    wait_for_transfers(100).await;
    let point = common::text_rows(&c, &format!("SELECT citus_create_restore_point('{POINT}')")).await;
    let lsn = point[0][0].clone().expect("the point's WAL location");
    let behind: bool =
        cluster.connect_coordinator_db().await.query_one("SELECT pg_current_wal_insert_lsn() >= $1::text::pg_lsn", &[&lsn]).await.unwrap().get(0);
    assert!(behind, "the point's location {lsn} is in the coordinator database's WAL");
    // Transfers went on while the point was made, and after it.
    wait_for_transfers(100).await;
    c.batch_execute("INSERT INTO markers VALUES ('after')").await.unwrap();
    stop.store(true, SeqCst);
    for client in clients {
        client.await.unwrap();
    }
    let transfers_before_restore: i64 = c.query_one("SELECT count(*) FROM ledger", &[]).await.unwrap().get(0);
    drop((c, app));

    // Restore every node to the point.
    cluster.stop_coordinator();
    for node in &nodes {
        restore_to_point(node);
    }
    for node in &nodes {
        if let Err(e) = node.start() {
            let log = std::fs::read_to_string(node.data_dir.join("server.log")).unwrap_or_default();
            panic!("{e:#}; the server's log:\n{log}");
        }
    }
    cluster.start_coordinator(|_| {});
    cluster.wait_for_coordinator();
    let c = cluster.connect().await;
    // Parts prepared at the point are settled by recovery.
    let start = Instant::now();
    while cluster.prepared_on_workers().await > 0 {
        assert!(start.elapsed() < Duration::from_secs(30), "prepared transactions were left after the restore");
        c.simple_query("SELECT recover_prepared_transactions()").await.unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let total: i64 = c.query_one("SELECT sum(balance)::bigint FROM accounts", &[]).await.unwrap().get(0);
    assert_eq!(total, i64::from(ACCOUNTS) * INITIAL_BALANCE, "money was made or lost");
    let mismatched: i64 = c
        .query_one(
            &format!(
                "SELECT count(*) FROM accounts a LEFT JOIN (SELECT account, sum(amount) AS moved FROM ledger GROUP BY account) l ON l.account = a.id
                 WHERE a.balance <> {INITIAL_BALANCE} + coalesce(l.moved, 0)"
            ),
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(mismatched, 0, "accounts whose balance disagrees with their ledger");
    let restored: i64 = c.query_one("SELECT count(*) FROM ledger", &[]).await.unwrap().get(0);
    assert!(
        restored > 0 && restored < transfers_before_restore,
        "the restore went back to the point ({restored} of {transfers_before_restore} ledger rows)"
    );
    for i in 0..2 {
        let w = cluster.connect_worker(i).await;
        let names: String = w.query_one("SELECT string_agg(name, ',' ORDER BY name) FROM markers", &[]).await.unwrap().get(0);
        assert_eq!(names, "before", "worker {i}'s copy of the reference table");
    }
    // The cluster takes writes again.
    c.batch_execute("UPDATE accounts SET balance = balance + 1 WHERE id IN (1, 2); INSERT INTO markers VALUES ('restored')").await.unwrap();
}
