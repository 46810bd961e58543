//! Scenarios shared by the TCP and SCTP test binaries: each runs against whichever transport it
//! is given, so both carriers are held to the same behaviour.
#![allow(dead_code)]

use bytes::Bytes;
use rserpool_transport::{
    AssociationId, AssociationKind, DownReason, Endpoint, EndpointConfig, Event, TransportChoice,
    TransportKind,
};
use std::net::SocketAddr;
use std::time::Duration;

/// Generous: the SCTP tests run in an emulated VM, 4-7 times slower than the host.
pub const WAIT: Duration = Duration::from_secs(30);

pub fn addr(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

pub fn kind_of(choice: TransportChoice) -> AssociationKind {
    match choice {
        TransportChoice::Sctp => AssociationKind::Sctp,
        _ => AssociationKind::TcpMapped,
    }
}

pub async fn server(choice: TransportChoice, addrs: &[SocketAddr]) -> Endpoint {
    Endpoint::bind(EndpointConfig::listening(choice, addrs))
        .await
        .expect("bind server")
}

pub async fn client(choice: TransportChoice) -> Endpoint {
    Endpoint::bind(EndpointConfig::new(choice))
        .await
        .expect("bind client")
}

/// The next event, failing the test after [`WAIT`].
pub async fn next(ep: &mut Endpoint) -> Event {
    tokio::time::timeout(WAIT, ep.next_event())
        .await
        .expect("timed out waiting for an event")
        .expect("endpoint closed")
}

/// The next event that is not a path change.
pub async fn next_assoc_event(ep: &mut Endpoint) -> Event {
    loop {
        match next(ep).await {
            Event::PeerAddressChange { .. } => continue,
            e => return e,
        }
    }
}

pub async fn expect_up(ep: &mut Endpoint) -> (AssociationId, Vec<SocketAddr>, Vec<SocketAddr>) {
    match next_assoc_event(ep).await {
        Event::AssociationUp {
            id,
            local_addrs,
            peer_addrs,
            ..
        } => (id, local_addrs, peer_addrs),
        e => panic!("expected AssociationUp, got {e:?}"),
    }
}

pub async fn expect_down(ep: &mut Endpoint) -> (AssociationId, DownReason) {
    loop {
        match next_assoc_event(ep).await {
            Event::AssociationDown { id, reason } => return (id, reason),
            Event::SendFailed { .. } => continue,
            e => panic!("expected AssociationDown, got {e:?}"),
        }
    }
}

pub async fn expect_message(ep: &mut Endpoint) -> (AssociationId, u32, u16, Bytes) {
    match next_assoc_event(ep).await {
        Event::Message {
            id,
            ppid,
            stream,
            data,
        } => (id, ppid, stream, data),
        e => panic!("expected Message, got {e:?}"),
    }
}

/// A connected pair: (server, client, server-side id, client-side id).
pub async fn pair(
    choice: TransportChoice,
    listen: &[SocketAddr],
) -> (Endpoint, Endpoint, AssociationId, AssociationId) {
    let mut s = server(choice, listen).await;
    let mut c = client(choice).await;
    let target: Vec<SocketAddr> = s.local_addrs().to_vec();
    let cid = c.connect(&target).await.expect("connect");
    let (cid2, _, _) = expect_up(&mut c).await;
    assert_eq!(cid, cid2);
    let (sid, _, _) = expect_up(&mut s).await;
    (s, c, sid, cid)
}

/// Up events name the right kind and addresses on both sides; messages keep PPID, stream,
/// order; control (PPID 11) and data (PPID 33) share one association.
pub async fn ppid_stream_and_order(choice: TransportChoice, listen: SocketAddr) {
    let mut s = server(choice, &[listen]).await;
    assert_eq!(
        s.kind(),
        match choice {
            TransportChoice::Sctp => TransportKind::Sctp,
            _ => TransportKind::Tcp,
        }
    );
    let mut c = client(choice).await;
    let target = s.local_addrs().to_vec();
    assert_eq!(target.len(), 1);
    assert_ne!(target[0].port(), 0, "bound port is reported");
    let cid = c.connect(&target).await.unwrap();
    let (sid, s_local, s_peer) = match next_assoc_event(&mut s).await {
        Event::AssociationUp {
            id,
            kind,
            local_addrs,
            peer_addrs,
            inbound,
            ..
        } => {
            assert_eq!(kind, kind_of(choice));
            assert!(inbound);
            (id, local_addrs, peer_addrs)
        }
        e => panic!("{e:?}"),
    };
    let (c_local, c_peer) = match next_assoc_event(&mut c).await {
        Event::AssociationUp {
            id,
            kind,
            local_addrs,
            peer_addrs,
            inbound,
            ..
        } => {
            assert_eq!(id, cid);
            assert_eq!(kind, kind_of(choice));
            assert!(!inbound);
            (local_addrs, peer_addrs)
        }
        e => panic!("{e:?}"),
    };
    assert!(c_peer.contains(&target[0]), "{c_peer:?} lacks {target:?}");
    assert!(s_local.iter().any(|a| a.port() == target[0].port()));
    // What the server sees as the peer is what the client has locally (RFC 5352 §2.2.1 checks).
    for a in &s_peer {
        assert!(
            c_local.iter().any(|l| l.port() == a.port()),
            "server sees {a}, client has {c_local:?}"
        );
    }
    let info = s.association(sid).expect("association info");
    assert_eq!(info.kind, kind_of(choice));
    assert!(info.established && info.inbound);
    assert!(!info.peer_addrs.is_empty());

    let msgs: Vec<(u32, u16, Vec<u8>)> = (0..200u32)
        .map(|i| {
            let ppid = if i % 3 == 0 { 11 } else { 33 };
            let stream = (i % 4) as u16;
            (ppid, stream, format!("message {i}").into_bytes())
        })
        .collect();
    for (ppid, stream, data) in &msgs {
        c.send(cid, *ppid, *stream, data.clone()).await.unwrap();
    }
    let mut got = Vec::new();
    for _ in 0..msgs.len() {
        let (id, ppid, stream, data) = expect_message(&mut s).await;
        assert_eq!(id, sid);
        got.push((ppid, stream, data.to_vec()));
    }
    // SCTP orders per stream only; compare per stream.
    for st in 0..4u16 {
        let want: Vec<_> = msgs.iter().filter(|m| m.1 == st).collect();
        let have: Vec<_> = got.iter().filter(|m| m.1 == st).collect();
        assert_eq!(want, have, "stream {st}");
    }
    // And back.
    s.send(sid, 12, 1, &b"enrp"[..]).await.unwrap();
    let (id, ppid, stream, data) = expect_message(&mut c).await;
    assert_eq!((id, ppid, stream, &data[..]), (cid, 12, 1, &b"enrp"[..]));
    let st = s.stats();
    assert_eq!(st.messages_received, 200);
    assert_eq!(st.messages_sent, 1);
    assert_eq!(st.associations_up, 1);
}

/// 64 KiB messages pass both ways; one byte more is refused locally with a typed error.
pub async fn large_messages(choice: TransportChoice, listen: SocketAddr) {
    let (mut s, mut c, sid, cid) = pair(choice, &[listen]).await;
    let big: Vec<u8> = (0..65_536u32).map(|i| (i * 7 % 251) as u8).collect();
    for round in 0..3 {
        c.send(cid, 33, 0, big.clone()).await.unwrap();
        let (_, ppid, _, data) = expect_message(&mut s).await;
        assert_eq!(ppid, 33);
        assert_eq!(data.len(), big.len(), "round {round}");
        assert!(data == big, "payload intact");
        s.send(sid, 11, 0, data).await.unwrap();
        let (_, ppid, _, back) = expect_message(&mut c).await;
        assert_eq!(ppid, 11);
        assert!(back == big);
    }
    let err = c.send(cid, 33, 0, vec![0u8; 65_537]).await.unwrap_err();
    assert!(
        matches!(
            err,
            rserpool_transport::SendError::TooLarge {
                size: 65_537,
                limit: 65_536
            }
        ),
        "{err:?}"
    );
}

/// Graceful close and abort give the right reason on each side; ids are not reused.
pub async fn close_and_abort(choice: TransportChoice, listen: SocketAddr) {
    let (mut s, mut c, sid, cid) = pair(choice, &[listen]).await;
    c.send(cid, 33, 0, &b"last words"[..]).await.unwrap();
    c.close(cid).await.unwrap();
    let (_, _, _, data) = expect_message(&mut s).await;
    assert_eq!(&data[..], b"last words", "data sent before close arrives");
    assert_eq!(expect_down(&mut s).await, (sid, DownReason::PeerClosed));
    assert_eq!(expect_down(&mut c).await, (cid, DownReason::LocalClose));
    assert!(c.association(cid).is_none());
    assert!(matches!(
        c.send(cid, 33, 0, &b"x"[..]).await,
        Err(rserpool_transport::SendError::UnknownAssociation(_))
    ));

    let target = s.local_addrs().to_vec();
    let cid2 = c.connect(&target).await.unwrap();
    assert!(cid2 > cid, "ids increase");
    assert_eq!(expect_up(&mut c).await.0, cid2);
    let (sid2, _, _) = expect_up(&mut s).await;
    assert!(sid2 > sid);
    s.abort(sid2).await.unwrap();
    assert_eq!(expect_down(&mut s).await, (sid2, DownReason::LocalAbort));
    assert_eq!(expect_down(&mut c).await, (cid2, DownReason::PeerAborted));
    let st = c.stats();
    assert_eq!((st.associations_up, st.associations_down), (2, 2));
}

/// Connecting where nobody listens ends in ConnectFailed for that id.
pub async fn connect_refused(choice: TransportChoice, nobody: SocketAddr) {
    let mut c = client(choice).await;
    let id = c.connect(&[nobody]).await.unwrap();
    let (down, reason) = expect_down(&mut c).await;
    assert_eq!(down, id);
    assert!(matches!(reason, DownReason::ConnectFailed(_)), "{reason:?}");
}

/// `n` clients (one endpoint each, as `n` PEs would be) associated with one server; each
/// message is echoed on the association it came on. Then one more than the limit is refused.
pub async fn many_associations(choice: TransportChoice, listen: SocketAddr, n: usize) {
    let mut cfg = EndpointConfig::listening(choice, &[listen]);
    cfg.limits.max_associations = n;
    let mut s = Endpoint::bind(cfg).await.unwrap();
    let target = s.local_addrs().to_vec();
    let (done_tx, mut done_rx) = tokio::sync::mpsc::channel(n);
    let mut clients = Vec::new();
    for i in 0..n {
        let target = target.clone();
        let done = done_tx.clone();
        clients.push(tokio::spawn(async move {
            let mut c = client(choice).await;
            let id = c.connect(&target).await.unwrap();
            assert_eq!(expect_up(&mut c).await.0, id);
            let msg = format!("client {i}").into_bytes();
            c.send(id, 33, (i % 2) as u16, msg.clone()).await.unwrap();
            let (rid, ppid, stream, data) = expect_message(&mut c).await;
            assert_eq!((rid, ppid, stream), (id, 33, (i % 2) as u16));
            assert_eq!(data, msg, "client {i} got its own message back");
            done.send(()).await.unwrap();
            // Stay associated until the test ends.
            c
        }));
    }
    drop(done_tx);
    let mut server_ids = std::collections::HashSet::new();
    let mut finished = 0;
    while finished < n {
        tokio::select! {
            e = next(&mut s) => match e {
                Event::AssociationUp { id, .. } => { server_ids.insert(id); }
                Event::Message { id, ppid, stream, data } => {
                    assert!(server_ids.contains(&id));
                    s.send(id, ppid, stream, data).await.unwrap();
                }
                // Tests running beside this one add and remove addresses of the host.
                Event::PeerAddressChange { .. } => {}
                e => panic!("server: {e:?}"),
            },
            d = tokio::time::timeout(WAIT, done_rx.recv()) => {
                d.expect("clients stalled").expect("client failed");
                finished += 1;
            }
        }
    }
    assert_eq!(server_ids.len(), n);
    assert_eq!(s.associations().len(), n);
    let mut keep = Vec::new();
    for c in clients {
        keep.push(c.await.expect("client task"));
    }
    // One more than the limit: refused by the server.
    let mut extra = client(choice).await;
    let xid = extra.connect(&target).await.unwrap();
    loop {
        match next_assoc_event(&mut extra).await {
            Event::AssociationUp { id, .. } if id == xid => continue,
            Event::AssociationDown { id, reason } if id == xid => {
                assert!(
                    matches!(
                        reason,
                        DownReason::PeerAborted
                            | DownReason::PeerClosed
                            | DownReason::ConnectFailed(_)
                    ),
                    "{reason:?}"
                );
                break;
            }
            e => panic!("{e:?}"),
        }
    }
    assert_eq!(s.stats().refused, 1);
    assert_eq!(s.associations().len(), n);
    drop(keep);
}

/// Messages sent with the "more follows" hint arrive, in order, once a send without it ends the
/// run. `held` (SCTP): until then the hinted ones are held back to go in one packet.
pub async fn hinted_sends_arrive_in_order(choice: TransportChoice, listen: SocketAddr, held: bool) {
    let (mut s, c, _, cid) = pair(choice, &[listen]).await;
    let h = c.handle();
    for i in 0..40u32 {
        h.try_send_hinted(cid, 11, 0, i.to_be_bytes().to_vec(), true)
            .await
            .expect("hinted send");
    }
    if held {
        let early = tokio::time::timeout(Duration::from_millis(300), s.next_event()).await;
        assert!(early.is_err(), "hinted messages were not held: {early:?}");
    }
    h.try_send(cid, 11, 0, 40u32.to_be_bytes().to_vec())
        .await
        .expect("last send");
    for i in 0..=40u32 {
        let (_, ppid, _, data) = expect_message(&mut s).await;
        assert_eq!((ppid, &data[..]), (11, &i.to_be_bytes()[..]));
    }
}
