//! The two client sides of RSerPool as sans-IO cores: a pool element that registers with a
//! registrar and answers its keep-alives ([`pe::PoolElementCore`], RFC 5352 §3.1–§3.4), and a
//! pool user's handle-resolution client with a cache ([`pu::Resolver`], RFC 5352 §3.3, §3.5).
//! Each takes events and the current time and is polled for messages to send, reports and its
//! next deadline; tokio drivers run them over a transport.

#![warn(missing_docs)]

#[cfg(feature = "runtime")]
pub mod driver;
pub mod pe;
pub mod pu;
pub mod server;
pub mod session;
