//! The LSNAT gateway (RFC 2391): one virtual address in front of a pool, for clients that do
//! not speak ASAP, with an honest record of what happened to each session.
//!
//! - [`core`] is sans-IO: members and their liveness state machine (alive, suspect, dead,
//!   probation with slow start; weight 0 drains), load-share policies, persistence, the binding
//!   table with per-state idle timers, limits, and per-session receipts (selected, bound,
//!   reached, outcome) that are kept and counted apart. It takes the time as an argument and
//!   an RNG at construction, and is tested in virtual time.
//! - [`driver`] is the userspace data plane: TCP relay workers (an event loop per thread), the
//!   UDP relay, active probes, the timer tick, and the HTTP status (`/status`, JSON) and metrics
//!   (`/metrics`, Prometheus) endpoint.
//! - [`nat`] is the kernel data plane (`mode = "nat"`): an nftables table of the gateway's own
//!   whose weight map the core keeps current, and conntrack events as the receipts.
//! - [`source`] is where members come from: a static list or an RSerPool pool, through
//!   `source::MemberSource`; [`source::PoolMembership`] turns handle resolutions into member
//!   lists without a runtime (the simulator uses it too).
//! - [`config`] reads the TOML file and command-line flags into checked settings.
//!
//! Entry point for the `rserpool lsnat` subcommand: [`run`] with [`LsnatArgs`].

#![warn(missing_docs)]

#[cfg(feature = "runtime")]
pub mod config;
pub mod core;
#[cfg(feature = "runtime")]
pub mod driver;
#[cfg(feature = "runtime")]
pub mod nat;
pub mod source;

#[cfg(feature = "runtime")]
pub use config::{Config, ConfigError, Overrides};
#[cfg(feature = "runtime")]
pub use driver::{start, Running};
#[cfg(feature = "runtime")]
pub use source::{MemberSource, RserpoolSource, SourceUpdate, StaticSource};

#[cfg(feature = "runtime")]
use anyhow::Context;
#[cfg(feature = "runtime")]
use std::path::PathBuf;

/// Options of `rserpool lsnat`.
#[cfg(feature = "runtime")]
#[derive(clap::Args, Debug, Clone, Default)]
#[cfg(feature = "runtime")]
pub struct LsnatArgs {
    /// TOML configuration file (see docs/lsnat.md). Flags below override or replace its values.
    #[arg(long, short = 'c', value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Virtual address to listen on, `[tcp:|udp:]IP:PORT` (repeatable; replaces the file's
    /// listeners).
    #[arg(long = "listen", value_name = "ADDR")]
    pub listen: Vec<String>,
    /// Pool member, `IP:PORT[,WEIGHT[,COST]]` (repeatable; replaces the file's members).
    #[arg(long = "member", value_name = "ADDR[,WEIGHT[,COST]]")]
    pub member: Vec<String>,
    /// Members from this RSerPool pool (the gateway resolves it at a registrar) instead of
    /// `--member`.
    #[arg(long, value_name = "NAME")]
    pub pool_handle: Option<String>,
    /// Registrar to resolve the pool at, ADDR:PORT (repeatable; tried in order).
    #[arg(long = "registrar", value_name = "ADDR")]
    pub registrar: Vec<String>,
    /// ASAP transport to the registrar: auto (SCTP where the kernel has it, else the TCP
    /// mapping), sctp or tcp. [default: auto]
    #[arg(long, value_name = "auto|sctp|tcp", value_parser = ["auto", "sctp", "tcp"])]
    pub transport: Option<String>,
    /// Deprecated spelling of `--transport`.
    #[arg(long, hide = true, value_name = "auto|sctp|tcp", value_parser = ["auto", "sctp", "tcp"])]
    pub registrar_transport: Option<String>,
    /// Load-share policy: round-robin, weighted-round-robin, least-sessions,
    /// weighted-least-sessions, least-traffic, weighted-least-traffic, route-cost, random,
    /// weighted-random, or pool (the RSerPool pool's own policy; the default with
    /// --pool-handle). Aliases are listed in docs/lsnat.md.
    #[arg(long, value_name = "NAME")]
    pub policy: Option<String>,
    /// Data plane: proxy (the userspace relay, the default) or nat (the kernel translates
    /// packets through an nftables table the gateway owns; needs root and nftables, and falls
    /// back to the proxy, saying so, where the kernel cannot be programmed).
    #[arg(long, value_name = "proxy|nat")]
    pub mode: Option<String>,
    /// Address of the HTTP endpoint: GET /metrics (Prometheus), GET /status (JSON),
    /// GET /healthz.
    #[arg(long, value_name = "ADDR:PORT")]
    pub metrics: Option<String>,
    /// Deprecated spelling of `--metrics`.
    #[arg(long, hide = true, value_name = "ADDR:PORT")]
    pub status: Option<String>,
    /// TCP relay worker threads, each an event loop; they share the listening sockets, a new
    /// connection wakes one idle worker, and one with more sessions hands it to a waiting one
    /// (default: one per CPU).
    #[arg(long, value_name = "N")]
    pub threads: Option<usize>,
    /// Check the configuration, bind what would be bound (and let go), print a summary and the
    /// warnings, exit.
    #[arg(long)]
    pub check: bool,
}

#[cfg(feature = "runtime")]
impl LsnatArgs {
    /// The configuration these arguments describe.
    pub fn load(&self) -> Result<Config, ConfigError> {
        let mut warnings = Vec::new();
        if self.status.is_some() {
            warnings.push("--status is deprecated; write --metrics".to_string());
        }
        if self.registrar_transport.is_some() {
            warnings.push("--registrar-transport is deprecated; write --transport".to_string());
        }
        let ov = Overrides {
            listen: self.listen.clone(),
            members: self.member.clone(),
            policy: self.policy.clone(),
            metrics: self.metrics.clone().or_else(|| self.status.clone()),
            mode: self.mode.clone(),
            threads: self.threads,
            pool_handle: self.pool_handle.clone(),
            registrars: self.registrar.clone(),
            transport: self
                .transport
                .clone()
                .or_else(|| self.registrar_transport.clone()),
            warnings,
        };
        match &self.config {
            Some(path) => Config::from_file(path, &ov),
            None => Config::from_overrides(&ov),
        }
    }
}

/// `println!` that ends the program quietly (with success) when stdout is a closed pipe.
#[cfg(feature = "runtime")]
fn print_line(text: &str) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    if let Err(e) = writeln!(out, "{text}").and_then(|()| out.flush()) {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(0);
        }
        eprintln!("rserpool lsnat: writing to stdout: {e}");
        std::process::exit(1);
    }
}

/// Runs `rserpool lsnat`: reads the configuration, sets up logging to stderr (`RUST_LOG`,
/// default info),
/// starts the configured worker threads and serves until Ctrl-C or SIGTERM.
#[cfg(feature = "runtime")]
pub fn run(args: &LsnatArgs) -> anyhow::Result<()> {
    let config = args.load()?;
    let _ = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .try_init();
    if args.check {
        print_line(&summary(&config));
        for w in &config.warnings {
            print_line(&format!("warning: {w}"));
        }
        // What it would bind, bound now (and let go): a port in use is found before the start.
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("building the tokio runtime")?;
        rt.block_on(driver::try_bind(&config))
            .context("the configuration is valid, but it cannot be served here")?;
        print_line("configuration ok; every address can be bound");
        return Ok(());
    }
    // The calling thread runs the timers, probes, UDP, member source and endpoint on one
    // current-thread runtime; the driver starts the TCP relay workers, each a thread with an
    // event loop of its own.
    let mut rt = tokio::runtime::Builder::new_current_thread();
    rt.enable_all();
    let rt = rt.build().context("building the tokio runtime")?;
    rt.block_on(serve(config))
}

/// Serves `config` with its members (the RSerPool pool, or the static list) until Ctrl-C or
/// SIGTERM.
#[cfg(feature = "runtime")]
pub async fn serve(config: Config) -> anyhow::Result<()> {
    serve_with(config.clone(), member_source(&config)).await
}

/// The member source a configuration asks for.
#[cfg(feature = "runtime")]
pub fn member_source(config: &Config) -> Box<dyn MemberSource> {
    match &config.rserpool {
        Some(r) => Box::new(RserpoolSource::new(r.clone())),
        None => Box::new(StaticSource::new(config.members.clone())),
    }
}

/// Serves `config` with members from `source` until Ctrl-C or SIGTERM. Once everything is
/// bound, a one-line banner on stdout says where (as the registrar's does).
#[cfg(feature = "runtime")]
pub async fn serve_with(config: Config, source: Box<dyn MemberSource>) -> anyhow::Result<()> {
    let running = start(config, source)
        .await
        .context("starting the gateway")?;
    let listeners: Vec<String> = running
        .listeners()
        .iter()
        .map(|(p, a)| format!("{}:{a}", p.name()))
        .collect();
    print_line(&format!(
        "lsnat gateway serving {}{}",
        listeners.join(", "),
        running
            .status_address()
            .map(|a| format!(", metrics at http://{a}/metrics, status at http://{a}/status"))
            .unwrap_or_default()
    ));
    wait_for_signal().await;
    tracing::info!("stopping");
    running.shutdown().await;
    Ok(())
}

#[cfg(feature = "runtime")]
async fn wait_for_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        if let Ok(mut term) = signal(SignalKind::terminate()) {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
            return;
        }
    }
    let _ = tokio::signal::ctrl_c().await;
}

/// A duration as people write it: "2s", "1m 30s", "250ms", "0s" (never Rust's `{:?}`).
#[cfg(feature = "runtime")]
pub fn human(d: std::time::Duration) -> String {
    if d.is_zero() {
        return "0s".into();
    }
    // Below a millisecond nothing the gateway does is that precise.
    let d = if d >= std::time::Duration::from_millis(1) {
        std::time::Duration::from_millis(d.as_millis() as u64)
    } else {
        d
    };
    humantime::format_duration(d).to_string()
}

/// A one-paragraph description of a configuration, in words and human durations.
#[cfg(feature = "runtime")]
pub fn summary(c: &Config) -> String {
    let listeners: Vec<String> = c
        .listeners
        .iter()
        .map(|l| format!("{}:{}", l.protocol.name(), l.address))
        .collect();
    let members: Vec<String> = match &c.rserpool {
        Some(r) => {
            let registrars: Vec<String> = r.registrars.iter().map(|a| a.to_string()).collect();
            vec![format!(
                "the PEs of RSerPool pool {} (registrars {}, refreshed every {})",
                r.pool_handle,
                registrars.join(", "),
                human(r.refresh)
            )]
        }
        None => c
            .members
            .iter()
            .map(|m| format!("{} (weight {}, cost {})", m.address, m.weight, m.cost))
            .collect(),
    };
    let probe = match c.probe.kind {
        config::ProbeKind::None => "none (passive evidence only)".to_string(),
        kind => format!(
            "{} every {} (timeout {})",
            if kind == config::ProbeKind::Tcp {
                "tcp"
            } else {
                "udp"
            },
            human(c.probe.interval),
            human(c.probe.timeout)
        ),
    };
    let threads = match c.runtime.worker_threads {
        Some(1) => "1 worker thread".to_string(),
        Some(n) => format!("{n} worker threads"),
        None => format!("one worker thread per CPU ({})", driver::workers(c)),
    };
    let splice = if c.runtime.splice {
        format!("splice on (pipe {} bytes)", c.runtime.pipe_size)
    } else {
        "splice off".to_string()
    };
    let relay = format!(
        "the relay with {threads}, scheduling {}, buffer {} bytes, {splice}",
        c.runtime.scheduling.name(),
        c.runtime.buffer_size
    );
    let mode = match c.mode {
        config::Mode::Proxy => format!("proxy, {relay}"),
        config::Mode::Nat if c.nat.required => {
            "nat (the kernel translates; without it the gateway does not start)".to_string()
        }
        config::Mode::Nat => format!("nat (the kernel translates; without it, {relay})"),
    };
    let persistence = if c.core.persistence.timeout.is_zero() {
        "off".to_string()
    } else {
        human(c.core.persistence.timeout)
    };
    let relay_limits = format!(
        "{} sessions, {} per member",
        c.core.limits.max_sessions, c.core.limits.max_sessions_per_member
    );
    let relay_timers = format!(
        "tcp established {}, tcp transitory {}, rst linger {}, udp {}",
        human(c.core.timers.tcp_established),
        human(c.core.timers.tcp_transitory),
        human(c.core.timers.tcp_rst_linger),
        human(c.core.timers.udp)
    );
    // In NAT mode conntrack holds the sessions and times them out; the relay's limits and
    // timers apply only if the gateway falls back to it (docs/lsnat.md, "NAT mode").
    let (limits, timers) = match c.mode {
        config::Mode::Proxy => (relay_limits, relay_timers),
        config::Mode::Nat => {
            let kernel_limits = "conntrack's table (net.netfilter.nf_conntrack_max) and each member's own max-sessions";
            let kernel_timers = "conntrack's (net.netfilter.nf_conntrack_*_timeout*)";
            if c.nat.required {
                (kernel_limits.to_string(), kernel_timers.to_string())
            } else {
                (
                    format!("{kernel_limits}; the relay's if it falls back: {relay_limits}"),
                    format!("{kernel_timers}; the relay's if it falls back: {relay_timers}"),
                )
            }
        }
    };
    let nat = match c.mode {
        config::Mode::Proxy => String::new(),
        config::Mode::Nat => format!("\nnat: {}", nat::describe(&c.nat)),
    };
    format!(
        "listeners: {}\npolicy: {}\nmembers: {}\nprobe: {probe}, fall {}, rise {}, slow start {}\nlimits: {limits}\ntimers: {timers}\npersistence: {persistence}\nmode: {mode}{nat}\nmetrics: {}",
        listeners.join(", "),
        c.core.policy.name(),
        members.join(", "),
        c.core.health.liveness.fall,
        c.core.health.liveness.rise,
        human(c.core.health.liveness.slow_start),
        c.status
            .map(|s| format!("http://{s}/metrics"))
            .unwrap_or_else(|| "off".into()),
    )
}
