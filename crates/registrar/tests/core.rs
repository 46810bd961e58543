//! The registrar core driven directly with virtual time: every ASAP procedure towards PEs and
//! PUs, each removal cause, each consistency reject, rate limits and malformed input.

use rserpool_registrar::{
    Destination, Profile, RateLimit, RateLimited, RegistrarEvent, RemovalCause,
};
use rserpool_sim::fixtures::{
    handle_resolution, ms, registering_pe, registration, RegistrarHarness, PE_HOST, PU_HOST,
};
use rserpool_wire::asap::{self, AsapMessage};
use rserpool_wire::{
    CauseCode, Codec, PoolElement, PoolElementId, PoolHandle, PoolPolicy, RegistrarId,
    RegistrationLife, TransportAddress, TransportUse, UserTransport,
};
use std::net::IpAddr;
use std::time::Duration;

/// A PE of `PE_HOST` whose user transport port (7000 + `id`) is its own.
fn pe(id: u32, policy: PoolPolicy) -> PoolElement {
    registering_pe(id, policy, 7000 + id as u16)
}

fn expect_accepted(m: &[AsapMessage], id: u32) {
    assert!(
        m.iter()
            .any(|m| matches!(m, AsapMessage::RegistrationResponse(r)
            if !r.reject && r.pe_id.0 == id && r.error.is_none())),
        "no accepting response for {id}: {m:?}"
    );
}

fn expect_rejected(m: &[AsapMessage], id: u32) -> rserpool_wire::ErrorCause {
    m.iter()
        .find_map(|m| match m {
            AsapMessage::RegistrationResponse(r) if r.reject && r.pe_id.0 == id => {
                Some(r.error.as_ref().expect("a reject says why").causes[0].clone())
            }
            _ => None,
        })
        .unwrap_or_else(|| panic!("no reject for {id}: {m:?}"))
}

#[test]
fn register_resolve_reregister_deregister() {
    let mut h = RegistrarHarness::rsplib();
    let pe_assoc = h.association_up(1, PE_HOST);
    let pu = h.association_up(2, PU_HOST);
    h.deliver(
        pe_assoc,
        registration("EchoPool", pe(0xaaaa, PoolPolicy::RoundRobin)),
    );
    expect_accepted(&h.sent_to(pe_assoc), 0xaaaa);
    assert_eq!(h.registrar.metrics().registrations, 1);
    let stored = h
        .registrar
        .handlespace()
        .find(&PoolHandle::from("EchoPool"), PoolElementId(0xaaaa))
        .unwrap();
    assert_eq!(stored.home_registrar(), RegistrarId(0x1234_5678));
    let asap_transport = stored
        .element()
        .asap_transport
        .clone()
        .expect("ASAP transport recorded");
    assert_eq!(
        asap_transport.addresses,
        vec![PE_HOST.parse::<IpAddr>().unwrap()]
    );
    assert_eq!(asap_transport.port, 40_001);

    h.deliver(pu, handle_resolution("EchoPool", None));
    let answer = h.sent_to(pu);
    let AsapMessage::HandleResolutionResponse(r) = &answer[0] else {
        panic!("{answer:?}")
    };
    assert_eq!(r.pool_elements.len(), 1);
    assert_eq!(r.pool_elements[0].id, PoolElementId(0xaaaa));
    assert_eq!(r.pool_elements[0].home_registrar, RegistrarId(0x1234_5678));
    assert!(
        r.pool_elements[0].asap_transport.is_none(),
        "PUs get the user transport only"
    );
    assert_eq!(r.overall_policy, Some(PoolPolicy::RoundRobin));
    assert!(r.error.is_none());

    // Re-registration with a new policy value updates the entry.
    h.deliver(
        pe_assoc,
        registration("EchoPool", pe(0xaaaa, PoolPolicy::RoundRobin)),
    );
    expect_accepted(&h.sent_to(pe_assoc), 0xaaaa);
    assert_eq!(
        (
            h.registrar.metrics().registrations,
            h.registrar.metrics().reregistrations
        ),
        (1, 1)
    );
    assert_eq!(h.registrar.handlespace().len(), 1);

    h.deliver(
        pe_assoc,
        AsapMessage::Deregistration(asap::Deregistration {
            pool_handle: PoolHandle::from("EchoPool"),
            pe_id: PoolElementId(0xaaaa),
        }),
    );
    let answer = h.sent_to(pe_assoc);
    assert!(matches!(&answer[0], AsapMessage::DeregistrationResponse(d) if d.error.is_none()));
    assert_eq!(
        h.removals(),
        vec![(PoolElementId(0xaaaa), RemovalCause::Deregistered)]
    );
    assert!(h.registrar.handlespace().is_empty());

    h.deliver(pu, handle_resolution("EchoPool", None));
    let answer = h.sent_to(pu);
    let AsapMessage::HandleResolutionResponse(r) = &answer[0] else {
        panic!()
    };
    assert!(r.pool_elements.is_empty());
    assert_eq!(
        r.error.as_ref().unwrap().code(),
        Some(CauseCode::UnknownPoolHandle)
    );
    assert_eq!(h.registrar.metrics().resolutions_unknown_pool, 1);
}

#[test]
fn handle_resolution_items_follow_the_option_and_the_limit() {
    let mut h = RegistrarHarness::new(Profile::Rsplib, |c| {
        c.default_handle_resolution_items = 4;
        c.max_handle_resolution_items = 5;
    });
    let a = h.association_up(1, PE_HOST);
    for id in 1..=6 {
        h.deliver(a, registration("P", pe(id, PoolPolicy::RoundRobin)));
    }
    h.sent();
    let pu = h.association_up(2, PU_HOST);
    for (option, expected) in [
        (None, 4),
        (Some(0), 4),
        (Some(2), 2),
        (Some(1), 1),
        (Some(100), 5),
        (Some(u32::MAX), 5),
    ] {
        h.deliver(pu, handle_resolution("P", option));
        let answer = h.sent_to(pu);
        let AsapMessage::HandleResolutionResponse(r) = &answer[0] else {
            panic!()
        };
        assert_eq!(r.pool_elements.len(), expected, "option {option:?}");
        let mut ids: Vec<_> = r.pool_elements.iter().map(|p| p.id).collect();
        ids.dedup();
        assert_eq!(ids.len(), expected, "no duplicates");
    }
}

#[test]
fn registration_life_expiry_removes_the_pe_and_tells_it() {
    let mut h = RegistrarHarness::new(Profile::Rfc, |c| {
        c.keep_alive_interval = Duration::from_secs(60)
    });
    let a = h.association_up(1, PE_HOST);
    let mut short = pe(5, PoolPolicy::RoundRobin);
    short.registration_life = RegistrationLife::Finite(ms(2000));
    h.deliver(a, registration("P", short));
    h.sent();
    h.advance_to(ms(1999));
    assert_eq!(h.registrar.handlespace().len(), 1);
    h.advance_to(ms(2000));
    assert_eq!(
        h.removals(),
        vec![(PoolElementId(5), RemovalCause::LifeExpired)]
    );
    assert!(h
        .sent_to(a)
        .iter()
        .any(|m| matches!(m, AsapMessage::DeregistrationResponse(d) if d.pe_id.0 == 5)));
    assert_eq!(
        h.registrar.metrics().removals_by(RemovalCause::LifeExpired),
        1
    );
}

#[test]
fn rsplib_profile_relies_on_keep_alives_not_on_the_life() {
    let mut h = RegistrarHarness::new(Profile::Rsplib, |c| {
        c.keep_alive_timeout = Duration::from_secs(1)
    });
    let a = h.association_up(1, PE_HOST);
    let mut short = pe(5, PoolPolicy::RoundRobin);
    short.registration_life = RegistrationLife::Finite(ms(2000));
    h.deliver(a, registration("P", short));
    h.sent();
    // Answer every keep-alive for a minute: the PE stays although its life was 2 s.
    let mut t = Duration::ZERO;
    while t < Duration::from_secs(60) {
        t += ms(100);
        h.advance_to(t);
        for m in h.sent_to(a) {
            if let AsapMessage::EndpointKeepAlive(k) = m {
                h.deliver(
                    a,
                    AsapMessage::EndpointKeepAliveAck(asap::EndpointKeepAliveAck {
                        pool_handle: k.pool_handle,
                        pe_id: k.pe_id.unwrap(),
                    }),
                );
            }
        }
    }
    assert_eq!(h.registrar.handlespace().len(), 1);
    assert!(h.registrar.metrics().keep_alives_acked >= 10);
    assert!(h.removals().is_empty());
}

#[test]
fn reregistration_extends_the_life() {
    let mut h = RegistrarHarness::new(Profile::Rfc, |c| {
        c.keep_alive_interval = Duration::from_secs(60)
    });
    let a = h.association_up(1, PE_HOST);
    let mut short = pe(5, PoolPolicy::RoundRobin);
    short.registration_life = RegistrationLife::Finite(ms(2000));
    h.deliver(a, registration("P", short.clone()));
    h.advance_to(ms(1500));
    h.deliver(a, registration("P", short));
    h.advance_to(ms(3000));
    assert_eq!(
        h.registrar.handlespace().len(),
        1,
        "life counted from the re-registration"
    );
    h.advance_to(ms(3500));
    assert_eq!(
        h.removals(),
        vec![(PoolElementId(5), RemovalCause::LifeExpired)]
    );
}

#[test]
fn keep_alives_are_sent_answered_and_missed() {
    let mut h = RegistrarHarness::new(Profile::Rsplib, |c| {
        c.keep_alive_interval = Duration::from_secs(5);
        c.keep_alive_jitter = 0.2;
        c.keep_alive_timeout = Duration::from_secs(2);
    });
    let a = h.association_up(1, PE_HOST);
    h.deliver(a, registration("P", pe(9, PoolPolicy::RoundRobin)));
    h.sent();
    // The first keep-alive comes within interval × (1 ± jitter).
    h.advance_to(ms(3999));
    assert!(h.sent().is_empty());
    h.advance_to(ms(6001));
    let sent = h.sent_to(a);
    let [AsapMessage::EndpointKeepAlive(k)] = &sent[..] else {
        panic!("{sent:?}")
    };
    assert!(!k.home);
    assert_eq!(k.server_id, RegistrarId(0x1234_5678));
    assert_eq!(
        k.pe_id,
        Some(PoolElementId(9)),
        "RSPLIB's keep-alive names the PE"
    );
    h.deliver(
        a,
        AsapMessage::EndpointKeepAliveAck(asap::EndpointKeepAliveAck {
            pool_handle: PoolHandle::from("P"),
            pe_id: PoolElementId(9),
        }),
    );
    assert_eq!(h.registrar.metrics().keep_alives_acked, 1);
    // Next keep-alive, not answered: removed one timeout later.
    let acked_at = h.now;
    let mut t = acked_at;
    while h.sent_to(a).is_empty() {
        t += ms(10);
        h.advance_to(t);
        assert!(
            t <= acked_at + ms(6010),
            "next keep-alive within interval × 1.2"
        );
    }
    assert!(t >= acked_at + ms(4000), "not before interval × 0.8");
    let sent_at = h.now;
    h.advance_to(sent_at + ms(1000));
    assert_eq!(h.registrar.handlespace().len(), 1);
    h.advance_to(sent_at + ms(2100));
    assert_eq!(
        h.removals(),
        vec![(PoolElementId(9), RemovalCause::KeepAliveTimeout)]
    );
    assert_eq!(h.registrar.metrics().keep_alives_missed, 1);
    assert_eq!(h.registrar.metrics().keep_alives_sent, 2);
}

#[test]
fn rfc_profile_keep_alive_has_no_pe_identifier() {
    let mut h = RegistrarHarness::new(Profile::Rfc, |c| c.keep_alive_jitter = 0.0);
    let a = h.association_up(1, PE_HOST);
    h.deliver(a, registration("P", pe(9, PoolPolicy::RoundRobin)));
    h.sent();
    h.advance_to(Duration::from_secs(5));
    let sent = h.sent_to(a);
    assert!(
        matches!(&sent[..], [AsapMessage::EndpointKeepAlive(k)] if k.pe_id.is_none()),
        "{sent:?}"
    );
}

#[test]
fn association_loss_removes_its_pes_only() {
    let mut h = RegistrarHarness::rsplib();
    let a = h.association_up(1, PE_HOST);
    let b = h.association_up(2, "10.255.0.3");
    h.deliver(a, registration("P", pe(1, PoolPolicy::RoundRobin)));
    h.deliver(a, registration("Q", pe(2, PoolPolicy::RoundRobin)));
    let mut other = pe(3, PoolPolicy::RoundRobin);
    other.user_transport = UserTransport::Address(TransportAddress::sctp(
        1,
        TransportUse::DataPlusControl,
        vec!["10.255.0.3".parse().unwrap()],
    ));
    h.deliver(b, registration("P", other));
    h.events();
    h.registrar.association_down(h.now, a);
    let mut removed = h.removals();
    removed.sort();
    assert_eq!(
        removed,
        vec![
            (PoolElementId(1), RemovalCause::AssociationLost),
            (PoolElementId(2), RemovalCause::AssociationLost)
        ]
    );
    assert_eq!(h.registrar.handlespace().len(), 1);
    assert_eq!(h.registrar.metrics().associations, 1);
}

#[test]
fn unreachable_reports_at_the_threshold_probe_and_a_failed_probe_removes() {
    let mut h = RegistrarHarness::rsplib();
    let a = h.association_up(1, PE_HOST);
    let pu = h.association_up(2, PU_HOST);
    h.deliver(a, registration("P", pe(1, PoolPolicy::RoundRobin)));
    h.sent();
    let report = AsapMessage::EndpointUnreachable(asap::EndpointUnreachable {
        pool_handle: PoolHandle::from("P"),
        pe_id: PoolElementId(1),
    });
    h.deliver(pu, report.clone());
    h.deliver(pu, report.clone());
    assert_eq!(h.registrar.handlespace().len(), 1);
    assert!(
        h.sent().is_empty(),
        "the rsplib profile counts below the threshold"
    );
    h.deliver(pu, report);
    // The third report probes the PE (RFC 5352 §3.5); reports alone remove nothing.
    let sent = h.sent_to(a);
    assert!(
        matches!(&sent[..], [AsapMessage::EndpointKeepAlive(_)]),
        "{sent:?}"
    );
    assert_eq!(h.registrar.handlespace().len(), 1);
    h.advance_to(h.now + Duration::from_secs(6));
    assert!(h
        .removals()
        .contains(&(PoolElementId(1), RemovalCause::UnreachableReports)));
    assert_eq!(h.registrar.metrics().unreachable_reports, 3);
    assert_eq!(h.registrar.metrics().unreachable_probes, 1);
}

#[test]
fn rfc_profile_probes_a_reported_pe_at_once() {
    let mut h = RegistrarHarness::new(Profile::Rfc, |c| {
        c.keep_alive_timeout = Duration::from_secs(1)
    });
    let a = h.association_up(1, PE_HOST);
    let pu = h.association_up(2, PU_HOST);
    h.deliver(a, registration("P", pe(1, PoolPolicy::RoundRobin)));
    h.sent();
    h.deliver(
        pu,
        AsapMessage::EndpointUnreachable(asap::EndpointUnreachable {
            pool_handle: PoolHandle::from("P"),
            pe_id: PoolElementId(1),
        }),
    );
    let sent = h.sent_to(a);
    assert!(
        matches!(&sent[..], [AsapMessage::EndpointKeepAlive(_)]),
        "{sent:?}"
    );
    h.advance_to(h.now + ms(1001));
    assert!(h
        .removals()
        .contains(&(PoolElementId(1), RemovalCause::UnreachableReports)));
}

#[test]
fn consistency_rejects_carry_the_right_cause() {
    let mut h = RegistrarHarness::new(Profile::Rsplib, |c| {
        c.handlespace.max_pool_elements_per_pool = 2
    });
    let a = h.association_up(1, PE_HOST);
    h.deliver(a, registration("P", pe(1, PoolPolicy::RoundRobin)));
    h.sent();
    // 0x5: another policy; the cause quotes the policy parameter.
    h.deliver(
        a,
        registration("P", pe(2, PoolPolicy::LeastUsed { load: 1 })),
    );
    let c = expect_rejected(&h.sent_to(a), 2);
    assert_eq!(c.code, CauseCode::InconsistentPoolingPolicy);
    assert_eq!(
        c.info,
        PoolPolicy::LeastUsed { load: 1 }.to_parameter().unwrap()
    );
    // 0x7: another transport type.
    let mut tcp = pe(3, PoolPolicy::RoundRobin);
    tcp.user_transport =
        UserTransport::Address(TransportAddress::tcp(80, PE_HOST.parse().unwrap()));
    h.deliver(a, registration("P", tcp));
    assert_eq!(
        expect_rejected(&h.sent_to(a), 3).code,
        CauseCode::InconsistentTransportType
    );
    // 0x8: another transport use.
    let mut data_only = pe(4, PoolPolicy::RoundRobin);
    data_only.user_transport = UserTransport::Address(TransportAddress::sctp(
        1,
        TransportUse::DataOnly,
        vec![PE_HOST.parse().unwrap()],
    ));
    h.deliver(a, registration("P", data_only));
    assert_eq!(
        expect_rejected(&h.sent_to(a), 4).code,
        CauseCode::InconsistentDataControlConfiguration
    );
    // 0x6: the pool is full.
    h.deliver(a, registration("P", pe(5, PoolPolicy::RoundRobin)));
    expect_accepted(&h.sent_to(a), 5);
    h.deliver(a, registration("P", pe(6, PoolPolicy::RoundRobin)));
    assert_eq!(
        expect_rejected(&h.sent_to(a), 6).code,
        CauseCode::LackOfResources
    );
    // 0x3: no user address is the association's.
    let mut elsewhere = pe(7, PoolPolicy::RoundRobin);
    elsewhere.user_transport = UserTransport::Address(TransportAddress::sctp(
        1,
        TransportUse::DataPlusControl,
        vec!["192.0.2.1".parse().unwrap()],
    ));
    h.deliver(a, registration("Q", elsewhere));
    assert_eq!(
        expect_rejected(&h.sent_to(a), 7).code,
        CauseCode::InvalidValues
    );
    // 0x3: an unknown policy type.
    h.deliver(
        a,
        registration(
            "R",
            pe(
                8,
                PoolPolicy::Other {
                    policy_type: 0xc000_0001,
                    data: vec![],
                },
            ),
        ),
    );
    assert_eq!(
        expect_rejected(&h.sent_to(a), 8).code,
        CauseCode::InvalidValues
    );
    let m = h.registrar.metrics();
    assert_eq!(m.registration_rejects[5], 1);
    assert_eq!(m.registration_rejects[7], 1);
    assert_eq!(m.registration_rejects[8], 1);
    assert_eq!(m.registration_rejects[6], 1);
    assert_eq!(m.registration_rejects[3], 2);
    let reasons: Vec<String> = h
        .events()
        .into_iter()
        .filter_map(|e| match e {
            RegistrarEvent::RegistrationRejected { reason, .. } => Some(reason),
            _ => None,
        })
        .collect();
    assert!(
        reasons.iter().any(|r| r.contains("192.0.2.1")),
        "{reasons:?}"
    );
}

#[test]
fn rate_limits_refuse_and_count_per_client() {
    let mut h = RegistrarHarness::new(Profile::Rsplib, |c| {
        c.handle_resolution_rate = Some(RateLimit {
            rate: 1.0,
            burst: 2.0,
        });
        c.endpoint_unreachable_rate = Some(RateLimit {
            rate: 1.0,
            burst: 1.0,
        });
    });
    let a = h.association_up(1, PE_HOST);
    h.deliver(a, registration("P", pe(1, PoolPolicy::RoundRobin)));
    let pu = h.association_up(2, PU_HOST);
    let other = h.association_up(3, "10.255.0.4");
    h.sent();
    for _ in 0..3 {
        h.deliver(pu, handle_resolution("P", None));
    }
    let answers = h.sent_to(pu);
    assert_eq!(answers.len(), 3);
    let refused = answers
        .iter()
        .filter(|m| {
            matches!(m, AsapMessage::HandleResolutionResponse(r)
            if r.error.as_ref().and_then(|e| e.code()) == Some(CauseCode::RejectedSecurity))
        })
        .count();
    assert_eq!(refused, 1);
    // Another client is not affected, and the limited one recovers with time.
    h.deliver(other, handle_resolution("P", None));
    assert!(
        matches!(&h.sent_to(other)[0], AsapMessage::HandleResolutionResponse(r) if r.error.is_none())
    );
    h.advance_to(h.now + ms(1000));
    h.deliver(pu, handle_resolution("P", None));
    assert!(
        matches!(&h.sent_to(pu)[0], AsapMessage::HandleResolutionResponse(r) if r.error.is_none())
    );
    // Unreachable reports beyond the rate are not counted against the PE.
    let report = AsapMessage::EndpointUnreachable(asap::EndpointUnreachable {
        pool_handle: PoolHandle::from("P"),
        pe_id: PoolElementId(1),
    });
    for _ in 0..5 {
        h.deliver(pu, report.clone());
    }
    assert_eq!(h.registrar.metrics().unreachable_reports, 1);
    assert_eq!(
        h.registrar
            .metrics()
            .rate_limited_by(RateLimited::EndpointUnreachable),
        4
    );
    assert_eq!(
        h.registrar
            .metrics()
            .rate_limited_by(RateLimited::HandleResolution),
        1
    );
    assert_eq!(h.registrar.handlespace().len(), 1);
}

#[test]
fn malformed_input_is_answered_and_others_keep_being_served() {
    let mut h = RegistrarHarness::rsplib();
    let bad = h.association_up(1, PE_HOST);
    let good = h.association_up(2, PU_HOST);
    let pe_assoc = h.association_up(3, "10.255.0.3");
    let mut e = pe(1, PoolPolicy::RoundRobin);
    e.user_transport = UserTransport::Address(TransportAddress::sctp(
        1,
        TransportUse::DataPlusControl,
        vec!["10.255.0.3".parse().unwrap()],
    ));
    h.deliver(pe_assoc, registration("P", e));
    h.sent();
    // Truncated registration: ASAP_ERROR with Invalid Values.
    h.deliver_raw(bad, &[0x01, 0x00, 0x00, 0x38, 0x00, 0x09]);
    // Unknown message type whose action bits ask for a report.
    h.deliver_raw(bad, &[0x4f, 0x00, 0x00, 0x04]);
    // Unknown message type to be dropped silently.
    h.deliver_raw(bad, &[0x0f, 0x00, 0x00, 0x04]);
    let answers = h.sent_to(bad);
    let causes: Vec<CauseCode> = answers
        .iter()
        .map(|m| match m {
            AsapMessage::Error(e) => e.error.causes[0].code,
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(
        causes,
        vec![CauseCode::InvalidValues, CauseCode::UnrecognizedMessage]
    );
    assert_eq!(h.registrar.metrics().malformed_messages, 3);
    h.deliver(good, handle_resolution("P", None));
    assert!(
        matches!(&h.sent_to(good)[0], AsapMessage::HandleResolutionResponse(r) if r.pool_elements.len() == 1)
    );
}

#[test]
fn association_limit_refuses_the_extra_one() {
    let mut h = RegistrarHarness::new(Profile::Rsplib, |c| c.max_associations = 1);
    let a = h.association_up(1, PE_HOST);
    let b = h.association_up(2, PU_HOST);
    let events = h.events();
    assert!(events.iter().any(|e| matches!(e,
        RegistrarEvent::AssociationRefused { association, limit: "max-associations", .. }
        if *association == b)));
    h.deliver(b, handle_resolution("P", None));
    assert!(
        h.sent_to(b).is_empty(),
        "a refused association is not served"
    );
    h.deliver(a, handle_resolution("P", None));
    assert_eq!(h.sent_to(a).len(), 1);
    assert_eq!(h.registrar.metrics().associations_refused, 1);
}

#[test]
fn server_announces_every_t6_with_jitter() {
    let mut h = RegistrarHarness::new(Profile::Rsplib, |c| {
        c.announce = Some(rserpool_registrar::AnnounceConfig {
            group: Profile::Rsplib.announce_group(),
            interval: Duration::from_secs(1),
            jitter: 0.125,
            transports: vec![TransportAddress::sctp(
                3863,
                TransportUse::DataOnly,
                vec!["10.255.0.1".parse().unwrap()],
            )],
        })
    });
    let mut times = Vec::new();
    let mut t = Duration::ZERO;
    while times.len() < 20 {
        t += ms(10);
        h.advance_to(t);
        for (d, m) in h.sent() {
            assert_eq!(d, Destination::Announce);
            let AsapMessage::ServerAnnounce(a) = m else {
                panic!()
            };
            assert_eq!(a.server_id, RegistrarId(0x1234_5678));
            assert_eq!(a.transports.len(), 1);
            times.push(t);
        }
    }
    for w in times.windows(2) {
        let gap = w[1] - w[0];
        assert!(gap >= ms(870) && gap <= ms(1135), "gap {gap:?}");
    }
    // With 3 ENRP peers known, the cycle is 4 × T6.
    h.registrar.set_enrp_peer_count(3);
    let start = *times.last().unwrap();
    let mut next = None;
    let mut t = start;
    let mut first_after = None;
    while next.is_none() {
        t += ms(10);
        h.advance_to(t);
        if !h.sent().is_empty() {
            if first_after.is_none() {
                first_after = Some(t);
            } else {
                next = Some(t);
            }
        }
    }
    let gap = next.unwrap() - first_after.unwrap();
    assert!(gap >= ms(3490) && gap <= ms(4510), "gap {gap:?}");
}

#[test]
fn user_addresses_outside_the_association_or_too_narrow_are_dropped() {
    let mut h = RegistrarHarness::rsplib();
    let a = h.association_up(1, PE_HOST);
    let mut mixed = pe(1, PoolPolicy::RoundRobin);
    mixed.user_transport = UserTransport::Address(TransportAddress::sctp(
        1,
        TransportUse::DataPlusControl,
        vec![
            "192.0.2.1".parse().unwrap(),
            PE_HOST.parse().unwrap(),
            "127.0.0.1".parse().unwrap(),
        ],
    ));
    h.deliver(a, registration("P", mixed));
    expect_accepted(&h.sent_to(a), 1);
    let stored = h
        .registrar
        .handlespace()
        .find(&PoolHandle::from("P"), PoolElementId(1))
        .unwrap();
    assert_eq!(
        stored.element().user_transport.addresses(),
        &[PE_HOST.parse::<IpAddr>().unwrap()]
    );
    let dropped = h
        .events()
        .into_iter()
        .find_map(|e| match e {
            RegistrarEvent::Registered {
                dropped_addresses, ..
            } => Some(dropped_addresses),
            _ => None,
        })
        .unwrap();
    assert_eq!(
        dropped,
        vec![
            "192.0.2.1".parse::<IpAddr>().unwrap(),
            "127.0.0.1".parse().unwrap()
        ]
    );
    // With the minimum scope lowered to loopback, a PE on a loopback association registers.
    let mut h = RegistrarHarness::new(Profile::Rsplib, |c| {
        c.min_address_scope = rserpool_registrar::AddressScope::Loopback
    });
    let a = h.association_up(1, "127.0.0.1");
    let mut local = pe(2, PoolPolicy::RoundRobin);
    local.user_transport = UserTransport::Address(TransportAddress::sctp(
        1,
        TransportUse::DataPlusControl,
        vec!["127.0.0.1".parse().unwrap()],
    ));
    h.deliver(a, registration("P", local.clone()));
    expect_accepted(&h.sent_to(a), 2);
    // And refused under the default (site-local): neither user nor ASAP address qualifies.
    let mut h = RegistrarHarness::rsplib();
    let a = h.association_up(1, "127.0.0.1");
    h.deliver(a, registration("P", local));
    assert_eq!(
        expect_rejected(&h.sent_to(a), 2).code,
        CauseCode::InvalidValues
    );
}

#[test]
fn deregistering_an_unknown_pe_is_answered_as_success() {
    let mut h = RegistrarHarness::rsplib();
    let a = h.association_up(1, PE_HOST);
    h.deliver(
        a,
        AsapMessage::Deregistration(asap::Deregistration {
            pool_handle: PoolHandle::from("Nowhere"),
            pe_id: PoolElementId(77),
        }),
    );
    let sent = h.sent_to(a);
    assert!(
        matches!(&sent[..], [AsapMessage::DeregistrationResponse(d)] if d.error.is_none() && d.pe_id.0 == 77)
    );
    assert_eq!(h.registrar.metrics().deregistrations, 0);
}

#[test]
fn overall_policy_carries_the_first_selected_pe_values() {
    let mut h = RegistrarHarness::rsplib();
    let a = h.association_up(1, PE_HOST);
    h.deliver(
        a,
        registration("LU", pe(1, PoolPolicy::LeastUsed { load: 500 })),
    );
    h.deliver(
        a,
        registration("LU", pe(2, PoolPolicy::LeastUsed { load: 100 })),
    );
    h.sent();
    h.deliver(a, handle_resolution("LU", Some(2)));
    let sent = h.sent_to(a);
    let AsapMessage::HandleResolutionResponse(r) = &sent[0] else {
        panic!()
    };
    assert_eq!(r.pool_elements[0].id, PoolElementId(2), "least used first");
    assert_eq!(r.overall_policy, Some(PoolPolicy::LeastUsed { load: 100 }));
}

#[test]
fn limits_are_answered_with_lack_of_resources() {
    let mut h = RegistrarHarness::new(Profile::Rsplib, |c| c.codec.max_message_size = 64);
    let a = h.association_up(1, PE_HOST);
    // A registration with three user addresses is 72 bytes: over the 64-byte limit.
    let mut big = pe(1, PoolPolicy::RoundRobin);
    big.user_transport = UserTransport::Address(TransportAddress::sctp(
        1,
        TransportUse::DataPlusControl,
        vec![PE_HOST.parse().unwrap(); 3],
    ));
    let bytes = Codec::default().encode(&registration("P", big)).unwrap();
    assert!(bytes.len() > 64);
    h.deliver_raw(a, &bytes);
    let sent = h.sent_to(a);
    assert!(
        matches!(&sent[..], [AsapMessage::Error(e)] if e.error.code() == Some(CauseCode::LackOfResources)),
        "{sent:?}"
    );
    let logged = h.events().into_iter().any(|e| {
        matches!(e, RegistrarEvent::Malformed { error, answered: true, .. }
            if error.to_string().contains("exceeds the limit of 64 bytes"))
    });
    assert!(logged);
    assert!(h.registrar.handlespace().is_empty());
}

#[test]
fn resolutions_answer_with_the_current_registration() {
    let mut h = RegistrarHarness::rsplib();
    let pe_assoc = h.association_up(1, PE_HOST);
    let pu = h.association_up(2, PU_HOST);
    let resolve = |h: &mut RegistrarHarness| {
        h.deliver(pu, handle_resolution("LoadPool", None));
        match h.sent_to(pu).remove(0) {
            AsapMessage::HandleResolutionResponse(r) => r.pool_elements,
            other => panic!("{other:?}"),
        }
    };
    h.deliver(
        pe_assoc,
        registration("LoadPool", pe(1, PoolPolicy::LeastUsed { load: 10 })),
    );
    let first = resolve(&mut h);
    assert_eq!(first[0].policy, PoolPolicy::LeastUsed { load: 10 });
    assert_eq!(
        resolve(&mut h),
        first,
        "the same registration, the same answer"
    );

    // A re-registration with a new load and port is what the next answer carries.
    let mut changed = pe(1, PoolPolicy::LeastUsed { load: 50 });
    changed.user_transport = UserTransport::Address(TransportAddress::sctp(
        9999,
        TransportUse::DataPlusControl,
        vec![PE_HOST.parse().unwrap()],
    ));
    h.deliver(pe_assoc, registration("LoadPool", changed.clone()));
    let second = resolve(&mut h);
    assert_eq!(second[0].policy, PoolPolicy::LeastUsed { load: 50 });
    assert_eq!(second[0].user_transport, changed.user_transport);

    // A PE registered after another left (its slot reused) is answered as itself.
    h.deliver(
        pe_assoc,
        AsapMessage::Deregistration(asap::Deregistration {
            pool_handle: PoolHandle::from("LoadPool"),
            pe_id: PoolElementId(1),
        }),
    );
    h.deliver(
        pe_assoc,
        registration("LoadPool", pe(2, PoolPolicy::LeastUsed { load: 7 })),
    );
    h.sent();
    let third = resolve(&mut h);
    assert_eq!(third.len(), 1);
    assert_eq!(third[0].id, PoolElementId(2));
    assert_eq!(third[0].policy, PoolPolicy::LeastUsed { load: 7 });
}

#[test]
fn unreported_resolutions_are_answered_and_counted_alike() {
    let run = |report: bool| {
        let mut h = RegistrarHarness::new(Profile::Rsplib, |c| c.report_resolutions = report);
        let pe_assoc = h.association_up(1, PE_HOST);
        let pu = h.association_up(2, PU_HOST);
        for id in 1..=5 {
            h.deliver(
                pe_assoc,
                registration("RandomPool", pe(id, PoolPolicy::Random)),
            );
        }
        h.sent();
        h.events();
        for _ in 0..20 {
            h.deliver(pu, handle_resolution("RandomPool", Some(2)));
        }
        h.deliver(pu, handle_resolution("NoSuchPool", None));
        let answers = h.sent_to(pu);
        let reports = h
            .events()
            .into_iter()
            .filter(|e| matches!(e, RegistrarEvent::HandleResolution { .. }))
            .count();
        let m = h.registrar.metrics();
        (answers, reports, m.resolutions, m.resolutions_unknown_pool)
    };
    let (reported_answers, reports, resolutions, unknown) = run(true);
    assert_eq!((reports, resolutions, unknown), (21, 20, 1));
    let (answers, reports, resolutions, unknown) = run(false);
    assert_eq!((reports, resolutions, unknown), (0, 20, 1));
    assert_eq!(
        answers, reported_answers,
        "the same seed gives the same answers"
    );
}
