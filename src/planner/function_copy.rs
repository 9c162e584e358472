//! Per-shard copies of distributed PL/pgSQL and SQL functions and procedures.
//!
//! A delegated call runs its statements on the worker over the worker-side
//! parents (commands/worker_relations.rs). Correct, but slow: over a parent
//! PL/pgSQL's generic plan looks as costly as every partition together, so
//! `plan_cache_mode = auto` plans each statement anew at every execution,
//! and a call runs at a third of plain PostgreSQL's speed (docs/benchmarks.md,
//! "Where a delegated call's time goes on the worker").
//!
//! So a call delegated outside a transaction block goes to a copy of the
//! function made for its shard group, in a schema of its own on the node
//! holding that group (`copy_schema`). In the copy, each SQL statement that
//! reaches the group's tables only through values the function holds (its
//! arguments and variables, `WHERE s_w_id = p_supply_w_ids[i]`) runs on the
//! group's shards directly when a guard finds those values in this shard
//! group, and as written otherwise:
//!
//! ```text
//! IF NOT (<values in this group>) THEN <statement as written, on one line> ELSE <statement on the shards> END IF;
//! ```
//!
//! The shard statement's plan is as cheap as plain PostgreSQL's, so `auto`
//! keeps its generic plan. Both branches start on the statement's first
//! line, and the shard statement keeps the written text and line breaks
//! but for the table names, so error positions (`line N at SQL statement`)
//! and the quoted statement stay those of the function as written.
//!
//! A SQL function's copy runs only for a distribution argument in its shard
//! group, so its statements pinned to that argument name the shards with no
//! guard (`rewrite_sql_body`); a PL/pgSQL copy calls it behind a guard
//! (`guarded_calls`), and the two are made together.
//!
//! Copies are a cache: made on a node the first time a call needs one
//! (executor/function_copies.rs), named after the catalog version they were
//! made under (a moved shard or a renamed table makes a new version), and
//! dropped on every node by any statement that changes functions, roles or
//! other cluster-wide objects (`drop_all_sql`).

use super::deparse::deparse_expression;
use super::{equality, qualified_name, string_node};
use crate::connection::{quote_ident, quote_literal};
use crate::error::{PgError, PgResult};
use crate::metadata::{Catalog, CopiedLanguage, DistributedFunction, DistributedTable, Distribution};
use pg_query::protobuf;
use pg_query::NodeEnum;
use serde_json::Value;
use std::collections::HashSet;
use std::sync::Arc;

/// How every copy schema's name begins.
pub const COPY_SCHEMA_PREFIX: &str = "tessera_shard_";

/// The advisory lock (on each node) that making copies and dropping them
/// take, so that no copy is made from a definition a concurrent statement
/// is changing.
pub const COPY_LOCK: i64 = 7_482_912;

/// Drops every copy on a node whose name is LIKE `pattern` but not
/// `keep` (an escaped `tessera\_shard\_…`).
pub fn drop_copies_sql(pattern: &str, keep: &str) -> String {
    format!(
        "DO $tessera$ DECLARE s text; BEGIN
           FOR s IN SELECT nspname FROM pg_catalog.pg_namespace WHERE nspname LIKE {} AND nspname <> {} LOOP
             EXECUTE format('DROP SCHEMA %I CASCADE', s);
           END LOOP;
         END $tessera$",
        quote_literal(pattern),
        quote_literal(keep)
    )
}

/// Drops every copy on a node, in the transaction of a statement that
/// changes functions, roles or other objects copies depend on.
pub fn drop_all_sql() -> String {
    format!("SELECT pg_advisory_xact_lock({COPY_LOCK}); {}", drop_copies_sql(&format!("{}%", like_escaped(COPY_SCHEMA_PREFIX)), ""))
}

/// `text` with LIKE's wildcard `_` taken literally.
pub fn like_escaped(text: &str) -> String {
    text.replace('_', "\\_")
}

/// The schema of the copies for the shard group whose anchor shard (of the
/// group's first table) is `shard_id`, made under catalog version `version`.
pub fn copy_schema(shard_id: i64, version: i64) -> String {
    format!("{COPY_SCHEMA_PREFIX}{shard_id}_v{version}")
}

/// The anchor shard id a copy schema's name carries, found in an error
/// message that names it (a copy or its schema that does not exist).
pub fn shard_id_named_in(message: &str) -> Option<i64> {
    let at = message.find(COPY_SCHEMA_PREFIX)? + COPY_SCHEMA_PREFIX.len();
    let digits: String = message[at..].chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

/// `text` with the copy schemas' names taken out of qualified function
/// names (`tessera_shard_102008_v7.f(integer)` → `f(integer)`), so that
/// errors and notices name the function the client called.
pub fn without_copy_schemas(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find(COPY_SCHEMA_PREFIX) {
        let tail = &rest[at + COPY_SCHEMA_PREFIX.len()..];
        let name_len = tail.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(tail.len());
        out.push_str(&rest[..at]);
        if tail[name_len..].starts_with('.') {
            rest = &tail[name_len + 1..];
        } else {
            out.push_str(&rest[at..at + COPY_SCHEMA_PREFIX.len() + name_len]);
            rest = &tail[name_len..];
        }
    }
    out.push_str(rest);
    out
}

/// What making a copy takes.
pub struct Copy {
    /// The statement creating (or replacing) it.
    pub create: String,
    /// The distributed SQL functions its body calls through their copies in
    /// the same schema, which are made with it.
    pub calls: Vec<Arc<DistributedFunction>>,
}

/// Where a copy goes.
pub struct CopyTarget<'a> {
    /// Its schema.
    pub schema: &'a str,
    /// A table of the co-location group, and the index of the shard group.
    pub anchor: &'a DistributedTable,
    pub index: u32,
    /// Of `helper_names`, those more than one function carries on the node
    /// (copy schemas aside): a bare call of one may mean another than the
    /// distributed one, so it is left as written.
    pub overloaded: &'a HashSet<String>,
}

/// The copy at `target` of the function `definition` creates
/// (`pg_get_functiondef`'s text); `argument` is its distribution argument
/// (from 0).
pub fn copy_sql(definition: &str, target: &CopyTarget, argument: usize, catalog: &Catalog) -> PgResult<Copy> {
    let CopyTarget { schema, anchor, index, .. } = *target;
    let parsed = pg_query::parse(definition).map_err(|e| PgError::internal(format!("cannot parse the definition of a distributed function: {e}")))?;
    let mut tree = parsed.protobuf;
    let Some(NodeEnum::CreateFunctionStmt(function)) = tree.stmts.first_mut().and_then(|s| s.stmt.as_deref_mut()).and_then(|s| s.node.as_mut())
    else {
        return Err(PgError::internal("a distributed function's definition is not CREATE FUNCTION"));
    };
    let name = match function.funcname.last().and_then(|n| n.node.as_ref()) {
        Some(NodeEnum::String(s)) => s.sval.clone(),
        _ => return Err(PgError::internal("a distributed function's definition has no name")),
    };
    function.funcname = vec![string_node(schema), string_node(&name)];
    function.replace = true;
    let argument = Argument { name: input_parameter_name(&function.parameters, argument).unwrap_or_default(), number: argument as i32 + 1 };
    let group = Group { colocation_id: anchor.colocation_id, index };
    let mut calls = Vec::new();
    match body_mut(function) {
        Some((CopiedLanguage::PlPgSql, body)) => {
            if let Some((rewritten, called)) = rewrite_body(definition, body, target, &group, catalog) {
                *body = rewritten;
                calls = called;
            }
        }
        Some((CopiedLanguage::Sql, body)) => {
            if let Some(rewritten) = rewrite_sql_body(body, &argument, &group, catalog) {
                *body = rewritten;
            }
        }
        None => {}
    }
    Ok(Copy { create: super::deparse::deparse_faithfully(&tree)?, calls })
}

/// The name of input parameter `index` (from 0), None when unnamed.
fn input_parameter_name(parameters: &[protobuf::Node], index: usize) -> Option<String> {
    use protobuf::FunctionParameterMode as M;
    parameters
        .iter()
        .filter_map(|p| match p.node.as_ref() {
            Some(NodeEnum::FunctionParameter(p)) if p.mode != M::FuncParamOut as i32 && p.mode != M::FuncParamTable as i32 => Some(&p.name),
            _ => None,
        })
        .nth(index)
        .filter(|name| !name.is_empty())
        .cloned()
}

/// The language and body (of `AS '…'`) of a PL/pgSQL or SQL function.
fn body_mut(function: &mut protobuf::CreateFunctionStmt) -> Option<(CopiedLanguage, &mut String)> {
    let option = |name: &str, options: &[protobuf::Node]| {
        options.iter().position(|o| matches!(o.node.as_ref(), Some(NodeEnum::DefElem(d)) if d.defname == name))
    };
    let language = option("language", &function.options)?;
    let Some(NodeEnum::DefElem(lang)) = function.options[language].node.as_ref() else { return None };
    let language = match lang.arg.as_deref().and_then(|a| a.node.as_ref()) {
        Some(NodeEnum::String(s)) if s.sval.eq_ignore_ascii_case("plpgsql") => CopiedLanguage::PlPgSql,
        Some(NodeEnum::String(s)) if s.sval.eq_ignore_ascii_case("sql") => CopiedLanguage::Sql,
        _ => return None,
    };
    let at = option("as", &function.options)?;
    let Some(NodeEnum::DefElem(def)) = function.options[at].node.as_mut() else { return None };
    let Some(NodeEnum::List(list)) = def.arg.as_deref_mut().and_then(|a| a.node.as_mut()) else { return None };
    match list.items.first_mut().and_then(|i| i.node.as_mut()) {
        Some(NodeEnum::String(s)) => Some((language, &mut s.sval)),
        _ => None,
    }
}

/// The co-location group and shard group a copy is for.
struct Group {
    colocation_id: i32,
    index: u32,
}

/// One SQL statement of the body, as PL/pgSQL parsed it.
struct BodyStatement {
    line: usize,
    /// Its text from the body, the INTO clause blanked out (or cut off, at
    /// the end) as PL/pgSQL does.
    query: String,
}

/// Where a statement sits in the body.
struct Span {
    start: usize,
    /// Just past its semicolon.
    end: usize,
}

/// The body with every statement that can run on this shard group's shards
/// written twice behind a guard, and every call of a distributed SQL
/// function of the group likewise (`guarded_calls`), with the functions so
/// called; None when there is nothing to rewrite.
fn rewrite_body(
    definition: &str,
    body: &str,
    target: &CopyTarget,
    group: &Group,
    catalog: &Catalog,
) -> Option<(String, Vec<Arc<DistributedFunction>>)> {
    // Under `#variable_conflict use_column` a name may mean a column where
    // the rewrite would take it for a variable.
    if body.contains("variable_conflict") {
        return None;
    }
    let json = pg_query::parse_plpgsql(definition).ok()?;
    let mut variables = HashSet::new();
    let mut statements = Vec::new();
    collect(&json, &mut variables, &mut statements);
    statements.sort_by_key(|s| s.line);
    let line_starts: Vec<usize> = std::iter::once(0).chain(body.match_indices('\n').map(|(i, _)| i + 1)).collect();
    let mut edits: Vec<(Span, String)> = Vec::new();
    for statement in &statements {
        let Some(&from) = line_starts.get(statement.line.saturating_sub(1)) else { continue };
        let Some(span) = locate(body, &statement.query, from, &edits) else { continue };
        if let Some(guarded) = guarded_statement(&statement.query, &span, body, &variables, group, catalog) {
            edits.push((span, guarded));
        }
    }
    let mut called: Vec<Arc<DistributedFunction>> = Vec::new();
    for (span, text, function) in guarded_calls(body, target, &edits, &variables, group, catalog) {
        if !called.iter().any(|f| Arc::ptr_eq(f, &function)) {
            called.push(function);
        }
        edits.push((span, text));
    }
    if edits.is_empty() {
        return None;
    }
    edits.sort_by_key(|(span, _)| std::cmp::Reverse(span.start));
    let mut out = body.to_string();
    for (span, text) in edits {
        out.replace_range(span.start..span.end, &text);
    }
    Some((out, called))
}

/// The calls, outside the statements rewritten already (`taken`), of
/// distributed SQL functions of this co-location group whose distribution
/// argument is a value the function holds, each with the CASE that calls
/// the function's copy when that value is in this shard group:
/// such a copy reads the group's shards, where the function itself, planned
/// anew at every call, would plan a scan of every partition of the parents.
fn guarded_calls(
    body: &str,
    target: &CopyTarget,
    taken: &[(Span, String)],
    variables: &HashSet<String>,
    group: &Group,
    catalog: &Catalog,
) -> Vec<(Span, String, Arc<DistributedFunction>)> {
    use protobuf::Token;
    let Ok(scanned) = pg_query::scan(body) else { return Vec::new() };
    let tokens = &scanned.tokens;
    // A name any table has may be a column here rather than a variable.
    let columns: HashSet<&str> = catalog.tables().flat_map(|t| t.columns.iter().map(String::as_str)).collect();
    let context = Context { values: Values::Variables(variables), columns: &columns };
    let mut out: Vec<(Span, String, Arc<DistributedFunction>)> = Vec::new();
    for (i, name) in tokens.iter().enumerate() {
        let opens = tokens.get(i + 1).is_some_and(|t| t.token == Token::Ascii40 as i32);
        let qualified = i > 0 && tokens[i - 1].token == Token::Ascii46 as i32;
        if !opens || qualified {
            continue;
        }
        let mut depth = 0;
        let close = tokens[i + 1..].iter().find(|t| {
            if t.token == Token::Ascii40 as i32 {
                depth += 1;
            } else if t.token == Token::Ascii41 as i32 {
                depth -= 1;
            }
            depth == 0
        });
        let Some(close) = close else { continue };
        let span = Span { start: name.start as usize, end: close.end as usize };
        let overlaps = |s: &Span| s.start < span.end && span.start < s.end;
        if taken.iter().any(|(s, _)| overlaps(s)) || out.iter().any(|(s, _, _)| overlaps(s)) {
            continue;
        }
        if let Some((text, function)) = guarded_call(&body[span.start..span.end], target, &context, group, catalog) {
            out.push((span, text, function));
        }
    }
    out
}

/// `written` (a call, on one line) as a CASE calling the copy when its
/// distribution argument is in this shard group; None when it is no call
/// of a distributed SQL function of the group by such a value, or the name
/// may mean another function.
fn guarded_call(
    written: &str,
    target: &CopyTarget,
    context: &Context,
    group: &Group,
    catalog: &Catalog,
) -> Option<(String, Arc<DistributedFunction>)> {
    if written.contains('\n') {
        return None;
    }
    let parsed = pg_query::parse(&format!("SELECT {written}")).ok()?;
    let [raw] = parsed.protobuf.stmts.as_slice() else { return None };
    let Some(NodeEnum::SelectStmt(select)) = raw.stmt.as_ref()?.node.as_ref() else { return None };
    let [item] = select.target_list.as_slice() else { return None };
    let Some(NodeEnum::ResTarget(item)) = item.node.as_ref() else { return None };
    let Some(NodeEnum::FuncCall(call)) = item.val.as_deref()?.node.as_ref() else { return None };
    let plain =
        !call.agg_star && !call.agg_distinct && !call.func_variadic && call.over.is_none() && call.agg_order.is_empty() && call.agg_filter.is_none();
    let [name] = call.funcname.as_slice() else { return None };
    let Some(NodeEnum::String(name)) = name.node.as_ref() else { return None };
    if !plain || target.overloaded.contains(&name.sval) || call.args.iter().any(|a| matches!(a.node.as_ref(), Some(NodeEnum::NamedArgExpr(_)))) {
        return None;
    }
    let function = catalog.function(None, &name.sval, call.args.len(), &[]).filter(|f| is_helper_of(f, group.colocation_id))?;
    let (index, table) = function.distribution.as_ref()?;
    let argument = call.args.get(*index).filter(|a| is_pin(a, context))?;
    let guard = in_group_guard(&deparse_expression(argument.node.as_ref()?).ok()?, table, group)?;
    Some((format!("(CASE WHEN {guard} THEN {}.{written} ELSE {written} END)", quote_ident(target.schema)), function.clone()))
}

/// Whether PL/pgSQL copies in co-location group `colocation_id` call
/// `function`'s copies: a distributed SQL function with copies, of that group.
fn is_helper_of(function: &DistributedFunction, colocation_id: i32) -> bool {
    function.copied_per_shard == Some(CopiedLanguage::Sql) && function.distribution.as_ref().is_some_and(|(_, t)| t.colocation_id == colocation_id)
}

/// The names of the functions whose copies the copies of co-location group
/// `colocation_id` may call (`guarded_call`): only those can be overloaded
/// in a way that matters to them.
pub fn helper_names(catalog: &Catalog, colocation_id: i32) -> Vec<&str> {
    catalog.functions().filter(|f| is_helper_of(f, colocation_id)).map(|f| f.name.as_str()).collect()
}

/// Variable names (every block's) and SQL statements of a parsed function.
fn collect(value: &Value, variables: &mut HashSet<String>, statements: &mut Vec<BodyStatement>) {
    match value {
        Value::Array(items) => items.iter().for_each(|v| collect(v, variables, statements)),
        Value::Object(map) => {
            for (key, inner) in map {
                match key.as_str() {
                    "PLpgSQL_var" | "PLpgSQL_rec" | "PLpgSQL_row" => {
                        if let Some(name) = inner.get("refname").and_then(Value::as_str) {
                            variables.insert(name.to_string());
                        }
                    }
                    "PLpgSQL_stmt_execsql" => {
                        let line = inner.get("lineno").and_then(Value::as_u64);
                        let query = inner.pointer("/sqlstmt/PLpgSQL_expr/query").and_then(Value::as_str);
                        if let (Some(line), Some(query)) = (line, query) {
                            statements.push(BodyStatement { line: line as usize, query: query.to_string() });
                        }
                    }
                    _ => {}
                }
                collect(inner, variables, statements);
            }
        }
        _ => {}
    }
}

/// Finds `query` in `body` at or after `from`, outside spans already
/// taken: the body's text matches it except where PL/pgSQL blanked the
/// INTO clause out, and a semicolon follows (after an INTO clause PL/pgSQL
/// cut off the end, if so).
fn locate(body: &str, query: &str, from: usize, taken: &[(Span, String)]) -> Option<Span> {
    let (b, q) = (body.as_bytes(), query.as_bytes());
    let first = *q.first()?;
    let mut p = from;
    while p + q.len() <= b.len() {
        let fits = b[p] == first
            && !taken.iter().any(|(s, _)| (s.start..s.end).contains(&p))
            && q.iter().zip(&b[p..]).all(|(qc, bc)| qc == bc || *qc == b' ');
        if !fits {
            p += 1;
            continue;
        }
        let after = p + q.len();
        let semicolon = after + body[after..].find(';')?;
        let tail = body[after..semicolon].trim();
        let differing: Vec<usize> = q.iter().zip(&b[p..]).enumerate().filter(|(_, (qc, bc))| qc != bc).map(|(i, _)| i).collect();
        let into = match (differing.first(), differing.last(), tail.is_empty()) {
            (None, None, true) => None,
            (None, None, false) => Some(tail),
            // PL/pgSQL blanks the line breaks after the clause too.
            (Some(&a), Some(&z), true) => Some(body[p + a..=p + z].trim_end()),
            _ => return None,
        };
        if into.is_some_and(|i: &str| {
            !i.get(..4).is_some_and(|w| w.eq_ignore_ascii_case("into")) || i.contains("--") || i.contains("/*") || i.contains('\n')
        }) {
            return None;
        }
        return Some(Span { start: p, end: semicolon + 1 });
    }
    None
}

/// What a table reference in a statement means.
enum Relation {
    /// A table of the copy's co-location group, with a worker-side parent.
    InGroup(Arc<DistributedTable>),
    /// A reference table (read from the node's own copy either way).
    Reference(Arc<DistributedTable>),
    /// Another distributed table, or a name that cannot be pinned down.
    Other,
}

fn relation(rv: &protobuf::RangeVar, group: &Group, catalog: &Catalog) -> Relation {
    let table = if rv.schemaname.is_empty() {
        // On a worker only distributed tables have relations of their own
        // name, so a name that one table alone carries is that table.
        let mut named = catalog.tables().filter(|t| t.name == rv.relname);
        match (named.next(), named.next()) {
            (Some(t), None) => t.clone(),
            _ => return Relation::Other,
        }
    } else {
        match catalog.table(&rv.schemaname, &rv.relname) {
            Some(t) => t.clone(),
            None => return Relation::Other,
        }
    };
    if table.is_reference() {
        Relation::Reference(table)
    } else if table.colocation_id == group.colocation_id && table.has_worker_parent() {
        Relation::InGroup(table)
    } else {
        Relation::Other
    }
}

/// The IF that runs the statement on the shards when its values are in
/// this shard group, None when the statement does not qualify.
fn guarded_statement(query: &str, span: &Span, body: &str, variables: &HashSet<String>, group: &Group, catalog: &Catalog) -> Option<String> {
    // The statement is written once more on one line (below): no comment
    // or literal may span lines.
    if query.contains("--")
        || query.contains("/*")
        || pg_query::scan(query).ok()?.tokens.iter().any(|t| query.get(t.start as usize..t.end as usize).is_none_or(|s| s.contains('\n')))
    {
        return None;
    }
    let parsed = pg_query::parse(query).ok()?;
    let [raw] = parsed.protobuf.stmts.as_slice() else { return None };
    let node = raw.stmt.as_ref()?.node.as_ref()?;
    // Every table the statement names, wherever (subqueries included).
    let mut in_group = Vec::new();
    let mut columns: HashSet<&str> = HashSet::new();
    let all = crate::walk::range_vars(node);
    let mut tables = Vec::new();
    for rv in &all {
        match relation(rv, group, catalog) {
            Relation::InGroup(t) => {
                in_group.push(t.clone());
                tables.push(t);
            }
            Relation::Reference(t) => tables.push(t),
            Relation::Other => return None,
        }
    }
    for t in &tables {
        columns.extend(t.columns.iter().map(String::as_str));
    }
    if in_group.is_empty() {
        return None;
    }
    let context = Context { values: Values::Variables(variables), columns: &columns };
    let top = top_level(node)?;
    let placed = top.placed(group, catalog)?;
    let conditions = top.conditions();
    // Each group table once, at the top level, with a pinning value: its
    // own, or that of a group table it is joined to on the key.
    let mut guards = Vec::new();
    let mut renames = Vec::new();
    for (i, table) in in_group.iter().enumerate() {
        if in_group[..i].iter().any(|t| t.oid == table.oid) {
            return None;
        }
        let at = placed.iter().position(|p| p.table.oid == table.oid)?;
        let Distribution::Hash { column, .. } = &table.distribution else { return None };
        if variables.contains(column) || top.assigned.contains(&column.as_str()) {
            return None;
        }
        let pin = match &top.pins {
            Pins::Where(_) => pin_in_conditions(&conditions, at, &placed, &context).or_else(|| {
                (0..placed.len())
                    .filter(|other| *other != at && joined_on_keys(&conditions, at, *other, &placed))
                    .find_map(|other| pin_in_conditions(&conditions, other, &placed, &context))
            })?,
            Pins::Row(insert) => pin_in_row(insert, table, column, &context)?,
        };
        let pin = deparse_expression(pin.node.as_ref()?).ok()?;
        renames.push(shard_rename(placed[at].rv, table, group.index, matches!(top.pins, Pins::Row(_)), query)?);
        guards.push(in_group_guard(&pin, table, group)?);
    }
    // The statement on the shards keeps the text (and lines) of the one
    // written, but for the table names, so that an error's CONTEXT quotes
    // it as PostgreSQL would once the coordinator names the tables again
    // (`tables_named_again`); the one over the parents goes on one line
    // before it, so that both start on the statement's line.
    let written = &body[span.start..span.end];
    let on_shards = renamed(written, renames);
    let one_line: String = written.chars().map(|c| if c == '\n' || c == '\r' { ' ' } else { c }).collect();
    Some(format!("IF NOT ({}) THEN {one_line} ELSE {on_shards} END IF;", guards.join(" AND ")))
}

/// Whether `pin` (SQL) is a value of the distribution column's type whose
/// rows lie in this shard group of `table`'s co-location group.
fn in_group_guard(pin: &str, table: &DistributedTable, group: &Group) -> Option<String> {
    let Distribution::Hash { key, .. } = &table.distribution else { return None };
    Some(format!(
        "(CASE WHEN pg_catalog.pg_typeof({pin}) = {}::pg_catalog.regtype THEN pg_catalog.satisfies_hash_partition({}::pg_catalog.regclass, {}, {}, {pin}) ELSE false END)",
        quote_literal(&key.base_sql),
        quote_literal(&table.qualified_name()),
        table.shard_count(),
        group.index
    ))
}

/// The body of a SQL function's copy. The copy runs only for a value of
/// the distribution argument in this shard group (a delegated call is
/// routed by it, a PL/pgSQL copy calls it behind `guarded_call`'s guard),
/// so a statement whose every reference to a group table is pinned to that
/// argument (`key = argument` at the reference's own query level,
/// subqueries included, or joined on the key to such a reference) names
/// the group's shards; others stay as written. None when none qualifies.
fn rewrite_sql_body(body: &str, argument: &Argument, group: &Group, catalog: &Catalog) -> Option<String> {
    let parsed = pg_query::parse(body).ok()?;
    let mut renames = Vec::new();
    for raw in &parsed.protobuf.stmts {
        if let Some(node) = raw.stmt.as_ref().and_then(|s| s.node.as_ref()) {
            renames.extend(pinned_to_argument(node, body, argument, group, catalog).unwrap_or_default());
        }
    }
    (!renames.is_empty()).then(|| renamed(body, renames))
}

/// `text` with each `(at, len, name)` of `renames` (`shard_rename`'s) put
/// in place.
fn renamed(text: &str, mut renames: Vec<(usize, usize, String)>) -> String {
    renames.sort_by_key(|(at, _, _)| std::cmp::Reverse(*at));
    let mut out = text.to_string();
    for (at, len, name) in renames {
        out.replace_range(at..at + len, &name);
    }
    out
}

/// The renames putting the shards in place of every group table `node`
/// reads or writes, when each reference is pinned to the argument.
fn pinned_to_argument(node: &NodeEnum, body: &str, argument: &Argument, group: &Group, catalog: &Catalog) -> Option<Vec<(usize, usize, String)>> {
    let mut tables = Vec::new();
    let mut in_group = 0;
    for rv in &crate::walk::range_vars(node) {
        match relation(rv, group, catalog) {
            Relation::InGroup(t) => {
                in_group += 1;
                tables.push(t);
            }
            Relation::Reference(t) => tables.push(t),
            Relation::Other => return None,
        }
    }
    let columns: HashSet<&str> = tables.iter().flat_map(|t| t.columns.iter().map(String::as_str)).collect();
    let context = Context { values: Values::Argument(argument), columns: &columns };
    let mut renames = Vec::new();
    let mut whole = in_group > 0;
    let mut tree = node.clone();
    crate::walk::visit_mut(&mut tree, &mut |n| {
        let level = matches!(n, NodeEnum::SelectStmt(_) | NodeEnum::UpdateStmt(_) | NodeEnum::DeleteStmt(_) | NodeEnum::InsertStmt(_));
        if !whole || !level {
            return;
        }
        // A level of another shape (a set operation, VALUES) has no tables
        // of its own; one with tables that cannot be placed leaves them
        // out of the renames, which the count below catches.
        let Some(top) = top_level(n) else { return };
        match pinned_level(&top, body, &context, group, catalog) {
            Some(found) => renames.extend(found),
            None => whole = false,
        }
    });
    (whole && renames.len() == in_group).then_some(renames)
}

/// The renames of one query level's group tables, when each is pinned.
fn pinned_level(top: &TopLevel, body: &str, context: &Context, group: &Group, catalog: &Catalog) -> Option<Vec<(usize, usize, String)>> {
    let placed = top.placed(group, catalog)?;
    let conditions = top.conditions();
    let mut renames = Vec::new();
    for (at, p) in placed.iter().enumerate().filter(|(_, p)| !p.table.is_reference()) {
        let Distribution::Hash { column, .. } = &p.table.distribution else { return None };
        let pinned = !top.assigned.contains(&column.as_str())
            && match &top.pins {
                Pins::Where(_) => (0..placed.len()).any(|other| {
                    (other == at || joined_on_keys(&conditions, at, other, &placed))
                        && pin_in_conditions(&conditions, other, &placed, context).is_some()
                }),
                Pins::Row(insert) => pin_in_row(insert, &p.table, column, context).is_some(),
            };
        if !pinned {
            return None;
        }
        renames.push(shard_rename(p.rv, &p.table, group.index, matches!(top.pins, Pins::Row(_)), body)?);
    }
    Some(renames)
}

/// Where the statement names `rv` (by its bare name), and the text that
/// names its shard of group `index` there instead, under the name written
/// unless the statement gave it an alias.
fn shard_rename(rv: &protobuf::RangeVar, table: &DistributedTable, index: u32, insert: bool, query: &str) -> Option<(usize, usize, String)> {
    let at = usize::try_from(rv.location).ok()?;
    let written = query.get(at..at + rv.relname.len())?;
    let bare = rv.schemaname.is_empty()
        && written.eq_ignore_ascii_case(&rv.relname)
        && !query[at + written.len()..].starts_with(|c: char| c.is_alphanumeric() || matches!(c, '_' | '$' | '.' | '"'));
    if !bare {
        return None;
    }
    let shard = table.qualified_shard_name(table.shards.get(index as usize)?);
    let name = match (&rv.alias, insert) {
        (Some(_), _) => shard,
        (None, true) => format!("{shard} AS {written}"),
        (None, false) => format!("{shard} {written}"),
    };
    Some((at, written.len(), name))
}

/// `text` (an error's, from a copy of a function co-located with `anchor`)
/// with the group's shard tables named as the function names them.
pub fn tables_named_again(text: &str, anchor: &DistributedTable, catalog: &Catalog) -> String {
    let mut out = text.to_string();
    for table in catalog.tables().filter(|t| t.colocation_id == anchor.colocation_id && t.has_worker_parent()) {
        let prefix = format!("{}.", quote_ident(&table.schema));
        if !out.contains(&prefix) {
            continue;
        }
        for shard in &table.shards {
            let qualified = table.qualified_shard_name(shard);
            if out.contains(&qualified) {
                let name = quote_ident(&table.name);
                out = out.replace(&format!("{qualified} AS {name}"), &name).replace(&format!("{qualified} {name}"), &name).replace(&qualified, &name);
            }
        }
    }
    out
}

/// Names a guard may read, unless a column of a table in the statement has
/// the name too.
struct Context<'a> {
    values: Values<'a>,
    columns: &'a HashSet<&'a str>,
}

enum Values<'a> {
    /// A PL/pgSQL function's variables (and arguments), constants, casts and
    /// array elements of these.
    Variables(&'a HashSet<String>),
    /// A SQL function's distribution argument alone.
    Argument(&'a Argument),
}

/// A SQL function's distribution argument: its name ("" when unnamed) and
/// its `$n`.
struct Argument {
    name: String,
    number: i32,
}

/// The statement's top-level tables and where their values are pinned.
struct TopLevel<'a> {
    tables: Vec<&'a protobuf::RangeVar>,
    pins: Pins<'a>,
    /// Columns an UPDATE sets: one that moves a row to another shard must
    /// go through the parent.
    assigned: Vec<&'a str>,
}

impl<'a> TopLevel<'a> {
    /// Its tables with the tables they name; None when one is neither the
    /// group's nor a reference table.
    fn placed(&self, group: &Group, catalog: &Catalog) -> Option<Vec<Placed<'a>>> {
        self.tables
            .iter()
            .map(|rv| match relation(rv, group, catalog) {
                Relation::InGroup(table) | Relation::Reference(table) => Some(Placed { rv, table }),
                Relation::Other => None,
            })
            .collect()
    }

    /// The conjuncts that may pin its tables (none for an INSERT's row).
    fn conditions(&self) -> Vec<&'a protobuf::Node> {
        match &self.pins {
            Pins::Where(conditions) => conditions.clone(),
            Pins::Row(_) => Vec::new(),
        }
    }
}

enum Pins<'a> {
    /// The conjuncts of the WHERE clause and of the inner joins' ON clauses.
    Where(Vec<&'a protobuf::Node>),
    Row(&'a protobuf::InsertStmt),
}

/// A top-level table reference and the table it names.
struct Placed<'a> {
    rv: &'a protobuf::RangeVar,
    table: Arc<DistributedTable>,
}

impl Placed<'_> {
    fn shown(&self) -> &str {
        self.rv.alias.as_ref().map_or(self.rv.relname.as_str(), |a| a.aliasname.as_str())
    }
}

/// The tables of a FROM or USING list of tables and inner joins of tables,
/// with the joins' ON conjuncts; None when it holds anything else.
fn from_list<'a>(items: &'a [protobuf::Node], tables: &mut Vec<&'a protobuf::RangeVar>, conditions: &mut Vec<&'a protobuf::Node>) -> Option<()> {
    for item in items {
        match item.node.as_ref()? {
            NodeEnum::RangeVar(rv) => tables.push(rv),
            NodeEnum::JoinExpr(j)
                if j.jointype == protobuf::JoinType::JoinInner as i32 && j.using_clause.is_empty() && !j.is_natural && j.alias.is_none() =>
            {
                from_list(std::slice::from_ref(j.larg.as_deref()?), tables, conditions)?;
                from_list(std::slice::from_ref(j.rarg.as_deref()?), tables, conditions)?;
                if let Some(on) = j.quals.as_deref() {
                    super::decorrelate::flatten_and(on, conditions);
                }
            }
            _ => return None,
        }
    }
    Some(())
}

fn top_level(node: &NodeEnum) -> Option<TopLevel<'_>> {
    let (first, from, condition, assigned) = match node {
        NodeEnum::SelectStmt(s) if s.with_clause.is_none() && s.larg.is_none() && s.values_lists.is_empty() => {
            (None, &s.from_clause, s.where_clause.as_deref(), vec![])
        }
        NodeEnum::UpdateStmt(u) if u.with_clause.is_none() => {
            let assigned = u
                .target_list
                .iter()
                .filter_map(|t| match t.node.as_ref() {
                    Some(NodeEnum::ResTarget(r)) => Some(r.name.as_str()),
                    _ => None,
                })
                .collect();
            (Some(u.relation.as_ref()?), &u.from_clause, u.where_clause.as_deref(), assigned)
        }
        NodeEnum::DeleteStmt(d) if d.with_clause.is_none() => (Some(d.relation.as_ref()?), &d.using_clause, d.where_clause.as_deref(), vec![]),
        NodeEnum::InsertStmt(i) if i.with_clause.is_none() && i.on_conflict_clause.is_none() => {
            return Some(TopLevel { tables: vec![i.relation.as_ref()?], pins: Pins::Row(i), assigned: vec![] })
        }
        _ => return None,
    };
    let mut tables: Vec<&protobuf::RangeVar> = first.into_iter().collect();
    let mut conditions = Vec::new();
    from_list(from, &mut tables, &mut conditions)?;
    if let Some(condition) = condition {
        super::decorrelate::flatten_and(condition, &mut conditions);
    }
    Some(TopLevel { tables, pins: Pins::Where(conditions), assigned })
}

/// The value the conditions pin the distribution column of `placed[at]`
/// to: one of its `column = value` conjuncts.
fn pin_in_conditions<'a>(conditions: &[&'a protobuf::Node], at: usize, placed: &[Placed], context: &Context) -> Option<&'a protobuf::Node> {
    conditions.iter().find_map(|c| {
        let (l, r) = equality(c)?;
        if names_key(l, at, placed) && is_pin(r, context) {
            Some(r)
        } else if names_key(r, at, placed) && is_pin(l, context) {
            Some(l)
        } else {
            None
        }
    })
}

/// Whether a conjunct equates the distribution columns of `placed[a]` and
/// `placed[b]` (co-located, so their rows share shard groups).
fn joined_on_keys(conditions: &[&protobuf::Node], a: usize, b: usize, placed: &[Placed]) -> bool {
    placed[b].table.colocation_id == placed[a].table.colocation_id
        && placed[b].table.has_worker_parent()
        && conditions.iter().any(|c| {
            equality(c)
                .is_some_and(|(l, r)| (names_key(l, a, placed) && names_key(r, b, placed)) || (names_key(l, b, placed) && names_key(r, a, placed)))
        })
}

/// Whether `node` names the distribution column of `placed[at]`: qualified
/// by the name it shows, or bare when no other table of the statement has
/// a column of that name.
fn names_key(node: &protobuf::Node, at: usize, placed: &[Placed]) -> bool {
    let Distribution::Hash { column, .. } = &placed[at].table.distribution else { return false };
    let Some(NodeEnum::ColumnRef(c)) = node.node.as_ref() else { return false };
    match qualified_name(&c.fields).as_slice() {
        [c] => c == column && placed.iter().enumerate().all(|(i, p)| i == at || !p.table.columns.iter().any(|other| other == c)),
        [t, c] => *t == placed[at].shown() && c == column,
        _ => false,
    }
}

/// The value a one-row INSERT gives `column`.
fn pin_in_row<'a>(insert: &'a protobuf::InsertStmt, table: &DistributedTable, column: &str, context: &Context) -> Option<&'a protobuf::Node> {
    let position = if insert.cols.is_empty() {
        table.columns.iter().position(|c| c == column)?
    } else {
        insert.cols.iter().position(|c| matches!(c.node.as_ref(), Some(NodeEnum::ResTarget(r)) if r.name == column))?
    };
    let Some(NodeEnum::SelectStmt(select)) = insert.select_stmt.as_deref()?.node.as_ref() else { return None };
    let [row] = select.values_lists.as_slice() else { return None };
    let Some(NodeEnum::List(values)) = row.node.as_ref() else { return None };
    values.items.get(position).filter(|v| is_pin(v, context))
}

/// A value the guard can compute before the statement runs, to the same
/// result: the function's variables and arguments, constants, casts and
/// array elements of those.
fn is_pin(node: &protobuf::Node, context: &Context) -> bool {
    let names_value = |s: &str| {
        !context.columns.contains(s)
            && match context.values {
                Values::Variables(variables) => variables.contains(s),
                Values::Argument(argument) => argument.name == s,
            }
    };
    match node.node.as_ref() {
        Some(NodeEnum::ColumnRef(c)) => match c.fields.as_slice() {
            [f] => matches!(f.node.as_ref(), Some(NodeEnum::String(s)) if names_value(&s.sval)),
            _ => false,
        },
        Some(NodeEnum::ParamRef(p)) => match context.values {
            Values::Variables(_) => true,
            Values::Argument(argument) => p.number == argument.number,
        },
        // A SQL function's copy may rely on its argument alone.
        _ if matches!(context.values, Values::Argument(_)) => false,
        Some(NodeEnum::AConst(a)) => !a.isnull,
        Some(NodeEnum::TypeCast(t)) => t.arg.as_deref().is_some_and(|a| is_pin(a, context)),
        Some(NodeEnum::AIndirection(i)) => {
            i.arg.as_deref().is_some_and(|a| is_pin(a, context))
                && i.indirection.iter().all(|x| matches!(x.node.as_ref(), Some(NodeEnum::AIndices(ix)) if !ix.is_slice && ix.lidx.is_none() && ix.uidx.as_deref().is_some_and(|u| is_pin(u, context))))
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Shards 100 … 103 of stock, 200 … 203 of orders, 300 of item.
    fn catalog() -> Catalog {
        crate::planner::tests::CatalogBuilder::new()
            .distributed("stock", &["s_w_id", "s_i_id", "s_quantity"], "s_w_id", 1)
            .distributed("orders", &["o_w_id", "o_id", "o_c_id"], "o_w_id", 1)
            .reference("item", &["i_id", "i_price"])
            .distributed("other", &["x_id", "x"], "x_id", 3)
            .build()
    }

    const FUNCTION: &str = "CREATE OR REPLACE FUNCTION public.f(p_w_id integer, p_ids integer[])
 RETURNS integer
 LANGUAGE plpgsql
AS $function$
DECLARE
  v int; n int;
BEGIN
  SELECT s_quantity INTO v FROM stock WHERE s_w_id = p_w_id AND s_i_id = 1;
  FOR i IN 1 .. 2 LOOP
    UPDATE stock SET s_quantity = s_quantity - 1
     WHERE s_i_id = i AND s_w_id = p_ids[i] RETURNING s_quantity INTO STRICT n;
  END LOOP;
  INSERT INTO orders (o_w_id, o_id, o_c_id) VALUES (p_w_id, v, n);
  SELECT i_price INTO v FROM item WHERE i_id = 1;
  SELECT count(*) INTO n FROM stock WHERE s_w_id = s_i_id;
  SELECT count(*) INTO n FROM other WHERE x_id = p_w_id;
  UPDATE stock SET s_w_id = 5 WHERE s_w_id = p_w_id;
  SELECT count(*) INTO n FROM orders o JOIN stock ON s_w_id = o.o_w_id WHERE o_w_id = p_w_id;
  SELECT count(*) INTO n FROM orders o LEFT JOIN stock ON s_w_id = o.o_w_id WHERE o_w_id = p_w_id;
  RETURN v;
END
$function$
";

    fn target<'a>(schema: &'a str, anchor: &'a DistributedTable, overloaded: &'a HashSet<String>) -> CopyTarget<'a> {
        CopyTarget { schema, anchor, index: 2, overloaded }
    }

    fn copy() -> String {
        let catalog = catalog();
        let anchor = catalog.table("public", "stock").unwrap().clone();
        copy_sql(FUNCTION, &target("tessera_shard_102_v9", &anchor, &HashSet::new()), 0, &catalog).unwrap().create
    }

    fn statement_lines(sql: &str) -> Vec<(u64, String)> {
        let json = pg_query::parse_plpgsql(sql).unwrap();
        let mut found = Vec::new();
        fn walk(v: &Value, found: &mut Vec<(u64, String)>) {
            match v {
                Value::Array(items) => items.iter().for_each(|i| walk(i, found)),
                Value::Object(map) => {
                    for (k, inner) in map {
                        if k.starts_with("PLpgSQL_stmt_") {
                            if let Some(line) = inner.get("lineno").and_then(Value::as_u64) {
                                found.push((line, k.clone()));
                            }
                        }
                        walk(inner, found);
                    }
                }
                _ => {}
            }
        }
        walk(&json, &mut found);
        found.sort();
        found
    }

    #[test]
    fn pinned_statements_run_on_the_groups_shards_behind_a_guard() {
        let sql = copy();
        assert!(sql.contains("FUNCTION tessera_shard_102_v9.f("), "{sql}");
        let guard = |table: &str, pin: &str| {
            format!("IF NOT ((CASE WHEN pg_catalog.pg_typeof({pin}) = 'integer'::pg_catalog.regtype THEN pg_catalog.satisfies_hash_partition('public.{table}'::pg_catalog.regclass, 4, 2, {pin}) ELSE false END)) THEN ")
        };
        // By the argument, and by an array element of it: the statement as
        // written on one line, then on the shards with its own lines.
        let by_argument = format!("{}SELECT s_quantity INTO v FROM stock WHERE s_w_id = p_w_id AND s_i_id = 1; ELSE SELECT s_quantity INTO v FROM public.stock_102 stock WHERE s_w_id = p_w_id AND s_i_id = 1; END IF;", guard("stock", "p_w_id"));
        assert!(sql.contains(&by_argument), "{sql}");
        let by_element = format!("{}UPDATE stock SET s_quantity = s_quantity - 1      WHERE s_i_id = i AND s_w_id = p_ids[i] RETURNING s_quantity INTO STRICT n; ELSE UPDATE public.stock_102 stock SET s_quantity = s_quantity - 1\n     WHERE", guard("stock", "p_ids[i]"));
        assert!(sql.contains(&by_element), "{sql}");
        assert!(
            sql.contains(&format!(
                "{}INSERT INTO orders (o_w_id, o_id, o_c_id) VALUES (p_w_id, v, n); ELSE INSERT INTO public.orders_202 AS orders (o_w_id",
                guard("orders", "p_w_id")
            )),
            "{sql}"
        );
        // A reference table, a column for a value, another group's table and
        // a moved key stay as written.
        // Joined on the key to a pinned table: pinned too (inner joins only).
        assert!(sql.contains("ELSE SELECT count(*) INTO n FROM public.orders_202 o JOIN public.stock_102 stock ON s_w_id = o.o_w_id WHERE o_w_id = p_w_id; END IF;"), "{sql}");
        assert_eq!(sql.matches("IF NOT ((CASE").count(), 4, "{sql}");
        assert!(!sql.contains("item_") && !sql.contains("other_"), "{sql}");
    }

    #[test]
    fn shard_tables_are_named_again_in_errors() {
        let catalog = catalog();
        let anchor = catalog.table("public", "stock").unwrap();
        let context =
            "SQL statement \"UPDATE public.stock_102 stock SET s_quantity = 1 / 0 FROM public.orders_202 o\"\nPL/pgSQL function f(integer) line 4";
        assert_eq!(
            tables_named_again(context, anchor, &catalog),
            "SQL statement \"UPDATE stock SET s_quantity = 1 / 0 FROM orders o\"\nPL/pgSQL function f(integer) line 4"
        );
    }

    #[test]
    fn every_statement_keeps_its_line() {
        let original: Vec<u64> = statement_lines(FUNCTION).into_iter().filter(|(_, k)| k != "PLpgSQL_stmt_if").map(|(l, _)| l).collect();
        let copied = statement_lines(&copy());
        let kept: Vec<u64> =
            copied.iter().filter(|(_, k)| k != "PLpgSQL_stmt_if").map(|(l, _)| *l).collect::<std::collections::BTreeSet<_>>().into_iter().collect();
        assert_eq!(original.iter().copied().collect::<std::collections::BTreeSet<_>>().into_iter().collect::<Vec<_>>(), kept);
    }

    #[test]
    fn a_name_that_may_be_a_column_is_no_value() {
        let catalog = catalog();
        let anchor = catalog.table("public", "stock").unwrap().clone();
        let ambiguous = FUNCTION.replace("v int; n int;", "v int; n int; s_i_id int;");
        let sql = copy_sql(&ambiguous, &target("s", &anchor, &HashSet::new()), 0, &catalog).unwrap().create;
        assert_eq!(sql.matches("IF NOT ((CASE").count(), 4, "{sql}");
        assert!(sql.contains("INTO n FROM stock WHERE s_w_id = s_i_id;\n"), "{sql}");
        let conflict = FUNCTION.replace("DECLARE", "#variable_conflict use_column\nDECLARE");
        assert!(!copy_sql(&conflict, &target("s", &anchor, &HashSet::new()), 0, &catalog).unwrap().create.contains("IF NOT"));
    }

    const BY_NAME: &str = "CREATE OR REPLACE FUNCTION public.by_name(p_w_id integer, p_c integer)
 RETURNS integer
 LANGUAGE sql
 STABLE
AS $function$
    SELECT o_id FROM orders WHERE o_w_id = p_w_id AND o_c_id = p_c
    OFFSET (SELECT count(*) / 2 FROM orders WHERE o_w_id = $1) LIMIT 1;
    SELECT count(*) FROM orders o JOIN stock ON s_w_id = o_w_id WHERE o_w_id = p_w_id;
    SELECT count(*) FROM orders WHERE o_w_id = 3;
    SELECT count(*) FROM orders WHERE o_w_id = p_w_id AND o_id IN (SELECT s_quantity FROM stock);
    UPDATE stock SET s_w_id = p_w_id WHERE s_w_id = p_w_id
$function$
";

    #[test]
    fn sql_functions_read_the_shards_where_pinned_to_the_distribution_argument() {
        let catalog = catalog();
        let anchor = catalog.table("public", "stock").unwrap().clone();
        let copy = copy_sql(BY_NAME, &target("s", &anchor, &HashSet::new()), 0, &catalog).unwrap();
        let sql = copy.create;
        assert!(sql.contains("FUNCTION s.by_name("), "{sql}");
        // By name and by `$1`, in the statement and in its subquery.
        assert!(sql.contains("SELECT o_id FROM public.orders_202 orders WHERE o_w_id = p_w_id AND o_c_id = p_c\n    OFFSET (SELECT count(*) / 2 FROM public.orders_202 orders WHERE o_w_id = $1) LIMIT 1;"), "{sql}");
        assert!(sql.contains("FROM public.orders_202 o JOIN public.stock_102 stock ON s_w_id = o_w_id WHERE"), "{sql}");
        // A constant, a subquery that is not pinned and a moved key: as written.
        assert!(sql.contains("SELECT count(*) FROM orders WHERE o_w_id = 3;"), "{sql}");
        assert!(sql.contains("FROM orders WHERE o_w_id = p_w_id AND o_id IN (SELECT s_quantity FROM stock);"), "{sql}");
        assert!(sql.contains("UPDATE stock SET s_w_id = p_w_id"), "{sql}");
        assert!(copy.calls.is_empty());
        // Pinned to another argument: as written.
        let other = copy_sql(BY_NAME, &target("s", &anchor, &HashSet::new()), 1, &catalog).unwrap().create;
        assert!(!other.contains("orders_202"), "{other}");
    }

    #[test]
    fn calls_of_the_groups_sql_functions_go_to_their_copies_behind_a_guard() {
        let mut catalog = catalog();
        let orders = catalog.table("public", "orders").unwrap().clone();
        let by_name = Arc::new(DistributedFunction {
            schema: "public".into(),
            name: "by_name".into(),
            arg_names: vec!["p_w_id".into(), "p_c".into()],
            defaults: 0,
            distribution: Some((0, orders.clone())),
            force_delegation: false,
            signature: "public.by_name(integer, integer)".into(),
            copied_per_shard: Some(CopiedLanguage::Sql),
        });
        catalog.add_function_for_tests(by_name.clone());
        let caller = FUNCTION.replace(
            "RETURN v;",
            "v := by_name(p_ids[1], v) + By_Name(s_i_id, 1) + public.by_name(p_w_id, 1);\n  IF by_name(p_w_id,\n 2) > 0 THEN RETURN v; END IF;",
        );
        let copy = copy_sql(&caller, &target("tessera_shard_102_v9", &orders, &HashSet::new()), 0, &catalog).unwrap();
        let guard = "(CASE WHEN pg_catalog.pg_typeof(p_ids[1]) = 'integer'::pg_catalog.regtype THEN pg_catalog.satisfies_hash_partition('public.orders'::pg_catalog.regclass, 4, 2, p_ids[1]) ELSE false END)";
        assert!(
            copy.create.contains(&format!(
                "v := (CASE WHEN {guard} THEN tessera_shard_102_v9.by_name(p_ids[1], v) ELSE by_name(p_ids[1], v) END) + By_Name(s_i_id, 1)"
            )),
            "{}",
            copy.create
        );
        // A column for the argument, a qualified name, a call over lines: as written.
        assert_eq!(copy.create.matches("tessera_shard_102_v9.by_name").count(), 1, "{}", copy.create);
        assert!(copy.calls.len() == 1 && Arc::ptr_eq(&copy.calls[0], &by_name));
        // A name another function on the node has too: as written.
        let overloaded = HashSet::from(["by_name".to_string()]);
        let copy = copy_sql(&caller, &target("tessera_shard_102_v9", &orders, &overloaded), 0, &catalog).unwrap();
        assert!(!copy.create.contains("tessera_shard_102_v9.by_name") && copy.calls.is_empty(), "{}", copy.create);
        let original: Vec<u64> = statement_lines(&caller).into_iter().filter(|(_, k)| k != "PLpgSQL_stmt_if").map(|(l, _)| l).collect();
        let copied: Vec<u64> = statement_lines(&copy.create).into_iter().filter(|(_, k)| k != "PLpgSQL_stmt_if").map(|(l, _)| l).collect();
        assert!(original.iter().all(|l| copied.contains(l)), "{original:?} {copied:?}");
    }

    #[test]
    fn copy_schemas_leave_the_names_the_client_called() {
        assert_eq!(
            without_copy_schemas("PL/pgSQL function tessera_shard_102_v9.f(integer) line 4 at SQL statement"),
            "PL/pgSQL function f(integer) line 4 at SQL statement"
        );
        assert_eq!(without_copy_schemas("schema \"tessera_shard_102_v9\" does not exist"), "schema \"tessera_shard_102_v9\" does not exist");
        assert_eq!(shard_id_named_in("function tessera_shard_102_v9.f(integer) does not exist"), Some(102));
    }
}
