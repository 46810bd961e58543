//! CalcApp pool elements and pool users in virtual time: processor sharing, rejection when full,
//! keep-alives, cookies with progress, resume on another PE after a failover, signed cookies.

mod common;

use common::Sim;
use rserpool_services::calcapp::{
    CalcAppClient, CalcAppClientConfig, CalcAppCookie, CalcAppMessage, CalcAppServer,
    CalcAppServerConfig, CalcAppType,
};
use rserpool_services::cookie::{CookieKey, CookieSeal, HmacSeal, SealError};
use rserpool_services::{
    ClientReport, CookieRefused, Now, ServerOutput, ServerReport, ServerService, SessionId,
    SessionInfo, PPID_CALCAPP,
};
use std::sync::Arc;
use std::time::Duration;

fn t(secs: f64) -> Now {
    Now::from_monotonic(Duration::from_secs_f64(secs))
}

fn request(job_id: u32, size: u64) -> Vec<u8> {
    CalcAppMessage {
        job_size: size,
        ..CalcAppMessage::new(CalcAppType::Request, job_id)
    }
    .encode()
    .to_vec()
}

/// Every output of `pe`, with the CalcApp messages decoded.
fn drain(pe: &mut CalcAppServer) -> (Vec<(SessionId, CalcAppMessage)>, Vec<ServerOutput>) {
    let (mut messages, mut other) = (Vec::new(), Vec::new());
    while let Some(o) = pe.poll_output() {
        match o {
            ServerOutput::Send {
                session,
                ppid,
                data,
                ..
            } => {
                assert_eq!(ppid, PPID_CALCAPP);
                messages.push((session, CalcAppMessage::decode(&data).unwrap()));
            }
            o => other.push(o),
        }
    }
    (messages, other)
}

fn fast_config() -> CalcAppServerConfig {
    CalcAppServerConfig {
        capacity: 1_000_000.0,
        max_jobs: 2,
        // Out of the way: these tests look at progress.
        keep_alive_interval: Duration::from_secs(100),
        keep_alive_timeout: Duration::from_secs(100),
        cookie_max_time: Duration::from_secs(100),
        cookie_max_calculations: 1e12,
        final_cookies: true,
    }
}

#[test]
fn capacity_is_shared_among_jobs_and_full_pe_rejects() {
    let mut pe = CalcAppServer::new(fast_config());
    for s in 1..=3 {
        pe.open_session(t(0.0), SessionId(s), SessionInfo::default());
    }
    pe.handle_message(
        t(0.0),
        SessionId(1),
        PPID_CALCAPP,
        0,
        &request(1, 1_000_000),
    )
    .unwrap();
    pe.handle_message(
        t(0.0),
        SessionId(2),
        PPID_CALCAPP,
        0,
        &request(1, 1_000_000),
    )
    .unwrap();
    pe.handle_message(
        t(0.0),
        SessionId(3),
        PPID_CALCAPP,
        0,
        &request(1, 1_000_000),
    )
    .unwrap();
    let (m, other) = drain(&mut pe);
    let kinds: Vec<_> = m.iter().map(|(s, m)| (s.0, m.kind, m.job_id)).collect();
    assert_eq!(
        kinds,
        [
            (1, CalcAppType::Accept, 1),
            (2, CalcAppType::Accept, 1),
            (3, CalcAppType::Reject, 1)
        ]
    );
    assert!(other.contains(&ServerOutput::Load(1.0)));
    assert_eq!(pe.load(), 1.0);
    // Two jobs of 1M at 1M/s shared: both done after 2 s, not 1 s.
    assert_eq!(pe.poll_timeout(), Some(Duration::from_secs(2)));
    pe.handle_timeout(t(2.0));
    let (m, _) = drain(&mut pe);
    assert_eq!(m.len(), 2);
    for (_, c) in &m {
        assert_eq!(
            (c.kind, c.job_size, c.completed),
            (CalcAppType::Complete, 1_000_000, 1_000_000)
        );
    }
    assert_eq!(pe.counters().completed, 2);
    assert_eq!(pe.load(), 0.0);
}

#[test]
fn a_job_alone_speeds_up_when_the_other_leaves() {
    let mut pe = CalcAppServer::new(fast_config());
    pe.open_session(t(0.0), SessionId(1), SessionInfo::default());
    pe.open_session(t(0.0), SessionId(2), SessionInfo::default());
    pe.handle_message(
        t(0.0),
        SessionId(1),
        PPID_CALCAPP,
        0,
        &request(1, 1_000_000),
    )
    .unwrap();
    pe.handle_message(
        t(0.0),
        SessionId(2),
        PPID_CALCAPP,
        0,
        &request(7, 3_000_000),
    )
    .unwrap();
    drain(&mut pe);
    pe.handle_timeout(t(2.0)); // job 1 done (1M at 0.5M/s); job 7 has 1M done
    drain(&mut pe);
    assert_eq!(
        pe.jobs().collect::<Vec<_>>(),
        [(SessionId(2), 7, 3_000_000, 1_000_000)]
    );
    // Alone now: 2M more at 1M/s.
    assert_eq!(pe.poll_timeout(), Some(Duration::from_secs(4)));
}

#[test]
fn keep_alives_are_sent_answered_and_a_silent_pu_loses_its_job() {
    let mut config = fast_config();
    config.keep_alive_interval = Duration::from_millis(2500);
    config.keep_alive_timeout = Duration::from_millis(2500);
    let mut pe = CalcAppServer::new(config);
    pe.open_session(t(0.0), SessionId(1), SessionInfo::default());
    pe.handle_message(
        t(0.0),
        SessionId(1),
        PPID_CALCAPP,
        0,
        &request(3, 100_000_000),
    )
    .unwrap();
    drain(&mut pe);
    assert_eq!(pe.poll_timeout(), Some(Duration::from_millis(2500)));
    pe.handle_timeout(t(2.5));
    let (m, _) = drain(&mut pe);
    assert_eq!(m[0].1, CalcAppMessage::new(CalcAppType::KeepAlive, 3));
    // The PU answers: next keep-alive 2.5 s later.
    let ack = CalcAppMessage::new(CalcAppType::KeepAliveAck, 3).encode();
    pe.handle_message(t(3.0), SessionId(1), PPID_CALCAPP, 0, &ack)
        .unwrap();
    assert_eq!(pe.poll_timeout(), Some(Duration::from_millis(5500)));
    // The PU's own keep-alive is answered.
    let ka = CalcAppMessage::new(CalcAppType::KeepAlive, 3).encode();
    pe.handle_message(t(3.1), SessionId(1), PPID_CALCAPP, 0, &ka)
        .unwrap();
    let (m, _) = drain(&mut pe);
    assert_eq!(m[0].1, CalcAppMessage::new(CalcAppType::KeepAliveAck, 3));
    // Silence: keep-alive at 5.5 s, job dropped at 8 s.
    pe.handle_timeout(t(5.5));
    drain(&mut pe);
    pe.handle_timeout(t(8.0));
    let (_, other) = drain(&mut pe);
    assert!(other.iter().any(|o| matches!(
        o,
        ServerOutput::Report(ServerReport::JobTimedOut { job_id: 3, .. })
    )));
    assert_eq!(pe.jobs().count(), 0);
    assert_eq!(pe.counters().timed_out, 1);
}

#[test]
fn cookies_carry_progress_by_time_and_by_calculations() {
    let mut config = fast_config();
    config.cookie_max_time = Duration::from_secs(5);
    config.cookie_max_calculations = 1_000_000.0;
    config.capacity = 100_000.0; // 1M calculations take 10 s: time rules first
    let mut pe = CalcAppServer::new(config);
    pe.open_session(t(0.0), SessionId(1), SessionInfo::default());
    pe.handle_message(
        t(0.0),
        SessionId(1),
        PPID_CALCAPP,
        0,
        &request(9, 10_000_000),
    )
    .unwrap();
    drain(&mut pe);
    assert_eq!(pe.poll_timeout(), Some(Duration::from_secs(5)));
    pe.handle_timeout(t(5.0));
    let (_, other) = drain(&mut pe);
    let cookies: Vec<_> = other
        .iter()
        .filter_map(|o| match o {
            ServerOutput::Cookie { cookie, .. } => Some(CalcAppCookie::decode(cookie).unwrap()),
            _ => None,
        })
        .collect();
    assert_eq!(
        cookies,
        [CalcAppCookie {
            job_id: 9,
            job_size: 10_000_000,
            completed: 500_000
        }]
    );
    assert_eq!(pe.poll_timeout(), Some(Duration::from_secs(10)));
}

#[test]
fn cookie_echo_resumes_the_job_with_its_progress() {
    let mut pe = CalcAppServer::new(fast_config());
    pe.open_session(t(0.0), SessionId(4), SessionInfo::default());
    let cookie = CalcAppCookie {
        job_id: 5,
        job_size: 3_000_000,
        completed: 2_000_000,
    }
    .encode();
    pe.handle_cookie_echo(t(0.0), SessionId(4), &cookie)
        .unwrap();
    let (m, other) = drain(&mut pe);
    assert_eq!(
        m,
        [(SessionId(4), CalcAppMessage::new(CalcAppType::Accept, 5))]
    );
    assert!(other.iter().any(|o| matches!(
        o,
        ServerOutput::Report(ServerReport::JobAccepted {
            resumed: true,
            completed: 2_000_000,
            ..
        })
    )));
    assert_eq!(
        pe.poll_timeout(),
        Some(Duration::from_secs(1)),
        "1M to go at 1M/s"
    );
    // The same cookie echoed again on that session does not double the job.
    pe.handle_cookie_echo(t(0.5), SessionId(4), &cookie)
        .unwrap();
    assert_eq!(pe.jobs().count(), 1);
}

#[test]
fn bad_cookie_echoes_are_refused_and_abort_only_that_session() {
    let mut pe = CalcAppServer::new(fast_config());
    pe.open_session(t(0.0), SessionId(1), SessionInfo::default());
    pe.open_session(t(0.0), SessionId(2), SessionInfo::default());
    pe.handle_message(
        t(0.0),
        SessionId(2),
        PPID_CALCAPP,
        0,
        &request(1, 5_000_000),
    )
    .unwrap();
    drain(&mut pe);
    type Check = fn(&CookieRefused) -> bool;
    let cases: [(&[u8], Check); 3] = [
        (&[0; 19], |e| matches!(e, CookieRefused::Malformed(_))),
        (
            &CalcAppCookie {
                job_id: 1,
                job_size: 10,
                completed: 11,
            }
            .encode(),
            |e| matches!(e, CookieRefused::Invalid(_)),
        ),
        (
            &CalcAppCookie {
                job_id: 1,
                job_size: 0,
                completed: 0,
            }
            .encode(),
            |e| matches!(e, CookieRefused::Invalid(_)),
        ),
    ];
    for (cookie, expected) in cases {
        let e = pe
            .handle_cookie_echo(t(0.1), SessionId(1), cookie)
            .unwrap_err();
        assert!(expected(&e), "{e:?}");
        let (_, other) = drain(&mut pe);
        assert!(matches!(
            other[0],
            ServerOutput::Abort {
                session: SessionId(1),
                ..
            }
        ));
    }
    assert_eq!(
        pe.jobs().collect::<Vec<_>>().len(),
        1,
        "session 2's job still runs"
    );
}

#[test]
fn garbage_is_ignored_like_rsplib_and_named() {
    let mut pe = CalcAppServer::new(fast_config());
    pe.open_session(t(0.0), SessionId(1), SessionInfo::default());
    let mut accept = CalcAppMessage::new(CalcAppType::Accept, 1).encode();
    let e = pe
        .handle_message(t(0.0), SessionId(1), PPID_CALCAPP, 0, &accept)
        .unwrap_err();
    assert_eq!(e.to_string(), "unexpected CalcAppAccept");
    accept[0] = 9;
    let e = pe
        .handle_message(t(0.0), SessionId(1), PPID_CALCAPP, 0, &accept)
        .unwrap_err();
    assert_eq!(e.to_string(), "CalcApp message: field Type: unknown type 9");
    let e = pe
        .handle_message(t(0.0), SessionId(1), PPID_CALCAPP, 0, &request(1, 5)[..10])
        .unwrap_err();
    assert!(e.to_string().contains("field JobSize"), "{e}");
    let ka = CalcAppMessage::new(CalcAppType::KeepAlive, 42).encode();
    let e = pe
        .handle_message(t(0.0), SessionId(1), PPID_CALCAPP, 0, &ka)
        .unwrap_err();
    assert_eq!(e.to_string(), "no job 42 on this session");
    let (m, other) = drain(&mut pe);
    assert!(m.is_empty());
    assert!(other
        .iter()
        .all(|o| matches!(o, ServerOutput::Report(ServerReport::Ignored { .. }))));
}

#[test]
fn shutdown_sends_final_cookies() {
    let mut pe = CalcAppServer::new(fast_config());
    pe.open_session(t(0.0), SessionId(1), SessionInfo::default());
    pe.handle_message(
        t(0.0),
        SessionId(1),
        PPID_CALCAPP,
        0,
        &request(2, 5_000_000),
    )
    .unwrap();
    drain(&mut pe);
    pe.shutdown(t(1.5));
    let (_, other) = drain(&mut pe);
    let cookie = other.iter().find_map(|o| match o {
        ServerOutput::Cookie { cookie, .. } => Some(CalcAppCookie::decode(cookie).unwrap()),
        _ => None,
    });
    assert_eq!(
        cookie,
        Some(CalcAppCookie {
            job_id: 2,
            job_size: 5_000_000,
            completed: 1_500_000
        })
    );
}

fn client(jobs: u64, size: f64) -> Box<CalcAppClient> {
    Box::new(CalcAppClient::new(CalcAppClientConfig {
        job_interval: Some(Duration::from_millis(500)),
        job_size: size,
        fixed_job_size: true,
        jobs: Some(jobs),
        ..Default::default()
    }))
}

fn pe_config() -> CalcAppServerConfig {
    CalcAppServerConfig {
        cookie_max_time: Duration::from_secs(1),
        ..Default::default()
    }
}

fn completed(sim: &Sim) -> Vec<(u32, u32)> {
    sim.reports
        .iter()
        .filter_map(|r| match r {
            ClientReport::JobCompleted {
                job_id, failovers, ..
            } => Some((*job_id, *failovers)),
            _ => None,
        })
        .collect()
}

/// Jobs arriving faster than they run: the generator stops at `jobs`, so the client finishes
/// with every job it queued complete (found by the simulator: it once went on generating and
/// finished with jobs queued that never ran and were never reported).
#[test]
fn the_job_generator_stops_at_the_jobs_asked_for() {
    let pes = vec![Box::new(CalcAppServer::new(pe_config())) as Box<dyn ServerService>];
    // Jobs of 2M calculations (2 s alone on the PE), one every 500 ms.
    let mut sim = Sim::new(pes, client(3, 2_000_000.0));
    sim.start(0);
    assert!(sim.run_until(Duration::from_secs(60), |s| s.finished));
    let queued = sim
        .reports
        .iter()
        .filter(|r| matches!(r, ClientReport::JobQueued { .. }))
        .count();
    assert_eq!(queued, 3, "{:?}", sim.reports);
    assert_eq!(completed(&sim).len(), 3);
}

#[test]
fn a_job_survives_kill_of_its_pe_and_resumes_from_the_cookie() {
    let pes = (0..3)
        .map(|_| Box::new(CalcAppServer::new(pe_config())) as Box<dyn ServerService>)
        .collect();
    // Jobs of 10M calculations: 10 s alone on a PE.
    let mut sim = Sim::new(pes, client(3, 10_000_000.0));
    sim.start(0);
    assert!(sim.run_until(Duration::from_secs(30), |s| s.cookies_received >= 4));
    sim.kill(0);
    assert!(sim.run_until(Duration::from_secs(200), |s| s.finished));
    let done = completed(&sim);
    assert_eq!(done.iter().map(|d| d.0).collect::<Vec<_>>(), [1, 2, 3]);
    assert_eq!(done[0].1, 1, "job 1 failed over once");
    // PE 1 resumed job 1 from the cookie (progress > 0), and PE 0's work was not redone.
    let resumed = sim.pes[1].reports.iter().find_map(|r| match r {
        ServerReport::JobAccepted {
            job_id: 1,
            resumed: true,
            completed,
            ..
        } => Some(*completed),
        _ => None,
    });
    assert!(resumed.is_some_and(|c| c >= 3_000_000), "{resumed:?}");
    // Each job completed exactly once on the PE side.
    let completes: usize = sim
        .pes
        .iter()
        .map(|p| {
            p.reports
                .iter()
                .filter(|r| matches!(r, ServerReport::JobCompleted { .. }))
                .count()
        })
        .sum();
    assert_eq!(completes, 3);
}

#[test]
fn a_full_pe_rejects_and_the_job_goes_elsewhere() {
    let full = CalcAppServerConfig {
        max_jobs: 1,
        ..pe_config()
    };
    let mut pe0 = CalcAppServer::new(full.clone());
    // Occupy PE 0 with a long job of another PU.
    pe0.open_session(t(0.0), SessionId(1000), SessionInfo::default());
    pe0.handle_message(
        t(0.0),
        SessionId(1000),
        PPID_CALCAPP,
        0,
        &request(1, 1_000_000_000),
    )
    .unwrap();
    while pe0.poll_output().is_some() {}
    let pes: Vec<Box<dyn ServerService>> = vec![Box::new(pe0), Box::new(CalcAppServer::new(full))];
    let mut sim = Sim::new(pes, client(1, 1_000_000.0));
    sim.start(0);
    assert!(sim.run_until(Duration::from_secs(60), |s| s.finished));
    assert!(sim
        .reports
        .iter()
        .any(|r| matches!(r, ClientReport::JobRejected { job_id: 1 })));
    assert_eq!(sim.failovers[0].3, "rejected");
    assert_eq!(completed(&sim), [(1, 1)]);
}

#[test]
fn a_frozen_pe_is_detected_by_keep_alive_timeout() {
    let pes = (0..2)
        .map(|_| Box::new(CalcAppServer::new(pe_config())) as Box<dyn ServerService>)
        .collect();
    let mut sim = Sim::new(pes, client(1, 20_000_000.0));
    sim.start(0);
    assert!(sim.run_until(Duration::from_secs(30), |s| s.cookies_received >= 3));
    sim.freeze(0);
    assert!(sim.run_until(Duration::from_secs(200), |s| s.finished));
    assert_eq!(sim.failovers.len(), 1);
    assert_eq!(sim.failovers[0].3, "no answer");
    assert!(sim.failovers[0].2, "with the cookie");
}

#[test]
fn completed_job_clears_the_cookie_so_the_next_job_is_not_resumed_as_the_old_one() {
    let pes = (0..2)
        .map(|_| Box::new(CalcAppServer::new(pe_config())) as Box<dyn ServerService>)
        .collect();
    let mut sim = Sim::new(pes, client(2, 3_000_000.0));
    sim.start(0);
    assert!(sim.run_until(Duration::from_secs(60), |s| completed(s).len() == 1));
    // Job 2 was requested right away; its PE dies before job 2's first cookie.
    assert!(sim.cookie.is_none(), "job 1's cookie was forgotten");
    sim.kill(0);
    assert!(!sim.failovers[0].2, "no cookie echoed for job 2");
    assert!(sim.run_until(Duration::from_secs(60), |s| s.finished));
    assert_eq!(completed(&sim), [(1, 0), (2, 1)]);
    assert!(
        !sim.pes[1]
            .reports
            .iter()
            .any(|r| matches!(r, ServerReport::JobAccepted { job_id: 1, .. })),
        "the finished job 1 was not resumed"
    );
}

#[test]
fn signed_calcapp_cookies_resume_and_refuse_tampering() {
    let seal = Arc::new(HmacSeal::new(
        CookieKey::new([7u8; 32]).unwrap(),
        Duration::from_secs(120),
    ));
    let mk = || {
        Box::new(CalcAppServer::with_seal(
            pe_config(),
            seal.clone() as Arc<dyn CookieSeal>,
        )) as Box<dyn ServerService>
    };
    let mut sim = Sim::new(vec![mk(), mk(), mk()], client(1, 10_000_000.0));
    sim.identity = Some(b"pu-9".to_vec());
    sim.start(0);
    assert!(sim.run_until(Duration::from_secs(30), |s| s.cookies_received >= 3));
    let stolen = sim.cookie.clone().unwrap();
    sim.kill(0);
    assert!(sim.run_until(Duration::from_secs(200), |s| s.finished));
    assert_eq!(completed(&sim), [(1, 1)]);
    assert!(sim.pes.iter().all(|p| p.cookie_refusals.is_empty()));

    // The same cookie from another pool user, or with more progress written in, is refused.
    let mut pe = CalcAppServer::with_seal(pe_config(), seal.clone() as Arc<dyn CookieSeal>);
    pe.open_session(
        sim.now,
        SessionId(1),
        SessionInfo {
            identity: Some(b"pu-other".to_vec()),
        },
    );
    assert_eq!(
        pe.handle_cookie_echo(sim.now, SessionId(1), &stolen),
        Err(CookieRefused::Seal(SealError::WrongBinding))
    );
    let mut tampered = stolen.clone();
    let completed_at = 36 + 12 + 7; // payload offset + Completed's last byte
    tampered[completed_at] ^= 0xff;
    pe.open_session(
        sim.now,
        SessionId(2),
        SessionInfo {
            identity: Some(b"pu-9".to_vec()),
        },
    );
    assert_eq!(
        pe.handle_cookie_echo(sim.now, SessionId(2), &tampered),
        Err(CookieRefused::Seal(SealError::BadMac))
    );
    assert_eq!(pe.jobs().count(), 0);
}

#[test]
fn the_job_queue_is_bounded() {
    use rserpool_services::{ClientOutput, ClientService};
    let mut pu = CalcAppClient::new(CalcAppClientConfig {
        job_interval: None,
        max_queued_jobs: 2,
        ..Default::default()
    });
    let now = t(0.0);
    assert_eq!(pu.submit(now, 10), Some(1));
    assert_eq!(pu.submit(now, 10), Some(2));
    assert_eq!(pu.submit(now, 10), None);
    assert_eq!(pu.counters().dropped, 1);
    pu.start(now); // job 1 leaves the queue: room for one more
    assert_eq!(pu.submit(now, 10), Some(3));
    let outputs: Vec<_> = std::iter::from_fn(|| pu.poll_output()).collect();
    assert!(
        outputs.contains(&ClientOutput::Report(ClientReport::JobDropped {
            job_size: 10
        }))
    );
    let requests = outputs
        .iter()
        .filter(|o| matches!(o, ClientOutput::Send { .. }))
        .count();
    assert_eq!(requests, 1, "one job at a time");
}
