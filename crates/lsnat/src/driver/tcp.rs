//! TCP: accept on a virtual address, bind the session in the core, connect to the member,
//! relay both ways with half-close, and report what the sockets said.

use super::Shared;
use crate::core::receipt::{Outcome, Side};
use crate::core::{Binding, FlowKey, Protocol, SessionId, Traffic};
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{ReadHalf, WriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{oneshot, watch};

/// Binds a listening socket (IPv6 sockets are IPv6-only, so an IPv4 and an IPv6 listener on
/// the same port can coexist). With `reuse_port`, the socket joins the port's SO_REUSEPORT
/// group: each worker thread has its own socket and accept queue, and the kernel spreads new
/// connections over them.
pub(crate) fn bind(addr: SocketAddr, reuse_port: bool) -> io::Result<std::net::TcpListener> {
    let domain = socket2::Domain::for_address(addr);
    let s = socket2::Socket::new(domain, socket2::Type::STREAM, Some(socket2::Protocol::TCP))?;
    s.set_reuse_address(true)?;
    #[cfg(unix)]
    if reuse_port {
        s.set_reuse_port(true)?;
    }
    #[cfg(not(unix))]
    let _ = reuse_port;
    if addr.is_ipv6() {
        s.set_only_v6(true)?;
    }
    s.set_nonblocking(true)?;
    s.bind(&addr.into())?;
    s.listen(4096)?;
    Ok(s.into())
}

/// Binds `workers` listening sockets on `addr`, one per worker thread (SO_REUSEPORT where
/// there is more than one). The port is first bound alone, without SO_REUSEPORT, so that a
/// port another process listens on is refused as "in use" (not shared with it); with port 0
/// that first bind picks the port all workers then share.
pub(crate) fn bind_group(
    addr: SocketAddr,
    workers: usize,
) -> io::Result<Vec<std::net::TcpListener>> {
    if workers <= 1 || cfg!(not(unix)) {
        return Ok(vec![bind(addr, false)?]);
    }
    let resolved = {
        let domain = socket2::Domain::for_address(addr);
        let s = socket2::Socket::new(domain, socket2::Type::STREAM, Some(socket2::Protocol::TCP))?;
        s.set_reuse_address(true)?;
        if addr.is_ipv6() {
            s.set_only_v6(true)?;
        }
        s.bind(&addr.into())?;
        s.local_addr()?
            .as_socket()
            .ok_or_else(|| io::Error::other("bound address is not an IP address"))?
    };
    (0..workers).map(|_| bind(resolved, true)).collect()
}

fn abort(stream: &TcpStream) {
    // SO_LINGER 0: close() sends RST, so the peer sees an abortive end, not a clean one.
    let _ = socket2::SockRef::from(stream).set_linger(Some(Duration::ZERO));
}

pub(crate) async fn accept_loop(
    shared: Arc<Shared>,
    listener: TcpListener,
    mut stop: watch::Receiver<bool>,
) {
    let local = listener.local_addr().ok();
    loop {
        let accepted = tokio::select! {
            r = listener.accept() => r,
            _ = stop.changed() => break,
        };
        let (client, peer) = match accepted {
            Ok(x) => x,
            Err(e) => {
                // Out of descriptors or a connection aborted before accept: keep serving.
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            }
        };
        let _ = client.set_nodelay(true);
        // A listener on a specific address needs no getsockname per connection.
        let virtual_address = match local {
            Some(l) if !l.ip().is_unspecified() => l,
            _ => client.local_addr().ok().or(local).unwrap_or(peer),
        };
        let flow = FlowKey {
            protocol: Protocol::Tcp,
            client: peer,
            virtual_address,
        };
        let (tx, rx) = oneshot::channel();
        let bound = {
            let now = shared.now();
            let mut g = shared.lock();
            let r = g.core.open(now, flow);
            if let Ok(b) = &r {
                g.kills.insert(b.session, tx);
            }
            g.apply_actions();
            r
        };
        match bound {
            Ok(b) => {
                tokio::spawn(session(shared.clone(), client, b, rx));
            }
            Err(_) => abort(&client),
        }
    }
}

#[derive(Default)]
struct Pending {
    to_member: AtomicU64,
    to_member_reads: AtomicU64,
    to_client: AtomicU64,
    to_client_reads: AtomicU64,
    last_report_ns: AtomicU64,
}

impl Pending {
    fn take(&self) -> (Traffic, Traffic) {
        (
            Traffic {
                bytes: self.to_member.swap(0, Ordering::Relaxed),
                packets: self.to_member_reads.swap(0, Ordering::Relaxed),
            },
            Traffic {
                bytes: self.to_client.swap(0, Ordering::Relaxed),
                packets: self.to_client_reads.swap(0, Ordering::Relaxed),
            },
        )
    }
}

pub(crate) struct Ctx<'a> {
    shared: &'a Shared,
    splice: bool,
    /// Directions that have seen EOF (bit per side they came from).
    done: AtomicU8,
    id: SessionId,
    pending: Pending,
    report_ns: u64,
}

impl Ctx<'_> {
    pub(crate) fn count(&self, from: Side, n: usize) {
        let (b, r) = match from {
            Side::Client => (&self.pending.to_member, &self.pending.to_member_reads),
            Side::Member => (&self.pending.to_client, &self.pending.to_client_reads),
        };
        b.fetch_add(n as u64, Ordering::Relaxed);
        r.fetch_add(1, Ordering::Relaxed);
        let now = self.shared.now();
        let now_ns = u64::try_from(now.as_nanos()).unwrap_or(u64::MAX);
        let last = self.pending.last_report_ns.load(Ordering::Relaxed);
        if now_ns.saturating_sub(last) >= self.report_ns {
            self.pending.last_report_ns.store(now_ns, Ordering::Relaxed);
            self.report();
        }
    }

    fn report(&self) {
        let (m, c) = self.pending.take();
        if m.bytes == 0 && c.bytes == 0 {
            return;
        }
        let id = self.id;
        self.shared.with(|core, now| core.activity(now, id, m, c));
    }

    /// Hands the core the traffic not yet reported, from inside a call that holds its lock
    /// already (one lock per event, not two).
    fn report_into(&self, core: &mut crate::core::Gateway, now: crate::core::Time) {
        let (m, c) = self.pending.take();
        if m.bytes != 0 || c.bytes != 0 {
            core.activity(now, self.id, m, c);
        }
    }

    pub(crate) fn first(&self, from: Side) {
        let id = self.id;
        self.shared.with(|core, now| match from {
            Side::Client => core.client_data(now, id),
            Side::Member => core.reached(now, id),
        });
    }

    /// Whether the direction opposite to the one from `from` has finished.
    pub(crate) fn other_done(&self, from: Side) -> bool {
        self.done.load(Ordering::Relaxed) & side_bit(other(from)) != 0
    }

    pub(crate) fn half_closed(&self, from: Side) {
        self.done.fetch_or(side_bit(from), Ordering::Relaxed);
        let id = self.id;
        self.shared.with(|core, now| {
            self.report_into(core, now);
            core.half_closed(now, id, from);
        });
    }
}

fn side_bit(side: Side) -> u8 {
    match side {
        Side::Client => 1,
        Side::Member => 2,
    }
}

fn other(side: Side) -> Side {
    match side {
        Side::Client => Side::Member,
        Side::Member => Side::Client,
    }
}

/// The side whose socket failed, and the error.
pub(crate) type RelayError = (Side, io::Error);

async fn pump(
    r: &mut ReadHalf<'_>,
    w: &mut WriteHalf<'_>,
    buf_size: usize,
    from: Side,
    ctx: &Ctx<'_>,
) -> Result<(), RelayError> {
    // Read into spare capacity: no zeroing, and short exchanges never touch most of it.
    let mut buf: Vec<u8> = Vec::with_capacity(buf_size);
    let mut first = true;
    loop {
        buf.clear();
        let n = r.read_buf(&mut buf).await.map_err(|e| (from, e))?;
        if n == 0 {
            // Pass the FIN on, unless the other direction is already done: then both sockets
            // are about to be closed, which sends it anyway.
            if !ctx.other_done(from) {
                let _ = w.shutdown().await;
            }
            ctx.half_closed(from);
            return Ok(());
        }
        if first {
            first = false;
            ctx.first(from);
        }
        w.write_all(&buf).await.map_err(|e| (other(from), e))?;
        ctx.count(from, n);
        // A read that fills the buffer marks a bulk direction: move it into the kernel.
        #[cfg(target_os = "linux")]
        if ctx.splice && n == buf_size {
            let pipe_size = buf_size.max(super::splice::MIN_PIPE);
            match super::splice::Pipe::new(pipe_size) {
                Ok(pipe) => {
                    drop(buf);
                    return super::splice::pump(
                        r.as_ref(),
                        w.as_ref(),
                        &pipe,
                        pipe_size,
                        from,
                        ctx,
                    )
                    .await;
                }
                Err(e) => tracing::debug!(error = %e, "no pipe for splice; copying"),
            }
        }
    }
}

async fn connect(addr: SocketAddr, timeout: Duration) -> Result<TcpStream, String> {
    match tokio::time::timeout(timeout, TcpStream::connect(addr)).await {
        Ok(Ok(s)) => Ok(s),
        Ok(Err(e)) => Err(io_reason(&e)),
        Err(_) => Err(format!("connect timed out after {timeout:?}")),
    }
}

fn io_reason(e: &io::Error) -> String {
    match e.kind() {
        io::ErrorKind::ConnectionRefused => "connection refused".into(),
        io::ErrorKind::ConnectionReset => "connection reset".into(),
        io::ErrorKind::TimedOut => "timed out".into(),
        _ => e.to_string(),
    }
}

/// Counts a relay as running while it lives (a stopping worker waits for them).
struct Live(Arc<Shared>);

impl Live {
    fn new(shared: Arc<Shared>) -> Live {
        shared.relays.fetch_add(1, Ordering::Relaxed);
        Live(shared)
    }
}

impl Drop for Live {
    fn drop(&mut self) {
        self.0.relays.fetch_sub(1, Ordering::Relaxed);
    }
}

async fn session(
    shared: Arc<Shared>,
    client: TcpStream,
    mut binding: Binding,
    mut kill: oneshot::Receiver<Outcome>,
) {
    let id = binding.session;
    let _live = Live::new(shared.clone());
    let timeout = shared.config.connect_timeout;
    let member = loop {
        let attempt = tokio::select! {
            r = connect(binding.address, timeout) => r,
            o = &mut kill => {
                if matches!(o, Ok(Outcome::MemberLost { .. })) {
                    abort(&client);
                }
                return;
            }
        };
        match attempt {
            Ok(s) => {
                shared.with(|core, now| core.connected(now, id));
                break s;
            }
            Err(reason) => {
                tracing::debug!(session = %id, member = %binding.address, %reason, "connect failed");
                let next = shared.with(|core, now| core.connect_failed(now, id, &reason));
                match next {
                    Some(b) => binding = b,
                    None => {
                        shared.lock().kills.remove(&id);
                        abort(&client);
                        return;
                    }
                }
            }
        }
    };
    let _ = member.set_nodelay(true);
    relay(shared, client, member, id, kill).await;
}

async fn relay(
    shared: Arc<Shared>,
    mut client: TcpStream,
    mut member: TcpStream,
    id: SessionId,
    mut kill: oneshot::Receiver<Outcome>,
) {
    let buf_size = shared.config.runtime.buffer_size;
    let ctx = Ctx {
        shared: &shared,
        splice: shared.config.runtime.splice,
        done: AtomicU8::new(0),
        id,
        // The first report is due one interval after the start (not at the first read).
        pending: Pending {
            last_report_ns: AtomicU64::new(
                u64::try_from(shared.now().as_nanos()).unwrap_or(u64::MAX),
            ),
            ..Pending::default()
        },
        report_ns: u64::try_from(shared.config.runtime.report_interval.as_nanos())
            .unwrap_or(u64::MAX),
    };
    let result = copy_both(&mut client, &mut member, buf_size, &ctx, &mut kill).await;
    let outcome = match result {
        Err(killed) => {
            // The core ended the session (idle timeout, member lost, shutdown): it is recorded.
            if !matches!(killed, Ok(Outcome::IdleTimeout { .. })) {
                abort(&client);
                abort(&member);
            }
            ctx.report();
            return;
        }
        Ok(Ok(_)) => Outcome::Closed,
        Ok(Err((side, e))) => {
            let reset = matches!(
                e.kind(),
                io::ErrorKind::ConnectionReset | io::ErrorKind::BrokenPipe
            );
            // Pass an abortive end on to the other side.
            match side {
                Side::Client => abort(&member),
                Side::Member => abort(&client),
            }
            if reset {
                Outcome::Reset { by: side }
            } else if side == Side::Member {
                Outcome::MemberLost {
                    reason: io_reason(&e),
                }
            } else {
                Outcome::Aborted {
                    by: side,
                    reason: io_reason(&e),
                }
            }
        }
    };
    let now = shared.now();
    let mut g = shared.lock();
    ctx.report_into(&mut g.core, now);
    g.core.closed(now, id, outcome);
    g.kills.remove(&id);
    g.apply_actions();
}

async fn copy_both(
    client: &mut TcpStream,
    member: &mut TcpStream,
    buf_size: usize,
    ctx: &Ctx<'_>,
    kill: &mut oneshot::Receiver<Outcome>,
) -> Result<Result<((), ()), RelayError>, Result<Outcome, oneshot::error::RecvError>> {
    let (mut cr, mut cw) = client.split();
    let (mut mr, mut mw) = member.split();
    let up = pump(&mut cr, &mut mw, buf_size, Side::Client, ctx);
    let down = pump(&mut mr, &mut cw, buf_size, Side::Member, ctx);
    tokio::select! {
        r = async { tokio::try_join!(up, down) } => Ok(r),
        o = kill => Err(o),
    }
}
