//! Receipts: each session's own record of what happened to it, one fact per field.
//!
//! Selected is not bound, bound is not reached, reached is not a good outcome. Each is written
//! when it happens, with its time, and never inferred from another.

use super::member::{Cost, Health, MemberId};
use super::{Protocol, SessionId};
use serde::Serialize;
use std::fmt;
use std::net::SocketAddr;
use std::sync::Arc;

/// Which end of a relayed session.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Side {
    /// The client, towards the virtual address.
    Client,
    /// The pool member.
    Member,
}

impl fmt::Display for Side {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Side::Client => "client",
            Side::Member => "member",
        })
    }
}

/// Why a session was refused before it was bound.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RefusalReason {
    /// `limits.max_sessions` reached.
    MaxSessions,
    /// Every otherwise eligible member is at its own session ceiling.
    MemberLimit,
    /// No member is eligible (none configured, all dead, draining or unreachable).
    NoMember,
    /// The policy could not choose (e.g. "pool" without RSerPool values).
    PolicyUnavailable,
}

impl RefusalReason {
    /// Short name for metrics labels and logs.
    pub fn name(self) -> &'static str {
        match self {
            RefusalReason::MaxSessions => "max_sessions",
            RefusalReason::MemberLimit => "member_limit",
            RefusalReason::NoMember => "no_member",
            RefusalReason::PolicyUnavailable => "policy_unavailable",
        }
    }
}

/// How a session ended. Exactly one per session, recorded once.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Outcome {
    /// Both directions closed in order (FIN both ways).
    Closed,
    /// A reset ended it (ECONNRESET or a broken pipe from that side).
    Reset {
        /// Who reset.
        by: Side,
    },
    /// A reset ended it, seen by the kernel's connection tracking (NAT mode), which does not
    /// record which side sent it.
    ResetUnattributed,
    /// An idle timer ran out.
    IdleTimeout {
        /// The session state whose timer it was.
        state: &'static str,
    },
    /// The member was judged dead, or failed, while the session was bound: the session is lost,
    /// never completed.
    MemberLost {
        /// The evidence or error.
        reason: String,
    },
    /// No connect attempt reached a member.
    ConnectFailed {
        /// The last attempt's error.
        reason: String,
    },
    /// Refused at a limit or for want of a member; never bound.
    Refused {
        /// Which limit.
        reason: RefusalReason,
    },
    /// Another I/O error ended it.
    Aborted {
        /// On which side.
        by: Side,
        /// The error.
        reason: String,
    },
    /// The gateway shut down with the session open.
    Shutdown,
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Outcome::Closed => f.write_str("closed"),
            Outcome::Reset { by } => write!(f, "reset by the {by}"),
            Outcome::ResetUnattributed => f.write_str("reset (side unknown)"),
            Outcome::IdleTimeout { state } => write!(f, "idle timeout ({state})"),
            Outcome::MemberLost { reason } => write!(f, "member lost: {reason}"),
            Outcome::ConnectFailed { reason } => write!(f, "connect failed: {reason}"),
            Outcome::Refused { reason } => write!(f, "refused: {}", reason.name()),
            Outcome::Aborted { by, reason } => write!(f, "aborted on the {by} side: {reason}"),
            Outcome::Shutdown => f.write_str("gateway shut down"),
        }
    }
}

impl Outcome {
    /// Short name for metrics labels.
    pub fn name(&self) -> &'static str {
        match self {
            Outcome::Closed => "closed",
            Outcome::Reset { .. } => "reset",
            Outcome::ResetUnattributed => "reset_unattributed",
            Outcome::IdleTimeout { .. } => "idle_timeout",
            Outcome::MemberLost { .. } => "member_lost",
            Outcome::ConnectFailed { .. } => "connect_failed",
            Outcome::Refused { .. } => "refused",
            Outcome::Aborted { .. } => "aborted",
            Outcome::Shutdown => "shutdown",
        }
    }

    /// Every outcome name, for metrics.
    pub const NAMES: [&'static str; 9] = [
        "closed",
        "reset",
        "reset_unattributed",
        "idle_timeout",
        "member_lost",
        "connect_failed",
        "refused",
        "aborted",
        "shutdown",
    ];
}

/// A member as a policy saw it at selection time.
#[derive(Clone, Debug, Serialize)]
pub struct CandidateInput {
    /// Which member.
    pub member: MemberId,
    /// Its key (address or PE identifier).
    pub key: Arc<str>,
    /// Its liveness state then.
    pub health: Health,
    /// Configured weight.
    pub weight: u32,
    /// Sessions bound then.
    pub sessions: u32,
    /// Traffic over the window then.
    pub traffic: u64,
    /// Route cost.
    pub cost: Cost,
    /// Why it was not offered to the policy, if it was not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub excluded: Option<&'static str>,
}

/// The selection receipt: which member, by which rule, from what.
#[derive(Clone, Debug, Serialize)]
pub struct Selected {
    /// When (ms since the gateway's epoch).
    pub at_ms: u64,
    /// The rule that chose: a policy name, or "persistence".
    pub by: &'static str,
    /// The member chosen.
    pub member: MemberId,
    /// Whether the panic threshold made health be ignored.
    pub panic: bool,
    /// The members considered, with their inputs (at most `limits.receipt_candidates`).
    pub candidates: Vec<CandidateInput>,
    /// Members considered but not listed.
    pub candidates_omitted: usize,
}

/// The binding receipt: the session's tuple now belongs to this member.
#[derive(Clone, Debug, Serialize)]
pub struct Bound {
    /// When.
    pub at_ms: u64,
    /// The member.
    pub member: MemberId,
    /// Its key.
    pub key: Arc<str>,
    /// The address sessions are relayed to.
    pub address: SocketAddr,
}

/// A connect attempt that did not reach its member (the session was then rebound or failed).
#[derive(Clone, Debug, Serialize)]
pub struct FailedAttempt {
    /// When it failed.
    pub at_ms: u64,
    /// The member it was bound to.
    pub member: MemberId,
    /// The error.
    pub reason: String,
}

/// A session's receipts.
#[derive(Clone, Debug, Serialize)]
pub struct Receipt {
    /// The session.
    pub session: SessionId,
    /// TCP or UDP.
    pub protocol: Protocol,
    /// The client's address.
    pub client: SocketAddr,
    /// The virtual address it came to.
    pub virtual_address: SocketAddr,
    /// When the first packet arrived.
    pub opened_ms: u64,
    /// Selection receipts, one per binding attempt (the last is current).
    pub selected: Vec<Selected>,
    /// The current binding.
    pub bound: Option<Bound>,
    /// Attempts that did not connect.
    pub failed_attempts: Vec<FailedAttempt>,
    /// When the member accepted the connection (TCP).
    pub connected_ms: Option<u64>,
    /// When the member's first byte or datagram came back.
    pub reached_ms: Option<u64>,
    /// Bytes from the client to the member.
    pub bytes_to_member: u64,
    /// Bytes from the member to the client.
    pub bytes_to_client: u64,
    /// How it ended, when it has.
    pub outcome: Option<Outcome>,
    /// When it ended.
    pub ended_ms: Option<u64>,
}
