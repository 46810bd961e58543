//! Pool Element (RFC 5354 §3.10) and Server Information (RFC 5354 §3.11) parameters.

use crate::codec::{in_param, Ctx, Tlv, Writer};
use crate::error::{DecodeError, DecodeErrorKind, EncodeError};
use crate::policy::PoolPolicy;
use crate::transport::{TransportAddress, UserTransport};
use crate::types::{ParameterType, PoolElementId, RegistrarId};
use std::fmt;
use std::time::Duration;

/// How long a registration lasts without re-registration (RFC 5354 §3.10).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RegistrationLife {
    /// −1 on the wire: the registration never expires by itself.
    Infinite,
    /// A finite life; its unit on the wire is a codec setting ([`crate::LifeUnit`]).
    Finite(Duration),
}

impl fmt::Display for RegistrationLife {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RegistrationLife::Infinite => f.write_str("infinite"),
            RegistrationLife::Finite(d) => write!(f, "{} ms", d.as_millis()),
        }
    }
}

/// A pool element as registered: identity, home registrar, life, user transport, policy and
/// the transport its registrar reaches it on.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PoolElement {
    /// PE Identifier.
    pub id: PoolElementId,
    /// Home ENRP Server Identifier (0 = not yet known, as in a PE's own registration).
    pub home_registrar: RegistrarId,
    /// Registration Life.
    pub registration_life: RegistrationLife,
    /// How pool users reach the PE.
    pub user_transport: UserTransport,
    /// The member selection policy and the PE's values for it.
    pub policy: PoolPolicy,
    /// How registrars reach the PE (ASAP transport): filled in by the home registrar from the
    /// association's addresses; absent in a PE's own ASAP_REGISTRATION.
    pub asap_transport: Option<TransportAddress>,
}

impl PoolElement {
    pub(crate) fn decode(ctx: &mut Ctx<'_>, tlv: &Tlv<'_>) -> Result<Self, DecodeError> {
        Self::decode_inner(ctx, tlv).map_err(|e| in_param(e, tlv))
    }

    fn decode_inner(ctx: &mut Ctx<'_>, tlv: &Tlv<'_>) -> Result<Self, DecodeError> {
        let mut r = ctx.reader(tlv.value_offset(), tlv.end());
        let id = PoolElementId(r.u32(ctx)?);
        let home_registrar = RegistrarId(r.u32(ctx)?);
        let life_offset = r.pos;
        let life_raw = r.u32(ctx)? as i32;
        let registration_life = match life_raw {
            -1 => RegistrationLife::Infinite,
            v if v >= 0 => {
                RegistrationLife::Finite(ctx.config.registration_life_unit.to_duration(v as u32))
            }
            v => {
                return Err(ctx.err(
                    life_offset,
                    DecodeErrorKind::InvalidValue {
                        field: "registration life",
                        value: u64::from(v as u32),
                    },
                ))
            }
        };
        let missing = |ctx: &Ctx<'_>, t| ctx.err(tlv.end(), DecodeErrorKind::MissingParameter(t));
        let unexpected = |ctx: &Ctx<'_>, p: &Tlv<'_>| {
            in_param(
                ctx.err(p.offset, DecodeErrorKind::UnexpectedParameter(p.ptype)),
                p,
            )
        };
        // Order per RFC 5354 §3.10: user transport, policy, ASAP transport.
        let user_transport = match r.next_tlv(ctx)? {
            Some(p) if UserTransport::is_user_transport(p.ptype) => UserTransport::decode(ctx, &p)?,
            Some(p) => return Err(unexpected(ctx, &p)),
            None => return Err(missing(ctx, ParameterType::SCTP_TRANSPORT)),
        };
        let policy = match r.next_tlv(ctx)? {
            Some(p) if p.ptype == ParameterType::POOL_MEMBER_SELECTION_POLICY => {
                PoolPolicy::decode(ctx, &p)?
            }
            Some(p) => return Err(unexpected(ctx, &p)),
            None => return Err(missing(ctx, ParameterType::POOL_MEMBER_SELECTION_POLICY)),
        };
        let asap_transport = match r.next_tlv(ctx)? {
            Some(p)
                if UserTransport::is_user_transport(p.ptype)
                    && p.ptype != ParameterType::OPAQUE_TRANSPORT =>
            {
                Some(TransportAddress::decode(ctx, &p)?)
            }
            Some(p) => return Err(unexpected(ctx, &p)),
            None => None,
        };
        if let Some(p) = r.next_tlv(ctx)? {
            return Err(unexpected(ctx, &p));
        }
        Ok(PoolElement {
            id,
            home_registrar,
            registration_life,
            user_transport,
            policy,
            asap_transport,
        })
    }

    pub(crate) fn encode(
        &self,
        w: &mut Writer<'_>,
        config: &crate::CodecConfig,
    ) -> Result<(), EncodeError> {
        self.encode_parts(w, config, true)
    }

    /// The parameter, with or without the ASAP transport (which a PU has no use for).
    pub(crate) fn encode_parts(
        &self,
        w: &mut Writer<'_>,
        config: &crate::CodecConfig,
        with_asap_transport: bool,
    ) -> Result<(), EncodeError> {
        let mark = w.begin_tlv(ParameterType::POOL_ELEMENT);
        w.u32(self.id.0);
        w.u32(self.home_registrar.0);
        let life = match self.registration_life {
            RegistrationLife::Infinite => -1,
            RegistrationLife::Finite(d) => config.registration_life_unit.from_duration(d)?,
        };
        w.u32(life as u32);
        self.user_transport.encode(w)?;
        self.policy.encode(w)?;
        if let Some(t) = self.asap_transport.as_ref().filter(|_| with_asap_transport) {
            t.encode(w)?;
        }
        w.end_tlv(mark)
    }
}

impl fmt::Display for PoolElement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "PE {} home {} life {} user {} policy {}",
            self.id, self.home_registrar, self.registration_life, self.user_transport, self.policy
        )?;
        if let Some(t) = &self.asap_transport {
            write!(f, " asap {t}")?;
        }
        Ok(())
    }
}

/// Server Information (RFC 5354 §3.11): a registrar's identifier and how peers reach it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ServerInformation {
    /// The registrar's identifier.
    pub server_id: RegistrarId,
    /// Its ENRP transport (SCTP in the RFC; TCP under this project's mapping).
    pub transport: TransportAddress,
}

impl ServerInformation {
    pub(crate) fn decode(ctx: &mut Ctx<'_>, tlv: &Tlv<'_>) -> Result<Self, DecodeError> {
        let inner = |ctx: &mut Ctx<'_>| {
            let mut r = ctx.reader(tlv.value_offset(), tlv.end());
            let server_id = RegistrarId(r.u32(ctx)?);
            let transport = match r.next_tlv(ctx)? {
                Some(p)
                    if UserTransport::is_user_transport(p.ptype)
                        && p.ptype != ParameterType::OPAQUE_TRANSPORT =>
                {
                    TransportAddress::decode(ctx, &p)?
                }
                Some(p) => {
                    return Err(in_param(
                        ctx.err(p.offset, DecodeErrorKind::UnexpectedParameter(p.ptype)),
                        &p,
                    ))
                }
                None => {
                    return Err(ctx.err(
                        tlv.end(),
                        DecodeErrorKind::MissingParameter(ParameterType::SCTP_TRANSPORT),
                    ))
                }
            };
            if let Some(p) = r.next_tlv(ctx)? {
                return Err(in_param(
                    ctx.err(p.offset, DecodeErrorKind::UnexpectedParameter(p.ptype)),
                    &p,
                ));
            }
            Ok(ServerInformation {
                server_id,
                transport,
            })
        };
        inner(ctx).map_err(|e| in_param(e, tlv))
    }

    pub(crate) fn encode(&self, w: &mut Writer<'_>) -> Result<(), EncodeError> {
        let mark = w.begin_tlv(ParameterType::SERVER_INFORMATION);
        w.u32(self.server_id.0);
        self.transport.encode(w)?;
        w.end_tlv(mark)
    }
}

impl fmt::Display for ServerInformation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "registrar {} at {}", self.server_id, self.transport)
    }
}
