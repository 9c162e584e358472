//! The client side of a session: framed reads and buffered writes on the socket.

use crate::error::PgResult;
use crate::protocol::{take_message_within, take_startup_packet, Message, ProtocolError, MAX_MESSAGE_LEN, MAX_UNAUTHENTICATED_MESSAGE_LEN};
use crate::transport::Stream;
use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Results are sent on as they arrive once this much is buffered.
const FLUSH_THRESHOLD: usize = 64 * 1024;

/// Counts memory held for the running statement; past its bound, the
/// statement stops with the error returned (the statement's limits, from
/// the transaction layer, implement it).
pub trait MemoryCharge: Send + Sync {
    fn charge(&self, bytes: usize) -> PgResult<()>;
}

pub struct ClientConn {
    stream: Stream,
    rbuf: BytesMut,
    wbuf: BytesMut,
    /// The largest message accepted: small until the client has logged in.
    max_message_len: usize,
    /// While set, results stay in the buffer however large they grow (a row
    /// limit on a portal needs them all before sending any), counted against
    /// the statement's memory: what counts it, and the bytes counted so far.
    holding: Option<(Box<dyn MemoryCharge>, usize)>,
    /// How many times the buffer was sent: an `OutputMark` taken before
    /// tells whether what follows it is still in the buffer.
    flushes: u64,
}

/// Where the output stood when a statement began (`ClientConn::output_mark`).
#[derive(Clone, Copy, Debug)]
pub struct OutputMark {
    flushes: u64,
    len: usize,
}

impl ClientConn {
    pub fn new(stream: Stream) -> Self {
        ClientConn {
            stream,
            rbuf: BytesMut::with_capacity(16 * 1024),
            wbuf: BytesMut::with_capacity(16 * 1024),
            max_message_len: MAX_UNAUTHENTICATED_MESSAGE_LEN,
            holding: None,
            flushes: 0,
        }
    }

    /// The socket, to start TLS on after SSLRequest. Bytes the client sent
    /// after its SSLRequest, before the handshake, would be read as if they
    /// had come encrypted: refused.
    pub fn into_stream(self) -> std::io::Result<Stream> {
        if !self.rbuf.is_empty() {
            return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, "the client sent data after SSLRequest before the TLS handshake"));
        }
        Ok(self.stream)
    }

    pub fn is_clear_tcp(&self) -> bool {
        self.stream.is_clear_tcp()
    }

    /// The certificate the client presented over TLS (DER).
    pub fn peer_certificate(&self) -> Option<&[u8]> {
        self.stream.peer_certificate()
    }

    /// Reads the next start-up packet; None when the client went away.
    pub async fn recv_startup(&mut self) -> std::io::Result<Option<Bytes>> {
        loop {
            match take_startup_packet(&mut self.rbuf) {
                Ok(Some(p)) => return Ok(Some(p)),
                Ok(None) => {}
                Err(e) => return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, e)),
            }
            if self.stream.read_buf(&mut self.rbuf).await? == 0 {
                return Ok(None);
            }
        }
    }

    /// The client has logged in: from now on it may send messages of any size
    /// PostgreSQL accepts.
    pub fn authenticated(&mut self) {
        self.max_message_len = MAX_MESSAGE_LEN;
    }

    /// The next message if it has arrived whole already (no I/O).
    pub fn buffered(&mut self) -> std::io::Result<Option<Message>> {
        match take_message_within(&mut self.rbuf, self.max_message_len) {
            Ok(m) => Ok(m),
            Err(e @ ProtocolError::BadLength(_)) | Err(e @ ProtocolError::Malformed(_)) => {
                Err(std::io::Error::new(std::io::ErrorKind::InvalidData, e))
            }
        }
    }

    /// Reads the next message; None when the client went away.
    pub async fn recv(&mut self) -> std::io::Result<Option<Message>> {
        loop {
            if let Some(m) = self.buffered()? {
                return Ok(Some(m));
            }
            if !self.wbuf.is_empty() {
                self.flush().await?;
            }
            if self.stream.read_buf(&mut self.rbuf).await? == 0 {
                return Ok(None);
            }
        }
    }

    /// The tag of the next message if it has already arrived (used to piggyback
    /// a Sync on the worker round trip).
    pub fn peek_tag(&self) -> Option<u8> {
        (self.rbuf.len() >= 5).then(|| self.rbuf[0])
    }

    pub fn out(&mut self) -> &mut BytesMut {
        &mut self.wbuf
    }

    pub fn output_mark(&self) -> OutputMark {
        OutputMark { flushes: self.flushes, len: self.wbuf.len() }
    }

    /// The rows the CommandCompletes written since `mark` report: read
    /// from the mark on, or from the start of the buffer when it was sent
    /// meanwhile (the buffer is only ever sent whole, so it starts with a
    /// message; the last CommandComplete is still there).
    pub fn rows_completed_since(&self, mark: OutputMark) -> u64 {
        let from = if mark.flushes == self.flushes { mark.len.min(self.wbuf.len()) } else { 0 };
        let mut rest = &self.wbuf[from..];
        let mut rows = 0;
        while rest.len() >= 5 {
            let len = u32::from_be_bytes([rest[1], rest[2], rest[3], rest[4]]) as usize;
            let Some(message) = rest.get(..1 + len).filter(|_| len >= 4) else { break };
            if message[0] == b'C' {
                let tag = message[5..].strip_suffix(&[0]).unwrap_or(&message[5..]);
                rows += std::str::from_utf8(tag).ok().and_then(crate::protocol::backend::rows_in_tag).unwrap_or(0);
            }
            rest = &rest[1 + len..];
        }
        rows
    }

    pub async fn flush(&mut self) -> std::io::Result<()> {
        if !self.wbuf.is_empty() {
            self.stream.write_all(&self.wbuf).await?;
            self.wbuf.clear();
            self.flushes += 1;
            // TLS may still hold the tail of what it accepted (the socket was
            // full): pushed out now, or the client could wait for it while
            // the session waits for the client.
            self.stream.flush().await?;
        }
        Ok(())
    }

    /// Keeps results in the buffer, counted by `memory` (or, with None,
    /// stops keeping them): see `holding`.
    pub fn hold_output(&mut self, memory: Option<Box<dyn MemoryCharge>>) {
        self.holding = memory.map(|memory| (memory, 0));
    }

    /// Sends buffered results once enough have piled up, so large results
    /// stream; while holding them, counts them against the statement's memory.
    pub async fn flush_if_large(&mut self) -> PgResult<()> {
        match &mut self.holding {
            Some((limits, counted)) if self.wbuf.len() >= *counted + FLUSH_THRESHOLD => {
                limits.charge(self.wbuf.len() - *counted)?;
                *counted = self.wbuf.len();
            }
            None if self.wbuf.len() >= FLUSH_THRESHOLD => self.flush().await.map_err(client_lost)?,
            _ => {}
        }
        Ok(())
    }

    /// Writes raw bytes now (the SSL refusal byte before start-up).
    pub async fn write_now(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.flush().await?;
        self.stream.write_all(bytes).await?;
        self.stream.flush().await
    }
}

/// The error for a client that went away mid-statement.
pub fn client_lost(e: impl std::fmt::Display) -> crate::error::PgError {
    crate::error::PgError::new(crate::error::sqlstate::CONNECTION_FAILURE, format!("client connection lost: {e}"))
}
