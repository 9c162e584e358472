//! Background rebalancing (`citus_rebalance_start`): the planned moves are
//! written to the coordinator database as a job of tasks, one shard-group
//! move each, and carried out by whichever coordinator process holds the
//! job's advisory lock. Every process looks for jobs nobody runs (at start
//! and then every second), so a job outlives the process that started it:
//! after a crash the next process to look resumes it, where a task whose
//! move had committed counts as done and one that had not starts again
//! (cleanup removes what the interrupted move left).
//!
//! `citus_rebalance_status`, `citus_rebalance_wait` and
//! `citus_rebalance_stop` are SQL functions over the job tables
//! (metadata/schema.sql); a stop is noticed here at the move's next safe
//! point (between tasks, while the initial copy runs, before the cut-over).

use super::rebalance::PlannedMove;
use super::shard_move::{self, TransferMode};
use crate::config::Config;
use crate::connection::{quote_literal, PgConnection};
use crate::error::{sqlstate, PgError, PgResult};
use crate::process::context::{Caller, CommandContext, TaskProgress};
use crate::process::Coordinator;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// The advisory-lock class (first key) a running job holds its id under.
const JOB_LOCK_CLASS: i32 = 0x7e56;
/// How often every process looks for jobs that nobody runs.
const LOOK_INTERVAL: Duration = Duration::from_secs(1);
/// How often a running job checks whether it has been stopped.
const STOP_CHECK_INTERVAL: Duration = Duration::from_millis(250);

/// Writes the moves as a new rebalance job and returns its id. Refused
/// while another rebalance job has not ended.
pub async fn schedule_rebalance(config: &Config, moves: &[PlannedMove], mode: TransferMode, description: &str) -> PgResult<i64> {
    let tasks: Vec<String> = moves
        .iter()
        .map(|m| {
            let command = format!(
                "SELECT pg_catalog.citus_move_shard_placement({}, {}, {}, {}, {}, {})",
                m.shard_id,
                quote_literal(&m.source.addr.host),
                m.source.addr.port,
                quote_literal(&m.target.addr.host),
                m.target.addr.port,
                quote_literal(mode.name())
            );
            format!("({}, {}, {}, {}, {})", quote_literal(&command), m.shard_id, m.source.group_id, m.target.group_id, quote_literal(mode.name()))
        })
        .collect();
    let mut conn = PgConnection::connect(&config.coordinator_db_addr(), &config.service_login()).await?;
    let scheduled = conn
        .query_value(&format!(
            "WITH job AS (INSERT INTO tessera.pg_dist_background_job (job_type, description) VALUES ('rebalance', {}) RETURNING job_id),
                  tasks AS (INSERT INTO tessera.pg_dist_background_task (job_id, command, shardid, source_groupid, target_groupid, shard_transfer_mode)
                            SELECT job.job_id, t.* FROM job, (VALUES {}) t)
             SELECT job_id FROM job",
            quote_literal(description),
            tasks.join(", ")
        ))
        .await;
    let result = match scheduled {
        Ok(id) => id.and_then(|v| v.parse().ok()).ok_or_else(|| PgError::internal("the new job has no id")),
        Err(e) if e.code() == "23505" => {
            let running = conn
                .query_value("SELECT job_id FROM tessera.pg_dist_background_job WHERE job_type = 'rebalance' AND state IN ('scheduled', 'running', 'cancelling')")
                .await?
                .unwrap_or_default();
            Err(PgError::new(sqlstate::OBJECT_IN_USE, format!("a rebalance is already running as job {running}"))
                .with_hint("To monitor it, run SELECT * FROM citus_rebalance_status(); to stop it, SELECT citus_rebalance_stop()."))
        }
        Err(e) => Err(e),
    };
    conn.terminate().await;
    result
}

/// Runs jobs that nobody runs, for as long as the process lives.
pub async fn run_jobs(coordinator: Arc<Coordinator>) {
    loop {
        if let Err(e) = run_waiting_jobs(&coordinator).await {
            tracing::debug!("background jobs: {}", e.message());
        }
        tokio::select! {
            _ = coordinator.jobs_scheduled.notified() => {}
            _ = tokio::time::sleep(LOOK_INTERVAL) => {}
        }
    }
}

async fn run_waiting_jobs(coordinator: &Coordinator) -> PgResult<()> {
    let config = &coordinator.config;
    let mut conn = PgConnection::connect(&config.coordinator_db_addr(), &config.service_login()).await?;
    let waiting =
        conn.query("SELECT job_id FROM tessera.pg_dist_background_job WHERE state IN ('scheduled', 'running', 'cancelling') ORDER BY job_id").await?;
    for job_id in waiting.into_iter().filter_map(|row| row[0].as_deref().and_then(|v| v.parse::<i64>().ok())) {
        if conn.query_value(&format!("SELECT pg_try_advisory_lock({JOB_LOCK_CLASS}, {job_id}::int)")).await?.as_deref() != Some("t") {
            continue; // another process runs it
        }
        let mut progress = TaskProgress { conn, job_id, task_id: 0, stop: Arc::new(AtomicBool::new(false)) };
        let watcher = tokio::spawn(watch_for_stop(config.clone(), job_id, progress.stop.clone()));
        let result = run_job(coordinator, &mut progress).await;
        watcher.abort();
        conn = progress.conn;
        conn.execute(&format!("SELECT pg_advisory_unlock({JOB_LOCK_CLASS}, {job_id}::int)")).await?;
        result?;
    }
    conn.terminate().await;
    Ok(())
}

/// How a job ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Outcome {
    Finished,
    Cancelled,
    Failed,
}

/// Runs the job's tasks that have not ended, in order, and records how it
/// ended. An error of the coordinator database returns early: the job
/// stays unfinished for a later look.
async fn run_job(coordinator: &Coordinator, progress: &mut TaskProgress) -> PgResult<()> {
    let job_id = progress.job_id;
    let state = progress
        .conn
        .query_value(&format!(
            "UPDATE tessera.pg_dist_background_job SET state = CASE state WHEN 'scheduled' THEN 'running' ELSE state END, started_at = coalesce(started_at, now())
              WHERE job_id = {job_id} RETURNING state"
        ))
        .await?;
    let tasks = progress
        .conn
        .query(&format!(
            "SELECT task_id, shardid, source_groupid, target_groupid, shard_transfer_mode FROM tessera.pg_dist_background_task
              WHERE job_id = {job_id} AND status IN ('runnable', 'running') ORDER BY task_id"
        ))
        .await?;
    tracing::info!("running rebalance job {job_id}: {} moves left", tasks.len());
    let mut outcome = if state.as_deref() == Some("cancelling") { Outcome::Cancelled } else { Outcome::Finished };
    for row in tasks {
        // A failed or stopped task ends the loop below; this is a stop
        // asked for between tasks, or before the job began.
        if outcome == Outcome::Cancelled || progress.stop_requested() {
            outcome = Outcome::Cancelled;
            break;
        }
        let number = |i: usize| row[i].as_deref().and_then(|v| v.parse::<i64>().ok()).unwrap_or_default();
        let task = PlannedTask {
            shard_id: number(1),
            source_group: number(2) as i32,
            target_group: number(3) as i32,
            mode: TransferMode::parse(row[4].as_deref())?,
        };
        progress.task_id = number(0);
        progress.conn.execute(&format!("UPDATE tessera.pg_dist_background_task SET status = 'running' WHERE task_id = {}", progress.task_id)).await?;
        let (status, message) = match run_task(coordinator, progress, &task).await {
            Ok(message) => ("done", message),
            Err(e) if e.code() == sqlstate::QUERY_CANCELED && progress.stop_requested() => {
                outcome = Outcome::Cancelled;
                ("cancelled", e.message().to_string())
            }
            Err(e) => {
                tracing::warn!("rebalance job {job_id}: moving shard {} failed: {}", task.shard_id, e.message());
                outcome = Outcome::Failed;
                ("error", e.message().to_string())
            }
        };
        progress
            .conn
            .execute(&format!(
                "UPDATE tessera.pg_dist_background_task SET status = '{status}', message = {} WHERE task_id = {}",
                quote_literal(&message),
                progress.task_id
            ))
            .await?;
        if outcome != Outcome::Finished {
            break;
        }
    }
    let (job_state, left) = match outcome {
        Outcome::Finished => ("finished", "done"),
        Outcome::Cancelled => ("cancelled", "cancelled"),
        Outcome::Failed => ("failed", "unscheduled"),
    };
    progress
        .conn
        .execute(&format!(
            "BEGIN;
             UPDATE tessera.pg_dist_background_task SET status = '{left}' WHERE job_id = {job_id} AND status IN ('runnable', 'running');
             UPDATE tessera.pg_dist_background_job SET state = '{job_state}', finished_at = now() WHERE job_id = {job_id};
             COMMIT"
        ))
        .await?;
    tracing::info!("rebalance job {job_id} {job_state}");
    Ok(())
}

/// One task's move: the shard group of `shard_id` from node group
/// `source_group` to `target_group`.
struct PlannedTask {
    shard_id: i64,
    source_group: i32,
    target_group: i32,
    mode: TransferMode,
}

/// Carries out a task, unless the catalog says there is nothing left to
/// do (a move that committed before a crash, or a shard moved meanwhile);
/// returns what happened, for the task's message.
async fn run_task(coordinator: &Coordinator, progress: &mut TaskProgress, task: &PlannedTask) -> PgResult<String> {
    let catalog = coordinator.catalog.snapshot();
    let Some((_, shard)) = catalog.shard(task.shard_id) else {
        return Ok(format!("skipped: shard {} no longer exists", task.shard_id));
    };
    if shard.placements.contains(&task.target_group) {
        return Ok(format!("shard {} is on its target", task.shard_id));
    }
    if !shard.placements.contains(&task.source_group) {
        return Ok(format!("skipped: shard {} left its source meanwhile", task.shard_id));
    }
    let node = |group: i32| {
        catalog
            .node_for_group(group)
            .cloned()
            .ok_or_else(|| PgError::new(sqlstate::UNDEFINED_OBJECT, format!("node group {group} has no node any more")))
    };
    let (source, target) = (node(task.source_group)?, node(task.target_group)?);
    let (key, mut parts) = coordinator.service_session();
    let mut ctx = CommandContext { coordinator, parts: &mut parts, caller: Caller::Job(progress), catalog: catalog.clone() };
    let started = std::time::Instant::now();
    let result = shard_move::move_shard_placement(
        &mut ctx,
        task.shard_id,
        (&source.addr.host, source.addr.port),
        (&target.addr.host, target.addr.port),
        task.mode,
    )
    .await;
    drop(parts);
    coordinator.end_service_session(key);
    result.map(|()| format!("moved shard {} from {} to {} in {:.1} s", task.shard_id, source.addr, target.addr, started.elapsed().as_secs_f64()))
}

/// Sets `stop` once the job is marked to stop (`citus_rebalance_stop`),
/// which any process may do.
async fn watch_for_stop(config: Config, job_id: i64, stop: Arc<AtomicBool>) {
    let sql = format!("SELECT state = 'cancelling' FROM tessera.pg_dist_background_job WHERE job_id = {job_id}");
    loop {
        if let Ok(mut conn) = PgConnection::connect(&config.coordinator_db_addr(), &config.service_login()).await {
            while let Ok(state) = conn.query_value(&sql).await {
                if state.as_deref() == Some("t") {
                    stop.store(true, Ordering::Relaxed);
                    conn.terminate().await;
                    return;
                }
                tokio::time::sleep(STOP_CHECK_INTERVAL).await;
            }
        }
        tokio::time::sleep(STOP_CHECK_INTERVAL).await;
    }
}
