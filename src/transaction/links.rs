//! Worker links: the connections a worker's postgres_fdw opens to reach other
//! nodes' shards (user code running on a worker — a delegated call, a
//! trigger, a procedure — writing through the worker-side relations). They
//! do not go to the other node directly but through this relay in the
//! coordinator process, because postgres_fdw commits its remote transaction
//! on its own, before the worker's local commit: a crash in between would
//! leave one side committed.
//!
//! The relay passes a link's messages through unchanged until postgres_fdw
//! sends COMMIT TRANSACTION for a remote transaction that wrote. That one
//! it turns into PREPARE TRANSACTION, named after the worker transaction it
//! belongs to (the *deciding* transaction: the writing backend's top-level
//! transaction on the worker, which a trigger on every foreign partition
//! gives an xid and a commit record). The worker then commits one-phase, and
//! its commit is the decision, last-agent style (`decided`): the prepared
//! part is committed once the record is there, rolled back once the
//! deciding transaction ended without it. That settling happens before the client's
//! session sends ReadyForQuery (so the client reads its own writes), when
//! the link starts its next transaction, on an interval here, and in
//! prepared-transaction recovery for whatever a crash left.

use super::decided::{self, DecidingTransaction};
use super::inject_fault;
use crate::config::Fault;
use crate::config::{Login, ServerAddr};
use crate::connection::client::ClientConn;
use crate::connection::{quote_ident, quote_literal, PgConnection};
use crate::error::{sqlstate, PgError, PgResult};
use crate::metadata::CatalogHandle;
use crate::protocol::backend::{self, TxStatus};
use crate::protocol::frontend::{self, StartupPacket};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::net::TcpListener;

/// The application_name a worker's foreign server for `to` gives its links:
/// postgres_fdw replaces `%p` with the backend's pid, which tells the relay
/// whose transaction a link belongs to.
pub fn link_application_name(from: i32, to: i32) -> String {
    format!("tessera_link_{from}_{to}_%p")
}

/// Where a link comes from and goes to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct LinkEnds {
    /// Node group of the worker whose backend opened the link.
    from: i32,
    /// That backend's pid.
    pid: i32,
    /// Node group the link reaches.
    to: i32,
}

impl LinkEnds {
    fn parse(application_name: &str) -> Option<LinkEnds> {
        let mut parts = application_name.strip_prefix("tessera_link_")?.split('_');
        let ends = LinkEnds { from: parts.next()?.parse().ok()?, to: parts.next()?.parse().ok()?, pid: parts.next()?.parse().ok()? };
        parts.next().is_none().then_some(ends)
    }
}

/// The node group and backend pid that opened the link named
/// `application_name`, if it is a link's name.
pub fn link_origin(application_name: &str) -> Option<(i32, i32)> {
    LinkEnds::parse(application_name).map(|e| (e.from, e.pid))
}

/// A prepared part waiting for its deciding transaction's outcome.
#[derive(Clone, Debug)]
struct Prepared {
    /// Node group holding the prepared transaction.
    node: i32,
    gid: String,
    /// The deciding transaction on the worker (`LinkEnds::from`).
    decider: DecidingTransaction,
    since: Instant,
}

/// The relay's state, shared by its links and the client sessions.
pub struct LinkRelay {
    /// Where the workers' foreign servers point.
    pub addr: ServerAddr,
    catalog: Arc<CatalogHandle>,
    service: Login,
    /// Password for the roles the links log in as (the one the sessions use).
    password: Option<String>,
    fault: Option<(Fault, u32)>,
    /// Prepared parts by (deciding node group, backend pid).
    pending: Mutex<HashMap<(i32, i32), Vec<Prepared>>>,
    /// Entries in `pending`: sessions look there only when it is not zero.
    pending_count: AtomicUsize,
    /// Backend keys of the links' node connections → the node, for
    /// postgres_fdw's cancel requests.
    cancel_keys: Mutex<HashMap<(i32, i32), ServerAddr>>,
    /// Idle service connections by node group, for settling.
    idle: Mutex<HashMap<i32, Vec<PgConnection>>>,
    serial: AtomicU64,
    /// Worker backends (node group, pid) whose transaction has a link open:
    /// postgres_fdw refuses PREPARE TRANSACTION there, so such a backend
    /// must be the one a session's two-phase commit lets decide. Per backend,
    /// how many of its links are inside a transaction.
    linked: Mutex<HashMap<(i32, i32), usize>>,
    /// With the cluster's CA, links come over TLS and log in with their
    /// role's certificate; without it, they are taken from the nodes'
    /// addresses in the clear.
    tls: Option<tokio_rustls::TlsAcceptor>,
}

impl std::fmt::Debug for LinkRelay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LinkRelay").field("addr", &self.addr).field("pending", &self.pending_count).finish_non_exhaustive()
    }
}

/// Service connections kept idle per node.
const IDLE_SERVICE_CONNECTIONS: usize = 4;

/// Prepared parts older than this are settled by the relay's own pass, in
/// case no session or link did it.
const SETTLE_AFTER: Duration = Duration::from_millis(100);

impl LinkRelay {
    /// Binds `listen` and serves links from there on.
    pub async fn start(
        listen: &str,
        catalog: Arc<CatalogHandle>,
        service: Login,
        password: Option<String>,
        fault: Option<(Fault, u32)>,
    ) -> anyhow::Result<Arc<LinkRelay>> {
        let listener = TcpListener::bind(listen).await.map_err(|e| anyhow::anyhow!("could not listen for worker links on {listen}: {e}"))?;
        let bound = listener.local_addr()?;
        // Bound to every interface, the relay is reached by this host's name.
        let host = if bound.ip().is_unspecified() { host_name()? } else { bound.ip().to_string() };
        let tls = crate::connection::node_tls::node_credentials().map(|credentials| credentials.link_acceptor(&host)).transpose()?;
        let relay = Arc::new(LinkRelay {
            addr: ServerAddr { host, port: bound.port() },
            catalog,
            service,
            password,
            fault,
            pending: Mutex::new(HashMap::new()),
            pending_count: AtomicUsize::new(0),
            cancel_keys: Mutex::new(HashMap::new()),
            idle: Mutex::new(HashMap::new()),
            serial: AtomicU64::new(0),
            linked: Mutex::default(),
            tls,
        });
        tokio::spawn(relay.clone().accept(listener));
        tokio::spawn(relay.clone().settle_periodically());
        Ok(relay)
    }

    async fn accept(self: Arc<Self>, listener: TcpListener) {
        loop {
            let (stream, peer) = match listener.accept().await {
                Ok(accepted) => accepted,
                Err(e) => {
                    tracing::warn!("could not accept a worker link: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            let relay = self.clone();
            // A connection from this host to one of its own addresses.
            let from_this_host = stream.local_addr().is_ok_and(|local| local.ip() == peer.ip());
            tokio::spawn(async move {
                if let Err(e) = relay.serve_link(ClientConn::new(stream.into()), peer.ip(), from_this_host).await {
                    tracing::debug!("worker link from {peer} ended: {e}");
                }
            });
        }
    }

    /// Whether `peer` is one of the nodes (or this host): the relay logs in
    /// to nodes as any role, so it serves only those the nodes trust.
    async fn is_node(&self, peer: std::net::IpAddr, from_this_host: bool) -> bool {
        if peer.is_loopback() || from_this_host {
            return true;
        }
        let catalog = self.catalog.snapshot();
        for node in catalog.active_nodes() {
            if let Ok(mut addrs) = tokio::net::lookup_host((node.addr.host.as_str(), node.addr.port)).await {
                if addrs.any(|a| a.ip() == peer) {
                    return true;
                }
            }
        }
        false
    }

    async fn serve_link(&self, mut link: ClientConn, peer: std::net::IpAddr, from_this_host: bool) -> anyhow::Result<()> {
        let params = loop {
            let Some(packet) = link.recv_startup().await? else { return Ok(()) };
            match frontend::decode_startup(&packet)? {
                StartupPacket::SslRequest if self.tls.is_some() && link.is_clear_tcp() => {
                    link.write_now(b"S").await?;
                    let acceptor = self.tls.as_ref().expect("checked above");
                    link = ClientConn::new(link.into_stream()?.accept_tls(acceptor).await?);
                }
                StartupPacket::SslRequest | StartupPacket::GssEncRequest => link.write_now(b"N").await?,
                StartupPacket::Cancel { process_id, secret_key } => {
                    let node = self.cancel_keys.lock().unwrap().get(&(process_id, secret_key)).cloned();
                    if let Some(node) = node {
                        crate::connection::send_cancel(&node, (process_id, secret_key)).await;
                    }
                    return Ok(());
                }
                StartupPacket::Startup { params } => break params,
            }
        };
        let get = |name: &str| params.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone());
        let ends = get("application_name").as_deref().and_then(LinkEnds::parse);
        let target = ends.and_then(|e| self.catalog.snapshot().node_for_group(e.to).map(|n| n.addr.clone()));
        if self.tls.is_some()
            && get("user").is_none_or(|user| link.peer_certificate().and_then(crate::certificates::common_name).as_deref() != Some(user.as_str()))
        {
            return refuse(&mut link, "worker links log in over TLS with a certificate of the cluster's CA made out to the role they log in as")
                .await;
        }
        let (Some(ends), Some(target), Some(user), true) = (ends, target, get("user"), self.is_node(peer, from_this_host).await) else {
            return refuse(&mut link, "this port relays the Tessera workers' links to other nodes; clients connect to the coordinator's own port")
                .await;
        };
        let mut options: Vec<(String, String)> = vec![("application_name".into(), format!("tessera_link_{}_{}_{}", ends.from, ends.to, ends.pid))];
        options.extend(params.iter().filter(|(k, _)| k == "client_encoding" || k == "options").cloned());
        let login = Login { user, database: get("database").unwrap_or_default(), password: self.password.clone(), options };
        let (mut node, changed_params) = match self.connect_as(&target, &login).await {
            Ok(connected) => connected,
            Err(e) => {
                backend::error_response(link.out(), &e);
                link.flush().await?;
                return Ok(());
            }
        };
        link.authenticated();
        backend::authentication_ok(link.out());
        for (name, value) in node.server_params().iter().chain(&changed_params) {
            backend::parameter_status(link.out(), name, value);
        }
        let key = node.backend_key();
        backend::backend_key_data(link.out(), key.0, key.1);
        backend::ready_for_query(link.out(), TxStatus::Idle);
        link.flush().await?;
        self.cancel_keys.lock().unwrap().insert(key, target.clone());
        let result = self.relay(&mut link, &mut node, ends).await;
        self.cancel_keys.lock().unwrap().remove(&key);
        node.terminate().await;
        result
    }

    /// A connection to `target` for a link logging in as `login`, and the
    /// settings that changed after its start-up. A role that may not log in
    /// (the owner of a SECURITY DEFINER function is often one) gets a service
    /// connection that takes on its identity with SET SESSION AUTHORIZATION,
    /// so the node checks that role's privileges as it would for a login.
    async fn connect_as(&self, target: &ServerAddr, login: &Login) -> PgResult<(PgConnection, Vec<(String, String)>)> {
        let refusal = match PgConnection::connect(target, login).await {
            Ok(node) => return Ok((node, Vec::new())),
            Err(e) if e.code() == sqlstate::INVALID_AUTHORIZATION => e,
            Err(e) => return Err(e),
        };
        let service = Login { database: login.database.clone(), options: login.options.clone(), ..self.service.clone() };
        let mut node = PgConnection::connect(target, &service).await?;
        let role = quote_literal(&login.user);
        if node.query_value(&format!("SELECT NOT rolcanlogin FROM pg_catalog.pg_roles WHERE rolname = {role}")).await?.as_deref() != Some("t") {
            node.terminate().await;
            return Err(refusal);
        }
        node.track_parameter_changes();
        node.execute(&format!("SET SESSION AUTHORIZATION {}", quote_ident(&login.user))).await?;
        let changed = node.take_changed_params();
        Ok((node, changed))
    }

    /// Passes messages both ways, request by request: postgres_fdw waits
    /// for each answer (ReadyForQuery) before it sends on.
    async fn relay(&self, link: &mut ClientConn, node: &mut PgConnection, ends: LinkEnds) -> anyhow::Result<()> {
        let mut in_transaction = false;
        let result = self.relay_transactions(link, node, ends, &mut in_transaction).await;
        self.mark_linked(ends, &mut in_transaction, false);
        result
    }

    async fn relay_transactions(
        &self,
        link: &mut ClientConn,
        node: &mut PgConnection,
        ends: LinkEnds,
        in_transaction: &mut bool,
    ) -> anyhow::Result<()> {
        let mut wrote = false;
        // The node's transaction status once the statements queued for it
        // have run: what an answer given ahead reports.
        let mut status = node.tx_status();
        while let Some(msg) = link.recv().await? {
            match msg.tag() {
                b'X' => break,
                b'Q' => {
                    let sql = frontend::decode_query(&msg)?;
                    let rewritten = at_read_committed(sql);
                    let sql = rewritten.unwrap_or(sql);
                    let command = leading_keyword(sql);
                    if command == "COMMIT" && wrote {
                        wrote = false;
                        self.mark_linked(ends, in_transaction, false);
                        self.prepare_instead_of_commit(link, node, ends).await?;
                        status = node.tx_status();
                        continue;
                    }
                    if command == "START" {
                        // The backend's previous transaction has ended.
                        self.settle(ends.from, ends.pid, |_| true).await;
                    }
                    let ends_transaction = ends_transaction(sql);
                    self.mark_linked(ends, in_transaction, command == "START" || (*in_transaction && !ends_transaction));
                    wrote = !ends_transaction && (wrote || is_write(&command));
                    if let Some((tag, after)) = answer_ahead(sql, status) {
                        // Sent with the link's next request instead of on its
                        // own: postgres_fdw waits for each answer, and these
                        // bookkeeping statements cannot fail in a healthy
                        // transaction. If one does, the node connection breaks
                        // and the link's next request fails with its error.
                        node.queue_silent(sql);
                        status = after;
                        backend::command_complete(link.out(), tag);
                        backend::ready_for_query(link.out(), status);
                        link.flush().await?;
                        continue;
                    }
                    match rewritten {
                        Some(sql) => frontend::query(node.out(), sql),
                        None => node.out().extend_from_slice(msg.frame()),
                    }
                    relay_answer(node, link).await?;
                    status = node.tx_status();
                }
                b'P' => {
                    wrote |= is_write(&leading_keyword(&frontend::decode_parse(&msg)?.sql));
                    node.out().extend_from_slice(msg.frame());
                }
                b'S' => {
                    node.out().extend_from_slice(msg.frame());
                    relay_answer(node, link).await?;
                    status = node.tx_status();
                }
                _ => node.out().extend_from_slice(msg.frame()),
            }
        }
        Ok(())
    }

    /// Whether worker backend `pid` of node group `from` is in a transaction
    /// that opened links.
    pub fn in_linked_transaction(&self, from: i32, pid: i32) -> bool {
        self.linked.lock().unwrap().contains_key(&(from, pid))
    }

    /// Notes whether one of the backend's links is inside a transaction now.
    fn mark_linked(&self, ends: LinkEnds, in_transaction: &mut bool, now: bool) {
        if *in_transaction == now {
            return;
        }
        *in_transaction = now;
        let mut linked = self.linked.lock().unwrap();
        let key = (ends.from, ends.pid);
        if now {
            *linked.entry(key).or_default() += 1;
        } else if let Some(n) = linked.get_mut(&key) {
            *n -= 1;
            if *n == 0 {
                linked.remove(&key);
            }
        }
    }

    /// Answers postgres_fdw's COMMIT of a remote transaction that wrote: the
    /// transaction is prepared on the node, to be decided by its worker
    /// transaction's commit. An error here makes the worker transaction
    /// fail, and the node's part is rolled back with it.
    async fn prepare_instead_of_commit(&self, link: &mut ClientConn, node: &mut PgConnection, ends: LinkEnds) -> anyhow::Result<()> {
        let prepared = async {
            let decider = self.deciding_transaction(ends).await?;
            let gid = decided::gid(ends.from, &decider, &self.serial.fetch_add(1, Ordering::Relaxed).to_string());
            node.execute(&format!("PREPARE TRANSACTION {}", quote_literal(&gid))).await?;
            Ok::<_, PgError>(Prepared { node: ends.to, gid, decider, since: Instant::now() })
        }
        .await;
        match prepared {
            Ok(prepared) => {
                self.remember(ends.from, ends.pid, vec![prepared]);
                inject_fault(self.fault, Fault::AfterLinkPrepare);
                backend::command_complete(link.out(), "COMMIT");
                backend::ready_for_query(link.out(), TxStatus::Idle);
                link.flush().await?;
                inject_fault(self.fault, Fault::AfterLinkReply);
                return Ok(());
            }
            Err(e) => {
                let status = if node.tx_status() == TxStatus::Idle { TxStatus::Idle } else { TxStatus::Failed };
                backend::error_response(
                    link.out(),
                    &e.with_context(format!("while preparing the write of a worker transaction on node {}", node.label())),
                );
                backend::ready_for_query(link.out(), status);
            }
        }
        link.flush().await?;
        Ok(())
    }

    /// The worker transaction a link's writes belong to: the top-level
    /// transaction of the backend that opened the link.
    async fn deciding_transaction(&self, ends: LinkEnds) -> PgResult<DecidingTransaction> {
        // The backend's own row of pg_stat_get_activity (the whole view would
        // join every backend's to the roles and databases: about 0.8 ms at
        // 300 connections) shows the 32-bit xid. A snapshot's xmax (one past
        // the latest completed xid) is a full xid within 2^31 of it, either
        // side (a running xid may be above it): that gives its epoch.
        let sql = format!(
            "SELECT ((n >> 32 << 32) + x + CASE WHEN x - (n & 4294967295) > 2147483648 THEN -4294967296
                                              WHEN (n & 4294967295) - x > 2147483648 THEN 4294967296 ELSE 0 END)::text,
                    {}::text
               FROM (SELECT backend_xid::text::bigint AS x, pg_snapshot_xmax(pg_current_snapshot())::text::bigint AS n, backend_start
                       FROM pg_stat_get_activity({})) s",
            decided::BACKEND_START_US,
            ends.pid
        );
        let rows = self.with_service(ends.from, |conn| Box::pin(async move { conn.query(&sql).await })).await?;
        let field = |i: usize| rows.first().and_then(|r| r.get(i).cloned().flatten());
        match (field(0).and_then(|x| x.parse().ok()), field(1).and_then(|s| s.parse().ok())) {
            (Some(xid), Some(backend_started)) => Ok(DecidingTransaction { xid, backend_started }),
            _ => Err(PgError::new(
                sqlstate::INTERNAL_ERROR,
                format!("backend {} on node group {} has no transaction id for its writes on other nodes", ends.pid, ends.from),
            )),
        }
    }

    /// Settles the prepared parts of backend `pid` on node group `from` that
    /// `due` picks; parts whose deciding transaction is still running stay.
    pub async fn settle(&self, from: i32, pid: i32, due: impl Fn(&Instant) -> bool) {
        if !self.has_pending() {
            return;
        }
        let taken: Vec<Prepared> = {
            let mut pending = self.pending.lock().unwrap();
            let Some(parts) = pending.get_mut(&(from, pid)) else { return };
            let (taken, kept): (Vec<_>, Vec<_>) = parts.drain(..).partition(|p| due(&p.since));
            *parts = kept;
            if parts.is_empty() {
                pending.remove(&(from, pid));
            }
            self.pending_count.fetch_sub(taken.len(), Ordering::SeqCst);
            taken
        };
        if taken.is_empty() {
            return;
        }
        let deciders: Vec<DecidingTransaction> = taken.iter().map(|p| p.decider.clone()).collect();
        let decisions = self.with_service(from, |conn| Box::pin(async move { decided::decide(conn, &deciders).await })).await.unwrap_or_else(|e| {
            tracing::warn!("could not learn the outcome of transactions on node group {from}: {e}");
            vec![None; taken.len()]
        });
        let mut unsettled = Vec::new();
        for (part, decision) in taken.into_iter().zip(decisions) {
            let settled = match decision {
                Some(command) => {
                    let sql = decided::finish_sql(command, &part.gid);
                    let result = self.with_service(part.node, |conn| Box::pin(async move { decided::finish_prepared(conn, &sql).await })).await;
                    result.map_err(|e| tracing::warn!("{command} '{}' on node group {}: {e}", part.gid, part.node)).is_ok()
                }
                None => false,
            };
            if !settled {
                unsettled.push(part);
            }
        }
        if !unsettled.is_empty() {
            self.remember(from, pid, unsettled);
        }
    }

    /// Keeps prepared parts of backend `pid` on node group `from` until settled.
    fn remember(&self, from: i32, pid: i32, parts: Vec<Prepared>) {
        let mut pending = self.pending.lock().unwrap();
        self.pending_count.fetch_add(parts.len(), Ordering::SeqCst);
        pending.entry((from, pid)).or_default().extend(parts);
    }

    /// Whether any prepared part waits for a decision (cheap: sessions ask
    /// after every statement).
    pub fn has_pending(&self) -> bool {
        self.pending_count.load(Ordering::SeqCst) > 0
    }

    async fn settle_periodically(self: Arc<Self>) {
        loop {
            tokio::time::sleep(SETTLE_AFTER).await;
            if !self.has_pending() {
                continue;
            }
            let backends: Vec<(i32, i32)> = self.pending.lock().unwrap().keys().copied().collect();
            for (from, pid) in backends {
                self.settle(from, pid, |since| since.elapsed() >= SETTLE_AFTER).await;
            }
        }
    }

    /// Runs `work` on an idle service connection to node group `group` (a
    /// new one if none is idle), keeping the connection for later unless it
    /// broke.
    async fn with_service<T>(
        &self,
        group: i32,
        work: impl for<'c> FnOnce(&'c mut PgConnection) -> futures::future::BoxFuture<'c, PgResult<T>>,
    ) -> PgResult<T> {
        let idle = self.idle.lock().unwrap().get_mut(&group).and_then(Vec::pop);
        let mut conn = match idle {
            Some(conn) => conn,
            None => {
                let catalog = self.catalog.snapshot();
                let node = catalog
                    .node_for_group(group)
                    .ok_or_else(|| PgError::new(sqlstate::CONNECTION_FAILURE, format!("node group {group} is not in the catalog")))?;
                PgConnection::connect(&node.addr, &self.service).await?
            }
        };
        let result = work(&mut conn).await;
        if !conn.is_broken() {
            let mut idle = self.idle.lock().unwrap();
            let list = idle.entry(group).or_default();
            if list.len() < IDLE_SERVICE_CONNECTIONS {
                list.push(conn);
            }
        }
        result
    }
}

/// This host's name, as gethostname(2) gives it.
/// Turns a would-be link away (28000) with `why`.
async fn refuse(link: &mut ClientConn, why: &str) -> anyhow::Result<()> {
    backend::error_response(link.out(), &PgError::new(sqlstate::INVALID_AUTHORIZATION, why));
    link.flush().await?;
    Ok(())
}

fn host_name() -> std::io::Result<String> {
    let mut buf = [0u8; 256];
    // SAFETY: gethostname writes at most buf.len() bytes into buf.
    if unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let end = buf.iter().position(|b| *b == 0).unwrap_or(buf.len());
    Ok(String::from_utf8_lossy(&buf[..end]).into_owned())
}

/// Relays a node's answer to the link, up to and including ReadyForQuery.
/// When the node connection fails instead (a statement answered ahead
/// failed, or the node went away), the link gets the error before the
/// relay drops it.
async fn relay_answer(node: &mut PgConnection, link: &mut ClientConn) -> anyhow::Result<()> {
    loop {
        let msg = match node.recv().await {
            Ok(msg) => msg,
            Err(e) => {
                backend::error_response(link.out(), &e.clone().with_context(format!("on node {}, reached through the link relay", node.label())));
                link.flush().await?;
                return Err(e.into());
            }
        };
        link.out().extend_from_slice(msg.frame());
        if msg.tag() == b'Z' {
            link.flush().await?;
            return Ok(());
        }
        link.flush_if_large().await?;
    }
}

/// The first keyword of a statement, upper-cased.
fn leading_keyword(sql: &str) -> String {
    sql.trim_start_matches(|c: char| c.is_whitespace() || c == '(')
        .split(|c: char| !c.is_ascii_alphabetic())
        .next()
        .unwrap_or("")
        .to_ascii_uppercase()
}

/// Whether a statement ends the link's remote transaction (a rollback to
/// a savepoint does not).
fn ends_transaction(sql: &str) -> bool {
    let mut words = sql.split_whitespace().map(str::to_ascii_uppercase);
    match words.next().as_deref() {
        Some("COMMIT" | "ABORT" | "END") => true,
        Some("ROLLBACK") => words.next().as_deref() != Some("TO"),
        _ => false,
    }
}

/// The command tag and the transaction status to answer `sql` with at
/// once, when it is one of the bookkeeping statements postgres_fdw sends
/// around its queries (opening the remote transaction, closing a cursor,
/// dropping a prepared statement, a savepoint) and the transaction is in a
/// state where it succeeds.
fn answer_ahead(sql: &str, status: TxStatus) -> Option<(&'static str, TxStatus)> {
    if sql.trim_end().trim_end_matches(';').contains(';') {
        return None;
    }
    let mut words = sql.split_whitespace().map(str::to_ascii_uppercase);
    match (status, words.next()?.as_str()) {
        (TxStatus::Idle, "START") if words.next().as_deref() == Some("TRANSACTION") => Some(("START TRANSACTION", TxStatus::InBlock)),
        (TxStatus::InBlock, "CLOSE") if words.next().is_some_and(|w| w != "ALL") => Some(("CLOSE CURSOR", TxStatus::InBlock)),
        (TxStatus::InBlock, "DEALLOCATE") if words.next().is_some_and(|w| w != "ALL") => Some(("DEALLOCATE", TxStatus::InBlock)),
        (TxStatus::InBlock, "SAVEPOINT") => Some(("SAVEPOINT", TxStatus::InBlock)),
        (TxStatus::InBlock, "RELEASE") => Some(("RELEASE", TxStatus::InBlock)),
        _ => None,
    }
}

/// The statement to open a link's remote transaction with instead of
/// `sql`, when that is postgres_fdw's `START TRANSACTION ISOLATION LEVEL
/// REPEATABLE READ`. postgres_fdw asks for REPEATABLE READ unless the
/// worker's transaction is SERIALIZABLE, so that one snapshot serves all
/// its scans; but then a row another transaction updated meanwhile fails
/// the statement with 40001, where the same statement on plain PostgreSQL
/// (READ COMMITTED) waits for that transaction and goes on with the row's
/// new version. Links follow the sessions' usual isolation instead, as the
/// coordinator's own statements on several nodes do: one snapshot per
/// statement on each node.
fn at_read_committed(sql: &str) -> Option<&'static str> {
    const ASKED: [&str; 6] = ["START", "TRANSACTION", "ISOLATION", "LEVEL", "REPEATABLE", "READ"];
    let mut words = sql.split_whitespace();
    let asked = ASKED.iter().all(|expected| words.next().is_some_and(|w| w.eq_ignore_ascii_case(expected))) && words.next().is_none();
    asked.then_some("START TRANSACTION ISOLATION LEVEL READ COMMITTED")
}

/// Whether a statement postgres_fdw sends changes rows.
fn is_write(keyword: &str) -> bool {
    matches!(keyword, "INSERT" | "UPDATE" | "DELETE" | "TRUNCATE" | "MERGE" | "COPY")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn link_names_round_trip() {
        let name = link_application_name(3, 7).replace("%p", "4242");
        assert_eq!(LinkEnds::parse(&name), Some(LinkEnds { from: 3, pid: 4242, to: 7 }));
        assert_eq!(LinkEnds::parse("tessera_link_3_7"), None);
        assert_eq!(LinkEnds::parse("psql"), None);
    }

    #[test]
    fn writes_are_told_from_reads() {
        assert!(is_write(&leading_keyword("UPDATE public.t_102 SET a = $1 WHERE ctid = $2")));
        assert!(is_write(&leading_keyword("  INSERT INTO s.t(a) VALUES ($1)")));
        assert!(!is_write(&leading_keyword("DECLARE c1 CURSOR FOR SELECT a FROM s.t")));
        assert!(!is_write(&leading_keyword("FETCH 100 FROM c1")));
        assert!(ends_transaction("ABORT TRANSACTION") && ends_transaction("COMMIT TRANSACTION"));
        assert!(!ends_transaction("ROLLBACK TO SAVEPOINT s2") && !ends_transaction("SAVEPOINT s2"));
    }

    #[test]
    fn links_open_their_remote_transactions_at_read_committed() {
        assert_eq!(at_read_committed("START TRANSACTION ISOLATION LEVEL REPEATABLE READ"), Some("START TRANSACTION ISOLATION LEVEL READ COMMITTED"));
        assert_eq!(at_read_committed("START TRANSACTION ISOLATION LEVEL SERIALIZABLE"), None, "a SERIALIZABLE worker transaction stays so");
        assert_eq!(at_read_committed("SELECT 1"), None);
    }

    #[test]
    fn only_bookkeeping_in_a_healthy_transaction_is_answered_ahead() {
        use TxStatus::*;
        assert_eq!(answer_ahead("START TRANSACTION ISOLATION LEVEL REPEATABLE READ", Idle), Some(("START TRANSACTION", InBlock)));
        assert_eq!(answer_ahead("START TRANSACTION ISOLATION LEVEL REPEATABLE READ", InBlock), None);
        assert_eq!(answer_ahead("CLOSE c3", InBlock), Some(("CLOSE CURSOR", InBlock)));
        assert_eq!(answer_ahead("DEALLOCATE pgsql_fdw_prep_7", InBlock), Some(("DEALLOCATE", InBlock)));
        assert_eq!(answer_ahead("RELEASE SAVEPOINT s2", InBlock), Some(("RELEASE", InBlock)));
        assert_eq!(answer_ahead("CLOSE c3", Failed), None, "fails in an aborted transaction");
        assert_eq!(answer_ahead("CLOSE c3", Idle), None, "no cursor outside a transaction");
        assert_eq!(answer_ahead("CLOSE ALL", InBlock), None);
        assert_eq!(answer_ahead("SAVEPOINT s2; SELECT 1", InBlock), None, "one answer per statement");
        assert_eq!(answer_ahead("FETCH 100 FROM c3", InBlock), None);
        assert_eq!(answer_ahead("ROLLBACK TO SAVEPOINT s2; RELEASE SAVEPOINT s2", InBlock), None);
    }
}
