//! TCP associations: the framed mapping of `docs/tcp-mapping.md` and plain-TCP ASAP.
//!
//! Each association is one tokio task that reads and writes its connection concurrently
//! (reading never waits for writing), keeps the keep-alive clock, and reports through the
//! endpoint's event queue. [`frame`] holds the frame format without I/O.

pub mod frame;

use crate::config::Limits;
use crate::endpoint::{
    Assoc, AssocState, AssociationId, AssociationKind, Backend, DownReason, Event, SendFailure,
    Shared,
};
use crate::error::{SendError, TransportError};
use crate::stats::Counters;
use crate::tls::{identity_of, PeerIdentity, TlsContext};
use bytes::{Bytes, BytesMut};
use frame::{AsapLengthDecoder, FrameDecoder, FrameError, FrameType};
use std::io;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::{mpsc, Notify};
use tokio::time::{timeout, Instant};

/// How messages are delimited on a TCP connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Framing {
    Mapped,
    PlainAsap,
}

impl Framing {
    fn kind(self) -> AssociationKind {
        match self {
            Framing::Mapped => AssociationKind::TcpMapped,
            Framing::PlainAsap => AssociationKind::TcpPlain,
        }
    }
}

#[derive(Debug)]
enum Cmd {
    Data { ppid: u32, stream: u16, data: Bytes },
    Close,
}

/// The endpoint's handle on one TCP association task.
#[derive(Debug, Clone)]
pub(crate) struct ConnHandle {
    tx: mpsc::Sender<Cmd>,
    abort: Arc<Notify>,
}

impl ConnHandle {
    pub async fn send(
        &self,
        id: AssociationId,
        ppid: u32,
        stream: u16,
        data: Bytes,
        wait: bool,
        limits: &Limits,
    ) -> Result<(), SendError> {
        let cmd = Cmd::Data { ppid, stream, data };
        if wait {
            match timeout(limits.send_timeout, self.tx.send(cmd)).await {
                Ok(Ok(())) => Ok(()),
                Ok(Err(_)) => Err(SendError::UnknownAssociation(id)),
                Err(_) => Err(SendError::Timeout(id)),
            }
        } else {
            self.tx.try_send(cmd).map_err(|e| match e {
                mpsc::error::TrySendError::Full(Cmd::Data { data, .. }) => {
                    SendError::QueueFull { id, data }
                }
                mpsc::error::TrySendError::Full(Cmd::Close) => SendError::QueueFull {
                    id,
                    data: Bytes::new(),
                },
                mpsc::error::TrySendError::Closed(_) => SendError::UnknownAssociation(id),
            })
        }
    }

    pub async fn close(&self, limits: &Limits) {
        // Queued behind the data already accepted; if the queue stays full, abort instead.
        if timeout(limits.send_timeout, self.tx.send(Cmd::Close))
            .await
            .map_or(true, |r| r.is_err())
        {
            self.abort();
        }
    }

    pub fn abort(&self) {
        self.abort.notify_one();
    }
}

fn new_socket(addr: &SocketAddr) -> io::Result<TcpSocket> {
    match addr {
        SocketAddr::V4(_) => TcpSocket::new_v4(),
        SocketAddr::V6(_) => TcpSocket::new_v6(),
    }
}

/// Binds one listener per address (all on one port) and starts their accept loops.
pub(crate) fn listen(
    shared: &Arc<Shared>,
    framing: Framing,
    addrs: &[SocketAddr],
) -> Result<Vec<SocketAddr>, TransportError> {
    let addrs: Vec<SocketAddr> = if addrs.is_empty() {
        vec![SocketAddr::new(IpAddr::V6(Ipv6Addr::UNSPECIFIED), 0)]
    } else {
        addrs.to_vec()
    };
    let mut port = addrs
        .iter()
        .map(|a| a.port())
        .find(|&p| p != 0)
        .unwrap_or(0);
    let mut bound = Vec::new();
    let mut listeners = Vec::new();
    for a in &addrs {
        let a = SocketAddr::new(a.ip(), port);
        let bind_err = |source| TransportError::Bind {
            addr: a.to_string(),
            source,
        };
        let s = new_socket(&a).map_err(bind_err)?;
        s.set_reuseaddr(true).map_err(bind_err)?;
        if framing == Framing::Mapped && shared.config.tcp.connect_from_listening_port {
            s.set_reuseport(true).map_err(bind_err)?;
        }
        s.bind(a).map_err(bind_err)?;
        let l = s.listen(1024).map_err(bind_err)?;
        let local = l.local_addr().map_err(bind_err)?;
        port = local.port();
        bound.push(local);
        listeners.push(l);
    }
    for l in listeners {
        let sh = shared.clone();
        shared.spawn(accept_loop(sh, l, framing));
    }
    tracing::info!(?bound, ?framing, "TCP listening");
    Ok(bound)
}

async fn accept_loop(shared: Arc<Shared>, l: TcpListener, framing: Framing) {
    loop {
        let (stream, peer) = match l.accept().await {
            Ok(x) => x,
            Err(e) => {
                // Out of descriptors and similar: wait a little instead of spinning.
                tracing::warn!(error = %e, "TCP accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let id = shared.alloc_id();
        let (handle, rx) = conn_channel(&shared.config.limits);
        let local = stream.local_addr().ok();
        let assoc = Assoc {
            kind: framing.kind(),
            state: AssocState::Connecting,
            inbound: true,
            local_addrs: local.into_iter().collect(),
            peer_addrs: vec![peer],
            outbound_streams: out_streams(framing),
            backend: Backend::Tcp(handle.clone()),
            peer_identity: None,
        };
        if shared.insert(id, assoc).is_err() {
            Counters::add(&shared.counters.refused, 1);
            tracing::warn!(%peer, limit = shared.config.limits.max_associations,
                "association limit reached: inbound TCP connection refused");
            let _ = socket2::SockRef::from(&stream).set_linger(Some(Duration::ZERO));
            drop(stream);
            continue;
        }
        let sh = shared.clone();
        shared.spawn(run_inbound(sh, id, stream, peer, framing, rx, handle.abort));
    }
}

/// Runs an accepted connection: the TLS handshake first where TLS is configured (in this
/// connection's task, bounded by the handshake timeout, so a slow or hostile peer holds up no
/// other), then the association.
async fn run_inbound(
    shared: Arc<Shared>,
    id: AssociationId,
    stream: TcpStream,
    peer: SocketAddr,
    framing: Framing,
    rx: mpsc::Receiver<Cmd>,
    abort: Arc<Notify>,
) {
    let Some(tls) = shared.tls.clone() else {
        return run_conn(shared, id, stream, framing, rx, abort, None).await;
    };
    let Some(acceptor) = tls.acceptor.clone() else {
        // Endpoint::bind refuses a TLS listener without a certificate; nothing to serve.
        shared.forget(id);
        return;
    };
    let handshake = timeout(tls.handshake_timeout, acceptor.accept(stream));
    let result = tokio::select! {
        r = handshake => r,
        _ = abort.notified() => {
            shared.forget(id);
            return;
        }
    };
    match result {
        Ok(Ok(s)) => {
            Counters::add(&shared.counters.tls_handshakes, 1);
            let identity = identity_of(s.get_ref().1.peer_certificates());
            tracing::debug!(%id, %peer, identity = ?identity.as_deref().map(ToString::to_string),
                "TLS handshake done (inbound)");
            run_conn(shared, id, s, framing, rx, abort, identity).await
        }
        Ok(Err(e)) => {
            Counters::add(&shared.counters.tls_handshake_failures, 1);
            let reason = crate::tls::tls_reason(&e).unwrap_or_else(|| e.to_string());
            tracing::warn!(%peer, %reason, "TLS handshake failed (inbound): connection dropped");
            shared.forget(id);
        }
        Err(_) => {
            Counters::add(&shared.counters.tls_handshake_timeouts, 1);
            tracing::warn!(%peer, timeout = ?tls.handshake_timeout,
                "TLS handshake timed out (inbound): connection dropped");
            shared.forget(id);
        }
    }
}

/// An outbound connection ready to carry the association.
enum Established {
    Plain(TcpStream),
    Tls(
        Box<tokio_rustls::client::TlsStream<TcpStream>>,
        Option<Arc<PeerIdentity>>,
    ),
}

/// The client side of the TLS handshake on an established TCP connection; counts and logs the
/// outcome. The server's name is the configured one, else the address connected to.
async fn tls_connect(
    shared: &Shared,
    tls: &TlsContext,
    stream: TcpStream,
) -> Result<
    (
        tokio_rustls::client::TlsStream<TcpStream>,
        Option<Arc<PeerIdentity>>,
    ),
    String,
> {
    let peer = stream
        .peer_addr()
        .map_err(|e| format!("TLS: no peer address: {e}"))?;
    let name = tls
        .server_name
        .clone()
        .unwrap_or_else(|| rustls::pki_types::ServerName::IpAddress(peer.ip().into()));
    match timeout(tls.handshake_timeout, tls.connector.connect(name, stream)).await {
        Ok(Ok(s)) => {
            Counters::add(&shared.counters.tls_handshakes, 1);
            let identity = identity_of(s.get_ref().1.peer_certificates());
            tracing::debug!(%peer, identity = ?identity.as_deref().map(ToString::to_string),
                "TLS handshake done (outbound)");
            Ok((s, identity))
        }
        Ok(Err(e)) => {
            Counters::add(&shared.counters.tls_handshake_failures, 1);
            let reason = crate::tls::tls_reason(&e).unwrap_or_else(|| e.to_string());
            tracing::warn!(%peer, %reason, "TLS handshake failed (outbound)");
            Err(format!("handshake with {peer} failed: {reason}"))
        }
        Err(_) => {
            Counters::add(&shared.counters.tls_handshake_timeouts, 1);
            tracing::warn!(%peer, timeout = ?tls.handshake_timeout, "TLS handshake timed out (outbound)");
            Err(format!(
                "handshake with {peer} timed out after {:?}",
                tls.handshake_timeout
            ))
        }
    }
}

fn out_streams(framing: Framing) -> u16 {
    match framing {
        Framing::Mapped => u16::MAX,
        Framing::PlainAsap => 1,
    }
}

fn conn_channel(limits: &Limits) -> (ConnHandle, mpsc::Receiver<Cmd>) {
    let (tx, rx) = mpsc::channel(limits.send_queue);
    (
        ConnHandle {
            tx,
            abort: Arc::new(Notify::new()),
        },
        rx,
    )
}

/// Starts an outbound mapped association: tries each address in order.
pub(crate) fn connect(
    shared: &Arc<Shared>,
    addrs: &[SocketAddr],
) -> Result<AssociationId, TransportError> {
    let id = shared.alloc_id();
    let (handle, rx) = conn_channel(&shared.config.limits);
    let assoc = Assoc {
        kind: AssociationKind::TcpMapped,
        state: AssocState::Connecting,
        inbound: false,
        local_addrs: Vec::new(),
        peer_addrs: addrs.to_vec(),
        outbound_streams: u16::MAX,
        backend: Backend::Tcp(handle.clone()),
        peer_identity: None,
    };
    shared
        .insert(id, assoc)
        .map_err(|_| TransportError::TooManyAssociations(shared.config.limits.max_associations))?;
    let sh = shared.clone();
    let addrs = addrs.to_vec();
    shared.spawn(async move {
        let abort = handle.abort.clone();
        let attempt = tokio::select! {
            r = connect_any(&sh, &addrs) => r,
            _ = abort.notified() => Err("aborted locally".to_string()),
        };
        let attempt = match (attempt, sh.tls.clone()) {
            (Ok(stream), Some(tls)) => tokio::select! {
                r = tls_connect(&sh, &tls, stream) => r
                    .map(|(s, identity)| Established::Tls(Box::new(s), identity))
                    .map_err(DownReason::Tls),
                _ = abort.notified() => Err(DownReason::LocalAbort),
            },
            (Ok(stream), None) => Ok(Established::Plain(stream)),
            (Err(e), _) => Err(DownReason::ConnectFailed(e)),
        };
        match attempt {
            Ok(Established::Plain(stream)) => {
                run_conn(sh, id, stream, Framing::Mapped, rx, handle.abort, None).await
            }
            Ok(Established::Tls(stream, identity)) => {
                run_conn(sh, id, *stream, Framing::Mapped, rx, handle.abort, identity).await
            }
            Err(e) => {
                let reason = match sh.state(id) {
                    Some(AssocState::Aborting) => DownReason::LocalAbort,
                    _ => e,
                };
                sh.down(id, reason).await;
                drain_unsent(&sh, id, rx).await;
            }
        }
    });
    Ok(id)
}

async fn connect_any(shared: &Shared, addrs: &[SocketAddr]) -> Result<TcpStream, String> {
    let mut errors = Vec::new();
    for a in addrs {
        let local = shared
            .config
            .local_addrs
            .iter()
            .find(|l| l.is_ipv4() == a.is_ipv4() && !l.ip().is_unspecified())
            .map(|l| SocketAddr::new(l.ip(), 0));
        // From the listening port where asked (the peer can connect back to the address it
        // sees); from an ephemeral port when that is not possible, e.g. while an earlier
        // connection to the same peer lingers in TIME_WAIT.
        let listening = shared
            .listening
            .get()
            .filter(|_| shared.config.tcp.connect_from_listening_port)
            .and_then(|l| {
                l.iter()
                    .find(|l| l.is_ipv4() == a.is_ipv4() && !l.ip().is_unspecified())
                    .copied()
            });
        let attempt = |from: Option<SocketAddr>, reuse: bool| async move {
            let s = new_socket(a)?;
            if let Some(l) = from {
                if reuse {
                    s.set_reuseaddr(true)?;
                    s.set_reuseport(true)?;
                }
                s.bind(l)?;
            }
            s.connect(*a).await
        };
        if let Some(l) = listening {
            match timeout(shared.config.tcp.connect_timeout, attempt(Some(l), true)).await {
                Ok(Ok(s)) => return Ok(s),
                Ok(Err(e))
                    if matches!(
                        e.kind(),
                        io::ErrorKind::AddrInUse | io::ErrorKind::AddrNotAvailable
                    ) => {}
                Ok(Err(e)) => {
                    errors.push(format!("{a}: {e}"));
                    continue;
                }
                Err(_) => {
                    errors.push(format!("{a}: timed out"));
                    continue;
                }
            }
        }
        match timeout(shared.config.tcp.connect_timeout, attempt(local, false)).await {
            Ok(Ok(s)) => return Ok(s),
            Ok(Err(e)) => errors.push(format!("{a}: {e}")),
            Err(_) => errors.push(format!("{a}: timed out")),
        }
    }
    Err(errors.join("; "))
}

/// Reports the messages still queued for a closed association as not sent.
async fn drain_unsent(shared: &Shared, id: AssociationId, mut rx: mpsc::Receiver<Cmd>) {
    rx.close();
    while let Ok(cmd) = rx.try_recv() {
        if let Cmd::Data { ppid, stream, data } = cmd {
            Counters::add(&shared.counters.send_failures, 1);
            shared
                .emit(Event::SendFailed {
                    id,
                    failure: SendFailure {
                        ppid,
                        stream,
                        data,
                        maybe_sent: false,
                    },
                })
                .await;
        }
    }
}

fn io_reason(e: &io::Error) -> DownReason {
    if let Some(reason) = crate::tls::tls_reason(e) {
        return DownReason::Tls(reason);
    }
    match e.kind() {
        io::ErrorKind::ConnectionReset
        | io::ErrorKind::ConnectionAborted
        | io::ErrorKind::BrokenPipe
        // TLS: the peer closed the TCP connection without a close_notify.
        | io::ErrorKind::UnexpectedEof => DownReason::PeerAborted,
        io::ErrorKind::TimedOut => DownReason::KeepAliveTimeout,
        _ => DownReason::Io(e.to_string()),
    }
}

enum Decoder {
    Mapped(FrameDecoder),
    Plain(AsapLengthDecoder),
}

/// A byte stream an association runs on: a TCP connection, or TLS over one.
trait Conn: AsyncRead + AsyncWrite + Unpin + Send {
    /// The TCP connection underneath (addresses, socket options).
    fn tcp(&self) -> &TcpStream;
    /// Halves that read and write concurrently.
    fn halves(
        &mut self,
    ) -> (
        impl AsyncRead + Unpin + Send + '_,
        impl AsyncWrite + Unpin + Send + '_,
    );
}

impl Conn for TcpStream {
    fn tcp(&self) -> &TcpStream {
        self
    }

    fn halves(
        &mut self,
    ) -> (
        impl AsyncRead + Unpin + Send + '_,
        impl AsyncWrite + Unpin + Send + '_,
    ) {
        self.split()
    }
}

impl Conn for tokio_rustls::server::TlsStream<TcpStream> {
    fn tcp(&self) -> &TcpStream {
        self.get_ref().0
    }

    fn halves(
        &mut self,
    ) -> (
        impl AsyncRead + Unpin + Send + '_,
        impl AsyncWrite + Unpin + Send + '_,
    ) {
        tokio::io::split(self)
    }
}

impl Conn for tokio_rustls::client::TlsStream<TcpStream> {
    fn tcp(&self) -> &TcpStream {
        self.get_ref().0
    }

    fn halves(
        &mut self,
    ) -> (
        impl AsyncRead + Unpin + Send + '_,
        impl AsyncWrite + Unpin + Send + '_,
    ) {
        tokio::io::split(self)
    }
}

/// Runs one established connection until it ends, then reports it down.
async fn run_conn(
    shared: Arc<Shared>,
    id: AssociationId,
    mut stream: impl Conn,
    framing: Framing,
    mut rx: mpsc::Receiver<Cmd>,
    abort: Arc<Notify>,
    peer_identity: Option<Arc<PeerIdentity>>,
) {
    let cfg = &shared.config;
    let _ = stream.tcp().set_nodelay(cfg.tcp.nodelay);
    if framing == Framing::PlainAsap {
        // Plain ASAP has no keep-alive of its own: let the kernel probe idle connections.
        if let Some(i) = cfg.tcp.keepalive_interval {
            let ka = socket2::TcpKeepalive::new().with_time(i).with_interval(i);
            let _ = socket2::SockRef::from(stream.tcp()).set_tcp_keepalive(&ka);
        }
    }
    let local = stream
        .tcp()
        .local_addr()
        .map(|a| vec![a])
        .unwrap_or_default();
    let peer = stream
        .tcp()
        .peer_addr()
        .map(|a| vec![a])
        .unwrap_or_default();
    shared
        .up(id, local, peer, out_streams(framing), peer_identity)
        .await;

    let reason = {
        let (rd, wr) = stream.halves();
        let (ka_tx, ka_rx) = mpsc::channel::<Bytes>(4);
        tokio::select! {
            r = read_side(&shared, id, rd, framing, ka_tx) => r,
            r = write_side(&shared, wr, framing, &mut rx, ka_rx) => r,
            _ = abort.notified() => DownReason::LocalAbort,
        }
    };
    let reason = match (reason, shared.state(id)) {
        // A close or abort asked for locally explains whatever the socket reported afterwards.
        (DownReason::LocalClose, _) => DownReason::LocalClose,
        (_, Some(AssocState::Aborting)) => DownReason::LocalAbort,
        (r, _) => r,
    };
    if reason == DownReason::LocalClose {
        // Our FIN is sent; read (and drop) what the peer still sends until it closes too, so
        // that closing with unread data does not turn into a reset that could destroy what we
        // sent last.
        let mut sink = [0u8; 4096];
        let _ = timeout(cfg.tcp.keepalive_timeout, async {
            while matches!(stream.read(&mut sink).await, Ok(n) if n > 0) {}
        })
        .await;
    }
    if matches!(
        reason,
        DownReason::LocalAbort | DownReason::Protocol(_) | DownReason::KeepAliveTimeout
    ) {
        // Reset rather than close: the peer learns at once, nothing more is delivered.
        let _ = socket2::SockRef::from(stream.tcp()).set_linger(Some(Duration::ZERO));
    }
    drop(stream);
    if let DownReason::Protocol(e) = &reason {
        tracing::warn!(%id, error = %e, "closing TCP association: bad input from peer");
    }
    shared.down(id, reason).await;
    drain_unsent(&shared, id, rx).await;
}

async fn read_side(
    shared: &Shared,
    id: AssociationId,
    mut rd: impl AsyncRead + Unpin,
    framing: Framing,
    ka_tx: mpsc::Sender<Bytes>,
) -> DownReason {
    let cfg = &shared.config;
    let max = cfg.limits.max_message_size;
    let decoder = match framing {
        Framing::Mapped => Decoder::Mapped(FrameDecoder::new(max)),
        Framing::PlainAsap => Decoder::Plain(AsapLengthDecoder::new(max)),
    };
    let ka_interval = match framing {
        Framing::Mapped => cfg.tcp.keepalive_interval,
        Framing::PlainAsap => None,
    };
    let ka_timeout = cfg.tcp.keepalive_timeout;
    let tick_every = ka_interval.map_or(Duration::from_secs(3600), |i| {
        (i / 4).max(Duration::from_millis(10))
    });
    let mut tick = tokio::time::interval(tick_every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_rx = Instant::now();
    let mut last_probe: Option<Instant> = None;
    let mut probe_seq: u64 = 0;
    let mut buf = BytesMut::with_capacity(16 * 1024);
    loop {
        tokio::select! {
            r = rd.read_buf(&mut buf) => {
                match r {
                    Ok(0) => {
                        let pending = buf.len();
                        return if pending == 0 {
                            DownReason::PeerClosed
                        } else {
                            DownReason::Protocol(FrameError::Truncated(pending))
                        };
                    }
                    Ok(_) => {}
                    Err(e) => return io_reason(&e),
                }
                loop {
                    match &decoder {
                        Decoder::Mapped(d) => match d.decode(&mut buf) {
                            Ok(None) => break,
                            Ok(Some(f)) => match f.frame_type {
                                FrameType::Data => {
                                    shared.received(f.payload.len());
                                    shared.emit(Event::Message { id, ppid: f.ppid, stream: f.stream, data: f.payload }).await;
                                }
                                FrameType::KeepAlive => {
                                    let mut ack = BytesMut::new();
                                    frame::encode(&mut ack, FrameType::KeepAliveAck, 0, 0, &f.payload);
                                    // If acks are already queued the peer hears from us anyway.
                                    let _ = ka_tx.try_send(ack.freeze());
                                }
                                FrameType::KeepAliveAck => {}
                            },
                            Err(e) => return DownReason::Protocol(e),
                        },
                        Decoder::Plain(d) => match d.decode(&mut buf) {
                            Ok(None) => break,
                            Ok(Some(m)) => {
                                shared.received(m.len());
                                shared.emit(Event::Message { id, ppid: crate::PPID_ASAP, stream: 0, data: m }).await;
                            }
                            Err(e) => return DownReason::Protocol(e),
                        },
                    }
                }
                // Time spent waiting for room in the event queue is not the peer's silence.
                last_rx = Instant::now();
                last_probe = None;
            }
            _ = tick.tick() => {
                let Some(interval) = ka_interval else { continue };
                let silent = last_rx.elapsed();
                if silent >= ka_timeout {
                    tracing::info!(%id, ?silent, "TCP keep-alive timeout");
                    return DownReason::KeepAliveTimeout;
                }
                if silent >= interval && last_probe.is_none_or(|p| p.elapsed() >= interval) {
                    probe_seq += 1;
                    let mut ka = BytesMut::new();
                    frame::encode(&mut ka, FrameType::KeepAlive, 0, 0, &probe_seq.to_be_bytes());
                    let _ = ka_tx.try_send(ka.freeze());
                    last_probe = Some(Instant::now());
                }
            }
        }
    }
}

async fn write_side(
    shared: &Shared,
    mut wr: impl AsyncWrite + Unpin,
    framing: Framing,
    rx: &mut mpsc::Receiver<Cmd>,
    mut ka_rx: mpsc::Receiver<Bytes>,
) -> DownReason {
    const BATCH: usize = 64 * 1024;
    let stall = shared.config.tcp.keepalive_timeout;
    let mut out = BytesMut::with_capacity(BATCH);
    loop {
        let mut closing = false;
        tokio::select! {
            biased;
            Some(b) = ka_rx.recv() => out.extend_from_slice(&b),
            cmd = rx.recv() => {
                let mut next = cmd;
                loop {
                    match next {
                        Some(Cmd::Data { ppid, stream, data }) => match framing {
                            Framing::Mapped => frame::encode(&mut out, FrameType::Data, stream, ppid, &data),
                            Framing::PlainAsap => out.extend_from_slice(&data),
                        },
                        Some(Cmd::Close) | None => { closing = true; break; }
                    }
                    if out.len() >= BATCH { break; }
                    match rx.try_recv() {
                        Ok(c) => next = Some(c),
                        Err(_) => break,
                    }
                }
            }
        }
        if !out.is_empty() {
            match timeout(stall, wr.write_all(&out)).await {
                Ok(Ok(())) => out.clear(),
                Ok(Err(e)) => return io_reason(&e),
                Err(_) => return DownReason::WriteStalled,
            }
        }
        if closing {
            let _ = timeout(stall, wr.shutdown()).await;
            return DownReason::LocalClose;
        }
    }
}
