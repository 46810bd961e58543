//! Pool members as the core sees them: what the member source says (spec), and what the
//! gateway has observed (liveness evidence and the state machine built on it).

use super::Time;
use rserpool_wire::{PoolElement, PoolElementId, PoolPolicy, TransportProtocol};
use serde::Serialize;
use std::fmt;
use std::net::SocketAddr;
use std::time::Duration;

/// The gateway's own number for a member: stable while the member exists, never reused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct MemberId(pub u32);

impl fmt::Display for MemberId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "m{}", self.0)
    }
}

/// Route cost to a member (RFC 2391 §4: "an unreachable path has infinite cost").
/// In JSON a finite cost is a number and no path is the string `"unreachable"`, as in the
/// configuration file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Cost {
    /// A finite cost; lower is better.
    Finite(u32),
    /// No path: the member gets no new sessions under any policy.
    Unreachable,
}

impl fmt::Display for Cost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Cost::Finite(c) => write!(f, "{c}"),
            Cost::Unreachable => f.write_str("unreachable"),
        }
    }
}

impl Serialize for Cost {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Cost::Finite(c) => s.serialize_u32(*c),
            Cost::Unreachable => s.serialize_str("unreachable"),
        }
    }
}

impl Default for Cost {
    fn default() -> Self {
        Cost::Finite(0)
    }
}

/// A member as its source describes it: where it is and the operator's (or registrar's) values.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemberSpec {
    /// Identity across updates: the address for static members, the PE identifier for
    /// RSerPool members. Two specs with the same key are the same member.
    pub key: String,
    /// Where sessions are relayed to (the member's user transport address and port).
    pub address: SocketAddr,
    /// Capacity weight; 0 means draining (no new bindings, bound sessions continue).
    pub weight: u32,
    /// Route cost, for the route-cost policy; `Unreachable` excludes the member everywhere.
    pub cost: Cost,
    /// Per-member session ceiling, overriding `limits.max_sessions_per_member`.
    pub max_sessions: Option<u32>,
    /// The member's RSerPool policy values (RSerPool members only), used by the "pool" policy.
    pub pool_policy: Option<PoolPolicy>,
    /// The RSerPool Pool Element Identifier (RSerPool members only).
    pub pool_element: Option<PoolElementId>,
}

impl MemberSpec {
    /// A static member at `address` with weight 1 and cost 0, keyed by its address.
    pub fn new(address: SocketAddr) -> Self {
        MemberSpec {
            key: address.to_string(),
            address,
            weight: 1,
            cost: Cost::default(),
            max_sessions: None,
            pool_policy: None,
            pool_element: None,
        }
    }

    /// A member from an RSerPool Pool Element (as a handle resolution returns it), honouring
    /// its user transport: the relay goes to the transport's first address and port, the key is
    /// the PE identifier, and the PE's policy values ride along for the "pool" policy. The
    /// weight is the policy's weight where it has one (weighted policies), else 1. `protocol`
    /// is the listener's: a PE whose transport is another protocol (SCTP, DCCP, opaque) cannot
    /// be relayed to by this gateway and is refused with the reason.
    pub fn from_pool_element(
        pe: &PoolElement,
        protocol: super::Protocol,
    ) -> Result<MemberSpec, String> {
        let t = pe
            .user_transport
            .as_address()
            .ok_or_else(|| format!("PE {}: opaque user transport", pe.id))?;
        let fits = matches!(
            (t.protocol, protocol),
            (TransportProtocol::Tcp, super::Protocol::Tcp)
                | (TransportProtocol::Udp, super::Protocol::Udp)
        );
        if !fits {
            return Err(format!(
                "PE {}: user transport {} does not carry {}",
                pe.id,
                t.protocol.name(),
                protocol.name()
            ));
        }
        let ip = *t
            .addresses
            .first()
            .ok_or_else(|| format!("PE {}: user transport without an address", pe.id))?;
        if t.port == 0 {
            return Err(format!("PE {}: user transport port 0", pe.id));
        }
        Ok(MemberSpec {
            key: format!("pe:{}", pe.id),
            address: SocketAddr::new(ip, t.port),
            weight: pe.policy.weight().unwrap_or(1),
            cost: Cost::default(),
            max_sessions: None,
            pool_policy: Some(pe.policy.clone()),
            pool_element: Some(pe.id),
        })
    }

    /// Sets the weight (builder style).
    pub fn weight(mut self, weight: u32) -> Self {
        self.weight = weight;
        self
    }

    /// Sets the route cost (builder style).
    pub fn cost(mut self, cost: Cost) -> Self {
        self.cost = cost;
        self
    }
}

/// What the gateway currently believes about a member's liveness. Draining is not a liveness
/// state: it is the operator's (weight 0) and is reported beside this.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Health {
    /// The last evidence was good.
    Alive,
    /// Some failures, fewer than `fall`: still eligible, watched.
    Suspect,
    /// Judged dead: no new bindings; bound sessions are reported lost.
    Dead,
    /// Back from dead on probation: eligible with a slowly rising share (slow start);
    /// one failure makes it dead again.
    Probation,
}

impl Health {
    /// Lower-case name used in logs and metrics.
    pub fn name(self) -> &'static str {
        match self {
            Health::Alive => "alive",
            Health::Suspect => "suspect",
            Health::Dead => "dead",
            Health::Probation => "probation",
        }
    }
}

/// One piece of liveness evidence about a member.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Evidence {
    /// An active probe succeeded.
    ProbeSucceeded,
    /// An active probe failed (reason given).
    ProbeFailed {
        /// Why, e.g. "connection refused", "timed out", "unexpected reply".
        reason: String,
    },
    /// A relay connect to the member completed (passive). Recorded and counted, but neutral
    /// for the state machine: a connect is not an answer.
    ConnectSucceeded,
    /// A relay connect to the member failed (passive).
    ConnectFailed {
        /// Why, e.g. "connection refused", "timed out".
        reason: String,
    },
    /// The member sent its first byte or datagram on a session (passive).
    Answered,
    /// Client data was forwarded to the member and nothing came back within
    /// `health.response_timeout` (passive; RFC 2391 §5's "no datagram within a few seconds").
    Unanswered,
    /// The member's registrar reports it registered (RSerPool members).
    RegistrarRegistered,
    /// The member's registrar reports it gone (RSerPool members): judged dead at once.
    RegistrarGone,
}

impl Evidence {
    /// Whether this is evidence of life. A completed connect is not: the member's kernel
    /// accepts connections for a stopped or wedged application, so only an answer, a probe
    /// that passed or the registrar's word counts.
    pub fn is_success(&self) -> bool {
        matches!(
            self,
            Evidence::ProbeSucceeded | Evidence::Answered | Evidence::RegistrarRegistered
        )
    }

    /// Whether this is evidence of failure.
    pub fn is_failure(&self) -> bool {
        matches!(
            self,
            Evidence::ProbeFailed { .. }
                | Evidence::ConnectFailed { .. }
                | Evidence::Unanswered
                | Evidence::RegistrarGone
        )
    }

    /// Short name for metrics labels.
    pub fn name(&self) -> &'static str {
        match self {
            Evidence::ProbeSucceeded => "probe_succeeded",
            Evidence::ProbeFailed { .. } => "probe_failed",
            Evidence::ConnectSucceeded => "connect_succeeded",
            Evidence::ConnectFailed { .. } => "connect_failed",
            Evidence::Answered => "answered",
            Evidence::Unanswered => "unanswered",
            Evidence::RegistrarRegistered => "registrar_registered",
            Evidence::RegistrarGone => "registrar_gone",
        }
    }
}

impl fmt::Display for Evidence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Evidence::ProbeSucceeded => f.write_str("probe succeeded"),
            Evidence::ProbeFailed { reason } => write!(f, "probe failed: {reason}"),
            Evidence::ConnectSucceeded => f.write_str("connect succeeded"),
            Evidence::ConnectFailed { reason } => write!(f, "connect failed: {reason}"),
            Evidence::Answered => f.write_str("answered"),
            Evidence::Unanswered => f.write_str("no answer within health.response-timeout"),
            Evidence::RegistrarRegistered => f.write_str("registered at the registrar"),
            Evidence::RegistrarGone => f.write_str("no longer listed by the registrar"),
        }
    }
}

/// A piece of evidence with the time it was observed.
#[derive(Clone, Debug, Serialize)]
pub struct EvidenceRecord {
    /// When (ms since the gateway's epoch).
    pub at_ms: u64,
    /// What.
    #[serde(flatten)]
    pub evidence: Evidence,
}

/// Parameters of the liveness state machine.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LivenessParams {
    /// Consecutive failures that make an alive or suspect member dead.
    pub fall: u32,
    /// Consecutive successes that move a dead member to probation.
    pub rise: u32,
    /// Length of probation (slow start); zero returns a member straight to alive.
    pub slow_start: Duration,
    /// Without active probes, how long a dead member waits before probation.
    pub revive_after: Duration,
    /// Whether active probes run (if not, `revive_after` governs the return from dead).
    pub active_probes: bool,
}

/// The liveness state machine of one member: alive / suspect / dead / probation.
#[derive(Clone, Debug, Serialize)]
pub struct Liveness {
    /// The current state.
    pub health: Health,
    /// Since when (ms since the gateway's epoch).
    pub since_ms: u64,
    /// Consecutive failures seen.
    pub consecutive_failures: u32,
    /// Consecutive successes seen.
    pub consecutive_successes: u32,
    /// The most recent evidence of life.
    pub last_success: Option<EvidenceRecord>,
    /// The most recent evidence of failure.
    pub last_failure: Option<EvidenceRecord>,
    #[serde(skip)]
    since: Time,
}

/// A change of liveness state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Transition {
    /// The state left.
    pub from: Health,
    /// The state entered.
    pub to: Health,
}

pub(crate) fn ms(t: Time) -> u64 {
    u64::try_from(t.as_millis()).unwrap_or(u64::MAX)
}

impl Liveness {
    /// A new member starts alive: configured is not proof of life, but nothing says otherwise
    /// yet, and the first connect or probe will tell.
    pub fn new(now: Time) -> Self {
        Liveness {
            health: Health::Alive,
            since_ms: ms(now),
            consecutive_failures: 0,
            consecutive_successes: 0,
            last_success: None,
            last_failure: None,
            since: now,
        }
    }

    fn enter(&mut self, now: Time, to: Health) -> Option<Transition> {
        if self.health == to {
            return None;
        }
        let t = Transition {
            from: self.health,
            to,
        };
        self.health = to;
        self.since = now;
        self.since_ms = ms(now);
        Some(t)
    }

    /// Feeds one piece of evidence; returns the transition it caused, if any.
    pub fn observe(&mut self, now: Time, ev: Evidence, p: &LivenessParams) -> Option<Transition> {
        if !ev.is_success() && !ev.is_failure() {
            return None;
        }
        let success = ev.is_success();
        let gone = ev == Evidence::RegistrarGone;
        let record = EvidenceRecord {
            at_ms: ms(now),
            evidence: ev,
        };
        if success {
            self.last_success = Some(record);
            self.consecutive_failures = 0;
            self.consecutive_successes = self.consecutive_successes.saturating_add(1);
            match self.health {
                Health::Suspect => self.enter(now, Health::Alive),
                Health::Dead if self.consecutive_successes >= p.rise.max(1) => {
                    if p.slow_start.is_zero() {
                        self.enter(now, Health::Alive)
                    } else {
                        self.enter(now, Health::Probation)
                    }
                }
                _ => None,
            }
        } else {
            self.last_failure = Some(record);
            self.consecutive_successes = 0;
            self.consecutive_failures = self.consecutive_failures.saturating_add(1);
            match self.health {
                _ if gone => self.enter(now, Health::Dead),
                Health::Alive | Health::Suspect => {
                    if self.consecutive_failures >= p.fall.max(1) {
                        self.enter(now, Health::Dead)
                    } else {
                        self.enter(now, Health::Suspect)
                    }
                }
                Health::Probation => self.enter(now, Health::Dead),
                Health::Dead => None,
            }
        }
    }

    /// Applies the state machine's timers: probation ends after `slow_start`; without active
    /// probes, a dead member goes on probation after `revive_after`.
    pub fn tick(&mut self, now: Time, p: &LivenessParams) -> Option<Transition> {
        match self.health {
            Health::Probation if now >= self.since + p.slow_start => self.enter(now, Health::Alive),
            Health::Dead if !p.active_probes && now >= self.since + p.revive_after => {
                if p.slow_start.is_zero() {
                    self.enter(now, Health::Alive)
                } else {
                    self.enter(now, Health::Probation)
                }
            }
            _ => None,
        }
    }

    /// The next time `tick` may change something.
    pub fn next_deadline(&self, p: &LivenessParams) -> Option<Time> {
        match self.health {
            Health::Probation => Some(self.since + p.slow_start),
            Health::Dead if !p.active_probes => Some(self.since + p.revive_after),
            _ => None,
        }
    }

    /// Whether the member may get new bindings as far as health goes.
    pub fn eligible(&self) -> bool {
        !matches!(self.health, Health::Dead)
    }

    /// Slow-start share in (0, 1]: 1 unless on probation, where it rises linearly over
    /// `slow_start` from a floor of 1/20.
    pub fn slow_start_share(&self, now: Time, p: &LivenessParams) -> f64 {
        if self.health != Health::Probation || p.slow_start.is_zero() {
            return 1.0;
        }
        let elapsed = now.saturating_sub(self.since).as_secs_f64();
        (elapsed / p.slow_start.as_secs_f64()).clamp(0.05, 1.0)
    }
}
