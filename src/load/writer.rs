//! The loader's output side: one connection per worker (per shard placement
//! when compressed), each in a transaction that takes its shards' rows batch
//! by batch with COPY, and the commit that makes all of them visible at once.

use crate::config::{Login, ServerAddr};
use crate::connection::{quote_literal, PgConnection};
use crate::copy::MAX_IN_FLIGHT;
use crate::error::PgError;
use crate::protocol::{backend, frontend};
use crate::transaction::decided::{self, Decision};
use bytes::{Bytes, BytesMut};
use std::collections::VecDeque;
use std::io::Write;
use std::path::Path;
use std::sync::{Arc, Mutex};
use tokio::sync::mpsc::Receiver;

#[derive(Clone, Debug)]
pub struct Placement {
    /// The shard table, schema-qualified and quoted.
    pub shard_table: String,
    pub addr: ServerAddr,
    pub group_id: i32,
}

/// Rows of one shard from one input, as read (line ends included).
#[derive(Default)]
pub struct Batch {
    data: BytesMut,
    /// The input the rows come from.
    source: String,
    /// Each row's input line and end offset in `data`.
    rows: Vec<(u64, usize)>,
}

impl Batch {
    pub fn push(&mut self, row: &[u8], source: &str, line: u64) {
        if self.source.is_empty() {
            self.source = source.to_string();
        }
        self.data.extend_from_slice(row);
        self.rows.push((line, self.data.len()));
    }

    pub fn rows(&self) -> usize {
        self.rows.len()
    }

    pub fn bytes(&self) -> usize {
        self.data.len()
    }

    fn row(&self, i: usize) -> &[u8] {
        let start = if i == 0 { 0 } else { self.rows[i - 1].1 };
        &self.data[start..self.rows[i].1]
    }

    /// The input line of the batch's `n`th line (1-based), as a COPY error
    /// on a worker counts it.
    fn input_line(&self, n: u64) -> Option<u64> {
        self.rows.get(usize::try_from(n).ok()?.checked_sub(1)?).map(|(line, _)| *line)
    }
}

/// The reject file: one line per bad row — input, line, reason, the row.
#[derive(Clone)]
pub struct Rejects(Arc<Mutex<std::io::BufWriter<std::fs::File>>>);

impl Rejects {
    pub fn create(path: &Path) -> anyhow::Result<Rejects> {
        let file = std::fs::File::create(path).map_err(|e| anyhow::anyhow!("cannot create the reject file {}: {e}", path.display()))?;
        Ok(Rejects(Arc::new(Mutex::new(std::io::BufWriter::new(file)))))
    }

    pub fn write(&self, source: &str, line: u64, reason: &str, row: &[u8]) -> std::io::Result<()> {
        let row = row.strip_suffix(b"\n").unwrap_or(row);
        let row = row.strip_suffix(b"\r").unwrap_or(row);
        let mut out = self.0.lock().unwrap();
        write!(out, "{source}:{line}\t{}\t", reason.replace(['\t', '\n'], " "))?;
        out.write_all(row)?;
        out.write_all(b"\n")?;
        out.flush()
    }
}

/// A placement's connection after its rows went in, before the commit.
pub struct Written {
    placement: Placement,
    conn: PgConnection,
    rows: u64,
    pub rejected: u64,
    /// Row data sent toward the worker (compressed, when it was).
    pub bytes_sent: u64,
}

/// A batch on its way to one shard table.
pub struct Shipment {
    pub shard_table: Arc<str>,
    pub batch: Arc<Batch>,
}

/// How rows travel to the worker.
pub enum Route {
    /// `COPY <shard> FROM STDIN WITH (<options>)` on the connection, for the
    /// batches of every shard on that node.
    Copy { copy_options: String },
    /// zstd-compressed over a socket of their own to a `tessera receive`
    /// that the worker starts with COPY … FROM PROGRAM and that decompresses
    /// next to it. `socket` yields that connection once it arrives.
    Compressed { copy_sql: String, socket: tokio::sync::oneshot::Receiver<tokio::net::TcpStream> },
}

/// Takes the batches of one node (or, compressed, of one placement): each
/// batch is one COPY inside the connection's transaction. With a reject file,
/// a failing batch is retried row by row (each under a savepoint) and the
/// failing rows are set aside.
pub async fn write_placement(
    placement: Placement,
    login: Login,
    route: Route,
    mut batches: Receiver<Shipment>,
    rejects: Option<Rejects>,
) -> anyhow::Result<Written> {
    let node = format!("{}:{}", placement.addr.host, placement.addr.port);
    let fail = |e: PgError| anyhow::anyhow!("{} on {node}: {e}", placement.shard_table);
    let mut conn = PgConnection::connect(&placement.addr, &login).await.map_err(fail)?;
    conn.execute("BEGIN").await.map_err(fail)?;
    let copy_options = match route {
        Route::Copy { copy_options } => copy_options,
        Route::Compressed { copy_sql, socket } => {
            let (rows, bytes_sent) = write_compressed(&mut conn, &copy_sql, socket, &mut batches)
                .await
                .map_err(|e| anyhow::anyhow!("{} on {node}: {e}", placement.shard_table))?;
            return Ok(Written { placement, conn, rows, rejected: 0, bytes_sent });
        }
    };
    let (mut rows, mut rejected, mut bytes_sent) = (0, 0, 0);
    // Without a reject file COPY statements are queued back to back, so the
    // worker never waits for the next one.
    let mut in_flight = VecDeque::new();
    while let Some(Shipment { shard_table, batch }) = batches.recv().await {
        let copy_sql = format!("COPY {shard_table} FROM STDIN WITH ({copy_options})");
        bytes_sent += batch.data.len() as u64;
        let Some(rejects) = &rejects else {
            frontend::copy_from_stdin(conn.out(), &copy_sql, &[&batch.data]);
            conn.flush().await.map_err(fail)?;
            in_flight.push_back(batch);
            rows += settle(&mut conn, &mut in_flight, MAX_IN_FLIGHT, &node).await?;
            continue;
        };
        conn.execute("SAVEPOINT tessera_batch").await.map_err(fail)?;
        match conn.copy_in(&copy_sql, [Bytes::copy_from_slice(&batch.data)]).await {
            Ok(n) => {
                rows += n;
                conn.execute("RELEASE SAVEPOINT tessera_batch").await.map_err(fail)?;
            }
            Err(_) => {
                conn.execute("ROLLBACK TO SAVEPOINT tessera_batch").await.map_err(fail)?;
                for (i, (line, _)) in batch.rows.iter().enumerate() {
                    conn.execute("SAVEPOINT tessera_row").await.map_err(fail)?;
                    match conn.copy_in(&copy_sql, [Bytes::copy_from_slice(batch.row(i))]).await {
                        Ok(n) => {
                            rows += n;
                            conn.execute("RELEASE SAVEPOINT tessera_row").await.map_err(fail)?;
                        }
                        Err(e) => {
                            conn.execute("ROLLBACK TO SAVEPOINT tessera_row").await.map_err(fail)?;
                            rejects.write(&batch.source, *line, e.message(), batch.row(i))?;
                            rejected += 1;
                        }
                    }
                }
            }
        }
    }
    rows += settle(&mut conn, &mut in_flight, 0, &node).await?;
    Ok(Written { placement, conn, rows, rejected, bytes_sent })
}

/// Reads the answers to queued COPY statements until no more than
/// `outstanding` remain; returns the rows they copied. The first error ends
/// the load (the transaction is lost anyway), naming its input line.
async fn settle(conn: &mut PgConnection, in_flight: &mut VecDeque<Arc<Batch>>, outstanding: usize, node: &str) -> anyhow::Result<u64> {
    let mut rows = 0;
    while in_flight.len() > outstanding {
        let msg = conn.recv().await.map_err(|e| anyhow::anyhow!("{e} (on {node})"))?;
        match msg.tag() {
            b'C' => rows += backend::rows_in_tag(backend::decode_command_complete(&msg)?).unwrap_or(0),
            b'E' => return Err(locate(conn.server_error(&msg), &in_flight[0], node)),
            b'Z' => {
                in_flight.pop_front();
            }
            _ => {}
        }
    }
    Ok(rows)
}

/// Runs the worker's COPY … FROM PROGRAM while feeding its receiver the
/// batches as zstd frames; returns the rows copied and the bytes sent.
async fn write_compressed(
    conn: &mut PgConnection,
    copy_sql: &str,
    socket: tokio::sync::oneshot::Receiver<tokio::net::TcpStream>,
    batches: &mut Receiver<Shipment>,
) -> anyhow::Result<(u64, u64)> {
    use tokio::io::AsyncWriteExt;
    let feed = async {
        let mut socket = tokio::time::timeout(std::time::Duration::from_secs(30), socket)
            .await
            .map_err(|_| anyhow::anyhow!("the worker's tessera receive did not connect back within 30 s"))?
            .map_err(|_| anyhow::anyhow!("the load stopped before the worker's receiver connected"))?;
        let mut sent = 0u64;
        while let Some(Shipment { batch, .. }) = batches.recv().await {
            let frame = zstd::bulk::compress(&batch.data, 3)?;
            sent += frame.len() as u64;
            socket.write_all(&frame).await?;
        }
        socket.shutdown().await?;
        anyhow::Ok(sent)
    };
    let (copied, sent) = tokio::join!(conn.execute(copy_sql), feed);
    let sent = sent?;
    let tag = copied.map_err(|e| anyhow::anyhow!("{e}"))?;
    Ok((crate::protocol::backend::rows_in_tag(&tag).unwrap_or(0), sent))
}

/// A worker's COPY error, naming the input line it is about.
fn locate(e: PgError, batch: &Batch, node: &str) -> anyhow::Error {
    let line = e
        .context()
        .and_then(|c| c.split("line ").nth(1))
        .and_then(|rest| rest.split(|ch: char| !ch.is_ascii_digit()).next())
        .and_then(|n| n.parse().ok());
    match line.and_then(|n| batch.input_line(n)) {
        Some(line) => anyhow::anyhow!("{}:{line}: {} (on {node})", batch.source, e.message()),
        None => anyhow::anyhow!("{} (on {node}, rows from {})", e.message(), batch.source),
    }
}

/// Makes every placement's rows visible at once. With several placements,
/// last-agent style (`transaction::decided`): every placement but the
/// first prepares, under a name that carries the first one's transaction,
/// which then commits one-phase together with its commit record. That
/// commit decides; COMMIT PREPARED follows on the others, and after a crash
/// the coordinator's prepared-transaction recovery finishes the job.
/// Returns the rows written (over all placements).
pub async fn commit(written: Vec<Written>) -> anyhow::Result<u64> {
    let rows = written.iter().map(|w| w.rows).sum();
    let mut written = written.into_iter();
    let Some(mut decider) = written.next() else { return Ok(rows) };
    let others: Vec<Written> = written.collect();
    if others.is_empty() {
        decider.conn.execute("COMMIT").await.map_err(|e| anyhow::anyhow!("commit on {}: {e}", decider.placement.addr))?;
        decider.conn.terminate().await;
        return Ok(rows);
    }
    let deciding = match decided::identify(&mut decider.conn).await {
        Ok(deciding) => deciding,
        Err(e) => {
            let error = anyhow::anyhow!("reading the deciding transaction on {}: {e}", decider.placement.addr);
            roll_back(std::iter::once(decider).chain(others).collect()).await;
            return Err(error);
        }
    };
    let group = decider.placement.group_id;
    let prepares = futures::future::join_all(others.into_iter().enumerate().map(|(i, mut w)| {
        let gid = decided::gid(group, &deciding, &format!("load{i}"));
        async move {
            let result = w.conn.execute(&format!("PREPARE TRANSACTION {}", quote_literal(&gid))).await;
            (w, gid, result)
        }
    }))
    .await;
    let mut prepared = Vec::new();
    let mut failure = None;
    for (w, gid, result) in prepares {
        match result {
            Ok(_) => prepared.push((w, gid)),
            Err(e) => {
                failure.get_or_insert(anyhow::anyhow!("prepare on {}: {e}", w.placement.addr));
            }
        }
    }
    if failure.is_none() {
        match decided::commit(&mut decider.conn).await {
            Ok(()) => {}
            // The commit may have happened: recovery reads its record.
            Err(Decision::InDoubt(e)) => {
                return Err(anyhow::anyhow!(
                    "commit on {}: {e}; the coordinator's prepared-transaction recovery settles the load's outcome",
                    decider.placement.addr
                ))
            }
            Err(Decision::RolledBack(e)) => failure = Some(anyhow::anyhow!("commit on {}: {e}", decider.placement.addr)),
        }
    } else {
        decider.conn.execute("ROLLBACK").await.ok();
    }
    decider.conn.terminate().await;
    let command = if failure.is_none() { "COMMIT PREPARED" } else { "ROLLBACK PREPARED" };
    futures::future::join_all(prepared.into_iter().map(|(mut w, gid)| async move {
        // A node that cannot answer now is settled by the coordinator's recovery.
        w.conn.execute(&format!("{command} {}", quote_literal(&gid))).await.ok();
        w.conn.terminate().await;
    }))
    .await;
    match failure {
        Some(e) => Err(e),
        None => Ok(rows),
    }
}

/// Rolls every placement's transaction back (a failed load leaves nothing).
pub async fn roll_back(written: Vec<Written>) {
    futures::future::join_all(written.into_iter().map(|mut w| async move {
        w.conn.execute("ROLLBACK").await.ok();
        w.conn.terminate().await;
    }))
    .await;
}

/// The loader's end of compressed transfers: a listening socket that the
/// workers' `tessera receive` processes connect back to, each naming the
/// placement it serves with a one-time token.
pub struct Receivers {
    listener: tokio::net::TcpListener,
    waiting: std::collections::HashMap<String, tokio::sync::oneshot::Sender<tokio::net::TcpStream>>,
}

impl Receivers {
    pub async fn listen() -> anyhow::Result<Receivers> {
        Ok(Receivers { listener: tokio::net::TcpListener::bind("0.0.0.0:0").await?, waiting: Default::default() })
    }

    /// The route for one placement: its COPY … FROM PROGRAM statement.
    pub fn route(&mut self, placement: &Placement, copy_options: &str) -> anyhow::Result<Route> {
        // The address this host has toward the worker is the one the worker
        // can reach us on.
        let here = std::net::TcpStream::connect((placement.addr.host.as_str(), placement.addr.port))?.local_addr()?.ip();
        let token = format!("{:032x}", rand::random::<u128>());
        let exe = std::env::current_exe()?.display().to_string().replace('\'', "'\\''");
        let program = format!("'{exe}' receive --connect {here}:{} --token {token}", self.listener.local_addr()?.port());
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.waiting.insert(token, tx);
        let copy_sql = format!("COPY {} FROM PROGRAM {} WITH ({copy_options})", placement.shard_table, quote_literal(&program));
        Ok(Route::Compressed { copy_sql, socket: rx })
    }

    /// Hands each arriving receiver connection to the writer waiting for it.
    pub async fn accept(mut self) {
        use tokio::io::AsyncBufReadExt;
        while !self.waiting.is_empty() {
            let Ok((socket, _)) = self.listener.accept().await else { return };
            let mut reader = tokio::io::BufReader::new(socket);
            let mut token = String::new();
            if reader.read_line(&mut token).await.is_err() {
                continue;
            }
            if let Some(writer) = self.waiting.remove(token.trim()) {
                writer.send(reader.into_inner()).ok();
            }
        }
    }
}

/// `tessera receive`: started by a worker's COPY … FROM PROGRAM; connects back
/// to the loader and writes the decompressed rows to standard output.
pub fn receive(connect: &str, token: &str) -> anyhow::Result<()> {
    let mut stream = std::net::TcpStream::connect(connect)?;
    writeln!(stream, "{token}")?;
    let stdout = std::io::stdout();
    zstd::stream::copy_decode(stream, stdout.lock())?;
    Ok(())
}
