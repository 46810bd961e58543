//! The demo's users: pool users running PingPong sessions with automatic failover and cookies,
//! and a plain client that reaches the pool through the gateway's virtual address.

use super::display::Out;
use bytes::BytesMut;
use rserpool_endpoint::driver::{PoolUserClient, SessionHandle};
use rserpool_endpoint::session::{FailoverRecord, Receipt, SessionConfig, SessionEvent};
use rserpool_services::pingpong::{Ping, PingPongClient, PingPongClientConfig, PingPongMessage};
use rserpool_services::{ClientOutput, ClientReport, ClientService, Now, PPID_PINGPONG};
use rserpool_transport::tcp::frame::{encode, FrameDecoder, FrameType};
use rserpool_transport::{EndpointConfig, TransportChoice};
use rserpool_wire::{PoolElementId, PoolHandle, PoolPolicy};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio::time::Instant;

/// The PEs' registered policy values by identifier (to show a selection's inputs).
pub type Loads = Arc<HashMap<PoolElementId, PoolPolicy>>;

/// One failover as the pool user saw it.
#[derive(Debug, Clone)]
pub struct Failover {
    /// The session's own receipt of it.
    pub record: FailoverRecord,
    /// From the PE's loss (crash) to the first Pong from the new PE.
    pub to_first_pong: Option<Duration>,
}

/// What one pool user's session did, counted by its PingPong client.
#[derive(Debug, Clone, Default)]
pub struct PoolUserResult {
    /// "PU1", "PU2".
    pub name: String,
    /// Pings sent (each message number once).
    pub sent: u64,
    /// Pings answered.
    pub answered: u64,
    /// Pongs for a Ping already answered.
    pub answered_twice: u64,
    /// Pings sent again after a failover.
    pub resent: u64,
    /// Reply numbers that did not continue (a cookie not honoured).
    pub gaps: u64,
    /// Pings never answered.
    pub unanswered: u64,
    /// Failovers with their times.
    pub failovers: Vec<Failover>,
    /// The session's receipts at the end.
    pub receipt: Receipt,
    /// Why the session ended early, if it did.
    pub failed: Option<String>,
}

fn now_of(epoch: Instant) -> Now {
    Now::new(
        epoch.elapsed(),
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default(),
    )
}

/// The candidates of a selection with their registered policy values.
pub fn candidates(list: &[PoolElementId], loads: &Loads) -> String {
    list.iter()
        .map(|id| match loads.get(id).and_then(|p| p.load()) {
            Some(l) => format!("{id} {:.0}%", 100.0 * f64::from(l) / f64::from(u32::MAX)),
            None => id.to_string(),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// Opens a PingPong session to `pool` with `client`'s registrars and runs it until `stop`,
/// then until every Ping sent is answered (or `drain` passes).
#[allow(clippy::too_many_arguments)]
pub async fn pool_user(
    name: String,
    client: PoolUserClient,
    pool: PoolHandle,
    auto_failover: bool,
    interval: Duration,
    out: Out,
    loads: Loads,
    mut stop: watch::Receiver<bool>,
    drain: Duration,
) -> PoolUserResult {
    let mut result = PoolUserResult {
        name: name.clone(),
        ..PoolUserResult::default()
    };
    let mut config = SessionConfig::new(pool.clone());
    // The PingPong client resends what is unanswered after each failover.
    config.application_resends = true;
    config.auto_failover = auto_failover;
    config.max_attempts = 10;
    let mut session = match SessionHandle::open(
        client,
        config,
        EndpointConfig::new(TransportChoice::Tcp),
    )
    .await
    {
        Ok(s) => s,
        Err(e) => {
            result.failed = Some(format!("could not open a session: {e}"));
            out.fact(format!("{name}: could not open a session to {pool}: {e}"));
            return result;
        }
    };
    let snap = session.snapshot();
    if let Some(sel) = snap.receipt.selections.last() {
        out.fact(format!(
            "{name} selected PE {} for its PingPong session: {} by the registrar, pool policy {}, \
             the PE's values {}\n  candidates in the registrar's order: {}",
            sel.pe,
            sel.source.label(),
            sel.pool_policy
                .as_ref()
                .map(|p| p.policy_type().to_string())
                .unwrap_or_else(|| "not given".into()),
            sel.pe_policy,
            candidates(&sel.candidates, &loads)
        ));
    }
    if let Some((pe, _)) = snap.receipt.bound {
        out.fact(format!(
            "{name} bound to PE {pe} (association up; nothing answered yet)"
        ));
    }
    let epoch = Instant::now();
    let mut pp = PingPongClient::new(PingPongClientConfig {
        interval,
        ..PingPongClientConfig::default()
    });
    pp.start(now_of(epoch));
    let mut pe = session.opened_pe();
    let mut reached = false;
    let mut cookie_len: Option<usize> = None;
    // A failover whose first Pong is awaited: (index in result.failovers, loss noticed at).
    let mut awaiting_pong: Option<(usize, Instant)> = None;
    let mut lost_at: Option<Instant> = None;
    let mut stopping = false;
    let mut drain_until = None;
    loop {
        while let Some(o) = pp.poll_output() {
            match o {
                ClientOutput::Send { ppid, stream, data } => {
                    // Refused while moving to another PE: the client resends it afterwards.
                    let _ = session.send(ppid, stream, data).await;
                }
                ClientOutput::ClearCookie => session.clear_cookie().await,
                // With failover off (to see the demo fail), the client's own request for one
                // is not carried out either.
                ClientOutput::Failover(_) if !auto_failover => {}
                ClientOutput::Failover(_) => {
                    session
                        .failover_because(
                            rserpool_endpoint::session::FailoverReason::NoAnswer,
                        )
                        .await
                }
                ClientOutput::Report(ClientReport::PingSent { resent: false, .. }) => {
                    out.progress.pings.fetch_add(1, Ordering::Relaxed);
                }
                ClientOutput::Report(ClientReport::PingSent {
                    resent: true,
                    message_no,
                }) => out.fact(format!(
                    "{name} resends Ping #{message_no} to PE {pe} (it was unanswered when PE {} was lost)",
                    result.failovers.last().map(|f| f.record.from.to_string()).unwrap_or_default()
                )),
                ClientOutput::Report(ClientReport::Pong {
                    message_no,
                    reply_no,
                    rtt,
                }) => {
                    out.progress.answered.fetch_add(1, Ordering::Relaxed);
                    if !reached {
                        reached = true;
                        out.fact(format!(
                            "{name} reached PE {pe}: Pong for Ping #{message_no}, reply #{reply_no}, rtt {:.1} ms",
                            rtt.as_secs_f64() * 1e3
                        ));
                    }
                    if let Some((i, at)) = awaiting_pong.take() {
                        let d = at.elapsed();
                        result.failovers[i].to_first_pong = Some(d);
                        out.fact(format!(
                            "{name} reached PE {pe} after the failover: Pong for Ping #{message_no}, reply #{reply_no}{}, {:.0} ms after the loss",
                            if pp.counters().gaps == 0 { " (the reply count continues from the cookie: no gap)" } else { "" },
                            d.as_secs_f64() * 1e3
                        ));
                    }
                }
                ClientOutput::Report(ClientReport::DuplicatePong { message_no }) => {
                    out.fact(format!("{name}: Ping #{message_no} ANSWERED TWICE"))
                }
                ClientOutput::Report(ClientReport::Gap { previous, reply_no }) => out.fact(format!(
                    "{name}: reply #{reply_no} after #{previous}: the count did not continue"
                )),
                _ => {}
            }
        }
        if stopping && pp.outstanding().next().is_none() && awaiting_pong.is_none() {
            break;
        }
        if drain_until.is_some_and(|d| Instant::now() >= d) {
            break;
        }
        let deadline = pp
            .poll_timeout()
            .map(|d| epoch + d)
            .unwrap_or_else(|| Instant::now() + Duration::from_secs(3600));
        let deadline = match drain_until {
            Some(d) if d < deadline => d,
            _ => deadline,
        };
        tokio::select! {
            _ = stop.wait_for(|s| *s), if !stopping => {
                stopping = true;
                drain_until = Some(Instant::now() + drain);
            }
            _ = tokio::time::sleep_until(deadline) => pp.handle_timeout(now_of(epoch)),
            ev = session.next_event() => match ev {
                None => break,
                Some(SessionEvent::Data { ppid, stream, data }) => {
                    if let Err(e) = pp.handle_message(now_of(epoch), ppid, stream, &data) {
                        out.fact(format!("{name}: PE {pe} sent something unusable: {e}"));
                    }
                }
                Some(SessionEvent::Cookie { len }) => cookie_len = Some(len),
                Some(SessionEvent::FailoverStarted { from, reason, has_cookie }) => {
                    lost_at = Some(Instant::now());
                    out.fact(format!(
                        "{name} lost PE {from}: {reason}; failing over {}",
                        if has_cookie { "with the last cookie" } else { "without a cookie" }
                    ));
                }
                Some(SessionEvent::FailoverNecessary { from, reason, .. }) => {
                    out.fact(format!(
                        "{name} lost PE {from}: {reason}; automatic failover is off, the session waits"
                    ));
                }
                Some(SessionEvent::Failover(f)) => {
                    pe = f.to;
                    out.progress.failovers.fetch_add(1, Ordering::Relaxed);
                    let snap = session.snapshot();
                    let sel = snap.receipt.selections.last().cloned();
                    out.fact(format!(
                        "{name} failed over: PE {} → PE {} ({}), {}, {:.0} ms from loss to new association{}",
                        f.from,
                        f.to,
                        f.reason,
                        if f.with_cookie {
                            format!("COOKIE_ECHO sent ({} bytes, the PE's last cookie)", cookie_len.unwrap_or(0))
                        } else {
                            "no cookie to echo".to_string()
                        },
                        f.completed.saturating_sub(f.started).as_secs_f64() * 1e3,
                        match sel {
                            Some(s) => format!(
                                "\n  new selection: PE {} ({}) from {}: {}",
                                s.pe,
                                s.pe_policy,
                                s.source.label(),
                                candidates(&s.candidates, &loads)
                            ),
                            None => String::new(),
                        }
                    ));
                    result.failovers.push(Failover { record: f.clone(), to_first_pong: None });
                    awaiting_pong = Some((result.failovers.len() - 1, lost_at.take().unwrap_or_else(Instant::now)));
                    pp.failover_complete(now_of(epoch), f.with_cookie);
                }
                Some(SessionEvent::Failed { reason }) => {
                    out.fact(format!("{name}: the session failed: {reason}"));
                    result.failed = Some(reason);
                    break;
                }
                Some(SessionEvent::ProtocolError(e)) => out.fact(format!("{name}: {e}")),
                Some(_) => {}
            },
        }
    }
    let c = pp.counters();
    result.sent = c.pings;
    result.answered = c.answered;
    result.answered_twice = c.duplicates;
    result.resent = c.resent;
    result.gaps = c.gaps;
    result.unanswered = pp.outstanding().count() as u64;
    if result.failed.is_none() && result.unanswered > 0 {
        result.failed = Some(format!(
            "{} Ping(s) unanswered at the end",
            result.unanswered
        ));
    }
    result.receipt = session.close().await.receipt;
    result
}

/// How a session through the gateway ended, as its client saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClientEnd {
    /// Every Ping answered; the client closed.
    Complete,
    /// The member's end closed or reset before every Ping was answered.
    AnswerLost {
        /// What the client saw.
        seen: String,
    },
    /// The client could not connect or send at all.
    Failed(String),
}

/// One session through the gateway, as its client saw it.
#[derive(Debug, Clone)]
pub struct GatewaySession {
    /// The client's own address (the gateway's receipt names it).
    pub client: SocketAddr,
    /// Pings sent.
    pub pings: u64,
    /// Pongs received.
    pub pongs: u64,
    /// How it ended.
    pub end: ClientEnd,
}

/// A client that does not speak ASAP: it connects to the gateway's virtual address and speaks
/// PingPong over the TCP mapping's framing, `pings` Pings `interval` apart, then closes. When the
/// member's side ends before its answers, it keeps its own side open until the gateway ends the
/// session (a reset), at most `wait_reset`, so that the gateway's receipt can be compared with
/// what the client saw.
pub async fn gateway_session(
    gateway: SocketAddr,
    pings: u64,
    interval: Duration,
    wait_reset: Duration,
) -> GatewaySession {
    let mut s = GatewaySession {
        client: SocketAddr::from(([0, 0, 0, 0], 0)),
        pings: 0,
        pongs: 0,
        end: ClientEnd::Complete,
    };
    let mut stream =
        match tokio::time::timeout(Duration::from_secs(5), TcpStream::connect(gateway)).await {
            Ok(Ok(st)) => st,
            Ok(Err(e)) => {
                s.end = ClientEnd::Failed(format!("connect: {e}"));
                return s;
            }
            Err(_) => {
                s.end = ClientEnd::Failed("connect timed out".into());
                return s;
            }
        };
    let _ = stream.set_nodelay(true);
    s.client = stream.local_addr().unwrap_or(s.client);
    let decoder = FrameDecoder::new(65_536);
    let mut buf = BytesMut::with_capacity(4096);
    let mut lost: Option<String> = None;
    'pings: for n in 1..=pings {
        let ping = PingPongMessage::Ping(Ping {
            flags: 0,
            message_no: n,
            data: format!("via the gateway, Ping {n}").into_bytes(),
        });
        let mut frame = BytesMut::new();
        encode(
            &mut frame,
            FrameType::Data,
            0,
            PPID_PINGPONG,
            &ping.encode().unwrap_or_default(),
        );
        if let Err(e) = stream.write_all(&frame).await {
            lost = Some(format!("sending Ping {n}: {e}"));
            break;
        }
        s.pings += 1;
        // Read until this Ping's Pong (cookies on PPID 11 and keep-alives are passed over).
        let answer_by = Instant::now() + Duration::from_secs(10);
        loop {
            match decoder.decode(&mut buf) {
                Ok(Some(f)) => {
                    if f.frame_type == FrameType::KeepAlive {
                        let mut ack = BytesMut::new();
                        encode(&mut ack, FrameType::KeepAliveAck, 0, 0, &f.payload);
                        let _ = stream.write_all(&ack).await;
                        continue;
                    }
                    if f.frame_type == FrameType::Data && f.ppid == PPID_PINGPONG {
                        if let Ok(PingPongMessage::Pong(p)) = PingPongMessage::decode(&f.payload) {
                            if p.message_no == n {
                                s.pongs += 1;
                                break;
                            }
                        }
                    }
                    continue;
                }
                Ok(None) => {}
                Err(e) => {
                    lost = Some(format!("bad frame: {e}"));
                    break 'pings;
                }
            }
            match tokio::time::timeout_at(answer_by, stream.read_buf(&mut buf)).await {
                Ok(Ok(0)) => {
                    lost = Some(format!("end of stream before the Pong for Ping {n}"));
                    break 'pings;
                }
                Ok(Ok(_)) => {}
                Ok(Err(e)) => {
                    lost = Some(format!("{} before the Pong for Ping {n}", io_kind(&e)));
                    break 'pings;
                }
                Err(_) => {
                    lost = Some(format!("no Pong for Ping {n} within 10 s"));
                    break 'pings;
                }
            }
        }
        if n < pings {
            // Between Pings: watch for the end of the stream meanwhile.
            let until = Instant::now() + interval;
            loop {
                match tokio::time::timeout_at(until, stream.read_buf(&mut buf)).await {
                    Err(_) => break,
                    Ok(Ok(0)) => {
                        lost = Some(format!(
                            "end of stream after Ping {n}, with Pings left to send"
                        ));
                        break 'pings;
                    }
                    Ok(Ok(_)) => {}
                    Ok(Err(e)) => {
                        lost = Some(format!("{} after Ping {n}", io_kind(&e)));
                        break 'pings;
                    }
                }
            }
        }
    }
    match lost {
        None => {
            let _ = stream.shutdown().await;
            // Read to the end so that the close is orderly both ways.
            let mut rest = [0u8; 1024];
            let _ = tokio::time::timeout(Duration::from_secs(5), async {
                while let Ok(n) = stream.read(&mut rest).await {
                    if n == 0 {
                        break;
                    }
                }
            })
            .await;
        }
        Some(seen) => {
            // The stream ended early. Hold our side open until the gateway ends the session
            // (a reset: SO_ERROR set), so that what the gateway records is its own judgement.
            let mut seen = seen;
            if !seen.starts_with("reset") {
                let until = Instant::now() + wait_reset;
                loop {
                    match stream.take_error() {
                        Ok(Some(e)) => {
                            seen =
                                format!("{seen}, then a reset from the gateway ({})", io_kind(&e));
                            break;
                        }
                        Ok(None) => {}
                        Err(_) => break,
                    }
                    if Instant::now() >= until {
                        seen = format!(
                            "{seen}; no reset from the gateway within {}s",
                            wait_reset.as_secs()
                        );
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
            s.end = ClientEnd::AnswerLost { seen };
        }
    }
    s
}

fn io_kind(e: &std::io::Error) -> String {
    match e.kind() {
        std::io::ErrorKind::ConnectionReset => "reset".into(),
        std::io::ErrorKind::BrokenPipe => "reset (broken pipe)".into(),
        _ => e.to_string(),
    }
}

/// Runs `workers` clients one session after another until `stop`; returns every session.
pub async fn gateway_clients(
    gateway: SocketAddr,
    workers: usize,
    out: Out,
    stop: watch::Receiver<bool>,
) -> Vec<GatewaySession> {
    let all = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for _ in 0..workers {
        let all = all.clone();
        let out = out.clone();
        let stop = stop.clone();
        tasks.push(tokio::spawn(async move {
            while !*stop.borrow() {
                let s = gateway_session(
                    gateway,
                    8,
                    Duration::from_millis(150),
                    Duration::from_secs(15),
                )
                .await;
                out.progress
                    .gateway_sessions
                    .fetch_add(1, Ordering::Relaxed);
                let failed = matches!(s.end, ClientEnd::Failed(_));
                if let ClientEnd::AnswerLost { seen } = &s.end {
                    out.progress.gateway_lost.fetch_add(1, Ordering::Relaxed);
                    out.fact(format!(
                        "gateway client {}: {}/{} Pongs, then {seen}",
                        s.client, s.pongs, s.pings
                    ));
                }
                all.lock().unwrap_or_else(|e| e.into_inner()).push(s);
                if failed {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        }));
    }
    for t in tasks {
        let _ = t.await;
    }
    let v = std::mem::take(&mut *all.lock().unwrap_or_else(|e| e.into_inner()));
    v
}
