//! The network layer's transport semantics: which hosts run the TCP mapping, which are
//! multi-homed, when an association's path works, path cuts and SCTP failover, keep-alive
//! loss of a paused TCP-mapped host, and what the peers of a restarted host see (SCTP_RESTART,
//! ABORT, RST).

use super::*;

/// The first address of a hostile host: 10.66.0.(n + 1).
const HOSTILE_NET: [u8; 2] = [10, 66];

impl World {
    /// Draws (from `net_rng`, never from `rng`) which hosts are TCP-only and which SCTP hosts
    /// have a second address, and sets up the hostile hosts.
    pub(super) fn build_net(&mut self) {
        // A pool's PEs all offer the same user transport (a registrar refuses a PE whose
        // transport type differs from its pool's, RFC 5351 §2.2 / RFC 5352 §3.1), so PEs lack
        // SCTP per pool: PE j is in pool j % pools.
        let share = self.cfg.tcp_share.clamp(0.0, 1.0);
        let pools = self.pools.len().max(1);
        let n = self.regs.len();
        let tcp_pools: BTreeSet<usize> = match self.cfg.transports {
            Transports::Sctp => BTreeSet::new(),
            Transports::PerHost => {
                for h in self.hosts() {
                    if !matches!(h, HostId::PoolElement(_)) && self.net_rng.random_bool(share) {
                        self.tcp_only.insert(h);
                    }
                }
                (0..pools)
                    .filter(|_| self.net_rng.random_bool(share))
                    .collect()
            }
            Transports::PerRegistrar => {
                // A registrar without SCTP, the PUs that start their hunt with it, and the
                // pool it serves first.
                for i in 0..n {
                    if self.net_rng.random_bool(share) {
                        self.tcp_only.insert(HostId::Registrar(i));
                    }
                }
                for k in 0..self.pus.len() {
                    if self.tcp_only.contains(&HostId::Registrar(k % n)) {
                        self.tcp_only.insert(HostId::PoolUser(k));
                    }
                }
                (0..pools)
                    .filter(|p| self.tcp_only.contains(&HostId::Registrar(p % n)))
                    .collect()
            }
        };
        for j in 0..self.pes.len() {
            if tcp_pools.contains(&(j % pools)) {
                self.tcp_only.insert(HostId::PoolElement(j));
            }
        }
        let m = self.cfg.multihomed_share.clamp(0.0, 1.0);
        if m > 0.0 {
            for h in self.hosts() {
                if self.tcp_only.contains(&h) || !self.net_rng.random_bool(m) {
                    continue;
                }
                let ip = match h {
                    HostId::Registrar(i) => Ipv4Addr::new(10, 100, 0, i as u8 + 1),
                    HostId::PoolElement(j) => {
                        Ipv4Addr::new(10, 101, (j / 250) as u8, (j % 250) as u8 + 1)
                    }
                    HostId::PoolUser(k) => {
                        Ipv4Addr::new(10, 102, (k / 250) as u8, (k % 250) as u8 + 1)
                    }
                    HostId::Hostile(_) => continue,
                };
                let ip = IpAddr::V4(ip);
                self.second_ip.insert(h, ip);
                self.by_ip.insert(ip, h);
            }
        }
        for n in 0..self.cfg.hostile {
            let ip = IpAddr::V4(Ipv4Addr::new(
                HOSTILE_NET[0],
                HOSTILE_NET[1],
                (n / 250) as u8,
                (n % 250) as u8 + 1,
            ));
            let h = HostId::Hostile(n);
            let d = self
                .net_rng
                .random_range(0..=self.cfg.link.host_delay_max.as_nanos() as u64);
            self.host_delay.insert(h, Duration::from_nanos(d));
            self.by_ip.insert(ip, h);
            self.hostiles.push(hostile::HostileHost::new(ip));
            let at = self.uniform_net(Duration::from_secs(2), Duration::from_secs(6));
            self.schedule(at, Ev::Hostile(n));
        }
        if !self.tcp_only.is_empty() || !self.second_ip.is_empty() {
            let tcp: Vec<String> = self.tcp_only.iter().map(|h| h.to_string()).collect();
            let multi: Vec<String> = self
                .second_ip
                .iter()
                .map(|(h, ip)| format!("{h} {ip}"))
                .collect();
            self.note(|| format!("TCP mapping: {tcp:?}; second addresses: {multi:?}"));
        }
    }

    /// A link's delay as [`World::delay`] draws it, from the network's own random stream.
    pub(super) fn delay_net(&mut self, a: HostId, b: HostId) -> Duration {
        let base = self.cfg.link.delay_min + self.host_delay[&a] + self.host_delay[&b];
        let j = self.cfg.link.jitter;
        base + self.uniform_net(Duration::ZERO, j)
    }

    /// A uniform duration from the network's own random stream.
    pub(super) fn uniform_net(&mut self, lo: Duration, hi: Duration) -> Duration {
        if hi <= lo {
            return lo;
        }
        Duration::from_nanos(
            self.net_rng
                .random_range(lo.as_nanos() as u64..hi.as_nanos() as u64),
        )
    }

    /// Whether host `h` has no SCTP (it uses the TCP mapping).
    pub(super) fn is_tcp(&self, h: HostId) -> bool {
        self.tcp_only.contains(&h)
    }

    /// Every address of host `h`, the primary first.
    pub(super) fn host_ips(&self, h: HostId) -> Vec<IpAddr> {
        let primary = match h {
            HostId::Registrar(i) => self.regs[i].ip,
            HostId::PoolElement(j) => self.pes[j].ip,
            HostId::PoolUser(k) => self.pus[k].ip,
            HostId::Hostile(n) => self.hostiles[n].ip,
        };
        std::iter::once(primary)
            .chain(self.second_ip.get(&h).copied())
            .collect()
    }

    fn ip_up(&self, ip: IpAddr) -> bool {
        !self.cut_ips.contains_key(&ip)
    }

    /// Whether two hosts can exchange datagrams: the same side of any partition, and each with
    /// an address that is not cut.
    pub(super) fn host_reachable(&self, a: HostId, b: HostId) -> bool {
        !self.cut(a, b)
            && (self.cut_ips.is_empty()
                || (self.host_ips(a).into_iter().any(|ip| self.ip_up(ip))
                    && self.host_ips(b).into_iter().any(|ip| self.ip_up(ip))))
    }

    /// Whether association `id` has a working path: the ends on the same side of any partition,
    /// and for SCTP any address of each end up (RFC 9260 §6.4: multi-homing, failover to an
    /// alternate path), for the TCP mapping its one address pair.
    pub(super) fn reachable(&self, id: u64) -> bool {
        let Some(a) = self.assocs.get(&id) else {
            return false;
        };
        if self.cut(a.ends[0], a.ends[1]) {
            return false;
        }
        if self.cut_ips.is_empty() {
            return true;
        }
        if a.tcp || self.cfg.mutation == Some(Mutation::NoPathFailover) {
            self.ip_up(a.addrs[0].ip()) && self.ip_up(a.addrs[1].ip())
        } else {
            a.ends
                .iter()
                .all(|h| self.host_ips(*h).into_iter().any(|ip| self.ip_up(ip)))
        }
    }

    /// An association is about to be declared lost for want of connectivity: if it is SCTP,
    /// neither end may have had a working address all along the cut, or multi-homing failed
    /// (`failover_keeps_association`, RFC 9260 §6.4: an association survives while one path
    /// works). Judged from the addresses alone, not by [`World::reachable`].
    pub(super) fn check_failover(&mut self, id: u64) {
        let Some(a) = self.assocs.get(&id) else {
            return;
        };
        if a.tcp || self.second_ip.is_empty() || self.cut(a.ends[0], a.ends[1]) {
            return;
        }
        self.stats.checks += 1;
        let since = a.cut_since.unwrap_or(self.now);
        // An address counts as working if it was not cut at any time since the association's
        // cut began (cuts of one address at a time, so a host keeps one).
        let working = |h: HostId| {
            self.host_ips(h)
                .into_iter()
                .any(|ip| self.cut_ips.get(&ip).is_none_or(|&t| t > since))
        };
        if a.ends.iter().all(|h| working(*h)) {
            let (x, y) = (a.ends[0], a.ends[1]);
            let msg = format!(
                "SCTP association #{id} between {x} and {y} is lost although both kept a working address since {since:?} (no path failover)"
            );
            self.fail("failover_keeps_association", msg);
        }
    }

    /// The extra time a message on an SCTP association takes while its primary path is cut and
    /// an alternate one works: one retransmission timeout, after which the retransmission goes
    /// to the alternate address (RFC 9260 §6.4.1).
    pub(super) fn failover_cost(&self, id: u64) -> Duration {
        let Some(a) = self.assocs.get(&id) else {
            return Duration::ZERO;
        };
        if a.tcp || self.cut_ips.is_empty() {
            return Duration::ZERO;
        }
        if self.ip_up(a.addrs[0].ip()) && self.ip_up(a.addrs[1].ip()) {
            Duration::ZERO
        } else {
            // Counted by the caller's send.
            self.cfg.link.retransmission_timeout
        }
    }

    /// How long association `id` survives without connectivity: SCTP's heartbeat limit, or the
    /// TCP mapping's keep-alive timeout.
    pub(super) fn assoc_timeout(&self, id: u64) -> Duration {
        if self.assocs.get(&id).is_some_and(|a| a.tcp) {
            self.cfg.link.tcp_keepalive_timeout
        } else {
            self.cfg.link.association_timeout
        }
    }

    /// The address a TCP connection to `to` goes to: the first of `given` that belongs to `to`
    /// and is not cut, and how many were tried before it (each costs a connect timeout).
    pub(super) fn tcp_target(&self, to: HostId, given: &[SocketAddr]) -> (SocketAddr, u32) {
        let mine: Vec<SocketAddr> = given
            .iter()
            .filter(|a| self.by_ip.get(&a.ip()) == Some(&to))
            .copied()
            .collect();
        for (n, a) in mine.iter().enumerate() {
            if self.ip_up(a.ip()) {
                return (*a, n as u32);
            }
        }
        match mine.first() {
            Some(a) => (*a, mine.len().saturating_sub(1) as u32),
            None => (
                given
                    .first()
                    .copied()
                    .unwrap_or(SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 0)),
                0,
            ),
        }
    }

    /// The source address of a TCP connection from `h`: its primary address, or its second
    /// one while the primary is cut.
    pub(super) fn source_addr(&self, h: HostId, primary: SocketAddr) -> SocketAddr {
        match self.second_ip.get(&h) {
            Some(ip) if !self.ip_up(primary.ip()) => SocketAddr::new(*ip, primary.port()),
            _ => primary,
        }
    }

    /// What a registrar learns of the peer of association `id` (seen from `side`): SCTP with
    /// all the peer's addresses, or the TCP mapping with the one it connected from.
    pub(super) fn peer_info(&self, id: u64, side: usize) -> PeerInfo {
        let a = &self.assocs[&id];
        let peer = a.addrs[1 - side];
        if a.tcp {
            PeerInfo {
                kind: AssociationKind::TcpMapped,
                addresses: vec![peer.ip()],
                port: peer.port(),
            }
        } else {
            let mut addresses = self.host_ips(a.ends[1 - side]);
            if !addresses.contains(&peer.ip()) {
                addresses.insert(0, peer.ip());
            }
            PeerInfo {
                kind: AssociationKind::Sctp,
                addresses,
                port: peer.port(),
            }
        }
    }

    /// The addresses host `h` offers for its user transport or ENRP endpoint.
    pub(super) fn transport_of(
        &self,
        h: HostId,
        port: u16,
        transport_use: TransportUse,
    ) -> TransportAddress {
        let ips = self.host_ips(h);
        if self.is_tcp(h) {
            TransportAddress {
                protocol: rserpool_wire::TransportProtocol::Tcp,
                port,
                transport_use,
                addresses: vec![ips[0]],
            }
        } else {
            TransportAddress::sctp(port, transport_use, ips)
        }
    }

    // ----- Path faults -----

    /// Whether some hosts cannot reach each other now: a partition, or a cut address (for a
    /// TCP-mapped peer of a multi-homed host, a cut primary address is a partition).
    pub(super) fn cut_somewhere(&self) -> bool {
        self.partition_active || !self.cut_ips.is_empty()
    }

    /// Whether a path fault can be injected: some host is multi-homed.
    pub(super) fn path_cut_possible(&self) -> bool {
        self.cfg.faults.path_cuts && !self.second_ip.is_empty()
    }

    /// Cuts one address of a multi-homed host for 2–40 s.
    pub(super) fn cut_path(&mut self) {
        let hosts: Vec<HostId> = self.second_ip.keys().copied().collect();
        let h = hosts[self.net_rng.random_range(0..hosts.len())];
        let ips = self.host_ips(h);
        let ip = ips[self.net_rng.random_range(0..ips.len())];
        if self.cut_ips.contains_key(&ip) {
            return;
        }
        // One address of a host at a time: the other stays, or it would be a host cut.
        if ips.iter().any(|x| self.cut_ips.contains_key(x)) {
            return;
        }
        let now = self.now;
        self.cut_ips.insert(ip, now);
        self.stats.path_cuts += 1;
        self.note(|| format!("PATH CUT {h} {ip}"));
        self.hash(11, 0, &ip.to_string().into_bytes());
        self.mark_unreachable();
        let back = self.uniform_net(Duration::from_secs(2), Duration::from_secs(40));
        self.schedule(now + back, Ev::HealPath(ip));
    }

    /// Every association that is up and has lost its last path starts the wait after which it
    /// is reported lost (a partition or a path cut just began).
    pub(super) fn mark_unreachable(&mut self) {
        let now = self.now;
        let ids: Vec<u64> = self.assocs.keys().copied().collect();
        for id in ids {
            let a = &self.assocs[&id];
            if a.state == AssocState::Up && a.cut_since.is_none() && !self.reachable(id) {
                self.assocs.get_mut(&id).expect("present").cut_since = Some(now);
                let t = now + self.assoc_timeout(id);
                self.schedule(t, Ev::CheckCut(id));
            }
        }
    }

    /// A cut address comes back: associations with a path again move what they queued.
    pub(super) fn heal_path(&mut self, ip: IpAddr) {
        if self.cut_ips.remove(&ip).is_none() {
            return;
        }
        self.note(|| format!("PATH HEAL {ip}"));
        self.hash(12, 0, &ip.to_string().into_bytes());
        self.settle_until = self.settle_until.max(self.now + PARTITION_SETTLE);
        self.resume_reachable();
    }

    /// Every association marked cut that has a path again delivers what waited.
    pub(super) fn resume_reachable(&mut self) {
        let now = self.now;
        let ids: Vec<u64> = self
            .assocs
            .iter()
            .filter(|(_, a)| a.cut_since.is_some())
            .map(|(id, _)| *id)
            .collect();
        for id in ids {
            if !self.reachable(id) {
                continue;
            }
            let a = self.assocs.get_mut(&id).expect("present");
            a.cut_since = None;
            if a.state != AssocState::Up {
                continue;
            }
            let mut due = Vec::new();
            for side in 0..2 {
                for (t, _) in a.queues[side].iter_mut() {
                    *t = (*t).max(now);
                    due.push((*t, side));
                }
            }
            for (t, side) in due {
                self.schedule(t, Ev::Deliver { assoc: id, side });
            }
        }
    }

    /// Ends every partition and path cut at once (end of the chaos phase).
    pub(super) fn heal_all_paths(&mut self) {
        let ips: Vec<IpAddr> = self.cut_ips.keys().copied().collect();
        for ip in ips {
            self.heal_path(ip);
        }
    }

    // ----- The TCP mapping's keep-alives -----

    /// A host was paused: its TCP-mapped associations hear no keep-alive answers from it, so
    /// their peers give up after the keep-alive timeout (SCTP heartbeats are the kernel's and
    /// go on).
    pub(super) fn paused_tcp(&mut self, h: HostId) {
        self.paused_since.insert(h, self.now);
        let due = self.now + self.cfg.link.tcp_keepalive_timeout;
        let ids: Vec<u64> = self
            .assocs
            .iter()
            .filter(|(_, a)| a.tcp && a.state == AssocState::Up && a.ends.contains(&h))
            .map(|(id, _)| *id)
            .collect();
        for id in ids {
            self.schedule(due, Ev::KeepAliveDue(id, h));
        }
    }

    /// The keep-alive timeout of a paused host's TCP-mapped association: if the host is still
    /// paused since before it, the peer resets the connection (its report comes at once, the
    /// paused end's when it resumes).
    pub(super) fn keep_alive_due(&mut self, id: u64, h: HostId) {
        let still = self.paused.get(&h).is_some_and(|&t| t > self.now)
            && self
                .paused_since
                .get(&h)
                .is_some_and(|&t| t + self.cfg.link.tcp_keepalive_timeout <= self.now);
        let Some(a) = self.assocs.get_mut(&id) else {
            return;
        };
        if !still || a.state != AssocState::Up {
            return;
        }
        a.state = AssocState::Closed;
        a.queues = [VecDeque::new(), VecDeque::new()];
        let me = a.ends.iter().position(|x| *x == h).unwrap_or(0);
        self.stats.associations_timed_out += 1;
        self.note(|| format!("association #{id} lost: {h} paused past the TCP keep-alive timeout"));
        // The peer decides now; the paused end reads the reset when it resumes.
        self.on_down(id, 1 - me);
        self.schedule(
            self.now,
            Ev::Down {
                assoc: id,
                side: me,
            },
        );
    }

    // ----- Restarts -----

    /// Old associations that a new association `id` from a restarted host restarts at its peer:
    /// half-open ones between the same two hosts and addresses. SCTP reports them down when
    /// the new one comes up (SCTP_RESTART); TCP resets them when the SYN arrives (the peer's
    /// challenge ACK draws the new stack's RST) and the connection follows one SYN
    /// retransmission (1 s) later. Returns the extra time the establishment takes.
    pub(super) fn restart_at_peer(&mut self, id: u64) -> Duration {
        if !self.cfg.restarts || self.cfg.mutation == Some(Mutation::SilentRestart) {
            return Duration::ZERO;
        }
        let a = &self.assocs[&id];
        let (x, y) = (a.ends[0], a.ends[1]);
        let pair = sorted(a.addrs);
        let (service, tcp) = (a.service, a.tcp);
        let old: Vec<u64> = self
            .assocs
            .iter()
            .filter(|(o, b)| {
                **o != id
                    && b.service == service
                    && b.half_open
                        .is_some_and(|dead| b.ends[dead] == x && b.ends[1 - dead] == y)
                    && sorted(b.addrs) == pair
            })
            .map(|(o, _)| *o)
            .collect();
        if old.is_empty() {
            return Duration::ZERO;
        }
        if tcp {
            let at = self.now + self.delay_net(x, y);
            self.stats.restarts_seen += old.len() as u64;
            for o in old {
                let b = self.assocs.get_mut(&o).expect("present");
                let dead = b.half_open.take().expect("half open");
                self.note(|| format!("association #{o} reset: {x} restarted and connects again"));
                self.schedule(
                    at,
                    Ev::Down {
                        assoc: o,
                        side: 1 - dead,
                    },
                );
            }
            Duration::from_secs(1)
        } else {
            self.assocs.get_mut(&id).expect("present").restarts = old;
            Duration::ZERO
        }
    }

    /// The new association `id` is up: the SCTP associations it restarts are reported down at
    /// the peer first (our transport reports SCTP_RESTART as the old association down with
    /// `PeerRestarted`, then a new one up), and the peer must hold nothing of them any more
    /// (`restart_forgets_old`).
    pub(super) fn restarted_at_peer(&mut self, id: u64) {
        if !self.cfg.restarts {
            return;
        }
        let a = &self.assocs[&id];
        let (x, y) = (a.ends[0], a.ends[1]);
        let pair = sorted(a.addrs);
        let service = a.service;
        let old = std::mem::take(&mut self.assocs.get_mut(&id).expect("present").restarts);
        for o in old {
            let Some(dead) = self.assocs.get_mut(&o).and_then(|b| b.half_open.take()) else {
                continue;
            };
            self.stats.restarts_seen += 1;
            self.note(|| format!("{y}: association #{o} restarted by {x} (SCTP_RESTART)"));
            self.on_down(o, 1 - dead);
        }
        // Whatever the transport, the peer must have let go of the previous incarnation's
        // association over the same addresses by now.
        let stale: Vec<u64> = self
            .assocs
            .iter()
            .filter(|(o, b)| {
                **o != id
                    && b.service == service
                    && b.half_open.is_some_and(|dead| {
                        b.ends[dead] == x && b.ends[1 - dead] == y && !b.down_seen[1 - dead]
                    })
                    && sorted(b.addrs) == pair
            })
            .map(|(o, _)| *o)
            .collect();
        if let Some(o) = stale.first() {
            let msg = format!(
                "{x} restarted and its association #{id} to {y} came up while {y} still holds #{o} of its previous incarnation over the same addresses"
            );
            self.fail("restart_forgets_old", msg);
            return;
        }
        if let HostId::Registrar(i) = y {
            let old: BTreeSet<u64> = self
                .assocs
                .iter()
                .filter(|(o, b)| {
                    **o != id
                        && b.half_open.is_none()
                        && b.down_seen.iter().any(|d| *d)
                        && b.ends.contains(&x)
                        && b.ends.contains(&y)
                        && b.incs[b.ends.iter().position(|e| *e == x).unwrap_or(0)] != self.inc(x)
                })
                .map(|(o, _)| *o)
                .collect();
            let mut broken = None;
            if let Some(c) = self.regs[i].core.as_ref() {
                'scan: for pool in c.0.handlespace().pools() {
                    for e in pool.elements() {
                        if let Some(assoc) = e.association().filter(|a| old.contains(&a.0)) {
                            broken = Some(format!(
                                "R{i} still lists {} in {} over association #{} of {x}'s previous incarnation after it restarted",
                                e.id(),
                                e.pool_handle(),
                                assoc.0
                            ));
                            break 'scan;
                        }
                    }
                }
            }
            if let Some(msg) = broken {
                self.fail("restart_forgets_old", msg);
            }
        }
    }

    /// A message sent on an association whose other end crashed: if that host has restarted,
    /// its kernel answers with an ABORT (SCTP, RFC 9260 §8.4 "out of the blue") or a RST
    /// (TCP), so the sender learns one round trip later that the association is gone.
    pub(super) fn send_to_restarted(&mut self, id: u64, from: HostId) {
        if !self.cfg.restarts || self.cfg.mutation == Some(Mutation::SilentRestart) {
            return;
        }
        let a = &self.assocs[&id];
        let Some(dead) = a.half_open else { return };
        let me = 1 - dead;
        let (peer, inc) = (a.ends[dead], a.incs[dead]);
        if a.ends[me] != from || !self.alive(peer) || self.inc(peer) == inc || !self.reachable(id) {
            return;
        }
        let rtt = self.delay_net(from, peer) + self.delay_net(peer, from);
        self.stats.restart_aborts += 1;
        self.assocs.get_mut(&id).expect("present").half_open = None;
        let what = if self.assocs[&id].tcp {
            "a RST"
        } else {
            "an ABORT"
        };
        self.note(|| format!("{peer} (restarted) answers #{id} with {what}"));
        self.schedule(
            self.now + rtt,
            Ev::Down {
                assoc: id,
                side: me,
            },
        );
    }
}

/// An address pair in a fixed order (associations are the same whichever end opened them).
fn sorted(a: [SocketAddr; 2]) -> [SocketAddr; 2] {
    if a[0] <= a[1] {
        a
    } else {
        [a[1], a[0]]
    }
}
