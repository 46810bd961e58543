//! Properties of the pool elements under arbitrary event sequences (random requests, garbage,
//! cookie echoes, closes and time): never a panic, limits held, every job accounted for exactly
//! once, other sessions never disturbed by one session's garbage.

use proptest::prelude::*;
use rserpool_services::calcapp::{
    CalcAppCookie, CalcAppMessage, CalcAppServer, CalcAppServerConfig, CalcAppType,
};
use rserpool_services::pingpong::{Ping, PingPongMessage, PingPongServer, PingPongServerConfig};
use rserpool_services::{
    Now, ServerOutput, ServerReport, ServerService, SessionId, SessionInfo, PPID_CALCAPP,
    PPID_PINGPONG,
};
use std::collections::{HashMap, HashSet};
use std::time::Duration;

#[derive(Debug, Clone)]
enum Event {
    Open(u8),
    Close(u8),
    Request(u8, u8, u32),
    KeepAlive(u8, u8),
    KeepAliveAck(u8, u8),
    Echo(u8, u8, u32, u32),
    Garbage(u8, Vec<u8>),
    Wait(u16),
}

fn event() -> impl Strategy<Value = Event> {
    let s = 0u8..6;
    let j = 0u8..4;
    prop_oneof![
        s.clone().prop_map(Event::Open),
        s.clone().prop_map(Event::Close),
        (s.clone(), j.clone(), 1u32..3_000_000).prop_map(|(s, j, n)| Event::Request(s, j, n)),
        (s.clone(), j.clone()).prop_map(|(s, j)| Event::KeepAlive(s, j)),
        (s.clone(), j.clone()).prop_map(|(s, j)| Event::KeepAliveAck(s, j)),
        (s.clone(), j, any::<u32>(), any::<u32>()).prop_map(|(s, j, a, b)| Event::Echo(s, j, a, b)),
        (s, proptest::collection::vec(any::<u8>(), 0..30)).prop_map(|(s, g)| Event::Garbage(s, g)),
        (0u16..4000).prop_map(Event::Wait),
    ]
}

fn msg(kind: CalcAppType, job: u8, size: u64) -> Vec<u8> {
    CalcAppMessage {
        job_size: size,
        ..CalcAppMessage::new(kind, u32::from(job))
    }
    .encode()
    .to_vec()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn calcapp_pe_accounts_for_every_job(events in proptest::collection::vec(event(), 1..80)) {
        let config = CalcAppServerConfig {
            capacity: 1_000_000.0,
            max_jobs: 3,
            keep_alive_interval: Duration::from_millis(700),
            keep_alive_timeout: Duration::from_millis(900),
            cookie_max_time: Duration::from_millis(500),
            cookie_max_calculations: 300_000.0,
            final_cookies: true,
        };
        let mut pe = CalcAppServer::new(config);
        let mut now = Now::from_monotonic(Duration::ZERO);
        let mut open: HashSet<u8> = HashSet::new();
        // (session, job) -> running since Accept; each ends by Complete, timeout or close.
        let mut running: HashSet<(u64, u32)> = HashSet::new();
        let mut finished = 0u64;
        for e in events {
            let sid = |s: u8| SessionId(u64::from(s));
            match e {
                Event::Open(s) => {
                    if open.insert(s) {
                        pe.open_session(now, sid(s), SessionInfo::default());
                    }
                }
                Event::Close(s) => {
                    if open.remove(&s) {
                        pe.close_session(now, sid(s));
                        running.retain(|r| r.0 != u64::from(s));
                    }
                }
                Event::Request(s, j, n) => {
                    let _ = pe.handle_message(now, sid(s), PPID_CALCAPP, 0, &msg(CalcAppType::Request, j, u64::from(n)));
                }
                Event::KeepAlive(s, j) => {
                    let _ = pe.handle_message(now, sid(s), PPID_CALCAPP, 0, &msg(CalcAppType::KeepAlive, j, 0));
                }
                Event::KeepAliveAck(s, j) => {
                    let _ = pe.handle_message(now, sid(s), PPID_CALCAPP, 0, &msg(CalcAppType::KeepAliveAck, j, 0));
                }
                Event::Echo(s, j, size, done) => {
                    let cookie = CalcAppCookie { job_id: u32::from(j), job_size: u64::from(size), completed: u64::from(done) };
                    let _ = pe.handle_cookie_echo(now, sid(s), &cookie.encode());
                }
                Event::Garbage(s, g) => {
                    let _ = pe.handle_message(now, sid(s), PPID_CALCAPP, 0, &g);
                    let _ = pe.handle_cookie_echo(now, sid(s), &g);
                }
                Event::Wait(ms) => {
                    let target = now.monotonic + Duration::from_millis(u64::from(ms));
                    while let Some(t) = pe.poll_timeout().filter(|t| *t <= target) {
                        prop_assert!(t >= now.monotonic, "timer in the past");
                        now = now.advance(t - now.monotonic);
                        pe.handle_timeout(now);
                        collect(&mut pe, &mut running, &mut finished, &open)?;
                    }
                    now = now.advance(target - now.monotonic);
                }
            }
            collect(&mut pe, &mut running, &mut finished, &open)?;
            prop_assert!(pe.jobs().count() <= 3);
            for (s, _, size, done) in pe.jobs() {
                prop_assert!(done <= size);
                prop_assert!(open.contains(&(s.0 as u8)), "a job of a closed session");
            }
            let live: HashSet<(u64, u32)> = pe.jobs().map(|j| (j.0 .0, j.1)).collect();
            prop_assert_eq!(&live, &running);
        }
        let c = pe.counters();
        prop_assert_eq!(c.completed + c.timed_out, finished);
    }

    #[test]
    fn pingpong_garbage_aborts_only_its_session(garbage in proptest::collection::vec(any::<u8>(), 0..40), pings in 1u64..20) {
        let mut pe = PingPongServer::new(PingPongServerConfig::default());
        let now = Now::from_monotonic(Duration::ZERO);
        pe.open_session(now, SessionId(1), SessionInfo::default());
        pe.open_session(now, SessionId(2), SessionInfo::default());
        let ok = pe.handle_message(now, SessionId(1), PPID_PINGPONG, 0, &garbage).is_ok();
        let _ = pe.handle_cookie_echo(now, SessionId(1), &garbage);
        let mut aborted = HashMap::new();
        while let Some(o) = pe.poll_output() {
            if let ServerOutput::Abort { session, .. } = o {
                *aborted.entry(session).or_insert(0) += 1;
            }
        }
        prop_assert!(ok || aborted.contains_key(&SessionId(1)));
        prop_assert!(!aborted.contains_key(&SessionId(2)));
        for n in 1..=pings {
            let ping = PingPongMessage::Ping(Ping { flags: 0, message_no: n, data: vec![] }).encode().unwrap();
            pe.handle_message(now, SessionId(2), PPID_PINGPONG, 0, &ping).unwrap();
        }
        let pongs = std::iter::from_fn(|| pe.poll_output())
            .filter(|o| matches!(o, ServerOutput::Send { session: SessionId(2), .. }))
            .count() as u64;
        prop_assert_eq!(pongs, pings);
        prop_assert_eq!(pe.next_reply_no(SessionId(2)), Some(pings + 1));
    }
}

fn collect(
    pe: &mut CalcAppServer,
    running: &mut HashSet<(u64, u32)>,
    finished: &mut u64,
    open: &HashSet<u8>,
) -> Result<(), TestCaseError> {
    while let Some(o) = pe.poll_output() {
        match o {
            ServerOutput::Report(ServerReport::JobAccepted {
                session, job_id, ..
            }) => {
                prop_assert!(open.contains(&(session.0 as u8)));
                prop_assert!(running.insert((session.0, job_id)), "job accepted twice");
            }
            ServerOutput::Report(ServerReport::JobCompleted {
                session, job_id, ..
            })
            | ServerOutput::Report(ServerReport::JobTimedOut { session, job_id }) => {
                prop_assert!(
                    running.remove(&(session.0, job_id)),
                    "ended a job not running"
                );
                *finished += 1;
            }
            ServerOutput::Send {
                session,
                ppid,
                data,
                ..
            } => {
                prop_assert_eq!(ppid, PPID_CALCAPP);
                prop_assert!(CalcAppMessage::decode(&data).is_ok());
                prop_assert!(
                    open.contains(&(session.0 as u8)),
                    "sent to a closed session"
                );
            }
            ServerOutput::Load(l) => prop_assert!((0.0..=1.0).contains(&l)),
            _ => {}
        }
    }
    Ok(())
}

/// Settings at their extremes (durations of `Duration::MAX`, a huge capacity) give far timers,
/// not overflow panics.
#[test]
fn extreme_settings_do_not_overflow() {
    use rserpool_services::calcapp::{CalcAppClient, CalcAppClientConfig};
    use rserpool_services::pingpong::{PingPongClient, PingPongClientConfig};
    use rserpool_services::ClientService;
    let late = Now::new(
        Duration::from_secs(u64::MAX / 2),
        Duration::from_secs(u64::MAX / 2),
    );
    let mut pe = CalcAppServer::new(CalcAppServerConfig {
        capacity: f64::MAX,
        keep_alive_interval: Duration::MAX,
        keep_alive_timeout: Duration::MAX,
        cookie_max_time: Duration::MAX,
        cookie_max_calculations: f64::MAX,
        ..Default::default()
    });
    pe.open_session(late, SessionId(1), SessionInfo::default());
    pe.handle_message(
        late,
        SessionId(1),
        PPID_CALCAPP,
        0,
        &msg(CalcAppType::Request, 1, u64::MAX),
    )
    .unwrap();
    pe.handle_timeout(late.advance(Duration::MAX));
    while pe.poll_output().is_some() {}
    let mut pu = PingPongClient::new(PingPongClientConfig {
        interval: Duration::MAX,
        reply_timeout: Duration::MAX,
        ..Default::default()
    });
    pu.start(late);
    pu.handle_timeout(late.advance(Duration::MAX));
    pu.failover_complete(late, true);
    let mut ca = CalcAppClient::new(CalcAppClientConfig {
        job_interval: Some(Duration::MAX),
        job_size: f64::MAX,
        keep_alive_interval: Duration::MAX,
        keep_alive_timeout: Duration::MAX,
        reject_retry_delay: Duration::MAX,
        ..Default::default()
    });
    ca.start(late);
    ca.submit(late, u64::MAX);
    ca.handle_timeout(late.advance(Duration::MAX));
    ca.failover_complete(late, false);
    while ca.poll_output().is_some() {}
}
