//! The session layer in the simulated world: PU sessions (PingPong and CalcApp clients over
//! `PoolUserSession`), the PEs' session side (`SessionServer`), and the invariants about them.
//! A child module of `world`, so it reaches the world's state directly.

use super::*;
use rserpool_services::cookie::{
    CookieKey, CookieSeal, HmacSeal, PlainSeal, SealContext, SealError, SIGNED_MAGIC,
    SIGNED_OVERHEAD,
};
use rserpool_wire::{CauseCode, PoolElement, RegistrationLife};
use std::sync::Arc;

/// Bytes of a signed cookie's envelope before its payload (crates/services/src/cookie.rs).
const ENVELOPE_HEADER: usize = 36;
/// The clock skew `HmacSeal` tolerates by default.
const SEAL_CLOCK_SKEW: u64 = 30;

/// How a PE seals its cookies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum SealKind {
    /// Plain cookies (RSPLIB's).
    Plain,
    /// HMAC under pool n's key.
    Pool(usize),
    /// HMAC under PE n's own key (not its pool's).
    Own(usize),
}

/// Who sealed a cookie and for whom: what `cookie_accepted` and `cookie_authentic` judge a
/// PE's verdict on a cookie echo by.
#[derive(Debug, Clone)]
pub(super) struct CookieOrigin {
    pe: usize,
    seal: SealKind,
    pu: Option<usize>,
    calcapp: bool,
    /// The pool user's identity the cookie is bound to (see [`World::binding_identity`]).
    identity: Option<Vec<u8>>,
    /// The issuing PE's wall clock at issue, Unix seconds.
    issued_secs: u64,
}

/// The service's own cookie inside a cookie: the payload of a signed envelope, or the bytes
/// themselves.
pub(super) fn cookie_payload(c: &[u8]) -> &[u8] {
    if c.len() >= SIGNED_OVERHEAD && &c[..4] == SIGNED_MAGIC {
        let len = usize::from(u16::from_be_bytes([c[6], c[7]]));
        if c.len() == SIGNED_OVERHEAD + len {
            return &c[ENVELOPE_HEADER..ENVELOPE_HEADER + len];
        }
    }
    c
}

fn is_signed(c: &[u8]) -> bool {
    c.len() >= 4 && &c[..4] == SIGNED_MAGIC
}

/// [`Mutation::UncheckedCookieSeal`]: seals as `HmacSeal` does, opens without verifying
/// anything (a seal that forgot its checks).
#[derive(Debug)]
struct UncheckedSeal(HmacSeal);

impl CookieSeal for UncheckedSeal {
    fn seal(&self, context: &SealContext<'_>, payload: &[u8]) -> Vec<u8> {
        self.0.seal(context, payload)
    }

    fn open(&self, _context: &SealContext<'_>, sealed: &[u8]) -> Result<Vec<u8>, SealError> {
        Ok(cookie_payload(sealed).to_vec())
    }

    fn is_signed(&self) -> bool {
        true
    }
}

impl World {
    /// How PE j seals its cookies: the pool's key, unless the seed gave it its own or none.
    fn seal_of(&self, j: usize) -> SealKind {
        if !self.cfg.signed_cookies || self.cfg.unsealed_pe == Some(j) {
            SealKind::Plain
        } else if self.cfg.other_key_pe == Some(j) {
            SealKind::Own(j)
        } else {
            SealKind::Pool(j % self.pools.len())
        }
    }

    /// PE j's session side: its service (PingPong, or CalcApp on the CalcApp pool) with its
    /// seal, and its business card.
    pub(super) fn pe_server(&mut self, j: usize) -> SessionServer {
        let seed = self.cfg.seed;
        let key = |what: String| {
            CookieKey::new(format!("rserpool-sim cookie key of {what}, seed {seed}").into_bytes())
                .expect("longer than the minimum")
        };
        let key = match self.seal_of(j) {
            SealKind::Plain => None,
            SealKind::Own(n) => Some(key(format!("PE{n}"))),
            SealKind::Pool(n) => Some(key(format!("Pool{n}"))),
        };
        let seal: Arc<dyn CookieSeal> = match key {
            None => Arc::new(PlainSeal::default()),
            Some(k) => {
                let hmac = HmacSeal::new(k, self.cfg.cookie_lifetime);
                if self.cfg.mutation == Some(Mutation::UncheckedCookieSeal) {
                    Arc::new(UncheckedSeal(hmac))
                } else {
                    Arc::new(hmac)
                }
            }
        };
        let service: Box<dyn rserpool_services::ServerService> =
            if self.is_calcapp_pool(&self.pes[j].pool) {
                Box::new(CalcAppServer::with_seal(
                    CalcAppServerConfig {
                        max_jobs: self.cfg.calcapp_max_jobs,
                        ..CalcAppServerConfig::default()
                    },
                    seal,
                ))
            } else {
                Box::new(PingPongServer::with_seal(
                    PingPongServerConfig {
                        failure_after: self.cfg.pingpong_failure_after,
                        ..PingPongServerConfig::default()
                    },
                    seal,
                ))
            };
        let mut server = SessionServer::new(ServerConfig::default(), service);
        server.set_business_card(self.card_of(j));
        server
    }

    /// Which PEs each PE's business card names (0–3 of the PEs that follow it in its pool),
    /// when the seed has business cards and sessions (a seed without either draws nothing
    /// here and runs as before cards existed).
    pub(super) fn draw_business_cards(&mut self) {
        if !self.cfg.business_cards || self.cfg.sessions_per_pu == 0 {
            return;
        }
        let n = self.pes.len();
        for j in 0..n {
            let size = self.rng.random_range(0..=3usize);
            let pool = self.pes[j].pool.clone();
            let card: Vec<usize> = (1..n)
                .map(|d| (j + d) % n)
                .filter(|&x| self.pes[x].pool == pool)
                .take(size)
                .collect();
            self.pes[j].card = card;
        }
    }

    /// The PE parameter of PE x as a business card carries it (no ASAP transport, as RSPLIB).
    fn pool_element_of(&self, x: usize) -> PoolElement {
        PoolElement {
            id: self.pes[x].id,
            home_registrar: RegistrarId(0),
            registration_life: RegistrationLife::Finite(Duration::from_secs(30)),
            user_transport: UserTransport::Address(TransportAddress::sctp(
                SESSION_PORT,
                TransportUse::DataPlusControl,
                vec![self.pes[x].ip],
            )),
            policy: PoolPolicy::RoundRobin,
            asap_transport: None,
        }
    }

    /// PE j's business card (RFC 5352 §3.9), if it sends one.
    fn card_of(&self, j: usize) -> Option<(PoolHandle, Vec<PoolElement>)> {
        let p = &self.pes[j];
        if p.card.is_empty() {
            return None;
        }
        let mut pes: Vec<PoolElement> = p.card.iter().map(|&x| self.pool_element_of(x)).collect();
        if self.cfg.mutation == Some(Mutation::ForeignBusinessCards) {
            // The defect: a PE of another pool (or one that never joined any) on the card.
            match (0..self.pes.len()).find(|&x| self.pes[x].pool != p.pool) {
                Some(x) => pes.insert(0, self.pool_element_of(x)),
                None => {
                    let mut stranger = self.pool_element_of(j);
                    stranger.id = PoolElementId(0xdead_0000);
                    pes.insert(0, stranger);
                }
            }
        }
        Some((p.pool.clone(), pes))
    }

    /// The PU at the other end of session association `id`.
    fn pu_of_session(&self, id: u64) -> Option<usize> {
        self.assocs.get(&id)?.ends.iter().find_map(|h| match h {
            HostId::PoolUser(k) => Some(*k),
            _ => None,
        })
    }

    /// A message reaches PE j on session association `id`: a signed cookie echo may be
    /// tampered with on the way (the seed's `cookie_tampering`: altered, or replaced by a
    /// cookie another pool user holds), and the verdict the PE owes the echo is noted. Returns
    /// the message as it arrives when it was changed.
    pub(super) fn cookie_echo_arrives(
        &mut self,
        j: usize,
        id: u64,
        bytes: &[u8],
    ) -> Option<Vec<u8>> {
        let Some((11, m)) = unframe(bytes) else {
            return None;
        };
        let Ok(AsapMessage::CookieEcho(mut echo)) =
            self.codec.decode::<AsapMessage>(m).map(|d| d.message)
        else {
            return None;
        };
        let k = self.pu_of_session(id);
        let mut changed = None;
        if self.cfg.cookie_tampering > 0.0
            && is_signed(&echo.cookie)
            && self.rng.random_bool(self.cfg.cookie_tampering)
        {
            let others: Vec<Vec<u8>> = self
                .pus
                .iter()
                .enumerate()
                .filter(|(x, _)| Some(*x) != k)
                .flat_map(|(_, p)| p.sessions.iter().flatten())
                .filter_map(|s| s.core.cookie())
                .filter(|c| is_signed(c))
                .map(<[u8]>::to_vec)
                .collect();
            let how = if !others.is_empty() && self.rng.random_bool(0.5) {
                echo.cookie = others[self.rng.random_range(0..others.len())].clone();
                "replaced by another pool user's cookie".to_string()
            } else {
                let at = self.rng.random_range(0..echo.cookie.len());
                echo.cookie[at] ^= 1 << self.rng.random_range(0..8u32);
                format!("byte {at} altered")
            };
            self.stats.cookies_tampered += 1;
            self.note(|| format!("TAMPER cookie echo to PE{j} on #{id}: {how}"));
            if let Ok(b) = self.codec.encode(&AsapMessage::CookieEcho(echo.clone())) {
                changed = Some(frame(11, &b));
            }
        }
        let verdict = self.verdict_on(j, k, id, &echo.cookie);
        self.verdicts.insert(id, verdict);
        changed
    }

    /// Whether PE j must accept `cookie` echoed by PU k, and why: it was issued, unaltered, by
    /// a PE sealing as PE j does, for the same service, to the same pool user (when signed),
    /// and has not expired on PE j's clock.
    fn verdict_on(&self, j: usize, k: Option<usize>, id: u64, cookie: &[u8]) -> (bool, String) {
        let seal = self.seal_of(j);
        let calcapp = self.is_calcapp_pool(&self.pes[j].pool);
        let now = Now::from_monotonic(self.local(HostId::PoolElement(j)))
            .unix
            .as_secs();
        let lifetime = self.cfg.cookie_lifetime.as_secs();
        match self.issued.get(cookie) {
            None => (false, "a cookie no PE issued (altered or forged)".into()),
            Some(o) if o.calcapp != calcapp => (false, "another service's cookie".into()),
            Some(o) if o.seal != seal => (
                false,
                format!(
                    "sealed by PE{} ({:?}), this PE seals {seal:?}",
                    o.pe, o.seal
                ),
            ),
            Some(o) if seal == SealKind::Plain => (true, format!("PE{}'s plain cookie", o.pe)),
            Some(o) if o.pu != k => (
                false,
                format!("issued by PE{} to PU{:?}, echoed by PU{k:?}", o.pe, o.pu),
            ),
            Some(o) if o.identity != self.binding_identity(id, HostId::PoolElement(j)) => (
                false,
                format!(
                    "issued by PE{} bound to the pool user's address {:?}, echoed from {:?} \
                     (a TCP-mapped pool user that moved to its other address)",
                    o.pe,
                    o.identity,
                    self.binding_identity(id, HostId::PoolElement(j))
                ),
            ),
            Some(o) if now >= o.issued_secs + lifetime + SEAL_CLOCK_SKEW => (
                false,
                format!("issued at {} s, expired by {now} s", o.issued_secs),
            ),
            Some(o) if o.issued_secs > now + SEAL_CLOCK_SKEW => (
                false,
                format!("issued at {} s, after {now} s", o.issued_secs),
            ),
            Some(o) => (true, format!("PE{}'s signed cookie, authentic", o.pe)),
        }
    }

    /// A message reaches session n of PU k: a business card is checked
    /// (`business_card_in_pool`) and remembered for `business_card_candidates`. Returns
    /// whether the session core gets it ([`Mutation::IgnoredBusinessCards`] drops cards).
    pub(super) fn control_message_arrives(
        &mut self,
        k: usize,
        n: usize,
        ppid: u32,
        m: &[u8],
    ) -> bool {
        if ppid != Protocol::Asap.ppid() {
            return true;
        }
        let Ok(AsapMessage::BusinessCard(card)) =
            self.codec.decode::<AsapMessage>(m).map(|d| d.message)
        else {
            return true;
        };
        let Some(s) = self.pus[k].sessions[n].as_ref() else {
            return true;
        };
        if !s.core.is_bound() || card.pool_handle != s.core.config().pool_handle {
            return true;
        }
        let (no, from) = (s.no, s.core.current_pe());
        self.stats.business_cards += 1;
        if let Some(bad) = card.pool_elements.iter().find(|pe| {
            self.pe_by_id
                .get(&pe.id)
                .is_none_or(|&x| self.pes[x].pool != card.pool_handle)
        }) {
            let msg = format!(
                "PU{k} session S{no}: the business card from {from:?} for pool {} names PE {}, which never joined that pool",
                card.pool_handle, bad.id
            );
            self.fail("business_card_in_pool", msg);
            return false;
        }
        let s = self.pus[k].sessions[n].as_mut().expect("present");
        s.card_left = card
            .pool_elements
            .iter()
            .map(|p| p.id)
            .filter(|id| Some(*id) != from)
            .collect();
        self.cfg.mutation != Some(Mutation::IgnoredBusinessCards)
    }

    /// Session n of PU k selected a PE (its receipt's last selection): a session holding a
    /// business card chooses from it, and a selection from a card lists exactly what is left
    /// of the card (`business_card_candidates`). Returns `false` when that broke.
    fn selection_made(&mut self, k: usize, n: usize) -> bool {
        let Some(s) = self.pus[k].sessions[n].as_mut() else {
            return true;
        };
        let Some(sel) = s.core.receipt().selections.last() else {
            return true;
        };
        let (pe, source, candidates) = (sel.pe, sel.source, sel.candidates.clone());
        let left = std::mem::take(&mut s.card_left);
        s.card_left = left.iter().copied().filter(|x| *x != pe).collect();
        let no = s.no;
        if source == CandidateSource::BusinessCard {
            self.stats.card_selections += 1;
            if candidates != left || candidates.first() != Some(&pe) {
                let msg = format!(
                    "PU{k} session S{no} selected {pe} from a business card among {candidates:?}; the cards it got leave {left:?}"
                );
                self.fail("business_card_candidates", msg);
                return false;
            }
        } else if !left.is_empty() {
            let msg = format!(
                "PU{k} session S{no} selected {pe} by {} while its business card still names {left:?}",
                source.label()
            );
            self.fail("business_card_candidates", msg);
            return false;
        }
        true
    }

    /// The applications of bound sessions ask for failovers now and then (the seed's
    /// `requested_failovers`: about once per that mean), as `failover_because(Requested)`.
    fn request_failovers(&mut self) {
        let Some(mean) = self.cfg.requested_failovers else {
            return;
        };
        let p = (1.0 / mean.as_secs_f64().max(1.0)).min(1.0);
        for k in 0..self.pus.len() {
            for n in 0..self.pus[k].sessions.len() {
                let Some(pe) = self.pus[k].sessions[n]
                    .as_ref()
                    .and_then(|s| s.core.current_pe())
                else {
                    continue;
                };
                if !self.rng.random_bool(p) {
                    continue;
                }
                let h = HostId::PoolUser(k);
                let now = self.local(h);
                let reason = if self.cfg.mutation == Some(Mutation::MislabelledRequestedFailovers) {
                    FailoverReason::NoAnswer
                } else {
                    FailoverReason::Requested
                };
                let s = self.pus[k].sessions[n].as_mut().expect("present");
                s.requested_from = Some(pe);
                let no = s.no;
                s.core.failover_because(now, reason);
                self.stats.requested_failovers += 1;
                self.note(|| format!("{h}: S{no} asks to leave {pe}"));
                self.pump_session(k, n);
                self.flush(h);
                if self.failure.is_some() {
                    return;
                }
            }
        }
    }

    /// What the PE's session side asked for: messages on session associations, closes, and
    /// its reports (a cookie echo it refused breaks `cookie_accepted`).
    pub(super) fn flush_server(&mut self, j: usize) {
        let h = HostId::PoolElement(j);
        loop {
            let Some(server) = self.pes[j].server.as_mut() else {
                return;
            };
            let actions: Vec<ServerAction> = std::iter::from_fn(|| server.poll_action()).collect();
            let events: Vec<ServerEvent> = std::iter::from_fn(|| server.poll_event()).collect();
            if actions.is_empty() && events.is_empty() {
                return;
            }
            for e in &events {
                if let ServerEvent::CookieEcho {
                    session, result, ..
                } = e
                {
                    self.stats.cookie_echoes += 1;
                    let (owed, why_owed) = self
                        .verdicts
                        .remove(session)
                        .unwrap_or((true, "no verdict noted".into()));
                    match result {
                        Err(why) if owed => {
                            let msg = format!(
                                "PE{j} refused the cookie echoed on session association #{session} ({why_owed}): {why}"
                            );
                            self.fail("cookie_accepted", msg);
                            return;
                        }
                        Ok(()) if !owed => {
                            let msg = format!(
                                "PE{j} accepted the cookie echoed on session association #{session}, which it could not verify: {why_owed}"
                            );
                            self.fail("cookie_authentic", msg);
                            return;
                        }
                        Err(why) => {
                            self.stats.cookie_refusals += 1;
                            if let Some(msg) = self.refusal_unexplained(&actions, *session) {
                                let msg = format!("PE{j} refused a cookie ({why}) {msg}");
                                self.fail("cookie_authentic", msg);
                                return;
                            }
                        }
                        Ok(()) => {}
                    }
                }
            }
            for e in events {
                self.job_report(j, &e);
                if !matches!(e, ServerEvent::Report(_)) {
                    self.note(|| format!("{h}: {e:?}"));
                }
            }
            for a in actions {
                match a {
                    ServerAction::Transmit {
                        session,
                        ppid,
                        data,
                        ..
                    } => {
                        if ppid == Protocol::Asap.ppid() {
                            self.cookie_issued(j, session, &data);
                        }
                        let bytes = frame(ppid, &data);
                        self.send(session, h, &bytes);
                        if self.cfg.mutation == Some(Mutation::DuplicatedSessionMessages) {
                            self.send(session, h, &bytes);
                        }
                    }
                    ServerAction::Close(session) | ServerAction::Abort(session) => {
                        self.pes[j].sessions.remove(&session);
                        self.close(session, h);
                    }
                }
            }
        }
    }

    /// Notes a cookie PE j sends on session association `session` (who sealed it, for whom,
    /// when).
    fn cookie_issued(&mut self, j: usize, session: u64, data: &[u8]) {
        let Ok(AsapMessage::Cookie(c)) = self.codec.decode::<AsapMessage>(data).map(|d| d.message)
        else {
            return;
        };
        let origin = CookieOrigin {
            pe: j,
            seal: self.seal_of(j),
            pu: self.pu_of_session(session),
            calcapp: self.is_calcapp_pool(&self.pes[j].pool),
            identity: self.binding_identity(session, HostId::PoolElement(j)),
            issued_secs: Now::from_monotonic(self.local(HostId::PoolElement(j)))
                .unix
                .as_secs(),
        };
        self.issued.insert(c.cookie, origin);
    }

    /// A refused cookie echo is answered on its association with an ASAP_ERROR, Invalid
    /// Values (0x3) or Rejected due to security considerations (0xa), before the abort: `None`
    /// when it was, else what was sent instead.
    fn refusal_unexplained(&self, actions: &[ServerAction], session: u64) -> Option<String> {
        for a in actions {
            match a {
                ServerAction::Transmit {
                    session: s,
                    ppid: 11,
                    data,
                    ..
                } if *s == session => {
                    if let Ok(AsapMessage::Error(e)) =
                        self.codec.decode::<AsapMessage>(data).map(|d| d.message)
                    {
                        let codes: Vec<CauseCode> = e.error.causes.iter().map(|c| c.code).collect();
                        return if codes.iter().any(|c| {
                            matches!(c, CauseCode::InvalidValues | CauseCode::RejectedSecurity)
                        }) {
                            None
                        } else {
                            Some(format!("with ASAP_ERROR causes {codes:?}"))
                        };
                    }
                }
                ServerAction::Abort(s) | ServerAction::Close(s) if *s == session => {
                    return Some("and ended the session without an ASAP_ERROR first".into())
                }
                _ => {}
            }
        }
        Some("without an ASAP_ERROR".into())
    }

    /// [`Mutation::CalcAppEchoLosesProgress`]: a CalcApp cookie echo on its way to the PE with
    /// its progress set to none (the re-encoded message), else `None`.
    pub(super) fn reset_calcapp_echo(&self, bytes: &[u8]) -> Option<Vec<u8>> {
        if self.cfg.mutation != Some(Mutation::CalcAppEchoLosesProgress) {
            return None;
        }
        let Some((11, m)) = unframe(bytes) else {
            return None;
        };
        let Ok(AsapMessage::CookieEcho(mut echo)) =
            self.codec.decode::<AsapMessage>(m).map(|d| d.message)
        else {
            return None;
        };
        let mut cookie = CalcAppCookie::decode(&echo.cookie).ok()?;
        cookie.completed = 0;
        echo.cookie = cookie.encode().to_vec();
        let b = self.codec.encode(&AsapMessage::CookieEcho(echo)).ok()?;
        Some(frame(11, &b))
    }

    /// Follows PE j's CalcApp jobs by its service's reports: `calcapp_max_jobs` (never more
    /// jobs at once than configured) and `calcapp_resumes_from_cookie` (a job resumed from a
    /// cookie echo starts where that cookie says).
    pub(super) fn job_report(&mut self, j: usize, e: &ServerEvent) {
        match e {
            ServerEvent::Report(ServerReport::JobAccepted {
                session,
                job_id,
                completed,
                resumed,
                ..
            }) => {
                let p = &mut self.pes[j];
                p.jobs.insert((session.0, *job_id));
                if p.jobs.len() > self.cfg.calcapp_max_jobs {
                    let msg = format!(
                        "PE{j} runs {} CalcApp jobs at once ({:?}), more than its {}",
                        p.jobs.len(),
                        p.jobs,
                        self.cfg.calcapp_max_jobs
                    );
                    self.fail("calcapp_max_jobs", msg);
                    return;
                }
                if *resumed {
                    self.stats.jobs_resumed += 1;
                    let echoed = self.echoed_jobs.get(&session.0).copied();
                    if echoed.is_none_or(|c| c.job_id != *job_id || c.completed != *completed) {
                        let msg = format!(
                            "PE{j} resumed job {job_id} at {completed} calculations on session association #{}, the cookie echoed there held {echoed:?}",
                            session.0
                        );
                        self.fail("calcapp_resumes_from_cookie", msg);
                    }
                }
            }
            ServerEvent::Report(ServerReport::JobRejected { .. }) => {
                self.stats.jobs_rejected += 1;
            }
            ServerEvent::Report(
                ServerReport::JobCompleted {
                    session, job_id, ..
                }
                | ServerReport::JobTimedOut { session, job_id },
            ) => {
                self.pes[j].jobs.remove(&(session.0, *job_id));
            }
            ServerEvent::Ended(session) => {
                self.pes[j].jobs.retain(|(s, _)| s != session);
            }
            _ => {}
        }
    }

    /// The slot of PU k's session that uses association `id`.
    pub(super) fn session_of(&self, k: usize, id: u64) -> Option<usize> {
        self.pus[k]
            .sessions
            .iter()
            .position(|s| s.as_ref().is_some_and(|s| s.assoc == Some(id)))
    }

    /// Whether the PEs of `pool` run CalcApp (the last pool, when the run has CalcApp).
    pub(super) fn is_calcapp_pool(&self, pool: &PoolHandle) -> bool {
        self.cfg.calcapp && self.pools.last() == Some(pool)
    }

    /// Starts a session in slot n of PU k: PingPong, or CalcApp on the CalcApp pool.
    pub(super) fn start_session(&mut self, k: usize, n: usize) {
        if self.pus[k].sessions[n].is_some() {
            return;
        }
        let pool = self.pools[self.rng.random_range(0..self.pools.len())].clone();
        let calcapp = self.is_calcapp_pool(&pool);
        let (global, now) = (self.now, self.local(HostId::PoolUser(k)));
        let (client, what) = if let (true, Some(interval)) = (calcapp, self.cfg.job_interval) {
            // 1-6 jobs arriving over the session's life (RSPLIB `-jobinterval`, exponentially
            // distributed), of 10 million calculations on average (exponentially distributed):
            // the session finishes when all are complete.
            let jobs = self.rng.random_range(1..=6u64);
            let c = CalcAppClient::new(CalcAppClientConfig {
                job_interval: Some(interval),
                job_size: 10_000_000.0,
                jobs: Some(jobs),
                seed: self.rng.random(),
                ..CalcAppClientConfig::default()
            });
            (
                Client::CalcApp(c),
                format!("{jobs} CalcApp jobs, one every {interval:?} on average"),
            )
        } else if calcapp {
            // 1-4 jobs of 1-20 million calculations (1-20 s of a PE's capacity alone, longer
            // than its cookie interval of 5 s, so that failovers carry cookies),
            // queued at once; the session finishes when all are complete.
            let jobs = self.rng.random_range(1..=4u64);
            let mut c = CalcAppClient::new(CalcAppClientConfig {
                job_interval: None,
                jobs: Some(jobs),
                seed: self.rng.random(),
                ..CalcAppClientConfig::default()
            });
            for _ in 0..jobs {
                let size = self.rng.random_range(1_000_000..20_000_000);
                c.submit(Now::from_monotonic(now), size);
            }
            (Client::CalcApp(c), format!("{jobs} CalcApp jobs"))
        } else {
            let count = self.rng.random_range(5..60);
            // The PingPong client resends what is unanswered after each failover.
            let c = PingPongClient::new(PingPongClientConfig {
                interval: Duration::from_millis(500),
                reply_timeout: Duration::from_secs(5),
                count: Some(count),
                ..PingPongClientConfig::default()
            });
            (Client::PingPong(c), format!("{count} pings"))
        };
        let mut config = SessionConfig::new(pool);
        // Both clients resend what is outstanding after a failover (CalcApp: its Request,
        // unless a cookie was echoed).
        config.application_resends = true;
        // Manual failover mode (drawn only when the seed has it): the session reports a
        // failover as necessary and the application asks for it, as RSPLIB's clients do.
        if self.cfg.manual_failover > 0.0 && self.rng.random_bool(self.cfg.manual_failover) {
            config.auto_failover = false;
        }
        let manual = !config.auto_failover;
        self.next_session += 1;
        let no = self.next_session;
        let mut core = PoolUserSession::new(config);
        core.open(now);
        self.stats.sessions += 1;
        self.note(|| {
            let mode = if manual { ", manual failover" } else { "" };
            format!("PU{k}: session S{no} opens ({what}{mode})")
        });
        self.pus[k].sessions[n] = Some(SimSession {
            no,
            core,
            client,
            jobs: JobLedger::default(),
            assoc: None,
            failovers_seen: 0,
            held: None,
            sent_on_assoc: 0,
            sent: BTreeMap::new(),
            answered: BTreeSet::new(),
            moving_since: Some(global),
            last_progress: global,
            card_left: Vec::new(),
            requested_from: None,
            failing_because: None,
        });
        self.pump_session(k, n);
        self.flush(HostId::PoolUser(k));
    }

    /// Runs what session n of PU k and its PingPong client ask for until neither asks more,
    /// checking `cookie_echo_first`, `ping_answered_once`, `session_ends_with_cause`.
    pub(super) fn pump_session(&mut self, k: usize, n: usize) {
        let h = HostId::PoolUser(k);
        let (global, now) = (self.now, self.local(h));
        loop {
            let Some(s) = self.pus[k].sessions[n].as_mut() else {
                return;
            };
            let no = s.no;
            // One item at a time, the client's outputs first: what the client asks for is
            // handed to the core before the core's next report reaches the client, as an
            // application that reacts to each event does.
            let (mut outputs, mut actions, mut events) = (Vec::new(), Vec::new(), Vec::new());
            if let Some(o) = s.client.service().poll_output() {
                outputs.push(o);
            } else if let Some(a) = s.core.poll_action() {
                actions.push(a);
            } else if let Some(e) = s.core.poll_event() {
                events.push(e);
            } else {
                return;
            }
            for a in actions {
                match a {
                    SessionAction::Resolve(pool) => {
                        let p = &mut self.pus[k];
                        let r = p.resolver.resolve(now, pool.clone());
                        p.outstanding.insert(r, (pool, global));
                        p.session_requests.insert(r, n);
                        if p.assoc.is_none() && p.connecting.is_none() {
                            self.pu_connect(k);
                        }
                    }
                    SessionAction::Connect(pe) => {
                        if !self.selection_made(k, n) {
                            return;
                        }
                        let addrs: Vec<SocketAddr> = pe
                            .user_transport
                            .as_address()
                            .map(|t| {
                                t.addresses
                                    .iter()
                                    .map(|ip| SocketAddr::new(*ip, t.port))
                                    .collect()
                            })
                            .unwrap_or_default();
                        let old = self.pus[k].sessions[n]
                            .as_mut()
                            .and_then(|s| s.assoc.take());
                        if let Some(old) = old {
                            self.close(old, h);
                        }
                        let id = self.connect(h, Service::Session, &addrs);
                        self.note(|| format!("{h}: S{no} connects to {} (#{id})", pe.id));
                        if let Some(s) = self.pus[k].sessions[n].as_mut() {
                            s.assoc = Some(id);
                        }
                    }
                    SessionAction::Abort | SessionAction::Close => {
                        let old = self.pus[k].sessions[n]
                            .as_mut()
                            .and_then(|s| s.assoc.take());
                        if let Some(old) = old {
                            self.close(old, h);
                        }
                    }
                    SessionAction::Transmit { ppid, data, .. } => {
                        let Some(s) = self.pus[k].sessions[n].as_mut() else {
                            continue;
                        };
                        let Some(assoc) = s.assoc else { continue };
                        s.sent_on_assoc += 1;
                        let bytes = frame(ppid, &data);
                        if self.cfg.mutation == Some(Mutation::ReorderedSessionStart)
                            && self.expect_echo.contains_key(&assoc)
                        {
                            // The defect: the first message waits for the second.
                            if s.sent_on_assoc == 1 {
                                s.held = Some(bytes);
                                continue;
                            }
                            let held = s.held.take();
                            self.send(assoc, h, &bytes);
                            if let Some(b) = held {
                                self.send(assoc, h, &b);
                            }
                            continue;
                        }
                        self.send(assoc, h, &bytes);
                    }
                    SessionAction::ReportUnreachable(pool, pe) => {
                        let requested = self.pus[k].sessions[n]
                            .as_ref()
                            .is_some_and(|s| s.requested_from == Some(pe));
                        if requested {
                            let msg = format!(
                                "PU{k} session S{no} reports {pe} unreachable, which its application only asked to leave"
                            );
                            self.fail("failover_reason", msg);
                            return;
                        }
                        self.stats.unreachable_reports += 1;
                        self.pus[k].resolver.report_unreachable(&pool, pe);
                    }
                }
            }
            for e in events {
                self.note(|| format!("{h}: S{no} {e:?}"));
                let necessary = matches!(e, SessionEvent::FailoverNecessary { .. });
                let Some(s) = self.pus[k].sessions[n].as_mut() else {
                    break;
                };
                match e {
                    SessionEvent::Opened { .. } => {
                        s.moving_since = None;
                        s.last_progress = global;
                        s.client.service().start(Now::from_monotonic(now));
                    }
                    SessionEvent::Data { ppid, stream, data } => {
                        if matches!(s.client, Client::CalcApp(_)) {
                            // The PE's keep-alives and answers are a CalcApp job's progress.
                            s.last_progress = global;
                        }
                        // A bad answer is the client's to judge (it fails over).
                        let _ = s.client.service().handle_message(
                            Now::from_monotonic(now),
                            ppid,
                            stream,
                            &data,
                        );
                    }
                    SessionEvent::FailoverStarted { from, reason, .. }
                    | SessionEvent::FailoverNecessary { from, reason, .. } => {
                        s.moving_since = Some(global);
                        let asked = s.requested_from.take();
                        if asked.is_some() != (reason == FailoverReason::Requested)
                            || asked.is_some_and(|pe| pe != from)
                        {
                            let msg = format!(
                                "PU{k} session S{no} leaves {from} because {reason} (label {}), its application asked to leave {asked:?}",
                                reason.label()
                            );
                            self.fail("failover_reason", msg);
                            return;
                        }
                        s.failing_because = Some(reason);
                        if necessary {
                            // Manual mode: the application continues the failover at once,
                            // as RSPLIB's clients call `rsp_forcefailover`.
                            self.stats.manual_failovers += 1;
                            s.core.failover(now);
                        }
                    }
                    SessionEvent::Failover(record) => {
                        let started = s.failing_because.take();
                        if started.as_ref().is_some_and(|r| *r != record.reason) {
                            let msg = format!(
                                "PU{k} session S{no}: a failover that started because {} completed with the receipt's reason {}",
                                started.expect("some"),
                                record.reason
                            );
                            self.fail("failover_reason", msg);
                            return;
                        }
                        let s = self.pus[k].sessions[n].as_mut().expect("present");
                        s.moving_since = None;
                        s.last_progress = global;
                        s.failovers_seen += 1;
                        self.stats.failovers += 1;
                        if record.with_cookie {
                            self.stats.failovers_with_cookie += 1;
                        }
                        let s = self.pus[k].sessions[n].as_mut().expect("present");
                        s.client
                            .service()
                            .failover_complete(Now::from_monotonic(now), record.with_cookie);
                    }
                    SessionEvent::Failed { reason } => {
                        self.stats.sessions_failed += 1;
                        let s = self.pus[k].sessions[n].take().expect("present");
                        let recorded = matches!(
                            &s.core.receipt().outcome,
                            Some(SessionOutcome::Failed { reason: r }) if *r == reason
                        );
                        if reason.is_empty() || !recorded || !s.core.is_ended() {
                            let msg = format!(
                                "PU{k} session S{no} gave up with cause {reason:?}, receipt outcome {:?}, ended {}",
                                s.core.receipt().outcome,
                                s.core.is_ended()
                            );
                            self.fail("session_ends_with_cause", msg);
                            return;
                        }
                        if let Some(a) = s.assoc {
                            self.close(a, h);
                        }
                        self.session_over(k, n);
                        return;
                    }
                    _ => {}
                }
            }
            for o in outputs {
                let Some(s) = self.pus[k].sessions[n].as_mut() else {
                    break;
                };
                match o {
                    ClientOutput::Send { ppid, stream, data } => {
                        // Refused while failing over: the client resends after the failover.
                        let _ = s.core.send_seen(now, s.failovers_seen, ppid, stream, data);
                    }
                    ClientOutput::ClearCookie => s.core.clear_cookie(),
                    ClientOutput::Failover(reason) => {
                        let reason = match reason {
                            rserpool_services::FailoverReason::Rejected => FailoverReason::Rejected,
                            rserpool_services::FailoverReason::ProtocolError => {
                                let what = match s.client {
                                    Client::PingPong(_) => "bad PingPong answer",
                                    Client::CalcApp(_) => "bad CalcApp answer",
                                };
                                FailoverReason::ProtocolError(what.into())
                            }
                            _ => FailoverReason::NoAnswer,
                        };
                        s.core.failover_because(now, reason);
                    }
                    ClientOutput::Report(ClientReport::PingSent { message_no, resent }) => {
                        s.sent.insert(message_no, global);
                        s.last_progress = global;
                        if !resent {
                            self.stats.pings += 1;
                        }
                    }
                    ClientOutput::Report(ClientReport::Pong { message_no, .. }) => {
                        if !s.sent.contains_key(&message_no) || !s.answered.insert(message_no) {
                            let msg = format!(
                                "PU{k} session S{no}: Ping {message_no} answered twice or never sent"
                            );
                            self.fail("ping_answered_once", msg);
                            return;
                        }
                        self.stats.pongs += 1;
                        if let Some(s) = self.pus[k].sessions[n].as_mut() {
                            s.last_progress = global;
                        }
                    }
                    ClientOutput::Report(ClientReport::DuplicatePong { message_no }) => {
                        let msg =
                            format!("PU{k} session S{no}: a second Pong for Ping {message_no}");
                        self.fail("ping_answered_once", msg);
                        return;
                    }
                    ClientOutput::Report(ClientReport::JobQueued { job_id, .. }) => {
                        s.jobs.queued.insert(job_id);
                        self.stats.jobs += 1;
                    }
                    ClientOutput::Report(ClientReport::JobRequested { job_id }) => {
                        s.jobs.current = Some(job_id);
                        s.last_progress = global;
                    }
                    ClientOutput::Report(ClientReport::JobAccepted { .. }) => {
                        s.last_progress = global;
                    }
                    ClientOutput::Report(ClientReport::JobCompleted { job_id, .. }) => {
                        if !s.jobs.queued.contains(&job_id) || !s.jobs.completed.insert(job_id) {
                            let msg = format!(
                                "PU{k} session S{no}: CalcApp job {job_id} completed twice or never queued"
                            );
                            self.fail("calcapp_job_once", msg);
                            return;
                        }
                        s.jobs.current = None;
                        s.last_progress = global;
                        self.stats.jobs_completed += 1;
                    }
                    ClientOutput::Finished => {
                        let s = self.pus[k].sessions[n].take().expect("present");
                        let open: Vec<u32> = s
                            .jobs
                            .queued
                            .difference(&s.jobs.completed)
                            .copied()
                            .collect();
                        if !open.is_empty() {
                            let msg = format!(
                                "PU{k} session S{no} finished with CalcApp jobs {open:?} not completed"
                            );
                            self.fail("calcapp_job_once", msg);
                            return;
                        }
                        let unanswered: Vec<u64> = s
                            .sent
                            .keys()
                            .filter(|m| !s.answered.contains(m))
                            .copied()
                            .collect();
                        if !unanswered.is_empty() {
                            let msg = format!(
                                "PU{k} session S{no} finished with Pings {unanswered:?} unanswered"
                            );
                            self.fail("ping_answered_once", msg);
                            return;
                        }
                        let mut s = s;
                        s.core.close(now);
                        while let Some(a) = s.core.poll_action() {
                            if matches!(a, SessionAction::Close | SessionAction::Abort) {
                                if let Some(a) = s.assoc.take() {
                                    self.close(a, h);
                                }
                            }
                        }
                        if let Some(a) = s.assoc.take() {
                            self.close(a, h);
                        }
                        self.stats.sessions_finished += 1;
                        self.note(|| format!("{h}: S{no} finished"));
                        self.session_over(k, n);
                        return;
                    }
                    ClientOutput::Report(_) => {}
                    _ => {}
                }
            }
        }
    }

    /// Session slot n of PU k is free: a new session starts there a little later.
    pub(super) fn session_over(&mut self, k: usize, n: usize) {
        let r: Vec<RequestId> = self.pus[k]
            .session_requests
            .iter()
            .filter(|(_, &slot)| slot == n)
            .map(|(r, _)| *r)
            .collect();
        for r in r {
            self.pus[k].session_requests.remove(&r);
        }
        let back = self.exp(Duration::from_secs(3));
        self.schedule(self.now + back, Ev::SessionStart(k, n));
    }

    /// Every live session makes progress: bound with no Ping older than the reply timeout (the
    /// client fails over then), or without a PE for less than [`SESSION_MOVE_BOUND`].
    pub(super) fn audit_sessions(&mut self) {
        self.stats.checks += 1;
        let now = self.now;
        let broken = self.pus.iter().enumerate().find_map(|(k, p)| {
            p.sessions
                .iter()
                .flatten()
                .find_map(|s| session_stall(k, s, now))
        });
        if let Some(msg) = broken {
            self.fail("session_progress", msg);
            return;
        }
        self.schedule(now + Duration::from_secs(1), Ev::SessionAudit);
        self.request_failovers();
    }
}

/// Why session `s` of PU `k` has stopped making progress at `now`, if it has: no PE for longer
/// than [`SESSION_MOVE_BOUND`], a CalcApp job that heard nothing within the client's keep-alive
/// interval plus its timeout, or a PingPong session with nothing sent or answered, or a Ping
/// neither answered nor failed over, within the reply timeout.
fn session_stall(k: usize, s: &SimSession, now: Duration) -> Option<String> {
    if let Some(since) = s.moving_since {
        return (now > since + SESSION_MOVE_BOUND).then(|| {
            format!(
                "PU{k} session S{} has had no PE since {since:?} ({:?})",
                s.no,
                s.core.receipt()
            )
        });
    }
    if !s.core.is_bound() {
        return None;
    }
    match &s.client {
        Client::CalcApp(_) => {
            let c = CalcAppClientConfig::default();
            let bound = (c.keep_alive_interval + c.keep_alive_timeout).mul_f64(1.05) + PING_SLACK;
            let job = s.jobs.current?;
            (now > s.last_progress + bound).then(|| {
                format!(
                    "PU{k} session S{}: CalcApp job {job} on {:?} heard nothing since {:?} (now {now:?})",
                    s.no,
                    s.core.current_pe(),
                    s.last_progress
                )
            })
        }
        Client::PingPong(client) => {
            let bound = PingPongClientConfig::default().reply_timeout.mul_f64(1.05) + PING_SLACK;
            if now > s.last_progress + bound {
                return Some(format!(
                    "PU{k} session S{}: bound to {:?}, nothing sent or answered since {:?} (now {now:?})",
                    s.no,
                    s.core.current_pe(),
                    s.last_progress
                ));
            }
            client
                .outstanding()
                .filter_map(|m| s.sent.get(&m).map(|t| (m, *t)))
                .find(|(_, t)| now > *t + bound)
                .map(|(m, t)| {
                    format!(
                        "PU{k} session S{}: Ping {m} sent at {t:?} to {:?} is neither answered nor failed over by {now:?}",
                        s.no,
                        s.core.current_pe()
                    )
                })
        }
    }
}

impl World {
    /// The identity PE `pe` binds the pool user's cookies to on session association `id`, as
    /// the PE's driver computes it: the smallest of the pool user's addresses — every address
    /// of a multi-homed SCTP peer (so the same whichever path came up), the one address a TCP
    /// connection came from. `None` when the association is gone.
    pub(super) fn binding_identity(&self, id: u64, pe: HostId) -> Option<Vec<u8>> {
        let a = self.assocs.get(&id)?;
        let side = usize::from(a.ends[0] == pe);
        let ips = if a.tcp {
            vec![a.addrs[side].ip()]
        } else {
            self.host_ips(a.ends[side])
        };
        Some(match ips.into_iter().min()? {
            IpAddr::V4(ip) => ip.octets().to_vec(),
            IpAddr::V6(ip) => ip.octets().to_vec(),
        })
    }
}
