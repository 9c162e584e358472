//! Wire-protocol behaviour through the coordinator: pass-through of local work,
//! COPY, notices, cancellation, SSL negotiation and psql's meta-commands.

mod common;
use common::{sqlstate, text_rows, TestCluster};
use std::time::{Duration, Instant};
use tessera::config::{Login, ServerAddr};
use tessera::connection::PgConnection;
use tessera::protocol::frontend;

/// A connection that speaks the protocol message by message (Tessera's own
/// codec), for what client libraries do not let a test control.
async fn raw_connect(port: u16) -> PgConnection {
    let login = Login { user: "postgres".into(), database: "postgres".into(), password: None, options: Vec::new() };
    PgConnection::connect(&ServerAddr { host: "127.0.0.1".into(), port }, &login).await.unwrap()
}

#[tokio::test]
async fn local_work_passes_through() {
    let cluster = TestCluster::start(1);
    let c = cluster.connect().await;
    c.batch_execute("CREATE TABLE notes (id int PRIMARY KEY, body text); CREATE FUNCTION twice(int) RETURNS int LANGUAGE sql AS 'SELECT $1 * 2'")
        .await
        .unwrap();
    let n = c.execute("INSERT INTO notes SELECT g, 'n' || g FROM generate_series(1, 100) g", &[]).await.unwrap();
    assert_eq!(n, 100);
    let r = c.query_one("SELECT twice($1), count(*) FROM notes WHERE id > $2", &[&21i32, &90i32]).await.unwrap();
    assert_eq!((r.get::<_, i32>(0), r.get::<_, i64>(1)), (42, 10));
    // SET travels with the session; SHOW sees it.
    c.batch_execute("SET application_name = 'probe'").await.unwrap();
    assert_eq!(text_rows(&c, "SHOW application_name").await, vec![vec![Some("probe".into())]]);
    // Errors keep their SQLSTATE and the session goes on.
    let err = c.simple_query("SELECT 1/0").await.unwrap_err();
    assert_eq!(sqlstate(&err), "22012");
    let err = c.simple_query("SELEC 1").await.unwrap_err();
    assert_eq!(sqlstate(&err), "42601");
    assert_eq!(text_rows(&c, "SELECT count(*) FROM notes").await, vec![vec![Some("100".into())]]);
}

#[tokio::test]
async fn copy_in_and_out_of_local_tables() {
    let cluster = TestCluster::start(1);
    let c = cluster.connect().await;
    c.batch_execute("CREATE TABLE loaded (id int, name text)").await.unwrap();
    let sink = c.copy_in("COPY loaded FROM STDIN").await.unwrap();
    use futures::SinkExt;
    let mut sink = Box::pin(sink);
    let data: String = (1..=1000).map(|i| format!("{i}\tname {i}\n")).collect();
    sink.send(bytes::Bytes::from(data.clone())).await.unwrap();
    let n = sink.as_mut().finish().await.unwrap();
    assert_eq!(n, 1000);
    let stream = c.copy_out("COPY (SELECT * FROM loaded ORDER BY id) TO STDOUT").await.unwrap();
    use futures::TryStreamExt;
    let chunks: Vec<bytes::Bytes> = stream.try_collect().await.unwrap();
    let out: Vec<u8> = chunks.concat();
    assert_eq!(String::from_utf8(out).unwrap(), data);
    // psql's \copy uses the same path.
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), "5001\tfrom psql\n5002\tagain\n").unwrap();
    let (ok, _, err) = cluster.psql(&format!("\\copy loaded FROM '{}'", file.path().display()));
    assert!(ok, "{err}");
    assert_eq!(text_rows(&c, "SELECT count(*) FROM loaded").await, vec![vec![Some("1002".into())]]);
}

#[tokio::test]
async fn notices_and_psql_meta_commands() {
    let cluster = TestCluster::start(2);
    let (ok, _, err) = cluster.psql("CREATE TABLE shown (id int PRIMARY KEY, v text); SELECT create_distributed_table('shown', 'id');");
    assert!(ok, "{err}");
    let (ok, out, err) = cluster.psql("\\d shown");
    assert!(ok, "{err}");
    assert!(out.contains("id|integer||not null") && out.contains("v|text"), "\\d shows the shell's definition: {out}");
    let (ok, out, err) = cluster.psql("\\di shown*");
    assert!(ok, "{err}");
    assert!(out.contains("shown_pkey"), "{out}");
    let (ok, _, err) = cluster.psql("DO $$ BEGIN RAISE NOTICE 'hello from %', 'plpgsql'; END $$");
    assert!(ok);
    assert!(err.contains("NOTICE:  hello from plpgsql"), "{err}");
}

#[tokio::test]
async fn cancel_request_stops_a_running_query() {
    let cluster = TestCluster::start(1);
    let c = cluster.connect().await;
    let token = c.cancel_token();
    let started = Instant::now();
    let cancel = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(500)).await;
        token.cancel_query(tokio_postgres::NoTls).await.unwrap();
    });
    let err = c.simple_query("SELECT pg_sleep(20)").await.unwrap_err();
    cancel.await.unwrap();
    assert_eq!(sqlstate(&err), "57014");
    assert!(started.elapsed() < Duration::from_secs(10));
    assert_eq!(text_rows(&c, "SELECT 1").await, vec![vec![Some("1".into())]]);
}

/// Without `[tls]` the coordinator declines SSLRequest, as PostgreSQL with
/// `ssl = off` does (tests/transport.rs has TLS itself).
#[tokio::test]
async fn ssl_is_declined_without_tls_and_clients_fall_back() {
    let cluster = TestCluster::start(1);
    cluster.restart_coordinator(|config| config.tls = None);
    let out = std::process::Command::new("psql")
        .arg(format!("host=127.0.0.1 port={} user=postgres dbname=postgres sslmode=prefer", cluster.port))
        .args(["-X", "-A", "-t", "-c", "SELECT 42"])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "42", "{}", String::from_utf8_lossy(&out.stderr));
    let out = std::process::Command::new("psql")
        .arg(format!("host=127.0.0.1 port={} user=postgres dbname=postgres sslmode=require", cluster.port))
        .args(["-X", "-c", "SELECT 1"])
        .output()
        .unwrap();
    assert!(!out.status.success(), "sslmode=require must fail: the coordinator does not offer SSL");
}

#[tokio::test]
async fn settings_reach_the_workers() {
    let cluster = TestCluster::start(2);
    let c = cluster.connect().await;
    c.batch_execute(
        "CREATE TABLE moments (id int PRIMARY KEY, d date, at timestamptz);
         INSERT INTO moments VALUES (1, '2024-03-15', '2024-03-15 12:00:00+00');
         SELECT create_distributed_table('moments', 'id');",
    )
    .await
    .unwrap();
    // A worker connection exists before the SET, and one is opened after it.
    assert_eq!(text_rows(&c, "SELECT d FROM moments WHERE id = 1").await, vec![vec![Some("2024-03-15".into())]]);
    c.batch_execute("SET DateStyle = 'SQL, DMY'; SET TimeZone = 'Asia/Tokyo'").await.unwrap();
    let local = text_rows(&c, "SELECT '2024-03-15'::date, '2024-03-15 12:00:00+00'::timestamptz").await;
    assert_eq!(local, vec![vec![Some("15/03/2024".into()), Some("15/03/2024 21:00:00 JST".into())]]);
    assert_eq!(text_rows(&c, "SELECT d, at FROM moments WHERE id = 1").await, local, "routed rows are formatted like local ones");
    assert_eq!(text_rows(&c, "SELECT min(d), max(at) FROM moments").await, local, "and so are combined aggregates");
}

/// Statements that once killed the whole coordinator process (an assertion
/// or a NULL dereference in libpg_query's deparser, reached through our
/// rewrites) are answered now, and a session opened beforehand never notices.
#[tokio::test]
async fn shapes_that_once_crashed_the_coordinator() {
    let cluster = TestCluster::start(2);
    let c = cluster.connect().await;
    c.batch_execute(
        "CREATE TABLE d (k int PRIMARY KEY, v int);
         SELECT create_distributed_table('d', 'k');
         CREATE TABLE e (k int, w int);
         SELECT create_distributed_table('e', 'k');
         INSERT INTO d SELECT g, g FROM generate_series(1, 20) g;
         INSERT INTO e SELECT g, g % 5 FROM generate_series(1, 20) g;",
    )
    .await
    .unwrap();
    let bystander = cluster.connect().await;
    bystander.batch_execute("BEGIN; INSERT INTO d VALUES (100, 100)").await.unwrap();

    use futures::{SinkExt, TryStreamExt};
    let out: Vec<bytes::Bytes> = c.copy_out("COPY d TO STDOUT (FORMAT text)").await.unwrap().try_collect().await.unwrap();
    assert_eq!(out.concat().iter().filter(|b| **b == b'\n').count(), 20);
    let sink = c.copy_in("COPY d FROM STDIN WITH (FORMAT 'text', DELIMITER ',')").await.unwrap();
    let mut sink = Box::pin(sink);
    sink.send(bytes::Bytes::from_static(b"21,21\n22,22\n")).await.unwrap();
    assert_eq!(sink.as_mut().finish().await.unwrap(), 2);
    assert_eq!(
        text_rows(&c, "SELECT (ARRAY[1, 2, 3])[2], (ARRAY[k, v])[1] FROM d WHERE k = 1").await,
        vec![vec![Some("2".into()), Some("1".into())]]
    );
    assert_eq!(text_rows(&c, "SELECT count(*) FROM d TABLESAMPLE system (100) JOIN e ON e.w = d.v").await, vec![vec![Some("16".into())]]);

    bystander.batch_execute("COMMIT").await.unwrap();
    assert_eq!(text_rows(&bystander, "SELECT count(*) FROM d").await, vec![vec![Some("23".into())]]);
}

/// LISTEN through the coordinator: a notification reaches an idle listener
/// at once, without it sending anything, as from PostgreSQL.
#[tokio::test]
async fn notifications_reach_an_idle_listener() {
    let cluster = TestCluster::start(1);
    let (listener, mut connection) = tokio_postgres::connect(&cluster.conn_string(), tokio_postgres::NoTls).await.unwrap();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut messages = futures::stream::poll_fn(move |cx| connection.poll_message(cx));
        use futures::StreamExt;
        while let Some(Ok(message)) = messages.next().await {
            if let tokio_postgres::AsyncMessage::Notification(n) = message {
                let _ = tx.send((n.channel().to_string(), n.payload().to_string()));
            }
        }
    });
    listener.batch_execute("LISTEN jobs").await.unwrap();
    let sender = cluster.connect().await;
    for payload in ["first", "second"] {
        sender.batch_execute(&format!("NOTIFY jobs, '{payload}'")).await.unwrap();
        let got = tokio::time::timeout(Duration::from_secs(5), rx.recv()).await.expect("the notification arrives while the listener is idle");
        assert_eq!(got, Some(("jobs".to_string(), payload.to_string())));
    }
    // The listener's session goes on as before.
    assert_eq!(text_rows(&listener, "SELECT 1").await, vec![vec![Some("1".into())]]);
}

/// An Execute with a row limit on a distributed statement hands out that many
/// rows and suspends the portal, as PostgreSQL does (asyncpg's cursor.fetch,
/// JDBC's setFetchSize, postgres.js .cursor()).
#[tokio::test]
async fn row_limited_execute_suspends_the_portal() {
    let cluster = TestCluster::start(2);
    let mut c = cluster.connect().await;
    c.batch_execute(
        "CREATE TABLE items (id int PRIMARY KEY, name text);
         SELECT create_distributed_table('items', 'id', shard_count => 4);
         INSERT INTO items SELECT g, 'item ' || g FROM generate_series(1, 200) g;",
    )
    .await
    .unwrap();
    let tx = c.transaction().await.unwrap();
    for (sql, expected) in [
        ("SELECT id FROM items ORDER BY id", 200usize),
        ("SELECT id FROM items WHERE id > 150 ORDER BY id", 50),
        ("SELECT id FROM items WHERE id = 7", 1),
    ] {
        let portal = tx.bind(sql, &[]).await.unwrap();
        let mut fetched: Vec<i32> = Vec::new();
        let mut batches = 0;
        loop {
            let rows = tx.query_portal(&portal, 7).await.unwrap();
            assert!(rows.len() <= 7, "{sql}: at most the limit per Execute");
            batches += 1;
            if rows.is_empty() {
                break;
            }
            fetched.extend(rows.iter().map(|r| r.get::<_, i32>(0)));
        }
        let all: Vec<i32> = tx.query(sql, &[]).await.unwrap().iter().map(|r| r.get(0)).collect();
        assert_eq!(fetched, all, "{sql}");
        assert_eq!(fetched.len(), expected, "{sql}");
        assert_eq!(batches, expected / 7 + usize::from(expected % 7 != 0) + 1, "{sql}: batches of 7, then an empty one");
    }
    tx.commit().await.unwrap();
}

/// The coordinator's peak resident memory, from /proc.
fn coordinator_peak_kb(cluster: &TestCluster) -> u64 {
    let pid = cluster.cluster.coordinator_pid().expect("coordinator running");
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status.lines().find_map(|l| l.strip_prefix("VmHWM:")).and_then(|v| v.trim().trim_end_matches(" kB").trim().parse().ok()).unwrap()
}

/// A row-limited Execute of a read across every shard streams: each Execute
/// reads only its rows from the workers, so fetching a result far larger than
/// any one batch leaves the coordinator's memory where it was, and other
/// statements in between still see the rows that are left.
#[tokio::test]
async fn row_limited_reads_stream_with_bounded_memory() {
    let cluster = TestCluster::start(2);
    let mut c = cluster.connect().await;
    c.batch_execute("CREATE TABLE wide (id int, pad text); SELECT create_distributed_table('wide', 'id')").await.unwrap();
    // In slices: rows from a local source pass through the coordinator.
    for start in (1..=120_000).step_by(5000) {
        c.execute("INSERT INTO wide SELECT g, repeat(md5(g::text), 16) FROM generate_series($1::int, $1::int + 4999) g", &[&start]).await.unwrap();
    }
    // Reads the whole table through a window of 1,000 rows; `between` runs
    // once, after the first batch. Returns the row count and the sum of ids.
    async fn read_all(c: &mut tokio_postgres::Client, between: Option<&str>) -> (u64, i64) {
        let tx = c.transaction().await.unwrap();
        let portal = tx.bind("SELECT id, pad FROM wide", &[]).await.unwrap();
        let (mut count, mut sum) = (0u64, 0i64);
        let mut between = between;
        loop {
            let rows = tx.query_portal(&portal, 1000).await.unwrap();
            assert!(rows.len() <= 1000);
            if rows.is_empty() {
                break;
            }
            count += rows.len() as u64;
            sum += rows.iter().map(|r| i64::from(r.get::<_, i32>(0))).sum::<i64>();
            if let Some(sql) = between.take() {
                assert_eq!(tx.query_one(sql, &[]).await.unwrap().get::<_, i64>(0), 9);
            }
        }
        tx.commit().await.unwrap();
        (count, sum)
    }
    let before = coordinator_peak_kb(&cluster);
    // 120,000 rows of about 530 bytes: some 64 MB through a 1,000-row window.
    assert_eq!(read_all(&mut c, None).await, (120_000, 120_000 * 120_001 / 2));
    let grown = coordinator_peak_kb(&cluster).saturating_sub(before);
    assert!(grown < 24 * 1024, "the coordinator's peak memory grew by {grown} kB");

    // Another statement in between: the rest of the stream is held, and the
    // portal goes on where it was.
    assert_eq!(read_all(&mut c, Some("SELECT count(*) FROM wide WHERE id < 10")).await, (120_000, 120_000 * 120_001 / 2));

    // Closing a portal mid-stream, and ending its transaction, leave the
    // connections usable.
    let tx = c.transaction().await.unwrap();
    let portal = tx.bind("SELECT id FROM wide", &[]).await.unwrap();
    assert_eq!(tx.query_portal(&portal, 10).await.unwrap().len(), 10);
    drop(portal);
    assert_eq!(tx.query_one("SELECT count(*) FROM wide", &[]).await.unwrap().get::<_, i64>(0), 120_000);
    tx.rollback().await.unwrap();
    assert_eq!(c.query_one("SELECT count(*) FROM wide WHERE id > 119990", &[]).await.unwrap().get::<_, i64>(0), 10);
}

/// Each Execute of a row-limited portal ends as PostgreSQL's does: a full
/// batch suspends the portal, the batch that finds the end completes with
/// the count of its own rows ("SELECT 5", and "SELECT 0" after a full batch
/// that happened to take the last rows). Clients such as postgres.js hand a
/// completion with a count to the application as another batch.
#[tokio::test]
async fn row_limited_executes_end_as_postgresql_does() {
    let plain = common::PlainPostgres::start();
    let cluster = TestCluster::start(2);
    let setup = "CREATE TABLE batches (id int PRIMARY KEY, v int); INSERT INTO batches SELECT g, g FROM generate_series(1, 40) g";
    plain.connect().await.batch_execute(setup).await.unwrap();
    cluster.connect().await.batch_execute(&setup.replace("; INSERT", "; SELECT create_distributed_table('batches', 'id'); INSERT")).await.unwrap();

    // Per Execute of 10 rows: the rows it gave and how it ended.
    async fn batches(port: u16, sql: &str) -> Vec<(usize, String)> {
        let mut conn = raw_connect(port).await;
        conn.execute("BEGIN").await.unwrap();
        frontend::parse(conn.out(), "", sql, &[]);
        frontend::bind(conn.out(), "p", "", &[], &[], &[]);
        let mut ends = Vec::new();
        loop {
            frontend::execute(conn.out(), "p", 10);
            frontend::flush(conn.out());
            let mut rows = 0;
            let end = loop {
                let msg = conn.recv().await.unwrap();
                match msg.tag() {
                    b'D' => rows += 1,
                    b's' => break "suspended".to_string(),
                    b'C' => break String::from_utf8_lossy(msg.body().strip_suffix(&[0]).unwrap()).into_owned(),
                    b'E' => panic!("{sql}: error {:?}", String::from_utf8_lossy(msg.body())),
                    _ => {}
                }
            };
            let done = end != "suspended";
            ends.push((rows, end));
            if done {
                break;
            }
        }
        frontend::sync(conn.out());
        while conn.recv().await.unwrap().tag() != b'Z' {}
        conn.execute("ROLLBACK").await.unwrap();
        ends
    }
    for sql in [
        "SELECT id FROM batches WHERE id <= 30",
        "SELECT id FROM batches WHERE id <= 25",
        "SELECT id FROM batches WHERE id <= 25 ORDER BY id",
        "SELECT id FROM batches WHERE id = 7",
        "INSERT INTO batches SELECT generate_series(101, 125) RETURNING id",
        "UPDATE batches SET v = v + 1 WHERE id <= 20 RETURNING id",
    ] {
        let want = batches(plain.instance.port, sql).await;
        assert_eq!(batches(cluster.port, sql).await, want, "{sql}");
    }
}

/// The same statement text bound with parameters of different types, in
/// binary (psycopg types an int by its value, int2 or int4 or int8): each
/// binding reaches the worker with the types it was parsed with.
#[tokio::test]
async fn one_text_with_differently_typed_parameters() {
    let cluster = TestCluster::start(2);
    cluster.connect().await.batch_execute("CREATE TABLE typed_keys (id bigint PRIMARY KEY, v text); SELECT create_distributed_table('typed_keys', 'id'); INSERT INTO typed_keys VALUES (7, 'seven')").await.unwrap();
    let mut conn = raw_connect(cluster.port).await;
    let sql = "SELECT v FROM typed_keys WHERE id = $1::bigint";
    let seven: [(u32, bytes::Bytes); 3] =
        [(21, 7i16.to_be_bytes().to_vec().into()), (23, 7i32.to_be_bytes().to_vec().into()), (20, 7i64.to_be_bytes().to_vec().into())];
    for _ in 0..2 {
        for (type_oid, value) in &seven {
            frontend::parse(conn.out(), "", sql, &[*type_oid]);
            frontend::bind(conn.out(), "", "", &[1], &[Some(value.clone())], &[]);
            frontend::execute(conn.out(), "", 0);
            frontend::sync(conn.out());
            let mut got = Vec::new();
            loop {
                let msg = conn.recv().await.unwrap();
                match msg.tag() {
                    b'D' => got.push(String::from_utf8_lossy(&msg.body()[6..]).into_owned()),
                    b'E' => panic!("type {type_oid}: {}", String::from_utf8_lossy(msg.body())),
                    b'Z' => break,
                    _ => {}
                }
            }
            assert_eq!(got, vec!["seven".to_string()], "parameter of type {type_oid}");
        }
    }
}

/// The cursor position of an error (psql's `LINE 1: …` and caret) points
/// where plain PostgreSQL's does, although the node ran a rewritten text;
/// where it cannot be placed surely, there is none rather than a wrong one.
#[tokio::test]
async fn error_positions_point_into_the_clients_text() {
    let cluster = TestCluster::start(2);
    let plain = common::PlainPostgres::start();
    let (t, p) = (cluster.connect().await, plain.connect().await);
    let schema = "CREATE TABLE items (id int PRIMARY KEY, name text, qty int)";
    p.batch_execute(schema).await.unwrap();
    t.batch_execute(&format!("{schema}; SELECT create_distributed_table('items', 'id')")).await.unwrap();
    let position = |e: tokio_postgres::Error| match e.as_db_error().and_then(|d| d.position()) {
        Some(tokio_postgres::error::ErrorPosition::Original(at)) => Some(*at),
        _ => None,
    };
    let same = [
        "SELECT   name,   nope FROM items WHERE id = 1",
        "select name, NOPE from items",
        "SELECT i.name FROM items i WHERE i.qty > 0 AND missing_column = 2",
        "UPDATE items SET qty = qty + 1 WHERE id = 3 AND nope IS NULL",
        "SELECT 1; SELECT name FROM items WHERE   ghost = 1",
    ];
    for sql in same {
        let (expected, got) = (position(p.simple_query(sql).await.unwrap_err()), position(t.simple_query(sql).await.unwrap_err()));
        assert!(expected.is_some());
        assert_eq!(got, expected, "{sql}");
        // The extended protocol (one statement).
        if !sql.contains(';') {
            let (expected, got) = (position(p.query(sql, &[]).await.unwrap_err()), position(t.query(sql, &[]).await.unwrap_err()));
            assert_eq!(got, expected, "{sql} (extended)");
        }
    }
    // Where the name occurs twice, or the message names nothing, no caret.
    for sql in ["SELECT nope, nope FROM items WHERE id = 1", "SELECT name FROM items WHERE    id = 'x'::text"] {
        assert!(position(p.simple_query(sql).await.unwrap_err()).is_some());
        assert_eq!(position(t.simple_query(sql).await.unwrap_err()), None, "{sql}");
    }
}
