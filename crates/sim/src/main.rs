//! `rserpool-sim`: runs many seeds and prints a summary, or replays one seed with its trace.
//!
//! ```text
//! rserpool-sim [--seeds N] [--first S] [--faults registrar,pe,partition,pause|all|none]
//!              [--registrars N] [--pes N] [--pus N] [--pools N] [--sessions N]
//!              [--failure-after N] [--calcapp on|off] [--max-jobs N]
//!              [--session-extras off] [--business-cards on|off] [--signed-cookies on|off]
//!              [--cookie-tampering P] [--manual-failover SHARE]
//!              [--requested-failovers SECS|off] [--job-interval SECS|off]
//!              [--seed S] [--trace] [--pcap FILE [--pcap-limit BYTES]]
//!              [--transports sctp|per-host|per-registrar] [--tcp-share F] [--multihomed F]
//!              [--hostile N] [--authenticated on|off] [--restarts on|off] [--path-cuts on|off]
//!              [--net-modes off]
//! ```

use rserpool_sim::{
    run, run_gateway, Faults, GatewayConfig, GatewaySource, Mutation, SimConfig, Stats, Transports,
};
use std::process::ExitCode;
use std::time::{Duration, Instant};

/// Prints a line to standard output; when the reader has gone (`scripts/sim … | head`), stops
/// quietly with the status a shell gives a process killed by SIGPIPE (128 + 13).
macro_rules! out {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        if writeln!(std::io::stdout(), $($arg)*).is_err() {
            std::process::exit(141);
        }
    }};
}

struct Args {
    seeds: u64,
    first: u64,
    seed: Option<u64>,
    trace: bool,
    faults: Option<Faults>,
    registrars: Option<usize>,
    pes: Option<usize>,
    pus: Option<usize>,
    sessions: Option<usize>,
    failure_after: Option<u64>,
    pools: Option<usize>,
    calcapp: Option<bool>,
    max_jobs: Option<usize>,
    chaos: Option<u64>,
    mutation: Option<Mutation>,
    check_every: Option<u64>,
    gateway: bool,
    clean_network: bool,
    clean_client_network: bool,
    gateway_faults: Option<bool>,
    gateway_source: Option<GatewaySource>,
    pcap: Option<std::path::PathBuf>,
    pcap_limit: u64,
    session_extras_off: bool,
    business_cards: Option<bool>,
    signed_cookies: Option<bool>,
    cookie_tampering: Option<f64>,
    manual_failover: Option<f64>,
    requested_failovers: Option<Option<Duration>>,
    job_interval: Option<Option<Duration>>,
    net_modes_off: bool,
    transports: Option<Transports>,
    tcp_share: Option<f64>,
    multihomed: Option<f64>,
    hostile: Option<usize>,
    authenticated: Option<bool>,
    restarts: Option<bool>,
    path_cuts: Option<bool>,
}

/// Default most bytes of a `--pcap` file (the file is built in memory).
const DEFAULT_PCAP_LIMIT: u64 = 1 << 30;

fn parse() -> Result<Args, String> {
    let mut a = Args {
        seeds: 100,
        first: 0,
        seed: None,
        trace: false,
        faults: None,
        registrars: None,
        pes: None,
        pus: None,
        sessions: None,
        failure_after: None,
        pools: None,
        calcapp: None,
        max_jobs: None,
        chaos: None,
        mutation: None,
        check_every: None,
        gateway: false,
        clean_network: false,
        clean_client_network: false,
        gateway_faults: None,
        gateway_source: None,
        pcap: None,
        pcap_limit: DEFAULT_PCAP_LIMIT,
        session_extras_off: false,
        business_cards: None,
        signed_cookies: None,
        cookie_tampering: None,
        manual_failover: None,
        requested_failovers: None,
        job_interval: None,
        net_modes_off: false,
        transports: None,
        tcp_share: None,
        multihomed: None,
        hostile: None,
        authenticated: None,
        restarts: None,
        path_cuts: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = |name: &str| it.next().ok_or_else(|| format!("{name} needs a value"));
        let num = |name: &str, v: String| {
            v.parse::<u64>()
                .map_err(|e| format!("{name}: `{v}` is not a number ({e})"))
        };
        match flag.as_str() {
            "--seeds" => a.seeds = num("--seeds", value("--seeds")?)?,
            "--first" => a.first = num("--first", value("--first")?)?,
            "--seed" => a.seed = Some(num("--seed", value("--seed")?)?),
            "--trace" => a.trace = true,
            "--gateway" => a.gateway = true,
            "--clean-network" => a.clean_network = true,
            "--clean-client-network" => a.clean_client_network = true,
            "--gateway-source" => {
                a.gateway_source = Some(match value("--gateway-source")?.as_str() {
                    "static" => GatewaySource::Static,
                    "rserpool" => GatewaySource::Rserpool,
                    v => {
                        return Err(format!(
                            "--gateway-source: `{v}` is neither static nor rserpool"
                        ))
                    }
                })
            }
            "--gateway-faults" => {
                a.gateway_faults = Some(match value("--gateway-faults")?.as_str() {
                    "on" => true,
                    "off" => false,
                    v => return Err(format!("--gateway-faults: `{v}` is neither on nor off")),
                })
            }
            "--pcap" => a.pcap = Some(value("--pcap")?.into()),
            "--pcap-limit" => a.pcap_limit = num("--pcap-limit", value("--pcap-limit")?)?,
            "--faults" => a.faults = Some(Faults::parse(&value("--faults")?)?),
            "--registrars" => {
                a.registrars = Some(num("--registrars", value("--registrars")?)? as usize)
            }
            "--pes" => a.pes = Some(num("--pes", value("--pes")?)? as usize),
            "--pus" => a.pus = Some(num("--pus", value("--pus")?)? as usize),
            "--sessions" => a.sessions = Some(num("--sessions", value("--sessions")?)? as usize),
            "--failure-after" => {
                a.failure_after = Some(num("--failure-after", value("--failure-after")?)?)
            }
            "--pools" => a.pools = Some(num("--pools", value("--pools")?)?.max(1) as usize),
            "--calcapp" => {
                a.calcapp = Some(match value("--calcapp")?.as_str() {
                    "on" => true,
                    "off" => false,
                    v => return Err(format!("--calcapp: `{v}` is neither on nor off")),
                })
            }
            "--session-extras" => match value("--session-extras")?.as_str() {
                "off" => a.session_extras_off = true,
                v => return Err(format!("--session-extras: `{v}` is not off")),
            },
            "--business-cards" => a.business_cards = Some(on_off("--business-cards", value("--business-cards")?)?),
            "--signed-cookies" => a.signed_cookies = Some(on_off("--signed-cookies", value("--signed-cookies")?)?),
            "--cookie-tampering" => {
                a.cookie_tampering = Some(share("--cookie-tampering", value("--cookie-tampering")?)?)
            }
            "--manual-failover" => {
                a.manual_failover = Some(share("--manual-failover", value("--manual-failover")?)?)
            }
            "--requested-failovers" => {
                a.requested_failovers = Some(secs_or_off("--requested-failovers", value("--requested-failovers")?)?)
            }
            "--job-interval" => {
                a.job_interval = Some(secs_or_off("--job-interval", value("--job-interval")?)?)
            }
            "--net-modes" => a.net_modes_off = !on_off("--net-modes", value("--net-modes")?)?,
            "--transports" => {
                a.transports = Some(match value("--transports")?.as_str() {
                    "sctp" => Transports::Sctp,
                    "per-host" => Transports::PerHost,
                    "per-registrar" => Transports::PerRegistrar,
                    v => {
                        return Err(format!(
                            "--transports: `{v}` is not sctp, per-host or per-registrar"
                        ))
                    }
                })
            }
            "--tcp-share" => a.tcp_share = Some(share("--tcp-share", value("--tcp-share")?)?),
            "--multihomed" => a.multihomed = Some(share("--multihomed", value("--multihomed")?)?),
            "--hostile" => a.hostile = Some(num("--hostile", value("--hostile")?)? as usize),
            "--authenticated" => {
                a.authenticated = Some(on_off("--authenticated", value("--authenticated")?)?)
            }
            "--restarts" => a.restarts = Some(on_off("--restarts", value("--restarts")?)?),
            "--path-cuts" => a.path_cuts = Some(on_off("--path-cuts", value("--path-cuts")?)?),
            "--max-jobs" => a.max_jobs = Some(num("--max-jobs", value("--max-jobs")?)? as usize),
            "--chaos" => a.chaos = Some(num("--chaos", value("--chaos")?)?),
            "--check-every" => a.check_every = Some(num("--check-every", value("--check-every")?)?),
            "--mutation" => {
                a.mutation = Some(match value("--mutation")?.as_str() {
                    "one-way-enrp" => Mutation::OneWayEnrp,
                    "silent-pes" => Mutation::SilentPoolElements,
                    "blind-takeover-acks" => Mutation::BlindTakeoverAcks,
                    "lost-probe-answers" => Mutation::LostProbeAnswers,
                    "reordered-session-start" => Mutation::ReorderedSessionStart,
                    "duplicated-session-messages" => Mutation::DuplicatedSessionMessages,
                    "gateway-fin-from-dead-member" => Mutation::GatewayFinFromDeadMember,
                    "gateway-probes-through-cut" => Mutation::GatewayProbesThroughCut,
                    "gateway-crash-finishes-answers" => Mutation::GatewayCrashFinishesAnswers,
                    "gateway-source-only-adds" => Mutation::GatewaySourceOnlyAdds,
                    "gateway-slow-refresh" => Mutation::GatewaySlowRefresh,
                    "gateway-restart-keeps-sessions" => Mutation::GatewayRestartKeepsSessions,
                    "gateway-forgets-resets" => Mutation::GatewayForgetsResets,
                    "calcapp-echo-loses-progress" => Mutation::CalcAppEchoLosesProgress,
                    "ignored-business-cards" => Mutation::IgnoredBusinessCards,
                    "foreign-business-cards" => Mutation::ForeignBusinessCards,
                    "unchecked-cookie-seal" => Mutation::UncheckedCookieSeal,
                    "mislabelled-requested-failovers" => Mutation::MislabelledRequestedFailovers,
                    "hostile-as-owner" => Mutation::HostileAsOwner,
                    "no-path-failover" => Mutation::NoPathFailover,
                    "silent-restart" => Mutation::SilentRestart,
                    other => {
                        return Err(format!(
                            "unknown mutation `{other}` (one-way-enrp, silent-pes, blind-takeover-acks, lost-probe-answers, reordered-session-start, duplicated-session-messages, gateway-fin-from-dead-member, gateway-probes-through-cut, calcapp-echo-loses-progress, ignored-business-cards, foreign-business-cards, unchecked-cookie-seal, mislabelled-requested-failovers, gateway-crash-finishes-answers, gateway-source-only-adds, gateway-slow-refresh, gateway-restart-keeps-sessions, gateway-forgets-resets, hostile-as-owner, no-path-failover, silent-restart)"
                        ))
                    }
                })
            }
            "-h" | "--help" => {
                out!("{HELP}");
                std::process::exit(0);
            }
            other => return Err(format!("unknown argument `{other}` (try --help)")),
        }
    }
    if a.pcap.is_some() && a.seed.is_none() {
        return Err("--pcap needs --seed S (one run, one file)".to_string());
    }
    if a.pcap.is_some() && a.gateway {
        return Err("--pcap: the gateway world's traffic is not captured".to_string());
    }
    Ok(a)
}

fn on_off(name: &str, v: String) -> Result<bool, String> {
    match v.as_str() {
        "on" => Ok(true),
        "off" => Ok(false),
        _ => Err(format!("{name}: `{v}` is neither on nor off")),
    }
}

fn share(name: &str, v: String) -> Result<f64, String> {
    match v.parse::<f64>() {
        Ok(p) if (0.0..=1.0).contains(&p) => Ok(p),
        _ => Err(format!("{name}: `{v}` is not a number from 0 to 1")),
    }
}

fn secs_or_off(name: &str, v: String) -> Result<Option<Duration>, String> {
    if v == "off" {
        return Ok(None);
    }
    match v.parse::<f64>() {
        Ok(s) if s > 0.0 && s.is_finite() && s < 1e9 => Ok(Some(Duration::from_secs_f64(s))),
        _ => Err(format!(
            "{name}: `{v}` is neither a positive number of seconds nor off"
        )),
    }
}

const HELP: &str = r#"rserpool-sim: deterministic simulation of registrars, PEs and PUs

  --seeds N        run N seeds (default 100)
  --first S        first seed of the range (default 0)
  --seed S         run only seed S
  --trace          print the readable trace of each run
  --pcap FILE      with --seed: write every message the simulated network
                   delivers to FILE (pcap, raw IPv4, SCTP and UDP; see
                   docs/simulation.md), readable by `rserpool decode`,
                   tshark and Wireshark
  --pcap-limit N   most bytes of the --pcap file (default 1073741824); later
                   packets are left out and counted
  --faults LIST    registrar,pe,partition,pause,path | all | none (default: from
                   the seed; path cuts need multi-homed hosts)
  --registrars N, --pes N, --pus N   sizes (default: from the seed)
  --sessions N     PingPong sessions per PU (default: from the seed; 0 runs a
                   seed as it ran before sessions were simulated)
  --failure-after N  PingPong PEs abort a session after N replies (0 never)
  --pools N        pools the PEs are spread over (default: from the seed)
  --calcapp on|off the last pool runs CalcApp jobs (default: from the seed;
                   off runs a seed as it ran before CalcApp was simulated)
  --max-jobs N     jobs a CalcApp PE runs at once (default: from the seed)
  --session-extras off  no business cards, signed cookies, manual or requested
                   failovers, jobs over time: a seed as it ran before them
                   (the options below, given after, turn one on again)
  --business-cards on|off  PEs send business cards (default: from the seed)
  --signed-cookies on|off  PEs seal cookies with HMAC under a pool key; some
                   seeds give one PE its own key or none (default: seed)
  --cookie-tampering P  probability (0..1) that a signed cookie echo is altered
                   or replaced by another user's on the way (default: seed)
  --manual-failover SHARE  share (0..1) of sessions in manual failover mode
  --requested-failovers SECS|off  mean time between failovers the application
                   of a bound session asks for (default: from the seed)
  --job-interval SECS|off  CalcApp jobs arrive over time with this mean gap
                   (off: all queued at the session's start; default: seed)
  --chaos SECS     length of the chaos phase (default: from the seed)
  --check-every N  scan every handlespace only every N steps (default 1)
  --mutation M     a deliberate defect the checker must catch:
                   one-way-enrp, silent-pes, blind-takeover-acks,
                   lost-probe-answers, reordered-session-start,
                   duplicated-session-messages,
                   gateway-fin-from-dead-member,
                   gateway-probes-through-cut,
                   gateway-crash-finishes-answers,
                   gateway-source-only-adds, gateway-slow-refresh,
                   gateway-restart-keeps-sessions,
                   gateway-forgets-resets,
                   calcapp-echo-loses-progress, ignored-business-cards,
                   foreign-business-cards, unchecked-cookie-seal,
                   mislabelled-requested-failovers, hostile-as-owner,
                   no-path-failover, silent-restart (tests of the checker)
  --transports M   sctp | per-host | per-registrar: which hosts lack SCTP and
                   use the TCP mapping (default: from the seed)
  --tcp-share F    share of hosts (per-host) or registrars (per-registrar,
                   their clients follow them) without SCTP, 0..1
  --multihomed F   share of SCTP hosts with a second address, 0..1
  --hostile N      hostile hosts attacking the registrars (default: from the seed)
  --authenticated on|off  registrars check TLS identities (access rules)
  --restarts on|off  peers see a restarted host's kernel (SCTP_RESTART,
                   ABORT, RST) rather than only their timeout
  --path-cuts on|off  cut one address of a multi-homed host now and then
                   (keeps the seed's other faults)
  --net-modes off  none of the last six (a seed as it ran before them)
  --gateway        run the LSNAT gateway core's world instead (clients, data
                   plane, members that crash, restart and pause, a
                   network that loses and cuts members off); takes
                   --seeds, --first, --seed, --trace, --mutation,
                   --clean-network, --clean-client-network,
                   --gateway-faults, --gateway-source
  --clean-network  (--gateway) no loss, jitter or partitions on either side
                   of the gateway (with --gateway-faults off and
                   --gateway-source static: a seed as it ran before the
                   gateway world's network lost and cut)
  --clean-client-network  (--gateway) no loss, jitter or cuts between the
                   clients and the gateway
  --gateway-faults on|off  (--gateway) the gateway itself crashes (process
                   or host, state lost), restarts and pauses (default:
                   from the seed)
  --gateway-source static|rserpool  (--gateway) members from a static list,
                   or PEs registered with a registrar that the gateway
                   resolves (default: from the seed)"#;

fn main() -> ExitCode {
    let args = match parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("rserpool-sim: {e}");
            return ExitCode::from(2);
        }
    };
    let seeds: Vec<u64> = match args.seed {
        Some(s) => vec![s],
        None => (args.first..args.first + args.seeds).collect(),
    };
    let mut total = Stats::default();
    let mut failures = Vec::new();
    let started = Instant::now();
    for &seed in &seeds {
        if args.gateway {
            let mut cfg = GatewayConfig::from_seed(seed);
            cfg.trace = args.trace;
            cfg.mutation = args.mutation;
            if args.clean_network {
                cfg = cfg.clean_network();
            }
            if args.clean_client_network {
                cfg = cfg.clean_client_network();
            }
            if let Some(on) = args.gateway_faults {
                cfg.gateway_faults = on;
            }
            if let Some(source) = args.gateway_source {
                if source == GatewaySource::Rserpool && cfg.source != source {
                    // The seed drew static members: RSerPool ones with the defaults.
                    cfg.refresh = Duration::from_secs(2);
                    cfg.churn = true;
                }
                cfg.source = source;
            }
            let o = run_gateway(cfg);
            for line in &o.trace {
                out!("{line}");
            }
            total.add(&o.stats);
            if let Some(f) = o.failure {
                out!("FAIL {f}");
                failures.push(f);
            } else if args.seed.is_some() {
                out!("seed {seed}: ok (trace hash {:016x})", o.trace_hash);
            }
            continue;
        }
        let mut cfg = SimConfig::from_seed(seed);
        if args.net_modes_off {
            cfg = cfg.without_net_modes();
        }
        cfg.trace = args.trace;
        if let Some(f) = &args.faults {
            // Which faults; how often stays the seed's.
            cfg.faults = Faults {
                mean_interval: cfg.faults.mean_interval,
                ..f.clone()
            };
        }
        if let Some(n) = args.registrars {
            cfg.registrars = n;
        }
        if let Some(n) = args.pes {
            cfg.pool_elements = n;
        }
        if let Some(n) = args.pus {
            cfg.pool_users = n;
        }
        if let Some(n) = args.sessions {
            cfg.sessions_per_pu = n;
        }
        if let Some(n) = args.failure_after {
            cfg.pingpong_failure_after = n;
        }
        if let Some(n) = args.pools {
            cfg.pools = n;
        }
        if let Some(on) = args.calcapp {
            cfg.calcapp = on;
        }
        if let Some(n) = args.max_jobs {
            cfg.calcapp_max_jobs = n.max(1);
        }
        if args.session_extras_off {
            cfg = cfg.without_session_extras();
        }
        if let Some(on) = args.business_cards {
            cfg.business_cards = on;
        }
        if let Some(on) = args.signed_cookies {
            cfg.signed_cookies = on;
        }
        if let Some(p) = args.cookie_tampering {
            cfg.cookie_tampering = p;
        }
        if let Some(p) = args.manual_failover {
            cfg.manual_failover = p;
        }
        if let Some(m) = args.requested_failovers {
            cfg.requested_failovers = m;
        }
        if let Some(m) = args.job_interval {
            cfg.job_interval = m;
        }
        if let Some(t) = args.transports {
            cfg.transports = t;
            if t != Transports::Sctp && cfg.tcp_share == 0.0 {
                cfg.tcp_share = 0.5;
            }
        }
        if let Some(f) = args.tcp_share {
            cfg.tcp_share = f;
        }
        if let Some(f) = args.multihomed {
            cfg.multihomed_share = f;
        }
        if let Some(n) = args.hostile {
            cfg.hostile = n;
        }
        if let Some(on) = args.authenticated {
            cfg.authenticated = on;
        }
        if let Some(on) = args.restarts {
            cfg.restarts = on;
        }
        if let Some(on) = args.path_cuts {
            cfg.faults.path_cuts = on;
        }
        cfg.mutation = args.mutation;
        if args.pcap.is_some() {
            cfg.pcap_limit = Some(args.pcap_limit);
        }
        if let Some(n) = args.check_every {
            cfg.full_check_every = n;
        }
        if let Some(s) = args.chaos {
            cfg.chaos = Duration::from_secs(s);
        }
        let o = run(cfg);
        for line in &o.trace {
            out!("{line}");
        }
        if let (Some(path), Some(bytes)) = (&args.pcap, &o.pcap) {
            if let Err(e) = std::fs::write(path, bytes) {
                eprintln!("rserpool-sim: --pcap {}: {e}", path.display());
                return ExitCode::from(2);
            }
            out!(
                "seed {seed}: {} bytes of pcap written to {}{}",
                bytes.len(),
                path.display(),
                if o.pcap_left_out > 0 {
                    format!(
                        " ({} packets left out at the --pcap-limit of {} bytes)",
                        o.pcap_left_out, args.pcap_limit
                    )
                } else {
                    String::new()
                }
            );
        }
        total.add(&o.stats);
        if let Some(f) = o.failure {
            out!("FAIL {f}");
            failures.push(f);
        } else if args.seed.is_some() {
            out!("seed {seed}: ok (trace hash {:016x})", o.trace_hash);
        }
    }
    let wall = started.elapsed();
    out!(
        "{} seeds, {} failed; {total}; {:.1} s wall, {:.0} simulated s per wall s",
        seeds.len(),
        failures.len(),
        wall.as_secs_f64(),
        total.simulated.as_secs_f64() / wall.as_secs_f64().max(1e-9)
    );
    for f in &failures {
        out!("  seed {} `{}`: {}", f.seed, f.invariant, f.message);
    }
    if failures.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
