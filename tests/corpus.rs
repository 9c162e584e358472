//! Corpus tests of the statement path, over statements nobody here wrote:
//! SQLsmith (a random query generator for PostgreSQL) generates 2,000
//! statements with a fixed seed against a schema like the differential
//! suite's, and every statement of the suite itself joins them.
//!
//! * Round trip: every statement parses, deparses the way statements for the
//!   workers are deparsed, and parses back into the same tree.
//! * Through the coordinator, against distributed, reference and local tables:
//!   no statement crashes the coordinator or hangs it, none fails with an
//!   internal error, and wherever a statement is deterministic it gives the
//!   same rows as plain PostgreSQL. Every statement runs inside `BEGIN …
//!   ROLLBACK` on both sides, so writes leave the data as it was.
//!
//! `SQLSMITH_QUERIES` and `SQLSMITH_SEED` change the corpus (for hunting
//! bugs locally); CI uses the defaults.

mod common;

use common::slt::{parse_file, suite_files};
use common::{connect, PlainPostgres, TestCluster};
use std::collections::{BTreeMap, HashSet};
use std::process::Command;
use std::time::{Duration, Instant};
use tessera::planner::deparse::{round_trip, RoundTrip};
use tokio_postgres::{Client, SimpleQueryMessage};

const DEFAULT_QUERIES: usize = 2000;
const DEFAULT_SEED: u64 = 20261124;
/// Both sides cancel a statement after this; SQLsmith writes some that would
/// run for hours.
const STATEMENT_TIMEOUT_MS: u64 = 2000;
/// A statement the coordinator has not answered by now hangs.
const HANG: Duration = Duration::from_secs(60);

/// Tables of the kinds the differential suite uses: hash-distributed on int
/// and text keys (two co-located), a reference table and a coordinator-local
/// table, with a few rows each, NULLs included.
const SCHEMA: &str = "
CREATE TABLE accounts (id int PRIMARY KEY, name text NOT NULL, balance numeric(12,2), opened date, tags text[]);
CREATE TABLE events (account_id int NOT NULL, seq bigint NOT NULL, kind text, amount int, at timestamp, PRIMARY KEY (account_id, seq));
CREATE TABLE tenants (tenant text PRIMARY KEY, plan text, seats int, score float8);
CREATE TABLE plans (plan text PRIMARY KEY, price int NOT NULL, active bool);
CREATE TABLE notes (id int, body text);
INSERT INTO accounts SELECT g, 'acct ' || g, CASE WHEN g % 7 = 0 THEN NULL ELSE g * 10.25 END, date '2024-01-01' + g, ARRAY['t' || g % 3, 'x'] FROM generate_series(1, 40) g;
INSERT INTO events SELECT g % 40 + 1, g, CASE g % 3 WHEN 0 THEN 'deposit' WHEN 1 THEN 'withdrawal' END, g % 17 - 5, timestamp '2024-03-01' + g * interval '1 hour' FROM generate_series(1, 200) g;
INSERT INTO tenants SELECT 'tenant-' || g, CASE WHEN g % 2 = 0 THEN 'pro' ELSE 'free' END, g % 9, g / 4.0 FROM generate_series(1, 30) g;
INSERT INTO plans VALUES ('free', 0, true), ('pro', 49, true), ('legacy', 19, NULL);
INSERT INTO notes SELECT g, repeat('n', g % 5) FROM generate_series(1, 10) g;
";

const DISTRIBUTE: &str = "
SELECT create_distributed_table('accounts', 'id', shard_count => 4);
SELECT create_distributed_table('events', 'account_id', colocate_with => 'accounts');
SELECT create_distributed_table('tenants', 'tenant', shard_count => 3);
SELECT create_reference_table('plans');
";

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// SQLsmith's statements for the schema on `port`, in the order it wrote them.
fn sqlsmith_statements(port: u16, seed: u64, queries: usize) -> Vec<String> {
    let out = Command::new("sqlsmith")
        .arg(format!("--target=host=127.0.0.1 port={port} dbname=postgres user=postgres"))
        .arg(format!("--seed={seed}"))
        .arg(format!("--max-queries={queries}"))
        .args(["--dry-run", "--exclude-catalog"])
        .output()
        .expect("sqlsmith is installed by scripts/setup.sh");
    assert!(out.status.success(), "sqlsmith failed: {}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).expect("SQLsmith writes UTF-8");
    let statements: Vec<String> = pg_query::split_with_scanner(&text)
        .expect("SQLsmith's output splits")
        .into_iter()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .collect();
    assert!(statements.len() >= queries / 2, "SQLsmith wrote only {} statements", statements.len());
    statements
}

/// Every statement of the differential suite.
fn suite_statements() -> Vec<(String, String)> {
    let mut statements = Vec::new();
    for path in suite_files() {
        let text = std::fs::read_to_string(&path).unwrap();
        let records = parse_file(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        for record in records {
            for sql in pg_query::split_with_scanner(&record.sql).unwrap_or_default() {
                statements.push((format!("{}:{}", path.file_name().unwrap().to_string_lossy(), record.line), sql.to_string()));
            }
        }
    }
    statements
}

#[test]
fn statements_survive_the_deparse_round_trip() {
    let plain = PlainPostgres::start();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async { connect(plain.instance.port).await.batch_execute(SCHEMA).await.unwrap() });
    let queries = env_or("SQLSMITH_QUERIES", DEFAULT_QUERIES);
    let seed = env_or("SQLSMITH_SEED", DEFAULT_SEED);
    let mut corpus: Vec<(String, String)> =
        sqlsmith_statements(plain.instance.port, seed, queries).into_iter().enumerate().map(|(i, s)| (format!("sqlsmith #{i}"), s)).collect();
    corpus.extend(suite_statements());
    let mut parsed = 0;
    let mut failures = Vec::new();
    for (origin, sql) in &corpus {
        match round_trip(sql) {
            RoundTrip::NotParsed => {}
            RoundTrip::Equal => parsed += 1,
            other => {
                parsed += 1;
                failures.push(format!("{origin}: {sql}\n  => {other:?}"));
            }
        }
    }
    println!("{} of {parsed} parsed statements round-trip ({} statements in the corpus)", parsed - failures.len(), corpus.len());
    assert!(parsed > queries / 2, "most of the corpus parses");
    assert!(failures.is_empty(), "{} statements do not round-trip:\n{}", failures.len(), failures.join("\n\n"));
}

/// What one side made of one statement.
enum Outcome {
    Rows(Vec<Vec<Option<String>>>),
    /// `on_worker`: the error came from a worker (PostgreSQL's own, relayed).
    Error {
        code: String,
        message: String,
        on_worker: bool,
    },
    Hung,
}

impl std::fmt::Display for Outcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Outcome::Rows(rows) if rows.len() > 10 => write!(f, "{} rows, the first 10: {:?}", rows.len(), &rows[..10]),
            Outcome::Rows(rows) => write!(f, "{} rows: {rows:?}", rows.len()),
            Outcome::Error { code, message, .. } => write!(f, "error {code}: {message}"),
            Outcome::Hung => write!(f, "no answer within {HANG:?}"),
        }
    }
}

async fn run(client: &Client, sql: &str) -> Outcome {
    let ran = tokio::time::timeout(HANG, async {
        client.batch_execute(&format!("BEGIN; SET LOCAL statement_timeout = {STATEMENT_TIMEOUT_MS}")).await?;
        let result = client.simple_query(sql).await;
        client.batch_execute("ROLLBACK").await?;
        result
    })
    .await;
    match ran {
        Err(_) => Outcome::Hung,
        Ok(Err(e)) => match e.as_db_error() {
            Some(db) => Outcome::Error {
                code: db.code().code().to_string(),
                message: db.message().to_string(),
                on_worker: db.where_().is_some_and(|w| w.contains("while executing command on")),
            },
            None => Outcome::Error { code: "connection".into(), message: e.to_string(), on_worker: false },
        },
        Ok(Ok(messages)) => {
            let mut rows: Vec<Vec<Option<String>>> = messages
                .iter()
                .filter_map(|m| match m {
                    SimpleQueryMessage::Row(r) => Some((0..r.len()).map(|i| r.get(i).map(str::to_string)).collect()),
                    _ => None,
                })
                .collect();
            rows.sort();
            Outcome::Rows(rows)
        }
    }
}

/// Whether a statement's rows are fixed by the data: no LIMIT or sampling,
/// no window function, and only immutable functions (aggregates included
/// only where the order of their input cannot change the result).
fn is_deterministic(sql: &str, unstable_functions: &HashSet<String>) -> bool {
    let Ok(parsed) = pg_query::parse(sql) else { return false };
    let tree = format!("{:?}", parsed.protobuf);
    if tree.contains("limit_count: Some")
        || tree.contains("limit_offset: Some")
        || tree.contains("RangeTableSample")
        || tree.contains("over: Some")
        || tree.contains("SqlvalueFunction")
    {
        return false;
    }
    // Every function call's last name, read off the printed tree (pg_query's
    // own list of functions misses calls in some places, RETURNING among them).
    let mut rest = tree.as_str();
    while let Some(at) = rest.find("FuncCall { funcname: [") {
        rest = &rest[at..];
        let names = &rest[..rest.find(']').unwrap_or(rest.len())];
        let last = names.rsplit("sval: \"").next().and_then(|n| n.split('"').next()).unwrap_or("");
        if unstable_functions.contains(last) {
            return false;
        }
        rest = &rest["FuncCall".len()..];
    }
    true
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlsmith_statements_through_the_coordinator() {
    let plain = PlainPostgres::start();
    let cluster = TestCluster::start(2);
    let pg = connect(plain.instance.port).await;
    pg.batch_execute(SCHEMA).await.unwrap();
    let ts = cluster.connect().await;
    ts.batch_execute(SCHEMA).await.unwrap();
    ts.batch_execute(DISTRIBUTE).await.unwrap();
    // Functions whose result can differ between two servers or two calls, and
    // aggregates and window functions that depend on the order of their input.
    let unstable: HashSet<String> = pg
        .query(
            "SELECT DISTINCT p.proname::text FROM pg_proc p LEFT JOIN pg_aggregate a ON a.aggfnoid = p.oid
             WHERE p.provolatile <> 'i' OR p.prokind = 'w'
                OR (p.prokind = 'a' AND p.proname NOT IN ('count', 'min', 'max', 'bool_and', 'bool_or', 'every'))",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    let queries = env_or("SQLSMITH_QUERIES", DEFAULT_QUERIES);
    let seed = env_or("SQLSMITH_SEED", DEFAULT_SEED);
    let statements = sqlsmith_statements(plain.instance.port, seed, queries);
    let bystander = cluster.connect().await;

    let started = Instant::now();
    let mut ts = ts;
    let mut tally: BTreeMap<&str, usize> = BTreeMap::new();
    let mut failures = Vec::new();
    for (i, sql) in statements.iter().enumerate() {
        let deterministic = is_deterministic(sql, &unstable);
        let expected = run(&pg, sql).await;
        let got = run(&ts, sql).await;
        let verdict = match (&expected, &got) {
            (_, Outcome::Hung) => Err("the coordinator did not answer"),
            (_, Outcome::Error { code, .. }) if code == "connection" => Err("lost connection"),
            // PostgreSQL raises XX000 itself for a few odd inputs.
            (Outcome::Error { code: expected, .. }, Outcome::Error { code, on_worker, .. })
                if code == "XX000" && !on_worker && expected != "XX000" =>
            {
                Err("internal error")
            }
            (Outcome::Rows(_), Outcome::Error { code, on_worker: false, .. }) if code == "XX000" => Err("internal error"),
            (Outcome::Rows(a), Outcome::Rows(b)) if deterministic && a != b => Err("different rows"),
            (Outcome::Rows(_), Outcome::Rows(_)) => Ok(if deterministic { "same rows" } else { "rows (not compared: not deterministic)" }),
            (Outcome::Rows(_), Outcome::Error { code, .. }) if code == "0A000" => Ok("refused as unsupported"),
            (Outcome::Rows(_), Outcome::Error { .. }) => {
                println!("statement #{i} failed where PostgreSQL did not: {got}");
                Ok("failed where PostgreSQL did not")
            }
            (Outcome::Error { .. }, Outcome::Error { .. }) => Ok("failed on both"),
            (Outcome::Error { .. }, Outcome::Rows(_)) => Ok("failed on PostgreSQL only"),
            (Outcome::Hung, _) => Ok("PostgreSQL did not answer"),
        };
        match verdict {
            Ok(kind) => *tally.entry(kind).or_default() += 1,
            Err(why) => {
                failures.push(format!("statement #{i}: {why}\n{sql}\nPostgreSQL: {expected}\nTessera: {got}"));
                if ts.is_closed() || matches!(got, Outcome::Hung) {
                    ts = match common::try_connect(cluster.port).await {
                        Ok(client) => client,
                        Err(e) => panic!("the coordinator is gone ({e}) after statement #{i}:\n{sql}\n\n{}", cluster.coordinator_log_tail()),
                    };
                }
            }
        }
    }
    println!("{} SQLsmith statements in {:.0?}: {tally:?}, {} failures", statements.len(), started.elapsed(), failures.len());
    // The coordinator is still up for everyone else.
    assert_eq!(common::text_rows(&bystander, "SELECT count(*) FROM accounts").await, vec![vec![Some("40".to_string())]], "the coordinator survived");
    assert!(failures.is_empty(), "{} of {} statements failed:\n\n{}", failures.len(), statements.len(), failures.join("\n\n"));
    // Most of what SQLsmith writes has a LIMIT or calls a volatile function.
    assert!(tally.get("same rows").copied().unwrap_or(0) >= 10, "some of the corpus is compared row for row: {tally:?}");
}
