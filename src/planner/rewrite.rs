//! Rewriting a statement's parse tree for one shard group: every reference to a
//! distributed or reference table is pointed at the shard that lives on the
//! target node, then the tree is deparsed back to SQL for the worker.

use super::deparse::deparse_tree;
use super::walk::{references_mut, visit_mut, Reference};
use crate::connection::quote_ident;
use crate::error::{PgError, PgResult};
use crate::metadata::{DistributedTable, Distribution, Shard};
use pg_query::protobuf::{self, Alias};
use pg_query::NodeEnum;
use std::sync::Arc;

/// The tables a statement references, and the parse tree to rewrite.
#[derive(Clone, Debug)]
pub struct ShardTemplate {
    tree: protobuf::ParseResult,
    /// The VALUES rows of a multi-row INSERT, kept out of `tree`: a shard's
    /// statement copies only the rows it keeps, not every row once per shard.
    values_rows: Vec<protobuf::Node>,
    tables: Vec<Arc<DistributedTable>>,
    /// Queries keep the table's name as an alias of the shard so that column
    /// references qualified with it still resolve; DDL takes no alias.
    alias_tables: bool,
    /// For a delegated call: its function's per-shard copies, whose schema
    /// names the shard group.
    copied_call: Option<CopiedCall>,
    /// Text written into every shard's statement after deparsing, in place
    /// of a placeholder the tree holds: rows shipped to the shards (see
    /// executor/fallback.rs), which would cost far more as parse-tree nodes.
    fills: Vec<(String, Arc<str>)>,
}

/// A delegated call pointed at the per-shard copy of its function
/// (planner/function_copy.rs).
#[derive(Clone, Debug)]
pub struct CopiedCall {
    /// The co-location group's table whose shard ids name the copy schemas.
    pub anchor: Arc<DistributedTable>,
    /// The catalog version the copies are made under.
    pub catalog_version: i64,
    /// The function's schema-qualified signature.
    pub signature: String,
    /// Its distribution argument (from 0).
    pub argument: usize,
}

impl ShardTemplate {
    /// A template for a query (SELECT/INSERT/UPDATE/DELETE).
    pub fn for_query(version: i32, mut stmt: protobuf::RawStmt, tables: Vec<Arc<DistributedTable>>) -> Self {
        let values_rows = insert_values(&mut stmt).map(std::mem::take).unwrap_or_default();
        ShardTemplate {
            tree: protobuf::ParseResult { version, stmts: vec![stmt] },
            values_rows,
            tables,
            alias_tables: true,
            copied_call: None,
            fills: Vec::new(),
        }
    }

    /// A template for a read of `table` that Tessera writes itself as text
    /// (a table's rows to ship, rows to move, keys to read first).
    pub fn for_own_query(version: i32, sql: &str, table: &Arc<DistributedTable>) -> PgResult<Self> {
        let parsed = pg_query::parse(sql).map_err(|e| PgError::internal(format!("could not parse {sql}: {e}")))?;
        let raw = parsed.protobuf.stmts.into_iter().next().ok_or_else(|| PgError::internal("empty statement"))?;
        Ok(Self::for_query(version, raw, vec![table.clone()]))
    }

    /// A template for a utility statement (CREATE INDEX, ALTER TABLE, …).
    pub fn for_utility(version: i32, stmt: protobuf::RawStmt, tables: Vec<Arc<DistributedTable>>) -> Self {
        ShardTemplate {
            tree: protobuf::ParseResult { version, stmts: vec![stmt] },
            values_rows: Vec::new(),
            tables,
            alias_tables: false,
            copied_call: None,
            fills: Vec::new(),
        }
    }

    /// A statement that runs as it is, on a node whose worker-side relations
    /// carry the tables' own names (user code).
    pub fn unchanged(version: i32, stmt: protobuf::RawStmt) -> Self {
        Self::for_utility(version, stmt, Vec::new())
    }

    /// A call (`SELECT f(…)` or `CALL p(…)`) that goes to the per-shard copy
    /// of its function.
    pub fn calling_copy(version: i32, stmt: protobuf::RawStmt, copied_call: CopiedCall) -> Self {
        ShardTemplate { copied_call: Some(copied_call), ..Self::unchanged(version, stmt) }
    }

    /// Makes every shard's statement carry `text` wherever the deparsed tree
    /// has `placeholder`.
    pub fn fill(&mut self, placeholder: String, text: Arc<str>) {
        self.fills.push((placeholder, text));
    }

    /// Where a delegated call's copies are, for a call to them.
    pub fn copied_call(&self) -> Option<&CopiedCall> {
        self.copied_call.as_ref()
    }

    /// The statement, as the client gave it.
    pub fn statement(&self) -> Option<&NodeEnum> {
        self.tree.stmts.first()?.stmt.as_ref()?.node.as_ref()
    }

    pub fn tables(&self) -> &[Arc<DistributedTable>] {
        &self.tables
    }

    pub fn version(&self) -> i32 {
        self.tree.version
    }

    /// The same tables, for another statement (a query's per-shard part).
    pub fn with_statement(self, stmt: NodeEnum) -> Self {
        let raw = protobuf::RawStmt { stmt: Some(Box::new(protobuf::Node { node: Some(stmt) })), stmt_location: 0, stmt_len: 0 };
        ShardTemplate { tree: protobuf::ParseResult { version: self.tree.version, stmts: vec![raw] }, values_rows: Vec::new(), ..self }
    }

    /// SQL for shard group `index`: hash tables use their shard with that index,
    /// reference tables their single shard.
    pub fn sql_for_shard(&self, index: u32) -> PgResult<String> {
        self.sql_with(index, |_| {})
    }

    /// How the statement reads several shard groups at once, if it can
    /// (`sql_for_shards`): a SELECT that joins one distributed table, named
    /// once, with reference tables, or two co-located ones joined on their
    /// distribution columns (`Partner`). Separate unions of two co-located
    /// tables' shards would lose which shards pair up (PostgreSQL joins
    /// every shard with every other: an index probe into each of the other
    /// table's shards, where one finds the row, with estimates from no
    /// statistics), so the union is of the pairs' joins; a scan of the
    /// table alone gains nothing (the pgbench accounts' sums took 1.22x
    /// plain PostgreSQL's time merged, 0.86x a statement per shard).
    /// None too for what a subquery cannot serve: row locks, TABLESAMPLE
    /// and ONLY need a table; system columns and a bare whole-row reference
    /// would name the subquery's, not a shard's; column aliases and NATURAL
    /// joins count on all the columns.
    pub fn merged_read(&self) -> Option<MergedRead> {
        let Some(stmt @ NodeEnum::SelectStmt(_)) = self.statement() else { return None };
        if self.copied_call.is_some() {
            return None;
        }
        let mut mergeable = true;
        let mut joins_reference = false;
        // Each distributed reference: its table's position and the name it goes by.
        let mut distributed: Vec<(usize, String)> = Vec::new();
        // Every column name the statement may use, as its fields (`*` for a star).
        let mut names: Vec<Vec<String>> = Vec::new();
        let mut copy = stmt.clone();
        visit_mut(&mut copy, &mut |n| match n {
            NodeEnum::LockingClause(_) | NodeEnum::RangeTableSample(_) => mergeable = false,
            NodeEnum::JoinExpr(join) => {
                mergeable &= !join.is_natural;
                names.extend(join.using_clause.iter().filter_map(|u| match u.node.as_ref() {
                    Some(NodeEnum::String(s)) => Some(vec![s.sval.clone()]),
                    _ => None,
                }));
            }
            NodeEnum::RangeVar(rv) => match self.tables.iter().position(|t| names_table(t, rv)) {
                Some(i) if self.tables[i].is_reference() => joins_reference = true,
                Some(i) => {
                    mergeable &= rv.inh && rv.alias.as_ref().is_none_or(|a| a.colnames.is_empty());
                    distributed.push((i, rv.alias.as_ref().map_or_else(|| rv.relname.clone(), |a| a.aliasname.clone())));
                }
                None => {}
            },
            NodeEnum::ColumnRef(c) => names.push(
                c.fields
                    .iter()
                    .map(|f| match f.node.as_ref() {
                        Some(NodeEnum::String(s)) => s.sval.clone(),
                        _ => "*".to_string(),
                    })
                    .collect(),
            ),
            _ => {}
        });
        if !mergeable || !joins_reference {
            return None;
        }
        let ((table, alias), partner) = match distributed.as_slice() {
            [first] => (first, None),
            [first, second] => (first, Some(self.partner(stmt, first, second, &names)?)),
            _ => return None,
        };
        let partner_alias = partner.as_ref().map(|p: &Partner| p.alias.as_str());
        let mut read = vec![false; self.tables[*table].columns.len()];
        for name in &names {
            let (qualifier, last) = match name.as_slice() {
                [.., qualifier, last] => (Some(qualifier.as_str()), last.as_str()),
                [last] => (None, last.as_str()),
                [] => continue,
            };
            if SYSTEM_COLUMNS.contains(&last) || (qualifier.is_none() && (last == alias || Some(last) == partner_alias)) {
                return None;
            }
            if qualifier.is_none_or(|q| q == alias) {
                for (column, flag) in self.tables[*table].columns.iter().zip(&mut read) {
                    *flag |= last == "*" || last == column;
                }
            }
        }
        let columns = self.tables[*table].columns.iter().zip(read).filter(|(_, r)| *r).map(|(c, _)| c.clone()).collect();
        Some(MergedRead { table: *table, alias: alias.clone(), columns, partner })
    }

    /// The second distributed table of a merged read, when the two can be
    /// read as the union of their shards' joins: co-located, both in the
    /// FROM list of one SELECT, whose WHERE equates their distribution
    /// columns, and no subquery expression that could name either from
    /// within (its columns come from the first table's name after); with
    /// the columns of it that `names` name.
    fn partner(&self, stmt: &NodeEnum, first: &(usize, String), second: &(usize, String), names: &[Vec<String>]) -> Option<Partner> {
        let (a, b) = (&self.tables[first.0], &self.tables[second.0]);
        let (Distribution::Hash { column: a_key, .. }, Distribution::Hash { column: b_key, .. }) = (&a.distribution, &b.distribution) else {
            return None;
        };
        if a.oid == b.oid || a.colocation_id != b.colocation_id || first.1 == second.1 {
            return None;
        }
        let mut sublinks = false;
        let mut paired = false;
        visit_mut(&mut stmt.clone(), &mut |n| match n {
            NodeEnum::SubLink(_) => sublinks = true,
            NodeEnum::SelectStmt(select) => {
                let listed = |alias: &str| {
                    select.from_clause.iter().any(|f| matches!(f.node.as_ref(), Some(NodeEnum::RangeVar(rv)) if range_var_name(rv) == alias))
                };
                if listed(&first.1) && listed(&second.1) {
                    let owner = |c: &protobuf::ColumnRef| column_owner(c, (&first.1, a), (&second.1, b));
                    paired |= where_conjuncts(select.where_clause.as_deref()).into_iter().any(|conjunct| {
                        equated_columns(conjunct).is_some_and(|(l, r)| {
                            let (l, r) = (owner(l), owner(r));
                            (l == Some((0, a_key)) && r == Some((1, b_key))) || (l == Some((1, b_key)) && r == Some((0, a_key)))
                        })
                    });
                }
            }
            _ => {}
        });
        if !paired || sublinks {
            return None;
        }
        let columns = self.partner_columns(first, second, names)?;
        Some(Partner { table: second.0, alias: second.1.clone(), keys: (a_key.clone(), b_key.clone()), columns })
    }

    /// The columns of the partner (`partner`: its position and name) the
    /// statement names, each with its name in the union: its own, or
    /// `tessera_pair_<name>` where the first table (`first`) has a column
    /// of that name too. None when a name cannot be placed: a star (the
    /// first table's would take in the partner's columns too), or an
    /// unqualified name both tables have.
    fn partner_columns(
        &self,
        (first, first_alias): &(usize, String),
        (partner, partner_alias): &(usize, String),
        names: &[Vec<String>],
    ) -> Option<Vec<(String, String)>> {
        let (first, second) = (&self.tables[*first], &self.tables[*partner]);
        let mut used = vec![false; second.columns.len()];
        for name in names {
            let (qualifier, last) = match name.as_slice() {
                [.., qualifier, last] => (Some(qualifier.as_str()), last.as_str()),
                [last] => (None, last.as_str()),
                [] => continue,
            };
            if last == "*" && qualifier.is_none_or(|q| q == partner_alias || q == first_alias) {
                return None;
            }
            let position = second.columns.iter().position(|c| c == last);
            match (qualifier, position) {
                (Some(q), Some(i)) if q == partner_alias => used[i] = true,
                (None, Some(_)) if first.columns.iter().any(|c| c == last) => return None,
                (None, Some(i)) => used[i] = true,
                _ => {}
            }
        }
        Some(
            second
                .columns
                .iter()
                .zip(used)
                .filter(|(_, u)| *u)
                .map(|(c, _)| {
                    let name = if first.columns.contains(c) { format!("tessera_pair_{c}") } else { c.clone() };
                    (c.clone(), name)
                })
                .collect(),
        )
    }

    /// SQL that reads shard groups `indexes` in one statement, as `read`
    /// says: the distributed table stands for the UNION ALL of its shards
    /// there (PostgreSQL pulls such a subquery up into an append of the
    /// shards, so filters and index scans still reach each one), reference
    /// tables for their one shard. A join with a reference table then scans
    /// and hashes that table once per task instead of once per shard group.
    pub fn sql_for_shards(&self, read: &MergedRead, indexes: &[u32]) -> PgResult<String> {
        let [first, ..] = indexes else { return Err(PgError::internal("a task over no shard group")) };
        if indexes.len() == 1 {
            return self.sql_for_shard(*first);
        }
        let table = &self.tables[read.table];
        let mut tree = self.tree.clone();
        if let Some(stmt) = tree.stmts[0].stmt.as_deref_mut().and_then(|n| n.node.as_mut()) {
            // The partner's rows come from the union too, under the first table's name.
            if let Some(partner) = &read.partner {
                visit_mut(stmt, &mut |n| {
                    if let NodeEnum::SelectStmt(select) = n {
                        select
                            .from_clause
                            .retain(|f| !matches!(f.node.as_ref(), Some(NodeEnum::RangeVar(rv)) if range_var_name(rv) == partner.alias));
                    }
                });
            }
            references_mut(stmt, |r| match r {
                Reference::Table(rv) if names_table(table, rv) => {
                    if rv.alias.is_none() {
                        rv.alias = Some(Alias { aliasname: rv.relname.clone(), colnames: vec![] });
                    }
                    rv.schemaname = String::new();
                    rv.relname = SHARD_UNION.to_string();
                }
                Reference::Table(rv) => self.point_at_shard(rv, *first),
                Reference::Column(c) => {
                    unqualify_schema(c, |schema, table| self.tables.iter().any(|t| t.schema == schema && t.name == table));
                    if let Some(partner) = &read.partner {
                        partner.requalify(c, &read.alias);
                    }
                }
            });
        }
        let arms: Vec<String> = match &read.partner {
            None => {
                let names: Vec<String> = read.columns.iter().map(|c| quote_ident(c)).collect();
                // `SELECT FROM shard` when no column is named (count(*)).
                let select = format!("SELECT {}", names.join(", "));
                let select = select.trim_end().to_string();
                indexes
                    .iter()
                    .filter_map(|&index| table.shards.get(index as usize))
                    .map(|shard| format!("{select} FROM {}", table.qualified_shard_name(shard)))
                    .collect()
            }
            Some(partner) => {
                let other = &self.tables[partner.table];
                let mut names: Vec<String> = read.columns.iter().map(|c| format!("tessera_first.{}", quote_ident(c))).collect();
                names.extend(partner.columns.iter().map(|(c, name)| format!("tessera_second.{} AS {}", quote_ident(c), quote_ident(name))));
                let select = format!("SELECT {}", names.join(", "));
                let select = select.trim_end();
                let (first_key, second_key) = (quote_ident(&partner.keys.0), quote_ident(&partner.keys.1));
                indexes
                    .iter()
                    .filter_map(|&index| Some((table.shards.get(index as usize)?, other.shards.get(index as usize)?)))
                    .map(|(shard, other_shard)| {
                        format!(
                            "{select} FROM {} tessera_first JOIN {} tessera_second ON tessera_first.{first_key} = tessera_second.{second_key}",
                            table.qualified_shard_name(shard),
                            other.qualified_shard_name(other_shard)
                        )
                    })
                    .collect()
            }
        };
        Ok(self.fill_in(deparse_tree(&tree)?)?.replace(SHARD_UNION, &format!("({})", arms.join(" UNION ALL "))))
    }

    /// Like `sql_for_shard`, after `edit` has changed the statement.
    pub fn sql_with(&self, index: u32, edit: impl FnOnce(&mut protobuf::Node)) -> PgResult<String> {
        let mut tree = self.tree.clone();
        if let Some(values) = insert_values(&mut tree.stmts[0]) {
            values.clone_from(&self.values_rows);
        }
        if let Some(node) = tree.stmts[0].stmt.as_deref_mut() {
            edit(node);
        }
        self.deparse_for_shard(tree, index)
    }

    /// A multi-row INSERT for shard group `index` that keeps only the VALUES
    /// rows `rows` (positions in the statement), each changed by `edit_row`
    /// (given its position), after `edit` has changed the rest of the INSERT.
    pub fn insert_rows_sql(
        &self,
        index: u32,
        rows: &[usize],
        edit: impl FnOnce(&mut protobuf::InsertStmt),
        mut edit_row: impl FnMut(usize, &mut protobuf::Node),
    ) -> PgResult<String> {
        let mut tree = self.tree.clone();
        if let Some(values) = insert_values(&mut tree.stmts[0]) {
            values.extend(rows.iter().filter_map(|&i| {
                let mut row = self.values_rows.get(i)?.clone();
                edit_row(i, &mut row);
                Some(row)
            }));
        }
        if let Some(NodeEnum::InsertStmt(insert)) = tree.stmts[0].stmt.as_deref_mut().and_then(|n| n.node.as_mut()) {
            edit(insert);
        }
        self.deparse_for_shard(tree, index)
    }

    fn deparse_for_shard(&self, mut tree: protobuf::ParseResult, index: u32) -> PgResult<String> {
        if let Some(stmt) = tree.stmts[0].stmt.as_deref_mut().and_then(|n| n.node.as_mut()) {
            if let Some(copy) = &self.copied_call {
                let shard = copy.anchor.shards.get(index as usize).ok_or_else(|| PgError::internal(format!("shard index {index} out of range")))?;
                let call = match stmt {
                    NodeEnum::CallStmt(call) => call.funccall.as_deref_mut(),
                    NodeEnum::SelectStmt(select) => match select.target_list.first_mut().and_then(|t| t.node.as_mut()) {
                        Some(NodeEnum::ResTarget(target)) => match target.val.as_deref_mut().and_then(|v| v.node.as_mut()) {
                            Some(NodeEnum::FuncCall(call)) => Some(&mut **call),
                            _ => None,
                        },
                        _ => None,
                    },
                    _ => None,
                };
                let call = call.ok_or_else(|| PgError::internal("a delegated call without its function call"))?;
                let name = call.funcname.pop().ok_or_else(|| PgError::internal("a function call without a name"))?;
                call.funcname = vec![super::string_node(&super::function_copy::copy_schema(shard.id, copy.catalog_version)), name];
            }
            if let NodeEnum::InsertStmt(insert) = stmt {
                self.name_conflict_constraint(insert, index);
            }
            references_mut(stmt, |r| match r {
                Reference::Table(rv) => self.point_at_shard(rv, index),
                Reference::Column(c) if self.alias_tables => {
                    unqualify_schema(c, |schema, table| self.tables.iter().any(|t| t.schema == schema && t.name == table))
                }
                Reference::Column(_) => {}
            });
        }
        self.fill_in(deparse_tree(&tree)?)
    }

    /// The deparsed statement with the text of its fills in place.
    fn fill_in(&self, mut sql: String) -> PgResult<String> {
        for (placeholder, text) in &self.fills {
            if !sql.contains(placeholder.as_str()) {
                return Err(PgError::internal(format!("the deparsed statement lost its placeholder {placeholder}")));
            }
            sql = sql.replace(placeholder.as_str(), text);
        }
        Ok(sql)
    }

    /// `ON CONFLICT ON CONSTRAINT name` names the shard's copy of the
    /// constraint, which carries the shard id as suffix.
    fn name_conflict_constraint(&self, insert: &mut protobuf::InsertStmt, index: u32) {
        let Some(infer) = insert.on_conflict_clause.as_deref_mut().and_then(|c| c.infer.as_deref_mut()).filter(|i| !i.conname.is_empty()) else {
            return;
        };
        let Some(rv) = insert.relation.as_ref() else { return };
        let Some(table) = self.table_of(rv) else { return };
        let shard = if table.is_reference() { table.shards.first() } else { table.shards.get(index as usize) };
        if let Some(shard) = shard {
            infer.conname = format!("{}_{}", infer.conname, shard.id);
        }
    }

    /// Points a table reference at its shard for shard group `index`. Public so
    /// that utility statements whose relation the generic walk misses (RENAME,
    /// foreign-key targets) can use it too.
    pub fn point_at_shard(&self, rv: &mut protobuf::RangeVar, index: u32) {
        let Some(table) = self.table_of(rv) else { return };
        let shard = if table.is_reference() { table.shards.first() } else { table.shards.get(index as usize) };
        let Some(shard) = shard else { return };
        if self.alias_tables && rv.alias.is_none() {
            // Column references qualified with the table name keep resolving.
            rv.alias = Some(Alias { aliasname: rv.relname.clone(), colnames: vec![] });
        }
        name_shard(rv, table, shard);
    }

    /// The statement's table `rv` names, if it is one of them.
    fn table_of(&self, rv: &protobuf::RangeVar) -> Option<&DistributedTable> {
        self.tables.iter().find(|t| names_table(t, rv)).map(|t| &**t)
    }
}

/// Whether `rv` names `table`.
fn names_table(table: &DistributedTable, rv: &protobuf::RangeVar) -> bool {
    table.name == rv.relname && (rv.schemaname.is_empty() || rv.schemaname == table.schema)
}

/// A statement that reads several shard groups at once (`merged_read`):
/// its distributed table, by position among the statement's tables, and the
/// columns the union of its shards gives, in the table's order. That is
/// every column some reference may name (a star, a qualified or
/// unqualified name, a USING column), no more, since a role may hold
/// privileges on some columns only.
#[derive(Debug)]
pub struct MergedRead {
    table: usize,
    /// The name the statement gives the table.
    alias: String,
    columns: Vec<String>,
    partner: Option<Partner>,
}

/// The second of two co-located tables a merged read joins: each arm of
/// the union joins the two tables' shards of one group on their
/// distribution columns, and the statement names the partner's columns
/// through the first table's name.
#[derive(Debug)]
struct Partner {
    table: usize,
    /// The name the statement gives it.
    alias: String,
    /// The first table's distribution column and the partner's.
    keys: (String, String),
    /// The partner's columns the union gives, each with its name there.
    columns: Vec<(String, String)>,
}

impl Partner {
    /// Points a reference to one of the partner's columns, `alias.column`,
    /// at the union, named `first_alias`.
    fn requalify(&self, c: &mut protobuf::ColumnRef, first_alias: &str) {
        let [qualifier, column] = &mut c.fields[..] else { return };
        let (Some(NodeEnum::String(q)), Some(NodeEnum::String(name))) = (qualifier.node.as_mut(), column.node.as_mut()) else { return };
        if q.sval != self.alias {
            return;
        }
        if let Some((_, renamed)) = self.columns.iter().find(|(own, _)| *own == name.sval) {
            q.sval = first_alias.to_string();
            name.sval = renamed.clone();
        }
    }
}

/// The name a FROM item gives its table: its alias, else the table's name.
fn range_var_name(rv: &protobuf::RangeVar) -> &str {
    rv.alias.as_ref().map_or(rv.relname.as_str(), |a| a.aliasname.as_str())
}

/// The top-level AND conjuncts of a WHERE clause.
fn where_conjuncts(condition: Option<&protobuf::Node>) -> Vec<&protobuf::Node> {
    let mut conjuncts = Vec::new();
    if let Some(condition) = condition {
        super::decorrelate::flatten_and(condition, &mut conjuncts);
    }
    conjuncts
}

/// The two columns an `a = b` condition compares.
fn equated_columns(condition: &protobuf::Node) -> Option<(&protobuf::ColumnRef, &protobuf::ColumnRef)> {
    let (l, r) = super::equality(condition)?;
    match (l.node.as_ref()?, r.node.as_ref()?) {
        (NodeEnum::ColumnRef(l), NodeEnum::ColumnRef(r)) => Some((l, r)),
        _ => None,
    }
}

/// Which of two tables, named `a.0` and `b.0`, a column reference names
/// (0 or 1), and the column: qualified by either name, or bare when only
/// one of them has a column of that name.
fn column_owner<'t>(c: &protobuf::ColumnRef, a: (&str, &'t DistributedTable), b: (&str, &'t DistributedTable)) -> Option<(usize, &'t String)> {
    let fields = super::qualified_name(&c.fields);
    let (qualifier, name) = match fields.as_slice() {
        [.., qualifier, name] => (Some(*qualifier), *name),
        [name] => (None, *name),
        [] => return None,
    };
    let find = |t: &'t DistributedTable| t.columns.iter().find(|c| *c == name);
    match qualifier {
        Some(q) if q == a.0 => find(a.1).map(|c| (0, c)),
        Some(q) if q == b.0 => find(b.1).map(|c| (1, c)),
        Some(_) => None,
        None => match (find(a.1), find(b.1)) {
            (Some(c), None) => Some((0, c)),
            (None, Some(c)) => Some((1, c)),
            _ => None,
        },
    }
}

impl MergedRead {
    /// Whether the read joins two co-located tables' shards pair by pair.
    pub fn joins_pair(&self) -> bool {
        self.partner.is_some()
    }
}

/// The name the distributed table goes by in the deparsed statement until
/// the union of its shards takes its place.
const SHARD_UNION: &str = "tessera_shard_union";

/// Columns every table has that a subquery over it has not.
const SYSTEM_COLUMNS: [&str; 6] = ["ctid", "xmin", "xmax", "cmin", "cmax", "tableoid"];

/// A FROM item that stands for rows a statement will carry as text (see
/// `ShardTemplate::fill`) while it is planned and deparsed: one row of
/// `columns` NULLs, the first replaced by the string `mark`, so that the
/// deparsed statement holds this very text where the rows go.
pub fn rows_placeholder(mark: &str, columns: usize) -> String {
    let mut cells = vec!["NULL".to_string(); columns.max(1)];
    cells[0] = format!("'{mark}'");
    format!("(VALUES ({}))", cells.join(", "))
}

/// `schema.table.column` cannot name an aliased table; `table.column` can, so
/// the schema goes when `renamed(schema, table)` says the table was aliased.
pub fn unqualify_schema(c: &mut protobuf::ColumnRef, renamed: impl Fn(&str, &str) -> bool) {
    if c.fields.len() != 3 {
        return;
    }
    let name = |i: usize| match c.fields[i].node.as_ref() {
        Some(NodeEnum::String(s)) => Some(s.sval.as_str()),
        _ => None,
    };
    let (Some(schema), Some(table)) = (name(0), name(1)) else { return };
    if renamed(schema, table) {
        c.fields.remove(0);
    }
}

/// Makes a reference to `table` name its shard `shard` instead.
pub fn name_shard(rv: &mut protobuf::RangeVar, table: &DistributedTable, shard: &Shard) {
    rv.relname = table.shard_relname(shard);
    rv.schemaname = table.schema.clone();
}

/// The VALUES rows of an INSERT … VALUES statement.
fn insert_values(stmt: &mut protobuf::RawStmt) -> Option<&mut Vec<protobuf::Node>> {
    let Some(NodeEnum::InsertStmt(insert)) = stmt.stmt.as_deref_mut()?.node.as_mut() else { return None };
    let Some(NodeEnum::SelectStmt(select)) = insert.select_stmt.as_deref_mut()?.node.as_mut() else { return None };
    Some(&mut select.values_lists)
}
