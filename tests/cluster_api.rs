//! The Citus-compatible cluster API through the wire protocol: nodes, creating
//! distributed and reference tables, co-location, undistributing, catalog views.

mod common;
use common::{error_text, sqlstate, text_rows, TestCluster};
use std::time::Duration;

#[tokio::test]
async fn nodes_are_registered_and_listed() {
    let cluster = TestCluster::start(2);
    let c = cluster.connect().await;
    let ports: Vec<i64> =
        c.query("SELECT node_port FROM master_get_active_worker_nodes() ORDER BY node_port", &[]).await.unwrap().iter().map(|r| r.get(0)).collect();
    let mut expected: Vec<i64> = cluster.cluster.state.worker_ports.iter().map(|p| *p as i64).collect();
    expected.sort();
    assert_eq!(ports, expected);

    // Adding a known node is idempotent and returns its id.
    let port = cluster.cluster.state.worker_ports[0] as i32;
    let id: i32 = c.query_one("SELECT citus_add_node('127.0.0.1', $1)", &[&port]).await.unwrap().get(0);
    let known: i32 = c.query_one("SELECT nodeid FROM pg_dist_node WHERE nodeport = $1", &[&port]).await.unwrap().get(0);
    assert_eq!(id, known);
    assert_eq!(text_rows(&c, "SELECT count(*) FROM pg_dist_node").await, vec![vec![Some("2".to_string())]]);

    // An unreachable node is refused with an error naming it.
    let dead = tessera::cluster::instance::free_port().unwrap();
    let err = c.simple_query(&format!("SELECT master_add_node('127.0.0.1', {dead})")).await.unwrap_err();
    assert_eq!(sqlstate(&err), "08006");
    assert!(error_text(&err).contains(&format!("127.0.0.1:{dead}")), "{err}");
    assert_eq!(text_rows(&c, "SELECT count(*) FROM pg_dist_node").await, vec![vec![Some("2".to_string())]]);

    // A node holding shards cannot be removed.
    c.batch_execute("CREATE TABLE pinned (id int); SELECT create_distributed_table('pinned', 'id')").await.unwrap();
    let err = c.simple_query(&format!("SELECT citus_remove_node('127.0.0.1', {port})")).await.unwrap_err();
    assert_eq!(sqlstate(&err), "55006", "{err}");
}

/// After distribution every row sits in the shard PostgreSQL's own hash
/// partitioning assigns it, checked on the workers with satisfies_hash_partition.
#[tokio::test]
async fn rows_move_into_the_shards_the_hash_assigns() {
    let cluster = TestCluster::start(2);
    let c = cluster.connect().await;
    c.batch_execute(
        "CREATE TABLE items (key text PRIMARY KEY, n int);
         INSERT INTO items SELECT 'key-' || g || repeat('ż', g % 5), g FROM generate_series(1, 2000) g;
         SELECT create_distributed_table('items', 'key', shard_count => 8);",
    )
    .await
    .unwrap();
    assert_eq!(text_rows(&c, "SELECT count(*), sum(n) FROM items").await, vec![vec![Some("2000".into()), Some("2001000".into())]]);
    let shards = c
        .query("SELECT s.shardid, s.shardindex, n.nodeport FROM pg_dist_shard s JOIN pg_dist_placement p USING (shardid) JOIN pg_dist_node n ON n.groupid = p.groupid WHERE s.logicalrelid = 'items'::regclass", &[])
        .await
        .unwrap();
    assert_eq!(shards.len(), 8);
    let mut total = 0i64;
    for row in shards {
        let (id, index, port): (i64, i32, i32) = (row.get(0), row.get(1), row.get(2));
        let worker = common::connect(port as u16).await;
        worker.batch_execute("CREATE TABLE IF NOT EXISTS probe (key text) PARTITION BY HASH (key)").await.unwrap();
        let r = worker
            .query_one(
                &format!("SELECT count(*), count(*) FILTER (WHERE NOT satisfies_hash_partition('probe'::regclass, 8, {index}, key)) FROM items_{id}"),
                &[],
            )
            .await
            .unwrap();
        let (rows, misplaced): (i64, i64) = (r.get(0), r.get(1));
        assert_eq!(misplaced, 0, "shard {id} (index {index}) holds rows of other shards");
        assert!(rows > 100, "shard {id} holds only {rows} rows: the hash spreads badly");
        total += rows;
    }
    assert_eq!(total, 2000);
    // The shell on the coordinator database is empty now.
    let local = cluster.connect_coordinator_db().await;
    assert_eq!(text_rows(&local, "SELECT count(*) FROM items").await, vec![vec![Some("0".into())]]);
}

/// `get_shard_id_for_distribution_column` names the shard that holds each
/// value, for keys of several types (arrays too), given as typed values, as literals of
/// unknown type, as bind parameters and row by row in a query, to a role that
/// is not a superuser; a reference table has its one shard.
#[tokio::test]
async fn shard_ids_of_values_are_where_the_rows_live() {
    let cluster = TestCluster::start(2);
    let c = cluster.connect().await;
    c.batch_execute(
        "CREATE TABLE by_int (k int); CREATE TABLE by_text (k text); CREATE TABLE by_uuid (k uuid); CREATE TABLE by_day (k date);
         CREATE TABLE by_name (k varchar(20)); CREATE TABLE by_letters (k char(1)[]); CREATE TABLE lookup (k int);
         SELECT create_distributed_table('by_int', 'k', shard_count => 6); SELECT create_distributed_table('by_text', 'k');
         SELECT create_distributed_table('by_uuid', 'k'); SELECT create_distributed_table('by_day', 'k', shard_count => 5);
         SELECT create_distributed_table('by_name', 'k'); SELECT create_distributed_table('by_letters', 'k', shard_count => 7);
         SELECT create_reference_table('lookup');
         INSERT INTO by_int SELECT g - 20 FROM generate_series(1, 40) g;
         INSERT INTO by_text SELECT 'tenant-' || g || repeat('ż', g % 3) FROM generate_series(1, 40) g;
         INSERT INTO by_uuid SELECT md5(g::text)::uuid FROM generate_series(1, 40) g;
         INSERT INTO by_day SELECT date '2024-02-20' + g FROM generate_series(1, 40) g;
         INSERT INTO by_name SELECT 'n' || g FROM generate_series(1, 40) g;
         INSERT INTO by_letters SELECT ARRAY[chr(97 + g % 26), chr(97 + g % 5), NULL]::char(1)[] FROM generate_series(1, 37) g;
         INSERT INTO by_letters VALUES ('{}'), ('{{a,b},{c,d}}'), ('{\" \"}');
         CREATE ROLE shard_reader LOGIN;",
    )
    .await
    .unwrap();
    let reader = common::connect_as(cluster.port, "shard_reader").await;
    let worker = cluster.connect_worker(0).await;
    for table in ["by_int", "by_text", "by_uuid", "by_day", "by_name", "by_letters"] {
        // The worker's view of the table: every row with the shard it is in.
        let placed = text_rows(&worker, &format!("SELECT k::text, substring(tableoid::regclass::text FROM '_([0-9]+)$') FROM {table}")).await;
        assert_eq!(placed.len(), 40);
        let statement = reader.prepare(&format!("SELECT get_shard_id_for_distribution_column('{table}', $1::text)")).await.unwrap();
        for row in &placed {
            let (value, shard) = (row[0].clone().unwrap(), row[1].clone().unwrap());
            let bound: i64 = reader.query_one(&statement, &[&value]).await.unwrap().get(0);
            assert_eq!(bound.to_string(), shard, "{table}: value {value}");
            let literal = text_rows(&reader, &format!("SELECT get_shard_id_for_distribution_column('{table}', '{value}')")).await;
            assert_eq!(literal[0][0].as_deref(), Some(shard.as_str()), "{table}: literal '{value}'");
        }
    }
    // Typed values, and one call per row of a query.
    let by_query = text_rows(&reader, "SELECT g, get_shard_id_for_distribution_column('by_int', g) FROM generate_series(-19, 20) g ORDER BY g").await;
    let placed = text_rows(&worker, "SELECT k::text, substring(tableoid::regclass::text FROM '_([0-9]+)$') FROM by_int ORDER BY by_int.k").await;
    assert_eq!(by_query, placed);
    let typed = text_rows(
        &reader,
        "SELECT get_shard_id_for_distribution_column('by_day', date '2024-02-21'), get_shard_id_for_distribution_column('by_day', '2024-02-21')",
    )
    .await;
    assert_eq!(typed[0][0], typed[0][1]);
    let reference = text_rows(
        &reader,
        "SELECT get_shard_id_for_distribution_column('lookup'), (SELECT shardid FROM pg_dist_shard WHERE logicalrelid = 'lookup'::regclass)",
    )
    .await;
    assert_eq!(reference[0][0], reference[0][1]);
    assert!(reference[0][0].is_some());
    // Errors.
    c.batch_execute("CREATE TABLE local_only (k int)").await.unwrap();
    let e = reader.batch_execute("SELECT get_shard_id_for_distribution_column('local_only', 1)").await.unwrap_err();
    assert_eq!(sqlstate(&e), "42809", "{}", error_text(&e));
    let e = reader.batch_execute("SELECT get_shard_id_for_distribution_column('by_int')").await.unwrap_err();
    assert_eq!(sqlstate(&e), "22004", "{}", error_text(&e));
    let e = reader.batch_execute("SELECT get_shard_id_for_distribution_column('by_int', 'x')").await.unwrap_err();
    assert_eq!(sqlstate(&e), "22P02", "{}", error_text(&e));
    assert_eq!(text_rows(&reader, "SELECT 1").await, vec![vec![Some("1".into())]], "the session goes on");
}

#[tokio::test]
async fn create_distributed_table_errors_are_clear_and_harmless() {
    let cluster = TestCluster::start(2);
    let c = cluster.connect().await;
    c.batch_execute("CREATE TABLE t (id int, doc jsonb, email text UNIQUE)").await.unwrap();
    let cases = [
        ("SELECT create_distributed_table('missing', 'id')", "42P01"),
        ("SELECT create_distributed_table('t', 'nope')", "42703"),
        ("SELECT create_distributed_table('t', 'doc')", "0A000"),
        ("SELECT create_distributed_table('t', 'id')", "0A000"), // unique email without id
        ("SELECT create_distributed_table('t', 'id', shard_count => 0)", "22023"),
    ];
    for (sql, code) in cases {
        let err = c.simple_query(sql).await.unwrap_err();
        assert_eq!(sqlstate(&err), code, "{sql}: {err}");
    }
    assert_eq!(text_rows(&c, "SELECT count(*) FROM pg_dist_partition").await, vec![vec![Some("0".into())]]);
    c.batch_execute("ALTER TABLE t DROP CONSTRAINT t_email_key; SELECT create_distributed_table('t', 'id')").await.unwrap();
    let err = c.simple_query("SELECT create_distributed_table('t', 'id')").await.unwrap_err();
    assert_eq!(sqlstate(&err), "42P16");
    assert!(error_text(&err).contains("already distributed"));
    // Node management is not transactional here; it is refused inside a
    // block, as PostgreSQL refuses VACUUM (25001 active_sql_transaction).
    c.batch_execute("BEGIN").await.unwrap();
    let err = c.simple_query("SELECT citus_remove_node('127.0.0.1', 1)").await.unwrap_err();
    assert_eq!(sqlstate(&err), "25001");
    c.batch_execute("ROLLBACK").await.unwrap();
    assert_eq!(text_rows(&c, "SELECT 1").await, vec![vec![Some("1".into())]]);
}

#[tokio::test]
async fn shard_counts_and_colocation() {
    let cluster = TestCluster::start(2);
    let c = cluster.connect().await;
    c.batch_execute(
        "CREATE TABLE a (id int); CREATE TABLE b (id int); CREATE TABLE c (id int); CREATE TABLE d (id bigint); CREATE TABLE e (id int);
         SELECT create_distributed_table('a', 'id');
         SELECT create_distributed_table('b', 'id');
         SELECT create_distributed_table('c', 'id', colocate_with => 'none');
         SELECT create_distributed_table('d', 'id');
         SET citus.shard_count = 4;
         SELECT create_distributed_table('e', 'id');",
    )
    .await
    .unwrap();
    let rows = text_rows(
        &c,
        "SELECT logicalrelid::text, colocationid, (SELECT count(*) FROM pg_dist_shard s WHERE s.logicalrelid = p.logicalrelid) FROM pg_dist_partition p ORDER BY 1",
    )
    .await;
    let get = |t: &str| rows.iter().find(|r| r[0].as_deref() == Some(t)).unwrap().clone();
    assert_eq!(get("a")[2].as_deref(), Some("32"));
    assert_eq!(get("e")[2].as_deref(), Some("4"));
    assert_eq!(get("a")[1], get("b")[1], "same type and count co-locate by default");
    assert_ne!(get("a")[1], get("c")[1], "colocate_with => 'none' starts a new group");
    assert_ne!(get("a")[1], get("d")[1], "different column types never co-locate");
    // Co-located shards share nodes, shard by shard.
    let mismatched = text_rows(
        &c,
        "SELECT count(*) FROM citus_shards x JOIN citus_shards y ON x.table_name = 'a'::regclass AND y.table_name = 'b'::regclass
           JOIN pg_dist_shard sx ON sx.shardid = x.shardid JOIN pg_dist_shard sy ON sy.shardid = y.shardid
         WHERE sx.shardindex = sy.shardindex AND x.nodeport <> y.nodeport",
    )
    .await;
    assert_eq!(mismatched, vec![vec![Some("0".into())]]);
    let err = c.simple_query("SELECT create_distributed_table('a2', 'id', colocate_with => 'd')").await.unwrap_err();
    assert_eq!(sqlstate(&err), "42P01");
    c.batch_execute("CREATE TABLE a2 (id int)").await.unwrap();
    let err = c.simple_query("SELECT create_distributed_table('a2', 'id', colocate_with => 'd')").await.unwrap_err();
    assert_eq!(sqlstate(&err), "42804", "{err}");
    // citus_tables reports what we created.
    assert_eq!(text_rows(&c, "SELECT count(*) FROM citus_tables WHERE citus_table_type = 'distributed'").await, vec![vec![Some("5".into())]]);
}

#[tokio::test]
async fn reference_tables_live_on_every_worker() {
    let cluster = TestCluster::start(2);
    let c = cluster.connect().await;
    c.batch_execute(
        "CREATE TABLE countries (code text PRIMARY KEY, name text);
         INSERT INTO countries VALUES ('pl', 'Poland'), ('jp', 'Japan');
         SELECT create_reference_table('countries');
         INSERT INTO countries VALUES ('fr', 'France');
         UPDATE countries SET name = 'Nippon' WHERE code = 'jp';",
    )
    .await
    .unwrap();
    let shard: i64 = c.query_one("SELECT shardid FROM pg_dist_shard WHERE logicalrelid = 'countries'::regclass", &[]).await.unwrap().get(0);
    for i in 0..2 {
        let w = cluster.connect_worker(i).await;
        let rows = text_rows(&w, &format!("SELECT code, name FROM countries_{shard} ORDER BY code")).await;
        assert_eq!(
            rows,
            vec![
                vec![Some("fr".into()), Some("France".into())],
                vec![Some("jp".into()), Some("Nippon".into())],
                vec![Some("pl".into()), Some("Poland".into())]
            ]
        );
    }
    assert_eq!(text_rows(&c, "SELECT name FROM countries WHERE code = 'jp'").await, vec![vec![Some("Nippon".into())]]);
    let tag = c.execute("DELETE FROM countries WHERE code <> 'pl'", &[]).await.unwrap();
    assert_eq!(tag, 2, "a write to every placement reports the rows once");
}

#[tokio::test]
async fn undistribute_brings_rows_back() {
    let cluster = TestCluster::start(2);
    let c = cluster.connect().await;
    c.batch_execute(
        "CREATE TABLE back (id int PRIMARY KEY, v text);
         INSERT INTO back SELECT g, 'v' || g FROM generate_series(1, 300) g;
         SELECT create_distributed_table('back', 'id', shard_count => 4);
         INSERT INTO back VALUES (301, 'late');
         SELECT undistribute_table('back');",
    )
    .await
    .unwrap();
    assert_eq!(text_rows(&c, "SELECT count(*) FROM pg_dist_partition").await, vec![vec![Some("0".into())]]);
    let local = cluster.connect_coordinator_db().await;
    assert_eq!(text_rows(&local, "SELECT count(*), max(id) FROM back").await, vec![vec![Some("301".into()), Some("301".into())]]);
    for i in 0..2 {
        let w = cluster.connect_worker(i).await;
        assert_eq!(text_rows(&w, "SELECT count(*) FROM pg_tables WHERE tablename LIKE 'back_%'").await, vec![vec![Some("0".into())]]);
    }
}

/// A partitioned table comes back with its partitions (sub-partitions and a
/// default partition too), and alter_distributed_table distributes it anew.
#[tokio::test]
async fn partitioned_tables_come_back_and_are_distributed_anew() {
    let cluster = TestCluster::start(2);
    let c = cluster.connect().await;
    c.batch_execute(
        "CREATE TABLE visits (site int, day date, n int) PARTITION BY RANGE (day);
         CREATE TABLE visits_2025 PARTITION OF visits FOR VALUES FROM ('2025-01-01') TO ('2026-01-01');
         CREATE TABLE visits_2026 PARTITION OF visits FOR VALUES FROM ('2026-01-01') TO ('2027-01-01') PARTITION BY LIST (site);
         CREATE TABLE visits_2026_even PARTITION OF visits_2026 FOR VALUES IN (0, 2, 4, 6, 8);
         CREATE TABLE visits_2026_rest PARTITION OF visits_2026 DEFAULT;
         CREATE TABLE visits_other PARTITION OF visits DEFAULT;
         SELECT create_distributed_table('visits', 'site', shard_count => 4);
         INSERT INTO visits SELECT g % 10, DATE '2024-12-01' + g, g FROM generate_series(0, 799) g;",
    )
    .await
    .unwrap();
    let leaves = ["visits_2025", "visits_2026_even", "visits_2026_rest", "visits_other"];
    let contents = |client: &'static str| {
        let c = if client == "local" { None } else { Some(&c) };
        async move {
            let mut rows = Vec::new();
            for leaf in leaves {
                let sql = format!("SELECT count(*), sum(n) FROM {leaf}");
                rows.push(match c {
                    Some(c) => text_rows(c, &sql).await,
                    None => text_rows(&common::connect(cluster.cluster.state.coordinator_db_port).await, &sql).await,
                });
            }
            rows
        }
    };
    let expected = contents("tessera").await;
    assert!(expected.iter().all(|r| r[0][0].as_deref() != Some("0")), "rows in every leaf: {expected:?}");

    // Distributed anew with another shard count: every partition follows.
    c.batch_execute("SELECT alter_distributed_table('visits', shard_count => 2)").await.unwrap();
    let counts =
        text_rows(&c, "SELECT DISTINCT (SELECT count(*) FROM pg_dist_shard s WHERE s.logicalrelid = p.logicalrelid) FROM pg_dist_partition p").await;
    assert_eq!(counts, vec![vec![Some("2".into())]]);
    assert_eq!(text_rows(&c, "SELECT count(*) FROM pg_dist_partition").await, vec![vec![Some("6".into())]]);
    assert_eq!(contents("tessera").await, expected);
    assert_eq!(
        text_rows(&c, "SELECT count(*) FROM visits WHERE site = 4 AND day >= '2026-01-01' AND day < '2027-01-01'").await,
        text_rows(&c, "SELECT count(*) FROM visits_2026_even WHERE site = 4").await
    );

    // A partition alone cannot go; the parent takes them all back.
    let err = c.simple_query("SELECT undistribute_table('visits_2025')").await.unwrap_err();
    assert_eq!(sqlstate(&err), "0A000", "{err}");
    c.batch_execute("SELECT undistribute_table('visits')").await.unwrap();
    assert_eq!(text_rows(&c, "SELECT count(*) FROM pg_dist_partition").await, vec![vec![Some("0".into())]]);
    assert_eq!(contents("local").await, expected);
    for i in 0..2 {
        let w = cluster.connect_worker(i).await;
        assert_eq!(text_rows(&w, "SELECT count(*) FROM pg_class WHERE relname LIKE 'visits%'").await, vec![vec![Some("0".into())]]);
    }
}

#[tokio::test]
async fn catalog_names_resolve_without_crowding_the_users_objects() {
    let cluster = TestCluster::start(2);
    let (ok, _, err) = cluster.psql(
        "CREATE TABLE orders (id int PRIMARY KEY, total int);
         SELECT create_distributed_table('orders', 'id', shard_count => 4);
         CREATE TABLE plain_notes (id int);
         CREATE ROLE analyst LOGIN;",
    );
    assert!(ok, "{err}");
    // psql's listings show the user's objects only.
    let (ok, out, err) = cluster.psql("\\dt");
    assert!(ok, "{err}");
    let listed: Vec<&str> = out.lines().map(|l| l.split('|').nth(1).unwrap_or("")).collect();
    assert_eq!(listed, vec!["orders", "plain_notes"], "\\dt: {out}");
    for command in ["\\dv", "\\df", "\\ds"] {
        let (ok, out, err) = cluster.psql(command);
        assert!(ok, "{err}");
        assert_eq!(out.trim(), "", "{command} lists nothing the user made: {out}");
    }
    let c = cluster.connect().await;
    assert_eq!(text_rows(&c, "SHOW search_path").await, vec![vec![Some("\"$user\", public".to_string())]]);
    // The Citus names resolve unqualified, for superusers and other roles alike.
    let analyst = common::connect_as(cluster.port, "analyst").await;
    for client in [&c, &analyst] {
        assert_eq!(
            text_rows(client, "SELECT count(*) FROM pg_dist_shard WHERE logicalrelid = 'orders'::regclass").await,
            vec![vec![Some("4".to_string())]]
        );
        assert_eq!(
            text_rows(client, "SELECT count(*) FROM citus_shards WHERE table_name = 'orders'::regclass").await,
            vec![vec![Some("4".to_string())]]
        );
        assert_eq!(
            text_rows(client, "SELECT citus_table_type, distribution_column, shard_count FROM citus_tables").await,
            vec![vec![Some("distributed".to_string()), Some("id".to_string()), Some("4".to_string())]]
        );
        assert_eq!(
            text_rows(client, "SELECT count(*) FROM pg_dist_node, pg_dist_placement, pg_dist_partition, pg_dist_colocation WHERE false").await,
            vec![vec![Some("0".to_string())]]
        );
        assert_eq!(text_rows(client, "SELECT count(*) FROM citus_get_active_worker_nodes()").await, vec![vec![Some("2".to_string())]]);
        let version = text_rows(client, "SELECT citus_version()").await;
        let version = version[0][0].as_deref().unwrap();
        assert!(version.starts_with("Tessera ") && version.contains(" (Citus 12.1 API) on "), "{version}");
    }
    // The catalog's own tables stay out of reach of other roles.
    let e = analyst.simple_query("SELECT * FROM tessera.pg_dist_node").await.unwrap_err();
    assert_eq!(sqlstate(&e), "42501", "{}", error_text(&e));
}

#[tokio::test]
async fn sizes_and_activity_gather_every_node() {
    let cluster = TestCluster::start(2);
    let c = cluster.connect().await;
    c.batch_execute(
        "CREATE TABLE metrics (id bigint PRIMARY KEY, host text, reading float8);
         SELECT create_distributed_table('metrics', 'id', shard_count => 4);
         INSERT INTO metrics SELECT g, 'host-' || g % 10, g / 7.0 FROM generate_series(1, 5000) g;
         CREATE INDEX metrics_host ON metrics (host);
         CREATE TABLE kinds (kind text PRIMARY KEY);
         SELECT create_reference_table('kinds');
         INSERT INTO kinds SELECT 'kind ' || g FROM generate_series(1, 100) g;
         CREATE TABLE scratch (x int);",
    )
    .await
    .unwrap();
    for i in 0..2 {
        cluster.connect_worker(i).await.batch_execute("CREATE ROLE analyst LOGIN").await.unwrap();
    }
    cluster.connect_coordinator_db().await.batch_execute("CREATE ROLE analyst LOGIN").await.unwrap();

    // What the workers hold, asked of them directly.
    let (mut relation, mut table, mut total) = (0i64, 0i64, 0i64);
    for i in 0..2 {
        let w = cluster.connect_worker(i).await;
        let r = w
            .query_one(
                "SELECT coalesce(sum(pg_relation_size(oid)), 0)::bigint, coalesce(sum(pg_table_size(oid)), 0)::bigint, coalesce(sum(pg_total_relation_size(oid)), 0)::bigint
                 FROM pg_class WHERE relname ~ '^metrics_[0-9]+$' AND relkind = 'r'",
                &[],
            )
            .await
            .unwrap();
        relation += r.get::<_, i64>(0);
        table += r.get::<_, i64>(1);
        total += r.get::<_, i64>(2);
    }
    assert!(relation > 0 && relation <= table && table < total, "{relation} {table} {total}");
    let one_copy: i64 = cluster
        .connect_worker(0)
        .await
        .query_one("SELECT pg_total_relation_size(oid) FROM pg_class WHERE relname ~ '^kinds_[0-9]+$'", &[])
        .await
        .unwrap()
        .get(0);

    let analyst = common::connect_as(cluster.port, "analyst").await;
    for client in [&c, &analyst] {
        let r = client
            .query_one("SELECT citus_relation_size('metrics'), citus_table_size('metrics'), citus_total_relation_size('metrics')", &[])
            .await
            .unwrap();
        assert_eq!((r.get::<_, i64>(0), r.get::<_, i64>(1), r.get::<_, i64>(2)), (relation, table, total));
        // Any expression, any protocol: the size functions work inside queries.
        let r = client.query_one("SELECT citus_total_relation_size($1::text::regclass)", &[&"kinds"]).await.unwrap();
        assert_eq!(r.get::<_, i64>(0), one_copy, "a reference table counts one copy");
        let listed = text_rows(client, "SELECT table_name::text, citus_table_size(table_name) > 0 FROM citus_tables ORDER BY 1").await;
        assert_eq!(listed, vec![vec![Some("kinds".into()), Some("t".into())], vec![Some("metrics".into()), Some("t".into())]]);
        // citus_tables shows each table's total size, as Citus's does.
        let shown = text_rows(client, "SELECT table_size, access_method FROM citus_tables WHERE table_name = 'metrics'::regclass").await;
        let pretty = text_rows(client, &format!("SELECT pg_size_pretty({total}::bigint), 'heap'")).await;
        assert_eq!(shown, pretty);
        // citus_shards shows each placement's own size: the shards add up to
        // the table, and every copy of a reference table has its size.
        let r = client
            .query_one(
                "SELECT sum(shard_size)::bigint, count(*), bool_and(shard_size > 0) FROM citus_shards WHERE table_name = 'metrics'::regclass",
                &[],
            )
            .await
            .unwrap();
        assert_eq!((r.get::<_, i64>(0), r.get::<_, i64>(1), r.get::<_, bool>(2)), (total, 4, true));
        let copies = text_rows(client, "SELECT shard_size FROM citus_shards WHERE table_name = 'kinds'::regclass ORDER BY nodeport").await;
        assert_eq!(copies.len(), 2);
        assert!(copies.iter().all(|row| row[0].as_deref().and_then(|s| s.parse::<i64>().ok()).is_some_and(|s| s > 0)), "{copies:?}");
        let e = client.simple_query("SELECT citus_table_size('scratch')").await.unwrap_err();
        assert_eq!(sqlstate(&e), "42809", "{}", error_text(&e));
        // PostgreSQL's own size functions measure the shards, not the empty
        // shell, and keep their answer for local relations.
        let r = client
            .query_one("SELECT pg_relation_size('metrics'), pg_table_size('metrics'), pg_catalog.pg_total_relation_size('metrics'), pg_indexes_size('metrics'), pg_total_relation_size('scratch')", &[])
            .await
            .unwrap();
        assert_eq!((r.get::<_, i64>(0), r.get::<_, i64>(1), r.get::<_, i64>(2), r.get::<_, i64>(3)), (relation, table, total, total - table));
        assert_eq!(r.get::<_, i64>(4), 0);
        assert_eq!(r.columns()[2].name(), "pg_total_relation_size");

        // Every node's activity, named by node id (0 is the coordinator).
        let nodes = text_rows(
            client,
            "SELECT DISTINCT a.nodeid, coalesce(n.nodeport, 0) FROM citus_stat_activity a LEFT JOIN pg_dist_node n USING (nodeid) ORDER BY 1",
        )
        .await;
        assert_eq!(nodes.len(), 3, "{nodes:?}");
        assert_eq!(nodes[0][0].as_deref(), Some("0"));
        let workers = text_rows(
            client,
            "SELECT count(*) > 0 FROM citus_stat_activity WHERE is_worker_query AND nodeid > 0 AND global_pid = nodeid * 10000000000 + pid",
        )
        .await;
        assert_eq!(workers, vec![vec![Some("t".into())]], "the coordinator's own connections to the workers show");
    }
    // psql's \dt+ lists the shards' size.
    let (ok, out, err) = cluster.psql("\\dt+ metrics");
    assert!(ok, "{err}");
    let size_column = out.trim().split('|').nth(6).unwrap_or_default().to_string();
    assert!(size_column.ends_with("kB") || size_column.ends_with("MB"), "{out}");
    assert_ne!(size_column, "0 bytes", "{out}");
    let shape = c.prepare("SELECT * FROM citus_stat_activity").await.unwrap();
    let names: Vec<&str> = shape.columns().iter().take(6).map(|c| c.name()).collect();
    assert_eq!(names, ["global_pid", "nodeid", "is_worker_query", "datid", "datname", "pid"]);

    // On the coordinator database itself the data is not there to read.
    let db = cluster.connect_coordinator_db().await;
    for sql in ["SELECT citus_table_size('metrics')", "SELECT count(*) FROM citus_stat_activity"] {
        let e = db.simple_query(sql).await.unwrap_err();
        assert_eq!(sqlstate(&e), "0A000", "{sql}: {}", error_text(&e));
    }
}

/// Migrations (Django's are atomic) create and distribute tables inside one
/// transaction block: the block sees the tables as distributed at once, other
/// sessions only after the commit, and a rollback leaves nothing behind.
#[tokio::test]
async fn tables_are_distributed_inside_a_transaction_block() {
    let cluster = TestCluster::start(2);
    let c = cluster.connect().await;
    let other = cluster.connect().await;
    c.batch_execute(
        "BEGIN;
         CREATE TABLE mig_accounts (id bigint GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY, name text);
         INSERT INTO mig_accounts (name) VALUES ('before');
         SELECT create_distributed_table('mig_accounts', 'id');
         CREATE TABLE mig_kinds (id int PRIMARY KEY, label text);
         SELECT create_reference_table('mig_kinds');
         INSERT INTO mig_kinds VALUES (1, 'one');
         INSERT INTO mig_accounts (name) SELECT 'row ' || g FROM generate_series(1, 20) g;
         CREATE INDEX mig_accounts_name ON mig_accounts (name);",
    )
    .await
    .unwrap();
    // Inside the block: distributed, with the moved row and the new ones on the shards.
    assert_eq!(
        text_rows(&c, "SELECT count(*), min(id), max(id) FROM mig_accounts").await,
        vec![vec![Some("21".into()), Some("1".into()), Some("21".into())]]
    );
    assert_eq!(text_rows(&c, "SELECT count(*) FROM pg_dist_partition WHERE logicalrelid::text LIKE 'mig_%'").await, vec![vec![Some("2".into())]]);
    // Outside it: nothing yet.
    let err = other.simple_query("SELECT count(*) FROM mig_accounts").await.unwrap_err();
    assert_eq!(sqlstate(&err), "42P01", "{err}");
    c.batch_execute("COMMIT").await.unwrap();
    assert_eq!(text_rows(&other, "SELECT count(*), min(name) FROM mig_accounts").await, vec![vec![Some("21".into()), Some("before".into())]]);
    assert_eq!(text_rows(&other, "SELECT label FROM mig_kinds").await, vec![vec![Some("one".into())]]);
    let per_worker = |i| {
        let cluster = &cluster;
        async move {
            text_rows(&cluster.connect_worker(i).await, "SELECT count(*) FROM pg_class WHERE relname LIKE 'mig_accounts_%' AND relkind = 'r'").await
        }
    };
    assert_ne!(per_worker(0).await, vec![vec![Some("0".to_string())]]);

    // Rolled back: no table, no shards, no catalog rows.
    c.batch_execute(
        "BEGIN;
         CREATE TABLE mig_gone (id int);
         SELECT create_distributed_table('mig_gone', 'id');
         INSERT INTO mig_gone VALUES (1), (2);
         ROLLBACK;",
    )
    .await
    .unwrap();
    assert_eq!(text_rows(&c, "SELECT count(*) FROM pg_dist_partition WHERE logicalrelid::text = 'mig_gone'").await, vec![vec![Some("0".into())]]);
    for i in 0..2 {
        let w = cluster.connect_worker(i).await;
        assert_eq!(text_rows(&w, "SELECT count(*) FROM pg_class WHERE relname LIKE 'mig_gone%'").await, vec![vec![Some("0".into())]]);
    }
    let err = c.simple_query("SELECT * FROM mig_gone").await.unwrap_err();
    assert_eq!(sqlstate(&err), "42P01", "{err}");
}

/// Migrations drop, recreate and alter distributed tables inside one block
/// (SQLAlchemy's `engine.begin()`, Django's atomic migrations): the block sees
/// its own changes, and nothing waits on the locks the block holds.
#[tokio::test]
async fn distributed_ddl_inside_a_block_sees_its_changes() {
    let cluster = TestCluster::start(2);
    let c = cluster.connect().await;
    c.batch_execute(
        "CREATE TABLE blk_orders (id bigint GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY, note text DEFAULT 'none');
         SELECT create_distributed_table('blk_orders', 'id');
         INSERT INTO blk_orders (note) VALUES ('old');",
    )
    .await
    .unwrap();
    let block = async {
        c.batch_execute(
            "BEGIN;
             DROP TABLE IF EXISTS blk_orders;
             CREATE TABLE blk_orders (id bigint GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY, note text);
             SELECT create_distributed_table('blk_orders', 'id');
             ALTER TABLE blk_orders ADD COLUMN amount numeric DEFAULT 7;
             INSERT INTO blk_orders (note) VALUES ('new');",
        )
        .await
    };
    tokio::time::timeout(Duration::from_secs(30), block).await.expect("the block's DDL waited on its own locks").unwrap();
    assert_eq!(text_rows(&c, "SELECT id, note, amount FROM blk_orders").await, vec![vec![Some("1".into()), Some("new".into()), Some("7".into())]]);
    c.batch_execute("COMMIT").await.unwrap();
    let other = cluster.connect().await;
    assert_eq!(text_rows(&other, "SELECT note, amount FROM blk_orders").await, vec![vec![Some("new".into()), Some("7".into())]]);
}

/// A table dropped by one session while another loads the catalog does not
/// break the load. Here the load (after ROLLBACK TO SAVEPOINT undid a
/// distribution) waits for the drop's lock on the first column default it
/// reads, and reads the other columns of the dropped tables after the commit.
#[tokio::test]
async fn catalog_load_survives_a_concurrent_drop() {
    let cluster = TestCluster::start(2);
    let dropper = cluster.connect().await;
    let loader = cluster.connect().await;
    dropper
        .batch_execute(
            "CREATE TABLE race_gone (a text DEFAULT 'x', id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, b text DEFAULT 'y');
             SELECT create_distributed_table('race_gone', 'id');
             CREATE TABLE race_gone_too (a text DEFAULT 'x', id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, b text DEFAULT 'y');
             SELECT create_distributed_table('race_gone_too', 'id');",
        )
        .await
        .unwrap();
    loader
        .batch_execute(
            "BEGIN;
             CREATE TABLE race_undone (id int PRIMARY KEY);
             SAVEPOINT before;
             SELECT create_distributed_table('race_undone', 'id');
             ROLLBACK TO SAVEPOINT before;",
        )
        .await
        .unwrap();
    let drop = dropper.batch_execute("BEGIN; DROP TABLE race_gone, race_gone_too;");
    tokio::time::timeout(Duration::from_secs(30), drop).await.expect("DROP TABLE in a block waited on its own locks").unwrap();
    let load = tokio::spawn(async move { loader.batch_execute("ROLLBACK TO SAVEPOINT before").await.map(|_| loader) });
    // Commit only once the other session's catalog load waits for the drop.
    let db = cluster.connect_coordinator_db().await;
    let waiting = "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE '%tessera_defaults%'";
    let mut waited = false;
    for _ in 0..100 {
        if text_rows(&db, waiting).await != vec![vec![Some("0".to_string())]] {
            waited = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(waited, "the catalog load did not wait for the uncommitted DROP");
    dropper.batch_execute("COMMIT").await.unwrap();
    let loaded = tokio::time::timeout(Duration::from_secs(30), load).await.expect("the catalog load hung");
    let loader = loaded.unwrap().expect("loading the catalog failed while another session dropped a table");
    loader.batch_execute("COMMIT").await.unwrap();
    assert_eq!(text_rows(&loader, "SELECT count(*) FROM pg_dist_partition").await, vec![vec![Some("0".into())]]);
}

/// ORMs create foreign keys with the tables; distributing such tables works
/// when the referenced table is a reference table or a co-located table, and
/// the shards enforce the keys.
#[tokio::test]
async fn tables_with_foreign_keys_are_distributed() {
    let cluster = TestCluster::start(2);
    let c = cluster.connect().await;
    c.batch_execute(
        "CREATE TABLE fk_countries (code text PRIMARY KEY, name text);
         CREATE TABLE fk_tenants (id int PRIMARY KEY, country text REFERENCES fk_countries (code));
         CREATE TABLE fk_users (tenant_id int REFERENCES fk_tenants (id) ON DELETE CASCADE, id bigserial, email text,
                                PRIMARY KEY (tenant_id, id));
         INSERT INTO fk_countries VALUES ('nl', 'Netherlands'), ('fr', 'France');",
    )
    .await
    .unwrap();
    // The referenced tables come first; the other way round is refused, naming the key.
    let err = c.simple_query("SELECT create_distributed_table('fk_users', 'tenant_id')").await.unwrap_err();
    assert_eq!(sqlstate(&err), "0A000", "{err}");
    assert!(error_text(&err).contains("fk_users_tenant_id_fkey"), "{}", error_text(&err));
    let err = c.simple_query("SELECT create_reference_table('fk_tenants')").await.unwrap_err();
    assert!(error_text(&err).contains("fk_countries"), "{}", error_text(&err));
    // A table with rows that local tables reference cannot move its rows away.
    c.batch_execute("CREATE TABLE fk_local (country text REFERENCES fk_countries (code)); INSERT INTO fk_local VALUES ('nl')").await.unwrap();
    let err = c.simple_query("SELECT create_reference_table('fk_countries')").await.unwrap_err();
    assert!(error_text(&err).contains("fk_local"), "{}", error_text(&err));
    c.batch_execute(
        "DROP TABLE fk_local;
         SELECT create_reference_table('fk_countries');
         SELECT create_distributed_table('fk_tenants', 'id');
         SELECT create_distributed_table('fk_users', 'tenant_id', colocate_with => 'fk_tenants');
         INSERT INTO fk_tenants VALUES (1, 'nl'), (2, 'fr');
         INSERT INTO fk_users (tenant_id, email) VALUES (1, 'a@x'), (2, 'b@y');",
    )
    .await
    .unwrap();
    // The shards enforce the keys.
    let err = c.simple_query("INSERT INTO fk_tenants VALUES (3, 'xx')").await.unwrap_err();
    assert_eq!(sqlstate(&err), "23503", "{err}");
    let err = c.simple_query("INSERT INTO fk_users (tenant_id, email) VALUES (7, 'nobody')").await.unwrap_err();
    assert_eq!(sqlstate(&err), "23503", "{err}");
    // Serial values of a column other than the key come from the one
    // sequence (the refused row above used up 3, as in PostgreSQL).
    assert_eq!(
        text_rows(&c, "INSERT INTO fk_users (tenant_id, email) VALUES (1, 'c@x'), (2, 'd@y') RETURNING id").await,
        vec![vec![Some("4".into())], vec![Some("5".into())]]
    );
    // SQLAlchemy's batch insert (INSERT … SELECT FROM VALUES) into a table with a
    // (non-deferrable) foreign key: the rows never meet the empty shells.
    assert_eq!(
        text_rows(
            &c,
            "INSERT INTO fk_users (tenant_id, email) SELECT p0::int, p1::text FROM (VALUES (2, 'e@y', 0), (1, 'f@x', 1)) AS imp_sen(p0, p1, sen_counter)
             ORDER BY sen_counter RETURNING id, tenant_id"
        )
        .await,
        vec![vec![Some("6".into()), Some("2".into())], vec![Some("7".into()), Some("1".into())]]
    );
    c.batch_execute("DELETE FROM fk_tenants WHERE id = 1").await.unwrap();
    assert_eq!(text_rows(&c, "SELECT count(*) FROM fk_users").await, vec![vec![Some("3".into())]]);

    // Between distributed tables, the key must pair the distribution columns.
    c.batch_execute("CREATE TABLE fk_wrong (id int, tenant_ref int REFERENCES fk_tenants (id))").await.unwrap();
    let err = c.simple_query("SELECT create_distributed_table('fk_wrong', 'id', colocate_with => 'fk_tenants')").await.unwrap_err();
    assert_eq!(sqlstate(&err), "0A000", "{err}");
    assert_eq!(text_rows(&c, "SELECT count(*) FROM pg_dist_partition WHERE logicalrelid = 'fk_wrong'::regclass").await, vec![vec![Some("0".into())]]);
}

/// Other databases are plain PostgreSQL databases: their tables stay local,
/// and distributing one is refused with a message naming the distributed one.
#[tokio::test]
async fn other_databases_pass_through() {
    let cluster = TestCluster::start(2);
    let c = cluster.connect().await;
    c.batch_execute("CREATE DATABASE test_app").await.unwrap();
    let (other, connection) =
        tokio_postgres::connect(&format!("host=127.0.0.1 port={} user=postgres dbname=test_app", cluster.port), tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(connection);
    other.batch_execute("CREATE TABLE local_only (id int); INSERT INTO local_only VALUES (1), (2)").await.unwrap();
    assert_eq!(text_rows(&other, "SELECT count(*) FROM local_only").await, vec![vec![Some("2".into())]]);
    let err = other.simple_query("SELECT create_distributed_table('local_only', 'id')").await.unwrap_err();
    assert_eq!(sqlstate(&err), "0A000", "{err}");
    assert!(error_text(&err).contains("\"postgres\""), "{}", error_text(&err));
    // The session goes on.
    assert_eq!(text_rows(&other, "SELECT current_database()").await, vec![vec![Some("test_app".into())]]);
}

/// A column's raw bytes in whatever format the server sent, for checking a
/// binary record by hand.
struct RawValue(Vec<u8>);

impl<'a> tokio_postgres::types::FromSql<'a> for RawValue {
    fn from_sql(_: &tokio_postgres::types::Type, raw: &'a [u8]) -> Result<Self, Box<dyn std::error::Error + Sync + Send>> {
        Ok(RawValue(raw.to_vec()))
    }
    fn accepts(_: &tokio_postgres::types::Type) -> bool {
        true
    }
}

#[tokio::test]
async fn commands_run_on_every_node_and_shard_as_the_callers_role() {
    let cluster = TestCluster::start(2);
    let c = cluster.connect().await;
    c.batch_execute(
        "CREATE TABLE events (tenant int, id int, note text, PRIMARY KEY (tenant, id));
         SELECT create_distributed_table('events', 'tenant', shard_count => 4);
         CREATE TABLE tenants (tenant int PRIMARY KEY, name text);
         SELECT create_distributed_table('tenants', 'tenant', colocate_with => 'events');
         CREATE TABLE countries (code text PRIMARY KEY);
         SELECT create_reference_table('countries');
         INSERT INTO events SELECT g % 10, g, 'n' FROM generate_series(1, 200) g;
         INSERT INTO tenants SELECT g, 'tenant ' || g FROM generate_series(0, 9) g;
         INSERT INTO countries VALUES ('de'), ('fr'), ('jp');
         CREATE ROLE app LOGIN;
         GRANT SELECT ON events, tenants, countries TO app;",
    )
    .await
    .unwrap();
    let mut worker_ports: Vec<i32> = cluster.cluster.state.worker_ports.iter().map(|p| *p as i32).collect();
    worker_ports.sort();
    let app = common::connect_as(cluster.cluster.state.coordinator_port, "app").await;

    // Every active worker, in node order, as the caller's role.
    for (client, role) in [(&c, "postgres"), (&app, "app")] {
        let rows = client
            .query("SELECT nodename, nodeport, success, result FROM run_command_on_workers('SELECT current_user') ORDER BY nodeport", &[])
            .await
            .unwrap();
        let got: Vec<(String, i32, bool, String)> = rows.iter().map(|r| (r.get(0), r.get(1), r.get(2), r.get(3))).collect();
        let expected: Vec<(String, i32, bool, String)> = worker_ports.iter().map(|p| ("127.0.0.1".into(), *p, true, role.into())).collect();
        assert_eq!(got, expected);
    }
    // With the coordinator database as node 0.
    let coordinator_db_port = cluster.connect_coordinator_db().await.query_one("SHOW port", &[]).await.unwrap().get::<_, String>(0);
    let mut expected = vec![vec![Some("0".to_string()), Some("t".into()), Some(coordinator_db_port)]];
    let node_ids = text_rows(&c, "SELECT nodeid, nodeport FROM pg_dist_node ORDER BY nodeid").await;
    expected.extend(node_ids.iter().map(|r| vec![r[0].clone(), Some("t".into()), r[1].clone()]));
    assert_eq!(text_rows(&app, "SELECT * FROM run_command_on_all_nodes('SHOW port')").await, expected);

    // Each shard by name, on its node: the counts add up to the table's.
    let shards = text_rows(&c, "SELECT shardid FROM pg_dist_shard WHERE logicalrelid = 'events'::regclass ORDER BY shardid").await;
    let per_shard = text_rows(&app, "SELECT shardid, success, result FROM run_command_on_shards('events', 'SELECT count(*) FROM %s')").await;
    assert_eq!(per_shard.iter().map(|r| vec![r[0].clone()]).collect::<Vec<_>>(), shards);
    assert!(per_shard.iter().all(|r| r[1].as_deref() == Some("t")), "{per_shard:?}");
    let total: i64 = per_shard.iter().map(|r| r[2].as_deref().unwrap().parse::<i64>().unwrap()).sum();
    assert_eq!(total, 200);
    // A query around the call: filters, aggregates, aliases and parameters.
    assert_eq!(
        text_rows(
            &c,
            "SELECT sum(n::int) FROM run_command_on_shards('events', 'SELECT count(*) FROM %s WHERE note LIKE ''n%%''') AS s(id, ok, n) WHERE ok"
        )
        .await,
        vec![vec![Some("200".into())]]
    );
    let one: Vec<String> = c
        .query("SELECT result FROM run_command_on_workers($1) WHERE nodeport = $2", &[&"SELECT 6 * 7", &worker_ports[1]])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(one, vec!["42".to_string()]);
    // Every placement of a reference table; co-located shards side by side.
    let copies =
        text_rows(&c, "SELECT nodeport, result FROM run_command_on_placements('countries', 'SELECT count(*) FROM %s') ORDER BY nodeport").await;
    assert_eq!(copies, worker_ports.iter().map(|p| vec![Some(p.to_string()), Some("3".into())]).collect::<Vec<_>>());
    let joined = text_rows(&c, "SELECT sum(result::int), count(*) FROM run_command_on_colocated_placements('events', 'tenants', 'SELECT count(*) FROM %s e JOIN %s t USING (tenant)')").await;
    assert_eq!(joined, vec![vec![Some("200".into()), Some("4".into())]]);

    // In the select list, a record per node, as PostgreSQL gives it, in
    // text and in binary.
    let records = text_rows(&c, "SELECT run_command_on_workers($$SELECT 'a \"b\"'$$)").await;
    assert_eq!(
        records,
        node_ids.iter().map(|r| vec![Some(format!("(127.0.0.1,{},t,\"a \"\"b\"\"\")", r[1].as_deref().unwrap()))]).collect::<Vec<_>>()
    );
    let binary = c.query("SELECT run_command_on_workers('SELECT NULL')", &[]).await.unwrap();
    let RawValue(bytes) = binary[0].get(0);
    let int = |at: usize| i32::from_be_bytes(bytes[at..at + 4].try_into().unwrap());
    assert_eq!(int(0), 4, "four columns");
    assert_eq!((int(4), int(8)), (25, 9), "nodename: text of 9 bytes");
    assert_eq!(&bytes[12..21], b"127.0.0.1");
    let first_port: i32 = node_ids[0][1].as_deref().unwrap().parse().unwrap();
    assert_eq!((int(21), int(25), int(29)), (23, 4, first_port), "nodeport: int4");
    assert_eq!((int(33), int(37), bytes[41]), (16, 1, 1), "success: bool true");
    assert_eq!((int(42), int(46)), (25, 0), "result: empty text");

    // Failures are rows, per node; nothing the caller may not do happens.
    let refused = text_rows(&app, "SELECT DISTINCT success, result FROM run_command_on_shards('events', 'DELETE FROM %s')").await;
    assert_eq!(refused.len(), 4);
    assert!(
        refused.iter().all(|r| r[0].as_deref() == Some("f") && r[1].as_deref().unwrap().starts_with("permission denied for table events_")),
        "{refused:?}"
    );
    assert_eq!(text_rows(&c, "SELECT count(*) FROM events").await, vec![vec![Some("200".into())]]);
    let shapes = text_rows(&c, "SELECT DISTINCT success, result FROM run_command_on_workers('SELECT 1, 2')").await;
    assert_eq!(shapes, vec![vec![Some("f".into()), Some("expected a single column in query target".into())]]);
    let shapes = text_rows(&c, "SELECT DISTINCT success, result FROM run_command_on_workers('SELECT generate_series(1, 2)')").await;
    assert_eq!(shapes, vec![vec![Some("f".into()), Some("expected a single row in query result".into())]]);
    let missing = text_rows(&c, "SELECT DISTINCT success, result FROM run_command_on_workers('SELECT * FROM nowhere', parallel => false)").await;
    assert_eq!(missing, vec![vec![Some("f".into()), Some("relation \"nowhere\" does not exist".into())]]);

    // A transaction a command leaves open ends with its connection: the
    // rows it wrote are gone and hold no locks.
    let open = text_rows(&c, "SELECT DISTINCT success, result FROM run_command_on_shards('events', 'BEGIN; DELETE FROM %s')").await;
    assert!(!open.is_empty() && open.iter().all(|r| r[0].as_deref() == Some("t") && r[1].as_deref().unwrap().starts_with("DELETE ")), "{open:?}");
    tokio::time::timeout(Duration::from_secs(10), c.execute("UPDATE events SET note = 'm' WHERE tenant = 3", &[]))
        .await
        .expect("a lock was left behind")
        .unwrap();
    assert_eq!(text_rows(&c, "SELECT count(*) FROM events").await, vec![vec![Some("200".into())]]);

    // A cancel request reaches the commands running on the nodes.
    let token = app.cancel_token();
    let started = std::time::Instant::now();
    let cancel = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(700)).await;
        token.cancel_query(tokio_postgres::NoTls).await.unwrap();
    });
    let cancelled = text_rows(&app, "SELECT DISTINCT success, result FROM run_command_on_workers('SELECT pg_sleep(30)')").await;
    cancel.await.unwrap();
    assert_eq!(cancelled, vec![vec![Some("f".into()), Some("canceling statement due to user request".into())]]);
    assert!(started.elapsed() < Duration::from_secs(20));

    // Refusals.
    c.batch_execute("BEGIN").await.unwrap();
    let err = c.simple_query("SELECT * FROM run_command_on_workers('SELECT 1')").await.unwrap_err();
    assert_eq!(sqlstate(&err), "25001");
    c.batch_execute("ROLLBACK").await.unwrap();
    c.batch_execute("CREATE TABLE plain_local (id int)").await.unwrap();
    let err = c.simple_query("SELECT * FROM run_command_on_shards('plain_local', 'SELECT 1')").await.unwrap_err();
    assert_eq!(sqlstate(&err), "42809", "{err}");
    let err = c.simple_query("SELECT * FROM run_command_on_colocated_placements('events', 'countries', 'SELECT 1')").await.unwrap_err();
    assert_eq!(sqlstate(&err), "22023", "{err}");
    let err = c.simple_query("SELECT * FROM run_command_on_workers('SELECT 1') WHERE nodeport IN (SELECT tenant FROM tenants)").await.unwrap_err();
    assert_eq!(sqlstate(&err), "0A000", "{err}");
    let err = app.simple_query("SELECT * FROM run_command_on_workers(NULL)").await.unwrap_err();
    assert_eq!(sqlstate(&err), "22023", "{err}");
}

#[tokio::test]
async fn tables_are_distributed_anew_with_alter_distributed_table() {
    let cluster = TestCluster::start(2);
    let c = cluster.connect().await;
    c.batch_execute(
        "CREATE TABLE orders (tenant int, id int, total int, PRIMARY KEY (tenant, id));
         SELECT create_distributed_table('orders', 'tenant', shard_count => 4);
         CREATE TABLE lines (tenant int, order_id int, n int, PRIMARY KEY (tenant, order_id, n));
         SELECT create_distributed_table('lines', 'tenant', colocate_with => 'orders');
         INSERT INTO orders SELECT g % 20, g, g * 3 FROM generate_series(1, 2000) g;
         INSERT INTO lines SELECT g % 20, g, 1 FROM generate_series(1, 2000) g;
         CREATE FUNCTION order_total(p_tenant int, p_id int) RETURNS int LANGUAGE sql AS 'SELECT total FROM orders WHERE tenant = p_tenant AND id = p_id';
         SELECT create_distributed_function('order_total(int, int)', 'p_tenant', colocate_with => 'orders');
         CREATE ROLE app LOGIN;
         GRANT SELECT, INSERT, UPDATE, DELETE ON orders, lines TO app;",
    )
    .await
    .unwrap();
    let shape = |table: &'static str| {
        let c = &c;
        async move {
            text_rows(c, &format!("SELECT p.partkey, p.colocationid, (SELECT count(*) FROM pg_dist_shard s WHERE s.logicalrelid = p.logicalrelid) FROM pg_dist_partition p WHERE logicalrelid = '{table}'::regclass")).await.remove(0)
        }
    };
    let before = shape("orders").await;
    let contents = "SELECT count(*), sum(total), (SELECT count(*) FROM lines), (SELECT count(*) FROM orders o JOIN lines l ON l.tenant = o.tenant AND l.order_id = o.id) FROM orders";
    let expected = text_rows(&c, contents).await;

    // A new shard count must say what happens to the co-located table.
    let err = c.simple_query("SELECT alter_distributed_table('orders', shard_count => 8)").await.unwrap_err();
    assert_eq!(sqlstate(&err), "22023", "{err}");
    assert!(error_text(&err).contains("cascade_to_colocated"), "{err}");
    // Not the owner, a role cannot.
    let app = common::connect_as(cluster.cluster.state.coordinator_port, "app").await;
    let err = app.simple_query("SELECT alter_distributed_table('orders', shard_count => 8, cascade_to_colocated => true)").await.unwrap_err();
    assert_eq!(sqlstate(&err), "42501", "{err}");
    // Rolled back with its block, it changes nothing.
    c.batch_execute("BEGIN; SELECT alter_distributed_table('orders', shard_count => 8, cascade_to_colocated => true); ROLLBACK").await.unwrap();
    assert_eq!(shape("orders").await, before);
    assert_eq!(text_rows(&c, contents).await, expected);

    // The group together: 8 shards each, still co-located, every row where
    // its key routes, the function following the group.
    c.batch_execute("SELECT alter_distributed_table('orders', shard_count => 8, cascade_to_colocated => true)").await.unwrap();
    let after = shape("orders").await;
    assert_eq!(after[2].as_deref(), Some("8"));
    assert_ne!(after[1], before[1], "a new co-location group");
    assert_eq!(shape("lines").await, after);
    assert_eq!(text_rows(&c, contents).await, expected);
    for tenant in 0..20 {
        let n: i64 = app.query_one("SELECT count(*) FROM orders WHERE tenant = $1", &[&tenant]).await.unwrap().get(0);
        assert_eq!(n, 100, "tenant {tenant}");
    }
    let plan = text_rows(&c, "EXPLAIN SELECT * FROM orders o JOIN lines l ON l.tenant = o.tenant AND l.order_id = o.id WHERE o.tenant = 7").await;
    assert!(plan[0][0].as_deref().unwrap().contains("Router"), "{plan:?}");
    assert_eq!(
        text_rows(&c, "SELECT colocationid FROM pg_dist_object WHERE objid = 'order_total(int, int)'::regprocedure").await,
        vec![vec![after[1].clone()]]
    );
    assert_eq!(text_rows(&c, "SELECT order_total(7, 7)").await, vec![vec![Some("21".into())]]);
    let shard_tables = text_rows(
        &c,
        "SELECT sum(result::int) FROM run_command_on_workers($$SELECT count(*) FROM pg_tables WHERE tablename ~ '^(orders|lines)_[0-9]+$'$$)",
    )
    .await;
    assert_eq!(shard_tables, vec![vec![Some("16".into())]], "the old shards are gone");

    // Another distribution column of the same type: the shards' hash ranges
    // stay those of the group, so the table stays in it.
    c.batch_execute("SELECT alter_distributed_table('lines', distribution_column => 'order_id')").await.unwrap();
    let moved = shape("lines").await;
    assert_eq!(moved, vec![Some("order_id".into()), after[1].clone(), after[2].clone()]);
    assert_eq!(text_rows(&c, contents).await, expected);
    assert_eq!(text_rows(&app, "SELECT tenant FROM lines WHERE order_id = 1234").await, vec![vec![Some("14".into())]]);
    // A group of its own, then back by colocate_with.
    c.batch_execute("SELECT alter_distributed_table('lines', distribution_column => 'tenant', shard_count => 2, cascade_to_colocated => false)")
        .await
        .unwrap();
    let alone = shape("lines").await;
    assert_eq!(alone[2].as_deref(), Some("2"));
    assert_ne!(alone[1], after[1]);
    assert_eq!(text_rows(&c, contents).await, expected);
    c.batch_execute("SELECT alter_distributed_table('lines', colocate_with => 'orders')").await.unwrap();
    assert_eq!(shape("lines").await, after);
    assert_eq!(text_rows(&c, contents).await, expected);

    // Refusals, each before anything changes.
    let refusals = [
        ("SELECT alter_distributed_table('orders')", "22023"),
        ("SELECT alter_distributed_table('orders', colocate_with => 'lines')", "22023"),
        ("SELECT alter_distributed_table('orders', distribution_column => 'total')", "0A000"),
        ("SELECT alter_distributed_table('orders', distribution_column => 'nope')", "42703"),
        ("SELECT alter_distributed_table('orders', shard_count => 0, cascade_to_colocated => true)", "22023"),
    ];
    for (sql, code) in refusals {
        let err = c.simple_query(sql).await.unwrap_err();
        assert_eq!(sqlstate(&err), code, "{sql}: {err}");
    }
    c.batch_execute("CREATE TABLE kinds (k int PRIMARY KEY); SELECT create_reference_table('kinds'); ALTER TABLE lines ADD FOREIGN KEY (tenant, order_id) REFERENCES orders (tenant, id)").await.unwrap();
    let err = c.simple_query("SELECT alter_distributed_table('kinds', shard_count => 2)").await.unwrap_err();
    assert_eq!(sqlstate(&err), "0A000", "{err}");
    let err = c.simple_query("SELECT alter_distributed_table('orders', shard_count => 2, cascade_to_colocated => true)").await.unwrap_err();
    assert_eq!(sqlstate(&err), "0A000", "{err}");
    assert!(error_text(&err).contains("foreign key"), "{err}");
    assert_eq!(shape("orders").await, after);
    assert_eq!(text_rows(&c, contents).await, expected);
}

#[tokio::test]
async fn colocation_changes_without_moving_data() {
    let cluster = TestCluster::start(2);
    let c = cluster.connect().await;
    c.batch_execute(
        "CREATE TABLE accounts (id int PRIMARY KEY, owner text);
         SELECT create_distributed_table('accounts', 'id', shard_count => 4);
         CREATE TABLE ledger (id int, amount int);
         SELECT create_distributed_table('ledger', 'id', shard_count => 4, colocate_with => 'none');
         CREATE TABLE wide (id int);
         SELECT create_distributed_table('wide', 'id', shard_count => 6);
         INSERT INTO accounts SELECT g, 'o' || g FROM generate_series(1, 100) g;
         INSERT INTO ledger SELECT g % 100 + 1, g FROM generate_series(1, 1000) g;
         CREATE ROLE clerk LOGIN;
         GRANT SELECT ON accounts, ledger TO clerk;",
    )
    .await
    .unwrap();
    let group = |table: &'static str| {
        let c = &c;
        async move {
            text_rows(c, &format!("SELECT colocationid FROM pg_dist_partition WHERE logicalrelid = '{table}'::regclass")).await.remove(0).remove(0)
        }
    };
    let join = "EXPLAIN SELECT count(*) FROM accounts a JOIN ledger l USING (id)";
    let tier = |plan: Vec<Vec<Option<String>>>| plan.into_iter().flatten().flatten().find(|l| l.contains("Custom Scan")).unwrap_or_default();
    assert!(tier(text_rows(&c, join).await).contains("Broadcast"), "not co-located yet");
    let expected = text_rows(&c, "SELECT count(*), sum(amount) FROM accounts a JOIN ledger l USING (id)").await;

    // Same shard count, type and nodes: the group changes, the rows stay.
    c.batch_execute("SELECT update_distributed_table_colocation('ledger', colocate_with => 'accounts')").await.unwrap();
    assert_eq!(group("ledger").await, group("accounts").await);
    let now = tier(text_rows(&c, join).await);
    assert!(now.contains("Multi-Shard"), "co-located now: {now}");
    assert_eq!(text_rows(&c, "SELECT count(*), sum(amount) FROM accounts a JOIN ledger l USING (id)").await, expected);
    // 'none': a group of its own again.
    c.batch_execute("SELECT update_distributed_table_colocation('ledger', 'none')").await.unwrap();
    assert_ne!(group("ledger").await, group("accounts").await);
    assert!(tier(text_rows(&c, join).await).contains("Broadcast"));

    // Refused: another shard count, a reference table, another owner; and
    // truncate_local_data_after_distributing_table checks what Citus's does.
    let err = c.simple_query("SELECT update_distributed_table_colocation('ledger', 'wide')").await.unwrap_err();
    assert_eq!(sqlstate(&err), "22023", "{err}");
    assert!(error_text(&err).contains("alter_distributed_table"), "{err}");
    let clerk = common::connect_as(cluster.cluster.state.coordinator_port, "clerk").await;
    let err = clerk.simple_query("SELECT update_distributed_table_colocation('ledger', 'accounts')").await.unwrap_err();
    assert_eq!(sqlstate(&err), "42501", "{err}");
    assert_ne!(group("ledger").await, group("accounts").await);
    c.batch_execute("SELECT truncate_local_data_after_distributing_table('accounts')").await.unwrap();
    assert_eq!(text_rows(&c, "SELECT count(*) FROM accounts").await, vec![vec![Some("100".into())]]);
    c.batch_execute("CREATE TABLE notes (id int)").await.unwrap();
    let err = c.simple_query("SELECT truncate_local_data_after_distributing_table('notes')").await.unwrap_err();
    assert_eq!(sqlstate(&err), "22023", "{err}");
    let err = clerk.simple_query("SELECT truncate_local_data_after_distributing_table('accounts')").await.unwrap_err();
    assert_eq!(sqlstate(&err), "42501", "{err}");
}

#[tokio::test]
async fn time_partitions_are_created_and_dropped_with_their_shards() {
    let cluster = TestCluster::start(2);
    let c = cluster.connect().await;
    c.batch_execute(
        "SET TimeZone = 'UTC';
         CREATE TABLE readings (device int, day date, value int) PARTITION BY RANGE (day);
         SELECT create_distributed_table('readings', 'device', shard_count => 4);
         CREATE TABLE clicks (at timestamptz, url text) PARTITION BY RANGE (at);
         CREATE TABLE ticks (at timestamp, n int) PARTITION BY RANGE (at);
         CREATE TABLE flat (day date);
         CREATE ROLE analyst LOGIN;
         GRANT SELECT ON readings TO analyst;",
    )
    .await
    .unwrap();
    let partitions = |table: &'static str| {
        let c = &c;
        async move {
            text_rows(c, &format!("SELECT partition::text, from_value, to_value FROM time_partitions WHERE parent_table = '{table}'::regclass ORDER BY from_value::timestamptz")).await
        }
    };
    let row = |name: &str, from: &str, to: &str| vec![Some(name.to_string()), Some(from.to_string()), Some(to.to_string())];

    // Months of a date column, aligned to the month's start; a second call
    // adds only what is missing, after the last and before the first.
    assert_eq!(text_rows(&c, "SELECT create_time_partitions('readings', '1 month', '2026-04-01', '2026-01-15')").await, vec![vec![Some("t".into())]]);
    assert_eq!(
        partitions("readings").await,
        vec![
            row("readings_p2026_01", "2026-01-01", "2026-02-01"),
            row("readings_p2026_02", "2026-02-01", "2026-03-01"),
            row("readings_p2026_03", "2026-03-01", "2026-04-01")
        ]
    );
    assert_eq!(text_rows(&c, "SELECT create_time_partitions('readings', '1 month', '2026-03-01', '2026-02-01')").await, vec![vec![Some("f".into())]]);
    c.batch_execute("SELECT create_time_partitions(table_name => 'readings', partition_interval => '1 month', end_at => '2026-05-01', start_from => '2025-12-01')").await.unwrap();
    let names: Vec<Option<String>> = partitions("readings").await.into_iter().map(|r| r[0].clone()).collect();
    assert_eq!(
        names,
        ["readings_p2025_12", "readings_p2026_01", "readings_p2026_02", "readings_p2026_03", "readings_p2026_04"].map(|n| Some(n.to_string()))
    );
    // The partitions are distributed with their parent: rows go to them.
    assert_eq!(
        text_rows(&c, "SELECT count(*) FROM pg_dist_partition WHERE logicalrelid::text LIKE 'readings_p%'").await,
        vec![vec![Some("5".into())]]
    );
    c.batch_execute("INSERT INTO readings SELECT g, DATE '2025-12-01' + g, g FROM generate_series(0, 150) g").await.unwrap();
    assert_eq!(text_rows(&c, "SELECT count(*) FROM readings_p2026_02").await, vec![vec![Some("28".into())]]);
    assert_eq!(text_rows(&c, "SELECT count(*) FROM readings").await, vec![vec![Some("151".into())]]);

    // Weeks of a timestamptz column and hours of a timestamp column, named
    // in their unit's precision; a local table works the same way.
    c.batch_execute("SELECT create_time_partitions('clicks', '1 week', '2026-11-20', '2026-11-04 13:00+00')").await.unwrap();
    assert_eq!(
        partitions("clicks").await,
        vec![
            row("clicks_p2026w45", "2026-11-02 00:00:00+00", "2026-11-09 00:00:00+00"),
            row("clicks_p2026w46", "2026-11-09 00:00:00+00", "2026-11-16 00:00:00+00"),
            row("clicks_p2026w47", "2026-11-16 00:00:00+00", "2026-11-23 00:00:00+00")
        ]
    );
    c.batch_execute("SELECT create_time_partitions('ticks', '6 hours', '2026-11-02', '2026-11-01')").await.unwrap();
    let ticks: Vec<Option<String>> = partitions("ticks").await.into_iter().map(|r| r[0].clone()).collect();
    assert_eq!(
        ticks,
        ["ticks_p2026_11_01_0000", "ticks_p2026_11_01_0600", "ticks_p2026_11_01_1200", "ticks_p2026_11_01_1800"].map(|n| Some(n.to_string()))
    );

    // In a block rolled back, nothing is left.
    c.batch_execute("BEGIN; SELECT create_time_partitions('readings', '1 month', '2026-08-01'); ROLLBACK").await.unwrap();
    assert_eq!(partitions("readings").await.len(), 5);

    // Dropping old partitions drops their shards and rows too.
    let shard_tables =
        "SELECT sum(result::int) FROM run_command_on_workers($$SELECT count(*) FROM pg_tables WHERE tablename ~ '^readings_p2025_12_[0-9]+$'$$)";
    assert_eq!(text_rows(&c, shard_tables).await, vec![vec![Some("4".into())]]);
    c.batch_execute("CALL drop_old_time_partitions('readings', '2026-02-01')").await.unwrap();
    let names: Vec<Option<String>> = partitions("readings").await.into_iter().map(|r| r[0].clone()).collect();
    assert_eq!(names, ["readings_p2026_02", "readings_p2026_03", "readings_p2026_04"].map(|n| Some(n.to_string())));
    assert_eq!(text_rows(&c, shard_tables).await, vec![vec![Some("0".into())]]);
    assert_eq!(text_rows(&c, "SELECT count(*), min(day) FROM readings").await, vec![vec![Some("89".into()), Some("2026-02-01".into())]]);

    // Refusals.
    let analyst = common::connect_as(cluster.cluster.state.coordinator_port, "analyst").await;
    let err = analyst.simple_query("SELECT create_time_partitions('readings', '1 month', '2026-09-01')").await.unwrap_err();
    assert_eq!(sqlstate(&err), "42501", "{err}");
    let err = analyst.simple_query("CALL drop_old_time_partitions('readings', '2026-04-01')").await.unwrap_err();
    assert_eq!(sqlstate(&err), "42501", "{err}");
    for (sql, code) in [
        ("SELECT create_time_partitions('flat', '1 day', '2026-01-01')", "22023"),
        ("SELECT create_time_partitions('readings', '1 hour', '2026-06-01')", "22023"),
        ("SELECT create_time_partitions('readings', '-1 month', '2026-06-01')", "22023"),
        ("SELECT create_time_partitions('readings', '1 second', '2027-01-01', '2026-01-01')", "22023"),
    ] {
        let err = c.simple_query(sql).await.unwrap_err();
        assert_eq!(sqlstate(&err), code, "{sql}: {err}");
    }
    assert_eq!(partitions("readings").await.len(), 3);
}

/// A worker's data taken over by another server (as a promoted standby
/// would): after citus_update_node every kind of statement reaches the new
/// server, none the old one, though it still runs.
#[tokio::test]
async fn a_node_moves_to_a_new_address_with_citus_update_node() {
    let cluster = TestCluster::start(2);
    let c = cluster.connect().await;
    c.batch_execute(ITEMS_AND_KINDS).await.unwrap();
    let old_port = cluster.cluster.state.worker_ports[0];
    let node_id: i32 = c.query_one("SELECT nodeid FROM pg_dist_node WHERE nodeport = $1", &[&(old_port as i32)]).await.unwrap().get(0);
    // Connections to the old address wait in the pools.
    for id in 1..=100 {
        c.query_one("SELECT v FROM items WHERE id = $1", &[&id]).await.unwrap();
    }

    // The copy: a base backup of the running worker, served on a new port;
    // the original keeps running, with the pooled connections to it.
    let clone_dir = cluster.data_dir().join("worker-1-clone");
    let basebackup = tessera::cluster::instance::pg_bin_dir().unwrap().join("pg_basebackup");
    let worker_socket = cluster.workers()[0].data_dir.display().to_string();
    let status = std::process::Command::new(basebackup)
        .args([
            "-h",
            &worker_socket,
            "-p",
            &old_port.to_string(),
            "-U",
            "postgres",
            "-D",
            &clone_dir.to_string_lossy(),
            "-X",
            "stream",
            "-c",
            "fast",
            "--no-sync",
        ])
        .status()
        .unwrap();
    assert!(status.success());
    tessera::cluster::instance::prepare_dir(&clone_dir).unwrap();
    let new_port = tessera::cluster::instance::free_port().unwrap();
    let mut conf = std::fs::OpenOptions::new().append(true).open(clone_dir.join("postgresql.conf")).unwrap();
    use std::io::Write as _;
    writeln!(conf, "port = {new_port}\nunix_socket_directories = '{}'", clone_dir.display()).unwrap();
    let clone = tessera::cluster::instance::Instance::new(&clone_dir, new_port);
    clone.start().unwrap();
    common::reach_by_socket(new_port, &clone_dir);

    // Only a superuser, outside a block, for a node that exists, at a free address.
    let operator = common::connect_as(cluster.cluster.state.coordinator_port, "operator").await;
    let err = operator.simple_query(&format!("SELECT citus_update_node({node_id}, '127.0.0.1', {new_port})")).await.unwrap_err();
    assert_eq!(sqlstate(&err), "42501", "{err}");
    let err = c.simple_query(&format!("SELECT citus_update_node(999, '127.0.0.1', {new_port})")).await.unwrap_err();
    assert_eq!(sqlstate(&err), "42704", "{err}");
    let taken = cluster.cluster.state.worker_ports[1];
    let err = c.simple_query(&format!("SELECT citus_update_node({node_id}, '127.0.0.1', {taken})")).await.unwrap_err();
    assert_eq!(sqlstate(&err), "22023", "{err}");
    c.batch_execute("BEGIN").await.unwrap();
    let err = c.simple_query(&format!("SELECT citus_update_node({node_id}, '127.0.0.1', {new_port})")).await.unwrap_err();
    assert_eq!(sqlstate(&err), "25001", "{err}");
    c.batch_execute("ROLLBACK").await.unwrap();

    c.batch_execute(&format!("SELECT citus_update_node(node_id => {node_id}, new_node_name => '127.0.0.1', new_node_port => {new_port})"))
        .await
        .unwrap();
    assert_eq!(text_rows(&c, &format!("SELECT nodeport FROM pg_dist_node WHERE nodeid = {node_id}")).await, vec![vec![Some(new_port.to_string())]]);
    // Routed, multi-shard and two-phase writes, reference-table copies and
    // the general fallback all reach the new server.
    for id in 1..=100 {
        c.execute("UPDATE items SET v = v + 1000 WHERE id = $1", &[&id]).await.unwrap();
    }
    c.batch_execute(
        "UPDATE items SET v = v + 1; INSERT INTO kinds VALUES (3); BEGIN; INSERT INTO items VALUES (101, 0), (102, 0), (103, 0), (104, 0); COMMIT",
    )
    .await
    .unwrap();
    assert_eq!(text_rows(&c, "SELECT count(*), sum(v) FROM items").await, vec![vec![Some("104".into()), Some((5050 + 100 * 1001).to_string())]]);
    assert_eq!(text_rows(&c, "SELECT count(DISTINCT v) FILTER (WHERE v > 1000) FROM items").await, vec![vec![Some("100".into())]]);
    let on = |port: u16| async move {
        let w = common::connect(port).await;
        let shards: Vec<String> = w
            .query("SELECT tablename::text FROM pg_tables WHERE tablename ~ '^items_[0-9]+$'", &[])
            .await
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect();
        let mut counts = Vec::new();
        for s in shards {
            counts.push(w.query_one(&format!("SELECT count(*) FILTER (WHERE v > 1000), count(*) FROM {s}"), &[]).await.unwrap().get::<_, i64>(0));
        }
        let kinds: i64 = w.query_one("SELECT count(*) FROM pg_tables WHERE tablename ~ '^kinds_[0-9]+$'", &[]).await.unwrap().get(0);
        let kind_rows: i64 = if kinds > 0 {
            let name: String = w.query_one("SELECT tablename::text FROM pg_tables WHERE tablename ~ '^kinds_[0-9]+$'", &[]).await.unwrap().get(0);
            w.query_one(&format!("SELECT count(*) FROM {name}"), &[]).await.unwrap().get(0)
        } else {
            0
        };
        (counts.iter().sum::<i64>(), kind_rows)
    };
    let (moved_rows, clone_kinds) = on(new_port).await;
    let (stale_rows, old_kinds) = on(old_port).await;
    assert!(moved_rows > 0, "the new server has the node's updated rows");
    assert_eq!(stale_rows, 0, "nothing reached the old address");
    assert_eq!((clone_kinds, old_kinds), (3, 2));
    clone.stop().unwrap();
}

/// A distributed table of 100 rows in 4 shards, a reference table of two,
/// and a role that may log in but is no superuser.
const ITEMS_AND_KINDS: &str = "CREATE TABLE items (id int PRIMARY KEY, v int);
     SELECT create_distributed_table('items', 'id', shard_count => 4);
     CREATE TABLE kinds (k int PRIMARY KEY);
     SELECT create_reference_table('kinds');
     INSERT INTO items SELECT g, g FROM generate_series(1, 100) g;
     INSERT INTO kinds VALUES (1), (2);
     CREATE ROLE operator LOGIN;";

/// `citus_disable_node` takes a node out of service for maintenance (down
/// or not): statements that need its shards fail naming it, the rest go on,
/// reference tables keep their other copies. `citus_activate_node` brings
/// it back with what changed meanwhile.
#[tokio::test]
async fn a_node_is_disabled_for_maintenance_and_activated_again() {
    let cluster = TestCluster::start(2);
    let c = cluster.connect().await;
    let (first, second) = (cluster.cluster.state.worker_ports[0], cluster.cluster.state.worker_ports[1]);
    c.batch_execute(ITEMS_AND_KINDS).await.unwrap();
    c.batch_execute(&format!(
        "SELECT citus_set_node_property('127.0.0.1', {second}, 'shouldhaveshards', false);
         CREATE TABLE notes (id int, body text);
         SELECT create_distributed_table('notes', 'id', shard_count => 4, colocate_with => 'none');
         CREATE TABLE doomed (id int);
         SELECT create_distributed_table('doomed', 'id', shard_count => 4, colocate_with => 'none');
         SELECT citus_set_node_property('127.0.0.1', {second}, 'shouldhaveshards', true);
         INSERT INTO notes VALUES (1, 'a'), (2, 'b');"
    ))
    .await
    .unwrap();
    let on_first = format!(
        "SELECT min(id) FROM generate_series(1, 100) id WHERE (SELECT n.nodeport FROM pg_dist_placement p JOIN pg_dist_node n USING (groupid)
          WHERE p.shardid = get_shard_id_for_distribution_column('items', id)) = {first}"
    );
    let kept_id: i32 = text_rows(&c, &on_first).await[0][0].clone().unwrap().parse().unwrap();

    // Only a superuser, for a node that exists.
    let operator = common::connect_as(cluster.cluster.state.coordinator_port, "operator").await;
    let err = operator.simple_query(&format!("SELECT citus_disable_node('127.0.0.1', {second})")).await.unwrap_err();
    assert_eq!(sqlstate(&err), "42501", "{err}");
    let err = c.simple_query("SELECT citus_disable_node('127.0.0.1', 1)").await.unwrap_err();
    assert_eq!(sqlstate(&err), "42704", "{err}");

    c.batch_execute(&format!("SELECT citus_disable_node('127.0.0.1', {second})")).await.unwrap();
    assert_eq!(text_rows(&c, &format!("SELECT isactive FROM pg_dist_node WHERE nodeport = {second}")).await, vec![vec![Some("f".into())]]);
    assert_eq!(text_rows(&c, "SELECT node_port FROM master_get_active_worker_nodes()").await, vec![vec![Some(first.to_string())]]);
    // The last copy of a reference table stays in service.
    let err = c.simple_query(&format!("SELECT citus_disable_node('127.0.0.1', {first})")).await.unwrap_err();
    assert_eq!(sqlstate(&err), "55006", "{err}");
    assert!(error_text(&err).contains("kinds"), "{err}");
    let maintained = &cluster.workers()[1];
    maintained.stop().unwrap();

    // Its shards are out of reach, with the error saying so; the rest works.
    let err = c.simple_query("SELECT count(*) FROM items").await.unwrap_err();
    assert_eq!(sqlstate(&err), "55000", "{err}");
    assert!(error_text(&err).contains(&format!("127.0.0.1:{second}")) && error_text(&err).contains("citus_activate_node"), "{err}");
    assert_eq!(text_rows(&c, &format!("SELECT v FROM items WHERE id = {kept_id}")).await, vec![vec![Some(kept_id.to_string())]]);
    let err = c.simple_query("ALTER TABLE items ADD COLUMN w int").await.unwrap_err();
    assert_eq!(sqlstate(&err), "55000", "{err}");
    assert_eq!(text_rows(&c, "SELECT count(*) FROM information_schema.columns WHERE table_name = 'items'").await, vec![vec![Some("2".into())]]);
    c.batch_execute(
        "INSERT INTO kinds VALUES (3);
         INSERT INTO notes VALUES (3, 'c');
         ALTER TABLE notes ADD COLUMN tag text DEFAULT 'x';
         DROP TABLE doomed;
         CREATE TABLE fresh (id int);
         SELECT create_distributed_table('fresh', 'id');
         INSERT INTO fresh SELECT generate_series(1, 10);
         CREATE ROLE auditor;
         GRANT SELECT ON notes TO auditor;",
    )
    .await
    .unwrap();
    assert_eq!(text_rows(&c, "SELECT count(*), sum(k) FROM kinds").await, vec![vec![Some("3".into()), Some("6".into())]]);
    assert_eq!(text_rows(&c, "SELECT count(*) FROM fresh").await, vec![vec![Some("10".into())]]);
    // A node that cannot be reached is not put back in service.
    let err = c.simple_query(&format!("SELECT citus_activate_node('127.0.0.1', {second})")).await.unwrap_err();
    assert!(error_text(&err).contains(&second.to_string()), "{err}");
    assert_eq!(text_rows(&c, &format!("SELECT isactive FROM pg_dist_node WHERE nodeport = {second}")).await, vec![vec![Some("f".into())]]);

    maintained.start().unwrap();
    let id: i32 = c.query_one("SELECT citus_activate_node('127.0.0.1', $1)", &[&(second as i32)]).await.unwrap().get(0);
    let known: i32 = c.query_one("SELECT nodeid FROM pg_dist_node WHERE nodeport = $1", &[&(second as i32)]).await.unwrap().get(0);
    assert_eq!(id, known);
    assert_eq!(text_rows(&c, "SELECT count(*), sum(v) FROM items").await, vec![vec![Some("100".into()), Some("5050".into())]]);
    assert_eq!(
        text_rows(&c, "SELECT count(*) FROM items i JOIN kinds k ON k.k = i.v % 4").await,
        vec![vec![Some("75".into())]],
        "joins with the reference table read either copy"
    );
    c.batch_execute("ALTER TABLE items ADD COLUMN w int; UPDATE items SET w = v").await.unwrap();
    // The node has what changed: a fresh reference copy, the new column of
    // a table whose shards are elsewhere, the new table, the new role, and
    // no relation of the dropped table. Its own relations read the others'.
    let back = common::connect(second).await;
    assert_eq!(text_rows(&back, "SELECT count(*), sum(k) FROM kinds").await, vec![vec![Some("3".into()), Some("6".into())]]);
    assert_eq!(text_rows(&back, "SELECT string_agg(tag, ',' ORDER BY id) FROM notes").await, vec![vec![Some("x,x,x".into())]]);
    assert_eq!(text_rows(&back, "SELECT count(*) FROM fresh").await, vec![vec![Some("10".into())]]);
    assert_eq!(
        text_rows(&back, "SELECT to_regclass('doomed') IS NULL, EXISTS (SELECT FROM pg_roles WHERE rolname = 'auditor')").await,
        vec![vec![Some("t".into()), Some("t".into())]]
    );
    // Writes to the reference table reach its copy there again.
    c.batch_execute("INSERT INTO kinds VALUES (4)").await.unwrap();
    for port in [first, second] {
        assert_eq!(text_rows(&common::connect(port).await, "SELECT count(*) FROM kinds").await, vec![vec![Some("4".into())]], "node {port}");
    }
}

#[tokio::test]
async fn lock_waits_show_who_blocks_whom_on_every_node() {
    let cluster = TestCluster::start(2);
    let c = cluster.connect().await;
    c.batch_execute("CREATE TABLE stock (id int PRIMARY KEY, qty int); SELECT create_distributed_table('stock', 'id'); INSERT INTO stock SELECT g, 10 FROM generate_series(1, 10) g;")
        .await
        .unwrap();
    assert!(text_rows(&c, "SELECT * FROM citus_lock_waits").await.is_empty());

    let holder = cluster.connect().await;
    holder.batch_execute("BEGIN; UPDATE stock SET qty = qty - 1 WHERE id = 7").await.unwrap();
    let waiter = cluster.connect().await;
    let waiting = tokio::spawn(async move { waiter.execute("UPDATE stock SET qty = qty - 2 WHERE id = 7", &[]).await.map(|n| (n, waiter)) });
    let mut waits = Vec::new();
    for _ in 0..100 {
        waits = text_rows(&c, "SELECT w.blocked_statement, w.current_statement_in_blocking_process, w.waiting_nodeid = w.blocking_nodeid, a.application_name LIKE 'tessera:%'
                                FROM citus_lock_waits w JOIN citus_stat_activity a ON a.global_pid = w.waiting_gpid").await;
        if !waits.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(waits.len(), 1, "{waits:?}");
    let text = |i: usize| waits[0][i].clone().unwrap_or_default();
    assert!(text(0).contains("qty - 2") && text(0).contains("stock_"), "the waiting statement on the shard: {waits:?}");
    assert!(text(1).contains("qty - 1"), "the blocking session's statement: {waits:?}");
    assert_eq!((text(2), text(3)), ("t".to_string(), "t".to_string()), "both on the shard's node, serving client sessions");
    holder.batch_execute("COMMIT").await.unwrap();
    let (updated, _) = waiting.await.unwrap().unwrap();
    assert_eq!(updated, 1);
    assert!(text_rows(&c, "SELECT * FROM citus_lock_waits").await.is_empty());
    assert_eq!(text_rows(&c, "SELECT qty FROM stock WHERE id = 7").await, vec![vec![Some("7".into())]]);
}

/// Runs `sql` through the simple protocol, or through the extended one when
/// it starts with "extended: ".
async fn either_protocol(client: &tokio_postgres::Client, sql: &str) -> Result<(), tokio_postgres::Error> {
    match sql.strip_prefix("extended: ") {
        Some(sql) => client.query(sql, &[]).await.map(|_| ()),
        None => client.simple_query(sql).await.map(|_| ()),
    }
}

/// Writes planned while a table was local and held back by
/// create_distributed_table's lock never land, out of sight, in the table's
/// empty shell: a lone statement outside a block is sent again, to the
/// shards; in a block or through the extended protocol it fails with 40001.
#[tokio::test]
async fn writes_waiting_for_a_distribution_reach_the_shards_or_fail() {
    let cluster = TestCluster::start(2);
    let c = cluster.connect().await;
    c.batch_execute("CREATE TABLE signups (id int PRIMARY KEY, email text); INSERT INTO signups SELECT g, 'e' || g FROM generate_series(1, 1000) g;")
        .await
        .unwrap();
    c.batch_execute("BEGIN; SELECT create_distributed_table('signups', 'id')").await.unwrap();
    let mut waiting = Vec::new();
    for (sql, retried) in [
        ("INSERT INTO signups VALUES (-1, 'late')", true),
        ("UPDATE signups SET email = 'changed' WHERE id = 5", true),
        ("DELETE FROM signups WHERE id = 6", true),
        ("BEGIN; INSERT INTO signups VALUES (-2, 'in a block'); COMMIT", false),
        ("extended: DELETE FROM signups WHERE id = 7", false),
    ] {
        let writer = cluster.connect().await;
        waiting.push(tokio::spawn(async move { (either_protocol(&writer, sql).await, writer, sql, retried) }));
    }
    tokio::time::sleep(Duration::from_millis(700)).await;
    c.batch_execute("COMMIT").await.unwrap();
    for w in waiting {
        let (result, writer, sql, retried) = w.await.unwrap();
        if retried {
            result.unwrap_or_else(|e| panic!("{sql}: {e}"));
            continue;
        }
        let err = result.expect_err(sql);
        assert_eq!(sqlstate(&err), "40001", "{sql}: {err}");
        assert!(error_text(&err).contains("was distributed while this statement waited"), "{err}");
        writer.batch_execute("ROLLBACK").await.unwrap();
    }
    assert_eq!(
        text_rows(&c, "SELECT count(*), count(*) FILTER (WHERE email = 'changed'), min(id), count(*) FILTER (WHERE id IN (6, 7)) FROM signups").await,
        vec![vec![Some("1000".into()), Some("1".into()), Some("-1".into()), Some("1".into())]]
    );
    let shell = cluster.connect_coordinator_db().await;
    assert_eq!(text_rows(&shell, "SELECT count(*) FROM signups").await, vec![vec![Some("0".into())]]);
    // Tessera's own writes to the shell still work: TRUNCATE, INSERT … DEFAULT
    // VALUES (computed in the shell), undistributing.
    c.batch_execute("CREATE TABLE counters (id serial PRIMARY KEY, n int DEFAULT 7); SELECT create_distributed_table('counters', 'id'); INSERT INTO counters DEFAULT VALUES; TRUNCATE signups; SELECT undistribute_table('counters')").await.unwrap();
    assert_eq!(text_rows(&shell, "SELECT id, n FROM counters").await, vec![vec![Some("1".into()), Some("7".into())]]);
    shell.batch_execute("INSERT INTO counters (n) VALUES (8)").await.unwrap();
    assert_eq!(text_rows(&c, "SELECT count(*) FROM signups").await, vec![vec![Some("0".into())]]);

    // create_distributed_table_concurrently: the same, outside a block only.
    c.batch_execute("CREATE TABLE invites (id int PRIMARY KEY); INSERT INTO invites SELECT generate_series(1, 50); BEGIN").await.unwrap();
    let err = c.simple_query("SELECT create_distributed_table_concurrently('invites', 'id')").await.unwrap_err();
    assert_eq!(sqlstate(&err), "25001", "{err}");
    c.batch_execute("ROLLBACK; SELECT create_distributed_table_concurrently('invites', 'id', shard_count => 2)").await.unwrap();
    assert_eq!(
        text_rows(&c, "SELECT count(*), (SELECT count(*) FROM pg_dist_shard WHERE logicalrelid = 'invites'::regclass) FROM invites").await,
        vec![vec![Some("50".into()), Some("2".into())]]
    );
}

/// Statements outside a block that wait for a shard alter_distributed_table
/// drops are planned again once it commits, and reach the new shards.
#[tokio::test]
async fn statements_waiting_for_old_shards_follow_the_table_to_its_new_ones() {
    let cluster = TestCluster::start(2);
    let c = cluster.connect().await;
    c.batch_execute("CREATE TABLE visits (id int PRIMARY KEY, n int); SELECT create_distributed_table('visits', 'id', shard_count => 4); INSERT INTO visits SELECT g, 0 FROM generate_series(1, 1000) g;")
        .await
        .unwrap();
    c.batch_execute("BEGIN; SELECT alter_distributed_table('visits', shard_count => 8)").await.unwrap();
    let mut waiting = Vec::new();
    for sql in [
        "INSERT INTO visits VALUES (-1, 1)",
        "extended: UPDATE visits SET n = n + 1 WHERE id = 500",
        "SELECT count(*) FROM visits",
        "extended: SELECT n FROM visits WHERE id = 7",
    ] {
        let client = cluster.connect().await;
        waiting.push(tokio::spawn(async move { (sql, either_protocol(&client, sql).await) }));
    }
    tokio::time::sleep(Duration::from_millis(700)).await;
    c.batch_execute("COMMIT").await.unwrap();
    for w in waiting {
        let (sql, result) = w.await.unwrap();
        result.unwrap_or_else(|e| panic!("{sql}: {e}"));
    }
    assert_eq!(
        text_rows(&c, "SELECT count(*), sum(n), (SELECT count(*) FROM pg_dist_shard WHERE logicalrelid = 'visits'::regclass) FROM visits").await,
        vec![vec![Some("1001".into()), Some("2".into()), Some("8".into())]]
    );
}
