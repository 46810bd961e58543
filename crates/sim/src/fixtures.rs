//! Fixtures that tests of several crates share: a pool element's registration values, an SCTP
//! peer, ASAP message builders, [`RegistrarHarness`] (one registrar core driven message by
//! message in virtual time) and [`SingleRegistrar`], one registrar core with PE and PU cores in
//! virtual time.

use rand::rngs::StdRng;
use rand::SeedableRng;
use rserpool_endpoint::pe::{PeEvent, PoolElementConfig, PoolElementCore};
use rserpool_endpoint::pu::{Resolver, ResolverConfig, ResolverEvent};
use rserpool_registrar::{
    AssociationId, AssociationKind, Destination, PeerInfo, Profile, Registrar, RegistrarConfig,
    RegistrarEvent, RemovalCause,
};
use rserpool_wire::asap::{self, AsapMessage};
use rserpool_wire::{
    Codec, HandleResolutionOption, PoolElement, PoolElementId, PoolHandle, PoolPolicy, Protocol,
    RegistrarId, RegistrationLife, TransportAddress, TransportUse, UserTransport,
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

/// The address the PEs of [`RegistrarHarness`] tests register from.
pub const PE_HOST: &str = "10.255.0.1";

/// The address the PUs of [`RegistrarHarness`] tests resolve from.
pub const PU_HOST: &str = "10.255.0.2";

/// `n` milliseconds of virtual time.
pub fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// A PE as it registers with a [`RegistrarHarness`]: identifier `id`, SCTP user transport on
/// `port` of [`PE_HOST`] for data and control, `policy`, a registration life of 90 s, no ASAP
/// transport (the registrar records the association's).
pub fn registering_pe(id: u32, policy: PoolPolicy, port: u16) -> PoolElement {
    PoolElement {
        id: PoolElementId(id),
        home_registrar: RegistrarId(0),
        registration_life: RegistrationLife::Finite(Duration::from_secs(90)),
        user_transport: UserTransport::Address(TransportAddress::sctp(
            port,
            TransportUse::DataPlusControl,
            vec![PE_HOST.parse().unwrap()],
        )),
        policy,
        asap_transport: None,
    }
}

/// ASAP_REGISTRATION of `pe` into `pool` (RFC 5352 section 2.2).
pub fn registration(pool: &str, pe: PoolElement) -> AsapMessage {
    AsapMessage::Registration(asap::Registration {
        pool_handle: PoolHandle::from(pool),
        pool_element: pe,
    })
}

/// ASAP_DEREGISTRATION of PE `id` from `pool` (RFC 5352 section 2.2).
pub fn deregistration(pool: &str, id: u32) -> AsapMessage {
    AsapMessage::Deregistration(asap::Deregistration {
        pool_handle: PoolHandle::from(pool),
        pe_id: PoolElementId(id),
    })
}

/// ASAP_HANDLE_RESOLUTION of `pool`, asking for `items` PEs if given (RFC 5352 section 2.2).
pub fn handle_resolution(pool: &str, items: Option<u32>) -> AsapMessage {
    AsapMessage::HandleResolution(asap::HandleResolution {
        subscribe: false,
        pool_handle: PoolHandle::from(pool),
        option: items.map(|items| HandleResolutionOption { items }),
    })
}

/// ASAP_ENDPOINT_UNREACHABLE reporting PE `id` of `pool` (RFC 5352 section 2.2).
pub fn endpoint_unreachable(pool: &str, id: u32) -> AsapMessage {
    AsapMessage::EndpointUnreachable(asap::EndpointUnreachable {
        pool_handle: PoolHandle::from(pool),
        pe_id: PoolElementId(id),
    })
}

/// ASAP_ENDPOINT_KEEP_ALIVE_ACK from PE `id` of `pool` (RFC 5352 section 2.2).
pub fn endpoint_keep_alive_ack(pool: &str, id: u32) -> AsapMessage {
    AsapMessage::EndpointKeepAliveAck(asap::EndpointKeepAliveAck {
        pool_handle: PoolHandle::from(pool),
        pe_id: PoolElementId(id),
    })
}

/// The messages of `sent` (as [`RegistrarHarness::sent`] returns them) that went to `a`.
pub fn messages_to(sent: &[(Destination, AsapMessage)], a: AssociationId) -> Vec<AsapMessage> {
    sent.iter()
        .filter(|(d, _)| *d == Destination::Association(a))
        .map(|(_, m)| m.clone())
        .collect()
}

/// One registrar core driven message by message in virtual time, without endpoint cores: tests
/// bring associations up, deliver ASAP messages (or raw bytes), advance time, and read what the
/// registrar sent and reported. For the ASAP procedures, removal causes, consistency rejects and
/// the threat defences of RFC 5355, where a test must say exactly what a peer sends.
pub struct RegistrarHarness {
    /// The registrar under test.
    pub registrar: Registrar,
    /// The codec of the registrar's configuration, to encode input and decode output.
    pub codec: Codec,
    /// Virtual time.
    pub now: Duration,
}

impl RegistrarHarness {
    /// A registrar of `profile` with ID 0x12345678, seed 7 and announces off, its configuration
    /// then changed by `tweak`.
    pub fn new(profile: Profile, tweak: impl FnOnce(&mut RegistrarConfig)) -> Self {
        let mut config = RegistrarConfig::new(profile);
        config.registrar_id = RegistrarId(0x1234_5678);
        config.seed = Some(7);
        config.announce = None;
        tweak(&mut config);
        let codec = Codec::new(config.codec);
        RegistrarHarness {
            registrar: Registrar::new(config, Duration::ZERO),
            codec,
            now: Duration::ZERO,
        }
    }

    /// [`RegistrarHarness::new`] with the RSPLIB profile, unchanged.
    pub fn rsplib() -> Self {
        Self::new(Profile::Rsplib, |_| {})
    }

    /// Brings up SCTP association `id` from `addr`, port 40000 + `id` (the port tells
    /// associations of one host apart).
    pub fn association_up(&mut self, id: u64, addr: &str) -> AssociationId {
        let a = AssociationId(id);
        self.registrar.association_up(
            self.now,
            a,
            PeerInfo {
                kind: AssociationKind::Sctp,
                addresses: vec![addr.parse().unwrap()],
                port: 40_000 + id as u16,
            },
        );
        a
    }

    /// Delivers `m`, encoded, as ASAP from association `a`.
    pub fn deliver(&mut self, a: AssociationId, m: AsapMessage) {
        let b = self.codec.encode(&m).unwrap();
        self.registrar
            .message(self.now, a, Protocol::Asap.ppid(), &b);
    }

    /// Delivers the bytes `b` as ASAP from association `a` (for malformed input).
    pub fn deliver_raw(&mut self, a: AssociationId, b: &[u8]) {
        self.registrar
            .message(self.now, a, Protocol::Asap.ppid(), b);
    }

    /// Advances virtual time to `t`, running every timer due on the way.
    pub fn advance_to(&mut self, t: Duration) {
        while let Some(due) = self.registrar.poll_timeout() {
            if due > t {
                break;
            }
            self.now = due.max(self.now);
            self.registrar.handle_timeout(self.now);
        }
        self.now = t;
        self.registrar.handle_timeout(t);
    }

    /// Every message sent since the last call, decoded, with its destination; each must be ASAP
    /// (PPID 11).
    pub fn sent(&mut self) -> Vec<(Destination, AsapMessage)> {
        std::iter::from_fn(|| self.registrar.poll_transmit())
            .map(|t| {
                assert_eq!(t.ppid, Protocol::Asap.ppid());
                (
                    t.destination,
                    self.codec.decode::<AsapMessage>(&t.bytes).unwrap().message,
                )
            })
            .collect()
    }

    /// The messages sent to `a` since the last call (those to others are dropped).
    pub fn sent_to(&mut self, a: AssociationId) -> Vec<AsapMessage> {
        messages_to(&self.sent(), a)
    }

    /// Every event the registrar reported since the last call.
    pub fn events(&mut self) -> Vec<RegistrarEvent> {
        std::iter::from_fn(|| self.registrar.poll_event()).collect()
    }

    /// The PE removals (PE, cause) reported since the last call; other events are dropped.
    pub fn removals(&mut self) -> Vec<(PoolElementId, RemovalCause)> {
        self.events()
            .into_iter()
            .filter_map(|e| match e {
                RegistrarEvent::Removed { pe_id, cause, .. } => Some((pe_id, cause)),
                _ => None,
            })
            .collect()
    }

    /// The association that registered (and so owns) PE `id` of `pool`, if it is stored.
    pub fn owner(&self, pool: &str, id: u32) -> Option<AssociationId> {
        self.registrar
            .handlespace()
            .find(&PoolHandle::from(pool), PoolElementId(id))
            .and_then(|e| e.association())
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
