//! `tessera load`: files (plain, split between readers, gzip, zstd, globs,
//! stdin) go straight to the shards; row counts per shard follow the hash; a
//! bad row fails the whole load unless a reject file takes it; a loader
//! killed while committing leaves all of its rows or none.

mod common;
use common::{text_rows, TestCluster};
use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};

/// Starts `tessera load` against the cluster with its output captured and,
/// if `stdin`, its standard input open for the caller to write to.
fn spawn_load(cluster: &TestCluster, args: &[&str], stdin: bool) -> std::process::Child {
    let mut cmd = Command::new(common::tessera_bin());
    cmd.arg("load").args(args).args(["--port", &cluster.port.to_string()]).arg("--config").arg(cluster.cluster.config_path());
    cmd.stdin(if stdin { Stdio::piped() } else { Stdio::null() }).stdout(Stdio::piped()).stderr(Stdio::piped());
    cmd.spawn().expect("tessera load")
}

fn load(cluster: &TestCluster, args: &[&str], stdin: Option<&[u8]>) -> (bool, String, String) {
    let mut child = spawn_load(cluster, args, stdin.is_some());
    if let Some(data) = stdin {
        child.stdin.take().unwrap().write_all(data).unwrap();
    }
    let out = child.wait_with_output().unwrap();
    (out.status.success(), String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
}

/// `query` (given the shard table's name) run on each shard's worker, by
/// shard index.
async fn per_shard(cluster: &TestCluster, table: &str, query: impl Fn(&str) -> String) -> Vec<i64> {
    let c = cluster.connect().await;
    let shards = text_rows(&c, &format!("SELECT s.shardindex, s.shardid, n.nodeport FROM pg_dist_shard s JOIN pg_dist_placement p USING (shardid) JOIN pg_dist_node n ON n.groupid = p.groupid WHERE s.logicalrelid = '{table}'::regclass ORDER BY 1")).await;
    let mut values = Vec::new();
    for shard in shards {
        let port: u16 = shard[2].as_deref().unwrap().parse().unwrap();
        let worker = cluster.workers().into_iter().position(|w| w.port == port).unwrap();
        let w = cluster.connect_worker(worker).await;
        let shard_table = format!("{table}_{}", shard[1].as_deref().unwrap());
        values.push(w.query_one(&query(&shard_table), &[]).await.unwrap().get(0));
    }
    values
}

/// Rows in each shard, read on the workers, by shard index.
async fn rows_per_shard(cluster: &TestCluster, table: &str) -> Vec<i64> {
    per_shard(cluster, table, |shard| format!("SELECT count(*) FROM {shard}")).await
}

fn write(path: &Path, data: &[u8]) {
    std::fs::write(path, data).unwrap();
}

#[tokio::test]
async fn csv_and_text_files_land_in_the_shards_the_hash_picks() {
    let cluster = TestCluster::start(2);
    let c = cluster.connect().await;
    c.batch_execute("CREATE TABLE items (id int PRIMARY KEY, name text, note text, price numeric); SELECT create_distributed_table('items', 'id', shard_count => 8)").await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    // Quoting, NULLs, multibyte text.
    let mut csv = String::from("id,name,note,price\n");
    let rows = 200_000;
    for i in 1..=rows {
        let note = match i % 5 {
            0 => String::new(),
            1 => "\"with, comma\"".to_string(),
            2 => "\"multi\nline\"".to_string(),
            3 => format!("\"say \"\"hi\"\" {i}\""),
            _ => "été ✓".to_string(),
        };
        csv.push_str(&format!("{i},name {i},{note},{}.5\n", i % 1000));
    }
    let big = dir.path().join("items.csv");
    write(&big, csv.as_bytes());
    let (ok, out, err) = load(&cluster, &["--table", "items", "--header", "--jobs", "4", big.to_str().unwrap()], None);
    assert!(ok, "{out}{err}");
    assert!(out.contains(&format!("loaded {rows} rows")), "{out}");
    let c = cluster.connect().await;
    assert_eq!(
        text_rows(&c, "SELECT count(*), count(note), sum(price), count(*) FILTER (WHERE note LIKE '%\n%'), count(*) FILTER (WHERE note = 'say \"hi\" 3') FROM items").await,
        vec![vec![Some(rows.to_string()), Some((rows - rows / 5).to_string()), Some("100000000.0".into()), Some((rows / 5).to_string()), Some("1".into())]]
    );
    let mut expected = vec![0i64; 8];
    for i in 1..=rows {
        expected[common::shard_of_int4(i, 8)] += 1;
    }
    assert_eq!(rows_per_shard(&cluster, "items").await, expected, "every row is in the shard the hash picks");

    // Compressed on the wire: the workers decompress with `tessera receive`.
    let sent = |out: &str| -> f64 { out.split(" MB sent").next().unwrap().rsplit(' ').next().unwrap().parse().unwrap() };
    let plain_sent = sent(&out);
    c.batch_execute("TRUNCATE items").await.unwrap();
    let (ok, out, err) = load(&cluster, &["--table", "items", "--header", "--jobs", "4", "--compress", "zstd", big.to_str().unwrap()], None);
    assert!(ok, "{out}{err}");
    assert!(sent(&out) * 3.0 < plain_sent, "zstd cuts the bytes on the wire by 3x or more: {out} vs {plain_sent} MB");
    assert_eq!(rows_per_shard(&cluster, "items").await, expected);
    assert_eq!(text_rows(&c, "SELECT count(*), sum(price) FROM items").await, vec![vec![Some(rows.to_string()), Some("100000000.0".into())]]);

    // Text format from gzip and zstd files matched by a glob, and from stdin.
    c.batch_execute("CREATE TABLE events (k bigint, v text); SELECT create_distributed_table('events', 'k', shard_count => 4)").await.unwrap();
    let text = |from: i64, to: i64| (from..to).map(|k| format!("{k}\tv{k}\\twith tab\n")).collect::<String>();
    let mut gz = flate2::write::GzEncoder::new(std::fs::File::create(dir.path().join("part1.tsv.gz")).unwrap(), flate2::Compression::fast());
    gz.write_all(text(0, 1000).as_bytes()).unwrap();
    gz.finish().unwrap();
    write(&dir.path().join("part2.tsv.zst"), &zstd::encode_all(text(1000, 2500).as_bytes(), 3).unwrap());
    let pattern = dir.path().join("part*.tsv.*");
    let (ok, out, err) =
        load(&cluster, &["--table", "events", "--format", "text", pattern.to_str().unwrap(), "-"], Some(text(2500, 3000).as_bytes()));
    assert!(ok, "{out}{err}");
    assert_eq!(
        text_rows(&c, "SELECT count(*), sum(k), count(*) FILTER (WHERE v LIKE '%\twith tab') FROM events").await,
        vec![vec![Some("3000".into()), Some("4498500".into()), Some("3000".into())]]
    );
    assert_eq!(cluster.prepared_on_workers().await, 0);
}

/// A file large enough to be split between readers still reaches every shard
/// in the file's own order: rows stored on a worker, in physical order, keep
/// the ascending keys of the sorted input (interleaved runs from several
/// readers would not, and would leave the primary key half empty).
#[tokio::test]
async fn a_split_file_reaches_each_shard_in_file_order() {
    let cluster = TestCluster::start(2);
    let c = cluster.connect().await;
    c.batch_execute("CREATE TABLE seq (id int PRIMARY KEY, pad text); SELECT create_distributed_table('seq', 'id', shard_count => 4)").await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let rows = 400_000;
    let pad = "x".repeat(40);
    let csv: String = (1..=rows).map(|i| format!("{i},\"{pad} {i}\"\n")).collect();
    assert!(csv.len() > 16 << 20, "the file must be large enough to be split");
    let file = dir.path().join("seq.csv");
    write(&file, csv.as_bytes());
    let (ok, out, err) = load(&cluster, &["--table", "seq", "--jobs", "4", file.to_str().unwrap()], None);
    assert!(ok, "{out}{err}");
    assert_eq!(
        text_rows(&c, "SELECT count(*), count(DISTINCT id), max(id) FROM seq").await,
        vec![vec![Some(rows.to_string()), Some(rows.to_string()), Some(rows.to_string())]]
    );
    let out_of_order = per_shard(&cluster, "seq", |shard| {
        format!("SELECT count(*) FILTER (WHERE id < previous) FROM (SELECT id, lag(id) OVER (ORDER BY ctid) AS previous FROM {shard}) r")
    })
    .await;
    assert_eq!(out_of_order, vec![0; 4], "every shard holds its rows in file order");
}

#[tokio::test]
async fn a_bad_row_fails_the_load_unless_a_reject_file_takes_it() {
    let cluster = TestCluster::start(2);
    let c = cluster.connect().await;
    c.batch_execute("CREATE TABLE m (id int, qty int CHECK (qty >= 0), label text); SELECT create_distributed_table('m', 'id', shard_count => 8)")
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut csv = String::new();
    for i in 1..=50_000 {
        match i {
            20_000 => csv.push_str("20000,not a number,x\n"),
            30_000 => csv.push_str(",5,no key\n"),
            40_000 => csv.push_str("40000,-1,negative\n"),
            _ => csv.push_str(&format!("{i},{},l{i}\n", i % 7)),
        }
    }
    let file = dir.path().join("m.csv");
    write(&file, csv.as_bytes());

    // All or nothing: the first bad row fails it, naming its line; nothing stays.
    let (ok, out, err) = load(&cluster, &["--table", "m", "--jobs", "2", file.to_str().unwrap()], None);
    assert!(!ok, "{out}");
    assert!(err.contains("m.csv:"), "the error names the input and line: {err}");
    assert_eq!(text_rows(&c, "SELECT count(*) FROM m").await, vec![vec![Some("0".into())]]);
    assert_eq!(cluster.prepared_on_workers().await, 0);

    // With a reject file: exactly the bad rows go there, the rest loads.
    let rejects = dir.path().join("rejects.txt");
    let (ok, out, err) = load(
        &cluster,
        &["--table", "m", "--jobs", "2", "--batch-size", "500", "--reject-file", rejects.to_str().unwrap(), file.to_str().unwrap()],
        None,
    );
    assert!(ok, "{out}{err}");
    assert!(out.contains("loaded 49997 rows") && out.contains("3 rows rejected"), "{out}");
    let mut rejected: Vec<String> =
        std::fs::read_to_string(&rejects).unwrap().lines().map(|l| l.split('\t').next().unwrap().rsplit(':').next().unwrap().to_string()).collect();
    rejected.sort();
    assert_eq!(rejected, vec!["20000", "30000", "40000"], "{}", std::fs::read_to_string(&rejects).unwrap());
    assert_eq!(text_rows(&c, "SELECT count(*), min(qty) FROM m").await, vec![vec![Some("49997".into()), Some("0".into())]]);

    // A stopped worker fails the load cleanly, naming the node; nothing of it stays.
    c.batch_execute("TRUNCATE m").await.unwrap();
    let stopped = cluster.workers()[1].port;
    cluster.kill_worker(1);
    let good: String = (1..=1000).map(|i| format!("{i},1,x\n")).collect();
    write(&file, good.as_bytes());
    let (ok, _, err) = load(&cluster, &["--table", "m", file.to_str().unwrap()], None);
    assert!(!ok);
    assert!(err.contains(&stopped.to_string()), "the error names the node: {err}");
    cluster.start_worker(1);
    let c = cluster.connect().await;
    assert_eq!(text_rows(&c, "SELECT count(*) FROM m").await, vec![vec![Some("0".into())]]);
}

/// A worker stopped while rows are streaming to it fails the whole load: the
/// rows already sent to the other worker are rolled back with it.
#[tokio::test]
async fn a_worker_stopped_mid_load_leaves_nothing() {
    let cluster = TestCluster::start(2);
    let c = cluster.connect().await;
    c.batch_execute("CREATE TABLE m (id int, qty int); SELECT create_distributed_table('m', 'id', shard_count => 8)").await.unwrap();
    let mut child = spawn_load(&cluster, &["-", "--table", "m", "--batch-size", "100"], true);
    let mut stdin = child.stdin.take().unwrap();
    let rows = |from: i32, to: i32| (from..to).map(|i| format!("{i},{i}\n")).collect::<String>();
    stdin.write_all(rows(0, 20_000).as_bytes()).unwrap();
    stdin.flush().unwrap();
    // Both workers are taking rows by now (batches of 100 rows per shard).
    std::thread::sleep(std::time::Duration::from_millis(500));
    let stopped = cluster.workers()[1].port;
    cluster.kill_worker(1);
    // The loader may already have given up and closed its input.
    stdin.write_all(rows(20_000, 40_000).as_bytes()).ok();
    drop(stdin);
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "the load fails");
    assert!(err.contains(&stopped.to_string()), "the error names the node: {err}");
    cluster.start_worker(1);
    let c = cluster.connect().await;
    assert_eq!(text_rows(&c, "SELECT count(*) FROM m").await, vec![vec![Some("0".into())]]);
    assert_eq!(cluster.prepared_on_workers().await, 0);
}

/// Kills `tessera load` while its deciding placement commits (held there by
/// a lock on the workers' commit records) and the other placements wait
/// prepared. With `decider_commits` the deciding commit goes through once
/// the loader is gone, else its backend is ended first. Recovery then
/// commits or rolls back every prepared placement with it: all of the rows
/// or none.
async fn loader_killed_while_deciding(decider_commits: bool) {
    let cluster = TestCluster::start(2);
    let c = cluster.connect().await;
    c.batch_execute("CREATE TABLE d (id int, qty int); SELECT create_distributed_table('d', 'id', shard_count => 4)").await.unwrap();
    let mut holders = Vec::new();
    for i in 0..2 {
        let w = cluster.connect_worker(i).await;
        w.batch_execute("BEGIN; LOCK TABLE tessera_commit.commit_records IN EXCLUSIVE MODE").await.unwrap();
        holders.push(w);
    }
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("d.csv");
    write(&input, (0..1000).map(|i| format!("{i},{i}\n")).collect::<String>().as_bytes());
    let mut child = spawn_load(&cluster, &[input.to_str().unwrap(), "--table", "d"], false);
    // One transaction per worker: one prepares, the other decides and waits.
    let started = std::time::Instant::now();
    while cluster.prepared_on_workers().await < 1 {
        assert!(started.elapsed() < std::time::Duration::from_secs(30), "the load never prepared its placements");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    child.kill().unwrap();
    child.wait().unwrap();
    if !decider_commits {
        for w in &holders {
            w.batch_execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND pid <> pg_backend_pid()")
                .await
                .unwrap();
        }
    }
    for w in &holders {
        w.batch_execute("COMMIT").await.unwrap();
    }
    let started = std::time::Instant::now();
    while cluster.prepared_on_workers().await > 0 {
        assert!(started.elapsed() < std::time::Duration::from_secs(30), "recovery left the load's placements prepared");
        c.batch_execute("SELECT recover_prepared_transactions()").await.unwrap();
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let expected = if decider_commits { "1000" } else { "0" };
    assert_eq!(text_rows(&c, "SELECT count(*) FROM d").await, vec![vec![Some(expected.into())]]);
    assert_eq!(rows_per_shard(&cluster, "d").await.iter().filter(|n| **n > 0).count(), if decider_commits { 4 } else { 0 });
}

#[tokio::test]
async fn a_loader_killed_after_its_deciding_commit_loads_everything() {
    loader_killed_while_deciding(true).await;
}

#[tokio::test]
async fn a_loader_killed_before_its_deciding_commit_loads_nothing() {
    loader_killed_while_deciding(false).await;
}
