//! How clients and nodes reach each other: TLS to clients (the embedded
//! cluster's certificate, signed by its CA; `mode = "require"`, SCRAM over TLS),
//! the coordinator's Unix sockets, and nodes reached over theirs.

mod common;
use bytes::BytesMut;
use common::{sqlstate, text_rows, TestCluster};
use std::process::Command;
use tessera::protocol::{backend, frontend};
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
    let (ok, out, err) = psql(
        &format!("host={} port={} user=tl_app dbname=postgres", socket_dir(), cluster.port),
        Some("secret"),
        &["-c", "SELECT count(*) FROM tl_t"],
    );
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

/// A client over TLS that lets a result back up before reading it gets all
/// of it. TLS buffers what it encrypts: a write the socket cannot take at
/// once leaves its tail in TLS's buffer, which must be pushed out before the
/// session waits for the client's next message, or the client waits for
/// that tail for ever (the client matrix's streaming checks hung so, now
/// and then, under load). Whether a result's end meets a full socket
/// depends on the socket's buffers, so results of many sizes are tried.
#[tokio::test]
async fn a_tls_client_gets_the_whole_result_however_full_its_socket() {
    let cluster = TestCluster::start(0);
    let mut roots = rustls::RootCertStore::empty();
    let pem = std::fs::read(cluster.data_dir().join("ca.crt")).unwrap();
    for cert in pem_certificates(&pem) {
        roots.add(cert).unwrap();
    }
    let config = std::sync::Arc::new(
        rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth(),
    );
    let mut stuck = Vec::new();
    for step in 1..=128 {
        let size = step * 48 * 1024;
        let mut tls = tls_login(cluster.port, config.clone()).await;
        send_query(&mut tls, &format!("SELECT repeat('x', {size})")).await;
        // Nothing is read for a moment: the coordinator's writes fill the socket.
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        match read_until_ready(&mut tls, std::time::Duration::from_secs(2)).await {
            Ok((1, tag)) if tag == "SELECT 1" => {}
            Ok(other) => panic!("{size} bytes: {other:?}"),
            Err(received) => stuck.push(format!("{size} bytes: {received} came")),
        }
    }
    assert!(stuck.is_empty(), "results whose end never came: {stuck:?}");
}

/// Logs in as postgres over TLS, message by message with Tessera's codec.
async fn tls_login(port: u16, config: std::sync::Arc<rustls::ClientConfig>) -> tokio_rustls::client::TlsStream<tokio::net::TcpStream> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut tcp = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    let mut out = BytesMut::new();
    frontend::ssl_request(&mut out);
    tcp.write_all(&out).await.unwrap();
    let mut answer = [0u8; 1];
    tcp.read_exact(&mut answer).await.unwrap();
    assert_eq!(answer[0], b'S');
    let connector = tokio_rustls::TlsConnector::from(config);
    let mut tls = connector.connect(rustls::pki_types::ServerName::try_from("localhost").unwrap(), tcp).await.unwrap();
    out.clear();
    frontend::startup(&mut out, &[("user", "postgres"), ("database", "postgres")]);
    tls.write_all(&out).await.unwrap();
    read_until_ready(&mut tls, std::time::Duration::from_secs(10)).await.expect("logged in");
    tls
}

async fn send_query(stream: &mut (impl tokio::io::AsyncWrite + Unpin), sql: &str) {
    use tokio::io::AsyncWriteExt;
    let mut out = BytesMut::new();
    frontend::query(&mut out, sql);
    stream.write_all(&out).await.unwrap();
}

/// The certificates in a PEM file.
fn pem_certificates(pem: &[u8]) -> Vec<rustls::pki_types::CertificateDer<'static>> {
    use rustls::pki_types::pem::PemObject;
    rustls::pki_types::CertificateDer::pem_slice_iter(pem).collect::<Result<_, _>>().unwrap()
}

/// Reads backend messages up to ReadyForQuery; returns the DataRows seen
/// and the last CommandComplete's tag, or the bytes received if nothing more
/// came for `patience`.
async fn read_until_ready(stream: &mut (impl tokio::io::AsyncRead + Unpin), patience: std::time::Duration) -> Result<(usize, String), usize> {
    use tokio::io::AsyncReadExt;
    let (mut buf, mut data_rows, mut tag, mut received) = (BytesMut::new(), 0, String::new(), 0usize);
    loop {
        while let Some(message) = tessera::protocol::take_message(&mut buf).unwrap() {
            match message.tag() {
                b'D' => data_rows += 1,
                b'C' => tag = backend::decode_command_complete(&message).unwrap().to_string(),
                b'E' => panic!("error: {}", backend::decode_error_fields(&message).unwrap()),
                b'Z' => return Ok((data_rows, tag)),
                _ => {}
            }
        }
        let Ok(read) = tokio::time::timeout(patience, stream.read_buf(&mut buf)).await else { return Err(received) };
        let n = read.unwrap();
        assert!(n > 0, "the coordinator closed the connection");
        received += n;
    }
}
