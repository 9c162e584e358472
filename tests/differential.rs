//! Differential SQL tests: the same statements run on a plain PostgreSQL 15 (the
//! oracle) and through a Tessera cluster (coordinator + 2 workers) must give the
//! same answers.
//!
//! The runner starts ONE `PlainPostgres` and ONE `TestCluster::start(2)`, then
//! runs every `tests/slt/*.slt` file (sorted by name) against both. Each file gets
//! fresh connections on both sides (session state such as an open transaction
//! does not leak from file to file), but the servers are shared, so every file
//! uses its own table names and drops its tables at the end.
//!
//! # File format
//!
//! A file is a sequence of records separated by blank lines. A line starting
//! with `#` is a comment (also inside a record). A record is a header line
//! followed by SQL lines up to the next blank line (or the end of the file):
//!
//! * `statement ok` — run on both (simple protocol); both must succeed and
//!   report the same row counts in their command tags (`INSERT 0 3`,
//!   `UPDATE 1`, …).
//! * `statement error <SQLSTATE>` — run on both; both must fail with exactly
//!   that SQLSTATE.
//! * `distributed ok` — run on Tessera only (for `create_distributed_table`,
//!   `create_reference_table`, …); must succeed.
//! * `query rowsort` / `query nosort` — run on both through the simple
//!   protocol, so every value is PostgreSQL's own text output. Column names
//!   and rows must be equal; `rowsort` sorts the rows first (use it whenever the
//!   SQL has no ORDER BY that fixes the order), `nosort` compares them in order.
//!   Both must succeed.
//! * `query rowsort extended [p1, p2, …]` / `query nosort extended […]` — the
//!   same through the extended protocol (Parse/Describe/Bind/Execute via
//!   `Client::prepare` + `Client::query`). Optional parameters follow
//!   `extended`, separated by commas (`NULL` is SQL NULL); each is converted to
//!   the parameter type the server describes (int2/int4/int8/bool/float8 or a
//!   text-like type; anything else is a runner error: cast the parameter, e.g.
//!   `$1::text::uuid`). Result columns are rendered as text only for text-like,
//!   integer and boolean types (PostgreSQL's output for those is what Rust's
//!   `to_string` gives, and `t`/`f`); any other column type is a runner error,
//!   so cast such columns to `::text` in the SQL. Parameter types, column names
//!   and column type OIDs must match as well as the rows.
//! * `unsupported` — a shape Tessera does not support yet: plain PostgreSQL
//!   must run it successfully (so the SQL is valid) and Tessera must refuse it
//!   with SQLSTATE 0A000 (refusing rather than answering wrongly). On plain
//!   PostgreSQL it runs inside `BEGIN … ROLLBACK`, so a refused write leaves
//!   both sides' data equal; hence `unsupported` records must not appear inside
//!   an explicit transaction of the file. When support lands, the record flips
//!   to `query`/`statement ok`.
//!
//! Every plain `query` both sides answered is run twice more: read through a
//! view of it (`CREATE VIEW slt_wrapped AS …`, which Tessera expands), and,
//! outside transaction blocks, inside a set-returning SQL function giving each
//! row as JSON (which Tessera runs on a worker, over its worker-side
//! relations). Both must give the query's rows again; a clear 0A000 refusal
//! through Tessera is allowed.
//!
//! Every mismatch is collected with file:line, the SQL and both results; the
//! test fails once at the end listing all of them.
//!
//! Environment knobs (for working on the suite):
//! * `SLT_FILTER=substr` — run only files whose name contains `substr`.
//! * `SLT_FILES=path1:path2` — run exactly these files (e.g. the not-run
//!   `tests/slt/known_bugs.slt.disabled`, to reproduce known bugs).

mod common;

use common::slt::{parse_file, suite_files, Kind};
use common::{PlainPostgres, TestCluster};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{Client, SimpleQueryMessage};

/// No statement in the suite should take anywhere near this long; a hang is
/// reported as a failure and the connection replaced.
const STATEMENT_TIMEOUT: Duration = Duration::from_secs(60);
/// Rows shown per side in a failure report.
const SHOW_ROWS: usize = 25;

// ---------------------------------------------------------------------------
// Running statements
// ---------------------------------------------------------------------------

type Rows = Vec<Vec<Option<String>>>;

/// What one server made of one record.
#[derive(Debug, Clone, PartialEq)]
enum Outcome {
    Ok {
        /// Column names (simple protocol) or `name:type_oid` (extended protocol).
        columns: Vec<String>,
        rows: Rows,
        /// Row counts of the command tags, one per statement (simple protocol).
        counts: Vec<u64>,
        /// Parameter type OIDs (extended protocol).
        params: Vec<u32>,
    },
    /// The server reported an error.
    Error { code: String, message: String },
    /// No server answer: timeout, lost connection, or something the runner
    /// cannot convert. Never matches anything.
    Broken(String),
}

impl Outcome {
    fn code(&self) -> Option<&str> {
        match self {
            Outcome::Error { code, .. } => Some(code),
            _ => None,
        }
    }

    fn describe(&self) -> String {
        match self {
            Outcome::Ok { columns, rows, counts, params } => {
                let mut s = String::new();
                if !params.is_empty() {
                    let _ = write!(s, "param types {params:?}, ");
                }
                let _ = write!(s, "{} row(s), columns [{}], tags {counts:?}", rows.len(), columns.join(", "));
                for row in rows.iter().take(SHOW_ROWS) {
                    let cells: Vec<String> = row.iter().map(|c| c.clone().unwrap_or_else(|| "NULL".into())).collect();
                    let _ = write!(s, "\n      | {}", cells.join(" | "));
                }
                if rows.len() > SHOW_ROWS {
                    let _ = write!(s, "\n      | … {} more", rows.len() - SHOW_ROWS);
                }
                s
            }
            Outcome::Error { code, message } => format!("ERROR {code}: {message}"),
            Outcome::Broken(why) => format!("NO ANSWER: {why}"),
        }
    }
}

fn error_outcome(e: &tokio_postgres::Error) -> Outcome {
    match e.as_db_error() {
        Some(db) => Outcome::Error { code: db.code().code().to_string(), message: db.message().to_string() },
        None => Outcome::Broken(format!("client error: {e}")),
    }
}

async fn run_simple(client: &Client, sql: &str) -> Outcome {
    let messages = match tokio::time::timeout(STATEMENT_TIMEOUT, client.simple_query(sql)).await {
        Err(_) => return Outcome::Broken(format!("timed out after {STATEMENT_TIMEOUT:?}")),
        Ok(Err(e)) => return error_outcome(&e),
        Ok(Ok(m)) => m,
    };
    let mut columns = Vec::new();
    let mut rows = Vec::new();
    let mut counts = Vec::new();
    for m in messages {
        match m {
            SimpleQueryMessage::RowDescription(cols) => columns = cols.iter().map(|c| c.name().to_string()).collect(),
            SimpleQueryMessage::Row(r) => {
                if columns.is_empty() {
                    columns = r.columns().iter().map(|c| c.name().to_string()).collect();
                }
                rows.push((0..r.len()).map(|i| r.get(i).map(str::to_string)).collect())
            }
            SimpleQueryMessage::CommandComplete(n) => counts.push(n),
            _ => {}
        }
    }
    Outcome::Ok { columns, rows, counts, params: Vec::new() }
}

fn is_text_like(t: &Type) -> bool {
    [Type::TEXT, Type::VARCHAR, Type::BPCHAR, Type::NAME, Type::UNKNOWN].contains(t)
}

/// A parameter given in the record, converted to what the server said it wants.
fn param_value(text: &Option<String>, ty: &Type) -> Result<Box<dyn ToSql + Sync + Send>, String> {
    let bad = |e: &dyn std::fmt::Display| format!("parameter {text:?} as {ty}: {e}");
    Ok(match (text, ty) {
        (None, t) if *t == Type::INT2 => Box::new(None::<i16>),
        (None, t) if *t == Type::INT4 => Box::new(None::<i32>),
        (None, t) if *t == Type::INT8 => Box::new(None::<i64>),
        (None, t) if *t == Type::BOOL => Box::new(None::<bool>),
        (None, t) if *t == Type::FLOAT8 => Box::new(None::<f64>),
        (None, t) if is_text_like(t) => Box::new(None::<String>),
        (Some(v), t) if *t == Type::INT2 => Box::new(v.parse::<i16>().map_err(|e| bad(&e))?),
        (Some(v), t) if *t == Type::INT4 => Box::new(v.parse::<i32>().map_err(|e| bad(&e))?),
        (Some(v), t) if *t == Type::INT8 => Box::new(v.parse::<i64>().map_err(|e| bad(&e))?),
        (Some(v), t) if *t == Type::FLOAT8 => Box::new(v.parse::<f64>().map_err(|e| bad(&e))?),
        (Some(v), t) if *t == Type::BOOL => Box::new(matches!(v.as_str(), "t" | "true")),
        (Some(v), t) if is_text_like(t) => Box::new(v.clone()),
        _ => return Err(format!("the runner cannot send a parameter of type {ty}; cast it in the SQL (e.g. $1::text::{ty})")),
    })
}

fn render(row: &tokio_postgres::Row, i: usize) -> Result<Option<String>, String> {
    let ty = row.columns()[i].type_();
    let err = |e: tokio_postgres::Error| format!("column {i}: {e}");
    Ok(if is_text_like(ty) {
        row.try_get::<_, Option<String>>(i).map_err(err)?
    } else if *ty == Type::INT2 {
        row.try_get::<_, Option<i16>>(i).map_err(err)?.map(|v| v.to_string())
    } else if *ty == Type::INT4 {
        row.try_get::<_, Option<i32>>(i).map_err(err)?.map(|v| v.to_string())
    } else if *ty == Type::INT8 {
        row.try_get::<_, Option<i64>>(i).map_err(err)?.map(|v| v.to_string())
    } else if *ty == Type::BOOL {
        row.try_get::<_, Option<bool>>(i).map_err(err)?.map(|v| if v { "t" } else { "f" }.to_string())
    } else {
        return Err(format!("the runner cannot render column {} of type {ty}; cast it to ::text in the SQL", row.columns()[i].name()));
    })
}

async fn run_extended(client: &Client, sql: &str, params: &[Option<String>]) -> Outcome {
    let work = async {
        let stmt = match client.prepare(sql).await {
            Ok(s) => s,
            Err(e) => return error_outcome(&e),
        };
        let param_types: Vec<u32> = stmt.params().iter().map(|t| t.oid()).collect();
        if stmt.params().len() != params.len() {
            return Outcome::Broken(format!("the statement takes {} parameter(s), the record gives {}", stmt.params().len(), params.len()));
        }
        let mut values = Vec::new();
        for (p, ty) in params.iter().zip(stmt.params()) {
            match param_value(p, ty) {
                Ok(v) => values.push(v),
                Err(e) => return Outcome::Broken(e),
            }
        }
        let refs: Vec<&(dyn ToSql + Sync)> = values.iter().map(|v| &**v as &(dyn ToSql + Sync)).collect();
        let result = match client.query(&stmt, &refs).await {
            Ok(r) => r,
            Err(e) => return error_outcome(&e),
        };
        let columns = stmt.columns().iter().map(|c| format!("{}:{}", c.name(), c.type_().oid())).collect();
        let mut rows = Vec::new();
        for row in &result {
            let mut out = Vec::new();
            for i in 0..row.len() {
                match render(row, i) {
                    Ok(v) => out.push(v),
                    Err(e) => return Outcome::Broken(e),
                }
            }
            rows.push(out);
        }
        Outcome::Ok { columns, rows, counts: Vec::new(), params: param_types }
    };
    match tokio::time::timeout(STATEMENT_TIMEOUT, work).await {
        Ok(o) => o,
        Err(_) => Outcome::Broken(format!("timed out after {STATEMENT_TIMEOUT:?}")),
    }
}

// ---------------------------------------------------------------------------
// Comparing
// ---------------------------------------------------------------------------

/// One side of the comparison: a connection that is replaced when it breaks.
struct Side {
    name: &'static str,
    port: u16,
    client: Client,
}

impl Side {
    async fn connect(name: &'static str, port: u16) -> Side {
        Side { name, port, client: common::connect(port).await }
    }

    /// After a timeout or a lost connection the session state is unknown;
    /// later records of the file run on a new connection (and will likely
    /// report their own mismatches, which is what we want).
    async fn heal(&mut self, outcome: &Outcome) {
        let timed_out = matches!(outcome, Outcome::Broken(why) if why.starts_with("timed out"));
        if timed_out || self.client.is_closed() {
            if let Ok(Ok((client, conn))) = tokio::time::timeout(
                Duration::from_secs(10),
                tokio_postgres::connect(&format!("host=127.0.0.1 port={} user=postgres dbname=postgres", self.port), tokio_postgres::NoTls),
            )
            .await
            {
                tokio::spawn(async move {
                    let _ = conn.await;
                });
                self.client = client;
            }
        }
    }

    /// Runs `sql` inside BEGIN … ROLLBACK, so that an `unsupported` write that
    /// Tessera refuses leaves the oracle's data unchanged too.
    async fn run_and_roll_back(&mut self, sql: &str) -> Outcome {
        let begin = run_simple(&self.client, "BEGIN").await;
        if !matches!(begin, Outcome::Ok { .. }) {
            self.heal(&begin).await;
            return begin;
        }
        let outcome = run_simple(&self.client, sql).await;
        let rollback = run_simple(&self.client, "ROLLBACK").await;
        self.heal(&outcome).await;
        self.heal(&rollback).await;
        outcome
    }

    async fn run(&mut self, kind: &Kind, sql: &str) -> Outcome {
        let outcome = match kind {
            Kind::Query { extended: Some(params), .. } => run_extended(&self.client, sql, params).await,
            _ => run_simple(&self.client, sql).await,
        };
        self.heal(&outcome).await;
        outcome
    }
}

#[derive(Default)]
struct Stats {
    files: usize,
    statement_ok: usize,
    statement_error: usize,
    distributed_ok: usize,
    query_simple: usize,
    query_extended: usize,
    unsupported: usize,
    /// Queries where both sides agreed on an empty result (worth keeping few).
    empty_queries: usize,
    /// Queries also read through a view of them.
    through_views: usize,
    /// Queries also run inside a function (on a worker, through Tessera).
    through_functions: usize,
}

impl Stats {
    fn count(&mut self, kind: &Kind) {
        match kind {
            Kind::StatementOk => self.statement_ok += 1,
            Kind::StatementError(_) => self.statement_error += 1,
            Kind::DistributedOk => self.distributed_ok += 1,
            Kind::Query { extended: None, .. } => self.query_simple += 1,
            Kind::Query { extended: Some(_), .. } => self.query_extended += 1,
            Kind::Unsupported => self.unsupported += 1,
        }
    }

    fn total(&self) -> usize {
        self.statement_ok + self.statement_error + self.distributed_ok + self.query_simple + self.query_extended + self.unsupported
    }
}

/// Checks one record's outcomes; Some(why) when they do not meet its rule.
fn check(kind: &Kind, pg: Option<&Outcome>, ts: &Outcome) -> Option<String> {
    match kind {
        Kind::DistributedOk => (!matches!(ts, Outcome::Ok { .. })).then(|| "Tessera must succeed".to_string()),
        Kind::Unsupported => {
            let pg = pg.unwrap();
            if !matches!(pg, Outcome::Ok { .. }) {
                Some("plain PostgreSQL must run an `unsupported` record successfully (fix the SQL)".into())
            } else if ts.code() != Some("0A000") {
                Some("Tessera must refuse this shape with 0A000".into())
            } else {
                None
            }
        }
        Kind::StatementError(code) => {
            let pg = pg.unwrap();
            let ok = pg.code() == Some(code) && ts.code() == Some(code);
            (!ok).then(|| format!("both must fail with SQLSTATE {code}"))
        }
        Kind::StatementOk => match (pg.unwrap(), ts) {
            (Outcome::Ok { counts: a, .. }, Outcome::Ok { counts: b, .. }) => {
                (a != b).then(|| "both succeeded but the command tags' row counts differ".to_string())
            }
            _ => Some("both must succeed".into()),
        },
        Kind::Query { sort, .. } => match (pg.unwrap(), ts) {
            (Outcome::Ok { columns: ca, rows: ra, params: pa, .. }, Outcome::Ok { columns: cb, rows: rb, params: pb, .. }) => {
                let (mut ra, mut rb) = (ra.clone(), rb.clone());
                if *sort {
                    ra.sort();
                    rb.sort();
                }
                if pa != pb {
                    Some("parameter types differ".into())
                } else if ca != cb {
                    Some("result columns differ".into())
                } else if ra != rb {
                    Some(format!("rows differ ({})", row_diff(&ra, &rb)))
                } else {
                    None
                }
            }
            _ => Some("both must succeed".into()),
        },
    }
}

/// A short summary of how two row lists differ (as multisets).
fn row_diff(pg: &Rows, ts: &Rows) -> String {
    let mut missing = pg.clone();
    let mut extra = Vec::new();
    for r in ts {
        match missing.iter().position(|m| m == r) {
            Some(i) => {
                missing.remove(i);
            }
            None => extra.push(r.clone()),
        }
    }
    if missing.is_empty() && extra.is_empty() {
        "same rows, different order".into()
    } else {
        format!("{} row(s) missing from Tessera, {} extra in Tessera", missing.len(), extra.len())
    }
}

/// What a plain query is read again through.
#[derive(Clone, Copy)]
enum Wrapper {
    /// A view of it (`CREATE VIEW` of the query, then `SELECT *` from it), so
    /// that every query shape the suite knows is also checked as the view
    /// expansion plans it. Inside a transaction block the view lives in a
    /// savepoint, so that a refusal does not end the block on one side only.
    View,
    /// A set-returning SQL function giving each row as JSON, outside
    /// transaction blocks: a hunt for what user code gets wrong. Through
    /// Tessera the function reaches distributed tables, so it runs on a
    /// worker over the worker-side relations.
    Function,
}

impl Wrapper {
    fn create(self, sql: &str) -> String {
        match self {
            Wrapper::View => format!("CREATE VIEW slt_wrapped AS {sql}"),
            Wrapper::Function => format!(
                "CREATE FUNCTION public.slt_wrapped_rows() RETURNS SETOF json LANGUAGE sql AS $slt_body$ SELECT to_json(slt_row) FROM ({}) slt_row $slt_body$",
                sql.trim().trim_end_matches(';')
            ),
        }
    }
    fn read(self) -> &'static str {
        match self {
            Wrapper::View => "SELECT * FROM slt_wrapped",
            Wrapper::Function => "SELECT * FROM public.slt_wrapped_rows()",
        }
    }
    fn drop(self) -> &'static str {
        match self {
            Wrapper::View => "DROP VIEW IF EXISTS slt_wrapped",
            Wrapper::Function => "DROP FUNCTION IF EXISTS public.slt_wrapped_rows()",
        }
    }
    fn name(self) -> &'static str {
        match self {
            Wrapper::View => "through a view",
            Wrapper::Function => "inside a function",
        }
    }
}

/// Reads a plain query record's result again through `wrapper` on both
/// servers; rows are compared sorted (a wrapped ORDER BY orders nothing
/// for its readers). None when the query cannot be wrapped (not a plain
/// SELECT, bind parameters, plain PostgreSQL refuses it so, or a function
/// inside a block) or Tessera refuses it clearly (a wrapped query may need a
/// tier that a block's earlier writes rule out); else whether both agreed,
/// or why not.
async fn read_wrapped(pg: &mut Side, ts: &mut Side, sql: &str, wrapper: Wrapper) -> Option<Result<(), String>> {
    let lowered = sql.trim_start().to_ascii_lowercase();
    if !(lowered.starts_with("select") || lowered.starts_with("with"))
        || sql.contains('$')
        || lowered.contains(" into ")
        || lowered.contains("for update")
    {
        return None;
    }
    let in_block = matches!(run_simple(&pg.client, "SAVEPOINT slt_wrapped").await, Outcome::Ok { .. });
    if in_block {
        if matches!(wrapper, Wrapper::Function) {
            run_simple(&pg.client, "ROLLBACK TO SAVEPOINT slt_wrapped; RELEASE SAVEPOINT slt_wrapped").await;
            return None;
        }
        run_simple(&ts.client, "SAVEPOINT slt_wrapped").await;
    }
    let create = wrapper.create(sql);
    let mut outcomes = None;
    if matches!(run_simple(&pg.client, &create).await, Outcome::Ok { .. }) {
        let created = run_simple(&ts.client, &create).await;
        outcomes = Some((created, run_simple(&pg.client, wrapper.read()).await, run_simple(&ts.client, wrapper.read()).await));
    }
    for side in [&mut *pg, &mut *ts] {
        let cleanup = if in_block { "ROLLBACK TO SAVEPOINT slt_wrapped; RELEASE SAVEPOINT slt_wrapped" } else { wrapper.drop() };
        let cleaned = run_simple(&side.client, cleanup).await;
        side.heal(&cleaned).await;
    }
    let (created, pg_read, ts_read) = outcomes?;
    if !matches!(created, Outcome::Ok { .. }) {
        return Some(Err(format!("{}: creating it failed through Tessera: {}", wrapper.name(), created.describe())));
    }
    if ts_read.code() == Some("0A000") {
        return None;
    }
    Some(match check(&Kind::Query { sort: true, extended: None }, Some(&pg_read), &ts_read) {
        Some(why) => Err(format!("{}: {why}\n  on postgres: {}\n  on tessera:  {}", wrapper.name(), pg_read.describe(), ts_read.describe())),
        None => Ok(()),
    })
}

async fn run_file(path: &Path, plain_port: u16, tessera_port: u16, stats: &mut Stats, failures: &mut Vec<String>) {
    let display = path.strip_prefix(env!("CARGO_MANIFEST_DIR")).unwrap_or(path).display().to_string();
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) => return failures.push(format!("{display}: cannot read: {e}")),
    };
    let records = match parse_file(&text) {
        Ok(r) => r,
        Err(e) => return failures.push(format!("{display}: {e}")),
    };
    stats.files += 1;
    let mut pg = Side::connect("postgres", plain_port).await;
    let mut ts = Side::connect("tessera", tessera_port).await;
    let started = Instant::now();
    let mut file_failures = 0;
    for rec in &records {
        stats.count(&rec.kind);
        let pg_outcome = match rec.kind {
            Kind::DistributedOk => None,
            Kind::Unsupported => Some(pg.run_and_roll_back(&rec.sql).await),
            _ => Some(pg.run(&rec.kind, &rec.sql).await),
        };
        let ts_outcome = ts.run(&rec.kind, &rec.sql).await;
        if let (Kind::Query { .. }, Some(Outcome::Ok { rows, .. })) = (&rec.kind, &pg_outcome) {
            if rows.is_empty() && matches!(&ts_outcome, Outcome::Ok { rows, .. } if rows.is_empty()) {
                stats.empty_queries += 1;
            }
        }
        let mut mismatch = check(&rec.kind, pg_outcome.as_ref(), &ts_outcome);
        if matches!((&rec.kind, &pg_outcome), (Kind::Query { extended: None, .. }, Some(Outcome::Ok { .. }))) {
            for wrapper in [Wrapper::View, Wrapper::Function] {
                if mismatch.is_some() {
                    break;
                }
                if let Some(agreed) = read_wrapped(&mut pg, &mut ts, &rec.sql, wrapper).await {
                    match wrapper {
                        Wrapper::View => stats.through_views += 1,
                        Wrapper::Function => stats.through_functions += 1,
                    }
                    mismatch = agreed.err();
                }
            }
        }
        if let Some(why) = mismatch {
            file_failures += 1;
            let mut report = format!("{display}:{}: `{}` — {why}\n  SQL:", rec.line, rec.header);
            for l in rec.sql.lines() {
                let _ = write!(report, "\n    {l}");
            }
            if let Some(p) = &pg_outcome {
                let _ = write!(report, "\n  {:<9} {}", format!("{}:", pg.name), p.describe());
            }
            let _ = write!(report, "\n  {:<9} {}", format!("{}:", ts.name), ts_outcome.describe());
            failures.push(report);
        }
    }
    println!("{display}: {} records, {} mismatches, {:.1?}", records.len(), file_failures, started.elapsed());
}

fn slt_files() -> Vec<PathBuf> {
    if let Ok(list) = std::env::var("SLT_FILES") {
        return list
            .split(':')
            .filter(|p| !p.is_empty())
            .map(|p| {
                let p = PathBuf::from(p);
                if p.is_absolute() {
                    p
                } else {
                    Path::new(env!("CARGO_MANIFEST_DIR")).join(p)
                }
            })
            .collect();
    }
    let filter = std::env::var("SLT_FILTER").unwrap_or_default();
    suite_files().into_iter().filter(|p| p.file_name().unwrap().to_string_lossy().contains(&filter)).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn differential() {
    let files = slt_files();
    assert!(!files.is_empty(), "no .slt files to run");
    let started = Instant::now();
    // Both servers start in parallel: they are independent.
    let (plain, cluster) = std::thread::scope(|s| {
        let plain = s.spawn(PlainPostgres::start);
        let cluster = s.spawn(|| TestCluster::start(2));
        (plain.join().expect("plain postgres"), cluster.join().expect("tessera cluster"))
    });
    println!("servers up in {:.1?}", started.elapsed());

    let mut stats = Stats::default();
    let mut failures = Vec::new();
    for path in &files {
        run_file(path, plain.instance.port, cluster.port, &mut stats, &mut failures).await;
    }
    println!(
        "{} files, {} records: {} statement ok, {} statement error, {} distributed ok, {} query (simple), {} query (extended), {} unsupported; \
         {} queries agreed on an empty result; {} also read through views, {} inside functions; {} mismatches; {:.1?} in all",
        stats.files,
        stats.total(),
        stats.statement_ok,
        stats.statement_error,
        stats.distributed_ok,
        stats.query_simple,
        stats.query_extended,
        stats.unsupported,
        stats.empty_queries,
        stats.through_views,
        stats.through_functions,
        failures.len(),
        started.elapsed()
    );
    drop(cluster);
    drop(plain);
    if !failures.is_empty() {
        panic!("{} differential mismatch(es):\n\n{}\n", failures.len(), failures.join("\n\n"));
    }
}
