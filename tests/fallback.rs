//! The general fallback tier: queries over distributed data that no pushdown
//! tier can split run in the coordinator database over foreign tables on the
//! shards. These tests cover what the differential suite cannot: keeping the
//! stand-ins in step with DDL, bind parameters, and the refusal inside a
//! transaction that already wrote on the workers.

mod common;
use common::{text_rows, TestCluster};

fn one(rows: Vec<Vec<Option<String>>>) -> Vec<Option<String>> {
    assert_eq!(rows.len(), 1, "{rows:?}");
    rows.into_iter().next().unwrap()
}

#[tokio::test]
async fn fallback_follows_ddl_and_takes_parameters() {
    let cluster = TestCluster::start(2);
    let c = cluster.connect().await;
    c.batch_execute(
        "CREATE TABLE fa (k int PRIMARY KEY, g int);
         CREATE TABLE fb (k int PRIMARY KEY, g int);
         INSERT INTO fa SELECT i, i % 7 FROM generate_series(1, 100) i;
         INSERT INTO fb SELECT i, i % 5 FROM generate_series(1, 50) i;
         SELECT create_distributed_table('fa', 'k');
         SELECT create_distributed_table('fb', 'k', colocate_with => 'none');",
    )
    .await
    .unwrap();
    // A join on non-distribution columns of tables in different co-location groups.
    let join = "SELECT count(*) FROM fa JOIN fb ON fa.g = fb.g";
    assert_eq!(one(text_rows(&c, join).await), vec![Some("720".into())]);

    // A new column reaches the stand-ins, and so do rows written afterwards.
    c.batch_execute("ALTER TABLE fa ADD COLUMN note text; UPDATE fa SET note = 'n' || g WHERE k = 3").await.unwrap();
    assert_eq!(
        text_rows(&c, "SELECT note, count(*) FROM fa GROUP BY note ORDER BY note NULLS LAST").await,
        vec![vec![Some("n3".into()), Some("1".into())], vec![None, Some("99".into())]]
    );

    // Bind parameters go to the coordinator database with the rewritten query.
    let rows = c.query("SELECT g, count(*) FROM fa WHERE k > $1 GROUP BY g ORDER BY g LIMIT $2", &[&90i32, &2i64]).await.unwrap();
    let got: Vec<(i32, i64)> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
    assert_eq!(got, vec![(0, 2), (1, 2)]);

    // A table distributed after the stand-ins were built is found too.
    c.batch_execute("CREATE TABLE fc (k int, v int); INSERT INTO fc VALUES (1, 10), (2, 20); SELECT create_distributed_table('fc', 'k')")
        .await
        .unwrap();
    assert_eq!(one(text_rows(&c, "SELECT sum(v) OVER () FROM fc ORDER BY k LIMIT 1").await), vec![Some("30".into())]);
}

/// After a block wrote on the workers, the statements the coordinator
/// database runs over distributed tables read copies made through the
/// block's own connections: they see its writes, and the copies go with the
/// block.
#[tokio::test]
async fn fallback_sees_the_writes_of_its_own_block() {
    let cluster = TestCluster::start(2);
    let c = cluster.connect().await;
    c.batch_execute(
        "CREATE TABLE fw (k int PRIMARY KEY, v int);
         CREATE TABLE fx (k int, v int);
         INSERT INTO fw SELECT i, i FROM generate_series(1, 20) i;
         SELECT create_distributed_table('fw', 'k');
         SELECT create_distributed_table('fx', 'v');",
    )
    .await
    .unwrap();
    // A window over all rows: only the fallback answers it.
    let ranked = "SELECT k FROM (SELECT k, rank() OVER (ORDER BY v DESC) AS r FROM fw) ranked WHERE r = 1";
    c.batch_execute("BEGIN").await.unwrap();
    assert_eq!(one(text_rows(&c, ranked).await), vec![Some("20".into())]);
    c.batch_execute("UPDATE fw SET v = 100 WHERE k = 1").await.unwrap();
    assert_eq!(one(text_rows(&c, ranked).await), vec![Some("1".into())]);
    let plan: Vec<String> = text_rows(&c, &format!("EXPLAIN {ranked}")).await.into_iter().filter_map(|r| r.into_iter().next().flatten()).collect();
    assert!(plan.join("\n").contains("tessera_block_"), "{plan:?}");
    // INSERT … SELECT whose rows the coordinator database computes (ORDER BY
    // … LIMIT over another key), with bind parameters too.
    c.batch_execute("INSERT INTO fx SELECT k, v FROM fw ORDER BY v DESC LIMIT 2").await.unwrap();
    c.execute("INSERT INTO fx SELECT k, v FROM fw WHERE v < $1 ORDER BY v DESC LIMIT 1", &[&5i32]).await.unwrap();
    assert_eq!(
        text_rows(&c, "SELECT k, v FROM fx ORDER BY v").await,
        vec![vec![Some("4".into()), Some("4".into())], vec![Some("20".into()), Some("20".into())], vec![Some("1".into()), Some("100".into())]]
    );
    // A second write, and a cursor over the earlier copy that outlives it.
    c.batch_execute("DECLARE cur CURSOR FOR SELECT k, rank() OVER (ORDER BY v DESC) FROM fw ORDER BY 2 LIMIT 1; UPDATE fw SET v = 200 WHERE k = 2")
        .await
        .unwrap();
    assert_eq!(one(text_rows(&c, ranked).await), vec![Some("2".into())]);
    assert_eq!(text_rows(&c, "FETCH ALL FROM cur").await, vec![vec![Some("1".into()), Some("1".into())]]);
    c.batch_execute("ROLLBACK").await.unwrap();
    // The session goes on, the rolled-back writes are gone, and so are the copies.
    assert_eq!(one(text_rows(&c, ranked).await), vec![Some("20".into())]);
    assert_eq!(one(text_rows(&c, "SELECT count(*) FROM fx").await), vec![Some("0".into())]);
    let db = cluster.connect_coordinator_db().await;
    let left = db.query_one("SELECT count(*) FROM pg_class WHERE relname LIKE 'tessera\\_block\\_%'", &[]).await.unwrap();
    assert_eq!(left.get::<_, i64>(0), 0);
}

/// A correlated scalar aggregate runs as a grouped outer join, not once per
/// outer row: its groups (a few here) are computed first, as a multi-shard
/// statement of their own, and the statement runs on the shards with them;
/// count, 0 over no rows, stays correlated. The answers match the
/// correlated ones computed by hand.
#[tokio::test]
async fn correlated_aggregates_run_as_grouped_joins() {
    let cluster = TestCluster::start(2);
    let c = cluster.connect().await;
    c.batch_execute(
        "CREATE TABLE pay (k int, customer int, amount int);
         INSERT INTO pay SELECT i, i % 10, i FROM generate_series(1, 200) i;
         INSERT INTO pay VALUES (201, NULL, 5);
         SELECT create_distributed_table('pay', 'k');",
    )
    .await
    .unwrap();
    let query = "SELECT p.k, (SELECT sum(q.amount) FROM pay q WHERE q.customer = p.customer AND q.k > 100) FROM pay p WHERE p.k IN (3, 150, 201) ORDER BY p.k";
    let plan: Vec<String> = text_rows(&c, &format!("EXPLAIN {query}")).await.into_iter().filter_map(|r| r.into_iter().next().flatten()).collect();
    let plan = plan.join("\n");
    assert!(plan.contains("Tessera Subqueries First") && plan.contains("GROUP BY q.customer"), "{plan}");
    assert!(!plan.contains("SubPlan") && plan.contains("Left Join"), "{plan}");
    // Customer 3: 103 + 113 + … + 193; customer 0: 110 + … + 200; NULL matches nothing.
    let expected = [("3", Some((103..=193).step_by(10).sum::<i32>())), ("150", Some((110..=200).step_by(10).sum::<i32>())), ("201", None)];
    let rows = text_rows(&c, query).await;
    let got: Vec<(String, Option<i32>)> = rows.into_iter().map(|r| (r[0].clone().unwrap(), r[1].as_ref().map(|v| v.parse().unwrap()))).collect();
    assert_eq!(got, expected.map(|(k, v)| (k.to_string(), v)).to_vec());

    let counted = "SELECT p.k, (SELECT count(*) FROM pay q WHERE q.customer = p.customer AND q.k > 195) FROM pay p WHERE p.k IN (1, 7) ORDER BY p.k";
    let plan: Vec<String> = text_rows(&c, &format!("EXPLAIN {counted}")).await.into_iter().filter_map(|r| r.into_iter().next().flatten()).collect();
    assert!(plan.join("\n").contains("SubPlan"), "{plan:?}");
    assert_eq!(text_rows(&c, counted).await, vec![vec![Some("1".into()), Some("0".into())], vec![Some("7".into()), Some("1".into())]]);

    // The outer column unqualified, as TPC-H's Q17 writes it: no inner table
    // has it, so it is the outer table's.
    c.batch_execute(
        "CREATE TABLE buyers (b_id int PRIMARY KEY, b_name text);
         INSERT INTO buyers SELECT i, 'b' || i FROM generate_series(0, 3) i;
         SELECT create_reference_table('buyers');",
    )
    .await
    .unwrap();
    let unqualified = "SELECT b_id, (SELECT sum(amount) FROM pay WHERE customer = b_id AND k > 100) FROM buyers ORDER BY b_id";
    let plan: Vec<String> =
        text_rows(&c, &format!("EXPLAIN {unqualified}")).await.into_iter().filter_map(|r| r.into_iter().next().flatten()).collect();
    let plan = plan.join("\n");
    assert!(!plan.contains("SubPlan") && plan.contains("Left Join"), "{plan}");
    let expected: Vec<Vec<Option<String>>> =
        (0..4).map(|b| vec![Some(b.to_string()), Some((101..=200).filter(|i| i % 10 == b).sum::<i32>().to_string())]).collect();
    assert_eq!(text_rows(&c, unqualified).await, expected);
}
