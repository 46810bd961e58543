//! The Component Status Protocol (CSP) of RSPLIB: one UDP datagram per status report, sent by
//! registrars, pool elements and pool users to a monitor (RSPLIB's `cspmonitor`, or
//! `rserpool monitor`) every report interval, and once more with the FINAL flag on shutdown.
//!
//! CSP is not an RFC; the layout is RSPLIB's (`componentstatuspackets.h`, version 0x0200), all
//! fields in network byte order:
//!
//! ```text
//!  0       1       2               4                               8
//! +-------+-------+---------------+-------------------------------+
//! | Type  | Flags |    Length     |            Version            |
//! +-------+-------+---------------+-------------------------------+
//! |                           SenderID                            |   8
//! +---------------------------------------------------------------+
//! |                        SenderTimeStamp (µs)                   |  16
//! +-------------------------------+-------------------------------+
//! |     ReportInterval (µs)       |  Location: char[128] ...      |  24, 28
//! +-------------------------------+-------------------------------+
//! |  ... Status: char[128] (at 156) ...   | Workload | Assocs     |  284, 286
//! +---------------------------------------------------------------+
//! |  Associations × 24: ReceiverID u64, Duration u64 (µs),        | 288
//! |                     Flags u16, ProtocolID u16, PPID u32       |
//! +---------------------------------------------------------------+
//! ```
//!
//! `cspmonitor` accepts a datagram only if its type is 1, its version 0x0200 and its size exactly
//! 288 + 24 × Associations; it does not read the Length field. [`Report::decode`] accepts what
//! `cspmonitor` accepts and refuses the rest with a typed [`CspError`]; [`Report::encode`]
//! writes what `cspmonitor` shows. Decoding never panics and never allocates more than the
//! datagram describes.
//!
//! ```
//! use rserpool_wire::csp::{Association, ComponentId, Report, Workload};
//! use rserpool_wire::RegistrarId;
//!
//! let mut r = Report::new(ComponentId::registrar(RegistrarId(0x1deea448)));
//! r.status = "2[2] PEs in 1 Pool, 0 Peers".into();
//! r.interval_us = 1_000_000;
//! let bytes = r.encode().unwrap();
//! assert_eq!(bytes.len(), 288);
//! assert_eq!(Report::decode(&bytes).unwrap(), r);
//! ```

use crate::types::{PoolElementId, RegistrarId};
use std::fmt;

/// The UDP port a CSP monitor listens on by default (`cspmonitor`'s).
pub const CSP_PORT: u16 = 2960;
/// The protocol version this layout has (`CSP_VERSION`).
pub const CSP_VERSION: u32 = 0x0000_0200;
/// The only message type: a status report (`CSPT_REPORT`).
pub const REPORT_TYPE: u8 = 0x01;
/// Flags bit 0: the reporter is shutting down; the monitor forgets it at once (`CSPF_FINAL`).
pub const FLAG_FINAL: u8 = 0x01;
/// Size of the common header: type, flags, length, version, sender ID, sender time stamp.
pub const HEADER_LEN: usize = 24;
/// Size of the location and of the status text fields, NUL-padded.
pub const TEXT_LEN: usize = 128;
/// Size of a report without associations.
pub const FIXED_LEN: usize = 288;
/// Size of one association entry.
pub const ASSOCIATION_LEN: usize = 24;
/// Most associations one report can carry: the 16-bit Length field bounds the datagram.
pub const MAX_ASSOCIATIONS: usize = (u16::MAX as usize - FIXED_LEN) / ASSOCIATION_LEN;
/// IANA protocol number of SCTP, as association entries carry it.
pub const PROTOCOL_SCTP: u16 = 132;
/// IANA protocol number of TCP (our TCP mapping of ASAP and ENRP).
pub const PROTOCOL_TCP: u16 = 6;

// Field offsets, named once.
const TYPE: usize = 0;
const FLAGS: usize = 1;
const LENGTH: usize = 2;
const VERSION: usize = 4;
const SENDER_ID: usize = 8;
const SENDER_TIMESTAMP: usize = 16;
const REPORT_INTERVAL: usize = 24;
const LOCATION: usize = 28;
const STATUS: usize = LOCATION + TEXT_LEN;
const WORKLOAD: usize = STATUS + TEXT_LEN;
const ASSOCIATIONS: usize = WORKLOAD + 2;

/// The kind of component a [`ComponentId`] names: the top byte of the ID.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ComponentGroup {
    /// 1: a registrar (PR); the object is its registrar ID.
    Registrar,
    /// 2: a pool element; the object is its PE ID.
    PoolElement,
    /// 3: a pool user; the object is random.
    PoolUser,
    /// Any other group byte (shown, never produced by RSPLIB).
    Other(u8),
}

impl ComponentGroup {
    /// The group byte on the wire.
    pub fn byte(self) -> u8 {
        match self {
            ComponentGroup::Registrar => 1,
            ComponentGroup::PoolElement => 2,
            ComponentGroup::PoolUser => 3,
            ComponentGroup::Other(b) => b,
        }
    }

    /// The group of a byte.
    pub fn from_byte(b: u8) -> Self {
        match b {
            1 => ComponentGroup::Registrar,
            2 => ComponentGroup::PoolElement,
            3 => ComponentGroup::PoolUser,
            other => ComponentGroup::Other(other),
        }
    }
}

/// A 64-bit CSP component ID: the group in the top byte, the object in the low 56 bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ComponentId(pub u64);

impl ComponentId {
    /// Mask of the object part.
    pub const OBJECT_MASK: u64 = (1 << 56) - 1;

    /// The ID of `object` (its low 56 bits) in `group`.
    pub fn new(group: ComponentGroup, object: u64) -> Self {
        ComponentId((u64::from(group.byte()) << 56) | (object & Self::OBJECT_MASK))
    }

    /// A registrar's ID (group 1, its registrar ID).
    pub fn registrar(id: RegistrarId) -> Self {
        Self::new(ComponentGroup::Registrar, u64::from(id.0))
    }

    /// A pool element's ID (group 2, its PE ID).
    pub fn pool_element(id: PoolElementId) -> Self {
        Self::new(ComponentGroup::PoolElement, u64::from(id.0))
    }

    /// A pool user's ID (group 3, a random object).
    pub fn pool_user(object: u64) -> Self {
        Self::new(ComponentGroup::PoolUser, object)
    }

    /// The group (top byte).
    pub fn group(self) -> ComponentGroup {
        ComponentGroup::from_byte((self.0 >> 56) as u8)
    }

    /// The object (low 56 bits). RSPLIB sends no report while it is 0.
    pub fn object(self) -> u64 {
        self.0 & Self::OBJECT_MASK
    }
}

impl fmt::Display for ComponentId {
    /// As `cspmonitor` names components: `PR $1deea448`, `PE $0000002a`, `PU $00123456789abc`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.group() {
            ComponentGroup::Registrar => write!(f, "PR ${:08x}", self.object()),
            ComponentGroup::PoolElement => write!(f, "PE ${:08x}", self.object()),
            ComponentGroup::PoolUser => write!(f, "PU ${:014x}", self.object()),
            ComponentGroup::Other(g) => write!(f, "ID {g}:${:014x}", self.object()),
        }
    }
}

/// A component's workload as CSP carries it: `0xFFFF` for "not available", otherwise
/// round(load × 0xFFFE).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Workload(pub u16);

impl Workload {
    /// No workload to report (registrars; PEs whose policy does not use load).
    pub const UNKNOWN: Workload = Workload(0xFFFF);

    /// The workload of a load fraction; values outside 0..=1 are clamped, NaN is unknown.
    pub fn from_fraction(load: f64) -> Self {
        if load.is_nan() {
            return Self::UNKNOWN;
        }
        Workload((load.clamp(0.0, 1.0) * 65534.0).round() as u16)
    }

    /// The load fraction, or `None` when not available.
    pub fn fraction(self) -> Option<f64> {
        (self != Self::UNKNOWN).then(|| f64::from(self.0) / 65534.0)
    }
}

/// One association a component reports: to a registrar (ASAP or ENRP) or to a PE (a session).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Association {
    /// The component at the other end.
    pub receiver: ComponentId,
    /// How long it has been up, in µs; `None` when unknown (all ones on the wire). A duration
    /// of `u64::MAX` µs is sent as `u64::MAX − 1`.
    pub duration_us: Option<u64>,
    /// Flags (RSPLIB sends 0).
    pub flags: u16,
    /// The transport's IANA protocol number ([`PROTOCOL_SCTP`], [`PROTOCOL_TCP`]).
    pub protocol: u16,
    /// The payload protocol identifier (11 ASAP, 12 ENRP, the service's for sessions).
    pub ppid: u32,
}

/// A CSP status report.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Report {
    /// Header flags; bit 0 is [`FLAG_FINAL`]. Other bits are kept as received.
    pub flags: u8,
    /// Who reports.
    pub sender: ComponentId,
    /// µs since the reporter started (the monitor shows it as the uptime).
    pub timestamp_us: u64,
    /// The report interval, in µs (the monitor forgets a component after 10 intervals without
    /// a report).
    pub interval_us: u32,
    /// Where the component runs: "hostname: addr, addr" (at most 127 bytes are sent; longer
    /// text is cut at a character boundary).
    pub location: String,
    /// The status line (at most 127 bytes are sent, as for `location`).
    pub status: String,
    /// The load, or [`Workload::UNKNOWN`].
    pub workload: Workload,
    /// The component's associations (at most [`MAX_ASSOCIATIONS`]).
    pub associations: Vec<Association>,
}

/// Why a datagram is not a CSP report `cspmonitor` would show, or a report cannot be sent.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CspError {
    /// Shorter than the fixed part of a report.
    #[error("CSP report truncated: {available} bytes, a report has at least {needed}")]
    Truncated {
        /// Bytes a report needs at least.
        needed: usize,
        /// Bytes received.
        available: usize,
    },
    /// The Type field is not 1 (Report).
    #[error("CSP Type {0:#04x} is not Report (0x01)")]
    UnknownType(u8),
    /// The Version field is not 0x0200.
    #[error("CSP Version {0:#010x} is not 0x00000200")]
    UnsupportedVersion(u32),
    /// The datagram's size is not 288 + 24 × Associations.
    #[error("CSP report of {actual} bytes, but its Associations field ({associations}) makes it {expected} bytes")]
    SizeMismatch {
        /// The Associations field.
        associations: u16,
        /// The size that field implies.
        expected: usize,
        /// The datagram's size.
        actual: usize,
    },
    /// More associations than one datagram carries.
    #[error("CSP report with {count} associations; at most {limit} fit a report")]
    TooManyAssociations {
        /// Associations given.
        count: usize,
        /// [`MAX_ASSOCIATIONS`].
        limit: usize,
    },
}

fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn be64(b: &[u8], at: usize) -> u64 {
    let mut x = [0u8; 8];
    x.copy_from_slice(&b[at..at + 8]);
    u64::from_be_bytes(x)
}

/// A NUL-padded text field: the bytes before the first NUL, at most 127 (`cspmonitor` ends the
/// text at byte 127 whatever it holds), invalid UTF-8 replaced.
fn text(field: &[u8]) -> String {
    let field = &field[..TEXT_LEN - 1];
    let end = field.iter().position(|&c| c == 0).unwrap_or(field.len());
    String::from_utf8_lossy(&field[..end]).into_owned()
}

/// The longest prefix of `s` of at most `TEXT_LEN - 1` bytes ending at a character boundary
/// and holding no NUL (which would end the field early).
fn clip(s: &str) -> &str {
    let s = s.split('\0').next().unwrap_or("");
    let mut end = s.len().min(TEXT_LEN - 1);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

impl Report {
    /// An empty report from `sender`: no flags, no text, workload unknown, no associations.
    pub fn new(sender: ComponentId) -> Self {
        Report {
            flags: 0,
            sender,
            timestamp_us: 0,
            interval_us: 0,
            location: String::new(),
            status: String::new(),
            workload: Workload::UNKNOWN,
            associations: Vec::new(),
        }
    }

    /// Whether this is the reporter's last report.
    pub fn is_final(&self) -> bool {
        self.flags & FLAG_FINAL != 0
    }

    /// The size of this report on the wire.
    pub fn encoded_len(&self) -> usize {
        FIXED_LEN + ASSOCIATION_LEN * self.associations.len()
    }

    /// Reads a datagram as `cspmonitor` does: type 1, version 0x0200, size exactly
    /// 288 + 24 × Associations (the Length field is not checked, as `cspmonitor` does not).
    pub fn decode(b: &[u8]) -> Result<Report, CspError> {
        if b.len() < FIXED_LEN {
            return Err(CspError::Truncated {
                needed: FIXED_LEN,
                available: b.len(),
            });
        }
        if b[TYPE] != REPORT_TYPE {
            return Err(CspError::UnknownType(b[TYPE]));
        }
        let version = be32(b, VERSION);
        if version != CSP_VERSION {
            return Err(CspError::UnsupportedVersion(version));
        }
        let n = be16(b, ASSOCIATIONS);
        let expected = FIXED_LEN + ASSOCIATION_LEN * usize::from(n);
        if b.len() != expected {
            return Err(CspError::SizeMismatch {
                associations: n,
                expected,
                actual: b.len(),
            });
        }
        let associations = b[FIXED_LEN..]
            .chunks_exact(ASSOCIATION_LEN)
            .map(|a| {
                let duration = be64(a, 8);
                Association {
                    receiver: ComponentId(be64(a, 0)),
                    duration_us: (duration != u64::MAX).then_some(duration),
                    flags: be16(a, 16),
                    protocol: be16(a, 18),
                    ppid: be32(a, 20),
                }
            })
            .collect();
        Ok(Report {
            flags: b[FLAGS],
            sender: ComponentId(be64(b, SENDER_ID)),
            timestamp_us: be64(b, SENDER_TIMESTAMP),
            interval_us: be32(b, REPORT_INTERVAL),
            location: text(&b[LOCATION..LOCATION + TEXT_LEN]),
            status: text(&b[STATUS..STATUS + TEXT_LEN]),
            workload: Workload(be16(b, WORKLOAD)),
            associations,
        })
    }

    /// The datagram of this report. Texts longer than 127 bytes are cut (at a character
    /// boundary, and at a NUL), as RSPLIB's reporter cuts them.
    pub fn encode(&self) -> Result<Vec<u8>, CspError> {
        if self.associations.len() > MAX_ASSOCIATIONS {
            return Err(CspError::TooManyAssociations {
                count: self.associations.len(),
                limit: MAX_ASSOCIATIONS,
            });
        }
        let len = self.encoded_len();
        let mut b = vec![0u8; len];
        b[TYPE] = REPORT_TYPE;
        b[FLAGS] = self.flags;
        // Fits: at most MAX_ASSOCIATIONS entries.
        b[LENGTH..LENGTH + 2].copy_from_slice(&(len as u16).to_be_bytes());
        b[VERSION..VERSION + 4].copy_from_slice(&CSP_VERSION.to_be_bytes());
        b[SENDER_ID..SENDER_ID + 8].copy_from_slice(&self.sender.0.to_be_bytes());
        b[SENDER_TIMESTAMP..SENDER_TIMESTAMP + 8].copy_from_slice(&self.timestamp_us.to_be_bytes());
        b[REPORT_INTERVAL..REPORT_INTERVAL + 4].copy_from_slice(&self.interval_us.to_be_bytes());
        let location = clip(&self.location).as_bytes();
        b[LOCATION..LOCATION + location.len()].copy_from_slice(location);
        let status = clip(&self.status).as_bytes();
        b[STATUS..STATUS + status.len()].copy_from_slice(status);
        b[WORKLOAD..WORKLOAD + 2].copy_from_slice(&self.workload.0.to_be_bytes());
        b[ASSOCIATIONS..ASSOCIATIONS + 2]
            .copy_from_slice(&(self.associations.len() as u16).to_be_bytes());
        for (a, out) in self
            .associations
            .iter()
            .zip(b[FIXED_LEN..].chunks_exact_mut(ASSOCIATION_LEN))
        {
            let duration = a.duration_us.map_or(u64::MAX, |d| d.min(u64::MAX - 1));
            out[0..8].copy_from_slice(&a.receiver.0.to_be_bytes());
            out[8..16].copy_from_slice(&duration.to_be_bytes());
            out[16..18].copy_from_slice(&a.flags.to_be_bytes());
            out[18..20].copy_from_slice(&a.protocol.to_be_bytes());
            out[20..24].copy_from_slice(&a.ppid.to_be_bytes());
        }
        Ok(b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A registrar's report with one ENRP peer, written byte by byte from the layout of
    /// RSPLIB's `componentstatuspackets.h` (rsplib-behaviour.md §4).
    fn golden() -> Vec<u8> {
        let mut b = Vec::new();
        b.push(0x01); // Type: Report
        b.push(0x00); // Flags
        b.extend_from_slice(&[0x01, 0x38]); // Length: 312 = 288 + 24
        b.extend_from_slice(&[0x00, 0x00, 0x02, 0x00]); // Version 0x0200
        b.extend_from_slice(&[0x01, 0, 0, 0, 0x1d, 0xee, 0xa4, 0x48]); // PR $1deea448
        b.extend_from_slice(&[0, 0, 0, 0, 0, 0x0f, 0x42, 0x40]); // 1 s since start
        b.extend_from_slice(&[0x00, 0x03, 0xd0, 0x90]); // ReportInterval 250 000 µs
        let mut location = b"host: 127.0.0.1:3863".to_vec();
        location.resize(128, 0);
        b.extend_from_slice(&location);
        let mut status = b"3[2] PEs in 1 Pool, 1 Peer".to_vec();
        status.resize(128, 0);
        b.extend_from_slice(&status);
        b.extend_from_slice(&[0xff, 0xff]); // Workload n/a
        b.extend_from_slice(&[0x00, 0x01]); // 1 association
        b.extend_from_slice(&[0x01, 0, 0, 0, 0x00, 0x00, 0x00, 0x2a]); // PR $0000002a
        b.extend_from_slice(&[0xff; 8]); // Duration unknown
        b.extend_from_slice(&[0x00, 0x00]); // Flags
        b.extend_from_slice(&[0x00, 0x84]); // SCTP
        b.extend_from_slice(&[0x00, 0x00, 0x00, 0x0c]); // PPID 12 (ENRP)
        b
    }

    fn golden_report() -> Report {
        Report {
            flags: 0,
            sender: ComponentId::registrar(RegistrarId(0x1deea448)),
            timestamp_us: 1_000_000,
            interval_us: 250_000,
            location: "host: 127.0.0.1:3863".into(),
            status: "3[2] PEs in 1 Pool, 1 Peer".into(),
            workload: Workload::UNKNOWN,
            associations: vec![Association {
                receiver: ComponentId::registrar(RegistrarId(0x2a)),
                duration_us: None,
                flags: 0,
                protocol: PROTOCOL_SCTP,
                ppid: 12,
            }],
        }
    }

    #[test]
    fn golden_bytes_decode_and_encode_exactly() {
        let bytes = golden();
        assert_eq!(bytes.len(), 312);
        let r = Report::decode(&bytes).unwrap();
        assert_eq!(r, golden_report());
        assert_eq!(r.sender.group(), ComponentGroup::Registrar);
        assert_eq!(r.sender.object(), 0x1deea448);
        assert_eq!(r.sender.to_string(), "PR $1deea448");
        assert_eq!(r.encode().unwrap(), bytes);
    }

    #[test]
    fn ids_and_workload() {
        let pe = ComponentId::pool_element(PoolElementId(0xabcdef01));
        assert_eq!(pe.0, 0x0200_0000_abcd_ef01);
        assert_eq!(pe.to_string(), "PE $abcdef01");
        let pu = ComponentId::pool_user(u64::MAX);
        assert_eq!(pu.group(), ComponentGroup::PoolUser);
        assert_eq!(pu.object(), ComponentId::OBJECT_MASK);
        assert_eq!(pu.to_string(), "PU $ffffffffffffff");
        assert_eq!(Workload::from_fraction(1.0), Workload(0xfffe));
        assert_eq!(Workload::from_fraction(0.5), Workload(0x7fff));
        assert_eq!(Workload::from_fraction(f64::NAN), Workload::UNKNOWN);
        assert_eq!(Workload::UNKNOWN.fraction(), None);
        assert_eq!(Workload(0xfffe).fraction(), Some(1.0));
    }

    #[test]
    fn refuses_what_cspmonitor_refuses() {
        let good = golden();
        assert_eq!(
            Report::decode(&good[..287]),
            Err(CspError::Truncated {
                needed: 288,
                available: 287
            })
        );
        let mut b = good.clone();
        b[0] = 2;
        assert_eq!(Report::decode(&b), Err(CspError::UnknownType(2)));
        let mut b = good.clone();
        b[6] = 1;
        assert_eq!(
            Report::decode(&b),
            Err(CspError::UnsupportedVersion(0x0100))
        );
        let mut b = good.clone();
        b.push(0);
        assert_eq!(
            Report::decode(&b),
            Err(CspError::SizeMismatch {
                associations: 1,
                expected: 312,
                actual: 313
            })
        );
        let mut b = good.clone();
        b[287] = 0xff; // 0x00ff associations in 312 bytes
        assert!(matches!(
            Report::decode(&b),
            Err(CspError::SizeMismatch { .. })
        ));
        // cspmonitor does not read Length: neither do we.
        let mut b = good.clone();
        b[2] = 0;
        assert!(Report::decode(&b).is_ok());
        // Nor the status's 128th byte, which it overwrites with NUL.
        let mut b = good;
        b[156..284].fill(b'x');
        assert_eq!(Report::decode(&b).unwrap().status, "x".repeat(127));
    }

    #[test]
    fn long_texts_are_cut_at_a_character_boundary() {
        let mut r = Report::new(ComponentId::pool_user(7));
        r.status = "é".repeat(100); // 200 bytes
        r.location = "a\0b".into();
        let d = Report::decode(&r.encode().unwrap()).unwrap();
        assert_eq!(
            d.status,
            "é".repeat(63),
            "126 bytes: the 64th é would need 128"
        );
        assert_eq!(d.location, "a");
    }

    #[test]
    fn association_limit() {
        let mut r = Report::new(ComponentId::pool_user(7));
        let a = golden_report().associations[0].clone();
        r.associations = vec![a; MAX_ASSOCIATIONS];
        let b = r.encode().unwrap();
        assert!(b.len() <= usize::from(u16::MAX));
        assert_eq!(
            Report::decode(&b).unwrap().associations.len(),
            MAX_ASSOCIATIONS
        );
        r.associations.push(r.associations[0].clone());
        assert_eq!(
            r.encode(),
            Err(CspError::TooManyAssociations {
                count: MAX_ASSOCIATIONS + 1,
                limit: MAX_ASSOCIATIONS
            })
        );
    }

    fn association() -> impl Strategy<Value = Association> {
        (
            any::<u64>(),
            proptest::option::of(0..u64::MAX),
            any::<u16>(),
            any::<u16>(),
            any::<u32>(),
        )
            .prop_map(
                |(receiver, duration_us, flags, protocol, ppid)| Association {
                    receiver: ComponentId(receiver),
                    duration_us,
                    flags,
                    protocol,
                    ppid,
                },
            )
    }

    fn report() -> impl Strategy<Value = Report> {
        (
            any::<u8>(),
            any::<u64>(),
            any::<u64>(),
            any::<u32>(),
            "[^\0]{0,40}",
            "[^\0]{0,40}",
            any::<u16>(),
            proptest::collection::vec(association(), 0..6),
        )
            .prop_map(
                |(flags, sender, timestamp_us, interval_us, location, status, w, associations)| {
                    Report {
                        flags,
                        sender: ComponentId(sender),
                        timestamp_us,
                        interval_us,
                        location: clip(&location).to_string(),
                        status: clip(&status).to_string(),
                        workload: Workload(w),
                        associations,
                    }
                },
            )
    }

    proptest! {
        #[test]
        fn roundtrip(r in report()) {
            let bytes = r.encode().unwrap();
            prop_assert_eq!(bytes.len(), r.encoded_len());
            prop_assert_eq!(usize::from(be16(&bytes, LENGTH)), bytes.len());
            let d = Report::decode(&bytes).unwrap();
            prop_assert_eq!(&d, &r);
            prop_assert_eq!(d.encode().unwrap(), bytes);
        }

        #[test]
        fn any_bytes_decode_without_panic(b in proptest::collection::vec(any::<u8>(), 0..400)) {
            let _ = Report::decode(&b);
        }

        #[test]
        fn damaged_reports_decode_without_panic(
            r in report(),
            at in any::<usize>(),
            value in any::<u8>(),
            cut in any::<usize>(),
        ) {
            let mut b = r.encode().unwrap();
            let i = at % b.len();
            b[i] = value;
            b.truncate(cut % (b.len() + 1));
            if let Ok(d) = Report::decode(&b) {
                // Texts with invalid UTF-8 come back replaced (and may then be cut); every
                // other field survives.
                let again = Report::decode(&d.encode().unwrap()).unwrap();
                prop_assert_eq!(again.sender, d.sender);
                prop_assert_eq!(again.associations, d.associations);
                prop_assert_eq!(again.workload, d.workload);
            }
        }
    }
}
