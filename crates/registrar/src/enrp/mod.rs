//! ENRP (RFC 5353): registrars that share one handlespace and take over a dead peer's PEs, as a
//! sans-IO core beside the ASAP core. Events and the current time go in, ENRP transmissions,
//! a timer deadline and reports come out; the handlespace is the [`Registrar`]'s, reached
//! through its ENRP hooks.
//!
//! Drive it with [`Enrp::message`], [`Enrp::association_down`], [`Enrp::handle_timeout`] and,
//! after every ASAP step, [`Enrp::after_asap`] (which turns the registrar's changes to its own
//! PEs into HANDLE_UPDATEs); then drain [`Enrp::poll_transmit`], [`Enrp::poll_event`] and arm a
//! timer for [`Enrp::poll_timeout`]. The registrar's own queue carries the H=1 keep-alives of a
//! takeover.
//!
//! Modules: [`config`] (settings per profile), `peers` (the peer table), `presence`
//! (heartbeats, dead-peer detection), `sync` (handle table requests and responses, chunked with
//! a cursor per peer; the audit), `update` (HANDLE_UPDATE both ways), `takeover` (RFC 5353
//! §3.5 arbitration), [`metrics`].

pub mod config;
#[cfg(feature = "runtime")]
pub mod io;
pub mod metrics;
mod peers;
mod presence;
mod sync;
mod takeover;
mod update;

use crate::core::Registrar;
pub use config::{Arbitration, EnrpConfig};
pub use metrics::{EnrpMetrics, PeerStatus, TakeoverOutcome};
use peers::Peers;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rserpool_handlespace::AssociationId;
use rserpool_wire::enrp::{self, EnrpMessage, Peers as Ids};
use rserpool_wire::{
    Codec, DecodeError, ErrorCause, OperationError, PoolElementId, PoolHandle, RegistrarId,
    ServerInformation, TransportAddress,
};
use std::collections::{BTreeMap, VecDeque};
use std::net::SocketAddr;
use std::time::Duration;
use takeover::Takeover;

/// Where an ENRP message came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Source {
    /// Over an association of the ENRP endpoint (ids of that endpoint, not the ASAP one's).
    Association(AssociationId),
    /// From the ENRP multicast group (only PRESENCE is taken from there).
    Multicast,
}

/// Where an ENRP message goes.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum EnrpDestination {
    /// Over an existing association (an answer goes back the way the request came).
    Association(AssociationId),
    /// To a peer's ENRP addresses: over the driver's association to them, opened if needed.
    Addresses(Vec<SocketAddr>),
    /// To the ENRP multicast group.
    Multicast,
}

/// An ENRP message to send (PPID 12).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnrpTransmit {
    /// Where to.
    pub destination: EnrpDestination,
    /// The message, kept for tests and logs.
    pub kind: enrp::EnrpMessageType,
    /// The encoded message.
    pub bytes: Vec<u8>,
}

/// What happened, for logs and tests. [`EnrpMetrics`] counts the same facts.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum EnrpEvent {
    /// A peer was heard of for the first time.
    PeerUp {
        /// Its ID.
        peer: RegistrarId,
        /// Its ENRP addresses.
        addresses: Vec<SocketAddr>,
    },
    /// A peer left the table.
    PeerDown {
        /// Its ID.
        peer: RegistrarId,
        /// Why.
        reason: &'static str,
    },
    /// A peer was silent for MAX-TIME-LAST-HEARD and got a PRESENCE with R=1.
    PeerSilent {
        /// Its ID.
        peer: RegistrarId,
    },
    /// The start-up phase ended.
    StartupDone {
        /// The mentor whose table we took, if one answered in time.
        mentor: Option<RegistrarId>,
    },
    /// A handle table download started.
    SyncStarted {
        /// From whom.
        peer: RegistrarId,
        /// W flag (audit) or full table (mentor).
        own_children_only: bool,
        /// Why: "mentor" or "checksum mismatch".
        reason: &'static str,
    },
    /// A handle table download ended.
    SyncDone {
        /// From whom.
        peer: RegistrarId,
        /// PEs received.
        received: usize,
        /// PEs of that peer dropped because the table did not confirm them.
        dropped: usize,
        /// Whether the peer refused (R flag).
        rejected: bool,
    },
    /// An update or table entry was refused.
    UpdateRefused {
        /// From whom.
        peer: RegistrarId,
        /// Pool.
        pool_handle: PoolHandle,
        /// PE.
        pe_id: PoolElementId,
        /// Why.
        reason: String,
    },
    /// A limit was hit (peers, PEs per peer).
    LimitReached {
        /// Which limit.
        what: &'static str,
        /// The peer concerned.
        peer: RegistrarId,
    },
    /// This registrar started to take a dead peer over.
    TakeoverStarted {
        /// The dead peer.
        target: RegistrarId,
        /// The peers whose acknowledgements it waits for.
        awaiting: Vec<RegistrarId>,
    },
    /// This registrar took a dead peer's PEs over.
    TakeoverWon {
        /// The dead peer.
        target: RegistrarId,
        /// PEs taken over (each sent an H=1 keep-alive).
        pool_elements: usize,
    },
    /// Another registrar won (arbitration or its TAKEOVER_SERVER).
    TakeoverLost {
        /// The dead peer.
        target: RegistrarId,
        /// The winner, if known.
        winner: Option<RegistrarId>,
    },
    /// The takeover expired without every acknowledgement.
    TakeoverAbandoned {
        /// The dead peer.
        target: RegistrarId,
        /// The peers that did not acknowledge.
        missing: Vec<RegistrarId>,
    },
    /// The target of a takeover showed it is alive.
    TakeoverRefuted {
        /// The peer.
        target: RegistrarId,
    },
    /// Another registrar took a dead peer over (TAKEOVER_SERVER received).
    TakenOver {
        /// The dead peer.
        target: RegistrarId,
        /// Who took it.
        by: RegistrarId,
        /// PEs moved to it.
        pool_elements: usize,
    },
    /// A peer announced a takeover of this registrar: refuted with PRESENCE.
    TakeoverOfUsRefuted {
        /// Who tried.
        by: RegistrarId,
    },
    /// A message could not be decoded.
    Malformed {
        /// Where from.
        source: Source,
        /// What was wrong.
        error: DecodeError,
        /// Whether an ENRP_ERROR was sent back.
        answered: bool,
    },
    /// A well-formed message was ignored.
    Ignored {
        /// Where from.
        source: Source,
        /// Which message.
        message: &'static str,
        /// Why.
        reason: &'static str,
    },
    /// A peer sent an ENRP_ERROR.
    ErrorReceived {
        /// From whom.
        peer: RegistrarId,
        /// What it said.
        error: OperationError,
    },
}

/// A static peer from the configuration, until it is heard from.
#[derive(Debug, Clone)]
struct StaticPeer {
    addresses: Vec<SocketAddr>,
    id: Option<RegistrarId>,
}

/// The ENRP core of one registrar.
pub struct Enrp {
    config: EnrpConfig,
    id: RegistrarId,
    codec: Codec,
    rng: StdRng,
    /// Our Server Information (the driver sets the transport once bound).
    local: Option<TransportAddress>,
    peers: Peers,
    statics: Vec<StaticPeer>,
    takeovers: BTreeMap<RegistrarId, Takeover>,
    /// Until when the start-up phase lasts (mentor discovery), while it does.
    startup_until: Option<Duration>,
    mentor: Option<RegistrarId>,
    next_presence: Duration,
    transmits: VecDeque<EnrpTransmit>,
    events: VecDeque<EnrpEvent>,
    metrics: EnrpMetrics,
    scratch: Vec<u8>,
}

impl Enrp {
    /// An ENRP core for `registrar`, started at `now`. Turns on the registrar's record of
    /// changes to its own PEs. Static peers get a PRESENCE with R=1 at once; the registrar
    /// sends its periodic PRESENCE only after the mentor discovery (RFC 5353 §3.2, as RSPLIB).
    pub fn new(config: EnrpConfig, registrar: &mut Registrar, now: Duration) -> Self {
        registrar.enable_handle_updates();
        let rng = match config.seed {
            Some(seed) => StdRng::seed_from_u64(seed ^ 0x454e_5250),
            None => StdRng::from_os_rng(),
        };
        let statics = config
            .static_peers
            .iter()
            .map(|a| StaticPeer {
                addresses: a.clone(),
                id: None,
            })
            .collect();
        let mut e = Enrp {
            id: registrar.id(),
            codec: Codec::new(registrar.config().codec),
            rng,
            local: None,
            peers: Peers::default(),
            statics,
            takeovers: BTreeMap::new(),
            startup_until: Some(now + config.mentor_discovery_timeout),
            mentor: None,
            next_presence: now + config.mentor_discovery_timeout,
            transmits: VecDeque::new(),
            events: VecDeque::new(),
            metrics: EnrpMetrics::default(),
            scratch: Vec::new(),
            config,
        };
        e.metrics.starting_up = true;
        e
    }

    /// This registrar's ID.
    pub fn id(&self) -> RegistrarId {
        self.id
    }

    /// The settings.
    pub fn config(&self) -> &EnrpConfig {
        &self.config
    }

    /// Where peers reach this registrar's ENRP endpoint (its Server Information). Until set,
    /// PRESENCE goes without Server Information. Sends the first PRESENCE (R=1) to the static
    /// peers.
    pub fn set_local_transport(&mut self, registrar: &Registrar, transport: TransportAddress) {
        self.local = Some(transport);
        let statics: Vec<Vec<SocketAddr>> =
            self.statics.iter().map(|s| s.addresses.clone()).collect();
        for addresses in statics {
            self.send_presence_to(
                registrar,
                EnrpDestination::Addresses(addresses),
                RegistrarId(0),
                true,
            );
        }
    }

    /// The counters, with the peer status refreshed from `registrar`.
    pub fn metrics(&mut self, registrar: &Registrar) -> &EnrpMetrics {
        let hs = registrar.handlespace();
        self.metrics.peers = self.peers.len() as u64;
        self.metrics.starting_up = self.startup_until.is_some();
        self.metrics.pool_elements_by_home = hs
            .owners()
            .map(|o| (o.owner, o.elements as u64, o.checksum))
            .collect();
        self.metrics.peer_status = self
            .peers
            .by_id
            .iter()
            .map(|(&id, p)| {
                let held = hs.checksum(id);
                PeerStatus {
                    id,
                    announced_checksum: p.announced_checksum,
                    held_checksum: held,
                    pool_elements: hs.owned_count(id) as u64,
                    sync: if p.download.is_some() {
                        "synchronising"
                    } else if held == p.announced_checksum {
                        "in sync"
                    } else {
                        "differs"
                    },
                }
            })
            .collect();
        &self.metrics
    }

    /// The IDs of the peers known now.
    pub fn peer_ids(&self) -> Vec<RegistrarId> {
        self.peers.by_id.keys().copied().collect()
    }

    /// Whether the start-up phase (mentor discovery) is over.
    pub fn started(&self) -> bool {
        self.startup_until.is_none()
    }

    /// The next message to send.
    pub fn poll_transmit(&mut self) -> Option<EnrpTransmit> {
        self.transmits.pop_front()
    }

    /// The next report.
    pub fn poll_event(&mut self) -> Option<EnrpEvent> {
        self.events.pop_front()
    }

    /// When [`Enrp::handle_timeout`] must be called next.
    pub fn poll_timeout(&self) -> Option<Duration> {
        [
            Some(self.next_presence),
            self.startup_until,
            self.peers.next_deadline(),
            self.takeovers.values().map(|t| t.expires).min(),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// An association of the ENRP endpoint went down: peers are reached by address again.
    ///
    /// A peer that spoke over it and has nothing in the handlespace is forgotten at once
    /// instead of after MAX-TIME-LAST-HEARD + MAX-TIME-NO-RESPONSE: a visitor such as
    /// `rserpool dump` or RSPLIB's `hsdump`, which joins only to read the table. RFC 5353 ties a
    /// peer's entry to no association; it detects failure by those timers (§3.5) so that a
    /// dead peer's PEs can be taken over (§3.5), and a peer that owns none has nothing to take
    /// over. One that is alive after all is a peer again at its next PRESENCE (§3.2). Kept:
    /// static peers, peers whose PEs (or an announced checksum other than the empty one) we
    /// hold, peers being taken over. Without this, every takeover would wait for the visitor's
    /// acknowledgement until its entry expired.
    pub fn association_down(
        &mut self,
        now: Duration,
        registrar: &mut Registrar,
        association: AssociationId,
    ) {
        let hs = registrar.handlespace();
        let visitors: Vec<RegistrarId> = self
            .peers
            .by_id
            .iter()
            .filter(|(id, p)| {
                p.association == Some(association)
                    && hs.owned_count(**id) == 0
                    && p.announced_checksum == hs.checksum(**id)
                    && p.takeover_by.is_none()
                    && !self.takeovers.contains_key(*id)
                    && !self.statics.iter().any(|s| s.id == Some(**id))
            })
            .map(|(id, _)| *id)
            .collect();
        self.peers.association_down(association);
        for peer in visitors {
            self.metrics.peers_departed += 1;
            self.remove_peer(now, registrar, peer, "association closed; it owns no PEs");
        }
        registrar.set_enrp_peer_count(self.peers.len());
    }

    /// After every ASAP step: the registrar's changes to its own PEs go to every peer as
    /// HANDLE_UPDATEs (RFC 5353 §3.3.1).
    pub fn after_asap(&mut self, registrar: &mut Registrar) {
        while let Some(change) = registrar.poll_own_change() {
            self.send_own_change(change);
        }
    }

    /// Runs what is due at `now`: PRESENCE, the end of start-up, peer timers, takeover expiry.
    pub fn handle_timeout(&mut self, now: Duration, registrar: &mut Registrar) {
        if self.startup_until.is_some_and(|t| t <= now) {
            self.end_startup(None);
        }
        if self.next_presence <= now {
            self.send_presence_to_all(registrar, false);
            let j = self.config.peer_heartbeat_jitter.clamp(0.0, 0.99);
            let factor = if j > 0.0 {
                1.0 + self.rng.random_range(-j..=j)
            } else {
                1.0
            };
            self.next_presence = now + self.config.peer_heartbeat_cycle.mul_f64(factor);
        }
        while let Some((peer, timer)) = self.peers.due(now) {
            self.peer_timer(now, registrar, peer, timer);
        }
        let expired: Vec<RegistrarId> = self
            .takeovers
            .iter()
            .filter(|(_, t)| t.expires <= now)
            .map(|(id, _)| *id)
            .collect();
        for target in expired {
            self.takeover_expired(now, registrar, target);
        }
        registrar.set_enrp_peer_count(self.peers.len());
        self.after_asap(registrar);
    }

    /// An ENRP message arrived.
    pub fn message(
        &mut self,
        now: Duration,
        registrar: &mut Registrar,
        source: Source,
        bytes: &[u8],
    ) {
        let decoded = match self.codec.decode::<EnrpMessage>(bytes) {
            Ok(d) => d,
            Err(error) => {
                self.metrics.malformed += 1;
                // RFC 5353 §2.2.10: the ENRP_ERROR goes back the way the message came.
                let answered = match (error.answer_cause(bytes), source) {
                    (Some(cause), Source::Association(a)) => {
                        self.send_error(EnrpDestination::Association(a), RegistrarId(0), cause);
                        true
                    }
                    _ => false,
                };
                self.events.push_back(EnrpEvent::Malformed {
                    source,
                    error,
                    answered,
                });
                return;
            }
        };
        let message = decoded.message;
        let kind = message.kind();
        let sender = message.peers().sender;
        if sender == self.id {
            // Our own PRESENCE looped back by multicast (RSPLIB drops "own messages" too).
            return;
        }
        self.metrics.received(kind);
        if let Source::Association(a) = source {
            for u in decoded.unrecognized.iter().filter(|u| u.report) {
                self.send_error(
                    EnrpDestination::Association(a),
                    sender,
                    ErrorCause::with_info(
                        rserpool_wire::CauseCode::UnrecognizedParameter,
                        u.bytes.clone(),
                    ),
                );
            }
        }
        if sender.0 == 0 {
            return self.ignore(source, kind.name(), "sender ID 0");
        }
        if source == Source::Multicast && !matches!(message, EnrpMessage::Presence(_)) {
            // RSPLIB takes only PRESENCE from the multicast socket.
            return self.ignore(
                source,
                kind.name(),
                "only ENRP_PRESENCE is taken by multicast",
            );
        }
        // The association the peer last spoke over carries our answers.
        if let (Source::Association(a), Some(p)) = (source, self.peers.get_mut(sender)) {
            p.association = Some(a);
        }
        match message {
            EnrpMessage::Presence(p) => self.presence(now, registrar, source, p),
            EnrpMessage::HandleTableRequest(r) => self.handle_table_request(registrar, source, r),
            EnrpMessage::HandleTableResponse(r) => {
                self.handle_table_response(now, registrar, source, r)
            }
            EnrpMessage::HandleUpdate(u) => self.handle_update(now, registrar, source, u),
            EnrpMessage::ListRequest(r) => self.list_request(source, r),
            EnrpMessage::ListResponse(r) => self.list_response(now, registrar, r),
            EnrpMessage::InitTakeover(t) => self.init_takeover(now, registrar, source, t),
            EnrpMessage::InitTakeoverAck(t) => self.init_takeover_ack(now, registrar, source, t),
            EnrpMessage::TakeoverServer(t) => self.takeover_server(now, registrar, source, t),
            EnrpMessage::Error(e) => {
                self.events.push_back(EnrpEvent::ErrorReceived {
                    peer: e.peers.sender,
                    error: e.error,
                });
            }
        }
        registrar.set_enrp_peer_count(self.peers.len());
        self.after_asap(registrar);
    }

    fn ignore(&mut self, source: Source, message: &'static str, reason: &'static str) {
        self.metrics.ignored += 1;
        self.events.push_back(EnrpEvent::Ignored {
            source,
            message,
            reason,
        });
    }

    /// Our Server Information, if the transport is known.
    fn server_information(&self) -> Option<ServerInformation> {
        self.local.clone().map(|transport| ServerInformation {
            server_id: self.id,
            transport,
        })
    }

    /// Where a peer is reached: the association it last spoke over, else its addresses.
    fn destination_of(&self, peer: RegistrarId) -> Option<EnrpDestination> {
        let p = self.peers.by_id.get(&peer)?;
        match p.association {
            Some(a) => Some(EnrpDestination::Association(a)),
            None if !p.addresses.is_empty() => {
                Some(EnrpDestination::Addresses(p.addresses.clone()))
            }
            None => None,
        }
    }

    /// Where an answer goes: back over the association the request came on, else to the peer.
    fn reply_destination(&self, source: Source, peer: RegistrarId) -> Option<EnrpDestination> {
        match source {
            Source::Association(a) => Some(EnrpDestination::Association(a)),
            Source::Multicast => self.destination_of(peer),
        }
    }

    fn send(&mut self, destination: EnrpDestination, m: &EnrpMessage) {
        self.scratch.clear();
        if self.codec.encode_into(m, &mut self.scratch).is_err() {
            return;
        }
        self.metrics.sent(m.kind());
        self.transmits.push_back(EnrpTransmit {
            destination,
            kind: m.kind(),
            bytes: self.scratch.clone(),
        });
    }

    fn send_to_peer(&mut self, peer: RegistrarId, m: &EnrpMessage) {
        if let Some(d) = self.destination_of(peer) {
            self.send(d, m);
        }
    }

    fn send_error(&mut self, destination: EnrpDestination, to: RegistrarId, cause: ErrorCause) {
        self.metrics.errors_sent += 1;
        let m = EnrpMessage::Error(enrp::EnrpError {
            peers: self.ids(to),
            error: OperationError::from_cause(cause),
        });
        self.send(destination, &m);
    }

    fn ids(&self, receiver: RegistrarId) -> Ids {
        Ids {
            sender: self.id,
            receiver,
        }
    }

    fn end_startup(&mut self, mentor: Option<RegistrarId>) {
        if self.startup_until.take().is_some() {
            self.metrics.starting_up = false;
            self.events.push_back(EnrpEvent::StartupDone { mentor });
        }
    }

    /// Removes a peer from the table (and from every takeover waiting for it).
    fn remove_peer(
        &mut self,
        now: Duration,
        registrar: &mut Registrar,
        peer: RegistrarId,
        reason: &'static str,
    ) {
        if self.peers.by_id.remove(&peer).is_none() {
            return;
        }
        if let Some(s) = self.statics.iter_mut().find(|s| s.id == Some(peer)) {
            s.id = None;
        }
        if self.mentor == Some(peer) {
            self.mentor = None;
        }
        self.events.push_back(EnrpEvent::PeerDown { peer, reason });
        // A takeover that waited for this peer's acknowledgement need not wait any longer.
        let waiting: Vec<RegistrarId> = self
            .takeovers
            .iter_mut()
            .filter_map(|(target, t)| {
                (t.awaiting.remove(&peer) && t.awaiting.is_empty()).then_some(*target)
            })
            .collect();
        for target in waiting {
            self.finish_takeover(now, registrar, target);
        }
    }
}
