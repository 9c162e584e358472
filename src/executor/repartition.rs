//! Repartition joins: a query joining two distributed tables that are not
//! joined on both distribution columns, too large to broadcast.
//!
//! When one table is joined on its distribution column with a column of the
//! same type of the other, only the other (the *moved* table; the smaller
//! when either would do) moves: its rows go, by the hash of that column, to
//! the nodes holding the first table's shards of the same hash. Each such
//! node gets a temporary table partitioned by hash exactly as those shards
//! are, with a partition for each of its shards, and the query runs as a
//! co-located join of the first table with it. When neither join column is
//! a distribution column, both tables move by their join columns into a
//! layout of one shard per node of the larger table's nodes: each node's
//! shard of a table is a view of its own rows of its values, read where they
//! lie, and of the rows the other nodes sent it, and each node runs the
//! query over its views in one task. DISTINCT aggregates of a column with
//! many values move one table the same way, by that column
//! (`by_distinct_column`), each node aggregating its own values.
//!
//! The rows move node to node: each node fetches the rows whose join column
//! hashes to its shards, from its own shards and, over a connection of its
//! own (`COPY` through `psql`, see `commands::worker_relations`), from every
//! other node's, which filters them by the same hash evaluated in SQL
//! (`hash::shard_filter_sql`); none passes through the coordinator. The
//! query runs on the session's own connections (the only ones that see
//! temporary tables), and the tables are dropped afterwards.
//! Outside transaction blocks only: a block's connections must not be left
//! holding tables of a statement.

use super::multi_shard::shard_groups_by_node;
use super::Mode;
use crate::connection::client::ClientConn;
use crate::connection::{quote_ident, quote_literal};
use crate::error::{PgError, PgResult};
use crate::hash::{shard_filter_sql, HashType};
use crate::metadata::{Catalog, Coercion, DistributedTable, Distribution, KeyType, Node, Shard};
use crate::planner::rewrite::ShardTemplate;
use crate::planner::table_conditions::own_conditions;
use crate::planner::worker_relations::REMOTE_SCHEMA;
use crate::planner::{plan_tree, CombineQuery, FallbackPlan, Plan};
use crate::process::Coordinator;
use crate::transaction::{Access, Participants};
use crate::walk::visit_mut;
use pg_query::{protobuf, NodeEnum};
use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Names the temporary tables of one statement apart from every other's.
static NEXT_INTERMEDIATE: AtomicU64 = AtomicU64::new(1);

/// The oid the intermediate tables are planned under: no relation has it.
const INTERMEDIATE_OID: u32 = u32::MAX;

/// A co-location id no catalog gives: tables moved into a new layout share it.
const NEW_LAYOUT_COLOCATION: i32 = i32::MIN;

/// A repartition, planned: for a join, or for DISTINCT aggregates.
pub(super) struct Repartition {
    /// The tables whose rows move: one, or both.
    moves: Vec<Move>,
    /// The shards the moved rows are laid out as.
    layout: Layout,
    /// The query over the intermediate tables (and the table that stays).
    pub pushdown: Plan,
    /// The catalog that knows the intermediate tables.
    pub catalog: Catalog,
    /// The parser version of the statement's tree.
    version: i32,
    /// The rows move for the statement's DISTINCT aggregates, not a join
    /// (`by_distinct_column`).
    aggregates: bool,
}

/// Shards moved rows are laid out as: a table's, or one per node.
struct Layout {
    /// The table whose shards they are, for EXPLAIN.
    table_name: String,
    shards: Vec<Shard>,
    /// One shard per node (`one_shard_per_node`): each node reads its own
    /// rows where they lie (`Repartition::in_place_sql`).
    by_node: bool,
}

impl Layout {
    fn of(table: &DistributedTable) -> Layout {
        Layout { table_name: table.name.clone(), shards: table.shards.clone(), by_node: false }
    }
}

/// One table's rows moving into a temporary table.
struct Move {
    table: Arc<DistributedTable>,
    /// Its columns' SQL types, in the order of its columns.
    column_types: Vec<String>,
    /// The table as the query reads it after the move, distributed by its
    /// join column.
    intermediate: Arc<DistributedTable>,
    /// The query's own conditions on the table's rows, which filter them
    /// before they move: its name in the query, and the conditions.
    filter: Option<(String, String)>,
    /// Per column, whether the statement may read it; the others move as
    /// NULLs.
    read: Vec<bool>,
    /// Each source node sends each row once: the statement reads only
    /// distinct values of the moved rows (`by_distinct_column`).
    distinct: bool,
}

/// A column's SQL type: as `format_type` prints it with its modifier, without
/// it, and its oid.
struct ColumnType {
    sql: String,
    base_sql: String,
    oid: u32,
}

impl ColumnType {
    /// The type as the key of a layout its column's rows move into.
    fn as_key(&self) -> KeyType {
        KeyType { sql: self.base_sql.clone(), base_sql: self.base_sql.clone(), oid: self.oid, coercion: Coercion::None }
    }
}

/// A repartition join for `plan`, when its two distributed tables, or its
/// one distributed table and a reference table, can be joined that way;
/// None otherwise (the general fallback runs it). `sizes` are the two
/// distributed tables' sizes on disk (`fallback::candidate_sizes`).
pub(super) async fn plan(plan: &FallbackPlan, sizes: &[i64], catalog: &Catalog, parts: &mut Participants) -> PgResult<Option<Repartition>> {
    if parts.in_block() || !matches!(plan.statement, NodeEnum::SelectStmt(_)) {
        return Ok(None);
    }
    let joined = equated_columns(&plan.statement);
    match (&plan.broadcast_candidates[..], sizes) {
        ([first, second], [first_size, second_size]) => {
            let (larger, smaller) = if second_size <= first_size { (first, second) } else { (second, first) };
            two_distributed(plan, larger, smaller, &joined, catalog, parts).await
        }
        ([], []) => with_reference_table(plan, &joined, catalog, parts).await,
        _ => Ok(None),
    }
}

/// Rows a query's DISTINCT aggregates would have the shards send, above
/// which they move node to node instead: each shard sends the distinct
/// values it holds, so a column of many values arrives about once per shard,
/// and the coordinator database copies and sorts every one (`count(DISTINCT
/// aid)` over 5 million rows: 3.4 s, plain PostgreSQL 0.9 s).
const DISTINCT_ROWS_TO_MOVE: f64 = 200_000.0;

/// The rows of `table` moved node to node by the hash of a column, when
/// `query` combines only DISTINCT aggregates of that column
/// (`CombineQuery::distinct_column`, over its `fallback`'s statement) and
/// the shards' statistics say the
/// shards would send more than `DISTINCT_ROWS_TO_MOVE` rows: a value's rows
/// then lie in one shard group, whose node aggregates them alone, and no
/// value passes through the coordinator. Where a value repeats in a shard's
/// rows (fewer distinct values than half its rows), each source node sends
/// each row once; of values mostly unique, removing repeats costs more than
/// moving them (a hash aggregate of every row: 5 million unique values
/// moved in 2.5 s that way, 1 s as they are). None otherwise.
pub(super) async fn by_distinct_column(
    query: &CombineQuery,
    table: &Arc<DistributedTable>,
    catalog: &Catalog,
    parts: &mut Participants,
) -> PgResult<Option<Repartition>> {
    let (Some(column), Some(plan)) = (&query.distinct_column, &query.fallback) else { return Ok(None) };
    let Some(position) = table.columns.iter().position(|c| c == column) else { return Ok(None) };
    if parts.in_block() || !hashes_in_sql(table, position) {
        return Ok(None);
    }
    let (values, rows) = distinct_values_per_shard(table, column, catalog, parts).await?;
    if values * (table.shards.len() as f64) < DISTINCT_ROWS_TO_MOVE {
        return Ok(None);
    }
    let types = column_types(table, parts).await?;
    let key = types[position].as_key();
    let layout = one_shard_per_node(table, catalog)?;
    let planned = plan_moves(plan, catalog, vec![(table, &types, position)], layout, key, NEW_LAYOUT_COLOCATION)?;
    Ok(planned.map(|mut repartition| {
        repartition.moves[0].distinct = values < rows / 2.0;
        repartition.aggregates = true;
        repartition
    }))
}

/// `table` laid out with one shard on each node that holds shards of it,
/// in the order of their groups, each named after the node's first shard.
/// Where every table of the statement moves (DISTINCT aggregates, a join on
/// no distribution column), rows of one value need to meet on one node, not
/// in one shard group: one shard per node lets each node read its own rows
/// of its values where they lie, with no copy (`make_intermediate`), and
/// run the statement over them in one task.
fn one_shard_per_node(table: &DistributedTable, catalog: &Catalog) -> PgResult<Layout> {
    let mut by_node = shard_groups_by_node(table, catalog)?;
    by_node.sort_by_key(|(node, _)| node.group_id);
    let shards = by_node
        .iter()
        .zip(0..)
        .map(|((node, indexes), index)| {
            let first = indexes.first().and_then(|i| table.shards.iter().find(|s| s.index == *i)).map_or(0, |s| s.id);
            Shard { id: first, index, placements: vec![node.group_id] }
        })
        .collect();
    Ok(Layout { table_name: table.name.clone(), shards, by_node: true })
}

/// How many distinct values of `column` the first shard of `table` holds,
/// and how many rows, by its node's statistics; none when it has none.
async fn distinct_values_per_shard(table: &DistributedTable, column: &str, catalog: &Catalog, parts: &mut Participants) -> PgResult<(f64, f64)> {
    let Some(shard) = table.shards.first() else { return Ok((0.0, 0.0)) };
    let Some(node) = shard.placements.first().and_then(|g| catalog.node_for_group(*g)) else { return Ok((0.0, 0.0)) };
    // A negative n_distinct is a fraction of the rows.
    let sql = format!(
        "SELECT CASE WHEN s.n_distinct < 0 THEN -s.n_distinct * greatest(c.reltuples, 0) ELSE s.n_distinct END, greatest(c.reltuples, 0)
           FROM pg_catalog.pg_stats s JOIN pg_catalog.pg_class c ON c.oid = pg_catalog.to_regclass({})
          WHERE s.schemaname = {} AND s.tablename = {} AND s.attname = {}",
        quote_literal(&table.qualified_shard_name(shard)),
        quote_literal(&table.schema),
        quote_literal(&table.shard_relname(shard)),
        quote_literal(column)
    );
    let worker = parts.worker(node, Access::Read).await?;
    let rows = worker.conn.query(&sql).await?;
    let number = |i: usize| rows.first().and_then(|r| r.get(i).cloned().flatten()).and_then(|v| v.parse().ok()).unwrap_or(0.0);
    Ok((number(0), number(1)))
}

/// Two distributed tables: one moves onto the other's shards when it is
/// joined on its distribution column, the smaller first; else both move into
/// the larger's layout.
async fn two_distributed(
    plan: &FallbackPlan,
    larger: &Arc<DistributedTable>,
    smaller: &Arc<DistributedTable>,
    joined: &HashSet<String>,
    catalog: &Catalog,
    parts: &mut Participants,
) -> PgResult<Option<Repartition>> {
    if joinable_columns(larger, joined).is_empty() && joinable_columns(smaller, joined).is_empty() {
        return Ok(None);
    }
    let types = [column_types(larger, parts).await?, column_types(smaller, parts).await?];
    for (stays, moved, moved_types) in [(larger, smaller, &types[1]), (smaller, larger, &types[0])] {
        if let Some(repartition) = onto_shards_of(plan, catalog, stays, (moved, moved_types), joined)? {
            return Ok(Some(repartition));
        }
    }
    both_into_layout_of(plan, catalog, (larger, &types[0]), (smaller, &types[1]), joined)
}

/// One distributed table and reference tables (TPC-H's Q13 counts each
/// customer's orders with the customers on the preserved side of an outer
/// join, grouped by customer): a reference table's rows are split by the
/// hash of a joined column as if it were distributed by it, each node
/// keeping those of its own shards from its own replica (nothing moves
/// between nodes). It is laid out as the distributed table's shards when
/// joined to its distribution column; else the distributed table moves too,
/// by its joined column.
async fn with_reference_table(
    plan: &FallbackPlan,
    joined: &HashSet<String>,
    catalog: &Catalog,
    parts: &mut Participants,
) -> PgResult<Option<Repartition>> {
    let (distributed, reference): (Vec<_>, Vec<_>) = plan.read.tables.iter().partition(|t| !t.is_reference());
    let [table] = distributed[..] else { return Ok(None) };
    let mut table_types = None;
    for reference in reference.into_iter().filter(|r| !joinable_columns(r, joined).is_empty()) {
        let types = column_types(reference, parts).await?;
        if let Some(repartition) = onto_shards_of(plan, catalog, table, (reference, &types), joined)? {
            return Ok(Some(repartition));
        }
        let table_types = match &mut table_types {
            Some(known) => known,
            None => table_types.insert(column_types(table, parts).await?),
        };
        if let Some(repartition) = both_into_layout_of(plan, catalog, (table, table_types), (reference, &types), joined)? {
            return Ok(Some(repartition));
        }
    }
    Ok(None)
}

/// The columns of `table` a join can be co-located on: equated with another
/// column, of a type the nodes can hash in SQL to send its rows on.
fn joinable_columns(table: &DistributedTable, joined: &HashSet<String>) -> Vec<usize> {
    (0..table.columns.len()).filter(|&i| joined.contains(&table.columns[i]) && hashes_in_sql(table, i)).collect()
}

/// Whether the nodes can hash `table`'s column `position` in SQL, to send
/// its rows by it.
fn hashes_in_sql(table: &DistributedTable, position: usize) -> bool {
    table.column_type_oids.get(position).and_then(|oid| HashType::from_type_oid(*oid)).is_some_and(HashType::hashes_in_sql)
}

/// `moved` (with its columns' types) onto the shards of `stays`, by one of
/// its joined columns of the type `stays` is distributed by; None when no
/// such column makes a plan.
fn onto_shards_of(
    plan: &FallbackPlan,
    catalog: &Catalog,
    stays: &Arc<DistributedTable>,
    (moved, moved_types): (&Arc<DistributedTable>, &[ColumnType]),
    joined: &HashSet<String>,
) -> PgResult<Option<Repartition>> {
    let Distribution::Hash { key, .. } = &stays.distribution else { return Ok(None) };
    for position in joinable_columns(moved, joined) {
        if moved_types[position].base_sql == key.base_sql {
            if let Some(repartition) =
                plan_moves(plan, catalog, vec![(moved, moved_types, position)], Layout::of(stays), key.clone(), stays.colocation_id)?
            {
                return Ok(Some(repartition));
            }
        }
    }
    Ok(None)
}

/// Both tables (with their columns' types) moved by joined columns of one
/// type, one shard per node of `first`'s (`one_shard_per_node`); None when
/// no pair of columns makes a plan.
fn both_into_layout_of(
    plan: &FallbackPlan,
    catalog: &Catalog,
    (first, first_types): (&Arc<DistributedTable>, &[ColumnType]),
    (second, second_types): (&Arc<DistributedTable>, &[ColumnType]),
    joined: &HashSet<String>,
) -> PgResult<Option<Repartition>> {
    for x in joinable_columns(first, joined) {
        for y in joinable_columns(second, joined) {
            let (tx, ty) = (&first_types[x], &second_types[y]);
            if tx.base_sql != ty.base_sql {
                continue;
            }
            let key = tx.as_key();
            let moves = vec![(first, first_types, x), (second, second_types, y)];
            if let Some(repartition) = plan_moves(plan, catalog, moves, one_shard_per_node(first, catalog)?, key, NEW_LAYOUT_COLOCATION)? {
                return Ok(Some(repartition));
            }
        }
    }
    Ok(None)
}

/// The statement planned over the tables `moves` names (each with its
/// columns' types and the column it moves by), laid out as `layout` says,
/// hashed as `key`, in co-location group `colocation_id`; None when
/// no pushdown tier takes it so.
fn plan_moves(
    plan: &FallbackPlan,
    catalog: &Catalog,
    moves: Vec<(&Arc<DistributedTable>, &[ColumnType], usize)>,
    layout: Layout,
    key: KeyType,
    colocation_id: i32,
) -> PgResult<Option<Repartition>> {
    let moves: Option<Vec<Move>> = moves
        .into_iter()
        .zip(0..)
        .map(|((table, types, position), i)| {
            Some(Move {
                table: table.clone(),
                column_types: types.iter().map(|t| t.sql.clone()).collect(),
                intermediate: intermediate_table(table, &layout.shards, position, key.clone(), colocation_id, INTERMEDIATE_OID - i),
                filter: match &plan.statement {
                    NodeEnum::SelectStmt(select) => own_conditions(select, table, catalog),
                    _ => None,
                },
                read: read_columns(&plan.statement, table, catalog)?,
                distinct: false,
            })
        })
        .collect();
    let Some(moves) = moves else { return Ok(None) };
    let augmented = moves.iter().fold(catalog.clone(), |c, m| c.with_table(m.intermediate.clone()));
    let pushdown = replace_and_plan(plan, &augmented, &moves)?;
    Ok(pushdown.map(|pushdown| Repartition { moves, layout, pushdown, catalog: augmented, version: plan.version, aggregates: false }))
}

/// The names of the columns the statement compares with `=` to another
/// column: the only ones a join can be co-located on.
fn equated_columns(statement: &NodeEnum) -> HashSet<String> {
    let mut names = HashSet::new();
    let column_name = |node: Option<&protobuf::Node>| match node.and_then(|n| n.node.as_ref()) {
        Some(NodeEnum::ColumnRef(c)) => crate::planner::column_ref_names(c)?.last().map(|name| name.to_string()),
        _ => None,
    };
    let mut statement = statement.clone();
    visit_mut(&mut statement, &mut |n| match n {
        NodeEnum::AExpr(e) if e.name.len() == 1 && matches!(e.name[0].node.as_ref(), Some(NodeEnum::String(s)) if s.sval == "=") => {
            if let (Some(l), Some(r)) = (column_name(e.lexpr.as_deref()), column_name(e.rexpr.as_deref())) {
                names.insert(l);
                names.insert(r);
            }
        }
        NodeEnum::SubLink(link) if link.sub_link_type == protobuf::SubLinkType::AnySublink as i32 => {
            let selected = match link.subselect.as_deref().and_then(|s| s.node.as_ref()) {
                Some(NodeEnum::SelectStmt(select)) if select.target_list.len() == 1 => match select.target_list[0].node.as_ref() {
                    Some(NodeEnum::ResTarget(target)) => column_name(target.val.as_deref()),
                    _ => None,
                },
                _ => None,
            };
            if let (Some(l), Some(r)) = (column_name(link.testexpr.as_deref()), selected) {
                names.insert(l);
                names.insert(r);
            }
        }
        NodeEnum::JoinExpr(j) => {
            for name in &j.using_clause {
                if let Some(NodeEnum::String(s)) = name.node.as_ref() {
                    names.insert(s.sval.clone());
                }
            }
        }
        _ => {}
    });
    names
}

/// Per column of `table`, whether the statement may read it: it names the
/// column anywhere (by name alone, whatever table that name belongs to
/// there), or reads whole rows (a star, a NATURAL join, column aliases given
/// to the table). None when it reads the table's rows as values (its name
/// or alias as a column): their type would be the temporary table's, which
/// the coordinator does not know.
fn read_columns(statement: &NodeEnum, table: &DistributedTable, catalog: &Catalog) -> Option<Vec<bool>> {
    let mut names: HashSet<String> = HashSet::new();
    let (mut whole_rows, mut row_values) = (false, false);
    let mut row_names = vec![table.name.clone()];
    for rv in crate::walk::range_vars(statement) {
        if crate::planner::resolve_range_var(&rv, catalog).is_some_and(|t| t.oid == table.oid) {
            if let Some(alias) = &rv.alias {
                whole_rows |= !alias.colnames.is_empty();
                row_names.push(alias.aliasname.clone());
            }
        }
    }
    let mut statement = statement.clone();
    visit_mut(&mut statement, &mut |n| match n {
        NodeEnum::ColumnRef(c) => match crate::planner::column_ref_names(c).as_deref() {
            Some([single]) if row_names.iter().any(|r| r == single) => row_values = true,
            Some([.., column]) => {
                names.insert(column.to_string());
            }
            _ => whole_rows = true,
        },
        NodeEnum::AStar(_) => whole_rows = true,
        NodeEnum::JoinExpr(j) => {
            whole_rows |= j.is_natural;
            for name in &j.using_clause {
                if let Some(NodeEnum::String(s)) = name.node.as_ref() {
                    names.insert(s.sval.clone());
                }
            }
        }
        _ => {}
    });
    (!row_values).then(|| table.columns.iter().map(|c| whole_rows || names.contains(c)).collect())
}

/// The SQL type of each of `table`'s columns.
async fn column_types(table: &DistributedTable, parts: &mut Participants) -> PgResult<Vec<ColumnType>> {
    let sql = format!(
        "SELECT format_type(atttypid, atttypmod), format_type(atttypid, NULL), atttypid FROM pg_attribute \
         WHERE attrelid = {} AND attnum > 0 AND NOT attisdropped ORDER BY attnum",
        table.oid
    );
    let rows = parts.local().await?.query(&sql).await?;
    parts.observe_local_status();
    if rows.len() != table.columns.len() {
        return Err(PgError::internal(format!(
            "{} has {} columns in the catalog, {} in the coordinator database",
            table.name,
            table.columns.len(),
            rows.len()
        )));
    }
    Ok(rows
        .into_iter()
        .map(|mut r| ColumnType {
            sql: r[0].take().unwrap_or_default(),
            base_sql: r[1].take().unwrap_or_default(),
            oid: r[2].as_deref().and_then(|o| o.parse().ok()).unwrap_or(0),
        })
        .collect())
}

/// `moved` as a temporary table distributed by its column `position`
/// (hashed as `key`), in co-location group `colocation_id` with the shards
/// `shards`, named after them; planned under `oid`.
fn intermediate_table(
    moved: &DistributedTable,
    shards: &[Shard],
    position: usize,
    key: KeyType,
    colocation_id: i32,
    oid: u32,
) -> Arc<DistributedTable> {
    let n = NEXT_INTERMEDIATE.fetch_add(1, Ordering::Relaxed);
    let column_type = HashType::from_type_oid(key.oid).expect("only hashable columns move");
    Arc::new(DistributedTable {
        oid,
        schema: "pg_temp".into(),
        name: format!("tessera_repartitioned_{n}"),
        distribution: Distribution::Hash { column: moved.columns[position].clone(), column_index: position, column_type, key },
        colocation_id,
        columns: moved.columns.clone(),
        column_type_oids: moved.column_type_oids.clone(),
        copy_columns: moved.columns.clone(),
        key_default: None,
        sequence_columns: Vec::new(),
        always_identity: Vec::new(),
        shards: shards.to_vec(),
        partition_of: None,
        primary_key: Vec::new(),
    })
}

/// Plans the statement with each moved table read from its intermediate
/// table; only a router or multi-shard plan counts: the join is then
/// co-located on the moved columns.
fn replace_and_plan(plan: &FallbackPlan, catalog: &Catalog, moves: &[Move]) -> PgResult<Option<Plan>> {
    let mut stmt = plan.statement.clone();
    let mut failure = None;
    crate::planner::replace_tables(&mut stmt, catalog, |table, alias| {
        let intermediate = &moves.iter().find(|m| m.table.oid == table.oid)?.intermediate;
        let item = format!("{}.{} AS {}", quote_ident(&intermediate.schema), quote_ident(&intermediate.name), quote_ident(alias));
        crate::planner::subselect_node(&item).map_err(|e| failure = Some(e)).ok()
    });
    if let Some(e) = failure {
        return Err(e);
    }
    Ok(match plan_tree(plan.version, stmt, catalog) {
        p @ (Plan::Router(_) | Plan::MultiShard(_)) => Some(p),
        _ => None,
    })
}

/// What moving the rows did, for EXPLAIN ANALYZE.
pub(super) struct Moved {
    pub rows: u64,
}

impl Repartition {
    /// What EXPLAIN calls it.
    pub fn title(&self) -> &'static str {
        if self.aggregates {
            "Tessera Repartitioned Aggregate"
        } else {
            "Tessera Repartition Join"
        }
    }

    /// How the rows move, for EXPLAIN.
    pub fn describe(&self) -> String {
        let moves: Vec<String> = self
            .moves
            .iter()
            .map(|m| {
                let Distribution::Hash { column, .. } = &m.intermediate.distribution else { unreachable!("made as a hash table") };
                let filter = m.filter.as_ref().map(|(_, condition)| format!(" where {condition}")).unwrap_or_default();
                let how = match (m.table.is_reference(), self.layout.by_node) {
                    (true, _) => "from each node's own replica",
                    (false, true) => "node to node, each node's own read where they lie",
                    (false, false) => "node to node",
                };
                let rows = if m.distinct { "distinct rows of " } else { "" };
                format!("{rows}{} by {column}{filter} {how}", m.table.name)
            })
            .collect();
        match &self.moves[..] {
            [_] if self.layout.by_node => {
                format!("{}, one shard per node: a temporary table on each node and a view of it with the node's own rows", moves[0])
            }
            [_] => format!("{}, onto the shards of {}, into a temporary table on each node", moves[0], self.layout.table_name),
            // Where both move, they move one shard per node (`both_into_layout_of`).
            _ => format!("{}, one shard per node: temporary tables on each node and views of them with the node's own rows", moves.join(" and ")),
        }
    }

    /// Makes the temporary tables on the nodes of the layout's shards,
    /// recording each node group in `made` (for `drop_intermediate`, also
    /// after a failure), and with `move_rows` has each of those nodes fetch
    /// its rows of the moved tables: from its own shards by INSERT … SELECT,
    /// from every other node's over a connection of its own to that node
    /// (`tessera_remote.pull_rows`), each node sending only the rows whose
    /// join column hashes to the fetching node's shards. No row passes
    /// through the coordinator.
    pub async fn make_intermediate(&self, catalog: &Catalog, parts: &mut Participants, move_rows: bool, made: &mut Vec<i32>) -> PgResult<Moved> {
        let mut moved = Moved { rows: 0 };
        for m in &self.moves {
            let parent = parent_name(&m.intermediate);
            let targets = shard_groups_by_node(&m.intermediate, catalog)?;
            let shards = shard_groups_by_node(&m.table, catalog)?;
            let mut statements = Vec::with_capacity(targets.len());
            for (node, remainders) in &targets {
                parts.worker(node, Access::Read).await?;
                if !made.contains(&node.group_id) {
                    made.push(node.group_id);
                }
                // A node reads a reference table's rows from its own replica.
                let replica = m.table.shards.first().filter(|s| m.table.is_reference() && s.placements.contains(&node.group_id));
                let sources = match replica {
                    Some(shard) => vec![(*node, vec![shard.index])],
                    None => in_turn_from(&shards, node.group_id),
                };
                // The read of the rows whose join column hashes to this node's shards.
                let read = self.read_template(m, remainders)?;
                let mut sql = if self.layout.by_node {
                    self.in_place_sql(m, &read, &parent, node, remainders, &sources)?
                } else {
                    create_sql(&m.intermediate, &m.column_types, &parent, node.group_id)
                };
                let fetches = self.fetch_sql(m, &read, &parent, node, &sources)?;
                if move_rows && !fetches.is_empty() {
                    sql.push_str(&format!("; SELECT {}", fetches.join(" + ")));
                }
                statements.push((node.group_id, sql));
            }
            // Every node fetches at the same time, each to its end even when
            // another fails: a statement given up halfway would leave its
            // connection in the middle of an exchange.
            let groups: Vec<i32> = statements.iter().map(|(g, _)| *g).collect();
            let fetches = parts.workers_for(&groups).into_iter().map(|worker| {
                let sql = &statements.iter().find(|(g, _)| *g == worker.group_id).expect("a statement per group made above").1;
                let table = &m.table.name;
                async move {
                    let rows = worker
                        .conn
                        .query_value(sql)
                        .await
                        .map_err(|e| e.with_context(format!("moving rows of {table} to node group {}", worker.group_id)))?;
                    PgResult::Ok(rows.and_then(|r| r.parse::<u64>().ok()).unwrap_or(0))
                }
            });
            for fetched in futures::future::join_all(fetches.collect::<Vec<_>>()).await {
                moved.rows += fetched?;
            }
        }
        Ok(moved)
    }

    /// The temporary table `parent` on `target`, where the rows other nodes
    /// send arrive, and the target's one shard `remainders` of a layout by
    /// node (`Layout::by_node`) as a view of them and of the target's own
    /// rows as `read` selects them, read where they lie.
    fn in_place_sql(
        &self,
        m: &Move,
        read: &ShardTemplate,
        parent: &str,
        target: &Node,
        remainders: &[u32],
        sources: &[(&Node, Vec<u32>)],
    ) -> PgResult<String> {
        let [remainder] = remainders else { return Err(PgError::internal("a node with other than one shard of a layout by node")) };
        let shard = m.intermediate.shards.iter().find(|s| s.index == *remainder).ok_or_else(|| PgError::internal("a layout's shard missing"))?;
        let names: Vec<String> = m.intermediate.columns.iter().map(|c| quote_ident(c)).collect();
        let columns: Vec<String> = names.iter().zip(&m.column_types).map(|(c, t)| format!("{c} {t}")).collect();
        let own = sources.iter().find(|(source, _)| source.group_id == target.group_id).map(|(_, indexes)| self.source_select(m, read, indexes));
        let rows = match own {
            Some(own) => format!("{} UNION ALL SELECT * FROM {parent}", own?),
            None => format!("SELECT * FROM {parent}"),
        };
        Ok(format!(
            "CREATE TEMP TABLE {parent} ({}); CREATE TEMP VIEW {} ({}) AS {rows}",
            columns.join(", "),
            m.intermediate.qualified_shard_name(shard),
            names.join(", ")
        ))
    }

    /// What a node sends of `m` from its shards `indexes`, by `read`.
    fn source_select(&self, m: &Move, read: &ShardTemplate, indexes: &[u32]) -> PgResult<String> {
        let select = indexes.iter().map(|i| read.sql_for_shard(*i)).collect::<PgResult<Vec<_>>>()?.join(" UNION ALL ");
        Ok(if m.distinct { format!("SELECT DISTINCT * FROM ({select}) AS tessera_moved") } else { select })
    }

    /// The SQL expressions with which `target` fetches its rows of `m`
    /// into `parent` from every node in `sources`, each giving the rows it
    /// fetched: those `read` selects, whose join column hashes to the
    /// target's shards of the layout. In a layout by node the target's own
    /// rows stay where they are (`in_place_sql`).
    fn fetch_sql(&self, m: &Move, read: &ShardTemplate, parent: &str, target: &Node, sources: &[(&Node, Vec<u32>)]) -> PgResult<Vec<String>> {
        let mut fetches = Vec::with_capacity(sources.len());
        for (source, indexes) in sources {
            if self.layout.by_node && source.group_id == target.group_id {
                continue;
            }
            let select = self.source_select(m, read, indexes)?;
            fetches.push(if source.group_id == target.group_id {
                format!("{REMOTE_SCHEMA}.insert_rows({}, {})", quote_literal(&select), quote_literal(parent))
            } else {
                format!(
                    "{REMOTE_SCHEMA}.pull_rows({}, {}, {}, {})",
                    quote_literal(&source.addr.host),
                    source.addr.port,
                    quote_literal(&select),
                    quote_literal(parent)
                )
            });
        }
        Ok(fetches)
    }

    /// The read of `m`'s rows that a node holding the layout's shards
    /// `remainders` fetches: the query's own conditions on the table, and
    /// its join column hashing to one of those shards.
    fn read_template(&self, m: &Move, remainders: &[u32]) -> PgResult<ShardTemplate> {
        let Distribution::Hash { column, column_index, column_type, .. } = &m.intermediate.distribution else { unreachable!("made as a hash table") };
        let name = m.filter.as_ref().map_or(m.table.name.as_str(), |(name, _)| name.as_str());
        let mut conditions: Vec<String> = m.filter.iter().map(|(_, condition)| condition.clone()).collect();
        let shard_count = m.intermediate.shards.len() as u32;
        if remainders.len() < shard_count as usize {
            let key = format!("{}.{}", quote_ident(name), quote_ident(column));
            let shards = shard_filter_sql(*column_type, &key, shard_count, remainders).ok_or_else(|| {
                PgError::internal(format!("no shard index in SQL for {} ({})", m.table.columns[*column_index], column_type.sql_name()))
            })?;
            conditions.push(shards);
        }
        let columns: Vec<String> = m
            .table
            .columns
            .iter()
            .zip(&m.column_types)
            .zip(&m.read)
            .map(|((c, t), read)| if *read || c == column { quote_ident(c) } else { format!("NULL::{t}") })
            .collect();
        let mut read = format!("SELECT {} FROM {} AS {}", columns.join(", "), m.table.qualified_name(), quote_ident(name));
        if !conditions.is_empty() {
            read.push_str(&format!(" WHERE {}", conditions.join(" AND ")));
        }
        ShardTemplate::for_own_query(self.version, &read, &m.table)
    }

    /// Drops the temporary tables on the node groups `made`. A connection
    /// that broke took them with it.
    pub async fn drop_intermediate(&self, parts: &mut Participants, made: &[i32]) {
        let parents: Vec<String> = self.moves.iter().map(|m| parent_name(&m.intermediate)).collect();
        // CASCADE: the views of a layout by node read them.
        let drop = format!("DROP TABLE IF EXISTS {} CASCADE", parents.join(", "));
        for worker in parts.workers_for(made) {
            if !worker.conn.is_broken() {
                if let Err(e) = worker.conn.execute(&drop).await {
                    tracing::debug!("could not drop {} on node group {}: {e}", parents.join(", "), worker.group_id);
                }
            }
        }
    }
}

/// The source nodes in the order a node fetches from them: its own rows
/// first, then the nodes after it, wrapping around. Every node then works
/// on its own rows at the same time, and each node is read by one other at
/// a time; in one order everywhere, all would first read the first node
/// while the others served nobody.
fn in_turn_from<'a>(sources: &[(&'a Node, Vec<u32>)], group_id: i32) -> Vec<(&'a Node, Vec<u32>)> {
    let mut ordered = sources.to_vec();
    ordered.sort_by_key(|(node, _)| node.group_id);
    let start = ordered.iter().position(|(node, _)| node.group_id >= group_id).unwrap_or(0);
    ordered.rotate_left(start);
    ordered
}

fn parent_name(intermediate: &DistributedTable) -> String {
    format!("pg_temp.{}", quote_ident(&intermediate.name))
}

/// Moves the rows, runs the query over them and drops what it made.
pub(super) async fn run(
    repartition: Repartition,
    coordinator: &Coordinator,
    catalog: &Catalog,
    parts: &mut Participants,
    mode: &Mode<'_>,
    client: &mut ClientConn,
) -> PgResult<()> {
    let mut made = Vec::new();
    let outcome = async {
        repartition.make_intermediate(catalog, parts, true, &mut made).await?;
        parts.use_session_connections_only(true);
        let ran = match &repartition.pushdown {
            Plan::Router(router) => super::router::run_router(router, parts, &repartition.catalog, mode, client).await,
            Plan::MultiShard(multi) => Box::pin(super::multi_shard::run(multi, coordinator, parts, &repartition.catalog, mode, client)).await,
            _ => Err(PgError::internal("a repartition join without its pushdown plan")),
        };
        parts.use_session_connections_only(false);
        ran
    }
    .await;
    repartition.drop_intermediate(parts, &made).await;
    outcome
}

/// The temporary table `parent` on node group `group`: the moved table's
/// columns, partitioned by hash of the join column, with a partition for
/// each shard of the table that stays on that node, named as the query
/// names that shard's counterpart.
fn create_sql(intermediate: &DistributedTable, column_types: &[String], parent: &str, group: i32) -> String {
    let Distribution::Hash { column, .. } = &intermediate.distribution else { unreachable!("made as a hash table") };
    let columns: Vec<String> = intermediate.columns.iter().zip(column_types).map(|(c, t)| format!("{} {t}", quote_ident(c))).collect();
    let mut sql = format!("CREATE TEMP TABLE {parent} ({}) PARTITION BY HASH ({})", columns.join(", "), quote_ident(column));
    for shard in intermediate.shards.iter().filter(|s| s.placements.first() == Some(&group)) {
        sql.push_str(&format!(
            "; CREATE TEMP TABLE {} PARTITION OF {parent} FOR VALUES WITH (MODULUS {}, REMAINDER {})",
            intermediate.qualified_shard_name(shard),
            intermediate.shards.len(),
            shard.index
        ));
    }
    sql
}
