//! RFC 5355's threats against a live registrar over the TCP mapping on loopback: an attacker
//! on the same host deregisters or re-registers another association's PE, floods unreachable
//! reports about a healthy PE, and floods associations, registrations and handle resolutions.
//! Each attack is refused and counted, and the legitimate PE and users keep being served.
//!
//! The attacker's associations come from 127.0.0.2, the legitimate ones from 127.0.0.1 (the
//! whole of 127.0.0.0/8 is loopback on Linux).

use rserpool_endpoint::driver::PoolElementHandle;
use rserpool_registrar::{RateLimit, RateLimited, RemovalCause, SecurityRefusal};
use rserpool_testkit::{
    deregistration, endpoint_unreachable, handle_resolution, pe_config, registered_pe,
    registration, tcp_pe, wait_for, AsapClient, TestRegistrar,
};
use rserpool_wire::asap::AsapMessage;
use rserpool_wire::{
    CauseCode, PoolElement, PoolElementId, PoolPolicy, RegistrarId, UserTransport,
};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

const LEGIT: &str = "127.0.0.1";
const ATTACKER: &str = "127.0.0.2";

/// A registrar of its own identifier and seed, its configuration then changed by `tweak`.
async fn start_registrar(
    tweak: impl FnOnce(&mut rserpool_registrar::driver::DriverConfig),
) -> TestRegistrar {
    TestRegistrar::start(|c| {
        c.core.registrar_id = RegistrarId(0x5ec);
        c.core.seed = Some(5);
        tweak(c);
    })
    .await
}

/// A raw ASAP client from `from`; `None` when the association is refused.
async fn try_connect(r: &TestRegistrar, from: &str) -> Option<AsapClient> {
    AsapClient::connect_from(r.asap_addr(), from.parse::<IpAddr>().unwrap())
        .await
        .ok()
}

async fn connect(r: &TestRegistrar, from: &str) -> AsapClient {
    try_connect(r, from).await.expect("connects")
}

fn pe(id: PoolElementId, port: u16) -> PoolElement {
    pe_at(id, LEGIT, port)
}

fn pe_at(id: PoolElementId, address: &str, port: u16) -> PoolElement {
    tcp_pe(id.0, address.parse().unwrap(), port)
}

/// A legitimate PE, run by the endpoint crate's driver (it answers every keep-alive).
async fn legit_pe(r: &TestRegistrar, pool: &str, port: u16) -> PoolElementHandle {
    let at = SocketAddr::new(LEGIT.parse().unwrap(), port);
    registered_pe(
        r.access(),
        pe_config(pool, at, PoolPolicy::RoundRobin),
        Duration::from_secs(20),
    )
    .await
    .unwrap()
}

/// Resolves `pool` and returns the user-transport ports of the PEs answered.
async fn resolve_ports(pu: &mut AsapClient, pool: &str) -> Vec<u16> {
    pu.send(&handle_resolution(pool, None)).await.unwrap();
    match pu.answer(Duration::from_secs(20)).await {
        Ok(AsapMessage::HandleResolutionResponse(h)) => h
            .pool_elements
            .iter()
            .filter_map(|p| match &p.user_transport {
                UserTransport::Address(t) => Some(t.port),
                UserTransport::Opaque(_) => None,
            })
            .collect(),
        other => panic!("no handle resolution response: {other:?}"),
    }
}

fn cause_of(m: &Option<AsapMessage>) -> Option<CauseCode> {
    match m {
        Some(AsapMessage::RegistrationResponse(r)) => r.error.as_ref().and_then(|e| e.code()),
        Some(AsapMessage::DeregistrationResponse(d)) => d.error.as_ref().and_then(|e| e.code()),
        _ => None,
    }
}

#[tokio::test]
async fn another_association_can_neither_deregister_nor_take_over_a_live_pe() {
    let r = start_registrar(|c| {
        c.core.keep_alive_interval = Duration::from_secs(60);
        c.core.keep_alive_timeout = Duration::from_secs(2);
    })
    .await;
    let owner = legit_pe(&r, "EchoPool", 7001).await;
    let id = owner.id();
    let mut pu = connect(&r, LEGIT).await;
    assert_eq!(resolve_ports(&mut pu, "EchoPool").await, vec![7001]);

    // Unauthorised deregistration (RFC 5355 §3.4), from the same host as the PE (another
    // port), so that the PE's user-transport address is one of the attacker's association.
    let mut attacker = connect(&r, LEGIT).await;
    attacker
        .send(&deregistration("EchoPool", id.0))
        .await
        .unwrap();
    let answer = attacker.answer(Duration::from_secs(20)).await.ok();
    assert!(
        matches!(answer, Some(AsapMessage::DeregistrationResponse(_))),
        "{answer:?}"
    );
    assert_eq!(cause_of(&answer), Some(CauseCode::RejectedSecurity));
    assert_eq!(resolve_ports(&mut pu, "EchoPool").await, vec![7001]);

    // Registration spoofing (RFC 5355 §3.3): the same identifier, the attacker's port. The
    // owner answers the probe, so the claim is refused.
    attacker
        .send(&registration("EchoPool", pe(id, 7999)))
        .await
        .unwrap();
    let answer = attacker.answer(Duration::from_secs(20)).await.ok();
    assert_eq!(
        cause_of(&answer),
        Some(CauseCode::RejectedSecurity),
        "{answer:?}"
    );
    assert_eq!(resolve_ports(&mut pu, "EchoPool").await, vec![7001]);

    let m = r.metrics();
    assert_eq!(m.refusals_by(SecurityRefusal::ForeignDeregistration), 1);
    assert_eq!(m.refusals_by(SecurityRefusal::ForeignRegistration), 1);
    assert_eq!(m.ownership_probes, 1);
    assert_eq!(m.claims_granted, 0);
    assert_eq!(m.deregistrations, 0);
    assert!(m.keep_alives_acked >= 1, "the owner answered the probe");
    assert!(owner.status().keep_alives >= 1);
    let text = m.render_prometheus();
    assert!(text
        .contains("rserpool_registrar_security_refusals_total{reason=\"foreign_registration\"} 1"));
    // The owner still deregisters its own PE.
    owner.deregister().await;
    wait_for(
        "the owner's deregistration",
        Duration::from_secs(20),
        || r.metrics().deregistrations == 1,
    )
    .await;
}

#[tokio::test]
async fn a_restarted_pe_gets_its_identifier_back_within_one_probe_timeout() {
    let probe_timeout = Duration::from_millis(500);
    let r = start_registrar(|c| {
        c.core.keep_alive_interval = Duration::from_secs(60);
        c.core.keep_alive_timeout = probe_timeout;
    })
    .await;
    // The old incarnation: registered, association still up, but it answers nothing (a
    // frozen process, or one whose host lost its route).
    let id = PoolElementId(0x0bad_cafe);
    let mut old = connect(&r, LEGIT).await;
    old.send(&registration("EchoPool", pe(id, 7001)))
        .await
        .unwrap();
    let answer = old.answer(Duration::from_secs(20)).await.ok();
    assert!(
        matches!(&answer, Some(AsapMessage::RegistrationResponse(x)) if !x.reject),
        "{answer:?}"
    );
    let mut new = connect(&r, LEGIT).await;
    let started = tokio::time::Instant::now();
    new.send(&registration("EchoPool", pe(id, 7002)))
        .await
        .unwrap();
    let answer = new.answer(Duration::from_secs(30)).await.ok();
    let took = started.elapsed();
    assert!(
        matches!(&answer, Some(AsapMessage::RegistrationResponse(x)) if !x.reject),
        "{answer:?}"
    );
    eprintln!("restarted PE accepted after {took:?} (probe timeout {probe_timeout:?})");
    let m = r.metrics();
    assert_eq!(m.claims_granted, 1);
    assert_eq!(m.removals_by(RemovalCause::KeepAliveTimeout), 1);
    let mut pu = connect(&r, LEGIT).await;
    assert_eq!(resolve_ports(&mut pu, "EchoPool").await, vec![7002]);
}

#[tokio::test]
async fn a_flood_of_unreachable_reports_costs_bounded_probes_not_the_pe() {
    let r = start_registrar(|c| {
        c.core.keep_alive_interval = Duration::from_secs(60);
        c.core.keep_alive_timeout = Duration::from_secs(2);
        c.core.max_unreachable_probes = 3;
        c.core.unreachable_probe_interval = Duration::from_secs(300);
    })
    .await;
    let healthy = legit_pe(&r, "EchoPool", 7001).await;
    let id = healthy.id();
    // Ten fresh associations, fifty reports each (within their per-client rate: 10/s, bursts
    // of 20, so some are refused by that limit too).
    let mut attackers = Vec::new();
    for _ in 0..10 {
        attackers.push(connect(&r, ATTACKER).await);
    }
    for _ in 0..50 {
        for a in &attackers {
            let _ = a.send(&endpoint_unreachable("EchoPool", id.0)).await;
        }
    }
    wait_for("every report handled", Duration::from_secs(30), || {
        let m = r.metrics();
        m.unreachable_reports + m.rate_limited_by(RateLimited::EndpointUnreachable) == 500
    })
    .await;
    wait_for("the probes answered", Duration::from_secs(30), || {
        let m = r.metrics();
        m.keep_alives_acked >= m.unreachable_probes && m.unreachable_probes >= 1
    })
    .await;
    let m = r.metrics();
    // At most one probe at a time and 3 per interval; how many of the 3 were used depends on
    // how the reports fell around the answers.
    assert!((1..=3).contains(&m.unreachable_probes), "{m:?}");
    assert_eq!(m.removals.iter().sum::<u64>(), 0, "{m:?}");
    let mut pu = connect(&r, LEGIT).await;
    assert_eq!(resolve_ports(&mut pu, "EchoPool").await, vec![7001]);
    drop(healthy);

    // A PE that does not answer is removed, for the reports, once its probe fails.
    let mut silent = connect(&r, LEGIT).await;
    let silent_id = PoolElementId(0x51_1e47);
    silent
        .send(&registration("QuietPool", pe(silent_id, 7002)))
        .await
        .unwrap();
    assert!(silent.answer(Duration::from_secs(20)).await.is_ok());
    let pu_reporter = connect(&r, LEGIT).await;
    for _ in 0..3 {
        pu_reporter
            .send(&endpoint_unreachable("QuietPool", silent_id.0))
            .await
            .unwrap();
    }
    wait_for(
        "removal after the failed probe",
        Duration::from_secs(30),
        || r.metrics().removals_by(RemovalCause::UnreachableReports) == 1,
    )
    .await;
}

#[tokio::test]
async fn one_flooding_host_does_not_starve_legitimate_clients() {
    let r = start_registrar(|c| {
        c.core.max_associations_per_address = 8;
        c.core.registration_rate = Some(RateLimit {
            rate: 20.0,
            burst: 40.0,
        });
        c.core.handle_resolution_rate = Some(RateLimit {
            rate: 50.0,
            burst: 100.0,
        });
    })
    .await;
    let _legit = legit_pe(&r, "EchoPool", 7001).await;

    // Association flood: 8 are served, the rest refused and closed.
    let mut flood = Vec::new();
    for _ in 0..20 {
        if let Some(c) = try_connect(&r, ATTACKER).await {
            flood.push(c);
        }
    }
    wait_for("refusals", Duration::from_secs(30), || {
        r.metrics()
            .refusals_by(SecurityRefusal::AssociationsPerAddress)
            == 12
    })
    .await;
    let mut alive = flood;
    let until = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let mut still = Vec::new();
        for mut c in alive {
            if c.is_up().await {
                still.push(c);
            }
        }
        alive = still;
        if alive.len() <= 8 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < until,
            "refused associations stay open"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        alive.len(),
        8,
        "8 associations from the flooding host are served"
    );

    // Registration flood over one association: the rate limit refuses most of it.
    let reg_flooder = &alive[0];
    for i in 0..500u32 {
        let _ = reg_flooder
            .send(&registration(
                "EchoPool",
                pe_at(PoolElementId(0x1000 + i), ATTACKER, 9000),
            ))
            .await;
    }
    wait_for(
        "every registration handled",
        Duration::from_secs(60),
        || {
            let m = r.metrics();
            m.registrations + m.rate_limited_by(RateLimited::Registration) == 501
        },
    )
    .await;
    assert!(r.metrics().rate_limited_by(RateLimited::Registration) > 0);

    // Resolution flood from the other associations while a legitimate user resolves.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut tasks = Vec::new();
    for c in alive.into_iter().skip(1) {
        let stop = stop.clone();
        tasks.push(tokio::spawn(async move {
            let mut c = c;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                for _ in 0..32 {
                    let _ = c.send(&handle_resolution("EchoPool", None)).await;
                }
                while c.recv(Duration::from_millis(1)).await.is_ok() {}
            }
        }));
    }
    wait_for(
        "the resolution flood to hit its limit",
        Duration::from_secs(60),
        || r.metrics().rate_limited_by(RateLimited::HandleResolution) > 0,
    )
    .await;
    let mut pu = connect(&r, LEGIT).await;
    let mut worst = Duration::ZERO;
    for _ in 0..50 {
        let t = tokio::time::Instant::now();
        let ports = resolve_ports(&mut pu, "EchoPool").await;
        worst = worst.max(t.elapsed());
        assert!(ports.contains(&7001), "{ports:?}");
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for t in tasks {
        let _ = t.await;
    }
    let m = r.metrics();
    eprintln!(
        "legitimate resolutions during the flood: 50 answered, worst latency {worst:?}; \
         flood refused: {} resolutions, {} registrations, {} associations",
        m.rate_limited_by(RateLimited::HandleResolution),
        m.rate_limited_by(RateLimited::Registration),
        m.refusals_by(SecurityRefusal::AssociationsPerAddress)
    );
    assert!(
        m.rate_limited_by(RateLimited::HandleResolution) > 0,
        "{m:?}"
    );
}
