//! INSERT … SELECT into a distributed table: pushed down per shard group
//! when each selected row stays in its group (the SELECT reads co-located
//! tables and gives their key as the target's), otherwise its rows pass
//! through the coordinator, which routes them.

use crate::planner::{Command, Plan};

#[test]
fn rows_that_stay_in_their_shard_group_are_inserted_there() {
    let multi = planned_as!("INSERT INTO eb (k, w) SELECT k, v FROM ea WHERE g > 1", Plan::MultiShard);
    assert_eq!(multi.to_string(), "Insert, 4 tasks, concatenate");
    assert_eq!(multi.command, Command::Insert);
    assert_eq!(multi.template.sql_for_shard(2).unwrap(), "INSERT INTO public.eb_202 AS eb (k, w) SELECT k, v FROM public.ea_102 ea WHERE g > 1");
}

#[test]
fn other_rows_pass_through_the_coordinator() {
    for (sql, target, rows_sql) in [
        // The key is another column's value: rows change shard group.
        (
            "INSERT INTO eb (k, w) SELECT g, count(*) FROM ea GROUP BY g",
            "public.eb",
            "SELECT g::int, count(*) FROM tessera_fallback.dist_1 ea GROUP BY g",
        ),
        // A local table's rows are only in the coordinator database.
        ("INSERT INTO ea (k) SELECT id FROM elocal", "public.ea", "SELECT id::int FROM elocal"),
        // Rows from a reference table land anywhere.
        ("INSERT INTO ea (k, g) SELECT id, length(name) FROM er", "public.ea", "SELECT id::int, length(name) FROM tessera_fallback.dist_4 er"),
    ] {
        let insert = planned_as!(sql, Plan::InsertSelect);
        assert_eq!(insert.to_string(), format!("into {target} through the coordinator"), "{sql}");
        assert_eq!(insert.rows.sql, rows_sql, "{sql}");
    }
}

/// The coordinator database computes the SELECT's rows, and parses (only)
/// the INSERT so that PostgreSQL reports its type errors; the rows are
/// then routed as an INSERT … VALUES's, their key cast to the key's type.
#[test]
fn the_select_gives_the_rows_and_the_router_fills_sequences() {
    // `id` draws from a sequence only the coordinator database has.
    let insert = planned_as!("INSERT INTO items (k, note) SELECT k, 'x' FROM ea ON CONFLICT DO NOTHING RETURNING id", Plan::InsertSelect);
    assert_eq!(insert.rows.sql, "SELECT k::int, 'x' FROM tessera_fallback.dist_1 ea");
    assert_eq!(insert.check_sql.as_deref(), Some("INSERT INTO items (k, note) SELECT k, 'x' FROM ea"));
    assert_eq!(insert.columns.as_deref(), Some(&["k".to_string(), "note".to_string()][..]));
    assert_eq!((insert.shard_clauses.as_str(), insert.returns_rows), (" ON CONFLICT DO NOTHING RETURNING id", true));
}

/// Where the SELECT's key column cannot be told (`SELECT *`), the rows are
/// those the INSERT would store in the empty shell, rolled back.
#[test]
fn rows_of_unknown_shape_come_back_from_the_shell() {
    let insert = planned_as!("INSERT INTO ea SELECT * FROM ec", Plan::InsertSelect);
    assert_eq!(insert.rows.sql, "INSERT INTO ea SELECT * FROM tessera_fallback.dist_3 ec RETURNING *");
    assert_eq!((insert.check_sql.as_deref(), insert.columns.as_deref()), (None, None));
}
