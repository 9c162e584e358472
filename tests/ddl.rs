//! Distributed DDL, seen through the wire protocol: statements on distributed
//! and reference tables must reach the shell table in the coordinator database
//! and every shard placement on every worker, all or nothing.
//!
//! Each test starts its own cluster (2 workers, 4 shards per distributed table),
//! runs DDL through the coordinator and then checks the real state: the
//! coordinator database and the workers are queried directly (pg_indexes,
//! information_schema.columns, pg_constraint, pg_stat_user_tables …), and the
//! catalog (citus_shards, pg_dist_*) through the coordinator.

mod common;

use common::{sqlstate, TestCluster};
use std::collections::BTreeSet;
use tokio_postgres::error::DbError;
use tokio_postgres::{Client, SimpleQueryMessage};

const SHARD_COUNT: usize = 4;

// ---------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------

/// An error with everything a human needs to see in a failed assertion.
fn describe(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(d) => format!(
            "{} {}{}{}",
            d.code().code(),
            d.message(),
            d.detail().map(|x| format!(" (detail: {x})")).unwrap_or_default(),
            d.where_().map(|x| format!(" (context: {x})")).unwrap_or_default()
        ),
        None => format!("not a server error: {e}"),
    }
}

async fn exec(c: &Client, sql: &str) {
    if let Err(e) = c.batch_execute(sql).await {
        panic!("{sql}: {}", describe(&e));
    }
}

/// Runs `sql`, which must fail; returns the error.
async fn fails(c: &Client, sql: &str) -> tokio_postgres::Error {
    match c.batch_execute(sql).await {
        Ok(()) => panic!("{sql}: succeeded, but it must fail"),
        Err(e) => e,
    }
}

/// Runs `sql`, which must fail with SQLSTATE `code`; returns the server's error.
async fn fails_with(c: &Client, sql: &str, code: &str) -> DbError {
    let e = fails(c, sql).await;
    assert_eq!(sqlstate(&e), code, "{sql}: wrong error: {}", describe(&e));
    e.as_db_error().unwrap().clone()
}

/// Rows of a simple-protocol query as text (`common::text_rows`, with the
/// server's error in the panic message).
async fn rows(c: &Client, sql: &str) -> Vec<Vec<Option<String>>> {
    let messages = c.simple_query(sql).await.unwrap_or_else(|e| panic!("{sql}: {}", describe(&e)));
    messages
        .into_iter()
        .filter_map(|m| match m {
            SimpleQueryMessage::Row(r) => Some((0..r.len()).map(|i| r.get(i).map(str::to_string)).collect()),
            _ => None,
        })
        .collect()
}

/// The first column of the first row.
async fn value(c: &Client, sql: &str) -> Option<String> {
    let r = rows(c, sql).await;
    assert_eq!(r.len(), 1, "{sql}: expected one row, got {r:?}");
    r[0][0].clone()
}

async fn count(c: &Client, sql: &str) -> i64 {
    value(c, sql).await.unwrap_or_else(|| panic!("{sql}: NULL")).parse().unwrap()
}

/// The first column of every row, NULLs as "NULL".
async fn column(c: &Client, sql: &str) -> Vec<String> {
    rows(c, sql).await.into_iter().map(|r| r[0].clone().unwrap_or_else(|| "NULL".into())).collect()
}

/// One shard placement: shard `shard` of some table lives on worker `worker` (0-based).
#[derive(Debug, Clone, Copy)]
struct Placement {
    shard: i64,
    worker: usize,
}

impl Placement {
    /// The name of the shard's table on the worker: `<table>_<shardid>`.
    fn rel(&self, table: &str) -> String {
        format!("{table}_{}", self.shard)
    }
}

struct Fixture {
    cluster: TestCluster,
    /// A coordinator session with `citus.shard_count = 4`.
    client: Client,
    /// Direct connections to the workers.
    workers: Vec<Client>,
}

impl Fixture {
    async fn start() -> Fixture {
        let cluster = TestCluster::start(2);
        let client = cluster.connect().await;
        exec(&client, "SET citus.shard_count = 4").await;
        let workers = vec![cluster.connect_worker(0).await, cluster.connect_worker(1).await];
        Fixture { cluster, client, workers }
    }

    fn worker_port(&self, i: usize) -> u16 {
        self.cluster.cluster.state.worker_ports[i]
    }

    /// Every placement of `table`, from citus_shards through the coordinator.
    async fn placements(&self, table: &str) -> Vec<Placement> {
        let ports = &self.cluster.cluster.state.worker_ports;
        rows(&self.client, &format!("SELECT shardid, nodeport FROM citus_shards WHERE table_name = '{table}'::regclass ORDER BY shardid, nodeport"))
            .await
            .into_iter()
            .map(|r| {
                let port: u16 = r[1].as_deref().unwrap().parse().unwrap();
                Placement {
                    shard: r[0].as_deref().unwrap().parse().unwrap(),
                    worker: ports.iter().position(|p| *p == port).unwrap_or_else(|| panic!("{table}: placement on unknown port {port}")),
                }
            })
            .collect()
    }

    /// Creates a table through the coordinator and distributes it by `column`;
    /// returns its placements (4 shards, spread over both workers).
    async fn distributed(&self, table: &str, definition: &str, dist_column: &str) -> Vec<Placement> {
        exec(&self.client, &format!("CREATE TABLE {table} ({definition})")).await;
        exec(&self.client, &format!("SELECT create_distributed_table('{table}', '{dist_column}')")).await;
        let ps = self.placements(table).await;
        assert_eq!(ps.len(), SHARD_COUNT, "{table}: placements {ps:?}");
        let shards: BTreeSet<i64> = ps.iter().map(|p| p.shard).collect();
        assert_eq!(shards.len(), SHARD_COUNT, "{table}: one placement per shard expected: {ps:?}");
        assert_eq!(
            count(&self.client, &format!("SELECT count(*) FROM pg_dist_shard WHERE logicalrelid = '{table}'::regclass")).await,
            SHARD_COUNT as i64
        );
        let workers: BTreeSet<usize> = ps.iter().map(|p| p.worker).collect();
        assert_eq!(workers.len(), 2, "{table}: shards must be on both workers: {ps:?}");
        for p in &ps {
            assert!(exists(&self.workers[p.worker], &p.rel(table)).await, "{table}: shard {} missing on worker {}", p.shard, p.worker + 1);
        }
        ps
    }

    /// Creates a reference table through the coordinator; returns its placements
    /// (one shard, on both workers).
    async fn reference(&self, table: &str, definition: &str) -> Vec<Placement> {
        exec(&self.client, &format!("CREATE TABLE {table} ({definition})")).await;
        exec(&self.client, &format!("SELECT create_reference_table('{table}')")).await;
        let ps = self.placements(table).await;
        assert_eq!(ps.len(), 2, "{table}: placements {ps:?}");
        assert_eq!(ps[0].shard, ps[1].shard, "{table}: a reference table has one shard: {ps:?}");
        assert_ne!(ps[0].worker, ps[1].worker, "{table}: placements {ps:?}");
        ps
    }

    fn worker_for(&self, p: &Placement) -> &Client {
        &self.workers[p.worker]
    }
}

/// Does table `public.rel` exist on this node?
async fn exists(node: &Client, rel: &str) -> bool {
    value(node, &format!("SELECT to_regclass('public.{rel}') IS NOT NULL")).await.as_deref() == Some("t")
}

/// (index name, definition) of every index on `public.rel`.
async fn indexes(node: &Client, rel: &str) -> Vec<(String, String)> {
    rows(node, &format!("SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = 'public' AND tablename = '{rel}' ORDER BY indexname"))
        .await
        .into_iter()
        .map(|r| (r[0].clone().unwrap(), r[1].clone().unwrap()))
        .collect()
}

/// (name, default, data type) of every column of `public.rel`.
async fn columns(node: &Client, rel: &str) -> Vec<(String, Option<String>, String)> {
    rows(
        node,
        &format!("SELECT column_name, column_default, data_type FROM information_schema.columns WHERE table_schema = 'public' AND table_name = '{rel}' ORDER BY ordinal_position"),
    )
    .await
    .into_iter()
    .map(|r| (r[0].clone().unwrap(), r[1].clone(), r[2].clone().unwrap()))
    .collect()
}

async fn column_names(node: &Client, rel: &str) -> Vec<String> {
    columns(node, rel).await.into_iter().map(|c| c.0).collect()
}

/// (name, type) of every constraint of `public.rel` (type as in pg_constraint.contype).
async fn constraints(node: &Client, rel: &str) -> Vec<(String, String)> {
    rows(node, &format!("SELECT conname, contype FROM pg_constraint WHERE conrelid = to_regclass('public.{rel}') ORDER BY conname"))
        .await
        .into_iter()
        .map(|r| (r[0].clone().unwrap(), r[1].clone().unwrap()))
        .collect()
}

async fn row_count(node: &Client, rel: &str) -> i64 {
    count(node, &format!("SELECT count(*) FROM public.{rel}")).await
}

/// "VALUES (1, …), (2, …), …" for keys `keys`, the row built by `row`.
fn values(keys: impl IntoIterator<Item = i32>, row: impl Fn(i32) -> String) -> String {
    keys.into_iter().map(|k| format!("({})", row(k))).collect::<Vec<_>>().join(", ")
}

// ---------------------------------------------------------------------------
// 1. CREATE INDEX
// ---------------------------------------------------------------------------

#[tokio::test]
async fn create_index_reaches_every_shard() {
    let f = Fixture::start().await;
    let coordinator_db = f.cluster.connect_coordinator_db().await;
    let ps = f.distributed("items", "id int, category int, name text", "id").await;
    exec(&f.client, &format!("INSERT INTO items VALUES {}", values(1..=8, |k| format!("{k}, {}, 'n{k}'", k * 10)))).await;
    for p in &ps {
        assert_eq!(indexes(f.worker_for(p), &p.rel("items")).await, vec![], "shard {} starts without indexes", p.shard);
    }

    // A named index: every shard gets it, named <index>_<shardid>.
    exec(&f.client, "CREATE INDEX items_category_idx ON items (category)").await;
    let shell = indexes(&coordinator_db, "items").await;
    assert_eq!(shell.iter().map(|i| i.0.as_str()).collect::<Vec<_>>(), vec!["items_category_idx"], "shell table: {shell:?}");
    for p in &ps {
        let ix = indexes(f.worker_for(p), &p.rel("items")).await;
        assert_eq!(ix.len(), 1, "shard {} on worker {}: {ix:?}", p.shard, p.worker + 1);
        assert_eq!(ix[0].0, format!("items_category_idx_{}", p.shard), "shard {}: {ix:?}", p.shard);
        assert!(ix[0].1.contains(&format!("ON public.{} USING btree (category)", p.rel("items"))), "shard {}: {ix:?}", p.shard);
    }

    // An unnamed index: PostgreSQL picks the names, every shard still gets one.
    exec(&f.client, "CREATE INDEX ON items (name)").await;
    assert_eq!(indexes(&coordinator_db, "items").await.len(), 2);
    for p in &ps {
        let ix = indexes(f.worker_for(p), &p.rel("items")).await;
        assert_eq!(ix.len(), 2, "shard {} on worker {}: {ix:?}", p.shard, p.worker + 1);
        assert_eq!(ix.iter().filter(|i| i.1.ends_with("USING btree (name)")).count(), 1, "shard {}: {ix:?}", p.shard);
    }
    // The data is untouched and still reachable.
    assert_eq!(count(&f.client, "SELECT count(*) FROM items").await, 8);
    assert_eq!(value(&f.client, "SELECT name FROM items WHERE id = 3").await.as_deref(), Some("n3"));

    // A reference table: its one shard gets the index on both workers.
    let rs = f.reference("kinds", "id int, label text").await;
    exec(&f.client, "INSERT INTO kinds VALUES (1, 'a'), (2, 'b')").await;
    exec(&f.client, "CREATE INDEX kinds_label_idx ON kinds (label)").await;
    assert_eq!(indexes(&coordinator_db, "kinds").await.len(), 1);
    for p in &rs {
        let ix = indexes(f.worker_for(p), &p.rel("kinds")).await;
        assert_eq!(
            ix.iter().map(|i| i.0.clone()).collect::<Vec<_>>(),
            vec![format!("kinds_label_idx_{}", p.shard)],
            "worker {}: {ix:?}",
            p.worker + 1
        );
    }
}

#[tokio::test]
async fn drop_index_reaches_every_shard() {
    let f = Fixture::start().await;
    let coordinator_db = f.cluster.connect_coordinator_db().await;
    let ps = f.distributed("items", "id int, category int", "id").await;
    exec(&f.client, "CREATE INDEX items_category_idx ON items (category)").await;
    for p in &ps {
        assert_eq!(indexes(f.worker_for(p), &p.rel("items")).await.len(), 1, "shard {}", p.shard);
    }

    exec(&f.client, "DROP INDEX items_category_idx").await;
    assert_eq!(indexes(&coordinator_db, "items").await, vec![], "shell table");
    for p in &ps {
        let ix = indexes(f.worker_for(p), &p.rel("items")).await;
        assert_eq!(ix, vec![], "DROP INDEX left the index on shard {} (worker {})", p.shard, p.worker + 1);
    }
    // …so that the same name can be used again.
    exec(&f.client, "CREATE INDEX items_category_idx ON items (category)").await;
}

/// The index names on each placement of `table`.
async fn shard_indexes(f: &Fixture, table: &str, ps: &[Placement]) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    for p in ps {
        out.push(indexes(f.worker_for(p), &p.rel(table)).await.into_iter().map(|i| i.0).collect());
    }
    out
}

#[tokio::test]
async fn drop_index_variants() {
    let f = Fixture::start().await;
    let coordinator_db = f.cluster.connect_coordinator_db().await;
    let ps = f.distributed("items", "id int, kind int", "id").await;
    let rs = f.reference("kinds", "id int, label text").await;
    exec(&f.client, "CREATE TABLE notes (id int, body text)").await;
    exec(&f.client, "CREATE INDEX items_kind_idx ON items (kind)").await;
    exec(&f.client, "CREATE INDEX kinds_label_idx ON kinds (label)").await;
    exec(&f.client, "CREATE INDEX notes_body_idx ON notes (body)").await;
    let named = |index: &str, ps: &[Placement]| ps.iter().map(|p| vec![format!("{index}_{}", p.shard)]).collect::<Vec<_>>();

    // Rolled back by the client: every copy is still there.
    exec(&f.client, "BEGIN").await;
    exec(&f.client, "DROP INDEX items_kind_idx").await;
    exec(&f.client, "ROLLBACK").await;
    assert_eq!(indexes(&coordinator_db, "items").await.len(), 1, "shell table");
    assert_eq!(shard_indexes(&f, "items", &ps).await, named("items_kind_idx", &ps));

    // CONCURRENTLY: refused inside a block, as PostgreSQL refuses it; outside
    // one, the shell's index goes, then each shard's copy on its own.
    exec(&f.client, "BEGIN").await;
    fails_with(&f.client, "DROP INDEX CONCURRENTLY items_kind_idx", "25001").await;
    exec(&f.client, "ROLLBACK").await;
    assert_eq!(shard_indexes(&f, "items", &ps).await, named("items_kind_idx", &ps));
    exec(&f.client, "DROP INDEX CONCURRENTLY items_kind_idx").await;
    assert_eq!(indexes(&coordinator_db, "items").await, vec![], "shell table");
    assert_eq!(shard_indexes(&f, "items", &ps).await, vec![Vec::<String>::new(); ps.len()]);
    exec(&f.client, "CREATE INDEX items_kind_idx ON items (kind)").await;
    // A missing index is PostgreSQL's error.
    fails_with(&f.client, "DROP INDEX no_such_idx", "42704").await;

    // One statement: a distributed, a reference and a local table's index (one
    // schema-qualified) and a missing one, IF EXISTS.
    exec(&f.client, "DROP INDEX IF EXISTS public.items_kind_idx, kinds_label_idx, notes_body_idx, no_such_idx").await;
    for table in ["items", "kinds", "notes"] {
        assert_eq!(indexes(&coordinator_db, table).await, vec![], "shell table {table}");
    }
    assert_eq!(shard_indexes(&f, "items", &ps).await, vec![Vec::<String>::new(); ps.len()]);
    assert_eq!(shard_indexes(&f, "kinds", &rs).await, vec![Vec::<String>::new(); rs.len()]);

    // CASCADE reaches the shards too: the unique index a foreign key relies on
    // goes with the key, on the shell table and on every shard.
    exec(&f.client, "CREATE UNIQUE INDEX kinds_id_key ON kinds (id)").await;
    exec(&f.client, "ALTER TABLE items ADD CONSTRAINT items_kind_fkey FOREIGN KEY (kind) REFERENCES kinds (id)").await;
    fails_with(&f.client, "DROP INDEX kinds_id_key", "2BP01").await;
    exec(&f.client, "DROP INDEX kinds_id_key CASCADE").await;
    assert_eq!(constraints(&coordinator_db, "items").await, vec![], "shell table");
    for p in &ps {
        assert_eq!(constraints(f.worker_for(p), &p.rel("items")).await, vec![], "shard {}", p.shard);
    }
    assert_eq!(shard_indexes(&f, "kinds", &rs).await, vec![Vec::<String>::new(); rs.len()]);

    // A local table's index is the coordinator database's alone, CONCURRENTLY too.
    exec(&f.client, "CREATE INDEX notes_id_idx ON notes (id)").await;
    exec(&f.client, "DROP INDEX CONCURRENTLY notes_id_idx").await;
    assert_eq!(indexes(&coordinator_db, "notes").await, vec![]);
}

// ---------------------------------------------------------------------------
// 2. Unique indexes and constraints must include the distribution column
// ---------------------------------------------------------------------------

#[tokio::test]
async fn unique_constraints_without_the_distribution_column_are_refused() {
    let f = Fixture::start().await;
    let coordinator_db = f.cluster.connect_coordinator_db().await;
    let ps = f.distributed("accounts", "id int, email text, n int", "id").await;
    exec(&f.client, "INSERT INTO accounts VALUES (1, 'a@x', 1), (2, 'a@x', 1)").await;

    for sql in [
        "CREATE UNIQUE INDEX accounts_email_idx ON accounts (email)",
        "CREATE UNIQUE INDEX accounts_email_n_idx ON accounts (email, n)",
        "CREATE UNIQUE INDEX accounts_email_incl_idx ON accounts (email) INCLUDE (id)",
        "ALTER TABLE accounts ADD PRIMARY KEY (email)",
        "ALTER TABLE accounts ADD CONSTRAINT accounts_email_key UNIQUE (email)",
        "ALTER TABLE accounts ADD CONSTRAINT accounts_email_n_key UNIQUE (email, n)",
    ] {
        let e = fails_with(&f.client, sql, "0A000").await;
        assert!(e.message().to_lowercase().contains("partition column"), "{sql}: the message must name the partition column: {}", e.message());
    }
    // Nothing was created anywhere, and the session is fine.
    assert_eq!(indexes(&coordinator_db, "accounts").await, vec![], "shell table");
    assert_eq!(constraints(&coordinator_db, "accounts").await, vec![], "shell table");
    for p in &ps {
        assert_eq!(indexes(f.worker_for(p), &p.rel("accounts")).await, vec![], "shard {}", p.shard);
        assert_eq!(constraints(f.worker_for(p), &p.rel("accounts")).await, vec![], "shard {}", p.shard);
    }
    assert_eq!(value(&f.client, "SELECT 1").await.as_deref(), Some("1"));
    assert_eq!(count(&f.client, "SELECT count(*) FROM accounts WHERE email = 'a@x'").await, 2);
}

#[tokio::test]
async fn unique_constraints_with_the_distribution_column_are_enforced() {
    let f = Fixture::start().await;
    let coordinator_db = f.cluster.connect_coordinator_db().await;
    let ps = f.distributed("accounts", "id int, email text, n int", "id").await;

    // Including the distribution column (anywhere in the key) is fine.
    exec(&f.client, "CREATE UNIQUE INDEX accounts_email_id_idx ON accounts (email, id)").await;
    exec(&f.client, "ALTER TABLE accounts ADD PRIMARY KEY (id)").await;
    exec(&f.client, "ALTER TABLE accounts ADD CONSTRAINT accounts_n_id_key UNIQUE (n, id)").await;
    let mut shell: Vec<String> = constraints(&coordinator_db, "accounts").await.into_iter().map(|c| c.1).collect();
    shell.sort();
    assert_eq!(shell, vec!["p", "u"], "shell table constraints");
    for p in &ps {
        let w = f.worker_for(p);
        let rel = p.rel("accounts");
        let ix = indexes(w, &rel).await;
        assert_eq!(ix.len(), 3, "shard {}: {ix:?}", p.shard);
        assert!(ix.iter().all(|i| i.1.starts_with("CREATE UNIQUE INDEX")), "shard {}: {ix:?}", p.shard);
        assert!(ix.iter().any(|i| i.0 == format!("accounts_email_id_idx_{}", p.shard)), "shard {}: {ix:?}", p.shard);
        let cons = constraints(w, &rel).await;
        assert_eq!(cons.iter().filter(|c| c.1 == "p").count(), 1, "shard {}: {cons:?}", p.shard);
        assert!(cons.contains(&(format!("accounts_n_id_key_{}", p.shard), "u".into())), "shard {}: {cons:?}", p.shard);
    }

    // The shards enforce them: duplicates fail with 23505, through both protocols.
    exec(&f.client, "INSERT INTO accounts VALUES (1, 'a@x', 1), (2, 'b@x', 2), (3, 'c@x', 3), (4, 'd@x', 4)").await;
    fails_with(&f.client, "INSERT INTO accounts VALUES (1, 'other@x', 10)", "23505").await;
    fails_with(&f.client, "INSERT INTO accounts VALUES (5, 'e@x', 5), (3, 'c@x', 3)", "23505").await;
    let e = f
        .client
        .execute("INSERT INTO accounts VALUES ($1, $2, $3)", &[&2i32, &"again@x", &20i32])
        .await
        .expect_err("duplicate id through the extended protocol");
    assert_eq!(sqlstate(&e), "23505", "{}", describe(&e));
    // Only the key is unique: the same email under another id is fine.
    exec(&f.client, "INSERT INTO accounts VALUES (6, 'a@x', 6)").await;
    assert_eq!(count(&f.client, "SELECT count(*) FROM accounts").await, 5);
    assert_eq!(count(&f.client, "SELECT count(*) FROM accounts WHERE id = 1").await, 1);
}

#[tokio::test]
async fn add_column_with_inline_unique_constraint_is_refused() {
    let f = Fixture::start().await;
    let coordinator_db = f.cluster.connect_coordinator_db().await;
    let ps = f.distributed("accounts", "id int, email text", "id").await;
    for sql in ["ALTER TABLE accounts ADD COLUMN code int UNIQUE", "ALTER TABLE accounts ADD COLUMN code int PRIMARY KEY"] {
        let e = fails_with(&f.client, sql, "0A000").await;
        assert!(e.message().to_lowercase().contains("partition column"), "{sql}: {}", e.message());
    }
    assert_eq!(column_names(&coordinator_db, "accounts").await, vec!["id", "email"]);
    for p in &ps {
        assert_eq!(column_names(f.worker_for(p), &p.rel("accounts")).await, vec!["id", "email"], "shard {}", p.shard);
        assert_eq!(indexes(f.worker_for(p), &p.rel("accounts")).await, vec![], "shard {}", p.shard);
    }
}

// ---------------------------------------------------------------------------
// 3. ALTER TABLE on columns
// ---------------------------------------------------------------------------

#[tokio::test]
async fn add_and_drop_column_and_check_constraint_reach_every_shard() {
    let f = Fixture::start().await;
    let coordinator_db = f.cluster.connect_coordinator_db().await;
    let ps = f.distributed("events", "id int, payload int", "id").await;
    exec(&f.client, &format!("INSERT INTO events VALUES {}", values(1..=5, |k| format!("{k}, {k}")))).await;

    // ADD COLUMN with a DEFAULT: existing rows on every shard get it.
    exec(&f.client, "ALTER TABLE events ADD COLUMN flag int DEFAULT 7").await;
    let flag = ("flag".to_string(), Some("7".to_string()), "integer".to_string());
    assert!(columns(&coordinator_db, "events").await.contains(&flag), "shell table");
    for p in &ps {
        let cols = columns(f.worker_for(p), &p.rel("events")).await;
        assert!(cols.contains(&flag), "shard {} on worker {}: {cols:?}", p.shard, p.worker + 1);
    }
    assert_eq!(count(&f.client, "SELECT count(*) FROM events WHERE flag = 7").await, 5);
    exec(&f.client, "INSERT INTO events (id, payload) VALUES (6, 6)").await;
    exec(&f.client, "INSERT INTO events (id, payload, flag) VALUES (7, 7, 70)").await;
    assert_eq!(rows(&f.client, "SELECT payload, flag FROM events WHERE id = 6").await, vec![vec![Some("6".into()), Some("7".into())]]);
    assert_eq!(value(&f.client, "SELECT flag FROM events WHERE id = 7").await.as_deref(), Some("70"));
    let mut flags = column(&f.client, "SELECT flag FROM events").await;
    flags.sort();
    assert_eq!(flags, vec!["7", "7", "7", "7", "7", "7", "70"]);

    // DROP COLUMN.
    exec(&f.client, "ALTER TABLE events DROP COLUMN payload").await;
    assert_eq!(column_names(&coordinator_db, "events").await, vec!["id", "flag"]);
    for p in &ps {
        assert_eq!(column_names(f.worker_for(p), &p.rel("events")).await, vec!["id", "flag"], "shard {}", p.shard);
    }
    fails_with(&f.client, "SELECT payload FROM events WHERE id = 1", "42703").await;
    assert_eq!(count(&f.client, "SELECT count(*) FROM events").await, 7);

    // ADD CONSTRAINT … CHECK: every shard enforces it.
    exec(&f.client, "ALTER TABLE events ADD CONSTRAINT events_flag_check CHECK (flag < 100)").await;
    assert_eq!(constraints(&coordinator_db, "events").await, vec![("events_flag_check".to_string(), "c".to_string())]);
    for p in &ps {
        let cons = constraints(f.worker_for(p), &p.rel("events")).await;
        assert_eq!(cons, vec![(format!("events_flag_check_{}", p.shard), "c".to_string())], "shard {}", p.shard);
    }
    // Keys 8..=15 cover every shard.
    for key in 8..=15 {
        fails_with(&f.client, &format!("INSERT INTO events VALUES ({key}, 100)"), "23514").await;
    }
    exec(&f.client, "INSERT INTO events VALUES (8, 99)").await;
    assert_eq!(count(&f.client, "SELECT count(*) FROM events").await, 8);
    // DROP CONSTRAINT reaches the shards too.
    exec(&f.client, "ALTER TABLE events DROP CONSTRAINT events_flag_check").await;
    for p in &ps {
        assert_eq!(constraints(f.worker_for(p), &p.rel("events")).await, vec![], "shard {}", p.shard);
    }
    exec(&f.client, "INSERT INTO events VALUES (9, 100)").await;
}

#[tokio::test]
async fn rename_column_reaches_every_shard() {
    let f = Fixture::start().await;
    let coordinator_db = f.cluster.connect_coordinator_db().await;
    let ps = f.distributed("events", "id int, flag int", "id").await;
    exec(&f.client, &format!("INSERT INTO events VALUES {}", values(1..=7, |k| format!("{k}, {}", k * 10)))).await;

    // A normal column.
    exec(&f.client, "ALTER TABLE events RENAME COLUMN flag TO level").await;
    assert_eq!(column_names(&coordinator_db, "events").await, vec!["id", "level"]);
    for p in &ps {
        assert_eq!(column_names(f.worker_for(p), &p.rel("events")).await, vec!["id", "level"], "shard {}", p.shard);
    }
    assert_eq!(value(&f.client, "SELECT level FROM events WHERE id = 7").await.as_deref(), Some("70"));

    // The distribution column: the catalog follows, and routing uses the new name.
    exec(&f.client, "ALTER TABLE events RENAME COLUMN id TO event_id").await;
    assert_eq!(column_names(&coordinator_db, "events").await, vec!["event_id", "level"]);
    for p in &ps {
        assert_eq!(column_names(f.worker_for(p), &p.rel("events")).await, vec!["event_id", "level"], "shard {}", p.shard);
    }
    assert_eq!(
        value(&f.client, "SELECT distribution_column FROM citus_tables WHERE table_name = 'events'::regclass").await.as_deref(),
        Some("event_id")
    );
    assert_eq!(value(&f.client, "SELECT partkey FROM pg_dist_partition WHERE logicalrelid = 'events'::regclass").await.as_deref(), Some("event_id"));
    for key in 1..=7 {
        assert_eq!(
            rows(&f.client, &format!("SELECT event_id, level FROM events WHERE event_id = {key}")).await,
            vec![vec![Some(key.to_string()), Some((key * 10).to_string())]],
            "key {key}"
        );
    }
    let by_param: i32 = f
        .client
        .query_one("SELECT level FROM events WHERE event_id = $1", &[&5i32])
        .await
        .map(|r| r.get(0))
        .unwrap_or_else(|e| panic!("{}", describe(&e)));
    assert_eq!(by_param, 50);
    fails_with(&f.client, "SELECT level FROM events WHERE id = 5", "42703").await;
    // New rows are routed by the new name, to the shard a lookup by key finds.
    exec(&f.client, "INSERT INTO events (event_id, level) VALUES (8, 80)").await;
    f.client.execute("INSERT INTO events (level, event_id) VALUES ($1, $2)", &[&90i32, &9i32]).await.unwrap_or_else(|e| panic!("{}", describe(&e)));
    for (key, level) in [(8, "80"), (9, "90")] {
        assert_eq!(value(&f.client, &format!("SELECT level FROM events WHERE event_id = {key}")).await.as_deref(), Some(level));
        let mut holding = 0;
        for p in &ps {
            holding += count(f.worker_for(p), &format!("SELECT count(*) FROM public.{} WHERE event_id = {key}", p.rel("events"))).await;
        }
        assert_eq!(holding, 1, "key {key} must be in exactly one shard");
    }
    assert_eq!(count(&f.client, "SELECT count(*) FROM events").await, 9);
}

#[tokio::test]
async fn distribution_column_cannot_be_dropped_or_retyped() {
    let f = Fixture::start().await;
    let coordinator_db = f.cluster.connect_coordinator_db().await;
    let ps = f.distributed("events", "id int, level int", "id").await;
    exec(&f.client, "INSERT INTO events VALUES (1, 1), (2, 2), (3, 3)").await;
    for sql in [
        "ALTER TABLE events DROP COLUMN id",
        "ALTER TABLE events DROP COLUMN id CASCADE",
        "ALTER TABLE events ALTER COLUMN id TYPE bigint",
        "ALTER TABLE events ALTER COLUMN id SET DATA TYPE text",
        "ALTER TABLE events ADD COLUMN extra int, DROP COLUMN id",
    ] {
        fails_with(&f.client, sql, "0A000").await;
    }
    let expected = vec![("id".to_string(), None, "integer".to_string()), ("level".to_string(), None, "integer".to_string())];
    assert_eq!(columns(&coordinator_db, "events").await, expected, "shell table");
    for p in &ps {
        assert_eq!(columns(f.worker_for(p), &p.rel("events")).await, expected, "shard {}", p.shard);
    }
    assert_eq!(value(&f.client, "SELECT distribution_column FROM citus_tables WHERE table_name = 'events'::regclass").await.as_deref(), Some("id"));
    assert_eq!(value(&f.client, "SELECT level FROM events WHERE id = 2").await.as_deref(), Some("2"));
    assert_eq!(count(&f.client, "SELECT count(*) FROM events").await, 3);
}

// ---------------------------------------------------------------------------
// DDL in transaction blocks, and DDL that fails on one shard only
// ---------------------------------------------------------------------------

#[tokio::test]
async fn ddl_is_atomic_across_shards() {
    let f = Fixture::start().await;
    let coordinator_db = f.cluster.connect_coordinator_db().await;
    let ps = f.distributed("t", "a int, b int", "a").await;
    exec(&f.client, &format!("INSERT INTO t VALUES {}", values(1..=12, |k| format!("{k}, 0")))).await;

    // Rolled back by the client: nothing anywhere.
    exec(&f.client, "BEGIN").await;
    exec(&f.client, "ALTER TABLE t ADD COLUMN x int").await;
    exec(&f.client, "CREATE INDEX t_x_idx ON t (x)").await;
    exec(&f.client, "ROLLBACK").await;
    assert_eq!(column_names(&coordinator_db, "t").await, vec!["a", "b"]);
    assert_eq!(indexes(&coordinator_db, "t").await, vec![]);
    for p in &ps {
        assert_eq!(column_names(f.worker_for(p), &p.rel("t")).await, vec!["a", "b"], "shard {}", p.shard);
        assert_eq!(indexes(f.worker_for(p), &p.rel("t")).await, vec![], "shard {}", p.shard);
    }

    // Committed by the client: everywhere.
    exec(&f.client, "BEGIN").await;
    exec(&f.client, "ALTER TABLE t ADD COLUMN y int").await;
    exec(&f.client, "CREATE INDEX t_y_idx ON t (y)").await;
    exec(&f.client, "COMMIT").await;
    assert_eq!(column_names(&coordinator_db, "t").await, vec!["a", "b", "y"]);
    for p in &ps {
        assert_eq!(column_names(f.worker_for(p), &p.rel("t")).await, vec!["a", "b", "y"], "shard {}", p.shard);
        assert_eq!(indexes(f.worker_for(p), &p.rel("t")).await.len(), 1, "shard {}", p.shard);
    }

    // A CHECK that only one row on the second worker violates: the shell table
    // (empty) and the first worker's shards accept it, the second worker refuses;
    // the constraint must then exist nowhere.
    let second: Vec<&Placement> = ps.iter().filter(|p| p.worker == 1).collect();
    let key = count(&f.workers[1], &format!("SELECT min(a) FROM public.{}", second[0].rel("t"))).await;
    exec(&f.client, &format!("UPDATE t SET b = 100 WHERE a = {key}")).await;
    fails_with(&f.client, "ALTER TABLE t ADD CONSTRAINT t_b_small CHECK (b < 50)", "23514").await;
    assert_eq!(constraints(&coordinator_db, "t").await, vec![], "shell table");
    for p in &ps {
        assert_eq!(constraints(f.worker_for(p), &p.rel("t")).await, vec![], "shard {} on worker {}", p.shard, p.worker + 1);
    }
    // The session is usable and the statement works once the data allows it.
    exec(&f.client, &format!("UPDATE t SET b = 1 WHERE a = {key}")).await;
    exec(&f.client, "ALTER TABLE t ADD CONSTRAINT t_b_small CHECK (b < 50)").await;
    for p in &ps {
        assert_eq!(constraints(f.worker_for(p), &p.rel("t")).await.len(), 1, "shard {}", p.shard);
    }
}

// ---------------------------------------------------------------------------
// Foreign keys to a reference table
// ---------------------------------------------------------------------------

#[tokio::test]
async fn foreign_key_to_reference_table_and_truncate_cascade() {
    let f = Fixture::start().await;
    let rs = f.reference("currencies", "code int PRIMARY KEY, name text").await;
    let ps = f.distributed("payments", "id int, currency int", "id").await;
    exec(&f.client, "INSERT INTO currencies VALUES (1, 'EUR'), (2, 'USD')").await;

    exec(&f.client, "ALTER TABLE payments ADD CONSTRAINT payments_currency_fkey FOREIGN KEY (currency) REFERENCES currencies (code)").await;
    let ref_shard = rs[0].rel("currencies");
    for p in &ps {
        let fk = rows(
            f.worker_for(p),
            &format!(
                "SELECT conname, confrelid::regclass::text FROM pg_constraint WHERE conrelid = 'public.{}'::regclass AND contype = 'f'",
                p.rel("payments")
            ),
        )
        .await;
        assert_eq!(fk, vec![vec![Some(format!("payments_currency_fkey_{}", p.shard)), Some(ref_shard.clone())]], "shard {}", p.shard);
    }
    exec(&f.client, &format!("INSERT INTO payments VALUES {}", values(1..=8, |k| format!("{k}, {}", k % 2 + 1)))).await;
    fails_with(&f.client, "INSERT INTO payments VALUES (9, 99)", "23503").await;

    // Without CASCADE the referencing table stops it (on the shell table already).
    fails_with(&f.client, "TRUNCATE currencies", "0A000").await;
    assert_eq!(count(&f.client, "SELECT count(*) FROM payments").await, 8);
    exec(&f.client, "TRUNCATE currencies CASCADE").await;
    assert_eq!(count(&f.client, "SELECT count(*) FROM payments").await, 0);
    assert_eq!(count(&f.client, "SELECT count(*) FROM currencies").await, 0);
    for (table, placements) in [("currencies", &rs), ("payments", &ps)] {
        for p in placements {
            assert_eq!(row_count(f.worker_for(p), &p.rel(table)).await, 0, "{table} shard {} on worker {}", p.shard, p.worker + 1);
        }
    }
}

#[tokio::test]
async fn foreign_keys_in_a_new_column_and_to_a_colocated_table() {
    let f = Fixture::start().await;
    let rs = f.reference("currencies", "code int PRIMARY KEY").await;
    let accounts = f.distributed("accounts", "id int PRIMARY KEY", "id").await;
    let payments = f.distributed("payments", "account_id int, amount int", "account_id").await;
    for (a, p) in accounts.iter().zip(&payments) {
        assert_eq!(a.worker, p.worker, "co-located shards {} and {} must share a worker", a.shard, p.shard);
    }

    // A key to a co-located table points each shard at the shard with the same
    // hash range; a key declared with a new column at the reference table's shard.
    exec(&f.client, "ALTER TABLE payments ADD CONSTRAINT payments_account_fkey FOREIGN KEY (account_id) REFERENCES accounts (id)").await;
    exec(&f.client, "ALTER TABLE payments ADD COLUMN currency int REFERENCES currencies (code)").await;
    for (a, p) in accounts.iter().zip(&payments) {
        let targets = column(
            f.worker_for(p),
            &format!(
                "SELECT confrelid::regclass::text FROM pg_constraint WHERE conrelid = 'public.{}'::regclass AND contype = 'f' ORDER BY 1",
                p.rel("payments")
            ),
        )
        .await;
        assert_eq!(targets, vec![a.rel("accounts"), rs[0].rel("currencies")], "shard {}", p.shard);
    }

    exec(&f.client, &format!("INSERT INTO accounts VALUES {}", values(1..=8, |k| k.to_string()))).await;
    exec(&f.client, "INSERT INTO currencies VALUES (1)").await;
    exec(&f.client, &format!("INSERT INTO payments VALUES {}", values(1..=8, |k| format!("{k}, 10, 1")))).await;
    fails_with(&f.client, "INSERT INTO payments VALUES (99, 10, 1)", "23503").await;
    fails_with(&f.client, "INSERT INTO payments VALUES (1, 10, 7)", "23503").await;
    assert_eq!(count(&f.client, "SELECT count(*) FROM payments").await, 8);
}

// ---------------------------------------------------------------------------
// 4. TRUNCATE and DROP TABLE
// ---------------------------------------------------------------------------

#[tokio::test]
async fn truncate_and_drop_reach_every_shard() {
    let f = Fixture::start().await;
    let coordinator_db = f.cluster.connect_coordinator_db().await;
    let ps = f.distributed("orders", "id int, amount int", "id").await;
    let rs = f.reference("currencies", "code text, rate int").await;
    exec(&f.client, &format!("INSERT INTO orders VALUES {}", values(1..=20, |k| format!("{k}, {}", k * 100)))).await;
    exec(&f.client, "INSERT INTO currencies VALUES ('EUR', 1), ('USD', 2)").await;

    // Before: the rows are spread over both workers.
    assert_eq!(count(&f.client, "SELECT count(*) FROM orders").await, 20);
    let mut per_worker = [0i64; 2];
    for p in &ps {
        per_worker[p.worker] += row_count(f.worker_for(p), &p.rel("orders")).await;
    }
    assert_eq!(per_worker.iter().sum::<i64>(), 20, "rows per worker {per_worker:?}");
    assert!(per_worker.iter().all(|n| *n > 0), "rows per worker {per_worker:?}");
    for p in &rs {
        assert_eq!(row_count(f.worker_for(p), &p.rel("currencies")).await, 2, "worker {}", p.worker + 1);
    }

    // TRUNCATE empties every shard.
    exec(&f.client, "TRUNCATE orders").await;
    assert_eq!(count(&f.client, "SELECT count(*) FROM orders").await, 0);
    for p in &ps {
        assert_eq!(row_count(f.worker_for(p), &p.rel("orders")).await, 0, "shard {} on worker {}", p.shard, p.worker + 1);
    }
    exec(&f.client, "TRUNCATE TABLE currencies").await;
    assert_eq!(count(&f.client, "SELECT count(*) FROM currencies").await, 0);
    for p in &rs {
        assert_eq!(row_count(f.worker_for(p), &p.rel("currencies")).await, 0, "worker {}", p.worker + 1);
    }
    // A TRUNCATE rolled back by the client leaves the rows.
    exec(&f.client, &format!("INSERT INTO orders VALUES {}", values(1..=8, |k| format!("{k}, 1")))).await;
    exec(&f.client, "BEGIN").await;
    exec(&f.client, "TRUNCATE orders").await;
    exec(&f.client, "ROLLBACK").await;
    assert_eq!(count(&f.client, "SELECT count(*) FROM orders").await, 8);

    // DROP TABLE removes the shards and the catalog rows.
    let shard_list = ps.iter().map(|p| p.shard.to_string()).collect::<Vec<_>>().join(", ");
    let oid = value(&f.client, "SELECT 'orders'::regclass::oid").await.unwrap();
    let catalog_rows = |oid: &str| {
        [
            format!("SELECT count(*) FROM pg_dist_partition WHERE logicalrelid::oid = {oid}"),
            format!("SELECT count(*) FROM pg_dist_shard WHERE shardid IN ({shard_list})"),
            format!("SELECT count(*) FROM pg_dist_placement WHERE shardid IN ({shard_list})"),
        ]
    };
    let before: Vec<i64> = counts(&f.client, &catalog_rows(&oid)).await;
    assert_eq!(before, vec![1, SHARD_COUNT as i64, SHARD_COUNT as i64]);
    exec(&f.client, "DROP TABLE orders").await;
    assert_eq!(counts(&f.client, &catalog_rows(&oid)).await, vec![0, 0, 0], "catalog rows of the dropped table");
    assert!(!exists(&coordinator_db, "orders").await, "shell table");
    for p in &ps {
        assert!(!exists(f.worker_for(p), &p.rel("orders")).await, "shard {} still on worker {}", p.shard, p.worker + 1);
    }
    fails_with(&f.client, "SELECT count(*) FROM orders", "42P01").await;

    // DROP TABLE IF EXISTS of a local table, a distributed one and a missing one.
    exec(&f.client, "CREATE TABLE scratch (x int)").await;
    exec(&f.client, "INSERT INTO scratch VALUES (1)").await;
    let ls = f.distributed("logs", "id int, line text", "id").await;
    exec(&f.client, "INSERT INTO logs VALUES (1, 'a'), (2, 'b'), (3, 'c')").await;
    assert!(exists(&coordinator_db, "scratch").await);
    exec(&f.client, "DROP TABLE IF EXISTS scratch, logs, no_such_table").await;
    assert!(!exists(&coordinator_db, "scratch").await, "local table");
    assert!(!exists(&coordinator_db, "logs").await, "shell table");
    for p in &ls {
        assert!(!exists(f.worker_for(p), &p.rel("logs")).await, "shard {} still on worker {}", p.shard, p.worker + 1);
    }
    let log_shards = ls.iter().map(|p| p.shard.to_string()).collect::<Vec<_>>().join(", ");
    assert_eq!(count(&f.client, &format!("SELECT count(*) FROM pg_dist_shard WHERE shardid IN ({log_shards})")).await, 0);
    assert_eq!(count(&f.client, &format!("SELECT count(*) FROM pg_dist_placement WHERE shardid IN ({log_shards})")).await, 0);
    // The reference table was not touched; then it goes too.
    assert_eq!(count(&f.client, "SELECT count(*) FROM pg_dist_partition").await, 1);
    for p in &rs {
        assert!(exists(f.worker_for(p), &p.rel("currencies")).await, "worker {}", p.worker + 1);
    }
    exec(&f.client, "DROP TABLE currencies").await;
    for p in &rs {
        assert!(!exists(f.worker_for(p), &p.rel("currencies")).await, "worker {}", p.worker + 1);
    }
    for table in ["pg_dist_partition", "pg_dist_shard", "pg_dist_placement"] {
        assert_eq!(count(&f.client, &format!("SELECT count(*) FROM {table}")).await, 0, "{table}");
    }
}

/// The count each query returns, in order.
async fn counts(c: &Client, queries: &[String]) -> Vec<i64> {
    let mut out = Vec::new();
    for q in queries {
        out.push(count(c, q).await);
    }
    out
}

// ---------------------------------------------------------------------------
// 5. Atomicity with a worker down
// ---------------------------------------------------------------------------

/// A table `t` with 12 rows; worker 2 is stopped. `f.client` held connections to
/// both workers when it stopped, `fresh` held none.
struct WorkerDown {
    f: Fixture,
    fresh: Client,
    coordinator_db: Client,
    placements: Vec<Placement>,
    /// Placements on worker 1, and how many rows they hold.
    first: Vec<Placement>,
    rows_on_first: i64,
    /// "127.0.0.1:<port of worker 2>".
    node: String,
}

impl WorkerDown {
    async fn start() -> WorkerDown {
        let f = Fixture::start().await;
        let coordinator_db = f.cluster.connect_coordinator_db().await;
        let placements = f.distributed("t", "a int, b int", "a").await;
        exec(&f.client, &format!("INSERT INTO t VALUES {}", values(1..=12, |k| format!("{k}, {k}")))).await;
        assert_eq!(count(&f.client, "SELECT count(*) FROM t").await, 12);
        let fresh = f.cluster.connect().await;
        let first: Vec<Placement> = placements.iter().copied().filter(|p| p.worker == 0).collect();
        let mut rows_on_first = 0;
        for p in &first {
            rows_on_first += row_count(&f.workers[0], &p.rel("t")).await;
        }
        assert!(rows_on_first > 0 && rows_on_first < 12, "rows on worker 1: {rows_on_first}");
        let node = format!("127.0.0.1:{}", f.worker_port(1));
        f.cluster.workers()[1].stop().expect("stop worker 2");
        WorkerDown { f, fresh, coordinator_db, placements, first, rows_on_first, node }
    }

    /// Runs `sql` in both sessions: it must fail, naming worker 2 (in the message
    /// for the session that had to connect; message or context for the one whose
    /// connection broke).
    async fn must_fail(&self, sql: &str) {
        for (session, c) in [("session with worker connections", &self.f.client), ("fresh session", &self.fresh)] {
            let e = fails(c, sql).await;
            let d = e.as_db_error().unwrap_or_else(|| panic!("{sql} ({session}): expected a server error, got {e}"));
            let text = if std::ptr::eq(c, &self.fresh) {
                d.message().to_string()
            } else {
                format!("{} {} {}", d.message(), d.detail().unwrap_or(""), d.where_().unwrap_or(""))
            };
            assert!(text.contains(&self.node), "{sql} ({session}): the error must name {}: {}", self.node, describe(&e));
        }
    }

    /// Both sessions still work, and every row on worker 1 is still readable
    /// through the coordinator.
    async fn sessions_work(&self) {
        for c in [&self.f.client, &self.fresh] {
            assert_eq!(value(c, "SELECT 1").await.as_deref(), Some("1"));
            let mut readable = 0;
            for key in 1..=12 {
                if let Ok(r) = c.simple_query(&format!("SELECT b FROM t WHERE a = {key}")).await {
                    let vals: Vec<String> = r
                        .into_iter()
                        .filter_map(|m| if let SimpleQueryMessage::Row(r) = m { Some(r.get(0).unwrap().to_string()) } else { None })
                        .collect();
                    assert_eq!(vals, vec![key.to_string()], "key {key}");
                    readable += 1;
                }
            }
            assert_eq!(readable, self.rows_on_first, "every row on worker 1 must stay readable");
        }
    }

    async fn restart_worker(&mut self) {
        self.f.cluster.workers()[1].start().expect("start worker 2");
        self.f.workers[1] = self.f.cluster.connect_worker(1).await;
    }
}

#[tokio::test]
async fn alter_table_with_a_worker_down_is_atomic() {
    let mut w = WorkerDown::start().await;
    w.must_fail("ALTER TABLE t ADD COLUMN c int").await;
    w.must_fail("CREATE INDEX t_b_idx ON t (b)").await;

    // Nothing was half-applied: not on the shell table, not on worker 1's shards.
    assert_eq!(column_names(&w.coordinator_db, "t").await, vec!["a", "b"], "shell table");
    assert_eq!(indexes(&w.coordinator_db, "t").await, vec![], "shell table");
    for p in &w.first {
        assert_eq!(column_names(&w.f.workers[0], &p.rel("t")).await, vec!["a", "b"], "shard {} on worker 1", p.shard);
        assert_eq!(indexes(&w.f.workers[0], &p.rel("t")).await, vec![], "shard {} on worker 1", p.shard);
    }
    w.sessions_work().await;

    // Once the worker is back, the same statement succeeds everywhere.
    w.restart_worker().await;
    let after = w.f.cluster.connect().await;
    exec(&after, "ALTER TABLE t ADD COLUMN c int").await;
    assert_eq!(column_names(&w.coordinator_db, "t").await, vec!["a", "b", "c"], "shell table");
    for p in &w.placements {
        assert_eq!(column_names(w.f.worker_for(p), &p.rel("t")).await, vec!["a", "b", "c"], "shard {} on worker {}", p.shard, p.worker + 1);
    }
    // The sessions that saw the failure work against the restarted worker too.
    exec(&w.f.client, "ALTER TABLE t ADD COLUMN d int").await;
    exec(&w.fresh, "CREATE INDEX t_b_idx ON t (b)").await;
    for p in &w.placements {
        assert_eq!(column_names(w.f.worker_for(p), &p.rel("t")).await, vec!["a", "b", "c", "d"], "shard {} on worker {}", p.shard, p.worker + 1);
        assert_eq!(indexes(w.f.worker_for(p), &p.rel("t")).await.len(), 1, "shard {} on worker {}", p.shard, p.worker + 1);
    }
    assert_eq!(count(&w.f.client, "SELECT count(*) FROM t").await, 12);
}

#[tokio::test]
async fn truncate_and_drop_with_a_worker_down_are_atomic() {
    let mut w = WorkerDown::start().await;
    w.must_fail("TRUNCATE t").await;
    w.must_fail("DROP TABLE t").await;

    // Nothing was half-applied: the shell table, the catalog rows and worker 1's
    // shards with their rows are all still there.
    assert!(exists(&w.coordinator_db, "t").await, "shell table");
    assert_eq!(count(&w.f.client, "SELECT count(*) FROM pg_dist_partition WHERE logicalrelid = 't'::regclass").await, 1);
    assert_eq!(count(&w.f.client, "SELECT count(*) FROM pg_dist_shard WHERE logicalrelid = 't'::regclass").await, SHARD_COUNT as i64);
    assert_eq!(
        count(
            &w.f.client,
            "SELECT count(*) FROM pg_dist_placement WHERE shardid IN (SELECT shardid FROM pg_dist_shard WHERE logicalrelid = 't'::regclass)"
        )
        .await,
        SHARD_COUNT as i64
    );
    let mut still_there = 0;
    for p in &w.first {
        assert!(exists(&w.f.workers[0], &p.rel("t")).await, "shard {} on worker 1", p.shard);
        still_there += row_count(&w.f.workers[0], &p.rel("t")).await;
    }
    assert_eq!(still_there, w.rows_on_first, "TRUNCATE must not have emptied worker 1's shards");
    w.sessions_work().await;

    // Once the worker is back, both succeed everywhere.
    w.restart_worker().await;
    let after = w.f.cluster.connect().await;
    exec(&after, "TRUNCATE t").await;
    assert_eq!(count(&after, "SELECT count(*) FROM t").await, 0);
    for p in &w.placements {
        assert_eq!(row_count(w.f.worker_for(p), &p.rel("t")).await, 0, "shard {} on worker {}", p.shard, p.worker + 1);
    }
    // The session that saw the failure works against the restarted worker too.
    exec(&w.f.client, "DROP TABLE t").await;
    assert!(!exists(&w.coordinator_db, "t").await, "shell table");
    for p in &w.placements {
        assert!(!exists(w.f.worker_for(p), &p.rel("t")).await, "shard {} still on worker {}", p.shard, p.worker + 1);
    }
    assert_eq!(count(&w.fresh, "SELECT count(*) FROM pg_dist_shard").await, 0);
}

#[tokio::test]
async fn idle_session_survives_a_worker_restart() {
    let mut f = Fixture::start().await;
    let ps = f.distributed("t", "a int, b int", "a").await;
    exec(&f.client, &format!("INSERT INTO t VALUES {}", values(1..=12, |k| format!("{k}, {k}")))).await;
    // Both sessions hold connections to both workers, then sit idle while
    // worker 2 restarts.
    let other = f.cluster.connect().await;
    assert_eq!(count(&f.client, "SELECT count(*) FROM t").await, 12);
    assert_eq!(count(&other, "SELECT count(*) FROM t").await, 12);
    f.cluster.workers()[1].stop().expect("stop worker 2");
    f.cluster.workers()[1].start().expect("start worker 2");
    f.workers[1] = f.cluster.connect_worker(1).await;

    // Outside a transaction block nothing was lost with the old connections:
    // the first statement after the restart must simply work.
    assert_eq!(count(&other, "SELECT count(*) FROM t").await, 12);
    exec(&f.client, "TRUNCATE t").await;
    for p in &ps {
        assert_eq!(row_count(f.worker_for(p), &p.rel("t")).await, 0, "shard {} on worker {}", p.shard, p.worker + 1);
    }
}

#[tokio::test]
async fn worker_lost_inside_a_block_is_a_lost_connection() {
    let f = Fixture::start().await;
    let ps = f.distributed("t", "a int, b int", "a").await;
    exec(&f.client, &format!("INSERT INTO t VALUES {}", values(1..=12, |k| format!("{k}, {k}")))).await;
    let second = ps.iter().find(|p| p.worker == 1).unwrap();
    let key = count(&f.workers[1], &format!("SELECT min(a) FROM public.{}", second.rel("t"))).await;
    let node = format!("127.0.0.1:{}", f.worker_port(1));

    exec(&f.client, "BEGIN").await;
    exec(&f.client, &format!("UPDATE t SET b = -1 WHERE a = {key}")).await;
    // Worker 2 ends the backend holding the block's part there, as a shutdown
    // would: it sends FATAL 57P01 and closes the connection.
    let ended = count(
        &f.workers[1],
        "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid, 5000)) FROM pg_stat_activity WHERE state = 'idle in transaction'",
    )
    .await;
    assert_eq!(ended, 1);

    // The transaction is lost, and the error says so: the node's connection was
    // lost (08006), not the coordinator shutting down (57P01).
    let e = fails_with(&f.client, &format!("SELECT b FROM t WHERE a = {key}"), "08006").await;
    assert_eq!(e.severity(), "ERROR");
    assert_eq!(e.message(), format!("connection to node {node} was lost"));
    assert!(e.detail().is_some_and(|d| d.contains("terminating connection due to administrator command")), "detail: {:?}", e.detail());
    assert!(e.where_().is_some_and(|w| w.contains(&node)), "context: {:?}", e.where_());
    exec(&f.client, "ROLLBACK").await;

    // Nothing was written, and the session carries on with a new connection.
    assert_eq!(value(&f.client, &format!("SELECT b FROM t WHERE a = {key}")).await, Some(key.to_string()));
    assert_eq!(count(&f.client, "SELECT count(*) FROM t WHERE b < 0").await, 0);
}

// ---------------------------------------------------------------------------
// 6. VACUUM and ANALYZE
// ---------------------------------------------------------------------------

/// (vacuum_count, analyze_count) of a table, manual runs only.
async fn maintenance_counts(node: &Client, rel: &str) -> (i64, i64) {
    let r =
        rows(node, &format!("SELECT vacuum_count, analyze_count FROM pg_stat_user_tables WHERE schemaname = 'public' AND relname = '{rel}'")).await;
    assert_eq!(r.len(), 1, "{rel}: {r:?}");
    (r[0][0].as_deref().unwrap().parse().unwrap(), r[0][1].as_deref().unwrap().parse().unwrap())
}

#[tokio::test]
async fn vacuum_and_analyze_reach_every_shard() {
    let f = Fixture::start().await;
    let ps = f.distributed("t", "a int, b int", "a").await;
    let rs = f.reference("r", "id int, name text").await;
    exec(&f.client, &format!("INSERT INTO t VALUES {}", values(1..=40, |k| format!("{k}, {k}")))).await;
    exec(&f.client, "INSERT INTO r VALUES (1, 'a'), (2, 'b'), (3, 'c')").await;
    for p in &ps {
        assert_eq!(maintenance_counts(f.worker_for(p), &p.rel("t")).await, (0, 0), "shard {}", p.shard);
    }

    exec(&f.client, "VACUUM t").await;
    for p in &ps {
        assert_eq!(maintenance_counts(f.worker_for(p), &p.rel("t")).await, (1, 0), "shard {} on worker {}", p.shard, p.worker + 1);
    }

    exec(&f.client, "ANALYZE t").await;
    for p in &ps {
        let w = f.worker_for(p);
        let rel = p.rel("t");
        assert_eq!(maintenance_counts(w, &rel).await, (1, 1), "shard {} on worker {}", p.shard, p.worker + 1);
        // The statistics are the shard's: reltuples is its exact row count.
        let reltuples = value(w, &format!("SELECT reltuples::bigint FROM pg_class WHERE oid = 'public.{rel}'::regclass")).await.unwrap();
        assert_eq!(reltuples, row_count(w, &rel).await.to_string(), "shard {}", p.shard);
        assert_eq!(
            count(w, &format!("SELECT count(*) FROM pg_stats WHERE schemaname = 'public' AND tablename = '{rel}'")).await,
            2,
            "shard {}",
            p.shard
        );
    }

    exec(&f.client, "VACUUM (ANALYZE) r").await;
    for p in &rs {
        assert_eq!(maintenance_counts(f.worker_for(p), &p.rel("r")).await, (1, 1), "worker {}", p.worker + 1);
    }
}

#[tokio::test]
async fn vacuum_inside_a_transaction_block_fails_with_25001() {
    let f = Fixture::start().await;
    let ps = f.distributed("t", "a int, b int", "a").await;
    exec(&f.client, &format!("INSERT INTO t VALUES {}", values(1..=8, |k| format!("{k}, {k}")))).await;
    exec(&f.client, "BEGIN").await;
    let e = fails_with(&f.client, "VACUUM t", "25001").await;
    assert!(e.message().contains("VACUUM cannot run inside a transaction block"), "{}", e.message());
    exec(&f.client, "ROLLBACK").await;
    // Nothing was vacuumed, and the session is fine.
    assert_eq!(value(&f.client, "SELECT 1").await.as_deref(), Some("1"));
    for p in &ps {
        assert_eq!(maintenance_counts(f.worker_for(p), &p.rel("t")).await.0, 0, "shard {}", p.shard);
    }
    exec(&f.client, "VACUUM t").await;
    for p in &ps {
        assert_eq!(maintenance_counts(f.worker_for(p), &p.rel("t")).await.0, 1, "shard {}", p.shard);
    }
}

#[tokio::test]
async fn analyze_inside_a_transaction_block() {
    // PostgreSQL (and Citus, for distributed tables) allow ANALYZE in a block.
    let f = Fixture::start().await;
    let ps = f.distributed("t", "a int, b int", "a").await;
    exec(&f.client, &format!("INSERT INTO t VALUES {}", values(1..=8, |k| format!("{k}, {k}")))).await;
    exec(&f.client, "BEGIN").await;
    exec(&f.client, "ANALYZE t").await;
    exec(&f.client, "COMMIT").await;
    for p in &ps {
        assert_eq!(maintenance_counts(f.worker_for(p), &p.rel("t")).await.1, 1, "shard {}", p.shard);
    }
}

/// A bare ANALYZE or VACUUM means the whole database, as in PostgreSQL:
/// every shard of every distributed table, and the coordinator database's
/// own tables.
#[tokio::test]
async fn database_wide_analyze_and_vacuum() {
    let f = Fixture::start().await;
    let ps = f.distributed("t", "a int, b int", "a").await;
    let qs = f.distributed("u", "a int, c text", "a").await;
    let rs = f.reference("r", "id int").await;
    exec(&f.client, &format!("INSERT INTO t VALUES {}", values(1..=8, |k| format!("{k}, {k}")))).await;
    exec(&f.client, "CREATE TABLE plain_local (x int)").await;
    exec(&f.client, "ANALYZE").await;
    for p in ps.iter().map(|p| (p, "t")).chain(qs.iter().map(|q| (q, "u"))).chain(rs.iter().map(|r| (r, "r"))) {
        assert_eq!(maintenance_counts(f.worker_for(p.0), &p.0.rel(p.1)).await, (0, 1), "shard {} of {}", p.0.shard, p.1);
    }
    let local = "SELECT analyze_count FROM pg_stat_user_tables WHERE relname = 'plain_local'";
    assert_eq!(value(&f.client, local).await.as_deref(), Some("1"));
    exec(&f.client, "VACUUM (ANALYZE)").await;
    for p in &ps {
        assert_eq!(maintenance_counts(f.worker_for(p), &p.rel("t")).await, (1, 2), "shard {}", p.shard);
    }
}

#[tokio::test]
async fn vacuum_options_with_values() {
    let f = Fixture::start().await;
    let ps = f.distributed("t", "a int, b int", "a").await;
    exec(&f.client, &format!("INSERT INTO t VALUES {}", values(1..=8, |k| format!("{k}, {k}")))).await;
    exec(&f.client, "VACUUM (PARALLEL 0, INDEX_CLEANUP OFF) t").await;
    exec(&f.client, "VACUUM (ANALYZE FALSE) t").await;
    for p in &ps {
        assert_eq!(maintenance_counts(f.worker_for(p), &p.rel("t")).await, (2, 0), "shard {}", p.shard);
    }
    // A column list is kept: only that column gets statistics.
    exec(&f.client, "ANALYZE (VERBOSE FALSE) t (b)").await;
    for p in &ps {
        let w = f.worker_for(p);
        assert_eq!(maintenance_counts(w, &p.rel("t")).await, (2, 1), "shard {}", p.shard);
        assert_eq!(
            column(w, &format!("SELECT attname FROM pg_stats WHERE schemaname = 'public' AND tablename = '{}'", p.rel("t"))).await,
            vec!["b"],
            "shard {}",
            p.shard
        );
    }
}

/// CHECKPOINT through the coordinator checkpoints every worker too, as it
/// would the one database a client believes it talks to.
#[tokio::test]
async fn checkpoint_reaches_every_worker() {
    let f = Fixture::start().await;
    let last = "SELECT checkpoint_lsn::text FROM pg_control_checkpoint()";
    let mut before = Vec::new();
    for w in &f.workers {
        before.push(value(w, last).await);
    }
    exec(&f.client, "CHECKPOINT").await;
    for (i, w) in f.workers.iter().enumerate() {
        assert_ne!(value(w, last).await, before[i], "worker {} wrote a new checkpoint", i + 1);
    }
}

/// A client that parses its statement again after ALTER TABLE gets the new
/// columns, through the router and across shards, as on one server: the
/// workers' prepared copies of the shard statements are made afresh. A
/// statement prepared before the change fails as PostgreSQL's would.
#[tokio::test]
async fn statements_parsed_again_after_alter_table_see_the_new_columns() {
    let f = Fixture::start().await;
    f.distributed("t", "k int, v int", "k").await;
    exec(&f.client, &format!("INSERT INTO t VALUES {}", values(1..=20, |k| format!("{k}, {k}")))).await;
    let by_key = "SELECT * FROM t WHERE k = $1";
    let all = "SELECT * FROM t";
    assert_eq!(f.client.query(by_key, &[&3i32]).await.unwrap()[0].len(), 2);
    assert_eq!(f.client.query(all, &[]).await.unwrap()[0].len(), 2);
    let prepared_before = f.client.prepare(by_key).await.unwrap();
    exec(&f.client, "ALTER TABLE t ADD COLUMN w int DEFAULT 7").await;
    // A statement prepared before fails, as PostgreSQL's own would.
    let e = f.client.query(&prepared_before, &[&3i32]).await.unwrap_err();
    assert_eq!(e.code().map(|c| c.code()), Some("0A000"), "{e}");
    assert!(common::error_text(&e).contains("cached plan must not change result type"), "{}", common::error_text(&e));
    let row = &f.client.query(by_key, &[&3i32]).await.unwrap()[0];
    assert_eq!((row.len(), row.get::<_, i32>(2)), (3, 7));
    let rows = f.client.query(all, &[]).await.unwrap();
    assert_eq!(rows.len(), 20);
    assert!(rows.iter().all(|r| r.len() == 3 && r.get::<_, i32>(2) == 7));
}

// ---------------------------------------------------------------------------
// Concurrent indexes, statistics, triggers, renames
// ---------------------------------------------------------------------------

/// Names of the statistics objects, triggers or constraints of each placement.
async fn shard_names(f: &Fixture, sql_for_rel: impl Fn(&str) -> String, table: &str, ps: &[Placement]) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    for p in ps {
        out.push(column(f.worker_for(p), &sql_for_rel(&p.rel(table))).await);
    }
    out
}

#[tokio::test]
async fn concurrent_indexes_build_shard_by_shard_and_report_failures() {
    let f = Fixture::start().await;
    let coordinator_db = f.cluster.connect_coordinator_db().await;
    let ps = f.distributed("items", "id int PRIMARY KEY, kind int, name text", "id").await;
    exec(&f.client, &format!("INSERT INTO items VALUES {}", values(1..=40, |k| format!("{k}, {}, 'n{k}'", k % 3)))).await;

    exec(&f.client, "BEGIN").await;
    fails_with(&f.client, "CREATE INDEX CONCURRENTLY items_kind_idx ON items (kind)", "25001").await;
    exec(&f.client, "ROLLBACK").await;
    exec(&f.client, "CREATE INDEX CONCURRENTLY items_kind_idx ON items (kind)").await;
    // Unnamed: the shards' copies are named after the shell's index.
    exec(&f.client, "CREATE INDEX CONCURRENTLY ON items (name)").await;
    for (p, names) in ps.iter().zip(shard_indexes(&f, "items", &ps).await) {
        let want: BTreeSet<String> = ["items_pkey", "items_kind_idx", "items_name_idx"].iter().map(|i| format!("{i}_{}", p.shard)).collect();
        assert_eq!(names.into_iter().collect::<BTreeSet<_>>(), want, "shard {}", p.shard);
    }
    assert_eq!(count(&f.client, "SELECT count(*) FROM items WHERE kind = 1").await, 14);

    // A build that fails on some shards says which, and leaves what
    // PostgreSQL leaves: an invalid index to drop.
    let e = fails_with(&f.client, "CREATE INDEX CONCURRENTLY items_bad ON items ((100 / (kind - 1)))", "22012").await;
    assert!(e.message().contains("failed on") && e.message().contains("shards of \"items\""), "{}", e.message());
    assert!(e.detail().unwrap_or_default().contains("shard items_"), "{:?}", e.detail());
    exec(&f.client, "DROP INDEX CONCURRENTLY items_bad").await;
    assert_eq!(indexes(&coordinator_db, "items").await.len(), 3, "shell table");
    for names in shard_indexes(&f, "items", &ps).await {
        assert!(!names.iter().any(|n| n.starts_with("items_bad")), "{names:?}");
    }

    // Renaming an index renames every copy; so do tables and constraints.
    exec(&f.client, "ALTER INDEX items_name_idx RENAME TO items_by_name").await;
    exec(&f.client, "ALTER TABLE items ADD CONSTRAINT kind_small CHECK (kind < 10)").await;
    exec(&f.client, "ALTER TABLE items RENAME CONSTRAINT kind_small TO kind_tiny").await;
    exec(&f.client, "ALTER TABLE items RENAME TO goods").await;
    for p in &ps {
        let rel = format!("goods_{}", p.shard);
        assert!(exists(f.worker_for(p), &rel).await, "shard {} renamed", p.shard);
        let ix: Vec<String> = indexes(f.worker_for(p), &rel).await.into_iter().map(|i| i.0).collect();
        assert!(ix.contains(&format!("items_by_name_{}", p.shard)), "{ix:?}");
        let cs: Vec<String> = constraints(f.worker_for(p), &rel).await.into_iter().map(|c| c.0).collect();
        assert!(cs.contains(&format!("kind_tiny_{}", p.shard)), "{cs:?}");
    }
    assert_eq!(count(&f.client, "SELECT count(*) FROM goods WHERE id = 5").await, 1);
    assert_eq!(
        rows(&f.client, "SELECT shard_name FROM citus_shards WHERE table_name = 'goods'::regclass ORDER BY 1 LIMIT 1").await[0][0]
            .as_deref()
            .map(|s| s.starts_with("goods_")),
        Some(true)
    );
    fails_with(&f.client, "INSERT INTO goods VALUES (100, 50, 'x')", "23514").await;

    // Constraints added without names: the shards' copies are named after
    // the names PostgreSQL chose for the shell's, so DROP CONSTRAINT finds them.
    exec(&f.client, "ALTER TABLE goods ADD CHECK (kind >= 0), ADD UNIQUE (id, name)").await;
    let shell: Vec<String> = constraints(&coordinator_db, "goods").await.into_iter().map(|c| c.0).collect();
    for name in ["goods_kind_check", "goods_id_name_key"] {
        assert!(shell.contains(&name.to_string()), "{shell:?}");
        for p in &ps {
            let cs: Vec<String> = constraints(f.worker_for(p), &format!("goods_{}", p.shard)).await.into_iter().map(|c| c.0).collect();
            assert!(cs.contains(&format!("{name}_{}", p.shard)), "shard {}: {cs:?}", p.shard);
        }
    }
    exec(&f.client, "ALTER TABLE goods DROP CONSTRAINT goods_kind_check, DROP CONSTRAINT goods_id_name_key").await;
    for p in &ps {
        let cs: Vec<String> = constraints(f.worker_for(p), &format!("goods_{}", p.shard)).await.into_iter().map(|c| c.0).collect();
        assert!(!cs.iter().any(|c| c.starts_with("goods_kind_check") || c.starts_with("goods_id_name_key")), "shard {}: {cs:?}", p.shard);
    }
}

#[tokio::test]
async fn statistics_triggers_and_policies_reach_every_shard() {
    let f = Fixture::start().await;
    let ps = f.distributed("items", "id int PRIMARY KEY, kind int, owner text, touched int DEFAULT 0", "id").await;
    exec(&f.client, "CREATE FUNCTION bump() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN NEW.touched := NEW.touched + 1; RETURN NEW; END $$").await;
    exec(&f.client, "CREATE TRIGGER items_bump BEFORE UPDATE ON items FOR EACH ROW EXECUTE FUNCTION bump()").await;
    exec(&f.client, &format!("INSERT INTO items (id, kind, owner) VALUES {}", values(1..=20, |k| format!("{k}, {}, 'o{}'", k % 4, k % 2)))).await;
    exec(&f.client, "UPDATE items SET kind = kind + 1").await;
    assert_eq!(value(&f.client, "SELECT sum(touched) FROM items").await.as_deref(), Some("20"));
    let triggers =
        |rel: &str| format!("SELECT tgname::text FROM pg_trigger WHERE tgrelid = 'public.{rel}'::regclass AND NOT tgisinternal ORDER BY 1");
    exec(&f.client, "ALTER TRIGGER items_bump ON items RENAME TO items_touch").await;
    assert_eq!(shard_names(&f, triggers, "items", &ps).await, vec![vec!["items_touch".to_string()]; ps.len()]);
    exec(&f.client, "DROP TRIGGER items_touch ON items").await;
    assert_eq!(shard_names(&f, triggers, "items", &ps).await, vec![Vec::<String>::new(); ps.len()]);
    exec(&f.client, "UPDATE items SET kind = kind + 1").await;
    assert_eq!(value(&f.client, "SELECT sum(touched) FROM items").await.as_deref(), Some("20"));

    let statistics = |rel: &str| format!("SELECT stxname::text FROM pg_statistic_ext WHERE stxrelid = 'public.{rel}'::regclass");
    exec(&f.client, "CREATE STATISTICS items_kind_owner ON kind, owner FROM items").await;
    let named = ps.iter().map(|p| vec![format!("items_kind_owner_{}", p.shard)]).collect::<Vec<_>>();
    assert_eq!(shard_names(&f, statistics, "items", &ps).await, named);
    exec(&f.client, "DROP STATISTICS items_kind_owner").await;
    assert_eq!(shard_names(&f, statistics, "items", &ps).await, vec![Vec::<String>::new(); ps.len()]);

    exec(&f.client, "ALTER TABLE items ENABLE ROW LEVEL SECURITY; CREATE POLICY odd_only ON items USING (owner = 'o1')").await;
    let policies = |rel: &str| format!("SELECT polname::text FROM pg_policy WHERE polrelid = 'public.{rel}'::regclass");
    assert_eq!(shard_names(&f, policies, "items", &ps).await, vec![vec!["odd_only".to_string()]; ps.len()]);
    exec(&f.client, "DROP POLICY odd_only ON items").await;
    assert_eq!(shard_names(&f, policies, "items", &ps).await, vec![Vec::<String>::new(); ps.len()]);

    // What is not supported yet says so, and how to get by.
    exec(&f.client, "MERGE INTO items USING (SELECT 100000 AS id) s ON items.id = s.id WHEN NOT MATCHED THEN INSERT (id) VALUES (s.id)").await;
    assert_eq!(value(&f.client, "SELECT count(*) FROM items WHERE id = 100000").await.as_deref(), Some("1"));
    fails_with(&f.client, "MERGE INTO items USING (SELECT 1 AS id) s ON items.owner = 'x' WHEN NOT MATCHED THEN INSERT (id) VALUES (s.id)", "0A000")
        .await;
    exec(&f.client, "CREATE TABLE events (id int, at date) PARTITION BY RANGE (at); CREATE TABLE events_2024 PARTITION OF events FOR VALUES FROM ('2024-01-01') TO ('2025-01-01')").await;
    let e = fails_with(&f.client, "SELECT create_distributed_table('events_2024', 'id')", "0A000").await;
    assert!(e.hint().is_some_and(|h| h.contains("Distribute \"events\"")), "{e:?}");
}

#[tokio::test]
async fn partitioned_tables_are_distributed_with_their_partitions() {
    let f = Fixture::start().await;
    exec(
        &f.client,
        "CREATE TABLE events (tenant int NOT NULL, at date NOT NULL, v int) PARTITION BY RANGE (at);
         CREATE TABLE events_2024 PARTITION OF events FOR VALUES FROM ('2024-01-01') TO ('2025-01-01');
         CREATE TABLE events_2025 PARTITION OF events FOR VALUES FROM ('2025-01-01') TO ('2026-01-01');
         INSERT INTO events SELECT g % 10, date '2024-06-01' + g, g FROM generate_series(1, 400) g;",
    )
    .await;
    fails_with(&f.client, "SELECT create_distributed_table('events_2024', 'tenant')", "0A000").await;
    fails_with(&f.client, "SELECT create_reference_table('events')", "0A000").await;
    exec(&f.client, "SELECT create_distributed_table('events', 'tenant')").await;

    // One co-location group; each partition's shard is a partition of the
    // parent's shard with the same index, on the same node.
    let groups = column(&f.client, "SELECT DISTINCT colocationid::text FROM pg_dist_partition WHERE logicalrelid::text LIKE 'events%'").await;
    assert_eq!(groups.len(), 1, "{groups:?}");
    let parent = f.placements("events").await;
    for partition in ["events_2024", "events_2025"] {
        let ps = f.placements(partition).await;
        assert_eq!(ps.len(), SHARD_COUNT);
        for (p, parent_p) in ps.iter().zip(&parent) {
            assert_eq!(p.worker, parent_p.worker, "{partition}: shard {} lives with the parent's", p.shard);
            let attached = value(
                f.worker_for(p),
                &format!("SELECT inhparent::regclass::text FROM pg_inherits WHERE inhrelid = 'public.{}'::regclass", p.rel(partition)),
            )
            .await;
            assert_eq!(attached, Some(parent_p.rel("events")), "{partition}: shard {}", p.shard);
        }
    }
    assert_eq!(count(&f.client, "SELECT count(*) FROM events_2025").await, 187, "days 214 to 400 after 2024-06-01");
    assert_eq!(count(&f.cluster.connect_coordinator_db().await, "SELECT count(*) FROM events").await, 0, "the shells hold no rows");

    // A key and a date range reach one shard of one partition.
    let plan = column(&f.client, "EXPLAIN (COSTS OFF) SELECT count(*) FROM events WHERE tenant = 3 AND at BETWEEN '2024-07-01' AND '2024-07-31'")
        .await
        .join("\n");
    assert!(plan.contains("Task Count: 1") && plan.contains("Seq Scan on events_2024_"), "{plan}");
    assert!(!plan.contains("events_2025_"), "{plan}");

    // Dropping the parent drops every partition's shards and catalog rows.
    exec(&f.client, "DROP TABLE events").await;
    assert_eq!(count(&f.client, "SELECT count(*) FROM pg_dist_partition WHERE logicalrelid::text LIKE 'events%'").await, 0);
    for (i, w) in f.workers.iter().enumerate() {
        assert_eq!(count(w, "SELECT count(*) FROM pg_class WHERE relname LIKE 'events%' AND relkind IN ('r', 'p')").await, 0, "worker {}", i + 1);
    }
}
