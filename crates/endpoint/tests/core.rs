//! The session, session-server and pool-element cores in virtual time: failover with the cookie
//! echoed before any data, bounded retries with back-off, the business card preferred, the
//! server hunt with T2/T5 and MAX-REG-ATTEMPT, a new home on an H=1 keep-alive.

use rand::rngs::StdRng;
use rand::SeedableRng;
use rserpool_endpoint::pe::{PeEvent, PoolElementConfig, PoolElementCore};
use rserpool_endpoint::server::{ServerAction, ServerConfig, ServerEvent, SessionServer};
use rserpool_endpoint::session::{
    CandidateSource, FailoverReason, Outcome, PoolUserSession, SessionAction, SessionConfig,
    SessionEvent,
};
use rserpool_services::{
    AbortReason, CookieRefused, Now, ServerOutput, ServerService, ServiceKind, SessionId,
    SessionInfo,
};
use rserpool_testkit::{tcp_pe, LOCALHOST};
use rserpool_wire::asap::{self, AsapMessage};
use rserpool_wire::{
    Codec, CodecConfig, PoolElement, PoolElementId, PoolHandle, PoolPolicy, RegistrarId,
    TransportAddress, UserTransport,
};
use std::collections::VecDeque;
use std::net::SocketAddr;
use std::time::Duration;

const MS: Duration = Duration::from_millis(1);

fn codec() -> Codec {
    Codec::new(CodecConfig::default())
}

fn enc(m: &AsapMessage) -> Vec<u8> {
    codec().encode(m).unwrap()
}

fn dec(b: &[u8]) -> AsapMessage {
    codec().decode::<AsapMessage>(b).unwrap().message
}

/// A PE of this host on TCP port 5000 + `id`, homed at registrar 1.
fn pe(id: u32) -> PoolElement {
    PoolElement {
        home_registrar: RegistrarId(1),
        ..tcp_pe(id, LOCALHOST, 5000 + id as u16)
    }
}

fn pool() -> PoolHandle {
    PoolHandle::from("PingPongPool")
}

fn actions(s: &mut PoolUserSession) -> Vec<SessionAction> {
    std::iter::from_fn(|| s.poll_action()).collect()
}

fn events(s: &mut PoolUserSession) -> Vec<SessionEvent> {
    std::iter::from_fn(|| s.poll_event()).collect()
}

/// Opens a session on [A, B, C] and binds it to A.
fn opened(config: SessionConfig) -> PoolUserSession {
    let mut s = PoolUserSession::new(config);
    s.open(Duration::ZERO);
    assert_eq!(actions(&mut s), vec![SessionAction::Resolve(pool())]);
    s.resolved(
        MS,
        Ok((vec![pe(1), pe(2), pe(3)], Some(PoolPolicy::RoundRobin))),
    );
    assert_eq!(actions(&mut s), vec![SessionAction::Connect(pe(1))]);
    s.connected(2 * MS);
    assert_eq!(
        events(&mut s),
        vec![SessionEvent::Opened {
            pe: PoolElementId(1)
        }]
    );
    s
}

#[test]
fn failover_echoes_the_last_cookie_before_any_data() {
    let mut s = opened(SessionConfig::new(pool()));
    assert!(actions(&mut s).is_empty(), "no cookie yet: nothing to echo");
    s.send(3 * MS, 33, 0, b"ping 1".to_vec()).unwrap();
    assert_eq!(
        actions(&mut s),
        vec![SessionAction::Transmit {
            ppid: 33,
            stream: 0,
            data: b"ping 1".to_vec()
        }]
    );
    s.message(4 * MS, 33, 0, b"pong 1");
    for c in [b"cookie-1".to_vec(), b"cookie-2".to_vec()] {
        s.message(
            5 * MS,
            11,
            0,
            &enc(&AsapMessage::Cookie(asap::Cookie { cookie: c })),
        );
    }
    let r = s.receipt().clone();
    assert_eq!(r.bound.map(|b| b.0), Some(PoolElementId(1)));
    assert_eq!(r.reached, Some((PoolElementId(1), 4 * MS)));
    let _ = events(&mut s);

    // A dies.
    s.association_lost(10 * MS, "peer aborted".into());
    assert_eq!(
        actions(&mut s),
        vec![
            SessionAction::Abort,
            SessionAction::ReportUnreachable(pool(), PoolElementId(1)),
            SessionAction::Connect(pe(2)),
        ],
        "the rest of the resolution is tried first"
    );
    assert_eq!(s.receipt().bound, None, "not bound while moving");
    // Data sent meanwhile is held.
    s.send(11 * MS, 33, 0, b"ping 2".to_vec()).unwrap();
    assert!(actions(&mut s).is_empty());
    s.connected(20 * MS);
    let a = actions(&mut s);
    assert_eq!(a.len(), 2, "{a:?}");
    let SessionAction::Transmit { ppid: 11, data, .. } = &a[0] else {
        panic!("the cookie echo must come first: {a:?}");
    };
    assert_eq!(
        dec(data),
        AsapMessage::CookieEcho(asap::CookieEcho {
            cookie: b"cookie-2".to_vec()
        }),
        "the latest cookie"
    );
    assert_eq!(
        a[1],
        SessionAction::Transmit {
            ppid: 33,
            stream: 0,
            data: b"ping 2".to_vec()
        }
    );
    let ev = events(&mut s);
    let [SessionEvent::FailoverStarted {
        from,
        has_cookie: true,
        ..
    }, SessionEvent::Failover(f)] = &ev[..]
    else {
        panic!("one failover started, one completed: {ev:?}");
    };
    assert_eq!(*from, PoolElementId(1));
    assert_eq!(f.from, PoolElementId(1));
    assert_eq!(f.to, PoolElementId(2));
    assert!(f.with_cookie);
    assert_eq!(
        f.reason,
        FailoverReason::AssociationLost("peer aborted".into())
    );
    assert_eq!((f.started, f.completed, f.attempts), (10 * MS, 20 * MS, 0));
    let r = s.receipt();
    assert_eq!(r.selections.len(), 2);
    assert_eq!(r.selections[0].source, CandidateSource::Resolution);
    assert_eq!(r.selections[0].pool_policy, Some(PoolPolicy::RoundRobin));
    assert_eq!(
        r.selections[0].candidates,
        vec![PoolElementId(1), PoolElementId(2), PoolElementId(3)]
    );
    assert_eq!(r.selections[1].source, CandidateSource::Cache);
    assert_eq!(r.bound, Some((PoolElementId(2), 20 * MS)));
    assert_eq!(r.reached, None, "B has not answered yet");
    let st = s.stats();
    assert_eq!(
        (
            st.selected,
            st.bound,
            st.reached,
            st.failovers,
            st.failovers_with_cookie
        ),
        (2, 2, 1, 1, 1)
    );
    assert_eq!(st.unreachable_reported, 1);
}

/// A PE that refuses the cookie echoed to it (ASAP_ERROR before anything else) is left
/// without being reported unreachable, the next PE gets the same cookie, and each refusal is
/// an attempt of the failover: a cookie every PE refuses ends the session with that cause
/// (before, the refusal was only counted as a protocol error; the PE's abort then started a
/// fresh failover with a fresh count of attempts, as "association lost" with the PE reported
/// unreachable, so a cookie every PE refuses moved the session round them without end).
#[test]
fn a_refused_cookie_is_an_attempt_and_ends_the_session_when_every_pe_refuses() {
    let mut config = SessionConfig::new(pool());
    config.max_attempts = 2;
    let mut s = opened(config);
    s.message(
        3 * MS,
        11,
        0,
        &enc(&AsapMessage::Cookie(asap::Cookie {
            cookie: b"state".to_vec(),
        })),
    );
    s.association_lost(4 * MS, "peer aborted".into());
    let _ = (actions(&mut s), events(&mut s));
    let refusal = enc(&AsapMessage::Error(asap::AsapError {
        error: rserpool_wire::OperationError {
            causes: vec![rserpool_wire::ErrorCause::new(
                rserpool_wire::CauseCode::RejectedSecurity,
            )],
        },
    }));
    // B takes the association, answers the echo with a refusal.
    s.connected(5 * MS);
    let _ = (actions(&mut s), events(&mut s));
    s.message(6 * MS, 11, 0, &refusal);
    let a = actions(&mut s);
    assert_eq!(
        a,
        vec![SessionAction::Abort, SessionAction::Connect(pe(3))],
        "B is left unreported, C is next"
    );
    let ev = events(&mut s);
    assert!(
        matches!(
            &ev[..],
            [SessionEvent::FailoverStarted {
                from: PoolElementId(2),
                reason: FailoverReason::CookieRefused(_),
                has_cookie: true
            }]
        ),
        "{ev:?}"
    );
    // C refuses too: B's and C's refusals use up the 2 attempts of the failover from A.
    s.connected(7 * MS);
    let a = actions(&mut s);
    assert!(
        matches!(&a[0], SessionAction::Transmit { ppid: 11, data, .. }
            if dec(data) == AsapMessage::CookieEcho(asap::CookieEcho { cookie: b"state".to_vec() })),
        "the same cookie: {a:?}"
    );
    let _ = events(&mut s);
    s.message(8 * MS, 11, 0, &refusal);
    assert!(s.is_ended());
    let Some(Outcome::Failed { reason }) = &s.receipt().outcome else {
        panic!("{:?}", s.receipt())
    };
    assert!(
        reason.contains("refused") || reason.contains("ASAP_ERROR"),
        "{reason}"
    );
    assert_eq!(s.stats().cookies_refused_by_pe, 2);
    assert_eq!(s.stats().unreachable_reported, 1, "only A, which failed");
    // A PE that takes the cookie and answers is not affected by a later error.
    let mut s = opened(SessionConfig::new(pool()));
    s.message(
        3 * MS,
        11,
        0,
        &enc(&AsapMessage::Cookie(asap::Cookie {
            cookie: b"state".to_vec(),
        })),
    );
    s.association_lost(4 * MS, "peer aborted".into());
    s.connected(5 * MS);
    s.message(6 * MS, 33, 0, b"pong");
    let _ = (actions(&mut s), events(&mut s));
    s.message(7 * MS, 11, 0, &refusal);
    assert!(s.is_bound());
    assert_eq!(s.stats().protocol_errors, 1);
}

#[test]
fn retries_are_bounded_with_backoff_and_end_in_a_clear_failure() {
    let mut config = SessionConfig::new(pool());
    config.max_attempts = 4;
    let mut s = PoolUserSession::new(config);
    s.open(Duration::ZERO);
    let mut now = Duration::ZERO;
    let mut pauses = Vec::new();
    let mut resolutions = 0;
    loop {
        let a = actions(&mut s);
        if a.contains(&SessionAction::Resolve(pool())) {
            resolutions += 1;
            s.resolved(now, Ok((vec![pe(7)], None)));
            continue;
        }
        if a.iter().any(|a| matches!(a, SessionAction::Connect(_))) {
            s.connect_failed(now, "connection refused".into());
            continue;
        }
        if s.is_ended() {
            break;
        }
        let t = s.poll_timeout().expect("a back-off is armed");
        pauses.push(t - now);
        now = t;
        s.handle_timeout(now);
        assert!(now < Duration::from_secs(60), "no end");
    }
    assert_eq!(
        pauses,
        vec![100 * MS, 200 * MS, 400 * MS],
        "doubling back-off"
    );
    assert_eq!(resolutions, 4);
    let ev = events(&mut s);
    assert!(
        matches!(ev.last(), Some(SessionEvent::Failed { reason }) if reason.contains("gave up after 4 attempt(s)")),
        "{ev:?}"
    );
    assert!(matches!(s.receipt().outcome, Some(Outcome::Failed { .. })));
    assert_eq!(s.stats().connect_failures, 4);
    assert_eq!(s.stats().unreachable_reported, 4);
    assert_eq!(
        s.send(now, 33, 0, vec![1]),
        Err(rserpool_endpoint::session::SessionError::Ended)
    );
}

#[test]
fn a_business_card_is_preferred_to_the_resolution() {
    let mut s = opened(SessionConfig::new(pool()));
    let card = AsapMessage::BusinessCard(asap::BusinessCard {
        pool_handle: pool(),
        pool_elements: vec![pe(1), pe(9), pe(8)],
    });
    s.message(3 * MS, 11, 0, &enc(&card));
    assert_eq!(
        events(&mut s),
        vec![SessionEvent::BusinessCard {
            pes: vec![PoolElementId(9), PoolElementId(8)]
        }],
        "the sender itself is not a failover candidate"
    );
    s.failover(4 * MS);
    let a = actions(&mut s);
    assert_eq!(
        a,
        vec![SessionAction::Abort, SessionAction::Connect(pe(9))],
        "a requested failover reports nobody unreachable"
    );
    // 9 cannot be reached: 8 (card) before 2 (resolution).
    s.connect_failed(5 * MS, "refused".into());
    assert_eq!(
        actions(&mut s),
        vec![
            SessionAction::ReportUnreachable(pool(), PoolElementId(9)),
            SessionAction::Connect(pe(8))
        ]
    );
    s.connected(6 * MS);
    let ev = events(&mut s);
    let [SessionEvent::FailoverStarted { .. }, SessionEvent::Failover(f)] = &ev[..] else {
        panic!("{ev:?}");
    };
    assert_eq!(
        (f.from, f.to, f.with_cookie),
        (PoolElementId(1), PoolElementId(8), false)
    );
    assert_eq!(f.reason, FailoverReason::Requested);
    assert_eq!(f.attempts, 1);
    let sources: Vec<_> = s.receipt().selections.iter().map(|x| x.source).collect();
    assert_eq!(
        sources,
        vec![
            CandidateSource::Resolution,
            CandidateSource::BusinessCard,
            CandidateSource::BusinessCard
        ]
    );
}

#[test]
fn no_answer_in_time_fails_over_and_manual_mode_waits_for_the_application() {
    let mut config = SessionConfig::new(pool());
    config.answer_timeout = Some(Duration::from_secs(2));
    config.auto_failover = false;
    let mut s = opened(config);
    s.send(Duration::from_secs(1), 33, 0, b"x".to_vec())
        .unwrap();
    let _ = actions(&mut s);
    assert_eq!(s.poll_timeout(), Some(Duration::from_secs(3)));
    s.handle_timeout(Duration::from_secs(3));
    assert_eq!(
        events(&mut s),
        vec![SessionEvent::FailoverNecessary {
            from: PoolElementId(1),
            reason: FailoverReason::NoAnswer,
            has_cookie: false
        }]
    );
    assert_eq!(
        actions(&mut s),
        vec![
            SessionAction::Abort,
            SessionAction::ReportUnreachable(pool(), PoolElementId(1))
        ],
        "nothing selected until the application says so"
    );
    s.failover(Duration::from_secs(4));
    assert_eq!(actions(&mut s), vec![SessionAction::Connect(pe(2))]);
}

#[test]
fn a_pe_that_answers_garbage_is_left_and_a_huge_cookie_is_refused() {
    let mut config = SessionConfig::new(pool());
    config.max_cookie_size = 8;
    let mut s = opened(config);
    s.message(
        3 * MS,
        11,
        0,
        &enc(&AsapMessage::Cookie(asap::Cookie { cookie: vec![0; 9] })),
    );
    assert_eq!(s.cookie(), None);
    assert_eq!(s.stats().cookies_refused, 1);
    let _ = events(&mut s);
    s.message(4 * MS, 11, 0, b"\x0b\x00\x00\x07garbage");
    let ev = events(&mut s);
    assert!(matches!(&ev[0], SessionEvent::ProtocolError(_)), "{ev:?}");
    let a = actions(&mut s);
    assert_eq!(a[0], SessionAction::Abort);
    assert!(matches!(a[2], SessionAction::Connect(_)), "{a:?}");
    assert_eq!(s.stats().protocol_errors, 1);
}

/// A service that answers each message and sends a cookie holding how many it answered in
/// that session; a cookie echo restores the count.
#[derive(Debug, Default)]
struct Counter {
    n: std::collections::HashMap<SessionId, u64>,
    out: VecDeque<ServerOutput>,
}

impl ServerService for Counter {
    fn kind(&self) -> ServiceKind {
        ServiceKind::Echo
    }
    fn open_session(&mut self, _now: Now, s: SessionId, _info: SessionInfo) {
        self.n.insert(s, 0);
    }
    fn handle_message(
        &mut self,
        _now: Now,
        s: SessionId,
        ppid: u32,
        stream: u16,
        _data: &[u8],
    ) -> Result<(), rserpool_services::ServiceError> {
        let n = self.n.entry(s).or_default();
        *n += 1;
        self.out.push_back(ServerOutput::Send {
            session: s,
            ppid,
            stream,
            data: n.to_be_bytes().to_vec(),
        });
        self.out.push_back(ServerOutput::Cookie {
            session: s,
            cookie: n.to_be_bytes().to_vec(),
        });
        Ok(())
    }
    fn handle_cookie_echo(
        &mut self,
        _now: Now,
        s: SessionId,
        cookie: &[u8],
    ) -> Result<(), CookieRefused> {
        match <[u8; 8]>::try_from(cookie) {
            Ok(b) => {
                self.n.insert(s, u64::from_be_bytes(b));
                Ok(())
            }
            Err(_) => {
                self.out.push_back(ServerOutput::Abort {
                    session: s,
                    reason: AbortReason::Cookie(CookieRefused::Invalid("size")),
                });
                Err(CookieRefused::Invalid("size"))
            }
        }
    }
    fn close_session(&mut self, _now: Now, s: SessionId) {
        self.n.remove(&s);
    }
    fn poll_output(&mut self) -> Option<ServerOutput> {
        self.out.pop_front()
    }
    fn sessions(&self) -> usize {
        self.n.len()
    }
}

fn counter_server(config: ServerConfig) -> SessionServer {
    SessionServer::new(config, Box::<Counter>::default())
}

fn t(d: Duration) -> Now {
    Now::from_monotonic(d)
}

/// Delivers the session's transmits to `server` (session 1) and the server's back; returns
/// the data the PU received.
fn pump(now: Duration, s: &mut PoolUserSession, server: &mut SessionServer) -> Vec<Vec<u8>> {
    let mut got = Vec::new();
    loop {
        let mut moved = false;
        for a in actions(s) {
            if let SessionAction::Transmit { ppid, stream, data } = a {
                moved = true;
                server.message(t(now), 1, ppid, stream, &data);
            }
        }
        while let Some(a) = server.poll_action() {
            if let ServerAction::Transmit {
                ppid, stream, data, ..
            } = a
            {
                moved = true;
                s.message(now, ppid, stream, &data);
            }
        }
        for e in events(s) {
            if let SessionEvent::Data { data, .. } = e {
                got.push(data);
            }
        }
        if !moved {
            return got;
        }
    }
}

#[test]
fn the_state_continues_on_the_new_pe_from_the_cookie() {
    let mut s = opened(SessionConfig::new(pool()));
    let mut a = counter_server(ServerConfig::default());
    a.accept(t(2 * MS), 1, None);
    let mut replies = Vec::new();
    for i in 0..3u64 {
        s.send(3 * MS, 33, 0, vec![i as u8]).unwrap();
        replies.extend(pump(3 * MS, &mut s, &mut a));
    }
    s.association_lost(10 * MS, "peer aborted".into());
    let _ = actions(&mut s);
    let mut b = counter_server(ServerConfig::default());
    b.accept(t(11 * MS), 1, None);
    s.send(11 * MS, 33, 0, vec![3]).unwrap();
    s.connected(12 * MS);
    replies.extend(pump(12 * MS, &mut s, &mut b));
    let counts: Vec<u64> = replies
        .iter()
        .map(|r| u64::from_be_bytes(r[..].try_into().unwrap()))
        .collect();
    assert_eq!(counts, vec![1, 2, 3, 4], "no reply lost or repeated");
    assert_eq!(b.stats().cookie_echoes, 1);
    assert!(std::iter::from_fn(|| b.poll_event()).any(|e| e
        == ServerEvent::CookieEcho {
            session: 1,
            len: 8,
            result: Ok(())
        }));
}

#[test]
fn the_server_sends_business_cards_and_refuses_bad_input() {
    let mut srv = counter_server(ServerConfig {
        max_sessions: 2,
        max_cookie_size: 16,
        ..ServerConfig::default()
    });
    srv.set_business_card(Some((pool(), vec![pe(2), pe(3)])));
    assert!(srv.accept(t(MS), 1, None));
    let ServerAction::Transmit {
        session: 1,
        ppid: 11,
        data,
        ..
    } = srv.poll_action().unwrap()
    else {
        panic!()
    };
    assert_eq!(
        dec(&data),
        AsapMessage::BusinessCard(asap::BusinessCard {
            pool_handle: pool(),
            pool_elements: vec![pe(2), pe(3)]
        })
    );
    assert!(srv.accept(t(MS), 2, None));
    assert!(!srv.accept(t(MS), 3, None), "limit of 2 sessions");
    while srv.poll_action().is_some() {}
    assert_eq!(srv.stats().refused, 1);
    // An oversized cookie echo: ASAP_ERROR (lack of resources), session aborted.
    srv.message(
        t(2 * MS),
        1,
        11,
        0,
        &enc(&AsapMessage::CookieEcho(asap::CookieEcho {
            cookie: vec![0; 17],
        })),
    );
    let a: Vec<_> = std::iter::from_fn(|| srv.poll_action()).collect();
    let ServerAction::Transmit { data, .. } = &a[0] else {
        panic!("{a:?}")
    };
    let AsapMessage::Error(e) = dec(data) else {
        panic!()
    };
    assert_eq!(
        e.error.causes[0].code,
        rserpool_wire::CauseCode::LackOfResources
    );
    assert_eq!(a[1], ServerAction::Abort(1));
    // Garbage on the control channel of session 2: an error back, session aborted, the other
    // session's state untouched.
    srv.message(t(3 * MS), 2, 11, 0, b"\x0c\x00\x00\x05x");
    let a: Vec<_> = std::iter::from_fn(|| srv.poll_action()).collect();
    assert!(matches!(a.last(), Some(ServerAction::Abort(2))), "{a:?}");
    assert_eq!(srv.stats().bad_input, 2);
    assert_eq!(srv.sessions(), 0);
    // A cookie echo the service cannot use: the service aborts the session.
    srv.accept(t(4 * MS), 4, None);
    while srv.poll_action().is_some() {}
    srv.message(
        t(5 * MS),
        4,
        11,
        0,
        &enc(&AsapMessage::CookieEcho(asap::CookieEcho {
            cookie: vec![1],
        })),
    );
    // It is answered with an ASAP_ERROR (invalid values) before the abort.
    let a: Vec<_> = std::iter::from_fn(|| srv.poll_action()).collect();
    let [ServerAction::Transmit {
        session: 4,
        ppid: 11,
        data,
        ..
    }, ServerAction::Abort(4)] = &a[..]
    else {
        panic!("{a:?}")
    };
    let AsapMessage::Error(e) = dec(data) else {
        panic!()
    };
    assert_eq!(
        e.error.causes[0].code,
        rserpool_wire::CauseCode::InvalidValues
    );
    assert_eq!(srv.stats().service_aborts, 1);
    assert_eq!(srv.stats().cookie_echoes_refused, 1);
}

/// A signed cookie that was altered on its way, or sealed under another key, is refused with
/// ASAP_ERROR "rejected due to security considerations" (0xa) before the abort, so that the
/// pool user learns why (found by the simulator's `cookie_authentic`: the PE aborted in
/// silence); the cookie as issued is accepted.
#[test]
fn a_tampered_signed_cookie_is_refused_with_the_security_cause() {
    use rserpool_services::cookie::{CookieKey, HmacSeal};
    use rserpool_services::pingpong::{PingPongServer, PingPongServerConfig};
    use std::sync::Arc;
    let server = |key: &[u8]| {
        let seal = HmacSeal::new(
            CookieKey::new(key.to_vec()).unwrap(),
            Duration::from_secs(60),
        );
        SessionServer::new(
            ServerConfig::default(),
            Box::new(PingPongServer::with_seal(
                PingPongServerConfig::default(),
                Arc::new(seal),
            )),
        )
    };
    let pu = Some(b"10.2.0.1".to_vec());
    let ping =
        rserpool_services::pingpong::PingPongMessage::Ping(rserpool_services::pingpong::Ping {
            flags: 0,
            message_no: 1,
            data: b"x".to_vec(),
        })
        .encode()
        .unwrap();
    // PE A issues a cookie after its Pong.
    let mut a = server(b"the pool's key of 32 bytes......");
    a.accept(t(MS), 1, pu.clone());
    a.message(t(2 * MS), 1, rserpool_services::PPID_PINGPONG, 0, &ping);
    let cookie = std::iter::from_fn(|| a.poll_action())
        .find_map(|x| match x {
            ServerAction::Transmit { ppid: 11, data, .. } => match dec(&data) {
                AsapMessage::Cookie(c) => Some(c.cookie),
                _ => None,
            },
            _ => None,
        })
        .expect("a cookie after the Pong");
    let echo = |c: &[u8]| {
        enc(&AsapMessage::CookieEcho(asap::CookieEcho {
            cookie: c.to_vec(),
        }))
    };
    let verdict = |srv: &mut SessionServer, session: u64, c: &[u8]| {
        srv.accept(t(3 * MS), session, pu.clone());
        while srv.poll_action().is_some() {}
        srv.message(t(4 * MS), session, 11, 0, &echo(c));
        let a: Vec<_> = std::iter::from_fn(|| srv.poll_action()).collect();
        match &a[..] {
            [ServerAction::Transmit { ppid: 11, data, .. }, ServerAction::Abort(s)]
                if *s == session =>
            {
                let AsapMessage::Error(e) = dec(data) else {
                    panic!("{a:?}")
                };
                Some(e.error.causes[0].code)
            }
            [] => None,
            _ => panic!("{a:?}"),
        }
    };
    let mut b = server(b"the pool's key of 32 bytes......");
    let mut altered = cookie.clone();
    let last = altered.len() - 1;
    altered[last] ^= 1;
    assert_eq!(
        verdict(&mut b, 1, &altered),
        Some(rserpool_wire::CauseCode::RejectedSecurity)
    );
    let mut other = server(b"another key, not the pool's.....");
    assert_eq!(
        verdict(&mut other, 1, &cookie),
        Some(rserpool_wire::CauseCode::RejectedSecurity)
    );
    assert_eq!(
        verdict(&mut b, 2, &cookie),
        None,
        "the cookie as issued is accepted"
    );
}

fn addr(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

fn pe_config() -> PoolElementConfig {
    let mut c = PoolElementConfig::new(
        pool(),
        UserTransport::Address(TransportAddress::tcp(5001, "127.0.0.1".parse().unwrap())),
        PoolPolicy::LeastUsed { load: 0 },
    );
    c.pe_id = Some(PoolElementId(0x42));
    c.registrars = vec![vec![addr("127.0.0.1:1001")], vec![addr("127.0.0.1:1002")]];
    c.response_timeout = Duration::from_secs(3);
    c
}

fn pe_events(pe: &mut PoolElementCore) -> Vec<PeEvent> {
    std::iter::from_fn(|| pe.poll_event()).collect()
}

fn registration_response(reject: bool) -> Vec<u8> {
    enc(&AsapMessage::RegistrationResponse(
        asap::RegistrationResponse {
            reject,
            pool_handle: pool(),
            pe_id: PoolElementId(0x42),
            error: None,
        },
    ))
}

/// The PE of `pe_config`, connected to its first registrar at 1 ms, its registration accepted
/// at 2 ms (what it sent and reported on the way is left unread).
fn accepted_at_2ms() -> PoolElementCore {
    let mut pe = PoolElementCore::new(pe_config(), &mut StdRng::seed_from_u64(1));
    pe.start(Duration::ZERO);
    let _ = pe.poll_connect();
    pe.connected(MS);
    let _ = pe.poll_transmit();
    pe.message(2 * MS, &registration_response(false));
    pe
}

/// ASAP_ENDPOINT_KEEP_ALIVE from registrar `server` to the PE of `pe_config`, with the H
/// (home) flag `home` (RFC 5352 section 2.2).
fn keep_alive(home: bool, server: u32) -> Vec<u8> {
    enc(&AsapMessage::EndpointKeepAlive(asap::EndpointKeepAlive {
        home,
        server_id: RegistrarId(server),
        pool_handle: pool(),
        pe_id: Some(PoolElementId(0x42)),
    }))
}

#[test]
fn server_hunt_with_t5_doubling_and_max_reg_attempt() {
    let mut pe = PoolElementCore::new(pe_config(), &mut StdRng::seed_from_u64(1));
    pe.start(Duration::ZERO);
    assert_eq!(pe.poll_connect(), Some(vec![addr("127.0.0.1:1001")]));
    pe.connect_failed(MS);
    assert_eq!(pe.poll_connect(), Some(vec![addr("127.0.0.1:1002")]));
    pe.connect_failed(2 * MS);
    assert_eq!(pe.poll_connect(), None);
    assert_eq!(
        pe_events(&mut pe),
        vec![PeEvent::HuntFailed {
            retry_in: Duration::from_secs(1)
        }]
    );
    // Next round after T5; it doubles.
    let mut now = pe.poll_timeout().unwrap();
    assert_eq!(now, Duration::from_secs(1) + 2 * MS);
    pe.handle_timeout(now);
    assert!(pe.poll_connect().is_some());
    pe.connect_failed(now);
    pe.connect_failed(now);
    while pe.poll_connect().is_some() {}
    assert_eq!(
        pe_events(&mut pe),
        vec![PeEvent::HuntFailed {
            retry_in: Duration::from_secs(2)
        }]
    );
    now = pe.poll_timeout().unwrap();
    pe.handle_timeout(now);
    let got = pe.poll_connect().unwrap();
    pe.connected(now);
    let reg = pe.poll_transmit().unwrap();
    assert!(matches!(dec(&reg), AsapMessage::Registration(_)));
    // T2 expires: one more REGISTRATION (MAX-REG-ATTEMPT = 2) ...
    now += Duration::from_secs(3);
    assert_eq!(pe.poll_timeout(), Some(now));
    pe.handle_timeout(now);
    assert!(matches!(
        dec(&pe.poll_transmit().unwrap()),
        AsapMessage::Registration(_)
    ));
    assert!(pe_events(&mut pe).is_empty());
    // ... then the registrar is given up and another one is hunted for.
    now += Duration::from_secs(3);
    pe.handle_timeout(now);
    assert_eq!(pe_events(&mut pe), vec![PeEvent::RegistrarLost]);
    let next = pe.poll_connect().expect("hunting again at once");
    assert_ne!(next, got, "the next registrar of the list");
    pe.connected(now);
    let _ = pe.poll_transmit();
    pe.message(now, &registration_response(false));
    assert_eq!(
        pe_events(&mut pe),
        vec![PeEvent::Registered { first: true }]
    );
    assert!(pe.is_registered());
}

#[test]
fn announced_registrars_come_first_and_expire() {
    let mut c = pe_config();
    c.registrar_protocol = rserpool_wire::TransportProtocol::Tcp;
    let mut pe = PoolElementCore::new(c, &mut StdRng::seed_from_u64(1));
    let announce = enc(&AsapMessage::ServerAnnounce(asap::ServerAnnounce {
        server_id: RegistrarId(7),
        transports: vec![TransportAddress::tcp(2000, "127.0.0.1".parse().unwrap())],
    }));
    pe.announce(Duration::ZERO, addr("127.0.0.1:3863"), &announce);
    pe.start(MS);
    assert_eq!(pe.poll_connect(), Some(vec![addr("127.0.0.1:2000")]));
    pe.connect_failed(2 * MS);
    assert_eq!(pe.poll_connect(), Some(vec![addr("127.0.0.1:1001")]));
    // Garbage on the announce group is reported, not trusted.
    pe.announce(3 * MS, addr("127.0.0.1:3863"), b"junk");
    assert!(matches!(
        pe_events(&mut pe)[..],
        [PeEvent::ProtocolError(_)]
    ));
    // After T7 the announced one is no longer a candidate.
    pe.connect_failed(Duration::from_secs(6));
    pe.connect_failed(Duration::from_secs(6));
    while pe.poll_connect().is_some() {}
    let t = pe.poll_timeout().unwrap();
    pe.handle_timeout(t);
    let mut round = vec![pe.poll_connect().unwrap()];
    pe.connect_failed(t);
    round.push(pe.poll_connect().unwrap());
    round.sort();
    assert_eq!(
        round,
        vec![vec![addr("127.0.0.1:1001")], vec![addr("127.0.0.1:1002")]],
        "the static list only"
    );
}

#[test]
fn an_h_keep_alive_on_another_association_makes_a_new_home() {
    let mut pe = accepted_at_2ms();
    let _ = pe_events(&mut pe);
    pe.message(3 * MS, &keep_alive(false, 1));
    assert_eq!(pe.home_registrar(), Some(RegistrarId(1)));
    let _ = pe.poll_transmit();
    let _ = pe_events(&mut pe);
    // Without H on a foreign association: ignored (as RSPLIB).
    pe.message_on_other(4 * MS, 77, &keep_alive(false, 2));
    assert_eq!(pe.poll_transmit(), None);
    assert_eq!(pe.home_registrar(), Some(RegistrarId(1)));
    // With H: the new home, acked (on the new association), the old one dropped by the driver.
    pe.message_on_other(5 * MS, 77, &keep_alive(true, 2));
    assert_eq!(
        pe_events(&mut pe),
        vec![
            PeEvent::NewHome {
                registrar: RegistrarId(2),
                association: 77
            },
            PeEvent::KeepAlive {
                registrar: RegistrarId(2),
                home: true
            }
        ]
    );
    assert_eq!(
        dec(&pe.poll_transmit().unwrap()),
        AsapMessage::EndpointKeepAliveAck(asap::EndpointKeepAliveAck {
            pool_handle: pool(),
            pe_id: PoolElementId(0x42)
        })
    );
    assert_eq!(pe.home_registrar(), Some(RegistrarId(2)));
    assert!(
        pe.is_registered(),
        "still registered: the new home keeps it"
    );
    // The next re-registration names the new home.
    let t = pe.poll_timeout().unwrap();
    pe.handle_timeout(t);
    let AsapMessage::Registration(r) = dec(&pe.poll_transmit().unwrap()) else {
        panic!()
    };
    assert_eq!(r.pool_element.home_registrar, RegistrarId(2));
}

/// Found by the simulator (rserpool-sim seeds 0, 1, 3 and 4, invariant `home_agrees`): a PE
/// that lost its registrar and registered with another kept naming the old one as its home.
#[test]
fn a_new_registrar_association_forgets_the_old_home() {
    let mut pe = accepted_at_2ms();
    pe.message(3 * MS, &keep_alive(false, 1));
    assert_eq!(pe.home_registrar(), Some(RegistrarId(1)));
    let _ = pe.poll_transmit();
    // The registrar is lost; the PE registers with another one.
    pe.disconnected(4 * MS);
    let t = 5 * MS;
    assert!(pe.poll_connect().is_some(), "hunting at once");
    pe.connected(t + MS);
    assert_eq!(
        pe.home_registrar(),
        None,
        "the old home is not the home any more"
    );
    let AsapMessage::Registration(r) = dec(&pe.poll_transmit().unwrap()) else {
        panic!("a registration")
    };
    assert_eq!(r.pool_element.home_registrar, RegistrarId(0));
    pe.message(t + 2 * MS, &registration_response(false));
    // Its first keep-alive names the new home.
    pe.message(t + 3 * MS, &keep_alive(false, 2));
    assert_eq!(pe.home_registrar(), Some(RegistrarId(2)));
}

#[test]
fn a_policy_change_re_registers_at_once() {
    let mut pe = PoolElementCore::new(pe_config(), &mut StdRng::seed_from_u64(1));
    pe.start(Duration::ZERO);
    let _ = pe.poll_connect();
    pe.connected(MS);
    let _ = pe.poll_transmit();
    // Changed while the first registration is under way: registered again once answered.
    pe.set_policy(2 * MS, PoolPolicy::LeastUsed { load: 100 });
    assert_eq!(pe.poll_transmit(), None);
    pe.message(3 * MS, &registration_response(false));
    let AsapMessage::Registration(r) = dec(&pe.poll_transmit().unwrap()) else {
        panic!()
    };
    assert_eq!(r.pool_element.policy, PoolPolicy::LeastUsed { load: 100 });
    pe.message(4 * MS, &registration_response(false));
    pe.set_policy(5 * MS, PoolPolicy::LeastUsed { load: 100 });
    assert_eq!(pe.poll_transmit(), None, "same values: nothing to send");
    pe.set_policy(6 * MS, PoolPolicy::LeastUsed { load: 200 });
    assert!(pe.poll_transmit().is_some());
}

#[test]
fn an_application_that_resends_is_fenced_until_it_has_seen_the_failover() {
    let mut config = SessionConfig::new(pool());
    config.application_resends = true;
    let mut s = opened(config);
    s.association_lost(3 * MS, "peer aborted".into());
    let _ = actions(&mut s);
    assert_eq!(
        s.send_seen(4 * MS, 0, 33, 0, vec![1]),
        Err(rserpool_endpoint::session::SessionError::FailingOver),
        "nothing held while moving"
    );
    s.connected(5 * MS);
    let _ = actions(&mut s);
    assert_eq!(
        s.send_seen(6 * MS, 0, 33, 0, vec![2]),
        Err(rserpool_endpoint::session::SessionError::FailingOver),
        "the application has not seen the failover: it will resend"
    );
    assert!(actions(&mut s).is_empty());
    s.send_seen(7 * MS, 1, 33, 0, vec![3]).unwrap();
    assert_eq!(
        actions(&mut s),
        vec![SessionAction::Transmit {
            ppid: 33,
            stream: 0,
            data: vec![3]
        }]
    );
}

/// An ASAP_ERROR from the registrar ends the request it is about with the registrar's words
/// instead of a timeout.
#[test]
fn an_asap_error_from_the_registrar_fails_the_waiting_resolution() {
    use rserpool_endpoint::pu::{ResolveError, Resolver, ResolverConfig, ResolverEvent};
    use rserpool_wire::{CauseCode, OperationError};
    let mut r = Resolver::new(ResolverConfig::default());
    r.connected(Duration::ZERO);
    let request = r.resolve(Duration::ZERO, pool());
    assert!(matches!(
        r.poll_transmit().map(|b| dec(&b)),
        Some(AsapMessage::HandleResolution(_))
    ));
    let error = AsapMessage::Error(asap::AsapError {
        error: OperationError::new(CauseCode::InvalidValues),
    });
    r.message(MS, &enc(&error));
    match r.poll_event() {
        Some(ResolverEvent::Failed {
            request: failed,
            error: ResolveError::Rejected(why),
            ..
        }) => {
            assert_eq!(failed, request);
            assert!(!why.is_empty());
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(r.poll_timeout(), None, "nothing is left waiting");
}

/// A registered PE (virtual time `now`), its registration transmitted and answered.
fn registered_pe(now: Duration) -> PoolElementCore {
    let mut pe = PoolElementCore::new(pe_config(), &mut StdRng::seed_from_u64(1));
    pe.start(now);
    assert!(pe.poll_connect().is_some());
    pe.connected(now);
    assert!(matches!(
        dec(&pe.poll_transmit().unwrap()),
        AsapMessage::Registration(_)
    ));
    pe.message(now, &registration_response(false));
    assert_eq!(
        pe_events(&mut pe),
        vec![PeEvent::Registered { first: true }]
    );
    pe
}

/// RFC 5352 §3.2: the PE waits for ASAP_DEREGISTRATION_RESPONSE up to the response timeout, on
/// its own timer; the driver only asks [`PoolElementCore::is_done`].
#[test]
fn the_deregistration_wait_is_the_cores_own_timer() {
    let t0 = Duration::from_secs(10);
    // Not answered: done when the response timeout (3 s) runs out, not before.
    let mut pe = registered_pe(t0);
    pe.deregister(t0);
    assert!(matches!(
        dec(&pe.poll_transmit().unwrap()),
        AsapMessage::Deregistration(d) if d.pe_id == PoolElementId(0x42)
    ));
    assert!(!pe.is_done());
    let deadline = pe.poll_timeout().expect("waiting for the response");
    assert_eq!(deadline, t0 + Duration::from_secs(3));
    pe.handle_timeout(deadline - MS);
    assert!(!pe.is_done(), "done before the response timeout");
    pe.handle_timeout(deadline);
    assert!(pe.is_done());
    assert_eq!(pe_events(&mut pe), vec![PeEvent::DeregistrationTimedOut]);
    assert_eq!(pe.poll_timeout(), None);
    assert_eq!(pe.poll_connect(), None, "a PE that left hunts for nobody");

    // Answered: done at once, with the confirmation.
    let mut pe = registered_pe(t0);
    pe.deregister(t0);
    let _ = pe.poll_transmit();
    pe.message(
        t0 + MS,
        &enc(&AsapMessage::DeregistrationResponse(
            asap::DeregistrationResponse {
                pool_handle: pool(),
                pe_id: PoolElementId(0x42),
                error: None,
            },
        )),
    );
    assert!(pe.is_done());
    assert_eq!(pe_events(&mut pe), vec![PeEvent::Deregistered]);
    assert_eq!(pe.poll_timeout(), None);

    // The association goes away while waiting: done, no hunt for another registrar.
    let mut pe = registered_pe(t0);
    pe.deregister(t0);
    pe.disconnected(t0 + MS);
    assert!(pe.is_done());
    assert_eq!(pe.poll_connect(), None);

    // Never registered (still hunting): done at once, nothing sent.
    let mut pe = PoolElementCore::new(pe_config(), &mut StdRng::seed_from_u64(1));
    pe.start(t0);
    pe.connect_failed(t0);
    pe.deregister(t0);
    assert!(pe.is_done());
    assert_eq!(pe.poll_transmit(), None);
}
