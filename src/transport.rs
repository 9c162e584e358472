//! The byte streams the protocol travels over: TCP and Unix-domain sockets,
//! both to clients and to nodes, and TLS over TCP to clients and to nodes.
//! On one host a Unix socket skips the loopback TCP stack, which costs a
//! PostgreSQL server a third of its select-only throughput on these
//! machines.

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use std::io;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpStream, UnixListener, UnixStream};
use tokio_rustls::TlsAcceptor;

pub enum Stream {
    Tcp(TcpStream),
    Unix(UnixStream),
    Tls(Box<tokio_rustls::server::TlsStream<TcpStream>>),
    /// A connection to a node over TCP, verified against the cluster's CA.
    NodeTls(Box<tokio_rustls::client::TlsStream<TcpStream>>),
}

/// A context whose waker does nothing: polls a TLS stream once, for the
/// reads and writes that must not wait.
fn no_wait() -> Context<'static> {
    Context::from_waker(std::task::Waker::noop())
}

fn would_block() -> io::Error {
    io::ErrorKind::WouldBlock.into()
}

impl Stream {
    fn tcp(stream: TcpStream) -> Stream {
        stream.set_nodelay(true).ok();
        Stream::Tcp(stream)
    }

    /// Reads what has arrived, without waiting (`WouldBlock` when nothing
    /// has). Node connections use it.
    pub fn try_read_buf<B: bytes::BufMut>(&mut self, buf: &mut B) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.try_read_buf(buf),
            Stream::Unix(s) => s.try_read_buf(buf),
            Stream::Tls(_) => Err(would_block()),
            Stream::NodeTls(s) => {
                // SAFETY: ReadBuf writes only initialised bytes into the spare
                // capacity and counts them; only those are then taken as written.
                let spare = unsafe { buf.chunk_mut().as_uninit_slice_mut() };
                let mut read = ReadBuf::uninit(spare);
                match Pin::new(s.as_mut()).poll_read(&mut no_wait(), &mut read) {
                    Poll::Ready(Ok(())) => {
                        let n = read.filled().len();
                        // SAFETY: the first n bytes of the spare capacity were written just now.
                        unsafe { buf.advance_mut(n) };
                        Ok(n)
                    }
                    Poll::Ready(Err(e)) => Err(e),
                    Poll::Pending => Err(would_block()),
                }
            }
        }
    }

    /// Writes what the socket takes now, without waiting (`WouldBlock` when
    /// it takes nothing). Node connections use it. Over TLS, what the
    /// socket did not take of earlier writes goes first, and some of the
    /// bytes taken may wait in the TLS session: see `has_unsent`.
    pub fn try_write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.try_write(buf),
            Stream::Unix(s) => s.try_write(buf),
            Stream::Tls(_) => Err(io::Error::new(io::ErrorKind::Unsupported, "no unbuffered writes to clients")),
            Stream::NodeTls(s) => {
                let mut cx = no_wait();
                match Pin::new(s.as_mut()).poll_flush(&mut cx) {
                    Poll::Ready(Ok(())) => {}
                    Poll::Ready(Err(e)) => return Err(e),
                    Poll::Pending => return Err(would_block()),
                }
                match Pin::new(s.as_mut()).poll_write(&mut cx, buf) {
                    Poll::Ready(written) => written,
                    Poll::Pending => Err(would_block()),
                }
            }
        }
    }

    /// Whether bytes written are still waiting in the TLS session for the
    /// socket to take them.
    pub fn has_unsent(&self) -> bool {
        match self {
            Stream::NodeTls(s) => s.get_ref().1.wants_write(),
            _ => false,
        }
    }

    /// Waits until the socket is ready for `interest`.
    pub async fn ready(&self, interest: tokio::io::Interest) -> io::Result<tokio::io::Ready> {
        match self {
            Stream::Tcp(s) => s.ready(interest).await,
            Stream::Unix(s) => s.ready(interest).await,
            Stream::Tls(_) => Err(io::Error::new(io::ErrorKind::Unsupported, "no readiness of client TLS")),
            Stream::NodeTls(s) => s.get_ref().0.ready(interest).await,
        }
    }

    /// A client's TCP connection, not yet encrypted: the kind TLS can be
    /// started on, and the kind `mode = "require"` turns away.
    pub fn is_clear_tcp(&self) -> bool {
        matches!(self, Stream::Tcp(_))
    }

    /// Runs the server side of the TLS handshake on a client's TCP stream.
    pub async fn accept_tls(self, acceptor: &TlsAcceptor) -> io::Result<Stream> {
        match self {
            Stream::Tcp(tcp) => Ok(Stream::Tls(Box::new(acceptor.accept(tcp).await?))),
            _ => Err(io::Error::new(io::ErrorKind::InvalidInput, "TLS runs only over a TCP connection")),
        }
    }

    /// Runs the client side of the TLS handshake with node `host` (a name
    /// or address its certificate must carry) on a TCP stream.
    pub async fn connect_tls(self, config: Arc<rustls::ClientConfig>, host: &str) -> io::Result<Stream> {
        let name = rustls::pki_types::ServerName::try_from(host.to_string()).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        match self {
            Stream::Tcp(tcp) => Ok(Stream::NodeTls(Box::new(tokio_rustls::TlsConnector::from(config).connect(name, tcp).await?))),
            _ => Err(io::Error::new(io::ErrorKind::InvalidInput, "TLS runs only over a TCP connection")),
        }
    }

    /// The certificate a client presented in the TLS handshake (DER).
    pub fn peer_certificate(&self) -> Option<&[u8]> {
        match self {
            Stream::Tls(s) => s.get_ref().1.peer_certificates()?.first().map(|c| c.as_ref()),
            _ => None,
        }
    }
}

/// The TLS server configuration for clients, from a certificate chain and
/// its private key in PEM files.
pub fn tls_acceptor(cert_file: &Path, key_file: &Path) -> anyhow::Result<TlsAcceptor> {
    let certs = CertificateDer::pem_file_iter(cert_file)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .map_err(|e| anyhow::anyhow!("could not read the TLS certificate {}: {e}", cert_file.display()))?;
    let key = PrivateKeyDer::from_pem_file(key_file).map_err(|e| anyhow::anyhow!("could not read the TLS key {}: {e}", key_file.display()))?;
    let config = tls_server_builder()?.with_no_client_auth().with_single_cert(certs, key).map_err(|e| {
        anyhow::anyhow!("the TLS certificate {} and key {} do not make a server identity: {e}", cert_file.display(), key_file.display())
    })?;
    Ok(TlsAcceptor::from(Arc::new(config)))
}

/// The TLS server configuration of a port only the cluster's nodes use:
/// a client must present a certificate that `roots` signed.
pub fn tls_acceptor_verifying_clients(certificate_pem: &str, key_pem: &str, roots: Arc<rustls::RootCertStore>) -> anyhow::Result<TlsAcceptor> {
    let (certs, key) = identity(certificate_pem, key_pem)?;
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(roots, crypto_provider()).build()?;
    let config = tls_server_builder()?.with_client_cert_verifier(verifier).with_single_cert(certs, key)?;
    Ok(TlsAcceptor::from(Arc::new(config)))
}

/// The TLS client configuration for nodes: their certificates must chain
/// to `roots`; the connection presents `certificate_pem` (its role's).
pub fn tls_client_config(roots: Arc<rustls::RootCertStore>, certificate_pem: &str, key_pem: &str) -> anyhow::Result<Arc<rustls::ClientConfig>> {
    let (certs, key) = identity(certificate_pem, key_pem)?;
    // AES-128-GCM only: the nodes (OpenSSL, preferring their own order)
    // would pick AES-256, which costs more on both ends of every message
    // and buys nothing here.
    let mut provider = rustls::crypto::ring::default_provider();
    provider.cipher_suites = vec![
        rustls::crypto::ring::cipher_suite::TLS13_AES_128_GCM_SHA256,
        rustls::crypto::ring::cipher_suite::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
        rustls::crypto::ring::cipher_suite::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,
    ];
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(provider))
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_client_auth_cert(certs, key)?;
    Ok(Arc::new(config))
}

/// A certificate and its private key, from PEM.
fn identity(certificate_pem: &str, key_pem: &str) -> anyhow::Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>)> {
    Ok((vec![CertificateDer::from_pem_slice(certificate_pem.as_bytes())?], PrivateKeyDer::from_pem_slice(key_pem.as_bytes())?))
}

/// The certificates of `pem` as trust roots.
pub fn root_store(pem: &str) -> anyhow::Result<rustls::RootCertStore> {
    let mut roots = rustls::RootCertStore::empty();
    for certificate in CertificateDer::pem_slice_iter(pem.as_bytes()) {
        roots.add(certificate?)?;
    }
    Ok(roots)
}

fn crypto_provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn tls_server_builder() -> anyhow::Result<rustls::ConfigBuilder<rustls::ServerConfig, rustls::WantsVerifier>> {
    Ok(rustls::ServerConfig::builder_with_provider(crypto_provider()).with_safe_default_protocol_versions()?)
}

impl From<TcpStream> for Stream {
    fn from(stream: TcpStream) -> Stream {
        Stream::tcp(stream)
    }
}

impl From<UnixStream> for Stream {
    fn from(stream: UnixStream) -> Stream {
        Stream::Unix(stream)
    }
}

impl AsyncRead for Stream {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Unix(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
            Stream::NodeTls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Stream {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_write(cx, buf),
            Stream::Unix(s) => Pin::new(s).poll_write(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
            Stream::NodeTls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_flush(cx),
            Stream::Unix(s) => Pin::new(s).poll_flush(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
            Stream::NodeTls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Unix(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
            Stream::NodeTls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

/// A PostgreSQL server's socket file in `dir` for `port`, named as libpq
/// looks for it.
pub fn socket_path(dir: &Path, port: u16) -> PathBuf {
    dir.join(format!(".s.PGSQL.{port}"))
}

/// Directories where nodes on this host keep their sockets, set once at
/// start from the configuration.
static NODE_SOCKET_DIRECTORIES: OnceLock<Vec<PathBuf>> = OnceLock::new();

pub fn use_node_socket_directories(dirs: Vec<PathBuf>) {
    let _ = NODE_SOCKET_DIRECTORIES.set(dirs);
}

/// The Unix socket by which node `host:port` is reached: in `host` itself
/// when it is a directory (libpq's convention), else, for a loopback host,
/// the node's socket in one of the configured directories.
fn node_socket(host: &str, port: u16) -> Option<PathBuf> {
    if host.starts_with('/') {
        return Some(socket_path(Path::new(host), port));
    }
    if !matches!(host, "127.0.0.1" | "localhost" | "::1") {
        return None;
    }
    NODE_SOCKET_DIRECTORIES.get()?.iter().map(|dir| socket_path(dir, port)).find(|path| path.exists())
}

/// Connects to a node, over its Unix socket where there is one, else over
/// TCP.
pub async fn connect_node(host: &str, port: u16) -> io::Result<Stream> {
    if let Some(path) = node_socket(host, port) {
        match UnixStream::connect(&path).await {
            Ok(stream) => return Ok(Stream::Unix(stream)),
            Err(e) if host.starts_with('/') => return Err(e),
            // A socket file left behind by a server that is gone.
            Err(_) => {}
        }
    }
    let stream = TcpStream::connect((host, port)).await?;
    // A node that vanishes without closing the connection (power loss, a
    // network partition) is noticed within the silence timeout instead of
    // the system's defaults (two hours idle, a quarter of an hour busy):
    // keepalive probes from half of it on, three of them over the other
    // half, and unacknowledged data dropped after it.
    let silence = std::time::Duration::from_millis(NODE_SILENCE_TIMEOUT_MS.load(std::sync::atomic::Ordering::Relaxed));
    let keepalive = socket2::TcpKeepalive::new()
        .with_time((silence / 2).max(std::time::Duration::from_secs(1)))
        .with_interval((silence / 6).max(std::time::Duration::from_secs(1)))
        .with_retries(NODE_KEEPALIVE_PROBES);
    let socket = socket2::SockRef::from(&stream);
    socket.set_tcp_keepalive(&keepalive)?;
    socket.set_tcp_user_timeout(Some(silence))?;
    Ok(Stream::tcp(stream))
}

/// Keepalive probes unanswered before a node connection is dropped.
const NODE_KEEPALIVE_PROBES: u32 = 3;

/// How long a node connection may go unanswered, in milliseconds:
/// `[connections] node_silence_timeout_secs`, set once at start-up.
static NODE_SILENCE_TIMEOUT_MS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(20_000);

/// Sets how long a TCP connection to a node may go unanswered.
pub fn set_node_silence_timeout(timeout: std::time::Duration) {
    NODE_SILENCE_TIMEOUT_MS.store(timeout.as_millis().clamp(1000, u128::from(u64::MAX)) as u64, std::sync::atomic::Ordering::Relaxed);
}

/// A Unix socket the coordinator listens on, removed when dropped.
pub struct UnixSocket {
    pub listener: UnixListener,
    pub path: PathBuf,
}

impl UnixSocket {
    /// Listens at `dir`'s socket for `port`. A socket file nobody answers
    /// on is left over from a coordinator that died, and is replaced; one
    /// that answers belongs to a live server, and is an error.
    pub fn bind(dir: &Path, port: u16) -> io::Result<UnixSocket> {
        let path = socket_path(dir, port);
        if path.exists() {
            if std::os::unix::net::UnixStream::connect(&path).is_ok() {
                return Err(io::Error::new(io::ErrorKind::AddrInUse, format!("{} is in use by another server", path.display())));
            }
            std::fs::remove_file(&path)?;
        }
        let listener = UnixListener::bind(&path)?;
        // Any local user may connect, as to PostgreSQL's own socket; the
        // coordinator's authentication decides who gets in.
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o777))?;
        Ok(UnixSocket { listener, path })
    }
}

impl Drop for UnixSocket {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn node_connections_probe_a_silent_peer() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let Stream::Tcp(stream) = connect_node("127.0.0.1", port).await.unwrap() else { panic!("a TCP connection was asked for") };
        let socket = socket2::SockRef::from(&stream);
        assert!(socket.keepalive().unwrap());
        // The default silence timeout, 20 s: probes from 10 s on, every 3 s.
        assert_eq!(socket.tcp_keepalive_time().unwrap(), std::time::Duration::from_secs(10));
        assert_eq!(socket.tcp_keepalive_interval().unwrap(), std::time::Duration::from_secs(3));
        assert_eq!(socket.tcp_keepalive_retries().unwrap(), NODE_KEEPALIVE_PROBES);
        assert_eq!(socket.tcp_user_timeout().unwrap(), Some(std::time::Duration::from_secs(20)));
    }
}
