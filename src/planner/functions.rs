//! Recognises calls of the cluster-management functions (`SELECT
//! create_distributed_table(…)` and friends), which the coordinator carries out
//! itself rather than sending anywhere.

use super::Plan;
use pg_query::protobuf::{self, SelectStmt, SetOperation};
use pg_query::NodeEnum;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClusterFunction {
    CreateDistributedTable,
    CreateReferenceTable,
    UndistributeTable,
    AddNode,
    RemoveNode,
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
}

impl ClusterFunction {
    /// Whether the call changes which tables are distributed, and how.
    pub fn changes_tables(self) -> bool {
        matches!(self, Self::CreateDistributedTable | Self::CreateReferenceTable | Self::UndistributeTable)
    }

    /// Whether the call adds or removes nodes.
    pub fn manages_nodes(self) -> bool {
        !matches!(self, Self::CreateDistributedTable | Self::CreateReferenceTable | Self::UndistributeTable | Self::RecoverPreparedTransactions)
    }

    fn by_name(name: &str) -> Option<Self> {
        Some(match name {
            "create_distributed_table" => Self::CreateDistributedTable,
            "create_reference_table" => Self::CreateReferenceTable,
            "undistribute_table" => Self::UndistributeTable,
            "citus_add_node" | "master_add_node" => Self::AddNode,
            "citus_remove_node" | "master_remove_node" => Self::RemoveNode,
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
            _ => return None,
        })
    }

    /// Parameter names in declaration order, for named-argument calls.
    pub fn parameters(self) -> &'static [&'static str] {
        match self {
            Self::CreateDistributedTable => &["table_name", "distribution_column", "distribution_type", "colocate_with", "shard_count"],
            Self::CreateReferenceTable => &["table_name"],
            Self::UndistributeTable => &["table_name", "cascade_via_foreign_keys"],
            Self::AddNode => &["nodename", "nodeport", "groupid", "noderole", "nodecluster"],
            Self::RemoveNode => &["nodename", "nodeport"],
            Self::RecoverPreparedTransactions | Self::CleanupOrphanedResources => &[],
            Self::MoveShardPlacement => &["shard_id", "source_node_name", "source_node_port", "target_node_name", "target_node_port", "shard_transfer_mode"],
            Self::GetRebalancePlan => &["relation", "threshold", "max_shard_moves", "excluded_shard_list", "drain_only", "rebalance_strategy", "improvement_threshold"],
            Self::RebalanceTableShards => &["relation", "threshold", "max_shard_moves", "excluded_shard_list", "shard_transfer_mode", "drain_only", "rebalance_strategy"],
            Self::DrainNode => &["nodename", "nodeport", "shard_transfer_mode", "rebalance_strategy"],
            Self::SetNodeProperty => &["nodename", "nodeport", "property", "value"],
            Self::CopyShardPlacement => &["shard_id", "source_node_name", "source_node_port", "target_node_name", "target_node_port", "transfer_mode"],
            Self::ReplicateReferenceTables => &["shard_transfer_mode"],
            Self::RebalanceStart => &["rebalance_strategy", "drain_only", "shard_transfer_mode"],
        }
    }
}

#[derive(Clone, Debug)]
pub struct ClusterCall {
    pub function: ClusterFunction,
    /// The result column's name (the function name, or the alias given).
    pub column_name: String,
    /// `SELECT arg1, arg2, …` in parameter order (NULL where not given): the
    /// coordinator database evaluates the arguments, whatever expressions they are.
    pub arguments_sql: String,
}

/// `SELECT f(…)`, or `SELECT * FROM f(…)` (how set-returning ones such as
/// get_rebalance_table_shards_plan are called), and nothing more.
pub(super) fn cluster_call(select: &SelectStmt) -> Option<Plan> {
    if select.op != SetOperation::SetopNone as i32 || select.where_clause.is_some() || select.target_list.len() != 1 {
        return None;
    }
    let Some(NodeEnum::ResTarget(target)) = select.target_list[0].node.as_ref() else { return None };
    let called = match select.from_clause.as_slice() {
        [] => target.val.as_deref(),
        [from] if super::decorrelate::is_bare_star(&select.target_list[0]) => match from.node.as_ref() {
            Some(NodeEnum::RangeFunction(f)) if f.functions.len() == 1 && !f.ordinality && !f.is_rowsfrom => match f.functions[0].node.as_ref() {
                Some(NodeEnum::List(list)) => list.items.first(),
                _ => None,
            },
            _ => None,
        },
        _ => None,
    };
    let Some(NodeEnum::FuncCall(call)) = called.and_then(|v| v.node.as_ref()) else { return None };
    let names = super::function_names(call);
    let (name, schema_ok) = match names.as_slice() {
        [name] => (*name, true),
        [schema, name] => (*name, matches!(*schema, "pg_catalog" | "tessera" | "citus")),
        _ => return None,
    };
    let function = ClusterFunction::by_name(name).filter(|_| schema_ok)?;
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
    let column_name = if target.name.is_empty() { name.to_string() } else { target.name.clone() };
    Some(Plan::ClusterFunction(ClusterCall { function, column_name, arguments_sql }))
}
