//! EXPLAIN shows the distributed plan, and pins which tier each query shape
//! takes: a shape that can be pushed down must not silently fall back.

mod common;
use common::{text_rows, TestCluster};

/// The lines of `EXPLAIN (options) sql`.
async fn explain_with(c: &tokio_postgres::Client, options: &str, sql: &str) -> Vec<String> {
    text_rows(c, &format!("EXPLAIN ({options}) {sql}")).await.into_iter().filter_map(|row| row.into_iter().next().flatten()).collect()
}

async fn explain(c: &tokio_postgres::Client, sql: &str) -> Vec<String> {
    explain_with(c, "COSTS OFF", sql).await
}

/// The rows the nodes sent the coordinator, from EXPLAIN ANALYZE's `Tasks Run:` line.
fn rows_received(analyzed: &str) -> u64 {
    let counted = analyzed.split("Tasks Run: all, in ").nth(1).and_then(|r| r.split("; ").nth(1)).and_then(|r| r.split(' ').next());
    counted.and_then(|n| n.parse().ok()).unwrap_or_else(|| panic!("no rows received in {analyzed}"))
}

#[tokio::test]
async fn each_shape_takes_its_tier() {
    let cluster = TestCluster::start(2);
    let c = cluster.connect().await;
    c.batch_execute(
        "CREATE TABLE ea (k int PRIMARY KEY, g int, v int);
         CREATE TABLE eb (k int PRIMARY KEY, w int);
         CREATE TABLE ec (k int PRIMARY KEY, z int);
         CREATE TABLE er (id int PRIMARY KEY, name text);
         CREATE TABLE elocal (id int);
         SELECT create_distributed_table('ea', 'k', shard_count => 4);
         SELECT create_distributed_table('eb', 'k', colocate_with => 'ea');
         SELECT create_distributed_table('ec', 'k', colocate_with => 'none');
         SELECT create_reference_table('er');
         CREATE VIEW ea_big AS SELECT k, g, v FROM ea WHERE v > 10;
         CREATE VIEW ea_named (key, grp) AS SELECT ea.k, er.name FROM ea JOIN er ON er.id = ea.g;
         CREATE VIEW ea_per_g AS SELECT g, count(*) AS n FROM ea GROUP BY g;
         CREATE FUNCTION ea_total(key int) RETURNS bigint LANGUAGE plpgsql AS $$ BEGIN RETURN (SELECT sum(v) FROM ea WHERE k = key); END $$;",
    )
    .await
    .unwrap();
    let tier = |lines: &[String]| lines.first().cloned().unwrap_or_default();
    let cases = [
        ("SELECT * FROM ea WHERE k = 5", "Custom Scan (Tessera Router)"),
        ("SELECT * FROM ea JOIN eb ON ea.k = eb.k WHERE ea.k = 5", "Custom Scan (Tessera Router)"),
        ("SELECT * FROM ea JOIN eb USING (k) WHERE ea.k = 5", "Custom Scan (Tessera Router)"),
        ("SELECT count(*) FROM ea LEFT JOIN eb USING (k)", "Custom Scan (Tessera Multi-Shard)"),
        // A key pinned in an inner join's ON clause pins as in WHERE; on an
        // outer join's nullable side it pins that side only.
        ("SELECT * FROM ea JOIN eb ON eb.k = ea.k AND ea.k = 5", "Custom Scan (Tessera Router)"),
        ("SELECT * FROM ea JOIN eb ON eb.k = 5 AND ea.k = 5 AND eb.w = ea.v", "Custom Scan (Tessera Router)"),
        ("SELECT count(*) FROM ea LEFT JOIN eb ON eb.k = ea.k AND eb.k = 5", "Custom Scan (Tessera Multi-Shard)"),
        ("SELECT count(*) FROM ea LEFT JOIN (eb JOIN er ON eb.k = 5 AND er.id = eb.w) ON eb.k = ea.k", "Custom Scan (Tessera Multi-Shard)"),
        ("UPDATE ea SET v = 1 WHERE k = 3", "Custom Scan (Tessera Router)"),
        // WITH queries whose every part reads (or writes) one shard group.
        ("WITH m AS (SELECT * FROM ea WHERE k = 5) SELECT count(*) FROM m, eb WHERE eb.k = 5", "Custom Scan (Tessera Router)"),
        ("WITH gone AS (DELETE FROM ea WHERE k = 5 RETURNING v) SELECT sum(v) FROM gone", "Custom Scan (Tessera Router)"),
        ("WITH m AS (SELECT * FROM ea) SELECT count(*) FROM m", "Custom Scan (Tessera General Fallback)"),
        ("SELECT * FROM er", "Custom Scan (Tessera Router)"),
        ("SELECT count(*), sum(v) FROM ea", "Custom Scan (Tessera Multi-Shard)"),
        ("SELECT ea.k, eb.w FROM ea JOIN eb ON ea.k = eb.k", "Custom Scan (Tessera Multi-Shard)"),
        ("SELECT ea.k, er.name FROM ea JOIN er ON er.id = ea.g", "Custom Scan (Tessera Multi-Shard)"),
        ("SELECT g, count(*), avg(v) FROM ea GROUP BY g HAVING sum(v) > 1 ORDER BY 3 DESC LIMIT 2", "Custom Scan (Tessera Multi-Shard)"),
        ("SELECT k, v FROM ea ORDER BY v DESC, k LIMIT 5 OFFSET 1", "Custom Scan (Tessera Multi-Shard)"),
        ("SELECT DISTINCT g FROM ea", "Custom Scan (Tessera Multi-Shard)"),
        (
            "SELECT round(sum(v)::numeric / count(*), 2), bool_and(v > 0) FILTER (WHERE g = 1) FROM ea JOIN eb ON ea.k = eb.k",
            "Custom Scan (Tessera Multi-Shard)",
        ),
        ("UPDATE ea SET v = v + 1", "Custom Scan (Tessera Multi-Shard)"),
        ("INSERT INTO eb (k, w) SELECT k, v FROM ea WHERE g > 1", "Custom Scan (Tessera Multi-Shard)"),
        ("INSERT INTO eb (k, w) SELECT g, count(*) FROM ea GROUP BY g", "Custom Scan (Tessera INSERT … SELECT through the Coordinator)"),
        ("INSERT INTO ea (k) SELECT id FROM elocal", "Custom Scan (Tessera INSERT … SELECT through the Coordinator)"),
        ("DELETE FROM ea WHERE v > 10", "Custom Scan (Tessera Multi-Shard)"),
        // Joins that are not co-located ship the smaller side to the shards.
        ("SELECT * FROM ea JOIN ec ON ea.k = ec.k", "Custom Scan (Tessera Broadcast)"),
        ("SELECT * FROM ea JOIN eb ON ea.g = eb.w", "Custom Scan (Tessera Broadcast)"),
        // Heavy aggregates and windows keyed by the distribution column run
        // whole per shard; DISTINCT aggregates of one value in two phases;
        // other windows, aggregates and grouping sets over the columns the
        // shards send.
        ("SELECT k, rank() OVER (PARTITION BY k ORDER BY v) FROM ea", "Custom Scan (Tessera Multi-Shard)"),
        ("SELECT k, percentile_cont(0.5) WITHIN GROUP (ORDER BY v) FROM ea GROUP BY k", "Custom Scan (Tessera Multi-Shard)"),
        ("SELECT count(DISTINCT g) FROM ea", "Custom Scan (Tessera Multi-Shard)"),
        ("SELECT count(DISTINCT g), count(DISTINCT v) FROM ea", "Custom Scan (Tessera Multi-Shard)"),
        ("SELECT string_agg(k::text, ',' ORDER BY k) FROM ea", "Custom Scan (Tessera Multi-Shard)"),
        ("SELECT g, count(*) FROM ea GROUP BY ROLLUP (g)", "Custom Scan (Tessera Multi-Shard)"),
        ("SELECT k, rank() OVER (ORDER BY v) FROM ea", "Custom Scan (Tessera Multi-Shard)"),
        ("SELECT DISTINCT ON (g) g, k FROM ea ORDER BY g, v", "Custom Scan (Tessera Multi-Shard)"),
        (
            "SELECT g, percentile_disc(0.5) WITHIN GROUP (ORDER BY v), mode() WITHIN GROUP (ORDER BY v) FROM ea GROUP BY g",
            "Custom Scan (Tessera Multi-Shard)",
        ),
        // Subqueries joined on the distribution column to the query around
        // them read each row's own shard group: they go along.
        ("SELECT count(*) FROM ea WHERE EXISTS (SELECT 1 FROM eb WHERE eb.k = ea.k AND eb.w > 1)", "Custom Scan (Tessera Multi-Shard)"),
        ("SELECT * FROM ea WHERE k = 5 AND EXISTS (SELECT 1 FROM eb WHERE eb.k = ea.k)", "Custom Scan (Tessera Router)"),
        ("SELECT count(*) FROM ea WHERE k IN (SELECT k FROM eb WHERE w > 1)", "Custom Scan (Tessera Multi-Shard)"),
        ("SELECT count(*) FROM ea JOIN (SELECT k, count(*) AS n FROM eb GROUP BY k) s ON s.k = ea.k", "Custom Scan (Tessera Multi-Shard)"),
        ("UPDATE ea SET v = (SELECT max(w) FROM eb WHERE eb.k = ea.k)", "Custom Scan (Tessera Multi-Shard)"),
        ("DELETE FROM ea WHERE NOT EXISTS (SELECT 1 FROM eb WHERE eb.k = ea.k)", "Custom Scan (Tessera Multi-Shard)"),
        // Not row for row by key (an aggregate over several keys), but
        // uncorrelated: computed first, its values an array constant.
        ("SELECT count(*) FROM ea WHERE k IN (SELECT max(k) FROM eb GROUP BY w)", "Custom Scan (Tessera Subqueries First)"),
        // EXISTS and NOT EXISTS correlated on another column: the set of the
        // subquery's keys is computed first.
        ("SELECT count(*) FROM er WHERE NOT EXISTS (SELECT 1 FROM ea WHERE ea.g = er.id)", "Custom Scan (Tessera Subqueries First)"),
        ("SELECT count(*) FROM ec WHERE EXISTS (SELECT 1 FROM ea WHERE ea.v = ec.z AND ea.g > 1)", "Custom Scan (Tessera Subqueries First)"),
        (
            "SELECT count(*) FROM (SELECT id FROM er WHERE NOT EXISTS (SELECT 1 FROM ea WHERE ea.g = er.id)) s",
            "Custom Scan (Tessera Subqueries First)",
        ),
        // An uncorrelated scalar subquery is computed first, its value a constant.
        ("SELECT * FROM ea WHERE v > (SELECT avg(z) FROM ec)", "Custom Scan (Tessera Subqueries First)"),
        ("SELECT * FROM ea WHERE v > (SELECT avg(w) FROM eb WHERE eb.k = ea.g)", "Custom Scan (Tessera Broadcast)"),
        ("SELECT e.k FROM ea e JOIN elocal l ON l.id = e.k", "Custom Scan (Tessera General Fallback)"),
        // A simple view merges into the query that reads it: it takes the
        // tier the written-out query would; other views are subqueries.
        ("SELECT * FROM ea_big WHERE k = 5", "Custom Scan (Tessera Router)"),
        ("SELECT g, count(*) FROM ea_big GROUP BY g", "Custom Scan (Tessera Multi-Shard)"),
        ("SELECT grp FROM ea_named WHERE key = 3", "Custom Scan (Tessera Router)"),
        ("SELECT * FROM ea_per_g", "Custom Scan (Tessera General Fallback)"),
        // User code that reaches distributed tables runs whole on a worker.
        ("SELECT ea_total(3)", "Custom Scan (Tessera Whole Statement on a Worker)"),
        ("SELECT k, ea_total(k) FROM ea WHERE g = 1", "Custom Scan (Tessera Whole Statement on a Worker)"),
        // So do writing WITH queries one shard group cannot answer.
        (
            "WITH gone AS (DELETE FROM ea WHERE k = 5 RETURNING k, v) INSERT INTO eb SELECT k, v FROM gone",
            "Custom Scan (Tessera Whole Statement on a Worker)",
        ),
        ("WITH gone AS (DELETE FROM ea WHERE v > 3 RETURNING k) SELECT count(*) FROM gone", "Custom Scan (Tessera Whole Statement on a Worker)"),
    ];
    for (sql, expected) in cases {
        let lines = explain(&c, sql).await;
        assert_eq!(tier(&lines), expected, "{sql}:\n{}", lines.join("\n"));
    }
    // Local statements are explained by the coordinator database itself.
    assert!(!tier(&explain(&c, "SELECT * FROM elocal").await).contains("Tessera"));

    // EXPLAIN EXECUTE of a statement prepared over distributed tables
    // explains it with the arguments written in; of a local one, as the
    // coordinator database does.
    c.batch_execute("PREPARE by_key(int) AS SELECT v FROM ea WHERE k = $1; PREPARE by_g(int) AS SELECT count(*) FROM ea WHERE g = $1; PREPARE local_one(int) AS SELECT * FROM elocal WHERE id = $1")
        .await
        .unwrap();
    let routed = explain(&c, "EXECUTE by_key(2 + 3)").await.join("\n");
    assert!(routed.starts_with("Custom Scan (Tessera Router)") && routed.contains("(k = 5)"), "{routed}");
    let spread = explain(&c, "EXECUTE by_g(7)").await.join("\n");
    assert!(spread.starts_with("Custom Scan (Tessera Multi-Shard)") && spread.contains("(g = 7)"), "{spread}");
    let analyzed = explain_with(&c, "ANALYZE, COSTS OFF", "EXECUTE by_g(7)").await.join("\n");
    assert!(analyzed.contains("Tasks Run: all"), "{analyzed}");
    let local = explain(&c, "EXECUTE local_one(1)").await.join("\n");
    assert!(local.contains("Seq Scan on elocal") && !local.contains("Tessera"), "{local}");
    let e = c.simple_query("EXPLAIN EXECUTE by_key(1, 2)").await.unwrap_err();
    assert_eq!(e.code().map(|c| c.code()), Some("42601"), "{e}");

    // A task's plan comes from its worker, named with its node.
    let lines = explain(&c, "SELECT count(*) FROM ea").await;
    let text = lines.join("\n");
    assert!(text.contains("Task Count: 4") && text.contains("Tasks Shown: One of 4"), "{text}");
    let port = cluster.workers()[0].port;
    let other = cluster.workers()[1].port;
    assert!(text.contains(&format!("port={port}")) || text.contains(&format!("port={other}")), "{text}");
    assert!(text.contains("Aggregate") && text.contains("Seq Scan on ea_"), "the worker's own plan of its shard:\n{text}");
    // With one connection per worker, each worker's one statement joins all
    // its shards with the reference table.
    c.batch_execute("SET citus.max_adaptive_executor_pool_size = 1").await.unwrap();
    let joined = "SELECT count(*) FROM ea JOIN er ON er.id = ea.g";
    let text = explain(&c, joined).await.join("\n");
    assert!(text.contains("Task Count: 2") && text.contains("Shard Groups: 4, several read by each task"), "{text}");
    assert!(text.contains("Append") && text.matches("Scan on ea_").count() == 2, "an append of the node's two shards:\n{text}");
    // A system column is the shard's own; the session may keep a statement per shard too.
    let text = explain(&c, "SELECT count(*) FROM ea JOIN er ON er.id = ea.g WHERE ea.ctid IS NOT NULL").await.join("\n");
    assert!(text.contains("Task Count: 4") && !text.contains("Shard Groups"), "{text}");
    c.batch_execute("SET tessera.merge_shard_tasks = off").await.unwrap();
    let text = explain(&c, joined).await.join("\n");
    assert!(text.contains("Task Count: 4") && !text.contains("Append"), "{text}");
    c.batch_execute("RESET tessera.merge_shard_tasks; RESET citus.max_adaptive_executor_pool_size").await.unwrap();
    // The fallback shows the coordinator database's plan over the foreign shards.
    let text = explain(&c, "SELECT e.k FROM ea e JOIN elocal l ON l.id = e.k").await.join("\n");
    assert!(text.contains("Foreign Scan"), "{text}");
    // Shipped columns: the shards send only what the combine reads.
    let text = explain(&c, "SELECT g, rank() OVER (ORDER BY v) FROM ea WHERE v > 1").await.join("\n");
    assert!(text.contains("Combine: SELECT tessera_p_000 AS g, rank() OVER (ORDER BY tessera_p_001) AS rank FROM tessera_partials"), "{text}");
    assert!(text.contains("Filter: (v > 1)"), "the shards filter:\n{text}");
    // Aggregate arguments go whole; DISTINCT aggregates of several values
    // have each shard send each value once, in a grouping set of its own.
    let text = explain(&c, "SELECT count(DISTINCT g % 3), count(DISTINCT v) FROM ea").await.join("\n");
    assert!(
        text.contains("Combine: SELECT count(DISTINCT tessera_p_000) FILTER (WHERE tessera_p_002 = 1) AS count, count(DISTINCT tessera_p_001) FILTER (WHERE tessera_p_002 = 2) AS count FROM tessera_partials"),
        "{text}"
    );
    assert!(text.contains("Hash Key: (g % 3)") && text.contains("Hash Key: v"), "the shards send distinct values:\n{text}");
    // Aggregates blind to repeats have each shard send each combination once.
    let text = explain(&c, "SELECT count(DISTINCT g % 3), max(v) FROM ea").await.join("\n");
    assert!(text.contains("HashAggregate") || text.contains("Unique"), "the shards send distinct values:\n{text}");
    // A broadcast shows the pushdown it turned into, with the shipped rows in the task.
    let text = explain(&c, "SELECT * FROM ea JOIN ec ON ea.g = ec.z").await.join("\n");
    assert!(
        text.contains("->  Custom Scan (Tessera Multi-Shard)") && (text.contains("Values Scan") || text.contains("One-Time Filter: false")),
        "{text}"
    );
    // Where user code ran: the node, and the worker's plan of the call.
    let text = explain(&c, "SELECT ea_total(3)").await.join("\n");
    assert!(text.contains(&format!("port={port}")) && text.contains("Result"), "{text}");
    // A writing WITH query pinned to one shard group runs on that group's node.
    for key in [5, 6, 7, 8] {
        let ports = common::placement_ports(&c, "ea").await;
        let home = ports[common::shard_of_int4(key, ports.len() as u32)];
        let text = explain(&c, &format!("WITH gone AS (DELETE FROM ea WHERE k = {key} RETURNING k, v) INSERT INTO eb SELECT k, v FROM gone"))
            .await
            .join("\n");
        assert!(text.contains(&format!("port={home}")), "key {key} lives on port {home}:\n{text}");
    }
    // EXPLAIN ANALYZE runs the statement.
    c.batch_execute("INSERT INTO ea VALUES (1, 1, 1), (2, 2, 2)").await.unwrap();
    let text = explain(&c, "SELECT * FROM ea WHERE k = 2").await.join("\n");
    assert!(text.contains("Index Scan") || text.contains("Seq Scan"), "{text}");
    let analyzed = explain_with(&c, "ANALYZE", "SELECT * FROM ea WHERE k = 2").await;
    assert!(analyzed.iter().any(|l| l.contains("actual time")), "{analyzed:?}");
    // Across shards every task runs; each node's share is reported.
    c.batch_execute("INSERT INTO ea SELECT g, g % 3, g FROM generate_series(3, 400) g").await.unwrap();
    let analyzed = explain_with(&c, "ANALYZE", "SELECT g, v FROM ea WHERE v > 100").await.join("\n");
    assert!(analyzed.contains("Tasks Run: all, in ") && analyzed.contains("300 rows, "), "{analyzed}");
    let nodes: Vec<&str> = analyzed.lines().filter(|l| l.starts_with("  Node host=")).collect();
    assert_eq!(nodes.len(), 2, "{analyzed}");
    let rows: u64 = nodes.iter().map(|l| l.split(", ").nth(1).and_then(|r| r.strip_suffix(" rows")).unwrap().parse::<u64>().unwrap()).sum();
    assert_eq!(rows, 300, "{analyzed}");
    assert!(nodes.iter().all(|l| l.contains(" tasks on ") && l.contains(" bytes, done at ")), "{analyzed}");
    assert!(analyzed.contains("actual time"), "one task's own analyzed plan:\n{analyzed}");
    // EXPLAIN ANALYZE of a write makes it on every shard, as PostgreSQL
    // does, in one transaction; one task's plan is shown.
    let analyzed = explain_with(&c, "ANALYZE", "UPDATE ea SET v = -v WHERE v > 100").await.join("\n");
    assert!(analyzed.contains("Update on ea_") && analyzed.contains("Tasks Shown: One of 4"), "{analyzed}");
    let negated = c.query_one("SELECT count(*) FROM ea WHERE v < -100", &[]).await.unwrap();
    assert_eq!(negated.get::<_, i64>(0), 300);
    c.batch_execute("BEGIN; EXPLAIN ANALYZE DELETE FROM ea WHERE v < -100; ROLLBACK").await.unwrap();
    let kept = c.query_one("SELECT count(*) FROM ea WHERE v < -100", &[]).await.unwrap();
    assert_eq!(kept.get::<_, i64>(0), 300, "rolled back with its block");

    json_format(&c).await;
    variances_by_input_type(&c).await;
    repartition_joins(&cluster, &c).await;
    rows_copied_between_nodes(&cluster, &c).await;
    reference_keys_first(&c).await;
    tasks_without_parallel_workers(&cluster, &c).await;
    percentiles_in_two_passes(&c).await;
    top_ranks_only(&c).await;
    distinct_values_once(&c).await;
    sketches_merged(&c).await;
    approximate_distinct_counts(&c).await;
}

/// FORMAT JSON: one value of type json, PostgreSQL's shape, with each
/// node's own plan in JSON under its task.
async fn json_format(c: &tokio_postgres::Client) {
    let plan = |sql: &'static str| async move {
        let row = c.query_one(&format!("EXPLAIN (FORMAT JSON) {sql}"), &[]).await.unwrap();
        assert_eq!(row.columns()[0].type_(), &tokio_postgres::types::Type::JSON);
        let value: serde_json::Value = row.get(0);
        value[0]["Plan"].clone()
    };
    let router = plan("SELECT * FROM ea WHERE k = 2").await;
    assert_eq!((router["Node Type"].as_str(), router["Custom Plan Provider"].as_str()), (Some("Custom Scan"), Some("Tessera Router")), "{router}");
    assert_eq!(router["Task Count"], 1, "{router}");
    let task = &router["Plans"][0];
    assert!(task["Node"].as_str().is_some_and(|n| n.starts_with("host=")), "{router}");
    assert!(task["Remote Plan"][0]["Plan"]["Node Type"].as_str().is_some_and(|t| t.contains("Scan")), "{router}");
    let analyzed = c.query_one("EXPLAIN (ANALYZE, FORMAT JSON) SELECT g, v FROM ea WHERE v > 100", &[]).await.unwrap();
    let analyzed: serde_json::Value = analyzed.get(0);
    let multi = &analyzed[0]["Plan"];
    assert_eq!(multi["Custom Plan Provider"], "Tessera Multi-Shard", "{multi}");
    assert!(multi["Tasks Run"].as_str().is_some_and(|r| r.starts_with("all, in ")), "{multi}");
    assert!(multi["Plans"][0]["Remote Plan"][0]["Execution Time"].is_number(), "{multi}");
    let fallback = plan("WITH m AS (SELECT * FROM ea) SELECT count(*) FROM m").await;
    assert_eq!(fallback["Custom Plan Provider"], "Tessera General Fallback", "{fallback}");
    assert!(fallback["Reason"].is_string() && fallback["Remote Plan"][0]["Plan"].is_object(), "{fallback}");
    let first = plan("SELECT * FROM ea WHERE v > (SELECT avg(z) FROM ec)").await;
    assert_eq!(first["Custom Plan Provider"], "Tessera Subqueries First", "{first}");
    assert_eq!((first["Plans"][0]["Node Type"].as_str(), first["Plans"][0]["Subquery Number"].as_i64()), (Some("Subquery"), Some(1)), "{first}");
    assert_eq!(first["Plans"][0]["Plans"][0]["Custom Plan Provider"], "Tessera Multi-Shard", "{first}");
    assert_eq!(first["Plans"][1]["Custom Plan Provider"], "Tessera Multi-Shard", "{first}");
    let e = c.query("EXPLAIN (FORMAT YAML) SELECT * FROM ea WHERE k = 2", &[]).await.unwrap_err();
    assert_eq!(common::sqlstate(&e), "0A000", "{e}");
}

/// The catalog knows column types: a float column's variance sends each
/// shard's float8 state, an integer column's sums its squares in int8.
async fn variances_by_input_type(c: &tokio_postgres::Client) {
    c.batch_execute("CREATE TABLE ev (k int PRIMARY KEY, x float8, n int); SELECT create_distributed_table('ev', 'k', shard_count => 4);")
        .await
        .unwrap();
    let text = explain_with(c, "VERBOSE, COSTS OFF", "SELECT stddev(x), var_pop(n) FROM ev").await.join("\n");
    assert!(text.contains("var_pop(x)") && text.contains("((n)::bigint * (n)::bigint)") && !text.contains("numeric"), "{text}");
}

/// The workers start no parallel workers within a task: a node already runs
/// as many tasks at once as it has cores. The coordinator database, which
/// combines and runs the general fallback alone, keeps them.
async fn tasks_without_parallel_workers(cluster: &TestCluster, c: &tokio_postgres::Client) {
    for i in 0..2 {
        let w = cluster.connect_worker(i).await;
        let setting: String = w.query_one("SHOW max_parallel_workers_per_gather", &[]).await.unwrap().get(0);
        assert_eq!(setting, "0", "worker {i}");
    }
    c.batch_execute("CREATE TABLE pw (k int PRIMARY KEY, v int); SELECT create_distributed_table('pw', 'k', shard_count => 2); INSERT INTO pw SELECT g, g % 9 FROM generate_series(1, 500000) g; ANALYZE pw;")
        .await
        .unwrap();
    let text = explain(c, "SELECT v, count(*) FROM pw GROUP BY v").await.join("\n");
    assert!(text.contains("Custom Scan (Tessera Multi-Shard)") && !text.contains("Gather"), "{text}");
}

/// Percentiles of numbers come from two passes that send counts, quantiles
/// and the values near the wanted ranks, not the rows; the same answers as
/// PostgreSQL over a local copy of the table. Text sort keys ship the rows.
async fn percentiles_in_two_passes(c: &tokio_postgres::Client) {
    c.batch_execute(
        "CREATE TABLE pq (k int PRIMARY KEY, g int, x int, t text);
         INSERT INTO pq SELECT i, i % 3, (i * 7919) % 10007, 't' || i FROM generate_series(1, 30000) i;
         CREATE TABLE pq_local AS SELECT * FROM pq;
         SELECT create_distributed_table('pq', 'k', shard_count => 4);",
    )
    .await
    .unwrap();
    let query = |table: &str| {
        format!("SELECT g, percentile_cont(0.37) WITHIN GROUP (ORDER BY x), percentile_disc(0.5) WITHIN GROUP (ORDER BY x) FROM {table} GROUP BY g ORDER BY g")
    };
    let analyzed = explain_with(c, "ANALYZE", &query("pq")).await.join("\n");
    assert!(analyzed.contains("Combine: percentiles in two passes"), "{analyzed}");
    let received = rows_received(&analyzed);
    assert!(received <= 12, "one row per task and group in the first pass: {analyzed}");
    let answers =
        |rows: Vec<tokio_postgres::Row>| rows.iter().map(|r| (r.get::<_, i32>(0), r.get::<_, f64>(1), r.get::<_, i32>(2))).collect::<Vec<_>>();
    let distributed = answers(c.query(&query("pq"), &[]).await.unwrap());
    assert_eq!(distributed, answers(c.query(&query("pq_local"), &[]).await.unwrap()));
    assert_eq!(distributed.len(), 3);
    let text = explain(c, "SELECT g, percentile_disc(0.5) WITHIN GROUP (ORDER BY t) FROM pq GROUP BY g").await.join("\n");
    assert!(text.contains("Combine: SELECT") && text.contains("percentile_disc(0.5)"), "a collatable sort key ships its rows: {text}");
    // Integer arithmetic is an integer: its percentiles take the passes too.
    let expression = |table: &str| format!("SELECT percentile_cont(0.9) WITHIN GROUP (ORDER BY x + k % 1000) FROM {table}");
    let text = explain(c, &expression("pq")).await.join("\n");
    assert!(text.contains("Combine: percentiles in two passes"), "{text}");
    let value = |rows: Vec<tokio_postgres::Row>| rows[0].get::<_, f64>(0);
    assert_eq!(value(c.query(&expression("pq"), &[]).await.unwrap()), value(c.query(&expression("pq_local"), &[]).await.unwrap()));
}

/// ORDER BY a rank over another column's partitions with LIMIT k: each
/// task sends its rows ranked k or better, not all of them.
async fn top_ranks_only(c: &tokio_postgres::Client) {
    c.batch_execute(
        "CREATE TABLE tk (k int PRIMARY KEY, g int, x int);
         INSERT INTO tk SELECT i, i % 5, (i * 7919) % 10007 FROM generate_series(1, 20000) i;
         SELECT create_distributed_table('tk', 'k', shard_count => 4);",
    )
    .await
    .unwrap();
    let top = "SELECT g, k, rank() OVER (PARTITION BY g ORDER BY x DESC) AS r FROM tk ORDER BY r, g LIMIT 3";
    let analyzed = explain_with(c, "ANALYZE", top).await.join("\n");
    let received = rows_received(&analyzed);
    assert!(received <= 4 * 5 * 3, "each task's 3 best per partition: {analyzed}");
    let rows = c.query(top, &[]).await.unwrap();
    assert_eq!(rows.iter().map(|r| r.get::<_, i64>(2)).collect::<Vec<_>>(), vec![1, 1, 1]);
    let every = explain_with(c, "ANALYZE", &top.replace("ORDER BY r, g", "ORDER BY r DESC, g")).await.join("\n");
    assert!(every.contains("20000 rows, "), "ranks from the end need every row: {every}");
}

/// Several DISTINCT aggregates: each shard sends each value of each once,
/// not each combination of them.
async fn distinct_values_once(c: &tokio_postgres::Client) {
    c.batch_execute(
        "CREATE TABLE dv (k int PRIMARY KEY, a int, b int);
         INSERT INTO dv SELECT i, i % 1000, i % 7 FROM generate_series(1, 20000) i;
         SELECT create_distributed_table('dv', 'k', shard_count => 4);",
    )
    .await
    .unwrap();
    let query = "SELECT count(DISTINCT a), count(DISTINCT b), sum(DISTINCT b) FROM dv";
    let analyzed = explain_with(c, "ANALYZE", query).await.join("\n");
    let received = rows_received(&analyzed);
    assert!(received <= 4 * (1000 + 7), "each shard's values of a, then of b: {analyzed}");
    let row = c.query_one(query, &[]).await.unwrap();
    assert_eq!((row.get::<_, i64>(0), row.get::<_, i64>(1), row.get::<_, i64>(2)), (1000, 7, 21));
    // The distribution column's distinct values are each shard's own: the
    // shards count them, and send one row each.
    let keys = "SELECT count(DISTINCT k), avg(DISTINCT k)::float8 FROM dv";
    let analyzed = explain_with(c, "ANALYZE", keys).await.join("\n");
    assert_eq!(rows_received(&analyzed), 4, "{analyzed}");
    let row = c.query_one(keys, &[]).await.unwrap();
    assert_eq!((row.get::<_, i64>(0), row.get::<_, f64>(1)), (20000, 10000.5));
    // Of a column with many values (by the shards' statistics), the rows
    // move node to node by its hash, and each shard group counts its own:
    // as they are where the values are mostly unique in a shard, else each
    // node sending each row once.
    c.batch_execute(
        "CREATE TABLE dm (k int PRIMARY KEY, item int, repeated int, g int);
         SELECT create_distributed_table('dm', 'k', shard_count => 2);
         INSERT INTO dm SELECT i, i, i % 150000, i % 3 FROM generate_series(1, 600000) i;
         ANALYZE dm;",
    )
    .await
    .unwrap();
    let distinct_in_groups = |value: fn(i32) -> i32| -> Vec<(i32, i64)> {
        (0..3).map(|g| (g, (1..=600000).filter(|i| i % 3 == g).map(value).collect::<std::collections::HashSet<i32>>().len() as i64)).collect()
    };
    for (column, moved, expected) in
        [("item", "dm", distinct_in_groups(|i| i)), ("repeated", "distinct rows of dm", distinct_in_groups(|i| i % 150000))]
    {
        let many = format!("SELECT g, count(DISTINCT {column}) FROM dm GROUP BY g ORDER BY g");
        let analyzed = explain_with(c, "ANALYZE", &many).await.join("\n");
        assert!(analyzed.starts_with("Custom Scan (Tessera Repartitioned Aggregate)"), "{analyzed}");
        assert!(analyzed.contains(&format!("Moved: {moved} by {column} node to node")) && analyzed.contains("Rows Moved: "), "{analyzed}");
        // One shard per node, each node's own rows read where they lie.
        assert!(analyzed.contains("one shard per node") && analyzed.contains("Task Count: 2"), "{analyzed}");
        let counts: Vec<(i32, i64)> = c.query(&many, &[]).await.unwrap().iter().map(|r| (r.get(0), r.get(1))).collect();
        assert_eq!(counts, expected, "{column}");
    }
    // A column of few values keeps the two phases.
    let few = explain(c, "SELECT count(DISTINCT g) FROM dm").await.join("\n");
    assert!(few.starts_with("Custom Scan (Tessera Multi-Shard)"), "{few}");
}

/// A reference table filtered by its own conditions and joined to a
/// distributed table reaches each task as the list of its joined column's
/// values that pass them; not when more values pass than are listed.
async fn reference_keys_first(c: &tokio_postgres::Client) {
    c.batch_execute(
        "CREATE TABLE rk_dim (id int PRIMARY KEY, kind text, code int);
         CREATE TABLE rk_fact (f int PRIMARY KEY, dim_id int);
         INSERT INTO rk_dim SELECT g, 'k' || g % 1000, g FROM generate_series(1, 10000) g;
         INSERT INTO rk_fact SELECT g, 1 + g % 10000 FROM generate_series(1, 20000) g;
         SELECT create_reference_table('rk_dim');
         SELECT create_distributed_table('rk_fact', 'f', shard_count => 4);",
    )
    .await
    .unwrap();
    let narrow = "SELECT count(*) FROM rk_fact, rk_dim WHERE id = dim_id AND kind = 'k7'";
    let text = explain_with(c, "COSTS OFF", narrow).await.join("\n");
    assert!(text.contains("= ANY ('{7,1007,2007,3007,4007,5007,6007,7007,8007,9007}'::integer[])") && text.contains("'k7'"), "{text}");
    assert_eq!(c.query_one(narrow, &[]).await.unwrap().get::<_, i64>(0), 20);
    let branches = "SELECT count(*) FROM rk_fact, rk_dim WHERE (id = dim_id AND kind = 'k7') OR (dim_id = id AND kind = 'k8' AND f > 0)";
    let text = explain_with(c, "COSTS OFF", branches).await.join("\n");
    assert!(text.contains("= ANY ('{7,8,1007,1008,"), "{text}");
    assert_eq!(c.query_one(branches, &[]).await.unwrap().get::<_, i64>(0), 40);
    // Past 4,096 values on the primary key, up to 32,768, the list replaces the conditions.
    let wide = "SELECT count(*) FROM rk_fact, rk_dim WHERE id = dim_id AND kind <> 'k7'";
    let text = explain_with(c, "COSTS OFF", wide).await.join("\n");
    assert!(text.contains("(id = ANY ('{1,2,3,4,5,6,8,") && !text.contains("'k7'"), "{}", &text[..text.len().min(2000)]);
    assert_eq!(c.query_one(wide, &[]).await.unwrap().get::<_, i64>(0), 19980);
    // On another column, at most 4,096.
    let other = "SELECT count(*) FROM rk_fact, rk_dim WHERE code = dim_id AND kind <> 'k7'";
    let text = explain_with(c, "COSTS OFF", other).await.join("\n");
    assert!(!text.contains("= ANY ("), "{}", &text[..text.len().min(2000)]);
    assert_eq!(c.query_one(other, &[]).await.unwrap().get::<_, i64>(0), 19980);
}

/// A join on a column that is not the moved table's distribution column,
/// with too many rows to broadcast, moves that table's rows to the other's
/// shards (EXPLAIN says which, EXPLAIN ANALYZE how many) and leaves no
/// temporary table behind, also when the join fails.
async fn repartition_joins(cluster: &TestCluster, c: &tokio_postgres::Client) {
    c.batch_execute(
        "CREATE TABLE rj_a (k int PRIMARY KEY, v int);
         CREATE TABLE rj_b (id int PRIMARY KEY, a_k int);
         INSERT INTO rj_a SELECT g, g % 7 FROM generate_series(1, 30000) g;
         INSERT INTO rj_b SELECT g, 1 + (g * 3) % 40000 FROM generate_series(1, 20000) g;
         SELECT create_distributed_table('rj_a', 'k', shard_count => 4);
         SELECT create_distributed_table('rj_b', 'id', colocate_with => 'none');",
    )
    .await
    .unwrap();
    let join = "SELECT a.v, count(*) FROM rj_a a JOIN rj_b b ON b.a_k = a.k GROUP BY a.v";
    let text = explain(c, join).await.join("\n");
    assert!(
        text.starts_with("Custom Scan (Tessera Repartition Join)") && text.contains("Moved: rj_b by a_k node to node, onto the shards of rj_a"),
        "{text}"
    );
    assert!(text.contains("Task Count: 4") && text.contains("tessera_repartitioned_"), "{text}");
    let analyzed = explain_with(c, "ANALYZE", join).await.join("\n");
    assert!(analyzed.contains("Rows Moved: 20000 (") && analyzed.contains("Tasks Run: all"), "{analyzed}");
    let expected = c.query_one("SELECT count(*) FROM rj_b WHERE a_k <= 30000", &[]).await.unwrap().get::<_, i64>(0);
    let rows = c.query(join, &[]).await.unwrap();
    assert_eq!(rows.iter().map(|r| r.get::<_, i64>(1)).sum::<i64>(), expected);
    let e = c.query("SELECT count(1 / (b.id - b.id)) FROM rj_a a JOIN rj_b b ON b.a_k = a.k", &[]).await.unwrap_err();
    assert_eq!(common::sqlstate(&e), "22012", "{e}");
    for i in 0..2 {
        let w = cluster.connect_worker(i).await;
        let left = w.query_one("SELECT count(*) FROM pg_class WHERE relname LIKE 'tessera_repartitioned%'", &[]).await.unwrap();
        assert_eq!(left.get::<_, i64>(0), 0, "temporary tables left on worker {i}");
    }
    assert_eq!(c.query(join, &[]).await.unwrap().len(), 7);
    // The moved table's own conditions filter its rows before they move.
    let filtered = "SELECT count(*) FROM rj_a a JOIN rj_b b ON b.a_k = a.k WHERE b.id <= 1000 AND a.v > 2";
    let analyzed = explain_with(c, "ANALYZE", filtered).await.join("\n");
    assert!(analyzed.contains("Moved: rj_b by a_k where (b.id <= 1000) node to node, onto") && analyzed.contains("Rows Moved: 1000 ("), "{analyzed}");
    // Neither join column is a distribution column: both tables move.
    let both = "SELECT count(*) FROM rj_a a JOIN rj_b b ON b.a_k = a.v";
    let text = explain(c, both).await.join("\n");
    // One shard per node, each node's own rows read where they lie.
    assert!(
        text.contains("Moved: rj_a by v node to node, each node's own read where they lie and rj_b by a_k node to node, each node's own read where they lie, one shard per node"),
        "{text}"
    );
    let a_per_v = |v: i64| (1..=30000_i64).filter(|k| k % 7 == v).count() as i64;
    let expected: i64 = (1..=20000_i64).map(|g| 1 + (g * 3) % 40000).filter(|a_k| *a_k < 7).map(a_per_v).sum();
    assert_eq!(c.query_one(both, &[]).await.unwrap().get::<_, i64>(0), expected);
    // A reference table on the preserved side of an outer join is split
    // from each node's own replica: onto the shards of the table joined on
    // its distribution column, or with the other table moving too.
    c.batch_execute("CREATE TABLE rj_r (rk int PRIMARY KEY, label text); INSERT INTO rj_r SELECT g, 'l' || g % 3 FROM generate_series(1, 50000) g; SELECT create_reference_table('rj_r');")
        .await
        .unwrap();
    let onto = "SELECT count(*), count(a.v) FROM rj_r r LEFT JOIN rj_a a ON a.k = r.rk";
    let text = explain(c, onto).await.join("\n");
    assert!(text.contains("Moved: rj_r by rk from each node's own replica, onto the shards of rj_a"), "{text}");
    let row = c.query_one(onto, &[]).await.unwrap();
    assert_eq!((row.get::<_, i64>(0), row.get::<_, i64>(1)), (50000, 30000));
    let split = "SELECT r.label, count(b.id) FROM rj_r r LEFT JOIN rj_b b ON b.a_k = r.rk GROUP BY r.label";
    let text = explain(c, split).await.join("\n");
    assert!(
        text.contains(
            "Moved: rj_b by a_k node to node, each node's own read where they lie and rj_r by rk from each node's own replica, one shard per node"
        ),
        "{text}"
    );
    let counted: i64 = c.query(split, &[]).await.unwrap().iter().map(|r| r.get::<_, i64>(1)).sum();
    // Every a_k (1 to 40000) names a row of rj_r (1 to 50000).
    assert_eq!(counted, 20000);
    // Grouped by the distribution column in a FROM subquery: no move at all.
    let text = explain(c, "SELECT n, count(*) FROM (SELECT k, count(*) AS n FROM rj_a GROUP BY k) s GROUP BY n").await.join("\n");
    assert!(text.starts_with("Custom Scan (Tessera Multi-Shard)"), "{text}");

    // The nodes fetch each other's rows as the session's role, which the
    // other node checks: a role with the privileges gets the rows, one
    // without gets 42501, also when the role was taken on by SET ROLE.
    c.batch_execute(
        "CREATE ROLE rj_reader LOGIN; CREATE ROLE rj_readers; CREATE ROLE rj_member LOGIN NOINHERIT IN ROLE rj_readers;
         GRANT SELECT ON rj_a, rj_b TO rj_reader, rj_readers;",
    )
    .await
    .unwrap();
    let reader = common::connect_as(cluster.port, "rj_reader").await;
    assert_eq!(reader.query_one(both, &[]).await.unwrap().get::<_, i64>(0), expected);
    let member = common::connect_as(cluster.port, "rj_member").await;
    let e = member.query_one(both, &[]).await.unwrap_err();
    assert_eq!(common::sqlstate(&e), "42501", "{e}");
    member.batch_execute("SET ROLE rj_readers").await.unwrap();
    assert!(explain(&member, both).await[0].contains("Tessera Repartition Join"));
    assert_eq!(member.query_one(both, &[]).await.unwrap().get::<_, i64>(0), expected);
    c.batch_execute("REVOKE SELECT ON rj_b FROM rj_readers").await.unwrap();
    let e = member.query_one(both, &[]).await.unwrap_err();
    assert_eq!(common::sqlstate(&e), "42501", "{e}");
    assert_eq!(member.query_one("SELECT 1", &[]).await.unwrap().get::<_, i32>(0), 1, "the session goes on");
}

/// How a node copies another's rows for a repartition join
/// (`tessera_remote.pull_rows`): columns of built-in types in binary, of
/// user-defined types as text; the other node's error with its own SQLSTATE;
/// only into the session's own temporary tables; no file left behind.
async fn rows_copied_between_nodes(cluster: &TestCluster, c: &tokio_postgres::Client) {
    c.batch_execute(
        "CREATE TYPE rj_mood AS ENUM ('calm', 'busy', 'odd');
         CREATE TABLE rj_m (id int PRIMARY KEY, a_k int, mood rj_mood, note text);
         INSERT INTO rj_m SELECT g, 1 + (g * 7) % 30000, (ARRAY['calm', 'busy', 'odd']::rj_mood[])[1 + g % 3], CASE WHEN g % 5 > 0 THEN 'n' || g END
           FROM generate_series(1, 20000) g;
         SELECT create_distributed_table('rj_m', 'id', colocate_with => 'none');",
    )
    .await
    .unwrap();
    let join = "SELECT m.mood::text, count(*), count(m.note), sum(a.v)::text FROM rj_a a JOIN rj_m m ON m.a_k = a.k GROUP BY m.mood ORDER BY m.mood";
    assert!(explain(c, join).await.join("\n").contains("Moved: rj_m by a_k node to node"));
    let expected = |g: i64| (1 + (g * 7) % 30000) % 7;
    let mut want = [(0i64, 0i64, 0i64); 3];
    for g in 1..=20000_i64 {
        let w = &mut want[(g % 3) as usize];
        w.0 += 1;
        w.1 += i64::from(g % 5 > 0);
        w.2 += expected(g);
    }
    let rows = c.query(join, &[]).await.unwrap();
    let got: Vec<(String, i64, i64, String)> = rows.iter().map(|r| (r.get(0), r.get(1), r.get(2), r.get(3))).collect();
    let moods = ["calm", "busy", "odd"];
    let want: Vec<(String, i64, i64, String)> = want.iter().zip(moods).map(|(w, m)| (m.to_string(), w.0, w.1, w.2.to_string())).collect();
    assert_eq!(got, want);

    let w = cluster.connect_worker(0).await;
    let other = cluster.cluster.state.worker_ports[1];
    w.batch_execute("CREATE TEMP TABLE copied (x int, label text)").await.unwrap();
    let pull = |query: &str, target: &str| format!("SELECT tessera_remote.pull_rows('127.0.0.1', {other}, $q${query}$q$, '{target}')");
    let n = w.query_one(&pull("SELECT g, 'row ' || g FROM generate_series(1, 1000) g", "copied"), &[]).await.unwrap();
    assert_eq!(n.get::<_, i64>(0), 1000);
    let e = w.query_one(&pull("SELECT g / (g - 500), 'x' FROM generate_series(1, 1000) g", "copied"), &[]).await.unwrap_err();
    assert_eq!(common::sqlstate(&e), "22012", "{}", common::error_text(&e));
    assert!(common::error_text(&e).contains("division by zero"), "{}", common::error_text(&e));
    let e = w.query_one(&pull("SELECT nothing FROM nowhere", "copied"), &[]).await.unwrap_err();
    assert_eq!(common::sqlstate(&e), "42P01", "{}", common::error_text(&e));
    let e = w.query_one("SELECT tessera_remote.pull_rows('127.0.0.1', 1, 'SELECT 1, 2', 'copied')", &[]).await.unwrap_err();
    assert_eq!(common::sqlstate(&e), "08006", "{}", common::error_text(&e));
    w.batch_execute("CREATE TABLE not_temporary (x int, label text)").await.unwrap();
    let e = w.query_one(&pull("SELECT 1, 'x'", "not_temporary"), &[]).await.unwrap_err();
    assert_eq!(common::sqlstate(&e), "42501", "{}", common::error_text(&e));
    w.batch_execute("DROP TABLE not_temporary").await.unwrap();
    assert_eq!(w.query_one("SELECT count(*) FROM copied", &[]).await.unwrap().get::<_, i64>(0), 1000, "failed copies add nothing");
    for i in 0..2 {
        let files = cluster
            .connect_worker(i)
            .await
            .query_one("SELECT count(*) FROM pg_ls_tmpdir() WHERE name LIKE 'pgsql_tmp_tessera_pull%'", &[])
            .await
            .unwrap();
        assert_eq!(files.get::<_, i64>(0), 0, "error files left on worker {i}");
    }
}

/// The `tdigest` and `hll` extensions' aggregates across shards: each shard
/// sends its digest or HyperLogLog, the combine merges them. A digest's
/// percentile is approximate (compared with the exact one), a HyperLogLog's
/// cardinality that of all rows (compared in tests/slt/63_sketches.slt).
async fn sketches_merged(c: &tokio_postgres::Client) {
    c.batch_execute(
        "CREATE EXTENSION IF NOT EXISTS tdigest; CREATE EXTENSION IF NOT EXISTS hll;
         CREATE TABLE es (k int PRIMARY KEY, g int, x float8);
         SELECT create_distributed_table('es', 'k', shard_count => 4);
         INSERT INTO es SELECT i, i % 3, (i * 7919) % 100003 FROM generate_series(1, 60000) i;",
    )
    .await
    .unwrap();
    let digest = "SELECT g, tdigest_percentile(x, 100, 0.9), tdigest_percentile_of(x, 100, 50000), hll_cardinality(hll_add_agg(hll_hash_bigint(x::int8))) FROM es GROUP BY g ORDER BY g";
    let plan = explain_with(c, "VERBOSE, COSTS OFF", digest).await.join("\n");
    assert!(plan.starts_with("Custom Scan (Tessera Multi-Shard)"), "{plan}");
    assert!(plan.contains("tdigest(x, 100)") && plan.contains("hll_add_agg(hll_hash_bigint"), "each shard builds the sketches:\n{plan}");
    let exact =
        c.query("SELECT g, percentile_cont(0.9) WITHIN GROUP (ORDER BY x), count(DISTINCT x) FROM es GROUP BY g ORDER BY g", &[]).await.unwrap();
    let approximate = c.query(digest, &[]).await.unwrap();
    assert_eq!(approximate.len(), 3);
    for (a, e) in approximate.iter().zip(&exact) {
        let (p90, exact_p90): (f64, f64) = (a.get(1), e.get(1));
        assert!((p90 - exact_p90).abs() < 0.01 * exact_p90, "group {}: 90th percentile {p90}, exactly {exact_p90}", a.get::<_, i32>(0));
        let below: f64 = a.get(2);
        assert!((below - 0.5).abs() < 0.01, "group {}: half the values lie below 50000, the digest says {below}", a.get::<_, i32>(0));
        let (cardinality, distinct): (f64, i64) = (a.get(3), e.get(2));
        assert!(
            (cardinality - distinct as f64).abs() < 0.05 * distinct as f64,
            "group {}: {cardinality} distinct, exactly {distinct}",
            a.get::<_, i32>(0)
        );
    }
    // A quantile read from the rows is not split: the shards send the
    // values, and the coordinator's one digest reads the quantile of the
    // first row, as PostgreSQL's does.
    let varying = explain_with(c, "VERBOSE, COSTS OFF", "SELECT tdigest_percentile(x, 100, g / 10.0) FROM es").await.join("\n");
    assert!(
        !varying.contains("tdigest(x, 100)") && varying.contains("Combine: SELECT tdigest_percentile(tessera_p_000, 100, tessera_p_001)"),
        "{varying}"
    );
}

/// With `citus.count_distinct_error_rate` set, a `count(DISTINCT …)` the
/// shards cannot count alone is the cardinality of the HyperLogLog every
/// shard builds and the combine merges, as Citus computes it: within the
/// error of its size, and the very estimate the same HyperLogLog written
/// out gives. Counts of the key stay exact; a bad rate is refused and the
/// session goes on; RESET gives exact counts again.
async fn approximate_distinct_counts(c: &tokio_postgres::Client) {
    c.batch_execute(
        "CREATE EXTENSION IF NOT EXISTS hll;
         CREATE TABLE eh (k int PRIMARY KEY, g int, v int, t text);
         SELECT create_distributed_table('eh', 'k', shard_count => 4);
         INSERT INTO eh SELECT i, i % 3, (i * 7919) % 20011, 't' || (i % 3001) FROM generate_series(1, 60000) i;",
    )
    .await
    .unwrap();
    let query = "SELECT g, count(DISTINCT v), count(DISTINCT k), count(DISTINCT t) FILTER (WHERE k % 2 = 0) AS evens FROM eh GROUP BY g ORDER BY g";
    let exact = c.query(query, &[]).await.unwrap();
    c.batch_execute("SET citus.count_distinct_error_rate = 0.005").await.unwrap();
    let plan = explain_with(c, "VERBOSE, COSTS OFF", query).await.join("\n");
    assert!(plan.starts_with("Custom Scan (Tessera Multi-Shard)"), "{plan}");
    assert!(
        plan.contains("hll_add_agg(hll_hash_any(v, 0), 15)") && plan.contains("count(DISTINCT k)"),
        "each shard builds HyperLogLogs of 2^15 registers:\n{plan}"
    );
    let estimated = c.query(query, &[]).await.unwrap();
    let names: Vec<&str> = estimated[0].columns().iter().map(|c| c.name()).collect();
    assert_eq!(names, ["g", "count", "count", "evens"]);
    let written_out = c
        .query(
            "SELECT g, hll_cardinality(hll_add_agg(hll_hash_any(v), 15))::int8, hll_cardinality(hll_add_agg(hll_hash_any(t), 15) FILTER (WHERE k % 2 = 0))::int8 FROM eh GROUP BY g ORDER BY g",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(estimated.len(), 3);
    for ((e, x), w) in estimated.iter().zip(&exact).zip(&written_out) {
        let group: i32 = e.get(0);
        assert_eq!(e.get::<_, i64>(2), x.get::<_, i64>(2), "group {group}: a count of the key is exact");
        for (column, written) in [(1, 1), (3, 2)] {
            let (estimate, count): (i64, i64) = (e.get(column), x.get(column));
            assert!((estimate - count).abs() as f64 <= 0.03 * count as f64, "group {group}: {estimate} estimated, exactly {count}");
            assert_eq!(estimate, w.get::<_, i64>(written), "group {group}: the estimate of the HyperLogLog written out");
        }
    }
    let none = c.query_one("SELECT count(DISTINCT v) FROM eh WHERE k < 0", &[]).await.unwrap();
    assert_eq!(none.get::<_, i64>(0), 0, "a count of no rows");
    // Grouped by the key, every group's count is computed whole, exactly.
    let by_key = explain_with(c, "VERBOSE, COSTS OFF", "SELECT k, count(DISTINCT v) FROM eh GROUP BY k ORDER BY 2 DESC, 1 LIMIT 3").await.join("\n");
    assert!(!by_key.contains("hll_") && by_key.contains("count(DISTINCT v)"), "{by_key}");
    let refused = c.batch_execute("SET citus.count_distinct_error_rate = 'often'; SELECT count(DISTINCT v) FROM eh").await.unwrap_err();
    assert_eq!(refused.code(), Some(&tokio_postgres::error::SqlState::INVALID_PARAMETER_VALUE), "{refused:?}");
    c.batch_execute("RESET citus.count_distinct_error_rate").await.unwrap();
    assert_eq!(
        c.query(query, &[]).await.unwrap().iter().map(|r| r.get::<_, i64>(1)).collect::<Vec<_>>(),
        exact.iter().map(|r| r.get::<_, i64>(1)).collect::<Vec<_>>()
    );
}

/// A restarted coordinator maps each node's numbers of extension types to
/// its own before it combines the shards' values: here a worker numbered
/// its types differently, having one more of its own.
#[tokio::test]
async fn sketches_combine_after_a_restart() {
    let cluster = TestCluster::start(2);
    cluster.connect_worker(0).await.batch_execute("CREATE TYPE only_here AS ENUM ('x')").await.unwrap();
    let c = cluster.connect().await;
    c.batch_execute(
        "CREATE EXTENSION hll;
         CREATE TABLE er (k int PRIMARY KEY, v int);
         SELECT create_distributed_table('er', 'k', shard_count => 4);
         INSERT INTO er SELECT i, i % 500 FROM generate_series(1, 5000) i;",
    )
    .await
    .unwrap();
    drop(c);
    cluster.restart_coordinator(|_| {});
    let c = cluster.connect().await;
    let row = c.query_one("SELECT hll_cardinality(hll_add_agg(hll_hash_integer(v))), count(DISTINCT v) FROM er", &[]).await.unwrap();
    let (cardinality, distinct): (f64, i64) = (row.get(0), row.get(1));
    assert!((cardinality - distinct as f64).abs() < 0.05 * distinct as f64, "{cardinality} distinct, exactly {distinct}");
}
