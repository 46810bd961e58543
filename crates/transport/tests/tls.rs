//! TLS on the TCP mapping: mutual authentication, the peer's identity per association, and the
//! refusals (no certificate, an untrusted one, a wrong server name, a stalled handshake), each
//! counted, none holding up other associations. Certificates are made in the test (rcgen).

mod common;
#[path = "common/pki.rs"]
mod pki;

use common::{expect_down, expect_message, next, WAIT};
use pki::{server_names, Names, Pki};
use rserpool_transport::{
    DownReason, Endpoint, EndpointConfig, EndpointStats, Event, TlsError, TlsSettings,
    TransportChoice, TransportError, TransportKind,
};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

const TCP: TransportChoice = TransportChoice::Tcp;

fn localhost() -> SocketAddr {
    "127.0.0.1:0".parse().unwrap()
}

async fn tls_server(tls: TlsSettings) -> Endpoint {
    let mut c = EndpointConfig::listening(TCP, &[localhost()]);
    c.tls = Some(tls);
    Endpoint::bind(c).await.expect("bind TLS server")
}

async fn tls_client(tls: TlsSettings) -> Endpoint {
    let mut c = EndpointConfig::new(TCP);
    c.tls = Some(tls);
    Endpoint::bind(c).await.expect("bind TLS client")
}

/// Polls the endpoint's counters until `cond` holds, failing after [`WAIT`].
async fn wait_stats(ep: &Endpoint, what: &str, cond: impl Fn(&EndpointStats) -> bool) {
    let deadline = tokio::time::Instant::now() + WAIT;
    while !cond(&ep.stats()) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}: {:?}",
            ep.stats()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn pe_names() -> Names<'static> {
    Names {
        cn: "pe-1",
        dns: &["pe-1.pool.test"],
        uris: &["spiffe://pool.test/pe/1"],
        ips: &[],
    }
}

#[tokio::test]
async fn mutual_authentication_reports_both_identities() {
    let pki = Pki::new("ca");
    let mut s = tls_server(pki.settings("registrar", server_names())).await;
    let mut c = tls_client(pki.settings("pe", pe_names())).await;
    let cid = c.connect(s.local_addrs()).await.unwrap();
    let (sid, client_identity) = match next(&mut s).await {
        Event::AssociationUp {
            id, peer_identity, ..
        } => (id, peer_identity.expect("client identity")),
        e => panic!("{e:?}"),
    };
    assert_eq!(client_identity.common_names, vec!["pe-1"]);
    assert_eq!(client_identity.dns_names, vec!["pe-1.pool.test"]);
    assert_eq!(client_identity.uris, vec!["spiffe://pool.test/pe/1"]);
    let shown = client_identity.to_string();
    assert!(
        shown.starts_with("cn:pe-1 dns:pe-1.pool.test uri:spiffe://pool.test/pe/1 sha256:"),
        "{shown}"
    );
    match next(&mut c).await {
        Event::AssociationUp {
            id, peer_identity, ..
        } => {
            assert_eq!(id, cid);
            let server = peer_identity.expect("server identity");
            assert_eq!(server.common_names, vec!["registrar"]);
            assert_eq!(server.dns_names, vec!["registrar.test"]);
        }
        e => panic!("{e:?}"),
    }
    // The identity is there for the association's whole life, and messages pass both ways.
    assert_eq!(
        s.association(sid).unwrap().peer_identity.as_deref(),
        Some(&*client_identity)
    );
    c.send(cid, 11, 0, &b"register me"[..]).await.unwrap();
    let (id, ppid, stream, data) = expect_message(&mut s).await;
    assert_eq!(
        (id, ppid, stream, &data[..]),
        (sid, 11, 0, &b"register me"[..])
    );
    s.send(sid, 66, 3, vec![7u8; 100_000 / 2]).await.unwrap();
    let (_, ppid, stream, data) = expect_message(&mut c).await;
    assert_eq!((ppid, stream, data.len()), (66, 3, 50_000));
    assert_eq!(s.stats().tls_handshakes, 1);
    assert_eq!(c.stats().tls_handshakes, 1);
    c.close(cid).await.unwrap();
    assert_eq!(expect_down(&mut s).await, (sid, DownReason::PeerClosed));
}

/// A client without a certificate, with one from a CA the server does not trust, or trusting
/// another CA than the server's, never gets an association; the server counts each refusal and
/// reports no association for them.
#[tokio::test]
async fn missing_and_untrusted_certificates_are_refused_and_counted() {
    let pki = Pki::new("ca");
    let rogue = Pki::new("rogue");
    let mut s = tls_server(pki.settings("registrar", server_names())).await;
    let target = s.local_addrs().to_vec();

    // No certificate, where the server requires one.
    let mut anon = tls_client(pki.anonymous()).await;
    anon.connect(&target).await.unwrap();
    // An untrusted certificate (e.g. a registrar of another operator trying to peer).
    let (rc, rk) = rogue.issue("rogue-registrar", server_names());
    let mut rogue_peer = tls_client(TlsSettings::new(&pki.ca).with_identity(rc, rk)).await;
    rogue_peer.connect(&target).await.unwrap();

    for ep in [&mut anon, &mut rogue_peer] {
        let reason = loop {
            match next(ep).await {
                Event::AssociationDown { reason, .. } => break reason,
                // TLS 1.3: the client's side is done before the server checks its certificate;
                // the server's alert then ends the association.
                Event::AssociationUp { .. } | Event::SendFailed { .. } => continue,
                e => panic!("{e:?}"),
            }
        };
        assert!(
            matches!(&reason, DownReason::Tls(r) if r.contains("alert")),
            "{reason:?}"
        );
    }
    wait_stats(&s, "two refused handshakes", |st| {
        st.tls_handshake_failures == 2
    })
    .await;
    assert_eq!(s.stats().tls_handshakes, 0);
    assert_eq!(s.stats().associations_up, 0);
    assert!(s.associations().is_empty());
    assert!(s.try_next_event().is_none(), "no event for a refused peer");

    // A client that trusts another CA refuses the server.
    let mut wrong_trust = tls_client(rogue.settings("pe-r", pe_names())).await;
    let id = wrong_trust.connect(&target).await.unwrap();
    let (down, reason) = expect_down(&mut wrong_trust).await;
    assert_eq!(down, id);
    assert!(
        matches!(&reason, DownReason::Tls(r) if r.contains("UnknownIssuer")),
        "{reason:?}"
    );
    assert_eq!(wrong_trust.stats().tls_handshake_failures, 1);
    wait_stats(&s, "the third refused handshake", |st| {
        st.tls_handshake_failures == 3
    })
    .await;
}

#[tokio::test]
async fn mismatched_certificate_and_key_is_refused_at_start() {
    let pki = Pki::new("ca");
    let (c1, _) = pki.issue("a", pe_names());
    let (_, k2) = pki.issue("b", pe_names());
    let mut c = EndpointConfig::new(TCP);
    c.tls = Some(TlsSettings::new(&pki.ca).with_identity(&c1, k2));
    let err = Endpoint::bind(c).await.unwrap_err();
    assert!(matches!(err, TransportError::Tls(_)), "{err}");
}

#[tokio::test]
async fn the_expected_server_name_is_checked() {
    let pki = Pki::new("ca");
    let s = tls_server(pki.settings("registrar", server_names())).await;
    let target = s.local_addrs().to_vec();
    let mut right = pki.settings("pe", pe_names());
    right.server_name = Some("registrar.test".into());
    let mut c = tls_client(right).await;
    c.connect(&target).await.unwrap();
    assert!(matches!(next(&mut c).await, Event::AssociationUp { .. }));

    let mut wrong = pki.settings("pe2", pe_names());
    wrong.server_name = Some("other-registrar.test".into());
    let mut c = tls_client(wrong).await;
    c.connect(&target).await.unwrap();
    let (_, reason) = expect_down(&mut c).await;
    assert!(
        matches!(&reason, DownReason::Tls(r) if r.contains("not valid for name")),
        "{reason:?}"
    );
}

/// A peer that opens TCP and never speaks TLS is dropped after the handshake timeout and
/// counted; meanwhile others connect and are served.
#[tokio::test]
async fn a_stalled_handshake_times_out_without_holding_up_others() {
    let pki = Pki::new("ca");
    let mut settings = pki.settings("registrar", server_names());
    // Long enough for the good client on a loaded machine, short for the test.
    settings.handshake_timeout = Duration::from_secs(2);
    let mut s = tls_server(settings).await;
    let target = s.local_addrs().to_vec();
    let mut stalled = Vec::new();
    for _ in 0..5 {
        stalled.push(tokio::net::TcpStream::connect(target[0]).await.unwrap());
    }
    let mut c = tls_client(pki.settings("pe", pe_names())).await;
    let cid = c.connect(&target).await.unwrap();
    assert!(matches!(next(&mut s).await, Event::AssociationUp { .. }));
    assert!(matches!(next(&mut c).await, Event::AssociationUp { id, .. } if id == cid));
    wait_stats(&s, "five handshake timeouts", |st| {
        st.tls_handshake_timeouts == 5
    })
    .await;
    assert_eq!(s.stats().tls_handshakes, 1);
    assert_eq!(s.associations().len(), 1);
}

/// With client certificates optional, a client without one is served and reported without
/// identity; one that presents a certificate is still verified.
#[tokio::test]
async fn optional_client_certificates() {
    let pki = Pki::new("ca");
    let rogue = Pki::new("rogue");
    let mut settings = pki.settings("registrar", server_names());
    settings.require_client_certificate = false;
    let mut s = tls_server(settings).await;
    let target = s.local_addrs().to_vec();
    let anon = tls_client(pki.anonymous()).await;
    anon.connect(&target).await.unwrap();
    match next(&mut s).await {
        Event::AssociationUp { peer_identity, .. } => assert_eq!(peer_identity, None),
        e => panic!("{e:?}"),
    }
    let (rc, rk) = rogue.issue("rogue", pe_names());
    let bad = tls_client(TlsSettings::new(&pki.ca).with_identity(rc, rk)).await;
    bad.connect(&target).await.unwrap();
    wait_stats(&s, "the untrusted certificate refused", |st| {
        st.tls_handshake_failures == 1
    })
    .await;
}

#[tokio::test]
async fn tls_runs_on_the_tcp_mapping_only() {
    let pki = Pki::new("ca");
    let settings = pki.settings("registrar", server_names());
    let mut c = EndpointConfig::listening(TransportChoice::Sctp, &[localhost()]);
    c.tls = Some(settings.clone());
    let err = Endpoint::bind(c).await.unwrap_err();
    assert!(
        matches!(err, TransportError::Tls(TlsError::OverSctp)),
        "{err}"
    );
    let text = err.to_string();
    assert!(text.contains("TCP mapping with TLS"), "{text}");

    let mut c = EndpointConfig::listening(TransportChoice::Auto, &[localhost()]);
    c.tls = Some(settings);
    let ep = Endpoint::bind(c).await.unwrap();
    assert_eq!(ep.kind(), TransportKind::Tcp);

    // A listener needs its own certificate; files are named when they are wrong.
    let mut c = EndpointConfig::listening(TCP, &[localhost()]);
    c.tls = Some(pki.anonymous());
    let err = Endpoint::bind(c).await.unwrap_err();
    assert!(
        matches!(
            err,
            TransportError::Tls(TlsError::ListenerWithoutCertificate)
        ),
        "{err}"
    );
    let mut c = EndpointConfig::new(TCP);
    c.tls = Some(TlsSettings::new(pki.dir.path().join("missing-ca.pem")));
    let err = Endpoint::bind(c).await.unwrap_err().to_string();
    assert!(err.contains("missing-ca.pem"), "{err}");
    let garbage = pki.dir.path().join("garbage.pem");
    std::fs::write(&garbage, "not a certificate\n").unwrap();
    let mut c = EndpointConfig::new(TCP);
    c.tls = Some(TlsSettings::new(&garbage));
    let err = Endpoint::bind(c).await.unwrap_err().to_string();
    assert!(
        err.contains("garbage.pem") && err.contains("no CERTIFICATE"),
        "{err}"
    );
}

/// Plain-TCP ASAP (RFC 5352 §3.3) runs inside TLS too when the endpoint has TLS: no cleartext
/// port is left open beside the TLS one.
#[tokio::test]
async fn plain_asap_listener_runs_inside_tls() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let pki = Pki::new("ca");
    let mut cfg = EndpointConfig::new(TCP);
    cfg.tcp.plain_asap_listen = vec![localhost()];
    let mut settings = pki.settings("registrar", server_names());
    settings.require_client_certificate = false;
    cfg.tls = Some(settings);
    let mut s = Endpoint::bind(cfg).await.unwrap();
    let plain = s.plain_asap_addrs()[0];

    let mut roots = rustls::RootCertStore::empty();
    use rustls_pki_types::pem::PemObject;
    for c in rustls_pki_types::CertificateDer::pem_file_iter(&pki.ca).unwrap() {
        roots.add(c.unwrap()).unwrap();
    }
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    let tcp = tokio::net::TcpStream::connect(plain).await.unwrap();
    let mut tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect("registrar.test".try_into().unwrap(), tcp)
        .await
        .unwrap();
    // An ASAP_HANDLE_RESOLUTION header (type 5, length 4) framed by its own length.
    tls.write_all(&[5, 0, 0, 4]).await.unwrap();
    let id = match next(&mut s).await {
        Event::AssociationUp { id, .. } => id,
        e => panic!("{e:?}"),
    };
    let (mid, ppid, _, data) = expect_message(&mut s).await;
    assert_eq!((mid, ppid, &data[..]), (id, 11, &[5u8, 0, 0, 4][..]));
    s.send(id, 11, 0, vec![6u8, 0, 0, 4]).await.unwrap();
    let mut back = [0u8; 4];
    tokio::time::timeout(WAIT, tls.read_exact(&mut back))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(back, [6, 0, 0, 4]);
    // A cleartext peer on the same port gets nothing and is counted.
    let mut clear = tokio::net::TcpStream::connect(plain).await.unwrap();
    clear.write_all(&[5, 0, 0, 4]).await.unwrap();
    wait_stats(&s, "the cleartext peer refused", |st| {
        st.tls_handshake_failures == 1
    })
    .await;
}
