//! `rserpool demo`, the README's first command, as CI runs it: three registrars over ENRP,
//! PingPong PEs, pool users with failover and cookies, the gateway with its client, a PE crash
//! and a registrar crash. The exit status says whether everything behaved as the protocol
//! promises; the output must show each fact. Nothing here asserts a timing: the demo waits for
//! each condition with generous deadlines and reports the times it measured.

mod common;

use common::process::run;

/// `rserpool demo` with `args`, to its end.
fn demo(args: &[&str]) -> (bool, String, String) {
    let mut all = vec!["demo"];
    all.extend_from_slice(args);
    run(&all)
}

/// The summary row of `label`: its numbers.
fn row(out: &str, label: &str) -> Vec<u64> {
    let line = out
        .lines()
        .find(|l| l.trim_start().starts_with(label))
        .unwrap_or_else(|| panic!("no summary row {label:?}:\n{out}"));
    line[line.find(label).unwrap() + label.len()..]
        .split_whitespace()
        .map(|w| w.parse().unwrap_or_else(|_| panic!("{w:?} in {line:?}")))
        .collect()
}

#[test]
fn demo_shows_failover_takeover_and_lost_gateway_sessions_and_exits_0() {
    let (ok, out, err) = demo(&["--duration", "12s", "--seed", "7"]);
    assert!(ok, "demo failed:\n{out}\n{err}");
    // Setup: ENRP peers, PEs at different registrars, the gateway.
    assert!(
        out.contains("every registrar has the other two as ENRP peers"),
        "{out}"
    );
    for r in ["R1", "R2", "R3"] {
        assert!(
            out.contains(&format!("registered at {r} (its home)")),
            "{out}"
        );
    }
    assert!(out.contains("every registrar lists all 4 PEs"), "{out}");
    // Selection with its inputs, binding, reaching.
    assert!(out.contains("PU1 selected PE $"), "{out}");
    assert!(out.contains("pool policy Least Used"), "{out}");
    assert!(out.contains("PU1 bound to PE $"), "{out}");
    assert!(out.contains("PU1 reached PE $"), "{out}");
    // The PE crash: failover with the cookie, the count continues.
    assert!(out.contains("CRASH: PE $"), "{out}");
    assert!(out.contains("COOKIE_ECHO sent"), "{out}");
    assert!(out.contains("continues from the cookie: no gap"), "{out}");
    // The registrar crash and the takeover, the PE re-homed.
    assert!(out.contains("CRASH: registrar R"), "{out}");
    assert!(out.contains("TAKEOVER: R"), "{out}");
    assert!(out.contains("answered the H=1 keep-alive"), "{out}");
    // Gateway sessions that lost their member, said as such.
    assert!(out.contains("outcome member lost"), "{out}");
    assert!(out.contains("member_lost "), "{out}");
    // The summary: every Ping answered exactly once.
    let total = row(&out, "requests, all PUs");
    let (sent, answered, twice, _resent, failed_over, lost) =
        (total[0], total[1], total[2], total[3], total[4], total[5]);
    assert!(sent > 0, "{out}");
    assert_eq!(answered, sent, "{out}");
    assert_eq!(twice, 0, "{out}");
    assert_eq!(lost, 0, "{out}");
    assert!(failed_over >= 1, "{out}");
    assert!(out.contains("takeover time"), "{out}");
    assert!(
        out.contains("RESULT: everything behaved as the protocol promises"),
        "{out}"
    );
}

#[test]
fn demo_exits_1_when_the_pool_users_do_not_fail_over() {
    let (ok, out, err) = demo(&["--duration", "8s", "--pes", "3", "--without-failover"]);
    assert!(!ok, "the demo passed without failover:\n{out}\n{err}");
    assert!(
        out.contains("RESULT: NOT as the protocol promises"),
        "{out}"
    );
    assert!(out.contains("automatic failover is off"), "{out}");
    assert!(out.contains("unanswered at the end"), "{out}");
    assert!(err.contains("problem(s)"), "{err}");
}

#[test]
fn demo_refuses_bad_options_naming_them() {
    let (ok, _, err) = demo(&["--pes", "1"]);
    assert!(!ok);
    assert!(err.contains("pes: 1 is not in 2..=32"), "{err}");
    let (ok, _, err) = demo(&["--duration", "1s"]);
    assert!(!ok);
    assert!(err.contains("duration: must be at least 4s"), "{err}");
}
