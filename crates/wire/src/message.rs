//! The common message header (RFC 5352 §2.1, RFC 5353 §2.1), the [`Message`] trait and the
//! [`Codec`] that decodes and encodes messages under a [`CodecConfig`].

use crate::codec::{padded, Ctx, Reader, UnrecognizedParameter, Writer, HEADER_LEN};
use crate::config::CodecConfig;
use crate::error::{DecodeError, DecodeErrorKind, EncodeError};
use crate::params::Parameter;
use crate::types::Protocol;

pub(crate) mod sealed {
    use super::*;

    /// The per-protocol part of decoding and encoding; not implementable outside this crate.
    pub trait Codable: Sized {
        /// Decodes the body after the header.
        fn decode_body<'a>(
            ctx: &mut Ctx<'a>,
            message_type: u8,
            flags: u8,
            body: Reader<'a>,
        ) -> Result<Self, DecodeError>;
        /// Appends the whole message.
        fn encode_message(
            &self,
            buf: &mut Vec<u8>,
            config: &CodecConfig,
        ) -> Result<(), EncodeError>;
        /// Whether a message type is known (the others follow their action bits).
        fn is_known_type(message_type: u8) -> bool;
    }
}

/// An ASAP or ENRP message.
pub trait Message: sealed::Codable + Clone + std::fmt::Debug + PartialEq {
    /// The protocol the message belongs to.
    const PROTOCOL: Protocol;
    /// The message type byte.
    fn message_type(&self) -> u8;
    /// The message's name as the RFC spells it (e.g. `ASAP_REGISTRATION`).
    fn name(&self) -> &'static str;
}

/// A decoded message and the unknown parameters skipped on the way (action bits `10` and `11`):
/// those with `report` set must be answered with an Operation Error "Unrecognized Parameter"
/// while the message itself is processed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decoded<M> {
    /// The message.
    pub message: M,
    /// Unknown parameters that were skipped.
    pub unrecognized: Vec<UnrecognizedParameter>,
}

impl<M> Decoded<M> {
    /// The skipped parameters the sender asked to be told about.
    pub fn to_report(&self) -> impl Iterator<Item = &UnrecognizedParameter> {
        self.unrecognized.iter().filter(|u| u.report)
    }
}

/// Decodes and encodes ASAP and ENRP messages under one set of limits and units.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Codec {
    config: CodecConfig,
}

impl Codec {
    /// A codec with the given settings.
    pub fn new(config: CodecConfig) -> Self {
        Codec { config }
    }

    /// The codec's settings.
    pub fn config(&self) -> &CodecConfig {
        &self.config
    }

    /// A decoding context for `bytes`, refused if they are longer than `max`.
    fn context<'a>(
        &'a self,
        protocol: Protocol,
        bytes: &'a [u8],
        max: usize,
    ) -> Result<Ctx<'a>, DecodeError> {
        let ctx = Ctx {
            msg: bytes,
            config: &self.config,
            protocol,
            message_type: None,
            unrecognized: Vec::new(),
        };
        if bytes.len() > max {
            return Err(ctx.err(
                0,
                DecodeErrorKind::MessageTooLarge {
                    length: bytes.len(),
                    limit: self.config.message_limit(),
                },
            ));
        }
        Ok(ctx)
    }

    /// Decodes one message. The buffer holds exactly one message, optionally followed by up to 3
    /// zero bytes of padding. Never panics; the error names the message, the parameter and the
    /// byte offset, and [`DecodeError::answer_cause`] gives the Operation Error to answer with.
    pub fn decode<M: Message>(&self, bytes: &[u8]) -> Result<Decoded<M>, DecodeError> {
        let limit = self.config.message_limit();
        // A message may be followed by its padding.
        let mut ctx = self.context(M::PROTOCOL, bytes, padded(limit))?;
        if bytes.len() < HEADER_LEN {
            return Err(ctx.err(
                0,
                DecodeErrorKind::Truncated {
                    needed: HEADER_LEN,
                    available: bytes.len(),
                },
            ));
        }
        let message_type = bytes[0];
        let flags = bytes[1];
        let length = usize::from(u16::from_be_bytes([bytes[2], bytes[3]]));
        ctx.message_type = Some(message_type);
        if length < HEADER_LEN {
            return Err(ctx.err(
                2,
                DecodeErrorKind::BadLength {
                    length,
                    expected: "at least 4 (message length)",
                },
            ));
        }
        if length > limit {
            return Err(ctx.err(2, DecodeErrorKind::MessageTooLarge { length, limit }));
        }
        if length > bytes.len() {
            return Err(ctx.err(
                0,
                DecodeErrorKind::Truncated {
                    needed: length,
                    available: bytes.len(),
                },
            ));
        }
        let tail = &bytes[length..];
        if !tail.is_empty() {
            if length + tail.len() != padded(length) {
                return Err(ctx.err(length, DecodeErrorKind::TrailingBytes { count: tail.len() }));
            }
            if tail.iter().any(|&b| b != 0) {
                return Err(ctx.err(length, DecodeErrorKind::BadPadding));
            }
        }
        if !M::is_known_type(message_type) {
            // RFC 5354 §4 (message type action bits): 00 discard, 01 discard and report;
            // 10 and 11 are reserved and treated as 00.
            let report = message_type >> 6 == 0b01;
            return Err(ctx.err(0, DecodeErrorKind::UnrecognizedMessage { report }));
        }
        let body = ctx.reader(HEADER_LEN, length);
        let message = M::decode_body(&mut ctx, message_type, flags, body)?;
        Ok(Decoded {
            message,
            unrecognized: ctx.unrecognized,
        })
    }

    /// Encodes a message into a new buffer.
    pub fn encode<M: Message>(&self, message: &M) -> Result<Vec<u8>, EncodeError> {
        let mut buf = Vec::with_capacity(128);
        self.encode_into(message, &mut buf)?;
        Ok(buf)
    }

    /// Appends an encoded message to `buf`; on error `buf` is left as it was.
    pub fn encode_into<M: Message>(
        &self,
        message: &M,
        buf: &mut Vec<u8>,
    ) -> Result<(), EncodeError> {
        let start = buf.len();
        message.encode_message(buf, &self.config).inspect_err(|_| {
            buf.truncate(start);
        })
    }

    /// Decodes a sequence of parameters on their own (for instance the parameter quoted in an
    /// error cause). `protocol` only names the context in errors.
    pub fn decode_parameters(
        &self,
        protocol: Protocol,
        bytes: &[u8],
    ) -> Result<Decoded<Vec<Parameter>>, DecodeError> {
        let mut ctx = self.context(protocol, bytes, self.config.message_limit())?;
        let mut r = ctx.reader(0, bytes.len());
        let mut params = Vec::new();
        while let Some(tlv) = r.next_tlv(&mut ctx)? {
            params.push(Parameter::decode(&mut ctx, &tlv)?);
        }
        Ok(Decoded {
            message: params,
            unrecognized: ctx.unrecognized,
        })
    }

    /// Encodes parameters on their own, each padded to 4 bytes.
    pub fn encode_parameters(&self, params: &[Parameter]) -> Result<Vec<u8>, EncodeError> {
        let mut buf = Vec::new();
        let mut w = Writer::parameters(&mut buf);
        for p in params {
            p.encode(&mut w, &self.config)?;
        }
        Ok(buf)
    }

    /// Length of the message whose header starts `bytes`, for framing a byte stream (RFC 5352
    /// §3.3: over TCP the message length delimits messages). `None` until 4 bytes are there.
    pub fn frame_length(bytes: &[u8]) -> Option<usize> {
        (bytes.len() >= HEADER_LEN)
            .then(|| padded(usize::from(u16::from_be_bytes([bytes[2], bytes[3]]))))
    }
}

/// Runs an encoder on a message writer, dropping partial output on error.
pub(crate) fn write_message(
    buf: &mut Vec<u8>,
    config: &CodecConfig,
    message_type: u8,
    flags: u8,
    body: impl FnOnce(&mut Writer<'_>) -> Result<(), EncodeError>,
) -> Result<(), EncodeError> {
    let mut w = Writer::message(buf, message_type, flags);
    match body(&mut w) {
        Ok(()) => w.finish(config),
        Err(e) => {
            w.abandon();
            Err(e)
        }
    }
}

/// Reads a flag bit.
pub(crate) fn flag(flags: u8, bit: u8) -> bool {
    flags & bit != 0
}

/// Builds a flags byte from (bit, set) pairs.
pub(crate) fn flags_of(bits: &[(u8, bool)]) -> u8 {
    bits.iter()
        .filter(|(_, set)| *set)
        .fold(0, |f, (b, _)| f | b)
}
