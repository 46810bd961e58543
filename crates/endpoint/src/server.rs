//! The pool element's side of sessions (RFC 5352 §3.8–§3.9) as a sans-IO core: pool users
//! connect to the PE's user transport; on each association data and the ASAP control channel
//! (PPID 11) travel together. The core separates the two, hands data and ASAP_COOKIE_ECHO to
//! the PE's service, sends the service's ASAP_COOKIEs (the service decides when), and sends an
//! ASAP_BUSINESS_CARD to each new session when one is configured. A cookie echo the service
//! refuses is answered with an ASAP_ERROR naming the cause ([`refusal_cause`]) before the abort.
//!
//! The service is an [`rserpool_services::ServerService`]: one instance for the whole PE,
//! sessions told apart by the driver's association number.

use rserpool_services::cookie::SealError;
use rserpool_services::{
    CookieRefused, Now, ServerOutput, ServerReport, ServerService, SessionId, SessionInfo,
};
use rserpool_wire::asap::{self, AsapMessage};
use rserpool_wire::{
    CauseCode, Codec, CodecConfig, ErrorCause, Message, OperationError, PoolElement, PoolHandle,
    Protocol,
};
use std::collections::{HashMap, VecDeque};
use std::time::Duration;

/// Settings of the session side of a PE.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Most sessions at once; more associations are refused (aborted) and counted.
    pub max_sessions: usize,
    /// Largest cookie echo handed to the service; a larger one is answered with an ASAP_ERROR
    /// (Lack of Resources) and the session is aborted.
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
#[derive(Debug, Clone, PartialEq)]
pub enum ServerEvent {
    /// A session was accepted.
    Accepted(u64),
    /// A session was refused: [`ServerConfig::max_sessions`] reached.
    Refused(u64),
    /// A cookie echo was handed to the service.
    CookieEcho {
        /// The session.
        session: u64,
        /// The cookie's size.
        len: usize,
        /// The service's verdict (`Err`: refused, the text says why).
        result: Result<(), String>,
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
    /// The service's load changed (0..1): re-register if the policy uses it.
    Load(f64),
    /// What the service reports (replies, jobs).
    Report(ServerReport),
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
    /// Cookie echoes handed to the service.
    pub cookie_echoes: u64,
    /// Cookie echoes the service refused.
    pub cookie_echoes_refused: u64,
    /// Business cards sent.
    pub business_cards_sent: u64,
    /// Data messages received.
    pub messages_received: u64,
    /// Data messages sent.
    pub messages_sent: u64,
    /// Sessions aborted for bad input on the control channel.
    pub bad_input: u64,
    /// Sessions the service aborted.
    pub service_aborts: u64,
}

#[derive(Debug, Default)]
struct Session {
    echoed: bool,
}

/// The session side of a PE.
pub struct SessionServer {
    config: ServerConfig,
    codec: Codec,
    service: Box<dyn ServerService>,
    sessions: HashMap<u64, Session>,
    business_card: Option<(PoolHandle, Vec<PoolElement>)>,
    actions: VecDeque<ServerAction>,
    events: VecDeque<ServerEvent>,
    stats: ServerStats,
}

impl SessionServer {
    /// The session side of a PE running `service`.
    pub fn new(config: ServerConfig, service: Box<dyn ServerService>) -> Self {
        SessionServer {
            codec: Codec::new(config.codec),
            config,
            service,
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

    /// The service's load now (0..1).
    pub fn load(&self) -> f64 {
        self.service.load()
    }

    /// The business card sent to new sessions (RFC 5352 §3.9): the pool and the PEs to fail
    /// over to, in order. `None` sends none (RSPLIB sends none).
    pub fn set_business_card(&mut self, card: Option<(PoolHandle, Vec<PoolElement>)>) {
        self.business_card = card;
    }

    /// Whether actions are waiting.
    pub fn has_actions(&self) -> bool {
        !self.actions.is_empty()
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
        self.service.poll_timeout()
    }

    /// Runs what is due in the service.
    pub fn handle_timeout(&mut self, now: Now) {
        self.service.handle_timeout(now);
        self.drain(now);
    }

    /// A pool user's association is up. `identity` is what survives a failover (the pool
    /// user's address without port), for cookies bound to it. Returns `false` (and asks for an
    /// abort) when the session limit is reached.
    pub fn accept(&mut self, now: Now, session: u64, identity: Option<Vec<u8>>) -> bool {
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
            let card = AsapMessage::BusinessCard(asap::BusinessCard {
                pool_handle,
                pool_elements: pes,
            });
            match self.codec.encode(&card) {
                Ok(data) => {
                    self.stats.business_cards_sent += 1;
                    self.events
                        .push_back(ServerEvent::BusinessCardSent(session));
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
        self.sessions.insert(session, Session::default());
        self.service
            .open_session(now, SessionId(session), SessionInfo { identity });
        self.drain(now);
        true
    }

    /// A session's association went down.
    pub fn closed(&mut self, now: Now, session: u64) {
        if self.sessions.remove(&session).is_some() {
            self.stats.active -= 1;
            self.service.close_session(now, SessionId(session));
            self.events.push_back(ServerEvent::Ended(session));
            self.drain(now);
        }
    }

    /// The session's queue was flushed: the service may send more (CharGen).
    pub fn writable(&mut self, now: Now, session: u64) {
        if self.sessions.contains_key(&session) {
            self.service.writable(now, SessionId(session));
            self.drain(now);
        }
    }

    /// The PE is stopping: the service's last words (CalcApp: final cookies).
    pub fn shutdown(&mut self, now: Now) {
        self.service.shutdown(now);
        self.drain(now);
    }

    /// A message on a session's association.
    pub fn message(&mut self, now: Now, session: u64, ppid: u32, stream: u16, data: &[u8]) {
        if !self.sessions.contains_key(&session) {
            return;
        }
        if ppid != Protocol::Asap.ppid() {
            self.stats.messages_received += 1;
            if let Err(e) = self
                .service
                .handle_message(now, SessionId(session), ppid, stream, data)
            {
                tracing::debug!(session, error = %e, "service refused a message");
            }
            self.drain(now);
            return;
        }
        let m = match self.codec.decode::<AsapMessage>(data) {
            Ok(d) => d.message,
            Err(e) => {
                if let Some(cause) = e.answer_cause(data) {
                    self.send_error(session, cause);
                }
                self.bad(now, session, format!("control channel: {e}"));
                return;
            }
        };
        match m {
            AsapMessage::CookieEcho(c) => {
                if c.cookie.len() > self.config.max_cookie_size {
                    self.send_error(session, ErrorCause::new(CauseCode::LackOfResources));
                    let reason = format!(
                        "cookie echo of {} bytes over the limit of {}",
                        c.cookie.len(),
                        self.config.max_cookie_size
                    );
                    self.bad(now, session, reason);
                    return;
                }
                let s = self.sessions.get_mut(&session).expect("checked above");
                if s.echoed {
                    // RSPLIB keeps the first echo of a session; a further one is ignored.
                    tracing::debug!(session, "second cookie echo ignored");
                    return;
                }
                s.echoed = true;
                self.stats.cookie_echoes += 1;
                let result = self
                    .service
                    .handle_cookie_echo(now, SessionId(session), &c.cookie);
                if let Err(e) = &result {
                    // RFC 5352 §2.2.14: tell the pool user why before the service's abort (the
                    // service's outputs are drained after this), so that it can tell a refused
                    // cookie from a failed PE.
                    self.stats.cookie_echoes_refused += 1;
                    let code = refusal_cause(e);
                    // RFC 5354 §2.2.10: Invalid Values quotes the offending parameter, here
                    // the echoed cookie's TLV (all of the message after its header).
                    let info = match code {
                        CauseCode::InvalidValues => data.get(4..).unwrap_or_default().to_vec(),
                        _ => Vec::new(),
                    };
                    self.send_error(session, ErrorCause { code, info });
                }
                let result = result.map_err(|e| e.to_string());
                self.events.push_back(ServerEvent::CookieEcho {
                    session,
                    len: c.cookie.len(),
                    result,
                });
                self.drain(now);
            }
            AsapMessage::BusinessCard(_) => {
                // A PU may send its own card (RFC 5352 §3.9); a PE has no use for it.
                tracing::debug!(session, "business card from a pool user ignored");
            }
            other => {
                // RFC 5352 §2.2.14: tell the sender what cannot be used here.
                tracing::debug!(session, message = %other.name(), "unexpected on a session");
                let quoted = data[..data.len().min(ErrorCause::MAX_INFO)].to_vec();
                self.send_error(
                    session,
                    ErrorCause {
                        code: CauseCode::UnrecognizedMessage,
                        info: quoted,
                    },
                );
            }
        }
    }

    fn send_error(&mut self, session: u64, cause: ErrorCause) {
        let m = AsapMessage::Error(asap::AsapError {
            error: OperationError {
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

    fn bad(&mut self, now: Now, session: u64, reason: String) {
        self.stats.bad_input += 1;
        self.actions.push_back(ServerAction::Abort(session));
        self.events.push_back(ServerEvent::Bad { session, reason });
        self.closed(now, session);
    }

    /// Moves what the service produced into actions and events.
    fn drain(&mut self, now: Now) {
        let mut ended = Vec::new();
        while let Some(out) = self.service.poll_output() {
            match out {
                ServerOutput::Send {
                    session,
                    ppid,
                    stream,
                    data,
                } if self.sessions.contains_key(&session.0) => {
                    self.stats.messages_sent += 1;
                    self.actions.push_back(ServerAction::Transmit {
                        session: session.0,
                        ppid,
                        stream,
                        data,
                    });
                }
                ServerOutput::Cookie { session, cookie }
                    if self.sessions.contains_key(&session.0) =>
                {
                    match self
                        .codec
                        .encode(&AsapMessage::Cookie(asap::Cookie { cookie }))
                    {
                        Ok(data) => {
                            self.stats.cookies_sent += 1;
                            self.actions.push_back(ServerAction::Transmit {
                                session: session.0,
                                ppid: Protocol::Asap.ppid(),
                                stream: 0,
                                data,
                            });
                        }
                        Err(e) => {
                            tracing::warn!(%session, error = %e, "cannot encode a cookie")
                        }
                    }
                }
                ServerOutput::Shutdown { session } if self.sessions.contains_key(&session.0) => {
                    self.actions.push_back(ServerAction::Close(session.0));
                    ended.push(session.0);
                }
                ServerOutput::Abort { session, reason }
                    if self.sessions.contains_key(&session.0) =>
                {
                    self.stats.service_aborts += 1;
                    self.actions.push_back(ServerAction::Abort(session.0));
                    self.events.push_back(ServerEvent::ServiceAborted {
                        session: session.0,
                        reason: reason.to_string(),
                    });
                    ended.push(session.0);
                }
                ServerOutput::Load(l) => self.events.push_back(ServerEvent::Load(l)),
                ServerOutput::Report(r) => self.events.push_back(ServerEvent::Report(r)),
                // Output for a session already gone, or a kind this layer does not know.
                _ => {}
            }
        }
        for s in ended {
            self.closed_after_output(now, s);
        }
    }

    /// The service asked to end a session: forget it (and tell the service, as its contract
    /// asks), without draining again from inside the drain loop.
    fn closed_after_output(&mut self, now: Now, session: u64) {
        if self.sessions.remove(&session).is_some() {
            self.stats.active -= 1;
            self.events.push_back(ServerEvent::Ended(session));
            // Outputs of close_session are picked up by the next drain.
            self.service.close_session(now, SessionId(session));
        }
    }
}

/// The ASAP error cause that answers a refused cookie echo: a cookie that failed its seal's
/// verification (unknown key, bad MAC, expired, bound to another pool user) is refused for
/// security reasons (0xa, RFC 5352 §2.2.14); one that is not a well-formed cookie of this
/// service carries invalid values (0x3).
pub fn refusal_cause(refused: &CookieRefused) -> CauseCode {
    match refused {
        CookieRefused::Seal(SealError::Malformed { .. } | SealError::TooLarge { .. }) => {
            CauseCode::InvalidValues
        }
        CookieRefused::Seal(_) => CauseCode::RejectedSecurity,
        CookieRefused::Malformed(_) | CookieRefused::Invalid(_) => CauseCode::InvalidValues,
        CookieRefused::NotSupported => CauseCode::UnrecognizedMessage,
        _ => CauseCode::Unspecified,
    }
}
