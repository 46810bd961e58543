//! UDP: a flow is the datagrams from one client address to a virtual address. Its first
//! datagram binds it; each flow gets its own socket connected to its member (so replies find
//! their client, and the member's refusals come back as errors), idle timers end it.

use super::Shared;
use crate::core::receipt::Outcome;
use crate::core::{FlowKey, Protocol, SessionId, Traffic};
use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::time::Instant;
use tokio::net::UdpSocket;
use tokio::sync::{mpsc, oneshot, watch};

/// Largest datagram relayed (the UDP maximum).
const MAX_DATAGRAM: usize = 65_535;

pub(crate) fn bind(addr: SocketAddr) -> io::Result<UdpSocket> {
    let domain = socket2::Domain::for_address(addr);
    let s = socket2::Socket::new(domain, socket2::Type::DGRAM, Some(socket2::Protocol::UDP))?;
    s.set_reuse_address(true)?;
    if addr.is_ipv6() {
        s.set_only_v6(true)?;
    }
    s.set_nonblocking(true)?;
    s.bind(&addr.into())?;
    UdpSocket::from_std(s.into())
}

struct Flow {
    id: SessionId,
    member: Arc<UdpSocket>,
    sent_any: bool,
    pending: Traffic,
    last_report: Instant,
}

pub(crate) async fn listener_loop(
    shared: Arc<Shared>,
    sock: UdpSocket,
    mut stop: watch::Receiver<bool>,
) {
    let sock = Arc::new(sock);
    let local = sock.local_addr().ok();
    let mut flows: HashMap<SocketAddr, Flow> = HashMap::new();
    let (ended_tx, mut ended_rx) = mpsc::unbounded_channel::<(SocketAddr, SessionId)>();
    let mut buf = vec![0u8; MAX_DATAGRAM];
    let report = shared.config.runtime.report_interval;
    loop {
        let (n, client) = tokio::select! {
            r = sock.recv_from(&mut buf) => match r {
                Ok(x) => x,
                Err(e) => {
                    tracing::debug!(error = %e, "udp receive error");
                    continue;
                }
            },
            Some((client, id)) = ended_rx.recv() => {
                if flows.get(&client).is_some_and(|f| f.id == id) {
                    if let Some(f) = flows.remove(&client) {
                        flush(&shared, &f);
                    }
                }
                continue;
            }
            _ = stop.changed() => break,
        };
        let flow = match flows.entry(client) {
            Entry::Occupied(e) => e.into_mut(),
            Entry::Vacant(e) => {
                let Some(virtual_address) = local else {
                    continue;
                };
                match open_flow(&shared, &sock, client, virtual_address, &ended_tx).await {
                    Some(f) => e.insert(f),
                    None => continue,
                }
            }
        };
        let id = flow.id;
        if !flow.sent_any {
            flow.sent_any = true;
            shared.with(|core, now| core.client_data(now, id));
        }
        if let Err(e) = flow.member.send(&buf[..n]).await {
            flush(&shared, flow);
            let reason = reason(&e);
            shared.with(|core, now| core.member_failed(now, id, &reason));
            if let Some(kill) = shared.lock().kills.remove(&id) {
                kill.send(id, Outcome::Shutdown);
            }
            flows.remove(&client);
            continue;
        }
        flow.pending.bytes += n as u64;
        flow.pending.packets += 1;
        if flow.last_report.elapsed() >= report {
            flow.last_report = Instant::now();
            let t = std::mem::take(&mut flow.pending);
            shared.with(|core, now| core.activity(now, id, t, Traffic::default()));
        }
    }
    // Stopping: what was relayed and not yet reported still counts.
    for f in flows.values() {
        flush(&shared, f);
    }
}

/// Reports a flow's client-to-member traffic not yet reported (the flow is ending): every byte
/// relayed is counted, also in flows shorter than the report interval.
fn flush(shared: &Shared, flow: &Flow) {
    if flow.pending != Traffic::default() {
        let (id, t) = (flow.id, flow.pending);
        shared.with(|core, now| core.activity(now, id, t, Traffic::default()));
    }
}

fn reason(e: &io::Error) -> String {
    match e.kind() {
        io::ErrorKind::ConnectionRefused => "connection refused".into(),
        _ => e.to_string(),
    }
}

async fn open_flow(
    shared: &Arc<Shared>,
    listener: &Arc<UdpSocket>,
    client: SocketAddr,
    virtual_address: SocketAddr,
    ended: &mpsc::UnboundedSender<(SocketAddr, SessionId)>,
) -> Option<Flow> {
    let flow = FlowKey {
        protocol: Protocol::Udp,
        client,
        virtual_address,
    };
    let (tx, rx) = oneshot::channel();
    let binding = {
        let now = shared.now();
        let mut g = shared.lock();
        let r = g.core.open(now, flow);
        if let Ok(b) = &r {
            g.kills.insert(b.session, super::Kill::Task(tx));
        }
        g.apply_actions();
        r.ok()?
    };
    let id = binding.session;
    let unspecified: IpAddr = if binding.address.is_ipv6() {
        Ipv6Addr::UNSPECIFIED.into()
    } else {
        Ipv4Addr::UNSPECIFIED.into()
    };
    let sock = match UdpSocket::bind((unspecified, 0)).await {
        Ok(s) => s,
        Err(e) => {
            // Out of local ports or descriptors: the LS-NAPT ceiling.
            let r = format!("no local socket for the flow: {e}");
            tracing::warn!(session = %id, error = %e, "udp flow not relayed");
            let now = shared.now();
            let mut g = shared.lock();
            g.core.closed(
                now,
                id,
                Outcome::Aborted {
                    by: crate::core::receipt::Side::Member,
                    reason: r,
                },
            );
            g.kills.remove(&id);
            return None;
        }
    };
    if let Err(e) = sock.connect(binding.address).await {
        let r = reason(&e);
        shared.with(|core, now| core.member_failed(now, id, &r));
        shared.lock().kills.remove(&id);
        return None;
    }
    let sock = Arc::new(sock);
    tokio::spawn(member_reader(
        shared.clone(),
        sock.clone(),
        listener.clone(),
        client,
        id,
        rx,
        ended.clone(),
    ));
    Some(Flow {
        id,
        member: sock,
        sent_any: false,
        pending: Traffic::default(),
        last_report: Instant::now(),
    })
}

async fn member_reader(
    shared: Arc<Shared>,
    member: Arc<UdpSocket>,
    listener: Arc<UdpSocket>,
    client: SocketAddr,
    id: SessionId,
    mut kill: oneshot::Receiver<Outcome>,
    ended: mpsc::UnboundedSender<(SocketAddr, SessionId)>,
) {
    let mut buf = vec![0u8; MAX_DATAGRAM];
    let mut reached = false;
    let mut pending = Traffic::default();
    let mut last_report = Instant::now();
    let report = shared.config.runtime.report_interval;
    loop {
        let r = tokio::select! {
            r = member.recv(&mut buf) => r,
            _ = &mut kill => break,
        };
        match r {
            Ok(n) => {
                if !reached {
                    reached = true;
                    shared.with(|core, now| core.reached(now, id));
                }
                let _ = listener.send_to(&buf[..n], client).await;
                pending.bytes += n as u64;
                pending.packets += 1;
                if last_report.elapsed() >= report {
                    last_report = Instant::now();
                    let t = std::mem::take(&mut pending);
                    shared.with(|core, now| core.activity(now, id, Traffic::default(), t));
                }
            }
            Err(e) => {
                let r = reason(&e);
                let t = std::mem::take(&mut pending);
                shared.with(|core, now| {
                    core.activity(now, id, Traffic::default(), t);
                    core.member_failed(now, id, &r)
                });
                shared.lock().kills.remove(&id);
                break;
            }
        }
    }
    if pending != Traffic::default() {
        shared.with(|core, now| core.activity(now, id, Traffic::default(), pending));
    }
    let _ = ended.send((client, id));
}
