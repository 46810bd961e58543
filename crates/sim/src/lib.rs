//! Deterministic simulation of RSerPool: registrars (the ASAP core and the ENRP core of
//! `rserpool-registrar`), pool elements and pool users with their PingPong and CalcApp sessions (the cores
//! of `rserpool-endpoint` and `rserpool-services`) run in
//! one thread, in virtual time, over a simulated network that delays, loses, duplicates and
//! reorders datagrams, keeps associations reliable and ordered (loss costs retransmission
//! time), cuts hosts apart and heals them; hosts crash (state lost) and restart. Hosts speak
//! SCTP (some multi-homed, their paths cut and failed over) or the TCP mapping; restarted hosts
//! are seen as kernels see them (SCTP_RESTART, ABORT, RST); hostile hosts attack the
//! registrars. Every random
//! choice comes from one seed, so any run replays exactly. Invariants are checked after every
//! step; a broken one names the seed, the step and the command that replays it. The LSNAT
//! gateway core (`rserpool-lsnat` without its runtime) runs in its own world ([`gateway`]):
//! clients, a simulated data plane and members that crash, restart and pause, over networks
//! that delay, lose and cut members and clients off; the gateway itself crashes (a fresh core
//! restarts) and pauses, and its members may be pool elements registered with a registrar core
//! that it resolves with the pool user core.
//!
//! No tokio, no sockets: the cores are driven directly, as their drivers would.
//!
//! ```
//! let outcome = rserpool_sim::run(rserpool_sim::SimConfig::from_seed(1));
//! assert!(outcome.failure.is_none(), "{}", outcome.failure.unwrap());
//! ```
//!
//! `docs/simulation.md` describes the model, the faults and the invariants.

#![warn(missing_docs)]

mod capture;
mod config;
pub mod fixtures;
pub mod gateway;
mod queue;
mod report;
mod world;

pub use capture::{ASAP_GROUP, ENRP_GROUP, MAX_CHUNK_DATA};
pub use config::{Faults, LinkConfig, Mutation, SimConfig, Transports};
pub use gateway::{run_gateway, GatewayConfig, GatewaySource};
pub use report::{Failure, Outcome, Stats};
pub use world::{HostId, World};

/// Runs one simulation to its end (or its first broken invariant).
pub fn run(config: SimConfig) -> Outcome {
    World::new(config).run()
}
