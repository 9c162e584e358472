//! How clients and nodes reach each other: TLS to clients (the embedded
//! cluster's self-signed certificate, `mode = "require"`, SCRAM over TLS),
//! the coordinator's Unix sockets, and nodes reached over theirs.

mod common;
use common::{sqlstate, text_rows, TestCluster};
use std::process::Command;
use tokio_postgres::NoTls;

/// psql's outcome for `sql` with `conninfo`: success, stdout, stderr.
fn psql(conninfo: &str, password: Option<&str>, args: &[&str]) -> (bool, String, String) {
    let mut cmd = Command::new("psql");
    cmd.arg(conninfo).args(["-X", "-A", "-t", "-w"]).args(args);
    if let Some(p) = password {
        cmd.env("PGPASSWORD", p);
    }
    let out = cmd.output().expect("psql");
    (out.status.success(), String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
}

#[tokio::test]
async fn tls_for_clients_that_ask_and_required_when_configured() {
    let cluster = TestCluster::start(2);
    let c = cluster.connect().await;
    c.batch_execute("CREATE TABLE tl_t (k int, v text); SELECT create_distributed_table('tl_t', 'k'); INSERT INTO tl_t SELECT g, 'v' || g FROM generate_series(1, 50) g")
        .await
        .unwrap();
    let tcp = |mode: &str| format!("host=127.0.0.1 port={} user=postgres dbname=postgres sslmode={mode}", cluster.port);

    // `tessera up` made a certificate: psql gets TLS when it asks.
    let (ok, out, err) = psql(&tcp("require"), None, &["-c", "\\conninfo", "-c", "SELECT count(*) FROM tl_t"]);
    assert!(ok, "{err}");
    assert!(out.contains("SSL connection (protocol: TLSv1."), "{out}");
    assert!(out.trim_end().ends_with("50"), "{out}");
    let (ok, out, err) = psql(&tcp("disable"), None, &["-c", "\\conninfo"]);
    assert!(ok && !out.contains("SSL connection"), "{out}{err}");

    // Required: clear-text TCP logins are turned away, TLS ones and local
    // Unix-socket ones get in; SCRAM works over TLS.
    c.batch_execute("CREATE ROLE tl_app LOGIN PASSWORD 'secret'; GRANT SELECT ON tl_t TO tl_app").await.unwrap();
    drop(c);
    cluster.restart_coordinator(|config| {
        config.tls.as_mut().expect("tessera up configures TLS").mode = tessera::config::TlsMode::Require;
        config.auth = tessera::config::AuthMethod::ScramSha256;
    });
    let e = tokio_postgres::connect(&format!("host=127.0.0.1 port={} user=tl_app password=secret dbname=postgres", cluster.port), NoTls)
        .await
        .err()
        .expect("clear text refused");
    assert_eq!(sqlstate(&e), "28000", "{e}");
    assert!(common::error_text(&e).contains("only with TLS"), "{}", common::error_text(&e));
    let app = |mode: &str| format!("{} user=tl_app", tcp(mode));
    let (ok, _, err) = psql(&app("disable"), Some("secret"), &["-c", "SELECT 1"]);
    assert!(!ok && err.contains("only with TLS"), "{err}");
    let (ok, out, err) = psql(&app("require"), Some("secret"), &["-c", "\\conninfo", "-c", "SELECT sum(k) FROM tl_t"]);
    assert!(ok, "{err}");
    assert!(out.contains("SSL connection") && out.trim_end().ends_with("1275"), "{out}");
    let (ok, _, err) = psql(&app("require"), Some("wrong"), &["-c", "SELECT 1"]);
    assert!(!ok && err.contains("password authentication failed"), "{err}");
    // A local client over the Unix socket needs no TLS.
    let (ok, out, err) = psql(&format!("host={} port={} user=tl_app dbname=postgres", socket_dir(), cluster.port), Some("secret"), &["-c", "SELECT count(*) FROM tl_t"]);
    assert!(ok && out.trim() == "50", "{out}{err}");
}

/// The directory of the coordinator's Unix socket that every machine has.
fn socket_dir() -> &'static str {
    "/tmp"
}

#[tokio::test]
async fn unix_sockets_to_the_coordinator_and_to_the_nodes() {
    let cluster = TestCluster::start(2);
    let local = tokio_postgres::connect(&format!("host={} port={} user=postgres dbname=postgres", socket_dir(), cluster.port), NoTls).await;
    let (client, conn) = local.expect("the coordinator listens on its Unix socket");
    tokio::spawn(async move {
        let _ = conn.await;
    });
    client
        .batch_execute("CREATE TABLE ux_t (k int, v int); SELECT create_distributed_table('ux_t', 'k'); BEGIN; INSERT INTO ux_t SELECT g, g FROM generate_series(1, 100) g")
        .await
        .unwrap();
    // While the block is open, its connections to the workers are Unix-socket
    // ones (no client address), named after the session.
    for i in 0..2 {
        let worker = cluster.connect_worker(i).await;
        let rows = text_rows(&worker, "SELECT count(*) FILTER (WHERE client_addr IS NULL), count(*) FROM pg_stat_activity WHERE application_name LIKE 'tessera%' AND state <> 'idle'").await;
        assert_eq!(rows[0][0], rows[0][1], "worker {i}: {rows:?}");
        assert_ne!(rows[0][1].as_deref(), Some("0"), "worker {i} has the block's connection");
    }
    client.batch_execute("COMMIT").await.unwrap();
    assert_eq!(text_rows(&client, "SELECT count(*), sum(v) FROM ux_t").await, vec![vec![Some("100".into()), Some("5050".into())]]);
    // Stopping the coordinator removes its socket files.
    let socket = std::path::Path::new(socket_dir()).join(format!(".s.PGSQL.{}", cluster.port));
    assert!(socket.exists());
    cluster.restart_coordinator(|_| {});
    assert!(socket.exists(), "made again at the restart");
    tessera::cluster::down(cluster.data_dir()).unwrap();
    assert!(!socket.exists(), "{} left behind", socket.display());
}
