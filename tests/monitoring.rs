//! Seeing the cluster through the wire protocol: the statement, tenant and
//! counter statistics (`citus_stat_statements`, `citus_stat_tenants`,
//! `citus_stat_counters`) and their resets.

mod common;
use common::{sqlstate, text_rows, TestCluster};
use futures::SinkExt;

#[tokio::test]
async fn statements_tenants_and_counters_follow_the_workload() {
    let cluster = TestCluster::start(2);
    let c = cluster.connect().await;
    c.batch_execute(
        "CREATE TABLE items (id int PRIMARY KEY, v int);
         SELECT create_distributed_table('items', 'id', shard_count => 4);
         INSERT INTO items SELECT g, g FROM generate_series(1, 100) g;
         CREATE ROLE watcher LOGIN;
         GRANT SELECT ON items TO watcher;
         SELECT citus_stat_statements_reset(); SELECT citus_stat_tenants_reset(); SELECT citus_stat_counters_reset();",
    )
    .await
    .unwrap();

    // Routed reads with a bound (binary) key, the same with literals, one
    // multi-shard read, a COPY and a two-phase block.
    let lookup = c.prepare("SELECT v FROM items WHERE id = $1").await.unwrap();
    for _ in 0..50 {
        c.query_one(&lookup, &[&7i32]).await.unwrap();
    }
    for _ in 0..10 {
        c.query_one(&lookup, &[&3i32]).await.unwrap();
    }
    c.batch_execute("SELECT v FROM items WHERE id = 5; SELECT v FROM items WHERE id = 5").await.unwrap();
    assert_eq!(text_rows(&c, "SELECT count(*) FROM items").await, vec![vec![Some("100".into())]]);
    let rows: String = (101..=150).map(|i| format!("{i}\t{i}\n")).collect();
    let mut sink = Box::pin(c.copy_in("COPY items FROM STDIN").await.unwrap());
    sink.send(bytes::Bytes::from(rows)).await.unwrap();
    assert_eq!(sink.as_mut().finish().await.unwrap(), 50);
    c.batch_execute("BEGIN; UPDATE items SET v = v + 1 WHERE id = 1; UPDATE items SET v = v + 1 WHERE id = 2; UPDATE items SET v = v + 1; COMMIT")
        .await
        .unwrap();

    let statement = |query: &str, key: Option<&str>| {
        let key = key.map_or_else(|| "partition_key IS NULL".to_string(), |k| format!("partition_key = '{k}'"));
        format!("SELECT executor, calls, rows, total_time > 0, mean_time <= total_time FROM citus_stat_statements WHERE query = '{query}' AND {key}")
    };
    let row = |cells: &[&str]| vec![cells.iter().map(|c| Some(c.to_string())).collect::<Vec<_>>()];
    assert_eq!(text_rows(&c, &statement("SELECT v FROM items WHERE id = $1", Some("7"))).await, row(&["router", "50", "50", "t", "t"]));
    assert_eq!(text_rows(&c, &statement("SELECT v FROM items WHERE id = $1", Some("3"))).await, row(&["router", "10", "10", "t", "t"]));
    // Literals are replaced as pg_stat_statements does; the key still shows.
    assert_eq!(text_rows(&c, &statement("SELECT v FROM items WHERE id = $1", Some("5"))).await, row(&["router", "2", "2", "t", "t"]));
    assert_eq!(text_rows(&c, &statement("SELECT count(*) FROM items", None)).await, row(&["multi-shard", "1", "1", "t", "t"]));
    assert_eq!(text_rows(&c, &statement("COPY items FROM STDIN", None)).await, row(&["copy", "1", "50", "t", "t"]));
    assert_eq!(
        text_rows(&c, "SELECT count(*) FROM citus_stat_statements WHERE userid = 'postgres'::regrole AND dbid = (SELECT oid FROM pg_database WHERE datname = current_database())").await,
        text_rows(&c, "SELECT count(*) FROM citus_stat_statements").await
    );

    // The busiest tenant first, on the node that holds its shard.
    let tenants = text_rows(
        &c,
        "SELECT tenant_attribute, read_count_in_this_period, query_count_in_this_period, cpu_usage_in_this_period > 0,
                nodeid = (SELECT n.nodeid FROM pg_dist_placement p JOIN pg_dist_node n USING (groupid)
                           WHERE p.shardid = get_shard_id_for_distribution_column('items', tenant_attribute))
           FROM citus_stat_tenants ORDER BY query_count_in_this_period DESC LIMIT 2",
    )
    .await;
    assert_eq!(tenants, [row(&["7", "50", "50", "t", "t"]), row(&["3", "10", "10", "t", "t"])].concat());
    // The two routed updates of the block count as writes of theirs.
    assert_eq!(
        text_rows(&c, "SELECT query_count_in_this_period - read_count_in_this_period FROM citus_stat_tenants WHERE tenant_attribute = '1'").await,
        row(&["1"])
    );

    let counters = text_rows(
        &c,
        "SELECT query_execution_single_shard >= 64, query_execution_multi_shard >= 2, rows_copied, two_phase_commits >= 1,
                connection_establishment_succeeded > 0, connection_reused > 0, name = current_database(), stats_reset <= now()
           FROM citus_stat_counters",
    )
    .await;
    assert_eq!(counters, row(&["t", "t", "50", "t", "t", "t", "t", "t"]));

    // Another role sees that statements ran, not their text, and may not reset.
    let watcher = common::connect_as(cluster.cluster.state.coordinator_port, "watcher").await;
    watcher.query_one("SELECT v FROM items WHERE id = $1", &[&7i32]).await.unwrap();
    assert_eq!(
        text_rows(&watcher, "SELECT DISTINCT query FROM citus_stat_statements WHERE userid = 'postgres'::regrole").await,
        row(&["<insufficient privilege>"])
    );
    assert_eq!(
        text_rows(&watcher, "SELECT calls FROM citus_stat_statements WHERE userid = 'watcher'::regrole AND partition_key = '7'").await,
        row(&["1"])
    );
    let err = watcher.simple_query("SELECT citus_stat_statements_reset()").await.unwrap_err();
    assert_eq!(sqlstate(&err), "42501", "{err}");

    c.batch_execute("SELECT citus_stat_statements_reset(); SELECT citus_stat_tenants_reset(); SELECT citus_stat_counters_reset()").await.unwrap();
    // Only the resets themselves have run since.
    assert_eq!(text_rows(&c, "SELECT count(*) FROM citus_stat_statements WHERE executor <> 'cluster-function'").await, row(&["0"]));
    assert_eq!(text_rows(&c, "SELECT count(*) FROM citus_stat_tenants").await, row(&["0"]));
    assert_eq!(text_rows(&c, "SELECT rows_copied, two_phase_commits FROM citus_stat_counters").await, row(&["0", "0"]));
    // Read on the coordinator database directly, the views say where to read them.
    let direct = common::connect(cluster.cluster.state.coordinator_db_port).await;
    let err = direct.simple_query("SELECT * FROM citus_stat_statements").await.unwrap_err();
    assert_eq!(sqlstate(&err), "0A000", "{err}");
}
