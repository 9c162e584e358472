//! Calls of distributed functions and procedures (`create_distributed_function`):
//! `SELECT f(…)` (the call is the whole statement) and `CALL p(…)` whose
//! distribution argument is a constant or a bind parameter go whole to the
//! node holding that value's shard of the function's co-located tables, as
//! Citus delegates them. There the function runs as any statement does on a
//! worker: its own statements reach the local shards through the
//! worker-side relations (commands/worker_relations.rs), with PL/pgSQL's
//! cached plans kept by the pooled worker connection; a distributed function
//! it calls runs where it is. The plan keeps what the statement would do
//! undelegated, for `citus.enable_function_delegation = off` and for
//! transaction blocks: there a call is delegated with `force_delegation`, or
//! when its function reaches distributed tables (it would run on some worker
//! anyway), and the block goes on as any distributed block.

use super::keys::key_value;
use super::keys::ShardTarget;
use super::rewrite::{CopiedCall, ShardTemplate};
use super::router::{router, Command, RouterPlan};
use super::{function_names, Plan};
use crate::metadata::{Catalog, Distribution};
use pg_query::protobuf;
use pg_query::NodeEnum;
use std::sync::Arc;

/// A call that may be delegated, and the plan that runs it otherwise.
#[derive(Debug)]
pub struct Delegation {
    /// The call, routed by its distribution argument.
    pub call: Arc<RouterPlan>,
    /// The same call to the per-shard copy of a PL/pgSQL function
    /// (planner/function_copy.rs), for calls outside transaction blocks.
    pub copy: Option<Arc<RouterPlan>>,
    /// Set once a copy could not be made: this plan calls the function.
    pub copy_failed: std::sync::atomic::AtomicBool,
    /// Delegated inside transaction blocks too.
    pub force_delegation: bool,
    pub otherwise: Plan,
}

/// The delegated form of the statement, when it is a call of a distributed
/// function with a distribution argument that picks one shard (to the
/// function and to its per-shard copy); and whether the function is to be
/// delegated inside transaction blocks too.
pub(super) fn delegated_call(
    version: i32,
    raw: &protobuf::RawStmt,
    node: &NodeEnum,
    catalog: &Catalog,
) -> Option<(Arc<RouterPlan>, Option<Arc<RouterPlan>>, bool)> {
    if !catalog.has_functions() {
        return None;
    }
    let call = match node {
        NodeEnum::SelectStmt(select) => whole_statement_call(select)?,
        NodeEnum::CallStmt(call) => call.funccall.as_ref()?,
        _ => return None,
    };
    if call.agg_star || call.func_variadic {
        return None;
    }
    let (schema, name) = match function_names(call).as_slice() {
        [name] => (None, *name),
        [schema, name] => (Some(*schema), *name),
        _ => return None,
    };
    let positional = call.args.iter().take_while(|a| !matches!(a.node, Some(NodeEnum::NamedArgExpr(_)))).count();
    let mut named: Vec<(&str, &protobuf::Node)> = Vec::new();
    for arg in &call.args[positional..] {
        let Some(NodeEnum::NamedArgExpr(n)) = arg.node.as_ref() else { return None };
        named.push((n.name.as_str(), n.arg.as_deref()?));
    }
    let names: Vec<&str> = named.iter().map(|(name, _)| *name).collect();
    let function = catalog.function(schema, name, positional, &names)?;
    let (index, table) = function.distribution.as_ref()?;
    let Distribution::Hash { key, .. } = &table.distribution else { return None };
    // Left to its default, the argument is not known here: undelegated.
    let argument = match call.args.get(*index).filter(|_| *index < positional) {
        Some(arg) => arg,
        None => named.iter().find(|(name, _)| function.arg_names.get(*index).is_some_and(|a| a == name)).map(|(_, arg)| *arg)?,
    };
    // A NULL argument (Some(Err)) picks no shard: the call runs undelegated.
    let value = key_value(argument, key)?.ok()?;
    let routed = |template| match router(Command::WholeOnWorker, ShardTarget::Key(value.clone()), Some(table.clone()), template) {
        Plan::Router(call) => Some(call),
        _ => None,
    };
    let call = routed(ShardTemplate::unchanged(version, raw.clone()))?;
    let copy = function
        .copied_per_shard
        .is_some()
        .then(|| {
            routed(ShardTemplate::calling_copy(
                version,
                raw.clone(),
                CopiedCall { anchor: table.clone(), catalog_version: catalog.version, signature: function.signature.clone(), argument: *index },
            ))
        })
        .flatten();
    Some((call, copy, function.force_delegation))
}

/// `f(…)` of `SELECT f(…)`, with nothing else in the statement.
fn whole_statement_call(select: &protobuf::SelectStmt) -> Option<&protobuf::FuncCall> {
    let bare = select.from_clause.is_empty()
        && select.where_clause.is_none()
        && select.group_clause.is_empty()
        && select.having_clause.is_none()
        && select.window_clause.is_empty()
        && select.sort_clause.is_empty()
        && select.limit_count.is_none()
        && select.limit_offset.is_none()
        && select.distinct_clause.is_empty()
        && select.with_clause.is_none()
        && select.into_clause.is_none()
        && select.locking_clause.is_empty()
        && select.values_lists.is_empty()
        && select.larg.is_none();
    let [target] = select.target_list.as_slice() else { return None };
    let Some(NodeEnum::ResTarget(target)) = target.node.as_ref() else { return None };
    match target.val.as_deref()?.node.as_ref()? {
        NodeEnum::FuncCall(call) if bare && call.over.is_none() && call.agg_filter.is_none() && call.agg_order.is_empty() => Some(call),
        _ => None,
    }
}
