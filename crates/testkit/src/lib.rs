//! What the tests of several crates need to drive real sockets on loopback, written once:
//!
//! - [`TestRegistrar`]: the registrar's tokio driver on 127.0.0.1 with ephemeral ports, its
//!   configuration changed by a test, stopped when dropped;
//! - [`AsapClient`]: a raw ASAP peer over the TCP mapping, to say exactly what a PE or PU sends,
//!   with timeouts and typed errors;
//! - PE builders ([`tcp_pe`], [`pe_config`], [`registered_pe`]) and, re-exported from
//!   `rserpool_sim::fixtures`, the ASAP message builders;
//! - [`wait_for`] and [`until`]: poll a condition against a deadline instead of sleeping;
//! - [`NamedService`]: a TCP service that answers each connection with its name;
//! - [`http`]: one GET (async or blocking) against the HTTP endpoint every daemon serves.
//!
//! For tests only (a dev-dependency): the helpers return typed errors where a test may want to
//! see a failure, and panic only where they are assertions themselves ([`wait_for`], [`until`],
//! [`TestRegistrar::start`]).

mod client;
pub mod http;
mod pe;
mod registrar;
mod service;
mod wait;

pub use client::{AsapClient, ClientError};
pub use pe::{pe_config, registered_pe, tcp_pe, PeError};
pub use registrar::TestRegistrar;
pub use service::NamedService;
pub use wait::{until, wait_for};

/// The ASAP message builders of `rserpool_sim::fixtures`, so that a test needs one import.
pub use rserpool_sim::fixtures::{
    deregistration, endpoint_keep_alive_ack, endpoint_unreachable, handle_resolution, registration,
};

use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

/// The address every daemon and client of a test binds: nothing leaves the host.
pub const LOCALHOST: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

/// A generous deadline for one wait of a test: loaded CI machines and the SCTP VM run binaries
/// several times slower than a developer's machine.
pub const WAIT: Duration = Duration::from_secs(30);
