//! What bounds one statement of a session while its parts run on several
//! nodes and in the coordinator: its deadline (`statement_timeout`), the
//! client's cancel request, the first failure of one of its parts, and the
//! memory the coordinator process holds for it. Any of them *stops* the
//! statement: the session's watchdog (`StatementLimits::enforce`) sends a
//! cancel request to every node backend the session holds, which ends the
//! statement's work there at once (the shard statements a connection runs
//! for it form one batch, which one cancellation ends whole), and the
//! coordinator's own loops see the stop at their next check. The statement
//! then fails with the stop's error, and its connections are in step for
//! the next one.
//!
//! Only statements whose work spans several nodes or the coordinator are
//! watched (`arm`); one routed to a single node is bounded by that node,
//! which enforces the same settings, and a cancel request reaches it
//! directly.

use super::CancelTargets;
use crate::connection::send_cancel;
use crate::error::{sqlstate, PgError, PgResult};
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;

/// How often the watchdog repeats its cancel requests while a stopped
/// statement has not ended: a request that reaches a node between two
/// shard statements of a pipelined batch finds nothing to cancel.
const CANCEL_REPEAT: Duration = Duration::from_millis(50);

/// A statement that held this much gives its memory back to the operating
/// system when it ends.
const RETURN_TO_SYSTEM_BYTES: usize = 32 << 20;

/// Statement text quoted in an error at most (characters).
const QUOTED_STATEMENT: usize = 200;

/// A session's handle on the limits of its running statement; clones share it.
#[derive(Clone)]
pub struct StatementLimits(Arc<Shared>);

struct Shared {
    state: Mutex<State>,
    /// Set with `State::stop`, read without the lock by the coordinator's loops.
    stopped: AtomicBool,
    /// `State::phase` is `Running`, for the hot paths.
    running: AtomicBool,
    /// The most bytes the statement may hold (`usize::MAX`: no limit of its own).
    memory_limit: AtomicUsize,
    /// Wakes the watchdog when something stops the statement.
    wake: tokio::sync::Notify,
    /// Bytes the coordinator holds for the statement.
    held: AtomicUsize,
    process: Arc<ProcessMemory>,
    targets: CancelTargets,
}

#[derive(Default)]
struct State {
    phase: Phase,
    stop: Option<Stop>,
    deadline: Option<Instant>,
    /// The statement's text, for the memory error.
    statement: String,
}

#[derive(Clone, Copy, Default, PartialEq, Eq)]
enum Phase {
    /// No watched statement runs.
    #[default]
    Idle,
    Running,
    /// Committing or rolling back its implicit block: as in PostgreSQL,
    /// which disables the statement timeout before the commit, nothing
    /// stops it any more.
    Ending,
}

/// Why a statement stopped.
#[derive(Clone)]
enum Stop {
    Timeout,
    Cancel,
    /// A part failed with this error: the other parts have nothing left to do.
    Failed(PgError),
    Memory(PgError),
}

/// What a cancel request did to the session's statement.
#[derive(PartialEq, Eq, Debug)]
pub enum CancelOutcome {
    /// The watched statement stops; its watchdog cancels every part.
    Stopping,
    /// No watched statement runs: the request goes to the session's node
    /// backends as it is.
    NotWatched,
    /// The statement is ending its block and is no longer cancelled.
    TooLate,
}

/// The memory all statements of the process hold together, and its limit.
pub struct ProcessMemory {
    held: AtomicUsize,
    limit: usize,
}

impl ProcessMemory {
    pub fn new(limit: usize) -> Arc<Self> {
        Arc::new(ProcessMemory { held: AtomicUsize::new(0), limit })
    }

    /// Bytes held by the statements running now.
    pub fn held(&self) -> usize {
        self.held.load(Ordering::Relaxed)
    }
}

impl StatementLimits {
    pub fn new(targets: CancelTargets, process: Arc<ProcessMemory>) -> Self {
        StatementLimits(Arc::new(Shared {
            state: Mutex::default(),
            stopped: AtomicBool::new(false),
            running: AtomicBool::new(false),
            memory_limit: AtomicUsize::new(usize::MAX),
            wake: tokio::sync::Notify::new(),
            held: AtomicUsize::new(0),
            process,
            targets,
        }))
    }

    /// Starts watching a statement (`statement`, its text) that may run for
    /// `timeout` and hold `memory_limit` bytes in the coordinator.
    pub fn arm(&self, statement: &str, timeout: Option<Duration>, memory_limit: Option<usize>) {
        let mut state = self.0.state.lock().unwrap();
        let quoted: String = statement.chars().take(QUOTED_STATEMENT).collect();
        let statement = if quoted.len() < statement.len() { format!("{quoted}…") } else { quoted };
        *state = State { phase: Phase::Running, stop: None, deadline: timeout.map(|t| Instant::now() + t), statement };
        self.0.memory_limit.store(memory_limit.unwrap_or(usize::MAX), Ordering::Relaxed);
        self.0.stopped.store(false, Ordering::Release);
        self.0.running.store(true, Ordering::Release);
    }

    /// The statement has ended: what it held is given back, to the
    /// operating system too when it was much (the allocator would keep it).
    pub fn disarm(&self) {
        let mut state = self.0.state.lock().unwrap();
        state.phase = Phase::Idle;
        state.stop = None;
        self.0.running.store(false, Ordering::Release);
        self.0.stopped.store(false, Ordering::Release);
        let held = self.0.held.swap(0, Ordering::Relaxed);
        self.0.process.held.fetch_sub(held, Ordering::Relaxed);
        drop(state);
        if held >= RETURN_TO_SYSTEM_BYTES {
            #[cfg(all(target_os = "linux", target_env = "gnu"))]
            // SAFETY: malloc_trim only releases free heap pages; it has no preconditions.
            unsafe {
                libc::malloc_trim(0);
            }
        }
    }

    /// The most bytes the watched statement may hold (`usize::MAX`: no limit of its own).
    pub fn memory_limit(&self) -> usize {
        self.0.memory_limit.load(Ordering::Relaxed)
    }

    /// Whether a watched statement runs.
    pub fn is_armed(&self) -> bool {
        self.0.running.load(Ordering::Acquire)
    }

    /// Fails with the stop's error once the statement must stop (its
    /// deadline included): for the coordinator's own work, between steps
    /// and every so many rows.
    pub fn check(&self) -> PgResult<()> {
        if self.0.stopped.load(Ordering::Acquire) {
            return Err(self.error().unwrap_or_else(|| cancelled("user request")));
        }
        if !self.is_armed() {
            return Ok(());
        }
        let past_deadline = {
            let state = self.0.state.lock().unwrap();
            state.phase == Phase::Running && state.deadline.is_some_and(|d| Instant::now() >= d)
        };
        if past_deadline && self.stop(Stop::Timeout) {
            return Err(cancelled("statement timeout"));
        }
        Ok(())
    }

    /// Cheap form of `check` for tight loops: the flag only.
    pub fn is_stopped(&self) -> bool {
        self.0.stopped.load(Ordering::Acquire)
    }

    /// The client asked to cancel the session's statement.
    pub fn cancel(&self) -> CancelOutcome {
        let phase = self.0.state.lock().unwrap().phase;
        match phase {
            Phase::Idle => CancelOutcome::NotWatched,
            Phase::Ending => CancelOutcome::TooLate,
            Phase::Running => {
                self.stop(Stop::Cancel);
                CancelOutcome::Stopping
            }
        }
    }

    /// A part of the statement failed with `e`: the others stop, and the
    /// statement reports `e` (the first such failure), not the cancellations
    /// that follow it.
    pub fn part_failed(&self, e: &PgError) {
        self.stop(Stop::Failed(e.clone()));
    }

    /// The statement is about to commit or roll back the block it opened:
    /// from here on it is not stopped, unless it already was (its error
    /// then).
    pub fn ending(&self) -> PgResult<()> {
        let mut state = self.0.state.lock().unwrap();
        if state.phase != Phase::Running {
            return Ok(());
        }
        if let Some(stop) = &state.stop {
            return Err(stop_error(stop));
        }
        state.phase = Phase::Ending;
        self.0.running.store(false, Ordering::Release);
        Ok(())
    }

    /// Counts `bytes` more that the coordinator holds for the statement;
    /// past the statement's limit or the process's, the statement stops
    /// with 53200.
    pub fn charge(&self, bytes: usize) -> PgResult<()> {
        if !self.is_armed() {
            return Ok(());
        }
        let held = self.0.held.fetch_add(bytes, Ordering::Relaxed) + bytes;
        let total = self.0.process.held.fetch_add(bytes, Ordering::Relaxed) + bytes;
        let limit = self.0.memory_limit.load(Ordering::Relaxed);
        if held <= limit && total <= self.0.process.limit {
            return Ok(());
        }
        let statement = self.0.state.lock().unwrap().statement.clone();
        let e = if held > limit {
            PgError::new(sqlstate::OUT_OF_MEMORY, format!("statement needs more than {} of coordinator memory: {statement}", megabytes(limit)))
                .with_detail("The coordinator holds the rows it combines, broadcasts or passes on in memory while the statement runs.")
                .with_hint("Narrow the statement, or raise tessera.max_statement_memory (SET for the session, [statements] max_memory_mb for every session).")
        } else {
            PgError::new(
                sqlstate::OUT_OF_MEMORY,
                format!(
                    "the coordinator holds more than {} for running statements; this one was stopped: {statement}",
                    megabytes(self.0.process.limit)
                ),
            )
            .with_hint("Retry when fewer large statements run at once, or raise [statements] max_total_memory_mb.")
        };
        self.stop(Stop::Memory(e.clone()));
        Err(self.error().unwrap_or(e))
    }

    /// Gives back `bytes` of what `charge` counted, once the statement no
    /// longer holds them.
    pub fn release(&self, bytes: usize) {
        if !self.is_armed() {
            return;
        }
        let bytes = bytes.min(self.0.held.load(Ordering::Relaxed));
        self.0.held.fetch_sub(bytes, Ordering::Relaxed);
        self.0.process.held.fetch_sub(bytes, Ordering::Relaxed);
    }

    /// Runs `work` under its limits (see `arm`): when they stop the
    /// statement, every node backend the session holds is sent a cancel
    /// request (again every `CANCEL_REPEAT` while the work has not ended),
    /// and `work` ends with the errors they answer with. Returns its output.
    pub async fn enforce<T>(&self, work: impl Future<Output = T>) -> T {
        tokio::pin!(work);
        loop {
            tokio::select! {
                biased;
                out = &mut work => return out,
                _ = self.until_stopped() => {}
            }
            if self.0.state.lock().unwrap().phase != Phase::Running {
                // Ending its block: it finishes undisturbed.
                return work.await;
            }
            let targets = self.0.targets.lock().unwrap().clone();
            futures::future::join_all(targets.iter().map(|(addr, key)| send_cancel(addr, *key))).await;
            tokio::select! {
                biased;
                out = &mut work => return out,
                _ = tokio::time::sleep(CANCEL_REPEAT) => {}
            }
        }
    }

    /// Resolves once the statement must stop; its deadline passing stops it.
    async fn until_stopped(&self) {
        loop {
            let woken = self.0.wake.notified();
            tokio::pin!(woken);
            woken.as_mut().enable();
            if self.is_stopped() {
                return;
            }
            let deadline = self.0.state.lock().unwrap().deadline;
            match deadline {
                Some(deadline) => {
                    tokio::select! {
                        _ = woken => {}
                        _ = tokio::time::sleep_until(deadline) => {
                            self.stop(Stop::Timeout);
                        }
                    }
                }
                None => woken.await,
            }
        }
    }

    /// The error the client sees for a statement that failed with `e`: a
    /// statement that was stopped fails with the stop's error, whatever its
    /// parts answered.
    pub fn reported(&self, e: PgError) -> PgError {
        self.error().unwrap_or(e)
    }

    fn error(&self) -> Option<PgError> {
        self.0.state.lock().unwrap().stop.as_ref().map(stop_error)
    }

    /// Records the first reason to stop; true when it is the first. A
    /// statement that is not running, or is ending, is not stopped.
    fn stop(&self, stop: Stop) -> bool {
        let mut state = self.0.state.lock().unwrap();
        if state.phase != Phase::Running || state.stop.is_some() {
            return false;
        }
        state.stop = Some(stop);
        self.0.stopped.store(true, Ordering::Release);
        self.0.wake.notify_waiters();
        true
    }

    /// Waits for `wait` (a pool's slot, a connection) unless the statement
    /// stops first.
    pub async fn unless_stopped<T>(&self, wait: impl Future<Output = PgResult<T>>) -> PgResult<T> {
        if !self.is_armed() {
            return wait.await;
        }
        tokio::select! {
            biased;
            out = wait => out,
            _ = self.until_stopped() => Err(self.error().unwrap_or_else(|| cancelled("user request"))),
        }
    }
}

fn stop_error(stop: &Stop) -> PgError {
    match stop {
        Stop::Timeout => cancelled("statement timeout"),
        Stop::Cancel => cancelled("user request"),
        Stop::Failed(e) | Stop::Memory(e) => e.clone(),
    }
}

/// PostgreSQL's error for a statement cancelled `due_to` a reason.
fn cancelled(due_to: &str) -> PgError {
    PgError::new(sqlstate::QUERY_CANCELED, format!("canceling statement due to {due_to}"))
}

fn megabytes(bytes: usize) -> String {
    format!("{} MB", bytes.div_ceil(1 << 20))
}

/// `tessera.max_statement_memory` as the session has it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemorySetting {
    /// Not set: the configuration's `[statements] max_memory_mb` applies.
    Unset,
    /// At most this many bytes; None for -1, no limit of the statement's own.
    Limit(Option<usize>),
    /// Set to what is not a memory size.
    Invalid,
}

impl MemorySetting {
    /// From `current_setting(…, true)`: NULL while never set, empty once reset.
    pub fn from_value(value: Option<&str>) -> Self {
        match value.map(str::trim) {
            None | Some("") => MemorySetting::Unset,
            Some(value) => parse_memory(value).map_or(MemorySetting::Invalid, MemorySetting::Limit),
        }
    }

    /// The limit for a statement, `default` when not set.
    pub fn limit(self, default: Option<usize>) -> PgResult<Option<usize>> {
        match self {
            MemorySetting::Unset => Ok(default),
            MemorySetting::Limit(limit) => Ok(limit),
            MemorySetting::Invalid => {
                Err(PgError::new(sqlstate::INVALID_PARAMETER_VALUE, "invalid value for parameter \"tessera.max_statement_memory\"")
                    .with_hint("Give a size such as '256MB' or '1GB' (a bare number counts kB), or -1 for no limit of the statement's own."))
            }
        }
    }
}

/// A memory setting as PostgreSQL writes one (`256MB`, `1GB`, `512kB`,
/// `1024` in kB): bytes, or None for -1 (no limit). Err for what does not
/// parse.
pub fn parse_memory(value: &str) -> Result<Option<usize>, String> {
    let value = value.trim();
    if value == "-1" {
        return Ok(None);
    }
    let split = value.find(|c: char| !c.is_ascii_digit()).unwrap_or(value.len());
    let number: usize = value[..split].parse().map_err(|_| format!("invalid memory size \"{value}\""))?;
    let unit = match value[split..].trim() {
        "B" => 1,
        "" | "kB" => 1 << 10,
        "MB" => 1 << 20,
        "GB" => 1 << 30,
        "TB" => 1 << 40,
        other => return Err(format!("invalid unit \"{other}\" in memory size \"{value}\"; valid units are B, kB, MB, GB and TB")),
    };
    number.checked_mul(unit).map(Some).ok_or_else(|| format!("memory size \"{value}\" is out of range"))
}

impl crate::connection::client::MemoryCharge for StatementLimits {
    fn charge(&self, bytes: usize) -> PgResult<()> {
        StatementLimits::charge(self, bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(process_limit: usize) -> StatementLimits {
        StatementLimits::new(CancelTargets::default(), ProcessMemory::new(process_limit))
    }

    #[test]
    fn memory_sizes() {
        assert_eq!(parse_memory("256MB"), Ok(Some(256 << 20)));
        assert_eq!(parse_memory("1GB"), Ok(Some(1 << 30)));
        assert_eq!(parse_memory("64kB"), Ok(Some(64 << 10)));
        assert_eq!(parse_memory("100"), Ok(Some(100 << 10)));
        assert_eq!(parse_memory("-1"), Ok(None));
        assert!(parse_memory("lots").is_err());
        assert!(parse_memory("5 parsecs").is_err());
    }

    #[test]
    fn a_statement_over_its_memory_stops_and_gives_it_back() {
        let l = limits(1 << 30);
        l.arm("SELECT everything", None, Some(1000));
        assert!(l.charge(600).is_ok());
        let e = l.charge(600).unwrap_err();
        assert_eq!(e.code(), sqlstate::OUT_OF_MEMORY);
        assert!(e.message().contains("SELECT everything"), "{}", e.message());
        assert!(l.is_stopped());
        assert_eq!(l.reported(cancelled("user request")).code(), sqlstate::OUT_OF_MEMORY);
        l.disarm();
        assert_eq!(l.0.process.held(), 0);
        assert!(l.check().is_ok());
    }

    #[test]
    fn the_process_limit_holds_across_statements() {
        let process = ProcessMemory::new(1000);
        let (a, b) =
            (StatementLimits::new(CancelTargets::default(), process.clone()), StatementLimits::new(CancelTargets::default(), process.clone()));
        a.arm("a", None, None);
        b.arm("b", None, None);
        assert!(a.charge(700).is_ok());
        assert_eq!(b.charge(700).unwrap_err().code(), sqlstate::OUT_OF_MEMORY);
        a.disarm();
        b.disarm();
        assert_eq!(process.held(), 0);
    }

    #[test]
    fn the_first_failure_stands_and_ending_is_not_stopped() {
        let l = limits(1 << 30);
        l.arm("x", None, None);
        l.part_failed(&PgError::new("55P03", "could not obtain lock"));
        l.part_failed(&cancelled("user request"));
        assert_eq!(l.reported(cancelled("user request")).code(), "55P03");
        assert_eq!(l.ending().unwrap_err().code(), "55P03");
        l.arm("y", None, None);
        assert!(l.ending().is_ok());
        assert_eq!(l.cancel(), CancelOutcome::TooLate);
        assert!(l.check().is_ok());
        l.disarm();
        assert_eq!(l.cancel(), CancelOutcome::NotWatched);
    }

    #[tokio::test]
    async fn the_deadline_stops_work_that_waits() {
        let l = limits(1 << 30);
        l.arm("x", Some(Duration::from_millis(50)), None);
        let started = std::time::Instant::now();
        let result = l.enforce(async {
            while !l.is_stopped() {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            Err::<(), _>(cancelled("user request"))
        });
        let e = l.reported(result.await.unwrap_err());
        assert_eq!(e.message(), "canceling statement due to statement timeout");
        assert!(started.elapsed() < Duration::from_secs(2));
    }
}
