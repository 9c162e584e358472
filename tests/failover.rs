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
    let cluster = cluster_failing_over_fast(|_| {});
    let c = cluster.connect().await;
    create_bank(&c).await;
    let mut local = cluster.add_standbys().await;
    let workers = |local: &tessera::cluster::LocalCluster| local.pairs().into_iter().filter(|p| p.name.starts_with("worker")).collect::<Vec<_>>();
    assert_eq!(local.pairs().len(), 3, "a standby per worker and one for the coordinator database");
    let roles = text_rows(&c, "SELECT groupid = 0, noderole, count(*) FROM pg_dist_node GROUP BY 1, 2 ORDER BY 1, 2").await;
    let row = |group_zero: &str, role: &str, n: &str| vec![Some(group_zero.to_string()), Some(role.to_string()), Some(n.to_string())];
    assert_eq!(roles, vec![row("f", "primary", "2"), row("f", "secondary", "2"), row("t", "secondary", "1")], "{roles:?}");
    c.batch_execute("CREATE ROLE fo_app LOGIN").await.unwrap();
    let refused = common::connect_as(cluster.port, "fo_app")
        .await
        .batch_execute("SELECT citus_add_secondary_node('127.0.0.1', 1, '127.0.0.1', 2)")
        .await
        .unwrap_err();
    assert_eq!(common::sqlstate(&refused), "42501");

    let stop = Arc::new(AtomicBool::new(false));
    let outcomes = Arc::new(Mutex::new(Outcomes::default()));
    let clients: Vec<_> = (1..=CLIENTS).map(|n| tokio::spawn(client_loop(cluster.port, n, stop.clone(), outcomes.clone()))).collect();
    tokio::time::sleep(Duration::from_secs(2)).await;
    // bench/failover.sh repeats the failover, each worker's in turn.
    let repetitions: usize = std::env::var("FAILOVER_REPETITIONS").ok().and_then(|n| n.parse().ok()).unwrap_or(1);
    for repetition in 0..repetitions {
        let pair = &workers(&local)[repetition % 2];
        let primaries = primary_ports(&c).await;
        let victim = pair.servers.iter().find(|s| primaries.contains(&s.port)).expect("a primary").clone();
        let successor = pair.servers.iter().find(|s| s.port != victim.port).unwrap().clone();
        let sync = text_rows(&common::connect(victim.port).await, "SELECT sync_state FROM pg_stat_replication").await;
        assert_eq!(sync, vec![vec![Some("sync".into())]], "the standby replicates synchronously");
        let before_kill = outcomes.lock().unwrap().acknowledged.len();

        // SIGKILL of the postmaster: no shutdown, its backends die as they notice.
        let pid: i32 = std::fs::read_to_string(victim.data_dir.join("postmaster.pid")).unwrap().lines().next().unwrap().trim().parse().unwrap();
        let killed_at = Instant::now();
        // SAFETY: plain signal delivery to the test's own PostgreSQL server.
        assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0);
        // Until the clients have committed for a few seconds after the failover.
        let deadline = killed_at + Duration::from_secs(40);
        let (failed, window, last_message) = loop {
            tokio::time::sleep(Duration::from_millis(500)).await;
            let seen = outcomes.lock().unwrap();
            let since_kill: Vec<Instant> = seen.failures.iter().copied().filter(|t| *t >= killed_at).collect();
            let settled = since_kill.last().is_some_and(|last| last.elapsed() > Duration::from_secs(4));
            if settled || Instant::now() > deadline {
                let window = since_kill.last().map(|last| last.duration_since(killed_at)).unwrap_or_default();
                break (since_kill.len(), window, seen.last_failure_message.clone());
            }
        };
        let committed = outcomes.lock().unwrap().acknowledged.len() - before_kill;
        eprintln!(
            "failover {}: clients saw errors for {:.1} s after the kill ({failed} failed transactions, {committed} committed)",
            repetition + 1,
            window.as_secs_f64()
        );
        assert!(failed > 0, "the kill failed some transactions");
        assert!(window <= Duration::from_secs(10), "clients saw errors for {:.1} s (last: {last_message})", window.as_secs_f64());
        assert!(committed > 20, "the clients commit again after the failover");
        // The node is the standby now, under the same id; the standby row is gone.
        let ports = primary_ports(&c).await;
        assert!(ports.contains(&successor.port) && !ports.contains(&victim.port), "{ports:?}");
        let secondaries = text_rows(&c, "SELECT count(*) FROM pg_dist_node WHERE noderole = 'secondary' AND groupid <> 0").await;
        assert_eq!(secondaries, vec![vec![Some("1".into())]]);

        // The old primary stays down through `tessera up`, and
        // `--standbys 1` makes it the new primary's standby.
        local = cluster.add_standbys().await;
        assert!(victim.data_dir.join("standby.signal").exists(), "the old primary is a standby now");
        let sync = text_rows(&common::connect(successor.port).await, "SELECT sync_state FROM pg_stat_replication").await;
        assert_eq!(sync, vec![vec![Some("sync".into())]]);
        let status = std::process::Command::new(common::tessera_bin()).args(["status", "--data-dir"]).arg(&local.dir).output().unwrap();
        let status = String::from_utf8_lossy(&status.stdout);
        assert!(status.contains(&format!("primary 127.0.0.1:{}, standby 127.0.0.1:{} streaming, sync", successor.port, victim.port)), "{status}");
    }
    stop.store(true, Ordering::Relaxed);
    for client in clients {
        client.await.unwrap();
    }
    let seen = std::mem::take(&mut *outcomes.lock().unwrap());
    let ports: Vec<u16> = primary_ports(&c).await;
    nothing_lost(&c, &seen.acknowledged, &ports).await;
}

/// The ports of the nodes the catalog names primaries.
async fn primary_ports(c: &tokio_postgres::Client) -> Vec<u16> {
    text_rows(c, "SELECT nodeport FROM pg_dist_node WHERE noderole = 'primary'")
        .await
        .into_iter()
        .map(|r| r[0].as_deref().unwrap().parse().unwrap())
        .collect()
}

/// A cluster whose coordinator checks every 0.5 s and fails over after 2 s
/// of silence, settling prepared transactions every second, its
/// configuration then changed by `edit`.
fn cluster_failing_over_fast(edit: impl FnOnce(&mut tessera::config::Config)) -> TestCluster {
    let cluster = TestCluster::start(2);
    cluster.restart_coordinator(|config| {
        config.failover.health_check_interval_secs = 0.5;
        config.failover.failure_timeout_secs = 2.0;
        config.transactions.recovery_interval_secs = 1.0;
        edit(config);
    });
    cluster
}

async fn create_bank(c: &tokio_postgres::Client) {
    c.batch_execute(&format!(
        "CREATE TABLE fo_accounts (id int PRIMARY KEY, balance bigint NOT NULL);
         CREATE TABLE fo_history (id int, client int, seq int, delta int);
         SELECT create_distributed_table('fo_accounts', 'id', shard_count => 4);
         SELECT create_distributed_table('fo_history', 'id', colocate_with => 'fo_accounts');
         INSERT INTO fo_accounts SELECT g, 0 FROM generate_series(1, {ACCOUNTS}) g;"
    ))
    .await
    .unwrap();
}

/// Every acknowledged commit is there, the books balance, and nothing
/// stays prepared on the workers at `ports` (once recovery had its turn).
async fn nothing_lost(c: &tokio_postgres::Client, acknowledged: &[(i32, i32)], ports: &[u16]) {
    let stored: HashSet<(i32, i32)> = text_rows(c, "SELECT DISTINCT client, seq FROM fo_history")
        .await
        .into_iter()
        .map(|r| (r[0].as_deref().unwrap().parse().unwrap(), r[1].as_deref().unwrap().parse().unwrap()))
        .collect();
    let lost: Vec<_> = acknowledged.iter().filter(|ack| !stored.contains(ack)).collect();
    assert!(lost.is_empty(), "{} of {} acknowledged commits are missing: {:?}", lost.len(), acknowledged.len(), &lost[..lost.len().min(10)]);
    let books = text_rows(c, "SELECT (SELECT sum(balance) FROM fo_accounts) = (SELECT coalesce(sum(delta), 0) FROM fo_history)").await;
    assert_eq!(books, vec![vec![Some("t".into())]], "sum of balances = sum of history deltas");
    let mut in_doubt = -1;
    for _ in 0..60 {
        in_doubt = 0;
        for port in ports {
            let n = text_rows(&common::connect(*port).await, "SELECT count(*) FROM pg_prepared_xacts").await;
            in_doubt += n[0][0].as_deref().unwrap().parse::<i32>().unwrap();
        }
        if in_doubt == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert_eq!(in_doubt, 0, "prepared transactions left in doubt");
}

/// A coordinator process killed with SIGKILL under load: the clients of a
/// second coordinator over the same catalog see no error, the first one's
/// clients get back in once `tessera up` has started it again, and nothing
/// it had acknowledged is lost nor left in doubt.
#[tokio::test(flavor = "multi_thread")]
async fn a_killed_coordinator_loses_nothing_while_a_second_one_serves() {
    let cluster = TestCluster::start(2);
    create_bank(&cluster.connect().await).await;
    let (_second, second_port) = cluster.start_second_coordinator(|_| {}).await;
    let stop = Arc::new(AtomicBool::new(false));
    let (on_first, on_second) = (Arc::new(Mutex::new(Outcomes::default())), Arc::new(Mutex::new(Outcomes::default())));
    let clients: Vec<_> = (1..=CLIENTS)
        .map(|n| {
            let (port, seen) = if n % 2 == 0 { (cluster.port, on_first.clone()) } else { (second_port, on_second.clone()) };
            tokio::spawn(client_loop(port, n, stop.clone(), seen))
        })
        .collect();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let pid = cluster.cluster.coordinator_pid().expect("the coordinator runs");
    // SAFETY: plain signal delivery to the coordinator process the test's cluster started.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0);
    cluster.wait_for_coordinator_exit();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let before_restart = on_first.lock().unwrap().acknowledged.len();
    // What `tessera up` does for a coordinator that is not running.
    cluster.start_coordinator(|_| {});
    cluster.wait_for_coordinator();
    tokio::time::sleep(Duration::from_secs(3)).await;
    stop.store(true, Ordering::Relaxed);
    for client in clients {
        client.await.unwrap();
    }
    let first = std::mem::take(&mut *on_first.lock().unwrap());
    let second = std::mem::take(&mut *on_second.lock().unwrap());
    assert!(second.failures.is_empty(), "the second coordinator's clients saw errors: {}", second.last_failure_message);
    assert!(!first.failures.is_empty(), "the first coordinator's clients lost it");
    assert!(first.acknowledged.len() > before_restart, "the first coordinator's clients commit again once it is back");
    let acknowledged: Vec<(i32, i32)> = first.acknowledged.into_iter().chain(second.acknowledged).collect();
    let c = cluster.connect().await;
    nothing_lost(&c, &acknowledged, &cluster.cluster.state.worker_ports).await;
}

/// Rules that drop every packet to and from a local port, as a network
/// partition would; removed when dropped.
struct Cut(u16);

impl Cut {
    fn port(port: u16) -> Cut {
        for direction in ["--dport", "--sport"] {
            iptables("-I", direction, port);
        }
        Cut(port)
    }
}

impl Drop for Cut {
    fn drop(&mut self) {
        for direction in ["--dport", "--sport"] {
            iptables("-D", direction, self.0);
        }
    }
}

fn iptables(action: &str, direction: &str, port: u16) {
    let out = std::process::Command::new("iptables")
        .args([action, "INPUT", "-p", "tcp", "-i", "lo", direction, &port.to_string(), "-j", "DROP"])
        .output()
        .expect("iptables (scripts/setup.sh installs it)");
    assert!(out.status.success(), "iptables {action}: {}", String::from_utf8_lossy(&out.stderr));
}

/// A worker's primary cut off from the network for longer than the failure
/// timeout, with the coordinator reaching the nodes over TCP as between
/// hosts: statements waiting on it fail once the connection has gone
/// unanswered for the silence timeout, its standby is promoted, nothing
/// acknowledged is lost, and once the old primary is reachable again the
/// coordinator stops it rather than let it take a write.
#[tokio::test]
async fn a_primary_cut_off_fails_over_and_is_stopped_once_reachable() {
    let cluster = cluster_failing_over_fast(|config| {
        config.node_socket_directories.clear();
        config.connections.node_silence_timeout_secs = 3.0;
    });
    let c = cluster.connect().await;
    create_bank(&c).await;
    let local = cluster.add_standbys().await;
    let stop = Arc::new(AtomicBool::new(false));
    let outcomes = Arc::new(Mutex::new(Outcomes::default()));
    let clients: Vec<_> = (1..=CLIENTS).map(|n| tokio::spawn(client_loop(cluster.port, n, stop.clone(), outcomes.clone()))).collect();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let pair = local.pairs().into_iter().find(|p| p.name == "worker-1").expect("worker-1 has a standby");
    let primaries = primary_ports(&c).await;
    let victim = pair.servers.iter().find(|s| primaries.contains(&s.port)).expect("a primary").clone();
    let successor = pair.servers.iter().find(|s| s.port != victim.port).unwrap().clone();

    let cut = Cut::port(victim.port);
    let cut_at = Instant::now();
    let deadline = cut_at + Duration::from_secs(40);
    let window = loop {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let seen = outcomes.lock().unwrap();
        let last = seen.failures.iter().rev().find(|t| **t >= cut_at).copied();
        if last.is_some_and(|last| last.elapsed() > Duration::from_secs(4)) || Instant::now() > deadline {
            break last.map(|last| last.duration_since(cut_at));
        }
    };
    let window = window.expect("the cut failed some transactions");
    eprintln!("partition: clients saw errors for {:.1} s after the cut", window.as_secs_f64());
    assert!(window <= Duration::from_secs(10), "clients saw errors for {:.1} s", window.as_secs_f64());
    let ports = primary_ports(&c).await;
    assert!(ports.contains(&successor.port) && !ports.contains(&victim.port), "{ports:?}");
    assert!(victim.is_running(), "cut off, not dead");

    // Back on the network: the coordinator stops it.
    drop(cut);
    let back = Instant::now();
    while victim.is_running() {
        assert!(back.elapsed() < Duration::from_secs(20), "the old primary still runs");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert!(cluster.coordinator_log().contains("answers as a primary after its node failed over to its standby: stopping it"));
    // Bounded: once (of many runs, in a release build beside the ten
    // repeated failovers) a statement of `c`, a session older than the cut,
    // never returned here; a hang is to fail the test, not stall the suite.
    let checked = tokio::time::timeout(Duration::from_secs(60), async {
        stop.store(true, Ordering::Relaxed);
        for client in clients {
            client.await.unwrap();
        }
        let seen = std::mem::take(&mut *outcomes.lock().unwrap());
        nothing_lost(&c, &seen.acknowledged, &primary_ports(&c).await).await;
    })
    .await;
    assert!(checked.is_ok(), "the checks after the partition did not finish; the coordinator's log ends:\n{}", cluster.coordinator_log_tail());
}

/// The coordinator database's primary killed with SIGKILL under the write
/// load: every coordinator moves to its promoted standby (the catalog and
/// the two-phase commits' records are there, replicated synchronously),
/// clients see errors only meanwhile, nothing acknowledged is lost or left
/// in doubt, and `tessera up --standbys 1` makes the old server its standby.
#[tokio::test]
async fn a_killed_coordinator_database_fails_over_with_no_acknowledged_commit_lost() {
    let cluster = cluster_failing_over_fast(|_| {});
    create_bank(&cluster.connect().await).await;
    let local = cluster.add_standbys().await;
    let victim = local.coordinator_db();
    let pair = local.pairs().into_iter().find(|p| p.name == "coordinator-db").expect("the coordinator database has a standby");
    let successor = pair.servers.iter().find(|s| s.port != victim.port).unwrap().clone();
    let sync = text_rows(&common::connect(victim.port).await, "SELECT sync_state FROM pg_stat_replication").await;
    assert_eq!(sync, vec![vec![Some("sync".into())]], "the standby replicates synchronously");

    let stop = Arc::new(AtomicBool::new(false));
    let outcomes = Arc::new(Mutex::new(Outcomes::default()));
    let clients: Vec<_> = (1..=CLIENTS).map(|n| tokio::spawn(client_loop(cluster.port, n, stop.clone(), outcomes.clone()))).collect();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let before_kill = outcomes.lock().unwrap().acknowledged.len();
    let pid: i32 = std::fs::read_to_string(victim.data_dir.join("postmaster.pid")).unwrap().lines().next().unwrap().trim().parse().unwrap();
    let killed_at = Instant::now();
    // SAFETY: plain signal delivery to the test's own PostgreSQL server.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0);
    // Statements that need no catalog write go on meanwhile (a transaction
    // on one worker, or on two, decided there); DDL and commits decided in
    // the coordinator database wait for the move.
    let moved = format!("its standby 127.0.0.1:{} is the coordinator database now", successor.port);
    while !cluster.coordinator_log().contains(&moved) {
        assert!(killed_at.elapsed() < Duration::from_secs(30), "the coordinator did not move to the standby");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    eprintln!("coordinator database failover: moved {:.1} s after the kill", killed_at.elapsed().as_secs_f64());
    let moved_at = Instant::now();
    // DDL through the coordinator works on the new coordinator database.
    let ddl = loop {
        match cluster.connect().await.batch_execute("CREATE TABLE fo_after (id int); SELECT create_distributed_table('fo_after', 'id')").await {
            Ok(()) => break moved_at.elapsed(),
            Err(e) => assert!(moved_at.elapsed() < Duration::from_secs(10), "DDL fails after the move: {}", common::error_text(&e)),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop.store(true, Ordering::Relaxed);
    for client in clients {
        client.await.unwrap();
    }
    let seen = std::mem::take(&mut *outcomes.lock().unwrap());
    let failures: Vec<Instant> = seen.failures.iter().copied().filter(|t| *t >= killed_at).collect();
    let window = failures.last().map(|last| last.duration_since(killed_at)).unwrap_or_default();
    eprintln!(
        "coordinator database failover: clients saw {} errors over {:.1} s after the kill; DDL worked {:.1} s after the move",
        failures.len(),
        window.as_secs_f64(),
        ddl.as_secs_f64()
    );
    assert!(window <= Duration::from_secs(10), "clients saw errors for {:.1} s (last: {})", window.as_secs_f64(), seen.last_failure_message);
    assert!(seen.acknowledged.len() > before_kill + 20, "the clients commit after the failover");
    let c = cluster.connect().await;
    nothing_lost(&c, &seen.acknowledged, &primary_ports(&c).await).await;
    let records = text_rows(&common::connect(successor.port).await, "SELECT count(*) > 0 FROM tessera_commit.commit_records").await;
    assert_eq!(records.len(), 1);
    // `tessera up` finds the promoted standby the primary; --standbys 1
    // makes the old server its standby.
    let local = cluster.add_standbys().await;
    assert_eq!(local.coordinator_db().port, successor.port);
    assert!(victim.data_dir.join("standby.signal").exists(), "the old primary is a standby now");
    let status = std::process::Command::new(common::tessera_bin()).args(["status", "--data-dir"]).arg(&local.dir).output().unwrap();
    let status = String::from_utf8_lossy(&status.stdout);
    assert!(status.contains(&format!("primary 127.0.0.1:{}, standby 127.0.0.1:{} streaming, sync", successor.port, victim.port)), "{status}");
}
