//! PRESENCE (RFC 5353 §2.2.1, §3.2, §3.5): heartbeats, new peers, mentor choice, the audit
//! trigger, dead-peer detection; LIST_REQUEST and LIST_RESPONSE (§3.2.1).

use super::peers::{Peer, PeerTimer};
use super::*;
use rserpool_wire::PeChecksum;

impl Enrp {
    pub(super) fn send_presence_to(
        &mut self,
        registrar: &Registrar,
        destination: EnrpDestination,
        receiver: RegistrarId,
        reply_required: bool,
    ) {
        let m = EnrpMessage::Presence(enrp::Presence {
            peers: self.ids(receiver),
            reply_required,
            checksum: registrar.handlespace().checksum(self.id),
            server_information: self.server_information(),
        });
        self.send(destination, &m);
    }

    /// PRESENCE to every peer, to the static peers not heard from yet, and to the multicast
    /// group when announcing (RFC 5353 §3.2: every PEER-HEARTBEAT-CYCLE).
    pub(super) fn send_presence_to_all(&mut self, registrar: &Registrar, reply_required: bool) {
        for id in self.peer_ids() {
            if let Some(d) = self.destination_of(id) {
                self.send_presence_to(registrar, d, id, reply_required);
            }
        }
        let unheard: Vec<Vec<SocketAddr>> = self
            .statics
            .iter()
            .filter(|s| s.id.is_none_or(|id| !self.peers.contains(id)))
            .filter(|s| !self.peers.knows_address(&s.addresses))
            .map(|s| s.addresses.clone())
            .collect();
        for addresses in unheard {
            self.send_presence_to(
                registrar,
                EnrpDestination::Addresses(addresses),
                RegistrarId(0),
                reply_required,
            );
        }
        if self.config.multicast {
            self.send_presence_to(registrar, EnrpDestination::Multicast, RegistrarId(0), false);
        }
    }

    /// The addresses a peer is reached at: those of its Server Information (RSPLIB keeps only
    /// those the association also has, when it knows them), at its port.
    fn peer_addresses(info: Option<&ServerInformation>) -> Vec<SocketAddr> {
        info.map(|i| {
            i.transport
                .addresses
                .iter()
                .filter(|a| !a.is_unspecified())
                .map(|a| SocketAddr::new(*a, i.transport.port))
                .collect()
        })
        .unwrap_or_default()
    }

    /// Adds a peer; returns false at the peer limit (reported).
    pub(super) fn add_peer(
        &mut self,
        now: Duration,
        id: RegistrarId,
        addresses: Vec<SocketAddr>,
        association: Option<AssociationId>,
    ) -> bool {
        if self.peers.len() >= self.config.max_peers {
            self.metrics.limits_hit += 1;
            self.events.push_back(EnrpEvent::LimitReached {
                what: "peers (max_peers)",
                peer: id,
            });
            return false;
        }
        if let Some(s) = self
            .statics
            .iter_mut()
            .find(|s| s.addresses.iter().any(|a| addresses.contains(a)))
        {
            s.id = Some(id);
        }
        self.peers.by_id.insert(
            id,
            Peer {
                addresses: addresses.clone(),
                association,
                timer: (PeerTimer::LastHeard, now + self.config.max_time_last_heard),
                announced_checksum: PeChecksum(0xffff),
                takeover_by: None,
                download: None,
                cursor: None,
                list_requested: false,
            },
        );
        self.events.push_back(EnrpEvent::PeerUp {
            peer: id,
            addresses,
        });
        true
    }

    /// RFC 5353 §3.2, §3.5; RSPLIB's order of steps (docs/enrp.md).
    pub(super) fn presence(
        &mut self,
        now: Duration,
        registrar: &mut Registrar,
        source: Source,
        p: enrp::Presence,
    ) {
        let sender = p.peers.sender;
        let association = match source {
            Source::Association(a) => Some(a),
            Source::Multicast => None,
        };
        let addresses = Self::peer_addresses(p.server_information.as_ref());
        let new = !self.peers.contains(sender);
        if new {
            if association.is_none() && addresses.is_empty() {
                return self.ignore(
                    source,
                    "ENRP_PRESENCE",
                    "multicast PRESENCE without Server Information",
                );
            }
            if !self.add_peer(now, sender, addresses.clone(), association) {
                return;
            }
        } else if let Some(peer) = self.peers.get_mut(sender) {
            if !addresses.is_empty() {
                peer.addresses = addresses;
            }
        }
        // Any PRESENCE of a peer cancels what we believed about its death (RFC 5353 §3.5.1).
        let refuted = self.takeovers.remove(&sender).is_some();
        if refuted {
            self.metrics.takeover(TakeoverOutcome::Refuted);
            self.events
                .push_back(EnrpEvent::TakeoverRefuted { target: sender });
        }
        let audit_allowed = association.is_some();
        let mentor_wanted = self.startup_until.is_some() && self.mentor.is_none();
        let deadline = now + self.config.max_time_last_heard;
        let ours_for_sender = registrar.handlespace().checksum(sender);
        // A download that stalled longer than a peer may be silent is started anew.
        let stall = self.config.max_time_last_heard + self.config.max_time_no_response;
        let Some(peer) = self.peers.get_mut(sender) else {
            return;
        };
        peer.takeover_by = None;
        peer.timer = (PeerTimer::LastHeard, deadline);
        peer.announced_checksum = p.checksum;
        let list_needed = !peer.list_requested;
        peer.list_requested = true;
        let syncing = peer
            .download
            .as_ref()
            .is_some_and(|d| now.saturating_sub(d.requested_at) < stall);
        if new {
            // A new peer gets our PRESENCE with R=1 (RSPLIB), unless it asked for one anyway.
            if !p.reply_required {
                if let Some(d) = self.reply_destination(source, sender) {
                    self.send_presence_to(registrar, d, sender, true);
                }
            }
        }
        if mentor_wanted {
            // RFC 5353 §3.2.1: the first peer heard from is the mentor; its whole table (W=0).
            self.mentor = Some(sender);
            self.start_download(now, registrar, sender, false, true, "mentor");
        } else if audit_allowed && !syncing && p.checksum != ours_for_sender {
            // RFC 5353 §3.6.3: a checksum mismatch resynchronises that peer's PEs (W=1).
            self.metrics.audit_mismatches += 1;
            self.start_download(now, registrar, sender, true, false, "checksum mismatch");
        }
        if list_needed {
            let m = EnrpMessage::ListRequest(enrp::ListRequest {
                peers: self.ids(sender),
            });
            if let Some(d) = self.reply_destination(source, sender) {
                self.send(d, &m);
            }
        }
        if p.reply_required {
            if let Some(d) = self.reply_destination(source, sender) {
                self.send_presence_to(registrar, d, sender, false);
            }
        }
    }

    /// A peer's timer fired (RFC 5353 §3.5).
    pub(super) fn peer_timer(
        &mut self,
        now: Duration,
        registrar: &mut Registrar,
        id: RegistrarId,
        timer: PeerTimer,
    ) {
        match timer {
            PeerTimer::LastHeard => {
                // Silent for MAX-TIME-LAST-HEARD: ask it to answer (R=1).
                let deadline = now + self.config.max_time_no_response;
                if let Some(p) = self.peers.get_mut(id) {
                    p.timer = (PeerTimer::NoResponse, deadline);
                }
                if let Some(d) = self.destination_of(id) {
                    self.send_presence_to(registrar, d, id, true);
                }
                self.events.push_back(EnrpEvent::PeerSilent { peer: id });
            }
            PeerTimer::NoResponse => {
                self.metrics.peers_dead += 1;
                let someone_else = self.peers.by_id.get(&id).and_then(|p| p.takeover_by);
                if someone_else.is_some() {
                    // Another registrar announced the takeover: leave it to it.
                    self.remove_peer(now, registrar, id, "dead; taken over by another registrar");
                } else if registrar.handlespace().owned_count(id) == 0 {
                    self.remove_peer(now, registrar, id, "dead; no PEs to take over");
                } else {
                    self.start_takeover(now, registrar, id);
                }
            }
        }
    }

    /// LIST_REQUEST: our peers (RSPLIB answers everyone, never with R).
    pub(super) fn list_request(&mut self, source: Source, r: enrp::ListRequest) {
        let sender = r.peers.sender;
        let mut servers: Vec<ServerInformation> = self
            .peers
            .by_id
            .iter()
            .filter(|(id, p)| **id != sender && !p.addresses.is_empty())
            .map(|(id, p)| ServerInformation {
                server_id: *id,
                transport: transport_of(&p.addresses, self.local.as_ref()),
            })
            .collect();
        if let Some(me) = self.server_information() {
            servers.push(me);
        }
        let m = EnrpMessage::ListResponse(enrp::ListResponse {
            peers: self.ids(sender),
            reject: false,
            servers,
        });
        if let Some(d) = self.reply_destination(source, sender) {
            self.send(d, &m);
        }
    }

    /// LIST_RESPONSE: every listed registrar not known yet becomes a peer and gets a PRESENCE
    /// with R=1.
    pub(super) fn list_response(
        &mut self,
        now: Duration,
        registrar: &mut Registrar,
        r: enrp::ListResponse,
    ) {
        if !self.peers.contains(r.peers.sender) || r.reject {
            return;
        }
        for info in r.servers {
            let id = info.server_id;
            if id.0 == 0 || id == self.id || self.peers.contains(id) {
                continue;
            }
            let addresses = Self::peer_addresses(Some(&info));
            if addresses.is_empty() || !self.add_peer(now, id, addresses.clone(), None) {
                continue;
            }
            self.send_presence_to(registrar, EnrpDestination::Addresses(addresses), id, true);
        }
    }
}

/// A Server Information transport for a peer known by its socket addresses, with our
/// transport's protocol.
fn transport_of(addresses: &[SocketAddr], local: Option<&TransportAddress>) -> TransportAddress {
    let port = addresses.first().map_or(0, |a| a.port());
    let ips: Vec<_> = addresses.iter().map(|a| a.ip()).collect();
    match local.map(|l| l.protocol) {
        // The TCP mapping's transport parameter carries exactly one address.
        Some(rserpool_wire::TransportProtocol::Tcp) if !ips.is_empty() => {
            TransportAddress::tcp(port, ips[0])
        }
        _ => TransportAddress::sctp(port, rserpool_wire::TransportUse::DataOnly, ips),
    }
}
