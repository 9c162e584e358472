//! A hash map split into stripes, each behind its own lock: sessions
//! recording at once rarely wait for each other, and no lock covers it all.
//! Each stripe has a doorkeeper that tells whether a key was seen lately, so
//! that a full map takes in only keys that come back.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hash};
use std::sync::{Mutex, MutexGuard};

pub(super) const STRIPES: usize = 16;

/// Bits of each stripe's doorkeeper: keys seen lately, by their hash.
const DOORKEEPER_BITS: usize = 1 << 16;
/// Keys shown to a doorkeeper before it is cleared: at most a sixteenth of
/// its bits are set, so a key seen for the first time is let in by mistake
/// one time in sixteen at worst.
const DOORKEEPER_SHOWN: usize = DOORKEEPER_BITS / 16;

/// Hashing with a seed chosen per process: quick for the short keys
/// recorded on every statement, and not predictable from outside.
type Hasher = foldhash::fast::RandomState;

pub(super) struct Stripe<K, V> {
    pub(super) map: HashMap<K, V, Hasher>,
    doorkeeper: Box<[u64]>,
    /// Keys shown to the doorkeeper since it was last cleared.
    shown: usize,
}

impl<K, V> Stripe<K, V> {
    /// Whether the key of `hash` was shown lately (marking it shown): a key
    /// seen once in a stream of many never gets in, one that recurs does.
    /// Cleared after `DOORKEEPER_SHOWN` keys, so that it keeps telling keys
    /// apart.
    pub(super) fn seen_lately(&mut self, hash: u64) -> bool {
        self.shown += 1;
        if self.shown > DOORKEEPER_SHOWN {
            self.shown = 0;
            self.doorkeeper.fill(0);
        }
        // The top bits chose the stripe, the low ones place the key in
        // the stripe's map: the middle ones pick the bit.
        let bit = (hash >> 24) as usize % DOORKEEPER_BITS;
        let (word, mask) = (bit / 64, 1u64 << (bit % 64));
        let seen = self.doorkeeper[word] & mask != 0;
        self.doorkeeper[word] |= mask;
        seen
    }
}

pub(super) struct Striped<K, V> {
    stripes: [Mutex<Stripe<K, V>>; STRIPES],
    hasher: Hasher,
}

impl<K: Hash + Eq, V> Default for Striped<K, V> {
    fn default() -> Self {
        let hasher = Hasher::default();
        let stripe = || Mutex::new(Stripe { map: HashMap::with_hasher(hasher.clone()), doorkeeper: vec![0; DOORKEEPER_BITS / 64].into(), shown: 0 });
        Striped { stripes: std::array::from_fn(|_| stripe()), hasher }
    }
}

impl<K: Hash + Eq, V> Striped<K, V> {
    pub(super) fn hash(&self, key: &K) -> u64 {
        self.hasher.hash_one(key)
    }

    /// The stripe of the key whose hash is `hash`, locked.
    pub(super) fn stripe(&self, hash: u64) -> MutexGuard<'_, Stripe<K, V>> {
        self.stripes[(hash >> 60) as usize % STRIPES].lock().unwrap()
    }

    /// Every stripe in turn, locked.
    pub(super) fn stripes(&self) -> impl Iterator<Item = MutexGuard<'_, Stripe<K, V>>> {
        self.stripes.iter().map(|stripe| stripe.lock().unwrap())
    }

    pub(super) fn clear(&self) {
        self.stripes().for_each(|mut stripe| stripe.map.clear());
    }
}
