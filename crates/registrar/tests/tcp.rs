//! The registrar over real sockets on loopback (the TCP mapping and plain TCP), driven by test
//! clients built on rserpool-wire and by the PE and PU drivers of rserpool-endpoint.

use rserpool_endpoint::driver::PoolUserClient;
use rserpool_endpoint::pu::{ResolveError, ResolverConfig};
use rserpool_registrar::{RateLimit, RemovalCause};
use rserpool_testkit::{
    deregistration, handle_resolution, http, pe_config, registered_pe, registration, tcp_pe, until,
    wait_for, AsapClient, TestRegistrar, LOCALHOST, WAIT,
};
use rserpool_wire::asap::AsapMessage;
use rserpool_wire::{
    CauseCode, Codec, PoolElement, PoolElementId, PoolHandle, PoolPolicy, RegistrarId,
};
use std::net::SocketAddr;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const LOCAL: &str = "127.0.0.1";

/// A PE of this host with TCP user transport on port 7000.
fn pe(id: u32) -> PoolElement {
    tcp_pe(id, LOCALHOST, 7000)
}

#[tokio::test]
async fn register_resolve_deregister_over_the_tcp_mapping() {
    let r = TestRegistrar::start(|_| {}).await;
    let mut pe_client = AsapClient::connect(r.asap_addr()).await.unwrap();
    pe_client
        .send(&registration("EchoPool", pe(1)))
        .await
        .unwrap();
    let m = pe_client.answer(WAIT).await.unwrap();
    assert!(
        matches!(&m, AsapMessage::RegistrationResponse(x) if !x.reject),
        "{m:?}"
    );

    let mut pu = AsapClient::connect(r.asap_addr()).await.unwrap();
    pu.send(&handle_resolution("EchoPool", None)).await.unwrap();
    let AsapMessage::HandleResolutionResponse(h) = pu.answer(WAIT).await.unwrap() else {
        panic!()
    };
    assert_eq!(h.pool_elements.len(), 1);
    assert_eq!(h.pool_elements[0].home_registrar, RegistrarId(0xabc));

    pe_client
        .send(&deregistration("EchoPool", 1))
        .await
        .unwrap();
    assert!(matches!(
        pe_client.answer(WAIT).await.unwrap(),
        AsapMessage::DeregistrationResponse(_)
    ));
    pu.send(&handle_resolution("EchoPool", None)).await.unwrap();
    let AsapMessage::HandleResolutionResponse(h) = pu.answer(WAIT).await.unwrap() else {
        panic!()
    };
    assert_eq!(h.error.unwrap().code(), Some(CauseCode::UnknownPoolHandle));
    let m = r.metrics();
    assert_eq!(
        (m.registrations, m.deregistrations, m.resolutions),
        (1, 1, 1)
    );
}

/// Sends `n` handle resolutions at once and counts the answers that arrive.
async fn burst_of_resolutions(r: &TestRegistrar, n: usize) -> usize {
    let mut pe_client = AsapClient::connect(r.asap_addr()).await.unwrap();
    pe_client
        .send(&registration("BurstPool", pe(1)))
        .await
        .unwrap();
    assert!(matches!(
        pe_client.answer(WAIT).await.unwrap(),
        AsapMessage::RegistrationResponse(_)
    ));
    let mut pu = AsapClient::connect(r.asap_addr()).await.unwrap();
    for _ in 0..n {
        pu.send(&handle_resolution("BurstPool", None))
            .await
            .unwrap();
    }
    let mut answers = 0;
    loop {
        let m = match pu.recv(Duration::from_secs(2)).await {
            Ok(m) => m,
            Err(e) if e.is_quiet() => break,
            Err(e) => panic!("{e}"),
        };
        assert!(
            matches!(&m, AsapMessage::HandleResolutionResponse(h) if h.pool_elements.len() == 1),
            "{m:?}"
        );
        answers += 1;
    }
    answers
}

#[tokio::test]
async fn answers_wait_for_room_in_the_transport_instead_of_being_dropped() {
    // A send queue of one message: a burst of answers finds it full at once.
    let r = TestRegistrar::start(|c| c.endpoint.limits.send_queue = 1).await;
    assert_eq!(burst_of_resolutions(&r, 200).await, 200);
    let m = r.metrics();
    assert_eq!(
        (m.resolutions, m.held_answers, m.dropped_answers),
        (200, 0, 0)
    );
}

#[tokio::test]
async fn answers_past_the_held_limit_are_dropped_and_counted() {
    let r = TestRegistrar::start(|c| {
        c.endpoint.limits.send_queue = 1;
        c.max_held_answers = 1;
    })
    .await;
    let answered = burst_of_resolutions(&r, 200).await;
    let m = r.metrics();
    assert_eq!(m.resolutions, 200);
    assert!(m.dropped_answers > 0, "{m:?}");
    assert_eq!(answered as u64 + m.dropped_answers, 200);
}

#[tokio::test]
async fn silent_pe_is_removed_after_the_keep_alive_timeout_and_lost_association_at_once() {
    let r = TestRegistrar::start(|c| {
        c.core.keep_alive_interval = Duration::from_millis(200);
        c.core.keep_alive_timeout = Duration::from_millis(300);
    })
    .await;
    let mut silent = AsapClient::connect(r.asap_addr()).await.unwrap();
    silent.send(&registration("P", pe(1))).await.unwrap();
    assert!(matches!(
        silent.answer(WAIT).await.unwrap(),
        AsapMessage::RegistrationResponse(_)
    ));
    // Never answers keep-alives: gone within interval × 1.25 + timeout (+ scheduling slack).
    let metrics = r.metrics.clone();
    wait_for("keep-alive timeout removal", Duration::from_secs(3), || {
        metrics
            .lock()
            .unwrap()
            .removals_by(RemovalCause::KeepAliveTimeout)
            == 1
    })
    .await;

    let gone = AsapClient::connect(r.asap_addr()).await.unwrap();
    gone.send(&registration("P", pe(2))).await.unwrap();
    wait_for("registration", Duration::from_secs(3), || {
        metrics.lock().unwrap().registrations == 2
    })
    .await;
    drop(gone);
    wait_for("association-lost removal", Duration::from_secs(3), || {
        metrics
            .lock()
            .unwrap()
            .removals_by(RemovalCause::AssociationLost)
            == 1
    })
    .await;
}

#[tokio::test]
async fn malformed_input_gets_an_error_and_other_clients_are_served() {
    let r = TestRegistrar::start(|_| {}).await;
    let mut bad = AsapClient::connect(r.asap_addr()).await.unwrap();
    let mut good = AsapClient::connect(r.asap_addr()).await.unwrap();
    bad.send_raw(vec![
        0x01, 0x00, 0x00, 0x10, 0x00, 0x09, 0x00, 0x20, 0, 0, 0, 0, 0, 0, 0, 0,
    ])
    .await
    .unwrap();
    let AsapMessage::Error(e) = bad.answer(WAIT).await.unwrap() else {
        panic!()
    };
    assert_eq!(e.error.code(), Some(CauseCode::InvalidValues));
    good.send(&handle_resolution("Nothing", None))
        .await
        .unwrap();
    assert!(matches!(
        good.answer(WAIT).await.unwrap(),
        AsapMessage::HandleResolutionResponse(_)
    ));
    // The bad client is still served too.
    bad.send(&handle_resolution("Nothing", None)).await.unwrap();
    assert!(matches!(
        bad.answer(WAIT).await.unwrap(),
        AsapMessage::HandleResolutionResponse(_)
    ));
}

#[tokio::test]
async fn handle_resolution_rate_limit_per_client() {
    let r = TestRegistrar::start(|c| {
        c.core.handle_resolution_rate = Some(RateLimit {
            rate: 0.5,
            burst: 2.0,
        })
    })
    .await;
    let mut pu = AsapClient::connect(r.asap_addr()).await.unwrap();
    let mut refused = 0;
    for _ in 0..5 {
        pu.send(&handle_resolution("P", None)).await.unwrap();
        if let AsapMessage::HandleResolutionResponse(h) = pu.answer(WAIT).await.unwrap() {
            if h.error.and_then(|e| e.code()) == Some(CauseCode::RejectedSecurity) {
                refused += 1;
            }
        }
    }
    assert_eq!(refused, 3);
    let mut other = AsapClient::connect(r.asap_addr()).await.unwrap();
    other.send(&handle_resolution("P", None)).await.unwrap();
    let AsapMessage::HandleResolutionResponse(h) = other.answer(WAIT).await.unwrap() else {
        panic!()
    };
    assert_eq!(
        h.error.and_then(|e| e.code()),
        Some(CauseCode::UnknownPoolHandle)
    );
}

#[tokio::test]
async fn plain_tcp_pool_users_resolve_without_the_frame_header() {
    let r = TestRegistrar::start(|c| {
        c.plain_tcp_listen = vec![format!("{LOCAL}:0").parse().unwrap()];
    })
    .await;
    let pe_client = AsapClient::connect(r.asap_addr()).await.unwrap();
    pe_client
        .send(&registration("EchoPool", pe(5)))
        .await
        .unwrap();
    let metrics = r.metrics.clone();
    wait_for("registration", Duration::from_secs(3), || {
        metrics.lock().unwrap().registrations == 1
    })
    .await;
    let codec = Codec::default();
    let mut s = tokio::net::TcpStream::connect(r.plain_tcp_addrs[0])
        .await
        .unwrap();
    s.write_all(&codec.encode(&handle_resolution("EchoPool", None)).unwrap())
        .await
        .unwrap();
    let mut head = [0u8; 4];
    s.read_exact(&mut head).await.unwrap();
    let len = Codec::frame_length(&head).unwrap();
    let mut body = vec![0u8; len - 4];
    s.read_exact(&mut body).await.unwrap();
    let mut msg = head.to_vec();
    msg.extend(body);
    let AsapMessage::HandleResolutionResponse(h) =
        codec.decode::<AsapMessage>(&msg).unwrap().message
    else {
        panic!()
    };
    assert_eq!(h.pool_elements[0].id, PoolElementId(5));
}

#[tokio::test]
async fn metrics_endpoint_serves_prometheus_text() {
    let r = TestRegistrar::start(|_| {}).await;
    let c = AsapClient::connect(r.asap_addr()).await.unwrap();
    c.send(&registration("P", pe(1))).await.unwrap();
    let metrics = r.metrics.clone();
    wait_for("registration", Duration::from_secs(3), || {
        metrics.lock().unwrap().registrations == 1
    })
    .await;
    let answer = http::get(r.metrics_addr.unwrap(), "/metrics")
        .await
        .unwrap();
    let text = &answer.body;
    assert!(
        answer.status_line.starts_with("HTTP/1.1 200 OK"),
        "{answer:?}"
    );
    assert!(
        text.contains("rserpool_registrar_registrations_total 1"),
        "{text}"
    );
    assert!(
        text.contains("rserpool_registrar_pool_elements 1"),
        "{text}"
    );
    assert!(text.contains("rserpool_registrar_removals_total{cause=\"keep_alive_timeout\"} 0"));
}

/// One GET over a fresh connection: the head (lower case) and the body.
async fn http_get(addr: SocketAddr, path: &str) -> (String, String) {
    let answer = http::get(addr, path).await.expect("an answer");
    (answer.head, answer.body)
}

#[tokio::test]
async fn http_endpoint_serves_status_healthz_and_404() {
    let r = TestRegistrar::start(|c| c.status_max_pools = 2).await;
    let c = AsapClient::connect(r.asap_addr()).await.unwrap();
    for (i, pool) in ["A", "B", "C"].iter().enumerate() {
        c.send(&registration(pool, pe(10 + i as u32)))
            .await
            .unwrap();
    }
    c.send(&registration("A", pe(20))).await.unwrap();
    let metrics = r.metrics.clone();
    wait_for("registrations", Duration::from_secs(30), || {
        metrics.lock().unwrap().registrations == 4
    })
    .await;
    let addr = r.metrics_addr.unwrap();

    let (head, body) = http_get(addr, "/metrics").await;
    assert!(head.starts_with("http/1.1 200"), "{head}");
    assert!(
        head.contains("content-type: application/openmetrics-text"),
        "{head}"
    );
    assert!(body.ends_with("# EOF\n"), "{body}");
    // Every sample line is `name{labels} value` with a rserpool_registrar_ name.
    for line in body.lines().filter(|l| !l.starts_with('#')) {
        let (name, value) = line.rsplit_once(' ').expect(line);
        assert!(name.starts_with("rserpool_registrar_"), "{line}");
        assert!(value.parse::<i64>().is_ok(), "{line}");
    }

    let (head, body) = http_get(addr, "/status").await;
    assert!(head.starts_with("http/1.1 200"), "{head}");
    assert!(head.contains("content-type: application/json"), "{head}");
    let doc: serde_json::Value = serde_json::from_str(&body).expect("JSON");
    assert_eq!(doc["component"], "registrar");
    assert_eq!(doc["registrar_id"], "$00000abc");
    assert_eq!(doc["pool_count"], 3);
    assert_eq!(doc["pool_element_count"], 4);
    // At most status_max_pools pools listed, the rest counted.
    let pools = doc["pools"].as_array().unwrap();
    assert_eq!(pools.len(), 2, "{doc}");
    assert_eq!(doc["pools_omitted"], 1);
    let a = pools
        .iter()
        .find(|p| p["handle"] == "A")
        .expect("pool A listed");
    assert_eq!(a["pool_elements"], 2);
    assert!(a["checksum"].as_str().unwrap().starts_with("0x"));
    assert_eq!(doc["counters"]["registrations"], 4);
    assert_eq!(doc["homes"][0]["home"], "$00000abc");
    assert_eq!(doc["homes"][0]["pool_elements"], 4);

    let (head, body) = http_get(addr, "/healthz").await;
    assert!(head.starts_with("http/1.1 200"), "{head}");
    assert_eq!(body, "ok\n");

    let (head, _) = http_get(addr, "/nothing").await;
    assert!(head.starts_with("http/1.1 404"), "{head}");
}

#[tokio::test]
async fn endpoint_drivers_register_resolve_and_report() {
    let r = TestRegistrar::start(|c| c.core.keep_alive_interval = Duration::from_millis(300)).await;
    let access = r.access();
    let mut handles = Vec::new();
    for port in [7001, 7002] {
        let at = SocketAddr::new(LOCALHOST, port);
        let config = pe_config("EchoPool", at, PoolPolicy::RoundRobin);
        let h = registered_pe(access.clone(), config, Duration::from_secs(5))
            .await
            .unwrap();
        handles.push(h);
    }
    let pu = PoolUserClient::start(
        ResolverConfig {
            items: Some(2),
            ..ResolverConfig::default()
        },
        access.clone(),
    )
    .await
    .unwrap();
    let res = pu.resolve(PoolHandle::from("EchoPool")).await.unwrap();
    assert_eq!(res.pool_elements.len(), 2);
    // Keep-alives are answered by the PE driver.
    let metrics = r.metrics.clone();
    wait_for("keep-alive answers", Duration::from_secs(5), || {
        metrics.lock().unwrap().keep_alives_acked >= 2
    })
    .await;
    assert!(handles[0].status().keep_alives >= 1);
    // Deregistration through the driver.
    let first = handles.remove(0);
    let id = first.id();
    first.deregister().await;
    let res = pu.resolve(PoolHandle::from("EchoPool")).await.unwrap();
    assert!(res.pool_elements.iter().all(|p| p.id != id));
    assert_eq!(
        pu.resolve(PoolHandle::from("Nowhere")).await,
        Err(ResolveError::UnknownPoolHandle)
    );
    // Unreachable reports at the threshold probe the other one; it answers and stays
    // (RFC 5352 §3.5: only a failed probe removes it).
    let other = handles[0].id();
    let acked_before = metrics.lock().unwrap().keep_alives_acked;
    for _ in 0..3 {
        pu.report_unreachable(PoolHandle::from("EchoPool"), other)
            .await;
    }
    // A report that finds a periodic keep-alive outstanding waits for that one instead of
    // probing: report again until a probe went out.
    until(
        "a probe for the reports",
        Duration::from_secs(20),
        async || {
            if metrics.lock().unwrap().unreachable_probes > 0 {
                return true;
            }
            pu.report_unreachable(PoolHandle::from("EchoPool"), other)
                .await;
            false
        },
    )
    .await;
    wait_for("the probe's answer", Duration::from_secs(10), || {
        metrics.lock().unwrap().keep_alives_acked > acked_before
    })
    .await;
    let res = pu.resolve(PoolHandle::from("EchoPool")).await.unwrap();
    assert!(res.pool_elements.iter().any(|p| p.id == other));
    assert_eq!(
        metrics
            .lock()
            .unwrap()
            .removals_by(RemovalCause::UnreachableReports),
        0
    );
}

#[tokio::test]
async fn server_announces_reach_the_multicast_group() {
    use rserpool_transport::multicast::{Interface, MulticastConfig, MulticastSocket};
    let port = 20_000 + (std::process::id() % 20_000) as u16;
    let group: SocketAddr = format!("239.255.77.7:{port}").parse().unwrap();
    let listener = MulticastSocket::open(&MulticastConfig {
        group,
        interfaces: vec![Interface::V4(LOCAL.parse().unwrap())],
        ttl: 1,
        loopback: true,
        max_datagram: 65_535,
    })
    .unwrap();
    let r = TestRegistrar::start(|c| {
        c.core.announce = Some(rserpool_registrar::AnnounceConfig {
            group,
            interval: Duration::from_millis(200),
            jitter: 0.125,
            transports: Vec::new(),
        });
    })
    .await;
    // No interface or TTL given: a registrar on loopback announces on the loopback interface
    // only, with TTL 1 (nothing leaves the host).
    assert_eq!(
        r.announces,
        vec![rserpool_registrar::driver::AnnounceSocket {
            group,
            interface: LOCAL.parse().unwrap(),
            ttl: 1,
        }]
    );
    let codec = Codec::default();
    let mut announces = 0;
    let until = tokio::time::Instant::now() + Duration::from_secs(5);
    while announces < 3 {
        let d = tokio::time::timeout_at(until, listener.recv())
            .await
            .expect("three announces within 5 s")
            .unwrap();
        let AsapMessage::ServerAnnounce(a) = codec.decode::<AsapMessage>(&d.data).unwrap().message
        else {
            panic!("not an announce")
        };
        assert_eq!(a.server_id, r.registrar_id);
        // The registrar listens on a specific address, so the announce says where.
        assert_eq!(a.transports.len(), 1);
        assert_eq!(a.transports[0].port, r.asap_addrs[0].port());
        assert_eq!(a.transports[0].addresses, vec![r.asap_addrs[0].ip()]);
        assert_eq!(
            a.transports[0].protocol,
            rserpool_wire::TransportProtocol::Tcp
        );
        announces += 1;
    }
    assert!(r.metrics.lock().unwrap().announces_sent >= 3);
}
