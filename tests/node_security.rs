//! The nodes' own security (`[node_tls]`): `tessera up` gives the cluster a
//! CA; nodes take TCP connections only over TLS with a client certificate
//! of that CA naming the role, and so does the coordinator's link relay.
//! The coordinator, the nodes' links (postgres_fdw, rows pulled by psql,
//! shard moves' subscriptions) and the fallback log in with their role's
//! certificate. The rest of the suite runs on such clusters too; here, what
//! is refused, and the coordinator's own connections over TLS.

mod common;
use common::{text_rows, TestCluster};
use std::path::Path;
use std::process::Command;
use tessera::certificates::ClusterCa;

/// psql with `conninfo` running `sql`: success, stdout, stderr.
fn psql(conninfo: &str, sql: &str) -> (bool, String, String) {
    let out = Command::new("psql").arg(conninfo).args(["-X", "-A", "-t", "-w", "-c", sql]).output().expect("psql");
    (out.status.success(), String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
}

/// Writes a certificate for `role` that `ca` signed into `dir`; returns the
/// libpq options presenting it.
fn client_certificate(ca: &ClusterCa, role: &str, dir: &Path, name: &str) -> String {
    use std::os::unix::fs::PermissionsExt;
    let issued = ca.role_certificate(role).unwrap();
    let (cert, key) = (dir.join(format!("{name}.crt")), dir.join(format!("{name}.key")));
    std::fs::write(&cert, issued.certificate_pem).unwrap();
    std::fs::write(&key, issued.key_pem).unwrap();
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
    format!("sslcert={} sslkey={}", cert.display(), key.display())
}

#[tokio::test]
async fn nodes_and_the_link_relay_refuse_connections_without_a_certificate_of_the_cluster() {
    let cluster = TestCluster::start(2);
    let c = cluster.connect().await;
    c.batch_execute("CREATE ROLE ns_reader LOGIN").await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let ca_file = cluster.data_dir().join("ca.crt");
    let ours = cluster.cluster.ca().unwrap().expect("tessera up made a CA");
    let theirs = ClusterCa::create().unwrap();
    let our_postgres = client_certificate(&ours, "postgres", dir.path(), "ours");
    let our_reader = client_certificate(&ours, "ns_reader", dir.path(), "reader");
    let their_postgres = client_certificate(&theirs, "postgres", dir.path(), "theirs");

    for port in [cluster.cluster.state.worker_ports[0], cluster.cluster.state.coordinator_db_port] {
        let node = |options: &str| format!("host=127.0.0.1 port={port} user=postgres dbname=postgres {options}");
        let (ok, _, err) = psql(&node("sslmode=disable"), "SELECT 1");
        assert!(!ok && err.contains("no pg_hba.conf entry"), "in the clear: {err}");
        let (ok, _, err) = psql(&node("sslmode=require"), "SELECT 1");
        assert!(!ok && err.contains("certificate"), "TLS without a certificate: {err}");
        let (ok, _, err) = psql(&node(&format!("sslmode=require {their_postgres}")), "SELECT 1");
        assert!(!ok, "a certificate of another CA: {err}");
        // A certificate of the cluster's CA logs in only as the role it names.
        let (ok, _, err) = psql(&node(&format!("sslmode=verify-full sslrootcert={} {our_reader}", ca_file.display())), "SELECT 1");
        assert!(!ok && err.contains("certificate authentication failed"), "another role's certificate: {err}");
        let (ok, out, err) = psql(&node(&format!("sslmode=verify-full sslrootcert={} {our_postgres}", ca_file.display())), "SELECT 6 * 7");
        assert!(ok && out.trim() == "42", "the role's own certificate of the cluster's CA: {err}");
    }

    // The relay of the workers' links, found where a worker's foreign server points.
    let worker = cluster.connect_worker(0).await;
    let options =
        text_rows(&worker, "SELECT array_to_string(srvoptions, ' ') FROM pg_foreign_server WHERE srvname LIKE 'tessera_node_%' LIMIT 1").await;
    let options = options[0][0].clone().unwrap();
    let relay_port = options.split(' ').find_map(|o| o.strip_prefix("port=")).unwrap().to_string();
    assert!(options.contains("sslmode=verify-full"), "{options}");
    let link =
        |options: &str| format!("host=127.0.0.1 port={relay_port} user=postgres dbname=postgres application_name=tessera_link_1_2_7 {options}");
    let (ok, _, err) = psql(&link("sslmode=disable"), "SELECT 1");
    assert!(!ok && err.contains("log in over TLS with a certificate"), "relay in the clear: {err}");
    let (ok, _, err) = psql(&link(&format!("sslmode=require {our_reader}")), "SELECT 1");
    assert!(!ok && err.contains("log in over TLS with a certificate"), "relay with another role's certificate: {err}");
    let (ok, _, err) = psql(&link(&format!("sslmode=require {their_postgres}")), "SELECT 1");
    assert!(!ok, "relay with a certificate of another CA: {err}");

    // No private key in any log, nor in what `tessera status` prints.
    let status = Command::new(common::tessera_bin()).args(["status", "--data-dir"]).arg(cluster.data_dir()).output().unwrap();
    let mut logs = vec![cluster.coordinator_log(), String::from_utf8_lossy(&status.stdout).into_owned()];
    for node in std::iter::once(cluster.cluster.coordinator_db()).chain(cluster.workers()) {
        logs.push(std::fs::read_to_string(node.data_dir.join("server.log")).unwrap_or_default());
    }
    assert!(logs.iter().all(|log| !log.contains("PRIVATE KEY")), "a key was logged");

    // A node down: the others do not reach it, and it reaches nothing.
    let health = "SELECT from_nodeport, to_nodeport, result FROM citus_check_cluster_node_health()";
    assert!(text_rows(&c, health).await.iter().all(|row| row[2].as_deref() == Some("t")));
    cluster.kill_worker(1);
    let down = cluster.cluster.state.worker_ports[1].to_string();
    for row in text_rows(&c, health).await {
        let expected = if row[0].as_deref() == Some(down.as_str()) {
            None
        } else if row[1].as_deref() == Some(down.as_str()) {
            Some("f".to_string())
        } else {
            Some("t".to_string())
        };
        assert_eq!(row[2], expected, "{row:?}");
    }
}

const FALLBACK: &str =
    "WITH RECURSIVE r(n) AS (SELECT min(id) FROM ns_a UNION ALL SELECT ns_a.id FROM r JOIN ns_a ON ns_a.id = r.n + 1 WHERE r.n < 5) SELECT count(*) FROM r";

#[tokio::test]
async fn the_coordinator_reaches_nodes_over_tls_with_each_roles_certificate() {
    let cluster = TestCluster::start(2);
    // No socket directories: every node connection goes over TCP, as in a
    // cluster of several hosts.
    cluster.restart_coordinator(|config| config.node_socket_directories.clear());
    let c = cluster.connect().await;
    c.batch_execute(
        "CREATE TABLE ns_a (id int PRIMARY KEY, v int); SELECT create_distributed_table('ns_a', 'id');
         CREATE TABLE ns_b (id int PRIMARY KEY, v int); SELECT create_distributed_table('ns_b', 'id');
         INSERT INTO ns_a SELECT g, g % 100 FROM generate_series(1, 20000) g;
         INSERT INTO ns_b SELECT g, g % 100 FROM generate_series(1, 20000) g;
         CREATE ROLE ns_app LOGIN; GRANT SELECT, INSERT, UPDATE ON ns_a, ns_b TO ns_app;
         CREATE FUNCTION ns_total(k int) RETURNS bigint LANGUAGE sql AS $$ SELECT count(*) FROM ns_b $$;
         SELECT create_distributed_function('ns_total(int)', 'k', colocate_with := 'ns_a');",
    )
    .await
    .unwrap();
    let app = common::connect_as(cluster.port, "ns_app").await;
    app.batch_execute("BEGIN; UPDATE ns_a SET v = v + 1 WHERE id IN (1, 2, 3, 4, 5); UPDATE ns_b SET v = v - 1; COMMIT").await.unwrap();
    let answers = [
        ("SELECT sum(v) FROM ns_a WHERE id = 7", "7"),
        ("SELECT sum(v) - (SELECT sum(v) FROM ns_b) FROM ns_a", "20005"),
        // A repartition join: each node pulls the other's rows itself.
        ("SET citus.enable_repartition_joins = on; SELECT count(*) FROM ns_a JOIN ns_b ON ns_a.v = ns_b.v", "3960000"),
        // A call delegated to a worker, which reads the other's shards through the relay.
        ("SELECT ns_total(1)", "20000"),
        // The general fallback: the coordinator database's foreign tables.
        (FALLBACK, "5"),
    ];
    let plan = text_rows(&app, &format!("EXPLAIN {FALLBACK}")).await;
    assert!(plan.iter().any(|row| row[0].as_deref().is_some_and(|line| line.contains("General Fallback"))), "{plan:?}");
    for (sql, expected) in answers {
        let rows = app.simple_query(sql).await.unwrap_or_else(|e| panic!("{sql}: {}", common::error_text(&e)));
        let value = rows.iter().find_map(|m| match m {
            tokio_postgres::SimpleQueryMessage::Row(r) => r.get(0).map(str::to_string),
            _ => None,
        });
        assert_eq!(value.as_deref(), Some(expected), "{sql}");
    }
    // Each worker reaches each worker (itself too) over TLS with the role's certificate.
    let health = text_rows(&app, "SELECT count(*), bool_and(result) FROM citus_check_cluster_node_health()").await;
    assert_eq!(health, vec![vec![Some("4".into()), Some("t".into())]]);
    // The nodes saw the coordinator's connections over TLS, each logged in
    // by the certificate of its role.
    let worker = cluster.connect_worker(0).await;
    let logins = text_rows(
        &worker,
        "SELECT DISTINCT a.usename::text, s.client_dn FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid)
          WHERE a.client_addr IS NOT NULL AND a.application_name LIKE 'tessera%' ORDER BY 1",
    )
    .await;
    assert!(logins.contains(&vec![Some("ns_app".into()), Some("/CN=ns_app".into())]), "{logins:?}");
    assert!(logins.contains(&vec![Some("postgres".into()), Some("/CN=postgres".into())]), "{logins:?}");
    // AES-128 (bench/node_links.sh: AES-256 cost TPC-B another 5 %).
    let ciphers = text_rows(
        &worker,
        "SELECT DISTINCT version, cipher FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid) WHERE s.ssl AND a.application_name LIKE 'tessera%'",
    )
    .await;
    assert_eq!(ciphers, vec![vec![Some("TLSv1.3".into()), Some("TLS_AES_128_GCM_SHA256".into())]]);
    let clear =
        text_rows(&worker, "SELECT count(*) FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid) WHERE a.client_addr IS NOT NULL AND NOT s.ssl")
            .await;
    assert_eq!(clear, vec![vec![Some("0".into())]], "every TCP connection to the worker is encrypted");
}
