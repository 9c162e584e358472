//! COPY through the coordinator into and out of distributed and reference
//! tables: row-exact round trips in every format checked against a plain
//! PostgreSQL fed the same bytes, rows landing on the shards the hash
//! predicts, bad rows and a stopped worker leaving nothing behind, and psql's
//! \copy.

mod common;
use bytes::Bytes;
use common::{error_text, sqlstate, text_rows, PlainPostgres, TestCluster};
use futures::{SinkExt, TryStreamExt};
use tokio_postgres::Client;

const SHARDS: u32 = 8;

const TABLE: &str = "CREATE TABLE items (id int PRIMARY KEY, name text, note varchar(2000000), qty int)";

/// Values that stress the formats: delimiters, quotes, line ends, backslashes,
/// the end-of-data marker, multibyte text, empty strings and NULLs.
fn names() -> Vec<Option<String>> {
    vec![
        Some("plain".into()),
        Some(String::new()),
        None,
        Some("tab\there".into()),
        Some("comma, and; semicolon".into()),
        Some("line\nbreak".into()),
        Some("crlf\r\nend".into()),
        Some("back\\slash \\N \\.".into()),
        Some("\\.".into()),
        Some("\"quoted\" and 'single'".into()),
        Some("Grüße, 日本語, émoji 🎉".into()),
        Some("  spaces  ".into()),
        Some("NULL".into()),
    ]
}

/// The row that holds a value of about a megabyte.
const LONG_ROW: i32 = 1234;

struct Item {
    id: i32,
    name: Option<String>,
    note: Option<String>,
    qty: Option<i32>,
}

fn items(n: i32) -> Vec<Item> {
    let names = names();
    (1..=n)
        .map(|id| Item {
            id,
            name: if id == LONG_ROW { Some("é".repeat(300_000) + &"x".repeat(400_000)) } else { names[id as usize % names.len()].clone() },
            note: names[(id as usize * 7) % names.len()].clone().map(|s| s.chars().take(50).collect()),
            qty: (id % 5 != 0).then_some(id * 3 - 1000),
        })
        .collect()
}

fn text_value(v: &Option<String>) -> String {
    match v {
        None => "\\N".into(),
        Some(s) => s.replace('\\', "\\\\").replace('\n', "\\n").replace('\r', "\\r").replace('\t', "\\t"),
    }
}

/// PostgreSQL's own text format for the rows.
fn as_text(items: &[Item]) -> String {
    items
        .iter()
        .map(|r| format!("{}\t{}\t{}\t{}\n", r.id, text_value(&r.name), text_value(&r.note), text_value(&r.qty.map(|q| q.to_string()))))
        .collect()
}

/// CSV with the given delimiter and NULL marker (quote `"`), quoted as
/// PostgreSQL quotes: what holds a delimiter, quote or line end, and what
/// would read as NULL.
fn as_csv(items: &[Item], delimiter: char, null: &str, header: bool) -> String {
    let field = |v: &Option<String>| match v {
        None => null.to_string(),
        Some(s) if s == null || s.contains([delimiter, '"', '\n', '\r']) => format!("\"{}\"", s.replace('"', "\"\"")),
        Some(s) => s.clone(),
    };
    let mut out = if header { format!("id{delimiter}name{delimiter}note{delimiter}qty\n") } else { String::new() };
    for r in items {
        let d = delimiter;
        out.push_str(&format!("{}{d}{}{d}{}{d}{}\n", r.id, field(&r.name), field(&r.note), field(&r.qty.map(|q| q.to_string()))));
    }
    out
}

/// Sends `data` in pieces of odd sizes, so rows straddle CopyData messages.
async fn copy_in(c: &Client, sql: &str, data: &[u8]) -> Result<u64, tokio_postgres::Error> {
    let sink = c.copy_in(sql).await?;
    let mut sink = Box::pin(sink);
    for piece in data.chunks(7919) {
        sink.send(Bytes::copy_from_slice(piece)).await?;
    }
    sink.as_mut().finish().await
}

async fn copy_out(c: &Client, sql: &str) -> Vec<u8> {
    let stream = c.copy_out(sql).await.unwrap_or_else(|e| panic!("{sql}: {e}"));
    let chunks: Vec<Bytes> = stream.try_collect().await.unwrap();
    chunks.concat()
}

fn sorted_lines(data: &[u8]) -> Vec<String> {
    let mut lines: Vec<String> = String::from_utf8(data.to_vec()).unwrap().lines().map(str::to_string).collect();
    lines.sort();
    lines
}

/// Rows on each shard of `table`, counted on the workers, by shard index.
async fn rows_per_shard(c: &Client, table: &str) -> Vec<i64> {
    let shards = c
        .query(
            "SELECT s.shardid, n.nodeport FROM pg_dist_shard s JOIN pg_dist_placement p USING (shardid) JOIN pg_dist_node n ON n.groupid = p.groupid
             WHERE s.logicalrelid = $1::text::regclass ORDER BY s.shardindex",
            &[&table],
        )
        .await
        .unwrap();
    let mut counts = Vec::new();
    for shard in shards {
        let (id, port): (i64, i32) = (shard.get(0), shard.get(1));
        let worker = common::connect(port as u16).await;
        let n: i64 = worker.query_one(&format!("SELECT count(*) FROM {table}_{id}"), &[]).await.unwrap().get(0);
        counts.push(n);
    }
    assert_eq!(counts.len(), SHARDS as usize);
    counts
}

fn predicted_per_shard(ids: impl Iterator<Item = i32>) -> Vec<i64> {
    let mut counts = vec![0i64; SHARDS as usize];
    for id in ids {
        counts[common::shard_of_int4(id, SHARDS)] += 1;
    }
    counts
}

async fn total(c: &Client) -> String {
    text_rows(c, "SELECT count(*) FROM items").await[0][0].clone().unwrap()
}

async fn distributed_items(c: &Client) {
    c.batch_execute(&format!("{TABLE}; SELECT create_distributed_table('items', 'id', shard_count => {SHARDS})")).await.unwrap();
}

#[tokio::test]
async fn round_trips_in_every_format() {
    let cluster = TestCluster::start(2);
    let plain = PlainPostgres::start();
    let (c, p) = (cluster.connect().await, plain.connect().await);
    distributed_items(&c).await;
    p.batch_execute(TABLE).await.unwrap();
    let rows = items(3000);
    let ordered = "COPY (SELECT * FROM items ORDER BY id) TO STDOUT";

    // Text: what comes out is what went in, on the shards the hash predicts.
    let text = as_text(&rows);
    assert_eq!(copy_in(&c, "COPY items FROM STDIN", text.as_bytes()).await.unwrap(), 3000);
    copy_in(&p, "COPY items FROM STDIN", text.as_bytes()).await.unwrap();
    assert_eq!(sorted_lines(&copy_out(&c, "COPY items TO STDOUT").await), sorted_lines(text.as_bytes()));
    assert_eq!(copy_out(&c, ordered).await, copy_out(&p, ordered).await);
    assert_eq!(rows_per_shard(&c, "items").await, predicted_per_shard(1..=3000));

    // CSV with a header, both ways, against plain PostgreSQL's reading of the same bytes.
    for (options, delimiter, null) in [("FORMAT csv, HEADER true", ',', ""), ("FORMAT csv, HEADER match, DELIMITER ';', NULL 'NULL'", ';', "NULL")] {
        c.batch_execute("TRUNCATE items").await.unwrap();
        p.batch_execute("TRUNCATE items").await.unwrap();
        let csv = as_csv(&rows, delimiter, null, true);
        let sql = format!("COPY items FROM STDIN ({options})");
        assert_eq!(copy_in(&c, &sql, csv.as_bytes()).await.unwrap(), 3000, "{options}");
        copy_in(&p, &sql, csv.as_bytes()).await.unwrap();
        assert_eq!(copy_out(&c, ordered).await, copy_out(&p, ordered).await, "{options}");
        // HEADER MATCH is for input only.
        let out_options = options.replace("HEADER match", "HEADER true");
        let out_sql = format!("COPY (SELECT * FROM items ORDER BY id) TO STDOUT ({out_options})");
        assert_eq!(copy_out(&c, &out_sql).await, csv.as_bytes(), "{options}: out as in");
        // A table's COPY TO is one file with one header, however many shards:
        // plain PostgreSQL reads it back.
        let table_out = copy_out(&c, &format!("COPY items TO STDOUT ({out_options})")).await;
        assert!(table_out.starts_with(csv.lines().next().unwrap().as_bytes()));
        p.batch_execute("TRUNCATE items").await.unwrap();
        assert_eq!(copy_in(&p, &sql, &table_out).await.unwrap(), 3000, "{options}");
        assert_eq!(copy_out(&c, ordered).await, copy_out(&p, ordered).await, "{options}");
        assert_eq!(rows_per_shard(&c, "items").await, predicted_per_shard(1..=3000), "{options}");
    }

    // Binary: plain PostgreSQL's binary output loads into Tessera and comes back the same.
    let binary = copy_out(&p, "COPY (SELECT * FROM items ORDER BY id) TO STDOUT (FORMAT binary)").await;
    c.batch_execute("TRUNCATE items").await.unwrap();
    assert_eq!(copy_in(&c, "COPY items FROM STDIN (FORMAT binary)", &binary).await.unwrap(), 3000);
    assert_eq!(copy_out(&c, "COPY (SELECT * FROM items ORDER BY id) TO STDOUT (FORMAT binary)").await, binary);
    // The table's own binary COPY TO is one valid file: plain PostgreSQL reads it back.
    let table_binary = copy_out(&c, "COPY items TO STDOUT (FORMAT binary)").await;
    p.batch_execute("TRUNCATE items").await.unwrap();
    assert_eq!(copy_in(&p, "COPY items FROM STDIN (FORMAT binary)", &table_binary).await.unwrap(), 3000);
    assert_eq!(copy_out(&p, ordered).await, copy_out(&c, ordered).await);
    assert_eq!(rows_per_shard(&c, "items").await, predicted_per_shard(1..=3000));

    // A column list, and the distribution column somewhere else than first.
    c.batch_execute("CREATE TABLE pairs (v text, k bigint NOT NULL); SELECT create_distributed_table('pairs', 'k', shard_count => 8)").await.unwrap();
    let pairs: String = (1..=500).map(|k| format!("v{k}\t{k}\n")).collect();
    assert_eq!(copy_in(&c, "COPY pairs (v, k) FROM STDIN", pairs.as_bytes()).await.unwrap(), 500);
    assert_eq!(text_rows(&c, "SELECT count(*), sum(k) FROM pairs WHERE v = 'v' || k").await, vec![vec![Some("500".into()), Some("125250".into())]]);

    // A reference table gets every row on every placement.
    c.batch_execute("CREATE TABLE colors (name text PRIMARY KEY, hex text); SELECT create_reference_table('colors')").await.unwrap();
    assert_eq!(copy_in(&c, "COPY colors FROM STDIN (FORMAT csv)", b"red,#f00\ngreen,#0f0\nblue,#00f\n").await.unwrap(), 3);
    for port in &cluster.cluster.state.worker_ports {
        let w = common::connect(*port).await;
        let shard: String =
            w.query_one("SELECT relname::text FROM pg_class WHERE relname LIKE 'colors\\_%' AND relkind = 'r'", &[]).await.unwrap().get(0);
        assert_eq!(text_rows(&w, &format!("SELECT count(*) FROM {shard}")).await, vec![vec![Some("3".into())]]);
    }
    assert_eq!(sorted_lines(&copy_out(&c, "COPY colors TO STDOUT").await), vec!["blue\t#00f", "green\t#0f0", "red\t#f00"]);
    // COPY of a query joining distributed and reference tables goes through the general fallback.
    let joined = copy_out(
        &c,
        "COPY (SELECT c.name, count(*) FROM colors c JOIN pairs p ON p.k % 3 = length(c.name) % 3 GROUP BY c.name ORDER BY 1) TO STDOUT",
    )
    .await;
    assert_eq!(String::from_utf8(joined).unwrap(), "blue\t167\ngreen\t167\nred\t166\n");
}

#[tokio::test]
async fn bad_rows_fail_the_whole_copy() {
    let cluster = TestCluster::start(2);
    let c = cluster.connect().await;
    distributed_items(&c).await;

    // A malformed value in the middle of 100,000 rows, found by a worker.
    let mut data: String = (1..=100_000).map(|i| format!("{i}\tname {i}\t\\N\t{i}\n")).collect();
    data = data.replace("\n50000\tname 50000\t\\N\t50000\n", "\n50000\tname 50000\t\\N\tfifty thousand\n");
    let err = copy_in(&c, "COPY items FROM STDIN", data.as_bytes()).await.unwrap_err();
    assert_eq!(sqlstate(&err), "22P02", "{}", error_text(&err));
    assert!(error_text(&err).contains("COPY items, line 50000, column qty: \"fifty thousand\""), "{}", error_text(&err));
    assert_eq!(total(&c).await, "0");

    // A constraint violation on a worker: the duplicate's line is named.
    let dup: String = (1..=20_000).chain([7]).map(|i| format!("{i}\tn\t\\N\t1\n")).collect();
    let err = copy_in(&c, "COPY items FROM STDIN", dup.as_bytes()).await.unwrap_err();
    assert_eq!(sqlstate(&err), "23505", "{}", error_text(&err));
    assert!(error_text(&err).contains("COPY items, line 20001"), "{}", error_text(&err));
    assert_eq!(total(&c).await, "0");

    // Rows the coordinator itself cannot route: a NULL key, a key the type rejects, a short row.
    for (input, code, line) in [
        ("1\ta\t\\N\t1\n\\N\tb\t\\N\t2\n", "23502", "line 2"),
        ("1\ta\t\\N\t1\n2\tb\t\\N\t2\nx3\tc\t\\N\t3\n", "22P02", "line 3, column id: \"x3\""),
        ("1\ta\t\\N\t1\n\n", "22P02", "line 2"),
    ] {
        let err = copy_in(&c, "COPY items FROM STDIN", input.as_bytes()).await.unwrap_err();
        assert_eq!(sqlstate(&err), code, "{input:?}: {}", error_text(&err));
        assert!(error_text(&err).contains(line), "{input:?}: {}", error_text(&err));
        assert_eq!(total(&c).await, "0");
    }
    // In CSV, quoted line ends count as lines, as PostgreSQL counts them.
    let csv = "1,a,,1\n2,\"b\nc\",,2\n3,d,,x\n";
    let err = copy_in(&c, "COPY items FROM STDIN (FORMAT csv)", csv.as_bytes()).await.unwrap_err();
    assert!(error_text(&err).contains("COPY items, line 4, column qty: \"x\""), "{}", error_text(&err));

    // A column list without the distribution column; a file on the server.
    let err = c.simple_query("COPY items (name) FROM STDIN").await.unwrap_err();
    assert_eq!(sqlstate(&err), "23502", "{}", error_text(&err));
    let err = c.simple_query("COPY items (nosuch) FROM STDIN").await.unwrap_err();
    assert_eq!(sqlstate(&err), "42703", "PostgreSQL's own complaint comes first: {}", error_text(&err));
    let err = c.simple_query("COPY items FROM '/tmp/items.csv'").await.unwrap_err();
    assert_eq!(sqlstate(&err), "0A000");
    assert!(error_text(&err).contains("\\copy"), "{}", error_text(&err));

    // Inside a transaction block: rolled back with it, kept with COMMIT (on both workers).
    let good: String = (1..=1000).map(|i| format!("{i}\tn\t\\N\t{i}\n")).collect();
    c.batch_execute("BEGIN").await.unwrap();
    assert_eq!(copy_in(&c, "COPY items FROM STDIN", good.as_bytes()).await.unwrap(), 1000);
    assert_eq!(total(&c).await, "1000", "the block sees its own rows");
    c.batch_execute("ROLLBACK").await.unwrap();
    assert_eq!(total(&c).await, "0");
    c.batch_execute("BEGIN").await.unwrap();
    copy_in(&c, "COPY items FROM STDIN", good.as_bytes()).await.unwrap();
    c.batch_execute("COMMIT").await.unwrap();
    assert_eq!(total(&c).await, "1000");
    // A failed COPY aborts the block, as in PostgreSQL.
    c.batch_execute("BEGIN").await.unwrap();
    copy_in(&c, "COPY items FROM STDIN", b"5000\tn\t\\N\t1\n5001\tn\t\\N\tbad\n").await.unwrap_err();
    assert_eq!(sqlstate(&c.simple_query("SELECT 1").await.unwrap_err()), "25P02");
    c.batch_execute("ROLLBACK").await.unwrap();
    assert_eq!(total(&c).await, "1000");
    assert_eq!(cluster.prepared_on_workers().await, 0);
}

#[tokio::test]
async fn a_worker_stopped_mid_copy_leaves_nothing() {
    let cluster = TestCluster::start(2);
    let c = cluster.connect().await;
    distributed_items(&c).await;
    let port = cluster.cluster.state.worker_ports[1];
    let sink = c.copy_in("COPY items FROM STDIN").await.unwrap();
    let mut sink = Box::pin(sink);
    let chunk = |from: i32| Bytes::from((from..from + 50_000).map(|i| format!("{i}\tname {i}\t\\N\t{i}\n")).collect::<String>());
    sink.send(chunk(1)).await.unwrap();
    // Let the first rows reach both workers before one of them goes away.
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    cluster.kill_worker(1);
    let mut failed = None;
    for from in [50_001, 100_001, 150_001] {
        if let Err(e) = sink.send(chunk(from)).await {
            failed = Some(e);
            break;
        }
    }
    let err = match failed {
        Some(e) => e,
        None => sink.as_mut().finish().await.unwrap_err(),
    };
    assert!(sqlstate(&err).starts_with("08"), "{}", error_text(&err));
    assert!(error_text(&err).contains(&format!("127.0.0.1:{port}")), "the error names the node: {}", error_text(&err));
    cluster.start_worker(1);
    // The same session goes on, and nothing of the COPY remains anywhere.
    assert_eq!(text_rows(&c, "SELECT count(*) FROM items").await, vec![vec![Some("0".into())]]);
    assert_eq!(cluster.prepared_on_workers().await, 0);
    assert_eq!(copy_in(&c, "COPY items FROM STDIN", b"1\ta\t\\N\t1\n2\tb\t\\N\t2\n").await.unwrap(), 2);
}

#[tokio::test]
async fn psql_backslash_copy_in_and_out() {
    let cluster = TestCluster::start(2);
    let c = cluster.connect().await;
    distributed_items(&c).await;
    let rows = items(500);
    let csv = as_csv(&rows, ',', "", true);
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("items.csv");
    std::fs::write(&input, &csv).unwrap();
    let (ok, out, err) = cluster.psql(&format!("\\copy items FROM '{}' (FORMAT csv, HEADER)", input.display()));
    assert!(ok, "{err}");
    assert_eq!(out.trim(), "COPY 500");
    let output = dir.path().join("out.csv");
    let (ok, _, err) = cluster.psql(&format!("\\copy (SELECT * FROM items ORDER BY id) TO '{}' (FORMAT csv, HEADER)", output.display()));
    assert!(ok, "{err}");
    assert_eq!(std::fs::read_to_string(&output).unwrap(), csv);
    let (ok, _, err) = cluster.psql(&format!("\\copy items TO '{}' (FORMAT csv)", output.display()));
    assert!(ok, "{err}");
    let mut expected = sorted_lines(as_csv(&rows, ',', "", false).as_bytes());
    expected.sort();
    assert_eq!(sorted_lines(&std::fs::read(&output).unwrap()), expected);
    assert_eq!(rows_per_shard(&c, "items").await, predicted_per_shard(1..=500));
}

/// COPY with a column list that leaves out serial and identity columns (a
/// loader that lets the database number the rows): the coordinator draws
/// their values from the table's sequences, the distribution column's too,
/// and the rows match what plain PostgreSQL stores for the same input.
#[tokio::test]
async fn copy_fills_serial_and_identity_columns() {
    let cluster = TestCluster::start(2);
    let plain = PlainPostgres::start();
    let (c, p) = (cluster.connect().await, plain.connect().await);
    let schema = "CREATE SEQUENCE ticket_codes;
        CREATE TABLE tickets (id bigint GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY, line bigserial,
                              code text DEFAULT E'T\\t;' || nextval('ticket_codes'), subject text)";
    c.batch_execute(&format!("{schema}; SELECT create_distributed_table('tickets', 'id')")).await.unwrap();
    p.batch_execute(schema).await.unwrap();
    let text: String = (1..=2500).map(|i| format!("subject {i}\n")).collect();
    let csv: String = (1..=700).map(|i| format!("\"csv, {i}\"\n")).collect();
    for client in [&c, &p] {
        assert_eq!(copy_in(client, "COPY tickets (subject) FROM STDIN", text.as_bytes()).await.unwrap(), 2500);
        assert_eq!(copy_in(client, "COPY tickets (subject) FROM STDIN (FORMAT csv, DELIMITER ';')", csv.as_bytes()).await.unwrap(), 700);
        // Explicit values still win; the other columns are still filled.
        assert_eq!(copy_in(client, "COPY tickets (id, subject) FROM STDIN", b"900000\texplicit\n").await.unwrap(), 1);
    }
    let ordered = "COPY (SELECT * FROM tickets ORDER BY id) TO STDOUT";
    assert_eq!(copy_out(&c, ordered).await, copy_out(&p, ordered).await);
    // The rows sit on the shards their generated keys hash to: a lookup by
    // key (routed to that one shard) finds each of them.
    for id in [1i64, 2, 77, 1234, 2500, 2501, 3200, 900000] {
        let found: i64 = c.query_one("SELECT count(*) FROM tickets WHERE id = $1", &[&id]).await.unwrap().get(0);
        assert_eq!(found, 1, "row {id}");
    }

    let binary = copy_out(&c, "COPY (SELECT 'b'::text) TO STDOUT (FORMAT binary)").await;
    let err = copy_in(&c, "COPY tickets (subject) FROM STDIN (FORMAT binary)", &binary).await.unwrap_err();
    assert_eq!(sqlstate(&err), "0A000", "{}", error_text(&err));
    assert_eq!(text_rows(&c, "SELECT count(*) FROM tickets").await, vec![vec![Some("3201".into())]]);
}
