//! The registrar over real sockets on loopback (the TCP mapping and plain TCP), driven by test
//! clients built on rserpool-wire and by the PE and PU drivers of rserpool-endpoint.

use rserpool_endpoint::driver::{PoolElementHandle, PoolUserClient, RegistrarAccess};
use rserpool_endpoint::pe::PoolElementConfig;
use rserpool_endpoint::pu::{ResolveError, ResolverConfig};
use rserpool_registrar::driver::{run, DriverConfig, Running};
use rserpool_registrar::{AddressScope, Profile, RateLimit, RegistrarConfig, RemovalCause};
use rserpool_transport::{AssociationId, Endpoint, EndpointConfig, Event, TransportChoice};
use rserpool_wire::asap::{self, AsapMessage};
use rserpool_wire::{
    CauseCode, Codec, PoolElement, PoolElementId, PoolHandle, PoolPolicy, RegistrarId,
    RegistrationLife, TransportAddress, UserTransport,
};
use std::net::SocketAddr;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::oneshot;

const LOCAL: &str = "127.0.0.1";

async fn start_registrar(tweak: impl FnOnce(&mut DriverConfig)) -> (Running, oneshot::Sender<()>) {
    let mut core = RegistrarConfig::new(Profile::Rsplib);
    core.registrar_id = RegistrarId(0xabc);
    core.min_address_scope = AddressScope::Loopback;
    core.announce = None;
    core.seed = Some(3);
    let mut config = DriverConfig::new(core);
    config.transport = TransportChoice::Tcp;
    config.asap_listen = vec![format!("{LOCAL}:0").parse().unwrap()];
    config.metrics_listen = Some(format!("{LOCAL}:0").parse().unwrap());
    tweak(&mut config);
    let (started_tx, started_rx) = oneshot::channel();
    let (stop_tx, stop_rx) = oneshot::channel::<()>();
    tokio::spawn(async move {
        run(config, started_tx, async {
            let _ = stop_rx.await;
        })
        .await
        .expect("registrar runs");
    });
    (started_rx.await.expect("registrar starts"), stop_tx)
}

/// A raw ASAP client over the TCP mapping.
struct Client {
    endpoint: Endpoint,
    assoc: AssociationId,
    codec: Codec,
}

impl Client {
    async fn connect(registrar: SocketAddr) -> Client {
        let mut endpoint = Endpoint::bind(EndpointConfig::new(TransportChoice::Tcp))
            .await
            .unwrap();
        let assoc = endpoint.handle().connect(&[registrar]).await.unwrap();
        loop {
            match endpoint.next_event().await.unwrap() {
                Event::AssociationUp { id, .. } if id == assoc => break,
                Event::AssociationDown { reason, .. } => panic!("connect failed: {reason}"),
                _ => {}
            }
        }
        Client {
            endpoint,
            assoc,
            codec: Codec::default(),
        }
    }

    async fn send(&self, m: &AsapMessage) {
        self.raw(self.codec.encode(m).unwrap()).await;
    }

    async fn raw(&self, b: Vec<u8>) {
        self.endpoint
            .handle()
            .send(self.assoc, 11, 0, b)
            .await
            .unwrap();
    }

    async fn recv(&mut self, within: Duration) -> Option<AsapMessage> {
        let until = tokio::time::Instant::now() + within;
        loop {
            match tokio::time::timeout_at(until, self.endpoint.next_event()).await {
                Ok(Some(Event::Message { data, .. })) => {
                    return Some(self.codec.decode::<AsapMessage>(&data).unwrap().message)
                }
                Ok(Some(Event::AssociationDown { .. })) | Ok(None) | Err(_) => return None,
                Ok(Some(_)) => {}
            }
        }
    }

    /// The next message that is not a keep-alive.
    async fn answer(&mut self) -> AsapMessage {
        loop {
            match self.recv(Duration::from_secs(5)).await.expect("an answer") {
                AsapMessage::EndpointKeepAlive(_) => continue,
                m => return m,
            }
        }
    }
}

fn pe(id: u32) -> PoolElement {
    PoolElement {
        id: PoolElementId(id),
        home_registrar: RegistrarId(0),
        registration_life: RegistrationLife::Finite(Duration::from_secs(90)),
        user_transport: UserTransport::Address(TransportAddress::tcp(7000, LOCAL.parse().unwrap())),
        policy: PoolPolicy::RoundRobin,
        asap_transport: None,
    }
}

fn registration(pool: &str, pe: PoolElement) -> AsapMessage {
    AsapMessage::Registration(asap::Registration {
        pool_handle: PoolHandle::from(pool),
        pool_element: pe,
    })
}

fn resolution(pool: &str) -> AsapMessage {
    AsapMessage::HandleResolution(asap::HandleResolution {
        subscribe: false,
        pool_handle: PoolHandle::from(pool),
        option: None,
    })
}

async fn wait_for(what: &str, within: Duration, mut f: impl FnMut() -> bool) {
    let until = tokio::time::Instant::now() + within;
    while !f() {
        assert!(
            tokio::time::Instant::now() < until,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn register_resolve_deregister_over_the_tcp_mapping() {
    let (r, _stop) = start_registrar(|_| {}).await;
    let mut pe_client = Client::connect(r.asap_addrs[0]).await;
    pe_client.send(&registration("EchoPool", pe(1))).await;
    let m = pe_client.answer().await;
    assert!(
        matches!(&m, AsapMessage::RegistrationResponse(x) if !x.reject),
        "{m:?}"
    );

    let mut pu = Client::connect(r.asap_addrs[0]).await;
    pu.send(&resolution("EchoPool")).await;
    let AsapMessage::HandleResolutionResponse(h) = pu.answer().await else {
        panic!()
    };
    assert_eq!(h.pool_elements.len(), 1);
    assert_eq!(h.pool_elements[0].home_registrar, RegistrarId(0xabc));

    pe_client
        .send(&AsapMessage::Deregistration(asap::Deregistration {
            pool_handle: PoolHandle::from("EchoPool"),
            pe_id: PoolElementId(1),
        }))
        .await;
    assert!(matches!(
        pe_client.answer().await,
        AsapMessage::DeregistrationResponse(_)
    ));
    pu.send(&resolution("EchoPool")).await;
    let AsapMessage::HandleResolutionResponse(h) = pu.answer().await else {
        panic!()
    };
    assert_eq!(h.error.unwrap().code(), Some(CauseCode::UnknownPoolHandle));
    let m = r.metrics.lock().unwrap().clone();
    assert_eq!(
        (m.registrations, m.deregistrations, m.resolutions),
        (1, 1, 1)
    );
}

/// Sends `n` handle resolutions at once and counts the answers that arrive.
async fn burst_of_resolutions(r: &Running, n: usize) -> usize {
    let mut pe_client = Client::connect(r.asap_addrs[0]).await;
    pe_client.send(&registration("BurstPool", pe(1))).await;
    assert!(matches!(
        pe_client.answer().await,
        AsapMessage::RegistrationResponse(_)
    ));
    let mut pu = Client::connect(r.asap_addrs[0]).await;
    for _ in 0..n {
        pu.send(&resolution("BurstPool")).await;
    }
    let mut answers = 0;
    while let Some(m) = pu.recv(Duration::from_secs(2)).await {
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
    let (r, _stop) = start_registrar(|c| c.endpoint.limits.send_queue = 1).await;
    assert_eq!(burst_of_resolutions(&r, 200).await, 200);
    let m = r.metrics.lock().unwrap().clone();
    assert_eq!(
        (m.resolutions, m.held_answers, m.dropped_answers),
        (200, 0, 0)
    );
}

#[tokio::test]
async fn answers_past_the_held_limit_are_dropped_and_counted() {
    let (r, _stop) = start_registrar(|c| {
        c.endpoint.limits.send_queue = 1;
        c.max_held_answers = 1;
    })
    .await;
    let answered = burst_of_resolutions(&r, 200).await;
    let m = r.metrics.lock().unwrap().clone();
    assert_eq!(m.resolutions, 200);
    assert!(m.dropped_answers > 0, "{m:?}");
    assert_eq!(answered as u64 + m.dropped_answers, 200);
}

#[tokio::test]
async fn silent_pe_is_removed_after_the_keep_alive_timeout_and_lost_association_at_once() {
    let (r, _stop) = start_registrar(|c| {
        c.core.keep_alive_interval = Duration::from_millis(200);
        c.core.keep_alive_timeout = Duration::from_millis(300);
    })
    .await;
    let mut silent = Client::connect(r.asap_addrs[0]).await;
    silent.send(&registration("P", pe(1))).await;
    assert!(matches!(
        silent.answer().await,
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

    let gone = Client::connect(r.asap_addrs[0]).await;
    gone.send(&registration("P", pe(2))).await;
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
    let (r, _stop) = start_registrar(|_| {}).await;
    let mut bad = Client::connect(r.asap_addrs[0]).await;
    let mut good = Client::connect(r.asap_addrs[0]).await;
    bad.raw(vec![
        0x01, 0x00, 0x00, 0x10, 0x00, 0x09, 0x00, 0x20, 0, 0, 0, 0, 0, 0, 0, 0,
    ])
    .await;
    let AsapMessage::Error(e) = bad.answer().await else {
        panic!()
    };
    assert_eq!(e.error.code(), Some(CauseCode::InvalidValues));
    good.send(&resolution("Nothing")).await;
    assert!(matches!(
        good.answer().await,
        AsapMessage::HandleResolutionResponse(_)
    ));
    // The bad client is still served too.
    bad.send(&resolution("Nothing")).await;
    assert!(matches!(
        bad.answer().await,
        AsapMessage::HandleResolutionResponse(_)
    ));
}

#[tokio::test]
async fn handle_resolution_rate_limit_per_client() {
    let (r, _stop) = start_registrar(|c| {
        c.core.handle_resolution_rate = Some(RateLimit {
            rate: 0.5,
            burst: 2.0,
        })
    })
    .await;
    let mut pu = Client::connect(r.asap_addrs[0]).await;
    let mut refused = 0;
    for _ in 0..5 {
        pu.send(&resolution("P")).await;
        if let AsapMessage::HandleResolutionResponse(h) = pu.answer().await {
            if h.error.and_then(|e| e.code()) == Some(CauseCode::RejectedSecurity) {
                refused += 1;
            }
        }
    }
    assert_eq!(refused, 3);
    let mut other = Client::connect(r.asap_addrs[0]).await;
    other.send(&resolution("P")).await;
    let AsapMessage::HandleResolutionResponse(h) = other.answer().await else {
        panic!()
    };
    assert_eq!(
        h.error.and_then(|e| e.code()),
        Some(CauseCode::UnknownPoolHandle)
    );
}

#[tokio::test]
async fn plain_tcp_pool_users_resolve_without_the_frame_header() {
    let (r, _stop) = start_registrar(|c| {
        c.plain_tcp_listen = vec![format!("{LOCAL}:0").parse().unwrap()];
    })
    .await;
    let pe_client = Client::connect(r.asap_addrs[0]).await;
    pe_client.send(&registration("EchoPool", pe(5))).await;
    let metrics = r.metrics.clone();
    wait_for("registration", Duration::from_secs(3), || {
        metrics.lock().unwrap().registrations == 1
    })
    .await;
    let codec = Codec::default();
    let mut s = tokio::net::TcpStream::connect(r.plain_tcp_addrs[0])
        .await
        .unwrap();
    s.write_all(&codec.encode(&resolution("EchoPool")).unwrap())
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
    let (r, _stop) = start_registrar(|_| {}).await;
    let c = Client::connect(r.asap_addrs[0]).await;
    c.send(&registration("P", pe(1))).await;
    let metrics = r.metrics.clone();
    wait_for("registration", Duration::from_secs(3), || {
        metrics.lock().unwrap().registrations == 1
    })
    .await;
    let mut s = tokio::net::TcpStream::connect(r.metrics_addr.unwrap())
        .await
        .unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).await.unwrap();
    assert!(text.starts_with("HTTP/1.1 200 OK"), "{text}");
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
async fn http_get(addr: std::net::SocketAddr, path: &str) -> (String, String) {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(format!("GET {path} HTTP/1.1\r\nhost: x\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut text = String::new();
    tokio::time::timeout(Duration::from_secs(30), s.read_to_string(&mut text))
        .await
        .expect("an answer within 30 s")
        .unwrap();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    (head.to_ascii_lowercase(), body.to_string())
}

#[tokio::test]
async fn http_endpoint_serves_status_healthz_and_404() {
    let (r, _stop) = start_registrar(|c| c.status_max_pools = 2).await;
    let c = Client::connect(r.asap_addrs[0]).await;
    for (i, pool) in ["A", "B", "C"].iter().enumerate() {
        c.send(&registration(pool, pe(10 + i as u32))).await;
    }
    c.send(&registration("A", pe(20))).await;
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
    let (r, _stop) =
        start_registrar(|c| c.core.keep_alive_interval = Duration::from_millis(300)).await;
    let access = RegistrarAccess::single(r.asap_addrs[0], TransportChoice::Tcp);
    let mut handles = Vec::new();
    for port in [7001, 7002] {
        let mut h = PoolElementHandle::start(
            PoolElementConfig::new(
                PoolHandle::from("EchoPool"),
                UserTransport::Address(TransportAddress::tcp(port, LOCAL.parse().unwrap())),
                PoolPolicy::RoundRobin,
            ),
            access.clone(),
        )
        .await
        .unwrap();
        assert!(h.wait_registered(Duration::from_secs(5)).await);
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
    let until = tokio::time::Instant::now() + Duration::from_secs(20);
    while metrics.lock().unwrap().unreachable_probes == 0 {
        assert!(
            tokio::time::Instant::now() < until,
            "no probe for the reports"
        );
        pu.report_unreachable(PoolHandle::from("EchoPool"), other)
            .await;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
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
    let (r, _stop) = start_registrar(|c| {
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
