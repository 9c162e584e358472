//! The router tier: statements whose distributed tables are pinned to one
//! shard group by their distribution columns run whole there, rewritten to
//! name that group's shards; reference tables alone route anywhere; pins to
//! values only known at run time wait for them (`KeysMeet`).

use super::{shard_of, SHARD_COUNT};
use crate::planner::{Command, KeyValue, Plan, RouterPlan, ShardTarget};

/// What each shard group would be sent, in shard order.
fn shard_statements(router: &RouterPlan) -> Vec<String> {
    (0..router.shard_count()).map(|i| router.sql_for_shard(i).unwrap().to_string()).collect()
}

fn literal(text: &str) -> KeyValue {
    KeyValue::Literal { text: text.into(), type_oid: 23, cast_to_key: false }
}

#[test]
fn reads_and_writes_pinned_by_the_key_go_to_its_shard() {
    for (sql, command, shard_sql) in [
        ("SELECT * FROM ea WHERE k = 5", Command::Select, "SELECT * FROM public.ea_101 ea WHERE k = 5"),
        ("INSERT INTO ea (k, g, v) VALUES (5, 1, 2)", Command::Insert, "INSERT INTO public.ea_101 AS ea (k, g, v) VALUES (5, 1, 2)"),
        ("UPDATE ea SET v = 1 WHERE k = 5", Command::Update, "UPDATE public.ea_101 ea SET v = 1 WHERE k = 5"),
        ("DELETE FROM ea WHERE k = 5", Command::Delete, "DELETE FROM public.ea_101 ea WHERE k = 5"),
        ("SELECT * FROM ea WHERE k = 5 FOR UPDATE", Command::Select, "SELECT * FROM public.ea_101 ea WHERE k = 5 FOR UPDATE"),
        // A quoted literal takes the column's type.
        ("SELECT * FROM ea WHERE k = '5'", Command::Select, "SELECT * FROM public.ea_101 ea WHERE k = '5'"),
    ] {
        let router = planned_as!(sql, Plan::Router);
        assert_eq!((router.command, &router.target), (command, &ShardTarget::Shard(shard_of(5))), "{sql}");
        assert_eq!(router.anchor.as_ref().map(|t| t.name.as_str()), Some("ea"));
        assert_eq!(router.sql_for_shard(shard_of(5)).unwrap().as_ref(), shard_sql, "{sql}");
    }
}

#[test]
fn an_upsert_keeps_its_clauses_on_the_shard() {
    let router = planned_as!("INSERT INTO ea VALUES (1, 2, 3) ON CONFLICT (k) DO UPDATE SET v = excluded.v RETURNING *", Plan::Router);
    assert_eq!(router.target, ShardTarget::Shard(shard_of(1)));
    assert_eq!(
        router.sql_for_shard(shard_of(1)).unwrap().as_ref(),
        "INSERT INTO public.ea_100 AS ea VALUES (1, 2, 3) ON CONFLICT (k) DO UPDATE SET v = excluded.v RETURNING *"
    );
}

#[test]
fn a_parameter_key_picks_the_shard_at_run_time() {
    let router = planned_as!("SELECT * FROM ea WHERE k = $1", Plan::Router);
    assert_eq!(router.to_string(), "Select shard of $1");
    assert_eq!(router.target, ShardTarget::Key(KeyValue::Param(0)));
    // Every shard's statement is ready for whichever the value picks.
    assert_eq!(shard_statements(&router), (0..SHARD_COUNT).map(|i| format!("SELECT * FROM public.ea_10{i} ea WHERE k = $1")).collect::<Vec<_>>());
}

#[test]
fn co_located_tables_joined_on_the_key_route_together() {
    let router = planned_as!("SELECT * FROM ea JOIN eb ON ea.k = eb.k WHERE ea.k = 5", Plan::Router);
    assert_eq!(router.target, ShardTarget::Shard(shard_of(5)));
    assert_eq!(
        router.sql_for_shard(shard_of(5)).unwrap().as_ref(),
        "SELECT * FROM public.ea_101 ea JOIN public.eb_201 eb ON ea.k = eb.k WHERE ea.k = 5"
    );
    // Pinned apart by literals of the same shard group, they still meet there.
    let router = planned_as!("SELECT * FROM ea a JOIN eb b ON a.g = b.w WHERE a.k = 3 AND b.k = 5", Plan::Router);
    assert_eq!(router.target, ShardTarget::Shard(shard_of(3)));
    assert_eq!(shard_of(3), shard_of(5));
}

#[test]
fn keys_known_only_at_run_time_meet_or_fall_back() {
    let meet = planned_as!("SELECT * FROM ea a, eb b WHERE a.k = $1 AND b.k = $2", Plan::KeysMeet);
    assert_eq!(meet.route.target, ShardTarget::SameKeys(vec![KeyValue::Param(0), KeyValue::Param(1)]));
    let Plan::Fallback(otherwise) = &meet.otherwise else { panic!("expected the fallback otherwise, got {}", meet.otherwise) };
    assert_eq!(otherwise.reason, "its tables are pinned to key values in different shard groups");
    // Literals in different shard groups are known apart when planning.
    assert_ne!(shard_of(1), shard_of(3));
    let fallback = planned_as!("SELECT * FROM ea a JOIN eb b ON a.g = b.w WHERE a.k = 1 AND b.k = 3", Plan::Fallback);
    assert_eq!(fallback.reason, "queries whose tables are pinned to different shards are not supported yet");
}

#[test]
fn a_multi_row_insert_routes_each_row_by_its_key() {
    let router = planned_as!("INSERT INTO ea (k, g, v) VALUES (1, 1, 1), (3, 3, 3), (5, 5, 5)", Plan::Router);
    assert_eq!(router.to_string(), "Insert 3 rows");
    assert_eq!(router.target, ShardTarget::InsertRows(vec![literal("1"), literal("3"), literal("5")]));
    // Shard 0 gets the row of key 1, shard 1 those of keys 3 and 5.
    let filled = Default::default();
    assert_eq!(router.insert_rows_sql(0, &[0], &filled).unwrap().as_ref(), "INSERT INTO public.ea_100 AS ea (k, g, v) VALUES (1, 1, 1)");
    assert_eq!(
        router.insert_rows_sql(1, &[1, 2], &filled).unwrap().as_ref(),
        "INSERT INTO public.ea_101 AS ea (k, g, v) VALUES (3, 3, 3), (5, 5, 5)"
    );
    let router = planned_as!("INSERT INTO ea (k, g, v) VALUES ($1, $2, $3), ($4, $5, $6)", Plan::Router);
    assert_eq!(router.target, ShardTarget::InsertRows(vec![KeyValue::Param(0), KeyValue::Param(3)]));
}

#[test]
fn the_coordinator_fills_in_sequence_defaults() {
    // A serial key: the coordinator draws the value, then routes the row.
    let router = planned_as!("INSERT INTO events (payload) VALUES ('x')", Plan::Router);
    assert_eq!(router.target, ShardTarget::InsertRows(vec![KeyValue::Default]));
    let key = router.insert_key.as_ref().unwrap();
    assert_eq!((key.column.as_str(), key.position, key.default_sql.as_deref()), ("id", None, Some("nextval('events_id_seq'::regclass)")));
    // Another serial column: drawn for every row that leaves it out.
    let router = planned_as!("INSERT INTO items (k, note) VALUES (1, 'x'), (3, 'y')", Plan::Router);
    let fills = &router.insert_key.as_ref().unwrap().fills;
    assert_eq!(fills.len(), 1);
    assert_eq!((fills[0].column.as_str(), fills[0].position, fills[0].rows.as_slice()), ("id", None, &[0, 1][..]));
    let filled = crate::planner::FilledValues { key: vec![], others: vec![vec!["41".into(), "42".into()]] };
    assert_eq!(
        router.insert_rows_sql(1, &[1], &filled).unwrap().as_ref(),
        "INSERT INTO public.items_501 AS items (k, note, id) VALUES (3, 'y', '42')"
    );
}

#[test]
fn reference_tables_alone_route_to_their_placements() {
    let read = planned_as!("SELECT * FROM er", Plan::Router);
    assert_eq!((read.command, &read.target), (Command::Select, &ShardTarget::Reference));
    assert_eq!(shard_statements(&read), ["SELECT * FROM public.er_400 er"]);
    let write = planned_as!("INSERT INTO er VALUES (1, 'a')", Plan::Router);
    assert_eq!((write.command, &write.target), (Command::Insert, &ShardTarget::Reference));
    assert_eq!(shard_statements(&write), ["INSERT INTO public.er_400 AS er VALUES (1, 'a')"]);
}

#[test]
fn writing_with_queries_run_on_the_shard_group_they_pin() {
    // Its parts all reach one shard group: that group's shards.
    let router = planned_as!("WITH gone AS (DELETE FROM ea WHERE k = 5 RETURNING v) SELECT sum(v) FROM gone", Plan::Router);
    assert_eq!((router.command, &router.target), (Command::Delete, &ShardTarget::Shard(shard_of(5))));
    assert_eq!(
        router.sql_for_shard(shard_of(5)).unwrap().as_ref(),
        "WITH gone AS (DELETE FROM public.ea_101 ea WHERE k = 5 RETURNING v) SELECT sum(v) FROM gone"
    );
    // Writing elsewhere from what it read: unchanged, on that group's node.
    let sql = "WITH gone AS (DELETE FROM ea WHERE k = 5 RETURNING k, v) INSERT INTO eb SELECT k, v FROM gone";
    let router = planned_as!(sql, Plan::Router);
    assert_eq!((router.command, &router.target), (Command::WholeOnWorker, &ShardTarget::Shard(shard_of(5))));
    assert_eq!(router.sql_for_shard(shard_of(5)).unwrap().as_ref(), sql);
}

#[test]
fn changing_a_rows_key_is_refused() {
    let refusal = planned_as!("UPDATE ea SET k = 2 WHERE k = 1", Plan::Unsupported);
    assert_eq!(refusal.message(), "modifying the partition value of rows is not allowed");
}
