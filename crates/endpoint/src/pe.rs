//! The pool element side of ASAP (RFC 5352 §3.1–§3.4, §3.6): find a registrar (server hunt
//! over a static list and multicast announces), register with retries, re-register before the
//! registration life runs out and whenever the policy values change, answer keep-alives, accept
//! a new home registrar (keep-alive with the H flag), deregister.
//!
//! The core decides which registrar to contact and when ([`PoolElementCore::poll_connect`]);
//! the driver only opens the association and reports the outcome.

use rand::Rng;
use rserpool_wire::asap::{self, AsapMessage};
use rserpool_wire::{
    CauseCode, Codec, CodecConfig, Message, OperationError, PoolElement, PoolElementId, PoolHandle,
    PoolPolicy, RegistrarId, RegistrationLife, UserTransport,
};
use std::collections::VecDeque;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

/// The registrar port of RFC 5352 (SCTP and TCP).
pub const ASAP_PORT: u16 = 3863;

/// Settings of a pool element.
#[derive(Debug, Clone)]
pub struct PoolElementConfig {
    /// The pool to join.
    pub pool_handle: PoolHandle,
    /// The PE identifier; `None` picks a random one (1..0xfffffffe, as RSPLIB does).
    pub pe_id: Option<PoolElementId>,
    /// How pool users reach this PE.
    pub user_transport: UserTransport,
    /// The pool's policy and this PE's values for it.
    pub policy: PoolPolicy,
    /// Re-registration interval (T4; RSPLIB: 30 s).
    pub reregistration_interval: Duration,
    /// Registration life announced to the registrar (RSPLIB: 3 × the re-registration interval).
    pub registration_life: RegistrationLife,
    /// How long to wait for a REGISTRATION_RESPONSE before giving up on the registrar (T2;
    /// RSPLIB: 3 s).
    pub response_timeout: Duration,
    /// Codec settings (registration life unit!).
    pub codec: CodecConfig,
    /// Registrars to hunt among, in order (each may have several addresses of one multi-homed
    /// registrar). Registrars heard in announces ([`PoolElementCore::announce`]) come first.
    pub registrars: Vec<Vec<SocketAddr>>,
    /// REGISTRATIONs sent to one registrar without an answer before hunting for another
    /// (MAX-REG-ATTEMPT, RFC 5352 §5.2: 2).
    pub max_registration_attempts: u32,
    /// Pause after a round over every known registrar failed (T5, RFC 5352 §5.1); doubled
    /// after each failed round up to [`PoolElementConfig::hunt_interval_max`].
    pub hunt_interval: Duration,
    /// Longest pause between two hunt rounds (RETRAN-MAX: 60 s).
    pub hunt_interval_max: Duration,
    /// How long a registrar heard in an announce stays a candidate (T7: 5 s).
    pub announce_validity: Duration,
    /// The transport the driver reaches registrars with: only announced addresses of this
    /// protocol are used (an announce without transport means SCTP on port 3863).
    pub registrar_protocol: rserpool_wire::TransportProtocol,
}

impl PoolElementConfig {
    /// RSPLIB's defaults for the given pool, transport and policy.
    pub fn new(pool_handle: PoolHandle, user_transport: UserTransport, policy: PoolPolicy) -> Self {
        PoolElementConfig {
            pool_handle,
            pe_id: None,
            user_transport,
            policy,
            reregistration_interval: Duration::from_secs(30),
            registration_life: RegistrationLife::Finite(Duration::from_secs(90)),
            response_timeout: Duration::from_secs(3),
            codec: CodecConfig::default(),
            registrars: Vec::new(),
            max_registration_attempts: 2,
            hunt_interval: Duration::from_secs(1),
            hunt_interval_max: Duration::from_secs(60),
            announce_validity: Duration::from_secs(5),
            registrar_protocol: rserpool_wire::TransportProtocol::Sctp,
        }
    }
}

/// What happened to the pool element.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PeEvent {
    /// The registrar accepted the (re-)registration.
    Registered {
        /// Whether this was the first registration since (re)connecting.
        first: bool,
    },
    /// The registrar refused the registration.
    Rejected {
        /// The cause it gave.
        cause: Option<CauseCode>,
    },
    /// A keep-alive arrived and was answered.
    KeepAlive {
        /// The registrar that sent it.
        registrar: RegistrarId,
        /// H flag: it asks to become the home registrar.
        home: bool,
    },
    /// The deregistration was confirmed.
    Deregistered,
    /// The registrar did not confirm the deregistration within the response timeout: the PE
    /// is done anyway (the registrar drops the registration when its life runs out or the
    /// association closes).
    DeregistrationTimedOut,
    /// The registrar did not answer in time: the driver drops the association; the core hunts
    /// for another registrar (RFC 5352 §3.6, [`PoolElementCore::poll_connect`]).
    RegistrarLost,
    /// A registrar took this PE over (a keep-alive with the H flag on another association,
    /// RFC 5352 §3.4, RFC 5353 §3.9): it is the home now; the driver makes `association` the
    /// registrar association and closes the old one.
    NewHome {
        /// The new home registrar.
        registrar: RegistrarId,
        /// The driver's number of the association it came on.
        association: u64,
    },
    /// A round over every known registrar failed; the next starts after this pause (T5).
    HuntFailed {
        /// The pause.
        retry_in: Duration,
    },
    /// The registrar sent an ASAP_ERROR or something a PE does not expect.
    ProtocolError(String),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// No association to a registrar.
    Disconnected,
    /// Looking for a registrar: connect at `next_try` (`None`: a connection attempt is under
    /// way).
    Hunting { next_try: Option<Duration> },
    /// REGISTRATION sent, no answer yet.
    Registering {
        deadline: Duration,
        first: bool,
        attempts: u32,
    },
    /// Registered; re-register at `next`.
    Registered { next: Duration },
    /// DEREGISTRATION sent.
    Deregistering { deadline: Duration },
    /// Deregistered (or deregistration timed out): nothing more to do.
    Done,
}

/// The pool element core.
pub struct PoolElementCore {
    config: PoolElementConfig,
    id: PoolElementId,
    codec: Codec,
    state: State,
    home: Option<RegistrarId>,
    transmits: VecDeque<Vec<u8>>,
    events: VecDeque<PeEvent>,
    connects: VecDeque<Vec<SocketAddr>>,
    announced: Vec<(RegistrarId, Vec<SocketAddr>, Duration)>,
    hunt_cursor: usize,
    hunt_round: usize,
    hunt_pause: Duration,
    policy_changed: bool,
}

impl PoolElementCore {
    /// A pool element; it registers once [`PoolElementCore::connected`] is called.
    pub fn new(config: PoolElementConfig, rng: &mut impl Rng) -> Self {
        let id = config
            .pe_id
            .unwrap_or_else(|| PoolElementId(rng.random_range(1..=0xffff_fffe)));
        PoolElementCore {
            codec: Codec::new(config.codec),
            config,
            id,
            state: State::Disconnected,
            home: None,
            transmits: VecDeque::new(),
            events: VecDeque::new(),
            connects: VecDeque::new(),
            announced: Vec::new(),
            hunt_cursor: 0,
            hunt_round: 0,
            hunt_pause: Duration::ZERO,
            policy_changed: false,
        }
    }

    /// Starts the server hunt (RFC 5352 §3.6): the core asks for a registrar association
    /// through [`PoolElementCore::poll_connect`].
    pub fn start(&mut self, now: Duration) {
        if matches!(self.state, State::Disconnected) {
            self.hunt_pause = self.config.hunt_interval;
            self.state = State::Hunting {
                next_try: Some(now),
            };
            self.handle_timeout(now);
        }
    }

    /// Registrar addresses to connect to (then call [`PoolElementCore::connected`] or
    /// [`PoolElementCore::connect_failed`]).
    pub fn poll_connect(&mut self) -> Option<Vec<SocketAddr>> {
        self.connects.pop_front()
    }

    /// The registrar association asked for could not be established: try the next registrar.
    pub fn connect_failed(&mut self, now: Duration) {
        if matches!(self.state, State::Hunting { next_try: None }) {
            self.hunt_round += 1;
            self.next_candidate(now);
        }
    }

    /// A datagram from the ASAP announce group: an ASAP_SERVER_ANNOUNCE makes its registrar a
    /// candidate for [`PoolElementConfig::announce_validity`] (RFC 5352 §3.6). Anything else is
    /// ignored (and reported).
    pub fn announce(&mut self, now: Duration, source: SocketAddr, bytes: &[u8]) {
        let m = match self.codec.decode::<AsapMessage>(bytes) {
            Ok(d) => d.message,
            Err(e) => {
                self.events.push_back(PeEvent::ProtocolError(format!(
                    "announce from {source}: {e}"
                )));
                return;
            }
        };
        let AsapMessage::ServerAnnounce(a) = m else {
            return;
        };
        let mut addrs: Vec<SocketAddr> = a
            .transports
            .iter()
            .filter(|t| t.protocol == self.config.registrar_protocol)
            .flat_map(|t| {
                t.addresses
                    .iter()
                    .map(move |ip| SocketAddr::new(*ip, t.port))
            })
            .collect();
        if a.transports.is_empty()
            && self.config.registrar_protocol == rserpool_wire::TransportProtocol::Sctp
        {
            addrs.push(SocketAddr::new(source.ip(), ASAP_PORT));
        }
        // Only addresses that could be reached: not the unspecified ones.
        addrs.retain(|s| !s.ip().is_unspecified() && s.ip() != IpAddr::from([255, 255, 255, 255]));
        if addrs.is_empty() {
            return;
        }
        let expires = now + self.config.announce_validity;
        self.announced.retain(|(id, _, _)| *id != a.server_id);
        self.announced.insert(0, (a.server_id, addrs, expires));
        // Bounded: an attacker on the link can announce many identifiers.
        self.announced.truncate(16);
        if matches!(self.state, State::Hunting { next_try: Some(_) }) {
            // A registrar just announced itself: try it now.
            self.state = State::Hunting {
                next_try: Some(now),
            };
            self.handle_timeout(now);
        }
    }

    /// A message on an association other than the registrar association (a registrar that
    /// connected to this PE). Only a keep-alive with the H flag for this PE is accepted: that
    /// registrar becomes the home (RFC 5352 §3.4; RSPLIB ignores one without H).
    pub fn message_on_other(&mut self, now: Duration, association: u64, bytes: &[u8]) {
        let Ok(d) = self.codec.decode::<AsapMessage>(bytes) else {
            self.events.push_back(PeEvent::ProtocolError(format!(
                "undecodable message on registrar association {association}"
            )));
            return;
        };
        let AsapMessage::EndpointKeepAlive(k) = d.message else {
            self.events.push_back(PeEvent::ProtocolError(format!(
                "unexpected {} on registrar association {association}",
                d.message.name()
            )));
            return;
        };
        if !k.home
            || k.pool_handle != self.config.pool_handle
            || k.pe_id.is_some_and(|id| id != self.id)
            || self.state == State::Done
        {
            return;
        }
        self.home = Some(k.server_id);
        // What was queued was for the old association.
        self.transmits.clear();
        self.events.push_back(PeEvent::NewHome {
            registrar: k.server_id,
            association,
        });
        self.events.push_back(PeEvent::KeepAlive {
            registrar: k.server_id,
            home: true,
        });
        self.send(&AsapMessage::EndpointKeepAliveAck(
            asap::EndpointKeepAliveAck {
                pool_handle: self.config.pool_handle.clone(),
                pe_id: self.id,
            },
        ));
        match self.state {
            State::Registered { .. } | State::Registering { .. } => {}
            // Hunting or lost: the new home keeps us; register with it to be sure.
            _ => self.register(now, false),
        }
    }

    fn candidates(&self, now: Duration) -> Vec<Vec<SocketAddr>> {
        let mut c: Vec<Vec<SocketAddr>> = self
            .announced
            .iter()
            .filter(|(_, _, exp)| *exp > now)
            .map(|(_, a, _)| a.clone())
            .collect();
        for r in &self.config.registrars {
            if !c.contains(r) {
                c.push(r.clone());
            }
        }
        c
    }

    /// Asks for the next registrar of the round, or pauses (T5, doubling) after a whole round.
    fn next_candidate(&mut self, now: Duration) {
        self.announced.retain(|(_, _, exp)| *exp > now);
        let c = self.candidates(now);
        if c.is_empty() || self.hunt_round >= c.len() {
            let pause = self.hunt_pause.max(self.config.hunt_interval);
            self.hunt_round = 0;
            self.state = State::Hunting {
                next_try: Some(now + pause),
            };
            if !c.is_empty() {
                self.events
                    .push_back(PeEvent::HuntFailed { retry_in: pause });
            }
            self.hunt_pause = (pause * 2).min(self.config.hunt_interval_max);
            return;
        }
        let addrs = c[self.hunt_cursor % c.len()].clone();
        self.hunt_cursor += 1;
        self.state = State::Hunting { next_try: None };
        self.connects.push_back(addrs);
    }

    /// The PE identifier.
    pub fn id(&self) -> PoolElementId {
        self.id
    }

    /// The registrar that keeps this PE, as learned from its keep-alives.
    pub fn home_registrar(&self) -> Option<RegistrarId> {
        self.home
    }

    /// Whether the registrar has accepted the registration.
    pub fn is_registered(&self) -> bool {
        matches!(self.state, State::Registered { .. })
    }

    /// Whether the PE has left the pool: its deregistration was confirmed, timed out, or its
    /// association went away while it waited (after [`PoolElementCore::deregister`]). The
    /// driver then closes the association and stops.
    pub fn is_done(&self) -> bool {
        self.state == State::Done
    }

    /// The policy (and values) registered.
    pub fn policy(&self) -> &PoolPolicy {
        &self.config.policy
    }

    /// The next message for the registrar (ASAP, PPID 11).
    pub fn poll_transmit(&mut self) -> Option<Vec<u8>> {
        self.transmits.pop_front()
    }

    /// The next report.
    pub fn poll_event(&mut self) -> Option<PeEvent> {
        self.events.pop_front()
    }

    /// When [`PoolElementCore::handle_timeout`] must run next.
    pub fn poll_timeout(&self) -> Option<Duration> {
        match self.state {
            State::Registering { deadline, .. } | State::Deregistering { deadline } => {
                Some(deadline)
            }
            State::Registered { next } => Some(next),
            State::Hunting { next_try } => next_try,
            State::Disconnected | State::Done => None,
        }
    }

    /// An association to a registrar is up: register. That registrar becomes the home, whose
    /// ID the PE learns from its first keep-alive (a registration response carries none), so
    /// the home of an earlier association is forgotten here.
    pub fn connected(&mut self, now: Duration) {
        if self.state != State::Done {
            self.home = None;
            self.hunt_round = 0;
            self.register(now, true);
        }
    }

    /// The association to the registrar is gone: hunt for another (if registrars are known).
    pub fn disconnected(&mut self, now: Duration) {
        match self.state {
            State::Done => {}
            State::Deregistering { .. } => self.state = State::Done,
            _ => {
                self.state = State::Disconnected;
                self.start(now);
            }
        }
    }

    /// Changes the policy values (e.g. a new load) and re-registers at once (RFC 5352 §3.1).
    pub fn set_policy(&mut self, now: Duration, policy: PoolPolicy) {
        if self.config.policy == policy {
            return;
        }
        self.config.policy = policy;
        match self.state {
            State::Registered { .. } => self.register(now, false),
            // The registration under way carries the old values: register again once answered.
            State::Registering { .. } => self.policy_changed = true,
            _ => {}
        }
    }

    /// Leaves the pool (RFC 5352 §3.2): sends ASAP_DEREGISTRATION and waits for the response
    /// until [`PoolElementConfig::response_timeout`] (a timer, [`PoolElementCore::poll_timeout`]);
    /// [`PoolElementCore::is_done`] says when the wait is over.
    pub fn deregister(&mut self, now: Duration) {
        if matches!(
            self.state,
            State::Disconnected | State::Done | State::Hunting { .. }
        ) {
            self.state = State::Done;
            return;
        }
        self.send(&AsapMessage::Deregistration(asap::Deregistration {
            pool_handle: self.config.pool_handle.clone(),
            pe_id: self.id,
        }));
        self.state = State::Deregistering {
            deadline: now + self.config.response_timeout,
        };
    }

    /// A message from the registrar.
    pub fn message(&mut self, now: Duration, bytes: &[u8]) {
        let m = match self.codec.decode::<AsapMessage>(bytes) {
            Ok(d) => d.message,
            Err(e) => {
                self.events.push_back(PeEvent::ProtocolError(e.to_string()));
                return;
            }
        };
        match m {
            AsapMessage::RegistrationResponse(r) if r.pe_id == self.id => {
                let State::Registering { first, .. } = self.state else {
                    return;
                };
                if r.reject {
                    // Try again at the next re-registration time (as RSPLIB does).
                    self.state = State::Registered {
                        next: now + self.config.reregistration_interval,
                    };
                    self.events.push_back(PeEvent::Rejected {
                        cause: r.error.as_ref().and_then(OperationError::code),
                    });
                } else {
                    self.state = State::Registered {
                        next: now + self.config.reregistration_interval,
                    };
                    self.hunt_pause = self.config.hunt_interval;
                    self.events.push_back(PeEvent::Registered { first });
                    if std::mem::take(&mut self.policy_changed) {
                        self.register(now, false);
                    }
                }
            }
            AsapMessage::DeregistrationResponse(d) if d.pe_id == self.id => {
                if matches!(self.state, State::Deregistering { .. }) {
                    self.state = State::Done;
                    self.events.push_back(PeEvent::Deregistered);
                } else {
                    // The registrar dropped the registration (life expired): register again.
                    self.register(now, false);
                }
            }
            AsapMessage::EndpointKeepAlive(k) => {
                // RFC 5352 §3.4: answer with the pool handle and the PE identifier. A
                // keep-alive without PE identifier (RFC form) is for every PE of the pool on
                // this association, i.e. this one.
                if k.pool_handle != self.config.pool_handle
                    || k.pe_id.is_some_and(|id| id != self.id)
                {
                    return;
                }
                if self.home.is_none() || k.home {
                    self.home = Some(k.server_id);
                }
                self.send(&AsapMessage::EndpointKeepAliveAck(
                    asap::EndpointKeepAliveAck {
                        pool_handle: self.config.pool_handle.clone(),
                        pe_id: self.id,
                    },
                ));
                self.events.push_back(PeEvent::KeepAlive {
                    registrar: k.server_id,
                    home: k.home,
                });
            }
            AsapMessage::Error(e) => self
                .events
                .push_back(PeEvent::ProtocolError(format!("ASAP_ERROR [{}]", e.error))),
            other => self.events.push_back(PeEvent::ProtocolError(format!(
                "unexpected {} from the registrar",
                other.name()
            ))),
        }
    }

    /// Runs what is due: re-registration, or giving up on a silent registrar.
    pub fn handle_timeout(&mut self, now: Duration) {
        match self.state {
            State::Registered { next } if next <= now => self.register(now, false),
            State::Registering {
                deadline, attempts, ..
            } if deadline <= now => {
                if attempts < self.config.max_registration_attempts {
                    // T2 expired: send the REGISTRATION again (RFC 5352 §3.1).
                    self.register(now, false);
                } else {
                    // MAX-REG-ATTEMPT reached: this registrar is gone, hunt for another.
                    self.events.push_back(PeEvent::RegistrarLost);
                    self.transmits.clear();
                    self.state = State::Disconnected;
                    self.start(now);
                }
            }
            State::Hunting { next_try: Some(t) } if t <= now => self.next_candidate(now),
            State::Deregistering { deadline } if deadline <= now => {
                // RFC 5352 §3.2: no answer within the response timeout; leave anyway.
                self.state = State::Done;
                self.events.push_back(PeEvent::DeregistrationTimedOut);
            }
            _ => {}
        }
    }

    fn register(&mut self, now: Duration, first: bool) {
        let element = PoolElement {
            id: self.id,
            home_registrar: self.home.unwrap_or_default(),
            registration_life: self.config.registration_life,
            user_transport: self.config.user_transport.clone(),
            policy: self.config.policy.clone(),
            asap_transport: None,
        };
        self.send(&AsapMessage::Registration(asap::Registration {
            pool_handle: self.config.pool_handle.clone(),
            pool_element: element,
        }));
        let (first, attempts) = match self.state {
            State::Registering {
                first: f, attempts, ..
            } => (first || f, attempts + 1),
            _ => (first, 1),
        };
        self.state = State::Registering {
            deadline: now + self.config.response_timeout,
            first,
            attempts,
        };
    }

    fn send(&mut self, m: &AsapMessage) {
        match self.codec.encode(m) {
            Ok(b) => self.transmits.push_back(b),
            Err(e) => self.events.push_back(PeEvent::ProtocolError(format!(
                "cannot encode {}: {e}",
                m.name()
            ))),
        }
    }
}
