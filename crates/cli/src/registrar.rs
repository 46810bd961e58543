//! `rserpool registrar`: the registrar daemon. Every setting is a flag (named after RSPLIB's
//! `rspregistrar` option where one exists) and a key of the TOML file given with `--config`;
//! flags win over the file, the file over the profile's defaults.

use anyhow::{bail, Context, Result};
use clap::Args;
use rserpool_registrar::driver::{run, DriverConfig};
use rserpool_registrar::{AddressScope, Profile, RateLimit, RegistrarConfig};
use rserpool_transport::TransportChoice;
use rserpool_wire::RegistrarId;
use serde::Deserialize;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// Options of `rserpool registrar`. Times are in milliseconds, rates in requests per second.
#[derive(Args, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct RegistrarArgs {
    /// TOML file with any of these options as keys (e.g. `asap = ["0.0.0.0:3863"]`,
    /// `max-bad-pe-reports = 3`); flags given on the command line take precedence.
    #[arg(long, value_name = "FILE")]
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
    /// ASAP address to listen on (repeat for SCTP multi-homing; one port for all).
    /// [default: 0.0.0.0:3863]
    #[arg(long, value_name = "ADDR:PORT")]
    #[serde(default)]
    pub asap: Vec<SocketAddr>,
    /// Also accept pool users' handle resolutions over plain TCP (no frame header) here.
    #[arg(long, value_name = "ADDR:PORT")]
    #[serde(default)]
    pub plain_tcp: Vec<SocketAddr>,
    /// Server announces: `auto` (the profile's group: 239.0.0.50:3863 for rsplib,
    /// 224.0.1.185:3863 for rfc), `off`, or a group ADDR:PORT. [default: auto]
    #[arg(long, value_name = "auto|off|ADDR:PORT")]
    pub asap_announce: Option<String>,
    /// Interface (its IPv4 address) announces go out on. [default: chosen by the kernel]
    #[arg(long, value_name = "IPV4")]
    pub announce_interface: Option<std::net::Ipv4Addr>,
    /// TTL of announces. [default: 30]
    #[arg(long)]
    pub announce_ttl: Option<u32>,
    /// Announce cycle T6 in ms. [default: 1000]
    #[arg(long, value_name = "MS")]
    pub announce_interval: Option<u64>,
    /// This registrar's 32-bit identifier, e.g. 0x1deea448. [default: random]
    #[arg(long, value_parser = parse_id)]
    pub identifier: Option<u32>,
    /// Mean interval between ENDPOINT_KEEP_ALIVEs to a PE, in ms. [default: 5000]
    #[arg(long, value_name = "MS")]
    pub endpoint_keep_alive_transmission_interval: Option<u64>,
    /// Time a PE has to answer a keep-alive before it is removed, in ms. [default: 5000]
    #[arg(long, value_name = "MS")]
    pub endpoint_keep_alive_timeout_interval: Option<u64>,
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
    /// Narrowest address scope accepted from PEs: loopback, link-local, site-local, global.
    /// [default: site-local]
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
    /// Serve Prometheus metrics at http://ADDR:PORT/metrics.
    #[arg(long, value_name = "ADDR:PORT")]
    pub metrics: Option<SocketAddr>,
    /// Seed for the registrar's random numbers (reproducible runs). [default: from the OS]
    #[arg(long)]
    pub seed: Option<u64>,
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
            seed
        );
        if self.asap.is_empty() {
            self.asap = file.asap;
        }
        if self.plain_tcp.is_empty() {
            self.plain_tcp = file.plain_tcp;
        }
        Ok(self)
    }

    /// The driver configuration these options describe; errors name the option.
    pub fn into_config(self) -> Result<DriverConfig> {
        let a = self.merged()?;
        let profile = match a.profile.as_deref().unwrap_or("rsplib") {
            "rsplib" => Profile::Rsplib,
            "rfc" => Profile::Rfc,
            other => bail!("profile: {other:?} is neither rsplib nor rfc"),
        };
        let mut core = RegistrarConfig::new(profile);
        if let Some(id) = a.identifier {
            core.registrar_id = RegistrarId(id);
        }
        let ms = |name: &str, v: u64| -> Result<Duration> {
            if v == 0 {
                bail!("{name}: must be at least 1 ms");
            }
            Ok(Duration::from_millis(v))
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
            let d = humantime::parse_duration(s)
                .map_err(|e| anyhow::anyhow!("ownership-probe-timeout: {s:?}: {e}"))?;
            if d.is_zero() {
                bail!("ownership-probe-timeout: must be longer than 0");
            }
            core.ownership_probe_timeout = d;
        }
        if let Some(n) = a.max_unreachable_probes {
            core.max_unreachable_probes = n;
        }
        if let Some(s) = a.unreachable_probe_interval.as_deref() {
            let d = humantime::parse_duration(s)
                .map_err(|e| anyhow::anyhow!("unreachable-probe-interval: {s:?}: {e}"))?;
            if d.is_zero() {
                bail!("unreachable-probe-interval: must be longer than 0");
            }
            core.unreachable_probe_interval = d;
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
        config.plain_tcp_listen = a.plain_tcp;
        config.announce_interface = a.announce_interface;
        if let Some(ttl) = a.announce_ttl {
            if !(1..=255).contains(&ttl) {
                bail!("announce-ttl: {ttl} is not in 1..=255");
            }
            config.announce_ttl = ttl;
        }
        config.metrics_listen = a.metrics;
        if let Some(n) = a.max_held_answers {
            if n == 0 {
                bail!("max-held-answers: must be at least 1");
            }
            config.max_held_answers = n;
        }
        Ok(config)
    }
}

/// Runs the registrar until SIGINT or SIGTERM.
pub fn run_registrar(args: RegistrarArgs) -> Result<()> {
    let config = args.into_config()?;
    // One thread: the registrar core is one state machine, and the transport's reader and the
    // core hand messages to each other without crossing threads.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let (started_tx, started_rx) = tokio::sync::oneshot::channel();
        let serve = run(config, started_tx, crate::shutdown_signal());
        tokio::pin!(serve);
        tokio::select! {
            r = &mut serve => return r.context("registrar"),
            started = started_rx => {
                if let Ok(s) = started {
                    println!(
                        "registrar {} serving ASAP over {} on {:?}{}{}",
                        s.registrar_id,
                        s.transport,
                        s.asap_addrs,
                        if s.plain_tcp_addrs.is_empty() { String::new() } else { format!(", plain TCP on {:?}", s.plain_tcp_addrs) },
                        s.metrics_addr.map(|m| format!(", metrics at http://{m}/metrics")).unwrap_or_default()
                    );
                }
            }
        }
        serve.await.context("registrar")
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
            vec!["0.0.0.0:3863".parse::<SocketAddr>().unwrap()]
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
            &["--max-bad-pe-reports", "9", "--endpoint-keep-alive-timeout-interval", "1500"],
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
    }
}
