//! Router planning: a SELECT/INSERT/UPDATE/DELETE whose distributed tables are
//! co-located and pinned to one shard group by `dist_col = constant/$n` (directly
//! or through equality joins on the distribution columns) runs whole on the one
//! node that holds that shard group. Fast path and router tiers share this code:
//! the fast path is the one-table case whose shard SQL is prepared once per worker
//! connection.

use super::rewrite::ShardTemplate;
use super::{count_hash_references, distributed_among, is_equals, not_supported, resolve_range_var, Plan};
use crate::error::{sqlstate, PgError, PgResult};
use crate::hash::{self, HashType};
use crate::metadata::{Catalog, Coercion, DistributedTable, Distribution, KeyType};
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

/// The distribution-column value that picks the shard group.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KeyValue {
    /// A literal in PostgreSQL text form, with the type PostgreSQL gives such a
    /// constant (0 for a quoted string, whose type the column decides);
    /// `cast_to_key` when written as `literal::<key type>`.
    Literal { text: String, type_oid: u32, cast_to_key: bool },
    /// Bind parameter (0-based).
    Param(usize),
    /// Left to the column default (e.g. a serial key): the coordinator evaluates it.
    Default,
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

/// Where a router statement runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ShardTarget {
    /// Only reference tables: reads use one placement, writes every placement.
    Reference,
    /// One shard group, known at planning time.
    Shard(u32),
    /// One shard group, known once the key value (a parameter, or a literal the
    /// coordinator database must first coerce to the column type) is resolved.
    Key(KeyValue),
    /// A multi-row INSERT whose rows may go to different shard groups.
    InsertRows(Vec<KeyValue>),
    /// Tables pinned by different key values (`a.k = $1 AND b.k = $2`, not
    /// joined on their keys): one shard group when all values fall in it,
    /// which the executor checks first (`executor::keys_meet`).
    SameKeys(Vec<KeyValue>),
    /// Any one of these node groups, the statement unchanged: user code runs
    /// over the worker-side relations, which show every node whole tables.
    AnyNode(Vec<i32>),
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
    /// Deparsed SQL of a multi-row INSERT's part for one shard group, by
    /// (group, which of the first 64 VALUES rows it keeps): deparsing is most
    /// of the coordinator's work for such a statement, and the same split
    /// recurs (always, with literal keys).
    insert_rows_sql: Mutex<HashMap<(u32, u64), Arc<str>>>,
}

/// Splits of a multi-row INSERT remembered per plan, at most.
const INSERT_SPLITS_CACHED: usize = 256;

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

/// How values of a table's distribution column find their shard: hashed
/// here when that is exactly what PostgreSQL would do, otherwise converted to
/// the column type by the coordinator database first.
#[derive(Clone, Copy, Debug)]
pub struct KeyRouting<'a> {
    ty: HashType,
    key: &'a KeyType,
    shards: u32,
    /// Values are stored in the column (INSERT, COPY), so the column's type
    /// modifier applies; otherwise they are compared with it.
    assignment: bool,
}

impl<'a> KeyRouting<'a> {
    /// None for reference tables.
    pub fn new(table: &'a DistributedTable, assignment: bool) -> Option<Self> {
        match &table.distribution {
            Distribution::Hash { column_type, key, .. } => Some(KeyRouting { ty: *column_type, key, shards: table.shard_count(), assignment }),
            Distribution::Reference => None,
        }
    }

    /// The shard of a key value, when it can be hashed exactly as given; None
    /// when the coordinator database must convert it to the column type first
    /// (another type, a form we cannot parse, or — for a value being stored —
    /// a type modifier that may round it).
    pub fn local_shard(&self, value: &[u8], type_oid: u32, binary: bool) -> Option<u32> {
        local_key_shard(self.ty, self.key, self.shards, value, type_oid, binary, self.assignment)
    }

    /// The shard of a value already converted to the column type, in binary form.
    pub fn shard_for_coerced(&self, value: &[u8]) -> PgResult<u32> {
        let h = hash::hash_binary(self.ty, value).map_err(|e| key_error(&e.0))?;
        Ok(hash::shard_index(hash::row_hash(Some(h)), self.shards))
    }

    /// `SELECT $1::<type>`: converts a key value as storing it (with the
    /// column's type modifier) or comparing it with the column would.
    pub fn coercion_sql(&self) -> String {
        let target = if self.assignment { &self.key.sql } else { &self.key.base_sql };
        format!("SELECT $1::{target}")
    }

    /// The column type's oid, which binary values are in.
    pub fn type_oid(&self) -> u32 {
        self.key.oid
    }
}

/// Hashes a key value locally when that is exactly what PostgreSQL would do.
fn local_key_shard(ty: HashType, key: &KeyType, shards: u32, value: &[u8], type_oid: u32, binary: bool, assignment: bool) -> Option<u32> {
    if assignment && key.coercion == Coercion::Always {
        return None;
    }
    let h = if binary {
        let same_type = type_oid == key.oid || (is_text_oid(type_oid) && is_text_oid(key.oid));
        if same_type {
            hash::hash_binary(ty, value).ok()?
        } else {
            hash::hash_binary(ty, &widen_integer(value, type_oid, ty)?).ok()?
        }
    } else {
        let text = std::str::from_utf8(value).ok()?;
        if assignment && key.coercion == Coercion::TrailingSpaces && text.ends_with(' ') {
            return None;
        }
        // A typed value of another family (a bpchar parameter for a text key
        // drops trailing spaces, say) converts before comparing; leave that to
        // the server. Integer and numeric text forms are the same across types.
        let compatible = type_oid == 0
            || type_oid == key.oid
            || (is_text_oid(type_oid) && is_text_oid(key.oid))
            || (is_number_oid(type_oid) && is_number_oid(key.oid));
        if !compatible {
            return None;
        }
        hash::hash_text(ty, text).ok()?
    };
    Some(hash::shard_index(hash::row_hash(Some(h)), shards))
}

fn is_text_oid(oid: u32) -> bool {
    matches!(oid, 25 | 1043)
}

fn is_number_oid(oid: u32) -> bool {
    matches!(oid, 20 | 21 | 23 | 1700)
}

/// A binary integer of one width re-encoded for an integer key of another.
fn widen_integer(value: &[u8], type_oid: u32, ty: HashType) -> Option<Vec<u8>> {
    let n: i64 = match (type_oid, value.len()) {
        (21, 2) => i16::from_be_bytes(value.try_into().ok()?) as i64,
        (23, 4) => i32::from_be_bytes(value.try_into().ok()?) as i64,
        (20, 8) => i64::from_be_bytes(value.try_into().ok()?),
        _ => return None,
    };
    match ty {
        HashType::Int2 => i16::try_from(n).ok().map(|v| v.to_be_bytes().to_vec()),
        HashType::Int4 => i32::try_from(n).ok().map(|v| v.to_be_bytes().to_vec()),
        HashType::Int8 => Some(n.to_be_bytes().to_vec()),
        _ => None,
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
    /// On the nullable side of an outer join: its columns may be NULL in
    /// rows of other shard groups too.
    nullable: bool,
}

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

pub(super) fn router(command: Command, target: ShardTarget, anchor: Option<Arc<DistributedTable>>, template: ShardTemplate) -> Plan {
    router_with_key(command, target, anchor, template, None)
}

fn router_with_key(
    command: Command,
    target: ShardTarget,
    anchor: Option<Arc<DistributedTable>>,
    template: ShardTemplate,
    insert_key: Option<InsertKey>,
) -> Plan {
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
        insert_rows_sql: Mutex::default(),
    }))
}

/// A write to every placement of the reference tables it names.
pub(super) fn reference_write(command: Command, template: ShardTemplate) -> Plan {
    router(command, ShardTarget::Reference, None, template)
}

fn route_if_reference_only(command: Command, template: ShardTemplate, tables: &[Arc<DistributedTable>]) -> Option<Plan> {
    tables.iter().all(|t| t.is_reference()).then(|| router(command, ShardTarget::Reference, None, template))
}

/// MERGE into a distributed or reference table. Its source is outer-joined
/// to the target (a source row that matches nothing may be inserted), so
/// constants in ON pin nothing, and each shard group may run the statement
/// on its own only when a row it inserts belongs to that group: the source
/// must then be co-located tables joined on the distribution column, whose
/// value the INSERT puts in the target's. With only MATCHED actions, MERGE
/// runs as UPDATE … FROM / DELETE … USING would.
fn plan_merge(merge: &protobuf::MergeStmt, node: &NodeEnum, template: ShardTemplate, catalog: &Catalog) -> Plan {
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
fn inserted_key_is_source_key(clause: &protobuf::MergeWhenClause, target: &DistributedTable, column: &str, source: &[ScopeEntry]) -> bool {
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

fn scope_entry(rv: &protobuf::RangeVar, catalog: &Catalog) -> ScopeEntry {
    let name = rv.alias.as_ref().map(|a| a.aliasname.clone()).unwrap_or_else(|| rv.relname.clone());
    ScopeEntry { name, table: resolve_range_var(rv, catalog).cloned(), nullable: false }
}

/// Walks a FROM list: tables enter the scope, and join conditions become
/// conjuncts. Returns whether an outer join preserves rows of something other
/// than a distributed table (a reference table, a subquery): run per shard, such
/// rows would come back once per shard.
fn collect_from<'a>(items: &'a [protobuf::Node], catalog: &Catalog, scope: &mut Vec<ScopeEntry>, conjuncts: &mut Vec<Conjunct<'a>>) -> bool {
    collect_joined(items, catalog, scope, conjuncts, false)
}

/// `collect_from` for items that are, when `nullable`, on the nullable side
/// of an outer join. An inner join's ON clause restricts the statement's rows
/// as WHERE does, so its constants pin tables, unless the join sits on such a
/// side: its rows may then be replaced by NULLs, and the tables its equalities
/// tie to the preserved side are not restricted. An outer join's own ON clause
/// restricts only its nullable side, so only its equalities between columns
/// count (they tie tables pinned by conditions on the result).
fn collect_joined<'a>(
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
                    replicated[side] = scope[before..].iter().any(|e| e.table.as_ref().is_none_or(|t| t.is_reference()));
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
fn shard_keys(scope: &[ScopeEntry]) -> super::multi_shard::ShardKeys {
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
fn using_equalities(j: &protobuf::JoinExpr, scope: &[ScopeEntry], sides: &[std::ops::Range<usize>; 2], conjuncts: &mut Vec<Conjunct<'_>>) {
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
struct Conjunct<'a> {
    left: Cow<'a, protobuf::Node>,
    right: Cow<'a, protobuf::Node>,
    /// False for conditions whose constants do not restrict the statement's
    /// rows: an outer join's ON clause (and any join's on its nullable side),
    /// MERGE's join condition.
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
                out.push(Conjunct { left: Cow::Borrowed(l), right: Cow::Borrowed(r), may_pin_constant });
            }
        }
        _ => {}
    }
}

/// The scope entry whose distribution column a column reference names.
fn dist_column_owner(node: &protobuf::Node, scope: &[ScopeEntry]) -> Option<usize> {
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

/// A constant or parameter usable as a shard key: `5`, `'abc'`, `$1`, `$1::int`,
/// or a literal cast to the key's own type (`'2024-01-01'::date`). Other casts
/// may change the value (`1.25::numeric(3,1)` is 1.3), so they pin nothing.
pub(super) fn key_value(node: &protobuf::Node, key: &KeyType) -> Option<Result<KeyValue, PgError>> {
    match node.node.as_ref()? {
        NodeEnum::ParamRef(p) => Some(Ok(KeyValue::Param((p.number - 1).max(0) as usize))),
        NodeEnum::TypeCast(c) => {
            let type_name = c.type_name.as_ref()?;
            if !type_name.typmods.is_empty() || !type_name.array_bounds.is_empty() {
                return None;
            }
            match c.arg.as_deref()?.node.as_ref()? {
                NodeEnum::ParamRef(p) => Some(Ok(KeyValue::Param((p.number - 1).max(0) as usize))),
                NodeEnum::AConst(_) if names_key_type(type_name, key) => match key_value(c.arg.as_deref()?, key)? {
                    Ok(KeyValue::Literal { text, type_oid, .. }) => Some(Ok(KeyValue::Literal { text, type_oid, cast_to_key: true })),
                    other => Some(other),
                },
                _ => None,
            }
        }
        NodeEnum::AConst(c) => {
            if c.isnull {
                return Some(Err(PgError::new(sqlstate::NOT_NULL_VIOLATION, "cannot perform an INSERT with NULL in the partition column")));
            }
            let (text, type_oid) = match c.val.as_ref()? {
                a_const::Val::Ival(i) => (i.ival.to_string(), 23),
                a_const::Val::Fval(f) => (f.fval.clone(), 1700),
                a_const::Val::Sval(s) => (s.sval.clone(), 0),
                a_const::Val::Boolval(b) => (b.boolval.to_string(), 16),
                a_const::Val::Bsval(_) => return None,
            };
            Some(Ok(KeyValue::Literal { text, type_oid, cast_to_key: false }))
        }
        _ => None,
    }
}

/// Whether a cast's type is the key column's own type.
fn names_key_type(type_name: &protobuf::TypeName, key: &KeyType) -> bool {
    let Some(NodeEnum::String(last)) = type_name.names.last().and_then(|n| n.node.as_ref()) else { return false };
    key_type_name(key).is_some_and(|internal| last.sval == internal)
}

/// The internal name of a distribution column's type (as in `'5'::int8`).
pub(super) fn key_type_name(key: &KeyType) -> Option<&'static str> {
    Some(match key.oid {
        21 => "int2",
        23 => "int4",
        20 => "int8",
        25 => "text",
        1043 => "varchar",
        1042 => "bpchar",
        2950 => "uuid",
        1700 => "numeric",
        1082 => "date",
        1114 => "timestamp",
        1184 => "timestamptz",
        16 => "bool",
        17 => "bytea",
        26 => "oid",
        18 => "char",
        _ => return None,
    })
}

/// Where an INSERT row goes: a shard now, or one resolved at execution.
fn insert_target(key_value: &KeyValue, ty: HashType, key: &KeyType, shards: u32) -> ShardTarget {
    match key_value {
        KeyValue::Literal { text, type_oid, .. } => match local_key_shard(ty, key, shards, text.as_bytes(), *type_oid, false, true) {
            Some(shard) => ShardTarget::Shard(shard),
            None => ShardTarget::Key(key_value.clone()),
        },
        other => ShardTarget::Key(other.clone()),
    }
}

/// What `dist_col = value` in a WHERE clause pins. A typed literal of another
/// type that we cannot hash pins nothing: PostgreSQL compares it in its own type
/// (`int_col = 5.5`, `int_col = 3000000000`), so no conversion to the column
/// type is sure to keep its meaning. A quoted literal or an explicit cast to the
/// key type does convert, and the coordinator database can do that.
fn pin_target(key_value: &KeyValue, ty: HashType, key: &KeyType, shards: u32) -> Option<ShardTarget> {
    match key_value {
        KeyValue::Literal { text, type_oid, cast_to_key } => match local_key_shard(ty, key, shards, text.as_bytes(), *type_oid, false, false) {
            Some(shard) => Some(ShardTarget::Shard(shard)),
            None if *type_oid == 0 || *cast_to_key => Some(ShardTarget::Key(key_value.clone())),
            None => None,
        },
        other => Some(ShardTarget::Key(other.clone())),
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

fn plan_pinned(
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
            _ => return not_supported("subqueries over distributed tables are only supported when each reads one shard group, pinned by its own conditions on the distribution column or joined on it to a table of the query around it; a query must otherwise name its distributed tables in the top-level FROM clause"),
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
    let target = if keys_differ { ShardTarget::SameKeys(keys) } else { target.unwrap() };
    router(command, target, Some(anchor), template)
}

/// How one query level's distributed tables are pinned.
enum Pinning {
    /// Per group of tables joined on their distribution columns.
    Groups(Vec<Group>),
    /// A distribution column is compared with NULL: no row qualifies.
    NullKey,
}

struct Group {
    /// One of its scope entries.
    entry: usize,
    /// The first pin found for it (target, key value).
    pin: Option<(ShardTarget, KeyValue)>,
    /// For a subquery's group: joined on its distribution column to a
    /// table of the query around it (so it reads, for each row of that
    /// query, the shard group of that row).
    follows: bool,
}

fn pinning(scope: &[ScopeEntry], conjuncts: &[Conjunct], hash_entries: &[usize]) -> Pinning {
    pinning_within(scope, conjuncts, hash_entries, &[], &[])
}

/// `pinning` for a subquery inside a query whose scope is `outer`: a group
/// also follows an outer table when one of its tables' distribution column
/// equals that table's (`sub.key = outer_alias.key` among its conditions),
/// or when it holds one of the entries `given` (joined so by the caller).
fn pinning_within(scope: &[ScopeEntry], conjuncts: &[Conjunct], hash_entries: &[usize], outer: &[ScopeEntry], given: &[usize]) -> Pinning {
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
/// a qualified column reference that no entry of `scope` (the subquery's
/// own) can take: `o.tenant` in a subquery that has no `o`.
fn outer_dist_column_owner(node: &protobuf::Node, scope: &[ScopeEntry], outer: &[ScopeEntry]) -> Option<usize> {
    let Some(NodeEnum::ColumnRef(c)) = node.node.as_ref() else { return None };
    let parts = super::column_ref_names(c)?;
    let [qualifier, _] = parts.as_slice() else { return None };
    if scope.iter().any(|e| e.name == *qualifier) {
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
struct Nested {
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
fn nested_parts(node: &NodeEnum, catalog: &Catalog, outer: &[ScopeEntry], outer_conjuncts: &[Conjunct]) -> Option<Nested> {
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
enum NestedPlace {
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
fn collect_nested(node: &mut NodeEnum, top: bool, out: &mut Vec<(NodeEnum, NestedPlace)>) {
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
fn column_of(node: &protobuf::Node, alias: &str) -> Option<String> {
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
fn keyed_output(select: &protobuf::SelectStmt, scope: &[ScopeEntry], column: Option<&str>, catalog: &Catalog) -> Option<usize> {
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

/// `dist_col = NULL` is never true, so any one shard gives the right (empty) answer.
fn router_for_null_key(command: Command, anchor: Arc<DistributedTable>, template: ShardTemplate) -> Plan {
    router(command, ShardTarget::Shard(0), Some(anchor), template)
}

/// Whether an INSERT … VALUES needs the coordinator database to compute its
/// rows: it gives a value to a GENERATED ALWAYS identity column (which
/// PostgreSQL's own rules must judge), has DEFAULT VALUES, or computes a
/// distribution value from an expression (`make_timestamp(2032, 9, 4, 0, 0,
/// 0)`, `2 + 3`, `+5`), which PostgreSQL evaluates there as it would for the
/// row. Not when the rows read a distributed or reference table: the
/// coordinator database holds only their empty shells.
fn needs_coordinator_values(insert: &protobuf::InsertStmt, rows: &[&[protobuf::Node]], table: &DistributedTable, catalog: &Catalog) -> bool {
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

fn is_set_to_default(n: &protobuf::Node) -> bool {
    matches!(n.node.as_ref(), Some(NodeEnum::SetToDefault(_)))
}

/// The columns other than the distribution column whose sequence default
/// some VALUES rows leave to it (the shards have no such default: the
/// coordinator fills the values in). None when a row is too short to take
/// the value where it belongs (no column list, fewer values than columns).
fn sequence_fills(
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

fn plan_insert(insert: &protobuf::InsertStmt, node: &NodeEnum, template: ShardTemplate, catalog: &Catalog) -> Plan {
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
        return router_with_key(Command::Insert, ShardTarget::Reference, None, template, Some(insert_key));
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
    let targets: Vec<ShardTarget> = keys.iter().map(|k| insert_target(k, *column_type, key, shards)).collect();
    let target = match targets.as_slice() {
        // Rows the coordinator fills in are written out per execution.
        _ if fills_rows => ShardTarget::InsertRows(keys),
        [ShardTarget::Shard(first), rest @ ..] if rest.iter().all(|t| *t == ShardTarget::Shard(*first)) => ShardTarget::Shard(*first),
        [single @ ShardTarget::Key(KeyValue::Param(_) | KeyValue::Literal { .. })] => single.clone(),
        _ => ShardTarget::InsertRows(keys),
    };
    router_with_key(Command::Insert, target, Some(table), template, Some(insert_key))
}
