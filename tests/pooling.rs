//! Sessions share a bounded pool of connections to each worker: they hold
//! one only for a transaction block or an exchange in progress, and every
//! session's settings, role and prepared statements stay its own on
//! whichever connection runs its next statement.

mod common;
use common::{connect, sqlstate, text_rows, TestCluster};
use std::time::Duration;

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
                    let n = vec![vec![Some(n[0].get::<_, String>(0))]];
                    assert_eq!(n[0][0].as_deref(), Some("10"), "session {i} round {round}");
                }
            })
        })
        .collect();
    let mut most = 0;
    let db = common::connect(cluster.cluster.state.coordinator_db_port).await;
    while sessions.iter().any(|s| !s.is_finished()) {
        // Sessions' connections log in with the client's options, not as the
        // coordinator's own service connections ("tessera").
        let rows = text_rows(&db, "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend' AND application_name <> 'tessera' AND pid <> pg_backend_pid()").await;
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
                    assert_eq!(text_rows(&c, "SELECT count(*) FROM pg_class WHERE relname = 'pl_scratch' AND pg_table_is_visible(oid)").await[0][0].as_deref(), Some("0"), "session {i} sees no other session's temporary table");
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
    // SAFETY: getrlimit/setrlimit only read and write the struct passed.
    unsafe {
        let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0 {
            limit.rlim_cur = limit.rlim_max.min(16384);
            libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
        }
    }
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
