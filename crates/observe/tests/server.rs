//! The shared HTTP endpoint over real TCP on 127.0.0.1: paths, content types, exposition that
//! parses, and clients that are slow, too big or too many.

use rserpool_observe::server::{bind, Endpoint, Health, Limits};
use rserpool_observe::{Kind, MetricSet};
use rserpool_testkit::http::{self, HttpError};
use std::net::SocketAddr;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

fn metrics() -> String {
    let mut m = MetricSet::new();
    m.counter("rserpool_test_things_total", "Things counted.", 5);
    m.gauge("rserpool_test_now", "Things now.", 2);
    m.family(
        "rserpool_test_by_key_total",
        Kind::Counter,
        "Things by key.",
    )
    .sample(&[("key", "a \"quoted\" one")], 1)
    .sample(&[("key", "b")], 4);
    m.render()
}

async fn start(limits: Limits) -> (SocketAddr, rserpool_observe::server::ServerHandle) {
    let l = bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
    let addr = l.local_addr().unwrap();
    let h = Endpoint::new("test", metrics)
        .status(|| serde_json::json!({"answer": 42}))
        .limits(limits)
        .spawn(l);
    (addr, h)
}

/// One raw request; the status code, the headers (lower case) and the body.
async fn raw(addr: SocketAddr, request: &[u8]) -> (u16, String, String) {
    match http::request(addr, request, Duration::from_secs(30)).await {
        Ok(r) => (r.code, r.head, r.body),
        // A refused connection (reset at the connection limit) reads as code 0.
        Err(HttpError::Write(_) | HttpError::Read(_)) => (0, String::new(), String::new()),
        Err(e) => panic!("{e}"),
    }
}

async fn get(addr: SocketAddr, path: &str) -> (u16, String, String) {
    raw(
        addr,
        format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes(),
    )
    .await
}

#[tokio::test]
async fn serves_the_three_paths_with_their_content_types() {
    let (addr, _h) = start(Limits::default()).await;
    let (code, head, body) = get(addr, "/metrics").await;
    assert_eq!(code, 200);
    assert!(
        head.contains("content-type: application/openmetrics-text; version=1.0.0"),
        "{head}"
    );
    assert!(body.contains("rserpool_test_things_total 5\n"), "{body}");
    // The exposition parses (prometheus-parse reads the text format Prometheus reads).
    let lines = body.lines().map(|l| Ok(l.to_string()));
    let scrape = prometheus_parse::Scrape::parse(lines).expect("parses");
    let by_key: Vec<_> = scrape
        .samples
        .iter()
        .filter(|s| s.metric == "rserpool_test_by_key_total")
        .collect();
    assert_eq!(by_key.len(), 2);
    assert!(by_key
        .iter()
        .any(|s| s.labels.get("key") == Some("a \"quoted\" one")
            || s.labels.get("key") == Some("a \\\"quoted\\\" one")));
    assert!(scrape
        .samples
        .iter()
        .any(|s| s.metric == "rserpool_test_now"
            && matches!(s.value, prometheus_parse::Value::Gauge(v) if v == 2.0)));

    let (code, head, body) = get(addr, "/status").await;
    assert_eq!(code, 200);
    assert!(head.contains("content-type: application/json"), "{head}");
    let doc: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(doc["answer"], 42);
    assert_eq!(doc["component"], "test");

    let (code, head, body) = get(addr, "/healthz").await;
    assert_eq!(code, 200);
    assert!(head.contains("content-type: text/plain"), "{head}");
    assert_eq!(body, "ok\n");

    // With a query string, as some probes send it.
    assert_eq!(get(addr, "/healthz?verbose=1").await.0, 200);
}

#[tokio::test]
async fn unknown_paths_are_404_and_other_methods_405() {
    let (addr, _h) = start(Limits::default()).await;
    assert_eq!(get(addr, "/nothing").await.0, 404);
    assert_eq!(get(addr, "/metrics/x").await.0, 404);
    let (code, _, _) = raw(
        addr,
        b"POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n",
    )
    .await;
    assert_eq!(code, 405);
    // HEAD: the headers without the body.
    let (code, _, body) = raw(addr, b"HEAD /metrics HTTP/1.1\r\nHost: x\r\n\r\n").await;
    assert_eq!(code, 200);
    assert!(body.is_empty(), "{body}");
    // Garbage is refused, not answered with metrics.
    let (code, _, _) = raw(addr, b"\x16\x03\x01garbage\r\n\r\n").await;
    assert_ne!(code, 200);
}

#[tokio::test]
async fn failing_health_is_503_with_the_reason() {
    let l = bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
    let addr = l.local_addr().unwrap();
    let _h = Endpoint::new("test", metrics)
        .health_async(|| Box::pin(async { Health::Failing("event loop stuck".into()) }))
        .spawn(l);
    let (code, _, body) = get(addr, "/healthz").await;
    assert_eq!(code, 503);
    assert!(body.contains("event loop stuck"), "{body}");
}

#[tokio::test]
async fn an_oversized_request_head_is_refused() {
    let (addr, _h) = start(Limits::default()).await;
    let big = format!(
        "GET /metrics HTTP/1.1\r\nHost: x\r\nX-Big: {}\r\n\r\n",
        "a".repeat(64 * 1024)
    );
    let mut s = TcpStream::connect(addr).await.unwrap();
    // The server may close while we still write: that is a refusal too.
    let _ = s.write_all(big.as_bytes()).await;
    let mut buf = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(30), s.read_to_end(&mut buf))
        .await
        .expect("closed within 30 s");
    let text = String::from_utf8_lossy(&buf);
    assert!(
        text.is_empty() || text.starts_with("HTTP/1.1 431"),
        "no metrics for an oversized request: {text}"
    );
}

/// A client that opens connections and sends nothing (or half a request) holds no more than
/// its connection slots, and only for the request timeout: the endpoint keeps answering
/// others, and the silent connections are closed.
#[tokio::test]
async fn slow_and_silent_clients_do_not_stall_the_endpoint() {
    let limits = Limits {
        request_timeout: Duration::from_millis(500),
        max_request_bytes: 8192,
        max_connections: 4,
    };
    let (addr, _h) = start(limits).await;
    let mut silent = Vec::new();
    for i in 0..4 {
        let mut s = TcpStream::connect(addr).await.unwrap();
        if i % 2 == 0 {
            s.write_all(b"GET /metr").await.unwrap();
        }
        silent.push(s);
    }
    // Every slot is held for now; the timeout frees them, and an honest client is served
    // within a generous deadline.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let served = tokio::time::timeout(Duration::from_secs(10), get(addr, "/healthz")).await;
        if matches!(served, Ok((200, _, _))) {
            break;
        }
        assert!(Instant::now() < deadline, "never served again");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The silent connections were closed by the server (EOF or reset), not kept open.
    for mut s in silent {
        let mut buf = [0u8; 64];
        let r = tokio::time::timeout(Duration::from_secs(30), s.read(&mut buf))
            .await
            .expect("the server closes a silent connection");
        match r {
            Ok(0) | Err(_) => {}
            Ok(n) => {
                // An answer to the half request (408) is fine too; then it closes.
                let t = String::from_utf8_lossy(&buf[..n]);
                assert!(t.starts_with("HTTP/1.1 4"), "{t}");
            }
        }
    }
}

/// A client that sends its request and never reads the (large) answer is cut off at the
/// request timeout.
#[tokio::test]
async fn a_client_that_does_not_read_is_cut_off() {
    let l = bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
    let addr = l.local_addr().unwrap();
    let big = || {
        let mut m = MetricSet::new();
        let mut f = m.family("rserpool_test_big", Kind::Gauge, "Big.");
        for i in 0..200_000u64 {
            f.sample(&[("i", &i.to_string())], i);
        }
        m.render()
    };
    let _h = Endpoint::new("test", big)
        .limits(Limits {
            request_timeout: Duration::from_millis(1500),
            max_request_bytes: 8192,
            max_connections: 1,
        })
        .spawn(l);
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    // Not reading: the one slot is taken until the timeout ends the connection; then a second
    // client is served.
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        if let Ok((200, _, _)) =
            tokio::time::timeout(Duration::from_secs(20), get(addr, "/healthz")).await
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the non-reading client held the endpoint"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    drop(s);
}

#[tokio::test]
async fn a_bad_address_is_named_in_the_error() {
    // Port 1 needs privileges we do not have, or the address is not local: either way an error
    // that names it. 192.0.2.1 (TEST-NET-1) is on no interface.
    let e = bind("192.0.2.1:9100".parse().unwrap()).await.unwrap_err();
    let msg = e.to_string();
    assert!(msg.contains("192.0.2.1:9100"), "{msg}");
    assert!(msg.contains("metrics"), "{msg}");
}
