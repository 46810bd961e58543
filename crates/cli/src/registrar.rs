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
        tokio::select! {
            r = &mut serve => return r.context("registrar"),
            started = started_rx => {
                if let Ok(s) = started {
                    println!(
                        "registrar {} serving ASAP over {}{tls} on {:?}{}{}",
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
