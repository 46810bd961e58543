//! What one gateway run contains ([`GatewayConfig`]); everything not given is drawn from the
//! seed, so that a seed alone names a run.

use crate::config::Mutation;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rserpool_lsnat::core::policy::LoadSharePolicy;
use std::time::Duration;

/// Where the gateway's members come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GatewaySource {
    /// A static list in the configuration (every member host).
    Static,
    /// The RSerPool pool the member hosts' PEs register in with a registrar: the gateway
    /// resolves it every [`GatewayConfig::refresh`].
    Rserpool,
}

impl GatewaySource {
    /// The option's value (`--gateway-source`).
    pub fn name(self) -> &'static str {
        match self {
            GatewaySource::Static => "static",
            GatewaySource::Rserpool => "rserpool",
        }
    }
}

/// One run of the gateway simulation; everything not set is drawn from the seed.
#[derive(Debug, Clone, PartialEq)]
pub struct GatewayConfig {
    /// The seed.
    pub seed: u64,
    /// Pool members behind the virtual address.
    pub members: usize,
    /// Clients opening sessions.
    pub clients: usize,
    /// Mean time between two sessions of one client.
    pub open_interval: Duration,
    /// The load-share policy.
    pub policy: LoadSharePolicy,
    /// `limits.max_sessions` of the gateway.
    pub max_sessions: u32,
    /// `limits.max_sessions_per_member`.
    pub max_sessions_per_member: u32,
    /// `health.response_timeout`: client data unanswered this long counts against a member.
    pub response_timeout: Option<Duration>,
    /// Mean time between two member faults (crash or pause).
    pub fault_interval: Duration,
    /// Members pause (SIGSTOP-like: the kernel still accepts connections).
    pub pauses: bool,
    /// Length of the run.
    pub length: Duration,
    /// `health.panic_threshold_percent` (0: off).
    pub panic_threshold_percent: u8,
    /// `health.connect_retries`: other members a session may be rebound to.
    pub connect_retries: u32,
    /// `persistence.timeout` (zero: no persistence).
    pub persistence: Duration,
    /// Keep a readable trace.
    pub trace: bool,
    /// A deliberate defect (tests of the checker).
    pub mutation: Option<Mutation>,
    /// Each packet between the gateway and a member is lost with this probability: a lost
    /// probe times out, a lost SYN is sent again after 1 s (doubling; the connect times out
    /// after 3 s), a lost segment costs a retransmission (200 ms, doubling). 0: no loss.
    pub loss: f64,
    /// Each hop adds a uniform delay of up to this much (zero: none).
    pub jitter: Duration,
    /// Faults may cut some members off from the gateway (2–40 s, then the cut heals).
    pub partitions: bool,
    /// The gateway itself crashes (its process: the kernel resets every connection; or its
    /// host: silence), all state lost, and restarts after 1–20 s as a fresh core; or it
    /// pauses (SIGSTOP-like) for 1–10 s.
    pub gateway_faults: bool,
    /// Mean time between two faults of the gateway itself.
    pub gateway_fault_interval: Duration,
    /// Each packet between a client and the gateway is lost with this probability (a lost SYN
    /// is sent again after 1 s, doubling, and the client gives up at 3 s; a lost segment costs
    /// a retransmission, 200 ms doubling). 0: no loss.
    pub client_loss: f64,
    /// Each hop between a client and the gateway adds a uniform delay of up to this much.
    pub client_jitter: Duration,
    /// Faults may cut clients off from the gateway (2–40 s, then the cut heals).
    pub client_partitions: bool,
    /// Where the members come from.
    pub source: GatewaySource,
    /// How often the gateway resolves its pool (RSerPool members).
    pub refresh: Duration,
    /// RSerPool members: some member faults are a PE that deregisters (its service stays up)
    /// and registers again 5–40 s later.
    pub churn: bool,
    /// RSerPool members: the registrar crashes (all state lost) and restarts after 1–20 s.
    pub registrar_faults: bool,
    /// Mean time between two registrar crashes.
    pub registrar_fault_interval: Duration,
}

impl GatewayConfig {
    /// A run drawn from `seed`: 2–8 members, 1–6 clients, a policy, tight limits (so that they
    /// are reached), faults every 5–30 s, and in half of the seeds each a panic threshold and
    /// client persistence; 0–3 connect retries.
    pub fn from_seed(seed: u64) -> Self {
        let mut r = ChaCha8Rng::seed_from_u64(seed ^ 0x6a7e_3a11_0000_0000);
        let policies: Vec<LoadSharePolicy> = LoadSharePolicy::ALL
            .iter()
            .map(|(_, p)| *p)
            .filter(|p| *p != LoadSharePolicy::Pool)
            .collect();
        let mut c = GatewayConfig {
            seed,
            members: r.random_range(2..=8),
            clients: r.random_range(1..=6),
            open_interval: Duration::from_millis(r.random_range(100..2000)),
            policy: policies[r.random_range(0..policies.len())],
            max_sessions: r.random_range(4..40),
            max_sessions_per_member: r.random_range(2..12),
            response_timeout: r
                .random_bool(0.7)
                .then(|| Duration::from_secs(r.random_range(2..8))),
            fault_interval: Duration::from_secs(r.random_range(5..30)),
            pauses: r.random_bool(0.5),
            length: Duration::from_secs(r.random_range(60..240)),
            trace: false,
            mutation: None,
            panic_threshold_percent: if r.random_bool(0.5) {
                r.random_range(20..70)
            } else {
                0
            },
            connect_retries: r.random_range(0..=3),
            persistence: if r.random_bool(0.5) {
                Duration::from_secs(r.random_range(5..60))
            } else {
                Duration::ZERO
            },
            loss: 0.0,
            jitter: Duration::ZERO,
            partitions: false,
            gateway_faults: false,
            gateway_fault_interval: Duration::from_secs(30),
            client_loss: 0.0,
            client_jitter: Duration::ZERO,
            client_partitions: false,
            source: GatewaySource::Static,
            refresh: Duration::from_secs(2),
            churn: false,
            registrar_faults: false,
            registrar_fault_interval: Duration::from_secs(60),
        };
        // The lossy network came later, drawn last: a seed whose network turns out clean and
        // whole runs as before it (no draw of the run depends on these when they are off).
        if r.random_bool(0.5) {
            c.loss = r.random_range(0.0..0.1);
        }
        if r.random_bool(0.5) {
            c.jitter = Duration::from_micros(r.random_range(1..20_000));
        }
        c.partitions = r.random_bool(0.5);
        // Faults of the gateway itself and the network between the clients and the gateway
        // came later still, drawn after everything above: with them off a seed runs as before
        // (their random choices come from a stream of their own).
        c.gateway_faults = r.random_bool(0.5);
        c.gateway_fault_interval = Duration::from_secs(r.random_range(15..60));
        if r.random_bool(0.5) {
            c.client_loss = r.random_range(0.0..0.1);
        }
        if r.random_bool(0.5) {
            c.client_jitter = Duration::from_micros(r.random_range(1..20_000));
        }
        c.client_partitions = r.random_bool(0.5);
        // Members fed by a registrar came last: in a third of the seeds.
        if r.random_bool(0.35) {
            c.source = GatewaySource::Rserpool;
            c.refresh = Duration::from_millis(r.random_range(1_000..5_000));
            c.churn = r.random_bool(0.7);
            c.registrar_faults = r.random_bool(0.5);
            c.registrar_fault_interval = Duration::from_secs(r.random_range(30..90));
        }
        c
    }

    /// No loss, jitter or cuts on either side of the gateway (`--clean-network`).
    pub fn clean_network(mut self) -> Self {
        self.loss = 0.0;
        self.jitter = Duration::ZERO;
        self.partitions = false;
        self.clean_client_network()
    }

    /// No loss, jitter or cuts between the clients and the gateway.
    pub fn clean_client_network(mut self) -> Self {
        self.client_loss = 0.0;
        self.client_jitter = Duration::ZERO;
        self.client_partitions = false;
        self
    }

    /// Whether the network between the clients and the gateway is clean (then it draws
    /// nothing and adds no delay: a seed runs as it did before that network was simulated).
    pub fn client_network_is_clean(&self) -> bool {
        self.client_loss == 0.0 && self.client_jitter.is_zero() && !self.client_partitions
    }
}
