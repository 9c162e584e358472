//! Single-shard (router) execution through the wire protocol: CRUD with
//! RETURNING in both protocols, multi-row INSERTs split by shard, co-located and
//! reference joins, transactions with read-your-writes, and clean refusals.

mod common;
use common::{error_text, sqlstate, text_rows, TestCluster};

fn row(values: &[&str]) -> Vec<Option<String>> {
    values.iter().map(|v| Some(v.to_string())).collect()
}

async fn setup(cluster: &TestCluster) -> tokio_postgres::Client {
    let c = cluster.connect().await;
    c.batch_execute(
        "CREATE TABLE accounts (id bigint PRIMARY KEY, owner text, balance numeric(12,2) NOT NULL DEFAULT 0);
         CREATE TABLE entries (account_id bigint, seq int, amount numeric(12,2), PRIMARY KEY (account_id, seq));
         CREATE TABLE currencies (code text PRIMARY KEY, rate numeric);
         SELECT create_distributed_table('accounts', 'id', shard_count => 8);
         SELECT create_distributed_table('entries', 'account_id', colocate_with => 'accounts');
         INSERT INTO currencies VALUES ('EUR', 1), ('USD', 0.9);
         SELECT create_reference_table('currencies');",
    )
    .await
    .unwrap();
    c
}

#[tokio::test]
async fn crud_in_both_protocols() {
    let cluster = TestCluster::start(2);
    let c = setup(&cluster).await;
    // Simple protocol, literals.
    let inserted = text_rows(&c, "INSERT INTO accounts (id, owner) VALUES (1, 'ann'), (2, 'bob'), (3, 'cyd'), (40, 'dee') RETURNING id, owner").await;
    assert_eq!(inserted.len(), 4, "RETURNING rows from every shard the INSERT touched");
    assert_eq!(text_rows(&c, "SELECT owner, balance FROM accounts WHERE id = 2").await, vec![row(&["bob", "0.00"])]);
    assert_eq!(text_rows(&c, "UPDATE accounts SET balance = balance + 10 WHERE id = 2 RETURNING balance").await, vec![row(&["10.00"])]);
    assert_eq!(text_rows(&c, "DELETE FROM accounts WHERE id = 40 RETURNING owner").await, vec![row(&["dee"])]);
    assert!(text_rows(&c, "SELECT * FROM accounts WHERE id = 40").await.is_empty());
    // Extended protocol, binary parameters, prepared once and executed many times.
    let select = c.prepare("SELECT owner FROM accounts WHERE id = $1").await.unwrap();
    for (id, owner) in [(1i64, "ann"), (2, "bob"), (3, "cyd")] {
        let r = c.query_one(&select, &[&id]).await.unwrap();
        assert_eq!(r.get::<_, String>(0), owner);
    }
    assert!(c.query_opt(&select, &[&99i64]).await.unwrap().is_none());
    let insert = c.prepare("INSERT INTO accounts (id, owner) VALUES ($1, $2) RETURNING id").await.unwrap();
    for id in 100..140i64 {
        let r = c.query_one(&insert, &[&id, &format!("user{id}")]).await.unwrap();
        assert_eq!(r.get::<_, i64>(0), id);
    }
    let n = c.execute("UPDATE accounts SET owner = upper(owner) WHERE id = $1", &[&120i64]).await.unwrap();
    assert_eq!(n, 1);
    assert_eq!(text_rows(&c, "SELECT owner FROM accounts WHERE id = 120").await, vec![row(&["USER120"])]);
    assert_eq!(text_rows(&c, "SELECT count(*) FROM accounts").await, vec![row(&["43"])]);
    // A NULL key matches nothing, like PostgreSQL.
    assert!(c.query("SELECT * FROM accounts WHERE id = $1", &[&None::<i64>]).await.unwrap().is_empty());
}

#[tokio::test]
async fn multi_row_insert_splits_by_shard() {
    let cluster = TestCluster::start(2);
    let c = setup(&cluster).await;
    let values: Vec<String> = (1..=50).map(|i| format!("({i}, 'o{i}')")).collect();
    let n = c.execute(&format!("INSERT INTO accounts (id, owner) VALUES {}", values.join(", ")), &[]).await.unwrap();
    assert_eq!(n, 50);
    let stmt = c.prepare("INSERT INTO accounts (id, owner) VALUES ($1, 'x'), ($2, 'y'), ($3, 'z')").await.unwrap();
    assert_eq!(c.execute(&stmt, &[&51i64, &52i64, &53i64]).await.unwrap(), 3);
    assert_eq!(text_rows(&c, "SELECT count(*), min(id), max(id) FROM accounts").await, vec![row(&["53", "1", "53"])]);
    // Rows went to more than one worker.
    let mut per_worker = Vec::new();
    for i in 0..2 {
        let w = cluster.connect_worker(i).await;
        let tables = text_rows(&w, "SELECT tablename FROM pg_tables WHERE tablename LIKE 'accounts_%'").await;
        let mut n = 0;
        for t in tables {
            n += text_rows(&w, &format!("SELECT count(*) FROM {}", t[0].as_deref().unwrap())).await[0][0].as_deref().unwrap().parse::<i64>().unwrap();
        }
        per_worker.push(n);
    }
    assert_eq!(per_worker.iter().sum::<i64>(), 53);
    assert!(per_worker.iter().all(|n| *n > 0), "{per_worker:?}");
    // A serial key is filled in by the coordinator from the sequence.
    c.batch_execute("CREATE TABLE events (id bigserial PRIMARY KEY, note text); SELECT create_distributed_table('events', 'id', shard_count => 4)")
        .await
        .unwrap();
    let ids = text_rows(&c, "INSERT INTO events (note) VALUES ('a'), ('b'), ('c') RETURNING id").await;
    assert_eq!(ids.len(), 3);
    c.execute("INSERT INTO events VALUES (DEFAULT, $1)", &[&"d"]).await.unwrap();
    assert_eq!(text_rows(&c, "SELECT count(DISTINCT id) FROM events").await, vec![row(&["4"])]);
    assert_eq!(text_rows(&c, "SELECT count(*), min(id), max(id) FROM events").await, vec![row(&["4", "1", "4"])]);
    assert_eq!(text_rows(&c, "SELECT note FROM events WHERE id = 4").await, vec![row(&["d"])]);
    // A missing or NULL distribution value is refused, naming the problem.
    let err = c.simple_query("INSERT INTO accounts (owner) VALUES ('nobody')").await.unwrap_err();
    assert_eq!(sqlstate(&err), "23502");
    assert!(error_text(&err).contains("partition column"), "{err}");
    let err = c.simple_query("INSERT INTO accounts (id, owner) VALUES (NULL, 'nobody')").await.unwrap_err();
    assert_eq!(sqlstate(&err), "23502");
}

#[tokio::test]
async fn colocated_and_reference_joins_route_to_one_shard() {
    let cluster = TestCluster::start(2);
    let c = setup(&cluster).await;
    c.batch_execute(
        "INSERT INTO accounts (id, owner) VALUES (7, 'gus'), (8, 'hal');
         INSERT INTO entries VALUES (7, 1, 5.00), (7, 2, 7.50), (8, 1, 1.00);",
    )
    .await
    .unwrap();
    let rows =
        text_rows(&c, "SELECT a.owner, e.seq, e.amount FROM accounts a JOIN entries e ON a.id = e.account_id WHERE a.id = 7 ORDER BY e.seq").await;
    assert_eq!(rows, vec![row(&["gus", "1", "5.00"]), row(&["gus", "2", "7.50"])]);
    let rows =
        text_rows(&c, "SELECT a.owner, count(e.seq) FROM accounts a LEFT JOIN entries e ON e.account_id = a.id WHERE a.id = 8 GROUP BY a.owner")
            .await;
    assert_eq!(rows, vec![row(&["hal", "1"])]);
    let rows = text_rows(&c, "SELECT e.amount * r.rate FROM entries e, currencies r WHERE e.account_id = 7 AND e.seq = 1 AND r.code = 'USD'").await;
    assert_eq!(rows, vec![row(&["4.500"])]);
    // The same join pinned by a parameter, in the extended protocol.
    let r = c.query_one("SELECT sum(e.amount)::text FROM accounts a JOIN entries e ON a.id = e.account_id WHERE a.id = $1", &[&7i64]).await.unwrap();
    assert_eq!(r.get::<_, String>(0), "12.50");
}

#[tokio::test]
async fn transactions_read_their_writes_and_roll_back_everywhere() {
    let cluster = TestCluster::start(2);
    let c = setup(&cluster).await;
    let ids: Vec<i64> = (1..=16).collect();
    c.batch_execute(&format!(
        "INSERT INTO accounts (id, owner, balance) VALUES {}",
        ids.iter().map(|i| format!("({i}, 'o', 100)")).collect::<Vec<_>>().join(",")
    ))
    .await
    .unwrap();
    // A transfer between accounts on (very likely) different workers, committed.
    c.batch_execute("BEGIN; UPDATE accounts SET balance = balance - 30 WHERE id = 1; UPDATE accounts SET balance = balance + 30 WHERE id = 2;")
        .await
        .unwrap();
    assert_eq!(text_rows(&c, "SELECT balance FROM accounts WHERE id = 1").await, vec![row(&["70.00"])], "read-your-writes inside the block");
    c.batch_execute("COMMIT").await.unwrap();
    assert_eq!(text_rows(&c, "SELECT sum(balance) FROM accounts").await, vec![row(&["1600.00"])]);
    // Rolled back on every node it touched.
    c.batch_execute("BEGIN; UPDATE accounts SET balance = 0 WHERE id = 3; UPDATE accounts SET balance = 0 WHERE id = 4; DELETE FROM accounts WHERE id = 5; ROLLBACK;").await.unwrap();
    assert_eq!(text_rows(&c, "SELECT count(*), sum(balance) FROM accounts").await, vec![row(&["16", "1600.00"])]);
    // Savepoints reach nodes that join the transaction after they were taken.
    c.batch_execute("BEGIN; UPDATE accounts SET balance = 1 WHERE id = 6; SAVEPOINT s1; UPDATE accounts SET balance = 2 WHERE id = 7; UPDATE accounts SET balance = 2 WHERE id = 8; ROLLBACK TO SAVEPOINT s1; COMMIT;").await.unwrap();
    assert_eq!(text_rows(&c, "SELECT id, balance FROM accounts WHERE id = 6").await, vec![row(&["6", "1.00"])]);
    assert_eq!(text_rows(&c, "SELECT balance FROM accounts WHERE id = 7").await, vec![row(&["100.00"])]);
    assert_eq!(text_rows(&c, "SELECT balance FROM accounts WHERE id = 8").await, vec![row(&["100.00"])]);
    // An error aborts the block until ROLLBACK, as in PostgreSQL.
    c.batch_execute("BEGIN").await.unwrap();
    let err = c.simple_query("INSERT INTO accounts (id, owner) VALUES (1, 'dup')").await.unwrap_err();
    assert_eq!(sqlstate(&err), "23505");
    // The error names the table and its constraint, as ORMs expect, not the shard's.
    let db = err.as_db_error().unwrap();
    assert_eq!((db.table(), db.constraint()), (Some("accounts"), Some("accounts_pkey")), "{db:?}");
    assert_eq!(db.message(), "duplicate key value violates unique constraint \"accounts_pkey\"");
    let err = c.simple_query("SELECT * FROM accounts WHERE id = 2").await.unwrap_err();
    assert_eq!(sqlstate(&err), "25P02");
    c.batch_execute("ROLLBACK").await.unwrap();
    assert_eq!(text_rows(&c, "SELECT count(*) FROM accounts").await, vec![row(&["16"])]);
    // Local tables join the same block.
    c.batch_execute("CREATE TABLE audit (note text); BEGIN; INSERT INTO audit VALUES ('a'); UPDATE accounts SET owner = 'z' WHERE id = 9; ROLLBACK;")
        .await
        .unwrap();
    assert_eq!(text_rows(&c, "SELECT count(*) FROM audit").await, vec![row(&["0"])]);
    assert_eq!(text_rows(&c, "SELECT owner FROM accounts WHERE id = 9").await, vec![row(&["o"])]);
    // The extended protocol inside a block.
    let mut c2 = cluster.connect().await;
    let tx = c2.transaction().await.unwrap();
    tx.execute("UPDATE accounts SET owner = $1 WHERE id = $2", &[&"tx", &10i64]).await.unwrap();
    let seen: String = tx.query_one("SELECT owner FROM accounts WHERE id = $1", &[&10i64]).await.unwrap().get(0);
    assert_eq!(seen, "tx");
    assert_eq!(text_rows(&c, "SELECT owner FROM accounts WHERE id = 10").await, vec![row(&["o"])], "not visible before commit");
    tx.commit().await.unwrap();
    assert_eq!(text_rows(&c, "SELECT owner FROM accounts WHERE id = 10").await, vec![row(&["tx"])]);
}

#[tokio::test]
async fn refusals_are_clear_and_the_session_survives() {
    let cluster = TestCluster::start(2);
    let c = setup(&cluster).await;
    c.batch_execute("INSERT INTO accounts (id, owner) VALUES (1, 'a'), (2, 'b')").await.unwrap();
    let err = c.simple_query("UPDATE accounts SET id = 5 WHERE id = 1").await.unwrap_err();
    assert_eq!(sqlstate(&err), "0A000");
    assert!(error_text(&err).contains("modifying the partition value of rows is not allowed"), "{err}");
    // INSERT … SELECT that moves rows between shard groups passes them through
    // the coordinator; a row without a key fails the whole statement.
    assert_eq!(c.execute("INSERT INTO accounts SELECT id + 10, owner FROM accounts", &[]).await.unwrap(), 2);
    let err = c.simple_query("INSERT INTO accounts (owner) SELECT owner FROM accounts").await.unwrap_err();
    assert_eq!(sqlstate(&err), "23502", "{err}");
    assert_eq!(text_rows(&c, "SELECT count(*) FROM accounts").await, vec![row(&["4"])]);
    // A WITH clause whose rows pass through the coordinator goes along (once refused).
    assert_eq!(c.execute("WITH src AS (SELECT id + 100 AS id, owner FROM accounts) INSERT INTO accounts SELECT * FROM src", &[]).await.unwrap(), 4);
    assert_eq!(text_rows(&c, "SELECT count(*) FROM accounts").await, vec![row(&["8"])]);
    // A materialized view stores the shards' rows (once refused).
    c.batch_execute("CREATE MATERIALIZED VIEW v AS SELECT * FROM accounts").await.unwrap();
    assert_eq!(text_rows(&c, "SELECT count(*) FROM v").await, vec![row(&["8"])]);
    // Unknown columns are reported by PostgreSQL itself.
    let err = c.query("SELECT nope FROM accounts WHERE id = $1", &[&1i64]).await.unwrap_err();
    assert_eq!(sqlstate(&err), "42703");
    assert_eq!(text_rows(&c, "SELECT owner FROM accounts WHERE id = 1").await, vec![row(&["a"])]);
}

#[tokio::test]
async fn a_stopped_worker_gives_a_clean_error_naming_it() {
    let cluster = TestCluster::start(2);
    let c = setup(&cluster).await;
    c.batch_execute(&format!("INSERT INTO accounts (id, owner) VALUES {}", (1..=20).map(|i| format!("({i}, 'o')")).collect::<Vec<_>>().join(",")))
        .await
        .unwrap();
    let down = &cluster.workers()[1];
    let down_port = down.port;
    down.stop().unwrap();
    let mut failures = 0;
    for id in 1..=20i64 {
        match c.query("SELECT owner FROM accounts WHERE id = $1", &[&id]).await {
            Ok(rows) => assert_eq!(rows.len(), 1),
            Err(e) => {
                failures += 1;
                assert!(error_text(&e).contains(&format!("127.0.0.1:{down_port}")), "error should name the node: {e}");
                assert!(["08006", "57P01", "08000"].contains(&sqlstate(&e).as_str()), "{e}");
            }
        }
    }
    assert!(failures > 0 && failures < 20, "only rows on the stopped worker fail ({failures} failed)");
    assert_eq!(text_rows(&c, "SELECT 1").await, vec![row(&["1"])]);
    down.start().unwrap();
    for id in 1..=20i64 {
        let rows = c.query("SELECT owner FROM accounts WHERE id = $1", &[&id]).await.unwrap();
        assert_eq!(rows.len(), 1, "the session reconnects to the restarted worker");
    }
}
