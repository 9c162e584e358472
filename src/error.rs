//! The error every user-visible failure becomes: a PostgreSQL error with a SQLSTATE.

use std::fmt;

/// SQLSTATE codes the coordinator raises itself.
pub mod sqlstate {
    pub const FEATURE_NOT_SUPPORTED: &str = "0A000";
    pub const INVALID_PARAMETER_VALUE: &str = "22023";
    pub const NOT_NULL_VIOLATION: &str = "23502";
    pub const INVALID_TRANSACTION_STATE: &str = "25000";
    pub const ACTIVE_SQL_TRANSACTION: &str = "25001";
    pub const IN_FAILED_TRANSACTION: &str = "25P02";
    pub const NO_ACTIVE_SQL_TRANSACTION: &str = "25P01";
    pub const PROTOCOL_VIOLATION: &str = "08P01";
    pub const CONNECTION_FAILURE: &str = "08006";
    pub const CONNECTION_EXCEPTION: &str = "08000";
    pub const UNABLE_TO_CONNECT: &str = "08001";
    pub const INVALID_AUTHORIZATION: &str = "28000";
    pub const INVALID_PASSWORD: &str = "28P01";
    pub const UNDEFINED_TABLE: &str = "42P01";
    pub const UNDEFINED_COLUMN: &str = "42703";
    pub const UNDEFINED_OBJECT: &str = "42704";
    pub const DUPLICATE_OBJECT: &str = "42710";
    pub const INVALID_TABLE_DEFINITION: &str = "42P16";
    pub const WRONG_OBJECT_TYPE: &str = "42809";
    pub const INSUFFICIENT_PRIVILEGE: &str = "42501";
    pub const INVALID_SQL_STATEMENT_NAME: &str = "26000";
    pub const INVALID_CURSOR_NAME: &str = "34000";
    pub const SYNTAX_ERROR: &str = "42601";
    pub const DATATYPE_MISMATCH: &str = "42804";
    pub const INTERNAL_ERROR: &str = "XX000";
    pub const OBJECT_NOT_IN_PREREQUISITE_STATE: &str = "55000";
    pub const OBJECT_IN_USE: &str = "55006";
    pub const QUERY_CANCELED: &str = "57014";
    pub const BAD_COPY_FILE_FORMAT: &str = "22P04";
    pub const DEADLOCK_DETECTED: &str = "40P01";
    pub const TOO_MANY_CONNECTIONS: &str = "53300";
    pub const OUT_OF_MEMORY: &str = "53200";
}

/// An error or notice in PostgreSQL's field form (severity, SQLSTATE, message,
/// detail, hint, …). Errors relayed from a server keep every field they came with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PgError {
    fields: Vec<(u8, String)>,
}

/// `text` with every `"name"` that `rename` renames replaced.
fn rename_quoted(text: &str, rename: &impl Fn(&str) -> Option<&str>) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(open) = rest.find('"') {
        let Some(len) = rest[open + 1..].find('"') else { break };
        let name = &rest[open + 1..open + 1 + len];
        out.push_str(&rest[..=open]);
        out.push_str(rename(name).unwrap_or(name));
        out.push('"');
        rest = &rest[open + len + 2..];
    }
    out.push_str(rest);
    out
}

/// Privilege errors name their object last and unquoted ("permission denied
/// for table accounts_102008").
fn rename_last_word(text: &str, rename: &impl Fn(&str) -> Option<&str>) -> String {
    let (head, last) = text.rsplit_once(' ').unwrap_or(("", text));
    match rename(last) {
        Some(new) if head.is_empty() => new.to_string(),
        Some(new) => format!("{head} {new}"),
        None => text.to_string(),
    }
}

impl PgError {
    pub fn new(code: &str, message: impl Into<String>) -> Self {
        PgError { fields: vec![(b'S', "ERROR".into()), (b'V', "ERROR".into()), (b'C', code.into()), (b'M', message.into())] }
    }
    pub fn notice(message: impl Into<String>) -> Self {
        PgError { fields: vec![(b'S', "NOTICE".into()), (b'V', "NOTICE".into()), (b'C', "00000".into()), (b'M', message.into())] }
    }
    pub fn warning(code: &str, message: impl Into<String>) -> Self {
        PgError { fields: vec![(b'S', "WARNING".into()), (b'V', "WARNING".into()), (b'C', code.into()), (b'M', message.into())] }
    }
    pub fn from_fields(fields: Vec<(u8, String)>) -> Self {
        PgError { fields }
    }
    pub fn fields(&self) -> impl Iterator<Item = (u8, &str)> {
        self.fields.iter().map(|(c, v)| (*c, v.as_str()))
    }
    fn field(&self, code: u8) -> Option<&str> {
        self.fields.iter().find(|(c, _)| *c == code).map(|(_, v)| v.as_str())
    }
    fn set(mut self, code: u8, value: String) -> Self {
        match self.fields.iter_mut().find(|(c, _)| *c == code) {
            Some(slot) => slot.1 = value,
            None => self.fields.push((code, value)),
        }
        self
    }
    pub fn code(&self) -> &str {
        self.field(b'C').unwrap_or("XX000")
    }
    pub fn message(&self) -> &str {
        self.field(b'M').unwrap_or("")
    }
    pub fn detail(&self) -> Option<&str> {
        self.field(b'D')
    }
    pub fn hint(&self) -> Option<&str> {
        self.field(b'H')
    }
    pub fn context(&self) -> Option<&str> {
        self.field(b'W')
    }
    pub fn severity(&self) -> &str {
        self.field(b'V').or_else(|| self.field(b'S')).unwrap_or("ERROR")
    }
    /// FATAL and PANIC errors end the session that receives them.
    pub fn is_fatal(&self) -> bool {
        matches!(self.severity(), "FATAL" | "PANIC")
    }
    /// The node could not be reached or would not take connections now
    /// (down, shutting down, starting up): nothing was asked of it.
    pub fn is_node_unreachable(&self) -> bool {
        self.code().starts_with("08") || matches!(self.code(), "57P01" | "57P02" | "57P03")
    }
    pub fn with_detail(self, detail: impl Into<String>) -> Self {
        self.set(b'D', detail.into())
    }
    pub fn with_hint(self, hint: impl Into<String>) -> Self {
        self.set(b'H', hint.into())
    }
    /// Adds a context line, as PostgreSQL does for errors raised inside a callee.
    pub fn with_context(self, line: impl Into<String>) -> Self {
        let line = line.into();
        let context = match self.field(b'W') {
            Some(existing) => format!("{existing}\n{line}"),
            None => line,
        };
        self.set(b'W', context)
    }
    /// Rewrites the message, e.g. to say which node raised it.
    pub fn map_message(self, f: impl FnOnce(&str) -> String) -> Self {
        let message = f(self.message());
        self.set(b'M', message)
    }
    /// Rewrites every text the error shows (message, detail, hint, context).
    pub fn map_texts(mut self, f: impl Fn(&str) -> String) -> Self {
        for (code, value) in self.fields.iter_mut() {
            if matches!(*code, b'M' | b'D' | b'H' | b'W') {
                *value = f(value);
            }
        }
        self
    }
    /// Rewrites the context, e.g. to name what the client sees instead of a shard.
    pub fn map_context(self, f: impl FnOnce(&str) -> String) -> Self {
        match self.field(b'W').map(f) {
            Some(context) => self.set(b'W', context),
            None => self,
        }
    }
    /// Renames what the error names: its table and constraint fields, and the
    /// double-quoted names in its message and detail, wherever `rename` gives
    /// a new name.
    pub fn rename(mut self, rename: impl Fn(&str) -> Option<&str>) -> Self {
        for (code, value) in self.fields.iter_mut() {
            match *code {
                b't' | b'n' => {
                    if let Some(new) = rename(value).map(str::to_string) {
                        *value = new;
                    }
                }
                b'M' => *value = rename_last_word(&rename_quoted(value, &rename), &rename),
                b'D' => *value = rename_quoted(value, &rename),
                _ => {}
            }
        }
        self
    }
    /// Moves the error's cursor position (`P`: characters into the query,
    /// from 1) onto the client's text `sql`. A node ran a rewritten text
    /// (shard names, a statement deparsed anew), where positions differ.
    /// The position stays only when the message names what it points at
    /// (`column "x" does not exist`, `… "x" is ambiguous`) and that name
    /// occurs in `sql` once as a word: it then points there. Otherwise it
    /// is dropped, so that clients show no caret rather than a wrong one.
    pub fn relocate_position(mut self, sql: &str) -> Self {
        let Some(at) = self.fields.iter().position(|(c, _)| *c == b'P') else { return self };
        let message = self.message();
        let named = (message.ends_with(" does not exist") || message.ends_with(" is ambiguous")).then(|| message.split('"').nth(1)).flatten();
        match named.and_then(|name| sole_word_position(sql, name)) {
            Some(position) => self.fields[at].1 = position.to_string(),
            None => {
                self.fields.remove(at);
            }
        }
        self
    }
    /// An error the server at `node` raised, as our client must see it. A FATAL
    /// ended only our connection to that node, not the client's session, so it
    /// becomes a lost connection (08006) with the server's message as DETAIL:
    /// relaying its own SQLSTATE (57P01 admin shutdown, …) would tell clients
    /// and poolers that the coordinator itself is going away.
    pub fn as_statement_error(self, node: &str) -> Self {
        if !self.is_fatal() {
            return self;
        }
        let lost = PgError::new(sqlstate::CONNECTION_FAILURE, format!("connection to node {node} was lost")).with_detail(self.message());
        match self.field(b'W') {
            Some(context) => lost.with_context(context),
            None => lost,
        }
    }
    pub fn internal(message: impl fmt::Display) -> Self {
        PgError::new(sqlstate::INTERNAL_ERROR, message.to_string())
    }
    pub fn not_supported(message: impl Into<String>) -> Self {
        PgError::new(sqlstate::FEATURE_NOT_SUPPORTED, message)
    }
}

/// Where `name` occurs in `sql` as a whole word (ASCII case folded, as
/// PostgreSQL folds unquoted names), in characters from 1, when it occurs
/// exactly once; a quoted occurrence counts from its opening quote.
fn sole_word_position(sql: &str, name: &str) -> Option<usize> {
    if name.is_empty() {
        return None;
    }
    let word = |c: Option<char>| c.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '$');
    let (haystack, needle) = (sql.to_ascii_lowercase(), name.to_ascii_lowercase());
    let mut found = None;
    for (start, _) in haystack.match_indices(&needle) {
        let before = haystack[..start].chars().next_back();
        if word(before) || word(haystack[start + needle.len()..].chars().next()) {
            continue;
        }
        if found.is_some() {
            return None;
        }
        let start = if before == Some('"') { start - 1 } else { start };
        found = Some(sql[..start].chars().count() + 1);
    }
    found
}

impl fmt::Display for PgError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {} (SQLSTATE {})", self.severity(), self.message(), self.code())?;
        if let Some(d) = self.detail() {
            write!(f, "; DETAIL: {d}")?;
        }
        Ok(())
    }
}

impl std::error::Error for PgError {}

pub type PgResult<T> = Result<T, PgError>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renaming_reaches_fields_quoted_names_and_privilege_objects() {
        let e = PgError::new("23505", "duplicate key value violates unique constraint \"t_pkey_102008\"")
            .with_detail("Key (id)=(x_102008) already exists.");
        let e = PgError::from_fields(
            e.fields().map(|(c, v)| (c, v.to_string())).chain([(b't', "t_102008".to_string()), (b'n', "t_pkey_102008".to_string())]).collect(),
        );
        let e = e.rename(|n| n.strip_suffix("_102008"));
        assert_eq!(e.message(), "duplicate key value violates unique constraint \"t_pkey\"");
        assert_eq!(e.detail(), Some("Key (id)=(x_102008) already exists."));
        let fields: Vec<(u8, &str)> = e.fields().filter(|(c, _)| matches!(c, b't' | b'n')).collect();
        assert_eq!(fields, [(b't', "t"), (b'n', "t_pkey")]);

        let denied = PgError::new("42501", "permission denied for table t_102008").rename(|n| n.strip_suffix("_102008"));
        assert_eq!(denied.message(), "permission denied for table t");
        let value = PgError::new("22P02", "invalid input syntax for type integer: x_102008x").rename(|n| n.strip_suffix("_102008"));
        assert_eq!(value.message(), "invalid input syntax for type integer: x_102008x");
    }

    #[test]
    fn positions_follow_the_name_into_the_clients_text_or_go() {
        let at = |e: PgError| e.fields().find(|(c, _)| *c == b'P').map(|(_, v)| v.to_string());
        let missing = || PgError::from_fields(vec![(b'C', "42703".into()), (b'M', "column \"nope\" does not exist".into()), (b'P', "11".into())]);
        assert_eq!(at(missing().relocate_position("SELECT   v, nope FROM t WHERE id = 1")).as_deref(), Some("13"));
        assert_eq!(at(missing().relocate_position("select v, NOPE from t")).as_deref(), Some("11"));
        assert_eq!(at(missing().relocate_position("SELECT \"nope\" FROM t")).as_deref(), Some("8"));
        assert_eq!(at(missing().relocate_position("SELECT 'é', nope FROM t")).as_deref(), Some("13"), "characters, not bytes");
        // Twice, or only inside other words: no position.
        assert_eq!(at(missing().relocate_position("SELECT nope, nope FROM t")), None);
        assert_eq!(at(missing().relocate_position("SELECT nopes FROM t_nope")), None);
        // A message that does not name what the position points at.
        let other = PgError::from_fields(vec![(b'C', "42883".into()), (b'M', "operator does not exist: integer = text".into()), (b'P', "30".into())]);
        assert_eq!(at(other.relocate_position("SELECT * FROM t WHERE id = 'x'::text")), None);
        let none = PgError::new("22012", "division by zero").relocate_position("SELECT 1/0");
        assert_eq!(at(none), None);
    }
}
