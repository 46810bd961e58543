//! Conformance oracle 2: Wireshark as an independent decoder. Every ASAP and ENRP message type,
//! with rich contents (several IPv4 and IPv6 addresses, every policy type, cookies, operation
//! errors), is encoded by rserpool-wire, wrapped in an SCTP DATA chunk by `text2pcap`, and decoded
//! by `tshark`: no malformed packet, no expert error, and the fields tshark shows must be ours.
//!
//! Needs `tshark` and `text2pcap` (Debian package `tshark`, installed by `.ci/run`). Where they are
//! missing the test says so and passes, except under CI (`CI=true`), where it fails.

mod common;

use common::{life_ms, Fields};
use rserpool_wire::asap::{self, AsapMessage};
use rserpool_wire::enrp::{self, EnrpMessage, Peers};
use rserpool_wire::{
    CauseCode, Codec, ErrorCause, HandleResolutionOption, OperationError, PeChecksum, PolicyType,
    PoolElement, PoolElementId, PoolHandle, PoolPolicy, RegistrarId, RegistrationLife,
    ServerInformation, TransportAddress, TransportProtocol, TransportUse, UserTransport,
};
use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

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

fn v4(s: &str) -> std::net::IpAddr {
    s.parse().unwrap()
}

fn sctp(port: u16, addrs: &[&str]) -> TransportAddress {
    TransportAddress::sctp(
        port,
        TransportUse::DataPlusControl,
        addrs.iter().map(|a| v4(a)).collect(),
    )
}

/// Every policy this codec knows, with distinct values.
fn all_policies() -> Vec<PoolPolicy> {
    let types = PolicyType::KNOWN;
    let values = [0x4000_0000u32, 7, 250, 0x1234_5678];
    types
        .iter()
        .map(|&t| {
            (0..=4)
                .find_map(|n| PoolPolicy::from_fields(t, &values[..n]))
                .unwrap()
        })
        .chain([PoolPolicy::Other {
            policy_type: 0xc000_0777,
            data: vec![1, 2, 3, 4, 5, 6, 7, 8],
        }])
        .collect()
}

fn pe(i: u32, policy: PoolPolicy) -> PoolElement {
    let user_transport = match i % 4 {
        0 => UserTransport::Address(sctp(
            10_000 + i as u16,
            &[
                "10.0.0.1",
                "2001:db8::1",
                "192.168.7.9",
                "fe80::4ba:20ff:febd:c801",
            ],
        )),
        1 => UserTransport::Address(TransportAddress::tcp(8080, v4("2001:db8::2"))),
        2 => UserTransport::Address(TransportAddress::udp(5353, v4("10.1.2.3"))),
        _ => UserTransport::Address(TransportAddress {
            protocol: TransportProtocol::Tcp,
            port: 443,
            transport_use: TransportUse::DataOnly,
            addresses: vec![v4("172.16.0.5")],
        }),
    };
    PoolElement {
        id: PoolElementId(0x1000_0000 + i),
        home_registrar: RegistrarId(0xabcd_0000 + i),
        registration_life: if i % 5 == 4 {
            RegistrationLife::Infinite
        } else {
            RegistrationLife::Finite(Duration::from_millis(30_000 + u64::from(i)))
        },
        user_transport,
        policy,
        asap_transport: (i % 2 == 0).then(|| sctp(3863, &["127.0.0.1", "::1"])),
    }
}

fn ph() -> PoolHandle {
    PoolHandle::from("EchoPool")
}

fn errors() -> OperationError {
    OperationError {
        causes: vec![
            ErrorCause::new(CauseCode::UnknownPoolHandle),
            ErrorCause::with_info(CauseCode::Unspecified, vec![1, 2, 3, 4, 5]),
            ErrorCause::with_info(
                CauseCode::UnrecognizedParameter,
                vec![0xc1, 0x23, 0, 6, 7, 8],
            ),
            ErrorCause::new(CauseCode::LackOfResources),
        ],
    }
}

fn asap_messages() -> Vec<AsapMessage> {
    use AsapMessage as M;
    let pes: Vec<PoolElement> = all_policies()
        .into_iter()
        .enumerate()
        .map(|(i, p)| pe(i as u32, p))
        .collect();
    vec![
        M::Registration(asap::Registration {
            pool_handle: ph(),
            pool_element: pe(0, PoolPolicy::LeastUsed { load: 0x8000_0000 }),
        }),
        M::Deregistration(asap::Deregistration {
            pool_handle: ph(),
            pe_id: PoolElementId(0xdead_beef),
        }),
        M::RegistrationResponse(asap::RegistrationResponse {
            reject: true,
            pool_handle: ph(),
            pe_id: PoolElementId(1),
            error: Some(OperationError::from_cause(ErrorCause::with_info(
                CauseCode::InconsistentPoolingPolicy,
                PoolPolicy::Random.to_parameter().unwrap(),
            ))),
        }),
        M::DeregistrationResponse(asap::DeregistrationResponse {
            pool_handle: ph(),
            pe_id: PoolElementId(2),
            error: None,
        }),
        M::HandleResolution(asap::HandleResolution {
            subscribe: false,
            pool_handle: ph(),
            option: Some(HandleResolutionOption { items: 3 }),
        }),
        M::HandleResolutionResponse(asap::HandleResolutionResponse {
            accepted: false,
            pool_handle: ph(),
            overall_policy: Some(PoolPolicy::WeightedRoundRobin { weight: 5 }),
            pool_elements: pes.clone(),
            error: None,
        }),
        M::HandleResolutionResponse(asap::HandleResolutionResponse {
            accepted: false,
            pool_handle: PoolHandle::from("NoSuchPool"),
            overall_policy: None,
            pool_elements: vec![],
            error: Some(errors()),
        }),
        M::EndpointKeepAlive(asap::EndpointKeepAlive {
            home: true,
            server_id: RegistrarId(0x1dee_a448),
            pool_handle: ph(),
            pe_id: Some(PoolElementId(3)),
        }),
        M::EndpointKeepAliveAck(asap::EndpointKeepAliveAck {
            pool_handle: ph(),
            pe_id: PoolElementId(3),
        }),
        M::EndpointUnreachable(asap::EndpointUnreachable {
            pool_handle: ph(),
            pe_id: PoolElementId(4),
        }),
        M::ServerAnnounce(asap::ServerAnnounce {
            server_id: RegistrarId(7),
            transports: vec![
                sctp(3863, &["10.0.0.1", "2001:db8::7"]),
                TransportAddress::tcp(3863, v4("10.0.0.1")),
            ],
        }),
        M::Cookie(asap::Cookie {
            cookie: (0..=255u8).collect(),
        }),
        M::CookieEcho(asap::CookieEcho {
            cookie: b"state cookie 1".to_vec(),
        }),
        M::BusinessCard(asap::BusinessCard {
            pool_handle: ph(),
            pool_elements: pes[..3].to_vec(),
        }),
        M::Error(asap::AsapError { error: errors() }),
    ]
}

fn enrp_messages() -> Vec<EnrpMessage> {
    use EnrpMessage as M;
    let peers = Peers {
        sender: RegistrarId(0x1dee_a448),
        receiver: RegistrarId(0xe786_4b6a),
    };
    let info = |id: u32, port: u16| ServerInformation {
        server_id: RegistrarId(id),
        transport: sctp(port, &["10.255.0.1", "2001:db8::9"]),
    };
    let takeover = enrp::Takeover {
        peers,
        target: RegistrarId(0x4b6b_12b3),
    };
    vec![
        M::Presence(enrp::Presence {
            peers,
            reply_required: true,
            checksum: PeChecksum(0xc74e),
            server_information: Some(info(0x1dee_a448, 9901)),
        }),
        M::HandleTableRequest(enrp::HandleTableRequest {
            peers,
            own_children_only: true,
        }),
        M::HandleTableResponse(enrp::HandleTableResponse {
            peers,
            reject: false,
            more_to_send: true,
            entries: vec![
                enrp::HandleTableEntry {
                    pool_handle: ph(),
                    pool_elements: all_policies()
                        .into_iter()
                        .take(9)
                        .enumerate()
                        .map(|(i, p)| pe(i as u32, p))
                        .collect(),
                },
                enrp::HandleTableEntry {
                    pool_handle: PoolHandle::from("Pool-2"),
                    pool_elements: all_policies()
                        .into_iter()
                        .skip(9)
                        .enumerate()
                        .map(|(i, p)| pe(9 + i as u32, p))
                        .collect(),
                },
            ],
        }),
        M::HandleUpdate(enrp::HandleUpdate {
            peers,
            takeover_suggested: true,
            action: enrp::UpdateAction::DelPe,
            pool_handle: ph(),
            pool_element: pe(2, PoolPolicy::Priority { priority: 9 }),
        }),
        M::ListRequest(enrp::ListRequest { peers }),
        M::ListResponse(enrp::ListResponse {
            peers,
            reject: false,
            servers: vec![info(1, 9901), info(2, 9902), info(3, 9903)],
        }),
        M::InitTakeover(takeover.clone()),
        M::InitTakeoverAck(takeover.clone()),
        M::TakeoverServer(takeover),
        M::Error(enrp::EnrpError {
            peers,
            error: errors(),
        }),
    ]
}

/// Writes the messages as one pcap (one SCTP packet each) and returns tshark's verbose decode and
/// its field table (frame → field → value).
fn tshark_decode(
    dir: &Path,
    name: &str,
    port: u16,
    ppid: u32,
    messages: &[Vec<u8>],
) -> (String, BTreeMap<usize, BTreeMap<String, String>>) {
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
        .args(["-q", "-S", &format!("{port},{port},{ppid}")])
        .arg(&txt)
        .arg(&pcap)
        .output()
        .expect("text2pcap runs");
    assert!(
        out.status.success(),
        "text2pcap: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let verbose = Command::new("tshark")
        .args(["-n", "-V", "-r"])
        .arg(&pcap)
        .output()
        .expect("tshark runs");
    assert!(verbose.status.success());
    let fields =
        Command::new(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/capture-fields"))
            .arg(&pcap)
            .output()
            .expect("scripts/capture-fields runs");
    assert!(
        fields.status.success(),
        "{}",
        String::from_utf8_lossy(&fields.stderr)
    );
    let text = String::from_utf8(fields.stdout).unwrap();
    let mut lines = text.lines();
    let header: Vec<&str> = lines.next().expect("header").split('\t').collect();
    let rows = lines
        .map(|l| {
            let cells: Vec<&str> = l.split('\t').collect();
            let frame = cells[0].parse().unwrap();
            let f = header[1..]
                .iter()
                .zip(&cells[1..])
                .filter(|(_, v)| !v.is_empty())
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            (frame, f)
        })
        .collect();
    (String::from_utf8_lossy(&verbose.stdout).into_owned(), rows)
}

fn check(
    name: &str,
    verbose: &str,
    ours: &[BTreeMap<String, String>],
    theirs: &BTreeMap<usize, BTreeMap<String, String>>,
) {
    for bad in ["Malformed Packet", "Expert Info (Error", "[Error"] {
        assert!(
            !verbose.contains(bad),
            "{name}: tshark reports '{bad}':\n{verbose}"
        );
    }
    assert_eq!(
        theirs.len(),
        ours.len(),
        "{name}: tshark saw a different number of messages"
    );
    for (i, o) in ours.iter().enumerate() {
        let t = &theirs[&(i + 1)];
        assert_eq!(
            o,
            t,
            "{name} message {}: our fields (left) vs tshark's (right)",
            i + 1
        );
    }
}

#[test]
fn wireshark_decodes_every_asap_and_enrp_message_as_we_do() {
    if !tools_available() {
        return;
    }
    let dir = std::env::temp_dir().join(format!("rserpool-wireshark-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let codec = Codec::default();

    let asap = asap_messages();
    assert_eq!(
        asap.iter()
            .map(|m| m.kind())
            .collect::<std::collections::BTreeSet<_>>()
            .len(),
        14,
        "every ASAP message type"
    );
    let bytes: Vec<Vec<u8>> = asap.iter().map(|m| codec.encode(m).unwrap()).collect();
    let ours: Vec<_> = asap
        .iter()
        .zip(&bytes)
        .map(|(m, b)| {
            let mut f = Fields::new("asap");
            f.asap(m, b, life_ms);
            f.joined()
        })
        .collect();
    let (verbose, theirs) = tshark_decode(&dir, "asap", 3863, 11, &bytes);
    check("ASAP", &verbose, &ours, &theirs);

    let enrp = enrp_messages();
    assert_eq!(enrp.len(), 10, "every ENRP message type");
    let bytes: Vec<Vec<u8>> = enrp.iter().map(|m| codec.encode(m).unwrap()).collect();
    let ours: Vec<_> = enrp
        .iter()
        .zip(&bytes)
        .map(|(m, b)| {
            let mut f = Fields::new("enrp");
            f.enrp(m, b, life_ms);
            f.joined()
        })
        .collect();
    let (verbose, theirs) = tshark_decode(&dir, "enrp", 9901, 12, &bytes);
    check("ENRP", &verbose, &ours, &theirs);
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn policy_list_covers_every_known_policy_type() {
    let known: std::collections::BTreeSet<u32> = all_policies()
        .iter()
        .map(|p| p.policy_type().0)
        .filter(|&t| PolicyType(t).name().is_some())
        .collect();
    assert_eq!(known.len(), 18);
}
