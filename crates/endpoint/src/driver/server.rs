//! The tokio driver of a PE's session side: accepts pool users on the user transport and runs
//! the [`SessionServer`] core with one service instance per session.

use crate::server::{ServerAction, ServerConfig, ServerEvent, ServerStats, SessionServer};
use rserpool_services::{Now, ServerService};
use rserpool_transport::{
    Endpoint, EndpointConfig, EndpointHandle, Event, TransportError, TransportKind,
};
use rserpool_wire::{PoolElement, PoolHandle};
use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

/// What the session side reports about itself.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ServerStatus {
    /// Counters of the core.
    pub stats: ServerStats,
    /// The service's load in per mille (0..=1000).
    pub load_per_mille: u32,
}

enum Command {
    BusinessCard(Option<(PoolHandle, Vec<PoolElement>)>),
    Shutdown(tokio::sync::oneshot::Sender<()>),
}

/// A running session side: pool users connect to [`PoolElementServer::local_addrs`].
pub struct PoolElementServer {
    local_addrs: Vec<SocketAddr>,
    kind: TransportKind,
    status: watch::Receiver<ServerStatus>,
    commands: mpsc::Sender<Command>,
    task: tokio::task::JoinHandle<()>,
}

impl PoolElementServer {
    /// Binds the user transport (`endpoint.local_addrs`, accepting) and serves every session
    /// with `service`.
    pub async fn start(
        mut endpoint: EndpointConfig,
        config: ServerConfig,
        service: Box<dyn ServerService>,
    ) -> Result<PoolElementServer, TransportError> {
        endpoint.accept = true;
        let mut ep = Endpoint::bind(endpoint).await?;
        let local_addrs = ep.local_addrs().to_vec();
        let kind = ep.kind();
        let (status_tx, status) = watch::channel(ServerStatus::default());
        let (commands, mut rx) = mpsc::channel(8);
        let task = tokio::spawn(async move {
            let epoch = Instant::now();
            let now = || {
                Now::new(
                    epoch.elapsed(),
                    SystemTime::now()
                        .duration_since(UNIX_EPOCH)
                        .unwrap_or_default(),
                )
            };
            let handle = ep.handle();
            let mut core = SessionServer::new(config, service);
            loop {
                let sent = run_actions(&handle, &mut core, now()).await;
                for s in sent {
                    core.writable(now(), s);
                }
                while let Some(e) = core.poll_event() {
                    log_event(&e);
                }
                let _ = status_tx.send(ServerStatus {
                    stats: core.stats().clone(),
                    load_per_mille: (core.load().clamp(0.0, 1.0) * 1000.0).round() as u32,
                });
                let deadline = core
                    .poll_timeout()
                    .map(|d| epoch + d)
                    .unwrap_or_else(|| Instant::now() + Duration::from_secs(3600));
                let more = core.has_actions();
                tokio::select! {
                    _ = std::future::ready(()), if more => {}
                    _ = tokio::time::sleep_until(deadline) => core.handle_timeout(now()),
                    cmd = rx.recv() => match cmd {
                        Some(Command::BusinessCard(c)) => core.set_business_card(c),
                        Some(Command::Shutdown(done)) => {
                            // Last words (CalcApp's final cookies), then close every session.
                            core.shutdown(now());
                            run_actions(&handle, &mut core, now()).await;
                            for a in handle.associations() {
                                let _ = handle.close(a).await;
                            }
                            let _ = tokio::time::timeout(Duration::from_secs(1), async {
                                while !handle.associations().is_empty() {
                                    if ep.next_event().await.is_none() {
                                        break;
                                    }
                                }
                            })
                            .await;
                            let _ = done.send(());
                            break;
                        }
                        None => break,
                    },
                    ev = ep.next_event() => match ev {
                        Some(Event::AssociationUp { id, peer_addrs, .. }) => {
                            tracing::debug!(session = %id, peer = ?peer_addrs, "session from a pool user");
                            // The pool user's identity for bound cookies: the smallest of its
                            // addresses without the port. It survives a failover to another PE,
                            // and a multi-homed SCTP peer lists every address whichever path
                            // came up first, so the smallest is the same on each association.
                            let identity = peer_addrs
                                .iter()
                                .map(|a| a.ip())
                                .min()
                                .map(|ip| ip.to_string().into_bytes());
                            core.accept(now(), id.0, identity);
                        }
                        Some(Event::Message { id, ppid, stream, data }) => {
                            core.message(now(), id.0, ppid, stream, &data)
                        }
                        Some(Event::AssociationDown { id, reason }) => {
                            tracing::debug!(session = %id, %reason, "session ended");
                            core.closed(now(), id.0);
                        }
                        Some(_) => {}
                        None => break,
                    },
                }
            }
            ep.shutdown();
        });
        Ok(PoolElementServer {
            local_addrs,
            kind,
            status,
            commands,
            task,
        })
    }

    /// The addresses pool users connect to (with the actual port).
    pub fn local_addrs(&self) -> &[SocketAddr] {
        &self.local_addrs
    }

    /// SCTP or the TCP mapping.
    pub fn kind(&self) -> TransportKind {
        self.kind
    }

    /// The latest counters.
    pub fn status(&self) -> ServerStatus {
        self.status.borrow().clone()
    }

    /// Sets the business card sent to each new session (RFC 5352 §3.9); `None` sends none.
    pub async fn set_business_card(&self, card: Option<(PoolHandle, Vec<PoolElement>)>) {
        let _ = self.commands.send(Command::BusinessCard(card)).await;
    }

    /// Stops serving at once: every session is aborted (as a crash would).
    pub fn stop(self) {
        self.task.abort();
    }

    /// Stops serving gracefully: the service's last words (CalcApp's final cookies), then
    /// every session is closed.
    pub async fn shutdown(self) {
        let (tx, rx) = tokio::sync::oneshot::channel();
        if self.commands.send(Command::Shutdown(tx)).await.is_ok() {
            let _ = rx.await;
        }
    }
}

/// Carries out the core's actions; returns the sessions that were sent data.
async fn run_actions(handle: &EndpointHandle, core: &mut SessionServer, now: Now) -> BTreeSet<u64> {
    let mut sent = BTreeSet::new();
    while let Some(a) = core.poll_action() {
        match a {
            ServerAction::Transmit {
                session,
                ppid,
                stream,
                data,
            } => {
                let id = rserpool_transport::AssociationId(session);
                if let Err(e) = handle.send(id, ppid, stream, data).await {
                    tracing::debug!(session = %id, error = %e, "cannot send; aborting the session");
                    let _ = handle.abort(id).await;
                    core.closed(now, session);
                    sent.remove(&session);
                } else {
                    sent.insert(session);
                }
            }
            ServerAction::Close(session) => {
                let _ = handle
                    .close(rserpool_transport::AssociationId(session))
                    .await;
            }
            ServerAction::Abort(session) => {
                let _ = handle
                    .abort(rserpool_transport::AssociationId(session))
                    .await;
            }
        }
    }
    sent
}

fn log_event(e: &ServerEvent) {
    match e {
        ServerEvent::Accepted(s) => tracing::debug!(session = s, "session accepted"),
        ServerEvent::Refused(s) => {
            tracing::warn!(session = s, "session refused: session limit reached")
        }
        ServerEvent::CookieEcho {
            session,
            len,
            result: Ok(()),
        } => tracing::info!(session, len, "session restored from a cookie echo"),
        ServerEvent::CookieEcho {
            session,
            len,
            result: Err(e),
        } => tracing::warn!(session, len, error = %e, "cookie echo refused"),
        ServerEvent::Load(l) => tracing::debug!(load = l, "load changed"),
        ServerEvent::Report(r) => tracing::debug!(report = ?r, "service"),
        ServerEvent::BusinessCardSent(s) => tracing::debug!(session = s, "business card sent"),
        ServerEvent::Bad { session, reason } => {
            tracing::warn!(session, %reason, "session aborted: bad input")
        }
        ServerEvent::ServiceAborted { session, reason } => {
            tracing::warn!(session, %reason, "session aborted by the service")
        }
        ServerEvent::Ended(s) => tracing::debug!(session = s, "session ended"),
    }
}
