//! Recognises calls of the cluster-management functions (`SELECT
//! create_distributed_table(…)` and friends), which the coordinator carries out
//! itself rather than sending anywhere.

use super::Plan;
use crate::error::{PgError, PgResult};
use pg_query::protobuf::{self, SelectStmt, SetOperation};
use pg_query::NodeEnum;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClusterFunction {
    CreateDistributedTable,
    CreateDistributedTableConcurrently,
    CreateReferenceTable,
    UndistributeTable,
    AlterDistributedTable,
    AddNode,
    RemoveNode,
    UpdateNode,
    DisableNode,
    ActivateNode,
    RecoverPreparedTransactions,
    MoveShardPlacement,
    CleanupOrphanedResources,
    GetRebalancePlan,
    RebalanceTableShards,
    DrainNode,
    SetNodeProperty,
    CopyShardPlacement,
    ReplicateReferenceTables,
    RebalanceStart,
    RunCommandOnWorkers,
    RunCommandOnAllNodes,
    RunCommandOnShards,
    RunCommandOnPlacements,
    RunCommandOnColocatedPlacements,
    CreateTimePartitions,
    DropOldTimePartitions,
    CreateRestorePoint,
    StatStatementsReset,
    StatTenantsReset,
    StatCountersReset,
}

impl ClusterFunction {
    /// Whether the call changes which tables are distributed, and how.
    pub fn changes_tables(self) -> bool {
        matches!(
            self,
            Self::CreateDistributedTable
                | Self::CreateDistributedTableConcurrently
                | Self::CreateReferenceTable
                | Self::UndistributeTable
                | Self::AlterDistributedTable
                | Self::CreateTimePartitions
                | Self::DropOldTimePartitions
        )
    }

    /// Called with CALL, answering with no rows.
    pub fn is_procedure(self) -> bool {
        self == Self::DropOldTimePartitions
    }

    /// Node and shard management changes the cluster for every database user:
    /// only a superuser may, as in Citus. Commands run on the nodes act as
    /// the caller's role, so any role may.
    pub fn superuser_only(self) -> bool {
        !self.changes_tables() && self != Self::RecoverPreparedTransactions && !self.runs_commands()
    }

    /// run_command_on_workers and its kin.
    pub fn runs_commands(self) -> bool {
        matches!(
            self,
            Self::RunCommandOnWorkers
                | Self::RunCommandOnAllNodes
                | Self::RunCommandOnShards
                | Self::RunCommandOnPlacements
                | Self::RunCommandOnColocatedPlacements
        )
    }

    fn by_name(name: &str) -> Option<Self> {
        Some(match name {
            "create_distributed_table" => Self::CreateDistributedTable,
            "create_distributed_table_concurrently" => Self::CreateDistributedTableConcurrently,
            "create_reference_table" => Self::CreateReferenceTable,
            "undistribute_table" => Self::UndistributeTable,
            "alter_distributed_table" => Self::AlterDistributedTable,
            "citus_add_node" | "master_add_node" => Self::AddNode,
            "citus_remove_node" | "master_remove_node" => Self::RemoveNode,
            "citus_update_node" | "master_update_node" => Self::UpdateNode,
            "citus_disable_node" | "master_disable_node" => Self::DisableNode,
            "citus_activate_node" | "master_activate_node" => Self::ActivateNode,
            "recover_prepared_transactions" => Self::RecoverPreparedTransactions,
            "citus_move_shard_placement" | "master_move_shard_placement" => Self::MoveShardPlacement,
            "citus_cleanup_orphaned_resources" => Self::CleanupOrphanedResources,
            "get_rebalance_table_shards_plan" => Self::GetRebalancePlan,
            "rebalance_table_shards" => Self::RebalanceTableShards,
            "citus_drain_node" | "master_drain_node" => Self::DrainNode,
            "citus_set_node_property" => Self::SetNodeProperty,
            "citus_copy_shard_placement" | "master_copy_shard_placement" => Self::CopyShardPlacement,
            "replicate_reference_tables" => Self::ReplicateReferenceTables,
            "citus_rebalance_start" => Self::RebalanceStart,
            "run_command_on_workers" => Self::RunCommandOnWorkers,
            "run_command_on_all_nodes" => Self::RunCommandOnAllNodes,
            "run_command_on_shards" => Self::RunCommandOnShards,
            "run_command_on_placements" => Self::RunCommandOnPlacements,
            "run_command_on_colocated_placements" => Self::RunCommandOnColocatedPlacements,
            "create_time_partitions" => Self::CreateTimePartitions,
            "drop_old_time_partitions" => Self::DropOldTimePartitions,
            "citus_create_restore_point" => Self::CreateRestorePoint,
            "citus_stat_statements_reset" => Self::StatStatementsReset,
            "citus_stat_tenants_reset" => Self::StatTenantsReset,
            "citus_stat_counters_reset" => Self::StatCountersReset,
            _ => return None,
        })
    }

    /// Whether the function returns rows of several columns (else one value).
    pub fn returns_rows(self) -> bool {
        self == Self::GetRebalancePlan || self.runs_commands()
    }

    /// Parameter names in declaration order, for named-argument calls.
    pub fn parameters(self) -> &'static [&'static str] {
        match self {
            Self::CreateDistributedTable | Self::CreateDistributedTableConcurrently => {
                &["table_name", "distribution_column", "distribution_type", "colocate_with", "shard_count"]
            }
            Self::CreateReferenceTable => &["table_name"],
            Self::UndistributeTable => &["table_name", "cascade_via_foreign_keys"],
            Self::AlterDistributedTable => &["table_name", "distribution_column", "shard_count", "colocate_with", "cascade_to_colocated"],
            Self::AddNode => &["nodename", "nodeport", "groupid", "noderole", "nodecluster"],
            Self::RemoveNode => &["nodename", "nodeport"],
            Self::UpdateNode => &["node_id", "new_node_name", "new_node_port", "force", "lock_cooldown"],
            Self::DisableNode => &["nodename", "nodeport", "synchronous"],
            Self::ActivateNode => &["nodename", "nodeport"],
            Self::RecoverPreparedTransactions | Self::CleanupOrphanedResources => &[],
            Self::MoveShardPlacement => {
                &["shard_id", "source_node_name", "source_node_port", "target_node_name", "target_node_port", "shard_transfer_mode"]
            }
            Self::GetRebalancePlan => {
                &["relation", "threshold", "max_shard_moves", "excluded_shard_list", "drain_only", "rebalance_strategy", "improvement_threshold"]
            }
            Self::RebalanceTableShards => {
                &["relation", "threshold", "max_shard_moves", "excluded_shard_list", "shard_transfer_mode", "drain_only", "rebalance_strategy"]
            }
            Self::DrainNode => &["nodename", "nodeport", "shard_transfer_mode", "rebalance_strategy"],
            Self::SetNodeProperty => &["nodename", "nodeport", "property", "value"],
            Self::CopyShardPlacement => {
                &["shard_id", "source_node_name", "source_node_port", "target_node_name", "target_node_port", "transfer_mode"]
            }
            Self::ReplicateReferenceTables => &["shard_transfer_mode"],
            Self::RebalanceStart => &["rebalance_strategy", "drain_only", "shard_transfer_mode"],
            Self::RunCommandOnWorkers => &["command", "parallel"],
            Self::RunCommandOnAllNodes => &["command", "parallel", "give_warning_for_connection_errors"],
            Self::RunCommandOnShards | Self::RunCommandOnPlacements => &["table_name", "command", "parallel"],
            Self::RunCommandOnColocatedPlacements => &["table_name1", "table_name2", "command", "parallel"],
            Self::CreateTimePartitions => &["table_name", "partition_interval", "end_at", "start_from"],
            Self::DropOldTimePartitions => &["table_name", "older_than"],
            Self::CreateRestorePoint => &["name"],
            Self::StatStatementsReset | Self::StatTenantsReset => &[],
            Self::StatCountersReset => &["database_id"],
        }
    }
}

#[derive(Clone, Debug)]
pub struct ClusterCall {
    pub function: ClusterFunction,
    /// The result column's name (the function name, or the alias given).
    pub column_name: String,
    /// Called in the select list (`SELECT f(…)`), where a function returning
    /// several columns gives one column of their records, rather than in FROM.
    pub in_select_list: bool,
    /// The query around a call in FROM that is more than `SELECT * FROM
    /// f(…)`, reading the function's rows under the name RESULT_NAME (with
    /// the call's alias, or the function's name as PostgreSQL gives it).
    pub around: Option<Box<SelectStmt>>,
    /// `SELECT arg1, arg2, …` in parameter order (NULL where not given): the
    /// coordinator database evaluates the arguments, whatever expressions they are.
    pub arguments_sql: String,
}

/// The name the rows of a cluster function called in FROM go by in the
/// query around the call (a WITH query of that name replaces the call).
const RESULT_NAME: &str = "tessera_cluster_function_rows";

/// `SELECT f(…)`, `SELECT * FROM f(…)` (how set-returning ones such as
/// get_rebalance_table_shards_plan are called), or, for those returning
/// rows, any query whose FROM is the one call
/// (`SELECT result FROM run_command_on_workers(…) WHERE …`).
pub(super) fn cluster_call(select: &SelectStmt) -> Option<Plan> {
    if select.op != SetOperation::SetopNone as i32 {
        return None;
    }
    let (called, alias, around) = match select.from_clause.as_slice() {
        [] if select.where_clause.is_none() && select.target_list.len() == 1 => {
            let Some(NodeEnum::ResTarget(target)) = select.target_list[0].node.as_ref() else { return None };
            (target.val.as_deref(), target.name.clone(), None)
        }
        [from] => {
            let Some(NodeEnum::RangeFunction(f)) = from.node.as_ref() else { return None };
            if f.functions.len() != 1 || f.ordinality || f.is_rowsfrom {
                return None;
            }
            let Some(NodeEnum::List(list)) = f.functions[0].node.as_ref() else { return None };
            let bare = select.where_clause.is_none()
                && select.target_list.len() == 1
                && super::decorrelate::is_bare_star(&select.target_list[0])
                && super::only_filters(select);
            let around = (!bare).then(|| {
                let relation = protobuf::RangeVar {
                    relname: RESULT_NAME.into(),
                    inh: true,
                    relpersistence: "p".into(),
                    alias: f.alias.clone(),
                    location: -1,
                    ..Default::default()
                };
                let mut around = select.clone();
                around.from_clause = vec![protobuf::Node { node: Some(NodeEnum::RangeVar(relation)) }];
                Box::new(around)
            });
            (list.items.first(), String::new(), around)
        }
        _ => return None,
    };
    let Some(NodeEnum::FuncCall(call)) = called.and_then(|v| v.node.as_ref()) else { return None };
    let (function, name) = called_function(call)?;
    if function.is_procedure() {
        return None;
    }
    if let Some(around) = &around {
        if !function.returns_rows() {
            return None;
        }
        // The query around the call runs in the coordinator database, where
        // distributed tables are empty shells.
        let mut tree = NodeEnum::SelectStmt(around.clone());
        let mut relations = 0;
        super::walk::visit_mut(&mut tree, &mut |n| relations += usize::from(matches!(n, NodeEnum::RangeVar(_))));
        if relations > 1 {
            return Some(super::not_supported(format!("a query around {name}() cannot read tables; select from the function alone")));
        }
    }
    let in_select_list = select.from_clause.is_empty();
    planned_call(call, function, name, alias, in_select_list, around)
}

/// `CALL p(…)` of a cluster procedure (drop_old_time_partitions).
pub(super) fn cluster_procedure_call(call: &protobuf::CallStmt) -> Option<Plan> {
    let call = call.funccall.as_deref()?;
    let (function, name) = called_function(call)?;
    function.is_procedure().then(|| planned_call(call, function, name, String::new(), false, None))?
}

/// The cluster function a call names, unqualified or in one of the schemas
/// Citus's names resolve in.
fn called_function(call: &protobuf::FuncCall) -> Option<(ClusterFunction, &str)> {
    let names = super::function_names(call);
    let (name, schema_ok) = match names.as_slice() {
        [name] => (*name, true),
        [schema, name] => (*name, matches!(*schema, "pg_catalog" | "tessera" | "citus")),
        _ => return None,
    };
    Some((ClusterFunction::by_name(name).filter(|_| schema_ok)?, name))
}

fn planned_call(
    call: &protobuf::FuncCall,
    function: ClusterFunction,
    name: &str,
    alias: String,
    in_select_list: bool,
    around: Option<Box<SelectStmt>>,
) -> Option<Plan> {
    let params = function.parameters();
    let mut slots: Vec<Option<protobuf::Node>> = vec![None; params.len()];
    for (i, arg) in call.args.iter().enumerate() {
        let (slot, value) = match arg.node.as_ref() {
            Some(NodeEnum::NamedArgExpr(named)) => {
                let Some(pos) = params.iter().position(|p| *p == named.name) else {
                    return Some(super::not_supported(format!("{name}() has no parameter named \"{}\"", named.name)));
                };
                (pos, named.arg.as_deref().cloned())
            }
            _ => (i, Some(arg.clone())),
        };
        if slot >= slots.len() {
            return Some(super::not_supported(format!("too many arguments for {name}()")));
        }
        slots[slot] = value;
    }
    let null = protobuf::Node { node: Some(NodeEnum::AConst(protobuf::AConst { isnull: true, val: None, location: -1 })) };
    let targets = slots.into_iter().map(|v| super::res_target("", v.unwrap_or_else(|| null.clone()))).collect();
    let eval = SelectStmt { target_list: targets, ..super::plain_select() };
    let arguments_sql = if params.is_empty() {
        String::new()
    } else {
        super::deparse::deparse_statement(super::deparse::BUILT_TREE_VERSION, NodeEnum::SelectStmt(Box::new(eval))).ok()?
    };
    let column_name = if alias.is_empty() { name.to_string() } else { alias };
    let around = around.map(|mut around| {
        if let Some(NodeEnum::RangeVar(relation)) = around.from_clause[0].node.as_mut() {
            relation.alias.get_or_insert_with(|| protobuf::Alias { aliasname: name.to_string(), colnames: vec![] });
        }
        around
    });
    Some(Plan::ClusterFunction(ClusterCall { function, column_name, in_select_list, around, arguments_sql }))
}

impl ClusterCall {
    /// The query around the call with the function's rows given: `rows_sql`
    /// is a query yielding them, in `columns`, which becomes a WITH query the
    /// statement reads in the call's place.
    pub fn around_rows(&self, columns: &[&str], rows_sql: &str) -> PgResult<Option<String>> {
        let Some(around) = &self.around else { return Ok(None) };
        let columns: Vec<String> = columns.iter().map(|c| crate::connection::quote_ident(c)).collect();
        let text = format!("WITH {RESULT_NAME}({}) AS ({rows_sql}) SELECT", columns.join(", "));
        let parsed = pg_query::parse(&text).map_err(|e| PgError::internal(format!("the rows of {}: {e}", self.column_name)))?;
        let rows = match parsed.protobuf.stmts.first().and_then(|s| s.stmt.as_ref()).and_then(|s| s.node.as_ref()) {
            Some(NodeEnum::SelectStmt(select)) => select.with_clause.as_ref().and_then(|w| w.ctes.first()).cloned(),
            _ => None,
        };
        let rows = rows.ok_or_else(|| PgError::internal(format!("the rows of {} made no WITH query", self.column_name)))?;
        let mut around = (**around).clone();
        around.with_clause.get_or_insert_with(Default::default).ctes.insert(0, rows);
        super::deparse::deparse_statement(super::deparse::BUILT_TREE_VERSION, NodeEnum::SelectStmt(Box::new(around))).map(Some)
    }
}
