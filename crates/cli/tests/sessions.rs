//! `rserpool pe` and `rserpool pu` as separate processes over the TCP mapping on 127.0.0.1: a
//! registrar, PEs and a PU; the serving PE is killed with SIGKILL (or frozen with SIGSTOP) and
//! the session continues on another PE with the state from the cookie. Every wait polls for a
//! condition with a generous deadline; every port is chosen by the kernel.

mod common;

use common::process::{start_pe, start_registrar, word_after, Proc, DEADLINE};
use rserpool_testkit::http;
use std::time::{Duration, Instant};

fn registrar() -> (Proc, String) {
    start_registrar(&[
        "--min-address-scope",
        "loopback",
        "--endpoint-keep-alive-transmission-interval",
        "1000",
        "--endpoint-keep-alive-timeout-interval",
        "1000",
    ])
}

/// A PE of `service`; returns it and its identifier once registered.
fn pe(registrar: &str, service: &str, extra: &[&str]) -> (Proc, String) {
    let mut args = vec!["--service", service];
    args.extend_from_slice(extra);
    start_pe(registrar, &args)
}

/// The value of a metric at the PE's /metrics.
fn metric(pe: &Proc, name: &str) -> u64 {
    let addr = word_after(&pe.out(), "metrics at http://");
    let addr = addr.trim_end_matches("/metrics");
    let body = http::get_blocking(addr, "/metrics").unwrap().body;
    body.lines()
        .find_map(|l| l.strip_prefix(&format!("{name} ")))
        .unwrap_or_else(|| panic!("{name} not in:\n{body}"))
        .trim()
        .parse()
        .unwrap()
}

/// Every Ping answered once (`answered` of them), and the reply numbers continue across the
/// failover: either without a gap, or with the last one repeated once (the PE was killed between
/// its Pong and the cookie after it, so the PU holds the previous cookie).
fn assert_pingpong_continues(out: &str, answered: u64) {
    assert!(
        out.contains(&format!("pingpong: {answered} answered")),
        "{out}"
    );
    assert!(out.contains(" 0 duplicate(s), "), "{out}");
    let gaps: Vec<&str> = out.lines().filter(|l| l.starts_with("gap: ")).collect();
    assert!(gaps.len() <= 1, "{out}");
    for g in gaps {
        let w: Vec<&str> = g.split_whitespace().collect();
        assert_eq!(w[2], w[4], "reply numbers jumped: {g}\n{out}");
    }
}

fn pu(registrar: &str, args: &[&str], stdin: Option<&str>) -> Proc {
    let mut a = vec!["pu", "--registrar", registrar, "--transport", "tcp"];
    a.extend_from_slice(args);
    Proc::start(&a, stdin)
}

/// Which of `pes` the PU is bound to (by the "bound to PE $id" line).
fn serving<'a>(pu: &Proc, pes: &'a [(Proc, String)]) -> &'a (Proc, String) {
    let text = pu.wait_for("bound to PE ");
    let id = word_after(&text, "bound to PE ");
    pes.iter()
        .find(|(_, pid)| *pid == id)
        .unwrap_or_else(|| panic!("PE {id} is none of ours"))
}

#[test]
fn echo_lines_go_through_the_pool_and_the_pu_ends_with_its_input() {
    let (_r, reg) = registrar();
    let (_pe, id) = pe(&reg, "echo", &[]);
    let mut u = pu(&reg, &[], Some("first line\nsecond line\n"));
    assert!(u.wait_exit(), "stderr:\n{}", u.err());
    assert_eq!(u.out(), "first line\nsecond line\n");
    let err = u.err();
    assert!(err.contains(&format!("bound to PE {id}")), "{err}");
    assert!(
        err.contains(
            "selected 1 (resolution 1, cache 0, business card 0), bound 1, reached 1, failovers 0"
        ),
        "{err}"
    );
    assert!(err.contains("outcome closed"), "{err}");
}

#[test]
fn pingpong_continues_on_another_pe_with_the_cookie_after_kill_9() {
    let (_r, reg) = registrar();
    let pes = vec![pe(&reg, "pingpong", &[]), pe(&reg, "pingpong", &[])];
    let mut u = pu(
        &reg,
        &[
            "--service",
            "pingpong",
            "--count",
            "40",
            "--interval",
            "50ms",
        ],
        None,
    );
    let (victim, victim_id) = serving(&u, &pes);
    u.wait_for("Pong #5:");
    victim.signal("-KILL");
    assert!(u.wait_exit(), "stdout:\n{}\nstderr:\n{}", u.out(), u.err());
    let (out, err) = (u.out(), u.err());
    let (other, other_id) = pes.iter().find(|(_, id)| id != victim_id).unwrap();
    assert!(
        err.contains(&format!(
            "failover: PE {victim_id} -> PE {other_id} (association lost"
        )),
        "{err}"
    );
    assert!(err.contains("cookie echoed"), "{err}");
    // Every Ping answered once, the reply numbers continue (state from the cookie).
    assert!(
        out.contains("pingpong: 40 answered")
            && out.contains(" 0 duplicate(s), 0 gap(s), 1 failover(s)"),
        "{out}"
    );
    assert!(
        err.contains("bound 2, reached 2, failovers 1 (1 with cookie)"),
        "{err}"
    );
    assert!(err.contains("unreachable reported 1"), "{err}");
    let last = out
        .lines()
        .rfind(|l| l.starts_with("Pong #"))
        .unwrap()
        .to_string();
    assert!(
        last.contains("reply 40 ") || last.contains("reply 39 "),
        "{last}"
    );
    assert_eq!(metric(other, "rserpool_pe_cookie_echoes_total"), 1);
    assert_eq!(metric(other, "rserpool_pe_cookie_echoes_refused_total"), 0);
}

#[test]
fn a_business_card_names_the_next_pe() {
    let (_r, reg) = registrar();
    let card = [
        "--business-card",
        "true",
        "--business-card-refresh",
        "200ms",
    ];
    let pes = vec![pe(&reg, "pingpong", &card), pe(&reg, "pingpong", &card)];
    // Each PE must know the other before the PU connects.
    let end = Instant::now() + DEADLINE;
    for (p, _) in &pes {
        while metric(p, "rserpool_pe_registered") == 0 {
            assert!(Instant::now() < end);
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    std::thread::sleep(Duration::from_millis(600));
    let mut u = pu(
        &reg,
        &[
            "--service",
            "pingpong",
            "--count",
            "20",
            "--interval",
            "50ms",
        ],
        None,
    );
    let (victim, _) = serving(&u, &pes);
    u.wait_for("Pong #3:");
    assert_eq!(metric(victim, "rserpool_pe_business_cards_sent_total"), 1);
    victim.signal("-KILL");
    assert!(u.wait_exit(), "stderr:\n{}", u.err());
    let err = u.err();
    assert!(
        err.contains("selected 2 (resolution 1, cache 0, business card 1)"),
        "{err}"
    );
    assert!(err.contains("failovers 1 (1 with cookie)"), "{err}");
}

#[test]
fn when_every_pe_is_gone_the_pu_fails_clearly_after_its_retries() {
    let (_r, reg) = registrar();
    let pes = [pe(&reg, "pingpong", &[])];
    let mut u = pu(
        &reg,
        &[
            "--service",
            "pingpong",
            "--interval",
            "50ms",
            "--max-attempts",
            "3",
            "--backoff",
            "50ms",
        ],
        None,
    );
    u.wait_for("Pong #3:");
    pes[0].0.signal("-KILL");
    assert!(!u.wait_exit(), "must fail");
    let err = u.err();
    assert!(err.contains("gave up after 3 attempt(s)"), "{err}");
    assert!(err.contains("the session failed"), "{err}");
}

#[test]
fn a_frozen_pe_is_left_when_it_stops_answering() {
    let (_r, reg) = registrar();
    let dir = tempfile::tempdir().unwrap();
    let conf = dir.path().join("pu.toml");
    std::fs::write(
        &conf,
        "[service-config.pingpong-client]\nreply-timeout = \"1s\"\n",
    )
    .unwrap();
    let pes = vec![pe(&reg, "pingpong", &[]), pe(&reg, "pingpong", &[])];
    let mut u = pu(
        &reg,
        &[
            "--service",
            "pingpong",
            "--count",
            "20",
            "--interval",
            "50ms",
            "--config",
            conf.to_str().unwrap(),
        ],
        None,
    );
    let (victim, victim_id) = serving(&u, &pes);
    u.wait_for("Pong #3:");
    victim.signal("-STOP");
    assert!(u.wait_exit(), "stderr:\n{}", u.err());
    victim.signal("-CONT");
    let (out, err) = (u.out(), u.err());
    assert!(
        err.contains(&format!("failover: PE {victim_id} -> "))
            && err.contains("(no answer in time)"),
        "{err}"
    );
    assert!(err.contains("cookie echoed"), "{err}");
    assert_pingpong_continues(&out, 20);
}

#[test]
fn a_calcapp_job_resumes_from_its_cookie_on_another_pe() {
    let (_r, reg) = registrar();
    let dir = tempfile::tempdir().unwrap();
    let pe_conf = dir.path().join("pe.toml");
    std::fs::write(
        &pe_conf,
        "[service-config.calcapp]\ncookie-max-time = \"100ms\"\n",
    )
    .unwrap();
    let pu_conf = dir.path().join("pu.toml");
    std::fs::write(
        &pu_conf,
        "[service-config.calcapp-client]\njob-size = 3000000.0\nfixed-job-size = true\njob-interval = \"10ms\"\n",
    )
    .unwrap();
    let c = ["--config", pe_conf.to_str().unwrap()];
    let pes = vec![pe(&reg, "calcapp", &c), pe(&reg, "calcapp", &c)];
    let mut u = pu(
        &reg,
        &[
            "--service",
            "calcapp",
            "--count",
            "1",
            "--config",
            pu_conf.to_str().unwrap(),
        ],
        None,
    );
    let (victim, _) = serving(&u, &pes);
    u.wait_for("accepted by PE");
    // Let the job run and some cookies arrive, then kill its PE.
    let end = Instant::now() + DEADLINE;
    while metric(victim, "rserpool_pe_cookies_sent_total") < 3 {
        assert!(Instant::now() < end, "no cookies from the calcapp PE");
        std::thread::sleep(Duration::from_millis(20));
    }
    victim.signal("-KILL");
    assert!(u.wait_exit(), "stderr:\n{}", u.err());
    let (out, err) = (u.out(), u.err());
    assert!(out.contains("1 failover(s)"), "{out}");
    assert!(out.contains("calcapp: 1 job(s) completed"), "{out}");
    assert!(err.contains("cookie echoed"), "{err}");
}

#[test]
fn a_pe_deregisters_on_sigterm() {
    let (r, reg) = registrar();
    let (mut p, id) = pe(&reg, "echo", &[]);
    p.signal("-TERM");
    assert!(p.wait_exit(), "{}", p.err());
    assert!(p.out().contains(&format!("PE {id} stopped")));
    r.wait_for(&format!("removed pool=EchoPool pe={id} cause=deregist"));
}

#[test]
fn many_lines_stream_through_one_session_without_stalling() {
    // More replies than the session's event queues hold, while the PU keeps sending: the
    // session must go on reading its commands while the application catches up.
    let (_r, reg) = registrar();
    let (_pe, _) = pe(&reg, "echo", &[]);
    let input: String = (0..20_000).map(|i| format!("line {i}\n")).collect();
    let mut u = pu(&reg, &[], Some(&input));
    assert!(u.wait_exit(), "stderr:\n{}", u.err());
    assert_eq!(u.out(), input);
    assert!(
        u.err().contains("messages sent 20000 received 20000"),
        "{}",
        u.err()
    );
}
