//! `rserpool bench`: a load generator that speaks ASAP to any registrar (rserpool's or RSPLIB's)
//! over SCTP or TCP, and reports the handle resolutions and registrations per second it sustains
//! with a pool of a given size.

use anyhow::{anyhow, bail, Context, Result};
use bytes::Bytes;
use clap::Args;
use rserpool_transport::{
    AssociationId, Endpoint, EndpointConfig, Event, SendError, TransportChoice,
};
use rserpool_wire::asap::{self, AsapMessage, AsapMessageType};
use rserpool_wire::{
    Codec, ParameterType, PoolElement, PoolElementId, PoolHandle, PoolPolicy, RegistrarId,
    RegistrationLife, TransportAddress, TransportUse, UserTransport,
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
    /// Transport: `auto` (SCTP where the kernel has it, else the TCP mapping), sctp or tcp.
    #[arg(long, default_value = "auto", value_parser = ["auto", "sctp", "tcp"])]
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
    /// Workloads, in order: resolve, register, connect (a new association per request:
    /// connect, with the TLS handshake under TLS, one handle resolution, close); `none` only
    /// registers the pool.
    #[arg(long, value_delimiter = ',', default_value = "resolve,register")]
    workloads: Vec<String>,
    /// After the workloads, keep the pool's PEs registered (answering keep-alives) until
    /// Ctrl-C: a pool to resolve against, e.g. with `rserpool resolve`.
    #[arg(long)]
    hold: bool,
    /// Process id of the registrar (on this host): also report the CPU time it used during the
    /// measurement, and requests served per second of its CPU time, which does not depend on
    /// how fast this load generator is.
    #[arg(long)]
    registrar_pid: Option<u32>,
    #[command(flatten)]
    tls: crate::tls::TlsArgs,
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
    let choice = match args.transport.as_str() {
        "tcp" => TransportChoice::Tcp,
        "sctp" => TransportChoice::Sctp,
        _ => TransportChoice::Auto,
    };
    let mut config = EndpointConfig::new(choice);
    config.tls = args.tls.settings()?;
    let mut endpoint = Endpoint::bind(config)
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
    Connect,
}

/// What an answer is, for counting.
enum Answer {
    /// The answer the workload asked for.
    Good,
    /// Anything else (a reject, an error, the wrong type).
    Bad,
    /// An ENDPOINT_KEEP_ALIVE: to be acknowledged, not counted.
    KeepAlive,
}

/// Whether an ASAP message holds a parameter of the given type, read from the parameter headers
/// alone (RFC 5354 §2: type, length, padding to 4 bytes).
fn has_parameter(message: &[u8], wanted: ParameterType) -> bool {
    let end = message
        .get(2..4)
        .map_or(0, |b| usize::from(u16::from_be_bytes([b[0], b[1]])))
        .min(message.len());
    let mut at = 4;
    while at + 4 <= end {
        let ptype = u16::from_be_bytes([message[at], message[at + 1]]) & 0x3fff;
        let len = usize::from(u16::from_be_bytes([message[at + 2], message[at + 3]]));
        if ptype == wanted.0 {
            return true;
        }
        if len < 4 {
            return false;
        }
        at += (len + 3) & !3;
    }
    false
}

/// Classifies an answer from its header (type, R flag) and parameter types, without decoding
/// the PEs: the load generator must not be what limits the rate.
fn classify(workload: Workload, data: &[u8]) -> Answer {
    match (data.first(), data.get(1)) {
        (Some(&HANDLE_RESOLUTION_RESPONSE), _) => {
            if workload == Workload::Resolve && has_parameter(data, ParameterType::POOL_ELEMENT) {
                Answer::Good
            } else {
                Answer::Bad
            }
        }
        (Some(&REGISTRATION_RESPONSE), Some(flags)) => {
            if workload == Workload::Register && flags & 0x01 == 0 {
                Answer::Good
            } else {
                Answer::Bad
            }
        }
        (Some(&ENDPOINT_KEEP_ALIVE), _) => Answer::KeepAlive,
        _ => Answer::Bad,
    }
}

// ASAP message types (RFC 5352 §2.2).
const REGISTRATION_RESPONSE: u8 = AsapMessageType::RegistrationResponse as u8;
const HANDLE_RESOLUTION_RESPONSE: u8 = AsapMessageType::HandleResolutionResponse as u8;
const ENDPOINT_KEEP_ALIVE: u8 = AsapMessageType::EndpointKeepAlive as u8;

/// Keeps `window` requests outstanding on one association until `stop`; counts good answers.
/// The answers that arrived together are replaced by new requests sent together (all but the
/// last with the hint that more follow, so SCTP bundles them), as a busy pool user would.
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
    let resolution = Bytes::from(codec.encode(&AsapMessage::HandleResolution(
        asap::HandleResolution {
            subscribe: false,
            pool_handle: pool.clone(),
            option: None,
        },
    ))?);
    let request = |next: &mut u32| -> Bytes {
        match workload {
            Workload::Resolve | Workload::Connect => resolution.clone(),
            Workload::Register => {
                let i = *next;
                *next = if *next + 1 >= slice.1 {
                    slice.0
                } else {
                    *next + 1
                };
                let m = AsapMessage::Registration(asap::Registration {
                    pool_handle: pool.clone(),
                    pool_element: pe(args, i),
                });
                Bytes::from(codec.encode(&m).expect("valid request"))
            }
        }
    };
    for _ in 0..args.window {
        handle.send(conn.id, 11, 0, request(&mut next)).await?;
    }
    while !stop.load(Ordering::Relaxed) {
        let first = tokio::time::timeout(Duration::from_secs(5), conn.endpoint.next_event())
            .await
            .map_err(|_| anyhow!("no answer from the registrar for 5 s"))?;
        let mut answered = 0usize;
        let mut event = first;
        loop {
            match event {
                Some(Event::Message { data, .. }) => match classify(workload, &data) {
                    Answer::Good => {
                        done.fetch_add(1, Ordering::Relaxed);
                        answered += 1;
                    }
                    Answer::Bad => {
                        bad.fetch_add(1, Ordering::Relaxed);
                        answered += 1;
                    }
                    Answer::KeepAlive => {
                        if let Ok(AsapMessage::EndpointKeepAlive(k)) =
                            codec.decode::<AsapMessage>(&data).map(|d| d.message)
                        {
                            if let Some(id) = k.pe_id {
                                let ack =
                                    AsapMessage::EndpointKeepAliveAck(asap::EndpointKeepAliveAck {
                                        pool_handle: k.pool_handle,
                                        pe_id: id,
                                    });
                                handle.send(conn.id, 11, 0, codec.encode(&ack)?).await?;
                            }
                        }
                    }
                },
                Some(Event::AssociationDown { reason, .. }) => {
                    bail!("association lost: {reason}")
                }
                Some(_) => {}
                None => bail!("endpoint closed"),
            }
            if answered >= args.window {
                break;
            }
            event = conn.endpoint.try_next_event();
            if event.is_none() {
                break;
            }
        }
        for i in 0..answered {
            let r = request(&mut next);
            let more = i + 1 < answered;
            let sent = handle.try_send_hinted(conn.id, 11, 0, r, more).await;
            match sent {
                Ok(()) => {}
                // No room: wait for it (this send, unhinted, also ends a hinted run).
                Err(SendError::QueueFull { data, .. }) => handle.send(conn.id, 11, 0, data).await?,
                Err(e) => return Err(e.into()),
            }
        }
    }
    Ok(())
}

/// Opens one association after the other until `stop`: connect (and the TLS handshake), one
/// handle resolution answered, close. Counts associations that got their answer. Each
/// association gets a fresh endpoint, as a new client process would: under TLS that is a full
/// handshake every time, never a resumed session.
async fn drive_connects(
    args: &BenchArgs,
    done: Arc<AtomicU64>,
    bad: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
) -> Result<()> {
    let choice = if args.transport == "tcp" {
        TransportChoice::Tcp
    } else {
        TransportChoice::Sctp
    };
    let mut config = EndpointConfig::new(choice);
    config.tls = args.tls.settings()?;
    let resolution = Bytes::from(Codec::default().encode(&AsapMessage::HandleResolution(
        asap::HandleResolution {
            subscribe: false,
            pool_handle: PoolHandle::from(args.pool.as_str()),
            option: None,
        },
    ))?);
    while !stop.load(Ordering::Relaxed) {
        let mut endpoint = Endpoint::bind(config.clone())
            .await
            .context("binding a client endpoint")?;
        let id = endpoint.connect(&[args.registrar]).await?;
        endpoint.send(id, 11, 0, resolution.clone()).await?;
        let mut answered = false;
        loop {
            let ev = tokio::time::timeout(Duration::from_secs(5), endpoint.next_event())
                .await
                .map_err(|_| anyhow!("no answer from the registrar for 5 s"))?;
            match ev {
                Some(Event::Message { id: m, data, .. }) if m == id && !answered => {
                    match classify(Workload::Resolve, &data) {
                        Answer::Good => done.fetch_add(1, Ordering::Relaxed),
                        _ => bad.fetch_add(1, Ordering::Relaxed),
                    };
                    answered = true;
                    let _ = endpoint.close(id).await;
                }
                Some(Event::AssociationDown { id: d, reason }) if d == id => {
                    if !answered {
                        bail!("association lost before the answer: {reason}");
                    }
                    break;
                }
                Some(_) => {}
                None => bail!("endpoint closed"),
            }
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
        if workload == Workload::Connect {
            let (a, d, b, s) = (args.clone(), done.clone(), bad.clone(), stop.clone());
            tasks.push(tokio::spawn(
                async move { drive_connects(&a, d, b, s).await },
            ));
            continue;
        }
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
        .filter(|w| w.as_str() != "none")
        .map(|w| match w.as_str() {
            "resolve" => Ok(Workload::Resolve),
            "register" => Ok(Workload::Register),
            "connect" => Ok(Workload::Connect),
            other => Err(anyhow!(
                "--workloads: {other:?} is not resolve, register, connect or none"
            )),
        })
        .collect::<Result<_>>()?;
    if args.tls.settings()?.is_some() && args.transport != "tcp" {
        bail!(
            "--transport {}: {}",
            args.transport,
            rserpool_transport::TlsError::OverSctp
        );
    }
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
        let mut first_refusal: Option<String> = None;
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
                        if first_refusal.is_none() {
                            first_refusal = Some(match &r.error {
                                Some(e) => e.to_string(),
                                None => "no cause given".to_string(),
                            });
                        }
                    } else {
                        accepted += 1;
                    }
                }
            }
        }
        outln!(
            "setup: {accepted} of {} PEs registered in pool {} at {} over {} ({} refused) in {:.2} s",
            args.pes,
            args.pool,
            args.registrar,
            setup.endpoint.kind(),
            refused,
            t0.elapsed().as_secs_f64()
        );
        if accepted == 0 {
            bail!(
                "the registrar accepted no PE (its answer: {}); is --pe-address {} an address of this host in a scope the registrar accepts (its --min-address-scope)?",
                first_refusal.as_deref().unwrap_or("none"),
                args.pe_address
            );
        }
        for w in workloads {
            let (rate, bad, cpu) = measure(&args, w).await?;
            let name = match w {
                Workload::Resolve => "handle resolutions",
                Workload::Register => "registrations",
                Workload::Connect => "associations (connect, resolve, close)",
            };
            outln!(
                "{name}: {rate:.0}/s ({} associations × {} outstanding, {:.1} s; {bad} unexpected answers)",
                args.associations, args.window, args.seconds
            );
            if let Some((cpu, n)) = cpu {
                let used = cpu.total();
                let per_cpu_second = n as f64 / used.as_secs_f64().max(0.01);
                outln!(
                    "{name} per registrar CPU-second: {per_cpu_second:.0} (registrar used {:.2} s of CPU in {:.1} s, {:.0}% of a core; {:.0}% of it in the kernel)",
                    used.as_secs_f64(),
                    args.seconds,
                    100.0 * used.as_secs_f64() / args.seconds,
                    100.0 * cpu.system.as_secs_f64() / used.as_secs_f64().max(0.01)
                );
            }
        }
        if args.hold {
            outln!(
                "holding {accepted} PE(s) registered in pool {} at {}; Ctrl-C ends",
                args.pool,
                args.registrar
            );
            hold(&mut setup, &codec).await?;
        }
        drop(setup);
        Ok(())
    })
}

/// Answers the registrar's keep-alives to the PEs registered over `conn` until SIGINT or
/// SIGTERM (`--hold`).
async fn hold(conn: &mut Conn, codec: &Codec) -> Result<()> {
    let handle = conn.endpoint.handle();
    let stop = crate::shutdown_signal();
    tokio::pin!(stop);
    loop {
        let event = tokio::select! {
            _ = &mut stop => return Ok(()),
            e = conn.endpoint.next_event() => e,
        };
        match event {
            Some(Event::Message { data, .. }) => {
                if let Ok(AsapMessage::EndpointKeepAlive(k)) =
                    codec.decode::<AsapMessage>(&data).map(|d| d.message)
                {
                    if let Some(id) = k.pe_id {
                        let ack = AsapMessage::EndpointKeepAliveAck(asap::EndpointKeepAliveAck {
                            pool_handle: k.pool_handle,
                            pe_id: id,
                        });
                        handle.send(conn.id, 11, 0, codec.encode(&ack)?).await?;
                    }
                }
            }
            Some(Event::AssociationDown { reason, .. }) => {
                bail!("association to the registrar lost: {reason}")
            }
            Some(_) => {}
            None => bail!("endpoint closed"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rserpool_wire::{CauseCode, OperationError};

    fn encoded(m: AsapMessage) -> Vec<u8> {
        Codec::default().encode(&m).unwrap()
    }

    fn pe_of(i: u32) -> PoolElement {
        PoolElement {
            id: PoolElementId(i),
            home_registrar: RegistrarId(1),
            registration_life: RegistrationLife::Finite(Duration::from_secs(60)),
            user_transport: UserTransport::Address(TransportAddress::sctp(
                7000,
                TransportUse::DataPlusControl,
                vec!["10.0.0.1".parse().unwrap()],
            )),
            policy: PoolPolicy::RoundRobin,
            asap_transport: None,
        }
    }

    fn resolution_response(pool_elements: Vec<PoolElement>, error: bool) -> Vec<u8> {
        encoded(AsapMessage::HandleResolutionResponse(
            asap::HandleResolutionResponse {
                accepted: false,
                pool_handle: PoolHandle::from("P"),
                overall_policy: Some(PoolPolicy::RoundRobin),
                pool_elements,
                error: error.then(|| OperationError::new(CauseCode::UnknownPoolHandle)),
            },
        ))
    }

    fn registration_response(reject: bool) -> Vec<u8> {
        encoded(AsapMessage::RegistrationResponse(
            asap::RegistrationResponse {
                reject,
                pool_handle: PoolHandle::from("P"),
                pe_id: PoolElementId(1),
                error: reject.then(|| OperationError::new(CauseCode::LackOfResources)),
            },
        ))
    }

    #[test]
    fn answers_are_classified_by_type_flag_and_parameters() {
        let found = resolution_response(vec![pe_of(1), pe_of(2)], false);
        assert!(matches!(classify(Workload::Resolve, &found), Answer::Good));
        assert!(matches!(classify(Workload::Register, &found), Answer::Bad));
        let unknown = resolution_response(Vec::new(), true);
        assert!(matches!(classify(Workload::Resolve, &unknown), Answer::Bad));
        assert!(matches!(
            classify(Workload::Register, &registration_response(false)),
            Answer::Good
        ));
        assert!(matches!(
            classify(Workload::Register, &registration_response(true)),
            Answer::Bad
        ));
        let keep_alive = encoded(AsapMessage::EndpointKeepAlive(asap::EndpointKeepAlive {
            home: false,
            server_id: RegistrarId(1),
            pool_handle: PoolHandle::from("P"),
            pe_id: Some(PoolElementId(1)),
        }));
        assert!(matches!(
            classify(Workload::Resolve, &keep_alive),
            Answer::KeepAlive
        ));
    }

    #[test]
    fn damaged_answers_are_bad_and_never_panic() {
        let found = resolution_response(vec![pe_of(1)], false);
        for cut in 0..found.len() {
            // Whatever is left, classifying it must not panic.
            let _ = classify(Workload::Resolve, &found[..cut]);
        }
        assert!(matches!(classify(Workload::Resolve, &[]), Answer::Bad));
        let mut zero_length = found.clone();
        zero_length[6..8].copy_from_slice(&[0, 0]);
        assert!(matches!(
            classify(Workload::Resolve, &zero_length),
            Answer::Bad
        ));
    }
}
