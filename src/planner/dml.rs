//! The planner's entry for SELECT, INSERT, UPDATE, DELETE and MERGE: which
//! tier takes the statement (router, multi-shard, INSERT … SELECT, MERGE
//! through the coordinator …), with the INSERT and MERGE planning of their own
//! that decides where each row goes.

use super::keys::*;
use super::rewrite::ShardTemplate;
use super::router::*;
use super::{count_hash_references, distributed_among, not_supported, resolve_range_var, Plan};
use crate::error::{sqlstate, PgError};
use crate::metadata::{Catalog, DistributedTable, Distribution};
use pg_query::protobuf::{self};
use pg_query::NodeEnum;

/// Plans DML over distributed tables; None when the statement touches none.
pub(super) fn plan_dml(version: i32, raw: &protobuf::RawStmt, catalog: &Catalog) -> Option<Plan> {
    let node = raw.stmt.as_ref()?.node.as_ref()?;
    let range_vars = super::walk::range_vars(node);
    let tables = distributed_among(&range_vars, catalog);
    if tables.is_empty() {
        return None;
    }
    // INSERT … SELECT may read local tables: its planner decides how.
    let insert_select = matches!(node, NodeEnum::InsertStmt(i) if i.select_stmt.as_deref().and_then(|s| s.node.as_ref()).is_some_and(|s| matches!(s, NodeEnum::SelectStmt(sel) if sel.values_lists.is_empty())));
    if let Some(local) = first_local_table(node, &range_vars, catalog).filter(|_| !insert_select) {
        return Some(not_supported(format!("queries that combine distributed tables with the local table \"{local}\" are not supported yet")));
    }
    let template = ShardTemplate::for_query(version, raw.clone(), tables.clone());
    Some(match node {
        NodeEnum::InsertStmt(insert) => plan_insert(insert, node, template, catalog),
        NodeEnum::SelectStmt(s) => {
            if s.op != protobuf::SetOperation::SetopNone as i32 {
                return Some(
                    route_if_reference_only(Command::Select, template, &tables)
                        .unwrap_or_else(|| not_supported("set operations over distributed tables are not supported yet")),
                );
            }
            let writes = s.with_clause.as_ref().and_then(modifying_cte);
            let mut scope = Vec::new();
            let mut conjuncts = Vec::new();
            let replicated_preserved = collect_from(&s.from_clause, catalog, &mut scope, &mut conjuncts);
            if let Some(w) = s.where_clause.as_deref() {
                flatten_and(w, &mut conjuncts, true);
            }
            let plan = plan_pinned(writes.unwrap_or(Command::Select), node, scope, &conjuncts, template, catalog, replicated_preserved);
            // A WITH query routes when every part reads (and writes) one
            // shard group, or only reference tables; else a read-only one
            // goes to the general fallback (the multi-shard tier does not
            // carry WITH clauses), and one that writes is refused (the
            // fallback cannot write).
            match plan {
                Plan::Router(_) => plan,
                _ if s.with_clause.is_none() || writes.is_some() => plan,
                _ => not_supported("WITH queries over distributed tables are supported only when every part reads one shard group, pinned by its own conditions on the distribution column"),
            }
        }
        NodeEnum::UpdateStmt(u) => {
            let rel = u.relation.as_ref()?;
            if sets_distribution_column(u, catalog) {
                return Some(Plan::Unsupported(PgError::not_supported("modifying the partition value of rows is not allowed")));
            }
            let mut scope = vec![scope_entry(rel, catalog)];
            let mut conjuncts = Vec::new();
            let replicated_preserved = collect_from(&u.from_clause, catalog, &mut scope, &mut conjuncts);
            if let Some(w) = u.where_clause.as_deref() {
                flatten_and(w, &mut conjuncts, true);
            }
            plan_pinned(Command::Update, node, scope, &conjuncts, template, catalog, replicated_preserved)
        }
        NodeEnum::DeleteStmt(d) => {
            let rel = d.relation.as_ref()?;
            let mut scope = vec![scope_entry(rel, catalog)];
            let mut conjuncts = Vec::new();
            let replicated_preserved = collect_from(&d.using_clause, catalog, &mut scope, &mut conjuncts);
            if let Some(w) = d.where_clause.as_deref() {
                flatten_and(w, &mut conjuncts, true);
            }
            plan_pinned(Command::Delete, node, scope, &conjuncts, template, catalog, replicated_preserved)
        }
        NodeEnum::MergeStmt(m) => plan_merge(m, node, template, catalog),
        _ => return None,
    })
}

/// The WITH clause of a query or of INSERT, UPDATE or DELETE.
pub(super) fn top_level_with(node: &NodeEnum) -> Option<&protobuf::WithClause> {
    match node {
        NodeEnum::SelectStmt(s) => s.with_clause.as_ref(),
        NodeEnum::InsertStmt(i) => i.with_clause.as_ref(),
        NodeEnum::UpdateStmt(u) => u.with_clause.as_ref(),
        NodeEnum::DeleteStmt(d) => d.with_clause.as_ref(),
        _ => None,
    }
}

/// The command of the first data-modifying statement in a WITH clause, if
/// any: a SELECT carrying one writes.
pub(super) fn modifying_cte(with: &protobuf::WithClause) -> Option<Command> {
    with.ctes.iter().find_map(|cte| match cte.node.as_ref()? {
        NodeEnum::CommonTableExpr(c) => match c.ctequery.as_deref()?.node.as_ref()? {
            NodeEnum::InsertStmt(_) => Some(Command::Insert),
            NodeEnum::UpdateStmt(_) => Some(Command::Update),
            NodeEnum::DeleteStmt(_) => Some(Command::Delete),
            _ => None,
        },
        _ => None,
    })
}

/// A table the statement names that is neither distributed nor a reference
/// table (nor one of its CTEs): the workers do not have it.
/// The first of the statement's `range_vars` (from our own walk: pg_query's
/// skips tables under TABLESAMPLE, among others) that is neither a
/// distributed table nor a CTE.
pub(super) fn first_local_table(node: &NodeEnum, range_vars: &[protobuf::RangeVar], catalog: &Catalog) -> Option<String> {
    let mut unknown = range_vars.iter().filter(|rv| resolve_range_var(rv, catalog).is_none()).peekable();
    // The usual case, every table distributed, needs no look for CTEs.
    unknown.peek()?;
    let nodes = node.nodes();
    let ctes: Vec<&str> = nodes
        .iter()
        .filter_map(|(n, _, _)| match n {
            pg_query::NodeRef::CommonTableExpr(c) => Some(c.ctename.as_str()),
            _ => None,
        })
        .collect();
    unknown.find(|rv| !(rv.schemaname.is_empty() && ctes.contains(&rv.relname.as_str()))).map(|rv| rv.relname.clone())
}

/// The statement unchanged on any one active worker, over its worker-side
/// relations (None when there is no active worker).
pub(super) fn whole_on_any_worker(catalog: &Catalog, template: ShardTemplate) -> Option<Plan> {
    let groups: Vec<i32> = catalog.active_nodes().map(|n| n.group_id).collect();
    (!groups.is_empty()).then(|| router(Command::WholeOnWorker, ShardTarget::AnyNode(groups), None, template))
}

/// MERGE into a distributed or reference table. Its source is outer-joined
/// to the target (a source row that matches nothing may be inserted), so
/// constants in ON pin nothing, and each shard group may run the statement
/// on its own only when a row it inserts belongs to that group: the source
/// must then be co-located tables joined on the distribution column, whose
/// value the INSERT puts in the target's. With only MATCHED actions, MERGE
/// runs as UPDATE … FROM / DELETE … USING would.
pub(super) fn plan_merge(merge: &protobuf::MergeStmt, node: &NodeEnum, template: ShardTemplate, catalog: &Catalog) -> Plan {
    let (Some(rel), Some(source)) = (merge.relation.as_ref(), merge.source_relation.as_deref()) else {
        return not_supported("this MERGE is not supported");
    };
    let Some(target) = resolve_range_var(rel, catalog) else {
        return Plan::Unsupported(
            PgError::not_supported("MERGE into a local table from distributed tables is not supported yet")
                .with_hint("Run an INSERT … SELECT and an UPDATE … FROM instead."),
        );
    };
    let clauses: Vec<&protobuf::MergeWhenClause> = merge
        .merge_when_clauses
        .iter()
        .filter_map(|n| match n.node.as_ref() {
            Some(NodeEnum::MergeWhenClause(c)) => Some(c.as_ref()),
            _ => None,
        })
        .collect();
    let is = |c: &protobuf::MergeWhenClause, t: protobuf::CmdType| c.command_type == t as i32;
    let mut scope = vec![scope_entry(rel, catalog)];
    let mut conjuncts = Vec::new();
    let replicated_preserved = collect_from(std::slice::from_ref(source), catalog, &mut scope, &mut conjuncts);
    if let Some(on) = merge.join_condition.as_deref() {
        flatten_and(on, &mut conjuncts, false);
    }
    if let Distribution::Hash { column, .. } = &target.distribution {
        if clauses.iter().any(|c| {
            is(c, protobuf::CmdType::CmdUpdate)
                && c.target_list.iter().any(|n| matches!(n.node.as_ref(), Some(NodeEnum::ResTarget(r)) if r.name == *column))
        }) {
            return not_supported("modifying the partition value of rows is not allowed");
        }
        let inserts: Vec<&&protobuf::MergeWhenClause> = clauses.iter().filter(|c| is(c, protobuf::CmdType::CmdInsert)).collect();
        if !inserts.is_empty() {
            let source_tables: Vec<&ScopeEntry> = scope[1..].iter().collect();
            let colocated = !source_tables.is_empty()
                && source_tables.iter().all(|e| e.table.as_ref().is_some_and(|t| !t.is_reference() && t.colocation_id == target.colocation_id));
            let keeps_key = |c: &protobuf::MergeWhenClause| inserted_key_is_source_key(c, target, column, &scope[1..]);
            if !colocated || !inserts.iter().all(|c| keeps_key(c)) {
                return super::merge::through_coordinator(
                    template.version(),
                    merge,
                    target,
                    catalog,
                    "this MERGE … WHEN NOT MATCHED THEN INSERT into a distributed table is not supported: no value of the source row decides its shard",
                );
            }
        }
    } else if clauses.iter().any(|c| is(c, protobuf::CmdType::CmdInsert))
        && scope[1..].iter().any(|e| e.table.as_ref().is_some_and(|t| !t.is_reference()))
    {
        return not_supported("MERGE into a reference table from distributed tables is not supported yet");
    }
    let version = template.version();
    match plan_pinned(Command::Merge, node, scope, &conjuncts, template, catalog, replicated_preserved) {
        Plan::Unsupported(_) if !target.is_reference() => super::merge::through_coordinator(
            version,
            merge,
            target,
            catalog,
            "MERGE into a distributed table must join the target's distribution column to the source in ON (ON t.key = s.key)",
        ),
        plan => plan,
    }
}

/// Whether a MERGE INSERT action puts in the target's distribution column
/// `column` a source table's distribution column, unchanged.
pub(super) fn inserted_key_is_source_key(clause: &protobuf::MergeWhenClause, target: &DistributedTable, column: &str, source: &[ScopeEntry]) -> bool {
    let position = if clause.target_list.is_empty() {
        target.columns.iter().position(|c| c == column)
    } else {
        clause.target_list.iter().position(|n| matches!(n.node.as_ref(), Some(NodeEnum::ResTarget(r)) if r.name == column))
    };
    let Some(Some(NodeEnum::ColumnRef(c))) = position.and_then(|i| clause.values.get(i)).map(|v| v.node.as_ref()) else { return false };
    let names: Vec<&str> = c
        .fields
        .iter()
        .filter_map(|f| match f.node.as_ref() {
            Some(NodeEnum::String(s)) => Some(s.sval.as_str()),
            _ => None,
        })
        .collect();
    source.iter().any(|entry| {
        let Some(Distribution::Hash { column: key, .. }) = entry.table.as_ref().map(|t| &t.distribution) else { return false };
        match names.as_slice() {
            [name] => name == key,
            [qualifier, name] => *qualifier == entry.name && name == key,
            _ => false,
        }
    })
}

/// Whether an INSERT … VALUES needs the coordinator database to compute its
/// rows: it gives a value to a GENERATED ALWAYS identity column (which
/// PostgreSQL's own rules must judge), has DEFAULT VALUES, or computes a
/// distribution value from an expression (`make_timestamp(2032, 9, 4, 0, 0,
/// 0)`, `2 + 3`, `+5`), which PostgreSQL evaluates there as it would for the
/// row. Not when the rows read a distributed or reference table: the
/// coordinator database holds only their empty shells.
pub(super) fn needs_coordinator_values(
    insert: &protobuf::InsertStmt,
    rows: &[&[protobuf::Node]],
    table: &DistributedTable,
    catalog: &Catalog,
) -> bool {
    if rows.is_empty() {
        return table.key_default.is_some() || !table.sequence_columns.is_empty();
    }
    let given = |column: &str| {
        super::insert_select::insert_position(insert, table, column)
            .map(|p| rows.iter().filter_map(move |row| row.get(p)).filter(|v| !is_set_to_default(v)))
    };
    let sets_identity = insert.r#override != protobuf::OverridingKind::OverridingSystemValue as i32
        && table.always_identity.iter().any(|c| given(c).is_some_and(|mut values| values.next().is_some()));
    let computes_key = match &table.distribution {
        Distribution::Hash { column, key, .. } => given(column).is_some_and(|mut values| values.any(|v| key_value(v, key).is_none())),
        Distribution::Reference => false,
    };
    let reads_tables = || {
        rows.iter()
            .flat_map(|row| row.iter())
            .any(|v| v.node.as_ref().is_some_and(|n| !distributed_among(&super::walk::range_vars(n), catalog).is_empty()))
    };
    sets_identity || computes_key && !reads_tables()
}

pub(super) fn is_set_to_default(n: &protobuf::Node) -> bool {
    matches!(n.node.as_ref(), Some(NodeEnum::SetToDefault(_)))
}

/// The columns other than the distribution column whose sequence default
/// some VALUES rows leave to it (the shards have no such default: the
/// coordinator fills the values in). None when a row is too short to take
/// the value where it belongs (no column list, fewer values than columns).
pub(super) fn sequence_fills(
    insert: &protobuf::InsertStmt,
    rows: &[&[protobuf::Node]],
    table: &DistributedTable,
    key: Option<&str>,
) -> Option<Vec<SequenceFill>> {
    let mut fills = Vec::new();
    for (column, default_sql) in table.sequence_columns.iter().filter(|(c, _)| Some(c.as_str()) != key) {
        let position = super::insert_select::insert_position(insert, table, column);
        let defaulted: Vec<usize> = match position {
            Some(p) => rows.iter().enumerate().filter(|(_, row)| row.get(p).is_none_or(is_set_to_default)).map(|(i, _)| i).collect(),
            None => (0..rows.len()).collect(),
        };
        if defaulted.is_empty() {
            continue;
        }
        if position.is_some_and(|p| rows.iter().any(|row| row.len() <= p)) {
            return None;
        }
        fills.push(SequenceFill { column: column.clone(), position, default_sql: default_sql.clone(), rows: defaulted });
    }
    Some(fills)
}

pub(super) fn plan_insert(insert: &protobuf::InsertStmt, node: &NodeEnum, template: ShardTemplate, catalog: &Catalog) -> Plan {
    let Some(table) = insert.relation.as_ref().and_then(|r| resolve_range_var(r, catalog)).cloned() else {
        return not_supported("INSERT into a local table that reads distributed tables is not supported yet");
    };
    if insert.with_clause.is_some() {
        return not_supported("INSERT with a WITH clause into a distributed table is not supported yet");
    }
    let rows: Vec<&[protobuf::Node]> = match insert.select_stmt.as_deref().and_then(|s| s.node.as_ref()) {
        Some(NodeEnum::SelectStmt(s)) if !s.values_lists.is_empty() && s.from_clause.is_empty() && s.with_clause.is_none() => s
            .values_lists
            .iter()
            .filter_map(|l| match l.node.as_ref() {
                Some(NodeEnum::List(items)) => Some(items.items.as_slice()),
                _ => None,
            })
            .collect(),
        None => Vec::new(),
        Some(NodeEnum::SelectStmt(select)) => return super::insert_select::plan(insert, select, table, template, catalog),
        Some(_) => return not_supported("this INSERT into a distributed table is not supported yet"),
    };
    let other_hash_refs = count_hash_references(node, catalog) - usize::from(!table.is_reference());
    if other_hash_refs > 0 {
        return not_supported("INSERT that reads other distributed tables is not supported yet");
    }
    let key_column = match &table.distribution {
        Distribution::Hash { column, .. } => Some(column.as_str()),
        Distribution::Reference => None,
    };
    let fills = match sequence_fills(insert, &rows, &table, key_column) {
        Some(fills) if !needs_coordinator_values(insert, &rows, &table, catalog) => fills,
        _ => {
            let values = insert.select_stmt.as_deref().and_then(|s| s.node.clone());
            return super::insert_select::through_coordinator(
                insert,
                values,
                super::insert_select::RowSource::Shell,
                table,
                catalog,
                template.version(),
            );
        }
    };
    let Distribution::Hash { column, column_type, key, .. } = &table.distribution else {
        let insert_key =
            InsertKey { table: (table.oid, table.name.clone()), column: String::new(), position: None, default_sql: None, fills, rows: rows.len() };
        return router_with_key(Command::Insert, ShardTarget::Reference, None, template, Some(insert_key), None);
    };
    if let Some(conflict) = &insert.on_conflict_clause {
        let sets_key = conflict.target_list.iter().any(|n| matches!(n.node.as_ref(), Some(NodeEnum::ResTarget(r)) if r.name == *column));
        if sets_key {
            return Plan::Unsupported(PgError::not_supported("modifying the partition value of rows is not allowed"));
        }
    }
    let position = if insert.cols.is_empty() {
        table.columns.iter().position(|c| c == column)
    } else {
        insert.cols.iter().position(|n| matches!(n.node.as_ref(), Some(NodeEnum::ResTarget(r)) if r.name == *column))
    };
    // The row would have a NULL key.
    let no_key = || Plan::Unsupported(PgError::new(sqlstate::NOT_NULL_VIOLATION, "cannot perform an INSERT without a partition column value"));
    if rows.is_empty() {
        return no_key();
    }
    let fills_rows = !fills.is_empty();
    let insert_key = InsertKey {
        table: (table.oid, table.name.clone()),
        column: column.clone(),
        position,
        default_sql: table.key_default.clone(),
        fills,
        rows: rows.len(),
    };
    let mut keys = Vec::with_capacity(rows.len());
    for row in &rows {
        let value = match position {
            Some(p) => match row.get(p) {
                Some(v) => Some(v),
                None => return no_key(),
            },
            None if insert.cols.is_empty() => return no_key(),
            None => None,
        };
        let defaulted = value.is_none_or(|v| matches!(v.node.as_ref(), Some(NodeEnum::SetToDefault(_))));
        if defaulted {
            if table.key_default.is_none() {
                return no_key();
            }
            keys.push(KeyValue::Default);
            continue;
        }
        match value.and_then(|v| key_value(v, key)) {
            Some(Ok(k)) => keys.push(k),
            Some(Err(e)) => return Plan::Unsupported(e),
            None => return not_supported("the distribution column value of an INSERT must be a constant or a parameter"),
        }
    }
    let shards = table.shard_count();
    let tenant = match keys.as_slice() {
        [single] => Some(single.clone()),
        _ => None,
    };
    let targets: Vec<ShardTarget> = keys.iter().map(|k| insert_target(k, *column_type, key, shards)).collect();
    let target = match targets.as_slice() {
        // Rows the coordinator fills in are written out per execution.
        _ if fills_rows => ShardTarget::InsertRows(keys),
        [ShardTarget::Shard(first), rest @ ..] if rest.iter().all(|t| *t == ShardTarget::Shard(*first)) => ShardTarget::Shard(*first),
        [single @ ShardTarget::Key(KeyValue::Param(_) | KeyValue::Literal { .. })] => single.clone(),
        _ => ShardTarget::InsertRows(keys),
    };
    router_with_key(Command::Insert, target, Some(table), template, Some(insert_key), tenant)
}
