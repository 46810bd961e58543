//! Conformance oracle 1: RSPLIB's own bytes. Every ASAP and ENRP message in the RSPLIB 3.4.4
//! captures (tests/data/*.pcap) must decode, carry the fields Wireshark decoded from the same
//! frames (tests/data/*.fields.tsv, made by scripts/capture-fields), and re-encode to the very
//! same bytes.

mod common;

use common::{life_ms, Fields};
use rserpool_wire::capture::{read_pcap, CapturedMessage};
use rserpool_wire::{AsapMessage, Codec, EnrpMessage, Protocol};
use std::collections::BTreeMap;
use std::path::Path;

fn data(name: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name)
}

/// tshark's rows: frame number → field → value (only non-empty cells).
fn tshark_rows(name: &str) -> BTreeMap<usize, BTreeMap<String, String>> {
    let text = std::fs::read_to_string(data(name)).expect("fields file");
    let mut lines = text.lines();
    let header: Vec<&str> = lines.next().expect("header").split('\t').collect();
    lines
        .map(|l| {
            let cells: Vec<&str> = l.split('\t').collect();
            let frame = cells[0].parse().expect("frame number");
            let fields = header[1..]
                .iter()
                .zip(&cells[1..])
                .filter(|(_, v)| !v.is_empty())
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            (frame, fields)
        })
        .collect()
}

/// Decodes, re-encodes and renders every message of the capture; returns the rendered fields per
/// frame and the number of messages.
fn check_capture(pcap: &str) -> (BTreeMap<usize, Fields>, usize) {
    let codec = Codec::default();
    let file = std::fs::read(data(pcap)).expect("pcap");
    let messages = read_pcap(&file).expect("readable pcap");
    let mut frames: BTreeMap<usize, Fields> = BTreeMap::new();
    for CapturedMessage {
        frame,
        protocol,
        bytes,
        ..
    } in &messages
    {
        let (prefix, reencoded) = match protocol {
            Protocol::Asap => {
                let m = codec
                    .decode::<AsapMessage>(bytes)
                    .unwrap_or_else(|e| panic!("{pcap} frame {frame}: {e}"));
                assert!(
                    m.unrecognized.is_empty(),
                    "frame {frame}: unknown parameters"
                );
                let re = codec.encode(&m.message).expect("encodes");
                let f = frames.entry(*frame).or_insert_with(|| Fields::new("asap"));
                f.asap(&m.message, &re, life_ms);
                ("asap", re)
            }
            Protocol::Enrp => {
                let m = codec
                    .decode::<EnrpMessage>(bytes)
                    .unwrap_or_else(|e| panic!("{pcap} frame {frame}: {e}"));
                assert!(
                    m.unrecognized.is_empty(),
                    "frame {frame}: unknown parameters"
                );
                let re = codec.encode(&m.message).expect("encodes");
                let f = frames.entry(*frame).or_insert_with(|| Fields::new("enrp"));
                f.enrp(&m.message, &re, life_ms);
                ("enrp", re)
            }
        };
        assert_eq!(
            &reencoded, bytes,
            "{pcap} frame {frame}: {prefix} message does not re-encode to the captured bytes"
        );
    }
    (frames, messages.len())
}

fn compare_with_tshark(pcap: &str, fields: &str, expected_messages: usize) {
    let (ours, count) = check_capture(pcap);
    let theirs = tshark_rows(fields);
    assert_eq!(count, expected_messages, "{pcap}: messages found");
    assert_eq!(
        ours.keys().collect::<Vec<_>>(),
        theirs.keys().collect::<Vec<_>>(),
        "{pcap}: the frames carrying ASAP/ENRP differ from tshark's"
    );
    for (frame, t) in &theirs {
        let o = ours[frame].joined();
        for (field, value) in t {
            assert_eq!(
                o.get(field),
                Some(value),
                "{pcap} frame {frame}: field {field}"
            );
        }
        // And nothing we decoded is missing from tshark's view of the checked fields.
        for field in o.keys() {
            assert!(
                t.contains_key(field),
                "{pcap} frame {frame}: we decoded {field}={} that tshark did not",
                o[field]
            );
        }
    }
}

#[test]
fn rsplib_asap_and_enrp_capture_matches_tshark_and_reencodes_byte_exact() {
    compare_with_tshark("rsplib-asap-enrp.pcap", "rsplib-asap-enrp.fields.tsv", 75);
}

#[test]
fn rsplib_takeover_capture_matches_tshark_and_reencodes_byte_exact() {
    compare_with_tshark("rsplib-takeover.pcap", "rsplib-takeover.fields.tsv", 142);
}

#[test]
fn captures_cover_every_message_type_rsplib_sent() {
    let codec = Codec::default();
    let mut asap = std::collections::BTreeSet::new();
    let mut enrp = std::collections::BTreeSet::new();
    for pcap in ["rsplib-asap-enrp.pcap", "rsplib-takeover.pcap"] {
        for m in read_pcap(&std::fs::read(data(pcap)).unwrap()).unwrap() {
            match m.protocol {
                Protocol::Asap => asap.insert(
                    codec
                        .decode::<AsapMessage>(&m.bytes)
                        .unwrap()
                        .message
                        .name(),
                ),
                Protocol::Enrp => enrp.insert(
                    codec
                        .decode::<EnrpMessage>(&m.bytes)
                        .unwrap()
                        .message
                        .name(),
                ),
            };
        }
    }
    use rserpool_wire::Message;
    assert_eq!(asap.len(), 9, "ASAP types seen: {asap:?}");
    assert_eq!(enrp.len(), 8, "ENRP types seen: {enrp:?}");
}

#[test]
fn every_rsplib_handle_resolution_is_read_in_place_as_decoded() {
    let codec = Codec::default();
    let mut peeked = 0;
    for pcap in ["rsplib-asap-enrp.pcap", "rsplib-takeover.pcap"] {
        for m in read_pcap(&std::fs::read(data(pcap)).unwrap()).unwrap() {
            if m.protocol != Protocol::Asap {
                continue;
            }
            let decoded = codec.decode::<AsapMessage>(&m.bytes).unwrap().message;
            match (&decoded, codec.peek_handle_resolution(&m.bytes)) {
                (AsapMessage::HandleResolution(h), Some(p)) => {
                    assert_eq!(h.as_ref(), p, "{pcap} frame {}", m.frame);
                    peeked += 1;
                }
                (AsapMessage::HandleResolution(_), None) => {
                    panic!(
                        "{pcap} frame {}: RSPLIB's request not read in place",
                        m.frame
                    )
                }
                (other, Some(_)) => panic!("{pcap} frame {}: {other:?} peeked", m.frame),
                (_, None) => {}
            }
        }
    }
    assert!(peeked > 0, "the captures hold handle resolutions");
}
