//! A small HTTP/1.1 responder for `GET /status` (JSON), `GET /metrics` (Prometheus text) and
//! `GET /healthz` (liveness of the gateway process).
//! One request per connection; requests are bounded in size and time.

use super::Shared;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// Largest request head read.
const MAX_REQUEST: usize = 8192;
/// Time a client has to send its request.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

pub(crate) async fn serve(shared: Arc<Shared>, l: TcpListener, mut stop: watch::Receiver<bool>) {
    loop {
        let (s, _) = tokio::select! {
            r = l.accept() => match r {
                Ok(x) => x,
                Err(e) => {
                    tracing::warn!(error = %e, "status accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = stop.changed() => break,
        };
        let shared = shared.clone();
        tokio::spawn(async move {
            let _ = tokio::time::timeout(REQUEST_TIMEOUT, answer(shared, s)).await;
        });
    }
}

async fn answer(shared: Arc<Shared>, mut s: TcpStream) -> std::io::Result<()> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") && !buf.windows(2).any(|w| w == b"\n\n") {
        let n = s.read(&mut chunk).await?;
        if n == 0 {
            break;
        }
        buf.extend_from_slice(&chunk[..n]);
        if buf.len() > MAX_REQUEST {
            return respond(
                &mut s,
                "431 Request Header Fields Too Large",
                "text/plain",
                b"request too large\n",
            )
            .await;
        }
    }
    let head = String::from_utf8_lossy(&buf);
    let mut parts = head.lines().next().unwrap_or("").split_whitespace();
    let method = parts.next().unwrap_or("");
    let target = parts.next().unwrap_or("");
    let path = target.split('?').next().unwrap_or("");
    if method != "GET" && method != "HEAD" {
        return respond(
            &mut s,
            "405 Method Not Allowed",
            "text/plain",
            b"only GET\n",
        )
        .await;
    }
    match path {
        "/metrics" => {
            let body = shared.lock().render_metrics();
            respond(
                &mut s,
                "200 OK",
                "text/plain; version=0.0.4",
                body.as_bytes(),
            )
            .await
        }
        "/status" => {
            let now = shared.now();
            let status = shared.lock().core.status(now);
            let body = serde_json::to_vec_pretty(&status)
                .unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}").into_bytes());
            respond(&mut s, "200 OK", "application/json", &body).await
        }
        "/healthz" => respond(&mut s, "200 OK", "text/plain", b"ok\n").await,
        "/" => {
            respond(
                &mut s,
                "200 OK",
                "text/plain",
                b"rserpool lsnat: GET /status (JSON), GET /metrics (Prometheus), GET /healthz\n",
            )
            .await
        }
        _ => respond(&mut s, "404 Not Found", "text/plain", b"not found\n").await,
    }
}

async fn respond(s: &mut TcpStream, status: &str, ctype: &str, body: &[u8]) -> std::io::Result<()> {
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).await?;
    s.write_all(body).await?;
    s.shutdown().await
}
