//! The objects every node shares with the coordinator database: roles,
//! schemas, extensions, collations, types and functions. Statements that
//! create them reach every node as they run (`DdlPlan::Everywhere`); this
//! module brings a node up to date with what the coordinator database holds
//! when that was not so: a node added later, or objects older than their
//! propagation. Each object is read back as the DDL that recreates it, with
//! a check that tells whether a node has it already.

use crate::connection::{PgConnection, QUALIFIED_NAMES};
use crate::error::PgResult;
use crate::metadata::{Node, SYSTEM_SCHEMAS};
use crate::process::context::CommandContext;
use crate::transaction::Access;

/// One object: a boolean SQL expression true where it exists, and the
/// statements creating it (with its owner and privileges).
#[derive(Debug)]
pub struct SharedObject {
    exists: String,
    ddl: String,
}

/// Roles other than PostgreSQL's own, their memberships after all of them.
/// Reading passwords needs a superuser, as node management does.
const ROLES_SQL: &str = "
SELECT format('to_regrole(%L) IS NOT NULL', rolname),
       format('CREATE ROLE %I WITH %s %s %s %s %s %s %s CONNECTION LIMIT %s', rolname,
              CASE WHEN rolsuper THEN 'SUPERUSER' ELSE 'NOSUPERUSER' END, CASE WHEN rolinherit THEN 'INHERIT' ELSE 'NOINHERIT' END,
              CASE WHEN rolcreaterole THEN 'CREATEROLE' ELSE 'NOCREATEROLE' END, CASE WHEN rolcreatedb THEN 'CREATEDB' ELSE 'NOCREATEDB' END,
              CASE WHEN rolcanlogin THEN 'LOGIN' ELSE 'NOLOGIN' END, CASE WHEN rolreplication THEN 'REPLICATION' ELSE 'NOREPLICATION' END,
              CASE WHEN rolbypassrls THEN 'BYPASSRLS' ELSE 'NOBYPASSRLS' END, rolconnlimit)
       || coalesce(' PASSWORD ' || quote_literal(rolpassword), '') || coalesce(' VALID UNTIL ' || quote_literal(rolvaliduntil::text), '')
       , 0
FROM pg_authid WHERE oid >= 16384 AND rolname !~ '^pg_'
UNION ALL
SELECT format('EXISTS (SELECT FROM pg_auth_members WHERE roleid = to_regrole(%L) AND member = to_regrole(%L))', r.rolname, m.rolname),
       format('GRANT %I TO %I%s', r.rolname, m.rolname, CASE WHEN am.admin_option THEN ' WITH ADMIN OPTION' ELSE '' END), 1
FROM pg_auth_members am JOIN pg_roles r ON r.oid = am.roleid JOIN pg_roles m ON m.oid = am.member
WHERE am.member >= 16384
ORDER BY 3";

/// A condition: the object `{alias}.oid` of `catalog` is not an extension's.
fn not_from_extension(catalog: &str, alias: &str) -> String {
    format!("NOT EXISTS (SELECT FROM pg_depend d WHERE d.classid = '{catalog}'::regclass AND d.objid = {alias}.oid AND d.deptype = 'e')")
}

fn schemas_sql() -> String {
    format!(
        "SELECT format('to_regnamespace(%L) IS NOT NULL', n.nspname),
                format('CREATE SCHEMA IF NOT EXISTS %I AUTHORIZATION %I', n.nspname, pg_get_userbyid(n.nspowner)), 0
         FROM pg_namespace n
         WHERE n.nspname NOT IN {SYSTEM_SCHEMAS} AND n.nspname <> 'public' AND n.nspname !~ '^pg_' AND {}
         UNION ALL
         SELECT format('EXISTS (SELECT FROM pg_namespace n, aclexplode(n.nspacl) a WHERE n.nspname = %L AND a.privilege_type = %L AND a.grantee = coalesce(to_regrole(%L)::oid, 0))',
                       n.nspname, a.privilege_type, CASE WHEN a.grantee = 0 THEN 'public' ELSE pg_get_userbyid(a.grantee) END),
                format('GRANT %s ON SCHEMA %I TO %s%s', a.privilege_type, n.nspname,
                                CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE quote_ident(pg_get_userbyid(a.grantee)) END,
                                CASE WHEN a.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END), 1
         FROM pg_namespace n, aclexplode(n.nspacl) a
         WHERE n.nspname NOT IN {SYSTEM_SCHEMAS} AND n.nspname !~ '^pg_' AND a.grantee <> n.nspowner AND {}
         ORDER BY 3",
        not_from_extension("pg_namespace", "n"),
        not_from_extension("pg_namespace", "n")
    )
}

fn extensions_sql() -> String {
    format!(
        "SELECT format('EXISTS (SELECT FROM pg_extension WHERE extname = %L)', e.extname),
                format('CREATE EXTENSION IF NOT EXISTS %I WITH SCHEMA %I VERSION %L', e.extname, n.nspname, e.extversion)
         FROM pg_extension e JOIN pg_namespace n ON n.oid = e.extnamespace
         WHERE e.extname <> 'plpgsql' AND n.nspname NOT IN {SYSTEM_SCHEMAS}
         ORDER BY e.oid"
    )
}

fn collations_sql() -> String {
    format!(
        "SELECT format('to_regcollation(%L) IS NOT NULL', format('%I.%I', n.nspname, c.collname)),
                CASE c.collprovider
                  WHEN 'i' THEN format('CREATE COLLATION IF NOT EXISTS %I.%I (provider = icu, locale = %L, deterministic = %s)',
                                       n.nspname, c.collname, c.colliculocale, c.collisdeterministic::text)
                  ELSE format('CREATE COLLATION IF NOT EXISTS %I.%I (provider = libc, lc_collate = %L, lc_ctype = %L, deterministic = %s)',
                              n.nspname, c.collname, c.collcollate, c.collctype, c.collisdeterministic::text)
                END
         FROM pg_collation c JOIN pg_namespace n ON n.oid = c.collnamespace
         WHERE n.nspname NOT IN {SYSTEM_SCHEMAS} AND n.nspname !~ '^pg_' AND {}
         ORDER BY c.oid",
        not_from_extension("pg_collation", "c")
    )
}

/// Enums, composite types, domains, ranges and functions, in the order they
/// were created (so that each comes after what it uses). Functions whose
/// signature names a table's row type are left out: a worker holds shards,
/// not tables, so it has no such type (and queries sent to the shards
/// cannot use them); one that fails for another missing type is skipped
/// rather than failing the rest.
fn types_and_functions_sql() -> String {
    let collate = "CASE WHEN a.attcollation <> at.typcollation THEN ' COLLATE ' || a.attcollation::regcollation::text ELSE '' END";
    format!(
        "SELECT format('to_regtype(%L) IS NOT NULL', format('%I.%I', n.nspname, t.typname)),
                CASE t.typtype
                  WHEN 'e' THEN format('CREATE TYPE %I.%I AS ENUM (%s)', n.nspname, t.typname,
                                       (SELECT string_agg(quote_literal(e.enumlabel), ', ' ORDER BY e.enumsortorder) FROM pg_enum e WHERE e.enumtypid = t.oid))
                  WHEN 'c' THEN format('CREATE TYPE %I.%I AS (%s)', n.nspname, t.typname,
                                       (SELECT string_agg(format('%I %s', a.attname, format_type(a.atttypid, a.atttypmod)) || {collate}, ', ' ORDER BY a.attnum)
                                        FROM pg_attribute a JOIN pg_type at ON at.oid = a.atttypid
                                        WHERE a.attrelid = t.typrelid AND a.attnum > 0 AND NOT a.attisdropped))
                  WHEN 'd' THEN format('CREATE DOMAIN %I.%I AS %s', n.nspname, t.typname, format_type(t.typbasetype, t.typtypmod))
                                || CASE WHEN t.typcollation <> bt.typcollation THEN ' COLLATE ' || t.typcollation::regcollation::text ELSE '' END
                                || coalesce(' DEFAULT ' || t.typdefault, '') || CASE WHEN t.typnotnull THEN ' NOT NULL' ELSE '' END
                                || coalesce((SELECT string_agg(format('; ALTER DOMAIN %I.%I ADD CONSTRAINT %I %s', n.nspname, t.typname, c.conname, pg_get_constraintdef(c.oid)), '' ORDER BY c.oid)
                                             FROM pg_constraint c WHERE c.contypid = t.oid), '')
                  WHEN 'r' THEN (SELECT format('CREATE TYPE %I.%I AS RANGE (subtype = %s, subtype_opclass = %I.%I%s%s%s, multirange_type_name = %s)', n.nspname, t.typname,
                                               format_type(r.rngsubtype, NULL), opn.nspname, opc.opcname,
                                               CASE WHEN r.rngcollation <> 0 THEN ', collation = ' || r.rngcollation::regcollation::text ELSE '' END,
                                               CASE WHEN r.rngcanonical <> 0 THEN ', canonical = ' || r.rngcanonical::regproc::text ELSE '' END,
                                               CASE WHEN r.rngsubdiff <> 0 THEN ', subtype_diff = ' || r.rngsubdiff::regproc::text ELSE '' END,
                                               r.rngmultitypid::regtype::text)
                                 FROM pg_range r JOIN pg_opclass opc ON opc.oid = r.rngsubopc JOIN pg_namespace opn ON opn.oid = opc.opcnamespace
                                 WHERE r.rngtypid = t.oid)
                END
                || format('; ALTER %s %I.%I OWNER TO %I', CASE t.typtype WHEN 'd' THEN 'DOMAIN' ELSE 'TYPE' END, n.nspname, t.typname, pg_get_userbyid(t.typowner)),
                t.oid
         FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace LEFT JOIN pg_type bt ON bt.oid = t.typbasetype
         WHERE n.nspname NOT IN {SYSTEM_SCHEMAS} AND n.nspname !~ '^pg_' AND {}
           AND (t.typtype IN ('e', 'd', 'r') OR (t.typtype = 'c' AND (SELECT relkind FROM pg_class WHERE oid = t.typrelid) = 'c'))
         UNION ALL
         SELECT format('to_regprocedure(%L) IS NOT NULL', p.oid::regprocedure::text), {FUNCTION_DDL}, p.oid
         FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
         WHERE p.prokind IN ('f', 'p', 'w') AND n.nspname NOT IN {SYSTEM_SCHEMAS} AND n.nspname !~ '^pg_' AND {}
           AND NOT EXISTS (SELECT FROM {SIGNATURE_TABLES} WHERE sc.relkind <> 'c')
         ORDER BY 3",
        not_from_extension("pg_type", "t"),
        // Nor made along with a type (a range type's constructors).
        not_from_extension("pg_proc", "p").replace("= 'e'", "IN ('e', 'i')")
    )
}

/// The statement making the function `p` on a node, with its owner; a
/// function whose types the node lacks is skipped.
const FUNCTION_DDL: &str = "format('DO $tessera$ BEGIN EXECUTE %L; EXECUTE %L; EXCEPTION WHEN undefined_object THEN NULL; END $tessera$',
                       pg_get_functiondef(p.oid),
                       format('ALTER %s %s OWNER TO %I', CASE p.prokind WHEN 'p' THEN 'PROCEDURE' ELSE 'FUNCTION' END, p.oid::regprocedure, pg_get_userbyid(p.proowner)))";

/// The relations (`sc`) whose row type, or an array of it, the function
/// `p` takes or returns.
const SIGNATURE_TABLES: &str = "unnest(coalesce(p.proallargtypes, p.proargtypes::oid[]) || p.prorettype) sig(t)
                           JOIN pg_type st ON st.oid = sig.t OR st.typarray = sig.t
                           JOIN pg_class sc ON sc.oid = st.typrelid";

/// The statements making, on a node, the functions over the row types of
/// the tables `oids`: a node has such a table's row type only once the
/// table is distributed, so a function created before could not reach it.
pub async fn functions_over_tables(local: &mut PgConnection, oids: &[u32]) -> PgResult<Vec<String>> {
    let list = oids.iter().map(u32::to_string).collect::<Vec<_>>().join(", ");
    let sql = format!(
        "SELECT {FUNCTION_DDL} FROM pg_proc p
          WHERE p.prokind IN ('f', 'p', 'w') AND EXISTS (SELECT FROM {SIGNATURE_TABLES} WHERE sc.oid IN ({list}))
          ORDER BY p.oid"
    );
    let saved = local.set_for_now(&QUALIFIED_NAMES).await?;
    let rows = local.query(&sql).await;
    let rows = local.restore_after(saved, rows).await?;
    Ok(rows.into_iter().filter_map(|r| r.into_iter().next().flatten()).collect())
}

/// Every shared object of the coordinator database, in an order that creates
/// each after what it depends on; roles only when `with_roles`. Names in
/// the statements and checks are qualified, as a node needs them whatever
/// the session's search_path.
pub async fn read(local: &mut PgConnection, with_roles: bool) -> PgResult<Vec<SharedObject>> {
    let mut queries = vec![schemas_sql(), extensions_sql(), collations_sql(), types_and_functions_sql()];
    if with_roles {
        queries.insert(0, ROLES_SQL.to_string());
    }
    let saved = local.set_for_now(&QUALIFIED_NAMES).await?;
    let objects = read_objects(local, &queries).await;
    local.restore_after(saved, objects).await
}

/// The objects `queries` (each giving a check, the DDL, and an order) list.
async fn read_objects(local: &mut PgConnection, queries: &[String]) -> PgResult<Vec<SharedObject>> {
    let mut objects = Vec::new();
    for sql in queries {
        for row in local.query(sql).await? {
            if let [Some(exists), Some(ddl), ..] = row.as_slice() {
                objects.push(SharedObject { exists: exists.clone(), ddl: ddl.clone() });
            }
        }
    }
    Ok(objects)
}

/// Most checks in one query (PostgreSQL allows 1664 result columns).
const CHECKS_PER_QUERY: usize = 1000;

/// Serializes catch-ups on a node: sessions distributing tables at the same
/// time would otherwise create the same objects side by side (and fail).
const CATCH_UP_LOCK: i64 = 7_482_912;

/// Creates on each of `nodes` the objects it lacks, inside the current
/// block (one node failing undoes them all). The nodes are asked what they
/// lack all at once.
pub async fn create_missing(ctx: &mut CommandContext<'_>, nodes: &[Node], objects: &[SharedObject]) -> PgResult<()> {
    if objects.is_empty() {
        return Ok(());
    }
    let checks = super::connections_to(ctx.parts, nodes)
        .await?
        .into_iter()
        .map(|worker| async move { (worker.group_id, missing_on(&mut worker.conn, objects).await) });
    let mut lacking = Vec::new();
    for (group, missing) in futures::future::join_all(checks).await {
        if !missing?.is_empty() {
            lacking.push(group);
        }
    }
    for node in nodes.iter().filter(|node| lacking.contains(&node.group_id)) {
        let worker = ctx.parts.worker(node, Access::Write).await?;
        // Look again once no other session is catching this node up.
        worker.conn.execute(&format!("SELECT pg_advisory_xact_lock({CATCH_UP_LOCK})")).await?;
        let missing = missing_on(&mut worker.conn, objects).await?;
        if !missing.is_empty() {
            worker.conn.execute(&format!("SET LOCAL check_function_bodies = off;\n{}", missing.join(";\n"))).await?;
        }
    }
    Ok(())
}

/// The DDL of the objects `conn`'s node lacks.
async fn missing_on(conn: &mut PgConnection, objects: &[SharedObject]) -> PgResult<Vec<String>> {
    let mut missing = Vec::new();
    for chunk in objects.chunks(CHECKS_PER_QUERY) {
        let checks: Vec<&str> = chunk.iter().map(|o| o.exists.as_str()).collect();
        let found = conn.query(&format!("SELECT {}", checks.join(", "))).await?.into_iter().next().unwrap_or_default();
        missing.extend(chunk.iter().zip(found).filter(|(_, there)| there.as_deref() != Some("t")).map(|(o, _)| o.ddl.clone()));
    }
    Ok(missing)
}
