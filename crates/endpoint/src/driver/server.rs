//! The tokio driver of a PE's session side: accepts pool users on the user transport and runs
//! the [`SessionServer`] core with one service instance per session.

use crate::server::{
    ServerAction, ServerConfig, ServerEvent, ServerStats, SessionServer, SessionService,
};
use rserpool_transport::{
    Endpoint, EndpointConfig, EndpointHandle, Event, TransportError, TransportKind,
};
use rserpool_wire::{PoolElement, PoolHandle};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

/// Makes the service instance of a new session.
pub type ServiceFactory = Arc<dyn Fn() -> Box<dyn SessionService> + Send + Sync>;

/// What the session side reports about itself.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ServerStatus {
    /// Counters of the core.
    pub stats: ServerStats,
}

enum Command {
    BusinessCard(Option<(PoolHandle, Vec<PoolElement>)>),
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
    /// Binds the user transport (`endpoint.local_addrs`, accepting) and serves each session
    /// with a service from `factory`.
    pub async fn start(
        mut endpoint: EndpointConfig,
        config: ServerConfig,
        factory: ServiceFactory,
    ) -> Result<PoolElementServer, TransportError> {
        endpoint.accept = true;
        let mut ep = Endpoint::bind(endpoint).await?;
        let local_addrs = ep.local_addrs().to_vec();
        let kind = ep.kind();
        let (status_tx, status) = watch::channel(ServerStatus::default());
        let (commands, mut rx) = mpsc::channel(8);
        let task = tokio::spawn(async move {
            let epoch = Instant::now();
            let now = || epoch.elapsed();
            let handle = ep.handle();
            let mut core = SessionServer::new(config);
            loop {
                run_actions(&handle, &mut core).await;
                while let Some(e) = core.poll_event() {
                    log_event(&e);
                }
                let _ = status_tx.send(ServerStatus {
                    stats: core.stats().clone(),
                });
                let deadline = core
                    .poll_timeout()
                    .map(|d| epoch + d)
                    .unwrap_or_else(|| Instant::now() + Duration::from_secs(3600));
                tokio::select! {
                    _ = tokio::time::sleep_until(deadline) => core.handle_timeout(now()),
                    cmd = rx.recv() => match cmd {
                        Some(Command::BusinessCard(c)) => core.set_business_card(c),
                        None => break,
                    },
                    ev = ep.next_event() => match ev {
                        Some(Event::AssociationUp { id, peer_addrs, .. }) => {
                            tracing::debug!(session = %id, peer = ?peer_addrs, "session from a pool user");
                            core.accept(now(), id.0, factory());
                        }
                        Some(Event::Message { id, ppid, stream, data }) => {
                            core.message(now(), id.0, ppid, stream, &data)
                        }
                        Some(Event::AssociationDown { id, reason }) => {
                            tracing::debug!(session = %id, %reason, "session ended");
                            core.closed(id.0);
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

    /// Stops serving: every session is aborted.
    pub fn stop(self) {
        self.task.abort();
    }
}

async fn run_actions(handle: &EndpointHandle, core: &mut SessionServer) {
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
                    core.closed(session);
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
}

fn log_event(e: &ServerEvent) {
    match e {
        ServerEvent::Accepted(s) => tracing::debug!(session = s, "session accepted"),
        ServerEvent::Refused(s) => {
            tracing::warn!(session = s, "session refused: session limit reached")
        }
        ServerEvent::CookieEcho { session, len } => {
            tracing::info!(session, len, "cookie echo handed to the service")
        }
        ServerEvent::CookieSent { session, len } => {
            tracing::trace!(session, len, "cookie sent")
        }
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
