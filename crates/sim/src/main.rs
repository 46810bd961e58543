//! `rserpool-sim`: runs many seeds and prints a summary, or replays one seed with its trace.
//!
//! ```text
//! rserpool-sim [--seeds N] [--first S] [--faults registrar,pe,partition,pause|all|none]
//!              [--registrars N] [--pes N] [--pus N] [--pools N] [--sessions N]
//!              [--failure-after N] [--calcapp on|off] [--max-jobs N]
//!              [--seed S] [--trace] [--pcap FILE [--pcap-limit BYTES]]
//!              [--transports sctp|per-host|per-registrar] [--tcp-share F] [--multihomed F]
//!              [--hostile N] [--authenticated on|off] [--restarts on|off] [--path-cuts on|off]
//!              [--net-modes off]
//! ```

use rserpool_sim::{
    run, run_gateway, Faults, GatewayConfig, Mutation, SimConfig, Stats, Transports,
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
    pcap: Option<std::path::PathBuf>,
    pcap_limit: u64,
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
        pcap: None,
        pcap_limit: DEFAULT_PCAP_LIMIT,
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
        let share = |name: &str, v: String| match v.parse::<f64>() {
            Ok(f) if (0.0..=1.0).contains(&f) => Ok(f),
            _ => Err(format!("{name}: `{v}` is not a share between 0 and 1")),
        };
        let on_off = |name: &str, v: String| match v.as_str() {
            "on" => Ok(true),
            "off" => Ok(false),
            _ => Err(format!("{name}: `{v}` is neither on nor off")),
        };
        match flag.as_str() {
            "--seeds" => a.seeds = num("--seeds", value("--seeds")?)?,
            "--first" => a.first = num("--first", value("--first")?)?,
            "--seed" => a.seed = Some(num("--seed", value("--seed")?)?),
            "--trace" => a.trace = true,
            "--gateway" => a.gateway = true,
            "--clean-network" => a.clean_network = true,
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
                    "calcapp-echo-loses-progress" => Mutation::CalcAppEchoLosesProgress,
                    "hostile-as-owner" => Mutation::HostileAsOwner,
                    "no-path-failover" => Mutation::NoPathFailover,
                    "silent-restart" => Mutation::SilentRestart,
                    other => {
                        return Err(format!(
                            "unknown mutation `{other}` (one-way-enrp, silent-pes, blind-takeover-acks, lost-probe-answers, reordered-session-start, duplicated-session-messages, gateway-fin-from-dead-member, gateway-probes-through-cut, calcapp-echo-loses-progress, hostile-as-owner, no-path-failover, silent-restart)"
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
                     --faults LIST    registrar,pe,partition,pause,path | all | none (default: from\n\
                                      the seed; path cuts need multi-homed hosts)\n\
                     --registrars N, --pes N, --pus N   sizes (default: from the seed)\n\
                     --sessions N     PingPong sessions per PU (default: from the seed; 0 runs a\n\
                                      seed as it ran before sessions were simulated)\n\
                     --failure-after N  PingPong PEs abort a session after N replies (0 never)\n\
                     --pools N        pools the PEs are spread over (default: from the seed)\n\
                     --calcapp on|off the last pool runs CalcApp jobs (default: from the seed;\n\
                                      off runs a seed as it ran before CalcApp was simulated)\n\
                     --max-jobs N     jobs a CalcApp PE runs at once (default: from the seed)\n\
                     --chaos SECS     length of the chaos phase (default: from the seed)\n\
                     --check-every N  scan every handlespace only every N steps (default 1)\n\
                     --mutation M     a deliberate defect the checker must catch:\n\
                                      one-way-enrp, silent-pes, blind-takeover-acks,\n\
                                      lost-probe-answers, reordered-session-start,\n\
                                      duplicated-session-messages,\n\
                                      gateway-fin-from-dead-member,\n\
                                      gateway-probes-through-cut,\n\
                                      calcapp-echo-loses-progress, hostile-as-owner,\n\
                                      no-path-failover, silent-restart (tests of the checker)\n\
                     --transports M   sctp | per-host | per-registrar: which hosts lack SCTP and\n\
                                      use the TCP mapping (default: from the seed)\n\
                     --tcp-share F    share of hosts (per-host) or registrars (per-registrar,\n\
                                      their clients follow them) without SCTP, 0..1\n\
                     --multihomed F   share of SCTP hosts with a second address, 0..1\n\
                     --hostile N      hostile hosts attacking the registrars (default: from the seed)\n\
                     --authenticated on|off  registrars check TLS identities (access rules)\n\
                     --restarts on|off  peers see a restarted host's kernel (SCTP_RESTART,\n\
                                      ABORT, RST) rather than only their timeout\n\
                     --path-cuts on|off  cut one address of a multi-homed host now and then\n\
                                      (keeps the seed's other faults)\n\
                     --net-modes off  none of the last six (a seed as it ran before them)\n\
                     --gateway        run the LSNAT gateway core's world instead (clients, data\n\
                                      plane, members that crash, restart and pause, a\n\
                                      network that loses and cuts members off); takes\n\
                                      --seeds, --first, --seed, --trace, --mutation,\n\
                                      --clean-network\n\
                     --clean-network  (--gateway) no loss, jitter or partitions: a seed as it\n\
                                      ran before the gateway world's network lost and cut"
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
                cfg.loss = 0.0;
                cfg.jitter = Duration::ZERO;
                cfg.partitions = false;
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
