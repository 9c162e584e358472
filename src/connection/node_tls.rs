//! The coordinator's credentials for the nodes, from the cluster's CA
//! (`[node_tls]`): the TLS settings of its connections to them (each
//! presenting the certificate of the role it logs in as, signed on first
//! use and kept), the identity of its link relay, and the certificates the
//! nodes' own connections to other nodes log in with, which it stores on
//! each node (`provide_role_certificates`).

use super::{quote_literal, PgConnection};
use crate::certificates::ClusterCa;
use crate::config::{Config, Login, NodeTlsConfig, ServerAddr};
use crate::error::{PgError, PgResult};
use bytes::Bytes;
use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::{Arc, Mutex, OnceLock};

pub struct NodeCredentials {
    ca: ClusterCa,
    ca_pem: String,
    roots: Arc<rustls::RootCertStore>,
    /// Connections are made seldom (they are pooled); one signature per role.
    by_role: Mutex<HashMap<String, Arc<rustls::ClientConfig>>>,
}

static NODE_CREDENTIALS: OnceLock<NodeCredentials> = OnceLock::new();

/// Makes this process reach the nodes as `config` says: over their Unix
/// sockets where they are on this host, else over TLS with the cluster's
/// CA where it has one. Set once, at start.
pub fn reach_nodes_as_configured(config: &Config) -> anyhow::Result<()> {
    crate::transport::use_node_socket_directories(config.node_socket_directories.iter().map(std::path::PathBuf::from).collect());
    match &config.node_tls {
        Some(node_tls) => use_node_tls(node_tls),
        None => Ok(()),
    }
}

/// Takes the cluster's CA for every node connection of this process from now
/// on.
fn use_node_tls(config: &NodeTlsConfig) -> anyhow::Result<()> {
    let ca = ClusterCa::load(Path::new(&config.ca_file), Path::new(&config.ca_key_file))?;
    let ca_pem = ca.certificate_pem();
    let roots = Arc::new(crate::transport::root_store(&ca_pem)?);
    let _ = NODE_CREDENTIALS.set(NodeCredentials { ca, ca_pem, roots, by_role: Mutex::default() });
    Ok(())
}

/// The credentials node connections use, when the cluster has a CA.
pub fn node_credentials() -> Option<&'static NodeCredentials> {
    NODE_CREDENTIALS.get()
}

impl NodeCredentials {
    /// The TLS settings of a connection logging in as `role`.
    pub fn client_config(&self, role: &str) -> anyhow::Result<Arc<rustls::ClientConfig>> {
        if let Some(config) = self.by_role.lock().unwrap().get(role) {
            return Ok(config.clone());
        }
        let issued = self.ca.role_certificate(role)?;
        let config = crate::transport::tls_client_config(self.roots.clone(), &issued.certificate_pem, &issued.key_pem)?;
        self.by_role.lock().unwrap().insert(role.to_string(), config.clone());
        Ok(config)
    }

    /// The TLS server side of the link relay at `host`: workers verify it
    /// against the CA, and it lets in only clients with a certificate the CA
    /// signed.
    pub fn link_acceptor(&self, host: &str) -> anyhow::Result<tokio_rustls::TlsAcceptor> {
        let issued = self.ca.server_certificate(&[host.to_string()])?;
        crate::transport::tls_acceptor_verifying_clients(&issued.certificate_pem, &issued.key_pem, self.roots.clone())
    }
}

/// Where, under its data directory, a node keeps the CA's certificate
/// (`root.crt`) and the certificates its connections to other nodes log in
/// with: `<role name as hex>.crt` and `.key`. The worker-side SQL finds
/// them there (`planner::worker_relations`).
pub const CERTIFICATE_DIRECTORY: &str = "tessera_certificates";

/// The name of role `role`'s certificate files, without extension: the
/// name's UTF-8 bytes in hex, whatever characters it has.
fn certificate_file_stem(role: &str) -> String {
    role.bytes().map(|b| format!("{b:02x}")).collect()
}

/// `provide_role_certificates` on each node of `nodes`, logged in as
/// `login` (a superuser); a node's failure names it.
pub async fn provide_on_nodes(nodes: &[ServerAddr], login: &Login, roles: Option<&[String]>) -> PgResult<()> {
    if node_credentials().is_none() {
        return Ok(());
    }
    for addr in nodes {
        let on_node = |e: PgError| e.map_message(|m| format!("could not store the roles' certificates on node {addr}: {m}"));
        let mut conn = PgConnection::connect(addr, login).await.map_err(on_node)?;
        let provided = provide_role_certificates(&mut conn, roles).await.map_err(on_node);
        conn.terminate().await;
        provided?;
    }
    Ok(())
}

/// Stores on a node (`conn`, a superuser's) the CA's certificate and the
/// certificates of `roles` (of every role the node has, when None) that it
/// lacks. Nothing of a key passes in a
/// statement's text (which the node may log): the files' lines go in by
/// COPY and out to the file by a program that makes it private.
async fn provide_role_certificates(conn: &mut PgConnection, roles: Option<&[String]>) -> PgResult<()> {
    let Some(credentials) = node_credentials() else { return Ok(()) };
    let dir = conn
        .query_value(&format!("SELECT current_setting('data_directory') || '/{CERTIFICATE_DIRECTORY}'"))
        .await?
        .ok_or_else(|| PgError::internal("the node did not name its data directory"))?;
    let present: HashSet<String> = conn
        .query(&format!("SELECT name FROM pg_catalog.pg_ls_dir({}, true, false) AS name", quote_literal(&dir)))
        .await?
        .into_iter()
        .filter_map(|row| row.into_iter().next().flatten())
        .collect();
    let roles: Vec<String> = match roles {
        Some(roles) => roles.to_vec(),
        None => role_names(conn).await?,
    };
    let mut files: Vec<(String, String)> = Vec::new();
    if !present.contains("root.crt") {
        files.push(("root.crt".into(), credentials.ca_pem.clone()));
    }
    for role in &roles {
        let stem = certificate_file_stem(role);
        if present.contains(&format!("{stem}.crt")) && present.contains(&format!("{stem}.key")) {
            continue;
        }
        let issued =
            credentials.ca.role_certificate(role).map_err(|e| PgError::internal(format!("could not sign a certificate for role {role}: {e}")))?;
        files.push((format!("{stem}.key"), issued.key_pem));
        files.push((format!("{stem}.crt"), issued.certificate_pem));
    }
    if files.is_empty() {
        return Ok(());
    }
    conn.execute("BEGIN; CREATE TEMPORARY TABLE tessera_file_lines (line text) ON COMMIT DROP").await?;
    let written = write_files(conn, &dir, &files).await;
    let end = if written.is_ok() { "COMMIT" } else { "ROLLBACK" };
    conn.execute(end).await?;
    written
}

/// The roles of the server at `conn` that log in or act (all but
/// PostgreSQL's own `pg_*` ones): those a certificate is made for.
pub async fn role_names(conn: &mut PgConnection) -> PgResult<Vec<String>> {
    let rows = conn.query("SELECT rolname FROM pg_catalog.pg_roles WHERE rolname !~ '^pg_'").await?;
    Ok(rows.into_iter().filter_map(|row| row.into_iter().next().flatten()).collect())
}

/// Writes each of `files` (name, text) into directory `dir` of the node,
/// readable by its server's user alone; a file appears whole or not at all.
async fn write_files(conn: &mut PgConnection, dir: &str, files: &[(String, String)]) -> PgResult<()> {
    for (name, text) in files {
        // PEM lines hold no tab or backslash: COPY's text format keeps them as they are.
        let lines: Vec<Bytes> = text.lines().map(|line| Bytes::from(format!("{line}\n"))).collect();
        conn.execute("TRUNCATE tessera_file_lines").await?;
        conn.copy_in("COPY tessera_file_lines FROM STDIN", lines).await?;
        let (dir, path) = (shell_word(dir), shell_word(&format!("{dir}/{name}")));
        let program = format!("umask 077 && mkdir -p {dir} && cat > {path}.part && mv {path}.part {path}");
        conn.execute(&format!("COPY tessera_file_lines TO PROGRAM {}", quote_literal(&program))).await?;
    }
    Ok(())
}

/// `value` as one word of a POSIX shell command.
fn shell_word(value: &str) -> String {
    format!("'{}'", value.replace('\'', r#"'"'"'"#))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn certificate_files_are_named_by_the_role_in_hex() {
        assert_eq!(certificate_file_stem("postgres"), "706f737467726573");
        assert_eq!(certificate_file_stem("a b/é"), "6120622fc3a9");
    }
}
