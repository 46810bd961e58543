//! PingPong (PPID 33): the pool user sends numbered Pings, the pool element answers each with a
//! Pong carrying its own reply counter and sends a cookie with the next reply number after every
//! Pong, so the counter continues on another pool element after a failover. Byte-exact with
//! RSPLIB's `pingpongpackets.h`, `rspserver -pingpong` and `pingpongclient`.
//!
//! ```text
//! Ping:   Type=1 u8 | Flags u8 | Length u16 | MessageNo u64 | Data
//! Pong:   Type=2 u8 | Flags u8 | Length u16 | MessageNo u64 | ReplyNo u64 | Data
//! Cookie: "<PP-TD1>" (8 bytes) | ReplyNo u64 (the next reply number)
//! ```
//! Integers are big-endian; Length covers the whole message.

use crate::cookie::{CookieSeal, PlainSeal, SealContext};
use crate::error::{DecodeError, DecodeErrorKind, EncodeError, ServiceError};
use crate::{
    AbortReason, ClientOutput, ClientReport, ClientService, CookieRefused, FailoverReason, Now,
    ServerOutput, ServerReport, ServerService, ServiceKind, SessionId, SessionInfo, PPID_PINGPONG,
};
use serde::Deserialize;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

/// Message type of a Ping.
pub const TYPE_PING: u8 = 0x01;
/// Message type of a Pong.
pub const TYPE_PONG: u8 = 0x02;
/// Tag at the start of a PingPong cookie.
pub const COOKIE_TAG: &[u8; 8] = b"<PP-TD1>";
/// Size of a PingPong cookie.
pub const COOKIE_LEN: usize = 16;
/// Size of a Ping without data.
pub const PING_HEADER_LEN: usize = 12;
/// Size of a Pong without data.
pub const PONG_HEADER_LEN: usize = 20;

/// A Ping: pool user to pool element.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ping {
    /// Flags (RSPLIB sends 0).
    pub flags: u8,
    /// The pool user's message number.
    pub message_no: u64,
    /// Payload, echoed in the Pong (pingpongclient: "Nachricht: N, Zeitstempel: T").
    pub data: Vec<u8>,
}

/// A Pong: the pool element's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pong {
    /// Flags (RSPLIB sends 0).
    pub flags: u8,
    /// The Ping's message number.
    pub message_no: u64,
    /// The pool element's reply counter (1 for the first reply of a session, continued from
    /// the cookie after a failover).
    pub reply_no: u64,
    /// The Ping's payload.
    pub data: Vec<u8>,
}

/// A PingPong message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PingPongMessage {
    /// Type 1.
    Ping(Ping),
    /// Type 2.
    Pong(Pong),
}

fn be_u64(b: &[u8], at: usize) -> u64 {
    let mut a = [0; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_be_bytes(a)
}

impl PingPongMessage {
    /// Decodes one message (the whole SCTP message or TCP frame).
    pub fn decode(bytes: &[u8]) -> Result<Self, DecodeError> {
        const M: &str = "PingPong message";
        if bytes.len() < 4 {
            return Err(DecodeError::truncated(M, "header", 4, bytes.len()));
        }
        let (kind, flags) = (bytes[0], bytes[1]);
        let length = usize::from(u16::from_be_bytes([bytes[2], bytes[3]]));
        let (name, min) = match kind {
            TYPE_PING => ("Ping", PING_HEADER_LEN),
            TYPE_PONG => ("Pong", PONG_HEADER_LEN),
            other => {
                return Err(DecodeError::new(
                    M,
                    "Type",
                    DecodeErrorKind::UnknownType(other),
                ))
            }
        };
        if length != bytes.len() {
            return Err(DecodeError::new(
                name,
                "Length",
                DecodeErrorKind::LengthMismatch {
                    declared: length,
                    actual: bytes.len(),
                },
            ));
        }
        if bytes.len() < 12 {
            return Err(DecodeError::truncated(name, "MessageNo", 12, bytes.len()));
        }
        let message_no = be_u64(bytes, 4);
        if kind == TYPE_PING {
            return Ok(Self::Ping(Ping {
                flags,
                message_no,
                data: bytes[min..].to_vec(),
            }));
        }
        if bytes.len() < min {
            return Err(DecodeError::truncated(name, "ReplyNo", min, bytes.len()));
        }
        Ok(Self::Pong(Pong {
            flags,
            message_no,
            reply_no: be_u64(bytes, 12),
            data: bytes[min..].to_vec(),
        }))
    }

    /// Encodes the message; fails only when it exceeds the 16-bit length field.
    pub fn encode(&self) -> Result<Vec<u8>, EncodeError> {
        let (kind, flags, header, data, name) = match self {
            Self::Ping(p) => (TYPE_PING, p.flags, PING_HEADER_LEN, &p.data, "Ping"),
            Self::Pong(p) => (TYPE_PONG, p.flags, PONG_HEADER_LEN, &p.data, "Pong"),
        };
        let size = header + data.len();
        let length = u16::try_from(size).map_err(|_| EncodeError::TooLong {
            message: name,
            size,
            max: usize::from(u16::MAX),
        })?;
        let mut out = Vec::with_capacity(size);
        out.push(kind);
        out.push(flags);
        out.extend_from_slice(&length.to_be_bytes());
        match self {
            Self::Ping(p) => out.extend_from_slice(&p.message_no.to_be_bytes()),
            Self::Pong(p) => {
                out.extend_from_slice(&p.message_no.to_be_bytes());
                out.extend_from_slice(&p.reply_no.to_be_bytes());
            }
        }
        out.extend_from_slice(data);
        Ok(out)
    }
}

/// RSPLIB's PingPong cookie: the next reply number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PingPongCookie {
    /// The reply number the next Pong carries.
    pub reply_no: u64,
}

impl PingPongCookie {
    /// Decodes the 16-byte cookie (tag `<PP-TD1>`, then ReplyNo).
    pub fn decode(bytes: &[u8]) -> Result<Self, DecodeError> {
        const M: &str = "PingPong cookie";
        if bytes.len() != COOKIE_LEN {
            return Err(DecodeError::new(
                M,
                "size",
                DecodeErrorKind::LengthMismatch {
                    declared: COOKIE_LEN,
                    actual: bytes.len(),
                },
            ));
        }
        if &bytes[..8] != COOKIE_TAG {
            return Err(DecodeError::new(
                M,
                "ID",
                DecodeErrorKind::BadTag(bytes[..8].to_vec()),
            ));
        }
        Ok(Self {
            reply_no: be_u64(bytes, 8),
        })
    }

    /// Encodes the 16-byte cookie.
    pub fn encode(&self) -> [u8; COOKIE_LEN] {
        let mut out = [0; COOKIE_LEN];
        out[..8].copy_from_slice(COOKIE_TAG);
        out[8..].copy_from_slice(&self.reply_no.to_be_bytes());
        out
    }
}

/// Settings of the PingPong pool element.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "kebab-case")]
pub struct PingPongServerConfig {
    /// Abort a session after this many replies, to exercise failover (RSPLIB
    /// `-pppfailureafter`; 0 = never).
    pub failure_after: u64,
    /// Largest Ping accepted, in bytes (the 16-bit length field allows 65535).
    pub max_message_size: usize,
}

impl Default for PingPongServerConfig {
    fn default() -> Self {
        Self {
            failure_after: 0,
            max_message_size: usize::from(u16::MAX),
        }
    }
}

#[derive(Debug)]
struct PingPongSession {
    reply_no: u64,
    replies: u64,
    identity: Option<Vec<u8>>,
}

/// The PingPong pool element (RSPLIB `rspserver -pingpong`): answers each Ping with a Pong and
/// sends a cookie with the next reply number after each Pong. A message that is not a valid Ping
/// aborts the session, as in RSPLIB; so does a cookie echo that is refused.
#[derive(Debug)]
pub struct PingPongServer {
    config: PingPongServerConfig,
    seal: Arc<dyn CookieSeal>,
    sessions: HashMap<SessionId, PingPongSession>,
    out: VecDeque<ServerOutput>,
}

impl PingPongServer {
    /// A PingPong pool element with RSPLIB's plain cookies.
    pub fn new(config: PingPongServerConfig) -> Self {
        Self::with_seal(config, Arc::new(PlainSeal::default()))
    }

    /// A PingPong pool element sealing its cookies with `seal`.
    pub fn with_seal(config: PingPongServerConfig, seal: Arc<dyn CookieSeal>) -> Self {
        Self {
            config,
            seal,
            sessions: HashMap::new(),
            out: VecDeque::new(),
        }
    }

    fn abort(&mut self, session: SessionId, reason: AbortReason) {
        self.out.push_back(ServerOutput::Abort { session, reason });
    }

    /// The reply number the next Pong of `session` will carry.
    pub fn next_reply_no(&self, session: SessionId) -> Option<u64> {
        self.sessions.get(&session).map(|s| s.reply_no)
    }
}

impl ServerService for PingPongServer {
    fn kind(&self) -> ServiceKind {
        ServiceKind::PingPong
    }

    fn open_session(&mut self, _now: Now, session: SessionId, info: SessionInfo) {
        self.sessions.insert(
            session,
            PingPongSession {
                reply_no: 1,
                replies: 0,
                identity: info.identity,
            },
        );
    }

    fn handle_message(
        &mut self,
        now: Now,
        session: SessionId,
        ppid: u32,
        stream: u16,
        data: &[u8],
    ) -> Result<(), ServiceError> {
        if !self.sessions.contains_key(&session) {
            return Err(ServiceError::UnknownSession(session));
        }
        let result = if data.len() > self.config.max_message_size {
            Err(ServiceError::TooLarge {
                size: data.len(),
                limit: self.config.max_message_size,
            })
        } else if ppid != PPID_PINGPONG {
            Err(ServiceError::WrongPpid {
                ppid,
                expected: PPID_PINGPONG,
            })
        } else {
            match PingPongMessage::decode(data) {
                Ok(PingPongMessage::Ping(ping)) => Ok(ping),
                Ok(PingPongMessage::Pong(_)) => Err(DecodeError::new(
                    "PingPong message",
                    "Type",
                    DecodeErrorKind::UnexpectedType(TYPE_PONG),
                )
                .into()),
                Err(e) => Err(e.into()),
            }
        };
        let ping = match result {
            Ok(ping) => ping,
            Err(e) => {
                self.abort(session, AbortReason::Protocol(e.clone()));
                return Err(e);
            }
        };
        let s = self.sessions.get_mut(&session).expect("checked above");
        let reply_no = s.reply_no;
        let pong = PingPongMessage::Pong(Pong {
            flags: 0,
            message_no: ping.message_no,
            reply_no,
            data: ping.data,
        });
        // A Ping that fits the length field always yields a Pong 8 bytes longer; refuse the rare
        // Ping whose Pong would not fit rather than truncating.
        let Ok(pong) = pong.encode() else {
            let e = ServiceError::TooLarge {
                size: data.len() + 8,
                limit: usize::from(u16::MAX),
            };
            self.abort(session, AbortReason::Protocol(e.clone()));
            return Err(e);
        };
        s.reply_no += 1;
        s.replies += 1;
        let cookie = PingPongCookie {
            reply_no: s.reply_no,
        }
        .encode();
        let sealed = self.seal.seal(
            &SealContext {
                service: ServiceKind::PingPong.name(),
                identity: s.identity.as_deref(),
                unix_now: now.unix,
            },
            &cookie,
        );
        let replies = s.replies;
        self.out.push_back(ServerOutput::Send {
            session,
            ppid: PPID_PINGPONG,
            stream,
            data: pong,
        });
        self.out.push_back(ServerOutput::Cookie {
            session,
            cookie: sealed,
        });
        self.out.push_back(ServerOutput::Report(ServerReport::Pong {
            session,
            message_no: ping.message_no,
            reply_no,
        }));
        if self.config.failure_after > 0 && replies >= self.config.failure_after {
            self.abort(session, AbortReason::FailureTester(replies));
        }
        Ok(())
    }

    fn handle_cookie_echo(
        &mut self,
        now: Now,
        session: SessionId,
        cookie: &[u8],
    ) -> Result<(), CookieRefused> {
        let Some(s) = self.sessions.get_mut(&session) else {
            return Err(CookieRefused::UnknownSession(session));
        };
        let context = SealContext {
            service: ServiceKind::PingPong.name(),
            identity: s.identity.as_deref(),
            unix_now: now.unix,
        };
        let result = self
            .seal
            .open(&context, cookie)
            .map_err(CookieRefused::from)
            .and_then(|payload| PingPongCookie::decode(&payload).map_err(CookieRefused::from))
            .and_then(|c| {
                if c.reply_no == 0 {
                    Err(CookieRefused::Invalid(
                        "ReplyNo 0 (reply numbers start at 1)",
                    ))
                } else {
                    Ok(c)
                }
            });
        match result {
            Ok(c) => {
                s.reply_no = c.reply_no;
                self.out
                    .push_back(ServerOutput::Report(ServerReport::Restored {
                        session,
                        state: format!("next reply #{}", c.reply_no),
                    }));
                Ok(())
            }
            Err(e) => {
                self.abort(session, AbortReason::Cookie(e.clone()));
                Err(e)
            }
        }
    }

    fn close_session(&mut self, _now: Now, session: SessionId) {
        self.sessions.remove(&session);
    }

    fn poll_output(&mut self) -> Option<ServerOutput> {
        self.out.pop_front()
    }

    fn sessions(&self) -> usize {
        self.sessions.len()
    }
}

/// Settings of the PingPong pool user.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "kebab-case")]
pub struct PingPongClientConfig {
    /// Time between Pings (pingpongclient `-interval`, default 500 ms).
    #[serde(with = "humantime_serde")]
    pub interval: Duration,
    /// Ask for a failover when the oldest outstanding Ping has had no Pong for this long.
    #[serde(with = "humantime_serde")]
    pub reply_timeout: Duration,
    /// Send no new Ping while this many are unanswered.
    pub max_outstanding: usize,
    /// Stop after this many Pings were answered (`None`: run until stopped).
    pub count: Option<u64>,
    /// Payload size limit for Pongs accepted, in bytes.
    pub max_message_size: usize,
}

impl Default for PingPongClientConfig {
    fn default() -> Self {
        Self {
            interval: Duration::from_millis(500),
            reply_timeout: Duration::from_secs(5),
            max_outstanding: 16,
            count: None,
            max_message_size: usize::from(u16::MAX),
        }
    }
}

#[derive(Debug)]
struct Outstanding {
    data: Vec<u8>,
    sent_at: Duration,
}

/// Counters of the PingPong pool user: requests and answers counted separately.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PingPongCounters {
    /// Pings sent for the first time.
    pub pings: u64,
    /// Pings sent again after a failover.
    pub resent: u64,
    /// Pongs that answered an outstanding Ping.
    pub answered: u64,
    /// Pongs for a Ping already answered or never sent.
    pub duplicates: u64,
    /// Reply numbers that did not follow the previous one.
    pub gaps: u64,
    /// Failovers completed.
    pub failovers: u64,
}

/// The PingPong pool user (RSPLIB `pingpongclient`): a Ping every interval, each Pong matched to
/// its Ping, gaps in the reply numbers reported; after a failover every unanswered Ping is sent
/// again, so no Ping is lost, and a second Pong for one Ping is reported, not counted twice.
#[derive(Debug)]
pub struct PingPongClient {
    config: PingPongClientConfig,
    next_message_no: u64,
    last_reply_no: u64,
    outstanding: BTreeMap<u64, Outstanding>,
    next_ping_at: Option<Duration>,
    failing_over: bool,
    finished: bool,
    counters: PingPongCounters,
    out: VecDeque<ClientOutput>,
}

impl PingPongClient {
    /// A PingPong pool user.
    pub fn new(config: PingPongClientConfig) -> Self {
        Self {
            config,
            next_message_no: 1,
            last_reply_no: 0,
            outstanding: BTreeMap::new(),
            next_ping_at: None,
            failing_over: false,
            finished: false,
            counters: PingPongCounters::default(),
            out: VecDeque::new(),
        }
    }

    /// What was sent and answered so far.
    pub fn counters(&self) -> PingPongCounters {
        self.counters
    }

    /// Message numbers sent and not yet answered.
    pub fn outstanding(&self) -> impl Iterator<Item = u64> + '_ {
        self.outstanding.keys().copied()
    }

    fn send_ping(&mut self, now: Now) {
        let message_no = self.next_message_no;
        self.next_message_no += 1;
        let data = format!(
            "Nachricht: {}, Zeitstempel: {}",
            message_no,
            now.unix.as_micros()
        )
        .into_bytes();
        let ping = PingPongMessage::Ping(Ping {
            flags: 0,
            message_no,
            data: data.clone(),
        });
        self.out.push_back(ClientOutput::Send {
            ppid: PPID_PINGPONG,
            stream: 0,
            data: ping.encode().expect("a short Ping fits"),
        });
        self.out
            .push_back(ClientOutput::Report(ClientReport::PingSent {
                message_no,
                resent: false,
            }));
        self.outstanding.insert(
            message_no,
            Outstanding {
                data,
                sent_at: now.monotonic,
            },
        );
        self.counters.pings += 1;
    }

    fn done(&self) -> bool {
        self.config
            .count
            .is_some_and(|count| self.counters.answered >= count)
    }

    fn may_send_more(&self) -> bool {
        let sent = self.next_message_no - 1;
        !self.failing_over
            && self.outstanding.len() < self.config.max_outstanding
            && self.config.count.is_none_or(|count| sent < count)
    }
}

impl ClientService for PingPongClient {
    fn kind(&self) -> ServiceKind {
        ServiceKind::PingPong
    }

    fn start(&mut self, now: Now) {
        self.next_ping_at = Some(now.monotonic);
        self.handle_timeout(now);
    }

    fn handle_message(
        &mut self,
        now: Now,
        ppid: u32,
        _stream: u16,
        data: &[u8],
    ) -> Result<(), ServiceError> {
        let error = if data.len() > self.config.max_message_size {
            Some(ServiceError::TooLarge {
                size: data.len(),
                limit: self.config.max_message_size,
            })
        } else if ppid != PPID_PINGPONG {
            Some(ServiceError::WrongPpid {
                ppid,
                expected: PPID_PINGPONG,
            })
        } else {
            None
        };
        let pong = match error
            .map(Err)
            .unwrap_or_else(|| match PingPongMessage::decode(data) {
                Ok(PingPongMessage::Pong(p)) => Ok(p),
                Ok(PingPongMessage::Ping(_)) => Err(DecodeError::new(
                    "PingPong message",
                    "Type",
                    DecodeErrorKind::UnexpectedType(TYPE_PING),
                )
                .into()),
                Err(e) => Err(e.into()),
            }) {
            Ok(p) => p,
            Err(e) => {
                // A PE that answers garbage is not serving us: move on.
                self.out
                    .push_back(ClientOutput::Report(ClientReport::Ignored(e.clone())));
                if !self.failing_over {
                    self.failing_over = true;
                    self.out
                        .push_back(ClientOutput::Failover(FailoverReason::ProtocolError));
                }
                return Err(e);
            }
        };
        let Some(sent) = self.outstanding.remove(&pong.message_no) else {
            self.counters.duplicates += 1;
            self.out
                .push_back(ClientOutput::Report(ClientReport::DuplicatePong {
                    message_no: pong.message_no,
                }));
            return Ok(());
        };
        self.counters.answered += 1;
        self.out.push_back(ClientOutput::Report(ClientReport::Pong {
            message_no: pong.message_no,
            reply_no: pong.reply_no,
            rtt: now.monotonic.saturating_sub(sent.sent_at),
        }));
        if pong.reply_no.wrapping_sub(self.last_reply_no) != 1 {
            self.counters.gaps += 1;
            self.out.push_back(ClientOutput::Report(ClientReport::Gap {
                previous: self.last_reply_no,
                reply_no: pong.reply_no,
            }));
        }
        self.last_reply_no = pong.reply_no;
        if self.done() && !self.finished {
            self.finished = true;
            self.next_ping_at = None;
            self.out.push_back(ClientOutput::Finished);
        }
        Ok(())
    }

    fn failover_complete(&mut self, now: Now, _cookie_echoed: bool) {
        self.failing_over = false;
        self.counters.failovers += 1;
        // Resend every unanswered Ping, oldest first, to the new PE.
        let numbers: Vec<u64> = self.outstanding.keys().copied().collect();
        for message_no in numbers {
            let entry = self.outstanding.get_mut(&message_no).expect("listed");
            entry.sent_at = now.monotonic;
            let ping = PingPongMessage::Ping(Ping {
                flags: 0,
                message_no,
                data: entry.data.clone(),
            });
            self.out.push_back(ClientOutput::Send {
                ppid: PPID_PINGPONG,
                stream: 0,
                data: ping.encode().expect("a short Ping fits"),
            });
            self.out
                .push_back(ClientOutput::Report(ClientReport::PingSent {
                    message_no,
                    resent: true,
                }));
            self.counters.resent += 1;
        }
        if !self.finished && self.next_ping_at.is_none() {
            self.next_ping_at = Some(now.monotonic.saturating_add(self.config.interval));
        }
    }

    fn poll_timeout(&self) -> Option<Duration> {
        if self.finished {
            return None;
        }
        let reply_deadline = (!self.failing_over)
            .then(|| {
                self.outstanding
                    .values()
                    .map(|o| o.sent_at.saturating_add(self.config.reply_timeout))
                    .min()
            })
            .flatten();
        [self.next_ping_at, reply_deadline]
            .into_iter()
            .flatten()
            .min()
    }

    fn handle_timeout(&mut self, now: Now) {
        if self.finished {
            return;
        }
        if !self.failing_over
            && self
                .outstanding
                .values()
                .any(|o| now.monotonic >= o.sent_at.saturating_add(self.config.reply_timeout))
        {
            self.failing_over = true;
            self.out
                .push_back(ClientOutput::Failover(FailoverReason::NoAnswer));
        }
        if let Some(at) = self.next_ping_at {
            if now.monotonic >= at {
                if self.may_send_more() {
                    self.send_ping(now);
                }
                self.next_ping_at = Some(now.monotonic.saturating_add(self.config.interval));
            }
        }
    }

    fn poll_output(&mut self) -> Option<ClientOutput> {
        self.out.pop_front()
    }
}

impl fmt::Display for Ping {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Ping #{} ({} bytes)", self.message_no, self.data.len())
    }
}

impl fmt::Display for Pong {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Pong #{} reply #{} ({} bytes)",
            self.message_no,
            self.reply_no,
            self.data.len()
        )
    }
}
