//! The TCP mapping and plain-TCP ASAP on loopback.

mod common;

use common::*;
use rserpool_transport::tcp::frame::{self, FrameError, FrameType};
use rserpool_transport::{
    AssociationKind, DownReason, Endpoint, EndpointConfig, Event, SendError, TransportChoice,
    TransportError, TransportKind,
};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const TCP: TransportChoice = TransportChoice::Tcp;

#[tokio::test]
async fn ppid_stream_and_order_v4() {
    ppid_stream_and_order(TCP, addr("127.0.0.1:0")).await;
}

#[tokio::test]
async fn ppid_stream_and_order_v6() {
    ppid_stream_and_order(TCP, addr("[::1]:0")).await;
}

#[tokio::test]
async fn hinted_sends_arrive_in_order() {
    common::hinted_sends_arrive_in_order(TCP, addr("127.0.0.1:0"), false).await;
}

#[tokio::test]
async fn large_messages_64k() {
    large_messages(TCP, addr("127.0.0.1:0")).await;
}

#[tokio::test]
async fn close_and_abort_reasons() {
    close_and_abort(TCP, addr("127.0.0.1:0")).await;
}

#[tokio::test]
async fn connect_refused_is_reported() {
    // A port that was just bound and released: nobody listens there.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    connect_refused(TCP, port).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_associations_100() {
    many_associations(TCP, addr("127.0.0.1:0"), 100).await;
}

#[tokio::test]
async fn connect_tries_each_address_in_order() {
    let mut s = server(TCP, &[addr("127.0.0.1:0")]).await;
    let dead = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let mut c = client(TCP).await;
    let id = c.connect(&[dead, s.local_addrs()[0]]).await.unwrap();
    let (up, _, peer) = expect_up(&mut c).await;
    assert_eq!(up, id);
    assert_eq!(peer, vec![s.local_addrs()[0]]);
    expect_up(&mut s).await;
}

#[tokio::test]
async fn auto_picks_sctp_only_where_the_kernel_has_it() {
    let ep = Endpoint::bind(EndpointConfig::new(TransportChoice::Auto))
        .await
        .unwrap();
    let want = if rserpool_transport::sctp_available().is_ok() {
        TransportKind::Sctp
    } else {
        TransportKind::Tcp
    };
    assert_eq!(ep.kind(), want);
    if want == TransportKind::Tcp {
        let err = Endpoint::bind(EndpointConfig::new(TransportChoice::Sctp))
            .await
            .unwrap_err();
        assert!(matches!(err, TransportError::SctpUnavailable(_)), "{err}");
    }
}

#[tokio::test]
async fn invalid_configuration_is_named() {
    let mut c = EndpointConfig::new(TCP);
    c.local_addrs = vec![addr("127.0.0.1:1000"), addr("127.0.0.2:1001")];
    let e = Endpoint::bind(c).await.unwrap_err().to_string();
    assert!(e.contains("share one port"), "{e}");
    let mut c = EndpointConfig::new(TCP);
    c.limits.max_message_size = 0;
    let e = Endpoint::bind(c).await.unwrap_err().to_string();
    assert!(e.contains("max_message_size"), "{e}");
    let mut c = EndpointConfig::new(TCP);
    c.tcp.keepalive_timeout = Duration::from_millis(10);
    let e = Endpoint::bind(c).await.unwrap_err().to_string();
    assert!(e.contains("keep-alive"), "{e}");
}

/// Raw TCP peer against a mapped listener.
async fn raw_peer() -> (Endpoint, TcpStream, rserpool_transport::AssociationId) {
    let mut s = server(TCP, &[addr("127.0.0.1:0")]).await;
    let raw = TcpStream::connect(s.local_addrs()[0]).await.unwrap();
    let (id, _, _) = expect_up(&mut s).await;
    (s, raw, id)
}

#[tokio::test]
async fn oversized_frame_closes_only_that_association() {
    let (mut s, good, _) = {
        let (s, raw, id) = raw_peer().await;
        (s, raw, id)
    };
    drop(good);
    let _ = expect_down(&mut s).await;
    // A healthy mapped client and a raw one that announces a frame over the limit.
    let mut c = client(TCP).await;
    let cid = c.connect(s.local_addrs()).await.unwrap();
    expect_up(&mut c).await;
    let (healthy, _, _) = expect_up(&mut s).await;
    let mut raw = TcpStream::connect(s.local_addrs()[0]).await.unwrap();
    let (bad, _, _) = expect_up(&mut s).await;
    raw.write_all(&frame::encode_header(FrameType::Data, 0, 11, 65_537))
        .await
        .unwrap();
    let (id, reason) = expect_down(&mut s).await;
    assert_eq!(id, bad);
    assert_eq!(
        reason,
        DownReason::Protocol(FrameError::TooLarge {
            length: 65_537,
            limit: 65_536
        })
    );
    // The peer is reset, not left hanging.
    let mut b = [0u8; 16];
    let r = tokio::time::timeout(WAIT, raw.read(&mut b)).await.unwrap();
    assert!(matches!(r, Ok(0) | Err(_)));
    // The other association still works.
    c.send(cid, 11, 0, &b"still here"[..]).await.unwrap();
    let (id, _, _, data) = expect_message(&mut s).await;
    assert_eq!((id, &data[..]), (healthy, &b"still here"[..]));
    assert_eq!(s.stats().protocol_errors, 1);
}

#[tokio::test]
async fn garbage_is_a_protocol_error() {
    let (mut s, mut raw, id) = raw_peer().await;
    raw.write_all(b"GET / HTTP/1.0\r\n\r\n").await.unwrap();
    assert_eq!(
        expect_down(&mut s).await,
        (
            id,
            DownReason::Protocol(FrameError::BadMarker { found: b'G' })
        )
    );
}

#[tokio::test]
async fn truncated_frame_at_close_is_a_protocol_error() {
    let (mut s, mut raw, id) = raw_peer().await;
    let mut f = bytes::BytesMut::new();
    frame::encode(&mut f, FrameType::Data, 0, 11, b"complete");
    raw.write_all(&f).await.unwrap();
    raw.write_all(&frame::encode_header(FrameType::Data, 0, 11, 100))
        .await
        .unwrap();
    raw.shutdown().await.unwrap();
    let (_, ppid, _, data) = expect_message(&mut s).await;
    assert_eq!((ppid, &data[..]), (11, &b"complete"[..]));
    assert_eq!(
        expect_down(&mut s).await,
        (id, DownReason::Protocol(FrameError::Truncated(12)))
    );
}

fn fast_keepalive(listen: bool) -> EndpointConfig {
    let mut c = if listen {
        EndpointConfig::listening(TCP, &[addr("127.0.0.1:0")])
    } else {
        EndpointConfig::new(TCP)
    };
    c.tcp.keepalive_interval = Some(Duration::from_millis(50));
    c.tcp.keepalive_timeout = Duration::from_millis(400);
    c
}

#[tokio::test]
async fn silent_peer_is_noticed_by_keepalive_timeout() {
    let mut s = Endpoint::bind(fast_keepalive(true)).await.unwrap();
    let mut raw = TcpStream::connect(s.local_addrs()[0]).await.unwrap();
    let (id, _, _) = expect_up(&mut s).await;
    let t0 = std::time::Instant::now();
    // The silent peer is probed with KEEPALIVE frames (it never answers).
    let mut b = [0u8; frame::HEADER_LEN];
    tokio::time::timeout(WAIT, raw.read_exact(&mut b))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(b[0], frame::MARKER);
    assert_eq!(b[1], FrameType::KeepAlive.to_u8());
    assert_eq!(
        expect_down(&mut s).await,
        (id, DownReason::KeepAliveTimeout)
    );
    // Noticed after the timeout, well before the generous test bound.
    assert!(t0.elapsed() >= Duration::from_millis(300));
    assert_eq!(s.stats().timeouts, 1);
}

#[tokio::test]
async fn idle_but_alive_peers_stay_up() {
    let mut s = Endpoint::bind(fast_keepalive(true)).await.unwrap();
    let mut c = Endpoint::bind(fast_keepalive(false)).await.unwrap();
    let cid = c.connect(s.local_addrs()).await.unwrap();
    expect_up(&mut c).await;
    let (sid, _, _) = expect_up(&mut s).await;
    // Four keep-alive timeouts of silence from the application: keep-alives hold it up.
    let quiet = tokio::time::timeout(Duration::from_millis(1600), async {
        tokio::select! { e = s.next_event() => e, e = c.next_event() => e }
    })
    .await;
    assert!(quiet.is_err(), "unexpected event: {quiet:?}");
    c.send(cid, 33, 0, &b"ping"[..]).await.unwrap();
    let (id, _, _, _) = expect_message(&mut s).await;
    assert_eq!(id, sid);
}

#[tokio::test]
async fn association_limit_refuses_and_connect_fails() {
    let mut cfg = EndpointConfig::listening(TCP, &[addr("127.0.0.1:0")]);
    cfg.limits.max_associations = 1;
    let mut s = Endpoint::bind(cfg).await.unwrap();
    let _a = TcpStream::connect(s.local_addrs()[0]).await.unwrap();
    expect_up(&mut s).await;
    let mut b = TcpStream::connect(s.local_addrs()[0]).await.unwrap();
    let mut buf = [0u8; 4];
    let r = tokio::time::timeout(WAIT, b.read(&mut buf)).await.unwrap();
    assert!(matches!(r, Ok(0) | Err(_)), "refused connection is closed");
    assert_eq!(s.stats().refused, 1);

    let mut cfg = EndpointConfig::new(TCP);
    cfg.limits.max_associations = 1;
    let c = Endpoint::bind(cfg).await.unwrap();
    c.connect(s.local_addrs()).await.unwrap();
    assert!(matches!(
        c.connect(s.local_addrs()).await,
        Err(TransportError::TooManyAssociations(1))
    ));
}

fn handle_resolution() -> Vec<u8> {
    use rserpool_wire::{asap, AsapMessage, Codec, PoolHandle};
    Codec::default()
        .encode(&AsapMessage::HandleResolution(asap::HandleResolution {
            subscribe: false,
            pool_handle: PoolHandle::from("EchoPool"),
            option: None,
        }))
        .unwrap()
}

#[tokio::test]
async fn plain_asap_listener_frames_by_message_length() {
    let mut cfg = EndpointConfig::new(TCP);
    cfg.tcp.plain_asap_listen = vec![addr("127.0.0.1:0")];
    let mut s = Endpoint::bind(cfg).await.unwrap();
    let plain = s.plain_asap_addrs()[0];
    let mut pu = TcpStream::connect(plain).await.unwrap();
    let id = match next(&mut s).await {
        Event::AssociationUp {
            id,
            kind,
            outbound_streams,
            ..
        } => {
            assert_eq!(kind, AssociationKind::TcpPlain);
            assert_eq!(kind.transport(), TransportKind::Tcp);
            assert_eq!(outbound_streams, 1);
            id
        }
        e => panic!("{e:?}"),
    };
    let hr = handle_resolution();
    // Two messages in one write, then one split across writes.
    let mut two = hr.clone();
    two.extend_from_slice(&hr);
    pu.write_all(&two).await.unwrap();
    pu.write_all(&hr[..5]).await.unwrap();
    pu.flush().await.unwrap();
    tokio::time::sleep(Duration::from_millis(20)).await;
    pu.write_all(&hr[5..]).await.unwrap();
    for _ in 0..3 {
        let (mid, ppid, stream, data) = expect_message(&mut s).await;
        assert_eq!((mid, ppid, stream), (id, 11, 0));
        assert_eq!(&data[..], &hr[..]);
    }
    // The answer goes out bare, exactly as given.
    s.send(id, 11, 0, hr.clone()).await.unwrap();
    let mut back = vec![0u8; hr.len()];
    pu.read_exact(&mut back).await.unwrap();
    assert_eq!(back, hr);
    // Only whole ASAP messages with PPID 11 on stream 0 can go there.
    assert!(matches!(
        s.send(id, 12, 0, hr.clone()).await,
        Err(SendError::PpidNotCarried { ppid: 12, .. })
    ));
    assert!(matches!(
        s.send(id, 11, 1, hr.clone()).await,
        Err(SendError::BadStream { stream: 1, .. })
    ));
    assert!(matches!(
        s.send(id, 11, 0, &b"not asap"[..]).await,
        Err(SendError::NotAsapFramed)
    ));
    // A length below the header closes it with a typed error.
    pu.write_all(&[0x05, 0x00, 0x00, 0x02]).await.unwrap();
    assert_eq!(
        expect_down(&mut s).await,
        (id, DownReason::Protocol(FrameError::ShortAsapLength(2)))
    );
}

#[tokio::test]
async fn plain_and_mapped_listeners_side_by_side() {
    let mut cfg = EndpointConfig::listening(TCP, &[addr("127.0.0.1:0")]);
    cfg.tcp.plain_asap_listen = vec![addr("127.0.0.1:0")];
    let mut s = Endpoint::bind(cfg).await.unwrap();
    assert_ne!(s.local_addrs()[0], s.plain_asap_addrs()[0]);
    let mut c = client(TCP).await;
    c.connect(s.local_addrs()).await.unwrap();
    expect_up(&mut c).await;
    let mut kinds = vec![match next(&mut s).await {
        Event::AssociationUp { kind, .. } => kind,
        e => panic!("{e:?}"),
    }];
    let _pu = TcpStream::connect(s.plain_asap_addrs()[0]).await.unwrap();
    kinds.push(match next(&mut s).await {
        Event::AssociationUp { kind, .. } => kind,
        e => panic!("{e:?}"),
    });
    assert_eq!(
        kinds,
        [AssociationKind::TcpMapped, AssociationKind::TcpPlain]
    );
}

#[tokio::test]
async fn handle_sends_from_another_task() {
    let (mut s, c, sid, cid) = pair(TCP, &[addr("127.0.0.1:0")]).await;
    let h = c.handle();
    assert_eq!(h.kind(), TransportKind::Tcp);
    let t = tokio::spawn(async move {
        for i in 0..10u8 {
            h.send(cid, 33, 0, vec![i]).await.unwrap();
        }
    });
    for i in 0..10u8 {
        let (id, _, _, d) = expect_message(&mut s).await;
        assert_eq!((id, &d[..]), (sid, &[i][..]));
    }
    t.await.unwrap();
    drop(c);
    // Dropping an endpoint drops its associations.
    let (id, _) = expect_down(&mut s).await;
    assert_eq!(id, sid);
}
