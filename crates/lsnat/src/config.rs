//! Configuration: a TOML file and/or command-line flags, checked into typed settings.
//!
//! Every field is optional except the listeners and members; defaults are the RFC floors and
//! the limits documented in `docs/lsnat.md`. A malformed file is refused with an error naming
//! the field (and, for syntax and type errors, the line and column).

use crate::core::member::{Cost, MemberSpec};
use crate::core::persistence::PersistenceParams;
use crate::core::policy::{LoadSharePolicy, TrafficMetric};
use crate::core::{CoreConfig, HealthParams, Limits, Protocol, Timers};
use serde::Deserialize;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

/// Why a configuration was refused.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("reading {path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The error.
        source: std::io::Error,
    },
    /// TOML syntax, an unknown field or a value of the wrong type (the message has the line).
    #[error("{origin}: {message}")]
    Syntax {
        /// The file, or "configuration".
        origin: String,
        /// toml's message, with line and column.
        message: String,
    },
    /// A field whose value is not acceptable.
    #[error("{origin}: field `{field}`: {message}")]
    Invalid {
        /// The file, or "configuration".
        origin: String,
        /// The field's path, e.g. `pool.members[1].weight`.
        field: String,
        /// What is wrong and what is expected.
        message: String,
    },
}

/// How members are probed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProbeKind {
    /// TCP connect (then optionally send and expect).
    Tcp,
    /// UDP: send `send`, expect a datagram (containing `expect`, if set).
    Udp,
    /// No active probes: passive evidence only, and `revive_after` returns dead members.
    None,
}

/// Active probe settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProbeConfig {
    /// Kind of probe.
    pub kind: ProbeKind,
    /// Time between probes of a member.
    pub interval: Duration,
    /// Time a probe may take.
    pub timeout: Duration,
    /// Probe this port instead of the member's.
    pub port: Option<u16>,
    /// Bytes to send after connecting.
    pub send: Vec<u8>,
    /// Bytes the reply must contain (empty: any reply, or for TCP none needed).
    pub expect: Vec<u8>,
    /// How a TCP probe ends its connection: with a FIN, as a client would (`graceful`, the
    /// default; the member's application sees an ordinary close), or with a RST (`reset`: no
    /// TIME_WAIT on either side, but many servers log a reset as an error).
    pub close: ProbeClose,
}

/// How a TCP probe closes its connection (`health.close`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProbeClose {
    /// FIN after the exchange; the reply (if any) is read to the end first.
    Graceful,
    /// RST (SO_LINGER 0).
    Reset,
}

/// A virtual address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ListenerConfig {
    /// Address and port.
    pub address: SocketAddr,
    /// TCP or UDP.
    pub protocol: Protocol,
}

/// Data plane settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RuntimeConfig {
    /// TCP relay worker threads, each with its own event loop and its own socket of every TCP
    /// listener (None: one per CPU the process may run on).
    pub worker_threads: Option<usize>,
    /// Relay buffer per direction of a TCP session, bytes.
    pub buffer_size: usize,
    /// Linux: a TCP direction whose read fills the buffer (a bulk transfer) moves to
    /// `splice(2)`, so its bytes no longer pass through user space.
    pub splice: bool,
    /// Pipe per spliced direction, bytes: what the relay holds for a destination that is
    /// slower than its source (the kernel rounds it up to a power of two pages, and an
    /// unprivileged process gets at most `/proc/sys/fs/pipe-max-size`). A peer that stops
    /// reading pins at most two of them per session, beside the sockets' own buffers.
    pub pipe_size: usize,
    /// How often the core's timers are run.
    pub tick: Duration,
    /// How often a relay reports its traffic to the core (bounds idle-timer precision).
    pub report_interval: Duration,
    /// How the kernel schedules the relay workers.
    pub scheduling: Scheduling,
}

/// The scheduling policy of the relay workers (sched(7)).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Scheduling {
    /// The policy the process was started with (`SCHED_OTHER` unless started otherwise): a
    /// worker woken by a socket may preempt the task running on its CPU, and on a busy machine
    /// it then wakes once per event.
    Normal,
    /// `SCHED_BATCH`: a woken worker runs on an idle CPU at once, but does not preempt a
    /// running task, so on a busy machine it finds several events per wake-up.
    #[default]
    Batch,
}

impl Scheduling {
    /// The setting's value in the file.
    pub fn name(self) -> &'static str {
        match self {
            Scheduling::Normal => "normal",
            Scheduling::Batch => "batch",
        }
    }
}

/// The whole, checked configuration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    /// Virtual addresses.
    pub listeners: Vec<ListenerConfig>,
    /// Static members.
    pub members: Vec<MemberSpec>,
    /// The sans-IO core's settings.
    pub core: CoreConfig,
    /// Active probes.
    pub probe: ProbeConfig,
    /// Time a relay connect to a member may take (passive evidence when exceeded).
    pub connect_timeout: Duration,
    /// Address of the HTTP status and metrics endpoint.
    pub status: Option<SocketAddr>,
    /// Limits of that endpoint (`[limits] metrics-timeout`, `metrics-max-connections`).
    pub http_limits: rserpool_observe::server::Limits,
    /// Data plane.
    pub runtime: RuntimeConfig,
    /// Members from an RSerPool pool instead of the static list.
    pub rserpool: Option<RserpoolConfig>,
    /// Notes about accepted but unusual settings (timers below the RFC floors).
    pub warnings: Vec<String>,
    /// Data plane: proxy or NAT.
    pub mode: Mode,
    /// NAT mode settings.
    pub nat: NatConfig,
}

/// Which data plane moves the packets.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Mode {
    /// The userspace relay (works anywhere, without privileges).
    #[default]
    Proxy,
    /// The kernel translates packets (nftables DNAT programmed by the gateway, conntrack
    /// events as receipts); falls back to the proxy when the kernel cannot be programmed,
    /// unless `nat.required`.
    Nat,
}

/// NAT mode settings (`[nat]`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NatConfig {
    /// The nftables tables the gateway owns (this name in family `ip` for IPv4 listeners and
    /// in family `ip6` for IPv6 ones); created, rewritten and removed by it.
    pub table: String,
    /// Source translation towards the members: "off", "masquerade" or an address (of the
    /// listeners' family).
    pub source_nat: crate::nat::plan::SourceNat,
    /// Most slots in the kernel's weight map (weights are scaled to fit).
    pub max_slots: u32,
    /// How often the weight map is recomputed from the core's state (and rewritten when it
    /// changed): bounds how long a member judged dead can still be chosen.
    pub refresh: Duration,
    /// Refuse to start (instead of falling back to the proxy) when NAT cannot be programmed.
    pub required: bool,
    /// Receive buffer of the conntrack event socket, bytes (doubled, up to
    /// `event_buffer_max`, each time the kernel drops events).
    pub event_buffer: usize,
    /// Largest receive buffer the event socket grows to, bytes.
    pub event_buffer_max: usize,
    /// Which conntrack events the kernel generates for the gateway's sessions.
    pub events: crate::nat::plan::NatEvents,
    /// Turn on conntrack accounting (`net.netfilter.nf_conntrack_acct`) so that DESTROY
    /// events carry byte counters.
    pub conntrack_accounting: bool,
    /// Filter the conntrack event socket in the kernel (a BPF program) so that only events
    /// of connections to the listeners reach the gateway.
    pub event_filter: bool,
    /// Under load the event socket is read on a tick of this period instead of whenever it is
    /// readable (one wake-up per tick whatever the load; receipts up to a tick late); while
    /// events are few, and always when zero, it is read as events arrive.
    pub event_interval: Duration,
    /// Path of the `nft` binary.
    pub nft: String,
}

impl Default for NatConfig {
    fn default() -> Self {
        NatConfig {
            table: "rserpool_lsnat".into(),
            source_nat: crate::nat::plan::SourceNat::Off,
            max_slots: 256,
            refresh: Duration::from_millis(100),
            required: false,
            event_buffer: 8 << 20,
            event_buffer_max: 256 << 20,
            events: crate::nat::plan::NatEvents::Answer,
            conntrack_accounting: true,
            event_filter: true,
            event_interval: Duration::from_millis(5),
            nft: "nft".into(),
        }
    }
}

/// Where the members of an RSerPool pool come from: handle resolution at a registrar, repeated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RserpoolConfig {
    /// The pool handle.
    pub pool_handle: rserpool_wire::PoolHandle,
    /// Registrars to ask, in order (each ASAP address).
    pub registrars: Vec<SocketAddr>,
    /// How to reach them.
    pub transport: rserpool_transport::TransportChoice,
    /// How often the pool is resolved again.
    pub refresh: Duration,
    /// The listeners' protocol: PEs whose user transport is another one are left out.
    pub protocol: Protocol,
}

#[derive(Deserialize, Default, Debug)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct RawConfig {
    mode: Option<String>,
    #[serde(default)]
    nat: RawNat,
    #[serde(default, rename = "listener")]
    listeners: Vec<RawListener>,
    #[serde(default)]
    pool: RawPool,
    #[serde(default)]
    timers: RawTimers,
    #[serde(default)]
    health: RawHealth,
    #[serde(default)]
    limits: RawLimits,
    #[serde(default)]
    persistence: RawPersistence,
    /// The HTTP endpoint (`GET /metrics`, `/status`, `/healthz`).
    metrics: Option<String>,
    /// Deprecated: `[status] address`, now `metrics`.
    #[serde(default)]
    status: RawStatus,
    #[serde(default)]
    runtime: RawRuntime,
}

#[derive(Deserialize, Default, Debug)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct RawNat {
    table: Option<String>,
    source_nat: Option<String>,
    max_slots: Option<i64>,
    refresh: Option<toml::Value>,
    required: Option<bool>,
    event_buffer: Option<i64>,
    event_buffer_max: Option<i64>,
    events: Option<String>,
    conntrack_accounting: Option<bool>,
    event_filter: Option<bool>,
    event_interval: Option<toml::Value>,
    nft: Option<String>,
}

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct RawListener {
    address: String,
    protocol: Option<String>,
}

#[derive(Deserialize, Default, Debug)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct RawPool {
    policy: Option<String>,
    traffic_metric: Option<String>,
    traffic_window: Option<toml::Value>,
    #[serde(default)]
    members: Vec<RawMember>,
    rserpool: Option<RawRserpool>,
}

#[derive(Deserialize, Debug, Default)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct RawRserpool {
    pool_handle: String,
    #[serde(default)]
    registrars: Vec<String>,
    transport: Option<String>,
    refresh: Option<toml::Value>,
}

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct RawMember {
    address: String,
    weight: Option<i64>,
    cost: Option<toml::Value>,
    max_sessions: Option<i64>,
}

#[derive(Deserialize, Default, Debug)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct RawTimers {
    tcp_established: Option<toml::Value>,
    tcp_transitory: Option<toml::Value>,
    tcp_rst_linger: Option<toml::Value>,
    udp: Option<toml::Value>,
    connect: Option<toml::Value>,
}

#[derive(Deserialize, Default, Debug)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct RawHealth {
    probe: Option<String>,
    interval: Option<toml::Value>,
    timeout: Option<toml::Value>,
    port: Option<i64>,
    send: Option<String>,
    expect: Option<String>,
    close: Option<String>,
    fall: Option<i64>,
    rise: Option<i64>,
    slow_start: Option<toml::Value>,
    revive_after: Option<toml::Value>,
    response_timeout: Option<toml::Value>,
    panic_threshold: Option<i64>,
    close_sessions_on_dead: Option<bool>,
    connect_retries: Option<i64>,
}

#[derive(Deserialize, Default, Debug)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct RawLimits {
    max_sessions: Option<i64>,
    max_sessions_per_member: Option<i64>,
    max_lingering: Option<i64>,
    recent_outcomes: Option<i64>,
    receipt_candidates: Option<i64>,
    status_bindings: Option<i64>,
    metrics_timeout: Option<toml::Value>,
    metrics_max_connections: Option<i64>,
}

#[derive(Deserialize, Default, Debug)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct RawPersistence {
    timeout: Option<toml::Value>,
    netmask_v4: Option<i64>,
    netmask_v6: Option<i64>,
    max_entries: Option<i64>,
}

#[derive(Deserialize, Default, Debug)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct RawStatus {
    address: Option<String>,
}

#[derive(Deserialize, Default, Debug)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct RawRuntime {
    worker_threads: Option<i64>,
    buffer_size: Option<i64>,
    splice: Option<bool>,
    pipe_size: Option<i64>,
    tick: Option<toml::Value>,
    scheduling: Option<String>,
}

/// Command-line values that override or extend a file (see `LsnatArgs`).
#[derive(Clone, Debug, Default)]
pub struct Overrides {
    /// `--listen [tcp:|udp:]ADDR`, replacing the file's listeners when given.
    pub listen: Vec<String>,
    /// `--member ADDR[,WEIGHT[,COST]]`, replacing the file's members when given.
    pub members: Vec<String>,
    /// `--policy NAME`.
    pub policy: Option<String>,
    /// `--metrics ADDR` (or the deprecated `--status ADDR`).
    pub metrics: Option<String>,
    /// `--mode proxy|nat`.
    pub mode: Option<String>,
    /// `--threads N`.
    pub threads: Option<usize>,
    /// `--pool-handle NAME`: members from this RSerPool pool.
    pub pool_handle: Option<String>,
    /// `--registrar ADDR`, replacing the file's registrars when given.
    pub registrars: Vec<String>,
    /// `--transport auto|sctp|tcp` (or the deprecated `--registrar-transport`).
    pub transport: Option<String>,
    /// Deprecation warnings about the command line, reported with the file's.
    pub warnings: Vec<String>,
}

/// Parses a duration written with units (humantime syntax): "250ms", "30s", "2h4m", "1m 30s",
/// "0s".
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let t = text.trim();
    if t.is_empty() {
        return Err("empty duration".into());
    }
    humantime::parse_duration(t).map_err(|e| {
        format!("{text:?} is not a duration ({e}); write e.g. \"250ms\", \"30s\" or \"2h4m\"")
    })
}

/// Renames snake_case keys to the kebab-case the configuration uses, recording a deprecation
/// warning for each; `path` is the table's place in the file.
fn kebab_keys(table: &mut toml::Table, path: &str, warnings: &mut Vec<String>) {
    let keys: Vec<String> = table.keys().cloned().collect();
    for key in keys {
        let mut value = table.remove(&key).expect("a listed key");
        let new = key.replace('_', "-");
        let at = if path.is_empty() {
            new.clone()
        } else {
            format!("{path}.{new}")
        };
        if new != key {
            warnings.push(format!(
                "`{key}` is a deprecated spelling (snake_case); write `{new}` (at {at})"
            ));
        }
        match &mut value {
            toml::Value::Table(t) => kebab_keys(t, &at, warnings),
            toml::Value::Array(items) => {
                for (i, item) in items.iter_mut().enumerate() {
                    if let toml::Value::Table(t) = item {
                        kebab_keys(t, &format!("{at}[{i}]"), warnings);
                    }
                }
            }
            _ => {}
        }
        table.insert(new, value);
    }
}

struct Checker {
    origin: String,
    /// Deprecations met while checking (bare numbers as durations).
    warnings: std::cell::RefCell<Vec<String>>,
}

impl Checker {
    fn err(&self, field: impl Into<String>, message: impl Into<String>) -> ConfigError {
        ConfigError::Invalid {
            origin: self.origin.clone(),
            field: field.into().replace('_', "-"),
            message: message.into(),
        }
    }

    /// One of `options` by its spelling (`default` when unset); anything else is refused
    /// naming the field and listing the spellings.
    fn choice<T: Copy>(
        &self,
        field: &str,
        v: Option<&str>,
        default: T,
        options: &[(&str, T)],
    ) -> Result<T, ConfigError> {
        let Some(v) = v else { return Ok(default) };
        if let Some((_, t)) = options.iter().find(|(name, _)| *name == v) {
            return Ok(*t);
        }
        let names: Vec<String> = options.iter().map(|(n, _)| format!("{n:?}")).collect();
        let listed = match names.split_last() {
            Some((last, [])) => last.clone(),
            Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
            None => String::new(),
        };
        Err(self.err(field, format!("{v:?} is not {listed}")))
    }

    fn duration(
        &self,
        field: &str,
        v: &Option<toml::Value>,
        default: Duration,
    ) -> Result<Duration, ConfigError> {
        let field = field.replace('_', "-");
        let bare = |secs: f64| {
            let d = Duration::from_secs_f64(secs);
            self.warnings.borrow_mut().push(format!(
                "{field}: a bare number of seconds is deprecated; write \"{}\"",
                crate::human(d)
            ));
            d
        };
        match v {
            None => Ok(default),
            Some(toml::Value::Integer(i)) if *i >= 0 => Ok(bare(*i as f64)),
            Some(toml::Value::Float(f)) if f.is_finite() && *f >= 0.0 && *f < 1e12 => Ok(bare(*f)),
            Some(toml::Value::String(s))
                if !s.trim().is_empty() && s.trim().bytes().all(|b| b.is_ascii_digit()) =>
            {
                let secs: u64 = s
                    .trim()
                    .parse()
                    .map_err(|_| self.err(&field, format!("{s:?}: number too large")))?;
                Ok(bare(secs as f64))
            }
            Some(toml::Value::String(s)) => parse_duration(s).map_err(|m| self.err(&field, m)),
            Some(other) => Err(self.err(
                &field,
                format!("expected a duration such as \"30s\" or \"250ms\", found {other}"),
            )),
        }
    }

    fn int<T: TryFrom<i64>>(
        &self,
        field: &str,
        v: Option<i64>,
        default: T,
        min: i64,
        max: i64,
    ) -> Result<T, ConfigError> {
        match v {
            None => Ok(default),
            Some(i) if i < min || i > max => {
                Err(self.err(field, format!("{i} is out of range {min}..={max}")))
            }
            Some(i) => T::try_from(i).map_err(|_| self.err(field, format!("{i} is out of range"))),
        }
    }

    fn addr(&self, field: &str, s: &str) -> Result<SocketAddr, ConfigError> {
        let a: SocketAddr = s.trim().parse().map_err(|_| {
            self.err(
                field,
                format!(
                    "{s:?} is not an IP:port address (e.g. \"127.0.0.1:8080\" or \"[::1]:8080\")"
                ),
            )
        })?;
        Ok(a)
    }
}

fn cost_value(c: &Checker, field: &str, v: &Option<toml::Value>) -> Result<Cost, ConfigError> {
    match v {
        None => Ok(Cost::Finite(0)),
        Some(toml::Value::Integer(i)) if (0..=i64::from(u32::MAX)).contains(i) => {
            Ok(Cost::Finite(*i as u32))
        }
        Some(toml::Value::String(s))
            if matches!(
                s.to_ascii_lowercase().as_str(),
                "unreachable" | "infinite" | "inf"
            ) =>
        {
            Ok(Cost::Unreachable)
        }
        Some(other) => Err(c.err(
            field,
            format!("expected a cost 0..=4294967295 or \"unreachable\", found {other}"),
        )),
    }
}

fn check_nat(c: &Checker, r: &RawNat) -> Result<NatConfig, ConfigError> {
    use crate::nat::plan::SourceNat;
    let d = NatConfig::default();
    let table = match &r.table {
        None => d.table,
        Some(t)
            if !t.is_empty()
                && t.len() <= 64
                && t.chars()
                    .all(|ch| ch.is_ascii_alphanumeric() || ch == '_' || ch == '-') =>
        {
            t.clone()
        }
        Some(t) => {
            return Err(c.err(
                "nat.table",
                format!("{t:?}: 1 to 64 characters of letters, digits, '_' or '-'"),
            ))
        }
    };
    let source_nat = match r.source_nat.as_deref().map(str::trim) {
        None | Some("off") => SourceNat::Off,
        Some("masquerade") => SourceNat::Masquerade,
        Some(a) => SourceNat::To(a.parse().map_err(|_| {
            c.err(
                "nat.source-nat",
                format!("{a:?} is not \"off\", \"masquerade\" or an IP address"),
            )
        })?),
    };
    let refresh = c.duration("nat.refresh", &r.refresh, d.refresh)?;
    if refresh < Duration::from_millis(10) || refresh > Duration::from_secs(60) {
        return Err(c.err("nat.refresh", "must be between 10ms and 60s"));
    }
    let event_buffer = c.int(
        "nat.event-buffer",
        r.event_buffer,
        d.event_buffer,
        65_536,
        1 << 30,
    )?;
    let event_buffer_max = c.int(
        "nat.event-buffer-max",
        r.event_buffer_max,
        d.event_buffer_max.max(event_buffer),
        event_buffer as i64,
        1 << 30,
    )?;
    let event_interval = c.duration("nat.event-interval", &r.event_interval, d.event_interval)?;
    if event_interval > Duration::from_secs(1) {
        return Err(c.err("nat.event-interval", "must be at most 1s"));
    }
    use crate::nat::plan::NatEvents;
    let events = c.choice(
        "nat.events",
        r.events.as_deref(),
        d.events,
        &[NatEvents::Answer, NatEvents::End, NatEvents::All].map(|e| (e.name(), e)),
    )?;
    Ok(NatConfig {
        table,
        source_nat,
        max_slots: c.int("nat.max-slots", r.max_slots, d.max_slots, 1, 65_536)?,
        refresh,
        required: r.required.unwrap_or(d.required),
        event_buffer,
        event_buffer_max,
        events,
        conntrack_accounting: r.conntrack_accounting.unwrap_or(d.conntrack_accounting),
        event_filter: r.event_filter.unwrap_or(d.event_filter),
        event_interval,
        nft: r.nft.clone().unwrap_or(d.nft),
    })
}

impl Config {
    /// Reads and checks a configuration file.
    pub fn from_file(path: &Path, overrides: &Overrides) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Io {
            path: path.display().to_string(),
            source,
        })?;
        Self::from_toml(&text, &path.display().to_string(), overrides)
    }

    /// Checks a configuration given as TOML text; `origin` names it in errors.
    pub fn from_toml(
        text: &str,
        origin: &str,
        overrides: &Overrides,
    ) -> Result<Config, ConfigError> {
        let syntax = |e: toml::de::Error| ConfigError::Syntax {
            origin: origin.to_string(),
            message: e.to_string().trim_end().to_string(),
        };
        let mut table: toml::Table = toml::from_str(text).map_err(syntax)?;
        let mut warnings = Vec::new();
        kebab_keys(&mut table, "", &mut warnings);
        let raw: RawConfig = if warnings.is_empty() {
            // Read from the text, so that errors keep their line and column.
            toml::from_str(text).map_err(syntax)?
        } else {
            serde::Deserialize::deserialize(toml::Value::Table(table)).map_err(syntax)?
        };
        let mut ov = overrides.clone();
        ov.warnings.extend(warnings);
        Self::check(raw, origin, &ov)
    }

    /// A configuration from command-line values alone.
    pub fn from_overrides(overrides: &Overrides) -> Result<Config, ConfigError> {
        Self::check(RawConfig::default(), "command line", overrides)
    }

    fn check(mut raw: RawConfig, origin: &str, ov: &Overrides) -> Result<Config, ConfigError> {
        let c = Checker {
            origin: origin.to_string(),
            warnings: std::cell::RefCell::new(ov.warnings.clone()),
        };
        if !ov.listen.is_empty() {
            raw.listeners = ov
                .listen
                .iter()
                .map(|l| {
                    let (proto, addr) = match l.split_once(':') {
                        Some((p @ ("tcp" | "udp"), rest)) => {
                            (Some(p.to_string()), rest.to_string())
                        }
                        _ => (None, l.clone()),
                    };
                    RawListener {
                        address: addr,
                        protocol: proto,
                    }
                })
                .collect();
        }
        if !ov.members.is_empty() {
            let mut members = Vec::new();
            for (i, m) in ov.members.iter().enumerate() {
                let mut parts = m.split(',');
                let address = parts.next().unwrap_or("").to_string();
                let weight = match parts.next() {
                    Some(w) => Some(w.trim().parse::<i64>().map_err(|_| {
                        c.err(
                            format!("--member[{i}]"),
                            format!("weight {w:?} is not an integer (ADDR[,WEIGHT[,COST]])"),
                        )
                    })?),
                    None => None,
                };
                let cost = match parts.next() {
                    Some(x) => match x.trim().parse::<i64>() {
                        Ok(v) => Some(toml::Value::Integer(v)),
                        Err(_) => Some(toml::Value::String(x.trim().to_string())),
                    },
                    None => None,
                };
                if parts.next().is_some() {
                    return Err(c.err(format!("--member[{i}]"), "expected ADDR[,WEIGHT[,COST]]"));
                }
                members.push(RawMember {
                    address,
                    weight,
                    cost,
                    max_sessions: None,
                });
            }
            raw.pool.members = members;
        }
        if let Some(p) = &ov.policy {
            raw.pool.policy = Some(p.clone());
        }
        if let Some(addr) = raw.status.address.take() {
            c.warnings.borrow_mut().push(
                "`[status] address` is deprecated; write `metrics = \"ADDR:PORT\"` at the top of the file"
                    .into(),
            );
            if raw.metrics.is_none() {
                raw.metrics = Some(addr);
            }
        }
        if let Some(s) = &ov.metrics {
            raw.metrics = Some(s.clone());
        }
        if let Some(m) = &ov.mode {
            raw.mode = Some(m.clone());
        }
        if let Some(t) = ov.threads {
            raw.runtime.worker_threads = Some(t as i64);
        }
        if let Some(h) = &ov.pool_handle {
            raw.pool
                .rserpool
                .get_or_insert_with(RawRserpool::default)
                .pool_handle = h.clone();
        }
        if !ov.registrars.is_empty() || ov.transport.is_some() {
            let r = raw.pool.rserpool.get_or_insert_with(RawRserpool::default);
            if !ov.registrars.is_empty() {
                r.registrars = ov.registrars.clone();
            }
            if ov.transport.is_some() {
                r.transport = ov.transport.clone();
            }
        }

        let mut warnings = Vec::new();
        // Listeners.
        if raw.listeners.is_empty() {
            return Err(c.err(
                "listener",
                "at least one [[listener]] (address = \"IP:port\", protocol = \"tcp\" or \"udp\") is needed",
            ));
        }
        let mut listeners = Vec::new();
        for (i, l) in raw.listeners.iter().enumerate() {
            let address = c.addr(&format!("listener[{i}].address"), &l.address)?;
            let protocol = match l.protocol.as_deref().unwrap_or("tcp") {
                "tcp" | "TCP" => Protocol::Tcp,
                "udp" | "UDP" => Protocol::Udp,
                other => {
                    return Err(c.err(
                        format!("listener[{i}].protocol"),
                        format!("{other:?} is not \"tcp\" or \"udp\""),
                    ))
                }
            };
            let lc = ListenerConfig { address, protocol };
            if listeners.contains(&lc) {
                return Err(c.err(
                    format!("listener[{i}]"),
                    format!("{} {} is listed twice", protocol.name(), address),
                ));
            }
            listeners.push(lc);
        }

        // Members from an RSerPool pool, or the static list.
        let rserpool = match raw.pool.rserpool.take() {
            None => None,
            Some(r) => {
                if r.pool_handle.is_empty() {
                    return Err(c.err(
                        "pool.rserpool.pool_handle",
                        "the pool handle is missing or empty (or --pool-handle NAME)",
                    ));
                }
                if r.pool_handle.len() > 32 {
                    return Err(c.err(
                        "pool.rserpool.pool_handle",
                        format!(
                            "{} bytes; a pool handle has at most 32",
                            r.pool_handle.len()
                        ),
                    ));
                }
                if r.registrars.is_empty() {
                    return Err(c.err(
                        "pool.rserpool.registrars",
                        "at least one registrar address is needed (or --registrar ADDR)",
                    ));
                }
                let mut registrars = Vec::new();
                for (i, a) in r.registrars.iter().enumerate() {
                    registrars.push(c.addr(&format!("pool.rserpool.registrars[{i}]"), a)?);
                }
                use rserpool_transport::TransportChoice;
                let transport = c.choice(
                    "pool.rserpool.transport",
                    r.transport.as_deref(),
                    TransportChoice::Auto,
                    &[
                        ("auto", TransportChoice::Auto),
                        ("sctp", TransportChoice::Sctp),
                        ("tcp", TransportChoice::Tcp),
                    ],
                )?;
                let refresh =
                    c.duration("pool.rserpool.refresh", &r.refresh, Duration::from_secs(1))?;
                if refresh < Duration::from_millis(10) {
                    return Err(c.err("pool.rserpool.refresh", "must be at least 10ms"));
                }
                if !raw.pool.members.is_empty() {
                    return Err(c.err(
                        "pool.members",
                        "members come either from [pool.rserpool] or from this list, not both",
                    ));
                }
                let protocol = listeners[0].protocol;
                if listeners.iter().any(|l| l.protocol != protocol) {
                    return Err(c.err(
                        "listener",
                        "with [pool.rserpool] all listeners must share one protocol (a PE has one user transport)",
                    ));
                }
                Some(RserpoolConfig {
                    pool_handle: rserpool_wire::PoolHandle::from(r.pool_handle.as_str()),
                    registrars,
                    transport,
                    refresh,
                    protocol,
                })
            }
        };

        // Pool.
        let policy: LoadSharePolicy = match &raw.pool.policy {
            None if rserpool.is_some() => LoadSharePolicy::Pool,
            None => LoadSharePolicy::RoundRobin,
            Some(p) => p.parse().map_err(|m: String| c.err("pool.policy", m))?,
        };
        if policy == LoadSharePolicy::Pool && rserpool.is_none() {
            return Err(c.err(
                "pool.policy",
                "\"pool\" (the pool's own RSerPool policy) needs an RSerPool member source; static members carry no RSerPool policy values. Choose e.g. \"weighted-round-robin\" or \"least-sessions\"",
            ));
        }
        let traffic_metric = c.choice(
            "pool.traffic_metric",
            raw.pool.traffic_metric.as_deref(),
            TrafficMetric::Bytes,
            &[
                ("bytes", TrafficMetric::Bytes),
                ("packets", TrafficMetric::Packets),
            ],
        )?;
        let traffic_window = c.duration(
            "pool.traffic_window",
            &raw.pool.traffic_window,
            Duration::from_secs(10),
        )?;
        if traffic_window < Duration::from_millis(10) {
            return Err(c.err("pool.traffic_window", "must be at least 10ms"));
        }
        if raw.pool.members.is_empty() && rserpool.is_none() {
            return Err(c.err(
                "pool.members",
                "at least one member is needed, e.g. members = [{ address = \"127.0.0.1:9000\" }] (or --member ADDR)",
            ));
        }
        let mut members: Vec<MemberSpec> = Vec::new();
        for (i, m) in raw.pool.members.iter().enumerate() {
            let f = |x: &str| format!("pool.members[{i}].{x}");
            let address = c.addr(&f("address"), &m.address)?;
            if address.port() == 0 {
                return Err(c.err(f("address"), "port 0 is not a member port"));
            }
            if members.iter().any(|x| x.address == address) {
                return Err(c.err(f("address"), format!("{address} is listed twice")));
            }
            let weight = c.int(&f("weight"), m.weight, 1u32, 0, 1_000_000)?;
            let cost = cost_value(&c, &f("cost"), &m.cost)?;
            let max_sessions = match m.max_sessions {
                None => None,
                Some(_) => Some(c.int(
                    &f("max_sessions"),
                    m.max_sessions,
                    0u32,
                    0,
                    i64::from(u32::MAX),
                )?),
            };
            let mut spec = MemberSpec::new(address).weight(weight).cost(cost);
            spec.max_sessions = max_sessions;
            members.push(spec);
        }

        // Timers.
        let t = &raw.timers;
        let d = Timers::default();
        let timers = Timers {
            tcp_established: c.duration(
                "timers.tcp_established",
                &t.tcp_established,
                d.tcp_established,
            )?,
            tcp_transitory: c.duration(
                "timers.tcp_transitory",
                &t.tcp_transitory,
                d.tcp_transitory,
            )?,
            tcp_rst_linger: c.duration(
                "timers.tcp_rst_linger",
                &t.tcp_rst_linger,
                d.tcp_rst_linger,
            )?,
            udp: c.duration("timers.udp", &t.udp, d.udp)?,
        };
        for (name, v, floor, rfc) in [
            (
                "timers.tcp_established",
                timers.tcp_established,
                d.tcp_established,
                "RFC 5382 REQ-5",
            ),
            (
                "timers.tcp_transitory",
                timers.tcp_transitory,
                d.tcp_transitory,
                "RFC 5382",
            ),
            (
                "timers.tcp_rst_linger",
                timers.tcp_rst_linger,
                d.tcp_rst_linger,
                "RFC 7857 §2.2",
            ),
            (
                "timers.udp",
                timers.udp,
                Duration::from_secs(120),
                "RFC 4787 REQ-5",
            ),
        ] {
            if v.is_zero() && name != "timers.tcp_rst_linger" {
                return Err(c.err(name, "must be greater than zero"));
            }
            if v < floor {
                warnings.push(format!(
                    "{} = \"{}\" is below the {rfc} floor of {}",
                    name.replace('_', "-"),
                    crate::human(v),
                    crate::human(floor)
                ));
            }
        }
        let connect_timeout = c.duration("timers.connect", &t.connect, Duration::from_secs(3))?;
        if connect_timeout.is_zero() {
            return Err(c.err("timers.connect", "must be greater than zero"));
        }

        // Health.
        let h = &raw.health;
        let has_tcp = listeners.iter().any(|l| l.protocol == Protocol::Tcp);
        let kind = match h.probe.as_deref() {
            None => {
                if has_tcp {
                    ProbeKind::Tcp
                } else {
                    ProbeKind::None
                }
            }
            Some("tcp") => ProbeKind::Tcp,
            Some("udp") => ProbeKind::Udp,
            Some("none") => ProbeKind::None,
            Some(o) => {
                return Err(c.err(
                    "health.probe",
                    format!("{o:?} is not \"tcp\", \"udp\" or \"none\""),
                ))
            }
        };
        let send = h.send.clone().unwrap_or_default().into_bytes();
        let expect = h.expect.clone().unwrap_or_default().into_bytes();
        if kind == ProbeKind::Udp && send.is_empty() {
            return Err(c.err(
                "health.send",
                "a UDP probe needs bytes to send (health.send)",
            ));
        }
        let probe = ProbeConfig {
            kind,
            interval: c.duration("health.interval", &h.interval, Duration::from_secs(2))?,
            timeout: c.duration("health.timeout", &h.timeout, Duration::from_secs(1))?,
            port: match h.port {
                None => None,
                Some(_) => Some(c.int("health.port", h.port, 0u16, 1, 65535)?),
            },
            send,
            expect,
            close: c.choice(
                "health.close",
                h.close.as_deref(),
                ProbeClose::Graceful,
                &[
                    ("graceful", ProbeClose::Graceful),
                    ("reset", ProbeClose::Reset),
                ],
            )?,
        };
        if probe.interval.is_zero() || probe.timeout.is_zero() {
            return Err(c.err(
                "health.interval",
                "health.interval and health.timeout must be greater than zero",
            ));
        }
        let dh = HealthParams::default();
        let response_timeout = c.duration(
            "health.response_timeout",
            &h.response_timeout,
            Duration::ZERO,
        )?;
        let health = HealthParams {
            liveness: crate::core::member::LivenessParams {
                fall: c.int("health.fall", h.fall, dh.liveness.fall, 1, 1000)?,
                rise: c.int("health.rise", h.rise, dh.liveness.rise, 1, 1000)?,
                slow_start: c.duration(
                    "health.slow_start",
                    &h.slow_start,
                    dh.liveness.slow_start,
                )?,
                revive_after: c.duration(
                    "health.revive_after",
                    &h.revive_after,
                    dh.liveness.revive_after,
                )?,
                active_probes: kind != ProbeKind::None,
            },
            panic_threshold_percent: c.int(
                "health.panic_threshold",
                h.panic_threshold,
                0u8,
                0,
                100,
            )?,
            close_sessions_on_dead: h.close_sessions_on_dead.unwrap_or(true),
            response_timeout: (!response_timeout.is_zero()).then_some(response_timeout),
            connect_retries: c.int(
                "health.connect_retries",
                h.connect_retries,
                dh.connect_retries,
                0,
                16,
            )?,
        };

        // Limits.
        let l = &raw.limits;
        let dl = Limits::default();
        let limits = Limits {
            max_sessions: c.int(
                "limits.max_sessions",
                l.max_sessions,
                dl.max_sessions,
                1,
                10_000_000,
            )?,
            max_sessions_per_member: c.int(
                "limits.max_sessions_per_member",
                l.max_sessions_per_member,
                dl.max_sessions_per_member,
                1,
                10_000_000,
            )?,
            max_lingering: c.int(
                "limits.max_lingering",
                l.max_lingering,
                dl.max_lingering,
                0,
                10_000_000,
            )?,
            recent_outcomes: c.int(
                "limits.recent_outcomes",
                l.recent_outcomes,
                dl.recent_outcomes,
                0,
                100_000,
            )?,
            receipt_candidates: c.int(
                "limits.receipt_candidates",
                l.receipt_candidates,
                dl.receipt_candidates,
                0,
                10_000,
            )?,
            status_bindings: c.int(
                "limits.status_bindings",
                l.status_bindings,
                dl.status_bindings,
                0,
                1_000_000,
            )?,
        };
        let dh = rserpool_observe::server::Limits::default();
        let http_limits = rserpool_observe::server::Limits {
            request_timeout: c.duration(
                "limits.metrics_timeout",
                &l.metrics_timeout,
                dh.request_timeout,
            )?,
            max_connections: c.int(
                "limits.metrics_max_connections",
                l.metrics_max_connections,
                dh.max_connections,
                1,
                100_000,
            )?,
            ..dh
        };
        if http_limits.request_timeout.is_zero() {
            return Err(c.err("limits.metrics-timeout", "must be longer than 0s"));
        }

        // Persistence.
        let p = &raw.persistence;
        let dp = PersistenceParams::default();
        let persistence = PersistenceParams {
            timeout: c.duration("persistence.timeout", &p.timeout, dp.timeout)?,
            netmask_v4: c.int("persistence.netmask_v4", p.netmask_v4, dp.netmask_v4, 0, 32)?,
            netmask_v6: c.int(
                "persistence.netmask_v6",
                p.netmask_v6,
                dp.netmask_v6,
                0,
                128,
            )?,
            max_entries: c.int(
                "persistence.max_entries",
                p.max_entries,
                dp.max_entries,
                1,
                10_000_000,
            )?,
        };

        let status = match &raw.metrics {
            None => None,
            Some(s) => Some(c.addr("metrics", s)?),
        };

        // Runtime.
        let r = &raw.runtime;
        let worker_threads = match r.worker_threads {
            None => None,
            Some(_) => Some(c.int("runtime.worker_threads", r.worker_threads, 1usize, 1, 256)?),
        };
        let smallest = [
            timers.tcp_established,
            timers.tcp_transitory,
            timers.udp,
            health.response_timeout.unwrap_or(Duration::MAX),
            if timers.tcp_rst_linger.is_zero() {
                Duration::MAX
            } else {
                timers.tcp_rst_linger
            },
        ]
        .into_iter()
        .min()
        .unwrap_or(Duration::from_secs(1));
        let default_tick =
            (smallest / 10).clamp(Duration::from_millis(10), Duration::from_millis(500));
        let tick = c.duration("runtime.tick", &r.tick, default_tick)?;
        if tick < Duration::from_millis(1) {
            return Err(c.err("runtime.tick", "must be at least 1ms"));
        }
        let runtime = RuntimeConfig {
            worker_threads,
            buffer_size: c.int(
                "runtime.buffer-size",
                r.buffer_size,
                16_384usize,
                1024,
                1 << 20,
            )?,
            splice: r.splice.unwrap_or(cfg!(target_os = "linux")),
            pipe_size: c.int(
                "runtime.pipe-size",
                r.pipe_size,
                262_144usize,
                4096,
                64 << 20,
            )?,
            tick,
            report_interval: (smallest / 8).clamp(Duration::from_millis(5), Duration::from_secs(1)),
            scheduling: c.choice(
                "runtime.scheduling",
                r.scheduling.as_deref(),
                Scheduling::Batch,
                &[Scheduling::Batch, Scheduling::Normal].map(|p| (p.name(), p)),
            )?,
        };

        // What would bite at run time, refused or warned about now.
        // Port 0 is a port the kernel picks, never one already taken.
        let overlaps = |a: SocketAddr, b: SocketAddr| {
            a.port() != 0
                && a.port() == b.port()
                && (a.ip() == b.ip() || a.ip().is_unspecified() || b.ip().is_unspecified())
        };
        for (i, l) in listeners.iter().enumerate() {
            if let Some(m) = members.iter().position(|m| overlaps(l.address, m.address)) {
                return Err(c.err(
                    format!("pool.members[{m}].address"),
                    format!(
                        "{} is the gateway's own listener[{i}] ({}): sessions would be relayed to the gateway itself",
                        members[m].address, l.address
                    ),
                ));
            }
            if let Some(st) =
                status.filter(|st| l.protocol == Protocol::Tcp && overlaps(l.address, *st))
            {
                return Err(c.err(
                    "metrics",
                    format!(
                        "the HTTP endpoint {st} is also listener[{i}] ({}); give it another port",
                        l.address
                    ),
                ));
            }
        }
        if rserpool.is_none()
            && members
                .iter()
                .all(|m| m.weight == 0 || m.cost == Cost::Unreachable || m.max_sessions == Some(0))
        {
            return Err(c.err(
                "pool.members",
                "no member can ever take a session (each has weight 0, cost \"unreachable\" or max-sessions 0)",
            ));
        }
        if probe.kind != ProbeKind::None && probe.timeout > probe.interval {
            warnings.push(format!(
                "health.timeout ({}) is longer than health.interval ({}): a member that does not answer holds up the next round of probes, so probes run at most every {}",
                crate::human(probe.timeout),
                crate::human(probe.interval),
                crate::human(probe.timeout),
            ));
        }

        let mut all_warnings = c.warnings.take();
        all_warnings.extend(warnings);
        let warnings = all_warnings;
        let mode = c.choice(
            "mode",
            raw.mode.as_deref().map(str::trim),
            Mode::Proxy,
            &[("proxy", Mode::Proxy), ("nat", Mode::Nat)],
        )?;
        let nat = check_nat(&c, &raw.nat)?;
        if mode == Mode::Nat {
            let ls: Vec<SocketAddr> = listeners.iter().map(|l| l.address).collect();
            let ms: Vec<SocketAddr> = members.iter().map(|m| m.address).collect();
            crate::nat::check_families(&ls, &ms, &nat.source_nat)
                .map_err(|(field, message)| c.err(field, message))?;
        }

        Ok(Config {
            mode,
            nat,
            listeners,
            members,
            core: CoreConfig {
                policy,
                traffic_metric,
                traffic_window,
                timers,
                health,
                limits,
                persistence,
            },
            probe,
            connect_timeout,
            status,
            http_limits,
            runtime,
            rserpool,
            warnings,
        })
    }
}
