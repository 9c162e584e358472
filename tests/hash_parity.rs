//! Parity of `tessera::hash` with a real PostgreSQL 15 server.
//!
//! The server is the shared harness's `common::PlainPostgres` (initdb in a
//! temp directory, started on a free port, stopped on drop); it is shared by
//! the tests running at the same time and stopped when the last of them
//! finishes. Queries go through the `psql` binary.
//!
//! For every supported type and a few hundred values we compare:
//! * our hash with the type's extended hash function called with the
//!   partition seed (looked up in the catalog, not hard-coded);
//! * our shard index with `satisfies_hash_partition` for moduli
//!   1, 2, 3, 7, 32, 64, NULL included;
//! * our shard index with the partition PostgreSQL actually routes an INSERT
//!   to in a 7-way hash-partitioned table;
//! * `shard_filter_sql` evaluated by the server with our shard index, for
//!   the same moduli and several sets of shards (one, every second or
//!   fourth as a node's share placed round robin, all but one);
//! * `hash_binary` of the server's `*send` output with the server's hash;
//! * hand-made binary inputs, fed to the server's `*recv` via COPY BINARY.

mod common;

use common::PlainPostgres;
use std::fmt::Write as _;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use tessera::hash::{hash_binary, hash_text, row_hash, shard_filter_sql, shard_index, HashType};

const PSQL: &str = "/usr/bin/psql";
/// HASH_PARTITION_SEED as the signed int8 the SQL functions take.
const SEED_SQL: &str = "8816678312871386365";
const MODULI: [u32; 6] = [1, 2, 3, 7, 32, 64];
/// Partition count of the real partitioned tables INSERTs are routed through.
const ROUTED_PARTITIONS: u32 = 7;

// ---------------------------------------------------------------------------
// Shared server
// ---------------------------------------------------------------------------

/// The harness's server plus the psql-based querying these tests use.
struct PgServer(PlainPostgres);

impl PgServer {
    fn port(&self) -> u16 {
        self.0.instance.port
    }

    fn data_dir(&self) -> &std::path::Path {
        &self.0.instance.data_dir
    }

    /// Runs a SQL script; Ok(unaligned output rows) or Err(error text).
    fn psql(&self, sql: &str) -> Result<Vec<String>, String> {
        use std::io::Write;
        let mut child = Command::new(PSQL)
            .args(["-X", "-q", "-A", "-t", "-F", "|", "-v", "ON_ERROR_STOP=1", "-h", "127.0.0.1", "-U"])
            .args(["postgres", "-d", "postgres", "-p", &self.port().to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn psql");
        let mut stdin = child.stdin.take().unwrap();
        let script = sql.to_owned();
        let writer = std::thread::spawn(move || stdin.write_all(script.as_bytes()));
        let out = child.wait_with_output().expect("psql output");
        writer.join().unwrap().expect("write psql stdin");
        if out.status.success() {
            Ok(String::from_utf8(out.stdout).unwrap().lines().map(str::to_owned).collect())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).into_owned())
        }
    }

    fn query(&self, sql: &str) -> Vec<String> {
        self.psql(sql).unwrap_or_else(|e| panic!("query failed: {e}\n--- SQL ---\n{}", truncate(sql)))
    }
}

fn truncate(s: &str) -> String {
    s.chars().take(2000).collect()
}

/// One server shared by the tests running at the same time; the last lease
/// to be dropped (also when its test panics) stops it. Statics are never
/// dropped, so we count leases rather than rely on the static.
static SHARED: Mutex<Option<(Arc<PgServer>, usize)>> = Mutex::new(None);

struct Lease(Arc<PgServer>);

fn server() -> Lease {
    let mut shared = SHARED.lock().unwrap_or_else(|e| e.into_inner());
    let (server, users) = shared.get_or_insert_with(|| (Arc::new(PgServer(PlainPostgres::start())), 0));
    *users += 1;
    Lease(Arc::clone(server))
}

impl Drop for Lease {
    fn drop(&mut self) {
        let mut shared = SHARED.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, users)) = shared.as_mut() {
            *users -= 1;
            if *users == 0 {
                // Our own Arc goes right after, which drops the PlainPostgres
                // and so stops the server.
                shared.take();
            }
        }
    }
}

impl std::ops::Deref for Lease {
    type Target = PgServer;
    fn deref(&self) -> &PgServer {
        &self.0
    }
}

// ---------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------

fn quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

fn hex_decode(s: &str) -> Vec<u8> {
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap()).collect()
}

/// The session settings every comparison runs under, chosen to differ from
/// UTC / ISO so accidental dependence on them would show up.
const SESSION: &str = "SET TimeZone = 'America/New_York'; SET DateStyle = 'SQL, DMY';\n";

/// Returns (hash function, send function) for a type. The hash function is
/// support function 2 of the type's default hash opclass, as partitioning
/// uses, looked up in the catalog. Several of those are declared on a
/// different but binary-compatible type (date uses hashint4extended, bool
/// hashcharextended, bytea hashvarlenaextended on `internal`), so SQL cannot
/// call them on our values directly; we declare a wrapper named
/// `{prefix}_{type}` over the very same built-in C function.
fn catalog_functions(pg: &PgServer, sql_type: &str, prefix: &str) -> (String, String) {
    // varchar has no hash opclass of its own; it uses text's. Arrays share one.
    let opclass_type = match sql_type {
        "varchar" => "text",
        t if t.ends_with("[]") => "anyarray",
        t => t,
    };
    let wrapper = format!("{prefix}_{}", table_suffix(sql_type));
    let rows = pg.query(&format!(
        "SELECT p.prosrc, (SELECT typsend::regproc FROM pg_type WHERE oid = '{sql_type}'::regtype)
           FROM pg_opclass oc
           JOIN pg_amproc ap ON ap.amprocfamily = oc.opcfamily AND ap.amprocnum = 2
                            AND ap.amproclefttype = oc.opcintype AND ap.amprocrighttype = oc.opcintype
           JOIN pg_proc p ON p.oid = ap.amproc
          WHERE oc.opcmethod = (SELECT oid FROM pg_am WHERE amname = 'hash')
            AND oc.opcdefault AND oc.opcintype = '{opclass_type}'::regtype"
    ));
    assert_eq!(rows.len(), 1, "catalog lookup for {sql_type}: {rows:?}");
    let (c_function, send) = rows[0].split_once('|').unwrap();
    pg.query(&format!(
        "CREATE OR REPLACE FUNCTION {wrapper}({sql_type}, int8) RETURNS int8
           LANGUAGE internal IMMUTABLE STRICT AS {}",
        quote(c_function)
    ));
    (wrapper, send.to_owned())
}

struct Case {
    ty: HashType,
    /// SQL type name (and, quotes stripped, the table-name suffix).
    sql_type: &'static str,
    values: Vec<String>,
}

fn table_suffix(sql_type: &str) -> String {
    sql_type.trim_matches('"').replace(|c: char| !c.is_ascii_alphanumeric(), "_")
}

/// Runs every comparison for one type; returns a summary line.
fn check_case(case: &Case) -> String {
    let pg = server();
    let (hash_fn, send_fn) = catalog_functions(&pg, case.sql_type, "hx");
    let t = case.sql_type;
    let suffix = table_suffix(t);
    let mut failures = Vec::new();

    // Our side first: every value in the list must be hashable locally.
    let ours: Vec<u64> = case.values.iter().map(|v| hash_text(case.ty, v).unwrap_or_else(|e| panic!("{t} {v:?}: {e}"))).collect();
    assert_eq!(HashType::from_type_oid(type_oid(&pg, t)), Some(case.ty));

    // Row 0 is NULL; row i (1-based) is values[i - 1].
    let mut rows = format!("(0, NULL::{t})");
    for (i, v) in case.values.iter().enumerate() {
        write!(rows, ",\n({}, {}::{t})", i + 1, quote(v)).unwrap();
    }

    // 1. Raw hash and send form.
    let hashed = pg.query(&format!(
        "{SESSION}SELECT i, {hash_fn}(v, {SEED_SQL}), encode({send_fn}(v), 'hex')
           FROM (VALUES {rows}) AS t(i, v) WHERE i > 0 ORDER BY i"
    ));
    assert_eq!(hashed.len(), case.values.len());
    let mut binary_checked = 0;
    for (row, (value, &our_hash)) in hashed.iter().zip(case.values.iter().zip(&ours)) {
        let fields: Vec<&str> = row.split('|').collect();
        let server_hash = fields[1].parse::<i64>().unwrap() as u64;
        if server_hash != our_hash {
            failures.push(format!("{t} {value:?}: hash_text {our_hash:#x}, server {server_hash:#x}"));
        }
        let send = hex_decode(fields[2]);
        match hash_binary(case.ty, &send) {
            Ok(h) if h == server_hash => binary_checked += 1,
            Ok(h) => failures.push(format!("{t} {value:?} binary {}: ours {h:#x}, server {server_hash:#x}", fields[2])),
            Err(e) => failures.push(format!("{t} {value:?} binary {}: {e}", fields[2])),
        }
    }

    // 2. satisfies_hash_partition for every modulus, NULL included.
    let moduli = MODULI.map(|m| format!("({m})")).join(",");
    let routed = pg.query(&format!(
        "{SESSION}DROP TABLE IF EXISTS p_{suffix};
         CREATE TABLE p_{suffix} (k {t}) PARTITION BY HASH (k);
         SELECT t.i, m.m, (SELECT r FROM generate_series(0, m.m - 1) AS r
                            WHERE satisfies_hash_partition('p_{suffix}'::regclass, m.m, r, t.v))
           FROM (VALUES {rows}) AS t(i, v) CROSS JOIN (VALUES {moduli}) AS m(m) ORDER BY 1, 2"
    ));
    assert_eq!(routed.len(), (case.values.len() + 1) * MODULI.len());
    for row in &routed {
        let f: Vec<u32> = row.split('|').map(|x| x.parse().unwrap()).collect();
        let (i, modulus, remainder) = (f[0] as usize, f[1], f[2]);
        let value_hash = if i == 0 { None } else { Some(ours[i - 1]) };
        let shard = shard_index(row_hash(value_hash), modulus);
        if shard != remainder {
            let value = if i == 0 { "NULL".to_owned() } else { format!("{:?}", case.values[i - 1]) };
            failures.push(format!("{t} {value} mod {modulus}: ours {shard}, server {remainder}"));
        }
    }

    // 3. Real routing of INSERTs into a hash-partitioned table.
    let mut ddl = format!("DROP TABLE IF EXISTS r_{suffix}; CREATE TABLE r_{suffix} (i int, k {t}) PARTITION BY HASH (k);\n");
    for r in 0..ROUTED_PARTITIONS {
        writeln!(ddl, "CREATE TABLE r_{suffix}_{r} PARTITION OF r_{suffix} FOR VALUES WITH (MODULUS {ROUTED_PARTITIONS}, REMAINDER {r});").unwrap();
    }
    let placed = pg.query(&format!(
        "{SESSION}{ddl}INSERT INTO r_{suffix} SELECT i, v FROM (VALUES {rows}) AS t(i, v);
         SELECT i, substring(tableoid::regclass::text FROM '_(\\d+)$') FROM r_{suffix} ORDER BY i"
    ));
    assert_eq!(placed.len(), case.values.len() + 1);
    for row in &placed {
        let (i, partition) = row.split_once('|').unwrap();
        let (i, partition): (usize, u32) = (i.parse().unwrap(), partition.parse().unwrap());
        let value_hash = if i == 0 { None } else { Some(ours[i - 1]) };
        let shard = shard_index(row_hash(value_hash), ROUTED_PARTITIONS);
        if shard != partition {
            failures.push(format!("{t} row {i}: ours {shard}, INSERT routed to {partition}"));
        }
    }

    // 4. The SQL a node evaluates to send rows where their shard lives.
    let mut evaluated = 0;
    let cases: Vec<(u32, Vec<u32>)> = MODULI.iter().flat_map(|&m| shard_sets(m).into_iter().map(move |set| (m, set))).collect();
    match cases
        .iter()
        .enumerate()
        .map(|(c, (m, set))| {
            shard_filter_sql(case.ty, "t.v", *m, set).map(|e| format!("SELECT t.i, {c}, ({e})::int FROM (VALUES {rows}) AS t(i, v)"))
        })
        .collect::<Option<Vec<_>>>()
    {
        Some(selects) => {
            let computed = pg.query(&format!("{SESSION}{} ORDER BY 1, 2", selects.join("\nUNION ALL\n")));
            for row in &computed {
                let f: Vec<usize> = row.split('|').map(|x| x.parse().unwrap()).collect();
                let (i, c, passed) = (f[0], f[1], f[2] == 1);
                let (modulus, set) = &cases[c];
                let value_hash = if i == 0 { None } else { Some(ours[i - 1]) };
                if set.contains(&shard_index(row_hash(value_hash), *modulus)) != passed {
                    failures.push(format!("{t} row {i} mod {modulus}: shard_filter_sql for shards {set:?} gave {passed}"));
                }
            }
            evaluated = computed.len();
        }
        None => assert_eq!(case.ty, HashType::Bytea, "only bytea has no shard index in SQL"),
    }

    assert!(failures.is_empty(), "{} mismatches:\n{}", failures.len(), failures.join("\n"));
    let summary = format!(
        "{t}: {} values (+NULL); {} hash_text, {} hash_binary, {} satisfies_hash_partition ({} moduli), {} routed INSERT, {evaluated} shard_filter_sql comparisons",
        case.values.len(),
        case.values.len(),
        binary_checked,
        routed.len(),
        MODULI.len(),
        placed.len()
    );
    println!("{summary}");
    summary
}

/// Sets of a modulus's shards a node may ask for: each of the first few
/// alone, every second and every fourth (a node's share placed round robin
/// over two or four nodes), every third, all but one.
fn shard_sets(modulus: u32) -> Vec<Vec<u32>> {
    let mut sets: Vec<Vec<u32>> = (0..modulus.min(3)).map(|r| vec![r]).collect();
    for (step, start) in [(2, 0), (2, 1), (4, 1), (3, 2)] {
        sets.push((start..modulus).step_by(step).collect());
    }
    sets.push((0..modulus).filter(|r| *r != modulus / 2).collect());
    sets
}

fn type_oid(pg: &PgServer, sql_type: &str) -> u32 {
    pg.query(&format!("SELECT '{sql_type}'::regtype::oid"))[0].parse().unwrap()
}

// ---------------------------------------------------------------------------
// Value generators
// ---------------------------------------------------------------------------

/// xorshift64*: deterministic, dependency-free randomness for test values.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed | 1)
    }
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn range(&mut self, lo: i64, hi: i64) -> i64 {
        lo + self.below((hi - lo + 1) as u64) as i64
    }
    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len() as u64) as usize]
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
    /// A signed integer of random magnitude that fits in `bits` bits.
    fn int(&mut self, bits: u32) -> i64 {
        let shift = self.below(u64::from(bits)) as u32;
        let v = (self.next() >> (64 - bits + 1)) >> shift;
        if self.chance(50) {
            -(v as i64) - i64::from(self.chance(10))
        } else {
            v as i64
        }
    }
    fn digits(&mut self, n: usize) -> String {
        (0..n).map(|_| char::from(b'0' + self.below(10) as u8)).collect()
    }
}

fn strs(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| s.to_string()).collect()
}

fn int_values(bits: u32, fixed: &[&str], seed: u64) -> Vec<String> {
    let mut rng = Rng::new(seed);
    let mut v = strs(fixed);
    v.extend((0..80).map(|_| rng.int(bits).to_string()));
    v
}

const TEXT_POOL: &[&str] =
    &["a", "b", "Z", "0", "9", " ", " ", "ż", "ó", "ł", "w", "日", "本", "語", "😀", "👍🏽", "é", "'", "\\", "\t", "\n", "x", "%", "_", "ß"];

fn random_text(rng: &mut Rng, max_chars: u64) -> String {
    let n = rng.below(max_chars + 1);
    (0..n).map(|_| *rng.pick(TEXT_POOL)).collect()
}

fn text_values(seed: u64) -> Vec<String> {
    let mut v = strs(&[
        "",
        "a",
        "abc",
        "abcd",
        "hello world!",
        "12345678901",
        "123456789012",
        "1234567890123",
        "12345678901234567890123",
        "123456789012345678901234",
        "1234567890123456789012345",
        "żółw",
        "日本語",
        "😀",
        "emoji 👍🏽 mix",
        "trailing  ",
        "  leading",
        "tab\there",
        "new\nline",
        "back\\slash",
        "quote'd",
        "NULL",
        "0",
    ]);
    v.push("long ".repeat(300));
    let mut rng = Rng::new(seed);
    v.extend((0..60).map(|_| random_text(&mut rng, 30)));
    v
}

fn bpchar_values(seed: u64) -> Vec<String> {
    let mut v = strs(&["", " ", "   ", "a", "a ", "a   ", "  a", "a b ", "żółw  ", "日本語 ", "x\t", "x\t ", "0"]);
    let mut rng = Rng::new(seed);
    v.extend((0..60).map(|_| {
        let mut s = random_text(&mut rng, 20);
        s.push_str(&" ".repeat(rng.below(4) as usize));
        s
    }));
    v
}

fn uuid_values(seed: u64) -> Vec<String> {
    let mut v = strs(&[
        "00000000-0000-0000-0000-000000000000",
        "ffffffff-ffff-ffff-ffff-ffffffffffff",
        "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11",
        "A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11",
        "{a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11}",
        "a0eebc999c0b4ef8bb6d6bb9bd380a11",
        "a0ee-bc99-9c0b-4ef8-bb6d-6bb9-bd38-0a11",
        "{a0eebc99-9c0b4ef8-bb6d6bb9-bd380a11}",
    ]);
    let mut rng = Rng::new(seed);
    for _ in 0..60 {
        let hex = format!("{:016x}{:016x}", rng.next(), rng.next());
        let mut s = if rng.chance(70) { format!("{}-{}-{}-{}-{}", &hex[0..8], &hex[8..12], &hex[12..16], &hex[16..20], &hex[20..]) } else { hex };
        if rng.chance(30) {
            s = s.to_uppercase();
        }
        if rng.chance(20) {
            s = format!("{{{s}}}");
        }
        v.push(s);
    }
    v
}

fn numeric_values(seed: u64) -> Vec<String> {
    let mut v = strs(&[
        "0",
        "0.000",
        "-0",
        "+0.0e10",
        "1e10",
        "-123.4500",
        "NaN",
        "nan",
        "Infinity",
        "-Infinity",
        "+inf",
        "-inf",
        "1",
        "-1",
        "0.1",
        "0.0001",
        "0.00001",
        "10000",
        "9999",
        "99999999",
        "12345.6789",
        "1e-16383",
        "1e131071",
        "-9.999e131070",
        "123456789012345678901234567890",
        "0.000000000000000000000000000001",
        ".5",
        "5.",
        "-.5",
        "1.5e-3",
        "  +42  ",
        "1E+5",
        "1e-0",
        "00001000.0001000",
        "3.14159265358979323846264338327950288419716939937510",
        "-2147483648",
        "9223372036854775807",
        "18446744073709551616",
    ]);
    let mut rng = Rng::new(seed);
    for _ in 0..150 {
        let mut s = String::new();
        if rng.chance(40) {
            s.push(*rng.pick(&['-', '+']));
        }
        if rng.chance(15) {
            s.push_str(&"0".repeat(rng.below(5) as usize));
        }
        let int_len = rng.below(25) as usize;
        s.push_str(&rng.digits(int_len));
        let frac_len = if int_len == 0 { 1 + rng.below(25) as usize } else { rng.below(25) as usize };
        if frac_len > 0 || rng.chance(10) {
            s.push('.');
            s.push_str(&rng.digits(frac_len));
            if rng.chance(20) {
                s.push_str(&"0".repeat(rng.below(6) as usize));
            }
        }
        if rng.chance(30) {
            s.push(*rng.pick(&['e', 'E']));
            s.push_str(["", "+", "-"][rng.below(3) as usize]);
            s.push_str(&rng.below(60).to_string());
        }
        v.push(s);
    }
    v
}

struct Civil {
    year: i64,
    month: i64,
    day: i64,
}

fn random_civil(rng: &mut Rng) -> Civil {
    let year = match rng.below(4) {
        0 => rng.range(1, 9999),
        1 => rng.range(1990, 2010),
        2 => rng.range(1, 200),
        _ => rng.range(9800, 9999),
    };
    let month = rng.range(1, 12);
    let leap = year % 4 == 0 && (year % 100 != 0 || year % 400 == 0);
    let days = match month {
        4 | 6 | 9 | 11 => 30,
        2 if leap => 29,
        2 => 28,
        _ => 31,
    };
    Civil { year, month, day: rng.range(1, days) }
}

fn date_values(seed: u64) -> Vec<String> {
    let mut v = strs(&[
        "2000-01-01",
        "1999-12-31",
        "2000-01-02",
        "2000-02-29",
        "2000-03-01",
        "1970-01-01",
        "0001-01-01",
        "9999-12-31",
        "1900-03-01",
        "1600-02-29",
        "infinity",
        "-infinity",
        "Infinity",
        "epoch",
        " 2024-2-9 ",
    ]);
    let mut rng = Rng::new(seed);
    for _ in 0..60 {
        let c = random_civil(&mut rng);
        v.push(if rng.chance(80) { format!("{:04}-{:02}-{:02}", c.year, c.month, c.day) } else { format!("{:04}-{}-{}", c.year, c.month, c.day) });
    }
    v
}

fn random_time(rng: &mut Rng) -> String {
    let mut s = format!("{:02}:{:02}", rng.below(24), rng.below(60));
    if rng.chance(85) {
        write!(s, ":{:02}", rng.below(60)).unwrap();
        if rng.chance(60) {
            let n = 1 + rng.below(6) as usize;
            s.push('.');
            s.push_str(&rng.digits(n));
        }
    }
    s
}

fn random_offset(rng: &mut Rng) -> String {
    let sign = *rng.pick(&['+', '-']);
    let hour = rng.below(16);
    let minute = *rng.pick(&[0, 0, 15, 30, 45, 59]);
    match rng.below(6) {
        0 => "Z".to_owned(),
        1 => format!("{sign}{hour:02}"),
        2 => format!("{sign}{hour}"),
        3 => format!("{sign}{hour:02}:{minute:02}"),
        4 => format!("{sign}{hour:02}{minute:02}"),
        _ => format!("{sign}{hour:02}:{minute:02}:{:02}", rng.below(60)),
    }
}

fn timestamp_values(with_zone: bool, seed: u64) -> Vec<String> {
    let mut v = if with_zone {
        strs(&[
            "2000-01-01 00:00:00+00",
            "2000-01-01 00:00:00Z",
            "2000-01-01T00:00:00z",
            "1999-12-31 19:00:00-05",
            "2000-01-01 05:30:00+05:30",
            "2000-01-01 12:00:00 +0530",
            "2000-01-01T12:00:00.123456-08:00",
            "2000-01-01 12:00:00+15:59",
            "2000-01-01 12:00:00-15",
            "2000-06-01 12:00:00+05:30:15",
            "2000-01-01 12:00:00 -00",
            "0001-01-01 00:00:00+00",
            "0001-01-01 00:00:00+15",
            "9999-12-31 23:59:59.999999-15",
            "1970-01-01 00:00:00+00",
            "2000-01-01 12:00+01",
            "infinity",
            "-infinity",
            "epoch",
        ])
    } else {
        strs(&[
            "2000-01-01 00:00:00",
            "2000-01-01",
            "1999-12-31 23:59:59.999999",
            "2000-01-01T12:34:56.789",
            "2000-01-01 00:00:00.000001",
            "0001-01-01 00:00:00",
            "9999-12-31 23:59:59.999999",
            "1970-01-01",
            "1970-01-01 00:00:01",
            "2000-01-01 1:02",
            "2000-01-01    01:02:03",
            "2000-01-01 12:00:00+05",
            "2000-01-01T12:00:00Z",
            "2000-01-01 12:00:00 -08:00",
            "infinity",
            "-infinity",
            "epoch",
        ])
    };
    let mut rng = Rng::new(seed);
    for _ in 0..80 {
        let c = random_civil(&mut rng);
        let sep = if rng.chance(30) { "T" } else { " " };
        let mut s = format!("{:04}-{:02}-{:02}{sep}{}", c.year, c.month, c.day, random_time(&mut rng));
        if with_zone || rng.chance(20) {
            if rng.chance(30) {
                s.push(' ');
            }
            s.push_str(&random_offset(&mut rng));
        }
        v.push(s);
    }
    v
}

fn bytea_values(seed: u64) -> Vec<String> {
    let mut v = strs(&[
        "\\x",
        "",
        "\\x00",
        "\\xdeadbeef",
        "\\xDEADBEEF",
        "\\x 01 02\n03\t04\r",
        "abc",
        "a\\\\b",
        "\\000\\377\\101",
        "żółw",
        "\\x000102030405060708090a0b0c0d0e0f10",
    ]);
    let mut rng = Rng::new(seed);
    for _ in 0..50 {
        let n = rng.below(40) as usize;
        let bytes: Vec<u8> = (0..n).map(|_| rng.next() as u8).collect();
        if rng.chance(70) {
            v.push(format!("\\x{}", bytes.iter().map(|b| format!("{b:02x}")).collect::<String>()));
        } else {
            // escape format: printable ASCII literally, the rest as \ooo
            v.push(
                bytes
                    .iter()
                    .map(|&b| match b {
                        b'\\' => "\\\\".to_owned(),
                        0x20..=0x7e => char::from(b).to_string(),
                        _ => format!("\\{b:03o}"),
                    })
                    .collect(),
            );
        }
    }
    v
}

fn oid_values(seed: u64) -> Vec<String> {
    let mut v = strs(&["0", "1", "4294967295", "-1", "-2147483648", " 12 ", "010", "+7", "2147483648"]);
    let mut rng = Rng::new(seed);
    v.extend((0..50).map(
        |_| {
            if rng.chance(20) {
                format!("-{}", rng.range(1, 2147483648))
            } else {
                (rng.next() as u32 >> rng.below(32)).to_string()
            }
        },
    ));
    v
}

// ---------------------------------------------------------------------------
// Per-type parity tests
// ---------------------------------------------------------------------------

macro_rules! parity {
    ($name:ident, $ty:expr, $sql:expr, $values:expr) => {
        #[test]
        fn $name() {
            check_case(&Case { ty: $ty, sql_type: $sql, values: $values });
        }
    };
}

parity!(parity_int2, HashType::Int2, "int2", int_values(16, &["0", "1", "-1", "32767", "-32768", " 42 ", "+7", "-0", "00012"], 2));
parity!(
    parity_int4,
    HashType::Int4,
    "int4",
    int_values(32, &["0", "1", "-1", "2147483647", "-2147483648", "  -123  ", "+0", "\t5\n", "65536", "-65536"], 4)
);
parity!(
    parity_int8,
    HashType::Int8,
    "int8",
    int_values(
        64,
        &[
            "0",
            "1",
            "-1",
            "9223372036854775807",
            "-9223372036854775808",
            "2147483647",
            "-2147483648",
            "2147483648",
            "-2147483649",
            "4294967295",
            "4294967296",
            "-4294967296",
        ],
        8
    )
);
parity!(parity_text, HashType::Text, "text", text_values(25));
parity!(parity_varchar, HashType::Text, "varchar", text_values(1043));
parity!(parity_bpchar, HashType::Bpchar, "bpchar", bpchar_values(1042));
parity!(parity_uuid, HashType::Uuid, "uuid", uuid_values(2950));
parity!(parity_numeric, HashType::Numeric, "numeric", numeric_values(1700));
parity!(parity_date, HashType::Date, "date", date_values(1082));
parity!(parity_timestamp, HashType::Timestamp, "timestamp", timestamp_values(false, 1114));
parity!(parity_timestamptz, HashType::TimestampTz, "timestamptz", timestamp_values(true, 1184));
parity!(
    parity_bool,
    HashType::Bool,
    "bool",
    strs(&["t", "f", "true", "false", "yes", "no", "on", "off", "1", "0", " TRUE ", "Of", "y", "N", "tr", "fal"])
);
parity!(parity_bytea, HashType::Bytea, "bytea", bytea_values(17));
parity!(parity_oid, HashType::Oid, "oid", oid_values(26));
/// Array literals of `elements`, a few at a time, quoted or not, with NULLs,
/// two dimensions and explicit bounds among them.
fn array_values(elements: &[String], seed: u64) -> Vec<String> {
    let mut rng = Rng::new(seed);
    let mut v = strs(&["{}", "{NULL}", "{NULL,NULL}"]);
    let mut rest = elements;
    while !rest.is_empty() {
        let (chunk, tail) = rest.split_at((1 + rng.below(3) as usize).min(rest.len()));
        rest = tail;
        let items: Vec<String> = chunk
            .iter()
            .map(|e| {
                let bare = !e.is_empty() && e.chars().all(|c| c.is_ascii_alphanumeric() || "-:.+".contains(c)) && !e.eq_ignore_ascii_case("null");
                if rng.chance(15) {
                    "NULL".to_string()
                } else if bare && rng.chance(50) {
                    e.clone()
                } else {
                    format!("\"{}\"", e.replace('\\', "\\\\").replace('"', "\\\""))
                }
            })
            .collect();
        v.push(format!("{{{}}}", items.join(",")));
        if items.len() == 2 {
            v.push(format!("{{{{{}}},{{{}}}}}", items.join(","), items.iter().rev().cloned().collect::<Vec<_>>().join(",")));
            v.push(format!("[3:4]={{{}}}", items.join(" , ")));
        }
    }
    v
}

parity!(parity_int4_array, HashType::Array(&HashType::Int4), "int4[]", array_values(&int_values(32, &["0", "-1", "7"], 41), 1007));
parity!(parity_int8_array, HashType::Array(&HashType::Int8), "int8[]", array_values(&int_values(64, &["0", "-1"], 42), 1016));
parity!(parity_text_array, HashType::Array(&HashType::Text), "text[]", array_values(&text_values(43), 1009));
parity!(
    parity_bpchar1_array,
    HashType::Array(&HashType::Bpchar),
    "char(1)[]",
    array_values(&strs(&["a", "b", " ", "z", "0", "ż", "Q", "x", "y"]), 1014)
);
parity!(parity_uuid_array, HashType::Array(&HashType::Uuid), "uuid[]", array_values(&uuid_values(44), 2951));
parity!(parity_numeric_array, HashType::Array(&HashType::Numeric), "numeric[]", array_values(&numeric_values(45), 1231));

parity!(parity_char, HashType::Char, "\"char\"", strs(&["a", "A", "", " ", "\\101", "\\000", "\\177", "ab", "\\", "\\12", "z", "0", "~", "\\x"]));

// ---------------------------------------------------------------------------
// Hand-made binary input, decoded by the server's receive functions
// ---------------------------------------------------------------------------

/// A one-column binary COPY file holding a single row.
fn copy_file(field: &[u8]) -> Vec<u8> {
    let mut f = b"PGCOPY\n\xff\r\n\0".to_vec();
    f.extend_from_slice(&0i32.to_be_bytes()); // flags
    f.extend_from_slice(&0i32.to_be_bytes()); // header extension length
    f.extend_from_slice(&1i16.to_be_bytes()); // field count
    f.extend_from_slice(&(field.len() as i32).to_be_bytes());
    f.extend_from_slice(field);
    f.extend_from_slice(&(-1i16).to_be_bytes()); // trailer
    f
}

fn numeric_bytes(weight: i16, sign: u16, dscale: u16, digits: &[u16]) -> Vec<u8> {
    let mut v = Vec::new();
    for w in [digits.len() as u16, weight as u16, sign, dscale].iter().chain(digits) {
        v.extend_from_slice(&w.to_be_bytes());
    }
    v
}

#[test]
fn crafted_binary_inputs_match_recv() {
    let pg = server();
    let pos = 0x0000;
    let neg = 0x4000;
    let cases: Vec<(HashType, &str, Vec<u8>)> = vec![
        // numeric in non-normalized forms numeric_send never produces
        (HashType::Numeric, "numeric", numeric_bytes(0, pos, 0, &[])),
        (HashType::Numeric, "numeric", numeric_bytes(5, neg, 0, &[])),
        (HashType::Numeric, "numeric", numeric_bytes(0, pos, 4, &[1, 5000])),
        (HashType::Numeric, "numeric", numeric_bytes(0, pos, 0, &[1, 5000])),
        (HashType::Numeric, "numeric", numeric_bytes(0, neg, 1, &[1, 5678])),
        (HashType::Numeric, "numeric", numeric_bytes(0, neg, 3, &[1, 5678])),
        (HashType::Numeric, "numeric", numeric_bytes(2, pos, 0, &[0, 12, 0])),
        (HashType::Numeric, "numeric", numeric_bytes(3, pos, 8, &[0, 0, 7, 0, 0, 0, 1, 0])),
        (HashType::Numeric, "numeric", numeric_bytes(-1, pos, 0, &[5000])),
        (HashType::Numeric, "numeric", numeric_bytes(-1, pos, 2, &[5000, 1])),
        (HashType::Numeric, "numeric", numeric_bytes(-3, pos, 100, &[0, 9999, 0])),
        (HashType::Numeric, "numeric", numeric_bytes(32767, pos, 0, &[1])),
        (HashType::Numeric, "numeric", numeric_bytes(32767, pos, 0, &[0, 1])),
        (HashType::Numeric, "numeric", numeric_bytes(-32768, pos, 16383, &[1])),
        (HashType::Numeric, "numeric", numeric_bytes(-4096, pos, 16383, &[0, 0, 7])),
        (HashType::Numeric, "numeric", numeric_bytes(0, 0xC000, 0, &[])),
        (HashType::Numeric, "numeric", numeric_bytes(0, 0xC000, 5, &[1, 2])),
        (HashType::Numeric, "numeric", numeric_bytes(0, 0xD000, 0, &[])),
        (HashType::Numeric, "numeric", numeric_bytes(0, 0xF000, 0, &[])),
        (HashType::Numeric, "numeric", numeric_bytes(0, pos, 0, &[10000])),
        (HashType::Numeric, "numeric", numeric_bytes(0, 0x8000, 0, &[1])),
        (HashType::Numeric, "numeric", numeric_bytes(0, pos, 0x4000, &[1])),
        (HashType::Numeric, "numeric", numeric_bytes(0, 0xC000, 0, &[10000])),
        (HashType::Numeric, "numeric", numeric_bytes(0, pos, 0, &[1])[..9].to_vec()),
        (HashType::Numeric, "numeric", vec![0, 0, 0, 0]),
        // bool: any non-zero byte is true
        (HashType::Bool, "bool", vec![0]),
        (HashType::Bool, "bool", vec![1]),
        (HashType::Bool, "bool", vec![2]),
        (HashType::Bool, "bool", vec![0xff]),
        (HashType::Bool, "bool", vec![1, 0]),
        // "char"
        (HashType::Char, "\"char\"", vec![0]),
        (HashType::Char, "\"char\"", vec![b'A']),
        (HashType::Char, "\"char\"", vec![0x7f]),
        // date / timestamp range limits
        (HashType::Date, "date", (-2_451_545i32).to_be_bytes().to_vec()),
        (HashType::Date, "date", (-2_451_546i32).to_be_bytes().to_vec()),
        (HashType::Date, "date", (2_145_031_948i32).to_be_bytes().to_vec()),
        (HashType::Date, "date", (2_145_031_949i32).to_be_bytes().to_vec()),
        (HashType::Date, "date", i32::MAX.to_be_bytes().to_vec()),
        (HashType::Date, "date", i32::MIN.to_be_bytes().to_vec()),
        (HashType::Timestamp, "timestamp", (-211_813_488_000_000_000i64).to_be_bytes().to_vec()),
        (HashType::Timestamp, "timestamp", (-211_813_488_000_000_001i64).to_be_bytes().to_vec()),
        (HashType::Timestamp, "timestamp", (9_223_371_331_199_999_999i64).to_be_bytes().to_vec()),
        (HashType::Timestamp, "timestamp", (9_223_371_331_200_000_000i64).to_be_bytes().to_vec()),
        (HashType::Timestamp, "timestamp", i64::MIN.to_be_bytes().to_vec()),
        (HashType::TimestampTz, "timestamptz", i64::MAX.to_be_bytes().to_vec()),
        (HashType::TimestampTz, "timestamptz", (-1i64).to_be_bytes().to_vec()),
        (HashType::TimestampTz, "timestamptz", (i64::MAX - 1).to_be_bytes().to_vec()),
        // ints and oid
        (HashType::Int2, "int2", vec![0x80, 0x00]),
        (HashType::Int4, "int4", vec![0xff, 0xff, 0xff, 0xfe]),
        (HashType::Int8, "int8", vec![0x80, 0, 0, 0, 0, 0, 0, 0]),
        (HashType::Int8, "int8", vec![0, 0, 0, 1]),
        (HashType::Oid, "oid", vec![0xff, 0xff, 0xff, 0xff]),
        // strings
        (HashType::Text, "text", "żółw".as_bytes().to_vec()),
        (HashType::Text, "text", vec![0xff, 0xfe]),
        (HashType::Text, "text", vec![b'a', 0, b'b']),
        (HashType::Bpchar, "bpchar", b"ab   ".to_vec()),
        (HashType::Bpchar, "bpchar", vec![0xc5]),
        (HashType::Bytea, "bytea", vec![0, 0xff, b'\\']),
        (HashType::Bytea, "bytea", vec![]),
        (HashType::Uuid, "uuid", (0u8..16).collect()),
        (HashType::Uuid, "uuid", (0u8..15).collect()),
    ];

    let mut failures = Vec::new();
    let (mut both_ok, mut both_err) = (0, 0);
    for (n, (ty, sql_type, bytes)) in cases.iter().enumerate() {
        // Server-side COPY reads it as the server's OS user: keep it in the
        // data directory, which that user can always reach.
        let path = pg.data_dir().join(format!("crafted_{n}.bin"));
        std::fs::write(&path, copy_file(bytes)).unwrap();
        let (hash_fn, _) = catalog_functions(&pg, sql_type, "cx");
        let server = pg.psql(&format!(
            "CREATE TEMP TABLE b (k {sql_type});
             COPY b FROM {} (FORMAT binary);
             SELECT {hash_fn}(k, {SEED_SQL}) FROM b;",
            quote(&path.display().to_string())
        ));
        let ours = hash_binary(*ty, bytes);
        match (&server, &ours) {
            (Ok(rows), Ok(h)) if rows.len() == 1 && rows[0].parse::<i64>().unwrap() as u64 == *h => both_ok += 1,
            (Err(_), Err(_)) => both_err += 1,
            _ => failures.push(format!("{sql_type} {bytes:02x?}: server {server:?}, ours {ours:?}")),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    println!("crafted binary: {both_ok} accepted with equal hashes, {both_err} rejected by both");
}

/// Bytes >= 0x80 of "char" hash per the server CPU's char signedness, so we
/// refuse them although this server accepts them.
#[test]
fn high_bit_char_is_refused_not_guessed() {
    let pg = server();
    for (text, bytes) in [("ż", vec![0xc5u8]), ("\\200", vec![0x80]), ("\\377", vec![0xff])] {
        pg.query(&format!("SELECT {}::\"char\"", quote(text)));
        assert!(hash_text(HashType::Char, text).is_err(), "{text:?}");
        assert!(hash_binary(HashType::Char, &bytes).is_err(), "{bytes:?}");
    }
}

// ---------------------------------------------------------------------------
// Text inputs we reject
// ---------------------------------------------------------------------------

/// Garbage the server rejects as well: we must return an error, not a hash.
#[test]
fn invalid_text_is_rejected_by_both() {
    let pg = server();
    let cases: &[(HashType, &str, &[&str])] = &[
        (HashType::Int2, "int2", &["", " ", "32768", "-32769", "1.5", "abc", "1_000", "0x10", "- 1", "1e3"]),
        (HashType::Int4, "int4", &["2147483648", "-2147483649", "12abc", "++1", "٣"]),
        (HashType::Int8, "int8", &["9223372036854775808", "-9223372036854775809", "1 2", ""]),
        (HashType::Oid, "oid", &["4294967296", "-2147483649", "0x10", "abc", "", "1.0"]),
        (HashType::Bool, "bool", &["", "o", "maybe", "2", "truee", "yess", "01", "t r"]),
        (
            HashType::Uuid,
            "uuid",
            &[
                "",
                "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a1",
                "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a111",
                " a0eebc999c0b4ef8bb6d6bb9bd380a11",
                "a0eebc99-9c0b4ef8-bb6d6bb9-bd380a11-",
                "{a0eebc999c0b4ef8bb6d6bb9bd380a11",
                "g0eebc999c0b4ef8bb6d6bb9bd380a11",
                "a0e-ebc999c0b4ef8bb6d6bb9bd380a11",
            ],
        ),
        (
            HashType::Numeric,
            "numeric",
            &[
                "",
                ".",
                "-",
                "1..2",
                "1.2.3",
                "1e",
                "1e+",
                "1_000",
                "0x10",
                "abc",
                "nanx",
                "infinit",
                "1 2",
                "--1",
                "1e-16384",
                "1e131072",
                "0e-20000",
                "1e9999999999",
            ],
        ),
        (HashType::Date, "date", &["2000-02-30", "1900-02-29", "2000-13-01", "2000-00-10", "0000-01-01", "2000-01-01x", "+infinity", ""]),
        (HashType::Timestamp, "timestamp", &["2000-01-01 12", "2000-01-01 12:00:00+16", "2000-01-01 25:00:00", "2000-01-01 12:60:00", "garbage"]),
        (HashType::TimestampTz, "timestamptz", &["2000-01-01 12:00:00+16", "2000-02-30 00:00:00+00", "x"]),
        (HashType::Bytea, "bytea", &["\\x4", "\\x4 1", "\\xzz", "\\", "\\400", "abc\\", "\\X41", "\\x41\x0b42"]),
    ];
    let checked = assert_refused_locally(&pg, cases, false);
    println!("invalid text: {checked} inputs rejected by both");
}

/// Forms the server accepts but whose meaning we do not reproduce (they depend
/// on session settings or need the server's rounding): we must refuse them so
/// the caller falls back to the server.
#[test]
fn unsupported_but_valid_text_falls_back() {
    let pg = server();
    let cases: &[(HashType, &str, &[&str])] = &[
        (HashType::Numeric, "numeric", &["1e 5", "1e\t5"]),
        (HashType::Date, "date", &["01/02/2000", "Jan 8 1999", "1999-Jan-08", "today", "20000101", "2000-01-01 BC", "12000-01-01", "02000-01-01"]),
        (
            HashType::Timestamp,
            "timestamp",
            &[
                "2000-01-01 24:00:00",
                "2000-01-01 23:59:60",
                "2000-01-01 12:00:00.1234567",
                "2000-01-01 12:00:00 PST",
                "now",
                "2000-01-01 12:00:00+530",
                "January 8 04:05:06 1999",
            ],
        ),
        (
            HashType::TimestampTz,
            "timestamptz",
            &["2000-01-01 12:00:00", "2000-01-01", "2000-01-01 12:00:00 UTC", "2000-01-01 12:00:00 America/New_York", "2000-01-01 12:00:00 EST"],
        ),
    ];
    let checked = assert_refused_locally(&pg, cases, true);
    println!("fallback text: {checked} server-valid inputs refused locally");
}

/// Checks that `hash_text` refuses every input, and that the server accepts
/// (`server_accepts`) or rejects each one too, so the lists stay honest.
/// Returns how many inputs were checked.
fn assert_refused_locally(pg: &Lease, cases: &[(HashType, &str, &[&str])], server_accepts: bool) -> usize {
    let mut failures = Vec::new();
    let mut checked = 0;
    for (ty, sql_type, inputs) in cases {
        for input in *inputs {
            if hash_text(*ty, input).is_ok() {
                failures.push(format!("{sql_type} {input:?}: we returned a hash"));
            }
            match pg.psql(&format!("SELECT {}::{sql_type}", quote(input))) {
                Ok(_) if !server_accepts => failures.push(format!("{sql_type} {input:?}: server accepted it (fix the test list)")),
                Err(e) if server_accepts => failures.push(format!("{sql_type} {input:?}: server rejected it (fix the test list): {e}")),
                _ => {}
            }
            checked += 1;
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    checked
}
