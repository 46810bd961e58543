//! Members fed by a registrar: each member host runs a pool element (the real
//! `PoolElementCore`) that registers its TCP service with a registrar (the real `Registrar`
//! core), and the gateway learns its members as the real gateway's RSerPool source does — by
//! resolving the pool with the real pool user core (`Resolver`) every refresh interval and
//! turning each answer into member list updates with `rserpool_lsnat::source::PoolMembership`.
//!
//! This module holds those cores and does what their drivers do (associations up and down,
//! the server hunt's connects); the gateway world carries their messages over its network and
//! runs their timers.

use rand::Rng;
use rserpool_endpoint::pe::{PeEvent, PoolElementConfig, PoolElementCore};
use rserpool_endpoint::pu::{ResolveError, Resolver, ResolverConfig, ResolverEvent};
use rserpool_lsnat::core::Protocol;
use rserpool_lsnat::source::{PoolMembership, SourceUpdate};
use rserpool_registrar::{
    AssociationId, AssociationKind, Destination, PeerInfo, Profile, Registrar, RegistrarConfig,
    RegistrarEvent,
};
use rserpool_wire::{
    HandleResolutionOption, PoolElementId, PoolHandle, PoolPolicy, RegistrarId, TransportAddress,
    UserTransport,
};
use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

/// The pool the members register in and the gateway resolves.
pub(super) const POOL: &str = "GatewayPool";
/// The registrar's ASAP address.
const REGISTRAR: SocketAddr = SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)), 3863);
/// The gateway's own address (its pool user association comes from it).
const GATEWAY: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 9, 0, 1));

/// Who holds one end of a registrar association.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Peer {
    /// The pool element of member host `.0`.
    Pe(usize),
    /// The gateway's resolver.
    Resolver,
}

/// A message on a registrar association: towards the registrar or from it.
#[derive(Debug, Clone)]
pub(super) struct Message {
    pub association: AssociationId,
    pub to_registrar: bool,
    pub bytes: Vec<u8>,
}

/// What the registry reports to the world after it ran.
#[derive(Debug, Default)]
pub(super) struct Output {
    /// Messages to carry.
    pub messages: Vec<Message>,
    /// Readable lines for the trace.
    pub notes: Vec<String>,
    /// Membership updates for the gateway core (from resolutions).
    pub updates: Vec<SourceUpdate>,
    /// Resolutions answered.
    pub resolutions: u64,
}

struct PeSlot {
    association: Option<AssociationId>,
    core: PoolElementCore,
}

/// The registrar, the members' pool elements and the gateway's resolver.
pub(super) struct Registry {
    registrar: Registrar,
    pes: Vec<Option<PeSlot>>,
    /// The gateway's resolver and its association (none while the registrar is down).
    resolver: Option<(Option<AssociationId>, Resolver)>,
    /// The registrar runs (else it crashed and has not restarted yet).
    registrar_up: bool,
    /// The registrar's configuration (a restart starts a fresh core with it).
    registrar_config: RegistrarConfig,
    owners: BTreeMap<AssociationId, Peer>,
    next_association: u64,
    pool: PoolHandle,
    membership: PoolMembership,
    /// The user transport (TCP service) and weight of each member host.
    services: Vec<(SocketAddr, u32)>,
}

impl Registry {
    /// A registrar (RSPLIB profile, announces off) and no PE yet.
    pub fn new(seed: u64, services: Vec<(SocketAddr, u32)>) -> Self {
        let mut config = RegistrarConfig::new(Profile::Rsplib);
        config.registrar_id = RegistrarId(0x0014_0001);
        config.seed = Some(seed);
        config.announce = None;
        Registry {
            registrar: Registrar::new(config.clone(), Duration::ZERO),
            registrar_up: true,
            registrar_config: config,
            pes: services.iter().map(|_| None).collect(),
            resolver: None,
            owners: BTreeMap::new(),
            next_association: 1,
            pool: PoolHandle::from(POOL),
            membership: PoolMembership::new(PoolHandle::from(POOL), Protocol::Tcp),
            services,
        }
    }

    /// The PE identifier of member host `i`.
    pub fn pe_id(i: usize) -> PoolElementId {
        PoolElementId(i as u32 + 1)
    }

    /// Whether the registrar runs.
    pub fn registrar_up(&self) -> bool {
        self.registrar_up
    }

    /// The registrar crashes, all state lost: every association to it is gone (the peers'
    /// kernels see the ABORT): the PEs hunt (and fail to connect until it is back), the
    /// resolver's outstanding request fails.
    pub fn crash_registrar(&mut self, now: Duration) {
        self.registrar_up = false;
        self.owners.clear();
        for slot in self.pes.iter_mut().flatten() {
            if slot.association.take().is_some() {
                slot.core.disconnected(now);
            }
        }
        if let Some((a, r)) = self.resolver.as_mut() {
            if a.take().is_some() {
                r.disconnected(now);
            }
        }
    }

    /// The registrar restarts (same identifier, empty handlespace); the gateway's resolver
    /// connects again at once, the PEs at their next hunt.
    pub fn restart_registrar(&mut self, now: Duration) {
        self.registrar = Registrar::new(self.registrar_config.clone(), now);
        self.registrar_up = true;
        if self.resolver.is_some() {
            let a = self.new_association(now, Peer::Resolver, GATEWAY, 5000);
            if let Some((slot, r)) = self.resolver.as_mut() {
                *slot = Some(a);
                r.connected(now);
            }
        }
    }

    /// Whether the registrar lists member host `i`'s PE now.
    pub fn listed(&self, i: usize) -> bool {
        self.registrar_up
            && self
                .registrar
                .handlespace()
                .pool(&self.pool)
                .and_then(|p| p.get(Self::pe_id(i)))
                .is_some()
    }

    /// Who holds association `a` (none: it is gone).
    pub fn owner(&self, a: AssociationId) -> Option<Peer> {
        self.owners.get(&a).copied()
    }

    /// Member host `i` starts its pool element: it hunts (the registrar is its only one),
    /// connects and registers.
    pub fn start_pe(&mut self, now: Duration, i: usize, rng: &mut impl Rng) {
        let (service, weight) = self.services[i];
        let mut config = PoolElementConfig::new(
            self.pool.clone(),
            UserTransport::Address(TransportAddress::tcp(service.port(), service.ip())),
            PoolPolicy::WeightedRoundRobin { weight },
        );
        config.pe_id = Some(Self::pe_id(i));
        config.registrars = vec![vec![REGISTRAR]];
        let mut core = PoolElementCore::new(config, rng);
        core.start(now);
        self.pes[i] = Some(PeSlot {
            association: None,
            core,
        });
    }

    /// Member host `i`'s process is gone with its PE; returns its association (the
    /// registrar learns of it as the world says: an ABORT, or nothing).
    pub fn stop_pe(&mut self, i: usize) -> Option<AssociationId> {
        let a = self.pes[i].take()?.association?;
        self.owners.remove(&a);
        Some(a)
    }

    /// Member host `i`'s PE deregisters (it leaves the pool; its service stays up).
    pub fn deregister_pe(&mut self, now: Duration, i: usize) -> bool {
        match self.pes[i].as_mut() {
            Some(s) if s.core.is_registered() => {
                s.core.deregister(now);
                true
            }
            _ => false,
        }
    }

    /// Whether member host `i` has a PE that is registered or registering (not leaving).
    pub fn has_pe(&self, i: usize) -> bool {
        self.pes[i].is_some()
    }

    /// The gateway (a new incarnation) connects its resolver to the registrar.
    pub fn start_resolver(&mut self, now: Duration) {
        let mut r = Resolver::new(ResolverConfig {
            items: Some(HandleResolutionOption::ALL),
            ..ResolverConfig::default()
        });
        let a = self.registrar_up.then(|| {
            r.connected(now);
            self.new_association(now, Peer::Resolver, GATEWAY, 5000)
        });
        self.resolver = Some((a, r));
    }

    /// The gateway died with its resolver; returns the resolver's association.
    pub fn stop_resolver(&mut self) -> Option<AssociationId> {
        let a = self.resolver.take()?.0?;
        self.owners.remove(&a);
        Some(a)
    }

    /// The gateway resolves the pool (its refresh timer).
    pub fn resolve(&mut self, now: Duration) {
        if let Some((_, r)) = self.resolver.as_mut() {
            r.resolve(now, self.pool.clone());
        }
    }

    /// The registrar's end of association `a` is gone.
    pub fn registrar_association_down(&mut self, now: Duration, a: AssociationId) {
        self.registrar.association_down(now, a);
    }

    fn new_association(
        &mut self,
        now: Duration,
        peer: Peer,
        address: IpAddr,
        port: u16,
    ) -> AssociationId {
        let a = AssociationId(self.next_association);
        self.next_association += 1;
        self.owners.insert(a, peer);
        self.registrar.association_up(
            now,
            a,
            PeerInfo {
                kind: AssociationKind::Sctp,
                addresses: vec![address],
                port,
            },
        );
        a
    }

    /// A message arrives at the end of `m.association` it was sent to. `pe_runs(i)` says
    /// whether member host `i`'s process runs (the caller keeps messages for a paused one).
    pub fn deliver(&mut self, now: Duration, m: &Message) {
        if m.to_registrar {
            if self.owners.contains_key(&m.association) {
                self.registrar.message(now, m.association, 11, &m.bytes);
            }
            return;
        }
        match self.owners.get(&m.association) {
            Some(Peer::Pe(i)) => {
                if let Some(s) = self.pes[*i].as_mut() {
                    s.core.message(now, &m.bytes);
                }
            }
            Some(Peer::Resolver) => {
                if let Some((_, r)) = self.resolver.as_mut() {
                    r.message(now, &m.bytes);
                }
            }
            None => {}
        }
    }

    /// The earliest timer of the cores that run (`pe_runs(i)`, `resolver_runs`).
    pub fn next_timer(
        &self,
        pe_runs: impl Fn(usize) -> bool,
        resolver_runs: bool,
    ) -> Option<Duration> {
        let mut next = self.registrar.poll_timeout().filter(|_| self.registrar_up);
        let mut earlier = |t: Option<Duration>| {
            if let Some(t) = t {
                next = Some(next.map_or(t, |n: Duration| n.min(t)));
            }
        };
        for (i, s) in self.pes.iter().enumerate() {
            if let Some(s) = s.as_ref().filter(|_| pe_runs(i)) {
                earlier(s.core.poll_timeout());
            }
        }
        if resolver_runs {
            earlier(self.resolver.as_ref().and_then(|(_, r)| r.poll_timeout()));
        }
        next
    }

    /// Runs the timers that are due, of the cores that run.
    pub fn timers(&mut self, now: Duration, pe_runs: impl Fn(usize) -> bool, resolver_runs: bool) {
        if self.registrar_up && self.registrar.poll_timeout().is_some_and(|t| t <= now) {
            self.registrar.handle_timeout(now);
        }
        for (i, s) in self.pes.iter_mut().enumerate() {
            if let Some(s) = s.as_mut().filter(|_| pe_runs(i)) {
                if s.core.poll_timeout().is_some_and(|t| t <= now) {
                    s.core.handle_timeout(now);
                }
            }
        }
        if resolver_runs {
            if let Some((_, r)) = self.resolver.as_mut() {
                if r.poll_timeout().is_some_and(|t| t <= now) {
                    r.handle_timeout(now);
                }
            }
        }
    }

    /// Collects what the cores want sent and reported, and does what their drivers do: a PE
    /// asking for a registrar association gets one (the registrar is always up), a PE that
    /// lost its registrar drops its association and hunts, a PE done deregistering closes it.
    pub fn pump(&mut self, now: Duration) -> Output {
        let mut out = Output::default();
        for i in 0..self.pes.len() {
            let Some(slot) = self.pes[i].as_mut() else {
                continue;
            };
            let mut lost = false;
            while let Some(e) = slot.core.poll_event() {
                lost |= matches!(e, PeEvent::RegistrarLost);
                out.notes.push(format!("PE{i}: {e:?}"));
            }
            let mut old = None;
            if lost || slot.core.is_done() {
                old = slot.association.take();
                if lost {
                    slot.core.disconnected(now);
                }
            }
            let mut connect = slot.core.poll_connect().is_some();
            if connect && !self.registrar_up {
                // Refused: the registrar's host answers with an ABORT.
                slot.core.connect_failed(now);
                connect = false;
            }
            let done = slot.core.is_done();
            if let Some(a) = old {
                self.owners.remove(&a);
                self.registrar.association_down(now, a);
            }
            if done {
                self.pes[i] = None;
                continue;
            }
            if connect {
                let (service, _) = self.services[i];
                let a = self.new_association(now, Peer::Pe(i), service.ip(), 5000);
                let slot = self.pes[i].as_mut().expect("present");
                slot.association = Some(a);
                slot.core.connected(now);
            }
            let slot = self.pes[i].as_mut().expect("present");
            if let Some(a) = slot.association {
                while let Some(bytes) = slot.core.poll_transmit() {
                    out.messages.push(Message {
                        association: a,
                        to_registrar: true,
                        bytes,
                    });
                }
            }
        }
        if let Some((a, r)) = self.resolver.as_mut() {
            while let Some(bytes) = r.poll_transmit() {
                if let Some(a) = *a {
                    out.messages.push(Message {
                        association: a,
                        to_registrar: true,
                        bytes,
                    });
                }
            }
            while let Some(e) = r.poll_event() {
                match e {
                    ResolverEvent::Resolved { resolution, .. } => {
                        out.resolutions += 1;
                        let ids: Vec<String> = resolution
                            .pool_elements
                            .iter()
                            .map(|pe| pe.id.to_string())
                            .collect();
                        out.notes
                            .push(format!("gateway: resolved {POOL}: {}", ids.join(" ")));
                        out.updates
                            .extend(self.membership.resolved(&resolution.pool_elements));
                    }
                    ResolverEvent::Failed { error, .. } => {
                        out.notes
                            .push(format!("gateway: resolution of {POOL} failed: {error}"));
                        out.updates.extend(match error {
                            ResolveError::UnknownPoolHandle => {
                                self.membership.unknown_pool(&REGISTRAR.to_string())
                            }
                            e => self.membership.failed(&e.to_string()),
                        });
                    }
                    ResolverEvent::ProtocolError(e) => {
                        out.notes.push(format!("gateway: resolver: {e}"));
                    }
                }
            }
        }
        while let Some(t) = self.registrar.poll_transmit().filter(|_| self.registrar_up) {
            if let Destination::Association(a) = t.destination {
                out.messages.push(Message {
                    association: a,
                    to_registrar: false,
                    bytes: t.bytes.to_vec(),
                });
            }
        }
        while let Some(e) = self.registrar.poll_event() {
            match e {
                RegistrarEvent::Removed { pe_id, cause, .. } => {
                    out.notes.push(format!("R: removed {pe_id} ({cause:?})"));
                }
                RegistrarEvent::Registered { element, new, .. } => out.notes.push(format!(
                    "R: {} {}",
                    if new { "registered" } else { "re-registered" },
                    element.id
                )),
                _ => {}
            }
        }
        out
    }
}
