//! Operation Error parameter (RFC 5354 §3.12) and its error causes.

use crate::codec::{in_param, padded, Ctx, Tlv, Writer, HEADER_LEN};
use crate::error::{DecodeError, DecodeErrorKind, EncodeError};
use crate::types::ParameterType;
use std::fmt;

/// An error cause code (RFC 5354 §3.12).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CauseCode {
    /// 0x0 Unspecified Error.
    Unspecified,
    /// 0x1 Unrecognized Parameter (info: the parameter).
    UnrecognizedParameter,
    /// 0x2 Unrecognized Message (info: the message).
    UnrecognizedMessage,
    /// 0x3 Invalid Values (info: the offending parameter).
    InvalidValues,
    /// 0x4 Non-unique PE Identifier.
    NonUniquePeIdentifier,
    /// 0x5 Inconsistent Pooling Policy (info: the policy parameter).
    InconsistentPoolingPolicy,
    /// 0x6 Lack of Resources.
    LackOfResources,
    /// 0x7 Inconsistent Transport Type (info: the transport parameter).
    InconsistentTransportType,
    /// 0x8 Inconsistent Data/Control Configuration.
    InconsistentDataControlConfiguration,
    /// 0x9 Unknown Pool Handle.
    UnknownPoolHandle,
    /// 0xa Rejected due to security considerations.
    RejectedSecurity,
    /// A code this codec does not know.
    Other(u16),
}

impl CauseCode {
    /// The code's number.
    pub const fn to_u16(self) -> u16 {
        match self {
            CauseCode::Unspecified => 0x0,
            CauseCode::UnrecognizedParameter => 0x1,
            CauseCode::UnrecognizedMessage => 0x2,
            CauseCode::InvalidValues => 0x3,
            CauseCode::NonUniquePeIdentifier => 0x4,
            CauseCode::InconsistentPoolingPolicy => 0x5,
            CauseCode::LackOfResources => 0x6,
            CauseCode::InconsistentTransportType => 0x7,
            CauseCode::InconsistentDataControlConfiguration => 0x8,
            CauseCode::UnknownPoolHandle => 0x9,
            CauseCode::RejectedSecurity => 0xa,
            CauseCode::Other(c) => c,
        }
    }

    /// The code for a number; unknown numbers become [`CauseCode::Other`].
    pub const fn from_u16(c: u16) -> Self {
        match c {
            0x0 => CauseCode::Unspecified,
            0x1 => CauseCode::UnrecognizedParameter,
            0x2 => CauseCode::UnrecognizedMessage,
            0x3 => CauseCode::InvalidValues,
            0x4 => CauseCode::NonUniquePeIdentifier,
            0x5 => CauseCode::InconsistentPoolingPolicy,
            0x6 => CauseCode::LackOfResources,
            0x7 => CauseCode::InconsistentTransportType,
            0x8 => CauseCode::InconsistentDataControlConfiguration,
            0x9 => CauseCode::UnknownPoolHandle,
            0xa => CauseCode::RejectedSecurity,
            c => CauseCode::Other(c),
        }
    }

    /// The RFC's description of the code.
    pub const fn description(self) -> &'static str {
        match self {
            CauseCode::Unspecified => "Unspecified Error",
            CauseCode::UnrecognizedParameter => "Unrecognized Parameter",
            CauseCode::UnrecognizedMessage => "Unrecognized Message",
            CauseCode::InvalidValues => "Invalid Values",
            CauseCode::NonUniquePeIdentifier => "Non-unique PE Identifier",
            CauseCode::InconsistentPoolingPolicy => "Inconsistent Pooling Policy",
            CauseCode::LackOfResources => "Lack of Resources",
            CauseCode::InconsistentTransportType => "Inconsistent Transport Type",
            CauseCode::InconsistentDataControlConfiguration => {
                "Inconsistent Data/Control Configuration"
            }
            CauseCode::UnknownPoolHandle => "Unknown Pool Handle",
            CauseCode::RejectedSecurity => "Rejected due to security considerations",
            CauseCode::Other(_) => "Unknown cause",
        }
    }
}

impl fmt::Display for CauseCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({:#x})", self.description(), self.to_u16())
    }
}

/// One error cause: its code and the information that goes with it (a quoted parameter or
/// message for some codes, nothing for others), kept as bytes.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ErrorCause {
    /// The cause code.
    pub code: CauseCode,
    /// Cause-specific information, as carried on the wire.
    pub info: Vec<u8>,
}

impl ErrorCause {
    /// Largest info that still fits an ASAP or ENRP ERROR message of 65 535 bytes.
    pub const MAX_INFO: usize = 65_512;

    /// A cause without information.
    pub fn new(code: CauseCode) -> Self {
        ErrorCause {
            code,
            info: Vec::new(),
        }
    }

    /// A cause quoting bytes (a parameter or a message).
    pub fn with_info(code: CauseCode, info: impl Into<Vec<u8>>) -> Self {
        ErrorCause {
            code,
            info: info.into(),
        }
    }
}

/// The Operation Error parameter: one or more error causes.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct OperationError {
    /// The causes, at least one.
    pub causes: Vec<ErrorCause>,
}

impl OperationError {
    /// An Operation Error with one cause and no information.
    pub fn new(code: CauseCode) -> Self {
        OperationError {
            causes: vec![ErrorCause::new(code)],
        }
    }

    /// An Operation Error with one cause.
    pub fn from_cause(cause: ErrorCause) -> Self {
        OperationError {
            causes: vec![cause],
        }
    }

    /// The first cause's code (the one that matters when there is only one).
    pub fn code(&self) -> Option<CauseCode> {
        self.causes.first().map(|c| c.code)
    }

    pub(crate) fn decode(ctx: &mut Ctx<'_>, tlv: &Tlv<'_>) -> Result<Self, DecodeError> {
        let mut r = ctx.reader(tlv.value_offset(), tlv.end());
        let mut causes = Vec::new();
        let result = (|| {
            while !r.is_empty() {
                let offset = r.pos;
                let code = CauseCode::from_u16(r.u16(ctx)?);
                let length = usize::from(r.u16(ctx)?);
                if length < HEADER_LEN {
                    return Err(ctx.err(
                        offset + 2,
                        DecodeErrorKind::BadLength {
                            length,
                            expected: "at least 4 (cause length)",
                        },
                    ));
                }
                let info = r.bytes(ctx, length - HEADER_LEN)?.to_vec();
                let pad = padded(length) - length;
                if pad > 0 && !r.is_empty() {
                    let pad_offset = r.pos;
                    let p = r
                        .bytes(ctx, pad)
                        .map_err(|_| ctx.err(pad_offset, DecodeErrorKind::BadPadding))?;
                    if p.iter().any(|&b| b != 0) {
                        return Err(ctx.err(pad_offset, DecodeErrorKind::BadPadding));
                    }
                }
                causes.push(ErrorCause { code, info });
            }
            if causes.is_empty() {
                return Err(ctx.err(
                    tlv.offset + 2,
                    DecodeErrorKind::BadLength {
                        length: HEADER_LEN,
                        expected: "at least one error cause",
                    },
                ));
            }
            Ok(())
        })();
        result.map_err(|e| in_param(e, tlv))?;
        Ok(OperationError { causes })
    }

    pub(crate) fn encode(&self, w: &mut Writer<'_>) -> Result<(), EncodeError> {
        if self.causes.is_empty() {
            return Err(EncodeError::InvalidValue {
                field: "operation error",
                reason: "needs at least one error cause",
            });
        }
        let mark = w.begin_tlv(ParameterType::OPERATION_ERROR);
        for c in &self.causes {
            let len = HEADER_LEN + c.info.len();
            let len16 = u16::try_from(len).map_err(|_| EncodeError::ParameterTooLarge {
                parameter: ParameterType::OPERATION_ERROR,
                length: len,
            })?;
            w.u16(c.code.to_u16());
            w.u16(len16);
            w.bytes(&c.info);
            w.bytes(&[0u8; 3][..padded(len) - len]);
        }
        w.end_tlv(mark)
    }
}

impl fmt::Display for OperationError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, c) in self.causes.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{}", c.code)?;
            if !c.info.is_empty() {
                write!(f, " [{} bytes]", c.info.len())?;
            }
        }
        Ok(())
    }
}
