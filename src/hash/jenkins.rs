//! Bob Jenkins' lookup3 hash in the 64-bit, seeded form PostgreSQL uses for
//! its `*extended` hash support functions (`hash_bytes_extended` and
//! `hash_bytes_uint32_extended` in PostgreSQL's `common/hashfn.c`).
//!
//! PostgreSQL reads the key a 32-bit word at a time in native byte order, so
//! its results differ between little- and big-endian servers. We reproduce the
//! little-endian variant, which is what every x86-64 and AArch64 server runs.

/// Seed PostgreSQL passes to every partition-key hash function
/// (`HASH_PARTITION_SEED` in `catalog/partition.h`).
pub const HASH_PARTITION_SEED: u64 = 0x7A5B_2236_7996_DCFD;

/// Initial value of the three lookup3 state words before the length is added.
const GOLDEN: u32 = 0x9e37_79b9;
/// PostgreSQL adds this to the initial state on top of lookup3's golden ratio.
const PG_INIT_OFFSET: u32 = 3_923_095;

#[derive(Clone, Copy)]
struct State {
    a: u32,
    b: u32,
    c: u32,
}

impl State {
    fn new(len: u32, seed: u64) -> State {
        let init = GOLDEN.wrapping_add(len).wrapping_add(PG_INIT_OFFSET);
        let mut s = State { a: init, b: init, c: init };
        // A zero seed leaves the state untouched, so seeded and unseeded
        // hashing coincide for seed 0.
        if seed != 0 {
            s.a = s.a.wrapping_add((seed >> 32) as u32);
            s.b = s.b.wrapping_add(seed as u32);
            s.mix();
        }
        s
    }

    fn mix(&mut self) {
        let State { mut a, mut b, mut c } = *self;
        a = a.wrapping_sub(c);
        a ^= c.rotate_left(4);
        c = c.wrapping_add(b);
        b = b.wrapping_sub(a);
        b ^= a.rotate_left(6);
        a = a.wrapping_add(c);
        c = c.wrapping_sub(b);
        c ^= b.rotate_left(8);
        b = b.wrapping_add(a);
        a = a.wrapping_sub(c);
        a ^= c.rotate_left(16);
        c = c.wrapping_add(b);
        b = b.wrapping_sub(a);
        b ^= a.rotate_left(19);
        a = a.wrapping_add(c);
        c = c.wrapping_sub(b);
        c ^= b.rotate_left(4);
        b = b.wrapping_add(a);
        *self = State { a, b, c };
    }

    fn finish(mut self) -> u64 {
        let State { mut a, mut b, mut c } = self;
        c ^= b;
        c = c.wrapping_sub(b.rotate_left(14));
        a ^= c;
        a = a.wrapping_sub(c.rotate_left(11));
        b ^= a;
        b = b.wrapping_sub(a.rotate_left(25));
        c ^= b;
        c = c.wrapping_sub(b.rotate_left(16));
        a ^= c;
        a = a.wrapping_sub(c.rotate_left(4));
        b ^= a;
        b = b.wrapping_sub(a.rotate_left(14));
        c ^= b;
        c = c.wrapping_sub(b.rotate_left(24));
        self = State { a, b, c };
        (u64::from(self.b) << 32) | u64::from(self.c)
    }
}

fn le_word(bytes: &[u8]) -> u32 {
    u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]])
}

/// `hash_bytes_extended`: 64-bit seeded hash of a byte string.
pub fn hash_bytes(key: &[u8], seed: u64) -> u64 {
    // PostgreSQL takes the length as a C int; datums are capped at 1 GB so the
    // truncation can never bite.
    let mut s = State::new(key.len() as u32, seed);
    let mut blocks = key.chunks_exact(12);
    for block in &mut blocks {
        s.a = s.a.wrapping_add(le_word(&block[0..4]));
        s.b = s.b.wrapping_add(le_word(&block[4..8]));
        s.c = s.c.wrapping_add(le_word(&block[8..12]));
        s.mix();
    }
    // The last 0..=11 bytes fill a and b as little-endian words, but c's bytes
    // start one position up: lookup3 reserves c's low byte for the length.
    for (i, &byte) in blocks.remainder().iter().enumerate() {
        let byte = u32::from(byte);
        match i {
            0..=3 => s.a = s.a.wrapping_add(byte << (8 * i)),
            4..=7 => s.b = s.b.wrapping_add(byte << (8 * (i - 4))),
            _ => s.c = s.c.wrapping_add(byte << (8 * (i - 7))),
        }
    }
    s.finish()
}

/// `hash_bytes_uint32_extended`: 64-bit seeded hash of one 32-bit word.
pub fn hash_u32(k: u32, seed: u64) -> u64 {
    let mut s = State::new(4, seed);
    s.a = s.a.wrapping_add(k);
    s.finish()
}

/// `hash_combine64` from `common/hashfn.h`.
pub fn hash_combine64(a: u64, b: u64) -> u64 {
    a ^ b.wrapping_add(0x49a0_f4dd_15e5_a8e3).wrapping_add(a << 54).wrapping_add(a >> 7)
}

#[cfg(test)]
mod tests {
    use super::*;

    // Reference values were read from a PostgreSQL 15 server, e.g.
    // `SELECT hashint4extended(1, 8816678312871386365)` (signed int8 output).
    #[test]
    fn word_hash_matches_server() {
        assert_eq!(hash_u32(1, HASH_PARTITION_SEED) as i64, 5968994663651403477);
        assert_eq!(hash_u32(0, HASH_PARTITION_SEED) as i64, -4403592609991167795);
    }

    #[test]
    fn byte_hash_matches_server() {
        assert_eq!(hash_bytes(b"", HASH_PARTITION_SEED) as i64, -5700645584453517373);
        assert_eq!(hash_bytes(b"hello world!", HASH_PARTITION_SEED) as i64, -1886269529411655687);
    }

    #[test]
    fn word_hash_equals_byte_hash_of_le_word() {
        for k in [0u32, 1, 0xdead_beef, u32::MAX] {
            for seed in [0, 1, HASH_PARTITION_SEED] {
                assert_eq!(hash_u32(k, seed), hash_bytes(&k.to_le_bytes(), seed));
            }
        }
    }

    #[test]
    fn combine_with_zero() {
        assert_eq!(hash_combine64(0, 0), 0x49a0_f4dd_15e5_a8e3);
        assert_eq!(hash_combine64(0, u64::MAX), 0x49a0_f4dd_15e5_a8e2);
    }
}
