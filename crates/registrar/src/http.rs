//! A minimal HTTP/1.1 responder for the metrics endpoint: `GET /metrics` (Prometheus text) and
//! `GET /healthz`. One request per connection, bounded request size, no keep-alive.

use crate::metrics::Metrics;
use std::sync::{Arc, Mutex};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// Largest request head read; larger requests get 431.
const MAX_REQUEST: usize = 8192;

/// Serves the metrics, rendered at each request, until the task is dropped.
pub(crate) async fn serve(
    listener: TcpListener,
    metrics: Arc<Mutex<Metrics>>,
    transport: rserpool_transport::EndpointHandle,
) {
    loop {
        let Ok((mut stream, _)) = listener.accept().await else {
            continue;
        };
        let metrics = metrics.clone();
        let transport = transport.clone();
        tokio::spawn(async move {
            let mut buf = vec![0u8; MAX_REQUEST];
            let mut len = 0;
            let head_end = loop {
                let read = tokio::time::timeout(
                    std::time::Duration::from_secs(5),
                    stream.read(&mut buf[len..]),
                )
                .await;
                match read {
                    Ok(Ok(0)) | Ok(Err(_)) | Err(_) => return,
                    Ok(Ok(n)) => len += n,
                }
                if let Some(i) = buf[..len].windows(4).position(|w| w == b"\r\n\r\n") {
                    break i;
                }
                if len == buf.len() {
                    let _ = stream
                        .write_all(b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
                        .await;
                    return;
                }
            };
            let head = String::from_utf8_lossy(&buf[..head_end]);
            let mut parts = head.split_whitespace();
            let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
            let (status, content_type, body) = match (method, path) {
                ("GET", "/metrics") => (
                    "200 OK",
                    "text/plain; version=0.0.4",
                    metrics
                        .lock()
                        .map(|m| {
                            // The transport's counters (TLS handshakes) as of now: a refused
                            // handshake wakes no registrar event that would copy them.
                            let mut m = m.clone();
                            m.set_transport(&transport.stats());
                            m.render_prometheus()
                        })
                        .unwrap_or_default(),
                ),
                ("GET", "/healthz") => ("200 OK", "text/plain", "ok\n".to_string()),
                ("GET", _) => ("404 Not Found", "text/plain", "not found\n".to_string()),
                _ => (
                    "405 Method Not Allowed",
                    "text/plain",
                    "only GET\n".to_string(),
                ),
            };
            let response = format!(
                "HTTP/1.1 {status}\r\ncontent-type: {content_type}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = stream.write_all(response.as_bytes()).await;
        });
    }
}
