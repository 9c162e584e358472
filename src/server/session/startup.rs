//! A session's start: TLS and cancel requests, the start-up packet, limits
//! on clients, password authentication (SCRAM-SHA-256) and the first
//! connections on the client's behalf; then the session serves.

use super::*;

pub async fn run(coordinator: Arc<Coordinator>, front: Arc<Front>, stream: Stream) -> anyhow::Result<()> {
    let mut client = ClientConn::new(stream);
    let counted = ClientCount::enter(&coordinator);
    let params = loop {
        let Some(packet) = client.recv_startup().await? else { return Ok(()) };
        match frontend::decode_startup(&packet)? {
            StartupPacket::SslRequest => match &front.tls {
                Some(tls) if client.is_clear_tcp() => {
                    client.write_now(b"S").await?;
                    client = ClientConn::new(client.into_stream()?.accept_tls(tls).await?);
                }
                _ => client.write_now(b"N").await?,
            },
            StartupPacket::GssEncRequest => client.write_now(b"N").await?,
            StartupPacket::Cancel { process_id, secret_key } => {
                coordinator.cancel((process_id, secret_key)).await;
                return Ok(());
            }
            StartupPacket::Startup { params } => break params,
        }
    };
    let get = |k: &str| params.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
    let user = get("user").unwrap_or_default();
    let database = get("database").unwrap_or_else(|| user.clone());
    if user.is_empty() {
        return refuse(&mut client, PgError::new("28000", "no PostgreSQL user name specified in startup packet")).await;
    }
    if counted.over_limit {
        return refuse(
            &mut client,
            PgError::new(sqlstate::TOO_MANY_CONNECTIONS, "sorry, too many clients already").with_hint(format!(
                "The coordinator accepts {} clients at once ([connections] max_clients).",
                coordinator.config.connections.max_clients
            )),
        )
        .await;
    }
    if client.is_clear_tcp() && coordinator.config.tls.as_ref().is_some_and(|tls| tls.mode == TlsMode::Require) {
        return refuse(
            &mut client,
            PgError::new("28000", format!("the coordinator accepts user \"{user}\" over TCP only with TLS (tls.mode = \"require\")"))
                .with_hint("Connect with sslmode=require, or over the Unix socket."),
        )
        .await;
    }
    if get("replication").is_some() {
        return refuse(&mut client, PgError::not_supported("replication connections are not supported by the Tessera coordinator")).await;
    }
    if coordinator.config.auth == AuthMethod::ScramSha256 {
        let outcome = tokio::time::timeout(AUTH_TIMEOUT, scram_login(&coordinator, &front.logins, &mut client, &user)).await;
        match outcome {
            Ok(Ok(Authentication::Passed)) => {}
            Ok(Ok(Authentication::Refused(e))) => return refuse(&mut client, e).await,
            Ok(Ok(Authentication::Abandoned)) => return Ok(()),
            Ok(Err(e)) => return Err(e.context("during authentication")),
            Err(_) => return Err(anyhow::anyhow!("authentication of user \"{user}\" timed out")),
        }
    }
    let options: Vec<(String, String)> = params.iter().filter(|(k, _)| k != "user" && k != "database").cloned().collect();
    let local_login_user = user.clone();
    let local_login = Login {
        user: user.clone(),
        database: database.clone(),
        password: coordinator.config.coordinator_db.password.clone(),
        options: options.clone(),
    };
    let key = crate::process::new_session_key();
    let worker_options: Vec<(String, String)> =
        options.into_iter().filter(|(k, _)| WORKER_PARAMETERS.iter().any(|p| p.eq_ignore_ascii_case(k))).collect();
    let worker_login = Login {
        user,
        database: coordinator.config.coordinator_db.database.clone(),
        password: coordinator.config.coordinator_db.password.clone(),
        options: worker_options,
    };
    let mut parts = coordinator.participants(key, local_login, worker_login);
    let facts = match parts.check_login().await {
        Ok(facts) => {
            front.logins.remember_login(parts.login_key(), &facts);
            facts
        }
        Err(e) => match front.logins.recall_login(parts.login_key()).filter(|_| e.is_node_unreachable()) {
            Some(facts) => {
                tracing::warn!(
                    "the coordinator database is unreachable ({}); a login of user \"{}\" goes ahead as the last one did",
                    e.message(),
                    parts.login().user
                );
                parts.assume_login(&facts);
                facts
            }
            None => {
                coordinator.unregister_session(key);
                return refuse(&mut client, e).await;
            }
        },
    };
    client.authenticated();
    backend::authentication_ok(client.out());
    for (k, v) in &facts.server_params {
        backend::parameter_status(client.out(), k, v);
    }
    backend::backend_key_data(client.out(), key.0, key.1);
    backend::ready_for_query(client.out(), backend::TxStatus::Idle);
    client.flush().await?;
    let distributed = database == coordinator.config.coordinator_db.database;
    let mut session = Session {
        coordinator: coordinator.clone(),
        client,
        parts,
        distributed,
        plans: HashMap::new(),
        block_catalog: None,
        block_catalog_loads: 0,
        stream: None,
        shells: ShellAnswers::default(),
        catalog_version: 0,
        statements: HashMap::new(),
        portals: HashMap::new(),
        sql_prepared: HashMap::new(),
        local_expected: 0,
        local_unsynced: false,
        user_code_unsynced: false,
        skip_until_sync: false,
        release_work: false,
        abandoned: false,
        search_path: SearchPath { stale: !facts.search_path_public, ..SearchPath::default() },
        query_text: String::new(),
        ran_tier: None,
        normalized: HashMap::default(),
        stats_user: Arc::from(local_login_user.as_str()),
    };
    // A client that logs in and waits holds no connection meanwhile.
    session.parts.release_connections(true).await;
    let result = session.serve().await;
    coordinator.unregister_session(key);
    if !session.abandoned {
        if session.parts.in_block() {
            session.parts.rollback().await.ok();
        }
        session.parts.close().await;
    }
    result
}

/// How long a client may take to authenticate (PostgreSQL's `authentication_timeout`).
const AUTH_TIMEOUT: Duration = Duration::from_secs(60);

/// AuthenticationSASL, AuthenticationSASLContinue and AuthenticationSASLFinal.
const AUTH_SASL: i32 = 10;
const AUTH_SASL_CONTINUE: i32 = 11;
const AUTH_SASL_FINAL: i32 = 12;

/// How a client's password exchange ended.
enum Authentication {
    /// AuthenticationSASLFinal is buffered; AuthenticationOk follows once the
    /// session's connections are up.
    Passed,
    /// Refuse the connection with this error.
    Refused(PgError),
    /// The client hung up part-way (as libpq does to prompt for a password).
    Abandoned,
}

/// Runs SASL SCRAM-SHA-256 with the client against the role's verifier in the
/// coordinator database. Every way of failing looks the same to the client,
/// as in PostgreSQL; the reason goes to the log.
async fn scram_login(coordinator: &Coordinator, logins: &LoginMemory, client: &mut ClientConn, user: &str) -> anyhow::Result<Authentication> {
    let stored = match stored_password(coordinator, user).await {
        Ok(stored) => {
            logins.remember_verifier(user, stored.clone());
            stored
        }
        Err(e) => match logins.recall_verifier(user).filter(|_| e.is_node_unreachable()) {
            Some(stored) => {
                tracing::warn!(
                    "the coordinator database is unreachable ({}); user \"{user}\" is checked against the password it had last time",
                    e.message()
                );
                stored
            }
            None => {
                tracing::warn!("could not look up the password of user \"{user}\": {e}");
                return Ok(Authentication::Refused(e));
            }
        },
    };
    let mut exchange = auth::ScramExchange::for_role(stored.as_deref(), user, auth::new_server_nonce());
    backend::authentication_sasl(client.out(), AUTH_SASL, &auth::mechanism_list());
    client.flush().await?;
    let Some(msg) = client.recv().await? else { return Ok(Authentication::Abandoned) };
    let server_first = match (msg.tag(), frontend::decode_sasl_initial_response(&msg)) {
        (b'p', Ok((mechanism, data))) => exchange.client_first(mechanism, data.unwrap_or_default()),
        _ => Err(auth::Rejected("expected a SASLInitialResponse message")),
    };
    let server_first = match server_first {
        Ok(message) => message,
        Err(why) => return Ok(password_failed(user, why)),
    };
    backend::authentication_sasl(client.out(), AUTH_SASL_CONTINUE, server_first.as_bytes());
    client.flush().await?;
    let Some(msg) = client.recv().await? else { return Ok(Authentication::Abandoned) };
    let server_final = match msg.tag() {
        b'p' => exchange.client_final(msg.body()),
        _ => Err(auth::Rejected("expected a SASLResponse message")),
    };
    match server_final {
        Ok(message) => {
            backend::authentication_sasl(client.out(), AUTH_SASL_FINAL, message.as_bytes());
            Ok(Authentication::Passed)
        }
        Err(why) => Ok(password_failed(user, why)),
    }
}

fn password_failed(user: &str, why: auth::Rejected) -> Authentication {
    tracing::info!("password authentication failed for user \"{user}\": {why}");
    Authentication::Refused(PgError::new(sqlstate::INVALID_PASSWORD, format!("password authentication failed for user \"{user}\"")))
}

/// The role's `rolpassword` unless it has expired; None for unknown roles.
/// Read with the coordinator's own login, which must be allowed to read
/// `pg_authid` (a superuser).
async fn stored_password(coordinator: &Coordinator, user: &str) -> PgResult<Option<String>> {
    let config = &coordinator.config;
    let addr = config.coordinator_db_addr();
    let mut conn =
        PgConnection::connect(&addr, &config.service_login()).await.map_err(|e| crate::transaction::coordinator_db::unavailable(&addr, e))?;
    let sql = format!(
        "SELECT rolpassword FROM pg_catalog.pg_authid WHERE rolname = {} AND (rolvaliduntil IS NULL OR rolvaliduntil > now())",
        quote_literal(user)
    );
    let stored = conn.query_value(&sql).await;
    conn.terminate().await;
    stored
}

/// Counts a client among those connected, for as long as it lives.
struct ClientCount<'a> {
    coordinator: &'a Coordinator,
    over_limit: bool,
}

impl<'a> ClientCount<'a> {
    fn enter(coordinator: &'a Coordinator) -> Self {
        let before = coordinator.clients.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        ClientCount { coordinator, over_limit: before >= coordinator.config.connections.max_clients }
    }
}

impl Drop for ClientCount<'_> {
    fn drop(&mut self) {
        self.coordinator.clients.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
    }
}
