//! The gateway in front of an RSerPool pool: an rserpool registrar on loopback (TCP mapping),
//! PEs that register and leave, and the gateway binding client sessions to exactly the PEs the
//! registrar lists, chosen by the pool's own policy.

use rserpool_endpoint::driver::PoolElementHandle;
use rserpool_lsnat::core::Protocol;
use rserpool_lsnat::{member_source, start, Config, Overrides};
use rserpool_testkit::{pe_config, registered_pe, until, NamedService, TestRegistrar, WAIT};
use rserpool_wire::PoolPolicy;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A PE of "WebPool" serving `service`, registered at `registrar`.
async fn pe(
    registrar: &TestRegistrar,
    service: &NamedService,
    policy: PoolPolicy,
) -> PoolElementHandle {
    let config = pe_config("WebPool", service.addr(), policy);
    registered_pe(registrar.access(), config, Duration::from_secs(5))
        .await
        .unwrap()
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_follow_the_registrar_and_the_pool_policy() {
    let r = TestRegistrar::start(|_| {}).await;
    let registrar = r.asap_addr();

    let a = NamedService::start("A").await.unwrap();
    let b = NamedService::start("B").await.unwrap();
    let c = NamedService::start("C").await.unwrap();
    let pe_a = pe(&r, &a, PoolPolicy::RoundRobin).await;
    let _pe_b = pe(&r, &b, PoolPolicy::RoundRobin).await;

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

    until("both PEs as members", WAIT, async || {
        spread(gateway, 4).await.len() == 2
    })
    .await;
    // Round robin (the pool's policy): the sessions alternate.
    let seen = spread(gateway, 10).await;
    assert_eq!((seen["A"], seen["B"]), (5, 5), "{seen:?}");

    // A leaves the pool: no new session goes to it.
    pe_a.deregister().await;
    until("A gone", WAIT, async || {
        !spread(gateway, 4).await.contains_key("A")
    })
    .await;
    assert_eq!(spread(gateway, 6).await.get("B"), Some(&6));

    // C joins: it gets sessions.
    let _pe_c = pe(&r, &c, PoolPolicy::RoundRobin).await;
    until("C as member", WAIT, async || {
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
