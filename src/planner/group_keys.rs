//! A GROUP BY that names every column of a table's primary key may select
//! the table's other columns: PostgreSQL knows they depend on the key, and
//! Django's `annotate()` relies on it (`GROUP BY "author"."id"`). Where the
//! query does not run on the shards themselves (the general fallback's
//! stand-ins, the combining step of a multi-shard aggregate, the workers'
//! relations under user code) no primary key exists and PostgreSQL refuses
//! it. So the other columns of such a table that the query uses are added
//! to its GROUP BY, which leaves the groups as they were.

use super::resolve_range_var;
use super::walk::visit_mut;
use crate::metadata::{Catalog, DistributedTable};
use pg_query::protobuf::{self, Node, SelectStmt};
use pg_query::NodeEnum;
use std::sync::Arc;

/// The statement with those GROUP BY lists completed, when any was.
pub(super) fn expand(node: &NodeEnum, catalog: &Catalog) -> Option<NodeEnum> {
    let mut tree = node.clone();
    let mut changed = false;
    visit_mut(&mut tree, &mut |n| {
        if let NodeEnum::SelectStmt(select) = n {
            changed |= complete_group_by(select, catalog);
        }
    });
    changed.then_some(tree)
}

/// A column reference: its qualifier (when it has one) and its column, or
/// None for `*`.
type Reference = (Option<String>, Option<String>);

fn complete_group_by(select: &mut SelectStmt, catalog: &Catalog) -> bool {
    if select.group_clause.is_empty() || select.group_distinct {
        return false;
    }
    let mut grouped = Vec::new();
    for item in &select.group_clause {
        match item.node.as_ref() {
            Some(NodeEnum::ColumnRef(c)) => grouped.extend(reference(c)),
            Some(NodeEnum::GroupingSet(_)) => return false,
            _ => {}
        }
    }
    let mut tables = Vec::new();
    for item in &select.from_clause {
        collect_tables(item, catalog, &mut tables);
    }
    // An unqualified name is the table's only when the query reads no other.
    let alone = tables.len() == 1 && select.from_clause.len() == 1;
    let mut used = Vec::new();
    let mut parts: Vec<NodeEnum> = select.target_list.iter().chain(&select.sort_clause).filter_map(|n| n.node.clone()).collect();
    parts.extend(select.having_clause.as_deref().and_then(|n| n.node.clone()));
    for part in &mut parts {
        visit_mut(part, &mut |n| {
            if let NodeEnum::ColumnRef(c) = n {
                used.extend(reference(c));
            }
        });
    }
    let mut added = false;
    for (name, table) in &tables {
        let names_it = |qualifier: &Option<String>| qualifier.as_deref() == Some(name.as_str()) || (alone && qualifier.is_none());
        let is_grouped = |column: &str| grouped.iter().any(|(q, c)| names_it(q) && c.as_deref() == Some(column));
        if table.primary_key.is_empty() || !table.primary_key.iter().all(|k| is_grouped(k)) {
            continue;
        }
        let mut missing: Vec<&String> = Vec::new();
        for (qualifier, column) in &used {
            if !names_it(qualifier) {
                continue;
            }
            let columns: Vec<&String> = match column {
                Some(column) => table.columns.iter().filter(|c| *c == column).collect(),
                None => table.columns.iter().collect(),
            };
            for c in columns {
                if !is_grouped(c) && !missing.contains(&c) {
                    missing.push(c);
                }
            }
        }
        for column in missing {
            select.group_clause.push(column_ref(name, column));
            added = true;
        }
    }
    added
}

/// The distributed tables a FROM item reads directly (joined ones too, not
/// those inside subqueries), by the name the query knows each by.
fn collect_tables(item: &Node, catalog: &Catalog, out: &mut Vec<(String, Arc<DistributedTable>)>) {
    match item.node.as_ref() {
        Some(NodeEnum::RangeVar(rv)) => {
            if let Some(table) = resolve_range_var(rv, catalog) {
                let name = rv.alias.as_ref().map_or_else(|| rv.relname.clone(), |a| a.aliasname.clone());
                out.push((name, table.clone()));
            }
        }
        Some(NodeEnum::JoinExpr(join)) if join.alias.is_none() => {
            for side in [&join.larg, &join.rarg].into_iter().flatten() {
                collect_tables(side, catalog, out);
            }
        }
        _ => {}
    }
}

fn reference(c: &protobuf::ColumnRef) -> Option<Reference> {
    let field = |n: &Node| match n.node.as_ref() {
        Some(NodeEnum::String(s)) => Some(Some(s.sval.clone())),
        Some(NodeEnum::AStar(_)) => Some(None),
        _ => None,
    };
    match c.fields.as_slice() {
        [column] => Some((None, field(column)?)),
        [table, column] => Some((field(table)?, field(column)?)),
        _ => None,
    }
}

fn column_ref(table: &str, column: &str) -> Node {
    let string = |s: &str| Node { node: Some(NodeEnum::String(protobuf::String { sval: s.to_string() })) };
    Node { node: Some(NodeEnum::ColumnRef(protobuf::ColumnRef { fields: vec![string(table), string(column)], location: -1 })) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn catalog() -> Catalog {
        crate::planner::tests::CatalogBuilder::new()
            .reference("author", &["id", "name", "born"])
            .primary_key(&["id"])
            .reference("book", &["tenant", "id", "title"])
            .primary_key(&["tenant", "id"])
            .reference("tag", &["name"])
            .build()
    }

    fn expanded(sql: &str) -> Option<String> {
        let parsed = pg_query::parse(sql).unwrap();
        let node = parsed.protobuf.stmts[0].stmt.as_ref().unwrap().node.clone().unwrap();
        expand(&node, &catalog()).map(|tree| super::super::deparse::deparse_statement(parsed.protobuf.version, tree).unwrap())
    }

    #[test]
    fn a_grouped_primary_key_brings_the_columns_it_determines() {
        assert_eq!(
            expanded("SELECT a.id, a.name, count(b.id) FROM author a LEFT JOIN book b ON b.tenant = a.id GROUP BY a.id ORDER BY a.born").as_deref(),
            Some("SELECT a.id, a.name, count(b.id) FROM author a LEFT JOIN book b ON b.tenant = a.id GROUP BY a.id, a.name, a.born ORDER BY a.born")
        );
        assert_eq!(
            expanded("SELECT id, name FROM author GROUP BY id HAVING count(*) > 1").as_deref(),
            Some("SELECT id, name FROM author GROUP BY id, author.name HAVING count(*) > 1")
        );
        assert_eq!(
            expanded("SELECT author.* FROM author GROUP BY author.id").as_deref(),
            Some("SELECT author.* FROM author GROUP BY author.id, author.name, author.born")
        );
        // Every key column must be grouped, qualified as the query names the table.
        assert_eq!(expanded("SELECT b.id, b.title FROM book b GROUP BY b.id"), None);
        assert!(expanded("SELECT b.tenant, b.id, b.title FROM book b GROUP BY b.tenant, b.id")
            .is_some_and(|s| s.ends_with("GROUP BY b.tenant, b.id, b.title")));
        // Nothing to add, no key, grouping sets, or a name that might be another table's.
        assert_eq!(expanded("SELECT a.id, count(*) FROM author a GROUP BY a.id"), None);
        assert_eq!(expanded("SELECT name FROM tag GROUP BY name"), None);
        assert_eq!(expanded("SELECT a.id, a.name FROM author a GROUP BY ROLLUP (a.id)"), None);
        assert_eq!(expanded("SELECT id, name FROM author, tag GROUP BY id"), None);
        // In a subquery too.
        assert!(expanded("SELECT * FROM (SELECT a.id, a.name FROM author a GROUP BY a.id) s").is_some_and(|s| s.contains("GROUP BY a.id, a.name")));
    }
}
