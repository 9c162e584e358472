//! A walk over every node of a query's parse tree, for the planner and for the
//! catalog's reading of user code. pg_query's own walker skips
//! some expression nodes (IS NULL tests, array subscripts, FILTER clauses,
//! window definitions, TABLESAMPLE, …), and a table reference it misses would
//! be read from the coordinator's empty shell table: silently wrong rows. This
//! walker knows every raw-parse node that can hold an expression or a table in a
//! SELECT, INSERT, UPDATE or DELETE, and descends into all of them.

use pg_query::protobuf::{self, Node};
use pg_query::NodeEnum;

/// Calls `f` on every node under (and including) `node`, parents first.
/// Table references that the tree stores as bare structs (an INSERT's target,
/// SELECT INTO's new table) are visited as `NodeEnum::RangeVar` too.
pub fn visit_mut(node: &mut NodeEnum, f: &mut dyn FnMut(&mut NodeEnum)) {
    f(node);
    let each = |nodes: &mut Vec<Node>, f: &mut dyn FnMut(&mut NodeEnum)| {
        for n in nodes.iter_mut() {
            visit_node(n, f);
        }
    };
    use NodeEnum::*;
    match node {
        SelectStmt(s) => {
            each(&mut s.distinct_clause, f);
            if let Some(into) = s.into_clause.as_deref_mut() {
                visit_range_var(&mut into.rel, f);
            }
            each(&mut s.target_list, f);
            each(&mut s.from_clause, f);
            visit_boxed(&mut s.where_clause, f);
            each(&mut s.group_clause, f);
            visit_boxed(&mut s.having_clause, f);
            each(&mut s.window_clause, f);
            each(&mut s.values_lists, f);
            each(&mut s.sort_clause, f);
            visit_boxed(&mut s.limit_offset, f);
            visit_boxed(&mut s.limit_count, f);
            each(&mut s.locking_clause, f);
            visit_with(&mut s.with_clause, f);
            // Set operations: recurse into both arms in place.
            for arm in [s.larg.as_deref_mut(), s.rarg.as_deref_mut()].into_iter().flatten() {
                let mut wrapped = NodeEnum::SelectStmt(Box::new(std::mem::take(arm)));
                visit_mut(&mut wrapped, f);
                if let NodeEnum::SelectStmt(back) = wrapped {
                    *arm = *back;
                }
            }
        }
        InsertStmt(s) => {
            visit_range_var(&mut s.relation, f);
            each(&mut s.cols, f);
            visit_boxed(&mut s.select_stmt, f);
            if let Some(c) = s.on_conflict_clause.as_deref_mut() {
                if let Some(infer) = c.infer.as_deref_mut() {
                    each(&mut infer.index_elems, f);
                    visit_boxed(&mut infer.where_clause, f);
                }
                each(&mut c.target_list, f);
                visit_boxed(&mut c.where_clause, f);
            }
            each(&mut s.returning_list, f);
            visit_with(&mut s.with_clause, f);
        }
        UpdateStmt(s) => {
            visit_range_var(&mut s.relation, f);
            each(&mut s.target_list, f);
            visit_boxed(&mut s.where_clause, f);
            each(&mut s.from_clause, f);
            each(&mut s.returning_list, f);
            visit_with(&mut s.with_clause, f);
        }
        DeleteStmt(s) => {
            visit_range_var(&mut s.relation, f);
            each(&mut s.using_clause, f);
            visit_boxed(&mut s.where_clause, f);
            each(&mut s.returning_list, f);
            visit_with(&mut s.with_clause, f);
        }
        MergeStmt(s) => {
            visit_range_var(&mut s.relation, f);
            visit_boxed(&mut s.source_relation, f);
            visit_boxed(&mut s.join_condition, f);
            each(&mut s.merge_when_clauses, f);
            visit_with(&mut s.with_clause, f);
        }
        MergeWhenClause(w) => {
            visit_boxed(&mut w.condition, f);
            each(&mut w.target_list, f);
            each(&mut w.values, f);
        }
        DeclareCursorStmt(d) => visit_boxed(&mut d.query, f),
        WithClause(w) => each(&mut w.ctes, f),
        CommonTableExpr(c) => visit_boxed(&mut c.ctequery, f),
        ResTarget(r) => {
            each(&mut r.indirection, f);
            visit_boxed(&mut r.val, f);
        }
        MultiAssignRef(m) => visit_boxed(&mut m.source, f),
        AExpr(e) => {
            visit_boxed(&mut e.lexpr, f);
            visit_boxed(&mut e.rexpr, f);
        }
        BoolExpr(e) => each(&mut e.args, f),
        NullTest(e) => visit_boxed(&mut e.arg, f),
        BooleanTest(e) => visit_boxed(&mut e.arg, f),
        TypeCast(e) => visit_boxed(&mut e.arg, f),
        CollateClause(e) => visit_boxed(&mut e.arg, f),
        NamedArgExpr(e) => visit_boxed(&mut e.arg, f),
        AIndirection(e) => {
            visit_boxed(&mut e.arg, f);
            each(&mut e.indirection, f);
        }
        AIndices(e) => {
            visit_boxed(&mut e.lidx, f);
            visit_boxed(&mut e.uidx, f);
        }
        AArrayExpr(e) => each(&mut e.elements, f),
        RowExpr(e) => each(&mut e.args, f),
        CoalesceExpr(e) => each(&mut e.args, f),
        MinMaxExpr(e) => each(&mut e.args, f),
        CaseExpr(e) => {
            visit_boxed(&mut e.arg, f);
            each(&mut e.args, f);
            visit_boxed(&mut e.defresult, f);
        }
        CaseWhen(e) => {
            visit_boxed(&mut e.expr, f);
            visit_boxed(&mut e.result, f);
        }
        XmlExpr(e) => {
            each(&mut e.named_args, f);
            each(&mut e.args, f);
        }
        XmlSerialize(e) => visit_boxed(&mut e.expr, f),
        GroupingSet(g) => each(&mut g.content, f),
        GroupingFunc(g) => each(&mut g.args, f),
        SubLink(s) => {
            visit_boxed(&mut s.testexpr, f);
            visit_boxed(&mut s.subselect, f);
        }
        FuncCall(c) => {
            each(&mut c.args, f);
            each(&mut c.agg_order, f);
            visit_boxed(&mut c.agg_filter, f);
            if let Some(w) = c.over.as_deref_mut() {
                visit_window(w, f);
            }
        }
        WindowDef(w) => visit_window(w, f),
        SortBy(s) => visit_boxed(&mut s.node, f),
        JoinExpr(j) => {
            visit_boxed(&mut j.larg, f);
            visit_boxed(&mut j.rarg, f);
            visit_boxed(&mut j.quals, f);
        }
        RangeSubselect(r) => visit_boxed(&mut r.subquery, f),
        RangeFunction(r) => each(&mut r.functions, f),
        RangeTableSample(r) => {
            visit_boxed(&mut r.relation, f);
            each(&mut r.args, f);
            visit_boxed(&mut r.repeatable, f);
        }
        RangeTableFunc(r) => {
            visit_boxed(&mut r.docexpr, f);
            visit_boxed(&mut r.rowexpr, f);
            each(&mut r.namespaces, f);
            each(&mut r.columns, f);
        }
        RangeTableFuncCol(c) => {
            visit_boxed(&mut c.colexpr, f);
            visit_boxed(&mut c.coldefexpr, f);
        }
        IndexElem(e) => visit_boxed(&mut e.expr, f),
        // The DDL the coordinator deparses for shards: expressions in column
        // definitions, constraints and indexes.
        CreateStmt(s) => each(&mut s.table_elts, f),
        ColumnDef(c) => {
            visit_boxed(&mut c.raw_default, f);
            each(&mut c.constraints, f);
        }
        Constraint(c) => {
            visit_boxed(&mut c.raw_expr, f);
            each(&mut c.exclusions, f);
            visit_boxed(&mut c.where_clause, f);
        }
        IndexStmt(s) => {
            each(&mut s.index_params, f);
            visit_boxed(&mut s.where_clause, f);
        }
        AlterTableStmt(s) => each(&mut s.cmds, f),
        AlterTableCmd(c) => visit_boxed(&mut c.def, f),
        CopyStmt(s) => {
            visit_boxed(&mut s.query, f);
            visit_boxed(&mut s.where_clause, f);
        }
        ExplainStmt(s) => visit_boxed(&mut s.query, f),
        ViewStmt(s) => visit_boxed(&mut s.query, f),
        CreateTableAsStmt(s) => visit_boxed(&mut s.query, f),
        LockingClause(l) => each(&mut l.locked_rels, f),
        List(l) => each(&mut l.items, f),
        // Leaves (column and parameter references, constants, RangeVar, …) and
        // nodes that cannot appear in a query's raw parse tree.
        _ => {}
    }
}

fn visit_node(node: &mut Node, f: &mut dyn FnMut(&mut NodeEnum)) {
    if let Some(n) = node.node.as_mut() {
        visit_mut(n, f);
    }
}

fn visit_boxed(node: &mut Option<Box<Node>>, f: &mut dyn FnMut(&mut NodeEnum)) {
    if let Some(n) = node.as_deref_mut() {
        visit_node(n, f);
    }
}

fn visit_with(with: &mut Option<protobuf::WithClause>, f: &mut dyn FnMut(&mut NodeEnum)) {
    if let Some(w) = with.as_mut() {
        for cte in w.ctes.iter_mut() {
            visit_node(cte, f);
        }
    }
}

fn visit_window(w: &mut protobuf::WindowDef, f: &mut dyn FnMut(&mut NodeEnum)) {
    for n in w.partition_clause.iter_mut().chain(w.order_clause.iter_mut()) {
        visit_node(n, f);
    }
    visit_boxed(&mut w.start_offset, f);
    visit_boxed(&mut w.end_offset, f);
}

/// Visits a table reference stored as a bare struct, as a node.
fn visit_range_var(rv: &mut Option<protobuf::RangeVar>, f: &mut dyn FnMut(&mut NodeEnum)) {
    if let Some(taken) = rv.take() {
        let mut wrapped = NodeEnum::RangeVar(taken);
        f(&mut wrapped);
        if let NodeEnum::RangeVar(back) = wrapped {
            *rv = Some(back);
        }
    }
}

/// A statement the walk above knows whole: a query, a write, a cursor's.
pub fn is_query(stmt: &NodeEnum) -> bool {
    matches!(
        stmt,
        NodeEnum::SelectStmt(_)
            | NodeEnum::InsertStmt(_)
            | NodeEnum::UpdateStmt(_)
            | NodeEnum::DeleteStmt(_)
            | NodeEnum::MergeStmt(_)
            | NodeEnum::DeclareCursorStmt(_)
    )
}

/// A table or column reference found in a statement.
pub enum Reference<'a> {
    Table(&'a mut protobuf::RangeVar),
    Column(&'a mut protobuf::ColumnRef),
}

/// Calls `f` on every table and column reference of a statement: queries with
/// the complete walk above, utility statements (whose table references sit in
/// fixed places pg_query's walker knows) with pg_query's.
pub fn references_mut(stmt: &mut NodeEnum, mut f: impl FnMut(Reference<'_>)) {
    if is_query(stmt) {
        visit_mut(stmt, &mut |n| match n {
            NodeEnum::RangeVar(rv) => f(Reference::Table(rv)),
            NodeEnum::ColumnRef(c) => f(Reference::Column(c)),
            _ => {}
        });
        return;
    }
    // SAFETY: the tree is only modified in place while the pointers are used;
    // no node is added or removed.
    unsafe {
        for (n, _, _) in stmt.nodes_mut() {
            match n {
                pg_query::NodeMut::RangeVar(rv) => f(Reference::Table(&mut *rv)),
                pg_query::NodeMut::ColumnRef(c) => f(Reference::Column(&mut *c)),
                _ => {}
            }
        }
    }
}

/// The table references of a statement (read from a copy of the tree).
pub fn range_vars(stmt: &NodeEnum) -> Vec<protobuf::RangeVar> {
    let mut copy = stmt.clone();
    let mut out = Vec::new();
    references_mut(&mut copy, |r| {
        if let Reference::Table(rv) = r {
            out.push(rv.clone());
        }
    });
    out
}

/// The functions a statement calls, each as its last name (`app.f` → `f`):
/// queries through the complete walk above, utility statements (a column's
/// DEFAULT, CALL's arguments) through pg_query's walker.
pub fn called_functions(stmt: &NodeEnum) -> Vec<String> {
    fn last(call: &protobuf::FuncCall) -> Option<String> {
        match call.funcname.last()?.node.as_ref()? {
            NodeEnum::String(s) => Some(s.sval.clone()),
            _ => None,
        }
    }
    let mut out = Vec::new();
    if is_query(stmt) {
        let mut copy = stmt.clone();
        visit_mut(&mut copy, &mut |n| {
            if let NodeEnum::FuncCall(call) = n {
                out.extend(last(call));
            }
        });
        return out;
    }
    for (n, _, _) in stmt.nodes() {
        match n {
            pg_query::NodeRef::FuncCall(call) => out.extend(last(call)),
            pg_query::NodeRef::CallStmt(call) => out.extend(call.funccall.as_deref().and_then(last)),
            _ => {}
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tables(sql: &str) -> Vec<String> {
        let parsed = pg_query::parse(sql).unwrap();
        let node = parsed.protobuf.stmts[0].stmt.as_ref().unwrap().node.as_ref().unwrap();
        let mut names: Vec<String> = range_vars(node).into_iter().map(|rv| rv.relname).collect();
        names.sort();
        names
    }

    #[test]
    fn finds_tables_where_pg_query_does_not_look() {
        assert_eq!(tables("SELECT 1 WHERE (SELECT count(*) FROM a) IS NULL"), ["a"]);
        assert_eq!(tables("SELECT (SELECT max(x) FROM a) IS TRUE"), ["a"]);
        assert_eq!(tables("SELECT count(*) FILTER (WHERE x IN (SELECT y FROM a)) FROM b"), ["a", "b"]);
        assert_eq!(tables("SELECT sum(x) OVER (PARTITION BY (SELECT 1 FROM a)) FROM b"), ["a", "b"]);
        assert_eq!(tables("SELECT ARRAY[(SELECT 1 FROM a)]"), ["a"]);
        assert_eq!(tables("SELECT (ARRAY(SELECT x FROM a))[1]"), ["a"]);
        assert_eq!(tables("SELECT * FROM a TABLESAMPLE bernoulli (50)"), ["a"]);
        assert_eq!(tables("SELECT f(x => (SELECT 1 FROM a))"), ["a"]);
        assert_eq!(tables("SELECT 1 FROM b GROUP BY ROLLUP ((SELECT 1 FROM a))"), ["a", "b"]);
        assert_eq!(tables("SELECT 1 FROM a UNION SELECT 2 FROM b EXCEPT SELECT 3 FROM c"), ["a", "b", "c"]);
        assert_eq!(tables("WITH w AS (SELECT * FROM a) SELECT * FROM w JOIN LATERAL (SELECT * FROM b) s ON true"), ["a", "b", "w"]);
        assert_eq!(tables("INSERT INTO t SELECT * FROM a ON CONFLICT (k) DO UPDATE SET v = (SELECT 1 FROM b)"), ["a", "b", "t"]);
        // Each assigned column carries its own copy of the shared subquery.
        assert_eq!(tables("UPDATE t SET (x, y) = (SELECT 1, 2 FROM a) WHERE k IN (SELECT k FROM b)"), ["a", "a", "b", "t"]);
        assert_eq!(tables("SELECT x COLLATE \"C\" FROM a WHERE (SELECT y FROM b) COLLATE \"C\" > ''"), ["a", "b"]);
        assert_eq!(tables("DECLARE c CURSOR FOR SELECT * FROM a WHERE k IN (SELECT k FROM b)"), ["a", "b"]);
        assert_eq!(
            tables("MERGE INTO t USING (SELECT * FROM a) s ON t.k = s.k AND t.k IN (SELECT k FROM b) WHEN MATCHED AND s.v > (SELECT 1 FROM c) THEN UPDATE SET v = (SELECT 2 FROM d) WHEN NOT MATCHED THEN INSERT VALUES ((SELECT 3 FROM e))"),
            ["a", "b", "c", "d", "e", "t"]
        );
    }
}
