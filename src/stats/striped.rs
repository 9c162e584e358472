//! A hash map split into stripes, each behind its own lock: sessions
//! recording at once rarely wait for each other, and no lock covers it all.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hash};
use std::sync::{Mutex, MutexGuard};

pub(super) const STRIPES: usize = 16;

pub(super) struct Striped<K, V> {
    stripes: [Mutex<HashMap<K, V>>; STRIPES],
    hasher: std::collections::hash_map::RandomState,
}

impl<K: Hash + Eq, V> Default for Striped<K, V> {
    fn default() -> Self {
        Striped { stripes: std::array::from_fn(|_| Mutex::default()), hasher: Default::default() }
    }
}

impl<K: Hash + Eq, V> Striped<K, V> {
    /// The stripe `key` belongs to, locked.
    pub(super) fn stripe_of(&self, key: &K) -> MutexGuard<'_, HashMap<K, V>> {
        self.stripes[self.hasher.hash_one(key) as usize % STRIPES].lock().unwrap()
    }

    /// Every stripe in turn, locked.
    pub(super) fn stripes(&self) -> impl Iterator<Item = MutexGuard<'_, HashMap<K, V>>> {
        self.stripes.iter().map(|stripe| stripe.lock().unwrap())
    }

    pub(super) fn clear(&self) {
        self.stripes().for_each(|mut stripe| stripe.clear());
    }
}
