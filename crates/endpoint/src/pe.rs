//! The pool element side of ASAP (RFC 5352 §3.1–§3.4): register, re-register before the
//! registration life runs out, answer keep-alives, deregister.

use rand::Rng;
use rserpool_wire::asap::{self, AsapMessage};
use rserpool_wire::{
    CauseCode, Codec, CodecConfig, Message, OperationError, PoolElement, PoolElementId, PoolHandle,
    PoolPolicy, RegistrarId, RegistrationLife, UserTransport,
};
use std::collections::VecDeque;
use std::time::Duration;

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
    /// The registrar did not answer in time: connect to another one (server hunt, RFC 5352
    /// §3.6) and call [`PoolElementCore::connected`] again.
    RegistrarLost,
    /// The registrar sent an ASAP_ERROR or something a PE does not expect.
    ProtocolError(String),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// No association to a registrar.
    Disconnected,
    /// REGISTRATION sent, no answer yet.
    Registering { deadline: Duration, first: bool },
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
        }
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
            State::Disconnected | State::Done => None,
        }
    }

    /// An association to a registrar is up: register.
    pub fn connected(&mut self, now: Duration) {
        if self.state != State::Done {
            self.register(now, true);
        }
    }

    /// The association to the registrar is gone.
    pub fn disconnected(&mut self, _now: Duration) {
        if self.state != State::Done {
            self.state = State::Disconnected;
        }
    }

    /// Changes the policy values (e.g. a new load) and re-registers at once (RFC 5352 §3.1).
    pub fn set_policy(&mut self, now: Duration, policy: PoolPolicy) {
        self.config.policy = policy;
        if matches!(self.state, State::Registered { .. }) {
            self.register(now, false);
        }
    }

    /// Leaves the pool (RFC 5352 §3.2).
    pub fn deregister(&mut self, now: Duration) {
        if matches!(self.state, State::Disconnected | State::Done) {
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
                    self.events.push_back(PeEvent::Registered { first });
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
            State::Registering { deadline, .. } if deadline <= now => {
                self.state = State::Disconnected;
                self.events.push_back(PeEvent::RegistrarLost);
            }
            State::Deregistering { deadline } if deadline <= now => {
                self.state = State::Done;
                self.events.push_back(PeEvent::RegistrarLost);
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
        let first = first || matches!(self.state, State::Registering { first: true, .. });
        self.state = State::Registering {
            deadline: now + self.config.response_timeout,
            first,
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
