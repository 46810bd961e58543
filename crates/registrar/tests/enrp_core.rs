//! The ENRP core (RFC 5353) driven in virtual time: 2 to 5 registrars, each an ASAP core with
//! its ENRP core, wired by an in-memory network (no sockets). Start-up from a mentor, chunked
//! handle table sync, updates both ways, the audit, dead-peer takeover and its arbitration,
//! refutation, and what is refused.

use rserpool_registrar::enrp::{
    Enrp, EnrpConfig, EnrpDestination, EnrpEvent, Source, TakeoverOutcome,
};
use rserpool_registrar::{
    AssociationId, AssociationKind, Destination, PeerInfo, Profile, Registrar, RegistrarConfig,
};
use rserpool_sim::fixtures::pool_element;
use rserpool_wire::asap::{self, AsapMessage};
use rserpool_wire::enrp::{self as wenrp, EnrpMessage, EnrpMessageType, UpdateAction};
use rserpool_wire::{
    Codec, PoolElementId, PoolHandle, Protocol, RegistrarId, TransportAddress, TransportProtocol,
    TransportUse,
};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

/// Network delay of every message.
const DELAY: Duration = Duration::from_millis(2);

struct Node {
    reg: Registrar,
    enrp: Enrp,
    addr: SocketAddr,
    alive: bool,
    /// Isolated: nothing in or out.
    cut: bool,
    events: Vec<EnrpEvent>,
    /// H=1 keep-alives sent to PE addresses: (address, pool, PE).
    home_keep_alives: Vec<(SocketAddr, PoolHandle, PoolElementId)>,
    next_asap: u64,
}

struct InFlight {
    at: Duration,
    to: usize,
    source: Source,
    bytes: Vec<u8>,
}

/// Decides whether a message is lost: (from, to, message type).
type Loss = Box<dyn FnMut(usize, usize, EnrpMessageType) -> bool>;

struct Net {
    nodes: Vec<Node>,
    now: Duration,
    codec: Codec,
    flight: VecDeque<InFlight>,
    /// Association id -> its two ends.
    associations: HashMap<u64, (usize, usize)>,
    pairs: HashMap<(usize, usize), u64>,
    loss: Option<Loss>,
    profile: Profile,
    /// Whether PEs answer H=1 keep-alives.
    pes_answer: bool,
}

impl Net {
    fn new(ids: &[u32], profile: Profile, tweak: impl Fn(&mut EnrpConfig)) -> Net {
        let mut nodes = Vec::new();
        let addrs: Vec<SocketAddr> = (0..ids.len())
            .map(|i| SocketAddr::from(([10, 0, 0, i as u8 + 1], 9901)))
            .collect();
        for (i, &id) in ids.iter().enumerate() {
            let mut rc = RegistrarConfig::new(profile);
            rc.registrar_id = RegistrarId(id);
            rc.seed = Some(u64::from(id));
            rc.announce = None;
            rc.keep_alive_interval = Duration::from_secs(100_000);
            rc.max_associations = 100_000;
            let mut reg = Registrar::new(rc, Duration::ZERO);
            let mut ec = EnrpConfig::new(profile);
            ec.seed = Some(u64::from(id));
            // Every registrar knows the first one (the mentor) statically.
            if i > 0 {
                ec.static_peers = vec![vec![addrs[0]]];
            }
            tweak(&mut ec);
            let mut enrp = Enrp::new(ec, &mut reg, Duration::ZERO);
            enrp.set_local_transport(
                &reg,
                TransportAddress::sctp(9901, TransportUse::DataOnly, vec![addrs[i].ip()]),
            );
            nodes.push(Node {
                reg,
                enrp,
                addr: addrs[i],
                alive: true,
                cut: false,
                events: Vec::new(),
                home_keep_alives: Vec::new(),
                next_asap: 1,
            });
        }
        let mut net = Net {
            nodes,
            now: Duration::ZERO,
            codec: Codec::new(RegistrarConfig::new(profile).codec),
            flight: VecDeque::new(),
            associations: HashMap::new(),
            pairs: HashMap::new(),
            loss: None,
            profile,
            pes_answer: true,
        };
        for i in 0..net.nodes.len() {
            net.drain(i);
        }
        net
    }

    fn association(&mut self, a: usize, b: usize) -> u64 {
        let key = (a.min(b), a.max(b));
        let next = self.pairs.len() as u64 + 1;
        let id = *self.pairs.entry(key).or_insert(next);
        self.associations.insert(id, key);
        id
    }

    /// Sends out what node `i` queued.
    fn drain(&mut self, i: usize) {
        while let Some(t) = self.nodes[i].enrp.poll_transmit() {
            let targets: Vec<(usize, Source)> = match &t.destination {
                EnrpDestination::Association(a) => {
                    let Some(&(x, y)) = self.associations.get(&a.0) else {
                        continue;
                    };
                    let to = if x == i { y } else { x };
                    vec![(to, Source::Association(*a))]
                }
                EnrpDestination::Addresses(addrs) => {
                    let Some(to) = self.nodes.iter().position(|n| addrs.contains(&n.addr)) else {
                        continue;
                    };
                    let a = self.association(i, to);
                    vec![(to, Source::Association(AssociationId(a)))]
                }
                EnrpDestination::Multicast => (0..self.nodes.len())
                    .filter(|&j| j != i)
                    .map(|j| (j, Source::Multicast))
                    .collect(),
            };
            for (to, source) in targets {
                if !self.nodes[i].alive || self.nodes[i].cut || self.nodes[to].cut {
                    continue;
                }
                if let Some(loss) = self.loss.as_mut() {
                    if loss(i, to, t.kind) {
                        continue;
                    }
                }
                self.flight.push_back(InFlight {
                    at: self.now + DELAY,
                    to,
                    source,
                    bytes: t.bytes.clone(),
                });
            }
        }
        let mut adopted = Vec::new();
        while let Some(t) = self.nodes[i].reg.poll_transmit() {
            if let Destination::Address(addr) = t.destination {
                let m = self.codec.decode::<AsapMessage>(&t.bytes).unwrap().message;
                if let AsapMessage::EndpointKeepAlive(k) = m {
                    assert!(k.home, "a keep-alive to an address is the H=1 one");
                    // Without RSPLIB's PE Identifier (rfc profile) the PE at that address
                    // answers for itself.
                    let pe_id = k.pe_id.unwrap_or_else(|| {
                        let hs = self.nodes[i].reg.handlespace();
                        hs.pool(&k.pool_handle)
                            .and_then(|p| {
                                p.elements().find(|e| {
                                    e.element().asap_transport.as_ref().is_some_and(|t| {
                                        t.addresses.contains(&addr.ip()) && t.port == addr.port()
                                    })
                                })
                            })
                            .map(|e| e.id())
                            .unwrap_or_default()
                    });
                    self.nodes[i]
                        .home_keep_alives
                        .push((addr, k.pool_handle.clone(), pe_id));
                    if self.pes_answer {
                        adopted.push((addr, k.pool_handle, pe_id));
                    }
                }
            }
        }
        // The PE adopts its new home: it answers over the association the keep-alive opened.
        let now = self.now;
        for (addr, pool_handle, pe_id) in adopted {
            let n = &mut self.nodes[i];
            let a = AssociationId(n.next_asap);
            n.next_asap += 1;
            n.reg.association_up(
                now,
                a,
                PeerInfo {
                    kind: AssociationKind::Sctp,
                    addresses: vec![addr.ip()],
                    port: addr.port(),
                },
            );
            let m = AsapMessage::EndpointKeepAliveAck(asap::EndpointKeepAliveAck {
                pool_handle,
                pe_id,
            });
            let b = self.codec.encode(&m).unwrap();
            n.reg.message(now, a, Protocol::Asap.ppid(), &b);
            while n.reg.poll_transmit().is_some() {}
        }
        while let Some(e) = self.nodes[i].enrp.poll_event() {
            self.nodes[i].events.push(e);
        }
        while let Some(e) = self.nodes[i].reg.poll_event() {
            if std::env::var("ENRP_DEBUG").is_ok() {
                eprintln!("{:?} node {i}: {e:?}", self.now);
            }
        }
    }

    /// Runs until `t`: messages and timers in time order.
    fn run_until(&mut self, t: Duration) {
        loop {
            let next_msg = self.flight.iter().map(|m| m.at).min();
            let next_timer = self
                .nodes
                .iter()
                .filter(|n| n.alive)
                .flat_map(|n| [n.reg.poll_timeout(), n.enrp.poll_timeout()])
                .flatten()
                .min();
            let next = match (next_msg, next_timer) {
                (Some(a), Some(b)) => a.min(b),
                (a, b) => match a.or(b) {
                    Some(x) => x,
                    None => break,
                },
            };
            if next > t {
                break;
            }
            self.now = self.now.max(next);
            let now = self.now;
            // Messages due.
            let mut due = Vec::new();
            let mut rest = VecDeque::new();
            for m in self.flight.drain(..) {
                if m.at <= now {
                    due.push(m);
                } else {
                    rest.push_back(m);
                }
            }
            self.flight = rest;
            for m in due {
                if !self.nodes[m.to].alive || self.nodes[m.to].cut {
                    continue;
                }
                let n = &mut self.nodes[m.to];
                n.enrp.message(now, &mut n.reg, m.source, &m.bytes);
                self.drain(m.to);
            }
            for i in 0..self.nodes.len() {
                if !self.nodes[i].alive {
                    continue;
                }
                let n = &mut self.nodes[i];
                if n.reg.poll_timeout().is_some_and(|d| d <= now) {
                    n.reg.handle_timeout(now);
                    n.enrp.after_asap(&mut n.reg);
                }
                if n.enrp.poll_timeout().is_some_and(|d| d <= now) {
                    n.enrp.handle_timeout(now, &mut n.reg);
                }
                self.drain(i);
            }
        }
        self.now = self.now.max(t);
    }

    fn run_for(&mut self, d: Duration) {
        let t = self.now + d;
        self.run_until(t);
    }

    /// Registers PEs `ids` at node `i`, one ASAP association per `per_association` PEs.
    fn register(
        &mut self,
        i: usize,
        pool: &str,
        ids: impl IntoIterator<Item = u32>,
        per_association: usize,
    ) {
        let now = self.now;
        let pool = PoolHandle::from(pool);
        let mut assoc = None;
        for (count, id) in ids.into_iter().enumerate() {
            let n = &mut self.nodes[i];
            if assoc.is_none() || count % per_association == 0 {
                let a = AssociationId(n.next_asap);
                n.next_asap += 1;
                let ip: IpAddr = format!("10.{}.{}.{}", 100 + i, (a.0 >> 8) & 0xff, a.0 & 0xff)
                    .parse()
                    .unwrap();
                n.reg.association_up(
                    now,
                    a,
                    PeerInfo {
                        kind: AssociationKind::Sctp,
                        addresses: vec![ip],
                        port: 40_000,
                    },
                );
                assoc = Some((a, ip));
            }
            let (a, ip) = assoc.unwrap();
            let m = AsapMessage::Registration(asap::Registration {
                pool_handle: pool.clone(),
                pool_element: pool_element(id, ip),
            });
            let b = self.codec.encode(&m).unwrap();
            let n = &mut self.nodes[i];
            n.reg.message(now, a, Protocol::Asap.ppid(), &b);
            n.enrp.after_asap(&mut n.reg);
            self.drain(i);
        }
    }

    fn deregister(&mut self, i: usize, pool: &str, id: u32) {
        let now = self.now;
        let pool = PoolHandle::from(pool);
        let n = &mut self.nodes[i];
        let a = n
            .reg
            .handlespace()
            .find(&pool, PoolElementId(id))
            .and_then(|pe| pe.association())
            .expect("registered here");
        let m = AsapMessage::Deregistration(asap::Deregistration {
            pool_handle: pool,
            pe_id: PoolElementId(id),
        });
        let b = self.codec.encode(&m).unwrap();
        n.reg.message(now, a, Protocol::Asap.ppid(), &b);
        n.enrp.after_asap(&mut n.reg);
        self.drain(i);
    }

    fn id(&self, i: usize) -> RegistrarId {
        self.nodes[i].reg.id()
    }

    fn kill(&mut self, i: usize) {
        self.nodes[i].alive = false;
        self.flight.retain(|m| m.to != i);
    }

    /// (PEs, home) of every PE, sorted, as node `i` holds them.
    fn table(&self, i: usize) -> Vec<(PoolHandle, u32, RegistrarId)> {
        let hs = self.nodes[i].reg.handlespace();
        let mut v: Vec<_> = hs
            .pools()
            .flat_map(|p| {
                p.elements()
                    .map(|e| (e.pool_handle().clone(), e.id().0, e.home_registrar()))
            })
            .collect();
        v.sort();
        v
    }

    fn checksums(&self, i: usize) -> BTreeMap<RegistrarId, (usize, u16)> {
        self.nodes[i]
            .reg
            .handlespace()
            .owners()
            .map(|o| (o.owner, (o.elements, o.checksum.0)))
            .collect()
    }

    fn won(&self, i: usize) -> Vec<RegistrarId> {
        self.nodes[i]
            .events
            .iter()
            .filter_map(|e| match e {
                EnrpEvent::TakeoverWon { target, .. } => Some(*target),
                _ => None,
            })
            .collect()
    }

    fn started_takeover(&self, i: usize) -> bool {
        self.nodes[i]
            .events
            .iter()
            .any(|e| matches!(e, EnrpEvent::TakeoverStarted { .. }))
    }

    fn metrics(&mut self, i: usize) -> rserpool_registrar::enrp::EnrpMetrics {
        let n = &mut self.nodes[i];
        n.enrp.metrics(&n.reg).clone()
    }

    fn inject(&mut self, to: usize, source: Source, m: &EnrpMessage) {
        let b = self.codec.encode(m).unwrap();
        let now = self.now;
        let n = &mut self.nodes[to];
        n.enrp.message(now, &mut n.reg, source, &b);
    }
}

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

#[test]
fn startup_from_mentor_in_chunks() {
    let mut net = Net::new(&[0x100, 0x200], Profile::Rsplib, |_| {});
    net.register(0, "EchoPool", 1..=300, 10);
    net.run_for(secs(12));
    assert_eq!(net.table(1), net.table(0));
    assert_eq!(net.table(1).len(), 300);
    assert_eq!(net.checksums(0), net.checksums(1));
    let e1 = &net.nodes[1].events;
    assert!(
        e1.iter().any(
            |e| matches!(e, EnrpEvent::StartupDone { mentor: Some(m) } if *m == RegistrarId(0x100))
        ),
        "{e1:?}"
    );
    assert!(e1.iter().any(|e| matches!(
        e,
        EnrpEvent::SyncDone {
            received: 300,
            rejected: false,
            ..
        }
    )));
    // 300 PEs do not fit one response: several, each within 128 PEs and 1400 bytes.
    let m0 = net.metrics(0).clone();
    let responses = m0.sent_of(EnrpMessageType::HandleTableResponse);
    // ~56 bytes per PE: 1400 bytes hold about 24.
    assert!(responses >= 300 / 25, "{responses} responses");
    let m1 = net.metrics(1).clone();
    assert_eq!(m1.pool_elements_learned, 300);
    assert!(net.nodes[1].enrp.started());
}

#[test]
fn chunked_sync_of_10000_pes_respects_both_caps() {
    let mut net = Net::new(&[0x100, 0x200], Profile::Rsplib, |c| {
        c.max_elements_per_handle_table_response = 50;
        c.max_handle_table_response_bytes = 64 * 1024;
    });
    net.register(0, "BigPool", 1..=6_000, 100);
    net.register(0, "OtherPool", 1..=4_000, 100);
    net.run_for(secs(30));
    assert_eq!(net.nodes[1].reg.handlespace().len(), 10_000);
    assert_eq!(net.table(1), net.table(0));
    net.nodes[1].reg.handlespace().verify().unwrap();
    let m0 = net.metrics(0).clone();
    // 10 000 PEs at 50 per response: 200 responses (plus the audit's none).
    assert!(m0.sent_of(EnrpMessageType::HandleTableResponse) >= 200);

    // The byte cap alone: RSPLIB's 1400 bytes hold far fewer than 128 PEs.
    let mut net = Net::new(&[0x100, 0x200], Profile::Rsplib, |_| {});
    net.register(0, "BigPool", 1..=1_000, 100);
    net.run_for(secs(20));
    assert_eq!(net.nodes[1].reg.handlespace().len(), 1_000);
    let m0 = net.metrics(0).clone();
    assert!(m0.sent_of(EnrpMessageType::HandleTableResponse) >= 1_000 / 128 * 2);
}

#[test]
fn updates_flow_both_ways() {
    let mut net = Net::new(&[0x100, 0x200, 0x300], Profile::Rsplib, |_| {});
    net.run_for(secs(12));
    net.register(0, "P", [1, 2], 1);
    net.register(1, "P", [3], 1);
    net.register(2, "P", [4], 1);
    net.run_for(secs(1));
    for i in 0..3 {
        assert_eq!(net.table(i).len(), 4, "node {i}: {:?}", net.table(i));
        assert_eq!(net.table(i), net.table(0));
    }
    net.deregister(0, "P", 1);
    net.run_for(secs(1));
    for i in 0..3 {
        assert_eq!(net.table(i).len(), 3, "node {i}");
    }
    assert_eq!(net.table(1)[0], (PoolHandle::from("P"), 2, net.id(0)));
    // Every checksum agrees after a few heartbeats.
    net.run_for(secs(10));
    assert_eq!(net.checksums(0), net.checksums(1));
    assert_eq!(net.checksums(0), net.checksums(2));
}

#[test]
fn audit_repairs_a_lost_update_and_sweeps_a_stale_pe() {
    let mut net = Net::new(&[0x100, 0x200], Profile::Rsplib, |_| {});
    net.run_for(secs(12));
    net.register(0, "P", [1, 2, 3], 1);
    net.run_for(secs(1));
    assert_eq!(net.table(1).len(), 3);
    // Lose every HANDLE_UPDATE from node 0 for a while: one add and one delete go missing.
    net.loss = Some(Box::new(|from, _, kind| {
        from == 0 && kind == EnrpMessageType::HandleUpdate
    }));
    net.register(0, "P", [4], 1);
    net.deregister(0, "P", 2);
    net.run_for(Duration::from_millis(100));
    assert_ne!(net.table(1), net.table(0));
    net.loss = None;
    // The next PRESENCE carries a checksum node 1 does not hold: W=1 resync, mark and sweep.
    net.run_for(secs(4));
    assert_eq!(net.table(1), net.table(0));
    let e1 = &net.nodes[1].events;
    assert!(e1.iter().any(|e| matches!(
        e,
        EnrpEvent::SyncStarted {
            own_children_only: true,
            reason: "checksum mismatch",
            ..
        }
    )));
    assert!(
        e1.iter()
            .any(|e| matches!(e, EnrpEvent::SyncDone { dropped: 1, .. })),
        "{e1:?}"
    );
    let m1 = net.metrics(1).clone();
    assert!(m1.audit_mismatches >= 1);
    assert!(
        m1.peer_status.iter().all(|s| s.sync == "in sync"),
        "{:?}",
        m1.peer_status
    );
}

/// Kills node `dead` of `n` registrars and checks that exactly one survivor took its PEs over,
/// that every survivor moved them to that winner, and that the winner sent each PE an H=1
/// keep-alive at its ASAP address.
fn takeover_with(ids: &[u32], dead: usize, profile: Profile) -> usize {
    let mut net = Net::new(ids, profile, |c| {
        // The RFC's 61 s silence would make the test long for nothing: its arbitration is what
        // differs.
        c.max_time_last_heard = secs(5);
        c.peer_heartbeat_cycle = Duration::from_millis(2_444);
    });
    net.run_for(secs(12));
    net.register(dead, "P", 1..=20, 1);
    let other = (dead + 1) % ids.len();
    net.register(other, "P", 100..=101, 1);
    net.run_for(secs(5));
    for i in 0..ids.len() {
        assert_eq!(net.table(i).len(), 22, "node {i} before the kill");
    }
    let dead_id = net.id(dead);
    net.kill(dead);
    net.run_for(secs(30));
    let winners: Vec<usize> = (0..ids.len())
        .filter(|&i| i != dead && net.won(i).contains(&dead_id))
        .collect();
    assert_eq!(winners.len(), 1, "exactly one winner: {winners:?}");
    let w = winners[0];
    let winner_id = net.id(w);
    for i in (0..ids.len()).filter(|&i| i != dead) {
        let t = net.table(i);
        assert_eq!(t.len(), 22, "node {i} keeps every PE");
        assert!(
            t.iter().all(|(_, _, home)| *home != dead_id),
            "node {i}: {t:?}"
        );
        assert!(t.iter().filter(|(_, _, h)| *h == winner_id).count() >= 20);
        assert!(!net.nodes[i].enrp.peer_ids().contains(&dead_id));
    }
    // Each taken PE got the H=1 keep-alive at its ASAP address (the association's).
    let ka = &net.nodes[w].home_keep_alives;
    assert_eq!(ka.len(), 20, "{ka:?}");
    assert!(ka.iter().all(|(addr, _, _)| addr.port() == 40_000));
    let m = net.metrics(w).clone();
    assert_eq!(m.takeovers_of(TakeoverOutcome::Won), 1);
    w
}

#[test]
fn takeover_with_two_registrars_completes() {
    let w = takeover_with(&[0x100, 0x200], 0, Profile::Rsplib);
    assert_eq!(w, 1);
    takeover_with(&[0x100, 0x200], 1, Profile::Rfc);
}

#[test]
fn takeover_with_three_and_five_registrars() {
    takeover_with(&[0x100, 0x200, 0x300], 1, Profile::Rsplib);
    takeover_with(&[0x100, 0x200, 0x300, 0x400, 0x500], 2, Profile::Rsplib);
    takeover_with(&[0x100, 0x200, 0x300, 0x400, 0x500], 0, Profile::Rfc);
}

/// Two survivors detect the death at the same instant (no jitter): both start, and the
/// arbitration of the profile decides.
fn race(profile: Profile) -> (RegistrarId, bool) {
    let ids = [0x300, 0x100, 0x200];
    let mut net = Net::new(&ids, profile, |c| {
        c.peer_heartbeat_jitter = 0.0;
        c.max_time_last_heard = secs(5);
        c.peer_heartbeat_cycle = Duration::from_millis(2_444);
        c.mentor_discovery_timeout = secs(1);
    });
    net.run_for(secs(12));
    net.register(0, "P", 1..=5, 1);
    net.run_for(secs(3));
    net.kill(0);
    net.run_for(secs(30));
    let both_started = net.started_takeover(1) && net.started_takeover(2);
    let winners: Vec<usize> = [1, 2]
        .into_iter()
        .filter(|&i| !net.won(i).is_empty())
        .collect();
    assert_eq!(winners.len(), 1, "exactly one winner");
    let loser = 3 - winners[0];
    if both_started {
        assert!(net.nodes[loser]
            .events
            .iter()
            .any(|e| matches!(e, EnrpEvent::TakeoverLost { .. })));
    }
    for i in [1, 2] {
        assert!(net
            .table(i)
            .iter()
            .all(|(_, _, h)| *h == net.id(winners[0])));
    }
    (net.id(winners[0]), both_started)
}

#[test]
fn racing_takeovers_one_winner_per_profile() {
    let (w, raced) = race(Profile::Rsplib);
    assert!(raced, "both survivors started a takeover");
    assert_eq!(w, RegistrarId(0x100), "rsplib: the lower ID wins");
    let (w, raced) = race(Profile::Rfc);
    assert!(raced);
    assert_eq!(w, RegistrarId(0x200), "rfc: the higher ID wins");
}

#[test]
fn a_registrar_back_during_the_takeover_refutes_it() {
    let mut net = Net::new(&[0x100, 0x200, 0x300], Profile::Rsplib, |_| {});
    net.run_for(secs(12));
    net.register(2, "P", 1..=3, 1);
    net.run_for(secs(3));
    // Node 1 never acknowledges: node 0's takeover stays open until node 2 speaks again.
    net.loss = Some(Box::new(|from, _, kind| {
        from == 1 && kind == EnrpMessageType::InitTakeoverAck
    }));
    net.nodes[2].cut = true;
    let mut t = 0;
    while !net.started_takeover(0) && !net.started_takeover(1) && t < 400 {
        net.run_for(Duration::from_millis(50));
        t += 1;
    }
    net.nodes[2].cut = false;
    net.run_for(secs(10));
    let refuted: u64 = (0..2)
        .map(|i| net.metrics(i).takeovers_of(TakeoverOutcome::Refuted))
        .sum();
    assert!(refuted >= 1, "{:?}", net.nodes[0].events);
    for i in 0..3 {
        assert!(
            net.won(i).is_empty(),
            "node {i} won a takeover of a live registrar"
        );
        assert!(net.table(i).iter().all(|(_, _, h)| *h == net.id(2)));
    }
    assert!(net.nodes[0].enrp.peer_ids().contains(&net.id(2)));
}

#[test]
fn table_request_from_an_unknown_peer_is_rejected() {
    let mut net = Net::new(&[0x100], Profile::Rsplib, |_| {});
    net.register(0, "P", [1], 1);
    let m = EnrpMessage::HandleTableRequest(wenrp::HandleTableRequest {
        peers: wenrp::Peers {
            sender: RegistrarId(0xbad),
            receiver: net.id(0),
        },
        own_children_only: false,
    });
    net.inject(0, Source::Association(AssociationId(77)), &m);
    let t = std::iter::from_fn(|| net.nodes[0].enrp.poll_transmit())
        .find(|t| t.kind == EnrpMessageType::HandleTableResponse)
        .expect("an answer");
    assert_eq!(
        t.destination,
        EnrpDestination::Association(AssociationId(77))
    );
    let r = net.codec.decode::<EnrpMessage>(&t.bytes).unwrap().message;
    let EnrpMessage::HandleTableResponse(r) = r else {
        panic!()
    };
    assert!(r.reject && r.entries.is_empty());
}

#[test]
fn update_claiming_our_pe_is_refused_and_unknown_senders_ignored() {
    let mut net = Net::new(&[0x100, 0x200], Profile::Rsplib, |_| {});
    net.run_for(secs(12));
    net.register(0, "P", [1], 1);
    net.run_for(secs(1));
    let pool = PoolHandle::from("P");
    let mut pe = net.nodes[0]
        .reg
        .handlespace()
        .find(&pool, PoolElementId(1))
        .unwrap()
        .element()
        .clone();
    pe.home_registrar = net.id(1);
    let assoc = AssociationId(*net.pairs.values().next().unwrap());
    let update = |sender: RegistrarId, action| {
        EnrpMessage::HandleUpdate(wenrp::HandleUpdate {
            peers: wenrp::Peers {
                sender,
                receiver: RegistrarId(0x100),
            },
            takeover_suggested: false,
            action,
            pool_handle: pool.clone(),
            pool_element: pe.clone(),
        })
    };
    let sender = net.id(1);
    net.inject(
        0,
        Source::Association(assoc),
        &update(sender, UpdateAction::AddPe),
    );
    net.inject(
        0,
        Source::Association(assoc),
        &update(sender, UpdateAction::DelPe),
    );
    net.inject(
        0,
        Source::Association(assoc),
        &update(RegistrarId(0xbad), UpdateAction::DelPe),
    );
    net.drain(0);
    let e0 = &net.nodes[0].events;
    assert_eq!(
        e0.iter()
            .filter(|e| matches!(e, EnrpEvent::UpdateRefused { .. }))
            .count(),
        2,
        "{e0:?}"
    );
    assert!(e0.iter().any(|e| matches!(
        e,
        EnrpEvent::Ignored {
            message: "ENRP_HANDLE_UPDATE",
            ..
        }
    )));
    let still = net.nodes[0]
        .reg
        .handlespace()
        .find(&pool, PoolElementId(1))
        .unwrap();
    assert_eq!(still.home_registrar(), net.id(0));
}

#[test]
fn malformed_enrp_gets_an_error_and_disturbs_nobody() {
    let mut net = Net::new(&[0x100, 0x200], Profile::Rsplib, |_| {});
    net.run_for(secs(12));
    net.register(0, "P", [1], 1);
    // An unknown ENRP message type with action bits 01: "report".
    let bad = [0x4f, 0, 0, 12, 0, 0, 0, 1, 0, 0, 0, 0];
    let now = net.now;
    let n = &mut net.nodes[0];
    n.enrp.message(
        now,
        &mut n.reg,
        Source::Association(AssociationId(99)),
        &bad,
    );
    let t = std::iter::from_fn(|| net.nodes[0].enrp.poll_transmit())
        .find(|t| t.kind == EnrpMessageType::Error)
        .expect("ENRP_ERROR");
    assert_eq!(
        t.destination,
        EnrpDestination::Association(AssociationId(99))
    );
    // Truncated: dropped, counted.
    let n = &mut net.nodes[0];
    n.enrp.message(
        now,
        &mut n.reg,
        Source::Association(AssociationId(99)),
        &[1, 0, 0],
    );
    net.drain(0);
    let m = net.metrics(0).clone();
    assert_eq!(m.malformed, 2);
    net.run_for(secs(5));
    assert_eq!(net.table(1), net.table(0));
    assert_eq!(net.nodes[0].enrp.peer_ids(), vec![net.id(1)]);
}

#[test]
fn presence_carries_server_information_and_checksum() {
    let mut net = Net::new(&[0x100, 0x200], Profile::Rsplib, |_| {});
    net.register(0, "P", [1, 2], 1);
    net.run_for(secs(6));
    let codec = net.codec;
    let n = &mut net.nodes[0];
    let now = net.now;
    n.enrp.handle_timeout(now + secs(3), &mut n.reg);
    let t = std::iter::from_fn(|| net.nodes[0].enrp.poll_transmit())
        .find(|t| t.kind == EnrpMessageType::Presence)
        .expect("a PRESENCE");
    let EnrpMessage::Presence(p) = codec.decode::<EnrpMessage>(&t.bytes).unwrap().message else {
        panic!()
    };
    assert_eq!(
        p.checksum,
        net.nodes[0].reg.handlespace().checksum(net.id(0))
    );
    let info = p.server_information.expect("Server Information");
    assert_eq!(info.server_id, net.id(0));
    assert_eq!(info.transport.protocol, TransportProtocol::Sctp);
    let _ = net.profile;
}

#[test]
fn a_pe_taken_over_that_re_registers_first_is_adopted() {
    let mut net = Net::new(&[0x100, 0x200], Profile::Rsplib, |_| {});
    net.pes_answer = false;
    net.run_for(secs(12));
    net.register(0, "P", [1], 1);
    net.run_for(secs(2));
    net.kill(0);
    net.run_for(secs(12));
    assert_eq!(net.won(1), vec![net.id(0)]);
    let (addr, pool, id) = net.nodes[1].home_keep_alives[0].clone();
    // The PE answers its new home with a re-registration over the new association.
    let now = net.now;
    let codec = net.codec;
    let n = &mut net.nodes[1];
    n.reg.association_up(
        now,
        AssociationId(500),
        PeerInfo {
            kind: AssociationKind::Sctp,
            addresses: vec![addr.ip()],
            port: addr.port(),
        },
    );
    let m = AsapMessage::Registration(asap::Registration {
        pool_handle: pool.clone(),
        pool_element: pool_element(id.0, addr.ip()),
    });
    n.reg.message(
        now,
        AssociationId(500),
        Protocol::Asap.ppid(),
        &codec.encode(&m).unwrap(),
    );
    assert_eq!(n.reg.metrics().adopted, 1);
    let pe = n.reg.handlespace().find(&pool, id).unwrap();
    assert_eq!(pe.association(), Some(AssociationId(500)));
    assert_eq!(pe.home_registrar(), net.id(1));
    // Still there after the keep-alive timeout: the registration answered for it.
    net.run_for(secs(8));
    assert_eq!(net.table(1).len(), 1);
}

#[test]
fn presence_rate_at_rest_is_one_per_peer_and_cycle() {
    let mut net = Net::new(&[0x100, 0x200, 0x300], Profile::Rsplib, |_| {});
    net.run_for(secs(20));
    let before: Vec<u64> = (0..3)
        .map(|i| net.metrics(i).sent_of(EnrpMessageType::Presence))
        .collect();
    net.run_for(secs(100));
    for (i, b) in before.into_iter().enumerate() {
        let sent = net.metrics(i).sent_of(EnrpMessageType::Presence) - b;
        // Two peers, one PRESENCE each per 2.444 s cycle (±12.5 %): about 82 in 100 s.
        assert!(
            (70..=95).contains(&sent),
            "node {i}: {sent} PRESENCEs in 100 s"
        );
    }
}

#[test]
fn a_takeover_without_every_ack_is_abandoned_cleanly() {
    let mut net = Net::new(&[0x100, 0x200, 0x300], Profile::Rsplib, |_| {});
    net.run_for(secs(12));
    net.register(2, "P", 1..=3, 1);
    net.run_for(secs(3));
    // Node 1 never acknowledges anything.
    net.loss = Some(Box::new(|from, _, kind| {
        from == 1 && kind == EnrpMessageType::InitTakeoverAck
    }));
    net.kill(2);
    net.run_for(secs(40));
    let dead = net.id(2);
    for i in 0..2 {
        assert!(net.won(i).is_empty(), "node {i} won without every ack");
        // The PEs stay with their dead home until their life runs out.
        assert_eq!(net.table(i).len(), 3);
        assert!(net.table(i).iter().all(|(_, _, h)| *h == dead));
        assert!(!net.nodes[i].enrp.peer_ids().contains(&dead));
    }
    assert!(net.nodes[0].events.iter().any(
        |e| matches!(e, EnrpEvent::TakeoverAbandoned { missing, .. } if missing == &vec![net.id(1)])
    ));
    assert_eq!(net.metrics(0).takeovers_of(TakeoverOutcome::Abandoned), 1);
    assert!(net.nodes[0].home_keep_alives.is_empty());
}

#[test]
fn limits_on_peers_and_pes_per_peer_are_reported() {
    let mut net = Net::new(&[0x100, 0x200, 0x300], Profile::Rsplib, |c| {
        c.max_peers = 1;
        c.max_pool_elements_per_peer = 5;
    });
    net.run_for(secs(12));
    net.register(1, "P", 1..=10, 1);
    net.run_for(secs(12));
    let m0 = net.metrics(0);
    assert_eq!(m0.peers, 1, "node 0 keeps one peer");
    assert!(m0.limits_hit >= 1);
    let e0 = &net.nodes[0].events;
    assert!(e0
        .iter()
        .any(|e| matches!(e, EnrpEvent::LimitReached { what, .. } if what.starts_with("peers"))));
    // Whoever learned node 1's PEs holds at most 5 of them, and said so.
    for i in [0, 2] {
        let held = net
            .table(i)
            .iter()
            .filter(|(_, _, h)| *h == net.id(1))
            .count();
        assert!(held <= 5, "node {i} holds {held}");
    }
    assert!((0..3).any(|i| net.nodes[i].events.iter().any(
        |e| matches!(e, EnrpEvent::LimitReached { what, .. } if what.starts_with("PEs per peer"))
    )));
}

#[test]
fn a_healed_partition_ends_with_equal_handlespaces() {
    let mut net = Net::new(&[0x100, 0x200, 0x300], Profile::Rsplib, |_| {});
    net.run_for(secs(12));
    net.register(0, "P", 1..=5, 1);
    net.run_for(secs(2));
    // Node 2 is cut off for less than a peer may be silent: no takeover, but it misses updates.
    net.nodes[2].cut = true;
    net.register(0, "P", 6..=8, 1);
    net.deregister(0, "P", 1);
    net.register(1, "P", [20], 1);
    net.run_for(secs(3));
    assert_ne!(net.table(2), net.table(0));
    net.nodes[2].cut = false;
    net.run_for(secs(10));
    for i in 0..3 {
        assert!(net.won(i).is_empty());
        assert_eq!(net.table(i), net.table(0), "node {i}");
    }
    assert_eq!(net.table(0).len(), 8);
    assert!(net.metrics(2).audit_mismatches >= 1);
}

#[test]
fn takeover_suggestion_when_turned_on() {
    // Off (the default): no T flag, nothing taken over.
    let mut net = Net::new(&[0x100, 0x200], Profile::Rsplib, |_| {});
    net.run_for(secs(12));
    net.register(0, "P", [1], 1);
    net.run_for(secs(2));
    assert!(net.nodes[1].home_keep_alives.is_empty());
    // On: PE 1 suits 0x200 better (0x200 ^ 1 > 0x100 ^ 1), which takes it over with H=1.
    let mut net = Net::new(&[0x100, 0x200], Profile::Rsplib, |c| {
        c.takeover_suggestion = true
    });
    net.run_for(secs(12));
    net.register(0, "P", [1], 1);
    net.run_for(secs(2));
    let ka = &net.nodes[1].home_keep_alives;
    assert_eq!(ka.len(), 1);
    assert_eq!(ka[0].2, PoolElementId(1));
    let pe = net.nodes[1]
        .reg
        .handlespace()
        .find(&PoolHandle::from("P"), PoolElementId(1))
        .unwrap();
    assert_eq!(pe.home_registrar(), net.id(1));
    assert!(
        pe.association().is_some(),
        "the PE answered and was adopted"
    );
}

/// A visitor that joins only to read the table (as `rserpool dump` and RSPLIB's `hsdump` do) is
/// forgotten when its association closes; a peer whose PEs we hold is not, nor a static one.
#[test]
fn a_visitor_that_owns_no_pes_leaves_the_peer_table_with_its_association() {
    let mut net = Net::new(&[0x100, 0x200, 0x300], Profile::Rsplib, |_| {});
    net.run_for(secs(12));
    net.register(0, "P", 1..=3, 1);
    net.register(2, "P", [4], 1);
    net.run_for(secs(1));
    let before = net.nodes[0].enrp.peer_ids();
    assert_eq!(before, vec![net.id(1), net.id(2)]);
    let visitor = RegistrarId(0xd00d);
    let a = AssociationId(4242);
    let ids = wenrp::Peers {
        sender: visitor,
        receiver: RegistrarId(0),
    };
    net.inject(
        0,
        Source::Association(a),
        &EnrpMessage::Presence(wenrp::Presence {
            peers: ids,
            reply_required: true,
            checksum: rserpool_wire::PeChecksum(0xffff),
            server_information: None,
        }),
    );
    net.inject(
        0,
        Source::Association(a),
        &EnrpMessage::HandleTableRequest(wenrp::HandleTableRequest {
            peers: ids,
            own_children_only: false,
        }),
    );
    let answer = std::iter::from_fn(|| net.nodes[0].enrp.poll_transmit())
        .find(|t| t.kind == EnrpMessageType::HandleTableResponse)
        .expect("a handle table response");
    let EnrpMessage::HandleTableResponse(r) = net
        .codec
        .decode::<EnrpMessage>(&answer.bytes)
        .unwrap()
        .message
    else {
        panic!("not a response")
    };
    assert!(!r.reject, "the visitor is a peer now");
    assert_eq!(
        r.entries
            .iter()
            .map(|e| e.pool_elements.len())
            .sum::<usize>(),
        4
    );
    assert!(net.nodes[0].enrp.peer_ids().contains(&visitor));
    let now = net.now;
    let n = &mut net.nodes[0];
    n.enrp.association_down(now, &mut n.reg, a);
    assert_eq!(
        net.nodes[0].enrp.peer_ids(),
        before,
        "the visitor is gone at once"
    );
    net.drain(0);
    assert!(net.nodes[0].events.iter().any(|e| matches!(
        e,
        EnrpEvent::PeerDown { peer, .. } if *peer == visitor
    )));
    // The association to node 2, whose PE node 0 holds, going down changes nothing: it is
    // reached by address again. Node 1 owns nothing and is forgotten too (for node 0 it is not
    // static: node 0 is its mentor, not the other way round), and comes back with its next
    // PRESENCE (RFC 5353 §3.2).
    let to_2 = AssociationId(net.pairs[&(0, 2)]);
    let now = net.now;
    let n = &mut net.nodes[0];
    n.enrp.association_down(now, &mut n.reg, to_2);
    assert!(net.nodes[0].enrp.peer_ids().contains(&net.id(2)));
    let to_1 = AssociationId(net.pairs[&(0, 1)]);
    let now = net.now;
    let n = &mut net.nodes[0];
    n.enrp.association_down(now, &mut n.reg, to_1);
    assert!(!net.nodes[0].enrp.peer_ids().contains(&net.id(1)));
    net.run_for(secs(5));
    assert_eq!(net.nodes[0].enrp.peer_ids(), before, "node 1 is back");
    assert_eq!(net.table(1), net.table(0), "and nothing was lost");
}

/// A stranger's ASAP_DEREGISTRATION of a PE homed at another registrar is refused with
/// "rejected due to security considerations" and removes nothing anywhere (RFC 5355 §3.3): the
/// PE deregisters with its home, over its own association. Found by the simulator's hostile
/// hosts (`owner_only`, seed 174 of `scripts/sim`).
#[test]
fn a_stranger_cannot_deregister_a_pe_homed_elsewhere() {
    let mut net = Net::new(&[0x100, 0x200], Profile::Rsplib, |_| {});
    net.run_for(secs(12));
    net.register(0, "P", [1], 1);
    net.run_for(secs(1));
    assert_eq!(net.table(1).len(), 1, "{:?}", net.table(1));
    let now = net.now;
    let stranger = AssociationId(9_999);
    let n = &mut net.nodes[1];
    n.reg.association_up(
        now,
        stranger,
        PeerInfo {
            kind: AssociationKind::Sctp,
            addresses: vec!["10.66.0.1".parse().unwrap()],
            port: 5000,
        },
    );
    let m = AsapMessage::Deregistration(asap::Deregistration {
        pool_handle: PoolHandle::from("P"),
        pe_id: PoolElementId(1),
    });
    let b = net.codec.encode(&m).unwrap();
    let n = &mut net.nodes[1];
    n.reg.message(now, stranger, Protocol::Asap.ppid(), &b);
    let mut answers = Vec::new();
    while let Some(t) = n.reg.poll_transmit() {
        if t.destination == rserpool_registrar::Destination::Association(stranger) {
            answers.push(net.codec.decode::<AsapMessage>(&t.bytes).unwrap().message);
        }
    }
    assert!(
        matches!(&answers[..], [AsapMessage::DeregistrationResponse(d)]
            if d.error.as_ref().and_then(|e| e.code()) == Some(rserpool_wire::CauseCode::RejectedSecurity)),
        "{answers:?}"
    );
    assert_eq!(
        n.reg
            .metrics()
            .refusals_by(rserpool_registrar::SecurityRefusal::ForeignDeregistration),
        1
    );
    net.run_for(secs(2));
    for i in 0..2 {
        assert_eq!(net.table(i).len(), 1, "node {i}: {:?}", net.table(i));
    }
}

/// A stranger's ASAP_REGISTRATION of a PE identifier homed at another registrar, from an
/// address the PE's ASAP transport does not have, is refused (RFC 5355 §3.3, registration
/// spoofing): the PE keeps its home and its transport everywhere. The PE itself, from its own
/// address, may still move. Found by the simulator's hostile hosts (`owner_only`, seed 313).
#[test]
fn a_stranger_cannot_register_a_pe_homed_elsewhere_but_the_pe_may_move() {
    let mut net = Net::new(&[0x100, 0x200], Profile::Rsplib, |_| {});
    net.run_for(secs(12));
    net.register(0, "P", [1], 1);
    net.run_for(secs(1));
    let before = net.table(1);
    assert_eq!(before, vec![(PoolHandle::from("P"), 1, net.id(0))]);
    let now = net.now;
    let pe_ip: IpAddr = net.nodes[1]
        .reg
        .handlespace()
        .find(&PoolHandle::from("P"), PoolElementId(1))
        .and_then(|e| e.element().asap_transport.as_ref().map(|t| t.addresses[0]))
        .expect("an ASAP transport");
    let register_from = |net: &mut Net, id: u64, ip: IpAddr| {
        let a = AssociationId(id);
        let n = &mut net.nodes[1];
        n.reg.association_up(
            now,
            a,
            PeerInfo {
                kind: AssociationKind::Sctp,
                addresses: vec![ip],
                port: 5000,
            },
        );
        let m = AsapMessage::Registration(asap::Registration {
            pool_handle: PoolHandle::from("P"),
            pool_element: pool_element(1, ip),
        });
        let b = net.codec.encode(&m).unwrap();
        let n = &mut net.nodes[1];
        n.reg.message(now, a, Protocol::Asap.ppid(), &b);
        let mut answers = Vec::new();
        while let Some(t) = n.reg.poll_transmit() {
            if t.destination == rserpool_registrar::Destination::Association(a) {
                answers.push(net.codec.decode::<AsapMessage>(&t.bytes).unwrap().message);
            }
        }
        answers
    };
    let answers = register_from(&mut net, 9_999, "10.66.0.1".parse().unwrap());
    assert!(
        matches!(&answers[..], [AsapMessage::RegistrationResponse(r)]
            if r.reject && r.error.as_ref().and_then(|e| e.code()) == Some(rserpool_wire::CauseCode::RejectedSecurity)),
        "{answers:?}"
    );
    assert_eq!(
        net.nodes[1]
            .reg
            .metrics()
            .refusals_by(rserpool_registrar::SecurityRefusal::ForeignRegistration),
        1
    );
    assert_eq!(net.table(1), before, "the impostor moved nothing");
    // The PE itself, from its own address, moves its home here.
    let answers = register_from(&mut net, 9_998, pe_ip);
    assert!(
        matches!(&answers[..], [AsapMessage::RegistrationResponse(r)] if !r.reject),
        "{answers:?}"
    );
    assert_eq!(net.table(1), vec![(PoolHandle::from("P"), 1, net.id(1))]);
}
