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
        "300",
    ]);
    assert!(!ok);
    assert!(
        err.contains("no registrar of [127.0.0.1:1] could be reached"),
        "{err}"
    );
    let (ok, _, err) = rserpool(&["lsnat", "--listen", "127.0.0.1:0", "--check"]);
    assert!(!ok);
    assert!(err.contains("pool.members"), "{err}");
}
