//! `rserpool demo`: the whole system in one process over the TCP mapping on 127.0.0.1 — three
//! registrars sharing one handlespace over ENRP, PingPong pool elements registered at different
//! registrars, two pool users running PingPong sessions with automatic failover and cookies, and
//! the LSNAT gateway (proxy mode) in front of the pool with a plain client behind it. After a
//! few seconds the PE serving the sessions crashes, then a registrar that is home to some PEs
//! crashes; every fact is printed as what it is (selected, bound, reached, failed over, taken
//! over, lost), and a summary table ends the run. The exit status says whether everything
//! behaved as the protocol promises.

mod display;
mod report;
mod users;

use anyhow::{bail, Context, Result};
use clap::Args;
use display::Out;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use report::{check_gateway, print_gateway_receipt, summary};
use rserpool_endpoint::driver::{
    PoolElementHandle, PoolElementServer, PoolUserClient, RegistrarAccess,
};
use rserpool_endpoint::pe::PoolElementConfig;
use rserpool_endpoint::pu::ResolverConfig;
use rserpool_endpoint::server::ServerConfig;
use rserpool_lsnat::core::Protocol;
use rserpool_registrar::driver::{run, DriverConfig, Running};
use rserpool_registrar::enrp::io::EnrpDriverConfig;
use rserpool_registrar::enrp::{EnrpConfig, TakeoverOutcome};
use rserpool_registrar::{AddressScope, Profile, RegistrarConfig};
use rserpool_services::{ServiceConfig, ServiceKind};
use rserpool_transport::{EndpointConfig, TransportChoice};
use rserpool_wire::{
    PoolElementId, PoolHandle, PoolPolicy, RegistrarId, TransportAddress, UserTransport,
};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;
use users::{ClientEnd, Loads, PoolUserResult};

/// Options of `rserpool demo`.
#[derive(Args, Debug, Clone)]
pub struct DemoArgs {
    /// How long the sessions run, crashes included. The PE crashes at a quarter of it, the
    /// registrar at 40 %; waiting for a takeover may make the run longer on a slow machine.
    #[arg(long, default_value = "20s", value_parser = crate::units::duration_arg)]
    pub duration: Duration,
    /// Pool elements (PingPong), spread over the three registrars (2..=32).
    #[arg(long, default_value_t = 4)]
    pub pes: usize,
    /// Seed of the demo's choices: the PEs' loads (and so which PE serves and crashes), the
    /// registrar that crashes, identifiers. [default: random, printed]
    #[arg(long)]
    pub seed: Option<u64>,
    /// Turns the pool users' automatic failover off, to see the demo fail (exit status 1).
    #[arg(long, hide = true)]
    pub without_failover: bool,
}

/// ENRP timers of the demo's registrars: short, so that a dead peer is noticed and taken over
/// within seconds, yet long enough that a loaded machine does not make a live peer look dead.
const PEER_HEARTBEAT_CYCLE: Duration = Duration::from_secs(1);
const PEER_MAX_TIME_LAST_HEARD: Duration = Duration::from_secs(3);
const PEER_MAX_TIME_NO_RESPONSE: Duration = Duration::from_secs(2);
const MENTOR_DISCOVERY_TIMEOUT: Duration = Duration::from_millis(500);
const TAKEOVER_EXPIRY: Duration = Duration::from_secs(10);
/// Generous limits for conditions the demo waits for (a loaded machine is slow, not wrong).
const SETUP_DEADLINE: Duration = Duration::from_secs(30);
const TAKEOVER_DEADLINE: Duration = Duration::from_secs(30);
const FAILOVER_DEADLINE: Duration = Duration::from_secs(20);

/// Runs the demo.
pub fn demo(args: DemoArgs) -> Result<()> {
    if !(2..=32).contains(&args.pes) {
        bail!("pes: {} is not in 2..=32", args.pes);
    }
    if args.duration < Duration::from_secs(4) {
        bail!("duration: must be at least 4s");
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let result = rt.block_on(run_demo(args));
    rt.shutdown_timeout(Duration::from_secs(2));
    result
}

struct Registrar {
    name: String,
    running: Running,
    task: tokio::task::JoinHandle<()>,
    alive: bool,
}

impl Registrar {
    fn id(&self) -> RegistrarId {
        self.running.registrar_id
    }
    fn metrics(&self) -> rserpool_registrar::Metrics {
        self.running.metrics_now()
    }
}

struct Pe {
    id: PoolElementId,
    home_index: usize,
    policy: PoolPolicy,
    handle: Option<PoolElementHandle>,
    server: Option<PoolElementServer>,
}

async fn start_registrar(
    name: String,
    id: RegistrarId,
    mentor: Option<SocketAddr>,
    seed: u64,
) -> Result<Registrar> {
    let mut core = RegistrarConfig::new(Profile::Rsplib);
    core.registrar_id = id;
    core.min_address_scope = AddressScope::Loopback;
    core.announce = None;
    core.seed = Some(seed);
    core.keep_alive_interval = Duration::from_secs(1);
    core.keep_alive_timeout = Duration::from_secs(2);
    let mut config = DriverConfig::new(core);
    config.transport = TransportChoice::Tcp;
    config.asap_listen = vec!["127.0.0.1:0".parse()?];
    let mut e = EnrpConfig::new(Profile::Rsplib);
    e.seed = Some(seed);
    e.peer_heartbeat_cycle = PEER_HEARTBEAT_CYCLE;
    e.max_time_last_heard = PEER_MAX_TIME_LAST_HEARD;
    e.max_time_no_response = PEER_MAX_TIME_NO_RESPONSE;
    e.mentor_discovery_timeout = MENTOR_DISCOVERY_TIMEOUT;
    e.takeover_expiry = TAKEOVER_EXPIRY;
    e.static_peers = mentor.map(|m| vec![vec![m]]).unwrap_or_default();
    config.enrp = Some(EnrpDriverConfig {
        core: e,
        listen: vec!["127.0.0.1:0".parse()?],
        announce: None,
        announce_interface: None,
        announce_ttl: 1,
    });
    let (tx, rx) = tokio::sync::oneshot::channel();
    let task = tokio::spawn(async move {
        if let Err(e) = run(config, tx, std::future::pending()).await {
            tracing::error!(error = %e, "demo registrar failed");
        }
    });
    let running = rx
        .await
        .with_context(|| format!("starting registrar {name}"))?;
    Ok(Registrar {
        name,
        running,
        task,
        alive: true,
    })
}

/// Waits until `f` holds, polling; false when `deadline` passed first.
async fn until(deadline: Duration, mut f: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + deadline;
    loop {
        if f() {
            return true;
        }
        if Instant::now() >= end {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

fn pct(p: &PoolPolicy) -> String {
    p.load()
        .map(|l| format!("{:.0}%", 100.0 * f64::from(l) / f64::from(u32::MAX)))
        .unwrap_or_else(|| "-".into())
}

fn ms(d: Duration) -> String {
    format!("{:.0} ms", d.as_secs_f64() * 1e3)
}

async fn run_demo(args: DemoArgs) -> Result<()> {
    let seed = args.seed.unwrap_or_else(|| rand::rng().random());
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let out = Out::new();
    let pool = PoolHandle::from("PingPongPool");
    let n = args.pes;
    out.line(format!(
        "rserpool demo (seed {seed}; run again with --seed {seed} for the same choices)"
    ));
    out.line(format!(
        "In this process, over the TCP mapping on 127.0.0.1: 3 registrars sharing one handlespace over\n\
         ENRP, {n} PingPong pool elements, 2 pool users with automatic failover and cookies, and the\n\
         LSNAT gateway (proxy mode) in front of the pool with a plain client behind it. Then the PE\n\
         serving the sessions crashes, and later a registrar that is home to some PEs.\n\
         \"Crash\" means: the tasks that own its sockets are aborted, so its connections close\n\
         without an ASAP deregistration or any ENRP goodbye, as when a process is killed.\n\
         ENRP timers: PRESENCE every {}, a peer silent for {} is asked, dead after {} more.\n",
        crate::units::human(PEER_HEARTBEAT_CYCLE),
        crate::units::human(PEER_MAX_TIME_LAST_HEARD),
        crate::units::human(PEER_MAX_TIME_NO_RESPONSE),
    ));
    let (phase_tx, phase_rx) = tokio::sync::watch::channel("starting".to_string());
    let progress = tokio::spawn(out.clone().run_progress(phase_rx));
    let result = scenario(&args, seed, &mut rng, &out, &pool, &phase_tx).await;
    progress.abort();
    out.clear();
    result
}

#[allow(clippy::too_many_lines)]
async fn scenario(
    args: &DemoArgs,
    seed: u64,
    rng: &mut rand::rngs::StdRng,
    out: &Out,
    pool: &PoolHandle,
    phase: &tokio::sync::watch::Sender<String>,
) -> Result<()> {
    let n = args.pes;
    let mut problems: Vec<String> = Vec::new();

    // 1. Three registrars: R1 first, R2 and R3 with R1 as their static peer (and mentor).
    let _ = phase.send("registrars".into());
    let base: u32 = rng.random_range(0x1000..0xf000);
    let mut regs: Vec<Registrar> = Vec::new();
    for i in 0..3u32 {
        let mentor = regs.first().map(|r: &Registrar| r.running.enrp_addrs[0]);
        let r = start_registrar(
            format!("R{}", i + 1),
            RegistrarId(base * 0x10 + i + 1),
            mentor,
            seed ^ u64::from(i),
        )
        .await?;
        out.fact(format!(
            "registrar {} (ID {}) serves ASAP on {} and ENRP on {}{}",
            r.name,
            r.id(),
            r.running.asap_addrs[0],
            r.running.enrp_addrs[0],
            match mentor {
                Some(m) => format!(", static peer {m}"),
                None => String::new(),
            }
        ));
        regs.push(r);
    }
    out.progress.registrars_alive.store(3, Ordering::Relaxed);
    let peered = until(SETUP_DEADLINE, || {
        regs.iter()
            .all(|r| r.metrics().enrp.as_ref().is_some_and(|e| e.peers == 2))
    })
    .await;
    if !peered {
        bail!("the registrars did not all become ENRP peers within {SETUP_DEADLINE:?}");
    }
    out.fact("every registrar has the other two as ENRP peers (PRESENCE, LIST_RESPONSE)");

    // 2. PEs, each registered at one registrar (PE i at R(i mod 3)), Least Used with loads from
    // the seed. Each PE knows only its home registrar (no announces): when that registrar dies
    // it cannot re-register elsewhere by itself; only an ENRP takeover keeps it in the pool.
    let _ = phase.send("pool elements".into());
    let mut loads: Vec<u32> = (0..n).map(|i| (10 + 80 * i / n) as u32).collect();
    loads.shuffle(rng);
    let services = ServiceConfig::default();
    let mut pes: Vec<Pe> = Vec::new();
    for (i, load) in loads.iter().enumerate() {
        let home = i % 3;
        let server = PoolElementServer::start(
            EndpointConfig::listening(TransportChoice::Tcp, &["127.0.0.1:0".parse()?]),
            ServerConfig::default(),
            services
                .server(ServiceKind::PingPong)
                .context("the PingPong service")?,
        )
        .await
        .context("starting a PE's session side")?;
        let addr = server.local_addrs()[0];
        let policy = PoolPolicy::LeastUsed {
            load: (u64::from(u32::MAX) * u64::from(*load) / 100) as u32,
        };
        let mut config = PoolElementConfig::new(
            pool.clone(),
            UserTransport::Address(TransportAddress::tcp(addr.port(), addr.ip())),
            policy.clone(),
        );
        config.reregistration_interval = Duration::from_secs(30);
        let mut access =
            RegistrarAccess::single(regs[home].running.asap_addrs[0], TransportChoice::Tcp);
        // A new home registrar connects to this address after a takeover.
        access.endpoint.local_addrs = vec!["127.0.0.1:0".parse()?];
        let mut handle = PoolElementHandle::start(config, access)
            .await
            .context("starting a PE's registration")?;
        if !handle.wait_registered(SETUP_DEADLINE).await {
            bail!(
                "a PE did not get registered at {} within {SETUP_DEADLINE:?}",
                regs[home].name
            );
        }
        out.fact(format!(
            "PE {} registered at {} (its home): PingPong on {addr}, policy {policy}",
            handle.id(),
            regs[home].name
        ));
        pes.push(Pe {
            id: handle.id(),
            home_index: home,
            policy,
            handle: Some(handle),
            server: Some(server),
        });
    }
    out.progress.pes_alive.store(n as u64, Ordering::Relaxed);
    let all_known = until(SETUP_DEADLINE, || {
        regs.iter().all(|r| r.metrics().pool_elements == n as u64)
    })
    .await;
    if !all_known {
        bail!("not every registrar listed the {n} PEs within {SETUP_DEADLINE:?}");
    }
    out.fact(format!(
        "every registrar lists all {n} PEs (ENRP HANDLE_UPDATE): a PU may resolve at any of them"
    ));
    let loads_by_id: Loads = Arc::new(pes.iter().map(|p| (p.id, p.policy.clone())).collect());

    // 3. The gateway in front of the pool.
    let _ = phase.send("gateway".into());
    let mut gw_config = rserpool_lsnat::Config::from_overrides(&rserpool_lsnat::Overrides {
        listen: vec!["tcp:127.0.0.1:0".into()],
        pool_handle: Some(pool.to_string()),
        registrars: regs
            .iter()
            .map(|r| r.running.asap_addrs[0].to_string())
            .collect(),
        transport: Some("tcp".into()),
        ..rserpool_lsnat::Overrides::default()
    })
    .map_err(|e| anyhow::anyhow!("gateway configuration: {e}"))?;
    if let Some(r) = gw_config.rserpool.as_mut() {
        r.refresh = Duration::from_millis(200);
    }
    // Active TCP connect probes: the gateway's own evidence of a member's death (the
    // registrar's removal of a PE says only that it left the pool, not that it died).
    gw_config.probe.kind = rserpool_lsnat::config::ProbeKind::Tcp;
    gw_config.probe.interval = Duration::from_millis(250);
    gw_config.probe.timeout = Duration::from_secs(2);
    gw_config.core.health.liveness.active_probes = true;
    gw_config.core.health.liveness.fall = 2;
    let gw = rserpool_lsnat::start(gw_config.clone(), rserpool_lsnat::member_source(&gw_config))
        .await
        .context("starting the gateway")?;
    let gw_addr = gw
        .listener(Protocol::Tcp)
        .context("the gateway's listener")?;
    let members_in = until(SETUP_DEADLINE, || {
        gw.status()
            .members
            .iter()
            .filter(|m| !m.removed && m.state != "dead")
            .count()
            == n
    })
    .await;
    if !members_in {
        bail!("the gateway did not list the {n} PEs as members within {SETUP_DEADLINE:?}");
    }
    out.fact(format!(
        "gateway: virtual address {gw_addr} (proxy mode), members = the {n} PEs of {pool} as the \
         registrars resolve it, chosen by the pool's own policy"
    ));

    // 4. Two pool users and the gateway's client.
    let _ = phase.send("sessions".into());
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let mut pu_tasks = Vec::new();
    for u in 0..2usize {
        let mut access =
            RegistrarAccess::single(regs[u].running.asap_addrs[0], TransportChoice::Tcp);
        access.registrars = (0..3)
            .map(|k| vec![regs[(u + k) % 3].running.asap_addrs[0]])
            .collect();
        let client = PoolUserClient::start(ResolverConfig::default(), access)
            .await
            .context("starting a pool user's resolver")?;
        pu_tasks.push(tokio::spawn(users::pool_user(
            format!("PU{}", u + 1),
            client,
            pool.clone(),
            !args.without_failover,
            Duration::from_millis(200),
            out.clone(),
            loads_by_id.clone(),
            stop_rx.clone(),
            Duration::from_secs(15),
        )));
    }
    let gw_clients = tokio::spawn(users::gateway_clients(
        gw_addr,
        2,
        out.clone(),
        stop_rx.clone(),
    ));
    let started = out.elapsed();
    // The first gateway session's receipts, once it ended.
    let first_gw = until(SETUP_DEADLINE, || !gw.status().recent_outcomes.is_empty()).await;
    if first_gw {
        if let Some(r) = gw.status().recent_outcomes.last() {
            print_gateway_receipt(out, "first gateway session", r, &loads_by_id);
        }
    }

    // 5. The PE serving the sessions crashes.
    let pe_crash_at = started + args.duration / 4;
    sleep_until_elapsed(out, pe_crash_at).await;
    let _ = phase.send("PE crash".into());
    let serving = least_loaded(&pes);
    // Wait (briefly) until a gateway session is established on it, so that one is there to
    // lose its member.
    let victim_key = format!("pe:{}", pes[serving].id);
    until(Duration::from_secs(10), || {
        gw.status().bindings.iter().any(|b| {
            b.receipt
                .bound
                .as_ref()
                .is_some_and(|x| *x.key == *victim_key)
                && b.receipt.reached_ms.is_some()
        })
    })
    .await;
    let victim = &mut pes[serving];
    let victim_id = victim.id;
    let victim_home = victim.home_index;
    let gw_on_victim = gw
        .status()
        .bindings
        .iter()
        .filter(|b| {
            b.receipt
                .bound
                .as_ref()
                .is_some_and(|x| *x.key == *victim_key)
        })
        .count();
    out.fact(format!(
        "CRASH: PE {victim_id} (the least used, serving the pool users and {gw_on_victim} gateway \
         session(s)) — its session side and its association to {} are aborted, no deregistration",
        regs[victim_home].name
    ));
    if let Some(s) = victim.server.take() {
        s.stop();
    }
    if let Some(h) = victim.handle.take() {
        h.abort().await;
    }
    let pe_crashed = Instant::now();
    out.progress.pes_alive.fetch_sub(1, Ordering::Relaxed);
    let removed = until(FAILOVER_DEADLINE, || {
        regs.iter()
            .all(|r| r.metrics().pool_elements == (n - 1) as u64)
    })
    .await;
    if removed {
        out.fact(format!(
            "the registrars removed PE {victim_id} after {} ({} saw its association lost; the \
             others got DEL_PE over ENRP)",
            ms(pe_crashed.elapsed()),
            regs[victim_home].name
        ));
    } else {
        problems.push(format!(
            "the registrars did not all remove the crashed PE {victim_id} within {FAILOVER_DEADLINE:?}"
        ));
    }
    let judged = until(FAILOVER_DEADLINE, || {
        gw.status()
            .members
            .iter()
            .all(|m| m.key != victim_key || m.state == "dead")
    })
    .await;
    if judged {
        let removed = gw
            .status()
            .members
            .iter()
            .all(|m| m.key != victim_key || m.removed);
        out.fact(format!(
            "gateway: member {victim_key} judged dead by its own probes ({} after the crash){}; \
             its bound sessions end as member_lost, no new session is bound to it",
            ms(pe_crashed.elapsed()),
            if removed {
                "; the registrar no longer lists it either"
            } else {
                ""
            }
        ));
    } else {
        problems.push(format!(
            "the gateway did not judge the crashed PE dead within {FAILOVER_DEADLINE:?}"
        ));
    }

    // 6. A registrar that is home to some live PEs crashes.
    let reg_crash_at = started + args.duration * 2 / 5;
    sleep_until_elapsed(out, reg_crash_at).await;
    let _ = phase.send("registrar crash".into());
    let candidates: Vec<usize> = (0..3)
        .filter(|k| pes.iter().any(|p| p.handle.is_some() && p.home_index == *k))
        .collect();
    let dead_reg = candidates[rng.random_range(0..candidates.len())];
    let dead_id = regs[dead_reg].id();
    let orphans: Vec<PoolElementId> = pes
        .iter()
        .filter(|p| p.handle.is_some() && p.home_index == dead_reg)
        .map(|p| p.id)
        .collect();
    let before: HashMap<usize, u64> = (0..3)
        .map(|k| {
            (
                k,
                regs[k]
                    .metrics()
                    .enrp
                    .map(|e| e.takeovers_of(TakeoverOutcome::Won))
                    .unwrap_or(0),
            )
        })
        .collect();
    let enrp_before: Vec<Option<rserpool_registrar::enrp::EnrpMetrics>> =
        regs.iter().map(|r| r.metrics().enrp).collect();
    regs[dead_reg].task.abort();
    regs[dead_reg].alive = false;
    let reg_crashed = Instant::now();
    out.progress
        .registrars_alive
        .fetch_sub(1, Ordering::Relaxed);
    out.fact(format!(
        "CRASH: registrar {} (ID {dead_id}), home of PE(s) {} — its tasks are aborted: ASAP and \
         ENRP connections close, no goodbye. Its PEs know no other registrar.",
        regs[dead_reg].name,
        orphans
            .iter()
            .map(|p| p.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    ));
    let mut winner: Option<usize> = None;
    let took = until(TAKEOVER_DEADLINE, || {
        for k in 0..3 {
            if k == dead_reg {
                continue;
            }
            let won = regs[k]
                .metrics()
                .enrp
                .map(|e| e.takeovers_of(TakeoverOutcome::Won))
                .unwrap_or(0);
            if won > before[&k] {
                winner = Some(k);
                return true;
            }
        }
        false
    })
    .await;
    let takeover_time = reg_crashed.elapsed();
    let mut rehome_times: Vec<(PoolElementId, Duration)> = Vec::new();
    match winner {
        Some(w) if took => {
            out.fact(format!(
                "TAKEOVER: {} (ID {}) took over {}'s PEs {} after the crash; it sends each PE an \
                 ENDPOINT_KEEP_ALIVE with H=1. ENRP since the crash, as each survivor counted it:",
                regs[w].name,
                regs[w].id(),
                regs[dead_reg].name,
                ms(takeover_time)
            ));
            for (k, r) in regs.iter().enumerate().filter(|(_, r)| r.alive) {
                let (Some(now), Some(then)) = (r.metrics().enrp, enrp_before[k].as_ref()) else {
                    continue;
                };
                let d = |f: &dyn Fn(&rserpool_registrar::enrp::EnrpMetrics) -> u64| {
                    f(&now).saturating_sub(f(then))
                };
                use rserpool_wire::enrp::EnrpMessageType as T;
                out.fact(format!(
                    "  {}: peer found dead {}, INIT_TAKEOVER sent {} received {}, \
                     INIT_TAKEOVER_ACK sent {} received {}, TAKEOVER_SERVER sent {} received {}, \
                     takeovers won {} lost {}",
                    r.name,
                    d(&|m| m.peers_dead),
                    d(&|m| m.sent_of(T::InitTakeover)),
                    d(&|m| m.received_of(T::InitTakeover)),
                    d(&|m| m.sent_of(T::InitTakeoverAck)),
                    d(&|m| m.received_of(T::InitTakeoverAck)),
                    d(&|m| m.sent_of(T::TakeoverServer)),
                    d(&|m| m.received_of(T::TakeoverServer)),
                    d(&|m| m.takeovers_of(TakeoverOutcome::Won)),
                    d(&|m| m.takeovers_of(TakeoverOutcome::Lost)),
                ));
                if d(&|m| m.takeovers_of(TakeoverOutcome::Lost)) > 0 {
                    out.fact(format!(
                        "  ({} started a takeover too and lost the arbitration: under the rsplib \
                         profile the lower registrar ID wins, RFC 5353 §3.5.1)",
                        r.name
                    ));
                }
            }
            let new_id = regs[w].id();
            let mut pending: Vec<PoolElementId> = orphans.clone();
            let rehomed = until(TAKEOVER_DEADLINE, || {
                pending.retain(|id| {
                    let st = pes
                        .iter()
                        .find(|p| p.id == *id)
                        .and_then(|p| p.handle.as_ref())
                        .map(|h| h.status());
                    match st {
                        Some(s) if s.home == Some(new_id) && s.new_homes >= 1 => {
                            rehome_times.push((*id, reg_crashed.elapsed()));
                            false
                        }
                        _ => true,
                    }
                });
                pending.is_empty()
            })
            .await;
            for (id, t) in &rehome_times {
                out.fact(format!(
                    "PE {id} answered the H=1 keep-alive: its home is now {} ({} after the crash)",
                    regs[w].name,
                    ms(*t)
                ));
            }
            if !rehomed {
                problems.push(format!(
                    "PE(s) {} did not adopt the new home {} within {TAKEOVER_DEADLINE:?}",
                    pending
                        .iter()
                        .map(|p| p.to_string())
                        .collect::<Vec<_>>()
                        .join(", "),
                    regs[w].name
                ));
            }
            let adopted = regs[w].metrics().adopted;
            out.fact(format!(
                "{} counts {adopted} PE(s) adopted; the pool still has {} PEs at every surviving registrar",
                regs[w].name,
                regs.iter()
                    .filter(|r| r.alive)
                    .map(|r| r.metrics().pool_elements.to_string())
                    .collect::<Vec<_>>()
                    .join("/")
            ));
        }
        _ => problems.push(format!(
            "no surviving registrar took over {} within {TAKEOVER_DEADLINE:?}",
            regs[dead_reg].name
        )),
    }
    let still_listed = until(SETUP_DEADLINE, || {
        regs.iter()
            .filter(|r| r.alive)
            .all(|r| r.metrics().pool_elements == (n - 1) as u64)
    })
    .await;
    if !still_listed {
        problems.push(format!(
            "the surviving registrars do not list the {} live PEs",
            n - 1
        ));
    }

    // 7. Run to the end, then let every Ping be answered and the sessions close.
    sleep_until_elapsed(out, started + args.duration).await;
    let _ = phase.send("ending".into());
    let _ = stop_tx.send(true);
    out.fact("time is up: the users stop sending and wait for their last answers");
    let mut pus: Vec<PoolUserResult> = Vec::new();
    for t in pu_tasks {
        pus.push(t.await.context("a pool user's task")?);
    }
    let gw_sessions = gw_clients.await.context("the gateway clients")?;
    // The gateway's receipts of those sessions (ended ones are kept, newest first).
    let mut receipts = HashMap::new();
    until(Duration::from_secs(10), || {
        let st = gw.status();
        receipts = st
            .recent_outcomes
            .iter()
            .map(|r| (r.client, r.clone()))
            .collect();
        gw_sessions
            .iter()
            .filter(|s| !matches!(s.end, ClientEnd::Failed(_)))
            .all(|s| receipts.contains_key(&s.client))
    })
    .await;
    let gw_metrics = gw.status();
    gw.shutdown().await;
    for r in regs.iter().filter(|r| r.alive) {
        r.task.abort();
    }
    for p in pes.iter_mut() {
        if let Some(s) = p.server.take() {
            s.stop();
        }
        if let Some(h) = p.handle.take() {
            h.abort().await;
        }
    }
    let _ = gw_metrics;

    // 8. Check and sum up.
    let gw_report = check_gateway(out, &gw_sessions, &receipts, &victim_key, &mut problems);
    for pu in &pus {
        if let Some(f) = &pu.failed {
            problems.push(format!("{}: {f}", pu.name));
        }
        if pu.answered_twice > 0 {
            problems.push(format!(
                "{}: {} Ping(s) answered twice",
                pu.name, pu.answered_twice
            ));
        }
        if pu.gaps > 0 {
            problems.push(format!(
                "{}: {} gap(s) in the reply numbers (a cookie was not honoured)",
                pu.name, pu.gaps
            ));
        }
        if pu.answered != pu.sent {
            problems.push(format!(
                "{}: {} Pings sent, {} answered",
                pu.name, pu.sent, pu.answered
            ));
        }
        if pu.failovers.iter().any(|f| !f.record.with_cookie) {
            problems.push(format!("{}: a failover without a cookie", pu.name));
        }
    }
    if pus.iter().all(|p| p.failovers.is_empty()) {
        problems.push(format!(
            "no pool user failed over, although PE {victim_id} that served them crashed"
        ));
    }
    summary(
        out,
        &pus,
        &gw_report,
        took.then_some(takeover_time),
        &rehome_times,
        orphans.len(),
    );
    if problems.is_empty() {
        out.line(
            "\nRESULT: everything behaved as the protocol promises — every Ping answered exactly \
             once across the failover, the dead registrar's PEs were taken over and re-homed, and \
             the gateway's receipts match what its client saw.",
        );
        Ok(())
    } else {
        out.line("\nRESULT: NOT as the protocol promises:");
        for p in &problems {
            out.line(format!("  - {p}"));
        }
        bail!("demo: {} problem(s), listed above", problems.len())
    }
}

fn least_loaded(pes: &[Pe]) -> usize {
    (0..pes.len())
        .filter(|i| pes[*i].handle.is_some())
        .min_by_key(|i| pes[*i].policy.load().unwrap_or(u32::MAX))
        .unwrap_or(0)
}

async fn sleep_until_elapsed(out: &Out, at: Duration) {
    let now = out.elapsed();
    if at > now {
        tokio::time::sleep(at - now).await;
    }
}
