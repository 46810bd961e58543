//! The session layer in the simulated world: PU sessions (PingPong and CalcApp clients over
//! `PoolUserSession`), the PEs' session side (`SessionServer`), and the invariants about them.
//! A child module of `world`, so it reaches the world's state directly.

use super::*;

impl World {
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
            for e in events {
                if let ServerEvent::CookieEcho {
                    session, result, ..
                } = &e
                {
                    self.stats.cookie_echoes += 1;
                    if let Err(why) = result {
                        let msg = format!(
                            "PE{j} refused the cookie echoed on session association #{session}: {why}"
                        );
                        self.fail("cookie_accepted", msg);
                    }
                }
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
        let (client, what) = if calcapp {
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
        self.next_session += 1;
        let no = self.next_session;
        let mut core = PoolUserSession::new(config);
        core.open(now);
        self.stats.sessions += 1;
        self.note(|| format!("PU{k}: session S{no} opens ({what})"));
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
                        self.stats.unreachable_reports += 1;
                        self.pus[k].resolver.report_unreachable(&pool, pe);
                    }
                }
            }
            for e in events {
                self.note(|| format!("{h}: S{no} {e:?}"));
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
                    SessionEvent::FailoverStarted { .. } => {
                        s.moving_since = Some(global);
                    }
                    SessionEvent::Failover(record) => {
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
        let mut broken = None;
        'all: for (k, p) in self.pus.iter().enumerate() {
            for s in p.sessions.iter().flatten() {
                if let Some(since) = s.moving_since {
                    if now > since + SESSION_MOVE_BOUND {
                        let msg = format!(
                            "PU{k} session S{} has had no PE since {since:?} ({:?})",
                            s.no,
                            s.core.receipt()
                        );
                        broken = Some(msg);
                        break 'all;
                    }
                } else if let (true, Client::CalcApp(_)) = (s.core.is_bound(), &s.client) {
                    // A running job hears from its PE (keep-alives, answers) or fails over
                    // within the client's keep-alive interval plus its timeout.
                    let c = CalcAppClientConfig::default();
                    let bound =
                        (c.keep_alive_interval + c.keep_alive_timeout).mul_f64(1.05) + PING_SLACK;
                    if let Some(job) = s.jobs.current {
                        if now > s.last_progress + bound {
                            let msg = format!(
                                "PU{k} session S{}: CalcApp job {job} on {:?} heard nothing since {:?} (now {now:?})",
                                s.no,
                                s.core.current_pe(),
                                s.last_progress
                            );
                            broken = Some(msg);
                            break 'all;
                        }
                    }
                } else if let (true, Client::PingPong(client)) = (s.core.is_bound(), &s.client) {
                    let bound =
                        PingPongClientConfig::default().reply_timeout.mul_f64(1.05) + PING_SLACK;
                    if now > s.last_progress + bound {
                        let msg = format!(
                            "PU{k} session S{}: bound to {:?}, nothing sent or answered since {:?} (now {now:?})",
                            s.no,
                            s.core.current_pe(),
                            s.last_progress
                        );
                        broken = Some(msg);
                        break 'all;
                    }
                    if let Some((m, t)) = client
                        .outstanding()
                        .filter_map(|m| s.sent.get(&m).map(|t| (m, *t)))
                        .find(|(_, t)| now > *t + bound)
                    {
                        let msg = format!(
                            "PU{k} session S{}: Ping {m} sent at {t:?} to {:?} is neither answered nor failed over by {now:?}",
                            s.no,
                            s.core.current_pe()
                        );
                        broken = Some(msg);
                        break 'all;
                    }
                }
            }
        }
        if let Some(msg) = broken {
            self.fail("session_progress", msg);
            return;
        }
        self.schedule(now + Duration::from_secs(1), Ev::SessionAudit);
    }
}
