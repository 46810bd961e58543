//! The helpers themselves: failures come back as typed errors (no panic inside a helper that
//! is not an assertion), the registrar harness starts, serves and stops, and the waits give up
//! at their deadline naming what they waited for.

use rserpool_registrar::driver::DriverError;
use rserpool_testkit::http::{self, HttpError, Response};
use rserpool_testkit::{
    handle_resolution, registration, tcp_pe, until, wait_for, AsapClient, ClientError,
    NamedService, TestRegistrar, LOCALHOST, WAIT,
};
use rserpool_wire::asap::AsapMessage;
use rserpool_wire::{CauseCode, PoolElementId};
use std::net::SocketAddr;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[test]
fn a_response_is_split_into_code_status_line_head_and_body() {
    let r =
        Response::parse(b"HTTP/1.1 404 Not Found\r\nContent-Type: Text/Plain\r\n\r\nnope\r\n\r\nx");
    assert_eq!(r.code, 404);
    assert_eq!(r.status_line, "HTTP/1.1 404 Not Found");
    assert_eq!(r.head, "http/1.1 404 not found\r\ncontent-type: text/plain");
    assert_eq!(r.body, "nope\r\n\r\nx", "only the first empty line splits");
    let garbage = Response::parse(b"\x16\x03\x01");
    assert_eq!(garbage.code, 0);
    assert_eq!(garbage.body, "");
    assert_eq!(Response::parse(b"").code, 0);
}

#[tokio::test]
async fn the_registrar_serves_the_client_and_stops_cleanly() {
    let r = TestRegistrar::start(|c| c.status_max_pools = 5).await;
    assert_eq!(r.registrar_id, TestRegistrar::ID);
    assert!(r.asap_addr().ip().is_loopback());
    let mut pe = AsapClient::connect(r.asap_addr()).await.unwrap();
    pe.send(&registration("KitPool", tcp_pe(7, LOCALHOST, 7007)))
        .await
        .unwrap();
    let answer = pe.answer(WAIT).await.unwrap();
    assert!(
        matches!(&answer, AsapMessage::RegistrationResponse(x) if !x.reject && x.pe_id == PoolElementId(7)),
        "{answer:?}"
    );
    let mut pu = AsapClient::connect_from(r.asap_addr(), "127.0.0.2".parse().unwrap())
        .await
        .unwrap();
    pu.send(&handle_resolution("KitPool", None)).await.unwrap();
    let AsapMessage::HandleResolutionResponse(h) = pu.answer(WAIT).await.unwrap() else {
        panic!("not a handle resolution response")
    };
    assert_eq!(h.pool_elements.len(), 1);
    // Nothing more comes to the PU: a quiet timeout, not a failure.
    let e = pu.recv(Duration::from_millis(200)).await.unwrap_err();
    assert!(matches!(e, ClientError::Timeout(_)) && e.is_quiet(), "{e}");
    // Bytes that are not ASAP get an ASAP error back, decoded.
    pu.send_raw(vec![
        0x01, 0x00, 0x00, 0x10, 0x00, 0x09, 0x00, 0x20, 0, 0, 0, 0, 0, 0, 0, 0,
    ])
    .await
    .unwrap();
    let AsapMessage::Error(e) = pu.answer(WAIT).await.unwrap() else {
        panic!("not an error")
    };
    assert_eq!(e.error.code(), Some(CauseCode::InvalidValues));
    r.wait_metrics("the registration counted", WAIT, |m| m.registrations == 1)
        .await;
    assert_eq!(r.metrics().pool_elements, 1);
    let status = http::get(r.metrics_addr.unwrap(), "/status").await.unwrap();
    assert_eq!(status.code, 200, "{status:?}");
    assert!(status.head.contains("application/json"), "{status:?}");
    assert!(status.body.contains("\"pool_element_count\""), "{status:?}");

    let addr = r.asap_addr();
    r.stop().await.unwrap();
    // Stopped: the association ends and no new one comes up.
    let e = pe.recv(WAIT).await.unwrap_err();
    assert!(matches!(e, ClientError::Closed), "{e}");
    until("the listener to close", WAIT, async || {
        AsapClient::connect(addr).await.is_err()
    })
    .await;
}

#[tokio::test]
async fn a_registrar_that_cannot_bind_is_an_error_not_a_panic() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap();
    let e = match TestRegistrar::try_start(|c| c.asap_listen = vec![addr]).await {
        Err(e) => e,
        Ok(_) => panic!("started on a port in use"),
    };
    assert!(matches!(e, DriverError::Transport(_)), "{e}");
    assert!(e.to_string().contains(&addr.to_string()), "{e}");
}

#[tokio::test]
async fn failures_of_the_client_and_of_http_are_typed() {
    // A port nobody listens on: refused, as an error.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let nobody = closed.local_addr().unwrap();
    drop(closed);
    assert!(AsapClient::connect(nobody).await.is_err());
    assert!(matches!(
        http::get(nobody, "/metrics").await,
        Err(HttpError::Connect(_))
    ));
    assert!(matches!(
        http::get_blocking(nobody, "/metrics"),
        Err(HttpError::Connect(_))
    ));
    // A server that accepts and never answers: a timeout.
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let at = silent.local_addr().unwrap();
    let e = http::request(at, b"GET / HTTP/1.1\r\n\r\n", Duration::from_millis(200))
        .await
        .unwrap_err();
    assert!(matches!(e, HttpError::Timeout(_)), "{e}");
    let e = tokio::task::spawn_blocking(move || {
        http::request_blocking(at, b"GET / HTTP/1.1\r\n\r\n", Duration::from_millis(200))
    })
    .await
    .unwrap()
    .unwrap_err();
    assert!(matches!(e, HttpError::Timeout(_)), "{e}");
    drop(silent);
}

#[tokio::test]
async fn a_named_service_answers_with_its_name_until_dropped() {
    let s = NamedService::start("kit").await.unwrap();
    let addr: SocketAddr = s.addr();
    let mut c = tokio::net::TcpStream::connect(addr).await.unwrap();
    c.write_all(b"hi").await.unwrap();
    let mut name = String::new();
    tokio::time::timeout(WAIT, c.read_to_string(&mut name))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(name, "kit");
    drop(s);
    until("the listener to close", WAIT, async || {
        tokio::net::TcpStream::connect(addr).await.is_err()
    })
    .await;
}

#[tokio::test]
async fn waits_return_once_the_condition_holds() {
    let mut polls = 0;
    wait_for("three polls", WAIT, || {
        polls += 1;
        polls == 3
    })
    .await;
    assert_eq!(polls, 3);
    let mut n = 0;
    until("two polls", WAIT, async || {
        n += 1;
        n == 2
    })
    .await;
    assert_eq!(n, 2);
}

#[tokio::test]
#[should_panic(expected = "timed out waiting for the impossible")]
async fn wait_for_gives_up_at_its_deadline_naming_what() {
    wait_for("the impossible", Duration::from_millis(50), || false).await;
}

#[tokio::test]
#[should_panic(expected = "timed out waiting for the impossible")]
async fn until_gives_up_at_its_deadline_naming_what() {
    until("the impossible", Duration::from_millis(50), async || false).await;
}
