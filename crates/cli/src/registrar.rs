//! `rserpool registrar`: the registrar daemon. Every setting is a flag (named after RSPLIB's
//! `rspregistrar` option where one exists) and a key of the TOML file given with `--config`;
//! flags win over the file, the file over the profile's defaults.

use crate::units::{human, positive_duration, DurationValue};
use anyhow::{bail, Context, Result};
use clap::Args;
use rserpool_registrar::driver::{run, DriverConfig};
use rserpool_registrar::enrp::io::EnrpDriverConfig;
use rserpool_registrar::enrp::EnrpConfig;
use rserpool_registrar::{AddressScope, Profile, RateLimit, RegistrarConfig};
use rserpool_transport::TransportChoice;
use rserpool_wire::RegistrarId;
use serde::Deserialize;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// Options of `rserpool registrar`. Durations have units ("5s", "250ms"; a bare number is read
/// in milliseconds, with a deprecation warning), rates are requests per second.
#[derive(Args, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct RegistrarArgs {
    /// TOML file with any of these options as keys (e.g. `asap = ["0.0.0.0:3863"]`,
    /// `max-bad-pe-reports = 3`); flags given on the command line take precedence.
    #[arg(long, short = 'c', value_name = "FILE")]
    #[serde(skip)]
    pub config: Option<PathBuf>,
    /// Defaults and behaviours: `rsplib` (talks to RSPLIB 3.x) or `rfc` (the RFC text).
    /// [default: rsplib]
    #[arg(long, value_parser = ["rsplib", "rfc"])]
    pub profile: Option<String>,
    /// Transport for ASAP: `auto` (SCTP where the kernel has it, else the TCP mapping), `sctp`
    /// or `tcp`. [default: auto]
    #[arg(long, value_parser = ["auto", "sctp", "tcp"])]
    pub transport: Option<String>,
    /// ASAP address to listen on (repeat for SCTP multi-homing; one port for all). The default
    /// serves this host only; `--asap 0.0.0.0:3863` serves every interface.
    /// [default: 127.0.0.1:3863]
    #[arg(long, value_name = "ADDR:PORT")]
    #[serde(default)]
    pub asap: Vec<SocketAddr>,
    /// Also accept pool users' handle resolutions over plain TCP (no frame header) here.
    #[arg(long, value_name = "ADDR:PORT")]
    #[serde(default)]
    pub plain_tcp: Vec<SocketAddr>,
    /// Server announces: `auto` (the profile's group: 239.0.0.50:3863 for rsplib,
    /// 224.0.1.185:3863 for rfc), `off`, or a group ADDR:PORT. They go out on the interfaces of
    /// the `--asap` addresses only (loopback for 127.0.0.1). [default: auto]
    #[arg(long, value_name = "auto|off|ADDR:PORT")]
    pub asap_announce: Option<String>,
    /// Interface (its IPv4 address) announces go out on. [default: the interfaces of the
    /// `--asap` addresses]
    #[arg(long, value_name = "IPV4")]
    pub announce_interface: Option<std::net::Ipv4Addr>,
    /// TTL of announces; 1 keeps them on the local link (RSPLIB uses 30). [default: 1]
    #[arg(long)]
    pub announce_ttl: Option<u32>,
    /// Announce cycle T6, e.g. "1s". [default: 1s]
    #[arg(long, value_name = "DURATION")]
    pub announce_interval: Option<DurationValue>,
    /// This registrar's 32-bit identifier, e.g. 0x1deea448. [default: random]
    #[arg(long, value_parser = parse_id)]
    pub identifier: Option<u32>,
    /// Mean interval between ENDPOINT_KEEP_ALIVEs to a PE, e.g. "5s". [default: 5s]
    #[arg(long, value_name = "DURATION")]
    pub endpoint_keep_alive_transmission_interval: Option<DurationValue>,
    /// Time a PE has to answer a keep-alive before it is removed, e.g. "5s". [default: 5s]
    #[arg(long, value_name = "DURATION")]
    pub endpoint_keep_alive_timeout_interval: Option<DurationValue>,
    /// Keep-alive intervals are drawn from interval × (1 ± jitter). [default: 0.25]
    #[arg(long)]
    pub keep_alive_jitter: Option<f64>,
    /// ENDPOINT_UNREACHABLE reports that remove a PE (MAX-BAD-PE-REPORT). [default: 3]
    #[arg(long)]
    pub max_bad_pe_reports: Option<u32>,
    /// PEs per handle resolution when the PU does not say. [default: 3]
    #[arg(long)]
    pub max_hres_items: Option<u32>,
    /// Most PEs one handle resolution returns, whatever the PU asks. [default: 128]
    #[arg(long)]
    pub max_hres_items_limit: Option<u32>,
    /// Per-client handle resolutions per second; 0 = unlimited. [default: 0]
    #[arg(long, value_name = "RATE")]
    pub max_hr_rate: Option<f64>,
    /// Per-client ENDPOINT_UNREACHABLE reports per second; 0 = unlimited. [default: 10]
    #[arg(long, value_name = "RATE")]
    pub max_eu_rate: Option<f64>,
    /// Handle resolutions per second of all associations from one source address together
    /// (bursts of twice as many); 0 = unlimited. [default: 2000]
    #[arg(long, value_name = "RATE")]
    pub max_hr_rate_per_address: Option<f64>,
    /// Per-association ASAP_REGISTRATIONs per second (new and re-registrations; bursts of
    /// twice as many); more are refused with cause 0xa. 0 = unlimited. [default: 100]
    #[arg(long, value_name = "RATE")]
    pub max_registration_rate: Option<f64>,
    /// Most associations from one source address at once; 0 = no per-address limit.
    /// [default: 256]
    #[arg(long, value_name = "N")]
    pub max_associations_per_address: Option<usize>,
    /// Most PEs registered over one association; 0 = no limit. [default: 1024]
    #[arg(long, value_name = "N")]
    pub max_pool_elements_per_association: Option<usize>,
    /// Most registrations from other associations waiting for one ownership probe of a live
    /// PE; more are refused with cause 0xa. [default: 4]
    #[arg(long, value_name = "N")]
    pub max_pending_claims: Option<usize>,
    /// How long the owner of a PE that another association claims has to answer the probe,
    /// e.g. "2s" (at most the keep-alive timeout; keep it below the PEs' registration timeout,
    /// RSPLIB's is 3 s). [default: 2s]
    #[arg(long, value_name = "DURATION")]
    pub ownership_probe_timeout: Option<String>,
    /// Keep-alive probes that ENDPOINT_UNREACHABLE reports may trigger for one PE per
    /// --unreachable-probe-interval (never more than one at a time). [default: 3]
    #[arg(long, value_name = "N")]
    pub max_unreachable_probes: Option<u32>,
    /// The window --max-unreachable-probes counts in, e.g. "30s", "1m". [default: 30s]
    #[arg(long, value_name = "DURATION")]
    pub unreachable_probe_interval: Option<String>,
    /// Narrowest address scope accepted from PEs: any, loopback, link-local, site-local,
    /// global. [default: loopback when every --asap address is a loopback address (PEs on this
    /// host), else site-local as in RSPLIB]
    #[arg(long, value_parser = ["any", "loopback", "link-local", "site-local", "global"])]
    pub min_address_scope: Option<String>,
    /// Most associations (PEs and PUs) at once. [default: 10000]
    #[arg(long)]
    pub max_associations: Option<usize>,
    /// Most pools. [default: 65536]
    #[arg(long)]
    pub max_pools: Option<usize>,
    /// Most PEs in one pool. [default: 1048576]
    #[arg(long)]
    pub max_pool_elements_per_pool: Option<usize>,
    /// Most PEs in all. [default: 4194304]
    #[arg(long)]
    pub max_pool_elements: Option<usize>,
    /// Largest ASAP message accepted or sent, in bytes (at most 65535). [default: 65535]
    #[arg(long, value_name = "BYTES")]
    pub max_message_size: Option<usize>,
    /// Most answers held for one association while its transport has no room; past it answers
    /// to that association are dropped and counted. [default: 1024]
    #[arg(long)]
    pub max_held_answers: Option<usize>,
    /// Enforce the registration life of own PEs. [default: off in rsplib, on in rfc]
    #[arg(long)]
    pub enforce_registration_life: Option<bool>,
    /// Serve the HTTP endpoint here: http://ADDR:PORT/metrics (OpenMetrics), /status (JSON),
    /// /healthz.
    #[arg(long, value_name = "ADDR:PORT")]
    pub metrics: Option<SocketAddr>,
    /// Most pools (and home registrars) listed in /status; the others are only counted, so
    /// that the document stays small for a huge handlespace. [default: 256]
    #[arg(long, value_name = "N")]
    pub status_max_pools: Option<usize>,
    /// Time a client of the HTTP endpoint has to send its request and read the answer, e.g.
    /// "5s". [default: 5s]
    #[arg(long, value_name = "DURATION")]
    pub metrics_timeout: Option<DurationValue>,
    /// HTTP endpoint connections served at once; further ones are closed. [default: 64]
    #[arg(long, value_name = "N")]
    pub metrics_max_connections: Option<usize>,
    /// Send Component Status Protocol reports to this monitor (UDP; port 2960 when left out;
    /// rspregistrar's `-cspserver`). Alone, reports go every 250 ms.
    #[arg(long, value_name = "ADDR[:PORT]", env = "CSP_SERVER")]
    pub csp_server: Option<String>,
    /// Time between CSP reports, e.g. "1s", or milliseconds as `-cspinterval` takes them.
    /// Alone, reports go to 127.0.0.1:2960. [default: off; 250ms with --csp-server]
    #[arg(long, value_name = "DURATION", env = "CSP_INTERVAL")]
    pub csp_interval: Option<DurationValue>,
    /// Seed for the registrar's random numbers (reproducible runs). [default: from the OS]
    #[arg(long)]
    pub seed: Option<u64>,
    /// Check the configuration, bind what would be bound (and let go), print a summary and
    /// exit.
    #[arg(long)]
    #[serde(skip)]
    pub check: bool,
    /// ENRP listening address (repeatable, one port; SCTP where the kernel has it, else the TCP
    /// mapping, as for ASAP). Without it the registrar runs on its own.
    #[arg(long, value_name = "ADDR:PORT")]
    #[serde(default)]
    pub enrp: Vec<SocketAddr>,
    /// A static ENRP peer (repeatable; port 9901 when left out; `-peer`). TOML key `peers`.
    #[arg(long = "peer", value_name = "ADDR[:PORT]")]
    #[serde(default, rename = "peers")]
    pub peers: Vec<String>,
    /// Multicast PRESENCE: `auto` (default: the profile's group, on the loopback interface when
    /// ENRP listens on loopback only), `off`, or a group ADDR:PORT (`-enrpannounce`).
    #[arg(long, value_name = "auto|off|ADDR:PORT")]
    pub enrp_announce: Option<String>,
    /// PRESENCE interval, e.g. "2.444s" or milliseconds (`-peerheartbeatcycle`; rsplib
    /// 2.444 s, rfc 30 s).
    #[arg(long, value_name = "DURATION")]
    pub peer_heartbeat_cycle: Option<String>,
    /// Silence after which a peer gets PRESENCE with R=1 (`-peermaxtimelastheard`; rsplib 5 s,
    /// rfc 61 s).
    #[arg(long, value_name = "DURATION")]
    pub peer_max_time_last_heard: Option<String>,
    /// No answer within this and the peer is dead (`-peermaxtimenoresponse`; 5 s).
    #[arg(long, value_name = "DURATION")]
    pub peer_max_time_no_response: Option<String>,
    /// How long start-up waits for a mentor (`-mentordiscoverytimeout`; 5 s).
    #[arg(long, value_name = "DURATION")]
    pub mentor_discovery_timeout: Option<String>,
    /// A takeover not acknowledged by then is abandoned (`-takeoverexpiryinterval`; 5 s).
    #[arg(long, value_name = "DURATION")]
    pub takeover_expiry_interval: Option<String>,
    /// Most PEs per HANDLE_TABLE_RESPONSE (`-maxelementsperhtrequest`; 128).
    #[arg(long)]
    pub max_elements_per_ht_request: Option<usize>,
    /// Largest HANDLE_TABLE_RESPONSE in bytes (RSPLIB: 1400).
    #[arg(long, value_name = "BYTES")]
    pub max_ht_response_size: Option<usize>,
    /// Most ENRP peers (64).
    #[arg(long)]
    pub max_peers: Option<usize>,
    /// Most PEs learned from one peer (1 048 576).
    #[arg(long)]
    pub max_pool_elements_per_peer: Option<usize>,
    /// Send and honour takeover suggestions (T flag; `-supporttakeoversuggestion`).
    #[arg(long)]
    pub support_takeover_suggestion: Option<bool>,
    /// TLS on the TCP mapping (in the file: the `[tls]` table, keys `cert`, `key`, `ca`,
    /// `handshake-timeout`).
    #[command(flatten)]
    #[serde(skip)]
    pub tls: crate::tls::TlsArgs,
    /// The registrar's TLS identity rules (in the file: `[tls]` keys `require-client-cert`,
    /// `unauthenticated-resolve`, `enrp-peers`, and `[[tls.register]]` tables).
    #[command(flatten)]
    #[serde(skip)]
    pub tls_rules: crate::tls::RegistrarTlsArgs,
    /// The `[tls]` table of the `--config` file.
    #[arg(skip)]
    #[serde(rename = "tls", default)]
    pub tls_file: Option<crate::tls::TlsFile>,
}

/// `ADDR[:PORT]` with ENRP's port 9901 by default.
fn peer_address(v: &str) -> Result<SocketAddr> {
    if let Ok(a) = v.parse::<SocketAddr>() {
        return Ok(a);
    }
    let ip: std::net::IpAddr = v
        .trim_start_matches('[')
        .trim_end_matches(']')
        .parse()
        .map_err(|e| anyhow::anyhow!("peer: {v:?} is not ADDR[:PORT]: {e}"))?;
    Ok(SocketAddr::new(ip, 9901))
}

fn parse_id(s: &str) -> Result<u32, String> {
    let (digits, radix) = match s.strip_prefix("0x").or_else(|| s.strip_prefix('$')) {
        Some(hex) => (hex, 16),
        None => (s, 10),
    };
    u32::from_str_radix(digits, radix).map_err(|e| format!("identifier {s:?}: {e}"))
}

macro_rules! merge {
    ($flags:ident, $file:ident, $($field:ident),*) => {
        $( if $flags.$field.is_none() { $flags.$field = $file.$field.take(); } )*
    };
}

impl RegistrarArgs {
    /// Fills options not given as flags from the `--config` file.
    fn merged(mut self) -> Result<Self> {
        let Some(path) = self.config.clone() else {
            return Ok(self);
        };
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("reading the configuration {}", path.display()))?;
        let mut file: RegistrarArgs = toml::from_str(&text)
            .with_context(|| format!("in the configuration {}", path.display()))?;
        merge!(
            self,
            file,
            profile,
            transport,
            asap_announce,
            announce_interface,
            announce_ttl,
            announce_interval,
            identifier,
            endpoint_keep_alive_transmission_interval,
            endpoint_keep_alive_timeout_interval,
            keep_alive_jitter,
            max_bad_pe_reports,
            max_hres_items,
            max_hres_items_limit,
            max_hr_rate,
            max_eu_rate,
            max_registration_rate,
            max_hr_rate_per_address,
            max_associations_per_address,
            max_pool_elements_per_association,
            max_pending_claims,
            ownership_probe_timeout,
            max_unreachable_probes,
            unreachable_probe_interval,
            min_address_scope,
            max_associations,
            max_pools,
            max_pool_elements_per_pool,
            max_pool_elements,
            max_message_size,
            max_held_answers,
            enforce_registration_life,
            metrics,
            status_max_pools,
            metrics_timeout,
            metrics_max_connections,
            csp_server,
            csp_interval,
            seed,
            enrp_announce,
            peer_heartbeat_cycle,
            peer_max_time_last_heard,
            peer_max_time_no_response,
            mentor_discovery_timeout,
            takeover_expiry_interval,
            max_elements_per_ht_request,
            max_ht_response_size,
            max_peers,
            max_pool_elements_per_peer,
            support_takeover_suggestion
        );
        if self.enrp.is_empty() {
            self.enrp = file.enrp;
        }
        if self.peers.is_empty() {
            self.peers = file.peers;
        }
        if self.asap.is_empty() {
            self.asap = file.asap;
        }
        if self.tls_file.is_none() {
            self.tls_file = file.tls_file.take();
        }
        if self.plain_tcp.is_empty() {
            self.plain_tcp = file.plain_tcp;
        }
        Ok(self)
    }

    /// The driver configuration these options describe; errors name the option.
    pub fn into_config(self) -> Result<DriverConfig> {
        let mut a = self.merged()?;
        let tls = crate::tls::registrar_tls(&a.tls, &a.tls_rules, a.tls_file.take())?;
        let profile = match a.profile.as_deref().unwrap_or("rsplib") {
            "rsplib" => Profile::Rsplib,
            "rfc" => Profile::Rfc,
            other => bail!("profile: {other:?} is neither rsplib nor rfc"),
        };
        let mut core = RegistrarConfig::new(profile);
        if let Some(id) = a.identifier {
            core.registrar_id = RegistrarId(id);
        }
        let ms = |name: &str, v: DurationValue| -> Result<Duration> {
            if let Some(w) = v.deprecation(name) {
                tracing::warn!("{w}");
            }
            if v.duration < Duration::from_millis(1) {
                bail!("{name}: must be at least 1ms");
            }
            Ok(v.duration)
        };
        if let Some(v) = a.endpoint_keep_alive_transmission_interval {
            core.keep_alive_interval = ms("endpoint-keep-alive-transmission-interval", v)?;
        }
        if let Some(v) = a.endpoint_keep_alive_timeout_interval {
            core.keep_alive_timeout = ms("endpoint-keep-alive-timeout-interval", v)?;
        }
        if let Some(j) = a.keep_alive_jitter {
            if !(0.0..1.0).contains(&j) {
                bail!("keep-alive-jitter: {j} is not in [0, 1)");
            }
            core.keep_alive_jitter = j;
        }
        if let Some(n) = a.max_bad_pe_reports {
            if n == 0 {
                bail!("max-bad-pe-reports: must be at least 1");
            }
            core.max_bad_pe_reports = n;
        }
        if let Some(n) = a.max_hres_items {
            if n == 0 {
                bail!("max-hres-items: must be at least 1");
            }
            core.default_handle_resolution_items = n;
        }
        if let Some(n) = a.max_hres_items_limit {
            if n == 0 {
                bail!("max-hres-items-limit: must be at least 1");
            }
            core.max_handle_resolution_items = n;
        }
        if core.default_handle_resolution_items > core.max_handle_resolution_items {
            bail!(
                "max-hres-items: {} is above max-hres-items-limit ({}), the most one handle resolution returns; lower it or raise the limit",
                core.default_handle_resolution_items,
                core.max_handle_resolution_items
            );
        }
        let rate = |name: &str, r: f64| -> Result<Option<RateLimit>> {
            if !r.is_finite() || r < 0.0 {
                bail!("{name}: {r} is not a rate (requests per second, 0 = unlimited)");
            }
            Ok((r > 0.0).then_some(RateLimit {
                rate: r,
                burst: (2.0 * r).max(1.0),
            }))
        };
        if let Some(r) = a.max_hr_rate {
            core.handle_resolution_rate = rate("max-hr-rate", r)?;
        }
        if let Some(r) = a.max_eu_rate {
            core.endpoint_unreachable_rate = rate("max-eu-rate", r)?;
        }
        if let Some(r) = a.max_hr_rate_per_address {
            core.handle_resolution_rate_per_address = rate("max-hr-rate-per-address", r)?;
        }
        if let Some(r) = a.max_registration_rate {
            core.registration_rate = rate("max-registration-rate", r)?;
        }
        if let Some(n) = a.max_associations_per_address {
            core.max_associations_per_address = n;
        }
        if let Some(n) = a.max_pool_elements_per_association {
            core.max_pool_elements_per_association = n;
        }
        if let Some(n) = a.max_pending_claims {
            if n == 0 {
                bail!("max-pending-claims: must be at least 1");
            }
            core.max_pending_claims = n;
        }
        if let Some(s) = a.ownership_probe_timeout.as_deref() {
            core.ownership_probe_timeout = positive_duration("ownership-probe-timeout", s)?;
        }
        if let Some(n) = a.max_unreachable_probes {
            core.max_unreachable_probes = n;
        }
        if let Some(s) = a.unreachable_probe_interval.as_deref() {
            core.unreachable_probe_interval = positive_duration("unreachable-probe-interval", s)?;
        }
        if let Some(s) = a.min_address_scope.as_deref() {
            core.min_address_scope = match s {
                "any" => AddressScope::Unspecified,
                "loopback" => AddressScope::Loopback,
                "link-local" => AddressScope::LinkLocal,
                "site-local" => AddressScope::SiteLocal,
                "global" => AddressScope::Global,
                other => bail!("min-address-scope: {other:?} is not a scope"),
            };
        }
        if let Some(n) = a.max_associations {
            core.max_associations = n;
        }
        if let Some(n) = a.max_pools {
            core.handlespace.max_pools = n;
        }
        if let Some(n) = a.max_pool_elements_per_pool {
            core.handlespace.max_pool_elements_per_pool = n;
        }
        if let Some(n) = a.max_pool_elements {
            core.handlespace.max_pool_elements = n;
        }
        if let Some(n) = a.max_message_size {
            if !(64..=65_535).contains(&n) {
                bail!("max-message-size: {n} is not in 64..=65535");
            }
            core.codec.max_message_size = n;
        }
        if let Some(e) = a.enforce_registration_life {
            core.enforce_registration_life = e;
        }
        core.seed = a.seed;
        match a.asap_announce.as_deref().unwrap_or("auto") {
            "off" => core.announce = None,
            "auto" => {}
            addr => {
                let group: SocketAddr = addr
                    .parse()
                    .map_err(|e| anyhow::anyhow!("asap-announce: {addr:?}: {e}"))?;
                if !group.ip().is_multicast() {
                    bail!("asap-announce: {} is not a multicast address", group.ip());
                }
                if let Some(an) = core.announce.as_mut() {
                    an.group = group;
                }
            }
        }
        if let (Some(ms_), Some(an)) = (a.announce_interval, core.announce.as_mut()) {
            an.interval = ms("announce-interval", ms_)?;
        }
        let mut config = DriverConfig::new(core);
        config.transport = match a.transport.as_deref().unwrap_or("auto") {
            "auto" => TransportChoice::Auto,
            "sctp" => TransportChoice::Sctp,
            "tcp" => TransportChoice::Tcp,
            other => bail!("transport: {other:?} is not auto, sctp or tcp"),
        };
        if !a.asap.is_empty() {
            if a.asap.iter().any(|s| s.port() != a.asap[0].port()) {
                bail!("asap: all addresses must share one port (got {:?})", a.asap);
            }
            config.asap_listen = a.asap;
        }
        if a.min_address_scope.is_none() && config.asap_listen.iter().all(|l| l.ip().is_loopback())
        {
            // A registrar only this host can reach serves PEs of this host: their addresses are
            // loopback addresses, which RSPLIB's site-local default would refuse.
            config.core.min_address_scope = AddressScope::Loopback;
        }
        config.plain_tcp_listen = a.plain_tcp;
        if let Some((settings, access)) = tls {
            if config.transport == TransportChoice::Sctp {
                bail!(
                    "--transport sctp: {}",
                    rserpool_transport::TlsError::OverSctp
                );
            }
            config.transport = TransportChoice::Tcp;
            config.endpoint.tls = Some(settings);
            config.core.access = Some(access);
        }
        config.announce_interface = a.announce_interface;
        if let Some(ttl) = a.announce_ttl {
            if !(1..=255).contains(&ttl) {
                bail!("announce-ttl: {ttl} is not in 1..=255");
            }
            config.announce_ttl = ttl;
        }
        config.metrics_listen = a.metrics;
        if let Some(n) = a.status_max_pools {
            config.status_max_pools = n;
        }
        config.http_limits = crate::units::http_limits(
            a.metrics_timeout.map(|d| d.duration),
            a.metrics_max_connections,
        )?;
        if let Some(n) = a.max_held_answers {
            if n == 0 {
                bail!("max-held-answers: must be at least 1");
            }
            config.max_held_answers = n;
        }
        if !a.enrp.is_empty() {
            if a.enrp.iter().any(|s| s.port() != a.enrp[0].port()) {
                bail!("enrp: all addresses must share one port (got {:?})", a.enrp);
            }
            let mut e = EnrpConfig::new(profile);
            e.seed = a.seed;
            e.static_peers = a
                .peers
                .iter()
                .map(|p| peer_address(p).map(|a| vec![a]))
                .collect::<Result<_>>()?;
            let set = |name: &str, v: &Option<String>, slot: &mut Duration| -> Result<()> {
                if let Some(v) = v {
                    *slot = positive_duration(name, v)?;
                }
                Ok(())
            };
            set(
                "peer-heartbeat-cycle",
                &a.peer_heartbeat_cycle,
                &mut e.peer_heartbeat_cycle,
            )?;
            set(
                "peer-max-time-last-heard",
                &a.peer_max_time_last_heard,
                &mut e.max_time_last_heard,
            )?;
            set(
                "peer-max-time-no-response",
                &a.peer_max_time_no_response,
                &mut e.max_time_no_response,
            )?;
            set(
                "mentor-discovery-timeout",
                &a.mentor_discovery_timeout,
                &mut e.mentor_discovery_timeout,
            )?;
            set(
                "takeover-expiry-interval",
                &a.takeover_expiry_interval,
                &mut e.takeover_expiry,
            )?;
            if let Some(n) = a.max_elements_per_ht_request {
                if !(1..=1024).contains(&n) {
                    bail!("max-elements-per-ht-request: {n} is not in 1..=1024");
                }
                e.max_elements_per_handle_table_response = n;
            }
            if let Some(n) = a.max_ht_response_size {
                if !(256..=65_535).contains(&n) {
                    bail!("max-ht-response-size: {n} is not in 256..=65535");
                }
                e.max_handle_table_response_bytes = n;
            }
            if let Some(n) = a.max_peers {
                e.max_peers = n;
            }
            if let Some(n) = a.max_pool_elements_per_peer {
                e.max_pool_elements_per_peer = n;
            }
            if let Some(t) = a.support_takeover_suggestion {
                e.takeover_suggestion = t;
            }
            let loopback_only = a.enrp.iter().all(|s| s.ip().is_loopback());
            let (announce, interface) = match a.enrp_announce.as_deref().unwrap_or("auto") {
                "off" | "none" => (None, None),
                "auto" => (
                    Some(EnrpConfig::multicast_group(profile)),
                    // Follows the listening address: loopback-only stays on loopback.
                    loopback_only.then_some(std::net::Ipv4Addr::LOCALHOST),
                ),
                addr => {
                    let group: SocketAddr = addr
                        .parse()
                        .map_err(|e| anyhow::anyhow!("enrp-announce: {addr:?}: {e}"))?;
                    if !group.ip().is_multicast() {
                        bail!("enrp-announce: {} is not a multicast address", group.ip());
                    }
                    (
                        Some(group),
                        loopback_only.then_some(std::net::Ipv4Addr::LOCALHOST),
                    )
                }
            };
            config.enrp = Some(EnrpDriverConfig {
                core: e,
                listen: a.enrp,
                announce,
                announce_interface: interface.or(a.announce_interface),
                announce_ttl: config.announce_ttl,
            });
        } else if !a.peers.is_empty() {
            bail!("peer: static peers need an ENRP endpoint (--enrp ADDR:PORT)");
        }
        Ok(config)
    }
}

/// What a configuration does, in words (`--check`).
fn summary(c: &DriverConfig) -> String {
    let list = |a: &[SocketAddr]| {
        a.iter()
            .map(|a| a.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    };
    let beyond = c.asap_listen.iter().any(|a| !a.ip().is_loopback());
    let announces = match &c.core.announce {
        None => "off".to_string(),
        Some(an) => format!(
            "to {} every {} with TTL {}, on {}",
            an.group,
            human(an.interval),
            c.announce_ttl,
            match c.announce_interface {
                Some(i) => format!("interface {i}"),
                None => {
                    let on = rserpool_transport::multicast::announce_interfaces(
                        &c.asap_listen,
                        &rserpool_transport::multicast::ipv4_multicast_interfaces(),
                    );
                    if on.is_empty() {
                        "no interface (no IPv4 ASAP address)".to_string()
                    } else {
                        format!(
                            "interface {} (those of the ASAP addresses)",
                            on.iter()
                                .map(|i| i.to_string())
                                .collect::<Vec<_>>()
                                .join(", ")
                        )
                    }
                }
            }
        ),
    };
    format!(
        "profile: {}\nASAP: {} over {} ({})\nplain TCP: {}\nserver announces: {announces}\nminimum address scope of PEs: {}\nkeep-alives: every {} (± {:.0} %), answer within {}, {} unreachable reports remove a PE\nhandle resolution: {} PEs by default, at most {}\nlimits: {} associations, {} pools, {} PEs per pool, {} PEs, messages up to {} bytes\nmetrics: {}",
        c.core.profile.name(),
        list(&c.asap_listen),
        match c.transport {
            TransportChoice::Auto => "SCTP where the kernel has it, else the TCP mapping",
            TransportChoice::Sctp => "SCTP",
            TransportChoice::Tcp => "the TCP mapping",
        },
        if beyond { "reachable from other hosts" } else { "this host only" },
        if c.plain_tcp_listen.is_empty() { "off".to_string() } else { list(&c.plain_tcp_listen) },
        c.core.min_address_scope.name(),
        human(c.core.keep_alive_interval),
        c.core.keep_alive_jitter * 100.0,
        human(c.core.keep_alive_timeout),
        c.core.max_bad_pe_reports,
        c.core.default_handle_resolution_items,
        c.core.max_handle_resolution_items,
        c.core.max_associations,
        c.core.handlespace.max_pools,
        c.core.handlespace.max_pool_elements_per_pool,
        c.core.handlespace.max_pool_elements,
        c.core.codec.max_message_size,
        c.metrics_listen
            .map(|m| format!("http://{m}/metrics"))
            .unwrap_or_else(|| "off".to_string()),
    )
}

/// Binds what `config` would bind, then lets go: a port in use or an address not of this host
/// is found by `--check`, not at start-up.
async fn try_bind(config: &DriverConfig) -> Result<()> {
    let mut ep = config.endpoint.clone();
    ep.transport = config.transport;
    ep.local_addrs = config.asap_listen.clone();
    ep.accept = true;
    ep.tcp.plain_asap_listen = config.plain_tcp_listen.clone();
    let endpoint = rserpool_transport::Endpoint::bind(ep)
        .await
        .with_context(|| format!("ASAP on {:?}", config.asap_listen))?;
    drop(endpoint);
    if let Some(m) = config.metrics_listen {
        rserpool_observe::server::bind(m).await?;
    }
    Ok(())
}

/// Addresses as a comma-separated list.
fn join(addrs: &[SocketAddr]) -> String {
    addrs
        .iter()
        .map(|a| a.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Runs the registrar until SIGINT or SIGTERM.
pub fn run_registrar(args: RegistrarArgs) -> Result<()> {
    let check = args.check;
    let mut args = args.merged()?;
    args.config = None;
    let csp = crate::csp::config(args.csp_server.as_deref(), args.csp_interval)?;
    let config = args.into_config()?;
    if check {
        outln!("{}", summary(&config));
        outln!(
            "CSP reports: {}",
            csp.map_or_else(|| "off".to_string(), |c| c.to_string())
        );
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        rt.block_on(try_bind(&config))
            .context("the configuration is valid, but it cannot be served here")?;
        outln!("configuration ok; every address can be bound");
        return Ok(());
    }
    let tls = if config.endpoint.tls.is_some() {
        " with TLS"
    } else {
        ""
    };
    // One thread: the registrar core is one state machine, and the transport's reader and the
    // core hand messages to each other without crossing threads.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let (started_tx, started_rx) = tokio::sync::oneshot::channel();
        let serve = run(config, started_tx, crate::shutdown_signal());
        tokio::pin!(serve);
        let mut reporter = None;
        tokio::select! {
            r = &mut serve => return r.context("registrar"),
            started = started_rx => {
                if let Ok(s) = started {
                    if let Some(c) = csp {
                        let (id, metrics) = (s.registrar_id, s.metrics.clone());
                        let protocol = crate::csp::protocol(s.transport);
                        reporter = Some(crate::csp::Reporter::start(c, crate::csp::location(&s.asap_addrs), move || {
                            let m = metrics.lock().map(|m| m.clone()).unwrap_or_default();
                            crate::csp::registrar_snapshot(id, &m, protocol)
                        }));
                    }
                    outln!(
                        "registrar {} serving ASAP over {}{tls} on {} ({}; {}){}{}",
                        s.registrar_id,
                        s.transport,
                        join(&s.asap_addrs),
                        if s.asap_addrs.iter().all(|a| a.ip().is_loopback()) {
                            "this host only"
                        } else {
                            "reachable from other hosts"
                        },
                        if s.announces.is_empty() {
                            "no server announces".to_string()
                        } else {
                            format!(
                                "server announces to {} on {}, TTL {}",
                                s.announces[0].group,
                                s.announces
                                    .iter()
                                    .map(|a| a.interface.to_string())
                                    .collect::<Vec<_>>()
                                    .join(", "),
                                s.announces[0].ttl
                            )
                        },
                        if s.plain_tcp_addrs.is_empty() { String::new() } else { format!(", plain TCP on {}", join(&s.plain_tcp_addrs)) },
                        s.metrics_addr.map(|m| format!(", metrics at http://{m}/metrics")).unwrap_or_default()
                    );
                    if !s.enrp_addrs.is_empty() {
                        outln!("registrar {} serving ENRP on {}", s.registrar_id, join(&s.enrp_addrs));
                    }
                }
            }
        }
        let r = serve.await.context("registrar");
        if let Some(reporter) = reporter {
            reporter.finish().await;
        }
        r
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: RegistrarArgs,
    }

    fn parse(argv: &[&str]) -> RegistrarArgs {
        Cli::try_parse_from(std::iter::once("registrar").chain(argv.iter().copied()))
            .expect("valid flags")
            .args
    }

    fn with_file(toml: &str, argv: &[&str]) -> Result<DriverConfig> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("registrar.toml");
        std::fs::write(&path, toml).unwrap();
        let mut args = vec!["--config", path.to_str().unwrap()];
        args.extend_from_slice(argv);
        parse(&args).into_config()
    }

    #[test]
    fn profile_defaults() {
        let c = parse(&[]).into_config().unwrap();
        assert_eq!(c.core.profile, Profile::Rsplib);
        assert_eq!(c.core.keep_alive_interval, Duration::from_secs(5));
        assert_eq!(
            c.asap_listen,
            vec!["127.0.0.1:3863".parse::<SocketAddr>().unwrap()],
            "nothing beyond the host unless asked"
        );
        assert_eq!(c.announce_ttl, 1);
        assert_eq!(
            c.core.min_address_scope,
            AddressScope::Loopback,
            "a registrar on loopback accepts the PEs of its host"
        );
        let c = parse(&["--asap", "0.0.0.0:3863"]).into_config().unwrap();
        assert_eq!(
            c.core.min_address_scope,
            AddressScope::SiteLocal,
            "RSPLIB's default"
        );
        let c = parse(&["--min-address-scope", "global"])
            .into_config()
            .unwrap();
        assert_eq!(c.core.min_address_scope, AddressScope::Global, "as asked");
        assert_eq!(
            c.announce_interface, None,
            "the listening addresses' interfaces"
        );
        let c = parse(&["--profile", "rfc"]).into_config().unwrap();
        assert_eq!(
            c.core.codec.registration_life_unit,
            rserpool_wire::LifeUnit::Seconds
        );
        assert!(c.core.enforce_registration_life);
        assert!(c.core.probe_on_unreachable);
    }

    #[test]
    fn file_values_apply_and_flags_win() {
        let c = with_file(
            "asap = [\"127.0.0.1:4000\"]\nmax-bad-pe-reports = 7\nidentifier = 305419896\nmax-hr-rate = 50.0\nmin-address-scope = \"loopback\"\nasap-announce = \"off\"\nmax-held-answers = 64\n",
            &["--max-bad-pe-reports", "9", "--endpoint-keep-alive-timeout-interval", "1500ms"],
        )
        .unwrap();
        assert_eq!(
            c.asap_listen,
            vec!["127.0.0.1:4000".parse::<SocketAddr>().unwrap()]
        );
        assert_eq!(c.core.max_bad_pe_reports, 9, "the flag wins");
        assert_eq!(c.core.registrar_id, RegistrarId(0x1234_5678));
        assert_eq!(c.core.keep_alive_timeout, Duration::from_millis(1500));
        assert_eq!(c.core.handle_resolution_rate.map(|r| r.rate), Some(50.0));
        assert_eq!(c.core.min_address_scope, AddressScope::Loopback);
        assert!(c.core.announce.is_none());
        assert_eq!(c.max_held_answers, 64);
    }

    #[test]
    fn csp_reporting_from_flags_and_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("registrar.toml");
        std::fs::write(
            &path,
            "csp-server = \"127.0.0.1:4000\"\ncsp-interval = \"2s\"\n",
        )
        .unwrap();
        let a = parse(&["--config", path.to_str().unwrap()])
            .merged()
            .unwrap();
        let c = crate::csp::config(a.csp_server.as_deref(), a.csp_interval)
            .unwrap()
            .unwrap();
        assert_eq!(c.server, "127.0.0.1:4000".parse::<SocketAddr>().unwrap());
        assert_eq!(c.interval, Duration::from_secs(2));
        let a = parse(&["--config", path.to_str().unwrap(), "--csp-interval", "500"])
            .merged()
            .unwrap();
        let c = crate::csp::config(a.csp_server.as_deref(), a.csp_interval)
            .unwrap()
            .unwrap();
        assert_eq!(
            c.interval,
            Duration::from_millis(500),
            "flags win; bare numbers are ms"
        );
    }

    #[test]
    fn security_limits_from_file_and_flags() {
        let c = parse(&[]).into_config().unwrap();
        assert_eq!(c.core.registration_rate.map(|r| r.rate), Some(100.0));
        assert_eq!(
            c.core.handle_resolution_rate_per_address.map(|r| r.rate),
            Some(2000.0)
        );
        assert_eq!(c.core.max_associations_per_address, 256);
        assert_eq!(c.core.unreachable_probe_interval, Duration::from_secs(30));
        let c = with_file(
            "max-registration-rate = 5.0\nmax-hr-rate-per-address = 0\nmax-associations-per-address = 8\nmax-pool-elements-per-association = 16\nmax-pending-claims = 2\nmax-unreachable-probes = 1\nownership-probe-timeout = \"1500ms\"\nunreachable-probe-interval = \"1m 30s\"\n",
            &["--max-pending-claims", "3"],
        )
        .unwrap();
        assert_eq!(
            c.core.registration_rate.map(|r| (r.rate, r.burst)),
            Some((5.0, 10.0))
        );
        assert_eq!(c.core.max_associations_per_address, 8);
        assert!(c.core.handle_resolution_rate_per_address.is_none());
        assert_eq!(c.core.max_pool_elements_per_association, 16);
        assert_eq!(c.core.max_pending_claims, 3, "the flag wins");
        assert_eq!(c.core.max_unreachable_probes, 1);
        assert_eq!(c.core.ownership_probe_timeout, Duration::from_millis(1500));
        assert_eq!(c.core.unreachable_probe_interval, Duration::from_secs(90));
        let c = parse(&["--max-registration-rate", "0"])
            .into_config()
            .unwrap();
        assert!(c.core.registration_rate.is_none(), "0 = unlimited");
        let err = |r: Result<DriverConfig>| format!("{:#}", r.unwrap_err());
        assert!(
            err(with_file("unreachable-probe-interval = \"soon\"\n", &[]))
                .contains("unreachable-probe-interval")
        );
        assert!(
            err(parse(&["--max-pending-claims", "0"]).into_config()).contains("max-pending-claims")
        );
        assert!(err(parse(&["--max-registration-rate=-1"]).into_config())
            .contains("max-registration-rate"));
    }

    #[test]
    fn bad_values_are_refused_with_the_option_named() {
        let err = |r: Result<DriverConfig>| format!("{:#}", r.unwrap_err());
        assert!(err(with_file("profile = \"bsd\"\n", &[])).contains("profile"));
        assert!(err(with_file("max-pool = 3\n", &[])).contains("unknown field `max-pool`"));
        assert!(err(with_file("max-bad-pe-reports = -1\n", &[])).contains("max-bad-pe-reports"));
        assert!(err(parse(&["--max-eu-rate=-3"]).into_config()).contains("max-eu-rate"));
        assert!(
            err(parse(&["--asap-announce", "10.0.0.1:3863"]).into_config())
                .contains("not a multicast address")
        );
        assert!(
            err(parse(&["--asap", "127.0.0.1:1", "--asap", "127.0.0.2:2"]).into_config())
                .contains("share one port")
        );
        assert!(
            err(parse(&["--max-message-size", "70000"]).into_config()).contains("max-message-size")
        );
        assert!(err(parse(&["--max-held-answers", "0"]).into_config()).contains("max-held-answers"));
        assert!(
            err(parse(&["--config", "/nonexistent/registrar.toml"]).into_config())
                .contains("/nonexistent/registrar.toml")
        );
        assert!(Cli::try_parse_from(["registrar", "--identifier", "0xZZ"]).is_err());
        assert!(err(parse(&["--max-hres-items", "200"]).into_config())
            .contains("max-hres-items: 200 is above max-hres-items-limit (128)"));
        assert!(err(parse(&["--announce-interval", "0s"]).into_config())
            .contains("announce-interval: must be at least 1ms"));
        assert!(Cli::try_parse_from(["registrar", "--announce-interval", "soon"]).is_err());
        assert!(err(with_file(
            "endpoint-keep-alive-timeout-interval = \"5 parsecs\"\n",
            &[]
        ))
        .contains("endpoint-keep-alive-timeout-interval"));
    }

    #[test]
    fn durations_have_units_and_bare_milliseconds_still_work() {
        let c = with_file(
            "endpoint-keep-alive-transmission-interval = \"2s\"\nendpoint-keep-alive-timeout-interval = 1500\nannounce-interval = \"250ms\"\n",
            &[],
        )
        .unwrap();
        assert_eq!(c.core.keep_alive_interval, Duration::from_secs(2));
        assert_eq!(c.core.keep_alive_timeout, Duration::from_millis(1500));
        assert_eq!(
            c.core.announce.as_ref().unwrap().interval,
            Duration::from_millis(250)
        );
        let c = parse(&["--endpoint-keep-alive-transmission-interval", "1m"])
            .into_config()
            .unwrap();
        assert_eq!(c.core.keep_alive_interval, Duration::from_secs(60));
    }

    #[test]
    fn enrp_settings_from_file_and_flags() {
        let c = parse(&[]).into_config().unwrap();
        assert!(c.enrp.is_none(), "no ENRP without --enrp");
        let c = with_file(
            "enrp = [\"127.0.0.1:9901\"]\npeers = [\"127.0.0.1:9911\", \"10.0.0.2\"]\npeer-heartbeat-cycle = \"2.444s\"\npeer-max-time-last-heard = \"7s\"\nmax-elements-per-ht-request = 64\nsupport-takeover-suggestion = true\n",
            &["--peer-max-time-no-response", "1500"],
        )
        .unwrap();
        let e = c.enrp.expect("ENRP on");
        assert_eq!(
            e.listen,
            vec!["127.0.0.1:9901".parse::<SocketAddr>().unwrap()]
        );
        assert_eq!(
            e.core.static_peers,
            vec![
                vec!["127.0.0.1:9911".parse::<SocketAddr>().unwrap()],
                vec!["10.0.0.2:9901".parse::<SocketAddr>().unwrap()]
            ]
        );
        assert_eq!(e.core.peer_heartbeat_cycle, Duration::from_millis(2444));
        assert_eq!(e.core.max_time_last_heard, Duration::from_secs(7));
        assert_eq!(e.core.max_time_no_response, Duration::from_millis(1500));
        assert_eq!(e.core.max_elements_per_handle_table_response, 64);
        assert!(e.core.takeover_suggestion);
        // Bound to loopback: the multicast PRESENCE stays on the loopback interface.
        assert_eq!(e.announce, Some("239.0.0.51:9901".parse().unwrap()));
        assert_eq!(e.announce_interface, Some(std::net::Ipv4Addr::LOCALHOST));
        let c = parse(&[
            "--enrp",
            "0.0.0.0:9901",
            "--profile",
            "rfc",
            "--enrp-announce",
            "off",
        ])
        .into_config()
        .unwrap();
        let e = c.enrp.unwrap();
        assert_eq!(e.announce, None);
        assert_eq!(e.core.peer_heartbeat_cycle, Duration::from_secs(30));
        assert_eq!(e.core.max_time_last_heard, Duration::from_secs(61));
        let err = |r: Result<DriverConfig>| format!("{:#}", r.unwrap_err());
        assert!(err(parse(&["--peer", "127.0.0.1"]).into_config()).contains("--enrp"));
        assert!(err(
            parse(&["--enrp", "127.0.0.1:1", "--peer-heartbeat-cycle", "soon"]).into_config()
        )
        .contains("peer-heartbeat-cycle"));
        assert!(
            err(parse(&["--enrp", "127.0.0.1:1", "--peer", "nowhere"]).into_config())
                .contains("peer")
        );
        assert!(err(parse(&[
            "--enrp",
            "127.0.0.1:1",
            "--max-elements-per-ht-request",
            "0"
        ])
        .into_config())
        .contains("max-elements-per-ht-request"));
    }

    #[test]
    fn tls_table_and_flags() {
        let toml = "[tls]\ncert = \"/etc/r.pem\"\nkey = \"/etc/r.key\"\nca = \"/etc/ca.pem\"\nhandshake-timeout = \"2s 500ms\"\nunauthenticated-resolve = false\nenrp-peers = [\"dns:registrar-*.example.net\"]\n\n[[tls.register]]\nidentity = \"dns:*.echo.example.net\"\npools = [\"EchoPool\", \"Echo*\"]\n";
        let c = with_file(toml, &[]).unwrap();
        let tls = c.endpoint.tls.as_ref().expect("TLS on");
        assert_eq!(tls.ca, PathBuf::from("/etc/ca.pem"));
        assert_eq!(tls.handshake_timeout, Duration::from_millis(2500));
        assert!(!tls.require_client_certificate);
        assert_eq!(
            c.transport,
            TransportChoice::Tcp,
            "TLS runs on the TCP mapping"
        );
        let access = c.core.access.as_ref().expect("identity rules");
        assert!(!access.unauthenticated_resolution);
        assert_eq!(access.registration.len(), 1);
        assert_eq!(access.registration[0].pools.len(), 2);
        assert_eq!(
            access.enrp_peers[0].to_string(),
            "dns:registrar-*.example.net"
        );
        // Flags win: a rule list given as flags replaces the file's.
        let c = with_file(
            toml,
            &[
                "--tls-register",
                "cn:calc-*=CalcAppPool",
                "--tls-register",
                "cn:echo-*=EchoPool",
                "--tls-unauthenticated-resolve",
                "true",
                "--tls-require-client-cert",
                "true",
                "--tls-handshake-timeout",
                "1s",
            ],
        )
        .unwrap();
        let access = c.core.access.unwrap();
        assert_eq!(access.registration.len(), 2);
        assert!(access.unauthenticated_resolution);
        let tls = c.endpoint.tls.unwrap();
        assert!(tls.require_client_certificate);
        assert_eq!(tls.handshake_timeout, Duration::from_secs(1));
        // Without TLS, no rules.
        let c = parse(&[]).into_config().unwrap();
        assert!(c.endpoint.tls.is_none() && c.core.access.is_none());
        let err = |r: Result<DriverConfig>| format!("{:#}", r.unwrap_err());
        assert!(err(with_file("[tls]\nciphers = 3\n", &[])).contains("unknown field `ciphers`"));
        assert!(err(with_file(
            "[tls]\ncert = \"a\"\nkey = \"b\"\nca = \"c\"\n[[tls.register]]\nidentity = \"\"\npools = [\"P\"]\n",
            &[]
        ))
        .contains("tls.register"));
        assert!(err(parse(&[
            "--tls-ca",
            "c",
            "--tls-cert",
            "a",
            "--tls-key",
            "b",
            "--tls-register",
            "nopools"
        ])
        .into_config())
        .contains("--tls-register"));
    }
}
