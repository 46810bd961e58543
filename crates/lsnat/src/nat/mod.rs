//! NAT mode: the kernel moves the packets, the gateway decides.
//!
//! The gateway owns one nftables table per address family its listeners use (`nat.table`:
//! family `ip` for IPv4 listeners, family `ip6` of the same name for IPv6 ones; members are of
//! their listener's family, as DNAT cannot translate between families). New sessions to a virtual
//! address are translated (DNAT, with port translation where the member's port differs) to a
//! member drawn from a weight map that the core keeps current ([`plan`]); conntrack events
//! ([`conntrack`]) become the session receipts: NEW is the binding, a packet back from the
//! member is "reached", DESTROY with its counters and last TCP state is the outcome.
//!
//! The table is created fresh at start (a table left by a gateway that was killed is removed in
//! the same transaction), rewritten atomically when the map changes, and deleted on a clean
//! exit. No other table is read or written.
//!
//! What this mode cannot know, it does not claim: no first byte (the kernel sees packets, not
//! the application's bytes), byte counts are the kernel's (IP packets, headers included), and a
//! reset is recorded without the side that sent it.

pub mod conntrack;
pub mod filter;
pub mod plan;

use crate::config::{Config, NatConfig};
use crate::core::member::Health;
use crate::core::receipt::{Outcome, Side};
use crate::core::{
    CoreConfig, FlowKey, Gateway, MemberSnapshot, Protocol, SessionId, Time, Traffic,
};
use crate::driver::Shared;
use conntrack::{tcp_state, CtEvent, CtKind};
use plan::{Family, MemberView, NatListener, Program, TableSettings};
use std::collections::hash_map::Entry;
use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// One family's table and the listeners it translates.
struct Plane {
    settings: TableSettings,
    listeners: Vec<NatListener>,
}

/// What start-up prepared: the tables exist (empty), the event socket is subscribed.
pub struct Prepared {
    planes: Vec<Plane>,
    /// The listeners in the configuration's order, for start-up messages.
    order: Vec<(Protocol, SocketAddr)>,
    subscription: conntrack::Subscription,
    nft: String,
}

impl Prepared {
    /// The virtual addresses the kernel will translate.
    pub fn listeners(&self) -> Vec<(Protocol, SocketAddr)> {
        self.order.clone()
    }
}

/// The settings of the table for `family` that a configuration asks for.
pub fn table_settings(config: &Config, family: Family) -> TableSettings {
    let p = &config.core.persistence;
    let netmask = match family {
        Family::V4 => p.netmask_v4,
        Family::V6 => p.netmask_v6,
    };
    TableSettings {
        table: config.nat.table.clone(),
        family,
        source_nat: config.nat.source_nat.clone(),
        max_slots: config.nat.max_slots,
        persistence: (!p.timeout.is_zero()).then_some((netmask, p.timeout)),
        persistence_max: p.max_entries.min(u32::MAX as usize) as u32,
        events: config.nat.events,
    }
}

/// Runs the `nft` binary with a JSON batch.
pub fn apply(nft: &str, batch: &nftables::schema::Nftables<'_>) -> Result<(), String> {
    nftables::helper::apply_ruleset_with_args(batch, Some(nft), nftables::helper::DEFAULT_ARGS)
        .map_err(|e| match e {
            nftables::helper::NftablesError::NftFailed { stderr, hint, .. } => {
                format!("nft failed while {hint}: {}", stderr.trim())
            }
            other => other.to_string(),
        })
}

/// The core's settings in NAT mode: the kernel's conntrack owns the idle timers (its
/// `nf_conntrack_*_timeout` values), so the core keeps none (`Duration::MAX`); sessions end
/// when conntrack destroys them.
pub fn core_config(mut c: CoreConfig) -> CoreConfig {
    c.timers.tcp_established = Duration::MAX;
    c.timers.tcp_transitory = Duration::MAX;
    c.timers.udp = Duration::MAX;
    c.timers.tcp_rst_linger = Duration::ZERO;
    c.health.response_timeout = None;
    c.health.close_sessions_on_dead = false;
    // A session lasts until conntrack destroys it, TIME_WAIT included (120 s by default), so
    // a per-member ceiling would count closed connections; only a member's own explicit
    // `max_sessions` applies.
    c.limits.max_sessions_per_member = u32::MAX;
    c
}

/// Whether the listeners, members and `nat.source-nat` of a NAT-mode configuration fit
/// together: each static member of a family some listener has (DNAT cannot translate between
/// IPv4 and IPv6), a `nat.source-nat` address of every listener's family. The error is the
/// field and the message (naming the member); the configuration is refused with it.
pub fn check_families(
    listeners: &[std::net::SocketAddr],
    members: &[std::net::SocketAddr],
    source_nat: &plan::SourceNat,
) -> Result<(), (String, String)> {
    let families: std::collections::BTreeSet<Family> =
        listeners.iter().map(|a| Family::of(a.ip())).collect();
    for (i, m) in members.iter().enumerate() {
        let f = Family::of(m.ip());
        if !families.contains(&f) {
            let has: Vec<&str> = families.iter().map(|f| f.name()).collect();
            return Err((
                format!("pool.members[{i}].address"),
                format!(
                    "member {m} is {}, but NAT mode's listeners are {} (DNAT cannot translate between IPv4 and IPv6: a member must be of its listener's family; add a listener of that family or use --mode proxy)",
                    f.name(),
                    has.join(" and ")
                ),
            ));
        }
    }
    if let plan::SourceNat::To(a) = source_nat {
        if let Some(f) = families.iter().find(|f| **f != Family::of(*a)) {
            return Err((
                "nat.source-nat".into(),
                format!(
                    "{a} is {} and cannot be the source towards {} members (use \"masquerade\" with listeners of both families)",
                    Family::of(*a).name(),
                    f.name()
                ),
            ));
        }
    }
    Ok(())
}

/// Why the listeners cannot be translated by the kernel, if they cannot: each must be one
/// address and port (not a wildcard, not port 0).
fn check_listeners(config: &Config) -> Result<(), String> {
    for l in &config.listeners {
        let a = l.address;
        if a.ip().is_unspecified() || a.port() == 0 {
            return Err(format!(
                "listener {} {a}: NAT mode translates one address and port (not 0.0.0.0 or ::, not port 0)",
                l.protocol.name()
            ));
        }
    }
    let listeners: Vec<SocketAddr> = config.listeners.iter().map(|l| l.address).collect();
    let members: Vec<SocketAddr> = config.members.iter().map(|m| m.address).collect();
    check_families(&listeners, &members, &config.nat.source_nat)
        .map_err(|(field, msg)| format!("{field}: {msg}"))
}

/// Checks that NAT mode can run and prepares it: the listeners and members
/// ([`check_families`]), root, the `nft`
/// binary, a fresh table per family (cleaning up after a crash), and the conntrack event
/// subscription. Blocking (runs `nft`). The error says why, for the start-up message.
pub fn prepare(config: &Config) -> Result<Prepared, String> {
    check_listeners(config)?;
    let mut planes: Vec<Plane> = Vec::new();
    for family in [Family::V4, Family::V6] {
        let listeners: Vec<NatListener> = config
            .listeners
            .iter()
            .filter(|l| Family::of(l.address.ip()) == family)
            .map(|l| NatListener {
                address: l.address,
                protocol: l.protocol,
            })
            .collect();
        if !listeners.is_empty() {
            planes.push(Plane {
                settings: table_settings(config, family),
                listeners,
            });
        }
    }
    if !has_net_admin() {
        return Err("without CAP_NET_ADMIN (programming nftables and reading conntrack events need it: run as root or give the capability, e.g. AmbientCapabilities=CAP_NET_ADMIN in a systemd unit)".into());
    }
    let remove_all = |planes: &[Plane]| {
        for p in planes {
            let _ = apply(&config.nat.nft, &plan::remove_table(&p.settings));
        }
    };
    for (i, p) in planes.iter().enumerate() {
        if let Err(e) = apply(&config.nat.nft, &plan::fresh_table(&p.settings)) {
            remove_all(&planes[..i]);
            return Err(format!(
                "cannot program nftables table {} {}: {e}",
                p.settings.family.header(),
                p.settings.table
            ));
        }
    }
    let subscription = conntrack::Subscription::open(
        config.nat.event_buffer,
        Duration::from_millis(200),
        config.nat.events.updates(),
    )
    .map_err(|e| {
        remove_all(&planes);
        format!("cannot subscribe to conntrack events over netlink: {e}")
    })?;
    if config.nat.event_filter {
        let addresses: Vec<SocketAddr> = config.listeners.iter().map(|l| l.address).collect();
        match filter::program(&addresses) {
            Some(p) => match filter::attach(subscription.as_raw_fd(), &p) {
                Ok(()) => tracing::debug!(
                    instructions = p.len(),
                    "conntrack events filtered in the kernel: only connections to the listeners reach the gateway"
                ),
                Err(e) => tracing::warn!(error = %e, "cannot filter conntrack events in the kernel; every connection's events will be read and discarded here"),
            },
            None => tracing::warn!(
                "too many listeners for the kernel's event filter; every connection's events will be read and discarded here"
            ),
        }
    }
    if config.nat.conntrack_accounting {
        const ACCT: &str = "/proc/sys/net/netfilter/nf_conntrack_acct";
        match std::fs::read_to_string(ACCT) {
            Ok(v) if v.trim() == "1" => {}
            _ => match std::fs::write(ACCT, "1") {
                Ok(()) => tracing::info!(
                    "turned on conntrack accounting ({ACCT}) for byte counts in receipts"
                ),
                Err(e) => {
                    tracing::warn!(error = %e, "cannot turn on conntrack accounting ({ACCT}); receipts will carry no byte counts")
                }
            },
        }
    }
    for p in &planes {
        let (path, key) = match p.settings.family {
            Family::V4 => ("/proc/sys/net/ipv4/ip_forward", "net.ipv4.ip_forward"),
            Family::V6 => (
                "/proc/sys/net/ipv6/conf/all/forwarding",
                "net.ipv6.conf.all.forwarding",
            ),
        };
        match std::fs::read_to_string(path) {
            Ok(v) if v.trim() == "1" => {}
            _ => tracing::warn!(
                "{} forwarding is off ({key}): translated packets will not be forwarded to the members",
                p.settings.family.name()
            ),
        }
    }
    Ok(Prepared {
        planes,
        order: config
            .listeners
            .iter()
            .map(|l| (l.protocol, l.address))
            .collect(),
        subscription,
        nft: config.nat.nft.clone(),
    })
}

/// Counters of the NAT data plane: in `/metrics` while it runs, logged at exit.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Stats {
    events: u64,
    adopted: u64,
    untranslated: u64,
    unknown_member: u64,
    malformed: u64,
    lost: u64,
    map_updates: u64,
    map_failures: u64,
    resyncs: u64,
    ended_unobserved: u64,
    removed_dead: u64,
}

impl Stats {
    /// Appends the counters, rendered alone, in the OpenMetrics text format.
    pub fn render_prometheus(&self, out: &mut String) {
        let mut m = rserpool_observe::MetricSet::new();
        self.encode(&mut m);
        out.push_str(&m.render());
    }

    /// Adds the counters (`rserpool_lsnat_nat_*`) to a scrape.
    pub fn encode(&self, m: &mut rserpool_observe::MetricSet) {
        for (name, help, value) in self.counters() {
            m.counter(&format!("rserpool_lsnat_nat_{name}"), help, value);
        }
    }

    /// Each counter's metric name (after `rserpool_lsnat_nat_`), help text and value.
    fn counters(&self) -> [(&'static str, &'static str, u64); 11] {
        [
            ("events_total", "Conntrack events read.", self.events),
            ("sessions_adopted_total", "Sessions learned from a conntrack dump (bound before a restart or while events were lost).", self.adopted),
            ("untranslated_total", "Connections to the virtual address the kernel did not translate.", self.untranslated),
            ("unknown_member_total", "Connections translated to an address that is no member.", self.unknown_member),
            ("malformed_events_total", "Conntrack messages that could not be decoded.", self.malformed),
            ("events_lost_total", "Times the kernel dropped conntrack events (socket buffer full; raise nat.event-buffer).", self.lost),
            ("map_updates_total", "Weight maps programmed into nftables.", self.map_updates),
            ("map_failures_total", "Weight maps nftables refused (the table is then programmed afresh).", self.map_failures),
            ("resyncs_total", "Conntrack table dumps read (at start and after lost events).", self.resyncs),
            ("sessions_ended_unobserved_total", "Sessions conntrack forgot while events were lost (outcome unknown).", self.ended_unobserved),
            ("sessions_removed_dead_total", "Sessions of members judged dead removed from conntrack (TCP ones the member never answered, UDP flows), so that the client's next packet is chosen anew.", self.removed_dead),
        ]
    }
}

/// The counters as `name=value` pairs, named as in `/metrics`: what the exit line logs.
impl std::fmt::Display for Stats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, (name, _, value)) in self.counters().into_iter().enumerate() {
            write!(f, "{}{name}={value}", if i == 0 { "" } else { " " })?;
        }
        Ok(())
    }
}

/// What the driver remembers of a session the kernel bound.
struct Tracked {
    id: SessionId,
    since: Time,
    /// The member the kernel translated to.
    member: SocketAddr,
    /// Conntrack's id for the connection (from its events).
    ct_id: Option<u32>,
    reached: bool,
    half_closed: bool,
    tcp_state: Option<u8>,
    /// The gateway removed it from conntrack: its member was judged dead.
    removed: bool,
}

/// The sessions of members judged dead that conntrack should forget, marked as removed: TCP
/// sessions the member never answered (the client's SYN retransmission then finds no entry
/// and is chosen anew by the map, which no longer has the member; an entry would hold it to
/// the dead member for conntrack's SYN_SENT timeout, 120 s) and UDP flows (each datagram
/// would otherwise keep the flow on the dead member). Answered TCP sessions are left to end
/// in conntrack: removing one would not move it, only have its next packet reset.
fn removals(
    tracked: &mut HashMap<FlowKey, Tracked>,
    dead: &HashSet<SocketAddr>,
) -> Vec<conntrack::Removal> {
    tracked
        .iter_mut()
        .filter(|(f, t)| {
            !t.removed && dead.contains(&t.member) && (f.protocol == Protocol::Udp || !t.reached)
        })
        .map(|(f, t)| {
            t.removed = true;
            conntrack::Removal {
                protocol: f.protocol,
                client: f.client,
                virtual_address: f.virtual_address,
                id: t.ct_id,
            }
        })
        .collect()
}

/// After lost events: sessions conntrack no longer has (and that began before the dump) ended
/// unobserved; entries the gateway missed are adopted.
#[allow(clippy::too_many_arguments)] // the event handler's state, passed apart as `handle` takes it
fn resync(
    core: &mut Gateway,
    now: Time,
    started: Time,
    table: Vec<CtEvent>,
    by: &'static str,
    ours: &impl Fn(&FlowKey) -> bool,
    tracked: &mut HashMap<FlowKey, Tracked>,
    stats: &mut Stats,
) {
    let mut live = std::collections::HashSet::new();
    for e in table {
        let flow = FlowKey {
            protocol: e.protocol,
            client: e.client,
            virtual_address: e.virtual_address,
        };
        if !ours(&flow) {
            continue;
        }
        live.insert(flow);
        handle(core, now, e, by, ours, tracked, stats);
    }
    let gone: Vec<FlowKey> = tracked
        .iter()
        .filter(|(f, t)| t.since < started && !live.contains(*f))
        .map(|(f, _)| *f)
        .collect();
    for f in gone {
        if let Some(t) = tracked.remove(&f) {
            stats.ended_unobserved += 1;
            // Its DESTROY event was among the lost ones: how it ended is unknown, and the
            // receipt says so rather than guessing.
            core.closed(
                now,
                t.id,
                Outcome::Aborted {
                    by: Side::Client,
                    reason: "ended while conntrack events were lost (outcome unknown)".into(),
                },
            );
        }
    }
}

/// The members of `family` (a member of the other family has no place in this table: DNAT
/// cannot translate between families).
/// Member addresses of a family none of the tables is of: the kernel cannot send them
/// anything.
fn strays(
    members: impl Iterator<Item = std::net::SocketAddr>,
    families: &[Family],
) -> std::collections::BTreeSet<std::net::SocketAddr> {
    members
        .filter(|a| !families.contains(&Family::of(a.ip())))
        .collect()
}

fn member_views(snaps: &[MemberSnapshot], family: Family) -> Vec<MemberView> {
    snaps
        .iter()
        .filter(|m| Family::of(m.address.ip()) == family)
        .map(|m| MemberView {
            id: m.id,
            address: m.address,
            weight: m.weight,
            health: m.health,
            eligible: m.eligible,
            share: m.share,
            sessions: m.sessions,
            traffic: m.traffic,
            cost: m.cost,
        })
        .collect()
}

/// The program of one family's table for the members as the core sees them now.
fn program(
    policy: crate::core::policy::LoadSharePolicy,
    members: &[MemberSnapshot],
    listeners: &[NatListener],
    max_slots: u32,
    family: Family,
) -> Program {
    Program::new(
        policy,
        listeners.to_vec(),
        member_views(members, family),
        max_slots,
    )
}

/// Whether two programs would produce the same rules (members' session counts and traffic
/// change all the time and matter only through the map).
fn same_rules(a: &Program, b: &Program) -> bool {
    a.map == b.map
        && a.listeners == b.listeners
        && a.members.len() == b.members.len()
        && a.members
            .iter()
            .zip(&b.members)
            .all(|(x, y)| x.id == y.id && x.address == y.address && x.eligible == y.eligible)
}

/// The selection receipt's rule name for a policy in NAT mode.
fn by_name(policy: crate::core::policy::LoadSharePolicy) -> &'static str {
    use crate::core::policy::LoadSharePolicy as P;
    match policy {
        P::RoundRobin => "kernel-map:round-robin",
        P::WeightedRoundRobin => "kernel-map:weighted-round-robin",
        P::LeastSessions => "kernel-map:least-sessions",
        P::WeightedLeastSessions => "kernel-map:weighted-least-sessions",
        P::LeastTraffic => "kernel-map:least-traffic",
        P::WeightedLeastTraffic => "kernel-map:weighted-least-traffic",
        P::RouteCost => "kernel-map:route-cost",
        P::Random => "kernel-map:random",
        P::WeightedRandom => "kernel-map:weighted-random",
        P::Pool => "kernel-map:pool-weights",
    }
}

/// Runs NAT mode until `stop`: programs the map, follows conntrack, removes the table at the
/// end.
pub(crate) async fn run(shared: Arc<Shared>, prepared: Prepared, mut stop: watch::Receiver<bool>) {
    let Prepared {
        planes,
        order: _,
        subscription,
        nft,
    } = prepared;
    let tables: Vec<String> = planes
        .iter()
        .map(|p| format!("{} {}", p.settings.family.header(), p.settings.table))
        .collect();
    let policy = shared.config.core.policy;
    let by = by_name(policy);
    let fid = plan::fidelity(policy);
    tracing::info!(
        tables = %tables.join(", "),
        policy = %policy,
        "NAT mode: the kernel translates packets; policy {} {}",
        policy,
        match fid {
            plan::Fidelity::Exact => "runs exactly in the kernel's weight map (approximated only while a member is in slow start)",
            plan::Fidelity::Approximated => "is approximated: the kernel takes the members the core prefers now, in turn, refreshed every nat.refresh",
        }
    );

    // Conntrack events: the socket is non-blocking and read by this task. While events are
    // few it is read whenever it is readable (receipts at once); once readiness wakes the task
    // more often than every nat.event-interval, the socket leaves epoll and is read on a tick
    // of that period instead (one wake-up per tick whatever the load, receipts up to a tick
    // late), until ticks find it empty again. Whatever has arrived (up to 256 datagrams per
    // readiness, 4096 per tick) is decoded and applied under one lock; the receive buffer
    // doubles, up to nat.event-buffer-max, each time the kernel drops events.
    let mut buffer = shared.config.nat.event_buffer;
    let buffer_max = shared.config.nat.event_buffer_max;
    let interval = shared.config.nat.event_interval;
    let mut pace = Pace::default();
    let registered = subscription
        .set_non_blocking()
        .and_then(|()| EventSocket::ready(subscription));
    let mut events = match registered {
        Ok(a) => Some(a),
        Err(e) => {
            tracing::error!(error = %e, "cannot poll the conntrack event socket; NAT receipts stop");
            None
        }
    };
    let mut batch = conntrack::RecvBatch::new(8192);
    // The events decoded since the last batch was applied (reused: no allocation per wake-up).
    let mut decoded = Vec::with_capacity(1024);

    let mut stats = Stats::default();
    let mut tracked: HashMap<FlowKey, Tracked> = HashMap::new();
    // What was programmed last into each plane's table.
    let mut last: Vec<Option<Program>> = vec![None; planes.len()];
    let families: Vec<Family> = planes.iter().map(|p| p.settings.family).collect();
    // Members (from an RSerPool pool) of a family no listener has, warned about once each.
    let mut strays_warned = std::collections::BTreeSet::new();
    let mut last_lost_log: Option<Instant> = None;
    // A dump of the conntrack table: at start (sessions bound before a restart) and after
    // lost events, at most once a second.
    let mut resync_due = true;
    // Members judged dead, and how many passes have looked for their sessions to remove.
    let mut dead_passes: HashMap<SocketAddr, u8> = HashMap::new();
    let mut last_resync: Option<Instant> = None;
    let ours = |flow: &FlowKey| {
        planes
            .iter()
            .flat_map(|p| &p.listeners)
            .any(|l| l.protocol == flow.protocol && l.address == flow.virtual_address)
    };

    let mut iv = tokio::time::interval(shared.config.nat.refresh);
    iv.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        // What the last step counted, for /metrics.
        {
            let mut inner = shared.lock();
            if inner.nat.as_ref() != Some(&stats) {
                inner.nat = Some(stats.clone());
            }
        }
        tokio::select! {
            _ = iv.tick() => {
                if resync_due && last_resync.is_none_or(|t| t.elapsed() >= Duration::from_secs(1)) {
                    resync_due = false;
                    last_resync = Some(Instant::now());
                    let started = shared.now();
                    let fams = families.clone();
                    let table = tokio::task::spawn_blocking(move || {
                        let mut all = Vec::new();
                        for f in fams {
                            all.extend(conntrack::dump(f, Duration::from_secs(5))?);
                        }
                        Ok(all)
                    })
                        .await
                        .map_err(|e| std::io::Error::other(e.to_string()))
                        .and_then(|r| r);
                    match table {
                        Ok(table) => {
                            stats.resyncs += 1;
                            shared.with(|core, now| {
                                resync(core, now, started, table, by, &ours, &mut tracked, &mut stats)
                            });
                        }
                        Err(e) => tracing::warn!(error = %e, "dumping the conntrack table failed"),
                    }
                }
                // The members as the core sees them now: for the warnings, the maps and the
                // removal of dead members' sessions.
                let members = shared.with(|core, now| core.member_snapshots(now));
                let now_strays = strays(members.iter().map(|m| m.address), &families);
                for a in now_strays.difference(&strays_warned) {
                    tracing::warn!(member = %a, "member {a} gets no NAT session: no listener is of its family (DNAT cannot translate between IPv4 and IPv6; add a listener of that family)");
                }
                strays_warned = now_strays;
                for (plane, last) in planes.iter().zip(last.iter_mut()) {
                    let settings = &plane.settings;
                    let next = program(policy, &members, &plane.listeners, settings.max_slots, settings.family);
                    if last.as_ref().is_some_and(|p| same_rules(p, &next)) {
                        continue;
                    }
                    let batch = plan::refresh(settings, last.as_ref(), &next);
                    let nft2 = nft.clone();
                    let r = tokio::task::spawn_blocking(move || apply(&nft2, &batch))
                        .await
                        .unwrap_or_else(|e| Err(e.to_string()));
                    match r {
                        Ok(()) => {
                            stats.map_updates += 1;
                            tracing::debug!(family = settings.family.name(), slots = next.map.slots.len(), "weight map programmed");
                            *last = Some(next);
                        }
                        Err(e) => {
                            stats.map_failures += 1;
                            tracing::error!(error = %e, family = settings.family.name(), "programming the weight map failed; starting again from an empty table");
                            let s2 = settings.clone();
                            let nft2 = nft.clone();
                            let _ = tokio::task::spawn_blocking(move || apply(&nft2, &plan::fresh_table(&s2))).await;
                            *last = None;
                        }
                    }
                }
                remove_dead_sessions(&members, &mut dead_passes, &mut tracked, &mut stats).await;
            }
            ready = async {
                match &mut events {
                    Some(EventSocket::Ready(a)) => a.readable().await.map(Some),
                    Some(EventSocket::Tick(_, tick)) => {
                        tick.tick().await;
                        Ok(None)
                    }
                    None => std::future::pending().await,
                }
            } => {
                let mut lost = false;
                let mut failed = None;
                let mut got = 0usize;
                let mut take = |r: std::io::Result<usize>, batch: &conntrack::RecvBatch| match r {
                    Ok(_) => {
                        for d in batch.datagrams() {
                            got += 1;
                            conntrack::parse_datagram_into(d, &mut decoded);
                        }
                        true
                    }
                    Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => {
                        lost = true;
                        true
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => true,
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => false,
                    Err(e) => {
                        failed = Some(e);
                        false
                    }
                };
                match ready {
                    Err(e) => {
                        tracing::error!(error = %e, "conntrack event socket failed; NAT receipts stop");
                        events = None;
                        continue;
                    }
                    // Readable: up to four batches (256 datagrams), so that the timer and the
                    // stop signal are not starved under a flood.
                    Ok(Some(mut guard)) => {
                        for _ in 0..4 {
                            match guard.try_io(|a| a.get_ref().try_recv_batch(&mut batch)) {
                                // Drained: readiness is cleared, the next datagram wakes the task.
                                Err(_would_block) => break,
                                Ok(r) => {
                                    if !take(r, &batch) {
                                        break;
                                    }
                                }
                            }
                        }
                    }
                    // A tick: whatever has arrived since, up to 64 batches.
                    Ok(None) => {
                        if let Some(EventSocket::Tick(sub, _)) = &events {
                            for _ in 0..64 {
                                let r = sub.try_recv_batch(&mut batch);
                                if !take(r, &batch) {
                                    break;
                                }
                            }
                        }
                    }
                }
                if !decoded.is_empty() {
                    shared.with(|core, now| {
                        for r in decoded.drain(..) {
                            match r {
                                Ok(e) => {
                                    stats.events += 1;
                                    handle(core, now, e, by, &ours, &mut tracked, &mut stats);
                                }
                                Err(_) => stats.malformed += 1,
                            }
                        }
                    });
                }
                if lost {
                    stats.lost += 1;
                    resync_due = true;
                    if buffer < buffer_max {
                        buffer = (buffer * 2).min(buffer_max);
                        if let Some(e) = &events {
                            let granted = e.subscription().set_buffer(buffer);
                            tracing::info!(asked = buffer, granted, "conntrack event buffer enlarged after lost events");
                        }
                    }
                    if last_lost_log.is_none_or(|t| t.elapsed() > Duration::from_secs(5)) {
                        last_lost_log = Some(Instant::now());
                        tracing::warn!(times = stats.lost, "conntrack events were lost (socket buffer full; it grows up to nat.event-buffer-max): some receipts will be missing until the next resync");
                    }
                }
                if let Some(e) = failed {
                    tracing::error!(error = %e, "conntrack event socket failed; NAT receipts stop");
                    events = None;
                }
                if !interval.is_zero() {
                    let tick = matches!(events, Some(EventSocket::Tick(..)));
                    if let Some(change) = pace.step(tick, got, Instant::now(), interval) {
                        events = events.take().and_then(|e| match e.switch(change, interval) {
                            Ok(e) => Some(e),
                            Err(err) => {
                                tracing::error!(error = %err, "cannot change how the conntrack event socket is read; NAT receipts stop");
                                None
                            }
                        });
                    }
                }
            }
            _ = stop.changed() => break,
        }
    }
    for (plane, name) in planes.iter().zip(&tables) {
        let removed = {
            let s2 = plane.settings.clone();
            let nft2 = nft.clone();
            tokio::task::spawn_blocking(move || apply(&nft2, &plan::remove_table(&s2))).await
        };
        match removed {
            Ok(Ok(())) => {
                tracing::info!(table = %name, "nftables table removed; sessions already bound continue in the kernel")
            }
            other => {
                tracing::error!(table = %name, result = ?other, "removing the nftables table failed")
            }
        }
    }
    tracing::info!("NAT data plane stopped: {stats}");
}

/// Once the maps no longer hold a member judged dead, conntrack forgets its unanswered
/// sessions and UDP flows ([`removals`]): the clients' next packets are chosen anew. Two
/// passes per death: the second takes the sessions the kernel bound before the map changed
/// whose events were read after the first.
async fn remove_dead_sessions(
    members: &[MemberSnapshot],
    passes: &mut HashMap<SocketAddr, u8>,
    tracked: &mut HashMap<FlowKey, Tracked>,
    stats: &mut Stats,
) {
    let dead = |m: &&MemberSnapshot| m.health == Health::Dead;
    passes.retain(|a, _| members.iter().filter(dead).any(|m| m.address == *a));
    let due: HashSet<SocketAddr> = members
        .iter()
        .filter(dead)
        .map(|m| m.address)
        .filter(|a| passes.get(a).copied().unwrap_or(0) < 2)
        .collect();
    if due.is_empty() {
        // The common case, every refresh: no scan of the sessions.
        return;
    }
    for a in &due {
        *passes.entry(*a).or_insert(0) += 1;
    }
    let list = removals(tracked, &due);
    if list.is_empty() {
        return;
    }
    let asked = list.len();
    let (result, list) = tokio::task::spawn_blocking(move || {
        (conntrack::remove(&list, Duration::from_secs(1)), list)
    })
    .await
    .unwrap_or_else(|e| (Err(std::io::Error::other(e.to_string())), Vec::new()));
    // Sessions not removed by us: their receipts must not say they were.
    let mut not_removed = |rs: &[conntrack::Removal]| {
        for r in rs {
            let flow = FlowKey {
                protocol: r.protocol,
                client: r.client,
                virtual_address: r.virtual_address,
            };
            if let Some(t) = tracked.get_mut(&flow) {
                t.removed = false;
            }
        }
    };
    match result {
        Ok(done) => {
            stats.removed_dead += done.deleted as u64;
            not_removed(&done.gone);
            tracing::info!(
                members = ?due,
                asked,
                removed = done.deleted,
                already_gone = done.gone.len(),
                "sessions of members judged dead removed from conntrack (unanswered TCP, UDP flows): the clients' next packets are chosen anew"
            );
        }
        Err(e) => {
            tracing::warn!(error = %e, asked, "removing dead members' sessions from conntrack failed; the next pass tries again, else they stay until conntrack's timeouts");
            not_removed(&list);
        }
    }
}

/// The conntrack event socket, read when readable or on a tick (`nat.event-interval`).
enum EventSocket {
    Ready(tokio::io::unix::AsyncFd<conntrack::Subscription>),
    Tick(conntrack::Subscription, tokio::time::Interval),
}

impl EventSocket {
    fn ready(s: conntrack::Subscription) -> std::io::Result<EventSocket> {
        // SAFETY: the subscription owns its socket, which stays open and the same descriptor
        // until the AsyncFd (its owner from here) is dropped or gives it back.
        unsafe { tokio::io::unix::AsyncFd::register(s) }
            .map(EventSocket::Ready)
            .map_err(std::io::Error::from)
    }

    fn subscription(&self) -> &conntrack::Subscription {
        match self {
            EventSocket::Ready(a) => a.get_ref(),
            EventSocket::Tick(s, _) => s,
        }
    }

    /// Reads on a tick (`true`: out of epoll) or when readable (`false`: back in it).
    fn switch(self, to_tick: bool, interval: Duration) -> std::io::Result<EventSocket> {
        match (self, to_tick) {
            (EventSocket::Ready(a), true) => {
                let mut tick = tokio::time::interval(interval);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                tracing::debug!("conntrack events are many: read on a tick");
                Ok(EventSocket::Tick(a.into_inner(), tick))
            }
            (EventSocket::Tick(s, _), false) => {
                tracing::debug!("conntrack events are few: read when they arrive");
                EventSocket::ready(s)
            }
            (e, _) => Ok(e),
        }
    }
}

/// When to read the event socket on a tick and when on readiness: readiness wakes closer
/// together than the interval, [`Pace::BUSY`] times in a row, switch to the tick; ticks that
/// find nothing, [`Pace::QUIET`] in a row, switch back.
#[derive(Default)]
struct Pace {
    last_wake: Option<Instant>,
    busy: u32,
    quiet: u32,
}

impl Pace {
    const BUSY: u32 = 8;
    const QUIET: u32 = 4;

    /// After a read (`tick`: on a tick; `got`: datagrams read): Some(true) to move to the
    /// tick, Some(false) back to readiness, None to stay.
    fn step(&mut self, tick: bool, got: usize, now: Instant, interval: Duration) -> Option<bool> {
        if tick {
            self.quiet = if got == 0 { self.quiet + 1 } else { 0 };
            if self.quiet >= Self::QUIET {
                *self = Pace::default();
                return Some(false);
            }
            return None;
        }
        let close = self.last_wake.is_some_and(|t| now < t + interval);
        self.last_wake = Some(now);
        self.busy = if close { self.busy + 1 } else { 0 };
        if self.busy >= Self::BUSY {
            *self = Pace::default();
            return Some(true);
        }
        None
    }
}

fn handle(
    core: &mut Gateway,
    now: Time,
    e: CtEvent,
    by: &'static str,
    ours: &impl Fn(&FlowKey) -> bool,
    tracked: &mut HashMap<FlowKey, Tracked>,
    stats: &mut Stats,
) {
    let flow = FlowKey {
        protocol: e.protocol,
        client: e.client,
        virtual_address: e.virtual_address,
    };
    if !ours(&flow) {
        return;
    }
    // One lookup per event: the flow's entry is found (or made) once and kept.
    let mut entry = match tracked.entry(flow) {
        Entry::Occupied(o) => o,
        Entry::Vacant(_) if e.kind == CtKind::Destroy => return,
        Entry::Vacant(v) => {
            if !e.dnat {
                stats.untranslated += 1;
                return;
            }
            let Some(member) = e.member else { return };
            match core.adopt(now, flow, member, by) {
                Ok(id) => {
                    if e.kind != CtKind::New {
                        stats.adopted += 1;
                    }
                    v.insert_entry(Tracked {
                        id,
                        since: now,
                        member,
                        ct_id: e.id,
                        reached: false,
                        half_closed: false,
                        tcp_state: None,
                        removed: false,
                    })
                }
                Err(_) => {
                    stats.unknown_member += 1;
                    return;
                }
            }
        }
    };
    let t = entry.get_mut();
    if let Some(s) = e.tcp_state {
        t.tcp_state = Some(s);
    }
    if t.ct_id.is_none() {
        t.ct_id = e.id;
    }
    let answered = match e.protocol {
        // The member's SYN-ACK moves conntrack past SYN_SENT; a RST answer goes to CLOSE
        // without it (refused, not reached).
        // With only NEW and DESTROY (nat.events = "end"), a reset session was reached if
        // conntrack had judged it assured (the handshake completed) before the reset.
        Protocol::Tcp => {
            e.assured
                || matches!(
                    t.tcp_state,
                    Some(tcp_state::SYN_RECV..=tcp_state::TIME_WAIT)
                )
        }
        Protocol::Udp => e.seen_reply,
    };
    if answered && !t.reached {
        t.reached = true;
        if e.protocol == Protocol::Tcp {
            core.connected(now, t.id);
        }
        core.reached(now, t.id);
    }
    if e.protocol == Protocol::Tcp
        && !t.half_closed
        && matches!(
            t.tcp_state,
            Some(tcp_state::FIN_WAIT | tcp_state::CLOSE_WAIT | tcp_state::LAST_ACK)
        )
    {
        t.half_closed = true;
        let side = match e.client_closed_first {
            Some(false) => Side::Member,
            _ => Side::Client,
        };
        core.half_closed(now, t.id, side);
    }
    if e.kind != CtKind::Destroy {
        return;
    }
    let t = entry.remove();
    let to_member = e.to_member.unwrap_or_default();
    let to_client = e.to_client.unwrap_or_default();
    core.activity(
        now,
        t.id,
        Traffic {
            bytes: to_member.bytes,
            packets: to_member.packets,
        },
        Traffic {
            bytes: to_client.bytes,
            packets: to_client.packets,
        },
    );
    if t.removed {
        let outcome = match (e.protocol, t.reached) {
            (Protocol::Tcp, false) => Outcome::ConnectFailed {
                reason: "no answer before the member was judged dead; removed from conntrack so that the client's next SYN is chosen anew".into(),
            },
            _ => Outcome::MemberLost {
                reason: "member judged dead; flow removed from conntrack so that the client's next datagram is chosen anew".into(),
            },
        };
        core.closed(now, t.id, outcome);
        return;
    }
    match e.protocol {
        Protocol::Tcp => match t.tcp_state {
            Some(tcp_state::TIME_WAIT | tcp_state::LAST_ACK) => {
                core.closed(now, t.id, Outcome::Closed);
            }
            Some(tcp_state::CLOSE) if t.reached => {
                core.closed(now, t.id, Outcome::ResetUnattributed);
            }
            // Not evidence against the member: the reset may be the client's (a reused client
            // port meeting the member's TIME_WAIT is answered with an ACK the client resets),
            // and conntrack does not say who sent it. Active probes judge liveness in NAT mode.
            Some(tcp_state::CLOSE) => {
                core.closed(
                    now,
                    t.id,
                    Outcome::ConnectFailed {
                        reason: "reset before the handshake completed (side unknown)".into(),
                    },
                );
            }
            Some(tcp_state::SYN_SENT) | None if !t.reached => {
                core.closed(
                    now,
                    t.id,
                    Outcome::ConnectFailed {
                        reason: "no answer to the SYN before conntrack's timeout".into(),
                    },
                );
            }
            Some(tcp_state::FIN_WAIT | tcp_state::CLOSE_WAIT) => {
                core.closed(
                    now,
                    t.id,
                    Outcome::IdleTimeout {
                        state: "half_closed",
                    },
                );
            }
            _ => {
                core.closed(
                    now,
                    t.id,
                    Outcome::IdleTimeout {
                        state: "established",
                    },
                );
            }
        },
        Protocol::Udp => {
            if t.reached {
                core.closed(now, t.id, Outcome::IdleTimeout { state: "udp" });
            } else {
                core.closed(
                    now,
                    t.id,
                    Outcome::ConnectFailed {
                        reason: "no datagram came back before conntrack's timeout".into(),
                    },
                );
            }
        }
    }
}

/// A NAT configuration in one line, for the start-up log and `--check`.
pub fn describe(n: &NatConfig) -> String {
    let events = if n.event_interval.is_zero() {
        "read as they arrive".to_string()
    } else {
        format!("read every {} under load", crate::human(n.event_interval))
    };
    format!(
        "table {}, events {} ({events}, socket buffer {} bytes growing to {}, filter {}), conntrack accounting {}, source-nat {}, map of up to {} slots refreshed every {}",
        n.table,
        n.events.name(),
        n.event_buffer,
        n.event_buffer_max,
        if n.event_filter { "on" } else { "off" },
        if n.conntrack_accounting { "on" } else { "off" },
        n.source_nat,
        n.max_slots,
        crate::human(n.refresh)
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::member::{Health, MemberSpec};
    use crate::core::policy::LoadSharePolicy;
    use conntrack::Counter;
    use rand::SeedableRng;

    const VIP: &str = "10.0.1.2:8080";

    fn gateway() -> Gateway {
        let cfg = core_config(CoreConfig::default());
        let mut g = Gateway::new(cfg, Box::new(rand::rngs::StdRng::seed_from_u64(1)));
        g.set_members(
            Duration::ZERO,
            vec![
                MemberSpec::new("10.0.2.2:7000".parse().unwrap()),
                MemberSpec::new("10.0.2.3:7000".parse().unwrap()),
            ],
        );
        g
    }

    fn ev(kind: CtKind, client_port: u16, member: &str) -> CtEvent {
        CtEvent {
            kind,
            id: None,
            protocol: Protocol::Tcp,
            client: SocketAddr::new("10.0.1.1".parse().unwrap(), client_port),
            virtual_address: VIP.parse().unwrap(),
            member: Some(member.parse().unwrap()),
            seen_reply: false,
            assured: false,
            dnat: true,
            tcp_state: Some(tcp_state::SYN_SENT),
            client_closed_first: None,
            to_member: None,
            to_client: None,
        }
    }

    struct Harness {
        core: Gateway,
        tracked: HashMap<FlowKey, Tracked>,
        stats: Stats,
    }

    impl Harness {
        fn new() -> Harness {
            Harness {
                core: gateway(),
                tracked: HashMap::new(),
                stats: Stats::default(),
            }
        }
        fn feed(&mut self, t_ms: u64, e: CtEvent) {
            let ours = |f: &FlowKey| f.virtual_address == VIP.parse::<SocketAddr>().unwrap();
            handle(
                &mut self.core,
                Duration::from_millis(t_ms),
                e,
                "kernel-map:round-robin",
                &ours,
                &mut self.tracked,
                &mut self.stats,
            );
        }
    }

    #[test]
    fn members_of_a_family_no_table_has_are_strays() {
        let a: std::net::SocketAddr = "10.0.0.2:80".parse().unwrap();
        let b: std::net::SocketAddr = "[fd00::2]:80".parse().unwrap();
        let c: std::net::SocketAddr = "10.0.0.3:80".parse().unwrap();
        let all = [a, b, c];
        assert_eq!(
            strays(all.into_iter(), &[Family::V4])
                .into_iter()
                .collect::<Vec<_>>(),
            vec![b]
        );
        assert_eq!(
            strays(all.into_iter(), &[Family::V6])
                .into_iter()
                .collect::<Vec<_>>(),
            vec![a, c]
        );
        assert!(strays(all.into_iter(), &[Family::V4, Family::V6]).is_empty());
    }

    #[test]
    fn event_reading_moves_to_the_tick_under_load_and_back_when_quiet() {
        let iv = Duration::from_millis(5);
        let t0 = Instant::now();
        let mut p = Pace::default();
        // Wakes 1 ms apart: the eighth in a row moves to the tick.
        let mut switched = None;
        for i in 0..20 {
            if let Some(c) = p.step(false, 10, t0 + Duration::from_millis(i), iv) {
                switched = Some((i, c));
                break;
            }
        }
        assert_eq!(switched, Some((8, true)));
        // Ticks that read something keep it; four empty ones in a row move back.
        assert_eq!(p.step(true, 300, t0, iv), None);
        assert_eq!(p.step(true, 0, t0, iv), None);
        assert_eq!(p.step(true, 0, t0, iv), None);
        assert_eq!(
            p.step(true, 5, t0, iv),
            None,
            "a tick with events resets the count"
        );
        for _ in 0..3 {
            assert_eq!(p.step(true, 0, t0, iv), None);
        }
        assert_eq!(p.step(true, 0, t0, iv), Some(false));
        // Wakes further apart than the interval never move it.
        for i in 0..50 {
            assert_eq!(
                p.step(false, 1, t0 + Duration::from_millis(6 * i), iv),
                None
            );
        }
    }

    #[test]
    fn a_closed_tcp_session_gets_every_receipt_from_conntrack() {
        let mut h = Harness::new();
        h.feed(10, ev(CtKind::New, 40000, "10.0.2.3:7000"));
        assert_eq!(h.core.active_sessions(), 1);
        let mut e = ev(CtKind::Update, 40000, "10.0.2.3:7000");
        e.seen_reply = true;
        e.tcp_state = Some(tcp_state::SYN_RECV);
        h.feed(11, e);
        let mut e = ev(CtKind::Update, 40000, "10.0.2.3:7000");
        e.tcp_state = Some(tcp_state::FIN_WAIT);
        e.client_closed_first = Some(true);
        h.feed(20, e);
        let mut e = ev(CtKind::Destroy, 40000, "10.0.2.3:7000");
        e.tcp_state = Some(tcp_state::TIME_WAIT);
        e.to_member = Some(Counter {
            packets: 6,
            bytes: 330,
        });
        e.to_client = Some(Counter {
            packets: 5,
            bytes: 290,
        });
        h.feed(2000, e);
        assert_eq!(h.core.active_sessions(), 0);
        let r = h.core.recent_outcomes().last().unwrap().clone();
        assert_eq!(r.selected[0].by, "kernel-map:round-robin");
        assert_eq!(
            r.bound.as_ref().unwrap().address,
            "10.0.2.3:7000".parse().unwrap()
        );
        assert_eq!(r.opened_ms, 10);
        assert_eq!(r.connected_ms, Some(11));
        assert_eq!(r.reached_ms, Some(11));
        assert_eq!((r.bytes_to_member, r.bytes_to_client), (330, 290));
        assert_eq!(r.outcome, Some(Outcome::Closed));
        assert_eq!(r.ended_ms, Some(2000));
        assert!(h.tracked.is_empty());
    }

    #[test]
    fn with_the_answer_events_an_assured_update_is_reached_and_destroy_ends() {
        // nat.events = "answer": NEW, one update when conntrack judges the connection
        // assured, DESTROY.
        let mut h = Harness::new();
        h.feed(10, ev(CtKind::New, 40100, "10.0.2.3:7000"));
        let mut e = ev(CtKind::Update, 40100, "10.0.2.3:7000");
        e.seen_reply = true;
        e.assured = true;
        h.feed(12, e);
        let mut e = ev(CtKind::Destroy, 40100, "10.0.2.3:7000");
        e.tcp_state = Some(tcp_state::TIME_WAIT);
        e.assured = true;
        h.feed(3000, e);
        let r = h.core.recent_outcomes().last().unwrap();
        assert_eq!(r.reached_ms, Some(12));
        assert_eq!(r.outcome, Some(Outcome::Closed));
    }

    #[test]
    fn conntrack_owns_the_timers_so_the_core_queues_none_and_ends_nothing() {
        // A session through the kernel lasts as long as conntrack keeps it (its established
        // timeout is five days, refreshed by every packet): the core keeps no idle timer for it.
        let mut h = Harness::new();
        for port in 41000..41500u16 {
            h.feed(10, ev(CtKind::New, port, "10.0.2.2:7000"));
            let mut e = ev(CtKind::Update, port, "10.0.2.2:7000");
            e.assured = true;
            e.tcp_state = Some(tcp_state::ESTABLISHED);
            h.feed(11, e);
        }
        assert_eq!(h.core.deadline_entries(), 0, "no timer queued");
        let year = Duration::from_secs(365 * 86_400);
        h.core.poll(year);
        assert_eq!(h.core.active_sessions(), 500);
        assert_eq!(h.core.recent_outcomes().count(), 0, "nothing ended");
        let mut e = ev(CtKind::Destroy, 41000, "10.0.2.2:7000");
        e.tcp_state = Some(tcp_state::TIME_WAIT);
        e.assured = true;
        h.feed(year.as_millis() as u64, e);
        let r = h.core.recent_outcomes().last().unwrap();
        assert_eq!(r.outcome, Some(Outcome::Closed));
        assert_eq!(h.core.active_sessions(), 499);
    }

    #[test]
    fn with_new_and_destroy_only_reached_comes_from_the_destroy_event() {
        // nat.events = "end": what happened is learnt when the session ends.
        let mut h = Harness::new();
        // A closed session: TIME_WAIT at the end.
        h.feed(10, ev(CtKind::New, 40200, "10.0.2.3:7000"));
        let mut e = ev(CtKind::Destroy, 40200, "10.0.2.3:7000");
        e.tcp_state = Some(tcp_state::TIME_WAIT);
        e.seen_reply = true;
        e.assured = true;
        h.feed(2000, e);
        let r = h.core.recent_outcomes().last().unwrap().clone();
        assert_eq!(r.reached_ms, Some(2000));
        assert_eq!(r.outcome, Some(Outcome::Closed));
        // Reset after the handshake: assured, then CLOSE.
        h.feed(2100, ev(CtKind::New, 40201, "10.0.2.3:7000"));
        let mut e = ev(CtKind::Destroy, 40201, "10.0.2.3:7000");
        e.tcp_state = Some(tcp_state::CLOSE);
        e.seen_reply = true;
        e.assured = true;
        h.feed(2200, e);
        assert_eq!(h.core.outcome_count("reset_unattributed"), 1);
        // The member reset the SYN: a reply was seen, never assured.
        h.feed(2300, ev(CtKind::New, 40202, "10.0.2.3:7000"));
        let mut e = ev(CtKind::Destroy, 40202, "10.0.2.3:7000");
        e.tcp_state = Some(tcp_state::CLOSE);
        e.seen_reply = true;
        h.feed(2301, e);
        assert_eq!(h.core.outcome_count("connect_failed"), 1);
        let r = h.core.recent_outcomes().last().unwrap();
        assert!(r.reached_ms.is_none());
        assert!(h.tracked.is_empty());
    }

    #[test]
    fn a_reset_before_the_handshake_is_connect_failed_but_not_evidence() {
        let mut h = Harness::new();
        for (i, port) in [40001u16, 40002, 40003].into_iter().enumerate() {
            let t = 100 * i as u64;
            h.feed(t, ev(CtKind::New, port, "10.0.2.2:7000"));
            // The member answered the SYN with a RST: CLOSE without passing SYN_RECV.
            let mut e = ev(CtKind::Update, port, "10.0.2.2:7000");
            e.seen_reply = true;
            e.tcp_state = Some(tcp_state::CLOSE);
            h.feed(t + 1, e);
            let mut e = ev(CtKind::Destroy, port, "10.0.2.2:7000");
            e.tcp_state = Some(tcp_state::CLOSE);
            h.feed(t + 2, e);
        }
        assert_eq!(h.core.outcome_count("connect_failed"), 3);
        // Who reset is unknown (the client, meeting the member's TIME_WAIT, or the member):
        // liveness is left to the probes.
        let m = h.core.member_id("10.0.2.2:7000").unwrap();
        assert_eq!(h.core.member_health(m), Some(Health::Alive));
        let r = h.core.recent_outcomes().last().unwrap();
        assert!(r.reached_ms.is_none());
    }

    #[test]
    fn a_dead_members_unanswered_sessions_and_udp_flows_are_removed_from_conntrack() {
        let mut h = Harness::new();
        let dead: HashSet<SocketAddr> = ["10.0.2.3:7000".parse().unwrap()].into();
        let with_id = |mut e: CtEvent, id: u32| {
            e.id = Some(id);
            e
        };
        // 40001: SYN to the member that dies, never answered.
        h.feed(0, with_id(ev(CtKind::New, 40001, "10.0.2.3:7000"), 11));
        // 40002: answered (handshake done) before it died: left to end in conntrack.
        h.feed(0, with_id(ev(CtKind::New, 40002, "10.0.2.3:7000"), 12));
        let mut e = ev(CtKind::Update, 40002, "10.0.2.3:7000");
        e.assured = true;
        e.tcp_state = Some(tcp_state::ESTABLISHED);
        h.feed(1, e);
        // 5000: a UDP flow the member answered.
        let mut u = with_id(ev(CtKind::New, 5000, "10.0.2.3:7000"), 13);
        u.protocol = Protocol::Udp;
        u.tcp_state = None;
        h.feed(2, u.clone());
        u.kind = CtKind::Update;
        u.seen_reply = true;
        h.feed(3, u.clone());
        // 40003: unanswered, but to the live member.
        h.feed(4, with_id(ev(CtKind::New, 40003, "10.0.2.2:7000"), 14));

        let mut got = removals(&mut h.tracked, &dead);
        got.sort_by_key(|r| r.client.port());
        let vip: SocketAddr = VIP.parse().unwrap();
        assert_eq!(
            got,
            vec![
                conntrack::Removal {
                    protocol: Protocol::Udp,
                    client: "10.0.1.1:5000".parse().unwrap(),
                    virtual_address: vip,
                    id: Some(13),
                },
                conntrack::Removal {
                    protocol: Protocol::Tcp,
                    client: "10.0.1.1:40001".parse().unwrap(),
                    virtual_address: vip,
                    id: Some(11),
                },
            ]
        );
        // Asked once: a second pass finds nothing more.
        assert!(removals(&mut h.tracked, &dead).is_empty());
        // Their DESTROY events (the deletion) end them with a receipt that says why.
        let mut d = ev(CtKind::Destroy, 40001, "10.0.2.3:7000");
        d.tcp_state = Some(tcp_state::SYN_SENT);
        h.feed(500, d);
        let r = h.core.recent_outcomes().last().unwrap();
        assert!(
            matches!(&r.outcome, Some(Outcome::ConnectFailed { reason }) if reason.contains("judged dead")),
            "{:?}",
            r.outcome
        );
        u.kind = CtKind::Destroy;
        h.feed(501, u);
        let r = h.core.recent_outcomes().last().unwrap();
        assert!(
            matches!(&r.outcome, Some(Outcome::MemberLost { reason }) if reason.contains("judged dead")),
            "{:?}",
            r.outcome
        );
        assert_eq!(h.tracked.len(), 2, "40002 and 40003 are still tracked");
    }

    #[test]
    fn a_reset_after_the_answer_is_recorded_without_a_side() {
        let mut h = Harness::new();
        h.feed(0, ev(CtKind::New, 40010, "10.0.2.2:7000"));
        let mut e = ev(CtKind::Update, 40010, "10.0.2.2:7000");
        e.tcp_state = Some(tcp_state::ESTABLISHED);
        e.seen_reply = true;
        h.feed(1, e);
        let mut e = ev(CtKind::Destroy, 40010, "10.0.2.2:7000");
        e.tcp_state = Some(tcp_state::CLOSE);
        h.feed(5, e);
        assert_eq!(h.core.outcome_count("reset_unattributed"), 1);
    }

    #[test]
    fn udp_flows_are_reached_by_a_reply_and_end_on_conntracks_timer() {
        let mut h = Harness::new();
        let mut e = ev(CtKind::New, 5000, "10.0.2.2:7000");
        e.protocol = Protocol::Udp;
        e.tcp_state = None;
        h.feed(0, e.clone());
        let mut u = e.clone();
        u.kind = CtKind::Update;
        u.seen_reply = true;
        h.feed(3, u);
        let mut d = e.clone();
        d.kind = CtKind::Destroy;
        h.feed(30_000, d);
        let r = h.core.recent_outcomes().last().unwrap();
        assert_eq!(r.reached_ms, Some(3));
        assert_eq!(r.outcome, Some(Outcome::IdleTimeout { state: "udp" }));
        // A flow nobody answered.
        let mut e = ev(CtKind::New, 5001, "10.0.2.3:7000");
        e.protocol = Protocol::Udp;
        h.feed(40_000, e.clone());
        e.kind = CtKind::Destroy;
        h.feed(70_000, e);
        assert_eq!(h.core.outcome_count("connect_failed"), 1);
    }

    #[test]
    fn other_flows_untranslated_flows_and_unknown_members_are_not_sessions() {
        let mut h = Harness::new();
        let mut e = ev(CtKind::New, 1, "10.0.2.2:7000");
        e.virtual_address = "10.0.1.2:9999".parse().unwrap();
        h.feed(0, e);
        let mut e = ev(CtKind::New, 2, "10.0.2.2:7000");
        e.dnat = false;
        h.feed(0, e);
        h.feed(0, ev(CtKind::New, 3, "10.9.9.9:7000"));
        // A destroy for a session never seen.
        h.feed(0, ev(CtKind::Destroy, 4, "10.0.2.2:7000"));
        assert_eq!(h.core.active_sessions(), 0);
        assert_eq!((h.stats.untranslated, h.stats.unknown_member), (1, 1));
    }

    #[test]
    fn a_session_seen_first_in_an_update_is_adopted() {
        let mut h = Harness::new();
        let mut e = ev(CtKind::Update, 7, "10.0.2.2:7000");
        e.tcp_state = Some(tcp_state::ESTABLISHED);
        e.seen_reply = true;
        h.feed(0, e);
        assert_eq!(h.core.active_sessions(), 1);
        assert_eq!(h.stats.adopted, 1);
    }

    #[test]
    fn resync_ends_sessions_conntrack_forgot_and_adopts_the_ones_missed() {
        let mut h = Harness::new();
        h.feed(0, ev(CtKind::New, 1, "10.0.2.2:7000")); // its DESTROY will be lost
        h.feed(0, ev(CtKind::New, 2, "10.0.2.2:7000")); // still in the table
        h.feed(900, ev(CtKind::New, 3, "10.0.2.3:7000")); // opened after the dump began
        let mut still = ev(CtKind::Update, 2, "10.0.2.2:7000");
        still.tcp_state = Some(tcp_state::ESTABLISHED);
        let mut missed = ev(CtKind::Update, 4, "10.0.2.3:7000"); // its NEW was lost
        missed.tcp_state = Some(tcp_state::ESTABLISHED);
        let ours = |f: &FlowKey| f.virtual_address == VIP.parse::<SocketAddr>().unwrap();
        resync(
            &mut h.core,
            Duration::from_millis(1000),
            Duration::from_millis(500),
            vec![still, missed],
            "kernel-map:round-robin",
            &ours,
            &mut h.tracked,
            &mut h.stats,
        );
        assert_eq!(h.stats.ended_unobserved, 1);
        assert_eq!(h.core.outcome_count("aborted"), 1);
        assert_eq!(h.core.active_sessions(), 3);
        assert_eq!(h.tracked.len(), 3);
    }

    #[test]
    fn ipv6_sessions_get_receipts_and_each_table_gets_its_familys_members() {
        let cfg = core_config(CoreConfig::default());
        let mut core = Gateway::new(cfg, Box::new(rand::rngs::StdRng::seed_from_u64(1)));
        core.set_members(
            Duration::ZERO,
            vec![
                MemberSpec::new("10.0.2.2:7000".parse().unwrap()),
                MemberSpec::new("[fd00:231:2::2]:7000".parse().unwrap()),
                MemberSpec::new("[fd00:231:2::3]:7000".parse().unwrap()),
            ],
        );
        let l6 = vec![NatListener {
            address: "[fd00:231:1::2]:8080".parse().unwrap(),
            protocol: Protocol::Tcp,
        }];
        let p6 = program(
            core.config().policy,
            &core.member_snapshots(Duration::ZERO),
            &l6,
            256,
            Family::V6,
        );
        let addrs: Vec<String> = p6.members.iter().map(|m| m.address.to_string()).collect();
        assert_eq!(addrs, ["[fd00:231:2::2]:7000", "[fd00:231:2::3]:7000"]);
        assert_eq!(p6.map.slots.len(), 2);
        let p4 = program(
            core.config().policy,
            &core.member_snapshots(Duration::ZERO),
            &[],
            256,
            Family::V4,
        );
        assert_eq!(p4.members.len(), 1);
        // An IPv6 session from NEW to DESTROY.
        let vip: SocketAddr = "[fd00:231:1::2]:8080".parse().unwrap();
        let ours = |f: &FlowKey| f.virtual_address == vip;
        let mut tracked = HashMap::new();
        let mut stats = Stats::default();
        let mut e = ev(CtKind::New, 40000, "[fd00:231:2::3]:7000");
        e.client = "[fd00:231:1::1]:40000".parse().unwrap();
        e.virtual_address = vip;
        let by = "kernel-map:round-robin";
        handle(
            &mut core,
            Duration::from_millis(5),
            e.clone(),
            by,
            &ours,
            &mut tracked,
            &mut stats,
        );
        let mut u = e.clone();
        u.kind = CtKind::Update;
        u.seen_reply = true;
        u.assured = true;
        handle(
            &mut core,
            Duration::from_millis(6),
            u,
            by,
            &ours,
            &mut tracked,
            &mut stats,
        );
        let mut d = e.clone();
        d.kind = CtKind::Destroy;
        d.tcp_state = Some(tcp_state::TIME_WAIT);
        handle(
            &mut core,
            Duration::from_millis(900),
            d,
            by,
            &ours,
            &mut tracked,
            &mut stats,
        );
        let r = core.recent_outcomes().last().unwrap().clone();
        assert_eq!(
            r.bound.as_ref().unwrap().address,
            "[fd00:231:2::3]:7000".parse().unwrap()
        );
        assert_eq!(r.reached_ms, Some(6));
        assert_eq!(r.outcome, Some(Outcome::Closed));
        // The same flow to an IPv4 virtual address of the same port is not this listener's.
        let mut other = e;
        other.virtual_address = "10.0.1.2:8080".parse().unwrap();
        handle(
            &mut core,
            Duration::from_millis(950),
            other,
            by,
            &ours,
            &mut tracked,
            &mut stats,
        );
        assert_eq!(core.active_sessions(), 0);
    }

    #[test]
    fn the_program_follows_the_core_dead_members_leave_the_map() {
        let mut h = Harness::new();
        let l = vec![NatListener {
            address: "10.0.1.2:8080".parse().unwrap(),
            protocol: Protocol::Tcp,
        }];
        let p = program(
            h.core.config().policy,
            &h.core.member_snapshots(Duration::ZERO),
            &l,
            256,
            Family::V4,
        );
        assert_eq!(p.map.slots.len(), 2);
        assert_eq!(p.map.fidelity, plan::Fidelity::Exact);
        let m = h.core.member_id("10.0.2.3:7000").unwrap();
        for i in 0..5 {
            h.core.probe_result(
                Duration::from_millis(i),
                m,
                Err("connection refused".to_string()),
            );
        }
        let p2 = program(
            h.core.config().policy,
            &h.core.member_snapshots(Duration::from_millis(10)),
            &l,
            256,
            Family::V4,
        );
        assert_eq!(
            p2.map.slots,
            vec![h.core.member_id("10.0.2.2:7000").unwrap()]
        );
        assert!(!same_rules(&p, &p2));
        assert_eq!(
            by_name(LoadSharePolicy::RoundRobin),
            "kernel-map:round-robin"
        );
    }
}

/// Whether this process holds CAP_NET_ADMIN in its effective set (root has it; so has a
/// service given the capability without being root).
fn has_net_admin() -> bool {
    const CAP_NET_ADMIN: u32 = 12;
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| effective_capabilities(&s))
        .is_some_and(|caps| caps & (1 << CAP_NET_ADMIN) != 0)
}

/// The `CapEff` mask of a `/proc/PID/status` text.
fn effective_capabilities(status: &str) -> Option<u64> {
    let hex = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))?
        .trim();
    u64::from_str_radix(hex, 16).ok()
}

#[cfg(test)]
mod stats_tests {
    use super::Stats;

    #[test]
    fn nat_counters_render_as_prometheus_counters() {
        let s = Stats {
            events: 6,
            lost: 1,
            ..Stats::default()
        };
        let mut out = String::new();
        s.render_prometheus(&mut out);
        assert!(out.contains("# TYPE rserpool_lsnat_nat_events counter\n"));
        assert!(out.contains("\nrserpool_lsnat_nat_events_total 6\n"));
        assert!(out.contains("\nrserpool_lsnat_nat_events_lost_total 1\n"));
        assert!(out.contains("\nrserpool_lsnat_nat_resyncs_total 0\n"));
        assert_eq!(out.lines().filter(|l| !l.starts_with('#')).count(), 11);
    }

    #[test]
    fn the_exit_line_names_each_counter_as_metrics_do() {
        let s = Stats {
            events: 6,
            removed_dead: 2,
            ..Stats::default()
        };
        let line = s.to_string();
        assert!(
            line.starts_with("events_total=6 sessions_adopted_total=0 "),
            "{line}"
        );
        assert!(line.ends_with(" sessions_removed_dead_total=2"), "{line}");
        assert_eq!(line.split(' ').count(), 11);
    }
}

#[cfg(test)]
mod capability_tests {
    use super::effective_capabilities;

    #[test]
    fn the_effective_set_is_read_from_proc_status() {
        let root = "Name:\tx\nCapInh:\t0000000000000000\nCapEff:\t000001ffffffffff\n";
        assert_eq!(effective_capabilities(root), Some(0x1ff_ffff_ffff));
        let net_admin_only = "CapEff:\t0000000000001000\n";
        assert_eq!(effective_capabilities(net_admin_only), Some(1 << 12));
        assert_eq!(effective_capabilities("CapEff:\tzz\n"), None);
        assert_eq!(effective_capabilities("Name:\tx\n"), None);
    }
}
