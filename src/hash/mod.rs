//! Shard placement that agrees exactly with PostgreSQL 15 hash partitioning.
//!
//! Shard `i` of a table with `n` shards holds exactly the rows that
//! `PARTITION BY HASH (col) ... FOR VALUES WITH (MODULUS n, REMAINDER i)` holds
//! on a PostgreSQL 15 server:
//!
//! 1. the column type's extended hash function (support function 2 of its
//!    default hash operator class) hashes the value with
//!    [`HASH_PARTITION_SEED`];
//! 2. the row hash is `hash_combine64(0, h)`, or 0 for NULL ([`row_hash`]);
//! 3. the shard is `row_hash % n` as unsigned 64-bit ([`shard_index`]).
//!
//! Values arrive in PostgreSQL's text form ([`hash_text`]) or binary
//! send/recv form ([`hash_binary`]). Anything we cannot interpret with
//! certainty is rejected with a [`HashInputError`] so the caller can ask the
//! server instead; a wrong hash is never returned for an accepted input.
//!
//! Assumptions: the workers are little-endian (PostgreSQL hashes raw memory,
//! so big-endian servers place rows differently), use UTF-8 as server
//! encoding, and partition text columns under a deterministic collation.
//!
//! Values are hashed as the unconstrained type. A column declared with a type
//! modifier coerces the value before routing, which can change the hash:
//! `numeric(p,s)` rounds to `s` decimals (1.005 is stored, and routed, as
//! 1.01 in numeric(10,2)), `timestamp(p)` rounds fractional seconds and
//! `varchar(n)` drops excess trailing spaces. For such columns the caller must
//! apply the coercion first or ask the server. (`char(n)` is safe: its hash
//! ignores trailing spaces anyway.)

mod array;
mod datetime;
mod jenkins;
mod numeric;
mod scalar;

use std::collections::BTreeSet;
use std::fmt;

pub use jenkins::HASH_PARTITION_SEED;

/// Distribution-column types whose hash we reproduce.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum HashType {
    Int2,
    Int4,
    Int8,
    /// `text` and `varchar` (varchar has no hash opclass of its own and uses text's).
    Text,
    /// `char(n)` / `bpchar`.
    Bpchar,
    Uuid,
    Numeric,
    Date,
    Timestamp,
    TimestampTz,
    Bool,
    Bytea,
    Oid,
    /// The single-byte `"char"` type.
    Char,
    /// A one- or more-dimensional array of one of the types above.
    Array(&'static HashType),
}

/// The scalar types a table can be distributed by, by oid, with their hash
/// type; arrays of them too (`DISTRIBUTABLE_ARRAYS`). The coordinator
/// database's shard lookup makes its probe tables from both lists (see
/// metadata::install).
pub static DISTRIBUTABLE_TYPES: [(u32, HashType); 15] = [
    (16, HashType::Bool),
    (17, HashType::Bytea),
    (18, HashType::Char),
    (20, HashType::Int8),
    (21, HashType::Int2),
    (23, HashType::Int4),
    (25, HashType::Text),
    (1043, HashType::Text),
    (26, HashType::Oid),
    (1042, HashType::Bpchar),
    (1082, HashType::Date),
    (1114, HashType::Timestamp),
    (1184, HashType::TimestampTz),
    (1700, HashType::Numeric),
    (2950, HashType::Uuid),
];

/// The array types of `DISTRIBUTABLE_TYPES`: (array oid, element oid).
pub const DISTRIBUTABLE_ARRAYS: [(u32, u32); 15] = [
    (1000, 16),
    (1001, 17),
    (1002, 18),
    (1016, 20),
    (1005, 21),
    (1007, 23),
    (1009, 25),
    (1015, 1043),
    (1028, 26),
    (1014, 1042),
    (1182, 1082),
    (1115, 1114),
    (1185, 1184),
    (1231, 1700),
    (2951, 2950),
];

/// Every type oid a table can be distributed by.
pub fn distributable_type_oids() -> impl Iterator<Item = u32> {
    DISTRIBUTABLE_TYPES.iter().map(|(oid, _)| *oid).chain(DISTRIBUTABLE_ARRAYS.iter().map(|(oid, _)| *oid))
}

/// The element type of a distributable array type.
pub fn array_element_oid(oid: u32) -> Option<u32> {
    DISTRIBUTABLE_ARRAYS.iter().find(|(array, _)| *array == oid).map(|(_, element)| *element)
}

impl HashType {
    /// Maps a PostgreSQL type oid to its hash type; `None` when unsupported.
    pub fn from_type_oid(oid: u32) -> Option<HashType> {
        let scalar = |oid: u32| DISTRIBUTABLE_TYPES.iter().find(|(o, _)| *o == oid).map(|(_, ty)| ty);
        match array_element_oid(oid) {
            Some(element) => scalar(element).map(HashType::Array),
            None => scalar(oid).copied(),
        }
    }

    /// Whether SQL can call this type's extended hash function, so that a
    /// node can compute shard indexes itself (`shard_filter_sql`): not
    /// bytea's, which takes `internal`.
    pub fn hashes_in_sql(self) -> bool {
        self != HashType::Bytea
    }

    /// The PostgreSQL type name, as used in error messages.
    pub fn sql_name(self) -> &'static str {
        match self {
            HashType::Int2 => "smallint",
            HashType::Int4 => "integer",
            HashType::Int8 => "bigint",
            HashType::Text => "text",
            HashType::Bpchar => "bpchar",
            HashType::Uuid => "uuid",
            HashType::Numeric => "numeric",
            HashType::Date => "date",
            HashType::Timestamp => "timestamp",
            HashType::TimestampTz => "timestamptz",
            HashType::Bool => "boolean",
            HashType::Bytea => "bytea",
            HashType::Oid => "oid",
            HashType::Char => "\"char\"",
            HashType::Array(_) => "array",
        }
    }
}

/// Why a value could not be hashed locally. The caller should fall back to
/// asking the server (or report the error, if the server rejects it too).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HashInputError(pub String);

impl fmt::Display for HashInputError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for HashInputError {}

/// Builds the error for a text-form input.
pub(crate) fn text_error(ty: HashType, input: &str, reason: impl fmt::Display) -> HashInputError {
    const MAX_SHOWN: usize = 64;
    let shown: String = input.chars().take(MAX_SHOWN).collect();
    let ellipsis = if shown.len() < input.len() { "..." } else { "" };
    HashInputError(format!("cannot hash {} text value \"{shown}{ellipsis}\": {reason}", ty.sql_name()))
}

/// Builds the error for a binary-form input.
pub(crate) fn binary_error(ty: HashType, reason: impl fmt::Display) -> HashInputError {
    HashInputError(format!("cannot hash {} binary value: {reason}", ty.sql_name()))
}

/// A value decoded far enough to be hashed the way its type's hash function does.
pub(crate) enum Hashable<'a> {
    /// Hashed as one 32-bit word (`hash_uint32_extended`).
    Word(u32),
    /// An int8-like value (`hashint8extended`, also used by timestamps).
    Int8(i64),
    /// Hashed as a byte string (`hash_any_extended`).
    Bytes(std::borrow::Cow<'a, [u8]>),
    Numeric(numeric::NumericValue),
}

impl Hashable<'_> {
    fn hash(&self, seed: u64) -> u64 {
        match self {
            Hashable::Word(w) => jenkins::hash_u32(*w, seed),
            Hashable::Int8(v) => jenkins::hash_u32(fold_int8(*v), seed),
            Hashable::Bytes(b) => jenkins::hash_bytes(b, seed),
            Hashable::Numeric(n) => n.hash(seed),
        }
    }
}

/// Folds an int8 into 32 bits the way `hashint8extended` does. Folding (rather
/// than hashing all 8 bytes) makes every int8 that fits in int4 hash exactly
/// like the equal int4, which cross-type hash joins rely on: for negative
/// values the high half is all ones, so XOR-ing its complement (zero) leaves
/// the low half unchanged.
fn fold_int8(v: i64) -> u32 {
    let lo = v as u32;
    let hi = (v >> 32) as u32;
    lo ^ if v >= 0 { hi } else { !hi }
}

/// Hash of one non-NULL value given in PostgreSQL's text I/O form (what a SQL
/// literal, a text-format Bind parameter or a COPY text/CSV field holds,
/// already unescaped).
pub fn hash_text(ty: HashType, text: &str) -> Result<u64, HashInputError> {
    let value = match ty {
        HashType::Int2 => Hashable::Word(scalar::parse_int(ty, text, i16::MIN.into(), i16::MAX.into())? as i32 as u32),
        HashType::Int4 => Hashable::Word(scalar::parse_int(ty, text, i32::MIN.into(), i32::MAX.into())? as i32 as u32),
        HashType::Int8 => Hashable::Int8(scalar::parse_int(ty, text, i64::MIN, i64::MAX)?),
        HashType::Oid => Hashable::Word(scalar::parse_oid(text)?),
        HashType::Bool => Hashable::Word(u32::from(scalar::parse_bool(text)?)),
        HashType::Char => Hashable::Word(scalar::char_word(scalar::parse_char(text)).ok_or_else(|| text_error(ty, text, scalar::CHAR_HIGH_BIT))?),
        HashType::Text => Hashable::Bytes(scalar::check_text(ty, text)?.as_bytes().into()),
        HashType::Bpchar => Hashable::Bytes(scalar::strip_bpchar(scalar::check_text(ty, text)?.as_bytes()).into()),
        HashType::Bytea => Hashable::Bytes(scalar::parse_bytea(text)?.into()),
        HashType::Uuid => Hashable::Bytes(scalar::parse_uuid(text)?.to_vec().into()),
        HashType::Numeric => Hashable::Numeric(numeric::parse_text(text)?),
        HashType::Date => Hashable::Word(datetime::parse_date(text)? as u32),
        HashType::Timestamp | HashType::TimestampTz => Hashable::Int8(datetime::parse_timestamp(ty, text)?),
        HashType::Array(element) => return array::hash_array_text(ty, *element, text),
    };
    Ok(value.hash(HASH_PARTITION_SEED))
}

/// Hash of one non-NULL value given in PostgreSQL's binary send/recv form
/// (binary-format Bind parameters, binary COPY fields).
pub fn hash_binary(ty: HashType, bytes: &[u8]) -> Result<u64, HashInputError> {
    let value = match ty {
        HashType::Int2 => Hashable::Word(i16::from_be_bytes(fixed(ty, bytes)?) as i32 as u32),
        HashType::Int4 => Hashable::Word(i32::from_be_bytes(fixed(ty, bytes)?) as u32),
        HashType::Int8 => Hashable::Int8(i64::from_be_bytes(fixed(ty, bytes)?)),
        HashType::Oid => Hashable::Word(u32::from_be_bytes(fixed(ty, bytes)?)),
        // boolrecv maps every non-zero byte to true.
        HashType::Bool => Hashable::Word(u32::from(fixed::<1>(ty, bytes)?[0] != 0)),
        HashType::Char => Hashable::Word(scalar::char_word(fixed::<1>(ty, bytes)?[0]).ok_or_else(|| binary_error(ty, scalar::CHAR_HIGH_BIT))?),
        HashType::Text => Hashable::Bytes(scalar::check_text_bytes(ty, bytes)?.into()),
        HashType::Bpchar => Hashable::Bytes(scalar::strip_bpchar(scalar::check_text_bytes(ty, bytes)?).into()),
        HashType::Bytea => Hashable::Bytes(bytes.into()),
        HashType::Uuid => Hashable::Bytes(fixed::<16>(ty, bytes)?.to_vec().into()),
        HashType::Numeric => Hashable::Numeric(numeric::parse_binary(bytes)?),
        HashType::Date => Hashable::Word(datetime::check_date(i32::from_be_bytes(fixed(ty, bytes)?))? as u32),
        HashType::Timestamp | HashType::TimestampTz => Hashable::Int8(datetime::check_timestamp(ty, i64::from_be_bytes(fixed(ty, bytes)?))?),
        HashType::Array(element) => return array::hash_array_binary(ty, *element, bytes),
    };
    Ok(value.hash(HASH_PARTITION_SEED))
}

fn fixed<const N: usize>(ty: HashType, bytes: &[u8]) -> Result<[u8; N], HashInputError> {
    bytes.try_into().map_err(|_| binary_error(ty, format_args!("expected {N} bytes, got {}", bytes.len())))
}

/// The partition row hash for a single-column key: `None` (NULL) -> 0,
/// `Some(h)` -> `hash_combine64(0, h)`.
pub fn row_hash(value_hash: Option<u64>) -> u64 {
    // compute_partition_hash_value skips NULL columns entirely.
    value_hash.map_or(0, |h| jenkins::hash_combine64(0, h))
}

/// Which shard (remainder) of `shard_count` holds a row with this row hash.
///
/// # Panics
/// If `shard_count` is 0 (PostgreSQL requires a positive modulus).
pub fn shard_index(row_hash: u64, shard_count: u32) -> u32 {
    assert!(shard_count > 0, "shard_count must be positive");
    (row_hash % u64::from(shard_count)) as u32
}

/// A SQL condition a PostgreSQL 15 node evaluates to true for the rows
/// whose `value`, an expression of hash type `ty`, belongs in one of the
/// shards `remainders` of `shard_count` (`shard_index(row_hash(…), …)`), so
/// that the node itself can send each row where its shard lives. None for
/// the types whose extended hash function SQL cannot call
/// (`HashType::hashes_in_sql`).
pub fn shard_filter_sql(ty: HashType, value: &str, shard_count: u32, remainders: &[u32]) -> Option<String> {
    let hash = hash_sql(ty, value)?;
    let wanted: BTreeSet<u32> = remainders.iter().copied().filter(|r| *r < shard_count).collect();
    if wanted.is_empty() {
        return Some("false".to_string());
    }
    if wanted.len() == shard_count as usize {
        return Some("true".to_string());
    }
    let combined = jenkins::hash_combine64(0, 0);
    if !shard_count.is_power_of_two() {
        // int8 arithmetic must not overflow: the unsigned sum goes through
        // numeric. compute_partition_hash_value leaves a NULL out of the row
        // hash, which is then 0.
        let wrap = 1u128 << 64;
        let index = format!("pg_catalog.mod(pg_catalog.mod(({hash})::numeric + {}, {wrap}), {shard_count})", wrap + u128::from(combined));
        return Some(format!("COALESCE({index}, 0) IN ({})", join_numbers(wanted.iter())));
    }
    // With a power of two the shard index is the low bits of the hash plus
    // a constant. Where the wanted shards are every 2^k-th one (a node's
    // share with shards placed round robin), the k lowest bits decide, and
    // the constant moves to the compared side: one bitwise AND per row, not
    // four operators and a list, which costs half the filter's time over a
    // scan of millions of rows.
    let bits = (0..=shard_count.trailing_zeros()).find(|&k| decided_by_low_bits(&wanted, shard_count, k)).expect("all bits decide");
    let mask = (1u64 << bits) - 1;
    let shifted: BTreeSet<u64> = wanted.iter().map(|r| u64::from(*r).wrapping_sub(combined) & mask).collect();
    // A NULL key's row hash is 0, so it goes to shard 0.
    let null_bits = 0u64.wrapping_sub(combined) & mask;
    let low_bits = format!("COALESCE({hash} & {mask}, {null_bits})");
    Some(match shifted.len() {
        1 => format!("{low_bits} = {}", shifted.first().expect("one")),
        _ => format!("{low_bits} IN ({})", join_numbers(shifted.iter())),
    })
}

/// Whether membership of a shard index in `wanted` depends only on its `k`
/// lowest bits.
fn decided_by_low_bits(wanted: &BTreeSet<u32>, shard_count: u32, k: u32) -> bool {
    let mask = (1u32 << k) - 1;
    (0..shard_count).all(|r| wanted.contains(&r) == wanted.contains(&(r & mask)))
}

fn join_numbers<T: fmt::Display>(numbers: impl Iterator<Item = T>) -> String {
    numbers.map(|n| n.to_string()).collect::<Vec<_>>().join(", ")
}

/// The call of `ty`'s extended hash function on `value` with the partition
/// seed.
fn hash_sql(ty: HashType, value: &str) -> Option<String> {
    if !ty.hashes_in_sql() {
        return None;
    }
    let (function, argument) = match ty {
        HashType::Int2 => ("hashint2extended", value.to_string()),
        HashType::Int4 => ("hashint4extended", value.to_string()),
        // A date is hashed as its day number from 2000-01-01, a timestamp as
        // its microseconds from then: the values they are stored as.
        HashType::Date => (
            "hashint4extended",
            format!("CASE WHEN pg_catalog.isfinite({value}) THEN ({value}) - DATE '2000-01-01' WHEN ({value}) > DATE '2000-01-01' THEN 2147483647 WHEN ({value}) < DATE '2000-01-01' THEN -2147483648 END"),
        ),
        HashType::Int8 => ("hashint8extended", value.to_string()),
        HashType::Text => ("hashtextextended", format!("({value})::text")),
        HashType::Bpchar => ("hashbpcharextended", value.to_string()),
        HashType::Uuid => ("uuid_hash_extended", value.to_string()),
        HashType::Numeric => ("hash_numeric_extended", value.to_string()),
        HashType::Timestamp | HashType::TimestampTz => {
            let finite = format!("((EXTRACT(epoch FROM {value}) - 946684800) * 1000000)::int8");
            let infinite = format!("WHEN ({value}) > 'epoch' THEN 9223372036854775807 WHEN ({value}) < 'epoch' THEN -9223372036854775808");
            ("hashint8extended", format!("CASE WHEN pg_catalog.isfinite({value}) THEN {finite} {infinite} END"))
        }
        // bool_ops hashes the value's byte as a "char".
        HashType::Bool => ("hashcharextended", format!("({value})::int4::\"char\"")),
        HashType::Oid => ("hashoidextended", value.to_string()),
        HashType::Char => ("hashcharextended", value.to_string()),
        HashType::Array(_) => ("hash_array_extended", value.to_string()),
        HashType::Bytea => unreachable!("refused above"),
    };
    let seed = HASH_PARTITION_SEED as i64;
    Some(format!("pg_catalog.{function}({argument}, {seed})"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn type_oids() {
        assert_eq!(HashType::from_type_oid(23), Some(HashType::Int4));
        assert_eq!(HashType::from_type_oid(1043), Some(HashType::Text));
        assert_eq!(HashType::from_type_oid(18), Some(HashType::Char));
        assert_eq!(HashType::from_type_oid(19), None); // name
        assert_eq!(HashType::from_type_oid(700), None); // float4
    }

    #[test]
    fn null_row_hash_is_zero() {
        assert_eq!(row_hash(None), 0);
        for n in [1, 2, 3, 7, 64] {
            assert_eq!(shard_index(row_hash(None), n), 0);
        }
    }

    #[test]
    fn int8_fold_matches_int4() {
        for v in [0i32, 1, -1, 42, i32::MIN, i32::MAX] {
            assert_eq!(hash_text(HashType::Int8, &v.to_string()), hash_text(HashType::Int4, &v.to_string()));
        }
    }

    #[test]
    fn known_server_values() {
        // From PostgreSQL 15: SELECT hash_numeric_extended(x, 8816678312871386365)
        assert_eq!(hash_text(HashType::Numeric, "0").unwrap(), HASH_PARTITION_SEED - 1);
        assert_eq!(hash_text(HashType::Numeric, "NaN").unwrap(), HASH_PARTITION_SEED);
        assert_eq!(hash_text(HashType::Numeric, "-12.5").unwrap() as i64, -7880450537691530978);
        assert_eq!(hash_text(HashType::Int4, "1").unwrap() as i64, 5968994663651403477);
        // satisfies_hash_partition('p_int4', 7, 5, 1) and (64, 56, 1) are true.
        let h = row_hash(Some(hash_text(HashType::Int4, "1").unwrap()));
        assert_eq!(shard_index(h, 7), 5);
        assert_eq!(shard_index(h, 64), 56);
    }

    #[test]
    fn binary_length_is_checked() {
        assert!(hash_binary(HashType::Int4, &[0, 0, 1]).is_err());
        assert!(hash_binary(HashType::Int8, &[0; 9]).is_err());
        assert!(hash_binary(HashType::Uuid, &[0; 15]).is_err());
        assert!(hash_binary(HashType::Bool, &[]).is_err());
        assert_eq!(hash_binary(HashType::Bool, &[2]), hash_text(HashType::Bool, "t"));
    }

    #[test]
    fn error_message_names_type() {
        let e = hash_text(HashType::Int4, "abc").unwrap_err();
        assert!(e.to_string().contains("integer"), "{e}");
        assert!(e.to_string().contains("abc"), "{e}");
    }
}
