//! The tokio side of ENRP: the ENRP endpoint (kernel SCTP or the TCP mapping, PPID 12), the
//! multicast PRESENCE socket, associations opened to peers on demand, and the logs of every
//! ENRP event. The driver calls it from its loop.

use super::{Enrp, EnrpConfig, EnrpDestination, EnrpEvent, Source};
use crate::core::Registrar;
use crate::outbox::Outbox;
use rserpool_handlespace::AssociationId;
use rserpool_transport::multicast::{Interface, MulticastConfig, MulticastSocket};
use rserpool_transport::{
    Endpoint, EndpointConfig, EndpointHandle, Event, TransportError, TransportKind,
};
use rserpool_wire::{Protocol, TransportAddress, TransportProtocol, TransportUse};
use std::collections::{HashMap, HashSet};
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

/// Where and how ENRP runs.
#[derive(Debug, Clone)]
pub struct EnrpDriverConfig {
    /// The core's settings.
    pub core: EnrpConfig,
    /// ENRP listening addresses (one port).
    pub listen: Vec<SocketAddr>,
    /// The multicast group for PRESENCE; `None` turns multicast off.
    pub announce: Option<SocketAddr>,
    /// Interface (IPv4 address) for the multicast group.
    pub announce_interface: Option<std::net::Ipv4Addr>,
    /// Multicast TTL.
    pub announce_ttl: u32,
}

/// Something for the ENRP side to handle.
pub(crate) enum Input {
    Transport(Event),
    Multicast(std::io::Result<rserpool_transport::multicast::Datagram>),
}

/// The ENRP side of a running registrar.
pub(crate) struct EnrpSide {
    pub core: Enrp,
    endpoint: Endpoint,
    handle: EndpointHandle,
    multicast: Option<MulticastSocket>,
    outbox: Outbox,
    /// Associations we opened, by the addresses they were opened to.
    opened: HashMap<Vec<SocketAddr>, AssociationId>,
    /// ASAP associations opened for H=1 keep-alives, by PE address.
    asap_opened: HashMap<SocketAddr, AssociationId>,
    /// Associations whose peer the TLS identity rules refuse as an ENRP peer: nothing from them
    /// reaches the core, and they are closed at the next flush.
    refused: HashSet<rserpool_transport::AssociationId>,
    /// Refused associations not closed yet.
    to_close: Vec<rserpool_transport::AssociationId>,
    pub local: Vec<SocketAddr>,
}

/// An address peers can reach a wildcard-bound endpoint at: the one the system routes from.
fn routable_address() -> IpAddr {
    std::net::UdpSocket::bind("0.0.0.0:0")
        .and_then(|s| {
            s.connect("192.0.2.1:9")?;
            s.local_addr()
        })
        .map(|a| a.ip())
        .unwrap_or(IpAddr::from([127, 0, 0, 1]))
}

impl EnrpSide {
    /// Binds the ENRP endpoint and the multicast socket, and starts the core.
    pub(crate) async fn bind(
        config: EnrpDriverConfig,
        endpoint_config: &EndpointConfig,
        registrar: &mut Registrar,
        now: Duration,
    ) -> Result<EnrpSide, TransportError> {
        let mut ep = endpoint_config.clone();
        ep.local_addrs = config.listen.clone();
        ep.accept = true;
        ep.tcp.plain_asap_listen = Vec::new();
        ep.limits.max_associations = config.core.max_peers * 2 + 16;
        let endpoint = Endpoint::bind(ep).await?;
        let handle = endpoint.handle();
        let local = endpoint.local_addrs().to_vec();
        let mut core_config = config.core.clone();
        core_config.multicast = config.announce.is_some();
        let mut core = Enrp::new(core_config, registrar, now);
        let port = local.first().map_or(0, |a| a.port());
        let mut ips: Vec<IpAddr> = local.iter().map(|a| a.ip()).collect();
        if ips.iter().any(|a| a.is_unspecified()) {
            ips = vec![routable_address()];
        }
        let transport = match endpoint.kind() {
            TransportKind::Sctp => TransportAddress::sctp(port, TransportUse::DataOnly, ips),
            TransportKind::Tcp => TransportAddress {
                protocol: TransportProtocol::Tcp,
                port,
                transport_use: TransportUse::DataOnly,
                addresses: ips.into_iter().take(1).collect(),
            },
        };
        core.set_local_transport(registrar, transport);
        let multicast = match config.announce {
            Some(group) => Some(MulticastSocket::open(&MulticastConfig {
                group,
                interfaces: vec![config
                    .announce_interface
                    .map(Interface::V4)
                    .unwrap_or(Interface::Default)],
                ttl: config.announce_ttl,
                loopback: true,
                max_datagram: 65_535,
            })?),
            None => None,
        };
        tracing::info!(
            registrar = %core.id(),
            transport = %endpoint.kind(),
            enrp = ?local,
            multicast = ?config.announce,
            static_peers = ?config.core.static_peers,
            profile = config.core.profile.name(),
            "ENRP serving"
        );
        Ok(EnrpSide {
            core,
            endpoint,
            handle,
            multicast,
            outbox: Outbox::new(4096),
            opened: HashMap::new(),
            asap_opened: HashMap::new(),
            refused: HashSet::new(),
            to_close: Vec::new(),
            local,
        })
    }

    /// The next thing to handle.
    pub(crate) async fn next(&mut self) -> Option<Input> {
        match &self.multicast {
            Some(m) => tokio::select! {
                e = self.endpoint.next_event() => e.map(Input::Transport),
                d = m.recv() => Some(Input::Multicast(d)),
            },
            None => self.endpoint.next_event().await.map(Input::Transport),
        }
    }

    pub(crate) fn on_input(&mut self, registrar: &mut Registrar, now: Duration, input: Input) {
        match input {
            Input::Transport(Event::Message { id, .. }) if self.refused.contains(&id) => {}
            Input::Transport(Event::Message { id, ppid, data, .. }) => {
                if ppid != Protocol::Enrp.ppid() {
                    tracing::debug!(
                        association = id.0,
                        ppid,
                        "non-ENRP payload on the ENRP endpoint ignored"
                    );
                    return;
                }
                self.core
                    .message(now, registrar, Source::Association(id), &data);
            }
            Input::Transport(Event::AssociationDown { id, reason }) => {
                tracing::debug!(association = id.0, %reason, "ENRP association down");
                if self.refused.remove(&id) {
                    return;
                }
                let a = id;
                self.outbox.forget(a);
                self.opened.retain(|_, v| *v != a);
                self.core.association_down(now, registrar, a);
            }
            Input::Transport(Event::AssociationUp {
                id,
                peer_addrs,
                inbound,
                peer_identity,
                ..
            }) => {
                tracing::debug!(association = id.0, peer = ?peer_addrs, inbound, "ENRP association up");
                // RFC 5355 §3.5: only registrars whose certificate the rules allow join.
                if registrar.check_enrp_identity(id, peer_identity).is_err() {
                    self.refused.insert(id);
                    self.to_close.push(id);
                }
            }
            Input::Transport(_) => {}
            Input::Multicast(Ok(d)) => {
                self.core
                    .message(now, registrar, Source::Multicast, &d.data)
            }
            Input::Multicast(Err(e)) => tracing::debug!(error = %e, "ENRP multicast receive"),
        }
    }

    /// An ASAP association went down: forget it as an H=1 keep-alive path.
    pub(crate) fn asap_association_down(&mut self, a: AssociationId) {
        self.asap_opened.retain(|_, v| *v != a);
    }

    /// Opens (or reuses) an ASAP association to a PE's address for the H=1 keep-alive.
    pub(crate) async fn asap_association(
        &mut self,
        asap: &EndpointHandle,
        addr: SocketAddr,
    ) -> Option<AssociationId> {
        if let Some(a) = self.asap_opened.get(&addr) {
            return Some(*a);
        }
        match asap.connect(&[addr]).await {
            Ok(id) => {
                let a = id;
                self.asap_opened.insert(addr, a);
                Some(a)
            }
            Err(e) => {
                tracing::warn!(pe = %addr, error = %e, "cannot reach a PE taken over");
                None
            }
        }
    }

    /// Sends what the core queued and logs its events.
    pub(crate) async fn flush(&mut self) {
        while let Some(t) = self.core.poll_transmit() {
            let bytes = bytes::Bytes::from(t.bytes);
            match t.destination {
                EnrpDestination::Association(a) => {
                    self.outbox.push(a, Protocol::Enrp.ppid(), bytes)
                }
                EnrpDestination::Addresses(addrs) => {
                    let a = match self.opened.get(&addrs) {
                        Some(a) => *a,
                        None => match self.handle.connect(&addrs).await {
                            Ok(id) => {
                                let a = id;
                                self.opened.insert(addrs.clone(), a);
                                a
                            }
                            Err(e) => {
                                tracing::debug!(peer = ?addrs, error = %e, "cannot reach ENRP peer");
                                continue;
                            }
                        },
                    };
                    self.outbox.push(a, Protocol::Enrp.ppid(), bytes);
                }
                EnrpDestination::Multicast => {
                    if let Some(m) = &self.multicast {
                        if let Err(e) = m.send(&bytes).await {
                            tracing::debug!(error = %e, "cannot send ENRP multicast PRESENCE");
                        }
                    }
                }
            }
        }
        self.outbox.send(&self.handle).await;
        for id in std::mem::take(&mut self.to_close) {
            let _ = self.handle.close(id).await;
        }
        while let Some(e) = self.core.poll_event() {
            log_event(&e);
        }
    }

    pub(crate) fn shutdown(&mut self) {
        self.endpoint.shutdown();
    }
}

fn log_event(e: &EnrpEvent) {
    match e {
        EnrpEvent::PeerUp { peer, addresses } => {
            tracing::info!(peer = %peer, addresses = ?addresses, "ENRP peer up")
        }
        EnrpEvent::PeerDown { peer, reason } => {
            tracing::info!(peer = %peer, reason, "ENRP peer down")
        }
        EnrpEvent::PeerSilent { peer } => {
            tracing::info!(peer = %peer, "ENRP peer silent: PRESENCE with R=1 sent")
        }
        EnrpEvent::StartupDone { mentor } => match mentor {
            Some(m) => tracing::info!(mentor = %m, "ENRP start-up done: initialised from mentor"),
            None => tracing::info!("ENRP start-up done: no mentor"),
        },
        EnrpEvent::SyncStarted {
            peer,
            own_children_only,
            reason,
        } => {
            tracing::info!(peer = %peer, w = own_children_only, reason, "handle table sync started")
        }
        EnrpEvent::SyncDone {
            peer,
            received,
            dropped,
            rejected,
        } => tracing::info!(peer = %peer, received, dropped, rejected, "handle table sync done"),
        EnrpEvent::UpdateRefused {
            peer,
            pool_handle,
            pe_id,
            reason,
        } => {
            tracing::warn!(peer = %peer, pool = %pool_handle, pe = %pe_id, %reason, "ENRP update refused")
        }
        EnrpEvent::LimitReached { what, peer } => {
            tracing::warn!(peer = %peer, limit = what, "ENRP limit reached")
        }
        EnrpEvent::TakeoverStarted { target, awaiting } => {
            tracing::info!(target = %target, awaiting = ?awaiting, "takeover started")
        }
        EnrpEvent::TakeoverWon {
            target,
            pool_elements,
        } => tracing::info!(target = %target, pool_elements, "takeover won"),
        EnrpEvent::TakeoverLost { target, winner } => {
            tracing::info!(target = %target, winner = ?winner, "takeover lost")
        }
        EnrpEvent::TakeoverAbandoned { target, missing } => {
            tracing::warn!(target = %target, missing = ?missing, "takeover abandoned")
        }
        EnrpEvent::TakeoverRefuted { target } => {
            tracing::info!(target = %target, "takeover refuted: the peer is alive")
        }
        EnrpEvent::TakenOver {
            target,
            by,
            pool_elements,
        } => {
            tracing::info!(target = %target, by = %by, pool_elements, "peer taken over by another registrar")
        }
        EnrpEvent::TakeoverOfUsRefuted { by } => {
            tracing::warn!(by = %by, "a peer tried to take this registrar over: refuted")
        }
        EnrpEvent::Malformed {
            source,
            error,
            answered,
        } => tracing::warn!(source = ?source, %error, answered, "malformed ENRP message"),
        EnrpEvent::Ignored {
            source,
            message,
            reason,
        } => tracing::debug!(source = ?source, message, reason, "ENRP message ignored"),
        EnrpEvent::ErrorReceived { peer, error } => {
            tracing::warn!(peer = %peer, error = ?error, "ENRP_ERROR received")
        }
    }
}
