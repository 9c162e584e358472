//! The PostgreSQL v3 wire protocol as pure data: framing, message encoders and
//! decoders. Nothing here performs I/O, so the same code serves both sides of the
//! coordinator — decoding what clients send and encoding what we send to PostgreSQL
//! servers, and the reverse.

pub mod backend;
pub mod frontend;

use bytes::{Buf, BufMut, Bytes, BytesMut};

/// Messages larger than this are refused instead of buffered (PostgreSQL's own
/// limit for a single message is 1 GB).
pub const MAX_MESSAGE_LEN: usize = 1 << 30;

/// Before a client has authenticated, no message it sends may be larger than
/// this (PostgreSQL's limit for an authentication token), so a stranger cannot
/// make the coordinator buffer a gigabyte.
pub const MAX_UNAUTHENTICATED_MESSAGE_LEN: usize = 65_535;

/// PostgreSQL's limit for a start-up packet.
pub const MAX_STARTUP_PACKET_LEN: usize = 10_000;

/// One complete tagged message, kept as the original frame bytes so that it can be
/// forwarded without re-encoding.
#[derive(Clone, Debug)]
pub struct Message {
    frame: Bytes,
}

impl Message {
    pub fn tag(&self) -> u8 {
        self.frame[0]
    }
    /// The payload after the tag and length word.
    pub fn body(&self) -> &[u8] {
        &self.frame[5..]
    }
    pub fn body_bytes(&self) -> Bytes {
        self.frame.slice(5..)
    }
    /// The whole frame: tag, length and payload.
    pub fn frame(&self) -> &[u8] {
        &self.frame
    }
    /// The whole frame, shared rather than copied.
    pub fn frame_bytes(&self) -> Bytes {
        self.frame.clone()
    }
    pub fn from_frame(frame: Bytes) -> Self {
        Message { frame }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ProtocolError {
    #[error("invalid message length {0}")]
    BadLength(usize),
    #[error("malformed {0} message")]
    Malformed(&'static str),
}

/// Splits one tagged message off the front of `buf`, if a whole one is there.
pub fn take_message(buf: &mut BytesMut) -> Result<Option<Message>, ProtocolError> {
    take_message_within(buf, MAX_MESSAGE_LEN)
}

/// `take_message` for a peer whose messages may be at most `max_len` bytes long.
pub fn take_message_within(buf: &mut BytesMut, max_len: usize) -> Result<Option<Message>, ProtocolError> {
    if buf.len() < 5 {
        return Ok(None);
    }
    let len = u32::from_be_bytes([buf[1], buf[2], buf[3], buf[4]]) as usize;
    if !(4..=max_len).contains(&len) {
        return Err(ProtocolError::BadLength(len));
    }
    if buf.len() < len + 1 {
        buf.reserve(len + 1 - buf.len());
        return Ok(None);
    }
    Ok(Some(Message { frame: buf.split_to(len + 1).freeze() }))
}

/// Splits one untagged start-up packet (StartupMessage, SSLRequest, CancelRequest,
/// GSSENCRequest) off the front of `buf`.
pub fn take_startup_packet(buf: &mut BytesMut) -> Result<Option<Bytes>, ProtocolError> {
    if buf.len() < 4 {
        return Ok(None);
    }
    let len = u32::from_be_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize;
    if !(8..=MAX_STARTUP_PACKET_LEN).contains(&len) {
        return Err(ProtocolError::BadLength(len));
    }
    if buf.len() < len {
        return Ok(None);
    }
    let mut packet = buf.split_to(len);
    packet.advance(4);
    Ok(Some(packet.freeze()))
}

/// Starts a tagged message in `buf`; `finish_message` patches its length.
pub(crate) fn begin_message(buf: &mut BytesMut, tag: u8) -> usize {
    buf.put_u8(tag);
    let at = buf.len();
    buf.put_u32(0);
    at
}

pub(crate) fn finish_message(buf: &mut BytesMut, at: usize) {
    let len = (buf.len() - at) as u32;
    buf[at..at + 4].copy_from_slice(&len.to_be_bytes());
}

pub(crate) fn put_cstr(buf: &mut BytesMut, s: &str) {
    buf.put_slice(s.as_bytes());
    buf.put_u8(0);
}

/// A cursor over a message payload with the protocol's primitive readers.
pub struct Reader<'a> {
    data: &'a [u8],
    what: &'static str,
}

impl<'a> Reader<'a> {
    pub fn new(data: &'a [u8], what: &'static str) -> Self {
        Reader { data, what }
    }
    fn malformed(&self) -> ProtocolError {
        ProtocolError::Malformed(self.what)
    }
    pub fn remaining(&self) -> usize {
        self.data.len()
    }
    pub fn u8(&mut self) -> Result<u8, ProtocolError> {
        let (&b, rest) = self.data.split_first().ok_or_else(|| self.malformed())?;
        self.data = rest;
        Ok(b)
    }
    pub fn i16(&mut self) -> Result<i16, ProtocolError> {
        Ok(i16::from_be_bytes(self.take(2)?.try_into().unwrap()))
    }
    pub fn i32(&mut self) -> Result<i32, ProtocolError> {
        Ok(i32::from_be_bytes(self.take(4)?.try_into().unwrap()))
    }
    pub fn take(&mut self, n: usize) -> Result<&'a [u8], ProtocolError> {
        if self.data.len() < n {
            return Err(self.malformed());
        }
        let (head, rest) = self.data.split_at(n);
        self.data = rest;
        Ok(head)
    }
    pub fn cstr(&mut self) -> Result<&'a str, ProtocolError> {
        let end = self.data.iter().position(|&b| b == 0).ok_or_else(|| self.malformed())?;
        let s = std::str::from_utf8(&self.data[..end]).map_err(|_| self.malformed())?;
        self.data = &self.data[end + 1..];
        Ok(s)
    }
    /// A length-prefixed value as used by Bind parameters and DataRow columns; -1 is NULL.
    pub fn nullable_bytes(&mut self) -> Result<Option<&'a [u8]>, ProtocolError> {
        let len = self.i32()?;
        if len < 0 {
            return Ok(None);
        }
        self.take(len as usize).map(Some)
    }
}

impl From<ProtocolError> for crate::error::PgError {
    fn from(e: ProtocolError) -> Self {
        crate::error::PgError::new(crate::error::sqlstate::PROTOCOL_VIOLATION, e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn framing_waits_for_whole_message() {
        let mut buf = BytesMut::new();
        frontend::query(&mut buf, "select 1");
        let full = buf.clone();
        let mut partial = BytesMut::from(&full[..full.len() - 1]);
        assert!(take_message(&mut partial).unwrap().is_none());
        let msg = take_message(&mut buf).unwrap().unwrap();
        assert_eq!(msg.tag(), b'Q');
        assert_eq!(msg.body(), b"select 1\0");
        assert!(buf.is_empty());
    }

    #[test]
    fn bad_length_is_an_error() {
        let mut buf = BytesMut::from(&[b'Q', 0, 0, 0, 1][..]);
        assert!(take_message(&mut buf).is_err());
    }
}
