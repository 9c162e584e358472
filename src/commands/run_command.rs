//! run_command_on_workers and its kin: a command run on every node, or on
//! every shard with the shard's name filled in, as the caller's role.
//!
//! Each run has a connection of its own, closed after it, so that what a
//! command does to its session (a SET, a transaction left open) stays out of
//! the session's pooled connections, and a command that fails on one node
//! leaves the others' outcomes standing, as Citus's functions do: each node
//! or shard gives a row saying whether it succeeded and its one value, its
//! command tag or its error.

use super::{invalid, null_argument, BOOL_OID, INT4_OID, INT8_OID, TEXT_OID};
use crate::config::{Login, ServerAddr};
use crate::connection::{LastResult, PgConnection};
use crate::error::{PgError, PgResult};
use crate::metadata::DistributedTable;
use crate::planner::ClusterFunction;
use crate::process::context::CommandContext;
use crate::protocol::backend::FieldDescription;
use crate::transaction::CancelTargets;
use std::sync::Arc;

/// One run of the command: where, and the row it answers with before its
/// outcome (node name and port, node id, shard ids: whatever the function shows).
struct Run {
    addr: ServerAddr,
    command: String,
    row: Vec<Option<String>>,
}

/// The result columns and rows of a run_command function called with `args`.
pub async fn run(
    function: ClusterFunction,
    args: &[Option<String>],
    ctx: &mut CommandContext<'_>,
) -> PgResult<(Vec<FieldDescription>, Vec<Vec<Option<String>>>)> {
    let arg = |i: usize| args.get(i).cloned().flatten();
    let text = |name: &str| FieldDescription::computed(name, TEXT_OID, -1);
    let int = |name: &str| FieldDescription::computed(name, INT4_OID, 4);
    let bigint = |name: &str| FieldDescription::computed(name, INT8_OID, 8);
    let catalog = ctx.catalog.clone();
    let node_row = |group: i32| {
        let node = catalog.node_for_group(group);
        (node.map(|n| n.addr.clone()), vec![node.map(|n| n.addr.host.clone()), node.map(|n| n.addr.port.to_string())])
    };
    let (fields, command_at, runs) = match function {
        ClusterFunction::RunCommandOnWorkers | ClusterFunction::RunCommandOnAllNodes => {
            let command = arg(0).ok_or_else(|| null_argument("command"))?;
            let mut runs = Vec::new();
            let fields = if function == ClusterFunction::RunCommandOnAllNodes {
                runs.push(Run { addr: ctx.coordinator.config.coordinator_db_addr(), command: command.clone(), row: vec![Some("0".into())] });
                vec![int("nodeid")]
            } else {
                vec![text("nodename"), int("nodeport")]
            };
            for node in catalog.active_nodes() {
                let row = match function {
                    ClusterFunction::RunCommandOnAllNodes => vec![Some(node.id.to_string())],
                    _ => vec![Some(node.addr.host.clone()), Some(node.addr.port.to_string())],
                };
                runs.push(Run { addr: node.addr.clone(), command: command.clone(), row });
            }
            (fields, 1, runs)
        }
        ClusterFunction::RunCommandOnShards | ClusterFunction::RunCommandOnPlacements => {
            let table = distributed_table(ctx, arg(0), "table_name").await?;
            let command = arg(1).ok_or_else(|| null_argument("command"))?;
            let every_placement = function == ClusterFunction::RunCommandOnPlacements;
            let mut runs = Vec::new();
            for shard in &table.shards {
                let placements = if every_placement { &shard.placements[..] } else { &shard.placements[..shard.placements.len().min(1)] };
                for &group in placements {
                    let (addr, node) = node_row(group);
                    let mut row = if every_placement { node } else { Vec::new() };
                    row.push(Some(shard.id.to_string()));
                    runs.push(Run {
                        addr: addr.ok_or_else(|| missing_node(&table, shard.id))?,
                        command: fill_in(&command, &[&table.qualified_shard_name(shard)]),
                        row,
                    });
                }
            }
            runs.sort_by_key(|r| r.row.last().cloned().flatten().and_then(|id| id.parse::<i64>().ok()));
            let fields = if every_placement { vec![text("nodename"), int("nodeport"), bigint("shardid")] } else { vec![bigint("shardid")] };
            (fields, 2, runs)
        }
        ClusterFunction::RunCommandOnColocatedPlacements => {
            let first = distributed_table(ctx, arg(0), "table_name1").await?;
            let second = distributed_table(ctx, arg(1), "table_name2").await?;
            let command = arg(2).ok_or_else(|| null_argument("command"))?;
            if first.colocation_id != second.colocation_id {
                return Err(invalid(&format!("tables {} and {} are not co-located", first.qualified_name(), second.qualified_name())));
            }
            let mut runs = Vec::new();
            for shard in &first.shards {
                let other = second.shards.iter().find(|s| s.index == shard.index).ok_or_else(|| missing_node(&second, shard.id))?;
                for &group in &shard.placements {
                    let (addr, mut row) = node_row(group);
                    row.extend([Some(shard.id.to_string()), Some(other.id.to_string())]);
                    let command = fill_in(&command, &[&first.qualified_shard_name(shard), &second.qualified_shard_name(other)]);
                    runs.push(Run { addr: addr.ok_or_else(|| missing_node(&first, shard.id))?, command, row });
                }
            }
            (vec![text("nodename"), int("nodeport"), bigint("shardid1"), bigint("shardid2")], 3, runs)
        }
        _ => return Err(PgError::internal(format!("{function:?} runs no commands"))),
    };
    let parallel = arg(command_at).as_deref() != Some("f");
    let login = ctx.parts.separate_login().await?;
    let cancel = ctx.parts.cancel_targets();
    let outcomes = if parallel {
        futures::future::join_all(runs.iter().map(|r| run_once(&r.addr, &login, &r.command, &cancel))).await
    } else {
        let mut outcomes = Vec::with_capacity(runs.len());
        for r in &runs {
            outcomes.push(run_once(&r.addr, &login, &r.command, &cancel).await);
        }
        outcomes
    };
    let mut fields = fields;
    fields.extend([FieldDescription::computed("success", BOOL_OID, 1), text("result")]);
    let rows = runs
        .into_iter()
        .zip(outcomes)
        .map(|(run, (success, result))| {
            let mut row = run.row;
            row.extend([Some(if success { "t" } else { "f" }.to_string()), Some(result)]);
            row
        })
        .collect();
    Ok((fields, rows))
}

/// The distributed or reference table an argument names.
async fn distributed_table(ctx: &mut CommandContext<'_>, name: Option<String>, parameter: &str) -> PgResult<Arc<DistributedTable>> {
    let name = name.ok_or_else(|| null_argument(parameter))?;
    super::named_table(ctx, &name).await?.ok_or_else(|| {
        PgError::new(crate::error::sqlstate::WRONG_OBJECT_TYPE, format!("\"{name}\" is not a distributed table"))
            .with_hint("Distribute it first with create_distributed_table or create_reference_table.")
    })
}

fn missing_node(table: &DistributedTable, shard: i64) -> PgError {
    PgError::internal(format!("shard {shard} of {} has no placement on a known node", table.qualified_name()))
}

/// `command` with its `%s` placeholders replaced by `names`, in order (the
/// last name fills any further ones) and `%%` by `%`, as Citus formats it.
fn fill_in(command: &str, names: &[&str]) -> String {
    let mut out = String::with_capacity(command.len() + 32);
    let mut used = 0;
    let mut chars = command.chars().peekable();
    while let Some(c) = chars.next() {
        match (c, chars.peek()) {
            ('%', Some('s')) => {
                chars.next();
                out.push_str(names.get(used).or(names.last()).copied().unwrap_or_default());
                used += 1;
            }
            ('%', Some('%')) => {
                chars.next();
                out.push('%');
            }
            _ => out.push(c),
        }
    }
    out
}

/// Runs `command` on a connection of its own to `addr`: whether it
/// succeeded, and its one value (empty when NULL or no row), its command tag
/// or its error message.
async fn run_once(addr: &ServerAddr, login: &Login, command: &str, cancel: &CancelTargets) -> (bool, String) {
    let mut conn = match PgConnection::connect(addr, login).await {
        Ok(conn) => conn,
        Err(e) => return (false, format!("could not connect to {addr}: {}", e.message())),
    };
    let key = conn.backend_key();
    cancel.lock().unwrap().push((addr.clone(), key));
    let result = conn.last_result(command).await;
    cancel.lock().unwrap().retain(|(_, k)| *k != key);
    conn.terminate().await;
    outcome(result)
}

/// A command's result as Citus's functions report it: a result set must be
/// one column and at most one row.
fn outcome(result: PgResult<LastResult>) -> (bool, String) {
    match result {
        Err(e) => (false, e.message().to_string()),
        Ok(LastResult::Command(tag)) => (true, tag),
        Ok(LastResult::Rows { columns, .. }) if columns != 1 => (false, "expected a single column in query target".into()),
        Ok(LastResult::Rows { rows, .. }) if rows.len() > 1 => (false, "expected a single row in query result".into()),
        Ok(LastResult::Rows { rows, .. }) => (true, rows.into_iter().next().and_then(|row| row.into_iter().next().flatten()).unwrap_or_default()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placeholders_take_the_shard_names_in_order() {
        assert_eq!(fill_in("ANALYZE %s", &["public.t_102008"]), "ANALYZE public.t_102008");
        assert_eq!(fill_in("SELECT count(*) FROM %s a JOIN %s b USING (id)", &["a_1", "b_1"]), "SELECT count(*) FROM a_1 a JOIN b_1 b USING (id)");
        assert_eq!(fill_in("VACUUM %s; ANALYZE %s", &["t_1"]), "VACUUM t_1; ANALYZE t_1");
        assert_eq!(fill_in("SELECT count(*) FROM %s WHERE name LIKE 'a%%'", &["t_1"]), "SELECT count(*) FROM t_1 WHERE name LIKE 'a%'");
        assert_eq!(fill_in("SELECT '100%'", &["t_1"]), "SELECT '100%'");
    }

    #[test]
    fn a_result_set_must_be_one_value() {
        let rows = |columns: usize, values: &[Option<&str>]| LastResult::Rows {
            columns,
            rows: values.iter().map(|v| vec![v.map(str::to_string)]).collect(),
        };
        assert_eq!(outcome(Ok(rows(1, &[Some("42")]))), (true, "42".into()));
        assert_eq!(outcome(Ok(rows(1, &[None]))), (true, String::new()));
        assert_eq!(outcome(Ok(rows(1, &[]))), (true, String::new()));
        assert_eq!(outcome(Ok(rows(1, &[Some("1"), Some("2")]))), (false, "expected a single row in query result".into()));
        assert_eq!(outcome(Ok(rows(2, &[Some("1")]))), (false, "expected a single column in query target".into()));
        assert_eq!(outcome(Ok(LastResult::Command("CREATE TABLE".into()))), (true, "CREATE TABLE".into()));
    }
}
