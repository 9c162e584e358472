//! What a statement does to the session's state in the coordinator
//! database: settings it changes (which follow the session from one pooled
//! connection to the next), and state that lives in one backend alone
//! (which keeps the session on its connection; see
//! transaction/coordinator_db.rs).

use crate::connection::FOLLOWED_SETTINGS;
use crate::walk::{called_functions, visit_mut};
use pg_query::protobuf::{self, a_const};
use pg_query::NodeEnum;

/// `CURSOR_OPT_HOLD` of PostgreSQL's parsenodes.h.
const CURSOR_WITH_HOLD: i32 = 0x0020;

/// Session-level advisory locks (the `_xact` ones end with the transaction).
const SESSION_LOCKS: [&str; 4] = ["pg_advisory_lock", "pg_advisory_lock_shared", "pg_try_advisory_lock", "pg_try_advisory_lock_shared"];

/// Whether the statement may change the session's settings: SET, RESET,
/// DISCARD, or a call of `set_config`.
pub(super) fn changes_settings(node: &NodeEnum) -> bool {
    matches!(node, NodeEnum::VariableSetStmt(_) | NodeEnum::DiscardStmt(_)) || called_functions(node).iter().any(|f| f == "set_config")
}

/// Whether the statement may change where unqualified names lead: SET or
/// RESET of search_path or of the role (`"$user"`), RESET ALL, DISCARD,
/// `set_config`, making, renaming or dropping a schema (the path may name one
/// that did not exist), making a temporary relation (looked up before any
/// schema of the path), or dropping, renaming or moving a relation (which
/// may have hidden another of its name).
pub(super) fn changes_search_path(node: &NodeEnum) -> bool {
    use protobuf::ObjectType as O;
    let relation =
        |kind: O| matches!(kind, O::ObjectSchema | O::ObjectTable | O::ObjectView | O::ObjectMatview | O::ObjectForeignTable | O::ObjectSequence);
    match node {
        NodeEnum::VariableSetStmt(set) => matches!(set.name.as_str(), "" | "search_path" | "role" | "session_authorization"),
        NodeEnum::DiscardStmt(_) | NodeEnum::CreateSchemaStmt(_) => true,
        NodeEnum::RenameStmt(r) => relation(r.rename_type()),
        NodeEnum::DropStmt(d) => relation(d.remove_type()),
        NodeEnum::AlterObjectSchemaStmt(a) => relation(a.object_type()),
        _ if pins(node).is_some_and(|why| why.starts_with("a temporary")) => true,
        _ => called_functions(node).iter().any(|f| f == "set_config"),
    }
}

/// Whether the statement may create a relation: on a search_path other than
/// `public` alone, one in an earlier schema hides a distributed table of its
/// name (renaming, moving and dropping change where names lead on any path,
/// `changes_search_path`).
pub(super) fn changes_relations(node: &NodeEnum) -> bool {
    match node {
        NodeEnum::CreateStmt(_)
        | NodeEnum::CreateTableAsStmt(_)
        | NodeEnum::ViewStmt(_)
        | NodeEnum::CreateForeignTableStmt(_)
        | NodeEnum::ImportForeignSchemaStmt(_)
        | NodeEnum::CreateExtensionStmt(_) => true,
        NodeEnum::SelectStmt(select) => select.into_clause.is_some(),
        _ => false,
    }
}

/// Whether the statement reads and writes no relation and runs no user
/// code, whatever the catalog says: transaction control, settings,
/// closing what the session holds.
pub(super) fn uses_no_relation(node: &NodeEnum) -> bool {
    matches!(
        node,
        NodeEnum::TransactionStmt(_)
            | NodeEnum::VariableSetStmt(_)
            | NodeEnum::VariableShowStmt(_)
            | NodeEnum::DiscardStmt(_)
            | NodeEnum::DeallocateStmt(_)
            | NodeEnum::ClosePortalStmt(_)
            | NodeEnum::ListenStmt(_)
            | NodeEnum::UnlistenStmt(_)
    )
}

/// Whether the statement may change one of `FOLLOWED_SETTINGS`: SET or RESET
/// of one, RESET ALL, DISCARD ALL, or a call of `set_config`.
pub(super) fn changes_followed_settings(node: &NodeEnum) -> bool {
    match node {
        NodeEnum::VariableSetStmt(set) => set.name.is_empty() || FOLLOWED_SETTINGS.iter().any(|(name, _)| *name == set.name),
        NodeEnum::DiscardStmt(_) => true,
        _ => called_functions(node).iter().any(|f| f == "set_config"),
    }
}

/// Settings no module defines (`app.tenant`) that the statement sets, by
/// SET or by `set_config` with the name as a constant.
pub(super) fn custom_settings(node: &NodeEnum) -> Vec<String> {
    if let NodeEnum::VariableSetStmt(set) = node {
        return if set.name.contains('.') { vec![set.name.clone()] } else { Vec::new() };
    }
    let mut names = Vec::new();
    let mut copy = node.clone();
    visit_mut(&mut copy, &mut |n| {
        let NodeEnum::FuncCall(call) = n else { return };
        let is_set_config = matches!(call.funcname.last().and_then(|f| f.node.as_ref()), Some(NodeEnum::String(s)) if s.sval == "set_config");
        if !is_set_config {
            return;
        }
        if let Some(NodeEnum::AConst(protobuf::AConst { val: Some(a_const::Val::Sval(name)), .. })) = call.args.first().and_then(|a| a.node.as_ref())
        {
            if name.sval.contains('.') {
                names.push(name.sval.clone());
            }
        }
    });
    names
}

/// Why running the statement leaves state that only the session's
/// coordinator database backend holds, if it does.
pub(super) fn pins(node: &NodeEnum) -> Option<&'static str> {
    let temporary = |rv: Option<&protobuf::RangeVar>| rv.is_some_and(|rv| rv.relpersistence == "t");
    match node {
        NodeEnum::CreateStmt(c) if temporary(c.relation.as_ref()) => Some("a temporary table"),
        NodeEnum::CreateTableAsStmt(c) if temporary(c.into.as_ref().and_then(|i| i.rel.as_ref())) => Some("a temporary table"),
        NodeEnum::SelectStmt(s) if temporary(s.into_clause.as_ref().and_then(|i| i.rel.as_ref())) => Some("a temporary table"),
        NodeEnum::ViewStmt(v) if temporary(v.view.as_ref()) => Some("a temporary view"),
        NodeEnum::CreateSeqStmt(q) if temporary(q.sequence.as_ref()) => Some("a temporary sequence"),
        NodeEnum::ListenStmt(_) => Some("LISTEN"),
        NodeEnum::PrepareStmt(_) => Some("a prepared statement"),
        NodeEnum::DeclareCursorStmt(d) if d.options & CURSOR_WITH_HOLD != 0 => Some("a cursor WITH HOLD"),
        NodeEnum::LoadStmt(_) => Some("LOAD"),
        NodeEnum::VariableSetStmt(v) if v.name == "role" || v.name == "session_authorization" => Some("SET ROLE"),
        _ if called_functions(node).iter().any(|f| SESSION_LOCKS.contains(&f.as_str())) => Some("a session advisory lock"),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(sql: &str) -> NodeEnum {
        pg_query::parse(sql).unwrap().protobuf.stmts[0].stmt.as_ref().unwrap().node.clone().unwrap()
    }

    #[test]
    fn settings_and_pins() {
        assert!(changes_settings(&node("SET search_path = app")));
        assert!(changes_settings(&node("SELECT set_config('app.tenant', '7', false)")));
        assert!(!changes_settings(&node("SELECT 1")));
        assert_eq!(custom_settings(&node("SET app.tenant = 7")), vec!["app.tenant"]);
        assert!(changes_followed_settings(&node("SET LOCAL statement_timeout = '1s'")));
        assert!(changes_followed_settings(&node("RESET lock_timeout")));
        assert!(changes_followed_settings(&node("RESET ALL")));
        assert!(changes_followed_settings(&node("SELECT set_config('statement_timeout', '5s', false)")));
        assert!(changes_followed_settings(&node("SET bytea_output = escape")));
        assert!(!changes_followed_settings(&node("SET search_path = app")));
        assert_eq!(custom_settings(&node("SELECT set_config('app.user', 'x', false), set_config('work_mem', '8MB', false)")), vec!["app.user"]);
        assert_eq!(pins(&node("CREATE TEMP TABLE t (a int)")), Some("a temporary table"));
        assert_eq!(pins(&node("SELECT 1 AS a INTO TEMP t")), Some("a temporary table"));
        assert_eq!(pins(&node("CREATE TABLE t (a int)")), None);
        assert_eq!(pins(&node("LISTEN chan")), Some("LISTEN"));
        assert_eq!(pins(&node("DECLARE c CURSOR WITH HOLD FOR SELECT 1")), Some("a cursor WITH HOLD"));
        assert_eq!(pins(&node("DECLARE c CURSOR FOR SELECT 1")), None);
        assert_eq!(pins(&node("SELECT pg_advisory_lock(1)")), Some("a session advisory lock"));
        assert_eq!(pins(&node("SELECT pg_advisory_xact_lock(1)")), None);
        assert_eq!(pins(&node("SET ROLE app")), Some("SET ROLE"));
    }
}
