//! Codec settings: the limits and unit choices that decoding and encoding follow.

use crate::error::EncodeError;
use std::time::Duration;

/// Largest value the 16-bit length fields of ASAP and ENRP can express.
pub const MAX_WIRE_LENGTH: usize = 0xffff;

/// Unit of the Registration Life field of the Pool Element parameter.
///
/// RFC 5354 §3.9 says seconds; RSPLIB and Wireshark use milliseconds, so a registrar that wants
/// RSPLIB's PEs to stay registered must use milliseconds on the wire (docs/compat.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum LifeUnit {
    /// Milliseconds: what RSPLIB 3.x and Wireshark use (the default).
    #[default]
    Milliseconds,
    /// Seconds: the text of RFC 5354 §3.9.
    Seconds,
}

impl LifeUnit {
    /// Converts a non-negative wire value in this unit into a duration.
    pub fn to_duration(self, value: u32) -> Duration {
        match self {
            LifeUnit::Milliseconds => Duration::from_millis(u64::from(value)),
            LifeUnit::Seconds => Duration::from_secs(u64::from(value)),
        }
    }

    /// Converts a duration into a wire value, rounding up to the next whole unit so that a
    /// registration is never announced shorter than asked. Fails beyond `i32::MAX` units.
    pub fn from_duration(self, life: Duration) -> Result<i32, EncodeError> {
        let units = match self {
            LifeUnit::Milliseconds => life.as_nanos().div_ceil(1_000_000),
            LifeUnit::Seconds => life.as_nanos().div_ceil(1_000_000_000),
        };
        i32::try_from(units).map_err(|_| EncodeError::ValueOutOfRange {
            field: "registration life",
            value: units.min(u128::from(u64::MAX)) as u64,
        })
    }
}

/// Limits and unit choices of a [`crate::Codec`].
///
/// Every limit here bounds what the decoder allocates: no decoded value can be larger than the
/// message it came from, and no message is accepted beyond `max_message_size`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CodecConfig {
    /// Largest message, in bytes, that is decoded or encoded. At most 65 535 (the length field is
    /// 16 bits); the default is that maximum, so a Cookie of up to 65 524 bytes fits.
    pub max_message_size: usize,
    /// Largest pool handle in bytes. RSPLIB's limit is 32 (`MAX_POOLHANDLESIZE`), the default.
    pub max_pool_handle_size: usize,
    /// Unit of the Registration Life field.
    pub registration_life_unit: LifeUnit,
}

impl Default for CodecConfig {
    fn default() -> Self {
        CodecConfig {
            max_message_size: MAX_WIRE_LENGTH,
            max_pool_handle_size: 32,
            registration_life_unit: LifeUnit::Milliseconds,
        }
    }
}

impl CodecConfig {
    /// The settings of RFC 5354's text: registration life in seconds, other limits as the default.
    pub fn rfc() -> Self {
        CodecConfig {
            registration_life_unit: LifeUnit::Seconds,
            ..CodecConfig::default()
        }
    }

    /// The effective message size limit: the configured one, capped at what the wire can carry.
    pub fn message_limit(&self) -> usize {
        self.max_message_size.min(MAX_WIRE_LENGTH)
    }
}
