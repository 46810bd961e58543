//! The registrar core with the PE and PU cores of rserpool-endpoint, wired together in virtual
//! time: registration and keep-alives over minutes, a PE that falls silent, resolution with a
//! cache, and unreachable reports.

use rand::rngs::StdRng;
use rand::SeedableRng;
use rserpool_endpoint::pe::{PeEvent, PoolElementConfig, PoolElementCore};
use rserpool_endpoint::pu::{ResolveError, Resolver, ResolverConfig, ResolverEvent};
use rserpool_registrar::{
    AssociationId, AssociationKind, Destination, PeerInfo, Profile, Registrar, RegistrarConfig,
    RemovalCause,
};
use rserpool_wire::{
    PoolHandle, PoolPolicy, RegistrarId, TransportAddress, TransportUse, UserTransport,
};
use std::time::Duration;

struct World {
    now: Duration,
    registrar: Registrar,
    pes: Vec<(AssociationId, PoolElementCore, bool)>,
    pu: (AssociationId, Resolver),
    pu_events: Vec<ResolverEvent>,
    pe_events: Vec<(usize, PeEvent)>,
}

impl World {
    fn new(n_pes: usize, stale_cache: Duration) -> Self {
        let mut config = RegistrarConfig::new(Profile::Rsplib);
        config.registrar_id = RegistrarId(0xfeed);
        config.seed = Some(1);
        config.announce = None;
        let mut registrar = Registrar::new(config, Duration::ZERO);
        let mut rng = StdRng::seed_from_u64(2);
        let mut pes = Vec::new();
        for i in 0..n_pes {
            let addr = format!("10.0.0.{}", i + 1).parse().unwrap();
            let a = AssociationId(i as u64 + 1);
            registrar.association_up(
                Duration::ZERO,
                a,
                PeerInfo {
                    kind: AssociationKind::Sctp,
                    addresses: vec![addr],
                    port: 5000,
                },
            );
            let mut pe = PoolElementCore::new(
                PoolElementConfig::new(
                    PoolHandle::from("EchoPool"),
                    UserTransport::Address(TransportAddress::sctp(
                        7,
                        TransportUse::DataPlusControl,
                        vec![addr],
                    )),
                    PoolPolicy::RoundRobin,
                ),
                &mut rng,
            );
            pe.connected(Duration::ZERO);
            pes.push((a, pe, true));
        }
        let pu_assoc = AssociationId(1000);
        registrar.association_up(
            Duration::ZERO,
            pu_assoc,
            PeerInfo {
                kind: AssociationKind::Sctp,
                addresses: vec!["10.1.0.1".parse().unwrap()],
                port: 6000,
            },
        );
        let mut pu = Resolver::new(ResolverConfig {
            items: Some(2),
            stale_cache,
            ..ResolverConfig::default()
        });
        pu.connected(Duration::ZERO);
        let mut w = World {
            now: Duration::ZERO,
            registrar,
            pes,
            pu: (pu_assoc, pu),
            pu_events: Vec::new(),
            pe_events: Vec::new(),
        };
        w.pump();
        w
    }

    /// Delivers every pending message (PEs that are `alive` answer; silent ones drop input).
    fn pump(&mut self) {
        loop {
            let mut moved = false;
            for (a, pe, alive) in &mut self.pes {
                while let Some(b) = pe.poll_transmit() {
                    moved = true;
                    if *alive {
                        self.registrar.message(self.now, *a, 11, &b);
                    }
                }
            }
            while let Some(b) = self.pu.1.poll_transmit() {
                moved = true;
                self.registrar.message(self.now, self.pu.0, 11, &b);
            }
            while let Some(t) = self.registrar.poll_transmit() {
                moved = true;
                let Destination::Association(a) = t.destination else {
                    continue;
                };
                if a == self.pu.0 {
                    self.pu.1.message(self.now, &t.bytes);
                } else if let Some((_, pe, alive)) = self.pes.iter_mut().find(|(x, _, _)| *x == a) {
                    if *alive {
                        pe.message(self.now, &t.bytes);
                    }
                }
            }
            for (i, (_, pe, _)) in self.pes.iter_mut().enumerate() {
                while let Some(e) = pe.poll_event() {
                    self.pe_events.push((i, e));
                }
            }
            while let Some(e) = self.pu.1.poll_event() {
                self.pu_events.push(e);
            }
            if !moved {
                break;
            }
        }
    }

    fn run_until(&mut self, end: Duration) {
        loop {
            let mut next = self.registrar.poll_timeout();
            for (_, pe, alive) in &self.pes {
                if *alive {
                    next = min(next, pe.poll_timeout());
                }
            }
            next = min(next, self.pu.1.poll_timeout());
            let Some(t) = next.filter(|t| *t <= end) else {
                break;
            };
            self.now = t.max(self.now);
            self.registrar.handle_timeout(self.now);
            for (_, pe, alive) in &mut self.pes {
                if *alive {
                    pe.handle_timeout(self.now);
                }
            }
            self.pu.1.handle_timeout(self.now);
            self.pump();
        }
        self.now = end;
    }

    fn removals(&mut self) -> Vec<RemovalCause> {
        std::iter::from_fn(|| self.registrar.poll_event())
            .filter_map(|e| match e {
                rserpool_registrar::RegistrarEvent::Removed { cause, .. } => Some(cause),
                _ => None,
            })
            .collect()
    }
}

fn min(a: Option<Duration>, b: Option<Duration>) -> Option<Duration> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

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
    w.registrar.association_up(
        w.now,
        b,
        PeerInfo {
            kind: AssociationKind::Sctp,
            addresses: vec!["10.0.0.1".parse().unwrap()],
            port: 5001,
        },
    );
    w.pes[0].0 = b;
    w.pes[0].1.connected(w.now);
    w.pump();
    assert_eq!(w.registrar.handlespace().len(), 1);
    assert!(w
        .pe_events
        .iter()
        .any(|(_, e)| *e == PeEvent::Registered { first: true }));
}
