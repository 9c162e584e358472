//! Seeing the cluster through the wire protocol: the statement, tenant and
//! counter statistics (`citus_stat_statements`, `citus_stat_tenants`,
//! `citus_stat_counters`) and their resets.

mod common;
use common::{sqlstate, text_rows, TestCluster};
use futures::SinkExt;

#[tokio::test]
async fn statements_tenants_and_counters_follow_the_workload() {
    let cluster = TestCluster::start(2);
    let c = cluster.connect().await;
    c.batch_execute(
        "CREATE TABLE items (id int PRIMARY KEY, v int);
         SELECT create_distributed_table('items', 'id', shard_count => 4);
         INSERT INTO items SELECT g, g FROM generate_series(1, 100) g;
         CREATE ROLE watcher LOGIN;
         GRANT SELECT ON items TO watcher;
         SELECT citus_stat_statements_reset(); SELECT citus_stat_tenants_reset(); SELECT citus_stat_counters_reset();",
    )
    .await
    .unwrap();

    // Routed reads with a bound (binary) key, the same with literals, one
    // multi-shard read, a COPY and a two-phase block.
    let lookup = c.prepare("SELECT v FROM items WHERE id = $1").await.unwrap();
    for _ in 0..50 {
        c.query_one(&lookup, &[&7i32]).await.unwrap();
    }
    for _ in 0..10 {
        c.query_one(&lookup, &[&3i32]).await.unwrap();
    }
    c.batch_execute("SELECT v FROM items WHERE id = 5; SELECT v FROM items WHERE id = 5").await.unwrap();
    assert_eq!(text_rows(&c, "SELECT count(*) FROM items").await, vec![vec![Some("100".into())]]);
    let rows: String = (101..=150).map(|i| format!("{i}\t{i}\n")).collect();
    let mut sink = Box::pin(c.copy_in("COPY items FROM STDIN").await.unwrap());
    sink.send(bytes::Bytes::from(rows)).await.unwrap();
    assert_eq!(sink.as_mut().finish().await.unwrap(), 50);
    c.batch_execute("BEGIN; UPDATE items SET v = v + 1 WHERE id = 1; UPDATE items SET v = v + 1 WHERE id = 2; UPDATE items SET v = v + 1; COMMIT")
        .await
        .unwrap();

    let statement = |query: &str, key: Option<&str>| {
        let key = key.map_or_else(|| "partition_key IS NULL".to_string(), |k| format!("partition_key = '{k}'"));
        format!("SELECT executor, calls, rows, total_time > 0, mean_time <= total_time FROM citus_stat_statements WHERE query = '{query}' AND {key}")
    };
    let row = |cells: &[&str]| vec![cells.iter().map(|c| Some(c.to_string())).collect::<Vec<_>>()];
    assert_eq!(text_rows(&c, &statement("SELECT v FROM items WHERE id = $1", Some("7"))).await, row(&["router", "50", "50", "t", "t"]));
    assert_eq!(text_rows(&c, &statement("SELECT v FROM items WHERE id = $1", Some("3"))).await, row(&["router", "10", "10", "t", "t"]));
    // Literals are replaced as pg_stat_statements does; the key still shows.
    assert_eq!(text_rows(&c, &statement("SELECT v FROM items WHERE id = $1", Some("5"))).await, row(&["router", "2", "2", "t", "t"]));
    assert_eq!(text_rows(&c, &statement("SELECT count(*) FROM items", None)).await, row(&["multi-shard", "1", "1", "t", "t"]));
    assert_eq!(text_rows(&c, &statement("COPY items FROM STDIN", None)).await, row(&["copy", "1", "50", "t", "t"]));
    assert_eq!(
        text_rows(&c, "SELECT count(*) FROM citus_stat_statements WHERE userid = 'postgres'::regrole AND dbid = (SELECT oid FROM pg_database WHERE datname = current_database())").await,
        text_rows(&c, "SELECT count(*) FROM citus_stat_statements").await
    );

    // The busiest tenant first, on the node that holds its shard.
    let tenants = text_rows(
        &c,
        "SELECT tenant_attribute, read_count_in_this_period, query_count_in_this_period, cpu_usage_in_this_period > 0,
                nodeid = (SELECT n.nodeid FROM pg_dist_placement p JOIN pg_dist_node n USING (groupid)
                           WHERE p.shardid = get_shard_id_for_distribution_column('items', tenant_attribute))
           FROM citus_stat_tenants ORDER BY query_count_in_this_period DESC LIMIT 2",
    )
    .await;
    assert_eq!(tenants, [row(&["7", "50", "50", "t", "t"]), row(&["3", "10", "10", "t", "t"])].concat());
    // The two routed updates of the block count as writes of theirs.
    assert_eq!(
        text_rows(&c, "SELECT query_count_in_this_period - read_count_in_this_period FROM citus_stat_tenants WHERE tenant_attribute = '1'").await,
        row(&["1"])
    );

    let counters = text_rows(
        &c,
        "SELECT query_execution_single_shard >= 64, query_execution_multi_shard >= 2, rows_copied, two_phase_commits >= 1,
                connection_establishment_succeeded > 0, connection_reused > 0, name = current_database(), stats_reset <= now()
           FROM citus_stat_counters",
    )
    .await;
    assert_eq!(counters, row(&["t", "t", "50", "t", "t", "t", "t", "t"]));

    // Another role sees that statements ran, not their text, and may not reset.
    let watcher = common::connect_as(cluster.cluster.state.coordinator_port, "watcher").await;
    watcher.query_one("SELECT v FROM items WHERE id = $1", &[&7i32]).await.unwrap();
    assert_eq!(
        text_rows(&watcher, "SELECT DISTINCT query FROM citus_stat_statements WHERE userid = 'postgres'::regrole").await,
        row(&["<insufficient privilege>"])
    );
    assert_eq!(
        text_rows(&watcher, "SELECT calls FROM citus_stat_statements WHERE userid = 'watcher'::regrole AND partition_key = '7'").await,
        row(&["1"])
    );
    let err = watcher.simple_query("SELECT citus_stat_statements_reset()").await.unwrap_err();
    assert_eq!(sqlstate(&err), "42501", "{err}");

    c.batch_execute("SELECT citus_stat_statements_reset(); SELECT citus_stat_tenants_reset(); SELECT citus_stat_counters_reset()").await.unwrap();
    // Only the resets themselves have run since.
    assert_eq!(text_rows(&c, "SELECT count(*) FROM citus_stat_statements WHERE executor <> 'cluster-function'").await, row(&["0"]));
    assert_eq!(text_rows(&c, "SELECT count(*) FROM citus_stat_tenants").await, row(&["0"]));
    assert_eq!(text_rows(&c, "SELECT rows_copied, two_phase_commits FROM citus_stat_counters").await, row(&["0", "0"]));
    // Read on the coordinator database directly, the views say where to read them.
    let direct = common::connect(cluster.cluster.state.coordinator_db_port).await;
    let err = direct.simple_query("SELECT * FROM citus_stat_statements").await.unwrap_err();
    assert_eq!(sqlstate(&err), "0A000", "{err}");
}

/// `/metrics` parsed by Prometheus's own Python parser moves with the
/// workload; the dashboard, opened in headless Chromium, shows the nodes, a
/// chart with points and the top statement.
#[tokio::test]
async fn metrics_and_the_dashboard_show_the_cluster_at_work() {
    let cluster = TestCluster::start(2);
    let config: tessera::config::Config = toml::from_str(&std::fs::read_to_string(cluster.cluster.config_path()).unwrap()).unwrap();
    let listen = config.metrics_listen.clone().expect("tessera up serves the dashboard");
    let c = cluster.connect().await;
    c.batch_execute(
        "CREATE TABLE orders (id int PRIMARY KEY, total int);
         SELECT create_distributed_table('orders', 'id', shard_count => 8);
         INSERT INTO orders SELECT g, g FROM generate_series(1, 1000) g;",
    )
    .await
    .unwrap();
    let lookup = c.prepare("SELECT total FROM orders WHERE id = $1").await.unwrap();
    for id in 1..=40 {
        c.query_one(&lookup, &[&id]).await.unwrap();
    }
    let before = scrape(&listen).await;
    assert_eq!(before.value("tessera_node_up", &[]).map(|v| v as i64), Some(3), "three nodes answer: {}", before.raw);
    let routed = before.value("tessera_statements_total", &[("tier", "router")]).unwrap();
    assert!(routed >= 40.0, "{}", before.raw);
    for id in 1..=25 {
        c.query_one(&lookup, &[&id]).await.unwrap();
    }
    c.simple_query("SELECT count(*) FROM orders").await.unwrap();
    let after = scrape(&listen).await;
    assert_eq!(after.value("tessera_statements_total", &[("tier", "router")]).unwrap() - routed, 25.0);
    assert!(after.value("tessera_statement_duration_seconds_count", &[("tier", "multi-shard")]).unwrap() >= 1.0);
    assert!(after.value("tessera_connection_establishments_total", &[("outcome", "succeeded")]).unwrap() > 0.0);

    // A steady workload across a few of the sampler's intervals, for the chart.
    let workload = {
        let c = cluster.connect().await;
        tokio::spawn(async move {
            let lookup = c.prepare("SELECT total FROM orders WHERE id = $1").await.unwrap();
            let until = std::time::Instant::now() + std::time::Duration::from_secs(7);
            let mut id = 0;
            while std::time::Instant::now() < until {
                id = id % 1000 + 1;
                c.query_one(&lookup, &[&id]).await.unwrap();
            }
        })
    };
    workload.await.unwrap();
    let shot = cluster.data_dir().join("dashboard.png");
    let dom = chromium(&format!("http://{listen}/"), &shot);
    let section = |id: &str| dom.split(&format!("id=\"{id}\"")).nth(1).and_then(|rest| rest.split("</table>").next()).unwrap_or_default().to_string();
    for port in [cluster.cluster.state.coordinator_db_port].iter().chain(&cluster.cluster.state.worker_ports) {
        assert!(section("nodes").contains(&format!("127.0.0.1:{port}")), "node {port} in {}", section("nodes"));
    }
    assert!(section("nodes").matches(">up<").count() == 3, "{}", section("nodes"));
    let points: usize =
        dom.split("id=\"rate-chart\"").nth(1).and_then(|rest| rest.split("data-points=\"").nth(1)?.split('"').next()?.parse().ok()).unwrap_or(0);
    assert!(points > 0, "the chart has points: {dom}");
    assert!(section("statements").contains("SELECT total FROM orders WHERE id = $1"), "{}", section("statements"));
    assert!(section("tables").contains("public.orders"), "{}", section("tables"));
    assert!(std::fs::metadata(&shot).map(|m| m.len() > 10_000).unwrap_or(false), "a screenshot was taken");
    if let Ok(dest) = std::env::var("DASHBOARD_SCREENSHOT") {
        std::fs::copy(&shot, dest).unwrap();
    }
}

/// A sample: its name, its labels and its value.
type Sample = (String, Vec<(String, String)>, f64);

struct Scrape {
    raw: String,
    samples: Vec<Sample>,
}

impl Scrape {
    /// The sum of the samples called `name` whose labels include `labels`.
    fn value(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let matching: Vec<f64> = self
            .samples
            .iter()
            .filter(|(n, l, _)| n == name && labels.iter().all(|(k, v)| l.iter().any(|(lk, lv)| lk == k && lv == v)))
            .map(|(_, _, v)| *v)
            .collect();
        (!matching.is_empty()).then(|| matching.iter().sum())
    }
}

/// GETs `path` from the monitoring listener: the status line and the body.
async fn http_get(listen: &str, path: &str) -> (String, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(listen).await.unwrap();
    stream.write_all(format!("GET {path} HTTP/1.1\r\nHost: {listen}\r\n\r\n").as_bytes()).await.unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).await.unwrap();
    let (head, body) = response.split_once("\r\n\r\n").unwrap();
    (head.lines().next().unwrap().to_string(), body.to_string())
}

/// `/metrics`, parsed by the `prometheus_client` Python package's
/// OpenMetrics parser (which rejects a malformed page).
async fn scrape(listen: &str) -> Scrape {
    let (status, raw) = http_get(listen, "/metrics").await;
    assert!(status.contains("200"), "{status}");
    let parser = "import json, sys\n\
                  from prometheus_client.openmetrics.parser import text_string_to_metric_families\n\
                  out = [[s.name, sorted(s.labels.items()), s.value] for f in text_string_to_metric_families(sys.stdin.read()) for s in f.samples]\n\
                  print(json.dumps(out))";
    let mut child = std::process::Command::new("/usr/bin/python3")
        .args(["-c", parser])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write as _;
    child.stdin.take().unwrap().write_all(raw.as_bytes()).unwrap();
    let output = child.wait_with_output().unwrap();
    assert!(output.status.success(), "the parser refused the page: {}\n{raw}", String::from_utf8_lossy(&output.stderr));
    let parsed: Vec<Sample> = serde_json::from_slice(&output.stdout).unwrap();
    Scrape { raw, samples: parsed }
}

/// The page's DOM once its scripts ran, from headless Chromium, with a
/// screenshot taken as it loads.
fn chromium(url: &str, screenshot: &std::path::Path) -> String {
    let run = |extra: &[&str]| {
        let profile = tempfile::tempdir().unwrap();
        let output = std::process::Command::new("chromium")
            .args(["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--virtual-time-budget=6000", "--window-size=1400,1200"])
            .arg(format!("--user-data-dir={}", profile.path().display()))
            .args(extra)
            .arg(url)
            .output()
            .expect("chromium (scripts/setup.sh installs it)");
        assert!(output.status.success(), "chromium: {}", String::from_utf8_lossy(&output.stderr));
        String::from_utf8_lossy(&output.stdout).into_owned()
    };
    run(&[&format!("--screenshot={}", screenshot.display())]);
    run(&["--dump-dom"])
}

/// Beyond loopback the listener needs a password, and serves only TLS: a
/// coordinator configured without the password does not start, one with
/// it answers 401 to requests without it and nothing to clear text.
#[tokio::test]
async fn beyond_loopback_the_listener_takes_tls_and_a_password() {
    let cluster = TestCluster::start(1);
    let port = tessera::cluster::instance::free_port().unwrap();
    let open = format!("0.0.0.0:{port}");

    let mut config = tessera::config::Config::load(&cluster.cluster.config_path()).unwrap();
    config.listen = format!("127.0.0.1:{}", tessera::cluster::instance::free_port().unwrap());
    config.unix_socket_directories.clear();
    config.metrics_listen = Some(open.clone());
    let path = cluster.data_dir().join("open.toml");
    std::fs::write(&path, toml::to_string(&config).unwrap()).unwrap();
    let refused = std::process::Command::new(common::tessera_bin()).arg("serve").arg("--config").arg(&path).output().unwrap();
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("metrics_password"), "{}", String::from_utf8_lossy(&refused.stderr));

    let (_second, _) = cluster
        .start_second_coordinator(|c| {
            c.metrics_listen = Some(open.clone());
            c.metrics_password = Some("s3cret".into());
        })
        .await;
    let ca = cluster.data_dir().join("ca.crt");
    let basic = |password: &str| {
        use base64::Engine as _;
        format!("Authorization: Basic {}\r\n", base64::engine::general_purpose::STANDARD.encode(format!("prometheus:{password}")))
    };
    assert!(tls_get(port, &ca, "").await.starts_with("HTTP/1.1 401"));
    assert!(tls_get(port, &ca, &basic("wrong")).await.starts_with("HTTP/1.1 401"));
    let answer = tls_get(port, &ca, &basic("s3cret")).await;
    assert!(answer.starts_with("HTTP/1.1 200") && answer.contains("tessera_clients"), "{answer}");
    // Clear text gets no HTTP answer.
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut clear = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    clear.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").await.unwrap();
    let mut reply = Vec::new();
    let _ = tokio::time::timeout(std::time::Duration::from_secs(5), clear.read_to_end(&mut reply)).await;
    assert!(!String::from_utf8_lossy(&reply).contains("HTTP/1.1 200"));
}

/// GET /metrics over TLS, verifying the server against the cluster's CA,
/// with `header` added: the whole answer.
async fn tls_get(port: u16, ca: &std::path::Path, header: &str) -> String {
    use rustls::pki_types::pem::PemObject as _;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls::pki_types::CertificateDer::pem_file_iter(ca).unwrap() {
        roots.add(cert.unwrap()).unwrap();
    }
    let config = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config));
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    let mut stream = connector.connect(rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap(), tcp).await.unwrap();
    stream.write_all(format!("GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n{header}\r\n").as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer).await;
    String::from_utf8_lossy(&answer).into_owned()
}
