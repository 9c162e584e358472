//! INSERT … SELECT into a distributed table. When the SELECT reads tables
//! co-located with the target and produces the target's distribution column
//! from their distribution column, every row stays in its shard group: the
//! statement runs per shard group. Otherwise the coordinator reads the
//! SELECT's rows (from local tables directly, from distributed ones through
//! the general fallback) and routes them as a multi-row INSERT.

use super::rewrite::ShardTemplate;
use super::{deparse, fallback, not_supported, plan_tree, res_target, resolve_range_var, Combine, Command, MultiShardPlan, Plan};
use crate::error::{PgError, PgResult};
use crate::metadata::{Catalog, DistributedTable, Distribution};
use pg_query::protobuf::{self, InsertStmt, SelectStmt};
use pg_query::NodeEnum;
use std::fmt;
use std::sync::Arc;

/// An INSERT … SELECT whose rows pass through the coordinator.
#[derive(Debug)]
pub struct InsertSelectPlan {
    pub target: Arc<DistributedTable>,
    /// What the coordinator database runs for the rows (see `RowSource`):
    /// the SELECT, or the INSERT into the shell with `RETURNING *`. Its effect
    /// is rolled back.
    pub rows: fallback::CoordinatorRead,
    /// For rows from the SELECT: the INSERT into the shell, which the
    /// coordinator database parses (never runs) to raise PostgreSQL's type
    /// errors.
    pub check_sql: Option<String>,
    /// For rows from the SELECT, the statement's column list (empty: the
    /// table's columns, as many as the SELECT gives); None for rows from the
    /// shell, whose columns are the table's.
    pub columns: Option<Vec<String>>,
    /// The statement's ON CONFLICT and RETURNING clauses, which the INSERTs
    /// routing the rows to the shards end with.
    pub shard_clauses: String,
    /// RETURNING: the shards' rows go to the client.
    pub returns_rows: bool,
}

impl fmt::Display for InsertSelectPlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "into {} through the coordinator", self.target.qualified_name())
    }
}

pub(super) fn plan(insert: &InsertStmt, select: &SelectStmt, target: Arc<DistributedTable>, template: ShardTemplate, catalog: &Catalog) -> Plan {
    let version = template.version();
    let source = plan_tree(version, NodeEnum::SelectStmt(Box::new(select.clone())), catalog);
    let stays_in_shard_group = match (&target.distribution, &source) {
        (Distribution::Reference, Plan::Router(r)) => r.template.tables().iter().all(|t| t.is_reference()),
        (Distribution::Hash { column, .. }, Plan::MultiShard(m)) => {
            matches!(m.combine, Combine::Concatenate)
                && m.anchor.colocation_id == target.colocation_id
                && produces_key(insert, select, column, &target, catalog)
        }
        (Distribution::Hash { column, .. }, Plan::Router(r)) => {
            r.anchor.as_ref().is_some_and(|a| a.colocation_id == target.colocation_id) && produces_key(insert, select, column, &target, catalog)
        }
        _ => false,
    };
    if stays_in_shard_group && !leaves_sequence_to_default(insert, &target, |position| select.target_list.get(position).is_some()) {
        return match &target.distribution {
            Distribution::Reference => super::router::reference_write(Command::Insert, template),
            Distribution::Hash { .. } => {
                Plan::MultiShard(Arc::new(MultiShardPlan { command: Command::Insert, anchor: target, template, combine: Combine::Concatenate }))
            }
        };
    }
    // The SELECT's own rows are routed, and the router fills in sequence
    // defaults as for any INSERT; only GENERATED ALWAYS identity columns need
    // PostgreSQL's rules, which the shell applies.
    let mut rows_select = select.clone();
    let rows = if target.always_identity.is_empty() && yields_key_type(insert, &mut rows_select, &target) {
        // PostgreSQL's own checks of the INSERT's types, without running it.
        let shell = InsertStmt { with_clause: None, returning_list: vec![], on_conflict_clause: None, ..insert.clone() };
        match deparse::deparse_statement(version, NodeEnum::InsertStmt(Box::new(shell))) {
            Ok(check) => RowSource::Select { check },
            Err(e) => return Plan::Unsupported(e),
        }
    } else {
        rows_select = select.clone();
        RowSource::Shell
    };
    through_coordinator(insert, Some(NodeEnum::SelectStmt(Box::new(rows_select))), rows, target, catalog, version)
}

/// `WITH q AS (…) INSERT INTO t SELECT … FROM q` with the WITH clause moved
/// into the SELECT, where the tiers that plan an INSERT's rows see it: the
/// same statement when no WITH query writes (those, which must run once
/// and before the INSERT, are left to `writing_with`). A WITH clause that
/// VALUES rows do not read is dropped, as PostgreSQL never runs an unread
/// one that does not write. None for any other statement, and when the
/// SELECT has a WITH clause of its own.
pub(super) fn with_moved_into_rows(node: &NodeEnum, catalog: &Catalog) -> Option<NodeEnum> {
    let NodeEnum::InsertStmt(insert) = node else { return None };
    let with = insert.with_clause.as_ref()?;
    insert.relation.as_ref().and_then(|r| resolve_range_var(r, catalog))?;
    let writes = |cte: &protobuf::Node| match cte.node.as_ref() {
        Some(NodeEnum::CommonTableExpr(c)) => !matches!(c.ctequery.as_deref().and_then(|q| q.node.as_ref()), Some(NodeEnum::SelectStmt(_))),
        _ => true,
    };
    if with.ctes.iter().any(writes) {
        return None;
    }
    let mut moved = (**insert).clone();
    let with = moved.with_clause.take()?;
    let Some(NodeEnum::SelectStmt(select)) = moved.select_stmt.as_deref_mut().and_then(|s| s.node.as_mut()) else { return None };
    if select.with_clause.is_some() {
        return None;
    }
    let names: Vec<&str> = with
        .ctes
        .iter()
        .filter_map(|c| match c.node.as_ref() {
            Some(NodeEnum::CommonTableExpr(c)) => Some(c.ctename.as_str()),
            _ => None,
        })
        .collect();
    let values_only = !select.values_lists.is_empty() && select.from_clause.is_empty();
    let read = crate::walk::range_vars(&NodeEnum::SelectStmt(select.clone()))
        .iter()
        .any(|rv| rv.schemaname.is_empty() && names.contains(&rv.relname.as_str()));
    if !values_only || read {
        select.with_clause = Some(with);
    }
    Some(NodeEnum::InsertStmt(Box::new(moved)))
}

/// Makes the SELECT give the distribution column's value in the column's own
/// type, so the router can hash it (`(expr)::int8`; the INSERT's own type
/// check, which is stricter, runs in the coordinator database first). False
/// when the column's value cannot be told apart (`SELECT *`, VALUES, set
/// operations).
fn yields_key_type(insert: &InsertStmt, select: &mut SelectStmt, target: &DistributedTable) -> bool {
    let Distribution::Hash { column, key, .. } = &target.distribution else { return true };
    let Some(position) = insert_position(insert, target, column) else { return true };
    let plain = select.values_lists.is_empty() && select.larg.is_none() && select.rarg.is_none();
    let has_star = select.target_list.iter().any(|t| match t.node.as_ref() {
        Some(NodeEnum::ResTarget(r)) => matches!(r.val.as_deref().and_then(|v| v.node.as_ref()), Some(NodeEnum::ColumnRef(c)) if c.fields.iter().any(|f| matches!(f.node, Some(NodeEnum::AStar(_))))),
        _ => true,
    });
    let Some(type_name) = super::keys::key_type_name(key) else { return false };
    let Some(NodeEnum::ResTarget(item)) = select.target_list.get_mut(position).and_then(|t| t.node.as_mut()).filter(|_| plain && !has_star) else {
        return false;
    };
    let Some(value) = item.val.take() else { return false };
    item.val = Some(Box::new(super::cast_to_catalog_type(*value, type_name)));
    true
}

/// An INSERT whose rows the coordinator computes before routing them: the
/// SELECT (or VALUES) producing them (None for DEFAULT VALUES), and how the
/// coordinator database computes them.
pub(super) fn through_coordinator(
    insert: &InsertStmt,
    select: Option<NodeEnum>,
    rows: RowSource,
    target: Arc<DistributedTable>,
    catalog: &Catalog,
    version: i32,
) -> Plan {
    if insert.with_clause.is_some() {
        return not_supported("INSERT … SELECT with a WITH clause that must pass its rows through the coordinator is not supported yet");
    }
    if insert.cols.iter().any(|c| matches!(c.node.as_ref(), Some(NodeEnum::ResTarget(r)) if !r.indirection.is_empty())) {
        return not_supported("INSERT … SELECT into subfields or array elements of a distributed table is not supported yet");
    }
    let tables = select.as_ref().map(|s| super::distributed_among(&crate::walk::range_vars(s), catalog)).unwrap_or_default();
    // The SELECT as the coordinator database runs it: distributed tables
    // read from their stand-ins.
    let reads_tables = !tables.is_empty();
    let select_over = |stand_in| match &select {
        Some(s) if reads_tables => fallback::over_stand_ins(s, catalog, stand_in).map(Some),
        other => Some(other.clone()),
    };
    let (columns, check_sql) = match &rows {
        RowSource::Select { check } => {
            let columns = insert
                .cols
                .iter()
                .filter_map(|c| match c.node.as_ref() {
                    Some(NodeEnum::ResTarget(r)) => Some(r.name.clone()),
                    _ => None,
                })
                .collect();
            (Some(columns), Some(check.clone()))
        }
        RowSource::Shell => (None, None),
    };
    let statement = |stand_in| -> Option<NodeEnum> {
        let select = select_over(stand_in)?;
        Some(match (&rows, select) {
            (RowSource::Select { .. }, Some(select)) => select,
            (_, select) => {
                // Into the shell, with the statement's own ON CONFLICT: the shell is
                // empty, so only the statement's own rows can conflict, which
                // PostgreSQL would also skip (DO NOTHING) or refuse (DO UPDATE, 21000).
                let select_stmt = select.map(|node| Box::new(protobuf::Node { node: Some(node) }));
                let shell = InsertStmt { with_clause: None, select_stmt, returning_list: vec![res_target("", column_ref_star())], ..insert.clone() };
                NodeEnum::InsertStmt(Box::new(shell))
            }
        })
    };
    let rows_read = match fallback::CoordinatorRead::build(version, tables, statement) {
        Some(Ok(read)) => read,
        Some(Err(e)) => return Plan::Unsupported(e),
        None => return not_supported("this INSERT … SELECT into a distributed table is not supported yet"),
    };
    let shard_clauses = match shard_clauses(insert, version) {
        Ok(clauses) => clauses,
        Err(e) => return Plan::Unsupported(e),
    };
    Plan::InsertSelect(Arc::new(InsertSelectPlan {
        target,
        rows: rows_read,
        check_sql,
        columns,
        shard_clauses,
        returns_rows: !insert.returning_list.is_empty(),
    }))
}

/// How the coordinator database computes an INSERT's rows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum RowSource {
    /// It runs the SELECT; the routed INSERTs name the statement's columns and
    /// the router fills in sequence defaults, as for INSERT … VALUES. The rows
    /// never meet the shell, whose foreign keys would find no referenced rows.
    /// `check`: the INSERT into the shell, only parsed first (type errors).
    Select { check: String },
    /// It runs the INSERT into the empty shell with `RETURNING *` and rolls it
    /// back: the rows come back as PostgreSQL would store them (every default,
    /// identity rules, assignment casts, the shell's constraints).
    Shell,
}

/// The ON CONFLICT and RETURNING clauses as text, for the INSERTs that carry
/// the rows to the shards.
fn shard_clauses(insert: &InsertStmt, version: i32) -> PgResult<String> {
    if insert.on_conflict_clause.is_none() && insert.returning_list.is_empty() {
        return Ok(String::new());
    }
    let clauses_only = InsertStmt {
        relation: insert.relation.clone(),
        on_conflict_clause: insert.on_conflict_clause.clone(),
        returning_list: insert.returning_list.clone(),
        r#override: protobuf::OverridingKind::OverridingNotSet as i32,
        ..Default::default()
    };
    let sql = deparse::deparse_statement(version, NodeEnum::InsertStmt(Box::new(clauses_only)))?;
    match sql.split_once(" DEFAULT VALUES") {
        Some((_, clauses)) => Ok(clauses.to_string()),
        None => Err(PgError::internal(format!("unexpected shape of a deparsed INSERT: {sql}"))),
    }
}

fn column_ref_star() -> protobuf::Node {
    protobuf::Node {
        node: Some(NodeEnum::ColumnRef(protobuf::ColumnRef {
            fields: vec![protobuf::Node { node: Some(NodeEnum::AStar(protobuf::AStar {})) }],
            location: -1,
        })),
    }
}

/// Whether a row of the INSERT leaves a column whose default draws from a
/// sequence (which only the coordinator database has) to that default;
/// `given(position)` says whether the rows have a value at that position of
/// the column list.
pub(super) fn leaves_sequence_to_default(insert: &InsertStmt, target: &DistributedTable, given: impl Fn(usize) -> bool) -> bool {
    target.sequence_columns.iter().any(|(column, _)| match insert_position(insert, target, column) {
        Some(position) => !given(position),
        None => true,
    })
}

/// A column's position in the INSERT's column list (the table's columns
/// when the statement names none).
pub(super) fn insert_position(insert: &InsertStmt, target: &DistributedTable, column: &str) -> Option<usize> {
    if insert.cols.is_empty() {
        target.columns.iter().position(|c| c == column)
    } else {
        insert.cols.iter().position(|n| matches!(n.node.as_ref(), Some(NodeEnum::ResTarget(r)) if r.name == column))
    }
}

/// Whether the SELECT's output for the target's distribution column is the
/// distribution column of a table it reads (so each row stays in its group).
fn produces_key(insert: &InsertStmt, select: &SelectStmt, key: &str, target: &DistributedTable, catalog: &Catalog) -> bool {
    let Some(item) = insert_position(insert, target, key).and_then(|p| select.target_list.get(p)) else { return false };
    let Some(NodeEnum::ResTarget(r)) = item.node.as_ref() else { return false };
    let Some(NodeEnum::ColumnRef(c)) = r.val.as_deref().and_then(|v| v.node.as_ref()) else { return false };
    let Some(names) = super::column_ref_names(c) else { return false };
    let mut sources = Vec::new();
    from_tables(&select.from_clause, catalog, &mut sources);
    let Some(sources) = sources.into_iter().collect::<Option<Vec<_>>>() else {
        // A subquery or function in FROM could produce a column of that name.
        return false;
    };
    let is_key_of = |t: &DistributedTable, column: &str| {
        matches!(&t.distribution, Distribution::Hash { column: k, .. } if k == column) && t.colocation_id == target.colocation_id
    };
    match names.as_slice() {
        [qualifier, column] => sources.iter().any(|(name, t)| name == qualifier && is_key_of(t, column)),
        [column] => {
            let having: Vec<_> = sources.iter().filter(|(_, t)| t.columns.iter().any(|c| c == column)).collect();
            !having.is_empty() && having.iter().all(|(_, t)| is_key_of(t, column))
        }
        _ => false,
    }
}

/// The tables of a FROM list with the names the query knows them by; None for
/// an item that is not a distributed or reference table.
fn from_tables(items: &[protobuf::Node], catalog: &Catalog, out: &mut Vec<Option<(String, Arc<DistributedTable>)>>) {
    for item in items {
        match item.node.as_ref() {
            Some(NodeEnum::RangeVar(rv)) => out.push(resolve_range_var(rv, catalog).map(|t| {
                let name = rv.alias.as_ref().map(|a| a.aliasname.clone()).unwrap_or_else(|| rv.relname.clone());
                (name, t.clone())
            })),
            Some(NodeEnum::JoinExpr(j)) => {
                for side in [j.larg.as_deref(), j.rarg.as_deref()].into_iter().flatten() {
                    from_tables(std::slice::from_ref(side), catalog, out);
                }
            }
            _ => out.push(None),
        }
    }
}
