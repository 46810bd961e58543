//! Tokio drivers for the pool element and pool user cores: each owns a transport endpoint, keeps
//! one association to a registrar (trying the given registrars in turn), and runs its core.

use crate::pe::{PeEvent, PoolElementConfig, PoolElementCore};
use crate::pu::{RequestId, Resolution, ResolveError, Resolver, ResolverConfig, ResolverEvent};
use rserpool_transport::multicast::{MulticastConfig, MulticastSocket};
use rserpool_transport::{
    AssociationId, Endpoint, EndpointConfig, EndpointHandle, Event, TransportChoice, TransportError,
};
use rserpool_wire::{
    PoolElementId, PoolHandle, PoolPolicy, Protocol, RegistrarId, TransportProtocol,
};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::Instant;

/// How a client reaches registrars.
#[derive(Debug, Clone)]
pub struct RegistrarAccess {
    /// Registrars to try, in order (each may have several addresses for SCTP multi-homing: give
    /// them as separate entries of the inner list).
    pub registrars: Vec<Vec<SocketAddr>>,
    /// SCTP, the TCP mapping, or whichever the kernel allows.
    pub transport: TransportChoice,
    /// Pause between two rounds over all registrars when none answers.
    pub retry_interval: Duration,
    /// Transport settings (limits, SCTP timers, TCP keep-alives). A pool element's endpoint
    /// accepts associations (a new home registrar connects to it): give `local_addrs` for the
    /// TCP mapping to listen on.
    pub endpoint: EndpointConfig,
    /// Listen for ASAP_SERVER_ANNOUNCEs on this group (pool elements only; `None`: the static
    /// list only). Keep it on the loopback or in a namespace in tests.
    pub announce: Option<MulticastConfig>,
}

impl RegistrarAccess {
    /// One registrar at one address.
    pub fn single(addr: SocketAddr, transport: TransportChoice) -> Self {
        RegistrarAccess {
            registrars: vec![vec![addr]],
            transport,
            retry_interval: Duration::from_secs(1),
            endpoint: EndpointConfig::new(transport),
            announce: None,
        }
    }
}

async fn bind(access: &RegistrarAccess) -> Result<Endpoint, TransportError> {
    let mut c = access.endpoint.clone();
    c.transport = access.transport;
    c.accept = false;
    Endpoint::bind(c).await
}

/// Connects to the first registrar that answers, going round the list (RFC 5352 §3.6: server
/// hunt with static addresses).
async fn hunt(
    endpoint: &mut Endpoint,
    access: &RegistrarAccess,
    cursor: &mut usize,
) -> Option<AssociationId> {
    let n = access.registrars.len();
    for _ in 0..n {
        let addrs = &access.registrars[*cursor % n];
        *cursor += 1;
        match endpoint.handle().connect(addrs).await {
            Ok(id) => loop {
                match endpoint.next_event().await? {
                    Event::AssociationUp { id: up, .. } if up == id => return Some(id),
                    Event::AssociationDown { id: down, reason } if down == id => {
                        tracing::debug!(registrar = ?addrs, %reason, "registrar not reachable");
                        break;
                    }
                    _ => {}
                }
            },
            Err(e) => tracing::debug!(registrar = ?addrs, error = %e, "cannot connect"),
        }
    }
    None
}

async fn send_all(
    handle: &EndpointHandle,
    id: AssociationId,
    mut next: impl FnMut() -> Option<Vec<u8>>,
) {
    while let Some(b) = next() {
        if let Err(e) = handle.send(id, Protocol::Asap.ppid(), 0, b).await {
            tracing::warn!(error = %e, "cannot send to the registrar");
        }
    }
}

/// A pool element that stays registered until dropped or deregistered.
pub struct PoolElementHandle {
    commands: mpsc::Sender<PeCommand>,
    status: watch::Receiver<PeStatus>,
    id: PoolElementId,
}

/// What a running pool element reports about itself.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PeStatus {
    /// Registered at a registrar now.
    pub registered: bool,
    /// Registrations accepted so far.
    pub registrations: u64,
    /// Keep-alives answered so far.
    pub keep_alives: u64,
    /// The last rejection's cause, if any.
    pub last_reject: Option<String>,
    /// The home registrar, as learned from keep-alives.
    pub home: Option<RegistrarId>,
    /// Times a registrar took this PE over (keep-alive with the H flag).
    pub new_homes: u64,
    /// Hunt rounds in which no registrar could be reached.
    pub hunt_rounds_failed: u64,
}

enum PeCommand {
    SetPolicy(PoolPolicy),
    Deregister(oneshot::Sender<()>),
    Abort(oneshot::Sender<()>),
}

impl PoolElementHandle {
    /// Starts a pool element: binds a transport endpoint (accepting, so that a new home
    /// registrar can reach it), hunts for a registrar among `access.registrars` (and those heard
    /// in announces when `access.announce` is set) and registers. The hunt, the retries and the
    /// choice of registrar are the core's ([`PoolElementCore`]); this task only carries them out.
    pub async fn start(
        mut config: PoolElementConfig,
        access: RegistrarAccess,
    ) -> Result<PoolElementHandle, TransportError> {
        let mut c = access.endpoint.clone();
        c.transport = access.transport;
        // Accept associations from registrars (a new home after a takeover, RFC 5352 §3.4):
        // over SCTP on the one socket; over the TCP mapping only on the addresses given.
        c.accept = !c.local_addrs.is_empty() || access.transport == TransportChoice::Sctp;
        // Over the TCP mapping a registrar that takes this PE over connects to the address the
        // registration came from: let it be the listening one.
        c.tcp.connect_from_listening_port = c.accept;
        let mut endpoint = Endpoint::bind(c).await?;
        if config.registrars.is_empty() {
            config.registrars = access.registrars.clone();
        }
        config.registrar_protocol = match endpoint.kind() {
            rserpool_transport::TransportKind::Sctp => TransportProtocol::Sctp,
            rserpool_transport::TransportKind::Tcp => TransportProtocol::Tcp,
        };
        let announces = match &access.announce {
            Some(m) => Some(MulticastSocket::open(m)?),
            None => None,
        };
        let core = PoolElementCore::new(config, &mut rand::rng());
        let id = core.id();
        let (commands, mut rx) = mpsc::channel(16);
        let (status_tx, status) = watch::channel(PeStatus::default());
        tokio::spawn(async move {
            let epoch = Instant::now();
            let now = || epoch.elapsed();
            let mut core = core;
            let handle = endpoint.handle();
            let mut st = PeStatus::default();
            let mut assoc: Option<AssociationId> = None;
            let mut pending: Option<AssociationId> = None;
            let mut others: Vec<AssociationId> = Vec::new();
            let mut leaving: Option<oneshot::Sender<()>> = None;
            core.start(now());
            'outer: loop {
                while let Some(addrs) = core.poll_connect() {
                    tracing::debug!(registrar = ?addrs, "connecting to a registrar");
                    match handle.connect(&addrs).await {
                        Ok(id) => pending = Some(id),
                        Err(e) => {
                            tracing::debug!(registrar = ?addrs, error = %e, "cannot connect");
                            core.connect_failed(now());
                        }
                    }
                }
                // Events first: a new home changes where the transmits go.
                while let Some(e) = core.poll_event() {
                    match e {
                        PeEvent::Registered { first } => {
                            st.registered = true;
                            st.registrations += 1;
                            if first {
                                tracing::info!(pe = %core.id(), "registered");
                            }
                        }
                        PeEvent::Rejected { cause } => {
                            st.last_reject = Some(format!("{cause:?}"));
                            tracing::warn!(?cause, "registration rejected");
                        }
                        PeEvent::KeepAlive { .. } => st.keep_alives += 1,
                        PeEvent::NewHome {
                            registrar,
                            association,
                        } => {
                            let new = AssociationId(association);
                            tracing::info!(%registrar, association = %new, "new home registrar");
                            others.retain(|a| *a != new);
                            if let Some(old) = assoc.replace(new) {
                                let _ = handle.abort(old).await;
                            }
                            st.home = Some(registrar);
                            st.new_homes += 1;
                        }
                        PeEvent::RegistrarLost => {
                            tracing::warn!("the registrar does not answer: hunting for another");
                            st.registered = false;
                            if let Some(a) = assoc.take() {
                                let _ = handle.abort(a).await;
                            }
                        }
                        PeEvent::HuntFailed { retry_in } => {
                            st.hunt_rounds_failed += 1;
                            tracing::warn!(retry_in = ?retry_in, "no registrar reachable");
                        }
                        PeEvent::ProtocolError(e) => {
                            tracing::warn!(error = %e, "registrar protocol error")
                        }
                        PeEvent::Deregistered => st.registered = false,
                        PeEvent::DeregistrationTimedOut => {
                            tracing::warn!("the registrar did not confirm the deregistration");
                            st.registered = false;
                        }
                    }
                }
                if let Some(a) = assoc {
                    send_all(&handle, a, || core.poll_transmit()).await;
                } else {
                    while core.poll_transmit().is_some() {}
                }
                if st.home != core.home_registrar() {
                    st.home = core.home_registrar();
                }
                let _ = status_tx.send(st.clone());
                // Leaving: the core decides when the wait for the deregistration response is
                // over (answered, timed out, association gone).
                if leaving.is_some() && core.is_done() {
                    if let Some(a) = assoc.take() {
                        let _ = handle.close(a).await;
                    }
                    if let Some(done) = leaving.take() {
                        let _ = done.send(());
                    }
                    break 'outer;
                }
                let deadline = core
                    .poll_timeout()
                    .map(|d| epoch + d)
                    .unwrap_or_else(|| Instant::now() + Duration::from_secs(3600));
                let announce = async {
                    match &announces {
                        Some(m) => m.recv().await.ok(),
                        None => std::future::pending().await,
                    }
                };
                tokio::select! {
                    _ = tokio::time::sleep_until(deadline) => core.handle_timeout(now()),
                    Some(d) = announce => core.announce(now(), d.source, &d.data),
                    cmd = rx.recv() => match cmd {
                        Some(PeCommand::SetPolicy(p)) => core.set_policy(now(), p),
                        Some(PeCommand::Deregister(done)) => {
                            if leaving.is_none() {
                                core.deregister(now());
                                leaving = Some(done);
                            }
                        }
                        Some(PeCommand::Abort(done)) => {
                            if let Some(a) = assoc {
                                let _ = handle.abort(a).await;
                            }
                            let _ = done.send(());
                            break 'outer;
                        }
                        None => {
                            // The handle was dropped: leave the pool.
                            core.deregister(now());
                            if let Some(a) = assoc {
                                send_all(&handle, a, || core.poll_transmit()).await;
                                let _ = handle.close(a).await;
                            }
                            break 'outer;
                        }
                    },
                    ev = endpoint.next_event() => match ev {
                        Some(Event::AssociationUp { id, .. }) if Some(id) == pending => {
                            pending = None;
                            assoc = Some(id);
                            core.connected(now());
                        }
                        Some(Event::AssociationUp { id, inbound: true, .. }) => {
                            // A registrar connecting to us (a new home, RFC 5352 §3.4). Bounded.
                            if others.len() >= 8 {
                                let _ = handle.abort(id).await;
                            } else {
                                others.push(id);
                            }
                        }
                        Some(Event::AssociationDown { id, reason }) if Some(id) == pending => {
                            tracing::debug!(%reason, "registrar not reachable");
                            pending = None;
                            core.connect_failed(now());
                        }
                        Some(Event::AssociationDown { id, reason }) if Some(id) == assoc => {
                            tracing::warn!(%reason, "lost the registrar");
                            assoc = None;
                            st.registered = false;
                            core.disconnected(now());
                        }
                        Some(Event::AssociationDown { id, .. }) => others.retain(|a| *a != id),
                        Some(Event::Message { id, data, .. }) if Some(id) == assoc => core.message(now(), &data),
                        Some(Event::Message { id, data, .. }) => core.message_on_other(now(), id.0, &data),
                        Some(_) => {}
                        None => break 'outer,
                    },
                }
            }
            endpoint.shutdown();
        });
        Ok(PoolElementHandle {
            commands,
            status,
            id,
        })
    }

    /// The PE identifier.
    pub fn id(&self) -> PoolElementId {
        self.id
    }

    /// The latest status.
    pub fn status(&self) -> PeStatus {
        self.status.borrow().clone()
    }

    /// Waits until the registrar has accepted the registration (or `timeout` passes).
    pub async fn wait_registered(&mut self, timeout: Duration) -> bool {
        tokio::time::timeout(timeout, self.status.wait_for(|s| s.registered))
            .await
            .is_ok_and(|r| r.is_ok())
    }

    /// New policy values (e.g. a load change): re-registers.
    pub async fn set_policy(&self, policy: PoolPolicy) {
        let _ = self.commands.send(PeCommand::SetPolicy(policy)).await;
    }

    /// Aborts the association to the registrar without deregistering, as a crash would: the
    /// registrar learns of it from the transport only.
    pub async fn abort(self) {
        let (tx, rx) = oneshot::channel();
        if self.commands.send(PeCommand::Abort(tx)).await.is_ok() {
            let _ = rx.await;
        }
    }

    /// Deregisters and closes the association; returns when done.
    pub async fn deregister(self) {
        let (tx, rx) = oneshot::channel();
        if self.commands.send(PeCommand::Deregister(tx)).await.is_ok() {
            let _ = rx.await;
        }
    }
}

enum PuCommand {
    Resolve(
        PoolHandle,
        oneshot::Sender<Result<Resolution, ResolveError>>,
    ),
    Unreachable(PoolHandle, PoolElementId),
}

/// A pool user's resolver running over a transport: `resolve` a pool handle, report PEs that
/// could not be reached. Cloneable; the task ends when the last clone is dropped.
#[derive(Clone)]
pub struct PoolUserClient {
    commands: mpsc::Sender<PuCommand>,
}

impl PoolUserClient {
    /// Starts the client: binds a transport endpoint and connects to a registrar when needed.
    pub async fn start(
        config: ResolverConfig,
        access: RegistrarAccess,
    ) -> Result<PoolUserClient, TransportError> {
        let mut endpoint = bind(&access).await?;
        let (commands, mut rx) = mpsc::channel::<PuCommand>(64);
        tokio::spawn(async move {
            let epoch = Instant::now();
            let now = || epoch.elapsed();
            let mut core = Resolver::new(config);
            let mut waiting: HashMap<RequestId, oneshot::Sender<Result<Resolution, ResolveError>>> =
                HashMap::new();
            let mut assoc: Option<AssociationId> = None;
            let mut cursor = 0;
            loop {
                if assoc.is_none() && !waiting.is_empty() {
                    assoc = hunt(&mut endpoint, &access, &mut cursor).await;
                    match assoc {
                        Some(_) => core.connected(now()),
                        // No registrar answers: everything waiting fails now.
                        None => core.fail_all(ResolveError::NoRegistrar),
                    }
                }
                if let Some(a) = assoc {
                    send_all(&endpoint.handle(), a, || core.poll_transmit()).await;
                }
                while let Some(e) = core.poll_event() {
                    match e {
                        ResolverEvent::Resolved {
                            request,
                            resolution,
                        } => {
                            if let Some(tx) = waiting.remove(&request) {
                                let _ = tx.send(Ok(resolution));
                            }
                        }
                        ResolverEvent::Failed { request, error, .. } => {
                            if let Some(tx) = waiting.remove(&request) {
                                let _ = tx.send(Err(error));
                            }
                        }
                        ResolverEvent::ProtocolError(e) => {
                            tracing::warn!(error = %e, "registrar protocol error")
                        }
                    }
                }
                let deadline = core
                    .poll_timeout()
                    .map(|d| epoch + d)
                    .unwrap_or_else(|| Instant::now() + Duration::from_secs(3600));
                tokio::select! {
                    _ = tokio::time::sleep_until(deadline) => core.handle_timeout(now()),
                    cmd = rx.recv() => match cmd {
                        Some(PuCommand::Resolve(pool, tx)) => {
                            let r = core.resolve(now(), pool);
                            waiting.insert(r, tx);
                        }
                        Some(PuCommand::Unreachable(pool, pe)) => core.report_unreachable(&pool, pe),
                        None => break,
                    },
                    ev = endpoint.next_event() => match ev {
                        Some(Event::Message { id, data, .. }) if Some(id) == assoc => core.message(now(), &data),
                        Some(Event::AssociationDown { id, .. }) if Some(id) == assoc => {
                            assoc = None;
                            core.disconnected(now());
                        }
                        Some(_) => {}
                        None => break,
                    },
                }
            }
            endpoint.shutdown();
        });
        Ok(PoolUserClient { commands })
    }

    /// Resolves a pool handle to the PEs the registrar selects (or the cache holds).
    pub async fn resolve(&self, pool: PoolHandle) -> Result<Resolution, ResolveError> {
        let (tx, rx) = oneshot::channel();
        self.commands
            .send(PuCommand::Resolve(pool, tx))
            .await
            .map_err(|_| ResolveError::RegistrarLost)?;
        rx.await.map_err(|_| ResolveError::RegistrarLost)?
    }

    /// Reports a PE that could not be reached (ASAP_ENDPOINT_UNREACHABLE).
    pub async fn report_unreachable(&self, pool: PoolHandle, pe: PoolElementId) {
        let _ = self.commands.send(PuCommand::Unreachable(pool, pe)).await;
    }
}

mod server;
mod session;

pub use server::{PoolElementServer, ServerStatus};
pub use session::{OpenError, SessionHandle, SessionSnapshot};
