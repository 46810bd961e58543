//! Fixtures that tests of several crates share: a pool element's registration values, an SCTP
//! peer, and [`SingleRegistrar`], one registrar core with PE and PU cores in virtual time.

use rand::rngs::StdRng;
use rand::SeedableRng;
use rserpool_endpoint::pe::{PeEvent, PoolElementConfig, PoolElementCore};
use rserpool_endpoint::pu::{Resolver, ResolverConfig, ResolverEvent};
use rserpool_registrar::{
    AssociationId, AssociationKind, Destination, PeerInfo, Profile, Registrar, RegistrarConfig,
    RemovalCause,
};
use rserpool_wire::{
    PoolElement, PoolElementId, PoolHandle, PoolPolicy, RegistrarId, RegistrationLife,
    TransportAddress, TransportUse, UserTransport,
};
use std::net::IpAddr;
use std::time::Duration;

/// A PE as it registers: identifier `id`, SCTP user transport on port 7 of `addr`, round robin,
/// a registration life of one hour.
pub fn pool_element(id: u32, addr: IpAddr) -> PoolElement {
    PoolElement {
        id: PoolElementId(id),
        home_registrar: RegistrarId(0),
        registration_life: RegistrationLife::Finite(Duration::from_secs(3600)),
        user_transport: UserTransport::Address(TransportAddress::sctp(
            7,
            TransportUse::DataOnly,
            vec![addr],
        )),
        policy: PoolPolicy::RoundRobin,
        asap_transport: None,
    }
}

/// What a registrar learns when an SCTP association from `addr`:`port` comes up.
pub fn sctp_peer(addr: IpAddr, port: u16) -> PeerInfo {
    PeerInfo {
        kind: AssociationKind::Sctp,
        addresses: vec![addr],
        port,
    }
}

/// One registrar core with PE cores and a resolver wired together in virtual time, without a
/// network: every message is delivered at once by [`SingleRegistrar::pump`]. For tests of the
/// registrar with the real endpoint cores (keep-alives, re-registration, resolution with a
/// cache, unreachable reports); [`crate::World`] is the whole system over a faulty network.
pub struct SingleRegistrar {
    /// Virtual time.
    pub now: Duration,
    /// The registrar (ID 0xfeed, pool `EchoPool`, RSPLIB profile, announces off).
    pub registrar: Registrar,
    /// Each PE: its association, its core, and whether it is alive (a dead one drops input
    /// and sends nothing).
    pub pes: Vec<(AssociationId, PoolElementCore, bool)>,
    /// The pool user's association and resolver.
    pub pu: (AssociationId, Resolver),
    /// What the resolver reported.
    pub pu_events: Vec<ResolverEvent>,
    /// What the PEs reported (PE index, event).
    pub pe_events: Vec<(usize, PeEvent)>,
}

impl SingleRegistrar {
    /// `n_pes` PEs registered (10.0.0.1, 10.0.0.2, …) and a connected resolver whose cache
    /// keeps answers for `stale_cache`.
    pub fn new(n_pes: usize, stale_cache: Duration) -> Self {
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
        let mut w = SingleRegistrar {
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
    pub fn pump(&mut self) {
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

    /// Runs timers and messages until `end`.
    pub fn run_until(&mut self, end: Duration) {
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

    /// The causes of the PE removals the registrar reported since the last call.
    pub fn removals(&mut self) -> Vec<RemovalCause> {
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
