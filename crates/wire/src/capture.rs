//! ASAP and ENRP messages out of packet captures (classic pcap files): what `rserpool decode`
//! reads, and how the conformance tests get RSPLIB's own bytes.
//!
//! Understands Ethernet, Linux cooked (SLL), raw IP and BSD loopback link types; IPv4 and IPv6;
//! SCTP DATA chunks (PPID 11 or 12, else the well-known ports; fragmented messages reassembled per
//! stream), UDP on the ASAP or ENRP port, TCP segments on those ports (one segment holding
//! whole messages, as Wireshark assumes), and segments of rserpool's TCP mapping (frames
//! marked 0xE1, `docs/tcp-mapping.md`; the message's protocol by the frame's PPID). Never panics on a damaged file: it stops with an error
//! naming the frame.

use crate::types::Protocol;
use std::collections::HashMap;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

/// How a captured message travelled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CapturedTransport {
    /// In SCTP DATA chunks on the given stream with the given payload protocol identifier.
    Sctp {
        /// Stream identifier.
        stream: u16,
        /// Payload protocol identifier.
        ppid: u32,
    },
    /// In a UDP datagram (multicast announces and presences).
    Udp,
    /// In a TCP segment.
    Tcp,
}

impl fmt::Display for CapturedTransport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CapturedTransport::Sctp { stream, ppid } => {
                write!(f, "SCTP stream {stream} PPID {ppid}")
            }
            CapturedTransport::Udp => f.write_str("UDP"),
            CapturedTransport::Tcp => f.write_str("TCP"),
        }
    }
}

/// One ASAP or ENRP message found in a capture.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CapturedMessage {
    /// Frame number, counting from 1 as Wireshark does (the frame that completed the message).
    pub frame: usize,
    /// Capture time since the Unix epoch.
    pub time: Duration,
    /// ASAP or ENRP.
    pub protocol: Protocol,
    /// How it travelled.
    pub transport: CapturedTransport,
    /// Sender.
    pub source: SocketAddr,
    /// Receiver.
    pub destination: SocketAddr,
    /// The message bytes (header first).
    pub bytes: Vec<u8>,
}

/// A capture file that cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CaptureError {
    /// Not a classic pcap file (pcapng is not supported: convert with `editcap -F pcap`).
    #[error(
        "not a pcap file (magic {0:#010x}); pcapng files can be converted with `editcap -F pcap`"
    )]
    BadMagic(u32),
    /// The link type is not one this reader understands.
    #[error("unsupported link type {0}")]
    UnsupportedLinkType(u32),
    /// The file ends inside a record.
    #[error("frame {frame}: record truncated")]
    Truncated {
        /// The frame whose record is cut short.
        frame: usize,
    },
}

struct Endian(bool);

impl Endian {
    fn u32(&self, b: &[u8]) -> u32 {
        let a = [b[0], b[1], b[2], b[3]];
        if self.0 {
            u32::from_be_bytes(a)
        } else {
            u32::from_le_bytes(a)
        }
    }
}

fn be16(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_be_bytes(b.get(at..at + 2)?.try_into().ok()?))
}

fn be32(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_be_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

fn protocol_by_port(src: u16, dst: u16) -> Option<Protocol> {
    [Protocol::Asap, Protocol::Enrp]
        .into_iter()
        .find(|p| src == p.well_known_port() || dst == p.well_known_port())
}

type StreamKey = (SocketAddr, SocketAddr, u16);

/// Reads every ASAP and ENRP message from a pcap file's bytes, in capture order.
pub fn read_pcap(file: &[u8]) -> Result<Vec<CapturedMessage>, CaptureError> {
    let magic = file
        .get(0..4)
        .map(|m| u32::from_le_bytes([m[0], m[1], m[2], m[3]]))
        .ok_or(CaptureError::BadMagic(0))?;
    let (endian, nanos) = match magic {
        0xa1b2_c3d4 => (Endian(false), false),
        0xa1b2_3c4d => (Endian(false), true),
        0xd4c3_b2a1 => (Endian(true), false),
        0x4d3c_b2a1 => (Endian(true), true),
        m => return Err(CaptureError::BadMagic(m)),
    };
    if file.len() < 24 {
        return Err(CaptureError::Truncated { frame: 0 });
    }
    let linktype = endian.u32(&file[20..24]) & 0x0fff_ffff;
    if !matches!(linktype, 0 | 1 | 101 | 113 | 228 | 229) {
        return Err(CaptureError::UnsupportedLinkType(linktype));
    }
    let mut out = Vec::new();
    let mut fragments: HashMap<StreamKey, Vec<u8>> = HashMap::new();
    let mut pos = 24;
    let mut frame = 0;
    while pos < file.len() {
        frame += 1;
        let hdr = file
            .get(pos..pos + 16)
            .ok_or(CaptureError::Truncated { frame })?;
        let secs = u64::from(endian.u32(&hdr[0..4]));
        let frac = u64::from(endian.u32(&hdr[4..8]));
        let incl = endian.u32(&hdr[8..12]) as usize;
        let data = file
            .get(pos + 16..pos + 16 + incl)
            .ok_or(CaptureError::Truncated { frame })?;
        pos += 16 + incl;
        let time = Duration::from_secs(secs)
            + if nanos {
                Duration::from_nanos(frac)
            } else {
                Duration::from_micros(frac)
            };
        let ip = match linktype {
            1 if data.len() >= 14 => ethernet_payload(data),
            113 => data.get(16..),
            0 => data.get(4..),
            _ => Some(data),
        };
        if let Some(ip) = ip {
            let mut found = |protocol, transport, source, destination, bytes: Vec<u8>| {
                out.push(CapturedMessage {
                    frame,
                    time,
                    protocol,
                    transport,
                    source,
                    destination,
                    bytes,
                })
            };
            dissect_ip(ip, &mut fragments, &mut found);
        }
    }
    Ok(out)
}

fn ethernet_payload(data: &[u8]) -> Option<&[u8]> {
    let mut at = 12;
    let mut ethertype = be16(data, at)?;
    while ethertype == 0x8100 || ethertype == 0x88a8 {
        at += 4;
        ethertype = be16(data, at)?;
    }
    data.get(at + 2..)
}

type Found<'f> = dyn FnMut(Protocol, CapturedTransport, SocketAddr, SocketAddr, Vec<u8>) + 'f;

fn dissect_ip(ip: &[u8], fragments: &mut HashMap<StreamKey, Vec<u8>>, found: &mut Found<'_>) {
    let Some(&first) = ip.first() else { return };
    let (src, dst, proto, payload) = match first >> 4 {
        4 => {
            let ihl = usize::from(first & 0x0f) * 4;
            let total = be16(ip, 2).map(usize::from).unwrap_or(0);
            let flags_frag = be16(ip, 6).unwrap_or(0);
            if ihl < 20 || total < ihl || flags_frag & 0x3fff != 0 {
                return; // IP fragments are not reassembled
            }
            let (Some(s), Some(d)) = (ip.get(12..16), ip.get(16..20)) else {
                return;
            };
            let src = IpAddr::V4(Ipv4Addr::new(s[0], s[1], s[2], s[3]));
            let dst = IpAddr::V4(Ipv4Addr::new(d[0], d[1], d[2], d[3]));
            let Some(p) = ip.get(ihl..total.min(ip.len())) else {
                return;
            };
            (src, dst, ip[9], p)
        }
        6 => {
            let plen = be16(ip, 4).map(usize::from).unwrap_or(0);
            let (Some(s), Some(d)) = (ip.get(8..24), ip.get(24..40)) else {
                return;
            };
            let s: [u8; 16] = s.try_into().expect("16 bytes");
            let d: [u8; 16] = d.try_into().expect("16 bytes");
            let Some(p) = ip.get(40..(40 + plen).min(ip.len())) else {
                return;
            };
            (
                IpAddr::V6(Ipv6Addr::from(s)),
                IpAddr::V6(Ipv6Addr::from(d)),
                ip[6],
                p,
            )
        }
        _ => return,
    };
    let (Some(sport), Some(dport)) = (be16(payload, 0), be16(payload, 2)) else {
        return;
    };
    let source = SocketAddr::new(src, sport);
    let destination = SocketAddr::new(dst, dport);
    match proto {
        132 => dissect_sctp(payload, source, destination, fragments, found),
        17 => {
            if let (Some(p), Some(body)) = (protocol_by_port(sport, dport), payload.get(8..)) {
                found(
                    p,
                    CapturedTransport::Udp,
                    source,
                    destination,
                    body.to_vec(),
                );
            }
        }
        6 => {
            let off = payload
                .get(12)
                .map(|b| usize::from(b >> 4) * 4)
                .unwrap_or(0);
            let Some(mut body) = payload.get(off.max(20)..) else {
                return;
            };
            if body.first() == Some(&TCP_MAPPING_MARKER) {
                dissect_tcp_mapping(body, source, destination, found);
                return;
            }
            let Some(p) = protocol_by_port(sport, dport) else {
                return;
            };
            while let Some(len) = crate::Codec::frame_length(body) {
                let take = len.clamp(4, body.len());
                found(
                    p,
                    CapturedTransport::Tcp,
                    source,
                    destination,
                    body[..take].to_vec(),
                );
                body = &body[take..];
            }
        }
        _ => {}
    }
}

/// First byte of every frame of rserpool's TCP mapping (`docs/tcp-mapping.md`).
const TCP_MAPPING_MARKER: u8 = 0xE1;

/// Frames of rserpool's TCP mapping in one segment (12-byte header: marker, type, stream,
/// PPID, length; DATA is type 0): each DATA frame's payload is one message, ASAP or ENRP by
/// its PPID (else by the well-known ports); keep-alives are skipped.
fn dissect_tcp_mapping(
    mut body: &[u8],
    source: SocketAddr,
    destination: SocketAddr,
    found: &mut Found<'_>,
) {
    while let (Some(&TCP_MAPPING_MARKER), Some(&frame_type), Some(ppid), Some(len)) =
        (body.first(), body.get(1), be32(body, 4), be32(body, 8))
    {
        let Some(payload) = usize::try_from(len)
            .ok()
            .and_then(|len| body.get(12..12usize.checked_add(len)?))
        else {
            return;
        };
        if frame_type == 0 {
            if let Some(p) = Protocol::from_ppid(ppid)
                .or_else(|| protocol_by_port(source.port(), destination.port()))
            {
                found(
                    p,
                    CapturedTransport::Tcp,
                    source,
                    destination,
                    payload.to_vec(),
                );
            }
        }
        body = &body[12 + payload.len()..];
    }
}

fn dissect_sctp(
    packet: &[u8],
    source: SocketAddr,
    destination: SocketAddr,
    fragments: &mut HashMap<StreamKey, Vec<u8>>,
    found: &mut Found<'_>,
) {
    let mut at = 12;
    while let (Some(ctype), Some(flags), Some(len)) =
        (packet.get(at), packet.get(at + 1), be16(packet, at + 2))
    {
        let len = usize::from(len);
        if len < 4 {
            return;
        }
        let Some(chunk) = packet.get(at..at + len) else {
            return;
        };
        at += (len + 3) & !3;
        // DATA chunk (RFC 9260 §3.3.1): TSN, stream, SSN, PPID, then user data.
        if *ctype != 0 || chunk.len() < 16 {
            continue;
        }
        let stream = be16(chunk, 8).unwrap_or(0);
        let ppid = be32(chunk, 12).unwrap_or(0);
        let Some(protocol) = Protocol::from_ppid(ppid)
            .or_else(|| protocol_by_port(source.port(), destination.port()))
        else {
            continue;
        };
        let data = &chunk[16..];
        let (begin, end) = (flags & 0x02 != 0, flags & 0x01 != 0);
        let key = (source, destination, stream);
        let bytes = match (begin, end) {
            (true, true) => data.to_vec(),
            (true, false) => {
                fragments.insert(key, data.to_vec());
                continue;
            }
            (false, _) => {
                let Some(buf) = fragments.get_mut(&key) else {
                    continue;
                };
                buf.extend_from_slice(data);
                if !end {
                    continue;
                }
                fragments.remove(&key).unwrap_or_default()
            }
        };
        found(
            protocol,
            CapturedTransport::Sctp { stream, ppid },
            source,
            destination,
            bytes,
        );
    }
}
