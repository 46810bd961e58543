//! What one simulation run contains: hosts, network behaviour, faults, workload, invariant
//! bounds. Everything not given explicitly is drawn from the seed ([`SimConfig::from_seed`]), so
//! that a seed alone names a run.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::time::Duration;

/// How the simulated network treats traffic between two hosts.
#[derive(Debug, Clone, PartialEq)]
pub struct LinkConfig {
    /// Smallest one-way delay of a link; each host adds a fixed share drawn from
    /// `[0, host_delay_max]`, so every pair of hosts has its own delay.
    pub delay_min: Duration,
    /// Largest per-host share of a link's delay.
    pub host_delay_max: Duration,
    /// Each packet's delay gets a uniform extra in `[0, jitter]` (reorders datagrams).
    pub jitter: Duration,
    /// Probability that a packet is lost: a datagram is gone; a message on an association is
    /// retransmitted after [`LinkConfig::retransmission_timeout`] (each retry may be lost too).
    pub loss: f64,
    /// Probability that a datagram arrives twice (associations suppress duplicates, as SCTP's
    /// TSNs and TCP's sequence numbers do).
    pub duplicate: f64,
    /// Retransmission timeout of an association (SCTP RTO).
    pub retransmission_timeout: Duration,
    /// How long an association survives without connectivity before both ends are told it is
    /// lost (SCTP: heartbeats and Path.Max.Retrans; the TCP mapping: its keep-alive timeout).
    pub association_timeout: Duration,
    /// How long a connection attempt to an unreachable address takes to fail.
    pub connect_timeout: Duration,
    /// How long a TCP-mapped association survives without hearing from its peer (the mapping's
    /// `keepalive_timeout`, `docs/tcp-mapping.md`): its keep-alives are frames the peer's
    /// process answers, so a paused process loses its TCP-mapped associations after this long.
    pub tcp_keepalive_timeout: Duration,
    /// How long a TCP connection attempt to an unreachable address takes to fail (the
    /// mapping's `connect_timeout`).
    pub tcp_connect_timeout: Duration,
}

impl Default for LinkConfig {
    fn default() -> Self {
        LinkConfig {
            delay_min: Duration::from_micros(200),
            host_delay_max: Duration::from_millis(5),
            jitter: Duration::from_millis(2),
            loss: 0.0,
            duplicate: 0.0,
            retransmission_timeout: Duration::from_millis(500),
            association_timeout: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(2),
            tcp_keepalive_timeout: Duration::from_secs(5),
            tcp_connect_timeout: Duration::from_secs(5),
        }
    }
}

/// Which faults a run injects while it is in its chaos phase, and how often.
#[derive(Debug, Clone, PartialEq)]
pub struct Faults {
    /// Registrars crash (all state lost) and restart.
    pub crash_registrars: bool,
    /// Pool elements crash (all state lost) and restart.
    pub crash_pool_elements: bool,
    /// The network splits into two sides (or isolates one host) and heals.
    pub partitions: bool,
    /// A registrar or PE stops (as with SIGSTOP) for 1–30 s: its kernel keeps the associations
    /// up and buffers what arrives, the process neither reads, sends nor runs timers.
    pub pauses: bool,
    /// Mean time between two faults (exponentially distributed).
    pub mean_interval: Duration,
    /// One address of a multi-homed host is cut off (its link fails) for 2–40 s: SCTP
    /// associations fail over to the other path, TCP-mapped ones over that address are lost.
    /// Only in runs with multi-homed hosts.
    pub path_cuts: bool,
}

impl Faults {
    /// No faults at all (the network may still lose, delay and duplicate).
    pub fn none() -> Self {
        Faults {
            crash_registrars: false,
            crash_pool_elements: false,
            partitions: false,
            pauses: false,
            mean_interval: Duration::from_secs(20),
            path_cuts: false,
        }
    }

    /// Every kind of fault.
    pub fn all() -> Self {
        Faults {
            crash_registrars: true,
            crash_pool_elements: true,
            partitions: true,
            pauses: true,
            mean_interval: Duration::from_secs(20),
            path_cuts: true,
        }
    }

    /// Parses a comma-separated list of `registrar`, `pe`, `partition`, `pause`, `path`, `all`
    /// or `none`.
    pub fn parse(s: &str) -> Result<Self, String> {
        let mut f = Faults::none();
        for w in s.split(',').map(str::trim).filter(|w| !w.is_empty()) {
            match w {
                "registrar" => f.crash_registrars = true,
                "pe" => f.crash_pool_elements = true,
                "partition" => f.partitions = true,
                "pause" => f.pauses = true,
                "path" => f.path_cuts = true,
                "all" => f = Faults::all(),
                "none" => f = Faults::none(),
                other => {
                    return Err(format!(
                    "unknown fault `{other}` (expected registrar, pe, partition, pause, path, all, none)"
                ))
                }
            }
        }
        Ok(f)
    }
}

/// A deliberate defect for tests of the simulator itself: the checker must catch each of them.
/// Never used by a normal run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mutation {
    /// After the first 30 s, every ENRP message from registrar 1 to registrar 0 vanishes while
    /// their associations stay up (a broken transport that neither delivers nor reports loss), so that registrar
    /// 0 takes a live registrar over.
    OneWayEnrp,
    /// Pool elements never answer keep-alives (a broken PE core), so that their registrations
    /// are dropped while they believe they are registered.
    SilentPoolElements,
    /// Registrars' ENRP layers ack every ENRP_INIT_TAKEOVER unread and drop every
    /// ENRP_TAKEOVER_SERVER (no arbitration, no news of a winner), so that every registrar that
    /// notices a dead peer wins its takeover: `takeover_unique` must fail.
    BlindTakeoverAcks,
    /// For 2 s after a registrar probed a PE because pool users reported it unreachable, that
    /// PE's keep-alive answers vanish on the way (a transport that loses exactly the probe's
    /// answer), so that live PEs are removed on reports: `reports_remove_only_dead` must fail.
    LostProbeAnswers,
    /// Session associations swap the first two messages a pool user sends after binding with
    /// a cookie (a transport that reorders): `cookie_echo_first` must fail.
    ReorderedSessionStart,
    /// Session associations deliver every message from a PE twice (a transport that
    /// duplicates): `ping_answered_once` must fail.
    DuplicatedSessionMessages,
    /// The gateway simulation's data plane reports the connections of a member whose process
    /// died as closed in order (FIN) instead of reset: `gateway_member_lost` must fail.
    GatewayFinFromDeadMember,
    /// The gateway simulation's probes pass a partition (the member looks alive while its
    /// connections are cut off): `gateway_member_lost_in_time` must fail.
    GatewayProbesThroughCut,
    /// The gateway simulation's data plane, going down, ends its clients' connections that
    /// had their answer in order (FIN) instead of letting them reset or time out:
    /// `gateway_client_view` must fail.
    GatewayCrashFinishesAnswers,
    /// The gateway simulation's member source (RSerPool members) never lets a member go: a
    /// PE the registrar stopped listing stays a member, and `gateway_binds_listed` must fail.
    GatewaySourceOnlyAdds,
    /// The gateway simulation restarts a crashed gateway with its predecessor's session table
    /// (a restore of state whose connections are gone): `gateway_crash_loses_sessions` must
    /// fail.
    GatewayRestartKeepsSessions,
    /// The gateway simulation's data plane drops a connection its member reset without
    /// telling the core (which keeps the session bound): `gateway_receipts_own_sessions` must
    /// fail.
    GatewayForgetsResets,
    /// The gateway simulation resolves its pool at a tenth of its configured rate (RSerPool
    /// members): a PE the registrar removed gets sessions too long, and
    /// `gateway_unlisted_unused` must fail.
    GatewaySlowRefresh,
    /// A CalcApp cookie echo reaches the PE with its progress set to none:
    /// `calcapp_resumes_from_cookie` must fail.
    CalcAppEchoLosesProgress,
    /// Pool users' sessions never get the business cards that reach them (glue that drops
    /// the control channel's cards), so that failovers ignore the cards:
    /// `business_card_candidates` must fail.
    IgnoredBusinessCards,
    /// PEs' business cards name a PE of another pool first: `business_card_in_pool` must fail.
    ForeignBusinessCards,
    /// PEs' signed cookie seals open cookies without verifying them (a seal that forgot its
    /// checks), so that tampered and replayed cookies are accepted: `cookie_authentic` must
    /// fail.
    UncheckedCookieSeal,
    /// Failovers the application asks for are handed to the session as "no answer" (glue
    /// that mislabels them), so that the PE left is reported unreachable and the receipt names
    /// the wrong reason: `failover_reason` must fail.
    MislabelledRequestedFailovers,
    /// Registrars take a hostile host's ASAP_DEREGISTRATION as the owner's (the association is
    /// rewritten to the owner's on the way in): `owner_only` must fail.
    HostileAsOwner,
    /// An SCTP association whose path is cut is lost although its other path works (no
    /// failover): `failover_keeps_association` must fail.
    NoPathFailover,
    /// The peers of a restarted host are not told that its old associations are gone (no
    /// SCTP_RESTART, no ABORT or RST for what they send): `restart_forgets_old` must fail.
    SilentRestart,
}

/// Which hosts run the TCP mapping instead of SCTP, and which SCTP hosts are multi-homed
/// (drawn per host from the seed, see [`SimConfig::tcp_share`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transports {
    /// Every host speaks SCTP (the runs before the TCP mapping was simulated).
    Sctp,
    /// Each host is TCP-only with the probability [`SimConfig::tcp_share`].
    PerHost,
    /// Each registrar is TCP-only with that probability, and its static clients (PEs and PUs
    /// that start their hunt with it) follow it, as a deployment without SCTP chooses.
    PerRegistrar,
}

/// Everything one run needs.
#[derive(Debug, Clone, PartialEq)]
pub struct SimConfig {
    /// The seed: every random choice of the run comes from it.
    pub seed: u64,
    /// Registrars (ASAP and ENRP cores), at least 1.
    pub registrars: usize,
    /// Pool elements.
    pub pool_elements: usize,
    /// Pool users (handle resolvers).
    pub pool_users: usize,
    /// Sessions (PingPong, or CalcApp on the CalcApp pool) each pool user keeps running (with
    /// failover and cookies); a session that finished or gave up is followed by a new one.
    pub sessions_per_pu: usize,
    /// PingPong PEs abort a session after this many replies (RSPLIB `-pppfailureafter`), to
    /// force failovers with cookies; 0 never.
    pub pingpong_failure_after: u64,
    /// The last pool is a CalcApp pool (RSPLIB `rspserver -calcapp`): its PEs run the CalcApp
    /// service and the sessions that draw it run CalcApp jobs instead of Pings. `false`: every
    /// pool is PingPong.
    pub calcapp: bool,
    /// Jobs a CalcApp PE runs at once (`-capmaxjobs`); more are rejected.
    pub calcapp_max_jobs: usize,
    /// Pools the PEs are spread over.
    pub pools: usize,
    /// Length of the chaos phase (faults and PE churn); then the network heals, crashed hosts
    /// restart, and the quiet phase begins.
    pub chaos: Duration,
    /// Length of the quiet phase, at whose end the convergence invariants are checked.
    pub quiet: Duration,
    /// Network behaviour.
    pub link: LinkConfig,
    /// Faults of the chaos phase.
    pub faults: Faults,
    /// Mean time between two PEs leaving the pool (deregistering) in the chaos phase; they
    /// join again later. `None`: no churn.
    pub churn: Option<Duration>,
    /// Mean time between two handle resolutions of one pool user.
    pub resolve_interval: Duration,
    /// Probability that a pool user reports a live PE of an answer unreachable (a mistaken or
    /// lying pool user); PEs that are gone are always reported.
    pub false_reports: f64,
    /// Registrars send ASAP_SERVER_ANNOUNCEs that PEs hunt with.
    pub announces: bool,
    /// ENRP PRESENCE goes to the multicast group too (peers then need not all be configured).
    pub enrp_multicast: bool,
    /// A restarted registrar comes back with the same registrar ID (else a new one).
    pub restart_same_id: bool,
    /// Each host's clock runs fast or slow by up to this many parts per million (drawn per
    /// host); 0 keeps every clock exact.
    pub max_drift_ppm: u32,
    /// How long after a PE crashed or left a registrar may still list it.
    pub listing_grace: Duration,
    /// Check the invariants that scan every handlespace only every this many steps (1: every
    /// step). The cheap ones run after every step regardless.
    pub full_check_every: u64,
    /// Most steps of a run; more is reported as a failure (a livelock).
    pub max_steps: u64,
    /// Keep a readable trace of every step.
    pub trace: bool,
    /// Capture every delivered message as a pcap file of at most this many bytes
    /// ([`crate::Outcome::pcap`]); past the limit packets are counted, not written. `None`: no
    /// capture. Capturing changes nothing in the run.
    pub pcap_limit: Option<u64>,
    /// A deliberate defect (tests of the checker only).
    pub mutation: Option<Mutation>,
    /// PEs send ASAP_BUSINESS_CARDs (RFC 5352 §3.9) to their sessions, naming other PEs of
    /// their pool to fail over to; which PEs and how many (0–3) are drawn per PE. `false`:
    /// no cards (as RSPLIB).
    pub business_cards: bool,
    /// PEs seal their cookies with HMAC-SHA256 under a pool-wide key (`HmacSeal`); `false`:
    /// plain cookies (as RSPLIB).
    pub signed_cookies: bool,
    /// How long a signed cookie stays valid after it was issued.
    pub cookie_lifetime: Duration,
    /// With signed cookies, this PE has a key of its own (not the pool's): it refuses the
    /// pool's cookies, the others refuse its cookies.
    pub other_key_pe: Option<usize>,
    /// With signed cookies, this PE seals nothing (plain cookies): it refuses signed cookies,
    /// the others refuse its cookies.
    pub unsealed_pe: Option<usize>,
    /// Probability that a signed cookie echo is tampered with on its way to the PE: altered
    /// in flight, or replaced by a cookie another pool user holds (a replay). 0: never.
    pub cookie_tampering: f64,
    /// Share of sessions in manual failover mode: the session reports that a failover is
    /// necessary and the application asks for it (RSPLIB's `rsp_forcefailover`).
    pub manual_failover: f64,
    /// Mean time between two failovers the application of a bound session asks for itself
    /// (`failover_because(Requested)`, exponentially distributed); `None`: never.
    pub requested_failovers: Option<Duration>,
    /// CalcApp jobs arrive over the session's life, exponentially distributed with this mean
    /// (RSPLIB `-jobinterval`); `None`: all of a session's jobs are queued at its start.
    pub job_interval: Option<Duration>,
    /// How hosts choose between SCTP and the TCP mapping.
    pub transports: Transports,
    /// Share of hosts (or registrars, with [`Transports::PerRegistrar`]) without SCTP: they
    /// use the TCP mapping (one ordered byte stream, framed; keep-alive timeout; no
    /// multi-homing). An association is TCP-mapped when either end is TCP-only.
    pub tcp_share: f64,
    /// Share of SCTP hosts with a second address (multi-homed; PEs register both).
    pub multihomed_share: f64,
    /// Hostile hosts: not owners of anything, they send registrars deregistrations and
    /// registrations of other PEs' identifiers, ENDPOINT_UNREACHABLE floods, malformed
    /// messages and ENRP messages under other registrars' IDs.
    pub hostile: usize,
    /// Registrars authenticate their peers (TLS identities, `RegistrarConfig::access`): PEs
    /// and registrars hold allowed identities, hostile hosts hold none or one no rule allows.
    pub authenticated: bool,
    /// A crashed host that comes back before its peers noticed is seen as kernels see it: what
    /// a peer sends on an old association draws an ABORT (SCTP) or RST (TCP), and a new
    /// association from the same addresses restarts the old one at the peer (SCTP_RESTART)
    /// or resets it. Off: the peers learn only by their timeout (the runs before it).
    pub restarts: bool,
}

impl SimConfig {
    /// A run drawn from `seed`: network quality, faults, whether announces and ENRP multicast
    /// are on, and sizes (3–5 registrars, 6–16 PEs, 1–3 PUs, 0–2 sessions per PU); in half of
    /// the seeds the last pool runs CalcApp; drawn last, business cards, signed cookies (with
    /// tampering), manual and requested failovers and CalcApp jobs over time, each in a share
    /// of the seeds (docs/simulation.md).
    pub fn from_seed(seed: u64) -> Self {
        let mut r = ChaCha8Rng::seed_from_u64(seed ^ 0x5eed_c0f1_9000_0000);
        let lossy = r.random_bool(0.5);
        let link = LinkConfig {
            host_delay_max: Duration::from_micros(r.random_range(100..20_000)),
            jitter: Duration::from_micros(r.random_range(0..10_000)),
            loss: if lossy { r.random_range(0.0..0.2) } else { 0.0 },
            duplicate: if r.random_bool(0.3) {
                r.random_range(0.0..0.1)
            } else {
                0.0
            },
            ..LinkConfig::default()
        };
        let faults = Faults {
            crash_registrars: r.random_bool(0.7),
            crash_pool_elements: r.random_bool(0.7),
            partitions: r.random_bool(0.6),
            pauses: false,
            mean_interval: Duration::from_secs(r.random_range(5..40)),
            path_cuts: false,
        };
        let mut c = SimConfig {
            seed,
            registrars: r.random_range(3..=5),
            pool_elements: r.random_range(6..=16),
            pool_users: r.random_range(1..=3),
            sessions_per_pu: 0,
            pingpong_failure_after: 0,
            calcapp: false,
            calcapp_max_jobs: 10,
            pools: r.random_range(1..=3),
            chaos: Duration::from_secs(r.random_range(60..180)),
            quiet: Duration::from_secs(150),
            link,
            faults,
            churn: r
                .random_bool(0.6)
                .then(|| Duration::from_secs(r.random_range(10..60))),
            resolve_interval: Duration::from_secs(2),
            false_reports: 0.05,
            announces: r.random_bool(0.5),
            enrp_multicast: r.random_bool(0.5),
            restart_same_id: r.random_bool(0.5),
            max_drift_ppm: 0,
            listing_grace: Duration::from_secs(120),
            full_check_every: 1,
            max_steps: 5_000_000,
            trace: false,
            pcap_limit: None,
            mutation: None,
            business_cards: false,
            signed_cookies: false,
            cookie_lifetime: Duration::from_secs(600),
            other_key_pe: None,
            unsealed_pe: None,
            cookie_tampering: 0.0,
            manual_failover: 0.0,
            requested_failovers: None,
            job_interval: None,
            transports: Transports::Sctp,
            tcp_share: 0.0,
            multihomed_share: 0.0,
            hostile: 0,
            authenticated: false,
            restarts: false,
        };
        // Drawn last, so that adding it left the earlier draws of every seed as they were.
        c.faults.pauses = r.random_bool(0.5);
        c.max_drift_ppm = if r.random_bool(0.5) {
            r.random_range(1..=20_000)
        } else {
            0
        };
        // Sessions came later still: a seed with `sessions_per_pu = 0` runs as before them.
        c.sessions_per_pu = if r.random_bool(0.8) {
            r.random_range(1..=2)
        } else {
            0
        };
        c.pingpong_failure_after = if r.random_bool(0.3) {
            r.random_range(5..40)
        } else {
            0
        };
        // CalcApp came after PingPong, drawn last: a seed without it runs as before it.
        c.calcapp = r.random_bool(0.5);
        if c.calcapp {
            c.calcapp_max_jobs = r.random_range(1..=4);
        }
        // The transports, multi-homing and hostile hosts came after everything above: a seed
        // that draws none of them runs as before they were simulated.
        c.transports = match r.random_range(0..10) {
            0..=5 => Transports::Sctp,
            6..=7 => Transports::PerHost,
            _ => Transports::PerRegistrar,
        };
        if c.transports != Transports::Sctp {
            c.tcp_share = r.random_range(0.2..0.8);
        }
        if r.random_bool(0.4) {
            c.multihomed_share = r.random_range(0.3..1.0);
            c.faults.path_cuts = r.random_bool(0.7);
        }
        if r.random_bool(0.3) {
            c.hostile = r.random_range(1..=2);
            c.authenticated = r.random_bool(0.5);
        }
        c.restarts = r.random_bool(0.5);
        // Business cards, signed cookies, manual and requested failovers and jobs over time
        // came last of all, drawn after everything above (the
        // transports included): a seed whose draws leave them off runs as before they existed.
        c.business_cards = r.random_bool(0.5);
        c.signed_cookies = r.random_bool(0.5);
        if c.signed_cookies {
            c.cookie_lifetime = Duration::from_secs(r.random_range(60..=900));
            let pes = c.pool_elements;
            c.other_key_pe = r.random_bool(0.3).then(|| r.random_range(0..pes));
            c.unsealed_pe = r.random_bool(0.3).then(|| r.random_range(0..pes));
            if r.random_bool(0.5) {
                c.cookie_tampering = r.random_range(0.05..0.3);
            }
        }
        if r.random_bool(0.4) {
            c.manual_failover = r.random_range(0.2..=1.0);
        }
        c.requested_failovers = r
            .random_bool(0.4)
            .then(|| Duration::from_secs(r.random_range(5..60)));
        c.job_interval = r
            .random_bool(0.5)
            .then(|| Duration::from_millis(r.random_range(1_000..15_000)));
        c
    }

    /// This config with business cards, signed cookies, manual and requested failovers and
    /// CalcApp jobs over time off: a seed as it ran before they were simulated.
    pub fn without_session_extras(mut self) -> Self {
        self.business_cards = false;
        self.signed_cookies = false;
        self.other_key_pe = None;
        self.unsealed_pe = None;
        self.cookie_tampering = 0.0;
        self.manual_failover = 0.0;
        self.requested_failovers = None;
        self.job_interval = None;
        self
    }

    /// Turns off what came with the TCP mapping, multi-homing and hostile hosts, so that a seed
    /// runs exactly as it did before they were simulated.
    pub fn without_net_modes(mut self) -> Self {
        self.transports = Transports::Sctp;
        self.tcp_share = 0.0;
        self.multihomed_share = 0.0;
        self.faults.path_cuts = false;
        self.hostile = 0;
        self.authenticated = false;
        self.restarts = false;
        self
    }
}
