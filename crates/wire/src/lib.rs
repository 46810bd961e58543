//! ASAP and ENRP on the wire: every message of RFC 5352 and RFC 5353, every parameter of
//! RFC 5354 and every pool policy of RFC 5356 (plus RSPLIB's private ones) as typed values, with
//! byte-exact encoding and decoding that never panics and never trusts a length.
//!
//! ```
//! use rserpool_wire::{asap, AsapMessage, Codec, PoolHandle};
//!
//! let codec = Codec::default();
//! let msg = AsapMessage::HandleResolution(asap::HandleResolution {
//!     subscribe: false,
//!     pool_handle: PoolHandle::from("EchoPool"),
//!     option: None,
//! });
//! let bytes = codec.encode(&msg).unwrap();
//! assert_eq!(codec.decode::<AsapMessage>(&bytes).unwrap().message, msg);
//! ```

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod arena;
pub mod asap;
mod association;
pub mod capture;
mod codec;
mod config;
pub mod csp;
pub mod enrp;
mod error;
mod identity;
mod message;
mod operation_error;
mod params;
mod policy;
mod pool_element;
mod transport;
mod types;

#[cfg(feature = "arbitrary")]
pub mod arbitrary;

pub use asap::{AsapMessage, EncodedPoolElement, HandleResolutionRef};
pub use association::{AssociationId, AssociationKind, TransportKind};
pub use codec::UnrecognizedParameter;
pub use config::{CodecConfig, LifeUnit, MAX_WIRE_LENGTH};
pub use enrp::EnrpMessage;
pub use error::{DecodeError, DecodeErrorKind, EncodeError, Span};
pub use identity::PeerIdentity;
pub use message::{Codec, Decoded, Message};
pub use operation_error::{CauseCode, ErrorCause, OperationError};
pub use params::Parameter;
pub use policy::{PolicyFields, PolicyType, PoolPolicy};
pub use pool_element::{PoolElement, RegistrationLife, ServerInformation};
pub use transport::{TransportAddress, TransportProtocol, TransportUse, UserTransport};
pub use types::{
    HandleResolutionOption, ParameterType, PeChecksum, PoolElementId, PoolHandle, Protocol,
    RegistrarId, UnrecognizedAction,
};
