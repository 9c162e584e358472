//! Delegated calls on their function's per-shard copies
//! (planner/function_copy.rs). A copy is made on its node the first time a
//! call finds none there: the call fails while PostgreSQL looks its function
//! up, before anything ran, and goes again once the copy exists. That retry
//! is safe only when the call is its node's whole transaction, so copies
//! serve calls outside transaction blocks and outside pipelines; the others
//! call the function itself.

use super::router::run_router;
use super::Mode;
use crate::config::Config;
use crate::config::Login;
use crate::connection::client::ClientConn;
use crate::connection::{quote_literal, PgConnection};
use crate::error::{PgError, PgResult};
use crate::metadata::Catalog;
use crate::planner::function_copy::{
    copy_schema, copy_sql, drop_copies_sql, helper_names, like_escaped, shard_id_named_in, tables_named_again, without_copy_schemas, CopyTarget,
    COPY_LOCK, COPY_SCHEMA_PREFIX,
};
use crate::planner::{CopiedCall, Delegation};
use crate::protocol::{backend, Message};
use crate::transaction::Participants;
use std::collections::HashSet;
use std::sync::atomic::Ordering;

/// Runs a delegated call: on the per-shard copy of its function when it has
/// one and the call is a transaction of its own, else on the function.
pub async fn run_delegated(
    delegation: &Delegation,
    parts: &mut Participants,
    catalog: &Catalog,
    mode: &Mode<'_>,
    client: &mut ClientConn,
    config: &Config,
) -> PgResult<()> {
    let alone = parts.holds_no_connection() && !matches!(mode, Mode::Extended { sync: false, .. });
    let usable = alone && !delegation.copy_failed.load(Ordering::Relaxed);
    let (Some(copy), true) = (delegation.copy.as_deref(), usable) else {
        return run_router(&delegation.call, parts, catalog, mode, client).await;
    };
    let Some(copied) = copy.template.copied_call() else { return run_router(&delegation.call, parts, catalog, mode, client).await };
    match run_router(copy, parts, catalog, mode, client).await {
        Err(e) if names_missing_copy(&e) => match make_copy(&e, copied, catalog, &config.service_login()).await {
            Ok(()) => run_router(copy, parts, catalog, mode, client).await.map_err(|e| as_called(e, copied, catalog)),
            Err(failure) => {
                tracing::warn!("calling {} itself: {failure}", copied.signature);
                delegation.copy_failed.store(true, Ordering::Relaxed);
                run_router(&delegation.call, parts, catalog, mode, client).await
            }
        },
        result => result.map_err(|e| as_called(e, copied, catalog)),
    }
}

/// Passes a worker's notice on, naming the function the client called where
/// it names a copy (a RAISE inside one gives its name as CONTEXT).
pub fn relay_notice(msg: &Message, client: &mut ClientConn) {
    let prefix = COPY_SCHEMA_PREFIX.as_bytes();
    if !msg.frame().windows(prefix.len()).any(|w| w == prefix) {
        client.out().extend_from_slice(msg.frame());
        return;
    }
    match backend::decode_error_fields(msg) {
        Ok(notice) => backend::notice_response(client.out(), &notice.map_texts(without_copy_schemas)),
        Err(_) => client.out().extend_from_slice(msg.frame()),
    }
}

/// An error about a copy (or its schema) that does not exist on the node.
fn names_missing_copy(e: &PgError) -> bool {
    matches!(e.code(), "42883" | "3F000") && e.message().contains(COPY_SCHEMA_PREFIX)
}

/// The error as a call of the function itself would have raised it.
fn as_called(e: PgError, copied: &CopiedCall, catalog: &Catalog) -> PgError {
    e.map_texts(|text| tables_named_again(&without_copy_schemas(text), &copied.anchor, catalog))
}

/// Makes the copy the error found missing, on the node holding its shard
/// group, with the function's owner and privileges, and the copies of the
/// SQL functions it calls through theirs; copies of the group made under
/// older catalog versions go.
async fn make_copy(missing: &PgError, copied: &CopiedCall, catalog: &Catalog, login: &Login) -> PgResult<()> {
    let anchor = &copied.anchor;
    let shard = shard_id_named_in(missing.message())
        .and_then(|id| anchor.shards.iter().find(|s| s.id == id))
        .ok_or_else(|| PgError::internal(format!("no shard of {} for {}", anchor.name, missing.message())))?;
    let group = *shard.placements.first().ok_or_else(|| PgError::internal(format!("shard {} has no placement", shard.id)))?;
    let node = super::router::node_of_group(catalog, group)?;
    let schema = copy_schema(shard.id, copied.catalog_version);
    let mut conn = PgConnection::connect(&node.addr, login).await?;
    let result = async {
        conn.execute(&format!("BEGIN; SELECT pg_advisory_xact_lock({COPY_LOCK})")).await?;
        let overloaded = overloaded_helpers(&mut conn, &helper_names(catalog, anchor.colocation_id)).await?;
        let target = CopyTarget { schema: &schema, anchor, index: shard.index, overloaded: &overloaded };
        let copy = copy_sql(&definition_of(&mut conn, &copied.signature).await?, &target, copied.argument, catalog)?;
        let mut script =
            format!("{}; CREATE SCHEMA IF NOT EXISTS {schema}; GRANT USAGE ON SCHEMA {schema} TO PUBLIC", drop_older_sql(shard.id, &schema));
        // The SQL functions the copy calls through their copies.
        for function in &copy.calls {
            let Some((argument, _)) = function.distribution else { continue };
            let called = copy_sql(&definition_of(&mut conn, &function.signature).await?, &target, argument, catalog)?;
            script += &format!("; {}; {}", called.create, owner_and_privileges_sql(&function.signature, &schema));
        }
        script += &format!("; {}; {}; COMMIT", copy.create, owner_and_privileges_sql(&copied.signature, &schema));
        conn.execute(&script).await
    }
    .await
    .map_err(|e| e.with_context(format!("while making the copy of {} for shard {} on node {}", copied.signature, shard.id, node.addr)));
    conn.terminate().await;
    result.map(|_| ())
}

/// Which of `names` more than one function carries on the node (copy
/// schemas aside).
async fn overloaded_helpers(conn: &mut PgConnection, names: &[&str]) -> PgResult<HashSet<String>> {
    if names.is_empty() {
        return Ok(HashSet::new());
    }
    let names: Vec<String> = names.iter().map(|n| quote_literal(n)).collect();
    let rows = conn
        .query(&format!(
            "SELECT p.proname FROM pg_catalog.pg_proc p JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace
              WHERE p.proname IN ({}) AND n.nspname NOT LIKE {} GROUP BY p.proname HAVING count(*) > 1",
            names.join(", "),
            quote_literal(&format!("{}%", like_escaped(COPY_SCHEMA_PREFIX)))
        ))
        .await?;
    Ok(rows.into_iter().filter_map(|row| row.into_iter().next().flatten()).collect())
}

/// The text of the routine `signature` on the node.
async fn definition_of(conn: &mut PgConnection, signature: &str) -> PgResult<String> {
    conn.query_value(&format!("SELECT pg_catalog.pg_get_functiondef({}::pg_catalog.regprocedure)", quote_literal(signature)))
        .await?
        .ok_or_else(|| PgError::internal(format!("no definition of {signature}")))
}

/// Drops the copy schemas of shard `shard_id` other than `schema`.
fn drop_older_sql(shard_id: i64, schema: &str) -> String {
    drop_copies_sql(&format!("{}{shard_id}{}%", like_escaped(COPY_SCHEMA_PREFIX), like_escaped("_v")), schema)
}

/// Gives the copy in `schema` of the routine `signature` that routine's
/// owner and EXECUTE privileges.
fn owner_and_privileges_sql(signature: &str, schema: &str) -> String {
    format!(
        "DO $tessera$ DECLARE p pg_catalog.pg_proc; target text; e record; BEGIN
           SELECT * INTO p FROM pg_catalog.pg_proc WHERE oid = {}::pg_catalog.regprocedure;
           target := format('%I.%I(%s)', {}, p.proname, pg_catalog.pg_get_function_identity_arguments(p.oid));
           EXECUTE format('ALTER ROUTINE %s OWNER TO %s', target, p.proowner::regrole);
           IF p.proacl IS NOT NULL THEN
             EXECUTE format('REVOKE ALL ON ROUTINE %s FROM PUBLIC, %s', target, p.proowner::regrole);
             FOR e IN SELECT * FROM pg_catalog.aclexplode(p.proacl) LOOP
               EXECUTE format('GRANT EXECUTE ON ROUTINE %s TO %s%s', target,
                              CASE WHEN e.grantee = 0 THEN 'PUBLIC' ELSE e.grantee::regrole::text END,
                              CASE WHEN e.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END);
             END LOOP;
           END IF;
         END $tessera$",
        quote_literal(signature),
        quote_literal(schema)
    )
}
