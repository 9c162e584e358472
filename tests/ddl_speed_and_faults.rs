//! DDL when the coordinator database misbehaves, and what DDL on one table
//! costs the others.
//!
//! A catalog reload that fails after a change committed must not turn the
//! change into an error, and must not let a query be planned under the
//! stale catalog (which could read a distributed table's empty shell): such
//! queries are refused, naming the coordinator database, until a reload
//! succeeds. The reload is broken the way a test can: the function it reads
//! views with is renamed through a direct connection to the coordinator
//! database (as if its PL/pgSQL could no longer run), and renamed back.
//!
//! DDL on one table leaves every other table's fallback stand-in as it was:
//! they are made again only for the tables that changed.

mod common;

use common::{sqlstate, TestCluster};
use std::sync::{Arc, Mutex};
use tokio_postgres::{AsyncMessage, Client, SimpleQueryMessage};

/// A client of the coordinator whose notices (and warnings) are kept.
struct Observed {
    client: Client,
    notices: Arc<Mutex<Vec<(String, String)>>>,
}

impl Observed {
    async fn connect(cluster: &TestCluster) -> Observed {
        Self::connect_as(cluster, "postgres").await
    }

    async fn connect_as(cluster: &TestCluster, user: &str) -> Observed {
        let conn_string = format!("host=127.0.0.1 port={} user={user} dbname=postgres", cluster.port);
        let (client, mut connection) = tokio_postgres::connect(&conn_string, tokio_postgres::NoTls).await.unwrap();
        let notices = Arc::new(Mutex::new(Vec::new()));
        let kept = notices.clone();
        tokio::spawn(async move {
            use futures::StreamExt;
            let mut messages = futures::stream::poll_fn(move |cx| connection.poll_message(cx));
            while let Some(Ok(message)) = messages.next().await {
                if let AsyncMessage::Notice(notice) = message {
                    kept.lock().unwrap().push((notice.severity().to_string(), notice.message().to_string()));
                }
            }
        });
        Observed { client, notices }
    }

    /// Runs `sql`, which must succeed; returns the notices it raised.
    async fn run(&self, sql: &str) -> Vec<(String, String)> {
        self.notices.lock().unwrap().clear();
        if let Err(e) = self.client.batch_execute(sql).await {
            panic!("{sql}: {}", common::error_text(&e));
        }
        std::mem::take(&mut *self.notices.lock().unwrap())
    }

    /// Runs `sql`, which must fail; returns the error.
    async fn refused(&self, sql: &str) -> tokio_postgres::Error {
        match self.client.simple_query(sql).await {
            Ok(_) => panic!("{sql}: answered, but the catalog could not be reloaded"),
            Err(e) => e,
        }
    }

    async fn value(&self, sql: &str) -> String {
        let messages = self.client.simple_query(sql).await.unwrap_or_else(|e| panic!("{sql}: {}", common::error_text(&e)));
        messages
            .into_iter()
            .find_map(|m| match m {
                SimpleQueryMessage::Row(r) => Some(r.get(0).unwrap_or("NULL").to_string()),
                _ => None,
            })
            .unwrap_or_else(|| panic!("{sql}: no row"))
    }
}

/// Breaks (or mends) what the catalog reload runs on the coordinator
/// database: it reads every view's definition through this function. The
/// rename fires no event trigger (as a replica session's DDL), so it does
/// not itself set off a reload.
async fn break_reload(cluster: &TestCluster, broken: bool) {
    let (from, to) = if broken {
        ("tessera_view_definition", "tessera_view_definition_away")
    } else {
        ("tessera_view_definition_away", "tessera_view_definition")
    };
    let db = cluster.connect_coordinator_db().await;
    db.batch_execute(&format!("SET session_replication_role = replica; ALTER FUNCTION pg_catalog.{from}(oid) RENAME TO {to}")).await.unwrap();
}

/// Distributes a table `id int PRIMARY KEY, k int` of each name over 4
/// shards, with the rows 1 to 9 (`k` = id % 3).
async fn distribute_with_rows(c: &Observed, tables: &[&str]) {
    for t in tables {
        c.run(&format!("CREATE TABLE {t} (id int PRIMARY KEY, k int); SELECT create_distributed_table('{t}', 'id', shard_count => 4)")).await;
        c.run(&format!("INSERT INTO {t} SELECT g, g % 3 FROM generate_series(1, 9) g")).await;
    }
}

fn is_reload_warning(notice: &(String, String)) -> bool {
    notice.0 == "WARNING" && notice.1.contains("the change committed, but the catalog could not be reloaded from the coordinator database")
}

#[tokio::test]
async fn a_committed_ddl_succeeds_and_no_query_reads_a_shell_while_the_catalog_cannot_be_reloaded() {
    let cluster = TestCluster::start(2);
    let c = Observed::connect(&cluster).await;
    c.run("CREATE TABLE items (id int PRIMARY KEY, v text); SELECT create_distributed_table('items', 'id', shard_count => 4)").await;
    c.run("INSERT INTO items SELECT g, 'v' || g FROM generate_series(1, 3) g").await;
    let coordinator_db = format!("coordinator database at 127.0.0.1:{}", cluster.cluster.state.coordinator_db_port);

    break_reload(&cluster, true).await;
    // The view committed on every node: the client hears success, with a
    // warning about the reload.
    let notices = c.run("CREATE VIEW items_view AS SELECT * FROM items").await;
    assert!(notices.iter().any(is_reload_warning), "a warning says the reload failed: {notices:?}");
    assert!(notices.iter().any(|(_, m)| m.contains(&coordinator_db)), "the warning names the coordinator database: {notices:?}");

    // Planned under the catalog of before, the view would read the shell
    // (no rows); it is refused instead, in both protocols, and so is any
    // statement that reads tables, DDL included.
    for sql in ["SELECT count(*) FROM items_view", "SELECT count(*) FROM items", "ALTER TABLE items ADD COLUMN never int"] {
        let e = c.refused(sql).await;
        assert_eq!(sqlstate(&e), "55000", "{sql}: {}", common::error_text(&e));
        assert!(common::error_text(&e).contains(&coordinator_db), "{sql}: the error names the coordinator database: {}", common::error_text(&e));
    }
    let e = c.client.query("SELECT count(*) FROM items_view", &[]).await.expect_err("refused through the extended protocol too");
    assert_eq!(sqlstate(&e), "55000", "{}", common::error_text(&e));
    // What reads no table goes on.
    c.run("SET application_name = 'still here'; BEGIN; ROLLBACK").await;
    assert_eq!(c.value("SHOW application_name").await, "still here");

    // Once a reload works, the next statement sees the view, over the shards.
    break_reload(&cluster, false).await;
    assert_eq!(c.value("SELECT count(*) FROM items_view").await, "3");
    assert_eq!(
        c.value("SELECT count(*) FROM information_schema.columns WHERE table_name = 'items' AND column_name = 'never'").await,
        "0",
        "the refused ALTER did not run"
    );

    // A column change that commits while the reload fails is a success too,
    // and reached the shards.
    break_reload(&cluster, true).await;
    let notices = c.run("ALTER TABLE items ADD COLUMN added int DEFAULT 5").await;
    assert!(notices.iter().any(is_reload_warning), "{notices:?}");
    break_reload(&cluster, false).await;
    assert_eq!(c.value("SELECT sum(added) FROM items").await, "15");
    assert_eq!(c.value("SELECT string_agg(v || ':' || added, ',' ORDER BY id) FROM items").await, "v1:5,v2:5,v3:5");
}

#[tokio::test]
async fn a_block_whose_catalog_cannot_be_loaded_fails_and_commits_nothing() {
    let cluster = TestCluster::start(2);
    let admin = Observed::connect(&cluster).await;
    admin.run("CREATE TABLE items (id int PRIMARY KEY, v text); SELECT create_distributed_table('items', 'id', shard_count => 4)").await;
    admin.run("INSERT INTO items VALUES (1, 'a'), (2, 'b')").await;
    admin.run("CREATE ROLE block_user LOGIN; GRANT ALL ON items TO block_user; GRANT CREATE ON SCHEMA public TO block_user").await;
    // A block's catalog is read as the client's role: without the right to
    // read views' definitions, that role's block cannot load it (while the
    // coordinator's own reloads, as a superuser, go on).
    let db = cluster.connect_coordinator_db().await;
    db.batch_execute("REVOKE EXECUTE ON FUNCTION pg_catalog.tessera_view_definition(oid) FROM PUBLIC").await.unwrap();
    let c = Observed::connect_as(&cluster, "block_user").await;
    c.run("BEGIN").await;
    // The view's statement ran, but the block cannot be planned knowing it:
    // the block fails rather than read the view's shell later.
    let e = c.refused("CREATE VIEW items_view AS SELECT * FROM items").await;
    assert!(common::error_text(&e).contains("tessera_view_definition"), "{}", common::error_text(&e));
    let e = c.refused("SELECT count(*) FROM items_view").await;
    assert_eq!(sqlstate(&e), "25P02", "{}", common::error_text(&e));
    c.run("ROLLBACK").await;
    db.batch_execute("GRANT EXECUTE ON FUNCTION pg_catalog.tessera_view_definition(oid) TO PUBLIC").await.unwrap();
    let e = c.refused("SELECT * FROM items_view").await;
    assert_eq!(sqlstate(&e), "42P01", "{}", common::error_text(&e));
    assert_eq!(c.value("SELECT count(*) FROM items").await, "2");
}

#[tokio::test]
async fn ddl_on_one_table_leaves_the_other_tables_fallback_stand_ins_alone() {
    let cluster = TestCluster::start(2);
    let c = Observed::connect(&cluster).await;
    distribute_with_rows(&c, &["a", "b"]).await;
    // A window over the whole table: the general fallback, over the stand-ins.
    let window = |t: &str| format!("SELECT sum(r) FROM (SELECT row_number() OVER (ORDER BY id) AS r FROM {t}) s");
    assert_eq!(c.value(&window("a")).await, "45");
    assert_eq!(c.value(&window("b")).await, "45");
    let db = cluster.connect_coordinator_db().await;
    let stand_in = |table: &'static str| {
        let db = &db;
        async move {
            let row = db
                .query_one(&format!("SELECT to_regclass(format('tessera_fallback.%I', 'dist_' || '{table}'::regclass::oid))::oid::int8"), &[])
                .await
                .unwrap();
            row.get::<_, Option<i64>>(0).unwrap_or_else(|| panic!("{table} has a stand-in"))
        }
    };
    let (a_before, b_before) = (stand_in("a").await, stand_in("b").await);

    c.run("ALTER TABLE a ADD COLUMN extra int DEFAULT 1").await;
    assert_eq!(
        c.value("SELECT sum(e) FROM (SELECT extra + row_number() OVER (ORDER BY id) AS e FROM a) s").await,
        "54",
        "the changed table's stand-in has its new column"
    );
    assert_ne!(stand_in("a").await, a_before, "the changed table's stand-in was made again");
    assert_eq!(stand_in("b").await, b_before, "the other table's stand-in was left as it was");

    c.run("DROP TABLE a").await;
    c.run("CREATE TABLE c (id int PRIMARY KEY, k int); SELECT create_distributed_table('c', 'id', shard_count => 4)").await;
    c.run("INSERT INTO c SELECT g, g % 3 FROM generate_series(1, 3) g").await;
    assert_eq!(c.value(&window("c")).await, "6");
    assert_eq!(stand_in("b").await, b_before);
    let left = db
        .query_one("SELECT count(*) FROM pg_class WHERE relnamespace = 'tessera_fallback'::regnamespace AND relkind = 'p'", &[])
        .await
        .unwrap()
        .get::<_, i64>(0);
    assert_eq!(left, 2, "the dropped table's stand-in went with it");
}

/// The rows of `sql`, one per line, columns separated by `|`.
async fn rows(c: &Observed, sql: &str) -> String {
    common::text_rows(&c.client, sql)
        .await
        .into_iter()
        .map(|r| r.into_iter().map(|v| v.unwrap_or_else(|| "NULL".into())).collect::<Vec<_>>().join("|"))
        .collect::<Vec<_>>()
        .join("\n")
}

#[tokio::test]
async fn the_catalog_follows_ddl_that_changes_no_catalog_row() {
    let cluster = TestCluster::start(2);
    let c = Observed::connect(&cluster).await;
    c.run("CREATE SCHEMA s1; CREATE TABLE s1.t (id int PRIMARY KEY, k int); SELECT create_distributed_table('s1.t', 'id', shard_count => 4)").await;
    c.run("INSERT INTO s1.t SELECT g, g % 3 FROM generate_series(1, 9) g").await;

    c.run("ALTER SCHEMA s1 RENAME TO s2").await;
    assert_eq!(c.value("SELECT count(*) FROM s2.t").await, "9", "a renamed schema's table is found under the new name");
    c.run("ALTER TABLE s2.t RENAME TO u").await;
    assert_eq!(c.value("SELECT k FROM s2.u WHERE id = 5").await, "2");
    c.run("ALTER TABLE s2.u RENAME COLUMN k TO kind").await;
    assert_eq!(c.value("SELECT sum(kind) FROM s2.u").await, "9");

    // Dropped with the schema: the name is free for a local table.
    c.run("DROP SCHEMA s2 CASCADE").await;
    c.run("CREATE SCHEMA s2; CREATE TABLE s2.u (id int, kind int); INSERT INTO s2.u VALUES (1, 1)").await;
    assert_eq!(c.value("SELECT count(*) FROM s2.u").await, "1", "the dropped distributed table is forgotten");

    // A detached partition stands on its own.
    c.run(
        "CREATE TABLE p (id int, k int) PARTITION BY RANGE (id);
         CREATE TABLE p1 PARTITION OF p FOR VALUES FROM (0) TO (100);
         CREATE TABLE p2 PARTITION OF p FOR VALUES FROM (100) TO (200);
         SELECT create_distributed_table('p', 'id', shard_count => 4);
         INSERT INTO p SELECT g, g FROM generate_series(1, 150) g",
    )
    .await;
    c.run("ALTER TABLE p DETACH PARTITION p1").await;
    assert_eq!(rows(&c, "SELECT count(*), min(id) FROM p").await, "51|100");
    assert_eq!(rows(&c, "SELECT count(*), max(id) FROM p1").await, "99|99");
    c.run("ALTER TABLE p ADD COLUMN extra int DEFAULT 7").await;
    assert_eq!(rows(&c, "SELECT sum(extra) FROM p2").await, "357", "a partition's new column is known");
}

#[tokio::test]
async fn a_reload_reads_only_the_changed_tables_unless_it_is_too_far_behind() {
    let cluster = TestCluster::start(2);
    let c = Observed::connect(&cluster).await;
    distribute_with_rows(&c, &["a", "b"]).await;
    // The catalog rows of b go without any change being recorded (no
    // trigger fires for a replica session), as if a change had been lost.
    let db = cluster.connect_coordinator_db().await;
    db.batch_execute(
        "SET session_replication_role = replica;
         DELETE FROM tessera.pg_dist_placement WHERE shardid IN (SELECT shardid FROM tessera.pg_dist_shard WHERE logicalrelid = 'b'::regclass);
         DELETE FROM tessera.pg_dist_shard WHERE logicalrelid = 'b'::regclass;
         DELETE FROM tessera.pg_dist_partition WHERE logicalrelid = 'b'::regclass;
         RESET session_replication_role",
    )
    .await
    .unwrap();
    // A change of another table reloads (before the statement returns)
    // only that table: b still reads its shards.
    c.run("ALTER TABLE a ADD COLUMN extra int").await;
    assert_eq!(c.value("SELECT count(*) FROM b").await, "9", "the reload read only the table that changed");

    // A coordinator further behind than the changes kept reads everything:
    // b is now a local table (its empty shell).
    db.batch_execute("UPDATE tessera.catalog_version SET version = version + 2000, changes_kept_from = version + 2000").await.unwrap();
    c.run("ALTER TABLE a ADD COLUMN more int").await;
    assert_eq!(c.value("SELECT count(*) FROM b").await, "0", "the whole catalog was read");
    assert_eq!(c.value("SELECT count(*) FROM a WHERE extra IS NULL AND more IS NULL").await, "9");
}
