//! A session's connection to the coordinator database, taken from a pool
//! shared by the coordinator process's sessions. The session holds it only
//! while it needs it: for a transaction block, an exchange in progress, or
//! for good once it made state that lives in that backend alone (a
//! temporary table, LISTEN, a prepared statement, a session advisory lock,
//! SET ROLE: it is then *pinned*). Between transactions it goes back to the
//! pool; the settings the session made are kept here, and whichever
//! connection the session takes next gets them (after `DISCARD ALL`, which
//! clears what another session left).

use super::CitusSettings;
use crate::config::{Login, ServerAddr};
use crate::connection::pool::{Checkout, NodePool};
use crate::connection::PgConnection;
use crate::error::{PgError, PgResult};
use std::sync::Arc;
use std::time::Duration;

pub struct LocalConnection {
    conn: PgConnection,
    /// The session, and its settings as of which `state_epoch`, that the
    /// connection carries.
    owner: Arc<str>,
    state_epoch: u64,
    _slot: tokio::sync::OwnedSemaphorePermit,
}

pub type LocalPool = NodePool<LocalConnection>;

/// Why a session is pinned to its coordinator database connection, once it is.
pub type PinReason = Arc<std::sync::OnceLock<&'static str>>;

/// Where a session takes its coordinator database connections from.
pub struct LocalSource {
    pub pool: Arc<LocalPool>,
    /// As configured: a failover may move it (`config::coordinator_db_now`).
    pub addr: ServerAddr,
    pub wait: Duration,
}

/// What logging in learnt from the coordinator database.
#[derive(Clone, Debug)]
pub struct LoginFacts {
    /// The ParameterStatus values the client is told.
    pub server_params: Vec<(String, String)>,
    /// The session's search_path leads to `public` alone.
    pub search_path_public: bool,
    /// The `citus.*` settings the role and database give.
    pub citus: CitusSettings,
    /// `statement_timeout` as they give it.
    pub statement_timeout: Option<Duration>,
    idle_in_transaction_default: Option<Duration>,
}

pub struct CoordinatorDb {
    source: LocalSource,
    /// The client's login: connections log in with it, and connections of
    /// the same login are interchangeable once reset.
    login: Login,
    key: String,
    held: Option<LocalConnection>,
    /// Why the session keeps its connection for good, if it does (shared
    /// with the coordinator's list of sessions).
    pinned: PinReason,
    /// `set_config` calls that give a connection the session's settings.
    settings: Vec<String>,
    /// `idle_in_transaction_session_timeout` as the session began, and as
    /// the session set it since (None: not set by the session).
    idle_in_transaction_default: Option<Duration>,
    idle_in_transaction_set: Option<Option<Duration>>,
    /// Counts the changes to `settings`.
    state_epoch: u64,
    /// A statement may have changed the settings since they were read.
    settings_unknown: bool,
    /// Settings no module defines that the session set (`SET app.tenant`),
    /// which pg_settings leaves out: read by name.
    custom: std::collections::BTreeSet<String>,
    last_backend: Option<(i32, i32)>,
}

impl CoordinatorDb {
    pub fn new(source: LocalSource, login: Login, pinned: PinReason) -> Self {
        let mut options: Vec<String> = login.options.iter().map(|(k, v)| format!("{}={v}", k.to_lowercase())).collect();
        options.sort();
        let key = format!("{}\0{}\0{}", login.user, login.database, options.join("\0"));
        CoordinatorDb {
            source,
            login,
            key,
            held: None,
            pinned,
            settings: Vec::new(),
            idle_in_transaction_default: None,
            idle_in_transaction_set: None,
            state_epoch: 0,
            settings_unknown: false,
            custom: Default::default(),
            last_backend: None,
        }
    }

    /// The connection, taken from the pool (or opened) if the session holds
    /// none; `owner` names the session. Also returns the backend key of a
    /// connection newly taken, for the session's cancel requests.
    /// `may_exceed`: the session holds worker connections in its block, and
    /// must not wait for this one (see `NodePool::checkout`).
    pub async fn acquire(&mut self, owner: &Arc<str>, may_exceed: bool) -> PgResult<(&mut PgConnection, Option<(i32, i32)>)> {
        // `if let Some(held) = &mut self.held` would keep self.held borrowed
        // for the rest of the function (a known limit of the borrow checker).
        #[allow(clippy::unnecessary_unwrap)]
        if self.held.is_some() {
            return Ok((&mut self.held.as_mut().unwrap().conn, None));
        }
        let last = self.last_backend;
        let addr = self.addr();
        let label = addr.to_string();
        let taken = loop {
            match self
                .source
                .pool
                .checkout(&self.key, &|c: &LocalConnection| Some(c.conn.backend_key()) == last, self.source.wait, may_exceed, &label)
                .await?
            {
                Checkout::Idle(mut local) => {
                    // One to a server the coordinator database moved away from is closed.
                    if local.conn.is_dead_while_idle() || **local.conn.label() != *label {
                        continue;
                    }
                    if *local.owner != **owner || local.state_epoch != self.state_epoch {
                        // On its own: several statements in one query string
                        // make a transaction block, where DISCARD cannot run.
                        local.conn.queue_silent("DISCARD ALL");
                        if !self.settings.is_empty() {
                            local.conn.queue_silent(&self.settings.join("; "));
                        }
                        local.owner = owner.clone();
                        local.state_epoch = self.state_epoch;
                    }
                    break local;
                }
                Checkout::Open(slot) => {
                    let mut conn = PgConnection::connect(&addr, &self.login).await.map_err(|e| unavailable(&addr, e))?;
                    conn.track_parameter_changes();
                    if !self.settings.is_empty() {
                        conn.queue_silent(&self.settings.join("; "));
                    }
                    self.source.pool.size_from(&mut conn).await?;
                    break LocalConnection { conn, owner: owner.clone(), state_epoch: self.state_epoch, _slot: slot };
                }
            }
        };
        let key = taken.conn.backend_key();
        self.held = Some(taken);
        Ok((&mut self.held.as_mut().unwrap().conn, Some(key)))
    }

    pub fn addr(&self) -> ServerAddr {
        crate::config::coordinator_db_now(&self.source.addr)
    }

    pub fn is_held(&self) -> bool {
        self.held.is_some()
    }

    /// The connection the session holds now, if any.
    pub fn held(&mut self) -> Option<&mut PgConnection> {
        self.held.as_mut().map(|l| &mut l.conn)
    }

    /// The session made state only this backend has: it keeps the
    /// connection until it ends.
    pub fn pin(&mut self, why: &'static str) {
        let _ = self.pinned.set(why);
    }

    /// A statement may have changed the session's settings, among them
    /// the custom ones named.
    pub fn settings_may_have_changed(&mut self, custom: &[String]) {
        self.settings_unknown = true;
        self.custom.extend(custom.iter().cloned());
    }

    /// A query giving the `set_config` calls that make a connection act
    /// with the session's settings, as the held connection has them (with
    /// each setting's name and value).
    pub fn settings_query(&self) -> String {
        let mut sql = String::from(
            "SELECT format('SELECT set_config(%L, %L, false)', name, setting), name, current_setting(name) FROM pg_catalog.pg_settings
             WHERE source = 'session' AND name NOT IN ('client_encoding', 'role', 'session_authorization', 'is_superuser')",
        );
        for name in &self.custom {
            let name = crate::connection::quote_literal(name);
            sql.push_str(&format!(
                "\n UNION ALL SELECT format('SELECT set_config(%L, %L, false)', {name}, s), {name}, s FROM pg_catalog.current_setting({name}, true) s WHERE s <> ''"
            ));
        }
        sql
    }

    /// Reads what a login learns from the coordinator database, on the held
    /// connection (taken at login, which checked the role, the database and
    /// CONNECT): the parameters the client is told, and the settings the
    /// session began with that the coordinator acts on itself.
    pub async fn read_login_facts(&mut self) -> PgResult<LoginFacts> {
        let Some(held) = self.held.as_mut() else { return Err(PgError::internal("the login holds no coordinator database connection")) };
        let rows = held.conn.query(&format!("SELECT current_setting('{IDLE_IN_TRANSACTION}'), current_schemas(false) = ARRAY['public']::name[], current_setting('statement_timeout'), {}", CitusSettings::COLUMNS)).await?;
        let row = rows.into_iter().next().unwrap_or_default();
        let facts = LoginFacts {
            server_params: held.conn.server_params().to_vec(),
            search_path_public: row.get(1).cloned().flatten().as_deref() == Some("t"),
            idle_in_transaction_default: row.first().cloned().flatten().as_deref().and_then(parse_duration),
            statement_timeout: row.get(2).cloned().flatten().as_deref().and_then(parse_duration),
            citus: CitusSettings::from_values(row.get(3..).unwrap_or_default()),
        };
        self.assume_login(&facts);
        Ok(facts)
    }

    /// Takes the facts of an earlier login of the same kind, when the
    /// coordinator database cannot be asked.
    pub fn assume_login(&mut self, facts: &LoginFacts) {
        self.idle_in_transaction_default = facts.idle_in_transaction_default;
    }

    /// Identifies logins that are interchangeable: same role, database and
    /// startup options.
    pub fn login_key(&self) -> &str {
        &self.key
    }

    /// How long the client may leave a transaction block idle before the
    /// session is ended, as `idle_in_transaction_session_timeout` says; None
    /// for no limit. The coordinator enforces it for every node: the
    /// workers' backends in the block are not the client's own.
    pub fn idle_in_transaction_timeout(&self) -> Option<Duration> {
        self.idle_in_transaction_set.unwrap_or(self.idle_in_transaction_default)
    }

    /// Gives the connection back to the pool, between statements, unless
    /// the session is pinned or the connection is in a transaction or
    /// broken. Settings changed since they were last read are read first.
    /// Returns the backend key of the connection given back.
    pub async fn release(&mut self) -> Option<(i32, i32)> {
        if self.pinned.get().is_some() {
            return None;
        }
        let held = self.held.as_mut()?;
        if !held.conn.is_reusable() {
            return None;
        }
        if self.settings_unknown {
            let query = self.settings_query();
            let held = self.held.as_mut()?;
            match held.conn.query(&query).await {
                Ok(rows) => {
                    self.settings = rows.iter().filter_map(|r| r.first().cloned().flatten()).collect();
                    self.idle_in_transaction_set = rows
                        .iter()
                        .find(|r| r.get(1).cloned().flatten().as_deref() == Some(IDLE_IN_TRANSACTION))
                        .map(|r| r.get(2).cloned().flatten().as_deref().and_then(parse_duration));
                    self.settings_unknown = false;
                    self.state_epoch += 1;
                    held.state_epoch = self.state_epoch;
                }
                Err(_) => return None,
            }
        }
        let held = self.held.take()?;
        let key = held.conn.backend_key();
        self.last_backend = Some(key);
        self.source.pool.give_back(&self.key, held);
        Some(key)
    }

    /// Ends the session: an unpinned, idle connection goes back to the pool;
    /// any other is closed (which rolls back what it had open).
    pub async fn close(mut self) {
        self.release().await;
        if let Some(held) = self.held.take() {
            held.conn.terminate().await;
        }
    }
}

/// Says that it is the coordinator database (at `addr`) that cannot be
/// reached, and what still works meanwhile; other errors stay as they are.
pub fn unavailable(addr: &ServerAddr, e: PgError) -> PgError {
    if !e.is_node_unreachable() {
        return e;
    }
    PgError::new(e.code(), format!("the coordinator database ({addr}) is unavailable: {}", e.message())).with_hint(
        "This needs the coordinator database (logins it has not seen, local tables, catalog changes, combining results across shards, SQL PREPARE); \
         statements routed to workers and multi-shard reads and writes that need no combining keep working. Retry once it is back.",
    )
}

const IDLE_IN_TRANSACTION: &str = "idle_in_transaction_session_timeout";

/// A time setting as `current_setting` shows it (`0`, `250ms`, `10s`,
/// `5min`, `1h`, `1d`; a bare number is milliseconds); None for 0, which
/// means no limit, or for what does not parse.
pub(crate) fn parse_duration(value: &str) -> Option<Duration> {
    let split = value.find(|c: char| !c.is_ascii_digit()).unwrap_or(value.len());
    let number: u64 = value[..split].parse().ok()?;
    let millis = match value[split..].trim() {
        "" | "ms" => number,
        "s" => number * 1000,
        "min" => number * 60_000,
        "h" => number * 3_600_000,
        "d" => number * 86_400_000,
        _ => return None,
    };
    (millis > 0).then(|| Duration::from_millis(millis))
}

#[cfg(test)]
mod tests {
    use super::parse_duration;
    use std::time::Duration;

    #[test]
    fn time_settings() {
        assert_eq!(parse_duration("0"), None);
        assert_eq!(parse_duration("250ms"), Some(Duration::from_millis(250)));
        assert_eq!(parse_duration("10s"), Some(Duration::from_secs(10)));
        assert_eq!(parse_duration("5min"), Some(Duration::from_secs(300)));
        assert_eq!(parse_duration("1h"), Some(Duration::from_secs(3600)));
        assert_eq!(parse_duration("1500"), Some(Duration::from_millis(1500)));
        assert_eq!(parse_duration("soon"), None);
    }
}
