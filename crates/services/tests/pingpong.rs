//! PingPong pool elements and pool user driven in virtual time: failover with the reply counter
//! restored from the cookie, no Ping lost or answered twice, RSPLIB's abort rules, signed cookies.

mod common;

use common::Sim;
use rserpool_services::cookie::{CookieKey, CookieSeal, HmacSeal, SealContext, SealError};
use rserpool_services::pingpong::{
    Ping, PingPongClient, PingPongClientConfig, PingPongCookie, PingPongMessage, PingPongServer,
    PingPongServerConfig,
};
use rserpool_services::{
    AbortReason, ClientReport, CookieRefused, Now, ServerOutput, ServerService, SessionId,
    SessionInfo, PPID_PINGPONG,
};
use std::sync::Arc;
use std::time::Duration;

fn plain_pes(n: usize, config: PingPongServerConfig) -> Vec<Box<dyn ServerService>> {
    (0..n)
        .map(|_| Box::new(PingPongServer::new(config.clone())) as Box<dyn ServerService>)
        .collect()
}

fn client(count: u64) -> Box<PingPongClient> {
    Box::new(PingPongClient::new(PingPongClientConfig {
        count: Some(count),
        ..Default::default()
    }))
}

fn pongs(sim: &Sim) -> Vec<(u64, u64)> {
    sim.reports
        .iter()
        .filter_map(|r| match r {
            ClientReport::Pong {
                message_no,
                reply_no,
                ..
            } => Some((*message_no, *reply_no)),
            _ => None,
        })
        .collect()
}

fn ping(message_no: u64) -> Vec<u8> {
    PingPongMessage::Ping(Ping {
        flags: 0,
        message_no,
        data: b"x".to_vec(),
    })
    .encode()
    .unwrap()
}

#[test]
fn replies_are_numbered_and_followed_by_cookies() {
    let mut pe = PingPongServer::new(PingPongServerConfig::default());
    let now = Now::from_monotonic(Duration::ZERO);
    let s = SessionId(7);
    pe.open_session(now, s, SessionInfo::default());
    for n in 1..=3u64 {
        pe.handle_message(now, s, PPID_PINGPONG, 2, &ping(100 + n))
            .unwrap();
        let Some(ServerOutput::Send {
            session,
            ppid,
            stream,
            data,
        }) = pe.poll_output()
        else {
            panic!("no Pong")
        };
        assert_eq!((session, ppid, stream), (s, PPID_PINGPONG, 2));
        let PingPongMessage::Pong(pong) = PingPongMessage::decode(&data).unwrap() else {
            panic!("not a Pong")
        };
        assert_eq!((pong.message_no, pong.reply_no), (100 + n, n));
        assert_eq!(pong.data, b"x");
        let Some(ServerOutput::Cookie { cookie, .. }) = pe.poll_output() else {
            panic!("no cookie after the Pong")
        };
        // RSPLIB's cookie: the tag and the *next* reply number.
        assert_eq!(&cookie[..8], b"<PP-TD1>");
        assert_eq!(PingPongCookie::decode(&cookie).unwrap().reply_no, n + 1);
        while pe.poll_output().is_some() {}
    }
}

#[test]
fn failover_continues_reply_numbers_and_loses_nothing() {
    let mut sim = Sim::new(plain_pes(3, PingPongServerConfig::default()), client(30));
    sim.start(0);
    assert!(sim.run_until(Duration::from_secs(5), |s| pongs(s).len() >= 10));
    sim.kill(0);
    assert!(sim.run_until(Duration::from_secs(10), |s| pongs(s).len() >= 20));
    sim.kill(1);
    assert!(sim.run_until(Duration::from_secs(30), |s| s.finished));

    let replies = pongs(&sim);
    let numbers: Vec<u64> = replies.iter().map(|p| p.0).collect();
    assert_eq!(
        numbers,
        (1..=30).collect::<Vec<_>>(),
        "each Ping answered once, in order"
    );
    let reply_nos: Vec<u64> = replies.iter().map(|p| p.1).collect();
    assert_eq!(
        reply_nos,
        (1..=30).collect::<Vec<_>>(),
        "reply numbers continue across PEs"
    );
    assert_eq!(sim.failovers.len(), 2);
    assert!(
        sim.failovers.iter().all(|f| f.2),
        "every failover echoed a cookie"
    );
    let restored: usize = sim
        .pes
        .iter()
        .map(|p| {
            p.reports
                .iter()
                .filter(|r| matches!(r, rserpool_services::ServerReport::Restored { .. }))
                .count()
        })
        .sum();
    assert_eq!(restored, 2);
    let c = client_counters(&mut sim);
    assert_eq!((c.pings, c.answered, c.duplicates, c.gaps), (30, 30, 0, 0));
}

fn client_counters(sim: &mut Sim) -> rserpool_services::pingpong::PingPongCounters {
    let pongs = pongs(sim).len() as u64;
    let mut c = rserpool_services::pingpong::PingPongCounters {
        answered: pongs,
        ..Default::default()
    };
    for r in &sim.reports {
        match r {
            ClientReport::PingSent { resent: false, .. } => c.pings += 1,
            ClientReport::PingSent { resent: true, .. } => c.resent += 1,
            ClientReport::DuplicatePong { .. } => c.duplicates += 1,
            ClientReport::Gap { .. } => c.gaps += 1,
            _ => {}
        }
    }
    c
}

#[test]
fn a_frozen_pe_is_left_after_the_reply_timeout_and_the_ping_resent() {
    let mut sim = Sim::new(plain_pes(2, PingPongServerConfig::default()), client(10));
    sim.start(0);
    assert!(sim.run_until(Duration::from_secs(5), |s| pongs(s).len() >= 3));
    sim.freeze(0); // SIGSTOP: connected, silent
    assert!(sim.run_until(Duration::from_secs(30), |s| s.finished));
    assert_eq!(sim.failovers.len(), 1);
    assert_eq!(sim.failovers[0].3, "no answer");
    let numbers: Vec<u64> = pongs(&sim).iter().map(|p| p.0).collect();
    assert_eq!(numbers, (1..=10).collect::<Vec<_>>());
    let c = client_counters(&mut sim);
    assert!(c.resent >= 1, "the unanswered Ping was sent again");
    assert_eq!(c.gaps, 0);
}

#[test]
fn failure_tester_aborts_after_n_replies_like_pppfailureafter() {
    let config = PingPongServerConfig {
        failure_after: 4,
        ..Default::default()
    };
    let mut sim = Sim::new(plain_pes(2, config), client(12));
    sim.start(0);
    assert!(sim.run_until(Duration::from_secs(30), |s| s.finished));
    // 12 replies, 4 per session (RSPLIB counts replies per session): PE0, PE1, PE0 again, each
    // resuming from the cookie; the 12th reply ends the third session too.
    assert_eq!(sim.failovers.len(), 3);
    assert!(sim.pes[0].aborts[0].1.contains("failure tester"));
    let reply_nos: Vec<u64> = pongs(&sim).iter().map(|p| p.1).collect();
    assert_eq!(reply_nos, (1..=12).collect::<Vec<_>>());
}

#[test]
fn a_bad_message_or_bad_cookie_aborts_the_session_as_in_rsplib() {
    let now = Now::from_monotonic(Duration::ZERO);
    for (what, data, ppid) in [
        ("short", vec![1, 0, 0], PPID_PINGPONG),
        (
            "Pong to a PE",
            {
                let mut p = ping(1);
                p[0] = 2;
                p
            },
            PPID_PINGPONG,
        ),
        ("wrong PPID", ping(1), 0),
        (
            "length lies",
            {
                let mut p = ping(1);
                p[3] += 1;
                p
            },
            PPID_PINGPONG,
        ),
    ] {
        let mut pe = PingPongServer::new(PingPongServerConfig::default());
        pe.open_session(now, SessionId(1), SessionInfo::default());
        pe.open_session(now, SessionId(2), SessionInfo::default());
        assert!(
            pe.handle_message(now, SessionId(1), ppid, 0, &data)
                .is_err(),
            "{what}"
        );
        assert!(
            matches!(
                pe.poll_output(),
                Some(ServerOutput::Abort {
                    session: SessionId(1),
                    reason: AbortReason::Protocol(_)
                })
            ),
            "{what}"
        );
        // The other session is not disturbed.
        pe.handle_message(now, SessionId(2), PPID_PINGPONG, 0, &ping(1))
            .unwrap();
        assert!(matches!(
            pe.poll_output(),
            Some(ServerOutput::Send {
                session: SessionId(2),
                ..
            })
        ));
    }
    for bad in [
        &b"<PP-TD2>\0\0\0\0\0\0\0\x05"[..],
        b"<PP-TD1>\0\0\0\x05",
        b"<PP-TD1>\0\0\0\0\0\0\0\0",
    ] {
        let mut pe = PingPongServer::new(PingPongServerConfig::default());
        pe.open_session(now, SessionId(1), SessionInfo::default());
        assert!(pe.handle_cookie_echo(now, SessionId(1), bad).is_err());
        assert!(matches!(
            pe.poll_output(),
            Some(ServerOutput::Abort {
                reason: AbortReason::Cookie(_),
                ..
            })
        ));
    }
}

fn key(byte: u8) -> CookieKey {
    CookieKey::new(vec![byte; 32]).unwrap()
}

fn signed_pe(seal: &Arc<HmacSeal>) -> PingPongServer {
    PingPongServer::with_seal(
        PingPongServerConfig::default(),
        seal.clone() as Arc<dyn CookieSeal>,
    )
}

/// A cookie issued by a signed PE for the session of pool user `identity` after `replies` Pongs.
fn signed_cookie(seal: &Arc<HmacSeal>, identity: &[u8], replies: u64) -> Vec<u8> {
    let mut pe = signed_pe(seal);
    let now = Now::from_monotonic(Duration::ZERO);
    pe.open_session(
        now,
        SessionId(1),
        SessionInfo {
            identity: Some(identity.to_vec()),
        },
    );
    let mut cookie = None;
    for n in 1..=replies {
        pe.handle_message(now, SessionId(1), PPID_PINGPONG, 0, &ping(n))
            .unwrap();
        while let Some(o) = pe.poll_output() {
            if let ServerOutput::Cookie { cookie: c, .. } = o {
                cookie = Some(c);
            }
        }
    }
    cookie.unwrap()
}

fn echo_at_new_pe(
    seal: &Arc<HmacSeal>,
    identity: &[u8],
    cookie: &[u8],
    at: Duration,
) -> (Result<(), CookieRefused>, PingPongServer) {
    let mut pe = signed_pe(seal);
    let now = Now::from_monotonic(at);
    pe.open_session(
        now,
        SessionId(9),
        SessionInfo {
            identity: Some(identity.to_vec()),
        },
    );
    let r = pe.handle_cookie_echo(now, SessionId(9), cookie);
    (r, pe)
}

#[test]
fn signed_cookie_valid_restores_state() {
    let seal = Arc::new(HmacSeal::new(key(1), Duration::from_secs(60)));
    let cookie = signed_cookie(&seal, b"10.0.0.7", 5);
    assert_eq!(&cookie[..4], b"RSPC");
    let (r, pe) = echo_at_new_pe(&seal, b"10.0.0.7", &cookie, Duration::from_secs(10));
    r.unwrap();
    assert_eq!(pe.next_reply_no(SessionId(9)), Some(6));
}

#[test]
fn signed_cookie_altered_is_refused() {
    let seal = Arc::new(HmacSeal::new(key(1), Duration::from_secs(60)));
    let mut cookie = signed_cookie(&seal, b"10.0.0.7", 5);
    // The PU raises the reply number inside the envelope.
    let at = cookie.len() - 32 - 1;
    cookie[at] = 0x63;
    let (r, mut pe) = echo_at_new_pe(&seal, b"10.0.0.7", &cookie, Duration::from_secs(10));
    assert_eq!(r, Err(CookieRefused::Seal(SealError::BadMac)));
    assert!(matches!(pe.poll_output(), Some(ServerOutput::Abort { .. })));
    assert_eq!(
        pe.next_reply_no(SessionId(9)),
        Some(1),
        "state not taken from the cookie"
    );
    // A plain RSPLIB cookie (forged, unsigned) is refused by a signed PE too.
    let forged = PingPongCookie { reply_no: 1000 }.encode();
    let (r, _) = echo_at_new_pe(&seal, b"10.0.0.7", &forged, Duration::from_secs(10));
    assert!(matches!(
        r,
        Err(CookieRefused::Seal(SealError::Malformed { .. }))
    ));
}

#[test]
fn signed_cookie_replayed_for_another_session_is_refused() {
    let seal = Arc::new(HmacSeal::new(key(1), Duration::from_secs(60)));
    let cookie = signed_cookie(&seal, b"10.0.0.7", 5);
    let (r, _) = echo_at_new_pe(&seal, b"10.0.0.8", &cookie, Duration::from_secs(10));
    assert_eq!(r, Err(CookieRefused::Seal(SealError::WrongBinding)));
}

#[test]
fn signed_cookie_expired_is_refused() {
    let mut seal = HmacSeal::new(key(1), Duration::from_secs(60));
    seal.clock_skew = Duration::ZERO;
    let seal = Arc::new(seal);
    let cookie = signed_cookie(&seal, b"10.0.0.7", 5);
    let (r, _) = echo_at_new_pe(&seal, b"10.0.0.7", &cookie, Duration::from_secs(61));
    assert!(matches!(
        r,
        Err(CookieRefused::Seal(SealError::Expired { .. }))
    ));
}

#[test]
fn signed_cookie_from_another_pool_key_is_refused() {
    let seal = Arc::new(HmacSeal::new(key(1), Duration::from_secs(60)));
    let other = Arc::new(HmacSeal::new(key(2), Duration::from_secs(60)));
    let cookie = signed_cookie(&other, b"10.0.0.7", 5);
    let (r, _) = echo_at_new_pe(&seal, b"10.0.0.7", &cookie, Duration::from_secs(1));
    assert!(matches!(
        r,
        Err(CookieRefused::Seal(SealError::UnknownKey { .. }))
    ));
    // The seal used by the service is the one named in the context: a PingPong cookie opened
    // as a CalcApp one fails.
    let ctx = SealContext {
        service: "calcapp",
        identity: Some(b"10.0.0.7"),
        unix_now: Now::VIRTUAL_EPOCH,
    };
    assert_eq!(other.open(&ctx, &cookie), Err(SealError::BadMac));
}

#[test]
fn failover_with_signed_cookies_end_to_end() {
    let seal = Arc::new(HmacSeal::new(key(3), Duration::from_secs(60)));
    let pes = (0..3)
        .map(|_| Box::new(signed_pe(&seal)) as Box<dyn ServerService>)
        .collect();
    let mut sim = Sim::new(pes, client(20));
    sim.identity = Some(b"pu-1".to_vec());
    sim.start(0);
    assert!(sim.run_until(Duration::from_secs(5), |s| pongs(s).len() >= 8));
    sim.kill(0);
    assert!(sim.run_until(Duration::from_secs(30), |s| s.finished));
    let reply_nos: Vec<u64> = pongs(&sim).iter().map(|p| p.1).collect();
    assert_eq!(reply_nos, (1..=20).collect::<Vec<_>>());
    assert!(sim.pes.iter().all(|p| p.cookie_refusals.is_empty()));
}
