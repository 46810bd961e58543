//! The endpoint: one event queue for all associations, whatever carries them.

use crate::config::{EndpointConfig, TransportChoice};
use crate::error::{SendError, TransportError};
use crate::stats::{Counters, EndpointStats};
use crate::tcp::frame::FrameError;
use crate::tls::{PeerIdentity, TlsContext};
use crate::{sctp, tcp};
use bytes::Bytes;
use rustc_hash::FxHashMap;
use std::fmt;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

pub use rserpool_wire::{AssociationId, AssociationKind, TransportKind};

/// Why an association went down.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DownReason {
    /// The peer closed it gracefully (SCTP SHUTDOWN, TCP FIN at a frame boundary).
    PeerClosed,
    /// The peer aborted it (SCTP ABORT, TCP RST).
    PeerAborted,
    /// The peer stopped answering: SCTP heartbeats or retransmissions reached their limit
    /// ([`SctpConfig`](crate::SctpConfig)), or nothing arrived on a TCP mapping association
    /// within [`TcpConfig::keepalive_timeout`](crate::TcpConfig).
    KeepAliveTimeout,
    /// A TCP write made no progress within the keep-alive timeout (the peer does not read).
    WriteStalled,
    /// The peer restarted (SCTP RESTART): its state is gone. The association continues in the
    /// kernel and is reported again as a new [`Event::AssociationUp`] with a new id.
    PeerRestarted,
    /// Establishing it failed: every address was refused, unreachable or timed out.
    ConnectFailed(String),
    /// The peer sent something this transport cannot accept (bad framing, a message over the
    /// limit).
    Protocol(FrameError),
    /// Closed by [`EndpointHandle::close`].
    LocalClose,
    /// Aborted by [`EndpointHandle::abort`].
    LocalAbort,
    /// Refused at once because the endpoint holds
    /// [`Limits::max_associations`](crate::Limits).
    Refused,
    /// A system call failed; the text is the system's reason.
    Io(String),
    /// TLS failed: the handshake of an outbound association (untrusted or wrong certificate,
    /// timeout), or a TLS alert or record error later (e.g. the server refusing this client's
    /// certificate, which TLS 1.3 reports after the client's side of the handshake is done).
    Tls(String),
}

impl fmt::Display for DownReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DownReason::PeerClosed => f.write_str("peer closed"),
            DownReason::PeerAborted => f.write_str("peer aborted"),
            DownReason::KeepAliveTimeout => f.write_str("keep-alive timeout"),
            DownReason::WriteStalled => f.write_str("write stalled"),
            DownReason::PeerRestarted => f.write_str("peer restarted"),
            DownReason::ConnectFailed(e) => write!(f, "connect failed: {e}"),
            DownReason::Protocol(e) => write!(f, "protocol error: {e}"),
            DownReason::LocalClose => f.write_str("closed locally"),
            DownReason::LocalAbort => f.write_str("aborted locally"),
            DownReason::Refused => f.write_str("refused (association limit)"),
            DownReason::Io(e) => write!(f, "I/O error: {e}"),
            DownReason::Tls(e) => write!(f, "TLS: {e}"),
        }
    }
}

/// State of one peer address (path) of a multi-homed SCTP association.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PathState {
    /// Reachable again, or confirmed.
    Available,
    /// Marked unreachable (path retransmission limit reached).
    Unreachable,
    /// Potentially failed (SCTP-PF).
    PotentiallyFailed,
    /// Added to the association.
    Added,
    /// Removed from the association.
    Removed,
    /// Made the primary path.
    MadePrimary,
}

/// A message the transport reports as not delivered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SendFailure {
    /// Its PPID.
    pub ppid: u32,
    /// Its stream.
    pub stream: u16,
    /// Its payload, as far as the transport kept it (SCTP returns messages larger than one chunk
    /// as several failures, one per fragment).
    pub data: Bytes,
    /// `false`: never put on the wire. `true`: sent but not acknowledged (maybe delivered).
    pub maybe_sent: bool,
}

/// What an endpoint reports. For each association id: at most one `AssociationUp`, then messages
/// and path changes, then exactly one `AssociationDown`; `SendFailed` may come before or after
/// the `AssociationDown`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// An association is established.
    AssociationUp {
        /// Its id (from [`EndpointHandle::connect`] for outbound ones, new for inbound ones).
        id: AssociationId,
        /// What carries it.
        kind: AssociationKind,
        /// Local addresses.
        local_addrs: Vec<SocketAddr>,
        /// Peer addresses (all paths for SCTP). A registrar checks a PE's registered addresses
        /// against these (RFC 5352 §2.2.1).
        peer_addrs: Vec<SocketAddr>,
        /// `true` if the peer initiated it.
        inbound: bool,
        /// Streams usable for sending: 0..outbound_streams (65 535 for TCP, 1 for plain TCP).
        outbound_streams: u16,
        /// Who the peer proved to be with its TLS certificate; `None` without TLS or when a
        /// client connected without a certificate (allowed unless
        /// [`TlsSettings::require_client_certificate`](crate::TlsSettings)).
        peer_identity: Option<Arc<PeerIdentity>>,
    },
    /// A whole message arrived.
    Message {
        /// The association.
        id: AssociationId,
        /// Its payload protocol identifier (11 ASAP, 12 ENRP, others user data).
        ppid: u32,
        /// The stream it arrived on.
        stream: u16,
        /// The payload.
        data: Bytes,
    },
    /// An association ended; its id will not be used again.
    AssociationDown {
        /// The association.
        id: AssociationId,
        /// Why.
        reason: DownReason,
    },
    /// A path of a multi-homed SCTP association changed state.
    PeerAddressChange {
        /// The association.
        id: AssociationId,
        /// The peer address.
        addr: SocketAddr,
        /// Its new state.
        state: PathState,
    },
    /// A message was not delivered.
    SendFailed {
        /// The association.
        id: AssociationId,
        /// The message.
        failure: SendFailure,
    },
}

/// What one association is, now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AssociationInfo {
    /// Its id.
    pub id: AssociationId,
    /// What carries it.
    pub kind: AssociationKind,
    /// `true` once it is established.
    pub established: bool,
    /// `true` if the peer initiated it.
    pub inbound: bool,
    /// Local addresses (asked from the kernel for SCTP).
    pub local_addrs: Vec<SocketAddr>,
    /// Peer addresses (asked from the kernel for SCTP).
    pub peer_addrs: Vec<SocketAddr>,
    /// The peer's TLS certificate identity, if it presented one.
    pub peer_identity: Option<Arc<PeerIdentity>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AssocState {
    Connecting,
    Up,
    Closing,
    Aborting,
}

#[derive(Debug, Clone)]
pub(crate) enum Backend {
    Tcp(tcp::ConnHandle),
    Sctp { kernel_id: i32 },
}

#[derive(Debug)]
pub(crate) struct Assoc {
    pub kind: AssociationKind,
    pub state: AssocState,
    pub inbound: bool,
    pub local_addrs: Vec<SocketAddr>,
    pub peer_addrs: Vec<SocketAddr>,
    pub outbound_streams: u16,
    pub backend: Backend,
    pub peer_identity: Option<Arc<PeerIdentity>>,
}

pub(crate) struct Shared {
    pub config: EndpointConfig,
    pub kind: TransportKind,
    pub events: mpsc::Sender<Event>,
    next_id: AtomicU64,
    /// Keyed by ids this endpoint hands out, never by peers' input: a fast hash is safe.
    assocs: Mutex<FxHashMap<AssociationId, Assoc>>,
    pub counters: Counters,
    pub closed: AtomicBool,
    tasks: Mutex<Vec<JoinHandle<()>>>,
    pub sctp: std::sync::OnceLock<Arc<sctp::SctpSocket>>,
    pub tls: Option<TlsContext>,
    /// The addresses the TCP mapping listens on (set once bound).
    pub listening: std::sync::OnceLock<Vec<SocketAddr>>,
}

impl Shared {
    pub fn alloc_id(&self) -> AssociationId {
        AssociationId(self.next_id.fetch_add(1, Ordering::Relaxed))
    }

    pub fn assocs(&self) -> MutexGuard<'_, FxHashMap<AssociationId, Assoc>> {
        // A panic while holding this lock would be a bug in this crate; the map stays usable.
        self.assocs.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Inserts a new association if the limit allows.
    pub fn insert(&self, id: AssociationId, a: Assoc) -> Result<(), Assoc> {
        let mut m = self.assocs();
        if m.len() >= self.config.limits.max_associations {
            return Err(a);
        }
        m.insert(id, a);
        Ok(())
    }

    pub fn spawn(&self, f: impl std::future::Future<Output = ()> + Send + 'static) {
        let h = tokio::spawn(f);
        let mut t = self.tasks.lock().unwrap_or_else(|e| e.into_inner());
        t.retain(|h| !h.is_finished());
        t.push(h);
    }

    pub async fn emit(&self, e: Event) {
        // The receiver is gone only when the endpoint was dropped; nothing is left to tell.
        let _ = self.events.send(e).await;
    }

    /// Marks an association established and reports it.
    pub async fn up(
        &self,
        id: AssociationId,
        local_addrs: Vec<SocketAddr>,
        peer_addrs: Vec<SocketAddr>,
        outbound_streams: u16,
        peer_identity: Option<Arc<PeerIdentity>>,
    ) {
        let ev = {
            let mut m = self.assocs();
            let Some(a) = m.get_mut(&id) else { return };
            if a.state == AssocState::Connecting {
                a.state = AssocState::Up;
            }
            a.local_addrs = local_addrs.clone();
            a.peer_addrs = peer_addrs.clone();
            a.outbound_streams = outbound_streams;
            a.peer_identity = peer_identity.clone();
            Event::AssociationUp {
                id,
                kind: a.kind,
                local_addrs,
                peer_addrs,
                inbound: a.inbound,
                outbound_streams,
                peer_identity,
            }
        };
        Counters::add(&self.counters.associations_up, 1);
        tracing::debug!(%id, ?ev, "association up");
        self.emit(ev).await;
    }

    /// Removes an association and reports it down, once. Returns the removed entry.
    pub async fn down(&self, id: AssociationId, reason: DownReason) -> Option<Assoc> {
        let a = self.assocs().remove(&id)?;
        match &reason {
            DownReason::Protocol(_) => Counters::add(&self.counters.protocol_errors, 1),
            DownReason::KeepAliveTimeout | DownReason::WriteStalled => {
                Counters::add(&self.counters.timeouts, 1)
            }
            _ => {}
        }
        Counters::add(&self.counters.associations_down, 1);
        tracing::debug!(%id, %reason, "association down");
        self.emit(Event::AssociationDown { id, reason }).await;
        Some(a)
    }

    /// Removes an association that was never reported up (an inbound TLS handshake that
    /// failed): no event, its id was never seen.
    pub fn forget(&self, id: AssociationId) {
        self.assocs().remove(&id);
    }

    pub fn state(&self, id: AssociationId) -> Option<AssocState> {
        self.assocs().get(&id).map(|a| a.state)
    }

    pub fn received(&self, bytes: usize) {
        Counters::add(&self.counters.messages_received, 1);
        Counters::add(&self.counters.bytes_received, bytes as u64);
    }

    pub fn sent(&self, bytes: usize) {
        Counters::add(&self.counters.messages_sent, 1);
        Counters::add(&self.counters.bytes_sent, bytes as u64);
    }

    fn check_size(&self, size: usize) -> Result<(), SendError> {
        let limit = self.config.limits.max_message_size;
        if size > limit {
            return Err(SendError::TooLarge { size, limit });
        }
        Ok(())
    }

    fn lookup(&self, id: AssociationId) -> Result<(Backend, AssociationKind, u16), SendError> {
        let m = self.assocs();
        let a = m.get(&id).ok_or(SendError::UnknownAssociation(id))?;
        if matches!(a.state, AssocState::Closing | AssocState::Aborting) {
            return Err(SendError::UnknownAssociation(id));
        }
        Ok((a.backend.clone(), a.kind, a.outbound_streams))
    }

    fn check_stream(
        id: AssociationId,
        kind: AssociationKind,
        streams: u16,
        ppid: u32,
        stream: u16,
        data: &[u8],
    ) -> Result<(), SendError> {
        if kind == AssociationKind::TcpPlain {
            if ppid != crate::PPID_ASAP {
                return Err(SendError::PpidNotCarried { id, ppid });
            }
            if rserpool_wire::Codec::frame_length(data) != Some(data.len()) {
                return Err(SendError::NotAsapFramed);
            }
        }
        if stream >= streams && kind != AssociationKind::TcpMapped {
            return Err(SendError::BadStream { id, stream });
        }
        Ok(())
    }

    pub(crate) async fn send(
        &self,
        id: AssociationId,
        ppid: u32,
        stream: u16,
        data: Bytes,
        wait: bool,
        more: bool,
    ) -> Result<(), SendError> {
        self.check_size(data.len())?;
        let (backend, kind, streams) = self.lookup(id)?;
        Self::check_stream(id, kind, streams, ppid, stream, &data)?;
        let len = data.len();
        match backend {
            Backend::Tcp(h) => {
                h.send(id, ppid, stream, data, wait, &self.config.limits)
                    .await?
            }
            Backend::Sctp { kernel_id } => {
                let sock = self.sctp.get().ok_or(SendError::UnknownAssociation(id))?;
                sock.send(
                    id,
                    kernel_id,
                    ppid,
                    stream,
                    &data,
                    wait,
                    more,
                    &self.config.limits,
                )
                .await?
            }
        }
        self.sent(len);
        Ok(())
    }

    pub fn shutdown(&self) {
        self.closed.store(true, Ordering::SeqCst);
        let tasks = std::mem::take(&mut *self.tasks.lock().unwrap_or_else(|e| e.into_inner()));
        for t in tasks {
            t.abort();
        }
        self.assocs().clear();
    }
}

/// An endpoint: listens and/or connects, and reports every association's events through
/// [`next_event`](Self::next_event). Dropping it closes every association (abortively) and
/// stops its tasks. Must be created inside a tokio runtime.
pub struct Endpoint {
    handle: EndpointHandle,
    events: mpsc::Receiver<Event>,
    local_addrs: Vec<SocketAddr>,
    plain_addrs: Vec<SocketAddr>,
}

/// A cloneable handle for sending, connecting and closing from other tasks. It stays valid
/// while the [`Endpoint`] lives; afterwards its calls fail with
/// [`TransportError::Closed`]/[`SendError::UnknownAssociation`].
#[derive(Clone)]
pub struct EndpointHandle {
    shared: Arc<Shared>,
}

impl fmt::Debug for EndpointHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EndpointHandle")
            .field("kind", &self.shared.kind)
            .finish_non_exhaustive()
    }
}

impl fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Endpoint")
            .field("kind", &self.handle.shared.kind)
            .field("local_addrs", &self.local_addrs)
            .finish_non_exhaustive()
    }
}

/// Decides the transport for `choice`: the kind and the reason, for the log line.
fn choose(choice: TransportChoice, tls: bool) -> Result<(TransportKind, String), TransportError> {
    match choice {
        TransportChoice::Auto if tls => Ok((
            TransportKind::Tcp,
            "auto: TLS is configured, and TLS runs on the TCP mapping only".into(),
        )),
        TransportChoice::Tcp => Ok((TransportKind::Tcp, "configured".into())),
        TransportChoice::Sctp => match sctp::probe() {
            Ok(()) => Ok((TransportKind::Sctp, "configured".into())),
            Err(e) => Err(TransportError::SctpUnavailable(e)),
        },
        TransportChoice::Auto => match sctp::probe() {
            Ok(()) => Ok((TransportKind::Sctp, "auto: the kernel supports SCTP".into())),
            Err(e) => Ok((
                TransportKind::Tcp,
                format!("auto: no kernel SCTP ({e}), using the TCP mapping"),
            )),
        },
    }
}

impl Endpoint {
    /// Creates the endpoint: picks the transport, binds the local addresses, listens if
    /// [`EndpointConfig::accept`], opens the plain-TCP ASAP listeners.
    pub async fn bind(config: EndpointConfig) -> Result<Endpoint, TransportError> {
        config.validate()?;
        let (kind, why) = choose(config.transport, config.tls.is_some())?;
        let tls = config.tls.as_ref().map(|t| t.load()).transpose()?;
        tracing::info!(transport = %kind, reason = %why, "transport chosen");
        let (tx, rx) = mpsc::channel(config.limits.event_queue);
        let shared = Arc::new(Shared {
            config,
            kind,
            events: tx,
            next_id: AtomicU64::new(1),
            assocs: Mutex::new(FxHashMap::default()),
            counters: Counters::default(),
            closed: AtomicBool::new(false),
            tasks: Mutex::new(Vec::new()),
            sctp: std::sync::OnceLock::new(),
            tls,
            listening: std::sync::OnceLock::new(),
        });
        let local_addrs = match kind {
            TransportKind::Sctp => sctp::start(&shared)?,
            TransportKind::Tcp => {
                if shared.config.accept {
                    let bound =
                        tcp::listen(&shared, tcp::Framing::Mapped, &shared.config.local_addrs)?;
                    let _ = shared.listening.set(bound.clone());
                    bound
                } else {
                    shared.config.local_addrs.clone()
                }
            }
        };
        let plain_addrs = if shared.config.tcp.plain_asap_listen.is_empty() {
            Vec::new()
        } else {
            tcp::listen(
                &shared,
                tcp::Framing::PlainAsap,
                &shared.config.tcp.plain_asap_listen,
            )?
        };
        Ok(Endpoint {
            handle: EndpointHandle { shared },
            events: rx,
            local_addrs,
            plain_addrs,
        })
    }

    /// The next event; `None` only after [`shutdown`](Self::shutdown).
    pub async fn next_event(&mut self) -> Option<Event> {
        if self.handle.shared.closed.load(Ordering::SeqCst) {
            return None;
        }
        self.events.recv().await
    }

    /// An event if one is queued, without waiting.
    pub fn try_next_event(&mut self) -> Option<Event> {
        self.events.try_recv().ok()
    }

    /// A handle for other tasks.
    pub fn handle(&self) -> EndpointHandle {
        self.handle.clone()
    }

    /// The local addresses bound, with the actual port (empty for a TCP endpoint that does not
    /// listen and was given none).
    pub fn local_addrs(&self) -> &[SocketAddr] {
        &self.local_addrs
    }

    /// The addresses of the plain-TCP ASAP listeners, with their actual ports.
    pub fn plain_asap_addrs(&self) -> &[SocketAddr] {
        &self.plain_addrs
    }

    /// Stops every task and drops every association (abortively). Later calls fail; `next_event`
    /// returns `None`.
    pub fn shutdown(&mut self) {
        self.handle.shared.shutdown();
        self.events.close();
    }
}

/// An endpoint does everything its handle does (connect, send, close, look up associations).
impl std::ops::Deref for Endpoint {
    type Target = EndpointHandle;

    fn deref(&self) -> &EndpointHandle {
        &self.handle
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        self.handle.shared.shutdown();
    }
}

impl EndpointHandle {
    /// Starts an association to one peer reachable at `addrs` (several addresses of one
    /// multi-homed SCTP peer; for TCP they are tried in order). Returns its id at once; the
    /// outcome comes as [`Event::AssociationUp`] or
    /// [`Event::AssociationDown`] with [`DownReason::ConnectFailed`]. Messages may be sent
    /// right away; they go out once the association is up.
    pub async fn connect(&self, addrs: &[SocketAddr]) -> Result<AssociationId, TransportError> {
        if self.shared.closed.load(Ordering::SeqCst) {
            return Err(TransportError::Closed);
        }
        if addrs.is_empty() {
            return Err(TransportError::NoAddress);
        }
        match self.shared.kind {
            TransportKind::Sctp => sctp::connect(&self.shared, addrs),
            TransportKind::Tcp => tcp::connect(&self.shared, addrs),
        }
    }

    /// Sends one whole message, waiting (up to [`Limits::send_timeout`](crate::Limits)) for room
    /// in the association's queue or the kernel's buffer. `Ok` means handed to the transport,
    /// not delivered: undelivered messages are reported by [`Event::SendFailed`] where the
    /// transport can tell.
    pub async fn send(
        &self,
        id: AssociationId,
        ppid: u32,
        stream: u16,
        data: impl Into<Bytes>,
    ) -> Result<(), SendError> {
        self.shared
            .send(id, ppid, stream, data.into(), true, false)
            .await
    }

    /// Like [`send`](Self::send), but fails with [`SendError::QueueFull`] instead of waiting.
    /// For event loops that must not stall on one slow peer.
    pub async fn try_send(
        &self,
        id: AssociationId,
        ppid: u32,
        stream: u16,
        data: impl Into<Bytes>,
    ) -> Result<(), SendError> {
        self.shared
            .send(id, ppid, stream, data.into(), false, false)
            .await
    }

    /// Like [`try_send`](Self::try_send); with `more`, a hint that another message for the same
    /// association follows at once: SCTP holds this one (`MSG_MORE`) to bundle them into one
    /// packet, flushed by the next send without the hint. The caller must end every run of hinted
    /// sends with an unhinted one; the TCP mapping ignores the hint.
    pub async fn try_send_hinted(
        &self,
        id: AssociationId,
        ppid: u32,
        stream: u16,
        data: impl Into<Bytes>,
        more: bool,
    ) -> Result<(), SendError> {
        self.shared
            .send(id, ppid, stream, data.into(), false, more)
            .await
    }

    /// Closes an association gracefully: messages already accepted are sent first. Its
    /// [`Event::AssociationDown`] follows with [`DownReason::LocalClose`].
    pub async fn close(&self, id: AssociationId) -> Result<(), TransportError> {
        let backend = {
            let mut m = self.shared.assocs();
            let a = m
                .get_mut(&id)
                .ok_or(TransportError::UnknownAssociation(id))?;
            if a.state == AssocState::Connecting && a.kind == AssociationKind::Sctp {
                a.state = AssocState::Aborting;
            } else if a.state != AssocState::Aborting {
                a.state = AssocState::Closing;
            }
            (a.backend.clone(), a.state)
        };
        match backend {
            (Backend::Tcp(h), _) => {
                h.close(&self.shared.config.limits).await;
                Ok(())
            }
            (Backend::Sctp { kernel_id }, st) => {
                let sock = self.shared.sctp.get().ok_or(TransportError::Closed)?;
                sock.shutdown_assoc(kernel_id, st == AssocState::Aborting)
            }
        }
    }

    /// Aborts an association at once (SCTP ABORT, TCP RST); queued messages are dropped and
    /// reported with [`Event::SendFailed`]. Its [`Event::AssociationDown`] follows with
    /// [`DownReason::LocalAbort`].
    pub async fn abort(&self, id: AssociationId) -> Result<(), TransportError> {
        let backend = {
            let mut m = self.shared.assocs();
            let a = m
                .get_mut(&id)
                .ok_or(TransportError::UnknownAssociation(id))?;
            a.state = AssocState::Aborting;
            a.backend.clone()
        };
        match backend {
            Backend::Tcp(h) => {
                h.abort();
                Ok(())
            }
            Backend::Sctp { kernel_id } => {
                let sock = self.shared.sctp.get().ok_or(TransportError::Closed)?;
                sock.shutdown_assoc(kernel_id, true)
            }
        }
    }

    /// What an association is now; `None` if it is not open. For SCTP the addresses are asked
    /// from the kernel, so they reflect paths added or removed since it came up.
    pub fn association(&self, id: AssociationId) -> Option<AssociationInfo> {
        let (mut info, kernel_id) = {
            let m = self.shared.assocs();
            let a = m.get(&id)?;
            let kid = match a.backend {
                Backend::Sctp { kernel_id } if a.state == AssocState::Up => Some(kernel_id),
                _ => None,
            };
            (
                AssociationInfo {
                    id,
                    kind: a.kind,
                    established: a.state != AssocState::Connecting,
                    inbound: a.inbound,
                    local_addrs: a.local_addrs.clone(),
                    peer_addrs: a.peer_addrs.clone(),
                    peer_identity: a.peer_identity.clone(),
                },
                kid,
            )
        };
        if let (Some(kid), Some(sock)) = (kernel_id, self.shared.sctp.get()) {
            if let Ok(l) = sock.local_addrs(kid) {
                info.local_addrs = l;
            }
            if let Ok(p) = sock.peer_addrs(kid) {
                info.peer_addrs = p;
            }
        }
        Some(info)
    }

    /// The ids of all open associations (connecting ones included), in increasing order.
    pub fn associations(&self) -> Vec<AssociationId> {
        let mut v: Vec<_> = self.shared.assocs().keys().copied().collect();
        v.sort();
        v
    }

    /// The transport of the endpoint's own associations (plain-TCP ASAP ones are TCP whatever
    /// this says).
    pub fn kind(&self) -> TransportKind {
        self.shared.kind
    }

    /// Counters since creation.
    pub fn stats(&self) -> EndpointStats {
        self.shared.counters.snapshot()
    }
}
