//! Uncorrelated scalar subqueries over distributed tables, such as the one in
//! `SELECT count(*) FROM a WHERE a.id = (SELECT max(b.id) FROM b)`.
//! PostgreSQL computes such a subquery once per statement (an InitPlan). The
//! coordinator does the same, as a distributed statement of its own, and
//! writes the value into the statement as a typed constant: the statement
//! can then route to one shard group, or run on the shards, where it would
//! otherwise move whole tables (see executor/fallback.rs).
//!
//! Only subqueries that provably name nothing of the query around them
//! count: their FROM clause holds distributed or reference tables alone
//! (joined or not), and every column they name belongs to one of those
//! tables; no subquery of their own, no parameter.

use super::multi_shard::name_strength;
use super::walk::visit_mut;
use super::{column_ref_names, resolve_range_var};
use crate::error::{PgError, PgResult};
use crate::metadata::{Catalog, DistributedTable};
use pg_query::protobuf::{self, SubLinkType};
use pg_query::NodeEnum;

/// The uncorrelated scalar subqueries over distributed tables of `stmt`, in
/// the order `replace` meets them.
pub fn subqueries(stmt: &NodeEnum, catalog: &Catalog) -> Vec<protobuf::SelectStmt> {
    let mut found = Vec::new();
    replace(&mut stmt.clone(), catalog, |select| {
        found.push(select.clone());
        None
    });
    found
}

/// Replaces each uncorrelated scalar subquery over distributed tables of
/// `stmt` for which `value` (called with each, in the order of the walk,
/// outer ones first) gives an expression with that expression.
/// Output columns holding such a subquery keep the name PostgreSQL gives
/// them (the subquery's own column's, not the constant's type).
pub fn replace(stmt: &mut NodeEnum, catalog: &Catalog, mut value: impl FnMut(&protobuf::SelectStmt) -> Option<NodeEnum>) {
    visit_mut(stmt, &mut |n| {
        if let NodeEnum::ResTarget(target) = n {
            let val = target.val.as_deref().and_then(|v| v.node.as_ref());
            if let (true, Some(val)) = (target.name.is_empty(), val) {
                if holds_candidate(val, catalog) {
                    target.name = name_strength(val).0.unwrap_or_else(|| "?column?".to_string());
                }
            }
            return;
        }
        let Some(select) = candidate(n, catalog) else { return };
        if let Some(expr) = value(select) {
            *n = expr;
        }
    });
}

/// The query of an uncorrelated scalar subquery over distributed tables.
fn candidate<'n>(n: &'n NodeEnum, catalog: &Catalog) -> Option<&'n protobuf::SelectStmt> {
    let NodeEnum::SubLink(link) = n else { return None };
    if link.sub_link_type != SubLinkType::ExprSublink as i32 {
        return None;
    }
    match link.subselect.as_deref().and_then(|s| s.node.as_ref()) {
        Some(NodeEnum::SelectStmt(select)) if self_contained(select, catalog) => Some(select),
        _ => None,
    }
}

/// Whether an expression holds such a subquery.
fn holds_candidate(expr: &NodeEnum, catalog: &Catalog) -> bool {
    let mut found = false;
    visit_mut(&mut expr.clone(), &mut |n| found |= candidate(n, catalog).is_some());
    found
}

/// `'value'::type` (NULL for None), as an expression node.
pub fn typed_constant(value: Option<&str>, type_name: &str) -> PgResult<NodeEnum> {
    let literal = value.map_or_else(|| "NULL".to_string(), crate::connection::quote_literal);
    let sql = format!("SELECT {literal}::{type_name}");
    let parsed = pg_query::parse(&sql).map_err(|e| PgError::internal(format!("could not parse a subquery's value: {e}")))?;
    let select = parsed.protobuf.stmts.into_iter().next().and_then(|s| s.stmt).and_then(|s| s.node);
    let Some(NodeEnum::SelectStmt(select)) = select else { return Err(PgError::internal("a subquery's value did not parse as a SELECT")) };
    match select.target_list.into_iter().next().and_then(|t| t.node) {
        Some(NodeEnum::ResTarget(target)) => {
            target.val.and_then(|v| v.node).ok_or_else(|| PgError::internal("a subquery's value without an expression"))
        }
        _ => Err(PgError::internal("a subquery's value without a target")),
    }
}

/// Whether a scalar subquery names nothing outside itself (see the module
/// comment), and reads at least one distributed table.
fn self_contained(select: &protobuf::SelectStmt, catalog: &Catalog) -> bool {
    let plain = select.op == protobuf::SetOperation::SetopNone as i32
        && select.with_clause.is_none()
        && select.into_clause.is_none()
        && select.values_lists.is_empty()
        && select.locking_clause.is_empty()
        && select.target_list.len() == 1;
    let mut scope = Vec::new();
    if !plain || !select.from_clause.iter().all(|item| collect_scope(item, catalog, &mut scope)) || scope.is_empty() {
        return false;
    }
    let mut contained = true;
    visit_mut(&mut NodeEnum::SelectStmt(Box::new(select.clone())), &mut |n| {
        contained &= match n {
            NodeEnum::SubLink(_) | NodeEnum::ParamRef(_) | NodeEnum::RangeSubselect(_) | NodeEnum::RangeFunction(_) => false,
            NodeEnum::ColumnRef(c) => names_own_column(c, &scope),
            _ => true,
        }
    });
    contained
}

/// Adds the tables of a FROM item to `scope` (the name the query knows each
/// by); false for an item other than distributed tables and their joins.
fn collect_scope<'c>(item: &protobuf::Node, catalog: &'c Catalog, scope: &mut Vec<(String, &'c DistributedTable)>) -> bool {
    match item.node.as_ref() {
        Some(NodeEnum::RangeVar(rv)) => match resolve_range_var(rv, catalog) {
            Some(table) if rv.alias.as_ref().is_none_or(|a| a.colnames.is_empty()) => {
                scope.push((rv.alias.as_ref().map_or_else(|| rv.relname.clone(), |a| a.aliasname.clone()), table));
                true
            }
            _ => false,
        },
        Some(NodeEnum::JoinExpr(join)) if join.alias.is_none() => {
            [&join.larg, &join.rarg].iter().all(|side| side.as_deref().is_some_and(|side| collect_scope(side, catalog, scope)))
        }
        _ => false,
    }
}

/// Whether a column reference surely names a column (or a whole row) of
/// one of the subquery's own tables.
fn names_own_column(c: &protobuf::ColumnRef, scope: &[(String, &DistributedTable)]) -> bool {
    let has_column = |table: &DistributedTable, column: &str| table.columns.iter().any(|c| c == column);
    match column_ref_names(c).as_deref() {
        Some([column]) => scope.iter().any(|(name, table)| name == column || has_column(table, column)),
        Some([qualifier, column]) => scope.iter().any(|(name, table)| name == qualifier && has_column(table, column)),
        // `t.*`
        None => match c.fields.first().and_then(|f| f.node.as_ref()) {
            Some(NodeEnum::String(qualifier)) if c.fields.len() == 2 => scope.iter().any(|(name, _)| *name == qualifier.sval),
            _ => c.fields.len() == 1,
        },
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn catalog() -> Catalog {
        crate::planner::tests::CatalogBuilder::new().reference("a", &["id", "two"]).reference("b", &["id", "two", "v"]).build()
    }

    fn statement(sql: &str) -> NodeEnum {
        pg_query::parse(sql).unwrap().protobuf.stmts.remove(0).stmt.unwrap().node.unwrap()
    }

    #[test]
    fn only_subqueries_over_their_own_distributed_tables_count() {
        let catalog = catalog();
        let found = |sql: &str| subqueries(&statement(sql), &catalog).len();
        assert_eq!(found("SELECT count(*) FROM a WHERE a.id = (SELECT max(b.id) FROM b)"), 1);
        assert_eq!(found("SELECT (SELECT max(id) FROM b), (SELECT count(*) FROM b x JOIN a y ON x.two = y.two) FROM a"), 2);
        // Correlated: it names the outer query's table or a column b does not have.
        assert_eq!(found("SELECT * FROM a WHERE a.id = (SELECT max(b.id) FROM b WHERE b.two = a.two)"), 0);
        assert_eq!(found("SELECT * FROM a WHERE a.id = (SELECT max(id) FROM b WHERE v = nope)"), 0);
        // Not scalar, not over distributed tables, or with a subquery or parameter of its own.
        assert_eq!(found("SELECT * FROM a WHERE a.id IN (SELECT id FROM b)"), 0);
        assert_eq!(found("SELECT * FROM a WHERE a.id = (SELECT max(x) FROM generate_series(1, 3) x)"), 0);
        assert_eq!(found("SELECT * FROM a WHERE a.id = (SELECT max(id) FROM b WHERE two IN (SELECT two FROM a))"), 0);
        assert_eq!(found("SELECT * FROM a WHERE a.id = (SELECT max(id) FROM b WHERE two = $1)"), 0);
    }

    #[test]
    fn values_replace_their_subqueries() {
        let mut stmt = statement("SELECT count(*) FROM a WHERE a.id = (SELECT max(b.id) FROM b)");
        replace(&mut stmt, &catalog(), |_| typed_constant(Some("10000"), "int4").ok());
        let version = pg_query::parse("SELECT 1").unwrap().protobuf.version;
        let sql = crate::planner::deparse::deparse_statement(version, stmt).unwrap();
        assert_eq!(sql, "SELECT count(*) FROM a WHERE a.id = '10000'::int4");
        // An output column keeps the subquery's name.
        let mut stmt =
            statement("SELECT (SELECT min(v) FROM b), (SELECT max(id) AS top FROM b)::int8 + 1, (SELECT max(id) FROM b)::text AS named FROM a");
        replace(&mut stmt, &catalog(), |_| typed_constant(Some("x"), "text").ok());
        let sql = crate::planner::deparse::deparse_statement(version, stmt).unwrap();
        assert_eq!(sql, "SELECT 'x'::text AS min, 'x'::text::int8 + 1 AS \"?column?\", 'x'::text::text AS named FROM a");
    }
}
