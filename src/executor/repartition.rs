//! Repartition joins: a query joining two distributed tables that are not
//! joined on both distribution columns, too large to broadcast. One table
//! (the *moved* one, the smaller when either would do) is joined on a column
//! of the other's distribution type with the other's distribution column.
//! Its rows are read from its shards once and routed by the hash of that
//! column to the nodes holding the other table's shards of the same hash:
//! each node gets a temporary table partitioned by hash exactly as those
//! shards are, with a partition for each of its shards. The query then runs
//! as a co-located join of the other table with that table, whose
//! partitions stand for its shards, on the session's own connections (the
//! only ones that see temporary tables), and the tables are dropped.
//!
//! The rows pass through the coordinator process as a stream of COPY lines
//! (held up to a few megabytes, then spilled to disk), never through the
//! coordinator database. Outside transaction blocks only: a block's
//! connections must not be left holding tables of a statement.

use super::multi_shard::{shuffle_rows, tasks_by_node};
use super::partials::{copy_rows_into, PartialRows};
use super::Mode;
use crate::connection::client::ClientConn;
use crate::connection::quote_ident;
use crate::error::{PgError, PgResult};
use crate::hash::{hash_text, row_hash, shard_index, HashType};
use crate::metadata::{Catalog, DistributedTable, Distribution};
use crate::planner::rewrite::ShardTemplate;
use crate::planner::{plan_tree, FallbackPlan, Plan};
use crate::process::Coordinator;
use crate::protocol::{backend, Message};
use crate::transaction::limits::StatementLimits;
use crate::transaction::{Access, Participants};
use pg_query::NodeEnum;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Names the temporary tables of one statement apart from every other's.
static NEXT_INTERMEDIATE: AtomicU64 = AtomicU64::new(1);

/// The oid the intermediate table is planned under: no relation has it.
const INTERMEDIATE_OID: u32 = u32::MAX;

/// A repartition join, planned.
pub(super) struct Repartition {
    /// The table whose rows move.
    moved: Arc<DistributedTable>,
    /// Its columns' SQL types, in the order of its columns.
    column_types: Vec<String>,
    /// The moved table as the query reads it after the move: the temporary
    /// table, co-located with the table that stays.
    intermediate: Arc<DistributedTable>,
    /// The table whose shards the rows move to.
    stays: Arc<DistributedTable>,
    /// The query over the table that stays and the intermediate table.
    pub pushdown: Plan,
    /// The catalog that knows the intermediate table.
    pub catalog: Catalog,
    /// The parser version of the statement's tree.
    version: i32,
}

/// A repartition join for `plan`, when its two distributed tables can be
/// joined that way; None otherwise (the general fallback runs it).
pub(super) async fn plan(plan: &FallbackPlan, catalog: &Catalog, parts: &mut Participants) -> PgResult<Option<Repartition>> {
    let [first, second] = &plan.broadcast_candidates[..] else { return Ok(None) };
    if parts.in_block() || !matches!(plan.statement, NodeEnum::SelectStmt(_)) {
        return Ok(None);
    }
    let sizes = super::cluster_views::table_sizes(&plan.broadcast_candidates, catalog, parts).await?;
    // The smaller table moves when the join allows either.
    let orientations = if sizes[1].table <= sizes[0].table { [(first, second), (second, first)] } else { [(second, first), (first, second)] };
    for (stays, moved) in orientations {
        let Distribution::Hash { column_type, key, .. } = &stays.distribution else { continue };
        let columns = column_types(moved, parts).await?;
        for (position, (_, base_type)) in columns.iter().enumerate() {
            if *base_type != key.base_sql || HashType::from_type_oid(key.oid) != Some(*column_type) {
                continue;
            }
            let intermediate = intermediate_table(moved, stays, position);
            let augmented = catalog.with_table(intermediate.clone());
            let Some(pushdown) = replace_and_plan(plan, &augmented, moved, &intermediate)? else { continue };
            let column_types = columns.into_iter().map(|(sql, _)| sql).collect();
            return Ok(Some(Repartition {
                moved: moved.clone(),
                column_types,
                intermediate,
                stays: stays.clone(),
                pushdown,
                catalog: augmented,
                version: plan.version,
            }));
        }
    }
    Ok(None)
}

/// The SQL type of each of `table`'s columns, with and without its modifier.
async fn column_types(table: &DistributedTable, parts: &mut Participants) -> PgResult<Vec<(String, String)>> {
    let sql = format!(
        "SELECT format_type(atttypid, atttypmod), format_type(atttypid, NULL) FROM pg_attribute \
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
    Ok(rows.into_iter().map(|mut r| (r[0].take().unwrap_or_default(), r[1].take().unwrap_or_default())).collect())
}

/// `moved` as a temporary table distributed by its column `position` and
/// co-located with `stays`: its shards are `stays`'s, named after them.
fn intermediate_table(moved: &DistributedTable, stays: &DistributedTable, position: usize) -> Arc<DistributedTable> {
    let Distribution::Hash { column_type, key, .. } = &stays.distribution else { unreachable!("only hash tables stay") };
    let n = NEXT_INTERMEDIATE.fetch_add(1, Ordering::Relaxed);
    Arc::new(DistributedTable {
        oid: INTERMEDIATE_OID,
        schema: "pg_temp".into(),
        name: format!("tessera_repartitioned_{n}"),
        distribution: Distribution::Hash {
            column: moved.columns[position].clone(),
            column_index: position,
            column_type: *column_type,
            key: key.clone(),
        },
        colocation_id: stays.colocation_id,
        columns: moved.columns.clone(),
        copy_columns: moved.columns.clone(),
        key_default: None,
        sequence_columns: Vec::new(),
        always_identity: Vec::new(),
        shards: stays.shards.clone(),
        partition_of: None,
        primary_key: Vec::new(),
    })
}

/// Plans the statement with `moved` read from `intermediate`; only a router
/// or multi-shard plan counts: the join is then co-located on the column.
fn replace_and_plan(plan: &FallbackPlan, catalog: &Catalog, moved: &DistributedTable, intermediate: &DistributedTable) -> PgResult<Option<Plan>> {
    let mut stmt = plan.statement.clone();
    let mut failure = None;
    crate::planner::replace_tables(&mut stmt, catalog, |table, alias| {
        if table.oid != moved.oid {
            return None;
        }
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

/// Where a moved row goes: the node (by its position in `Shuffle::groups`)
/// holding the shard its key hashes to.
pub(super) struct Shuffle {
    /// The key's position in the rows.
    key: usize,
    key_type: HashType,
    /// The node group of each shard of the table that stays, by shard index.
    shard_targets: Vec<usize>,
    /// The nodes the rows go to, and the rows each gets as COPY lines.
    groups: Vec<i32>,
    rows: Vec<PartialRows>,
    /// Rows and DataRow bytes routed.
    moved_rows: u64,
    moved_bytes: u64,
}

impl Shuffle {
    fn new(intermediate: &DistributedTable, key: usize, key_type: HashType) -> PgResult<Shuffle> {
        let mut groups: Vec<i32> = Vec::new();
        let mut shard_targets = Vec::with_capacity(intermediate.shards.len());
        for shard in &intermediate.shards {
            let group = *shard.placements.first().ok_or_else(|| PgError::internal(format!("shard {} has no placement", shard.id)))?;
            let target = match groups.iter().position(|g| *g == group) {
                Some(t) => t,
                None => {
                    groups.push(group);
                    groups.len() - 1
                }
            };
            shard_targets.push(target);
        }
        let rows = groups.iter().map(|_| PartialRows::new(true)).collect();
        Ok(Shuffle { key, key_type, shard_targets, groups, rows, moved_rows: 0, moved_bytes: 0 })
    }

    /// Routes one DataRow of text values to its node's rows.
    pub fn push(&mut self, msg: &Message, limits: &StatementLimits) -> PgResult<()> {
        let (key, key_type, shards) = (self.key, self.key_type, self.shard_targets.len() as u32);
        let mut hashed = Ok(row_hash(None));
        backend::each_data_row_value(msg, |i, value| {
            if let (true, Some(value)) = (i == key, value) {
                hashed = std::str::from_utf8(value)
                    .map_err(|e| e.to_string())
                    .and_then(|text| hash_text(key_type, text).map_err(|e| e.to_string()))
                    .map(|h| row_hash(Some(h)));
            }
        })?;
        let hash = hashed.map_err(|e| {
            PgError::not_supported(format!("a repartition join cannot hash a value of its join column ({}): {e}", key_type.sql_name()))
                .with_hint("Join on the distribution columns of both tables, or distribute the smaller table as a reference table.")
        })?;
        let target = self.shard_targets[shard_index(hash, shards) as usize];
        self.moved_rows += 1;
        self.moved_bytes += msg.frame().len() as u64;
        self.rows[target].push(msg, limits)
    }
}

/// What moving the rows did, for EXPLAIN ANALYZE.
pub(super) struct Moved {
    pub rows: u64,
    pub bytes: u64,
}

impl Repartition {
    /// How the rows move, for EXPLAIN.
    pub fn describe(&self) -> String {
        let Distribution::Hash { column, .. } = &self.intermediate.distribution else { unreachable!("made as a hash table") };
        format!("{} by {}, onto the shards of {}", self.moved.name, column, self.stays.name)
    }

    /// Makes the temporary tables on the nodes of the staying table's
    /// shards, recording each node group in `made` (for `drop_intermediate`,
    /// also after a failure), and with `move_rows` routes the moved table's
    /// rows into them.
    pub async fn make_intermediate(&self, catalog: &Catalog, parts: &mut Participants, move_rows: bool, made: &mut Vec<i32>) -> PgResult<Moved> {
        let Distribution::Hash { column_index, column_type, .. } = &self.intermediate.distribution else { unreachable!("made as a hash table") };
        let mut shuffle = Shuffle::new(&self.intermediate, *column_index, *column_type)?;
        if move_rows {
            let columns: Vec<String> = self.moved.columns.iter().map(|c| quote_ident(c)).collect();
            let read = format!("SELECT {} FROM {}", columns.join(", "), self.moved.qualified_name());
            let parsed = pg_query::parse(&read).map_err(|e| PgError::internal(format!("could not parse {read}: {e}")))?;
            let raw = parsed.protobuf.stmts.into_iter().next().ok_or_else(|| PgError::internal("empty statement"))?;
            let by_node = tasks_by_node(&ShardTemplate::for_query(self.version, raw, vec![self.moved.clone()]), &self.moved, catalog)?;
            shuffle_rows(parts, &by_node, &mut shuffle).await?;
        }
        let parent = self.parent();
        for (group, rows) in shuffle.groups.iter().zip(std::mem::take(&mut shuffle.rows)) {
            let node = catalog.node_for_group(*group).ok_or_else(|| PgError::internal(format!("no node for group {group}")))?;
            let create = create_sql(&self.intermediate, &self.column_types, &parent, *group);
            let worker = parts.worker(node, Access::Read).await?;
            made.push(*group);
            worker.conn.execute(&create).await?;
            copy_rows_into(&mut worker.conn, &parent, rows)
                .await
                .map_err(|e| e.with_context(format!("moving rows of {} to the node at {}", self.moved.name, node.addr)))?;
        }
        Ok(Moved { rows: shuffle.moved_rows, bytes: shuffle.moved_bytes })
    }

    /// Drops the temporary tables on the node groups `made`. A connection
    /// that broke took them with it.
    pub async fn drop_intermediate(&self, parts: &mut Participants, made: &[i32]) {
        let drop = format!("DROP TABLE IF EXISTS {}", self.parent());
        for worker in parts.workers_for(made) {
            if !worker.conn.is_broken() {
                if let Err(e) = worker.conn.execute(&drop).await {
                    tracing::debug!("could not drop {} on node group {}: {e}", self.intermediate.name, worker.group_id);
                }
            }
        }
    }

    fn parent(&self) -> String {
        format!("pg_temp.{}", quote_ident(&self.intermediate.name))
    }
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
