//! What user code in the coordinator database does with distributed tables.
//! The coordinator database holds only empty shells of them, so a view, a
//! function, a procedure or a trigger there that reads or writes one would
//! see no rows or lose its writes. The snapshot lists such code, so that the
//! planner can expand the views into the queries that read them and refuse
//! to run the rest where it would be wrong.

use super::{int, Catalog, SYSTEM_SCHEMAS};
use crate::connection::PgConnection;
use crate::error::PgResult;
use pg_query::NodeEnum;
use serde_json::Value;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

#[derive(Clone, Debug, Default)]
pub struct UserCode {
    /// Views that read distributed tables, directly or through other views,
    /// by schema and name.
    views: HashMap<(String, String), Arc<View>>,
    /// Materialized views whose query reads distributed tables. Reading one
    /// reads its stored rows, a local table's; only its query (at CREATE
    /// and REFRESH) reaches the distributed tables.
    materialized: HashMap<(String, String), Arc<View>>,
    /// Functions and procedures whose bodies reach distributed tables, by
    /// name (any overload counts, as the call's arguments decide which runs).
    touching: HashMap<String, Touch>,
    /// Local tables with triggers whose functions reach distributed tables.
    triggered: HashMap<(String, String), Touch>,
    /// Functions that reach distributed tables and can take the place of
    /// their calls, by name (only names no other function has).
    inlinable: HashMap<String, Arc<InlineSql>>,
}

/// A LANGUAGE sql function simple enough to put in place of its calls, as
/// PostgreSQL's planner inlines such functions: one SELECT computing one
/// value, no settings of its own, no defaults, not SECURITY DEFINER.
#[derive(Debug)]
pub struct InlineSql {
    pub name: String,
    pub signature: String,
    /// Each argument's name ("" when it has none) and type.
    pub args: Vec<(String, String)>,
    pub return_type: String,
    pub strict: bool,
    /// The body, a SelectStmt.
    pub body: NodeEnum,
}

#[derive(Debug)]
pub struct View {
    pub oid: u32,
    pub schema: String,
    pub name: String,
    /// Created WITH CHECK OPTION.
    pub check_option: bool,
    /// Its query as the coordinator database prints it, every relation
    /// qualified with its schema.
    pub query: NodeEnum,
}

/// A view of the coordinator database, and what its rule uses (oids).
struct CandidateView {
    oid: u32,
    schema: String,
    name: String,
    materialized: bool,
    check_option: bool,
    /// Parsed only for the views that reach distributed tables.
    definition: String,
    relations: Vec<u32>,
    functions: Vec<u32>,
}

/// A function that reaches distributed tables, and how.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Touch {
    /// Its signature, `order_count(integer)`.
    pub function: String,
    /// What it reaches: `the distributed table "orders"`, `dynamic SQL`, …
    pub reaches: String,
    /// A relation its body names that only the coordinator database has (a
    /// local table, or a view the workers do not get): the function cannot
    /// run on a worker either.
    pub local: Option<String>,
}

impl UserCode {
    pub fn is_empty(&self) -> bool {
        self.views.is_empty() && self.touching.is_empty() && self.triggered.is_empty()
    }
    pub fn has_inlinable(&self) -> bool {
        !self.inlinable.is_empty()
    }
    /// A view over distributed tables, the way `Catalog::resolve` finds tables.
    pub fn view(&self, schema: Option<&str>, name: &str) -> Option<&Arc<View>> {
        if self.views.is_empty() {
            return None;
        }
        self.views.get(&(schema.unwrap_or("public").to_string(), name.to_string()))
    }
    /// A materialized view whose query reads distributed tables.
    pub fn materialized_view(&self, schema: Option<&str>, name: &str) -> Option<&Arc<View>> {
        self.materialized.get(&(schema.unwrap_or("public").to_string(), name.to_string()))
    }
    pub fn has_views(&self) -> bool {
        !self.views.is_empty()
    }
    /// Names of the views, materialized views and tables with triggers listed.
    pub fn relation_names(&self) -> impl Iterator<Item = &str> {
        self.views.keys().chain(self.materialized.keys()).chain(self.triggered.keys()).map(|(_, name)| name.as_str())
    }
    /// Whether some view over distributed tables has this name, in any schema.
    pub fn is_view_name(&self, name: &str) -> bool {
        self.views.keys().any(|(_, n)| n == name)
    }
    /// The function called `name` (unqualified, as PostgreSQL folds it) when
    /// it reaches distributed tables.
    pub fn touching(&self, name: &str) -> Option<&Touch> {
        self.touching.get(name)
    }
    pub fn touching_names(&self) -> impl Iterator<Item = &str> {
        self.touching.keys().map(String::as_str)
    }
    /// The function called `name` when it reaches distributed tables and
    /// can be put in place of its calls.
    pub fn inlinable(&self, name: &str) -> Option<&Arc<InlineSql>> {
        self.inlinable.get(name)
    }
    pub fn inlinable_names(&self) -> impl Iterator<Item = &str> {
        self.inlinable.keys().map(String::as_str)
    }
    /// The trigger function that reaches distributed tables when the local
    /// table `schema.name` is written.
    pub fn trigger_on(&self, schema: Option<&str>, name: &str) -> Option<&Touch> {
        if self.triggered.is_empty() {
            return None;
        }
        self.triggered.get(&(schema.unwrap_or("public").to_string(), name.to_string()))
    }

    /// What a body that uses `body` reaches, if it reaches distributed tables
    /// (the tables of `catalog`, these views, or functions that do).
    pub fn reached_by(&self, body: &BodyUse, catalog: &Catalog) -> Option<String> {
        if let Some(r) = body.relations.iter().find(|r| catalog.may_name_distributed(r)) {
            return Some(format!("the distributed table \"{r}\""));
        }
        if let Some(r) = body.relations.iter().find(|r| self.is_view_name(r)) {
            return Some(format!("the view \"{r}\", which reads distributed tables"));
        }
        if let Some(t) = body.calls.iter().find_map(|c| self.touching.get(c)) {
            return Some(format!("the function {}, which reaches {}", t.function, t.reaches));
        }
        body.dynamic.then(|| "dynamic SQL, which Tessera cannot analyse".to_string())
    }
}

/// The relations a body names and the functions it calls (unqualified
/// names), and whether it runs SQL that is only known when it runs.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct BodyUse {
    pub relations: Vec<String>,
    pub calls: Vec<String>,
    pub dynamic: bool,
}

impl BodyUse {
    /// Adds what the SQL text `sql` uses; text that does not parse counts as
    /// dynamic, since nothing can be said about it.
    fn add_sql(&mut self, sql: &str) {
        match pg_query::parse(sql) {
            Ok(parsed) => {
                let last = |name: String| name.rsplit('.').next().unwrap_or_default().to_string();
                self.relations.extend(parsed.tables().into_iter().map(last));
                self.calls.extend(parsed.functions().into_iter().map(last));
                // pg_query's lists leave out what its walker skips (sampled
                // tables, calls under an indirection, …); ours does not.
                for stmt in parsed.protobuf.stmts.iter().filter_map(|s| s.stmt.as_ref()?.node.as_ref()) {
                    self.relations.extend(crate::walk::range_vars(stmt).into_iter().map(|rv| rv.relname));
                    self.calls.extend(crate::walk::called_functions(stmt));
                }
                for names in [&mut self.relations, &mut self.calls] {
                    names.sort();
                    names.dedup();
                }
            }
            Err(_) => self.dynamic = true,
        }
    }
}

/// What the body of a LANGUAGE sql function uses.
pub fn sql_body_use(body: &str) -> BodyUse {
    let mut used = BodyUse::default();
    used.add_sql(body);
    used
}

/// What a PL/pgSQL function uses, from its whole CREATE FUNCTION statement
/// (a DO block's body can be wrapped in one).
pub fn plpgsql_body_use(create_function: &str) -> BodyUse {
    let mut used = BodyUse::default();
    match pg_query::parse_plpgsql(create_function) {
        Ok(tree) => visit_plpgsql(&tree, &mut used),
        Err(_) => used.dynamic = true,
    }
    used
}

/// Statement kinds whose `query` is SQL text computed at run time (other
/// kinds name theirs `dynquery`).
const DYNAMIC_STATEMENTS: [&str; 2] = ["PLpgSQL_stmt_dynexecute", "PLpgSQL_stmt_dynfors"];

fn visit_plpgsql(value: &Value, used: &mut BodyUse) {
    match value {
        Value::Array(items) => items.iter().for_each(|v| visit_plpgsql(v, used)),
        Value::Object(fields) => {
            for (key, v) in fields {
                if key == "PLpgSQL_expr" {
                    if let Some(text) = v.get("query").and_then(Value::as_str) {
                        expression(text, used);
                    }
                } else if key == "dynquery" {
                    dynamic_expression(v, used);
                } else if let (true, Value::Object(stmt)) = (DYNAMIC_STATEMENTS.contains(&key.as_str()), v) {
                    for (part, child) in stmt {
                        if part == "query" {
                            dynamic_expression(child, used);
                        } else {
                            visit_plpgsql(child, used);
                        }
                    }
                } else {
                    visit_plpgsql(v, used);
                }
            }
        }
        _ => {}
    }
}

fn dynamic_expression(expr: &Value, used: &mut BodyUse) {
    match expr.get("PLpgSQL_expr").and_then(|e| e.get("query")).and_then(Value::as_str) {
        Some(text) => dynamic_sql(text, used),
        None => used.dynamic = true,
    }
}

/// A PL/pgSQL expression or statement: SQL as it is, or an expression that
/// PostgreSQL runs as `SELECT <expr>` (an assignment's after `:=`).
fn expression(text: &str, used: &mut BodyUse) {
    if pg_query::parse(text).is_ok() {
        used.add_sql(text);
        return;
    }
    let value = text.split_once(":=").map_or(text, |(_, v)| v);
    used.add_sql(&format!("SELECT {value}"));
}

/// The SQL an EXECUTE runs: known when it is one string constant, else
/// dynamic.
fn dynamic_sql(text: &str, used: &mut BodyUse) {
    let constant = pg_query::parse(&format!("SELECT {text}")).ok().and_then(|parsed| {
        let stmt = parsed.protobuf.stmts.into_iter().next()?.stmt?.node?;
        let NodeEnum::SelectStmt(select) = stmt else { return None };
        let [target] = select.target_list.as_slice() else { return None };
        let Some(NodeEnum::ResTarget(r)) = target.node.as_ref() else { return None };
        match r.val.as_deref()?.node.as_ref()? {
            NodeEnum::AConst(c) => match c.val.as_ref()? {
                pg_query::protobuf::a_const::Val::Sval(s) => Some(s.sval.clone()),
                _ => None,
            },
            _ => None,
        }
    });
    match constant {
        Some(sql) => used.add_sql(&sql),
        None => used.dynamic = true,
    }
}

/// Reads which views and functions of the coordinator database reach the
/// distributed tables of `catalog`.
pub(super) async fn load(conn: &mut PgConnection, catalog: &Catalog) -> PgResult<UserCode> {
    let mut code = UserCode::default();
    // Every user view, with the relations and functions its rule uses: which
    // of them reach distributed tables is found below, with the functions.
    let views: Vec<CandidateView> = conn
        .query(&format!(
            "SELECT c.oid, n.nspname, c.relname, c.relkind = 'm', pg_catalog.tessera_view_definition(c.oid),
                    EXISTS (SELECT FROM unnest(c.reloptions) o WHERE o LIKE 'check\\_option=%'),
                    (SELECT json_agg(d.refobjid::bigint) FROM pg_rewrite r JOIN pg_depend d ON d.classid = 'pg_rewrite'::regclass AND d.objid = r.oid
                      WHERE r.ev_class = c.oid AND d.refclassid = 'pg_class'::regclass AND d.refobjid <> c.oid),
                    (SELECT json_agg(d.refobjid::bigint) FROM pg_rewrite r JOIN pg_depend d ON d.classid = 'pg_rewrite'::regclass AND d.objid = r.oid
                      WHERE r.ev_class = c.oid AND d.refclassid = 'pg_proc'::regclass AND d.refobjid >= 16384)
             FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
             WHERE c.relkind IN ('v', 'm') AND n.nspname NOT IN {SYSTEM_SCHEMAS} AND (n.nspname NOT LIKE 'pg\\_%' OR n.nspname LIKE 'pg\\_temp\\_%')"
        ))
        .await?
        .into_iter()
        .filter_map(|r| {
            Some(CandidateView {
                oid: int(&r[0]),
                schema: r[1].clone()?,
                name: r[2].clone()?,
                materialized: r[3].as_deref() == Some("t"),
                check_option: r[5].as_deref() == Some("t"),
                definition: r[4].clone()?,
                relations: serde_json::from_str(r[6].as_deref().unwrap_or("[]")).unwrap_or_default(),
                functions: serde_json::from_str(r[7].as_deref().unwrap_or("[]")).unwrap_or_default(),
            })
        })
        .collect();
    // Extension members and C functions are not user code; SQL-standard
    // bodies (BEGIN ATOMIC) have their references in pg_depend.
    let functions = conn
        .query(&format!(
            "SELECT p.proname, p.oid::regprocedure::text, l.lanname, p.prosrc,
                    CASE WHEN l.lanname = 'plpgsql' THEN pg_get_functiondef(p.oid) END,
                    p.prosqlbody IS NOT NULL,
                    (SELECT json_agg(c.relname) FROM pg_depend d JOIN pg_class c ON c.oid = d.refobjid
                      WHERE d.classid = 'pg_proc'::regclass AND d.objid = p.oid AND d.refclassid = 'pg_class'::regclass AND d.deptype = 'n'),
                    (SELECT json_agg(q.proname) FROM pg_depend d JOIN pg_proc q ON q.oid = d.refobjid
                      WHERE d.classid = 'pg_proc'::regclass AND d.objid = p.oid AND d.refclassid = 'pg_proc'::regclass AND d.deptype = 'n'),
                    p.oid,
                    l.lanname = 'sql' AND p.prokind = 'f' AND NOT p.proretset AND NOT p.prosecdef AND p.proconfig IS NULL
                      AND p.pronargdefaults = 0 AND p.proallargtypes IS NULL AND p.prosqlbody IS NULL,
                    p.proisstrict, format_type(p.prorettype, NULL),
                    (SELECT json_agg(json_build_array(coalesce(p.proargnames[a.i], ''), format_type(a.t, NULL)) ORDER BY a.i)
                       FROM unnest(p.proargtypes::oid[]) WITH ORDINALITY AS a(t, i))
             FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace JOIN pg_language l ON l.oid = p.prolang
             WHERE n.nspname NOT IN {SYSTEM_SCHEMAS} AND n.nspname NOT LIKE 'pg\\_%'
               AND l.lanname NOT IN ('c', 'internal') AND p.prokind IN ('f', 'p')
               AND NOT EXISTS (SELECT FROM pg_depend e WHERE e.classid = 'pg_proc'::regclass AND e.objid = p.oid AND e.deptype = 'e')"
        ))
        .await?;
    let mut uses: Vec<(String, String, u32, BodyUse)> = Vec::new();
    let mut candidates: Vec<(String, u32, Arc<InlineSql>)> = Vec::new();
    for r in functions {
        let (Some(name), Some(signature), Some(language)) = (r[0].clone(), r[1].clone(), r[2].as_deref()) else { continue };
        let body = match language {
            _ if r[5].as_deref() == Some("t") => BodyUse {
                relations: serde_json::from_str(r[6].as_deref().unwrap_or("[]")).unwrap_or_default(),
                calls: serde_json::from_str(r[7].as_deref().unwrap_or("[]")).unwrap_or_default(),
                dynamic: false,
            },
            "sql" => sql_body_use(r[3].as_deref().unwrap_or_default()),
            "plpgsql" => plpgsql_body_use(r[4].as_deref().unwrap_or_default()),
            // Other procedural languages reach tables through their own SPI
            // calls, which only running them would show.
            _ => BodyUse { dynamic: true, ..Default::default() },
        };
        // A function that calls itself cannot take its calls' place.
        if r[9].as_deref() == Some("t") && !body.calls.contains(&name) {
            if let Some(inline) = inline_sql(&name, &signature, &r) {
                candidates.push((name.clone(), int(&r[8]), Arc::new(inline)));
            }
        }
        uses.push((name, signature, int(&r[8]), body));
    }
    // A function reaches what the functions and views it uses reach, and a
    // view what its relations and functions reach: repeat until no more
    // are found.
    let mut by_oid: HashMap<u32, Touch> = HashMap::new();
    let mut reaching_views: HashSet<u32> = HashSet::new();
    let mut materialized: HashSet<u32> = HashSet::new();
    let distributed: HashSet<u32> = catalog.tables().map(|t| t.oid).collect();
    loop {
        let mut found = false;
        for candidate in &views {
            if reaching_views.contains(&candidate.oid) || materialized.contains(&candidate.oid) {
                continue;
            }
            let reaches = candidate.relations.iter().any(|r| distributed.contains(r) || reaching_views.contains(r))
                || candidate.functions.iter().any(|f| by_oid.contains_key(f));
            if reaches {
                // What reads a materialized view reads its stored rows.
                if candidate.materialized { &mut materialized } else { &mut reaching_views }.insert(candidate.oid);
                let query = pg_query::parse(&candidate.definition).ok().and_then(|p| p.protobuf.stmts.into_iter().next()?.stmt?.node);
                if let Some(query) = query {
                    let view = View {
                        oid: candidate.oid,
                        schema: candidate.schema.clone(),
                        name: candidate.name.clone(),
                        check_option: candidate.check_option,
                        query,
                    };
                    let kind = if candidate.materialized { &mut code.materialized } else { &mut code.views };
                    kind.insert((candidate.schema.clone(), candidate.name.clone()), Arc::new(view));
                }
                found |= !candidate.materialized;
            }
        }
        for (name, signature, oid, body) in &uses {
            if by_oid.contains_key(oid) {
                continue;
            }
            if let Some(reaches) = code.reached_by(body, catalog) {
                let touch = Touch { function: signature.clone(), reaches, local: None };
                code.touching.entry(name.clone()).or_insert_with(|| touch.clone());
                by_oid.insert(*oid, touch);
                found = true;
            }
        }
        if !found {
            break;
        }
    }
    if by_oid.is_empty() {
        return Ok(code);
    }
    let local: HashSet<String> = conn
        .query(&format!(
            "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
             WHERE c.relkind IN ('r', 'p', 'v', 'm', 'f') AND n.nspname NOT IN {SYSTEM_SCHEMAS} AND n.nspname NOT LIKE 'pg\\_%'"
        ))
        .await?
        .into_iter()
        .filter_map(|r| r.into_iter().next().flatten())
        .filter(|name| !catalog.may_name_distributed(name) && !code.is_view_name(name))
        .collect();
    for (name, _, oid, body) in &uses {
        let Some(found) = body.relations.iter().find(|r| local.contains(*r)) else { continue };
        if let Some(touch) = by_oid.get_mut(oid) {
            touch.local = Some(found.clone());
        }
        if let Some(touch) = code.touching.get_mut(name) {
            touch.local.get_or_insert_with(|| found.clone());
        }
    }
    for (name, oid, inline) in candidates {
        if by_oid.contains_key(&oid) && uses.iter().filter(|(n, ..)| *n == name).count() == 1 {
            code.inlinable.insert(name, inline);
        }
    }
    for r in conn
        .query(
            "SELECT DISTINCT c.oid, n.nspname, c.relname, t.tgfoid FROM pg_trigger t
             JOIN pg_class c ON c.oid = t.tgrelid JOIN pg_namespace n ON n.oid = c.relnamespace
             WHERE NOT t.tgisinternal",
        )
        .await?
    {
        let (table, schema, name, function): (u32, Option<String>, Option<String>, u32) = (int(&r[0]), r[1].clone(), r[2].clone(), int(&r[3]));
        if distributed.contains(&table) {
            continue;
        }
        if let (Some(schema), Some(name), Some(touch)) = (schema, name, by_oid.get(&function)) {
            code.triggered.insert((schema, name), touch.clone());
        }
    }
    Ok(code)
}

/// A LANGUAGE sql function's row from the query above, when its body is
/// one SELECT.
fn inline_sql(name: &str, signature: &str, r: &[Option<String>]) -> Option<InlineSql> {
    let parsed = pg_query::parse(r[3].as_deref()?).ok()?;
    let [stmt] = parsed.protobuf.stmts.as_slice() else { return None };
    let body = stmt.stmt.as_ref()?.node.clone()?;
    if !matches!(body, NodeEnum::SelectStmt(_)) {
        return None;
    }
    let args: Vec<(String, String)> = serde_json::from_str(r[12].as_deref().unwrap_or("[]")).ok()?;
    Some(InlineSql {
        name: name.to_string(),
        signature: signature.to_string(),
        args,
        return_type: r[11].clone()?,
        strict: r[10].as_deref() == Some("t"),
        body,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wrap(body: &str) -> String {
        format!("CREATE FUNCTION f(cid int) RETURNS bigint LANGUAGE plpgsql AS $fn$ {body} $fn$")
    }

    #[test]
    fn plpgsql_bodies() {
        let used = plpgsql_body_use(&wrap(
            "DECLARE n bigint; r record; BEGIN
               n := (SELECT count(*) FROM orders WHERE customer_id = cid);
               SELECT count(*) INTO n FROM items;
               PERFORM audit(1);
               FOR r IN SELECT * FROM lines LOOP n := n + helper(r.x); END LOOP;
               IF n > limit_of(cid) THEN RETURN n; END IF;
               EXECUTE 'DELETE FROM stale';
               RETURN n;
             END",
        ));
        let mut relations = used.relations.clone();
        relations.sort();
        assert_eq!(relations, ["items", "lines", "orders", "stale"]);
        for call in ["audit", "helper", "limit_of"] {
            assert!(used.calls.iter().any(|c| c == call), "{call} in {:?}", used.calls);
        }
        assert!(!used.dynamic);
    }

    #[test]
    fn dynamic_sql_is_unknown() {
        assert!(plpgsql_body_use(&wrap("BEGIN EXECUTE format('SELECT count(*) FROM %I', 'x'); RETURN 1; END")).dynamic);
        assert!(plpgsql_body_use(&wrap("DECLARE r record; BEGIN FOR r IN EXECUTE 'SELECT ' || cid LOOP END LOOP; RETURN 1; END")).dynamic);
        assert!(!plpgsql_body_use(&wrap("BEGIN RETURN cid + 1; END")).dynamic);
    }

    #[test]
    fn sql_bodies() {
        let mut used = sql_body_use("SELECT count(*) FROM app.orders o JOIN items i USING (id) WHERE o.x = helper($1)");
        used.relations.sort();
        assert_eq!(used.relations, ["items", "orders"]);
        assert!(used.calls.iter().any(|c| c == "helper"));
        assert!(sql_body_use("this is not SQL").dynamic);
        // pg_query's own list of tables leaves out sampled ones.
        assert_eq!(sql_body_use("SELECT l.id FROM lt l TABLESAMPLE system (100) WHERE l.id < (SELECT count(*) FROM r)").relations.len(), 2);
        assert!(sql_body_use("SELECT to_json(r) FROM (SELECT (stats(12)).n) r").calls.iter().any(|c| c == "stats"));
    }
}
