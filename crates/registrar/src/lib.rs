//! The RSerPool registrar: ASAP towards pool elements and pool users (RFC 5352), built as a
//! sans-IO core ([`Registrar`]) that a thin tokio driver runs, and ENRP between registrars
//! (RFC 5353) as a second sans-IO core beside it ([`enrp::Enrp`]).

#![warn(missing_docs)]

pub mod access;
mod config;
mod core;
#[cfg(feature = "runtime")]
pub mod driver;
mod encoded_pes;
pub mod enrp;
#[cfg(feature = "runtime")]
mod http;
mod metrics;
#[cfg(feature = "runtime")]
mod outbox;
mod rate;
mod security;

pub use crate::access::{AccessRefusal, AccessRules};
pub use crate::config::{AddressScope, AnnounceConfig, Profile, RateLimit, RegistrarConfig};
pub use crate::core::{
    Destination, LearnRefused, OwnChange, PeerInfo, Registrar, RegistrarEvent, Transmit,
};
pub use crate::metrics::{Metrics, RateLimited, RemovalCause, SecurityRefusal};
pub use rserpool_wire::{AssociationId, AssociationKind};
