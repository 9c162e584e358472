//! The client matrix (tests/clients/run.sh): nine client libraries and ORMs
//! and a pg_dump round trip, first against a plain PostgreSQL, where every
//! check must pass (or the check itself is wrong), then through Tessera,
//! where every check must pass too. Each dump is restored into the plain
//! server and compared table by table.

mod common;
use common::{PlainPostgres, TestCluster};
use std::path::Path;
use std::process::Command;

fn psql(port: u16, database: &str, sql: &str) {
    let status = Command::new("psql")
        .args(["-X", "-q", "-v", "ON_ERROR_STOP=1", "-h", "127.0.0.1", "-U", "postgres", "-d", database, "-c", sql])
        .arg("-p")
        .arg(port.to_string())
        .status()
        .expect("psql");
    assert!(status.success(), "psql -c {sql:?} failed");
}

/// Runs the matrix against `port`/`database`; panics with its output unless
/// every check passed.
fn run_matrix(port: u16, database: &str, tessera: bool, restore_port: u16) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = tempfile::Builder::new().prefix("tessera-matrix-").tempdir_in("/tmp").unwrap();
    let output = Command::new("bash")
        .arg(root.join("tests/clients/run.sh"))
        .env("PGHOST", "127.0.0.1")
        .env("PGPORT", port.to_string())
        .env("PGUSER", "postgres")
        .env("PGDATABASE", database)
        .env("TESSERA", if tessera { "1" } else { "0" })
        .env("RESTORE_PGPORT", restore_port.to_string())
        // The nine programs create their schemas at once, and distributed DDL
        // takes its turn cluster-wide: on a slow machine the last program's
        // schema check waits about a minute for the other eight (each about
        // 4 s alone), beyond run.sh's default 60 s per check.
        .env("CHECK_TIMEOUT", "180")
        .env("PROGRAM_TIMEOUT", "300")
        .env("MATRIX_OUT", out.path())
        .output()
        .expect("run tests/clients/run.sh");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let target = if tessera { "Tessera" } else { "plain PostgreSQL" };
    if !output.status.success() {
        let logs: String = std::fs::read_dir(out.path())
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| e.path().extension().is_some_and(|x| x == "err"))
            .map(|e| format!("--- {} ---\n{}\n", e.path().display(), std::fs::read_to_string(e.path()).unwrap_or_default()))
            .collect();
        // The failing checks come first: CI shows the head of a long failure.
        let failed: Vec<&str> = stdout.lines().filter(|l| l.contains("FAIL") || l.starts_with("missing")).collect();
        let summary: Vec<&str> = stdout.lines().skip_while(|l| !l.starts_with("client ")).collect();
        panic!(
            "the client matrix failed against {target} (exit {:?}):\n{}\n{}\n{}\n{logs}\n--- whole output ---\n{stdout}",
            output.status.code(),
            failed.join("\n"),
            summary.join("\n"),
            String::from_utf8_lossy(&output.stderr)
        );
    }
}

#[test]
fn every_client_works_on_plain_postgresql_and_through_tessera() {
    let plain = PlainPostgres::start();
    let port = plain.instance.port;
    psql(port, "postgres", "CREATE DATABASE matrix");
    run_matrix(port, "matrix", false, port);

    let cluster = TestCluster::start(2);
    run_matrix(cluster.port, "postgres", true, port);
}
