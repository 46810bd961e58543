//! Bounded readers and the TLV writer that every message and parameter is built on.
//!
//! Layout rules (RFC 5354 §2, RFC 5352 §2.1): a parameter is Type (16 bits), Length (16 bits,
//! header included, padding excluded), value, then zero padding to a multiple of 4 bytes. An
//! enclosing length (a parameter holding parameters, or the message) includes the padding of what
//! it encloses, as RSPLIB and Wireshark do; the decoder also accepts an enclosing structure that
//! ends right after its last parameter's value, without that parameter's padding.

use crate::config::{CodecConfig, MAX_WIRE_LENGTH};
use crate::error::{DecodeError, DecodeErrorKind, EncodeError, Span};
use crate::types::{ParameterType, Protocol};

/// Length of a message header and of a parameter header.
pub(crate) const HEADER_LEN: usize = 4;

/// Rounds up to the next multiple of 4.
pub(crate) const fn padded(len: usize) -> usize {
    (len + 3) & !3
}

/// A parameter that was skipped because its type is unknown and its action bits say "skip".
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct UnrecognizedParameter {
    /// Its type.
    pub parameter_type: ParameterType,
    /// Offset of its header from the start of the message.
    pub offset: usize,
    /// The parameter as received (header and value, no padding), to quote in an Operation Error.
    pub bytes: Vec<u8>,
    /// Whether the sender asked for an Operation Error "Unrecognized Parameter" (action `11`).
    pub report: bool,
}

/// State of one decoding run: the whole message (for offsets and quotes), the settings, and
/// the unknown parameters skipped so far.
pub struct Ctx<'a> {
    pub msg: &'a [u8],
    pub config: &'a CodecConfig,
    pub protocol: Protocol,
    pub message_type: Option<u8>,
    pub unrecognized: Vec<UnrecognizedParameter>,
}

impl<'a> Ctx<'a> {
    pub fn err(&self, offset: usize, kind: DecodeErrorKind) -> DecodeError {
        let mut e = DecodeError::new(self.protocol, offset, kind);
        e.message_type = self.message_type;
        e
    }

    /// A reader over `msg[start..end]`.
    pub fn reader(&self, start: usize, end: usize) -> Reader<'a> {
        Reader {
            msg: self.msg,
            pos: start,
            end,
        }
    }
}

/// Attaches the parameter being decoded to an error, unless an inner parameter already did.
pub(crate) fn in_param(mut e: DecodeError, tlv: &Tlv<'_>) -> DecodeError {
    if e.parameter.is_none() {
        e.parameter = Some(tlv.ptype);
        e.parameter_span = Some(tlv.span());
    }
    e
}

/// One parameter as found in the message.
#[derive(Debug, Clone, Copy)]
pub struct Tlv<'a> {
    pub ptype: ParameterType,
    /// Offset of the parameter header in the message.
    pub offset: usize,
    /// The value (after the 4-byte header, before padding).
    pub value: &'a [u8],
}

impl Tlv<'_> {
    pub fn value_offset(&self) -> usize {
        self.offset + HEADER_LEN
    }
    pub fn end(&self) -> usize {
        self.value_offset() + self.value.len()
    }
    pub fn span(&self) -> Span {
        Span {
            offset: self.offset,
            len: HEADER_LEN + self.value.len(),
        }
    }
}

/// A bounded cursor over part of a message. Every read checks the bound first.
pub struct Reader<'a> {
    msg: &'a [u8],
    pub pos: usize,
    pub end: usize,
}

impl<'a> Reader<'a> {
    pub fn remaining(&self) -> usize {
        self.end - self.pos
    }

    pub fn is_empty(&self) -> bool {
        self.pos >= self.end
    }

    fn take(&mut self, ctx: &Ctx<'_>, n: usize) -> Result<&'a [u8], DecodeError> {
        if self.remaining() < n {
            return Err(ctx.err(
                self.pos,
                DecodeErrorKind::Truncated {
                    needed: n,
                    available: self.remaining(),
                },
            ));
        }
        let s = &self.msg[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    pub fn u16(&mut self, ctx: &Ctx<'_>) -> Result<u16, DecodeError> {
        let b = self.take(ctx, 2)?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }

    pub fn u32(&mut self, ctx: &Ctx<'_>) -> Result<u32, DecodeError> {
        let b = self.take(ctx, 4)?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }

    pub fn bytes(&mut self, ctx: &Ctx<'_>, n: usize) -> Result<&'a [u8], DecodeError> {
        self.take(ctx, n)
    }

    pub fn rest(&mut self) -> &'a [u8] {
        let s = &self.msg[self.pos..self.end];
        self.pos = self.end;
        s
    }

    /// Reads the next parameter header, value and padding. Unknown types whose action bits say
    /// "skip" are recorded in `ctx.unrecognized` and passed over; those that say "stop" end
    /// decoding with an error. Returns `None` at the end of the region.
    pub fn next_tlv(&mut self, ctx: &mut Ctx<'a>) -> Result<Option<Tlv<'a>>, DecodeError> {
        loop {
            if self.is_empty() {
                return Ok(None);
            }
            let offset = self.pos;
            let ptype = ParameterType(self.u16(ctx)?);
            let e = |kind| {
                let mut e = ctx.err(offset, kind);
                e.parameter = Some(ptype);
                e
            };
            let length = match self.u16(ctx) {
                Ok(l) => usize::from(l),
                Err(err) => return Err(e(err.kind)),
            };
            if length < HEADER_LEN {
                return Err(e(DecodeErrorKind::BadLength {
                    length,
                    expected: "at least 4",
                }));
            }
            let value_len = length - HEADER_LEN;
            if self.remaining() < value_len {
                return Err(e(DecodeErrorKind::Truncated {
                    needed: length,
                    available: self.remaining() + HEADER_LEN,
                }));
            }
            let value = &self.msg[self.pos..self.pos + value_len];
            self.pos += value_len;
            // Padding: up to 3 zero bytes, unless the region ends right after the value.
            let pad = padded(length) - length;
            if pad > 0 && !self.is_empty() {
                if self.remaining() < pad {
                    return Err(e(DecodeErrorKind::BadPadding));
                }
                if self.msg[self.pos..self.pos + pad].iter().any(|&b| b != 0) {
                    let mut err = e(DecodeErrorKind::BadPadding);
                    err.offset = self.pos;
                    return Err(err);
                }
                self.pos += pad;
            }
            let tlv = Tlv {
                ptype,
                offset,
                value,
            };
            if ptype.name().is_some() {
                return Ok(Some(tlv));
            }
            let action = ptype.action();
            if !action.skips() {
                let mut err = e(DecodeErrorKind::UnrecognizedParameter {
                    report: action.report(),
                });
                err.parameter_span = Some(tlv.span());
                return Err(err);
            }
            ctx.unrecognized.push(UnrecognizedParameter {
                parameter_type: ptype,
                offset,
                bytes: self.msg[offset..tlv.end()].to_vec(),
                report: action.report(),
            });
        }
    }
}

/// Encodes one parameter on its own (header, value, padding).
pub(crate) fn parameter_bytes(
    f: impl FnOnce(&mut Writer<'_>) -> Result<(), EncodeError>,
) -> Result<Vec<u8>, EncodeError> {
    let mut buf = Vec::new();
    f(&mut Writer::parameters(&mut buf))?;
    Ok(buf)
}

/// Appends a message to a buffer: header, TLVs with their lengths filled in on completion, and
/// zero padding.
pub(crate) struct Writer<'a> {
    buf: &'a mut Vec<u8>,
    start: usize,
}

impl<'a> Writer<'a> {
    /// Starts a message with the given type and flags; the length is set by [`Writer::finish`].
    pub fn message(buf: &'a mut Vec<u8>, message_type: u8, flags: u8) -> Self {
        let start = buf.len();
        buf.extend_from_slice(&[message_type, flags, 0, 0]);
        Writer { buf, start }
    }

    /// A writer for bare parameters (no message header), e.g. to quote one in an error cause.
    pub fn parameters(buf: &'a mut Vec<u8>) -> Self {
        let start = buf.len();
        Writer { buf, start }
    }

    pub fn u16(&mut self, v: u16) {
        self.buf.extend_from_slice(&v.to_be_bytes());
    }

    pub fn u32(&mut self, v: u32) {
        self.buf.extend_from_slice(&v.to_be_bytes());
    }

    pub fn bytes(&mut self, b: &[u8]) {
        self.buf.extend_from_slice(b);
    }

    /// Starts a parameter; returns the mark to pass to [`Writer::end_tlv`].
    pub fn begin_tlv(&mut self, t: ParameterType) -> usize {
        let mark = self.buf.len();
        self.u16(t.0);
        self.u16(0);
        mark
    }

    /// Fills in the length of the parameter started at `mark` and pads it with zeros.
    pub fn end_tlv(&mut self, mark: usize) -> Result<(), EncodeError> {
        let len = self.buf.len() - mark;
        if len > MAX_WIRE_LENGTH {
            let t = u16::from_be_bytes([self.buf[mark], self.buf[mark + 1]]);
            return Err(EncodeError::ParameterTooLarge {
                parameter: ParameterType(t),
                length: len,
            });
        }
        self.buf[mark + 2..mark + 4].copy_from_slice(&(len as u16).to_be_bytes());
        self.buf.resize(mark + padded(len), 0);
        Ok(())
    }

    /// A whole parameter whose value is the given bytes.
    pub fn tlv(&mut self, t: ParameterType, value: &[u8]) -> Result<(), EncodeError> {
        let mark = self.begin_tlv(t);
        self.bytes(value);
        self.end_tlv(mark)
    }

    /// Fills in the message length and checks it against the limit.
    pub fn finish(self, config: &CodecConfig) -> Result<(), EncodeError> {
        let len = self.buf.len() - self.start;
        let limit = config.message_limit();
        if len > limit {
            self.buf.truncate(self.start);
            return Err(EncodeError::MessageTooLarge { length: len, limit });
        }
        self.buf[self.start + 2..self.start + 4].copy_from_slice(&(len as u16).to_be_bytes());
        self.buf.resize(self.start + padded(len), 0);
        Ok(())
    }

    /// Drops what was written (after an encoding error).
    pub fn abandon(self) {
        self.buf.truncate(self.start);
    }
}
