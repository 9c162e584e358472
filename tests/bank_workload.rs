//! Atomicity under faults (issues 4 and 16): concurrent transfers between
//! accounts on different workers, each a two-phase commit, while the
//! coordinator process is killed twice in the middle of committing (once
//! before and once after the deciding worker's commit), each worker crashes
//! and restarts (the one that prepares, then the deciding one), and the
//! coordinator database is stopped for a while (transfers must keep
//! committing meanwhile). Afterwards no money was created or lost, every
//! transfer a client saw commit is there, every transfer that is there moved
//! exactly its amount, a transfer that failed before COMMIT is not there, and
//! nothing is left prepared.

mod common;

use common::TestCluster;
use rand::{Rng, SeedableRng};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering::SeqCst};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tessera::config::Fault;
use tokio_postgres::{Client, Statement};

const ACCOUNTS: i32 = 200;
const SHARDS: u32 = 8;
const INITIAL_BALANCE: i64 = 1000;
const CLIENTS: usize = 8;
/// Two-phase commits that get past the fault point before it kills the
/// coordinator: enough for every client to be busy committing by then.
const COMMITS_BEFORE_CRASH: u32 = 40;
/// Transfers acknowledged between the later steps of the fault script, so
/// each step hits the workload in full swing.
const TRANSFERS_BETWEEN_STEPS: u64 = 40;
/// The coordinator processes are numbered from 0; the last one runs without a fault.
const FINAL_COORDINATOR: u32 = 2;
/// Recovery runs often, so the run stays short.
const RECOVERY_INTERVAL_SECS: f64 = 0.5;
/// Longer than anything here should take; beyond it a statement or step hangs.
const PATIENCE: Duration = Duration::from_secs(30);

/// What the fault script and the clients share.
struct Workload {
    port: u16,
    /// The worker-0 and worker-1 accounts; a transfer takes one of each.
    accounts: [Vec<i32>; 2],
    /// Which coordinator process serves: bumped before each restart, so a
    /// session opened after reading it reached that process or a later one.
    coordinator: AtomicU32,
    acknowledged: AtomicU64,
    server_errors: AtomicU64,
    stop: AtomicBool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Outcome {
    /// COMMIT succeeded: the transfer must be there.
    Committed,
    /// A statement before COMMIT failed: the transfer must not be there.
    Failed,
    /// COMMIT failed or never answered: either way is fine, but all or nothing.
    Unknown,
}

#[derive(Clone, Copy, Debug)]
struct Transfer {
    id: i64,
    from: i32,
    to: i32,
    amount: i64,
    outcome: Outcome,
}

#[derive(Default)]
struct ClientLog {
    transfers: Vec<Transfer>,
    /// Errors the coordinator reported (rather than a lost connection): SQLSTATE and text.
    server_errors: Vec<String>,
}

struct Session {
    client: Client,
    update: Statement,
    log: Statement,
    coordinator: u32,
}

/// Connects to the coordinator, waiting while it restarts.
async fn open_session(w: &Workload) -> Session {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let coordinator = w.coordinator.load(SeqCst);
        let attempt = async {
            let client = common::try_connect(w.port).await?;
            let update = client.prepare("UPDATE accounts SET balance = balance + $2 WHERE id = $1").await?;
            let log = client.prepare("INSERT INTO transfers (id, src, dst, amount) VALUES ($1, $2, $3, $4)").await?;
            Ok::<_, tokio_postgres::Error>(Session { client, update, log, coordinator })
        };
        match attempt.await {
            Ok(s) => return s,
            Err(e) => assert!(Instant::now() < deadline, "the coordinator did not come back: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn within<T>(what: &str, f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(PATIENCE, f).await.unwrap_or_else(|_| panic!("{what} hung"))
}

enum Stage {
    BeforeCommit,
    Commit,
}

async fn transfer(s: &Session, t: &Transfer, from_on_worker_0: bool) -> Result<(), (Stage, tokio_postgres::Error)> {
    let c = &s.client;
    let before = |e| (Stage::BeforeCommit, e);
    within("BEGIN", c.batch_execute("BEGIN")).await.map_err(before)?;
    // The worker-0 account first: all transfers lock rows in the same order,
    // so they never deadlock and every error here comes from a fault.
    let (first, second) = if from_on_worker_0 { ((t.from, -t.amount), (t.to, t.amount)) } else { ((t.to, t.amount), (t.from, -t.amount)) };
    for (account, delta) in [first, second] {
        within("UPDATE", c.execute(&s.update, &[&account, &delta])).await.map_err(before)?;
    }
    within("INSERT", c.execute(&s.log, &[&t.id, &t.from, &t.to, &t.amount])).await.map_err(before)?;
    within("COMMIT", c.batch_execute("COMMIT")).await.map_err(|e| (Stage::Commit, e))
}

/// Transfers money until told to stop, through one session at a time: a new
/// one only when the coordinator process died.
async fn run_client(n: usize, w: Arc<Workload>) -> ClientLog {
    let mut rng = rand::rngs::StdRng::seed_from_u64(n as u64);
    let mut log = ClientLog::default();
    let mut session: Option<Session> = None;
    // After an error the same session must commit again before the client may
    // stop: the error ended a transaction, not the session.
    let mut owes_a_commit = false;
    for seq in 0.. {
        if w.stop.load(SeqCst) && !owes_a_commit {
            break;
        }
        let s = match &mut session {
            Some(s) => s,
            None => session.insert(open_session(&w).await),
        };
        let a = w.accounts[0][rng.gen_range(0..w.accounts[0].len())];
        let b = w.accounts[1][rng.gen_range(0..w.accounts[1].len())];
        let from_on_worker_0 = rng.gen_bool(0.5);
        let (from, to) = if from_on_worker_0 { (a, b) } else { (b, a) };
        let mut t = Transfer { id: ((n as i64) << 32) | seq, from, to, amount: rng.gen_range(1..=100), outcome: Outcome::Committed };
        match transfer(s, &t, from_on_worker_0).await {
            Ok(()) => {
                w.acknowledged.fetch_add(1, SeqCst);
                owes_a_commit = false;
            }
            Err((stage, e)) => {
                t.outcome = match stage {
                    Stage::BeforeCommit => Outcome::Failed,
                    Stage::Commit => Outcome::Unknown,
                };
                if e.as_db_error().is_some() {
                    let text = format!("{} {}", common::sqlstate(&e), common::error_text(&e));
                    within("ROLLBACK", s.client.batch_execute("ROLLBACK")).await.unwrap_or_else(|r| panic!("ROLLBACK after \"{text}\" failed: {r}"));
                    log.server_errors.push(text);
                    w.server_errors.fetch_add(1, SeqCst);
                    owes_a_commit = true;
                    // As an application would, rather than spin while the worker is down.
                    tokio::time::sleep(Duration::from_millis(10)).await;
                } else {
                    assert!(s.coordinator < FINAL_COORDINATOR, "client {n} lost its session to a coordinator that was not killed: {e}");
                    session = None;
                }
            }
        }
        log.transfers.push(t);
    }
    log
}

async fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < PATIENCE, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn wait_for_transfers(w: &Workload, n: u64) {
    let target = w.acknowledged.load(SeqCst) + n;
    wait_for("transfers to be acknowledged", || w.acknowledged.load(SeqCst) >= target).await;
}

/// Waits for the coordinator to die at `fault`, then starts the next one with
/// `next` (if any) injected.
async fn crash_and_restart(cluster: &Arc<TestCluster>, w: &Workload, fault: Fault, next: Option<Fault>) {
    wait_for(&format!("the coordinator to die at {fault:?}"), || cluster.cluster.coordinator_pid().is_none()).await;
    // Only the process configured with this fault can have logged it.
    assert!(
        cluster.coordinator_log().contains(&format!("stopping at {fault:?}")),
        "the coordinator died elsewhere; its log ends:\n{}",
        cluster.coordinator_log_tail()
    );
    w.coordinator.fetch_add(1, SeqCst);
    let cluster = cluster.clone();
    tokio::task::spawn_blocking(move || match next {
        // It may crash again before it is seen listening.
        Some(_) => cluster.start_coordinator(|c| c.transactions.fault_injection = next),
        None => cluster.restart_coordinator(|c| c.transactions.fault_injection = None),
    })
    .await
    .unwrap();
}

/// Stops worker `i` as a crash would, keeps it down until a client has seen
/// what that does to its transaction, then brings it back.
async fn crash_worker(cluster: &Arc<TestCluster>, w: &Workload, i: usize) {
    let errors = w.server_errors.load(SeqCst);
    let killer = cluster.clone();
    tokio::task::spawn_blocking(move || killer.kill_worker(i)).await.unwrap();
    wait_for(&format!("a client to notice worker {i} is gone"), || w.server_errors.load(SeqCst) > errors).await;
    let starter = cluster.clone();
    tokio::task::spawn_blocking(move || starter.start_worker(i)).await.unwrap();
    wait_for_transfers(w, TRANSFERS_BETWEEN_STEPS).await;
}

/// The index of the worker that decides the transfers' commits: the one of
/// the lowest node group (both workers write in every transfer).
async fn deciding_worker(cluster: &TestCluster) -> usize {
    let c = cluster.connect().await;
    let port: i32 = c.query_one("SELECT nodeport FROM pg_dist_node ORDER BY groupid LIMIT 1", &[]).await.unwrap().get(0);
    cluster.cluster.state.worker_ports.iter().position(|&p| i32::from(p) == port).expect("the deciding worker is one of ours")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bank_transfers_stay_atomic_through_coordinator_and_worker_crashes() {
    let started = Instant::now();
    let cluster = Arc::new(TestCluster::start(2));
    let c = cluster.connect().await;
    c.batch_execute(&format!(
        "CREATE TABLE accounts (id int PRIMARY KEY, balance bigint NOT NULL);
         INSERT INTO accounts SELECT g, {INITIAL_BALANCE} FROM generate_series(1, {ACCOUNTS}) g;
         SELECT create_distributed_table('accounts', 'id', shard_count => {SHARDS});
         CREATE TABLE transfers (id bigint PRIMARY KEY, src int NOT NULL, dst int NOT NULL, amount bigint NOT NULL);
         SELECT create_distributed_table('transfers', 'id', shard_count => {SHARDS});"
    ))
    .await
    .unwrap();
    let ports = common::placement_ports(&c, "accounts").await;
    let worker_ports = cluster.cluster.state.worker_ports.clone();
    let on = |i: usize| (1..=ACCOUNTS).filter(|&id| ports[common::shard_of_int4(id, SHARDS)] == i32::from(worker_ports[i])).collect::<Vec<_>>();
    let w = Arc::new(Workload {
        port: cluster.port,
        accounts: [on(0), on(1)],
        coordinator: AtomicU32::new(0),
        acknowledged: AtomicU64::new(0),
        server_errors: AtomicU64::new(0),
        stop: AtomicBool::new(false),
    });
    assert!(!w.accounts[0].is_empty() && !w.accounts[1].is_empty(), "accounts on both workers");
    drop(c);

    cluster.restart_coordinator(|c| {
        c.transactions.recovery_interval_secs = RECOVERY_INTERVAL_SECS;
        c.transactions.fault_injection = Some(Fault::AfterPrepare);
        c.transactions.fault_after_commits = COMMITS_BEFORE_CRASH;
    });
    let clients: Vec<_> = (0..CLIENTS).map(|n| tokio::spawn(run_client(n, w.clone()))).collect();

    crash_and_restart(&cluster, &w, Fault::AfterPrepare, Some(Fault::AfterDecision)).await;
    crash_and_restart(&cluster, &w, Fault::AfterDecision, None).await;
    assert_eq!(w.coordinator.load(SeqCst), FINAL_COORDINATOR);
    wait_for_transfers(&w, TRANSFERS_BETWEEN_STEPS).await;
    // The deciding worker is the writer of the lowest node group.
    let decider = deciding_worker(&cluster).await;
    crash_worker(&cluster, &w, 1 - decider).await;
    crash_worker(&cluster, &w, decider).await;
    let errors_before = w.server_errors.load(SeqCst);
    let local = cluster.clone();
    tokio::task::spawn_blocking(move || local.cluster.coordinator_db().stop().expect("stopping the coordinator database")).await.unwrap();
    wait_for_transfers(&w, TRANSFERS_BETWEEN_STEPS).await;
    assert_eq!(w.server_errors.load(SeqCst), errors_before, "transfers need nothing from the coordinator database");
    let local = cluster.clone();
    tokio::task::spawn_blocking(move || local.cluster.coordinator_db().start().expect("starting the coordinator database")).await.unwrap();
    wait_for_transfers(&w, TRANSFERS_BETWEEN_STEPS).await;
    w.stop.store(true, SeqCst);
    let mut logs = Vec::new();
    for client in clients {
        logs.push(within("a client finishing", client).await.unwrap());
    }

    // Recovery settles everything the crashes left in doubt, then drops the
    // records (in the coordinator database and on the deciding workers): a
    // part is settled by the first pass after its deciding transaction
    // ended, its record deleted by the next, plus slack for a busy machine.
    let recovery = Instant::now();
    let deadline = Duration::from_secs_f64(2.0 * RECOVERY_INTERVAL_SECS + 5.0);
    while cluster.prepared_on_workers().await + cluster.commit_records().await + cluster.worker_commit_records().await > 0 {
        assert!(recovery.elapsed() < deadline, "prepared transactions or commit records remain after {deadline:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let recovery = recovery.elapsed();

    let c = cluster.connect().await;
    let balances: HashMap<i32, i64> = c.query("SELECT id, balance FROM accounts", &[]).await.unwrap().iter().map(|r| (r.get(0), r.get(1))).collect();
    let logged: Vec<(i64, i32, i32, i64)> =
        c.query("SELECT id, src, dst, amount FROM transfers", &[]).await.unwrap().iter().map(|r| (r.get(0), r.get(1), r.get(2), r.get(3))).collect();
    let attempted: HashMap<i64, Transfer> = logs.iter().flat_map(|l| &l.transfers).map(|t| (t.id, *t)).collect();
    let count = |o: Outcome| attempted.values().filter(|t| t.outcome == o).count();

    assert_eq!(balances.len(), ACCOUNTS as usize);
    assert_eq!(balances.values().sum::<i64>(), i64::from(ACCOUNTS) * INITIAL_BALANCE, "no money created or lost");
    let mut expected: HashMap<i32, i64> = (1..=ACCOUNTS).map(|id| (id, INITIAL_BALANCE)).collect();
    for &(id, src, dst, amount) in &logged {
        let t = attempted.get(&id).unwrap_or_else(|| panic!("transfer {id} was never attempted"));
        assert_eq!((src, dst, amount), (t.from, t.to, t.amount), "transfer {id} is logged as it was made");
        assert_ne!(t.outcome, Outcome::Failed, "transfer {id} failed before COMMIT, yet it committed");
        *expected.get_mut(&src).unwrap() -= amount;
        *expected.get_mut(&dst).unwrap() += amount;
    }
    let logged_ids: std::collections::HashSet<i64> = logged.iter().map(|l| l.0).collect();
    for t in attempted.values().filter(|t| t.outcome == Outcome::Committed) {
        assert!(logged_ids.contains(&t.id), "acknowledged transfer {t:?} is missing");
    }
    for (id, balance) in &balances {
        assert_eq!(*balance, expected[id], "account {id} holds exactly what its logged transfers moved");
    }
    // The clients caught in each crash were committing.
    assert!(count(Outcome::Unknown) >= 2, "both crashes hit a COMMIT");

    // The worker restarts: each error is a clean connection error, or the
    // worker's own "still starting up" (57P03) refusal of a new login, naming
    // the restarted worker (and each session that got one committed again
    // before its client stopped, or the client would still be running).
    let nodes: Vec<String> = worker_ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
    let errors: Vec<&String> = logs.iter().flat_map(|l| &l.server_errors).collect();
    for node in &nodes {
        assert!(errors.iter().any(|e| e.contains(node.as_str())), "a client saw worker {node} go");
    }
    for e in &errors {
        assert!(
            (e.starts_with("08") || e.starts_with("57P03")) && nodes.iter().any(|n| e.contains(n.as_str())),
            "a connection error naming a restarted worker: {e}"
        );
    }

    eprintln!(
        "{} transfers: {} acknowledged, {} failed before COMMIT, {} unknown ({} of those committed); {} worker errors; recovery took {recovery:?}; {:?} in all",
        attempted.len(),
        count(Outcome::Committed),
        count(Outcome::Failed),
        count(Outcome::Unknown),
        attempted.values().filter(|t| t.outcome == Outcome::Unknown && logged_ids.contains(&t.id)).count(),
        errors.len(),
        started.elapsed()
    );
}
