//! create_time_partitions and drop_old_time_partitions. The coordinator
//! database works out which partitions to create or drop (it knows the
//! table's partitions and their bounds: `tessera.missing_time_partitions`,
//! `tessera.old_time_partitions`); each statement then runs as the client's
//! own would, so that a distributed table's partitions get or lose their
//! shards, all in one distributed transaction.

use super::run_ddl_in_block;
use crate::connection::quote_literal;
use crate::error::{PgError, PgResult};
use crate::planner::Plan;
use crate::process::context::CommandContext;

/// Creates the partitions of `table` missing between `start_from` (now when
/// None) and `end_at`; whether it created any.
pub async fn create(ctx: &mut CommandContext<'_>, table: &str, interval: &str, end_at: &str, start_from: Option<&str>) -> PgResult<bool> {
    let sql = format!(
        "SELECT tessera.missing_time_partitions({}::regclass, {}::interval, {}::timestamptz, {})",
        quote_literal(table),
        quote_literal(interval),
        quote_literal(end_at),
        start_from.map_or("now()".to_string(), |s| format!("{}::timestamptz", quote_literal(s)))
    );
    let created = run_planned(ctx, &sql).await?;
    if created > 0 {
        ctx.notice(format!("created {created} partitions of {table}")).await;
    }
    Ok(created > 0)
}

/// Drops the partitions of `table` whose rows are all older than `older_than`.
pub async fn drop_old(ctx: &mut CommandContext<'_>, table: &str, older_than: &str) -> PgResult<()> {
    let sql = format!("SELECT tessera.old_time_partitions({}::regclass, {}::timestamptz)", quote_literal(table), quote_literal(older_than));
    let dropped = run_planned(ctx, &sql).await?;
    ctx.notice(format!("dropped {dropped} partitions of {table}")).await;
    Ok(())
}

/// Runs the statements `planning_sql` yields, in one transaction; how many.
async fn run_planned(ctx: &mut CommandContext<'_>, planning_sql: &str) -> PgResult<usize> {
    let statements: Vec<String> =
        ctx.parts.local().await?.query(planning_sql).await?.into_iter().filter_map(|row| row.into_iter().next().flatten()).collect();
    let implicit = ctx.parts.begin_implicit();
    let result = async {
        for sql in &statements {
            match crate::planner::plan_query(sql, &ctx.catalog).into_iter().next().map(|p| p.plan) {
                Some(Plan::Ddl(ddl)) => {
                    run_ddl_in_block(&ddl, sql, ctx).await?;
                }
                Some(Plan::Local) => {
                    ctx.parts.local().await?.execute(sql).await?;
                }
                Some(Plan::Unsupported(e)) => return Err(e),
                other => return Err(PgError::internal(format!("\"{sql}\" was planned as {other:?}"))),
            }
            super::distribute::reload_block_catalog(ctx).await?;
        }
        Ok(statements.len())
    }
    .await;
    ctx.finish_block(implicit, result).await
}
