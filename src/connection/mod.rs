//! An async connection to one PostgreSQL server (the coordinator database or a
//! worker), built on the pure codec in `protocol`. It exposes message-level I/O for
//! the executor's forwarding paths plus a few conveniences for the coordinator's own
//! catalog and DDL statements.

pub mod client;
pub mod kept;
pub mod node_tls;
pub mod pool;

use crate::config::{Login, ServerAddr};
use crate::error::{sqlstate, PgError, PgResult};
use crate::protocol::backend::{self, TxStatus};
use crate::protocol::{frontend, take_message, Message};
use crate::transport::{connect_node, Stream};
use bytes::{Bytes, BytesMut};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Settings the worker connections keep as the session set them on the
/// coordinator database, read again after any statement that may change
/// them, with each one's value on a server where nobody set it: the
/// timeouts, as the workers' backends run the session's shard statements
/// and the limits have to hold there, and the output formats PostgreSQL
/// does not report when they change (the reported ones are followed as
/// they change).
pub const FOLLOWED_SETTINGS: [(&str, &str); 4] =
    [("statement_timeout", "0"), ("lock_timeout", "0"), ("extra_float_digits", "1"), ("bytea_output", "hex")];

/// What the last statement of a query string returned.
#[derive(Debug, PartialEq, Eq)]
pub enum LastResult {
    /// A command without a result set, by its tag (`CREATE TABLE`, `UPDATE 3`).
    Command(String),
    /// A result set: its number of columns and its rows in text form.
    Rows { columns: usize, rows: TextRows },
}

pub struct PgConnection {
    stream: Stream,
    rbuf: BytesMut,
    wbuf: BytesMut,
    label: Arc<str>,
    server_params: Vec<(String, String)>,
    backend_key: (i32, i32),
    tx_status: TxStatus,
    broken: bool,
    /// The FATAL error a server sent before closing the connection, reported in
    /// place of the bare EOF that follows it.
    farewell: Option<PgError>,
    /// Statements queued with `queue_silent` or `queue_capture` whose
    /// responses are still to be skipped; true for one whose first value is kept.
    silent: std::collections::VecDeque<bool>,
    /// The first value of the last `queue_capture`d statement's answer.
    captured: Option<String>,
    /// ParameterStatus changes reported since the last `take_changed_params`,
    /// collected only once `track_parameter_changes` asked for them.
    changed_params: Option<Vec<(String, String)>>,
    /// ReadyForQuery messages the server still owes: one per Query, Sync or
    /// FunctionCall sent. A connection owing one is in the middle of an
    /// exchange (its reader was interrupted), and whoever took it next
    /// would read that exchange's answers as its own.
    ready_owed: usize,
    /// Where the bytes of `wbuf` not yet counted into `ready_owed` begin.
    uncounted_from: usize,
}

/// A row in text form (None for NULL).
pub type TextRow = Vec<Option<String>>;
/// Rows of a query in text form.
pub type TextRows = Vec<TextRow>;

/// The memory a text row takes.
pub fn text_row_size(row: &TextRow) -> usize {
    std::mem::size_of::<TextRow>() + row.iter().map(|v| std::mem::size_of::<Option<String>>() + v.as_ref().map_or(0, String::len)).sum::<usize>()
}

/// How long making a node connection (TCP or socket, then the login) may
/// take, in milliseconds: `[connections] node_connect_timeout_secs`, set once
/// at start-up.
static CONNECT_TIMEOUT_MS: AtomicU64 = AtomicU64::new(10_000);

/// Sets how long a node connection may take to be made.
pub fn set_connect_timeout(timeout: Duration) {
    CONNECT_TIMEOUT_MS.store(timeout.as_millis().clamp(1, u128::from(u64::MAX)) as u64, Ordering::Relaxed);
}

/// Asks the node at `host` for TLS and runs the handshake, verifying the
/// node against the cluster's CA and presenting `role`'s certificate.
async fn start_tls(mut stream: Stream, credentials: &node_tls::NodeCredentials, host: &str, role: &str, label: &str) -> PgResult<Stream> {
    let failed = |why: String| PgError::new(sqlstate::UNABLE_TO_CONNECT, format!("could not connect to node {label} over TLS: {why}"));
    let config = credentials.client_config(role).map_err(|e| failed(e.to_string()))?;
    let mut request = BytesMut::new();
    frontend::ssl_request(&mut request);
    stream.write_all(&request).await.map_err(|e| failed(e.to_string()))?;
    let mut answer = [0u8; 1];
    stream.read_exact(&mut answer).await.map_err(|e| failed(e.to_string()))?;
    if answer[0] != b'S' {
        return Err(failed("the node does not accept TLS".into())
            .with_hint("The cluster's nodes need ssl = on with a certificate signed by the cluster's CA (docs/operations.md, \"Security\")."));
    }
    stream.connect_tls(config, host).await.map_err(|e| failed(e.to_string()))
}

impl PgConnection {
    /// A connection to `addr`, logged in as `login`; a node that does not
    /// answer within the connect timeout fails with 08001.
    pub async fn connect(addr: &ServerAddr, login: &Login) -> PgResult<Self> {
        let timeout = Duration::from_millis(CONNECT_TIMEOUT_MS.load(Ordering::Relaxed));
        match tokio::time::timeout(timeout, Self::connect_unbounded(addr, login)).await {
            Ok(connected) => connected,
            Err(_) => Err(PgError::new(
                sqlstate::UNABLE_TO_CONNECT,
                format!("could not connect to node {addr}: no answer within {:.1} s", timeout.as_secs_f64()),
            )
            .with_hint(
                "Check that the node is up and reachable from the coordinator; [connections] node_connect_timeout_secs sets how long to wait.",
            )),
        }
    }

    async fn connect_unbounded(addr: &ServerAddr, login: &Login) -> PgResult<Self> {
        let label: Arc<str> = Arc::from(addr.to_string());
        let mut stream = connect_node(&addr.host, addr.port)
            .await
            .map_err(|e| PgError::new(sqlstate::CONNECTION_FAILURE, format!("could not connect to node {label}: {e}")))?;
        if let (Some(credentials), true) = (node_tls::node_credentials(), stream.is_clear_tcp()) {
            // Boxed: the handshake's state is large, and every future that
            // may make a connection would carry it.
            stream = Box::pin(start_tls(stream, credentials, &addr.host, &login.user, &label)).await?;
        }
        let mut conn = PgConnection {
            stream,
            rbuf: BytesMut::with_capacity(16 * 1024),
            wbuf: BytesMut::with_capacity(4 * 1024),
            label,
            server_params: Vec::new(),
            backend_key: (0, 0),
            tx_status: TxStatus::Idle,
            broken: false,
            farewell: None,
            silent: Default::default(),
            captured: None,
            changed_params: None,
            // The start-up packet has no tag to count by; its exchange ends in one ReadyForQuery.
            ready_owed: 1,
            uncounted_from: 0,
        };
        let mut params: Vec<(&str, &str)> = vec![("user", &login.user), ("database", &login.database)];
        params.extend(login.options.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        frontend::startup(&mut conn.wbuf, &params);
        conn.uncounted_from = conn.wbuf.len();
        conn.flush().await?;
        loop {
            let msg = conn.recv().await?;
            match msg.tag() {
                b'R' => {
                    let (code, _) = backend::decode_authentication(&msg)?;
                    match code {
                        0 => {}
                        3 => {
                            let pw = login.password.as_deref().ok_or_else(|| conn.auth_error("a password is required"))?;
                            let mut data = pw.as_bytes().to_vec();
                            data.push(0);
                            frontend::password(&mut conn.wbuf, &data);
                            conn.flush().await?;
                        }
                        other => {
                            return Err(conn.auth_error(&format!("authentication method {other} is not supported; use trust or password on the node")))
                        }
                    }
                }
                b'S' => {
                    let (k, v) = backend::decode_parameter_status(&msg)?;
                    conn.server_params.push((k.to_string(), v.to_string()));
                }
                b'K' => conn.backend_key = backend::decode_backend_key_data(&msg)?,
                b'Z' => return Ok(conn),
                b'E' => return Err(conn.login_refused(&msg)),
                _ => {}
            }
        }
    }

    /// The node turned the login away (no such role, wrong password, too many
    /// connections, still starting): its SQLSTATE stands, as an ERROR of the
    /// statement that needed the connection rather than a lost connection.
    fn login_refused(&self, msg: &Message) -> PgError {
        let e = match backend::decode_error_fields(msg) {
            Ok(e) => e,
            Err(e) => return e.into(),
        };
        let refused = PgError::new(e.code(), format!("node {} refused the login: {}", self.label, e.message()));
        let refused = match e.detail() {
            Some(detail) => refused.with_detail(detail),
            None => refused,
        };
        match e.code() {
            "57P03" => refused.with_hint("The node is still starting up (or recovering); retry in a moment."),
            "53300" => refused.with_hint("The node has no connection slots left: raise its max_connections or lower the number of clients."),
            "28000" | "28P01" => {
                refused.with_hint("Every role that connects through the coordinator must exist on every node, with the same password.")
            }
            _ => refused,
        }
    }

    fn auth_error(&self, why: &str) -> PgError {
        PgError::new(sqlstate::INVALID_PASSWORD, format!("could not log in to node {}: {why}", self.label))
    }

    /// The node this connection talks to, as "host:port", for error messages.
    pub fn label(&self) -> &Arc<str> {
        &self.label
    }
    pub fn server_params(&self) -> &[(String, String)] {
        &self.server_params
    }
    pub fn backend_key(&self) -> (i32, i32) {
        self.backend_key
    }
    /// The transaction status from the last ReadyForQuery received.
    pub fn tx_status(&self) -> TxStatus {
        self.tx_status
    }
    /// True once an I/O error has happened; such a connection must be dropped.
    pub fn is_broken(&self) -> bool {
        self.broken
    }

    /// Whether every exchange sent on this connection has been read to its
    /// end, but for those queued silently (whose answers the next read
    /// skips): only then may another statement, or another session, use it.
    pub fn is_in_step(&self) -> bool {
        self.ready_owed <= self.silent.len()
    }

    /// Whether another session may take this connection: not broken, in
    /// step, and outside any transaction.
    pub fn is_reusable(&self) -> bool {
        !self.broken && self.is_in_step() && self.tx_status == TxStatus::Idle
    }

    /// Marks a connection out of step (see `is_in_step`) broken, so that
    /// it is closed rather than used again.
    pub fn break_if_out_of_step(&mut self) {
        if !self.is_in_step() {
            self.broken = true;
        }
    }

    /// The outgoing buffer; encoders append to it and `flush` sends it.
    pub fn out(&mut self) -> &mut BytesMut {
        &mut self.wbuf
    }

    /// Sends what is queued. While the server's side is full it reads what
    /// the server sends meanwhile (the answers to statements sent earlier in
    /// the same pipeline), so that neither side waits for the other to read:
    /// a long pipeline of INSERTs would otherwise stall once both sockets'
    /// buffers are full, which on a Unix socket takes little.
    pub async fn flush(&mut self) -> PgResult<()> {
        use bytes::Buf;
        // After a failed send cleared the buffer, what it had was never sent.
        let from = self.uncounted_from.min(self.wbuf.len());
        let (requests, counted) = frontend::ready_requests(&self.wbuf[from..]);
        self.ready_owed += requests;
        self.uncounted_from = from + counted;
        while !self.wbuf.is_empty() || self.stream.has_unsent() {
            match self.stream.try_write(&self.wbuf) {
                Ok(n) => {
                    self.wbuf.advance(n);
                    self.uncounted_from = self.uncounted_from.saturating_sub(n);
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    let ready = self.stream.ready(tokio::io::Interest::WRITABLE | tokio::io::Interest::READABLE).await;
                    match ready {
                        Ok(ready) if ready.is_readable() => match self.stream.try_read_buf(&mut self.rbuf) {
                            Ok(0) => {
                                self.wbuf.clear();
                                self.read_farewell();
                                return Err(self.closed_by_server());
                            }
                            Ok(_) => {}
                            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                            Err(e) => {
                                self.wbuf.clear();
                                return Err(self.lost(e));
                            }
                        },
                        Ok(_) => {}
                        Err(e) => {
                            self.wbuf.clear();
                            return Err(self.lost(e));
                        }
                    }
                }
                Err(e) => {
                    self.wbuf.clear();
                    self.read_farewell();
                    return Err(self.lost(e));
                }
            }
        }
        Ok(())
    }

    /// A write failed because the server closed the connection: what it sent
    /// before closing (over a Unix socket, the write fails at once) may say
    /// why, a FATAL error reported in place of the bare write error.
    fn read_farewell(&mut self) {
        while matches!(self.stream.try_read_buf(&mut self.rbuf), Ok(n) if n > 0) {}
        while let Ok(Some(_)) = self.take_buffered() {}
    }

    fn lost(&mut self, e: std::io::Error) -> PgError {
        self.broken = true;
        self.farewell.take().unwrap_or_else(|| PgError::new(sqlstate::CONNECTION_FAILURE, format!("connection to node {} was lost: {e}", self.label)))
    }

    /// Whether the server closed this connection while it sat idle (nothing
    /// sent, no response owed), e.g. because the node restarted. An idle server
    /// only ever speaks to say goodbye (a FATAL ErrorResponse, then EOF), so EOF
    /// or any byte at all means dead, and "would block" means alive. One
    /// non-blocking read at most, none when the socket is not known readable.
    pub fn is_dead_while_idle(&mut self) -> bool {
        if !self.broken {
            let quiet =
                self.rbuf.is_empty() && matches!(self.stream.try_read_buf(&mut self.rbuf), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock);
            self.broken = !quiet;
        }
        self.broken
    }

    /// Queues a simple-protocol statement (such as the BEGIN that opens a worker's
    /// part of a transaction) ahead of whatever comes next, without waiting for
    /// it: its responses are skipped by `recv`. Should it fail, the connection is
    /// unusable for the transaction and is reported broken.
    pub fn queue_silent(&mut self, sql: &str) {
        frontend::query(&mut self.wbuf, sql);
        self.silent.push_back(false);
    }

    /// `queue_silent` for a query of one value, kept for `take_captured`
    /// once its answer has been read (with whatever follows it).
    pub fn queue_capture(&mut self, sql: &str) {
        self.captured = None;
        frontend::query(&mut self.wbuf, sql);
        self.silent.push_back(true);
    }

    /// The value the last `queue_capture`d query gave, if it has come.
    pub fn take_captured(&mut self) -> Option<String> {
        self.captured.take()
    }

    /// Receives the next message, flushing anything queued first.
    pub async fn recv(&mut self) -> PgResult<Message> {
        self.flush().await?;
        loop {
            if let Some(msg) = self.take_buffered()? {
                if let Some(msg) = self.past_silent(msg)? {
                    return Ok(msg);
                }
                continue;
            }
            match self.stream.read_buf(&mut self.rbuf).await {
                Ok(0) => return Err(self.closed_by_server()),
                Ok(_) => {}
                Err(e) => return Err(self.lost(e)),
            }
        }
    }

    /// The next message if the server has already sent it, without waiting:
    /// lets a sender that streams data notice a failure early. Anything
    /// queued must have been flushed.
    pub fn try_recv(&mut self) -> PgResult<Option<Message>> {
        loop {
            if let Some(msg) = self.take_buffered()? {
                if let Some(msg) = self.past_silent(msg)? {
                    return Ok(Some(msg));
                }
                continue;
            }
            match self.stream.try_read_buf(&mut self.rbuf) {
                Ok(0) => return Err(self.closed_by_server()),
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Ok(None),
                Err(e) => return Err(self.lost(e)),
            }
        }
    }

    fn closed_by_server(&mut self) -> PgError {
        self.lost(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "server closed the connection"))
    }

    /// Skips the responses to statements queued with `queue_silent`; None
    /// while `msg` is one of them.
    fn past_silent(&mut self, msg: Message) -> PgResult<Option<Message>> {
        let Some(&capture) = self.silent.front() else {
            return Ok(Some(msg));
        };
        match msg.tag() {
            b'E' => {
                let e = self.server_error(&msg);
                self.broken = true;
                Err(e)
            }
            b'D' if capture => {
                self.captured = backend::decode_text_row(&msg)?.into_iter().next().flatten();
                Ok(None)
            }
            b'Z' => {
                self.silent.pop_front();
                Ok(None)
            }
            _ => Ok(None),
        }
    }

    /// A complete message from the read buffer, noting what the connection
    /// must remember about it.
    fn take_buffered(&mut self) -> PgResult<Option<Message>> {
        let Some(msg) = take_message(&mut self.rbuf)? else { return Ok(None) };
        match msg.tag() {
            b'Z' => {
                self.tx_status = backend::decode_ready_for_query(&msg);
                self.ready_owed = self.ready_owed.saturating_sub(1);
            }
            b'E' => self.note_farewell(&msg),
            b'S' => {
                if let Some(changed) = &mut self.changed_params {
                    let (name, value) = backend::decode_parameter_status(&msg)?;
                    changed.push((name.to_string(), value.to_string()));
                }
            }
            _ => {}
        }
        Ok(Some(msg))
    }

    /// From now on, remember the settings the server reports as changed.
    pub fn track_parameter_changes(&mut self) {
        self.changed_params.get_or_insert_with(Vec::new);
    }

    /// Settings the server reported as changed (by SET, say) since the last call.
    pub fn take_changed_params(&mut self) -> Vec<(String, String)> {
        self.changed_params.as_mut().map(std::mem::take).unwrap_or_default()
    }

    /// Turns a server's ErrorResponse into our error, saying which node raised it.
    pub fn server_error(&self, msg: &Message) -> PgError {
        match backend::decode_error_fields(msg) {
            Ok(e) => self.node_error(e),
            Err(e) => e.into(),
        }
    }

    fn node_error(&self, e: PgError) -> PgError {
        e.as_statement_error(&self.label).with_context(format!("while executing command on {}", self.label))
    }

    /// A FATAL error ends the connection: it is broken from here on, and the
    /// error says why when reading on hits EOF.
    fn note_farewell(&mut self, msg: &Message) {
        if let Ok(e) = backend::decode_error_fields(msg) {
            if e.is_fatal() {
                self.broken = true;
                self.farewell = Some(self.node_error(e));
            }
        }
    }

    /// Reads and discards messages up to and including ReadyForQuery.
    pub async fn drain_until_ready(&mut self) -> PgResult<()> {
        while self.recv().await?.tag() != b'Z' {}
        Ok(())
    }

    /// Reads a simple-protocol exchange's responses up to ReadyForQuery. Returns
    /// the last command tag, or the first error; every other message, the
    /// CommandCompletes included, goes to `on_message` (a failing callback
    /// also ends in that error, after the exchange is drained).
    async fn finish_exchange(&mut self, mut on_message: impl FnMut(&mut BytesMut, &Message) -> PgResult<()>) -> PgResult<String> {
        let mut tag = String::new();
        let mut error = None;
        loop {
            let msg = self.recv().await?;
            if msg.tag() == b'C' {
                tag = backend::decode_command_complete(&msg)?.to_string();
            }
            match msg.tag() {
                b'E' => {
                    error.get_or_insert_with(|| self.server_error(&msg));
                }
                b'Z' => break,
                _ if error.is_none() => {
                    if let Err(e) = on_message(&mut self.wbuf, &msg) {
                        error = Some(e);
                    }
                }
                _ => {}
            }
        }
        match error {
            Some(e) => Err(e),
            None => Ok(tag),
        }
    }

    /// Runs one or more statements with the simple protocol, returning the rows of
    /// the last result set in text form, or the first error.
    pub async fn query(&mut self, sql: &str) -> PgResult<TextRows> {
        frontend::query(&mut self.wbuf, sql);
        let mut rows = Vec::new();
        self.finish_exchange(|out, msg| {
            match msg.tag() {
                b'T' => rows.clear(),
                b'D' => rows.push(backend::decode_text_row(msg)?),
                b'G' => frontend::copy_fail(out, "COPY FROM STDIN is not allowed here"),
                _ => {}
            }
            Ok(())
        })
        .await?;
        Ok(rows)
    }

    /// Reads the responses to an extended-protocol exchange the caller queued
    /// (Parse, Bind, Describe of the portal, Execute, Sync): the result's
    /// columns and its rows in text form, or the first error. `admit` sees
    /// each row before it is kept, and may refuse it (a memory limit).
    pub async fn read_result(&mut self, mut admit: impl FnMut(&TextRow) -> PgResult<()>) -> PgResult<(Vec<backend::FieldDescription>, TextRows)> {
        let mut fields = Vec::new();
        let mut rows = Vec::new();
        self.finish_exchange(|_, msg| {
            match msg.tag() {
                b'T' => fields = backend::decode_row_description(msg)?,
                b'D' => {
                    let row = backend::decode_text_row(msg)?;
                    admit(&row)?;
                    rows.push(row);
                }
                _ => {}
            }
            Ok(())
        })
        .await?;
        Ok((fields, rows))
    }

    /// Runs one or more statements with the simple protocol, as libpq's
    /// `PQexec` would: what the last one returned, or the first error.
    pub async fn last_result(&mut self, sql: &str) -> PgResult<LastResult> {
        frontend::query(&mut self.wbuf, sql);
        let mut last = LastResult::Command(String::new());
        let mut columns = None;
        let mut rows = Vec::new();
        self.finish_exchange(|out, msg| {
            match msg.tag() {
                b'T' => {
                    columns = Some(backend::decode_row_description(msg)?.len());
                    rows.clear();
                }
                b'D' => rows.push(backend::decode_text_row(msg)?),
                b'C' => {
                    last = match columns.take() {
                        Some(columns) => LastResult::Rows { columns, rows: std::mem::take(&mut rows) },
                        None => LastResult::Command(backend::decode_command_complete(msg)?.to_string()),
                    }
                }
                b'G' => frontend::copy_fail(out, "COPY FROM STDIN is not allowed here"),
                _ => {}
            }
            Ok(())
        })
        .await?;
        Ok(last)
    }

    /// Runs statements whose rows are not needed; returns the last command tag.
    pub async fn execute(&mut self, sql: &str) -> PgResult<String> {
        frontend::query(&mut self.wbuf, sql);
        self.finish_exchange(|out, msg| {
            if msg.tag() == b'G' {
                frontend::copy_fail(out, "COPY FROM STDIN is not allowed here");
            }
            Ok(())
        })
        .await
    }

    /// Runs a single-row query and returns its first column.
    pub async fn query_value(&mut self, sql: &str) -> PgResult<Option<String>> {
        Ok(first_value(self.query(sql).await?))
    }

    /// Runs `sql` on a connection of its own, closed after: the rows of its
    /// last statement. For the occasional statement where no connection is
    /// held (start-up, operations, reading a node's type oids).
    pub async fn query_once(addr: &ServerAddr, login: &Login, sql: &str) -> PgResult<TextRows> {
        let mut conn = Self::connect(addr, login).await?;
        let rows = conn.query(sql).await;
        conn.terminate().await;
        rows
    }

    /// Runs `COPY … FROM STDIN` and streams `chunks` (already in the COPY format the
    /// statement names) into it; returns the row count.
    pub async fn copy_in<I>(&mut self, sql: &str, chunks: I) -> PgResult<u64>
    where
        I: IntoIterator<Item = Bytes>,
    {
        frontend::query(&mut self.wbuf, sql);
        let msg = self.recv().await?;
        match msg.tag() {
            b'G' => {}
            b'E' => {
                let e = self.server_error(&msg);
                self.drain_until_ready().await?;
                return Err(e);
            }
            other => return Err(PgError::internal(format!("unexpected message {} from {} at COPY start", other as char, self.label))),
        }
        for chunk in chunks {
            frontend::copy_data(&mut self.wbuf, &chunk);
            if self.wbuf.len() > 256 * 1024 {
                self.flush().await?;
            }
        }
        frontend::copy_done(&mut self.wbuf);
        let tag = self.finish_exchange(|_, _| Ok(())).await?;
        Ok(backend::rows_in_tag(&tag).unwrap_or(0))
    }

    /// Runs `COPY … TO STDOUT` and hands each data chunk (one row in text/CSV
    /// formats) to `sink`.
    pub async fn copy_out(&mut self, sql: &str, mut sink: impl FnMut(Bytes) -> PgResult<()>) -> PgResult<u64> {
        frontend::query(&mut self.wbuf, sql);
        let tag = self
            .finish_exchange(|_, msg| match msg.tag() {
                b'd' => sink(msg.body_bytes()),
                _ => Ok(()),
            })
            .await?;
        Ok(backend::rows_in_tag(&tag).unwrap_or(0))
    }

    /// Gives `settings` (name, value) these values for the rest of the
    /// current transaction, as SET LOCAL would, and returns what they were,
    /// for `restore_after` to put back: what the transaction runs after
    /// that sees the settings it had.
    pub async fn set_for_now(&mut self, settings: &[(&str, &str)]) -> PgResult<SavedSettings> {
        let names: Vec<String> = settings.iter().map(|(name, _)| quote_literal(name)).collect();
        let current: Vec<String> = names.iter().enumerate().map(|(i, name)| format!("pg_catalog.current_setting({name}) AS s{i}")).collect();
        let set: Vec<String> =
            names.iter().zip(settings).map(|(name, (_, value))| format!("pg_catalog.set_config({name}, {}, true)", quote_literal(value))).collect();
        // The subquery reads the old values before the outer query sets the new ones.
        let sql = format!("SELECT was.*, {} FROM (SELECT {} OFFSET 0) was", set.join(", "), current.join(", "));
        let row = self.query(&sql).await?.into_iter().next().unwrap_or_default();
        Ok(SavedSettings(settings.iter().zip(row).map(|((name, _), was)| (name.to_string(), was.unwrap_or_default())).collect()))
    }

    /// Puts back the settings `set_for_now` changed, once the work done
    /// under them has given `outcome`. A failure aborted the transaction,
    /// whose end (or a rollback to a savepoint) puts them back: the failure
    /// is the outcome then.
    pub async fn restore_after<T>(&mut self, saved: SavedSettings, outcome: PgResult<T>) -> PgResult<T> {
        let value = outcome?;
        let set: Vec<String> =
            saved.0.iter().map(|(name, value)| format!("pg_catalog.set_config({}, {}, true)", quote_literal(name), quote_literal(value))).collect();
        self.execute(&format!("SELECT {}", set.join(", "))).await?;
        Ok(value)
    }

    /// Politely ends the session.
    pub async fn terminate(mut self) {
        frontend::terminate(&mut self.wbuf);
        let _ = self.flush().await;
    }
}

/// Settings as they were before `PgConnection::set_for_now` changed them.
#[must_use = "the settings stay changed until restored"]
pub struct SavedSettings(Vec<(String, String)>);

/// Settings under which what PostgreSQL prints of a definition
/// (`format_type`, `pg_get_expr`, `pg_get_*def`, `regclass` and the like)
/// names every object with its schema, whatever the session's search_path:
/// such text means the same on a node and in a statement planned without
/// that search_path.
pub const QUALIFIED_NAMES: [(&str, &str); 1] = [("search_path", "pg_catalog")];

/// The first column of the first row, if any.
pub fn first_value(rows: TextRows) -> Option<String> {
    rows.into_iter().next().and_then(|r| r.into_iter().next().flatten())
}

/// How long `send_cancel` waits for the server to take the request.
const CANCEL_PATIENCE: Duration = Duration::from_secs(1);

/// Asks a server to cancel the query running on the backend with this key,
/// and waits until the server has passed the request on (it closes the
/// connection then), as libpq does: the backend has its signal before the
/// caller sends it anything else, so that the request cannot land on a
/// later statement.
pub async fn send_cancel(addr: &ServerAddr, key: (i32, i32)) {
    let ask = async {
        let mut stream = connect_node(&addr.host, addr.port).await.ok()?;
        let mut buf = BytesMut::new();
        frontend::cancel_request(&mut buf, key.0, key.1);
        stream.write_all(&buf).await.ok()?;
        let mut rest = [0u8; 64];
        while stream.read(&mut rest).await.ok()? > 0 {}
        Some(())
    };
    let _ = tokio::time::timeout(CANCEL_PATIENCE, ask).await;
}

/// Quotes an identifier for SQL text we generate.
pub fn quote_ident(name: &str) -> String {
    let plain = !name.is_empty()
        && name.chars().next().is_some_and(|c| c.is_ascii_lowercase() || c == '_')
        && name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if plain && !pg_query::scan(name).map(|s| s.tokens.iter().any(|t| t.keyword_kind > 1)).unwrap_or(true) {
        name.to_string()
    } else {
        format!("\"{}\"", name.replace('"', "\"\""))
    }
}

/// Quotes a string literal for SQL text we generate.
pub fn quote_literal(value: &str) -> String {
    if value.contains('\\') {
        format!("E'{}'", value.replace('\\', "\\\\").replace('\'', "''"))
    } else {
        format!("'{}'", value.replace('\'', "''"))
    }
}

/// A `text[]` literal of `items`, for the helper functions that take lists.
pub fn text_array<'a>(items: impl IntoIterator<Item = &'a String>) -> String {
    format!("ARRAY[{}]::text[]", items.into_iter().map(|i| quote_literal(i)).collect::<Vec<_>>().join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identifiers_are_quoted_only_when_needed() {
        assert_eq!(quote_ident("accounts"), "accounts");
        assert_eq!(quote_ident("Accounts"), "\"Accounts\"");
        assert_eq!(quote_ident("select"), "\"select\"");
        assert_eq!(quote_ident("a\"b"), "\"a\"\"b\"");
    }

    #[test]
    fn literals_escape_quotes_and_backslashes() {
        assert_eq!(quote_literal("it's"), "'it''s'");
        assert_eq!(quote_literal("a\\b"), "E'a\\\\b'");
    }
}
