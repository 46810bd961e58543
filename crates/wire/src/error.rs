//! Typed decoding and encoding errors, and the Operation Error cause a receiver answers with.

use crate::operation_error::{CauseCode, ErrorCause};
use crate::types::{ParameterType, Protocol};
use std::fmt;

/// Where a parameter sits inside a message: byte offset of its header and its length including
/// padding that lies within the message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Span {
    /// Offset of the first byte (the parameter's type field) from the start of the message.
    pub offset: usize,
    /// Number of bytes, from the type field to the end of the value.
    pub len: usize,
}

/// What went wrong while decoding.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum DecodeErrorKind {
    /// Fewer bytes are available than the structure needs.
    Truncated {
        /// Bytes needed from `offset` on.
        needed: usize,
        /// Bytes available from `offset` on.
        available: usize,
    },
    /// A length field is smaller than its header or does not fit the fixed size of its type.
    BadLength {
        /// The length field's value.
        length: usize,
        /// What the type requires, described.
        expected: &'static str,
    },
    /// The message is larger than the configured maximum.
    MessageTooLarge {
        /// Length of the message in bytes.
        length: usize,
        /// The configured maximum.
        limit: usize,
    },
    /// Padding bytes are not zero, or padding is cut short by the end of the enclosing structure.
    BadPadding,
    /// Bytes follow the message that are neither its padding nor another message.
    TrailingBytes {
        /// How many bytes follow.
        count: usize,
    },
    /// The message type is not known; the action bits say whether to report it.
    UnrecognizedMessage {
        /// Whether the sender asked for an Operation Error "Unrecognized Message" (action `01`).
        report: bool,
    },
    /// A parameter type is not known and its action bits say to stop processing.
    UnrecognizedParameter {
        /// Whether the sender asked for an Operation Error "Unrecognized Parameter" (action `01`).
        report: bool,
    },
    /// A parameter that the message or parameter must carry is absent.
    MissingParameter(ParameterType),
    /// A known parameter appears where it has no place (or more often than allowed).
    UnexpectedParameter(ParameterType),
    /// A field holds a value outside its range.
    InvalidValue {
        /// The field, named as in RFC 5354.
        field: &'static str,
        /// The offending value.
        value: u64,
    },
    /// A variable-length field exceeds its configured limit.
    TooLong {
        /// The field, named as in RFC 5354.
        field: &'static str,
        /// Its length in bytes.
        length: usize,
        /// The configured maximum.
        limit: usize,
    },
}

impl fmt::Display for DecodeErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DecodeErrorKind::Truncated { needed, available } => {
                write!(f, "truncated: needs {needed} bytes, {available} remain")
            }
            DecodeErrorKind::BadLength { length, expected } => {
                write!(f, "bad length {length} (expected {expected})")
            }
            DecodeErrorKind::MessageTooLarge { length, limit } => {
                write!(
                    f,
                    "message of {length} bytes exceeds the limit of {limit} bytes"
                )
            }
            DecodeErrorKind::BadPadding => f.write_str("bad padding (not zero, or cut short)"),
            DecodeErrorKind::TrailingBytes { count } => {
                write!(f, "{count} bytes follow the end of the message")
            }
            DecodeErrorKind::UnrecognizedMessage { report } => write!(
                f,
                "unrecognized message type ({})",
                if *report {
                    "to be reported"
                } else {
                    "discarded silently"
                }
            ),
            DecodeErrorKind::UnrecognizedParameter { report } => write!(
                f,
                "unrecognized parameter type that stops processing ({})",
                if *report {
                    "to be reported"
                } else {
                    "discarded silently"
                }
            ),
            DecodeErrorKind::MissingParameter(t) => write!(f, "missing {t}"),
            DecodeErrorKind::UnexpectedParameter(t) => write!(f, "unexpected {t}"),
            DecodeErrorKind::InvalidValue { field, value } => {
                write!(f, "invalid {field} {value} ({value:#x})")
            }
            DecodeErrorKind::TooLong {
                field,
                length,
                limit,
            } => write!(
                f,
                "{field} of {length} bytes exceeds the limit of {limit} bytes"
            ),
        }
    }
}

/// A message that could not be decoded: what was wrong, in which message and parameter, and where.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct DecodeError {
    /// ASAP or ENRP.
    pub protocol: Protocol,
    /// The message type byte, once the header has been read.
    pub message_type: Option<u8>,
    /// The innermost parameter being decoded when the error was found.
    pub parameter: Option<ParameterType>,
    /// Where that parameter is in the message (used to quote it in an Operation Error).
    pub parameter_span: Option<Span>,
    /// Byte offset of the error from the start of the message.
    pub offset: usize,
    /// What was wrong.
    pub kind: DecodeErrorKind,
}

impl DecodeError {
    pub(crate) fn new(protocol: Protocol, offset: usize, kind: DecodeErrorKind) -> Self {
        DecodeError {
            protocol,
            message_type: None,
            parameter: None,
            parameter_span: None,
            offset,
            kind,
        }
    }

    /// Whether the sender should be told (an ASAP or ENRP ERROR) rather than the message dropped
    /// silently, as the action bits of unknown types demand.
    pub fn should_report(&self) -> bool {
        !matches!(
            self.kind,
            DecodeErrorKind::UnrecognizedMessage { report: false }
                | DecodeErrorKind::UnrecognizedParameter { report: false }
        )
    }

    /// The Operation Error cause a receiver answers this error with, quoting the offending
    /// message or parameter from `message` (the bytes that failed to decode), or `None` when the
    /// action bits say to discard silently.
    ///
    /// Unrecognized message → 0x2 with the message; unrecognized parameter → 0x1 with the
    /// parameter; a configured limit exceeded (message size, pool handle size) → 0x6 Lack of
    /// Resources; anything else → 0x3 Invalid Values with the offending parameter if known
    /// (RFC 5352 §2.2.14, RFC 5353 §2.2.10, RFC 5354 §3.12).
    pub fn answer_cause(&self, message: &[u8]) -> Option<ErrorCause> {
        if !self.should_report() {
            return None;
        }
        let quote = |span: Option<Span>| -> Vec<u8> {
            span.and_then(|s| message.get(s.offset..s.offset.saturating_add(s.len)))
                .map(|b| b[..b.len().min(ErrorCause::MAX_INFO)].to_vec())
                .unwrap_or_default()
        };
        Some(match self.kind {
            DecodeErrorKind::UnrecognizedMessage { .. } => ErrorCause {
                code: CauseCode::UnrecognizedMessage,
                info: message[..message.len().min(ErrorCause::MAX_INFO)].to_vec(),
            },
            DecodeErrorKind::UnrecognizedParameter { .. } => ErrorCause {
                code: CauseCode::UnrecognizedParameter,
                info: quote(self.parameter_span),
            },
            DecodeErrorKind::MessageTooLarge { .. } | DecodeErrorKind::TooLong { .. } => {
                ErrorCause::new(CauseCode::LackOfResources)
            }
            _ => ErrorCause {
                code: CauseCode::InvalidValues,
                info: quote(self.parameter_span),
            },
        })
    }
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.message_type {
            Some(t) => match self.protocol.message_name(t) {
                Some(name) => write!(f, "{} {name}", self.protocol)?,
                None => write!(f, "{} message type {t:#04x}", self.protocol)?,
            },
            None => write!(f, "{} message", self.protocol)?,
        }
        if let Some(p) = self.parameter {
            write!(f, ", {p}")?;
        }
        write!(f, " at byte {}: {}", self.offset, self.kind)
    }
}

impl std::error::Error for DecodeError {}

/// A typed message that cannot be put on the wire.
#[derive(Debug, Clone, PartialEq, Eq, Hash, thiserror::Error)]
pub enum EncodeError {
    /// The encoded message would exceed the configured or the wire's maximum size.
    #[error("encoded message of {length} bytes exceeds the limit of {limit} bytes")]
    MessageTooLarge {
        /// Encoded length in bytes.
        length: usize,
        /// The limit.
        limit: usize,
    },
    /// A parameter would exceed the 16-bit length field.
    #[error("{parameter} of {length} bytes exceeds 65535 bytes")]
    ParameterTooLarge {
        /// The parameter.
        parameter: ParameterType,
        /// Its encoded length.
        length: usize,
    },
    /// A numeric field cannot hold the value.
    #[error("{field} {value} is out of range")]
    ValueOutOfRange {
        /// The field.
        field: &'static str,
        /// The value.
        value: u64,
    },
    /// A value that the protocol forbids (an empty pool handle, a transport without address…).
    #[error("invalid {field}: {reason}")]
    InvalidValue {
        /// The field.
        field: &'static str,
        /// Why it is invalid.
        reason: &'static str,
    },
}
