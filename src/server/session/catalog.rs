//! The catalog a session plans under: its search path followed into the
//! catalog's unqualified names, the plan cache by text, and the block's own
//! catalog while a block changes tables.

use super::*;

impl Session {
    pub(super) fn catalog(&self) -> Arc<Catalog> {
        let base = self.base_catalog();
        let Some(unqualified) = &self.search_path.unqualified else { return base };
        let mut derived = self.search_path.catalog.borrow_mut();
        match derived.as_ref() {
            Some((from, catalog)) if Arc::ptr_eq(from, &base) => catalog.clone(),
            _ => {
                let catalog = Arc::new(base.with_search_path(unqualified.clone()));
                *derived = Some((base, catalog.clone()));
                catalog
            }
        }
    }

    /// The catalog before the session's search_path is applied.
    pub(super) fn base_catalog(&self) -> Arc<Catalog> {
        if let Some(catalog) = self.block_catalog.as_ref().filter(|_| self.parts.in_block()) {
            return catalog.clone();
        }
        if self.distributed {
            self.coordinator.catalog.snapshot()
        } else {
            Arc::new(Catalog::default())
        }
    }

    /// Reads where the session's search_path leads distributed tables'
    /// unqualified names, if a statement may have changed it, or if it leads
    /// elsewhere than `public` and the catalog changed since. A temporary
    /// relation counts as leading elsewhere: PostgreSQL looks in the
    /// session's temporary schema first, so a temporary table can hide a
    /// distributed one, and a temporary view is the session's alone. Plans
    /// made under another answer are dropped.
    pub(super) async fn follow_search_path(&mut self) -> Result<(), Failure> {
        let base = self.base_catalog();
        let outdated = self.search_path.unqualified.is_some() && self.search_path.read_at != base.version;
        if !self.distributed || !(self.search_path.stale || outdated) || self.parts.is_failed() {
            return Ok(());
        }
        let names: Vec<String> = base.relation_names().into_iter().map(quote_literal).collect();
        // One row at least, saying whether unqualified names may lead
        // elsewhere than `public` (a path elsewhere, or temporary relations,
        // which come first); the names only then. Such a session follows the
        // path even while no name needs it, so that names distributed later
        // are looked up.
        let rows = self
            .parts
            .local_for_describe()
            .await?
            .query(&format!(
                "SELECT p.follows, n, s.nspname, c.oid
                   FROM (SELECT pg_catalog.current_schemas(false) <> ARRAY['public']::name[]
                                OR EXISTS (SELECT FROM pg_catalog.pg_class t WHERE t.relnamespace = pg_catalog.pg_my_temp_schema()) AS follows) p
                   LEFT JOIN unnest(ARRAY[{}]::text[]) n ON p.follows
                   LEFT JOIN pg_catalog.pg_class c ON c.oid = pg_catalog.to_regclass(pg_catalog.quote_ident(n))
                   LEFT JOIN pg_catalog.pg_namespace s ON s.oid = c.relnamespace",
                names.join(", ")
            ))
            .await?;
        let follows = rows.first().and_then(|row| row.first().cloned().flatten()).as_deref() == Some("t");
        let unqualified = follows.then(|| {
            let found: UnqualifiedNames = rows
                .into_iter()
                .filter_map(|row| {
                    let mut columns = row.into_iter().skip(1);
                    let name = columns.next().flatten()?;
                    let schema = columns.next().flatten();
                    let oid = columns.next().flatten().and_then(|oid| oid.parse().ok());
                    Some((name, schema.zip(oid).map(|(schema, oid)| FoundRelation { schema, oid })))
                })
                .collect();
            Arc::new(found)
        });
        self.search_path.stale = false;
        self.search_path.read_at = base.version;
        if unqualified != self.search_path.unqualified {
            self.search_path.unqualified = unqualified;
            self.search_path.generation += 1;
            *self.search_path.catalog.borrow_mut() = None;
            self.plans.clear();
            self.shells.clear();
        }
        Ok(())
    }

    /// The catalog to run under. After a catalog change (DDL above all) the
    /// statement descriptions and the statements prepared on the workers are
    /// made afresh: a statement such as `SELECT *` described or prepared before
    /// an ALTER TABLE would show or return the old columns, where a client that
    /// parses its statement again expects the new ones.
    pub(super) fn catalog_to_run_under(&mut self) -> Arc<Catalog> {
        let catalog = self.catalog();
        if catalog.version != self.catalog_version {
            self.catalog_version = catalog.version;
            self.shells.clear();
            self.parts.forget_prepared_statements(catalog.version);
        }
        catalog
    }

    pub(super) fn plan(&mut self, sql: &str) -> Arc<CachedPlan> {
        let planned = self.plan_cached(sql);
        if planned.statements.iter().any(|s| s.changes_settings) {
            let custom: Vec<String> = planned.statements.iter().flat_map(|s| s.custom_settings.iter().cloned()).collect();
            let followed = planned.statements.iter().any(|s| s.changes_followed_settings);
            self.parts.settings_may_have_changed(&custom, followed);
        }
        if let Some(why) = planned.statements.iter().find_map(|s| s.pins) {
            self.parts.pin_local(why);
        }
        if planned.statements.iter().any(|s| s.changes_role) {
            self.parts.role_may_have_changed();
        }
        // The end of a block (or of a savepoint) may undo a SET in it.
        let undoes = |s: &PlannedStatement| {
            matches!(s.plan, Plan::Transaction(TransactionCommand::Commit | TransactionCommand::Rollback | TransactionCommand::RollbackTo(_)))
        };
        if self.search_path.changed_since_block_end && planned.statements.iter().any(undoes) {
            self.search_path.stale = true;
            self.search_path.changed_since_block_end = false;
        }
        if planned.statements.iter().any(|s| self.moves_names(s)) {
            self.search_path.stale = true;
            self.search_path.changed_since_block_end = true;
        }
        planned
    }

    /// Whether a statement may change which relation an unqualified name
    /// finds: a change of the search_path (or of relations' names), or, on a
    /// path other than `public` alone, a relation created (a new table in an
    /// earlier schema hides a distributed one of its name).
    pub(super) fn moves_names(&self, statement: &PlannedStatement) -> bool {
        statement.changes_search_path || (statement.changes_relations && self.search_path.unqualified.is_some())
    }

    pub(super) fn plan_cached(&mut self, sql: &str) -> Arc<CachedPlan> {
        let catalog = self.catalog();
        if let Some(p) = self.plans.get(sql) {
            if p.version == catalog.version && p.search_path == self.search_path.generation {
                return p.clone();
            }
        }
        if self.plans.len() >= PLAN_CACHE_LIMIT {
            self.plans.clear();
        }
        let planned = Arc::new(CachedPlan {
            version: catalog.version,
            search_path: self.search_path.generation,
            statements: planner::plan_query(sql, &catalog),
        });
        self.plans.insert(sql.to_string(), planned.clone());
        planned
    }

    /// After this block distributed or undistributed a table, the session runs
    /// under the catalog its block sees (no other session sees it before the
    /// commit). Marked with versions no committed catalog has, so that plans
    /// made under it are never taken for plans under a committed one.
    pub(super) async fn load_block_catalog(&mut self) -> PgResult<()> {
        self.block_catalog_loads += 1;
        let version = -self.block_catalog_loads;
        let committed = self.coordinator.catalog.snapshot();
        self.block_catalog = Some(Arc::new(metadata::load_in_block(self.parts.local().await?, version, &committed).await?));
        Ok(())
    }

    /// After a statement that may have changed which views and functions
    /// reach distributed tables: the session's next statements are planned
    /// knowing the change (other sessions learn it from the change notice).
    /// Inside a block, a catalog that cannot be loaded fails the block: its
    /// next statements could not be planned knowing the change. Outside
    /// one the change has committed, and the client hears of a failed
    /// reload as a WARNING.
    pub(super) async fn see_user_code_change(&mut self) -> Result<(), Failure> {
        if self.parts.is_failed() {
            return Ok(());
        }
        if self.parts.in_block() {
            return self.load_block_catalog().await.map_err(|e| {
                Failure::Error(e.with_context("while loading the catalog as this transaction block sees it, after a change of views or functions"))
            });
        }
        self.reload_after_commit().await;
        Ok(())
    }

    /// Reloads the catalog after a change committed, telling the client
    /// when that failed (`Coordinator::reload_after_commit`).
    pub(super) async fn reload_after_commit(&mut self) {
        if let Some(warning) = self.coordinator.reload_after_commit().await {
            backend::notice_response(self.client.out(), &warning);
        }
    }

    /// A block that changed the catalog has ended: the committed catalog
    /// (reloaded now, not when the change notice arrives) applies again.
    pub(super) async fn end_block_catalog(&mut self) {
        if self.block_catalog.take().is_some() {
            self.reload_after_commit().await;
        }
    }

    /// Refuses to plan `sql` while the catalog may miss a committed change
    /// (`Coordinator::check_catalog`), unless none of its statements reads
    /// or writes relations (transaction control, SET, SHOW …).
    pub(super) async fn check_catalog(&mut self, sql: &str) -> Result<(), Failure> {
        if !self.coordinator.catalog_unreliable() || self.plan(sql).statements.iter().all(|s| !s.uses_relations) {
            return Ok(());
        }
        Ok(self.coordinator.check_catalog().await?)
    }
}
