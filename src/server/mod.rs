//! The coordinator's front: listens for clients (TCP and Unix sockets),
//! offers TLS, runs one session per connection, and spawns the process's
//! background loops (catalog notifications, recovery, deadlock detection,
//! background jobs).

mod auth;
mod login_memory;
mod monitoring;
mod session;

use crate::config::Config;
use crate::connection::PgConnection;
use crate::error::PgResult;
use crate::metadata;
use crate::process::Coordinator;
use crate::transport::{Stream, UnixSocket};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;

/// What the sessions of this listener share beyond the process's state:
/// how clients log in.
pub(crate) struct Front {
    /// TLS for the clients that ask for it, when configured.
    tls: Option<tokio_rustls::TlsAcceptor>,
    /// What logins learnt, for logging in while the coordinator database is down.
    logins: login_memory::LoginMemory,
}

/// Follows catalog changes made by any process: the catalog triggers NOTIFY
/// `tessera_catalog`, and each notification triggers a reload.
async fn follow_catalog(coordinator: Arc<Coordinator>) {
    loop {
        let result: PgResult<()> = async {
            let mut conn = PgConnection::connect(&coordinator.config.coordinator_db_addr(), &coordinator.config.service_login()).await?;
            conn.execute("LISTEN tessera_catalog").await?;
            // Changes made while we were not listening.
            coordinator.reload_catalog().await?;
            loop {
                let msg = conn.recv().await?;
                if msg.tag() == b'A' {
                    coordinator.reload_catalog().await?;
                }
            }
        }
        .await;
        if let Err(e) = result {
            tracing::warn!("catalog listener: {e}; reconnecting");
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// Runs recovery, and the cleanup of what unfinished operations left, at
/// start-up and then at the configured interval.
async fn recover_periodically(coordinator: Arc<Coordinator>) {
    let interval = Duration::from_secs_f64(coordinator.config.transactions.recovery_interval_secs.max(0.1));
    let mut nodes = coordinator.recovery_connections();
    loop {
        if let Err(e) = coordinator.recover_on(&mut nodes).await {
            tracing::warn!("prepared-transaction recovery: {e}");
        }
        if let Err(e) = crate::operations::cleanup::run(&coordinator.config, &coordinator.catalog.snapshot()).await {
            tracing::debug!("cleanup of unfinished operations: {e}");
        }
        tokio::time::sleep(interval).await;
    }
}

/// Prepares the active nodes among `groups` for worker-side relations and
/// two-phase commits (`worker_relations::prepare_node`), each with its outcome.
async fn prepare_nodes(coordinator: &Coordinator, groups: &[i32]) -> Vec<(metadata::Node, PgResult<()>)> {
    let catalog = coordinator.catalog.snapshot();
    let mut outcomes = Vec::new();
    for node in catalog.active_nodes().filter(|n| groups.contains(&n.group_id)) {
        let outcome = crate::commands::worker_relations::prepare_node(&coordinator.config, &coordinator.links.addr, node, &catalog.nodes).await;
        outcomes.push((node.clone(), outcome));
    }
    outcomes
}

/// Prepares the nodes (by group) that were down when this process started,
/// each as soon as it answers, until none is left or they left the cluster.
async fn prepare_when_back(coordinator: Arc<Coordinator>, mut groups: Vec<i32>) {
    let interval = Duration::from_secs_f64(coordinator.config.transactions.recovery_interval_secs.max(0.1));
    while !groups.is_empty() {
        tokio::time::sleep(interval).await;
        groups = prepare_nodes(&coordinator, &groups)
            .await
            .into_iter()
            .filter_map(|(node, outcome)| match outcome {
                Ok(()) => {
                    tracing::info!("node {} answers again: prepared for worker-side relations and two-phase commits", node.addr);
                    None
                }
                Err(e) => {
                    tracing::debug!("{e}");
                    Some(node.group_id)
                }
            })
            .collect();
    }
}

async fn detect_deadlocks_periodically(coordinator: Arc<Coordinator>) {
    let interval = Duration::from_secs_f64(coordinator.config.transactions.deadlock_check_interval_secs.max(0.1));
    let mut nodes = coordinator.service_connections("tessera deadlock detection", coordinator.config.transactions.deadlock_check_interval_secs);
    loop {
        tokio::time::sleep(interval).await;
        if let Err(e) = coordinator.break_deadlocks(&mut nodes).await {
            tracing::warn!("distributed deadlock detection: {e}");
        }
    }
}

/// Serves clients until the process is stopped.
pub async fn serve(config: Config) -> anyhow::Result<()> {
    raise_file_limit();
    crate::connection::node_tls::reach_nodes_as_configured(&config)?;
    let tls = match &config.tls {
        Some(tls) => Some(crate::transport::tls_acceptor(std::path::Path::new(&tls.cert_file), std::path::Path::new(&tls.key_file))?),
        None => None,
    };
    let front = Arc::new(Front { tls, logins: Default::default() });
    let coordinator = Coordinator::start(config).await?;
    // Before clients come: their first distributed table needs every node
    // ready for its worker-side relations, and its two-phase commits need
    // the node's `tessera_commit` objects. A node that is down now is made
    // ready once it answers again.
    let groups: Vec<i32> = coordinator.catalog.snapshot().active_nodes().map(|n| n.group_id).collect();
    // The coordinator database's fallback reaches the workers with the
    // roles' certificates.
    let coordinator_db = [coordinator.config.coordinator_db_addr()];
    if let Err(e) = crate::connection::node_tls::provide_on_nodes(&coordinator_db, &coordinator.config.service_login(), None).await {
        tracing::warn!("{e}");
    }
    let mut unprepared = Vec::new();
    for (node, outcome) in prepare_nodes(&coordinator, &groups).await {
        if let Err(e) = outcome {
            tracing::warn!("{e}; trying again every recovery interval");
            unprepared.push(node.group_id);
        }
    }
    if !unprepared.is_empty() {
        tokio::spawn(prepare_when_back(coordinator.clone(), unprepared));
    }
    // A monitoring listener set up wrongly stops the start before any
    // client is taken.
    if let Some(listen) = &coordinator.config.metrics_listen {
        monitoring::start(coordinator.clone(), listen).await?;
    }
    let listen = &coordinator.config.listen;
    let listener = TcpListener::bind(listen).await.map_err(|e| anyhow::anyhow!("could not listen on {listen}: {e}"))?;
    let port = listener.local_addr()?.port();
    let sockets = unix_sockets(&coordinator.config.unix_socket_directories, port);
    tokio::spawn(follow_catalog(coordinator.clone()));
    tokio::spawn(recover_periodically(coordinator.clone()));
    tokio::spawn(crate::operations::failover::watch(coordinator.clone()));
    tokio::spawn(detect_deadlocks_periodically(coordinator.clone()));
    tokio::spawn(crate::operations::background::run_jobs(coordinator.clone()));
    tracing::info!(
        "tessera coordinator listening on {}{}",
        coordinator.config.listen,
        sockets.iter().map(|s| format!(" and {}", s.path.display())).collect::<String>()
    );
    use tokio::signal::unix::{signal, SignalKind};
    let (mut terminate, mut interrupt) = (signal(SignalKind::terminate())?, signal(SignalKind::interrupt())?);
    loop {
        let accepted: std::io::Result<(Stream, String)> = tokio::select! {
            accepted = listener.accept() => accepted.map(|(stream, peer)| (stream.into(), peer.to_string())),
            accepted = accept_unix(&sockets) => accepted.map(|stream| (stream.into(), "the Unix socket".to_string())),
            // Stopping removes the socket files (dropping `sockets`).
            _ = terminate.recv() => return Ok(()),
            _ = interrupt.recv() => return Ok(()),
        };
        let (stream, peer) = match accepted {
            Ok(accepted) => accepted,
            // Out of file descriptors, say: the clients already in are served
            // on; new ones are taken again after a pause.
            Err(e) => {
                tracing::warn!("could not accept a client: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let (coordinator, front) = (coordinator.clone(), front.clone());
        tokio::spawn(async move {
            if let Err(e) = session::run(coordinator, front, stream).await {
                tracing::debug!("session from {peer} ended: {e}");
            }
        });
    }
}

/// Every client and every pooled node connection is a file descriptor: the
/// soft limit (often 1,024) goes up to the hard one.
fn raise_file_limit() {
    // SAFETY: getrlimit/setrlimit only read and write the struct passed.
    unsafe {
        let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0 && limit.rlim_cur < limit.rlim_max {
            limit.rlim_cur = limit.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
        }
    }
}

/// The Unix sockets in `directories` that could be made; the others are
/// named in the log.
fn unix_sockets(directories: &[String], port: u16) -> Vec<UnixSocket> {
    let mut sockets = Vec::new();
    for dir in directories {
        match UnixSocket::bind(std::path::Path::new(dir), port) {
            Ok(socket) => sockets.push(socket),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => tracing::debug!("no Unix socket in {dir}: it does not exist"),
            Err(e) => tracing::warn!("no Unix socket in {dir}: {e}"),
        }
    }
    sockets
}

/// The next client on any of the Unix sockets (never, without any).
async fn accept_unix(sockets: &[UnixSocket]) -> std::io::Result<tokio::net::UnixStream> {
    if sockets.is_empty() {
        return std::future::pending().await;
    }
    let (accepted, _, _) = futures::future::select_all(sockets.iter().map(|s| Box::pin(s.listener.accept()))).await;
    Ok(accepted?.0)
}
