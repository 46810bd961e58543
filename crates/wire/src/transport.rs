//! Address and transport parameters (RFC 5354 §3.1–§3.7, §3.16).

use crate::codec::{in_param, Ctx, Tlv, Writer};
use crate::error::{DecodeError, DecodeErrorKind, EncodeError};
use crate::types::ParameterType;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// Transport protocol of a transport parameter, with the fields only that protocol has.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TransportProtocol {
    /// SCTP (0x0004): several addresses (multi-homing).
    Sctp,
    /// TCP (0x0005): one address, data only per the RFC.
    Tcp,
    /// UDP (0x0006): one address, data only.
    Udp,
    /// UDP-Lite (0x0007): one address, data only.
    UdpLite,
    /// DCCP (0x0003): one address and a service code.
    Dccp {
        /// DCCP service code (RFC 4340 §8.1.2).
        service_code: u32,
    },
}

impl TransportProtocol {
    /// The parameter type that carries a transport of this protocol.
    pub const fn parameter_type(self) -> ParameterType {
        match self {
            TransportProtocol::Sctp => ParameterType::SCTP_TRANSPORT,
            TransportProtocol::Tcp => ParameterType::TCP_TRANSPORT,
            TransportProtocol::Udp => ParameterType::UDP_TRANSPORT,
            TransportProtocol::UdpLite => ParameterType::UDP_LITE_TRANSPORT,
            TransportProtocol::Dccp { .. } => ParameterType::DCCP_TRANSPORT,
        }
    }

    /// Short name ("SCTP", "TCP", …).
    pub const fn name(self) -> &'static str {
        match self {
            TransportProtocol::Sctp => "SCTP",
            TransportProtocol::Tcp => "TCP",
            TransportProtocol::Udp => "UDP",
            TransportProtocol::UdpLite => "UDP-Lite",
            TransportProtocol::Dccp { .. } => "DCCP",
        }
    }
}

/// Whether a PE's transport carries data only or data and the ASAP control channel
/// (RFC 5354 §3.4: Transport Use field).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum TransportUse {
    /// 0x0000: data only.
    #[default]
    DataOnly,
    /// 0x0001: data plus control (the PU–PE control channel on PPID 11 shares the association).
    DataPlusControl,
}

impl TransportUse {
    fn from_u16(v: u16) -> Option<Self> {
        match v {
            0 => Some(TransportUse::DataOnly),
            1 => Some(TransportUse::DataPlusControl),
            _ => None,
        }
    }

    fn to_u16(self) -> u16 {
        match self {
            TransportUse::DataOnly => 0,
            TransportUse::DataPlusControl => 1,
        }
    }
}

/// A transport parameter: protocol, port, transport use and one or more addresses.
///
/// For TCP the second 16-bit field is "reserved" in RFC 5354 §3.5 but RSPLIB and Wireshark read
/// it as Transport Use; for UDP, UDP-Lite and DCCP it is reserved. It is kept in
/// `transport_use` for all, so that every parameter re-encodes to the bytes it came from.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TransportAddress {
    /// Protocol (and its protocol-specific fields).
    pub protocol: TransportProtocol,
    /// Port number.
    pub port: u16,
    /// Transport use (data only, or data plus control).
    pub transport_use: TransportUse,
    /// Addresses in the order given; SCTP may carry several, the others exactly one
    /// (RFC 5354 §3.3–§3.7; checked by the registrar, not the codec).
    pub addresses: Vec<IpAddr>,
}

impl TransportAddress {
    /// An SCTP transport on the given addresses.
    pub fn sctp(port: u16, transport_use: TransportUse, addresses: Vec<IpAddr>) -> Self {
        TransportAddress {
            protocol: TransportProtocol::Sctp,
            port,
            transport_use,
            addresses,
        }
    }

    /// A TCP transport (data only) on one address.
    pub fn tcp(port: u16, address: IpAddr) -> Self {
        TransportAddress {
            protocol: TransportProtocol::Tcp,
            port,
            transport_use: TransportUse::DataOnly,
            addresses: vec![address],
        }
    }

    /// A UDP transport on one address.
    pub fn udp(port: u16, address: IpAddr) -> Self {
        TransportAddress {
            protocol: TransportProtocol::Udp,
            port,
            transport_use: TransportUse::DataOnly,
            addresses: vec![address],
        }
    }

    /// The transport parameter on its own, e.g. to quote it in the error cause "Inconsistent
    /// Transport Type" (RFC 5354 §3.12).
    pub fn to_parameter(&self) -> Result<Vec<u8>, EncodeError> {
        crate::codec::parameter_bytes(|w| self.encode(w))
    }

    pub(crate) fn decode(ctx: &mut Ctx<'_>, tlv: &Tlv<'_>) -> Result<Self, DecodeError> {
        Self::decode_inner(ctx, tlv).map_err(|e| in_param(e, tlv))
    }

    fn decode_inner(ctx: &mut Ctx<'_>, tlv: &Tlv<'_>) -> Result<Self, DecodeError> {
        let mut r = ctx.reader(tlv.value_offset(), tlv.end());
        let port = r.u16(ctx)?;
        let use_offset = r.pos;
        let use_raw = r.u16(ctx)?;
        let protocol = match tlv.ptype {
            ParameterType::SCTP_TRANSPORT => TransportProtocol::Sctp,
            ParameterType::TCP_TRANSPORT => TransportProtocol::Tcp,
            ParameterType::UDP_TRANSPORT => TransportProtocol::Udp,
            ParameterType::UDP_LITE_TRANSPORT => TransportProtocol::UdpLite,
            ParameterType::DCCP_TRANSPORT => TransportProtocol::Dccp {
                service_code: r.u32(ctx)?,
            },
            other => {
                return Err(ctx.err(tlv.offset, DecodeErrorKind::UnexpectedParameter(other)));
            }
        };
        let transport_use = TransportUse::from_u16(use_raw).ok_or_else(|| {
            ctx.err(
                use_offset,
                DecodeErrorKind::InvalidValue {
                    field: "transport use",
                    value: u64::from(use_raw),
                },
            )
        })?;
        let mut addresses = Vec::new();
        while let Some(a) = r.next_tlv(ctx)? {
            match a.ptype {
                ParameterType::IPV4_ADDRESS | ParameterType::IPV6_ADDRESS => {
                    addresses.push(decode_address(ctx, &a)?)
                }
                other => {
                    return Err(in_param(
                        ctx.err(a.offset, DecodeErrorKind::UnexpectedParameter(other)),
                        &a,
                    ))
                }
            }
        }
        if addresses.is_empty() {
            return Err(ctx.err(
                tlv.end(),
                DecodeErrorKind::MissingParameter(ParameterType::IPV4_ADDRESS),
            ));
        }
        Ok(TransportAddress {
            protocol,
            port,
            transport_use,
            addresses,
        })
    }

    pub(crate) fn encode(&self, w: &mut Writer<'_>) -> Result<(), EncodeError> {
        if self.addresses.is_empty() {
            return Err(EncodeError::InvalidValue {
                field: "transport address",
                reason: "a transport parameter needs at least one address",
            });
        }
        let mark = w.begin_tlv(self.protocol.parameter_type());
        w.u16(self.port);
        w.u16(self.transport_use.to_u16());
        if let TransportProtocol::Dccp { service_code } = self.protocol {
            w.u32(service_code);
        }
        for a in &self.addresses {
            encode_address(w, a)?;
        }
        w.end_tlv(mark)
    }
}

impl fmt::Display for TransportAddress {
    /// `{10.0.0.1, ::1}:3863/SCTP+control`, in the spirit of RSPLIB's `hsdump`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("{")?;
        for (i, a) in self.addresses.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{a}")?;
        }
        write!(f, "}}:{}/{}", self.port, self.protocol.name())?;
        if let TransportProtocol::Dccp { service_code } = self.protocol {
            write!(f, "(service code {service_code})")?;
        }
        if self.transport_use == TransportUse::DataPlusControl {
            f.write_str("+control")?;
        }
        Ok(())
    }
}

/// A PE's user transport: one of the transport parameters, or an Opaque Transport
/// (RFC 5354 §3.16) whose content only the application understands.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum UserTransport {
    /// SCTP, TCP, UDP, UDP-Lite or DCCP with port and addresses.
    Address(TransportAddress),
    /// Opaque Transport: bytes for the application (RSPLIB does not implement it).
    Opaque(Vec<u8>),
}

impl UserTransport {
    /// The parameter type that carries this transport (compared by the registrar for the
    /// "Inconsistent Transport Type" check of RFC 5352 §3.1).
    pub fn parameter_type(&self) -> ParameterType {
        match self {
            UserTransport::Address(t) => t.protocol.parameter_type(),
            UserTransport::Opaque(_) => ParameterType::OPAQUE_TRANSPORT,
        }
    }

    /// The transport use; an opaque transport counts as data only.
    pub fn transport_use(&self) -> TransportUse {
        match self {
            UserTransport::Address(t) => t.transport_use,
            UserTransport::Opaque(_) => TransportUse::DataOnly,
        }
    }

    /// The addresses (none for an opaque transport).
    pub fn addresses(&self) -> &[IpAddr] {
        match self {
            UserTransport::Address(t) => &t.addresses,
            UserTransport::Opaque(_) => &[],
        }
    }

    /// The transport address, unless opaque.
    pub fn as_address(&self) -> Option<&TransportAddress> {
        match self {
            UserTransport::Address(t) => Some(t),
            UserTransport::Opaque(_) => None,
        }
    }

    /// The transport parameter on its own, e.g. to quote it in the error cause "Inconsistent
    /// Transport Type" (RFC 5354 §3.12).
    pub fn to_parameter(&self) -> Result<Vec<u8>, EncodeError> {
        crate::codec::parameter_bytes(|w| self.encode(w))
    }

    pub(crate) fn is_user_transport(t: ParameterType) -> bool {
        matches!(
            t,
            ParameterType::SCTP_TRANSPORT
                | ParameterType::TCP_TRANSPORT
                | ParameterType::UDP_TRANSPORT
                | ParameterType::UDP_LITE_TRANSPORT
                | ParameterType::DCCP_TRANSPORT
                | ParameterType::OPAQUE_TRANSPORT
        )
    }

    pub(crate) fn decode(ctx: &mut Ctx<'_>, tlv: &Tlv<'_>) -> Result<Self, DecodeError> {
        if tlv.ptype == ParameterType::OPAQUE_TRANSPORT {
            Ok(UserTransport::Opaque(tlv.value.to_vec()))
        } else {
            TransportAddress::decode(ctx, tlv).map(UserTransport::Address)
        }
    }

    pub(crate) fn encode(&self, w: &mut Writer<'_>) -> Result<(), EncodeError> {
        match self {
            UserTransport::Address(t) => t.encode(w),
            UserTransport::Opaque(b) => w.tlv(ParameterType::OPAQUE_TRANSPORT, b),
        }
    }
}

impl From<TransportAddress> for UserTransport {
    fn from(t: TransportAddress) -> Self {
        UserTransport::Address(t)
    }
}

impl fmt::Display for UserTransport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            UserTransport::Address(t) => t.fmt(f),
            UserTransport::Opaque(b) => write!(f, "opaque({} bytes)", b.len()),
        }
    }
}

pub(crate) fn decode_address(ctx: &Ctx<'_>, tlv: &Tlv<'_>) -> Result<IpAddr, DecodeError> {
    let bad = |expected| {
        in_param(
            ctx.err(
                tlv.offset + 2,
                DecodeErrorKind::BadLength {
                    length: tlv.value.len() + 4,
                    expected,
                },
            ),
            tlv,
        )
    };
    match tlv.ptype {
        ParameterType::IPV4_ADDRESS => {
            let b: [u8; 4] = tlv.value.try_into().map_err(|_| bad("8"))?;
            Ok(IpAddr::V4(Ipv4Addr::from(b)))
        }
        _ => {
            let b: [u8; 16] = tlv.value.try_into().map_err(|_| bad("20"))?;
            Ok(IpAddr::V6(Ipv6Addr::from(b)))
        }
    }
}

pub(crate) fn encode_address(w: &mut Writer<'_>, a: &IpAddr) -> Result<(), EncodeError> {
    match a {
        IpAddr::V4(v4) => w.tlv(ParameterType::IPV4_ADDRESS, &v4.octets()),
        IpAddr::V6(v6) => w.tlv(ParameterType::IPV6_ADDRESS, &v6.octets()),
    }
}
