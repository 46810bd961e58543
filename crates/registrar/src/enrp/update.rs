//! HANDLE_UPDATE (RFC 5353 §3.3): our changes to every peer, and peers' changes into our
//! handlespace; the takeover suggestion of draft-dreibholz-rserpool-enrp-takeover behind a
//! setting.

use super::*;
use crate::core::{LearnRefused, OwnChange};
use rserpool_wire::enrp::UpdateAction;

impl Enrp {
    /// ADD_PE or DEL_PE for one of our PEs, to every peer (RFC 5353 §3.3.1).
    pub(super) fn send_own_change(&mut self, change: OwnChange) {
        let (action, pool_handle, element) = match change {
            OwnChange::Added {
                pool_handle,
                element,
            } => (UpdateAction::AddPe, pool_handle, element),
            OwnChange::Removed {
                pool_handle,
                element,
            } => (UpdateAction::DelPe, pool_handle, element),
        };
        let update = |receiver: RegistrarId, takeover_suggested: bool| {
            EnrpMessage::HandleUpdate(enrp::HandleUpdate {
                peers: Ids {
                    sender: self.id,
                    receiver,
                },
                takeover_suggested,
                action,
                pool_handle: pool_handle.clone(),
                pool_element: element.clone(),
            })
        };
        let messages: Vec<(RegistrarId, EnrpMessage)> = self
            .peers
            .by_id
            .keys()
            .map(|&id| (id, update(id, false)))
            .collect();
        // The suggestion goes to the peer with the largest (peer ID XOR PE ID), if it beats
        // ours (RSPLIB's choice).
        let suggestion = (self.config.takeover_suggestion && action == UpdateAction::AddPe)
            .then(|| {
                self.peers
                    .by_id
                    .keys()
                    .copied()
                    .max_by_key(|id| id.0 ^ element.id.0)
                    .filter(|id| id.0 ^ element.id.0 > self.id.0 ^ element.id.0)
            })
            .flatten()
            .map(|id| (id, update(id, true)));
        for (id, m) in messages.into_iter().chain(suggestion) {
            self.send_to_peer(id, &m);
        }
    }

    /// A peer's update (RFC 5353 §3.3.2). Updates from registrars not in the peer table are
    /// ignored; an update claiming a PE we are home for is refused and logged.
    pub(super) fn handle_update(
        &mut self,
        now: Duration,
        registrar: &mut Registrar,
        source: Source,
        u: enrp::HandleUpdate,
    ) {
        let sender = u.peers.sender;
        if !self.peers.contains(sender) {
            return self.ignore(source, "ENRP_HANDLE_UPDATE", "sender is not a known peer");
        }
        let mut pe = u.pool_element;
        if pe.home_registrar.0 == 0 {
            pe.home_registrar = sender;
        }
        let pe_id = pe.id;
        if let Some(d) = self.peers.get_mut(sender).and_then(|p| p.download.as_mut()) {
            d.marked.remove(&(u.pool_handle.clone(), pe_id));
        }
        match u.action {
            UpdateAction::AddPe => {
                if pe.home_registrar == self.id {
                    self.refuse(
                        sender,
                        &u.pool_handle,
                        pe_id,
                        "names this registrar as home",
                    );
                    return;
                }
                if self.learn(now, registrar, sender, &u.pool_handle, pe)
                    && u.takeover_suggested
                    && self.config.takeover_suggestion
                {
                    registrar.take_over_one(now, &u.pool_handle, pe_id);
                }
            }
            UpdateAction::DelPe => match registrar.forget(&u.pool_handle, pe_id) {
                Ok(true) => self.metrics.pool_elements_dropped += 1,
                Ok(false) => {}
                Err(e @ LearnRefused::OwnedHere) | Err(e @ LearnRefused::Handlespace(_)) => {
                    self.refuse(sender, &u.pool_handle, pe_id, &e.to_string())
                }
            },
        }
    }

    fn refuse(
        &mut self,
        peer: RegistrarId,
        pool_handle: &PoolHandle,
        pe_id: PoolElementId,
        why: &str,
    ) {
        self.metrics.updates_refused += 1;
        self.events.push_back(EnrpEvent::UpdateRefused {
            peer,
            pool_handle: pool_handle.clone(),
            pe_id,
            reason: why.to_string(),
        });
    }
}
