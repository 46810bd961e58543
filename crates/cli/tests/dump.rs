//! `rserpool dump` against real `rserpool registrar` processes over the TCP mapping on
//! 127.0.0.1 (the harness of tests/common): every PE and pool printed, the JSON matching the
//! registrar, a table of more than 128 PEs read in chunks, the registrar's peer table back to
//! what it was once the dump is gone; and each failure (unreachable, silent, rejecting,
//! malformed) named with a nonzero exit.

mod common;

use common::*;
use rserpool_wire::enrp::{self, EnrpMessage};
use rserpool_wire::{Codec, RegistrarId};
use std::io::Read;
use std::io::Write;
use std::net::{SocketAddr, TcpListener};
use std::process::{Command, Output};
use std::time::Duration;

fn dump(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_rserpool"))
        .arg("dump")
        .args(args)
        .output()
        .expect("rserpool runs")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn json(r: &Registrar) -> serde_json::Value {
    let out = dump(&["--transport", "tcp", "--json", &r.enrp.to_string()]);
    assert!(out.status.success(), "dump failed: {}", text(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("the JSON parses")
}

#[test]
fn dump_prints_every_pool_and_pe_and_the_json_matches_the_registrar() {
    // RSPLIB's default ENRP timers: a dump's peer entry left to time out would stay 10 s.
    let r = start_with(0x5001, None, &["--default-timers"]);
    let _echo = pes_in(&r, "EchoPool", &[1, 2, 3]);
    let _calc = pes_in(&r, "CalcAppPool", &[0x10, 0x11]);
    wait_for("5 PEs registered", Duration::from_secs(60), || {
        metric(&r, "rserpool_registrar_pool_elements") == 5
    });
    assert_eq!(metric(&r, "rserpool_registrar_enrp_peers"), 0);

    let out = dump(&["--transport", "tcp", &r.enrp.to_string()]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{}\n{}", stdout, text(&out.stderr));
    assert!(stdout.starts_with("Registrar $00005001 at "), "{stdout}");
    for pool in [
        "Pool \"EchoPool\": 3 PE(s)",
        "Pool \"CalcAppPool\": 2 PE(s)",
    ] {
        assert!(stdout.contains(pool), "{pool} missing:\n{stdout}");
    }
    for pe in [
        "$00000001",
        "$00000002",
        "$00000003",
        "$00000010",
        "$00000011",
    ] {
        let line = stdout
            .lines()
            .find(|l| l.trim_start().starts_with(pe))
            .unwrap_or_else(|| panic!("PE {pe} missing:\n{stdout}"));
        assert!(line.contains("$00005001"), "home registrar: {line}");
        assert!(line.contains("Round Robin"), "policy: {line}");
        assert!(line.contains("{127.0.0.1}:7/TCP"), "user transport: {line}");
    }
    assert!(stdout.contains("Total: 2 pool(s), 5 PE(s)"), "{stdout}");
    assert!(stdout.contains("Peers it knows: 0"), "{stdout}");

    let doc = json(&r);
    assert_eq!(doc["schema"], 1);
    assert_eq!(doc["registrar"]["id"], 0x5001);
    assert_eq!(doc["registrar"]["transport"], "tcp");
    assert_eq!(doc["totals"]["pools"], 2);
    assert_eq!(doc["totals"]["pool_elements"], 5);
    let pools: Vec<(String, Vec<u64>)> = doc["pools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["handle"].as_str().unwrap().to_string(),
                p["pool_elements"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|e| e["id"].as_u64().unwrap())
                    .collect(),
            )
        })
        .collect();
    assert_eq!(
        pools,
        vec![
            ("CalcAppPool".to_string(), vec![0x10, 0x11]),
            ("EchoPool".to_string(), vec![1, 2, 3]),
        ]
    );
    let pe = &doc["pools"][1]["pool_elements"][0];
    assert_eq!(pe["home_registrar"], 0x5001);
    assert_eq!(pe["registration_life_ms"], 300_000);
    assert_eq!(pe["policy"]["name"], "Round Robin");
    assert_eq!(pe["user_transport"]["protocol"], "tcp");
    assert_eq!(pe["user_transport"]["port"], 7);
    assert_eq!(pe["asap_transport"]["addresses"][0], "127.0.0.1");
    // The checksum the registrar announced is the one over its PEs as dumped.
    assert_eq!(doc["homes"][0]["id"], 0x5001);
    assert_eq!(doc["homes"][0]["pool_elements"], 5);
    assert_eq!(
        doc["registrar"]["pe_checksum"],
        doc["homes"][0]["pe_checksum"]
    );

    // Two dumps came and went: the registrar forgot each when its association closed, rather
    // than after max-time-last-heard + max-time-no-response (5 s + 5 s).
    wait_for(
        "the peer table empty again",
        Duration::from_secs(30),
        || metric(&r, "rserpool_registrar_enrp_peers") == 0,
    );
    assert_eq!(
        metric(&r, "rserpool_registrar_enrp_peers_departed_total"),
        2
    );
    assert_eq!(metric(&r, "rserpool_registrar_enrp_peers_dead_total"), 0);
}

#[test]
fn dump_reads_a_table_of_300_pes_in_chunks() {
    let r = start_with(0x5002, None, &["--default-timers"]);
    let ids: Vec<u32> = (1..=300).collect();
    let _pes: Vec<_> = ids.chunks(30).map(|c| pes(&r, c)).collect();
    wait_for("300 PEs registered", Duration::from_secs(120), || {
        metric(&r, "rserpool_registrar_pool_elements") == 300
    });
    let doc = json(&r);
    assert_eq!(doc["totals"]["pool_elements"], 300);
    let responses = doc["totals"]["responses"].as_u64().unwrap();
    assert!(
        responses >= 3,
        "300 PEs take at least 3 responses of at most 128: {responses}"
    );
    let got: Vec<u64> = doc["pools"][0]["pool_elements"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["id"].as_u64().unwrap())
        .collect();
    assert_eq!(got, (1..=300).collect::<Vec<u64>>());
    wait_for(
        "the peer table empty again",
        Duration::from_secs(30),
        || metric(&r, "rserpool_registrar_enrp_peers") == 0,
    );
    assert_eq!(metric(&r, "rserpool_registrar_enrp_peers_dead_total"), 0);
}

/// A port nothing listens on (bound, then released).
fn closed_port() -> SocketAddr {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

#[test]
fn an_unreachable_registrar_is_named_with_the_cause() {
    let addr = closed_port();
    let out = dump(&["--transport", "tcp", "--timeout", "20s", &addr.to_string()]);
    let err = text(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains(&format!("cannot reach the registrar at {addr} over TCP")),
        "{err}"
    );
    assert!(err.to_lowercase().contains("refused"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}

/// A fake registrar on the TCP mapping: accepts one connection, reads what comes, and sends
/// `answer` (raw bytes) once the dump has spoken; then holds the connection open.
fn fake_registrar(answer: Vec<u8>) -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    std::thread::spawn(move || {
        if let Ok((mut s, _)) = l.accept() {
            let mut first = [0u8; 12];
            if s.read_exact(&mut first).is_ok() && !answer.is_empty() {
                let _ = s.write_all(&answer);
            }
            let mut sink = [0u8; 4096];
            while matches!(s.read(&mut sink), Ok(n) if n > 0) {}
        }
    });
    addr
}

#[test]
fn a_silent_peer_ends_in_a_timeout_that_says_what_arrived() {
    let addr = fake_registrar(Vec::new());
    let out = dump(&["--transport", "tcp", "--timeout", "1s", &addr.to_string()]);
    let err = text(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("no complete handle table") && err.contains("within 1s"),
        "{err}"
    );
    assert!(err.contains("nothing was received"), "{err}");
}

#[test]
fn a_rejected_request_and_a_malformed_answer_are_named() {
    let reject = Codec::default()
        .encode(&EnrpMessage::HandleTableResponse(
            enrp::HandleTableResponse {
                peers: enrp::Peers {
                    sender: RegistrarId(0x77),
                    receiver: RegistrarId(0),
                },
                reject: true,
                more_to_send: false,
                entries: Vec::new(),
            },
        ))
        .unwrap();
    let addr = fake_registrar(frame(12, &reject));
    let out = dump(&["--transport", "tcp", "--timeout", "20s", &addr.to_string()]);
    let err = text(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("registrar $00000077 rejected the ENRP_HANDLE_TABLE_REQUEST (R flag)"),
        "{err}"
    );
    // A HANDLE_TABLE_RESPONSE whose length runs past its end.
    let addr = fake_registrar(frame(12, &[0x03, 0x00, 0x00, 0x40, 0, 0, 0, 1]));
    let out = dump(&["--transport", "tcp", "--timeout", "20s", &addr.to_string()]);
    let err = text(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("malformed ENRP message from the registrar"),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn dump_shows_each_pe_at_its_home_and_the_registrars_peer() {
    let r1 = start(0x5101, None);
    let r2 = start(0x5102, Some(r1.enrp));
    wait_for("two peers", Duration::from_secs(60), || {
        metric(&r1, "rserpool_registrar_enrp_peers") == 1
            && metric(&r2, "rserpool_registrar_enrp_peers") == 1
    });
    let _at_1 = pes_in(&r1, "EchoPool", &[1]);
    let _at_2 = pes_in(&r2, "EchoPool", &[2]);
    wait_for("both PEs at r1", Duration::from_secs(60), || {
        metric(&r1, "rserpool_registrar_pool_elements") == 2
    });
    let out = dump(&["--transport", "tcp", &r1.enrp.to_string()]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let home = |pe: &str| {
        stdout
            .lines()
            .find(|l| l.trim_start().starts_with(pe))
            .and_then(|l| l.split_whitespace().nth(1))
            .unwrap_or_default()
            .to_string()
    };
    assert_eq!(home("$00000001"), "$00005101", "{stdout}");
    assert_eq!(home("$00000002"), "$00005102", "{stdout}");
    assert!(
        stdout.contains("Peers it knows: 1\n  $00005102 at {127.0.0.1}:"),
        "{stdout}"
    );
    assert!(
        stdout.contains("  $00005101: 1 PE(s), checksum"),
        "{stdout}"
    );
    assert!(
        stdout.contains("  $00005102: 1 PE(s), checksum"),
        "{stdout}"
    );
    let doc = json(&r1);
    assert_eq!(doc["peers"].as_array().map(Vec::len), Some(1), "{doc}");
    assert_eq!(doc["peers"][0]["id"], 0x5102);
    assert_eq!(doc["homes"].as_array().map(Vec::len), Some(2));
    // The dumps leave; the registrars' real peering stays.
    wait_for("r1 back to its one peer", Duration::from_secs(30), || {
        metric(&r1, "rserpool_registrar_enrp_peers") == 1
            && metric(&r1, "rserpool_registrar_enrp_peers_departed_total") == 2
    });
    assert_eq!(metric(&r2, "rserpool_registrar_enrp_peers"), 1);
    assert_eq!(metric(&r1, "rserpool_registrar_enrp_peers_dead_total"), 0);
}

/// The registrar's PRESENCE may trail its table: it is awaited briefly, and without it the dump
/// still succeeds, saying the checksum is unknown.
#[test]
fn the_registrars_presence_is_awaited_after_the_table_but_not_required() {
    let codec = Codec::default();
    let peers = enrp::Peers {
        sender: RegistrarId(0x77),
        receiver: RegistrarId(0),
    };
    let table = frame(
        12,
        &codec
            .encode(&EnrpMessage::HandleTableResponse(
                enrp::HandleTableResponse {
                    peers,
                    reject: false,
                    more_to_send: false,
                    entries: Vec::new(),
                },
            ))
            .unwrap(),
    );
    let presence = frame(
        12,
        &codec
            .encode(&EnrpMessage::Presence(enrp::Presence {
                peers,
                reply_required: false,
                checksum: rserpool_wire::PeChecksum(0xabcd),
                server_information: None,
            }))
            .unwrap(),
    );
    let addr = fake_registrar([table.clone(), presence].concat());
    let out = dump(&["--transport", "tcp", "--timeout", "20s", &addr.to_string()]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        stdout.starts_with("Registrar $00000077 at ")
            && stdout.contains("PE checksum 0xabcd announced"),
        "{stdout}"
    );
    let addr = fake_registrar(table);
    let out = dump(&["--transport", "tcp", "--timeout", "20s", &addr.to_string()]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        stdout.contains("PE checksum unknown (no PRESENCE received)"),
        "{stdout}"
    );
    assert!(stdout.contains("Total: 0 pool(s), 0 PE(s)"), "{stdout}");
}
