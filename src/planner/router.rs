//! Router planning: a SELECT/INSERT/UPDATE/DELETE whose distributed tables are
//! co-located and pinned to one shard group by `dist_col = constant/$n` (directly
//! or through equality joins on the distribution columns) runs whole on the one
//! node that holds that shard group. Fast path and router tiers share this code:
//! the fast path is the one-table case whose shard SQL is prepared once per worker
//! connection.

use super::keys::*;
use super::rewrite::ShardTemplate;
use super::{count_hash_references, is_equals, not_supported, resolve_range_var, Plan};
use crate::error::{PgError, PgResult};
use crate::hash::HashType;
use crate::metadata::{Catalog, DistributedTable, Distribution};
use pg_query::protobuf::{self, a_const, AExprKind, BoolExprType, JoinType};
use pg_query::NodeEnum;
use std::borrow::Cow;
use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, OnceLock};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Command {
    Select,
    Insert,
    Update,
    Delete,
    Merge,
    /// A statement run unchanged on one worker, over its worker-side
    /// relations: one that runs user code reaching distributed tables (a
    /// call of such a function, a procedure, a DO block), or a WITH query
    /// that writes where one shard group cannot answer it. It may write
    /// anywhere, so it counts as a write.
    WholeOnWorker,
}

impl Command {
    /// The command tag's first word.
    pub fn tag(self) -> &'static str {
        match self {
            Command::Select => "SELECT",
            Command::Insert => "INSERT 0",
            Command::Update => "UPDATE",
            Command::Delete => "DELETE",
            Command::Merge => "MERGE",
            Command::WholeOnWorker => "SELECT",
        }
    }
}

/// Where an INSERT's distribution-column value goes, for rows whose value the
/// coordinator fills in from the column default; and the other columns it
/// fills in. For a reference table `column` is empty.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InsertKey {
    /// The table inserted into: its oid and name.
    pub table: (u32, String),
    pub column: String,
    /// Position in each VALUES row; None when the column list leaves it out.
    pub position: Option<usize>,
    /// SQL evaluating the default, e.g. `nextval('t_id_seq'::regclass)`.
    pub default_sql: Option<String>,
    /// Other columns whose sequence default the statement leaves to it.
    pub fills: Vec<SequenceFill>,
    /// The statement's VALUES rows.
    pub rows: usize,
}

/// Values the coordinator computed for an INSERT's defaulted columns.
#[derive(Debug, Default)]
pub struct FilledValues {
    /// (VALUES row, value) of the distribution column.
    pub key: Vec<(usize, String)>,
    /// For each of the plan's `fills`, a value per row it lists, in order.
    pub others: Vec<Vec<String>>,
}

impl FilledValues {
    pub fn is_empty(&self) -> bool {
        self.key.is_empty() && self.others.iter().all(Vec::is_empty)
    }
}

/// A column, other than the distribution column, whose default draws from a
/// sequence in the coordinator database, and the VALUES rows that leave it to
/// that default.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SequenceFill {
    pub column: String,
    /// Position in each VALUES row; None when the column list leaves it out.
    pub position: Option<usize>,
    pub default_sql: String,
    pub rows: Vec<usize>,
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
    /// The distribution-key value that pins the statement to its shard
    /// group: the tenant its statistics count it for.
    pub tenant: Option<KeyValue>,
    /// Deparsed SQL per shard group, filled on first use.
    shard_sql: Vec<OnceLock<Arc<str>>>,
    /// Deparsed SQL of a multi-row INSERT's part for one shard group, by
    /// (group, which of the first 64 VALUES rows it keeps): deparsing is most
    /// of the coordinator's work for such a statement, and the same split
    /// recurs (always, with literal keys).
    insert_rows_sql: Mutex<HashMap<(u32, u64), Arc<str>>>,
}

/// Splits of a multi-row INSERT remembered per plan, at most.
pub(super) const INSERT_SPLITS_CACHED: usize = 256;

impl fmt::Display for RouterPlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?} ", self.command)?;
        match &self.target {
            ShardTarget::Reference => write!(f, "reference"),
            ShardTarget::Shard(i) => write!(f, "shard {i}"),
            ShardTarget::Key(KeyValue::Param(index)) => write!(f, "shard of ${}", index + 1),
            ShardTarget::Key(k) => write!(f, "shard of {k:?}"),
            ShardTarget::InsertRows(rows) => write!(f, "{} rows", rows.len()),
            ShardTarget::SameKeys(keys) => write!(f, "shard of all of {keys:?}"),
            ShardTarget::AnyNode(_) => write!(f, "any node"),
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
    /// the values the coordinator computed written in.
    pub fn insert_rows_sql(&self, index: u32, rows: &[usize], filled: &FilledValues) -> PgResult<Arc<str>> {
        // Row sets are cached by bitmask, so only those of the first 64 rows.
        let key = (filled.is_empty() && rows.iter().all(|&r| r < 64)).then(|| (index, rows.iter().fold(0u64, |mask, &r| mask | (1u64 << r))));
        if let Some(key) = &key {
            if let Some(sql) = self.insert_rows_sql.lock().unwrap().get(key) {
                return Ok(sql.clone());
            }
        }
        let sql: Arc<str> = Arc::from(self.deparse_insert_rows(index, rows, filled)?);
        if let Some(key) = key {
            let mut cache = self.insert_rows_sql.lock().unwrap();
            if cache.len() < INSERT_SPLITS_CACHED {
                cache.insert(key, sql.clone());
            }
        }
        Ok(sql)
    }

    fn deparse_insert_rows(&self, index: u32, rows: &[usize], filled: &FilledValues) -> PgResult<String> {
        let Some(key) = self.insert_key.as_ref() else { return self.template.sql_for_shard(index) };
        let constant = |value: &str| protobuf::Node {
            node: Some(NodeEnum::AConst(protobuf::AConst {
                isnull: false,
                val: Some(a_const::Val::Sval(protobuf::String { sval: value.to_string() })),
                location: -1,
            })),
        };
        let column = |name: &str| protobuf::Node {
            node: Some(NodeEnum::ResTarget(Box::new(protobuf::ResTarget { name: name.to_string(), indirection: vec![], val: None, location: -1 }))),
        };
        // Each filled column: where its value goes, and its value per row.
        let mut columns: Vec<(Option<usize>, HashMap<usize, &str>)> = Vec::new();
        if !filled.key.is_empty() {
            columns.push((key.position, filled.key.iter().map(|(row, v)| (*row, v.as_str())).collect()));
        }
        for (fill, values) in key.fills.iter().zip(&filled.others) {
            columns.push((fill.position, fill.rows.iter().copied().zip(values.iter().map(String::as_str)).collect()));
        }
        let appended: Vec<&str> = std::iter::once((&key.column, key.position, !filled.key.is_empty()))
            .chain(key.fills.iter().map(|f| (&f.column, f.position, true)))
            .filter(|(_, position, used)| *used && position.is_none())
            .map(|(name, _, _)| name.as_str())
            .collect();
        let append_columns = |insert: &mut protobuf::InsertStmt| insert.cols.extend(appended.iter().map(|name| column(name)));
        self.template.insert_rows_sql(index, rows, append_columns, |i, row| {
            let Some(NodeEnum::List(items)) = row.node.as_mut() else { return };
            // In place first: appended values go after the row's own.
            for (position, values) in &columns {
                if let (Some(p), Some(value)) = (position, values.get(&i)) {
                    items.items[*p] = constant(value);
                }
            }
            for (position, values) in &columns {
                if let (None, Some(value)) = (position, values.get(&i)) {
                    items.items.push(constant(value));
                }
            }
        })
    }

    /// How this statement's key values find their shard group (None without a
    /// hash-distributed table). An INSERT stores its values, so they convert
    /// as assignments do.
    pub fn key_routing(&self) -> Option<KeyRouting<'_>> {
        KeyRouting::new(self.anchor.as_deref()?, self.command == Command::Insert)
    }
}

/// A FROM-clause entry visible to the statement's top-level expressions.
pub(super) struct ScopeEntry {
    /// The alias, or the table name when there is none.
    pub(super) name: String,
    pub(super) table: Option<Arc<DistributedTable>>,
    /// On the nullable side of an outer join: its columns may be NULL in
    /// rows of other shard groups too.
    nullable: bool,
}

pub(super) fn router(command: Command, target: ShardTarget, anchor: Option<Arc<DistributedTable>>, template: ShardTemplate) -> Plan {
    router_with_key(command, target, anchor, template, None, None)
}

pub(super) fn router_with_key(
    command: Command,
    target: ShardTarget,
    anchor: Option<Arc<DistributedTable>>,
    template: ShardTemplate,
    insert_key: Option<InsertKey>,
    tenant: Option<KeyValue>,
) -> Plan {
    let tenant = tenant.or_else(|| match &target {
        ShardTarget::Key(key) => Some(key.clone()),
        _ => None,
    });
    let tenant = tenant.filter(|key| !matches!(key, KeyValue::Default) && anchor.is_some());
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
        tenant,
        shard_sql: (0..groups).map(|_| OnceLock::new()).collect(),
        insert_rows_sql: Mutex::default(),
    }))
}

/// A write to every placement of the reference tables it names.
pub(super) fn reference_write(command: Command, template: ShardTemplate) -> Plan {
    router(command, ShardTarget::Reference, None, template)
}

pub(super) fn route_if_reference_only(command: Command, template: ShardTemplate, tables: &[Arc<DistributedTable>]) -> Option<Plan> {
    tables.iter().all(|t| t.is_reference()).then(|| router(command, ShardTarget::Reference, None, template))
}

pub(super) fn scope_entry(rv: &protobuf::RangeVar, catalog: &Catalog) -> ScopeEntry {
    let name = rv.alias.as_ref().map(|a| a.aliasname.clone()).unwrap_or_else(|| rv.relname.clone());
    ScopeEntry { name, table: resolve_range_var(rv, catalog).cloned(), nullable: false }
}

/// Walks a FROM list: tables enter the scope, and join conditions become
/// conjuncts. Returns whether an outer join preserves rows of something other
/// than a distributed table (a reference table, a subquery): run per shard, such
/// rows would come back once per shard.
pub(super) fn collect_from<'a>(
    items: &'a [protobuf::Node],
    catalog: &Catalog,
    scope: &mut Vec<ScopeEntry>,
    conjuncts: &mut Vec<Conjunct<'a>>,
) -> bool {
    collect_joined(items, catalog, scope, conjuncts, false)
}

/// `collect_from` for items that are, when `nullable`, on the nullable side
/// of an outer join. An inner join's ON clause restricts the statement's rows
/// as WHERE does, so its constants pin tables, unless the join sits on such a
/// side: its rows may then be replaced by NULLs, and the tables its equalities
/// tie to the preserved side are not restricted. An outer join's own ON clause
/// restricts only its nullable side, so only its equalities between columns
/// count (they tie tables pinned by conditions on the result).
pub(super) fn collect_joined<'a>(
    items: &'a [protobuf::Node],
    catalog: &Catalog,
    scope: &mut Vec<ScopeEntry>,
    conjuncts: &mut Vec<Conjunct<'a>>,
    nullable: bool,
) -> bool {
    let mut replicated_preserved = false;
    for item in items {
        match item.node.as_ref() {
            Some(NodeEnum::RangeVar(rv)) => scope.push(ScopeEntry { nullable, ..scope_entry(rv, catalog) }),
            Some(NodeEnum::JoinExpr(j)) => {
                let join_type = JoinType::from_i32(j.jointype);
                let side_nullable = match join_type {
                    Some(JoinType::JoinInner) => [nullable; 2],
                    Some(JoinType::JoinLeft) => [nullable, true],
                    Some(JoinType::JoinRight) => [true, nullable],
                    _ => [true; 2],
                };
                let mut replicated = [false; 2];
                let mut sides = [0..0, 0..0];
                for (side, arg) in [j.larg.as_deref(), j.rarg.as_deref()].into_iter().enumerate() {
                    let Some(arg) = arg else { continue };
                    let before = scope.len();
                    replicated_preserved |= collect_joined(std::slice::from_ref(arg), catalog, scope, conjuncts, side_nullable[side]);
                    // A side with a distributed table has each of its rows
                    // in one shard group (its own outer joins were judged
                    // as it was collected).
                    replicated[side] = !scope[before..].iter().any(|e| e.table.as_ref().is_some_and(|t| !t.is_reference()));
                    sides[side] = before..scope.len();
                }
                using_equalities(j, scope, &sides, conjuncts);
                replicated_preserved |= match join_type {
                    Some(JoinType::JoinLeft) => replicated[0],
                    Some(JoinType::JoinRight) => replicated[1],
                    Some(JoinType::JoinFull) => replicated[0] || replicated[1],
                    _ => false,
                };
                if let Some(q) = j.quals.as_deref() {
                    flatten_and(q, conjuncts, join_type == Some(JoinType::JoinInner) && !nullable);
                }
            }
            Some(NodeEnum::RangeSubselect(sub)) => {
                let name = sub.alias.as_ref().map(|a| a.aliasname.clone()).unwrap_or_default();
                scope.push(ScopeEntry { name, table: None, nullable });
            }
            Some(NodeEnum::RangeFunction(f)) => {
                let name = f.alias.as_ref().map(|a| a.aliasname.clone()).unwrap_or_default();
                scope.push(ScopeEntry { name, table: None, nullable });
            }
            _ => {}
        }
    }
    replicated_preserved
}

/// The references to a distribution column whose value a row of a
/// co-located join takes from its shard group: the key of every table in
/// the FROM list but those on an outer join's nullable side (there a NULL
/// stands in rows of every shard group). Unqualified names only when every
/// table's columns are known and each one with that column has it as key.
pub(super) fn shard_keys(scope: &[ScopeEntry]) -> super::multi_shard::ShardKeys {
    let key = |e: &ScopeEntry| match e.table.as_deref().map(|t| &t.distribution) {
        Some(Distribution::Hash { column, .. }) if !e.nullable => Some(column.clone()),
        _ => None,
    };
    let qualified: Vec<(String, String)> = scope.iter().filter_map(|e| Some((e.name.clone(), key(e)?))).collect();
    let mut unqualified: Vec<String> = Vec::new();
    if scope.iter().all(|e| e.table.is_some()) {
        for (_, column) in &qualified {
            let having = scope.iter().filter(|e| e.table.as_ref().is_some_and(|t| t.columns.contains(column)));
            if having.into_iter().all(|e| key(e).as_deref() == Some(column.as_str())) && !unqualified.contains(column) {
                unqualified.push(column.clone());
            }
        }
    }
    super::multi_shard::ShardKeys { qualified, unqualified }
}

/// `JOIN … USING (c)` means `left.c = right.c`: written out as a conjunct when
/// each side has exactly one table with a column `c` (and nothing else whose
/// columns are unknown).
pub(super) fn using_equalities(j: &protobuf::JoinExpr, scope: &[ScopeEntry], sides: &[std::ops::Range<usize>; 2], conjuncts: &mut Vec<Conjunct<'_>>) {
    for column in j.using_clause.iter().filter_map(|n| match n.node.as_ref() {
        Some(NodeEnum::String(s)) => Some(s.sval.as_str()),
        _ => None,
    }) {
        let owner = |range: &std::ops::Range<usize>| {
            let entries = &scope[range.clone()];
            if entries.iter().any(|e| e.table.is_none()) {
                return None;
            }
            let mut having = entries.iter().filter(|e| e.table.as_ref().is_some_and(|t| t.columns.iter().any(|c| c == column)));
            match (having.next(), having.next()) {
                (Some(e), None) => Some(e.name.clone()),
                _ => None,
            }
        };
        if let (Some(left), Some(right)) = (owner(&sides[0]), owner(&sides[1])) {
            let column_ref = |table: &str| super::column_ref(&[table, column]);
            conjuncts.push(Conjunct { left: Cow::Owned(column_ref(&left)), right: Cow::Owned(column_ref(&right)), may_pin_constant: false });
        }
    }
}

/// An equality found among the top-level ANDed conditions.
pub(super) struct Conjunct<'a> {
    pub(super) left: Cow<'a, protobuf::Node>,
    pub(super) right: Cow<'a, protobuf::Node>,
    /// False for conditions whose constants do not restrict the statement's
    /// rows: an outer join's ON clause (and any join's on its nullable side),
    /// MERGE's join condition.
    may_pin_constant: bool,
}

pub(super) fn flatten_and<'a>(node: &'a protobuf::Node, out: &mut Vec<Conjunct<'a>>, may_pin_constant: bool) {
    match node.node.as_ref() {
        Some(NodeEnum::BoolExpr(b)) if b.boolop == BoolExprType::AndExpr as i32 => {
            for arg in &b.args {
                flatten_and(arg, out, may_pin_constant);
            }
        }
        Some(NodeEnum::AExpr(e)) if e.kind == AExprKind::AexprOp as i32 && is_equals(&e.name) => {
            if let (Some(l), Some(r)) = (e.lexpr.as_deref(), e.rexpr.as_deref()) {
                out.push(Conjunct { left: Cow::Borrowed(l), right: Cow::Borrowed(r), may_pin_constant });
            }
        }
        _ => {}
    }
}

/// The scope entry whose distribution column a column reference names.
pub(super) fn dist_column_owner(node: &protobuf::Node, scope: &[ScopeEntry]) -> Option<usize> {
    let Some(NodeEnum::ColumnRef(c)) = node.node.as_ref() else { return None };
    let parts = super::column_ref_names(c)?;
    let is_key =
        |e: &ScopeEntry, col: &str| matches!(e.table.as_deref().map(|t| &t.distribution), Some(Distribution::Hash { column, .. }) if column == col);
    match parts.as_slice() {
        [col] => {
            let owners: Vec<usize> = scope.iter().enumerate().filter(|(_, e)| is_key(e, col)).map(|(i, _)| i).collect();
            (owners.len() == 1).then(|| owners[0])
        }
        [qual, col] => scope.iter().position(|e| e.name == *qual && is_key(e, col)),
        [schema, table, col] => {
            scope.iter().position(|e| e.table.as_ref().is_some_and(|t| t.schema == *schema && t.name == *table && e.name == t.name) && is_key(e, col))
        }
        _ => None,
    }
}

/// Union-find over scope entries joined on their distribution columns.
pub(super) fn find(parent: &mut [usize], i: usize) -> usize {
    let mut root = i;
    while parent[root] != root {
        root = parent[root];
    }
    parent[i] = root;
    root
}

pub(super) fn plan_pinned(
    command: Command,
    node: &NodeEnum,
    scope: Vec<ScopeEntry>,
    conjuncts: &[Conjunct],
    template: ShardTemplate,
    catalog: &Catalog,
    replicated_preserved: bool,
) -> Plan {
    let hash_entries: Vec<usize> =
        scope.iter().enumerate().filter(|(_, e)| e.table.as_ref().is_some_and(|t| !t.is_reference())).map(|(i, _)| i).collect();
    // Subqueries naming distributed tables route with the statement when
    // each reads one shard group by its own conditions.
    let mut nested = Nested::default();
    let references = count_hash_references(node, catalog);
    if references != hash_entries.len() {
        match nested_parts(node, catalog, &scope, conjuncts) {
            Some(found) if found.tables.len() + hash_entries.len() == references => nested = found,
            _ => {
                if let (Command::Select, NodeEnum::SelectStmt(select)) = (command, node) {
                    if let Some(anchor) = super::per_shard_subquery::anchor(select, references, &scope, replicated_preserved, catalog) {
                        return super::multi_shard::plan_select(select, anchor, template, &super::multi_shard::ShardKeys::default(), catalog);
                    }
                }
                return not_supported("subqueries over distributed tables are only supported when each reads one shard group, pinned by its own conditions on the distribution column or joined on it to a table of the query around it; a query must otherwise name its distributed tables in the top-level FROM clause");
            }
        }
    }
    let Nested { tables: nested_tables, pins: nested_pins } = nested;
    // Subqueries joined to the group on its distribution column read the
    // same shard group as each of its rows.
    let nested_pinned = !nested_pins.is_empty();
    let anchor = match (hash_entries.first(), nested_tables.first()) {
        (Some(&i), _) => scope[i].table.clone().unwrap(),
        (None, Some(table)) => table.clone(),
        (None, None) => return router(command, ShardTarget::Reference, None, template),
    };
    let tables = hash_entries.iter().map(|&i| scope[i].table.as_ref().unwrap()).chain(nested_tables.iter());
    if tables.into_iter().any(|t| t.colocation_id != anchor.colocation_id) {
        return not_supported("joins between distributed tables that are not co-located are not supported yet");
    }
    let groups = match pinning(&scope, conjuncts, &hash_entries) {
        Pinning::NullKey => return router_for_null_key(command, anchor, template),
        Pinning::Groups(groups) => groups,
    };
    // Every distributed table must be pinned, through its own group's key.
    let mut target: Option<ShardTarget> = None;
    let mut keys: Vec<KeyValue> = Vec::new();
    let mut keys_differ = false;
    for (i, pin) in groups.iter().map(|g| (g.entry, g.pin.clone())).chain(nested_pins.into_iter().map(|pin| (usize::MAX, Some(pin)))) {
        let (this, key) = match pin {
            Some(pin) => pin,
            None => {
                let one_group = groups.len() == 1 && !nested_pinned;
                return match node {
                    NodeEnum::SelectStmt(_) if replicated_preserved => {
                        not_supported("outer joins that keep rows of reference tables or subqueries across shards are not supported yet")
                    }
                    NodeEnum::SelectStmt(select) if one_group => super::multi_shard::plan_select(select, anchor, template, &shard_keys(&scope), catalog),
                    NodeEnum::SelectStmt(_) if one_group || !nested_tables.is_empty() => {
                        not_supported("a query whose subqueries read one shard group must read only that group at the top level too")
                    }
                    NodeEnum::SelectStmt(_) => not_supported("joins between distributed tables that are not on their distribution columns are not supported yet"),
                    NodeEnum::UpdateStmt(_) | NodeEnum::DeleteStmt(_) | NodeEnum::MergeStmt(_) if one_group && !replicated_preserved => {
                        super::multi_shard::plan_modify(command, anchor, template)
                    }
                    _ => not_supported(format!(
                        "UPDATE and DELETE across several shards of distributed table \"{}\" are only supported when every distributed table they join is co-located and joined on its distribution column",
                        scope[i].table.as_ref().unwrap().name
                    )),
                };
            }
        };
        keys.push(key);
        match &target {
            None => target = Some(this),
            Some(existing) if *existing == this => {}
            Some(ShardTarget::Shard(_)) if matches!(this, ShardTarget::Shard(_)) => {
                return not_supported("queries whose tables are pinned to different shards are not supported yet")
            }
            // Known per execution: the values may still meet in one group.
            Some(_) => keys_differ = true,
        }
    }
    let tenant = keys.first().cloned();
    let target = if keys_differ { ShardTarget::SameKeys(keys) } else { target.unwrap() };
    router_with_key(command, target, Some(anchor), template, None, tenant)
}

/// How one query level's distributed tables are pinned.
pub(super) enum Pinning {
    /// Per group of tables joined on their distribution columns.
    Groups(Vec<Group>),
    /// A distribution column is compared with NULL: no row qualifies.
    NullKey,
}

pub(super) struct Group {
    /// One of its scope entries.
    entry: usize,
    /// The first pin found for it (target, key value).
    pin: Option<(ShardTarget, KeyValue)>,
    /// For a subquery's group: joined on its distribution column to a
    /// table of the query around it (so it reads, for each row of that
    /// query, the shard group of that row).
    follows: bool,
}

pub(super) fn pinning(scope: &[ScopeEntry], conjuncts: &[Conjunct], hash_entries: &[usize]) -> Pinning {
    pinning_within(scope, conjuncts, hash_entries, &[], &[])
}

/// `pinning` for a subquery inside a query whose scope is `outer`: a group
/// also follows an outer table when one of its tables' distribution column
/// equals that table's (`sub.key = outer_alias.key` among its conditions),
/// or when it holds one of the entries `given` (joined so by the caller).
pub(super) fn pinning_within(scope: &[ScopeEntry], conjuncts: &[Conjunct], hash_entries: &[usize], outer: &[ScopeEntry], given: &[usize]) -> Pinning {
    let mut parent: Vec<usize> = (0..scope.len()).collect();
    let mut pins: Vec<(usize, ShardTarget, KeyValue)> = Vec::new();
    let mut joined: Vec<usize> = given.to_vec();
    for c in conjuncts {
        let (l, r) = (dist_column_owner(&c.left, scope), dist_column_owner(&c.right, scope));
        match (l, r) {
            (Some(a), Some(b)) => {
                let (ra, rb) = (find(&mut parent, a), find(&mut parent, b));
                parent[ra] = rb;
            }
            (Some(owner), None) | (None, Some(owner)) if c.may_pin_constant => {
                let other: &protobuf::Node = if l.is_some() { &c.right } else { &c.left };
                if outer_dist_column_owner(other, scope, outer).is_some() {
                    joined.push(owner);
                    continue;
                }
                let Some(Distribution::Hash { key, column_type, .. }) = scope[owner].table.as_ref().map(|t| &t.distribution) else { continue };
                let shards = scope[owner].table.as_ref().map(|t| t.shard_count()).unwrap_or(1);
                match key_value(other, key) {
                    Some(Ok(v)) => {
                        if let Some(target) = pin_target(&v, *column_type, key, shards) {
                            pins.push((owner, target, v));
                        }
                    }
                    Some(Err(_)) => return Pinning::NullKey,
                    None => {}
                }
            }
            _ => {}
        }
    }
    let mut groups = Vec::new();
    let mut roots_done: Vec<usize> = Vec::new();
    for &i in hash_entries {
        let root = find(&mut parent, i);
        if roots_done.contains(&root) {
            continue;
        }
        roots_done.push(root);
        let pin = pins.iter().find(|(owner, _, _)| find(&mut parent, *owner) == root).map(|(_, target, key)| (target.clone(), key.clone()));
        let follows = joined.iter().any(|&entry| find(&mut parent, entry) == root);
        groups.push(Group { entry: i, pin, follows });
    }
    Pinning::Groups(groups)
}

/// The outer scope entry whose distribution column `node` names, when it is
/// a column reference that no entry of `scope` (the subquery's own) can
/// take: `o.tenant` in a subquery that has no `o`, or `o_tenant` in one
/// whose tables are all known and have no such column (TPC-H style names).
pub(super) fn outer_dist_column_owner(node: &protobuf::Node, scope: &[ScopeEntry], outer: &[ScopeEntry]) -> Option<usize> {
    let Some(NodeEnum::ColumnRef(c)) = node.node.as_ref() else { return None };
    let parts = super::column_ref_names(c)?;
    let taken_inside = match parts.as_slice() {
        [qualifier, _] => scope.iter().any(|e| e.name == *qualifier),
        [column] => scope.iter().any(|e| e.table.as_ref().is_none_or(|t| t.columns.iter().any(|c| c == column))),
        _ => true,
    };
    if taken_inside {
        return None;
    }
    dist_column_owner(node, outer)
}

/// The distributed tables and pins of the SELECTs nested in a statement
/// (subqueries in FROM, conditions and the target list; CTEs), each judged
/// by its own FROM and WHERE: None unless every one of them pins all the
/// distributed tables it names (so that it reads one shard group).
/// Correlation with the outer query does not matter then: the subquery's
/// rows all live in that group.
pub(super) fn nested_pins(node: &NodeEnum, catalog: &Catalog) -> Option<(Vec<Arc<DistributedTable>>, Vec<Pin>)> {
    nested_parts(node, catalog, &[], &[]).map(|n| (n.tables, n.pins))
}

/// What the statements nested in a query read.
#[derive(Default)]
pub(super) struct Nested {
    tables: Vec<Arc<DistributedTable>>,
    /// The pins of the groups pinned by their own conditions.
    pins: Vec<Pin>,
}

/// A shard group pinned by conditions, with the key value that pins it.
pub(super) type Pin = (ShardTarget, KeyValue);

/// `nested_pins` for a statement whose top level has scope `outer`: a
/// subquery's group may instead follow a distributed table of the top level,
/// joined to it on the distribution column, by a condition
/// (`WHERE o.tenant = c.tenant` in an EXISTS, a scalar subquery, a LATERAL
/// join), for `c.tenant IN (SELECT o.tenant …)` at the top level by the IN
/// itself, and for a subquery in the top-level FROM by a top-level condition
/// (`outer_conjuncts`) on the column it returns (`s.tenant = c.tenant`).
/// Such a subquery reads, for each row of the top level, that row's shard
/// group, which the statement's routing or its shard-by-shard execution
/// already gives it. None unless every group is pinned or follows.
pub(super) fn nested_parts(node: &NodeEnum, catalog: &Catalog, outer: &[ScopeEntry], outer_conjuncts: &[Conjunct]) -> Option<Nested> {
    let mut copy = node.clone();
    let mut statements = Vec::new();
    collect_nested(&mut copy, true, &mut statements);
    let mut nested = Nested::default();
    for (part, place) in &statements {
        let mut scope = Vec::new();
        let mut conjuncts = Vec::new();
        // An UPDATE or DELETE in a WITH clause is pinned by its own target
        // and conditions, like a subquery.
        let (target, from, condition) = match part {
            NodeEnum::SelectStmt(s) => (None, &s.from_clause, &s.where_clause),
            NodeEnum::UpdateStmt(u) => {
                if sets_distribution_column(u, catalog) {
                    return None;
                }
                (u.relation.as_ref(), &u.from_clause, &u.where_clause)
            }
            NodeEnum::DeleteStmt(d) => (d.relation.as_ref(), &d.using_clause, &d.where_clause),
            _ => unreachable!("only statements are collected"),
        };
        scope.extend(target.map(|rel| scope_entry(rel, catalog)));
        collect_from(from, catalog, &mut scope, &mut conjuncts);
        if let Some(w) = condition.as_deref() {
            flatten_and(w, &mut conjuncts, true);
        }
        let given: Vec<usize> = match (part, place) {
            (NodeEnum::SelectStmt(select), NestedPlace::InTest(test)) => {
                dist_column_owner(test, outer).and_then(|_| keyed_output(select, &scope, None, catalog)).into_iter().collect()
            }
            (NodeEnum::SelectStmt(select), NestedPlace::InFrom(alias)) => outer_conjuncts
                .iter()
                .filter_map(|c| {
                    let (column, other) =
                        [(&c.left, &c.right), (&c.right, &c.left)].into_iter().find_map(|(a, b)| Some((column_of(a, alias)?, b)))?;
                    dist_column_owner(other, outer)?;
                    keyed_output(select, &scope, Some(&column), catalog)
                })
                .collect(),
            _ => Vec::new(),
        };
        let hash_entries: Vec<usize> =
            scope.iter().enumerate().filter(|(_, e)| e.table.as_ref().is_some_and(|t| !t.is_reference())).map(|(i, _)| i).collect();
        let Pinning::Groups(groups) = pinning_within(&scope, &conjuncts, &hash_entries, outer, &given) else { return None };
        for group in groups {
            match (group.pin, group.follows) {
                (Some(pin), _) => nested.pins.push(pin),
                (None, true) => {}
                (None, false) => return None,
            }
        }
        nested.tables.extend(hash_entries.iter().filter_map(|&i| scope[i].table.clone()));
    }
    Some(nested)
}

/// Where a nested statement is, as far as joining it to the top level goes.
pub(super) enum NestedPlace {
    /// The subquery of `test IN (…)` in the top-level statement's own
    /// expressions.
    InTest(Box<protobuf::Node>),
    /// A subquery in the top-level FROM clause, under this alias.
    InFrom(String),
    Elsewhere,
}

/// Collects the statements nested in `node` (not `node` itself) with where
/// they are; `top` while in the top-level statement's own clauses. Each is
/// taken out of the tree as it is found, its own nested statements first,
/// so that what is collected of it is its own level alone.
pub(super) fn collect_nested(node: &mut NodeEnum, top: bool, out: &mut Vec<(NodeEnum, NestedPlace)>) {
    let mut root = true;
    crate::walk::visit_mut(node, &mut |n| {
        if std::mem::take(&mut root) {
            return;
        }
        let (statement, place) = match n {
            NodeEnum::SubLink(link) => {
                let is_in =
                    link.sub_link_type == protobuf::SubLinkType::AnySublink as i32 && (link.oper_name.is_empty() || is_equals(&link.oper_name));
                let place = match link.testexpr.as_deref() {
                    Some(test) if top && is_in => NestedPlace::InTest(Box::new(test.clone())),
                    _ => NestedPlace::Elsewhere,
                };
                (link.subselect.take().and_then(|s| s.node), place)
            }
            NodeEnum::RangeSubselect(r) => {
                let place = match &r.alias {
                    Some(alias) if top => NestedPlace::InFrom(alias.aliasname.clone()),
                    _ => NestedPlace::Elsewhere,
                };
                (r.subquery.take().and_then(|s| s.node), place)
            }
            NodeEnum::SelectStmt(_) | NodeEnum::UpdateStmt(_) | NodeEnum::DeleteStmt(_) => {
                (Some(std::mem::replace(n, NodeEnum::SelectStmt(Box::default()))), NestedPlace::Elsewhere)
            }
            _ => (None, NestedPlace::Elsewhere),
        };
        if let Some(mut statement) = statement {
            collect_nested(&mut statement, false, out);
            out.push((statement, place));
        }
    });
}

/// The column `alias.column` names, when `node` is such a reference.
pub(super) fn column_of(node: &protobuf::Node, alias: &str) -> Option<String> {
    let Some(NodeEnum::ColumnRef(c)) = node.node.as_ref() else { return None };
    match super::column_ref_names(c)?.as_slice() {
        [qualifier, column] if *qualifier == alias => Some(column.to_string()),
        _ => None,
    }
}

/// The scope entry whose distribution column a subquery returns as its
/// output `column` (its only output when None), row for row as that table
/// has it: no aggregate over several keys (a GROUP BY, if any, has the
/// key), no LIMIT or OFFSET, no window function, no DISTINCT ON, no set
/// operation. Then each shard group holds the subquery's rows for its own
/// keys.
pub(super) fn keyed_output(select: &protobuf::SelectStmt, scope: &[ScopeEntry], column: Option<&str>, catalog: &Catalog) -> Option<usize> {
    let targets: Vec<&protobuf::ResTarget> = select
        .target_list
        .iter()
        .filter_map(|t| match t.node.as_ref() {
            Some(NodeEnum::ResTarget(r)) => Some(r.as_ref()),
            _ => None,
        })
        .collect();
    let target = match column {
        None if targets.len() == 1 => targets[0],
        None => return None,
        Some(column) => *targets.iter().find(|t| {
            let named = match t.val.as_deref().and_then(|v| v.node.as_ref()) {
                Some(NodeEnum::ColumnRef(c)) if t.name.is_empty() => super::column_ref_names(c).and_then(|n| n.last().map(|l| l.to_string())),
                _ => None,
            };
            t.name == column || named.as_deref() == Some(column)
        })?,
    };
    let returned = target.val.as_deref()?;
    let entry = dist_column_owner(returned, scope)?;
    let (_, windowed) = super::multi_shard::calls_in(select, catalog);
    let rowwise = select.op == protobuf::SetOperation::SetopNone as i32
        && select.limit_count.is_none()
        && select.limit_offset.is_none()
        && select.window_clause.is_empty()
        && !windowed
        && select.distinct_clause.iter().all(|n| n.node.is_none())
        && (select.group_clause.is_empty()
            || select.group_clause.iter().any(|g| {
                // GROUP BY 1 names the first output.
                let grouped = match g.node.as_ref() {
                    Some(NodeEnum::AConst(c)) => match &c.val {
                        Some(a_const::Val::Ival(i)) => usize::try_from(i.ival - 1).ok().and_then(|i| targets.get(i)).and_then(|t| t.val.as_deref()),
                        _ => None,
                    },
                    _ => Some(g),
                };
                grouped.is_some_and(|g| dist_column_owner(g, scope) == Some(entry))
            }))
        && (select.having_clause.is_none() || !select.group_clause.is_empty());
    rowwise.then_some(entry)
}

/// Whether an UPDATE may change a row's distribution column. Setting it to
/// itself (`SET key = t.key`), or to the constant the WHERE clause pins it to
/// (`SET key = 7 … WHERE key = 7`), changes nothing, as Citus also judges.
pub(super) fn sets_distribution_column(update: &protobuf::UpdateStmt, catalog: &Catalog) -> bool {
    let Some(rel) = update.relation.as_ref() else { return false };
    let Some(table) = resolve_range_var(rel, catalog) else { return false };
    let Distribution::Hash { column, .. } = &table.distribution else { return false };
    let name = rel.alias.as_ref().map_or(rel.relname.as_str(), |a| a.aliasname.as_str());
    let is_key = |n: &protobuf::Node| match n.node.as_ref() {
        Some(NodeEnum::ColumnRef(c)) => match super::column_ref_names(c).as_deref() {
            Some([c]) => c == column,
            Some([t, c]) => *t == name && c == column,
            _ => false,
        },
        _ => false,
    };
    let text = |n: &protobuf::Node| n.node.as_ref().and_then(|n| super::deparse::deparse_expression(n).ok());
    let mut pinned_to = Vec::new();
    let mut conjuncts = Vec::new();
    if let Some(w) = update.where_clause.as_deref() {
        flatten_and(w, &mut conjuncts, true);
    }
    let constant = |n: &protobuf::Node| matches!(n.node.as_ref(), Some(NodeEnum::AConst(_) | NodeEnum::TypeCast(_) | NodeEnum::ParamRef(_)));
    for Conjunct { left, right, .. } in &conjuncts {
        if is_key(left) && constant(right) {
            pinned_to.extend(text(right));
        } else if is_key(right) && constant(left) {
            pinned_to.extend(text(left));
        }
    }
    update.target_list.iter().any(|n| match n.node.as_ref() {
        Some(NodeEnum::ResTarget(r)) if r.name == *column => {
            let kept = r.indirection.is_empty() && r.val.as_deref().is_some_and(|v| is_key(v) || text(v).is_some_and(|t| pinned_to.contains(&t)));
            !kept
        }
        _ => false,
    })
}

/// `dist_col = NULL` is never true, so any one shard gives the right (empty) answer.
pub(super) fn router_for_null_key(command: Command, anchor: Arc<DistributedTable>, template: ShardTemplate) -> Plan {
    router(command, ShardTarget::Shard(0), Some(anchor), template)
}
