//! What ENRP asks of the ASAP core: the changes to this registrar's own PEs (for
//! HANDLE_UPDATEs), PEs learned from peers, takeovers and the H=1 keep-alive. A child module of
//! `core`, so that the core's state stays private.

use super::*;

/// A change to a PE this registrar is home for, to be sent to every peer as an
/// ENRP_HANDLE_UPDATE (RFC 5353 §3.3.1).
#[derive(Debug, Clone, PartialEq)]
pub enum OwnChange {
    /// Registered or re-registered (ADD_PE).
    Added {
        /// Pool.
        pool_handle: PoolHandle,
        /// The PE as stored (home registrar and ASAP transport filled in).
        element: PoolElement,
    },
    /// Removed, whatever the cause (DEL_PE).
    Removed {
        /// Pool.
        pool_handle: PoolHandle,
        /// The PE as it was.
        element: PoolElement,
    },
}

/// Why a PE a peer announced was not taken into the handlespace.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LearnRefused {
    /// This registrar is the PE's home: a peer cannot claim it (RFC 5353 §3.3.2).
    #[error("the PE belongs to this registrar")]
    OwnedHere,
    /// The handlespace refused it (a limit, or the pool's policy or transport differs).
    #[error("{0}")]
    Handlespace(String),
}

impl Registrar {
    /// Starts keeping [`OwnChange`]s for [`Registrar::poll_own_change`]; ENRP calls it once.
    pub fn enable_handle_updates(&mut self) {
        self.own_changes.get_or_insert_with(VecDeque::new);
    }

    /// The next change to this registrar's own PEs, if any.
    pub fn poll_own_change(&mut self) -> Option<OwnChange> {
        self.own_changes.as_mut()?.pop_front()
    }

    pub(super) fn record_added(&mut self, pool_handle: &PoolHandle, element: &PoolElement) {
        if let Some(q) = self.own_changes.as_mut() {
            q.push_back(OwnChange::Added {
                pool_handle: pool_handle.clone(),
                element: element.clone(),
            });
        }
    }

    pub(super) fn record_removed(&mut self, pool_handle: &PoolHandle, removed: &RemovedElement) {
        if removed.element.home_registrar != self.id {
            return;
        }
        if let Some(q) = self.own_changes.as_mut() {
            q.push_back(OwnChange::Removed {
                pool_handle: pool_handle.clone(),
                element: removed.element.clone(),
            });
        }
    }

    /// Takes in a PE a peer announced (HANDLE_UPDATE ADD_PE or a HANDLE_TABLE_RESPONSE, RFC
    /// 5353 §3.3.2, §3.4): stored under its home registrar, without association, removed when
    /// its registration life runs out unless announced again. Returns whether it is new.
    pub fn learn(
        &mut self,
        now: Duration,
        pool_handle: &PoolHandle,
        element: PoolElement,
    ) -> Result<bool, LearnRefused> {
        if let Some(existing) = self.handlespace.find(pool_handle, element.id) {
            if existing.home_registrar() == self.id {
                return Err(LearnRefused::OwnedHere);
            }
        }
        let life = element.registration_life;
        let outcome = self
            .handlespace
            .register(pool_handle, element, None, now)
            .map_err(|e| LearnRefused::Handlespace(e.to_string()))?;
        let entry = outcome.entry();
        match life {
            RegistrationLife::Finite(life) => {
                let _ = self
                    .handlespace
                    .set_timer(entry, TimerKind::Expiry, now + life);
            }
            RegistrationLife::Infinite => {
                let _ = self.handlespace.cancel_timer(entry);
            }
        }
        self.update_gauges();
        Ok(outcome.is_new())
    }

    /// Removes a PE a peer announced as gone (HANDLE_UPDATE DEL_PE) or that a
    /// resynchronisation did not confirm. Refused for a PE this registrar is home for; `Ok(false)`
    /// when unknown.
    pub fn forget(
        &mut self,
        pool_handle: &PoolHandle,
        pe_id: PoolElementId,
    ) -> Result<bool, LearnRefused> {
        let Some(pe) = self.handlespace.find(pool_handle, pe_id) else {
            return Ok(false);
        };
        if pe.home_registrar() == self.id {
            return Err(LearnRefused::OwnedHere);
        }
        let entry = pe.entry_id();
        if let Ok((_, removed)) = self.handlespace.remove(entry) {
            self.encoded_pes.forget(removed.entry);
        }
        self.update_gauges();
        Ok(true)
    }

    /// Removes every PE of a peer (a dead peer nobody took over, when its PEs are dropped).
    pub fn forget_owned_by(&mut self, owner: RegistrarId) -> usize {
        if owner == self.id {
            return 0;
        }
        let removed = self.handlespace.remove_owned_by(owner);
        for (_, r) in &removed {
            self.encoded_pes.forget(r.entry);
        }
        self.update_gauges();
        removed.len()
    }

    /// Another registrar took `from`'s PEs over (ENRP_TAKEOVER_SERVER, RFC 5353 §3.5.2): they
    /// now belong to `to`. Never moves PEs to or from this registrar.
    pub fn hand_over(&mut self, from: RegistrarId, to: RegistrarId) -> usize {
        if from == self.id || to == self.id {
            return 0;
        }
        self.handlespace.take_over(from, to)
    }

    /// This registrar won the takeover of `dead` (RFC 5353 §3.5.2): its PEs become ours, and
    /// each gets an ENDPOINT_KEEP_ALIVE with H=1 (sent to its ASAP transport address when no
    /// association exists) so that it adopts this registrar as its home; one that does not
    /// answer within the keep-alive timeout is removed. Returns how many PEs were taken.
    pub fn take_over_from(&mut self, now: Duration, dead: RegistrarId) -> usize {
        if dead == self.id {
            return 0;
        }
        let entries: Vec<EntryId> = self
            .handlespace
            .owned_by(dead)
            .map(|pe| pe.entry_id())
            .collect();
        self.handlespace.take_over(dead, self.id);
        for &entry in &entries {
            self.send_home_keep_alive(now, entry);
        }
        self.update_gauges();
        entries.len()
    }

    /// Takes one PE over on a peer's suggestion (HANDLE_UPDATE with T=1,
    /// draft-dreibholz-rserpool-enrp-takeover).
    pub fn take_over_one(
        &mut self,
        now: Duration,
        pool_handle: &PoolHandle,
        pe_id: PoolElementId,
    ) -> bool {
        let Some(entry) = self.handlespace.entry_id(pool_handle, pe_id) else {
            return false;
        };
        if self.handlespace.set_home_registrar(entry, self.id).is_err() {
            return false;
        }
        self.send_home_keep_alive(now, entry);
        true
    }

    /// ENDPOINT_KEEP_ALIVE with H=1 ("adopt me as your home", RFC 5352 §2.2.7).
    fn send_home_keep_alive(&mut self, now: Duration, entry: EntryId) {
        let Some(pe) = self.handlespace.get(entry) else {
            return;
        };
        let pool_handle = pe.pool_handle().clone();
        let pe_id = pe.id();
        let destination = match pe.association() {
            Some(a) if self.associations.contains_key(&a) => Some(Destination::Association(a)),
            _ => pe.element().asap_transport.as_ref().and_then(|t| {
                t.addresses
                    .first()
                    .map(|ip| Destination::Address(SocketAddr::new(*ip, t.port)))
            }),
        };
        if let Some(destination) = destination {
            let m = AsapMessage::EndpointKeepAlive(asap::EndpointKeepAlive {
                home: true,
                server_id: self.id,
                pool_handle: pool_handle.clone(),
                pe_id: (self.config.profile == Profile::Rsplib).then_some(pe_id),
            });
            let codec = &self.codec;
            self.transmits
                .push(destination, |buf| codec.encode_into(&m, buf));
            self.metrics.keep_alives_sent += 1;
            self.events
                .push_back(RegistrarEvent::KeepAliveSent { pool_handle, pe_id });
        }
        // No answer in time removes the PE (and a DEL_PE goes to the peers).
        let _ = self.handlespace.set_timer(
            entry,
            TimerKind::KeepAliveTimeout,
            now + self.config.keep_alive_timeout,
        );
    }

    /// Whether the PE was taken over from a dead peer and has not answered yet (no
    /// association): its re-registration, which may come before its keep-alive answer, adopts
    /// this registrar too.
    pub(super) fn taken_over_unadopted(
        &self,
        pool_handle: &PoolHandle,
        pe_id: PoolElementId,
    ) -> bool {
        self.handlespace
            .find(pool_handle, pe_id)
            .is_some_and(|pe| pe.home_registrar() == self.id && pe.association().is_none())
    }

    /// A keep-alive answer over an association the PE was not registered over: accepted when
    /// the PE was taken over and the association reaches its ASAP transport (the one the H=1
    /// keep-alive opened), which then becomes the PE's association.
    pub(super) fn adopt_association(&mut self, entry: EntryId, association: AssociationId) -> bool {
        let Some(pe) = self.handlespace.get(entry) else {
            return false;
        };
        if pe.home_registrar() != self.id || pe.association().is_some() {
            return false;
        }
        let Some(peer) = self.associations.get(&association).map(|a| &a.peer) else {
            return false;
        };
        let reaches = pe.element().asap_transport.as_ref().is_some_and(|t| {
            t.port == peer.port && t.addresses.iter().any(|a| peer.addresses.contains(a))
        });
        let adopted = reaches
            && self
                .handlespace
                .set_association(entry, Some(association))
                .is_ok();
        if adopted {
            self.metrics.adopted += 1;
            if let Some(pe) = self.handlespace.get(entry) {
                self.events.push_back(RegistrarEvent::Adopted {
                    pool_handle: pe.pool_handle().clone(),
                    pe_id: pe.id(),
                    association,
                });
            }
        }
        adopted
    }
}
