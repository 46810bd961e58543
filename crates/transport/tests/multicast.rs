//! UDP multicast announces on the loopback.

use rserpool_transport::multicast::{
    default_group_v4, default_group_v6, Interface, Ipv6Scope, MulticastConfig, MulticastSocket,
    Profile,
};
use rserpool_wire::{
    asap, enrp, AsapMessage, Codec, EnrpMessage, PeChecksum, Protocol, RegistrarId,
};
use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(10);

/// The profile's group on a port of this test run, so parallel runs and real registrars on the
/// well-known ports do not hear each other.
fn on_test_port(group: SocketAddr, offset: u16) -> SocketAddr {
    let port = 20_000 + (std::process::id() % 20_000) as u16 + offset;
    SocketAddr::new(group.ip(), port)
}

fn loopback_v4(group: SocketAddr) -> MulticastConfig {
    MulticastConfig {
        group,
        interfaces: vec![Interface::V4(Ipv4Addr::LOCALHOST)],
        ttl: 1,
        loopback: true,
        max_datagram: 65_535,
    }
}

#[tokio::test]
async fn server_announce_reaches_every_listener_on_the_rsplib_group() {
    let group = on_test_port(default_group_v4(Profile::Rsplib, Protocol::Asap), 0);
    assert_eq!(group.ip().to_string(), "239.0.0.50");
    let cfg = loopback_v4(group);
    // Two registrars on one host both hear it (SO_REUSEPORT); the sender hears itself too.
    let a = MulticastSocket::open(&cfg).unwrap();
    let b = MulticastSocket::open(&cfg).unwrap();
    let codec = Codec::default();
    let announce = codec
        .encode(&AsapMessage::ServerAnnounce(asap::ServerAnnounce {
            server_id: RegistrarId(0x1dee_a448),
            transports: vec![],
        }))
        .unwrap();
    a.send(&announce).await.unwrap();
    for s in [&a, &b] {
        let d = tokio::time::timeout(WAIT, s.recv()).await.unwrap().unwrap();
        assert_eq!(d.data, announce);
        assert!(d.source.ip().is_loopback(), "{}", d.source);
        let m = codec.decode::<AsapMessage>(&d.data).unwrap().message;
        assert!(matches!(
            m,
            AsapMessage::ServerAnnounce(asap::ServerAnnounce {
                server_id: RegistrarId(0x1dee_a448),
                ..
            })
        ));
    }
}

#[tokio::test]
async fn enrp_presence_on_the_iana_group_and_groups_are_kept_apart() {
    let enrp_group = on_test_port(default_group_v4(Profile::Rfc, Protocol::Enrp), 1);
    assert_eq!(enrp_group.ip().to_string(), "224.0.1.185");
    let other = on_test_port(default_group_v4(Profile::Rsplib, Protocol::Enrp), 1);
    let rx = MulticastSocket::open(&loopback_v4(enrp_group)).unwrap();
    let rx_other = MulticastSocket::open(&loopback_v4(other)).unwrap();
    let mut cfg = loopback_v4(enrp_group);
    cfg.loopback = true;
    let tx = MulticastSocket::open(&cfg).unwrap();
    let codec = Codec::default();
    let presence = codec
        .encode(&EnrpMessage::Presence(enrp::Presence {
            peers: enrp::Peers {
                sender: RegistrarId(7),
                receiver: RegistrarId(0),
            },
            reply_required: false,
            checksum: PeChecksum(0xffff),
            server_information: None,
        }))
        .unwrap();
    tx.send(&presence).await.unwrap();
    let d = tokio::time::timeout(WAIT, rx.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(d.data, presence);
    assert!(matches!(
        codec.decode::<EnrpMessage>(&d.data).unwrap().message,
        EnrpMessage::Presence(_)
    ));
    // Same port, other group: nothing arrives there.
    let r = tokio::time::timeout(Duration::from_millis(300), rx_other.recv()).await;
    assert!(
        r.is_err(),
        "a datagram for another group leaked through: {r:?}"
    );
}

#[tokio::test]
async fn oversized_datagram_is_dropped_with_an_error() {
    let group = on_test_port(default_group_v4(Profile::Rsplib, Protocol::Enrp), 3);
    let mut small = loopback_v4(group);
    small.max_datagram = 16;
    let rx = MulticastSocket::open(&small).unwrap();
    let tx = MulticastSocket::open(&loopback_v4(group)).unwrap();
    tx.send(&[0u8; 100]).await.unwrap();
    tx.send(&[1u8; 8]).await.unwrap();
    let e = tokio::time::timeout(WAIT, rx.recv())
        .await
        .unwrap()
        .unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::InvalidData);
    let d = tokio::time::timeout(WAIT, rx.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(&d.data[..], &[1u8; 8]);
}

#[tokio::test]
async fn bad_configuration_is_refused() {
    let mut c = loopback_v4("127.0.0.1:3863".parse().unwrap());
    assert!(MulticastSocket::open(&c).is_err(), "unicast group");
    c.group = "239.0.0.50:3863".parse().unwrap();
    c.interfaces = vec![Interface::V6Index(1)];
    assert!(
        MulticastSocket::open(&c).is_err(),
        "IPv6 interface for IPv4 group"
    );
    c.interfaces.clear();
    assert!(MulticastSocket::open(&c).is_err(), "no interface");
}

#[tokio::test]
async fn ipv6_group_ff05_133() {
    let group = on_test_port(default_group_v6(Ipv6Scope::SiteLocal, Protocol::Asap), 4);
    assert_eq!(group.ip().to_string(), "ff05::133");
    // The loopback interface: a test sends multicast nowhere else.
    // SAFETY: if_nametoindex reads a NUL-terminated string and nothing else.
    let lo = unsafe { libc::if_nametoindex(c"lo".as_ptr()) };
    if lo == 0 {
        println!("no interface named lo here: skipped");
        return;
    }
    let cfg = MulticastConfig {
        group,
        interfaces: vec![Interface::V6Index(lo)],
        ttl: 1,
        loopback: true,
        max_datagram: 65_535,
    };
    let s = match MulticastSocket::open(&cfg) {
        Ok(s) => s,
        Err(e) => {
            println!("IPv6 multicast not available here ({e}): skipped");
            return;
        }
    };
    match s.send(b"\x0a\x00\x00\x08\x00\x00\x00\x02").await {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NetworkUnreachable => {
            println!("no IPv6 multicast route on this machine ({e}): skipped");
            return;
        }
        Err(e) => panic!("{e}"),
    }
    let d = tokio::time::timeout(WAIT, s.recv()).await.unwrap().unwrap();
    assert_eq!(&d.data[..], b"\x0a\x00\x00\x08\x00\x00\x00\x02");
}

/// Guard: no test in the repository opens a multicast socket on an interface the kernel chooses
/// (`Interface::Default`, `MulticastConfig::for_profile`), which could send beyond the host;
/// tests use the loopback interface (or a network namespace they create).
#[test]
fn tests_send_multicast_on_loopback_only() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut offenders = Vec::new();
    let mut dirs = vec![root.join("crates")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap().flatten() {
            let path = entry.path();
            if path.is_dir() {
                if path.file_name().is_some_and(|n| n != "target") {
                    dirs.push(path);
                }
                continue;
            }
            let in_tests = path.components().any(|c| c.as_os_str() == "tests");
            if !in_tests || path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap();
            let code: String = text
                .lines()
                .filter(|l| !l.trim_start().starts_with("//"))
                .collect::<Vec<_>>()
                .join("\n");
            for pattern in [
                concat!("Interface::", "Default"),
                concat!("for_", "profile("),
            ] {
                if code.contains(pattern) {
                    offenders.push(format!("{}: {pattern}", path.display()));
                }
            }
        }
    }
    assert!(
        offenders.is_empty(),
        "multicast beyond loopback in tests: {offenders:?}"
    );
}
