//! `rserpool pe`: a pool element serving one of the example services (Echo, Discard, Daytime,
//! CharGen, PingPong, CalcApp; wire-compatible with RSPLIB's `rspserver`). It registers with a
//! registrar (hunting among those given and those heard in announces), answers keep-alives,
//! re-registers when its load changes, accepts pool users' sessions with the ASAP control
//! channel beside the data, and deregisters on SIGINT/SIGTERM.
//!
//! Every setting is a flag and a key of the TOML file given with `--config` (flags win); the
//! services' own settings (`[cookie]`, `[pingpong]`, `[calcapp]`, ...) go in a
//! `[service-config]` table of that file.

use anyhow::{bail, Context, Result};
use clap::Args;
use rserpool_endpoint::driver::{
    PoolElementHandle, PoolElementServer, PoolUserClient, RegistrarAccess,
};
use rserpool_endpoint::pe::PoolElementConfig;
use rserpool_endpoint::pu::ResolverConfig;
use rserpool_endpoint::server::ServerConfig;
use rserpool_services::{ServiceConfig, ServiceKind};
use rserpool_transport::multicast::{MulticastConfig, Profile as McProfile};
use rserpool_transport::{EndpointConfig, TransportChoice, TransportKind};
use rserpool_wire::{
    PoolElementId, PoolHandle, PoolPolicy, Protocol, RegistrationLife, TransportAddress,
    TransportUse, UserTransport,
};
use serde::Deserialize;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Options of `rserpool pe`. Durations are written with a unit (`500ms`, `30s`).
#[derive(Args, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct PeArgs {
    /// TOML file with any of these options as keys (e.g. `pool-handle = "PingPongPool"`) and the
    /// services' settings in a `[service-config]` table; flags given on the command line take
    /// precedence.
    #[arg(long, short = 'c', value_name = "FILE")]
    #[serde(skip)]
    pub config: Option<PathBuf>,
    /// Check the configuration (file and flags), print the settings and exit without starting.
    #[arg(long)]
    #[serde(skip)]
    pub check: bool,
    /// The service: echo, discard, daytime, chargen, pingpong, calcapp (RSPLIB's `-echo`, ...).
    /// [default: echo]
    #[arg(long)]
    pub service: Option<String>,
    /// The pool to join. [default: the service's: EchoPool, DiscardPool, DaytimePool,
    /// CharGenPool, PingPongPool, CalcAppPool]
    #[arg(long)]
    pub pool_handle: Option<String>,
    /// Registrar to register with (repeat for a list to hunt among). [default: 127.0.0.1:3863
    /// when no announces are heard]
    #[arg(long, value_name = "ADDR:PORT")]
    #[serde(default)]
    pub registrar: Vec<SocketAddr>,
    /// Registrars heard in ASAP_SERVER_ANNOUNCEs are candidates too: `auto` (239.0.0.50:3863),
    /// `off`, or a group ADDR:PORT. [default: off]
    #[arg(long, value_name = "auto|off|ADDR:PORT")]
    pub asap_announce: Option<String>,
    /// Transport to registrars and to pool users: auto (SCTP where the kernel has it, else the
    /// TCP mapping), sctp or tcp. [default: auto]
    #[arg(long, value_parser = ["auto", "sctp", "tcp"])]
    pub transport: Option<String>,
    /// Where pool users connect (the user transport). Port 0 picks one. With the unspecified
    /// address the PE registers the address it reaches the registrar from. [default:
    /// 0.0.0.0:0]
    #[arg(long, value_name = "ADDR:PORT")]
    pub local: Option<SocketAddr>,
    /// Where the registrar association comes from; a new home registrar (ENRP takeover)
    /// connects here over the TCP mapping. [default: any address, an ephemeral port]
    #[arg(long, value_name = "ADDR:PORT")]
    pub asap_local: Option<SocketAddr>,
    /// The pool policy and this PE's values, as rspserver's `-policy=`: RoundRobin, Random,
    /// LeastUsed, RandomizedLeastUsed, LeastUsedDegradation:D, PriorityLeastUsed:D,
    /// WeightedRoundRobin:W, WeightedRandom:W, Priority:P (D a fraction, e.g. 0.01).
    /// [default: RoundRobin]
    #[arg(long)]
    pub policy: Option<String>,
    /// Initial load (0..1) for load-based policies; later the service's own load is registered.
    /// [default: 0]
    #[arg(long)]
    pub load: Option<f64>,
    /// Weight for weighted policies (overrides the one given in --policy).
    #[arg(long)]
    pub weight: Option<u32>,
    /// This PE's identifier, e.g. 0x1234abcd or $1234abcd. [default: random]
    #[arg(long, value_parser = parse_id)]
    pub identifier: Option<u32>,
    /// Re-registration interval (rspserver `-rereginterval`); the registration life is three
    /// times it. [default: 30s]
    #[arg(long, value_parser = crate::units::duration_arg)]
    #[serde(default, with = "humantime_serde")]
    pub rereg_interval: Option<Duration>,
    /// Send an ASAP_BUSINESS_CARD (RFC 5352 §3.9) to each new session: the other PEs of the
    /// pool, as resolved at the registrar every `business-card-refresh`. RSPLIB ignores it.
    #[arg(long)]
    pub business_card: Option<bool>,
    /// How often the business card's PEs are resolved again. [default: 5s]
    #[arg(long, value_parser = crate::units::duration_arg)]
    #[serde(default, with = "humantime_serde")]
    pub business_card_refresh: Option<Duration>,
    /// Most sessions at once; more are refused. [default: 1024]
    #[arg(long)]
    pub max_sessions: Option<usize>,
    /// Largest cookie echo accepted, in bytes. [default: 65536]
    #[arg(long, value_name = "BYTES")]
    pub max_cookie_size: Option<usize>,
    /// Largest message sent or accepted, in bytes. [default: 65536]
    #[arg(long, value_name = "BYTES")]
    pub max_message_size: Option<usize>,
    /// Sign the services' cookies with HMAC-SHA256 and this key (hex text or raw bytes, at
    /// least 16 bytes; the same file on every PE of the pool). [default: unsigned cookies, as
    /// RSPLIB]
    #[arg(long, value_name = "FILE")]
    pub cookie_key_file: Option<PathBuf>,
    /// Serve the HTTP endpoint here: http://ADDR:PORT/metrics (OpenMetrics), /status (JSON),
    /// /healthz.
    #[arg(long, value_name = "ADDR:PORT")]
    pub metrics: Option<SocketAddr>,
    /// Time a client of the HTTP endpoint has to send its request and read the answer, e.g.
    /// "5s". [default: 5s]
    #[arg(long, value_name = "DURATION", value_parser = crate::units::duration_arg)]
    #[serde(default, with = "humantime_serde")]
    pub metrics_timeout: Option<Duration>,
    /// HTTP endpoint connections served at once; further ones are closed. [default: 64]
    #[arg(long, value_name = "N")]
    pub metrics_max_connections: Option<usize>,
    /// Send Component Status Protocol reports to this monitor (UDP; port 2960 when left out;
    /// RSPLIB's `-cspserver`). Alone, reports go every 250 ms.
    #[arg(long, value_name = "ADDR[:PORT]", env = "CSP_SERVER")]
    pub csp_server: Option<String>,
    /// Time between CSP reports, e.g. "1s", or milliseconds as `-cspinterval` takes them.
    /// Alone, reports go to 127.0.0.1:2960. [default: off; 250ms with --csp-server]
    #[arg(long, value_name = "DURATION", env = "CSP_INTERVAL")]
    pub csp_interval: Option<crate::units::DurationValue>,
    /// The services' settings (file only, the `[service-config]` table).
    #[arg(skip)]
    #[serde(skip)]
    pub service_settings: Option<toml::Table>,
    /// TLS towards the registrars (flags only). ASAP then runs over the TCP mapping; the
    /// sessions with pool users do not use TLS.
    #[command(flatten)]
    #[serde(skip)]
    pub tls: crate::tls::TlsArgs,
}

/// Parses a PE or registrar identifier: decimal, `0x…` or RSPLIB's `$…`.
pub(crate) fn parse_id(s: &str) -> Result<u32, String> {
    let (digits, radix) = match s.strip_prefix("0x").or_else(|| s.strip_prefix('$')) {
        Some(hex) => (hex, 16),
        None => (s, 10),
    };
    u32::from_str_radix(digits, radix).map_err(|e| format!("identifier {s:?}: {e}"))
}

/// Parses `auto|sctp|tcp`.
pub(crate) fn transport_choice(name: &str, v: Option<&str>) -> Result<TransportChoice> {
    Ok(match v.unwrap_or("auto") {
        "auto" => TransportChoice::Auto,
        "sctp" => TransportChoice::Sctp,
        "tcp" => TransportChoice::Tcp,
        other => bail!("{name}: {other:?} is not auto, sctp or tcp"),
    })
}

/// Parses a service name.
pub(crate) fn service_kind(v: Option<&str>) -> Result<ServiceKind> {
    let v = v.unwrap_or("echo");
    v.parse().map_err(|_| {
        anyhow::anyhow!(
            "service: {v:?} is not one of echo, discard, daytime, chargen, pingpong, calcapp"
        )
    })
}

/// A load or degradation fraction as the 32-bit value of the policy parameters.
fn fraction(name: &str, v: f64) -> Result<u32> {
    if !(0.0..=1.0).contains(&v) {
        bail!("{name}: {v} is not a fraction between 0 and 1");
    }
    Ok((v * f64::from(u32::MAX)).round() as u32)
}

/// Parses rspserver's `-policy=` syntax into the policy with this PE's values.
pub(crate) fn parse_policy(text: &str, load: f64, weight: Option<u32>) -> Result<PoolPolicy> {
    let mut parts = text.split(':');
    let name = parts.next().unwrap_or("");
    let args: Vec<&str> = parts.collect();
    let arg = |i: usize, what: &str| -> Result<&str> {
        args.get(i)
            .copied()
            .ok_or_else(|| anyhow::anyhow!("policy: {name} needs {what} (e.g. {name}:0.01)"))
    };
    let num = |i: usize, what: &str| -> Result<f64> {
        let s = arg(i, what)?;
        s.parse::<f64>()
            .map_err(|_| anyhow::anyhow!("policy: {what} {s:?} of {name} is not a number"))
    };
    let l = fraction("load", load)?;
    let w = |i: usize| -> Result<u32> {
        match weight {
            Some(w) => Ok(w),
            None => {
                let s = arg(i, "a weight")?;
                s.parse::<u32>()
                    .map_err(|_| anyhow::anyhow!("policy: weight {s:?} is not an integer"))
            }
        }
    };
    Ok(match name.to_ascii_lowercase().as_str() {
        "roundrobin" | "rr" => PoolPolicy::RoundRobin,
        "random" | "rand" => PoolPolicy::Random,
        "leastused" | "lu" => PoolPolicy::LeastUsed { load: l },
        "randomizedleastused" | "rlu" => PoolPolicy::RandomizedLeastUsed { load: l },
        "leastuseddegradation" | "lud" => PoolPolicy::LeastUsedDegradation {
            load: l,
            degradation: fraction("degradation", num(0, "a degradation")?)?,
        },
        "priorityleastused" | "plu" => PoolPolicy::PriorityLeastUsed {
            load: l,
            degradation: fraction("degradation", num(0, "a degradation")?)?,
        },
        "weightedroundrobin" | "wrr" => PoolPolicy::WeightedRoundRobin { weight: w(0)? },
        "weightedrandom" | "wrand" => PoolPolicy::WeightedRandom { weight: w(0)? },
        "priority" => PoolPolicy::Priority { priority: w(0)? },
        _ => bail!(
            "policy: {text:?} is not one of RoundRobin, Random, LeastUsed, RandomizedLeastUsed, \
             LeastUsedDegradation:D, PriorityLeastUsed:D, WeightedRoundRobin:W, \
             WeightedRandom:W, Priority:P"
        ),
    })
}

/// The same policy with a new load (for the load-based ones).
fn with_load(p: &PoolPolicy, load: u32) -> PoolPolicy {
    match p.clone() {
        PoolPolicy::LeastUsed { .. } => PoolPolicy::LeastUsed { load },
        PoolPolicy::RandomizedLeastUsed { .. } => PoolPolicy::RandomizedLeastUsed { load },
        PoolPolicy::LeastUsedDegradation { degradation, .. } => {
            PoolPolicy::LeastUsedDegradation { load, degradation }
        }
        PoolPolicy::PriorityLeastUsed { degradation, .. } => {
            PoolPolicy::PriorityLeastUsed { load, degradation }
        }
        other => other,
    }
}

/// The multicast group of `auto|off|ADDR:PORT` (None = off).
pub(crate) fn announce_group(v: Option<&str>) -> Result<Option<MulticastConfig>> {
    match v.unwrap_or("off") {
        "off" | "none" => Ok(None),
        "auto" => Ok(Some(MulticastConfig::for_profile(
            McProfile::Rsplib,
            Protocol::Asap,
        ))),
        other => {
            let group: SocketAddr = other.parse().map_err(|_| {
                anyhow::anyhow!("asap-announce: {other:?} is not auto, off or ADDR:PORT")
            })?;
            let mut m = MulticastConfig::for_profile(McProfile::Rsplib, Protocol::Asap);
            m.group = group;
            if group.ip().is_multicast() && group.is_ipv4() {
                m.interfaces = vec![rserpool_transport::multicast::Interface::V4(
                    Ipv4Addr::LOCALHOST,
                )];
            }
            Ok(Some(m))
        }
    }
}

/// The local address a host uses to reach `peer` (no packet is sent).
fn address_towards(peer: SocketAddr) -> Option<IpAddr> {
    let bind: SocketAddr = if peer.is_ipv4() {
        "0.0.0.0:0".parse().ok()?
    } else {
        "[::]:0".parse().ok()?
    };
    let s = std::net::UdpSocket::bind(bind).ok()?;
    s.connect(peer).ok()?;
    Some(s.local_addr().ok()?.ip())
}

impl PeArgs {
    fn merged(mut self) -> Result<Self> {
        let Some(path) = self.config.clone() else {
            return Ok(self);
        };
        let (mut file, service): (PeArgs, _) = crate::units::read_config_with_service_table(&path)?;
        macro_rules! merge {
            ($($f:ident),*) => { $( if self.$f.is_none() { self.$f = file.$f.take(); } )* };
        }
        merge!(
            service,
            pool_handle,
            asap_announce,
            transport,
            local,
            asap_local,
            policy,
            load,
            weight,
            identifier,
            rereg_interval,
            business_card,
            business_card_refresh,
            max_sessions,
            max_cookie_size,
            max_message_size,
            cookie_key_file,
            metrics,
            metrics_timeout,
            metrics_max_connections,
            csp_server,
            csp_interval
        );
        if self.registrar.is_empty() {
            self.registrar = file.registrar;
        }
        if service.is_some() {
            self.service_settings = service;
        }
        Ok(self)
    }
}

/// Counters of a running PE, for `/metrics` and CSP reports.
#[derive(Default)]
struct PeMetrics {
    id: PoolElementId,
    pool: String,
    /// The home registrar and since when this PE is registered.
    home: Option<(rserpool_wire::RegistrarId, std::time::Instant)>,
    /// The registered load, where the policy uses one.
    load: Option<f64>,
    registered: bool,
    registrations: u64,
    keep_alives: u64,
    new_homes: u64,
    hunt_rounds_failed: u64,
    server: rserpool_endpoint::server::ServerStats,
}

impl PeMetrics {
    /// The metrics as of now (`rserpool_pe_…`).
    fn metric_set(&self) -> rserpool_observe::MetricSet {
        let s = &self.server;
        let mut m = rserpool_observe::MetricSet::new();
        let home = self
            .home
            .filter(|(h, _)| h.0 != 0)
            .map(|(h, _)| h.to_string())
            .unwrap_or_default();
        let load = self
            .load
            .map(|l| format!("{:.0}%", l * 100.0))
            .unwrap_or_else(|| "-".into());
        m.family(
            "rserpool_pe_info",
            rserpool_observe::Kind::Gauge,
            "This PE: its identifier, pool, home registrar and registered load.",
        )
        .sample(
            &[
                ("id", &self.id.to_string()),
                ("pool", &self.pool),
                ("home", &home),
                ("load", &load),
            ],
            1,
        );
        m.gauge(
            "rserpool_pe_registered",
            "1 while a registrar has accepted the registration.",
            u64::from(self.registered),
        );
        for (name, help, v) in [
            (
                "registrations_total",
                "Registrations accepted (first and re-registrations).",
                self.registrations,
            ),
            (
                "keep_alives_total",
                "Registrar keep-alives answered.",
                self.keep_alives,
            ),
            (
                "new_homes_total",
                "Takeovers by a new home registrar (H=1 keep-alive).",
                self.new_homes,
            ),
            (
                "hunt_rounds_failed_total",
                "Server hunt rounds in which no registrar answered.",
                self.hunt_rounds_failed,
            ),
        ] {
            m.counter(&format!("rserpool_pe_{name}"), help, v);
        }
        m.gauge("rserpool_pe_sessions", "Sessions now.", s.active);
        for (name, help, v) in [
            ("sessions_accepted_total", "Sessions accepted.", s.accepted),
            (
                "sessions_refused_total",
                "Sessions refused at the session limit.",
                s.refused,
            ),
            ("cookies_sent_total", "ASAP_COOKIEs sent.", s.cookies_sent),
            (
                "cookie_echoes_total",
                "ASAP_COOKIE_ECHOs handed to the service.",
                s.cookie_echoes,
            ),
            (
                "cookie_echoes_refused_total",
                "Cookie echoes the service refused.",
                s.cookie_echoes_refused,
            ),
            (
                "business_cards_sent_total",
                "ASAP_BUSINESS_CARDs sent.",
                s.business_cards_sent,
            ),
            (
                "messages_received_total",
                "Data messages received.",
                s.messages_received,
            ),
            (
                "messages_sent_total",
                "Data messages sent.",
                s.messages_sent,
            ),
            (
                "bad_input_total",
                "Sessions aborted for bad control-channel input.",
                s.bad_input,
            ),
            (
                "service_aborts_total",
                "Sessions the service aborted.",
                s.service_aborts,
            ),
        ] {
            m.counter(&format!("rserpool_pe_{name}"), help, v);
        }
        m
    }

    /// The `/status` document: who this PE is, where it is registered, its sessions.
    fn status(&self, service: &str) -> serde_json::Value {
        let s = &self.server;
        serde_json::json!({
            "component": "pe",
            "id": self.id.to_string(),
            "pool": self.pool,
            "service": service,
            "registered": self.registered,
            "home": self.home.filter(|(h, _)| h.0 != 0).map(|(h, _)| h.to_string()),
            "registered_for_seconds": self.home.filter(|_| self.registered).map(|(_, since)| since.elapsed().as_secs()),
            "load": self.load,
            "sessions": s.active,
            "counters": {
                "registrations": self.registrations,
                "keep_alives": self.keep_alives,
                "new_homes": self.new_homes,
                "hunt_rounds_failed": self.hunt_rounds_failed,
                "sessions_accepted": s.accepted,
                "sessions_refused": s.refused,
                "cookie_echoes": s.cookie_echoes,
                "messages_received": s.messages_received,
                "messages_sent": s.messages_sent,
                "bad_input": s.bad_input,
                "service_aborts": s.service_aborts,
            },
        })
    }
}

/// Runs the pool element until SIGINT or SIGTERM.
pub fn run(args: PeArgs) -> Result<()> {
    let a = args.merged()?;
    let http_limits = crate::units::http_limits(a.metrics_timeout, a.metrics_max_connections)?;
    let kind = service_kind(a.service.as_deref())?;
    let transport = transport_choice("transport", a.transport.as_deref())?;
    let tls = a.tls.settings()?;
    let pool = PoolHandle::from(
        a.pool_handle
            .clone()
            .unwrap_or_else(|| kind.default_pool_handle().to_string())
            .as_str(),
    );
    let mut service_config: ServiceConfig = match a.service_settings.clone() {
        Some(t) => toml::Value::Table(t)
            .try_into()
            .context("in the [service-config] table of the configuration")?,
        None => ServiceConfig::default(),
    };
    if let Some(k) = &a.cookie_key_file {
        service_config.cookie.key_file = Some(k.clone());
    }
    let service = service_config
        .server(kind)
        .context("cookie-key-file / [service.cookie]")?;
    let policy = parse_policy(
        a.policy.as_deref().unwrap_or("RoundRobin"),
        a.load.unwrap_or(0.0),
        a.weight,
    )?;
    let rereg = a.rereg_interval.unwrap_or(Duration::from_secs(30));
    if rereg < Duration::from_millis(10) {
        bail!("rereg-interval: must be at least 10ms");
    }
    let announce = announce_group(a.asap_announce.as_deref())?;
    let csp = crate::csp::config(a.csp_server.as_deref(), a.csp_interval)?;
    let mut registrars = a.registrar.clone();
    if registrars.is_empty() && announce.is_none() {
        registrars.push("127.0.0.1:3863".parse()?);
    }
    let mut server_config = ServerConfig::default();
    if let Some(n) = a.max_sessions {
        if n == 0 {
            bail!("max-sessions: must be at least 1");
        }
        server_config.max_sessions = n;
    }
    if let Some(n) = a.max_cookie_size {
        server_config.max_cookie_size = n;
    }
    let mut user_ep = EndpointConfig::listening(
        transport,
        &[a.local
            .unwrap_or_else(|| "0.0.0.0:0".parse().expect("valid"))],
    );
    if let Some(n) = a.max_message_size {
        if n == 0 || n > 65_536 {
            bail!("max-message-size: {n} is not in 1..=65536");
        }
        user_ep.limits.max_message_size = n;
    }
    user_ep.limits.max_associations = server_config.max_sessions + 16;
    if a.check {
        println!(
            "configuration ok\nservice: {} in pool {pool}, policy {policy:?}\ntransport: {}, users at {}\nregistrars: {}{}\nre-registration every {}\nlimits: {} sessions, cookies up to {} bytes, messages up to {} bytes\nmetrics: {}",
            kind.name(),
            a.transport.as_deref().unwrap_or("auto"),
            a.local.map_or("0.0.0.0:0".to_string(), |l| l.to_string()),
            if registrars.is_empty() { "none".to_string() } else { format!("{registrars:?}") },
            if announce.is_some() { " and those announced" } else { "" },
            crate::units::human(rereg),
            server_config.max_sessions,
            server_config.max_cookie_size,
            user_ep.limits.max_message_size,
            a.metrics.map_or("off".to_string(), |m| format!("http://{m}/metrics")),
        );
        return Ok(());
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let server = PoolElementServer::start(user_ep, server_config, service)
            .await
            .context("binding the user transport (local)")?;
        let bound = server.local_addrs().first().copied().context("no local address bound")?;
        let ip = if bound.ip().is_unspecified() {
            registrars
                .first()
                .and_then(|r| address_towards(*r))
                .unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST))
        } else {
            bound.ip()
        };
        let user_transport = UserTransport::Address(match server.kind() {
            TransportKind::Sctp => {
                TransportAddress::sctp(bound.port(), TransportUse::DataPlusControl, vec![ip])
            }
            TransportKind::Tcp => TransportAddress::tcp(bound.port(), ip),
        });
        let mut config = PoolElementConfig::new(pool.clone(), user_transport.clone(), policy.clone());
        config.pe_id = a.identifier.map(PoolElementId);
        config.reregistration_interval = rereg;
        config.registration_life = RegistrationLife::Finite(rereg * 3);
        let mut access = RegistrarAccess::single(
            registrars.first().copied().unwrap_or_else(|| "127.0.0.1:3863".parse().expect("valid")),
            transport,
        );
        access.registrars = registrars.iter().map(|r| vec![*r]).collect();
        access.announce = announce;
        // A new home registrar connects to this address (TCP mapping): by default the
        // address pool users reach, with an ephemeral port; never the wildcard by surprise.
        // Over SCTP the one-to-many socket accepts on its wildcard addresses.
        access.transport = match server.kind() {
            TransportKind::Sctp => TransportChoice::Sctp,
            TransportKind::Tcp => TransportChoice::Tcp,
        };
        if let Some(tls) = tls.clone() {
            // TLS runs over the TCP mapping only (docs/security.md#tls).
            access.transport = TransportChoice::Tcp;
            access.endpoint.tls = Some(tls);
        }
        match a.asap_local {
            Some(l) => access.endpoint.local_addrs = vec![l],
            None if server.kind() == TransportKind::Tcp && !bound.ip().is_unspecified() => {
                access.endpoint.local_addrs = vec![SocketAddr::new(bound.ip(), 0)]
            }
            None => {}
        }
        let pe = PoolElementHandle::start(config, access.clone())
            .await
            .context("starting the registration")?;
        let id = pe.id();
        println!(
            "PE {id} serving {} in pool {pool} on {} ({}), registrars {:?}",
            kind.name(),
            user_transport.as_address().map(|t| t.to_string()).unwrap_or_default(),
            server.kind(),
            registrars
        );
        let metrics = Arc::new(Mutex::new(PeMetrics {
            id,
            pool: pool.to_string(),
            ..PeMetrics::default()
        }));
        let reporter = csp.map(|c| {
            let metrics = metrics.clone();
            let (pool, protocol) = (pool.clone(), crate::csp::protocol(server.kind()));
            let location = crate::csp::location(&[SocketAddr::new(ip, bound.port())]);
            crate::csp::Reporter::start(c, location, move || {
                let m = metrics.lock();
                let m = m.as_deref().ok();
                crate::csp::pool_element_snapshot(
                    id,
                    &pool,
                    m.and_then(|m| m.home).map(|(h, since)| (h, since.elapsed())),
                    m.map_or(0, |m| m.server.active),
                    m.and_then(|m| m.load),
                    protocol,
                )
            })
        });
        let _http = match a.metrics {
            Some(m) => {
                let listener = rserpool_observe::server::bind(m).await?;
                println!("metrics at http://{}/metrics", listener.local_addr()?);
                let (m1, m2) = (metrics.clone(), metrics.clone());
                let service = kind.name();
                Some(
                    rserpool_observe::server::Endpoint::new("pe", move || {
                        m1.lock()
                            .map(|m| m.metric_set().render())
                            .unwrap_or_default()
                    })
                    .status(move || {
                        m2.lock()
                            .map(|m| m.status(service))
                            .unwrap_or_default()
                    })
                    .limits(http_limits)
                    .spawn(listener),
                )
            }
            None => None,
        };
        let card_client = if a.business_card.unwrap_or(false) {
            Some(
                PoolUserClient::start(
                    ResolverConfig {
                        items: Some(16),
                        ..ResolverConfig::default()
                    },
                    access.clone(),
                )
                .await?,
            )
        } else {
            None
        };
        let refresh = a.business_card_refresh.unwrap_or(Duration::from_secs(5));
        let mut card_timer = tokio::time::interval(refresh);
        let mut tick = tokio::time::interval(Duration::from_millis(100));
        let mut registered_load = policy.load();
        let mut was_registered = false;
        let stop = crate::shutdown_signal();
        tokio::pin!(stop);
        loop {
            tokio::select! {
                _ = &mut stop => break,
                _ = card_timer.tick(), if card_client.is_some() => {
                    if let Some(c) = &card_client {
                        match c.resolve(pool.clone()).await {
                            Ok(r) => {
                                let others: Vec<_> = r.pool_elements.into_iter().filter(|p| p.id != id).collect();
                                let card = (!others.is_empty()).then(|| (pool.clone(), others));
                                server.set_business_card(card).await;
                            }
                            Err(e) => tracing::debug!(error = %e, "business card: resolution failed"),
                        }
                    }
                }
                _ = tick.tick() => {
                    let st = pe.status();
                    let sv = server.status();
                    if st.registered != was_registered {
                        was_registered = st.registered;
                        if st.registered {
                            println!("PE {id} registered");
                        }
                    }
                    // Re-register when the service's load moved by 1 % or more (as RSPLIB's
                    // CalcApp PE does) and the policy uses load.
                    if let Some(old) = registered_load {
                        let new = (f64::from(sv.load_per_mille) / 1000.0 * f64::from(u32::MAX)) as u32;
                        if (i64::from(new) - i64::from(old)).unsigned_abs() >= u64::from(u32::MAX / 100) {
                            registered_load = Some(new);
                            pe.set_policy(with_load(&policy, new)).await;
                        }
                    }
                    if let Ok(mut m) = metrics.lock() {
                        // Registered since when, at which home (0 until a keep-alive names it).
                        let home = st.home.unwrap_or_default();
                        m.home = match (st.registered, m.home) {
                            (false, _) => None,
                            (true, Some((old, since))) if old == home || old.0 == 0 => Some((home, since)),
                            (true, _) => Some((home, std::time::Instant::now())),
                        };
                        m.load = registered_load.map(|l| f64::from(l) / f64::from(u32::MAX));
                        m.registered = st.registered;
                        m.registrations = st.registrations;
                        m.keep_alives = st.keep_alives;
                        m.new_homes = st.new_homes;
                        m.hunt_rounds_failed = st.hunt_rounds_failed;
                        m.server = sv.stats;
                    }
                }
            }
        }
        if let Some(r) = reporter {
            r.finish().await;
        }
        println!("PE {id} stopping: deregistering");
        tokio::time::timeout(Duration::from_secs(5), pe.deregister())
            .await
            .ok();
        tokio::time::timeout(Duration::from_secs(3), server.shutdown())
            .await
            .ok();
        println!("PE {id} stopped");
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policies_in_rspserver_syntax() {
        assert_eq!(
            parse_policy("RoundRobin", 0.0, None).unwrap(),
            PoolPolicy::RoundRobin
        );
        assert_eq!(
            parse_policy("LeastUsedDegradation:0.5", 0.0, None).unwrap(),
            PoolPolicy::LeastUsedDegradation {
                load: 0,
                degradation: (f64::from(u32::MAX) * 0.5).round() as u32
            }
        );
        assert_eq!(
            parse_policy("WeightedRoundRobin:7", 0.0, None).unwrap(),
            PoolPolicy::WeightedRoundRobin { weight: 7 }
        );
        assert_eq!(
            parse_policy("WeightedRoundRobin", 0.0, Some(3)).unwrap(),
            PoolPolicy::WeightedRoundRobin { weight: 3 }
        );
        let e = parse_policy("LeastUsedDegradation", 0.0, None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("needs a degradation"), "{e}");
        let e = parse_policy("Fastest", 0.0, None).unwrap_err().to_string();
        assert!(e.contains("policy: \"Fastest\""), "{e}");
        let e = parse_policy("LeastUsed", 1.5, None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("load: 1.5"), "{e}");
    }
}
