//! The simulated world: hosts running the real cores, the network between them, the event queue
//! in virtual time, faults, workload, and the invariants checked after every step.

use crate::capture::{Capture, ASAP_GROUP, ENRP_GROUP};
use crate::config::{Mutation, SimConfig, Transports};
use crate::fixtures::sctp_peer;
use crate::queue::EventQueue;
use crate::report::{Failure, Outcome, Stats};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rserpool_endpoint::pe::{PeEvent, PoolElementConfig, PoolElementCore};
use rserpool_endpoint::pu::{RequestId, Resolver, ResolverConfig, ResolverEvent};
use rserpool_endpoint::server::{ServerAction, ServerConfig, ServerEvent, SessionServer};
use rserpool_endpoint::session::{
    CandidateSource, FailoverReason, Outcome as SessionOutcome, PoolUserSession, SessionAction,
    SessionConfig, SessionEvent,
};
use rserpool_registrar::enrp::{Enrp, EnrpConfig, EnrpDestination, EnrpEvent, Source};
use rserpool_registrar::{
    AnnounceConfig, AssociationId, AssociationKind, Destination, PeerInfo, Profile, Registrar,
    RegistrarConfig, RegistrarEvent, RemovalCause,
};
use rserpool_services::calcapp::{
    CalcAppClient, CalcAppClientConfig, CalcAppCookie, CalcAppMessage, CalcAppServer,
    CalcAppServerConfig,
};
use rserpool_services::pingpong::{
    PingPongClient, PingPongClientConfig, PingPongServer, PingPongServerConfig,
};
use rserpool_services::{
    ClientOutput, ClientReport, ClientService, Now, ServerReport, PPID_CALCAPP, PPID_PINGPONG,
};
use rserpool_wire::asap::AsapMessage;
use rserpool_wire::enrp::EnrpMessage;
use rserpool_wire::{
    Codec, Message, PoolElementId, PoolHandle, PoolPolicy, Protocol, RegistrarId, TransportAddress,
    TransportUse, UserTransport,
};
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::rc::Rc;
use std::time::Duration;

mod hostile;
mod net;
mod sessions;

/// The registrars' ASAP port.
const ASAP_PORT: u16 = 3863;
/// The registrars' ENRP port.
const ENRP_PORT: u16 = 9901;
/// The port PEs and PUs hold their registrar associations on.
const CLIENT_PORT: u16 = 5000;
/// The PEs' user transport port (their PingPong service).
const SESSION_PORT: u16 = 7000;
/// The port a PU's sessions come from.
const PU_SESSION_PORT: u16 = 5001;
/// How long a session may be without a PE (opening or failing over) before `session_progress`
/// calls it stuck: 5 attempts of at most a resolution, a connection and a back-off (5 + 5 + 2 s)
/// are 60 s on the PU's clock.
const SESSION_MOVE_BOUND: Duration = Duration::from_secs(90);
/// Slack over the PingPong reply timeout before an unanswered Ping on a bound session counts
/// as forgotten (the client must have failed over by then).
const PING_SLACK: Duration = Duration::from_secs(1);
/// Window after a partition heals in which takeovers are not compared (peers were legitimately
/// unable to see each other).
const PARTITION_SETTLE: Duration = Duration::from_secs(30);

/// A simulated host.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum HostId {
    /// Registrar number n.
    Registrar(usize),
    /// Pool element number n.
    PoolElement(usize),
    /// Pool user number n.
    PoolUser(usize),
    /// Hostile host number n (`--hostile N`): owns nothing, attacks the registrars.
    Hostile(usize),
}

impl std::fmt::Display for HostId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HostId::Registrar(i) => write!(f, "R{i}"),
            HostId::PoolElement(i) => write!(f, "PE{i}"),
            HostId::PoolUser(i) => write!(f, "PU{i}"),
            HostId::Hostile(i) => write!(f, "X{i}"),
        }
    }
}

/// Which endpoint of a host an association belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Service {
    Asap,
    Enrp,
    /// A PU's session with a PE's user transport (data and the ASAP control channel; each
    /// message carries its PPID in its first four bytes).
    Session,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum AssocState {
    Connecting,
    Up,
    Closed,
}

/// One association between two hosts: reliable, ordered, message boundaries kept; lost when the
/// hosts cannot reach each other for the association timeout, or when one end closes or dies.
struct Assoc {
    ends: [HostId; 2],
    /// Each end's incarnation when the association was made: a restarted host does not know it.
    incs: [u32; 2],
    addrs: [SocketAddr; 2],
    service: Service,
    state: AssocState,
    /// `queues[i]`: messages on their way to `ends[i]`, with the time each can arrive.
    queues: [VecDeque<(Duration, Rc<[u8]>)>; 2],
    last_ready: [Duration; 2],
    cut_since: Option<Duration>,
    /// A session association one end (this side) aborted: what that end had sent still
    /// arrives before the abort, nothing more moves.
    closing: Option<usize>,
    /// TCP-mapped (one address pair, the mapping's keep-alive timeout) rather than SCTP.
    tcp: bool,
    /// The end whose host crashed while the other still believes the association up: a
    /// restarted host answers what arrives on it with an ABORT (SCTP) or RST (TCP), and its
    /// new association from the same address pair restarts it (SCTP_RESTART) or resets it.
    half_open: Option<usize>,
    /// Which ends were told that the association is down (each is told once).
    down_seen: [bool; 2],
    /// Associations of the initiator's previous incarnation that this one restarts at the
    /// peer when it comes up (SCTP_RESTART: the peer's old association is reported down first).
    restarts: Vec<u64>,
}

#[derive(Debug, Clone)]
enum Ev {
    Timer(HostId),
    Deliver {
        assoc: u64,
        side: usize,
    },
    Datagram {
        to: HostId,
        from: SocketAddr,
        bytes: Rc<[u8]>,
    },
    Established(u64),
    ConnectFailed(u64),
    /// One end of an association learns that it is gone.
    Down {
        assoc: u64,
        side: usize,
    },
    CheckCut(u64),
    Fault,
    Restart(HostId),
    Heal,
    Churn,
    Rejoin(usize),
    Resolve(usize),
    Resume(HostId),
    /// PU k starts a new session in slot n.
    SessionStart(usize, usize),
    /// A paused host's TCP-mapped association: its peer's keep-alive timeout is due.
    KeepAliveDue(u64, HostId),
    /// A cut address of a multi-homed host comes back.
    HealPath(IpAddr),
    /// Hostile host n acts.
    Hostile(usize),
    /// The periodic check that every session makes progress.
    SessionAudit,
    EndChaos,
    Finish,
}

struct RegHost {
    ip: IpAddr,
    id: RegistrarId,
    alive: bool,
    inc: u32,
    core: Option<Box<(Registrar, Enrp)>>,
    enrp_opened: BTreeMap<Vec<SocketAddr>, u64>,
    asap_opened: BTreeMap<SocketAddr, u64>,
    armed: Option<Duration>,
    /// Consecutive timer wake-ups at one instant (a core that never moves its deadline on).
    same_instant: (Duration, u32),
    /// When the current incarnation started.
    started_at: Duration,
}

struct PeHost {
    ip: IpAddr,
    id: PoolElementId,
    pool: PoolHandle,
    alive: bool,
    inc: u32,
    core: Option<PoolElementCore>,
    home: Option<u64>,
    pending: Option<u64>,
    others: Vec<u64>,
    leaving: bool,
    /// Left the pool (deregistered); rejoins later.
    left: bool,
    /// When it last stopped existing for the pool (crash or leave).
    ended_at: Option<Duration>,
    armed: Option<Duration>,
    same_instant: (Duration, u32),
    /// The session side of its PingPong service (absent while down or gone from the pool).
    server: Option<SessionServer>,
    /// Session associations it accepted.
    sessions: BTreeSet<u64>,
    /// CalcApp jobs it runs now, as its service reported them: (session association, job).
    jobs: BTreeSet<(u64, u32)>,
    /// The PEs its business card names, in failover order (empty: it sends none).
    card: Vec<usize>,
}

/// The application of a session: PingPong or CalcApp.
enum Client {
    PingPong(PingPongClient),
    CalcApp(CalcAppClient),
}

impl Client {
    fn service(&mut self) -> &mut dyn ClientService {
        match self {
            Client::PingPong(c) => c,
            Client::CalcApp(c) => c,
        }
    }

    fn poll_timeout(&self) -> Option<Duration> {
        match self {
            Client::PingPong(c) => c.poll_timeout(),
            Client::CalcApp(c) => c.poll_timeout(),
        }
    }
}

/// What the checker knows of a CalcApp session's jobs.
#[derive(Default)]
struct JobLedger {
    /// Jobs queued.
    queued: BTreeSet<u32>,
    /// Jobs reported completed.
    completed: BTreeSet<u32>,
    /// The job requested and not yet completed.
    current: Option<u32>,
    /// Per job, the progress of the last cookie echoed for it (never goes back).
    echoed: BTreeMap<u32, u64>,
}

/// One PingPong session of a PU, with what the checker knows of it.
struct SimSession {
    /// Run-wide session number (for the trace).
    no: u64,
    core: PoolUserSession,
    client: Client,
    /// Its CalcApp jobs (empty for PingPong).
    jobs: JobLedger,
    /// The association the session uses (connecting or up).
    assoc: Option<u64>,
    failovers_seen: u64,
    /// The first message on the current association, held back by
    /// [`Mutation::ReorderedSessionStart`].
    held: Option<Vec<u8>>,
    /// Messages sent on the current association.
    sent_on_assoc: u32,
    /// Pings sent (message number -> when last sent, global time).
    sent: BTreeMap<u64, Duration>,
    answered: BTreeSet<u64>,
    /// Since when the session has no PE (opening or failing over), global time.
    moving_since: Option<Duration>,
    /// When a Ping was last sent or answered, or the session last got a PE (global time).
    last_progress: Duration,
    /// The PEs of the last business card received, less those selected since, in order: what
    /// the next failover must choose from (`business_card_candidates`).
    card_left: Vec<PoolElementId>,
    /// The PE the application asked to leave, until the next PE is selected.
    requested_from: Option<PoolElementId>,
    /// Why the failover under way started (the receipt must say the same).
    failing_because: Option<FailoverReason>,
}

struct PuHost {
    ip: IpAddr,
    alive: bool,
    inc: u32,
    resolver: Resolver,
    assoc: Option<u64>,
    connecting: Option<u64>,
    cursor: usize,
    failed_round: usize,
    last_connected: Duration,
    /// Requests asked and not yet ended: request -> (pool, asked at).
    outstanding: BTreeMap<RequestId, (PoolHandle, Duration)>,
    armed: Option<Duration>,
    same_instant: (Duration, u32),
    /// Its sessions, one per slot (`None` between two sessions).
    sessions: Vec<Option<SimSession>>,
    /// Resolutions asked by a session: request -> slot.
    session_requests: BTreeMap<RequestId, usize>,
}

/// The simulated world of one run.
pub struct World {
    cfg: SimConfig,
    rng: ChaCha8Rng,
    now: Duration,
    step: u64,
    queue: EventQueue<Ev>,
    regs: Vec<RegHost>,
    pes: Vec<PeHost>,
    pus: Vec<PuHost>,
    pools: Vec<PoolHandle>,
    assocs: BTreeMap<u64, Assoc>,
    next_assoc: u64,
    host_delay: BTreeMap<HostId, Duration>,
    /// Partition side of each host (0 when healed).
    side: BTreeMap<HostId, u8>,
    partition_active: bool,
    settle_until: Duration,
    chaos: bool,
    codec: Codec,
    /// Takeover winners per (target ID, target incarnation), with when each won, for
    /// `takeover_unique`.
    winners: BTreeMap<(RegistrarId, u32), BTreeMap<RegistrarId, Duration>>,
    /// When each registrar (by the ID it runs under) was last heard on ENRP by a peer, from its
    /// own host: a target heard after a takeover of it was alive, so a later takeover of it is
    /// another episode, for `takeover_unique`.
    enrp_heard: BTreeMap<RegistrarId, Duration>,
    trace_hash: u64,
    trace: Option<Vec<String>>,
    /// The pcap file of delivered traffic, when asked for.
    capture: Option<Capture>,
    stats: Stats,
    failure: Option<Failure>,
    next_reg_id: u32,
    /// Every host by address, and every PE by identifier (fixed for the run).
    by_ip: BTreeMap<IpAddr, HostId>,
    pe_by_id: BTreeMap<PoolElementId, usize>,
    /// Each host's clock drift in parts per million (fixed for the run).
    drift: BTreeMap<HostId, i64>,
    /// Paused hosts and until when.
    paused: BTreeMap<HostId, Duration>,
    /// Until when a host counts as recently paused (takeovers of it are expected).
    paused_recently: BTreeMap<HostId, Duration>,
    next_session: u64,
    /// When a registrar last probed each PE because pool users reported it (for
    /// [`Mutation::LostProbeAnswers`]).
    last_probed: BTreeMap<PoolElementId, Duration>,
    /// Session associations that came up while their session held a cookie: the cookie the
    /// PE must receive first.
    expect_echo: BTreeMap<u64, Vec<u8>>,
    /// CalcApp cookies echoed on session associations: what a PE resuming the job must start
    /// from.
    echoed_jobs: BTreeMap<u64, CalcAppCookie>,
    /// Every cookie a PE sent, by its bytes: who sealed it, for whom, when.
    issued: BTreeMap<Vec<u8>, sessions::CookieOrigin>,
    /// Per session association: whether the PE must accept the cookie echoed there, and why.
    verdicts: BTreeMap<u64, (bool, String)>,
    /// Randomness of the transports, multi-homing, path cuts and hostile hosts: a stream of
    /// its own, so that a run without them draws from `rng` exactly as before they existed.
    net_rng: ChaCha8Rng,
    /// Hosts without SCTP (they use the TCP mapping).
    tcp_only: BTreeSet<HostId>,
    /// The second address of each multi-homed host.
    second_ip: BTreeMap<HostId, IpAddr>,
    /// Addresses cut off now (a path fault), with the time they were cut.
    cut_ips: BTreeMap<IpAddr, Duration>,
    /// When each paused host was paused.
    paused_since: BTreeMap<HostId, Duration>,
    /// The hostile hosts.
    hostiles: Vec<hostile::HostileHost>,
    /// Registrations a hostile host holds (a claim granted to it): registrar, PE.
    stranger_held: BTreeSet<(usize, PoolElementId)>,
}

impl World {
    /// Builds the world of `cfg`: hosts started, first events scheduled.
    pub fn new(cfg: SimConfig) -> World {
        let rng = ChaCha8Rng::seed_from_u64(cfg.seed);
        let cfg_seed = cfg.seed;
        let pools = (0..cfg.pools.max(1))
            .map(|i| PoolHandle::from(format!("Pool{i}").as_str()))
            .collect();
        let mut w = World {
            trace: cfg.trace.then(Vec::new),
            capture: cfg.pcap_limit.map(Capture::new),
            codec: Codec::new(RegistrarConfig::new(Profile::Rsplib).codec),
            cfg,
            rng,
            now: Duration::ZERO,
            step: 0,
            queue: EventQueue::new(),
            regs: Vec::new(),
            pes: Vec::new(),
            pus: Vec::new(),
            pools,
            assocs: BTreeMap::new(),
            next_assoc: 1,
            host_delay: BTreeMap::new(),
            side: BTreeMap::new(),
            partition_active: false,
            settle_until: Duration::ZERO,
            chaos: true,
            winners: BTreeMap::new(),
            enrp_heard: BTreeMap::new(),
            trace_hash: 0xcbf2_9ce4_8422_2325,
            stats: Stats::default(),
            failure: None,
            next_reg_id: 0,
            by_ip: BTreeMap::new(),
            pe_by_id: BTreeMap::new(),
            drift: BTreeMap::new(),
            paused: BTreeMap::new(),
            paused_recently: BTreeMap::new(),
            next_session: 0,
            last_probed: BTreeMap::new(),
            expect_echo: BTreeMap::new(),
            echoed_jobs: BTreeMap::new(),
            issued: BTreeMap::new(),
            verdicts: BTreeMap::new(),
            net_rng: ChaCha8Rng::seed_from_u64(cfg_seed ^ 0x0e7_7c9f_1a5e_d00d),
            tcp_only: BTreeSet::new(),
            second_ip: BTreeMap::new(),
            cut_ips: BTreeMap::new(),
            paused_since: BTreeMap::new(),
            hostiles: Vec::new(),
            stranger_held: BTreeSet::new(),
        };
        w.build();
        w
    }

    fn build(&mut self) {
        let cfg = format!("{:?}", self.cfg);
        self.note(|| format!("config {cfg}"));
        let nr = self.cfg.registrars.max(1);
        for i in 0..nr {
            let ip = IpAddr::V4(Ipv4Addr::new(10, 0, 0, i as u8 + 1));
            self.next_reg_id += 1;
            self.regs.push(RegHost {
                ip,
                id: RegistrarId(0x1000 + self.next_reg_id),
                alive: false,
                inc: 0,
                core: None,
                enrp_opened: BTreeMap::new(),
                asap_opened: BTreeMap::new(),
                armed: None,
                same_instant: (Duration::ZERO, 0),
                started_at: Duration::ZERO,
            });
        }
        for j in 0..self.cfg.pool_elements {
            let ip = IpAddr::V4(Ipv4Addr::new(10, 1, (j / 250) as u8, (j % 250) as u8 + 1));
            let pool = self.pools[j % self.pools.len()].clone();
            self.pes.push(PeHost {
                ip,
                id: PoolElementId(0x100 + j as u32),
                pool,
                alive: false,
                inc: 0,
                core: None,
                home: None,
                pending: None,
                others: Vec::new(),
                leaving: false,
                left: false,
                ended_at: None,
                armed: None,
                same_instant: (Duration::ZERO, 0),
                server: None,
                sessions: BTreeSet::new(),
                jobs: BTreeSet::new(),
                card: Vec::new(),
            });
        }
        for k in 0..self.cfg.pool_users {
            let ip = IpAddr::V4(Ipv4Addr::new(10, 2, (k / 250) as u8, (k % 250) as u8 + 1));
            self.pus.push(PuHost {
                ip,
                alive: true,
                inc: 0,
                resolver: Resolver::new(ResolverConfig {
                    items: Some(3),
                    ..ResolverConfig::default()
                }),
                assoc: None,
                connecting: None,
                cursor: k,
                failed_round: 0,
                last_connected: Duration::ZERO,
                outstanding: BTreeMap::new(),
                armed: None,
                same_instant: (Duration::ZERO, 0),
                sessions: (0..self.cfg.sessions_per_pu).map(|_| None).collect(),
                session_requests: BTreeMap::new(),
            });
        }
        for (i, r) in self.regs.iter().enumerate() {
            self.by_ip.insert(r.ip, HostId::Registrar(i));
        }
        for (j, p) in self.pes.iter().enumerate() {
            self.by_ip.insert(p.ip, HostId::PoolElement(j));
            self.pe_by_id.insert(p.id, j);
        }
        for (k, p) in self.pus.iter().enumerate() {
            self.by_ip.insert(p.ip, HostId::PoolUser(k));
        }
        let hosts = self.hosts();
        for h in hosts {
            let d = self
                .rng
                .random_range(0..=self.cfg.link.host_delay_max.as_nanos() as u64);
            self.host_delay.insert(h, Duration::from_nanos(d));
            let m = i64::from(self.cfg.max_drift_ppm);
            if m > 0 {
                let ppm = self.rng.random_range(-m..=m);
                self.drift.insert(h, ppm);
            }
        }
        self.build_net();
        for i in 0..nr {
            self.start_registrar(i);
        }
        for j in 0..self.pes.len() {
            // PEs start spread over the first second.
            let at = Duration::from_micros(self.rng.random_range(0..1_000_000));
            self.schedule(at, Ev::Restart(HostId::PoolElement(j)));
        }
        for k in 0..self.pus.len() {
            let at = self.exp(self.cfg.resolve_interval);
            self.schedule(at, Ev::Resolve(k));
        }
        let first_fault = self.exp(self.cfg.faults.mean_interval);
        self.schedule(first_fault, Ev::Fault);
        if let Some(m) = self.cfg.churn {
            let at = self.exp(m);
            self.schedule(at, Ev::Churn);
        }
        // Sessions draw from the seed only when there are any, so that a run without them is
        // the run it was before they existed.
        for k in 0..self.pus.len() {
            for n in 0..self.cfg.sessions_per_pu {
                let at = self.uniform(Duration::from_secs(1), Duration::from_secs(5));
                self.schedule(at, Ev::SessionStart(k, n));
            }
        }
        if self.cfg.sessions_per_pu > 0 {
            self.schedule(Duration::from_secs(1), Ev::SessionAudit);
        }
        self.schedule(self.cfg.chaos, Ev::EndChaos);
        self.schedule(self.cfg.chaos + self.cfg.quiet, Ev::Finish);
        // Drawn only when the seed has business cards (a seed without runs as before them).
        self.draw_business_cards();
    }

    /// The hosts the faults pick from (hostile hosts are never crashed, cut or paused).
    fn hosts(&self) -> Vec<HostId> {
        (0..self.regs.len())
            .map(HostId::Registrar)
            .chain((0..self.pes.len()).map(HostId::PoolElement))
            .chain((0..self.pus.len()).map(HostId::PoolUser))
            .collect()
    }

    // ----- Scheduling and randomness -----

    fn schedule(&mut self, at: Duration, ev: Ev) {
        self.queue.push(at.max(self.now), ev);
    }

    /// An exponentially distributed duration with the given mean.
    fn exp(&mut self, mean: Duration) -> Duration {
        let u: f64 = self.rng.random_range(f64::EPSILON..1.0);
        mean.mul_f64(-u.ln()).min(mean * 20)
    }

    fn uniform(&mut self, lo: Duration, hi: Duration) -> Duration {
        if hi <= lo {
            return lo;
        }
        Duration::from_nanos(
            self.rng
                .random_range(lo.as_nanos() as u64..hi.as_nanos() as u64),
        )
    }

    fn delay(&mut self, a: HostId, b: HostId) -> Duration {
        let base = self.cfg.link.delay_min + self.host_delay[&a] + self.host_delay[&b];
        let j = self.cfg.link.jitter;
        base + self.uniform(Duration::ZERO, j)
    }

    /// Host `h`'s clock at global time `t`: it runs `drift` parts per million fast or slow.
    fn local_at(&self, h: HostId, t: Duration) -> Duration {
        let ppm = i128::from(self.drift.get(&h).copied().unwrap_or(0));
        let n = t.as_nanos() as i128;
        Duration::from_nanos((n + n * ppm / 1_000_000).max(0) as u64)
    }

    /// Host `h`'s clock now (what its cores are told).
    fn local(&self, h: HostId) -> Duration {
        self.local_at(h, self.now)
    }

    /// The first global time at which host `h`'s clock shows `local` (or later).
    fn global_of(&self, h: HostId, local: Duration) -> Duration {
        let ppm = i128::from(self.drift.get(&h).copied().unwrap_or(0));
        let l = local.as_nanos() as i128;
        let mut g = Duration::from_nanos(
            ((l * 1_000_000 + 999_999 + ppm) / (1_000_000 + ppm)).max(0) as u64,
        );
        while self.local_at(h, g) < local {
            g += Duration::from_nanos(1);
        }
        while g > Duration::ZERO && self.local_at(h, g - Duration::from_nanos(1)) >= local {
            g -= Duration::from_nanos(1);
        }
        g
    }

    fn cut(&self, a: HostId, b: HostId) -> bool {
        self.side.get(&a).copied().unwrap_or(0) != self.side.get(&b).copied().unwrap_or(0)
    }

    /// The [`Mutation::OneWayEnrp`] defect: ENRP from registrar 1 to registrar 0 vanishes after
    /// the first 30 s (once they know each other).
    fn one_way_cut(&self, from: HostId, to: HostId, service: Service) -> bool {
        self.cfg.mutation == Some(Mutation::OneWayEnrp)
            && self.now >= Duration::from_secs(30)
            && service == Service::Enrp
            && from == HostId::Registrar(1)
            && to == HostId::Registrar(0)
    }

    fn alive(&self, h: HostId) -> bool {
        match h {
            HostId::Registrar(i) => self.regs[i].alive,
            HostId::PoolElement(j) => self.pes[j].alive,
            HostId::PoolUser(k) => self.pus[k].alive,
            HostId::Hostile(_) => true,
        }
    }

    fn inc(&self, h: HostId) -> u32 {
        match h {
            HostId::Registrar(i) => self.regs[i].inc,
            HostId::PoolElement(j) => self.pes[j].inc,
            HostId::PoolUser(k) => self.pus[k].inc,
            HostId::Hostile(_) => 0,
        }
    }

    fn addr_of(&self, h: HostId, service: Service) -> SocketAddr {
        match h {
            HostId::Registrar(i) => SocketAddr::new(
                self.regs[i].ip,
                if service == Service::Asap {
                    ASAP_PORT
                } else {
                    ENRP_PORT
                },
            ),
            HostId::PoolElement(j) => SocketAddr::new(
                self.pes[j].ip,
                if service == Service::Session {
                    SESSION_PORT
                } else {
                    CLIENT_PORT
                },
            ),
            HostId::PoolUser(k) => SocketAddr::new(
                self.pus[k].ip,
                if service == Service::Session {
                    PU_SESSION_PORT
                } else {
                    CLIENT_PORT
                },
            ),
            HostId::Hostile(n) => SocketAddr::new(
                self.hostiles[n].ip,
                if service == Service::Enrp {
                    ENRP_PORT
                } else {
                    CLIENT_PORT
                },
            ),
        }
    }

    fn host_at(&self, addr: SocketAddr) -> Option<(HostId, Service)> {
        match (self.by_ip.get(&addr.ip())?, addr.port()) {
            (HostId::Registrar(i), ASAP_PORT) => Some((HostId::Registrar(*i), Service::Asap)),
            (HostId::Registrar(i), ENRP_PORT) => Some((HostId::Registrar(*i), Service::Enrp)),
            (HostId::PoolElement(j), CLIENT_PORT) => Some((HostId::PoolElement(*j), Service::Asap)),
            (HostId::PoolElement(j), SESSION_PORT) => {
                Some((HostId::PoolElement(*j), Service::Session))
            }
            _ => None,
        }
    }

    fn note(&mut self, what: impl FnOnce() -> String) {
        if let Some(t) = self.trace.as_mut() {
            let line = format!(
                "{:>10.6} #{:<7} {}",
                self.now.as_secs_f64(),
                self.step,
                what()
            );
            t.push(line);
        }
    }

    fn hash(&mut self, tag: u8, a: u64, bytes: &[u8]) {
        let mut h = self.trace_hash;
        let mut eat = |b: u8| {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        };
        for b in (self.now.as_nanos() as u64).to_le_bytes() {
            eat(b);
        }
        eat(tag);
        for b in a.to_le_bytes() {
            eat(b);
        }
        for &b in bytes {
            eat(b);
        }
        self.trace_hash = h;
    }

    fn describe(&self, service: Service, bytes: &[u8]) -> String {
        match service {
            Service::Asap => match self.codec.decode::<AsapMessage>(bytes) {
                Ok(d) => d.message.name().to_string(),
                Err(e) => format!("undecodable ASAP ({e})"),
            },
            Service::Enrp => match self.codec.decode::<EnrpMessage>(bytes) {
                Ok(d) => d.message.name().to_string(),
                Err(e) => format!("undecodable ENRP ({e})"),
            },
            Service::Session => match unframe(bytes) {
                Some((11, m)) => self.describe(Service::Asap, m),
                Some((PPID_PINGPONG, m)) => {
                    use rserpool_services::pingpong::PingPongMessage;
                    match PingPongMessage::decode(m) {
                        Ok(PingPongMessage::Ping(p)) => p.to_string(),
                        Ok(PingPongMessage::Pong(p)) => p.to_string(),
                        Err(e) => format!("undecodable PingPong ({e})"),
                    }
                }
                Some((PPID_CALCAPP, m)) => match CalcAppMessage::decode(m) {
                    Ok(c) => c.to_string(),
                    Err(e) => format!("undecodable CalcApp ({e})"),
                },
                Some((ppid, m)) => format!("PPID {ppid}, {} bytes", m.len()),
                None => "a session message without PPID".to_string(),
            },
        }
    }

    // ----- The network -----

    /// Opens an association from `from` to `to_addr`; the outcome arrives as an event.
    fn connect(&mut self, from: HostId, service: Service, to_addr: &[SocketAddr]) -> u64 {
        let id = self.next_assoc;
        self.next_assoc += 1;
        let target = to_addr.iter().find_map(|a| self.host_at(*a));
        let from_addr = self.addr_of(from, service);
        let (to, ok_service) = match target {
            Some((h, s)) => (h, s == service),
            None => (from, false),
        };
        let tcp = self.is_tcp(from) || self.is_tcp(to);
        // SCTP reaches the peer on any of its addresses; TCP tries them in order, each
        // unreachable one costing a connect timeout (`docs/tcp-mapping.md`).
        let (to_sock, tried) = if tcp {
            self.tcp_target(to, to_addr)
        } else {
            (self.addr_of(to, service), 0)
        };
        let from_addr = if tcp {
            // A TCP client connects from an ephemeral port of its own.
            let a = self.source_addr(from, from_addr);
            SocketAddr::new(a.ip(), 49_152 + (id % 16_384) as u16)
        } else {
            from_addr
        };
        let a = Assoc {
            ends: [from, to],
            incs: [self.inc(from), self.inc(to)],
            addrs: [from_addr, to_sock],
            service,
            state: AssocState::Connecting,
            queues: [VecDeque::new(), VecDeque::new()],
            last_ready: [Duration::ZERO; 2],
            cut_since: None,
            closing: None,
            tcp,
            half_open: None,
            down_seen: [false; 2],
            restarts: Vec::new(),
        };
        self.assocs.insert(id, a);
        self.stats.associations += 1;
        if tcp {
            self.stats.tcp_associations += 1;
        }
        let connect_timeout = if tcp {
            self.cfg.link.tcp_connect_timeout
        } else {
            self.cfg.link.connect_timeout
        };
        let reachable = self.reachable(id);
        if target.is_none() || !ok_service || !reachable {
            let t = self.now + connect_timeout * (tried + 1);
            self.schedule(t, Ev::ConnectFailed(id));
        } else {
            let rtt = self.delay(from, to) + self.delay(to, from);
            let mut at = self.now + rtt + connect_timeout * tried;
            if self.alive(to) {
                at += self.restart_at_peer(id);
                self.schedule(at, Ev::Established(id));
            } else {
                // Nobody listens: refused (an ABORT comes back at once).
                self.schedule(at, Ev::ConnectFailed(id));
            }
        }
        self.note(|| {
            format!(
                "connect #{id} {from} -> {to_addr:?}{}",
                if tcp { " (TCP mapping)" } else { "" }
            )
        });
        id
    }

    /// Queues a message from `from` on association `id`.
    fn send(&mut self, id: u64, from: HostId, bytes: &[u8]) {
        let Some(a) = self.assocs.get(&id) else {
            return;
        };
        if a.state == AssocState::Closed && a.half_open.is_some() {
            self.send_to_restarted(id, from);
            return;
        }
        if a.state == AssocState::Closed || a.closing.is_some() {
            return;
        }
        let Some(me) = a.ends.iter().position(|h| *h == from) else {
            return;
        };
        let to_side = 1 - me;
        let (x, y) = (a.ends[me], a.ends[to_side]);
        if self.one_way_cut(x, y, a.service) {
            return;
        }
        let failover = self.failover_cost(id);
        if failover > Duration::ZERO {
            self.stats.failovers_to_alternate += 1;
        }
        let mut d = self.delay(x, y) + failover;
        // Each loss costs a retransmission timeout (doubling, as SCTP's RTO does).
        let mut rto = self.cfg.link.retransmission_timeout;
        let mut tries = 0;
        while tries < 8
            && self.chaos
            && self.cfg.link.loss > 0.0
            && self.rng.random_bool(self.cfg.link.loss)
        {
            d += rto;
            rto *= 2;
            tries += 1;
            self.stats.retransmissions += 1;
        }
        let a = self.assocs.get_mut(&id).expect("present");
        let ready = (self.now + d).max(a.last_ready[to_side]);
        a.last_ready[to_side] = ready;
        a.queues[to_side].push_back((ready, Rc::from(bytes)));
        let connecting = a.state == AssocState::Connecting;
        if !connecting {
            self.schedule(
                ready,
                Ev::Deliver {
                    assoc: id,
                    side: to_side,
                },
            );
        }
    }

    /// Closes (aborts) an association from one end: the other end learns it after a delay.
    fn close(&mut self, id: u64, from: HostId) {
        self.expect_echo.remove(&id);
        let Some(a) = self.assocs.get_mut(&id) else {
            return;
        };
        if a.state == AssocState::Closed {
            return;
        }
        if a.closing.is_some() {
            // Both ends have let go.
            a.state = AssocState::Closed;
            a.queues = [VecDeque::new(), VecDeque::new()];
            return;
        }
        let me = a.ends.iter().position(|h| *h == from).unwrap_or(0);
        let other = 1 - me;
        if a.service == Service::Session && a.state == AssocState::Up && a.cut_since.is_none() {
            // What this end sent before it aborted is on its way and arrives first (the
            // ABORT follows the data already transmitted); nothing reaches this end any more.
            a.closing = Some(me);
            a.queues[me].clear();
            let last = a.last_ready[other];
            let (x, y) = (a.ends[me], a.ends[other]);
            let d = self.delay(x, y);
            let t = (self.now + d).max(last);
            self.schedule(
                t,
                Ev::Down {
                    assoc: id,
                    side: other,
                },
            );
            return;
        }
        let was_up = a.state == AssocState::Up;
        a.state = AssocState::Closed;
        a.queues = [VecDeque::new(), VecDeque::new()];
        let (x, y) = (a.ends[me], a.ends[other]);
        if was_up {
            let t = if !self.reachable(id) {
                self.now + self.assoc_timeout(id)
            } else {
                let d = self.delay(x, y);
                self.now + d
            };
            self.schedule(
                t,
                Ev::Down {
                    assoc: id,
                    side: other,
                },
            );
        }
    }

    /// A host is gone: every association it had is lost for the peers (an ABORT from the kernel
    /// if only the process died, else the peer's timeout).
    fn host_gone(&mut self, h: HostId, process_only: bool) {
        let ids: Vec<u64> = self
            .assocs
            .iter()
            .filter(|(_, a)| a.state != AssocState::Closed && a.ends.contains(&h))
            .map(|(id, _)| *id)
            .collect();
        for id in ids {
            self.expect_echo.remove(&id);
            let a = self.assocs.get_mut(&id).expect("present");
            let was_up = a.state == AssocState::Up;
            a.state = AssocState::Closed;
            a.queues = [VecDeque::new(), VecDeque::new()];
            let other = if a.ends[0] == h { 1 } else { 0 };
            let peer = a.ends[other];
            if !was_up {
                // A connection attempt in flight: it fails for the initiator (if not `h`).
                if other == 0 {
                    let t = self.now + self.cfg.link.connect_timeout;
                    self.schedule(t, Ev::ConnectFailed(id));
                }
                continue;
            }
            let t = if process_only && self.reachable(id) {
                let d = self.delay(h, peer);
                self.now + d
            } else {
                if !process_only {
                    // The peer still believes it up until it hears otherwise.
                    self.assocs.get_mut(&id).expect("present").half_open = Some(1 - other);
                }
                self.now + self.assoc_timeout(id)
            };
            self.schedule(
                t,
                Ev::Down {
                    assoc: id,
                    side: other,
                },
            );
        }
    }

    /// Sends a datagram to every host in `to` (multicast on one group).
    fn multicast(&mut self, from: HostId, from_addr: SocketAddr, to: Vec<HostId>, bytes: &[u8]) {
        let bytes: Rc<[u8]> = Rc::from(bytes);
        for h in to {
            if h == from || self.one_way_cut(from, h, Service::Enrp) {
                continue;
            }
            let copies = if self.chaos
                && self.cfg.link.duplicate > 0.0
                && self.rng.random_bool(self.cfg.link.duplicate)
            {
                2
            } else {
                1
            };
            for _ in 0..copies {
                if self.chaos
                    && self.cfg.link.loss > 0.0
                    && self.rng.random_bool(self.cfg.link.loss)
                {
                    self.stats.datagrams_lost += 1;
                    continue;
                }
                let d = self.delay(from, h);
                self.stats.datagrams += 1;
                self.schedule(
                    self.now + d,
                    Ev::Datagram {
                        to: h,
                        from: from_addr,
                        bytes: bytes.clone(),
                    },
                );
            }
        }
    }

    // ----- Running -----

    /// Runs to the end (or the first failure) and returns what happened.
    pub fn run(mut self) -> Outcome {
        while self.failure.is_none() {
            let Some((at, ev)) = self.queue.pop() else {
                break;
            };
            self.now = self.now.max(at);
            // A paused host's kernel keeps what arrives for it; the process sees it on resume.
            if let Some(until) = self.deferred_until(&ev) {
                self.schedule(until, ev);
                continue;
            }
            self.step += 1;
            if self.step > self.cfg.max_steps {
                self.fail(
                    "step_limit",
                    format!("more than {} steps: a livelock?", self.cfg.max_steps),
                );
                break;
            }
            let finish = matches!(ev, Ev::Finish);
            self.handle(ev);
            if self.failure.is_none() {
                self.check_always();
                if self.failure.is_none() && self.step % self.cfg.full_check_every.max(1) == 0 {
                    self.check_listings();
                }
            }
            if finish {
                break;
            }
        }
        self.stats.steps = self.step;
        self.stats.simulated = self.now;
        Outcome {
            seed: self.cfg.seed,
            trace_hash: self.trace_hash,
            failure: self.failure,
            stats: self.stats,
            trace: self.trace.unwrap_or_default(),
            pcap_left_out: self.capture.as_ref().map_or(0, |c| c.left_out),
            pcap: self.capture.map(Capture::into_bytes),
        }
    }

    /// When an event for a paused host may be handled (`None`: now).
    fn deferred_until(&self, ev: &Ev) -> Option<Duration> {
        let hosts: Vec<HostId> = match ev {
            Ev::Timer(h) => vec![*h],
            Ev::Rejoin(j) => vec![HostId::PoolElement(*j)],
            Ev::Datagram { to, .. } => vec![*to],
            Ev::Deliver { assoc, side } | Ev::Down { assoc, side } => {
                vec![self.assocs.get(assoc)?.ends[*side]]
            }
            Ev::Established(id) => self.assocs.get(id)?.ends.to_vec(),
            Ev::ConnectFailed(id) => vec![self.assocs.get(id)?.ends[0]],
            _ => return None,
        };
        hosts
            .iter()
            .filter_map(|h| self.paused.get(h).copied())
            .filter(|&t| t > self.now)
            .max()
    }

    fn handle(&mut self, ev: Ev) {
        match ev {
            Ev::Timer(h) => self.on_timer(h),
            Ev::Deliver { assoc, side } => self.on_deliver(assoc, side),
            Ev::Datagram { to, from, bytes } => {
                // Datagrams are judged at arrival: a partition or a dead host drops them.
                let src = self.host_at_ip(from.ip());
                if !self.alive(to) || src.is_some_and(|s| !self.host_reachable(s, to)) {
                    return;
                }
                self.hash(1, 0, &bytes);
                if self.trace.is_some() || self.capture.is_some() {
                    let service = if from.port() == ENRP_PORT {
                        Service::Enrp
                    } else {
                        Service::Asap
                    };
                    if self.trace.is_some() {
                        let what = self.describe(service, &bytes);
                        let sender = src.map_or_else(|| from.to_string(), |s| s.to_string());
                        self.note(|| format!("{to} <- {sender} {what} (multicast)"));
                    }
                    if let Some(c) = self.capture.as_mut() {
                        let group = if service == Service::Enrp {
                            ENRP_GROUP
                        } else {
                            ASAP_GROUP
                        };
                        c.datagram(self.now, from, group, &bytes);
                    }
                }
                self.on_datagram(to, from, &bytes);
            }
            Ev::Established(id) => self.on_established(id),
            Ev::ConnectFailed(id) => self.on_connect_failed(id),
            Ev::Down { assoc, side } => self.on_down(assoc, side),
            Ev::CheckCut(id) => {
                let Some(a) = self.assocs.get(&id) else {
                    return;
                };
                if a.state == AssocState::Up
                    && a.cut_since
                        .is_some_and(|t| t + self.assoc_timeout(id) <= self.now)
                {
                    self.check_failover(id);
                    if self.failure.is_some() {
                        return;
                    }
                    let a = self.assocs.get_mut(&id).expect("present");
                    a.state = AssocState::Closed;
                    a.queues = [VecDeque::new(), VecDeque::new()];
                    self.stats.associations_timed_out += 1;
                    self.note(|| format!("association #{id} lost (no connectivity)"));
                    self.on_down(id, 0);
                    self.on_down(id, 1);
                }
            }
            Ev::Fault => self.on_fault(),
            Ev::Restart(h) => self.restart(h),
            Ev::Heal => self.heal(),
            Ev::Churn => self.on_churn(),
            Ev::Rejoin(j) => {
                if self.pes[j].left && self.pes[j].alive {
                    self.pes[j].left = false;
                    self.start_pe(j);
                }
            }
            Ev::Resolve(k) => self.on_resolve(k),
            Ev::Resume(h) => {
                self.paused_since.remove(&h);
                if self.paused.remove(&h).is_some() {
                    self.note(|| format!("RESUME {h}"));
                    self.hash(9, 0, &[]);
                }
            }
            Ev::SessionStart(k, n) => self.start_session(k, n),
            Ev::KeepAliveDue(id, h) => self.keep_alive_due(id, h),
            Ev::HealPath(ip) => self.heal_path(ip),
            Ev::Hostile(n) => self.hostile_acts(n),
            Ev::SessionAudit => self.audit_sessions(),
            Ev::EndChaos => self.end_chaos(),
            Ev::Finish => self.check_converged(),
        }
    }

    fn host_at_ip(&self, ip: IpAddr) -> Option<HostId> {
        self.by_ip.get(&ip).copied()
    }

    fn end_of(&self, id: u64, side: usize) -> Option<HostId> {
        let a = self.assocs.get(&id)?;
        let h = a.ends[side];
        (self.alive(h) && self.inc(h) == a.incs[side]).then_some(h)
    }

    fn on_deliver(&mut self, id: u64, side: usize) {
        let Some(a) = self.assocs.get(&id) else {
            return;
        };
        if a.state != AssocState::Up || a.cut_since.is_some() {
            return;
        }
        let Some(&(ready, _)) = a.queues[side].front() else {
            return;
        };
        if ready > self.now {
            return;
        }
        let service = a.service;
        let (_, bytes) = self.assocs.get_mut(&id).expect("present").queues[side]
            .pop_front()
            .expect("front");
        let Some(h) = self.end_of(id, side) else {
            return;
        };
        self.stats.messages += 1;
        self.hash(2, id, &bytes);
        if let Some(c) = self.capture.as_mut() {
            let a = &self.assocs[&id];
            let (from, to) = (a.addrs[1 - side], a.addrs[side]);
            let (ppid, data) = match service {
                Service::Asap => (11, &bytes[..]),
                Service::Enrp => (12, &bytes[..]),
                Service::Session => unframe(&bytes).unwrap_or((0, &bytes[..])),
            };
            if a.tcp {
                c.tcp_message(self.now, (id, side), from, to, ppid, data);
            } else {
                c.association_message(self.now, (id, side), from, to, ppid, data);
            }
        }
        if self.trace.is_some() {
            let what = self.describe(service, &bytes);
            let from = self.assocs[&id].ends[1 - side];
            self.note(|| format!("{h} <- {from} {what} (#{id})"));
        }
        match h {
            HostId::Registrar(i) => self.reg_message(i, id, service, &bytes),
            HostId::PoolElement(j) => self.pe_message(j, id, service, &bytes),
            HostId::PoolUser(k) => self.pu_message(k, id, service, &bytes),
            HostId::Hostile(n) => self.hostile_message(n, id, service, &bytes),
        }
    }

    fn on_established(&mut self, id: u64) {
        let Some(a) = self.assocs.get(&id) else {
            return;
        };
        if a.state != AssocState::Connecting {
            return;
        }
        let (x, y) = (a.ends[0], a.ends[1]);
        if self.end_of(id, 1).is_none() || !self.reachable(id) {
            self.on_connect_failed(id);
            return;
        }
        self.restarted_at_peer(id);
        if self.failure.is_some() {
            return;
        }
        let inc_y = self.inc(y);
        let a = self.assocs.get_mut(&id).expect("present");
        a.state = AssocState::Up;
        a.incs[1] = inc_y;
        // What the initiator queued while connecting goes now.
        let now = self.now;
        let a = self.assocs.get_mut(&id).expect("present");
        let mut ready_times = Vec::new();
        for (t, _) in a.queues[1].iter_mut() {
            *t = (*t).max(now);
            ready_times.push(*t);
        }
        for t in ready_times {
            self.schedule(t, Ev::Deliver { assoc: id, side: 1 });
        }
        self.hash(3, id, &[]);
        self.note(|| format!("association #{id} up {x} -> {y}"));
        if !self.reachable(id) {
            self.assocs.get_mut(&id).expect("present").cut_since = Some(now);
        }
        self.up(id, 0, false);
        self.up(id, 1, true);
    }

    fn up(&mut self, id: u64, side: usize, inbound: bool) {
        let Some(h) = self.end_of(id, side) else {
            return;
        };
        let a = &self.assocs[&id];
        let (service, peer) = (a.service, a.addrs[1 - side]);
        let peer_host = a.ends[1 - side];
        match h {
            HostId::Registrar(i) => {
                if service == Service::Asap {
                    let now = self.local(h);
                    let info = if self.tcp_only.is_empty() && self.second_ip.is_empty() {
                        sctp_peer(peer.ip(), peer.port())
                    } else {
                        self.peer_info(id, side)
                    };
                    let identity = self.identity_of(peer_host);
                    if let Some(c) = self.regs[i].core.as_mut() {
                        let (reg, enrp) = &mut **c;
                        if self.cfg.authenticated {
                            reg.association_up_with_identity(
                                now,
                                AssociationId(id),
                                info,
                                identity,
                            );
                        } else {
                            reg.association_up(now, AssociationId(id), info);
                        }
                        enrp.after_asap(reg);
                    }
                } else if service == Service::Enrp && self.cfg.authenticated {
                    // RFC 5355 §3.4: a peer without an allowed identity does not join; the
                    // association is closed before any of its messages is taken.
                    let identity = self.identity_of(peer_host);
                    let refused = self.regs[i].core.as_mut().is_some_and(|c| {
                        c.0.check_enrp_identity(AssociationId(id), identity)
                            .is_err()
                    });
                    if refused {
                        if matches!(peer_host, HostId::Hostile(_)) {
                            self.stats.hostile_refused += 1;
                        }
                        self.note(|| format!("{h}: ENRP association #{id} refused (identity)"));
                        self.close(id, h);
                        self.flush(h);
                        return;
                    }
                }
                self.flush(h);
            }
            HostId::Hostile(_) => {}
            HostId::PoolElement(j) if service == Service::Session => {
                let now = Now::from_monotonic(self.local(h));
                let identity = self.binding_identity(id, h);
                let p = &mut self.pes[j];
                match p.server.as_mut() {
                    Some(server) if inbound => {
                        if server.accept(now, id, identity) {
                            p.sessions.insert(id);
                        }
                    }
                    _ => {
                        self.close(id, h);
                        return;
                    }
                }
                self.flush(h);
            }
            HostId::PoolUser(k) if service == Service::Session => {
                let now = self.local(h);
                match self.session_of(k, id) {
                    Some(n) => {
                        let s = self.pus[k].sessions[n].as_mut().expect("present");
                        // The cookie the session holds now: the first message the PE gets on
                        // this association must echo it (`cookie_echo_first`).
                        let mut backwards = None;
                        if let Some(c) = s.core.cookie() {
                            self.expect_echo.insert(id, c.to_vec());
                            if let (Client::CalcApp(_), Ok(cookie)) = (
                                &s.client,
                                CalcAppCookie::decode(sessions::cookie_payload(c)),
                            ) {
                                // The progress a cookie holds never goes back for its job.
                                let floor = s.jobs.echoed.entry(cookie.job_id).or_insert(0);
                                if cookie.completed < *floor {
                                    backwards = Some(format!(
                                        "PU{k} session S{}: job {} resumes from a cookie with {} calculations done after one with {}",
                                        s.no, cookie.job_id, cookie.completed, floor
                                    ));
                                }
                                *floor = (*floor).max(cookie.completed);
                                self.echoed_jobs.insert(id, cookie);
                            }
                        }
                        if let Some(msg) = backwards {
                            self.fail("calcapp_resumes_from_cookie", msg);
                            return;
                        }
                        let s = self.pus[k].sessions[n].as_mut().expect("present");
                        s.held = None;
                        s.sent_on_assoc = 0;
                        s.core.connected(now);
                        self.pump_session(k, n);
                    }
                    None => self.close(id, h),
                }
                self.flush(h);
            }
            HostId::PoolElement(j) => {
                let now = self.local(h);
                let p = &mut self.pes[j];
                if !inbound && p.pending == Some(id) {
                    p.pending = None;
                    p.home = Some(id);
                    if let Some(c) = p.core.as_mut() {
                        c.connected(now);
                    }
                } else if inbound {
                    if p.others.len() >= 8 {
                        self.close(id, h);
                        return;
                    }
                    p.others.push(id);
                } else {
                    // Not the attempt the PE waits for (superseded): drop it.
                    self.close(id, h);
                    return;
                }
                self.flush(h);
            }
            HostId::PoolUser(k) => {
                let (global, now) = (self.now, self.local(h));
                let p = &mut self.pus[k];
                if p.connecting == Some(id) {
                    p.connecting = None;
                    p.assoc = Some(id);
                    p.failed_round = 0;
                    p.last_connected = global;
                    p.resolver.connected(now);
                    self.flush(h);
                } else {
                    self.close(id, h);
                }
            }
        }
    }

    fn on_connect_failed(&mut self, id: u64) {
        let Some(a) = self.assocs.get_mut(&id) else {
            return;
        };
        if a.state == AssocState::Up {
            return;
        }
        a.state = AssocState::Closed;
        a.queues = [VecDeque::new(), VecDeque::new()];
        let Some(h) = self.end_of(id, 0) else {
            return;
        };
        self.note(|| format!("{h}: connect #{id} failed"));
        let now = self.local(h);
        match h {
            HostId::Registrar(i) => {
                let r = &mut self.regs[i];
                r.enrp_opened.retain(|_, v| *v != id);
                r.asap_opened.retain(|_, v| *v != id);
            }
            HostId::PoolElement(j) => {
                let p = &mut self.pes[j];
                if p.pending == Some(id) {
                    p.pending = None;
                    if let Some(c) = p.core.as_mut() {
                        c.connect_failed(now);
                    }
                }
                self.flush(h);
            }
            HostId::PoolUser(k) if self.assocs[&id].service == Service::Session => {
                if let Some(n) = self.session_of(k, id) {
                    let s = self.pus[k].sessions[n].as_mut().expect("present");
                    s.assoc = None;
                    s.core
                        .connect_failed(now, "connection refused or unreachable".into());
                    self.pump_session(k, n);
                }
                self.flush(h);
            }
            HostId::Hostile(n) => {
                self.hostiles[n].asap.retain(|_, v| *v != id);
                self.hostiles[n].enrp.retain(|_, v| *v != id);
            }
            HostId::PoolUser(k) => {
                if self.pus[k].connecting == Some(id) {
                    self.pus[k].connecting = None;
                    self.pus[k].failed_round += 1;
                    if self.pus[k].failed_round >= self.regs.len() {
                        // A whole round failed: what waits fails with a cause, then retry.
                        self.pus[k].failed_round = 0;
                        self.pus[k]
                            .resolver
                            .fail_all(rserpool_endpoint::pu::ResolveError::NoRegistrar);
                        self.flush(h);
                    } else {
                        self.pu_connect(k);
                    }
                }
            }
        }
    }

    fn on_down(&mut self, id: u64, side: usize) {
        let Some(h) = self.end_of(id, side) else {
            return;
        };
        if let Some(a) = self.assocs.get_mut(&id) {
            a.state = AssocState::Closed;
            if std::mem::replace(&mut a.down_seen[side], true) {
                return;
            }
        }
        self.hash(4, id, &[]);
        self.expect_echo.remove(&id);
        self.note(|| format!("{h}: association #{id} down"));
        let service = self.assocs[&id].service;
        let now = self.local(h);
        match h {
            HostId::Registrar(i) => {
                let r = &mut self.regs[i];
                r.enrp_opened.retain(|_, v| *v != id);
                r.asap_opened.retain(|_, v| *v != id);
                if let Some(c) = r.core.as_mut() {
                    let (reg, enrp) = &mut **c;
                    match service {
                        Service::Asap => {
                            reg.association_down(now, AssociationId(id));
                            enrp.after_asap(reg);
                        }
                        Service::Enrp => enrp.association_down(now, reg, AssociationId(id)),
                        // Registrars have no sessions.
                        Service::Session => {}
                    }
                }
            }
            HostId::PoolElement(j) if service == Service::Session => {
                let p = &mut self.pes[j];
                if p.sessions.remove(&id) {
                    if let Some(server) = p.server.as_mut() {
                        server.closed(Now::from_monotonic(now), id);
                    }
                }
            }
            HostId::PoolUser(k) if service == Service::Session => {
                if let Some(n) = self.session_of(k, id) {
                    let s = self.pus[k].sessions[n].as_mut().expect("present");
                    s.assoc = None;
                    s.core.association_lost(now, "association lost".into());
                    self.pump_session(k, n);
                }
            }
            HostId::PoolElement(j) => {
                let p = &mut self.pes[j];
                if p.home == Some(id) {
                    p.home = None;
                    if let Some(c) = p.core.as_mut() {
                        c.disconnected(now);
                    }
                } else if p.pending == Some(id) {
                    p.pending = None;
                    if let Some(c) = p.core.as_mut() {
                        c.connect_failed(now);
                    }
                }
                p.others.retain(|a| *a != id);
            }
            HostId::PoolUser(k) => {
                let p = &mut self.pus[k];
                if p.assoc == Some(id) {
                    p.assoc = None;
                    p.resolver.disconnected(now);
                    self.flush(h);
                    self.pu_connect(k);
                    return;
                }
            }
            HostId::Hostile(n) => {
                let x = &mut self.hostiles[n];
                x.asap.retain(|_, v| *v != id);
                x.enrp.retain(|_, v| *v != id);
                x.owed.remove(&id);
                return;
            }
        }
        self.flush(h);
    }

    fn on_timer(&mut self, h: HostId) {
        if !self.alive(h) || matches!(h, HostId::Hostile(_)) {
            return;
        }
        let now = self.now;
        let armed = match h {
            HostId::Registrar(i) => &mut self.regs[i].armed,
            HostId::PoolElement(j) => &mut self.pes[j].armed,
            HostId::PoolUser(k) => &mut self.pus[k].armed,
            HostId::Hostile(_) => return,
        };
        if armed.is_none_or(|t| t > now) {
            return;
        }
        *armed = None;
        let same = match h {
            HostId::Registrar(i) => &mut self.regs[i].same_instant,
            HostId::PoolElement(j) => &mut self.pes[j].same_instant,
            HostId::PoolUser(k) => &mut self.pus[k].same_instant,
            HostId::Hostile(_) => return,
        };
        if same.0 == now {
            same.1 += 1;
        } else {
            *same = (now, 1);
        }
        if same.1 > 1000 {
            self.fail(
                "timer_progress",
                format!("{h} asked to be woken at {now:?} more than 1000 times in a row"),
            );
            return;
        }
        self.hash(5, 0, &[]);
        let now = self.local(h);
        match h {
            HostId::Registrar(i) => {
                if let Some(c) = self.regs[i].core.as_mut() {
                    let (reg, enrp) = &mut **c;
                    if reg.poll_timeout().is_some_and(|t| t <= now) {
                        reg.handle_timeout(now);
                        enrp.after_asap(reg);
                    }
                    if enrp.poll_timeout().is_some_and(|t| t <= now) {
                        enrp.handle_timeout(now, reg);
                    }
                }
            }
            HostId::PoolElement(j) => {
                let p = &mut self.pes[j];
                if let Some(c) = p.core.as_mut() {
                    if c.poll_timeout().is_some_and(|t| t <= now) {
                        c.handle_timeout(now);
                    }
                }
                if let Some(server) = p.server.as_mut() {
                    if server.poll_timeout().is_some_and(|t| t <= now) {
                        server.handle_timeout(Now::from_monotonic(now));
                    }
                }
            }
            HostId::PoolUser(k) => {
                let p = &mut self.pus[k];
                if p.resolver.poll_timeout().is_some_and(|t| t <= now) {
                    p.resolver.handle_timeout(now);
                }
                for n in 0..p.sessions.len() {
                    let Some(s) = self.pus[k].sessions[n].as_mut() else {
                        continue;
                    };
                    if s.core.poll_timeout().is_some_and(|t| t <= now) {
                        s.core.handle_timeout(now);
                    }
                    if s.client.poll_timeout().is_some_and(|t| t <= now) {
                        s.client.service().handle_timeout(Now::from_monotonic(now));
                    }
                    self.pump_session(k, n);
                }
            }
            HostId::Hostile(_) => {}
        }
        self.flush(h);
    }

    fn on_datagram(&mut self, to: HostId, from: SocketAddr, bytes: &[u8]) {
        let now = self.local(to);
        match to {
            HostId::Registrar(i) => {
                let sender = self.host_at(from).map(|(h, _)| h);
                self.heard_enrp(sender, bytes);
                if let Some(c) = self.regs[i].core.as_mut() {
                    let (reg, enrp) = &mut **c;
                    enrp.message(now, reg, Source::Multicast, bytes);
                }
            }
            HostId::PoolElement(j) => {
                if let Some(c) = self.pes[j].core.as_mut() {
                    c.announce(now, from, bytes);
                }
            }
            HostId::PoolUser(_) | HostId::Hostile(_) => {}
        }
        self.flush(to);
    }

    fn reg_message(&mut self, i: usize, id: u64, service: Service, bytes: &[u8]) {
        let now = self.local(HostId::Registrar(i));
        if service == Service::Enrp {
            let sender = self
                .assocs
                .get(&id)
                .and_then(|a| a.ends.iter().copied().find(|&e| e != HostId::Registrar(i)));
            self.heard_enrp(sender, bytes);
        }
        if service == Service::Enrp && self.cfg.mutation == Some(Mutation::BlindTakeoverAcks) {
            // The defect: INIT_TAKEOVER acked unread, TAKEOVER_SERVER dropped.
            match self.codec.decode::<EnrpMessage>(bytes).map(|d| d.message) {
                Ok(EnrpMessage::InitTakeover(t)) => {
                    let ack = EnrpMessage::InitTakeoverAck(rserpool_wire::enrp::Takeover {
                        peers: rserpool_wire::enrp::Peers {
                            sender: self.regs[i].id,
                            receiver: t.peers.sender,
                        },
                        target: t.target,
                    });
                    if let Ok(b) = self.codec.encode(&ack) {
                        self.send(id, HostId::Registrar(i), &b);
                    }
                    return;
                }
                Ok(EnrpMessage::TakeoverServer(_)) => return,
                _ => {}
            }
        }
        // A hostile host's message: what the registrar lists must not change for it.
        let hostile = self.assocs.get(&id).and_then(|a| {
            a.ends
                .iter()
                .copied()
                .find(|e| matches!(e, HostId::Hostile(_)))
        });
        let before = hostile.map(|_| self.listing(i));
        let mut id = id;
        if let (Some(_), Some(Mutation::HostileAsOwner), Ok(AsapMessage::Deregistration(d))) = (
            hostile,
            self.cfg.mutation,
            self.codec.decode::<AsapMessage>(bytes).map(|d| d.message),
        ) {
            // The defect: the deregistration arrives as if on the owner's association.
            if let Some(owner) = self.regs[i]
                .core
                .as_ref()
                .and_then(|c| c.0.handlespace().find(&d.pool_handle, d.pe_id))
                .and_then(|e| e.association())
            {
                id = owner.0;
            }
        }
        if let Some(c) = self.regs[i].core.as_mut() {
            let (reg, enrp) = &mut **c;
            match service {
                Service::Asap => {
                    reg.message(now, AssociationId(id), Protocol::Asap.ppid(), bytes);
                    enrp.after_asap(reg);
                }
                Service::Enrp => {
                    enrp.message(now, reg, Source::Association(AssociationId(id)), bytes)
                }
                Service::Session => {}
            }
        }
        self.flush(HostId::Registrar(i));
        if let (Some(x), Some(before)) = (hostile, before) {
            let what = self.describe(service, bytes);
            self.check_owner_only(i, x, &what, &before);
        }
    }

    fn pe_message(&mut self, j: usize, id: u64, service: Service, bytes: &[u8]) {
        let now = self.local(HostId::PoolElement(j));
        if service == Service::Session {
            // RFC 5352 §3.8: after a failover the cookie comes before any data.
            if let Some(cookie) = self.expect_echo.remove(&id) {
                let echoed = matches!(
                    unframe(bytes),
                    Some((11, m)) if matches!(
                        self.codec.decode::<AsapMessage>(m).map(|d| d.message),
                        Ok(AsapMessage::CookieEcho(c)) if c.cookie == cookie
                    )
                );
                if !echoed {
                    let what = self.describe(Service::Session, bytes);
                    let msg = format!(
                        "PE{j}: the first message on session association #{id}, bound with a cookie, is {what}, not the COOKIE_ECHO of that cookie"
                    );
                    self.fail("cookie_echo_first", msg);
                    return;
                }
            }
            let tampered = self.cookie_echo_arrives(j, id, bytes);
            let bytes = tampered.as_deref().unwrap_or(bytes);
            let mutated = self.reset_calcapp_echo(bytes);
            let bytes = mutated.as_deref().unwrap_or(bytes);
            let p = &mut self.pes[j];
            if let (Some(server), Some((ppid, m))) = (p.server.as_mut(), unframe(bytes)) {
                if p.sessions.contains(&id) {
                    server.message(Now::from_monotonic(now), id, ppid, 0, m);
                }
            }
            self.flush(HostId::PoolElement(j));
            return;
        }
        let mutated = self.cfg.mutation == Some(Mutation::SilentPoolElements);
        let p = &mut self.pes[j];
        if let Some(c) = p.core.as_mut() {
            if p.home == Some(id) {
                let is_keep_alive = matches!(
                    self.codec.decode::<AsapMessage>(bytes).map(|d| d.message),
                    Ok(AsapMessage::EndpointKeepAlive(_))
                );
                if !(mutated && is_keep_alive) {
                    c.message(now, bytes);
                }
            } else if p.others.contains(&id) {
                c.message_on_other(now, id, bytes);
            }
        }
        self.flush(HostId::PoolElement(j));
    }

    fn pu_message(&mut self, k: usize, id: u64, service: Service, bytes: &[u8]) {
        let now = self.local(HostId::PoolUser(k));
        if service == Service::Session {
            if let (Some(n), Some((ppid, m))) = (self.session_of(k, id), unframe(bytes)) {
                if self.control_message_arrives(k, n, ppid, m) {
                    let s = self.pus[k].sessions[n].as_mut().expect("present");
                    s.core.message(now, ppid, 0, m);
                }
                self.pump_session(k, n);
            }
            self.flush(HostId::PoolUser(k));
            return;
        }
        if self.pus[k].assoc == Some(id) {
            self.pus[k].resolver.message(now, bytes);
        }
        self.flush(HostId::PoolUser(k));
    }

    /// Routes what a host's cores queued, records their reports, and arms its timer.
    fn flush(&mut self, h: HostId) {
        if !self.alive(h) || matches!(h, HostId::Hostile(_)) {
            return;
        }
        match h {
            HostId::Registrar(i) => self.flush_registrar(i),
            HostId::PoolElement(j) => self.flush_pe(j),
            HostId::PoolUser(k) => self.flush_pu(k),
            HostId::Hostile(_) => {}
        }
        let next = match h {
            HostId::Registrar(i) => self.regs[i].core.as_ref().and_then(|c| {
                [c.0.poll_timeout(), c.1.poll_timeout()]
                    .into_iter()
                    .flatten()
                    .min()
            }),
            HostId::PoolElement(j) => {
                let p = &self.pes[j];
                [
                    p.core.as_ref().and_then(|c| c.poll_timeout()),
                    p.server.as_ref().and_then(|s| s.poll_timeout()),
                ]
                .into_iter()
                .flatten()
                .min()
            }
            HostId::PoolUser(k) => {
                let p = &self.pus[k];
                p.sessions
                    .iter()
                    .flatten()
                    .flat_map(|s| [s.core.poll_timeout(), s.client.poll_timeout()])
                    .chain([p.resolver.poll_timeout()])
                    .flatten()
                    .min()
            }
            HostId::Hostile(_) => None,
        };
        let next = next.map(|t| self.global_of(h, t));
        let armed = match h {
            HostId::Registrar(i) => &mut self.regs[i].armed,
            HostId::PoolElement(j) => &mut self.pes[j].armed,
            HostId::PoolUser(k) => &mut self.pus[k].armed,
            HostId::Hostile(_) => return,
        };
        if let Some(t) = next {
            if *armed != Some(t) {
                *armed = Some(t);
                self.schedule(t, Ev::Timer(h));
            }
        } else {
            *armed = None;
        }
    }

    fn flush_registrar(&mut self, i: usize) {
        let h = HostId::Registrar(i);
        let mut enrp_out = Vec::new();
        let mut asap_out = Vec::new();
        let mut won = Vec::new();
        let mut reported_away = Vec::new();
        let mut probed = Vec::new();
        let mut granted = Vec::new();
        {
            let Some(c) = self.regs[i].core.as_mut() else {
                return;
            };
            let (reg, enrp) = &mut **c;
            enrp.after_asap(reg);
            while let Some(t) = enrp.poll_transmit() {
                enrp_out.push(t);
            }
            while let Some(t) = reg.poll_transmit() {
                asap_out.push(t);
            }
            while let Some(e) = enrp.poll_event() {
                if let EnrpEvent::TakeoverWon { target, .. } = &e {
                    won.push(*target);
                }
                if self.trace.is_some() {
                    let line = format!("{h}: {e:?}");
                    if let Some(t) = self.trace.as_mut() {
                        t.push(format!(
                            "{:>10.6} #{:<7} {line}",
                            self.now.as_secs_f64(),
                            self.step
                        ));
                    }
                }
            }
            while let Some(e) = reg.poll_event() {
                if let RegistrarEvent::Removed {
                    pool_handle,
                    pe_id,
                    cause: RemovalCause::UnreachableReports,
                } = &e
                {
                    reported_away.push((pool_handle.clone(), *pe_id));
                }
                if let RegistrarEvent::UnreachableProbe { pe_id, .. } = &e {
                    probed.push(*pe_id);
                }
                if let RegistrarEvent::ClaimGranted {
                    pe_id, association, ..
                } = &e
                {
                    granted.push((*pe_id, association.0));
                }
                if let RegistrarEvent::Registered {
                    element,
                    association,
                    ..
                } = &e
                {
                    granted.push((element.id, association.0));
                }
                if self.trace.is_some() {
                    let line = format!("{h}: {e:?}");
                    if let Some(t) = self.trace.as_mut() {
                        t.push(format!(
                            "{:>10.6} #{:<7} {line}",
                            self.now.as_secs_f64(),
                            self.step
                        ));
                    }
                }
            }
        }
        for target in won {
            self.takeover_won(i, target);
        }
        for pe in probed {
            self.last_probed.insert(pe, self.now);
        }
        for (pool, pe) in reported_away {
            self.removed_by_reports(i, &pool, pe);
        }
        for (pe, assoc) in granted {
            self.claim_granted(i, pe, assoc);
        }
        for t in enrp_out {
            match t.destination {
                EnrpDestination::Association(a) => self.send(a.0, h, &t.bytes),
                EnrpDestination::Addresses(addrs) => {
                    let id = match self.regs[i].enrp_opened.get(&addrs) {
                        Some(id) => *id,
                        None => {
                            let id = self.connect(h, Service::Enrp, &addrs);
                            self.regs[i].enrp_opened.insert(addrs, id);
                            id
                        }
                    };
                    self.send(id, h, &t.bytes);
                }
                EnrpDestination::Multicast => {
                    let to = (0..self.regs.len()).map(HostId::Registrar).collect();
                    let from = self.addr_of(h, Service::Enrp);
                    self.multicast(h, from, to, &t.bytes);
                }
            }
        }
        for t in asap_out {
            match t.destination {
                Destination::Association(a) => self.send(a.0, h, &t.bytes),
                Destination::Announce => {
                    let to = (0..self.pes.len()).map(HostId::PoolElement).collect();
                    let from = self.addr_of(h, Service::Asap);
                    self.multicast(h, from, to, &t.bytes);
                }
                Destination::Address(addr) => {
                    let id = match self.regs[i].asap_opened.get(&addr) {
                        Some(id) => *id,
                        None => {
                            let id = self.connect(h, Service::Asap, &[addr]);
                            self.regs[i].asap_opened.insert(addr, id);
                            id
                        }
                    };
                    self.send(id, h, &t.bytes);
                }
            }
        }
    }

    fn flush_pe(&mut self, j: usize) {
        let h = HostId::PoolElement(j);
        let now = self.now;
        self.flush_server(j);
        loop {
            let mut connects = Vec::new();
            let mut events = Vec::new();
            {
                let Some(c) = self.pes[j].core.as_mut() else {
                    return;
                };
                while let Some(a) = c.poll_connect() {
                    connects.push(a);
                }
                while let Some(e) = c.poll_event() {
                    events.push(e);
                }
            }
            if connects.is_empty() && events.is_empty() {
                break;
            }
            for addrs in connects {
                let id = self.connect(h, Service::Asap, &addrs);
                if let Some(old) = self.pes[j].pending.replace(id) {
                    self.close(old, h);
                }
            }
            for e in events {
                self.note(|| format!("{h}: {e:?}"));
                match e {
                    PeEvent::NewHome { association, .. } => {
                        let p = &mut self.pes[j];
                        p.others.retain(|a| *a != association);
                        if let Some(old) = p.home.replace(association) {
                            if old != association {
                                self.close(old, h);
                            }
                        }
                    }
                    PeEvent::RegistrarLost => {
                        if let Some(a) = self.pes[j].home.take() {
                            self.close(a, h);
                        }
                    }
                    _ => {}
                }
            }
        }
        let out: Vec<Vec<u8>> = {
            let c = self.pes[j].core.as_mut().expect("present");
            std::iter::from_fn(|| c.poll_transmit()).collect()
        };
        let lose_acks = self.cfg.mutation == Some(Mutation::LostProbeAnswers)
            && self
                .last_probed
                .get(&self.pes[j].id)
                .is_some_and(|&t| self.now < t + Duration::from_secs(2));
        if let Some(a) = self.pes[j].home {
            for b in out {
                if lose_acks
                    && matches!(
                        self.codec.decode::<AsapMessage>(&b).map(|d| d.message),
                        Ok(AsapMessage::EndpointKeepAliveAck(_))
                    )
                {
                    continue;
                }
                self.send(a, h, &b);
            }
        }
        // A PE that leaves is done once its deregistration is answered or timed out.
        let p = &mut self.pes[j];
        if p.leaving && p.core.as_ref().is_some_and(|c| c.is_done()) {
            p.leaving = false;
            p.left = true;
            p.core = None;
            p.ended_at = Some(now);
            // Its session service stops with it: sessions are aborted, their users fail over.
            p.server = None;
            p.jobs.clear();
            let sessions: Vec<u64> = std::mem::take(&mut p.sessions).into_iter().collect();
            let ids: Vec<u64> = p
                .home
                .take()
                .into_iter()
                .chain(p.others.drain(..))
                .chain(sessions)
                .collect();
            for id in ids {
                self.close(id, h);
            }
            self.note(|| format!("{h} left its pool"));
            let back = self.uniform(Duration::from_secs(5), Duration::from_secs(40));
            self.schedule(now + back, Ev::Rejoin(j));
        }
    }

    fn flush_pu(&mut self, k: usize) {
        let h = HostId::PoolUser(k);
        let mut to_report = Vec::new();
        type Resolved = Result<(Vec<rserpool_wire::PoolElement>, Option<PoolPolicy>), String>;
        let mut for_sessions: Vec<(usize, Resolved)> = Vec::new();
        let out: Vec<Vec<u8>> =
            std::iter::from_fn(|| self.pus[k].resolver.poll_transmit()).collect();
        if let Some(a) = self.pus[k].assoc {
            for b in out {
                self.send(a, h, &b);
            }
        }
        while let Some(e) = self.pus[k].resolver.poll_event() {
            self.note(|| format!("{h}: {e:?}"));
            let (request, pool) = match &e {
                ResolverEvent::Resolved {
                    request,
                    resolution,
                } => {
                    if let Some(bad) = resolution.pool_elements.iter().find(|pe| {
                        self.pe_by_id
                            .get(&pe.id)
                            .is_none_or(|&j| self.pes[j].pool != resolution.pool_handle)
                    }) {
                        let msg = format!(
                            "{h} got PE {} for pool {}, which never joined it",
                            bad.id, resolution.pool_handle
                        );
                        self.fail("resolution_valid", msg);
                        return;
                    }
                    self.stats.resolutions += 1;
                    let session = self.pus[k].session_requests.remove(request);
                    if let Some(n) = session {
                        // A session's resolution: the session tries the PEs itself.
                        for_sessions.push((
                            n,
                            Ok((resolution.pool_elements.clone(), resolution.policy.clone())),
                        ));
                    }
                    // The PU tries the PEs it got: a dead one is reported unreachable, and now
                    // and then a live one too (a mistaken or lying pool user).
                    let tried = if session.is_some() {
                        &[][..]
                    } else {
                        &resolution.pool_elements[..]
                    };
                    for pe in tried {
                        let dead = self
                            .pe_by_id
                            .get(&pe.id)
                            .is_none_or(|&j| self.pes[j].core.is_none());
                        let falsely = self.cfg.false_reports > 0.0
                            && self.rng.random_bool(self.cfg.false_reports);
                        if dead || falsely {
                            to_report.push((resolution.pool_handle.clone(), pe.id));
                        }
                    }
                    (*request, resolution.pool_handle.clone())
                }
                ResolverEvent::Failed {
                    request,
                    pool_handle,
                    error,
                } => {
                    self.stats.resolutions_failed += 1;
                    if let Some(n) = self.pus[k].session_requests.remove(request) {
                        for_sessions.push((n, Err(error.to_string())));
                    }
                    (*request, pool_handle.clone())
                }
                ResolverEvent::ProtocolError(_) => continue,
            };
            match self.pus[k].outstanding.remove(&request) {
                Some((asked, _)) if asked == pool => {}
                Some((asked, _)) => {
                    self.fail(
                        "pu_request_once",
                        format!("{h}: request {request:?} for {asked} answered for {pool}"),
                    );
                    return;
                }
                None => {
                    self.fail(
                        "pu_request_once",
                        format!("{h}: request {request:?} ({pool}) ended twice or was never asked"),
                    );
                    return;
                }
            }
        }
        let again = !for_sessions.is_empty();
        let now = self.local(h);
        for (n, r) in for_sessions {
            if let Some(s) = self.pus[k].sessions[n].as_mut() {
                s.core.resolved(now, r);
                self.pump_session(k, n);
            }
        }
        for (pool, pe) in &to_report {
            self.stats.unreachable_reports += 1;
            self.pus[k].resolver.report_unreachable(pool, *pe);
        }
        let out: Vec<Vec<u8>> =
            std::iter::from_fn(|| self.pus[k].resolver.poll_transmit()).collect();
        if let Some(a) = self.pus[k].assoc {
            for b in out {
                self.send(a, h, &b);
            }
        }
        if again {
            // The sessions may have asked again (a cached answer comes at once).
            self.flush_pu(k);
        }
    }

    // ----- Hosts starting and stopping -----

    fn start_registrar(&mut self, i: usize) {
        let now = self.local(HostId::Registrar(i));
        let seed = self.rng.random::<u64>();
        let profile = Profile::Rsplib;
        let mut rc = RegistrarConfig::new(profile);
        rc.registrar_id = self.regs[i].id;
        rc.seed = Some(seed);
        rc.report_resolutions = false;
        if !self.cfg.announces {
            rc.announce = None;
        } else if let Some(a) = rc.announce.as_mut() {
            *a = AnnounceConfig {
                transports: Vec::new(),
                ..a.clone()
            };
        }
        if self.cfg.authenticated {
            rc.access = Some(World::access_rules());
        }
        let mut reg = Registrar::new(rc, now);
        let mut ec = EnrpConfig::new(profile);
        ec.seed = Some(seed ^ 0xe);
        ec.multicast = self.cfg.enrp_multicast;
        let others: Vec<Vec<SocketAddr>> = (0..self.regs.len())
            .filter(|&x| x != i)
            .map(|x| vec![SocketAddr::new(self.regs[x].ip, ENRP_PORT)])
            .collect();
        ec.static_peers = if self.cfg.enrp_multicast {
            others.into_iter().take(1).collect()
        } else {
            others
        };
        let mut enrp = Enrp::new(ec, &mut reg, now);
        let local = self.transport_of(HostId::Registrar(i), ENRP_PORT, TransportUse::DataOnly);
        enrp.set_local_transport(&reg, local);
        let r = &mut self.regs[i];
        r.core = Some(Box::new((reg, enrp)));
        r.alive = true;
        r.started_at = now;
        r.armed = None;
        let id = self.regs[i].id;
        self.note(|| format!("R{i} starts as {id:?}"));
        self.flush(HostId::Registrar(i));
    }

    fn start_pe(&mut self, j: usize) {
        let now = self.local(HostId::PoolElement(j));
        let user = self.transport_of(
            HostId::PoolElement(j),
            SESSION_PORT,
            TransportUse::DataPlusControl,
        );
        let p = &self.pes[j];
        let mut pc = PoolElementConfig::new(
            p.pool.clone(),
            UserTransport::Address(user),
            PoolPolicy::RoundRobin,
        );
        pc.pe_id = Some(p.id);
        // Without announces every PE knows every registrar, each starting at another one.
        let n = self.regs.len();
        let static_list = !self.cfg.announces || j % 2 == 0;
        if static_list {
            pc.registrars = (0..n)
                .map(|x| vec![SocketAddr::new(self.regs[(x + j) % n].ip, ASAP_PORT)])
                .collect();
        }
        let mut core = PoolElementCore::new(pc, &mut self.rng);
        core.start(now);
        let server = self.pe_server(j);
        let p = &mut self.pes[j];
        p.server = Some(server);
        p.jobs.clear();
        p.core = Some(core);
        p.alive = true;
        p.home = None;
        p.pending = None;
        p.others.clear();
        p.leaving = false;
        p.left = false;
        p.armed = None;
        self.note(|| format!("PE{j} starts"));
        self.flush(HostId::PoolElement(j));
    }

    fn restart(&mut self, h: HostId) {
        if self.alive(h) {
            // The initial start of a PE, or a restart that a quiet phase made early.
            if let HostId::PoolElement(j) = h {
                if self.pes[j].core.is_none() && !self.pes[j].left {
                    self.start_pe(j);
                }
            }
            return;
        }
        if self.inc(h) > 0 {
            self.stats.restarts += 1;
        }
        match h {
            HostId::Registrar(i) => {
                if !self.cfg.restart_same_id {
                    self.next_reg_id += 1;
                    self.regs[i].id = RegistrarId(0x1000 + self.next_reg_id);
                }
                self.start_registrar(i);
            }
            HostId::PoolElement(j) => {
                self.pes[j].left = false;
                self.start_pe(j);
            }
            HostId::PoolUser(_) | HostId::Hostile(_) => {}
        }
    }

    fn crash(&mut self, h: HostId) {
        let process_only = self.rng.random_bool(0.5);
        self.stats.crashes += 1;
        self.note(|| {
            format!(
                "CRASH {h} ({})",
                if process_only { "process" } else { "host" }
            )
        });
        self.hash(6, 0, &[]);
        self.paused.remove(&h);
        match h {
            HostId::Registrar(i) => {
                let r = &mut self.regs[i];
                r.alive = false;
                r.inc += 1;
                r.core = None;
                r.enrp_opened.clear();
                r.asap_opened.clear();
                r.armed = None;
            }
            HostId::PoolElement(j) => {
                let p = &mut self.pes[j];
                p.alive = false;
                p.inc += 1;
                p.core = None;
                p.home = None;
                p.pending = None;
                p.others.clear();
                p.leaving = false;
                p.armed = None;
                p.server = None;
                p.sessions.clear();
                p.jobs.clear();
                if !p.left {
                    p.ended_at = Some(self.now);
                }
                p.left = false;
            }
            HostId::PoolUser(_) | HostId::Hostile(_) => {}
        }
        self.host_gone(h, process_only);
        let back = self.uniform(Duration::from_secs(1), Duration::from_secs(60));
        self.schedule(self.now + back, Ev::Restart(h));
    }

    // ----- Faults and workload -----

    fn on_fault(&mut self) {
        if !self.chaos {
            return;
        }
        let f = self.cfg.faults.clone();
        let mut kinds = Vec::new();
        let alive_regs = self.regs.iter().filter(|r| r.alive).count();
        if f.crash_registrars && alive_regs >= 2 {
            kinds.push(0);
        }
        if f.crash_pool_elements && self.pes.iter().any(|p| p.alive) {
            kinds.push(1);
        }
        if f.partitions {
            kinds.push(2);
        }
        let pausable: Vec<HostId> = self
            .hosts()
            .into_iter()
            .filter(|h| !matches!(h, HostId::PoolUser(_)))
            .filter(|h| self.alive(*h) && !self.paused.contains_key(h))
            .collect();
        if f.pauses && !pausable.is_empty() {
            kinds.push(3);
        }
        if self.path_cut_possible() {
            kinds.push(4);
        }
        if !kinds.is_empty() {
            match kinds[self.rng.random_range(0..kinds.len())] {
                0 => {
                    let alive: Vec<usize> = (0..self.regs.len())
                        .filter(|&i| self.regs[i].alive)
                        .collect();
                    let i = alive[self.rng.random_range(0..alive.len())];
                    self.crash(HostId::Registrar(i));
                }
                1 => {
                    let alive: Vec<usize> =
                        (0..self.pes.len()).filter(|&j| self.pes[j].alive).collect();
                    let j = alive[self.rng.random_range(0..alive.len())];
                    self.crash(HostId::PoolElement(j));
                }
                2 => self.partition(),
                4 => self.cut_path(),
                _ => {
                    let h = pausable[self.rng.random_range(0..pausable.len())];
                    self.pause(h);
                }
            }
        }
        let next = self.exp(f.mean_interval);
        self.schedule(self.now + next, Ev::Fault);
    }

    fn pause(&mut self, h: HostId) {
        let d = self.uniform(Duration::from_secs(1), Duration::from_secs(30));
        let until = self.now + d;
        self.stats.pauses += 1;
        self.paused.insert(h, until);
        self.paused_recently.insert(h, until + PARTITION_SETTLE);
        self.note(|| format!("PAUSE {h} for {:.3} s", d.as_secs_f64()));
        self.hash(10, 0, &[]);
        self.schedule(until, Ev::Resume(h));
        self.paused_tcp(h);
    }

    fn partition(&mut self) {
        if self.partition_active {
            self.heal();
        }
        let hosts = self.hosts();
        let isolate_one = self.rng.random_bool(0.4);
        let mut side = BTreeMap::new();
        if isolate_one {
            let h = hosts[self.rng.random_range(0..hosts.len())];
            side.insert(h, 1u8);
        } else {
            // Registrars split into two non-empty groups (if there are two); others anywhere.
            let n = self.regs.len();
            let cut = if n >= 2 {
                self.rng.random_range(1..n)
            } else {
                1
            };
            let mut order: Vec<usize> = (0..n).collect();
            for x in (1..n).rev() {
                let y = self.rng.random_range(0..=x);
                order.swap(x, y);
            }
            for (pos, &i) in order.iter().enumerate() {
                if pos < cut {
                    side.insert(HostId::Registrar(i), 1u8);
                }
            }
            for h in hosts.iter().filter(|h| !matches!(h, HostId::Registrar(_))) {
                if self.rng.random_bool(0.5) {
                    side.insert(*h, 1u8);
                }
            }
        }
        self.stats.partitions += 1;
        self.partition_active = true;
        self.note(|| format!("PARTITION {:?}", side.keys().collect::<Vec<_>>()));
        self.hash(7, side.len() as u64, &[]);
        self.side = side;
        let now = self.now;
        self.mark_unreachable();
        let heal_in = self.uniform(Duration::from_secs(2), Duration::from_secs(40));
        self.schedule(now + heal_in, Ev::Heal);
    }

    fn heal(&mut self) {
        if !self.partition_active {
            return;
        }
        self.partition_active = false;
        self.side.clear();
        self.settle_until = self.now + PARTITION_SETTLE;
        self.note(|| "HEAL".to_string());
        self.hash(8, 0, &[]);
        // Associations cut off by the partition move what they queued, unless a failed
        // address still cuts them off.
        self.resume_reachable();
    }

    fn on_churn(&mut self) {
        let Some(mean) = self.cfg.churn else {
            return;
        };
        if !self.chaos {
            return;
        }
        let cands: Vec<usize> = (0..self.pes.len())
            .filter(|&j| {
                let p = &self.pes[j];
                p.alive && !p.leaving && !p.left && p.core.is_some()
            })
            .filter(|&j| !self.paused.contains_key(&HostId::PoolElement(j)))
            .collect();
        if !cands.is_empty() {
            let j = cands[self.rng.random_range(0..cands.len())];
            self.stats.departures += 1;
            self.note(|| format!("PE{j} leaves its pool"));
            let now = self.local(HostId::PoolElement(j));
            let p = &mut self.pes[j];
            p.leaving = true;
            if let Some(c) = p.core.as_mut() {
                c.deregister(now);
            }
            self.flush(HostId::PoolElement(j));
        }
        let next = self.exp(mean);
        self.schedule(self.now + next, Ev::Churn);
    }

    fn on_resolve(&mut self, k: usize) {
        let pool = self.pools[self.rng.random_range(0..self.pools.len())].clone();
        let (now, local) = (self.now, self.local(HostId::PoolUser(k)));
        let p = &mut self.pus[k];
        let r = p.resolver.resolve(local, pool.clone());
        p.outstanding.insert(r, (pool, now));
        if p.assoc.is_none() && p.connecting.is_none() {
            self.pu_connect(k);
        }
        self.flush(HostId::PoolUser(k));
        let next = self.exp(self.cfg.resolve_interval);
        self.schedule(now + next, Ev::Resolve(k));
    }

    fn pu_connect(&mut self, k: usize) {
        let n = self.regs.len();
        let x = self.pus[k].cursor % n;
        self.pus[k].cursor += 1;
        let addr = SocketAddr::new(self.regs[x].ip, ASAP_PORT);
        let id = self.connect(HostId::PoolUser(k), Service::Asap, &[addr]);
        self.pus[k].connecting = Some(id);
    }

    fn end_chaos(&mut self) {
        self.chaos = false;
        self.note(|| "END OF CHAOS: heal, restart everything".to_string());
        self.heal();
        self.heal_all_paths();
        self.paused.clear();
        for i in 0..self.regs.len() {
            if !self.regs[i].alive {
                self.restart(HostId::Registrar(i));
            }
        }
        for j in 0..self.pes.len() {
            if !self.pes[j].alive {
                self.restart(HostId::PoolElement(j));
            } else if self.pes[j].left {
                self.pes[j].left = false;
                self.start_pe(j);
            }
        }
    }

    // ----- Invariants -----

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

    /// Notes that registrar host `from` spoke ENRP under the ID its message names (RFC 5353 §2:
    /// every ENRP message begins with the sender's server ID); a host claiming another ID (a
    /// hostile one) is not the registrar heard.
    fn heard_enrp(&mut self, from: Option<HostId>, bytes: &[u8]) {
        let (Some(HostId::Registrar(r)), Some(b)) = (from, bytes.get(4..8)) else {
            return;
        };
        let id = RegistrarId(u32::from_be_bytes([b[0], b[1], b[2], b[3]]));
        if self.regs[r].id == id {
            self.enrp_heard.insert(id, self.now);
        }
    }

    fn takeover_won(&mut self, winner: usize, target: RegistrarId) {
        let by = self.regs[winner].id;
        self.stats.takeovers += 1;
        let target_host = self
            .regs
            .iter()
            .position(|r| r.id == target)
            .map(HostId::Registrar);
        // A paused registrar drops out of its peers' tables as a partitioned one does, and
        // comes back with its own view: like a partition, a pause of any registrar (the target
        // or another) exempts the takeovers around it.
        let was_paused = self
            .paused_recently
            .iter()
            .any(|(h, &t)| matches!(h, HostId::Registrar(_)) && self.now < t);
        // A takeover decided about the previous incarnation of a registrar that has just
        // restarted (with the same ID) is about a dead registrar.
        let just_restarted = target_host.is_some_and(|h| match h {
            HostId::Registrar(i) => {
                self.regs[i].inc > 0 && self.now < self.regs[i].started_at + PARTITION_SETTLE
            }
            _ => false,
        });
        let exempt =
            self.cut_somewhere() || self.now < self.settle_until || was_paused || just_restarted;
        // The incarnation of the target as it is now (a dead registrar keeps the number it
        // died with until it restarts).
        let inc = self
            .regs
            .iter()
            .find(|r| r.id == target)
            .map(|r| r.inc)
            .unwrap_or(u32::MAX);
        if exempt {
            return;
        }
        self.stats.checks += 1;
        // Over a lossy network a live peer can look dead: a retransmitted PRESENCE arrives
        // after MAX-TIME-NO-RESPONSE (ENRP's failure detection is by timeout), so a takeover
        // of a live registrar is wrong only on a network that loses nothing.
        let lossless = self.cfg.link.loss == 0.0;
        if let Some(r) = self.regs.iter().find(|r| r.id == target) {
            if lossless && r.alive && r.core.is_some() {
                let msg = format!(
                    "{by:?} took over {target:?}, which is alive and reachable (no partition)"
                );
                self.fail("takeover_only_of_dead", msg);
                return;
            }
        }
        // One death is taken over once: two winners within the settle window of each other
        // fought over the same takeover. (A live registrar that looks dead twice on a lossy
        // network, minutes apart, is taken over twice: two events, not two winners of one.)
        let now = self.now;
        // A target heard on ENRP after a rival's takeover of it was alive then: this takeover
        // answers a new suspicion, not the same death (seed 899: 26.6 s apart, the target
        // refuting in between).
        let heard = self.enrp_heard.get(&target).copied();
        let set = self.winners.entry((target, inc)).or_default();
        set.insert(by, now);
        let rivals: Vec<RegistrarId> = set
            .iter()
            .filter(|(r, t)| **r != by && now < **t + PARTITION_SETTLE && heard <= Some(**t))
            .map(|(r, _)| *r)
            .collect();
        if !rivals.is_empty() {
            let msg = format!("takeover of {target:?} won by {by:?} and, within {PARTITION_SETTLE:?}, by {rivals:?}");
            self.fail("takeover_unique", msg);
        }
    }

    /// A PE removed because pool users reported it unreachable must have failed the probe the
    /// reports triggered: on an undisturbed network, a live PE never is (RFC 5352 §3.5, RFC 5355
    /// §3.12: reports alone remove nothing).
    fn removed_by_reports(&mut self, registrar: usize, pool: &PoolHandle, pe_id: PoolElementId) {
        self.stats.reported_away += 1;
        // A restarted PE claiming its identifier on a new association waits for the probe of
        // the old one; when that fails, the old registration goes and the new one takes its
        // place in the same step: nothing live was lost.
        let listed = self.regs[registrar]
            .core
            .as_ref()
            .is_some_and(|c| c.0.handlespace().find(pool, pe_id).is_some());
        if listed {
            return;
        }
        if self.stranger_held.remove(&(registrar, pe_id)) {
            // The registration removed was a hostile host's (`owner_only` judged its grant).
            return;
        }
        let Some(&j) = self.pe_by_id.get(&pe_id) else {
            return;
        };
        let disturbed = self.cut_somewhere()
            || self.now < self.settle_until
            || (self.chaos && self.cfg.link.loss > 0.0)
            || self.paused_recently.values().any(|&t| self.now < t);
        // Only a registration the PE holds now, with this registrar, is its to lose: after a
        // restart or a move the old registration is stale by design.
        let p = &self.pes[j];
        let registered_here = p.home.and_then(|a| self.assocs.get(&a)).is_some_and(|a| {
            a.state == AssocState::Up && a.ends.contains(&HostId::Registrar(registrar))
        });
        let answering = p.alive && p.core.is_some() && !p.leaving && registered_here;
        if answering && !disturbed {
            let msg = format!(
                "R{registrar} removed PE{j} ({pe_id}) on unreachable reports although it is alive and answering"
            );
            self.fail("reports_remove_only_dead", msg);
        }
    }

    /// Cheap invariants, after every step.
    fn check_always(&mut self) {
        self.stats.checks += 1;
        // Every request of a PU ends (answered or failed with a cause) in bounded time.
        let now = self.now;
        for (k, p) in self.pus.iter().enumerate() {
            let h = HostId::PoolUser(k);
            let bound = p.resolver.config().response_timeout;
            // The resolver's deadline is on its own clock.
            let due = |asked: Duration| {
                let start = self.local_at(h, asked.max(p.last_connected));
                self.global_of(h, start + bound)
            };
            if let Some((r, (pool, asked))) = p
                .outstanding
                .iter()
                .find(|(_, (_, asked))| now > due(*asked))
            {
                let msg = format!(
                    "PU{k}: request {r:?} for {pool} asked at {asked:?} neither answered nor failed by {now:?}"
                );
                self.fail("pu_request_once", msg);
                return;
            }
        }
    }

    /// Every PE a live registrar lists is alive, or stopped less than the grace ago.
    fn check_listings(&mut self) {
        self.stats.checks += 1;
        let now = self.now;
        let grace = self.cfg.listing_grace;
        if let Some(msg) = self.unbacked_listing(now, grace) {
            self.fail("listed_is_backed", msg);
        }
        self.check_listed_addresses();
    }

    fn unbacked_listing(&self, now: Duration, grace: Duration) -> Option<String> {
        for (i, r) in self.regs.iter().enumerate() {
            let Some(c) = r.core.as_ref() else { continue };
            for pool in c.0.handlespace().pools() {
                for e in pool.elements() {
                    let Some((j, p)) = self
                        .pe_by_id
                        .get(&e.id())
                        .map(|&j| (j, &self.pes[j]))
                        .filter(|(_, p)| p.pool == *e.pool_handle())
                    else {
                        return Some(format!(
                            "R{i} lists {} in {}, which never existed",
                            e.id(),
                            e.pool_handle()
                        ));
                    };
                    let backed = (p.alive && p.core.is_some())
                        || p.ended_at.is_some_and(|t| now <= t + grace);
                    if !backed {
                        return Some(format!(
                            "R{i} ({:?}) lists PE{j} ({}) in {} with home {:?}, {:?} after it stopped (grace {grace:?})",
                            r.id,
                            e.id(),
                            e.pool_handle(),
                            e.home_registrar(),
                            p.ended_at.map(|t| now - t)
                        ));
                    }
                }
            }
        }
        None
    }

    /// At the end of the quiet phase: every live registrar holds the same handlespace with the
    /// same checksums, every live PE is registered, listed everywhere with one live home, and
    /// agrees with the registrars about which one.
    fn check_converged(&mut self) {
        self.stats.checks += 1;
        let live: Vec<usize> = (0..self.regs.len())
            .filter(|&i| self.regs[i].core.is_some())
            .collect();
        let live_ids: BTreeSet<RegistrarId> = live.iter().map(|&i| self.regs[i].id).collect();
        let table = |w: &World, i: usize| -> BTreeSet<(PoolHandle, u32, RegistrarId)> {
            let hs = w.regs[i].core.as_ref().expect("live").0.handlespace();
            hs.pools()
                .flat_map(|p| {
                    p.elements()
                        .map(|e| (e.pool_handle().clone(), e.id().0, e.home_registrar()))
                        .collect::<Vec<_>>()
                })
                .collect()
        };
        let sums = |w: &World, i: usize| -> BTreeMap<RegistrarId, (usize, u16)> {
            let hs = w.regs[i].core.as_ref().expect("live").0.handlespace();
            hs.owners()
                .map(|o| (o.owner, (o.elements, o.checksum.0)))
                .collect()
        };
        let Some(&first) = live.first() else { return };
        let t0 = table(self, first);
        let s0 = sums(self, first);
        for &i in &live[1..] {
            let t = table(self, i);
            if t != t0 {
                let only_first: Vec<_> = t0.difference(&t).collect();
                let only_this: Vec<_> = t.difference(&t0).collect();
                let msg = format!(
                    "after {:?} of quiet R{first} and R{i} differ: only R{first} has {only_first:?}, only R{i} has {only_this:?}",
                    self.cfg.quiet
                );
                self.fail("handlespaces_agree", msg);
                return;
            }
            let s = sums(self, i);
            if s != s0 {
                let msg = format!("checksums differ: R{first} {s0:?}, R{i} {s:?}");
                self.fail("checksums_agree", msg);
                return;
            }
        }
        for (j, p) in self.pes.iter().enumerate() {
            let Some(c) = p.core.as_ref() else { continue };
            // Registered, or re-registering over its registrar association (the core says
            // "not registered" while a re-registration is under way).
            if !c.is_registered() && p.home.is_none() {
                let msg = format!("PE{j} ({}) has no registrar after the quiet phase", p.id);
                self.fail("pe_registered", msg);
                return;
            }
            let homes: Vec<RegistrarId> = t0
                .iter()
                .filter(|(pool, id, _)| *pool == p.pool && *id == p.id.0)
                .map(|(_, _, home)| *home)
                .collect();
            match homes.as_slice() {
                [home] if live_ids.contains(home) => {
                    if c.home_registrar() != Some(*home) {
                        let msg = format!(
                            "PE{j} believes its home is {:?}, the registrars say {home:?}",
                            c.home_registrar()
                        );
                        self.fail("home_agrees", msg);
                        return;
                    }
                }
                other => {
                    let msg = format!(
                        "PE{j} ({}) has homes {other:?} among live registrars {live_ids:?}",
                        p.id
                    );
                    self.fail("one_live_home", msg);
                    return;
                }
            }
        }
    }
}

/// A message on a session association: its PPID, then the payload.
fn frame(ppid: u32, data: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(4 + data.len());
    v.extend_from_slice(&ppid.to_be_bytes());
    v.extend_from_slice(data);
    v
}

/// The PPID and payload of a session message.
fn unframe(bytes: &[u8]) -> Option<(u32, &[u8])> {
    let (p, rest) = bytes.split_first_chunk::<4>()?;
    Some((u32::from_be_bytes(*p), rest))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drifting_clocks_convert_both_ways_exactly() {
        let mut w = World::new(SimConfig::from_seed(1));
        let h = HostId::Registrar(0);
        for ppm in [-20_000i64, -1, 0, 7, 20_000] {
            w.drift.insert(h, ppm);
            for l in [0u64, 1, 999, 1_000_000_007, 123_456_789_012] {
                let local = Duration::from_nanos(l);
                let g = w.global_of(h, local);
                assert!(w.local_at(h, g) >= local, "ppm {ppm}, local {l}");
                if g > Duration::ZERO {
                    assert!(w.local_at(h, g - Duration::from_nanos(1)) < local);
                }
            }
            // A fast clock shows more than the global time, a slow one less.
            let t = Duration::from_secs(100);
            assert_eq!(w.local_at(h, t) > t, ppm > 0);
            assert_eq!(w.local_at(h, t) < t, ppm < 0);
        }
    }
}
