//! A worker whose disk fills up under a write load: its data directory on a
//! small tmpfs. Clients get errors that name the node; once there is room
//! again (and the node is started, as `tessera up` does), writes go on, and
//! every row a client was told was written is there.

mod common;
use common::{text_rows, TestCluster};
use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};
use tessera::cluster::instance::Instance;

/// A tmpfs mounted over a worker's data directory, holding a copy of it;
/// the worker is stopped and the mount undone when dropped.
struct SmallDisk {
    worker: Instance,
    mount: PathBuf,
}

impl SmallDisk {
    /// Moves stopped `worker`'s data onto a tmpfs with `spare` bytes free.
    fn under(worker: &Instance, spare: u64) -> SmallDisk {
        let mount = worker.data_dir.clone();
        let original = mount.with_extension("on-disk");
        std::fs::rename(&mount, &original).unwrap();
        std::fs::create_dir(&mount).unwrap();
        let used = dir_size(&original);
        let size = used + spare;
        run("mount", &["-t", "tmpfs", "-o", &format!("size={size},mode=0700"), "tmpfs", &mount.to_string_lossy()]);
        run("cp", &["-a", &format!("{}/.", original.display()), &mount.to_string_lossy()]);
        run("chown", &["postgres:postgres", &mount.to_string_lossy()]);
        SmallDisk { worker: worker.clone(), mount }
    }

    /// Room again: the tmpfs grows.
    fn grow(&self, size: u64) {
        run("mount", &["-o", &format!("remount,size={size}"), &self.mount.to_string_lossy()]);
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = self.worker.kill();
        let _ = Command::new("umount").arg(&self.mount).status();
    }
}

fn run(program: &str, args: &[&str]) {
    let out = Command::new(program).args(args).output().unwrap();
    assert!(out.status.success(), "{program} {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

fn dir_size(dir: &Path) -> u64 {
    let out = Command::new("du").args(["-sb"]).arg(dir).output().unwrap();
    String::from_utf8_lossy(&out.stdout).split_whitespace().next().unwrap().parse().unwrap()
}

#[tokio::test]
async fn a_full_disk_fails_writes_naming_the_node_and_loses_nothing() {
    let cluster = TestCluster::start(2);
    let c = cluster.connect().await;
    c.batch_execute(
        "CREATE TABLE df_rows (id int PRIMARY KEY, payload text NOT NULL);
         SELECT create_distributed_table('df_rows', 'id', shard_count => 4);",
    )
    .await
    .unwrap();
    let worker = cluster.workers()[1].clone();
    let port = worker.port;
    worker.stop().unwrap();
    let disk = SmallDisk::under(&worker, 24 << 20);
    worker.start().unwrap();

    // Rows of 4 kB (stored as they are, not compressed) until the disk is full.
    let mut acknowledged = Vec::new();
    let mut errors = Vec::new();
    let mut id: i32 = 0;
    let started = Instant::now();
    while errors.len() < 20 && started.elapsed() < Duration::from_secs(120) {
        let batch: Vec<i32> = (id + 1..=id + 50).collect();
        id += 50;
        let values: Vec<String> =
            batch.iter().map(|i| format!("({i}, (SELECT string_agg(md5(random()::text), '') FROM generate_series(1, 128)))")).collect();
        match c.batch_execute(&format!("INSERT INTO df_rows VALUES {}", values.join(", "))).await {
            Ok(()) => acknowledged.extend(batch),
            Err(e) => errors.push(common::error_text(&e)),
        }
    }
    assert!(!errors.is_empty(), "the disk never filled ({} rows written)", acknowledged.len());
    let named = format!("127.0.0.1:{port}");
    assert!(errors.iter().all(|e| e.contains(&named)), "every error names the node {named}: {errors:#?}");
    // PostgreSQL stops a server that cannot write its WAL (a PANIC): the
    // clients hear the node named, its log says why.
    let log = std::fs::read_to_string(worker.data_dir.join("server.log")).unwrap_or_default();
    assert!(
        errors.iter().any(|e| e.contains("No space left on device")) || log.contains("No space left on device"),
        "the node's log says its disk is full: {errors:#?}"
    );
    // A row on the other worker is read meanwhile.
    let ports = common::placement_ports(&c, "df_rows").await;
    let elsewhere = acknowledged.iter().find(|i| ports[common::shard_of_int4(**i, 4)] != i32::from(port)).expect("a row on the other worker");
    let found = text_rows(&c, &format!("SELECT count(*) FROM df_rows WHERE id = {elsewhere}")).await;
    assert_eq!(found, vec![vec![Some("1".into())]]);

    // Room again; the node started again if the full disk stopped it.
    disk.grow(512 << 20);
    worker.start().unwrap();
    let again = Instant::now();
    loop {
        let values: Vec<String> = (id + 1..=id + 10).map(|i| format!("({i}, 'after')")).collect();
        match c.batch_execute(&format!("INSERT INTO df_rows VALUES {}", values.join(", "))).await {
            Ok(()) => {
                acknowledged.extend(id + 1..=id + 10);
                break;
            }
            Err(e) => assert!(again.elapsed() < Duration::from_secs(60), "writes did not resume: {}", common::error_text(&e)),
        }
        id += 10;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let stored: HashSet<i32> = text_rows(&c, "SELECT id FROM df_rows").await.into_iter().map(|r| r[0].as_deref().unwrap().parse().unwrap()).collect();
    let lost: Vec<&i32> = acknowledged.iter().filter(|i| !stored.contains(i)).collect();
    assert!(lost.is_empty(), "{} acknowledged rows are missing", lost.len());
    let prepared = text_rows(&common::connect(port).await, "SELECT count(*) FROM pg_prepared_xacts").await;
    assert_eq!(prepared, vec![vec![Some("0".into())]]);
}
