//! Writes whose rows the shards cannot compute alone: MERGE pushed down per
//! shard group or through the coordinator, and writes reading local tables,
//! planned again with those tables' rows (`WithLocalRows`).

use crate::planner::{Command, Plan};

#[test]
fn a_merge_from_a_co_located_table_joined_on_the_key_runs_per_shard_group() {
    let multi = planned_as!("MERGE INTO ea USING eb ON ea.k = eb.k WHEN MATCHED THEN UPDATE SET v = eb.w", Plan::MultiShard);
    assert_eq!((multi.command, multi.to_string().as_str()), (Command::Merge, "Merge, 4 tasks, concatenate"));
    assert_eq!(
        multi.template.sql_for_shard(1).unwrap(),
        "MERGE INTO public.ea_101 ea USING public.eb_201 eb ON ea.k = eb.k WHEN MATCHED THEN UPDATE SET v = eb.w"
    );
}

/// Each source row goes to the shard its ON value hashes to, where the
/// MERGE runs over that shard's rows as VALUES.
#[test]
fn a_merge_from_other_rows_sends_each_to_its_shard() {
    let sql = "MERGE INTO ea USING (VALUES (1, 2)) s(k, v) ON ea.k = s.k WHEN NOT MATCHED THEN INSERT VALUES (s.k, 0, s.v)";
    let merge = planned_as!(sql, Plan::MergeThroughCoordinator);
    assert_eq!(merge.to_string(), "merge into public.ea through the coordinator");
    assert_eq!(merge.source.sql, "SELECT s.k::int, s.* FROM (VALUES (1, 2)) s(k, v)");
    assert_eq!(
        merge.shard_sql(1, "(3, 4)", &["k".into(), "v".into()]).unwrap(),
        "MERGE INTO public.ea_101 ea USING (VALUES (3, 4)) AS s(k, v) ON ea.k = s.k WHEN NOT MATCHED THEN INSERT VALUES (s.k, 0, s.v)"
    );
}

#[test]
fn a_merge_whose_rows_have_no_shard_is_refused() {
    let refusal = planned_as!("MERGE INTO ea USING eb ON ea.g = eb.w WHEN NOT MATCHED THEN INSERT VALUES (eb.w, 0, 0)", Plan::Unsupported);
    assert_eq!(
        refusal.message(),
        "this MERGE … WHEN NOT MATCHED THEN INSERT into a distributed table is not supported: no value of the source row decides its shard"
    );
}

#[test]
fn writes_reading_local_tables_wait_for_their_rows() {
    for sql in ["UPDATE ea SET v = r.rate FROM elocal r WHERE r.id = ea.k", "DELETE FROM ea WHERE g IN (SELECT id FROM elocal)"] {
        let local = planned_as!(sql, Plan::WithLocalRows);
        assert_eq!(local.to_string(), "with the rows of elocal", "{sql}");
    }
}
