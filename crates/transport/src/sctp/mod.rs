//! Kernel SCTP associations on one one-to-many (`SOCK_SEQPACKET`) socket per endpoint.
//!
//! One reader task receives every message and notification of the socket (each `recvmsg`
//! names its association, PPID and stream) and turns them into [`Event`]s; senders call
//! `sendmsg` on the shared socket from their own task. See `docs/transport.md` for why
//! one-to-many rather than one socket per association.

#[cfg(target_os = "linux")]
mod sys;

#[cfg(target_os = "linux")]
pub(crate) use linux::*;

#[cfg(not(target_os = "linux"))]
pub(crate) use other::*;

#[cfg(not(target_os = "linux"))]
mod other {
    use crate::config::Limits;
    use crate::endpoint::{AssociationId, Shared};
    use crate::error::{SendError, TransportError};
    use std::io;
    use std::net::SocketAddr;
    use std::sync::Arc;

    fn unsupported() -> io::Error {
        io::Error::new(
            io::ErrorKind::Unsupported,
            "kernel SCTP is supported on Linux only",
        )
    }

    pub(crate) fn probe() -> io::Result<()> {
        Err(unsupported())
    }

    pub(crate) fn start(_: &Arc<Shared>) -> Result<Vec<SocketAddr>, TransportError> {
        Err(TransportError::SctpUnavailable(unsupported()))
    }

    pub(crate) fn connect(
        _: &Arc<Shared>,
        _: &[SocketAddr],
    ) -> Result<AssociationId, TransportError> {
        Err(TransportError::SctpUnavailable(unsupported()))
    }

    #[derive(Debug)]
    pub(crate) struct SctpSocket;

    impl SctpSocket {
        #[allow(clippy::too_many_arguments)]
        pub async fn send(
            &self,
            _: AssociationId,
            _: i32,
            _: u32,
            _: u16,
            _: &bytes::Bytes,
            _: bool,
            _: bool,
            _: &Limits,
        ) -> Result<(), SendError> {
            Err(SendError::Io(unsupported()))
        }
        pub fn shutdown_assoc(&self, _: i32, _: bool) -> Result<(), TransportError> {
            Err(TransportError::SctpUnavailable(unsupported()))
        }
        pub fn local_addrs(&self, _: i32) -> io::Result<Vec<SocketAddr>> {
            Err(unsupported())
        }
        pub fn peer_addrs(&self, _: i32) -> io::Result<Vec<SocketAddr>> {
            Err(unsupported())
        }
    }
}

#[cfg(target_os = "linux")]
mod linux {
    use super::sys::{self, addr_state, assoc_state, Notification};
    use crate::arena::MessageArena;
    use crate::config::{Limits, SctpConfig};
    use crate::endpoint::{
        Assoc, AssocState, AssociationId, AssociationKind, Backend, DownReason, Event, PathState,
        SendFailure, Shared,
    };
    use crate::error::{SendError, TransportError};
    use crate::stats::Counters;
    use crate::tcp::frame::FrameError;
    use bytes::{Bytes, BytesMut};
    use rustc_hash::FxHashMap;
    use std::collections::VecDeque;
    use std::io;
    use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
    use std::os::fd::{AsRawFd, OwnedFd};
    use std::sync::{Arc, Mutex, MutexGuard};
    use std::time::Duration;
    use tokio::io::unix::AsyncFd;
    use tokio::io::Interest;
    use tokio::time::Instant;

    /// Ids of closed associations remembered so that late SEND_FAILED notifications can still be
    /// attributed.
    const TOMBSTONES: usize = 4096;

    /// Whether the kernel has SCTP: opens and closes a one-to-many socket.
    pub(crate) fn probe() -> io::Result<()> {
        sys::socket(false).map(drop)
    }

    #[derive(Default)]
    struct KernelMap {
        /// Keyed by the kernel's association ids, never by peers' input: a fast hash is safe.
        by_kernel: FxHashMap<i32, AssociationId>,
        tombstones: VecDeque<(i32, AssociationId)>,
    }

    impl KernelMap {
        fn retire(&mut self, kid: i32) {
            if let Some(id) = self.by_kernel.remove(&kid) {
                if self.tombstones.len() >= TOMBSTONES {
                    self.tombstones.pop_front();
                }
                self.tombstones.push_back((kid, id));
            }
        }

        fn find_any(&self, kid: i32) -> Option<AssociationId> {
            self.by_kernel.get(&kid).copied().or_else(|| {
                self.tombstones
                    .iter()
                    .rev()
                    .find(|(k, _)| *k == kid)
                    .map(|(_, id)| *id)
            })
        }
    }

    /// The endpoint's SCTP socket.
    pub(crate) struct SctpSocket {
        fd: AsyncFd<OwnedFd>,
        map: Mutex<KernelMap>,
    }

    impl std::fmt::Debug for SctpSocket {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.debug_struct("SctpSocket")
                .field("fd", &self.fd.get_ref().as_raw_fd())
                .finish()
        }
    }

    fn ms(d: Duration) -> u32 {
        d.as_millis().clamp(1, u128::from(u32::MAX / 2)) as u32
    }

    fn tuning(c: &SctpConfig) -> sys::Tuning {
        sys::Tuning {
            heartbeat_interval_ms: c.heartbeat_interval.map(ms),
            rto_initial_ms: ms(c.rto_initial),
            rto_min_ms: ms(c.rto_min),
            rto_max_ms: ms(c.rto_max),
            path_max_retrans: c.path_max_retrans,
            association_max_retrans: c.association_max_retrans,
            init_max_attempts: c.init_max_attempts,
            init_max_timeout_ms: ms(c.init_max_timeout).min(u32::from(u16::MAX)) as u16,
            outbound_streams: c.outbound_streams,
            max_inbound_streams: c.max_inbound_streams,
            nodelay: c.nodelay,
            send_buffer: c.send_buffer,
            receive_buffer: c.receive_buffer,
        }
    }

    /// Creates, configures and binds the socket, listens if asked, starts the reader task.
    /// Returns the bound addresses.
    pub(crate) fn start(shared: &Arc<Shared>) -> Result<Vec<SocketAddr>, TransportError> {
        let cfg = &shared.config;
        let want_v6 = cfg.local_addrs.is_empty() || cfg.local_addrs.iter().any(|a| a.is_ipv6());
        let fd = match sys::socket(want_v6) {
            Ok(fd) => fd,
            // A kernel without IPv6 still serves an all-IPv4 (or wildcard) endpoint.
            Err(_) if cfg.local_addrs.iter().all(|a| a.is_ipv4()) => {
                sys::socket(false).map_err(TransportError::SctpUnavailable)?
            }
            Err(e) => return Err(TransportError::SctpUnavailable(e)),
        };
        let v6 = sys::local_name(&fd).map(|a| a.is_ipv6()).unwrap_or(want_v6);
        let raw = fd.as_raw_fd();
        sys::configure(raw, &tuning(&cfg.sctp))
            .map_err(|e| TransportError::io("configuring the SCTP socket", e))?;

        let mut addrs = cfg.local_addrs.clone();
        if addrs.is_empty() {
            addrs.push(if v6 {
                SocketAddr::new(IpAddr::V6(Ipv6Addr::UNSPECIFIED), 0)
            } else {
                SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 0)
            });
        }
        let port = addrs
            .iter()
            .map(|a| a.port())
            .find(|&p| p != 0)
            .unwrap_or(0);
        let first = SocketAddr::new(addrs[0].ip(), port);
        sys::bindx_add(raw, &[first]).map_err(|e| TransportError::Bind {
            addr: first.to_string(),
            source: e,
        })?;
        let port = sys::local_name(&fd)
            .map_err(|e| TransportError::io("getsockname", e))?
            .port();
        let rest: Vec<SocketAddr> = addrs[1..]
            .iter()
            .map(|a| SocketAddr::new(a.ip(), port))
            .collect();
        if !rest.is_empty() {
            sys::bindx_add(raw, &rest).map_err(|e| TransportError::Bind {
                addr: format!("{rest:?}"),
                source: e,
            })?;
        }
        if cfg.accept {
            sys::listen(raw, 1024).map_err(|e| TransportError::io("listen", e))?;
        }
        let bound = sys::getaddrs(raw, 0, true).unwrap_or_else(|_| {
            addrs
                .iter()
                .map(|a| SocketAddr::new(a.ip(), port))
                .collect()
        });
        let sock = Arc::new(SctpSocket {
            fd: sys::register(fd)
                .map_err(|e| TransportError::io("registering the SCTP socket", e))?,
            map: Mutex::new(KernelMap::default()),
        });
        let _ = shared.sctp.set(sock.clone());
        let sh = shared.clone();
        shared.spawn(async move { reader(sh, sock).await });
        tracing::info!(?bound, accept = cfg.accept, "SCTP endpoint bound");
        Ok(bound)
    }

    /// Starts an association (`sctp_connectx`); the outcome arrives as a notification.
    pub(crate) fn connect(
        shared: &Arc<Shared>,
        addrs: &[SocketAddr],
    ) -> Result<AssociationId, TransportError> {
        let sock = shared.sctp.get().ok_or(TransportError::Closed)?;
        let id = shared.alloc_id();
        // The map stays locked until the new association is in it, so the reader cannot see its
        // COMM_UP first and take it for an inbound one.
        let mut map = sock.map();
        let kid = sys::connectx(sock.fd.get_ref().as_raw_fd(), addrs).map_err(|e| {
            if e.raw_os_error() == Some(libc::EISCONN) {
                TransportError::AlreadyAssociated(format!("{addrs:?}"))
            } else {
                TransportError::io("sctp_connectx", e)
            }
        })?;
        let assoc = Assoc {
            peer_identity: None,
            kind: AssociationKind::Sctp,
            state: AssocState::Connecting,
            inbound: false,
            local_addrs: Vec::new(),
            peer_addrs: addrs.to_vec(),
            outbound_streams: shared.config.sctp.outbound_streams,
            backend: Backend::Sctp { kernel_id: kid },
        };
        if shared.insert(id, assoc).is_err() {
            drop(map);
            let _ = sock.shutdown_assoc(kid, true);
            return Err(TransportError::TooManyAssociations(
                shared.config.limits.max_associations,
            ));
        }
        map.by_kernel.insert(kid, id);
        Ok(id)
    }

    impl SctpSocket {
        fn map(&self) -> MutexGuard<'_, KernelMap> {
            self.map.lock().unwrap_or_else(|e| e.into_inner())
        }

        fn raw(&self) -> i32 {
            self.fd.get_ref().as_raw_fd()
        }

        /// Sends one message; waits for buffer space if `wait`.
        #[allow(clippy::too_many_arguments)]
        pub async fn send(
            &self,
            id: AssociationId,
            kid: i32,
            ppid: u32,
            stream: u16,
            data: &Bytes,
            wait: bool,
            more: bool,
            limits: &Limits,
        ) -> Result<(), SendError> {
            let map_err = |e: io::Error| match e.raw_os_error() {
                Some(libc::EPIPE) | Some(libc::ENOTCONN) | Some(libc::ESHUTDOWN) => {
                    SendError::UnknownAssociation(id)
                }
                Some(libc::EMSGSIZE) => SendError::TooLarge {
                    size: data.len(),
                    limit: limits.max_message_size,
                },
                _ => SendError::Io(e),
            };
            match sys::send(self.raw(), kid, ppid, stream, 0, data, more) {
                Ok(_) => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    if !wait {
                        return Err(SendError::QueueFull {
                            id,
                            data: data.clone(),
                        });
                    }
                }
                Err(e) => return Err(map_err(e)),
            }
            let deadline = Instant::now() + limits.send_timeout;
            loop {
                // Wait for the kernel to report room, but retry now and then regardless: with
                // one socket for all associations, "writable" is per socket while the room that
                // matters is per association.
                let attempt = tokio::time::timeout(
                    Duration::from_millis(5),
                    self.fd.async_io(Interest::WRITABLE, |fd| {
                        sys::send(fd.as_raw_fd(), kid, ppid, stream, 0, data, more)
                    }),
                );
                match tokio::time::timeout_at(deadline, attempt).await {
                    Ok(Ok(Ok(_))) => return Ok(()),
                    Ok(Ok(Err(e))) => return Err(map_err(e)),
                    Ok(Err(_)) => match sys::send(self.raw(), kid, ppid, stream, 0, data, more) {
                        Ok(_) => return Ok(()),
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                        Err(e) => return Err(map_err(e)),
                    },
                    Err(_) => return Err(SendError::Timeout(id)),
                }
            }
        }

        /// SHUTDOWN (graceful) or ABORT of one association.
        pub fn shutdown_assoc(&self, kid: i32, abort: bool) -> Result<(), TransportError> {
            let flags = if abort {
                sys::SCTP_ABORT
            } else {
                sys::SCTP_EOF
            };
            match sys::send(self.raw(), kid, 0, 0, flags, &[], false) {
                Ok(_) => Ok(()),
                Err(e) => Err(TransportError::io(
                    if abort { "SCTP abort" } else { "SCTP shutdown" },
                    e,
                )),
            }
        }

        pub fn local_addrs(&self, kid: i32) -> io::Result<Vec<SocketAddr>> {
            sys::getaddrs(self.raw(), kid, true)
        }

        pub fn peer_addrs(&self, kid: i32) -> io::Result<Vec<SocketAddr>> {
            sys::getaddrs(self.raw(), kid, false)
        }
    }

    struct Reader {
        shared: Arc<Shared>,
        sock: Arc<SctpSocket>,
        /// Messages being received in pieces (partial delivery), by kernel association id.
        partial: FxHashMap<i32, BytesMut>,
        /// Associations whose peer sent SHUTDOWN.
        peer_shutdown: rustc_hash::FxHashSet<i32>,
        /// Whole messages are copied out of the receive buffers into shared chunks.
        arena: MessageArena,
    }

    /// Messages taken from the socket with one system call.
    const RECV_BATCH: usize = 16;

    async fn reader(shared: Arc<Shared>, sock: Arc<SctpSocket>) {
        let slot = shared.config.limits.max_message_size.max(64 * 1024) + 1024;
        let mut batch = sys::RecvBatch::new(RECV_BATCH, slot);
        let mut r = Reader {
            shared,
            sock: sock.clone(),
            partial: FxHashMap::default(),
            peer_shutdown: Default::default(),
            arena: MessageArena::default(),
        };
        loop {
            let got = sock
                .fd
                .async_io(Interest::READABLE, |fd| batch.recv(fd.as_raw_fd()))
                .await;
            match got {
                Ok(n) => {
                    for i in 0..n {
                        let (m, bytes) = batch.message(i);
                        if m.notification {
                            if let Some(n) = sys::parse_notification(bytes) {
                                r.notification(n).await;
                            }
                        } else if let Some((kid, stream, ppid)) = m.info {
                            r.data(kid, stream, ppid, bytes, m.end_of_record).await;
                        }
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "SCTP recvmmsg failed");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            }
        }
    }

    impl Reader {
        async fn data(&mut self, kid: i32, stream: u16, ppid: u32, bytes: &[u8], eor: bool) {
            let max = self.shared.config.limits.max_message_size;
            let id = self.sock.map().by_kernel.get(&kid).copied();
            let Some(id) = id else {
                // The association was just refused or torn down; its data has nowhere to go.
                self.partial.remove(&kid);
                return;
            };
            // Most messages arrive whole: no lookup of pieces then.
            let pieces = if self.partial.is_empty() {
                0
            } else {
                self.partial.get(&kid).map_or(0, |p| p.len())
            };
            let total = pieces + bytes.len();
            if total > max {
                self.partial.remove(&kid);
                tracing::warn!(%id, total, max, "SCTP message over the limit: aborting association");
                self.sock.map().retire(kid);
                let _ = self.sock.shutdown_assoc(kid, true);
                self.shared
                    .down(
                        id,
                        DownReason::Protocol(FrameError::TooLarge {
                            length: total,
                            limit: max,
                        }),
                    )
                    .await;
                return;
            }
            let data = if !eor {
                self.partial
                    .entry(kid)
                    .or_default()
                    .extend_from_slice(bytes);
                return;
            } else if let Some(mut p) = (pieces > 0).then(|| self.partial.remove(&kid)).flatten() {
                p.extend_from_slice(bytes);
                p.freeze()
            } else {
                self.arena.copy(bytes)
            };
            if matches!(self.shared.state(id), Some(AssocState::Aborting) | None) {
                return;
            }
            self.shared.received(data.len());
            self.shared
                .emit(Event::Message {
                    id,
                    ppid,
                    stream,
                    data,
                })
                .await;
        }

        async fn notification(&mut self, n: Notification) {
            match n {
                Notification::AssocChange {
                    assoc_id: kid,
                    state,
                    error,
                    outbound_streams,
                    info_len,
                } => match state {
                    assoc_state::COMM_UP => self.comm_up(kid, outbound_streams).await,
                    assoc_state::RESTART => {
                        let old = self.sock.map().by_kernel.get(&kid).copied();
                        if let Some(old) = old {
                            self.sock.map().retire(kid);
                            self.shared.down(old, DownReason::PeerRestarted).await;
                        }
                        self.comm_up(kid, outbound_streams).await;
                    }
                    assoc_state::COMM_LOST
                    | assoc_state::SHUTDOWN_COMP
                    | assoc_state::CANT_STR_ASSOC => {
                        self.partial.remove(&kid);
                        let peer_shutdown = self.peer_shutdown.remove(&kid);
                        let id = {
                            let mut m = self.sock.map();
                            let id = m.by_kernel.get(&kid).copied();
                            m.retire(kid);
                            id
                        };
                        let Some(id) = id else { return };
                        let st = self.shared.state(id);
                        let reason = match (state, st) {
                            (_, Some(AssocState::Aborting)) => DownReason::LocalAbort,
                            (assoc_state::SHUTDOWN_COMP, Some(AssocState::Closing))
                                if !peer_shutdown =>
                            {
                                DownReason::LocalClose
                            }
                            (assoc_state::SHUTDOWN_COMP, _) => DownReason::PeerClosed,
                            (_, Some(AssocState::Connecting))
                            | (assoc_state::CANT_STR_ASSOC, _) => {
                                DownReason::ConnectFailed(if info_len > 0 {
                                    "refused by the peer (ABORT)".into()
                                } else {
                                    format!("no answer to INIT (error {error})")
                                })
                            }
                            // A COMM_LOST carrying the peer's ABORT chunk, or ECONNRESET.
                            _ if info_len > 0 || i32::from(error) == libc::ECONNRESET => {
                                DownReason::PeerAborted
                            }
                            // Retransmission or heartbeat limit (the kernel reports no error).
                            _ if error == 0 => DownReason::KeepAliveTimeout,
                            _ => DownReason::Io(format!("association lost (SCTP error {error})")),
                        };
                        self.shared.down(id, reason).await;
                    }
                    _ => {}
                },
                Notification::PeerAddrChange {
                    assoc_id,
                    addr,
                    state,
                } => {
                    let id = self.sock.map().by_kernel.get(&assoc_id).copied();
                    let (Some(id), Some(addr)) = (id, addr) else {
                        return;
                    };
                    let state = match state {
                        addr_state::AVAILABLE | addr_state::CONFIRMED => PathState::Available,
                        addr_state::UNREACHABLE => PathState::Unreachable,
                        addr_state::REMOVED => PathState::Removed,
                        addr_state::ADDED => PathState::Added,
                        addr_state::MADE_PRIM => PathState::MadePrimary,
                        addr_state::POTENTIALLY_FAILED => PathState::PotentiallyFailed,
                        _ => return,
                    };
                    tracing::info!(%id, %addr, ?state, "SCTP path state");
                    self.shared
                        .emit(Event::PeerAddressChange { id, addr, state })
                        .await;
                }
                Notification::SendFailed {
                    assoc_id,
                    sent,
                    stream,
                    ppid,
                    data,
                } => {
                    let id = self.sock.map().find_any(assoc_id);
                    let Some(id) = id else { return };
                    Counters::add(&self.shared.counters.send_failures, 1);
                    self.shared
                        .emit(Event::SendFailed {
                            id,
                            failure: SendFailure {
                                ppid,
                                stream,
                                data: Bytes::from(data),
                                maybe_sent: sent,
                            },
                        })
                        .await;
                }
                Notification::Shutdown { assoc_id } => {
                    self.peer_shutdown.insert(assoc_id);
                }
                Notification::RemoteError { assoc_id, error } => {
                    tracing::info!(assoc = assoc_id, cause = error, "SCTP remote error");
                }
                Notification::Other(_) => {}
            }
        }

        async fn comm_up(&mut self, kid: i32, outbound_streams: u16) {
            let local = self.sock.local_addrs(kid).unwrap_or_default();
            let peer = self.sock.peer_addrs(kid).unwrap_or_default();
            let known = self.sock.map().by_kernel.get(&kid).copied();
            let id = match known {
                Some(id) => {
                    if self.shared.state(id) == Some(AssocState::Aborting) {
                        return;
                    }
                    id
                }
                None => {
                    let id = self.shared.alloc_id();
                    let assoc = Assoc {
                        peer_identity: None,
                        kind: AssociationKind::Sctp,
                        state: AssocState::Connecting,
                        inbound: true,
                        local_addrs: local.clone(),
                        peer_addrs: peer.clone(),
                        outbound_streams,
                        backend: Backend::Sctp { kernel_id: kid },
                    };
                    if self.shared.insert(id, assoc).is_err() {
                        Counters::add(&self.shared.counters.refused, 1);
                        tracing::warn!(
                            ?peer,
                            limit = self.shared.config.limits.max_associations,
                            "association limit reached: inbound SCTP association aborted"
                        );
                        let _ = self.sock.shutdown_assoc(kid, true);
                        return;
                    }
                    self.sock.map().by_kernel.insert(kid, id);
                    id
                }
            };
            self.shared
                .up(id, local, peer, outbound_streams, None)
                .await;
        }
    }
}
