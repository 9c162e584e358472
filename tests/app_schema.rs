//! An application's schema moves over unchanged: the types, domains,
//! extensions, schemas, functions and triggers its tables use reach every
//! node, an ordinary role owns, distributes and changes its own tables, and
//! what it and other roles see matches a plain PostgreSQL.

mod common;
use common::{connect_as, error_text, outcome, PlainPostgres, TestCluster};

const ROLES: &str = "
    CREATE ROLE app LOGIN;
    CREATE ROLE reader LOGIN;
    GRANT CREATE ON DATABASE postgres TO app;
    GRANT CREATE ON SCHEMA public TO app;";

/// An ORM-style migration, run by the application's own role.
const MIGRATION: &str = "
    CREATE EXTENSION citext;
    CREATE TYPE plan AS ENUM ('free', 'pro', 'enterprise');
    CREATE DOMAIN email AS citext CHECK (VALUE LIKE '%_@_%');
    CREATE SCHEMA billing;
    CREATE FUNCTION touch() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        IF TG_OP = 'UPDATE' THEN NEW.revision := OLD.revision + 1; END IF;
        NEW.updated_at := timestamptz '2026-01-01 00:00:00+00' + NEW.revision * interval '1 day';
        RETURN NEW;
    END $$;
    CREATE TABLE accounts (id bigserial PRIMARY KEY, name text NOT NULL, plan plan NOT NULL DEFAULT 'free');
    CREATE TABLE billing.users (
        account_id bigint NOT NULL REFERENCES accounts (id),
        id bigserial,
        email email NOT NULL,
        revision int NOT NULL DEFAULT 0,
        updated_at timestamptz,
        PRIMARY KEY (account_id, id),
        UNIQUE (account_id, email));
    CREATE TRIGGER users_touch BEFORE INSERT OR UPDATE ON billing.users FOR EACH ROW EXECUTE FUNCTION touch();
    CREATE TABLE plan_limits (plan plan PRIMARY KEY, seats int CHECK (seats > 0));
    CREATE TABLE events (account_id bigint NOT NULL, at timestamptz NOT NULL, kind text, PRIMARY KEY (account_id, at)) PARTITION BY RANGE (at);
    CREATE TABLE events_2026_01 PARTITION OF events FOR VALUES FROM ('2026-01-01') TO ('2026-02-01');
    CREATE TABLE events_2026_02 PARTITION OF events FOR VALUES FROM ('2026-02-01') TO ('2026-03-01');";

const DISTRIBUTE: &str = "
    SELECT create_distributed_table('accounts', 'id');
    SELECT create_distributed_table('billing.users', 'account_id');
    SELECT create_reference_table('plan_limits');
    SELECT create_distributed_table('events', 'account_id');";

/// Later migrations, once the tables are distributed.
const LATER: &str = "
    ALTER TYPE plan ADD VALUE 'trial' BEFORE 'free';
    ALTER TABLE accounts RENAME COLUMN name TO title;
    ALTER TABLE plan_limits RENAME CONSTRAINT plan_limits_seats_check TO seats_positive;
    ALTER TABLE billing.users RENAME TO members;
    CREATE INDEX ON billing.members (updated_at);
    ALTER INDEX billing.members_updated_at_idx RENAME TO members_by_update;
    COMMENT ON TABLE accounts IS 'tenants';
    GRANT USAGE ON SCHEMA billing TO reader;
    GRANT SELECT ON accounts, billing.members TO reader;
    ALTER TABLE accounts ENABLE ROW LEVEL SECURITY;
    CREATE POLICY reader_sees_paying ON accounts FOR SELECT TO reader USING (plan IN ('pro', 'enterprise'));
    CREATE TABLE events_2026_03 PARTITION OF events FOR VALUES FROM ('2026-03-01') TO ('2026-04-01');
    CREATE FUNCTION seats_for(p plan) RETURNS int LANGUAGE sql IMMUTABLE AS $$ SELECT CASE p WHEN 'free' THEN 1 ELSE 10 END $$;
    CREATE FUNCTION account_label(a accounts) RETURNS text LANGUAGE sql AS $$ SELECT a.title || ' (' || a.plan || ')' $$;
    GRANT EXECUTE ON FUNCTION account_label(accounts) TO reader;
    COMMENT ON FUNCTION account_label(accounts) IS 'a row type only the coordinator database has';";

const AS_APP: &[&str] = &[
    "INSERT INTO accounts (title, plan) VALUES ('acme', 'pro'), ('initech', 'free'), ('umbrella', 'enterprise') RETURNING id, plan",
    "INSERT INTO plan_limits VALUES ('free', 1), ('pro', 10), ('enterprise', 100), ('trial', 2)",
    "INSERT INTO plan_limits VALUES ('trial', 0)",
    "INSERT INTO billing.members (account_id, email) VALUES (1, 'Ann@Acme.com'), (1, 'bob@acme.com'), (3, 'eve@umbrella.com') RETURNING id, revision, updated_at",
    "INSERT INTO billing.members (account_id, email) VALUES (1, 'not-an-email')",
    "INSERT INTO billing.members (account_id, email) VALUES (1, 'ANN@acme.COM')",
    "INSERT INTO billing.members (account_id, email) VALUES (99, 'x@y.z')",
    "UPDATE billing.members SET email = 'ann@acme.org' WHERE account_id = 1 AND email = 'ann@acme.com' RETURNING revision, updated_at",
    "SELECT account_id, email, revision, updated_at FROM billing.members WHERE account_id = 1 ORDER BY id",
    "SELECT a.title, count(m.id) FROM accounts a LEFT JOIN billing.members m ON m.account_id = a.id GROUP BY a.title ORDER BY a.title",
    "SELECT plan, count(*) FROM accounts GROUP BY plan ORDER BY plan",
    "SELECT a.title, l.seats FROM accounts a JOIN plan_limits l USING (plan) ORDER BY l.seats",
    "SELECT email FROM billing.members WHERE email = 'BOB@ACME.COM'",
    "SELECT obj_description('accounts'::regclass)",
    "SELECT title, seats_for(plan) FROM accounts ORDER BY id",
    "SELECT sum(seats_for(plan)) FROM accounts",
    "INSERT INTO events SELECT 1 + g % 3, timestamptz '2026-01-01 00:00:00+00' + g * interval '1 day', 'login' FROM generate_series(0, 80) g",
    "INSERT INTO events VALUES (1, '2026-05-01', 'late')",
    "SELECT account_id, date_trunc('month', at AT TIME ZONE 'UTC'), count(*) FROM events GROUP BY 1, 2 ORDER BY 1, 2",
    "SELECT count(*) FROM events_2026_03 WHERE account_id = 2",
];

const AS_READER: &[&str] = &[
    "SELECT title, plan FROM accounts ORDER BY id",
    "SELECT count(*) FROM accounts WHERE id = 2",
    "SELECT count(*) FROM billing.members",
    "INSERT INTO accounts (title) VALUES ('nope')",
    "SELECT seats FROM plan_limits",
];

#[tokio::test]
async fn an_application_schema_moves_over_under_its_own_role() {
    let cluster = TestCluster::start(2);
    let plain = PlainPostgres::start();
    for admin in [cluster.connect().await, plain.connect().await] {
        admin.batch_execute(ROLES).await.unwrap();
    }
    let (c, p) = (connect_as(cluster.port, "app").await, connect_as(plain.instance.port, "app").await);
    c.batch_execute(MIGRATION).await.unwrap_or_else(|e| panic!("migration through Tessera: {}", error_text(&e)));
    p.batch_execute(MIGRATION).await.unwrap();
    c.batch_execute(DISTRIBUTE).await.unwrap_or_else(|e| panic!("distribution by the owner: {}", error_text(&e)));
    c.batch_execute(LATER).await.unwrap_or_else(|e| panic!("later migrations through Tessera: {}", error_text(&e)));
    p.batch_execute(LATER).await.unwrap();

    for sql in AS_APP {
        let want = outcome(&p, sql).await;
        assert_eq!(outcome(&c, sql).await, want, "as app: {sql}");
    }
    let (c, p) = (connect_as(cluster.port, "reader").await, connect_as(plain.instance.port, "reader").await);
    for sql in AS_READER {
        let want = outcome(&p, sql).await;
        assert_eq!(outcome(&c, sql).await, want, "as reader: {sql}");
    }

    // The objects and the shards' triggers, policies and names are on every worker.
    for w in 0..2 {
        let worker = cluster.connect_worker(w).await;
        let objects = outcome(
            &worker,
            "SELECT to_regtype('plan') IS NOT NULL, to_regtype('email') IS NOT NULL, to_regnamespace('billing') IS NOT NULL,
                    (SELECT count(*) FROM pg_extension WHERE extname = 'citext'),
                    (SELECT count(*) FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid WHERE t.tgname = 'users_touch' AND c.relname LIKE 'members\\_%'),
                    (SELECT count(*) FROM pg_policy WHERE polname = 'reader_sees_paying') > 0,
                    (SELECT count(*) FROM pg_class WHERE relname LIKE 'members\\_by\\_update\\_%') > 0",
        )
        .await
        .unwrap();
        assert_eq!(
            objects,
            vec![vec![Some("t".into()), Some("t".into()), Some("t".into()), Some("1".into()), Some("16".into()), Some("t".into()), Some("t".into())]],
            "worker {w}"
        );
    }

    // Ordinary roles may read the catalog, not change it or the nodes.
    let app = connect_as(cluster.port, "app").await;
    assert_eq!(
        outcome(&app, "SELECT count(*) FROM pg_dist_partition").await.unwrap(),
        vec![vec![Some("7".into())]],
        "accounts, members, plan_limits, events and its three partitions"
    );
    let refused = outcome(&app, "SELECT citus_add_node('127.0.0.1', 1)").await.unwrap_err();
    assert_eq!(refused.0, "42501", "{refused:?}");
    let refused = outcome(&app, "DELETE FROM tessera.pg_dist_partition").await.unwrap_err();
    assert_eq!(refused.0, "42501", "{refused:?}");
    let admin = cluster.connect().await;
    admin.batch_execute("CREATE TABLE admin_only (id int); SELECT create_distributed_table('admin_only', 'id')").await.unwrap();
    for sql in ["SELECT undistribute_table('admin_only')", "SELECT tessera.forget_distribution('admin_only')"] {
        let not_owner = outcome(&app, sql).await.unwrap_err();
        assert_eq!(not_owner, ("42501".to_string(), "must be owner of table admin_only".to_string()), "{sql}");
    }
}

/// A worker that is down fails statements about shared objects and the
/// tables' shards as a whole: nothing is left half-applied anywhere.
#[tokio::test]
async fn shared_objects_and_triggers_are_all_or_nothing() {
    let cluster = TestCluster::start(2);
    let c = cluster.connect().await;
    c.batch_execute(
        "CREATE ROLE auditor; CREATE TABLE notes (id int PRIMARY KEY, body text, at timestamptz);
         SELECT create_distributed_table('notes', 'id');
         CREATE FUNCTION stamp() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN NEW.at := now(); RETURN NEW; END $$;",
    )
    .await
    .unwrap();
    cluster.kill_worker(1);
    let down = cluster.workers()[1].port;
    for sql in [
        "CREATE TYPE mood AS ENUM ('sad', 'happy')",
        "GRANT SELECT ON notes TO auditor",
        "CREATE TRIGGER notes_stamp BEFORE INSERT ON notes FOR EACH ROW EXECUTE FUNCTION stamp()",
    ] {
        let e = c.batch_execute(sql).await.expect_err(sql);
        assert!(error_text(&e).contains(&down.to_string()), "{sql}: the error names the node that is down: {}", error_text(&e));
    }
    let check = "SELECT to_regtype('mood') IS NULL, NOT EXISTS (SELECT FROM pg_trigger WHERE tgname = 'notes_stamp'),
                        NOT EXISTS (SELECT FROM pg_class WHERE relname LIKE 'notes%' AND relacl::text LIKE '%auditor%')";
    let nothing = vec![vec![Some("t".to_string()), Some("t".to_string()), Some("t".to_string())]];
    assert_eq!(outcome(&cluster.connect_coordinator_db().await, check).await.unwrap(), nothing, "coordinator database");
    assert_eq!(outcome(&cluster.connect_worker(0).await, check).await.unwrap(), nothing, "the worker that was up");
    cluster.start_worker(1);
    c.batch_execute("CREATE TYPE mood AS ENUM ('sad', 'happy')").await.unwrap_or_else(|e| panic!("{}", error_text(&e)));
}

/// citus_add_node gives a new node every role and shared object before it
/// holds anything; tables then use it as any other node, results carry the
/// coordinator database's type oids, and ordinary roles work there.
#[tokio::test]
async fn a_node_added_later_gets_every_object_and_role() {
    let cluster = TestCluster::start(2);
    let c = cluster.connect().await;
    c.batch_execute(
        "CREATE ROLE app LOGIN; CREATE ROLE staff; GRANT staff TO app;
         GRANT CREATE ON SCHEMA public TO app;
         CREATE EXTENSION citext;
         CREATE SCHEMA crm AUTHORIZATION app;
         CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy');
         CREATE TYPE pair AS (a int, b text);
         CREATE DOMAIN score AS int CHECK (VALUE BETWEEN 0 AND 10);
         CREATE FUNCTION double_it(x int) RETURNS int LANGUAGE sql IMMUTABLE AS 'SELECT x * 2';
         CREATE TABLE moods (m mood PRIMARY KEY, label citext);
         INSERT INTO moods VALUES ('sad', 'Sad'), ('ok', 'OK'), ('happy', 'Happy');
         SELECT create_reference_table('moods');
         GRANT SELECT ON moods TO staff;",
    )
    .await
    .unwrap();
    let node = PlainPostgres::start_node_for(&cluster);
    c.batch_execute(&format!("SELECT citus_add_node('127.0.0.1', {})", node.instance.port)).await.unwrap_or_else(|e| panic!("{}", error_text(&e)));

    let new = node.connect().await;
    let there = outcome(
        &new,
        "SELECT pg_has_role('app', 'staff', 'MEMBER'), to_regnamespace('crm') IS NOT NULL, to_regtype('mood') IS NOT NULL, to_regtype('pair') IS NOT NULL,
                to_regtype('score') IS NOT NULL, to_regprocedure('double_it(int)') IS NOT NULL, (SELECT count(*) FROM pg_extension WHERE extname = 'citext'),
                (SELECT nspowner::regrole::text FROM pg_namespace WHERE nspname = 'crm')",
    )
    .await
    .unwrap();
    let t = || Some("t".to_string());
    assert_eq!(there, vec![vec![t(), t(), t(), t(), t(), t(), Some("1".into()), Some("app".into())]]);

    let app = connect_as(cluster.port, "app").await;
    app.batch_execute(
        "CREATE TABLE crm.feelings (id int PRIMARY KEY, m mood, s score, p pair, twice int GENERATED ALWAYS AS (double_it(id)) STORED);
         SELECT create_distributed_table('crm.feelings', 'id', shard_count => 6);
         INSERT INTO crm.feelings (id, m, s, p) SELECT g, (ARRAY['sad', 'ok', 'happy']::mood[])[1 + g % 3], g % 11, (g, 'p' || g)::pair FROM generate_series(1, 60) g;",
    )
    .await
    .unwrap_or_else(|e| panic!("{}", error_text(&e)));
    let on_new_node = outcome(&new, "SELECT count(*) FROM pg_class WHERE relname LIKE 'feelings\\_%' AND relkind = 'r'").await.unwrap();
    assert_eq!(on_new_node, vec![vec![Some("2".into())]], "two of the six shards land on the new node");
    let rows = outcome(&app, "SELECT f.m, count(*), sum(twice), max(l.label) FROM crm.feelings f JOIN moods l USING (m) GROUP BY f.m ORDER BY f.m")
        .await
        .unwrap();
    let want = vec![
        vec![Some("sad".into()), Some("20".into()), Some("1260".into()), Some("Sad".into())],
        vec![Some("ok".into()), Some("20".into()), Some("1180".into()), Some("OK".into())],
        vec![Some("happy".into()), Some("20".into()), Some("1220".into()), Some("Happy".into())],
    ];
    assert_eq!(rows, want);

    // Clients know the coordinator database's type oids, and may bind them.
    let mood_oid: u32 = c.query_one("SELECT 'mood'::regtype::oid", &[]).await.unwrap().get(0);
    for sql in ["SELECT m, p FROM crm.feelings WHERE id = 5", "SELECT m, p FROM crm.feelings ORDER BY id LIMIT 3"] {
        let statement = app.prepare(sql).await.unwrap();
        assert_eq!(statement.columns()[0].type_().oid(), mood_oid, "{sql}");
        let rows = app.query(sql, &[]).await.unwrap_or_else(|e| panic!("{sql}: {}", error_text(&e)));
        assert!(!rows.is_empty(), "{sql}");
    }
    let by_mood = app.query("SELECT count(*) FROM crm.feelings WHERE m = $1::text::mood", &[&"ok"]).await.unwrap();
    assert_eq!(by_mood[0].get::<_, i64>(0), 20);
}
