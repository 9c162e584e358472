//! The one way the coordinator turns a parse tree back into SQL.
//!
//! libpg_query's deparser leaves out parentheses that PostgreSQL's grammar
//! needs in a few places, so its text either fails to parse on the worker or
//! parses into a different tree. Before deparsing, `restore_parentheses`
//! reshapes exactly those spots so that the text comes out right; `round_trip`
//! checks the result against the parser, and the corpus tests hold every
//! statement we can find to it.

use super::walk::visit_mut;
use super::{function_names, plain_select, res_target};
use crate::error::{PgError, PgResult};
use pg_query::protobuf::{self, Node};
use pg_query::NodeEnum;

/// The parse-result version stamped on trees the coordinator builds itself
/// (PostgreSQL 15's grammar, as in pg_query's own results).
pub const BUILT_TREE_VERSION: i32 = 150001;

/// SQL text for a whole parse result.
pub fn deparse_tree(tree: &protobuf::ParseResult) -> PgResult<String> {
    let mut tree = tree.clone();
    for raw in &mut tree.stmts {
        if let Some(stmt) = raw.stmt.as_deref_mut().and_then(|n| n.node.as_mut()) {
            leave_out_defaults(stmt);
            reshape_for_deparser(stmt)?;
        }
    }
    pg_query::deparse(&tree).map_err(|e| PgError::internal(format!("could not deparse the statement for a shard: {e}")))
}

/// SQL text for one statement; `version` is that of the parse result it came from.
pub fn deparse_statement(version: i32, stmt: NodeEnum) -> PgResult<String> {
    let raw = protobuf::RawStmt { stmt: Some(Box::new(Node { node: Some(stmt) })), stmt_location: 0, stmt_len: 0 };
    deparse_tree(&protobuf::ParseResult { version, stmts: vec![raw] })
}

/// An expression's own text (as in `SELECT <expression>`).
pub fn deparse_expression(expr: &NodeEnum) -> PgResult<String> {
    let select = protobuf::SelectStmt { target_list: vec![res_target("", Node { node: Some(expr.clone()) })], ..plain_select() };
    let sql = deparse_statement(BUILT_TREE_VERSION, NodeEnum::SelectStmt(Box::new(select)))?;
    Ok(sql.strip_prefix("SELECT ").unwrap_or(&sql).to_string())
}

/// `deparse_tree`, for DDL: the text is parsed again and must give the same
/// tree. A few clauses (a column's COMPRESSION, UNIQUE NULLS NOT DISTINCT)
/// are dropped by the deparser without a word, and shards built from such
/// text would quietly differ from the shell table; DDL is rare enough that
/// the second parse costs nothing that matters.
pub fn deparse_faithfully(tree: &protobuf::ParseResult) -> PgResult<String> {
    let text = deparse_tree(tree)?;
    match pg_query::parse(&text) {
        Ok(again) if tree_shape(&again.protobuf) == tree_shape(tree) => Ok(text),
        _ => Err(PgError::not_supported("this statement uses a clause Tessera cannot pass on to the shards intact (for example a column's COMPRESSION or UNIQUE NULLS NOT DISTINCT)")
            .with_hint("Leave the clause out, or run the statement before distributing the table.")),
    }
}

/// How one statement fared when parsed, deparsed and parsed again.
#[derive(Debug, PartialEq, Eq)]
pub enum RoundTrip {
    /// The parser refuses the statement: not part of the corpus.
    NotParsed,
    /// The deparsed text parses into the same tree (positions aside).
    Equal,
    /// The deparser failed.
    DeparseFailed(String),
    /// The deparsed text does not parse.
    Unparsable { deparsed: String, error: String },
    /// The deparsed text parses into a different tree; `at` shows where the
    /// two trees part (the original's, then the reparsed one's).
    Different { deparsed: String, at: (String, String) },
}

/// Parses `sql`, deparses it the way statements for the workers are
/// deparsed, and compares the tree of the result with the original.
pub fn round_trip(sql: &str) -> RoundTrip {
    let Ok(mut original) = pg_query::parse(sql) else { return RoundTrip::NotParsed };
    let deparsed = match deparse_tree(&original.protobuf) {
        Ok(text) => text,
        Err(e) => return RoundTrip::DeparseFailed(e.message().to_string()),
    };
    match pg_query::parse(&deparsed) {
        Err(e) => RoundTrip::Unparsable { deparsed, error: e.to_string() },
        Ok(again) => {
            // What deparse_tree leaves out because it is the default is left
            // out of the original too.
            for raw in &mut original.protobuf.stmts {
                if let Some(stmt) = raw.stmt.as_deref_mut().and_then(|n| n.node.as_mut()) {
                    leave_out_defaults(stmt);
                }
            }
            let (before, after) = (tree_shape(&original.protobuf), tree_shape(&again.protobuf));
            if before == after {
                return RoundTrip::Equal;
            }
            let common = before.bytes().zip(after.bytes()).take_while(|(a, b)| a == b).count();
            let around = |shape: &str| shape.get(common.saturating_sub(120)..).unwrap_or("").chars().take(240).collect();
            RoundTrip::Different { deparsed, at: (around(&before), around(&after)) }
        }
    }
}

/// A tree's printed form without what does not change the statement: source
/// positions, and whether a function call was written as a call or in the
/// SQL-standard syntax (`pg_catalog.overlay(a, b, c, d)` and `OVERLAY(a
/// PLACING b FROM c FOR d)` call the same function; PostgreSQL keeps the form
/// only to display the statement back).
fn tree_shape(tree: &protobuf::ParseResult) -> String {
    let mut shape = format!("{:?}", tree.stmts.iter().map(|s| &s.stmt).collect::<Vec<_>>());
    for (field, value_chars) in [("location: ", "-0123456789"), ("funcformat: ", "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz")] {
        let mut kept = String::with_capacity(shape.len());
        let mut rest = shape.as_str();
        while let Some(at) = rest.find(field) {
            kept.push_str(&rest[..at]);
            rest = rest[at + field.len()..].trim_start_matches(|c: char| value_chars.contains(c));
        }
        kept.push_str(rest);
        shape = kept;
    }
    shape
}

/// Drops options that only restate a default and that the deparser cannot
/// print: COPY's `FORMAT text` comes out as `FORMAT` with nothing after it
/// (and trips an assertion in a debug build of libpg_query).
fn leave_out_defaults(stmt: &mut NodeEnum) {
    if let NodeEnum::CopyStmt(copy) = stmt {
        copy.options.retain(|o| {
            let Some(NodeEnum::DefElem(option)) = o.node.as_ref() else { return true };
            let value = match option.arg.as_deref().and_then(|a| a.node.as_ref()) {
                Some(NodeEnum::String(v)) => v.sval.as_str(),
                _ => "",
            };
            !(option.defname == "format" && value.eq_ignore_ascii_case("text"))
        });
    }
}

/// Reshapes the spots whose deparsed text would lose parentheses the grammar
/// needs. The deparser parenthesizes the argument of an `A_Indirection` when
/// that argument is itself one; an `A_Indirection` without indirection adds no
/// text of its own and parses back into nothing, so wrapping an expression in
/// one is how a pair of parentheses is asked for without changing the tree the
/// worker parses.
///
/// The deparser is also C code that trusts the tree: a node where the grammar
/// allows only one kind is read as that kind, and anything else crashes the
/// whole process. The same walk refuses the shapes a rewrite could produce.
fn reshape_for_deparser(stmt: &mut NodeEnum) -> PgResult<()> {
    let mut crashing = None;
    visit_mut(stmt, &mut |node| match node {
        NodeEnum::RangeTableSample(sample) if !matches!(sample.relation.as_deref().and_then(|r| r.node.as_ref()), Some(NodeEnum::RangeVar(_))) => {
            crashing = Some("TABLESAMPLE of something other than a table");
        }
        // `(ARRAY[1,2])[1]`, `(CASE … END)[1]`: only column and parameter
        // references and scalar subqueries take a subscript or field directly.
        NodeEnum::AIndirection(e) if !e.indirection.is_empty() => {
            if let Some(arg) = e.arg.as_deref_mut() {
                if !takes_indirection(arg) {
                    wrap(arg);
                }
            }
        }
        // `(a + b) AT TIME ZONE 'UTC'`: AT TIME ZONE binds tighter than the
        // operators, and its deparsed form never parenthesizes its operands.
        NodeEnum::FuncCall(call) if is_at_time_zone(call) => {
            for arg in call.args.iter_mut().filter(|a| !is_primary(a)) {
                wrap(arg);
            }
        }
        // `DEFAULT (1 IN (1, 2))`: a column default is a restricted
        // expression in the grammar and comes out without parentheses.
        NodeEnum::Constraint(c) if c.contype == protobuf::ConstrType::ConstrDefault as i32 => {
            if let Some(expr) = c.raw_expr.as_deref_mut().filter(|e| !is_primary(e)) {
                wrap(expr);
            }
        }
        // `CREATE INDEX … ((row(a, b)::t))`: the deparser treats a cast like
        // a function call, which needs no parentheses of its own; a cast does.
        NodeEnum::IndexElem(ix) => {
            if let Some(expr) = ix.expr.as_deref_mut().filter(|e| matches!(e.node, Some(NodeEnum::TypeCast(_)))) {
                wrap(expr);
            }
        }
        _ => {}
    });
    match crashing {
        Some(what) => Err(PgError::internal(format!("could not deparse the statement for a shard: {what}"))),
        None => Ok(()),
    }
}

/// Replaces `node` with an `A_Indirection` that has no indirection, which the
/// deparser prints in parentheses when `node` is one of the kinds it already
/// parenthesizes there, and otherwise unchanged; a second level makes sure.
fn wrap(node: &mut Node) {
    for _ in 0..2 {
        let inner = std::mem::take(node);
        *node = Node { node: Some(NodeEnum::AIndirection(Box::new(protobuf::AIndirection { arg: Some(Box::new(inner)), indirection: vec![] }))) };
    }
}

fn takes_indirection(node: &Node) -> bool {
    match node.node.as_ref() {
        Some(NodeEnum::ColumnRef(_) | NodeEnum::ParamRef(_) | NodeEnum::AIndirection(_)) => true,
        Some(NodeEnum::SubLink(s)) => s.sub_link_type == protobuf::SubLinkType::ExprSublink as i32,
        _ => false,
    }
}

/// An operand that needs no parentheses next to any operator.
fn is_primary(node: &Node) -> bool {
    matches!(
        node.node.as_ref(),
        Some(
            NodeEnum::ColumnRef(_)
                | NodeEnum::ParamRef(_)
                | NodeEnum::AConst(_)
                | NodeEnum::FuncCall(_)
                | NodeEnum::TypeCast(_)
                | NodeEnum::SubLink(_)
                | NodeEnum::AIndirection(_)
        )
    )
}

fn is_at_time_zone(call: &protobuf::FuncCall) -> bool {
    call.funcformat == protobuf::CoercionForm::CoerceSqlSyntax as i32 && function_names(call) == ["pg_catalog", "timezone"] && call.args.len() == 2
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_and_call_syntax_do_not_count() {
        assert_eq!(round_trip("SELECT   1 +  2 FROM t WHERE a = 1"), RoundTrip::Equal);
        assert_eq!(round_trip("SELECT pg_catalog.overlay(a, b, 1, 2), OVERLAY(a PLACING b FROM 1 FOR 2) FROM t"), RoundTrip::Equal);
        assert_eq!(round_trip("SELEC 1"), RoundTrip::NotParsed);
    }

    #[test]
    fn trees_that_would_crash_the_deparser_are_refused() {
        let mut tree = pg_query::parse("SELECT * FROM t TABLESAMPLE system (10)").unwrap().protobuf;
        let Some(NodeEnum::SelectStmt(select)) = tree.stmts[0].stmt.as_mut().and_then(|n| n.node.as_mut()) else { panic!() };
        let Some(NodeEnum::RangeTableSample(sample)) = select.from_clause[0].node.as_mut() else { panic!() };
        sample.relation = Some(Box::new(Node { node: Some(NodeEnum::AConst(protobuf::AConst { isnull: true, val: None, location: -1 })) }));
        assert_eq!(deparse_tree(&tree).unwrap_err().code(), "XX000");
    }

    #[test]
    fn ddl_that_would_lose_a_clause_is_refused() {
        for sql in ["CREATE TABLE t (a text COMPRESSION pglz)", "ALTER TABLE t ADD CONSTRAINT u UNIQUE NULLS NOT DISTINCT (a)"] {
            let e = deparse_faithfully(&pg_query::parse(sql).unwrap().protobuf).unwrap_err();
            assert_eq!(e.code(), "0A000", "{sql}");
        }
        let tree = pg_query::parse("ALTER TABLE t ADD COLUMN b int DEFAULT (1 IN (1, 2))").unwrap().protobuf;
        assert!(deparse_faithfully(&tree).unwrap().contains("DEFAULT ((1 IN (1, 2)))"));
    }

    #[test]
    fn needed_parentheses_come_back() {
        for sql in [
            "SELECT (ARRAY[1, 2, 3])[2] FROM d WHERE k = 1",
            "SELECT (ARRAY[1, 2, 3])[2:3], (CASE WHEN a THEN b END)[1], (ARRAY(SELECT 1))[1], (COALESCE(a, b))[1]",
            "SELECT (row(1, 2)).f1, (x).a, x[1], $1[2], (SELECT ARRAY[1])[1] FROM t",
            "SELECT ('2022-12-01'::date + '1 day'::interval) AT TIME ZONE 'UTC', ts AT TIME ZONE (z || 'x') FROM t",
            "CREATE TABLE t (b bool DEFAULT (1 IN (1, 2)), n int DEFAULT 1 + 2, m int DEFAULT -1)",
            "CREATE INDEX i ON t ((row(x, y)::t1), (a + b), lower(c))",
            "ALTER TABLE t ADD EXCLUDE USING gist (c1 WITH &&, (c2::circle) WITH &&)",
            "COPY t TO STDOUT (FORMAT text)",
            "COPY t (a, b) FROM STDIN WITH (FORMAT 'text', DELIMITER ',', NULL 'x')",
        ] {
            assert_eq!(round_trip(sql), RoundTrip::Equal, "{sql}");
        }
    }
}
