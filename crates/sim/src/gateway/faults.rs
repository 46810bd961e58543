//! Faults of the gateway world: members crash, restart, pause and are cut off from the gateway;
//! the gateway itself crashes (a new incarnation restarts) and pauses; clients are cut off.

use super::*;

impl GatewayWorld {
    // ----- Faults -----

    pub(super) fn fault(&mut self) {
        let f = self.exp(self.cfg.fault_interval);
        self.schedule(self.now + f, Ev::Fault);
        let up: Vec<usize> = (0..self.members.len())
            .filter(|&i| self.members[i].state == MemberState::Up)
            .collect();
        if up.is_empty() {
            return;
        }
        if self.cfg.partitions && self.partition.is_none() && self.rng.random_bool(0.3) {
            self.cut_off();
            return;
        }
        let i = up[self.rng.random_range(0..up.len())];
        if self.cfg.churn && self.registry.is_some() && self.rng.random_bool(0.25) {
            let now = self.now;
            if self
                .registry
                .as_mut()
                .is_some_and(|r| r.deregister_pe(now, i))
            {
                let back = Duration::from_millis(self.rng.random_range(5_000..40_000));
                self.stats.departures += 1;
                self.hash(20, i as u64);
                self.note(|| {
                    format!("LEAVE member {i} (its PE deregisters; the service stays up)")
                });
                let inc = self.members[i].inc;
                self.schedule(now + back, Ev::Rejoin(i, inc));
                return;
            }
        }
        if self.cfg.pauses && self.rng.random_bool(0.3) {
            let d = Duration::from_millis(self.rng.random_range(1_000..30_000));
            self.members[i].state = MemberState::Paused;
            self.member_changed[i] = self.now;
            self.stats.pauses += 1;
            self.hash(8, i as u64);
            self.note(|| format!("PAUSE member {i} for {:.3} s", d.as_secs_f64()));
            self.schedule(self.now + d, Ev::Resume(i));
            return;
        }
        let host = self.rng.random_bool(0.5);
        self.stats.crashes += 1;
        self.hash(9, i as u64);
        self.note(|| {
            format!(
                "CRASH member {i} ({})",
                if host { "host" } else { "process" }
            )
        });
        self.member_changed[i] = self.now;
        let m = &mut self.members[i];
        m.state = if host {
            MemberState::HostDown
        } else {
            MemberState::ProcessDown
        };
        m.inc += 1;
        let inc = m.inc;
        self.owed.remove(&i);
        let now = self.now;
        self.pe_inbox[i].clear();
        if let Some(a) = self.registry.as_mut().and_then(|r| r.stop_pe(i)) {
            // The registrar hears of it from the kernel's ABORT, or after the association
            // times out (its keep-alives may notice first).
            let d = if host {
                Duration::from_secs(10)
            } else {
                self.registry_hop()
            };
            self.schedule(now + d, Ev::RegistrarAssociationDown(a));
        }
        let bound: Vec<SessionId> = self
            .sessions
            .iter_mut()
            .filter(|(_, s)| s.member == i)
            .map(|(id, s)| {
                s.member_died = Some((now, host));
                *id
            })
            .collect();
        if !host && !self.members[i].cut {
            // The kernel resets every connection of the dead process (behind a cut, the
            // resets are lost; the connections are reset when it heals).
            for id in bound {
                let connecting = self.sessions.get(&id).map(|s| s.phase) == Some(Phase::Connecting);
                if !connecting {
                    self.member_reset_later(id);
                }
            }
        }
        self.schedule(now + DEAD_BOUND, Ev::DeadCheck(i, inc));
        let back = Duration::from_millis(self.rng.random_range(1_000..60_000));
        self.schedule(now + back, Ev::Restart(i));
    }

    pub(super) fn member_reset_later(&mut self, id: SessionId) {
        if self.gw_state == GatewayState::Paused {
            // The gateway's kernel has the reset; the process sees it when it runs.
            self.deferred.push(Ev::MemberReset(self.gw, id));
            return;
        }
        if self.cfg.mutation == Some(Mutation::GatewayFinFromDeadMember) {
            // The defect: a data plane that takes the dead member's end for an orderly one.
            if self.core.closed(self.now, id, Outcome::Closed) {
                self.ended(id, Outcome::Closed);
            }
            return;
        }
        self.member_reset(id);
    }

    pub(super) fn restart(&mut self, i: usize) {
        if !matches!(
            self.members[i].state,
            MemberState::HostDown | MemberState::ProcessDown
        ) {
            return;
        }
        let was_host = self.members[i].state == MemberState::HostDown;
        self.members[i].state = MemberState::Up;
        self.member_changed[i] = self.now;
        if let Some(reg) = self.registry.as_mut() {
            reg.start_pe(self.now, i, &mut self.rng);
        }
        self.stats.restarts += 1;
        self.hash(10, i as u64);
        self.note(|| format!("RESTART member {i}"));
        if was_host && !self.members[i].cut {
            // Old connections meet a host that knows nothing of them: RST (behind a cut, when
            // it heals).
            let stale: Vec<SessionId> = self
                .sessions
                .iter()
                .filter(|(_, s)| s.member == i && s.phase != Phase::Connecting)
                .filter(|(_, s)| s.inc != self.members[i].inc)
                .map(|(id, _)| *id)
                .collect();
            for id in stale {
                self.member_reset_later(id);
            }
        }
    }

    pub(super) fn resume(&mut self, i: usize) {
        if self.members[i].state != MemberState::Paused {
            return;
        }
        self.members[i].state = MemberState::Up;
        self.member_changed[i] = self.now;
        self.hash(11, i as u64);
        self.note(|| format!("RESUME member {i}"));
        let inbox = std::mem::take(&mut self.pe_inbox[i]);
        if let Some(reg) = self.registry.as_mut() {
            for m in &inbox {
                reg.deliver(self.now, m);
            }
        }
        self.deliver_owed(i);
    }

    /// What member i owes (answers, FINs) goes out once it runs and the gateway can hear it.
    pub(super) fn deliver_owed(&mut self, i: usize) {
        if self.members[i].state != MemberState::Up || self.members[i].cut {
            return;
        }
        let owed = self.owed.remove(&i).unwrap_or_default();
        let inc = self.members[i].inc;
        for id in owed {
            let phase = self.sessions.get(&id).map(|s| s.phase);
            match phase {
                Some(Phase::Requested) => {
                    let d = self.hop();
                    self.schedule(self.now + d, Ev::Answer(self.gw, id, inc));
                }
                Some(Phase::ClientClosed) => {
                    let d = self.hop();
                    self.schedule(self.now + d, Ev::MemberFin(self.gw, id, inc));
                }
                _ => {}
            }
        }
    }

    /// A partition: some members (one to all) are cut off from the gateway for 2–40 s. The
    /// gateway cannot tell this from a host crash: probes and connects time out, the
    /// established connections are silent (TCP retransmits; nothing is lost when it heals).
    pub(super) fn cut_off(&mut self) {
        self.partitions += 1;
        let n = self.partitions;
        self.partition = Some(n);
        let count = self.rng.random_range(1..=self.members.len());
        let mut cut: Vec<usize> = (0..self.members.len()).collect();
        for k in 0..count {
            let j = self.rng.random_range(k..cut.len());
            cut.swap(k, j);
        }
        cut.truncate(count);
        cut.sort_unstable();
        let d = Duration::from_millis(self.rng.random_range(2_000..40_000));
        self.stats.partitions += 1;
        self.hash(12, cut.iter().fold(0, |m, i| m | 1 << i));
        self.note(|| {
            format!(
                "PARTITION members {cut:?} cut off for {:.3} s",
                d.as_secs_f64()
            )
        });
        let now = self.now;
        for &i in &cut {
            self.members[i].cut = true;
            self.member_changed[i] = now;
            for s in self.sessions.values_mut() {
                if s.member == i && s.phase != Phase::Connecting {
                    s.cut_at = Some(now);
                }
            }
            self.schedule(now + DEAD_BOUND, Ev::CutCheck(i, n));
        }
        self.schedule(now + d, Ev::Heal(n));
    }

    /// Partition `n` heals: what was held back flows, resets of crashes behind the cut arrive.
    pub(super) fn heal(&mut self, n: u64) {
        if self.partition != Some(n) {
            return;
        }
        self.partition = None;
        self.hash(13, n);
        self.note(|| "HEAL".to_string());
        for i in 0..self.members.len() {
            if !self.members[i].cut {
                continue;
            }
            self.members[i].cut = false;
            self.member_changed[i] = self.now;
            let inc = self.members[i].inc;
            if self.members[i].state != MemberState::HostDown {
                // The member's kernel resets connections of an earlier incarnation.
                let stale: Vec<SessionId> = self
                    .sessions
                    .iter()
                    .filter(|(_, s)| s.member == i && s.phase != Phase::Connecting && s.inc != inc)
                    .map(|(id, _)| *id)
                    .collect();
                for id in stale {
                    self.member_reset_later(id);
                }
            }
            self.deliver_owed(i);
        }
    }

    /// A member cut off for [`DEAD_BOUND`], and still cut off, must have no session left that
    /// was established with it when the cut began: to the gateway a cut-off member is a dead
    /// host (3 probes time out), so it ends them as member lost, as after a host crash.
    pub(super) fn cut_check(&mut self, i: usize, n: u64) {
        if self.partition != Some(n) || !self.members[i].cut || self.gateway_disturbed() {
            return;
        }
        let health = self.core.member_health(self.members[i].id);
        if let Some((id, s)) = self
            .sessions
            .iter()
            .find(|(_, s)| s.member == i && s.cut_at.is_some() && s.phase != Phase::Connecting)
        {
            let msg = format!(
                "{id} is still bound to member {i} ({:?}), cut off from the gateway at {:?}, {DEAD_BOUND:?} later (health {health:?})",
                s.phase, s.cut_at
            );
            self.fail("gateway_member_lost_in_time", msg);
        }
    }

    /// A member whose host has been down for [`DEAD_BOUND`] must have no session left that
    /// was bound to it when it died (the core judged it dead and ended them as member lost).
    pub(super) fn dead_check(&mut self, i: usize, inc: u32) {
        if self.members[i].inc != inc
            || self.members[i].state != MemberState::HostDown
            || self.gateway_disturbed()
        {
            return;
        }
        let health = self.core.member_health(self.members[i].id);
        if let Some((id, s)) = self
            .sessions
            .iter()
            .find(|(_, s)| s.member == i && s.member_died.is_some() && s.phase != Phase::Connecting)
        {
            let msg = format!(
                "{id} is still bound to member {i} ({:?}), whose host died at {:?}, {DEAD_BOUND:?} later (health {health:?})",
                s.phase,
                s.member_died.map(|d| d.0)
            );
            self.fail("gateway_member_lost_in_time", msg);
        }
    }

    pub(super) fn end(&mut self) {
        self.note(|| "END".to_string());
    }

    // ----- Faults of the gateway itself, and of the clients' network -----

    pub(super) fn gateway_fault(&mut self) {
        let f = self.xexp(self.cfg.gateway_fault_interval);
        self.schedule(self.now + f, Ev::GatewayFault);
        if self.gw_state != GatewayState::Up {
            return;
        }
        if self.xrng.random_bool(0.3) {
            let d = Duration::from_millis(self.xrng.random_range(1_000..10_000));
            self.gw_state = GatewayState::Paused;
            self.stats.gw_pauses += 1;
            self.hash(14, u64::from(self.gw));
            self.note(|| format!("PAUSE gateway for {:.3} s", d.as_secs_f64()));
            self.schedule(self.now + d, Ev::GatewayResume(self.gw));
            return;
        }
        let host = self.xrng.random_bool(0.5);
        self.gateway_crash(host);
    }

    /// The gateway crashes: its state is lost, and every connection through it dies. The
    /// clients see a reset (the kernel of a dead process) or silence (a dead host: they time
    /// out); so do the members, whose answers and FINs now go nowhere.
    pub(super) fn gateway_crash(&mut self, host: bool) {
        self.stats.gw_crashes += 1;
        self.hash(15, u64::from(self.gw) << 1 | u64::from(host));
        let old = self.gw;
        self.note(|| {
            format!(
                "CRASH gateway incarnation {old} ({})",
                if host { "host" } else { "process" }
            )
        });
        self.gw_state = if host {
            GatewayState::HostDown
        } else {
            GatewayState::ProcessDown
        };
        self.gw += 1;
        self.poll_at = None;
        if let Some(a) = self.registry.as_mut().and_then(|r| r.stop_resolver()) {
            let d = if host {
                Duration::from_secs(10)
            } else {
                self.registry_hop()
            };
            self.schedule(self.now + d, Ev::RegistrarAssociationDown(a));
        }
        self.owed.clear();
        self.deferred.clear();
        let orphans = std::mem::take(&mut self.sessions);
        for (id, s) in orphans {
            self.stats.gw_orphaned += 1;
            let answered = matches!(s.phase, Phase::Answered | Phase::ClientClosed);
            if answered && self.cfg.mutation == Some(Mutation::GatewayCrashFinishesAnswers) {
                // The defect: a data plane that ends its clients' connections in order (FIN)
                // when it goes down, as if the answers were complete.
                let d = self.client_hop(s.client);
                self.schedule(self.now + d, Ev::ClientFin(old, id, s.client));
            }
        }
        let back = Duration::from_millis(self.xrng.random_range(1_000..20_000));
        self.schedule(self.now + back, Ev::GatewayRestart(self.gw));
    }

    /// A new incarnation starts: a fresh core with an empty session table, which learns its
    /// members (configured, or resolved) and probes them.
    pub(super) fn gateway_restart(&mut self, gw: Gw) {
        if gw != self.gw
            || !matches!(
                self.gw_state,
                GatewayState::ProcessDown | GatewayState::HostDown
            )
        {
            return;
        }
        self.gw_state = GatewayState::Up;
        self.hash(16, u64::from(gw));
        self.note(|| format!("RESTART gateway as incarnation {gw}"));
        let rng = ChaCha8Rng::seed_from_u64(self.xrng.random());
        if self.cfg.mutation != Some(Mutation::GatewayRestartKeepsSessions) {
            self.core = build_core(&self.cfg, rng, &self.members);
        }
        // (The defect keeps the crashed incarnation's core, session table and all.)
        self.learn_member_ids();
        self.last_listed.clear();
        if let Some(reg) = self.registry.as_mut() {
            // It learns its members again: a resolution at once, then every refresh.
            reg.start_resolver(self.now);
            self.schedule(self.now, Ev::ResolveTick(gw));
        }
        self.gw_back_at = Some(self.now);
        self.restarted_at = Some(self.now);
        self.bound_since_restart = 0;
        self.schedule(self.now + PROGRESS_BOUND, Ev::ProgressCheck(gw));
        if self.core.active_sessions() != 0 {
            let msg = format!(
                "incarnation {gw} starts with {} sessions bound",
                self.core.active_sessions()
            );
            self.fail("gateway_crash_loses_sessions", msg);
        }
    }

    pub(super) fn gateway_resume(&mut self, gw: Gw) {
        if gw != self.gw || self.gw_state != GatewayState::Paused {
            return;
        }
        self.gw_state = GatewayState::Up;
        self.gw_back_at = Some(self.now);
        self.hash(17, u64::from(gw));
        self.note(|| "RESUME gateway".to_string());
        for ev in std::mem::take(&mut self.deferred) {
            self.schedule(self.now, ev);
        }
    }

    /// [`PROGRESS_BOUND`] after a restart: if a member has been up and reachable all along
    /// and a client asked after [`PROGRESS_GRACE`], the new incarnation has bound a session.
    pub(super) fn progress_check(&mut self, gw: Gw) {
        let Some(restarted) = self.restarted_at else {
            return;
        };
        if gw != self.gw || self.gw_state != GatewayState::Up || self.gw_back_at != Some(restarted)
        {
            return;
        }
        self.stats.checks += 1;
        let live = (0..self.members.len()).find(|&i| {
            self.members[i].state == MemberState::Up
                && !self.members[i].cut
                && self.member_changed[i] <= restarted
                && (self.registry.is_none() || self.registrar_lists[i])
        });
        let asked = self
            .last_arrival
            .is_some_and(|t| t >= restarted + PROGRESS_GRACE);
        let bound = self.bound_since_restart;
        self.note(|| {
            format!("PROGRESS incarnation {gw}: live member {live:?}, clients asked {asked}, {bound} sessions bound")
        });
        if let (Some(i), true, 0) = (live, asked, self.bound_since_restart) {
            let msg = format!(
                "incarnation {gw}, restarted at {restarted:?}, has bound no session in {PROGRESS_BOUND:?} though member {i} was up all along and clients asked (members {:?})",
                self.core.member_snapshots(self.now).iter().map(|m| (m.address, m.health)).collect::<Vec<_>>()
            );
            self.fail("gateway_restart_progress", msg);
        }
    }

    /// Some clients (one to all) are cut off from the gateway for 2–40 s.
    pub(super) fn client_fault(&mut self) {
        let f = self.xexp(self.cfg.fault_interval);
        self.schedule(self.now + f, Ev::ClientFault);
        if self.client_partition.is_some() || !self.xrng.random_bool(0.3) {
            return;
        }
        self.client_partitions += 1;
        let n = self.client_partitions;
        self.client_partition = Some(n);
        let count = self.xrng.random_range(1..=self.cfg.clients);
        let mut cut: Vec<usize> = (0..self.cfg.clients).collect();
        for k in 0..count {
            let j = self.xrng.random_range(k..cut.len());
            cut.swap(k, j);
        }
        cut.truncate(count);
        cut.sort_unstable();
        let d = Duration::from_millis(self.xrng.random_range(2_000..40_000));
        self.stats.partitions += 1;
        self.hash(18, cut.iter().fold(0, |m, i| m | 1 << i));
        self.note(|| {
            format!(
                "PARTITION clients {cut:?} cut off for {:.3} s",
                d.as_secs_f64()
            )
        });
        for &c in &cut {
            self.client_cut[c] = Some(self.now + d);
        }
        self.schedule(self.now + d, Ev::ClientHeal(n));
    }

    pub(super) fn client_heal(&mut self, n: u64) {
        if self.client_partition != Some(n) {
            return;
        }
        self.client_partition = None;
        self.hash(19, n);
        self.note(|| "HEAL clients".to_string());
        for c in &mut self.client_cut {
            *c = None;
        }
    }

    /// Whether the gateway process is gone (its core is no more).
    pub(super) fn gw_state_is_down(&self) -> bool {
        matches!(
            self.gw_state,
            GatewayState::ProcessDown | GatewayState::HostDown
        )
    }

    /// Whether the gateway did not run for the whole of the last [`DEAD_BOUND`] (down, paused,
    /// or back within it): it could not judge a member dead in that time, and a restarted one
    /// holds no session of its predecessor.
    pub(super) fn gateway_disturbed(&self) -> bool {
        self.gw_state != GatewayState::Up
            || self.gw_back_at.is_some_and(|t| t + DEAD_BOUND > self.now)
    }
}
