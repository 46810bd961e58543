//! Takeover of a dead peer (RFC 5353 §3.5): INIT_TAKEOVER to every peer, arbitration between
//! registrars racing for the same target (per profile), INIT_TAKEOVER_ACK, TAKEOVER_SERVER,
//! then the H=1 keep-alive to each PE taken over (sent by the ASAP core).

use super::peers::PeerTimer;
use super::*;
use std::collections::BTreeSet;

/// One takeover this registrar runs.
#[derive(Debug)]
pub(super) struct Takeover {
    /// Peers whose INIT_TAKEOVER_ACK is still missing.
    pub awaiting: BTreeSet<RegistrarId>,
    /// When it is abandoned.
    pub expires: Duration,
}

impl Enrp {
    fn takeover_message(
        &self,
        kind: fn(enrp::Takeover) -> EnrpMessage,
        receiver: RegistrarId,
        target: RegistrarId,
    ) -> EnrpMessage {
        kind(enrp::Takeover {
            peers: self.ids(receiver),
            target,
        })
    }

    /// The peer did not answer: announce that we take it over (RFC 5353 §3.5.1).
    pub(super) fn start_takeover(
        &mut self,
        now: Duration,
        registrar: &mut Registrar,
        target: RegistrarId,
    ) {
        let awaiting: BTreeSet<RegistrarId> = self
            .peers
            .by_id
            .keys()
            .copied()
            .filter(|&id| id != target && id != self.id && id.0 != 0)
            .collect();
        let expires = now + self.config.takeover_expiry;
        if let Some(p) = self.peers.get_mut(target) {
            // Its own timer waits behind the takeover's.
            p.timer = (
                PeerTimer::NoResponse,
                expires + self.config.max_time_no_response,
            );
        }
        self.metrics.takeover(TakeoverOutcome::Started);
        self.events.push_back(EnrpEvent::TakeoverStarted {
            target,
            awaiting: awaiting.iter().copied().collect(),
        });
        // To every peer, the target included (it may refute).
        for id in self.peer_ids() {
            let m = self.takeover_message(EnrpMessage::InitTakeover, id, target);
            self.send_to_peer(id, &m);
        }
        let empty = awaiting.is_empty();
        self.takeovers
            .insert(target, Takeover { awaiting, expires });
        if empty {
            // Nobody else to ask (two registrars): RSPLIB never completes this case; we do.
            self.finish_takeover(now, registrar, target);
        }
    }

    /// INIT_TAKEOVER from a peer (RFC 5353 §3.5.1).
    pub(super) fn init_takeover(
        &mut self,
        now: Duration,
        registrar: &mut Registrar,
        source: Source,
        t: enrp::Takeover,
    ) {
        let sender = t.peers.sender;
        let target = t.target;
        if target == self.id {
            // We are alive: refute with PRESENCE to everyone (and the group).
            self.events
                .push_back(EnrpEvent::TakeoverOfUsRefuted { by: sender });
            self.send_presence_to_all(registrar, false);
            return;
        }
        if self.takeovers.contains_key(&target) {
            let sender_wins = match self.config.arbitration {
                Arbitration::LowerIdWins => sender < self.id,
                Arbitration::HigherIdWins => sender > self.id,
            };
            if !sender_wins {
                // Our takeover goes on; the sender will give way when it hears ours.
                return;
            }
            self.takeovers.remove(&target);
            self.metrics.takeover(TakeoverOutcome::Lost);
            self.events.push_back(EnrpEvent::TakeoverLost {
                target,
                winner: Some(sender),
            });
        }
        let deadline = now + self.config.max_time_no_response;
        if let Some(p) = self.peers.get_mut(target) {
            p.takeover_by = Some(sender);
            if p.timer.0 == PeerTimer::NoResponse {
                p.timer.1 = p.timer.1.max(deadline);
            }
        }
        let m = self.takeover_message(EnrpMessage::InitTakeoverAck, sender, target);
        if let Some(d) = self.reply_destination(source, sender) {
            self.send(d, &m);
        }
    }

    /// INIT_TAKEOVER_ACK: the last one completes our takeover.
    pub(super) fn init_takeover_ack(
        &mut self,
        now: Duration,
        registrar: &mut Registrar,
        _source: Source,
        t: enrp::Takeover,
    ) {
        let done = match self.takeovers.get_mut(&t.target) {
            Some(tk) => tk.awaiting.remove(&t.peers.sender) && tk.awaiting.is_empty(),
            None => false,
        };
        if done {
            self.finish_takeover(now, registrar, t.target);
        }
    }

    /// Every peer agreed (RFC 5353 §3.5.2): TAKEOVER_SERVER to all, the PEs become ours and
    /// each gets an H=1 keep-alive, the target leaves the peer table.
    pub(super) fn finish_takeover(
        &mut self,
        now: Duration,
        registrar: &mut Registrar,
        target: RegistrarId,
    ) {
        if self.takeovers.remove(&target).is_none() {
            return;
        }
        for id in self.peer_ids().into_iter().filter(|&id| id != target) {
            let m = self.takeover_message(EnrpMessage::TakeoverServer, id, target);
            self.send_to_peer(id, &m);
        }
        let pool_elements = registrar.take_over_from(now, target);
        self.metrics.takeover(TakeoverOutcome::Won);
        self.events.push_back(EnrpEvent::TakeoverWon {
            target,
            pool_elements,
        });
        self.remove_peer(now, registrar, target, "dead; taken over by this registrar");
    }

    /// TAKEOVER_SERVER: another registrar now owns the target's PEs.
    pub(super) fn takeover_server(
        &mut self,
        now: Duration,
        registrar: &mut Registrar,
        source: Source,
        t: enrp::Takeover,
    ) {
        let sender = t.peers.sender;
        let target = t.target;
        if !self.peers.contains(sender) {
            return self.ignore(source, "ENRP_TAKEOVER_SERVER", "sender is not a known peer");
        }
        if target == self.id {
            return self.ignore(
                source,
                "ENRP_TAKEOVER_SERVER",
                "names this registrar, which is alive",
            );
        }
        if self.takeovers.remove(&target).is_some() {
            self.metrics.takeover(TakeoverOutcome::Lost);
            self.events.push_back(EnrpEvent::TakeoverLost {
                target,
                winner: Some(sender),
            });
        }
        let pool_elements = registrar.hand_over(target, sender);
        self.events.push_back(EnrpEvent::TakenOver {
            target,
            by: sender,
            pool_elements,
        });
        self.remove_peer(
            now,
            registrar,
            target,
            "dead; taken over by another registrar",
        );
    }

    /// Not every peer acknowledged in time: abandon, and forget the peer (its PEs stay until
    /// their registration life runs out, as with RSPLIB).
    pub(super) fn takeover_expired(
        &mut self,
        now: Duration,
        registrar: &mut Registrar,
        target: RegistrarId,
    ) {
        let Some(t) = self.takeovers.remove(&target) else {
            return;
        };
        self.metrics.takeover(TakeoverOutcome::Abandoned);
        self.events.push_back(EnrpEvent::TakeoverAbandoned {
            target,
            missing: t.awaiting.into_iter().collect(),
        });
        self.remove_peer(now, registrar, target, "dead; takeover abandoned");
    }
}
