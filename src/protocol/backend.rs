//! Messages a server sends to a client: encoded when we answer our clients,
//! decoded when they come back from a PostgreSQL server.

use super::{begin_message, finish_message, put_cstr, Message, ProtocolError, Reader};
use crate::error::PgError;
use bytes::{BufMut, Bytes, BytesMut};

/// Transaction status reported in ReadyForQuery.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TxStatus {
    Idle,
    InBlock,
    Failed,
}

impl TxStatus {
    pub fn code(self) -> u8 {
        match self {
            TxStatus::Idle => b'I',
            TxStatus::InBlock => b'T',
            TxStatus::Failed => b'E',
        }
    }
    pub fn from_code(code: u8) -> Self {
        match code {
            b'T' => TxStatus::InBlock,
            b'E' => TxStatus::Failed,
            _ => TxStatus::Idle,
        }
    }
}

/// One column of a RowDescription.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldDescription {
    pub name: String,
    pub table_oid: u32,
    pub column: i16,
    pub type_oid: u32,
    pub type_size: i16,
    pub type_modifier: i32,
    pub format: i16,
}

impl FieldDescription {
    /// A computed (non-table) column of a built-in type, text format.
    pub fn computed(name: &str, type_oid: u32, type_size: i16) -> Self {
        FieldDescription { name: name.into(), table_oid: 0, column: 0, type_oid, type_size, type_modifier: -1, format: 0 }
    }
}

fn empty(buf: &mut BytesMut, tag: u8) {
    buf.put_u8(tag);
    buf.put_u32(4);
}

pub fn authentication_ok(buf: &mut BytesMut) {
    let at = begin_message(buf, b'R');
    buf.put_i32(0);
    finish_message(buf, at);
}

/// An AuthenticationSASL/SASLContinue/SASLFinal message (`code` 10, 11 or 12).
pub fn authentication_sasl(buf: &mut BytesMut, code: i32, payload: &[u8]) {
    let at = begin_message(buf, b'R');
    buf.put_i32(code);
    buf.put_slice(payload);
    finish_message(buf, at);
}

pub fn parameter_status(buf: &mut BytesMut, name: &str, value: &str) {
    let at = begin_message(buf, b'S');
    put_cstr(buf, name);
    put_cstr(buf, value);
    finish_message(buf, at);
}

pub fn backend_key_data(buf: &mut BytesMut, process_id: i32, secret_key: i32) {
    let at = begin_message(buf, b'K');
    buf.put_i32(process_id);
    buf.put_i32(secret_key);
    finish_message(buf, at);
}

pub fn ready_for_query(buf: &mut BytesMut, status: TxStatus) {
    let at = begin_message(buf, b'Z');
    buf.put_u8(status.code());
    finish_message(buf, at);
}

pub fn command_complete(buf: &mut BytesMut, tag: &str) {
    let at = begin_message(buf, b'C');
    put_cstr(buf, tag);
    finish_message(buf, at);
}

/// The tag of a row-returning command with its row count set to `rows`: an
/// Execute cut short by a row limit reports the rows it sent itself, as a
/// PostgreSQL portal does ("SELECT 5", "INSERT 0 5"). Tags without a count
/// stay as they are.
pub fn tag_with_count(tag: &str, rows: u64) -> String {
    match tag.rsplit_once(' ') {
        Some((command, count)) if count.bytes().all(|b| b.is_ascii_digit()) => format!("{command} {rows}"),
        _ => tag.to_string(),
    }
}

pub fn empty_query_response(buf: &mut BytesMut) {
    empty(buf, b'I');
}
pub fn parse_complete(buf: &mut BytesMut) {
    empty(buf, b'1');
}
pub fn bind_complete(buf: &mut BytesMut) {
    empty(buf, b'2');
}
pub fn close_complete(buf: &mut BytesMut) {
    empty(buf, b'3');
}
pub fn no_data(buf: &mut BytesMut) {
    empty(buf, b'n');
}
pub fn portal_suspended(buf: &mut BytesMut) {
    empty(buf, b's');
}

pub fn parameter_description(buf: &mut BytesMut, types: &[u32]) {
    let at = begin_message(buf, b't');
    buf.put_i16(types.len() as i16);
    for t in types {
        buf.put_u32(*t);
    }
    finish_message(buf, at);
}

pub fn row_description(buf: &mut BytesMut, fields: &[FieldDescription]) {
    let at = begin_message(buf, b'T');
    buf.put_i16(fields.len() as i16);
    for f in fields {
        put_cstr(buf, &f.name);
        buf.put_u32(f.table_oid);
        buf.put_i16(f.column);
        buf.put_u32(f.type_oid);
        buf.put_i16(f.type_size);
        buf.put_i32(f.type_modifier);
        buf.put_i16(f.format);
    }
    finish_message(buf, at);
}

pub fn data_row<'a>(buf: &mut BytesMut, values: impl ExactSizeIterator<Item = Option<&'a [u8]>>) {
    let at = begin_message(buf, b'D');
    buf.put_i16(values.len() as i16);
    for v in values {
        match v {
            None => buf.put_i32(-1),
            Some(v) => {
                buf.put_i32(v.len() as i32);
                buf.put_slice(v);
            }
        }
    }
    finish_message(buf, at);
}

pub fn error_response(buf: &mut BytesMut, err: &PgError) {
    notice_or_error(buf, b'E', err)
}

pub fn notice_response(buf: &mut BytesMut, notice: &PgError) {
    notice_or_error(buf, b'N', notice)
}

fn notice_or_error(buf: &mut BytesMut, tag: u8, e: &PgError) {
    let at = begin_message(buf, tag);
    for (code, value) in e.fields() {
        buf.put_u8(code);
        put_cstr(buf, value);
    }
    buf.put_u8(0);
    finish_message(buf, at);
}

// ---- decoders (a PostgreSQL server is talking to us) ----

/// Decodes ErrorResponse and NoticeResponse payloads.
pub fn decode_error_fields(msg: &Message) -> Result<PgError, ProtocolError> {
    let mut r = Reader::new(msg.body(), "ErrorResponse");
    let mut fields = Vec::new();
    loop {
        let code = r.u8()?;
        if code == 0 {
            break;
        }
        fields.push((code, r.cstr()?.to_string()));
    }
    Ok(PgError::from_fields(fields))
}

pub fn decode_row_description(msg: &Message) -> Result<Vec<FieldDescription>, ProtocolError> {
    let mut r = Reader::new(msg.body(), "RowDescription");
    let n = r.i16()?.max(0) as usize;
    let mut fields = Vec::with_capacity(n);
    for _ in 0..n {
        fields.push(FieldDescription {
            name: r.cstr()?.to_string(),
            table_oid: r.i32()? as u32,
            column: r.i16()?,
            type_oid: r.i32()? as u32,
            type_size: r.i16()?,
            type_modifier: r.i32()?,
            format: r.i16()?,
        });
    }
    Ok(fields)
}

pub fn decode_parameter_description(msg: &Message) -> Result<Vec<u32>, ProtocolError> {
    let mut r = Reader::new(msg.body(), "ParameterDescription");
    let n = r.i16()?.max(0) as usize;
    (0..n).map(|_| r.i32().map(|t| t as u32)).collect()
}

/// Decodes a DataRow into owned column values (for the coordinator's own queries;
/// client results are forwarded as frames and never decoded).
pub fn decode_data_row(msg: &Message) -> Result<Vec<Option<Bytes>>, ProtocolError> {
    let whole = msg.body_bytes();
    let mut r = Reader::new(&whole, "DataRow");
    let n = r.i16()?.max(0) as usize;
    let mut values = Vec::with_capacity(n);
    for _ in 0..n {
        let before = whole.len() - r.remaining();
        values.push(r.nullable_bytes()?.map(|v| whole.slice(before + 4..before + 4 + v.len())));
    }
    Ok(values)
}

/// Hands each value of a DataRow (None: NULL), with its column index, to
/// `f`, without copying it.
pub fn each_data_row_value(msg: &Message, mut f: impl FnMut(usize, Option<&[u8]>)) -> Result<(), ProtocolError> {
    let mut r = Reader::new(msg.body(), "DataRow");
    let n = r.i16()?.max(0) as usize;
    for i in 0..n {
        f(i, r.nullable_bytes()?);
    }
    Ok(())
}

/// Decodes a DataRow of text-format values.
pub fn decode_text_row(msg: &Message) -> Result<Vec<Option<String>>, ProtocolError> {
    Ok(decode_data_row(msg)?.into_iter().map(|v| v.map(|b| String::from_utf8_lossy(&b).into_owned())).collect())
}

pub fn decode_command_complete(msg: &Message) -> Result<&str, ProtocolError> {
    Reader::new(msg.body(), "CommandComplete").cstr()
}

pub fn decode_parameter_status(msg: &Message) -> Result<(&str, &str), ProtocolError> {
    let mut r = Reader::new(msg.body(), "ParameterStatus");
    Ok((r.cstr()?, r.cstr()?))
}

pub fn decode_backend_key_data(msg: &Message) -> Result<(i32, i32), ProtocolError> {
    let mut r = Reader::new(msg.body(), "BackendKeyData");
    Ok((r.i32()?, r.i32()?))
}

pub fn decode_ready_for_query(msg: &Message) -> TxStatus {
    TxStatus::from_code(msg.body().first().copied().unwrap_or(b'I'))
}

/// Authentication request code and the bytes after it.
pub fn decode_authentication(msg: &Message) -> Result<(i32, &[u8]), ProtocolError> {
    let mut r = Reader::new(msg.body(), "Authentication");
    let code = r.i32()?;
    let rest = r.take(r.remaining())?;
    Ok((code, rest))
}

/// The number of rows a command tag reports ("INSERT 0 5", "UPDATE 3", "SELECT 7").
pub fn rows_in_tag(tag: &str) -> Option<u64> {
    tag.rsplit(' ').next()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::take_message;

    #[test]
    fn error_round_trip_keeps_sqlstate() {
        let mut buf = BytesMut::new();
        error_response(&mut buf, &PgError::new("0A000", "not supported").with_hint("try this"));
        let msg = take_message(&mut buf).unwrap().unwrap();
        let e = decode_error_fields(&msg).unwrap();
        assert_eq!(e.code(), "0A000");
        assert_eq!(e.message(), "not supported");
        assert_eq!(e.hint(), Some("try this"));
    }

    #[test]
    fn data_row_round_trip() {
        let mut buf = BytesMut::new();
        data_row(&mut buf, [Some(&b"1"[..]), None].into_iter());
        let msg = take_message(&mut buf).unwrap().unwrap();
        let row = decode_data_row(&msg).unwrap();
        assert_eq!(row, vec![Some(Bytes::from_static(b"1")), None]);
    }

    #[test]
    fn tag_row_counts() {
        assert_eq!(rows_in_tag("INSERT 0 5"), Some(5));
        assert_eq!(rows_in_tag("UPDATE 3"), Some(3));
        assert_eq!(rows_in_tag("BEGIN"), None);
    }
}
