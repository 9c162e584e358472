//! Distribution-key values: a constant, parameter or expression recognised
//! as the value of a distribution column, and the shard it hashes to —
//! locally when PostgreSQL would hash exactly those bytes, otherwise after
//! the coordinator database has converted it to the column type.

use crate::error::{sqlstate, PgError, PgResult};
use crate::hash::{self, HashType};
use crate::metadata::{Coercion, DistributedTable, Distribution, KeyType};
use pg_query::protobuf::{self, a_const};
use pg_query::NodeEnum;

/// The distribution-column value that picks the shard group.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KeyValue {
    /// A literal in PostgreSQL text form, with the type PostgreSQL gives such a
    /// constant (0 for a quoted string, whose type the column decides);
    /// `cast_to_key` when written as `literal::<key type>`.
    Literal { text: String, type_oid: u32, cast_to_key: bool },
    /// Bind parameter (0-based).
    Param(usize),
    /// Left to the column default (e.g. a serial key): the coordinator evaluates it.
    Default,
}

/// How values of a table's distribution column find their shard: hashed
/// here when that is exactly what PostgreSQL would do, otherwise converted to
/// the column type by the coordinator database first.
#[derive(Clone, Copy, Debug)]
pub struct KeyRouting<'a> {
    ty: HashType,
    key: &'a KeyType,
    shards: u32,
    /// Values are stored in the column (INSERT, COPY), so the column's type
    /// modifier applies; otherwise they are compared with it.
    assignment: bool,
}

impl<'a> KeyRouting<'a> {
    /// None for reference tables.
    pub fn new(table: &'a DistributedTable, assignment: bool) -> Option<Self> {
        match &table.distribution {
            Distribution::Hash { column_type, key, .. } => Some(KeyRouting { ty: *column_type, key, shards: table.shard_count(), assignment }),
            Distribution::Reference => None,
        }
    }

    /// The shard of a key value, when it can be hashed exactly as given; None
    /// when the coordinator database must convert it to the column type first
    /// (another type, a form we cannot parse, or — for a value being stored —
    /// a type modifier that may round it).
    pub fn local_shard(&self, value: &[u8], type_oid: u32, binary: bool) -> Option<u32> {
        local_key_shard(self.ty, self.key, self.shards, value, type_oid, binary, self.assignment)
    }

    /// The shard of a value already converted to the column type, in binary form.
    pub fn shard_for_coerced(&self, value: &[u8]) -> PgResult<u32> {
        let h = hash::hash_binary(self.ty, value).map_err(|e| key_error(&e.0))?;
        Ok(hash::shard_index(hash::row_hash(Some(h)), self.shards))
    }

    /// `SELECT $1::<type>`: converts a key value as storing it (with the
    /// column's type modifier) or comparing it with the column would.
    pub fn coercion_sql(&self) -> String {
        let target = if self.assignment { &self.key.sql } else { &self.key.base_sql };
        format!("SELECT $1::{target}")
    }

    /// The column type's oid, which binary values are in.
    pub fn type_oid(&self) -> u32 {
        self.key.oid
    }
}

/// Hashes a key value locally when that is exactly what PostgreSQL would do.
pub(super) fn local_key_shard(ty: HashType, key: &KeyType, shards: u32, value: &[u8], type_oid: u32, binary: bool, assignment: bool) -> Option<u32> {
    if assignment && key.coercion == Coercion::Always {
        return None;
    }
    let h = if binary {
        let same_type = type_oid == key.oid || (is_text_oid(type_oid) && is_text_oid(key.oid));
        if same_type {
            hash::hash_binary(ty, value).ok()?
        } else {
            hash::hash_binary(ty, &widen_integer(value, type_oid, ty)?).ok()?
        }
    } else {
        let text = std::str::from_utf8(value).ok()?;
        if assignment && key.coercion == Coercion::TrailingSpaces && text.ends_with(' ') {
            return None;
        }
        // A typed value of another family (a bpchar parameter for a text key
        // drops trailing spaces, say) converts before comparing; leave that to
        // the server. Integer and numeric text forms are the same across types.
        let compatible = type_oid == 0
            || type_oid == key.oid
            || (is_text_oid(type_oid) && is_text_oid(key.oid))
            || (is_number_oid(type_oid) && is_number_oid(key.oid));
        if !compatible {
            return None;
        }
        hash::hash_text(ty, text).ok()?
    };
    Some(hash::shard_index(hash::row_hash(Some(h)), shards))
}

pub(super) fn is_text_oid(oid: u32) -> bool {
    matches!(oid, 25 | 1043)
}

pub(super) fn is_number_oid(oid: u32) -> bool {
    matches!(oid, 20 | 21 | 23 | 1700)
}

/// A binary integer of one width re-encoded for an integer key of another.
pub(super) fn widen_integer(value: &[u8], type_oid: u32, ty: HashType) -> Option<Vec<u8>> {
    let n: i64 = match (type_oid, value.len()) {
        (21, 2) => i16::from_be_bytes(value.try_into().ok()?) as i64,
        (23, 4) => i32::from_be_bytes(value.try_into().ok()?) as i64,
        (20, 8) => i64::from_be_bytes(value.try_into().ok()?),
        _ => return None,
    };
    match ty {
        HashType::Int2 => i16::try_from(n).ok().map(|v| v.to_be_bytes().to_vec()),
        HashType::Int4 => i32::try_from(n).ok().map(|v| v.to_be_bytes().to_vec()),
        HashType::Int8 => Some(n.to_be_bytes().to_vec()),
        _ => None,
    }
}

pub(super) fn key_error(why: &str) -> PgError {
    PgError::new(sqlstate::INVALID_PARAMETER_VALUE, format!("could not compute the shard for the distribution column value: {why}"))
}

/// A constant or parameter usable as a shard key: `5`, `'abc'`, `$1`, `$1::int`,
/// or a literal cast to the key's own type (`'2024-01-01'::date`). Other casts
/// may change the value (`1.25::numeric(3,1)` is 1.3), so they pin nothing.
pub(super) fn key_value(node: &protobuf::Node, key: &KeyType) -> Option<Result<KeyValue, PgError>> {
    match node.node.as_ref()? {
        NodeEnum::ParamRef(p) => Some(Ok(KeyValue::Param((p.number - 1).max(0) as usize))),
        NodeEnum::TypeCast(c) => {
            let type_name = c.type_name.as_ref()?;
            if !type_name.typmods.is_empty() || (!type_name.array_bounds.is_empty() && !names_key_type(type_name, key)) {
                return None;
            }
            match c.arg.as_deref()?.node.as_ref()? {
                NodeEnum::ParamRef(p) => Some(Ok(KeyValue::Param((p.number - 1).max(0) as usize))),
                NodeEnum::AConst(_) if names_key_type(type_name, key) => match key_value(c.arg.as_deref()?, key)? {
                    Ok(KeyValue::Literal { text, type_oid, .. }) => Some(Ok(KeyValue::Literal { text, type_oid, cast_to_key: true })),
                    other => Some(other),
                },
                _ => None,
            }
        }
        NodeEnum::AConst(c) => {
            if c.isnull {
                return Some(Err(PgError::new(sqlstate::NOT_NULL_VIOLATION, "cannot perform an INSERT with NULL in the partition column")));
            }
            let (text, type_oid) = match c.val.as_ref()? {
                a_const::Val::Ival(i) => (i.ival.to_string(), 23),
                a_const::Val::Fval(f) => (f.fval.clone(), 1700),
                a_const::Val::Sval(s) => (s.sval.clone(), 0),
                a_const::Val::Boolval(b) => (b.boolval.to_string(), 16),
                a_const::Val::Bsval(_) => return None,
            };
            Some(Ok(KeyValue::Literal { text, type_oid, cast_to_key: false }))
        }
        _ => None,
    }
}

/// Whether a cast's type is the key column's own type (`'{a}'::bpchar[]`
/// for a `char(1)[]` key).
pub(super) fn names_key_type(type_name: &protobuf::TypeName, key: &KeyType) -> bool {
    let Some(NodeEnum::String(last)) = type_name.names.last().and_then(|n| n.node.as_ref()) else { return false };
    let named = match type_name.array_bounds.as_slice() {
        [] => internal_type_name(key.oid),
        [_] => hash::array_element_oid(key.oid).and_then(internal_type_name),
        _ => None,
    };
    named.is_some_and(|internal| last.sval == internal)
}

/// The internal name of a distribution column's type (as in `'5'::int8`).
pub(super) fn key_type_name(key: &KeyType) -> Option<&'static str> {
    internal_type_name(key.oid)
}

fn internal_type_name(oid: u32) -> Option<&'static str> {
    Some(match oid {
        21 => "int2",
        23 => "int4",
        20 => "int8",
        25 => "text",
        1043 => "varchar",
        1042 => "bpchar",
        2950 => "uuid",
        1700 => "numeric",
        1082 => "date",
        1114 => "timestamp",
        1184 => "timestamptz",
        16 => "bool",
        17 => "bytea",
        26 => "oid",
        18 => "char",
        _ => return None,
    })
}

/// Where an INSERT row goes: a shard now, or one resolved at execution.
pub(super) fn insert_target(key_value: &KeyValue, ty: HashType, key: &KeyType, shards: u32) -> ShardTarget {
    match key_value {
        KeyValue::Literal { text, type_oid, .. } => match local_key_shard(ty, key, shards, text.as_bytes(), *type_oid, false, true) {
            Some(shard) => ShardTarget::Shard(shard),
            None => ShardTarget::Key(key_value.clone()),
        },
        other => ShardTarget::Key(other.clone()),
    }
}

/// What `dist_col = value` in a WHERE clause pins. A typed literal of another
/// type that we cannot hash pins nothing: PostgreSQL compares it in its own type
/// (`int_col = 5.5`, `int_col = 3000000000`), so no conversion to the column
/// type is sure to keep its meaning. A quoted literal or an explicit cast to the
/// key type does convert, and the coordinator database can do that.
pub(super) fn pin_target(key_value: &KeyValue, ty: HashType, key: &KeyType, shards: u32) -> Option<ShardTarget> {
    match key_value {
        KeyValue::Literal { text, type_oid, cast_to_key } => match local_key_shard(ty, key, shards, text.as_bytes(), *type_oid, false, false) {
            Some(shard) => Some(ShardTarget::Shard(shard)),
            None if *type_oid == 0 || *cast_to_key => Some(ShardTarget::Key(key_value.clone())),
            None => None,
        },
        other => Some(ShardTarget::Key(other.clone())),
    }
}

/// Where a router statement runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ShardTarget {
    /// Only reference tables: reads use one placement, writes every placement.
    Reference,
    /// One shard group, known at planning time.
    Shard(u32),
    /// One shard group, known once the key value (a parameter, or a literal the
    /// coordinator database must first coerce to the column type) is resolved.
    Key(KeyValue),
    /// A multi-row INSERT whose rows may go to different shard groups.
    InsertRows(Vec<KeyValue>),
    /// Tables pinned by different key values (`a.k = $1 AND b.k = $2`, not
    /// joined on their keys): one shard group when all values fall in it,
    /// which the executor checks first (`executor::keys_meet`).
    SameKeys(Vec<KeyValue>),
    /// Any one of these node groups, the statement unchanged: user code runs
    /// over the worker-side relations, which show every node whole tables.
    AnyNode(Vec<i32>),
}
