//! One HTTP/1.1 request over a fresh connection to the endpoint every daemon serves
//! (`/metrics`, `/status`, `/healthz`), read to the end: async for tokio tests, blocking for
//! tests of processes.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// An answer, split at the first empty line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    /// The status code (0 when the status line has none).
    pub code: u16,
    /// The status line as received, e.g. `HTTP/1.1 200 OK`.
    pub status_line: String,
    /// The status line and the headers, in lower case (header names are case-insensitive).
    pub head: String,
    /// Everything after the head.
    pub body: String,
}

impl Response {
    /// Splits the whole text of an answer.
    pub fn parse(bytes: &[u8]) -> Response {
        let text = String::from_utf8_lossy(bytes);
        let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
        let status_line = head.lines().next().unwrap_or("").to_string();
        let code = status_line
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .unwrap_or(0);
        Response {
            code,
            status_line,
            head: head.to_ascii_lowercase(),
            body: body.to_string(),
        }
    }
}

/// Why no answer was read.
#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    /// The connection was not accepted.
    #[error("connect: {0}")]
    Connect(io::Error),
    /// The request could not be written (the server closed or reset the connection).
    #[error("write: {0}")]
    Write(io::Error),
    /// The answer could not be read to its end (the server reset the connection).
    #[error("read: {0}")]
    Read(io::Error),
    /// The answer did not end within the time given.
    #[error("no whole answer within {0:?}")]
    Timeout(Duration),
}

/// `GET path` with a `host` header, as every test asks.
fn get_request(path: &str) -> Vec<u8> {
    format!("GET {path} HTTP/1.1\r\nhost: x\r\n\r\n").into_bytes()
}

/// Writes `request` as it is to `addr` and reads the answer until the server closes, within
/// `within`.
pub async fn request(
    addr: SocketAddr,
    request: &[u8],
    within: Duration,
) -> Result<Response, HttpError> {
    let mut s = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(HttpError::Connect)?;
    s.write_all(request).await.map_err(HttpError::Write)?;
    let mut buf = Vec::new();
    tokio::time::timeout(within, s.read_to_end(&mut buf))
        .await
        .map_err(|_| HttpError::Timeout(within))?
        .map_err(HttpError::Read)?;
    Ok(Response::parse(&buf))
}

/// `GET path` from `addr`, within [`crate::WAIT`].
pub async fn get(addr: SocketAddr, path: &str) -> Result<Response, HttpError> {
    request(addr, &get_request(path), crate::WAIT).await
}

/// [`request`] for tests without a runtime; `within` bounds each read.
pub fn request_blocking(
    addr: impl ToSocketAddrs,
    request: &[u8],
    within: Duration,
) -> Result<Response, HttpError> {
    let mut s = TcpStream::connect(addr).map_err(HttpError::Connect)?;
    s.set_read_timeout(Some(within))
        .map_err(HttpError::Connect)?;
    s.write_all(request).map_err(HttpError::Write)?;
    let mut buf = Vec::new();
    match s.read_to_end(&mut buf) {
        Ok(_) => Ok(Response::parse(&buf)),
        Err(e)
            if matches!(
                e.kind(),
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
            ) =>
        {
            Err(HttpError::Timeout(within))
        }
        Err(e) => Err(HttpError::Read(e)),
    }
}

/// [`get`] for tests without a runtime; `addr` as `ADDR:PORT`.
pub fn get_blocking(addr: impl ToSocketAddrs, path: &str) -> Result<Response, HttpError> {
    request_blocking(addr, &get_request(path), crate::WAIT)
}
