//! EXPLAIN of distributed statements: a Citus-style step for the tier, then
//! one task's plan as the node that runs it explains it
//! (`explain_format` prints the steps).

use super::explain_format::{Step, Title, Under};
use super::multi_shard::{add_task, count_activity, read_tasks_by_node, TasksByNode};
use super::repartition::Repartition;
use super::router::{evaluate_defaults, node_of_group, plan_tasks};
use super::Mode;
use crate::connection::client::ClientConn;
use crate::connection::TextRows;
use crate::error::{PgError, PgResult};
use crate::metadata::{Catalog, Node, Shard};
use crate::planner::{Combine, Command, ExplainPlan, MultiShardPlan, Plan};
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
    let step = plan_step(plan, &plan.inner, coordinator, catalog, parts, mode).await?;
    // PostgreSQL gives a JSON plan as one value of type json.
    let (rows, type_oid) = if plan.json() { (vec![step.json()], 114) } else { (step.text_lines(), 25) };
    if matches!(mode, Mode::Simple) {
        let field = FieldDescription { name: "QUERY PLAN".into(), table_oid: 0, column: 0, type_oid, type_size: -1, type_modifier: -1, format: 0 };
        backend::row_description(client.out(), &[field]);
    }
    for row in &rows {
        backend::data_row(client.out(), std::iter::once(Some(row.as_bytes())));
    }
    backend::command_complete(client.out(), "EXPLAIN");
    Ok(())
}

/// How `inner`, the explained statement (or what it became), runs.
async fn plan_step(
    plan: &ExplainPlan,
    inner: &Plan,
    coordinator: &Coordinator,
    catalog: &Catalog,
    parts: &mut Participants,
    mode: &Mode<'_>,
) -> PgResult<Step> {
    match inner {
        Plan::Fallback(fallback) => {
            if let Some(computed) = super::fallback::compute_subqueries(fallback, catalog, parts).await? {
                let mut step = Step::new(Title::Scan("Tessera Subqueries First"));
                step.property("Subqueries", "each ran once, as a distributed statement of its own; its result is a constant in the statement");
                for (i, (sql, sub_plan)) in computed.subqueries.iter().enumerate() {
                    let mut subquery = Step::new(Title::Subquery(i + 1, sql.clone()));
                    subquery.push(Under::Step(explain_pushdown(plan, sub_plan, catalog, parts, mode).await?));
                    step.push(Under::Step(subquery));
                }
                let rest = Box::pin(plan_step(plan, &computed.plan, coordinator, catalog, parts, mode)).await?;
                step.push(Under::Step(rest));
                return Ok(step);
            }
            let sizes = super::fallback::candidate_sizes(fallback, catalog, parts).await?;
            if let Some(pushdown) = super::fallback::broadcast_plan(fallback, &sizes, catalog, parts).await? {
                let mut step = Step::new(Title::Scan("Tessera Broadcast"));
                step.property("Reason", &fallback.reason);
                step.property("Small tables", "read once and shipped to every task as VALUES");
                step.push(Under::Step(explain_pushdown(plan, &pushdown, catalog, parts, mode).await?));
                return Ok(step);
            }
            if let Some(repartition) = super::repartition::plan(fallback, &sizes, catalog, parts).await? {
                return explain_repartition(plan, &repartition, catalog, parts, mode).await;
            }
            let sql = super::block_reads::ready(&fallback.read, coordinator, catalog, parts).await?;
            let mut step = Step::new(Title::Scan("Tessera General Fallback"));
            step.property("Reason", &fallback.reason);
            step.push(explain_in_coordinator_db(plan, sql, parts).await?);
            Ok(step)
        }
        Plan::InsertSelect(insert) => {
            let sql = super::block_reads::ready(&insert.rows, coordinator, catalog, parts).await?;
            let mut step = Step::new(Title::Scan("Tessera INSERT … SELECT through the Coordinator"));
            step.property("Target", format!("{}, rows routed to their shards in batches", insert.target.qualified_name()));
            step.push(explain_in_coordinator_db(plan, sql, parts).await?);
            Ok(step)
        }
        Plan::WithLocalRows(local) => {
            let replanned = super::local_rows::replanned(local, catalog, parts).await?;
            if !matches!(replanned, Plan::Router(_) | Plan::MultiShard(_)) {
                return Err(PgError::not_supported(format!("EXPLAIN of this statement, which runs {replanned}, is not supported yet")));
            }
            let mut step = Step::new(Title::Scan("Tessera Local Rows"));
            step.property(
                "Local tables",
                format!(
                    "{}: read once and shipped to every task as VALUES",
                    local.relations.iter().map(|rv| rv.relname.as_str()).collect::<Vec<_>>().join(", ")
                ),
            );
            step.push(Under::Step(explain_pushdown(plan, &replanned, catalog, parts, mode).await?));
            Ok(step)
        }
        Plan::MultiShard(multi) => {
            if let Combine::Query(query) = &multi.combine {
                if let Some(approximate) = super::approximate_distinct::replanned(query, catalog, parts).await? {
                    return Box::pin(plan_step(plan, &Plan::MultiShard(approximate), coordinator, catalog, parts, mode)).await;
                }
                if let Some(moved) = super::repartition::by_distinct_column(query, &multi.anchor, catalog, parts).await? {
                    return explain_repartition(plan, &moved, catalog, parts, mode).await;
                }
            }
            explain_pushdown(plan, inner, catalog, parts, mode).await
        }
        inner => explain_pushdown(plan, inner, catalog, parts, mode).await,
    }
}

/// A repartition join: what moves, then the co-located join. The temporary
/// tables are made for the explained task; without ANALYZE they stay
/// empty, and no row moves.
async fn explain_repartition(
    plan: &ExplainPlan,
    repartition: &Repartition,
    catalog: &Catalog,
    parts: &mut Participants,
    mode: &Mode<'_>,
) -> PgResult<Step> {
    let mut step = Step::new(Title::Scan(repartition.title()));
    step.property("Moved", repartition.describe());
    let mut made = Vec::new();
    let outcome = async {
        let started = Instant::now();
        let moved = repartition.make_intermediate(catalog, parts, plan.analyze(), &mut made).await?;
        if plan.analyze() {
            step.property(
                "Rows Moved",
                format!("{} (none through the coordinator) in {:.3} ms", moved.rows, started.elapsed().as_secs_f64() * 1000.0),
            );
        }
        parts.use_session_connections_only(true);
        let explained = explain_pushdown(plan, &repartition.pushdown, &repartition.catalog, parts, mode).await;
        parts.use_session_connections_only(false);
        explained
    }
    .await;
    repartition.drop_intermediate(parts, &made).await;
    step.push(Under::Step(outcome?));
    Ok(step)
}

/// A router or multi-shard plan: its tasks, and one task's plan.
async fn explain_pushdown(plan: &ExplainPlan, inner: &Plan, catalog: &Catalog, parts: &mut Participants, mode: &Mode<'_>) -> PgResult<Step> {
    match inner {
        Plan::Router(_) | Plan::Delegated(_) => {
            let (router, provider) = match inner {
                // Shown as delegated whether or not a block would keep it from being so.
                Plan::Delegated(delegation) => (&delegation.call, "Tessera Delegated Function Call"),
                Plan::Router(router) if router.command == Command::WholeOnWorker => (router, "Tessera Whole Statement on a Worker"),
                Plan::Router(router) => (router, "Tessera Router"),
                _ => unreachable!("matched above"),
            };
            let defaults = evaluate_defaults(router, parts).await?;
            let tasks = plan_tasks(router, parts, mode, defaults).await?;
            let task = tasks.first().ok_or_else(|| PgError::internal("router plan without tasks"))?;
            // User code runs unchanged on one worker, over its worker-side relations.
            let mut step = Step::new(Title::Scan(provider));
            step.property("Task Count", tasks.len());
            step.property("Tasks Shown", if tasks.len() == 1 { "All".to_string() } else { format!("One of {}", tasks.len()) });
            let access = if router.is_write() { Access::Write } else { Access::Read };
            step.push(explain_task(plan, node_of_group(catalog, task.group)?, access, &task.sql, parts).await?);
            Ok(step)
        }
        Plan::MultiShard(multi) if multi.is_write() => {
            let shard = multi.anchor.shards.first().ok_or_else(|| PgError::internal("table without shards"))?;
            let n = multi.anchor.shard_count();
            let mut step = Step::new(Title::Scan("Tessera Multi-Shard"));
            step.property("Combine", multi.combine.describe());
            step.property("Task Count", n);
            if plan.analyze() {
                // The write is made on every shard, as PostgreSQL makes it,
                // in one distributed transaction.
                let implicit = parts.begin_implicit();
                let result = analyzed_write(plan, multi, catalog, parts, mode, &mut step).await;
                parts.end_implicit(implicit, result).await?;
                return Ok(step);
            }
            step.property("Tasks Shown", format!("One of {n}"));
            let node = node_of_group(catalog, first_group(shard)?)?;
            step.push(explain_task(plan, node, Access::Write, &multi.template.sql_for_shard(shard.index)?, parts).await?);
            Ok(step)
        }
        Plan::MultiShard(multi) => {
            // Two-pass percentiles show their first pass.
            let template = match &multi.combine {
                Combine::Percentiles { passes, .. } => &passes.points,
                _ => &multi.template,
            };
            let by_node = read_tasks_by_node(parts, template, &multi.anchor, catalog).await?;
            let n: usize = by_node.iter().map(|(_, sqls)| sqls.len()).sum();
            let (node, sql) = by_node
                .first()
                .and_then(|(node, sqls)| Some((node.clone(), sqls.first()?.clone())))
                .ok_or_else(|| PgError::internal("a read without tasks"))?;
            let mut step = Step::new(Title::Scan("Tessera Multi-Shard"));
            step.property("Combine", multi.combine.describe());
            step.property("Task Count", n);
            if n < multi.anchor.shards.len() {
                step.property("Shard Groups", format!("{}, several read by each task", multi.anchor.shard_count()));
            }
            if plan.analyze() {
                analyzed_read(by_node, parts, mode, &mut step).await?;
            }
            step.property("Tasks Shown", format!("One of {n}"));
            step.push(explain_task(plan, &node, Access::Read, &sql, parts).await?);
            Ok(step)
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
    step: &mut Step,
) -> PgResult<()> {
    let mut shards = multi.anchor.shards.iter();
    let first = shards.next().ok_or_else(|| PgError::internal("table without shards"))?;
    step.property("Tasks Shown", format!("One of {}", multi.anchor.shard_count()));
    let node = node_of_group(catalog, first_group(first)?)?;
    step.push(explain_task(plan, node, Access::Write, &multi.template.sql_for_shard(first.index)?, parts).await?);
    let mut others = Vec::new();
    for shard in shards {
        let sql = plan.explain_sql(&multi.template.sql_for_shard(shard.index)?);
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
async fn analyzed_read(by_node: TasksByNode, parts: &mut Participants, mode: &Mode<'_>, step: &mut Step) -> PgResult<()> {
    let started = std::time::Instant::now();
    let nodes = count_activity(parts, by_node, Access::Read, mode).await?;
    let (rows, bytes) = nodes.iter().fold((0, 0), |(r, b), (_, a)| (r + a.rows, b + a.bytes));
    step.property(
        "Tasks Run",
        format!("all, in {:.3} ms; {rows} rows, {bytes} bytes received from the nodes", started.elapsed().as_secs_f64() * 1000.0),
    );
    for (node, activity) in nodes {
        step.property(
            format!("Node host={} port={}", node.addr.host, node.addr.port),
            format!(
                "{} tasks on {} connections, {} rows, {} bytes, done at {:.3} ms",
                activity.tasks,
                activity.connections,
                activity.rows,
                activity.bytes,
                activity.done.as_secs_f64() * 1000.0
            ),
        );
    }
    Ok(())
}

/// One task: its node, and that node's plan of it.
async fn explain_task(plan: &ExplainPlan, node: &Node, access: Access, sql: &str, parts: &mut Participants) -> PgResult<Under> {
    let mut task = Step::new(Title::Task);
    task.property("Node", format!("host={} port={} dbname={}", node.addr.host, node.addr.port, parts.login().database));
    let explain = plan.explain_sql(sql);
    let worker = parts.worker(node, access).await?;
    task.push(Under::NodePlan(first_column(worker.conn.query(&explain).await?)));
    Ok(Under::Step(task))
}

/// The coordinator database's plan of `sql`.
async fn explain_in_coordinator_db(plan: &ExplainPlan, sql: &str, parts: &mut Participants) -> PgResult<Under> {
    let rows = parts.local().await?.query(&plan.explain_sql(sql)).await;
    parts.observe_local_status();
    Ok(Under::NodePlan(first_column(rows?)))
}

/// The first column of EXPLAIN's rows.
fn first_column(rows: TextRows) -> Vec<String> {
    rows.into_iter().filter_map(|r| r.into_iter().next().flatten()).collect()
}
