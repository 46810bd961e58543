//! The gateway in front of an RSerPool pool: an rserpool registrar on loopback (TCP mapping),
//! PEs that register and leave, and the gateway binding client sessions to exactly the PEs the
//! registrar lists, chosen by the pool's own policy.

use rserpool_endpoint::driver::{PoolElementHandle, RegistrarAccess};
use rserpool_endpoint::pe::PoolElementConfig;
use rserpool_lsnat::core::Protocol;
use rserpool_lsnat::{member_source, start, Config, Overrides};
use rserpool_registrar::driver::{run, DriverConfig};
use rserpool_registrar::{AddressScope, Profile, RegistrarConfig};
use rserpool_transport::TransportChoice;
use rserpool_wire::{PoolHandle, PoolPolicy, TransportAddress, UserTransport};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// A TCP service that answers every connection with its own name.
async fn named_service(name: &'static str) -> (SocketAddr, tokio::task::JoinHandle<()>) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let task = tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = l.accept().await else {
                continue;
            };
            tokio::spawn(async move {
                let mut b = [0u8; 16];
                if s.read(&mut b).await.is_ok() {
                    let _ = s.write_all(name.as_bytes()).await;
                }
            });
        }
    });
    (addr, task)
}

async fn pe(registrar: SocketAddr, addr: SocketAddr, policy: PoolPolicy) -> PoolElementHandle {
    let mut h = PoolElementHandle::start(
        PoolElementConfig::new(
            PoolHandle::from("WebPool"),
            UserTransport::Address(TransportAddress::tcp(addr.port(), addr.ip())),
            policy,
        ),
        RegistrarAccess::single(registrar, TransportChoice::Tcp),
    )
    .await
    .unwrap();
    assert!(h.wait_registered(Duration::from_secs(5)).await);
    h
}

/// Opens `n` sessions through the gateway and counts which service answered each.
async fn spread(gateway: SocketAddr, n: usize) -> HashMap<String, usize> {
    let mut seen = HashMap::new();
    for _ in 0..n {
        let mut s = TcpStream::connect(gateway).await.unwrap();
        s.write_all(b"hi").await.unwrap();
        let mut name = String::new();
        tokio::time::timeout(Duration::from_secs(3), s.read_to_string(&mut name))
            .await
            .expect("an answer through the gateway")
            .unwrap();
        *seen.entry(name).or_insert(0) += 1;
    }
    seen
}

async fn until(what: &str, mut f: impl AsyncFnMut() -> bool) {
    let end = Instant::now() + Duration::from_secs(10);
    while !f().await {
        assert!(Instant::now() < end, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_follow_the_registrar_and_the_pool_policy() {
    let mut core = RegistrarConfig::new(Profile::Rsplib);
    core.min_address_scope = AddressScope::Loopback;
    core.announce = None;
    let mut rc = DriverConfig::new(core);
    rc.transport = TransportChoice::Tcp;
    rc.asap_listen = vec!["127.0.0.1:0".parse().unwrap()];
    let (tx, rx) = tokio::sync::oneshot::channel();
    tokio::spawn(run(rc, tx, std::future::pending()));
    let registrar = rx.await.unwrap().asap_addrs[0];

    let (a_addr, _a) = named_service("A").await;
    let (b_addr, _b) = named_service("B").await;
    let (c_addr, _c) = named_service("C").await;
    let pe_a = pe(registrar, a_addr, PoolPolicy::RoundRobin).await;
    let _pe_b = pe(registrar, b_addr, PoolPolicy::RoundRobin).await;

    let config = Config::from_overrides(&Overrides {
        listen: vec!["tcp:127.0.0.1:0".into()],
        pool_handle: Some("WebPool".into()),
        registrars: vec![registrar.to_string()],
        transport: Some("tcp".into()),
        ..Overrides::default()
    })
    .unwrap();
    assert_eq!(
        config.core.policy.to_string(),
        "pool",
        "the pool's policy by default"
    );
    let mut config = config;
    config.rserpool.as_mut().unwrap().refresh = Duration::from_millis(100);
    let gw = start(config.clone(), member_source(&config)).await.unwrap();
    let gateway = gw.listener(Protocol::Tcp).unwrap();

    until("both PEs as members", async || {
        spread(gateway, 4).await.len() == 2
    })
    .await;
    // Round robin (the pool's policy): the sessions alternate.
    let seen = spread(gateway, 10).await;
    assert_eq!((seen["A"], seen["B"]), (5, 5), "{seen:?}");

    // A leaves the pool: no new session goes to it.
    pe_a.deregister().await;
    until("A gone", async || {
        !spread(gateway, 4).await.contains_key("A")
    })
    .await;
    assert_eq!(spread(gateway, 6).await.get("B"), Some(&6));

    // C joins: it gets sessions.
    let _pe_c = pe(registrar, c_addr, PoolPolicy::RoundRobin).await;
    until("C as member", async || {
        spread(gateway, 4).await.contains_key("C")
    })
    .await;

    let status = serde_json::to_value(gw.status()).unwrap();
    let text = status.to_string();
    assert!(
        text.contains("pe:"),
        "members are keyed by PE identifier: {text}"
    );
    gw.shutdown().await;
}

#[test]
fn rserpool_configuration_errors_name_the_field() {
    let err = |toml: &str| {
        Config::from_toml(toml, "test", &Overrides::default())
            .unwrap_err()
            .to_string()
    };
    let base = "[[listener]]\naddress = \"127.0.0.1:8080\"\n";
    assert!(err(&format!(
        "{base}[pool.rserpool]\npool-handle = \"\"\nregistrars = [\"127.0.0.1:3863\"]\n"
    ))
    .contains("pool.rserpool.pool-handle"));
    assert!(
        err(&format!("{base}[pool.rserpool]\npool-handle = \"P\"\n"))
            .contains("pool.rserpool.registrars")
    );
    assert!(err(&format!(
        "{base}[pool.rserpool]\npool-handle = \"P\"\nregistrars = [\"nowhere\"]\n"
    ))
    .contains("pool.rserpool.registrars[0]"));
    assert!(err(&format!("{base}[pool.rserpool]\npool-handle = \"P\"\nregistrars = [\"127.0.0.1:3863\"]\ntransport = \"quic\"\n"))
        .contains("pool.rserpool.transport"));
    assert!(err(&format!("{base}[pool]\nmembers = [{{ address = \"127.0.0.1:1\" }}]\n[pool.rserpool]\npool-handle = \"P\"\nregistrars = [\"127.0.0.1:3863\"]\n"))
        .contains("not both"));
    let ok = Config::from_toml(
        &format!("{base}[pool.rserpool]\npool-handle = \"P\"\nregistrars = [\"127.0.0.1:3863\"]\nrefresh = \"250ms\"\n"),
        "test",
        &Overrides::default(),
    )
    .unwrap();
    assert_eq!(ok.rserpool.unwrap().refresh, Duration::from_millis(250));
}
