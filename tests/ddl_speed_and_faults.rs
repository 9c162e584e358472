//! What DDL on one table costs the others: every other table's fallback
//! stand-in is left as it was, made again only for the tables that changed.

mod common;

use common::TestCluster;
use tokio_postgres::{Client, SimpleQueryMessage};

/// A client of the coordinator.
struct Observed {
    client: Client,
}

impl Observed {
    async fn connect(cluster: &TestCluster) -> Observed {
        Observed { client: cluster.connect().await }
    }

    /// Runs `sql`, which must succeed.
    async fn run(&self, sql: &str) {
        if let Err(e) = self.client.batch_execute(sql).await {
            panic!("{sql}: {}", common::error_text(&e));
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

#[tokio::test]
async fn ddl_on_one_table_leaves_the_other_tables_fallback_stand_ins_alone() {
    let cluster = TestCluster::start(2);
    let c = Observed::connect(&cluster).await;
    for t in ["a", "b"] {
        c.run(&format!("CREATE TABLE {t} (id int PRIMARY KEY, k int); SELECT create_distributed_table('{t}', 'id', shard_count => 4)")).await;
        c.run(&format!("INSERT INTO {t} SELECT g, g % 3 FROM generate_series(1, 9) g")).await;
    }
    // A window over the whole table: the general fallback, over the stand-ins.
    let window = |t: &str| format!("SELECT sum(r) FROM (SELECT row_number() OVER (ORDER BY id) AS r FROM {t}) s");
    assert_eq!(c.value(&window("a")).await, "45");
    assert_eq!(c.value(&window("b")).await, "45");
    let db = cluster.connect_coordinator_db().await;
    let stand_in = |table: &'static str| {
        let db = &db;
        async move {
            let row = db.query_one(&format!("SELECT to_regclass(format('tessera_fallback.%I', 'dist_' || '{table}'::regclass::oid))::oid::int8"), &[]).await.unwrap();
            row.get::<_, Option<i64>>(0).unwrap_or_else(|| panic!("{table} has a stand-in"))
        }
    };
    let (a_before, b_before) = (stand_in("a").await, stand_in("b").await);

    c.run("ALTER TABLE a ADD COLUMN extra int DEFAULT 1").await;
    assert_eq!(c.value("SELECT sum(e) FROM (SELECT extra + row_number() OVER (ORDER BY id) AS e FROM a) s").await, "54", "the changed table's stand-in has its new column");
    assert_ne!(stand_in("a").await, a_before, "the changed table's stand-in was made again");
    assert_eq!(stand_in("b").await, b_before, "the other table's stand-in was left as it was");

    c.run("DROP TABLE a").await;
    c.run("CREATE TABLE c (id int PRIMARY KEY, k int); SELECT create_distributed_table('c', 'id', shard_count => 4)").await;
    c.run("INSERT INTO c SELECT g, g % 3 FROM generate_series(1, 3) g").await;
    assert_eq!(c.value(&window("c")).await, "6");
    assert_eq!(stand_in("b").await, b_before);
    let left = db.query_one("SELECT count(*) FROM pg_class WHERE relnamespace = 'tessera_fallback'::regnamespace AND relkind = 'p'", &[]).await.unwrap().get::<_, i64>(0);
    assert_eq!(left, 2, "the dropped table's stand-in went with it");
}
