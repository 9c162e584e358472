//! Unmodified pgbench through the coordinator: initialise, distribute the four
//! tables as the Citus docs do, run TPC-B in all three query modes and
//! select-only, then check that no money appeared or vanished.

mod common;
use common::{text_rows, TestCluster};
use std::process::Command;

fn pgbench(cluster: &TestCluster, args: &[&str]) -> String {
    let port = cluster.port.to_string();
    let out = Command::new("pgbench").args(["-h", "127.0.0.1", "-p", &port, "-U", "postgres"]).args(args).arg("postgres").output().expect("pgbench");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "pgbench {args:?} failed:\n{text}");
    text
}

fn number_after(text: &str, label: &str) -> u64 {
    let line = text.lines().find(|l| l.starts_with(label)).unwrap_or_else(|| panic!("no '{label}' in:\n{text}"));
    line[label.len()..].trim().split([' ', '/']).next().unwrap().parse().unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn tpcb_in_every_query_mode_keeps_the_books_balanced() {
    let cluster = TestCluster::start(2);
    pgbench(&cluster, &["-i", "-s", "2", "-q"]);
    let (ok, _, err) = cluster.psql(
        "SELECT create_distributed_table('pgbench_accounts', 'aid');
         SELECT create_distributed_table('pgbench_branches', 'bid');
         SELECT create_distributed_table('pgbench_tellers', 'tid');
         SELECT create_distributed_table('pgbench_history', 'aid');",
    );
    assert!(ok, "{err}");
    let mut committed = 0;
    for mode in ["simple", "extended", "prepared"] {
        let out = pgbench(&cluster, &["-n", "-T", "3", "-c", "4", "-j", "2", "-M", mode]);
        assert_eq!(number_after(&out, "number of failed transactions:"), 0, "{out}");
        let n = number_after(&out, "number of transactions actually processed:");
        assert!(n > 50, "too few transactions in {mode} mode:\n{out}");
        committed += n;
    }
    let out = pgbench(&cluster, &["-n", "-S", "-T", "2", "-c", "4", "-j", "2", "-M", "prepared"]);
    assert_eq!(number_after(&out, "number of failed transactions:"), 0, "{out}");

    let c = cluster.connect().await;
    let sums = text_rows(&c, "SELECT sum(abalance) FROM pgbench_accounts; SELECT sum(bbalance) FROM pgbench_branches; SELECT sum(tbalance) FROM pgbench_tellers; SELECT sum(delta) FROM pgbench_history").await;
    assert_eq!(sums.len(), 4);
    assert!(sums.iter().all(|s| *s == sums[0]), "balances disagree: {sums:?}");
    let history = text_rows(&c, "SELECT count(*) FROM pgbench_history").await;
    assert_eq!(history, vec![vec![Some(committed.to_string())]], "one history row per committed transaction");
    let accounts = text_rows(&c, "SELECT count(*) FROM pgbench_accounts").await;
    assert_eq!(accounts, vec![vec![Some("200000".to_string())]]);
}

/// Issue 17's acceptance run: pgbench TPC-B keeps going through the
/// coordinator while the cluster grows from two workers to three and
/// rebalances; no transaction fails, the books balance, and the accounts'
/// rows are exactly those from before (count and checksum).
#[tokio::test(flavor = "multi_thread")]
async fn tpcb_runs_without_failures_while_the_cluster_grows_and_rebalances() {
    let cluster = TestCluster::start(2);
    pgbench(&cluster, &["-i", "-s", "2", "-q"]);
    let (ok, _, err) = cluster.psql(
        "SET citus.shard_count = 4;
         SELECT create_distributed_table('pgbench_accounts', 'aid');
         SELECT create_distributed_table('pgbench_branches', 'bid');
         SELECT create_distributed_table('pgbench_tellers', 'tid');
         SELECT create_distributed_table('pgbench_history', 'aid');",
    );
    assert!(ok, "{err}");
    let c = cluster.connect().await;
    let rows_checksum = "SELECT count(*), sum(hashtext(aid::text || filler)::bigint) FROM pgbench_accounts";
    let before = text_rows(&c, rows_checksum).await;

    let port = cluster.port.to_string();
    let run = std::thread::spawn(move || {
        let out = Command::new("pgbench")
            .args(["-h", "127.0.0.1", "-p", &port, "-U", "postgres", "-n", "-T", "25", "-c", "4", "-j", "2", "-M", "prepared", "postgres"])
            .output()
            .expect("pgbench");
        format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
    });
    tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    let dir = cluster.data_dir().to_path_buf();
    let coordinator_port = cluster.port;
    let grown = tokio::task::spawn_blocking(move || common::grow(&dir, coordinator_port, 3)).await.unwrap();
    c.batch_execute("SELECT rebalance_table_shards()").await.unwrap();
    let out = run.join().unwrap();
    assert_eq!(number_after(&out, "number of failed transactions:"), 0, "{out}");
    let committed = number_after(&out, "number of transactions actually processed:");
    assert!(committed > 50, "too few transactions:\n{out}");

    let third = i32::from(grown.state.worker_ports[2]);
    assert!(common::placement_ports(&c, "pgbench_accounts").await.contains(&third), "the new worker holds shards");
    assert_eq!(text_rows(&c, rows_checksum).await, before, "the accounts' rows are the same rows");
    let sums = text_rows(&c, "SELECT sum(abalance) FROM pgbench_accounts; SELECT sum(bbalance) FROM pgbench_branches; SELECT sum(tbalance) FROM pgbench_tellers; SELECT sum(delta) FROM pgbench_history").await;
    assert!(sums.iter().all(|s| *s == sums[0]), "balances disagree: {sums:?}");
    assert_eq!(
        text_rows(&c, "SELECT count(*) FROM pgbench_history").await,
        vec![vec![Some(committed.to_string())]],
        "one history row per committed transaction"
    );
}
