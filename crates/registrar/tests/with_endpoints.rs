//! The registrar core with the PE and PU cores of rserpool-endpoint, wired together in virtual
//! time: registration and keep-alives over minutes, a PE that falls silent, resolution with a
//! cache, and unreachable reports. The harness is rserpool-sim's `SingleRegistrar`.

use rserpool_endpoint::pe::PeEvent;
use rserpool_endpoint::pu::{ResolveError, ResolverEvent};
use rserpool_registrar::{AssociationId, RemovalCause};
use rserpool_sim::fixtures::{sctp_peer, SingleRegistrar as World};
use rserpool_wire::{PoolHandle, RegistrarId};
use std::time::Duration;

#[test]
fn pes_stay_registered_for_ten_minutes_and_a_silent_one_is_removed() {
    let mut w = World::new(3, Duration::ZERO);
    assert_eq!(w.registrar.handlespace().len(), 3);
    assert!(w.pes.iter().all(|(_, pe, _)| pe.is_registered()));
    w.run_until(Duration::from_secs(600));
    assert_eq!(w.registrar.handlespace().len(), 3);
    let m = w.registrar.metrics().clone();
    // 10 minutes, keep-alives every 5 s ± 25 %: about 120 per PE.
    assert!(m.keep_alives_acked >= 3 * 90, "{m:?}");
    assert_eq!(m.keep_alives_missed, 0);
    assert!(
        m.reregistrations >= 3 * 19,
        "re-registration every 30 s: {m:?}"
    );
    assert!(w
        .pes
        .iter()
        .all(|(_, pe, _)| pe.home_registrar() == Some(RegistrarId(0xfeed))));
    w.removals();
    // PE 1 hangs: it neither answers keep-alives nor re-registers.
    w.pes[1].2 = false;
    let hung_at = w.now;
    w.run_until(hung_at + Duration::from_secs(12));
    assert_eq!(w.removals(), vec![RemovalCause::KeepAliveTimeout]);
    assert_eq!(w.registrar.handlespace().len(), 2);
    // Removed within one keep-alive interval (≤ 6.25 s) plus the timeout (5 s).
    assert_eq!(w.registrar.metrics().keep_alives_missed, 1);
}

#[test]
fn pool_user_resolves_with_and_without_cache() {
    let mut w = World::new(3, Duration::from_secs(10));
    let pool = PoolHandle::from("EchoPool");
    w.pu.1.resolve(w.now, pool.clone());
    w.pump();
    let ResolverEvent::Resolved { resolution, .. } = w.pu_events.remove(0) else {
        panic!("{:?}", w.pu_events)
    };
    assert_eq!(
        resolution.pool_elements.len(),
        2,
        "the PU asked for 2 items"
    );
    assert!(!resolution.from_cache);
    // Within the stale-cache time the answer comes from the cache, without a message.
    w.run_until(Duration::from_secs(5));
    let before = w.registrar.metrics().resolutions;
    w.pu.1.resolve(w.now, pool.clone());
    w.pump();
    let ResolverEvent::Resolved { resolution, .. } = w.pu_events.remove(0) else {
        panic!()
    };
    assert!(resolution.from_cache);
    assert_eq!(w.registrar.metrics().resolutions, before);
    // After it, the registrar is asked again.
    w.run_until(Duration::from_secs(11));
    w.pu.1.resolve(w.now, pool);
    w.pump();
    let ResolverEvent::Resolved { resolution, .. } = w.pu_events.remove(0) else {
        panic!()
    };
    assert!(!resolution.from_cache);
    assert_eq!(w.registrar.metrics().resolutions, before + 1);
    // An unknown pool fails with the registrar's reason.
    w.pu.1.resolve(w.now, PoolHandle::from("Nowhere"));
    w.pump();
    assert!(matches!(
        w.pu_events.remove(0),
        ResolverEvent::Failed {
            error: ResolveError::UnknownPoolHandle,
            ..
        }
    ));
}

#[test]
fn unreachable_reports_probe_the_pe_and_only_a_silent_one_is_removed() {
    let mut w = World::new(2, Duration::from_secs(60));
    let pool = PoolHandle::from("EchoPool");
    // A PE that answers the probe the reports trigger stays (RFC 5352 §3.5, RFC 5355 §3.12).
    let healthy = w.pes[1].1.id();
    for _ in 0..3 {
        w.pu.1.report_unreachable(&pool, healthy);
        w.pump();
    }
    assert_eq!(w.registrar.metrics().unreachable_probes, 1);
    w.run_until(Duration::from_secs(1));
    assert!(w.removals().is_empty());
    assert!(w.registrar.handlespace().find(&pool, healthy).is_some());
    // A silent one is removed once the probe times out.
    let victim = w.pes[0].1.id();
    w.pes[0].2 = false;
    for _ in 0..3 {
        w.pu.1.report_unreachable(&pool, victim);
        w.pump();
    }
    w.run_until(Duration::from_secs(7));
    assert_eq!(w.removals(), vec![RemovalCause::UnreachableReports]);
    assert!(w.registrar.handlespace().find(&pool, victim).is_none());
}

#[test]
fn registrar_loss_and_reconnection() {
    let mut w = World::new(1, Duration::ZERO);
    let a = w.pes[0].0;
    w.registrar.association_down(w.now, a);
    w.pes[0].1.disconnected(w.now);
    assert_eq!(w.removals(), vec![RemovalCause::AssociationLost]);
    assert!(w.registrar.handlespace().is_empty());
    // The PE reconnects (a new association) and registers again with the same identifier.
    let b = AssociationId(77);
    w.registrar
        .association_up(w.now, b, sctp_peer("10.0.0.1".parse().unwrap(), 5001));
    w.pes[0].0 = b;
    w.pes[0].1.connected(w.now);
    w.pump();
    assert_eq!(w.registrar.handlespace().len(), 1);
    assert!(w
        .pe_events
        .iter()
        .any(|(_, e)| *e == PeEvent::Registered { first: true }));
}
