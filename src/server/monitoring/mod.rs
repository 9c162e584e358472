//! The monitoring listener (`metrics_listen`): `/metrics` for Prometheus,
//! and a read-only dashboard at `/` that reads `/api/overview` and
//! `/api/history`. Loopback needs nothing more; any other address needs a
//! password (Basic authentication) and the coordinator's TLS certificate.

mod dashboard;
mod history;
mod http;
mod metrics;
mod snapshot;

use crate::process::Coordinator;
use http::{Request, Response};
use std::sync::Arc;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;

/// The dashboard page; it fetches its data from the JSON endpoints.
const DASHBOARD_PAGE: &str = include_str!("dashboard.html");

struct Monitor {
    coordinator: Arc<Coordinator>,
    history: history::History,
    password: Option<String>,
}

/// Starts the listener at `listen`, with its sampler of statement rates.
pub async fn start(coordinator: Arc<Coordinator>, listen: &str) -> anyhow::Result<()> {
    let listener = TcpListener::bind(listen).await.map_err(|e| anyhow::anyhow!("could not listen for monitoring on {listen}: {e}"))?;
    let loopback = listener.local_addr()?.ip().is_loopback();
    let config = &coordinator.config;
    let tls = match (&config.tls, loopback) {
        (_, true) => None,
        (Some(tls), false) => Some(crate::transport::tls_acceptor(std::path::Path::new(&tls.cert_file), std::path::Path::new(&tls.key_file))?),
        (None, false) => {
            anyhow::bail!("metrics_listen = \"{listen}\" is not a loopback address: it needs [tls] (and metrics_password) for the dashboard")
        }
    };
    if !loopback && config.metrics_password.is_none() {
        anyhow::bail!("metrics_listen = \"{listen}\" is not a loopback address: set metrics_password for the dashboard and /metrics");
    }
    let monitor = Arc::new(Monitor { coordinator: coordinator.clone(), history: Default::default(), password: config.metrics_password.clone() });
    tracing::info!("dashboard and /metrics on http{}://{listen}/", if tls.is_some() { "s" } else { "" });
    tokio::spawn(sample_history(monitor.clone()));
    tokio::spawn(async move {
        loop {
            let (stream, _) = match listener.accept().await {
                Ok(accepted) => accepted,
                Err(e) => {
                    tracing::warn!("monitoring listener: {e}");
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                    continue;
                }
            };
            let (monitor, tls) = (monitor.clone(), tls.clone());
            tokio::spawn(async move {
                let served = match tls {
                    Some(tls) => match tls.accept(stream).await {
                        Ok(stream) => serve(&monitor, stream).await,
                        Err(e) => Err(e),
                    },
                    None => serve(&monitor, stream).await,
                };
                if let Err(e) = served {
                    tracing::debug!("monitoring request: {e}");
                }
            });
        }
    });
    Ok(())
}

/// Compares without stopping at the first difference, so that the time
/// taken tells nothing of the password.
fn same_secret(given: &str, expected: &str) -> bool {
    given.len() == expected.len() && given.bytes().zip(expected.bytes()).fold(0, |acc, (a, b)| acc | (a ^ b)) == 0
}

async fn sample_history(monitor: Arc<Monitor>) {
    loop {
        monitor.history.sample(&monitor.coordinator.stats);
        tokio::time::sleep(history::SAMPLE_EVERY).await;
    }
}

async fn serve<S: AsyncRead + AsyncWrite + Unpin>(monitor: &Monitor, mut stream: S) -> std::io::Result<()> {
    let Some(request) = http::read_request(&mut stream).await? else { return Ok(()) };
    let response = respond(monitor, &request).await;
    http::write_response(&mut stream, &response).await
}

async fn respond(monitor: &Monitor, request: &Request) -> Response {
    if let Some(password) = &monitor.password {
        if !request.password.as_deref().is_some_and(|given| same_secret(given, password)) {
            return Response::text(401, "a password is needed (Basic authentication, any user name)\n");
        }
    }
    if request.method != "GET" {
        return Response::text(405, "only GET\n");
    }
    match request.path.as_str() {
        "/" => Response::ok("text/html; charset=utf-8", DASHBOARD_PAGE),
        "/metrics" => Response::ok(metrics::CONTENT_TYPE, metrics::render(&monitor.coordinator).await),
        "/api/overview" => Response::ok("application/json", dashboard::overview(&monitor.coordinator).await.to_string()),
        "/api/history" => Response::ok("application/json", monitor.history.series().to_string()),
        _ => Response::text(404, "not found: the dashboard is at /, the metrics at /metrics\n"),
    }
}
