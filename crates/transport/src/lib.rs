//! How registrars, pool elements and pool users reach each other.
//!
//! One association-oriented, event-based API over three carriers:
//!
//! - **kernel SCTP** (Linux, one-to-many socket), the transport of RFC 5351–5356 and of RSPLIB;
//! - **the TCP mapping** of `docs/tcp-mapping.md`: each message travels in a 12-byte frame that
//!   carries its payload protocol identifier (PPID) and stream, with keep-alives, so the control
//!   channel (PPID 11) and the data of a PU–PE session share one connection (RFC 5352 §3.8);
//! - **plain TCP** for ASAP without any frame header (RFC 5352 §3.3: a PU sends
//!   HANDLE_RESOLUTION to a registrar's TCP port and the ASAP message length frames it).
//!
//! and, beside them, [`multicast`]: UDP datagrams of ASAP_SERVER_ANNOUNCE and ENRP_PRESENCE on the
//! groups of the active profile.
//!
//! An [`Endpoint`] listens and/or connects. All of its associations report through one queue of
//! [`Event`]s: [`Event::AssociationUp`], [`Event::Message`], [`Event::AssociationDown`] (with a
//! [`DownReason`]), [`Event::PeerAddressChange`] and [`Event::SendFailed`]. Messages are sent with
//! [`EndpointHandle::send`] by [`AssociationId`]. Code above cannot tell SCTP from TCP except by asking
//! ([`EndpointHandle::kind`], [`AssociationInfo::kind`]).
//!
//! Guarantees that hold for every carrier:
//!
//! - every [`AssociationId`] returned by [`EndpointHandle::connect`] or announced by
//!   [`Event::AssociationUp`] is followed by exactly one [`Event::AssociationDown`]; an id is never
//!   reused by the same endpoint;
//! - messages of one association arrive whole, in order per stream, with the PPID they were sent
//!   with;
//! - bad input from a peer (oversized message, garbage framing) closes that association only, with
//!   [`DownReason::Protocol`]; nothing in this crate panics on input.
//!
//! ```no_run
//! # async fn demo() -> Result<(), rserpool_transport::TransportError> {
//! use rserpool_transport::{Endpoint, EndpointConfig, Event, TransportChoice};
//!
//! let mut config = EndpointConfig::new(TransportChoice::Auto);
//! config.local_addrs = vec!["127.0.0.1:3863".parse().unwrap()];
//! config.accept = true;
//! let mut endpoint = Endpoint::bind(config).await?;
//! while let Some(event) = endpoint.next_event().await {
//!     if let Event::Message { id, ppid, stream, data } = event {
//!         endpoint.send(id, ppid, stream, data).await?; // echo
//!     }
//! }
//! # Ok(()) }
//! ```

#![warn(missing_docs)]
#![deny(unsafe_op_in_unsafe_fn)]

pub use rserpool_wire::arena;
mod config;
mod endpoint;
mod error;
pub mod multicast;
mod sctp;
mod stats;
pub mod tcp;
pub mod tls;

pub use config::{
    EndpointConfig, Limits, SctpConfig, TcpConfig, TransportChoice, DEFAULT_MAX_MESSAGE_SIZE,
};
pub use endpoint::{
    AssociationId, AssociationInfo, AssociationKind, DownReason, Endpoint, EndpointHandle, Event,
    PathState, SendFailure, TransportKind,
};
pub use error::{SendError, TransportError};
pub use stats::EndpointStats;
pub use tls::{PeerIdentity, TlsError, TlsSettings};

/// Whether the running kernel offers SCTP sockets, and if not, why not.
///
/// Opens (and closes) a one-to-many SCTP socket. `Ok(())` means SCTP endpoints can be created;
/// the error is the reason, e.g. "protocol not supported" on kernels without `CONFIG_IP_SCTP`.
pub fn sctp_available() -> Result<(), std::io::Error> {
    sctp::probe()
}

/// The PPID of ASAP (RFC 5352), 11.
pub const PPID_ASAP: u32 = rserpool_wire::Protocol::Asap.ppid();
/// The PPID of ENRP (RFC 5353), 12.
pub const PPID_ENRP: u32 = rserpool_wire::Protocol::Enrp.ppid();
