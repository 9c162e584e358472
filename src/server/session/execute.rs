//! From a plan to its execution: which executor, command or relay each kind
//! of plan goes to, SQL PREPARE/EXECUTE, and transaction control.

use super::*;
use crate::planner::ExplainPlan;

impl Session {
    pub(super) fn check_not_failed(&self, plan: &Plan) -> Result<(), Failure> {
        let ends_block =
            matches!(plan, Plan::Transaction(TransactionCommand::Commit | TransactionCommand::Rollback | TransactionCommand::RollbackTo(_)));
        if self.parts.is_failed() && !ends_block {
            return Err(Participants::failed_error().into());
        }
        Ok(())
    }

    /// Runs a statement that is not plain pass-through. `extended` carries the
    /// client's Bind and the statement's shape for the extended protocol.
    /// One whose work spans several nodes or the coordinator runs under its
    /// limits (`transaction::limits`): its timeout, the client's cancel
    /// request and its memory stop all of it.
    pub(super) async fn run_distributed(&mut self, sql: &str, plan: &Plan, extended: Option<(&Bind, &Shape)>) -> Result<(), Failure> {
        let limits = self.parts.limits().clone();
        if !watched(plan) || limits.is_armed() {
            return self.execute_plan(sql, plan, extended).await;
        }
        let timeout = self.parts.statement_timeout().await?;
        let memory = self.parts.citus_settings().await?.max_statement_memory.limit(self.coordinator.config.statements.memory_limit())?;
        limits.arm(sql, timeout, memory);
        let result = limits.enforce(self.execute_plan(sql, plan, extended)).await;
        let result = match result {
            Err(Failure::Error(e)) => Err(Failure::Error(limits.reported(e))),
            other => other,
        };
        limits.disarm();
        result
    }

    pub(super) async fn execute_plan(&mut self, sql: &str, plan: &Plan, extended: Option<(&Bind, &Shape)>) -> Result<(), Failure> {
        let catalog = self.catalog_to_run_under();
        if let Some(tier) = statistics::tier_of(plan) {
            self.ran_tier = Some(tier);
        }
        if let Some(check) = shell_check(plan) {
            let param_types = extended.map_or(&[][..], |(_, shape)| shape.param_types.as_slice());
            self.check_on_shells(sql, param_types, check).await?;
        }
        match plan {
            Plan::Empty | Plan::Local => unreachable!("pass-through statements are forwarded"),
            Plan::Unsupported(e) => {
                // PostgreSQL's own complaint (an unknown column, say) is the more
                // useful one; the coordinator database checks against the shells.
                if extended.is_none() {
                    self.describe_shape(sql, &[]).await?;
                }
                return Err(e.clone().into());
            }
            Plan::Transaction(command) => {
                let tag = self.transaction_command(command).await?;
                backend::command_complete(self.client.out(), tag);
            }
            Plan::SqlPrepare(prepare) => {
                // Prepared on the coordinator database too: checked against the
                // shells, typed, and listed in pg_prepared_statements.
                let tag = self.parts.local().await?.execute(sql).await?;
                self.sql_prepared.insert(prepare.name.clone(), (sql.to_string(), prepare.statement.clone()));
                backend::command_complete(self.client.out(), &tag);
            }
            Plan::SqlExecute(execute) => self.execute_prepared(sql, execute, extended).await?,
            Plan::Explain(explain) if matches!(explain.inner, Plan::SqlExecute(_)) => {
                let Plan::SqlExecute(execute) = &explain.inner else { unreachable!("matched above") };
                self.explain_prepared(sql, explain, execute, extended).await?
            }
            Plan::SqlDeallocate(name) => {
                let tag = self.parts.local().await?.execute(sql).await?;
                match name {
                    Some(name) => {
                        self.sql_prepared.remove(name);
                    }
                    None => self.sql_prepared.clear(),
                }
                backend::command_complete(self.client.out(), &tag);
            }
            Plan::ClusterFunction(_) if !self.distributed => {
                let home = &self.coordinator.config.coordinator_db.database;
                let refusal = PgError::not_supported(format!(
                    "Tessera distributes the tables of database \"{home}\" only; this session's database is a plain PostgreSQL database without workers"
                ))
                .with_hint(format!("Connect to database \"{home}\" to distribute tables (for test runners, see \"Other databases\" in docs/operations.md)."));
                return Err(refusal.into());
            }
            Plan::ClusterFunction(call) => {
                let mut ctx =
                    CommandContext { coordinator: &self.coordinator, parts: &mut self.parts, caller: Caller::Client(&mut self.client), catalog };
                let bound = extended.map(|(bind, shape)| (bind, shape.param_types.as_slice()));
                commands::run_cluster_function(call, &mut ctx, bound).await?;
                if call.function.changes_tables() && self.parts.in_block() {
                    self.load_block_catalog().await?;
                }
            }
            Plan::Ddl(ddl) => {
                let mut ctx =
                    CommandContext { coordinator: &self.coordinator, parts: &mut self.parts, caller: Caller::Client(&mut self.client), catalog };
                commands::run_ddl(ddl, sql, &mut ctx).await?;
                if ddl.changes_catalog() && self.parts.in_block() {
                    self.load_block_catalog().await?;
                }
            }
            executed_plan => {
                let mode = execution_mode(extended, self.client.peek_tag() == Some(b'S'));
                let mut ctx = ExecutionContext {
                    coordinator: &self.coordinator,
                    catalog: &catalog,
                    parts: &mut self.parts,
                    client: &mut self.client,
                    sql,
                    mode,
                };
                match executor::execute(executed_plan, &mut ctx).await? {
                    Executed::Done => {}
                    Executed::Instead(instead) => Box::pin(self.run_distributed(sql, instead, extended)).await?,
                    Executed::Replanned(replanned) => Box::pin(self.run_distributed(sql, &replanned, extended)).await?,
                }
            }
        }
        Ok(())
    }

    /// SQL EXECUTE. A statement prepared over distributed tables runs like an
    /// extended-protocol execution, with the arguments evaluated (and typed) by
    /// the coordinator database; any other is the coordinator database's own.
    pub(super) async fn execute_prepared(&mut self, sql: &str, execute: &SqlExecute, extended: Option<(&Bind, &Shape)>) -> Result<(), Failure> {
        let Some((bound, planned)) = self.bound_or_forwarded(sql, "EXECUTE", execute, extended).await? else { return Ok(()) };
        let Some(inner) = planned.statements.first() else { return Err(PgError::internal("a prepared statement without a statement").into()) };
        let shape = self.describe_shape(&bound.statement, &bound.param_types).await?;
        if let Some(fields) = &shape.fields {
            backend::row_description(self.client.out(), fields);
        }
        let params = bound.values.into_iter().map(|v| v.map(bytes::Bytes::from)).collect();
        let bind = Bind { portal: String::new(), statement: String::new(), param_formats: Vec::new(), params, result_formats: Vec::new() };
        Box::pin(self.run_distributed(&bound.statement, &inner.plan, Some((&bind, &shape)))).await
    }

    /// EXPLAIN EXECUTE: a statement prepared over distributed tables is
    /// explained with its arguments written in as typed literals (the plan
    /// of an execution with those values); any other by the coordinator
    /// database.
    async fn explain_prepared(
        &mut self,
        sql: &str,
        explain: &ExplainPlan,
        execute: &SqlExecute,
        extended: Option<(&Bind, &Shape)>,
    ) -> Result<(), Failure> {
        let Some((bound, _)) = self.bound_or_forwarded(sql, "EXPLAIN EXECUTE", execute, extended).await? else { return Ok(()) };
        let arguments: Vec<(Option<String>, String)> = bound.values.into_iter().zip(bound.type_names).collect();
        let explained = explain.explain_sql(&planner::statement_with_arguments(&bound.statement, &arguments)?);
        let planned = self.plan(&explained);
        let Some(inner) = planned.statements.first() else { return Err(PgError::internal("EXPLAIN without a statement").into()) };
        if matches!(inner.plan, Plan::Local | Plan::Empty) {
            return Ok(executor::run_on_coordinator_db(&mut self.parts, sql, &Mode::Simple, &mut self.client).await?);
        }
        Box::pin(self.run_distributed(&explained, &inner.plan, None)).await
    }

    /// For `command` (EXECUTE or EXPLAIN EXECUTE) of `sql`: the statement
    /// the session prepared over distributed tables, bound by the
    /// arguments, and its plan; None once the coordinator database has answered `sql`
    /// itself, the statement being its own or no longer over distributed
    /// tables (one was undistributed).
    async fn bound_or_forwarded(
        &mut self,
        sql: &str,
        command: &str,
        execute: &SqlExecute,
        extended: Option<(&Bind, &Shape)>,
    ) -> Result<Option<(BoundPrepared, Arc<CachedPlan>)>, Failure> {
        if extended.is_some() && self.sql_prepared.contains_key(&execute.name) {
            return Err(simple_protocol_only(command).into());
        }
        let bound = self.bound_prepared(execute).await?;
        let planned = bound.as_ref().map(|bound| self.plan(&bound.statement));
        match (bound, planned) {
            (Some(bound), Some(planned)) if !matches!(planned.statements.first().map(|s| &s.plan), Some(Plan::Local | Plan::Empty)) => {
                Ok(Some((bound, planned)))
            }
            _ => {
                let mode = execution_mode(extended, false);
                executor::run_on_coordinator_db(&mut self.parts, sql, &mode, &mut self.client).await?;
                Ok(None)
            }
        }
    }

    /// The statement EXECUTE names, when the session prepared it over
    /// distributed tables, with its parameters' types and the arguments'
    /// values, evaluated by the coordinator database; None for a statement
    /// that is the coordinator database's own.
    async fn bound_prepared(&mut self, execute: &SqlExecute) -> Result<Option<BoundPrepared>, Failure> {
        let Some((prepared_by, statement)) = self.sql_prepared.get(&execute.name).cloned() else { return Ok(None) };
        let local = self.parts.local().await?;
        // One row per parameter (one with NULLs when there are none); no row
        // when the statement is gone or was replaced (DISCARD ALL, then a new
        // PREPARE over local tables): then it is the coordinator database's.
        let rows = local
            .query(&format!(
                "SELECT t::oid, format_type(t, NULL) FROM pg_catalog.pg_prepared_statements p
                 LEFT JOIN LATERAL unnest(p.parameter_types) WITH ORDINALITY u(t, i) ON true WHERE p.name = {} AND p.statement = {} ORDER BY i",
                quote_literal(&execute.name),
                quote_literal(&prepared_by)
            ))
            .await?;
        if rows.is_empty() {
            self.sql_prepared.remove(&execute.name);
            return Ok(None);
        }
        let types: Vec<_> = rows.into_iter().filter(|r| r[0].is_some()).collect();
        if types.len() != execute.arguments.len() {
            return Err(PgError::new(sqlstate::SYNTAX_ERROR, format!("wrong number of parameters for prepared statement \"{}\"", execute.name))
                .with_detail(format!("Expected {} parameters but got {}.", types.len(), execute.arguments.len()))
                .into());
        }
        let param_types: Vec<u32> = types.iter().map(|t| t[0].as_deref().and_then(|oid| oid.parse().ok()).unwrap_or(0)).collect();
        let type_names: Vec<String> = types.iter().map(|t| t[1].clone().unwrap_or_else(|| "text".to_string())).collect();
        let values = if types.is_empty() {
            Vec::new()
        } else {
            let casts: Vec<String> = execute.arguments.iter().zip(&type_names).map(|(arg, t)| format!("(({arg})::{t})::text")).collect();
            local.query(&format!("SELECT {}", casts.join(", "))).await?.into_iter().next().unwrap_or_default()
        };
        Ok(Some(BoundPrepared { statement, param_types, type_names, values }))
    }

    pub(super) async fn transaction_command(&mut self, command: &TransactionCommand) -> PgResult<&'static str> {
        Ok(match command {
            TransactionCommand::Begin { sql } => {
                if let Some(warning) = self.parts.begin(sql) {
                    backend::notice_response(self.client.out(), &warning);
                }
                "BEGIN"
            }
            TransactionCommand::Commit => {
                if !self.parts.in_block() {
                    backend::notice_response(self.client.out(), &PgError::warning("25P01", "there is no transaction in progress"));
                }
                let tag = self.parts.commit().await;
                self.end_block_catalog().await;
                tag?
            }
            TransactionCommand::Rollback => {
                if !self.parts.in_block() {
                    backend::notice_response(self.client.out(), &PgError::warning("25P01", "there is no transaction in progress"));
                }
                let result = self.parts.rollback().await;
                self.end_block_catalog().await;
                result?;
                "ROLLBACK"
            }
            TransactionCommand::Savepoint(name) => {
                self.parts.savepoint(name).await?;
                "SAVEPOINT"
            }
            TransactionCommand::Release(name) => {
                self.parts.release(name).await?;
                "RELEASE"
            }
            TransactionCommand::RollbackTo(name) => {
                self.parts.rollback_to(name).await?;
                if self.block_catalog.is_some() {
                    self.load_block_catalog().await?;
                }
                "ROLLBACK"
            }
        })
    }
}

/// A statement prepared over distributed tables, bound by EXECUTE's arguments.
struct BoundPrepared {
    statement: String,
    param_types: Vec<u32>,
    /// The parameters' SQL type names, as `format_type` gives them.
    type_names: Vec<String>,
    /// The arguments' values as text (None for NULL).
    values: Vec<Option<String>>,
}

fn simple_protocol_only(command: &str) -> PgError {
    PgError::not_supported(format!("{command} of a statement prepared over distributed tables works through the simple query protocol only"))
        .with_hint("Use the extended protocol's own prepared statements (Parse/Bind/Execute).")
}
