//! Kernel SCTP. Where the kernel has no SCTP each test prints "SCTP not available: skipped" and
//! returns, unless RSERPOOL_SCTP_TESTS=required, in which case it fails. `scripts/test-sctp`
//! runs this binary with RSERPOOL_SCTP_TESTS=required where SCTP exists (directly, or inside
//! the SCTP virtual machine).
//!
//! The multi-homing and dead-peer tests add dummy interfaces (root, CAP_NET_ADMIN); without
//! that they are skipped the same way unless required.

mod common;

use common::*;
use rserpool_transport::{
    DownReason, Endpoint, EndpointConfig, Event, PathState, TransportChoice, TransportKind,
};
use std::net::SocketAddr;
use std::process::Command;
use std::time::{Duration, Instant};

const SCTP: TransportChoice = TransportChoice::Sctp;

fn required() -> bool {
    std::env::var("RSERPOOL_SCTP_TESTS").as_deref() == Ok("required")
}

/// `true` if the test should run; reports a skip (or fails, when required) otherwise.
fn sctp() -> bool {
    match rserpool_transport::sctp_available() {
        Ok(()) => true,
        Err(e) if required() => panic!("RSERPOOL_SCTP_TESTS=required but no kernel SCTP: {e}"),
        Err(e) => {
            println!("SCTP not available: skipped ({e})");
            false
        }
    }
}

fn ip(args: &str) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args.split_whitespace())
        .output()
        .map_err(|e| format!("ip {args}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {args}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// A dummy interface holding a /24 with two addresses. Removing the victim address makes it
/// a black hole: packets to it are routed into the dummy device, which drops them, and nothing
/// answers: a peer host that vanished without a word.
struct Dummy {
    name: String,
    victim: String,
}

impl Dummy {
    fn add(name: &str, keep: &[&str], victim: &str) -> Option<Dummy> {
        let _ = ip(&format!("link del {name}"));
        let mut r = ip(&format!("link add {name} type dummy"));
        for a in keep.iter().chain([&victim]) {
            r = r.and_then(|_| ip(&format!("addr add {a}/24 dev {name}")));
        }
        let r = r.and_then(|_| ip(&format!("link set {name} up")));
        match r {
            Ok(()) => Some(Dummy {
                name: name.into(),
                victim: victim.into(),
            }),
            Err(e) if required() => panic!("cannot set up interface {name}: {e}"),
            Err(e) => {
                println!("SCTP network test not run: needs root to add interfaces ({e}): skipped");
                None
            }
        }
    }

    /// Packets to the victim address stop arriving (its local route is removed, so they follow
    /// the /24 into the dummy device), while it stays configured as a source: a network path
    /// that fails one way.
    fn blackhole(&self) {
        ip(&format!(
            "route del local {} dev {} table local",
            self.victim, self.name
        ))
        .expect("route del");
    }

    fn vanish(&self) {
        ip(&format!("addr del {}/24 dev {}", self.victim, self.name)).expect("addr del");
    }
}

impl Drop for Dummy {
    fn drop(&mut self) {
        let _ = ip(&format!("link del {}", self.name));
    }
}

/// Fast failure detection, generous enough for an emulated VM.
/// With `listen` false, a client bound to `addrs` (the dummy's address that stays).
fn fast(addrs: &[SocketAddr], listen: bool) -> EndpointConfig {
    let mut c = EndpointConfig::new(SCTP);
    c.local_addrs = addrs.to_vec();
    c.accept = listen;
    c.sctp.heartbeat_interval = Some(Duration::from_millis(300));
    c.sctp.rto_initial = Duration::from_millis(300);
    c.sctp.rto_min = Duration::from_millis(200);
    c.sctp.rto_max = Duration::from_millis(400);
    c.sctp.path_max_retrans = 1;
    c.sctp.association_max_retrans = 2;
    c
}

#[tokio::test]
async fn ppid_stream_and_order_v4() {
    if sctp() {
        ppid_stream_and_order(SCTP, addr("127.0.0.1:0")).await;
    }
}

#[tokio::test]
async fn ppid_stream_and_order_v6() {
    if sctp() {
        ppid_stream_and_order(SCTP, addr("[::1]:0")).await;
    }
}

#[tokio::test]
async fn hinted_sends_are_held_then_bundled_in_order() {
    if sctp() {
        common::hinted_sends_arrive_in_order(SCTP, addr("127.0.0.1:0"), true).await;
    }
}

#[tokio::test]
async fn large_messages_64k() {
    if sctp() {
        large_messages(SCTP, addr("127.0.0.1:0")).await;
    }
}

#[tokio::test]
async fn close_and_abort_reasons() {
    if sctp() {
        close_and_abort(SCTP, addr("127.0.0.1:0")).await;
    }
}

#[tokio::test]
async fn connect_refused_is_reported() {
    if sctp() {
        // Port 9 (discard): no SCTP listener there; the peer kernel answers INIT with ABORT.
        connect_refused(SCTP, addr("127.0.0.1:9")).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_associations_100() {
    if sctp() {
        many_associations(SCTP, addr("127.0.0.1:0"), 100).await;
    }
}

#[tokio::test]
async fn auto_picks_sctp() {
    if sctp() {
        let ep = Endpoint::bind(EndpointConfig::new(TransportChoice::Auto))
            .await
            .unwrap();
        assert_eq!(ep.kind(), TransportKind::Sctp);
    }
}

#[tokio::test]
async fn multihoming_two_addresses() {
    if !sctp() {
        return;
    }
    // 127.0.0.0/8 is all loopback: two addresses without any setup.
    let listen = [addr("127.0.0.1:0"), addr("127.0.0.2:0")];
    let mut s = server(SCTP, &listen).await;
    let bound = s.local_addrs().to_vec();
    assert_eq!(bound.len(), 2, "{bound:?}");
    assert_eq!(bound[0].port(), bound[1].port());
    let mut c = client(SCTP).await;
    let cid = c.connect(&bound).await.unwrap();
    let (_, _, peer) = expect_up(&mut c).await;
    for a in &bound {
        assert!(
            peer.contains(a),
            "client sees peer paths {peer:?}, want {a}"
        );
    }
    let (sid, local, _) = expect_up(&mut s).await;
    for a in &bound {
        assert!(
            local.contains(a),
            "server association bound to {local:?}, want {a}"
        );
    }
    let info = c.association(cid).unwrap();
    assert_eq!(info.peer_addrs.len(), 2);
    c.send(cid, 11, 0, &b"over two paths"[..]).await.unwrap();
    let (id, ppid, _, d) = expect_message(&mut s).await;
    assert_eq!((id, ppid, &d[..]), (sid, 11, &b"over two paths"[..]));
}

#[tokio::test]
async fn multihoming_survives_losing_a_path() {
    if !sctp() {
        return;
    }
    let Some(d) = Dummy::add("rsp-mh1", &["10.255.1.254", "10.255.1.253"], "10.255.1.1") else {
        return;
    };
    // Server on two addresses; the client (a third address) uses the one that will fail as its
    // primary path.
    let mut s = Endpoint::bind(fast(&[addr("10.255.1.254:0"), addr("10.255.1.1:0")], true))
        .await
        .unwrap();
    let mut c = Endpoint::bind(fast(&[addr("10.255.1.253:0")], false))
        .await
        .unwrap();
    let bound = s.local_addrs().to_vec();
    assert_eq!(bound.len(), 2);
    let lost = SocketAddr::new("10.255.1.1".parse().unwrap(), bound[0].port());
    let kept = SocketAddr::new("10.255.1.254".parse().unwrap(), bound[0].port());
    let cid = c.connect(&[lost, kept]).await.unwrap();
    let (_, _, peer) = expect_up(&mut c).await;
    assert!(peer.contains(&lost) && peer.contains(&kept), "{peer:?}");
    let (sid, _, _) = expect_up(&mut s).await;
    c.send(cid, 33, 0, &b"before"[..]).await.unwrap();
    assert_eq!(&expect_message(&mut s).await.3[..], b"before");
    d.blackhole();
    let t0 = Instant::now();
    loop {
        match next(&mut c).await {
            Event::PeerAddressChange { id, addr, state } if id == cid && addr == lost => {
                if state == PathState::Unreachable {
                    break;
                }
            }
            Event::PeerAddressChange { .. } => {}
            e => panic!("unexpected {e:?}"),
        }
    }
    println!("path {lost} reported unreachable after {:?}", t0.elapsed());
    // ...and the association carries on over the other one.
    c.send(cid, 33, 0, &b"still up"[..]).await.unwrap();
    let (id, _, _, data) = expect_message(&mut s).await;
    assert_eq!((id, &data[..]), (sid, &b"still up"[..]));
    assert!(c.association(cid).is_some());
}

#[tokio::test]
async fn dead_peer_is_noticed_within_the_configured_time() {
    if !sctp() {
        return;
    }
    let Some(d) = Dummy::add("rsp-dead", &["10.255.2.254"], "10.255.2.1") else {
        return;
    };
    let mut s = Endpoint::bind(fast(&[addr("10.255.2.1:0")], true))
        .await
        .unwrap();
    let mut c = Endpoint::bind(fast(&[addr("10.255.2.254:0")], false))
        .await
        .unwrap();
    let cid = c.connect(s.local_addrs()).await.unwrap();
    expect_up(&mut c).await;
    expect_up(&mut s).await;
    // The peer's host vanishes: no SHUTDOWN, no ABORT, just silence.
    d.vanish();
    let t0 = Instant::now();
    c.send(cid, 33, 0, &b"into the void"[..]).await.unwrap();
    let mut send_failed = false;
    let reason = loop {
        match next(&mut c).await {
            Event::AssociationDown { id, reason } => {
                assert_eq!(id, cid);
                break reason;
            }
            Event::SendFailed { id, failure } => {
                assert_eq!(id, cid);
                assert_eq!(failure.ppid, 33);
                send_failed = true;
            }
            Event::PeerAddressChange { .. } => {}
            e => panic!("unexpected {e:?}"),
        }
    };
    let took = t0.elapsed();
    assert_eq!(reason, DownReason::KeepAliveTimeout);
    println!(
        "dead peer noticed after {took:?} (heartbeat 300 ms, RTO 200-400 ms, 2 retransmissions)"
    );
    // Worst case by the settings: heartbeat interval + RTO jitter, then 3 RTOs of at most
    // 400 ms: about 2 s. Generous bound for the emulated VM's clock and scheduling.
    assert!(took < Duration::from_secs(15), "took {took:?}");
    // The undelivered message is reported, before or just after the association goes down.
    if !send_failed {
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline && !send_failed {
            if let Ok(Some(Event::SendFailed { failure, .. })) =
                tokio::time::timeout(Duration::from_millis(500), c.next_event()).await
            {
                assert_eq!(&failure.data[..], b"into the void");
                send_failed = true;
            }
        }
    }
    assert!(send_failed, "the lost message was reported");
    assert_eq!(c.stats().timeouts, 1);
}

#[tokio::test]
async fn oversized_message_from_peer_aborts_only_that_association() {
    if !sctp() {
        return;
    }
    let mut cfg = EndpointConfig::listening(SCTP, &[addr("127.0.0.1:0")]);
    cfg.limits.max_message_size = 1000;
    let mut s = Endpoint::bind(cfg).await.unwrap();
    let mut c = client(SCTP).await;
    let bad = c.connect(s.local_addrs()).await.unwrap();
    expect_up(&mut c).await;
    let (sbad, _, _) = expect_up(&mut s).await;
    // SCTP allows one association per pair of endpoints: the second comes from another one.
    assert!(matches!(
        c.connect(s.local_addrs()).await,
        Err(rserpool_transport::TransportError::AlreadyAssociated(_))
    ));
    let mut c2 = client(SCTP).await;
    let good = c2.connect(s.local_addrs()).await.unwrap();
    expect_up(&mut c2).await;
    let (sgood, _, _) = expect_up(&mut s).await;
    c.send(bad, 33, 0, vec![1u8; 5000]).await.unwrap();
    let (id, reason) = expect_down(&mut s).await;
    assert_eq!(id, sbad);
    assert!(
        matches!(
            reason,
            DownReason::Protocol(rserpool_transport::tcp::frame::FrameError::TooLarge {
                limit: 1000,
                ..
            })
        ),
        "{reason:?}"
    );
    assert_eq!(expect_down(&mut c).await, (bad, DownReason::PeerAborted));
    c2.send(good, 33, 0, vec![2u8; 1000]).await.unwrap();
    let (id, _, _, d) = expect_message(&mut s).await;
    assert_eq!((id, d.len()), (sgood, 1000));
}
