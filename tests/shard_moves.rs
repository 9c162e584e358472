//! Shard moves while clients write (issue 17): `citus_move_shard_placement`
//! moves a shard group with logical replication or under a write block;
//! the clients see no failure, nothing is lost, the worker-side relations
//! follow, and nothing of the move stays behind on any node.

mod common;

use common::{text_rows, TestCluster};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;

const SHARDS: u32 = 4;
const ACCOUNTS: i32 = 100;

/// Moves transfers between accounts (a two-phase commit when they sit on
/// different workers) and logs each in `events` (no primary key, bytea and
/// jsonb columns) until told to stop; returns the ids it logged. Any error
/// fails the test: a move must not make a client's transaction fail.
async fn write_until(port: u16, client_no: i64, stop: Arc<AtomicBool>, done: Arc<AtomicU64>) -> Vec<i64> {
    let c = common::connect(port).await;
    let update = c.prepare("UPDATE accounts SET balance = balance + $2 WHERE id = $1").await.unwrap();
    let log = c
        .prepare(
            "INSERT INTO events (k, id, payload, doc) VALUES ($1, $2, decode(md5($2::bigint::text), 'hex'), jsonb_build_object('id', $2::bigint))",
        )
        .await
        .unwrap();
    let mut ids = Vec::new();
    for seq in 0.. {
        if stop.load(SeqCst) {
            break;
        }
        let id = client_no * 1_000_000 + seq;
        let (from, to) = ((id * 7 % i64::from(ACCOUNTS)) as i32 + 1, (id * 13 % i64::from(ACCOUNTS)) as i32 + 1);
        let result = async {
            c.batch_execute("BEGIN").await?;
            // In account order, so that transfers never deadlock each other.
            let mut changes = [(from, -1i64), (to, 1i64)];
            changes.sort();
            for (account, delta) in changes {
                c.execute(&update, &[&account, &delta]).await?;
            }
            c.execute(&log, &[&from, &id]).await?;
            c.batch_execute("COMMIT").await
        }
        .await;
        if let Err(e) = result {
            panic!("client {client_no}: transfer {id} failed during a move: {} {}", common::sqlstate(&e), common::error_text(&e));
        }
        ids.push(id);
        done.fetch_add(1, SeqCst);
    }
    ids
}

async fn wait_for_more(done: &AtomicU64, n: u64) {
    let target = done.load(SeqCst) + n;
    let start = std::time::Instant::now();
    while done.load(SeqCst) < target {
        assert!(start.elapsed() < Duration::from_secs(60), "the clients stopped making progress");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Statements making the `accounts` table, distributed over `shards` shards.
fn accounts_sql(shards: u32) -> String {
    format!(
        "CREATE TABLE accounts (id int PRIMARY KEY, balance bigint NOT NULL);
         INSERT INTO accounts SELECT g, 1000 FROM generate_series(1, {ACCOUNTS}) g;
         SELECT create_distributed_table('accounts', 'id', shard_count => {shards});"
    )
}

/// Publications, subscriptions, replication slots and shards of distributed
/// tables outside any parent (old or half-made placements) on a worker.
async fn leftovers(w: &tokio_postgres::Client) -> Vec<Vec<Option<String>>> {
    text_rows(
        w,
        "SELECT (SELECT count(*) FROM pg_publication) + (SELECT count(*) FROM pg_subscription) + (SELECT count(*) FROM pg_replication_slots)
              + (SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = 'public' AND c.relkind = 'r'
                 AND c.relname ~ '^(accounts|events|notes)_[0-9]+$' AND NOT EXISTS (SELECT FROM pg_inherits WHERE inhrelid = c.oid))",
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shard_groups_move_while_clients_write() {
    let cluster = TestCluster::start(2);
    let c = cluster.connect().await;
    c.batch_execute(&format!(
        "{}
         CREATE TABLE kinds (kind int PRIMARY KEY, name text);
         INSERT INTO kinds VALUES (1, 'transfer');
         SELECT create_reference_table('kinds');
         CREATE TABLE events (k int, id bigint, payload bytea, doc jsonb, kind int NOT NULL DEFAULT 1 REFERENCES kinds (kind), stamped bool);
         CREATE FUNCTION stamp() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN NEW.stamped := true; RETURN NEW; END $$;
         CREATE TRIGGER stamp BEFORE INSERT ON events FOR EACH ROW EXECUTE FUNCTION stamp();
         SELECT create_distributed_table('events', 'k', colocate_with => 'accounts');",
        accounts_sql(SHARDS)
    ))
    .await
    .unwrap();
    let ports = cluster.cluster.state.worker_ports.clone();
    let (first, second) = (i32::from(ports[0]), i32::from(ports[1]));
    assert!(common::placement_ports(&c, "accounts").await.contains(&first));

    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let writers: Vec<_> = (0..4).map(|n| tokio::spawn(write_until(cluster.port, n, stop.clone(), done.clone()))).collect();
    wait_for_more(&done, 50).await;

    // Every shard group on the first worker moves to the second, alternating
    // the two transfer modes, with the clients busy throughout.
    let shards: Vec<(i64, i32)> = c
        .query("SELECT s.shardid, n.nodeport FROM pg_dist_shard s JOIN pg_dist_placement p USING (shardid) JOIN pg_dist_node n USING (groupid) WHERE s.logicalrelid = 'accounts'::regclass ORDER BY s.shardindex", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    let moving: Vec<i64> = shards.iter().filter(|(_, port)| *port == first).map(|(id, _)| *id).collect();
    assert!(!moving.is_empty());
    for (i, shard) in moving.iter().enumerate() {
        let mode = if i % 2 == 0 { "force_logical" } else { "block_writes" };
        c.batch_execute(&format!(
            "SELECT citus_move_shard_placement({shard}, '127.0.0.1', {first}, '127.0.0.1', {second}, shard_transfer_mode => '{mode}')"
        ))
        .await
        .unwrap_or_else(|e| panic!("moving shard {shard} ({mode}): {}", common::error_text(&e)));
        wait_for_more(&done, 30).await;
    }
    stop.store(true, SeqCst);
    let mut logged = Vec::new();
    for w in writers {
        logged.extend(w.await.unwrap());
    }

    // Everything is on the second worker now, with nothing lost.
    assert!(common::placement_ports(&c, "accounts").await.iter().all(|p| *p == second));
    assert!(common::placement_ports(&c, "events").await.iter().all(|p| *p == second));
    assert_eq!(
        text_rows(&c, "SELECT sum(balance), count(*) FROM accounts").await,
        vec![vec![Some((1000 * ACCOUNTS).to_string()), Some(ACCOUNTS.to_string())]]
    );
    let mut stored: Vec<i64> = c.query("SELECT id FROM events", &[]).await.unwrap().iter().map(|r| r.get(0)).collect();
    stored.sort();
    logged.sort();
    assert_eq!(stored, logged, "every acknowledged transfer is logged exactly once");
    let intact = text_rows(
        &c,
        "SELECT count(*) FROM events WHERE payload = decode(md5(id::text), 'hex') AND doc = jsonb_build_object('id', id) AND k = (id * 7 % 100) + 1",
    )
    .await;
    assert_eq!(intact, vec![vec![Some(logged.len().to_string())]], "bytea and jsonb values arrive intact");
    // The moved shards keep their trigger and foreign key (validated).
    assert_eq!(text_rows(&c, "SELECT count(*) FROM events WHERE stamped IS NOT TRUE").await, vec![vec![Some("0".into())]]);
    let w = cluster.connect_worker(1).await;
    let keys = text_rows(&w, "SELECT count(*) FILTER (WHERE convalidated), count(*) FROM pg_constraint WHERE contype = 'f' AND conrelid::regclass::text ~ '^events_[0-9]+$'").await;
    assert_eq!(keys, vec![vec![Some(SHARDS.to_string()), Some(SHARDS.to_string())]], "every events shard on the second worker references kinds");
    let e = c.batch_execute("INSERT INTO events (k, id, kind) VALUES (1, -1, 99)").await.unwrap_err();
    assert_eq!(common::sqlstate(&e), "23503", "{}", common::error_text(&e));
    // Joins across the moved group and to the reference table still work,
    // through the coordinator and on each worker (its partitions follow).
    assert_eq!(
        text_rows(&c, "SELECT count(*) FROM events e JOIN accounts a ON a.id = e.k JOIN kinds ON kinds.kind = 1").await,
        vec![vec![Some(logged.len().to_string())]]
    );
    for i in 0..2 {
        let w = cluster.connect_worker(i).await;
        assert_eq!(
            text_rows(&w, "SELECT count(*), sum(balance) FROM accounts").await,
            vec![vec![Some(ACCOUNTS.to_string()), Some((1000 * ACCOUNTS).to_string())]]
        );
        assert_eq!(leftovers(&w).await, vec![vec![Some("0".into())]], "no publication, subscription, slot or detached shard left on worker {i}");
    }
    assert_eq!(text_rows(&c, "SELECT count(*) FROM pg_dist_cleanup").await, vec![vec![Some("0".into())]]);
    // The moved shards take writes on their new node, and old names are gone.
    c.batch_execute("UPDATE accounts SET balance = balance + 1; UPDATE accounts SET balance = balance - 1").await.unwrap();
    eprintln!("{} transfers during {} moves", logged.len(), moving.len());
}

#[tokio::test]
async fn bad_moves_are_refused_clearly() {
    let cluster = TestCluster::start(2);
    let c = cluster.connect().await;
    c.batch_execute(
        "CREATE TABLE items (id int PRIMARY KEY);
         SELECT create_distributed_table('items', 'id', shard_count => 2);
         CREATE TABLE kinds (kind int PRIMARY KEY);
         SELECT create_reference_table('kinds');
         CREATE ROLE mover LOGIN;",
    )
    .await
    .unwrap();
    let ports = cluster.cluster.state.worker_ports.clone();
    let rows = c.query("SELECT shardid, nodeport FROM citus_shards WHERE table_name = 'items'::regclass ORDER BY shardid", &[]).await.unwrap();
    let (shard, port): (i64, i32) = (rows[0].get(0), rows[0].get(1));
    let other = if port == i32::from(ports[0]) { ports[1] } else { ports[0] };
    let reference: i64 = c.query_one("SELECT shardid FROM citus_shards WHERE table_name = 'kinds'::regclass LIMIT 1", &[]).await.unwrap().get(0);
    let refused = |sql: String, code: &'static str, words: &'static str| {
        let c = &c;
        async move {
            let e = c.batch_execute(&sql).await.err().unwrap_or_else(|| panic!("{sql} was accepted"));
            assert_eq!(common::sqlstate(&e), code, "{sql}: {}", common::error_text(&e));
            assert!(common::error_text(&e).contains(words), "{sql}: {}", common::error_text(&e));
        }
    };
    refused(format!("SELECT citus_move_shard_placement({shard}, '127.0.0.1', {other}, '127.0.0.1', {port})"), "22023", "is not placed on").await;
    refused(format!("SELECT citus_move_shard_placement({shard}, '127.0.0.1', {port}, '127.0.0.1', 1)"), "42704", "is not an active node").await;
    refused(format!("SELECT citus_move_shard_placement(1, '127.0.0.1', {port}, '127.0.0.1', {other})"), "42704", "does not exist").await;
    refused(format!("SELECT citus_move_shard_placement({reference}, '127.0.0.1', {port}, '127.0.0.1', {other})"), "0A000", "reference table").await;
    refused(
        format!("SELECT citus_move_shard_placement({shard}, '127.0.0.1', {port}, '127.0.0.1', {other}, 'sometimes')"),
        "22023",
        "shard_transfer_mode",
    )
    .await;
    refused(format!("BEGIN; SELECT citus_move_shard_placement({shard}, '127.0.0.1', {port}, '127.0.0.1', {other})"), "25001", "transaction block")
        .await;
    c.batch_execute("ROLLBACK").await.unwrap();
    let mover = common::connect_as(cluster.port, "mover").await;
    let e = mover.batch_execute(&format!("SELECT citus_move_shard_placement({shard}, '127.0.0.1', {port}, '127.0.0.1', {other})")).await.unwrap_err();
    assert_eq!(common::sqlstate(&e), "42501", "{}", common::error_text(&e));
    // Nothing moved, and the session goes on.
    assert_eq!(common::placement_ports(&c, "items").await[0], port);
    assert_eq!(text_rows(&c, "SELECT count(*) FROM items").await, vec![vec![Some("0".into())]]);
}

/// Growing the cluster while clients write: `tessera up --workers 3` adds
/// a worker, `rebalance_table_shards()` spreads the shard groups over all
/// three, then `citus_drain_node` empties the new one again and
/// `citus_remove_node` takes it out (refused while it still held shards).
/// No client transaction fails, and nothing is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cluster_grows_rebalances_and_drains_while_clients_write() {
    let cluster = TestCluster::start(2);
    let c = cluster.connect().await;
    c.batch_execute(&format!(
        "CREATE TABLE kinds (kind int PRIMARY KEY, name text);
         INSERT INTO kinds VALUES (1, 'transfer');
         SELECT create_reference_table('kinds');
         {}
         CREATE TABLE events (k int, id bigint, payload bytea, doc jsonb, kind int NOT NULL DEFAULT 1 REFERENCES kinds (kind), stamped bool);
         SELECT create_distributed_table('events', 'k', colocate_with => 'accounts');",
        accounts_sql(6)
    ))
    .await
    .unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let writers: Vec<_> = (0..4).map(|n| tokio::spawn(write_until(cluster.port, n, stop.clone(), done.clone()))).collect();
    wait_for_more(&done, 30).await;

    let dir = cluster.data_dir().to_path_buf();
    let port = cluster.port;
    let grown = tokio::task::spawn_blocking(move || common::grow(&dir, port, 3)).await.unwrap();
    let third = i32::from(grown.state.worker_ports[2]);
    // The new worker has the reference table before any shard lands there.
    let w3 = common::connect(grown.state.worker_ports[2]).await;
    assert_eq!(text_rows(&w3, "SELECT name FROM kinds").await, vec![vec![Some("transfer".into())]]);
    let plan = text_rows(&c, "SELECT * FROM get_rebalance_table_shards_plan()").await;
    assert_eq!(plan.len(), 2, "two of six shard groups go to the new worker: {plan:?}");
    assert!(plan.iter().all(|row| row[6].as_deref() == Some(third.to_string().as_str())));
    c.batch_execute("SELECT rebalance_table_shards()").await.unwrap();
    wait_for_more(&done, 30).await;
    let placed = common::placement_ports(&c, "accounts").await;
    assert_eq!(placed.iter().filter(|p| **p == third).count(), 2, "{placed:?}");
    assert!(text_rows(&c, "SELECT * FROM get_rebalance_table_shards_plan()").await.is_empty(), "balanced");
    // The new worker serves its shards, through its own relations too.
    assert_eq!(text_rows(&w3, "SELECT count(*) FROM accounts").await, vec![vec![Some(ACCOUNTS.to_string())]]);

    let e = c.batch_execute(&format!("SELECT citus_remove_node('127.0.0.1', {third})")).await.unwrap_err();
    assert_eq!(common::sqlstate(&e), "55006", "{}", common::error_text(&e));
    assert!(
        common::error_text(&e).contains("accounts (shards ") && common::error_text(&e).contains("citus_drain_node"),
        "{}",
        common::error_text(&e)
    );
    c.batch_execute(&format!("SELECT citus_drain_node('127.0.0.1', {third})")).await.unwrap();
    assert!(!common::placement_ports(&c, "accounts").await.contains(&third));
    // New tables stay off a drained node.
    c.batch_execute("CREATE TABLE later (id int); SELECT create_distributed_table('later', 'id', shard_count => 4)").await.unwrap();
    assert!(!common::placement_ports(&c, "later").await.contains(&third));
    wait_for_more(&done, 30).await;
    stop.store(true, SeqCst);
    let mut logged = Vec::new();
    for w in writers {
        logged.extend(w.await.unwrap());
    }
    c.batch_execute(&format!("SELECT citus_remove_node('127.0.0.1', {third})")).await.unwrap();

    assert_eq!(
        text_rows(&c, "SELECT sum(balance), count(*) FROM accounts").await,
        vec![vec![Some((1000 * ACCOUNTS).to_string()), Some(ACCOUNTS.to_string())]]
    );
    let mut stored: Vec<i64> = c.query("SELECT id FROM events", &[]).await.unwrap().iter().map(|r| r.get(0)).collect();
    stored.sort();
    logged.sort();
    assert_eq!(stored, logged, "every acknowledged transfer is logged exactly once");
    assert_eq!(text_rows(&c, "SELECT count(*) FROM pg_dist_node").await, vec![vec![Some("2".into())]]);
    eprintln!("{} transfers while growing, rebalancing and draining", logged.len());
}

/// `accounts` with `shards` shards and co-located `notes`, through the
/// coordinator.
async fn accounts_and_notes(cluster: &TestCluster, shards: u32) -> tokio_postgres::Client {
    let c = cluster.connect().await;
    c.batch_execute(&format!(
        "{}
         CREATE TABLE notes (k int, body text);
         INSERT INTO notes SELECT g, repeat('x', g) FROM generate_series(1, {ACCOUNTS}) g;
         SELECT create_distributed_table('notes', 'k', colocate_with => 'accounts');",
        accounts_sql(shards)
    ))
    .await
    .unwrap();
    c
}

/// Counts and sums of both tables of `accounts_and_notes`.
const WHOLE: &str = "SELECT (SELECT count(*) FROM accounts), (SELECT sum(balance) FROM accounts), (SELECT count(*) FROM notes), (SELECT sum(length(body)) FROM notes)";

/// A move interrupted by a crash of the coordinator at each of its steps:
/// after the restart and a cleanup pass every shard has one placement, the
/// data is whole, no publication, subscription, slot or stray shard is left
/// on any node, and the move can be made again.
#[tokio::test]
async fn a_move_interrupted_by_a_crash_leaves_one_placement_and_no_leftovers() {
    use tessera::config::Fault;
    let cluster = TestCluster::start(2);
    let c = accounts_and_notes(&cluster, 2).await;
    drop(c);
    let ports = cluster.cluster.state.worker_ports.clone();
    for fault in [Fault::MoveAfterSubscribe, Fault::MoveBeforeSwitch, Fault::MoveAfterSwitch] {
        cluster.restart_coordinator(|config| config.transactions.fault_injection = Some(fault));
        let c = cluster.connect().await;
        let (shard, from): (i64, i32) = {
            let row = c
                .query_one("SELECT shardid, nodeport FROM citus_shards WHERE table_name = 'accounts'::regclass ORDER BY shardid LIMIT 1", &[])
                .await
                .unwrap();
            (row.get(0), row.get(1))
        };
        let to = if from == i32::from(ports[0]) { ports[1] } else { ports[0] };
        let moved = c.batch_execute(&format!("SELECT citus_move_shard_placement({shard}, '127.0.0.1', {from}, '127.0.0.1', {to})")).await;
        assert!(moved.is_err(), "the coordinator died at {fault:?}");
        cluster.wait_for_coordinator_exit();
        assert!(cluster.coordinator_log().contains(&format!("stopping at {fault:?}")), "{}", cluster.coordinator_log_tail());
        cluster.restart_coordinator(|config| config.transactions.fault_injection = None);
        let c = cluster.connect().await;
        c.batch_execute("SELECT citus_cleanup_orphaned_resources()").await.unwrap();

        let placements = text_rows(&c, "SELECT shardid, count(*) FROM pg_dist_placement GROUP BY shardid HAVING count(*) <> 1").await;
        assert!(placements.is_empty(), "after {fault:?}: one placement per shard: {placements:?}");
        let expected = vec![vec![
            Some(ACCOUNTS.to_string()),
            Some((1000 * ACCOUNTS).to_string()),
            Some(ACCOUNTS.to_string()),
            Some((ACCOUNTS * (ACCOUNTS + 1) / 2).to_string()),
        ]];
        assert_eq!(text_rows(&c, WHOLE).await, expected, "after {fault:?}");
        assert_eq!(
            text_rows(&c, "SELECT count(*) FROM pg_dist_cleanup").await,
            vec![vec![Some("0".into())]],
            "after {fault:?}: {}",
            cluster.coordinator_log_tail()
        );
        for i in 0..2 {
            let w = cluster.connect_worker(i).await;
            assert_eq!(leftovers(&w).await, vec![vec![Some("0".into())]], "after {fault:?}: nothing left on worker {i}");
            // The worker's own relations see every row too.
            assert_eq!(text_rows(&w, "SELECT count(*) FROM accounts").await, vec![vec![Some(ACCOUNTS.to_string())]], "after {fault:?}: worker {i}");
        }
        c.batch_execute("UPDATE accounts SET balance = balance + 1; UPDATE accounts SET balance = balance - 1").await.unwrap();
    }
    // And the move goes through once nothing interrupts it.
    let c = cluster.connect().await;
    let (shard, from): (i64, i32) = {
        let row = c
            .query_one("SELECT shardid, nodeport FROM citus_shards WHERE table_name = 'accounts'::regclass ORDER BY shardid LIMIT 1", &[])
            .await
            .unwrap();
        (row.get(0), row.get(1))
    };
    let to = if from == i32::from(ports[0]) { ports[1] } else { ports[0] };
    c.batch_execute(&format!("SELECT citus_move_shard_placement({shard}, '127.0.0.1', {from}, '127.0.0.1', {to})")).await.unwrap();
    assert_eq!(
        text_rows(&c, "SELECT count(*), sum(balance) FROM accounts").await,
        vec![vec![Some(ACCOUNTS.to_string()), Some((1000 * ACCOUNTS).to_string())]]
    );
}

/// `citus_rebalance_start` in the background: the job outlives a crash of
/// the coordinator in the middle of its second move (the restarted process
/// resumes it, and `citus_rebalance_wait` sees it finish), one rebalance at
/// a time, and `citus_rebalance_stop` ends a job at its next safe point
/// with every shard in one place and nothing left behind.
#[tokio::test]
async fn a_background_rebalance_survives_a_crash_and_stops_when_told() {
    use tessera::config::Fault;
    let cluster = TestCluster::start(2);
    let c = accounts_and_notes(&cluster, 6).await;
    let expected = text_rows(&c, WHOLE).await;
    drop(c);
    let dir = cluster.data_dir().to_path_buf();
    let port = cluster.port;
    let grown = tokio::task::spawn_blocking(move || common::grow(&dir, port, 3)).await.unwrap();
    let third = i32::from(grown.state.worker_ports[2]);

    // The first move goes through; the second kills the coordinator.
    cluster.restart_coordinator(|config| {
        config.transactions.fault_injection = Some(Fault::MoveAfterSubscribe);
        config.transactions.fault_after_commits = 1;
    });
    let c = cluster.connect().await;
    let job = text_rows(&c, "SELECT citus_rebalance_start()").await;
    assert!(job[0][0].is_some(), "a job id: {job:?}");
    cluster.wait_for_coordinator_exit();
    assert!(cluster.coordinator_log().contains("stopping at MoveAfterSubscribe"), "{}", cluster.coordinator_log_tail());
    cluster.restart_coordinator(|config| config.transactions.fault_injection = None);
    let c = cluster.connect().await;
    // A job nobody resumes would make the wait endless.
    c.batch_execute("SET statement_timeout = '120s'; SELECT citus_rebalance_wait()").await.unwrap();
    let status = text_rows(&c, "SELECT job_id, state, details->'task_state_counts'->>'done' FROM citus_rebalance_status()").await;
    assert_eq!(status, vec![vec![job[0][0].clone(), Some("finished".into()), Some("2".into())]], "{}", cluster.coordinator_log_tail());
    assert_eq!(common::placement_ports(&c, "accounts").await.iter().filter(|p| **p == third).count(), 2);
    assert_eq!(text_rows(&c, WHOLE).await, expected);
    assert!(text_rows(&c, "SELECT citus_rebalance_start()").await[0][0].is_none(), "balanced: nothing to schedule");

    // Draining the new worker, stopped right away: the job ends at its
    // next safe point, every shard has one placement and the data is whole.
    c.batch_execute(&format!("SELECT citus_set_node_property('127.0.0.1', {third}, 'shouldhaveshards', false)")).await.unwrap();
    let drain = text_rows(&c, "SELECT citus_rebalance_start(drain_only => true)").await;
    let again = c.batch_execute("SELECT citus_rebalance_start()").await.unwrap_err();
    assert_eq!(common::sqlstate(&again), "55006", "{}", common::error_text(&again));
    assert!(common::error_text(&again).contains(&format!("job {}", drain[0][0].clone().unwrap())), "{}", common::error_text(&again));
    c.batch_execute("SELECT citus_rebalance_stop()").await.unwrap();
    c.batch_execute("SELECT citus_rebalance_wait()").await.unwrap();
    let status = text_rows(&c, "SELECT state, details->'task_state_counts'->>'cancelled' IS NOT NULL FROM citus_rebalance_status()").await;
    assert_eq!(status, vec![vec![Some("cancelled".into()), Some("t".into())]], "{}", cluster.coordinator_log_tail());
    c.batch_execute("SELECT citus_cleanup_orphaned_resources()").await.unwrap();
    assert!(text_rows(&c, "SELECT shardid FROM pg_dist_placement GROUP BY shardid HAVING count(*) <> 1").await.is_empty());
    assert_eq!(text_rows(&c, WHOLE).await, expected);
    assert_eq!(text_rows(&c, "SELECT count(*) FROM pg_dist_cleanup").await, vec![vec![Some("0".into())]]);
    for i in 0..3 {
        let w = common::connect(grown.state.worker_ports[i]).await;
        assert_eq!(leftovers(&w).await, vec![vec![Some("0".into())]], "nothing left on worker {i}");
    }
    // Started again, it empties the node.
    c.batch_execute("SELECT citus_rebalance_start(drain_only => true); SELECT citus_rebalance_wait()").await.unwrap();
    assert!(!common::placement_ports(&c, "accounts").await.contains(&third));
    assert_eq!(text_rows(&c, WHOLE).await, expected);
    assert_eq!(text_rows(&c, "SELECT state FROM citus_rebalance_status()").await, vec![vec![Some("finished".into())]]);
    // Anyone may watch; only a superuser may start one.
    c.batch_execute("CREATE ROLE watcher LOGIN").await.unwrap();
    let watcher = common::connect_as(cluster.port, "watcher").await;
    assert_eq!(text_rows(&watcher, "SELECT state FROM citus_rebalance_status()").await, vec![vec![Some("finished".into())]]);
    let refused = watcher.batch_execute("SELECT citus_rebalance_start()").await.unwrap_err();
    assert_eq!(common::sqlstate(&refused), "42501", "{}", common::error_text(&refused));
}

/// `citus_copy_shard_placement` repairs a node's missing copy of a
/// reference table (rows, the node's view, later writes), and
/// `replicate_reference_tables` does it for every table and node; shards
/// of distributed tables are not copied.
#[tokio::test]
async fn a_missing_reference_copy_is_repaired() {
    let cluster = TestCluster::start(2);
    let c = cluster.connect().await;
    c.batch_execute(
        "CREATE TABLE kinds (kind int PRIMARY KEY, name text);
         INSERT INTO kinds SELECT g, 'kind ' || g FROM generate_series(1, 50) g;
         SELECT create_reference_table('kinds');
         CREATE TABLE items (id int);
         SELECT create_distributed_table('items', 'id', shard_count => 2);",
    )
    .await
    .unwrap();
    let ports = cluster.cluster.state.worker_ports.clone();
    let shard: i64 = c.query_one("SELECT shardid FROM pg_dist_shard WHERE logicalrelid = 'kinds'::regclass", &[]).await.unwrap().get(0);
    lose_second_copy(&cluster, shard).await;
    c.batch_execute(&format!("SELECT citus_copy_shard_placement({shard}, '127.0.0.1', {}, '127.0.0.1', {})", ports[0], ports[1])).await.unwrap();
    second_copy_serves(&cluster, 50).await;
    c.batch_execute("INSERT INTO kinds VALUES (51, 'kind 51')").await.unwrap();
    second_copy_serves(&cluster, 51).await;
    assert_eq!(text_rows(&c, &format!("SELECT count(*) FROM pg_dist_placement WHERE shardid = {shard}")).await, vec![vec![Some("2".into())]]);

    let twice = c
        .batch_execute(&format!("SELECT citus_copy_shard_placement({shard}, '127.0.0.1', {}, '127.0.0.1', {})", ports[0], ports[1]))
        .await
        .unwrap_err();
    assert_eq!(common::sqlstate(&twice), "22023", "{}", common::error_text(&twice));
    let items_shard: i64 =
        c.query_one("SELECT shardid FROM citus_shards WHERE table_name = 'items'::regclass ORDER BY shardid LIMIT 1", &[]).await.unwrap().get(0);
    let from: i32 = c.query_one(&format!("SELECT nodeport FROM citus_shards WHERE shardid = {items_shard}"), &[]).await.unwrap().get(0);
    let to = if from == i32::from(ports[0]) { ports[1] } else { ports[0] };
    let distributed =
        c.batch_execute(&format!("SELECT citus_copy_shard_placement({items_shard}, '127.0.0.1', {from}, '127.0.0.1', {to})")).await.unwrap_err();
    assert_eq!(common::sqlstate(&distributed), "0A000", "{}", common::error_text(&distributed));
    assert!(common::error_text(&distributed).contains("citus_move_shard_placement"), "{}", common::error_text(&distributed));

    lose_second_copy(&cluster, shard).await;
    c.batch_execute("SELECT replicate_reference_tables()").await.unwrap();
    second_copy_serves(&cluster, 51).await;
    assert_eq!(text_rows(&c, "SELECT count(*) FROM kinds").await, vec![vec![Some("51".into())]]);
}

/// Takes the second worker's copy of reference shard `shard` away, as if
/// it had never been made.
async fn lose_second_copy(cluster: &TestCluster, shard: i64) {
    let w = cluster.connect_worker(1).await;
    w.batch_execute(&format!("DROP VIEW kinds; DROP TABLE kinds_{shard}")).await.unwrap();
    let db = cluster.connect_coordinator_db().await;
    let port = cluster.cluster.state.worker_ports[1];
    db.batch_execute(&format!("DELETE FROM tessera.pg_dist_placement WHERE shardid = {shard} AND groupid = (SELECT groupid FROM tessera.pg_dist_node WHERE nodeport = {port})"))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await; // the coordinator reloads its catalog
}

async fn second_copy_serves(cluster: &TestCluster, expected: i64) {
    let w = cluster.connect_worker(1).await;
    let count: i64 = w.query_one("SELECT count(*) FROM kinds", &[]).await.unwrap().get(0);
    assert_eq!(count, expected, "the second worker's view reads its own copy");
}

/// A co-location group with a table partitioned by range moves whole: the
/// partitioned shard, its partitions' shards attached to it on the target
/// (keys and indexes inherited there), both transfer modes, while a client
/// keeps inserting into both partitions; the workers' own relations see
/// every row afterwards. Tables partitioned by hash are refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partitioned_table_moves_with_its_partitions() {
    let cluster = TestCluster::start(2);
    let c = cluster.connect().await;
    c.batch_execute(
        "CREATE TABLE tenants (tenant int PRIMARY KEY, name text);
         SELECT create_distributed_table('tenants', 'tenant', shard_count => 2);
         CREATE TABLE events (tenant int, at date, id bigint, body text, PRIMARY KEY (tenant, at, id)) PARTITION BY RANGE (at);
         CREATE TABLE events_2025 PARTITION OF events FOR VALUES FROM ('2025-01-01') TO ('2026-01-01');
         CREATE TABLE events_2026 PARTITION OF events FOR VALUES FROM ('2026-01-01') TO ('2027-01-01');
         CREATE INDEX events_body ON events (body);
         SELECT create_distributed_table('events', 'tenant', colocate_with => 'tenants');
         INSERT INTO tenants SELECT g, 'tenant ' || g FROM generate_series(1, 20) g;
         INSERT INTO events SELECT g % 20 + 1, date '2025-06-01' + (g % 400), g, 'event ' || g FROM generate_series(1, 400) g;",
    )
    .await
    .unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (stop, port) = (stop.clone(), cluster.port);
        tokio::spawn(async move {
            let c = common::connect(port).await;
            let mut id = 1000;
            while !stop.load(SeqCst) {
                id += 1;
                c.execute("INSERT INTO events VALUES ($1, date '2025-12-30' + ($2 % 4)::int, $2, 'late')", &[&(id % 20 + 1), &id])
                    .await
                    .expect("an insert during the move");
            }
            id - 1000
        })
    };
    let ports = cluster.cluster.state.worker_ports.clone();
    for mode in ["auto", "block_writes"] {
        let row = c
            .query_one("SELECT shardid, nodeport FROM citus_shards WHERE table_name = 'events'::regclass ORDER BY shardid LIMIT 1", &[])
            .await
            .unwrap();
        let (shard, from): (i64, i32) = (row.get(0), row.get(1));
        let to = if from == i32::from(ports[0]) { ports[1] } else { ports[0] };
        c.batch_execute(&format!("SELECT citus_move_shard_placement({shard}, '127.0.0.1', {from}, '127.0.0.1', {to}, '{mode}')")).await.unwrap();
        let w = common::connect(to).await;
        let attached = text_rows(&w, &format!("SELECT count(*) FROM pg_inherits WHERE inhparent = 'events_{shard}'::regclass")).await;
        assert_eq!(attached, vec![vec![Some("2".into())]], "{mode}: both partitions attached on the target");
        let indexes = text_rows(
            &w,
            &format!("SELECT count(*) FROM pg_index i JOIN pg_inherits x ON x.inhrelid = i.indrelid WHERE x.inhparent = 'events_{shard}'::regclass"),
        )
        .await;
        assert_eq!(indexes, vec![vec![Some("4".into())]], "{mode}: key and index on both partition shards there");
    }
    stop.store(true, SeqCst);
    let inserted = writer.await.unwrap();
    c.batch_execute("SELECT citus_cleanup_orphaned_resources(); UPDATE events SET body = body || '!' WHERE tenant = 3").await.unwrap();
    let total = (400 + inserted).to_string();
    assert_eq!(text_rows(&c, "SELECT count(*) FROM events").await, vec![vec![Some(total.clone())]]);
    assert_eq!(text_rows(&c, "SELECT count(*) FROM events WHERE at >= '2026-01-01'").await, text_rows(&c, "SELECT count(*) FROM events_2026").await);
    for i in 0..2 {
        let w = cluster.connect_worker(i).await;
        assert_eq!(text_rows(&w, "SELECT count(*) FROM events").await, vec![vec![Some(total.clone())]], "worker {i}'s relation");
        assert_eq!(leftovers(&w).await, vec![vec![Some("0".into())]], "nothing left on worker {i}");
    }
    assert_eq!(text_rows(&c, "SELECT count(*) FROM pg_dist_cleanup").await, vec![vec![Some("0".into())]]);

    c.batch_execute(
        "CREATE TABLE spread (k int, v int) PARTITION BY HASH (v);
         CREATE TABLE spread_0 PARTITION OF spread FOR VALUES WITH (MODULUS 2, REMAINDER 0);
         CREATE TABLE spread_1 PARTITION OF spread FOR VALUES WITH (MODULUS 2, REMAINDER 1);
         SELECT create_distributed_table('spread', 'k', shard_count => 2, colocate_with => 'none');",
    )
    .await
    .unwrap();
    let row =
        c.query_one("SELECT shardid, nodeport FROM citus_shards WHERE table_name = 'spread'::regclass ORDER BY shardid LIMIT 1", &[]).await.unwrap();
    let (shard, from): (i64, i32) = (row.get(0), row.get(1));
    let to = if from == i32::from(ports[0]) { ports[1] } else { ports[0] };
    let e = c.batch_execute(&format!("SELECT citus_move_shard_placement({shard}, '127.0.0.1', {from}, '127.0.0.1', {to})")).await.unwrap_err();
    assert_eq!(common::sqlstate(&e), "0A000", "{}", common::error_text(&e));
    assert!(common::error_text(&e).contains("partitioned by hash"), "{}", common::error_text(&e));
    c.batch_execute("SELECT citus_cleanup_orphaned_resources()").await.unwrap();
    assert_eq!(common::placement_ports(&c, "spread").await[0], from);
}
