//! The registry of this process's sessions: each one's participants, the
//! node backends its cancel requests reach, and what bounds its statements.

use super::Coordinator;
use crate::config::Login;
use crate::connection::send_cancel;
use crate::transaction::coordinator_db::{CoordinatorDb, LocalSource, PinReason};
use crate::transaction::limits::{CancelOutcome, StatementLimits};
use crate::transaction::{CancelTargets, Participants, TwoPhase};
use std::time::Duration;

/// What the coordinator knows of one client session.
pub(super) struct SessionEntry {
    /// The name its worker connections carry (`TwoPhase::session_name`).
    pub(super) name: String,
    pub(super) user: String,
    /// The node connections it holds now, which its cancel requests reach.
    pub(super) cancel_targets: CancelTargets,
    /// What bounds its running statement.
    pub(super) limits: StatementLimits,
    pub(super) pinned: PinReason,
}

impl Coordinator {
    /// The participants of a session of this process, registered under
    /// `key` (for cancellation and the process report); its workers learn
    /// the session's two-phase name as their application_name.
    pub fn participants(&self, key: (i32, i32), local_login: Login, mut worker_login: Login) -> Participants {
        let local_source = LocalSource { pool: self.local_pool.clone(), addr: self.config.coordinator_db_addr(), wait: self.worker_pools.wait };
        let transactions = &self.config.transactions;
        let two_phase = TwoPhase::new(
            self.process_id,
            key.0,
            Duration::from_secs_f64(transactions.recovery_interval_secs),
            transactions.fault(),
            self.links.clone(),
        );
        worker_login.options.push(("application_name".into(), two_phase.session_name().to_string()));
        let (cancel_targets, limits, pinned) = self.register_session(key, two_phase.session_name(), &worker_login.user);
        Participants::new(
            CoordinatorDb::new(local_source, local_login, pinned),
            worker_login,
            cancel_targets,
            limits,
            two_phase,
            self.worker_pools.clone(),
        )
    }

    /// A session of the service role for work no client asked for (a
    /// background job); `end_service_session(key)` forgets it.
    pub fn service_session(&self) -> ((i32, i32), Participants) {
        let key = new_session_key();
        let login = self.config.service_login();
        let worker_login = Login { options: Vec::new(), ..login.clone() };
        (key, self.participants(key, login, worker_login))
    }

    pub fn end_service_session(&self, key: (i32, i32)) {
        self.unregister_session(key);
    }

    fn register_session(&self, key: (i32, i32), name: &str, user: &str) -> (CancelTargets, StatementLimits, PinReason) {
        let cancel_targets = CancelTargets::default();
        let limits = StatementLimits::new(cancel_targets.clone(), self.statement_memory.clone());
        let entry = SessionEntry { name: name.to_string(), user: user.to_string(), cancel_targets, limits, pinned: PinReason::default() };
        let shared = (entry.cancel_targets.clone(), entry.limits.clone(), entry.pinned.clone());
        self.sessions.lock().unwrap().insert(key, entry);
        shared
    }

    pub fn unregister_session(&self, key: (i32, i32)) {
        self.sessions.lock().unwrap().remove(&key);
    }

    /// A client's cancel request for session `key`: a statement its limits
    /// watch is stopped as a whole (see `transaction::limits`); otherwise
    /// the request goes to the node backends the session holds.
    pub async fn cancel(&self, key: (i32, i32)) {
        let Some((targets, limits)) = self.sessions.lock().unwrap().get(&key).map(|s| (s.cancel_targets.clone(), s.limits.clone())) else { return };
        if limits.cancel() != CancelOutcome::NotWatched {
            return;
        }
        let targets = targets.lock().unwrap().clone();
        for (addr, backend_key) in targets {
            send_cancel(&addr, backend_key).await;
        }
    }
}

/// A new session's key: its BackendKeyData (process id, secret).
pub fn new_session_key() -> (i32, i32) {
    (rand::random::<i32>() & 0x7fff_ffff, rand::random::<i32>())
}
