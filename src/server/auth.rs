//! Client authentication with SASL SCRAM-SHA-256 (RFC 5802, RFC 7677), the
//! server side, as PostgreSQL does it: the password is checked against the
//! role's verifier from `pg_authid` and never crosses the wire. No channel
//! binding is offered (the coordinator has no TLS), so only "SCRAM-SHA-256" is
//! advertised.
//!
//! `ScramExchange` is pure: it turns the client's two messages into the
//! server's two answers. The session does the I/O and the `pg_authid` lookup.
//! Every way of failing yields a `Rejected` whose reason is for the server log
//! only; the client always hears the same "password authentication failed".

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine;
use hmac::{Hmac, KeyInit, Mac};
use sha2::{Digest, Sha256};
use std::sync::OnceLock;

/// The one SASL mechanism offered.
pub const MECHANISM: &str = "SCRAM-SHA-256";

/// Random bytes in our half of the nonce (PostgreSQL uses 18 as well).
const SERVER_NONCE_BYTES: usize = 18;
/// Salt length and iteration count of the stand-in verifier used for roles
/// that have no SCRAM verifier (PostgreSQL's defaults).
const MOCK_SALT_BYTES: usize = 16;
const MOCK_ITERATIONS: u32 = 4096;

const KEY_LEN: usize = 32;
type Key = [u8; KEY_LEN];

/// The payload of AuthenticationSASL: the mechanism names, each NUL-terminated,
/// and an empty name to end the list.
pub fn mechanism_list() -> Vec<u8> {
    let mut list = MECHANISM.as_bytes().to_vec();
    list.extend_from_slice(b"\0\0");
    list
}

/// A fresh server nonce: random bytes in base64 (printable, no commas).
pub fn new_server_nonce() -> String {
    let bytes: [u8; SERVER_NONCE_BYTES] = rand::random();
    BASE64.encode(bytes)
}

/// A role's SCRAM-SHA-256 verifier as PostgreSQL stores it in `rolpassword`:
/// `SCRAM-SHA-256$<iterations>:<salt>$<StoredKey>:<ServerKey>` (base64 parts).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verifier {
    iterations: u32,
    salt: Vec<u8>,
    stored_key: Key,
    server_key: Key,
}

impl Verifier {
    /// None for anything else: NULL-less md5 hashes, plain text, garbage.
    pub fn parse(text: &str) -> Option<Verifier> {
        let rest = text.strip_prefix("SCRAM-SHA-256$")?;
        let (params, keys) = rest.split_once('$')?;
        let (iterations, salt) = params.split_once(':')?;
        let (stored_key, server_key) = keys.split_once(':')?;
        let iterations: u32 = iterations.parse().ok().filter(|&i| i > 0)?;
        let salt = BASE64.decode(salt).ok().filter(|s| !s.is_empty())?;
        let stored_key = BASE64.decode(stored_key).ok()?.try_into().ok()?;
        let server_key = BASE64.decode(server_key).ok()?.try_into().ok()?;
        Some(Verifier { iterations, salt, stored_key, server_key })
    }

    /// A stand-in for a role that does not exist or has no SCRAM verifier, so
    /// that the exchange looks the same to the client either way: the salt is
    /// stable per user name (asking twice reveals nothing) yet unpredictable
    /// without `secret`.
    pub fn mock(user: &str, secret: &[u8]) -> Verifier {
        let derive = |label: &[u8]| -> Key {
            let mut mac = new_mac(secret);
            mac.update(label);
            mac.update(user.as_bytes());
            mac.finalize().into_bytes().into()
        };
        Verifier {
            iterations: MOCK_ITERATIONS,
            salt: derive(b"salt\0")[..MOCK_SALT_BYTES].to_vec(),
            stored_key: derive(b"stored\0"),
            server_key: derive(b"server\0"),
        }
    }
}

/// A secret for this process's stand-in verifiers, drawn once.
fn mock_secret() -> &'static [u8; 32] {
    static SECRET: OnceLock<[u8; 32]> = OnceLock::new();
    SECRET.get_or_init(rand::random)
}

/// Why an exchange failed (for the log; never shown to the client).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rejected(pub &'static str);

impl std::fmt::Display for Rejected {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0)
    }
}

enum State {
    /// Waiting for SASLInitialResponse.
    Start,
    /// Server-first-message sent; waiting for the client's proof.
    Challenged {
        /// "n,," or "y,,": what the client-final's channel binding must echo.
        gs2_header: String,
        client_first_bare: String,
        server_first: String,
        /// Client nonce followed by ours.
        nonce: String,
    },
    /// Succeeded or failed; nothing more is accepted.
    Finished,
}

/// One client's SCRAM-SHA-256 exchange.
pub struct ScramExchange {
    verifier: Verifier,
    /// False when `verifier` is a stand-in: the exchange then always fails.
    genuine: bool,
    server_nonce: String,
    state: State,
}

impl ScramExchange {
    /// `stored` is the role's `rolpassword` (None when the role does not exist,
    /// has no password, or it has expired). Anything but a SCRAM verifier gets
    /// a stand-in so the failure comes only at the end, as in PostgreSQL.
    pub fn for_role(stored: Option<&str>, user: &str, server_nonce: String) -> ScramExchange {
        match stored.and_then(Verifier::parse) {
            Some(verifier) => ScramExchange::new(verifier, true, server_nonce),
            None => ScramExchange::new(Verifier::mock(user, mock_secret()), false, server_nonce),
        }
    }

    pub fn new(verifier: Verifier, genuine: bool, server_nonce: String) -> ScramExchange {
        ScramExchange { verifier, genuine, server_nonce, state: State::Start }
    }

    /// Takes the SASLInitialResponse (chosen mechanism and client-first-message)
    /// and returns the server-first-message for AuthenticationSASLContinue.
    pub fn client_first(&mut self, mechanism: &str, message: &[u8]) -> Result<String, Rejected> {
        if !matches!(self.state, State::Start) {
            return self.fail("client-first-message out of order");
        }
        if mechanism != MECHANISM {
            return self.fail("client selected an invalid SASL authentication mechanism");
        }
        let parsed = parse_client_first(message);
        let (gs2_header, client_first_bare, client_nonce) = match parsed {
            Ok(parts) => parts,
            Err(e) => return self.fail(e.0),
        };
        let nonce = format!("{client_nonce}{}", self.server_nonce);
        let server_first = format!("r={nonce},s={},i={}", BASE64.encode(&self.verifier.salt), self.verifier.iterations);
        self.state = State::Challenged {
            gs2_header: gs2_header.to_string(),
            client_first_bare: client_first_bare.to_string(),
            server_first: server_first.clone(),
            nonce,
        };
        Ok(server_first)
    }

    /// Takes the SASLResponse (client-final-message) and, when its proof shows
    /// the client knows the password, returns the server-final-message
    /// (`v=<ServerSignature>`) for AuthenticationSASLFinal.
    pub fn client_final(&mut self, message: &[u8]) -> Result<String, Rejected> {
        let State::Challenged { gs2_header, client_first_bare, server_first, nonce } = std::mem::replace(&mut self.state, State::Finished) else {
            return self.fail("client-final-message out of order");
        };
        let (without_proof, proof) = parse_client_final(message, &gs2_header, &nonce)?;
        let auth_message = format!("{client_first_bare},{server_first},{without_proof}");
        let client_signature = hmac(&self.verifier.stored_key, auth_message.as_bytes());
        let mut client_key = proof;
        for (k, s) in client_key.iter_mut().zip(client_signature) {
            *k ^= s;
        }
        let computed: Key = Sha256::digest(client_key).into();
        if !constant_time_eq(&computed, &self.verifier.stored_key) || !self.genuine {
            return Err(Rejected("invalid client proof"));
        }
        let server_signature = hmac(&self.verifier.server_key, auth_message.as_bytes());
        Ok(format!("v={}", BASE64.encode(server_signature)))
    }

    fn fail<T>(&mut self, why: &'static str) -> Result<T, Rejected> {
        self.state = State::Finished;
        Err(Rejected(why))
    }
}

/// Splits a client-first-message into its GS2 header, its bare part and the
/// client nonce:
/// `gs2-cbind-flag "," [authzid] "," ["m=…" ","] "n=" user "," "r=" nonce ["," ext…]`.
fn parse_client_first(message: &[u8]) -> Result<(&str, &str, &str), Rejected> {
    let text = std::str::from_utf8(message).map_err(|_| Rejected("client-first-message is not UTF-8"))?;
    let header_len = match text.as_bytes() {
        [b'n' | b'y', b',', ..] => 2,
        [b'p', b'=', ..] => return Err(Rejected("client requires channel binding, which is not offered")),
        _ => return Err(Rejected("malformed GS2 header")),
    };
    let after_flag = &text[header_len..];
    let header_len = if after_flag.starts_with(',') {
        header_len + 1
    } else if after_flag.starts_with("a=") {
        return Err(Rejected("authorization identities are not supported"));
    } else {
        return Err(Rejected("malformed GS2 header"));
    };
    let (gs2_header, bare) = text.split_at(header_len);
    let mut attributes = bare.split(',');
    // The user name is ignored: the start-up packet's user is the one logging in.
    match attributes.next() {
        Some(a) if a.starts_with("m=") => return Err(Rejected("mandatory extensions are not supported")),
        Some(a) if a.starts_with("n=") => {}
        _ => return Err(Rejected("client-first-message lacks the user name")),
    }
    let client_nonce = match attributes.next().and_then(|a| a.strip_prefix("r=")) {
        Some(n) if !n.is_empty() && n.bytes().all(is_nonce_char) => n,
        _ => return Err(Rejected("client-first-message lacks a valid nonce")),
    };
    if !attributes.all(is_attribute) {
        return Err(Rejected("malformed extension in client-first-message"));
    }
    Ok((gs2_header, bare, client_nonce))
}

/// Checks a client-final-message (`"c=" b64(gs2-header) "," "r=" nonce
/// ["," ext…] "," "p=" b64(proof)`) against the exchange so far; returns the
/// part before the proof (it ends the AuthMessage) and the proof.
fn parse_client_final<'a>(message: &'a [u8], gs2_header: &str, nonce: &str) -> Result<(&'a str, Key), Rejected> {
    let text = std::str::from_utf8(message).map_err(|_| Rejected("client-final-message is not UTF-8"))?;
    let (without_proof, proof) = text.rsplit_once(",p=").ok_or(Rejected("client-final-message lacks the proof"))?;
    let proof: Key = BASE64.decode(proof).ok().and_then(|p| p.try_into().ok()).ok_or(Rejected("malformed client proof"))?;
    let mut attributes = without_proof.split(',');
    let binding = attributes.next().and_then(|a| a.strip_prefix("c=")).ok_or(Rejected("client-final-message lacks channel binding"))?;
    if BASE64.decode(binding).ok().as_deref() != Some(gs2_header.as_bytes()) {
        return Err(Rejected("unexpected channel binding data"));
    }
    if attributes.next().and_then(|a| a.strip_prefix("r=")) != Some(nonce) {
        return Err(Rejected("nonce does not match"));
    }
    if !attributes.all(is_attribute) {
        return Err(Rejected("malformed extension in client-final-message"));
    }
    Ok((without_proof, proof))
}

/// Printable ASCII except the comma.
fn is_nonce_char(b: u8) -> bool {
    (0x21..=0x7e).contains(&b) && b != b','
}

/// `letter "=" value`.
fn is_attribute(a: &str) -> bool {
    matches!(a.as_bytes(), [l, b'=', ..] if l.is_ascii_alphabetic())
}

fn new_mac(key: &[u8]) -> Hmac<Sha256> {
    <Hmac<Sha256> as KeyInit>::new_from_slice(key).expect("HMAC takes keys of any length")
}

fn hmac(key: &[u8], data: &[u8]) -> Key {
    let mut mac = new_mac(key);
    mac.update(data);
    mac.finalize().into_bytes().into()
}

/// Equality whose time does not depend on where the inputs differ.
fn constant_time_eq(a: &Key, b: &Key) -> bool {
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    // RFC 7677 section 3: user "user", password "pencil".
    const PASSWORD: &str = "pencil";
    const SALT: &str = "W22ZaJ0SNY7soEsUEjb6gQ==";
    const CLIENT_FIRST: &str = "n,,n=user,r=rOprNGfwEbeRWgbNEkqO";
    const SERVER_NONCE: &str = "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0";
    const SERVER_FIRST: &str = "r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096";
    const CLIENT_FINAL: &str = "c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=";
    const SERVER_FINAL: &str = "v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=";

    /// Hi(password, salt, i) of RFC 5802 (PBKDF2 with HMAC-SHA-256, one block).
    fn salted_password(password: &str, salt: &[u8], iterations: u32) -> Key {
        let mut first = salt.to_vec();
        first.extend_from_slice(&1u32.to_be_bytes());
        let mut u = hmac(password.as_bytes(), &first);
        let mut result = u;
        for _ in 1..iterations {
            u = hmac(password.as_bytes(), &u);
            for (r, x) in result.iter_mut().zip(u) {
                *r ^= x;
            }
        }
        result
    }

    /// The verifier PostgreSQL would store for `password`, in its text form.
    fn verifier_text(password: &str, salt_b64: &str, iterations: u32) -> String {
        let salted = salted_password(password, &BASE64.decode(salt_b64).unwrap(), iterations);
        let stored_key: Key = Sha256::digest(hmac(&salted, b"Client Key")).into();
        let server_key = hmac(&salted, b"Server Key");
        format!("SCRAM-SHA-256${iterations}:{salt_b64}${}:{}", BASE64.encode(stored_key), BASE64.encode(server_key))
    }

    fn rfc_exchange() -> ScramExchange {
        let text = verifier_text(PASSWORD, SALT, 4096);
        ScramExchange::for_role(Some(&text), "user", SERVER_NONCE.to_string())
    }

    /// The client-final-message a client knowing `password` sends.
    fn client_final_for(password: &str, gs2_header: &str, client_first_bare: &str, server_first: &str) -> String {
        let nonce = server_first.split(',').next().unwrap();
        let salt = server_first.split(",s=").nth(1).unwrap().split(',').next().unwrap();
        let iterations: u32 = server_first.rsplit_once(",i=").unwrap().1.parse().unwrap();
        let salted = salted_password(password, &BASE64.decode(salt).unwrap(), iterations);
        let client_key = hmac(&salted, b"Client Key");
        let stored_key: Key = Sha256::digest(client_key).into();
        let without_proof = format!("c={},{nonce}", BASE64.encode(gs2_header));
        let signature = hmac(&stored_key, format!("{client_first_bare},{server_first},{without_proof}").as_bytes());
        let proof: Vec<u8> = client_key.iter().zip(signature).map(|(k, s)| k ^ s).collect();
        format!("{without_proof},p={}", BASE64.encode(proof))
    }

    #[test]
    fn rfc7677_example() {
        let mut exchange = rfc_exchange();
        assert_eq!(exchange.client_first(MECHANISM, CLIENT_FIRST.as_bytes()).unwrap(), SERVER_FIRST);
        assert_eq!(exchange.client_final(CLIENT_FINAL.as_bytes()).unwrap(), SERVER_FINAL);
        // Nothing after the end.
        assert!(exchange.client_final(CLIENT_FINAL.as_bytes()).is_err());
    }

    #[test]
    fn verifier_parses_postgres_format() {
        let v = Verifier::parse(&verifier_text(PASSWORD, SALT, 4096)).unwrap();
        assert_eq!(v.iterations, 4096);
        assert_eq!(BASE64.encode(&v.salt), SALT);
        for bad in [
            "md53175bce1d3201d16594cebf9d7eb3f9d",
            "pencil",
            "",
            "SCRAM-SHA-256$4096:W22ZaJ0SNY7soEsUEjb6gQ==",
            "SCRAM-SHA-256$0:W22ZaJ0SNY7soEsUEjb6gQ==$AAAA:AAAA",
            "SCRAM-SHA-256$4096:W22ZaJ0SNY7soEsUEjb6gQ==$AAAA:AAAA",
            "SCRAM-SHA-256$x:W22ZaJ0SNY7soEsUEjb6gQ==$AAAA:AAAA",
        ] {
            assert!(Verifier::parse(bad).is_none(), "{bad}");
        }
    }

    #[test]
    fn wrong_password_is_rejected() {
        let mut exchange = ScramExchange::for_role(Some(&verifier_text(PASSWORD, SALT, 4096)), "user", "srv".into());
        let server_first = exchange.client_first(MECHANISM, b"n,,n=,r=abc").unwrap();
        let wrong = client_final_for("pencil2", "n,,", "n=,r=abc", &server_first);
        assert_eq!(exchange.client_final(wrong.as_bytes()), Err(Rejected("invalid client proof")));

        let mut exchange = ScramExchange::for_role(Some(&verifier_text(PASSWORD, SALT, 4096)), "user", "srv".into());
        let server_first = exchange.client_first(MECHANISM, b"n,,n=,r=abc").unwrap();
        let right = client_final_for(PASSWORD, "n,,", "n=,r=abc", &server_first);
        assert!(exchange.client_final(right.as_bytes()).unwrap().starts_with("v="));
    }

    #[test]
    fn tampered_proof_is_rejected() {
        let mut exchange = rfc_exchange();
        exchange.client_first(MECHANISM, CLIENT_FIRST.as_bytes()).unwrap();
        let tampered = CLIENT_FINAL.replace("p=dHzb", "p=dHzc");
        assert!(exchange.client_final(tampered.as_bytes()).is_err());
    }

    #[test]
    fn cbind_flag_y_is_accepted_when_echoed() {
        let mut exchange = ScramExchange::for_role(Some(&verifier_text(PASSWORD, SALT, 4096)), "user", "srv".into());
        let server_first = exchange.client_first(MECHANISM, b"y,,n=,r=abc").unwrap();
        let right = client_final_for(PASSWORD, "y,,", "n=,r=abc", &server_first);
        assert!(right.starts_with("c=eSws,"));
        assert!(exchange.client_final(right.as_bytes()).is_ok());

        // "y" in the first message but "n" echoed back: a downgrade, refused.
        let mut exchange = ScramExchange::for_role(Some(&verifier_text(PASSWORD, SALT, 4096)), "user", "srv".into());
        let server_first = exchange.client_first(MECHANISM, b"y,,n=,r=abc").unwrap();
        let mismatched = client_final_for(PASSWORD, "n,,", "n=,r=abc", &server_first);
        assert_eq!(exchange.client_final(mismatched.as_bytes()), Err(Rejected("unexpected channel binding data")));
    }

    #[test]
    fn malformed_client_first_is_rejected() {
        for bad in [
            &b""[..],
            b"garbage",
            b"n,,",
            b"n,,n=user",
            b"n,,r=abc",
            b"n,,n=user,r=",
            b"n,,n=user,r=a b",
            b"n,,n=user,r=abc,junk",
            b"n,n=user,r=abc",
            b"x,,n=user,r=abc",
            b"p=tls-server-end-point,,n=user,r=abc",
            b"n,a=admin,n=user,r=abc",
            b"n,,m=ext,n=user,r=abc",
            b"n,,n=user,r=ab\xffc",
        ] {
            let mut exchange = rfc_exchange();
            assert!(exchange.client_first(MECHANISM, bad).is_err(), "{:?}", String::from_utf8_lossy(bad));
            // A failed exchange stays failed.
            assert!(exchange.client_first(MECHANISM, CLIENT_FIRST.as_bytes()).is_err());
        }
        let mut exchange = rfc_exchange();
        assert!(exchange.client_first("SCRAM-SHA-256-PLUS", CLIENT_FIRST.as_bytes()).is_err());
        // Extensions after the nonce are allowed and ignored.
        let mut exchange = rfc_exchange();
        assert!(exchange.client_first(MECHANISM, b"n,,n=,r=abc,x=1").is_ok());
    }

    #[test]
    fn malformed_client_final_is_rejected() {
        let nonce = "rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0";
        let proof = "dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=";
        for bad in [
            String::new(),
            "garbage".to_string(),
            format!("c=biws,r={nonce}"),
            format!("c=biws,r={nonce},p="),
            format!("c=biws,r={nonce},p=AAAA"),
            format!("c=biws,r={nonce},p=!!!!"),
            format!("r={nonce},p={proof}"),
            format!("c=eSws,r={nonce},p={proof}"),
            format!("c=biws,r=rOprNGfwEbeRWgbNEkqO,p={proof}"),
            format!("c=biws,r={nonce}x,p={proof}"),
            format!("c=biws,r={nonce},junk,p={proof}"),
        ] {
            let mut exchange = rfc_exchange();
            exchange.client_first(MECHANISM, CLIENT_FIRST.as_bytes()).unwrap();
            assert!(exchange.client_final(bad.as_bytes()).is_err(), "{bad}");
        }
        // The final message before the first one.
        let mut exchange = rfc_exchange();
        assert!(exchange.client_final(CLIENT_FINAL.as_bytes()).is_err());
    }

    #[test]
    fn roles_without_a_scram_verifier_fail_only_at_the_end() {
        for stored in [None, Some("md53175bce1d3201d16594cebf9d7eb3f9d"), Some("pencil")] {
            let mut exchange = ScramExchange::for_role(stored, "user", "srv".into());
            let server_first = exchange.client_first(MECHANISM, b"n,,n=,r=abc").unwrap();
            assert!(server_first.starts_with("r=abcsrv,s=") && server_first.ends_with(",i=4096"), "{server_first}");
            let attempt = client_final_for("pencil", "n,,", "n=,r=abc", &server_first);
            assert_eq!(exchange.client_final(attempt.as_bytes()), Err(Rejected("invalid client proof")));
        }
        // The stand-in's salt is stable per user (so probing twice reveals nothing) and differs between users.
        let salt_of = |user: &str| {
            let mut exchange = ScramExchange::for_role(None, user, "srv".into());
            exchange.client_first(MECHANISM, b"n,,n=,r=abc").unwrap().split(",s=").nth(1).unwrap().to_string()
        };
        assert_eq!(salt_of("nobody"), salt_of("nobody"));
        assert_ne!(salt_of("nobody"), salt_of("somebody"));
        // Even the stand-in's own keys are refused.
        let v = Verifier::mock("user", b"secret");
        let mut exchange = ScramExchange::new(v, false, "srv".into());
        exchange.client_first(MECHANISM, b"n,,n=,r=abc").unwrap();
        assert!(exchange.client_final(b"c=biws,r=abcsrv,p=AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=").is_err());
    }

    #[test]
    fn mechanism_list_and_nonce_shape() {
        assert_eq!(mechanism_list(), b"SCRAM-SHA-256\0\0");
        let nonce = new_server_nonce();
        assert_eq!(nonce.len(), 24);
        assert!(nonce.bytes().all(is_nonce_char));
        assert_ne!(nonce, new_server_nonce());
    }
}
