//! Just enough HTTP/1.1 for a read-only monitoring listener: one GET per
//! connection, answered whole and closed.

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// A request head larger than this is refused.
const MAX_HEAD: usize = 16 * 1024;

pub struct Request {
    pub method: String,
    /// The path without its query string.
    pub path: String,
    /// The password of a Basic `Authorization` header.
    pub password: Option<String>,
}

pub struct Response {
    pub status: u16,
    pub content_type: &'static str,
    pub body: Vec<u8>,
}

impl Response {
    pub fn ok(content_type: &'static str, body: impl Into<Vec<u8>>) -> Self {
        Response { status: 200, content_type, body: body.into() }
    }

    pub fn text(status: u16, body: &str) -> Self {
        Response { status, content_type: "text/plain; charset=utf-8", body: body.as_bytes().to_vec() }
    }
}

/// Reads a request head; None when the client sent no complete, sane one.
pub async fn read_request<S: AsyncRead + Unpin>(stream: &mut S) -> std::io::Result<Option<Request>> {
    let mut head = Vec::with_capacity(1024);
    let mut chunk = [0u8; 2048];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = stream.read(&mut chunk).await?;
        if n == 0 || head.len() + n > MAX_HEAD {
            return Ok(None);
        }
        head.extend_from_slice(&chunk[..n]);
    }
    let head = String::from_utf8_lossy(&head);
    let mut lines = head.split("\r\n");
    let mut request_line = lines.next().unwrap_or_default().split(' ');
    let (Some(method), Some(target)) = (request_line.next(), request_line.next()) else { return Ok(None) };
    let path = target.split('?').next().unwrap_or(target).to_string();
    let password = lines
        .filter_map(|line| line.split_once(':'))
        .find(|(name, _)| name.trim().eq_ignore_ascii_case("authorization"))
        .and_then(|(_, value)| basic_password(value.trim()));
    Ok(Some(Request { method: method.to_string(), path, password }))
}

/// The password of `Basic base64(user:password)`.
fn basic_password(value: &str) -> Option<String> {
    use base64::Engine as _;
    let (scheme, encoded) = value.split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    let decoded = base64::engine::general_purpose::STANDARD.decode(encoded.trim()).ok()?;
    let (_, password) = String::from_utf8(decoded).ok()?.split_once(':').map(|(u, p)| (u.to_string(), p.to_string()))?;
    Some(password)
}

pub async fn write_response<S: AsyncWrite + Unpin>(stream: &mut S, response: &Response) -> std::io::Result<()> {
    let reason = match response.status {
        200 => "OK",
        401 => "Unauthorized",
        404 => "Not Found",
        405 => "Method Not Allowed",
        _ => "Error",
    };
    let mut head = format!(
        "HTTP/1.1 {} {reason}\r\nContent-Type: {}\r\nContent-Length: {}\r\nCache-Control: no-store\r\nConnection: close\r\n",
        response.status,
        response.content_type,
        response.body.len()
    );
    if response.status == 401 {
        head.push_str("WWW-Authenticate: Basic realm=\"tessera\"\r\n");
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes()).await?;
    stream.write_all(&response.body).await?;
    stream.shutdown().await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_request_head_gives_its_path_and_basic_password() {
        let raw = b"GET /metrics?x=1 HTTP/1.1\r\nHost: h\r\nAuthorization: Basic dXNlcjpzM2NyZXQ=\r\n\r\n";
        let request = read_request(&mut &raw[..]).await.unwrap().unwrap();
        assert_eq!((request.method.as_str(), request.path.as_str(), request.password.as_deref()), ("GET", "/metrics", Some("s3cret")));
        assert!(read_request(&mut &b"GET / HTTP/1.1\r\n"[..]).await.unwrap().is_none());
    }
}
