//! Identifiers and small values shared by ASAP and ENRP: protocol, message and parameter types.

use std::fmt;

/// Which of the two RSerPool protocols a message belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Protocol {
    /// Aggregate Server Access Protocol (RFC 5352), SCTP PPID 11.
    Asap,
    /// Endpoint haNdlespace Redundancy Protocol (RFC 5353), SCTP PPID 12.
    Enrp,
}

impl Protocol {
    /// The SCTP payload protocol identifier assigned by IANA (RFC 5352 §6, RFC 5353 §5).
    pub const fn ppid(self) -> u32 {
        match self {
            Protocol::Asap => 11,
            Protocol::Enrp => 12,
        }
    }

    /// The protocol that uses the given SCTP payload protocol identifier, if any.
    pub const fn from_ppid(ppid: u32) -> Option<Protocol> {
        match ppid {
            11 => Some(Protocol::Asap),
            12 => Some(Protocol::Enrp),
            _ => None,
        }
    }

    /// The well-known port (SCTP, TCP and UDP) of the protocol.
    pub const fn well_known_port(self) -> u16 {
        match self {
            Protocol::Asap => 3863,
            Protocol::Enrp => 9901,
        }
    }

    /// Name of a message type of this protocol, as the RFC spells it (`None` if unknown).
    pub fn message_name(self, message_type: u8) -> Option<&'static str> {
        match self {
            Protocol::Asap => crate::asap::AsapMessageType::from_u8(message_type).map(|t| t.name()),
            Protocol::Enrp => crate::enrp::EnrpMessageType::from_u8(message_type).map(|t| t.name()),
        }
    }
}

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Protocol::Asap => "ASAP",
            Protocol::Enrp => "ENRP",
        })
    }
}

/// What a receiver does with a message or parameter type it does not know: the two top bits of
/// the type field (RFC 5354 §4 for messages, RFC 5354 §2 for parameters).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum UnrecognizedAction {
    /// `00`: stop processing and discard the message silently.
    Discard,
    /// `01`: stop, discard the message and report the unrecognized type in an Operation Error.
    DiscardAndReport,
    /// `10`: skip this parameter and go on with the rest of the message.
    Skip,
    /// `11`: skip this parameter, go on, and report it in an Operation Error.
    SkipAndReport,
}

impl UnrecognizedAction {
    /// Whether the sender asked to be told about the unrecognized type.
    pub const fn report(self) -> bool {
        matches!(
            self,
            UnrecognizedAction::DiscardAndReport | UnrecognizedAction::SkipAndReport
        )
    }

    /// Whether processing continues after the unrecognized type.
    pub const fn skips(self) -> bool {
        matches!(
            self,
            UnrecognizedAction::Skip | UnrecognizedAction::SkipAndReport
        )
    }
}

/// Type of a TLV parameter (RFC 5354 §3), including its two action bits.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ParameterType(pub u16);

impl ParameterType {
    /// IPv4 Address (RFC 5354 §3.1).
    pub const IPV4_ADDRESS: Self = Self(0x0001);
    /// IPv6 Address (RFC 5354 §3.2).
    pub const IPV6_ADDRESS: Self = Self(0x0002);
    /// DCCP Transport (RFC 5354 §3.3).
    pub const DCCP_TRANSPORT: Self = Self(0x0003);
    /// SCTP Transport (RFC 5354 §3.4).
    pub const SCTP_TRANSPORT: Self = Self(0x0004);
    /// TCP Transport (RFC 5354 §3.5).
    pub const TCP_TRANSPORT: Self = Self(0x0005);
    /// UDP Transport (RFC 5354 §3.6).
    pub const UDP_TRANSPORT: Self = Self(0x0006);
    /// UDP-Lite Transport (RFC 5354 §3.7).
    pub const UDP_LITE_TRANSPORT: Self = Self(0x0007);
    /// Pool Member Selection Policy (RFC 5354 §3.8).
    pub const POOL_MEMBER_SELECTION_POLICY: Self = Self(0x0008);
    /// Pool Handle (RFC 5354 §3.9).
    pub const POOL_HANDLE: Self = Self(0x0009);
    /// Pool Element (RFC 5354 §3.10).
    pub const POOL_ELEMENT: Self = Self(0x000a);
    /// Server Information (RFC 5354 §3.11).
    pub const SERVER_INFORMATION: Self = Self(0x000b);
    /// Operation Error (RFC 5354 §3.12).
    pub const OPERATION_ERROR: Self = Self(0x000c);
    /// Cookie (RFC 5354 §3.13).
    pub const COOKIE: Self = Self(0x000d);
    /// PE Identifier (RFC 5354 §3.14).
    pub const PE_IDENTIFIER: Self = Self(0x000e);
    /// PE Checksum (RFC 5354 §3.15).
    pub const PE_CHECKSUM: Self = Self(0x000f);
    /// Opaque Transport (RFC 5354 §3.16).
    pub const OPAQUE_TRANSPORT: Self = Self(0x0010);
    /// Handle Resolution option (draft-dreibholz-rserpool-asap-hropt): type 0x3f, action `10`.
    pub const HANDLE_RESOLUTION: Self = Self(0x803f);

    /// What to do with this type when it is not recognized.
    pub const fn action(self) -> UnrecognizedAction {
        match self.0 >> 14 {
            0 => UnrecognizedAction::Discard,
            1 => UnrecognizedAction::DiscardAndReport,
            2 => UnrecognizedAction::Skip,
            _ => UnrecognizedAction::SkipAndReport,
        }
    }

    /// The parameter's name as RFC 5354 spells it, if the type is known.
    pub const fn name(self) -> Option<&'static str> {
        Some(match self.0 {
            0x0001 => "IPv4 Address",
            0x0002 => "IPv6 Address",
            0x0003 => "DCCP Transport",
            0x0004 => "SCTP Transport",
            0x0005 => "TCP Transport",
            0x0006 => "UDP Transport",
            0x0007 => "UDP-Lite Transport",
            0x0008 => "Pool Member Selection Policy",
            0x0009 => "Pool Handle",
            0x000a => "Pool Element",
            0x000b => "Server Information",
            0x000c => "Operation Error",
            0x000d => "Cookie",
            0x000e => "PE Identifier",
            0x000f => "PE Checksum",
            0x0010 => "Opaque Transport",
            0x803f => "Handle Resolution",
            _ => return None,
        })
    }
}

impl fmt::Display for ParameterType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(name) => write!(f, "{name} parameter"),
            None => write!(f, "parameter type {:#06x}", self.0),
        }
    }
}

impl fmt::Debug for ParameterType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(name) => write!(f, "ParameterType({:#06x} {name})", self.0),
            None => write!(f, "ParameterType({:#06x})", self.0),
        }
    }
}

/// Pool Element Identifier: a PE's 32-bit number, unique within its pool (RFC 5351 §3.2).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct PoolElementId(pub u32);

/// Registrar (ENRP server) identifier: a registrar's 32-bit number within the operation scope.
/// Zero means "unknown" in a Pool Element's Home ENRP Server Identifier and "all" (multicast) as
/// an ENRP Receiver Server's ID.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct RegistrarId(pub u32);

impl RegistrarId {
    /// The identifier that stands for "none" or "unknown" (0).
    pub const UNKNOWN: RegistrarId = RegistrarId(0);
}

macro_rules! dollar_hex {
    ($t:ty) => {
        impl fmt::Display for $t {
            /// Formats as `$xxxxxxxx`, the notation RSPLIB's tools print.
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "${:08x}", self.0)
            }
        }
        impl fmt::Debug for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "${:08x}", self.0)
            }
        }
    };
}
dollar_hex!(PoolElementId);
dollar_hex!(RegistrarId);

/// A pool handle: the opaque name of a pool (RFC 5354 §3.9).
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct PoolHandle(Vec<u8>);

impl PoolHandle {
    /// A pool handle made of the given bytes.
    pub fn new(bytes: impl Into<Vec<u8>>) -> Self {
        PoolHandle(bytes.into())
    }

    /// The handle's bytes as carried on the wire.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether the handle is empty (never valid on the wire).
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// Pool handles order, compare and hash as their bytes do, so maps keyed by them can be
/// searched with bytes borrowed from a message.
impl std::borrow::Borrow<[u8]> for PoolHandle {
    fn borrow(&self) -> &[u8] {
        &self.0
    }
}

impl From<&str> for PoolHandle {
    fn from(s: &str) -> Self {
        PoolHandle(s.as_bytes().to_vec())
    }
}

impl From<&[u8]> for PoolHandle {
    fn from(s: &[u8]) -> Self {
        PoolHandle(s.to_vec())
    }
}

impl fmt::Display for PoolHandle {
    /// Printable ASCII as is, any other byte as `\xNN`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for &b in &self.0 {
            if (0x20..0x7f).contains(&b) && b != b'\\' {
                write!(f, "{}", b as char)?;
            } else {
                write!(f, "\\x{b:02x}")?;
            }
        }
        Ok(())
    }
}

impl fmt::Debug for PoolHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PoolHandle(\"{self}\")")
    }
}

/// Number of PEs a pool user asks for in a handle resolution (Handle Resolution option).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct HandleResolutionOption {
    /// Items wanted; [`HandleResolutionOption::ALL`] asks for every PE of the pool.
    pub items: u32,
}

impl HandleResolutionOption {
    /// The Items value that asks for all PEs (0xffffffff).
    pub const ALL: u32 = u32::MAX;
}

/// PE Checksum (RFC 5354 §3.15): the Internet checksum over a registrar's own PEs (RFC 5353 §3.6.2).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct PeChecksum(pub u16);

impl fmt::Debug for PeChecksum {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PeChecksum({:#06x})", self.0)
    }
}
