//! Group commit for two-phase commit's decisions. Every session that prepared
//! on several workers needs its commit record durable in `pg_dist_transaction`
//! before it may send COMMIT PREPARED. Instead of each session committing its
//! own one-row INSERT (a wake-up, a parse and a WAL flush of the coordinator
//! database per transaction), one writer per coordinator process takes the
//! records of every session waiting at that moment and commits them together
//! in one INSERT. Under load the batches grow on their own: whoever arrives
//! while a batch is being written goes into the next one.

use crate::connection::{quote_literal, Login, PgConnection, ServerAddr};
use crate::error::{PgError, PgResult};
use tokio::sync::{mpsc, oneshot};

/// Records in one INSERT at most.
const MAX_BATCH_RECORDS: usize = 512;

/// What became of a session's commit records.
#[derive(Clone, Debug)]
pub enum RecordOutcome {
    /// Committed in the coordinator database: the transaction is decided.
    Written,
    /// Certainly not committed: the prepared transactions must be rolled back.
    NotWritten(PgError),
    /// The connection broke while the records were on their way: recovery
    /// will find them or not, and settle the transaction either way.
    Unknown(PgError),
}

impl RecordOutcome {
    /// The outcome of writing the records on `conn`: an error that broke the
    /// connection leaves it unknown whether the commit went through.
    pub fn of(written: PgResult<()>, conn: &PgConnection) -> RecordOutcome {
        match written {
            Ok(()) => RecordOutcome::Written,
            Err(e) if conn.is_broken() => RecordOutcome::Unknown(e),
            Err(e) => RecordOutcome::NotWritten(e),
        }
    }
}

struct Request {
    /// (node group, prepared transaction name) for each prepared worker.
    records: Vec<(i32, String)>,
    done: oneshot::Sender<RecordOutcome>,
}

/// A handle on the process's commit-record writer; cheap to clone.
#[derive(Clone, Debug)]
pub struct CommitLog {
    requests: mpsc::UnboundedSender<Request>,
}

impl CommitLog {
    /// Starts the writer, which connects to the coordinator database when the
    /// first records arrive (and again after a lost connection).
    pub fn start(addr: ServerAddr, login: Login) -> CommitLog {
        let (requests, pending) = mpsc::unbounded_channel();
        tokio::spawn(write_batches(addr, login, pending));
        CommitLog { requests }
    }

    /// Makes `records` durable, together with those of other sessions
    /// committing at the same time.
    pub async fn write(&self, records: Vec<(i32, String)>) -> RecordOutcome {
        let (done, outcome) = oneshot::channel();
        let stopped = || RecordOutcome::NotWritten(PgError::internal("the commit record writer stopped"));
        if self.requests.send(Request { records, done }).is_err() {
            return stopped();
        }
        outcome.await.unwrap_or_else(|_| stopped())
    }
}

async fn write_batches(addr: ServerAddr, login: Login, mut pending: mpsc::UnboundedReceiver<Request>) {
    let mut conn: Option<PgConnection> = None;
    while let Some(first) = pending.recv().await {
        let mut batch = vec![first];
        let mut records = batch[0].records.len();
        while records < MAX_BATCH_RECORDS {
            let Ok(next) = pending.try_recv() else { break };
            records += next.records.len();
            batch.push(next);
        }
        let outcome = write_batch(&mut conn, &addr, &login, &batch).await;
        for request in batch {
            request.done.send(outcome.clone()).ok();
        }
    }
}

async fn write_batch(conn: &mut Option<PgConnection>, addr: &ServerAddr, login: &Login, batch: &[Request]) -> RecordOutcome {
    // A connection the server closed while it sat idle is replaced before use,
    // so that a restart of the coordinator database between batches does not
    // leave the next one in doubt.
    if conn.as_mut().map_or(true, |c| c.is_broken() || c.is_dead_while_idle()) {
        match PgConnection::connect(addr, login).await {
            Ok(fresh) => *conn = Some(fresh),
            Err(e) => return RecordOutcome::NotWritten(e),
        }
    }
    let writer = conn.as_mut().expect("connected above");
    let written = writer.execute(&insert_records(batch.iter().flat_map(|r| &r.records))).await.map(|_| ());
    RecordOutcome::of(written, writer)
}

/// The statement recording commit decisions in `pg_dist_transaction`. It
/// goes through a function because a client's own transaction writes them
/// when the coordinator database took part, as whatever role the client is.
pub fn insert_records<'a>(records: impl IntoIterator<Item = &'a (i32, String)>) -> String {
    let (groups, gids): (Vec<String>, Vec<String>) = records.into_iter().map(|(group, gid)| (group.to_string(), quote_literal(gid))).unzip();
    format!("SELECT tessera.record_commits(ARRAY[{}]::int[], ARRAY[{}]::text[])", groups.join(", "), gids.join(", "))
}
