//! A pcap file of the simulated traffic: every message the simulated network delivers, at its
//! virtual delivery time, framed as the real network would carry it, so that `rserpool decode`,
//! tshark and Wireshark read a simulation run as they read a real capture.
//!
//! - Link type raw IP (LINKTYPE_RAW, 101), IPv4, nanosecond timestamps: virtual time since the
//!   start of the run (tools show it as 1970-01-01 plus the virtual time).
//! - A message on an association is one SCTP packet (RFC 9260 §3) with one DATA chunk (B and E
//!   set; messages longer than [`MAX_CHUNK_DATA`] are fragmented over several packets, as over a
//!   1500-byte MTU), stream 0, TSNs and stream sequence numbers counting per association
//!   direction, a verification tag per association direction, and a correct CRC32c. PPID 11 for
//!   ASAP, 12 for ENRP, the session's own PPID (33 for PingPong) on session associations.
//! - A message on a TCP-mapped association is one TCP segment holding one frame of the mapping
//!   (`docs/tcp-mapping.md`), sequence and acknowledgement numbers counting each direction's
//!   bytes, correct checksum.
//! - A multicast datagram (ASAP_SERVER_ANNOUNCE, ENRP_PRESENCE) is a UDP datagram to the group
//!   (239.0.0.50:3863 for ASAP, 239.0.0.51:9901 for ENRP), written once per receiver that got
//!   it, at its arrival time: lost copies are missing, duplicated ones appear twice.
//!
//! The file is built in memory up to a byte limit; past it, packets are counted but not written
//! (the file stays valid). The same run gives the same bytes.

use crc::{Crc, CRC_32_ISCSI};
use pcap_file::pcap::{PcapHeader, PcapPacket, PcapWriter};
use pcap_file::{DataLink, Endianness, TsResolution};
use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

/// The multicast group and port of ASAP announces in the capture.
pub const ASAP_GROUP: SocketAddr = SocketAddr::new(IpAddr::V4(Ipv4Addr::new(239, 0, 0, 50)), 3863);
/// The multicast group and port of ENRP presences in the capture.
pub const ENRP_GROUP: SocketAddr = SocketAddr::new(IpAddr::V4(Ipv4Addr::new(239, 0, 0, 51)), 9901);
/// Most user data in one DATA chunk: a 1500-byte MTU less the IPv4 (20), SCTP common (12) and
/// DATA chunk (16) headers.
pub const MAX_CHUNK_DATA: usize = 1500 - 20 - 12 - 16;

/// Most bytes of one TCP segment's payload: the largest IPv4 packet less the IPv4 and TCP
/// headers.
const MAX_TCP_SEGMENT: usize = 65_535 - 20 - 20;

const CRC32C: Crc<u32> = Crc::<u32>::new(&CRC_32_ISCSI);

/// Per association direction: verification tag, next TSN, next stream sequence number (for a
/// TCP-mapped association: the next sequence number in `tsn`).
struct Direction {
    tag: u32,
    tsn: u32,
    ssn: u16,
}

/// The pcap file being written, with its limit and counts.
pub(crate) struct Capture {
    writer: PcapWriter<Vec<u8>>,
    limit: u64,
    /// Association id and receiving side -> its direction's counters.
    directions: BTreeMap<(u64, usize), Direction>,
    ip_id: u16,
    /// Bytes in the file so far.
    bytes: u64,
    /// Packets written.
    pub(crate) packets: u64,
    /// Packets left out because the file reached its limit.
    pub(crate) left_out: u64,
}

impl Capture {
    /// An empty capture that stops writing once the file holds `limit` bytes.
    pub(crate) fn new(limit: u64) -> Capture {
        let header = PcapHeader {
            version_major: 2,
            version_minor: 4,
            ts_correction: 0,
            ts_accuracy: 0,
            snaplen: 65535,
            datalink: DataLink::RAW,
            ts_resolution: TsResolution::NanoSecond,
            endianness: Endianness::Little,
        };
        let writer = PcapWriter::with_header(Vec::new(), header)
            .expect("writing a pcap header to memory cannot fail");
        Capture {
            writer,
            limit,
            directions: BTreeMap::new(),
            ip_id: 0,
            bytes: 24,
            packets: 0,
            left_out: 0,
        }
    }

    /// The file's bytes.
    pub(crate) fn into_bytes(self) -> Vec<u8> {
        self.writer.into_writer()
    }

    /// A message delivered on association `direction.0` to its end `direction.1`, from `from`
    /// to `to`.
    pub(crate) fn association_message(
        &mut self,
        at: Duration,
        direction: (u64, usize),
        from: SocketAddr,
        to: SocketAddr,
        ppid: u32,
        data: &[u8],
    ) {
        let (assoc, side) = direction;
        let d = self.directions.entry(direction).or_insert_with(|| {
            // A stable non-zero tag per association direction (RFC 9260 §5.3.1: never 0).
            let tag = mix(assoc.wrapping_mul(2).wrapping_add(side as u64)) | 1;
            Direction {
                tag,
                tsn: tag,
                ssn: 0,
            }
        });
        let pieces: Vec<&[u8]> = if data.is_empty() {
            vec![data]
        } else {
            data.chunks(MAX_CHUNK_DATA).collect()
        };
        let n = pieces.len();
        let ssn = d.ssn;
        d.ssn = d.ssn.wrapping_add(1);
        let tag = d.tag;
        let mut packets = Vec::with_capacity(n);
        for (i, piece) in pieces.into_iter().enumerate() {
            let tsn = d.tsn;
            d.tsn = d.tsn.wrapping_add(1);
            let flags = (u8::from(i == 0) << 1) | u8::from(i + 1 == n);
            let mut sctp = Vec::with_capacity(12 + 16 + piece.len() + 3);
            sctp.extend_from_slice(&from.port().to_be_bytes());
            sctp.extend_from_slice(&to.port().to_be_bytes());
            sctp.extend_from_slice(&tag.to_be_bytes());
            sctp.extend_from_slice(&[0; 4]);
            // DATA chunk (RFC 9260 §3.3.1): type 0, flags U=0 B E, length without padding.
            sctp.push(0);
            sctp.push(flags);
            sctp.extend_from_slice(&((16 + piece.len()) as u16).to_be_bytes());
            sctp.extend_from_slice(&tsn.to_be_bytes());
            sctp.extend_from_slice(&0u16.to_be_bytes());
            sctp.extend_from_slice(&ssn.to_be_bytes());
            sctp.extend_from_slice(&ppid.to_be_bytes());
            sctp.extend_from_slice(piece);
            while sctp.len() % 4 != 0 {
                sctp.push(0);
            }
            // RFC 9260 Appendix A: CRC32c over the packet with the field zero, sent so that
            // its least significant byte comes first.
            let crc = CRC32C.checksum(&sctp);
            sctp[8..12].copy_from_slice(&crc.to_le_bytes());
            packets.push(sctp);
        }
        for sctp in packets {
            self.ip_packet(at, from, to, 132, 64, &sctp);
        }
    }

    /// A message delivered on TCP-mapped association `direction.0` to its end `direction.1`:
    /// one TCP segment (PSH, ACK) holding one frame of the mapping (`docs/tcp-mapping.md`:
    /// marker 0xE1, type DATA, stream 0, the PPID, the length), sequence numbers counting the
    /// bytes of each direction, the acknowledgement the bytes of the other direction delivered
    /// so far, and a correct checksum; the connection's first message is preceded by its
    /// three-way handshake (SYN, SYN-ACK, ACK). A message that does not fit one IPv4 packet is split
    /// over several segments (a capture with segmentation offload shows large segments, so
    /// messages up to 64 KiB stay in one).
    pub(crate) fn tcp_message(
        &mut self,
        at: Duration,
        direction: (u64, usize),
        from: SocketAddr,
        to: SocketAddr,
        ppid: u32,
        data: &[u8],
    ) {
        let (assoc, side) = direction;
        let mut stream = Vec::with_capacity(12 + data.len());
        stream.extend_from_slice(&[0xE1, 0, 0, 0]);
        stream.extend_from_slice(&ppid.to_be_bytes());
        stream.extend_from_slice(&(data.len() as u32).to_be_bytes());
        stream.extend_from_slice(data);
        let isn = |side: usize| mix(assoc.wrapping_mul(2).wrapping_add(side as u64) ^ 0x7c9);
        if !self.directions.contains_key(&direction)
            && !self.directions.contains_key(&(assoc, 1 - side))
        {
            // The connection's first packet in the file: its three-way handshake first, so that
            // tools tell it from an earlier connection between the same ports. The initiator
            // is the association's end 0; messages to end 1 go from it.
            let (client, server) = if side == 1 { (from, to) } else { (to, from) };
            let (c_isn, s_isn) = (isn(1), isn(0));
            self.tcp_segment(at, client, server, c_isn, 0, 0x02, &[]);
            self.tcp_segment(at, server, client, s_isn, c_isn.wrapping_add(1), 0x12, &[]);
            self.tcp_segment(
                at,
                client,
                server,
                c_isn.wrapping_add(1),
                s_isn.wrapping_add(1),
                0x10,
                &[],
            );
            for (s, i) in [(1, c_isn), (0, s_isn)] {
                let next = i.wrapping_add(1);
                self.directions.insert(
                    (assoc, s),
                    Direction {
                        tag: i,
                        tsn: next,
                        ssn: 0,
                    },
                );
            }
        }
        let ack = self.directions.get(&(assoc, 1 - side)).map_or(0, |d| d.tsn);
        let d = self.directions.get_mut(&direction).expect("set up above");
        let mut pieces = Vec::new();
        for piece in stream.chunks(MAX_TCP_SEGMENT) {
            pieces.push((d.tsn, piece.to_vec()));
            d.tsn = d.tsn.wrapping_add(piece.len() as u32);
        }
        for (seq, piece) in pieces {
            self.tcp_segment(at, from, to, seq, ack, 0x18, &piece);
        }
    }

    /// One TCP segment (RFC 9293 §3.1: 20-byte header, no options, window 65535) with a correct
    /// checksum.
    #[allow(clippy::too_many_arguments)]
    fn tcp_segment(
        &mut self,
        at: Duration,
        from: SocketAddr,
        to: SocketAddr,
        seq: u32,
        ack: u32,
        flags: u8,
        payload: &[u8],
    ) {
        let mut tcp = Vec::with_capacity(20 + payload.len());
        tcp.extend_from_slice(&from.port().to_be_bytes());
        tcp.extend_from_slice(&to.port().to_be_bytes());
        tcp.extend_from_slice(&seq.to_be_bytes());
        tcp.extend_from_slice(&ack.to_be_bytes());
        tcp.extend_from_slice(&[5 << 4, flags]);
        tcp.extend_from_slice(&0xffffu16.to_be_bytes());
        tcp.extend_from_slice(&[0, 0, 0, 0]);
        tcp.extend_from_slice(payload);
        let (IpAddr::V4(s), IpAddr::V4(t)) = (from.ip(), to.ip()) else {
            self.left_out += 1;
            return;
        };
        let mut pseudo = Vec::with_capacity(12);
        pseudo.extend_from_slice(&s.octets());
        pseudo.extend_from_slice(&t.octets());
        pseudo.extend_from_slice(&[0, 6]);
        pseudo.extend_from_slice(&(tcp.len() as u16).to_be_bytes());
        let sum = ones_complement_sum(&tcp, ones_complement_sum(&pseudo, 0));
        let c = !fold(sum);
        tcp[16..18].copy_from_slice(&c.to_be_bytes());
        self.ip_packet(at, from, to, 6, 64, &tcp);
    }

    /// A multicast datagram from `from` to `group`, as one receiver got it.
    pub(crate) fn datagram(
        &mut self,
        at: Duration,
        from: SocketAddr,
        group: SocketAddr,
        data: &[u8],
    ) {
        let len = 8 + data.len();
        let Ok(len16) = u16::try_from(len) else {
            self.left_out += 1;
            return;
        };
        let mut udp = Vec::with_capacity(len);
        udp.extend_from_slice(&from.port().to_be_bytes());
        udp.extend_from_slice(&group.port().to_be_bytes());
        udp.extend_from_slice(&len16.to_be_bytes());
        udp.extend_from_slice(&[0; 2]);
        udp.extend_from_slice(data);
        // RFC 768: the one's complement sum over the pseudo-header and the datagram.
        let (IpAddr::V4(s), IpAddr::V4(d)) = (from.ip(), group.ip()) else {
            self.left_out += 1;
            return;
        };
        let mut pseudo = Vec::with_capacity(12);
        pseudo.extend_from_slice(&s.octets());
        pseudo.extend_from_slice(&d.octets());
        pseudo.extend_from_slice(&[0, 17]);
        pseudo.extend_from_slice(&len16.to_be_bytes());
        let mut sum = ones_complement_sum(&pseudo, 0);
        sum = ones_complement_sum(&udp, sum);
        let mut c = !fold(sum);
        if c == 0 {
            c = 0xffff;
        }
        udp[6..8].copy_from_slice(&c.to_be_bytes());
        self.ip_packet(at, from, group, 17, 1, &udp);
    }

    /// Wraps `payload` in an IPv4 header (RFC 791) and writes it, unless the file is full.
    fn ip_packet(
        &mut self,
        at: Duration,
        from: SocketAddr,
        to: SocketAddr,
        protocol: u8,
        ttl: u8,
        payload: &[u8],
    ) {
        let (IpAddr::V4(s), IpAddr::V4(d)) = (from.ip(), to.ip()) else {
            self.left_out += 1;
            return;
        };
        let total = 20 + payload.len();
        let Ok(total16) = u16::try_from(total) else {
            self.left_out += 1;
            return;
        };
        if self.bytes + 16 + total as u64 > self.limit {
            self.left_out += 1;
            return;
        }
        self.ip_id = self.ip_id.wrapping_add(1);
        let mut ip = Vec::with_capacity(total);
        ip.extend_from_slice(&[0x45, 0]);
        ip.extend_from_slice(&total16.to_be_bytes());
        ip.extend_from_slice(&self.ip_id.to_be_bytes());
        ip.extend_from_slice(&0x4000u16.to_be_bytes()); // DF, no fragments
        ip.extend_from_slice(&[ttl, protocol, 0, 0]);
        ip.extend_from_slice(&s.octets());
        ip.extend_from_slice(&d.octets());
        let c = !fold(ones_complement_sum(&ip, 0));
        ip[10..12].copy_from_slice(&c.to_be_bytes());
        ip.extend_from_slice(payload);
        let packet = PcapPacket::new(at, total as u32, &ip);
        if self.writer.write_packet(&packet).is_ok() {
            self.bytes += 16 + total as u64;
            self.packets += 1;
        } else {
            // Only a timestamp past 2106 can fail here.
            self.left_out += 1;
        }
    }
}

fn ones_complement_sum(bytes: &[u8], mut sum: u32) -> u32 {
    for pair in bytes.chunks(2) {
        let word = u16::from_be_bytes([pair[0], pair.get(1).copied().unwrap_or(0)]);
        sum += u32::from(word);
        sum = (sum & 0xffff) + (sum >> 16);
    }
    sum
}

fn fold(mut sum: u32) -> u16 {
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    sum as u16
}

fn mix(mut x: u64) -> u32 {
    // splitmix64's finaliser: a stable, well-spread function of the association.
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    (x ^ (x >> 31)) as u32
}

#[cfg(test)]
mod tests {
    use super::*;
    use rserpool_wire::capture::{read_pcap, CapturedTransport};

    fn addr(s: &str) -> SocketAddr {
        s.parse().expect("address")
    }

    #[test]
    fn long_messages_are_fragmented_and_reassemble() {
        let mut c = Capture::new(u64::MAX);
        let long: Vec<u8> = (0..4000u32).map(|i| i as u8).collect();
        let (from, to) = (addr("10.0.0.1:9901"), addr("10.0.0.2:9901"));
        c.association_message(Duration::from_millis(5), (7, 1), from, to, 12, &long);
        c.association_message(Duration::from_millis(6), (7, 1), from, to, 12, b"short");
        assert_eq!(c.packets, 4, "4000 bytes take 3 packets, then one");
        let file = c.into_bytes();
        let m = read_pcap(&file).expect("readable");
        assert_eq!(m.len(), 2);
        assert_eq!(m[0].bytes, long);
        assert_eq!(m[0].frame, 3);
        assert_eq!(m[1].bytes, b"short");
        assert_eq!(m[1].time, Duration::from_millis(6));
        assert_eq!(
            m[1].transport,
            CapturedTransport::Sctp {
                stream: 0,
                ppid: 12
            }
        );
        assert_eq!((m[1].source, m[1].destination), (from, to));
    }

    #[test]
    fn checksums_are_right() {
        // CRC32c of "123456789" is 0xe3069283 (RFC 9260 Appendix A's algorithm).
        assert_eq!(CRC32C.checksum(b"123456789"), 0xe306_9283);
        let mut c = Capture::new(u64::MAX);
        c.datagram(Duration::ZERO, addr("10.0.0.1:9901"), ENRP_GROUP, b"abc");
        let file = c.into_bytes();
        let ip = &file[24 + 16..];
        // A correct IPv4 header and UDP datagram sum to 0xffff with their checksums in.
        assert_eq!(fold(ones_complement_sum(&ip[..20], 0)), 0xffff);
        let mut pseudo = Vec::new();
        pseudo.extend_from_slice(&ip[12..20]);
        pseudo.extend_from_slice(&[0, 17, 0, 11]);
        let sum = ones_complement_sum(&ip[20..], ones_complement_sum(&pseudo, 0));
        assert_eq!(fold(sum), 0xffff);
    }
}
