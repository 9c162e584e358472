//! Messages a client sends to a server: decoded when they come from our clients,
//! encoded when we are the client of a PostgreSQL server.

use super::{begin_message, finish_message, put_cstr, Message, ProtocolError, Reader};
use bytes::{BufMut, Bytes, BytesMut};

pub const PROTOCOL_VERSION_3: i32 = 196608;
pub const SSL_REQUEST_CODE: i32 = 80877103;
pub const GSSENC_REQUEST_CODE: i32 = 80877104;
pub const CANCEL_REQUEST_CODE: i32 = 80877102;

/// The first packet of a connection.
#[derive(Debug)]
pub enum StartupPacket {
    Startup { params: Vec<(String, String)> },
    SslRequest,
    GssEncRequest,
    Cancel { process_id: i32, secret_key: i32 },
}

pub fn decode_startup(packet: &[u8]) -> Result<StartupPacket, ProtocolError> {
    let mut r = Reader::new(packet, "startup");
    let code = r.i32()?;
    match code {
        SSL_REQUEST_CODE => Ok(StartupPacket::SslRequest),
        GSSENC_REQUEST_CODE => Ok(StartupPacket::GssEncRequest),
        CANCEL_REQUEST_CODE => Ok(StartupPacket::Cancel { process_id: r.i32()?, secret_key: r.i32()? }),
        PROTOCOL_VERSION_3 => {
            let mut params = Vec::new();
            loop {
                let key = r.cstr()?;
                if key.is_empty() {
                    break;
                }
                params.push((key.to_string(), r.cstr()?.to_string()));
            }
            Ok(StartupPacket::Startup { params })
        }
        _ => Err(ProtocolError::Malformed("startup (unsupported protocol version)")),
    }
}

/// Which kind of object a Describe or Close names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    Statement,
    Portal,
}

impl Target {
    fn decode(b: u8) -> Result<Self, ProtocolError> {
        match b {
            b'S' => Ok(Target::Statement),
            b'P' => Ok(Target::Portal),
            _ => Err(ProtocolError::Malformed("describe/close target")),
        }
    }
    fn code(self) -> u8 {
        match self {
            Target::Statement => b'S',
            Target::Portal => b'P',
        }
    }
}

#[derive(Debug)]
pub struct Parse {
    pub name: String,
    pub sql: String,
    pub param_types: Vec<u32>,
}

/// Bind keeps its parameter values as slices of the original message so that they
/// can be forwarded without copying.
#[derive(Debug, Clone, Default)]
pub struct Bind {
    pub portal: String,
    pub statement: String,
    pub param_formats: Vec<i16>,
    pub params: Vec<Option<Bytes>>,
    pub result_formats: Vec<i16>,
}

impl Bind {
    /// The format code (0 text, 1 binary) of parameter `i`, following the protocol's
    /// rules for zero, one or per-parameter format codes.
    pub fn param_format(&self, i: usize) -> i16 {
        match self.param_formats.len() {
            0 => 0,
            1 => self.param_formats[0],
            _ => self.param_formats.get(i).copied().unwrap_or(0),
        }
    }
}

pub fn decode_parse(msg: &Message) -> Result<Parse, ProtocolError> {
    let mut r = Reader::new(msg.body(), "Parse");
    let name = r.cstr()?.to_string();
    let sql = r.cstr()?.to_string();
    let n = r.i16()?.max(0) as usize;
    let mut param_types = Vec::with_capacity(n);
    for _ in 0..n {
        param_types.push(r.i32()? as u32);
    }
    Ok(Parse { name, sql, param_types })
}

pub fn decode_bind(msg: &Message) -> Result<Bind, ProtocolError> {
    let whole = msg.body_bytes();
    let mut r = Reader::new(&whole, "Bind");
    let portal = r.cstr()?.to_string();
    let statement = r.cstr()?.to_string();
    let nf = r.i16()?.max(0) as usize;
    let mut param_formats = Vec::with_capacity(nf);
    for _ in 0..nf {
        param_formats.push(r.i16()?);
    }
    let np = r.i16()?.max(0) as usize;
    let mut params = Vec::with_capacity(np);
    for _ in 0..np {
        let before = whole.len() - r.remaining();
        params.push(r.nullable_bytes()?.map(|v| whole.slice(before + 4..before + 4 + v.len())));
    }
    let nr = r.i16()?.max(0) as usize;
    let mut result_formats = Vec::with_capacity(nr);
    for _ in 0..nr {
        result_formats.push(r.i16()?);
    }
    Ok(Bind { portal, statement, param_formats, params, result_formats })
}

pub fn decode_describe_or_close(msg: &Message) -> Result<(Target, String), ProtocolError> {
    let mut r = Reader::new(msg.body(), "Describe/Close");
    let target = Target::decode(r.u8()?)?;
    Ok((target, r.cstr()?.to_string()))
}

pub fn decode_execute(msg: &Message) -> Result<(String, i32), ProtocolError> {
    let mut r = Reader::new(msg.body(), "Execute");
    Ok((r.cstr()?.to_string(), r.i32()?))
}

pub fn decode_query(msg: &Message) -> Result<&str, ProtocolError> {
    Reader::new(msg.body(), "Query").cstr()
}

/// A SASLInitialResponse ('p' while SASL authentication starts): the mechanism
/// the client chose and its first message (None when sent as length -1).
pub fn decode_sasl_initial_response(msg: &Message) -> Result<(&str, Option<&[u8]>), ProtocolError> {
    let mut r = Reader::new(msg.body(), "SASLInitialResponse");
    let mechanism = r.cstr()?;
    let data = r.nullable_bytes()?;
    if r.remaining() != 0 {
        return Err(ProtocolError::Malformed("SASLInitialResponse"));
    }
    Ok((mechanism, data))
}

// ---- encoders (we are the client) ----

pub fn startup(buf: &mut BytesMut, params: &[(&str, &str)]) {
    let at = buf.len();
    buf.put_u32(0);
    buf.put_i32(PROTOCOL_VERSION_3);
    for (k, v) in params {
        put_cstr(buf, k);
        put_cstr(buf, v);
    }
    buf.put_u8(0);
    finish_message(buf, at);
}

pub fn ssl_request(buf: &mut BytesMut) {
    buf.put_u32(8);
    buf.put_i32(SSL_REQUEST_CODE);
}

pub fn cancel_request(buf: &mut BytesMut, process_id: i32, secret_key: i32) {
    buf.put_u32(16);
    buf.put_i32(CANCEL_REQUEST_CODE);
    buf.put_i32(process_id);
    buf.put_i32(secret_key);
}

pub fn password(buf: &mut BytesMut, data: &[u8]) {
    let at = begin_message(buf, b'p');
    buf.put_slice(data);
    finish_message(buf, at);
}

/// A SASLInitialResponse: the chosen mechanism and the client-first-message.
pub fn sasl_initial_response(buf: &mut BytesMut, mechanism: &str, data: &[u8]) {
    let at = begin_message(buf, b'p');
    put_cstr(buf, mechanism);
    buf.put_i32(data.len() as i32);
    buf.put_slice(data);
    finish_message(buf, at);
}

pub fn query(buf: &mut BytesMut, sql: &str) {
    let at = begin_message(buf, b'Q');
    put_cstr(buf, sql);
    finish_message(buf, at);
}

pub fn parse(buf: &mut BytesMut, name: &str, sql: &str, param_types: &[u32]) {
    let at = begin_message(buf, b'P');
    put_cstr(buf, name);
    put_cstr(buf, sql);
    buf.put_i16(param_types.len() as i16);
    for t in param_types {
        buf.put_u32(*t);
    }
    finish_message(buf, at);
}

pub fn bind(buf: &mut BytesMut, portal: &str, statement: &str, param_formats: &[i16], params: &[Option<Bytes>], result_formats: &[i16]) {
    let at = begin_message(buf, b'B');
    put_cstr(buf, portal);
    put_cstr(buf, statement);
    buf.put_i16(param_formats.len() as i16);
    for f in param_formats {
        buf.put_i16(*f);
    }
    buf.put_i16(params.len() as i16);
    for p in params {
        match p {
            None => buf.put_i32(-1),
            Some(v) => {
                buf.put_i32(v.len() as i32);
                buf.put_slice(v);
            }
        }
    }
    buf.put_i16(result_formats.len() as i16);
    for f in result_formats {
        buf.put_i16(*f);
    }
    finish_message(buf, at);
}

pub fn describe(buf: &mut BytesMut, target: Target, name: &str) {
    let at = begin_message(buf, b'D');
    buf.put_u8(target.code());
    put_cstr(buf, name);
    finish_message(buf, at);
}

pub fn close(buf: &mut BytesMut, target: Target, name: &str) {
    let at = begin_message(buf, b'C');
    buf.put_u8(target.code());
    put_cstr(buf, name);
    finish_message(buf, at);
}

pub fn execute(buf: &mut BytesMut, portal: &str, max_rows: i32) {
    let at = begin_message(buf, b'E');
    put_cstr(buf, portal);
    buf.put_i32(max_rows);
    finish_message(buf, at);
}

fn empty(buf: &mut BytesMut, tag: u8) {
    buf.put_u8(tag);
    buf.put_u32(4);
}

pub fn sync(buf: &mut BytesMut) {
    empty(buf, b'S');
}

pub fn flush(buf: &mut BytesMut) {
    empty(buf, b'H');
}

pub fn terminate(buf: &mut BytesMut) {
    empty(buf, b'X');
}

pub fn copy_data(buf: &mut BytesMut, data: &[u8]) {
    let at = begin_message(buf, b'd');
    buf.put_slice(data);
    finish_message(buf, at);
}

pub fn copy_done(buf: &mut BytesMut) {
    empty(buf, b'c');
}

/// A whole `COPY … FROM STDIN` in one go: the query, `chunks` as CopyData, and
/// CopyDone, without waiting for the server's CopyInResponse. Should the COPY
/// fail to start, the server ignores the CopyData and CopyDone that follow, so
/// several can be queued back to back.
pub fn copy_from_stdin(buf: &mut BytesMut, sql: &str, chunks: &[&[u8]]) {
    query(buf, sql);
    for chunk in chunks {
        copy_data(buf, chunk);
    }
    copy_done(buf);
}

pub fn copy_fail(buf: &mut BytesMut, reason: &str) {
    let at = begin_message(buf, b'f');
    put_cstr(buf, reason);
    finish_message(buf, at);
}

/// Counts, among the complete messages at the front of `sent` (bytes a
/// client wrote, starting at a message boundary), those the server answers
/// with exactly one ReadyForQuery: Query, Sync and FunctionCall. Returns
/// that count and the bytes the complete messages take; an incomplete
/// message at the end is left for the next call.
pub fn ready_requests(sent: &[u8]) -> (usize, usize) {
    let (mut requests, mut at) = (0, 0);
    while let Some(header) = sent.get(at..at + 5) {
        let len = u32::from_be_bytes([header[1], header[2], header[3], header[4]]) as usize;
        if sent.len() < at + 1 + len {
            break;
        }
        if matches!(header[0], b'Q' | b'S' | b'F') {
            requests += 1;
        }
        at += 1 + len;
    }
    (requests, at)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::take_message;

    #[test]
    fn ready_requests_counts_what_ends_in_ready_for_query() {
        let mut buf = BytesMut::new();
        query(&mut buf, "SELECT 1");
        parse(&mut buf, "", "SELECT $1", &[23]);
        bind(&mut buf, "", "", &[], &[Some(Bytes::from_static(b"1"))], &[]);
        execute(&mut buf, "", 0);
        sync(&mut buf);
        copy_from_stdin(&mut buf, "COPY t FROM STDIN", &[b"1\n", b"2\n"]);
        flush(&mut buf);
        let whole = buf.len();
        assert_eq!(ready_requests(&buf), (3, whole), "Query, Sync, and the COPY's Query");
        sync(&mut buf);
        assert_eq!(ready_requests(&buf[..buf.len() - 1]), (3, whole), "a message not yet whole waits");
        assert_eq!(ready_requests(&buf[whole..]), (1, 5));
        assert_eq!(ready_requests(&[]), (0, 0));
    }

    #[test]
    fn bind_round_trip() {
        let mut buf = BytesMut::new();
        let params = vec![Some(Bytes::from_static(b"42")), None];
        bind(&mut buf, "p", "s1", &[0], &params, &[1]);
        let msg = take_message(&mut buf).unwrap().unwrap();
        let b = decode_bind(&msg).unwrap();
        assert_eq!(b.portal, "p");
        assert_eq!(b.statement, "s1");
        assert_eq!(b.params, params);
        assert_eq!(b.result_formats, vec![1]);
        assert_eq!(b.param_format(1), 0);
    }

    #[test]
    fn sasl_initial_response_round_trip() {
        let mut buf = BytesMut::new();
        sasl_initial_response(&mut buf, "SCRAM-SHA-256", b"n,,n=,r=abc");
        let msg = take_message(&mut buf).unwrap().unwrap();
        assert_eq!(msg.tag(), b'p');
        assert_eq!(decode_sasl_initial_response(&msg).unwrap(), ("SCRAM-SHA-256", Some(&b"n,,n=,r=abc"[..])));
        // Length -1: no initial response.
        let mut buf = BytesMut::new();
        let at = begin_message(&mut buf, b'p');
        put_cstr(&mut buf, "SCRAM-SHA-256");
        buf.put_i32(-1);
        finish_message(&mut buf, at);
        let msg = take_message(&mut buf).unwrap().unwrap();
        assert_eq!(decode_sasl_initial_response(&msg).unwrap(), ("SCRAM-SHA-256", None));
        // A length running past the end, or bytes after the data, are malformed.
        for body in [&b"SCRAM-SHA-256\0\0\0\0\x09abc"[..], b"SCRAM-SHA-256\0\0\0\0\x01ab", b"SCRAM-SHA-256"] {
            let mut buf = BytesMut::new();
            let at = begin_message(&mut buf, b'p');
            buf.put_slice(body);
            finish_message(&mut buf, at);
            let msg = take_message(&mut buf).unwrap().unwrap();
            assert!(decode_sasl_initial_response(&msg).is_err());
        }
    }

    #[test]
    fn parse_round_trip() {
        let mut buf = BytesMut::new();
        parse(&mut buf, "", "select $1", &[23]);
        let msg = take_message(&mut buf).unwrap().unwrap();
        let p = decode_parse(&msg).unwrap();
        assert_eq!((p.name.as_str(), p.sql.as_str(), p.param_types), ("", "select $1", vec![23]));
    }
}
