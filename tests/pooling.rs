//! Sessions share a bounded pool of connections to each worker: they hold
//! one only for a transaction block or an exchange in progress, and every
//! session's settings, role and prepared statements stay its own on
//! whichever connection runs its next statement.

mod common;
use common::{connect, connect_as, error_text, placement_ports, shard_of_int4, sqlstate, text_rows, TestCluster};
use std::time::Duration;

/// Raises this process's open-file limit to its hard limit (thousands of
/// client sockets).
fn allow_many_open_files() {
    // SAFETY: getrlimit/setrlimit only read and write the struct passed.
    unsafe {
        let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0 {
            limit.rlim_cur = limit.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
        }
    }
}

async fn tessera_backends(cluster: &TestCluster, worker: usize) -> usize {
    let w = cluster.connect_worker(worker).await;
    let rows = text_rows(&w, "SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE 'tessera:%'").await;
    rows[0][0].as_deref().unwrap().parse().unwrap()
}

#[tokio::test]
async fn many_clients_share_few_worker_connections() {
    let cluster = TestCluster::start(2);
    let setup = cluster.connect().await;
    setup
        .batch_execute("CREATE TABLE pl_accounts (id int PRIMARY KEY, balance int); SELECT create_distributed_table('pl_accounts', 'id'); INSERT INTO pl_accounts SELECT g, 0 FROM generate_series(1, 400) g")
        .await
        .unwrap();
    drop(setup);
    cluster.restart_coordinator(|config| config.connections.max_per_node = Some(8));
    let port = cluster.port;
    let clients: Vec<_> = (0..200)
        .map(|i| {
            tokio::spawn(async move {
                let c = connect(port).await;
                for round in 0..5 {
                    let id = (i * 7 + round * 13) % 400 + 1;
                    c.batch_execute(&format!("BEGIN; UPDATE pl_accounts SET balance = balance + 1 WHERE id = {id}; COMMIT")).await.unwrap();
                    let rows = c.query("SELECT id FROM pl_accounts WHERE id = $1", &[&id]).await.unwrap();
                    assert_eq!(rows.len(), 1);
                }
            })
        })
        .collect();
    // Meanwhile no worker ever sees more than the pool's connections.
    let mut most = 0;
    while clients.iter().any(|c| !c.is_finished()) {
        for w in 0..2 {
            most = most.max(tessera_backends(&cluster, w).await);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for c in clients {
        c.await.unwrap();
    }
    assert!(most <= 8, "a worker had {most} connections from the coordinator");
    let c = cluster.connect().await;
    assert_eq!(text_rows(&c, "SELECT sum(balance) FROM pl_accounts").await, vec![vec![Some("1000".into())]]);
}

/// One connection per worker for all sessions: every statement of every
/// session runs on a connection another session used just before.
#[tokio::test]
async fn settings_roles_and_prepared_statements_stay_with_their_session() {
    let cluster = TestCluster::start(2);
    let setup = cluster.connect().await;
    setup
        .batch_execute(
            "CREATE TABLE pl_days (id int PRIMARY KEY, d date, secret text);
             SELECT create_distributed_table('pl_days', 'id');
             INSERT INTO pl_days SELECT g, DATE '2024-01-01' + g, 's' || g FROM generate_series(1, 50) g;
             CREATE ROLE pl_reader; GRANT SELECT (id, d) ON pl_days TO pl_reader;",
        )
        .await
        .unwrap();
    drop(setup);
    cluster.restart_coordinator(|config| config.connections.max_per_node = Some(1));
    let port = cluster.port;
    let styles = [("ISO, MDY", "2024-01-06"), ("SQL, DMY", "06/01/2024"), ("German", "06.01.2024"), ("Postgres, MDY", "01-06-2024")];
    let sessions: Vec<_> = (0..12)
        .map(|i| {
            tokio::spawn(async move {
                let c = connect(port).await;
                let (style, day5) = styles[i % styles.len()];
                c.batch_execute(&format!("SET DateStyle = '{style}'")).await.unwrap();
                let restricted = i % 3 == 0;
                if restricted {
                    c.batch_execute("SET ROLE pl_reader").await.unwrap();
                }
                let by_id = c.prepare("SELECT d::text FROM pl_days WHERE id = $1").await.unwrap();
                let secret = c.prepare("SELECT secret FROM pl_days WHERE id = $1").await.unwrap();
                for round in 0..15 {
                    let rows = c.query(&by_id, &[&5i32]).await.unwrap();
                    assert_eq!(rows[0].get::<_, String>(0), day5, "session {i} ({style}) round {round}");
                    match c.query(&secret, &[&(round + 1)]).await {
                        Ok(rows) => assert!(!restricted && rows[0].get::<_, String>(0) == format!("s{}", round + 1), "session {i} read the secret"),
                        Err(e) => assert!(restricted && sqlstate(&e) == "42501", "session {i}: {e}"),
                    }
                    let all = text_rows(&c, "SELECT count(*) FROM pl_days").await;
                    assert_eq!(all[0][0].as_deref(), Some("50"));
                }
            })
        })
        .collect();
    for s in sessions {
        s.await.unwrap();
    }
    for w in 0..2 {
        assert!(tessera_backends(&cluster, w).await <= 1);
    }
}

/// A client that goes away in the middle of a block leaves no lock behind:
/// its connections are closed, not pooled.
#[tokio::test]
async fn a_client_gone_mid_transaction_leaves_nothing_behind() {
    let cluster = TestCluster::start(2);
    let c = cluster.connect().await;
    c.batch_execute("CREATE TABLE pl_locks (id int PRIMARY KEY, v int); SELECT create_distributed_table('pl_locks', 'id'); INSERT INTO pl_locks SELECT g, 0 FROM generate_series(1, 10) g")
        .await
        .unwrap();
    let (gone, conn) = tokio_postgres::connect(&cluster.conn_string(), tokio_postgres::NoTls).await.unwrap();
    let task = tokio::spawn(conn);
    gone.batch_execute("BEGIN; UPDATE pl_locks SET v = 1; UPDATE pl_locks SET v = 2 WHERE id = 3").await.unwrap();
    task.abort();
    drop(gone);
    c.batch_execute("SET statement_timeout = '20s'").await.unwrap();
    c.batch_execute("UPDATE pl_locks SET v = v + 10").await.unwrap();
    assert_eq!(text_rows(&c, "SELECT sum(v) FROM pl_locks").await, vec![vec![Some("100".into())]]);
    for w in 0..2 {
        let worker = cluster.connect_worker(w).await;
        assert_eq!(text_rows(&worker, "SELECT count(*) FROM pg_prepared_xacts").await[0][0].as_deref(), Some("0"));
    }
}

/// Connections to the coordinator database are pooled too: many clients
/// that run local statements between their distributed ones share a few,
/// and each keeps its settings (custom ones too) on whichever it gets.
#[tokio::test]
async fn coordinator_database_connections_are_shared_and_keep_each_sessions_settings() {
    let cluster = TestCluster::start(2);
    let setup = cluster.connect().await;
    setup
        .batch_execute("CREATE TABLE pl_items (id int PRIMARY KEY, tenant int); SELECT create_distributed_table('pl_items', 'id'); INSERT INTO pl_items SELECT g, g % 10 FROM generate_series(1, 100) g; CREATE SCHEMA pl_other")
        .await
        .unwrap();
    drop(setup);
    cluster.restart_coordinator(|config| config.connections.max_coordinator_db = Some(3));
    let port = cluster.port;
    let sessions: Vec<_> = (0..40)
        .map(|i| {
            tokio::spawn(async move {
                let c = connect(port).await;
                let tenant = (i % 10).to_string();
                c.batch_execute(&format!("SELECT set_config('app.tenant', '{tenant}', false)")).await.unwrap();
                let path = if i % 2 == 0 { "pl_other, public" } else { "public" };
                c.batch_execute(&format!("SET search_path = {path}")).await.unwrap();
                for round in 0..10 {
                    let shown = text_rows(&c, "SELECT current_setting('app.tenant'), current_setting('search_path')").await;
                    assert_eq!(shown, vec![vec![Some(tenant.clone()), Some(path.to_string())]], "session {i} round {round}");
                    let n = c.query("SELECT count(*)::text FROM pl_items WHERE tenant = $1", &[&tenant.parse::<i32>().unwrap()]).await.unwrap();
                    let n = [vec![Some(n[0].get::<_, String>(0))]];
                    assert_eq!(n[0][0].as_deref(), Some("10"), "session {i} round {round}");
                }
            })
        })
        .collect();
    let mut most = 0;
    let db = common::connect(cluster.cluster.state.coordinator_db_port).await;
    while sessions.iter().any(|s| !s.is_finished()) {
        // Sessions' connections log in with the client's options, not as the
        // coordinator's own service connections ("tessera", and the kept
        // ones of recovery and catalog reloads).
        let rows = text_rows(
            &db,
            "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend' AND application_name NOT IN ('tessera', 'tessera recovery', 'tessera catalog reload') AND pid <> pg_backend_pid()",
        )
        .await;
        most = most.max(rows[0][0].as_deref().unwrap().parse::<usize>().unwrap());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for s in sessions {
        s.await.unwrap();
    }
    assert!(most <= 3, "the coordinator database had {most} session connections");
}

/// A session that made a temporary table keeps its connection (pinned),
/// and with it the table, while other sessions share the rest.
#[tokio::test]
async fn a_session_with_a_temporary_table_keeps_its_connection() {
    let cluster = TestCluster::start(1);
    cluster.restart_coordinator(|config| config.connections.max_coordinator_db = Some(2));
    let pinned = cluster.connect().await;
    pinned.batch_execute("CREATE TEMP TABLE pl_scratch (v int); INSERT INTO pl_scratch VALUES (1), (2)").await.unwrap();
    let others: Vec<_> = (0..10)
        .map(|i| {
            let port = cluster.port;
            tokio::spawn(async move {
                let c = connect(port).await;
                for _ in 0..10 {
                    assert_eq!(
                        text_rows(&c, "SELECT count(*) FROM pg_class WHERE relname = 'pl_scratch' AND pg_table_is_visible(oid)").await[0][0]
                            .as_deref(),
                        Some("0"),
                        "session {i} sees no other session's temporary table"
                    );
                }
            })
        })
        .collect();
    for round in 0..10 {
        pinned.batch_execute(&format!("INSERT INTO pl_scratch VALUES ({round})")).await.unwrap();
    }
    for o in others {
        o.await.unwrap();
    }
    assert_eq!(text_rows(&pinned, "SELECT count(*) FROM pl_scratch").await[0][0].as_deref(), Some("12"));
    // A temporary table could hide a distributed one, so such a session
    // looks its names up: a table distributed in a query string is
    // distributed for the statements after it in the same string.
    pinned
        .batch_execute(
            "CREATE TABLE pl_late (id int, v text); SELECT create_distributed_table('pl_late', 'id');
             INSERT INTO pl_late SELECT g, 'v' FROM generate_series(1, 300) g",
        )
        .await
        .unwrap();
    let other = cluster.connect().await;
    assert_eq!(text_rows(&other, "SELECT count(*) FROM pl_late").await[0][0].as_deref(), Some("300"));
}

/// A client idle in its block longer than `idle_in_transaction_session_timeout`
/// is ended as by PostgreSQL (FATAL 25P03), and its work on every node with it:
/// the pooled connections it held come free.
#[tokio::test]
async fn idle_in_transaction_timeout_ends_the_session_everywhere() {
    let cluster = TestCluster::start(2);
    let c = cluster.connect().await;
    c.batch_execute("CREATE TABLE pl_idle (id int PRIMARY KEY, v int); SELECT create_distributed_table('pl_idle', 'id'); INSERT INTO pl_idle SELECT g, 0 FROM generate_series(1, 10) g")
        .await
        .unwrap();
    let (idle, conn) = tokio_postgres::connect(&cluster.conn_string(), tokio_postgres::NoTls).await.unwrap();
    let task = tokio::spawn(conn);
    idle.batch_execute("SET idle_in_transaction_session_timeout = '1s'").await.unwrap();
    idle.batch_execute("BEGIN; UPDATE pl_idle SET v = 1").await.unwrap();
    let ended = tokio::time::timeout(Duration::from_secs(20), task).await.expect("the session is ended").unwrap();
    let e = ended.expect_err("a FATAL error ends it");
    assert_eq!(sqlstate(&e), "25P03", "{e}");
    // Its row locks went with it, on both workers.
    tokio::time::timeout(Duration::from_secs(10), c.batch_execute("UPDATE pl_idle SET v = 2")).await.expect("no lock left").unwrap();
    assert_eq!(text_rows(&c, "SELECT sum(v) FROM pl_idle").await, vec![vec![Some("20".into())]]);
    // Outside a block, idling is fine.
    let (patient, conn) = tokio_postgres::connect(&cluster.conn_string(), tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(conn);
    patient.batch_execute("SET idle_in_transaction_session_timeout = '1s'").await.unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(text_rows(&patient, "SELECT count(*) FROM pl_idle").await, vec![vec![Some("10".into())]]);
}

/// Clients that log in and wait hold no connection: many more clients than
/// the coordinator database's pool can be connected at once (pgbench opens
/// all its clients before any runs).
#[tokio::test]
async fn clients_connected_at_once_outnumber_the_pools() {
    let cluster = TestCluster::start(2);
    let setup = cluster.connect().await;
    setup.batch_execute("CREATE TABLE pl_many (id int PRIMARY KEY); SELECT create_distributed_table('pl_many', 'id'); INSERT INTO pl_many SELECT generate_series(1, 100)").await.unwrap();
    drop(setup);
    cluster.restart_coordinator(|config| {
        config.connections.max_coordinator_db = Some(4);
        config.connections.max_per_node = Some(4);
        config.connections.pool_wait_secs = 5.0;
    });
    let mut clients = Vec::new();
    for _ in 0..400 {
        clients.push(connect(cluster.port).await);
    }
    let runs: Vec<_> = clients
        .into_iter()
        .enumerate()
        .map(|(i, c)| {
            tokio::spawn(async move {
                let id = (i % 100 + 1) as i32;
                assert_eq!(c.query("SELECT id FROM pl_many WHERE id = $1", &[&id]).await.unwrap().len(), 1);
                assert_eq!(text_rows(&c, "SELECT 1 + 1").await, vec![vec![Some("2".into())]]);
            })
        })
        .collect();
    for r in runs {
        r.await.unwrap();
    }
}

/// Two thousand clients at once against workers that take 100 connections
/// each: the pools size themselves from that, and every client gets correct
/// answers (routed reads, single-node blocks, reads of every shard).
#[tokio::test]
async fn two_thousand_clients_against_workers_of_a_hundred_connections() {
    allow_many_open_files();
    let cluster = TestCluster::start(2);
    let setup = cluster.connect().await;
    setup
        .batch_execute("CREATE TABLE pl_big (id int PRIMARY KEY, hits int); SELECT create_distributed_table('pl_big', 'id'); INSERT INTO pl_big SELECT g, 0 FROM generate_series(1, 2000) g")
        .await
        .unwrap();
    drop(setup);
    for i in 0..2 {
        cluster.connect_worker(i).await.batch_execute("ALTER SYSTEM SET max_connections = 100").await.unwrap();
        cluster.workers()[i].stop().unwrap();
        cluster.start_worker(i);
    }
    cluster.restart_coordinator(|_| {});
    let port = cluster.port;
    let clients: Vec<_> = (0..2000)
        .map(|i| {
            tokio::spawn(async move {
                let c = connect(port).await;
                let id = i + 1;
                c.batch_execute(&format!("BEGIN; UPDATE pl_big SET hits = hits + 1 WHERE id = {id}; COMMIT")).await.unwrap();
                let hits = c.query("SELECT hits FROM pl_big WHERE id = $1", &[&id]).await.unwrap();
                assert_eq!(hits[0].get::<_, i32>(0), 1, "client {i}");
                assert_eq!(text_rows(&c, "SELECT count(*) FROM pl_big").await, vec![vec![Some("2000".into())]], "client {i}");
            })
        })
        .collect();
    for c in clients {
        c.await.unwrap();
    }
    let c = cluster.connect().await;
    assert_eq!(text_rows(&c, "SELECT sum(hits) FROM pl_big").await, vec![vec![Some("2000".into())]]);
}

/// Blocks that write on both workers, from many more clients than a pool
/// holds, half of them taking the nodes in one order and half in the other:
/// unbounded, such blocks come to hold every connection of both nodes, each
/// waiting for the other node, until the pools' wait runs out (53300). The
/// coordinator admits three quarters of a pool's worth of blocks at once;
/// every block commits.
#[tokio::test]
async fn blocks_on_two_nodes_from_many_clients_all_commit() {
    let cluster = TestCluster::start(2);
    let setup = cluster.connect().await;
    setup.batch_execute("CREATE TABLE pl_pairs (id int PRIMARY KEY, v int); SELECT create_distributed_table('pl_pairs', 'id'); INSERT INTO pl_pairs SELECT g, 0 FROM generate_series(1, 400) g").await.unwrap();
    let ports = placement_ports(&setup, "pl_pairs").await;
    let first_port = ports[0];
    let (mut here, mut there): (Vec<i32>, Vec<i32>) = (1..=400).partition(|id| ports[shard_of_int4(*id, ports.len() as u32)] == first_port);
    here.truncate(150);
    there.truncate(150);
    assert_eq!((here.len(), there.len()), (150, 150), "both workers hold rows");
    drop(setup);
    cluster.restart_coordinator(|config| {
        config.connections.max_per_node = Some(8);
        config.connections.pool_wait_secs = 10.0;
    });
    let port = cluster.port;
    let clients: Vec<_> = (0..150)
        .map(|i| {
            let (a, b) = if i % 2 == 0 { (here[i], there[i]) } else { (there[i], here[i]) };
            tokio::spawn(async move {
                let c = connect(port).await;
                for _ in 0..4 {
                    c.batch_execute(&format!("BEGIN; UPDATE pl_pairs SET v = v + 1 WHERE id = {a}; SELECT pg_sleep(0.01); UPDATE pl_pairs SET v = v + 1 WHERE id = {b}; COMMIT"))
                        .await
                        .unwrap_or_else(|e| panic!("client {i}: {}", error_text(&e)));
                }
            })
        })
        .collect();
    for c in clients {
        c.await.unwrap();
    }
    let c = cluster.connect().await;
    assert_eq!(
        text_rows(&c, "SELECT sum(v), count(*) FILTER (WHERE v = 4) FROM pl_pairs").await,
        vec![vec![Some("1200".into()), Some("300".into())]]
    );
}

/// `statement_timeout` and `lock_timeout` hold for the statements' work on
/// the workers, as on PostgreSQL: set, SET LOCAL in a block (undone by its
/// end), reset; the session goes on after each timeout.
#[tokio::test]
async fn statement_and_lock_timeouts_hold_on_the_workers() {
    let cluster = TestCluster::start(2);
    let c = cluster.connect().await;
    c.batch_execute(
        "CREATE TABLE pl_slow (id int PRIMARY KEY, v int); SELECT create_distributed_table('pl_slow', 'id'); INSERT INTO pl_slow SELECT g, 0 FROM generate_series(1, 20) g;
         CREATE ROLE pl_timed LOGIN; GRANT SELECT, UPDATE ON pl_slow TO pl_timed;",
    )
    .await
    .unwrap();
    let user = connect_as(cluster.port, "pl_timed").await;
    user.batch_execute("SET statement_timeout = '300ms'").await.unwrap();
    let routed = user.batch_execute("SELECT pg_sleep(3) FROM pl_slow WHERE id = 1").await.unwrap_err();
    assert_eq!(sqlstate(&routed), "57014", "{routed}");
    assert!(error_text(&routed).contains("statement timeout"), "{routed}");
    let everywhere = user.batch_execute("SELECT pg_sleep(3) FROM pl_slow").await.unwrap_err();
    assert_eq!(sqlstate(&everywhere), "57014", "{everywhere}");
    assert_eq!(text_rows(&user, "SELECT count(*) FROM pl_slow").await, vec![vec![Some("20".into())]], "the session goes on");
    user.batch_execute("RESET statement_timeout").await.unwrap();
    user.batch_execute("SELECT pg_sleep(0.5) FROM pl_slow WHERE id = 1").await.unwrap();
    // SET LOCAL lasts as long as its block.
    user.batch_execute("BEGIN; SET LOCAL statement_timeout = '200ms'").await.unwrap();
    assert_eq!(sqlstate(&user.batch_execute("SELECT pg_sleep(2) FROM pl_slow WHERE id = 2").await.unwrap_err()), "57014");
    user.batch_execute("ROLLBACK").await.unwrap();
    user.batch_execute("SELECT pg_sleep(0.5) FROM pl_slow WHERE id = 2").await.unwrap();
    // lock_timeout: a row another session holds.
    c.batch_execute("BEGIN; UPDATE pl_slow SET v = 1 WHERE id = 3").await.unwrap();
    user.batch_execute("SET lock_timeout = '200ms'").await.unwrap();
    let locked = user.batch_execute("UPDATE pl_slow SET v = 2 WHERE id = 3").await.unwrap_err();
    assert_eq!(sqlstate(&locked), "55P03", "{locked}");
    c.batch_execute("COMMIT").await.unwrap();
    user.batch_execute("UPDATE pl_slow SET v = 2 WHERE id = 3").await.unwrap();
    assert_eq!(text_rows(&c, "SELECT v FROM pl_slow WHERE id = 3").await, vec![vec![Some("2".into())]]);
}

/// The coordinator shows its pools and its clients, the pinned ones with
/// why (`tessera.connection_pools`, `tessera.client_sessions`, and `tessera
/// status` from both).
#[tokio::test]
async fn pools_and_pinned_sessions_are_shown() {
    let cluster = TestCluster::start(2);
    let c = cluster.connect().await;
    c.batch_execute("CREATE TABLE pl_seen (id int PRIMARY KEY); SELECT create_distributed_table('pl_seen', 'id'); INSERT INTO pl_seen SELECT generate_series(1, 10); CREATE ROLE pl_watcher LOGIN").await.unwrap();
    let pinned = connect_as(cluster.port, "pl_watcher").await;
    pinned.batch_execute("CREATE TEMP TABLE pl_mine (v int)").await.unwrap();
    let listening = cluster.connect().await;
    listening.batch_execute("LISTEN pl_news").await.unwrap();
    let watcher = connect_as(cluster.port, "pl_watcher").await;
    let sessions = text_rows(&watcher, "SELECT user_name, pinned_by FROM tessera.client_sessions WHERE pinned_by IS NOT NULL ORDER BY 1").await;
    assert_eq!(
        sessions,
        vec![vec![Some("pl_watcher".into()), Some("a temporary table".into())], vec![Some("postgres".into()), Some("LISTEN".into())]]
    );
    assert_eq!(text_rows(&watcher, "SELECT count(*) FROM tessera.client_sessions").await, vec![vec![Some("4".into())]]);
    let pools = text_rows(&watcher, "SELECT node LIKE '%coordinator database%', max_connections > 0, open_connections >= idle_connections, max_blocks > 0 FROM tessera.connection_pools").await;
    assert_eq!(pools.len(), 3, "the coordinator database and two workers: {pools:?}");
    assert!(pools[0][0].as_deref() == Some("t") && pools.iter().all(|r| r[1..].iter().all(|v| v.as_deref() == Some("t"))), "{pools:?}");
    let direct = cluster.connect_coordinator_db().await.batch_execute("SELECT * FROM tessera.client_sessions").await.unwrap_err();
    assert_eq!(sqlstate(&direct), "0A000");
    let out = std::process::Command::new(common::tessera_bin()).args(["status", "--data-dir"]).arg(cluster.data_dir()).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("2 pinned") && text.contains("pl_watcher, a temporary table") && text.contains("LISTEN"), "{text}");
    assert_eq!(text.matches("pool ").count(), 3, "{text}");
}

/// Five thousand clients connected to one coordinator process at once, each
/// answered while all stay connected.
#[tokio::test]
async fn five_thousand_clients_connected_at_once() {
    allow_many_open_files();
    let cluster = TestCluster::start(2);
    let setup = cluster.connect().await;
    setup.batch_execute("CREATE TABLE pl_crowd (id int PRIMARY KEY); SELECT create_distributed_table('pl_crowd', 'id'); INSERT INTO pl_crowd SELECT generate_series(1, 5000)").await.unwrap();
    let port = cluster.port;
    let mut clients = Vec::with_capacity(5000);
    for batch in 0..50 {
        let connecting: Vec<_> = (0..100).map(|_| tokio::spawn(async move { connect(port).await })).collect();
        for c in connecting {
            clients.push(c.await.unwrap_or_else(|e| panic!("batch {batch}: {e}")));
        }
    }
    assert_eq!(text_rows(&setup, "SELECT count(*) FROM tessera.client_sessions").await, vec![vec![Some("5001".into())]]);
    let answers: Vec<_> = clients
        .into_iter()
        .enumerate()
        .map(|(i, c)| {
            tokio::spawn(async move {
                let id = i as i32 + 1;
                assert_eq!(c.query("SELECT id FROM pl_crowd WHERE id = $1", &[&id]).await.unwrap().len(), 1, "client {i}");
                c
            })
        })
        .collect();
    let mut still_connected = Vec::with_capacity(5000);
    for a in answers {
        still_connected.push(a.await.unwrap());
    }
    assert!(still_connected.iter().all(|c| !c.is_closed()));
}

/// A node that accepts the TCP connection but never answers (a hung server,
/// a half-open network path) fails the statement that needed it once
/// `[connections] node_connect_timeout_secs` has passed, with 08001 naming
/// the node, instead of holding the session for good; the session goes on.
#[tokio::test]
async fn a_node_that_never_answers_fails_in_time() {
    let cluster = TestCluster::start(1);
    cluster.restart_coordinator(|c| c.connections.node_connect_timeout_secs = 1.5);
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = silent.local_addr().unwrap().port();
    // Accepts and keeps every connection, reading nothing.
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for stream in silent.incoming() {
            held.push(stream);
        }
    });
    let c = cluster.connect().await;
    let started = std::time::Instant::now();
    let add = format!("SELECT citus_add_node('127.0.0.1', {port})");
    let adding = c.batch_execute(&add);
    let e = tokio::time::timeout(Duration::from_secs(30), adding).await.expect("the call still waits for the silent node").unwrap_err();
    let waited = started.elapsed();
    assert_eq!(sqlstate(&e), "08001", "{}", error_text(&e));
    assert!(error_text(&e).contains(&format!("127.0.0.1:{port}")) && error_text(&e).contains("no answer within 1.5 s"), "{}", error_text(&e));
    assert!(waited >= Duration::from_millis(1400) && waited < Duration::from_secs(10), "failed after {waited:?}");
    assert_eq!(text_rows(&c, "SELECT count(*) FROM pg_dist_node").await, vec![vec![Some("1".into())]], "the node was not added");
}
