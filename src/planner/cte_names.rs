//! WITH queries named like distributed tables. Inside its scope a WITH
//! query's name hides the table's, so `WITH orders AS (…) SELECT … FROM
//! orders` reads the WITH query; every tier would otherwise take the name for
//! the table. Such WITH queries are renamed, with the references their scope
//! gives them, before planning: the statement means the same and no name is
//! ambiguous any more.
//!
//! PostgreSQL's scoping: a WITH query is seen by the body of the statement
//! that carries the WITH clause (at any depth) and by the WITH queries after
//! it in the same clause, by every one of them under WITH RECURSIVE; an inner
//! WITH clause hides an outer one of the same name.

use super::walk::visit_mut;
use crate::metadata::Catalog;
use pg_query::protobuf;
use pg_query::NodeEnum;

/// The prefix of a renamed WITH query's name.
const RENAMED_PREFIX: &str = "tessera_cte_";

/// The statement with its WITH queries that hide distributed tables renamed,
/// or None when it has none.
pub(super) fn rename_hiding(node: &NodeEnum, catalog: &Catalog) -> Option<NodeEnum> {
    let mut hides = false;
    visit_mut(&mut node.clone(), &mut |n| {
        if let NodeEnum::CommonTableExpr(c) = n {
            hides |= catalog.may_name_distributed(&c.ctename);
        }
    });
    if !hides {
        return None;
    }
    let mut stmt = node.clone();
    let mut renamed = 0;
    rename_in(&mut stmt, &[], catalog, &mut renamed);
    Some(stmt)
}

/// A WITH query in scope: its name and the one it is given.
type InScope = (String, String);

/// Renames the hiding WITH queries declared in `node` and below, and the
/// references to them and to `outer` (the ones in scope around `node`).
fn rename_in(node: &mut NodeEnum, outer: &[InScope], catalog: &Catalog, renamed: &mut usize) {
    visit_mut(node, &mut |n| {
        if with_clause(n).is_some_and(|w| declares_hiding(w, catalog)) {
            // This statement's own scope is handled by a walk of its own;
            // the references it leaves (meaning a table, or a WITH query
            // further out) are then met by this walk.
            let Some(mut with) = with_clause_mut(n).and_then(Option::take) else { return };
            let scope = declare(&mut with, outer, catalog, renamed);
            rename_in(n, &scope, catalog, renamed);
            if let Some(slot) = with_clause_mut(n) {
                *slot = Some(with);
            }
            return;
        }
        if let NodeEnum::RangeVar(rv) = n {
            if rv.schemaname.is_empty() {
                if let Some((_, new)) = outer.iter().rev().find(|(name, _)| *name == rv.relname) {
                    if rv.alias.is_none() {
                        rv.alias = Some(protobuf::Alias { aliasname: rv.relname.clone(), colnames: vec![] });
                    }
                    rv.relname = new.clone();
                }
            }
        }
    });
}

/// Renames the hiding WITH queries of one clause and the references inside
/// their bodies; returns the scope the clause gives the statement's body.
fn declare(with: &mut protobuf::WithClause, outer: &[InScope], catalog: &Catalog, renamed: &mut usize) -> Vec<InScope> {
    let mut scope = outer.to_vec();
    let mut declared = Vec::new();
    for cte in &mut with.ctes {
        let Some(NodeEnum::CommonTableExpr(c)) = cte.node.as_mut() else { continue };
        if catalog.may_name_distributed(&c.ctename) && !c.ctename.starts_with(RENAMED_PREFIX) {
            *renamed += 1;
            declared.push((c.ctename.clone(), format!("{RENAMED_PREFIX}{renamed}_{}", c.ctename)));
        }
    }
    let all: Vec<InScope> = outer.iter().cloned().chain(declared.iter().cloned()).collect();
    for cte in &mut with.ctes {
        let Some(NodeEnum::CommonTableExpr(c)) = cte.node.as_mut() else { continue };
        // Without RECURSIVE a WITH query sees only those before it.
        let visible = if with.recursive { &all } else { &scope };
        if let Some(query) = c.ctequery.as_deref_mut().and_then(|q| q.node.as_mut()) {
            rename_in(query, visible, catalog, renamed);
        }
        if let Some((_, new)) = declared.iter().find(|(name, _)| *name == c.ctename) {
            scope.push((c.ctename.clone(), new.clone()));
            c.ctename = new.clone();
        }
    }
    all
}

fn declares_hiding(with: &protobuf::WithClause, catalog: &Catalog) -> bool {
    with.ctes.iter().any(|cte| matches!(cte.node.as_ref(), Some(NodeEnum::CommonTableExpr(c)) if catalog.may_name_distributed(&c.ctename) && !c.ctename.starts_with(RENAMED_PREFIX)))
}

fn with_clause(node: &NodeEnum) -> Option<&protobuf::WithClause> {
    match node {
        NodeEnum::SelectStmt(s) => s.with_clause.as_ref(),
        NodeEnum::InsertStmt(s) => s.with_clause.as_ref(),
        NodeEnum::UpdateStmt(s) => s.with_clause.as_ref(),
        NodeEnum::DeleteStmt(s) => s.with_clause.as_ref(),
        NodeEnum::MergeStmt(s) => s.with_clause.as_ref(),
        _ => None,
    }
}

fn with_clause_mut(node: &mut NodeEnum) -> Option<&mut Option<protobuf::WithClause>> {
    match node {
        NodeEnum::SelectStmt(s) => Some(&mut s.with_clause),
        NodeEnum::InsertStmt(s) => Some(&mut s.with_clause),
        NodeEnum::UpdateStmt(s) => Some(&mut s.with_clause),
        NodeEnum::DeleteStmt(s) => Some(&mut s.with_clause),
        NodeEnum::MergeStmt(s) => Some(&mut s.with_clause),
        _ => None,
    }
}
