//! The tokio driver of a pool user's session: runs a [`PoolUserSession`] core over its own
//! transport endpoint, with a [`PoolUserClient`] for handle resolutions and unreachable reports.

use super::PoolUserClient;
use crate::session::{
    FailoverReason, PoolUserSession, Receipt, SessionAction, SessionConfig, SessionError,
    SessionEvent, SessionStats,
};
use rserpool_transport::{
    AssociationId, Endpoint, EndpointConfig, Event, TransportError, TransportKind,
};
use rserpool_wire::{PoolElement, PoolElementId, PoolPolicy, TransportProtocol};
use std::net::SocketAddr;
use std::time::Duration;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::Instant;

/// The receipts and counters of a session, as last published by its task.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SessionSnapshot {
    /// Selected, bound, reached, failovers, outcome.
    pub receipt: Receipt,
    /// Counters.
    pub stats: SessionStats,
    /// The PE serving now.
    pub current_pe: Option<PoolElementId>,
}

/// Why a session could not be opened.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OpenError {
    /// The transport endpoint could not be created.
    #[error("transport: {0}")]
    Transport(#[from] TransportError),
    /// No PE could be used within the attempts allowed.
    #[error("{0}")]
    Failed(String),
}

enum Command {
    Send(
        u64,
        u32,
        u16,
        Vec<u8>,
        oneshot::Sender<Result<(), SessionError>>,
    ),
    Failover(FailoverReason),
    ClearCookie,
    Close(oneshot::Sender<()>),
}

/// An open session to a pool. Dropping it closes the session.
pub struct SessionHandle {
    commands: mpsc::Sender<Command>,
    events: mpsc::Receiver<SessionEvent>,
    snapshot: watch::Receiver<SessionSnapshot>,
    opened_pe: PoolElementId,
    failovers_seen: u64,
}

type Resolved = Result<(Vec<PoolElement>, Option<PoolPolicy>), String>;

/// Events held for the application before the session stops reading from its PE.
const EVENTS_HELD: usize = 4096;

impl SessionHandle {
    /// Opens a session to `config.pool_handle`: resolves it with `client`, connects to the
    /// selected PE over a new endpoint made from `endpoint`, and returns once the session is
    /// bound (or has failed after its attempts).
    pub async fn open(
        client: PoolUserClient,
        mut config: SessionConfig,
        mut endpoint: EndpointConfig,
    ) -> Result<SessionHandle, OpenError> {
        endpoint.accept = false;
        let mut ep = Endpoint::bind(endpoint).await?;
        if config.transport.is_none() {
            config.transport = Some(match ep.kind() {
                TransportKind::Sctp => TransportProtocol::Sctp,
                TransportKind::Tcp => TransportProtocol::Tcp,
            });
        }
        let (commands, mut cmd_rx) = mpsc::channel::<Command>(64);
        let (events_tx, events) = mpsc::channel::<SessionEvent>(1024);
        let (snap_tx, snapshot) = watch::channel(SessionSnapshot::default());
        let (opened_tx, opened_rx) = oneshot::channel::<Result<PoolElementId, String>>();
        tokio::spawn(async move {
            let epoch = Instant::now();
            let now = || epoch.elapsed();
            let handle = ep.handle();
            let mut core = PoolUserSession::new(config);
            let (res_tx, mut res_rx) = mpsc::channel::<Resolved>(4);
            let mut current: Option<AssociationId> = None;
            let mut opened_tx = Some(opened_tx);
            // Events wait here until the application takes them; the task never blocks on the
            // application (it may be busy sending), and stops reading the association while
            // too many wait (back-pressure on the PE instead of unbounded memory).
            let mut pending: std::collections::VecDeque<SessionEvent> =
                std::collections::VecDeque::new();
            core.open(now());
            loop {
                while let Some(a) = core.poll_action() {
                    match a {
                        SessionAction::Resolve(pool) => {
                            let client = client.clone();
                            let tx = res_tx.clone();
                            tokio::spawn(async move {
                                let r = client
                                    .resolve(pool)
                                    .await
                                    .map(|r| (r.pool_elements, r.policy))
                                    .map_err(|e| e.to_string());
                                let _ = tx.send(r).await;
                            });
                        }
                        SessionAction::Connect(pe) => {
                            let addrs = addresses(&pe);
                            if let Some(old) = current.take() {
                                let _ = handle.abort(old).await;
                            }
                            match handle.connect(&addrs).await {
                                Ok(id) => current = Some(id),
                                Err(e) => core.connect_failed(now(), e.to_string()),
                            }
                        }
                        SessionAction::Abort => {
                            if let Some(a) = current.take() {
                                let _ = handle.abort(a).await;
                            }
                        }
                        SessionAction::Close => {
                            if let Some(a) = current.take() {
                                let _ = handle.close(a).await;
                            }
                        }
                        SessionAction::Transmit { ppid, stream, data } => {
                            if let Some(a) = current {
                                if let Err(e) = handle.send(a, ppid, stream, data).await {
                                    core.association_lost(now(), format!("send failed: {e}"));
                                }
                            }
                        }
                        SessionAction::ReportUnreachable(pool, pe) => {
                            client.report_unreachable(pool, pe).await
                        }
                    }
                }
                while let Some(e) = core.poll_event() {
                    match &e {
                        SessionEvent::Opened { pe } => {
                            if let Some(tx) = opened_tx.take() {
                                let _ = tx.send(Ok(*pe));
                            }
                            continue;
                        }
                        SessionEvent::Failed { reason } => {
                            if let Some(tx) = opened_tx.take() {
                                let _ = tx.send(Err(reason.clone()));
                            }
                        }
                        SessionEvent::Failover(f) => tracing::info!(
                            from = %f.from, to = %f.to, cookie = f.with_cookie,
                            reason = %f.reason, "failover"
                        ),
                        SessionEvent::ProtocolError(p) => tracing::warn!(error = %p, "session"),
                        _ => {}
                    }
                    pending.push_back(e);
                }
                let _ = snap_tx.send(SessionSnapshot {
                    receipt: core.receipt().clone(),
                    stats: core.stats().clone(),
                    current_pe: core.current_pe(),
                });
                if core.is_ended() {
                    break;
                }
                let deadline = core
                    .poll_timeout()
                    .map(|d| epoch + d)
                    .unwrap_or_else(|| Instant::now() + Duration::from_secs(3600));
                let app_gone = events_tx.is_closed();
                if app_gone {
                    pending.clear();
                }
                let room = pending.len() < EVENTS_HELD;
                tokio::select! {
                    permit = events_tx.reserve(), if !pending.is_empty() => {
                        if let (Ok(permit), Some(e)) = (permit, pending.pop_front()) {
                            permit.send(e);
                        }
                    }
                    _ = tokio::time::sleep_until(deadline) => core.handle_timeout(now()),
                    Some(r) = res_rx.recv() => core.resolved(now(), r),
                    cmd = cmd_rx.recv() => match cmd {
                        Some(Command::Send(seen, ppid, stream, data, tx)) => {
                            let _ = tx.send(core.send_seen(now(), seen, ppid, stream, data));
                        }
                        Some(Command::Failover(reason)) => core.failover_because(now(), reason),
                        Some(Command::ClearCookie) => core.clear_cookie(),
                        Some(Command::Close(tx)) => {
                            core.close(now());
                            while let Some(a) = core.poll_action() {
                                if let (SessionAction::Close, Some(a)) = (a, current) {
                                    let _ = handle.close(a).await;
                                }
                            }
                            let _ = tx.send(());
                        }
                        None => core.close(now()),
                    },
                    ev = ep.next_event(), if room => match ev {
                        Some(Event::AssociationUp { id, .. }) if Some(id) == current => core.connected(now()),
                        Some(Event::AssociationDown { id, reason }) if Some(id) == current => {
                            current = None;
                            core.association_lost(now(), reason.to_string());
                        }
                        Some(Event::Message { id, ppid, stream, data }) if Some(id) == current => {
                            core.message(now(), ppid, stream, &data)
                        }
                        Some(_) => {}
                        None => break,
                    },
                }
            }
            let _ = snap_tx.send(SessionSnapshot {
                receipt: core.receipt().clone(),
                stats: core.stats().clone(),
                current_pe: None,
            });
            // What the application has not taken yet (the last replies, the failure).
            for e in pending {
                if events_tx.send(e).await.is_err() {
                    break;
                }
            }
            // Give a graceful close a moment to leave before the endpoint goes.
            if let Some(a) = current {
                let _ = tokio::time::timeout(Duration::from_secs(1), async {
                    while let Some(ev) = ep.next_event().await {
                        if matches!(ev, Event::AssociationDown { id, .. } if id == a) {
                            break;
                        }
                    }
                })
                .await;
            }
            ep.shutdown();
        });
        match opened_rx.await {
            Ok(Ok(pe)) => Ok(SessionHandle {
                commands,
                events,
                snapshot,
                opened_pe: pe,
                failovers_seen: 0,
            }),
            Ok(Err(reason)) => Err(OpenError::Failed(reason)),
            Err(_) => Err(OpenError::Failed("the session task ended".into())),
        }
    }

    /// The PE the session was first bound to.
    pub fn opened_pe(&self) -> PoolElementId {
        self.opened_pe
    }

    /// Sends a data message (held during a failover).
    pub async fn send(&self, ppid: u32, stream: u16, data: Vec<u8>) -> Result<(), SessionError> {
        let (tx, rx) = oneshot::channel();
        self.commands
            .send(Command::Send(self.failovers_seen, ppid, stream, data, tx))
            .await
            .map_err(|_| SessionError::Ended)?;
        rx.await.map_err(|_| SessionError::Ended)?
    }

    /// The next event: data, failovers, cookies, the end. `None` once the session has ended
    /// and every event was taken.
    pub async fn next_event(&mut self) -> Option<SessionEvent> {
        let e = self.events.recv().await;
        if matches!(e, Some(SessionEvent::Failover(_))) {
            self.failovers_seen += 1;
        }
        e
    }

    /// Leaves the current PE for another (or continues a failover reported as necessary).
    pub async fn failover(&self) {
        self.failover_because(FailoverReason::Requested).await
    }

    /// Leaves the current PE for a reason the application found (no answer in time: the PE is
    /// reported unreachable; rejected: it is not).
    pub async fn failover_because(&self, reason: FailoverReason) {
        let _ = self.commands.send(Command::Failover(reason)).await;
    }

    /// Forgets the stored cookie (its state is finished, e.g. a CalcApp job completed).
    pub async fn clear_cookie(&self) {
        let _ = self.commands.send(Command::ClearCookie).await;
    }

    /// The receipts and counters now.
    pub fn snapshot(&self) -> SessionSnapshot {
        self.snapshot.borrow().clone()
    }

    /// The receipts and counters as they change, for a watcher beside the session's owner
    /// (status reports).
    pub fn snapshots(&self) -> watch::Receiver<SessionSnapshot> {
        self.snapshot.clone()
    }

    /// Closes the session gracefully and returns its final receipts.
    pub async fn close(mut self) -> SessionSnapshot {
        let (tx, rx) = oneshot::channel();
        if self.commands.send(Command::Close(tx)).await.is_ok() {
            let _ = rx.await;
        }
        while self.events.recv().await.is_some() {}
        let s = self.snapshot.borrow().clone();
        s
    }
}

/// Where a PE is reached: its user transport's addresses with its port.
fn addresses(pe: &PoolElement) -> Vec<SocketAddr> {
    match pe.user_transport.as_address() {
        Some(t) => t
            .addresses
            .iter()
            .map(|ip| SocketAddr::new(*ip, t.port))
            .collect(),
        None => Vec::new(),
    }
}
