//! Router planning: a SELECT/INSERT/UPDATE/DELETE whose distributed tables are
//! co-located and pinned to one shard group by `dist_col = constant/$n` (directly
//! or through equality joins on the distribution columns) runs whole on the one
//! node that holds that shard group. Fast path and router tiers share this code:
//! the fast path is the one-table case whose shard SQL is prepared once per worker
//! connection.

use super::rewrite::ShardTemplate;
use super::{count_hash_references, not_supported, referenced_tables, resolve_range_var, Plan};
use crate::error::{sqlstate, PgError, PgResult};
use crate::hash::{self, HashType};
use crate::metadata::{Catalog, Distribution, DistributedTable};
use pg_query::protobuf::{self, a_const, AExprKind, BoolExprType, JoinType};
use pg_query::NodeEnum;
use std::fmt;
use std::sync::{Arc, OnceLock};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Command {
    Select,
    Insert,
    Update,
    Delete,
}

/// The distribution-column value that picks the shard group.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KeyValue {
    /// A literal, in PostgreSQL text form.
    Literal(String),
    /// Bind parameter (0-based).
    Param(usize),
    /// Left to the column default (e.g. a serial key): the coordinator evaluates it.
    Default,
}

/// Where an INSERT's distribution-column value goes, for rows whose value the
/// coordinator fills in from the column default.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InsertKey {
    pub column: String,
    /// Position in each VALUES row; None when the column list leaves it out.
    pub position: Option<usize>,
    /// SQL evaluating the default, e.g. `nextval('t_id_seq'::regclass)`.
    pub default_sql: Option<String>,
}

/// Where a router statement runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ShardTarget {
    /// Only reference tables: reads use one placement, writes every placement.
    Reference,
    /// One shard group, known at planning time.
    Shard(u32),
    /// One shard group, known once parameter `index` is bound.
    Param { index: usize },
    /// A multi-row INSERT whose rows may go to different shard groups.
    InsertRows(Vec<KeyValue>),
}

#[derive(Debug)]
pub struct RouterPlan {
    pub command: Command,
    pub target: ShardTarget,
    /// The table whose shards define the groups (None for reference-only).
    pub anchor: Option<Arc<DistributedTable>>,
    /// Type and shard count used to hash parameter or row keys.
    pub key_type: Option<HashType>,
    pub template: ShardTemplate,
    /// Set for INSERTs: where the distribution column's value sits.
    pub insert_key: Option<InsertKey>,
    /// Deparsed SQL per shard group, filled on first use.
    shard_sql: Vec<OnceLock<Arc<str>>>,
}

impl fmt::Display for RouterPlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?} ", self.command)?;
        match &self.target {
            ShardTarget::Reference => write!(f, "reference"),
            ShardTarget::Shard(i) => write!(f, "shard {i}"),
            ShardTarget::Param { index } => write!(f, "shard of ${}", index + 1),
            ShardTarget::InsertRows(rows) => write!(f, "{} rows", rows.len()),
        }
    }
}

impl RouterPlan {
    pub fn is_write(&self) -> bool {
        self.command != Command::Select
    }
    pub fn shard_count(&self) -> u32 {
        self.anchor.as_ref().map(|a| a.shard_count()).unwrap_or(1)
    }

    /// The statement text for shard group `index`, deparsed once and cached.
    pub fn sql_for_shard(&self, index: u32) -> PgResult<Arc<str>> {
        let slot = self.shard_sql.get(index as usize).ok_or_else(|| PgError::internal(format!("shard index {index} out of range")))?;
        if let Some(sql) = slot.get() {
            return Ok(sql.clone());
        }
        let sql: Arc<str> = Arc::from(self.template.sql_for_shard(index)?);
        Ok(slot.get_or_init(|| sql).clone())
    }

    /// SQL for a multi-row INSERT that keeps only the VALUES rows in `rows`, with
    /// the distribution-column values in `filled` (row, value) written in.
    pub fn insert_rows_sql(&self, index: u32, rows: &[usize], filled: &[(usize, String)]) -> PgResult<String> {
        let key = self.insert_key.as_ref();
        self.template.sql_with(index, |node| {
            let Some(NodeEnum::InsertStmt(insert)) = node.node.as_mut() else { return };
            let append_column = !filled.is_empty() && key.is_some_and(|k| k.position.is_none());
            if append_column {
                let name = key.map(|k| k.column.clone()).unwrap_or_default();
                insert.cols.push(protobuf::Node { node: Some(NodeEnum::ResTarget(Box::new(protobuf::ResTarget { name, indirection: vec![], val: None, location: -1 }))) });
            }
            let Some(NodeEnum::SelectStmt(values)) = insert.select_stmt.as_mut().and_then(|s| s.node.as_mut()) else { return };
            let all = std::mem::take(&mut values.values_lists);
            for (i, mut list) in all.into_iter().enumerate() {
                if !rows.contains(&i) {
                    continue;
                }
                if let (Some((_, value)), Some(NodeEnum::List(items))) = (filled.iter().find(|(r, _)| *r == i), list.node.as_mut()) {
                    let constant = protobuf::Node {
                        node: Some(NodeEnum::AConst(protobuf::AConst { isnull: false, val: Some(a_const::Val::Sval(protobuf::String { sval: value.clone() })), location: -1 })),
                    };
                    match key.and_then(|k| k.position) {
                        Some(p) if p < items.items.len() => items.items[p] = constant,
                        _ => items.items.push(constant),
                    }
                }
                values.values_lists.push(list);
            }
        })
    }

    /// The shard group for a key value given in text form.
    pub fn shard_for_text(&self, text: &str) -> PgResult<u32> {
        let ty = self.key_type.ok_or_else(|| PgError::internal("router plan without a key type"))?;
        let h = hash::hash_text(ty, text).map_err(|e| key_error(&e.0))?;
        Ok(hash::shard_index(hash::row_hash(Some(h)), self.shard_count()))
    }

    /// The shard group for a bound parameter (text or binary format).
    pub fn shard_for_param(&self, value: Option<&[u8]>, binary: bool) -> PgResult<u32> {
        let Some(value) = value else {
            // `dist_col = NULL` matches no row; any shard answers that correctly.
            return Ok(0);
        };
        if binary {
            let ty = self.key_type.ok_or_else(|| PgError::internal("router plan without a key type"))?;
            let h = hash::hash_binary(ty, value).map_err(|e| key_error(&e.0))?;
            Ok(hash::shard_index(hash::row_hash(Some(h)), self.shard_count()))
        } else {
            let text = std::str::from_utf8(value).map_err(|_| key_error("parameter is not valid UTF-8"))?;
            self.shard_for_text(text)
        }
    }
}

fn key_error(why: &str) -> PgError {
    PgError::new(sqlstate::INVALID_PARAMETER_VALUE, format!("could not compute the shard for the distribution column value: {why}"))
}

/// A FROM-clause entry visible to the statement's top-level expressions.
struct ScopeEntry {
    /// The alias, or the table name when there is none.
    name: String,
    table: Option<Arc<DistributedTable>>,
}

/// Plans DML over distributed tables; None when the statement touches none.
pub(super) fn plan_dml(version: i32, raw: &protobuf::RawStmt, catalog: &Catalog) -> Option<Plan> {
    let node = raw.stmt.as_ref()?.node.as_ref()?;
    let tables = referenced_tables(raw, catalog);
    if tables.is_empty() {
        return None;
    }
    let template = ShardTemplate::for_query(version, raw.clone(), tables.clone());
    Some(match node {
        NodeEnum::InsertStmt(insert) => plan_insert(insert, node, template, catalog),
        NodeEnum::SelectStmt(s) => {
            if s.op != protobuf::SetOperation::SetopNone as i32 || s.with_clause.is_some() {
                return Some(route_if_reference_only(Command::Select, template, &tables).unwrap_or_else(|| {
                    not_supported("set operations and WITH queries over distributed tables are not supported yet")
                }));
            }
            let mut scope = Vec::new();
            let mut conjuncts = Vec::new();
            collect_from(&s.from_clause, catalog, &mut scope, &mut conjuncts);
            if let Some(w) = s.where_clause.as_deref() {
                flatten_and(w, &mut conjuncts, true);
            }
            plan_pinned(Command::Select, node, scope, &conjuncts, template, catalog)
        }
        NodeEnum::UpdateStmt(u) => {
            let Some(rel) = u.relation.as_ref() else { return None };
            if let Some(t) = resolve_range_var(rel, catalog) {
                if let Distribution::Hash { column, .. } = &t.distribution {
                    let sets_key = u.target_list.iter().any(|n| matches!(n.node.as_ref(), Some(NodeEnum::ResTarget(r)) if r.name == *column));
                    if sets_key {
                        return Some(Plan::Unsupported(PgError::not_supported("modifying the partition value of rows is not allowed")));
                    }
                }
            }
            let mut scope = vec![scope_entry(rel, catalog)];
            let mut conjuncts = Vec::new();
            collect_from(&u.from_clause, catalog, &mut scope, &mut conjuncts);
            if let Some(w) = u.where_clause.as_deref() {
                flatten_and(w, &mut conjuncts, true);
            }
            plan_pinned(Command::Update, node, scope, &conjuncts, template, catalog)
        }
        NodeEnum::DeleteStmt(d) => {
            let Some(rel) = d.relation.as_ref() else { return None };
            let mut scope = vec![scope_entry(rel, catalog)];
            let mut conjuncts = Vec::new();
            collect_from(&d.using_clause, catalog, &mut scope, &mut conjuncts);
            if let Some(w) = d.where_clause.as_deref() {
                flatten_and(w, &mut conjuncts, true);
            }
            plan_pinned(Command::Delete, node, scope, &conjuncts, template, catalog)
        }
        _ => return None,
    })
}

fn router(command: Command, target: ShardTarget, anchor: Option<Arc<DistributedTable>>, template: ShardTemplate) -> Plan {
    router_with_key(command, target, anchor, template, None)
}

fn router_with_key(command: Command, target: ShardTarget, anchor: Option<Arc<DistributedTable>>, template: ShardTemplate, insert_key: Option<InsertKey>) -> Plan {
    let key_type = anchor.as_ref().and_then(|a| match &a.distribution {
        Distribution::Hash { column_type, .. } => Some(*column_type),
        Distribution::Reference => None,
    });
    let groups = anchor.as_ref().map(|a| a.shards.len()).unwrap_or(1);
    Plan::Router(Arc::new(RouterPlan {
        command,
        target,
        anchor,
        key_type,
        template,
        insert_key,
        shard_sql: (0..groups).map(|_| OnceLock::new()).collect(),
    }))
}

fn route_if_reference_only(command: Command, template: ShardTemplate, tables: &[Arc<DistributedTable>]) -> Option<Plan> {
    tables.iter().all(|t| t.is_reference()).then(|| router(command, ShardTarget::Reference, None, template))
}

fn scope_entry(rv: &protobuf::RangeVar, catalog: &Catalog) -> ScopeEntry {
    let name = rv.alias.as_ref().map(|a| a.aliasname.clone()).unwrap_or_else(|| rv.relname.clone());
    ScopeEntry { name, table: resolve_range_var(rv, catalog).cloned() }
}

/// Walks a FROM list: tables enter the scope, join conditions become conjuncts
/// (only their equalities between columns are used: a constant inside an outer
/// join's ON clause does not restrict the preserved side).
fn collect_from<'a>(items: &'a [protobuf::Node], catalog: &Catalog, scope: &mut Vec<ScopeEntry>, conjuncts: &mut Vec<Conjunct<'a>>) {
    for item in items {
        match item.node.as_ref() {
            Some(NodeEnum::RangeVar(rv)) => scope.push(scope_entry(rv, catalog)),
            Some(NodeEnum::JoinExpr(j)) => {
                let both = [j.larg.as_deref(), j.rarg.as_deref()];
                for side in both.into_iter().flatten() {
                    collect_from(std::slice::from_ref(side), catalog, scope, conjuncts);
                }
                let inner = j.jointype == JoinType::JoinInner as i32;
                if let Some(q) = j.quals.as_deref() {
                    flatten_and(q, conjuncts, inner);
                }
            }
            Some(NodeEnum::RangeSubselect(sub)) => {
                let name = sub.alias.as_ref().map(|a| a.aliasname.clone()).unwrap_or_default();
                scope.push(ScopeEntry { name, table: None });
            }
            _ => {}
        }
    }
}

/// An equality found among the top-level ANDed conditions.
struct Conjunct<'a> {
    left: &'a protobuf::Node,
    right: &'a protobuf::Node,
    /// False for conditions of outer joins, whose constants must not pin a table.
    may_pin_constant: bool,
}

fn flatten_and<'a>(node: &'a protobuf::Node, out: &mut Vec<Conjunct<'a>>, may_pin_constant: bool) {
    match node.node.as_ref() {
        Some(NodeEnum::BoolExpr(b)) if b.boolop == BoolExprType::AndExpr as i32 => {
            for arg in &b.args {
                flatten_and(arg, out, may_pin_constant);
            }
        }
        Some(NodeEnum::AExpr(e)) if e.kind == AExprKind::AexprOp as i32 && is_equals(&e.name) => {
            if let (Some(l), Some(r)) = (e.lexpr.as_deref(), e.rexpr.as_deref()) {
                out.push(Conjunct { left: l, right: r, may_pin_constant });
            }
        }
        _ => {}
    }
}

fn is_equals(name: &[protobuf::Node]) -> bool {
    matches!(name.last().and_then(|n| n.node.as_ref()), Some(NodeEnum::String(s)) if s.sval == "=")
}

/// The scope entry whose distribution column a column reference names.
fn dist_column_owner(node: &protobuf::Node, scope: &[ScopeEntry]) -> Option<usize> {
    let Some(NodeEnum::ColumnRef(c)) = node.node.as_ref() else { return None };
    let parts: Vec<&str> = c
        .fields
        .iter()
        .map(|f| match f.node.as_ref() {
            Some(NodeEnum::String(s)) => Some(s.sval.as_str()),
            _ => None,
        })
        .collect::<Option<Vec<_>>>()?;
    let is_key = |e: &ScopeEntry, col: &str| matches!(e.table.as_deref().map(|t| &t.distribution), Some(Distribution::Hash { column, .. }) if column == col);
    match parts.as_slice() {
        [col] => {
            let owners: Vec<usize> = scope.iter().enumerate().filter(|(_, e)| is_key(e, col)).map(|(i, _)| i).collect();
            (owners.len() == 1).then(|| owners[0])
        }
        [qual, col] => scope.iter().position(|e| e.name == *qual && is_key(e, col)),
        [schema, table, col] => scope.iter().position(|e| {
            e.table.as_ref().is_some_and(|t| t.schema == *schema && t.name == *table && e.name == t.name) && is_key(e, col)
        }),
        _ => None,
    }
}

/// A constant or parameter usable as a shard key: `5`, `'abc'`, `'x'::type`, `$1`.
fn key_value(node: &protobuf::Node) -> Option<Result<KeyValue, PgError>> {
    match node.node.as_ref()? {
        NodeEnum::ParamRef(p) => Some(Ok(KeyValue::Param((p.number - 1).max(0) as usize))),
        NodeEnum::TypeCast(c) => key_value(c.arg.as_deref()?),
        NodeEnum::AConst(c) => {
            if c.isnull {
                return Some(Err(PgError::new(sqlstate::NOT_NULL_VIOLATION, "cannot perform an INSERT with NULL in the partition column")));
            }
            let text = match c.val.as_ref()? {
                a_const::Val::Ival(i) => i.ival.to_string(),
                a_const::Val::Fval(f) => f.fval.clone(),
                a_const::Val::Sval(s) => s.sval.clone(),
                a_const::Val::Boolval(b) => b.boolval.to_string(),
                a_const::Val::Bsval(_) => return None,
            };
            Some(Ok(KeyValue::Literal(text)))
        }
        _ => None,
    }
}

/// Union-find over scope entries joined on their distribution columns.
fn find(parent: &mut [usize], i: usize) -> usize {
    let mut root = i;
    while parent[root] != root {
        root = parent[root];
    }
    parent[i] = root;
    root
}

fn plan_pinned(command: Command, node: &NodeEnum, scope: Vec<ScopeEntry>, conjuncts: &[Conjunct], template: ShardTemplate, catalog: &Catalog) -> Plan {
    let hash_entries: Vec<usize> = scope.iter().enumerate().filter(|(_, e)| e.table.as_ref().is_some_and(|t| !t.is_reference())).map(|(i, _)| i).collect();
    if hash_entries.is_empty() {
        if count_hash_references(node, catalog) > 0 {
            return not_supported("subqueries over distributed tables are not supported yet");
        }
        return router(command, ShardTarget::Reference, None, template);
    }
    if count_hash_references(node, catalog) != hash_entries.len() {
        return not_supported("subqueries over distributed tables are not supported yet; a query must name its distributed tables in the top-level FROM clause");
    }
    let anchor = scope[hash_entries[0]].table.clone().unwrap();
    if hash_entries.iter().any(|&i| scope[i].table.as_ref().unwrap().colocation_id != anchor.colocation_id) {
        return not_supported("joins between distributed tables that are not co-located are not supported yet");
    }
    let mut parent: Vec<usize> = (0..scope.len()).collect();
    let mut pins: Vec<(usize, KeyValue)> = Vec::new();
    for c in conjuncts {
        let (l, r) = (dist_column_owner(c.left, &scope), dist_column_owner(c.right, &scope));
        match (l, r) {
            (Some(a), Some(b)) => {
                let (ra, rb) = (find(&mut parent, a), find(&mut parent, b));
                parent[ra] = rb;
            }
            (Some(owner), None) | (None, Some(owner)) if c.may_pin_constant => {
                let other = if l.is_some() { c.right } else { c.left };
                match key_value(other) {
                    Some(Ok(v)) => pins.push((owner, v)),
                    Some(Err(_)) => return router_for_null_key(command, anchor, template),
                    None => {}
                }
            }
            _ => {}
        }
    }
    // Every distributed table must be pinned, through its own group's key.
    let mut target: Option<ShardTarget> = None;
    let shards = anchor.shard_count();
    let key_type = match &anchor.distribution {
        Distribution::Hash { column_type, .. } => *column_type,
        Distribution::Reference => unreachable!(),
    };
    let mut groups_done: Vec<usize> = Vec::new();
    for &i in &hash_entries {
        let root = find(&mut parent, i);
        if groups_done.contains(&root) {
            continue;
        }
        groups_done.push(root);
        let pin = pins.iter().find(|(owner, _)| find(&mut parent, *owner) == root);
        let this = match pin {
            None => {
                let one_group = hash_entries.iter().all(|&j| find(&mut parent, j) == root);
                return match node {
                    NodeEnum::SelectStmt(select) if one_group => super::multi_shard::plan_select(select, anchor, template, catalog),
                    NodeEnum::SelectStmt(_) => not_supported("joins between distributed tables that are not on their distribution columns are not supported yet"),
                    _ => not_supported(format!(
                        "UPDATE and DELETE across several shards of distributed table \"{}\" are not supported yet; filter on its distribution column with = (a constant or parameter)",
                        scope[i].table.as_ref().unwrap().name
                    )),
                };
            }
            Some((_, KeyValue::Param(n))) => ShardTarget::Param { index: *n },
            Some((_, KeyValue::Default)) => unreachable!("a WHERE clause never pins a key to a column default"),
            Some((_, KeyValue::Literal(text))) => match hash::hash_text(key_type, text) {
                Ok(h) => ShardTarget::Shard(hash::shard_index(hash::row_hash(Some(h)), shards)),
                Err(e) => return not_supported(format!("could not compute the shard for the value '{text}': {}", e.0)),
            },
        };
        match &target {
            None => target = Some(this),
            Some(existing) if *existing == this => {}
            Some(_) => return not_supported("queries whose tables are pinned to different shards are not supported yet"),
        }
    }
    router(command, target.unwrap(), Some(anchor), template)
}

/// `dist_col = NULL` is never true, so any one shard gives the right (empty) answer.
fn router_for_null_key(command: Command, anchor: Arc<DistributedTable>, template: ShardTemplate) -> Plan {
    router(command, ShardTarget::Shard(0), Some(anchor), template)
}

fn plan_insert(insert: &protobuf::InsertStmt, node: &NodeEnum, template: ShardTemplate, catalog: &Catalog) -> Plan {
    let Some(table) = insert.relation.as_ref().and_then(|r| resolve_range_var(r, catalog)).cloned() else {
        return not_supported("INSERT into a local table that reads distributed tables is not supported yet");
    };
    if insert.with_clause.is_some() {
        return not_supported("INSERT with a WITH clause into a distributed table is not supported yet");
    }
    let rows: Vec<&[protobuf::Node]> = match insert.select_stmt.as_deref().and_then(|s| s.node.as_ref()) {
        Some(NodeEnum::SelectStmt(s)) if !s.values_lists.is_empty() && s.from_clause.is_empty() => s
            .values_lists
            .iter()
            .filter_map(|l| match l.node.as_ref() {
                Some(NodeEnum::List(items)) => Some(items.items.as_slice()),
                _ => None,
            })
            .collect(),
        None => Vec::new(),
        Some(_) => return not_supported("INSERT … SELECT into a distributed table is not supported yet"),
    };
    let other_hash_refs = count_hash_references(node, catalog) - usize::from(!table.is_reference());
    if other_hash_refs > 0 {
        return not_supported("INSERT that reads other distributed tables is not supported yet");
    }
    let Distribution::Hash { column, column_type, .. } = &table.distribution else {
        return router(Command::Insert, ShardTarget::Reference, None, template);
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
    let no_key = || Plan::Unsupported(PgError::not_supported("cannot perform an INSERT without a partition column value"));
    if rows.is_empty() {
        return no_key();
    }
    let insert_key = InsertKey { column: column.clone(), position, default_sql: table.key_default.clone() };
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
        match key_value(value.unwrap()) {
            Some(Ok(k)) => keys.push(k),
            Some(Err(e)) => return Plan::Unsupported(e),
            None => return not_supported("the distribution column value of an INSERT must be a constant or a parameter"),
        }
    }
    let shards = table.shard_count();
    let mut literal_shards = Vec::new();
    for k in &keys {
        match k {
            KeyValue::Literal(text) => match hash::hash_text(*column_type, text) {
                Ok(h) => literal_shards.push(hash::shard_index(hash::row_hash(Some(h)), shards)),
                Err(e) => return not_supported(format!("could not compute the shard for the value '{text}': {}", e.0)),
            },
            KeyValue::Param(_) | KeyValue::Default => {}
        }
    }
    let target = if literal_shards.len() == keys.len() && literal_shards.iter().all(|s| *s == literal_shards[0]) {
        ShardTarget::Shard(literal_shards[0])
    } else if let [KeyValue::Param(index)] = keys.as_slice() {
        ShardTarget::Param { index: *index }
    } else {
        ShardTarget::InsertRows(keys)
    };
    router_with_key(Command::Insert, target, Some(table), template, Some(insert_key))
}
