//! CalcApp (PPID 34): a pool user hands a pool element jobs of N "calculations"; the pool
//! element shares its capacity equally among its running jobs (processor sharing), watches each
//! pool user with keep-alives, sends cookies with each job's progress, and reports Complete.
//! After a failover the next pool element resumes the job from the cookie. Byte-exact with
//! RSPLIB's `calcapppackets.h`, `rspserver -calcapp` and `calcappclient`.
//!
//! ```text
//! Message (24 bytes): Type u8 | Flags u8 | Length u16 (=24) | JobID u32 | JobSize u64 | Completed u64
//! Cookie  (20 bytes): JobID u32 | JobSize u64 | Completed u64
//! ```
//! Integers are big-endian. Request fills JobID and JobSize; Accept, Reject, KeepAlive and
//! KeepAliveAck fill JobID only; Complete fills all three.

use crate::cookie::{CookieSeal, PlainSeal, SealContext};
use crate::error::{DecodeError, DecodeErrorKind, ServiceError};
use crate::{
    AbortReason, ClientOutput, ClientReport, ClientService, CookieRefused, FailoverReason, Now,
    ServerOutput, ServerReport, ServerService, ServiceKind, SessionId, SessionInfo, PPID_CALCAPP,
};
use serde::Deserialize;
use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

/// Size of every CalcApp message.
pub const MESSAGE_LEN: usize = 24;
/// Size of a CalcApp cookie.
pub const COOKIE_LEN: usize = 20;

/// The type of a CalcApp message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum CalcAppType {
    /// PU → PE: run job JobID of JobSize calculations.
    Request = 1,
    /// PE → PU: the job runs here.
    Accept = 2,
    /// PE → PU: full, try elsewhere.
    Reject = 3,
    /// Defined by RSPLIB, never sent or handled by it.
    Abort = 4,
    /// PE → PU: the job is done.
    Complete = 5,
    /// Either way: are you there?
    KeepAlive = 6,
    /// Either way: yes.
    KeepAliveAck = 7,
}

impl CalcAppType {
    /// The type for a wire value.
    pub fn from_u8(value: u8) -> Option<Self> {
        Some(match value {
            1 => Self::Request,
            2 => Self::Accept,
            3 => Self::Reject,
            4 => Self::Abort,
            5 => Self::Complete,
            6 => Self::KeepAlive,
            7 => Self::KeepAliveAck,
            _ => return None,
        })
    }

    /// RSPLIB's name for it.
    pub fn name(self) -> &'static str {
        match self {
            Self::Request => "CalcAppRequest",
            Self::Accept => "CalcAppAccept",
            Self::Reject => "CalcAppReject",
            Self::Abort => "CalcAppAbort",
            Self::Complete => "CalcAppComplete",
            Self::KeepAlive => "CalcAppKeepAlive",
            Self::KeepAliveAck => "CalcAppKeepAliveAck",
        }
    }
}

/// A CalcApp message: every field as on the wire, so that decoding and encoding give back the
/// same bytes whatever the unused fields hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CalcAppMessage {
    /// The type.
    pub kind: CalcAppType,
    /// Flags (RSPLIB sends 0).
    pub flags: u8,
    /// Job identifier (per pool user).
    pub job_id: u32,
    /// Job size in calculations (Request, Complete).
    pub job_size: u64,
    /// Calculations done (Complete).
    pub completed: u64,
}

fn be_u64(b: &[u8], at: usize) -> u64 {
    let mut a = [0; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_be_bytes(a)
}

fn be_u32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

impl CalcAppMessage {
    /// A message of `kind` for `job_id` with the other fields zero (as RSPLIB fills them).
    pub fn new(kind: CalcAppType, job_id: u32) -> Self {
        Self {
            kind,
            flags: 0,
            job_id,
            job_size: 0,
            completed: 0,
        }
    }

    /// Decodes one 24-byte message.
    pub fn decode(bytes: &[u8]) -> Result<Self, DecodeError> {
        const M: &str = "CalcApp message";
        if bytes.len() < 4 {
            return Err(DecodeError::truncated(M, "header", 4, bytes.len()));
        }
        let kind = CalcAppType::from_u8(bytes[0])
            .ok_or_else(|| DecodeError::new(M, "Type", DecodeErrorKind::UnknownType(bytes[0])))?;
        let name = kind.name();
        let length = usize::from(u16::from_be_bytes([bytes[2], bytes[3]]));
        if length != MESSAGE_LEN {
            return Err(DecodeError::new(
                name,
                "Length",
                DecodeErrorKind::LengthMismatch {
                    declared: length,
                    actual: MESSAGE_LEN,
                },
            ));
        }
        if bytes.len() != MESSAGE_LEN {
            let field = match bytes.len() {
                n if n < 8 => "JobID",
                n if n < 16 => "JobSize",
                n if n < 24 => "Completed",
                _ => "Length",
            };
            return Err(if bytes.len() < MESSAGE_LEN {
                DecodeError::truncated(name, field, MESSAGE_LEN, bytes.len())
            } else {
                DecodeError::new(
                    name,
                    field,
                    DecodeErrorKind::LengthMismatch {
                        declared: MESSAGE_LEN,
                        actual: bytes.len(),
                    },
                )
            });
        }
        Ok(Self {
            kind,
            flags: bytes[1],
            job_id: be_u32(bytes, 4),
            job_size: be_u64(bytes, 8),
            completed: be_u64(bytes, 16),
        })
    }

    /// Encodes the 24-byte message.
    pub fn encode(&self) -> [u8; MESSAGE_LEN] {
        let mut out = [0; MESSAGE_LEN];
        out[0] = self.kind as u8;
        out[1] = self.flags;
        out[2..4].copy_from_slice(&(MESSAGE_LEN as u16).to_be_bytes());
        out[4..8].copy_from_slice(&self.job_id.to_be_bytes());
        out[8..16].copy_from_slice(&self.job_size.to_be_bytes());
        out[16..24].copy_from_slice(&self.completed.to_be_bytes());
        out
    }
}

impl fmt::Display for CalcAppMessage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} job {}", self.kind.name(), self.job_id)?;
        match self.kind {
            CalcAppType::Request => write!(f, " size {}", self.job_size),
            CalcAppType::Complete => {
                write!(f, " size {} completed {}", self.job_size, self.completed)
            }
            _ => Ok(()),
        }
    }
}

/// RSPLIB's CalcApp cookie: a job and its progress.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CalcAppCookie {
    /// Job identifier.
    pub job_id: u32,
    /// Job size in calculations.
    pub job_size: u64,
    /// Calculations done when the cookie was made.
    pub completed: u64,
}

impl CalcAppCookie {
    /// Decodes the 20-byte cookie.
    pub fn decode(bytes: &[u8]) -> Result<Self, DecodeError> {
        const M: &str = "CalcApp cookie";
        if bytes.len() != COOKIE_LEN {
            let field = match bytes.len() {
                n if n < 4 => "JobID",
                n if n < 12 => "JobSize",
                n if n < 20 => "Completed",
                _ => "size",
            };
            return Err(DecodeError::new(
                M,
                field,
                DecodeErrorKind::LengthMismatch {
                    declared: COOKIE_LEN,
                    actual: bytes.len(),
                },
            ));
        }
        Ok(Self {
            job_id: be_u32(bytes, 0),
            job_size: be_u64(bytes, 4),
            completed: be_u64(bytes, 12),
        })
    }

    /// Encodes the 20-byte cookie.
    pub fn encode(&self) -> [u8; COOKIE_LEN] {
        let mut out = [0; COOKIE_LEN];
        out[0..4].copy_from_slice(&self.job_id.to_be_bytes());
        out[4..12].copy_from_slice(&self.job_size.to_be_bytes());
        out[12..20].copy_from_slice(&self.completed.to_be_bytes());
        out
    }
}

/// Settings of the CalcApp pool element (RSPLIB's `-cap*` options).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "kebab-case")]
pub struct CalcAppServerConfig {
    /// Calculations per second shared among running jobs (`-capcapacity`, 1 000 000).
    pub capacity: f64,
    /// Jobs run at once; more are rejected (`-capmaxjobs`, 10).
    pub max_jobs: usize,
    /// Keep-alive to the pool user of each job this often (`-capkeepalivetransmissioninterval`,
    /// 2.5 s, at least 100 ms).
    #[serde(with = "humantime_serde")]
    pub keep_alive_interval: Duration,
    /// Drop a job whose pool user does not answer a keep-alive within this
    /// (`-capkeepalivetimeoutinterval`, 2.5 s).
    #[serde(with = "humantime_serde")]
    pub keep_alive_timeout: Duration,
    /// Send a cookie at least this often per job (`-capcookiemaxtime`, 5 s).
    #[serde(with = "humantime_serde")]
    pub cookie_max_time: Duration,
    /// ... and at least every this many calculations (`-capcookiemaxcalculations`, 5 000 000).
    pub cookie_max_calculations: f64,
    /// Send every job a last cookie when the pool element shuts down
    /// (`-capcleanshutdownprobability` 1.0 = yes, 0.0 = no).
    pub final_cookies: bool,
}

impl Default for CalcAppServerConfig {
    fn default() -> Self {
        Self {
            capacity: 1_000_000.0,
            max_jobs: 10,
            keep_alive_interval: Duration::from_millis(2500),
            keep_alive_timeout: Duration::from_millis(2500),
            cookie_max_time: Duration::from_secs(5),
            cookie_max_calculations: 5_000_000.0,
            final_cookies: true,
        }
    }
}

#[derive(Debug)]
struct ServerJob {
    session: SessionId,
    job_id: u32,
    job_size: f64,
    completed: f64,
    last_update_at: Duration,
    keep_alive_at: Option<Duration>,
    keep_alive_timeout_at: Option<Duration>,
    complete_at: Option<Duration>,
    cookie_at: Option<Duration>,
    last_cookie_at: Duration,
    last_cookie_completed: f64,
}

/// Counters of the CalcApp pool element.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct CalcAppServerCounters {
    /// Jobs accepted from a Request.
    pub accepted: u64,
    /// Jobs accepted from a cookie echo.
    pub resumed: u64,
    /// Requests and cookie echoes rejected because the pool element was full.
    pub rejected: u64,
    /// Jobs completed here.
    pub completed: u64,
    /// Jobs dropped after a keep-alive timeout.
    pub timed_out: u64,
    /// Calculations done.
    pub calculations: f64,
}

/// The CalcApp pool element (RSPLIB `rspserver -calcapp`): one instance serves all sessions of a
/// pool element; its capacity is shared among all running jobs.
#[derive(Debug)]
pub struct CalcAppServer {
    config: CalcAppServerConfig,
    seal: Arc<dyn CookieSeal>,
    identities: HashMap<SessionId, Option<Vec<u8>>>,
    jobs: Vec<ServerJob>,
    last_load: f64,
    counters: CalcAppServerCounters,
    out: VecDeque<ServerOutput>,
}

impl CalcAppServer {
    /// A CalcApp pool element with RSPLIB's plain cookies.
    pub fn new(config: CalcAppServerConfig) -> Self {
        Self::with_seal(config, Arc::new(PlainSeal::default()))
    }

    /// A CalcApp pool element sealing its cookies with `seal`.
    pub fn with_seal(mut config: CalcAppServerConfig, seal: Arc<dyn CookieSeal>) -> Self {
        config.keep_alive_interval = config.keep_alive_interval.max(Duration::from_millis(100));
        config.max_jobs = config.max_jobs.max(1);
        if !(config.capacity.is_finite() && config.capacity > 0.0) {
            config.capacity = 1.0;
        }
        Self {
            config,
            seal,
            identities: HashMap::new(),
            jobs: Vec::new(),
            last_load: 0.0,
            counters: CalcAppServerCounters::default(),
            out: VecDeque::new(),
        }
    }

    /// What was done so far.
    pub fn counters(&self) -> CalcAppServerCounters {
        self.counters
    }

    /// Jobs running now: (session, job id, size, completed), calculations up to the last event.
    pub fn jobs(&self) -> impl Iterator<Item = (SessionId, u32, u64, u64)> + '_ {
        self.jobs.iter().map(|j| {
            (
                j.session,
                j.job_id,
                j.job_size.round() as u64,
                j.completed.round() as u64,
            )
        })
    }

    fn find(&self, session: SessionId, job_id: u32) -> Option<usize> {
        self.jobs
            .iter()
            .position(|j| j.session == session && j.job_id == job_id)
    }

    fn send(&mut self, session: SessionId, message: CalcAppMessage) {
        self.out.push_back(ServerOutput::Send {
            session,
            ppid: PPID_CALCAPP,
            stream: 0,
            data: message.encode().to_vec(),
        });
    }

    fn capacity_per_job(&self) -> f64 {
        self.config.capacity / self.jobs.len().max(1) as f64
    }

    /// Progress of every job up to `now` at the current share.
    fn update_calculations(&mut self, now: Duration) {
        let per_job = self.capacity_per_job();
        for job in &mut self.jobs {
            let elapsed = now.saturating_sub(job.last_update_at).as_secs_f64();
            let done = (elapsed * per_job).min(job.job_size - job.completed);
            job.completed += done;
            self.counters.calculations += done;
            job.last_update_at = now;
        }
    }

    /// When each job completes and needs its next cookie at the current share.
    fn schedule_jobs(&mut self, now: Duration) {
        let per_job = self.capacity_per_job();
        let max_calc = self.config.cookie_max_calculations;
        let max_time = self.config.cookie_max_time;
        for job in &mut self.jobs {
            let to_go = (job.job_size - job.completed).max(0.0);
            job.complete_at = Some(job.last_update_at.saturating_add(secs(to_go / per_job)));
            let by_calc =
                secs((max_calc - (job.completed - job.last_cookie_completed)).max(0.0) / per_job);
            let by_time = max_time.saturating_sub(now.saturating_sub(job.last_cookie_at));
            job.cookie_at = Some(now.saturating_add(by_calc.min(by_time)));
        }
        let load = self.load();
        if load != self.last_load {
            self.last_load = load;
            self.out.push_back(ServerOutput::Load(load));
        }
    }

    fn add_job(
        &mut self,
        now: Now,
        session: SessionId,
        job_id: u32,
        job_size: u64,
        completed: u64,
        resumed: bool,
    ) {
        if self.find(session, job_id).is_some() {
            // The pool user asked again for a job that runs here: accept again, do not double it.
            self.send(session, CalcAppMessage::new(CalcAppType::Accept, job_id));
            return;
        }
        if self.jobs.len() >= self.config.max_jobs {
            self.counters.rejected += 1;
            self.send(session, CalcAppMessage::new(CalcAppType::Reject, job_id));
            self.out
                .push_back(ServerOutput::Report(ServerReport::JobRejected {
                    session,
                    job_id,
                    resumed,
                }));
            return;
        }
        let t = now.monotonic;
        self.update_calculations(t);
        self.jobs.push(ServerJob {
            session,
            job_id,
            job_size: job_size as f64,
            completed: completed as f64,
            last_update_at: t,
            keep_alive_at: Some(t.saturating_add(self.config.keep_alive_interval)),
            keep_alive_timeout_at: None,
            complete_at: None,
            cookie_at: None,
            last_cookie_at: t,
            last_cookie_completed: 0.0,
        });
        if resumed {
            self.counters.resumed += 1;
        } else {
            self.counters.accepted += 1;
        }
        self.send(session, CalcAppMessage::new(CalcAppType::Accept, job_id));
        self.out
            .push_back(ServerOutput::Report(ServerReport::JobAccepted {
                session,
                job_id,
                job_size,
                completed,
                resumed,
            }));
        self.schedule_jobs(t);
    }

    fn remove_job(&mut self, now: Duration, index: usize) -> ServerJob {
        self.update_calculations(now);
        let job = self.jobs.swap_remove(index);
        self.schedule_jobs(now);
        job
    }

    fn send_cookie(&mut self, now: Now, index: usize) {
        let job = &mut self.jobs[index];
        let cookie = CalcAppCookie {
            job_id: job.job_id,
            job_size: job.job_size.round() as u64,
            completed: job.completed.round() as u64,
        };
        job.last_cookie_at = now.monotonic;
        job.last_cookie_completed = job.completed;
        let session = job.session;
        let identity = self.identities.get(&session).cloned().flatten();
        let sealed = self.seal.seal(
            &SealContext {
                service: ServiceKind::CalcApp.name(),
                identity: identity.as_deref(),
                unix_now: now.unix,
            },
            &cookie.encode(),
        );
        self.out.push_back(ServerOutput::Cookie {
            session,
            cookie: sealed,
        });
    }

    fn ignore(&mut self, session: SessionId, error: ServiceError) -> Result<(), ServiceError> {
        self.out
            .push_back(ServerOutput::Report(ServerReport::Ignored {
                session,
                error: error.clone(),
            }));
        Err(error)
    }

    /// The first due event of the first job that has one, like RSPLIB's timer handler.
    fn due_event(&self, now: Duration) -> Option<(usize, u8)> {
        self.jobs.iter().enumerate().find_map(|(i, j)| {
            let due = |t: Option<Duration>| t.is_some_and(|t| t <= now);
            if due(j.complete_at) {
                Some((i, 0))
            } else if due(j.cookie_at) {
                Some((i, 1))
            } else if due(j.keep_alive_at) {
                Some((i, 2))
            } else if due(j.keep_alive_timeout_at) {
                Some((i, 3))
            } else {
                None
            }
        })
    }
}

fn secs(s: f64) -> Duration {
    // Round up to the microsecond, like RSPLIB's ceil() on µs, so a job is never complete early.
    Duration::from_micros((s * 1e6).ceil().clamp(0.0, 1e15) as u64)
}

impl ServerService for CalcAppServer {
    fn kind(&self) -> ServiceKind {
        ServiceKind::CalcApp
    }

    fn open_session(&mut self, _now: Now, session: SessionId, info: SessionInfo) {
        self.identities.insert(session, info.identity);
    }

    fn handle_message(
        &mut self,
        now: Now,
        session: SessionId,
        ppid: u32,
        _stream: u16,
        data: &[u8],
    ) -> Result<(), ServiceError> {
        if !self.identities.contains_key(&session) {
            return Err(ServiceError::UnknownSession(session));
        }
        if ppid != PPID_CALCAPP {
            return self.ignore(
                session,
                ServiceError::WrongPpid {
                    ppid,
                    expected: PPID_CALCAPP,
                },
            );
        }
        let message = match CalcAppMessage::decode(data) {
            Ok(m) => m,
            Err(e) => return self.ignore(session, e.into()),
        };
        match message.kind {
            CalcAppType::Request => {
                if message.job_size == 0 {
                    return self.ignore(
                        session,
                        DecodeError::new(
                            "CalcAppRequest",
                            "JobSize",
                            DecodeErrorKind::Invalid("a job of 0 calculations"),
                        )
                        .into(),
                    );
                }
                self.add_job(now, session, message.job_id, message.job_size, 0, false);
            }
            CalcAppType::KeepAlive => match self.find(session, message.job_id) {
                // A keep-alive for a job that just completed: nothing to do (RSPLIB).
                None => {
                    return self.ignore(
                        session,
                        ServiceError::UnknownJob {
                            job_id: message.job_id,
                        },
                    )
                }
                Some(_) => self.send(
                    session,
                    CalcAppMessage::new(CalcAppType::KeepAliveAck, message.job_id),
                ),
            },
            CalcAppType::KeepAliveAck => match self.find(session, message.job_id) {
                None => {
                    return self.ignore(
                        session,
                        ServiceError::UnknownJob {
                            job_id: message.job_id,
                        },
                    )
                }
                Some(i) => {
                    let interval = self.config.keep_alive_interval;
                    let job = &mut self.jobs[i];
                    job.keep_alive_timeout_at = None;
                    job.keep_alive_at = Some(now.monotonic.saturating_add(interval));
                }
            },
            other => {
                return self.ignore(session, ServiceError::Unexpected(other.name()));
            }
        }
        Ok(())
    }

    fn handle_cookie_echo(
        &mut self,
        now: Now,
        session: SessionId,
        cookie: &[u8],
    ) -> Result<(), CookieRefused> {
        let Some(identity) = self.identities.get(&session) else {
            return Err(CookieRefused::UnknownSession(session));
        };
        let context = SealContext {
            service: ServiceKind::CalcApp.name(),
            identity: identity.as_deref(),
            unix_now: now.unix,
        };
        let result = self
            .seal
            .open(&context, cookie)
            .map_err(CookieRefused::from)
            .and_then(|payload| CalcAppCookie::decode(&payload).map_err(CookieRefused::from))
            .and_then(|c| {
                if c.job_size == 0 {
                    Err(CookieRefused::Invalid("JobSize 0"))
                } else if c.completed > c.job_size {
                    Err(CookieRefused::Invalid("Completed exceeds JobSize"))
                } else {
                    Ok(c)
                }
            });
        match result {
            Ok(c) => {
                self.out
                    .push_back(ServerOutput::Report(ServerReport::Restored {
                        session,
                        state: format!(
                            "job {} at {}/{} calculations",
                            c.job_id, c.completed, c.job_size
                        ),
                    }));
                self.add_job(now, session, c.job_id, c.job_size, c.completed, true);
                Ok(())
            }
            Err(e) => {
                self.out.push_back(ServerOutput::Abort {
                    session,
                    reason: AbortReason::Cookie(e.clone()),
                });
                Err(e)
            }
        }
    }

    fn close_session(&mut self, now: Now, session: SessionId) {
        self.identities.remove(&session);
        if self.jobs.iter().any(|j| j.session == session) {
            self.update_calculations(now.monotonic);
            self.jobs.retain(|j| j.session != session);
            self.schedule_jobs(now.monotonic);
        }
    }

    fn shutdown(&mut self, now: Now) {
        self.update_calculations(now.monotonic);
        if self.config.final_cookies {
            for i in 0..self.jobs.len() {
                self.send_cookie(now, i);
            }
        }
        self.jobs.clear();
        self.schedule_jobs(now.monotonic);
    }

    fn poll_timeout(&self) -> Option<Duration> {
        self.jobs
            .iter()
            .flat_map(|j| {
                [
                    j.complete_at,
                    j.cookie_at,
                    j.keep_alive_at,
                    j.keep_alive_timeout_at,
                ]
            })
            .flatten()
            .min()
    }

    fn handle_timeout(&mut self, now: Now) {
        let t = now.monotonic;
        // Each event reschedules; a bound keeps a pathological configuration from spinning.
        for _ in 0..(4 * self.jobs.len() + 4) {
            let Some((i, event)) = self.due_event(t) else {
                break;
            };
            match event {
                0 => {
                    self.update_calculations(t);
                    let job = self.remove_job(t, i);
                    self.counters.completed += 1;
                    let message = CalcAppMessage {
                        kind: CalcAppType::Complete,
                        flags: 0,
                        job_id: job.job_id,
                        job_size: job.job_size.round() as u64,
                        completed: job.completed.round() as u64,
                    };
                    self.send(job.session, message);
                    self.out
                        .push_back(ServerOutput::Report(ServerReport::JobCompleted {
                            session: job.session,
                            job_id: job.job_id,
                            job_size: message.job_size,
                        }));
                }
                1 => {
                    self.update_calculations(t);
                    self.send_cookie(now, i);
                    self.schedule_jobs(t);
                }
                2 => {
                    let timeout = self.config.keep_alive_timeout;
                    let job = &mut self.jobs[i];
                    job.keep_alive_at = None;
                    job.keep_alive_timeout_at = Some(t.saturating_add(timeout));
                    let (session, job_id) = (job.session, job.job_id);
                    self.send(session, CalcAppMessage::new(CalcAppType::KeepAlive, job_id));
                }
                _ => {
                    let job = self.remove_job(t, i);
                    self.counters.timed_out += 1;
                    self.out
                        .push_back(ServerOutput::Report(ServerReport::JobTimedOut {
                            session: job.session,
                            job_id: job.job_id,
                        }));
                }
            }
        }
    }

    fn poll_output(&mut self) -> Option<ServerOutput> {
        self.out.pop_front()
    }

    fn load(&self) -> f64 {
        self.jobs.len() as f64 / self.config.max_jobs as f64
    }

    fn sessions(&self) -> usize {
        self.identities.len()
    }
}

/// Settings of the CalcApp pool user (RSPLIB `calcappclient` options).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "kebab-case")]
pub struct CalcAppClientConfig {
    /// Mean time between new jobs, exponentially distributed (`-jobinterval`, 15 s); `None`:
    /// jobs only from [`CalcAppClient::submit`].
    #[serde(with = "humantime_serde")]
    pub job_interval: Option<Duration>,
    /// Mean job size in calculations, exponentially distributed (`-jobsize`, 5 000 000).
    pub job_size: f64,
    /// Every job exactly `job_size` instead of exponentially distributed.
    pub fixed_job_size: bool,
    /// Stop after this many jobs completed (`None`: run until stopped); the generator
    /// (`job_interval`) makes no more than this many jobs.
    pub jobs: Option<u64>,
    /// Keep-alive to the PE this often while a job runs (`-keepalivetransmissioninterval`, 5 s).
    #[serde(with = "humantime_serde")]
    pub keep_alive_interval: Duration,
    /// Fail over when Accept or a keep-alive answer does not come within this
    /// (`-keepalivetimeoutinterval`, 5 s).
    #[serde(with = "humantime_serde")]
    pub keep_alive_timeout: Duration,
    /// Wait this long before asking again after a Reject without a cookie (RSPLIB: 1 s).
    #[serde(with = "humantime_serde")]
    pub reject_retry_delay: Duration,
    /// Seed of the job generator (same seed, same jobs).
    pub seed: u64,
    /// Jobs waiting in the queue at most; a job generated or submitted beyond is dropped and
    /// reported (RSPLIB's queue grows without bound when the pool is slower than the arrivals).
    pub max_queued_jobs: usize,
}

impl Default for CalcAppClientConfig {
    fn default() -> Self {
        Self {
            job_interval: Some(Duration::from_secs(15)),
            job_size: 5_000_000.0,
            fixed_job_size: false,
            jobs: None,
            keep_alive_interval: Duration::from_secs(5),
            keep_alive_timeout: Duration::from_secs(5),
            reject_retry_delay: Duration::from_secs(1),
            seed: 1,
            max_queued_jobs: 1000,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum JobState {
    /// Request (or cookie echo) sent, waiting for Accept or Reject.
    Requested,
    /// Accepted: keep-alives run.
    Processing,
    /// A failover was asked for; waiting for it to complete.
    FailingOver,
    /// Rejected and no cookie: asking again at this time.
    Retry(Duration),
}

#[derive(Debug)]
struct ClientJob {
    job_id: u32,
    job_size: u64,
    requested_at: Duration,
    state: JobState,
    failovers: u32,
    rejected: bool,
}

/// Counters of the CalcApp pool user.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CalcAppClientCounters {
    /// Jobs queued.
    pub queued: u64,
    /// Requests sent (first and repeated).
    pub requests: u64,
    /// Accepts received.
    pub accepts: u64,
    /// Rejects received.
    pub rejects: u64,
    /// Jobs completed.
    pub completed: u64,
    /// Failovers completed.
    pub failovers: u64,
    /// Keep-alives sent.
    pub keep_alives: u64,
    /// Jobs dropped because the queue was full.
    pub dropped: u64,
}

/// The CalcApp pool user (RSPLIB `calcappclient`): jobs from a queue, one at a time on the
/// session; Request, then keep-alives until Complete; on a timeout, a Reject or a lost PE it
/// asks for a failover and, when no cookie was echoed, sends the Request again.
#[derive(Debug)]
pub struct CalcAppClient {
    config: CalcAppClientConfig,
    rng: u64,
    next_job_id: u32,
    next_job_at: Option<Duration>,
    queue: VecDeque<(u32, u64)>,
    current: Option<ClientJob>,
    keep_alive_at: Option<Duration>,
    timeout_at: Option<Duration>,
    started: bool,
    finished: bool,
    counters: CalcAppClientCounters,
    out: VecDeque<ClientOutput>,
}

impl CalcAppClient {
    /// A CalcApp pool user.
    pub fn new(config: CalcAppClientConfig) -> Self {
        let rng = config.seed;
        Self {
            config,
            rng,
            next_job_id: 1,
            next_job_at: None,
            queue: VecDeque::new(),
            current: None,
            keep_alive_at: None,
            timeout_at: None,
            started: false,
            finished: false,
            counters: CalcAppClientCounters::default(),
            out: VecDeque::new(),
        }
    }

    /// What was done so far.
    pub fn counters(&self) -> CalcAppClientCounters {
        self.counters
    }

    /// Queues a job of `job_size` calculations; returns its job identifier, or `None` when the
    /// queue is full (`max_queued_jobs`).
    pub fn submit(&mut self, now: Now, job_size: u64) -> Option<u32> {
        if self.queue.len() >= self.config.max_queued_jobs {
            self.counters.dropped += 1;
            self.out
                .push_back(ClientOutput::Report(ClientReport::JobDropped { job_size }));
            return None;
        }
        let job_id = self.next_job_id;
        self.next_job_id = self.next_job_id.wrapping_add(1).max(1);
        self.queue.push_back((job_id, job_size.max(1)));
        self.counters.queued += 1;
        self.out
            .push_back(ClientOutput::Report(ClientReport::JobQueued {
                job_id,
                job_size,
            }));
        if self.started {
            self.next_job(now);
        }
        Some(job_id)
    }

    /// A uniform number in (0, 1] (splitmix64).
    fn uniform(&mut self) -> f64 {
        self.rng = self.rng.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.rng;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        ((z >> 11) as f64 + 1.0) / (1u64 << 53) as f64
    }

    fn exponential(&mut self, mean: f64) -> f64 {
        -mean * self.uniform().ln()
    }

    fn generate(&mut self, now: Now) {
        let size = if self.config.fixed_job_size {
            self.config.job_size
        } else {
            self.exponential(self.config.job_size)
        };
        self.submit(now, size.round().max(1.0) as u64);
    }

    fn send(&mut self, kind: CalcAppType, job_id: u32, job_size: u64) {
        let message = CalcAppMessage {
            kind,
            flags: 0,
            job_id,
            job_size,
            completed: 0,
        };
        self.out.push_back(ClientOutput::Send {
            ppid: PPID_CALCAPP,
            stream: 0,
            data: message.encode().to_vec(),
        });
    }

    fn send_request(&mut self, now: Now) {
        let Some(job) = self.current.as_mut() else {
            return;
        };
        job.state = JobState::Requested;
        let (job_id, job_size) = (job.job_id, job.job_size);
        self.timeout_at = Some(now.monotonic.saturating_add(self.config.keep_alive_timeout));
        self.keep_alive_at = None;
        self.counters.requests += 1;
        self.send(CalcAppType::Request, job_id, job_size);
        self.out
            .push_back(ClientOutput::Report(ClientReport::JobRequested { job_id }));
    }

    fn next_job(&mut self, now: Now) {
        if self.current.is_some() || self.finished {
            return;
        }
        let Some((job_id, job_size)) = self.queue.pop_front() else {
            return;
        };
        self.current = Some(ClientJob {
            job_id,
            job_size,
            requested_at: now.monotonic,
            state: JobState::Requested,
            failovers: 0,
            rejected: false,
        });
        self.send_request(now);
    }

    fn failover(&mut self, reason: FailoverReason) {
        if let Some(job) = self.current.as_mut() {
            job.state = JobState::FailingOver;
            job.rejected = reason == FailoverReason::Rejected;
        }
        self.keep_alive_at = None;
        self.timeout_at = None;
        self.out.push_back(ClientOutput::Failover(reason));
    }

    fn check_job(&mut self, message: &CalcAppMessage) -> Result<(), ServiceError> {
        match &self.current {
            Some(job) if job.job_id == message.job_id => Ok(()),
            _ => {
                let e = ServiceError::UnknownJob {
                    job_id: message.job_id,
                };
                self.out
                    .push_back(ClientOutput::Report(ClientReport::Ignored(e.clone())));
                Err(e)
            }
        }
    }
}

impl ClientService for CalcAppClient {
    fn kind(&self) -> ServiceKind {
        ServiceKind::CalcApp
    }

    fn start(&mut self, now: Now) {
        self.started = true;
        if let Some(interval) = self.config.job_interval {
            let first = secs(self.exponential(interval.as_secs_f64()));
            self.next_job_at = Some(now.monotonic.saturating_add(first));
        }
        self.next_job(now);
    }

    fn handle_message(
        &mut self,
        now: Now,
        ppid: u32,
        _stream: u16,
        data: &[u8],
    ) -> Result<(), ServiceError> {
        let message = if ppid != PPID_CALCAPP {
            Err(ServiceError::WrongPpid {
                ppid,
                expected: PPID_CALCAPP,
            })
        } else {
            CalcAppMessage::decode(data).map_err(ServiceError::from)
        };
        let message = match message {
            Ok(m) => m,
            Err(e) => {
                self.out
                    .push_back(ClientOutput::Report(ClientReport::Ignored(e.clone())));
                return Err(e);
            }
        };
        self.check_job(&message)?;
        let state = self.current.as_ref().map(|j| j.state);
        if state == Some(JobState::FailingOver) {
            // Late words of the PE being left: the next PE will answer for the job.
            return Err(ServiceError::Unexpected("message during failover"));
        }
        let t = now.monotonic;
        match message.kind {
            CalcAppType::Accept => {
                self.counters.accepts += 1;
                let job = self.current.as_mut().expect("checked");
                job.state = JobState::Processing;
                self.timeout_at = None;
                self.keep_alive_at = Some(t.saturating_add(self.config.keep_alive_interval));
                self.out
                    .push_back(ClientOutput::Report(ClientReport::JobAccepted {
                        job_id: message.job_id,
                    }));
            }
            CalcAppType::Reject => {
                self.counters.rejects += 1;
                self.out
                    .push_back(ClientOutput::Report(ClientReport::JobRejected {
                        job_id: message.job_id,
                    }));
                self.failover(FailoverReason::Rejected);
            }
            CalcAppType::KeepAlive => {
                self.send(CalcAppType::KeepAliveAck, message.job_id, 0);
            }
            CalcAppType::KeepAliveAck => {
                let job = self.current.as_mut().expect("checked");
                if job.state == JobState::Processing {
                    self.timeout_at = None;
                    self.keep_alive_at = Some(t.saturating_add(self.config.keep_alive_interval));
                }
            }
            CalcAppType::Complete => {
                let job = self.current.take().expect("checked");
                self.counters.completed += 1;
                self.timeout_at = None;
                self.keep_alive_at = None;
                self.out.push_back(ClientOutput::ClearCookie);
                self.out
                    .push_back(ClientOutput::Report(ClientReport::JobCompleted {
                        job_id: job.job_id,
                        job_size: job.job_size,
                        handling_time: t.saturating_sub(job.requested_at),
                        failovers: job.failovers,
                    }));
                if self
                    .config
                    .jobs
                    .is_some_and(|n| self.counters.completed >= n)
                {
                    self.finished = true;
                    self.next_job_at = None;
                    self.out.push_back(ClientOutput::Finished);
                } else {
                    self.next_job(now);
                }
            }
            CalcAppType::Request | CalcAppType::Abort => {
                let e = ServiceError::Unexpected(message.kind.name());
                self.out
                    .push_back(ClientOutput::Report(ClientReport::Ignored(e.clone())));
                return Err(e);
            }
        }
        Ok(())
    }

    fn failover_complete(&mut self, now: Now, cookie_echoed: bool) {
        self.counters.failovers += 1;
        let Some(job) = self.current.as_mut() else {
            return;
        };
        job.failovers += 1;
        if cookie_echoed {
            // The new PE answers the cookie echo with Accept (or Reject).
            job.state = JobState::Requested;
            self.timeout_at = Some(now.monotonic.saturating_add(self.config.keep_alive_timeout));
        } else if job.rejected {
            job.state =
                JobState::Retry(now.monotonic.saturating_add(self.config.reject_retry_delay));
        } else {
            self.send_request(now);
        }
    }

    fn poll_timeout(&self) -> Option<Duration> {
        let retry = match self.current.as_ref().map(|j| j.state) {
            Some(JobState::Retry(at)) => Some(at),
            _ => None,
        };
        [self.next_job_at, self.keep_alive_at, self.timeout_at, retry]
            .into_iter()
            .flatten()
            .min()
    }

    fn handle_timeout(&mut self, now: Now) {
        let t = now.monotonic;
        if self.next_job_at.is_some_and(|at| at <= t) && !self.finished {
            let interval = self
                .config
                .job_interval
                .map(|i| i.as_secs_f64())
                .unwrap_or(0.0);
            self.next_job_at = Some(t.saturating_add(secs(self.exponential(interval))));
            self.generate(now);
            // With `jobs`, the generator stops once that many jobs were queued: the client
            // finishes when they are complete, and a job generated beyond them would be left
            // in the queue, never run and never reported.
            if self.config.jobs.is_some_and(|n| self.counters.queued >= n) {
                self.next_job_at = None;
            }
        }
        if self.timeout_at.is_some_and(|at| at <= t) {
            self.timeout_at = None;
            self.failover(FailoverReason::NoAnswer);
        }
        if self.keep_alive_at.is_some_and(|at| at <= t) {
            self.keep_alive_at = None;
            self.timeout_at = Some(t.saturating_add(self.config.keep_alive_timeout));
            if let Some(job_id) = self.current.as_ref().map(|j| j.job_id) {
                self.counters.keep_alives += 1;
                self.send(CalcAppType::KeepAlive, job_id, 0);
            }
        }
        if let Some(JobState::Retry(at)) = self.current.as_ref().map(|j| j.state) {
            if at <= t {
                self.send_request(now);
            }
        }
    }

    fn poll_output(&mut self) -> Option<ClientOutput> {
        self.out.pop_front()
    }
}
