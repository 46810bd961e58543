//! The registrar's TLS identity rules: in the core with virtual time (who may register into
//! which pool, deregister, resolve, report), then live over the TCP mapping with TLS and the PE
//! and PU drivers of rserpool-endpoint, with certificates made in the test.

#[path = "../../transport/tests/common/pki.rs"]
mod pki;

use pki::{server_names, Names, Pki};
use rserpool_endpoint::driver::{PoolElementHandle, PoolUserClient, RegistrarAccess};
use rserpool_endpoint::pu::{ResolveError, ResolverConfig};
use rserpool_registrar::access::{AccessRefusal, AccessRules, IdentityPattern, RegistrationRule};
use rserpool_registrar::{AssociationId, AssociationKind, PeerInfo, Profile, RegistrarEvent};
use rserpool_sim::fixtures::RegistrarHarness;
use rserpool_testkit::{
    deregistration, endpoint_unreachable, handle_resolution, pe_config, registration,
    TestRegistrar, LOCALHOST, WAIT,
};
use rserpool_transport::{PeerIdentity, TlsSettings};
use rserpool_wire::asap::AsapMessage;
use rserpool_wire::{
    CauseCode, PoolElement, PoolElementId, PoolHandle, PoolPolicy, RegistrarId, RegistrationLife,
    TransportAddress, TransportUse, UserTransport,
};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

fn rules(unauthenticated_resolution: bool) -> AccessRules {
    AccessRules {
        registration: vec![
            RegistrationRule::parse("dns:*.echo.test=EchoPool").unwrap(),
            RegistrationRule::parse("cn:calc-*=CalcAppPool").unwrap(),
        ],
        enrp_peers: vec![IdentityPattern::parse("dns:registrar-*.test").unwrap()],
        unauthenticated_resolution,
    }
}

fn identity(cn: &str, dns: &str) -> Arc<PeerIdentity> {
    Arc::new(PeerIdentity {
        common_names: vec![cn.into()],
        dns_names: vec![dns.into()],
        uris: vec![],
        fingerprint: [1; 32],
    })
}

fn pe(id: u32, addr: &str) -> PoolElement {
    PoolElement {
        id: PoolElementId(id),
        home_registrar: RegistrarId(0),
        registration_life: RegistrationLife::Finite(Duration::from_secs(90)),
        user_transport: UserTransport::Address(TransportAddress::sctp(
            7000,
            TransportUse::DataPlusControl,
            vec![addr.parse().unwrap()],
        )),
        policy: PoolPolicy::RoundRobin,
        asap_transport: None,
    }
}

/// The registrar core with access rules, over [`RegistrarHarness`], whose associations come
/// up with (or without) a TLS identity.
struct Core {
    h: RegistrarHarness,
    next: u64,
}

impl Core {
    fn new(unauthenticated_resolution: bool) -> Core {
        Core::with_rules(Some(rules(unauthenticated_resolution)))
    }

    fn with_rules(access: Option<AccessRules>) -> Core {
        Core {
            h: RegistrarHarness::new(Profile::Rsplib, |c| {
                c.seed = Some(1);
                c.access = access;
            }),
            next: 1,
        }
    }

    fn up(&mut self, addr: &str, who: Option<Arc<PeerIdentity>>) -> AssociationId {
        let a = AssociationId(self.next);
        self.next += 1;
        self.h.registrar.association_up_with_identity(
            Duration::ZERO,
            a,
            PeerInfo {
                kind: AssociationKind::TcpMapped,
                addresses: vec![addr.parse().unwrap()],
                port: 4000,
            },
            who,
        );
        a
    }

    /// Sends `m` over `a`; returns what the registrar answered on `a`.
    fn ask(&mut self, a: AssociationId, m: AsapMessage) -> Vec<AsapMessage> {
        self.h.deliver(a, m);
        self.h.sent_to(a)
    }

    fn refusals(&mut self) -> Vec<(Option<String>, AccessRefusal, Option<PoolHandle>)> {
        self.h
            .events()
            .into_iter()
            .filter_map(|e| match e {
                RegistrarEvent::AccessRefused {
                    identity,
                    refusal,
                    pool_handle,
                    ..
                } => Some((
                    identity.map(|i| i.common_names[0].clone()),
                    refusal,
                    pool_handle,
                )),
                _ => None,
            })
            .collect()
    }
}

fn reject_cause(answers: &[AsapMessage]) -> Option<CauseCode> {
    answers.iter().find_map(|m| match m {
        AsapMessage::RegistrationResponse(r) if r.reject => {
            Some(r.error.as_ref().unwrap().causes[0].code)
        }
        AsapMessage::HandleResolutionResponse(r) => r.error.as_ref().map(|e| e.causes[0].code),
        AsapMessage::DeregistrationResponse(r) => r.error.as_ref().map(|e| e.causes[0].code),
        _ => None,
    })
}

#[test]
fn core_applies_the_identity_rules() {
    let mut c = Core::new(false);
    let anonymous = c.up("10.0.0.1", None);
    let calc = c.up("10.0.0.2", Some(identity("calc-1", "c1.calc.test")));
    let echo = c.up("10.0.0.3", Some(identity("echo-1", "e1.echo.test")));
    let pu = c.up("10.0.0.4", Some(identity("pu-1", "pu.users.test")));

    // No certificate: refused, 0xa.
    let a = c.ask(anonymous, registration("EchoPool", pe(1, "10.0.0.1")));
    assert_eq!(reject_cause(&a), Some(CauseCode::RejectedSecurity));
    // A certificate not allowed for the pool: refused, 0xa.
    let a = c.ask(calc, registration("EchoPool", pe(2, "10.0.0.2")));
    assert_eq!(reject_cause(&a), Some(CauseCode::RejectedSecurity));
    assert_eq!(
        c.refusals(),
        vec![
            (
                None,
                AccessRefusal::RegistrationWithoutIdentity,
                Some(PoolHandle::from("EchoPool"))
            ),
            (
                Some("calc-1".into()),
                AccessRefusal::PoolNotAllowed,
                Some(PoolHandle::from("EchoPool"))
            ),
        ]
    );
    // Allowed ones register.
    let a = c.ask(echo, registration("EchoPool", pe(3, "10.0.0.3")));
    assert_eq!(reject_cause(&a), None);
    assert!(matches!(&a[..], [AsapMessage::RegistrationResponse(r)] if !r.reject));
    let a = c.ask(calc, registration("CalcAppPool", pe(4, "10.0.0.2")));
    assert!(matches!(&a[..], [AsapMessage::RegistrationResponse(r)] if !r.reject));
    assert_eq!(c.h.registrar.handlespace().len(), 2);

    // An identity not allowed for the pool cannot deregister its PEs either.
    let a = c.ask(calc, deregistration("EchoPool", 3));
    assert_eq!(reject_cause(&a), Some(CauseCode::RejectedSecurity));
    assert_eq!(c.h.registrar.handlespace().len(), 2, "the PE stays");

    // An authenticated PU resolves; an unauthenticated one is refused with 0xa, and its
    // unreachable reports are not taken.
    let a = c.ask(pu, handle_resolution("EchoPool", None));
    assert!(
        matches!(&a[..], [AsapMessage::HandleResolutionResponse(r)] if r.error.is_none() && r.pool_elements.len() == 1)
    );
    let a = c.ask(anonymous, handle_resolution("EchoPool", None));
    assert_eq!(reject_cause(&a), Some(CauseCode::RejectedSecurity));
    for _ in 0..5 {
        c.ask(anonymous, endpoint_unreachable("EchoPool", 3));
    }
    assert_eq!(c.h.registrar.metrics().unreachable_reports, 0);
    assert_eq!(c.h.registrar.handlespace().len(), 2);

    let m = c.h.registrar.metrics();
    assert_eq!(
        m.access_refused_by(AccessRefusal::RegistrationWithoutIdentity),
        1
    );
    assert_eq!(m.access_refused_by(AccessRefusal::PoolNotAllowed), 2);
    assert_eq!(
        m.access_refused_by(AccessRefusal::ResolutionWithoutIdentity),
        6
    );
    assert_eq!(m.registration_rejects[0xa], 2);
    let text = m.render_prometheus();
    assert!(
        text.contains("rserpool_registrar_access_refused_total{reason=\"pool_not_allowed\"} 2"),
        "{text}"
    );
}

#[test]
fn core_checks_enrp_peers_by_identity() {
    let mut c = Core::new(false);
    let peer = c.up("10.0.1.1", Some(identity("r1", "registrar-1.test")));
    let pe = c.up(
        "10.0.1.2",
        Some(identity("registrar-2.test", "e1.echo.test")),
    );
    let anonymous = c.up("10.0.1.3", None);
    assert_eq!(c.h.registrar.check_enrp_peer(peer), Ok(()));
    assert_eq!(
        c.h.registrar.check_enrp_peer(pe),
        Err(AccessRefusal::PeerNotAllowed),
        "a common name is not a DNS name"
    );
    assert_eq!(
        c.h.registrar.check_enrp_peer(anonymous),
        Err(AccessRefusal::PeerWithoutIdentity)
    );
    assert_eq!(
        c.refusals(),
        vec![
            (
                Some("registrar-2.test".into()),
                AccessRefusal::PeerNotAllowed,
                None
            ),
            (None, AccessRefusal::PeerWithoutIdentity, None),
        ]
    );
    assert_eq!(
        c.h.registrar
            .metrics()
            .access_refused_by(AccessRefusal::PeerNotAllowed),
        1
    );
}

#[test]
fn core_without_rules_checks_nothing() {
    let mut core = Core::with_rules(None);
    let a = core.up("10.0.0.1", None);
    let answers = core.ask(a, registration("EchoPool", pe(1, "10.0.0.1")));
    assert!(matches!(&answers[..], [AsapMessage::RegistrationResponse(r)] if !r.reject));
}

#[test]
fn core_serves_unauthenticated_users_when_allowed() {
    let mut c = Core::new(true);
    let echo = c.up("10.0.0.3", Some(identity("echo-1", "e1.echo.test")));
    c.ask(echo, registration("EchoPool", pe(3, "10.0.0.3")));
    let anonymous = c.up("10.0.0.1", None);
    let a = c.ask(anonymous, handle_resolution("EchoPool", None));
    assert!(
        matches!(&a[..], [AsapMessage::HandleResolutionResponse(r)] if r.error.is_none() && r.pool_elements.len() == 1),
        "{a:?}"
    );
    // ... but still not register.
    let a = c.ask(anonymous, registration("EchoPool", pe(1, "10.0.0.1")));
    assert_eq!(reject_cause(&a), Some(CauseCode::RejectedSecurity));
}

// ---- live, over the TCP mapping with TLS ----

async fn start_registrar(pki: &Pki, unauthenticated_resolution: bool) -> TestRegistrar {
    let mut tls = pki.settings("registrar", server_names());
    tls.require_client_certificate = false;
    TestRegistrar::start(|c| {
        c.core.access = Some(rules(unauthenticated_resolution));
        c.endpoint.tls = Some(tls);
    })
    .await
}

/// How a PE or PU with `tls` reaches the registrar.
fn access(live: &TestRegistrar, tls: TlsSettings) -> RegistrarAccess {
    let mut a = live.access();
    a.endpoint.tls = Some(tls);
    a.retry_interval = Duration::from_millis(200);
    a
}

async fn start_pe(
    live: &TestRegistrar,
    tls: TlsSettings,
    pool: &str,
    port: u16,
) -> PoolElementHandle {
    let at = SocketAddr::new(LOCALHOST, port);
    PoolElementHandle::start(
        pe_config(pool, at, PoolPolicy::RoundRobin),
        access(live, tls),
    )
    .await
    .expect("PE starts")
}

async fn resolve_with(live: &TestRegistrar, tls: TlsSettings) -> Result<usize, ResolveError> {
    let pu = PoolUserClient::start(ResolverConfig::default(), access(live, tls))
        .await
        .expect("PU starts");
    tokio::time::timeout(WAIT, pu.resolve(PoolHandle::from("EchoPool")))
        .await
        .expect("an answer")
        .map(|r| r.pool_elements.len())
}

fn echo_names() -> Names<'static> {
    Names {
        cn: "echo-1",
        dns: &["e1.echo.test"],
        ..Names::default()
    }
}

#[tokio::test]
async fn pes_are_refused_without_an_allowed_certificate_and_an_allowed_one_is_resolved() {
    let pki = Pki::new("ca");
    let rogue = Pki::new("rogue");
    let live = start_registrar(&pki, false).await;

    // No certificate: the registration is refused with 0xa.
    let no_cert = start_pe(&live, pki.anonymous(), "EchoPool", 7001).await;
    live.wait_metrics("a registration without identity refused", WAIT, |m| {
        m.access_refused_by(AccessRefusal::RegistrationWithoutIdentity) >= 1
    })
    .await;
    // A certificate from a CA the registrar does not trust: no association at all.
    let (rc, rk) = rogue.issue("rogue-echo", echo_names());
    let untrusted = start_pe(
        &live,
        TlsSettings::new(&pki.ca).with_identity(rc, rk),
        "EchoPool",
        7002,
    )
    .await;
    live.wait_metrics("an untrusted certificate refused", WAIT, |m| {
        m.tls_handshake_failures >= 1
    })
    .await;
    // A trusted certificate that is not allowed for the pool.
    let calc = start_pe(
        &live,
        pki.settings(
            "calc",
            Names {
                cn: "calc-1",
                dns: &["c1.calc.test"],
                ..Names::default()
            },
        ),
        "EchoPool",
        7003,
    )
    .await;
    live.wait_metrics("a pool not allowed refused", WAIT, |m| {
        m.access_refused_by(AccessRefusal::PoolNotAllowed) >= 1
    })
    .await;
    // An allowed one registers.
    let mut echo = start_pe(&live, pki.settings("echo", echo_names()), "EchoPool", 7004).await;
    assert!(echo.wait_registered(WAIT).await, "{:?}", echo.status());
    for refused in [&no_cert, &untrusted, &calc] {
        assert!(!refused.status().registered, "{:?}", refused.status());
    }
    assert!(no_cert
        .status()
        .last_reject
        .is_some_and(|r| r.contains("RejectedSecurity")));
    assert!(calc
        .status()
        .last_reject
        .is_some_and(|r| r.contains("RejectedSecurity")));

    // An authenticated PU is served the one allowed PE; an unauthenticated PU is refused.
    let pu_names = Names {
        cn: "pu-1",
        ..Names::default()
    };
    assert_eq!(
        resolve_with(&live, pki.settings("pu", pu_names)).await,
        Ok(1)
    );
    assert_eq!(
        resolve_with(&live, pki.anonymous()).await,
        Err(ResolveError::Refused(CauseCode::RejectedSecurity))
    );
    live.wait_metrics("the unauthenticated resolution counted", WAIT, |m| {
        m.access_refused_by(AccessRefusal::ResolutionWithoutIdentity) >= 1
    })
    .await;
    let m = live.metrics_now();
    assert_eq!(m.pool_elements, 1);
    assert!(m.tls_handshakes >= 4, "{m:?}");
    assert!(m.registration_rejects[0xa] >= 2, "{m:?}");
}

#[tokio::test]
async fn unauthenticated_users_are_served_when_the_rule_allows() {
    let pki = Pki::new("ca");
    let live = start_registrar(&pki, true).await;
    let mut echo = start_pe(&live, pki.settings("echo", echo_names()), "EchoPool", 7011).await;
    assert!(echo.wait_registered(WAIT).await, "{:?}", echo.status());
    assert_eq!(resolve_with(&live, pki.anonymous()).await, Ok(1));
    // A PU that trusts another CA does not talk to this registrar at all.
    let rogue = Pki::new("rogue");
    assert_eq!(
        resolve_with(&live, rogue.anonymous()).await,
        Err(ResolveError::NoRegistrar)
    );
    assert_eq!(
        live.metrics()
            .access_refused_by(AccessRefusal::ResolutionWithoutIdentity),
        0
    );
}
