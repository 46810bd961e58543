//! ENRP messages (RFC 5353 §2): every message type as a typed value, with its flags.
//!
//! Every ENRP message starts with the Sender Server's ID and the Receiver Server's ID (0 when
//! sent by multicast) as fixed 32-bit fields after the common header.

use crate::codec::{Ctx, Reader};
use crate::config::CodecConfig;
use crate::error::{DecodeError, DecodeErrorKind, EncodeError};
use crate::message::{flag, flags_of, sealed::Codable, write_message, Message};
use crate::operation_error::OperationError;
use crate::params::{encode_pe_checksum, encode_pool_handle, Parameter, Params};
use crate::pool_element::{PoolElement, ServerInformation};
use crate::types::{ParameterType, PeChecksum, PoolHandle, Protocol, RegistrarId};

/// ENRP message type numbers (RFC 5353 §2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
#[allow(missing_docs)]
pub enum EnrpMessageType {
    Presence = 0x01,
    HandleTableRequest = 0x02,
    HandleTableResponse = 0x03,
    HandleUpdate = 0x04,
    ListRequest = 0x05,
    ListResponse = 0x06,
    InitTakeover = 0x07,
    InitTakeoverAck = 0x08,
    TakeoverServer = 0x09,
    Error = 0x0a,
}

impl EnrpMessageType {
    /// All message types in numeric order.
    pub const ALL: [EnrpMessageType; 10] = [
        Self::Presence,
        Self::HandleTableRequest,
        Self::HandleTableResponse,
        Self::HandleUpdate,
        Self::ListRequest,
        Self::ListResponse,
        Self::InitTakeover,
        Self::InitTakeoverAck,
        Self::TakeoverServer,
        Self::Error,
    ];

    /// The type for a number, if known.
    pub fn from_u8(t: u8) -> Option<Self> {
        Self::ALL.get(usize::from(t).wrapping_sub(1)).copied()
    }

    /// The RFC's name, e.g. `ENRP_PRESENCE`.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Presence => "ENRP_PRESENCE",
            Self::HandleTableRequest => "ENRP_HANDLE_TABLE_REQUEST",
            Self::HandleTableResponse => "ENRP_HANDLE_TABLE_RESPONSE",
            Self::HandleUpdate => "ENRP_HANDLE_UPDATE",
            Self::ListRequest => "ENRP_LIST_REQUEST",
            Self::ListResponse => "ENRP_LIST_RESPONSE",
            Self::InitTakeover => "ENRP_INIT_TAKEOVER",
            Self::InitTakeoverAck => "ENRP_INIT_TAKEOVER_ACK",
            Self::TakeoverServer => "ENRP_TAKEOVER_SERVER",
            Self::Error => "ENRP_ERROR",
        }
    }
}

const BIT0: u8 = 0x01;
const BIT1: u8 = 0x02;

/// Sender and receiver of an ENRP message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Peers {
    /// Sender Server's ID.
    pub sender: RegistrarId,
    /// Receiver Server's ID (0 when multicast).
    pub receiver: RegistrarId,
}

/// ENRP_PRESENCE (RFC 5353 §2.2.1): a registrar's heartbeat, carrying its PE checksum.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Presence {
    /// Sender and receiver.
    pub peers: Peers,
    /// R flag: the receiver must answer with a PRESENCE of its own.
    pub reply_required: bool,
    /// The sender's checksum over the PEs it owns (RFC 5353 §3.6.2).
    pub checksum: PeChecksum,
    /// The sender's identity and ENRP transport (a MUST when replying).
    pub server_information: Option<ServerInformation>,
}

/// ENRP_HANDLE_TABLE_REQUEST (RFC 5353 §2.2.2).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct HandleTableRequest {
    /// Sender and receiver.
    pub peers: Peers,
    /// W flag: only the PEs the receiver owns (its own children), as used by the audit.
    pub own_children_only: bool,
}

/// One pool in a handle table: the pool handle and its PEs.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct HandleTableEntry {
    /// The pool.
    pub pool_handle: PoolHandle,
    /// Its PEs.
    pub pool_elements: Vec<PoolElement>,
}

/// ENRP_HANDLE_TABLE_RESPONSE (RFC 5353 §2.2.3): part of the handle table, chunked with M.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct HandleTableResponse {
    /// Sender and receiver.
    pub peers: Peers,
    /// R flag: the request was rejected.
    pub reject: bool,
    /// M flag: more responses follow.
    pub more_to_send: bool,
    /// Pools with their PEs, each pool handle followed by its Pool Element parameters.
    pub entries: Vec<HandleTableEntry>,
}

/// Update Action of an ENRP_HANDLE_UPDATE.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum UpdateAction {
    /// 0: add or update the PE.
    AddPe,
    /// 1: delete the PE.
    DelPe,
}

/// ENRP_HANDLE_UPDATE (RFC 5353 §2.2.4): a home registrar announces a change of one of its PEs.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct HandleUpdate {
    /// Sender and receiver.
    pub peers: Peers,
    /// T flag: the sender suggests that the receiver take over this PE (draft-dreibholz-rserpool-enrp-takeover).
    pub takeover_suggested: bool,
    /// Add or delete.
    pub action: UpdateAction,
    /// The pool.
    pub pool_handle: PoolHandle,
    /// The PE.
    pub pool_element: PoolElement,
}

/// ENRP_LIST_REQUEST (RFC 5353 §2.2.5): asks for the registrars a peer knows.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ListRequest {
    /// Sender and receiver.
    pub peers: Peers,
}

/// ENRP_LIST_RESPONSE (RFC 5353 §2.2.6).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ListResponse {
    /// Sender and receiver.
    pub peers: Peers,
    /// R flag: the request was rejected.
    pub reject: bool,
    /// The registrars the sender knows.
    pub servers: Vec<ServerInformation>,
}

/// ENRP_INIT_TAKEOVER, ENRP_INIT_TAKEOVER_ACK and ENRP_TAKEOVER_SERVER (RFC 5353 §2.2.7–§2.2.9):
/// the same layout, naming the registrar being taken over.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Takeover {
    /// Sender and receiver.
    pub peers: Peers,
    /// The registrar whose PEs are taken over.
    pub target: RegistrarId,
}

/// ENRP_ERROR (RFC 5353 §2.2.10).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct EnrpError {
    /// Sender and receiver.
    pub peers: Peers,
    /// What went wrong.
    pub error: OperationError,
}

/// Any ENRP message.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[allow(missing_docs)]
pub enum EnrpMessage {
    Presence(Presence),
    HandleTableRequest(HandleTableRequest),
    HandleTableResponse(HandleTableResponse),
    HandleUpdate(HandleUpdate),
    ListRequest(ListRequest),
    ListResponse(ListResponse),
    InitTakeover(Takeover),
    InitTakeoverAck(Takeover),
    TakeoverServer(Takeover),
    Error(EnrpError),
}

impl EnrpMessage {
    /// The message's type.
    pub fn kind(&self) -> EnrpMessageType {
        use EnrpMessage as M;
        use EnrpMessageType as T;
        match self {
            M::Presence(_) => T::Presence,
            M::HandleTableRequest(_) => T::HandleTableRequest,
            M::HandleTableResponse(_) => T::HandleTableResponse,
            M::HandleUpdate(_) => T::HandleUpdate,
            M::ListRequest(_) => T::ListRequest,
            M::ListResponse(_) => T::ListResponse,
            M::InitTakeover(_) => T::InitTakeover,
            M::InitTakeoverAck(_) => T::InitTakeoverAck,
            M::TakeoverServer(_) => T::TakeoverServer,
            M::Error(_) => T::Error,
        }
    }

    /// Sender and receiver.
    pub fn peers(&self) -> Peers {
        use EnrpMessage as M;
        match self {
            M::Presence(m) => m.peers,
            M::HandleTableRequest(m) => m.peers,
            M::HandleTableResponse(m) => m.peers,
            M::HandleUpdate(m) => m.peers,
            M::ListRequest(m) => m.peers,
            M::ListResponse(m) => m.peers,
            M::InitTakeover(m) | M::InitTakeoverAck(m) | M::TakeoverServer(m) => m.peers,
            M::Error(m) => m.peers,
        }
    }
}

impl Message for EnrpMessage {
    const PROTOCOL: Protocol = Protocol::Enrp;

    fn message_type(&self) -> u8 {
        self.kind() as u8
    }

    fn name(&self) -> &'static str {
        self.kind().name()
    }
}

/// Groups a handle table's parameters: each Pool Handle opens an entry that the following Pool
/// Element parameters belong to.
fn handle_table_entries(ctx: &Ctx<'_>, p: Params) -> Result<Vec<HandleTableEntry>, DecodeError> {
    let mut entries: Vec<HandleTableEntry> = Vec::new();
    for item in p.into_items() {
        match item.param {
            Parameter::PoolHandle(pool_handle) => entries.push(HandleTableEntry {
                pool_handle,
                pool_elements: Vec::new(),
            }),
            Parameter::PoolElement(pe) => match entries.last_mut() {
                Some(e) => e.pool_elements.push(pe),
                None => {
                    let mut e = ctx.err(
                        item.span.offset,
                        DecodeErrorKind::MissingParameter(ParameterType::POOL_HANDLE),
                    );
                    e.parameter = Some(item.ptype);
                    e.parameter_span = Some(item.span);
                    return Err(e);
                }
            },
            _ => {
                let mut e = ctx.err(
                    item.span.offset,
                    DecodeErrorKind::UnexpectedParameter(item.ptype),
                );
                e.parameter = Some(item.ptype);
                e.parameter_span = Some(item.span);
                return Err(e);
            }
        }
    }
    Ok(entries)
}

impl Codable for EnrpMessage {
    fn is_known_type(t: u8) -> bool {
        EnrpMessageType::from_u8(t).is_some()
    }

    fn decode_body<'a>(
        ctx: &mut Ctx<'a>,
        message_type: u8,
        flags: u8,
        mut body: Reader<'a>,
    ) -> Result<Self, DecodeError> {
        use EnrpMessageType as T;
        let kind = EnrpMessageType::from_u8(message_type).expect("checked by is_known_type");
        let peers = Peers {
            sender: RegistrarId(body.u32(ctx)?),
            receiver: RegistrarId(body.u32(ctx)?),
        };
        let (target, action) = match kind {
            T::InitTakeover | T::InitTakeoverAck | T::TakeoverServer => {
                (Some(RegistrarId(body.u32(ctx)?)), None)
            }
            T::HandleUpdate => {
                let offset = body.pos;
                let action = match body.u16(ctx)? {
                    0 => UpdateAction::AddPe,
                    1 => UpdateAction::DelPe,
                    v => {
                        return Err(ctx.err(
                            offset,
                            DecodeErrorKind::InvalidValue {
                                field: "update action",
                                value: u64::from(v),
                            },
                        ))
                    }
                };
                body.u16(ctx)?; // reserved
                (None, Some(action))
            }
            _ => (None, None),
        };
        let mut p = Params::read(ctx, body)?;
        let c = &*ctx;
        let m = match kind {
            T::Presence => EnrpMessage::Presence(Presence {
                peers,
                reply_required: flag(flags, BIT0),
                checksum: p.required(c, ParameterType::PE_CHECKSUM, Params::pe_checksum)?,
                server_information: p.server_information(),
            }),
            T::HandleTableRequest => EnrpMessage::HandleTableRequest(HandleTableRequest {
                peers,
                own_children_only: flag(flags, BIT0),
            }),
            T::HandleTableResponse => {
                return Ok(EnrpMessage::HandleTableResponse(HandleTableResponse {
                    peers,
                    reject: flag(flags, BIT0),
                    more_to_send: flag(flags, BIT1),
                    entries: handle_table_entries(c, p)?,
                }))
            }
            T::HandleUpdate => EnrpMessage::HandleUpdate(HandleUpdate {
                peers,
                takeover_suggested: flag(flags, BIT0),
                action: action.expect("read above"),
                pool_handle: p.required(c, ParameterType::POOL_HANDLE, Params::pool_handle)?,
                pool_element: p.required(c, ParameterType::POOL_ELEMENT, Params::pool_element)?,
            }),
            T::ListRequest => EnrpMessage::ListRequest(ListRequest { peers }),
            T::ListResponse => EnrpMessage::ListResponse(ListResponse {
                peers,
                reject: flag(flags, BIT0),
                servers: p.all(Params::server_information),
            }),
            T::InitTakeover | T::InitTakeoverAck | T::TakeoverServer => {
                let t = Takeover {
                    peers,
                    target: target.expect("read above"),
                };
                match kind {
                    T::InitTakeover => EnrpMessage::InitTakeover(t),
                    T::InitTakeoverAck => EnrpMessage::InitTakeoverAck(t),
                    _ => EnrpMessage::TakeoverServer(t),
                }
            }
            T::Error => EnrpMessage::Error(EnrpError {
                peers,
                error: p.required(c, ParameterType::OPERATION_ERROR, Params::operation_error)?,
            }),
        };
        p.finish(c)?;
        Ok(m)
    }

    fn encode_message(&self, buf: &mut Vec<u8>, config: &CodecConfig) -> Result<(), EncodeError> {
        use EnrpMessage as M;
        let flags = match self {
            M::Presence(m) => flags_of(&[(BIT0, m.reply_required)]),
            M::HandleTableRequest(m) => flags_of(&[(BIT0, m.own_children_only)]),
            M::HandleTableResponse(m) => flags_of(&[(BIT0, m.reject), (BIT1, m.more_to_send)]),
            M::HandleUpdate(m) => flags_of(&[(BIT0, m.takeover_suggested)]),
            M::ListResponse(m) => flags_of(&[(BIT0, m.reject)]),
            _ => 0,
        };
        write_message(buf, config, self.message_type(), flags, |w| {
            let peers = self.peers();
            w.u32(peers.sender.0);
            w.u32(peers.receiver.0);
            match self {
                M::Presence(m) => {
                    encode_pe_checksum(w, m.checksum)?;
                    if let Some(s) = &m.server_information {
                        s.encode(w)?;
                    }
                }
                M::HandleTableRequest(_) | M::ListRequest(_) => {}
                M::HandleTableResponse(m) => {
                    for e in &m.entries {
                        encode_pool_handle(w, e.pool_handle.as_bytes())?;
                        for pe in &e.pool_elements {
                            pe.encode(w, config)?;
                        }
                    }
                }
                M::HandleUpdate(m) => {
                    w.u16(match m.action {
                        UpdateAction::AddPe => 0,
                        UpdateAction::DelPe => 1,
                    });
                    w.u16(0);
                    encode_pool_handle(w, m.pool_handle.as_bytes())?;
                    m.pool_element.encode(w, config)?;
                }
                M::ListResponse(m) => {
                    for s in &m.servers {
                        s.encode(w)?;
                    }
                }
                M::InitTakeover(m) | M::InitTakeoverAck(m) | M::TakeoverServer(m) => {
                    w.u32(m.target.0);
                }
                M::Error(m) => m.error.encode(w)?,
            }
            Ok(())
        })
    }
}

impl std::fmt::Display for EnrpMessage {
    /// One line: the message name, sender → receiver and contents, for logs and `rserpool decode`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        use EnrpMessage as M;
        let p = self.peers();
        write!(f, "{} {} -> {}", self.name(), p.sender, p.receiver)?;
        match self {
            M::Presence(m) => {
                write!(f, " checksum {:#06x}", m.checksum.0)?;
                if m.reply_required {
                    f.write_str(" reply-required")?;
                }
                if let Some(s) = &m.server_information {
                    write!(f, " {s}")?;
                }
                Ok(())
            }
            M::HandleTableRequest(m) => {
                if m.own_children_only {
                    f.write_str(" own-children-only")?;
                }
                Ok(())
            }
            M::HandleTableResponse(m) => {
                if m.reject {
                    f.write_str(" REJECTED")?;
                }
                if m.more_to_send {
                    f.write_str(" more-to-send")?;
                }
                for e in &m.entries {
                    write!(f, "; pool {} {} PEs", e.pool_handle, e.pool_elements.len())?;
                    for pe in &e.pool_elements {
                        write!(f, "; {pe}")?;
                    }
                }
                Ok(())
            }
            M::HandleUpdate(m) => {
                let action = match m.action {
                    UpdateAction::AddPe => "add",
                    UpdateAction::DelPe => "delete",
                };
                write!(f, " {action} pool {} {}", m.pool_handle, m.pool_element)?;
                if m.takeover_suggested {
                    f.write_str(" takeover-suggested")?;
                }
                Ok(())
            }
            M::ListRequest(_) => Ok(()),
            M::ListResponse(m) => {
                if m.reject {
                    f.write_str(" REJECTED")?;
                }
                for s in &m.servers {
                    write!(f, "; {s}")?;
                }
                Ok(())
            }
            M::InitTakeover(m) | M::InitTakeoverAck(m) | M::TakeoverServer(m) => {
                write!(f, " target {}", m.target)
            }
            M::Error(m) => write!(f, " [{}]", m.error),
        }
    }
}
