//! The pool user's session (RFC 5351 §3, RFC 5352 §3.8–§3.9) as a sans-IO core: select a PE,
//! connect, carry data and the ASAP control channel (PPID 11) on one association, keep the
//! latest state cookie, and on failure move to another PE and hand it the cookie before any
//! data.
//!
//! The core never touches a socket: it asks its driver to resolve the pool, to connect to a PE,
//! to send a message or to close the association ([`SessionAction`]), and is told what happened
//! (resolved, connected, message, association lost, time). What it reports keeps the receipts
//! apart ([`Receipt`]): which PE was *selected* (and why), that the session is *bound* to it
//! (the association is up), that the PE was *reached* (a message came back), and the
//! *outcome* or each *failover* (from which PE to which, with or without a cookie, why).
//!
//! Failover candidates, in order (RFC 5352 §3.9): the PEs of the last ASAP_BUSINESS_CARD the
//! PE sent, then the PEs left from the last handle resolution, then a new resolution. A PE that
//! failed is reported with ASAP_ENDPOINT_UNREACHABLE (RFC 5352 §3.5) by the driver.

use rserpool_wire::asap::{self, AsapMessage};
use rserpool_wire::{
    CauseCode, Codec, CodecConfig, Message, PoolElement, PoolElementId, PoolHandle, PoolPolicy,
    Protocol, TransportProtocol,
};
use std::collections::{HashSet, VecDeque};
use std::fmt;
use std::time::Duration;

/// Settings of a session.
#[derive(Debug, Clone)]
pub struct SessionConfig {
    /// The pool to use.
    pub pool_handle: PoolHandle,
    /// Fail over by itself when the PE fails (`true`, the default); with `false` the session
    /// reports [`SessionEvent::FailoverNecessary`] and waits for [`PoolUserSession::failover`],
    /// as RSPLIB's applications do.
    pub auto_failover: bool,
    /// Connection attempts allowed for one open or one failover before the session fails.
    pub max_attempts: u32,
    /// Pause before a new resolution after a failed attempt; doubled each time.
    pub backoff_initial: Duration,
    /// Longest pause between two attempts.
    pub backoff_max: Duration,
    /// How long a connection attempt (or a resolution) may take (RSPLIB: 5 s).
    pub connect_timeout: Duration,
    /// Fail over when data was sent and nothing came back for this long; `None` waits forever
    /// (for services that do not answer, like Discard).
    pub answer_timeout: Option<Duration>,
    /// Largest cookie kept; a larger one is refused and counted (the VNFPOOL text gives 64 KiB).
    pub max_cookie_size: usize,
    /// Messages held while the session has no PE (during a failover); more are refused.
    pub max_queued: usize,
    /// The application resends what is unanswered after each failover (the PingPong and
    /// CalcApp clients do): then nothing is held during a failover, and a message sent before
    /// the application has seen a failover is refused with [`SessionError::FailingOver`]
    /// rather than sent to the new PE ahead of the application's own resending.
    pub application_resends: bool,
    /// Which user transport the driver can reach; PEs offering another are skipped.
    pub transport: Option<TransportProtocol>,
    /// Codec settings.
    pub codec: CodecConfig,
}

impl SessionConfig {
    /// Defaults for a pool: automatic failover, 5 attempts, 100 ms back-off doubling to 2 s,
    /// 5 s connect timeout, no answer timeout, 64 KiB cookies, 1024 queued messages.
    pub fn new(pool_handle: PoolHandle) -> Self {
        SessionConfig {
            pool_handle,
            auto_failover: true,
            max_attempts: 5,
            backoff_initial: Duration::from_millis(100),
            backoff_max: Duration::from_secs(2),
            connect_timeout: Duration::from_secs(5),
            answer_timeout: None,
            max_cookie_size: 65_536,
            max_queued: 1024,
            application_resends: false,
            transport: None,
            codec: CodecConfig::default(),
        }
    }
}

/// Why a session left its PE.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FailoverReason {
    /// The association to the PE went down (the text is the transport's reason).
    AssociationLost(String),
    /// Data was sent and nothing came back within [`SessionConfig::answer_timeout`].
    NoAnswer,
    /// The connection to the selected PE could not be established.
    ConnectFailed(String),
    /// The application asked for it ([`PoolUserSession::failover`]).
    Requested,
    /// The PE refused the work (CalcApp Reject): another PE is tried, nobody is reported.
    Rejected,
    /// The PE sent something on the control channel that cannot be decoded.
    ProtocolError(String),
    /// The PE refused the cookie echoed to it (an ASAP_ERROR, invalid values or rejected for
    /// security reasons, before anything else): another PE is tried with the same cookie,
    /// nobody is reported (the PE is alive), and the refusal counts as an attempt of the
    /// failover that brought the session there, so that a cookie every PE refuses ends the
    /// session with this cause instead of moving it round for ever.
    CookieRefused(String),
}

impl FailoverReason {
    /// A short label for metrics: `association_lost`, `no_answer`, `connect_failed`,
    /// `requested`, `rejected`, `protocol_error`, `cookie_refused`.
    pub fn label(&self) -> &'static str {
        match self {
            FailoverReason::AssociationLost(_) => "association_lost",
            FailoverReason::NoAnswer => "no_answer",
            FailoverReason::ConnectFailed(_) => "connect_failed",
            FailoverReason::Requested => "requested",
            FailoverReason::Rejected => "rejected",
            FailoverReason::ProtocolError(_) => "protocol_error",
            FailoverReason::CookieRefused(_) => "cookie_refused",
        }
    }

    /// Whether the PE is to be reported unreachable (RFC 5352 §3.5): it failed, rather than
    /// being left on request.
    pub fn pe_failed(&self) -> bool {
        !matches!(
            self,
            FailoverReason::Requested | FailoverReason::Rejected | FailoverReason::CookieRefused(_)
        )
    }
}

impl fmt::Display for FailoverReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FailoverReason::AssociationLost(r) => write!(f, "association lost ({r})"),
            FailoverReason::NoAnswer => f.write_str("no answer in time"),
            FailoverReason::ConnectFailed(r) => write!(f, "connect failed ({r})"),
            FailoverReason::Requested => f.write_str("requested"),
            FailoverReason::Rejected => f.write_str("rejected by the PE"),
            FailoverReason::ProtocolError(r) => write!(f, "protocol error ({r})"),
            FailoverReason::CookieRefused(r) => write!(f, "cookie refused ({r})"),
        }
    }
}

/// Where a selected PE came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CandidateSource {
    /// A handle resolution answered by the registrar (or the resolver's cache: the driver says).
    Resolution,
    /// The PEs left over from an earlier resolution of this session.
    Cache,
    /// The ASAP_BUSINESS_CARD of the previous PE.
    BusinessCard,
}

impl CandidateSource {
    /// `resolution`, `cache` or `business_card`.
    pub fn label(self) -> &'static str {
        match self {
            CandidateSource::Resolution => "resolution",
            CandidateSource::Cache => "cache",
            CandidateSource::BusinessCard => "business_card",
        }
    }
}

/// Receipt: a PE was selected (not yet bound, not yet reached).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Selection {
    /// The PE chosen.
    pub pe: PoolElementId,
    /// Where the candidates came from.
    pub source: CandidateSource,
    /// The pool policy the registrar applied, if it said (resolutions only).
    pub pool_policy: Option<PoolPolicy>,
    /// The chosen PE's registered policy values (load, weight, ...).
    pub pe_policy: PoolPolicy,
    /// The candidates in order, the chosen one first.
    pub candidates: Vec<PoolElementId>,
    /// When.
    pub at: Duration,
}

/// Receipt: one failover, complete.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FailoverRecord {
    /// The PE left.
    pub from: PoolElementId,
    /// The PE now serving.
    pub to: PoolElementId,
    /// Whether a cookie was echoed to the new PE.
    pub with_cookie: bool,
    /// Why.
    pub reason: FailoverReason,
    /// Connection attempts it took.
    pub attempts: u32,
    /// When the failure was noticed.
    pub started: Duration,
    /// When the new association came up (and the cookie, if any, was sent).
    pub completed: Duration,
}

/// How a session ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Closed by the application.
    Closed,
    /// No PE could be used within the attempts allowed.
    Failed {
        /// The last failure.
        reason: String,
    },
}

/// The session's receipts, each fact apart.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Receipt {
    /// Every selection, in order.
    pub selections: Vec<Selection>,
    /// The PE the session is bound to now, and since when (association up).
    pub bound: Option<(PoolElementId, Duration)>,
    /// The PE that last answered on the current binding, and when it first did.
    pub reached: Option<(PoolElementId, Duration)>,
    /// Every completed failover.
    pub failovers: Vec<FailoverRecord>,
    /// The outcome, once the session ended.
    pub outcome: Option<Outcome>,
}

/// Counters of one session (drivers sum them over sessions for metrics).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SessionStats {
    /// PEs selected.
    pub selected: u64,
    /// Associations that came up (bindings).
    pub bound: u64,
    /// Bindings on which the PE answered.
    pub reached: u64,
    /// Failovers completed.
    pub failovers: u64,
    /// Failovers that echoed a cookie.
    pub failovers_with_cookie: u64,
    /// Connection attempts that failed.
    pub connect_failures: u64,
    /// PEs reported unreachable.
    pub unreachable_reported: u64,
    /// Cookies received (and kept).
    pub cookies: u64,
    /// Cookies refused (over [`SessionConfig::max_cookie_size`]).
    pub cookies_refused: u64,
    /// Business cards received.
    pub business_cards: u64,
    /// Data messages sent and received.
    pub messages_sent: u64,
    /// Data messages received.
    pub messages_received: u64,
    /// Control-channel messages that could not be decoded or were not expected.
    pub protocol_errors: u64,
    /// Cookie echoes a PE refused (ASAP_ERROR in answer).
    pub cookies_refused_by_pe: u64,
}

/// What the driver must do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SessionAction {
    /// Resolve the pool handle and call [`PoolUserSession::resolved`].
    Resolve(PoolHandle),
    /// Connect to this PE and call [`PoolUserSession::connected`] or
    /// [`PoolUserSession::connect_failed`].
    Connect(PoolElement),
    /// Abort the current association (the session left it).
    Abort,
    /// Close the current association gracefully (the session ended).
    Close,
    /// Send a message on the current association.
    Transmit {
        /// PPID (11 for the control channel).
        ppid: u32,
        /// Stream.
        stream: u16,
        /// Payload.
        data: Vec<u8>,
    },
    /// Send ASAP_ENDPOINT_UNREACHABLE for this PE to a registrar (RFC 5352 §3.5).
    ReportUnreachable(PoolHandle, PoolElementId),
}

/// What the session reports to the application.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SessionEvent {
    /// The first PE is bound (the association is up).
    Opened {
        /// The PE.
        pe: PoolElementId,
    },
    /// A data message arrived.
    Data {
        /// PPID.
        ppid: u32,
        /// Stream.
        stream: u16,
        /// Payload.
        data: Vec<u8>,
    },
    /// The PE failed and [`SessionConfig::auto_failover`] is off: call
    /// [`PoolUserSession::failover`] (or close).
    FailoverNecessary {
        /// The PE that failed.
        from: PoolElementId,
        /// Why.
        reason: FailoverReason,
        /// Whether a cookie will be echoed.
        has_cookie: bool,
    },
    /// The PE failed (or was left on request) and the session is moving to another one
    /// (automatic failover). Data sent until [`SessionEvent::Failover`] is held.
    FailoverStarted {
        /// The PE left.
        from: PoolElementId,
        /// Why.
        reason: FailoverReason,
        /// Whether a cookie will be echoed.
        has_cookie: bool,
    },
    /// A failover completed: the session continues on another PE.
    Failover(FailoverRecord),
    /// The session gave up: no PE could be used.
    Failed {
        /// The last failure.
        reason: String,
    },
    /// A cookie arrived from the PE (kept; only the latest one is).
    Cookie {
        /// Its size.
        len: usize,
    },
    /// The PE sent a business card.
    BusinessCard {
        /// The PEs on it, in failover order.
        pes: Vec<PoolElementId>,
    },
    /// Something from the PE was not usable (logged and counted).
    ProtocolError(String),
}

/// Why a message could not be sent.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SessionError {
    /// The session has ended.
    #[error("the session has ended")]
    Ended,
    /// No PE now and the queue of held messages is full.
    #[error("the session has no PE now and {0} messages are already held")]
    QueueFull(usize),
    /// PPID 11 is the control channel; data cannot use it.
    #[error("PPID 11 is reserved for the ASAP control channel")]
    ReservedPpid,
    /// A failover is under way or completed unseen by the application
    /// ([`SessionConfig::application_resends`]): resend after the failover notification.
    #[error("a failover is under way; resend after its notification")]
    FailingOver,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum State {
    /// Not opened yet.
    Idle,
    /// Waiting for a resolution (until the deadline).
    Resolving { deadline: Duration },
    /// Back-off before the next selection.
    Waiting { until: Duration },
    /// Connecting to a PE.
    Connecting { pe: PoolElement, deadline: Duration },
    /// Bound to a PE.
    Bound { pe: PoolElement },
    /// Waiting for the application to call `failover` (manual mode).
    FailoverPending,
    /// Ended.
    Ended,
}

/// An open or a failover in progress.
#[derive(Debug, Clone)]
struct Moving {
    from: Option<PoolElementId>,
    reason: FailoverReason,
    started: Duration,
    attempts: u32,
    tried: HashSet<PoolElementId>,
}

/// The pool user's session core.
pub struct PoolUserSession {
    config: SessionConfig,
    codec: Codec,
    state: State,
    moving: Option<Moving>,
    cookie: Option<Vec<u8>>,
    business_card: Vec<PoolElement>,
    cached: Vec<PoolElement>,
    cached_policy: Option<PoolPolicy>,
    queue: VecDeque<(u32, u16, Vec<u8>)>,
    awaiting_since: Option<Duration>,
    actions: VecDeque<SessionAction>,
    events: VecDeque<SessionEvent>,
    receipt: Receipt,
    stats: SessionStats,
    /// The failover that bound the session with a cookie echo the PE has not yet answered
    /// (no data, no cookie from it yet): a refusal continues it.
    echo_pending: Option<Moving>,
}

impl PoolUserSession {
    /// A session; nothing happens until [`PoolUserSession::open`].
    pub fn new(config: SessionConfig) -> Self {
        PoolUserSession {
            codec: Codec::new(config.codec),
            config,
            state: State::Idle,
            moving: None,
            cookie: None,
            business_card: Vec::new(),
            cached: Vec::new(),
            cached_policy: None,
            queue: VecDeque::new(),
            awaiting_since: None,
            actions: VecDeque::new(),
            events: VecDeque::new(),
            receipt: Receipt::default(),
            stats: SessionStats::default(),
            echo_pending: None,
        }
    }

    /// The settings.
    pub fn config(&self) -> &SessionConfig {
        &self.config
    }

    /// The receipts so far.
    pub fn receipt(&self) -> &Receipt {
        &self.receipt
    }

    /// The counters so far.
    pub fn stats(&self) -> &SessionStats {
        &self.stats
    }

    /// The latest cookie, if the PE sent one.
    pub fn cookie(&self) -> Option<&[u8]> {
        self.cookie.as_deref()
    }

    /// The PE the session is bound to now.
    pub fn current_pe(&self) -> Option<PoolElementId> {
        match &self.state {
            State::Bound { pe } => Some(pe.id),
            _ => None,
        }
    }

    /// Whether the session is bound to a PE (the association is up).
    pub fn is_bound(&self) -> bool {
        matches!(self.state, State::Bound { .. })
    }

    /// Whether the session has ended (closed or failed).
    pub fn is_ended(&self) -> bool {
        self.state == State::Ended
    }

    /// The next thing for the driver to do.
    pub fn poll_action(&mut self) -> Option<SessionAction> {
        self.actions.pop_front()
    }

    /// The next report for the application.
    pub fn poll_event(&mut self) -> Option<SessionEvent> {
        self.events.pop_front()
    }

    /// When [`PoolUserSession::handle_timeout`] must run next.
    pub fn poll_timeout(&self) -> Option<Duration> {
        let state = match &self.state {
            State::Resolving { deadline } | State::Connecting { deadline, .. } => Some(*deadline),
            State::Waiting { until } => Some(*until),
            _ => None,
        };
        let answer = match (&self.state, self.awaiting_since, self.config.answer_timeout) {
            (State::Bound { .. }, Some(since), Some(t)) => Some(since + t),
            _ => None,
        };
        match (state, answer) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Opens the session: selects a PE (a resolution first) and connects.
    pub fn open(&mut self, now: Duration) {
        if self.state != State::Idle {
            return;
        }
        self.moving = Some(Moving {
            from: None,
            reason: FailoverReason::Requested,
            started: now,
            attempts: 0,
            tried: HashSet::new(),
        });
        self.select_next(now);
    }

    /// Sends a data message; held while the session moves to another PE (up to
    /// [`SessionConfig::max_queued`]).
    pub fn send(
        &mut self,
        now: Duration,
        ppid: u32,
        stream: u16,
        data: Vec<u8>,
    ) -> Result<(), SessionError> {
        self.send_seen(now, self.stats.failovers, ppid, stream, data)
    }

    /// Like [`PoolUserSession::send`], from an application that has seen `failovers_seen`
    /// failover notifications: with [`SessionConfig::application_resends`], a message from
    /// before the latest failover is refused ([`SessionError::FailingOver`]).
    pub fn send_seen(
        &mut self,
        now: Duration,
        failovers_seen: u64,
        ppid: u32,
        stream: u16,
        data: Vec<u8>,
    ) -> Result<(), SessionError> {
        if ppid == Protocol::Asap.ppid() {
            return Err(SessionError::ReservedPpid);
        }
        if self.config.application_resends
            && self.state != State::Ended
            && (failovers_seen < self.stats.failovers || !self.is_bound())
        {
            return Err(SessionError::FailingOver);
        }
        match self.state {
            State::Ended => Err(SessionError::Ended),
            State::Bound { .. } => {
                self.transmit_data(now, ppid, stream, data);
                Ok(())
            }
            _ => {
                if self.queue.len() >= self.config.max_queued {
                    return Err(SessionError::QueueFull(self.queue.len()));
                }
                self.queue.push_back((ppid, stream, data));
                Ok(())
            }
        }
    }

    /// Leaves the current PE for another one now (RSPLIB's `rsp_forcefailover`). In manual mode
    /// this continues a failover the session reported as necessary.
    pub fn failover(&mut self, now: Duration) {
        self.failover_because(now, FailoverReason::Requested)
    }

    /// Leaves the current PE because the application found it failing (no answer, a broken
    /// protocol): like [`PoolUserSession::failover`], but the reason is recorded and, unless it
    /// is [`FailoverReason::Requested`], the PE is reported unreachable.
    pub fn failover_because(&mut self, now: Duration, reason: FailoverReason) {
        match &self.state {
            State::FailoverPending => self.select_next(now),
            State::Bound { .. } => self.fail(now, reason),
            _ => {}
        }
    }

    /// Forgets the stored cookie: the state it holds is finished (a CalcApp job completed), so a
    /// later failover must not resume it.
    pub fn clear_cookie(&mut self) {
        self.cookie = None;
    }

    /// Ends the session: closes the association gracefully.
    pub fn close(&mut self, _now: Duration) {
        if self.state == State::Ended {
            return;
        }
        if matches!(self.state, State::Bound { .. } | State::Connecting { .. }) {
            self.actions.push_back(SessionAction::Close);
        }
        self.state = State::Ended;
        self.receipt.outcome = Some(Outcome::Closed);
    }

    /// The resolution asked for by [`SessionAction::Resolve`] came back: the PEs in the
    /// registrar's order, the pool policy, and whether it came from the resolver's cache.
    /// An empty list (unknown pool, no registrar) counts as a failed attempt.
    pub fn resolved(
        &mut self,
        now: Duration,
        result: Result<(Vec<PoolElement>, Option<PoolPolicy>), String>,
    ) {
        if !matches!(self.state, State::Resolving { .. }) {
            return;
        }
        match result {
            Ok((pes, policy)) if !pes.is_empty() => {
                let tried = self
                    .moving
                    .as_ref()
                    .map(|m| m.tried.clone())
                    .unwrap_or_default();
                let usable: Vec<PoolElement> =
                    pes.into_iter().filter(|pe| self.reachable(pe)).collect();
                let fresh: Vec<PoolElement> = usable
                    .iter()
                    .filter(|pe| !tried.contains(&pe.id))
                    .cloned()
                    .collect();
                // Only PEs already tried: try them again (one may have come back) rather than
                // giving up while attempts remain.
                self.cached = if fresh.is_empty() { usable } else { fresh };
                self.cached_policy = policy;
                if self.cached.is_empty() {
                    self.attempt_failed(now, "no PE with a usable transport".into());
                } else {
                    self.pick(now, CandidateSource::Resolution);
                }
            }
            Ok(_) => self.attempt_failed(now, "the pool has no PE".into()),
            Err(e) => self.attempt_failed(now, format!("resolution failed: {e}")),
        }
    }

    /// The association to the PE asked for by [`SessionAction::Connect`] is up.
    pub fn connected(&mut self, now: Duration) {
        let State::Connecting { pe, .. } = &self.state else {
            return;
        };
        let pe = pe.clone();
        self.stats.bound += 1;
        self.receipt.bound = Some((pe.id, now));
        self.receipt.reached = None;
        self.awaiting_since = None;
        let moving = self.moving.take();
        // RFC 5352 §3.8, RSPLIB `rsp_forcefailover`: the cookie goes first, before any data.
        let with_cookie = if let Some(c) = self.cookie.clone() {
            self.send_asap(&AsapMessage::CookieEcho(asap::CookieEcho { cookie: c }));
            true
        } else {
            false
        };
        self.echo_pending = if with_cookie { moving.clone() } else { None };
        self.state = State::Bound { pe: pe.clone() };
        match moving {
            Some(Moving {
                from: Some(from),
                reason,
                started,
                attempts,
                ..
            }) => {
                let record = FailoverRecord {
                    from,
                    to: pe.id,
                    with_cookie,
                    reason,
                    attempts,
                    started,
                    completed: now,
                };
                self.stats.failovers += 1;
                if with_cookie {
                    self.stats.failovers_with_cookie += 1;
                }
                self.receipt.failovers.push(record.clone());
                self.events.push_back(SessionEvent::Failover(record));
            }
            _ => self.events.push_back(SessionEvent::Opened { pe: pe.id }),
        }
        while let Some((ppid, stream, data)) = self.queue.pop_front() {
            self.transmit_data(now, ppid, stream, data);
        }
    }

    /// The connection asked for by [`SessionAction::Connect`] failed.
    pub fn connect_failed(&mut self, now: Duration, reason: String) {
        let State::Connecting { pe, .. } = &self.state else {
            return;
        };
        let id = pe.id;
        self.stats.connect_failures += 1;
        self.report_unreachable(id);
        self.attempt_failed(now, format!("PE {id}: {reason}"));
    }

    /// The current association went down.
    pub fn association_lost(&mut self, now: Duration, reason: String) {
        match &self.state {
            State::Bound { .. } => self.fail(now, FailoverReason::AssociationLost(reason)),
            State::Connecting { .. } => self.connect_failed(now, reason),
            _ => {}
        }
    }

    /// A message arrived on the current association.
    pub fn message(&mut self, now: Duration, ppid: u32, stream: u16, data: &[u8]) {
        let State::Bound { pe } = &self.state else {
            return;
        };
        let pe_id = pe.id;
        self.awaiting_since = None;
        if self.receipt.reached.is_none() {
            self.receipt.reached = Some((pe_id, now));
            self.stats.reached += 1;
        }
        if ppid != Protocol::Asap.ppid() {
            // The PE serves: it took the cookie.
            self.echo_pending = None;
            self.stats.messages_received += 1;
            self.events.push_back(SessionEvent::Data {
                ppid,
                stream,
                data: data.to_vec(),
            });
            return;
        }
        // The control channel (RFC 5352 §3.8): COOKIE, BUSINESS_CARD, ERROR.
        let m = match self.codec.decode::<AsapMessage>(data) {
            Ok(d) => d.message,
            Err(e) => {
                self.stats.protocol_errors += 1;
                let reason = format!("undecodable control message from PE {pe_id}: {e}");
                self.events
                    .push_back(SessionEvent::ProtocolError(reason.clone()));
                self.fail(now, FailoverReason::ProtocolError(reason));
                return;
            }
        };
        match m {
            AsapMessage::Cookie(c) => {
                if c.cookie.len() > self.config.max_cookie_size {
                    self.stats.cookies_refused += 1;
                    self.events.push_back(SessionEvent::ProtocolError(format!(
                        "cookie of {} bytes from PE {pe_id} refused (limit {})",
                        c.cookie.len(),
                        self.config.max_cookie_size
                    )));
                    return;
                }
                self.echo_pending = None;
                self.stats.cookies += 1;
                self.events.push_back(SessionEvent::Cookie {
                    len: c.cookie.len(),
                });
                self.cookie = Some(c.cookie);
            }
            AsapMessage::BusinessCard(b) => {
                self.stats.business_cards += 1;
                if b.pool_handle != self.config.pool_handle {
                    self.stats.protocol_errors += 1;
                    self.events.push_back(SessionEvent::ProtocolError(format!(
                        "business card for pool {} from PE {pe_id} ignored",
                        b.pool_handle
                    )));
                    return;
                }
                let pes: Vec<PoolElement> = b
                    .pool_elements
                    .into_iter()
                    .filter(|p| p.id != pe_id)
                    .collect();
                self.events.push_back(SessionEvent::BusinessCard {
                    pes: pes.iter().map(|p| p.id).collect(),
                });
                self.business_card = pes;
            }
            AsapMessage::Error(e) => {
                let refusal = e.error.causes.iter().any(|c| {
                    matches!(
                        c.code,
                        CauseCode::InvalidValues | CauseCode::RejectedSecurity
                    )
                });
                match self.echo_pending.take() {
                    // The answer to the cookie echo (RFC 5352 §2.2.14): the PE refused it.
                    Some(previous) if refusal => {
                        self.stats.cookies_refused_by_pe += 1;
                        let why = format!("PE {pe_id} sent ASAP_ERROR [{}]", e.error);
                        self.cookie_refused(now, previous, why);
                    }
                    pending => {
                        self.echo_pending = pending;
                        self.stats.protocol_errors += 1;
                        self.events.push_back(SessionEvent::ProtocolError(format!(
                            "PE {pe_id} sent ASAP_ERROR [{}]",
                            e.error
                        )));
                    }
                }
            }
            other => {
                self.stats.protocol_errors += 1;
                self.events.push_back(SessionEvent::ProtocolError(format!(
                    "unexpected {} from PE {pe_id} ignored",
                    other.name()
                )));
            }
        }
    }

    /// Runs what is due: answer timeout, connect or resolution timeout, end of a back-off.
    pub fn handle_timeout(&mut self, now: Duration) {
        match self.state.clone() {
            State::Bound { .. } => {
                if let (Some(since), Some(t)) = (self.awaiting_since, self.config.answer_timeout) {
                    if since + t <= now {
                        self.fail(now, FailoverReason::NoAnswer);
                    }
                }
            }
            State::Connecting { deadline, .. } if deadline <= now => {
                self.actions.push_back(SessionAction::Abort);
                self.connect_failed(now, "connect timeout".into());
            }
            State::Resolving { deadline } if deadline <= now => {
                self.attempt_failed(now, "resolution timeout".into())
            }
            State::Waiting { until } if until <= now => self.select_next(now),
            _ => {}
        }
    }

    fn reachable(&self, pe: &PoolElement) -> bool {
        match (self.config.transport, pe.user_transport.as_address()) {
            (_, None) => false,
            (None, Some(_)) => true,
            (Some(p), Some(t)) => t.protocol == p && t.port != 0,
        }
    }

    fn transmit_data(&mut self, now: Duration, ppid: u32, stream: u16, data: Vec<u8>) {
        self.stats.messages_sent += 1;
        if self.awaiting_since.is_none() {
            self.awaiting_since = Some(now);
        }
        self.actions
            .push_back(SessionAction::Transmit { ppid, stream, data });
    }

    fn send_asap(&mut self, m: &AsapMessage) {
        match self.codec.encode(m) {
            Ok(data) => self.actions.push_back(SessionAction::Transmit {
                ppid: Protocol::Asap.ppid(),
                stream: 0,
                data,
            }),
            Err(e) => self.events.push_back(SessionEvent::ProtocolError(format!(
                "cannot encode {}: {e}",
                m.name()
            ))),
        }
    }

    fn report_unreachable(&mut self, pe: PoolElementId) {
        self.stats.unreachable_reported += 1;
        self.actions.push_back(SessionAction::ReportUnreachable(
            self.config.pool_handle.clone(),
            pe,
        ));
    }

    /// The bound PE failed (or is left on request): start a failover.
    fn fail(&mut self, now: Duration, reason: FailoverReason) {
        let State::Bound { pe } = &self.state else {
            return;
        };
        let from = pe.id;
        self.echo_pending = None;
        self.actions.push_back(SessionAction::Abort);
        if reason.pe_failed() {
            self.report_unreachable(from);
        }
        self.awaiting_since = None;
        self.receipt.bound = None;
        self.receipt.reached = None;
        self.business_card.retain(|p| p.id != from);
        self.cached.retain(|p| p.id != from);
        let mut tried = HashSet::new();
        tried.insert(from);
        self.moving = Some(Moving {
            from: Some(from),
            reason: reason.clone(),
            started: now,
            attempts: 0,
            tried,
        });
        if self.config.auto_failover || !reason.pe_failed() {
            self.events.push_back(SessionEvent::FailoverStarted {
                from,
                reason,
                has_cookie: self.cookie.is_some(),
            });
            self.select_next(now);
        } else {
            self.state = State::FailoverPending;
            self.events.push_back(SessionEvent::FailoverNecessary {
                from,
                reason,
                has_cookie: self.cookie.is_some(),
            });
        }
    }

    /// The bound PE refused the cookie echoed to it: leave it (nobody is reported) and go on
    /// with the failover that brought the session here, this PE counted as one more failed
    /// attempt of it.
    fn cookie_refused(&mut self, now: Duration, previous: Moving, why: String) {
        let State::Bound { pe } = &self.state else {
            return;
        };
        let from = pe.id;
        self.actions.push_back(SessionAction::Abort);
        self.awaiting_since = None;
        self.receipt.bound = None;
        self.receipt.reached = None;
        self.business_card.retain(|p| p.id != from);
        self.cached.retain(|p| p.id != from);
        let reason = FailoverReason::CookieRefused(why.clone());
        let mut tried = previous.tried;
        tried.insert(from);
        self.moving = Some(Moving {
            from: Some(from),
            reason: reason.clone(),
            started: now,
            attempts: previous.attempts,
            tried,
        });
        self.events.push_back(SessionEvent::FailoverStarted {
            from,
            reason,
            has_cookie: self.cookie.is_some(),
        });
        self.state = State::Waiting { until: now };
        self.attempt_failed(now, why);
    }

    fn attempt_failed(&mut self, now: Duration, why: String) {
        let Some(m) = self.moving.as_mut() else {
            return;
        };
        m.attempts += 1;
        if m.attempts >= self.config.max_attempts {
            let reason = format!("gave up after {} attempt(s): {why}", m.attempts);
            self.state = State::Ended;
            self.receipt.outcome = Some(Outcome::Failed {
                reason: reason.clone(),
            });
            self.queue.clear();
            self.events.push_back(SessionEvent::Failed { reason });
            return;
        }
        if !self.business_card.is_empty() || !self.cached.is_empty() {
            // Another known candidate: try it at once.
            self.select_next(now);
            return;
        }
        let shift = (m.attempts - 1).min(16);
        let pause = self
            .config
            .backoff_initial
            .saturating_mul(1 << shift)
            .min(self.config.backoff_max);
        self.state = State::Waiting { until: now + pause };
    }

    /// Picks the next candidate: business card, then what is left of the last resolution, then
    /// a new resolution.
    fn select_next(&mut self, now: Duration) {
        if !self.business_card.is_empty() {
            self.pick(now, CandidateSource::BusinessCard);
        } else if !self.cached.is_empty() {
            self.pick(now, CandidateSource::Cache);
        } else {
            self.state = State::Resolving {
                deadline: now + self.config.connect_timeout,
            };
            self.actions
                .push_back(SessionAction::Resolve(self.config.pool_handle.clone()));
        }
    }

    fn pick(&mut self, now: Duration, source: CandidateSource) {
        let list = match source {
            CandidateSource::BusinessCard => &mut self.business_card,
            _ => &mut self.cached,
        };
        let candidates: Vec<PoolElementId> = list.iter().map(|p| p.id).collect();
        let pe = list.remove(0);
        let pool_policy = match source {
            CandidateSource::BusinessCard => None,
            _ => self.cached_policy.clone(),
        };
        if let Some(m) = self.moving.as_mut() {
            m.tried.insert(pe.id);
        }
        self.stats.selected += 1;
        self.receipt.selections.push(Selection {
            pe: pe.id,
            source,
            pool_policy,
            pe_policy: pe.policy.clone(),
            candidates,
            at: now,
        });
        self.state = State::Connecting {
            pe: pe.clone(),
            deadline: now + self.config.connect_timeout,
        };
        self.actions.push_back(SessionAction::Connect(pe));
    }
}
