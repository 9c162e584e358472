//! Worker-side relations: on every worker each distributed table exists under
//! its own name as a partitioned parent of the worker's shards and foreign
//! tables for the others', each reference table as a view of its copy. Any
//! SQL run on a worker sees whole tables, kept exact through DDL, partition
//! changes and node changes; user code there writes every copy of a
//! reference table; roles see there what they see through Tessera.

mod common;
use common::{connect, connect_as, sqlstate, text_rows, PlainPostgres, TestCluster};
use tokio_postgres::Client;

/// `count(*)` and a checksum of every row of `table`, as `c` sees it.
async fn fingerprint(c: &Client, table: &str) -> Vec<Vec<Option<String>>> {
    text_rows(c, &format!("SELECT count(*), sum(hashtext(t::text)) FROM {table} t")).await
}

/// Every worker reads `table` exactly as the coordinator does.
async fn workers_agree(coordinator: &Client, workers: &[Client], table: &str, when: &str) {
    let expected = fingerprint(coordinator, table).await;
    assert_ne!(expected[0][0].as_deref(), Some("0"), "{table} should hold rows ({when})");
    for (i, w) in workers.iter().enumerate() {
        assert_eq!(fingerprint(w, table).await, expected, "worker {i} reads {table} differently {when}");
    }
}

/// `workers_agree` once the other nodes' parts of writes made by sessions
/// on a worker itself are settled: the link relay commits them on its
/// interval (a session through Tessera has them settled before its answer).
async fn workers_agree_when_settled(coordinator: &Client, workers: &[Client], table: &str, when: &str) {
    let started = std::time::Instant::now();
    while started.elapsed() < std::time::Duration::from_secs(10) {
        let expected = fingerprint(coordinator, table).await;
        let mut agreeing = true;
        for w in workers {
            agreeing &= fingerprint(w, table).await == expected;
        }
        if agreeing {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    workers_agree(coordinator, workers, table, when).await;
}

/// A worker's connection (its parents know the modulus and remainders).
async fn owner_db(cluster: &TestCluster) -> Client {
    cluster.connect_worker(0).await
}

async fn exists_on(c: &Client, relation: &str) -> bool {
    text_rows(c, &format!("SELECT to_regclass('{relation}') IS NOT NULL")).await[0][0].as_deref() == Some("t")
}

#[tokio::test]
async fn worker_side_relations_follow_every_change() {
    let cluster = TestCluster::start(2);
    let c = cluster.connect().await;
    c.batch_execute(
        "CREATE TABLE wr_kinds (k int PRIMARY KEY, label text);
         SELECT create_reference_table('wr_kinds');
         INSERT INTO wr_kinds VALUES (0, 'zero'), (1, 'one'), (2, 'two');
         CREATE TABLE wr_orders (id int, customer_id int, amount numeric DEFAULT 1, note text, PRIMARY KEY (customer_id, id));
         SELECT create_distributed_table('wr_orders', 'customer_id');
         INSERT INTO wr_orders SELECT g, g % 50, g / 3.0, 'n' || g FROM generate_series(1, 2000) g;
         CREATE TABLE wr_events (day date, customer_id int, what text) PARTITION BY RANGE (day);
         CREATE TABLE wr_events_jan PARTITION OF wr_events FOR VALUES FROM ('2026-01-01') TO ('2026-02-01');
         CREATE TABLE wr_events_feb PARTITION OF wr_events FOR VALUES FROM ('2026-02-01') TO ('2026-03-01');
         SELECT create_distributed_table('wr_events', 'customer_id', colocate_with => 'wr_orders');
         INSERT INTO wr_events SELECT DATE '2026-01-01' + g % 59, g % 50, 'e' || g FROM generate_series(1, 600) g;",
    )
    .await
    .unwrap();
    let mut workers = Vec::new();
    for i in 0..2 {
        workers.push(cluster.connect_worker(i).await);
    }
    for table in ["wr_kinds", "wr_orders", "wr_events", "wr_events_jan", "wr_events_feb"] {
        workers_agree(&c, &workers, table, "after distribution").await;
    }

    // A key's rows are found by partition pruning alone: on the worker that
    // holds its shard, no foreign scan.
    let placement =
        text_rows(&c, "SELECT nodeport, shardid FROM citus_shards WHERE table_name = 'wr_orders'::regclass ORDER BY shardid LIMIT 1").await;
    let owner_port: u16 = placement[0][0].as_deref().unwrap().parse().unwrap();
    let shard_id = placement[0][1].clone().unwrap();
    let key = text_rows(
        &owner_db(&cluster).await,
        "SELECT k FROM generate_series(1, 49) k WHERE satisfies_hash_partition('wr_orders'::regclass, 32, 0, k) LIMIT 1",
    )
    .await;
    let owner = connect(owner_port).await;
    assert!(!key.is_empty());
    let plan = text_rows(&owner, &format!("EXPLAIN SELECT * FROM wr_orders WHERE customer_id = {}", key[0][0].as_deref().unwrap())).await;
    let plan: String = plan.into_iter().map(|r| r[0].clone().unwrap() + "\n").collect();
    assert!(plan.contains(&format!("wr_orders_{shard_id}")) && !plan.contains("Foreign Scan"), "{plan}");

    // Column changes go through the parents; reference tables' views are made again.
    for ddl in [
        "ALTER TABLE wr_orders ADD COLUMN kind int DEFAULT 1 REFERENCES wr_kinds (k)",
        "ALTER TABLE wr_orders ADD COLUMN extra int DEFAULT 5 CHECK (extra > 0)",
        "ALTER TABLE wr_orders RENAME COLUMN note TO remark",
        "ALTER TABLE wr_orders ALTER COLUMN amount TYPE float8",
        "ALTER TABLE wr_orders DROP COLUMN extra",
        "ALTER TABLE wr_orders ALTER COLUMN remark SET DEFAULT 'none'",
        "ALTER TABLE wr_kinds ADD COLUMN rank int DEFAULT 7",
        "ALTER TABLE wr_events ADD COLUMN seen bool DEFAULT false",
        "ALTER TABLE wr_events RENAME COLUMN what TO detail",
    ] {
        c.batch_execute(ddl).await.unwrap_or_else(|e| panic!("{ddl}: {e}"));
        for table in ["wr_kinds", "wr_orders", "wr_events", "wr_events_jan"] {
            workers_agree(&c, &workers, table, &format!("after {ddl}")).await;
        }
    }
    // Constraints added with a column hold on every shard.
    let err = c.batch_execute("UPDATE wr_orders SET kind = 9 WHERE customer_id = 3").await.unwrap_err();
    assert_eq!(sqlstate(&err), "23503", "{err}");
    // Rows inserted on a worker through the parent take its defaults.
    owner.batch_execute(&format!("INSERT INTO wr_orders (id, customer_id) VALUES (9000, {})", key[0][0].as_deref().unwrap())).await.unwrap();
    assert_eq!(
        text_rows(&c, "SELECT amount, remark, kind FROM wr_orders WHERE id = 9000").await,
        vec![vec![Some("1".into()), Some("none".into()), Some("1".into())]]
    );

    // Renamed tables keep their foreign tables pointing at the renamed shards.
    c.batch_execute("ALTER TABLE wr_orders RENAME TO wr_sales").await.unwrap();
    workers_agree(&c, &workers, "wr_sales", "after RENAME").await;

    // A partition detached becomes a table of its own on the workers too;
    // attached again, it is reached through the parent alone.
    c.batch_execute("ALTER TABLE wr_events DETACH PARTITION wr_events_feb").await.unwrap();
    workers_agree(&c, &workers, "wr_events_feb", "after DETACH").await;
    workers_agree(&c, &workers, "wr_events", "after DETACH").await;
    c.batch_execute("ALTER TABLE wr_events ATTACH PARTITION wr_events_feb FOR VALUES FROM ('2026-02-01') TO ('2026-03-01')").await.unwrap();
    // Partitions are views of their rows in the root's parent.
    for table in ["wr_events", "wr_events_jan", "wr_events_feb"] {
        workers_agree(&c, &workers, table, "after ATTACH").await;
    }

    // A node added later gets every relation, all of its partitions foreign.
    let extra = PlainPostgres::start_node_for(&cluster);
    c.execute("SELECT citus_add_node('127.0.0.1', $1)", &[&(extra.instance.port as i32)]).await.unwrap();
    workers.push(extra.connect().await);
    for table in ["wr_kinds", "wr_sales", "wr_events", "wr_events_feb"] {
        workers_agree(&c, &workers, table, "after citus_add_node").await;
    }
    // User code on any worker writes every copy of a reference table, the
    // new node's too: a function called through Tessera, a trigger on a
    // distributed table, and a statement run on a worker itself.
    c.batch_execute(
        "CREATE FUNCTION wr_add_kind(k int) RETURNS int LANGUAGE sql AS $$ INSERT INTO wr_kinds (k, label) VALUES (k, 'f' || k) RETURNING k $$;
         SELECT wr_add_kind(10);
         CREATE FUNCTION wr_log_sale() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN UPDATE wr_kinds SET label = label || '+' WHERE k = NEW.kind; RETURN NEW; END $$;
         CREATE TRIGGER wr_log_sale AFTER INSERT ON wr_sales FOR EACH ROW EXECUTE FUNCTION wr_log_sale();
         INSERT INTO wr_sales (id, customer_id, kind) VALUES (9001, 7, 10), (9002, 8, 10);",
    )
    .await
    .unwrap();
    workers[2].batch_execute("INSERT INTO wr_kinds (k, label) VALUES (11, 'on the new node'); DELETE FROM wr_kinds WHERE k = 0").await.unwrap();
    workers_agree_when_settled(&c, &workers, "wr_kinds", "after writes on the workers").await;
    assert_eq!(
        text_rows(&c, "SELECT k, label, rank FROM wr_kinds WHERE k >= 10 ORDER BY k").await,
        vec![
            vec![Some("10".into()), Some("f10++".into()), Some("7".into())],
            vec![Some("11".into()), Some("on the new node".into()), Some("7".into())]
        ]
    );
    // A write that fails on the way leaves no copy changed.
    let err = workers[0].batch_execute("INSERT INTO wr_kinds (k) VALUES (12), (11)").await.unwrap_err();
    assert_eq!(sqlstate(&err), "23505", "{err}");
    workers_agree(&c, &workers, "wr_kinds", "after a failed write on a worker").await;
    c.batch_execute("CREATE TABLE wr_late (id int, v text); SELECT create_distributed_table('wr_late', 'id'); INSERT INTO wr_late SELECT g, 'v' FROM generate_series(1, 300) g")
        .await
        .unwrap();
    workers_agree(&c, &workers, "wr_late", "for a table distributed over three nodes").await;

    // Dropped and undistributed tables leave nothing behind on the workers.
    c.batch_execute("DROP TABLE wr_sales; SELECT undistribute_table('wr_late')").await.unwrap();
    for w in &workers {
        assert!(!exists_on(w, "wr_sales").await && !exists_on(w, "wr_late").await);
        assert_eq!(
            text_rows(w, "SELECT count(*) FROM pg_class WHERE relname LIKE 'wr\\_sales%' OR relname LIKE 'wr\\_late%'").await[0][0].as_deref(),
            Some("0")
        );
    }
    assert_eq!(text_rows(&c, "SELECT count(*) FROM wr_late").await[0][0].as_deref(), Some("300"));

    // A node removed with its copy is written no more.
    c.execute("SELECT citus_remove_node('127.0.0.1', $1)", &[&(extra.instance.port as i32)]).await.unwrap();
    let removed = workers.pop().unwrap();
    workers[1].batch_execute("INSERT INTO wr_kinds (k, label) VALUES (13, 'after the removal')").await.unwrap();
    workers_agree_when_settled(&c, &workers, "wr_kinds", "after citus_remove_node").await;
    assert_eq!(text_rows(&removed, "SELECT count(*) FROM wr_kinds WHERE k = 13").await[0][0].as_deref(), Some("0"));
}

#[tokio::test]
async fn roles_see_on_a_worker_what_they_see_through_tessera() {
    let cluster = TestCluster::start(2);
    let c = cluster.connect().await;
    c.batch_execute(
        "CREATE ROLE wr_app LOGIN;
         CREATE TABLE wr_notes (tenant int, id int, body text);
         SELECT create_distributed_table('wr_notes', 'tenant');
         INSERT INTO wr_notes SELECT g % 10, g, 'b' || g FROM generate_series(1, 500) g;
         CREATE TABLE wr_secret (id int, v text);
         SELECT create_distributed_table('wr_secret', 'id');
         INSERT INTO wr_secret SELECT g, 'x' FROM generate_series(1, 100) g;
         GRANT SELECT ON wr_notes TO wr_app;
         ALTER TABLE wr_notes ENABLE ROW LEVEL SECURITY;
         CREATE POLICY wr_low ON wr_notes TO wr_app USING (tenant < 4);
         CREATE FUNCTION wr_visible() RETURNS bigint LANGUAGE plpgsql AS $$ BEGIN RETURN (SELECT count(*) FROM wr_notes); END $$;",
    )
    .await
    .unwrap();
    let app = connect_as(cluster.port, "wr_app").await;
    let through_tessera = text_rows(&app, "SELECT count(*) FROM wr_notes").await;
    assert_eq!(through_tessera[0][0].as_deref(), Some("200"));
    // User code run for the role sees what the role may see.
    assert_eq!(text_rows(&app, "SELECT wr_visible()").await, through_tessera);
    for port in &cluster.cluster.state.worker_ports {
        let on_worker = connect_as(*port, "wr_app").await;
        assert_eq!(text_rows(&on_worker, "SELECT count(*) FROM wr_notes").await, through_tessera, "worker {port}");
        let err = on_worker.simple_query("SELECT * FROM wr_secret").await.unwrap_err();
        assert_eq!(sqlstate(&err), "42501", "{err}");
        let err = on_worker.simple_query("SELECT * FROM tessera_remote.wr_notes_102009").await;
        assert!(err.is_err(), "the foreign tables are the owner's");
    }
    let err = app.simple_query("SELECT count(*) FROM wr_secret").await.unwrap_err();
    assert_eq!(sqlstate(&err), "42501", "{err}");

    // Roles created later can use the foreign tables at once; a role goes
    // with its user mappings.
    c.batch_execute("BEGIN; CREATE ROLE wr_late LOGIN; GRANT SELECT ON wr_secret TO wr_late; COMMIT").await.unwrap();
    let late = connect_as(cluster.cluster.state.worker_ports[0], "wr_late").await;
    assert_eq!(text_rows(&late, "SELECT count(*) FROM wr_secret").await[0][0].as_deref(), Some("100"));
    drop(late);
    c.batch_execute("REVOKE ALL ON wr_secret FROM wr_late; DROP POLICY wr_low ON wr_notes; DROP ROLE wr_late").await.unwrap();
    assert_eq!(
        text_rows(&connect_as(cluster.cluster.state.worker_ports[1], "wr_app").await, "SELECT count(*) FROM wr_notes").await[0][0].as_deref(),
        Some("0")
    );

    // A node added later gets the tables' grants, row security and policies
    // on its relations too.
    c.batch_execute("CREATE POLICY wr_mid ON wr_notes TO wr_app USING (tenant BETWEEN 2 AND 4)").await.unwrap();
    let through_tessera = text_rows(&app, "SELECT count(*) FROM wr_notes").await;
    assert_eq!(through_tessera[0][0].as_deref(), Some("150"));
    let extra = PlainPostgres::start_node_for(&cluster);
    c.execute("SELECT citus_add_node('127.0.0.1', $1)", &[&(extra.instance.port as i32)]).await.unwrap();
    let on_new_node = connect_as(extra.instance.port, "wr_app").await;
    assert_eq!(text_rows(&on_new_node, "SELECT count(*) FROM wr_notes").await, through_tessera);
    let err = on_new_node.simple_query("SELECT * FROM wr_secret").await.unwrap_err();
    assert_eq!(sqlstate(&err), "42501", "{err}");
}
