//! The LSNAT gateway core (`rserpool_lsnat::core`, RFC 2391) in virtual time: clients open TCP
//! sessions to the virtual address, the simulator plays the data plane (connects, relays a
//! request and its answer, passes FINs and RSTs on, probes the members) and the members crash
//! (process or host), restart and pause; when the seed says so the network between the gateway
//! and the members delays with jitter, loses probes, connects and segments (a lost segment costs
//! a retransmission), and cuts members off from the gateway until the cut heals. After every
//! step the gateway invariants are checked:
//! a session whose member died ends as member lost, connect failed or reset by the member,
//! never closed; a member that stays dead has its sessions ended in bounded time; every
//! selection receipt lists the inputs it used; the limits hold.
//!
//! The gateway itself crashes (state lost: a fresh core restarts with an empty session table,
//! learns its members again and probes) and pauses, and the network between the clients and the
//! gateway loses, delays and cuts as the members' side does; then the client's own view of each
//! session is checked against the receipts of the incarnation that served it.

mod checks;
mod config;
mod faults;
mod members;
mod registry;

pub use config::{GatewayConfig, GatewaySource};
use registry::{Message, Peer, Registry};
use rserpool_lsnat::source::SourceUpdate;
use rserpool_registrar::AssociationId;

use crate::config::Mutation;
use crate::queue::EventQueue;
use crate::report::{Failure, Outcome as RunOutcome, Stats};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rserpool_lsnat::core::member::{Health, MemberId, MemberSpec};
use rserpool_lsnat::core::policy::LoadSharePolicy;
use rserpool_lsnat::core::receipt::{Outcome, Side};
use rserpool_lsnat::core::{
    Action, Binding, CoreConfig, FlowKey, Gateway, Protocol, SessionId, Traffic,
};
use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

/// The gateway's virtual address.
const VIRTUAL: SocketAddr = SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, 9, 0, 1)), 80);
/// How often the data plane probes every member, and how long a probe may take.
const PROBE_INTERVAL: Duration = Duration::from_secs(2);
const PROBE_TIMEOUT: Duration = Duration::from_secs(1);
/// How long a connect to a host that does not answer takes to fail.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// A member whose host is down must have had its sessions ended by then: `fall` (3) failed
/// probes at [`PROBE_INTERVAL`], each failing after [`PROBE_TIMEOUT`], plus one interval of
/// phase and slack.
const DEAD_BOUND: Duration = Duration::from_secs(15);
/// Every session ends within this long of its opening (a pause lasts at most 30 s, a host
/// restarts within 60 s, a connect times out in 3 s, a partition heals within 40 s).
const SESSION_BOUND: Duration = Duration::from_secs(150);
/// A lost SYN is sent again after this long (doubling), as TCP does.
const SYN_RETRY: Duration = Duration::from_secs(1);
/// A lost segment of an established connection is sent again after this long (doubling).
const SEGMENT_RTO: Duration = Duration::from_millis(200);
/// A restarted gateway with a live member binds a client's session within this long (it learns
/// its members and probes them first).
const PROGRESS_BOUND: Duration = Duration::from_secs(20);
/// The part of [`PROGRESS_BOUND`] a restarted gateway may spend learning its members: a client
/// that asks after it must be bound.
const PROGRESS_GRACE: Duration = Duration::from_secs(10);

/// A member the registrar stopped listing takes no new session later than this after the
/// gateway's next resolution (the answer's round trip, and slack).
const LISTING_BOUND: Duration = Duration::from_secs(2);

/// What the gateway process is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum GatewayState {
    Up,
    /// SIGSTOP-like: the kernel accepts connections and buffers data; the process neither
    /// reads, sends, probes nor runs timers until it resumes.
    Paused,
    /// The process died: the kernel resets every connection and refuses new ones.
    ProcessDown,
    /// The host is gone: nothing answers.
    HostDown,
}

/// What a member host is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum MemberState {
    Up,
    /// SIGSTOP-like: the kernel accepts connections and buffers data; nothing is answered.
    Paused,
    /// The process died; the kernel answers with RST.
    ProcessDown,
    /// The host is gone: nothing answers.
    HostDown,
}

struct SimMember {
    address: SocketAddr,
    state: MemberState,
    /// Cut off from the gateway by a partition (nothing passes either way).
    cut: bool,
    /// Incremented at every crash: events of an earlier incarnation are stale.
    inc: u32,
    id: MemberId,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Connecting,
    /// Connected; the request goes next.
    Connected,
    /// The request was relayed; waiting for the answer.
    Requested,
    /// Answered; the client closes next.
    Answered,
    /// The client closed its direction; the member's FIN comes next.
    ClientClosed,
}

struct SimSession {
    /// The client that opened it.
    client: usize,
    member: usize,
    /// The member's incarnation when the session was bound to it.
    inc: u32,
    phase: Phase,
    opened: Duration,
    /// The bound member crashed before the session ended: (when, the host is gone).
    member_died: Option<(Duration, bool)>,
    /// The bound member was cut off from the gateway while the session was established.
    cut_at: Option<Duration>,
    /// When the current connect began.
    connect_started: Duration,
    /// The current connect's SYNs were all lost: it times out.
    connect_lost: bool,
}

/// The events of the world. Those of the data plane carry the gateway incarnation (`Gw`) they
/// belong to: a crash of the gateway makes them stale (its connections died with it).
#[derive(Debug, Clone)]
enum Ev {
    Open(usize),
    /// Client `.0`'s SYN (from port `.1`) reaches the gateway.
    SynArrives(usize, u16),
    /// The connect of a session to member `.1` (incarnation `.2`) is answered (or timed out).
    ConnectDone(Gw, SessionId, usize, u32),
    Request(Gw, SessionId),
    Answer(Gw, SessionId, u32),
    ClientClose(Gw, SessionId),
    MemberFin(Gw, SessionId, u32),
    /// A member's reset reaches a paused gateway's kernel: handled when the process runs.
    MemberReset(Gw, SessionId),
    /// The gateway's FIN after the member's reaches the client: its session is complete.
    ClientFin(Gw, SessionId, usize),
    ProbeRound,
    ProbeDone(Gw, MemberId, Result<(), String>),
    GatewayFault,
    GatewayRestart(Gw),
    GatewayResume(Gw),
    /// A restarted gateway (incarnation `.0`) must have bound a session by now.
    ProgressCheck(Gw),
    ClientFault,
    /// Client cut number `.0` heals.
    ClientHeal(u64),
    /// A message on a registrar association arrives.
    Registry(Message),
    /// The registry's cores' timers.
    RegistryTimer,
    /// The gateway of incarnation `.0` resolves its pool.
    ResolveTick(Gw),
    /// The registrar's end of an association learns that it is gone (an ABORT, or the
    /// association timing out).
    RegistrarAssociationDown(AssociationId),
    /// The registrar crashes.
    RegistrarFault,
    /// The registrar restarts.
    RegistrarRestart,
    /// Member host `.0`'s PE, which deregistered while the host was at incarnation `.1`,
    /// registers again.
    Rejoin(usize, u32),
    Fault,
    Restart(usize),
    Resume(usize),
    DeadCheck(usize, u32),
    /// Partition number `.1` heals.
    Heal(u64),
    /// Member `.0`, cut off by partition `.1`, must have had its sessions ended.
    CutCheck(usize, u64),
    Poll,
    End,
}

/// A gateway incarnation (0 at the start, one more at every crash).
type Gw = u32;

impl Ev {
    /// The incarnation a data-plane event belongs to.
    fn incarnation(&self) -> Option<Gw> {
        match self {
            Ev::ConnectDone(g, ..)
            | Ev::Request(g, _)
            | Ev::Answer(g, ..)
            | Ev::ClientClose(g, _)
            | Ev::MemberFin(g, ..)
            | Ev::MemberReset(g, _)
            | Ev::ProbeDone(g, ..) => Some(*g),
            _ => None,
        }
    }

    /// Whether the event needs the gateway process to run (a paused one handles it when it
    /// resumes).
    fn needs_process(&self) -> bool {
        matches!(
            self,
            Ev::SynArrives(..)
                | Ev::ConnectDone(..)
                | Ev::Request(..)
                | Ev::Answer(..)
                | Ev::ClientClose(..)
                | Ev::MemberFin(..)
                | Ev::MemberReset(..)
                | Ev::ProbeRound
                | Ev::ProbeDone(..)
                | Ev::Poll
                | Ev::ResolveTick(..)
        )
    }
}

/// The gateway world of one run.
pub struct GatewayWorld {
    cfg: GatewayConfig,
    rng: ChaCha8Rng,
    now: Duration,
    step: u64,
    queue: EventQueue<Ev>,
    core: Gateway,
    members: Vec<SimMember>,
    by_id: BTreeMap<MemberId, usize>,
    sessions: BTreeMap<SessionId, SimSession>,
    next_port: u16,
    poll_at: Option<Duration>,
    /// Answers a paused or cut-off member owes: delivered when it resumes and is reachable.
    owed: BTreeMap<usize, Vec<SessionId>>,
    /// The partition under way (its number), if any.
    partition: Option<u64>,
    partitions: u64,
    stats: Stats,
    failure: Option<Failure>,
    trace: Option<Vec<String>>,
    trace_hash: u64,
    /// The random stream of the gateway's own faults and of the clients' network (drawn from
    /// only when they are on, so that a seed without them runs as before they existed).
    xrng: ChaCha8Rng,
    /// The gateway process.
    gw_state: GatewayState,
    /// The current incarnation.
    gw: Gw,
    /// When the gateway last came back (restart or resume), if it ever went away.
    gw_back_at: Option<Duration>,
    /// When the current incarnation started, and whether it has bound a session since.
    restarted_at: Option<Duration>,
    bound_since_restart: u64,
    /// When a client's SYN last reached a running gateway.
    last_arrival: Option<Duration>,
    /// What a paused gateway has yet to handle, in arrival order.
    deferred: Vec<Ev>,
    /// When each member last changed state (crash, restart, pause, resume, cut, heal).
    member_changed: Vec<Duration>,
    /// Sessions whose receipt says `closed`, until their client has seen the end.
    closed_receipts: std::collections::BTreeSet<(Gw, SessionId)>,
    /// Each client's cut heals at this time (if cut).
    client_cut: Vec<Option<Duration>>,
    /// The client cut under way (its number), if any.
    client_partition: Option<u64>,
    client_partitions: u64,
    /// RSerPool members: the registrar, the PEs and the gateway's resolver.
    registry: Option<Registry>,
    registry_timer_at: Option<Duration>,
    /// Messages to a paused member's PE, delivered when it resumes.
    pe_inbox: Vec<Vec<Message>>,
    /// When the last message on each registrar association direction arrives (they stay in
    /// order, as on an SCTP stream).
    association_last: BTreeMap<(AssociationId, bool), Duration>,
    /// The member hosts the current incarnation's last member list named (RSerPool).
    last_listed: std::collections::BTreeSet<usize>,
    /// Whether the registrar lists each member host's PE, and since when it has not.
    registrar_lists: Vec<bool>,
    unlisted_since: Vec<Option<Duration>>,
    /// The member list handed to the core last (kept only for `GatewaySourceOnlyAdds`).
    source_members: Vec<MemberSpec>,
}

/// The gateway core of one incarnation, configured from `cfg`, with its static members (or
/// none yet: RSerPool members come with the first resolution).
fn build_core(cfg: &GatewayConfig, rng: ChaCha8Rng, members: &[SimMember]) -> Gateway {
    let mut core_cfg = CoreConfig {
        policy: cfg.policy,
        ..CoreConfig::default()
    };
    core_cfg.limits.max_sessions = cfg.max_sessions;
    core_cfg.limits.max_sessions_per_member = cfg.max_sessions_per_member;
    core_cfg.limits.receipt_candidates = 4;
    core_cfg.health.response_timeout = cfg.response_timeout;
    core_cfg.health.liveness.slow_start = Duration::from_secs(5);
    core_cfg.health.panic_threshold_percent = cfg.panic_threshold_percent;
    core_cfg.health.connect_retries = cfg.connect_retries;
    core_cfg.persistence.timeout = cfg.persistence;
    let mut core = Gateway::new(core_cfg, Box::new(rng));
    if cfg.source == GatewaySource::Rserpool {
        return core;
    }
    let specs = members
        .iter()
        .enumerate()
        .map(|(i, m)| MemberSpec::new(m.address).weight(1 + (i as u32 % 3)))
        .collect();
    core.set_members(Duration::ZERO, specs);
    core
}

/// Runs one gateway simulation to its end (or its first broken invariant).
pub fn run_gateway(cfg: GatewayConfig) -> RunOutcome {
    GatewayWorld::new(cfg).run()
}

impl GatewayWorld {
    /// The world of `cfg`: members configured in the core, first events scheduled.
    pub fn new(cfg: GatewayConfig) -> Self {
        let mut rng = ChaCha8Rng::seed_from_u64(cfg.seed);
        let core_rng = ChaCha8Rng::seed_from_u64(rng.random());
        let members: Vec<SimMember> = (0..cfg.members)
            .map(|i| SimMember {
                address: SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, 8, 0, i as u8 + 1)), 8080),
                state: MemberState::Up,
                cut: false,
                inc: 0,
                id: MemberId(0),
            })
            .collect();
        let core = build_core(&cfg, core_rng, &members);
        let (n_members, n_clients) = (members.len(), cfg.clients);
        let xrng = ChaCha8Rng::seed_from_u64(cfg.seed ^ 0x0c11_e47a_9a7e_0014);
        let mut w = GatewayWorld {
            trace: cfg.trace.then(Vec::new),
            cfg,
            rng,
            now: Duration::ZERO,
            step: 0,
            queue: EventQueue::new(),
            core,
            members,
            by_id: BTreeMap::new(),
            sessions: BTreeMap::new(),
            next_port: 1024,
            poll_at: None,
            owed: BTreeMap::new(),
            partition: None,
            partitions: 0,
            stats: Stats::default(),
            failure: None,
            trace_hash: 0xcbf2_9ce4_8422_2325,
            xrng,
            gw_state: GatewayState::Up,
            gw: 0,
            gw_back_at: None,
            restarted_at: None,
            bound_since_restart: 0,
            last_arrival: None,
            deferred: Vec::new(),
            member_changed: vec![Duration::ZERO; n_members],
            closed_receipts: Default::default(),
            client_cut: vec![None; n_clients],
            client_partition: None,
            client_partitions: 0,
            registry: None,
            registry_timer_at: None,
            pe_inbox: vec![Vec::new(); n_members],
            association_last: BTreeMap::new(),
            last_listed: Default::default(),
            registrar_lists: vec![false; n_members],
            unlisted_since: vec![Some(Duration::ZERO); n_members],
            source_members: Vec::new(),
        };
        w.learn_member_ids();
        if w.cfg.source == GatewaySource::Rserpool {
            let services = w
                .members
                .iter()
                .enumerate()
                .map(|(i, m)| (m.address, 1 + (i as u32 % 3)))
                .collect();
            let mut reg = Registry::new(w.cfg.seed, services);
            for i in 0..w.members.len() {
                reg.start_pe(Duration::ZERO, i, &mut w.rng);
            }
            reg.start_resolver(Duration::ZERO);
            w.registry = Some(reg);
            w.schedule(Duration::ZERO, Ev::ResolveTick(0));
            if w.cfg.registrar_faults {
                let f = w.exp(w.cfg.registrar_fault_interval);
                w.schedule(f, Ev::RegistrarFault);
            }
        }
        let cfg = format!("{:?}", w.cfg);
        w.note(|| format!("gateway config {cfg}"));
        for c in 0..w.cfg.clients {
            let at = w.exp(w.cfg.open_interval);
            w.schedule(at, Ev::Open(c));
        }
        w.schedule(PROBE_INTERVAL, Ev::ProbeRound);
        let f = w.exp(w.cfg.fault_interval);
        w.schedule(f, Ev::Fault);
        w.schedule(w.cfg.length, Ev::End);
        if w.cfg.gateway_faults {
            let f = w.xexp(w.cfg.gateway_fault_interval);
            w.schedule(f, Ev::GatewayFault);
        }
        if w.cfg.client_partitions {
            let f = w.xexp(w.cfg.fault_interval);
            w.schedule(f, Ev::ClientFault);
        }
        w
    }

    /// Maps the core's member ids (new at every incarnation, and for RSerPool members at
    /// every listing after a member was dropped) to the simulated hosts.
    fn learn_member_ids(&mut self) {
        self.by_id.clear();
        for i in 0..self.members.len() {
            let key = match self.cfg.source {
                GatewaySource::Static => self.members[i].address.to_string(),
                GatewaySource::Rserpool => format!("pe:{}", Registry::pe_id(i)),
            };
            match self.core.member_id(&key) {
                Some(id) => {
                    self.members[i].id = id;
                    self.by_id.insert(id, i);
                }
                None => self.members[i].id = MemberId(u32::MAX),
            }
        }
    }

    /// [`Self::exp`] on the stream of the gateway's faults and the clients' network.
    fn xexp(&mut self, mean: Duration) -> Duration {
        let u: f64 = self.xrng.random_range(f64::EPSILON..1.0);
        mean.mul_f64(-u.ln()).min(mean * 20)
    }

    /// One way between client `c` and the gateway: nothing on a clean client network (and no
    /// draw); else 0.1–5 ms, the jitter, a retransmission timeout (200 ms, doubling) for every
    /// time the packet is lost, and the wait for the client's cut to heal.
    fn client_hop(&mut self, c: usize) -> Duration {
        if self.cfg.client_network_is_clean() {
            return Duration::ZERO;
        }
        let mut d = Duration::from_micros(self.xrng.random_range(100..5_000));
        if !self.cfg.client_jitter.is_zero() {
            d += self
                .cfg
                .client_jitter
                .mul_f64(self.xrng.random_range(0.0..1.0));
        }
        let mut rto = SEGMENT_RTO;
        while self.cfg.client_loss > 0.0
            && rto < SEGMENT_RTO * 64
            && self.xrng.random_bool(self.cfg.client_loss)
        {
            self.stats.retransmissions += 1;
            d += rto;
            rto *= 2;
        }
        if let Some(heal) = self.client_cut[c] {
            // TCP retransmits until the cut heals.
            d += heal.saturating_sub(self.now);
        }
        d
    }

    fn schedule(&mut self, at: Duration, ev: Ev) {
        self.queue.push(at.max(self.now), ev);
    }

    fn exp(&mut self, mean: Duration) -> Duration {
        let u: f64 = self.rng.random_range(f64::EPSILON..1.0);
        mean.mul_f64(-u.ln()).min(mean * 20)
    }

    /// One way across the simulated LAN: 0.1–5 ms, plus the seed's jitter, plus a
    /// retransmission timeout (200 ms, doubling) for every time the packet is lost.
    fn hop(&mut self) -> Duration {
        let mut d = Duration::from_micros(self.rng.random_range(100..5_000));
        if !self.cfg.jitter.is_zero() {
            d += self.cfg.jitter.mul_f64(self.rng.random_range(0.0..1.0));
        }
        let mut rto = SEGMENT_RTO;
        while self.cfg.loss > 0.0 && rto < SEGMENT_RTO * 64 && self.rng.random_bool(self.cfg.loss) {
            self.stats.retransmissions += 1;
            d += rto;
            rto *= 2;
        }
        d
    }

    /// Whether a probe or a SYN is lost (never without loss; draws nothing then).
    fn lost(&mut self) -> bool {
        let lost = self.cfg.loss > 0.0 && self.rng.random_bool(self.cfg.loss);
        if lost {
            self.stats.datagrams_lost += 1;
        }
        lost
    }

    fn note(&mut self, what: impl FnOnce() -> String) {
        if let Some(t) = self.trace.as_mut() {
            t.push(format!(
                "{:>10.6} #{:<7} {}",
                self.now.as_secs_f64(),
                self.step,
                what()
            ));
        }
    }

    fn hash(&mut self, tag: u8, a: u64) {
        let mut h = self.trace_hash;
        for b in (self.now.as_nanos() as u64)
            .to_le_bytes()
            .into_iter()
            .chain([tag])
            .chain(a.to_le_bytes())
        {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
        self.trace_hash = h;
    }

    fn fail(&mut self, invariant: &'static str, message: String) {
        if self.failure.is_none() {
            self.note(|| format!("INVARIANT {invariant} BROKEN: {message}"));
            self.failure = Some(Failure {
                seed: self.cfg.seed,
                step: self.step,
                time: self.now,
                invariant,
                message,
            });
        }
    }

    /// Runs to the end (or the first failure).
    pub fn run(mut self) -> RunOutcome {
        while self.failure.is_none() {
            let Some((at, ev)) = self.queue.pop() else {
                break;
            };
            self.now = self.now.max(at);
            self.step += 1;
            if self.step > 5_000_000 {
                self.fail(
                    "step_limit",
                    "more than 5 000 000 steps: a livelock?".into(),
                );
                break;
            }
            let end = matches!(ev, Ev::End);
            self.handle(ev);
            self.apply_actions();
            if self.registry.is_some() {
                self.pump_registry();
                self.apply_actions();
            }
            self.arm_poll();
            if self.failure.is_none() {
                self.check();
            }
            if end {
                break;
            }
        }
        self.stats.steps = self.step;
        self.stats.simulated = self.now;
        RunOutcome {
            seed: self.cfg.seed,
            trace_hash: self.trace_hash,
            failure: self.failure,
            stats: self.stats,
            trace: self.trace.unwrap_or_default(),
            // The gateway world's data plane is not captured.
            pcap: None,
            pcap_left_out: 0,
        }
    }

    fn arm_poll(&mut self) {
        if let Some(next) = self.core.next_deadline() {
            if self.poll_at != Some(next) {
                self.poll_at = Some(next);
                self.schedule(next, Ev::Poll);
            }
        }
    }

    fn handle(&mut self, ev: Ev) {
        if ev.incarnation().is_some_and(|g| g != self.gw) {
            // Of a crashed incarnation: its connections and probes died with it.
            return;
        }
        if ev.needs_process() {
            match self.gw_state {
                GatewayState::Up => {}
                GatewayState::Paused => {
                    self.deferred.push(ev);
                    return;
                }
                // Nothing runs; probe rounds start again with the next incarnation.
                GatewayState::ProcessDown | GatewayState::HostDown => {
                    if matches!(ev, Ev::ProbeRound) {
                        self.schedule(self.now + PROBE_INTERVAL, Ev::ProbeRound);
                    } else if let Ev::SynArrives(c, _) = ev {
                        self.client_refused(c);
                    }
                    return;
                }
            }
        }
        match ev {
            Ev::Open(c) => self.open(c),
            Ev::SynArrives(c, port) => self.arrive(c, port),
            Ev::ConnectDone(_, id, i, inc) => self.connect_done(id, i, inc),
            Ev::Request(_, id) => self.request(id),
            Ev::Answer(_, id, inc) => self.answer(id, inc),
            Ev::ClientClose(_, id) => self.client_close(id),
            Ev::MemberFin(_, id, inc) => self.member_fin(id, inc),
            Ev::MemberReset(_, id) => self.member_reset(id),
            Ev::ClientFin(g, id, c) => self.client_fin(g, id, c),
            Ev::ProbeRound => self.probe_round(),
            Ev::ProbeDone(_, m, r) => {
                self.hash(7, u64::from(m.0) << 1 | u64::from(r.is_ok()));
                self.core.probe_result(self.now, m, r);
            }
            Ev::GatewayFault => self.gateway_fault(),
            Ev::GatewayRestart(g) => self.gateway_restart(g),
            Ev::GatewayResume(g) => self.gateway_resume(g),
            Ev::ProgressCheck(g) => self.progress_check(g),
            Ev::ClientFault => self.client_fault(),
            Ev::ClientHeal(n) => self.client_heal(n),
            Ev::Registry(m) => self.registry_message(m),
            Ev::RegistryTimer => {
                if self.registry_timer_at.is_some_and(|t| t <= self.now) {
                    self.registry_timer_at = None;
                    let members = &self.members;
                    let gateway_runs = self.gw_state == GatewayState::Up;
                    if let Some(reg) = self.registry.as_mut() {
                        reg.timers(
                            self.now,
                            |i| members[i].state == MemberState::Up,
                            gateway_runs,
                        );
                    }
                }
            }
            Ev::ResolveTick(g) => {
                if g == self.gw {
                    if let Some(reg) = self.registry.as_mut() {
                        reg.resolve(self.now);
                    }
                    // The defect: a gateway that resolves at a tenth of its configured rate.
                    let slow = self.cfg.mutation == Some(Mutation::GatewaySlowRefresh);
                    let next = self.cfg.refresh * if slow { 10 } else { 1 };
                    self.schedule(self.now + next, Ev::ResolveTick(g));
                }
            }
            Ev::RegistrarAssociationDown(a) => {
                if let Some(reg) = self.registry.as_mut() {
                    reg.registrar_association_down(self.now, a);
                }
            }
            Ev::Rejoin(i, inc) => self.rejoin(i, inc),
            Ev::RegistrarFault => self.registrar_fault(),
            Ev::RegistrarRestart => self.registrar_restart(),
            Ev::Fault => self.fault(),
            Ev::Restart(i) => self.restart(i),
            Ev::Resume(i) => self.resume(i),
            Ev::DeadCheck(i, inc) => self.dead_check(i, inc),
            Ev::Heal(n) => self.heal(n),
            Ev::CutCheck(i, n) => self.cut_check(i, n),
            Ev::Poll => {
                if self.poll_at.is_some_and(|t| t <= self.now) {
                    self.poll_at = None;
                    self.core.poll(self.now);
                }
            }
            Ev::End => self.end(),
        }
    }

    // ----- Clients and the data plane -----

    /// Client `c` opens a connection to the virtual address: its SYN crosses the client
    /// network (lost SYNs are sent again after 1 s, then 2 s; the client gives up at 3 s, as
    /// over a cut that lasts).
    fn open(&mut self, c: usize) {
        let next = self.exp(self.cfg.open_interval);
        self.schedule(self.now + next, Ev::Open(c));
        self.next_port = self.next_port.checked_add(1).unwrap_or(1024);
        let port = self.next_port;
        if self.cfg.client_network_is_clean() {
            self.arrive(c, port);
            return;
        }
        let mut wait = Duration::ZERO;
        let mut retry = SYN_RETRY;
        loop {
            let cut_until = self.client_cut[c].filter(|t| *t > self.now + wait);
            let lost = cut_until.is_some()
                || (self.cfg.client_loss > 0.0 && self.xrng.random_bool(self.cfg.client_loss));
            if !lost {
                break;
            }
            self.stats.datagrams_lost += 1;
            wait += retry;
            retry *= 2;
            if wait >= CONNECT_TIMEOUT {
                self.stats.gw_client_failed += 1;
                self.note(|| format!("client {c}: connect to the gateway timed out"));
                return;
            }
        }
        let d = wait + self.client_hop(c);
        self.schedule(self.now + d, Ev::SynArrives(c, port));
    }

    /// A client's connection that never reached a running gateway process: refused by the
    /// kernel of a dead process, or timed out at a dead host.
    fn client_refused(&mut self, c: usize) {
        self.stats.gw_client_failed += 1;
        self.note(|| format!("client {c}: the gateway is down"));
    }

    /// Client `c`'s SYN reaches the running gateway: its first packet opens a session.
    fn arrive(&mut self, c: usize, port: u16) {
        match self.gw_state {
            GatewayState::Up => {}
            GatewayState::Paused => {
                self.deferred.push(Ev::SynArrives(c, port));
                return;
            }
            GatewayState::ProcessDown | GatewayState::HostDown => {
                self.client_refused(c);
                return;
            }
        }
        let flow = FlowKey {
            protocol: Protocol::Tcp,
            client: SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, 7, 0, c as u8 + 1)), port),
            virtual_address: VIRTUAL,
        };
        self.stats.gw_sessions += 1;
        self.last_arrival = Some(self.now);
        let active = self.core.active_sessions();
        match self.core.open(self.now, flow) {
            Ok(b) => {
                self.hash(1, b.session.0);
                self.note(|| format!("client {c}: {} opens", b.session));
                self.bound_since_restart += 1;
                self.check_selection(b.session);
                self.bind(c, b);
            }
            Err(reason) => {
                self.stats.gw_refused += 1;
                self.note(|| format!("client {c}: refused ({})", reason.name()));
                if reason == rserpool_lsnat::core::receipt::RefusalReason::MaxSessions
                    && active < self.cfg.max_sessions
                {
                    let msg = format!(
                        "refused for max_sessions with {active} of {} sessions bound",
                        self.cfg.max_sessions
                    );
                    self.fail("gateway_limits", msg);
                }
            }
        }
    }

    /// The session is bound (or rebound) to a member: connect to it.
    fn bind(&mut self, client: usize, b: Binding) {
        let i = self.by_id[&b.member];
        let inc = self.members[i].inc;
        let opened = self.sessions.get(&b.session).map_or(self.now, |s| s.opened);
        self.sessions.insert(
            b.session,
            SimSession {
                client,
                member: i,
                inc,
                phase: Phase::Connecting,
                opened,
                member_died: None,
                cut_at: None,
                connect_started: self.now,
                connect_lost: false,
            },
        );
        self.note(|| format!("{}: connect to member {i} ({})", b.session, b.member));
        let at = match self.members[i].state {
            MemberState::HostDown => self.now + CONNECT_TIMEOUT,
            _ if self.members[i].cut => self.now + CONNECT_TIMEOUT,
            _ => {
                // Lost SYNs are sent again after 1 s, 2 s, ...; the connect gives up at 3 s.
                let mut wait = Duration::ZERO;
                let mut retry = SYN_RETRY;
                while wait < CONNECT_TIMEOUT && self.lost() {
                    wait += retry;
                    retry *= 2;
                }
                if wait >= CONNECT_TIMEOUT {
                    let s = self.sessions.get_mut(&b.session).expect("inserted");
                    s.connect_lost = true;
                    self.now + CONNECT_TIMEOUT
                } else {
                    let rtt = self.hop() + self.hop();
                    self.now + wait + rtt
                }
            }
        };
        self.schedule(at, Ev::ConnectDone(self.gw, b.session, i, inc));
    }

    fn connect_done(&mut self, id: SessionId, i: usize, inc: u32) {
        let Some(s) = self.sessions.get(&id) else {
            return;
        };
        if s.phase != Phase::Connecting || s.member != i || s.inc != inc {
            // An earlier binding's attempt.
            return;
        }
        if s.connect_lost {
            self.connect_failed(id, "connect timed out");
            return;
        }
        if self.members[i].cut {
            // Cut off while the handshake was under way: it times out unless the cut heals first.
            let deadline = s.connect_started + CONNECT_TIMEOUT;
            if self.now < deadline {
                self.schedule(deadline, Ev::ConnectDone(self.gw, id, i, inc));
            } else {
                self.connect_failed(id, "connect timed out");
            }
            return;
        }
        if self.members[i].inc != inc {
            // The member crashed while the handshake was under way.
            let reason = if self.members[i].state == MemberState::HostDown {
                "connect timed out"
            } else {
                "connection refused"
            };
            self.connect_failed(id, reason);
            return;
        }
        match self.members[i].state {
            // The kernel completes the handshake even for a stopped process.
            MemberState::Up | MemberState::Paused => {
                self.hash(2, id.0);
                self.core.connected(self.now, id);
                self.sessions.get_mut(&id).expect("present").phase = Phase::Connected;
                // The client's request crosses both networks.
                let c = self.sessions[&id].client;
                let d = self.hop() + self.client_hop(c);
                self.schedule(self.now + d, Ev::Request(self.gw, id));
            }
            MemberState::ProcessDown => self.connect_failed(id, "connection refused"),
            MemberState::HostDown => self.connect_failed(id, "connect timed out"),
        }
    }

    fn connect_failed(&mut self, id: SessionId, reason: &str) {
        self.hash(3, id.0);
        match self.core.connect_failed(self.now, id, reason) {
            Some(b) => {
                self.check_selection(id);
                let c = self.sessions.get(&id).map_or(0, |s| s.client);
                self.bind(c, b);
            }
            None => self.ended(
                id,
                Outcome::ConnectFailed {
                    reason: reason.to_string(),
                },
            ),
        }
    }

    fn request(&mut self, id: SessionId) {
        let Some(s) = self.sessions.get_mut(&id) else {
            return;
        };
        if s.phase != Phase::Connected {
            return;
        }
        if let Some(heal) = self.client_cut[s.client].filter(|t| *t > self.now) {
            // The client's request waits behind its cut (TCP retransmits it).
            self.schedule(heal, Ev::Request(self.gw, id));
            return;
        }
        s.phase = Phase::Requested;
        let (i, inc) = (s.member, s.inc);
        self.core.client_data(self.now, id);
        self.core.activity(
            self.now,
            id,
            Traffic {
                bytes: 100,
                packets: 1,
            },
            Traffic::default(),
        );
        self.relay_request(id, i, inc);
    }

    fn relay_request(&mut self, id: SessionId, i: usize, inc: u32) {
        if self.members[i].inc != inc {
            return;
        }
        if self.members[i].cut {
            // TCP keeps retransmitting; it arrives when the cut heals.
            self.owed.entry(i).or_default().push(id);
            return;
        }
        match self.members[i].state {
            MemberState::Up => {
                // The member works on it for up to 200 ms.
                let d = self.hop() + Duration::from_micros(self.rng.random_range(0..200_000));
                self.schedule(self.now + d, Ev::Answer(self.gw, id, inc));
            }
            MemberState::Paused => self.owed.entry(i).or_default().push(id),
            MemberState::ProcessDown | MemberState::HostDown => {}
        }
    }

    fn answer(&mut self, id: SessionId, inc: u32) {
        let Some(s) = self.sessions.get_mut(&id) else {
            return;
        };
        if s.phase != Phase::Requested || s.inc != inc {
            return;
        }
        let (i, c) = (s.member, s.client);
        if self.members[i].inc != inc {
            return;
        }
        if self.members[i].state == MemberState::Paused || self.members[i].cut {
            self.owed.entry(i).or_default().push(id);
            return;
        }
        s.phase = Phase::Answered;
        self.hash(4, id.0);
        self.core.reached(self.now, id);
        self.core.activity(
            self.now,
            id,
            Traffic::default(),
            Traffic {
                bytes: 1000,
                packets: 1,
            },
        );
        // The answer goes to the client, which reads it and closes; its FIN comes back.
        let d = self.hop() + Duration::from_millis(self.rng.random_range(0..3000));
        let d = d + self.client_hop(c) + self.client_hop(c);
        self.schedule(self.now + d, Ev::ClientClose(self.gw, id));
    }

    fn client_close(&mut self, id: SessionId) {
        let Some(s) = self.sessions.get_mut(&id) else {
            return;
        };
        if s.phase != Phase::Answered {
            return;
        }
        if let Some(heal) = self.client_cut[s.client].filter(|t| *t > self.now) {
            self.schedule(heal, Ev::ClientClose(self.gw, id));
            return;
        }
        s.phase = Phase::ClientClosed;
        let (i, inc) = (s.member, s.inc);
        self.core.half_closed(self.now, id, Side::Client);
        if self.members[i].cut && self.members[i].inc == inc {
            self.owed.entry(i).or_default().push(id);
        } else if self.members[i].state == MemberState::Up && self.members[i].inc == inc {
            let d = self.hop();
            self.schedule(self.now + d, Ev::MemberFin(self.gw, id, inc));
        } else if self.members[i].state == MemberState::Paused {
            self.owed.entry(i).or_default().push(id);
        }
    }

    fn member_fin(&mut self, id: SessionId, inc: u32) {
        let Some(s) = self.sessions.get(&id) else {
            return;
        };
        if s.phase != Phase::ClientClosed || s.inc != inc || self.members[s.member].inc != inc {
            return;
        }
        let c = s.client;
        if self.members[s.member].state == MemberState::Paused || self.members[s.member].cut {
            let i = s.member;
            self.owed.entry(i).or_default().push(id);
            return;
        }
        self.hash(5, id.0);
        self.core.half_closed(self.now, id, Side::Member);
        if self.core.closed(self.now, id, Outcome::Closed) {
            self.ended(id, Outcome::Closed);
            self.closed_receipts.insert((self.gw, id));
            // The gateway passes the FIN on: the client has its complete answer.
            let d = self.client_hop(c);
            self.schedule(self.now + d, Ev::ClientFin(self.gw, id, c));
        }
    }

    /// The end of a session reaches its client as a FIN after the whole answer: the client
    /// counts it complete. The receipts of the incarnation that served it must say `closed`
    /// (`gateway_client_view`).
    fn client_fin(&mut self, gw: Gw, id: SessionId, c: usize) {
        if let Some(heal) = self.client_cut[c].filter(|t| *t > self.now) {
            // Behind a cut: TCP delivers it when the cut heals.
            self.schedule(heal, Ev::ClientFin(gw, id, c));
            return;
        }
        self.stats.checks += 1;
        if !self.closed_receipts.remove(&(gw, id)) {
            let msg = format!(
                "client {c} saw {id} of gateway incarnation {gw} complete (answer and FIN), but the receipts of that incarnation do not record it `closed` (now incarnation {})",
                self.gw
            );
            self.fail("gateway_client_view", msg);
        }
    }

    /// The data plane saw a reset from a member whose process died.
    fn member_reset(&mut self, id: SessionId) {
        if self.cfg.mutation == Some(Mutation::GatewayForgetsResets) {
            // The defect: the data plane drops the connection without telling the core.
            self.sessions.remove(&id);
            return;
        }
        if self
            .core
            .closed(self.now, id, Outcome::Reset { by: Side::Member })
        {
            self.ended(id, Outcome::Reset { by: Side::Member });
        }
    }

    /// What the core asked the data plane to do (close sessions it ended).
    fn apply_actions(&mut self) {
        for a in self.core.take_actions() {
            match a {
                Action::Close { session, outcome } => {
                    self.hash(6, session.0);
                    if !self.sessions.contains_key(&session) {
                        let msg = format!(
                            "incarnation {} ends {session} ({}), which is not one of its open sessions",
                            self.gw,
                            outcome.name()
                        );
                        self.fail("gateway_receipts_own_sessions", msg);
                    }
                    self.ended(session, outcome);
                }
                other => self.note(|| format!("unknown action {other:?}")),
            }
        }
    }

    /// A session ended with `outcome` (as the core recorded it): judge it.
    fn ended(&mut self, id: SessionId, outcome: Outcome) {
        let Some(s) = self.sessions.remove(&id) else {
            return;
        };
        self.note(|| format!("{id}: ended {outcome}"));
        match &outcome {
            Outcome::Closed => self.stats.gw_closed += 1,
            Outcome::MemberLost { .. } => self.stats.gw_member_lost += 1,
            Outcome::ConnectFailed { .. } => self.stats.gw_connect_failed += 1,
            Outcome::Reset { .. } => self.stats.gw_reset += 1,
            _ => {}
        }
        if let Some((when, host)) = s.member_died {
            let ok = matches!(
                outcome,
                Outcome::MemberLost { .. }
                    | Outcome::ConnectFailed { .. }
                    | Outcome::Reset { by: Side::Member }
            );
            if !ok {
                let msg = format!(
                    "{id}, bound to member {} whose {} died at {when:?}, ended as `{outcome}` ({})",
                    s.member,
                    if host { "host" } else { "process" },
                    outcome.name()
                );
                self.fail("gateway_member_lost", msg);
            }
        }
    }

    fn probe_round(&mut self) {
        self.schedule(self.now + PROBE_INTERVAL, Ev::ProbeRound);
        for (m, _) in self.core.probe_targets() {
            let Some(&i) = self.by_id.get(&m) else {
                continue;
            };
            // The defect: probes that pass the cut.
            let through = self.cfg.mutation == Some(Mutation::GatewayProbesThroughCut);
            let unanswered = (self.members[i].cut && !through) || self.lost();
            let (at, r) = match self.members[i].state {
                _ if unanswered => (self.now + PROBE_TIMEOUT, Err("timed out".to_string())),
                MemberState::Up | MemberState::Paused => {
                    let rtt = self.hop() + self.hop();
                    (self.now + rtt, Ok(()))
                }
                MemberState::ProcessDown => {
                    let rtt = self.hop() + self.hop();
                    (self.now + rtt, Err("connection refused".to_string()))
                }
                MemberState::HostDown => (self.now + PROBE_TIMEOUT, Err("timed out".to_string())),
            };
            self.schedule(at, Ev::ProbeDone(self.gw, m, r));
        }
    }
}
