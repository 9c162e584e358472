//! Test harness: real PostgreSQL servers and real Tessera clusters in temporary
//! directories on free ports, torn down when the handle drops.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;
use tessera::cluster::instance::{free_port, Instance};
use tessera::cluster::{self, LocalCluster};
use tokio_postgres::{Client, NoTls};

pub fn tessera_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_tessera"))
}

fn temp_dir(prefix: &str) -> tempfile::TempDir {
    let dir = tempfile::Builder::new().prefix(prefix).tempdir_in("/tmp").expect("temp dir");
    // The postgres OS user (when we run as root) must be able to enter it.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    dir
}

/// A Tessera cluster: coordinator database, workers and coordinator process.
pub struct TestCluster {
    pub cluster: LocalCluster,
    pub port: u16,
    _dir: tempfile::TempDir,
}

impl TestCluster {
    pub fn start(workers: usize) -> TestCluster {
        // A free port can be taken by a concurrently starting server before we
        // bind it; try again with fresh ports rather than fail the test.
        let mut last_error = None;
        for _ in 0..3 {
            let dir = temp_dir("tessera-test-");
            let data = dir.path().join("cluster");
            let port = free_port().unwrap();
            match cluster::up(&data, port, workers, &tessera_bin()) {
                Ok(cluster) => return TestCluster { cluster, port, _dir: dir },
                Err(e) => {
                    eprintln!("tessera up failed, retrying: {e:#}");
                    let _ = cluster::down(&data);
                    last_error = Some(e);
                }
            }
        }
        panic!("tessera up: {:#}", last_error.unwrap());
    }

    pub fn data_dir(&self) -> &Path {
        &self.cluster.dir
    }

    pub async fn connect(&self) -> Client {
        connect(self.port).await
    }

    pub fn conn_string(&self) -> String {
        format!("host=127.0.0.1 port={} user=postgres dbname=postgres", self.port)
    }

    pub fn workers(&self) -> Vec<Instance> {
        self.cluster.workers()
    }

    /// A direct connection to worker `i` (0-based), bypassing the coordinator.
    pub async fn connect_worker(&self, i: usize) -> Client {
        connect(self.cluster.state.worker_ports[i]).await
    }

    /// A direct connection to the coordinator database.
    pub async fn connect_coordinator_db(&self) -> Client {
        connect(self.cluster.state.coordinator_db_port).await
    }

    /// Stops the coordinator process, changes its configuration and starts it
    /// again, waiting until it accepts connections.
    pub fn restart_coordinator(&self, edit: impl FnOnce(&mut tessera::config::Config)) {
        use std::time::{Duration, Instant};
        if let Some(pid) = self.cluster.coordinator_pid() {
            // SAFETY: plain signal delivery to the coordinator process the harness started.
            unsafe { libc::kill(pid, libc::SIGTERM) };
        }
        let start = Instant::now();
        while self.cluster.coordinator_pid().is_some() {
            assert!(start.elapsed() < Duration::from_secs(20), "the coordinator did not stop");
            std::thread::sleep(Duration::from_millis(50));
        }
        let path = self.cluster.config_path();
        let mut config = tessera::config::Config::load(&path).unwrap();
        edit(&mut config);
        std::fs::write(&path, toml::to_string(&config).unwrap()).unwrap();
        cluster::start_coordinator(&self.cluster, &tessera_bin()).unwrap();
        let start = Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(start.elapsed() < Duration::from_secs(60), "the coordinator did not come back");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Waits until the coordinator process has exited (e.g. at a fault-injection point).
    pub fn wait_for_coordinator_exit(&self) {
        let start = std::time::Instant::now();
        while self.cluster.coordinator_pid().is_some() {
            assert!(start.elapsed() < std::time::Duration::from_secs(20), "the coordinator did not exit");
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    }

    /// Runs psql against the coordinator; returns (success, stdout, stderr).
    pub fn psql(&self, sql: &str) -> (bool, String, String) {
        let out = Command::new("psql")
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string(), "-U", "postgres", "-d", "postgres", "-X", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-c", sql])
            .output()
            .expect("psql");
        (out.status.success(), String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

impl Drop for TestCluster {
    fn drop(&mut self) {
        let _ = cluster::down(&self.cluster.dir);
    }
}

/// One plain PostgreSQL server: the differential tests' oracle.
pub struct PlainPostgres {
    pub instance: Instance,
    _dir: tempfile::TempDir,
}

impl PlainPostgres {
    pub fn start() -> PlainPostgres {
        let dir = temp_dir("tessera-plain-");
        let instance = Instance::new(dir.path().join("pg"), free_port().unwrap());
        instance.init().expect("initdb");
        instance.start().expect("start");
        PlainPostgres { instance, _dir: dir }
    }

    pub async fn connect(&self) -> Client {
        connect(self.instance.port).await
    }
}

impl Drop for PlainPostgres {
    fn drop(&mut self) {
        let _ = self.instance.stop();
    }
}

pub async fn connect(port: u16) -> Client {
    let (client, conn) = tokio_postgres::connect(&format!("host=127.0.0.1 port={port} user=postgres dbname=postgres"), NoTls).await.expect("connect");
    tokio::spawn(async move {
        let _ = conn.await;
    });
    client
}

/// The SQLSTATE of a failed statement.
pub fn sqlstate(e: &tokio_postgres::Error) -> String {
    e.as_db_error().map(|d| d.code().code().to_string()).unwrap_or_else(|| format!("not a server error: {e}"))
}

/// Rows of a simple-protocol query as text, for easy comparison.
pub async fn text_rows(client: &Client, sql: &str) -> Vec<Vec<Option<String>>> {
    let messages = client.simple_query(sql).await.unwrap_or_else(|e| panic!("{sql}: {e}"));
    messages
        .into_iter()
        .filter_map(|m| match m {
            tokio_postgres::SimpleQueryMessage::Row(r) => Some((0..r.len()).map(|i| r.get(i).map(str::to_string)).collect()),
            _ => None,
        })
        .collect()
}

/// A server error's message, detail, hint and context, for assertions on wording.
pub fn error_text(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(d) => format!("{} | {} | {} | {}", d.message(), d.detail().unwrap_or(""), d.hint().unwrap_or(""), d.where_().unwrap_or("")),
        None => e.to_string(),
    }
}
