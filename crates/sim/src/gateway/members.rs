//! RSerPool members in the gateway world: the drivers' part for the registry's cores (their
//! messages carried in order, their timers run, resolutions handed to the gateway core) and
//! the invariants about which members new sessions may go to.

use super::*;

impl GatewayWorld {
    // ----- RSerPool members: the registrar, the PEs, the gateway's resolver -----

    /// One way on the registrar's network: 0.1–5 ms (reliable, as SCTP).
    pub(super) fn registry_hop(&mut self) -> Duration {
        Duration::from_micros(self.rng.random_range(100..5_000))
    }

    pub(super) fn registry_message(&mut self, m: Message) {
        let Some(reg) = self.registry.as_mut() else {
            return;
        };
        if !m.to_registrar {
            match reg.owner(m.association) {
                Some(Peer::Pe(i)) if self.members[i].state == MemberState::Paused => {
                    self.pe_inbox[i].push(m);
                    return;
                }
                Some(Peer::Resolver) if self.gw_state == GatewayState::Paused => {
                    self.deferred.push(Ev::Registry(m));
                    return;
                }
                _ => {}
            }
        }
        reg.deliver(self.now, &m);
    }

    /// The registrar crashes (all state lost) and restarts 1–20 s later. A crash is not a
    /// removal: the members' listing is not judged while it is down, and a PE the new
    /// registrar does not list (yet) is unlisted from its restart on.
    pub(super) fn registrar_fault(&mut self) {
        let f = self.exp(self.cfg.registrar_fault_interval);
        self.schedule(self.now + f, Ev::RegistrarFault);
        let Some(reg) = self.registry.as_mut().filter(|r| r.registrar_up()) else {
            return;
        };
        reg.crash_registrar(self.now);
        self.stats.gw_registrar_crashes += 1;
        self.hash(23, 0);
        self.note(|| "CRASH registrar".to_string());
        for i in 0..self.members.len() {
            self.registrar_lists[i] = false;
            self.unlisted_since[i] = None;
            self.member_changed[i] = self.now;
        }
        let back = Duration::from_millis(self.rng.random_range(1_000..20_000));
        self.schedule(self.now + back, Ev::RegistrarRestart);
    }

    pub(super) fn registrar_restart(&mut self) {
        let Some(reg) = self.registry.as_mut().filter(|r| !r.registrar_up()) else {
            return;
        };
        reg.restart_registrar(self.now);
        self.hash(24, 0);
        self.note(|| "RESTART registrar".to_string());
        for t in &mut self.unlisted_since {
            *t = Some(self.now);
        }
    }

    pub(super) fn rejoin(&mut self, i: usize, inc: u32) {
        if self.members[i].inc != inc || self.registry.as_ref().is_none_or(|r| r.has_pe(i)) {
            return;
        }
        if self.members[i].state != MemberState::Up {
            // A paused PE rejoins when it runs again.
            self.schedule(self.now + Duration::from_secs(1), Ev::Rejoin(i, inc));
            return;
        }
        self.hash(21, i as u64);
        self.note(|| format!("REJOIN member {i}"));
        if let Some(reg) = self.registry.as_mut() {
            reg.start_pe(self.now, i, &mut self.rng);
        }
    }

    /// Runs the registry's drivers' part: carries what its cores send, hands resolutions to
    /// the gateway core as member updates, follows what the registrar lists, arms its timer.
    pub(super) fn pump_registry(&mut self) {
        let Some(reg) = self.registry.as_mut() else {
            return;
        };
        let out = reg.pump(self.now);
        let tracking = reg.registrar_up();
        let listed: Vec<bool> = (0..self.members.len()).map(|i| reg.listed(i)).collect();
        for n in out.notes {
            self.note(|| n);
        }
        for m in out.messages {
            let d = self.registry_hop();
            let key = (m.association, m.to_registrar);
            let last = self.association_last.get(&key).copied().unwrap_or_default();
            let at = (self.now + d).max(last + Duration::from_nanos(1));
            self.association_last.insert(key, at);
            self.schedule(at, Ev::Registry(m));
        }
        self.stats.gw_resolutions += out.resolutions;
        for u in out.updates {
            match u {
                SourceUpdate::Members(mut specs) => {
                    self.last_listed = (0..self.members.len())
                        .filter(|&i| {
                            let key = format!("pe:{}", Registry::pe_id(i));
                            specs.iter().any(|s| s.key == key)
                        })
                        .collect();
                    self.hash(22, self.last_listed.iter().fold(0, |m, i| m | 1 << i));
                    if self.cfg.mutation == Some(Mutation::GatewaySourceOnlyAdds) {
                        // The defect: a member source that never lets a member go.
                        for old in std::mem::take(&mut self.source_members) {
                            if specs.iter().all(|s| s.key != old.key) {
                                specs.push(old);
                            }
                        }
                        self.source_members = specs.clone();
                    }
                    self.core.set_members(self.now, specs);
                }
                SourceUpdate::Evidence { key, registered } => {
                    self.core.source_evidence(self.now, &key, registered);
                }
            }
            self.learn_member_ids();
        }
        for (i, l) in listed.into_iter().enumerate().filter(|_| tracking) {
            if l != self.registrar_lists[i] {
                self.registrar_lists[i] = l;
                self.member_changed[i] = self.now;
                self.unlisted_since[i] = (!l).then_some(self.now);
            }
        }
        let members = &self.members;
        let gateway_runs = self.gw_state == GatewayState::Up;
        let next = self
            .registry
            .as_ref()
            .and_then(|r| r.next_timer(|i| members[i].state == MemberState::Up, gateway_runs));
        if let Some(t) = next {
            if self.registry_timer_at != Some(t) {
                self.registry_timer_at = Some(t);
                self.schedule(t, Ev::RegistryTimer);
            }
        }
    }

    /// A new session went to member host `i` (RSerPool members): the gateway's last
    /// resolution listed it (`gateway_binds_listed`), and if the registrar stopped listing it,
    /// not longer ago than a refresh interval and a bound (`gateway_unlisted_unused`).
    pub(super) fn check_listed(&mut self, id: SessionId, i: usize) {
        if self.registry.is_none() {
            return;
        }
        self.stats.checks += 1;
        if !self.last_listed.contains(&i) {
            let msg = format!(
                "{id} bound to member {i}, which the last resolution of incarnation {} did not list (it listed {:?})",
                self.gw, self.last_listed
            );
            self.fail("gateway_binds_listed", msg);
            return;
        }
        if let Some(t) = self.unlisted_since[i] {
            let bound = self.cfg.refresh + LISTING_BOUND;
            let ran = self.gw_state == GatewayState::Up && self.gw_back_at.is_none_or(|b| b <= t);
            if ran && self.now > t + bound {
                let msg = format!(
                    "{id} bound to member {i}, which the registrar has not listed since {t:?} (refresh {:?} + {LISTING_BOUND:?})",
                    self.cfg.refresh
                );
                self.fail("gateway_unlisted_unused", msg);
            }
        }
    }
}
