//! Wireshark as an independent decoder of what we encode: every PingPong and CalcApp message type
//! is wrapped in an SCTP DATA chunk with its PPID by `text2pcap` and decoded by `tshark`; no
//! malformed packet, and every field tshark shows is ours.
//!
//! Needs `tshark` and `text2pcap` (Debian package `tshark`, installed by `.ci/run`). Where they
//! are missing the test says so and passes, except under CI (`CI=true`), where it fails.

use rserpool_services::calcapp::{CalcAppMessage, CalcAppType};
use rserpool_services::pingpong::{Ping, PingPongMessage, Pong};
use rserpool_services::{PPID_CALCAPP, PPID_PINGPONG};
use std::path::Path;
use std::process::Command;

fn tools_available() -> bool {
    let ok = |tool: &str| {
        Command::new(tool)
            .arg("--version")
            .output()
            .map(|o| o.status.success())
            .unwrap_or(false)
    };
    if ok("tshark") && ok("text2pcap") {
        return true;
    }
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "tshark/text2pcap missing under CI: .ci/run must install the tshark package"
    );
    eprintln!("SKIPPED: tshark/text2pcap not installed (apt-get install tshark)");
    false
}

/// tshark's values of `fields` for each message (one SCTP packet each), tab-separated.
fn tshark_fields(
    dir: &Path,
    name: &str,
    ppid: u32,
    messages: &[Vec<u8>],
    fields: &[&str],
) -> Vec<String> {
    let mut input = String::new();
    for m in messages {
        for (i, chunk) in m.chunks(16).enumerate() {
            input += &format!("{:06x}", i * 16);
            for b in chunk {
                input += &format!(" {b:02x}");
            }
            input += "\n";
        }
    }
    let txt = dir.join(format!("{name}.txt"));
    let pcap = dir.join(format!("{name}.pcap"));
    std::fs::write(&txt, input).unwrap();
    let out = Command::new("text2pcap")
        .args(["-q", "-S", &format!("4000,5000,{ppid}")])
        .arg(&txt)
        .arg(&pcap)
        .output()
        .expect("text2pcap runs");
    assert!(
        out.status.success(),
        "text2pcap: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut cmd = Command::new("tshark");
    cmd.args(["-n", "-r"])
        .arg(&pcap)
        .args(["-T", "fields", "-E", "separator=/t"]);
    for f in fields
        .iter()
        .chain(&["_ws.malformed", "_ws.expert.severity"])
    {
        cmd.args(["-e", f]);
    }
    let out = cmd.output().expect("tshark runs");
    assert!(
        out.status.success(),
        "tshark: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let rows: Vec<String> = text.lines().map(str::to_string).collect();
    assert_eq!(rows.len(), messages.len(), "{text}");
    rows.into_iter()
        .map(|row| {
            let cells: Vec<&str> = row.split('\t').collect();
            let (ours, checks) = cells.split_at(fields.len());
            assert!(
                checks.iter().all(|c| c.is_empty()),
                "malformed or expert info: {row}"
            );
            ours.join("\t")
        })
        .collect()
}

fn hex(data: &[u8]) -> String {
    data.iter().map(|b| format!("{b:02x}")).collect()
}

#[test]
fn wireshark_decodes_pingpong_and_calcapp_as_we_do() {
    if !tools_available() {
        return;
    }
    let dir = std::env::temp_dir().join(format!("rserpool-services-ws-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();

    let pingpong = [
        PingPongMessage::Ping(Ping {
            flags: 0,
            message_no: 1,
            data: b"Nachricht: 1, Zeitstempel: 1767225600000000".to_vec(),
        }),
        PingPongMessage::Pong(Pong {
            flags: 0,
            message_no: 1,
            reply_no: 1,
            data: b"Nachricht: 1".to_vec(),
        }),
        PingPongMessage::Ping(Ping {
            flags: 0x80,
            message_no: u64::MAX,
            data: vec![0, 1, 2],
        }),
        PingPongMessage::Pong(Pong {
            flags: 0,
            message_no: 1 << 40,
            reply_no: 123_456_789_012,
            data: vec![0xff; 40],
        }),
    ];
    let bytes: Vec<Vec<u8>> = pingpong.iter().map(|m| m.encode().unwrap()).collect();
    let fields = [
        "pingpongprotocol.message_type",
        "pingpongprotocol.message_flags",
        "pingpongprotocol.message_length",
        "pingpongprotocol.ping_messageno",
        "pingpongprotocol.ping_data",
        "pingpongprotocol.pong_messageno",
        "pingpongprotocol.pong_replyno",
        "pingpongprotocol.pong_data",
    ];
    let rows = tshark_fields(&dir, "pingpong", PPID_PINGPONG, &bytes, &fields);
    for ((m, b), row) in pingpong.iter().zip(&bytes).zip(rows) {
        let expected = match m {
            PingPongMessage::Ping(p) => format!(
                "1\t{}\t{}\t{}\t{}\t\t\t",
                p.flags,
                b.len(),
                p.message_no,
                hex(&p.data)
            ),
            PingPongMessage::Pong(p) => format!(
                "2\t{}\t{}\t\t\t{}\t{}\t{}",
                p.flags,
                b.len(),
                p.message_no,
                p.reply_no,
                hex(&p.data)
            ),
        };
        assert_eq!(row, expected, "{m:?}");
    }

    let calcapp: Vec<CalcAppMessage> = (1..=7u8)
        .map(|t| CalcAppMessage {
            kind: CalcAppType::from_u8(t).unwrap(),
            flags: 0,
            job_id: 1000 + u32::from(t),
            job_size: 5_000_000 * u64::from(t),
            completed: 1_234_567 * u64::from(t),
        })
        .collect();
    let bytes: Vec<Vec<u8>> = calcapp.iter().map(|m| m.encode().to_vec()).collect();
    let fields = [
        "calcappprotocol.message_type",
        "calcappprotocol.message_flags",
        "calcappprotocol.message_length",
        "calcappprotocol.message_jobid",
        "calcappprotocol.message_jobsize",
        "calcappprotocol.message_completed",
    ];
    let rows = tshark_fields(&dir, "calcapp", PPID_CALCAPP, &bytes, &fields);
    for (m, row) in calcapp.iter().zip(rows) {
        assert_eq!(
            row,
            format!(
                "{}\t0\t24\t{}\t{}\t{}",
                m.kind as u8, m.job_id, m.job_size, m.completed
            ),
            "{m:?}"
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
