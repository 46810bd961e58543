//! The registrar core's defences of RFC 5355 in virtual time: PEs owned by the association that
//! registered them, ownership probes for claims, probes (not removals) for unreachable reports
//! with a per-PE budget, and the flood limits (associations per address, registrations per
//! association, PEs per association).

use rserpool_registrar::{
    AssociationId, Destination, Profile, RateLimit, RateLimited, RegistrarConfig, RegistrarEvent,
    RemovalCause, SecurityRefusal,
};
use rserpool_sim::fixtures::{
    deregistration, endpoint_keep_alive_ack, endpoint_unreachable, messages_to, ms, registering_pe,
    registration, RegistrarHarness, PE_HOST,
};
use rserpool_wire::asap::{self, AsapMessage};
use rserpool_wire::{CauseCode, PoolElement, PoolElementId, PoolHandle, PoolPolicy};
use std::time::Duration;

/// A registrar whose keep-alives fall at known times (every 5 s, 2 s to answer, no jitter), its
/// configuration then changed by `tweak`.
fn harness(profile: Profile, tweak: impl FnOnce(&mut RegistrarConfig)) -> RegistrarHarness {
    RegistrarHarness::new(profile, |config| {
        config.keep_alive_jitter = 0.0;
        config.keep_alive_interval = Duration::from_secs(5);
        config.keep_alive_timeout = Duration::from_secs(2);
        tweak(config);
    })
}

/// [`harness`] with the RSPLIB profile, unchanged.
fn rsplib() -> RegistrarHarness {
    harness(Profile::Rsplib, |_| {})
}

/// A PE of `PE_HOST`; every PE uses user transport port 7000.
fn pe(id: u32) -> PoolElement {
    registering_pe(id, PoolPolicy::RoundRobin, 7000)
}

/// The registration responses in `m`: (PE, accepted, cause of a reject).
fn responses(m: &[AsapMessage]) -> Vec<(u32, bool, Option<CauseCode>)> {
    m.iter()
        .filter_map(|m| match m {
            AsapMessage::RegistrationResponse(r) => Some((
                r.pe_id.0,
                !r.reject,
                r.error.as_ref().and_then(|e| e.code()),
            )),
            _ => None,
        })
        .collect()
}

fn keep_alives(m: &[AsapMessage]) -> usize {
    m.iter()
        .filter(|m| matches!(m, AsapMessage::EndpointKeepAlive(_)))
        .count()
}

#[test]
fn only_the_owner_association_deregisters_its_pe() {
    let mut h = rsplib();
    let owner = h.association_up(1, PE_HOST);
    let attacker = h.association_up(2, PE_HOST);
    h.deliver(owner, registration("P", pe(5)));
    h.sent();
    h.events();

    h.deliver(attacker, deregistration("P", 5));
    let sent = h.sent();
    let answer = messages_to(&sent, attacker);
    let [AsapMessage::DeregistrationResponse(d)] = &answer[..] else {
        panic!("{answer:?}")
    };
    assert_eq!(
        d.error.as_ref().and_then(|e| e.code()),
        Some(CauseCode::RejectedSecurity)
    );
    assert_eq!(h.owner("P", 5), Some(owner), "the PE stays with its owner");
    assert_eq!(
        h.registrar
            .metrics()
            .refusals_by(SecurityRefusal::ForeignDeregistration),
        1
    );
    assert_eq!(h.registrar.metrics().deregistrations, 0);
    let events = h.events();
    assert!(
        events.iter().any(|e| matches!(e,
            RegistrarEvent::SecurityRefused { request: "deregistration", association, owner: Some(o), peer: Some(p), reason: SecurityRefusal::ForeignDeregistration, .. }
            if *association == attacker && *o == owner && p.port == 40_002 && p.addresses == vec![PE_HOST.parse::<std::net::IpAddr>().unwrap()])),
        "{events:?}"
    );
    let rendered = h.registrar.metrics().render_prometheus();
    assert!(rendered.contains(
        "rserpool_registrar_security_refusals_total{reason=\"foreign_deregistration\"} 1"
    ));

    h.deliver(owner, deregistration("P", 5));
    let sent = h.sent();
    assert!(matches!(&messages_to(&sent, owner)[..],
        [AsapMessage::DeregistrationResponse(d)] if d.error.is_none()));
    assert!(h.registrar.handlespace().is_empty());
}

#[test]
fn a_claim_waits_for_the_probe_and_is_refused_when_the_owner_answers() {
    let mut h = rsplib();
    let owner = h.association_up(1, PE_HOST);
    let b = h.association_up(2, PE_HOST);
    let c = h.association_up(3, PE_HOST);
    h.deliver(owner, registration("P", pe(5)));
    h.sent();
    h.advance_to(ms(100));

    h.deliver(b, registration("P", pe(5)));
    let sent = h.sent();
    assert!(
        messages_to(&sent, b).is_empty(),
        "the claim waits: {sent:?}"
    );
    assert_eq!(keep_alives(&messages_to(&sent, owner)), 1, "probe");
    assert_eq!(h.registrar.metrics().ownership_probes, 1);
    assert!(h
        .events()
        .iter()
        .any(|e| matches!(e, RegistrarEvent::OwnershipProbe { owner: o, claimant, .. } if *o == owner && *claimant == b)));

    // A second claim joins the first: no second probe.
    h.advance_to(ms(500));
    h.deliver(c, registration("P", pe(5)));
    let sent = h.sent();
    assert!(sent.is_empty(), "{sent:?}");
    assert_eq!(h.registrar.metrics().ownership_probes, 1);

    h.advance_to(ms(900));
    h.deliver(owner, endpoint_keep_alive_ack("P", 5));
    let sent = h.sent();
    for claimant in [b, c] {
        assert_eq!(
            responses(&messages_to(&sent, claimant)),
            vec![(5, false, Some(CauseCode::RejectedSecurity))]
        );
    }
    assert_eq!(h.owner("P", 5), Some(owner));
    let stored = h
        .registrar
        .handlespace()
        .find(&PoolHandle::from("P"), PoolElementId(5))
        .unwrap();
    assert_eq!(
        stored.element().asap_transport.as_ref().unwrap().port,
        40_001,
        "users are still sent to the owner"
    );
    assert_eq!(
        h.registrar
            .metrics()
            .refusals_by(SecurityRefusal::ForeignRegistration),
        2
    );
    // Past the probe timeout nothing changes: the answered probe does not remove the PE.
    h.advance_to(ms(4000));
    assert_eq!(h.owner("P", 5), Some(owner));
    assert_eq!(h.registrar.metrics().claims_granted, 0);
}

#[test]
fn a_claim_is_granted_within_one_probe_timeout_when_the_owner_is_silent() {
    let mut h = rsplib();
    let owner = h.association_up(1, PE_HOST);
    let restarted = h.association_up(2, PE_HOST);
    let other = h.association_up(3, PE_HOST);
    h.deliver(owner, registration("P", pe(5)));
    h.sent();
    h.advance_to(ms(100));
    h.deliver(restarted, registration("P", pe(5)));
    h.deliver(other, registration("P", pe(5)));
    h.sent();
    h.events();
    h.advance_to(ms(2099));
    assert_eq!(h.owner("P", 5), Some(owner), "not before the timeout");
    h.advance_to(ms(2100));
    let sent = h.sent();
    assert_eq!(
        responses(&messages_to(&sent, restarted)),
        vec![(5, true, None)],
        "the first claim gets the PE"
    );
    assert_eq!(
        responses(&messages_to(&sent, other)),
        vec![(5, false, Some(CauseCode::RejectedSecurity))],
        "the second finds it owned again"
    );
    assert_eq!(h.owner("P", 5), Some(restarted));
    assert_eq!(h.registrar.metrics().claims_granted, 1);
    let events = h.events();
    assert!(events.iter().any(|e| matches!(
        e,
        RegistrarEvent::Removed {
            cause: RemovalCause::KeepAliveTimeout,
            ..
        }
    )));
    assert!(events.iter().any(|e| matches!(e,
        RegistrarEvent::ClaimGranted { association, .. } if *association == restarted)));
    // The new owner is kept by keep-alives over its own association.
    h.advance_to(ms(7200));
    let sent = h.sent();
    assert_eq!(keep_alives(&messages_to(&sent, restarted)), 1);
    assert_eq!(keep_alives(&messages_to(&sent, owner)), 0);
}

#[test]
fn a_claim_is_granted_at_once_when_the_owner_association_goes_down() {
    let mut h = rsplib();
    let owner = h.association_up(1, PE_HOST);
    let b = h.association_up(2, PE_HOST);
    h.deliver(owner, registration("P", pe(5)));
    h.deliver(b, registration("P", pe(5)));
    h.sent();
    h.registrar.association_down(h.now, owner);
    let sent = h.sent();
    assert_eq!(responses(&messages_to(&sent, b)), vec![(5, true, None)]);
    assert_eq!(h.owner("P", 5), Some(b));

    // With the owner gone first, a registration is an ordinary new one.
    let c = h.association_up(3, PE_HOST);
    h.registrar.association_down(h.now, b);
    h.deliver(c, registration("P", pe(5)));
    let sent = h.sent();
    assert_eq!(responses(&messages_to(&sent, c)), vec![(5, true, None)]);
    assert_eq!(h.registrar.metrics().ownership_probes, 1);
}

#[test]
fn the_owners_reregistration_answers_the_probe() {
    let mut h = rsplib();
    let owner = h.association_up(1, PE_HOST);
    let b = h.association_up(2, PE_HOST);
    h.deliver(owner, registration("P", pe(5)));
    h.deliver(b, registration("P", pe(5)));
    h.sent();
    h.deliver(owner, registration("P", pe(5)));
    let sent = h.sent();
    assert_eq!(responses(&messages_to(&sent, owner)), vec![(5, true, None)]);
    assert_eq!(
        responses(&messages_to(&sent, b)),
        vec![(5, false, Some(CauseCode::RejectedSecurity))]
    );
    h.advance_to(ms(3000));
    assert_eq!(h.owner("P", 5), Some(owner));
}

#[test]
fn a_claimant_that_leaves_drops_its_claim() {
    let mut h = rsplib();
    let owner = h.association_up(1, PE_HOST);
    let b = h.association_up(2, PE_HOST);
    h.deliver(owner, registration("P", pe(5)));
    h.deliver(b, registration("P", pe(5)));
    h.sent();
    h.registrar.association_down(h.now, b);
    h.advance_to(ms(3000));
    assert!(
        h.registrar.handlespace().is_empty(),
        "the silent owner is removed"
    );
    assert_eq!(h.registrar.metrics().claims_granted, 0);
    assert!(h
        .sent()
        .iter()
        .all(|(d, _)| *d != Destination::Association(b)));
}

#[test]
fn waiting_claims_are_bounded_and_a_retry_replaces_its_claim() {
    let mut h = harness(Profile::Rsplib, |c| c.max_pending_claims = 2);
    let owner = h.association_up(1, PE_HOST);
    let b = h.association_up(2, PE_HOST);
    let c = h.association_up(3, PE_HOST);
    let d = h.association_up(4, PE_HOST);
    h.deliver(owner, registration("P", pe(5)));
    h.sent();
    h.deliver(b, registration("P", pe(5)));
    h.deliver(b, registration("P", pe(5)));
    h.deliver(c, registration("P", pe(5)));
    let sent = h.sent();
    assert!(messages_to(&sent, b).is_empty() && messages_to(&sent, c).is_empty());
    h.deliver(d, registration("P", pe(5)));
    let sent = h.sent();
    assert_eq!(
        responses(&messages_to(&sent, d)),
        vec![(5, false, Some(CauseCode::RejectedSecurity))]
    );
    assert_eq!(
        h.registrar
            .metrics()
            .refusals_by(SecurityRefusal::PendingClaims),
        1
    );
    h.deliver(owner, endpoint_keep_alive_ack("P", 5));
    let sent = h.sent();
    assert_eq!(
        responses(&messages_to(&sent, b)).len(),
        1,
        "one answer for the retried claim"
    );
    assert_eq!(responses(&messages_to(&sent, c)).len(), 1);
}

#[test]
fn unreachable_reports_probe_and_a_healthy_pe_stays_in_every_profile() {
    for profile in [Profile::Rsplib, Profile::Rfc] {
        let mut h = harness(profile, |c| {
            c.endpoint_unreachable_rate = None;
            c.max_unreachable_probes = 3;
            c.unreachable_probe_interval = Duration::from_secs(30);
        });
        let owner = h.association_up(1, PE_HOST);
        h.deliver(owner, registration("P", pe(5)));
        h.sent();
        // A flood of reports from many fresh associations over ten seconds; the PE answers
        // every keep-alive it gets.
        let reporters: Vec<AssociationId> = (0..50)
            .map(|i| h.association_up(100 + i, "10.255.0.9"))
            .collect();
        let mut probes = 0;
        let mut t = ms(10);
        for round in 0..1000u64 {
            let r = reporters[(round % 50) as usize];
            h.deliver(r, endpoint_unreachable("P", 5));
            let sent = h.sent();
            let k = keep_alives(&messages_to(&sent, owner));
            assert!(k <= 1, "{profile:?}: two probes at once");
            if k == 1 {
                probes += 1;
                h.deliver(owner, endpoint_keep_alive_ack("P", 5));
            }
            t += ms(10);
            h.advance_to(t);
            for (_, m) in h.sent() {
                if matches!(m, AsapMessage::EndpointKeepAlive(_)) {
                    h.deliver(owner, endpoint_keep_alive_ack("P", 5));
                }
            }
        }
        assert_eq!(h.owner("P", 5), Some(owner), "{profile:?}");
        assert_eq!(
            probes, 3,
            "{profile:?}: the report budget allows 3 probes in 30 s"
        );
        assert_eq!(h.registrar.metrics().unreachable_probes, 3);
        assert!(h.registrar.metrics().unreachable_probes_suppressed > 900);
        assert_eq!(h.registrar.metrics().unreachable_reports, 1000);
        assert_eq!(h.registrar.metrics().removals.iter().sum::<u64>(), 0);
    }
}

#[test]
fn reports_reaching_the_threshold_remove_a_silent_pe_only_after_the_probe() {
    let mut h = rsplib();
    let owner = h.association_up(1, PE_HOST);
    let pu = h.association_up(2, "10.255.0.9");
    h.deliver(owner, registration("P", pe(5)));
    h.sent();
    h.deliver(pu, endpoint_unreachable("P", 5));
    h.deliver(pu, endpoint_unreachable("P", 5));
    assert!(
        h.sent().is_empty(),
        "rsplib profile: below the threshold reports are counted"
    );
    h.deliver(pu, endpoint_unreachable("P", 5));
    let sent = h.sent();
    assert_eq!(keep_alives(&messages_to(&sent, owner)), 1);
    assert_eq!(h.owner("P", 5), Some(owner), "not removed by reports alone");
    h.deliver(pu, endpoint_unreachable("P", 5));
    assert!(h.sent().is_empty(), "one probe at a time");
    h.advance_to(ms(2001));
    let events = h.events();
    assert!(
        events.iter().any(|e| matches!(
            e,
            RegistrarEvent::Removed {
                cause: RemovalCause::UnreachableReports,
                ..
            }
        )),
        "{events:?}"
    );
    assert!(h.registrar.handlespace().is_empty());
}

#[test]
fn registration_rate_per_association() {
    let mut h = harness(Profile::Rsplib, |c| {
        c.registration_rate = Some(RateLimit {
            rate: 1.0,
            burst: 2.0,
        })
    });
    let flood = h.association_up(1, PE_HOST);
    let calm = h.association_up(2, PE_HOST);
    for id in 1..=5 {
        h.deliver(flood, registration("P", pe(id)));
    }
    let sent = h.sent();
    let r = responses(&messages_to(&sent, flood));
    assert_eq!(r.iter().filter(|r| r.1).count(), 2);
    assert!(r
        .iter()
        .filter(|r| !r.1)
        .all(|r| r.2 == Some(CauseCode::RejectedSecurity)));
    assert_eq!(
        h.registrar
            .metrics()
            .rate_limited_by(RateLimited::Registration),
        3
    );
    h.deliver(calm, registration("P", pe(10)));
    let sent = h.sent();
    assert_eq!(responses(&messages_to(&sent, calm)), vec![(10, true, None)]);
    h.advance_to(ms(1000));
    h.deliver(flood, registration("P", pe(3)));
    let sent = h.sent();
    assert_eq!(responses(&messages_to(&sent, flood)), vec![(3, true, None)]);
}

#[test]
fn associations_per_source_address() {
    let mut h = harness(Profile::Rsplib, |c| c.max_associations_per_address = 2);
    let a = h.association_up(1, PE_HOST);
    h.association_up(2, PE_HOST);
    h.association_up(3, PE_HOST);
    let events = h.events();
    assert!(events.iter().any(|e| matches!(
        e,
        RegistrarEvent::AssociationRefused {
            association: AssociationId(3),
            limit: "max-associations-per-address",
            ..
        }
    )));
    assert_eq!(h.registrar.metrics().associations, 2);
    assert_eq!(
        h.registrar
            .metrics()
            .refusals_by(SecurityRefusal::AssociationsPerAddress),
        1
    );
    // Another host is served; the refused association's messages are ignored.
    let other = h.association_up(4, "10.255.0.9");
    h.deliver(AssociationId(3), deregistration("P", 1));
    h.deliver(other, deregistration("P", 2));
    let sent = h.sent();
    assert!(messages_to(&sent, AssociationId(3)).is_empty());
    assert!(matches!(&messages_to(&sent, other)[..],
        [AsapMessage::DeregistrationResponse(d)] if d.error.is_none()));
    // A refused association going down frees nothing; a served one frees its place.
    h.registrar.association_down(h.now, AssociationId(3));
    h.association_up(5, PE_HOST);
    assert_eq!(
        h.registrar.metrics().associations,
        3,
        "the refused one counted nothing"
    );
    h.association_up(6, PE_HOST);
    assert_eq!(h.registrar.metrics().associations, 3);
    h.registrar.association_down(h.now, a);
    h.association_up(7, PE_HOST);
    assert_eq!(h.registrar.metrics().associations, 3);
}

#[test]
fn pool_elements_per_association() {
    let mut h = harness(Profile::Rsplib, |c| {
        c.max_pool_elements_per_association = 3;
        c.registration_rate = None;
    });
    let a = h.association_up(1, PE_HOST);
    for id in 1..=4 {
        h.deliver(a, registration("P", pe(id)));
    }
    let sent = h.sent();
    assert_eq!(
        responses(&messages_to(&sent, a))[3],
        (4, false, Some(CauseCode::LackOfResources))
    );
    // Re-registrations of the PEs it has are still accepted.
    h.deliver(a, registration("P", pe(2)));
    let sent = h.sent();
    assert_eq!(responses(&messages_to(&sent, a)), vec![(2, true, None)]);
    assert_eq!(
        h.registrar
            .metrics()
            .refusals_by(SecurityRefusal::PoolElementsPerAssociation),
        1
    );
}

#[test]
fn handle_resolutions_per_source_address() {
    let mut h = harness(Profile::Rsplib, |c| {
        c.handle_resolution_rate = None;
        c.handle_resolution_rate_per_address = Some(RateLimit {
            rate: 1.0,
            burst: 4.0,
        });
    });
    let owner = h.association_up(1, PE_HOST);
    h.deliver(owner, registration("P", pe(5)));
    // One host over four associations shares one budget of 4; another host has its own.
    let flood: Vec<AssociationId> = (10..14)
        .map(|i| h.association_up(i, "10.255.0.9"))
        .collect();
    let calm = h.association_up(20, "10.255.0.8");
    h.sent();
    let resolve = AsapMessage::HandleResolution(asap::HandleResolution {
        subscribe: false,
        pool_handle: PoolHandle::from("P"),
        option: None,
    });
    for _ in 0..3 {
        for a in &flood {
            h.deliver(*a, resolve.clone());
        }
    }
    h.deliver(calm, resolve.clone());
    let sent = h.sent();
    let answered = |a: AssociationId| -> Vec<bool> {
        messages_to(&sent, a)
            .iter()
            .map(|m| matches!(m, AsapMessage::HandleResolutionResponse(r) if r.error.is_none()))
            .collect()
    };
    let served: usize = flood
        .iter()
        .map(|a| answered(*a).iter().filter(|ok| **ok).count())
        .sum();
    assert_eq!(served, 4, "the host's burst, over all its associations");
    assert_eq!(answered(calm), vec![true]);
    assert_eq!(
        h.registrar
            .metrics()
            .rate_limited_by(RateLimited::HandleResolutionPerAddress),
        8
    );
    h.advance_to(ms(1000));
    h.deliver(flood[3], resolve);
    let sent = h.sent();
    assert!(matches!(&messages_to(&sent, flood[3])[..],
        [AsapMessage::HandleResolutionResponse(r)] if r.error.is_none()));
}

#[test]
fn the_ownership_probe_has_its_own_shorter_timeout() {
    // RSPLIB's PEs give up on a registration after 3 s: the claim must be answered sooner than
    // the 5 s keep-alive timeout.
    let mut h = harness(Profile::Rsplib, |c| {
        c.keep_alive_timeout = Duration::from_secs(5);
        c.ownership_probe_timeout = Duration::from_millis(1500);
    });
    let owner = h.association_up(1, PE_HOST);
    let claimant = h.association_up(2, PE_HOST);
    h.deliver(owner, registration("P", pe(5)));
    h.sent();
    h.deliver(claimant, registration("P", pe(5)));
    h.advance_to(ms(1499));
    assert_eq!(h.owner("P", 5), Some(owner));
    h.advance_to(ms(1500));
    assert_eq!(h.owner("P", 5), Some(claimant));

    // A periodic keep-alive already outstanding is shortened to the probe's timeout.
    let c2 = h.association_up(3, PE_HOST);
    h.advance_to(ms(1500 + 5000));
    let sent = h.sent();
    assert_eq!(keep_alives(&messages_to(&sent, claimant)), 1);
    h.advance_to(ms(6600));
    h.deliver(c2, registration("P", pe(5)));
    assert_eq!(
        h.registrar.metrics().ownership_probes,
        1,
        "the outstanding keep-alive serves"
    );
    h.advance_to(ms(8099));
    assert_eq!(h.owner("P", 5), Some(claimant));
    h.advance_to(ms(8100));
    assert_eq!(h.owner("P", 5), Some(c2));
}
