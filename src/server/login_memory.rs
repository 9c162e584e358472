//! What logins learnt from the coordinator database, kept so that clients
//! can still log in while it is down (routed and multi-node statements on
//! distributed tables need nothing else from it). Refreshed by every login
//! that reaches it; consulted only when it cannot be reached. The workers
//! still check each role themselves, since the coordinator logs in to them
//! as the client.

use crate::transaction::coordinator_db::LoginFacts;
use std::collections::HashMap;
use std::sync::Mutex;

/// Distinct logins remembered at most; past it the memory starts afresh.
const MAX_REMEMBERED: usize = 10_000;

#[derive(Default)]
pub struct LoginMemory {
    /// By login key (role, database, startup options).
    facts: Mutex<HashMap<String, LoginFacts>>,
    /// Each role's SCRAM verifier as last read (None: no password or no role).
    verifiers: Mutex<HashMap<String, Option<String>>>,
}

impl LoginMemory {
    pub fn remember_login(&self, key: &str, facts: &LoginFacts) {
        remember(&self.facts, key, facts.clone());
    }

    pub fn recall_login(&self, key: &str) -> Option<LoginFacts> {
        self.facts.lock().unwrap().get(key).cloned()
    }

    pub fn remember_verifier(&self, user: &str, verifier: Option<String>) {
        remember(&self.verifiers, user, verifier);
    }

    pub fn recall_verifier(&self, user: &str) -> Option<Option<String>> {
        self.verifiers.lock().unwrap().get(user).cloned()
    }
}

fn remember<V>(map: &Mutex<HashMap<String, V>>, key: &str, value: V) {
    let mut map = map.lock().unwrap();
    if map.len() >= MAX_REMEMBERED && !map.contains_key(key) {
        map.clear();
    }
    map.insert(key.to_string(), value);
}
