//! Roles and privileges as on PostgreSQL: roles created through Tessera exist
//! on every node, GRANT/REVOKE on distributed and reference tables reach
//! their shards, and an ordinary role sees what it would see on a plain
//! PostgreSQL: the same rows, and the same 42501 errors where it may not.

mod common;
use common::{connect_as, outcome, PlainPostgres, TestCluster};

const SCHEMA: &str = "
    CREATE ROLE app LOGIN;
    CREATE ROLE reader LOGIN;
    CREATE ROLE auditors;
    GRANT auditors TO reader;
    CREATE TABLE accounts (id int PRIMARY KEY, owner text, balance int);
    CREATE TABLE kinds (id int PRIMARY KEY, name text);
    CREATE TABLE secrets (id int PRIMARY KEY, code text);
    CREATE TABLE ledger (id int NOT NULL, note text);";

const DISTRIBUTE: &str = "
    SELECT create_distributed_table('accounts', 'id');
    SELECT create_reference_table('kinds');
    SELECT create_distributed_table('secrets', 'id');
    SELECT create_distributed_table('ledger', 'id', colocate_with => 'accounts');";

const DATA_AND_GRANTS: &str = "
    INSERT INTO accounts SELECT g, 'owner ' || g, g * 10 FROM generate_series(1, 20) g;
    INSERT INTO kinds VALUES (1, 'checking'), (2, 'savings');
    INSERT INTO secrets VALUES (1, 'x');
    GRANT SELECT, INSERT, UPDATE ON accounts, kinds TO app;
    REVOKE UPDATE ON accounts FROM app;
    GRANT SELECT (id, owner) ON accounts TO auditors;
    GRANT SELECT ON secrets TO auditors;
    REVOKE SELECT ON secrets FROM auditors;
    GRANT SELECT, INSERT ON ledger TO app;";

/// Statements each role runs, in order, on both servers.
const AS_APP: &[&str] = &[
    "SELECT count(*), sum(balance) FROM accounts",
    "SELECT balance FROM accounts WHERE id = 7",
    "SELECT name FROM kinds ORDER BY id",
    "INSERT INTO accounts VALUES (100, 'new', 5)",
    "SELECT owner FROM accounts WHERE id = 100",
    "UPDATE accounts SET balance = 0 WHERE id = 7",
    "UPDATE kinds SET name = 'current' WHERE id = 1",
    "DELETE FROM accounts WHERE id = 7",
    "SELECT code FROM secrets WHERE id = 1",
    "SELECT count(*) FROM secrets",
    // Writing WITH queries run whole on a worker, as the role, reaching the
    // other node's shards through the link relay as that role too.
    "WITH picked AS (SELECT id, owner FROM accounts WHERE id > 12) INSERT INTO ledger SELECT id, owner FROM picked",
    "SELECT count(*), min(note), max(note) FROM ledger",
    "WITH gone AS (DELETE FROM accounts WHERE id = 9 RETURNING id) INSERT INTO ledger SELECT id, 'gone' FROM gone",
    "SELECT count(*) FROM accounts WHERE id = 9",
];

const AS_READER: &[&str] = &[
    "SELECT id, owner FROM accounts WHERE id = 3",
    "SELECT count(id) FROM accounts",
    "SELECT balance FROM accounts WHERE id = 3",
    "SELECT count(*) FROM kinds",
    "INSERT INTO accounts (id, owner) VALUES (200, 'no')",
    "SELECT code FROM secrets",
    "WITH picked AS (SELECT id, owner FROM accounts WHERE id = 3) INSERT INTO ledger SELECT id, owner FROM picked",
];

#[tokio::test]
async fn ordinary_roles_get_what_postgresql_gives_them() {
    let cluster = TestCluster::start(2);
    let plain = PlainPostgres::start();
    let (c, p) = (cluster.connect().await, plain.connect().await);
    c.batch_execute(SCHEMA).await.unwrap();
    c.batch_execute(DISTRIBUTE).await.unwrap();
    c.batch_execute(DATA_AND_GRANTS).await.unwrap();
    p.batch_execute(SCHEMA).await.unwrap();
    p.batch_execute(DATA_AND_GRANTS).await.unwrap();

    // The roles, and the grants on the shards, are on every worker.
    for w in 0..2 {
        let worker = cluster.connect_worker(w).await;
        let roles = outcome(&worker, "SELECT string_agg(rolname, ',' ORDER BY rolname) FROM pg_roles WHERE rolname IN ('app', 'reader', 'auditors')")
            .await
            .unwrap();
        assert_eq!(roles, vec![vec![Some("app,auditors,reader".to_string())]], "worker {w}");
        let granted = outcome(
            &worker,
            "SELECT bool_and(has_table_privilege('app', oid, 'INSERT')) FROM pg_class WHERE relname LIKE 'accounts\\_%' AND relkind = 'r'",
        )
        .await
        .unwrap();
        assert_eq!(granted, vec![vec![Some("t".to_string())]], "worker {w}");
    }

    for (role, statements) in [("app", AS_APP), ("reader", AS_READER)] {
        let (c, p) = (connect_as(cluster.port, role).await, connect_as(plain.instance.port, role).await);
        for sql in statements {
            let want = outcome(&p, sql).await;
            assert_eq!(outcome(&c, sql).await, want, "as {role}: {sql}");
        }
    }

    // Revoked everywhere, and dropped everywhere.
    for admin in [&c, &p] {
        admin.batch_execute("REVOKE ALL ON accounts, kinds, ledger FROM app; REVOKE SELECT (id, owner) ON accounts FROM auditors").await.unwrap();
    }
    let (ca, pa) = (connect_as(cluster.port, "app").await, connect_as(plain.instance.port, "app").await);
    for sql in ["SELECT count(*) FROM accounts", "SELECT name FROM kinds WHERE id = 2"] {
        assert_eq!(outcome(&ca, sql).await, outcome(&pa, sql).await, "after REVOKE: {sql}");
    }
    drop(ca);
    c.batch_execute("DROP ROLE app").await.unwrap();
    for w in 0..2 {
        let worker = cluster.connect_worker(w).await;
        assert_eq!(outcome(&worker, "SELECT count(*) FROM pg_roles WHERE rolname = 'app'").await.unwrap(), vec![vec![Some("0".to_string())]]);
    }
}

/// Privileges granted before a table is distributed, and the owner's own,
/// hold on its shards afterwards (the workers check them there).
#[tokio::test]
async fn grants_made_before_distribution_reach_the_shards() {
    let cluster = TestCluster::start(2);
    let plain = PlainPostgres::start();
    let (c, p) = (cluster.connect().await, plain.connect().await);
    let schema = "CREATE ROLE owner_role LOGIN; CREATE ROLE viewer LOGIN;
        CREATE TABLE ledger (id int PRIMARY KEY, memo text, amount int);
        CREATE TABLE labels (id int PRIMARY KEY, label text);
        INSERT INTO ledger SELECT g, 'm' || g, g FROM generate_series(1, 50) g;
        INSERT INTO labels VALUES (1, 'one');
        ALTER TABLE ledger OWNER TO owner_role;
        GRANT SELECT (id, memo) ON ledger TO viewer;
        GRANT SELECT ON labels TO PUBLIC;";
    c.batch_execute(schema).await.unwrap();
    p.batch_execute(schema).await.unwrap();
    c.batch_execute("SELECT create_distributed_table('ledger', 'id'); SELECT create_reference_table('labels')").await.unwrap();
    for (role, statements) in [
        ("owner_role", &["SELECT count(*), sum(amount) FROM ledger", "UPDATE ledger SET amount = 0 WHERE id = 3", "SELECT label FROM labels"][..]),
        ("viewer", &["SELECT memo FROM ledger WHERE id = 9", "SELECT amount FROM ledger WHERE id = 9", "SELECT count(*) FROM labels"][..]),
    ] {
        let (c, p) = (connect_as(cluster.port, role).await, connect_as(plain.instance.port, role).await);
        for sql in statements {
            let want = outcome(&p, sql).await;
            assert_eq!(outcome(&c, sql).await, want, "as {role}: {sql}");
        }
    }
}

/// An ordinary role's views and functions over its distributed table answer
/// as on PostgreSQL, also inside the block that creates them (whose catalog
/// is read as that role): SQL functions inlined, PL/pgSQL ones (reading the
/// view, which the workers have too) run on a worker.
#[tokio::test]
async fn an_ordinary_roles_views_and_functions() {
    let cluster = TestCluster::start(2);
    let plain = PlainPostgres::start();
    let setup = "CREATE ROLE maker LOGIN; GRANT CREATE ON SCHEMA public TO maker;";
    for admin in [cluster.connect().await, plain.connect().await] {
        admin.batch_execute(setup).await.unwrap();
    }
    let (c, p) = (connect_as(cluster.port, "maker").await, connect_as(plain.instance.port, "maker").await);
    let table = "CREATE TABLE visits (id int, site int, ms int); INSERT INTO visits SELECT g, g % 4, g * 7 % 300 FROM generate_series(1, 120) g;";
    c.batch_execute(table).await.unwrap();
    p.batch_execute(table).await.unwrap();
    c.batch_execute("SELECT create_distributed_table('visits', 'site')").await.unwrap();
    let statements = [
        "BEGIN",
        "CREATE VIEW slow_visits AS SELECT id, site, ms FROM visits WHERE ms > 200",
        "SELECT count(*), sum(ms) FROM slow_visits",
        "SELECT id FROM slow_visits WHERE site = 2 ORDER BY id",
        "COMMIT",
        "SELECT site, count(*) FROM slow_visits GROUP BY site ORDER BY site",
        "CREATE FUNCTION site_visits(s int) RETURNS bigint LANGUAGE sql AS $$ SELECT count(*) FROM visits WHERE site = s $$",
        "SELECT site_visits(1)",
        "CREATE FUNCTION slow_share(s int) RETURNS numeric LANGUAGE plpgsql AS $$ BEGIN RETURN (SELECT count(*) FROM slow_visits WHERE site = s) / 30.0; END $$",
        "SELECT slow_share(1)::text",
        "DROP VIEW slow_visits CASCADE",
        "SELECT slow_share(1)",
    ];
    for sql in statements {
        assert_eq!(outcome(&c, sql).await, outcome(&p, sql).await, "as maker: {sql}");
    }
    assert_eq!(outcome(&p, "SELECT site_visits(1)").await, Ok(vec![vec![Some("30".to_string())]]));
    assert_eq!(outcome(&p, "SELECT slow_share(1)").await.unwrap_err().0, "42P01", "the view is gone on every node");
}
