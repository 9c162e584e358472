//! User code of the coordinator database that reaches distributed tables
//! (see `metadata::user_code`; views are expanded by `views.rs`). Functions,
//! procedures, DO blocks and triggers would run in the coordinator database,
//! where the tables are empty shells: statements that would run them there
//! are refused, naming the code and what it reaches.

use super::walk::called_functions;
use super::Plan;
use crate::error::PgError;
use crate::metadata::user_code::plpgsql_body_use;
use crate::metadata::Catalog;
use pg_query::protobuf;
use pg_query::NodeEnum;

/// Why the statement must not run: it would run user code in the
/// coordinator database that reads or writes distributed tables there, or
/// write through a view of them.
pub(super) fn refusal(node: &NodeEnum, text: &str, catalog: &Catalog) -> Option<Plan> {
    let code = &catalog.user_code;
    if let NodeEnum::DoStmt(d) = node {
        return do_block(d, catalog);
    }
    if code.is_empty() {
        return None;
    }
    if let Some((schema, name)) = written_relation(node) {
        if let Some(view) = code.view(schema, name) {
            return Some(refuse(
                format!("writing through the view \"{}\", which reads distributed tables, is not supported yet", view.name),
                "Write to the view's tables themselves.",
            ));
        }
        if let Some(touch) = code.trigger_on(schema, name) {
            return Some(refuse(
                format!(
                    "a trigger on \"{name}\" runs {}, which reaches {}; in the coordinator database that holds only an empty shell of it",
                    touch.function, touch.reaches
                ),
                "Distribute the table too (its triggers then run on the workers), or move the trigger's work into the statement.",
            ));
        }
    }
    if let NodeEnum::RefreshMatViewStmt(r) = node {
        let rel = r.relation.as_ref()?;
        let view = code.view(super::schema_of(rel), &rel.relname)?;
        return Some(refuse(
            format!("the materialized view \"{}\" reads distributed tables, which the coordinator database holds only as empty shells; refreshing it there would empty it", view.name),
            "Keep the results in a table filled with INSERT … SELECT instead.",
        ));
    }
    // A view's definition runs nothing now: the queries that read the view
    // will be planned with it expanded, and its calls judged there.
    if matches!(node, NodeEnum::ViewStmt(_)) {
        return None;
    }
    // A cheap look at the text first: most statements call none of them.
    if text.is_empty() || code.touching_names().any(|name| super::inline::mentions(text, name)) {
        if let Some(touch) = called_functions(node).iter().find_map(|name| code.touching(name)) {
            return Some(refuse(
                format!(
                    "function {} reaches {}, but functions run in the coordinator database, which holds only empty shells of distributed tables",
                    touch.function, touch.reaches
                ),
                "Write its query into the statement itself, which Tessera plans over the shards.",
            ));
        }
    }
    None
}

fn refuse(message: String, hint: &str) -> Plan {
    Plan::Unsupported(PgError::not_supported(message).with_hint(hint.to_string()))
}

/// The table a statement writes rows into, as it names it.
fn written_relation(node: &NodeEnum) -> Option<(Option<&str>, &str)> {
    let rv = match node {
        NodeEnum::InsertStmt(s) => s.relation.as_ref(),
        NodeEnum::UpdateStmt(s) => s.relation.as_ref(),
        NodeEnum::DeleteStmt(s) => s.relation.as_ref(),
        NodeEnum::MergeStmt(s) => s.relation.as_ref(),
        NodeEnum::CopyStmt(s) if s.is_from => s.relation.as_ref(),
        _ => None,
    }?;
    Some((super::schema_of(rv), rv.relname.as_str()))
}

/// A DO block runs in the coordinator database: refused when its body
/// reaches distributed tables (or cannot be analysed).
fn do_block(stmt: &protobuf::DoStmt, catalog: &Catalog) -> Option<Plan> {
    let mut body = None;
    let mut language = "plpgsql".to_string();
    for arg in &stmt.args {
        let Some(NodeEnum::DefElem(d)) = arg.node.as_ref() else { continue };
        let Some(NodeEnum::String(value)) = d.arg.as_deref().and_then(|a| a.node.as_ref()) else { continue };
        match d.defname.as_str() {
            "as" => body = Some(value.sval.clone()),
            "language" => language = value.sval.to_ascii_lowercase(),
            _ => {}
        }
    }
    let used = if language == "plpgsql" {
        let body = body?;
        // The body parses as a function's: give it one whose quoting it cannot end.
        let mut tag = "tessera_do".to_string();
        while body.contains(&format!("${tag}$")) {
            tag.push('_');
        }
        plpgsql_body_use(&format!("CREATE FUNCTION pg_temp.tessera_do() RETURNS void LANGUAGE plpgsql AS ${tag}${body}${tag}$"))
    } else {
        crate::metadata::user_code::BodyUse { dynamic: true, ..Default::default() }
    };
    let reaches = catalog.user_code.reached_by(&used, catalog)?;
    Some(refuse(
        format!("this DO block reaches {reaches}, but it would run in the coordinator database, which holds only empty shells of distributed tables"),
        "Run its statements one by one through Tessera, or put the logic in the client.",
    ))
}
