//! The tokio driver: runs a [`Registrar`] core over a transport endpoint (kernel SCTP or the TCP
//! mapping, plus plain-TCP ASAP for pool users), sends server announces by multicast, logs every
//! event and serves the metrics.

use crate::core::{Destination, PeerInfo, Registrar, RegistrarEvent};
use crate::enrp::io::{EnrpDriverConfig, EnrpSide, Input};
use crate::metrics::Metrics;
use crate::outbox::{self, Outbox};
use crate::RegistrarConfig;
use rserpool_transport::multicast::{Interface, MulticastConfig, MulticastSocket};
use rserpool_transport::{
    Endpoint, EndpointConfig, EndpointHandle, Event, TransportChoice, TransportError, TransportKind,
};
use rserpool_wire::{TransportAddress, TransportProtocol, TransportUse};
use std::future::Future;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;

/// Most transport events handled before the answers are sent and the metrics published.
const MAX_BATCH: usize = 256;

/// Where and how the registrar listens.
#[derive(Debug, Clone)]
pub struct DriverConfig {
    /// The protocol core's settings.
    pub core: RegistrarConfig,
    /// SCTP, the TCP mapping, or whichever the kernel allows.
    pub transport: TransportChoice,
    /// ASAP listening addresses (one port; several addresses multi-home an SCTP endpoint).
    pub asap_listen: Vec<SocketAddr>,
    /// Plain-TCP ASAP listeners for pool users' handle resolutions (RFC 5352 §3.3).
    pub plain_tcp_listen: Vec<SocketAddr>,
    /// Interface (by IPv4 address) the announces go out on; `None`: the interfaces of the
    /// ASAP listening addresses (loopback only for a registrar on 127.0.0.1, each interface for
    /// 0.0.0.0), see [`rserpool_transport::multicast::announce_interfaces`].
    pub announce_interface: Option<std::net::Ipv4Addr>,
    /// TTL of announces: 1 keeps them on the local link (RSPLIB uses 30; set it where
    /// registrars and PEs are routers apart).
    pub announce_ttl: u32,
    /// The HTTP endpoint (`/metrics`, `/status`, `/healthz`) at `http://ADDR/`.
    pub metrics_listen: Option<SocketAddr>,
    /// Most pools (and home registrars) listed in `/status`; the rest are counted
    /// (`pools_omitted`), so that the document stays small for a huge handlespace.
    pub status_max_pools: usize,
    /// Limits of the HTTP endpoint (request timeout and size, connections at once).
    pub http_limits: rserpool_observe::server::Limits,
    /// Transport settings beyond the above (limits, SCTP timers, TCP keep-alives).
    pub endpoint: EndpointConfig,
    /// Most answers held for one association while the transport has no room for them; past
    /// it new answers to that association are dropped (and counted).
    pub max_held_answers: usize,
    /// ENRP with peer registrars (RFC 5353); `None` runs a registrar on its own.
    pub enrp: Option<EnrpDriverConfig>,
}

impl DriverConfig {
    /// Defaults: ASAP on the well-known port of the loopback address (nothing beyond the host
    /// unless asked), announces on the loopback interface with TTL 1, transport chosen by the
    /// kernel.
    pub fn new(core: RegistrarConfig) -> Self {
        DriverConfig {
            core,
            transport: TransportChoice::Auto,
            asap_listen: vec![SocketAddr::from(([127, 0, 0, 1], 3863))],
            plain_tcp_listen: Vec::new(),
            announce_interface: None,
            announce_ttl: 1,
            metrics_listen: None,
            status_max_pools: 256,
            http_limits: rserpool_observe::server::Limits::default(),
            endpoint: EndpointConfig::new(TransportChoice::Auto),
            max_held_answers: 1024,
            enrp: None,
        }
    }
}

/// What a running registrar exposes to its caller (tests, the CLI).
#[derive(Debug, Clone)]
pub struct Running {
    /// The registrar's identifier.
    pub registrar_id: rserpool_wire::RegistrarId,
    /// The transport in use.
    pub transport: TransportKind,
    /// The ASAP addresses actually bound (with the port chosen, if 0 was asked).
    pub asap_addrs: Vec<SocketAddr>,
    /// The plain-TCP ASAP addresses actually bound.
    pub plain_tcp_addrs: Vec<SocketAddr>,
    /// The metrics address actually bound.
    pub metrics_addr: Option<SocketAddr>,
    /// Where server announces go: one socket per interface, with the interface and TTL the
    /// kernel reports for it (empty: announces off).
    pub announces: Vec<AnnounceSocket>,
    /// The ENRP addresses actually bound (empty without ENRP).
    pub enrp_addrs: Vec<SocketAddr>,
    /// The counters, updated after every step.
    pub metrics: Arc<Mutex<Metrics>>,
    endpoint: EndpointHandle,
}

impl Running {
    /// The counters as of now: those of the last step, with the transport's (TLS handshakes)
    /// read now, since a refused handshake causes no step.
    pub fn metrics_now(&self) -> Metrics {
        let mut m = self.metrics.lock().map(|m| m.clone()).unwrap_or_default();
        m.set_transport(&self.endpoint.stats());
        m
    }
}

/// Addresses as a comma-separated list (for logs; "none" when empty).
fn list(addrs: &[SocketAddr]) -> String {
    if addrs.is_empty() {
        return "none".into();
    }
    addrs
        .iter()
        .map(|a| a.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// One announce socket as the kernel has it set up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AnnounceSocket {
    /// The group and port announces go to.
    pub group: SocketAddr,
    /// The interface (`IP_MULTICAST_IF`) they leave by.
    pub interface: std::net::Ipv4Addr,
    /// Their TTL.
    pub ttl: u32,
}

/// Errors that stop the registrar from starting.
#[derive(Debug, thiserror::Error)]
pub enum DriverError {
    /// The transport could not be set up.
    #[error("transport: {0}")]
    Transport(#[from] TransportError),
    /// A socket could not be bound.
    #[error("{what} {addr}: {source}")]
    Bind {
        /// Which socket.
        what: &'static str,
        /// Where.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
}

/// Binds everything, then runs the registrar until `shutdown` completes. `started` receives
/// what was bound once the registrar serves.
pub async fn run(
    mut config: DriverConfig,
    started: tokio::sync::oneshot::Sender<Running>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), DriverError> {
    let mut ep_config = config.endpoint.clone();
    ep_config.transport = config.transport;
    ep_config.local_addrs = config.asap_listen.clone();
    ep_config.accept = true;
    ep_config.tcp.plain_asap_listen = config.plain_tcp_listen.clone();
    ep_config.limits.max_associations = config.core.max_associations + 16;
    if let Some(tls) = &ep_config.tls {
        // With TLS, identities are checked: the default rules let any certified identity
        // register, and nobody without a certificate.
        let rules = config.core.access.get_or_insert_with(Default::default);
        tracing::info!(
            ca = %tls.ca.display(),
            require_client_certificate = tls.require_client_certificate,
            registration = ?rules.registration.iter().map(|r| format!("{}={}", r.identity,
                r.pools.iter().map(ToString::to_string).collect::<Vec<_>>().join(","))).collect::<Vec<_>>(),
            enrp_peers = ?rules.enrp_peers.iter().map(ToString::to_string).collect::<Vec<_>>(),
            unauthenticated_resolution = rules.unauthenticated_resolution,
            "TLS on: identity rules"
        );
    }
    let mut endpoint = Endpoint::bind(ep_config).await?;
    let handle = endpoint.handle();
    let kind = endpoint.kind();

    // Announce where ASAP is served: explicit addresses as a transport parameter; for wildcard
    // addresses none, so receivers take the announce's source address (RFC 5352 §2.2.10).
    let mut announce_sockets: Vec<MulticastSocket> = Vec::new();
    if let Some(announce) = config.core.announce.as_mut() {
        let bound: Vec<SocketAddr> = endpoint.local_addrs().to_vec();
        if announce.transports.is_empty() && bound.iter().all(|a| !a.ip().is_unspecified()) {
            if let Some(first) = bound.first() {
                announce.transports.push(TransportAddress {
                    protocol: match kind {
                        TransportKind::Sctp => TransportProtocol::Sctp,
                        TransportKind::Tcp => TransportProtocol::Tcp,
                    },
                    port: first.port(),
                    transport_use: TransportUse::DataOnly,
                    addresses: match kind {
                        TransportKind::Sctp => bound.iter().map(|a| a.ip()).collect(),
                        TransportKind::Tcp => vec![first.ip()],
                    },
                });
            }
        }
        // Announces follow the listening addresses: a registrar on loopback announces on the
        // loopback interface only, one on specific addresses on their interfaces only.
        let interfaces = match config.announce_interface {
            Some(i) => vec![i],
            None => rserpool_transport::multicast::announce_interfaces(
                &bound,
                &rserpool_transport::multicast::ipv4_multicast_interfaces(),
            ),
        };
        let mut last_error = None;
        if interfaces.is_empty() {
            tracing::warn!(
                asap = %list(&bound),
                "server announces off: no IPv4 interface among the listening addresses"
            );
        }
        for interface in interfaces {
            let mc = MulticastConfig {
                group: announce.group,
                interfaces: vec![Interface::V4(interface)],
                ttl: config.announce_ttl,
                loopback: true,
                max_datagram: 65_535,
            };
            match MulticastSocket::open(&mc) {
                Ok(s) => announce_sockets.push(s),
                // An interface named explicitly must work; of the interfaces found for the
                // listening addresses, one that cannot do multicast is left out (and said so),
                // as long as another one can.
                Err(e) if config.announce_interface.is_none() => {
                    tracing::warn!(%interface, error = %e, "no server announces on this interface");
                    last_error = Some(e);
                }
                Err(e) => return Err(e.into()),
            }
        }
        if let (true, Some(e)) = (announce_sockets.is_empty(), last_error) {
            return Err(e.into());
        }
    }

    let shared_metrics = Arc::new(Mutex::new(Metrics::default()));
    // `/status` and `/healthz` ask the event loop; a few requests may wait, more are refused.
    let (status_tx, mut status_rx) = tokio::sync::mpsc::channel::<crate::http::StatusRequest>(8);
    let mut _http = None;
    let metrics_addr = match config.metrics_listen {
        Some(addr) => {
            let listener = tokio::net::TcpListener::bind(addr)
                .await
                .map_err(|source| DriverError::Bind {
                    what: "metrics (the HTTP endpoint)",
                    addr,
                    source,
                })?;
            let bound = listener.local_addr().ok();
            _http = Some(
                crate::http::endpoint(shared_metrics.clone(), handle.clone(), status_tx)
                    .limits(config.http_limits)
                    .spawn(listener),
            );
            bound
        }
        None => {
            drop(status_tx);
            None
        }
    };

    let epoch = Instant::now();
    let now = || epoch.elapsed();
    let mut core_config = config.core.clone();
    // The driver only logs resolution reports, at debug: without those logs nobody reads them.
    core_config.report_resolutions &= tracing::enabled!(tracing::Level::DEBUG);
    let mut core = Registrar::new(core_config, now());
    if let Ok(mut shared) = shared_metrics.lock() {
        // The identifier, before the first step.
        shared.registrar_id = core.metrics().registrar_id;
    }
    let mut enrp = match config.enrp.take() {
        Some(c) => {
            let mut ep = config.endpoint.clone();
            ep.transport = config.transport;
            Some(EnrpSide::bind(c, &ep, &mut core, now()).await?)
        }
        None => None,
    };
    tracing::info!(
        registrar = %core.id(),
        transport = %kind,
        asap = %list(endpoint.local_addrs()),
        plain_tcp = %list(endpoint.plain_asap_addrs()),
        metrics = %metrics_addr.map(|m| m.to_string()).unwrap_or_else(|| "off".into()),
        profile = core.config().profile.name(),
        "registrar serving"
    );
    let _ = started.send(Running {
        registrar_id: core.id(),
        transport: kind,
        asap_addrs: endpoint.local_addrs().to_vec(),
        plain_tcp_addrs: endpoint.plain_asap_addrs().to_vec(),
        metrics_addr,
        enrp_addrs: enrp.as_ref().map(|e| e.local.clone()).unwrap_or_default(),
        metrics: shared_metrics.clone(),
        announces: announce_sockets
            .iter()
            .map(|s| AnnounceSocket {
                group: s.group(),
                interface: s
                    .sending_interface()
                    .ok()
                    .flatten()
                    .unwrap_or(std::net::Ipv4Addr::UNSPECIFIED),
                ttl: s.ttl().unwrap_or(0),
            })
            .collect(),
        endpoint: handle.clone(),
    });

    if let Some(e) = enrp.as_mut() {
        // The greeting PRESENCE to the static peers goes out now, not at the first timer.
        e.flush().await;
    }
    let mut outbox = Outbox::new(config.max_held_answers);
    tokio::pin!(shutdown);
    // One timer, moved only when the deadline changes.
    let sleep = tokio::time::sleep_until(Instant::now() + Duration::from_secs(3600));
    tokio::pin!(sleep);
    loop {
        let mut deadline = core
            .poll_timeout()
            .into_iter()
            .chain(enrp.as_ref().and_then(|e| e.core.poll_timeout()))
            .min()
            .map(|d| epoch + d)
            .unwrap_or_else(|| Instant::now() + Duration::from_secs(3600));
        if !outbox.is_empty() {
            deadline = deadline.min(Instant::now() + outbox::RETRY);
        }
        if sleep.deadline() != deadline {
            sleep.as_mut().reset(deadline);
        }
        tokio::select! {
            _ = &mut shutdown => break,
            _ = &mut sleep => {
                // Messages already received come first: a keep-alive answer waiting in the
                // queue behind a flood must not count as missing.
                let t = now();
                for _ in 0..MAX_BATCH {
                    let Some(event) = endpoint.try_next_event() else { break };
                    on_transport_event(&mut core, &mut outbox, t, event, enrp.as_mut());
                }
                core.handle_timeout(t);
                if let Some(e) = enrp.as_mut() {
                    e.core.after_asap(&mut core);
                    e.core.handle_timeout(t, &mut core);
                }
            }
            Some(reply) = status_rx.recv() => {
                let enrp_metrics = enrp.as_mut().map(|e| e.core.metrics(&core).clone());
                let metrics = shared_metrics.lock().map(|m| m.clone()).unwrap_or_default();
                let _ = reply.send(crate::http::status_document(
                    &core,
                    &metrics,
                    enrp_metrics.as_ref(),
                    epoch.elapsed(),
                    config.status_max_pools,
                ));
            }
            Some(input) = next_enrp(&mut enrp) => {
                if let Some(e) = enrp.as_mut() {
                    e.on_input(&mut core, now(), input);
                }
            }
            event = endpoint.next_event() => {
                let Some(event) = event else { break };
                // One reading of the clock for the batch: its events are microseconds apart.
                let t = now();
                on_transport_event(&mut core, &mut outbox, t, event, enrp.as_mut());
                // Take what else is queued before answering: one flush per batch.
                for _ in 0..MAX_BATCH {
                    let Some(event) = endpoint.try_next_event() else { break };
                    on_transport_event(&mut core, &mut outbox, t, event, enrp.as_mut());
                }
            }
        }
        if let Some(e) = enrp.as_mut() {
            e.core.after_asap(&mut core);
        }
        flush(
            &mut core,
            &mut outbox,
            &handle,
            &announce_sockets,
            enrp.as_mut(),
        )
        .await;
        if let Some(e) = enrp.as_mut() {
            e.flush().await;
        }
        if let Ok(mut shared) = shared_metrics.lock() {
            shared.clone_from(core.metrics());
            shared.set_transport(&handle.stats());
            shared.enrp = enrp.as_mut().map(|e| e.core.metrics(&core).clone());
            shared.held_answers = outbox.held() as u64;
            shared.dropped_answers = outbox.dropped();
        }
    }
    tracing::info!(registrar = %core.id(), "registrar shutting down");
    if let Some(e) = enrp.as_mut() {
        e.shutdown();
    }
    endpoint.shutdown();
    Ok(())
}

/// The next ENRP input, or never without ENRP.
async fn next_enrp(enrp: &mut Option<EnrpSide>) -> Option<Input> {
    match enrp {
        Some(e) => e.next().await,
        None => std::future::pending().await,
    }
}

fn on_transport_event(
    core: &mut Registrar,
    outbox: &mut Outbox,
    now: Duration,
    event: Event,
    enrp: Option<&mut EnrpSide>,
) {
    match event {
        Event::AssociationUp {
            id,
            kind,
            peer_addrs,
            peer_identity,
            ..
        } => {
            let port = peer_addrs.first().map(|a| a.port()).unwrap_or(0);
            let mut addresses: Vec<_> = peer_addrs.iter().map(|a| a.ip()).collect();
            addresses.dedup();
            core.association_up_with_identity(
                now,
                id,
                PeerInfo {
                    kind,
                    addresses,
                    port,
                },
                peer_identity,
            );
        }
        Event::Message { id, ppid, data, .. } => core.message(now, id, ppid, &data),
        Event::AssociationDown { id, reason } => {
            tracing::debug!(association = id.0, %reason, "association down");
            outbox.forget(id);
            if let Some(e) = enrp {
                e.asap_association_down(id);
            }
            core.association_down(now, id);
        }
        Event::PeerAddressChange { id, addr, state } => {
            tracing::debug!(association = id.0, %addr, ?state, "peer address change");
        }
        Event::SendFailed { id, .. } => {
            // Undelivered because the peer went away: its association-down event follows.
            tracing::debug!(association = id.0, "send failed");
        }
    }
}

async fn flush(
    core: &mut Registrar,
    outbox: &mut Outbox,
    handle: &EndpointHandle,
    announce: &[MulticastSocket],
    mut enrp: Option<&mut EnrpSide>,
) {
    while let Some(t) = core.poll_transmit() {
        match t.destination {
            Destination::Association(a) => outbox.push(a, t.ppid, t.bytes),
            Destination::Address(addr) => {
                // The H=1 keep-alive of a takeover, to a PE we have no association with.
                if let Some(e) = enrp.as_deref_mut() {
                    if let Some(a) = e.asap_association(handle, addr).await {
                        outbox.push(a, t.ppid, t.bytes);
                    }
                }
            }
            Destination::Announce => {
                for s in announce {
                    if let Err(e) = s.send(&t.bytes).await {
                        tracing::warn!(error = %e, group = %s.group(), "cannot send server announce");
                    }
                }
            }
        }
    }
    outbox.send(handle).await;
    while let Some(e) = core.poll_event() {
        log_event(handle, &e).await;
    }
}

async fn log_event(handle: &EndpointHandle, e: &RegistrarEvent) {
    match e {
        RegistrarEvent::AssociationUp { association, peer } => tracing::debug!(
            association = association.0,
            kind = ?peer.kind,
            peer = ?peer.addresses,
            port = peer.port,
            "association up"
        ),
        RegistrarEvent::AssociationRefused {
            association,
            peer,
            limit,
        } => {
            tracing::warn!(
                association = association.0,
                peer = ?peer.addresses,
                port = peer.port,
                limit,
                "association refused: association limit reached"
            );
            let _ = handle.abort(*association).await;
        }
        // New PEs at info; re-registrations, which every PE sends every few seconds, at debug.
        RegistrarEvent::Registered {
            pool_handle,
            element,
            association,
            new: true,
            dropped_addresses,
        } => tracing::info!(
            pool = %pool_handle,
            pe = %element.id,
            association = association.0,
            user_transport = %element.user_transport,
            policy = %element.policy,
            dropped = ?dropped_addresses,
            "registered"
        ),
        RegistrarEvent::Registered {
            pool_handle,
            element,
            association,
            new: false,
            ..
        } => tracing::debug!(
            pool = %pool_handle,
            pe = %element.id,
            association = association.0,
            "re-registered"
        ),
        RegistrarEvent::RegistrationRejected {
            pool_handle,
            pe_id,
            cause,
            reason,
        } => {
            tracing::warn!(pool = %pool_handle, pe = %pe_id, %cause, %reason, "registration rejected")
        }
        RegistrarEvent::Removed {
            pool_handle,
            pe_id,
            cause,
        } => tracing::info!(pool = %pool_handle, pe = %pe_id, %cause, "removed"),
        RegistrarEvent::HandleResolution {
            association,
            pool_handle,
            selection,
        } => match selection {
            Some(s) => tracing::debug!(
                association = association.0,
                pool = %pool_handle,
                policy = %s.policy,
                candidates = s.pool_size,
                selected = ?s.elements.iter().map(|e| (e.id, &e.basis)).collect::<Vec<_>>(),
                "handle resolution"
            ),
            None => {
                tracing::debug!(association = association.0, pool = %pool_handle, "handle resolution: unknown pool handle")
            }
        },
        RegistrarEvent::KeepAliveSent { pool_handle, pe_id } => {
            tracing::trace!(pool = %pool_handle, pe = %pe_id, "keep-alive sent")
        }
        RegistrarEvent::KeepAliveAcked { pool_handle, pe_id } => {
            tracing::trace!(pool = %pool_handle, pe = %pe_id, "keep-alive acknowledged")
        }
        RegistrarEvent::UnreachableReported {
            pool_handle,
            pe_id,
            count,
        } => tracing::debug!(pool = %pool_handle, pe = %pe_id, count, "reported unreachable"),
        // A flood is logged sparsely: the 1st, 2nd, 4th, 8th... refusal of each association
        // at warn (the metrics count every one).
        RegistrarEvent::RateLimited {
            association,
            what,
            count,
        } => {
            if count.is_power_of_two() {
                tracing::warn!(association = association.0, request = ?what, refused = count, "rate limited")
            } else {
                tracing::trace!(association = association.0, request = ?what, refused = count, "rate limited")
            }
        }
        RegistrarEvent::AccessRefused {
            association,
            identity,
            refusal,
            pool_handle,
        } => {
            let peer = handle
                .association(*association)
                .and_then(|a| a.peer_addrs.first().copied());
            tracing::warn!(
                association = association.0,
                peer = ?peer,
                identity = identity.as_deref().map_or_else(|| "none (no certificate)".to_string(), ToString::to_string),
                pool = ?pool_handle.as_ref().map(ToString::to_string),
                reason = refusal.label(),
                "refused: {refusal}"
            )
        }
        RegistrarEvent::Malformed {
            association,
            error,
            answered,
        } => tracing::warn!(association = association.0, %error, answered, "malformed message"),
        RegistrarEvent::Adopted {
            pool_handle,
            pe_id,
            association,
        } => tracing::info!(
            pool = %pool_handle,
            pe = %pe_id,
            association = association.0,
            "PE taken over adopted this registrar as its home"
        ),
        RegistrarEvent::Ignored {
            association,
            message,
            reason,
        } => tracing::debug!(association = association.0, message, reason, "ignored"),
        RegistrarEvent::SecurityRefused {
            request,
            pool_handle,
            pe_id,
            association,
            peer,
            owner,
            reason,
        } => tracing::warn!(
            request,
            pool = %pool_handle,
            pe = %pe_id,
            association = association.0,
            peer = ?peer.as_ref().map(|p| &p.addresses),
            port = peer.as_ref().map(|p| p.port),
            owner = owner.map(|o| o.0),
            reason = reason.label(),
            "refused: {reason}"
        ),
        RegistrarEvent::OwnershipProbe {
            pool_handle,
            pe_id,
            owner,
            claimant,
            peer,
        } => tracing::info!(
            pool = %pool_handle,
            pe = %pe_id,
            owner = owner.0,
            claimant = claimant.0,
            peer = ?peer.as_ref().map(|p| &p.addresses),
            port = peer.as_ref().map(|p| p.port),
            "another association claims the PE: probing its owner"
        ),
        RegistrarEvent::ClaimGranted {
            pool_handle,
            pe_id,
            association,
        } => tracing::info!(
            pool = %pool_handle,
            pe = %pe_id,
            association = association.0,
            "claim granted: the owner is gone or failed the probe"
        ),
        RegistrarEvent::UnreachableProbe {
            pool_handle,
            pe_id,
            reports,
        } => tracing::info!(
            pool = %pool_handle,
            pe = %pe_id,
            reports,
            "reported unreachable: probing the PE"
        ),
        RegistrarEvent::ProbeSuppressed { pool_handle, pe_id } => tracing::debug!(
            pool = %pool_handle,
            pe = %pe_id,
            "unreachable reports: probe budget of the PE spent, no probe sent"
        ),
    }
}
