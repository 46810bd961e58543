//! The pool element's side of sessions (RFC 5352 §3.8–§3.9) as a sans-IO core: pool users
//! connect to the PE's user transport; on each association data and the ASAP control channel
//! (PPID 11) travel together. The core separates the two, hands data and ASAP_COOKIE_ECHO to
//! the service of that session, sends the service's ASAP_COOKIEs, and sends an
//! ASAP_BUSINESS_CARD to each new session when one is configured.
//!
//! A service is anything implementing [`SessionService`]: one instance per session, itself
//! sans-IO (it is given the time and polled for output).

use rserpool_wire::asap::{self, AsapMessage};
use rserpool_wire::{Codec, CodecConfig, Message, PoolElement, PoolHandle, Protocol};
use std::collections::{HashMap, VecDeque};
use std::time::Duration;

/// One session of a service at a PE: given the session's input, polled for its output.
pub trait SessionService: Send {
    /// The session has just been accepted.
    fn opened(&mut self, _now: Duration) {}
    /// A data message from the pool user.
    fn data(&mut self, now: Duration, ppid: u32, stream: u16, data: &[u8]);
    /// The pool user echoed a cookie (after a failover): restore the state it carries.
    fn cookie_echo(&mut self, now: Duration, cookie: &[u8]);
    /// When [`SessionService::handle_timeout`] must run next.
    fn poll_timeout(&self) -> Option<Duration> {
        None
    }
    /// Runs what is due.
    fn handle_timeout(&mut self, _now: Duration) {}
    /// The next thing the service wants done.
    fn poll_output(&mut self) -> Option<ServiceOutput>;
}

/// What a service asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServiceOutput {
    /// Send data to the pool user.
    Data {
        /// PPID.
        ppid: u32,
        /// Stream.
        stream: u16,
        /// Payload.
        data: Vec<u8>,
    },
    /// Send this state cookie (ASAP_COOKIE, RFC 5352 §2.2.11).
    Cookie(Vec<u8>),
    /// End the session gracefully (after what was sent).
    Close,
    /// Abort the session (the reason is logged and counted).
    Abort(String),
}

/// Settings of the session side of a PE.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Most sessions at once; more associations are refused (aborted) and counted.
    pub max_sessions: usize,
    /// Largest cookie echo handed to a service; larger ones are answered with an ASAP_ERROR and
    /// the session is aborted.
    pub max_cookie_size: usize,
    /// Codec settings.
    pub codec: CodecConfig,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            max_sessions: 1024,
            max_cookie_size: 65_536,
            codec: CodecConfig::default(),
        }
    }
}

/// What the driver must do for a session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServerAction {
    /// Send on the session's association.
    Transmit {
        /// The session (the driver's association number).
        session: u64,
        /// PPID.
        ppid: u32,
        /// Stream.
        stream: u16,
        /// Payload.
        data: Vec<u8>,
    },
    /// Close the association gracefully.
    Close(u64),
    /// Abort the association.
    Abort(u64),
}

/// What happened, for logs and metrics.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServerEvent {
    /// A session was accepted.
    Accepted(u64),
    /// A session was refused: [`ServerConfig::max_sessions`] reached.
    Refused(u64),
    /// A cookie echo was handed to the session's service.
    CookieEcho {
        /// The session.
        session: u64,
        /// The cookie's size.
        len: usize,
    },
    /// The service sent a cookie.
    CookieSent {
        /// The session.
        session: u64,
        /// Its size.
        len: usize,
    },
    /// A business card was sent.
    BusinessCardSent(u64),
    /// The session's input was bad (the text says what); the session was aborted.
    Bad {
        /// The session.
        session: u64,
        /// Why.
        reason: String,
    },
    /// The service aborted the session.
    ServiceAborted {
        /// The session.
        session: u64,
        /// Why.
        reason: String,
    },
    /// A session ended.
    Ended(u64),
}

/// Counters of the session side.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ServerStats {
    /// Sessions accepted.
    pub accepted: u64,
    /// Sessions refused (limit).
    pub refused: u64,
    /// Sessions now.
    pub active: u64,
    /// Cookies sent.
    pub cookies_sent: u64,
    /// Cookie echoes received and handed to a service.
    pub cookie_echoes: u64,
    /// Business cards sent.
    pub business_cards_sent: u64,
    /// Data messages received.
    pub messages_received: u64,
    /// Data messages sent.
    pub messages_sent: u64,
    /// Sessions aborted for bad input.
    pub bad_input: u64,
    /// Sessions the service aborted.
    pub service_aborts: u64,
}

struct Session {
    service: Box<dyn SessionService>,
    echoed: bool,
}

/// The session side of a PE.
pub struct SessionServer {
    config: ServerConfig,
    codec: Codec,
    sessions: HashMap<u64, Session>,
    business_card: Option<(PoolHandle, Vec<PoolElement>)>,
    actions: VecDeque<ServerAction>,
    events: VecDeque<ServerEvent>,
    stats: ServerStats,
}

impl SessionServer {
    /// The session side with no sessions.
    pub fn new(config: ServerConfig) -> Self {
        SessionServer {
            codec: Codec::new(config.codec),
            config,
            sessions: HashMap::new(),
            business_card: None,
            actions: VecDeque::new(),
            events: VecDeque::new(),
            stats: ServerStats::default(),
        }
    }

    /// Counters.
    pub fn stats(&self) -> &ServerStats {
        &self.stats
    }

    /// Number of sessions now.
    pub fn sessions(&self) -> usize {
        self.sessions.len()
    }

    /// The business card sent to new sessions (RFC 5352 §3.9): the pool and the PEs to fail
    /// over to, in order. `None` sends none (RSPLIB sends none).
    pub fn set_business_card(&mut self, card: Option<(PoolHandle, Vec<PoolElement>)>) {
        self.business_card = card;
    }

    /// The next action for the driver.
    pub fn poll_action(&mut self) -> Option<ServerAction> {
        self.actions.pop_front()
    }

    /// The next report.
    pub fn poll_event(&mut self) -> Option<ServerEvent> {
        self.events.pop_front()
    }

    /// When [`SessionServer::handle_timeout`] must run next.
    pub fn poll_timeout(&self) -> Option<Duration> {
        self.sessions
            .values()
            .filter_map(|s| s.service.poll_timeout())
            .min()
    }

    /// Runs what is due in every session.
    pub fn handle_timeout(&mut self, now: Duration) {
        let due: Vec<u64> = self
            .sessions
            .iter()
            .filter(|(_, s)| s.service.poll_timeout().is_some_and(|t| t <= now))
            .map(|(id, _)| *id)
            .collect();
        for id in due {
            if let Some(s) = self.sessions.get_mut(&id) {
                s.service.handle_timeout(now);
            }
            self.drain(id);
        }
    }

    /// A pool user's association is up: `service` serves it. Returns `false` (and asks for an
    /// abort) when the session limit is reached.
    pub fn accept(&mut self, now: Duration, session: u64, service: Box<dyn SessionService>) -> bool {
        if self.sessions.len() >= self.config.max_sessions {
            self.stats.refused += 1;
            self.actions.push_back(ServerAction::Abort(session));
            self.events.push_back(ServerEvent::Refused(session));
            return false;
        }
        self.stats.accepted += 1;
        self.stats.active += 1;
        self.events.push_back(ServerEvent::Accepted(session));
        if let Some((pool_handle, pes)) = self.business_card.clone() {
            // RFC 5352 §3.9: the PE tells its user where to go should it fail.
            match self
                .codec
                .encode(&AsapMessage::BusinessCard(asap::BusinessCard {
                    pool_handle,
                    pool_elements: pes,
                })) {
                Ok(data) => {
                    self.stats.business_cards_sent += 1;
                    self.events.push_back(ServerEvent::BusinessCardSent(session));
                    self.actions.push_back(ServerAction::Transmit {
                        session,
                        ppid: Protocol::Asap.ppid(),
                        stream: 0,
                        data,
                    });
                }
                Err(e) => tracing::warn!(error = %e, "cannot encode the business card"),
            }
        }
        let mut s = Session {
            service,
            echoed: false,
        };
        s.service.opened(now);
        self.sessions.insert(session, s);
        self.drain(session);
        true
    }

    /// A session's association went down.
    pub fn closed(&mut self, session: u64) {
        if self.sessions.remove(&session).is_some() {
            self.stats.active -= 1;
            self.events.push_back(ServerEvent::Ended(session));
        }
    }

    /// A message on a session's association.
    pub fn message(&mut self, now: Duration, session: u64, ppid: u32, stream: u16, data: &[u8]) {
        let Some(s) = self.sessions.get_mut(&session) else {
            return;
        };
        if ppid != Protocol::Asap.ppid() {
            self.stats.messages_received += 1;
            s.service.data(now, ppid, stream, data);
            self.drain(session);
            return;
        }
        let m = match self.codec.decode::<AsapMessage>(data) {
            Ok(d) => d.message,
            Err(e) => {
                if let Some(cause) = e.answer_cause(data) {
                    self.send_error(session, cause);
                }
                self.bad(session, format!("control channel: {e}"));
                return;
            }
        };
        match m {
            AsapMessage::CookieEcho(c) => {
                if c.cookie.len() > self.config.max_cookie_size {
                    self.send_error(
                        session,
                        rserpool_wire::ErrorCause::new(rserpool_wire::CauseCode::LackOfResources),
                    );
                    self.bad(
                        session,
                        format!(
                            "cookie echo of {} bytes over the limit of {}",
                            c.cookie.len(),
                            self.config.max_cookie_size
                        ),
                    );
                    return;
                }
                if s.echoed {
                    // RSPLIB keeps the first echo of a session; a further one is ignored.
                    tracing::debug!(session, "second cookie echo ignored");
                    return;
                }
                s.echoed = true;
                self.stats.cookie_echoes += 1;
                self.events.push_back(ServerEvent::CookieEcho {
                    session,
                    len: c.cookie.len(),
                });
                s.service.cookie_echo(now, &c.cookie);
                self.drain(session);
            }
            AsapMessage::BusinessCard(_) => {
                // A PU may send its own card (RFC 5352 §3.9); a PE has no use for it.
                tracing::debug!(session, "business card from a pool user ignored");
            }
            other => {
                // RFC 5352 §2.2.14: tell the sender what cannot be used here.
                tracing::debug!(session, message = %other.name(), "unexpected on a session");
                let quoted = data[..data.len().min(rserpool_wire::ErrorCause::MAX_INFO)].to_vec();
                self.send_error(
                    session,
                    rserpool_wire::ErrorCause {
                        code: rserpool_wire::CauseCode::UnrecognizedMessage,
                        info: quoted,
                    },
                );
            }
        }
    }

    fn send_error(&mut self, session: u64, cause: rserpool_wire::ErrorCause) {
        let m = AsapMessage::Error(asap::AsapError {
            error: rserpool_wire::OperationError {
                causes: vec![cause],
            },
        });
        if let Ok(data) = self.codec.encode(&m) {
            self.actions.push_back(ServerAction::Transmit {
                session,
                ppid: Protocol::Asap.ppid(),
                stream: 0,
                data,
            });
        }
    }

    fn bad(&mut self, session: u64, reason: String) {
        self.stats.bad_input += 1;
        self.actions.push_back(ServerAction::Abort(session));
        self.events.push_back(ServerEvent::Bad { session, reason });
        self.closed(session);
    }

    /// Moves what the session's service produced into actions.
    fn drain(&mut self, session: u64) {
        loop {
            let Some(s) = self.sessions.get_mut(&session) else {
                return;
            };
            let Some(out) = s.service.poll_output() else {
                return;
            };
            match out {
                ServiceOutput::Data { ppid, stream, data } => {
                    self.stats.messages_sent += 1;
                    self.actions.push_back(ServerAction::Transmit {
                        session,
                        ppid,
                        stream,
                        data,
                    });
                }
                ServiceOutput::Cookie(cookie) => {
                    let len = cookie.len();
                    match self
                        .codec
                        .encode(&AsapMessage::Cookie(asap::Cookie { cookie }))
                    {
                        Ok(data) => {
                            self.stats.cookies_sent += 1;
                            self.events
                                .push_back(ServerEvent::CookieSent { session, len });
                            self.actions.push_back(ServerAction::Transmit {
                                session,
                                ppid: Protocol::Asap.ppid(),
                                stream: 0,
                                data,
                            });
                        }
                        Err(e) => tracing::warn!(session, error = %e, "cannot encode a cookie"),
                    }
                }
                ServiceOutput::Close => {
                    self.actions.push_back(ServerAction::Close(session));
                    self.closed(session);
                    return;
                }
                ServiceOutput::Abort(reason) => {
                    self.stats.service_aborts += 1;
                    self.actions.push_back(ServerAction::Abort(session));
                    self.events
                        .push_back(ServerEvent::ServiceAborted { session, reason });
                    self.closed(session);
                    return;
                }
            }
        }
    }
}
