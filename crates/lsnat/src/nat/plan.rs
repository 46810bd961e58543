//! What NAT mode programs, as pure functions of the core's state: the weight map (which member
//! each numgen slot sends a new session to) and the nftables ruleset that carries it.
//!
//! Nothing here runs `nft` or reads the kernel, so every rule the gateway would program is
//! testable without root.
//!
//! The tables: one per address family the listeners use, both named `nat.table` (family `ip`
//! for IPv4 listeners, family `ip6` for IPv6 ones, where `ip` below reads `ip6`). DNAT cannot
//! translate between families, so a table's members are of its family. Each table:
//!
//! ```text
//! chain prerouting  (nat, dstnat):  ip daddr VIP <proto> dport PORT goto lb_L
//! chain lb_L:       ip saddr & MASK @persist_M goto to_L_M        (persistence, per member)
//!                   numgen inc|random mod N vmap { 0: goto to_L_M, ... }   (the weight map)
//! chain to_L_M:     update @persist_M { ip saddr & MASK }
//!                   meta l4proto <proto> dnat to MEMBER:PORT    (LS-NAPT when the port differs)
//! chain postrouting (nat, srcnat):  ct status dnat ct original ip daddr VIP ... masquerade
//! ```
//!
//! Only the first packet of a connection traverses nat chains; conntrack carries the binding
//! for the rest, so a rule change never moves a bound session (RFC 2391 §2: a session cannot
//! move once bound).

use crate::core::member::{Cost, Health, MemberId};
use crate::core::policy::LoadSharePolicy;
use crate::core::Protocol;
use nftables::batch::Batch;
use nftables::expr::{self, Expression, NamedExpression, SetItem};
use nftables::schema::{self, FlushObject, NfCmd, NfListObject, Nftables, SetFlag, SetType};
use nftables::stmt::{self, Statement};
use nftables::types::{NfChainPolicy, NfChainType, NfFamily, NfHook};
use std::borrow::Cow;
use std::collections::HashSet;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

/// How NAT mode rewrites the client side (one-armed setups, where replies would not pass the
/// gateway otherwise).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SourceNat {
    /// No source translation: the members route replies through the gateway.
    Off,
    /// Masquerade: the source becomes the gateway's address on the way to the member.
    Masquerade,
    /// Source NAT to this address (of the listeners' family).
    To(IpAddr),
}

/// As `nat.source-nat` spells it.
impl std::fmt::Display for SourceNat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SourceNat::Off => f.write_str("off"),
            SourceNat::Masquerade => f.write_str("masquerade"),
            SourceNat::To(a) => write!(f, "{a}"),
        }
    }
}

/// The address family of a table, its listeners and its members.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Family {
    /// IPv4: an nftables table of family `ip`.
    V4,
    /// IPv6: an nftables table of family `ip6`.
    V6,
}

impl Family {
    /// The family of an address.
    pub fn of(a: IpAddr) -> Family {
        match a {
            IpAddr::V4(_) => Family::V4,
            IpAddr::V6(_) => Family::V6,
        }
    }

    /// The nftables family of the table.
    pub fn nf(self) -> NfFamily {
        match self {
            Family::V4 => NfFamily::IP,
            Family::V6 => NfFamily::IP6,
        }
    }

    /// The network header's name in nftables expressions (`ip saddr`, `ip6 saddr`).
    pub fn header(self) -> &'static str {
        match self {
            Family::V4 => "ip",
            Family::V6 => "ip6",
        }
    }

    /// The longest prefix.
    pub fn bits(self) -> u8 {
        match self {
            Family::V4 => 32,
            Family::V6 => 128,
        }
    }

    /// How the configuration and logs name it.
    pub fn name(self) -> &'static str {
        match self {
            Family::V4 => "IPv4",
            Family::V6 => "IPv6",
        }
    }
}

/// Settings of the programmed table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TableSettings {
    /// The table's name.
    pub table: String,
    /// The table's family (`ip` or `ip6`); its listeners and members are of this family.
    pub family: Family,
    /// Source translation.
    pub source_nat: SourceNat,
    /// Most slots in a weight map; weights are scaled down to fit.
    pub max_slots: u32,
    /// Persistence: client netmask (prefix length in the table's family) and timeout; None
    /// when off.
    pub persistence: Option<(u8, Duration)>,
    /// Most entries per member's persistence set.
    pub persistence_max: u32,
    /// Which conntrack events the kernel reports for the gateway's sessions.
    pub events: NatEvents,
}

/// Which conntrack events the kernel generates for a translated session (`ct event set` on
/// its first packet), and so how soon the receipts know what happened. Fewer events cost the
/// kernel and the gateway less per connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NatEvents {
    /// NEW, the answer (TCP: the handshake completed, conntrack's ASSURED; UDP: the first
    /// reply) and DESTROY: three events per session, "reached" when it happens.
    Answer,
    /// NEW and DESTROY only: two events; "reached" is learnt from the DESTROY event (its state
    /// and status), at the end of the session.
    End,
    /// Every event conntrack sends (each TCP state change): half-closes are seen when they
    /// happen; about seven events per short TCP connection.
    All,
}

impl NatEvents {
    /// The configuration's spelling.
    pub fn name(self) -> &'static str {
        match self {
            NatEvents::Answer => "answer",
            NatEvents::End => "end",
            NatEvents::All => "all",
        }
    }

    /// Whether the UPDATE event group is needed.
    pub fn updates(self) -> bool {
        self != NatEvents::End
    }

    /// The `ct event set` mask for a protocol (None: conntrack's default, every event).
    fn mask(self, protocol: Protocol) -> Option<Vec<&'static str>> {
        match (self, protocol) {
            (NatEvents::All, _) => None,
            (NatEvents::End, _) => Some(vec!["new", "destroy"]),
            (NatEvents::Answer, Protocol::Tcp) => Some(vec!["new", "assured", "destroy"]),
            (NatEvents::Answer, Protocol::Udp) => Some(vec!["new", "reply", "destroy"]),
        }
    }
}

/// A virtual address programmed in the kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NatListener {
    /// The virtual address and port.
    pub address: SocketAddr,
    /// TCP or UDP.
    pub protocol: Protocol,
}

/// A member as the core sees it now: the inputs of the weight map.
#[derive(Clone, Debug, PartialEq)]
pub struct MemberView {
    /// The core's number for it.
    pub id: MemberId,
    /// Where sessions go.
    pub address: SocketAddr,
    /// Configured weight (0: draining).
    pub weight: u32,
    /// Liveness state.
    pub health: Health,
    /// Whether the core would offer it to a policy now (alive or in probation or suspect, not
    /// draining, not removed, reachable, below its session ceiling).
    pub eligible: bool,
    /// Slow start: the share of its weight it gets now (1.0 outside probation).
    pub share: f64,
    /// Sessions bound.
    pub sessions: u32,
    /// Traffic over the core's window.
    pub traffic: u64,
    /// Route cost.
    pub cost: Cost,
}

/// How the kernel draws from the weight map.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Draw {
    /// `numgen inc`: slots in turn.
    InTurn,
    /// `numgen random`: a slot drawn uniformly.
    Random,
}

/// Whether the kernel map reproduces the configured policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fidelity {
    /// The kernel makes exactly the policy's choice (numgen over the policy's own sequence).
    Exact,
    /// The map holds the policy's current preference and is refreshed from the core's state;
    /// between refreshes the kernel takes the preferred members in turn.
    Approximated,
}

/// The weight map: slot i of `slots` sends a new session to that member.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WeightMap {
    /// Member per slot.
    pub slots: Vec<MemberId>,
    /// How slots are drawn.
    pub draw: Draw,
    /// Exact or approximated.
    pub fidelity: Fidelity,
}

/// Whether `policy` runs exactly in NAT mode (given no member is in slow start).
pub fn fidelity(policy: LoadSharePolicy) -> Fidelity {
    match policy {
        LoadSharePolicy::RoundRobin
        | LoadSharePolicy::WeightedRoundRobin
        | LoadSharePolicy::Random
        | LoadSharePolicy::WeightedRandom => Fidelity::Exact,
        _ => Fidelity::Approximated,
    }
}

/// Scale used for slow start: a member's weight is multiplied by this before its share is
/// applied, so a share of 0.1 still gets a slot in ten.
const SLOW_START_SCALE: u64 = 10;

/// The weight map for `policy` over `members`. Ineligible members get no slot; a member in
/// slow start gets its weight times its share; weights are reduced by their common divisor
/// and scaled to at most `max_slots` (every member with a positive weight keeps a slot).
pub fn weight_map(policy: LoadSharePolicy, members: &[MemberView], max_slots: u32) -> WeightMap {
    let eligible: Vec<&MemberView> = members.iter().filter(|m| m.eligible).collect();
    let draw = match policy {
        LoadSharePolicy::Random | LoadSharePolicy::WeightedRandom => Draw::Random,
        _ => Draw::InTurn,
    };
    let mut fid = fidelity(policy);
    // Base weights: what the policy prefers now.
    let base: Vec<(MemberId, u64)> = match policy {
        LoadSharePolicy::RoundRobin | LoadSharePolicy::Random => {
            eligible.iter().map(|m| (m.id, 1)).collect()
        }
        LoadSharePolicy::WeightedRoundRobin
        | LoadSharePolicy::WeightedRandom
        | LoadSharePolicy::Pool => eligible
            .iter()
            .map(|m| (m.id, u64::from(m.weight.max(1))))
            .collect(),
        LoadSharePolicy::LeastSessions => minima(&eligible, |m| m.sessions as f64),
        LoadSharePolicy::WeightedLeastSessions => minima(&eligible, |m| {
            m.sessions as f64 / f64::from(m.weight.max(1))
        }),
        LoadSharePolicy::LeastTraffic => minima(&eligible, |m| m.traffic as f64),
        LoadSharePolicy::WeightedLeastTraffic => {
            minima(&eligible, |m| m.traffic as f64 / f64::from(m.weight.max(1)))
        }
        LoadSharePolicy::RouteCost => minima(&eligible, |m| match m.cost {
            Cost::Finite(c) => f64::from(c),
            Cost::Unreachable => f64::INFINITY,
        }),
    };
    // Slow start: probation members get a share of their weight.
    let slow = eligible.iter().any(|m| m.share < 1.0) && base.len() > 1;
    let weights: Vec<(MemberId, u64)> = if slow {
        fid = Fidelity::Approximated;
        base.iter()
            .map(|(id, w)| {
                let share = eligible
                    .iter()
                    .find(|m| m.id == *id)
                    .map_or(1.0, |m| m.share.clamp(0.0, 1.0));
                let scaled = (*w * SLOW_START_SCALE) as f64 * share;
                (*id, (scaled.round() as u64).max(1))
            })
            .collect()
    } else {
        base
    };
    let weights = fit(weights, u64::from(max_slots.max(1)));
    WeightMap {
        slots: smooth_sequence(&weights),
        draw,
        fidelity: fid,
    }
}

/// The members whose `load` is lowest, each with weight 1.
fn minima(members: &[&MemberView], load: impl Fn(&MemberView) -> f64) -> Vec<(MemberId, u64)> {
    let min = members
        .iter()
        .map(|m| load(m))
        .fold(f64::INFINITY, f64::min);
    members
        .iter()
        .filter(|m| load(m) <= min)
        .map(|m| (m.id, 1))
        .collect()
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// Reduces weights by their greatest common divisor, then scales them down to a total of at
/// most `max` (keeping at least one slot each, as far as `max` allows).
fn fit(weights: Vec<(MemberId, u64)>, max: u64) -> Vec<(MemberId, u64)> {
    let g = weights.iter().fold(0, |g, (_, w)| gcd(g, *w)).max(1);
    let mut w: Vec<(MemberId, u64)> = weights.into_iter().map(|(id, w)| (id, w / g)).collect();
    let total: u64 = w.iter().map(|(_, x)| *x).sum();
    if total > max {
        for (_, x) in w.iter_mut() {
            *x = ((*x as u128 * max as u128) / total as u128).max(1) as u64;
        }
        w.truncate(max as usize);
    }
    w
}

/// The smooth weighted round-robin sequence (the same interleaving as the core's
/// weighted-round-robin): each member appears as often as its weight, spread out.
pub fn smooth_sequence(weights: &[(MemberId, u64)]) -> Vec<MemberId> {
    let total: i64 = weights.iter().map(|(_, w)| *w as i64).sum();
    let mut current: Vec<i64> = vec![0; weights.len()];
    let mut out = Vec::with_capacity(total.max(0) as usize);
    for _ in 0..total {
        let mut best = 0;
        for (i, (_, w)) in weights.iter().enumerate() {
            current[i] += *w as i64;
            if current[i] > current[best] {
                best = i;
            }
        }
        current[best] -= total;
        out.push(weights[best].0);
    }
    out
}

/// The name of the load-balancing chain of listener `l`.
pub fn lb_chain(l: usize) -> String {
    format!("lb_{l}")
}

/// The name of the chain that translates listener `l`'s new sessions to member `m`.
pub fn member_chain(l: usize, m: MemberId) -> String {
    format!("to_{l}_m{}", m.0)
}

/// The name of member `m`'s persistence set (client networks recently sent to it).
pub fn persist_set(m: MemberId) -> String {
    format!("persist_m{}", m.0)
}

const PREROUTING: &str = "prerouting";
const POSTROUTING: &str = "postrouting";

fn proto_name(p: Protocol) -> &'static str {
    match p {
        Protocol::Tcp => "tcp",
        Protocol::Udp => "udp",
    }
}

fn payload<'a>(protocol: &'a str, field: &'a str) -> Expression<'a> {
    Expression::Named(NamedExpression::Payload(expr::Payload::PayloadField(
        expr::PayloadField {
            protocol: Cow::Borrowed(protocol),
            field: Cow::Borrowed(field),
        },
    )))
}

fn eq<'a>(left: Expression<'a>, right: Expression<'a>) -> Statement<'a> {
    Statement::Match(stmt::Match {
        left,
        right,
        op: stmt::Operator::EQ,
    })
}

fn string(s: String) -> Expression<'static> {
    Expression::String(Cow::Owned(s))
}

/// The client's network: its source address masked to `mask` bits.
fn client_net(family: Family, mask: u8) -> Expression<'static> {
    let mask = mask.min(family.bits());
    let m = match family {
        Family::V4 => {
            Ipv4Addr::from(u32::MAX.checked_shl(32 - u32::from(mask)).unwrap_or(0)).to_string()
        }
        Family::V6 => {
            Ipv6Addr::from(u128::MAX.checked_shl(128 - u32::from(mask)).unwrap_or(0)).to_string()
        }
    };
    Expression::BinaryOperation(Box::new(expr::BinaryOperation::AND(
        payload(family.header(), "saddr"),
        string(m),
    )))
}

fn ct(key: &'static str, dir: Option<expr::CTDir>) -> Expression<'static> {
    Expression::Named(NamedExpression::CT(expr::CT {
        key: Cow::Borrowed(key),
        family: None,
        dir,
    }))
}

fn goto(target: String) -> Statement<'static> {
    Statement::Goto(stmt::JumpTarget {
        target: Cow::Owned(target),
    })
}

/// Everything one refresh programs: the members that have chains and sets, and the map.
#[derive(Clone, Debug, PartialEq)]
pub struct Program {
    /// The virtual addresses.
    pub listeners: Vec<NatListener>,
    /// Members known to the core (each gets chains and a persistence set).
    pub members: Vec<MemberView>,
    /// The weight map.
    pub map: WeightMap,
}

impl Program {
    /// The program for the core's state now.
    pub fn new(
        policy: LoadSharePolicy,
        listeners: Vec<NatListener>,
        members: Vec<MemberView>,
        max_slots: u32,
    ) -> Program {
        let map = weight_map(policy, &members, max_slots);
        Program {
            listeners,
            members,
            map,
        }
    }

    /// Members with at least one slot, or reachable through persistence.
    fn eligible(&self) -> impl Iterator<Item = &MemberView> {
        self.members.iter().filter(|m| m.eligible)
    }
}

fn table(s: &TableSettings) -> schema::Table<'static> {
    schema::Table {
        family: s.family.nf(),
        name: Cow::Owned(s.table.clone()),
        handle: None,
    }
}

fn chain(s: &TableSettings, name: String) -> schema::Chain<'static> {
    schema::Chain {
        family: s.family.nf(),
        table: Cow::Owned(s.table.clone()),
        name: Cow::Owned(name),
        ..Default::default()
    }
}

fn base_chain(
    s: &TableSettings,
    name: &'static str,
    hook: NfHook,
    prio: i32,
) -> schema::Chain<'static> {
    schema::Chain {
        family: s.family.nf(),
        table: Cow::Owned(s.table.clone()),
        name: Cow::Borrowed(name),
        _type: Some(NfChainType::NAT),
        hook: Some(hook),
        prio: Some(prio),
        policy: Some(NfChainPolicy::Accept),
        ..Default::default()
    }
}

fn set(s: &TableSettings, m: MemberId) -> schema::Set<'static> {
    let timeout = s
        .persistence
        .map(|(_, t)| t.as_secs().clamp(1, u64::from(u32::MAX)) as u32);
    schema::Set {
        family: s.family.nf(),
        table: Cow::Owned(s.table.clone()),
        name: Cow::Owned(persist_set(m)),
        set_type: schema::SetTypeValue::Single(match s.family {
            Family::V4 => SetType::Ipv4Addr,
            Family::V6 => SetType::Ipv6Addr,
        }),
        // nft marks a set that rules update from the packet path "dynamic" itself.
        flags: Some(HashSet::from([SetFlag::Timeout])),
        timeout,
        size: Some(s.persistence_max.max(1)),
        ..Default::default()
    }
}

fn rule(s: &TableSettings, chain: String, expr: Vec<Statement<'static>>) -> schema::Rule<'static> {
    schema::Rule {
        family: s.family.nf(),
        table: Cow::Owned(s.table.clone()),
        chain: Cow::Owned(chain),
        expr: Cow::Owned(expr),
        ..Default::default()
    }
}

/// Creates the table from scratch, whatever was there: a table left by a gateway that was
/// killed is removed in the same transaction (`add` then `delete` then `add`, so the delete
/// cannot fail on a missing table). Only this table is named; no other table is touched.
pub fn fresh_table(s: &TableSettings) -> Nftables<'static> {
    let mut b = Batch::new();
    b.add(NfListObject::Table(table(s)));
    b.delete(NfListObject::Table(table(s)));
    b.add(NfListObject::Table(table(s)));
    b.to_nftables()
}

/// Removes the table (clean exit).
pub fn remove_table(s: &TableSettings) -> Nftables<'static> {
    let mut b = Batch::new();
    b.add(NfListObject::Table(table(s)));
    b.delete(NfListObject::Table(table(s)));
    b.to_nftables()
}

/// One atomic refresh from `prev` (what was programmed last, None after `fresh_table`) to
/// `next`: chains and sets of new members are added, every chain is flushed and filled
/// again, the persistence sets of members that are no longer eligible are flushed (their
/// clients choose again), and the chains and sets of members that left are deleted.
pub fn refresh(s: &TableSettings, prev: Option<&Program>, next: &Program) -> Nftables<'static> {
    let mut b = Batch::new();
    b.add(NfListObject::Table(table(s)));
    b.add(NfListObject::Chain(base_chain(
        s,
        PREROUTING,
        NfHook::Prerouting,
        -100,
    )));
    let snat = s.source_nat != SourceNat::Off;
    if snat {
        b.add(NfListObject::Chain(base_chain(
            s,
            POSTROUTING,
            NfHook::Postrouting,
            100,
        )));
    }
    for (l, _) in next.listeners.iter().enumerate() {
        b.add(NfListObject::Chain(chain(s, lb_chain(l))));
        for m in &next.members {
            b.add(NfListObject::Chain(chain(s, member_chain(l, m.id))));
        }
    }
    if s.persistence.is_some() {
        for m in &next.members {
            b.add(NfListObject::Set(Box::new(set(s, m.id))));
        }
    }
    // Flush every chain that exists now: all of `next`'s (just added, idempotently) and
    // all of `prev`'s; the rules are written again below.
    let next_chains = chain_names(next);
    let prev_chains = prev.map(chain_names).unwrap_or_default();
    let mut flushed = HashSet::new();
    for name in next_chains.iter().chain(prev_chains.iter()) {
        if flushed.insert(name.clone()) {
            b.add_cmd(NfCmd::Flush(FlushObject::Chain(chain(s, name.clone()))));
        }
    }
    if snat {
        b.add_cmd(NfCmd::Flush(FlushObject::Chain(chain(
            s,
            POSTROUTING.to_string(),
        ))));
    }
    // Persistence sets of members that can no longer take sessions are emptied.
    if s.persistence.is_some() {
        if let Some(p) = prev {
            for m in &next.members {
                let was = p
                    .members
                    .iter()
                    .find(|x| x.id == m.id)
                    .is_some_and(|x| x.eligible);
                if was && !m.eligible {
                    b.add_cmd(NfCmd::Flush(FlushObject::Set(Box::new(set(s, m.id)))));
                }
            }
        }
    }
    for r in rules(s, next) {
        b.add(NfListObject::Rule(r));
    }
    // Chains and sets that `next` no longer has (now empty and unreferenced) go.
    for name in &prev_chains {
        if !next_chains.contains(name) {
            b.delete(NfListObject::Chain(chain(s, name.clone())));
        }
    }
    if s.persistence.is_some() {
        if let Some(p) = prev {
            for m in &p.members {
                if !next.members.iter().any(|x| x.id == m.id) {
                    b.delete(NfListObject::Set(Box::new(set(s, m.id))));
                }
            }
        }
    }
    b.to_nftables()
}

/// The regular chains of `p` (prerouting first), in a stable order.
fn chain_names(p: &Program) -> Vec<String> {
    let mut v = vec![PREROUTING.to_string()];
    for (l, _) in p.listeners.iter().enumerate() {
        v.push(lb_chain(l));
        for m in &p.members {
            v.push(member_chain(l, m.id));
        }
    }
    v
}

/// The rules of `p` (without the chains' creation).
pub fn rules(s: &TableSettings, p: &Program) -> Vec<schema::Rule<'static>> {
    let mut out = Vec::new();
    for (l, li) in p.listeners.iter().enumerate() {
        let proto = proto_name(li.protocol);
        let ip = s.family.header();
        let mut e = vec![
            eq(payload(ip, "daddr"), string(li.address.ip().to_string())),
            eq(
                payload(proto, "dport"),
                Expression::Number(u32::from(li.address.port())),
            ),
        ];
        // Only the first packet of a connection passes here: the mask is the session's.
        if let Some(mask) = s.events.mask(li.protocol) {
            e.push(Statement::Mangle(stmt::Mangle {
                key: ct("event", None),
                value: Expression::List(
                    mask.into_iter()
                        .map(|m| Expression::String(Cow::Borrowed(m)))
                        .collect(),
                ),
            }));
        }
        e.push(goto(lb_chain(l)));
        out.push(rule(s, PREROUTING.to_string(), e));
        if let Some((mask, _)) = s.persistence {
            for m in p.eligible() {
                out.push(rule(
                    s,
                    lb_chain(l),
                    vec![
                        eq(
                            client_net(s.family, mask),
                            string(format!("@{}", persist_set(m.id))),
                        ),
                        goto(member_chain(l, m.id)),
                    ],
                ));
            }
        }
        if !p.map.slots.is_empty() {
            let items = p
                .map
                .slots
                .iter()
                .enumerate()
                .map(|(i, m)| {
                    SetItem::MappingStatement(
                        Expression::Number(i as u32),
                        goto(member_chain(l, *m)),
                    )
                })
                .collect();
            out.push(rule(
                s,
                lb_chain(l),
                vec![Statement::VerdictMap(stmt::VerdictMap {
                    key: Expression::Named(NamedExpression::Numgen(expr::Numgen {
                        mode: match p.map.draw {
                            Draw::InTurn => expr::NgMode::Inc,
                            Draw::Random => expr::NgMode::Random,
                        },
                        ng_mod: p.map.slots.len() as u32,
                        offset: None,
                    })),
                    data: Expression::Named(NamedExpression::Set(items)),
                })],
            ));
        }
        for m in &p.members {
            let mut e = Vec::new();
            if let Some((mask, _)) = s.persistence {
                e.push(Statement::Set(stmt::Set {
                    op: stmt::SetOp::Update,
                    elem: client_net(s.family, mask),
                    set: Cow::Owned(format!("@{}", persist_set(m.id))),
                }));
            }
            e.push(eq(
                Expression::Named(NamedExpression::Meta(expr::Meta {
                    key: expr::MetaKey::L4proto,
                })),
                Expression::String(Cow::Borrowed(proto)),
            ));
            e.push(Statement::DNAT(Some(stmt::NAT {
                addr: Some(string(m.address.ip().to_string())),
                family: None,
                port: Some(Expression::Number(u32::from(m.address.port()))),
                flags: None,
            })));
            out.push(rule(s, member_chain(l, m.id), e));
        }
        if s.source_nat != SourceNat::Off {
            let mut e = vec![
                Statement::Match(stmt::Match {
                    left: ct("status", None),
                    right: Expression::String(Cow::Borrowed("dnat")),
                    op: stmt::Operator::IN,
                }),
                eq(
                    ct(
                        match s.family {
                            Family::V4 => "ip daddr",
                            Family::V6 => "ip6 daddr",
                        },
                        Some(expr::CTDir::Original),
                    ),
                    string(li.address.ip().to_string()),
                ),
                eq(
                    ct("protocol", None),
                    Expression::String(Cow::Borrowed(proto)),
                ),
                eq(
                    ct("proto-dst", Some(expr::CTDir::Original)),
                    Expression::Number(u32::from(li.address.port())),
                ),
            ];
            e.push(match &s.source_nat {
                SourceNat::To(a) => Statement::SNAT(Some(stmt::NAT {
                    addr: Some(string(a.to_string())),
                    family: None,
                    port: None,
                    flags: None,
                })),
                _ => Statement::Masquerade(None),
            });
            out.push(rule(s, POSTROUTING.to_string(), e));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    fn m(id: u32, last: u8, weight: u32) -> MemberView {
        MemberView {
            id: MemberId(id),
            address: SocketAddr::from((Ipv4Addr::new(10, 0, 2, last), 7000)),
            weight,
            health: Health::Alive,
            eligible: weight > 0,
            share: 1.0,
            sessions: 0,
            traffic: 0,
            cost: Cost::Finite(0),
        }
    }

    fn count(slots: &[MemberId], id: u32) -> usize {
        slots.iter().filter(|x| x.0 == id).count()
    }

    fn settings() -> TableSettings {
        TableSettings {
            table: "t_test".into(),
            family: Family::V4,
            source_nat: SourceNat::Off,
            max_slots: 256,
            persistence: None,
            persistence_max: 1000,
            events: NatEvents::Answer,
        }
    }

    fn listener() -> NatListener {
        NatListener {
            address: "10.0.1.2:8080".parse().unwrap(),
            protocol: Protocol::Tcp,
        }
    }

    #[test]
    fn round_robin_is_each_eligible_member_once_in_turn() {
        let mut ms = vec![m(0, 2, 5), m(1, 3, 1), m(2, 4, 1)];
        ms[2].health = Health::Dead;
        ms[2].eligible = false;
        let w = weight_map(LoadSharePolicy::RoundRobin, &ms, 256);
        assert_eq!(w.slots, vec![MemberId(0), MemberId(1)]);
        assert_eq!(w.draw, Draw::InTurn);
        assert_eq!(w.fidelity, Fidelity::Exact);
    }

    #[test]
    fn weighted_round_robin_repeats_members_by_weight_smoothly() {
        let ms = vec![m(0, 2, 3), m(1, 3, 1)];
        let w = weight_map(LoadSharePolicy::WeightedRoundRobin, &ms, 256);
        assert_eq!(
            w.slots,
            vec![MemberId(0), MemberId(0), MemberId(1), MemberId(0)]
        );
        assert_eq!(w.fidelity, Fidelity::Exact);
        // Common divisors are removed: 30:10 is the same map.
        let ms = vec![m(0, 2, 30), m(1, 3, 10)];
        assert_eq!(
            weight_map(LoadSharePolicy::WeightedRoundRobin, &ms, 256)
                .slots
                .len(),
            4
        );
    }

    #[test]
    fn weighted_random_draws_randomly_from_repeated_entries() {
        let ms = vec![m(0, 2, 2), m(1, 3, 5)];
        let w = weight_map(LoadSharePolicy::WeightedRandom, &ms, 256);
        assert_eq!(w.draw, Draw::Random);
        assert_eq!((count(&w.slots, 0), count(&w.slots, 1)), (2, 5));
    }

    #[test]
    fn draining_and_dead_members_get_no_slot() {
        let mut ms = vec![m(0, 2, 1), m(1, 3, 0), m(2, 4, 1)];
        ms[2].eligible = false;
        let w = weight_map(LoadSharePolicy::WeightedRoundRobin, &ms, 256);
        assert_eq!(w.slots, vec![MemberId(0)]);
        let none: Vec<MemberView> = vec![];
        assert!(weight_map(LoadSharePolicy::RoundRobin, &none, 256)
            .slots
            .is_empty());
    }

    #[test]
    fn slow_start_gives_a_member_its_share_and_marks_the_map_approximate() {
        let mut ms = vec![m(0, 2, 1), m(1, 3, 1)];
        ms[1].health = Health::Probation;
        ms[1].share = 0.3;
        let w = weight_map(LoadSharePolicy::RoundRobin, &ms, 256);
        assert_eq!((count(&w.slots, 0), count(&w.slots, 1)), (10, 3));
        assert_eq!(w.fidelity, Fidelity::Approximated);
        // A share near zero still leaves one slot (the core offers it with a small chance).
        ms[1].share = 0.0;
        let w = weight_map(LoadSharePolicy::RoundRobin, &ms, 256);
        assert_eq!((count(&w.slots, 0), count(&w.slots, 1)), (10, 1));
    }

    #[test]
    fn least_sessions_prefers_the_least_loaded_now() {
        let mut ms = vec![m(0, 2, 1), m(1, 3, 1), m(2, 4, 1)];
        ms[0].sessions = 5;
        ms[1].sessions = 2;
        ms[2].sessions = 2;
        let w = weight_map(LoadSharePolicy::LeastSessions, &ms, 256);
        assert_eq!(w.slots, vec![MemberId(1), MemberId(2)]);
        assert_eq!(w.fidelity, Fidelity::Approximated);
        ms[0].weight = 10;
        let w = weight_map(LoadSharePolicy::WeightedLeastSessions, &ms, 256);
        assert_eq!(w.slots, vec![MemberId(0)]);
    }

    #[test]
    fn route_cost_keeps_the_cheapest_members() {
        let mut ms = vec![m(0, 2, 1), m(1, 3, 1)];
        ms[0].cost = Cost::Finite(10);
        ms[1].cost = Cost::Finite(3);
        assert_eq!(
            weight_map(LoadSharePolicy::RouteCost, &ms, 256).slots,
            vec![MemberId(1)]
        );
    }

    #[test]
    fn weights_are_scaled_to_the_slot_limit_keeping_every_member() {
        let ms = vec![m(0, 2, 1000), m(1, 3, 1), m(2, 4, 499)];
        let w = weight_map(LoadSharePolicy::WeightedRoundRobin, &ms, 100);
        assert!(w.slots.len() <= 100, "{}", w.slots.len());
        assert!(count(&w.slots, 1) >= 1);
        assert!(count(&w.slots, 0) > count(&w.slots, 2));
    }

    fn json(n: &Nftables<'_>) -> Value {
        serde_json::to_value(n).unwrap()
    }

    fn cmds(v: &Value) -> Vec<Value> {
        v["nftables"].as_array().unwrap().clone()
    }

    #[test]
    fn fresh_table_names_only_the_gateway_table() {
        let v = json(&fresh_table(&settings()));
        let c = cmds(&v);
        assert_eq!(c.len(), 3);
        assert!(c[0]["add"]["table"]["name"] == "t_test");
        assert!(c[1]["delete"]["table"]["name"] == "t_test");
        assert!(c[2]["add"]["table"]["name"] == "t_test");
        let v = json(&remove_table(&settings()));
        assert!(cmds(&v)[1]["delete"]["table"]["name"] == "t_test");
    }

    #[test]
    fn rules_translate_the_virtual_address_to_members_through_the_map() {
        let ms = vec![m(0, 2, 1), m(1, 3, 1)];
        let p = Program::new(LoadSharePolicy::RoundRobin, vec![listener()], ms, 256);
        let s = serde_json::to_string(&rules(&settings(), &p)).unwrap();
        // prerouting: the virtual address and port go to lb_0.
        assert!(s.contains(r#""right":"10.0.1.2""#), "{s}");
        assert!(
            s.contains(r#""protocol":"tcp","field":"dport"}},"right":8080"#),
            "{s}"
        );
        assert!(s.contains(r#"{"goto":{"target":"lb_0"}}"#), "{s}");
        // the map: numgen inc mod 2 over the two member chains.
        assert!(s.contains(r#""numgen":{"mode":"inc","mod":2}"#), "{s}");
        assert!(s.contains(r#"[0,{"goto":{"target":"to_0_m0"}}]"#), "{s}");
        assert!(s.contains(r#"[1,{"goto":{"target":"to_0_m1"}}]"#), "{s}");
        // member chains: DNAT with the member's port (LS-NAPT).
        assert!(
            s.contains(r#"{"dnat":{"addr":"10.0.2.2","port":7000}}"#),
            "{s}"
        );
        assert!(
            s.contains(r#"{"dnat":{"addr":"10.0.2.3","port":7000}}"#),
            "{s}"
        );
        assert!(!s.contains("masquerade"));
        assert!(!s.contains("persist_"));
        // Every rule is in the gateway's table.
        for r in rules(&settings(), &p) {
            assert_eq!(r.table, "t_test");
        }
    }

    #[test]
    fn the_first_packet_sets_which_conntrack_events_the_session_sends() {
        let p = Program::new(
            LoadSharePolicy::RoundRobin,
            vec![listener()],
            vec![m(0, 2, 1)],
            256,
        );
        let text = |events| {
            let mut st = settings();
            st.events = events;
            serde_json::to_string(&rules(&st, &p)).unwrap()
        };
        assert!(text(NatEvents::Answer).contains(
            r#"{"mangle":{"key":{"ct":{"key":"event"}},"value":["new","assured","destroy"]}}"#
        ));
        assert!(text(NatEvents::End)
            .contains(r#"{"mangle":{"key":{"ct":{"key":"event"}},"value":["new","destroy"]}}"#));
        assert!(!text(NatEvents::All).contains("mangle"));
        assert!(NatEvents::Answer.updates() && NatEvents::All.updates());
        assert!(!NatEvents::End.updates());
    }

    #[test]
    fn persistence_and_masquerade_add_their_rules() {
        let mut st = settings();
        st.persistence = Some((24, Duration::from_secs(300)));
        st.source_nat = SourceNat::Masquerade;
        let mut ms = vec![m(0, 2, 1), m(1, 3, 1)];
        ms[1].eligible = false;
        let p = Program::new(LoadSharePolicy::RoundRobin, vec![listener()], ms, 256);
        let s = serde_json::to_string(&rules(&st, &p)).unwrap();
        // Lookup by client /24 before the map, for eligible members only.
        assert!(s.contains(r#"{"match":{"left":{"&":[{"payload":{"protocol":"ip","field":"saddr"}},"255.255.255.0"]},"right":"@persist_m0","op":"=="}}"#), "{s}");
        assert!(!s.contains(r#""right":"@persist_m1""#), "{s}");
        // The member chain remembers the client network.
        assert!(s.contains(r#"{"set":{"op":"update","elem":{"&":[{"payload":{"protocol":"ip","field":"saddr"}},"255.255.255.0"]},"set":"@persist_m0"}}"#), "{s}");
        assert!(s.contains(r#"{"masquerade":null}"#), "{s}");
        st.source_nat = SourceNat::To(Ipv4Addr::new(10, 0, 2, 1).into());
        let s = serde_json::to_string(&rules(&st, &p)).unwrap();
        assert!(s.contains(r#"{"snat":{"addr":"10.0.2.1"}}"#), "{s}");
    }

    #[test]
    fn refresh_flushes_sets_of_members_that_died_and_deletes_members_that_left() {
        let mut st = settings();
        st.persistence = Some((32, Duration::from_secs(60)));
        let before = Program::new(
            LoadSharePolicy::RoundRobin,
            vec![listener()],
            vec![m(0, 2, 1), m(1, 3, 1), m(2, 4, 1)],
            256,
        );
        let mut now = vec![m(0, 2, 1), m(1, 3, 1)];
        now[1].eligible = false; // judged dead
        let after = Program::new(LoadSharePolicy::RoundRobin, vec![listener()], now, 256);
        assert_eq!(after.map.slots, vec![MemberId(0)]);
        let v = json(&refresh(&st, Some(&before), &after));
        let c = cmds(&v);
        let flushed_sets: Vec<&Value> = c
            .iter()
            .filter_map(|x| x.get("flush").and_then(|f| f.get("set")))
            .collect();
        assert_eq!(flushed_sets.len(), 1);
        assert_eq!(flushed_sets[0]["name"], "persist_m1");
        let deleted: Vec<String> = c
            .iter()
            .filter_map(|x| x.get("delete"))
            .map(|d| d.to_string())
            .collect();
        assert!(deleted.iter().any(|d| d.contains("to_0_m2")), "{deleted:?}");
        assert!(
            deleted.iter().any(|d| d.contains("persist_m2")),
            "{deleted:?}"
        );
        assert_eq!(deleted.len(), 2);
        // Deletions come after the rules that stopped referencing them.
        let last_rule = c
            .iter()
            .rposition(|x| x.get("add").is_some_and(|a| a.get("rule").is_some()));
        let first_delete = c.iter().position(|x| x.get("delete").is_some());
        assert!(last_rule < first_delete);
        // Nothing outside the gateway's table.
        assert!(!v.to_string().contains(r#""table":"filter""#));
    }

    #[test]
    fn an_ipv6_table_translates_to_ipv6_members_with_prefix_persistence() {
        let mut st = settings();
        st.family = Family::V6;
        st.persistence = Some((64, Duration::from_secs(300)));
        st.source_nat = SourceNat::Masquerade;
        let member = |id: u32, a: &str| MemberView {
            address: a.parse().unwrap(),
            ..m(id, 2, 1)
        };
        let l = NatListener {
            address: "[fd00:231:1::2]:8080".parse().unwrap(),
            protocol: Protocol::Tcp,
        };
        let p = Program::new(
            LoadSharePolicy::RoundRobin,
            vec![l],
            vec![
                member(0, "[fd00:231:2::2]:7000"),
                member(1, "[fd00:231:2::3]:7001"),
            ],
            256,
        );
        let s = serde_json::to_string(&rules(&st, &p)).unwrap();
        assert!(s.contains(r#"{"match":{"left":{"payload":{"protocol":"ip6","field":"daddr"}},"right":"fd00:231:1::2","op":"=="}}"#), "{s}");
        assert!(
            s.contains(r#"{"dnat":{"addr":"fd00:231:2::2","port":7000}}"#),
            "{s}"
        );
        assert!(
            s.contains(r#"{"dnat":{"addr":"fd00:231:2::3","port":7001}}"#),
            "{s}"
        );
        // Clients are grouped by their /64.
        assert!(
            s.contains(
                r#"{"&":[{"payload":{"protocol":"ip6","field":"saddr"}},"ffff:ffff:ffff:ffff::"]}"#
            ),
            "{s}"
        );
        assert!(
            s.contains(r#"{"ct":{"key":"ip6 daddr","dir":"original"}}"#),
            "{s}"
        );
        assert!(!s.contains(r#""protocol":"ip","#), "{s}");
        // The table, chains, sets and rules are all of family ip6.
        let v = json(&refresh(&st, None, &p));
        for c in cmds(&v) {
            let (_, obj) = c.as_object().unwrap().iter().next().unwrap();
            let (_, inner) = obj.as_object().unwrap().iter().next().unwrap();
            assert_eq!(inner["family"], "ip6", "{c}");
        }
        assert!(v.to_string().contains(r#""type":"ipv6_addr""#), "{v}");
        let v = json(&fresh_table(&st));
        assert!(cmds(&v)
            .iter()
            .all(|c| c.to_string().contains(r#""family":"ip6""#)));
        // Prefix lengths beyond the family's are the whole address; zero is every client.
        assert_eq!(
            serde_json::to_string(&client_net(Family::V6, 200)).unwrap(),
            r#"{"&":[{"payload":{"protocol":"ip6","field":"saddr"}},"ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"]}"#
        );
        assert!(serde_json::to_string(&client_net(Family::V6, 0))
            .unwrap()
            .contains(r#""::""#));
        assert!(serde_json::to_string(&client_net(Family::V4, 0))
            .unwrap()
            .contains(r#""0.0.0.0""#));
    }
}
