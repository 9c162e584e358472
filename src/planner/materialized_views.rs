//! Statements that store a query's rows in the coordinator database:
//! materialized views, CREATE TABLE AS and SELECT INTO over distributed
//! tables. A materialized view lives there under the user's own definition,
//! so `\d+` and `pg_get_viewdef` show what the user wrote, and reading it
//! reads its stored rows like any local table's; a table made from a query
//! is a local table. Only the query, run by CREATE, REFRESH or the table's
//! creation, reaches the distributed tables: for that one statement each
//! table's shell lends it the shards' rows (`LentShards`, carried out by the
//! executor with `tessera.lend_shards` of metadata/schema.sql), so
//! PostgreSQL's own statement, CONCURRENTLY, WITH NO DATA and temporary
//! tables included, reads the real data.

use super::walk::{called_functions, range_vars};
use super::{distributed_among, not_supported, schema_of, views, Plan};
use crate::connection::{quote_ident, quote_literal};
use crate::metadata::Catalog;
use pg_query::protobuf::ObjectType;
use pg_query::NodeEnum;
use std::sync::Arc;

/// A statement the coordinator database runs as it is, while the shells of
/// the distributed tables its query reads lend it their shards' rows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LentShards {
    /// The statement's kind, for errors: `CREATE MATERIALIZED VIEW`.
    pub statement: &'static str,
    /// The shells that lend their shards, by oid.
    pub tables: Vec<u32>,
    /// SQL naming the role whose user mapping the lent shards are read
    /// with: the view's owner, as PostgreSQL runs the query as the owner.
    pub reader: String,
}

/// The plan of CREATE MATERIALIZED VIEW, REFRESH MATERIALIZED VIEW, CREATE
/// TABLE AS or SELECT INTO when the query reads distributed tables; None for
/// any other statement.
pub(super) fn plan(node: &NodeEnum, catalog: &Catalog) -> Option<Plan> {
    match node {
        NodeEnum::CreateTableAsStmt(c) => {
            let statement = if c.objtype == ObjectType::ObjectMatview as i32 { "CREATE MATERIALIZED VIEW" } else { "CREATE TABLE AS" };
            let query = c.query.as_ref()?.node.as_ref()?;
            lend_to(statement, query, "current_user".into(), catalog)
        }
        NodeEnum::SelectStmt(s) if s.into_clause.is_some() => lend_to("SELECT INTO", node, "current_user".into(), catalog),
        NodeEnum::RefreshMatViewStmt(r) => {
            let rv = r.relation.as_ref()?;
            let view = catalog.user_code.materialized_view(catalog.schema_for(schema_of(rv), &rv.relname), &rv.relname)?;
            let name = match schema_of(rv) {
                Some(schema) => format!("{}.{}", quote_ident(schema), quote_ident(&rv.relname)),
                None => quote_ident(&rv.relname),
            };
            let owner = format!("(SELECT relowner::regrole::name FROM pg_catalog.pg_class WHERE oid = {}::regclass)", quote_literal(&name));
            lend_to("REFRESH MATERIALIZED VIEW", &view.query, owner, catalog)
        }
        _ => None,
    }
}

fn lend_to(statement: &'static str, query: &NodeEnum, reader: String, catalog: &Catalog) -> Option<Plan> {
    // The views it reads are expanded: their tables lend too.
    let expanded = match views::expand(query, catalog) {
        Some(Ok(expanded)) => expanded,
        Some(Err(refusal)) => return Some(refusal),
        None => query.clone(),
    };
    let tables = distributed_among(&range_vars(&expanded), catalog);
    if tables.is_empty() {
        return None;
    }
    if let Some(touch) = called_functions(&expanded).iter().find_map(|name| catalog.user_code.touching(name)) {
        return Some(not_supported(format!(
            "{statement} whose query calls {}, which reaches {}, is not supported: the function would run in the coordinator database",
            touch.function, touch.reaches
        )));
    }
    // PostgreSQL lets no table inherit from a partitioned table or a partition.
    if let Some(t) = tables.iter().find(|t| t.partition_of.is_some() || catalog.tables().any(|p| p.partition_of == Some(t.oid))) {
        return Some(not_supported(format!(
            "{statement} over \"{}\", a partitioned distributed table or a partition of one, is not supported yet",
            t.name
        )));
    }
    Some(Plan::LocalOverShards(Arc::new(LentShards { statement, tables: tables.iter().map(|t| t.oid).collect(), reader })))
}
