//! Byte-exactness against RSPLIB: every PingPong and CalcApp message and every cookie in real
//! captures of RSPLIB 3.4.4 (`rspserver -pingpong` / `-calcapp` with `pingpongclient` /
//! `calcappclient`, including failovers with COOKIE_ECHO) decodes, and re-encodes to the same
//! bytes. The captures are made by `tests/data/capture-rsplib.sh` in the SCTP VM.

use rserpool_services::calcapp::{CalcAppCookie, CalcAppMessage, CalcAppType};
use rserpool_services::pingpong::{PingPongCookie, PingPongMessage};
use rserpool_services::pingpong::{PingPongServer, PingPongServerConfig};
use rserpool_services::{
    Now, ServerOutput, ServerService, SessionId, SessionInfo, PPID_ASAP, PPID_CALCAPP,
    PPID_PINGPONG,
};
use rserpool_wire::capture::{read_pcap, CapturedTransport};
use rserpool_wire::{AsapMessage, Codec};
use std::collections::HashMap;
use std::collections::VecDeque;
use std::time::Duration;

/// One SCTP user message.
struct UserMessage {
    frame: usize,
    source_port: u16,
    destination_port: u16,
    ppid: u32,
    bytes: Vec<u8>,
}

/// Every SCTP user message of every PPID in a pcap (Ethernet or Linux cooked link types, IPv4 or
/// IPv6), fragments reassembled per direction and stream. The project's capture reader keeps
/// only ASAP and ENRP, so the services' PPIDs are read here.
fn sctp_messages(file: &[u8]) -> Vec<UserMessage> {
    let u32le = |b: &[u8]| u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    let be16 = |b: &[u8], at: usize| u16::from_be_bytes([b[at], b[at + 1]]) as usize;
    assert_eq!(
        u32le(&file[0..4]),
        0xa1b2_c3d4,
        "little-endian classic pcap"
    );
    let linktype = u32le(&file[20..24]);
    let mut out = Vec::new();
    let mut fragments: HashMap<(Vec<u8>, u16), Vec<u8>> = HashMap::new();
    let (mut pos, mut frame) = (24, 0);
    while pos + 16 <= file.len() {
        frame += 1;
        let incl = u32le(&file[pos + 8..pos + 12]) as usize;
        let data = &file[pos + 16..pos + 16 + incl];
        pos += 16 + incl;
        let ip = match linktype {
            1 => &data[14..],
            113 => &data[16..],
            other => panic!("link type {other}"),
        };
        let (addrs, proto, payload) = match ip[0] >> 4 {
            4 => {
                let ihl = usize::from(ip[0] & 0x0f) * 4;
                (ip[12..20].to_vec(), ip[9], &ip[ihl..be16(ip, 2)])
            }
            6 => (ip[8..40].to_vec(), ip[6], &ip[40..40 + be16(ip, 4)]),
            _ => continue,
        };
        if proto != 132 {
            continue;
        }
        let mut at = 12;
        while at + 4 <= payload.len() {
            let (ctype, flags, len) = (payload[at], payload[at + 1], be16(payload, at + 2));
            let chunk = &payload[at..at + len];
            at += (len + 3) & !3;
            if ctype != 0 {
                continue;
            }
            let stream = u16::from_be_bytes([chunk[8], chunk[9]]);
            let ppid = u32::from_be_bytes([chunk[12], chunk[13], chunk[14], chunk[15]]);
            let key = ([addrs.clone(), payload[0..4].to_vec()].concat(), stream);
            let body = &chunk[16..];
            let (begin, end) = (flags & 2 != 0, flags & 1 != 0);
            let buf = fragments.entry(key.clone()).or_default();
            if begin {
                buf.clear();
            }
            buf.extend_from_slice(body);
            if end {
                out.push(UserMessage {
                    frame,
                    source_port: be16(payload, 0) as u16,
                    destination_port: be16(payload, 2) as u16,
                    ppid,
                    bytes: fragments.remove(&key).unwrap(),
                });
            }
        }
    }
    out
}

/// ASAP_COOKIE and ASAP_COOKIE_ECHO in a capture: (is echo, cookie bytes); each message
/// re-encoded by the wire codec to the same bytes.
fn asap_cookies(file: &[u8]) -> Vec<(bool, Vec<u8>)> {
    let codec = Codec::default();
    let mut out = Vec::new();
    for m in read_pcap(file).unwrap() {
        if !matches!(m.transport, CapturedTransport::Sctp { ppid: 11, .. }) {
            continue;
        }
        let Ok(decoded) = codec.decode::<AsapMessage>(&m.bytes) else {
            continue;
        };
        let (echo, cookie) = match &decoded.message {
            AsapMessage::Cookie(c) => (false, c.cookie.clone()),
            AsapMessage::CookieEcho(c) => (true, c.cookie.clone()),
            _ => continue,
        };
        assert_eq!(
            codec.encode(&decoded.message).unwrap(),
            m.bytes,
            "frame {}",
            m.frame
        );
        out.push((echo, cookie));
    }
    out
}

#[test]
fn rsplib_pingpong_capture_is_decoded_and_reencoded_byte_exact() {
    let file = include_bytes!("data/pingpong-rsplib.pcap");
    let mut pings = 0;
    let mut pongs = Vec::new();
    for UserMessage {
        frame, ppid, bytes, ..
    } in sctp_messages(file)
    {
        if ppid != PPID_PINGPONG {
            continue;
        }
        let m = PingPongMessage::decode(&bytes).unwrap_or_else(|e| panic!("frame {frame}: {e}"));
        assert_eq!(m.encode().unwrap(), bytes, "frame {frame}");
        match m {
            PingPongMessage::Ping(p) => {
                pings += 1;
                assert!(p.data.starts_with(b"Nachricht: "), "frame {frame}");
            }
            PingPongMessage::Pong(p) => pongs.push(p.reply_no),
        }
    }
    assert!(
        pings >= 10 && pongs.len() >= 10,
        "{pings} Pings, {} Pongs",
        pongs.len()
    );
    // Reply numbers continue across the failovers: RSPLIB's PEs restored them from cookies.
    assert_eq!(pongs, (1..=pongs.len() as u64).collect::<Vec<_>>());

    let cookies = asap_cookies(file);
    let sent: Vec<u64> = cookies
        .iter()
        .filter(|c| !c.0)
        .map(|(_, c)| {
            let cookie = PingPongCookie::decode(c).unwrap();
            assert_eq!(cookie.encode().to_vec(), *c);
            cookie.reply_no
        })
        .collect();
    assert_eq!(sent.len(), pongs.len(), "a cookie after every Pong");
    assert_eq!(sent, (2..=pongs.len() as u64 + 1).collect::<Vec<_>>());
    let echoes: Vec<u64> = cookies
        .iter()
        .filter(|c| c.0)
        .map(|(_, c)| PingPongCookie::decode(c).unwrap().reply_no)
        .collect();
    assert!(
        !echoes.is_empty(),
        "the capture holds a failover with COOKIE_ECHO"
    );
    assert!(echoes.iter().all(|r| sent.contains(r)));
}

#[test]
fn rsplib_calcapp_capture_is_decoded_and_reencoded_byte_exact() {
    let file = include_bytes!("data/calcapp-rsplib.pcap");
    let mut kinds = HashMap::new();
    for UserMessage {
        frame, ppid, bytes, ..
    } in sctp_messages(file)
    {
        if ppid != PPID_CALCAPP {
            continue;
        }
        let m = CalcAppMessage::decode(&bytes).unwrap_or_else(|e| panic!("frame {frame}: {e}"));
        assert_eq!(m.encode().to_vec(), bytes, "frame {frame}");
        *kinds.entry(m.kind).or_insert(0) += 1;
        if m.kind == CalcAppType::Complete {
            assert_eq!(m.completed, m.job_size, "frame {frame}");
        }
    }
    for kind in [
        CalcAppType::Request,
        CalcAppType::Accept,
        CalcAppType::KeepAlive,
        CalcAppType::KeepAliveAck,
        CalcAppType::Complete,
    ] {
        assert!(
            kinds.contains_key(&kind),
            "no {kind:?} in the capture: {kinds:?}"
        );
    }
    let cookies = asap_cookies(file);
    assert!(
        cookies.iter().any(|c| !c.0) && cookies.iter().any(|c| c.0),
        "cookies and an echo"
    );
    for (_, c) in &cookies {
        let cookie = CalcAppCookie::decode(c).unwrap();
        assert_eq!(cookie.encode().to_vec(), *c);
        assert!(cookie.completed <= cookie.job_size);
    }
}

/// Our PingPong PE, fed what RSPLIB's pingpongclient sent (Pings and, after each failover, the
/// COOKIE_ECHO), answers with exactly the bytes RSPLIB's PEs answered: every Pong and every
/// cookie, session by session.
#[test]
fn our_pingpong_pe_answers_rsplib_client_byte_for_byte_like_rsplib_pe() {
    let file = include_bytes!("data/pingpong-rsplib.pcap");
    let codec = Codec::default();
    let now = Now::from_monotonic(Duration::ZERO);
    let mut pe = PingPongServer::new(PingPongServerConfig::default());
    // Per association (PU port, PE port): our session and what it sent, in order.
    type Sent = VecDeque<(u32, Vec<u8>)>;
    let mut sessions: HashMap<(u16, u16), (SessionId, Sent)> = HashMap::new();
    let (mut pongs, mut cookies, mut echoes) = (0, 0, 0);
    for m in sctp_messages(file) {
        let asap = (m.ppid == PPID_ASAP)
            .then(|| codec.decode::<AsapMessage>(&m.bytes).ok())
            .flatten()
            .map(|d| d.message);
        let from_pu = match (&asap, m.ppid) {
            (Some(AsapMessage::CookieEcho(_)), _) => true,
            (Some(AsapMessage::Cookie(_)), _) => false,
            (_, PPID_PINGPONG) => m.bytes[0] == 1,
            _ => continue,
        };
        let key = if from_pu {
            (m.source_port, m.destination_port)
        } else {
            (m.destination_port, m.source_port)
        };
        let next_id = SessionId(sessions.len() as u64 + 1);
        let (session, expected) = sessions.entry(key).or_insert_with(|| {
            pe.open_session(now, next_id, SessionInfo::default());
            (next_id, VecDeque::new())
        });
        if from_pu {
            match asap {
                Some(AsapMessage::CookieEcho(echo)) => {
                    echoes += 1;
                    pe.handle_cookie_echo(now, *session, &echo.cookie).unwrap();
                }
                _ => pe
                    .handle_message(now, *session, m.ppid, 0, &m.bytes)
                    .unwrap(),
            }
            while let Some(o) = pe.poll_output() {
                match o {
                    ServerOutput::Send { ppid, data, .. } => expected.push_back((ppid, data)),
                    ServerOutput::Cookie { cookie, .. } => expected.push_back((PPID_ASAP, cookie)),
                    ServerOutput::Report(_) => {}
                    other => panic!("frame {}: unexpected {other:?}", m.frame),
                }
            }
        } else {
            let ours = expected
                .pop_front()
                .unwrap_or_else(|| panic!("frame {}: RSPLIB sent more than we would", m.frame));
            match asap {
                Some(AsapMessage::Cookie(c)) => {
                    cookies += 1;
                    assert_eq!(ours, (PPID_ASAP, c.cookie), "frame {}: cookie", m.frame);
                }
                _ => {
                    pongs += 1;
                    assert_eq!(ours, (PPID_PINGPONG, m.bytes), "frame {}: Pong", m.frame);
                }
            }
        }
    }
    assert!(
        pongs >= 10 && cookies == pongs && echoes >= 1,
        "{pongs} {cookies} {echoes}"
    );
    assert!(sessions.len() >= 2, "several sessions (failovers)");
}

/// Our CalcApp PE, fed what RSPLIB's calcappclient sent (Requests, keep-alives, the COOKIE_ECHO
/// after the failover), answers Accept, Reject and KeepAliveAck with exactly RSPLIB's bytes.
/// (Completion times and cookie contents depend on the clock and are checked in calcapp.rs.)
#[test]
fn our_calcapp_pe_answers_rsplib_client_like_rsplib_pe() {
    use rserpool_services::calcapp::{CalcAppServer, CalcAppServerConfig};
    let file = include_bytes!("data/calcapp-rsplib.pcap");
    let codec = Codec::default();
    let now = Now::from_monotonic(Duration::ZERO);
    // As captured: rspserver -calcapp -capmaxjobs=4.
    let mut pe = CalcAppServer::new(CalcAppServerConfig {
        max_jobs: 4,
        ..Default::default()
    });
    type Answers = HashMap<u8, VecDeque<Vec<u8>>>;
    let mut sessions: HashMap<(u16, u16), (SessionId, Answers)> = HashMap::new();
    let (mut compared, mut echoes) = (0, 0);
    for m in sctp_messages(file) {
        let asap = (m.ppid == PPID_ASAP)
            .then(|| codec.decode::<AsapMessage>(&m.bytes).ok())
            .flatten()
            .map(|d| d.message);
        let calcapp = (m.ppid == PPID_CALCAPP).then(|| CalcAppMessage::decode(&m.bytes).unwrap());
        // An association starts with the PU's Request or COOKIE_ECHO: it is keyed by (PU port,
        // PE port) from then on, which tells the direction of the keep-alives and their acks.
        let forward = (m.source_port, m.destination_port);
        let from_pu = match (&asap, &calcapp) {
            (Some(AsapMessage::CookieEcho(_)), _) => true,
            (_, Some(c)) if c.kind == CalcAppType::Request => true,
            (_, Some(_)) => sessions.contains_key(&forward),
            _ => continue,
        };
        let key = if from_pu {
            forward
        } else {
            (m.destination_port, m.source_port)
        };
        let next_id = SessionId(sessions.len() as u64 + 1);
        let (session, answers) = sessions.entry(key).or_insert_with(|| {
            pe.open_session(now, next_id, SessionInfo::default());
            (next_id, HashMap::new())
        });
        if from_pu {
            match asap {
                Some(AsapMessage::CookieEcho(echo)) => {
                    echoes += 1;
                    pe.handle_cookie_echo(now, *session, &echo.cookie).unwrap();
                }
                _ => {
                    let _ = pe.handle_message(now, *session, PPID_CALCAPP, 0, &m.bytes);
                }
            }
            while let Some(o) = pe.poll_output() {
                if let ServerOutput::Send { data, .. } = o {
                    answers.entry(data[0]).or_default().push_back(data);
                }
            }
        } else if let Some(c) = calcapp {
            match c.kind {
                CalcAppType::Accept | CalcAppType::Reject | CalcAppType::KeepAliveAck => {
                    let ours = answers
                        .get_mut(&(c.kind as u8))
                        .and_then(|q| q.pop_front())
                        .unwrap_or_else(|| panic!("frame {}: we would not send {c}", m.frame));
                    assert_eq!(ours, m.bytes, "frame {}", m.frame);
                    compared += 1;
                }
                CalcAppType::Complete => {
                    // The job is done at RSPLIB's PE; calcappclient closes the association.
                    pe.close_session(now, *session);
                    while pe.poll_output().is_some() {}
                }
                _ => {}
            }
        }
    }
    assert!(
        compared >= 20 && echoes >= 1,
        "{compared} answers compared, {echoes} echoes"
    );
}
