//! Client authentication at the coordinator with `auth = "scram-sha-256"`:
//! passwords are checked against the roles' SCRAM verifiers in the coordinator
//! database, with tokio-postgres and psql as clients; every failure is the same
//! FATAL 28P01.

mod common;
use common::{sqlstate, text_rows, TestCluster};
use std::process::Command;
use tessera::protocol::{backend, frontend, take_message, Message};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_postgres::NoTls;

async fn login(cluster: &TestCluster, user: &str, password: &str) -> Result<tokio_postgres::Client, tokio_postgres::Error> {
    common::try_login(cluster.port, user, password).await
}

fn assert_refused(result: Result<tokio_postgres::Client, tokio_postgres::Error>, user: &str) {
    let e = result.err().unwrap_or_else(|| panic!("{user} logged in"));
    assert_eq!(sqlstate(&e), "28P01", "{e}");
    let db = e.as_db_error().unwrap();
    assert_eq!(db.severity(), "FATAL");
    assert_eq!(db.message(), format!("password authentication failed for user \"{user}\""));
}

fn psql(cluster: &TestCluster, user: &str, password: &str, sql: &str) -> (bool, String, String) {
    let out = Command::new("psql")
        .args(["-h", "127.0.0.1", "-p", &cluster.port.to_string(), "-U", user, "-d", "postgres", "-X", "-A", "-t", "-w", "-c", sql])
        .env("PGPASSWORD", password)
        .output()
        .expect("psql");
    (out.status.success(), String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
}

/// Reads messages off a raw connection until `want`; None once the server has
/// closed (or reset) the connection.
async fn read_until(stream: &mut tokio::net::TcpStream, buf: &mut bytes::BytesMut, want: u8) -> Option<Message> {
    loop {
        while let Some(msg) = take_message(buf).unwrap() {
            if msg.tag() == want {
                return Some(msg);
            }
        }
        if stream.read_buf(buf).await.unwrap_or(0) == 0 {
            return None;
        }
    }
}

/// Starts a raw connection as `user` and returns it once the server asked for SASL.
async fn raw_sasl_start(cluster: &TestCluster, user: &str) -> (tokio::net::TcpStream, bytes::BytesMut) {
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", cluster.port)).await.unwrap();
    let mut out = bytes::BytesMut::new();
    frontend::startup(&mut out, &[("user", user), ("database", "postgres")]);
    stream.write_all(&out).await.unwrap();
    let mut buf = bytes::BytesMut::new();
    let msg = read_until(&mut stream, &mut buf, b'R').await.expect("an authentication request");
    let (code, payload) = backend::decode_authentication(&msg).unwrap();
    assert_eq!((code, payload), (10, &b"SCRAM-SHA-256\0\0"[..]), "AuthenticationSASL offering only SCRAM-SHA-256");
    (stream, buf)
}

/// Sends `out` and expects FATAL 28P01 followed by the server closing.
async fn expect_refusal(stream: &mut tokio::net::TcpStream, buf: &mut bytes::BytesMut, out: &[u8]) {
    stream.write_all(out).await.unwrap();
    let msg = read_until(stream, buf, b'E').await.expect("an ErrorResponse");
    let e = backend::decode_error_fields(&msg).unwrap();
    assert_eq!((e.code(), e.severity(), e.message()), ("28P01", "FATAL", "password authentication failed for user \"alice\""));
    assert!(read_until(stream, buf, b'Z').await.is_none(), "the server closes the connection");
}

#[tokio::test]
async fn scram_sha_256_client_authentication() {
    let cluster = TestCluster::start(1);
    // Roles, made while the coordinator still trusts everyone: alice has a SCRAM
    // verifier (PostgreSQL 10+ default), bob has no password, carol an md5 hash.
    let db = cluster.connect_coordinator_db().await;
    db.batch_execute(
        "CREATE ROLE alice LOGIN PASSWORD 'secret';
         CREATE ROLE bob LOGIN;
         SET password_encryption = 'md5';
         CREATE ROLE carol LOGIN PASSWORD 'md5-secret';
         RESET password_encryption;
         ALTER ROLE postgres PASSWORD 'postgres-secret';",
    )
    .await
    .unwrap();
    let stored = text_rows(&db, "SELECT rolname, left(rolpassword, 14) FROM pg_authid WHERE rolname IN ('alice', 'carol') ORDER BY 1").await;
    assert_eq!(stored[0][1].as_deref(), Some("SCRAM-SHA-256$"));
    assert_eq!(stored[1][1].as_deref().map(|s| &s[..3]), Some("md5"));

    // Trust is the default: no password needed yet.
    assert!(cluster.connect().await.simple_query("SELECT 1").await.is_ok());

    cluster.restart_coordinator(|c| c.auth = tessera::config::AuthMethod::ScramSha256);

    // The right password logs in and runs queries, local and distributed.
    let alice = login(&cluster, "alice", "secret").await.expect("alice logs in");
    assert_eq!(text_rows(&alice, "SELECT current_user, session_user").await, vec![vec![Some("alice".into()), Some("alice".into())]]);
    let admin = login(&cluster, "postgres", "postgres-secret").await.expect("postgres logs in");
    admin
        .batch_execute(
            "CREATE TABLE items (id bigint PRIMARY KEY, name text);
             SELECT create_distributed_table('items', 'id', shard_count => 4);
             INSERT INTO items VALUES (1, 'item 1'), (7, 'item 7'), (12, 'item 12'), (20, 'item 20');",
        )
        .await
        .unwrap();
    assert_eq!(text_rows(&admin, "SELECT count(*) FROM items").await, vec![vec![Some("4".into())]]);
    assert_eq!(text_rows(&admin, "SELECT name FROM items WHERE id = 7").await, vec![vec![Some("item 7".into())]]);

    // Wrong passwords, unknown roles and roles without a SCRAM verifier all get
    // the same answer.
    assert_refused(login(&cluster, "alice", "wrong").await, "alice");
    assert_refused(login(&cluster, "alice", "").await, "alice");
    assert_refused(login(&cluster, "postgres", "secret").await, "postgres");
    assert_refused(login(&cluster, "nobody", "secret").await, "nobody");
    assert_refused(login(&cluster, "bob", "anything").await, "bob");
    assert_refused(login(&cluster, "carol", "md5-secret").await, "carol");
    // The harness's password-less login no longer gets in.
    let no_password = tokio_postgres::connect(&cluster.conn_string(), NoTls).await;
    assert!(no_password.is_err(), "a login without a password must fail");

    // psql (libpq) with PGPASSWORD.
    let (ok, out, err) = psql(&cluster, "alice", "secret", "SELECT current_user");
    assert!(ok, "psql as alice: {err}");
    assert_eq!(out.trim(), "alice");
    let (ok, out, err) = psql(&cluster, "postgres", "postgres-secret", "SELECT count(*) FROM items");
    assert!(ok, "psql as postgres: {err}");
    assert_eq!(out.trim(), "4");
    let (ok, _, err) = psql(&cluster, "alice", "nope", "SELECT 1");
    assert!(!ok);
    assert!(err.contains("password authentication failed for user \"alice\""), "{err}");

    // Malformed SASL messages from a hand-written client.
    // A mechanism we did not offer.
    let (mut stream, mut buf) = raw_sasl_start(&cluster, "alice").await;
    let mut out = bytes::BytesMut::new();
    frontend::sasl_initial_response(&mut out, "SCRAM-SHA-256-PLUS", b"p=tls-server-end-point,,n=,r=abc");
    expect_refusal(&mut stream, &mut buf, &out).await;
    // A client-first-message that is not one.
    let (mut stream, mut buf) = raw_sasl_start(&cluster, "alice").await;
    let mut out = bytes::BytesMut::new();
    frontend::sasl_initial_response(&mut out, "SCRAM-SHA-256", b"hello");
    expect_refusal(&mut stream, &mut buf, &out).await;
    // A good first message, then garbage instead of the proof.
    let (mut stream, mut buf) = raw_sasl_start(&cluster, "alice").await;
    let mut out = bytes::BytesMut::new();
    frontend::sasl_initial_response(&mut out, "SCRAM-SHA-256", b"n,,n=,r=clientnonce");
    stream.write_all(&out).await.unwrap();
    let msg = read_until(&mut stream, &mut buf, b'R').await.expect("AuthenticationSASLContinue");
    let (code, server_first) = backend::decode_authentication(&msg).unwrap();
    assert_eq!(code, 11);
    let server_first = std::str::from_utf8(server_first).unwrap();
    assert!(server_first.starts_with("r=clientnonce") && server_first.contains(",s=") && server_first.contains(",i="), "{server_first}");
    let mut out = bytes::BytesMut::new();
    frontend::password(&mut out, b"c=biws,r=clientnonce,p=AAAA");
    expect_refusal(&mut stream, &mut buf, &out).await;
    // Some other message where SASLInitialResponse belongs.
    let (mut stream, mut buf) = raw_sasl_start(&cluster, "alice").await;
    let mut out = bytes::BytesMut::new();
    frontend::query(&mut out, "SELECT 1");
    expect_refusal(&mut stream, &mut buf, &out).await;

    // Before authentication no message may be large: a claimed megabyte ends
    // the connection at once instead of being buffered.
    let (mut stream, mut buf) = raw_sasl_start(&cluster, "alice").await;
    let mut out = bytes::BytesMut::new();
    out.extend_from_slice(b"p");
    out.extend_from_slice(&1_000_000u32.to_be_bytes());
    out.extend_from_slice(&[b'x'; 1000]);
    stream.write_all(&out).await.unwrap();
    let closed = tokio::time::timeout(std::time::Duration::from_secs(10), read_until(&mut stream, &mut buf, b'Z')).await;
    assert!(matches!(closed, Ok(None)), "an oversized message before login closes the connection");
    // Start-up packets are capped at PostgreSQL's 10,000 bytes.
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", cluster.port)).await.unwrap();
    let mut packet = 20_000u32.to_be_bytes().to_vec();
    packet.extend_from_slice(&196_608u32.to_be_bytes());
    packet.extend_from_slice(&[b'u'; 100]);
    stream.write_all(&packet).await.unwrap();
    let mut buf = bytes::BytesMut::new();
    let closed = tokio::time::timeout(std::time::Duration::from_secs(10), read_until(&mut stream, &mut buf, b'R')).await;
    assert!(matches!(closed, Ok(None)), "an oversized start-up packet closes the connection");

    // Sessions opened before the failures are unaffected, and once logged in a
    // client may send large messages.
    assert_eq!(text_rows(&alice, "SELECT 1").await, vec![vec![Some("1".into())]]);
    let long = "x".repeat(200_000);
    assert_eq!(text_rows(&alice, &format!("SELECT length('{long}')")).await, vec![vec![Some("200000".into())]]);
}

#[tokio::test]
async fn worker_login_refusals_name_the_node() {
    let cluster = TestCluster::start(2);
    let admin = cluster.connect().await;
    admin
        .batch_execute(
            "CREATE TABLE ledger (id int PRIMARY KEY, amount int);
             SELECT create_distributed_table('ledger', 'id');
             INSERT INTO ledger SELECT g, g FROM generate_series(1, 10) g;",
        )
        .await
        .unwrap();
    let ports: Vec<String> =
        text_rows(&admin, "SELECT nodeport FROM pg_dist_node ORDER BY nodeid").await.into_iter().map(|r| r[0].clone().unwrap()).collect();
    // ghost exists on the coordinator database only; capped exists everywhere
    // but may not open a connection to the workers.
    let db = cluster.connect_coordinator_db().await;
    db.batch_execute("CREATE ROLE ghost LOGIN; CREATE ROLE capped LOGIN; GRANT SELECT ON ledger TO ghost, capped").await.unwrap();
    for i in 0..2 {
        cluster.connect_worker(i).await.batch_execute("CREATE ROLE capped LOGIN CONNECTION LIMIT 0").await.unwrap();
    }
    for (user, code, says) in [("ghost", "28000", "role \"ghost\" does not exist"), ("capped", "53300", "too many connections for role \"capped\"")] {
        let client = common::connect_as(cluster.port, user).await;
        let e = client.simple_query("SELECT count(*) FROM ledger").await.unwrap_err();
        let db_error = e.as_db_error().unwrap_or_else(|| panic!("{e}"));
        assert_eq!((db_error.code().code(), db_error.severity()), (code, "ERROR"), "{user}: {db_error:?}");
        let message = db_error.message();
        assert!(message.contains(says) && message.contains("refused the login"), "{user}: {message}");
        assert!(ports.iter().any(|p| message.contains(&format!("127.0.0.1:{p}"))), "{user}: the node is named: {message}");
        assert!(db_error.hint().is_some(), "{user}: a hint says what to do");
        // The session survives the refusal and goes on with local work.
        assert_eq!(text_rows(&client, "SELECT current_user").await, vec![vec![Some(user.to_string())]]);
    }
}
