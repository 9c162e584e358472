//! The distribution catalog: its tables in the coordinator database, and the
//! immutable in-memory snapshot of them that the query path reads without locks.
//! A change anywhere (this process, another coordinator process, a manual UPDATE)
//! bumps `tessera.catalog_version`, records which distributed tables it touched
//! in `tessera.catalog_changes`, and notifies `tessera_catalog`; a listener task
//! then reads those tables again into a fresh snapshot and swaps it in atomically.

use crate::config::ServerAddr;
use crate::connection::{quote_ident, PgConnection};
use crate::error::{sqlstate, PgError, PgResult};
use crate::hash::HashType;
use arc_swap::ArcSwap;
use std::collections::HashMap;
use std::sync::Arc;

pub mod user_code;

pub const SCHEMA_SQL: &str = include_str!("schema.sql");

/// Schemas that hold no user objects, or only Tessera's own (schema.sql),
/// as an SQL list; names starting `pg_` are PostgreSQL's too.
pub const SYSTEM_SCHEMAS: &str = "('pg_catalog', 'information_schema', 'tessera', 'tessera_fallback', 'tessera_lent', 'tessera_commit')";

/// Lets this transaction write distributed tables' shells, which their
/// guard triggers refuse otherwise (schema.sql, `tessera.refuse_shell_write`).
pub const ALLOW_SHELL_WRITES: &str = "SET LOCAL tessera.shell_writes = on";

/// Creates or upgrades the catalog, with its user-facing names (`pg_dist_node`,
/// `citus_shards`, the cluster functions) in pg_catalog as Citus has them,
/// and the objects deciding two-phase commits (`deciding_objects_sql`).
pub async fn install(conn: &mut PgConnection, deciding_objects_sql: &str) -> PgResult<()> {
    // Concurrent first starts of several coordinator processes must not race.
    conn.execute("SELECT pg_advisory_lock(7482910)").await?;
    let type_oids: Vec<String> = crate::hash::distributable_type_oids().map(|oid| oid.to_string()).collect();
    let schema = SCHEMA_SQL.replace("@TESSERA_VERSION@", env!("CARGO_PKG_VERSION")).replace("@DISTRIBUTABLE_TYPE_OIDS@", &type_oids.join(", "));
    // The commit records of the transactions this database decides
    // (`transaction::decided`) live in a schema of their own, as on workers.
    let result = conn
        .execute(&format!(
            "{schema}\n{}\n{}\nGRANT EXECUTE ON FUNCTION tessera.forget_roles(text[]) TO PUBLIC;\n{}",
            link_security_function("tessera"),
            forget_roles_function("tessera"),
            deciding_objects_sql
        ))
        .await;
    conn.execute("SELECT pg_advisory_unlock(7482910)").await?;
    result.map(|_| ())
}

/// SQL making `<schema>.forget_roles(text[])`, which drops the user mappings
/// on the `tessera_node_*` foreign servers of roles about to be dropped (DROP
/// ROLE refuses while a role has any). The coordinator database has such
/// servers for the fallback tier, every worker for its worker-side relations.
/// Only a caller that may drop roles gets anything done.
pub fn forget_roles_function(schema: &str) -> String {
    format!(
        "CREATE OR REPLACE FUNCTION {schema}.forget_roles(roles text[]) RETURNS void LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $tessera$
         DECLARE m record;
         BEGIN
           IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = session_user AND (rolsuper OR rolcreaterole)) THEN
             RETURN;
           END IF;
           FOR m IN SELECT srvname, usename FROM pg_user_mappings WHERE usename = ANY (roles) AND srvname LIKE 'tessera\\_node\\_%' LOOP
             EXECUTE format('DROP USER MAPPING FOR %I SERVER %I', m.usename, m.srvname);
           END LOOP;
         END $tessera$;"
    )
}

/// SQL making the functions by which a node's own connections to other
/// nodes (postgres_fdw servers and user mappings, `psql` pulling rows, a
/// shard move's subscription) log in when the cluster has a CA: the
/// coordinator stores the CA's certificate and each role's certificate
/// under the node's data directory (`connection::node_tls`).
/// `<schema>.link_security(role)` gives the libpq options (TLS verified
/// against the CA, the role's certificate), none where nothing is stored;
/// `<schema>.link_conninfo(host, port, dbname, role)` a whole connection
/// string; `<schema>.secure_servers()` gives the `tessera_node_*` foreign
/// servers the options that are not per role.
pub fn link_security_function(schema: &str) -> String {
    format!(
        r#"CREATE OR REPLACE FUNCTION {schema}.link_security(role text) RETURNS TABLE (option text, value text) LANGUAGE plpgsql SET search_path = pg_catalog AS $tessera$
         DECLARE
           dir text := current_setting('data_directory') || '/{directory}';
           stem text := encode(convert_to(role, 'UTF8'), 'hex');
         BEGIN
           IF (pg_stat_file(dir || '/root.crt', true)).size IS NOT NULL THEN
             RETURN QUERY VALUES ('sslmode', 'verify-full'), ('sslrootcert', dir || '/root.crt'),
                                 ('sslcert', dir || '/' || stem || '.crt'), ('sslkey', dir || '/' || stem || '.key');
           END IF;
         END $tessera$;
         REVOKE ALL ON FUNCTION {schema}.link_security(text) FROM PUBLIC;
         CREATE OR REPLACE FUNCTION {schema}.link_conninfo(host text, port integer, dbname text, role text) RETURNS text LANGUAGE sql SET search_path = pg_catalog AS $tessera$
           SELECT string_agg(o.option || '=''' || replace(replace(o.value, E'\\', E'\\\\'), '''', E'\\''') || '''', ' ')
             FROM (VALUES ('host', host), ('port', port::text), ('dbname', dbname), ('user', role)
                   UNION ALL SELECT * FROM {schema}.link_security(role)) AS o (option, value)
         $tessera$;
         REVOKE ALL ON FUNCTION {schema}.link_conninfo(text, integer, text, text) FROM PUBLIC;
         CREATE OR REPLACE FUNCTION {schema}.secure_servers() RETURNS void LANGUAGE plpgsql SET search_path = pg_catalog AS $tessera$
         DECLARE s record; o record;
         BEGIN
           FOR s IN SELECT srvname, coalesce(srvoptions, '{{}}') AS options FROM pg_foreign_server WHERE srvname LIKE 'tessera\_node\_%' LOOP
             FOR o IN SELECT * FROM {schema}.link_security(current_user) l WHERE l.option IN ('sslmode', 'sslrootcert') LOOP
               IF NOT (o.option || '=' || o.value = ANY (s.options)) THEN
                 EXECUTE format('ALTER SERVER %I OPTIONS (%s %I %L)', s.srvname,
                                CASE WHEN EXISTS (SELECT FROM unnest(s.options) x WHERE x LIKE o.option || '=%') THEN 'SET' ELSE 'ADD' END, o.option, o.value);
               END IF;
             END LOOP;
           END LOOP;
         END $tessera$;
         REVOKE ALL ON FUNCTION {schema}.secure_servers() FROM PUBLIC;"#,
        directory = crate::connection::node_tls::CERTIFICATE_DIRECTORY,
    )
}

/// Calls `<schema>.forget_roles` for `roles` where it exists (a worker not
/// prepared for worker-side relations lacks it).
pub fn forget_roles_sql(schema: &str, roles: &[String]) -> String {
    format!(
        "DO $tessera$ BEGIN IF to_regprocedure('{schema}.forget_roles(text[])') IS NOT NULL THEN PERFORM {schema}.forget_roles({}); END IF; END $tessera$",
        crate::connection::text_array(roles)
    )
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Node {
    pub id: i32,
    pub group_id: i32,
    pub addr: ServerAddr,
    pub active: bool,
    /// New shard groups may be placed on it (`citus_set_node_property(…,
    /// 'shouldhaveshards', …)`); the rebalancer empties it otherwise.
    pub should_have_shards: bool,
    /// The node's oids of user-defined types, for its results.
    pub type_oids: Arc<TypeOids>,
}

impl Node {
    /// The error of a statement that needs the node while it is disabled
    /// (`citus_disable_node`).
    pub fn disabled_error(&self) -> PgError {
        PgError::new(sqlstate::OBJECT_NOT_IN_PREREQUISITE_STATE, format!("node {} is disabled", self.addr)).with_hint(format!(
            "The statement needs shards on it. Bring the node back with SELECT citus_activate_node('{}', {}).",
            self.addr.host, self.addr.port
        ))
    }
}

/// The first oid PostgreSQL gives objects created after initdb; below it,
/// every node's built-in types share their oids.
pub const FIRST_USER_OID: u32 = 16384;

/// A node's oids of the user-defined types (enums, domains, extension types …)
/// it shares with the coordinator database, mapped to that database's oids.
/// Each server numbers the types it creates itself, so a type's oid differs
/// across nodes; clients know the coordinator database's, which they describe
/// and look up.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct TypeOids(HashMap<u32, u32>);

impl TypeOids {
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
    /// The coordinator database's oid for the node's type `oid`.
    pub fn to_coordinator(&self, oid: u32) -> Option<u32> {
        self.0.get(&oid).copied()
    }
}

/// SQL listing a server's user-defined types by name: not the row types of
/// tables and views (nor their arrays), which each server has of its own
/// relations (shards on the workers, shells and views here).
const USER_TYPES_SQL: &str = "SELECT t.oid, format_type(t.oid, NULL) FROM pg_type t
     WHERE t.oid >= 16384
       AND NOT EXISTS (SELECT FROM pg_class c WHERE c.oid = t.typrelid AND c.relkind <> 'c')
       AND NOT EXISTS (SELECT FROM pg_type e JOIN pg_class c ON c.oid = e.typrelid WHERE e.oid = t.typelem AND c.relkind <> 'c')";

/// Maps each active node's user-defined type oids to the coordinator
/// database's. A node that cannot be reached keeps an empty map (its results
/// then carry its own oids) and is named in the log. When the coordinator
/// database's types are those `previous` knew, its nodes' maps are kept
/// (a reload after a view or function changed asks no node).
async fn load_type_oids(catalog: &mut Catalog, coordinator_db: &mut PgConnection, login: &crate::config::Login, previous: &Catalog) -> PgResult<()> {
    let by_name: HashMap<String, u32> =
        coordinator_db.query(USER_TYPES_SQL).await?.into_iter().filter_map(|r| Some((r[1].clone()?, int(&r[0])))).collect();
    if by_name.is_empty() {
        return Ok(());
    }
    let unchanged = by_name == *previous.user_types;
    catalog.user_types = Arc::new(by_name);
    let by_name = catalog.user_types.clone();
    for node in catalog.nodes.iter_mut().filter(|n| n.active) {
        if let Some(known) =
            previous.nodes.iter().find(|p| unchanged && p.active && p.group_id == node.group_id && p.addr == node.addr && !p.type_oids.is_empty())
        {
            node.type_oids = known.type_oids.clone();
            continue;
        }
        match PgConnection::query_once(&node.addr, login, USER_TYPES_SQL).await {
            Ok(rows) => {
                let map = rows.into_iter().filter_map(|r| Some((int(&r[0]), *by_name.get(r[1].as_deref()?)?))).collect();
                node.type_oids = Arc::new(TypeOids(map));
            }
            Err(e) => {
                tracing::warn!("could not read the user-defined types of node {}: {}", node.addr, e.message());
                catalog.type_oids_incomplete = true;
            }
        }
    }
    Ok(())
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Distribution {
    /// Rows are spread over the shards by the hash of one column.
    Hash { column: String, column_index: usize, column_type: HashType, key: KeyType },
    /// One shard, copied to every node.
    Reference,
}

/// The distribution column's exact SQL type, and whether values must be coerced
/// to it (by the coordinator database) before they can be hashed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyType {
    /// As `format_type` prints it, type modifier included: `numeric(10,2)`.
    pub sql: String,
    /// The same without the type modifier: `numeric`. A value compared with the
    /// column is converted to this; a value stored in it, to `sql`.
    pub base_sql: String,
    pub oid: u32,
    pub coercion: Coercion,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Coercion {
    /// Values hash as given.
    None,
    /// varchar(n): a value with trailing spaces may be cut to n characters.
    TrailingSpaces,
    /// numeric(p,s), timestamp(p), …: storing a value may round it.
    Always,
}

#[derive(Clone, Debug)]
pub struct Shard {
    pub id: i64,
    /// The hash-partition remainder this shard holds.
    pub index: u32,
    /// Node groups holding a copy (one for hash shards, all for reference tables).
    pub placements: Vec<i32>,
}

impl Shard {
    /// Refuses to move or copy this shard unless it is placed on `source`
    /// and not yet on `target`.
    pub fn check_movable(&self, source: &Node, target: &Node) -> PgResult<()> {
        if !self.placements.contains(&source.group_id) {
            return Err(PgError::new(sqlstate::INVALID_PARAMETER_VALUE, format!("shard {} is not placed on {}", self.id, source.addr)));
        }
        if self.placements.contains(&target.group_id) {
            return Err(PgError::new(sqlstate::INVALID_PARAMETER_VALUE, format!("shard {} is already placed on {}", self.id, target.addr)));
        }
        Ok(())
    }
}

#[derive(Debug)]
pub struct DistributedTable {
    pub oid: u32,
    pub schema: String,
    pub name: String,
    pub distribution: Distribution,
    pub colocation_id: i32,
    /// Column names in attribute order, for INSERTs without a column list.
    pub columns: Vec<String>,
    /// The columns' type oids, in the order of `columns`.
    pub column_type_oids: Vec<u32>,
    /// The columns a COPY without a column list reads and writes: all but
    /// generated ones.
    pub copy_columns: Vec<String>,
    /// The distribution column's default expression (e.g. a sequence's nextval),
    /// which the coordinator evaluates for INSERTs that leave the column out.
    pub key_default: Option<String>,
    /// Columns whose default draws from a sequence (serial, identity), with
    /// that default: the shards have no such default, so the coordinator
    /// fills the values in.
    pub sequence_columns: Vec<(String, String)>,
    /// `GENERATED ALWAYS AS IDENTITY` columns, which take a value only with
    /// OVERRIDING SYSTEM VALUE.
    pub always_identity: Vec<String>,
    /// Ordered by shard index.
    pub shards: Vec<Shard>,
    /// The partitioned table this one is a partition of (both distributed,
    /// co-located: each shard is a partition of the parent's shard of the
    /// same index).
    pub partition_of: Option<u32>,
    /// The primary key's columns (none without one): a GROUP BY naming them
    /// all may select the table's other columns.
    pub primary_key: Vec<String>,
}

impl DistributedTable {
    /// The shard table's name on the worker: `<table>_<shardid>`, as with Citus.
    pub fn shard_relname(&self, shard: &Shard) -> String {
        format!("{}_{}", self.name, shard.id)
    }
    pub fn qualified_shard_name(&self, shard: &Shard) -> String {
        format!("{}.{}", quote_ident(&self.schema), quote_ident(&self.shard_relname(shard)))
    }
    pub fn qualified_name(&self) -> String {
        format!("{}.{}", quote_ident(&self.schema), quote_ident(&self.name))
    }
    pub fn is_reference(&self) -> bool {
        matches!(self.distribution, Distribution::Reference)
    }
    pub fn shard_count(&self) -> u32 {
        self.shards.len() as u32
    }
    /// Whether the table's relation on every worker (commands/worker_relations.rs)
    /// is a partitioned parent with the worker's shards attached, rather than
    /// a view (of a reference table's copy, or of a partition's rows in its
    /// root's parent): column changes must then go through it, as PostgreSQL
    /// forbids them on a partition alone.
    pub fn has_worker_parent(&self) -> bool {
        self.partition_of.is_none() && !self.is_reference()
    }
}

/// A function or procedure made distributed (`create_distributed_function`,
/// `pg_dist_object`).
#[derive(Debug)]
pub struct DistributedFunction {
    pub schema: String,
    pub name: String,
    /// Its input arguments' names, in order ("" where unnamed): how many
    /// tells overloads apart, the names place named arguments.
    pub arg_names: Vec<String>,
    /// How many of the last input arguments have defaults.
    pub defaults: usize,
    /// The argument whose value picks the shard (from 0), with a table of the
    /// co-located group, whose shards and placements the function follows;
    /// None for a function that is only propagated.
    pub distribution: Option<(usize, Arc<DistributedTable>)>,
    /// Delegated inside transaction blocks too.
    pub force_delegation: bool,
    /// Its schema-qualified signature, as `regprocedure` reads it on any node.
    pub signature: String,
    /// Set when delegated calls outside transaction blocks go to its
    /// per-shard copies (planner/function_copy.rs): the only routine of its
    /// name in its schema (a copy, alone in its schema, could not tell
    /// overloads apart), written in PL/pgSQL, or a SQL function whose
    /// distribution argument has the distribution column's type.
    pub copied_per_shard: Option<CopiedLanguage>,
}

/// The language of a function with per-shard copies, which decides how its
/// copies are written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CopiedLanguage {
    PlPgSql,
    Sql,
}

impl DistributedFunction {
    /// Whether a call with `positional` arguments, then `named` ones, fits:
    /// every argument given once, those not given have defaults.
    fn accepts(&self, positional: usize, named: &[&str]) -> bool {
        let count = self.arg_names.len();
        let mut given = vec![false; count];
        given[..positional.min(count)].fill(true);
        for name in named {
            match self.arg_names.iter().position(|a| !a.is_empty() && a == name) {
                Some(i) if !given[i] => given[i] = true,
                _ => return false,
            }
        }
        positional <= count && given.iter().enumerate().all(|(i, g)| *g || i >= count - self.defaults.min(count))
    }
}

/// One consistent view of the catalog.
#[derive(Clone, Debug, Default)]
pub struct Catalog {
    pub version: i64,
    /// Active and inactive worker nodes, by node id.
    pub nodes: Vec<Node>,
    tables: HashMap<(String, String), Arc<DistributedTable>>,
    by_oid: HashMap<u32, Arc<DistributedTable>>,
    /// Names of every aggregate function, so the planner can tell `count(x)` and
    /// user-defined aggregates from ordinary function calls.
    aggregates: std::collections::HashSet<String>,
    /// Views, functions and triggers of the coordinator database that reach
    /// distributed tables.
    pub user_code: user_code::UserCode,
    /// The coordinator database's user-defined types (name → oid), from
    /// which the nodes' `type_oids` were made.
    user_types: Arc<HashMap<String, u32>>,
    /// Distributed functions, by schema and name (overloads side by side).
    functions: HashMap<(String, String), Vec<Arc<DistributedFunction>>>,
    /// What unqualified names mean under a session's search_path when it is
    /// not just `public`. See `with_search_path`.
    unqualified: Option<Arc<UnqualifiedNames>>,
    /// Some active node's type oids could not be read (`load_type_oids`):
    /// a reload is worth it even when the catalog has not changed.
    pub type_oids_incomplete: bool,
}

/// Names of distributed tables and of user code's relations (views,
/// tables with triggers), each with the relation a session's search_path
/// finds under that name (None: none).
pub type UnqualifiedNames = HashMap<String, Option<FoundRelation>>;

/// The relation an unqualified name leads a session to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FoundRelation {
    pub schema: String,
    /// Tells a session's own temporary view from one a finished session left
    /// in the catalog under the same temporary schema's name (their drop at
    /// session end fires no catalog reload).
    pub oid: u32,
}

impl Catalog {
    pub fn table(&self, schema: &str, name: &str) -> Option<&Arc<DistributedTable>> {
        self.tables.get(&(schema.to_string(), name.to_string()))
    }
    /// The distributed table a name means: a qualified one is looked up, an
    /// unqualified one in `public`, or as the session's search_path found it.
    pub fn resolve(&self, schema: Option<&str>, name: &str) -> Option<&Arc<DistributedTable>> {
        self.table(self.schema_for(schema, name)?, name)
    }
    /// The schema a relation name leads to: its own if qualified, else
    /// `public` or where the session's search_path found it.
    pub fn schema_for<'a>(&'a self, schema: Option<&'a str>, name: &str) -> Option<&'a str> {
        match (schema, &self.unqualified) {
            (Some(s), _) => Some(s),
            (None, None) => Some("public"),
            (None, Some(names)) => names.get(name).and_then(|found| found.as_ref()).map(|found| found.schema.as_str()),
        }
    }
    /// A view over distributed tables, by the name a statement gives it.
    pub fn view(&self, schema: Option<&str>, name: &str) -> Option<&Arc<user_code::View>> {
        let view = self.user_code.view(Some(self.schema_for(schema, name)?), name)?;
        let found = match (schema, &self.unqualified) {
            (None, Some(names)) => names.get(name).and_then(|found| found.as_ref()),
            _ => None,
        };
        found.is_none_or(|found| found.oid == view.oid).then_some(view)
    }
    /// The names whose meaning a session's search_path decides: those of
    /// distributed tables and of user code's relations, each once.
    pub fn relation_names(&self) -> std::collections::BTreeSet<&str> {
        self.tables.keys().map(|(_, name)| name.as_str()).chain(self.user_code.relation_names()).collect()
    }
    /// A temporary relation of the session that an unqualified name of a
    /// distributed table or of user code's relations leads to: a temporary
    /// table hiding a distributed one, or a temporary view over them.
    pub fn temporary_relation(&self) -> Option<&str> {
        let names = self.unqualified.as_ref()?;
        names.iter().find(|(_, found)| found.as_ref().is_some_and(|f| f.schema.starts_with("pg_temp_"))).map(|(name, _)| name.as_str())
    }
    /// This catalog for a session whose search_path resolves unqualified
    /// names as `names` says (read from the coordinator database).
    pub fn with_search_path(&self, names: Arc<UnqualifiedNames>) -> Catalog {
        Catalog { unqualified: Some(names), ..self.clone() }
    }
    /// This catalog with `table` added: a statement's own intermediate
    /// relation, planned like a distributed table (executor/repartition.rs).
    pub fn with_table(&self, table: Arc<DistributedTable>) -> Catalog {
        let mut catalog = self.clone();
        catalog.put_table(table);
        catalog
    }
    /// Whether `oid` is one of the coordinator database's user-defined types
    /// (not a table's row type).
    pub fn is_user_type(&self, oid: u32) -> bool {
        self.user_types.values().any(|o| *o == oid)
    }
    /// Whether this catalog is a session's whose search_path is not
    /// `public` alone (`with_search_path`).
    pub fn follows_search_path(&self) -> bool {
        self.unqualified.is_some()
    }
    /// Adds `table`, in place of what the catalog held under its oid.
    fn put_table(&mut self, table: Arc<DistributedTable>) {
        self.forget_table(table.oid);
        self.tables.insert((table.schema.clone(), table.name.clone()), table.clone());
        self.by_oid.insert(table.oid, table);
    }

    /// Removes the table `oid`, leaving its name to any other table now
    /// holding it.
    fn forget_table(&mut self, oid: u32) {
        if let Some(old) = self.by_oid.remove(&oid) {
            let name = (old.schema.clone(), old.name.clone());
            if self.tables.get(&name).is_some_and(|t| t.oid == oid) {
                self.tables.remove(&name);
            }
        }
    }

    pub fn table_by_oid(&self, oid: u32) -> Option<&Arc<DistributedTable>> {
        self.by_oid.get(&oid)
    }
    pub fn tables(&self) -> impl Iterator<Item = &Arc<DistributedTable>> {
        self.by_oid.values()
    }
    /// The partitions of `oid`, theirs, and so on down.
    pub fn partitions_under(&self, oid: u32) -> Vec<Arc<DistributedTable>> {
        let mut found: Vec<Arc<DistributedTable>> = self.tables().filter(|t| t.partition_of == Some(oid)).cloned().collect();
        let mut i = 0;
        while i < found.len() {
            let below = found[i].oid;
            found.extend(self.tables().filter(|t| t.partition_of == Some(below)).cloned());
            i += 1;
        }
        found
    }
    pub fn has_tables(&self) -> bool {
        !self.by_oid.is_empty()
    }
    /// Whether an unqualified `name` may mean a distributed table: the one
    /// the session's search_path finds, if it was read; else any of that
    /// name in any schema (used to spot references the parse tree walk could
    /// not classify).
    pub fn may_name_distributed(&self, name: &str) -> bool {
        match &self.unqualified {
            Some(_) => self.resolve(None, name).is_some(),
            None => self.tables.keys().any(|(_, n)| n == name),
        }
    }
    /// The one distributed function a call names with `positional`
    /// arguments followed by arguments of the names `named`, the others
    /// left to their defaults (None when none or several fit); an
    /// unqualified name looked up in schema public (as tables are).
    pub fn function(&self, schema: Option<&str>, name: &str, positional: usize, named: &[&str]) -> Option<&Arc<DistributedFunction>> {
        let mut fitting =
            self.functions.get(&(schema.unwrap_or("public").to_string(), name.to_string()))?.iter().filter(|f| f.accepts(positional, named));
        match (fitting.next(), fitting.next()) {
            (Some(f), None) => Some(f),
            _ => None,
        }
    }
    pub fn functions(&self) -> impl Iterator<Item = &Arc<DistributedFunction>> {
        self.functions.values().flatten()
    }
    pub fn has_functions(&self) -> bool {
        !self.functions.is_empty()
    }
    pub fn is_aggregate(&self, name: &str) -> bool {
        self.aggregates.contains(name)
    }
    #[cfg(test)]
    pub fn add_function_for_tests(&mut self, function: Arc<DistributedFunction>) {
        self.functions.entry((function.schema.clone(), function.name.clone())).or_default().push(function);
    }
    /// Makes `names` aggregates, as `load` reads them from `pg_proc`.
    #[cfg(test)]
    pub fn add_aggregates_for_tests(&mut self, names: &[&str]) {
        self.aggregates.extend(names.iter().map(|n| n.to_string()));
    }
    /// A catalog of just these nodes and tables, for unit tests of what is
    /// planned from it.
    #[cfg(test)]
    pub fn for_tests(nodes: Vec<Node>, tables: Vec<Arc<DistributedTable>>) -> Catalog {
        let mut catalog = Catalog { nodes, ..Default::default() };
        for table in tables {
            catalog.tables.insert((table.schema.clone(), table.name.clone()), table.clone());
            catalog.by_oid.insert(table.oid, table);
        }
        catalog
    }

    /// The node registered at `host`:`port`, active or not.
    pub fn node_at(&self, host: &str, port: u16) -> Option<&Node> {
        self.nodes.iter().find(|n| n.addr.host == host && n.addr.port == port)
    }

    /// The active node at `host`:`port`, or the error saying there is none.
    pub fn active_node(&self, host: &str, port: u16) -> PgResult<Node> {
        self.node_at(host, port)
            .filter(|n| n.active)
            .cloned()
            .ok_or_else(|| PgError::new(sqlstate::UNDEFINED_OBJECT, format!("node {host}:{port} is not an active node of the cluster")))
    }

    /// The node registered at `host`:`port`, or the error saying there is none.
    pub fn registered_node(&self, host: &str, port: u16) -> PgResult<Node> {
        self.node_at(host, port).cloned().ok_or_else(|| PgError::new(sqlstate::UNDEFINED_OBJECT, format!("node at \"{host}:{port}\" does not exist")))
    }

    /// Shard `shard_id` and its table, or the error saying there is none.
    pub fn existing_shard(&self, shard_id: i64) -> PgResult<(Arc<DistributedTable>, Shard)> {
        self.shard(shard_id)
            .map(|(t, s)| (t.clone(), s.clone()))
            .ok_or_else(|| PgError::new(sqlstate::UNDEFINED_OBJECT, format!("shard {shard_id} does not exist")))
    }

    /// The shard with id `shard_id`, and its table.
    pub fn shard(&self, shard_id: i64) -> Option<(&Arc<DistributedTable>, &Shard)> {
        self.tables().find_map(|t| t.shards.iter().find(|s| s.id == shard_id).map(|s| (t, s)))
    }

    pub fn node_for_group(&self, group_id: i32) -> Option<&Node> {
        self.nodes.iter().find(|n| n.group_id == group_id)
    }
    pub fn active_nodes(&self) -> impl Iterator<Item = &Node> {
        self.nodes.iter().filter(|n| n.active)
    }
    /// `name` without the `_<shardid>` its shard gave it, when it is the name
    /// of a shard or of a shard's index or constraint (`orders_pkey_102008`
    /// → `orders_pkey`).
    pub fn name_without_shard<'a>(&self, name: &'a str) -> Option<&'a str> {
        let (base, id) = name.rsplit_once('_')?;
        let id: i64 = id.parse().ok()?;
        self.tables().any(|t| t.shards.iter().any(|s| s.id == id)).then_some(base)
    }
}

/// Settings the catalog is read under: its queries are small, but their
/// cost estimates grow with the number of tables, and past
/// `jit_above_cost` compiling a query took longer (about 100 ms) than
/// running it.
const LOADING: [(&str, &str); 1] = [("jit", "off")];

/// Reads the catalog as committed now, in one transaction so the snapshot
/// is consistent. Starting from `previous`, only the tables that the
/// versions since changed are read again (`tessera.catalog_changes`),
/// unless a change did not say which tables it touched or `previous` is
/// older than the changes kept; the rest (nodes, user code, functions) is
/// small and read whole. Then each node's user-defined type oids are mapped
/// to the coordinator database's (`load_type_oids`), logging in to the
/// nodes as `login`: without the maps the shards' values of an extension's
/// or user's type (an hll, an enum) cannot be combined.
pub async fn load_since(conn: &mut PgConnection, login: &crate::config::Login, previous: &Catalog) -> PgResult<Catalog> {
    let rows = conn
        .query(
            "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY;
             SET LOCAL jit = off;
             SELECT version, changes_kept_from FROM tessera.catalog_version;",
        )
        .await?;
    let result = async {
        let (version, kept_from): (i64, i64) = rows.first().map(|r| (int(&r[0]), int(&r[1]))).unwrap_or_default();
        let changed = match previous.version {
            0 => None,
            known if known + 1 < kept_from => None,
            known => changed_tables(conn, known).await?,
        };
        match changed {
            Some(oids) => load_changes(conn, version, previous, &oids).await,
            None => load_in_transaction(conn, version).await,
        }
    }
    .await;
    conn.execute("COMMIT").await?;
    let mut catalog = result?;
    load_type_oids(&mut catalog, conn, login, previous).await?;
    Ok(catalog)
}

/// The tables changed since version `known`, or None when some change
/// named none (read everything).
async fn changed_tables(conn: &mut PgConnection, known: i64) -> PgResult<Option<Vec<u32>>> {
    let rows = conn.query(&format!("SELECT DISTINCT relid FROM tessera.catalog_changes WHERE version > {known}")).await?;
    Ok(rows.into_iter().map(|r| r[0].as_deref().and_then(|v| v.parse().ok())).collect())
}

/// The catalog version committed now, to tell whether a snapshot is current.
pub async fn committed_version(conn: &mut PgConnection) -> PgResult<i64> {
    Ok(conn.query_value("SELECT version FROM tessera.catalog_version").await?.and_then(|v| v.parse().ok()).unwrap_or(0))
}

/// The catalog as a transaction block that changed it sees it, read on that
/// block's own connection; `version` marks it apart from committed catalogs.
/// Nodes keep the type oids of `committed`: types the block creates are
/// not shared with the nodes before it commits.
pub async fn load_in_block(conn: &mut PgConnection, version: i64, committed: &Catalog) -> PgResult<Catalog> {
    let saved = conn.set_for_now(&block_loading()).await?;
    let loaded = load_in_transaction(conn, version).await;
    let mut catalog = conn.restore_after(saved, loaded).await?;
    keep_type_oids(&mut catalog, committed);
    Ok(catalog)
}

/// `committed` with the tables `oids` (and the distributed tables they are
/// partitions of) and the nodes as the current block sees them: what a
/// command that distributed or changed those tables in its block needs to
/// go on, read without reading every other table again.
pub async fn load_tables_in_block(conn: &mut PgConnection, committed: &Catalog, oids: &[u32]) -> PgResult<Catalog> {
    let saved = conn.set_for_now(&block_loading()).await?;
    let loaded = async {
        let nodes = read_nodes(conn).await?;
        let tables = read_tables(conn, Some(oids)).await?;
        Ok::<_, crate::error::PgError>((nodes, tables))
    }
    .await;
    let (nodes, tables) = conn.restore_after(saved, loaded).await?;
    let mut catalog = Catalog { nodes, unqualified: None, ..committed.clone() };
    keep_type_oids(&mut catalog, committed);
    for table in tables {
        catalog.put_table(table);
    }
    Ok(catalog)
}

/// A block's catalog is read on the session's connection: names in what
/// it reads (a default's sequence) are qualified, whatever the session's
/// search_path.
fn block_loading() -> Vec<(&'static str, &'static str)> {
    LOADING.iter().chain(&crate::connection::QUALIFIED_NAMES).copied().collect()
}

fn keep_type_oids(catalog: &mut Catalog, committed: &Catalog) {
    for node in &mut catalog.nodes {
        if let Some(known) = committed.nodes.iter().find(|n| n.group_id == node.group_id) {
            node.type_oids = known.type_oids.clone();
        }
    }
}

fn int<T: std::str::FromStr + Default>(v: &Option<String>) -> T {
    v.as_deref().and_then(|s| s.parse().ok()).unwrap_or_default()
}

/// Reads the catalog through its views in pg_catalog, which every role may
/// read: a block's catalog is read as the client's role.
async fn load_in_transaction(conn: &mut PgConnection, version: i64) -> PgResult<Catalog> {
    let mut catalog = Catalog { version, nodes: read_nodes(conn).await?, ..Default::default() };
    for table in read_tables(conn, None).await? {
        catalog.put_table(table);
    }
    read_code(conn, &mut catalog).await?;
    Ok(catalog)
}

/// `previous` with the tables `changed` read again (gone when they no
/// longer are distributed), and everything else but tables read whole.
async fn load_changes(conn: &mut PgConnection, version: i64, previous: &Catalog, changed: &[u32]) -> PgResult<Catalog> {
    let mut catalog =
        Catalog { version, nodes: read_nodes(conn).await?, tables: previous.tables.clone(), by_oid: previous.by_oid.clone(), ..Default::default() };
    for oid in changed {
        catalog.forget_table(*oid);
    }
    if !changed.is_empty() {
        for table in read_tables(conn, Some(changed)).await? {
            catalog.put_table(table);
        }
    }
    read_code(conn, &mut catalog).await?;
    Ok(catalog)
}

/// What the catalog holds besides nodes and tables: aggregates, the user
/// code that reaches the tables, and distributed functions.
async fn read_code(conn: &mut PgConnection, catalog: &mut Catalog) -> PgResult<()> {
    for r in conn.query("SELECT DISTINCT proname FROM pg_proc WHERE prokind IN ('a', 'w')").await? {
        if let Some(name) = &r[0] {
            catalog.aggregates.insert(name.clone());
        }
    }
    if catalog.has_tables() {
        catalog.user_code = user_code::load(conn, catalog).await?;
    }
    let functions = conn
        .query(
            "SELECT n.nspname, p.proname,
                    (SELECT coalesce(json_agg(coalesce(a.name, '') ORDER BY a.i), '[]')
                       FROM unnest(coalesce(p.proargnames, array_fill(''::text, ARRAY[p.pronargs])),
                                   coalesce(p.proargmodes, array_fill('i'::\"char\", ARRAY[p.pronargs]))) WITH ORDINALITY AS a(name, mode, i)
                      WHERE a.mode IN ('i', 'b', 'v') OR (p.prokind = 'p' AND a.mode = 'o')),
                    o.distribution_argument_index, o.colocationid, coalesce(o.force_delegation, false), p.pronargdefaults,
                    format('%I.%I(%s)', n.nspname, p.proname, oidvectortypes(p.proargtypes)),
                    NOT EXISTS (SELECT FROM pg_proc q WHERE q.proname = p.proname AND q.pronamespace = p.pronamespace AND q.oid <> p.oid),
                    (SELECT lanname FROM pg_language WHERE oid = p.prolang), p.prokind,
                    p.proargtypes[o.distribution_argument_index]
             FROM pg_catalog.pg_dist_object o JOIN pg_proc p ON p.oid = o.objid JOIN pg_namespace n ON n.oid = p.pronamespace
             WHERE o.classid = 'pg_proc'::regclass",
        )
        .await?;
    for r in functions {
        let colocation: i32 = int(&r[4]);
        let table = catalog
            .tables()
            .filter(|t| t.colocation_id == colocation && !t.is_reference() && t.partition_of.is_none())
            .min_by_key(|t| t.oid)
            .cloned();
        let distribution = r[3].as_deref().and_then(|i| i.parse::<usize>().ok()).zip(table);
        let key_oid = distribution.as_ref().and_then(|(_, t)| match &t.distribution {
            Distribution::Hash { key, .. } => Some(key.oid),
            _ => None,
        });
        let copied_per_shard = match (r[8].as_deref(), r[9].as_deref(), r[10].as_deref()) {
            (Some("t"), Some("plpgsql"), _) => Some(CopiedLanguage::PlPgSql),
            (Some("t"), Some("sql"), Some("f")) if key_oid.is_some() && r[11].as_deref().and_then(|o| o.parse().ok()) == key_oid => {
                Some(CopiedLanguage::Sql)
            }
            _ => None,
        };
        let function = DistributedFunction {
            schema: r[0].clone().unwrap_or_default(),
            name: r[1].clone().unwrap_or_default(),
            arg_names: parse_json_string_array(r[2].as_deref().unwrap_or("[]")),
            defaults: int::<usize>(&r[6]),
            distribution,
            force_delegation: r[5].as_deref() == Some("t"),
            signature: r[7].clone().unwrap_or_default(),
            copied_per_shard,
        };
        catalog.functions.entry((function.schema.clone(), function.name.clone())).or_default().push(Arc::new(function));
    }
    Ok(())
}

async fn read_nodes(conn: &mut PgConnection) -> PgResult<Vec<Node>> {
    let rows = conn.query("SELECT nodeid, groupid, nodename, nodeport, isactive, shouldhaveshards FROM pg_catalog.pg_dist_node WHERE noderole = 'primary' ORDER BY nodeid").await?;
    Ok(rows
        .into_iter()
        .map(|r| Node {
            id: int(&r[0]),
            group_id: int(&r[1]),
            addr: ServerAddr { host: r[2].clone().unwrap_or_default(), port: int(&r[3]) },
            active: r[4].as_deref() == Some("t"),
            should_have_shards: r[5].as_deref() == Some("t"),
            type_oids: Arc::default(),
        })
        .collect())
}

/// The distributed tables, or only those of `oids` and the distributed
/// tables they are partitions of (directly or further up).
async fn read_tables(conn: &mut PgConnection, oids: Option<&[u32]>) -> PgResult<Vec<Arc<DistributedTable>>> {
    let among = match oids {
        None => "pg_catalog.pg_dist_partition".to_string(),
        // Materialized: else the planner works out every table's columns
        // before it picks the few asked for.
        Some(oids) => format!(
            "(WITH chosen AS MATERIALIZED (
                 SELECT p.* FROM pg_catalog.pg_dist_partition p
                  WHERE p.logicalrelid IN (WITH RECURSIVE up(relid) AS (SELECT unnest(ARRAY[{}]::oid[])
                                                                        UNION SELECT i.inhparent FROM pg_inherits i JOIN up ON i.inhrelid = up.relid)
                                           SELECT relid FROM up))
              SELECT * FROM chosen)",
            oids.iter().map(u32::to_string).collect::<Vec<_>>().join(", ")
        ),
    };
    let mut placements: HashMap<i64, Vec<i32>> = HashMap::new();
    for r in conn.query(&format!("SELECT pl.shardid, pl.groupid FROM pg_catalog.pg_dist_placement pl JOIN pg_catalog.pg_dist_shard s USING (shardid) JOIN {among} p USING (logicalrelid) ORDER BY pl.shardid, pl.groupid")).await? {
        placements.entry(int(&r[0])).or_default().push(int(&r[1]));
    }
    let mut shards: HashMap<u32, Vec<Shard>> = HashMap::new();
    for r in conn.query(&format!("SELECT s.logicalrelid::oid, s.shardid, s.shardindex FROM pg_catalog.pg_dist_shard s JOIN {among} p USING (logicalrelid) ORDER BY s.logicalrelid, s.shardindex")).await? {
        let id: i64 = int(&r[1]);
        shards.entry(int(&r[0])).or_default().push(Shard { id, index: int(&r[2]), placements: placements.remove(&id).unwrap_or_default() });
    }
    let rows = conn
        .query(&format!(
            // Defaults that draw from a sequence (serial and identity columns)
            // are evaluated by the coordinator: the sequence lives in the
            // coordinator database, so values are unique across all shards.
            // An identity column's sequence is found through pg_depend, which
            // the snapshot covers: name lookups (pg_get_serial_sequence) fail
            // on a table another session has dropped since. Each table's
            // columns are read on their own (a lateral subquery), so that
            // the work grows with the number of tables, not its square.
            "SELECT c.oid, n.nspname, c.relname, p.partmethod, p.partkey, p.colocationid,
                    k.atttypid, tessera_defaults.names, tessera_defaults.key_default, format_type(k.atttypid, k.atttypmod), k.atttypmod, format_type(k.atttypid, NULL),
                    tessera_defaults.copy_names, tessera_defaults.sequence_defaults, tessera_defaults.always_identity,
                    (SELECT i.inhparent FROM pg_inherits i WHERE i.inhrelid = c.oid AND c.relispartition),
                    (SELECT json_agg(a.attname ORDER BY x.n) FROM pg_index i CROSS JOIN LATERAL unnest(i.indkey) WITH ORDINALITY x(attnum, n)
                       JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = x.attnum WHERE i.indrelid = c.oid AND i.indisprimary),
                    tessera_defaults.type_oids
             FROM {among} p
             JOIN pg_class c ON c.oid = p.logicalrelid
             JOIN pg_namespace n ON n.oid = c.relnamespace
             LEFT JOIN pg_attribute k ON k.attrelid = c.oid AND k.attname = p.partkey AND NOT k.attisdropped
             CROSS JOIN LATERAL (
                 SELECT json_agg(a.attname ORDER BY a.attnum) AS names,
                        json_agg(a.atttypid::int8 ORDER BY a.attnum) AS type_oids,
                        json_agg(a.attname ORDER BY a.attnum) FILTER (WHERE a.attgenerated = '') AS copy_names,
                        json_agg(json_build_array(a.attname, d.value) ORDER BY a.attnum) FILTER (WHERE d.uses_sequence) AS sequence_defaults,
                        json_agg(a.attname ORDER BY a.attnum) FILTER (WHERE a.attidentity = 'a') AS always_identity,
                        min(d.value) FILTER (WHERE a.attname = p.partkey) AS key_default
                 FROM pg_attribute a
                 LEFT JOIN pg_attrdef ad ON ad.adrelid = a.attrelid AND ad.adnum = a.attnum
                 CROSS JOIN LATERAL (
                     SELECT COALESCE(pg_get_expr(ad.adbin, ad.adrelid),
                                     CASE WHEN a.attidentity <> '' THEN
                                       (SELECT format('nextval(%L::regclass)', quote_ident(sn.nspname) || '.' || quote_ident(sc.relname))
                                        FROM pg_depend dep
                                        JOIN pg_class sc ON sc.oid = dep.objid AND sc.relkind = 'S'
                                        JOIN pg_namespace sn ON sn.oid = sc.relnamespace
                                        WHERE dep.classid = 'pg_class'::regclass AND dep.refclassid = 'pg_class'::regclass
                                          AND dep.refobjid = a.attrelid AND dep.refobjsubid = a.attnum AND dep.deptype = 'i') END) AS value,
                            a.attidentity <> '' OR coalesce(pg_get_expr(ad.adbin, ad.adrelid) LIKE '%nextval(%', false) AS uses_sequence) d
                 WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped) tessera_defaults"
        ))
        .await?;
    let mut tables = Vec::new();
    for r in rows {
        let oid: u32 = int(&r[0]);
        let columns = parse_json_string_array(r[7].as_deref().unwrap_or("[]"));
        let distribution = if r[3].as_deref() == Some("h") {
            let column = r[4].clone().unwrap_or_default();
            let column_index = columns.iter().position(|c| *c == column).unwrap_or(0);
            let type_oid: u32 = int(&r[6]);
            let typmod: i32 = int(&r[10]);
            match HashType::from_type_oid(type_oid) {
                Some(column_type) => {
                    let coercion = match (typmod, column_type) {
                        // char(n) only drops trailing spaces, which its hash ignores.
                        (-1, _) | (_, HashType::Bpchar | HashType::Array(HashType::Bpchar)) => Coercion::None,
                        (_, HashType::Text) => Coercion::TrailingSpaces,
                        _ => Coercion::Always,
                    };
                    let key = KeyType { sql: r[9].clone().unwrap_or_default(), base_sql: r[11].clone().unwrap_or_default(), oid: type_oid, coercion };
                    Distribution::Hash { column, column_index, column_type, key }
                }
                None => continue,
            }
        } else {
            Distribution::Reference
        };
        tables.push(Arc::new(DistributedTable {
            oid,
            schema: r[1].clone().unwrap_or_default(),
            name: r[2].clone().unwrap_or_default(),
            distribution,
            colocation_id: int(&r[5]),
            columns,
            copy_columns: parse_json_string_array(r[12].as_deref().unwrap_or("[]")),
            key_default: r[8].clone(),
            sequence_columns: serde_json::from_str(r[13].as_deref().unwrap_or("[]")).unwrap_or_default(),
            always_identity: parse_json_string_array(r[14].as_deref().unwrap_or("[]")),
            shards: shards.remove(&oid).unwrap_or_default(),
            partition_of: r[15].as_deref().and_then(|v| v.parse().ok()),
            primary_key: parse_json_string_array(r[16].as_deref().unwrap_or("[]")),
            column_type_oids: serde_json::from_str(r[17].as_deref().unwrap_or("[]")).unwrap_or_default(),
        }));
    }
    Ok(tables)
}

/// Parses the JSON array of strings that json_agg produced for column names.
fn parse_json_string_array(json: &str) -> Vec<String> {
    serde_json::from_str(json).unwrap_or_default()
}

/// The current snapshot, shared by every session; readers never block.
pub struct CatalogHandle {
    current: ArcSwap<Catalog>,
}

impl CatalogHandle {
    pub fn new(catalog: Catalog) -> Self {
        CatalogHandle { current: ArcSwap::from_pointee(catalog) }
    }
    pub fn snapshot(&self) -> Arc<Catalog> {
        self.current.load_full()
    }
    pub fn replace(&self, catalog: Catalog) {
        self.current.store(Arc::new(catalog));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_column_lists() {
        assert_eq!(parse_json_string_array(r#"["aid", "b\"x", "\u00e9t\u00e9"]"#), vec!["aid", "b\"x", "été"]);
        assert!(parse_json_string_array("[]").is_empty());
    }

    #[test]
    fn calls_fit_by_position_name_and_default() {
        let f = DistributedFunction {
            schema: "public".into(),
            name: "f".into(),
            arg_names: vec!["k".into(), "amount".into(), "note".into()],
            defaults: 1,
            distribution: None,
            force_delegation: false,
            signature: String::new(),
            copied_per_shard: None,
        };
        assert!(f.accepts(3, &[]) && f.accepts(2, &[]) && f.accepts(0, &["amount", "k"]) && f.accepts(1, &["note", "amount"]));
        assert!(!f.accepts(1, &[]), "amount has no default");
        assert!(!f.accepts(1, &["k", "amount"]), "k given twice");
        assert!(!f.accepts(4, &[]) && !f.accepts(2, &["other"]));
    }
}
