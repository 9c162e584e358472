//! A session's transaction block across its nodes: BEGIN on first use,
//! savepoints, and the end — one-phase where one node wrote, two-phase
//! commit with a deciding node otherwise, rollback everywhere on failure.

use super::*;

impl Participants {
    pub fn begin(&mut self, sql: &str) -> Option<PgError> {
        if self.block.as_ref().is_some_and(|b| !b.implicit) {
            return Some(PgError::warning("25001", "there is already a transaction in progress"));
        }
        self.block =
            Some(Block { begin_sql: sql.to_string(), started: std::time::Instant::now(), implicit: false, failed: false, savepoints: vec![] });
        None
    }

    /// Opens a block for one statement that writes on several nodes, unless the
    /// client already has one open. Returns whether it did.
    pub fn begin_implicit(&mut self) -> bool {
        if self.block.is_some() {
            return false;
        }
        self.block = Some(Block { begin_sql: "BEGIN".into(), started: std::time::Instant::now(), implicit: true, failed: false, savepoints: vec![] });
        true
    }

    /// Ends the block `begin_implicit` opened (when `implicit`): commits it
    /// if the statement succeeded, rolls it back if not. The statement's own
    /// result comes back, or the commit's error.
    /// A statement stopped by its limits (see `limits`) rolls back; past
    /// this point it is not stopped any more.
    pub async fn end_implicit<T>(&mut self, implicit: bool, result: PgResult<T>) -> PgResult<T> {
        if implicit {
            let result = self.limits.ending().and(result);
            if result.is_ok() {
                self.commit().await?;
            } else {
                self.rollback().await.ok();
            }
            return result;
        }
        result
    }

    pub(super) fn touched_workers(&mut self) -> Vec<&mut WorkerConnection> {
        self.workers.values_mut().filter(|w| w.in_block).collect()
    }

    /// Ends the block: COMMIT on every touched node (ROLLBACK if it failed).
    /// Returns the command tag for the client.
    pub async fn commit(&mut self) -> PgResult<&'static str> {
        let result = self.commit_block().await;
        self.after_block_end(true);
        result
    }

    pub(super) async fn commit_block(&mut self) -> PgResult<&'static str> {
        let Some(block) = self.block.take() else {
            return Ok("COMMIT");
        };
        if block.failed {
            self.finish("ROLLBACK").await?;
            return Ok("ROLLBACK");
        }
        self.finish("COMMIT").await.map(|_| "COMMIT")
    }

    /// Settles the prepared parts of the session's ended worker transactions
    /// that wrote on other nodes through links (see `links`): called before
    /// the client hears a statement is done, so that it reads its own writes.
    pub async fn settle_links(&mut self) {
        let links = &self.two_phase.links;
        if !links.has_pending() {
            return;
        }
        for w in self.workers.values().filter(|w| !w.conn.is_broken()) {
            links.settle(w.group_id, w.conn.backend_key().0, |_| true).await;
        }
    }

    /// Rolls back the block's work on every node now, leaving the block itself
    /// failed until the client ends it: a deadlock victim must let go of its
    /// locks on all nodes, not only where it was cancelled.
    pub async fn release_failed_work(&mut self) {
        if self.is_failed() {
            self.finish("ROLLBACK").await.ok();
        }
    }

    pub async fn rollback(&mut self) -> PgResult<()> {
        let result = match self.block.take() {
            Some(_) => self.finish("ROLLBACK").await,
            None => Ok(()),
        };
        self.after_block_end(true);
        result
    }

    /// Sends `command` to every touched node, workers in parallel, then the
    /// coordinator database. Every node is finished even if one fails. A COMMIT
    /// that has to be atomic across several writing nodes uses two-phase commit.
    pub(super) async fn finish(&mut self, command: &str) -> PgResult<()> {
        // A node whose connection broke has already rolled its part back; for a
        // ROLLBACK there is nothing to send it, and a COMMIT cannot succeed.
        let lost: Vec<Arc<str>> = self.workers.values().filter(|w| w.in_block && w.conn.is_broken()).map(|w| w.conn.label().clone()).collect();
        self.discard_broken();
        let mut first_error = lost.first().filter(|_| command == "COMMIT").map(|node| {
            PgError::new(sqlstate::CONNECTION_FAILURE, format!("connection to node {node} was lost during the transaction; it was rolled back"))
        });
        let command = if lost.is_empty() { command } else { "ROLLBACK" };
        if command == "COMMIT" && self.needs_two_phase().await? {
            let result = self.commit_two_phase().await;
            if result.is_ok() {
                self.pools.stats.counters.add(crate::stats::Counter::TwoPhaseCommits, 1);
            }
            self.discard_broken();
            return result;
        }
        let one_phase = command == "COMMIT" && self.workers.values().any(|w| w.in_block);
        if let Some(e) = self.end_on_touched_nodes(command).await? {
            first_error.get_or_insert(e);
        }
        if one_phase && first_error.is_none() {
            self.pools.stats.counters.add(crate::stats::Counter::OnePhaseCommits, 1);
        }
        self.discard_broken();
        match first_error {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Sends `command` (COMMIT or ROLLBACK) to every node still in the block,
    /// workers in parallel, then the coordinator database; every node is
    /// finished even if one fails. Returns the first failure.
    pub(super) async fn end_on_touched_nodes(&mut self, command: &str) -> PgResult<Option<PgError>> {
        let results = futures::future::join_all(self.touched_workers().into_iter().map(|w| async move {
            w.in_block = false;
            w.wrote = false;
            w.conn.execute(command).await
        }))
        .await;
        let mut first_error = results.into_iter().find_map(Result::err);
        if self.local_in_block {
            self.local_in_block = false;
            if let Err(e) = self.held_local()?.execute(command).await {
                first_error.get_or_insert(e);
            }
        }
        Ok(first_error)
    }

    /// Two-phase commit is needed when more than one node wrote (the coordinator
    /// database counts as a writer once it joined the block), unless the session
    /// chose `SET citus.multi_shard_commit_protocol = '1pc'`.
    pub(super) async fn needs_two_phase(&mut self) -> PgResult<bool> {
        let writers = self.workers.values().filter(|w| w.in_block && w.wrote).count() + usize::from(self.local_in_block);
        if writers < 2 || self.workers.values().all(|w| !(w.in_block && w.wrote)) {
            return Ok(false);
        }
        Ok(self.citus_settings().await?.two_phase)
    }

    /// The end of a block (or a rollback to a savepoint) undoes what it did
    /// to the role, and may undo what it did to settings (SET LOCAL, or any
    /// SET rolled back).
    pub(super) fn after_block_end(&mut self, block_ended: bool) {
        if self.followed_changed_in_block {
            self.followed_unknown = true;
            self.followed_changed_in_block &= !block_ended;
            // What the block SET on its connections may have been rolled
            // back with it: whoever takes them next sets them afresh.
            for w in self.workers.values_mut() {
                w.login_state = 0;
            }
        }
        if self.role_changed_in_block {
            self.role_unknown = true;
            self.role_changed_in_block &= !block_ended;
        }
        if self.settings_changed_in_block {
            self.settings = None;
            self.settings_epoch += 1;
            self.settings_changed_in_block &= !block_ended;
        }
    }

    /// Commits a block that wrote on several nodes atomically. Last-agent
    /// style: every writer but one — the deciding node — prepares, then the
    /// deciding node commits its part one-phase, and that commit decides
    /// the whole (see `decided`); then COMMIT PREPARED everywhere else.
    /// When the coordinator database took part it is the deciding node, like
    /// any worker would be. Read-only participants just commit. After a
    /// failure past the decision, recovery finishes the job.
    pub(super) async fn commit_two_phase(&mut self) -> PgResult<()> {
        let two_phase = self.two_phase.clone();
        let decider = match self.local_in_block {
            true => None,
            false => self.deciding_worker(),
        };
        let (prepared, failure) = match self.decided_names(decider).await {
            Ok(gids) => self.prepare_all_but(decider, &gids).await,
            Err(e) => (Vec::new(), Some(e)),
        };
        two_phase.inject(Fault::AfterPrepare);
        two_phase.stall(Fault::StallAfterPrepare).await;
        let decided = match failure {
            Some(e) => Err(Decision::RolledBack(e)),
            None => self.commit_decider(decider).await,
        };
        match decided {
            Ok(()) => {}
            Err(Decision::InDoubt(e)) => return Err(e.with_detail("The transaction's outcome will be settled by prepared-transaction recovery.")),
            Err(Decision::RolledBack(e)) => {
                self.resolve_prepared(&prepared, "ROLLBACK PREPARED").await;
                // Failures to roll back leave nothing behind worth reporting
                // over the reason the commit failed.
                self.end_on_touched_nodes("ROLLBACK").await?;
                return Err(e);
            }
        }
        two_phase.inject(Fault::AfterDecision);
        // Committed. A node that cannot confirm now is finished by recovery.
        self.resolve_prepared(&prepared, "COMMIT PREPARED").await;
        Ok(())
    }

    /// The writing worker that decides: one whose transaction used links,
    /// since only it cannot prepare, or else the one that already told its
    /// transaction (see `worker`), or else the first by node group.
    pub(super) fn deciding_worker(&mut self) -> Option<i32> {
        let links = &self.two_phase.links;
        let mut writers: Vec<&mut WorkerConnection> = self.workers.values_mut().filter(|w| w.in_block && w.wrote).collect();
        for w in writers.iter_mut() {
            w.decider = w.conn.take_captured().as_deref().and_then(DecidingTransaction::parse);
        }
        writers.sort_by_key(|w| (!links.in_linked_transaction(w.group_id, w.conn.backend_key().0), w.decider.is_none(), w.group_id));
        writers.first().map(|w| w.group_id)
    }

    /// Names the parts of the writers other than the deciding worker
    /// `decider` (None: the coordinator database) after its transaction,
    /// asking for it unless the worker told it ahead.
    pub(super) async fn decided_names(&mut self, decider: Option<i32>) -> PgResult<Vec<(i32, String)>> {
        let (group, deciding) = match decider {
            Some(group) => {
                let w = self.workers.get_mut(&group).ok_or_else(|| PgError::internal(format!("no connection to node group {group}")))?;
                let deciding = match w.decider.take() {
                    Some(deciding) => deciding,
                    None => decided::identify(&mut w.conn).await?,
                };
                (group, deciding)
            }
            None => (decided::COORDINATOR_GROUP, decided::identify(self.held_local()?).await?),
        };
        // One part per node; a link's parts there are numbered instead.
        Ok(self
            .workers
            .values()
            .filter(|w| w.in_block && w.wrote && Some(w.group_id) != decider)
            .map(|w| (w.group_id, decided::gid(group, &deciding, "block")))
            .collect())
    }

    /// PREPARE TRANSACTION on each worker named in `gids`, COMMIT on the
    /// read-only ones, in parallel; the deciding worker is left as it is.
    /// Returns what was prepared and the first failure.
    pub(super) async fn prepare_all_but(&mut self, decider: Option<i32>, gids: &[(i32, String)]) -> (Vec<(i32, String)>, Option<PgError>) {
        let others = self.touched_workers().into_iter().filter(|w| Some(w.group_id) != decider);
        let prepares = futures::future::join_all(others.map(|w| {
            let gid = gids.iter().find(|(g, _)| *g == w.group_id).map(|(_, gid)| gid.clone());
            async move {
                w.in_block = false;
                w.wrote = false;
                match gid {
                    Some(gid) => w.conn.execute(&format!("PREPARE TRANSACTION '{gid}'")).await.map(|_| Some((w.group_id, gid))),
                    None => w.conn.execute("COMMIT").await.map(|_| None),
                }
            }
        }))
        .await;
        let mut prepared = Vec::new();
        let mut failure = None;
        for r in prepares {
            match r {
                Ok(Some(p)) => prepared.push(p),
                Ok(None) => {}
                Err(e) => {
                    failure.get_or_insert(explain_unpreparable(e));
                }
            }
        }
        (prepared, failure)
    }

    /// The deciding node's one-phase COMMIT, with its commit record: the
    /// worker `decider`'s, or (None) the coordinator database's.
    pub(super) async fn commit_decider(&mut self, decider: Option<i32>) -> Result<(), Decision> {
        let conn = match decider {
            Some(group) => {
                let w = self
                    .workers
                    .get_mut(&group)
                    .ok_or_else(|| Decision::RolledBack(PgError::internal(format!("no connection to node group {group}"))))?;
                w.in_block = false;
                w.wrote = false;
                &mut w.conn
            }
            None => {
                self.local_in_block = false;
                self.held_local().map_err(Decision::RolledBack)?
            }
        };
        decided::commit(conn).await
    }

    /// Sends COMMIT PREPARED or ROLLBACK PREPARED for each prepared transaction,
    /// in parallel; failures are left to recovery.
    pub(super) async fn resolve_prepared(&mut self, prepared: &[(i32, String)], command: &str) {
        let workers = self.workers.values_mut().filter_map(|w| prepared.iter().find(|(g, _)| *g == w.group_id).map(|(_, gid)| (w, gid)));
        futures::future::join_all(workers.map(|(w, gid)| async move {
            if let Err(e) = w.conn.execute(&format!("{command} '{gid}'")).await {
                tracing::warn!("{command} '{gid}' on {}: {e}; recovery will retry", w.conn.label());
            }
        }))
        .await;
    }

    pub async fn savepoint(&mut self, name: &str) -> PgResult<()> {
        self.on_touched(&format!("SAVEPOINT {}", crate::connection::quote_ident(name))).await?;
        if let Some(b) = &mut self.block {
            b.savepoints.push(name.to_string());
        }
        Ok(())
    }

    pub async fn release(&mut self, name: &str) -> PgResult<()> {
        self.check_savepoint(name)?;
        self.on_touched(&format!("RELEASE SAVEPOINT {}", crate::connection::quote_ident(name))).await?;
        if let Some(b) = &mut self.block {
            let at = b.savepoints.iter().rposition(|s| s == name).unwrap();
            b.savepoints.truncate(at);
        }
        Ok(())
    }

    pub async fn rollback_to(&mut self, name: &str) -> PgResult<()> {
        self.check_savepoint(name)?;
        self.after_block_end(false);
        self.on_touched(&format!("ROLLBACK TO SAVEPOINT {}", crate::connection::quote_ident(name))).await?;
        if let Some(b) = &mut self.block {
            let at = b.savepoints.iter().rposition(|s| s == name).unwrap();
            b.savepoints.truncate(at + 1);
            b.failed = false;
        }
        Ok(())
    }

    pub(super) fn check_savepoint(&self, name: &str) -> PgResult<()> {
        match &self.block {
            Some(b) if b.savepoints.iter().any(|s| s == name) => Ok(()),
            Some(_) => Err(PgError::new("3B001", format!("savepoint \"{name}\" does not exist"))),
            None => Err(PgError::new(sqlstate::INVALID_TRANSACTION_STATE, "savepoints can only be used in transaction blocks")),
        }
    }

    pub(super) async fn on_touched(&mut self, sql: &str) -> PgResult<()> {
        if self.block.is_none() {
            return Err(PgError::new(sqlstate::INVALID_TRANSACTION_STATE, "savepoints can only be used in transaction blocks"));
        }
        for w in self.touched_workers() {
            w.conn.execute(sql).await?;
        }
        if self.local_in_block {
            self.held_local()?.execute(sql).await?;
        }
        Ok(())
    }

    /// Ends the session: its idle worker connections go back to their pools;
    /// those in a block or an exchange are closed, which rolls their work back.
    pub async fn close(mut self) {
        self.block = None;
        self.release_workers();
        for (_, w) in self.workers {
            w.conn.terminate().await;
        }
        self.local.close().await;
    }
}
