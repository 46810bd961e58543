//! `rserpool bench`: a load generator that speaks ASAP to any registrar (rserpool's or RSPLIB's)
//! over SCTP or TCP, and reports the handle resolutions and registrations per second it sustains
//! with a pool of a given size.

use anyhow::{anyhow, bail, Context, Result};
use clap::Args;
use rserpool_transport::{AssociationId, Endpoint, EndpointConfig, Event, TransportChoice};
use rserpool_wire::asap::{self, AsapMessage};
use rserpool_wire::{
    Codec, PoolElement, PoolElementId, PoolHandle, PoolPolicy, RegistrarId, RegistrationLife,
    TransportAddress, TransportUse, UserTransport,
};
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Options of `rserpool bench`.
#[derive(Args, Debug)]
pub struct BenchArgs {
    /// The registrar to load.
    #[arg(long, value_name = "ADDR:PORT")]
    registrar: SocketAddr,
    /// Transport: sctp or tcp (the TCP mapping).
    #[arg(long, default_value = "sctp", value_parser = ["sctp", "tcp"])]
    transport: String,
    /// PEs registered in the pool before measuring.
    #[arg(long, default_value_t = 1000)]
    pes: u32,
    /// The pool handle used.
    #[arg(long, default_value = "BenchPool")]
    pool: String,
    /// User-transport address the PEs register with; must be an address of this host that the
    /// registrar accepts (RSPLIB's registrar refuses loopback user addresses).
    #[arg(long, default_value = "127.0.0.1")]
    pe_address: IpAddr,
    /// Associations that send requests in parallel.
    #[arg(long, default_value_t = 4)]
    associations: usize,
    /// Requests outstanding per association.
    #[arg(long, default_value_t = 16)]
    window: usize,
    /// Seconds to measure each workload (after one second of warm-up).
    #[arg(long, default_value_t = 5.0)]
    seconds: f64,
    /// Workloads, in order: resolve, register.
    #[arg(long, value_delimiter = ',', default_value = "resolve,register")]
    workloads: Vec<String>,
    /// Process id of the registrar (on this host): also report the CPU time it used during the
    /// measurement, and requests served per second of its CPU time, which does not depend on
    /// how fast this load generator is.
    #[arg(long)]
    registrar_pid: Option<u32>,
}

/// CPU time a process has used, in user space and in the kernel.
#[derive(Debug, Clone, Copy)]
struct CpuTime {
    user: Duration,
    system: Duration,
}

impl CpuTime {
    fn total(&self) -> Duration {
        self.user + self.system
    }
}

/// CPU time a process has used, from /proc (Linux; USER_HZ is 100).
fn cpu_time(pid: u32) -> Option<CpuTime> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which is in parentheses and may hold spaces).
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(CpuTime {
        user: Duration::from_millis(utime * 10),
        system: Duration::from_millis(stime * 10),
    })
}

struct Conn {
    endpoint: Endpoint,
    id: AssociationId,
}

async fn connect(args: &BenchArgs) -> Result<Conn> {
    let choice = if args.transport == "tcp" {
        TransportChoice::Tcp
    } else {
        TransportChoice::Sctp
    };
    let mut endpoint = Endpoint::bind(EndpointConfig::new(choice))
        .await
        .context("binding a client endpoint")?;
    let id = endpoint.handle().connect(&[args.registrar]).await?;
    loop {
        match endpoint.next_event().await {
            Some(Event::AssociationUp { id: up, .. }) if up == id => {
                return Ok(Conn { endpoint, id })
            }
            Some(Event::AssociationDown { reason, .. }) => {
                bail!("cannot reach the registrar at {}: {reason}", args.registrar)
            }
            Some(_) => {}
            None => bail!("endpoint closed"),
        }
    }
}

fn pe(args: &BenchArgs, i: u32) -> PoolElement {
    PoolElement {
        id: PoolElementId(0x1000_0000 + i),
        home_registrar: RegistrarId(0),
        registration_life: RegistrationLife::Finite(Duration::from_secs(600)),
        user_transport: UserTransport::Address(TransportAddress::sctp(
            10_000 + (i % 50_000) as u16,
            TransportUse::DataPlusControl,
            vec![args.pe_address],
        )),
        policy: PoolPolicy::RoundRobin,
        asap_transport: None,
    }
}

/// What a workload sends and what counts as its answer.
#[derive(Clone, Copy, PartialEq)]
enum Workload {
    Resolve,
    Register,
}

/// Keeps `window` requests outstanding on one association until `stop`; counts good answers.
async fn drive(
    args: &BenchArgs,
    mut conn: Conn,
    workload: Workload,
    slice: (u32, u32),
    done: Arc<AtomicU64>,
    bad: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
) -> Result<()> {
    let codec = Codec::default();
    let pool = PoolHandle::from(args.pool.as_str());
    let handle = conn.endpoint.handle();
    let mut next = slice.0;
    let request = |next: &mut u32| -> Vec<u8> {
        let m = match workload {
            Workload::Resolve => AsapMessage::HandleResolution(asap::HandleResolution {
                subscribe: false,
                pool_handle: pool.clone(),
                option: None,
            }),
            Workload::Register => {
                let i = *next;
                *next = if *next + 1 >= slice.1 {
                    slice.0
                } else {
                    *next + 1
                };
                AsapMessage::Registration(asap::Registration {
                    pool_handle: pool.clone(),
                    pool_element: pe(args, i),
                })
            }
        };
        codec.encode(&m).expect("valid request")
    };
    for _ in 0..args.window {
        handle.send(conn.id, 11, 0, request(&mut next)).await?;
    }
    while !stop.load(Ordering::Relaxed) {
        let ev = tokio::time::timeout(Duration::from_secs(5), conn.endpoint.next_event())
            .await
            .map_err(|_| anyhow!("no answer from the registrar for 5 s"))?;
        match ev {
            Some(Event::Message { data, .. }) => {
                let good = match codec.decode::<AsapMessage>(&data).map(|d| d.message) {
                    Ok(AsapMessage::HandleResolutionResponse(r)) => {
                        workload == Workload::Resolve && !r.pool_elements.is_empty()
                    }
                    Ok(AsapMessage::RegistrationResponse(r)) => {
                        workload == Workload::Register && !r.reject
                    }
                    Ok(AsapMessage::EndpointKeepAlive(k)) => {
                        if let Some(id) = k.pe_id {
                            let ack =
                                AsapMessage::EndpointKeepAliveAck(asap::EndpointKeepAliveAck {
                                    pool_handle: k.pool_handle,
                                    pe_id: id,
                                });
                            handle.send(conn.id, 11, 0, codec.encode(&ack)?).await?;
                        }
                        continue;
                    }
                    _ => false,
                };
                if good {
                    done.fetch_add(1, Ordering::Relaxed);
                } else {
                    bad.fetch_add(1, Ordering::Relaxed);
                }
                handle.send(conn.id, 11, 0, request(&mut next)).await?;
            }
            Some(Event::AssociationDown { reason, .. }) => bail!("association lost: {reason}"),
            Some(_) => {}
            None => bail!("endpoint closed"),
        }
    }
    Ok(())
}

/// Rate of good answers, unexpected answers, and the registrar's CPU time in the window.
async fn measure(
    args: &Arc<BenchArgs>,
    workload: Workload,
) -> Result<(f64, u64, Option<(CpuTime, u64)>)> {
    let done = Arc::new(AtomicU64::new(0));
    let bad = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    let n = args.associations.max(1) as u32;
    let per = args.pes.div_ceil(n).max(1);
    for k in 0..n {
        let conn = connect(args).await?;
        let slice = (
            (k * per).min(args.pes - 1),
            ((k + 1) * per).min(args.pes).max(k * per + 1),
        );
        let (a, d, b, s) = (args.clone(), done.clone(), bad.clone(), stop.clone());
        tasks.push(tokio::spawn(async move {
            drive(&a, conn, workload, slice, d, b, s).await
        }));
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let cpu0 = args.registrar_pid.and_then(cpu_time);
    let (start_n, start) = (done.load(Ordering::Relaxed), Instant::now());
    tokio::time::sleep(Duration::from_secs_f64(args.seconds)).await;
    let (end_n, elapsed) = (done.load(Ordering::Relaxed), start.elapsed());
    let cpu1 = args.registrar_pid.and_then(cpu_time);
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await??;
    }
    let cpu = match (cpu0, cpu1) {
        (Some(a), Some(b)) => Some((
            CpuTime {
                user: b.user.saturating_sub(a.user),
                system: b.system.saturating_sub(a.system),
            },
            end_n - start_n,
        )),
        _ => None,
    };
    Ok((
        (end_n - start_n) as f64 / elapsed.as_secs_f64(),
        bad.load(Ordering::Relaxed),
        cpu,
    ))
}

/// Runs `rserpool bench`.
pub fn run(args: BenchArgs) -> Result<()> {
    if args.pes == 0 || args.associations == 0 || args.window == 0 || args.seconds <= 0.0 {
        bail!("--pes, --associations, --window and --seconds must be positive");
    }
    let workloads: Vec<Workload> = args
        .workloads
        .iter()
        .map(|w| match w.as_str() {
            "resolve" => Ok(Workload::Resolve),
            "register" => Ok(Workload::Register),
            other => Err(anyhow!(
                "--workloads: {other:?} is neither resolve nor register"
            )),
        })
        .collect::<Result<_>>()?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let args = Arc::new(args);
    rt.block_on(async move {
        // The pool: every PE registered once, over one association kept open meanwhile.
        let codec = Codec::default();
        let mut setup = connect(&args).await?;
        let handle = setup.endpoint.handle();
        let (mut sent, mut accepted, mut refused) = (0u32, 0u32, 0u32);
        let t0 = Instant::now();
        while accepted + refused < args.pes {
            while sent < args.pes && sent - (accepted + refused) < 64 {
                let m = AsapMessage::Registration(asap::Registration {
                    pool_handle: PoolHandle::from(args.pool.as_str()),
                    pool_element: pe(&args, sent),
                });
                handle.send(setup.id, 11, 0, codec.encode(&m)?).await?;
                sent += 1;
            }
            let ev = tokio::time::timeout(Duration::from_secs(10), setup.endpoint.next_event())
                .await
                .map_err(|_| anyhow!("registrations not answered for 10 s"))?;
            if let Some(Event::Message { data, .. }) = ev {
                if let Ok(AsapMessage::RegistrationResponse(r)) =
                    codec.decode::<AsapMessage>(&data).map(|d| d.message)
                {
                    if r.reject {
                        refused += 1;
                    } else {
                        accepted += 1;
                    }
                }
            }
        }
        println!(
            "setup: {accepted} of {} PEs registered in pool {} at {} over {} ({} refused) in {:.2} s",
            args.pes,
            args.pool,
            args.registrar,
            args.transport,
            refused,
            t0.elapsed().as_secs_f64()
        );
        if accepted == 0 {
            bail!("the registrar accepted no PE (is --pe-address one of this host's addresses?)");
        }
        for w in workloads {
            let (rate, bad, cpu) = measure(&args, w).await?;
            let name = match w {
                Workload::Resolve => "handle resolutions",
                Workload::Register => "registrations",
            };
            println!(
                "{name}: {rate:.0}/s ({} associations × {} outstanding, {:.1} s; {bad} unexpected answers)",
                args.associations, args.window, args.seconds
            );
            if let Some((cpu, n)) = cpu {
                let used = cpu.total();
                let per_cpu_second = n as f64 / used.as_secs_f64().max(0.01);
                println!(
                    "{name} per registrar CPU-second: {per_cpu_second:.0} (registrar used {:.2} s of CPU in {:.1} s, {:.0}% of a core; {:.0}% of it in the kernel)",
                    used.as_secs_f64(),
                    args.seconds,
                    100.0 * used.as_secs_f64() / args.seconds,
                    100.0 * cpu.system.as_secs_f64() / used.as_secs_f64().max(0.01)
                );
            }
        }
        drop(setup);
        Ok(())
    })
}
