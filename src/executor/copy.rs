//! COPY through the coordinator.
//!
//! FROM STDIN: the client's rows are read as they arrive, each routed by its
//! distribution column, and sent on in batches — one `COPY <shard> FROM STDIN`
//! per batch, pipelined on the session's connection to the shard's node, so
//! that every node works while the next rows are read. All of it happens in
//! the session's transaction block (an implicit one when the client has
//! none), so one bad row rolls back every shard and several writing nodes
//! commit with two-phase commit. A worker's error names the line it saw in
//! its batch; each batch remembers its rows' input lines to name the
//! client's line instead.
//!
//! TO STDOUT: one `COPY <shard> TO STDOUT` per shard, all queued on each
//! node's connection at once, their data relayed as the client's one COPY.
//!
//! Before either, the client's own statement runs against the table's empty
//! shell in the coordinator database: PostgreSQL checks its columns,
//! options and privileges and writes the CopyInResponse / CopyOutResponse
//! (and any header) the client gets.

use super::router::node_of_group;
use crate::connection::client::{client_lost, ClientConn};
use crate::connection::PgConnection;
use crate::copy::{self, Row, RowReader, BATCH_BYTES, BINARY_TRAILER, MAX_IN_FLIGHT};
use crate::error::{sqlstate, PgError, PgResult};
use crate::metadata::{Catalog, Node};
use crate::planner::{CopyPlan, KeyPosition, KeyRouting};
use crate::protocol::{backend, frontend, Message};
use crate::transaction::{Access, Participants};
use bytes::{Bytes, BytesMut};
use std::collections::VecDeque;
use std::sync::Arc;

/// All shards' unsent rows together; past this every batch goes out.
const BUFFERED_BYTES: usize = 16 << 20;
/// Rows whose key the coordinator database must convert wait for this many,
/// to convert them in one round trip.
const CONVERSION_BATCH: usize = 512;
/// How much of a row an error message shows, as PostgreSQL's COPY does.
const ROW_SHOWN: usize = 100;
/// Rows that need serial or identity values wait for this many, to draw
/// their values in one round trip.
const FILL_BATCH: usize = 1000;

pub async fn run(plan: &CopyPlan, parts: &mut Participants, catalog: &Catalog, client: &mut ClientConn) -> PgResult<()> {
    if plan.from_client {
        copy_in(plan, parts, catalog, client).await
    } else {
        copy_out(plan, parts, catalog, client).await
    }
}

async fn copy_in(plan: &CopyPlan, parts: &mut Participants, catalog: &Catalog, client: &mut ClientConn) -> PgResult<()> {
    let copy_in_response = start_on_shell(parts, plan).await?;
    if plan.key == KeyPosition::Missing {
        return Err(missing_key_column(plan));
    }
    client.out().extend_from_slice(copy_in_response.frame());
    client.flush().await.map_err(client_lost)?;
    if !plan.fills.is_empty() && plan.format.is_binary() {
        // Refused at the end of the client's data, where PostgreSQL reports
        // bad data: clients wait for the COPY's outcome only then.
        while let Some(msg) = client.recv().await.map_err(client_lost)? {
            if matches!(msg.tag(), b'c' | b'f') {
                break;
            }
        }
        return Err(PgError::not_supported(format!(
            "COPY in binary format into {} must list its serial and identity columns: the coordinator fills them in text and CSV only",
            plan.table.name
        ))
        .with_hint("Include the columns and their values, or use FORMAT text or csv."));
    }
    let implicit = parts.begin_implicit();
    let mut load = Load::new(plan, catalog);
    let streamed = load.stream(parts, client).await;
    // Every batch's answer is read even after a failure, so that each
    // connection is in step again for the rollback.
    let settled = load.settle(parts, client).await;
    let mut result = streamed.and(settled).map(|_| load.rows());
    if implicit && result.is_ok() {
        result = parts.commit().await.and(result);
    }
    if result.is_err() {
        parts.discard_broken();
        if implicit {
            parts.rollback().await.ok();
        }
    }
    backend::command_complete(client.out(), &format!("COPY {}", result?));
    Ok(())
}

/// Runs the client's COPY FROM STDIN against the empty shell table with no
/// data (which inserts nothing); returns PostgreSQL's CopyInResponse.
async fn start_on_shell(parts: &mut Participants, plan: &CopyPlan) -> PgResult<Message> {
    let local = parts.local_outside_block().await?;
    frontend::query(local.out(), &plan.shell_sql);
    let mut response = None;
    let mut error = None;
    loop {
        let msg = local.recv().await?;
        match msg.tag() {
            b'G' => {
                if plan.format.is_binary() {
                    frontend::copy_data(local.out(), &empty_binary_file());
                }
                frontend::copy_done(local.out());
                response = Some(msg);
            }
            // The shell's own errors, as PostgreSQL gives them for the table.
            b'E' => error = error.or(Some(backend::decode_error_fields(&msg)?)),
            b'Z' => break,
            _ => {}
        }
    }
    parts.observe_local_status();
    match (error, response) {
        (Some(e), _) => Err(e),
        (None, Some(response)) => Ok(response),
        (None, None) => Err(PgError::internal("the shell table's COPY did not start")),
    }
}

fn empty_binary_file() -> Vec<u8> {
    let mut file = b"PGCOPY\n\xff\r\n\0".to_vec();
    file.extend_from_slice(&[0; 8]);
    file.extend_from_slice(&BINARY_TRAILER);
    file
}

fn missing_key_column(plan: &CopyPlan) -> PgError {
    let column = match &plan.table.distribution {
        crate::metadata::Distribution::Hash { column, .. } => column.as_str(),
        crate::metadata::Distribution::Reference => "",
    };
    PgError::new(sqlstate::NOT_NULL_VIOLATION, format!("the partition column of table {} cannot be NULL", plan.table.name))
        .with_hint(format!("Include the distribution column \"{column}\" in the COPY column list."))
}

/// The rows of one shard waiting to be sent, and where they came from.
#[derive(Default)]
struct Batch {
    data: BytesMut,
    rows: Vec<RowLines>,
}

/// A row sent to a shard: its line in the client's input, and how many lines
/// the worker counts for it (more than one for CSV with quoted line ends).
#[derive(Clone, Copy)]
struct RowLines {
    input_line: u64,
    worker_lines: u32,
}

/// A batch a node has been sent and not yet answered.
struct InFlight {
    shard: usize,
    rows: Arc<Vec<RowLines>>,
    /// Its rows count towards the total (the first placement of a shard).
    counted: bool,
}

/// The batches sent to one node, answered in order.
struct Stream {
    group: i32,
    in_flight: VecDeque<InFlight>,
    rows: u64,
    error: Option<PgError>,
}

struct Load<'a> {
    plan: &'a CopyPlan,
    catalog: &'a Catalog,
    routing: Option<KeyRouting<'a>>,
    reader: RowReader,
    batches: Vec<Batch>,
    buffered: usize,
    streams: Vec<Stream>,
    /// Rows whose key the coordinator database must convert first.
    awaiting_key: Vec<(Row, Bytes)>,
    /// Rows waiting for the values of the plan's `fills`.
    awaiting_fill: Vec<Row>,
}

impl<'a> Load<'a> {
    fn new(plan: &'a CopyPlan, catalog: &'a Catalog) -> Self {
        Load {
            plan,
            catalog,
            routing: KeyRouting::new(&plan.table, true),
            reader: RowReader::new(plan.format.clone(), plan.fields),
            batches: (0..plan.shard_sql.len()).map(|_| Batch::default()).collect(),
            buffered: 0,
            streams: Vec::new(),
            awaiting_key: Vec::new(),
            awaiting_fill: Vec::new(),
        }
    }

    fn rows(&self) -> u64 {
        self.streams.iter().map(|s| s.rows).sum()
    }

    /// Reads the client's data to its end, sending every row on.
    async fn stream(&mut self, parts: &mut Participants, client: &mut ClientConn) -> PgResult<()> {
        loop {
            let msg = client.recv().await.map_err(client_lost)?.ok_or_else(|| client_lost("end of stream"))?;
            match msg.tag() {
                b'd' => self.reader.push(msg.body()),
                b'c' => self.reader.finish(),
                b'f' => {
                    let reason = String::from_utf8_lossy(msg.body().strip_suffix(&[0]).unwrap_or(msg.body())).into_owned();
                    return Err(PgError::new(sqlstate::QUERY_CANCELED, format!("COPY from stdin failed: {reason}")));
                }
                // libpq may send these without noticing the command was a COPY.
                b'H' | b'S' => continue,
                other => {
                    return Err(PgError::new(sqlstate::PROTOCOL_VIOLATION, format!("unexpected message type 0x{other:02X} during COPY from stdin")));
                }
            }
            loop {
                let row = self.reader.next_row().map_err(|e| self.at_line(e, self.reader.current_line(), None))?;
                let Some(row) = row else { break };
                if self.plan.fills.is_empty() {
                    self.route(parts, client, row).await?;
                } else {
                    self.awaiting_fill.push(row);
                    if self.awaiting_fill.len() >= FILL_BATCH {
                        self.fill(parts, client).await?;
                    }
                }
            }
            if msg.tag() == b'c' {
                break;
            }
        }
        self.fill(parts, client).await?;
        self.convert_keys(parts, client).await?;
        for shard in 0..self.batches.len() {
            self.send(parts, client, shard).await?;
        }
        Ok(())
    }

    async fn route(&mut self, parts: &mut Participants, client: &mut ClientConn, row: Row) -> PgResult<()> {
        let key = match self.plan.key {
            KeyPosition::Everywhere => return self.append(parts, client, 0, row).await,
            KeyPosition::Field(key) => key,
            KeyPosition::Missing => return Err(missing_key_column(self.plan)),
        };
        let routing = self.routing.ok_or_else(|| PgError::internal("COPY into a hash-distributed table without its key"))?;
        let binary = self.plan.format.is_binary();
        let local = {
            let value = copy::field(&self.plan.format, row.content(), key).map_err(|e| self.at_row(e, &row))?;
            let Some(value) = value else {
                let e = PgError::new(sqlstate::NOT_NULL_VIOLATION, "the partition column value cannot be NULL");
                return Err(self.at_row(e, &row));
            };
            let type_oid = if binary { routing.type_oid() } else { 0 };
            routing.local_shard(&value, type_oid, binary).ok_or_else(|| Bytes::copy_from_slice(&value))
        };
        match local {
            Ok(shard) => self.append(parts, client, shard as usize, row).await,
            Err(value) => {
                self.awaiting_key.push((row, value));
                if self.awaiting_key.len() >= CONVERSION_BATCH {
                    self.convert_keys(parts, client).await?;
                }
                Ok(())
            }
        }
    }

    /// Gives the waiting rows their serial and identity values, drawn from
    /// the coordinator database's sequences in one round trip, then routes them.
    async fn fill(&mut self, parts: &mut Participants, client: &mut ClientConn) -> PgResult<()> {
        let waiting = std::mem::take(&mut self.awaiting_fill);
        if waiting.is_empty() {
            return Ok(());
        }
        let sql = format!("SELECT {} FROM generate_series(1, {})", self.plan.fills.join(", "), waiting.len());
        let values = parts
            .local()
            .await?
            .query(&sql)
            .await
            .map_err(|e| e.with_context(format!("filling the serial and identity columns of {}", self.plan.table.name)))?;
        for (row, values) in waiting.into_iter().zip(values) {
            let mut data = BytesMut::with_capacity(row.data.len() + 16 * values.len());
            data.extend_from_slice(row.content());
            for value in &values {
                data.extend_from_slice(&[self.plan.format.delimiter]);
                copy::write_field(&self.plan.format, value.as_deref().map(str::as_bytes), &mut data);
            }
            let content_len = data.len();
            data.extend_from_slice(&row.data[row.content_len..]);
            let filled = Row { data: data.freeze(), content_len, ..row };
            self.route(parts, client, filled).await?;
        }
        Ok(())
    }

    /// Routes the rows whose key the coordinator database had to convert to
    /// the column's type (it also rejects a value the type does not accept).
    async fn convert_keys(&mut self, parts: &mut Participants, client: &mut ClientConn) -> PgResult<()> {
        let waiting = std::mem::take(&mut self.awaiting_key);
        let Some(routing) = self.routing.filter(|_| !waiting.is_empty()) else { return Ok(()) };
        let binary = self.plan.format.is_binary();
        let type_oid = if binary { routing.type_oid() } else { 0 };
        let values: Vec<&[u8]> = waiting.iter().map(|(_, v)| v.as_ref()).collect();
        let converted = match super::router::coerce_keys(parts, &routing, type_oid, binary, &values).await {
            Ok(converted) => converted,
            Err((i, e)) => {
                let (row, value) = &waiting[i.min(waiting.len() - 1)];
                return Err(self.at_key(e, row, value));
            }
        };
        for ((row, _), value) in waiting.into_iter().zip(converted) {
            let value = value.ok_or_else(|| PgError::new(sqlstate::NOT_NULL_VIOLATION, "the partition column value cannot be NULL"))?;
            let shard = routing.shard_for_coerced(&value)?;
            self.append(parts, client, shard as usize, row).await?;
        }
        Ok(())
    }

    async fn append(&mut self, parts: &mut Participants, client: &mut ClientConn, shard: usize, row: Row) -> PgResult<()> {
        let header = self.reader.header().is_some() && !self.plan.format.is_binary();
        let batch = self.batches.get_mut(shard).ok_or_else(|| PgError::internal(format!("shard index {shard} out of range")))?;
        // Line ends in quoted fields count as lines once the worker knows
        // the newline style, i.e. after the first line it is sent.
        let quoted = if batch.rows.is_empty() && !header {
            row.quoted_returns
        } else if self.reader.lines_end_in_line_feed() {
            row.quoted_newlines
        } else {
            row.quoted_returns
        };
        batch.rows.push(RowLines { input_line: row.line, worker_lines: 1 + quoted });
        batch.data.extend_from_slice(&row.data);
        self.buffered += row.data.len();
        if batch.data.len() >= BATCH_BYTES {
            self.send(parts, client, shard).await?;
        } else if self.buffered >= BUFFERED_BYTES {
            for shard in 0..self.batches.len() {
                self.send(parts, client, shard).await?;
            }
        }
        Ok(())
    }

    /// Sends a shard's waiting rows to each of its placements as one COPY,
    /// then takes in whatever the nodes have answered so far.
    async fn send(&mut self, parts: &mut Participants, client: &mut ClientConn, shard: usize) -> PgResult<()> {
        let batch = std::mem::take(&mut self.batches[shard]);
        if batch.rows.is_empty() {
            return Ok(());
        }
        self.buffered -= batch.data.len();
        let rows = Arc::new(batch.rows);
        let placements = &self.plan.table.shards[shard].placements;
        for (i, group) in placements.iter().enumerate() {
            let node = node_of_group(self.catalog, *group)?;
            let worker = parts.worker(node, Access::Write).await?;
            let mut chunks: Vec<&[u8]> = Vec::with_capacity(3);
            chunks.extend(self.reader.header().map(|h| &h[..]));
            chunks.push(&batch.data);
            if self.plan.format.is_binary() {
                chunks.push(&BINARY_TRAILER);
            }
            frontend::copy_from_stdin(worker.conn.out(), &self.plan.shard_sql[shard], &chunks);
            let stream = match self.streams.iter().position(|s| s.group == *group) {
                Some(at) => &mut self.streams[at],
                None => {
                    self.streams.push(Stream { group: *group, in_flight: VecDeque::new(), rows: 0, error: None });
                    self.streams.last_mut().unwrap()
                }
            };
            stream.in_flight.push_back(InFlight { shard, rows: rows.clone(), counted: i == 0 });
            worker.conn.flush().await?;
            let errors = ErrorLines { plan: self.plan, header: self.reader.header().is_some() && !self.plan.format.is_binary() };
            stream.collect(&mut worker.conn, &errors, client, MAX_IN_FLIGHT).await?;
            if let Some(e) = &stream.error {
                return Err(e.clone());
            }
        }
        Ok(())
    }

    /// Waits for every node's answers to all its batches; the first error
    /// any of them reported.
    async fn settle(&mut self, parts: &mut Participants, client: &mut ClientConn) -> PgResult<()> {
        let errors = ErrorLines { plan: self.plan, header: self.reader.header().is_some() && !self.plan.format.is_binary() };
        let mut first_error = None;
        for stream in &mut self.streams {
            let node = node_of_group(self.catalog, stream.group)?;
            let worker = parts.worker(node, Access::Write).await?;
            if !worker.conn.is_broken() {
                if let Err(e) = stream.collect(&mut worker.conn, &errors, client, 0).await {
                    first_error.get_or_insert(e);
                }
            }
            if let Some(e) = stream.error.take() {
                first_error.get_or_insert(e);
            }
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    fn at_line(&self, e: PgError, line: u64, row: Option<&Row>) -> PgError {
        let shown = row.map(|r| format!(": \"{}\"", shown(r.content()))).unwrap_or_default();
        e.with_context(format!("COPY {}, line {line}{shown}", self.plan.table.name))
    }

    fn at_row(&self, e: PgError, row: &Row) -> PgError {
        self.at_line(e, row.line, (!self.plan.format.is_binary()).then_some(row))
    }

    fn at_key(&self, e: PgError, row: &Row, value: &[u8]) -> PgError {
        let column = match &self.plan.table.distribution {
            crate::metadata::Distribution::Hash { column, .. } => column.as_str(),
            crate::metadata::Distribution::Reference => "",
        };
        let value = if self.plan.format.is_binary() { String::new() } else { format!(": \"{}\"", shown(value)) };
        e.with_context(format!("COPY {}, line {}, column {column}{value}", self.plan.table.name, row.line))
    }
}

/// At most ROW_SHOWN bytes of a row, cut at a character boundary.
fn shown(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    match text.char_indices().nth(ROW_SHOWN) {
        Some((cut, _)) => format!("{}...", &text[..cut]),
        None => text.into_owned(),
    }
}

/// Turns the line a worker names in its batch into the client's input line.
struct ErrorLines<'a> {
    plan: &'a CopyPlan,
    /// Each batch starts with the header line.
    header: bool,
}

impl ErrorLines<'_> {
    fn map(&self, e: PgError, batch: &InFlight) -> PgError {
        let shard = &self.plan.table.shards[batch.shard];
        let prefix = format!("COPY {}, line ", self.plan.table.shard_relname(shard));
        let table = &self.plan.table.name;
        e.map_context(|context| {
            let Some(at) = context.find(&prefix) else { return context.to_string() };
            let number_at = at + prefix.len();
            let digits = context[number_at..].bytes().take_while(u8::is_ascii_digit).count();
            let worker_line: u64 = context[number_at..number_at + digits].parse().unwrap_or(0);
            match self.input_line(batch, worker_line) {
                Some(line) => format!("{}COPY {table}, line {line}{}", &context[..at], &context[number_at + digits..]),
                None => context.to_string(),
            }
        })
    }

    fn input_line(&self, batch: &InFlight, worker_line: u64) -> Option<u64> {
        let mut end = u64::from(self.header);
        for row in batch.rows.iter() {
            end += u64::from(row.worker_lines);
            if end >= worker_line {
                return row.input_line.checked_sub(end - worker_line);
            }
        }
        None
    }
}

impl Stream {
    /// Takes in the node's answers that have arrived, then waits for more
    /// until no more than `outstanding` batches are unanswered.
    async fn collect(&mut self, conn: &mut PgConnection, errors: &ErrorLines<'_>, client: &mut ClientConn, outstanding: usize) -> PgResult<()> {
        loop {
            let msg = if self.in_flight.len() > outstanding { Some(conn.recv().await?) } else { conn.try_recv()? };
            let Some(msg) = msg else { return Ok(()) };
            let Some(batch) = self.in_flight.front() else {
                return Err(PgError::internal(format!("node {} answered a COPY it was not sent", conn.label())));
            };
            match msg.tag() {
                b'C' if batch.counted => self.rows += backend::rows_in_tag(backend::decode_command_complete(&msg)?).unwrap_or(0),
                b'E' if self.error.is_none() => self.error = Some(errors.map(conn.server_error(&msg), batch)),
                b'N' => client.out().extend_from_slice(msg.frame()),
                b'Z' => {
                    self.in_flight.pop_front();
                }
                _ => {}
            }
        }
    }
}

async fn copy_out(plan: &CopyPlan, parts: &mut Participants, catalog: &Catalog, client: &mut ClientConn) -> PgResult<()> {
    describe_on_shell(parts, plan, client).await?;
    let by_node = shards_by_node(plan, parts, catalog)?;
    for (node, _) in &by_node {
        parts.worker(node, Access::Read).await?;
    }
    let mut first_error = None;
    let mut queued = Vec::new();
    for (node, shards) in &by_node {
        let worker = parts.worker(node, Access::Read).await?;
        for shard in shards {
            frontend::query(worker.conn.out(), &plan.shard_sql[*shard]);
        }
        match worker.conn.flush().await {
            Ok(()) => queued.push((node, shards.len())),
            Err(e) => {
                first_error.get_or_insert(e);
            }
        }
    }
    let mut rows = 0;
    for (node, shards) in queued {
        let worker = parts.worker(node, Access::Read).await?;
        for _ in 0..shards {
            match relay_shard(&mut worker.conn, plan, client, first_error.is_none()).await {
                Ok(n) => rows += n,
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
            if worker.conn.is_broken() {
                break;
            }
        }
    }
    if let Some(e) = first_error {
        return Err(e);
    }
    // CopyData and CopyDone are the same messages in both directions.
    if plan.format.is_binary() {
        frontend::copy_data(client.out(), &BINARY_TRAILER);
    }
    frontend::copy_done(client.out());
    backend::command_complete(client.out(), &format!("COPY {rows}"));
    Ok(())
}

/// Each node with the shards it is read from: every shard of a distributed
/// table, one placement of a reference table's (one this transaction already
/// uses, if any, so that it sees its own writes).
fn shards_by_node(plan: &CopyPlan, parts: &Participants, catalog: &Catalog) -> PgResult<Vec<(Node, Vec<usize>)>> {
    let mut by_node: Vec<(Node, Vec<usize>)> = Vec::new();
    for (index, shard) in plan.table.shards.iter().enumerate() {
        let placements = &shard.placements;
        let group = placements.iter().find(|g| parts.has_worker_in_block(**g)).or(placements.first());
        let group = *group.ok_or_else(|| PgError::internal(format!("shard {} has no placement", shard.id)))?;
        match by_node.iter_mut().find(|(n, _)| n.group_id == group) {
            Some((_, shards)) => shards.push(index),
            None => by_node.push((node_of_group(catalog, group)?.clone(), vec![index])),
        }
    }
    Ok(by_node)
}

/// Runs the client's COPY TO STDOUT on the empty shell table and passes on
/// what it starts with: the CopyOutResponse and the header (the header line,
/// or the binary file header without the trailer).
async fn describe_on_shell(parts: &mut Participants, plan: &CopyPlan, client: &mut ClientConn) -> PgResult<()> {
    frontend::query(parts.local_outside_block().await?.out(), &plan.shell_sql);
    super::relay_local_answer(parts, client, |msg, out| match msg.tag() {
        b'H' => out.extend_from_slice(msg.frame()),
        b'd' if plan.format.is_binary() => frontend::copy_data(out, msg.body().strip_suffix(&BINARY_TRAILER).unwrap_or(msg.body())),
        b'd' => out.extend_from_slice(msg.frame()),
        _ => {}
    })
    .await
}

/// Relays one shard's COPY TO STDOUT, without its header and binary trailer
/// (the client gets one of each for the whole table); returns its row count.
async fn relay_shard(conn: &mut PgConnection, plan: &CopyPlan, client: &mut ClientConn, forward: bool) -> PgResult<u64> {
    let mut first = true;
    let mut rows = 0;
    let mut error = None;
    loop {
        let msg = conn.recv().await?;
        match msg.tag() {
            b'd' if forward && error.is_none() => {
                let data = if std::mem::take(&mut first) { without_header(plan, msg.body()) } else { Some(msg.body()) };
                match data {
                    Some(data) if plan.format.is_binary() && data == BINARY_TRAILER => {}
                    Some(data) if data.len() == msg.body().len() => client.out().extend_from_slice(msg.frame()),
                    Some(data) if !data.is_empty() => frontend::copy_data(client.out(), data),
                    _ => {}
                }
                if let Err(e) = client.flush_if_large().await {
                    error = Some(e);
                }
            }
            b'C' => rows = backend::rows_in_tag(backend::decode_command_complete(&msg)?).unwrap_or(0),
            b'E' => error = error.or(Some(conn.server_error(&msg))),
            b'N' => client.out().extend_from_slice(msg.frame()),
            b'Z' => break,
            _ => {}
        }
    }
    match error {
        Some(e) => Err(e),
        None => Ok(rows),
    }
}

/// A shard's first CopyData without the header the client already has: the
/// whole header line, or the binary file header in front of the first tuple.
fn without_header<'m>(plan: &CopyPlan, first: &'m [u8]) -> Option<&'m [u8]> {
    if plan.format.is_binary() {
        let extension = first.get(15..19).map(|b| i32::from_be_bytes([b[0], b[1], b[2], b[3]]).max(0) as usize)?;
        return first.get(19 + extension..);
    }
    if plan.format.header {
        return None;
    }
    Some(first)
}
