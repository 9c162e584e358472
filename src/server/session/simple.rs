//! The simple query protocol: a Query message's statements, planned and run
//! one after another, each answered as PostgreSQL answers it.

use super::*;

impl Session {
    // ---- simple query protocol ----

    pub(super) async fn simple_query(&mut self, msg: &Message) -> anyhow::Result<()> {
        self.settle_stream().await;
        let sql = frontend::decode_query(msg)?.to_string();
        self.query_text.clear();
        self.query_text.push_str(&sql);
        if let Err(f) = self.follow_search_path().await {
            self.report(f);
            backend::ready_for_query(self.client.out(), self.parts.status());
            return Ok(self.client.flush().await?);
        }
        if let Err(f) = self.check_catalog(&sql).await {
            self.report(f);
            backend::ready_for_query(self.client.out(), self.parts.status());
            return Ok(self.client.flush().await?);
        }
        let mut planned = self.plan(&sql);
        // A search_path change before the last statement may make a later
        // one distributed: those go one by one.
        let path_changes_midway = planned.statements.iter().rev().skip(1).any(|s| self.moves_names(s));
        let all_local = !path_changes_midway && planned.statements.iter().all(|s| matches!(s.plan, Plan::Local | Plan::Empty));
        let mut one_by_one = !all_local || self.parts.is_failed();
        if !one_by_one {
            // The common pass-through case: the whole string, in one message.
            // A lone write outside a block that waited for the lock of a
            // table being distributed is sent again, to the shards, once the
            // distribution has committed.
            let lone_statement = planned.statements.len() == 1 && !self.parts.in_block();
            let distributed_meanwhile = match self.parts.local().await {
                Ok(local) => {
                    local.out().extend_from_slice(msg.frame());
                    self.relay_local_until_ready(lone_statement).await.unwrap_or_else(|f| {
                        self.report(f);
                        false
                    })
                }
                Err(e) => {
                    self.report(e.into());
                    false
                }
            };
            if planned.statements.iter().any(|s| s.changes_user_code) {
                if let Err(f) = self.see_user_code_change().await {
                    self.report(f);
                }
            }
            if distributed_meanwhile {
                // Sent again only under a catalog that knows the distribution.
                match self.coordinator.reload_catalog().await {
                    Ok(()) => {
                        planned = self.plan(&sql);
                        one_by_one = true;
                    }
                    Err(e) => self.report(self.coordinator.catalog_refusal(&e).into()),
                }
            }
        }
        if one_by_one {
            let mut i = 0;
            let mut retried = false;
            while let Some(stmt) = planned.statements.get(i) {
                if self.hold_for_fences(&stmt.plan).await {
                    planned = self.plan(&sql);
                    continue;
                }
                let written = self.client.out().len();
                let result = self.execute_simple(stmt).await;
                if let Err(f) = &result {
                    if planned.statements.len() == 1 && !retried && self.client.out().len() == written && self.shard_gone(f, planned.version).await {
                        retried = true;
                        planned = self.plan(&sql);
                        continue;
                    }
                }
                // Outside a block, distributed DDL has reloaded the catalog already.
                let mut result = result;
                if stmt.changes_user_code && (self.parts.in_block() || !matches!(stmt.plan, Plan::Ddl(_))) {
                    if let Err(f) = self.see_user_code_change().await {
                        result = result.and(Err(f));
                    }
                }
                if let Err(f) = result {
                    self.report(f);
                    break;
                }
                self.parts.settle_links().await;
                i += 1;
                // A statement that changed the catalog (create_distributed_table,
                // DROP TABLE, …) or the search_path changes how the statements
                // after it must run: where unqualified names lead is read
                // again after each such statement, not once per string, as
                // before each extended-protocol statement.
                self.search_path.stale |= self.moves_names(stmt);
                if let Err(f) = self.follow_search_path().await {
                    self.report(f);
                    break;
                }
                if self.catalog().version != planned.version || self.search_path.generation != planned.search_path {
                    planned = self.plan(&sql);
                }
            }
        }
        self.parts.observe_local_status();
        self.release_deadlocked_work().await;
        self.parts.settle_links().await;
        backend::ready_for_query(self.client.out(), self.parts.status());
        self.client.flush().await?;
        self.parts.release_connections(true).await;
        Ok(())
    }

    /// Whether a statement outside a block failed because a shard it reads or
    /// writes was dropped while it waited for it (undistribute_table,
    /// alter_distributed_table), and the catalog, reloaded now, has changed
    /// since `planned_version`: planned again, it goes where the table is now.
    pub(super) async fn shard_gone(&mut self, failure: &Failure, planned_version: i64) -> bool {
        let Failure::Error(e) = failure else { return false };
        if e.code() != sqlstate::UNDEFINED_TABLE || self.parts.in_block() || self.coordinator.reload_catalog().await.is_err() {
            return false;
        }
        self.catalog().version != planned_version
    }

    /// Waits while a shard group the statement may write to is being cut
    /// over to another node (see `operations::fence`). True when it waited:
    /// the catalog changed, and the statement must be planned again.
    pub(super) async fn hold_for_fences(&mut self, plan: &Plan) -> bool {
        let parts = &self.parts;
        let wrote_on = |group: i32| parts.wrote_on(group);
        let block = parts.block_started().map(|started| (started, &wrote_on as &dyn Fn(i32) -> bool));
        let Some(mut lifted) = self.coordinator.fences.holding(plan, block) else { return false };
        let _ = lifted.wait_for(|lifted| *lifted).await;
        true
    }

    pub(super) async fn release_deadlocked_work(&mut self) {
        if std::mem::take(&mut self.release_work) {
            self.parts.release_failed_work().await;
        }
    }

    pub(super) async fn execute_simple(&mut self, stmt: &PlannedStatement) -> Result<(), Failure> {
        self.check_not_failed(&stmt.plan)?;
        match &stmt.plan {
            Plan::Empty => backend::empty_query_response(self.client.out()),
            Plan::Local => {
                let local = self.parts.local().await?;
                frontend::query(local.out(), &stmt.sql);
                self.relay_local_until_ready(false).await?;
                self.parts.observe_local_status();
                // Known only now that it ran (statements before it in the
                // same query string may have used the workers, or begun the
                // block whose end may undo it).
                if stmt.changes_role {
                    self.parts.role_may_have_changed();
                }
                if stmt.changes_settings {
                    self.parts.settings_may_have_changed(&stmt.custom_settings, stmt.changes_followed_settings);
                }
            }
            other => self.execute_distributed(&stmt.sql, other, None).await?,
        }
        Ok(())
    }
}
