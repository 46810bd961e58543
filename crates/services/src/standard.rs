//! RSPLIB's standard services of `rspserver`: Echo (the default), Discard, Daytime and CharGen.
//! None of them keeps state in cookies; RSPLIB sends Daytime and CharGen data with PPID 0 and
//! echoes with the PPID and stream each message arrived on.

use crate::error::ServiceError;
use crate::time::daytime_line;
use crate::{CookieRefused, Now, ServerOutput, ServerService, ServiceKind, SessionId, SessionInfo};
use serde::Deserialize;
use std::collections::{HashSet, VecDeque};

/// Echo: every message goes back unchanged, with the PPID and stream it came on.
#[derive(Debug, Default)]
pub struct EchoServer {
    sessions: HashSet<SessionId>,
    out: VecDeque<ServerOutput>,
    /// Messages echoed.
    pub echoed: u64,
}

impl EchoServer {
    /// An Echo pool element.
    pub fn new() -> Self {
        Self::default()
    }
}

fn no_cookies(sessions: &HashSet<SessionId>, session: SessionId) -> Result<(), CookieRefused> {
    if sessions.contains(&session) {
        Err(CookieRefused::NotSupported)
    } else {
        Err(CookieRefused::UnknownSession(session))
    }
}

/// The data of a session this service does not know is refused (never served).
fn known(sessions: &HashSet<SessionId>, session: SessionId) -> Result<(), ServiceError> {
    if sessions.contains(&session) {
        Ok(())
    } else {
        Err(ServiceError::UnknownSession(session))
    }
}

impl ServerService for EchoServer {
    fn kind(&self) -> ServiceKind {
        ServiceKind::Echo
    }
    fn open_session(&mut self, _now: Now, session: SessionId, _info: SessionInfo) {
        self.sessions.insert(session);
    }
    fn handle_message(
        &mut self,
        _now: Now,
        session: SessionId,
        ppid: u32,
        stream: u16,
        data: &[u8],
    ) -> Result<(), ServiceError> {
        known(&self.sessions, session)?;
        self.echoed += 1;
        self.out.push_back(ServerOutput::Send {
            session,
            ppid,
            stream,
            data: data.to_vec(),
        });
        Ok(())
    }
    fn handle_cookie_echo(
        &mut self,
        _now: Now,
        session: SessionId,
        _cookie: &[u8],
    ) -> Result<(), CookieRefused> {
        // A cookie echo to a stateless service is harmless: nothing to restore, keep serving.
        no_cookies(&self.sessions, session)
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

/// Discard: every message is counted and dropped.
#[derive(Debug, Default)]
pub struct DiscardServer {
    sessions: HashSet<SessionId>,
    /// Messages discarded.
    pub messages: u64,
    /// Bytes discarded.
    pub bytes: u64,
}

impl DiscardServer {
    /// A Discard pool element.
    pub fn new() -> Self {
        Self::default()
    }
}

impl ServerService for DiscardServer {
    fn kind(&self) -> ServiceKind {
        ServiceKind::Discard
    }
    fn open_session(&mut self, _now: Now, session: SessionId, _info: SessionInfo) {
        self.sessions.insert(session);
    }
    fn handle_message(
        &mut self,
        _now: Now,
        session: SessionId,
        _ppid: u32,
        _stream: u16,
        data: &[u8],
    ) -> Result<(), ServiceError> {
        known(&self.sessions, session)?;
        self.messages += 1;
        self.bytes += data.len() as u64;
        Ok(())
    }
    fn handle_cookie_echo(
        &mut self,
        _now: Now,
        session: SessionId,
        _cookie: &[u8],
    ) -> Result<(), CookieRefused> {
        no_cookies(&self.sessions, session)
    }
    fn close_session(&mut self, _now: Now, session: SessionId) {
        self.sessions.remove(&session);
    }
    fn poll_output(&mut self) -> Option<ServerOutput> {
        None
    }
    fn sessions(&self) -> usize {
        self.sessions.len()
    }
}

/// Settings of the Daytime pool element.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "kebab-case")]
pub struct DaytimeConfig {
    /// Offset of the time zone to print in, seconds east of UTC (RSPLIB prints local time; the
    /// driver passes the local offset, 0 prints UTC).
    pub utc_offset_secs: i32,
}

/// Daytime: on a new session, one line of the current time with PPID 0, then a graceful close.
#[derive(Debug, Default)]
pub struct DaytimeServer {
    config: DaytimeConfig,
    sessions: HashSet<SessionId>,
    out: VecDeque<ServerOutput>,
}

impl DaytimeServer {
    /// A Daytime pool element.
    pub fn new(config: DaytimeConfig) -> Self {
        Self {
            config,
            ..Self::default()
        }
    }
}

impl ServerService for DaytimeServer {
    fn kind(&self) -> ServiceKind {
        ServiceKind::Daytime
    }
    fn open_session(&mut self, now: Now, session: SessionId, _info: SessionInfo) {
        self.sessions.insert(session);
        self.out.push_back(ServerOutput::Send {
            session,
            ppid: 0,
            stream: 0,
            data: daytime_line(now.unix, self.config.utc_offset_secs).into_bytes(),
        });
        self.out.push_back(ServerOutput::Shutdown { session });
    }
    fn handle_message(
        &mut self,
        _now: Now,
        session: SessionId,
        _ppid: u32,
        _stream: u16,
        _data: &[u8],
    ) -> Result<(), ServiceError> {
        known(&self.sessions, session)?;
        // RSPLIB ignores whatever a Daytime client sends.
        Ok(())
    }
    fn handle_cookie_echo(
        &mut self,
        _now: Now,
        session: SessionId,
        _cookie: &[u8],
    ) -> Result<(), CookieRefused> {
        no_cookies(&self.sessions, session)
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

/// Settings of the CharGen pool element.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "kebab-case")]
pub struct CharGenConfig {
    /// Bytes per message (RSPLIB: 1024).
    pub message_size: usize,
    /// Messages queued per [`ServerService::writable`] call (and on session start).
    pub burst: usize,
}

impl Default for CharGenConfig {
    fn default() -> Self {
        Self {
            message_size: 1024,
            burst: 4,
        }
    }
}

/// CharGen: as long as the session can take data, messages whose byte i is `30 + i mod 98`, with
/// PPID 0. The session layer calls [`ServerService::writable`] whenever the session's send
/// buffer has drained; each call queues one burst.
#[derive(Debug)]
pub struct CharGenServer {
    config: CharGenConfig,
    pattern: Vec<u8>,
    sessions: HashSet<SessionId>,
    out: VecDeque<ServerOutput>,
    /// Messages generated.
    pub messages: u64,
}

impl CharGenServer {
    /// A CharGen pool element.
    pub fn new(config: CharGenConfig) -> Self {
        let pattern = (0..config.message_size)
            .map(|i| (30 + i % 98) as u8)
            .collect();
        Self {
            config,
            pattern,
            sessions: HashSet::new(),
            out: VecDeque::new(),
            messages: 0,
        }
    }

    fn burst(&mut self, session: SessionId) {
        for _ in 0..self.config.burst.max(1) {
            self.messages += 1;
            self.out.push_back(ServerOutput::Send {
                session,
                ppid: 0,
                stream: 0,
                data: self.pattern.clone(),
            });
        }
    }
}

impl ServerService for CharGenServer {
    fn kind(&self) -> ServiceKind {
        ServiceKind::CharGen
    }
    fn open_session(&mut self, _now: Now, session: SessionId, _info: SessionInfo) {
        self.sessions.insert(session);
        self.burst(session);
    }
    fn handle_message(
        &mut self,
        _now: Now,
        session: SessionId,
        _ppid: u32,
        _stream: u16,
        _data: &[u8],
    ) -> Result<(), ServiceError> {
        known(&self.sessions, session)?;
        Ok(())
    }
    fn handle_cookie_echo(
        &mut self,
        _now: Now,
        session: SessionId,
        _cookie: &[u8],
    ) -> Result<(), CookieRefused> {
        no_cookies(&self.sessions, session)
    }
    fn writable(&mut self, _now: Now, session: SessionId) {
        if self.sessions.contains(&session) {
            self.burst(session);
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
