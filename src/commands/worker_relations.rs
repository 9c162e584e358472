//! Worker-side relations. On every worker, each distributed table also exists
//! under its own schema and name: a hash-partitioned parent whose partitions
//! are the worker's own shards (attached as they are) and, for the shards on
//! other nodes, `postgres_fdw` foreign tables in the `tessera_remote` schema.
//! A reference table is a view of the worker's own copy, a partition of a
//! distributed table a view of its rows in its root's parent. User code that runs
//! on a worker (functions, procedures, DO blocks, triggers) therefore sees
//! whole tables, and partition pruning takes `WHERE key = $1` straight to the
//! local shard.
//!
//! The parents are created in the same distributed transaction as the shards
//! and dropped with them. Column changes go through the parent (PostgreSQL
//! forbids them on a partition alone), which passes them on to the local
//! shards and the foreign tables; see `planner::ddl` for which commands.
//!
//! The foreign servers do not lead to the other nodes directly but through
//! the coordinator's link relay (`transaction::links`), which makes writes
//! into foreign partitions commit with the worker's own transaction, all or
//! nothing; a trigger on each foreign table gives that transaction the xid
//! the relay names the writes after. A reference table's view writes
//! what user code on a worker writes into it to every copy the same way,
//! through foreign tables over the other nodes' copies
//! (`REFERENCE_WRITES_SQL`).
//!
//! Repartition joins move rows node to node without the relay: a node
//! copies rows from another over a connection of its own (`PULL_ROWS_SQL`).

use super::run_per_node;
use super::table_ddl::TableDefinition;
use crate::config::Config;
use crate::config::ServerAddr;
use crate::connection::{quote_literal, PgConnection, QUALIFIED_NAMES};
use crate::error::{PgError, PgResult};
use crate::metadata::{Catalog, Node};
use crate::planner::worker_relations::*;
use crate::process::context::CommandContext;
use crate::transaction::links::link_application_name;
use std::collections::BTreeMap;

/// Creates the relation of table `oid` on every active node (only on node
/// group `only_group`, when set), as the catalog stands in the current
/// block: when a node, a partition attached or detached, or a change of
/// columns needs one.
pub(super) async fn create(ctx: &mut CommandContext<'_>, oid: u32, only_group: Option<i32>) -> PgResult<()> {
    let catalog = crate::metadata::load_tables_in_block(ctx.parts.local().await?, &ctx.catalog, &[oid]).await?;
    let per_node = create_statements(ctx, &catalog, oid, only_group).await?;
    let committed = std::mem::replace(&mut ctx.catalog, std::sync::Arc::new(catalog));
    let result = run_per_node(ctx, per_node).await;
    ctx.catalog = committed;
    result
}

/// Points the views of reference tables `oids` on every node holding a copy
/// at the copies as the current block places them (after a copy was added
/// or a node removed), so that writes on a worker reach every copy.
pub(super) async fn link_reference_copies(ctx: &mut CommandContext<'_>, oids: &[u32]) -> PgResult<()> {
    let catalog = crate::metadata::load_tables_in_block(ctx.parts.local().await?, &ctx.catalog, oids).await?;
    let mut per_node: BTreeMap<i32, Vec<String>> = BTreeMap::new();
    for table in oids.iter().filter_map(|oid| catalog.table_by_oid(*oid)) {
        for group in table.shards.first().map(|s| s.placements.as_slice()).unwrap_or_default() {
            per_node.entry(*group).or_default().push(link_reference_sql(table, *group));
        }
    }
    let committed = std::mem::replace(&mut ctx.catalog, std::sync::Arc::new(catalog));
    let result = run_per_node(ctx, per_node).await;
    ctx.catalog = committed;
    result
}

/// The statements creating the relation of table `oid` on every active
/// node of `catalog` (a catalog of the current block, which knows the
/// table), or only on node group `only_group`, by node group.
pub(super) async fn create_statements(
    ctx: &mut CommandContext<'_>,
    catalog: &Catalog,
    oid: u32,
    only_group: Option<i32>,
) -> PgResult<BTreeMap<i32, Vec<String>>> {
    let local = ctx.parts.local().await?;
    let table = catalog.table_by_oid(oid).cloned().ok_or_else(|| PgError::internal(format!("table {oid} is not in the catalog")))?;
    let shape = if table.is_reference() {
        Shape::ReferenceView
    } else if table.partition_of.is_some() {
        let mut root = table.clone();
        let mut ancestors = Vec::new();
        while let Some(parent) = root.partition_of.and_then(|p| catalog.table_by_oid(p)) {
            root = parent.clone();
            ancestors.push((root.oid, root.clone()));
        }
        let saved = local.set_for_now(&QUALIFIED_NAMES).await?;
        let row = local
            .query(&format!(
                "SELECT pg_get_partition_constraintdef({oid}),
                        (SELECT string_agg(quote_ident(attname), ', ' ORDER BY attnum) FROM pg_attribute WHERE attrelid = {oid} AND attnum > 0 AND NOT attisdropped)"
            ))
            .await;
        let row = local.restore_after(saved, row).await?;
        let value = |i: usize| {
            row.first()
                .and_then(|r| r.get(i).cloned().flatten())
                .ok_or_else(|| PgError::internal(format!("partition {oid} has no constraint or columns")))
        };
        let constraint = value(0)?;
        let hash_parents = ancestors.into_iter().filter(|(oid, _)| constraint.contains(&format!("'{oid}'::oid"))).collect();
        Shape::PartitionView { root: root.qualified_name(), constraint, columns: value(1)?, hash_parents }
    } else {
        let owner = local.query(&format!("SELECT pg_get_userbyid(relowner) FROM pg_class WHERE oid = {oid}")).await?;
        let owner = owner.first().and_then(|r| r.first().cloned().flatten()).ok_or_else(|| PgError::internal(format!("table {oid} has no owner")))?;
        Shape::Parent { columns: TableDefinition::read(local, oid).await?.columns().to_vec(), owner }
    };
    Ok(catalog
        .active_nodes()
        .filter(|n| only_group.is_none_or(|g| g == n.group_id))
        .map(|n| (n.group_id, create_sql(&table, &shape, n.group_id)))
        .collect())
}

/// What every worker needs before relations can be built on it, made by
/// the coordinator's service role (a superuser): postgres_fdw, the schema
/// for foreign tables, a foreign server for every other node, and for each
/// role a user mapping that logs in as that role (so the other node checks
/// its privileges, as the coordinator's own connections do). Idempotent.
fn setup_sql(node: &Node, nodes: &[Node], relay: &ServerAddr) -> String {
    let mut sql = format!(
        "{decisions}
         CREATE EXTENSION IF NOT EXISTS postgres_fdw;
         CREATE SCHEMA IF NOT EXISTS {REMOTE_SCHEMA};
         GRANT USAGE, CREATE ON SCHEMA {REMOTE_SCHEMA} TO PUBLIC;
         CREATE OR REPLACE FUNCTION {REMOTE_SCHEMA}.remote_write() RETURNS trigger LANGUAGE plpgsql AS $tessera$
         BEGIN
           {record_once};
           IF TG_OP = 'DELETE' THEN RETURN OLD; END IF;
           RETURN NEW;
         END $tessera$;
         -- Before the link relay, a trigger of this name refused such writes.
         DO $tessera$ DECLARE t regclass;
         BEGIN
           IF to_regprocedure('{REMOTE_SCHEMA}.refuse_write()') IS NOT NULL THEN
             FOR t IN SELECT tgrelid::regclass FROM pg_trigger WHERE tgfoid = '{REMOTE_SCHEMA}.refuse_write()'::regprocedure LOOP
               EXECUTE format('DROP TRIGGER tessera_remote_write ON %s', t);
               EXECUTE format('CREATE TRIGGER tessera_remote_write BEFORE INSERT OR UPDATE OR DELETE ON %s FOR EACH ROW EXECUTE FUNCTION {REMOTE_SCHEMA}.remote_write()', t);
             END LOOP;
             DROP FUNCTION {REMOTE_SCHEMA}.refuse_write();
           END IF;
         END $tessera$;
         CREATE OR REPLACE FUNCTION {REMOTE_SCHEMA}.refuse_moved_write() RETURNS trigger LANGUAGE plpgsql AS $tessera$
         BEGIN
           RAISE EXCEPTION 'this shard of % moved to another node while the statement waited for it', TG_ARGV[0]
             USING ERRCODE = '40001', HINT = 'Retry the transaction: the coordinator now routes it to the new node.';
         END $tessera$;
         {reference_writes}
         {link_security}
         {pull_rows}
         {forget_roles}
         -- Every role gets a mapping that logs it in as itself, so that the
         -- other node checks its privileges, with its certificate where the
         -- cluster has a CA. Only a superuser may waive the password for
         -- non-superusers, or name the certificate files.
         CREATE OR REPLACE FUNCTION {REMOTE_SCHEMA}.map_roles() RETURNS void LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $tessera$
         DECLARE r record; wanted text[]; options text;
         BEGIN
           FOR r IN SELECT s.srvname, a.rolname, m.umid IS NOT NULL AS mapped, coalesce(m.umoptions, '{{}}') AS present
                      FROM pg_foreign_server s CROSS JOIN pg_roles a
                      LEFT JOIN pg_user_mappings m ON m.srvid = s.oid AND m.umuser = a.oid
                     WHERE s.srvname LIKE 'tessera\\_node\\_%' AND a.rolname !~ '^pg_' LOOP
             SELECT array_agg(o.option || '=' || o.value), string_agg(format('%I %L', o.option, o.value), ', ') INTO wanted, options
               FROM (VALUES ('user', r.rolname::text), ('password_required', 'false')
                     UNION ALL SELECT * FROM {REMOTE_SCHEMA}.link_security(r.rolname) l WHERE l.option IN ('sslcert', 'sslkey')) AS o (option, value);
             CONTINUE WHEN r.mapped AND r.present @> wanted AND wanted @> r.present;
             IF r.mapped THEN
               EXECUTE format('DROP USER MAPPING FOR %I SERVER %I', r.rolname, r.srvname);
             END IF;
             EXECUTE format('CREATE USER MAPPING FOR %I SERVER %I OPTIONS (%s)', r.rolname, r.srvname, options);
           END LOOP;
         END $tessera$;",
        forget_roles = crate::metadata::forget_roles_function(REMOTE_SCHEMA),
        link_security = crate::metadata::link_security_function(REMOTE_SCHEMA),
        decisions = crate::transaction::decided::deciding_objects_sql(),
        record_once = crate::transaction::decided::RECORD_ONCE_SQL,
        reference_writes = REFERENCE_WRITES_SQL,
        pull_rows = PULL_ROWS_SQL,
    );
    for other in nodes.iter().filter(|n| n.group_id != node.group_id) {
        let server = server_name(other.group_id);
        // The relay tells the other node by the link's name; postgres_fdw
        // puts its backend's pid in place of %p.
        sql.push_str(&format!(
            "\nDO $tessera$ BEGIN
               IF NOT EXISTS (SELECT FROM pg_foreign_server WHERE srvname = {server_literal}) THEN
                 EXECUTE format('CREATE SERVER {server} FOREIGN DATA WRAPPER postgres_fdw OPTIONS (host %L, port %L, dbname %L, application_name %L)', {host}, {port}, current_database(), {name});
                 GRANT USAGE ON FOREIGN SERVER {server} TO PUBLIC;
               ELSIF NOT EXISTS (SELECT FROM pg_foreign_server WHERE srvname = {server_literal} AND srvoptions @> ARRAY['application_name=' || {name}]) THEN
                 ALTER SERVER {server} OPTIONS (SET host {host}, SET port {port}, ADD application_name {name});
               ELSE
                 ALTER SERVER {server} OPTIONS (SET host {host}, SET port {port});
               END IF;
             END $tessera$;",
            server_literal = quote_literal(&server),
            host = quote_literal(&relay.host),
            port = quote_literal(&relay.port.to_string()),
            name = quote_literal(&link_application_name(node.group_id, other.group_id)),
        ));
    }
    sql.push_str(&format!("\nSELECT {REMOTE_SCHEMA}.secure_servers();\nSELECT {REMOTE_SCHEMA}.map_roles();"));
    sql
}

/// How a node fetches the rows a repartition join moves to it
/// (`executor::repartition`). `insert_rows(query, target)` inserts a
/// query's rows into one of the session's tables; `pull_rows(host, port,
/// query, target)` copies into one of the session's temporary tables the
/// rows `query` gives on another node: `COPY … FROM PROGRAM` runs the
/// node's own `psql`, which logs in to the other node as the session's user,
/// takes on the caller's role (so that node checks the same privileges) and
/// sends `COPY (query) TO STDOUT`, in binary when every column is of a
/// built-in type (others' oids differ between nodes), else in text. Rows
/// are neither printed as SQL values nor kept whole in memory on the way,
/// as a dblink result was (about twice the time). Only a superuser may run
/// a program or open a connection the other node asks no password of (the
/// nodes trust each other's network, as the foreign servers' user mappings
/// do), so `copy_from_node` is SECURITY DEFINER: it lets the caller act only
/// as a role its login may take on, and write only into its own session's
/// temporary tables that its role may insert into. A statement stopped
/// mid-copy closes the pipe and waits for `psql` to end, so `psql` gets
/// SIGPIPE back (a backend ignores it, and its children inherit that) to
/// die at its next write, and a session of its own: PostgreSQL signals a
/// cancelled backend's whole process group, and a `psql` interrupted in a
/// copy cancels the other node's statement and then never ends. The other
/// node's error (psql's standard error, in a file among PostgreSQL's
/// temporary files until read) comes back with its SQLSTATE and the node's
/// address. Each function returns the rows it inserted. `reaches(host,
/// port)` tries the same kind of connection, for
/// `citus_check_cluster_node_health()`.
const PULL_ROWS_SQL: &str = r#"
DROP FUNCTION IF EXISTS tessera_remote.pull_rows(text, integer, text, regclass, text);
DROP FUNCTION IF EXISTS tessera_remote.open_pull_link(text, text, integer, text);
DROP FUNCTION IF EXISTS tessera_remote.conninfo_value(text);
CREATE OR REPLACE FUNCTION tessera_remote.shell_word(value text) RETURNS text LANGUAGE sql IMMUTABLE AS
$tessera$ SELECT '''' || replace(value, '''', '''"''"''') || '''' $tessera$;
CREATE OR REPLACE FUNCTION tessera_remote.copy_from_node(host text, port integer, query text, target regclass, role text) RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $tessera$
DECLARE
  -- PostgreSQL's temporary-file directory, which it empties as it starts.
  temporary text := current_setting('data_directory') || '/base/pgsql_tmp';
  errors text := pg_catalog.format('%s/pgsql_tmp_tessera_pull_%s', temporary, pg_backend_pid());
  copy_format text;
  command text;
  copied bigint;
  report text;
  found text[];
BEGIN
  IF NOT pg_has_role(session_user, role, 'MEMBER') THEN
    RAISE EXCEPTION 'role % cannot act as role %', session_user, role USING ERRCODE = '42501';
  END IF;
  IF NOT EXISTS (SELECT FROM pg_class WHERE oid = target AND relnamespace = pg_my_temp_schema()) OR NOT has_table_privilege(role, target, 'INSERT') THEN
    RAISE EXCEPTION 'rows are copied only into a temporary table of the session that its role may write' USING ERRCODE = '42501';
  END IF;
  SELECT CASE WHEN bool_and(a.atttypid < 16384) THEN 'binary' ELSE 'text' END INTO copy_format
    FROM pg_attribute a WHERE a.attrelid = target AND a.attnum > 0 AND NOT a.attisdropped;
  command := pg_catalog.format('mkdir -p %s && env --default-signal=PIPE setsid %s -X -q -w -d %s -v ON_ERROR_STOP=1 -v VERBOSITY=verbose -c %s 2>%s && rm -f %s',
    tessera_remote.shell_word(temporary), tessera_remote.shell_word((SELECT setting FROM pg_config WHERE name = 'BINDIR') || '/psql'),
    tessera_remote.shell_word(tessera_remote.link_conninfo(host, port, current_database(), session_user)),
    tessera_remote.shell_word(pg_catalog.format('SET ROLE %I; COPY (%s) TO STDOUT (FORMAT %s)', role, query, copy_format)),
    tessera_remote.shell_word(errors), tessera_remote.shell_word(errors));
  BEGIN
    EXECUTE pg_catalog.format('COPY %s FROM PROGRAM %L (FORMAT %s)', target, command, copy_format);
    GET DIAGNOSTICS copied = ROW_COUNT;
  -- A psql that failed before sending anything leaves a binary copy
  -- without its header: that error says nothing, psql's own does.
  EXCEPTION WHEN external_routine_exception OR io_error OR bad_copy_file_format THEN
    report := pg_read_file(errors, 0, 100000, true);
    IF report IS NOT NULL THEN
      EXECUTE pg_catalog.format('COPY (SELECT) TO PROGRAM %L', 'rm -f ' || tessera_remote.shell_word(errors));
    END IF;
    report := btrim(report, E' \n');
    IF coalesce(report, '') = '' THEN
      RAISE;
    END IF;
    found := regexp_match(report, E'ERROR:  ([0-9A-Z]{5}): ([^\\n]*)(\\nDETAIL:  ([^\\n]*))?');
    IF found IS NOT NULL THEN
      RAISE EXCEPTION USING ERRCODE = found[1], MESSAGE = found[2],
        DETAIL = pg_catalog.format('%sOn node %s:%s.', coalesce(found[4] || E'\n', ''), host, port);
    END IF;
    RAISE EXCEPTION 'could not read rows from node %:%: %', host, port, report USING ERRCODE = '08006';
  END;
  RETURN copied;
END $tessera$;
CREATE OR REPLACE FUNCTION tessera_remote.reaches(host text, port integer) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $tessera$
BEGIN
  EXECUTE pg_catalog.format('COPY (SELECT) TO PROGRAM %L', pg_catalog.format('%s -X -q -w -d %s -c %s >/dev/null 2>&1',
    tessera_remote.shell_word((SELECT setting FROM pg_config WHERE name = 'BINDIR') || '/psql'),
    tessera_remote.shell_word(tessera_remote.link_conninfo(host, port, current_database(), session_user) || ' connect_timeout=5'),
    tessera_remote.shell_word('SELECT 1')));
  RETURN true;
EXCEPTION WHEN OTHERS THEN
  RETURN false;
END $tessera$;
CREATE OR REPLACE FUNCTION tessera_remote.insert_rows(query text, target regclass) RETURNS bigint LANGUAGE plpgsql AS $tessera$
DECLARE inserted bigint;
BEGIN
  EXECUTE format('INSERT INTO %s %s', target, query);
  GET DIAGNOSTICS inserted = ROW_COUNT;
  RETURN inserted;
END $tessera$;
CREATE OR REPLACE FUNCTION tessera_remote.pull_rows(host text, port integer, query text, target regclass) RETURNS bigint
LANGUAGE sql AS $tessera$ SELECT tessera_remote.copy_from_node(host, port, query, target, current_user::text) $tessera$;
"#;

/// The functions that let user code on a worker write a reference table
/// through its view: `link_reference_copies(view, copy, groups)` makes a
/// foreign table over the copy on each of the other node groups `groups`
/// (dropping those of groups no longer holding one), gives the view the
/// copy's column defaults (an INSTEAD OF trigger sees a view's defaults,
/// not its table's) and points the view's trigger at the copies;
/// `write_reference` is that trigger: it applies the row to the local copy
/// and then to every other copy, in the worker's transaction, which the
/// link relay commits everywhere or nowhere. Rows are found by primary key,
/// or by all their columns when the table has none.
const REFERENCE_WRITES_SQL: &str = "
CREATE OR REPLACE FUNCTION tessera_remote.drop_reference_links(copy_name text) RETURNS void LANGUAGE plpgsql SET search_path = pg_catalog AS $tessera$
DECLARE t regclass;
BEGIN
  FOR t IN SELECT c.oid FROM pg_class c WHERE c.relnamespace = 'tessera_remote'::regnamespace AND c.relkind = 'f'
              AND left(c.relname, length(copy_name) + 4) = copy_name || '_on_' LOOP
    EXECUTE format('DROP FOREIGN TABLE %s', t);
  END LOOP;
END $tessera$;
CREATE OR REPLACE FUNCTION tessera_remote.link_reference_copies(view regclass, copy regclass, groups int[]) RETURNS void LANGUAGE plpgsql SET search_path = pg_catalog AS $tessera$
DECLARE
  copy_schema text; copy_name text; columns text; remote text; targets text[]; g int; r record;
BEGIN
  SELECT n.nspname, c.relname INTO copy_schema, copy_name FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = copy;
  targets := ARRAY[copy::text];
  PERFORM tessera_remote.drop_reference_links(copy_name);
  SELECT string_agg(format('%I %s', attname, format_type(atttypid, atttypmod)), ', ' ORDER BY attnum) INTO columns
    FROM pg_attribute WHERE attrelid = copy AND attnum > 0 AND NOT attisdropped AND attgenerated = '';
  FOREACH g IN ARRAY groups LOOP
    remote := format('tessera_remote.%I', copy_name || '_on_' || g);
    EXECUTE format('CREATE FOREIGN TABLE %s (%s) SERVER %I OPTIONS (schema_name %L, table_name %L)', remote, columns, 'tessera_node_' || g, copy_schema, copy_name);
    EXECUTE format('CREATE TRIGGER tessera_remote_write BEFORE INSERT OR UPDATE OR DELETE ON %s FOR EACH ROW EXECUTE FUNCTION tessera_remote.remote_write()', remote);
    EXECUTE format('GRANT ALL ON %s TO PUBLIC', remote);
    targets := targets || remote;
  END LOOP;
  FOR r IN SELECT a.attname, pg_get_expr(d.adbin, d.adrelid) AS expr FROM pg_attrdef d
             JOIN pg_attribute a ON a.attrelid = d.adrelid AND a.attnum = d.adnum
            WHERE d.adrelid = copy AND a.attgenerated = '' AND NOT a.attisdropped LOOP
    EXECUTE format('ALTER VIEW %s ALTER COLUMN %I SET DEFAULT %s', view, r.attname, r.expr);
  END LOOP;
  EXECUTE format('CREATE OR REPLACE TRIGGER tessera_reference_write INSTEAD OF INSERT OR UPDATE OR DELETE ON %s FOR EACH ROW EXECUTE FUNCTION tessera_remote.write_reference(%s)',
                 view, (SELECT string_agg(quote_literal(t), ', ') FROM unnest(targets) AS t));
END $tessera$;
CREATE OR REPLACE FUNCTION tessera_remote.write_reference() RETURNS trigger LANGUAGE plpgsql AS $tessera$
DECLARE
  copy regclass := TG_ARGV[0]::regclass; target text; columns text; row_values text; assignments text; matches text;
BEGIN
  SELECT string_agg(quote_ident(attname), ', ' ORDER BY attnum),
         string_agg(format('($1).%I', attname), ', ' ORDER BY attnum),
         string_agg(format('%I = ($2).%1$I', attname), ', ' ORDER BY attnum)
    INTO columns, row_values, assignments
    FROM pg_catalog.pg_attribute WHERE attrelid = copy AND attnum > 0 AND NOT attisdropped AND attgenerated = '';
  SELECT string_agg(format('%I IS NOT DISTINCT FROM ($1).%1$I', a.attname), ' AND ') INTO matches
    FROM pg_catalog.pg_index i JOIN pg_catalog.pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY (i.indkey)
   WHERE i.indrelid = copy AND i.indisprimary;
  IF matches IS NULL THEN
    SELECT string_agg(format('%I IS NOT DISTINCT FROM ($1).%1$I', attname), ' AND ') INTO matches
      FROM pg_catalog.pg_attribute WHERE attrelid = copy AND attnum > 0 AND NOT attisdropped AND attgenerated = '';
  END IF;
  FOREACH target IN ARRAY TG_ARGV LOOP
    IF TG_OP = 'INSERT' THEN
      EXECUTE format('INSERT INTO %s (%s) VALUES (%s)', target, columns, row_values) USING NEW;
    ELSIF TG_OP = 'UPDATE' THEN
      EXECUTE format('UPDATE %s SET %s WHERE %s', target, assignments, matches) USING OLD, NEW;
    ELSE
      EXECUTE format('DELETE FROM %s WHERE %s', target, matches) USING OLD;
    END IF;
  END LOOP;
  IF TG_OP = 'DELETE' THEN RETURN OLD; END IF;
  RETURN NEW;
END $tessera$;
";

/// Makes the active nodes ready for worker-side relations among all the
/// catalog's nodes (`setup_sql`; a disabled node keeps its foreign server)
/// inside the current block, on the session's connections: `citus_add_node`
/// and `citus_activate_node`, which only a superuser may run.
pub(super) async fn prepare_in_block(ctx: &mut CommandContext<'_>) -> PgResult<()> {
    let relay = ctx.coordinator.links.addr.clone();
    let catalog = ctx.catalog.clone();
    for node in catalog.active_nodes() {
        let worker = ctx.parts.worker(node, crate::transaction::Access::Write).await?;
        worker.conn.execute(&setup_sql(node, &catalog.nodes, &relay)).await?;
    }
    Ok(())
}

/// Makes `node` ready for worker-side relations among `all` (`setup_sql`),
/// on a service connection of its own, when the coordinator starts or the
/// node answers again. The error names the node.
pub async fn prepare_node(config: &Config, relay: &ServerAddr, node: &Node, all: &[Node]) -> PgResult<()> {
    // Its links log in with the certificates of their roles.
    crate::connection::node_tls::provide_on_nodes(std::slice::from_ref(&node.addr), &config.service_login(), None).await?;
    PgConnection::query_once(&node.addr, &config.service_login(), &setup_sql(node, all, relay))
        .await
        .map(|_| ())
        .map_err(|e| e.with_context(format!("while preparing node {} for worker-side relations", node.addr)))
}
