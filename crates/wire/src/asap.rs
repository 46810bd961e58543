//! ASAP messages (RFC 5352 §2.2): every message type as a typed value, with its flags.

use crate::codec::{padded, Ctx, Reader, HEADER_LEN};
use crate::config::CodecConfig;
use crate::error::{DecodeError, EncodeError};
use crate::message::{flag, flags_of, sealed::Codable, write_message, Message};
use crate::operation_error::OperationError;
use crate::params::{
    encode_cookie, encode_handle_resolution, encode_pe_identifier, encode_pool_handle, Params,
};
use crate::policy::PoolPolicy;
use crate::pool_element::PoolElement;
use crate::transport::TransportAddress;
use crate::types::{
    HandleResolutionOption, ParameterType, PoolElementId, PoolHandle, Protocol, RegistrarId,
};

/// ASAP message type numbers (RFC 5352 §2.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
#[allow(missing_docs)]
pub enum AsapMessageType {
    Registration = 0x01,
    Deregistration = 0x02,
    RegistrationResponse = 0x03,
    DeregistrationResponse = 0x04,
    HandleResolution = 0x05,
    HandleResolutionResponse = 0x06,
    EndpointKeepAlive = 0x07,
    EndpointKeepAliveAck = 0x08,
    EndpointUnreachable = 0x09,
    ServerAnnounce = 0x0a,
    Cookie = 0x0b,
    CookieEcho = 0x0c,
    BusinessCard = 0x0d,
    Error = 0x0e,
}

impl AsapMessageType {
    /// All message types in numeric order.
    pub const ALL: [AsapMessageType; 14] = [
        Self::Registration,
        Self::Deregistration,
        Self::RegistrationResponse,
        Self::DeregistrationResponse,
        Self::HandleResolution,
        Self::HandleResolutionResponse,
        Self::EndpointKeepAlive,
        Self::EndpointKeepAliveAck,
        Self::EndpointUnreachable,
        Self::ServerAnnounce,
        Self::Cookie,
        Self::CookieEcho,
        Self::BusinessCard,
        Self::Error,
    ];

    /// The type for a number, if known.
    pub fn from_u8(t: u8) -> Option<Self> {
        Self::ALL.get(usize::from(t).wrapping_sub(1)).copied()
    }

    /// The RFC's name, e.g. `ASAP_REGISTRATION`.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Registration => "ASAP_REGISTRATION",
            Self::Deregistration => "ASAP_DEREGISTRATION",
            Self::RegistrationResponse => "ASAP_REGISTRATION_RESPONSE",
            Self::DeregistrationResponse => "ASAP_DEREGISTRATION_RESPONSE",
            Self::HandleResolution => "ASAP_HANDLE_RESOLUTION",
            Self::HandleResolutionResponse => "ASAP_HANDLE_RESOLUTION_RESPONSE",
            Self::EndpointKeepAlive => "ASAP_ENDPOINT_KEEP_ALIVE",
            Self::EndpointKeepAliveAck => "ASAP_ENDPOINT_KEEP_ALIVE_ACK",
            Self::EndpointUnreachable => "ASAP_ENDPOINT_UNREACHABLE",
            Self::ServerAnnounce => "ASAP_SERVER_ANNOUNCE",
            Self::Cookie => "ASAP_COOKIE",
            Self::CookieEcho => "ASAP_COOKIE_ECHO",
            Self::BusinessCard => "ASAP_BUSINESS_CARD",
            Self::Error => "ASAP_ERROR",
        }
    }
}

/// Flag bit 0, named R, S, A or H depending on the message.
const BIT0: u8 = 0x01;

/// ASAP_REGISTRATION (RFC 5352 §2.2.1): a PE registers or re-registers into a pool.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Registration {
    /// The pool to join.
    pub pool_handle: PoolHandle,
    /// The PE as it describes itself.
    pub pool_element: PoolElement,
}

/// ASAP_DEREGISTRATION (RFC 5352 §2.2.2): a PE leaves a pool.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Deregistration {
    /// The pool.
    pub pool_handle: PoolHandle,
    /// The leaving PE.
    pub pe_id: PoolElementId,
}

/// ASAP_REGISTRATION_RESPONSE (RFC 5352 §2.2.3).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RegistrationResponse {
    /// R flag: the registration was rejected (the Operation Error says why).
    pub reject: bool,
    /// The pool.
    pub pool_handle: PoolHandle,
    /// The PE the answer is for.
    pub pe_id: PoolElementId,
    /// Why it was rejected, or a warning when `reject` is not set.
    pub error: Option<OperationError>,
}

/// ASAP_DEREGISTRATION_RESPONSE (RFC 5352 §2.2.4); also sent when a registration life expires.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct DeregistrationResponse {
    /// The pool.
    pub pool_handle: PoolHandle,
    /// The PE.
    pub pe_id: PoolElementId,
    /// Why the deregistration failed, if it did.
    pub error: Option<OperationError>,
}

/// ASAP_HANDLE_RESOLUTION (RFC 5352 §2.2.5): a PU asks for PEs of a pool.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct HandleResolution {
    /// S flag: subscribe to changes of the pool.
    pub subscribe: bool,
    /// The pool.
    pub pool_handle: PoolHandle,
    /// How many PEs the PU wants (Handle Resolution option; absent = the registrar's default).
    pub option: Option<HandleResolutionOption>,
}

impl HandleResolution {
    /// The request as a [`HandleResolutionRef`], borrowing the pool handle.
    pub fn as_ref(&self) -> HandleResolutionRef<'_> {
        HandleResolutionRef {
            subscribe: self.subscribe,
            pool_handle: self.pool_handle.as_bytes(),
            option: self.option,
        }
    }
}

/// An ASAP_HANDLE_RESOLUTION read in place, its pool handle borrowed from the message: what a
/// registrar needs of the request it answers most often, without an allocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HandleResolutionRef<'a> {
    /// S flag: subscribe to changes of the pool.
    pub subscribe: bool,
    /// The pool handle's bytes.
    pub pool_handle: &'a [u8],
    /// How many PEs the PU wants.
    pub option: Option<HandleResolutionOption>,
}

impl crate::Codec {
    /// Reads an ASAP_HANDLE_RESOLUTION of the usual shape (RFC 5352 §2.2.5: a Pool Handle, then
    /// at most a Handle Resolution option) in place. `None` for anything else: other messages,
    /// other shapes, anything malformed, which [`crate::Codec::decode`] then reads (and, if it
    /// must, rejects with the right error). What this accepts, `decode` decodes to the same
    /// values with no unrecognized parameters.
    pub fn peek_handle_resolution<'a>(&self, bytes: &'a [u8]) -> Option<HandleResolutionRef<'a>> {
        let config = self.config();
        let [message_type, flags, l0, l1, ..] = *bytes else {
            return None;
        };
        let length = usize::from(u16::from_be_bytes([l0, l1]));
        if message_type != AsapMessageType::HandleResolution as u8
            || length < HEADER_LEN
            || length > config.message_limit()
            || length > bytes.len()
            || !matches!(bytes.len() - length, n if n == 0 || n == padded(length) - length)
            || bytes[length..].iter().any(|&b| b != 0)
        {
            return None;
        }
        let body = &bytes[HEADER_LEN..length];
        // One parameter: (type, value, what follows its padding).
        let tlv = |region: &'a [u8]| -> Option<(u16, &'a [u8], &'a [u8])> {
            let [t0, t1, n0, n1, ..] = *region else {
                return None;
            };
            let n = usize::from(u16::from_be_bytes([n0, n1]));
            if n < HEADER_LEN || n > region.len() {
                return None;
            }
            let value = &region[HEADER_LEN..n];
            let rest = &region[n..];
            if rest.is_empty() {
                return Some((u16::from_be_bytes([t0, t1]), value, rest));
            }
            let pad = padded(n) - n;
            if rest.len() < pad || rest[..pad].iter().any(|&b| b != 0) {
                return None;
            }
            Some((u16::from_be_bytes([t0, t1]), value, &rest[pad..]))
        };
        let (t, pool_handle, rest) = tlv(body)?;
        if t != ParameterType::POOL_HANDLE.0
            || pool_handle.is_empty()
            || pool_handle.len() > config.max_pool_handle_size
        {
            return None;
        }
        let option = if rest.is_empty() {
            None
        } else {
            let (t, value, rest) = tlv(rest)?;
            let items: [u8; 4] = value.try_into().ok()?;
            if t != ParameterType::HANDLE_RESOLUTION.0 || !rest.is_empty() {
                return None;
            }
            Some(HandleResolutionOption {
                items: u32::from_be_bytes(items),
            })
        };
        Some(HandleResolutionRef {
            subscribe: flag(flags, BIT0),
            pool_handle,
            option,
        })
    }
}

/// ASAP_HANDLE_RESOLUTION_RESPONSE (RFC 5352 §2.2.6): PEs chosen by the pool's policy, or an
/// Operation Error (e.g. Unknown Pool Handle) and no PEs.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct HandleResolutionResponse {
    /// A flag: the subscription was accepted.
    pub accepted: bool,
    /// The pool.
    pub pool_handle: PoolHandle,
    /// The pool's policy (absent means Round Robin).
    pub overall_policy: Option<PoolPolicy>,
    /// The selected PEs, in the order the policy chose them.
    pub pool_elements: Vec<PoolElement>,
    /// A negative answer's reason.
    pub error: Option<OperationError>,
}

/// One PE's Pool Element parameter as handle resolution responses carry it (without its ASAP
/// transport, which a PU has no use for), encoded once: a registrar answers many resolutions
/// from PEs that change only when they re-register, so it keeps this beside each PE instead of
/// encoding the PE for every answer. Only [`crate::Codec::encode_pool_element_for_users`]
/// makes one, so it always holds one whole, padded parameter, in that codec's units.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EncodedPoolElement(Box<[u8]>);

impl EncodedPoolElement {
    /// The parameter's bytes (header, value, padding).
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }
}

impl crate::Codec {
    /// Encodes a PE as [`crate::Codec::encode_handle_resolution_response`] sends it.
    pub fn encode_pool_element_for_users(
        &self,
        pe: &PoolElement,
    ) -> Result<EncodedPoolElement, EncodeError> {
        let bytes = crate::codec::parameter_bytes(|w| pe.encode_parts(w, self.config(), false))?;
        Ok(EncodedPoolElement(bytes.into_boxed_slice()))
    }

    /// Appends an ASAP_HANDLE_RESOLUTION_RESPONSE (RFC 5352 §2.2.6) built from PEs encoded
    /// beforehand by [`crate::Codec::encode_pool_element_for_users`]: the bytes of a
    /// [`HandleResolutionResponse`] holding those PEs with `asap_transport: None`. On error
    /// `buf` is left as it was.
    pub fn encode_handle_resolution_response<'a>(
        &self,
        pool_handle: &[u8],
        overall_policy: Option<&PoolPolicy>,
        pool_elements: impl IntoIterator<Item = &'a EncodedPoolElement>,
        buf: &mut Vec<u8>,
    ) -> Result<(), EncodeError> {
        let config = self.config();
        write_message(
            buf,
            config,
            AsapMessageType::HandleResolutionResponse as u8,
            0,
            |w| {
                encode_pool_handle(w, pool_handle)?;
                if let Some(policy) = overall_policy {
                    policy.encode(w)?;
                }
                for pe in pool_elements {
                    w.bytes(pe.as_bytes());
                }
                Ok(())
            },
        )
    }
}

/// ASAP_ENDPOINT_KEEP_ALIVE (RFC 5352 §2.2.7): a registrar checks on a PE.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct EndpointKeepAlive {
    /// H flag: the sender asks to become the PE's home registrar (after a takeover).
    pub home: bool,
    /// The sending registrar.
    pub server_id: RegistrarId,
    /// The pool.
    pub pool_handle: PoolHandle,
    /// The PE (RSPLIB always adds it; RFC 5352 does not have it).
    pub pe_id: Option<PoolElementId>,
}

/// ASAP_ENDPOINT_KEEP_ALIVE_ACK (RFC 5352 §2.2.8): the PE answers a keep-alive.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct EndpointKeepAliveAck {
    /// The pool.
    pub pool_handle: PoolHandle,
    /// The answering PE.
    pub pe_id: PoolElementId,
}

/// ASAP_ENDPOINT_UNREACHABLE (RFC 5352 §2.2.9): a PU reports a PE it could not reach.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct EndpointUnreachable {
    /// The pool.
    pub pool_handle: PoolHandle,
    /// The unreachable PE.
    pub pe_id: PoolElementId,
}

/// ASAP_SERVER_ANNOUNCE (RFC 5352 §2.2.10): a registrar announces itself by multicast.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ServerAnnounce {
    /// The announcing registrar.
    pub server_id: RegistrarId,
    /// Where it accepts ASAP (none = SCTP on the source address and the well-known port).
    pub transports: Vec<TransportAddress>,
}

/// ASAP_COOKIE (RFC 5352 §2.2.11): a PE hands its PU a state cookie.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Cookie {
    /// The cookie, opaque to the PU.
    pub cookie: Vec<u8>,
}

/// ASAP_COOKIE_ECHO (RFC 5352 §2.2.12): after failover the PU gives the last cookie to the new PE.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CookieEcho {
    /// The cookie as last received.
    pub cookie: Vec<u8>,
}

/// ASAP_BUSINESS_CARD (RFC 5352 §2.2.13): a PE tells its peer which PEs to fail over to.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct BusinessCard {
    /// The sender's pool.
    pub pool_handle: PoolHandle,
    /// PEs in failover order.
    pub pool_elements: Vec<PoolElement>,
}

/// ASAP_ERROR (RFC 5352 §2.2.14): reports an unrecognized or invalid message or parameter.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct AsapError {
    /// What went wrong.
    pub error: OperationError,
}

/// Any ASAP message.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[allow(missing_docs)]
pub enum AsapMessage {
    Registration(Registration),
    Deregistration(Deregistration),
    RegistrationResponse(RegistrationResponse),
    DeregistrationResponse(DeregistrationResponse),
    HandleResolution(HandleResolution),
    HandleResolutionResponse(HandleResolutionResponse),
    EndpointKeepAlive(EndpointKeepAlive),
    EndpointKeepAliveAck(EndpointKeepAliveAck),
    EndpointUnreachable(EndpointUnreachable),
    ServerAnnounce(ServerAnnounce),
    Cookie(Cookie),
    CookieEcho(CookieEcho),
    BusinessCard(BusinessCard),
    Error(AsapError),
}

impl AsapMessage {
    /// The message's type.
    pub fn kind(&self) -> AsapMessageType {
        use AsapMessage as M;
        use AsapMessageType as T;
        match self {
            M::Registration(_) => T::Registration,
            M::Deregistration(_) => T::Deregistration,
            M::RegistrationResponse(_) => T::RegistrationResponse,
            M::DeregistrationResponse(_) => T::DeregistrationResponse,
            M::HandleResolution(_) => T::HandleResolution,
            M::HandleResolutionResponse(_) => T::HandleResolutionResponse,
            M::EndpointKeepAlive(_) => T::EndpointKeepAlive,
            M::EndpointKeepAliveAck(_) => T::EndpointKeepAliveAck,
            M::EndpointUnreachable(_) => T::EndpointUnreachable,
            M::ServerAnnounce(_) => T::ServerAnnounce,
            M::Cookie(_) => T::Cookie,
            M::CookieEcho(_) => T::CookieEcho,
            M::BusinessCard(_) => T::BusinessCard,
            M::Error(_) => T::Error,
        }
    }

    /// The pool handle the message is about, if it carries one.
    pub fn pool_handle(&self) -> Option<&PoolHandle> {
        use AsapMessage as M;
        match self {
            M::Registration(m) => Some(&m.pool_handle),
            M::Deregistration(m) => Some(&m.pool_handle),
            M::RegistrationResponse(m) => Some(&m.pool_handle),
            M::DeregistrationResponse(m) => Some(&m.pool_handle),
            M::HandleResolution(m) => Some(&m.pool_handle),
            M::HandleResolutionResponse(m) => Some(&m.pool_handle),
            M::EndpointKeepAlive(m) => Some(&m.pool_handle),
            M::EndpointKeepAliveAck(m) => Some(&m.pool_handle),
            M::EndpointUnreachable(m) => Some(&m.pool_handle),
            M::BusinessCard(m) => Some(&m.pool_handle),
            M::ServerAnnounce(_) | M::Cookie(_) | M::CookieEcho(_) | M::Error(_) => None,
        }
    }
}

impl Message for AsapMessage {
    const PROTOCOL: Protocol = Protocol::Asap;

    fn message_type(&self) -> u8 {
        self.kind() as u8
    }

    fn name(&self) -> &'static str {
        self.kind().name()
    }
}

fn pool_handle(p: &mut Params, ctx: &Ctx<'_>) -> Result<PoolHandle, DecodeError> {
    p.required(ctx, ParameterType::POOL_HANDLE, Params::pool_handle)
}

fn pe_id(p: &mut Params, ctx: &Ctx<'_>) -> Result<PoolElementId, DecodeError> {
    p.required(ctx, ParameterType::PE_IDENTIFIER, Params::pe_identifier)
}

impl Codable for AsapMessage {
    fn is_known_type(t: u8) -> bool {
        AsapMessageType::from_u8(t).is_some()
    }

    fn decode_body<'a>(
        ctx: &mut Ctx<'a>,
        message_type: u8,
        flags: u8,
        mut body: Reader<'a>,
    ) -> Result<Self, DecodeError> {
        use AsapMessageType as T;
        let kind = AsapMessageType::from_u8(message_type).expect("checked by is_known_type");
        // Keep-alive and server announce start with a fixed Server Identifier field.
        let server_id = match kind {
            T::EndpointKeepAlive | T::ServerAnnounce => Some(RegistrarId(body.u32(ctx)?)),
            _ => None,
        };
        let mut p = Params::read(ctx, body)?;
        let c = &*ctx;
        let m = match kind {
            T::Registration => AsapMessage::Registration(Registration {
                pool_handle: pool_handle(&mut p, c)?,
                pool_element: p.required(c, ParameterType::POOL_ELEMENT, Params::pool_element)?,
            }),
            T::Deregistration => AsapMessage::Deregistration(Deregistration {
                pool_handle: pool_handle(&mut p, c)?,
                pe_id: pe_id(&mut p, c)?,
            }),
            T::RegistrationResponse => AsapMessage::RegistrationResponse(RegistrationResponse {
                reject: flag(flags, BIT0),
                pool_handle: pool_handle(&mut p, c)?,
                pe_id: pe_id(&mut p, c)?,
                error: p.operation_error(),
            }),
            T::DeregistrationResponse => {
                AsapMessage::DeregistrationResponse(DeregistrationResponse {
                    pool_handle: pool_handle(&mut p, c)?,
                    pe_id: pe_id(&mut p, c)?,
                    error: p.operation_error(),
                })
            }
            T::HandleResolution => AsapMessage::HandleResolution(HandleResolution {
                subscribe: flag(flags, BIT0),
                pool_handle: pool_handle(&mut p, c)?,
                option: p.handle_resolution(),
            }),
            T::HandleResolutionResponse => {
                AsapMessage::HandleResolutionResponse(HandleResolutionResponse {
                    accepted: flag(flags, BIT0),
                    pool_handle: pool_handle(&mut p, c)?,
                    overall_policy: p.policy(),
                    pool_elements: p.all(Params::pool_element),
                    error: p.operation_error(),
                })
            }
            T::EndpointKeepAlive => AsapMessage::EndpointKeepAlive(EndpointKeepAlive {
                home: flag(flags, BIT0),
                server_id: server_id.expect("read above"),
                pool_handle: pool_handle(&mut p, c)?,
                pe_id: p.pe_identifier(),
            }),
            T::EndpointKeepAliveAck => AsapMessage::EndpointKeepAliveAck(EndpointKeepAliveAck {
                pool_handle: pool_handle(&mut p, c)?,
                pe_id: pe_id(&mut p, c)?,
            }),
            T::EndpointUnreachable => AsapMessage::EndpointUnreachable(EndpointUnreachable {
                pool_handle: pool_handle(&mut p, c)?,
                pe_id: pe_id(&mut p, c)?,
            }),
            T::ServerAnnounce => AsapMessage::ServerAnnounce(ServerAnnounce {
                server_id: server_id.expect("read above"),
                transports: p.all(Params::transport),
            }),
            T::Cookie => AsapMessage::Cookie(Cookie {
                cookie: p.required(c, ParameterType::COOKIE, Params::cookie)?,
            }),
            T::CookieEcho => AsapMessage::CookieEcho(CookieEcho {
                cookie: p.required(c, ParameterType::COOKIE, Params::cookie)?,
            }),
            T::BusinessCard => AsapMessage::BusinessCard(BusinessCard {
                pool_handle: pool_handle(&mut p, c)?,
                pool_elements: p.all(Params::pool_element),
            }),
            T::Error => AsapMessage::Error(AsapError {
                error: p.required(c, ParameterType::OPERATION_ERROR, Params::operation_error)?,
            }),
        };
        p.finish(c)?;
        Ok(m)
    }

    fn encode_message(&self, buf: &mut Vec<u8>, config: &CodecConfig) -> Result<(), EncodeError> {
        use AsapMessage as M;
        let flags = match self {
            M::RegistrationResponse(m) => flags_of(&[(BIT0, m.reject)]),
            M::HandleResolution(m) => flags_of(&[(BIT0, m.subscribe)]),
            M::HandleResolutionResponse(m) => flags_of(&[(BIT0, m.accepted)]),
            M::EndpointKeepAlive(m) => flags_of(&[(BIT0, m.home)]),
            _ => 0,
        };
        write_message(buf, config, self.message_type(), flags, |w| {
            match self {
                M::Registration(m) => {
                    encode_pool_handle(w, m.pool_handle.as_bytes())?;
                    m.pool_element.encode(w, config)?;
                }
                M::Deregistration(m) => {
                    encode_pool_handle(w, m.pool_handle.as_bytes())?;
                    encode_pe_identifier(w, m.pe_id)?;
                }
                M::RegistrationResponse(RegistrationResponse {
                    pool_handle,
                    pe_id,
                    error,
                    ..
                })
                | M::DeregistrationResponse(DeregistrationResponse {
                    pool_handle,
                    pe_id,
                    error,
                }) => {
                    encode_pool_handle(w, pool_handle.as_bytes())?;
                    encode_pe_identifier(w, *pe_id)?;
                    if let Some(e) = error {
                        e.encode(w)?;
                    }
                }
                M::HandleResolution(m) => {
                    encode_pool_handle(w, m.pool_handle.as_bytes())?;
                    if let Some(o) = m.option {
                        encode_handle_resolution(w, o)?;
                    }
                }
                M::HandleResolutionResponse(m) => {
                    encode_pool_handle(w, m.pool_handle.as_bytes())?;
                    if let Some(policy) = &m.overall_policy {
                        policy.encode(w)?;
                    }
                    for pe in &m.pool_elements {
                        pe.encode(w, config)?;
                    }
                    if let Some(e) = &m.error {
                        e.encode(w)?;
                    }
                }
                M::EndpointKeepAlive(m) => {
                    w.u32(m.server_id.0);
                    encode_pool_handle(w, m.pool_handle.as_bytes())?;
                    if let Some(id) = m.pe_id {
                        encode_pe_identifier(w, id)?;
                    }
                }
                M::EndpointKeepAliveAck(EndpointKeepAliveAck { pool_handle, pe_id })
                | M::EndpointUnreachable(EndpointUnreachable { pool_handle, pe_id }) => {
                    encode_pool_handle(w, pool_handle.as_bytes())?;
                    encode_pe_identifier(w, *pe_id)?;
                }
                M::ServerAnnounce(m) => {
                    w.u32(m.server_id.0);
                    for t in &m.transports {
                        t.encode(w)?;
                    }
                }
                M::Cookie(Cookie { cookie }) | M::CookieEcho(CookieEcho { cookie }) => {
                    encode_cookie(w, cookie)?;
                }
                M::BusinessCard(m) => {
                    encode_pool_handle(w, m.pool_handle.as_bytes())?;
                    for pe in &m.pool_elements {
                        pe.encode(w, config)?;
                    }
                }
                M::Error(m) => m.error.encode(w)?,
            }
            Ok(())
        })
    }
}

impl std::fmt::Display for AsapMessage {
    /// One line: the message name and its contents, for logs and `rserpool decode`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        use AsapMessage as M;
        write!(f, "{}", self.name())?;
        let err = |f: &mut std::fmt::Formatter<'_>, e: &Option<OperationError>| match e {
            Some(e) => write!(f, " error [{e}]"),
            None => Ok(()),
        };
        match self {
            M::Registration(m) => write!(f, " pool {} {}", m.pool_handle, m.pool_element),
            M::Deregistration(m) => write!(f, " pool {} PE {}", m.pool_handle, m.pe_id),
            M::RegistrationResponse(m) => {
                write!(f, " pool {} PE {}", m.pool_handle, m.pe_id)?;
                if m.reject {
                    f.write_str(" REJECTED")?;
                }
                err(f, &m.error)
            }
            M::DeregistrationResponse(m) => {
                write!(f, " pool {} PE {}", m.pool_handle, m.pe_id)?;
                err(f, &m.error)
            }
            M::HandleResolution(m) => {
                write!(f, " pool {}", m.pool_handle)?;
                if m.subscribe {
                    f.write_str(" subscribe")?;
                }
                match m.option {
                    Some(o) if o.items == HandleResolutionOption::ALL => f.write_str(" items all"),
                    Some(o) => write!(f, " items {}", o.items),
                    None => Ok(()),
                }
            }
            M::HandleResolutionResponse(m) => {
                write!(f, " pool {}", m.pool_handle)?;
                if let Some(p) = &m.overall_policy {
                    write!(f, " policy {p}")?;
                }
                write!(f, " {} PEs", m.pool_elements.len())?;
                for pe in &m.pool_elements {
                    write!(f, "; {pe}")?;
                }
                err(f, &m.error)
            }
            M::EndpointKeepAlive(m) => {
                write!(f, " from {} pool {}", m.server_id, m.pool_handle)?;
                if let Some(id) = m.pe_id {
                    write!(f, " PE {id}")?;
                }
                if m.home {
                    f.write_str(" home")?;
                }
                Ok(())
            }
            M::EndpointKeepAliveAck(m) => write!(f, " pool {} PE {}", m.pool_handle, m.pe_id),
            M::EndpointUnreachable(m) => write!(f, " pool {} PE {}", m.pool_handle, m.pe_id),
            M::ServerAnnounce(m) => {
                write!(f, " from {}", m.server_id)?;
                for t in &m.transports {
                    write!(f, " {t}")?;
                }
                Ok(())
            }
            M::Cookie(Cookie { cookie }) | M::CookieEcho(CookieEcho { cookie }) => {
                write!(f, " {} bytes", cookie.len())
            }
            M::BusinessCard(m) => {
                write!(f, " pool {} {} PEs", m.pool_handle, m.pool_elements.len())?;
                for pe in &m.pool_elements {
                    write!(f, "; {pe}")?;
                }
                Ok(())
            }
            M::Error(m) => write!(f, " [{}]", m.error),
        }
    }
}
