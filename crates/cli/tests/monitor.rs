//! Component Status Protocol reports from `rserpool registrar` and `rserpool pe`, received by a
//! UDP socket of the test, by `rserpool monitor` and by RSPLIB's `cspmonitor`; and
//! `rserpool monitor` itself: its plain-text snapshot (`--once`) and its live view in tmux.
//!
//! The tests that need `cspmonitor` (Debian package rsplib-tools) or `tmux` say so and run
//! where they exist (CI installs both). Every wait polls for a condition with a generous
//! deadline; every port is chosen by the kernel.

mod common;

use common::process::{endpoint_of, start_pe, start_registrar, word_after, Proc, DEADLINE};
use rserpool_wire::csp::{Association, ComponentGroup, ComponentId, Report, PROTOCOL_SCTP};
use rserpool_wire::PoolElementId;
use std::net::UdpSocket;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Whether `program` is on PATH.
fn have(program: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {program}")])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// A registrar over the TCP mapping on 127.0.0.1 with metrics; its ID, ASAP and metrics
/// addresses.
fn registrar(extra: &[&str]) -> (Proc, String, String, String) {
    let mut args = vec![
        "--metrics",
        "127.0.0.1:0",
        "--endpoint-keep-alive-transmission-interval",
        "500ms",
    ];
    args.extend_from_slice(extra);
    let (r, asap) = start_registrar(&args);
    let id = word_after(&r.wait_for("serving ASAP over TCP on "), "registrar ");
    let metrics = endpoint_of(&r);
    (r, id, asap, metrics)
}

/// An echo PE with metrics, registered; its ID and metrics address.
fn pe(registrar: &str, extra: &[&str]) -> (Proc, String, String) {
    let (p, id) = start_pe(registrar, extra);
    let metrics = endpoint_of(&p);
    (p, id, metrics)
}

/// "$1deea448" as a number.
fn hex_id(s: &str) -> u64 {
    u64::from_str_radix(s.trim_start_matches('$'), 16).unwrap()
}

/// Receives reports on `socket` until `done` says so; panics with what came after the deadline.
fn receive_until(socket: &UdpSocket, mut done: impl FnMut(&Report) -> bool) -> Vec<Report> {
    socket
        .set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let end = Instant::now() + DEADLINE;
    let mut seen = Vec::new();
    let mut buf = [0u8; 65536];
    loop {
        if let Ok((n, _)) = socket.recv_from(&mut buf) {
            let r = Report::decode(&buf[..n])
                .unwrap_or_else(|e| panic!("our daemons send reports cspmonitor accepts: {e}"));
            let stop = done(&r);
            seen.push(r);
            if stop {
                return seen;
            }
        }
        assert!(
            Instant::now() < end,
            "timed out; reports received:\n{seen:#?}"
        );
    }
}

#[test]
fn registrar_and_pe_send_csp_reports() {
    let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
    let server = socket.local_addr().unwrap().to_string();
    let (_r, rid, asap, _) = registrar(&["--csp-server", &server, "--csp-interval", "100"]);
    let (p, pid, _) = pe(&asap, &["--csp-server", &server, "--csp-interval", "100ms"]);
    let pr = ComponentId::new(ComponentGroup::Registrar, hex_id(&rid));
    let pe_id = ComponentId::new(ComponentGroup::PoolElement, hex_id(&pid));
    // The registrar counts the PE; the PE names its pool and, once a keep-alive has named
    // it, its home registrar.
    let mut registrar_report = None;
    let mut pe_report = None;
    receive_until(&socket, |r| {
        if r.sender == pr && r.status == "1[1] PEs in 1 Pool, 0 Peers" {
            registrar_report = Some(r.clone());
        }
        if r.sender == pe_id && r.associations.iter().any(|a| a.receiver == pr) {
            pe_report = Some(r.clone());
        }
        registrar_report.is_some() && pe_report.is_some()
    });
    let r = registrar_report.unwrap();
    assert!(!r.is_final());
    assert_eq!(r.interval_us, 100_000, "a bare number is milliseconds");
    assert!(r.location.contains(&asap), "{r:?}");
    assert!(r.workload.fraction().is_none(), "registrars report no load");
    let p_report = pe_report.unwrap();
    assert_eq!(p_report.status, "EchoPool: 0 Sessions");
    assert_eq!(p_report.interval_us, 100_000);
    let home = &p_report.associations[0];
    assert_eq!(home.ppid, 11, "ASAP");
    assert_eq!(home.protocol, 6, "the TCP mapping");
    // A PU reports its pool and the PE it uses.
    let pu = Proc::start(
        &[
            "pu",
            "--registrar",
            &asap,
            "--transport",
            "tcp",
            "--pool-handle",
            "EchoPool",
            "--service",
            "chargen",
            "--quiet",
            "true",
            "--csp-server",
            &server,
            "--csp-interval",
            "100ms",
        ],
        None,
    );
    let seen = receive_until(&socket, |r| {
        r.sender.group() == ComponentGroup::PoolUser
            && r.associations.iter().any(|a| a.receiver == pe_id)
    });
    let u = seen.last().unwrap();
    assert!(
        u.status
            .starts_with(&format!("EchoPool: 1 Session on PE {pid}")),
        "{u:?}"
    );
    drop(pu);
    // On SIGTERM the PE says goodbye with a FINAL report.
    p.signal("-TERM");
    receive_until(&socket, |r| r.sender == pe_id && r.is_final());
}

/// A registrar with ENRP, over the TCP mapping, with timers short enough for a test.
fn enrp_registrar(id: &str, peer: Option<&str>, csp: &str) -> (Proc, String) {
    let mut args = vec![
        "--enrp",
        "127.0.0.1:0",
        "--enrp-announce",
        "off",
        "--identifier",
        id,
        "--mentor-discovery-timeout",
        "1s",
        "--peer-heartbeat-cycle",
        "1s",
        "--csp-server",
        csp,
        "--csp-interval",
        "100ms",
    ];
    if let Some(p) = peer {
        args.extend_from_slice(&["--peer", p]);
    }
    let (r, _) = start_registrar(&args);
    let text = r.wait_for("serving ENRP on ");
    let enrp = word_after(&text, "serving ENRP on ");
    (r, enrp)
}

#[test]
fn registrars_report_their_enrp_peers() {
    let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
    let server = socket.local_addr().unwrap().to_string();
    let (_a, a_enrp) = enrp_registrar("0x5e5e0a01", None, &server);
    let (_b, _) = enrp_registrar("0x5e5e0a02", Some(&a_enrp), &server);
    let a = ComponentId::new(ComponentGroup::Registrar, 0x5e5e0a01);
    let b = ComponentId::new(ComponentGroup::Registrar, 0x5e5e0a02);
    // Each names the other: "1 Peer" and one association, PPID 12 (ENRP), duration unknown.
    let mut heard = std::collections::BTreeSet::new();
    receive_until(&socket, |r| {
        let other = if r.sender == a { b } else { a };
        if (r.sender == a || r.sender == b)
            && r.status == "0[0] PEs in 0 Pools, 1 Peer"
            && r.associations.len() == 1
        {
            let assoc = &r.associations[0];
            assert_eq!(assoc.receiver, other);
            assert_eq!((assoc.ppid, assoc.duration_us), (12, None));
            heard.insert(r.sender);
        }
        heard.len() == 2
    });
}

#[test]
fn monitor_once_prints_registrar_pes_and_csp_components() {
    let (_r, rid, asap, rmetrics) = registrar(&[]);
    let (_p1, id1, m1) = pe(&asap, &[]);
    let (_p2, id2, m2) = pe(&asap, &["--pool-handle", "OtherPool"]);
    // An RSPLIB-style PE heard over CSP: its status names no pool.
    let rsplib_pe = ComponentId::pool_element(PoolElementId(0x00c0ffee));
    let mut report = Report::new(rsplib_pe);
    report.status = "3 Sessions".into();
    report.interval_us = 1_000_000;
    report.associations.push(Association {
        receiver: ComponentId::new(ComponentGroup::Registrar, hex_id(&rid)),
        duration_us: Some(5_000_000),
        flags: 0,
        protocol: PROTOCOL_SCTP,
        ppid: 11,
    });
    let bytes = report.encode().unwrap();
    let sender = UdpSocket::bind("127.0.0.1:0").unwrap();
    let end = Instant::now() + DEADLINE;
    loop {
        let mut m = Proc::start(
            &[
                "monitor",
                "--once",
                "--csp",
                "127.0.0.1:0",
                "--refresh",
                "3s",
                "--status",
                &rmetrics,
                "--status",
                &m1,
                "--status",
                &format!("http://{m2}"),
            ],
            None,
        );
        let csp = word_after(
            &m.wait_for("receiving CSP reports on "),
            "receiving CSP reports on ",
        );
        sender.send_to(&bytes, &csp).unwrap();
        assert!(m.wait_exit(), "monitor --once fails:\n{}", m.err());
        let out = m.out();
        let registrar_line = out.lines().find(|l| l.contains(&rid)).unwrap_or("");
        let done = registrar_line.contains("2[2]")
            && out.contains(&format!("{id1}  EchoPool"))
            && out.contains(&format!("{id2}  OtherPool"))
            && out.contains("$00c0ffee")
            && out.contains("3 Sessions");
        if done {
            assert!(out.contains("Registrars (1)"), "{out}");
            assert!(out.contains("Pool elements (3)"), "{out}");
            assert!(
                out.lines()
                    .any(|l| l.contains("$00c0ffee") && l.contains(&rid)),
                "the CSP PE's home registrar:\n{out}"
            );
            assert!(out.contains("registrar_registrations_total"), "{out}");
            break;
        }
        assert!(
            Instant::now() < end,
            "the snapshot never showed everything:\n{out}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn monitor_refuses_bad_options_naming_them() {
    let mut m = Proc::start(&["monitor", "--once", "--csp", "off"], None);
    assert!(!m.wait_exit());
    assert!(m.err().contains("nothing to show"), "{}", m.err());
    let mut m = Proc::start(
        &[
            "monitor",
            "--once",
            "--csp",
            "nowhere",
            "--status",
            "127.0.0.1:1",
        ],
        None,
    );
    assert!(!m.wait_exit());
    assert!(m.err().contains("csp: \"nowhere\""), "{}", m.err());
    let mut m = Proc::start(&["monitor", "--once", "--status", "localhost"], None);
    assert!(!m.wait_exit());
    assert!(
        m.err().contains("status: \"localhost\" is not ADDR:PORT"),
        "{}",
        m.err()
    );
    // An endpoint that does not answer is shown as such, not fatal.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = closed.local_addr().unwrap().to_string();
    drop(closed);
    let mut m = Proc::start(
        &["monitor", "--once", "--csp", "off", "--status", &addr],
        None,
    );
    assert!(m.wait_exit(), "{}", m.err());
    assert!(m.out().contains("connecting to"), "{}", m.out());
}

/// tmux on a server of its own, removed when dropped.
struct Tmux(String);

impl Tmux {
    fn run(&self, args: &[&str]) -> String {
        let out = Command::new("tmux")
            .arg("-L")
            .arg(&self.0)
            .args(args)
            .output()
            .expect("tmux runs");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn screen(&self) -> String {
        self.run(&["capture-pane", "-p", "-t", "monitor"])
    }

    fn wait_screen(&self, what: &dyn Fn(&str) -> bool, label: &str) -> String {
        let end = Instant::now() + DEADLINE;
        loop {
            let s = self.screen();
            if what(&s) {
                return s;
            }
            assert!(
                Instant::now() < end,
                "timed out waiting for {label}; screen:\n{s}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = Command::new("tmux")
            .args(["-L", &self.0, "kill-server"])
            .stderr(Stdio::null())
            .status();
    }
}

/// Needs tmux (runs where it is installed; CI installs it).
#[test]
fn live_view_in_tmux_shows_registrar_and_pes_and_quits_on_q() {
    if !have("tmux") {
        eprintln!("skipped: needs tmux");
        return;
    }
    let (_r, rid, asap, rmetrics) = registrar(&[]);
    let (_p1, id1, m1) = pe(&asap, &[]);
    let (_p2, id2, m2) = pe(&asap, &[]);
    let tmux = Tmux(format!("rserpool-monitor-test-{}", std::process::id()));
    let command = format!(
        "{} monitor --csp off --refresh 300ms --status {rmetrics} --status {m1} --status {m2}; echo monitor-exit=$?; sleep 600",
        env!("CARGO_BIN_EXE_rserpool")
    );
    tmux.run(&[
        "new-session",
        "-d",
        "-s",
        "monitor",
        "-x",
        "160",
        "-y",
        "50",
        &command,
    ]);
    let screen = tmux.wait_screen(
        &|s| s.contains(&rid) && s.contains(&id1) && s.contains(&id2) && s.contains("2[2]"),
        "the registrar and its PEs",
    );
    assert!(screen.contains("Registrars (1)"), "{screen}");
    assert!(screen.contains("Pool elements (2)"), "{screen}");
    assert!(screen.contains("q quit"), "{screen}");
    // Tab moves between panes; the view stays.
    tmux.run(&["send-keys", "-t", "monitor", "Tab"]);
    tmux.run(&["send-keys", "-t", "monitor", "Down"]);
    tmux.run(&["send-keys", "-t", "monitor", "q"]);
    let screen = tmux.wait_screen(&|s| s.contains("monitor-exit="), "the monitor to quit");
    assert!(screen.contains("monitor-exit=0"), "{screen}");
}

/// cspmonitor on a free port of 127.0.0.1; it and its address once it has bound the port
/// (its banner comes out after the bind, with its first screen).
fn cspmonitor() -> (Proc, String) {
    let end = Instant::now() + DEADLINE;
    loop {
        let port = UdpSocket::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let addr = format!("127.0.0.1:{port}");
        let mut m = Proc::spawn(
            "cspmonitor",
            &[
                &format!("-localaddress={addr}"),
                "-updateinterval=200",
                "-full",
            ],
            None,
        );
        // Taken meanwhile: it says "Unable to bind" and exits; then another port.
        loop {
            if m.out().contains("Component Status Monitor") {
                return (m, addr);
            }
            if m.child.try_wait().unwrap().is_some() {
                break;
            }
            assert!(
                Instant::now() < end,
                "cspmonitor does not start:\n{}\n{}",
                m.out(),
                m.err()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = m.wait_exit();
        assert!(
            Instant::now() < end,
            "cspmonitor does not start: {}",
            m.err()
        );
    }
}

/// Needs cspmonitor (Debian package rsplib-tools; runs where it is installed, CI installs
/// it). A report of our encoder is shown; a datagram one byte longer than its associations
/// make it is refused, by cspmonitor as by our decoder.
#[test]
fn cspmonitor_shows_what_our_encoder_builds() {
    if !have("cspmonitor") {
        eprintln!("skipped: needs cspmonitor (rsplib-tools)");
        return;
    }
    let (m, addr) = cspmonitor();
    let mut good = Report::new(ComponentId::pool_element(PoolElementId(0x5eed0001)));
    good.status = "encoded by rserpool".into();
    good.location = "test: 127.0.0.1".into();
    good.interval_us = 200_000;
    good.associations.push(Association {
        receiver: ComponentId::new(ComponentGroup::Registrar, 0x5eed0002),
        duration_us: Some(61_000_000),
        flags: 0,
        protocol: PROTOCOL_SCTP,
        ppid: 11,
    });
    let mut bad = good.clone();
    bad.sender = ComponentId::pool_element(PoolElementId(0x5eed0003));
    bad.status = "one byte too long".into();
    let good = good.encode().unwrap();
    let mut bad = bad.encode().unwrap();
    bad.push(0);
    assert!(Report::decode(&bad).is_err());
    let sender = UdpSocket::bind("127.0.0.1:0").unwrap();
    let end = Instant::now() + DEADLINE;
    loop {
        sender.send_to(&bad, &addr).unwrap();
        sender.send_to(&good, &addr).unwrap();
        let out = m.out();
        // The sender, its location and status, and its association: receiver, protocol and
        // PPID, duration.
        if out.contains("PE $5eed0001 [test: 127.0.0.1]")
            && out.contains("\"encoded by rserpool\"")
            && out.contains("-> PR $5eed0002 ASAP/SCTP")
            && out.contains("duration=0:01:01")
        {
            break;
        }
        assert!(
            Instant::now() < end,
            "cspmonitor never showed the report:\n{out}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // More rounds of both: the bad one never shows.
    for _ in 0..5 {
        sender.send_to(&bad, &addr).unwrap();
        std::thread::sleep(Duration::from_millis(200));
    }
    let out = m.out();
    assert!(
        !out.contains("5eed0003") && !out.contains("one byte too long"),
        "{out}"
    );
}

/// Needs cspmonitor (as above): our registrar, told `--csp-server`, shows up in cspmonitor's
/// output with RSPLIB's status line, and its PE beside it.
#[test]
fn cspmonitor_shows_our_registrar_and_pe() {
    if !have("cspmonitor") {
        eprintln!("skipped: needs cspmonitor (rsplib-tools)");
        return;
    }
    let (m, addr) = cspmonitor();
    let (_r, rid, asap, _) = registrar(&["--csp-server", &addr]);
    let (_p, pid, _) = pe(&asap, &["--csp-server", &addr, "--csp-interval", "200ms"]);
    m.wait_for(&format!("PR {rid}"));
    m.wait_for("\"1[1] PEs in 1 Pool, 0 Peers\"");
    m.wait_for(&format!("PE {pid}"));
    m.wait_for("\"EchoPool: 0 Sessions\"");
}
