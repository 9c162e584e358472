//! Calls of simple LANGUAGE sql functions that reach distributed tables are
//! replaced by the functions' bodies, as PostgreSQL's planner inlines such
//! functions: `SELECT order_count(5)` becomes a scalar subquery over the
//! table, which Tessera plans over the shards. Run in the coordinator
//! database instead, the function would read the empty shell.

use super::walk::{is_query, visit_mut};
use super::{not_supported, Plan};
use crate::metadata::user_code::InlineSql;
use crate::metadata::Catalog;
use pg_query::protobuf::{self, Node};
use pg_query::NodeEnum;

/// Calls inlined in one statement at most: functions calling each other in
/// a circle are refused past it, before the nested bodies grow deep enough
/// to exhaust the stack of whatever walks them next.
const MAX_INLINED: usize = 8;

/// Stands for argument `i` while a body's parameters are replaced.
const PLACEHOLDER: &str = "\0tessera_argument_";

/// The statement with the calls it makes of inlinable functions replaced by
/// their bodies, or None when it makes none; a refusal when they call each
/// other without end.
pub(super) fn sql_functions(node: &NodeEnum, text: &str, catalog: &Catalog) -> Option<Result<NodeEnum, Plan>> {
    let code = &catalog.user_code;
    // Other statements run as their text in the coordinator database (a
    // view's definition keeps the call), so they are left to be refused.
    if !is_query(node) || !code.has_inlinable() || !text.is_empty() && !code.inlinable_names().any(|name| mentions(text, name)) {
        return None;
    }
    let mut stmt = node.clone();
    let mut inlined = 0;
    // The walk goes on into each body put in place, inlining the calls the
    // body makes in turn.
    visit_mut(&mut stmt, &mut |n| match n {
        // `SELECT f(5)` names its column after the function.
        NodeEnum::ResTarget(r) if r.name.is_empty() => {
            if let Some(NodeEnum::FuncCall(call)) = r.val.as_deref().and_then(|v| v.node.as_ref()) {
                if let Some((name, _)) = inlinable(call, catalog) {
                    r.name = name;
                }
            }
        }
        NodeEnum::FuncCall(call) if inlined < MAX_INLINED => {
            let Some((_, function)) = inlinable(call, catalog) else { return };
            if let Some(body) = body_for(&function, &call.args, catalog) {
                *n = body;
                inlined += 1;
            }
        }
        _ => {}
    });
    if inlined >= MAX_INLINED {
        return Some(Err(not_supported("SQL functions that call themselves over distributed tables are not supported")));
    }
    (inlined > 0).then_some(Ok(stmt))
}

/// Whether `text` holds `name`, in any case.
pub(super) fn mentions(text: &str, name: &str) -> bool {
    text.as_bytes().windows(name.len()).any(|w| w.eq_ignore_ascii_case(name.as_bytes()))
}

/// The function a call calls, when it can take the call's place: called by
/// position with all its arguments, as a plain call.
fn inlinable(call: &protobuf::FuncCall, catalog: &Catalog) -> Option<(String, std::sync::Arc<InlineSql>)> {
    let name = super::function_names(call).last()?.to_string();
    let function = catalog.user_code.inlinable(&name)?.clone();
    let plain =
        call.agg_order.is_empty() && call.agg_filter.is_none() && call.over.is_none() && !call.agg_star && !call.agg_distinct && !call.func_variadic;
    let positional = call.args.len() == function.args.len() && call.args.iter().all(|a| !matches!(a.node, Some(NodeEnum::NamedArgExpr(_))));
    (plain && positional).then_some((name, function))
}

/// `(SELECT …)::return_type`, the body with the call's arguments (cast to
/// the parameters' types) in place of its parameters. None when a name in
/// the body could be a parameter or a column (PostgreSQL would take the
/// column; Tessera cannot always tell), or when a STRICT function's
/// argument might be NULL.
fn body_for(function: &InlineSql, args: &[Node], catalog: &Catalog) -> Option<NodeEnum> {
    if function.strict && !args.iter().all(|a| matches!(a.node.as_ref(), Some(NodeEnum::AConst(c)) if !c.isnull)) {
        return None;
    }
    let mut body = function.body.clone();
    let columns = body_columns(&body, catalog)?;
    let cast_args: Vec<NodeEnum> = args.iter().zip(&function.args).map(|(a, (_, ty))| cast(a.node.clone()?, ty)).collect::<Option<_>>()?;
    // `f.arg` names f's parameter too.
    let function_name = function.name.as_str();
    let parameter = |names: &[&str]| -> Option<usize> {
        match names {
            [name] if !columns.iter().any(|c| c == name) => function.args.iter().position(|(n, _)| n == name),
            [qualifier, name] if *qualifier == function_name => function.args.iter().position(|(n, _)| n == name),
            _ => None,
        }
    };
    // Parameters become placeholders first, then arguments: the walk goes
    // on into what it puts in place, and an argument may itself hold a
    // parameter of the calling statement, or a column of a parameter's
    // name. No SQL text can spell a placeholder (it starts with NUL).
    let placeholder =
        |i: usize| NodeEnum::ColumnRef(protobuf::ColumnRef { fields: vec![super::string_node(&format!("{PLACEHOLDER}{i}"))], location: -1 });
    let mut ok = true;
    visit_mut(&mut body, &mut |n| match n {
        NodeEnum::ParamRef(p) if (1..=function.args.len() as i32).contains(&p.number) => *n = placeholder(p.number as usize - 1),
        NodeEnum::ParamRef(_) => ok = false,
        NodeEnum::ColumnRef(c) => {
            if let Some(i) = super::column_ref_names(c).and_then(|names| parameter(&names)) {
                *n = placeholder(i);
            }
        }
        // A subquery's own columns could shadow a parameter's name.
        NodeEnum::RangeSubselect(_) | NodeEnum::CommonTableExpr(_) | NodeEnum::RangeFunction(_) => ok = false,
        _ => {}
    });
    if !ok {
        return None;
    }
    visit_mut(&mut body, &mut |n| {
        let NodeEnum::ColumnRef(c) = n else { return };
        let index = match c.fields.as_slice() {
            [field] => match field.node.as_ref() {
                Some(NodeEnum::String(s)) => s.sval.strip_prefix(PLACEHOLDER).and_then(|i| i.parse::<usize>().ok()),
                _ => None,
            },
            _ => None,
        };
        if let Some(i) = index {
            *n = cast_args[i].clone();
        }
    });
    let sublink = NodeEnum::SubLink(Box::new(protobuf::SubLink {
        xpr: None,
        sub_link_type: protobuf::SubLinkType::ExprSublink as i32,
        sub_link_id: 0,
        testexpr: None,
        oper_name: vec![],
        subselect: Some(Box::new(Node { node: Some(body) })),
        location: -1,
    }));
    cast(sublink, &function.return_type)
}

/// Every column of the tables the body reads; None when it reads a table
/// that is not distributed (whose columns Tessera does not know).
fn body_columns(body: &NodeEnum, catalog: &Catalog) -> Option<Vec<String>> {
    let mut columns = Vec::new();
    for rv in super::walk::range_vars(body) {
        columns.extend(super::resolve_range_var(&rv, catalog)?.columns.iter().cloned());
    }
    Some(columns)
}

/// `value::type_name`, the type as `format_type` spells it.
fn cast(value: NodeEnum, type_name: &str) -> Option<NodeEnum> {
    let parsed = pg_query::parse(&format!("SELECT NULL::{type_name}")).ok()?;
    let Some(NodeEnum::SelectStmt(select)) = parsed.protobuf.stmts.into_iter().next()?.stmt?.node else { return None };
    let Some(NodeEnum::ResTarget(target)) = select.target_list.into_iter().next()?.node else { return None };
    let Some(NodeEnum::TypeCast(mut cast)) = target.val?.node else { return None };
    cast.arg = Some(Box::new(Node { node: Some(value) }));
    Some(NodeEnum::TypeCast(cast))
}
