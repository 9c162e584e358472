//! The general fallback tier at run time. A join of several distributed tables
//! where all but the largest are small first tries a broadcast: the small
//! tables' rows are read once and shipped to every shard of the largest as a
//! VALUES list, which turns the query into one the pushdown tiers can split.
//! Otherwise the coordinator database runs the rewritten statement over the
//! foreign-table stand-ins of the shards.

use super::multi_shard::{
    add_task, collect_partials, collect_rows, combine_sql, read_tasks_by_node, rows_as_relation, shard_type_names, TasksByNode,
};
use super::partials;
use super::router::{node_of_group, plan_tasks, Defaults};
use super::{run_on_coordinator_db, Mode};
use crate::connection::client::ClientConn;
use crate::connection::{quote_ident, text_row_size, TextRows};
use crate::error::{sqlstate, PgError, PgResult};
use crate::metadata::{Catalog, DistributedTable};
use crate::planner::decorrelate::{decorrelate, has_semi_join, semi_joins};
use crate::planner::deparse::deparse_statement;
use crate::planner::rewrite::{rows_placeholder, ShardTemplate};
use crate::planner::uncorrelated_subqueries::{self, Subquery, SubqueryUse};
use crate::planner::{column_ref, plain_select, plan_tree, res_target, CombineQuery, FallbackPlan, Plan};
use crate::process::Coordinator;
use crate::protocol::backend::FieldDescription;
use crate::protocol::frontend;
use crate::transaction::Participants;
use pg_query::protobuf;
use pg_query::NodeEnum;
use std::sync::Arc;

/// Tables larger than this on disk (all shards, TOAST included) are not
/// read for a broadcast at all.
const BROADCAST_LIMIT_BYTES: i64 = 8 << 20;
/// The most rows a broadcast ships, summed over its tables and the tasks
/// that get them: each task's node parses every row it is sent (some 10 µs
/// a row), so this bounds what a broadcast adds to the workers' work to
/// well under a second of CPU.
const BROADCAST_MAX_ROWS_SHIPPED: usize = 64_000;
/// The most text (VALUES lists) a broadcast ships, summed the same way.
const BROADCAST_MAX_BYTES_SHIPPED: usize = 32 << 20;
/// Shipments up to this size go out whatever the size of the largest
/// table; larger ones only if that table is larger still: otherwise the
/// coordinator database, reading the tables over postgres_fdw, moves less.
const BROADCAST_ALWAYS_BYTES: usize = 1 << 20;

/// Readies the stand-ins for a `statement` (its kind, for the error) whose
/// rows the coordinator database reads through them by lending them to the
/// shells. Refused after this block wrote on the workers: postgres_fdw's
/// own connections cannot see those writes.
pub async fn prepare_to_read(statement: &str, coordinator: &Coordinator, catalog: &Catalog, parts: &mut Participants) -> PgResult<()> {
    if parts.wrote_on_workers() {
        return Err(PgError::not_supported(format!(
            "this {statement} reads distributed tables in the coordinator database over postgres_fdw, whose connections cannot see the writes this transaction has already made on the workers"
        ))
        .with_hint("Run it before the writes, or in its own transaction."));
    }
    coordinator.prepare_fallback(catalog.version, &parts.acting_role().await?).await
}

pub async fn run(
    plan: &FallbackPlan,
    coordinator: &Coordinator,
    catalog: &Catalog,
    parts: &mut Participants,
    mode: &Mode<'_>,
    client: &mut ClientConn,
) -> PgResult<()> {
    if let Some(computed) = compute_subqueries(plan, catalog, parts).await? {
        tracing::debug!("fallback with {} scalar subqueries computed first", computed.subqueries.len());
        return match &computed.plan {
            Plan::Router(router) => super::router::run_router(router, parts, catalog, mode, client).await,
            Plan::MultiShard(multi) => Box::pin(super::multi_shard::run(multi, coordinator, parts, catalog, mode, client)).await,
            Plan::Fallback(rest) => Box::pin(run(rest, coordinator, catalog, parts, mode, client)).await,
            _ => unreachable!("compute_subqueries returns only these plans"),
        };
    }
    let sizes = candidate_sizes(plan, catalog, parts).await?;
    if let Some(broadcast) = broadcast_plan(plan, &sizes, catalog, parts).await? {
        tracing::debug!("fallback by broadcast: {}", plan.reason);
        return match &broadcast {
            Plan::Router(router) => super::router::run_router(router, parts, catalog, mode, client).await,
            Plan::MultiShard(multi) => Box::pin(super::multi_shard::run(multi, coordinator, parts, catalog, mode, client)).await,
            _ => unreachable!("broadcast_plan returns only pushdown plans"),
        };
    }
    if let Some(repartition) = super::repartition::plan(plan, &sizes, catalog, parts).await? {
        tracing::debug!("fallback by repartition: {}", plan.reason);
        return super::repartition::run(repartition, coordinator, catalog, parts, mode, client).await;
    }
    if let (true, NodeEnum::DeclareCursorStmt(declare)) = (parts.wrote_on_workers(), &plan.statement) {
        if declare_over_results(declare, plan.version, catalog, parts, mode, client).await? {
            return Ok(());
        }
    }
    let sql = super::block_reads::ready(&plan.read, coordinator, catalog, parts).await?;
    tracing::debug!("fallback: {}", plan.reason);
    run_on_coordinator_db(parts, sql, mode, client).await
}

/// A cursor over distributed tables in a block that has written on the
/// workers (Django's `.iterator()` inside `atomic()`) whose query a pushdown
/// tier takes: it computes the query's rows through the block's own
/// connections, which see its writes, and the cursor is declared in the
/// coordinator database over those rows, so FETCH, MOVE and CLOSE work
/// there as on any cursor. The rows are held by the coordinator database for
/// the cursor's life. False when no pushdown tier takes the query.
async fn declare_over_results(
    declare: &protobuf::DeclareCursorStmt,
    version: i32,
    catalog: &Catalog,
    parts: &mut Participants,
    mode: &Mode<'_>,
    client: &mut ClientConn,
) -> PgResult<bool> {
    let query = declare.query.as_deref().and_then(|q| q.node.clone()).ok_or_else(|| PgError::internal("DECLARE without a query"))?;
    let Some((fields, rows)) = query_rows(&plan_tree(version, query, catalog), catalog, parts, mode).await? else { return Ok(false) };
    let types = shard_type_names(parts, catalog, &fields).await?;
    let columns: Vec<String> = fields.iter().map(|f| quote_ident(&f.name)).collect();
    let relation = format!("(SELECT * FROM {} AS rows({}))", rows_as_relation(&types, &rows, parts.limits())?, columns.join(", "));
    // The rows can run to megabytes of SQL: they go into the deparsed
    // DECLARE as text rather than through the parser and back.
    const PLACEHOLDER: &str = "tessera_cursor_rows";
    let mut declare = declare.clone();
    let select = protobuf::SelectStmt { target_list: vec![res_target("", column_ref(&[PLACEHOLDER]))], ..plain_select() };
    declare.query = Some(Box::new(protobuf::Node { node: Some(NodeEnum::SelectStmt(Box::new(select))) }));
    let sql = deparse_statement(version, NodeEnum::DeclareCursorStmt(Box::new(declare)))?;
    let sql = sql.replacen(&format!("SELECT {PLACEHOLDER}"), &format!("SELECT * FROM {relation} AS {PLACEHOLDER}"), 1);
    run_on_coordinator_db(parts, &sql, &Mode::Simple, client).await?;
    Ok(true)
}

/// The rows of a router or multi-shard plan of a query, with their columns,
/// read through the session's connections (so that this transaction's own
/// writes are in); None for another plan, or for aggregates that cannot be
/// combined exactly.
async fn query_rows(
    plan: &Plan,
    catalog: &Catalog,
    parts: &mut Participants,
    mode: &Mode<'_>,
) -> PgResult<Option<(Vec<FieldDescription>, TextRows)>> {
    let by_node = match plan {
        Plan::Router(router) => {
            let mut by_node: TasksByNode = Vec::new();
            for task in plan_tasks(router, parts, mode, Defaults::default()).await? {
                add_task(&mut by_node, node_of_group(catalog, task.group)?, task.sql);
            }
            by_node
        }
        Plan::MultiShard(multi) => read_tasks_by_node(parts, &multi.template, &multi.anchor, catalog).await?,
        _ => return Ok(None),
    };
    let combine = match plan {
        Plan::MultiShard(multi) => multi.combine.query(),
        _ => None,
    };
    match combine {
        Some(combine) => combined_query_rows(parts, &by_node, combine, catalog, mode, usize::MAX).await,
        None => collect_rows(parts, &by_node, mode).await.map(Some),
    }
}

/// Runs the tasks and the coordinator database's `combine` over their
/// rows, and keeps its rows; None when more than `most_rows` rows came from
/// the tasks, or the combine cannot take their types exactly.
pub(super) async fn combined_query_rows(
    parts: &mut Participants,
    by_node: &TasksByNode,
    combine: &CombineQuery,
    catalog: &Catalog,
    mode: &Mode<'_>,
    most_rows: usize,
) -> PgResult<Option<(Vec<FieldDescription>, TextRows)>> {
    let (fields, rows) = collect_partials(parts, by_node, mode).await?;
    if rows.len() > most_rows {
        return Ok(None);
    }
    let types = shard_type_names(parts, catalog, &fields).await?;
    let Some(combine) = combine_sql(combine, &fields, &types)? else { return Ok(None) };
    let staged = partials::stage(parts, &types, rows).await?;
    let combined = match combine.read_from(&staged.relation, parts.limits()) {
        Ok(sql) => combined_rows(parts, &sql).await,
        Err(e) => Err(e),
    };
    partials::release(parts, staged, combined).await.map(Some)
}

/// Runs a combining statement on the coordinator database and keeps its rows.
pub(super) async fn combined_rows(parts: &mut Participants, sql: &str) -> PgResult<(Vec<FieldDescription>, TextRows)> {
    let limits = parts.limits().clone();
    let local = parts.local().await?;
    frontend::parse(local.out(), "", sql, &[]);
    frontend::bind(local.out(), "", "", &[], &[], &[]);
    frontend::describe(local.out(), frontend::Target::Portal, "");
    frontend::execute(local.out(), "", 0);
    frontend::sync(local.out());
    local.read_result(|row| limits.charge(text_row_size(row))).await
}

/// A statement whose uncorrelated subqueries over distributed tables were
/// computed first and written in as constants.
pub(super) struct ComputedSubqueries {
    /// How the statement runs now.
    pub plan: Plan,
    /// The subqueries computed, as SQL, with how each ran.
    pub subqueries: Vec<(String, Plan)>,
}

/// The most values an `IN (SELECT …)` is written into the statement with,
/// and the most text they take; a subquery giving more stays in place. The
/// statement goes to every task, whose node parses them: all the tasks'
/// copies together take at most `BROADCAST_MAX_BYTES_SHIPPED`.
const SUBQUERY_MAX_VALUES: usize = 100_000;
const SUBQUERY_MAX_BYTES: usize = 1 << 20;
/// How deep subqueries nested in subqueries are computed first.
const SUBQUERY_PASSES: usize = 3;
/// The most rows a WITH query or a subquery in FROM is written into the
/// statement with (as a VALUES list, in every task's statement); one giving
/// more stays, and the statement falls back.
const SHIPPED_ROWS_MAX: usize = 10_000;

/// Computes the statement's WITH queries and uncorrelated subqueries over
/// distributed tables (planner/uncorrelated_subqueries.rs) that a router
/// or multi-shard plan runs, each once, through the session's connections,
/// writes their results in as constants (a WITH query's or a subquery in
/// FROM's as its rows, a VALUES list), and plans the statement again; None
/// when it has none, or it then plans no better.
pub(super) async fn compute_subqueries(plan: &FallbackPlan, catalog: &Catalog, parts: &mut Participants) -> PgResult<Option<ComputedSubqueries>> {
    if !matches!(plan.statement, NodeEnum::SelectStmt(_)) {
        return Ok(None);
    }
    // Correlated aggregates become grouped subqueries in FROM, which may be
    // computed first like any other.
    let mut stmt = plan.statement.clone();
    decorrelate(&mut stmt, catalog);
    // So do EXISTS and NOT EXISTS, as sets of keys; a set too large to
    // write in leaves them as they were.
    // What the first attempt learnt of its subqueries serves the second.
    let mut known = KnownSubqueries::default();
    let mut with_key_sets = stmt.clone();
    if semi_joins(&mut with_key_sets, catalog) > 0 {
        if let Some(computed) = compute_in(plan, with_key_sets, catalog, parts, &mut known).await? {
            return Ok(Some(computed));
        }
    }
    compute_in(plan, stmt, catalog, parts, &mut known).await
}

/// Subqueries computed first, by their SQL: the constants they gave (with
/// the bytes of their text), and those left in place. The same subquery
/// written twice (a condition copied by `decorrelate` into the subquery it
/// narrows, or met again in a later pass or attempt) is computed once.
#[derive(Default)]
struct KnownSubqueries {
    constants: std::collections::HashMap<(String, SubqueryUse), (NodeEnum, usize)>,
    left_in_place: std::collections::HashSet<String>,
}

/// `compute_subqueries` of `stmt`, the statement with its correlated
/// subqueries rewritten; None also when a semi-join's set of keys was not
/// computed.
async fn compute_in(
    plan: &FallbackPlan,
    mut stmt: NodeEnum,
    catalog: &Catalog,
    parts: &mut Participants,
    known: &mut KnownSubqueries,
) -> PgResult<Option<ComputedSubqueries>> {
    let mut subqueries = Vec::new();
    let mut fills = Vec::new();
    let rows_help = uncorrelated_subqueries::reads_tables_beyond_its_rows(&stmt, catalog);
    while let Some(mut with_query) = uncorrelated_subqueries::next_with_query(&stmt, catalog).filter(|_| rows_help) {
        if !uncorrelated_subqueries::cap_rows(&mut with_query.select, SHIPPED_ROWS_MAX) {
            break;
        }
        let query = NodeEnum::SelectStmt(Box::new(with_query.select));
        let sql = deparse_statement(plan.version, query.clone())?;
        let sub_plan = plan_tree(plan.version, query, catalog);
        let Some((fields, rows)) = query_rows(&sub_plan, catalog, parts, &Mode::Simple).await? else { break };
        let Some(placeholder) = rows_to_ship(&fields, &rows, catalog, parts, &mut fills).await? else { break };
        let own_columns: Vec<String> = fields.iter().map(|f| f.name.clone()).collect();
        let mut failure = None;
        uncorrelated_subqueries::inline_with_query(&mut stmt, &with_query.name, |alias, columns| {
            // Names the reference gives win over the WITH query's, which win over its query's.
            let names = own_columns.iter().enumerate().map(|(i, own)| quote_ident(columns.get(i).or(with_query.columns.get(i)).unwrap_or(own)));
            let item = format!("{placeholder} AS {}({})", quote_ident(alias), names.collect::<Vec<_>>().join(", "));
            crate::planner::subselect_node(&item).map_err(|e| failure = Some(e)).ok()
        });
        if let Some(e) = failure {
            return Err(e);
        }
        subqueries.push((sql, sub_plan));
    }
    let mut constant_bytes = 0;
    // A subquery nested in another is computed first, and the other, then
    // free of subqueries, in the next pass.
    for _ in 0..SUBQUERY_PASSES {
        // A pass may have left a subquery in FROM free of subqueries, and
        // the statement with no table beyond it.
        let rows_help = uncorrelated_subqueries::reads_tables_beyond_its_rows(&stmt, catalog);
        let mut values = Vec::new();
        for Subquery { used_as, mut select } in uncorrelated_subqueries::subqueries(&stmt, catalog) {
            // Whether EXISTS has a row, whether a scalar one has a second, whether
            // IN has too many values: no more is read than tells.
            if used_as == SubqueryUse::Rows && !rows_help {
                values.push(None);
                continue;
            }
            let most = match used_as {
                SubqueryUse::Exists => 0,
                SubqueryUse::Scalar => 1,
                SubqueryUse::Any | SubqueryUse::All => SUBQUERY_MAX_VALUES,
                SubqueryUse::Rows => SHIPPED_ROWS_MAX,
            };
            if !uncorrelated_subqueries::cap_rows(&mut select, most) {
                values.push(None);
                continue;
            }
            if used_as == SubqueryUse::Exists && select.target_list.is_empty() {
                // The shards' plans want a column to send.
                let one = uncorrelated_subqueries::typed_constant(Some("1"), "int8")?;
                select.target_list = vec![res_target("", protobuf::Node { node: Some(one) })];
            }
            let stmt = NodeEnum::SelectStmt(Box::new(select));
            let sql = deparse_statement(plan.version, stmt.clone())?;
            if known.left_in_place.contains(&sql) {
                values.push(None);
                continue;
            }
            let sub_plan = plan_tree(plan.version, stmt, catalog);
            if let Some((constant, bytes)) = known.constants.get(&(sql.clone(), used_as)) {
                constant_bytes += bytes;
                values.push(Some(constant.clone()));
                if !subqueries.iter().any(|(listed, _)| *listed == sql) {
                    subqueries.push((sql, sub_plan));
                }
                continue;
            }
            let Some((fields, rows)) = query_rows(&sub_plan, catalog, parts, &Mode::Simple).await? else {
                known.left_in_place.insert(sql);
                values.push(None);
                continue;
            };
            let value = match used_as {
                SubqueryUse::Exists => Some(uncorrelated_subqueries::typed_constant(Some(if rows.is_empty() { "false" } else { "true" }), "bool")?),
                SubqueryUse::Rows => match rows_to_ship(&fields, &rows, catalog, parts, &mut fills).await? {
                    // `replace` gives the item the subquery's alias.
                    Some(placeholder) => {
                        let names: Vec<String> = fields.iter().map(|f| quote_ident(&f.name)).collect();
                        Some(crate::planner::subselect_node(&format!("{placeholder} AS tessera_rows({})", names.join(", ")))?)
                    }
                    None => None,
                },
                _ => subquery_constant(used_as, &sql, &fields, rows, catalog, parts).await?.map(|(constant, bytes)| {
                    constant_bytes += bytes;
                    known.constants.insert((sql.clone(), used_as), (constant.clone(), bytes));
                    constant
                }),
            };
            match value {
                Some(_) => subqueries.push((sql, sub_plan)),
                None => {
                    known.left_in_place.insert(sql);
                }
            }
            values.push(value);
        }
        if values.iter().all(Option::is_none) {
            break;
        }
        let mut values = values.into_iter();
        uncorrelated_subqueries::replace(&mut stmt, catalog, |_, _| values.next().flatten());
    }
    if subqueries.is_empty() {
        return Ok(None);
    }
    if has_semi_join(&stmt) {
        return Ok(None);
    }
    let mut plan = match plan_tree(plan.version, stmt, catalog) {
        plan @ (Plan::Router(_) | Plan::MultiShard(_) | Plan::Fallback(_)) => plan,
        _ => return Ok(None),
    };
    // The constants and the WITH queries' rows go to every task.
    let tasks = match &plan {
        Plan::MultiShard(multi) => multi.anchor.shard_count().max(1) as usize,
        _ => 1,
    };
    if constant_bytes * tasks > BROADCAST_MAX_BYTES_SHIPPED {
        return Ok(None);
    }
    if !fills.is_empty() {
        // A statement that still falls back runs as it came (its
        // placeholders cannot be filled).
        if !matches!(plan, Plan::MultiShard(_) | Plan::Router(_)) {
            return Ok(None);
        }
        let shipped_bytes = fills.iter().map(|(_, relation)| relation.len()).sum::<usize>() * tasks;
        if shipped_bytes > BROADCAST_MAX_BYTES_SHIPPED {
            return Ok(None);
        }
        parts.limits().charge(shipped_bytes)?;
        for (placeholder, relation) in fills {
            if !plan.fill_placeholder(&placeholder, Arc::from(relation)) {
                return Err(PgError::internal("a plan with WITH queries computed first is shared"));
            }
        }
    }
    Ok(Some(ComputedSubqueries { plan, subqueries }))
}

/// Readies `rows` (of a WITH query or a subquery in FROM) to go into every
/// task's statement: their VALUES list joins `fills`, under the placeholder
/// returned, which stands for them while the statement is planned. None
/// when there are too many, or of a type no literal can spell.
async fn rows_to_ship(
    fields: &[FieldDescription],
    rows: &TextRows,
    catalog: &Catalog,
    parts: &mut Participants,
    fills: &mut Vec<(String, String)>,
) -> PgResult<Option<String>> {
    if rows.len() > SHIPPED_ROWS_MAX {
        return Ok(None);
    }
    let types = match shard_type_names(parts, catalog, fields).await {
        Ok(types) => types,
        Err(e) if e.code() == sqlstate::FEATURE_NOT_SUPPORTED => return Ok(None),
        Err(e) => return Err(e),
    };
    let relation = rows_as_relation(&types, rows, parts.limits())?;
    let placeholder = rows_placeholder(&format!("tessera_rows_{}", fills.len()), fields.len());
    fills.push((placeholder.clone(), relation));
    Ok(Some(placeholder))
}

/// The constant standing for a scalar, ANY or ALL subquery that gave
/// `rows`: its value, or the array of its distinct values, with the bytes
/// of its text. None leaves the
/// subquery in place: a scalar one giving more than one row (an error only
/// if PostgreSQL evaluates it, not over no rows, say), too many values,
/// or values no literal can spell (an anonymous or a shard's row, arrays
/// of arrays).
async fn subquery_constant(
    used_as: SubqueryUse,
    sql: &str,
    fields: &[FieldDescription],
    rows: TextRows,
    catalog: &Catalog,
    parts: &mut Participants,
) -> PgResult<Option<(NodeEnum, usize)>> {
    if fields.len() != 1 {
        return Err(PgError::internal(format!("the subquery {sql} gave {} columns", fields.len())));
    }
    let scalar = used_as == SubqueryUse::Scalar;
    if (scalar && rows.len() > 1) || rows.len() > SUBQUERY_MAX_VALUES {
        return Ok(None);
    }
    let type_name = match shard_type_names(parts, catalog, fields).await {
        Ok(mut types) => types.remove(0),
        Err(e) if e.code() == sqlstate::FEATURE_NOT_SUPPORTED => return Ok(None),
        Err(e) => return Err(e),
    };
    let mut values: Vec<Option<String>> = rows.into_iter().map(|row| row.into_iter().next().flatten()).collect();
    if scalar {
        let value = values.first().and_then(|v| v.as_deref());
        return uncorrelated_subqueries::typed_constant(value, &type_name).map(|c| Some((c, value.map_or(0, str::len))));
    }
    if type_name.ends_with(']') {
        return Ok(None);
    }
    values.sort_unstable();
    values.dedup();
    let array = uncorrelated_subqueries::array_text(&values);
    if array.len() > SUBQUERY_MAX_BYTES {
        return Ok(None);
    }
    uncorrelated_subqueries::typed_constant(Some(&array), &format!("{type_name}[]")).map(|c| Some((c, array.len())))
}

/// A pushdown plan for the statement with some of its distributed tables
/// replaced by their rows, if that works and those tables are small. First
/// choice: ship only the tables outside the largest table's co-location
/// group; otherwise every table but the largest. The plan is made with a
/// placeholder for each shipped table, and the rows' text is written into
/// each task's statement in its place (`ShardTemplate::fill`).
pub(super) async fn broadcast_plan(plan: &FallbackPlan, sizes: &[i64], catalog: &Catalog, parts: &mut Participants) -> PgResult<Option<Plan>> {
    let candidates = &plan.broadcast_candidates;
    if candidates.is_empty() {
        return Ok(None);
    }
    // On a tie the table named first (usually the outer query's) stays.
    let largest = (0..sizes.len()).fold(0, |best, i| if sizes[i] > sizes[best] { i } else { best });
    let small = |i: usize| sizes[i] <= BROADCAST_LIMIT_BYTES;
    let outside_group: Vec<usize> = (0..candidates.len()).filter(|&i| candidates[i].colocation_id != candidates[largest].colocation_id).collect();
    let all_but_largest: Vec<usize> = (0..candidates.len()).filter(|&i| i != largest).collect();
    for shipped in [outside_group, all_but_largest] {
        if shipped.is_empty() || !shipped.iter().all(|&i| small(i)) {
            continue;
        }
        let tables: Vec<&Arc<DistributedTable>> = shipped.iter().map(|&i| &candidates[i]).collect();
        // Whether the pushdown tiers take the statement does not depend on
        // the rows: it is planned before any are read.
        let placeholders: Vec<String> = tables.iter().map(|t| rows_placeholder(&format!("tessera_broadcast_{}", t.oid), t.columns.len())).collect();
        let Some(mut pushdown) = replace_and_plan(plan, catalog, &tables, &placeholders)? else { continue };
        let tasks = match &pushdown {
            Plan::MultiShard(multi) => multi.anchor.shard_count().max(1) as usize,
            _ => 1,
        };
        let mut row_budget = BROADCAST_MAX_ROWS_SHIPPED / tasks;
        let mut relations = Vec::new();
        for table in &tables {
            let Some((relation, rows)) = table_as_relation(table, plan.version, catalog, parts, row_budget).await? else { return Ok(None) };
            row_budget -= rows;
            relations.push(relation);
        }
        let shipped_bytes = relations.iter().map(String::len).sum::<usize>() * tasks;
        let moves_less = shipped_bytes <= BROADCAST_ALWAYS_BYTES || i64::try_from(shipped_bytes).is_ok_and(|b| b <= sizes[largest]);
        if shipped_bytes > BROADCAST_MAX_BYTES_SHIPPED || !moves_less {
            return Ok(None);
        }
        // Every task's statement carries the rows.
        parts.limits().charge(shipped_bytes)?;
        for (placeholder, relation) in placeholders.iter().zip(relations) {
            if !pushdown.fill_placeholder(placeholder, Arc::from(relation)) {
                return Err(PgError::internal("a broadcast's pushdown plan is shared"));
            }
        }
        return Ok(Some(pushdown));
    }
    Ok(None)
}

/// The on-disk sizes of the statement's broadcast candidates (all shards,
/// TOAST included), read from the nodes once for the broadcast and the
/// repartition that may follow it; none without candidates.
pub(super) async fn candidate_sizes(plan: &FallbackPlan, catalog: &Catalog, parts: &mut Participants) -> PgResult<Vec<i64>> {
    if plan.broadcast_candidates.is_empty() {
        return Ok(Vec::new());
    }
    Ok(super::cluster_views::table_sizes(&plan.broadcast_candidates, catalog, parts).await?.iter().map(|s| s.table).collect())
}

/// Plans the statement with each of `tables` replaced by its relation; only
/// a router or multi-shard plan counts.
fn replace_and_plan(plan: &FallbackPlan, catalog: &Catalog, tables: &[&Arc<DistributedTable>], relations: &[String]) -> PgResult<Option<Plan>> {
    let mut stmt = plan.statement.clone();
    let mut failure = None;
    crate::planner::replace_tables(&mut stmt, catalog, |table, alias| {
        let i = tables.iter().position(|t| t.oid == table.oid)?;
        match crate::planner::subselect_node(&format!("{} AS {}", relations[i], alias_with_columns(alias, table))) {
            Ok(node) => Some(node),
            Err(e) => {
                failure = Some(e);
                None
            }
        }
    });
    if let Some(e) = failure {
        return Err(e);
    }
    Ok(match plan_tree(plan.version, stmt, catalog) {
        p @ (Plan::Router(_) | Plan::MultiShard(_)) => Some(p),
        _ => None,
    })
}

fn alias_with_columns(alias: &str, table: &DistributedTable) -> String {
    let columns: Vec<String> = table.columns.iter().map(|c| quote_ident(c)).collect();
    format!("{}({})", quote_ident(alias), columns.join(", "))
}

/// Every row of `table`, read through the session's connections (so this
/// transaction's own writes are in), as a VALUES list, with how many rows
/// it holds; None when it has more than `max_rows`.
async fn table_as_relation(
    table: &Arc<DistributedTable>,
    version: i32,
    catalog: &Catalog,
    parts: &mut Participants,
    max_rows: usize,
) -> PgResult<Option<(String, usize)>> {
    let columns: Vec<String> = table.columns.iter().map(|c| quote_ident(c)).collect();
    // Each shard stops one row past the budget: no more is read than needed to see it exceeded.
    let sql = format!("SELECT {} FROM {} LIMIT {}", columns.join(", "), table.qualified_name(), max_rows + 1);
    let template = ShardTemplate::for_own_query(version, &sql, table)?;
    let by_node = read_tasks_by_node(parts, &template, table, catalog).await?;
    let (fields, rows) = collect_rows(parts, &by_node, &Mode::Simple).await?;
    if rows.len() > max_rows {
        return Ok(None);
    }
    let types = shard_type_names(parts, catalog, &fields).await?;
    Ok(Some((rows_as_relation(&types, &rows, parts.limits())?, rows.len())))
}
