//! Automatic failover (`[failover]`, `tessera up --standbys 1`): a worker's
//! primary killed with SIGKILL under a write load of eight clients. Clients
//! see errors only while the coordinator notices and promotes the standby;
//! every commit a client was told of is there afterwards, the books
//! balance, nothing stays prepared, and the old primary is not started
//! again but becomes the new primary's standby.

mod common;
use common::{text_rows, TestCluster};
use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const ACCOUNTS: i32 = 1000;
const CLIENTS: i32 = 8;

/// What the clients saw: the (client, seq) pairs whose COMMIT succeeded and
/// when each failure happened.
#[derive(Default)]
struct Outcomes {
    acknowledged: Vec<(i32, i32)>,
    failures: Vec<Instant>,
    last_failure_message: String,
}

async fn client_loop(port: u16, client: i32, stop: Arc<AtomicBool>, outcomes: Arc<Mutex<Outcomes>>) {
    let mut conn = common::connect(port).await;
    let mut seq = 0;
    while !stop.load(Ordering::Relaxed) {
        seq += 1;
        let a = (client * 7919 + seq * 104729) % ACCOUNTS + 1;
        let b = (a + ACCOUNTS / 2) % ACCOUNTS + 1;
        let delta = seq % 9 - 4;
        // Every third transaction moves money between two accounts, on two
        // workers as often as not: a two-phase commit.
        let sql = if seq % 3 == 0 {
            format!(
                "BEGIN; UPDATE fo_accounts SET balance = balance - {delta} WHERE id = {a}; UPDATE fo_accounts SET balance = balance + {delta} WHERE id = {b};
                 INSERT INTO fo_history VALUES ({a}, {client}, {seq}, {}), ({b}, {client}, {seq}, {delta}); COMMIT",
                -delta
            )
        } else {
            format!("BEGIN; UPDATE fo_accounts SET balance = balance + {delta} WHERE id = {a}; INSERT INTO fo_history VALUES ({a}, {client}, {seq}, {delta}); COMMIT")
        };
        match conn.batch_execute(&sql).await {
            Ok(()) => outcomes.lock().unwrap().acknowledged.push((client, seq)),
            Err(e) => {
                {
                    let mut seen = outcomes.lock().unwrap();
                    seen.failures.push(Instant::now());
                    seen.last_failure_message = common::error_text(&e);
                }
                if conn.is_closed() || conn.batch_execute("ROLLBACK").await.is_err() {
                    while !stop.load(Ordering::Relaxed) {
                        match common::try_connect(port).await {
                            Ok(c) => {
                                conn = c;
                                break;
                            }
                            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
                        }
                    }
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

#[tokio::test]
async fn a_killed_worker_primary_fails_over_with_no_acknowledged_commit_lost() {
    let cluster = TestCluster::start(2);
    cluster.restart_coordinator(|config| {
        config.failover.health_check_interval_secs = 0.5;
        config.failover.failure_timeout_secs = 2.0;
        config.transactions.recovery_interval_secs = 1.0;
    });
    let c = cluster.connect().await;
    c.batch_execute(&format!(
        "CREATE TABLE fo_accounts (id int PRIMARY KEY, balance bigint NOT NULL);
         CREATE TABLE fo_history (id int, client int, seq int, delta int);
         SELECT create_distributed_table('fo_accounts', 'id', shard_count => 4);
         SELECT create_distributed_table('fo_history', 'id', colocate_with => 'fo_accounts');
         INSERT INTO fo_accounts SELECT g, 0 FROM generate_series(1, {ACCOUNTS}) g;"
    ))
    .await
    .unwrap();
    let local = cluster.add_standbys().await;
    let pairs = local.pairs();
    assert_eq!(pairs.len(), 2, "a standby per worker");
    let roles = text_rows(&c, "SELECT noderole, count(*) FROM pg_dist_node GROUP BY 1 ORDER BY 1").await;
    assert_eq!(roles, vec![vec![Some("primary".into()), Some("2".into())], vec![Some("secondary".into()), Some("2".into())]], "{roles:?}");
    let (victim, successor) = (pairs[0].servers[0].clone(), pairs[0].servers[1].clone());
    let sync = text_rows(&common::connect(victim.port).await, "SELECT sync_state FROM pg_stat_replication").await;
    assert_eq!(sync, vec![vec![Some("sync".into())]], "the standby replicates synchronously");

    let stop = Arc::new(AtomicBool::new(false));
    let outcomes = Arc::new(Mutex::new(Outcomes::default()));
    let clients: Vec<_> = (1..=CLIENTS).map(|n| tokio::spawn(client_loop(cluster.port, n, stop.clone(), outcomes.clone()))).collect();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let before_kill = outcomes.lock().unwrap().acknowledged.len();
    assert!(before_kill > 20, "the clients commit before the kill: {before_kill}");

    // SIGKILL of the postmaster: no shutdown, its backends die as they notice.
    let pid: i32 = std::fs::read_to_string(victim.data_dir.join("postmaster.pid")).unwrap().lines().next().unwrap().trim().parse().unwrap();
    let killed_at = Instant::now();
    // SAFETY: plain signal delivery to the test's own PostgreSQL server.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0);
    // Until the clients commit again for a few seconds after the failover.
    let deadline = killed_at + Duration::from_secs(40);
    loop {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let seen = outcomes.lock().unwrap();
        let settled = seen.failures.last().is_some_and(|last| last.elapsed() > Duration::from_secs(4));
        if settled || Instant::now() > deadline {
            break;
        }
    }
    stop.store(true, Ordering::Relaxed);
    for client in clients {
        client.await.unwrap();
    }
    let seen = std::mem::take(&mut *outcomes.lock().unwrap());
    let (first, last) = (*seen.failures.first().expect("the kill failed some transactions"), *seen.failures.last().unwrap());
    let window = last.duration_since(first.min(killed_at));
    eprintln!(
        "failover: {} failed transactions over {:.1} s after the kill; {} acknowledged in all",
        seen.failures.len(),
        window.as_secs_f64(),
        seen.acknowledged.len()
    );
    assert!(window <= Duration::from_secs(10), "clients saw errors for {:.1} s (last: {})", window.as_secs_f64(), seen.last_failure_message);
    assert!(seen.acknowledged.len() > before_kill + 20, "the clients commit again after the failover");

    // The node is the standby now, under the same id; the standby row is gone.
    let ports: Vec<u16> = text_rows(&c, "SELECT nodeport FROM pg_dist_node WHERE noderole = 'primary'")
        .await
        .into_iter()
        .map(|r| r[0].as_deref().unwrap().parse().unwrap())
        .collect();
    assert!(ports.contains(&successor.port) && !ports.contains(&victim.port), "{ports:?}");
    // Every acknowledged commit is there, and the books balance.
    let stored: HashSet<(i32, i32)> = text_rows(&c, "SELECT DISTINCT client, seq FROM fo_history")
        .await
        .into_iter()
        .map(|r| (r[0].as_deref().unwrap().parse().unwrap(), r[1].as_deref().unwrap().parse().unwrap()))
        .collect();
    let lost: Vec<_> = seen.acknowledged.iter().filter(|ack| !stored.contains(ack)).collect();
    assert!(lost.is_empty(), "{} acknowledged commits are missing: {:?}", lost.len(), &lost[..lost.len().min(10)]);
    let books = text_rows(&c, "SELECT (SELECT sum(balance) FROM fo_accounts) = (SELECT coalesce(sum(delta), 0) FROM fo_history)").await;
    assert_eq!(books, vec![vec![Some("t".into())]], "sum of balances = sum of history deltas");
    // Nothing stays in doubt on any primary.
    let mut in_doubt = -1;
    for _ in 0..40 {
        in_doubt = 0;
        for port in ports.iter().filter(|p| **p != cluster.cluster.state.coordinator_db_port) {
            let n = text_rows(&common::connect(*port).await, "SELECT count(*) FROM pg_prepared_xacts").await;
            in_doubt += n[0][0].as_deref().unwrap().parse::<i32>().unwrap();
        }
        if in_doubt == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert_eq!(in_doubt, 0, "prepared transactions left in doubt");

    // The old primary stays down through `tessera up`, and `--standbys 1`
    // makes it the new primary's standby.
    let local = cluster.add_standbys().await;
    assert!(victim.data_dir.join("standby.signal").exists(), "the old primary is a standby now");
    let sync = text_rows(&common::connect(successor.port).await, "SELECT sync_state FROM pg_stat_replication").await;
    assert_eq!(sync, vec![vec![Some("sync".into())]]);
    let status = std::process::Command::new(common::tessera_bin()).args(["status", "--data-dir"]).arg(&local.dir).output().unwrap();
    let status = String::from_utf8_lossy(&status.stdout);
    assert!(status.contains(&format!("primary 127.0.0.1:{}, standby 127.0.0.1:{} streaming, sync", successor.port, victim.port)), "{status}");
}
