//! Hostile hosts (`--hostile N`): hosts that own nothing and send the registrars what an
//! attacker on the same network would (RFC 5355 §3): deregistrations and registrations of
//! other PEs' identifiers, ENDPOINT_UNREACHABLE floods, malformed messages, and ENRP messages
//! under other registrars' IDs. Everything goes through the real registrar and ENRP cores.
//!
//! Invariants: `owner_only` (no PE leaves a handlespace, and no listed PE's user transport is
//! replaced, while a registrar handles a hostile host's message; no registrar ever lists a PE
//! at an address that is not the PE's own) and `malformed_answered` (a malformed message whose
//! action bits ask for a report is answered with exactly the cause RFC 5354 §4 names).

use super::*;
use rserpool_wire::{CauseCode, PeerIdentity, RegistrationLife};
use std::sync::Arc;

/// What a hostile host keeps.
pub(crate) struct HostileHost {
    /// Its address.
    pub(super) ip: IpAddr,
    /// Its ASAP associations, per registrar (connecting or up).
    pub(super) asap: BTreeMap<usize, u64>,
    /// Its ENRP associations, per registrar.
    pub(super) enrp: BTreeMap<usize, u64>,
    /// Per association, the causes the registrar owes it for malformed messages, oldest first.
    pub(super) owed: BTreeMap<u64, VecDeque<CauseCode>>,
    /// The identity it presents (authenticated runs): none, or one no rule allows.
    pub(super) identity: Option<Arc<PeerIdentity>>,
}

impl HostileHost {
    pub(super) fn new(ip: IpAddr) -> Self {
        HostileHost {
            ip,
            asap: BTreeMap::new(),
            enrp: BTreeMap::new(),
            owed: BTreeMap::new(),
            identity: None,
        }
    }
}

/// An ASAP message type that no version knows, with action bits 01: stop, discard and report
/// "Unrecognized Message" (RFC 5354 §4).
const UNKNOWN_REPORTED: u8 = 0x7a;
/// An unknown ASAP message type with action bits 00: stop and discard silently.
const UNKNOWN_SILENT: u8 = 0x3a;
/// A parameter type no version knows, with action bits 01: stop, discard and report
/// "Unrecognized Parameter".
const UNKNOWN_PARAMETER: u16 = 0x4abc;

/// A certificate identity with one common name (the simulator's model of TLS).
pub(super) fn identity(cn: &str) -> Arc<PeerIdentity> {
    Arc::new(PeerIdentity {
        common_names: vec![cn.to_string()],
        dns_names: Vec::new(),
        uris: Vec::new(),
        fingerprint: [0; 32],
    })
}

impl World {
    /// The identity host `h` proves with its certificate (authenticated runs): registrars and
    /// PEs hold allowed ones, pool users none, hostile hosts none or an unknown one.
    pub(super) fn identity_of(&self, h: HostId) -> Option<Arc<PeerIdentity>> {
        if !self.cfg.authenticated {
            return None;
        }
        match h {
            HostId::Registrar(i) => Some(identity(&format!("registrar-{i}"))),
            HostId::PoolElement(j) => Some(identity(&format!("pe-{j}"))),
            HostId::PoolUser(_) => None,
            HostId::Hostile(n) => self.hostiles[n].identity.clone(),
        }
    }

    /// The registrars' identity rules in authenticated runs: PEs (`pe-*`) register into any
    /// pool, registrars (`registrar-*`) peer over ENRP, pool users resolve without a
    /// certificate.
    pub(super) fn access_rules() -> rserpool_registrar::AccessRules {
        use rserpool_registrar::access::{IdentityPattern, PoolPattern, RegistrationRule};
        rserpool_registrar::AccessRules {
            registration: vec![RegistrationRule {
                identity: IdentityPattern::parse("cn:pe-*").expect("valid pattern"),
                pools: vec![PoolPattern::parse("*").expect("valid pattern")],
            }],
            enrp_peers: vec![IdentityPattern::parse("cn:registrar-*").expect("valid pattern")],
            unauthenticated_resolution: true,
        }
    }

    /// Hostile host n acts: one attack on one registrar, then again after about 1.5 s (during
    /// the chaos phase only, so that the quiet phase shows what the attacks left behind).
    pub(super) fn hostile_acts(&mut self, n: usize) {
        if !self.chaos {
            return;
        }
        if self.cfg.authenticated && self.hostiles[n].identity.is_none() && n % 2 == 1 {
            self.hostiles[n].identity = Some(identity(&format!("intruder-{n}")));
        }
        let h = HostId::Hostile(n);
        let mut i = self.net_rng.random_range(0..self.regs.len());
        let kind = self.net_rng.random_range(0..6u8);
        // A PE to impersonate: one that is registered now (with any registrar).
        let live: Vec<usize> = (0..self.pes.len())
            .filter(|&j| self.pes[j].core.as_ref().is_some_and(|c| c.is_registered()))
            .collect();
        let victim = (!live.is_empty()).then(|| live[self.net_rng.random_range(0..live.len())]);
        let codec = self.codec;
        let mut messages: Vec<(Service, Vec<u8>, Option<CauseCode>)> = Vec::new();
        match (kind, victim) {
            (0, Some(j)) => {
                // Unauthorised deregistration (RFC 5355 §3.3).
                let m = AsapMessage::Deregistration(rserpool_wire::asap::Deregistration {
                    pool_handle: self.pes[j].pool.clone(),
                    pe_id: self.pes[j].id,
                });
                if let Ok(b) = codec.encode(&m) {
                    messages.push((Service::Asap, b, None));
                }
            }
            (1, Some(j)) => {
                // Registration spoofing: the victim's identifier at the attacker's address.
                // Without authentication a registrar cannot tell an impostor from a PE that
                // moves to it after its home died (RFC 5355 §3.3 names TLS as the defence), so
                // unauthenticated runs aim it at the victim's home registrar, whose ownership
                // probe defends the PE; authenticated runs aim it anywhere.
                if !self.cfg.authenticated {
                    let home = self.pes[j].core.as_ref().and_then(|c| c.home_registrar());
                    match self.regs.iter().position(|r| Some(r.id) == home && r.alive) {
                        Some(x) => i = x,
                        None => return self.hostile_again(n),
                    }
                }
                let pe = rserpool_wire::PoolElement {
                    id: self.pes[j].id,
                    home_registrar: RegistrarId(0),
                    registration_life: RegistrationLife::Finite(Duration::from_secs(30)),
                    user_transport: UserTransport::Address(TransportAddress::sctp(
                        SESSION_PORT,
                        TransportUse::DataPlusControl,
                        vec![self.hostiles[n].ip],
                    )),
                    policy: PoolPolicy::RoundRobin,
                    asap_transport: None,
                };
                let m = AsapMessage::Registration(rserpool_wire::asap::Registration {
                    pool_handle: self.pes[j].pool.clone(),
                    pool_element: pe,
                });
                if let Ok(b) = codec.encode(&m) {
                    messages.push((Service::Asap, b, None));
                }
            }
            (2, Some(_)) => {
                // An ENDPOINT_UNREACHABLE flood about live PEs (RFC 5355 §3.8).
                for _ in 0..20 {
                    let j = live[self.net_rng.random_range(0..live.len())];
                    let m = AsapMessage::EndpointUnreachable(
                        rserpool_wire::asap::EndpointUnreachable {
                            pool_handle: self.pes[j].pool.clone(),
                            pe_id: self.pes[j].id,
                        },
                    );
                    if let Ok(b) = codec.encode(&m) {
                        messages.push((Service::Asap, b, None));
                    }
                }
            }
            (3, _) => {
                // Malformed messages whose action bits ask for a report, and one that does not.
                messages.push((
                    Service::Asap,
                    vec![UNKNOWN_REPORTED, 0, 0, 4],
                    Some(CauseCode::UnrecognizedMessage),
                ));
                messages.push((Service::Asap, vec![UNKNOWN_SILENT, 0, 0, 4], None));
                let [a, b] = UNKNOWN_PARAMETER.to_be_bytes();
                messages.push((
                    Service::Asap,
                    vec![0x01, 0, 0, 12, a, b, 0, 8, 0xde, 0xad, 0xbe, 0xef],
                    Some(CauseCode::UnrecognizedParameter),
                ));
            }
            (4, Some(j)) if self.regs.len() > 1 => {
                // ENRP under another registrar's ID: the victim's home deletes it.
                let Some(home) = self.pes[j].core.as_ref().and_then(|c| c.home_registrar()) else {
                    return self.hostile_again(n);
                };
                let pe = rserpool_wire::PoolElement {
                    id: self.pes[j].id,
                    home_registrar: home,
                    registration_life: RegistrationLife::Finite(Duration::from_secs(30)),
                    user_transport: UserTransport::Address(self.transport_of(
                        HostId::PoolElement(j),
                        SESSION_PORT,
                        TransportUse::DataPlusControl,
                    )),
                    policy: PoolPolicy::RoundRobin,
                    asap_transport: None,
                };
                let m = EnrpMessage::HandleUpdate(rserpool_wire::enrp::HandleUpdate {
                    peers: rserpool_wire::enrp::Peers {
                        sender: home,
                        receiver: self.regs[i].id,
                    },
                    takeover_suggested: false,
                    action: rserpool_wire::enrp::UpdateAction::DelPe,
                    pool_handle: self.pes[j].pool.clone(),
                    pool_element: pe,
                });
                if let Ok(b) = codec.encode(&m) {
                    messages.push((Service::Enrp, b, None));
                }
            }
            (5, _) if self.regs.len() > 1 => {
                // ENRP_PRESENCE under another live registrar's ID, with a checksum that
                // claims it owns nothing.
                let k =
                    (i + 1 + self.net_rng.random_range(0..self.regs.len() - 1)) % self.regs.len();
                let m = EnrpMessage::Presence(rserpool_wire::enrp::Presence {
                    peers: rserpool_wire::enrp::Peers {
                        sender: self.regs[k].id,
                        receiver: self.regs[i].id,
                    },
                    reply_required: true,
                    checksum: Default::default(),
                    server_information: None,
                });
                if let Ok(b) = codec.encode(&m) {
                    messages.push((Service::Enrp, b, None));
                }
            }
            _ => {}
        }
        // ENRP claims only where the registrars authenticate their peers: without TLS, ENRP
        // trusts whoever speaks it by design (RFC 5355 §3.4 names TLS as the defence).
        messages.retain(|(s, _, _)| *s != Service::Enrp || self.cfg.authenticated);
        for (service, bytes, owed) in messages {
            let id = self.hostile_assoc(n, i, service);
            if let Some(code) = owed {
                self.hostiles[n].owed.entry(id).or_default().push_back(code);
            }
            self.stats.hostile_messages += 1;
            self.send(id, h, &bytes);
        }
        self.hostile_again(n);
    }

    fn hostile_again(&mut self, n: usize) {
        let u: f64 = self.net_rng.random_range(f64::EPSILON..1.0);
        let next = Duration::from_millis(1500)
            .mul_f64(-u.ln())
            .min(Duration::from_secs(30));
        self.schedule(self.now + next, Ev::Hostile(n));
    }

    /// Hostile host n's association with registrar i for `service`, opened if it has none.
    fn hostile_assoc(&mut self, n: usize, i: usize, service: Service) -> u64 {
        let map = if service == Service::Enrp {
            &self.hostiles[n].enrp
        } else {
            &self.hostiles[n].asap
        };
        if let Some(id) = map.get(&i) {
            if self
                .assocs
                .get(id)
                .is_some_and(|a| a.state != AssocState::Closed)
            {
                return *id;
            }
        }
        let port = if service == Service::Enrp {
            ENRP_PORT
        } else {
            ASAP_PORT
        };
        let addr = SocketAddr::new(self.regs[i].ip, port);
        let id = self.connect(HostId::Hostile(n), service, &[addr]);
        let map = if service == Service::Enrp {
            &mut self.hostiles[n].enrp
        } else {
            &mut self.hostiles[n].asap
        };
        map.insert(i, id);
        id
    }

    /// A message for hostile host n: an ASAP_ERROR must carry the cause it is owed for the
    /// oldest malformed message (`malformed_answered`).
    pub(super) fn hostile_message(&mut self, n: usize, id: u64, service: Service, bytes: &[u8]) {
        if service != Service::Asap {
            return;
        }
        let Ok(AsapMessage::Error(e)) = self.codec.decode::<AsapMessage>(bytes).map(|d| d.message)
        else {
            return;
        };
        let owed = self.hostiles[n]
            .owed
            .get_mut(&id)
            .and_then(|q| q.pop_front());
        let got: Vec<CauseCode> = e.error.causes.iter().map(|c| c.code).collect();
        match owed {
            Some(code) if got == [code] => self.stats.malformed_answered += 1,
            _ => {
                let msg = format!(
                    "X{n} got ASAP_ERROR with causes {got:?} on #{id}, owed {owed:?} for its oldest unanswered malformed message"
                );
                self.fail("malformed_answered", msg);
            }
        }
    }

    /// Every PE in registrar i's handlespace: (pool, identifier) -> its user transport.
    pub(super) fn listing(
        &self,
        i: usize,
    ) -> BTreeMap<(PoolHandle, u32), Option<TransportAddress>> {
        let Some(c) = self.regs[i].core.as_ref() else {
            return BTreeMap::new();
        };
        let hs = c.0.handlespace();
        hs.pools()
            .flat_map(|p| {
                p.elements()
                    .map(|e| {
                        let t = e.element().user_transport.as_address().cloned();
                        ((e.pool_handle().clone(), e.id().0), t)
                    })
                    .collect::<Vec<_>>()
            })
            .collect()
    }

    /// After registrar i handled a hostile host's message: nothing it listed before left, and
    /// no listed PE's user transport changed (`owner_only`).
    pub(super) fn check_owner_only(
        &mut self,
        i: usize,
        from: HostId,
        what: &str,
        before: &BTreeMap<(PoolHandle, u32), Option<TransportAddress>>,
    ) {
        self.stats.checks += 1;
        let after = self.listing(i);
        for (key, t) in before {
            // A registration the hostile host itself holds (granted once the PE failed its
            // ownership probe, `claim_granted`) is its own to drop or change.
            let held_by_stranger = self.pe_by_id.get(&PoolElementId(key.1)).is_some_and(|&j| {
                let own = self.host_ips(HostId::PoolElement(j));
                t.as_ref()
                    .is_some_and(|t| t.addresses.iter().any(|a| !own.contains(a)))
            });
            if held_by_stranger {
                continue;
            }
            match after.get(key) {
                None => {
                    let msg = format!(
                        "R{i} dropped {} from {} on {from}'s {what}, which does not own it",
                        PoolElementId(key.1),
                        key.0
                    );
                    self.fail("owner_only", msg);
                    return;
                }
                Some(now) if now != t => {
                    let msg = format!(
                        "R{i} replaced the user transport of {} in {} on {from}'s {what}: {t:?} became {now:?}",
                        PoolElementId(key.1),
                        key.0
                    );
                    self.fail("owner_only", msg);
                    return;
                }
                _ => {}
            }
        }
    }

    /// Registrar i granted a claim on PE `pe_id` to association `assoc`, or registered it over
    /// `assoc`: if a hostile host
    /// holds it, the PE must have failed the ownership probe because it really was out of
    /// reach (crashed, paused, cut off, or its answer held up on a lossy network), never while
    /// it was alive and answering over an undisturbed network (`owner_only`).
    pub(super) fn claim_granted(&mut self, i: usize, pe_id: PoolElementId, assoc: u64) {
        let Some(x) = self.assocs.get(&assoc).and_then(|a| {
            a.ends
                .iter()
                .copied()
                .find(|e| matches!(e, HostId::Hostile(_)))
        }) else {
            // The PE's own registration (again): no stranger holds it here any more.
            self.stranger_held.remove(&(i, pe_id));
            return;
        };
        self.stranger_held.insert((i, pe_id));
        let Some(&j) = self.pe_by_id.get(&pe_id) else {
            return;
        };
        self.stats.checks += 1;
        let disturbed = self.partition_active
            || !self.cut_ips.is_empty()
            || self.now < self.settle_until
            || (self.cfg.link.loss > 0.0 && self.now < self.cfg.chaos + PARTITION_SETTLE)
            || self.paused_recently.values().any(|&t| self.now < t);
        let p = &self.pes[j];
        let answering = p.alive
            && p.core.is_some()
            && p.home.and_then(|a| self.assocs.get(&a)).is_some_and(|a| {
                a.state == AssocState::Up && a.ends.contains(&HostId::Registrar(i))
            });
        if answering && !disturbed {
            let msg = format!(
                "R{i} granted {x}'s claim on PE{j} ({pe_id}) although PE{j} is alive and answering over an undisturbed network"
            );
            self.fail("owner_only", msg);
        }
    }

    /// Where registrars authenticate, no registrar lists a PE at an address that is not the
    /// PE's own: a hostile host cannot register at all (`owner_only`). Without authentication
    /// a registrar grants a PE's identifier to whoever claims it once the PE failed its
    /// ownership probe ([`World::claim_granted`] judges those grants).
    pub(super) fn check_listed_addresses(&mut self) {
        if self.hostiles.is_empty() || !self.cfg.authenticated {
            return;
        }
        for i in 0..self.regs.len() {
            for ((pool, id), t) in self.listing(i) {
                let Some(&j) = self.pe_by_id.get(&PoolElementId(id)) else {
                    continue;
                };
                let own = self.host_ips(HostId::PoolElement(j));
                if let Some(t) = t {
                    if let Some(bad) = t.addresses.iter().find(|a| !own.contains(a)) {
                        let msg = format!(
                            "R{i} lists PE{j} ({}) in {pool} at {bad}, which is not its address",
                            PoolElementId(id)
                        );
                        self.fail("owner_only", msg);
                        return;
                    }
                }
            }
        }
    }
}
