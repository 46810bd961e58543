//! The parameters that appear at the top level of a message, and the collector that hands them
//! to each message's decoder.

use crate::codec::{in_param, Ctx, Reader, Tlv, Writer};
use crate::config::CodecConfig;
use crate::error::{DecodeError, DecodeErrorKind, EncodeError, Span};
use crate::operation_error::OperationError;
use crate::policy::PoolPolicy;
use crate::pool_element::{PoolElement, ServerInformation};
use crate::transport::{decode_address, encode_address, TransportAddress};
use crate::types::{HandleResolutionOption, ParameterType, PeChecksum, PoolElementId, PoolHandle};
use std::net::IpAddr;

/// Any parameter of RFC 5354 (and the Handle Resolution option) on its own: what
/// [`crate::Codec::decode_parameters`] returns, e.g. for a parameter quoted in an error cause.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Parameter {
    /// IPv4 or IPv6 Address.
    Address(IpAddr),
    /// SCTP, TCP, UDP, UDP-Lite or DCCP Transport.
    Transport(TransportAddress),
    /// Opaque Transport.
    OpaqueTransport(Vec<u8>),
    /// Pool Member Selection Policy.
    Policy(PoolPolicy),
    /// Pool Handle.
    PoolHandle(PoolHandle),
    /// Pool Element.
    PoolElement(PoolElement),
    /// Server Information.
    ServerInformation(ServerInformation),
    /// Operation Error.
    OperationError(OperationError),
    /// Cookie.
    Cookie(Vec<u8>),
    /// PE Identifier.
    PeIdentifier(PoolElementId),
    /// PE Checksum.
    PeChecksum(PeChecksum),
    /// Handle Resolution option.
    HandleResolution(HandleResolutionOption),
}

fn fixed<'a, const N: usize>(
    ctx: &Ctx<'_>,
    tlv: &Tlv<'a>,
    expected: &'static str,
) -> Result<[u8; N], DecodeError> {
    tlv.value.try_into().map_err(|_| {
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
    })
}

impl Parameter {
    /// The parameter's type.
    pub fn parameter_type(&self) -> ParameterType {
        match self {
            Parameter::Address(IpAddr::V4(_)) => ParameterType::IPV4_ADDRESS,
            Parameter::Address(IpAddr::V6(_)) => ParameterType::IPV6_ADDRESS,
            Parameter::Transport(t) => t.protocol.parameter_type(),
            Parameter::OpaqueTransport(_) => ParameterType::OPAQUE_TRANSPORT,
            Parameter::Policy(_) => ParameterType::POOL_MEMBER_SELECTION_POLICY,
            Parameter::PoolHandle(_) => ParameterType::POOL_HANDLE,
            Parameter::PoolElement(_) => ParameterType::POOL_ELEMENT,
            Parameter::ServerInformation(_) => ParameterType::SERVER_INFORMATION,
            Parameter::OperationError(_) => ParameterType::OPERATION_ERROR,
            Parameter::Cookie(_) => ParameterType::COOKIE,
            Parameter::PeIdentifier(_) => ParameterType::PE_IDENTIFIER,
            Parameter::PeChecksum(_) => ParameterType::PE_CHECKSUM,
            Parameter::HandleResolution(_) => ParameterType::HANDLE_RESOLUTION,
        }
    }

    /// Appends the encoded parameter (header, value, padding).
    pub(crate) fn encode(
        &self,
        w: &mut Writer<'_>,
        config: &CodecConfig,
    ) -> Result<(), EncodeError> {
        match self {
            Parameter::Address(a) => encode_address(w, a),
            Parameter::Transport(t) => t.encode(w),
            Parameter::OpaqueTransport(b) => w.tlv(ParameterType::OPAQUE_TRANSPORT, b),
            Parameter::Policy(p) => p.encode(w),
            Parameter::PoolHandle(h) => encode_pool_handle(w, h.as_bytes()),
            Parameter::PoolElement(pe) => pe.encode(w, config),
            Parameter::ServerInformation(s) => s.encode(w),
            Parameter::OperationError(e) => e.encode(w),
            Parameter::Cookie(c) => encode_cookie(w, c),
            Parameter::PeIdentifier(id) => encode_pe_identifier(w, *id),
            Parameter::PeChecksum(c) => encode_pe_checksum(w, *c),
            Parameter::HandleResolution(o) => encode_handle_resolution(w, *o),
        }
    }

    pub(crate) fn decode(ctx: &mut Ctx<'_>, tlv: &Tlv<'_>) -> Result<Parameter, DecodeError> {
        Ok(match tlv.ptype {
            ParameterType::POOL_HANDLE => {
                let len = tlv.value.len();
                if len == 0 {
                    return Err(in_param(
                        ctx.err(
                            tlv.offset + 2,
                            DecodeErrorKind::BadLength {
                                length: 4,
                                expected: "at least 5 (a pool handle is not empty)",
                            },
                        ),
                        tlv,
                    ));
                }
                if len > ctx.config.max_pool_handle_size {
                    return Err(in_param(
                        ctx.err(
                            tlv.value_offset(),
                            DecodeErrorKind::TooLong {
                                field: "pool handle",
                                length: len,
                                limit: ctx.config.max_pool_handle_size,
                            },
                        ),
                        tlv,
                    ));
                }
                Parameter::PoolHandle(PoolHandle::new(tlv.value))
            }
            ParameterType::POOL_ELEMENT => Parameter::PoolElement(PoolElement::decode(ctx, tlv)?),
            ParameterType::PE_IDENTIFIER => {
                Parameter::PeIdentifier(PoolElementId(u32::from_be_bytes(fixed(ctx, tlv, "8")?)))
            }
            ParameterType::POOL_MEMBER_SELECTION_POLICY => {
                Parameter::Policy(PoolPolicy::decode(ctx, tlv)?)
            }
            ParameterType::OPERATION_ERROR => {
                Parameter::OperationError(OperationError::decode(ctx, tlv)?)
            }
            ParameterType::COOKIE => Parameter::Cookie(tlv.value.to_vec()),
            ParameterType::SERVER_INFORMATION => {
                Parameter::ServerInformation(ServerInformation::decode(ctx, tlv)?)
            }
            ParameterType::PE_CHECKSUM => {
                Parameter::PeChecksum(PeChecksum(u16::from_be_bytes(fixed(ctx, tlv, "6")?)))
            }
            ParameterType::HANDLE_RESOLUTION => {
                Parameter::HandleResolution(HandleResolutionOption {
                    items: u32::from_be_bytes(fixed(ctx, tlv, "8")?),
                })
            }
            ParameterType::OPAQUE_TRANSPORT => Parameter::OpaqueTransport(tlv.value.to_vec()),
            ParameterType::IPV4_ADDRESS | ParameterType::IPV6_ADDRESS => {
                Parameter::Address(decode_address(ctx, tlv)?)
            }
            _ => Parameter::Transport(TransportAddress::decode(ctx, tlv)?),
        })
    }
}

/// Encoders for the top-level parameters that are plain values.
pub fn encode_pool_handle(w: &mut Writer<'_>, h: &[u8]) -> Result<(), EncodeError> {
    if h.is_empty() {
        return Err(EncodeError::InvalidValue {
            field: "pool handle",
            reason: "must not be empty",
        });
    }
    w.tlv(ParameterType::POOL_HANDLE, h)
}

pub fn encode_pe_identifier(w: &mut Writer<'_>, id: PoolElementId) -> Result<(), EncodeError> {
    w.tlv(ParameterType::PE_IDENTIFIER, &id.0.to_be_bytes())
}

pub fn encode_cookie(w: &mut Writer<'_>, cookie: &[u8]) -> Result<(), EncodeError> {
    w.tlv(ParameterType::COOKIE, cookie)
}

pub fn encode_pe_checksum(w: &mut Writer<'_>, c: PeChecksum) -> Result<(), EncodeError> {
    w.tlv(ParameterType::PE_CHECKSUM, &c.0.to_be_bytes())
}

pub fn encode_handle_resolution(
    w: &mut Writer<'_>,
    o: HandleResolutionOption,
) -> Result<(), EncodeError> {
    w.tlv(ParameterType::HANDLE_RESOLUTION, &o.items.to_be_bytes())
}

/// One decoded parameter with where it was.
#[derive(Debug)]
pub struct Located {
    pub ptype: ParameterType,
    pub span: Span,
    pub param: Parameter,
}

/// All top-level parameters of a message, in order, from which each message's decoder takes
/// what it needs. Whatever is left at the end is an unexpected parameter.
pub struct Params {
    items: Vec<Located>,
    end: usize,
}

macro_rules! take_fn {
    ($name:ident, $variant:ident, $t:ty) => {
        /// Takes the first parameter of this kind, if any.
        pub fn $name(&mut self) -> Option<$t> {
            let i = self
                .items
                .iter()
                .position(|l| matches!(l.param, Parameter::$variant(_)))?;
            match self.items.remove(i).param {
                Parameter::$variant(v) => Some(v),
                _ => unreachable!("position matched the variant"),
            }
        }
    };
}

impl Params {
    /// Decodes every parameter of the region.
    pub fn read<'a>(ctx: &mut Ctx<'a>, mut r: Reader<'a>) -> Result<Params, DecodeError> {
        let end = r.end;
        let mut items = Vec::new();
        while let Some(tlv) = r.next_tlv(ctx)? {
            let param = Parameter::decode(ctx, &tlv)?;
            items.push(Located {
                ptype: tlv.ptype,
                span: tlv.span(),
                param,
            });
        }
        Ok(Params { items, end })
    }

    take_fn!(pool_handle, PoolHandle, PoolHandle);
    take_fn!(pool_element, PoolElement, PoolElement);
    take_fn!(pe_identifier, PeIdentifier, PoolElementId);
    take_fn!(policy, Policy, PoolPolicy);
    take_fn!(operation_error, OperationError, OperationError);
    take_fn!(cookie, Cookie, Vec<u8>);
    take_fn!(server_information, ServerInformation, ServerInformation);
    take_fn!(pe_checksum, PeChecksum, PeChecksum);
    take_fn!(handle_resolution, HandleResolution, HandleResolutionOption);
    take_fn!(transport, Transport, TransportAddress);

    /// Takes a parameter the message must have.
    pub fn required<T>(
        &mut self,
        ctx: &Ctx<'_>,
        ptype: ParameterType,
        take: impl FnOnce(&mut Self) -> Option<T>,
    ) -> Result<T, DecodeError> {
        take(self).ok_or_else(|| ctx.err(self.end, DecodeErrorKind::MissingParameter(ptype)))
    }

    /// Takes every parameter of a kind, in order.
    pub fn all<T>(&mut self, mut take: impl FnMut(&mut Self) -> Option<T>) -> Vec<T> {
        std::iter::from_fn(|| take(self)).collect()
    }

    /// The remaining parameters, in order (for messages whose meaning depends on order).
    pub fn into_items(self) -> Vec<Located> {
        self.items
    }

    /// Fails if any parameter was not taken.
    pub fn finish(self, ctx: &Ctx<'_>) -> Result<(), DecodeError> {
        match self.items.first() {
            None => Ok(()),
            Some(l) => {
                let mut e = ctx.err(l.span.offset, DecodeErrorKind::UnexpectedParameter(l.ptype));
                e.parameter = Some(l.ptype);
                e.parameter_span = Some(l.span);
                Err(e)
            }
        }
    }
}
