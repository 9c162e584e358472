//! Percentiles in two passes while another session rewrites a shard's rows
//! between them: a rank that left the bracket the first pass found is seen,
//! and the statement answers from the shards' rows instead, so every answer
//! is PostgreSQL's over the table before or after a write.

mod common;
use common::{shard_of_int4, TestCluster};
use std::time::{Duration, Instant};

const SHARDS: u32 = 4;
const QUERY: &str =
    "SELECT g, percentile_cont(0.5) WITHIN GROUP (ORDER BY x), percentile_disc(0.9) WITHIN GROUP (ORDER BY x) FROM {t} GROUP BY g ORDER BY g";
const MISSED: &str = "left its bracket between the passes";

type Answer = Vec<(i32, f64, i32)>;

async fn answer(c: &tokio_postgres::Client, table: &str) -> Answer {
    let rows = c.query(&QUERY.replace("{t}", table), &[]).await.unwrap();
    rows.iter().map(|r| (r.get(0), r.get(1), r.get(2))).collect()
}

#[tokio::test]
async fn rows_written_between_the_passes_never_mix_into_an_answer() {
    let cluster = TestCluster::start(2);
    let c = cluster.connect().await;
    c.batch_execute(&format!(
        "CREATE TABLE pr (k int PRIMARY KEY, g int, x int);
         INSERT INTO pr SELECT i, i % 2, (i * 7919) % 20011 FROM generate_series(1, 40000) i;
         CREATE TABLE pr_local AS SELECT * FROM pr;
         SELECT create_distributed_table('pr', 'k', shard_count => {SHARDS});"
    ))
    .await
    .unwrap();
    // The writer negates the values of one shard's rows, and back: each
    // write is one shard's, so a read sees it whole or not at all.
    let keys: Vec<i32> = (1..=40000).filter(|k| shard_of_int4(*k, SHARDS) == shard_of_int4(1, SHARDS)).collect();
    let flip = "UPDATE {t} SET x = -x WHERE k = ANY($1)";
    let before = answer(&c, "pr_local").await;
    c.execute(&flip.replace("{t}", "pr_local"), &[&keys]).await.unwrap();
    let after = answer(&c, "pr_local").await;
    assert_ne!(before, after, "the write moves the percentiles");
    assert_eq!(answer(&c, "pr").await, before);

    let writer = cluster.connect().await;
    let stop = Instant::now() + Duration::from_secs(60);
    let flips = tokio::spawn(async move {
        let mut n = 0u64;
        while Instant::now() < stop {
            writer.execute(&flip.replace("{t}", "pr"), &[&keys]).await.unwrap();
            n += 1;
        }
        n
    });
    let (mut reads, mut misses) = (0, 0);
    while Instant::now() < stop && (reads < 50 || misses < 3) {
        let got = answer(&c, "pr").await;
        assert!(got == before || got == after, "read {reads}: {got:?} is neither {before:?} nor {after:?}");
        reads += 1;
        if reads % 10 == 0 {
            misses = cluster.coordinator_log().matches(MISSED).count();
        }
    }
    flips.abort();
    assert!(misses >= 3, "{reads} reads saw only {misses} misses between the passes");
}
