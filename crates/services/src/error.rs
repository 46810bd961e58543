//! Typed errors of the service codecs and state machines.

/// A message or cookie that could not be decoded: which message, which field, what was wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}: field {field}: {kind}")]
pub struct DecodeError {
    /// The message or cookie being decoded ("Ping", "CalcApp message", "PingPong cookie"...).
    pub message: &'static str,
    /// The field that is wrong ("Type", "Length", "ReplyNo"...).
    pub field: &'static str,
    /// What is wrong with it.
    pub kind: DecodeErrorKind,
}

/// What is wrong with a field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DecodeErrorKind {
    /// The bytes end before the field does.
    #[error("truncated: needs {needed} bytes, {available} available")]
    Truncated {
        /// Bytes needed up to the end of the field.
        needed: usize,
        /// Bytes there are.
        available: usize,
    },
    /// A length field disagrees with the bytes received.
    #[error("declares {declared} bytes, message has {actual}")]
    LengthMismatch {
        /// The value of the length field.
        declared: usize,
        /// The size of what was received.
        actual: usize,
    },
    /// A message type this protocol does not define.
    #[error("unknown type {0}")]
    UnknownType(u8),
    /// A message type that is defined but not valid here (a Pong sent to a PE).
    #[error("unexpected type {0}")]
    UnexpectedType(u8),
    /// A fixed tag is wrong (PingPong cookie `<PP-TD1>`).
    #[error("bad tag {0:02x?}")]
    BadTag(Vec<u8>),
    /// The value is outside what the field allows.
    #[error("invalid value: {0}")]
    Invalid(&'static str),
}

impl DecodeError {
    pub(crate) fn new(message: &'static str, field: &'static str, kind: DecodeErrorKind) -> Self {
        Self {
            message,
            field,
            kind,
        }
    }

    pub(crate) fn truncated(
        message: &'static str,
        field: &'static str,
        needed: usize,
        available: usize,
    ) -> Self {
        Self::new(
            message,
            field,
            DecodeErrorKind::Truncated { needed, available },
        )
    }
}

/// A message that cannot be encoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum EncodeError {
    /// The message does not fit its 16-bit length field.
    #[error("{message} of {size} bytes exceeds the 16-bit length field (max {max})")]
    TooLong {
        /// Which message.
        message: &'static str,
        /// Its size.
        size: usize,
        /// The largest size the length field holds.
        max: usize,
    },
}

/// An event a service could not handle: for logs and counters. What the peer is told is in the
/// service's outputs.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ServiceError {
    /// The message does not decode.
    #[error(transparent)]
    Decode(#[from] DecodeError),
    /// The message came with a PPID this service does not speak.
    #[error("unexpected PPID {ppid} (expected {expected})")]
    WrongPpid {
        /// What came.
        ppid: u32,
        /// What the service speaks.
        expected: u32,
    },
    /// The message is larger than the configured limit.
    #[error("message of {size} bytes exceeds the limit of {limit}")]
    TooLarge {
        /// Its size.
        size: usize,
        /// The limit.
        limit: usize,
    },
    /// No such session (never opened, or already closed).
    #[error("unknown {0}")]
    UnknownSession(crate::SessionId),
    /// The message refers to a job that is not running (on this session).
    #[error("no job {job_id} on this session")]
    UnknownJob {
        /// Its job identifier.
        job_id: u32,
    },
    /// The message is valid but not expected now.
    #[error("unexpected {0}")]
    Unexpected(&'static str),
}
