//! User code of the coordinator database that reaches distributed tables
//! (see `metadata::user_code`; views are expanded by `views.rs`). In the
//! coordinator database the tables are empty shells, so such code never
//! runs there: a statement calling such a function or procedure, or a DO
//! block reaching them, runs whole on a worker, whose worker-side relations
//! (commands/worker_relations.rs) show it whole tables; what cannot run
//! there (a trigger on a local table, writes through a view that is not
//! simple) is refused, naming the code and what it reaches. Materialized
//! views have a module of their own (`materialized_views.rs`).

use super::dml::{first_local_table, whole_on_any_worker};
use super::rewrite::ShardTemplate;
use super::walk::{called_functions, range_vars};
use super::Plan;
use crate::error::PgError;
use crate::metadata::user_code::plpgsql_body_use;
use crate::metadata::Catalog;
use pg_query::protobuf;
use pg_query::NodeEnum;

/// Why the statement must not run: it would run user code in the
/// coordinator database that reads or writes distributed tables there, or
/// write through a view of them.
pub(super) fn refusal(node: &NodeEnum, catalog: &Catalog) -> Option<Plan> {
    let code = &catalog.user_code;
    if code.is_empty() {
        return None;
    }
    if let Some((schema, name)) = written_relation(node) {
        if let Some(view) = catalog.view(schema, name) {
            return Some(refuse(
                format!("writing through the view \"{}\", which reads distributed tables, is not supported yet", view.name),
                "Write to the view's tables themselves.",
            ));
        }
        if let Some(touch) = code.trigger_on(catalog.schema_for(schema, name), name) {
            return Some(refuse(
                format!(
                    "a trigger on \"{name}\" runs {}, which reaches {}; in the coordinator database that holds only an empty shell of it",
                    touch.function, touch.reaches
                ),
                "Distribute the table too (its triggers then run on the workers), or move the trigger's work into the statement.",
            ));
        }
    }
    None
}

/// A statement that runs user code reaching distributed tables runs whole
/// on one worker (`ShardTarget::AnyNode`), unchanged, when everything it
/// names besides exists there too; otherwise it is refused.
pub(super) fn on_worker(version: i32, raw: &protobuf::RawStmt, node: &NodeEnum, text: &str, catalog: &Catalog) -> Option<Plan> {
    let reaches = match node {
        NodeEnum::DoStmt(d) => format!("this DO block reaches {}", do_block_reach(d, catalog)?),
        // A view's definition runs nothing now: the queries that read the
        // view are planned with it expanded, and its calls judged there. The
        // statement EXPLAIN or PREPARE holds is planned, and judged, on its own.
        NodeEnum::ViewStmt(_) | NodeEnum::ExplainStmt(_) | NodeEnum::PrepareStmt(_) => return None,
        _ => {
            let code = &catalog.user_code;
            // A cheap look at the text first: most statements call none of them.
            if code.is_empty() || !(text.is_empty() || code.touching_names().any(|name| super::inline::mentions(text, name))) {
                return None;
            }
            let touch = called_functions(node).iter().find_map(|name| code.touching(name))?;
            if let Some(local) = &touch.local {
                return Some(refuse(
                    format!(
                        "function {} reaches {} and also \"{local}\", which only the coordinator database has; it can run neither there nor on a worker",
                        touch.function, touch.reaches
                    ),
                    "Distribute the table (or make it a reference table), or keep the function to one kind of table.",
                ));
            }
            format!("function {} reaches {}", touch.function, touch.reaches)
        }
    };
    // The worker knows no temporary relation of the session: there the name
    // would mean what the session's relation hides.
    if let Some(temporary) = catalog.temporary_relation() {
        return Some(refuse(
            format!("{reaches}, so the statement would run on a worker, where this session's temporary relation \"{temporary}\" does not exist"),
            "Drop or rename the temporary relation, or run the function's queries as statements of their own.",
        ));
    }
    let runs_there = matches!(
        node,
        NodeEnum::SelectStmt(_)
            | NodeEnum::InsertStmt(_)
            | NodeEnum::UpdateStmt(_)
            | NodeEnum::DeleteStmt(_)
            | NodeEnum::CallStmt(_)
            | NodeEnum::DoStmt(_)
    );
    if !runs_there {
        return Some(refuse(
            format!("{reaches}; such code runs on a worker, but this kind of statement runs in the coordinator database, which holds only empty shells of distributed tables"),
            "Run the call in a statement of its own (SELECT, CALL), and use its result here.",
        ));
    }
    if let Some(local) = first_local_table(node, &range_vars(node), catalog) {
        return Some(refuse(
            format!("{reaches}, so the statement runs on a worker, where the coordinator database's table \"{local}\" does not exist"),
            "Call the function in a statement of its own, or distribute the table.",
        ));
    }
    Some(
        whole_on_any_worker(catalog, ShardTemplate::unchanged(version, raw.clone()))
            .unwrap_or_else(|| refuse(format!("{reaches}, but there is no active worker to run it on"), "Add a worker with citus_add_node.")),
    )
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

/// What a DO block's body reaches (anything, when it cannot be analysed);
/// None when it reaches no distributed table and may run where it is.
fn do_block_reach(stmt: &protobuf::DoStmt, catalog: &Catalog) -> Option<String> {
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
    catalog.user_code.reached_by(&used, catalog)
}
