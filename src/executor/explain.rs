//! EXPLAIN of distributed statements: a Citus-style header for the tier, then
//! one task's plan as the node that runs it explains it.

use super::multi_shard::{add_task, count_activity, read_tasks_by_node, TasksByNode};
use super::repartition::Repartition;
use super::router::{evaluate_defaults, node_of_group, plan_tasks};
use super::Mode;
use crate::connection::client::ClientConn;
use crate::connection::TextRows;
use crate::error::{PgError, PgResult};
use crate::metadata::{Catalog, Node, Shard};
use crate::planner::{Command, ExplainPlan, MultiShardPlan, Plan};
use crate::process::Coordinator;
use crate::protocol::backend::{self, FieldDescription};
use crate::transaction::{Access, Participants};
use std::time::Instant;

pub async fn run(
    plan: &ExplainPlan,
    coordinator: &Coordinator,
    catalog: &Catalog,
    parts: &mut Participants,
    mode: &Mode<'_>,
    client: &mut ClientConn,
) -> PgResult<()> {
    if let Mode::Extended { bind, .. } = mode {
        if !bind.params.is_empty() {
            return Err(PgError::not_supported(
                "EXPLAIN of distributed statements with bind parameters is not supported yet; write the values into the statement",
            ));
        }
    }
    let mut lines = Vec::new();
    plan_lines(plan, &plan.inner, coordinator, catalog, parts, mode, &mut lines).await?;
    if matches!(mode, Mode::Simple) {
        let field =
            FieldDescription { name: "QUERY PLAN".into(), table_oid: 0, column: 0, type_oid: 25, type_size: -1, type_modifier: -1, format: 0 };
        backend::row_description(client.out(), &[field]);
    }
    for line in &lines {
        backend::data_row(client.out(), std::iter::once(Some(line.as_bytes())));
    }
    backend::command_complete(client.out(), "EXPLAIN");
    Ok(())
}

/// The lines of how `inner`, the explained statement (or what it became), runs.
async fn plan_lines(
    plan: &ExplainPlan,
    inner: &Plan,
    coordinator: &Coordinator,
    catalog: &Catalog,
    parts: &mut Participants,
    mode: &Mode<'_>,
    lines: &mut Vec<String>,
) -> PgResult<()> {
    match inner {
        Plan::Fallback(fallback) => {
            if let Some(computed) = super::fallback::compute_subqueries(fallback, catalog, parts).await? {
                lines.push("Custom Scan (Tessera Subqueries First)".to_string());
                lines.push(
                    "  Each subquery below ran once, as a distributed statement of its own; its result is a constant in the statement".to_string(),
                );
                for (i, (sql, sub_plan)) in computed.subqueries.iter().enumerate() {
                    lines.push(format!("  Subquery {}: {sql}", i + 1));
                    let mut sub_lines = Vec::new();
                    explain_pushdown(plan, sub_plan, catalog, parts, mode, &mut sub_lines).await?;
                    push_plan(sub_lines, "    ", lines);
                }
                let mut rest = Vec::new();
                Box::pin(plan_lines(plan, &computed.plan, coordinator, catalog, parts, mode, &mut rest)).await?;
                push_plan(rest, "  ", lines);
                return Ok(());
            }
            let sizes = super::fallback::candidate_sizes(fallback, catalog, parts).await?;
            match super::fallback::broadcast_plan(fallback, &sizes, catalog, parts).await? {
                Some(pushdown) => {
                    lines.push("Custom Scan (Tessera Broadcast)".to_string());
                    lines.push(format!("  Reason: {}", fallback.reason));
                    lines.push("  Small tables: read once and shipped to every task as VALUES".to_string());
                    let mut pushed = Vec::new();
                    explain_pushdown(plan, &pushdown, catalog, parts, mode, &mut pushed).await?;
                    push_plan(pushed, "  ", lines);
                }
                None => {
                    if let Some(repartition) = super::repartition::plan(fallback, &sizes, catalog, parts).await? {
                        return explain_repartition(plan, &repartition, catalog, parts, mode, lines).await;
                    }
                    let sql = super::block_reads::ready(&fallback.read, coordinator, catalog, parts).await?;
                    lines.push("Custom Scan (Tessera General Fallback)".to_string());
                    lines.push(format!("  Reason: {}", fallback.reason));
                    explain_in_coordinator_db(plan, sql, parts, lines).await?;
                }
            }
            Ok(())
        }
        Plan::InsertSelect(insert) => {
            let sql = super::block_reads::ready(&insert.rows, coordinator, catalog, parts).await?;
            lines.push("Custom Scan (Tessera INSERT … SELECT through the Coordinator)".to_string());
            lines.push(format!("  Target: {}, rows routed to their shards in batches", insert.target.qualified_name()));
            explain_in_coordinator_db(plan, sql, parts, lines).await
        }
        Plan::WithLocalRows(local) => {
            let replanned = super::local_rows::replanned(local, catalog, parts).await?;
            if !matches!(replanned, Plan::Router(_) | Plan::MultiShard(_)) {
                return Err(PgError::not_supported(format!("EXPLAIN of this statement, which runs {replanned}, is not supported yet")));
            }
            lines.push("Custom Scan (Tessera Local Rows)".to_string());
            lines.push(format!(
                "  Local tables: {}: read once and shipped to every task as VALUES",
                local.relations.iter().map(|rv| rv.relname.as_str()).collect::<Vec<_>>().join(", ")
            ));
            let mut pushed = Vec::new();
            explain_pushdown(plan, &replanned, catalog, parts, mode, &mut pushed).await?;
            push_plan(pushed, "  ", lines);
            Ok(())
        }
        inner => explain_pushdown(plan, inner, catalog, parts, mode, lines).await,
    }
}

/// The lines of a repartition join: what moves, then the co-located join.
/// The temporary tables are made for the explained task; without ANALYZE
/// they stay empty, and no row moves.
async fn explain_repartition(
    plan: &ExplainPlan,
    repartition: &Repartition,
    catalog: &Catalog,
    parts: &mut Participants,
    mode: &Mode<'_>,
    lines: &mut Vec<String>,
) -> PgResult<()> {
    lines.push("Custom Scan (Tessera Repartition Join)".to_string());
    lines.push(format!("  Moved: {}, node to node into a temporary table on each node", repartition.describe()));
    let mut made = Vec::new();
    let mut pushed = Vec::new();
    let outcome = async {
        let started = Instant::now();
        let moved = repartition.make_intermediate(catalog, parts, plan.analyze(), &mut made).await?;
        if plan.analyze() {
            lines.push(format!("  Rows Moved: {} (none through the coordinator) in {:.3} ms", moved.rows, started.elapsed().as_secs_f64() * 1000.0));
        }
        parts.use_session_connections_only(true);
        let explained = explain_pushdown(plan, &repartition.pushdown, &repartition.catalog, parts, mode, &mut pushed).await;
        parts.use_session_connections_only(false);
        explained
    }
    .await;
    repartition.drop_intermediate(parts, &made).await;
    outcome?;
    push_plan(pushed, "  ", lines);
    Ok(())
}

/// The lines of a router or multi-shard plan: header, tasks, one task's plan.
async fn explain_pushdown(
    plan: &ExplainPlan,
    inner: &Plan,
    catalog: &Catalog,
    parts: &mut Participants,
    mode: &Mode<'_>,
    lines: &mut Vec<String>,
) -> PgResult<()> {
    match inner {
        Plan::Router(_) | Plan::Delegated(_) => {
            let (router, header) = match inner {
                // Shown as delegated whether or not a block would keep it from being so.
                Plan::Delegated(delegation) => (&delegation.call, "Custom Scan (Tessera Delegated Function Call)"),
                Plan::Router(router) if router.command == Command::WholeOnWorker => (router, "Custom Scan (Tessera Whole Statement on a Worker)"),
                Plan::Router(router) => (router, "Custom Scan (Tessera Router)"),
                _ => unreachable!("matched above"),
            };
            let defaults = evaluate_defaults(router, parts).await?;
            let tasks = plan_tasks(router, parts, mode, defaults).await?;
            let task = tasks.first().ok_or_else(|| PgError::internal("router plan without tasks"))?;
            // User code runs unchanged on one worker, over its worker-side relations.
            lines.push(header.to_string());
            lines.push(format!("  Task Count: {}", tasks.len()));
            lines.push(format!("  Tasks Shown: {}", if tasks.len() == 1 { "All".to_string() } else { format!("One of {}", tasks.len()) }));
            let access = if router.is_write() { Access::Write } else { Access::Read };
            explain_task(plan, node_of_group(catalog, task.group)?, access, &task.sql, parts, lines).await
        }
        Plan::MultiShard(multi) if multi.is_write() => {
            let shard = multi.anchor.shards.first().ok_or_else(|| PgError::internal("table without shards"))?;
            let n = multi.anchor.shard_count();
            lines.push("Custom Scan (Tessera Multi-Shard)".to_string());
            lines.push(format!("  Combine: {}", multi.combine.describe()));
            lines.push(format!("  Task Count: {n}"));
            if plan.analyze() {
                // The write is made on every shard, as PostgreSQL makes it,
                // in one distributed transaction.
                let implicit = parts.begin_implicit();
                let result = analyzed_write(plan, multi, catalog, parts, mode, lines).await;
                return parts.end_implicit(implicit, result).await;
            }
            lines.push(format!("  Tasks Shown: One of {n}"));
            explain_task(plan, node_of_group(catalog, first_group(shard)?)?, Access::Write, &multi.template.sql_for_shard(shard.index)?, parts, lines)
                .await
        }
        Plan::MultiShard(multi) => {
            let by_node = read_tasks_by_node(parts, &multi.template, &multi.anchor, catalog).await?;
            let n: usize = by_node.iter().map(|(_, sqls)| sqls.len()).sum();
            let (node, sql) = by_node
                .first()
                .and_then(|(node, sqls)| Some((node.clone(), sqls.first()?.clone())))
                .ok_or_else(|| PgError::internal("a read without tasks"))?;
            lines.push("Custom Scan (Tessera Multi-Shard)".to_string());
            lines.push(format!("  Combine: {}", multi.combine.describe()));
            lines.push(format!("  Task Count: {n}"));
            if n < multi.anchor.shards.len() {
                lines.push(format!("  Shard Groups: {}, several read by each task", multi.anchor.shard_count()));
            }
            if plan.analyze() {
                analyzed_read(by_node, parts, mode, lines).await?;
            }
            lines.push(format!("  Tasks Shown: One of {n}"));
            explain_task(plan, &node, Access::Read, &sql, parts, lines).await
        }
        other => Err(PgError::internal(format!("EXPLAIN planned for {other}"))),
    }
}

/// EXPLAIN ANALYZE of a multi-shard write: the first task's analyzed plan
/// is shown, the other tasks run under EXPLAIN ANALYZE too.
async fn analyzed_write(
    plan: &ExplainPlan,
    multi: &MultiShardPlan,
    catalog: &Catalog,
    parts: &mut Participants,
    mode: &Mode<'_>,
    lines: &mut Vec<String>,
) -> PgResult<()> {
    let mut shards = multi.anchor.shards.iter();
    let first = shards.next().ok_or_else(|| PgError::internal("table without shards"))?;
    lines.push(format!("  Tasks Shown: One of {}", multi.anchor.shard_count()));
    explain_task(plan, node_of_group(catalog, first_group(first)?)?, Access::Write, &multi.template.sql_for_shard(first.index)?, parts, lines)
        .await?;
    let mut others = Vec::new();
    for shard in shards {
        let sql = plan.explain_sql(&multi.template.sql_for_shard(shard.index)?)?;
        add_task(&mut others, node_of_group(catalog, first_group(shard)?)?, sql.into());
    }
    count_activity(parts, others, Access::Write, mode).await?;
    Ok(())
}

fn first_group(shard: &Shard) -> PgResult<i32> {
    shard.placements.first().copied().ok_or_else(|| PgError::internal(format!("shard {} has no placement", shard.id)))
}

/// EXPLAIN ANALYZE of a multi-shard read: every task runs, and what each
/// node sent the coordinator is reported (the combine does not run).
async fn analyzed_read(by_node: TasksByNode, parts: &mut Participants, mode: &Mode<'_>, lines: &mut Vec<String>) -> PgResult<()> {
    let started = std::time::Instant::now();
    let nodes = count_activity(parts, by_node, Access::Read, mode).await?;
    let (rows, bytes) = nodes.iter().fold((0, 0), |(r, b), (_, a)| (r + a.rows, b + a.bytes));
    lines
        .push(format!("  Tasks Run: all, in {:.3} ms; {rows} rows, {bytes} bytes received from the nodes", started.elapsed().as_secs_f64() * 1000.0));
    for (node, activity) in nodes {
        lines.push(format!(
            "  Node host={} port={}: {} tasks on {} connections, {} rows, {} bytes, done at {:.3} ms",
            node.addr.host,
            node.addr.port,
            activity.tasks,
            activity.connections,
            activity.rows,
            activity.bytes,
            activity.done.as_secs_f64() * 1000.0
        ));
    }
    Ok(())
}

async fn explain_task(plan: &ExplainPlan, node: &Node, access: Access, sql: &str, parts: &mut Participants, lines: &mut Vec<String>) -> PgResult<()> {
    lines.push("  ->  Task".to_string());
    lines.push(format!("        Node: host={} port={} dbname={}", node.addr.host, node.addr.port, parts.login().database));
    let explain = plan.explain_sql(sql)?;
    let worker = parts.worker(node, access).await?;
    push_plan(text_lines(worker.conn.query(&explain).await?), "        ", lines);
    Ok(())
}

/// The coordinator database's plan of `sql`, under an arrow.
async fn explain_in_coordinator_db(plan: &ExplainPlan, sql: &str, parts: &mut Participants, lines: &mut Vec<String>) -> PgResult<()> {
    let rows = parts.local().await?.query(&plan.explain_sql(sql)?).await;
    parts.observe_local_status();
    push_plan(text_lines(rows?), "        ", lines);
    Ok(())
}

/// The first column of EXPLAIN's rows.
fn text_lines(rows: TextRows) -> Vec<String> {
    rows.into_iter().filter_map(|r| r.into_iter().next().flatten()).collect()
}

/// Appends a plan under an arrow, indented to sit below its parent line.
fn push_plan(plan_lines: Vec<String>, indent: &str, lines: &mut Vec<String>) {
    for (i, line) in plan_lines.into_iter().enumerate() {
        let arrow = if i == 0 { "->  " } else { "    " };
        lines.push(format!("{indent}{arrow}{line}"));
    }
}
