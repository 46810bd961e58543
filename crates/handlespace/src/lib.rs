//! The RSerPool handlespace (RFC 5351 §3, RFC 5352, RFC 5353, RFC 5356): the data every
//! registrar keeps, shared by the registrar, the dump tool, the simulator and the gateway.
//!
//! - Pools under pool handles, each holding PE entries: PE identifier, home registrar,
//!   registration life, user transport, policy values and ASAP transport
//!   ([`rserpool_wire::PoolElement`]), plus the association they were registered over.
//! - RFC 5352 §3.1 consistency (the first PE fixes the pool's policy, transport type and
//!   transport use) and explicit limits, refused with typed [`Error`]s that name their
//!   [`CauseCode`](rserpool_wire::CauseCode).
//! - Indexes by pool and PE identifier, by home registrar, by association and by timer
//!   deadline, and each owner's PE checksum (RFC 5353 §3.6.2) kept incrementally.
//! - Selection by every pool policy of RFC 5356 and RSPLIB's private ones in O(log n) per
//!   returned PE, reporting the inputs of each choice ([`Selection`]).
//! - [`Handlespace::verify`] cross-checks all of it against a full recomputation.
//!
//! No I/O, no clock and no global randomness: time is a [`Duration`](std::time::Duration) since
//! an epoch of the caller's choosing, and selection takes the caller's RNG, so a seeded RNG
//! replays a run exactly.
//!
//! ```
//! use rand::{rngs::SmallRng, SeedableRng};
//! use rserpool_handlespace::{AssociationId, Handlespace, TimerKind};
//! use rserpool_wire::{
//!     PoolElement, PoolElementId, PoolHandle, PoolPolicy, RegistrarId, RegistrationLife,
//!     TransportAddress, TransportUse, UserTransport,
//! };
//! use std::time::Duration;
//!
//! let mut hs = Handlespace::default();
//! let pool = PoolHandle::from("EchoPool");
//! let now = Duration::from_secs(10);
//! for (id, load) in [(1, 0x8000_0000), (2, 0x1000_0000), (3, 0x4000_0000)] {
//!     let pe = PoolElement {
//!         id: PoolElementId(id),
//!         home_registrar: RegistrarId(0x4b6b_12b3),
//!         registration_life: RegistrationLife::Finite(Duration::from_secs(90)),
//!         user_transport: UserTransport::Address(TransportAddress::sctp(
//!             7,
//!             TransportUse::DataOnly,
//!             vec!["10.0.0.1".parse().unwrap()],
//!         )),
//!         policy: PoolPolicy::LeastUsed { load },
//!         asap_transport: None,
//!     };
//!     let entry = hs.register(&pool, pe, Some(AssociationId(id.into())), now)?.entry();
//!     hs.set_timer(entry, TimerKind::KeepAliveTransmission, now + Duration::from_secs(5))?;
//! }
//! let mut rng = SmallRng::seed_from_u64(1);
//! let selection = hs.select(&pool, 2, &mut rng)?;
//! let ids: Vec<u32> = selection.elements.iter().map(|s| s.id.0).collect();
//! assert_eq!(ids, [2, 3]); // least used first
//! assert_eq!(hs.next_timer().unwrap().deadline, Duration::from_secs(15));
//! hs.verify()?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#![deny(unsafe_code)]
#![warn(missing_docs)]

mod checksum;
mod chunked;
mod config;
mod error;
mod fenwick;
mod handlespace;
mod policy;
mod timer;

pub use checksum::compute_checksum;
pub use config::{ChecksumFlavor, HandlespaceConfig};
pub use error::{Error, VerifyError};
pub use handlespace::{
    AssociationId, EntryId, Handlespace, ListIter, OwnerSummary, PoolElementRef, PoolRef,
    Registration, RemovedElement, SelectedElement, Selection, SelectionBasis, Timer,
};
pub use timer::TimerKind;
