//! COPY of distributed and reference tables: each shard's statement, and
//! where each row's key is.

use crate::copy::Format;
use crate::planner::{KeyPosition, Plan};

#[test]
fn copy_from_the_client_splits_rows_by_their_key_field() {
    let copy = planned_as!("COPY ea (g, v, k) FROM STDIN", Plan::Copy);
    assert_eq!(copy.to_string(), "from client into ea (4 shards, Text)");
    assert!(matches!(copy.key, KeyPosition::Field(field) if field.index == 2), "{:?}", copy.key);
    assert_eq!(copy.shard_sql[3], "COPY public.ea_103(g, v, k) FROM STDIN");
    assert_eq!(copy.shell_sql, "COPY ea (g, v, k) FROM STDIN");
    // Rows leaving out a serial column get its value from the coordinator.
    let copy = planned_as!("COPY items (k, note) FROM STDIN", Plan::Copy);
    assert_eq!(copy.fills, ["nextval('items_id_seq'::regclass)"]);
    assert_eq!(copy.shard_sql[0], "COPY public.items_500(k, note, id) FROM STDIN");
    // Without the key, the error waits for PostgreSQL's checks.
    assert_eq!(planned_as!("COPY ea (g, v) FROM STDIN", Plan::Copy).key, KeyPosition::Missing);
}

#[test]
fn a_reference_table_takes_every_row_everywhere() {
    let copy = planned_as!("COPY er FROM STDIN (FORMAT csv)", Plan::Copy);
    assert_eq!(
        (copy.key, copy.format.format, copy.shard_sql.as_slice()),
        (KeyPosition::Everywhere, Format::Csv, &["COPY public.er_400 FROM STDIN CSV".to_string()][..])
    );
}

#[test]
fn copy_to_the_client_reads_every_shard() {
    let copy = planned_as!("COPY ea TO STDOUT", Plan::Copy);
    assert_eq!(copy.to_string(), "to client from ea (4 shards, Text)");
    assert_eq!(copy.shard_sql, (0..4).map(|i| format!("COPY public.ea_10{i} TO STDOUT")).collect::<Vec<_>>());
}

#[test]
fn server_files_are_refused() {
    let refusal = planned_as!("COPY ea FROM '/tmp/rows'", Plan::Unsupported);
    assert_eq!(refusal.message(), "COPY FROM a file or program on the server into a distributed table is not supported");
}
