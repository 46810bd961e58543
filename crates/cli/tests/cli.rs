//! The `rserpool` binary as a user runs it: `decode` on the bundled capture, and clear errors on
//! bad input (the demo of the README's first command has its own file, tests/demo.rs).

mod common;

use common::process::run as rserpool;
use std::process::Command;

#[test]
fn decode_reads_the_bundled_rsplib_capture() {
    let (ok, out, _) = rserpool(&["decode"]);
    assert!(ok);
    assert!(
        out.contains("ASAP_REGISTRATION pool EchoPool PE $2b9538f0"),
        "{out}"
    );
    assert!(out.contains("75 messages decoded, 0 with errors"), "{out}");
}

#[test]
fn bad_input_gets_a_clear_error() {
    let (ok, _, err) = rserpool(&["decode", "/nonexistent.pcap"]);
    assert!(!ok);
    assert!(err.contains("reading /nonexistent.pcap"), "{err}");
    let dir = tempfile::tempdir().unwrap();
    let junk = dir.path().join("junk.pcap");
    std::fs::write(&junk, b"not a capture").unwrap();
    let (ok, _, err) = rserpool(&["decode", junk.to_str().unwrap()]);
    assert!(!ok);
    assert!(err.contains("not a pcap file"), "{err}");
    let (ok, _, err) = rserpool(&["registrar", "--max-bad-pe-reports", "0"]);
    assert!(!ok);
    assert!(
        err.contains("max-bad-pe-reports: must be at least 1"),
        "{err}"
    );
    let (ok, _, err) = rserpool(&[
        "resolve",
        "P",
        "--registrar",
        "127.0.0.1:1",
        "--transport",
        "tcp",
        "--timeout",
        "300ms",
    ]);
    assert!(!ok);
    // What happened and over which transport, not only that it did not work.
    assert!(
        err.contains("no registrar could be reached: 127.0.0.1:1 over TCP")
            && err.to_lowercase().contains("connection refused"),
        "{err}"
    );
    let (ok, _, err) = rserpool(&["resolve", &"P".repeat(40), "--registrar", "127.0.0.1:1"]);
    assert!(!ok);
    assert!(
        err.contains("pool handle of 40 bytes exceeds the limit of 32 bytes"),
        "{err}"
    );
    // A negative number reaches the value parser, which names the flag.
    let (ok, _, err) = rserpool(&["registrar", "--max-bad-pe-reports", "-5"]);
    assert!(!ok);
    assert!(err.contains("'-5' for '--max-bad-pe-reports"), "{err}");
    let (ok, _, err) = rserpool(&["registrar", "--max-hres-items", "500"]);
    assert!(!ok);
    assert!(err.contains("above max-hres-items-limit (128)"), "{err}");
    let (ok, _, err) = rserpool(&["lsnat", "--listen", "127.0.0.1:0", "--check"]);
    assert!(!ok);
    assert!(err.contains("pool.members"), "{err}");
}

/// A `rserpool registrar` on 127.0.0.1 (a free port, announces off) with the banner's ASAP
/// address; killed when dropped.
struct Registrar {
    child: std::process::Child,
    asap: String,
}

impl Registrar {
    fn start(extra: &[&str]) -> Registrar {
        use std::io::BufRead;
        let mut child = Command::new(env!("CARGO_BIN_EXE_rserpool"))
            .args(["registrar", "--asap", "127.0.0.1:0"])
            .args(["--asap-announce", "off"])
            .args(extra)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("the registrar starts");
        let mut banner = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut banner)
            .unwrap();
        let asap = banner
            .split(" on ")
            .nth(1)
            .and_then(|r| r.split(' ').next())
            .unwrap_or_else(|| panic!("no ASAP address in the banner {banner:?}"))
            .to_string();
        assert!(
            banner.contains("(this host only; no server announces)"),
            "{banner}"
        );
        Registrar { child, asap }
    }
}

impl Drop for Registrar {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn bench_with_its_defaults_registers_with_a_registrar_on_loopback() {
    let r = Registrar::start(&[]);
    let (ok, out, err) = rserpool(&[
        "bench",
        "--registrar",
        &r.asap,
        "--pes",
        "20",
        "--seconds",
        "0.2",
        "--workloads",
        "resolve",
    ]);
    assert!(ok, "{out}\n{err}");
    assert!(out.contains("setup: 20 of 20 PEs registered"), "{out}");
}

#[test]
fn a_refused_registration_names_the_scope_and_the_setting() {
    let r = Registrar::start(&["--min-address-scope", "site-local"]);
    let (ok, out, err) = rserpool(&[
        "bench",
        "--registrar",
        &r.asap,
        "--pes",
        "2",
        "--seconds",
        "0.2",
    ]);
    assert!(!ok, "{out}\n{err}");
    assert!(out.contains("0 of 2 PEs registered"), "{out}");
    assert!(err.contains("min-address-scope"), "{err}");
}

#[test]
fn printing_commands_end_quietly_on_a_closed_pipe() {
    for args in [&["decode"][..], &["decode", "--verbose", "--hex"][..]] {
        let mut child = Command::new(env!("CARGO_BIN_EXE_rserpool"))
            .args(args)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        // Close the reading end before the first line is written: `rserpool decode | head -0`.
        drop(child.stdout.take());
        let out = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{args:?}: {:?}\n{err}", out.status);
        assert!(err.is_empty(), "{args:?} said: {err}");
    }
}

/// Runs `rserpool ARGS` in the background; its stderr lines arrive on the channel.
fn spawn_with_stderr(
    args: &[&str],
) -> (
    std::process::Child,
    std::sync::mpsc::Receiver<String>,
    std::sync::mpsc::Receiver<String>,
) {
    use std::io::BufRead;
    let mut child = Command::new(env!("CARGO_BIN_EXE_rserpool"))
        .args(args)
        .env("RUST_LOG", "info")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let (etx, erx) = std::sync::mpsc::channel();
    let stderr = child.stderr.take().unwrap();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
        {
            if etx.send(line).is_err() {
                break;
            }
        }
    });
    let (otx, orx) = std::sync::mpsc::channel();
    let stdout = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
        {
            if otx.send(line).is_err() {
                break;
            }
        }
    });
    (child, orx, erx)
}

/// Waits (up to a generous deadline) for a line containing `what`.
fn wait_for_line(lines: &std::sync::mpsc::Receiver<String>, what: &str) -> String {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let mut seen = Vec::new();
    while let Some(left) = deadline.checked_duration_since(std::time::Instant::now()) {
        match lines.recv_timeout(left) {
            Ok(l) if l.contains(what) => return l,
            Ok(l) => seen.push(l),
            Err(_) => break,
        }
    }
    panic!("no line with {what:?}; saw:\n{}", seen.join("\n"))
}

#[test]
fn lsnat_names_the_address_in_use_and_check_binds_first() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let (ok, out, err) = rserpool(&["lsnat", "--listen", &addr, "--member", "127.0.0.1:9"]);
    assert!(!ok);
    assert!(
        err.contains(&format!("TCP listener {addr}")) && err.contains("in use"),
        "{err}"
    );
    assert!(
        !out.contains("serving"),
        "no banner before the failure: {out}"
    );
    assert_eq!(
        err.matches("already in use").count(),
        1,
        "the cause once: {err}"
    );
    let (ok, out, err) = rserpool(&[
        "lsnat",
        "--listen",
        &addr,
        "--member",
        "127.0.0.1:9",
        "--check",
    ]);
    assert!(!ok, "--check binds what it will bind: {out}");
    assert!(
        err.contains("cannot be served here") && err.contains(&addr),
        "{err}"
    );
    let (ok, out, err) = rserpool(&[
        "lsnat",
        "--listen",
        "127.0.0.1:0",
        "--member",
        "127.0.0.1:9",
        "--check",
    ]);
    assert!(ok, "{out}\n{err}");
    assert!(out.contains("configuration ok"), "{out}");
    assert!(out.contains("cost 0") && !out.contains("Finite"), "{out}");
    // A listener that is its own member.
    let (ok, _, err) = rserpool(&[
        "lsnat",
        "--listen",
        "127.0.0.1:8999",
        "--member",
        "127.0.0.1:8999",
        "--check",
    ]);
    assert!(!ok);
    assert!(err.contains("the gateway's own listener[0]"), "{err}");
    // Deprecated spellings still work, with a warning.
    let (ok, out, err) = rserpool(&[
        "lsnat",
        "--listen",
        "127.0.0.1:0",
        "--member",
        "127.0.0.1:9",
        "--status",
        "127.0.0.1:0",
        "--check",
    ]);
    assert!(ok, "{out}\n{err}");
    assert!(
        out.contains("warning: --status is deprecated; write --metrics"),
        "{out}"
    );
}

#[test]
fn lsnat_banner_and_an_unknown_pool_is_reported() {
    let r = Registrar::start(&[]);
    let (mut gw, out, err) = spawn_with_stderr(&[
        "lsnat",
        "--listen",
        "127.0.0.1:0",
        "--pool-handle",
        "NoSuchPool",
        "--registrar",
        &r.asap,
        "--metrics",
        "127.0.0.1:0",
    ]);
    let banner = wait_for_line(&out, "lsnat gateway serving tcp:127.0.0.1:");
    assert!(banner.contains("/metrics"), "{banner}");
    let line = wait_for_line(&err, "does not know this pool");
    assert!(line.contains("NoSuchPool"), "{line}");
    let _ = gw.kill();
    let _ = gw.wait();
}

#[test]
fn the_example_configurations_pass_check() {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples");
    let registrar = format!("{root}/registrar.toml");
    let (ok, out, err) = rserpool(&[
        "registrar",
        "-c",
        &registrar,
        "--check",
        "--asap",
        "127.0.0.1:0",
        "--metrics",
        "127.0.0.1:0",
    ]);
    assert!(ok, "{out}\n{err}");
    assert!(out.contains("configuration ok"), "{out}");
    assert!(
        !out.contains("warning") && !err.contains("deprecated"),
        "{out}\n{err}"
    );
    let lsnat = format!("{root}/lsnat.toml");
    let (ok, out, err) = rserpool(&[
        "lsnat",
        "-c",
        &lsnat,
        "--check",
        "--listen",
        "127.0.0.1:0",
        "--metrics",
        "127.0.0.1:0",
    ]);
    assert!(ok, "{out}\n{err}");
    assert!(out.contains("configuration ok"), "{out}");
    assert!(
        !out.contains("warning"),
        "the example uses no deprecated spelling: {out}"
    );
}

#[test]
fn a_port_in_use_is_named_and_its_cause_said_once() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    for args in [
        vec![
            "registrar",
            "--transport",
            "tcp",
            "--asap",
            &addr,
            "--asap-announce",
            "off",
        ],
        vec![
            "registrar",
            "--asap",
            "127.0.0.1:0",
            "--metrics",
            &addr,
            "--asap-announce",
            "off",
        ],
    ] {
        let (ok, _, err) = rserpool(&args);
        assert!(!ok);
        let last = err.lines().last().unwrap_or_default();
        assert!(last.contains(&addr), "{last}");
        assert_eq!(last.matches("in use").count(), 1, "{last}");
    }
}
