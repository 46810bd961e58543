//! The registrar's defences of RFC 5355 that need state beside the handlespace: claims on a PE
//! that wait for an ownership probe, why a keep-alive to a PE is outstanding, the per-PE budget
//! of probes that unreachable reports may trigger, and associations per source address.
//!
//! The core ([`crate::Registrar`]) decides; this module only keeps the books, each map bounded
//! by what the core's limits allow (PEs, associations, claims per PE).

use crate::config::RateLimit;
use crate::rate::TokenBucket;
use rserpool_handlespace::{AssociationId, EntryId};
use rserpool_wire::asap;
use rustc_hash::FxHashMap;
use std::collections::HashMap;
use std::net::IpAddr;
use std::time::Duration;

/// A registration from an association that does not own the PE, waiting for the owner's
/// answer to a keep-alive (RFC 5355 §3.3/§3.4: registration spoofing, unauthorised
/// re-registration).
#[derive(Debug, Clone)]
pub(crate) struct Claim {
    /// The claiming association.
    pub association: AssociationId,
    /// What it asked for, run again as a registration if the claim is granted.
    pub registration: asap::Registration,
}

/// Why a keep-alive to a PE is outstanding beyond the periodic schedule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ProbeReason {
    /// Another association claimed the PE.
    Claim,
    /// Pool users reported the PE unreachable.
    Reports,
}

/// What is kept per source address while it has associations.
#[derive(Debug)]
struct AddressState {
    associations: u32,
    /// Handle resolutions of all its associations together.
    resolutions: Option<TokenBucket>,
}

#[derive(Debug, Clone, Default)]
struct ProbeState {
    outstanding: Option<ProbeReason>,
    window_start: Duration,
    in_window: u32,
}

/// The books; see the module documentation.
#[derive(Debug, Default)]
pub(crate) struct Security {
    /// Claims per PE, oldest first. Keyed by the handlespace's entry ids (not peer input).
    claims: FxHashMap<EntryId, Vec<Claim>>,
    probes: FxHashMap<EntryId, ProbeState>,
    /// Keyed by peer input: the default (SipHash) hasher keeps it safe from collisions an
    /// attacker could choose.
    per_address: HashMap<IpAddr, AddressState>,
}

impl Security {
    /// Counts an association from `address` unless `limit` (0 = none) is reached; a new
    /// address gets a bucket of `resolutions` for all its associations.
    pub fn admit(
        &mut self,
        address: IpAddr,
        limit: usize,
        resolutions: Option<RateLimit>,
        now: Duration,
    ) -> bool {
        let n = self
            .per_address
            .entry(address)
            .or_insert_with(|| AddressState {
                associations: 0,
                resolutions: resolutions.map(|l| TokenBucket::new(l, now)),
            });
        if limit > 0 && n.associations as usize >= limit {
            if n.associations == 0 {
                self.per_address.remove(&address);
            }
            return false;
        }
        n.associations += 1;
        true
    }

    /// An association from `address` is gone.
    pub fn release(&mut self, address: IpAddr) {
        if let Some(n) = self.per_address.get_mut(&address) {
            n.associations = n.associations.saturating_sub(1);
            if n.associations == 0 {
                self.per_address.remove(&address);
            }
        }
    }

    /// Takes a handle resolution from the address's bucket; `true` if allowed (or unlimited).
    pub fn allow_resolution(&mut self, address: IpAddr, now: Duration) -> bool {
        self.per_address
            .get_mut(&address)
            .and_then(|a| a.resolutions.as_mut())
            .is_none_or(|b| b.allow(now))
    }

    /// Whether the PE has a keep-alive outstanding for a claim or for reports.
    pub fn outstanding(&self, entry: EntryId) -> Option<ProbeReason> {
        self.probes.get(&entry).and_then(|p| p.outstanding)
    }

    /// Records that a probe for `reason` was sent.
    pub fn probing(&mut self, entry: EntryId, reason: ProbeReason) {
        self.probes.entry(entry).or_default().outstanding = Some(reason);
    }

    /// Takes one probe from the PE's report budget: at most `max` per `interval`.
    pub fn take_report_probe(
        &mut self,
        entry: EntryId,
        now: Duration,
        max: u32,
        interval: Duration,
    ) -> bool {
        let p = self.probes.entry(entry).or_default();
        if p.in_window == 0 || now.saturating_sub(p.window_start) >= interval {
            p.window_start = now;
            p.in_window = 0;
        }
        if p.in_window >= max {
            return false;
        }
        p.in_window += 1;
        true
    }

    /// The PE answered (keep-alive ack or its owner's re-registration): no probe is
    /// outstanding. Returns the claims that waited for the answer.
    pub fn answered(&mut self, entry: EntryId) -> Vec<Claim> {
        if let Some(p) = self.probes.get_mut(&entry) {
            p.outstanding = None;
            if p.in_window == 0 {
                self.probes.remove(&entry);
            }
        }
        self.claims.remove(&entry).unwrap_or_default()
    }

    /// Adds a claim if fewer than `max` wait on the PE; a newer claim from the same
    /// association replaces its older one (a PE that retries its registration) and always has
    /// room. `None` when refused for room, else whether it replaced one.
    pub fn add_claim_if_room(&mut self, entry: EntryId, max: usize, claim: Claim) -> Option<bool> {
        let claims = self.claims.entry(entry).or_default();
        if let Some(c) = claims
            .iter_mut()
            .find(|c| c.association == claim.association)
        {
            *c = claim;
            return Some(true);
        }
        if claims.len() >= max {
            return None;
        }
        claims.push(claim);
        Some(false)
    }

    /// The PE left the handlespace: forgets its probe state, returns its claims.
    pub fn removed(&mut self, entry: EntryId) -> Vec<Claim> {
        self.probes.remove(&entry);
        self.claims.remove(&entry).unwrap_or_default()
    }

    /// An association is gone: its claims are dropped.
    pub fn association_gone(&mut self, association: AssociationId) {
        self.claims.retain(|_, claims| {
            claims.retain(|c| c.association != association);
            !claims.is_empty()
        });
    }

    /// Entries with state, for tests of boundedness.
    #[cfg(test)]
    pub fn tracked(&self) -> usize {
        self.claims.len() + self.probes.len() + self.per_address.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_address_counts_come_and_go() {
        let mut s = Security::default();
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let t = Duration::ZERO;
        assert!(s.admit(a, 2, None, t));
        assert!(s.admit(a, 2, None, t));
        assert!(!s.admit(a, 2, None, t));
        s.release(a);
        assert!(s.admit(a, 2, None, t));
        s.release(a);
        s.release(a);
        assert_eq!(s.tracked(), 0, "no state left for a gone address");
        assert!((0..1000).all(|_| s.admit(a, 0, None, t)), "0 = unlimited");
    }
}
