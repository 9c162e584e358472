//! The session settings worker connections follow: the role the session
//! acts as, the timeouts and output formats (`FOLLOWED_SETTINGS`), and the
//! Citus settings read from the coordinator database.

use super::*;

impl Participants {
    /// Carries settings that change how values are written and read (a SET
    /// DateStyle, TimeZone, …, reported by the coordinator database) to the
    /// worker connections, so routed results look like local ones.
    pub(super) fn follow_settings(&mut self) {
        let Some(local) = self.local.held() else { return };
        for (name, value) in local.take_changed_params() {
            if WORKER_PARAMETERS.iter().any(|p| p.eq_ignore_ascii_case(&name)) {
                self.set_on_workers(name, value);
            }
        }
    }

    /// Makes the worker connections, open and future, carry setting `name`
    /// as `value`.
    pub(super) fn set_on_workers(&mut self, name: String, value: String) {
        let sql = format!("SET {} TO {}", crate::connection::quote_ident(&name), crate::connection::quote_literal(&value));
        match self.login.options.iter_mut().find(|(k, _)| k.eq_ignore_ascii_case(&name)) {
            Some(slot) => slot.1 = value,
            None => self.login.options.push((name, value)),
        }
        self.login_state = login_state(&self.login);
        for w in self.workers.values_mut() {
            w.conn.queue_silent(&sql);
            w.login_state = self.login_state;
        }
    }

    /// Makes the worker connections, open and future, keep the session's
    /// `FOLLOWED_SETTINGS` as the coordinator database has them now. Each
    /// worker times out its own part of a statement: a multi-shard
    /// statement's limit holds per node, in parallel.
    pub(super) async fn read_followed_settings(&mut self) -> PgResult<()> {
        self.followed_unknown = false;
        let sql = format!("SELECT {}", FOLLOWED_SETTINGS.map(|(name, _)| format!("pg_catalog.current_setting('{name}')")).join(", "));
        let row = self.local_outside_block().await?.query(&sql).await?.into_iter().next().unwrap_or_default();
        for ((name, unset), value) in FOLLOWED_SETTINGS.iter().zip(row) {
            let value = value.unwrap_or_default();
            if *name == "statement_timeout" {
                self.statement_timeout = coordinator_db::parse_duration(&value);
            }
            let following = self.login.options.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str());
            if following.unwrap_or(unset) != value {
                self.set_on_workers(name.to_string(), value);
            }
        }
        Ok(())
    }

    pub async fn citus_settings(&mut self) -> PgResult<CitusSettings> {
        if let Some(settings) = self.settings {
            return Ok(settings);
        }
        let rows = self.local_outside_block().await?.query(&format!("SELECT {}", CitusSettings::COLUMNS)).await?;
        let settings = CitusSettings::from_values(rows.first().map_or(&[][..], |r| r.as_slice()));
        self.settings = Some(settings);
        Ok(settings)
    }

    /// A statement may have changed the role the session acts as (SET ROLE,
    /// SET SESSION AUTHORIZATION, RESET ALL, DISCARD ALL).
    pub fn role_may_have_changed(&mut self) {
        self.role_unknown = true;
        if self.block.is_some() {
            self.role_changed_in_block = true;
        }
    }

    /// The role the session acts as now, after any SET ROLE: the one whose
    /// privileges the nodes check, and whose user mapping the general
    /// fallback's foreign tables use.
    pub async fn acting_role(&mut self) -> PgResult<String> {
        if self.role_unknown {
            self.follow_role().await?;
        }
        Ok(self.worker_role.clone().unwrap_or_else(|| self.login.user.clone()))
    }

    /// Makes the worker connections, open and future, act as the role the
    /// coordinator database acts as now.
    pub(super) async fn follow_role(&mut self) -> PgResult<()> {
        self.role_unknown = false;
        let current = self.local_outside_block().await?.query_value("SELECT current_user").await?.unwrap_or_default();
        let role = (current != self.login.user).then_some(current);
        if role == self.worker_role {
            return Ok(());
        }
        let sql = match &role {
            Some(r) => format!("SET ROLE {}", crate::connection::quote_ident(r)),
            // Not RESET: a connection opened with the role as a startup
            // option would reset to it.
            None => "SET ROLE NONE".to_string(),
        };
        self.login.options.retain(|(name, _)| name != "role");
        if let Some(r) = &role {
            self.login.options.push(("role".to_string(), r.clone()));
        }
        self.login_state = login_state(&self.login);
        for w in self.workers.values_mut() {
            w.conn.queue_silent(&sql);
            w.login_state = self.login_state;
        }
        self.worker_role = role;
        Ok(())
    }

    /// A statement may have changed the session's settings, among them the
    /// custom ones (`app.tenant`) named, and maybe `FOLLOWED_SETTINGS`.
    pub fn settings_may_have_changed(&mut self, custom: &[String], followed: bool) {
        self.local.settings_may_have_changed(custom);
        self.followed_unknown |= followed;
        self.followed_changed_in_block |= followed && self.block.is_some();
        self.settings = None;
        self.settings_epoch += 1;
        self.settings_changed_in_block |= self.block.is_some();
    }

    /// Makes the worker connection to `node` (opened with `access` if need
    /// be) run under the session's settings as the coordinator database has
    /// them (search_path, time zone, `tessera.*` …), for user code about to
    /// run there. Shard statements need none of that: they name everything
    /// they use.
    pub async fn follow_session_settings(&mut self, node: &Node, access: Access) -> PgResult<()> {
        let epoch = self.settings_epoch;
        let group = node.group_id;
        if self.worker(node, access).await?.settings_epoch == epoch {
            return Ok(());
        }
        let settings = match &self.session_settings {
            Some((read_at, settings)) if *read_at == epoch => settings.clone(),
            _ => {
                let query = self.local.settings_query();
                let rows = self.local_outside_block().await?.query(&query).await?;
                let settings: Arc<str> =
                    rows.into_iter().filter_map(|r| r.into_iter().next().flatten()).map(|s| format!("; {s}")).collect::<String>().into();
                self.session_settings = Some((epoch, settings.clone()));
                settings
            }
        };
        let worker = self.workers.get_mut(&group).ok_or_else(|| PgError::internal(format!("no connection to node group {group}")))?;
        // RESET ALL leaves the role alone but not the name the deadlock
        // detector reads. Sent ahead of the user code, in the same flight.
        worker.conn.queue_silent(&format!("RESET ALL; SET application_name TO {}{settings}", crate::connection::quote_literal(&worker.named)));
        worker.settings_epoch = epoch;
        Ok(())
    }
}
