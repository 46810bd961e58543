//! The gateway world's invariants checked at every selection and after every step.

use super::*;

impl GatewayWorld {
    // ----- Invariants -----

    /// The selection receipt just written for `id` lists the inputs used: the chosen member
    /// among the candidates (or the list cut at its limit), not excluded, not dead unless in
    /// panic mode; a rule named.
    pub(super) fn check_selection(&mut self, id: SessionId) {
        let Some(r) = self.core.receipt(id) else {
            return;
        };
        let Some(sel) = r.selected.last() else {
            let msg = format!("{id} is bound without a selection receipt");
            self.fail("gateway_receipts", msg);
            return;
        };
        self.stats.checks += 1;
        let limit = 4;
        let chosen = sel.candidates.iter().find(|c| c.member == sel.member);
        let problem = if sel.candidates.len() > limit {
            Some(format!(
                "{} candidates listed, limit {limit}",
                sel.candidates.len()
            ))
        } else if sel.by != "persistence" && LoadSharePolicy::ALL.iter().all(|(n, _)| *n != sel.by)
        {
            Some(format!("chosen by an unnamed rule `{}`", sel.by))
        } else {
            match chosen {
                None if sel.candidates_omitted == 0 => Some(format!(
                    "the chosen member {} is not among the candidates {:?}",
                    sel.member,
                    sel.candidates.iter().map(|c| c.member).collect::<Vec<_>>()
                )),
                Some(c) if c.excluded.is_some() => Some(format!(
                    "the chosen member {} is listed as excluded ({:?})",
                    sel.member, c.excluded
                )),
                Some(c) if c.health == Health::Dead && !sel.panic => Some(format!(
                    "the chosen member {} was dead at selection (no panic)",
                    sel.member
                )),
                _ => None,
            }
        };
        if let Some(p) = problem {
            let msg = format!("{id}: {p}");
            self.fail("gateway_receipts", msg);
            return;
        }
        let bound = r.bound.as_ref().map(|b| b.member);
        let selected = sel.member;
        if bound != Some(selected) {
            let msg = format!("{id}: bound to {bound:?}, selected {selected}");
            self.fail("gateway_receipts", msg);
            return;
        }
        if let Some(&i) = self.by_id.get(&selected) {
            self.check_listed(id, i);
        }
    }

    /// After every step: the limits hold; no session outlives its bound.
    pub(super) fn check(&mut self) {
        self.stats.checks += 1;
        let active = self.core.active_sessions();
        if active as usize != self.sessions.len() && !self.gw_state_is_down() {
            let msg = format!(
                "incarnation {} has {active} sessions bound, its data plane {} connections",
                self.gw,
                self.sessions.len()
            );
            self.fail("gateway_receipts_own_sessions", msg);
            return;
        }
        if active > self.cfg.max_sessions {
            let msg = format!("{active} sessions bound, limit {}", self.cfg.max_sessions);
            self.fail("gateway_limits", msg);
            return;
        }
        for m in &self.members {
            let n = self.core.member_sessions(m.id).unwrap_or(0);
            if n > self.cfg.max_sessions_per_member {
                let msg = format!(
                    "member {} has {n} sessions, limit {}",
                    m.id, self.cfg.max_sessions_per_member
                );
                self.fail("gateway_limits", msg);
                return;
            }
        }
        let now = self.now;
        if let Some((id, s)) = self
            .sessions
            .iter()
            .find(|(_, s)| now > s.opened + SESSION_BOUND)
        {
            let msg = format!(
                "{id} opened at {:?} is still {:?} on member {} at {now:?}",
                s.opened, s.phase, s.member
            );
            self.fail("gateway_session_ends", msg);
        }
    }
}
