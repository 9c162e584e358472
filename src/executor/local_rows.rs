//! Runs a write to distributed tables that reads local tables (see
//! `planner::LocalRowsPlan`): the coordinator database gives each local
//! relation's rows on the session's own connection (so a block's writes to
//! them count), and the statement is planned again with the rows as VALUES
//! in their place, where the pushdown tiers can take it.

use super::multi_shard::{rows_as_relation, type_names};
use crate::connection::{quote_ident, text_row_size};
use crate::error::{PgError, PgResult};
use crate::metadata::Catalog;
use crate::planner::rewrite::rows_placeholder;
use crate::planner::{plan_tree, subselect_node, LocalRowsPlan, Plan};
use crate::protocol::frontend;
use crate::transaction::Participants;
use crate::walk::visit_mut;
use pg_query::protobuf;
use pg_query::NodeEnum;

/// The most rows a local relation may give such a statement: each task
/// carries them all in its SQL text.
const MOST_ROWS: usize = 50_000;

/// The statement's plan with the local relations' rows in their place.
pub async fn replanned(plan: &LocalRowsPlan, catalog: &Catalog, parts: &mut Participants) -> PgResult<Plan> {
    let mut relations = Vec::with_capacity(plan.relations.len());
    for rv in &plan.relations {
        let name = match rv.schemaname.as_str() {
            "" => quote_ident(&rv.relname),
            schema => format!("{}.{}", quote_ident(schema), quote_ident(&rv.relname)),
        };
        let limits = parts.limits().clone();
        let local = parts.local().await?;
        frontend::query(local.out(), &format!("SELECT * FROM {name}"));
        let result = local.read_result(|row| limits.charge(text_row_size(row))).await;
        parts.observe_local_status();
        let (fields, rows) = result?;
        if rows.len() > MOST_ROWS {
            return Err(PgError::not_supported(format!(
                "this statement writes distributed tables and reads the local table {name}, whose {} rows are more than the {MOST_ROWS} the coordinator ships to the shards",
                rows.len()
            ))
            .with_hint(format!("Make {name} a reference table (create_reference_table) or distribute it.")));
        }
        let types = type_names(parts, &fields).await?;
        let columns: Vec<String> = fields.iter().map(|f| quote_ident(&f.name)).collect();
        relations.push((rv, rows_as_relation(&types, &rows, parts.limits())?, columns));
    }
    // Planned first with a one-row placeholder per relation: a pushdown plan
    // takes the rows' text into each task's statement as it is
    // (`ShardTemplate::fill`), which costs a string copy per task where
    // the rows as parse-tree nodes would be deparsed once per shard.
    let placeholders: Vec<String> =
        relations.iter().enumerate().map(|(i, (_, _, columns))| rows_placeholder(&format!("tessera_local_rows_{i}"), columns.len())).collect();
    let mut pushdown = plan_with(plan, catalog, &relations, &placeholders)?;
    if matches!(pushdown, Plan::Router(_) | Plan::MultiShard(_)) {
        for (placeholder, (_, rows, _)) in placeholders.iter().zip(relations) {
            if !pushdown.fill_placeholder(placeholder, std::sync::Arc::from(rows)) {
                return Err(PgError::internal("a statement's pushdown plan with local rows is shared"));
            }
        }
        return Ok(pushdown);
    }
    let rows: Vec<String> = relations.iter().map(|(_, rows, _)| rows.clone()).collect();
    plan_with(plan, catalog, &relations, &rows)
}

/// The statement planned with each local relation replaced by the FROM item
/// `items` gives for it.
fn plan_with(plan: &LocalRowsPlan, catalog: &Catalog, relations: &[(&protobuf::RangeVar, String, Vec<String>)], items: &[String]) -> PgResult<Plan> {
    let mut statement = plan.statement.clone();
    let mut failure = None;
    visit_mut(&mut statement, &mut |n| {
        let NodeEnum::RangeVar(rv) = n else { return };
        let Some(i) = relations.iter().position(|(r, _, _)| r.schemaname == rv.schemaname && r.relname == rv.relname) else { return };
        let columns = &relations[i].2;
        let (alias, columns) = match &rv.alias {
            Some(protobuf::Alias { aliasname, colnames }) if !colnames.is_empty() => {
                (aliasname.clone(), crate::planner::qualified_name(colnames).iter().map(|c| quote_ident(c)).collect())
            }
            Some(a) => (a.aliasname.clone(), columns.clone()),
            None => (rv.relname.clone(), columns.clone()),
        };
        match subselect_node(&format!("{} AS {}({})", items[i], quote_ident(&alias), columns.join(", "))) {
            Ok(item) => *n = item,
            Err(e) => failure = Some(e),
        }
    });
    if let Some(e) = failure {
        return Err(e);
    }
    match plan_tree(plan.version, statement, catalog) {
        Plan::WithLocalRows(_) => Err(PgError::internal("a statement with its local tables' rows in place still reads local tables")),
        replanned => Ok(replanned),
    }
}
