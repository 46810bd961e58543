//! Load-share policies: which eligible member gets the next session.
//!
//! Selection is pure: it sees a list of candidates (already filtered for health, draining,
//! limits and reachability) with their inputs, the policy's small state (round-robin position,
//! smooth weighted round-robin counters) and the injected RNG, and returns an index. Nothing
//! here touches the binding table, so a packet-level data plane can reuse it unchanged.

use super::member::{Cost, MemberId};
use rand::{Rng, RngCore};
use rserpool_handlespace::{Handlespace, HandlespaceConfig};
use rserpool_wire::{
    PoolElement, PoolElementId, PoolHandle, PoolPolicy, RegistrarId, RegistrationLife,
    UserTransport,
};
use serde::Serialize;
use std::collections::HashMap;
use std::fmt;
use std::str::FromStr;
use std::time::Duration;

/// A load-share policy (RFC 2391 §4 plus the weighted variants operators expect).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum LoadSharePolicy {
    /// Each member in turn.
    RoundRobin,
    /// Each member in turn, as often as its weight (smooth interleaving).
    WeightedRoundRobin,
    /// The member with the fewest bound sessions.
    LeastSessions,
    /// The member with the fewest bound sessions per unit of weight.
    WeightedLeastSessions,
    /// The member with the least traffic (bytes or packets) over the traffic window.
    LeastTraffic,
    /// The member with the least traffic per unit of weight.
    WeightedLeastTraffic,
    /// The member with the lowest route cost; ties go to the fewest sessions, then in turn.
    RouteCost,
    /// A member drawn uniformly.
    Random,
    /// A member drawn in proportion to its weight.
    WeightedRandom,
    /// The pool's own RSerPool policy, from each member's `PoolPolicy` values. Static members
    /// carry none, so this is refused for a static member list; an RSerPool member source
    /// will supply the values (and later delegate to the handlespace's selection).
    Pool,
}

impl LoadSharePolicy {
    /// Every policy with its configuration name.
    pub const ALL: [(&'static str, LoadSharePolicy); 10] = [
        ("round-robin", LoadSharePolicy::RoundRobin),
        ("weighted-round-robin", LoadSharePolicy::WeightedRoundRobin),
        ("least-sessions", LoadSharePolicy::LeastSessions),
        (
            "weighted-least-sessions",
            LoadSharePolicy::WeightedLeastSessions,
        ),
        ("least-traffic", LoadSharePolicy::LeastTraffic),
        (
            "weighted-least-traffic",
            LoadSharePolicy::WeightedLeastTraffic,
        ),
        ("route-cost", LoadSharePolicy::RouteCost),
        ("random", LoadSharePolicy::Random),
        ("weighted-random", LoadSharePolicy::WeightedRandom),
        ("pool", LoadSharePolicy::Pool),
    ];

    /// The configuration name.
    pub fn name(self) -> &'static str {
        Self::ALL
            .iter()
            .find(|(_, p)| *p == self)
            .map(|(n, _)| *n)
            .unwrap_or("?")
    }
}

impl fmt::Display for LoadSharePolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for LoadSharePolicy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let norm = s.trim().to_ascii_lowercase().replace('_', "-");
        let alias = match norm.as_str() {
            "rr" => "round-robin",
            "wrr" => "weighted-round-robin",
            "lc" | "least-connections" | "leastconn" => "least-sessions",
            "wlc" => "weighted-least-sessions",
            other => other,
        };
        Self::ALL
            .iter()
            .find(|(n, _)| *n == alias)
            .map(|(_, p)| *p)
            .ok_or_else(|| {
                let names: Vec<&str> = Self::ALL.iter().map(|(n, _)| *n).collect();
                format!("unknown policy {s:?}; expected one of {}", names.join(", "))
            })
    }
}

/// What "traffic" means for the least-traffic policies.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum TrafficMetric {
    /// Bytes relayed in both directions.
    #[default]
    Bytes,
    /// Datagrams for UDP; for the TCP relay, read calls (each a batch of segments).
    Packets,
}

/// A member offered to a policy, with every input a policy may read.
#[derive(Clone, Debug, Serialize)]
pub struct Candidate {
    /// Which member.
    pub member: MemberId,
    /// Effective weight (configured weight; never 0 here, draining members are not offered).
    pub weight: u32,
    /// Sessions currently bound.
    pub sessions: u32,
    /// Traffic over the window, in the configured metric.
    pub traffic: u64,
    /// Route cost.
    pub cost: Cost,
    /// RSerPool policy values, if the member has them.
    #[serde(skip)]
    pub pool_policy: Option<PoolPolicy>,
}

/// Per-policy memory between selections.
#[derive(Debug, Default)]
pub struct PolicyState {
    last: Option<MemberId>,
    smooth: HashMap<MemberId, i64>,
    pool: Option<PoolMirror>,
}

impl PolicyState {
    /// Forgets a member that left.
    pub fn forget(&mut self, member: MemberId) {
        self.smooth.remove(&member);
        if let Some(mirror) = self.pool.as_mut() {
            if mirror.members.remove(&member).is_some() {
                let _ = mirror.handlespace.deregister(&mirror.handle, pe_id(member));
            }
        }
    }
}

/// Why a policy could not choose.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SelectError {
    /// No candidates at all.
    #[error("no eligible member")]
    NoCandidates,
    /// The pool policy needs RSerPool policy values that a member lacks.
    #[error("member {0} has no RSerPool policy values (the \"pool\" policy needs an RSerPool member source)")]
    NoPoolPolicy(MemberId),
}

/// Chooses among `candidates` (non-empty, sorted by member id) by `policy`.
pub fn select(
    policy: LoadSharePolicy,
    candidates: &[Candidate],
    state: &mut PolicyState,
    rng: &mut dyn RngCore,
) -> Result<usize, SelectError> {
    if candidates.is_empty() {
        return Err(SelectError::NoCandidates);
    }
    let idx = match policy {
        LoadSharePolicy::RoundRobin => in_turn(candidates, &all(candidates), state),
        LoadSharePolicy::WeightedRoundRobin => smooth_weighted(candidates, state, |c| c.weight),
        LoadSharePolicy::LeastSessions => {
            least_by(candidates, state, |c| (u128::from(c.sessions), 1))
        }
        LoadSharePolicy::WeightedLeastSessions => least_by(candidates, state, |c| {
            (u128::from(c.sessions), u128::from(c.weight))
        }),
        LoadSharePolicy::LeastTraffic => {
            least_by(candidates, state, |c| (u128::from(c.traffic), 1))
        }
        LoadSharePolicy::WeightedLeastTraffic => least_by(candidates, state, |c| {
            (u128::from(c.traffic), u128::from(c.weight))
        }),
        LoadSharePolicy::RouteCost => {
            let best = candidates.iter().map(|c| c.cost).min().unwrap_or_default();
            let tied: Vec<usize> = (0..candidates.len())
                .filter(|&i| candidates[i].cost == best)
                .collect();
            let fewest = tied
                .iter()
                .map(|&i| candidates[i].sessions)
                .min()
                .unwrap_or(0);
            let tied: Vec<usize> = tied
                .into_iter()
                .filter(|&i| candidates[i].sessions == fewest)
                .collect();
            in_turn(candidates, &tied, state)
        }
        LoadSharePolicy::Random => rng.random_range(0..candidates.len()),
        LoadSharePolicy::WeightedRandom => weighted_draw(candidates, rng, |c| c.weight),
        LoadSharePolicy::Pool => select_pool(candidates, state, rng)?,
    };
    state.last = Some(candidates[idx].member);
    Ok(idx)
}

fn all(c: &[Candidate]) -> Vec<usize> {
    (0..c.len()).collect()
}

/// The first of `among` after the last chosen member (by id), wrapping.
fn in_turn(c: &[Candidate], among: &[usize], state: &PolicyState) -> usize {
    let after = |i: &&usize| state.last.is_none_or(|l| c[**i].member > l);
    among
        .iter()
        .find(after)
        .or_else(|| among.first())
        .copied()
        .unwrap_or(0)
}

/// Smallest ratio num/den (compared exactly), ties in turn.
fn least_by(
    c: &[Candidate],
    state: &PolicyState,
    key: impl Fn(&Candidate) -> (u128, u128),
) -> usize {
    let mut best: Vec<usize> = Vec::new();
    let mut best_key = (0u128, 1u128);
    for (i, cand) in c.iter().enumerate() {
        let (n, d) = key(cand);
        let d = d.max(1);
        if best.is_empty() {
            best.push(i);
            best_key = (n, d);
            continue;
        }
        let lhs = n * best_key.1;
        let rhs = best_key.0 * d;
        if lhs < rhs {
            best.clear();
            best.push(i);
            best_key = (n, d);
        } else if lhs == rhs {
            best.push(i);
        }
    }
    in_turn(c, &best, state)
}

/// Smooth weighted round robin: every member's counter grows by its weight, the largest is
/// chosen and pays back the total. Interleaves members instead of sending bursts.
fn smooth_weighted(
    c: &[Candidate],
    state: &mut PolicyState,
    weight: impl Fn(&Candidate) -> u32,
) -> usize {
    let mut total: i64 = 0;
    let mut best = 0usize;
    let mut best_val = i64::MIN;
    for (i, cand) in c.iter().enumerate() {
        let w = i64::from(weight(cand).max(1));
        total += w;
        let cur = state.smooth.entry(cand.member).or_insert(0);
        *cur = cur.saturating_add(w);
        if *cur > best_val {
            best_val = *cur;
            best = i;
        }
    }
    if let Some(cur) = state.smooth.get_mut(&c[best].member) {
        *cur = cur.saturating_sub(total);
    }
    best
}

fn weighted_draw(
    c: &[Candidate],
    rng: &mut dyn RngCore,
    weight: impl Fn(&Candidate) -> u32,
) -> usize {
    let total: u64 = c.iter().map(|x| u64::from(weight(x).max(1))).sum();
    let mut r = rng.random_range(0..total.max(1));
    for (i, cand) in c.iter().enumerate() {
        let w = u64::from(weight(cand).max(1));
        if r < w {
            return i;
        }
        r -= w;
    }
    c.len() - 1
}

/// The "pool" policy: the pool's own RSerPool policy (RFC 5356), chosen by the same handlespace
/// code the registrar uses. The candidates of this session (the members that may take it now)
/// are mirrored into a one-pool handlespace, entering and leaving it as their eligibility
/// changes, so round-robin positions, least-used order, degradation counters and weighted draws
/// are the handlespace's own.
fn select_pool(
    c: &[Candidate],
    state: &mut PolicyState,
    rng: &mut dyn RngCore,
) -> Result<usize, SelectError> {
    let mirror = state.pool.get_or_insert_with(PoolMirror::new);
    mirror.sync(c)?;
    let selection = mirror
        .handlespace
        .select(&mirror.handle, 1, rng)
        .map_err(|_| SelectError::NoCandidates)?;
    let chosen = selection
        .elements
        .first()
        .ok_or(SelectError::NoCandidates)?;
    let member = MemberId(chosen.id.0 - 1);
    c.iter()
        .position(|x| x.member == member)
        .ok_or(SelectError::NoCandidates)
}

/// A one-pool handlespace holding exactly the current candidates of the "pool" policy.
#[derive(Debug)]
pub(crate) struct PoolMirror {
    handlespace: Handlespace,
    handle: PoolHandle,
    members: HashMap<MemberId, PoolPolicy>,
}

impl PoolMirror {
    fn new() -> Self {
        PoolMirror {
            handlespace: Handlespace::new(HandlespaceConfig::default()),
            handle: PoolHandle::from("lsnat"),
            members: HashMap::new(),
        }
    }

    /// Makes the handlespace hold exactly `c`, with their current policy values.
    fn sync(&mut self, c: &[Candidate]) -> Result<(), SelectError> {
        let mut wanted: HashMap<MemberId, &PoolPolicy> = HashMap::with_capacity(c.len());
        for cand in c {
            let policy = cand
                .pool_policy
                .as_ref()
                .ok_or(SelectError::NoPoolPolicy(cand.member))?;
            wanted.insert(cand.member, policy);
        }
        let gone: Vec<MemberId> = self
            .members
            .keys()
            .filter(|m| !wanted.contains_key(m))
            .copied()
            .collect();
        for m in gone {
            self.members.remove(&m);
            let _ = self.handlespace.deregister(&self.handle, pe_id(m));
        }
        for (m, policy) in wanted {
            if self.members.get(&m) == Some(policy) {
                continue;
            }
            let element = PoolElement {
                id: pe_id(m),
                home_registrar: RegistrarId(0),
                registration_life: RegistrationLife::Infinite,
                user_transport: UserTransport::Opaque(Vec::new()),
                policy: policy.clone(),
                asap_transport: None,
            };
            // A member whose policy type differs from the pool's (a registrar would have
            // refused it) is left out of the pool policy's choice.
            if self
                .handlespace
                .register(&self.handle, element, None, Duration::ZERO)
                .is_ok()
            {
                self.members.insert(m, policy.clone());
            }
        }
        Ok(())
    }
}

/// The handlespace identifier of a member (PE identifier 0 is not allowed).
fn pe_id(m: MemberId) -> PoolElementId {
    PoolElementId(m.0 + 1)
}
