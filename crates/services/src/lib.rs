//! The example services of RSerPool, wire-compatible with RSPLIB's `rspserver`, `pingpongclient`
//! and `calcappclient`: Echo, Discard, Daytime, CharGen, PingPong (PPID 33) and CalcApp (PPID 34).
//!
//! Every service is a sans-IO state machine: the session layer (a pool element accepting sessions
//! from pool users, or a pool user's session with failover) feeds it events with the current time
//! and polls it for outputs. No sockets, no clock, no runtime:
//!
//! - server side, one [`ServerService`] per pool element, serving many sessions told apart by
//!   [`SessionId`] (CalcApp shares its capacity among the jobs of all sessions);
//! - client side, one [`ClientService`] per pool-user session, for PingPong and CalcApp: what to
//!   send, how to check each answer, what to resend after a failover;
//! - session state travels in cookies (ASAP_COOKIE / ASAP_COOKIE_ECHO, RFC 5352 §2.2.10/§2.2.11),
//!   sealed by a [`cookie::CookieSeal`]: plain (RSPLIB's format) or signed with HMAC-SHA256 and a
//!   pool-wide key, with expiry and an optional binding to the pool user's identity;
//! - [`ServiceKind`] is the registry: name, default pool handle, PPID, constructors.
//!
//! ```
//! use rserpool_services::{Now, ServerOutput, ServiceConfig, ServiceKind, SessionId, SessionInfo};
//! use rserpool_services::pingpong::{Ping, PingPongMessage};
//!
//! let mut pe = ServiceConfig::default().server(ServiceKind::PingPong).unwrap();
//! let now = Now::from_monotonic(std::time::Duration::ZERO);
//! pe.open_session(now, SessionId(1), SessionInfo::default());
//! let ping = PingPongMessage::Ping(Ping { flags: 0, message_no: 1, data: b"hello".to_vec() });
//! pe.handle_message(now, SessionId(1), 33, 0, &ping.encode().unwrap()).unwrap();
//! let Some(ServerOutput::Send { data, .. }) = pe.poll_output() else { panic!() };
//! let PingPongMessage::Pong(pong) = PingPongMessage::decode(&data).unwrap() else { panic!() };
//! assert_eq!((pong.message_no, pong.reply_no), (1, 1));
//! assert!(matches!(pe.poll_output(), Some(ServerOutput::Cookie { .. })));
//! ```

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod calcapp;
mod config;
pub mod cookie;
mod error;
pub mod pingpong;
mod registry;
pub mod standard;
mod time;

pub use config::{ConfigError, CookieConfig, ServiceConfig};
pub use error::{DecodeError, DecodeErrorKind, EncodeError, ServiceError};
pub use registry::ServiceKind;
pub use time::Now;

/// Payload protocol identifier of the ASAP control channel that carries cookies (RFC 5352).
pub const PPID_ASAP: u32 = 11;
/// Payload protocol identifier of the PingPong protocol (IANA, RSPLIB `PPID_PPP`).
pub const PPID_PINGPONG: u32 = 33;
/// Payload protocol identifier of the CalcApp protocol (IANA, RSPLIB `PPID_CALCAPP`).
pub const PPID_CALCAPP: u32 = 34;

/// A session on a pool element, chosen by the session layer and unique among the sessions of one
/// service instance while that session lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SessionId(pub u64);

impl std::fmt::Display for SessionId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "session {}", self.0)
    }
}

/// What the session layer knows about the pool user of a new session.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SessionInfo {
    /// A stable identity of the pool user that survives a failover (its TLS certificate
    /// identity, or its address without the port): what signed cookies are bound to when
    /// binding is configured. `None`: cookies of this session are not bound.
    pub identity: Option<Vec<u8>>,
}

/// Why a service asks the session layer to abort a session.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AbortReason {
    /// The peer sent a message this service cannot accept.
    #[error("protocol violation: {0}")]
    Protocol(#[from] ServiceError),
    /// A cookie echo was refused.
    #[error("cookie refused: {0}")]
    Cookie(#[from] CookieRefused),
    /// The configured failure tester fired (PingPong `failure_after`, RSPLIB `-pppfailureafter`).
    #[error("failure tester: aborting after {0} replies")]
    FailureTester(u64),
}

/// What a server-side service wants done, in order. Poll with [`ServerService::poll_output`]
/// after every event until `None`.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum ServerOutput {
    /// Send `data` as one message on the session's data channel.
    Send {
        /// The session.
        session: SessionId,
        /// Payload protocol identifier to send with.
        ppid: u32,
        /// SCTP stream (0 on the TCP mapping).
        stream: u16,
        /// The message.
        data: Vec<u8>,
    },
    /// Send ASAP_COOKIE (RFC 5352 §2.2.10) carrying `cookie` (already sealed) to the pool user.
    Cookie {
        /// The session.
        session: SessionId,
        /// The cookie parameter's bytes.
        cookie: Vec<u8>,
    },
    /// Close the session gracefully once everything queued before is sent (Daytime: SCTP EOF).
    Shutdown {
        /// The session.
        session: SessionId,
    },
    /// Abort the session now.
    Abort {
        /// The session.
        session: SessionId,
        /// Why.
        reason: AbortReason,
    },
    /// The service's load (0.0 to 1.0) changed: re-register when the pool policy uses load.
    Load(f64),
    /// Something worth logging and counting (job accepted, completed, refused cookie...).
    Report(ServerReport),
}

/// Events of server-side services, for logs and metrics.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum ServerReport {
    /// PingPong answered a Ping.
    Pong {
        /// The session.
        session: SessionId,
        /// The Ping's message number.
        message_no: u64,
        /// The reply number sent.
        reply_no: u64,
    },
    /// A session's state was restored from a cookie echo.
    Restored {
        /// The session.
        session: SessionId,
        /// What was restored, for the log.
        state: String,
    },
    /// A CalcApp job was accepted (`resumed`: from a cookie echo).
    JobAccepted {
        /// The session.
        session: SessionId,
        /// Job identifier.
        job_id: u32,
        /// Job size in calculations.
        job_size: u64,
        /// Calculations already done (from the cookie).
        completed: u64,
        /// From a cookie echo.
        resumed: bool,
    },
    /// A CalcApp job was rejected (the PE is full).
    JobRejected {
        /// The session.
        session: SessionId,
        /// Job identifier.
        job_id: u32,
        /// From a cookie echo.
        resumed: bool,
    },
    /// A CalcApp job completed and Complete was sent.
    JobCompleted {
        /// The session.
        session: SessionId,
        /// Job identifier.
        job_id: u32,
        /// Job size in calculations.
        job_size: u64,
    },
    /// A CalcApp job was dropped because the pool user stopped answering keep-alives.
    JobTimedOut {
        /// The session.
        session: SessionId,
        /// Job identifier.
        job_id: u32,
    },
    /// A message was ignored (CalcApp: unknown type, keep-alive for no job), as RSPLIB does.
    Ignored {
        /// The session.
        session: SessionId,
        /// Why.
        error: ServiceError,
    },
}

/// Why a cookie echo did not restore a session.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CookieRefused {
    /// The seal refused it (bad MAC, expired, bound to another pool user, malformed envelope).
    #[error(transparent)]
    Seal(#[from] cookie::SealError),
    /// The payload inside is not this service's cookie.
    #[error("malformed cookie: {0}")]
    Malformed(#[from] DecodeError),
    /// The state in the cookie is impossible (e.g. more completed than the job size).
    #[error("invalid cookie state: {0}")]
    Invalid(&'static str),
    /// This service keeps no state in cookies.
    #[error("this service does not use cookies")]
    NotSupported,
    /// The session is unknown to the service.
    #[error("unknown {0}")]
    UnknownSession(SessionId),
}

/// The server side of a service on one pool element: many sessions, one instance.
///
/// Call order for a session: [`open_session`](Self::open_session), then any number of
/// [`handle_message`](Self::handle_message) / [`handle_cookie_echo`](Self::handle_cookie_echo) /
/// [`writable`](Self::writable), then [`close_session`](Self::close_session) (also after the
/// service asked for `Shutdown` or `Abort`). After every call, drain
/// [`poll_output`](Self::poll_output) and re-arm the timer from
/// [`poll_timeout`](Self::poll_timeout); call [`handle_timeout`](Self::handle_timeout) when it
/// expires. Errors returned are for logs and counters: what to send is always in the outputs.
pub trait ServerService: Send + std::fmt::Debug {
    /// Which service this is.
    fn kind(&self) -> ServiceKind;
    /// A pool user opened a session (SCTP association or TCP connection established).
    fn open_session(&mut self, now: Now, session: SessionId, info: SessionInfo);
    /// A data message (any PPID other than ASAP's 11) arrived on a session.
    fn handle_message(
        &mut self,
        now: Now,
        session: SessionId,
        ppid: u32,
        stream: u16,
        data: &[u8],
    ) -> Result<(), ServiceError>;
    /// An ASAP_COOKIE_ECHO arrived: restore the session's state from the cookie (the bytes of its
    /// Cookie parameter), or refuse it (the outputs say what the pool user is told).
    fn handle_cookie_echo(
        &mut self,
        now: Now,
        session: SessionId,
        cookie: &[u8],
    ) -> Result<(), CookieRefused>;
    /// The session's send buffer has room again (CharGen sends its next burst). Default: nothing.
    fn writable(&mut self, now: Now, session: SessionId) {
        let _ = (now, session);
    }
    /// The session is gone (closed, aborted or lost); forget it.
    fn close_session(&mut self, now: Now, session: SessionId);
    /// The pool element is shutting down: last words to every session (CalcApp: final cookies).
    fn shutdown(&mut self, now: Now) {
        let _ = now;
    }
    /// When [`handle_timeout`](Self::handle_timeout) must be called next (monotonic time).
    fn poll_timeout(&self) -> Option<std::time::Duration> {
        None
    }
    /// The time from [`poll_timeout`](Self::poll_timeout) has come.
    fn handle_timeout(&mut self, now: Now) {
        let _ = now;
    }
    /// The next output, in order.
    fn poll_output(&mut self) -> Option<ServerOutput>;
    /// The current load, 0.0 to 1.0 (CalcApp: running jobs / max jobs; others 0).
    fn load(&self) -> f64 {
        0.0
    }
    /// Number of sessions the service currently keeps state for.
    fn sessions(&self) -> usize;
}

/// Why a client-side service asks its session to fail over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum FailoverReason {
    /// No answer in time (PingPong reply timeout, CalcApp keep-alive or accept timeout): report
    /// the PE unreachable (RSPLIB `FFF_UNREACHABLE`).
    NoAnswer,
    /// The PE refused the work (CalcApp Reject): select another, no unreachable report.
    Rejected,
    /// The PE answered something that breaks the protocol.
    ProtocolError,
}

/// What a client-side service wants done, in order.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum ClientOutput {
    /// Send `data` as one message on the session.
    Send {
        /// Payload protocol identifier.
        ppid: u32,
        /// SCTP stream.
        stream: u16,
        /// The message.
        data: Vec<u8>,
    },
    /// Forget the stored cookie: the state it holds is finished (a CalcApp job completed), so a
    /// later failover must not resume it.
    ClearCookie,
    /// Fail over now; call [`ClientService::failover_complete`] when connected to the next PE.
    Failover(FailoverReason),
    /// Something for the user (a reply, a gap, a job done).
    Report(ClientReport),
    /// The client has done all it was asked to do; the session may be closed.
    Finished,
}

/// Events of client-side services: what `pingpongclient` and `calcappclient` print.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum ClientReport {
    /// A Ping was sent.
    PingSent {
        /// Its message number.
        message_no: u64,
        /// Resent after a failover.
        resent: bool,
    },
    /// A Pong answered an outstanding Ping.
    Pong {
        /// The Ping's message number.
        message_no: u64,
        /// The PE's reply number.
        reply_no: u64,
        /// Round-trip time from the (last) sending of the Ping.
        rtt: std::time::Duration,
    },
    /// The reply number did not follow the previous one by 1 (`pingpongclient`'s "gap").
    Gap {
        /// Previous reply number.
        previous: u64,
        /// This reply number.
        reply_no: u64,
    },
    /// A Pong for a message number not outstanding (already answered, or never sent).
    DuplicatePong {
        /// The message number.
        message_no: u64,
    },
    /// A CalcApp job was queued.
    JobQueued {
        /// Job identifier.
        job_id: u32,
        /// Job size in calculations.
        job_size: u64,
    },
    /// A CalcApp job was not queued: the queue is full (`max_queued_jobs`).
    JobDropped {
        /// Job size in calculations.
        job_size: u64,
    },
    /// A CalcApp Request was sent.
    JobRequested {
        /// Job identifier.
        job_id: u32,
    },
    /// The PE accepted the job.
    JobAccepted {
        /// Job identifier.
        job_id: u32,
    },
    /// The PE rejected the job.
    JobRejected {
        /// Job identifier.
        job_id: u32,
    },
    /// The job completed.
    JobCompleted {
        /// Job identifier.
        job_id: u32,
        /// Job size in calculations.
        job_size: u64,
        /// From Request to Complete.
        handling_time: std::time::Duration,
        /// Failovers during this job.
        failovers: u32,
    },
    /// A message was ignored (wrong job, unexpected type); the error says what.
    Ignored(ServiceError),
}

/// The client side of a service for one pool-user session (PingPong and CalcApp).
///
/// Call [`start`](Self::start) once the session is connected, feed it every data message, tell
/// it when a failover completed, and drain [`poll_output`](Self::poll_output) after every call.
pub trait ClientService: Send + std::fmt::Debug {
    /// Which service this is.
    fn kind(&self) -> ServiceKind;
    /// The session is connected to its first PE: begin.
    fn start(&mut self, now: Now);
    /// A data message arrived from the PE.
    fn handle_message(
        &mut self,
        now: Now,
        ppid: u32,
        stream: u16,
        data: &[u8],
    ) -> Result<(), ServiceError>;
    /// The session failed over and is connected to another PE; `cookie_echoed` says whether a
    /// COOKIE_ECHO with the last cookie was sent before any data. The client resends what is
    /// outstanding.
    fn failover_complete(&mut self, now: Now, cookie_echoed: bool);
    /// When [`handle_timeout`](Self::handle_timeout) must be called next (monotonic time).
    fn poll_timeout(&self) -> Option<std::time::Duration>;
    /// The time from [`poll_timeout`](Self::poll_timeout) has come.
    fn handle_timeout(&mut self, now: Now);
    /// The next output, in order.
    fn poll_output(&mut self) -> Option<ClientOutput>;
}
