//! The registrar's protocol logic as a sans-IO state machine: events and the current time go in,
//! transmissions, timer deadlines and reports come out. No sockets, no clock, no global RNG.
//!
//! Drive it with [`Registrar::association_up`], [`Registrar::association_down`],
//! [`Registrar::message`] and [`Registrar::handle_timeout`]; after each call drain
//! [`Registrar::poll_transmit`], [`Registrar::poll_event`] and arm a timer for
//! [`Registrar::poll_timeout`].

use crate::access::AccessRefusal;
use crate::config::{AddressScope, Profile, RegistrarConfig};
use crate::encoded_pes::EncodedPes;
use crate::metrics::{Metrics, RateLimited, RemovalCause, SecurityRefusal};
use crate::rate::TokenBucket;
use crate::security::{Claim, ProbeReason, Security};
use bytes::Bytes;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rserpool_handlespace::{
    AssociationId, EntryId, Handlespace, RemovedElement, Selection, TimerKind,
};
use rserpool_wire::arena::MessageArena;
use rserpool_wire::asap::{self, AsapMessage, HandleResolutionRef};
use rserpool_wire::{
    AssociationKind, CauseCode, Codec, DecodeError, EncodeError, ErrorCause,
    HandleResolutionOption, Message, OperationError, PeerIdentity, PoolElement, PoolElementId,
    PoolHandle, PoolPolicy, Protocol, RegistrarId, RegistrationLife, TransportAddress,
    TransportProtocol, TransportUse, UserTransport,
};
use rustc_hash::FxHashMap;
use std::collections::VecDeque;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

// The hooks ENRP (crate::enrp) drives the handlespace through: a child module, so that it
// reaches the core's state without widening it.
#[path = "enrp/asap_hooks.rs"]
mod enrp_hooks;
pub use enrp_hooks::{LearnRefused, OwnChange};

/// What the registrar knows of a peer when its association comes up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerInfo {
    /// What carries the association (decides what the registrar records as a PE's ASAP
    /// transport).
    pub kind: AssociationKind,
    /// The peer's addresses (all of them, for SCTP).
    pub addresses: Vec<IpAddr>,
    /// The peer's port.
    pub port: u16,
}

/// Where a transmission goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Destination {
    /// Over an association.
    Association(AssociationId),
    /// To the announce multicast group (ASAP_SERVER_ANNOUNCE).
    Announce,
    /// To a PE's ASAP transport address, over a new association if none exists (the H=1
    /// ENDPOINT_KEEP_ALIVE after an ENRP takeover, RFC 5353 §3.5.2).
    Address(SocketAddr),
}

/// A message to send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transmit {
    /// Where to.
    pub destination: Destination,
    /// SCTP payload protocol identifier (11 for ASAP).
    pub ppid: u32,
    /// The encoded message.
    pub bytes: Bytes,
}

/// Messages waiting to be sent, each encoded into a reused buffer and then copied into a
/// shared chunk (no allocation per message).
#[derive(Debug, Default)]
struct Outgoing {
    queue: VecDeque<Transmit>,
    scratch: Vec<u8>,
    arena: MessageArena,
}

impl Outgoing {
    /// Queues what `encode` appends to an empty buffer; nothing if it fails (then `false`).
    /// Every message the core builds is valid by construction, so encoding only fails on limits
    /// set below what a response needs, which the peer sees as a missing answer.
    fn push(
        &mut self,
        destination: Destination,
        encode: impl FnOnce(&mut Vec<u8>) -> Result<(), EncodeError>,
    ) -> bool {
        self.scratch.clear();
        if encode(&mut self.scratch).is_err() {
            return false;
        }
        self.queue.push_back(Transmit {
            destination,
            ppid: Protocol::Asap.ppid(),
            bytes: self.arena.copy(&self.scratch),
        });
        true
    }
}

/// What happened, for logs and tests. Metrics count the same facts in [`Metrics`].
#[derive(Debug, Clone, PartialEq)]
pub enum RegistrarEvent {
    /// An association was accepted.
    AssociationUp {
        /// The association.
        association: AssociationId,
        /// The peer.
        peer: PeerInfo,
    },
    /// An association was refused at the association limit, in all or from its address (the
    /// driver aborts it).
    AssociationRefused {
        /// The association.
        association: AssociationId,
        /// The peer.
        peer: PeerInfo,
        /// Which limit.
        limit: &'static str,
    },
    /// A request about a PE that another association owns was refused (RFC 5355 §3.3/§3.4),
    /// or a new PE past the per-association limit.
    SecurityRefused {
        /// What was asked: "deregistration" or "registration".
        request: &'static str,
        /// Pool.
        pool_handle: PoolHandle,
        /// PE identifier.
        pe_id: PoolElementId,
        /// The asking association.
        association: AssociationId,
        /// Its peer (addresses and port), when known.
        peer: Option<PeerInfo>,
        /// The association that owns the PE, if another one does.
        owner: Option<AssociationId>,
        /// Why.
        reason: SecurityRefusal,
    },
    /// Another association claimed a live PE: a keep-alive was sent to the owner, and the claim
    /// waits for its answer (RFC 5355 §3.3).
    OwnershipProbe {
        /// Pool.
        pool_handle: PoolHandle,
        /// PE.
        pe_id: PoolElementId,
        /// The owner probed.
        owner: AssociationId,
        /// The claiming association.
        claimant: AssociationId,
        /// The claimant's peer.
        peer: Option<PeerInfo>,
    },
    /// A claim was granted: the owner was gone or did not answer the probe in time.
    ClaimGranted {
        /// Pool.
        pool_handle: PoolHandle,
        /// PE.
        pe_id: PoolElementId,
        /// The new owner.
        association: AssociationId,
    },
    /// ENDPOINT_UNREACHABLE reports made the registrar probe a PE with a keep-alive (RFC 5352
    /// §3.5); the PE is removed only if it does not answer in time.
    UnreachableProbe {
        /// Pool.
        pool_handle: PoolHandle,
        /// PE.
        pe_id: PoolElementId,
        /// Reports counted since its last registration.
        reports: u32,
    },
    /// ENDPOINT_UNREACHABLE reports asked for a probe of a PE that its per-PE budget did not
    /// allow (RFC 5355 §3.12/§3.13).
    ProbeSuppressed {
        /// Pool.
        pool_handle: PoolHandle,
        /// PE.
        pe_id: PoolElementId,
    },
    /// A PE registered (new) or re-registered.
    Registered {
        /// Pool.
        pool_handle: PoolHandle,
        /// The PE as stored (with home registrar and ASAP transport).
        element: PoolElement,
        /// Over which association.
        association: AssociationId,
        /// Whether the PE is new in the handlespace.
        new: bool,
        /// User-transport addresses left out (not the association's, or too narrow in scope).
        dropped_addresses: Vec<IpAddr>,
    },
    /// A registration was refused.
    RegistrationRejected {
        /// Pool.
        pool_handle: PoolHandle,
        /// PE identifier.
        pe_id: PoolElementId,
        /// The cause sent.
        cause: CauseCode,
        /// Why, in words (which field, which limit).
        reason: String,
    },
    /// A PE left the handlespace.
    Removed {
        /// Pool.
        pool_handle: PoolHandle,
        /// PE identifier.
        pe_id: PoolElementId,
        /// Why.
        cause: RemovalCause,
    },
    /// A handle resolution was answered (reported only with
    /// [`RegistrarConfig::report_resolutions`]; the metrics count every one).
    HandleResolution {
        /// Asking association.
        association: AssociationId,
        /// Pool.
        pool_handle: PoolHandle,
        /// The selection (policy, candidates and the inputs of the choice); `None` for an
        /// unknown pool handle.
        selection: Option<Selection>,
    },
    /// An ENDPOINT_KEEP_ALIVE was sent.
    KeepAliveSent {
        /// Pool.
        pool_handle: PoolHandle,
        /// PE.
        pe_id: PoolElementId,
    },
    /// A PE answered its keep-alive in time.
    KeepAliveAcked {
        /// Pool.
        pool_handle: PoolHandle,
        /// PE.
        pe_id: PoolElementId,
    },
    /// A pool user reported a PE unreachable.
    UnreachableReported {
        /// Pool.
        pool_handle: PoolHandle,
        /// PE.
        pe_id: PoolElementId,
        /// Reports since its last registration.
        count: u32,
    },
    /// A request was refused by a per-client rate limit.
    RateLimited {
        /// The client's association.
        association: AssociationId,
        /// Which limit.
        what: RateLimited,
        /// Requests this association had refused by this limit so far (1 for the first), so
        /// that a flood can be logged sparsely.
        count: u64,
    },
    /// A request was refused by the identity rules ([`RegistrarConfig::access`]); counted in
    /// [`Metrics::access_refused_by`].
    AccessRefused {
        /// The association it came over.
        association: AssociationId,
        /// Who the peer proved to be (`None`: no certificate).
        identity: Option<Arc<PeerIdentity>>,
        /// Which rule refused it.
        refusal: AccessRefusal,
        /// The pool handle of the request, where it has one.
        pool_handle: Option<PoolHandle>,
    },
    /// A message could not be decoded.
    Malformed {
        /// Where it came from.
        association: AssociationId,
        /// What was wrong (names the message, parameter and offset).
        error: DecodeError,
        /// Whether an ASAP_ERROR was sent back.
        answered: bool,
    },
    /// A PE taken over from a dead peer answered over the association the H=1 keep-alive
    /// opened: it adopted this registrar as its home (RFC 5353 §3.5.2).
    Adopted {
        /// Pool.
        pool_handle: PoolHandle,
        /// PE.
        pe_id: PoolElementId,
        /// The association it answered over.
        association: AssociationId,
    },
    /// A well-formed message a registrar does not take from PEs or PUs (ignored).
    Ignored {
        /// Where it came from.
        association: AssociationId,
        /// What it was.
        message: &'static str,
        /// Why it was ignored.
        reason: &'static str,
    },
}

#[derive(Debug)]
struct Association {
    peer: PeerInfo,
    identity: Option<Arc<PeerIdentity>>,
    handle_resolutions: Option<TokenBucket>,
    unreachable_reports: Option<TokenBucket>,
    registrations: Option<TokenBucket>,
    /// Requests refused per rate limit (indexed by [`RateLimited`]).
    rate_limited: [u64; 4],
}

/// The registrar core.
pub struct Registrar {
    config: RegistrarConfig,
    id: RegistrarId,
    codec: Codec,
    handlespace: Handlespace,
    rng: StdRng,
    /// Keyed by the transport's association ids, never by peers' input: a fast hash is safe.
    associations: FxHashMap<AssociationId, Association>,
    transmits: Outgoing,
    events: VecDeque<RegistrarEvent>,
    metrics: Metrics,
    next_announce: Option<Duration>,
    enrp_peers: usize,
    /// Reused by handle resolutions that are not reported.
    selection: Selection,
    encoded_pes: EncodedPes,
    /// Ownership claims, probe reasons and budgets, associations per address (RFC 5355).
    security: Security,
    /// Claims on PEs that left the handlespace, settled when the current step ends.
    settled_claims: Vec<Claim>,
    /// Changes to the PEs this registrar is home for, kept for ENRP HANDLE_UPDATEs once
    /// [`Registrar::enable_handle_updates`] was called.
    own_changes: Option<VecDeque<OwnChange>>,
}

impl Registrar {
    /// A registrar with the given settings, started at `now`.
    pub fn new(config: RegistrarConfig, now: Duration) -> Self {
        let mut rng = match config.seed {
            Some(seed) => StdRng::seed_from_u64(seed),
            None => StdRng::from_os_rng(),
        };
        let id = if config.registrar_id.0 != 0 {
            config.registrar_id
        } else {
            RegistrarId(rng.random_range(1..=u32::MAX))
        };
        let next_announce = config.announce.as_ref().map(|_| now);
        Registrar {
            codec: Codec::new(config.codec),
            handlespace: Handlespace::new(config.handlespace.clone()),
            id,
            rng,
            associations: FxHashMap::default(),
            transmits: Outgoing::default(),
            events: VecDeque::new(),
            metrics: Metrics {
                registrar_id: id,
                ..Metrics::default()
            },
            next_announce,
            enrp_peers: 0,
            selection: Selection::default(),
            encoded_pes: EncodedPes::default(),
            security: Security::default(),
            settled_claims: Vec::new(),
            own_changes: None,
            config,
        }
    }

    /// This registrar's identifier.
    pub fn id(&self) -> RegistrarId {
        self.id
    }

    /// The settings.
    pub fn config(&self) -> &RegistrarConfig {
        &self.config
    }

    /// The handlespace (read-only).
    pub fn handlespace(&self) -> &Handlespace {
        &self.handlespace
    }

    /// The counters.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// Number of ENRP peers known, for the (N+1)·T6 announce rule of RFC 5352 §3.6.
    pub fn set_enrp_peer_count(&mut self, peers: usize) {
        self.enrp_peers = peers;
    }

    /// The next message to send, if any.
    pub fn poll_transmit(&mut self) -> Option<Transmit> {
        self.transmits.queue.pop_front()
    }

    /// The next report, if any.
    pub fn poll_event(&mut self) -> Option<RegistrarEvent> {
        self.events.pop_front()
    }

    /// When [`Registrar::handle_timeout`] must be called next.
    pub fn poll_timeout(&self) -> Option<Duration> {
        let pe = self.handlespace.next_timer().map(|t| t.deadline);
        match (pe, self.next_announce) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// An association (SCTP) or connection (TCP) came up.
    pub fn association_up(&mut self, now: Duration, association: AssociationId, peer: PeerInfo) {
        self.association_up_with_identity(now, association, peer, None)
    }

    /// An association came up whose peer proved an identity with a TLS certificate (`None`: no
    /// certificate). The identity rules ([`RegistrarConfig::access`]) apply to it for its whole
    /// life.
    pub fn association_up_with_identity(
        &mut self,
        now: Duration,
        association: AssociationId,
        peer: PeerInfo,
        identity: Option<Arc<PeerIdentity>>,
    ) {
        let refused = if self.associations.len() >= self.config.max_associations {
            Some("max-associations")
        } else if peer.addresses.first().is_some_and(|a| {
            !self.security.admit(
                *a,
                self.config.max_associations_per_address,
                self.config.handle_resolution_rate_per_address,
                now,
            )
        }) {
            // RFC 5355 §3.1/§3.2: one host cannot take every association.
            self.metrics
                .refused(SecurityRefusal::AssociationsPerAddress);
            Some("max-associations-per-address")
        } else {
            None
        };
        if let Some(limit) = refused {
            self.metrics.associations_refused += 1;
            self.events.push_back(RegistrarEvent::AssociationRefused {
                association,
                peer,
                limit,
            });
            return;
        }
        let bucket = |l: Option<crate::config::RateLimit>| l.map(|l| TokenBucket::new(l, now));
        self.associations.insert(
            association,
            Association {
                peer: peer.clone(),
                identity,
                handle_resolutions: bucket(self.config.handle_resolution_rate),
                unreachable_reports: bucket(self.config.endpoint_unreachable_rate),
                registrations: bucket(self.config.registration_rate),
                rate_limited: [0; 4],
            },
        );
        self.update_gauges();
        self.events
            .push_back(RegistrarEvent::AssociationUp { association, peer });
    }

    /// An association went down: every PE registered over it is removed (RFC 5352 §3.1: the
    /// registrar watches its PEs through their association).
    pub fn association_down(&mut self, now: Duration, association: AssociationId) {
        let Some(gone) = self.associations.remove(&association) else {
            return;
        };
        if let Some(a) = gone.peer.addresses.first() {
            self.security.release(*a);
        }
        self.security.association_gone(association);
        for (pool_handle, removed) in self.handlespace.remove_association(association) {
            self.removed(pool_handle, removed, RemovalCause::AssociationLost);
        }
        self.settle_claims(now);
        self.update_gauges();
    }

    /// A message arrived on an association.
    pub fn message(&mut self, now: Duration, association: AssociationId, ppid: u32, bytes: &[u8]) {
        if !self.associations.contains_key(&association) {
            return;
        }
        if ppid != Protocol::Asap.ppid() {
            self.events.push_back(RegistrarEvent::Ignored {
                association,
                message: "non-ASAP payload",
                reason: "the registrar serves ASAP (PPID 11) on this endpoint",
            });
            return;
        }
        // The request a registrar gets most, read in place; any other shape is decoded fully.
        if let Some(h) = self.codec.peek_handle_resolution(bytes) {
            self.handle_resolution(now, association, h);
            return;
        }
        let decoded = match self.codec.decode::<AsapMessage>(bytes) {
            Ok(d) => d,
            Err(error) => {
                self.metrics.malformed_messages += 1;
                let answered = match error.answer_cause(bytes) {
                    Some(cause) => {
                        self.send_error(association, cause);
                        true
                    }
                    None => false,
                };
                self.events.push_back(RegistrarEvent::Malformed {
                    association,
                    error,
                    answered,
                });
                return;
            }
        };
        for u in decoded.to_report() {
            self.send_error(
                association,
                ErrorCause::with_info(CauseCode::UnrecognizedParameter, u.bytes.clone()),
            );
        }
        match decoded.message {
            AsapMessage::Registration(r) => self.registration(now, association, r),
            AsapMessage::Deregistration(d) => self.deregistration(association, d),
            AsapMessage::HandleResolution(h) => {
                self.handle_resolution(now, association, h.as_ref())
            }
            AsapMessage::EndpointKeepAliveAck(a) => self.keep_alive_ack(now, association, a),
            AsapMessage::EndpointUnreachable(u) => self.endpoint_unreachable(now, association, u),
            other => self.events.push_back(RegistrarEvent::Ignored {
                association,
                message: other.name(),
                reason: "not a message a registrar takes from pool elements or users",
            }),
        }
        self.settle_claims(now);
        self.update_gauges();
    }

    /// Runs what is due at `now`: keep-alives, their timeouts, registration-life expiries and
    /// server announces.
    pub fn handle_timeout(&mut self, now: Duration) {
        while let Some(timer) = self.handlespace.pop_due(now) {
            match timer.kind {
                TimerKind::KeepAliveTransmission => {
                    self.send_keep_alive(now, timer.entry);
                }
                TimerKind::KeepAliveTimeout => {
                    self.metrics.keep_alives_missed += 1;
                    // A probe that reports asked for and that failed removes the PE for them.
                    let cause = match self.security.outstanding(timer.entry) {
                        Some(ProbeReason::Reports) => RemovalCause::UnreachableReports,
                        _ => RemovalCause::KeepAliveTimeout,
                    };
                    self.remove(timer.entry, cause);
                }
                TimerKind::Expiry => self.expire(timer.entry),
            }
        }
        self.settle_claims(now);
        if let (Some(due), Some(announce)) = (self.next_announce, &self.config.announce) {
            if due <= now {
                let m = AsapMessage::ServerAnnounce(asap::ServerAnnounce {
                    server_id: self.id,
                    transports: announce.transports.clone(),
                });
                let codec = &self.codec;
                if self
                    .transmits
                    .push(Destination::Announce, |buf| codec.encode_into(&m, buf))
                {
                    self.metrics.announces_sent += 1;
                }
                // RFC 5352 §3.6: with N peers heard, each registrar announces every (N+1)·T6.
                let cycle = announce.interval.mul_f64((self.enrp_peers + 1) as f64);
                let jitter = announce.jitter.clamp(0.0, 0.99);
                let factor = 1.0 + self.rng.random_range(-jitter..=jitter);
                self.next_announce = Some(now + cycle.mul_f64(factor));
            }
        }
        self.update_gauges();
    }

    fn update_gauges(&mut self) {
        self.metrics.pools = self.handlespace.pool_count() as u64;
        self.metrics.pool_elements = self.handlespace.len() as u64;
        self.metrics.associations = self.associations.len() as u64;
    }

    fn send(&mut self, association: AssociationId, m: &AsapMessage) {
        let codec = &self.codec;
        self.transmits
            .push(Destination::Association(association), |buf| {
                codec.encode_into(m, buf)
            });
    }

    fn send_error(&mut self, association: AssociationId, cause: ErrorCause) {
        self.metrics.errors_sent += 1;
        self.send(
            association,
            &AsapMessage::Error(asap::AsapError {
                error: OperationError::from_cause(cause),
            }),
        );
    }

    fn keep_alive_interval(&mut self) -> Duration {
        let j = self.config.keep_alive_jitter.clamp(0.0, 0.99);
        let factor = if j > 0.0 {
            1.0 + self.rng.random_range(-j..=j)
        } else {
            1.0
        };
        self.config.keep_alive_interval.mul_f64(factor)
    }

    /// When the PE's registration life runs out, if it does and the life is enforced.
    fn expiry_of(&self, entry: EntryId) -> Option<Duration> {
        if !self.config.enforce_registration_life {
            return None;
        }
        let pe = self.handlespace.get(entry)?;
        match pe.element().registration_life {
            RegistrationLife::Infinite => None,
            RegistrationLife::Finite(life) => Some(pe.updated_at() + life),
        }
    }

    /// Arms the PE's one timer with whichever comes first: the given keep-alive event or the
    /// end of its registration life.
    fn arm(&mut self, entry: EntryId, kind: TimerKind, deadline: Duration) {
        let (kind, deadline) = match self.expiry_of(entry) {
            Some(expiry) if expiry <= deadline => (TimerKind::Expiry, expiry),
            _ => (kind, deadline),
        };
        let _ = self.handlespace.set_timer(entry, kind, deadline);
    }

    /// Whether the peer of `association` may peer over ENRP, by the identity it proved
    /// ([`AccessRules::may_peer`](crate::access::AccessRules::may_peer); always `Ok` without
    /// identity rules). A refusal is counted and reported
    /// ([`RegistrarEvent::AccessRefused`]); the caller then closes the association before taking
    /// any ENRP message from it (RFC 5355 §3.4: a malicious ENRP server must not join).
    pub fn check_enrp_peer(&mut self, association: AssociationId) -> Result<(), AccessRefusal> {
        self.access(association, None, |r, i| r.may_peer(i))
    }

    /// As [`Registrar::check_enrp_peer`] for an association of the ENRP endpoint, whose peer
    /// proved `identity` (`None`: no certificate); `association` only names it in the report.
    pub fn check_enrp_identity(
        &mut self,
        association: AssociationId,
        identity: Option<Arc<PeerIdentity>>,
    ) -> Result<(), AccessRefusal> {
        let Some(rules) = &self.config.access else {
            return Ok(());
        };
        let Err(refusal) = rules.may_peer(identity.as_deref()) else {
            return Ok(());
        };
        self.metrics.access_refused(refusal);
        self.events.push_back(RegistrarEvent::AccessRefused {
            association,
            identity,
            refusal,
            pool_handle: None,
        });
        Err(refusal)
    }

    /// Checks a request against the identity rules; a refusal is counted and reported, and
    /// the caller answers it (cause 0xa, "rejected due to security considerations").
    fn access(
        &mut self,
        association: AssociationId,
        pool_handle: Option<&[u8]>,
        check: impl FnOnce(
            &crate::access::AccessRules,
            Option<&PeerIdentity>,
        ) -> Result<(), AccessRefusal>,
    ) -> Result<(), AccessRefusal> {
        let Some(rules) = &self.config.access else {
            return Ok(());
        };
        let identity = self
            .associations
            .get(&association)
            .and_then(|a| a.identity.clone());
        let refusal = match check(rules, identity.as_deref()) {
            Ok(()) => return Ok(()),
            Err(r) => r,
        };
        self.metrics.access_refused(refusal);
        self.events.push_back(RegistrarEvent::AccessRefused {
            association,
            identity,
            refusal,
            pool_handle: pool_handle.map(PoolHandle::from),
        });
        Err(refusal)
    }

    fn registration(&mut self, now: Duration, association: AssociationId, r: asap::Registration) {
        let limited = self
            .associations
            .get_mut(&association)
            .and_then(|a| a.registrations.as_mut())
            .is_some_and(|b| !b.allow(now));
        if limited {
            self.rate_limited(association, RateLimited::Registration);
            self.reject_with(
                association,
                r.pool_handle,
                r.pool_element.id,
                ErrorCause::new(CauseCode::RejectedSecurity),
                "registration rate limit of the association".into(),
            );
            return;
        }
        self.register(now, association, r);
    }

    /// A registration past the rate limit: checks, ownership, then the handlespace.
    fn register(&mut self, now: Duration, association: AssociationId, r: asap::Registration) {
        let asap::Registration {
            pool_handle,
            pool_element: pe,
        } = r;
        let pe_id = pe.id;
        // RFC 5355 §3.1/§3.2: only identities allowed for the pool register into it.
        if let Err(refusal) = self.access(association, Some(pool_handle.as_bytes()), |r, i| {
            r.may_register(i, pool_handle.as_bytes())
        }) {
            let cause = ErrorCause::new(CauseCode::RejectedSecurity);
            self.reject_with(association, pool_handle, pe_id, cause, refusal.to_string());
            return;
        }
        let checked = self.associations.get(&association).ok_or_else(|| {
            (
                ErrorCause::new(CauseCode::InvalidValues),
                "registration over an unknown association".to_string(),
            )
        });
        let checked = checked.and_then(|a| {
            let peer = &a.peer;
            let (mut pe, dropped) = self.check_registration(pe, peer)?;
            // RFC 5352 §3.1: the accepting registrar becomes the home registrar, and records
            // the association's addresses as the PE's ASAP transport (RFC 5352 §2.2.1).
            pe.home_registrar = self.id;
            let asap_addresses: Vec<IpAddr> = peer
                .addresses
                .iter()
                .copied()
                .filter(|a| AddressScope::of(a) >= self.config.min_address_scope)
                .collect();
            if asap_addresses.is_empty() {
                return Err((
                    ErrorCause::new(CauseCode::InvalidValues),
                    format!(
                        "no address of the association has the minimum address scope: {}",
                        why_dropped(
                            &peer.addresses,
                            &peer.addresses,
                            self.config.min_address_scope,
                            false
                        )
                    ),
                ));
            }
            pe.asap_transport = Some(TransportAddress {
                protocol: match peer.kind {
                    AssociationKind::Sctp => TransportProtocol::Sctp,
                    AssociationKind::TcpMapped | AssociationKind::TcpPlain => {
                        TransportProtocol::Tcp
                    }
                },
                port: peer.port,
                transport_use: TransportUse::DataOnly,
                addresses: asap_addresses,
            });
            Ok((pe, dropped))
        });
        let (pe, dropped) = match checked {
            Ok(checked) => checked,
            Err((cause, reason)) => {
                self.reject_with(association, pool_handle, pe_id, cause, reason);
                return;
            }
        };
        let existing = self.handlespace.entry_id(&pool_handle, pe_id);
        let owner = existing
            .and_then(|e| self.handlespace.get(e))
            .and_then(|e| e.association());
        // RFC 5355 §3.3 (registration spoofing): a PE listed here with no live association of
        // ours (homed at another registrar, or taken over and not yet adopted) may move here,
        // but it registers from its own host: a registration from an association that shares
        // no address with the PE's recorded ASAP transport is an impostor's.
        let orphan = owner.is_none_or(|o| !self.associations.contains_key(&o));
        let foreign = orphan
            && existing
                .and_then(|e| self.handlespace.get(e))
                .and_then(|e| e.element().asap_transport.as_ref())
                .zip(self.associations.get(&association))
                .is_some_and(|(t, a)| !t.addresses.iter().any(|x| a.peer.addresses.contains(x)));
        if foreign {
            self.refuse_foreign(
                "registration",
                &pool_handle,
                pe_id,
                association,
                None,
                SecurityRefusal::ForeignRegistration,
            );
            self.reject_with(
                association,
                pool_handle,
                pe_id,
                ErrorCause::new(CauseCode::RejectedSecurity),
                "the PE is listed at another address and has no association here to prove it moved"
                    .to_string(),
            );
            return;
        }
        match (existing, owner) {
            // RFC 5355 §3.3/§3.4: a live PE belongs to the association that registered it.
            // Another association's claim waits for a keep-alive to the owner.
            (Some(entry), Some(owner))
                if owner != association && self.associations.contains_key(&owner) =>
            {
                let registration = asap::Registration {
                    pool_handle,
                    pool_element: pe,
                };
                self.claim(now, entry, owner, association, registration);
                return;
            }
            (None, _) if self.config.max_pool_elements_per_association > 0 => {
                let held = self.handlespace.registered_over_count(association);
                if held >= self.config.max_pool_elements_per_association {
                    self.metrics
                        .refused(SecurityRefusal::PoolElementsPerAssociation);
                    self.events.push_back(RegistrarEvent::SecurityRefused {
                        request: "registration",
                        pool_handle: pool_handle.clone(),
                        pe_id,
                        association,
                        peer: self.associations.get(&association).map(|a| a.peer.clone()),
                        owner: None,
                        reason: SecurityRefusal::PoolElementsPerAssociation,
                    });
                    self.reject_with(
                        association,
                        pool_handle,
                        pe_id,
                        ErrorCause::new(CauseCode::LackOfResources),
                        format!(
                            "{held} PEs registered over this association (max-pool-elements-per-association)"
                        ),
                    );
                    return;
                }
            }
            _ => {}
        }
        let adopting = self.taken_over_unadopted(&pool_handle, pe_id);
        match self
            .handlespace
            .register(&pool_handle, pe.clone(), Some(association), now)
        {
            Ok(outcome) => {
                if adopting {
                    self.metrics.adopted += 1;
                    self.events.push_back(RegistrarEvent::Adopted {
                        pool_handle: pool_handle.clone(),
                        pe_id,
                        association,
                    });
                }
                let entry = outcome.entry();
                let new = outcome.is_new();
                // The owner's re-registration answers any probe as well as a keep-alive ack.
                let waiting = self.security.answered(entry);
                self.refuse_claims(waiting);
                if new {
                    self.metrics.registrations += 1;
                } else {
                    self.metrics.reregistrations += 1;
                }
                // A new PE gets its first keep-alive one interval from now; a re-registration
                // keeps the keep-alive schedule, and counts as an answer to an outstanding
                // keep-alive. The timer also covers the (new) end of the registration life.
                let deadline = match self.handlespace.get(entry).and_then(|e| e.timer()) {
                    Some(t) if !new && t.kind == TimerKind::KeepAliveTransmission => t.deadline,
                    _ => now + self.keep_alive_interval(),
                };
                self.arm(entry, TimerKind::KeepAliveTransmission, deadline);
                self.send(
                    association,
                    &AsapMessage::RegistrationResponse(asap::RegistrationResponse {
                        reject: false,
                        pool_handle: pool_handle.clone(),
                        pe_id,
                        error: None,
                    }),
                );
                self.record_added(&pool_handle, &pe);
                self.events.push_back(RegistrarEvent::Registered {
                    pool_handle,
                    element: pe,
                    association,
                    new,
                    dropped_addresses: dropped,
                });
            }
            Err(e) => {
                let code = e.cause_code();
                let info = match code {
                    CauseCode::InconsistentPoolingPolicy => pe.policy.to_parameter().ok(),
                    CauseCode::InconsistentTransportType => match &pe.user_transport {
                        UserTransport::Address(t) => t.to_parameter().ok(),
                        UserTransport::Opaque(_) => None,
                    },
                    _ => None,
                };
                let cause = ErrorCause {
                    code,
                    info: info.unwrap_or_default(),
                };
                self.reject_with(association, pool_handle, pe_id, cause, e.to_string());
            }
        }
    }

    /// Checks that do not need the handlespace (policy, identifier, addresses), and drops
    /// user-transport addresses that are not the association's or are too narrow in scope, as
    /// RSPLIB does; returns the PE to store and the addresses dropped.
    #[allow(clippy::type_complexity)]
    fn check_registration(
        &self,
        mut pe: PoolElement,
        peer: &PeerInfo,
    ) -> Result<(PoolElement, Vec<IpAddr>), (ErrorCause, String)> {
        let invalid = |info: Vec<u8>, reason: String| {
            Err((
                ErrorCause::with_info(CauseCode::InvalidValues, info),
                reason,
            ))
        };
        if let PoolPolicy::Other { policy_type, .. } = pe.policy {
            return invalid(
                pe.policy.to_parameter().unwrap_or_default(),
                format!("unknown policy type {policy_type:#010x}"),
            );
        }
        if pe.id.0 == 0 {
            return invalid(Vec::new(), "PE identifier 0".into());
        }
        let mut dropped = Vec::new();
        if let UserTransport::Address(t) = &mut pe.user_transport {
            if t.protocol != TransportProtocol::Sctp && t.addresses.len() != 1 {
                return invalid(
                    t.to_parameter().unwrap_or_default(),
                    format!(
                        "{} transport with {} addresses (exactly one allowed)",
                        t.protocol.name(),
                        t.addresses.len()
                    ),
                );
            }
            let check_peer = self.config.check_user_transport_addresses
                && peer.kind != AssociationKind::TcpPlain;
            let min_scope = self.config.min_address_scope;
            let (keep, drop): (Vec<IpAddr>, Vec<IpAddr>) = t.addresses.iter().partition(|a| {
                AddressScope::of(a) >= min_scope && (!check_peer || peer.addresses.contains(a))
            });
            if keep.is_empty() {
                return invalid(
                    t.to_parameter().unwrap_or_default(),
                    format!(
                        "no usable user transport address: {}",
                        why_dropped(&drop, &peer.addresses, min_scope, check_peer)
                    ),
                );
            }
            t.addresses = keep;
            dropped = drop;
        }
        Ok((pe, dropped))
    }

    fn reject_with(
        &mut self,
        association: AssociationId,
        pool_handle: PoolHandle,
        pe_id: PoolElementId,
        cause: ErrorCause,
        reason: String,
    ) {
        self.metrics.reject(cause.code.to_u16());
        let code = cause.code;
        self.send(
            association,
            &AsapMessage::RegistrationResponse(asap::RegistrationResponse {
                reject: true,
                pool_handle: pool_handle.clone(),
                pe_id,
                error: Some(OperationError::from_cause(cause)),
            }),
        );
        self.events.push_back(RegistrarEvent::RegistrationRejected {
            pool_handle,
            pe_id,
            cause: code,
            reason,
        });
    }

    fn deregistration(&mut self, association: AssociationId, d: asap::Deregistration) {
        // RFC 5355 §3.3: the identity rule that covers registering into the pool covers
        // deregistering from it.
        let mut refused = self
            .access(association, Some(d.pool_handle.as_bytes()), |r, i| {
                r.may_register(i, d.pool_handle.as_bytes())
            })
            .is_err();
        // RFC 5355 §3.3/§3.4: only the association that registered a PE deregisters it. When
        // that association is gone (or was never ours: a PE homed at another registrar, or
        // taken over here and not yet adopted), only an association that reaches the PE's own
        // ASAP transport may: whoever else sends it is not the PE.
        let entry = self.handlespace.find(&d.pool_handle, d.pe_id);
        let owner = entry
            .and_then(|e| e.association())
            .filter(|o| *o != association && self.associations.contains_key(o));
        let orphan = entry.is_some_and(|e| {
            e.association()
                .is_none_or(|o| !self.associations.contains_key(&o))
        });
        let stranger = orphan
            && !entry.is_some_and(|e| {
                let reaches = self.associations.get(&association).is_some_and(|a| {
                    e.element()
                        .asap_transport
                        .as_ref()
                        .is_some_and(|t| t.addresses.iter().any(|x| a.peer.addresses.contains(x)))
                });
                e.home_registrar() == self.id && reaches
            });
        if !refused && stranger {
            self.refuse_foreign(
                "deregistration",
                &d.pool_handle,
                d.pe_id,
                association,
                None,
                SecurityRefusal::ForeignDeregistration,
            );
            refused = true;
        }
        if let (false, Some(owner)) = (refused, owner) {
            self.refuse_foreign(
                "deregistration",
                &d.pool_handle,
                d.pe_id,
                association,
                Some(owner),
                SecurityRefusal::ForeignDeregistration,
            );
            refused = true;
        }
        if refused {
            self.send(
                association,
                &AsapMessage::DeregistrationResponse(asap::DeregistrationResponse {
                    pool_handle: d.pool_handle,
                    pe_id: d.pe_id,
                    error: Some(OperationError::new(CauseCode::RejectedSecurity)),
                }),
            );
            return;
        }
        // A PE that is already gone is deregistered too (RFC 5352 §3.2; RSPLIB answers so).
        if let Some(entry) = self.handlespace.entry_id(&d.pool_handle, d.pe_id) {
            self.metrics.deregistrations += 1;
            self.remove(entry, RemovalCause::Deregistered);
        }
        self.send(
            association,
            &AsapMessage::DeregistrationResponse(asap::DeregistrationResponse {
                pool_handle: d.pool_handle,
                pe_id: d.pe_id,
                error: None,
            }),
        );
    }

    fn handle_resolution(
        &mut self,
        now: Duration,
        association: AssociationId,
        h: HandleResolutionRef<'_>,
    ) {
        if self.config.access.is_some()
            && self
                .access(association, Some(h.pool_handle), |r, i| r.may_resolve(i))
                .is_err()
        {
            self.refuse_resolution(association, h.pool_handle, CauseCode::RejectedSecurity);
            return;
        }
        let limited = self
            .associations
            .get_mut(&association)
            .and_then(|a| a.handle_resolutions.as_mut())
            .is_some_and(|b| !b.allow(now));
        if limited {
            self.rate_limited(association, RateLimited::HandleResolution);
            self.refuse_resolution(association, h.pool_handle, CauseCode::RejectedSecurity);
            return;
        }
        // One host's associations together (RFC 5355 §3.1: a flood over many associations).
        if self.config.handle_resolution_rate_per_address.is_some() {
            let address = self
                .associations
                .get(&association)
                .and_then(|a| a.peer.addresses.first().copied());
            if address.is_some_and(|a| !self.security.allow_resolution(a, now)) {
                self.rate_limited(association, RateLimited::HandleResolutionPerAddress);
                self.refuse_resolution(association, h.pool_handle, CauseCode::RejectedSecurity);
                return;
            }
        }
        // Items 0 or no option: the default; 0xffffffff: as many as allowed (RSPLIB's reading
        // of draft-dreibholz-rserpool-asap-hropt).
        let max = self.config.max_handle_resolution_items.max(1);
        let items = match h.option {
            Some(HandleResolutionOption { items: 0 }) | None => {
                self.config.default_handle_resolution_items
            }
            Some(HandleResolutionOption { items }) => items,
        }
        .clamp(1, max) as usize;
        // The selection buffer is reused unless the selection is handed on in a report.
        let mut selection = std::mem::take(&mut self.selection);
        let found = self
            .handlespace
            .select_into(h.pool_handle, items, &mut self.rng, &mut selection)
            .is_ok();
        if found {
            self.metrics.resolutions += 1;
            self.metrics.resolved_pool_elements += selection.elements.len() as u64;
            // Each PE is encoded once per registration, not once per answer.
            for s in &selection.elements {
                if let Some(pe) = self.handlespace.get(s.entry) {
                    let _ = self.encoded_pes.refresh(&self.codec, pe);
                }
            }
            let pool_elements = selection
                .elements
                .iter()
                .filter_map(|s| self.encoded_pes.get(s.entry));
            // The pool's policy, carried with the first selected PE's values as RSPLIB does.
            let overall_policy = selection.elements.first().map(|s| &s.policy);
            let codec = &self.codec;
            self.transmits
                .push(Destination::Association(association), |buf| {
                    codec.encode_handle_resolution_response(
                        h.pool_handle,
                        overall_policy,
                        pool_elements,
                        buf,
                    )
                });
        } else {
            self.metrics.resolutions_unknown_pool += 1;
            self.refuse_resolution(association, h.pool_handle, CauseCode::UnknownPoolHandle);
        }
        if self.config.report_resolutions {
            self.events.push_back(RegistrarEvent::HandleResolution {
                association,
                pool_handle: PoolHandle::from(h.pool_handle),
                selection: found.then_some(selection),
            });
        } else {
            self.selection = selection;
        }
    }

    /// A negative HANDLE_RESOLUTION_RESPONSE: no PEs, and why (RFC 5352 §2.2.6).
    fn refuse_resolution(
        &mut self,
        association: AssociationId,
        pool_handle: &[u8],
        cause: CauseCode,
    ) {
        self.send(
            association,
            &AsapMessage::HandleResolutionResponse(asap::HandleResolutionResponse {
                accepted: false,
                pool_handle: PoolHandle::from(pool_handle),
                overall_policy: None,
                pool_elements: Vec::new(),
                error: Some(OperationError::new(cause)),
            }),
        );
    }

    /// Sends a keep-alive to the PE and arms its timeout; `false` if the PE has no live
    /// association to send it over.
    fn send_keep_alive(&mut self, now: Duration, entry: EntryId) -> bool {
        let Some(pe) = self.handlespace.get(entry) else {
            return false;
        };
        let (pool_handle, pe_id, association) =
            (pe.pool_handle().clone(), pe.id(), pe.association());
        let Some(association) = association.filter(|a| self.associations.contains_key(a)) else {
            return false;
        };
        self.send(
            association,
            &AsapMessage::EndpointKeepAlive(asap::EndpointKeepAlive {
                home: false,
                server_id: self.id,
                pool_handle: pool_handle.clone(),
                pe_id: (self.config.profile == Profile::Rsplib).then_some(pe_id),
            }),
        );
        self.metrics.keep_alives_sent += 1;
        self.arm(
            entry,
            TimerKind::KeepAliveTimeout,
            now + self.config.keep_alive_timeout,
        );
        self.events
            .push_back(RegistrarEvent::KeepAliveSent { pool_handle, pe_id });
        true
    }

    fn keep_alive_ack(
        &mut self,
        now: Duration,
        association: AssociationId,
        a: asap::EndpointKeepAliveAck,
    ) {
        let Some(entry) = self.handlespace.entry_id(&a.pool_handle, a.pe_id) else {
            return;
        };
        let Some(pe) = self.handlespace.get(entry) else {
            return;
        };
        let (other, timer) = (pe.association() != Some(association), pe.timer());
        if other && !self.adopt_association(entry, association) {
            self.events.push_back(RegistrarEvent::Ignored {
                association,
                message: "ASAP_ENDPOINT_KEEP_ALIVE_ACK",
                reason: "the PE is registered over another association",
            });
            return;
        }
        if !matches!(timer, Some(t) if t.kind == TimerKind::KeepAliveTimeout) {
            return;
        }
        self.metrics.keep_alives_acked += 1;
        let d = now + self.keep_alive_interval();
        self.arm(entry, TimerKind::KeepAliveTransmission, d);
        // The owner answered: claims on its PE are refused (RFC 5355 §3.3).
        let waiting = self.security.answered(entry);
        self.refuse_claims(waiting);
        self.events.push_back(RegistrarEvent::KeepAliveAcked {
            pool_handle: a.pool_handle,
            pe_id: a.pe_id,
        });
    }

    fn endpoint_unreachable(
        &mut self,
        now: Duration,
        association: AssociationId,
        u: asap::EndpointUnreachable,
    ) {
        if self
            .access(association, Some(u.pool_handle.as_bytes()), |r, i| {
                r.may_resolve(i)
            })
            .is_err()
        {
            return;
        }
        let limited = self
            .associations
            .get_mut(&association)
            .and_then(|a| a.unreachable_reports.as_mut())
            .is_some_and(|b| !b.allow(now));
        if limited {
            self.rate_limited(association, RateLimited::EndpointUnreachable);
            return;
        }
        let Some(entry) = self.handlespace.entry_id(&u.pool_handle, u.pe_id) else {
            return;
        };
        let Ok(count) = self.handlespace.report_unreachable(entry) else {
            return;
        };
        self.metrics.unreachable_reports += 1;
        self.events.push_back(RegistrarEvent::UnreachableReported {
            pool_handle: u.pool_handle.clone(),
            pe_id: u.pe_id,
            count,
        });
        // RFC 5352 §3.5: probe the PE with a keep-alive; only a failed probe removes it
        // (RFC 5355 §3.12: reports alone must not remove a healthy PE). At most one probe at a
        // time, and a bounded number per interval (RFC 5355 §3.13), whatever the reports.
        if count >= self.config.max_bad_pe_reports.max(1) || self.config.probe_on_unreachable {
            if self.probe_outstanding(entry) {
                return;
            }
            if !self.security.take_report_probe(
                entry,
                now,
                self.config.max_unreachable_probes,
                self.config.unreachable_probe_interval,
            ) {
                self.metrics.unreachable_probes_suppressed += 1;
                self.events.push_back(RegistrarEvent::ProbeSuppressed {
                    pool_handle: u.pool_handle,
                    pe_id: u.pe_id,
                });
                return;
            }
            if self.send_keep_alive(now, entry) {
                self.metrics.unreachable_probes += 1;
                self.security.probing(entry, ProbeReason::Reports);
                self.events.push_back(RegistrarEvent::UnreachableProbe {
                    pool_handle: u.pool_handle,
                    pe_id: u.pe_id,
                    reports: count,
                });
            }
        }
    }

    /// Counts and reports a request refused by a per-client rate limit.
    fn rate_limited(&mut self, association: AssociationId, what: RateLimited) {
        self.metrics.rate_limited(what);
        let count = self.associations.get_mut(&association).map_or(1, |a| {
            a.rate_limited[what as usize] += 1;
            a.rate_limited[what as usize]
        });
        self.events.push_back(RegistrarEvent::RateLimited {
            association,
            what,
            count,
        });
    }

    /// Whether a keep-alive to the PE awaits its answer (periodic, or a probe).
    fn probe_outstanding(&self, entry: EntryId) -> bool {
        self.security.outstanding(entry).is_some()
            || matches!(
                self.handlespace.get(entry).and_then(|e| e.timer()),
                Some(t) if t.kind == TimerKind::KeepAliveTimeout
            )
    }

    /// Another association claims a live PE: the claim waits for the owner's answer to a
    /// keep-alive, sent now unless one is already outstanding (RFC 5355 §3.3; a PE that
    /// restarted gets back in within one keep-alive timeout).
    fn claim(
        &mut self,
        now: Duration,
        entry: EntryId,
        owner: AssociationId,
        claimant: AssociationId,
        registration: asap::Registration,
    ) {
        let (pool_handle, pe_id) = (
            registration.pool_handle.clone(),
            registration.pool_element.id,
        );
        let repeated = self.security.add_claim_if_room(
            entry,
            self.config.max_pending_claims.max(1),
            Claim {
                association: claimant,
                registration,
            },
        );
        let Some(_replaced) = repeated else {
            self.refuse_foreign(
                "registration",
                &pool_handle,
                pe_id,
                claimant,
                Some(owner),
                SecurityRefusal::PendingClaims,
            );
            self.reject_with(
                claimant,
                pool_handle,
                pe_id,
                ErrorCause::new(CauseCode::RejectedSecurity),
                format!(
                    "the PE is registered over another association and {} claims already wait for its probe",
                    self.config.max_pending_claims.max(1)
                ),
            );
            return;
        };
        let deadline = now
            + self
                .config
                .ownership_probe_timeout
                .min(self.config.keep_alive_timeout);
        if self.probe_outstanding(entry) {
            // The outstanding keep-alive decides, within the ownership probe's timeout.
            if let Some(t) = self.handlespace.get(entry).and_then(|e| e.timer()) {
                if t.kind == TimerKind::KeepAliveTimeout && t.deadline > deadline {
                    self.arm(entry, TimerKind::KeepAliveTimeout, deadline);
                }
            }
            return;
        }
        if self.send_keep_alive(now, entry) {
            self.arm(entry, TimerKind::KeepAliveTimeout, deadline);
            self.metrics.ownership_probes += 1;
            self.security.probing(entry, ProbeReason::Claim);
            self.events.push_back(RegistrarEvent::OwnershipProbe {
                pool_handle,
                pe_id,
                owner,
                claimant,
                peer: self.associations.get(&claimant).map(|a| a.peer.clone()),
            });
        }
    }

    /// Refuses claims whose PE's owner answered.
    fn refuse_claims(&mut self, claims: Vec<Claim>) {
        for c in claims {
            if !self.associations.contains_key(&c.association) {
                continue;
            }
            let (pool_handle, pe_id) = (c.registration.pool_handle, c.registration.pool_element.id);
            let owner = self
                .handlespace
                .find(&pool_handle, pe_id)
                .and_then(|e| e.association());
            self.refuse_foreign(
                "registration",
                &pool_handle,
                pe_id,
                c.association,
                owner,
                SecurityRefusal::ForeignRegistration,
            );
            self.reject_with(
                c.association,
                pool_handle,
                pe_id,
                ErrorCause::new(CauseCode::RejectedSecurity),
                "the PE is registered over another association, which answered the probe".into(),
            );
        }
    }

    /// Claims on PEs that left the handlespace in this step: the oldest one still connected is
    /// registered, the others refused (the PE now has an owner again).
    fn settle_claims(&mut self, now: Duration) {
        while !self.settled_claims.is_empty() {
            let claims = std::mem::take(&mut self.settled_claims);
            let mut granted: Vec<(PoolHandle, PoolElementId)> = Vec::new();
            for c in claims {
                if !self.associations.contains_key(&c.association) {
                    continue;
                }
                let key = (
                    c.registration.pool_handle.clone(),
                    c.registration.pool_element.id,
                );
                if granted.contains(&key) {
                    self.refuse_claims(vec![c]);
                    continue;
                }
                let association = c.association;
                self.register(now, association, c.registration);
                let owned = self
                    .handlespace
                    .find(&key.0, key.1)
                    .and_then(|e| e.association())
                    == Some(association);
                if owned {
                    self.metrics.claims_granted += 1;
                    self.events.push_back(RegistrarEvent::ClaimGranted {
                        pool_handle: key.0.clone(),
                        pe_id: key.1,
                        association,
                    });
                    granted.push(key);
                }
            }
        }
    }

    fn refuse_foreign(
        &mut self,
        request: &'static str,
        pool_handle: &PoolHandle,
        pe_id: PoolElementId,
        association: AssociationId,
        owner: Option<AssociationId>,
        reason: SecurityRefusal,
    ) {
        self.metrics.refused(reason);
        self.events.push_back(RegistrarEvent::SecurityRefused {
            request,
            pool_handle: pool_handle.clone(),
            pe_id,
            association,
            peer: self.associations.get(&association).map(|a| a.peer.clone()),
            owner,
            reason,
        });
    }

    fn expire(&mut self, entry: EntryId) {
        let Some(pe) = self.handlespace.get(entry) else {
            return;
        };
        let (pool_handle, pe_id, association) =
            (pe.pool_handle().clone(), pe.id(), pe.association());
        self.remove(entry, RemovalCause::LifeExpired);
        // The PE learns that its registration is gone (RFC 5352 §2.2.4). Not in the rsplib
        // profile: RSPLIB's PEs take an unsolicited response as a protocol error.
        if self.config.profile == Profile::Rsplib {
            return;
        }
        if let Some(a) = association.filter(|a| self.associations.contains_key(a)) {
            self.send(
                a,
                &AsapMessage::DeregistrationResponse(asap::DeregistrationResponse {
                    pool_handle,
                    pe_id,
                    error: None,
                }),
            );
        }
    }

    fn remove(&mut self, entry: EntryId, cause: RemovalCause) {
        if let Ok((pool_handle, removed)) = self.handlespace.remove(entry) {
            self.removed(pool_handle, removed, cause);
        }
        self.update_gauges();
    }

    fn removed(&mut self, pool_handle: PoolHandle, removed: RemovedElement, cause: RemovalCause) {
        self.encoded_pes.forget(removed.entry);
        // Claims on the PE are settled when this step ends: its owner is gone.
        let claims = self.security.removed(removed.entry);
        self.settled_claims.extend(claims);
        self.record_removed(&pool_handle, &removed);
        self.metrics.removal(cause);
        self.events.push_back(RegistrarEvent::Removed {
            pool_handle,
            pe_id: removed.element.id,
            cause,
        });
    }
}

/// Why addresses were not accepted, for the log and the operator: the scope (with the setting
/// that changes it) or the association (RFC 5352 §2.2.1), address by address.
fn why_dropped(
    dropped: &[IpAddr],
    association: &[IpAddr],
    min_scope: AddressScope,
    check_peer: bool,
) -> String {
    let mut narrow = Vec::new();
    let mut foreign = Vec::new();
    for a in dropped {
        if AddressScope::of(a) < min_scope {
            narrow.push(*a);
        } else if check_peer && !association.contains(a) {
            foreign.push(a.to_string());
        }
    }
    let mut parts = Vec::new();
    if !narrow.is_empty() {
        let needed = narrow
            .iter()
            .map(AddressScope::of)
            .min()
            .unwrap_or(AddressScope::Unspecified);
        let narrow: Vec<String> = narrow.iter().map(|a| a.to_string()).collect();
        parts.push(format!(
            "{} narrower than the minimum address scope {} (min-address-scope = {} accepts {})",
            narrow.join(", "),
            min_scope.name(),
            needed.name(),
            if narrow.len() == 1 { "it" } else { "them" }
        ));
    }
    if !foreign.is_empty() {
        let assoc: Vec<String> = association.iter().map(|a| a.to_string()).collect();
        parts.push(format!(
            "{} not among the association's addresses ({})",
            foreign.join(", "),
            assoc.join(", ")
        ));
    }
    parts.join("; ")
}
