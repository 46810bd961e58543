//! The sans-IO core of the gateway: members and their liveness, load-share selection,
//! persistence, the binding table with its timers, limits and receipts.
//!
//! No sockets, no clock, no global RNG: every call takes the current time (a [`Time`] since an
//! arbitrary epoch chosen by the caller), randomness comes from the RNG given at construction,
//! and decisions that need the data plane to act (close this session) are queued as
//! [`Action`]s for the driver to take with [`Gateway::take_actions`]. The tokio relay in
//! `driver` is one user; a packet-level NAT could be another, looking bindings up by
//! [`FlowKey`] with [`Gateway::lookup`].

pub mod member;
mod metrics;
pub mod persistence;
pub mod policy;
pub mod receipt;

use member::{ms, Cost, Evidence, Health, Liveness, LivenessParams, MemberId, MemberSpec};
use persistence::{client_key, PersistenceParams, PersistenceTable, TrafficWindow};
use policy::{Candidate, LoadSharePolicy, PolicyState, SelectError, TrafficMetric};
use rand::{Rng, RngCore};
use receipt::{
    Bound, CandidateInput, FailedAttempt, Outcome, Receipt, RefusalReason, Selected, Side,
};
use rustc_hash::FxHashMap;
use serde::Serialize;
use std::cmp::Reverse;
use std::collections::hash_map::Entry;
use std::collections::{BTreeMap, BinaryHeap, HashMap, VecDeque};
use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

/// A point in time: the duration since an epoch the caller chose (the driver uses its start).
pub type Time = Duration;

/// A session's number, unique for the gateway's life.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct SessionId(pub u64);

impl fmt::Display for SessionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "s{}", self.0)
    }
}

/// Transport of a session.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Protocol {
    /// A TCP connection.
    Tcp,
    /// A UDP flow (datagrams from one client address).
    Udp,
}

impl Protocol {
    /// Lower-case name.
    pub fn name(self) -> &'static str {
        match self {
            Protocol::Tcp => "tcp",
            Protocol::Udp => "udp",
        }
    }
}

/// What identifies a session at the virtual address: RFC 2391's (client address, client port,
/// virtual address, virtual port) plus the protocol.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct FlowKey {
    /// TCP or UDP.
    pub protocol: Protocol,
    /// Client address and port.
    pub client: SocketAddr,
    /// Virtual address and port.
    pub virtual_address: SocketAddr,
}

/// The tuple packed and hashed in one write: the flow maps are keyed by peers' addresses, so
/// they keep the standard keyed hasher, whose cost is per call as well as per byte (the
/// derived hash made about a dozen calls per key). Keys equal under `Eq` always pack alike;
/// an IPv6 address's flow label and scope id, which `Eq` also compares, are not hashed.
impl std::hash::Hash for FlowKey {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        let mut packed = [0u8; 1 + 2 * 19];
        packed[0] = match self.protocol {
            Protocol::Tcp => 6,
            Protocol::Udp => 17,
        };
        let mut n = 1;
        for a in [self.client, self.virtual_address] {
            match a {
                SocketAddr::V4(v4) => {
                    packed[n] = 4;
                    packed[n + 1..n + 5].copy_from_slice(&v4.ip().octets());
                    n += 5;
                }
                SocketAddr::V6(v6) => {
                    packed[n] = 6;
                    packed[n + 1..n + 17].copy_from_slice(&v6.ip().octets());
                    n += 17;
                }
            }
            packed[n..n + 2].copy_from_slice(&a.port().to_be_bytes());
            n += 2;
        }
        state.write(&packed[..n]);
    }
}

/// Idle timers per session state. The defaults are the RFC floors. `Duration::MAX` is no
/// timer at all: the data plane owns it (NAT mode, where conntrack's timers end sessions).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Timers {
    /// Established TCP (RFC 5382 REQ-5: at least 2 h 4 min).
    pub tcp_established: Duration,
    /// TCP opening or half-closed (RFC 5382: at least 4 min).
    pub tcp_transitory: Duration,
    /// How long a reset TCP binding lingers in the table (RFC 7857 §2.2: 4 min).
    pub tcp_rst_linger: Duration,
    /// UDP flow (RFC 4787 REQ-5: at least 2 min, 5 min recommended).
    pub udp: Duration,
}

impl Default for Timers {
    fn default() -> Self {
        Timers {
            tcp_established: Duration::from_secs(2 * 3600 + 4 * 60),
            tcp_transitory: Duration::from_secs(240),
            tcp_rst_linger: Duration::from_secs(240),
            udp: Duration::from_secs(300),
        }
    }
}

/// Liveness and failure handling settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HealthParams {
    /// The state machine's parameters.
    pub liveness: LivenessParams,
    /// When fewer than this percentage of the (non-draining, reachable) members are live,
    /// health is ignored for selection. 0 disables.
    pub panic_threshold_percent: u8,
    /// Close the sessions bound to a member judged dead (reported as member lost).
    pub close_sessions_on_dead: bool,
    /// Client data unanswered for this long counts as a failure of the member; None disables.
    pub response_timeout: Option<Duration>,
    /// How many other members a session may be rebound to when its connect fails.
    pub connect_retries: u32,
}

impl Default for HealthParams {
    fn default() -> Self {
        HealthParams {
            liveness: LivenessParams {
                fall: 3,
                rise: 2,
                slow_start: Duration::from_secs(10),
                revive_after: Duration::from_secs(30),
                active_probes: true,
            },
            panic_threshold_percent: 0,
            close_sessions_on_dead: true,
            response_timeout: None,
            connect_retries: 1,
        }
    }
}

/// Explicit limits.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Sessions bound at once, overall.
    pub max_sessions: u32,
    /// Sessions bound at once to one member (a member's `max_sessions` overrides it). With the
    /// userspace relay each session to a member uses one local port towards it, so the
    /// ephemeral port range is a ceiling too (LS-NAPT's limit).
    pub max_sessions_per_member: u32,
    /// Reset bindings kept lingering at once; past it, a reset binding is released at once.
    pub max_lingering: u32,
    /// Ended sessions kept for the status endpoint.
    pub recent_outcomes: usize,
    /// Candidates listed in a selection receipt.
    pub receipt_candidates: usize,
    /// Live bindings listed by the status endpoint.
    pub status_bindings: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_sessions: 10_000,
            max_sessions_per_member: 16_384,
            max_lingering: 4_096,
            recent_outcomes: 256,
            receipt_candidates: 16,
            status_bindings: 1_000,
        }
    }
}

/// Everything the core needs to know.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CoreConfig {
    /// The load-share policy.
    pub policy: LoadSharePolicy,
    /// What least-traffic counts.
    pub traffic_metric: TrafficMetric,
    /// Over how long least-traffic counts.
    pub traffic_window: Duration,
    /// Idle timers.
    pub timers: Timers,
    /// Liveness.
    pub health: HealthParams,
    /// Limits.
    pub limits: Limits,
    /// Persistence.
    pub persistence: PersistenceParams,
}

impl Default for CoreConfig {
    fn default() -> Self {
        CoreConfig {
            policy: LoadSharePolicy::RoundRobin,
            traffic_metric: TrafficMetric::Bytes,
            traffic_window: Duration::from_secs(10),
            timers: Timers::default(),
            health: HealthParams::default(),
            limits: Limits::default(),
            persistence: PersistenceParams::default(),
        }
    }
}

/// A session bound to a member: where the data plane must send it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Binding {
    /// The session.
    pub session: SessionId,
    /// The member.
    pub member: MemberId,
    /// The member's address.
    pub address: SocketAddr,
}

/// Something the data plane must do.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Action {
    /// Close this session now; its outcome is already recorded. A member-lost session should be
    /// closed abortively (RST) so the client does not mistake it for a complete answer.
    Close {
        /// The session.
        session: SessionId,
        /// Its recorded outcome.
        outcome: Outcome,
    },
}

/// TCP or UDP state of a binding; each has its own idle timer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SessionState {
    /// TCP: connecting to the member.
    Connecting,
    /// TCP: both directions open.
    Established,
    /// TCP: one side has closed its direction.
    HalfClosed {
        /// The side that closed first.
        first: Side,
    },
    /// UDP flow.
    Udp,
    /// TCP: reset; the binding lingers without holding a session slot.
    ResetLinger,
}

impl SessionState {
    /// Name used in outcomes and status.
    pub fn name(self) -> &'static str {
        match self {
            SessionState::Connecting => "connecting",
            SessionState::Established => "established",
            SessionState::HalfClosed { .. } => "half_closed",
            SessionState::Udp => "udp",
            SessionState::ResetLinger => "reset_linger",
        }
    }
}

/// Traffic in one direction, as the data plane counted it since its last report.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Traffic {
    /// Bytes.
    pub bytes: u64,
    /// Datagrams (UDP) or read calls (TCP relay).
    pub packets: u64,
}

#[derive(Debug)]
struct Session {
    flow: FlowKey,
    member: MemberId,
    state: SessionState,
    last_activity: Time,
    client_data_at: Option<Time>,
    unanswered_reported: bool,
    persist_key: Option<IpAddr>,
    queued: Option<Time>,
    receipt: Receipt,
}

#[derive(Debug, Default, Clone)]
struct MemberCounters {
    selected: u64,
    bound: u64,
    connected: u64,
    reached: u64,
    outcomes: [u64; Outcome::NAMES.len()],
    evidence: BTreeMap<&'static str, u64>,
    transitions: BTreeMap<&'static str, u64>,
    bytes_to_member: u64,
    bytes_to_client: u64,
}

#[derive(Debug)]
struct Member {
    id: MemberId,
    spec: MemberSpec,
    /// The key, shared with the receipts that name this member.
    key: Arc<str>,
    liveness: Liveness,
    sessions: u32,
    traffic: TrafficWindow,
    removed: bool,
    counters: MemberCounters,
}

impl Member {
    fn limit(&self, default: u32) -> u32 {
        self.spec.max_sessions.unwrap_or(default)
    }
}

#[derive(Debug, Default, Clone)]
struct GlobalCounters {
    opened: u64,
    refused: BTreeMap<&'static str, u64>,
    outcomes: [u64; Outcome::NAMES.len()],
    persistence_hits: u64,
    persistence_full: u64,
    panic_selections: u64,
    slow_start_skips: u64,
    connect_retries: u64,
    linger_released: u64,
    linger_skipped: u64,
    bytes_to_member: u64,
    bytes_to_client: u64,
}

/// The gateway's core state. See the module documentation.
pub struct Gateway {
    cfg: CoreConfig,
    rng: Box<dyn RngCore + Send>,
    members: BTreeMap<MemberId, Member>,
    keys: HashMap<String, MemberId>,
    next_member: u32,
    /// Boxed: a session (with its receipt) is several hundred bytes, moved on every insert.
    /// Fx-hashed: the gateway numbers sessions itself, so no peer chooses these keys.
    sessions: FxHashMap<SessionId, Box<Session>>,
    flows: HashMap<FlowKey, SessionId>,
    next_session: u64,
    active: u32,
    lingering: u32,
    deadlines: BinaryHeap<Reverse<(Time, SessionId)>>,
    persistence: PersistenceTable,
    next_persistence_gc: Time,
    policy_state: PolicyState,
    recent: VecDeque<Receipt>,
    actions: Vec<Action>,
    counters: GlobalCounters,
    refusal_log: HashMap<&'static str, (Time, u64)>,
}

enum Choice {
    Chosen(MemberId, Selected, Option<IpAddr>),
    Refused(RefusalReason),
}

impl Gateway {
    /// A gateway with no members yet, using `rng` for every random choice.
    pub fn new(cfg: CoreConfig, rng: Box<dyn RngCore + Send>) -> Self {
        Gateway {
            cfg,
            rng,
            members: BTreeMap::new(),
            keys: HashMap::new(),
            next_member: 0,
            sessions: FxHashMap::default(),
            flows: HashMap::new(),
            next_session: 1,
            active: 0,
            lingering: 0,
            deadlines: BinaryHeap::new(),
            persistence: PersistenceTable::default(),
            next_persistence_gc: Duration::ZERO,
            policy_state: PolicyState::default(),
            recent: VecDeque::new(),
            actions: Vec::new(),
            counters: GlobalCounters::default(),
            refusal_log: HashMap::new(),
        }
    }

    /// The configuration in force.
    pub fn config(&self) -> &CoreConfig {
        &self.cfg
    }

    /// Replaces the membership with `specs` (the member source's full current list). Members
    /// whose key is new start alive; members no longer listed take no new sessions and leave
    /// once their bound sessions end; members listed again come back.
    pub fn set_members(&mut self, now: Time, specs: Vec<MemberSpec>) {
        let mut seen = Vec::with_capacity(specs.len());
        for spec in specs {
            if let Some(&id) = self.keys.get(&spec.key) {
                if let Some(m) = self.members.get_mut(&id) {
                    if m.removed {
                        tracing::info!(member = %spec.key, "member listed again");
                    }
                    m.removed = false;
                    m.spec = spec;
                }
                seen.push(id);
                continue;
            }
            let id = MemberId(self.next_member);
            self.next_member = self.next_member.wrapping_add(1);
            tracing::info!(member = %spec.key, address = %spec.address, weight = spec.weight, "member added");
            self.keys.insert(spec.key.clone(), id);
            self.members.insert(
                id,
                Member {
                    id,
                    key: Arc::from(spec.key.as_str()),
                    spec,
                    liveness: Liveness::new(now),
                    sessions: 0,
                    traffic: TrafficWindow::new(self.cfg.traffic_window),
                    removed: false,
                    counters: MemberCounters::default(),
                },
            );
            seen.push(id);
        }
        let gone: Vec<MemberId> = self
            .members
            .keys()
            .copied()
            .filter(|id| !seen.contains(id))
            .collect();
        for id in gone {
            if let Some(m) = self.members.get_mut(&id) {
                if !m.removed {
                    tracing::info!(member = %m.spec.key, sessions = m.sessions, "member removed; bound sessions continue");
                }
                m.removed = true;
            }
            self.collect_member(id);
        }
    }

    fn collect_member(&mut self, id: MemberId) {
        let remove = self
            .members
            .get(&id)
            .is_some_and(|m| m.removed && m.sessions == 0)
            && !self.sessions.values().any(|s| s.member == id);
        if remove {
            if let Some(m) = self.members.remove(&id) {
                self.keys.remove(&m.spec.key);
                self.policy_state.forget(id);
            }
        }
    }

    /// The member with this key, if any.
    pub fn member_id(&self, key: &str) -> Option<MemberId> {
        self.keys.get(key).copied()
    }

    /// A member's liveness state.
    pub fn member_health(&self, id: MemberId) -> Option<Health> {
        self.members.get(&id).map(|m| m.liveness.health)
    }

    /// Sessions currently bound to a member.
    pub fn member_sessions(&self, id: MemberId) -> Option<u32> {
        self.members.get(&id).map(|m| m.sessions)
    }

    /// Sessions bound now (lingering reset bindings excluded).
    pub fn active_sessions(&self) -> u32 {
        self.active
    }

    /// Members the driver should probe, with their addresses: every member not removed, and a
    /// removed one while sessions are still bound to it.
    pub fn probe_targets(&self) -> Vec<(MemberId, SocketAddr)> {
        // A removed member stays probed while sessions are bound to it: they end as
        // `member_lost` when it is judged dead, not quietly as an orderly close.
        self.members
            .values()
            .filter(|m| !m.removed || m.sessions > 0)
            .map(|m| (m.id, m.spec.address))
            .collect()
    }

    /// Takes the actions queued for the data plane.
    pub fn take_actions(&mut self) -> Vec<Action> {
        std::mem::take(&mut self.actions)
    }

    /// Whether actions are waiting.
    pub fn has_actions(&self) -> bool {
        !self.actions.is_empty()
    }

    /// Session binding: the first packet of `flow` arrived. Selects a member and binds the
    /// session to it, or refuses (counted, logged, and kept as a receipt with outcome refused).
    pub fn open(&mut self, now: Time, flow: FlowKey) -> Result<Binding, RefusalReason> {
        self.counters.opened += 1;
        let id = SessionId(self.next_session);
        self.next_session += 1;
        let mut receipt = Receipt {
            session: id,
            protocol: flow.protocol,
            client: flow.client,
            virtual_address: flow.virtual_address,
            opened_ms: ms(now),
            selected: Vec::new(),
            bound: None,
            failed_attempts: Vec::new(),
            connected_ms: None,
            reached_ms: None,
            bytes_to_member: 0,
            bytes_to_client: 0,
            outcome: None,
            ended_ms: None,
        };
        if let Some(old) = self.flows.get(&flow).copied() {
            self.release_linger(old);
        }
        if self.active >= self.cfg.limits.max_sessions {
            return Err(self.refuse(now, receipt, RefusalReason::MaxSessions));
        }
        let (member, selected, persist_key) = match self.choose(now, flow.client.ip(), &[]) {
            Choice::Chosen(m, s, k) => (m, s, k),
            Choice::Refused(r) => return Err(self.refuse(now, receipt, r)),
        };
        receipt.selected.push(selected);
        let state = match flow.protocol {
            Protocol::Tcp => SessionState::Connecting,
            Protocol::Udp => SessionState::Udp,
        };
        let mut session = Box::new(Session {
            flow,
            member,
            state,
            last_activity: now,
            client_data_at: None,
            unanswered_reported: false,
            persist_key,
            queued: None,
            receipt,
        });
        let address = self.bind_to(now, &mut session, member);
        self.active += 1;
        self.flows.insert(flow, id);
        self.sessions.insert(id, session);
        self.reschedule(id, now);
        Ok(Binding {
            session: id,
            member,
            address,
        })
    }

    fn bind_to(&mut self, now: Time, s: &mut Session, member: MemberId) -> SocketAddr {
        let m = self.members.get_mut(&member).expect("chosen member exists");
        m.sessions += 1;
        m.counters.bound += 1;
        let address = m.spec.address;
        s.receipt.bound = Some(Bound {
            at_ms: ms(now),
            member,
            key: m.key.clone(),
            address,
        });
        tracing::debug!(session = %s.receipt.session, client = %s.flow.client, member = %m.spec.key, "bound");
        if let Some(k) = s.persist_key {
            if !self
                .persistence
                .bind(k, member, now, self.cfg.persistence.max_entries)
            {
                self.counters.persistence_full += 1;
                s.persist_key = None;
            }
        }
        address
    }

    fn unbind_slot(&mut self, now: Time, s: &Session) {
        if let Some(m) = self.members.get_mut(&s.member) {
            m.sessions = m.sessions.saturating_sub(1);
        }
        if let Some(k) = s.persist_key {
            self.persistence.release(k, s.member, now);
        }
    }

    fn refuse(&mut self, now: Time, mut receipt: Receipt, reason: RefusalReason) -> RefusalReason {
        *self.counters.refused.entry(reason.name()).or_default() += 1;
        let outcome = Outcome::Refused { reason };
        self.counters.outcomes[outcome_index(&outcome)] += 1;
        receipt.outcome = Some(outcome);
        receipt.ended_ms = Some(ms(now));
        let entry = self
            .refusal_log
            .entry(reason.name())
            .or_insert((Time::MAX, 0));
        entry.1 += 1;
        if entry.0 == Time::MAX || now >= entry.0 + Duration::from_secs(1) {
            tracing::warn!(client = %receipt.client, reason = reason.name(), refused_since_last_log = entry.1, "session refused");
            *entry = (now, 0);
        }
        self.push_recent(receipt);
        reason
    }

    fn push_recent(&mut self, receipt: Receipt) {
        if self.cfg.limits.recent_outcomes == 0 {
            return;
        }
        while self.recent.len() >= self.cfg.limits.recent_outcomes {
            self.recent.pop_front();
        }
        self.recent.push_back(receipt);
    }

    fn candidate_input(
        &self,
        m: &Member,
        now: Time,
        excluded: Option<&'static str>,
    ) -> CandidateInput {
        let mut traffic = m.traffic.clone();
        CandidateInput {
            member: m.id,
            key: m.key.clone(),
            health: m.liveness.health,
            weight: m.spec.weight,
            sessions: m.sessions,
            traffic: traffic.total(now),
            cost: m.spec.cost,
            excluded,
        }
    }

    /// Why a member cannot take a new session, health aside.
    fn admin_exclusion(&self, m: &Member, exclude: &[MemberId]) -> Option<&'static str> {
        if m.removed {
            Some("removed")
        } else if exclude.contains(&m.id) {
            Some("already_tried")
        } else if m.spec.weight == 0 {
            Some("draining")
        } else if m.spec.cost == Cost::Unreachable {
            Some("unreachable")
        } else {
            None
        }
    }

    fn choose(&mut self, now: Time, client: IpAddr, exclude: &[MemberId]) -> Choice {
        let per_member = self.cfg.limits.max_sessions_per_member;
        let persist_key = (!self.cfg.persistence.timeout.is_zero())
            .then(|| client_key(client, &self.cfg.persistence));
        // Panic threshold: share of admissible members that health allows.
        let mut admissible = 0u32;
        let mut live = 0u32;
        for m in self.members.values() {
            if self.admin_exclusion(m, exclude).is_none() {
                admissible += 1;
                if m.liveness.eligible() {
                    live += 1;
                }
            }
        }
        let threshold = u32::from(self.cfg.health.panic_threshold_percent.min(100));
        let panic = threshold > 0 && admissible > 0 && live * 100 < threshold * admissible;

        if let Some(key) = persist_key {
            if let Some(mid) = self
                .persistence
                .lookup(key, now, self.cfg.persistence.timeout)
            {
                let usable = self.members.get(&mid).is_some_and(|m| {
                    self.admin_exclusion(m, exclude).is_none()
                        && (panic || m.liveness.eligible())
                        && m.sessions < m.limit(per_member)
                });
                if usable {
                    self.counters.persistence_hits += 1;
                    let m = &self.members[&mid];
                    let input = self.candidate_input(m, now, None);
                    let selected = Selected {
                        at_ms: ms(now),
                        by: "persistence",
                        member: mid,
                        panic,
                        candidates: vec![input],
                        candidates_omitted: 0,
                    };
                    self.count_selected(mid);
                    return Choice::Chosen(mid, selected, Some(key));
                }
                self.persistence.forget(key);
            }
        }

        let mut inputs = Vec::with_capacity(self.members.len());
        let mut candidates = Vec::with_capacity(self.members.len());
        let mut at_limit = 0u32;
        let mut probation = Vec::new();
        for m in self.members.values() {
            let mut excluded = self.admin_exclusion(m, exclude);
            if excluded.is_none() && !panic && !m.liveness.eligible() {
                excluded = Some("dead");
            }
            if excluded.is_none() && m.sessions >= m.limit(per_member) {
                excluded = Some("at_limit");
                at_limit += 1;
            }
            let input = self.candidate_input(m, now, excluded);
            if excluded.is_none() {
                if !panic && m.liveness.health == Health::Probation {
                    probation.push((
                        candidates.len(),
                        m.liveness.slow_start_share(now, &self.cfg.health.liveness),
                    ));
                }
                candidates.push(Candidate {
                    member: m.id,
                    weight: m.spec.weight,
                    sessions: m.sessions,
                    traffic: input.traffic,
                    cost: m.spec.cost,
                    pool_policy: m.spec.pool_policy.clone(),
                });
            }
            inputs.push(input);
        }
        if candidates.is_empty() {
            return Choice::Refused(if at_limit > 0 {
                RefusalReason::MemberLimit
            } else {
                RefusalReason::NoMember
            });
        }
        // Slow start: a member on probation is offered with a probability that rises with its
        // time on probation, unless it is the only candidate.
        if !probation.is_empty() && probation.len() < candidates.len() {
            let mut drop_idx = Vec::new();
            for (i, share) in &probation {
                if self.rng.random::<f64>() >= *share {
                    drop_idx.push(*i);
                }
            }
            for i in drop_idx.into_iter().rev() {
                let mid = candidates[i].member;
                candidates.remove(i);
                if let Some(inp) = inputs.iter_mut().find(|x| x.member == mid) {
                    inp.excluded = Some("slow_start");
                }
                self.counters.slow_start_skips += 1;
            }
        }
        let idx = match policy::select(
            self.cfg.policy,
            &candidates,
            &mut self.policy_state,
            &mut *self.rng,
        ) {
            Ok(i) => i,
            Err(SelectError::NoCandidates) => return Choice::Refused(RefusalReason::NoMember),
            Err(e @ SelectError::NoPoolPolicy(_)) => {
                tracing::warn!(error = %e, "policy cannot choose");
                return Choice::Refused(RefusalReason::PolicyUnavailable);
            }
        };
        let mid = candidates[idx].member;
        if panic {
            self.counters.panic_selections += 1;
        }
        let cap = self.cfg.limits.receipt_candidates;
        let omitted = inputs.len().saturating_sub(cap);
        inputs.truncate(cap);
        let selected = Selected {
            at_ms: ms(now),
            by: self.cfg.policy.name(),
            member: mid,
            panic,
            candidates: inputs,
            candidates_omitted: omitted,
        };
        self.count_selected(mid);
        Choice::Chosen(mid, selected, persist_key)
    }

    fn count_selected(&mut self, mid: MemberId) {
        if let Some(m) = self.members.get_mut(&mid) {
            m.counters.selected += 1;
        }
    }

    /// The member accepted the relay's connection (TCP). Passive evidence of life; the
    /// session is established.
    pub fn connected(&mut self, now: Time, id: SessionId) {
        let Some(s) = self.sessions.get_mut(&id) else {
            return;
        };
        if s.state == SessionState::Connecting {
            s.state = SessionState::Established;
        }
        s.receipt.connected_ms.get_or_insert(ms(now));
        s.last_activity = now;
        let member = s.member;
        if let Some(m) = self.members.get_mut(&member) {
            m.counters.connected += 1;
        }
        self.reschedule(id, now);
        self.observe(now, member, Evidence::ConnectSucceeded);
    }

    /// The relay's connect to the bound member failed. Counts as evidence against it; the
    /// session is rebound to another member if `connect_retries` allows (returned), otherwise
    /// it ends with outcome connect failed (None).
    pub fn connect_failed(&mut self, now: Time, id: SessionId, reason: &str) -> Option<Binding> {
        let s = self.sessions.remove(&id)?;
        let member = s.member;
        self.observe(
            now,
            member,
            Evidence::ConnectFailed {
                reason: reason.to_string(),
            },
        );
        let mut s = s;
        s.receipt.failed_attempts.push(FailedAttempt {
            at_ms: ms(now),
            member,
            reason: reason.to_string(),
        });
        self.unbind_slot(now, &s);
        let tried: Vec<MemberId> = s.receipt.selected.iter().map(|x| x.member).collect();
        let retries_left = (tried.len() as u32) <= self.cfg.health.connect_retries;
        if retries_left {
            if let Choice::Chosen(next, selected, persist_key) =
                self.choose(now, s.flow.client.ip(), &tried)
            {
                self.counters.connect_retries += 1;
                s.receipt.selected.push(selected);
                s.member = next;
                s.persist_key = persist_key;
                s.state = SessionState::Connecting;
                s.last_activity = now;
                let address = self.bind_to(now, &mut s, next);
                self.sessions.insert(id, s);
                self.reschedule(id, now);
                return Some(Binding {
                    session: id,
                    member: next,
                    address,
                });
            }
        }
        self.sessions.insert(id, s);
        // The slot was released above; finish without releasing it again.
        self.finish(
            now,
            id,
            Outcome::ConnectFailed {
                reason: reason.to_string(),
            },
            false,
        );
        None
    }

    /// The member failed on a bound session (e.g. a UDP flow's datagrams were refused): evidence
    /// against the member, and the session ends as member lost if it had been reached, or as
    /// connect failed if it never was.
    pub fn member_failed(&mut self, now: Time, id: SessionId, reason: &str) {
        let Some(s) = self.sessions.get(&id) else {
            return;
        };
        if s.receipt.outcome.is_some() {
            return;
        }
        let member = s.member;
        let reached = s.receipt.reached_ms.is_some();
        let outcome = if reached {
            Outcome::MemberLost {
                reason: reason.to_string(),
            }
        } else {
            Outcome::ConnectFailed {
                reason: reason.to_string(),
            }
        };
        // This session's own outcome first: the evidence may judge the member dead, which ends
        // its other sessions as member lost.
        self.closed(now, id, outcome);
        self.observe(
            now,
            member,
            Evidence::ConnectFailed {
                reason: reason.to_string(),
            },
        );
    }

    /// The member's first byte (TCP) or datagram (UDP) of this session came back: the
    /// "reached" receipt, and evidence of life.
    pub fn reached(&mut self, now: Time, id: SessionId) {
        let Some(s) = self.sessions.get_mut(&id) else {
            return;
        };
        if s.receipt.reached_ms.is_some() {
            return;
        }
        s.receipt.reached_ms = Some(ms(now));
        s.last_activity = now;
        let member = s.member;
        if let Some(m) = self.members.get_mut(&member) {
            m.counters.reached += 1;
        }
        self.observe(now, member, Evidence::Answered);
    }

    /// Client data was first forwarded to the member (arms `health.response_timeout`).
    pub fn client_data(&mut self, now: Time, id: SessionId) {
        let Some(s) = self.sessions.get_mut(&id) else {
            return;
        };
        if s.client_data_at.is_none() {
            s.client_data_at = Some(now);
            s.last_activity = now;
            self.reschedule(id, now);
        }
    }

    /// Traffic seen by the data plane since its last report for this session; refreshes the
    /// idle timer.
    /// Traffic reported after the session ended (the data plane had relayed it before it learnt
    /// of the end, e.g. a UDP flow ended by its idle timer) still counts: in the totals, the
    /// member's counters and traffic window, and the ended session's receipt while it is among
    /// the recent outcomes. Every byte relayed is counted once.
    pub fn activity(&mut self, now: Time, id: SessionId, to_member: Traffic, to_client: Traffic) {
        if to_member == Traffic::default() && to_client == Traffic::default() {
            if let Some(s) = self.sessions.get_mut(&id) {
                s.last_activity = now;
            }
            return;
        }
        let member = match self.sessions.get_mut(&id) {
            Some(s) => {
                s.last_activity = now;
                s.receipt.bytes_to_member += to_member.bytes;
                s.receipt.bytes_to_client += to_client.bytes;
                Some(s.member)
            }
            None => self
                .recent
                .iter_mut()
                .rev()
                .find(|r| r.session == id)
                .and_then(|r| {
                    r.bytes_to_member += to_member.bytes;
                    r.bytes_to_client += to_client.bytes;
                    r.bound.as_ref().map(|b| b.member)
                }),
        };
        self.counters.bytes_to_member += to_member.bytes;
        self.counters.bytes_to_client += to_client.bytes;
        if let Some(m) = member.and_then(|member| self.members.get_mut(&member)) {
            m.counters.bytes_to_member += to_member.bytes;
            m.counters.bytes_to_client += to_client.bytes;
            let amount = match self.cfg.traffic_metric {
                TrafficMetric::Bytes => to_member.bytes + to_client.bytes,
                TrafficMetric::Packets => to_member.packets + to_client.packets,
            };
            if amount > 0 {
                m.traffic.add(now, amount);
            }
        }
    }

    /// One side closed its direction (TCP FIN): the transitory timer applies from now.
    pub fn half_closed(&mut self, now: Time, id: SessionId, side: Side) {
        let Some(s) = self.sessions.get_mut(&id) else {
            return;
        };
        if matches!(
            s.state,
            SessionState::Established | SessionState::Connecting
        ) {
            s.state = SessionState::HalfClosed { first: side };
        }
        s.last_activity = now;
        self.reschedule(id, now);
    }

    /// The data plane saw the session end. The first outcome recorded wins: a session the core
    /// already ended (idle timeout, member lost) is not ended again.
    pub fn closed(&mut self, now: Time, id: SessionId, outcome: Outcome) -> bool {
        match self.sessions.get(&id) {
            Some(s) if s.receipt.outcome.is_none() => {}
            _ => return false,
        }
        self.finish(now, id, outcome, true);
        true
    }

    /// Ends all sessions (the gateway is stopping).
    pub fn shutdown(&mut self, now: Time) {
        let ids: Vec<SessionId> = self
            .sessions
            .iter()
            .filter(|(_, s)| s.receipt.outcome.is_none())
            .map(|(id, _)| *id)
            .collect();
        for id in ids {
            self.finish(now, id, Outcome::Shutdown, true);
        }
    }

    fn finish(&mut self, now: Time, id: SessionId, outcome: Outcome, release: bool) {
        let Some(mut s) = self.sessions.remove(&id) else {
            return;
        };
        if release {
            self.unbind_slot(now, &s);
        }
        self.active = self.active.saturating_sub(1);
        let idx = outcome_index(&outcome);
        self.counters.outcomes[idx] += 1;
        if let Some(m) = self.members.get_mut(&s.member) {
            m.counters.outcomes[idx] += 1;
        }
        let key = self
            .members
            .get(&s.member)
            .map(|m| m.spec.key.as_str())
            .unwrap_or("?");
        match &outcome {
            Outcome::Closed | Outcome::Reset { .. } | Outcome::IdleTimeout { .. } => {
                tracing::debug!(session = %id, client = %s.flow.client, member = key, outcome = outcome.name(), "session ended")
            }
            _ => {
                tracing::info!(session = %id, client = %s.flow.client, member = key, outcome = %outcome, "session ended")
            }
        }
        let linger = matches!(outcome, Outcome::Reset { .. })
            && s.flow.protocol == Protocol::Tcp
            && !self.cfg.timers.tcp_rst_linger.is_zero();
        s.receipt.outcome = Some(outcome);
        s.receipt.ended_ms = Some(ms(now));
        if linger && self.lingering < self.cfg.limits.max_lingering {
            self.push_recent(s.receipt.clone());
            s.state = SessionState::ResetLinger;
            s.last_activity = now;
            s.queued = None;
            self.lingering += 1;
            self.sessions.insert(id, s);
            self.reschedule(id, now);
        } else {
            if linger {
                self.counters.linger_skipped += 1;
            }
            self.unmap_flow(s.flow, id);
            let member = s.member;
            self.push_recent(s.receipt);
            self.collect_member(member);
        }
    }

    /// Removes `flow`'s lookup entry if it still leads to session `id` (a later session of
    /// the same tuple may have taken it over).
    fn unmap_flow(&mut self, flow: FlowKey, id: SessionId) {
        if let Entry::Occupied(e) = self.flows.entry(flow) {
            if *e.get() == id {
                e.remove();
            }
        }
    }

    fn release_linger(&mut self, id: SessionId) {
        let is_linger = self
            .sessions
            .get(&id)
            .is_some_and(|s| s.state == SessionState::ResetLinger);
        if is_linger {
            if let Some(s) = self.sessions.remove(&id) {
                self.lingering = self.lingering.saturating_sub(1);
                self.counters.linger_released += 1;
                self.unmap_flow(s.flow, id);
                self.collect_member(s.member);
            }
        }
    }

    /// Lookup: the binding of a flow, for every later packet of the session (including a
    /// reset binding while it lingers).
    pub fn lookup(&self, flow: &FlowKey) -> Option<Binding> {
        let id = *self.flows.get(flow)?;
        let s = self.sessions.get(&id)?;
        let address = self.members.get(&s.member)?.spec.address;
        Some(Binding {
            session: id,
            member: s.member,
            address,
        })
    }

    /// The receipt of a live (or lingering) session.
    pub fn receipt(&self, id: SessionId) -> Option<&Receipt> {
        self.sessions.get(&id).map(|s| &s.receipt)
    }

    /// Receipts of ended sessions, oldest first.
    pub fn recent_outcomes(&self) -> impl Iterator<Item = &Receipt> {
        self.recent.iter()
    }

    /// The state of a live session.
    pub fn session_state(&self, id: SessionId) -> Option<SessionState> {
        self.sessions.get(&id).map(|s| s.state)
    }

    /// Result of an active probe of a member.
    pub fn probe_result(&mut self, now: Time, member: MemberId, result: Result<(), String>) {
        let ev = match result {
            Ok(()) => Evidence::ProbeSucceeded,
            Err(reason) => Evidence::ProbeFailed { reason },
        };
        self.observe(now, member, ev);
    }

    /// Evidence from the member source (for RSerPool members: the registrar's view).
    pub fn source_evidence(&mut self, now: Time, key: &str, registered: bool) {
        if let Some(id) = self.member_id(key) {
            let ev = if registered {
                Evidence::RegistrarRegistered
            } else {
                Evidence::RegistrarGone
            };
            self.observe(now, id, ev);
        }
    }

    fn observe(&mut self, now: Time, member: MemberId, ev: Evidence) {
        let params = self.cfg.health.liveness.clone();
        let Some(m) = self.members.get_mut(&member) else {
            return;
        };
        *m.counters.evidence.entry(ev.name()).or_default() += 1;
        let copy = ev.clone();
        let was_dead = m.liveness.health == Health::Dead;
        match m.liveness.observe(now, ev, &params) {
            Some(t) => self.transitioned(now, member, t, &copy.to_string()),
            None if was_dead && copy.is_failure() && self.cfg.health.close_sessions_on_dead => {
                // A member already judged dead can still hold sessions: those bound to it in
                // panic mode, or connecting when it died. New evidence that it is failing ends
                // them as the transition to dead would have.
                let key = m.spec.key.clone();
                self.lose_sessions(now, member, &format!("member {key} still dead: {copy}"));
            }
            None => {}
        }
    }

    fn transitioned(&mut self, now: Time, member: MemberId, t: member::Transition, why: &str) {
        let Some(m) = self.members.get_mut(&member) else {
            return;
        };
        *m.counters.transitions.entry(t.to.name()).or_default() += 1;
        let key = m.spec.key.clone();
        if t.to == Health::Dead {
            tracing::warn!(member = %key, from = t.from.name(), evidence = why, sessions = m.sessions, "member judged dead");
        } else {
            tracing::info!(member = %key, from = t.from.name(), to = t.to.name(), evidence = why, "member liveness changed");
        }
        if t.to == Health::Dead && self.cfg.health.close_sessions_on_dead {
            self.lose_sessions(now, member, &format!("member {key} judged dead: {why}"));
        }
    }

    /// Ends the sessions bound (not connecting) to `member` as member lost, and asks the data
    /// plane to close them.
    fn lose_sessions(&mut self, now: Time, member: MemberId, reason: &str) {
        let mut lost: Vec<SessionId> = self
            .sessions
            .iter()
            .filter(|(_, s)| {
                s.member == member
                    && s.receipt.outcome.is_none()
                    && s.state != SessionState::Connecting
            })
            .map(|(id, _)| *id)
            .collect();
        lost.sort();
        for id in lost {
            let outcome = Outcome::MemberLost {
                reason: reason.to_string(),
            };
            self.finish(now, id, outcome.clone(), true);
            self.actions.push(Action::Close {
                session: id,
                outcome,
            });
        }
    }

    fn idle_limit(&self, s: &Session) -> Duration {
        let t = &self.cfg.timers;
        match s.state {
            SessionState::Connecting | SessionState::HalfClosed { .. } => t.tcp_transitory,
            SessionState::Established => t.tcp_established,
            SessionState::Udp => t.udp,
            SessionState::ResetLinger => t.tcp_rst_linger,
        }
    }

    fn response_deadline(&self, s: &Session) -> Option<Time> {
        let rt = self.cfg.health.response_timeout?;
        if s.unanswered_reported || s.receipt.reached_ms.is_some() {
            return None;
        }
        s.client_data_at.map(|t| t + rt)
    }

    fn deadline_of(&self, s: &Session) -> Time {
        let idle = s.last_activity.saturating_add(self.idle_limit(s));
        match self.response_deadline(s) {
            Some(r) => r.min(idle),
            None => idle,
        }
    }

    fn reschedule(&mut self, id: SessionId, _now: Time) {
        let Some(s) = self.sessions.get(&id) else {
            return;
        };
        let d = self.deadline_of(s);
        // Time::MAX: no timer (the data plane's own ends the session), nothing to queue.
        if d != Time::MAX && s.queued.is_none_or(|q| d < q) {
            self.deadlines.push(Reverse((d, id)));
            if let Some(s) = self.sessions.get_mut(&id) {
                s.queued = Some(d);
            }
            self.compact_deadlines();
        }
    }

    /// Drops the deadlines of sessions that ended or were rescheduled earlier, once they
    /// outnumber the live ones: an ended session's entry would otherwise stay until its
    /// deadline passes (hours for an established TCP session), and the heap would grow with
    /// the connection rate. Amortised O(1) per push.
    fn compact_deadlines(&mut self) {
        if self.deadlines.len() <= 2 * self.sessions.len() + 1024 {
            return;
        }
        let sessions = &self.sessions;
        self.deadlines
            .retain(|Reverse((d, id))| sessions.get(id).is_some_and(|s| s.queued == Some(*d)));
    }

    /// Timer entries held now (live and stale), for tests of the heap's bound.
    #[doc(hidden)]
    pub fn deadline_entries(&self) -> usize {
        self.deadlines.len()
    }

    /// Runs the timers due at `now`: idle timeouts (queued as close actions), response
    /// timeouts (evidence), liveness timers (probation end, revival), linger and persistence
    /// expiry.
    pub fn poll(&mut self, now: Time) {
        let params = self.cfg.health.liveness.clone();
        let ids: Vec<MemberId> = self.members.keys().copied().collect();
        for id in ids {
            let t = self
                .members
                .get_mut(&id)
                .and_then(|m| m.liveness.tick(now, &params));
            if let Some(t) = t {
                self.transitioned(now, id, t, "timer");
            }
        }
        while let Some(Reverse((d, id))) = self.deadlines.peek().copied() {
            if d > now {
                break;
            }
            self.deadlines.pop();
            let Some(s) = self.sessions.get_mut(&id) else {
                continue;
            };
            if s.queued != Some(d) {
                continue;
            }
            s.queued = None;
            let member = s.member;
            let Some(s) = self.sessions.get(&id) else {
                continue;
            };
            if let Some(r) = self.response_deadline(s) {
                if r <= now {
                    if let Some(s) = self.sessions.get_mut(&id) {
                        s.unanswered_reported = true;
                    }
                    self.observe(now, member, Evidence::Unanswered);
                }
            }
            let Some(s) = self.sessions.get(&id) else {
                continue;
            };
            let idle_deadline = s.last_activity.saturating_add(self.idle_limit(s));
            if idle_deadline <= now {
                if s.state == SessionState::ResetLinger {
                    self.release_linger(id);
                } else {
                    let outcome = Outcome::IdleTimeout {
                        state: s.state.name(),
                    };
                    self.finish(now, id, outcome.clone(), true);
                    self.actions.push(Action::Close {
                        session: id,
                        outcome,
                    });
                }
            } else {
                self.reschedule(id, now);
            }
        }
        if now >= self.next_persistence_gc {
            self.persistence.expire(now, self.cfg.persistence.timeout);
            self.next_persistence_gc = now + Duration::from_secs(1);
        }
    }

    /// The earliest time `poll` has work to do, if any.
    pub fn next_deadline(&self) -> Option<Time> {
        let params = &self.cfg.health.liveness;
        let sessions = self.deadlines.peek().map(|Reverse((d, _))| *d);
        let members = self
            .members
            .values()
            .filter_map(|m| m.liveness.next_deadline(params))
            .min();
        match (sessions, members) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// NAT mode: the kernel bound `flow` to the member at `member_address` by the weight map
    /// the core programmed (`by` names the rule, e.g. "kernel-map:round-robin"). Records the
    /// selection and binding receipts as the proxy's `open` does, without choosing: the
    /// choice was made in the kernel from the core's map. Refused (NoMember, no receipt kept)
    /// when no member has that address. Persistence and session ceilings are the kernel's
    /// business in this mode (see docs/lsnat.md).
    pub fn adopt(
        &mut self,
        now: Time,
        flow: FlowKey,
        member_address: SocketAddr,
        by: &'static str,
    ) -> Result<SessionId, RefusalReason> {
        let member = self
            .members
            .values()
            .filter(|m| m.spec.address == member_address)
            .min_by_key(|m| m.removed)
            .map(|m| m.id)
            .ok_or(RefusalReason::NoMember)?;
        self.counters.opened += 1;
        let id = SessionId(self.next_session);
        self.next_session += 1;
        let cap = self.cfg.limits.receipt_candidates;
        let mut inputs: Vec<CandidateInput> = self
            .members
            .values()
            .map(|m| {
                let excluded = self
                    .admin_exclusion(m, &[])
                    .or((!m.liveness.eligible()).then_some("dead"));
                self.candidate_input(m, now, excluded)
            })
            .collect();
        let omitted = inputs.len().saturating_sub(cap);
        inputs.truncate(cap);
        self.count_selected(member);
        let receipt = Receipt {
            session: id,
            protocol: flow.protocol,
            client: flow.client,
            virtual_address: flow.virtual_address,
            opened_ms: ms(now),
            selected: vec![Selected {
                at_ms: ms(now),
                by,
                member,
                panic: false,
                candidates: inputs,
                candidates_omitted: omitted,
            }],
            bound: None,
            failed_attempts: Vec::new(),
            connected_ms: None,
            reached_ms: None,
            bytes_to_member: 0,
            bytes_to_client: 0,
            outcome: None,
            ended_ms: None,
        };
        let state = match flow.protocol {
            Protocol::Tcp => SessionState::Connecting,
            Protocol::Udp => SessionState::Udp,
        };
        let mut session = Box::new(Session {
            flow,
            member,
            state,
            last_activity: now,
            client_data_at: None,
            unanswered_reported: false,
            persist_key: None,
            queued: None,
            receipt,
        });
        self.bind_to(now, &mut session, member);
        self.active += 1;
        // A reset session of the same tuple still lingering gives way (the flow now leads here).
        if let Some(old) = self.flows.insert(flow, id) {
            self.release_linger(old);
        }
        self.sessions.insert(id, session);
        self.reschedule(id, now);
        Ok(id)
    }

    /// The live session of `flow`, if any.
    pub fn session_of(&self, flow: &FlowKey) -> Option<SessionId> {
        self.flows.get(flow).copied().filter(|id| {
            self.sessions
                .get(id)
                .is_some_and(|s| s.receipt.outcome.is_none())
        })
    }

    /// Every member with the inputs a kernel data plane needs to program its weight map:
    /// whether the core would offer it to the policy now (health, draining, removal,
    /// reachability, its session ceiling, the panic threshold) and its slow-start share.
    pub fn member_snapshots(&self, now: Time) -> Vec<MemberSnapshot> {
        let per_member = self.cfg.limits.max_sessions_per_member;
        let mut admissible = 0u32;
        let mut live = 0u32;
        for m in self.members.values() {
            if self.admin_exclusion(m, &[]).is_none() {
                admissible += 1;
                if m.liveness.eligible() {
                    live += 1;
                }
            }
        }
        let threshold = u32::from(self.cfg.health.panic_threshold_percent.min(100));
        let panic = threshold > 0 && admissible > 0 && live * 100 < threshold * admissible;
        self.members
            .values()
            .map(|m| {
                let mut traffic = m.traffic.clone();
                MemberSnapshot {
                    id: m.id,
                    address: m.spec.address,
                    weight: m.spec.weight,
                    health: m.liveness.health,
                    eligible: self.admin_exclusion(m, &[]).is_none()
                        && (panic || m.liveness.eligible())
                        && m.sessions < m.limit(per_member),
                    share: if panic {
                        1.0
                    } else {
                        m.liveness.slow_start_share(now, &self.cfg.health.liveness)
                    },
                    sessions: m.sessions,
                    traffic: traffic.total(now),
                    cost: m.spec.cost,
                    removed: m.removed,
                }
            })
            .collect()
    }

    /// A snapshot for the status endpoint: members with their liveness and evidence, live
    /// bindings with their receipts, recent outcomes.
    pub fn status(&self, now: Time) -> Status {
        let members = self
            .members
            .values()
            .map(|m| {
                let mut traffic = m.traffic.clone();
                MemberStatus {
                    id: m.id,
                    key: m.spec.key.clone(),
                    address: m.spec.address,
                    weight: m.spec.weight,
                    cost: m.spec.cost,
                    draining: m.spec.weight == 0,
                    removed: m.removed,
                    state: if m.spec.weight == 0 && m.liveness.health != Health::Dead {
                        "draining"
                    } else {
                        m.liveness.health.name()
                    },
                    liveness: m.liveness.clone(),
                    sessions: m.sessions,
                    max_sessions: m.limit(self.cfg.limits.max_sessions_per_member),
                    traffic: traffic.total(now),
                    slow_start_share: m.liveness.slow_start_share(now, &self.cfg.health.liveness),
                }
            })
            .collect();
        let mut bindings: Vec<BindingStatus> = self
            .sessions
            .values()
            .map(|s| BindingStatus {
                state: s.state,
                idle_ms: ms(now.saturating_sub(s.last_activity)),
                receipt: s.receipt.clone(),
            })
            .collect();
        bindings.sort_by_key(|b| b.receipt.session);
        let bindings_omitted = bindings
            .len()
            .saturating_sub(self.cfg.limits.status_bindings);
        bindings.truncate(self.cfg.limits.status_bindings);
        Status {
            now_ms: ms(now),
            policy: self.cfg.policy,
            active_sessions: self.active,
            lingering: self.lingering,
            max_sessions: self.cfg.limits.max_sessions,
            persistence_entries: self.persistence.len(),
            members,
            bindings,
            bindings_omitted,
            recent_outcomes: self.recent.iter().rev().cloned().collect(),
        }
    }

    /// Number of sessions that ended with the outcome named `name` (see [`Outcome::NAMES`]).
    pub fn outcome_count(&self, name: &str) -> u64 {
        Outcome::NAMES
            .iter()
            .position(|n| *n == name)
            .map(|i| self.counters.outcomes[i])
            .unwrap_or(0)
    }

    /// Number of sessions refused for `reason`.
    pub fn refused_count(&self, reason: RefusalReason) -> u64 {
        self.counters
            .refused
            .get(reason.name())
            .copied()
            .unwrap_or(0)
    }
}

fn outcome_index(o: &Outcome) -> usize {
    Outcome::NAMES
        .iter()
        .position(|n| *n == o.name())
        .unwrap_or(0)
}

/// A member's state as a kernel data plane needs it (see [`Gateway::member_snapshots`]).
#[derive(Clone, Debug, PartialEq)]
pub struct MemberSnapshot {
    /// The gateway's number for it.
    pub id: MemberId,
    /// Where sessions go.
    pub address: SocketAddr,
    /// Configured weight (0: draining).
    pub weight: u32,
    /// Liveness state.
    pub health: Health,
    /// Whether the core would offer it to the policy now.
    pub eligible: bool,
    /// Slow start: the share of its weight it gets now (1.0 outside probation).
    pub share: f64,
    /// Sessions bound.
    pub sessions: u32,
    /// Traffic over the window.
    pub traffic: u64,
    /// Route cost.
    pub cost: Cost,
    /// No longer listed by the member source (leaves when its sessions end).
    pub removed: bool,
}

/// A member in the status report.
#[derive(Clone, Debug, Serialize)]
pub struct MemberStatus {
    /// The gateway's number for it.
    pub id: MemberId,
    /// Its key.
    pub key: String,
    /// Where sessions go.
    pub address: SocketAddr,
    /// Configured weight.
    pub weight: u32,
    /// Route cost.
    pub cost: Cost,
    /// Weight 0: no new bindings, bound ones continue.
    pub draining: bool,
    /// No longer listed by its source; leaves when its sessions end.
    pub removed: bool,
    /// One word: alive, suspect, dead, probation or draining.
    pub state: &'static str,
    /// The liveness state machine with its last evidence.
    pub liveness: Liveness,
    /// Sessions bound.
    pub sessions: u32,
    /// Its session ceiling.
    pub max_sessions: u32,
    /// Traffic over the window.
    pub traffic: u64,
    /// Slow-start share (1 unless on probation).
    pub slow_start_share: f64,
}

/// A live binding in the status report.
#[derive(Clone, Debug, Serialize)]
pub struct BindingStatus {
    /// Its state.
    pub state: SessionState,
    /// Time since its last activity.
    pub idle_ms: u64,
    /// Its receipts so far.
    pub receipt: Receipt,
}

/// The status endpoint's document.
#[derive(Clone, Debug, Serialize)]
pub struct Status {
    /// The gateway's clock (ms since its start).
    pub now_ms: u64,
    /// The load-share policy.
    pub policy: LoadSharePolicy,
    /// Sessions bound.
    pub active_sessions: u32,
    /// Reset bindings lingering.
    pub lingering: u32,
    /// The overall ceiling.
    pub max_sessions: u32,
    /// Persistence entries.
    pub persistence_entries: usize,
    /// Members.
    pub members: Vec<MemberStatus>,
    /// Live bindings (at most `limits.status_bindings`).
    pub bindings: Vec<BindingStatus>,
    /// Live bindings not listed.
    pub bindings_omitted: usize,
    /// Ended sessions, newest first.
    pub recent_outcomes: Vec<Receipt>,
}
