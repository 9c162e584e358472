//! Uncorrelated subqueries over distributed tables, such as the ones in
//! `SELECT count(*) FROM a WHERE a.id = (SELECT max(b.id) FROM b)` and
//! `SELECT count(*) FROM a WHERE a.two IN (SELECT b.v FROM b WHERE …)`.
//! PostgreSQL computes such a subquery once per statement (an InitPlan, or
//! a hashed SubPlan). The coordinator does the same, as a distributed
//! statement of its own, and writes its result into the statement as a
//! typed constant: a scalar subquery becomes its value, `x IN (…)` (any
//! `x op ANY/ALL (…)`) becomes `x op ANY/ALL ('{…}'::type[])`, which
//! PostgreSQL evaluates with the same three-valued logic, and `EXISTS (…)`
//! becomes true or false. A WITH query becomes its rows (`next_with_query`,
//! `inline_with_query`), and so does a subquery in FROM. The statement can then route to one shard group,
//! or run on the shards, where it would otherwise move whole tables (see
//! executor/fallback.rs).
//!
//! Only subqueries that provably name nothing of the query around them
//! count: their FROM clause holds distributed or reference tables alone
//! (joined or not), and every column they name belongs to one of those
//! tables; no subquery of their own, no parameter.

use super::ddl_plan::names_of;
use super::multi_shard::name_strength;
use super::walk::visit_mut;
use super::{column_ref_names, resolve_range_var, string_node};
use crate::error::{PgError, PgResult};
use crate::metadata::{Catalog, DistributedTable};
use pg_query::protobuf::{self, SubLinkType};
use pg_query::NodeEnum;

/// What the statement uses of a subquery, which says what its result
/// becomes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SubqueryUse {
    /// `(SELECT …)`: its one value.
    Scalar,
    /// `x op ANY (SELECT …)`, `x IN (SELECT …)`: the array of its values.
    Any,
    /// `x op ALL (SELECT …)`, `x NOT IN`'s counterpart: the same array.
    All,
    /// `EXISTS (SELECT …)`: whether it gives a row.
    Exists,
    /// `FROM (SELECT …) AS alias`: its rows, as a FROM item.
    Rows,
}

/// An uncorrelated subquery over distributed tables, as `subqueries` finds it.
pub struct Subquery {
    pub used_as: SubqueryUse,
    pub select: protobuf::SelectStmt,
}

/// The uncorrelated subqueries over distributed tables of `stmt`, in the
/// order `replace` meets them.
pub fn subqueries(stmt: &NodeEnum, catalog: &Catalog) -> Vec<Subquery> {
    let mut found = Vec::new();
    replace(&mut stmt.clone(), catalog, |used_as, select| {
        found.push(Subquery { used_as, select: select.clone() });
        None
    });
    found
}

/// Replaces each uncorrelated subquery over distributed tables of `stmt`
/// for which `value` (called with each, in the order of the walk, outer
/// ones first) gives its result as a constant (`typed_constant`; an array
/// for `Any` and `All`, a boolean for `Exists`). Output columns holding
/// such a subquery keep the name PostgreSQL gives them (the subquery's own
/// column's, not the constant's type).
pub fn replace(stmt: &mut NodeEnum, catalog: &Catalog, mut value: impl FnMut(SubqueryUse, &protobuf::SelectStmt) -> Option<NodeEnum>) {
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
        let Some((used_as, select)) = candidate(n, catalog) else { return };
        let Some(constant) = value(used_as, select) else { return };
        if let (NodeEnum::RangeSubselect(original), NodeEnum::RangeSubselect(mut rows)) = (&*n, constant.clone()) {
            // The rows go by the subquery's alias, with the column names it gives.
            if let (Some(alias), Some(own)) = (original.alias.as_ref(), rows.alias.as_mut()) {
                own.aliasname = alias.aliasname.clone();
                for (i, name) in alias.colnames.iter().enumerate() {
                    if let Some(slot) = own.colnames.get_mut(i) {
                        *slot = name.clone();
                    }
                }
            }
            *n = NodeEnum::RangeSubselect(rows);
            return;
        }
        let NodeEnum::SubLink(link) = n else { return };
        *n = match used_as {
            SubqueryUse::Scalar | SubqueryUse::Exists | SubqueryUse::Rows => constant,
            SubqueryUse::Any | SubqueryUse::All => {
                let kind = if used_as == SubqueryUse::Any { protobuf::AExprKind::AexprOpAny } else { protobuf::AExprKind::AexprOpAll };
                // `IN` carries no operator name: it is `= ANY`.
                let name = if link.oper_name.is_empty() { vec![string_node("=")] } else { link.oper_name.clone() };
                NodeEnum::AExpr(Box::new(protobuf::AExpr {
                    kind: kind as i32,
                    name,
                    lexpr: link.testexpr.clone(),
                    rexpr: Some(Box::new(protobuf::Node { node: Some(constant) })),
                    location: link.location,
                }))
            }
        };
    });
}

/// How an uncorrelated subquery over distributed tables is used, and its query.
fn candidate<'n>(n: &'n NodeEnum, catalog: &Catalog) -> Option<(SubqueryUse, &'n protobuf::SelectStmt)> {
    if let NodeEnum::RangeSubselect(from) = n {
        return match from.subquery.as_deref().and_then(|s| s.node.as_ref()) {
            Some(NodeEnum::SelectStmt(select)) if !from.lateral && contained_query(select, false, catalog) => Some((SubqueryUse::Rows, select)),
            _ => None,
        };
    }
    let NodeEnum::SubLink(link) = n else { return None };
    let used_as = match SubLinkType::from_i32(link.sub_link_type)? {
        SubLinkType::ExprSublink => SubqueryUse::Scalar,
        SubLinkType::ExistsSublink => SubqueryUse::Exists,
        // A row on the left (`(a, b) IN (SELECT …)`) compares column by column.
        SubLinkType::AnySublink | SubLinkType::AllSublink
            if matches!(link.testexpr.as_deref().and_then(|t| t.node.as_ref()), Some(NodeEnum::RowExpr(_))) =>
        {
            return None
        }
        SubLinkType::AnySublink => SubqueryUse::Any,
        SubLinkType::AllSublink => SubqueryUse::All,
        _ => return None,
    };
    match link.subselect.as_deref().and_then(|s| s.node.as_ref()) {
        Some(NodeEnum::SelectStmt(select)) if self_contained(select, used_as, catalog) => Some((used_as, select)),
        _ => None,
    }
}

/// Whether an expression holds such a subquery.
fn holds_candidate(expr: &NodeEnum, catalog: &Catalog) -> bool {
    let mut found = false;
    visit_mut(&mut expr.clone(), &mut |n| found |= candidate(n, catalog).is_some());
    found
}

/// Makes `select` give at most `most + 1` rows, so that computing it tells
/// whether it gives more than `most` without reading them all (a subquery
/// over a large table stays in place, and PostgreSQL reads it as it would).
/// False when it already has a LIMIT other than a constant that small, or
/// an OFFSET without one: it is not computed then.
pub fn cap_rows(select: &mut protobuf::SelectStmt, most: usize) -> bool {
    let cap = i32::try_from(most + 1).unwrap_or(i32::MAX);
    match select.limit_count.as_deref().and_then(|l| l.node.as_ref()) {
        None if select.limit_offset.is_none() => {
            let limit = protobuf::AConst { val: Some(protobuf::a_const::Val::Ival(protobuf::Integer { ival: cap })), ..Default::default() };
            select.limit_count = Some(Box::new(protobuf::Node { node: Some(NodeEnum::AConst(limit)) }));
            select.limit_option = protobuf::LimitOption::Count as i32;
            true
        }
        Some(NodeEnum::AConst(c)) => matches!(&c.val, Some(protobuf::a_const::Val::Ival(i)) if i.ival <= cap),
        _ => false,
    }
}

/// The text of an array of `values`, as `array_in` reads it.
pub fn array_text(values: &[Option<String>]) -> String {
    let mut out = String::from("{");
    for (i, v) in values.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        match v {
            None => out.push_str("NULL"),
            Some(v) => {
                out.push('"');
                for c in v.chars() {
                    if c == '"' || c == '\\' {
                        out.push('\\');
                    }
                    out.push(c);
                }
                out.push('"');
            }
        }
    }
    out.push('}');
    out
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

/// Whether a subquery names nothing outside itself (see the module
/// comment), gives one column (but for EXISTS), and reads at least one
/// distributed table.
fn self_contained(select: &protobuf::SelectStmt, used_as: SubqueryUse, catalog: &Catalog) -> bool {
    contained_query(select, used_as == SubqueryUse::Exists, catalog) && (select.target_list.len() == 1 || used_as == SubqueryUse::Exists)
}

/// Whether a subquery names nothing outside itself (see the module
/// comment), whatever it gives.
pub fn is_uncorrelated(select: &protobuf::SelectStmt, catalog: &Catalog) -> bool {
    contained_query(select, true, catalog)
}

/// Whether a query names nothing outside itself: its FROM clause holds
/// distributed or reference tables alone, every column it names is theirs,
/// no subquery, function in FROM or parameter; without `any_columns`, it
/// gives a column or more.
fn contained_query(select: &protobuf::SelectStmt, any_columns: bool, catalog: &Catalog) -> bool {
    let plain = select.op == protobuf::SetOperation::SetopNone as i32
        && select.with_clause.is_none()
        && select.into_clause.is_none()
        && select.values_lists.is_empty()
        && select.locking_clause.is_empty()
        && (any_columns || !select.target_list.is_empty());
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

/// A WITH query of the statement, computed first: its name, its query and
/// the names it gives its columns (none: its query's own).
pub struct WithQuery {
    pub name: String,
    pub select: protobuf::SelectStmt,
    pub columns: Vec<String>,
}

/// The first WITH query of `stmt`'s own WITH clause (not a recursive one),
/// when every one of them is a SELECT naming only its own distributed or
/// reference tables, whose name no inner WITH clause hides: computed and
/// inlined one by one (`inline_with_query`), they leave no WITH query, and
/// the statement can be pushed down. One of another kind (reading another
/// WITH query, say) would keep the statement in the fallback: none is
/// computed then.
pub fn next_with_query(stmt: &NodeEnum, catalog: &Catalog) -> Option<WithQuery> {
    let NodeEnum::SelectStmt(select) = stmt else { return None };
    let with = select.with_clause.as_ref().filter(|w| !w.recursive)?;
    let mut inner_names = Vec::new();
    let mut body = select.clone();
    body.with_clause = None;
    let mut nodes: Vec<NodeEnum> = vec![NodeEnum::SelectStmt(body)];
    nodes.extend(with.ctes.iter().filter_map(|c| match c.node.as_ref() {
        Some(NodeEnum::CommonTableExpr(cte)) => cte.ctequery.as_deref().and_then(|q| q.node.clone()),
        _ => None,
    }));
    for node in &mut nodes {
        visit_mut(node, &mut |n| {
            if let NodeEnum::CommonTableExpr(inner) = n {
                inner_names.push(inner.ctename.clone());
            }
        });
    }
    let mut computable = with.ctes.iter().map(|c| {
        let Some(NodeEnum::CommonTableExpr(cte)) = c.node.as_ref() else { return None };
        let Some(NodeEnum::SelectStmt(query)) = cte.ctequery.as_deref().and_then(|q| q.node.as_ref()) else { return None };
        if inner_names.contains(&cte.ctename) || !contained_query(query, false, catalog) {
            return None;
        }
        Some(WithQuery { name: cte.ctename.clone(), select: query.as_ref().clone(), columns: names_of(&cte.aliascolnames) })
    });
    let first = computable.next()??;
    computable.all(|c| c.is_some()).then_some(first)
}

/// Takes WITH query `name` out of `stmt`'s WITH clause and puts the FROM
/// item `item(alias, columns)` gives in place of every reference to it
/// (`alias`: the name the reference goes by; `columns`: the names it gives
/// the columns, if any).
pub fn inline_with_query(stmt: &mut NodeEnum, name: &str, mut item: impl FnMut(&str, &[String]) -> Option<NodeEnum>) {
    let NodeEnum::SelectStmt(select) = stmt else { return };
    if let Some(with) = select.with_clause.as_mut() {
        with.ctes.retain(|c| !matches!(c.node.as_ref(), Some(NodeEnum::CommonTableExpr(cte)) if cte.ctename == name));
        if with.ctes.is_empty() {
            select.with_clause = None;
        }
    }
    visit_mut(stmt, &mut |n| {
        let NodeEnum::RangeVar(rv) = n else { return };
        if !rv.schemaname.is_empty() || rv.relname != name {
            return;
        }
        let alias = rv.alias.as_ref().map_or_else(|| rv.relname.clone(), |a| a.aliasname.clone());
        let columns = rv.alias.as_ref().map(|a| names_of(&a.colnames)).unwrap_or_default();
        if let Some(replacement) = item(&alias, &columns) {
            *n = replacement;
        }
    });
}

/// Whether `stmt` still reads a distributed table of its own once its WITH
/// queries (`next_with_query`) and subqueries in FROM are rows, and its
/// other uncorrelated subqueries constants: only then
/// can it be pushed down after they are computed (otherwise it would fall
/// back all the same, and computing them first would be work thrown away).
pub fn reads_tables_beyond_its_rows(stmt: &NodeEnum, catalog: &Catalog) -> bool {
    let mut rest = stmt.clone();
    let rows = || super::subselect_node("(VALUES (NULL)) AS tessera_rows").ok();
    while let Some(with_query) = next_with_query(&rest, catalog) {
        inline_with_query(&mut rest, &with_query.name, |_, _| rows());
    }
    replace(&mut rest, catalog, |used_as, _| if used_as == SubqueryUse::Rows { rows() } else { typed_constant(None, "int4").ok() });
    let mut reads = false;
    visit_mut(&mut rest, &mut |n| {
        if let NodeEnum::RangeVar(rv) = n {
            reads |= resolve_range_var(rv, catalog).is_some();
        }
    });
    reads
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
        // IN, ANY, ALL and EXISTS count too; a row compared with IN does not.
        assert_eq!(found("SELECT * FROM a WHERE a.id IN (SELECT id FROM b) AND a.two <> ALL (SELECT v FROM b)"), 2);
        assert_eq!(found("SELECT * FROM a WHERE EXISTS (SELECT * FROM b WHERE v > 3)"), 1);
        assert_eq!(found("SELECT * FROM a WHERE (a.id, a.two) IN (SELECT id, two FROM b)"), 0);
        assert_eq!(found("SELECT * FROM a WHERE a.id IN (SELECT id, two FROM b)"), 0);
        // Not over distributed tables, or with a subquery or parameter of its own.
        assert_eq!(found("SELECT * FROM a WHERE a.id = (SELECT max(x) FROM generate_series(1, 3) x)"), 0);
        // Only the inner one of nested subqueries, at first: computed, it
        // makes the outer one self-contained.
        assert_eq!(found("SELECT * FROM a WHERE a.id = (SELECT max(id) FROM b WHERE two IN (SELECT two FROM a))"), 1);
        assert_eq!(found("SELECT * FROM a WHERE a.id = (SELECT max(id) FROM b WHERE two = $1)"), 0);
    }

    #[test]
    fn values_replace_their_subqueries() {
        let mut stmt = statement("SELECT count(*) FROM a WHERE a.id = (SELECT max(b.id) FROM b)");
        replace(&mut stmt, &catalog(), |_, _| typed_constant(Some("10000"), "int4").ok());
        let version = pg_query::parse("SELECT 1").unwrap().protobuf.version;
        let sql = crate::planner::deparse::deparse_statement(version, stmt).unwrap();
        assert_eq!(sql, "SELECT count(*) FROM a WHERE a.id = '10000'::int4");
        // An output column keeps the subquery's name.
        let mut stmt =
            statement("SELECT (SELECT min(v) FROM b), (SELECT max(id) AS top FROM b)::int8 + 1, (SELECT max(id) FROM b)::text AS named FROM a");
        replace(&mut stmt, &catalog(), |_, _| typed_constant(Some("x"), "text").ok());
        let sql = crate::planner::deparse::deparse_statement(version, stmt).unwrap();
        assert_eq!(sql, "SELECT 'x'::text AS min, 'x'::text::int8 + 1 AS \"?column?\", 'x'::text::text AS named FROM a");
    }

    #[test]
    fn arrays_replace_in_any_and_all_subqueries() {
        let version = pg_query::parse("SELECT 1").unwrap().protobuf.version;
        let mut stmt = statement("SELECT a.id IN (SELECT id FROM b), EXISTS (SELECT FROM b) FROM a WHERE a.two < ALL (SELECT v FROM b) AND NOT a.id IN (SELECT two FROM b)");
        let values = [Some("1"), None, Some("3"), Some("a\"b\\c")];
        let array = array_text(&values.iter().map(|v| v.map(str::to_string)).collect::<Vec<_>>());
        assert_eq!(array, r#"{"1",NULL,"3","a\"b\\c"}"#);
        replace(&mut stmt, &catalog(), |used_as, _| match used_as {
            SubqueryUse::Exists => typed_constant(Some("true"), "bool").ok(),
            _ => typed_constant(Some("{1,2}"), "int4[]").ok(),
        });
        let sql = crate::planner::deparse::deparse_statement(version, stmt).unwrap();
        assert_eq!(
            sql,
            "SELECT a.id = ANY('{1,2}'::int4[]) AS \"?column?\", 'true'::bool AS \"exists\" FROM a WHERE a.two < ALL('{1,2}'::int4[]) AND NOT a.id = ANY('{1,2}'::int4[])"
        );
    }

    #[test]
    fn with_queries_over_their_own_tables_are_inlined_one_by_one() {
        let version = pg_query::parse("SELECT 1").unwrap().protobuf.version;
        // One reading another is not computable: none is computed.
        let chained = "WITH top AS (SELECT id FROM b), near AS (SELECT id FROM top) SELECT * FROM a JOIN near USING (id)";
        assert!(next_with_query(&statement(chained), &catalog()).is_none());
        let mut stmt = statement(
            "WITH top(k) AS (SELECT id FROM b ORDER BY v LIMIT 3), near AS (SELECT two FROM a) SELECT * FROM a JOIN top t ON a.id = t.k WHERE a.two IN (SELECT k FROM top x(kk))",
        );
        let first = next_with_query(&stmt, &catalog()).unwrap();
        assert_eq!((first.name.as_str(), first.columns.clone()), ("top", vec!["k".to_string()]));
        inline_with_query(&mut stmt, "top", |alias, columns| {
            let names = if columns.is_empty() { "k".to_string() } else { columns.join(", ") };
            crate::planner::subselect_node(&format!("(VALUES (1)) AS {alias}({names})")).ok()
        });
        let sql = crate::planner::deparse::deparse_statement(version, stmt.clone()).unwrap();
        assert_eq!(
            sql,
            "WITH near AS (SELECT two FROM a) SELECT * FROM a JOIN (VALUES (1)) t(k) ON a.id = t.k WHERE a.two IN (SELECT k FROM (VALUES (1)) x(kk))"
        );
        assert_eq!(next_with_query(&stmt, &catalog()).map(|w| w.name), Some("near".to_string()));
        // Recursive WITH clauses, and names an inner WITH clause hides, stay.
        assert!(next_with_query(&statement("WITH RECURSIVE top AS (SELECT id FROM b) SELECT * FROM top"), &catalog()).is_none());
        assert!(next_with_query(&statement("WITH top AS (SELECT id FROM b) SELECT * FROM (WITH top AS (SELECT 1) SELECT * FROM top) s"), &catalog())
            .is_none());
    }

    #[test]
    fn computed_subqueries_read_one_row_past_their_limit() {
        let version = pg_query::parse("SELECT 1").unwrap().protobuf.version;
        let capped = |sql: &str, most: usize| {
            let NodeEnum::SelectStmt(mut select) = statement(sql) else { panic!("{sql}") };
            let kept = cap_rows(&mut select, most);
            (kept, crate::planner::deparse::deparse_statement(version, NodeEnum::SelectStmt(select)).unwrap())
        };
        assert_eq!(capped("SELECT id FROM b ORDER BY v", 10), (true, "SELECT id FROM b ORDER BY v LIMIT 11".to_string()));
        assert_eq!(capped("SELECT id FROM b LIMIT 5", 10), (true, "SELECT id FROM b LIMIT 5".to_string()));
        assert!(!capped("SELECT id FROM b LIMIT 50", 10).0);
        assert!(!capped("SELECT id FROM b OFFSET 5", 10).0);
        assert!(!capped("SELECT id FROM b LIMIT ALL", 10).0);
    }

    #[test]
    fn subqueries_in_from_become_rows_under_their_alias() {
        let version = pg_query::parse("SELECT 1").unwrap().protobuf.version;
        let sql =
            "SELECT * FROM a JOIN (SELECT id, two FROM b LIMIT 3) AS s(x) ON a.id = s.x CROSS JOIN LATERAL (SELECT v FROM b WHERE b.id = a.id) l";
        let found = subqueries(&statement(sql), &catalog());
        assert_eq!(found.iter().map(|s| s.used_as).collect::<Vec<_>>(), vec![SubqueryUse::Rows], "LATERAL ones read the query around them");
        let mut stmt = statement(sql);
        replace(&mut stmt, &catalog(), |_, _| crate::planner::subselect_node("(VALUES (1, 2)) AS tessera_rows(id, two)").ok());
        assert_eq!(
            crate::planner::deparse::deparse_statement(version, stmt).unwrap(),
            "SELECT * FROM a JOIN (VALUES (1, 2)) s(x, two) ON a.id = s.x CROSS JOIN LATERAL (SELECT v FROM b WHERE b.id = a.id) l"
        );
    }

    #[test]
    fn rows_are_computed_only_for_statements_that_keep_a_table() {
        let keeps = |sql: &str| reads_tables_beyond_its_rows(&statement(sql), &catalog());
        assert!(keeps("SELECT * FROM a JOIN (SELECT id FROM b LIMIT 3) s ON a.id = s.id"));
        assert!(keeps("WITH top AS (SELECT id FROM b LIMIT 3) SELECT * FROM a JOIN top USING (id)"));
        assert!(!keeps("SELECT * FROM (SELECT two, count(*) FROM a GROUP BY two) per_two"));
        assert!(!keeps("WITH top AS (SELECT id FROM b LIMIT 3) SELECT * FROM top x CROSS JOIN top y"));
        assert!(!keeps("SELECT * FROM (SELECT id FROM a) s WHERE s.id IN (SELECT id FROM b)"));
    }
}
