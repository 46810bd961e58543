//! The `rserpool` binary as a user runs it: the demo of the README's first command, `decode` on
//! the bundled capture, and clear errors on bad input.

use std::process::Command;

fn rserpool(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_rserpool"))
        .args(args)
        .output()
        .expect("the binary runs");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn demo_registers_resolves_echoes_and_sees_the_crash() {
    let (ok, out, err) = rserpool(&["demo"]);
    assert!(ok, "demo failed:\n{out}\n{err}");
    assert_eq!(out.matches(" registered in EchoPool").count(), 3, "{out}");
    assert!(
        out.contains("the registrar selects 3 PE(s), least used first"),
        "{out}"
    );
    assert!(out.contains("echoes: hello pool"), "{out}");
    assert!(out.contains("removed it (cause: association lost"), "{out}");
    assert!(out.contains("a new resolution selects 2 PE(s)"), "{out}");
    assert!(out.contains("demo done"), "{out}");
}

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
    assert!(
        err.contains("'-5' for '--max-bad-pe-reports"),
        "{err}"
    );
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
            .split("on [")
            .nth(1)
            .and_then(|r| r.split(']').next())
            .unwrap_or_else(|| panic!("no ASAP address in the banner {banner:?}"))
            .to_string();
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
