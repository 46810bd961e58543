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
//! ```

use rserpool_sim::{
    run, run_gateway, Faults, GatewayConfig, GatewaySource, Mutation, SimConfig, Stats,
};
use std::process::ExitCode;
use std::time::{Duration, Instant};

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
                    other => {
                        return Err(format!(
                            "unknown mutation `{other}` (one-way-enrp, silent-pes, blind-takeover-acks, lost-probe-answers, reordered-session-start, duplicated-session-messages, gateway-fin-from-dead-member, gateway-probes-through-cut, calcapp-echo-loses-progress, ignored-business-cards, foreign-business-cards, unchecked-cookie-seal, mislabelled-requested-failovers, gateway-crash-finishes-answers, gateway-source-only-adds, gateway-slow-refresh, gateway-restart-keeps-sessions, gateway-forgets-resets)"
                        ))
                    }
                })
            }
            "-h" | "--help" => {
                println!(
                    "rserpool-sim: deterministic simulation of registrars, PEs and PUs\n\n\
                     --seeds N        run N seeds (default 100)\n\
                     --first S        first seed of the range (default 0)\n\
                     --seed S         run only seed S\n\
                     --trace          print the readable trace of each run\n\
                     --pcap FILE      with --seed: write every message the simulated network\n\
                                      delivers to FILE (pcap, raw IPv4, SCTP and UDP; see\n\
                                      docs/simulation.md), readable by `rserpool decode`,\n\
                                      tshark and Wireshark\n\
                     --pcap-limit N   most bytes of the --pcap file (default 1073741824); later\n\
                                      packets are left out and counted\n\
                     --faults LIST    registrar,pe,partition,pause | all | none (default: from the seed)\n\
                     --registrars N, --pes N, --pus N   sizes (default: from the seed)\n\
                     --sessions N     PingPong sessions per PU (default: from the seed; 0 runs a\n\
                                      seed as it ran before sessions were simulated)\n\
                     --failure-after N  PingPong PEs abort a session after N replies (0 never)\n\
                     --pools N        pools the PEs are spread over (default: from the seed)\n\
                     --calcapp on|off the last pool runs CalcApp jobs (default: from the seed;\n\
                                      off runs a seed as it ran before CalcApp was simulated)\n\
                     --max-jobs N     jobs a CalcApp PE runs at once (default: from the seed)\n\
                     --session-extras off  no business cards, signed cookies, manual or requested\n\
                                      failovers, jobs over time: a seed as it ran before them\n\
                                      (the options below, given after, turn one on again)\n\
                     --business-cards on|off  PEs send business cards (default: from the seed)\n\
                     --signed-cookies on|off  PEs seal cookies with HMAC under a pool key; some\n\
                                      seeds give one PE its own key or none (default: seed)\n\
                     --cookie-tampering P  probability (0..1) that a signed cookie echo is altered\n\
                                      or replaced by another user's on the way (default: seed)\n\
                     --manual-failover SHARE  share (0..1) of sessions in manual failover mode\n\
                     --requested-failovers SECS|off  mean time between failovers the application\n\
                                      of a bound session asks for (default: from the seed)\n\
                     --job-interval SECS|off  CalcApp jobs arrive over time with this mean gap\n\
                                      (off: all queued at the session's start; default: seed)\n\
                     --chaos SECS     length of the chaos phase (default: from the seed)\n\
                     --check-every N  scan every handlespace only every N steps (default 1)\n\
                     --mutation M     a deliberate defect the checker must catch:\n\
                                      one-way-enrp, silent-pes, blind-takeover-acks,\n\
                                      lost-probe-answers, reordered-session-start,\n\
                                      duplicated-session-messages,\n\
                                      gateway-fin-from-dead-member,\n\
                                      gateway-probes-through-cut,\n\
                                      gateway-crash-finishes-answers,\n\
                                      gateway-source-only-adds, gateway-slow-refresh,\n\
                                      gateway-restart-keeps-sessions,\n\
                                      gateway-forgets-resets,\n\
                                      calcapp-echo-loses-progress, ignored-business-cards,\n\
                                      foreign-business-cards, unchecked-cookie-seal,\n\
                                      mislabelled-requested-failovers (tests of the checker)\n\
                     --gateway        run the LSNAT gateway core's world instead (clients, data\n\
                                      plane, members that crash, restart and pause, a\n\
                                      network that loses and cuts members off); takes\n\
                                      --seeds, --first, --seed, --trace, --mutation,\n\
                                      --clean-network, --clean-client-network,\n\
                                      --gateway-faults, --gateway-source\n\
                     --clean-network  (--gateway) no loss, jitter or partitions on either side\n\
                                      of the gateway (with --gateway-faults off and\n\
                                      --gateway-source static: a seed as it ran before the\n\
                                      gateway world's network lost and cut)\n\
                     --clean-client-network  (--gateway) no loss, jitter or cuts between the\n\
                                      clients and the gateway\n\
                     --gateway-faults on|off  (--gateway) the gateway itself crashes (process\n\
                                      or host, state lost), restarts and pauses (default:\n\
                                      from the seed)\n\
                     --gateway-source static|rserpool  (--gateway) members from a static list,\n\
                                      or PEs registered with a registrar that the gateway\n\
                                      resolves (default: from the seed)"
                );
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
                println!("{line}");
            }
            total.add(&o.stats);
            if let Some(f) = o.failure {
                println!("FAIL {f}");
                failures.push(f);
            } else if args.seed.is_some() {
                println!("seed {seed}: ok (trace hash {:016x})", o.trace_hash);
            }
            continue;
        }
        let mut cfg = SimConfig::from_seed(seed);
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
            println!("{line}");
        }
        if let (Some(path), Some(bytes)) = (&args.pcap, &o.pcap) {
            if let Err(e) = std::fs::write(path, bytes) {
                eprintln!("rserpool-sim: --pcap {}: {e}", path.display());
                return ExitCode::from(2);
            }
            println!(
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
            println!("FAIL {f}");
            failures.push(f);
        } else if args.seed.is_some() {
            println!("seed {seed}: ok (trace hash {:016x})", o.trace_hash);
        }
    }
    let wall = started.elapsed();
    println!(
        "{} seeds, {} failed; {total}; {:.1} s wall, {:.0} simulated s per wall s",
        seeds.len(),
        failures.len(),
        wall.as_secs_f64(),
        total.simulated.as_secs_f64() / wall.as_secs_f64().max(1e-9)
    );
    for f in &failures {
        println!("  seed {} `{}`: {}", f.seed, f.invariant, f.message);
    }
    if failures.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
