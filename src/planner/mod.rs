//! Turns SQL text into plans: plain data (enums that print and compare in tests)
//! saying which tier runs each statement and how. Planning needs only the parse
//! tree and a catalog snapshot, never I/O, so plans are cached by statement text.

pub mod approximate_distinct;
mod cluster_views;
mod copy;
mod cte_names;
mod ddl;
mod ddl_plan;
pub mod decorrelate;
mod delegation;
pub mod deparse;
mod distinct_sets;
mod dml;
mod explain;
pub mod expression_types;
mod fallback;
pub mod function_copy;
mod functions;
mod group_keys;
mod inline;
mod insert_select;
mod keys;
mod local_rows;
mod materialized_views;
mod merge;
mod multi_shard;
mod per_shard_subquery;
pub mod percentiles;
mod prepared;
pub mod rewrite;
mod router;
mod session_state;
mod shipped_columns;
pub mod table_conditions;
mod top_ranks;
pub mod uncorrelated_subqueries;
mod user_code;
mod views;
mod whole_rows;
pub mod worker_relations;
mod writing_with;
use crate::walk;

pub use cluster_views::{ClusterData, SIZE_FUNCTIONS};
pub use copy::{CopyPlan, KeyPosition};
pub use ddl::placement_groups;
pub use ddl_plan::{ChosenNames, DdlPlan, DropIndex, ForeignRetype, RelationChanges, RoleChange};
pub use delegation::Delegation;
pub use explain::ExplainPlan;
pub use fallback::{block_copy_name, CoordinatorRead, FallbackPlan};
pub use functions::{ClusterCall, ClusterFunction};
pub use insert_select::InsertSelectPlan;
pub use keys::{KeyRouting, KeyValue, ShardTarget};
pub use local_rows::LocalRowsPlan;
pub use materialized_views::LentShards;
pub use merge::MergePlan;
pub use multi_shard::{
    aggregate_placeholder, partial_column, sort_column, AggregateKind, Combine, CombineQuery, MultiShardPlan, PercentilePasses, SplitAggregate,
    PARTIALS_RELATION, VISIBLE_COLUMNS,
};
pub use prepared::{statement_with_arguments, SqlExecute, SqlPrepare};
pub use rewrite::CopiedCall;
pub use router::{Command, FilledValues, InsertKey, RouterPlan, SequenceFill};

use crate::error::{sqlstate, PgError, PgResult};
use crate::metadata::{Catalog, DistributedTable};
use pg_query::protobuf::{self, ObjectType, TransactionStmtKind};
use pg_query::NodeEnum;
use std::fmt;
use std::sync::Arc;

/// One statement of a query string and the plan that runs it.
#[derive(Debug)]
pub struct PlannedStatement {
    /// The statement's own text (a query string may hold several).
    pub sql: String,
    pub plan: Plan,
    /// The statement may change the session's settings (SET, RESET,
    /// DISCARD): those the coordinator acts on (`citus.*`), read only once
    /// otherwise, and those user code running on a worker must see.
    pub changes_settings: bool,
    /// The statement may change the role the session acts as (SET ROLE,
    /// SET SESSION AUTHORIZATION, RESET ALL, DISCARD ALL).
    pub changes_role: bool,
    /// It may change which user code reaches distributed tables.
    pub changes_user_code: bool,
    /// Settings no module defines that it sets (`app.tenant`).
    pub custom_settings: Vec<String>,
    /// It may change the settings the workers' connections follow
    /// (`connection::FOLLOWED_SETTINGS`).
    pub changes_followed_settings: bool,
    /// It may change where unqualified table names lead (search_path).
    pub changes_search_path: bool,
    /// It may create relations, which changes where unqualified names lead
    /// on a search_path other than `public` alone.
    pub changes_relations: bool,
    /// It may read or write relations, or run user code: planned under a
    /// catalog that misses a change, it could read a shell. Transaction
    /// control, SET, SHOW and the like do not.
    pub uses_relations: bool,
    /// Why it leaves state only the session's coordinator database backend
    /// holds (a temporary table, LISTEN, …), if it does.
    pub pins: Option<&'static str>,
}

impl PlannedStatement {
    /// A statement with no effect on the session's state (text the parser
    /// rejects, or none at all).
    fn plain(sql: &str, plan: Plan) -> Self {
        PlannedStatement {
            sql: sql.to_string(),
            plan,
            changes_settings: false,
            changes_role: false,
            changes_user_code: false,
            custom_settings: Vec::new(),
            changes_followed_settings: false,
            changes_search_path: false,
            changes_relations: false,
            uses_relations: false,
            pins: None,
        }
    }
}

#[derive(Debug)]
pub enum Plan {
    /// An empty query string.
    Empty,
    /// Touches no distributed table: the coordinator database runs it as is.
    Local,
    /// Runs like Local, once the executor has gathered from every node what it
    /// reads through `citus_stat_activity` or the size functions.
    LocalWithClusterData(ClusterData),
    /// Runs like Local, while the shells of the distributed tables it reads
    /// lend it their shards' rows (a materialized view's query).
    LocalOverShards(Arc<LentShards>),
    /// BEGIN, COMMIT, SAVEPOINT, …: managed by the coordinator across every node
    /// the transaction touches.
    Transaction(TransactionCommand),
    /// A cluster-management function such as create_distributed_table().
    ClusterFunction(ClusterCall),
    /// DDL that must reach the shell table and every shard.
    Ddl(Arc<DdlPlan>),
    /// Runs entirely on one shard group, or on reference-table placements.
    Router(Arc<RouterPlan>),
    /// A call of a distributed function, delegated to the node of its
    /// distribution argument's shard, or run as `otherwise` says.
    Delegated(Arc<Delegation>),
    /// Routed to one shard group when the key values that pin its tables
    /// (a `ShardTarget::SameKeys` router plan) fall in it, else run as
    /// `otherwise` says (the general fallback).
    KeysMeet(Arc<KeysMeet>),
    /// Runs on every shard group; the coordinator combines the results.
    MultiShard(Arc<MultiShardPlan>),
    /// Runs in the coordinator database over foreign tables on the shards.
    Fallback(Arc<FallbackPlan>),
    /// EXPLAIN of a statement over distributed tables.
    Explain(Arc<ExplainPlan>),
    /// INSERT … SELECT whose rows pass through the coordinator.
    InsertSelect(Arc<InsertSelectPlan>),
    /// MERGE whose source rows the coordinator sends to their shards.
    MergeThroughCoordinator(Arc<MergePlan>),
    /// A write to distributed tables reading local tables, planned again at
    /// run time with their rows in their place.
    WithLocalRows(Arc<LocalRowsPlan>),
    /// COPY FROM STDIN into, or TO STDOUT from, a distributed or reference table.
    Copy(Arc<CopyPlan>),
    /// SQL PREPARE of a statement over distributed tables.
    SqlPrepare(SqlPrepare),
    /// SQL EXECUTE (of any prepared statement: the session knows which are its own).
    SqlExecute(SqlExecute),
    /// SQL DEALLOCATE of one prepared statement, or of all (None).
    SqlDeallocate(Option<String>),
    /// Valid SQL the coordinator cannot run yet; refused rather than answered wrongly.
    Unsupported(PgError),
}

impl Plan {
    /// Whether the statement may write to shards of co-location group
    /// `colocation` (held back while such a shard group is cut over to
    /// another node). Plans whose tables are not at hand count as writing.
    pub fn may_write_colocation(&self, colocation: i32) -> bool {
        let anchored = |table: &Option<Arc<DistributedTable>>| table.as_ref().is_some_and(|t| t.colocation_id == colocation);
        match self {
            Plan::Empty
            | Plan::Local
            | Plan::LocalWithClusterData(_)
            | Plan::LocalOverShards(_)
            | Plan::Transaction(_)
            | Plan::Explain(_)
            | Plan::SqlPrepare(_)
            | Plan::SqlDeallocate(_)
            | Plan::Unsupported(_) => false,
            // A statement run whole on a worker may write any table there.
            Plan::Router(router) => router.command == Command::WholeOnWorker || router.is_write() && anchored(&router.anchor),
            Plan::MultiShard(multi) => multi.is_write() && multi.anchor.colocation_id == colocation,
            Plan::Copy(copy) => copy.from_client && copy.table.colocation_id == colocation,
            Plan::KeysMeet(meet) => meet.route.is_write() && anchored(&meet.route.anchor) || meet.otherwise.may_write_colocation(colocation),
            Plan::ClusterFunction(call) => call.function.changes_tables(),
            Plan::Delegated(_)
            | Plan::Fallback(_)
            | Plan::InsertSelect(_)
            | Plan::MergeThroughCoordinator(_)
            | Plan::WithLocalRows(_)
            | Plan::Ddl(_)
            | Plan::SqlExecute(_) => true,
        }
    }
}

impl Plan {
    /// Makes a router or multi-shard plan made just now (held nowhere else)
    /// carry `text` in every shard's statement where its tree holds
    /// `placeholder` (see `ShardTemplate::fill`); false for another plan.
    pub fn fill_placeholder(&mut self, placeholder: &str, text: Arc<str>) -> bool {
        let template = match self {
            Plan::Router(router) => Arc::get_mut(router).map(|router| &mut router.template),
            Plan::MultiShard(multi) => Arc::get_mut(multi).map(|multi| &mut multi.template),
            _ => None,
        };
        match template {
            Some(template) => {
                template.fill(placeholder.to_string(), text);
                true
            }
            None => false,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TransactionCommand {
    /// BEGIN or START TRANSACTION, with the text to replay on each node it reaches.
    Begin {
        sql: String,
    },
    Commit,
    Rollback,
    Savepoint(String),
    Release(String),
    RollbackTo(String),
}

#[derive(Debug)]
pub struct KeysMeet {
    pub route: Arc<RouterPlan>,
    pub otherwise: Plan,
}

impl fmt::Display for Plan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Plan::Empty => write!(f, "Empty"),
            Plan::Local => write!(f, "Local"),
            Plan::LocalWithClusterData(needs) => write!(f, "LocalWithClusterData({needs:?})"),
            Plan::LocalOverShards(lent) => write!(f, "LocalOverShards({}, lent by {:?})", lent.statement, lent.tables),
            Plan::Transaction(t) => write!(f, "Transaction({t:?})"),
            Plan::ClusterFunction(c) => write!(f, "ClusterFunction({:?})", c.function),
            Plan::Ddl(d) => write!(f, "Ddl({d})"),
            Plan::Router(r) => write!(f, "Router({r})"),
            Plan::Delegated(d) => write!(f, "Delegated({}, otherwise {})", d.call, d.otherwise),
            Plan::KeysMeet(k) => write!(f, "KeysMeet({}, otherwise {})", k.route, k.otherwise),
            Plan::MultiShard(m) => write!(f, "MultiShard({m})"),
            Plan::Fallback(fb) => write!(f, "Fallback({fb})"),
            Plan::Explain(e) => write!(f, "Explain({e})"),
            Plan::InsertSelect(i) => write!(f, "InsertSelect({i})"),
            Plan::MergeThroughCoordinator(m) => write!(f, "MergeThroughCoordinator({m})"),
            Plan::WithLocalRows(l) => write!(f, "WithLocalRows({l})"),
            Plan::Copy(c) => write!(f, "Copy({c})"),
            Plan::SqlPrepare(p) => write!(f, "SqlPrepare({})", p.name),
            Plan::SqlExecute(e) => write!(f, "SqlExecute({})", e.name),
            Plan::SqlDeallocate(name) => write!(f, "SqlDeallocate({})", name.as_deref().unwrap_or("ALL")),
            Plan::Unsupported(e) => write!(f, "Unsupported({})", e.message()),
        }
    }
}

/// Plans every statement of a query string. Text the parser rejects is planned as
/// Local, so that the coordinator database reports the syntax error exactly as
/// PostgreSQL would.
pub fn plan_query(sql: &str, catalog: &Catalog) -> Vec<PlannedStatement> {
    let parsed = match pg_query::parse(sql) {
        Ok(parsed) => parsed,
        Err(_) => return vec![PlannedStatement::plain(sql, Plan::Local)],
    };
    let version = parsed.protobuf.version;
    let stmts = parsed.protobuf.stmts;
    if stmts.is_empty() {
        return vec![PlannedStatement::plain(sql, Plan::Empty)];
    }
    stmts
        .into_iter()
        .map(|raw| {
            let text = statement_text(sql, &raw).to_string();
            let node = raw.stmt.as_ref().and_then(|n| n.node.as_ref());
            let changes_settings = node.is_some_and(session_state::changes_settings);
            let custom_settings = node.map(session_state::custom_settings).unwrap_or_default();
            let changes_followed_settings = node.is_some_and(session_state::changes_followed_settings);
            let changes_search_path = node.is_some_and(session_state::changes_search_path);
            let changes_relations = node.is_some_and(session_state::changes_relations);
            let uses_relations = node.is_some_and(|node| !session_state::uses_no_relation(node));
            let pins = node.and_then(session_state::pins);
            let changes_role = changes_role(&raw);
            let changes_user_code = changes_user_code(&raw);
            let plan = contain_panics(|| match plan_statement(version, raw, &text, catalog) {
                Plan::Local => cluster_views::needed(&text, catalog.has_tables()).map_or(Plan::Local, Plan::LocalWithClusterData),
                plan => plan,
            });
            PlannedStatement {
                sql: text,
                plan,
                changes_settings,
                changes_role,
                changes_user_code,
                custom_settings,
                changes_followed_settings,
                changes_search_path,
                changes_relations,
                uses_relations,
                pins,
            }
        })
        .collect()
}

/// Runs one statement's planning so that a bug in it (ours or the parser
/// library's) fails that statement with `XX000` instead of unwinding through
/// the session that asked.
fn contain_panics(plan: impl FnOnce() -> Plan) -> Plan {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(plan)).unwrap_or_else(|panic| {
        let why = panic_message(panic.as_ref());
        Plan::Unsupported(
            PgError::internal(format!("the coordinator failed to plan this statement: {why}"))
                .with_hint("This is a bug in Tessera; other statements and sessions are not affected. Please report the statement."),
        )
    })
}

/// The text a panic was raised with, when it has one.
pub fn panic_message(payload: &(dyn std::any::Any + Send)) -> &str {
    payload.downcast_ref::<&str>().copied().or_else(|| payload.downcast_ref::<String>().map(String::as_str)).unwrap_or("unknown cause")
}

fn changes_role(raw: &protobuf::RawStmt) -> bool {
    match raw.stmt.as_ref().and_then(|n| n.node.as_ref()) {
        Some(NodeEnum::VariableSetStmt(v)) => v.name.is_empty() || v.name == "role" || v.name == "session_authorization",
        Some(NodeEnum::DiscardStmt(_)) => true,
        _ => false,
    }
}

/// Whether the statement may change which views, functions or triggers
/// reach distributed tables (metadata/user_code.rs): the session's next
/// statement must be planned knowing it.
fn changes_user_code(raw: &protobuf::RawStmt) -> bool {
    let reaches = |kind: i32| {
        use ObjectType as O;
        O::from_i32(kind).is_some_and(|t| {
            matches!(
                t,
                O::ObjectView | O::ObjectMatview | O::ObjectFunction | O::ObjectProcedure | O::ObjectRoutine | O::ObjectTrigger | O::ObjectAggregate
            )
        })
    };
    match raw.stmt.as_ref().and_then(|n| n.node.as_ref()) {
        Some(
            NodeEnum::ViewStmt(_)
            | NodeEnum::CreateFunctionStmt(_)
            | NodeEnum::AlterFunctionStmt(_)
            | NodeEnum::CreateTrigStmt(_)
            | NodeEnum::DefineStmt(_),
        ) => true,
        Some(NodeEnum::CreateTableAsStmt(c)) => c.objtype == ObjectType::ObjectMatview as i32,
        Some(NodeEnum::DropStmt(d)) => reaches(d.remove_type),
        Some(NodeEnum::RenameStmt(r)) => reaches(r.rename_type),
        Some(NodeEnum::AlterObjectSchemaStmt(a)) => reaches(a.object_type),
        // Which calls are delegated, or which tables are co-located, changes
        // with these catalog functions of the coordinator database.
        Some(node @ NodeEnum::SelectStmt(_)) => {
            crate::walk::called_functions(node).iter().any(|f| f == "create_distributed_function" || f == "update_distributed_table_colocation")
        }
        _ => false,
    }
}

fn statement_text<'a>(sql: &'a str, raw: &protobuf::RawStmt) -> &'a str {
    let start = (raw.stmt_location.max(0) as usize).min(sql.len());
    let end = if raw.stmt_len <= 0 { sql.len() } else { (start + raw.stmt_len as usize).min(sql.len()) };
    sql.get(start..end).unwrap_or(sql).trim()
}

fn plan_statement(version: i32, raw: protobuf::RawStmt, text: &str, catalog: &Catalog) -> Plan {
    let Some(node) = raw.stmt.as_ref().and_then(|n| n.node.as_ref()) else {
        return Plan::Empty;
    };
    if let NodeEnum::TransactionStmt(t) = node {
        return plan_transaction(t, text);
    }
    if let Some(plan) = ddl::plan_cluster_wide(version, node, catalog) {
        return plan;
    }
    let cluster_call = match node {
        NodeEnum::SelectStmt(select) => functions::cluster_call(select),
        NodeEnum::CallStmt(call) => functions::cluster_procedure_call(call),
        _ => None,
    };
    if let Some(call) = cluster_call {
        return call;
    }
    let delegated = delegation::delegated_call(version, &raw, node, catalog);
    let plan = plan_undelegated(version, &raw, node, text, catalog);
    match delegated {
        Some((call, copy, force_delegation)) => {
            Plan::Delegated(Arc::new(Delegation { call, copy, copy_failed: Default::default(), force_delegation, otherwise: plan }))
        }
        None => plan,
    }
}

fn plan_undelegated(version: i32, raw: &protobuf::RawStmt, node: &NodeEnum, text: &str, catalog: &Catalog) -> Plan {
    if !catalog.has_tables() {
        return Plan::Local;
    }
    // Statements rewritten for views and SQL functions are planned again.
    let replan = |rewritten: Result<NodeEnum, Plan>| rewritten.map_or_else(|refusal| refusal, |stmt| plan_tree(version, stmt, catalog));
    if let Some(plan) = views::write_through(node, catalog).map(replan) {
        return plan;
    }
    if let Some(plan) = inline::sql_functions(node, text, catalog).map(replan) {
        // Inlined calls are planned as any query is; where that query would
        // need the fallback tier, or cannot be run, the call runs on a worker.
        if !matches!(plan, Plan::Fallback(_) | Plan::Unsupported(_)) {
            return plan;
        }
        return user_code::on_worker(version, raw, node, text, catalog).unwrap_or(plan);
    }
    if let Some(plan) = materialized_views::plan(node, catalog) {
        return plan;
    }
    if let Some(refusal) = user_code::refusal(node, catalog) {
        return refusal;
    }
    if let Some(plan) = views::expand(node, catalog).map(replan) {
        return plan;
    }
    let rewritten = cte_names::rename_hiding(node, catalog)
        .or_else(|| group_keys::expand(node, catalog))
        .or_else(|| insert_select::with_moved_into_rows(node, catalog))
        .or_else(|| whole_rows::spell_out(node, catalog));
    if let Some(stmt) = rewritten {
        return plan_tree(version, stmt, catalog);
    }
    if let Some(plan) = user_code::on_worker(version, raw, node, text, catalog) {
        return plan;
    }
    let plan = match node {
        NodeEnum::ExplainStmt(e) => explain::plan(version, e, text, catalog),
        // A cursor lives in the coordinator database, over the fallback's
        // stand-ins, so FETCH and CLOSE pass through as they are.
        NodeEnum::DeclareCursorStmt(_) if !referenced_tables(raw, catalog).is_empty() => Some(
            fallback::plan(version, node, catalog, "a cursor over distributed tables")
                .unwrap_or_else(|| not_supported("this cursor over distributed tables is not supported")),
        ),
        NodeEnum::CopyStmt(c) => copy::plan(version, c, text, catalog),
        NodeEnum::PrepareStmt(p) => prepared::plan_prepare(version, p, catalog),
        NodeEnum::ExecuteStmt(e) => Some(prepared::plan_execute(e)),
        NodeEnum::DeallocateStmt(d) => Some(Plan::SqlDeallocate((!d.name.is_empty()).then(|| d.name.clone()))),
        NodeEnum::SelectStmt(_) | NodeEnum::InsertStmt(_) | NodeEnum::UpdateStmt(_) | NodeEnum::DeleteStmt(_) | NodeEnum::MergeStmt(_) => {
            dml::plan_dml(version, raw, catalog)
        }
        _ => ddl::plan_utility(version, raw, catalog),
    };
    match plan {
        Some(Plan::Unsupported(refusal)) => fallback::plan(version, node, catalog, refusal.message())
            .or_else(|| local_rows::plan(version, node, catalog))
            .or_else(|| writing_with::on_worker(version, raw, node, catalog))
            .unwrap_or(Plan::Unsupported(refusal)),
        Some(Plan::Router(route)) if matches!(route.target, ShardTarget::SameKeys(_)) => {
            let why = "its tables are pinned to key values in different shard groups";
            let otherwise = fallback::plan(version, node, catalog, why)
                .unwrap_or_else(|| not_supported(format!("this query is supported only when {why} agree")));
            Plan::KeysMeet(Arc::new(KeysMeet { route, otherwise }))
        }
        Some(plan) => plan,
        None => refuse_unseen_references(node, text, catalog),
    }
}

/// Plans a statement the executor rewrote (its parse tree, no text of its own).
pub fn plan_tree(version: i32, stmt: NodeEnum, catalog: &Catalog) -> Plan {
    let raw = protobuf::RawStmt { stmt: Some(Box::new(protobuf::Node { node: Some(stmt) })), stmt_location: 0, stmt_len: 0 };
    plan_statement(version, raw, "", catalog)
}

/// Replaces each reference to a distributed table for which `replacement`
/// gives a FROM item (called with the table and the name the query knows it
/// by) with that item.
pub fn replace_tables(stmt: &mut NodeEnum, catalog: &Catalog, mut replacement: impl FnMut(&DistributedTable, &str) -> Option<NodeEnum>) {
    // TABLESAMPLE takes only a table, never a subquery: sampled tables stay.
    let mut sampled: Vec<protobuf::RangeVar> = Vec::new();
    walk::visit_mut(stmt, &mut |n| {
        if let NodeEnum::RangeTableSample(sample) = n {
            if let Some(NodeEnum::RangeVar(rv)) = sample.relation.as_deref().and_then(|r| r.node.as_ref()) {
                sampled.push(rv.clone());
            }
        }
    });
    walk::visit_mut(stmt, &mut |n| {
        let NodeEnum::RangeVar(rv) = n else { return };
        if sampled.contains(rv) {
            return;
        }
        let Some(table) = resolve_range_var(rv, catalog) else { return };
        let alias = match &rv.alias {
            Some(a) if !a.colnames.is_empty() => return,
            Some(a) => a.aliasname.clone(),
            None => rv.relname.clone(),
        };
        if let Some(item) = replacement(table, &alias) {
            *n = item;
        }
    });
}

/// The FROM item `sql` (a subquery with its alias), as a parse-tree node.
pub fn subselect_node(sql: &str) -> PgResult<NodeEnum> {
    let parsed = pg_query::parse(&format!("SELECT * FROM {sql}")).map_err(|e| PgError::internal(format!("could not parse a FROM item: {e}")))?;
    let stmt = parsed.protobuf.stmts.into_iter().next().and_then(|s| s.stmt).and_then(|n| n.node);
    match stmt {
        Some(NodeEnum::SelectStmt(s)) => s.from_clause.into_iter().next().and_then(|n| n.node).ok_or_else(|| PgError::internal("FROM item missing")),
        _ => Err(PgError::internal("FROM item did not parse as a SELECT")),
    }
}

/// The SELECT `sql` (text Tessera writes itself), as a parse tree.
pub(crate) fn parsed_select(sql: &str) -> Option<protobuf::SelectStmt> {
    match pg_query::parse(sql).ok()?.protobuf.stmts.into_iter().next()?.stmt?.node? {
        NodeEnum::SelectStmt(s) => Some(*s),
        _ => None,
    }
}

/// The SELECT `sql` with `inner` as the subquery of its FROM item
/// `(SELECT) AS alias`, where it reads `inner`'s rows.
pub(crate) fn around(sql: &str, alias: &str, inner: &protobuf::SelectStmt) -> Option<protobuf::SelectStmt> {
    let mut outer = NodeEnum::SelectStmt(Box::new(parsed_select(sql)?));
    let mut placed = false;
    walk::visit_mut(&mut outer, &mut |n| {
        if let NodeEnum::RangeSubselect(sub) = n {
            if sub.alias.as_ref().is_some_and(|a| a.aliasname == alias) {
                sub.subquery = Some(Box::new(protobuf::Node { node: Some(NodeEnum::SelectStmt(Box::new(inner.clone()))) }));
                placed = true;
            }
        }
    });
    match outer {
        NodeEnum::SelectStmt(s) if placed => Some(*s),
        _ => None,
    }
}

fn plan_transaction(t: &protobuf::TransactionStmt, text: &str) -> Plan {
    use TransactionStmtKind::*;
    let command = match TransactionStmtKind::from_i32(t.kind) {
        Some(TransStmtBegin | TransStmtStart) => TransactionCommand::Begin { sql: text.to_string() },
        Some(TransStmtCommit) if !t.chain => TransactionCommand::Commit,
        Some(TransStmtRollback) if !t.chain => TransactionCommand::Rollback,
        Some(TransStmtSavepoint) => TransactionCommand::Savepoint(t.savepoint_name.clone()),
        Some(TransStmtRelease) => TransactionCommand::Release(t.savepoint_name.clone()),
        Some(TransStmtRollbackTo) => TransactionCommand::RollbackTo(t.savepoint_name.clone()),
        _ => return Plan::Unsupported(PgError::not_supported(format!("\"{text}\" is not supported through the Tessera coordinator"))),
    };
    Plan::Transaction(command)
}

/// The last line of defence for statements planned as Local: if one names a
/// distributed table anywhere (in a view definition, a subquery of a utility
/// statement, …), running it on the empty shell table could give wrong answers,
/// so it is refused instead.
fn refuse_unseen_references(node: &NodeEnum, text: &str, catalog: &Catalog) -> Plan {
    // Our own walk finds all of a query's relations, so only those count: a word
    // that matches a table's name elsewhere is an alias or a column (`FROM
    // pg_range r`). An unqualified relation named like a distributed table
    // that did not resolve to it is refused unless the session's search_path
    // was read (see `Catalog::names_unqualified`). FETCH, MOVE and CLOSE name
    // only a cursor, which may share a table's name.
    if matches!(node, NodeEnum::SelectStmt(_) | NodeEnum::InsertStmt(_) | NodeEnum::UpdateStmt(_) | NodeEnum::DeleteStmt(_)) {
        return match walk::range_vars(node).into_iter().find(|rv| rv.schemaname.is_empty() && catalog.may_name_distributed(&rv.relname)) {
            Some(rv) => Plan::Unsupported(PgError::not_supported(format!(
                "this statement uses the distributed table \"{}\" in a way Tessera does not support yet",
                rv.relname
            ))),
            None => Plan::Local,
        };
    }
    if matches!(
        node,
        NodeEnum::CommentStmt(_)
            | NodeEnum::VariableSetStmt(_)
            | NodeEnum::VariableShowStmt(_)
            | NodeEnum::FetchStmt(_)
            | NodeEnum::ClosePortalStmt(_)
    ) {
        return Plan::Local;
    }
    let Ok(scan) = pg_query::scan(text) else { return Plan::Local };
    // So does a DECLARE, before its query, and CREATE TABLE AS its table.
    let mut own_name = match node {
        NodeEnum::DeclareCursorStmt(d) => Some(d.portalname.as_str()),
        NodeEnum::CreateTableAsStmt(c) => c.into.as_ref().and_then(|into| into.rel.as_ref()).map(|rv| rv.relname.as_str()),
        _ => None,
    };
    // The two words before the current one, to tell `schema.name`.
    let mut before: [Option<String>; 2] = [None, None];
    for token in &scan.tokens {
        let Some(word) = text.get(token.start as usize..token.end as usize) else { continue };
        let name = match word.strip_prefix('"').and_then(|w| w.strip_suffix('"')) {
            Some(quoted) => quoted.replace("\"\"", "\""),
            None if word.starts_with(|c: char| c.is_alphabetic() || c == '_') => word.to_lowercase(),
            None => word.to_string(),
        };
        let schema = match &before {
            [Some(schema), Some(dot)] if dot == "." => Some(schema.clone()),
            _ => None,
        };
        before = [before[1].take(), Some(name.clone())];
        if !word.starts_with(|c: char| c.is_alphabetic() || c == '_' || c == '"') {
            continue;
        }
        if own_name == Some(name.as_str()) {
            own_name = None;
            continue;
        }
        let names_distributed = match &schema {
            Some(schema) => catalog.table(schema, &name).is_some(),
            None => catalog.may_name_distributed(&name),
        };
        if names_distributed {
            return Plan::Unsupported(PgError::not_supported(format!(
                "this statement uses the distributed table \"{name}\" in a way Tessera does not support yet"
            )));
        }
        // A materialized view or CREATE TABLE AS would read a view of them
        // in the coordinator database, over the shells.
        if matches!(node, NodeEnum::CreateTableAsStmt(_)) && catalog.user_code.is_view_name(&name) {
            return Plan::Unsupported(PgError::not_supported(format!(
                "this statement would read the view \"{name}\" in the coordinator database, which holds only empty shells of the distributed tables it reads"
            )));
        }
    }
    Plan::Local
}

/// A table reference found in a statement, resolved against the catalog.
pub(crate) fn resolve_range_var<'c>(rv: &protobuf::RangeVar, catalog: &'c Catalog) -> Option<&'c Arc<DistributedTable>> {
    catalog.resolve(schema_of(rv), &rv.relname)
}

/// The schema a table reference names, if it names one.
pub(crate) fn schema_of(rv: &protobuf::RangeVar) -> Option<&str> {
    (!rv.schemaname.is_empty()).then_some(rv.schemaname.as_str())
}

/// Every distributed or reference table the statement mentions, wherever it is.
pub(crate) fn referenced_tables(raw: &protobuf::RawStmt, catalog: &Catalog) -> Vec<Arc<DistributedTable>> {
    match raw.stmt.as_ref().and_then(|n| n.node.as_ref()) {
        Some(node) => distributed_among(&walk::range_vars(node), catalog),
        None => Vec::new(),
    }
}

/// The distributed tables among `range_vars`, each once, in order of mention.
pub(crate) fn distributed_among(range_vars: &[protobuf::RangeVar], catalog: &Catalog) -> Vec<Arc<DistributedTable>> {
    let mut out: Vec<Arc<DistributedTable>> = Vec::new();
    for rv in range_vars {
        if let Some(t) = resolve_range_var(rv, catalog) {
            if !out.iter().any(|o| o.oid == t.oid) {
                out.push(t.clone());
            }
        }
    }
    out
}

/// A SELECT with every enum field set (the deparser rejects unset ones).
pub(crate) fn plain_select() -> protobuf::SelectStmt {
    protobuf::SelectStmt { op: protobuf::SetOperation::SetopNone as i32, limit_option: protobuf::LimitOption::Default as i32, ..Default::default() }
}

/// Whether a SELECT only reads a FROM list, filters its rows and computes
/// its columns: no set operation, DISTINCT, grouping, window, ordering,
/// limit, row lock, WITH, VALUES or INTO.
pub(crate) fn only_filters(query: &protobuf::SelectStmt) -> bool {
    filters_and_groups_only(query) && query.group_clause.is_empty() && query.having_clause.is_none() && query.window_clause.is_empty()
}

/// `only_filters`, but grouping (GROUP BY, HAVING) and windows allowed.
pub(crate) fn filters_and_groups_only(query: &protobuf::SelectStmt) -> bool {
    query.op == protobuf::SetOperation::SetopNone as i32
        && query.distinct_clause.is_empty()
        && query.sort_clause.is_empty()
        && query.limit_count.is_none()
        && query.limit_offset.is_none()
        && query.locking_clause.is_empty()
        && query.with_clause.is_none()
        && query.values_lists.is_empty()
        && query.into_clause.is_none()
        && !query.from_clause.is_empty()
}

/// Whether a SELECT holds another query anywhere (a subquery, a derived table).
pub(crate) fn has_nested_query(query: &protobuf::SelectStmt) -> bool {
    let mut copy = NodeEnum::SelectStmt(Box::new(query.clone()));
    let mut selects = 0;
    walk::visit_mut(&mut copy, &mut |n| {
        selects += usize::from(matches!(n, NodeEnum::SelectStmt(_) | NodeEnum::SubLink(_) | NodeEnum::RangeSubselect(_) | NodeEnum::RangeFunction(_)))
    });
    selects > 1
}

/// A target-list entry `val AS name` (no alias when `name` is empty).
pub(crate) fn res_target(name: &str, val: protobuf::Node) -> protobuf::Node {
    protobuf::Node {
        node: Some(NodeEnum::ResTarget(Box::new(protobuf::ResTarget {
            name: name.to_string(),
            indirection: vec![],
            val: Some(Box::new(val)),
            location: -1,
        }))),
    }
}

/// A function call's name as written, schema first when one is given.
pub(crate) fn function_names(call: &protobuf::FuncCall) -> Vec<&str> {
    qualified_name(&call.funcname)
}

/// A qualified name's parts (`app.f` → ["app", "f"]).
pub(crate) fn qualified_name(parts: &[protobuf::Node]) -> Vec<&str> {
    parts
        .iter()
        .filter_map(|n| match n.node.as_ref() {
            Some(NodeEnum::String(s)) => Some(s.sval.as_str()),
            _ => None,
        })
        .collect()
}

/// `value::pg_catalog.type_name`.
pub(crate) fn cast_to_catalog_type(value: protobuf::Node, type_name: &str) -> protobuf::Node {
    let type_name =
        protobuf::TypeName { names: vec![string_node("pg_catalog"), string_node(type_name)], typemod: -1, location: -1, ..Default::default() };
    protobuf::Node {
        node: Some(NodeEnum::TypeCast(Box::new(protobuf::TypeCast { arg: Some(Box::new(value)), type_name: Some(type_name), location: -1 }))),
    }
}

/// Whether an operator's name is PostgreSQL's `=` (`a = b`, `OPERATOR(pg_catalog.=)`).
pub(crate) fn is_equals(name: &[protobuf::Node]) -> bool {
    matches!(qualified_name(name).as_slice(), ["="] | ["pg_catalog", "="])
}

/// The two sides of `condition` when it is an `=` comparison.
pub(crate) fn equality(condition: &protobuf::Node) -> Option<(&protobuf::Node, &protobuf::Node)> {
    match condition.node.as_ref()? {
        NodeEnum::AExpr(e) if e.kind == protobuf::AExprKind::AexprOp as i32 && is_equals(&e.name) => Some((e.lexpr.as_deref()?, e.rexpr.as_deref()?)),
        _ => None,
    }
}

/// Calls of functions that are immutable whatever their arguments' types
/// (as `pg_catalog` defines them), in their plain form.
pub(crate) fn is_immutable_text_or_number_function(call: &protobuf::FuncCall) -> bool {
    let name = match function_names(call).as_slice() {
        [name] | ["pg_catalog", name] => *name,
        _ => return false,
    };
    let plain = !call.agg_star && call.agg_filter.is_none() && call.agg_order.is_empty() && call.over.is_none() && !call.func_variadic;
    plain
        && matches!(
            name,
            "substring" | "substr" | "lower" | "upper" | "btrim" | "ltrim" | "rtrim" | "length" | "char_length" | "left" | "right" | "abs"
        )
}

/// The conjunction of `conditions` (the one condition when there is one).
pub(crate) fn conjunction(mut conditions: Vec<protobuf::Node>) -> protobuf::Node {
    if conditions.len() == 1 {
        return conditions.remove(0);
    }
    let and = protobuf::BoolExpr { xpr: None, boolop: protobuf::BoolExprType::AndExpr as i32, args: conditions, location: -1 };
    protobuf::Node { node: Some(NodeEnum::BoolExpr(Box::new(and))) }
}

/// A column reference node for `a.b.c`.
pub(crate) fn column_ref(names: &[&str]) -> protobuf::Node {
    protobuf::Node { node: Some(NodeEnum::ColumnRef(protobuf::ColumnRef { fields: names.iter().map(|n| string_node(n)).collect(), location: -1 })) }
}

pub(crate) fn string_node(s: &str) -> protobuf::Node {
    protobuf::Node { node: Some(NodeEnum::String(protobuf::String { sval: s.to_string() })) }
}

/// The names of a column reference (`t.c` → ["t", "c"]); None for `t.*`.
pub(crate) fn column_ref_names(c: &protobuf::ColumnRef) -> Option<Vec<&str>> {
    c.fields
        .iter()
        .map(|f| match f.node.as_ref() {
            Some(NodeEnum::String(s)) => Some(s.sval.as_str()),
            _ => None,
        })
        .collect()
}

/// Counts the references to distributed (hash) tables.
pub(crate) fn count_hash_references(node: &NodeEnum, catalog: &Catalog) -> usize {
    walk::range_vars(node).iter().filter(|rv| resolve_range_var(rv, catalog).is_some_and(|t| !t.is_reference())).count()
}

pub(crate) fn not_supported(message: impl Into<String>) -> Plan {
    Plan::Unsupported(PgError::new(sqlstate::FEATURE_NOT_SUPPORTED, message))
}

#[cfg(test)]
mod tests;
