//! A minimal session layer in virtual time: one pool user session over a pool of pool elements,
//! with RSPLIB's cookie handling (the last cookie kept, echoed first after a failover). Enough to
//! drive the services' state machines the way crates/endpoint does, deterministically.
#![allow(dead_code)]

use rserpool_services::{
    ClientOutput, ClientReport, ClientService, FailoverReason, Now, ServerOutput, ServerReport,
    ServerService, SessionId, SessionInfo,
};
use std::collections::VecDeque;
use std::time::Duration;

pub struct Pe {
    pub service: Box<dyn ServerService>,
    pub alive: bool,
    pub reports: Vec<ServerReport>,
    pub aborts: Vec<(SessionId, String)>,
    pub cookie_refusals: Vec<String>,
}

pub struct Sim {
    pub now: Now,
    pub pes: Vec<Pe>,
    pub client: Box<dyn ClientService>,
    pub current: Option<usize>,
    pub session: SessionId,
    next_session: u64,
    pub identity: Option<Vec<u8>>,
    pub cookie: Option<Vec<u8>>,
    /// Data from the PE to the PU, in flight (lost when the PE dies).
    in_flight: VecDeque<(usize, SessionId, u32, Vec<u8>)>,
    pub reports: Vec<ClientReport>,
    pub failovers: Vec<(Option<usize>, usize, bool, String)>,
    pub finished: bool,
    pub cookies_received: usize,
    pub last_load: Vec<f64>,
}

impl Sim {
    pub fn new(pes: Vec<Box<dyn ServerService>>, client: Box<dyn ClientService>) -> Self {
        Self {
            now: Now::from_monotonic(Duration::ZERO),
            pes: pes
                .into_iter()
                .map(|service| Pe {
                    service,
                    alive: true,
                    reports: Vec::new(),
                    aborts: Vec::new(),
                    cookie_refusals: Vec::new(),
                })
                .collect(),
            client,
            current: None,
            session: SessionId(0),
            next_session: 1,
            identity: None,
            cookie: None,
            in_flight: VecDeque::new(),
            reports: Vec::new(),
            failovers: Vec::new(),
            finished: false,
            cookies_received: 0,
            last_load: Vec::new(),
        }
    }

    fn open(&mut self, pe: usize) -> SessionId {
        let session = SessionId(self.next_session);
        self.next_session += 1;
        self.pes[pe].service.open_session(
            self.now,
            session,
            SessionInfo {
                identity: self.identity.clone(),
            },
        );
        self.current = Some(pe);
        self.session = session;
        session
    }

    pub fn start(&mut self, pe: usize) {
        self.open(pe);
        self.drain_pe(pe);
        self.client.start(self.now);
        self.pump();
    }

    /// The next alive PE after the current one (round robin).
    fn select(&self) -> Option<usize> {
        let n = self.pes.len();
        let from = self.current.map_or(0, |c| c + 1);
        (0..n).map(|i| (from + i) % n).find(|&i| self.pes[i].alive)
    }

    pub fn failover(&mut self, why: &str) {
        let old = self.current;
        if let Some(c) = old {
            if self.pes[c].alive {
                self.pes[c].service.close_session(self.now, self.session);
                self.drain_pe(c);
            }
        }
        self.in_flight.clear();
        let Some(next) = self.select() else {
            panic!("no PE left for failover ({why})");
        };
        let session = self.open(next);
        let echoed = if let Some(cookie) = self.cookie.clone() {
            if let Err(e) = self.pes[next]
                .service
                .handle_cookie_echo(self.now, session, &cookie)
            {
                self.pes[next].cookie_refusals.push(e.to_string());
            }
            true
        } else {
            false
        };
        self.failovers.push((old, next, echoed, why.to_string()));
        self.drain_pe(next);
        if self.current == Some(next) {
            self.client.failover_complete(self.now, echoed);
        }
        self.pump();
    }

    /// Outputs of PE `i`: data towards the PU goes in flight; cookies are stored at once.
    fn drain_pe(&mut self, i: usize) {
        let mut aborted = false;
        while let Some(o) = self.pes[i].service.poll_output() {
            match o {
                ServerOutput::Send {
                    session,
                    ppid,
                    data,
                    ..
                } => self.in_flight.push_back((i, session, ppid, data)),
                ServerOutput::Cookie { session, cookie }
                    if self.current == Some(i) && session == self.session =>
                {
                    self.cookies_received += 1;
                    self.cookie = Some(cookie);
                }
                ServerOutput::Abort { session, reason } => {
                    self.pes[i].aborts.push((session, reason.to_string()));
                    if self.current == Some(i) && session == self.session {
                        aborted = true;
                    }
                }
                ServerOutput::Shutdown { .. } => {}
                ServerOutput::Load(l) => self.last_load.push(l),
                ServerOutput::Report(r) => self.pes[i].reports.push(r),
                _ => {}
            }
        }
        if aborted {
            // What the PE sent before its ABORT has reached the PU (loopback, ordered).
            self.deliver_in_flight();
            self.pes[i].service.close_session(self.now, self.session);
            self.drain_pe(i);
            self.failover("session aborted by the PE");
        }
    }

    fn deliver_in_flight(&mut self) {
        while let Some((pe, session, ppid, data)) = self.in_flight.pop_front() {
            if self.current == Some(pe) && session == self.session {
                let _ = self.client.handle_message(self.now, ppid, 0, &data);
            }
        }
    }

    /// Runs the client's outputs until quiet.
    pub fn pump(&mut self) {
        loop {
            let mut progress = false;
            while let Some(o) = self.client.poll_output() {
                progress = true;
                match o {
                    ClientOutput::Send { ppid, stream, data } => {
                        let Some(c) = self.current else { continue };
                        if !self.pes[c].alive {
                            continue; // lost; the client notices by its timeouts
                        }
                        let session = self.session;
                        let _ = self.pes[c]
                            .service
                            .handle_message(self.now, session, ppid, stream, &data);
                        self.drain_pe(c);
                    }
                    ClientOutput::ClearCookie => self.cookie = None,
                    ClientOutput::Failover(reason) => {
                        let why = match reason {
                            FailoverReason::NoAnswer => "no answer",
                            FailoverReason::Rejected => "rejected",
                            _ => "protocol error",
                        };
                        self.failover(why);
                    }
                    ClientOutput::Report(r) => self.reports.push(r),
                    ClientOutput::Finished => self.finished = true,
                    _ => {}
                }
            }
            while let Some((pe, session, ppid, data)) = self.in_flight.pop_front() {
                progress = true;
                if self.current == Some(pe) && session == self.session {
                    let _ = self.client.handle_message(self.now, ppid, 0, &data);
                }
            }
            if !progress {
                break;
            }
        }
    }

    /// kill -9 of PE `i`: its state is gone, the PU notices the lost association.
    pub fn kill(&mut self, i: usize) {
        self.pes[i].alive = false;
        if self.current == Some(i) {
            self.in_flight.clear();
            self.failover("association lost");
        }
    }

    /// Like SIGSTOP: the PE stays connected but neither answers nor runs timers.
    pub fn freeze(&mut self, i: usize) {
        self.pes[i].alive = false;
    }

    /// Advances virtual time to the next timer (at most `max` ahead) and handles it.
    pub fn step(&mut self, max: Duration) {
        let limit = self.now.monotonic + max;
        let mut next = self.client.poll_timeout();
        for pe in &self.pes {
            if pe.alive {
                next = [next, pe.service.poll_timeout()]
                    .into_iter()
                    .flatten()
                    .min();
            }
        }
        let at = next.unwrap_or(limit).min(limit).max(self.now.monotonic);
        self.now = self.now.advance(at - self.now.monotonic);
        for i in 0..self.pes.len() {
            if self.pes[i].alive && self.pes[i].service.poll_timeout().is_some_and(|t| t <= at) {
                self.pes[i].service.handle_timeout(self.now);
                self.drain_pe(i);
            }
        }
        if self.client.poll_timeout().is_some_and(|t| t <= at) {
            self.client.handle_timeout(self.now);
        }
        self.pump();
    }

    /// Steps until `done` or `limit` of virtual time passed.
    pub fn run_until(&mut self, limit: Duration, mut done: impl FnMut(&Sim) -> bool) -> bool {
        let end = self.now.monotonic + limit;
        while self.now.monotonic < end {
            if done(self) {
                return true;
            }
            self.step(end - self.now.monotonic);
        }
        done(self)
    }
}
