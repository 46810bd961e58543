//! The sans-IO core in virtual time: policies, persistence, timers, liveness, slow start,
//! draining, panic threshold, limits and receipts, with a seeded RNG and no sockets.

use rand::rngs::StdRng;
use rand::SeedableRng;
use rserpool_lsnat::core::member::{Cost, Health, MemberId, MemberSpec};
use rserpool_lsnat::core::policy::{LoadSharePolicy, TrafficMetric};
use rserpool_lsnat::core::receipt::{Outcome, RefusalReason, Side};
use rserpool_lsnat::core::{
    Action, CoreConfig, FlowKey, Gateway, Protocol, SessionId, SessionState, Time, Traffic,
};
use rserpool_wire::PoolPolicy;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::Duration;

fn t(ms: u64) -> Time {
    Duration::from_millis(ms)
}

fn addr(port: u16) -> SocketAddr {
    SocketAddr::from(([10, 0, 0, 1], port))
}

fn member(port: u16) -> MemberSpec {
    MemberSpec::new(addr(port))
}

fn gateway(cfg: CoreConfig, members: Vec<MemberSpec>) -> Gateway {
    let mut g = Gateway::new(cfg, Box::new(StdRng::seed_from_u64(7)));
    g.set_members(t(0), members);
    g
}

fn flow(client_port: u16) -> FlowKey {
    flow_from([192, 0, 2, 1], client_port)
}

fn flow_from(ip: [u8; 4], client_port: u16) -> FlowKey {
    FlowKey {
        protocol: Protocol::Tcp,
        client: SocketAddr::from((ip, client_port)),
        virtual_address: SocketAddr::from(([203, 0, 113, 1], 80)),
    }
}

fn udp_flow(client_port: u16) -> FlowKey {
    FlowKey {
        protocol: Protocol::Udp,
        ..flow(client_port)
    }
}

fn policy(p: LoadSharePolicy) -> CoreConfig {
    CoreConfig {
        policy: p,
        ..CoreConfig::default()
    }
}

/// Opens and connects a session; returns it and the member's port.
fn open(g: &mut Gateway, now: Time, f: FlowKey) -> (SessionId, u16) {
    let b = g.open(now, f).expect("bound");
    g.connected(now, b.session);
    (b.session, b.address.port())
}

fn ports(g: &mut Gateway, n: u16, close: bool) -> Vec<u16> {
    (0..n)
        .map(|i| {
            let (id, port) = open(g, t(1), flow(1000 + i));
            if close {
                g.closed(t(1), id, Outcome::Closed);
            }
            port
        })
        .collect()
}

#[test]
fn round_robin_takes_members_in_turn() {
    let mut g = gateway(
        policy(LoadSharePolicy::RoundRobin),
        vec![member(1), member(2), member(3)],
    );
    assert_eq!(ports(&mut g, 6, true), vec![1, 2, 3, 1, 2, 3]);
}

#[test]
fn weighted_round_robin_follows_weights_interleaved() {
    let mut g = gateway(
        policy(LoadSharePolicy::WeightedRoundRobin),
        vec![member(1).weight(3), member(2).weight(1)],
    );
    let got = ports(&mut g, 8, true);
    assert_eq!(got.iter().filter(|p| **p == 1).count(), 6);
    assert_eq!(got.iter().filter(|p| **p == 2).count(), 2);
    // Smooth: the light member is not starved for a whole cycle of the heavy one.
    assert!(got[..4].contains(&2), "{got:?}");
}

#[test]
fn least_sessions_picks_the_member_with_fewest_bindings() {
    let mut g = gateway(
        policy(LoadSharePolicy::LeastSessions),
        vec![member(1), member(2)],
    );
    // Two sessions stay open on whichever members they land; closing the one on member 1
    // makes member 1 the least loaded.
    let (a, pa) = open(&mut g, t(1), flow(1));
    let (_b, pb) = open(&mut g, t(1), flow(2));
    assert_ne!(pa, pb);
    let first = if pa == 1 { a } else { _b };
    g.closed(t(2), first, Outcome::Closed);
    let (_, next) = open(&mut g, t(3), flow(3));
    assert_eq!(next, 1);
    let (_, next) = open(&mut g, t(3), flow(4));
    // Now 1 and 2 have one each: tie broken in turn, after member 1.
    assert_eq!(next, 2);
}

#[test]
fn weighted_least_sessions_divides_by_weight() {
    let mut g = gateway(
        policy(LoadSharePolicy::WeightedLeastSessions),
        vec![member(1).weight(4), member(2).weight(1)],
    );
    let got = ports(&mut g, 10, false);
    assert_eq!(got.iter().filter(|p| **p == 1).count(), 8, "{got:?}");
}

#[test]
fn least_traffic_counts_traffic_over_the_window_only() {
    let cfg = CoreConfig {
        policy: LoadSharePolicy::LeastTraffic,
        traffic_metric: TrafficMetric::Bytes,
        traffic_window: Duration::from_secs(10),
        ..CoreConfig::default()
    };
    let mut g = gateway(cfg, vec![member(1), member(2)]);
    let (a, pa) = open(&mut g, t(0), flow(1));
    assert_eq!(pa, 1);
    g.activity(
        t(100),
        a,
        Traffic {
            bytes: 1_000_000,
            packets: 10,
        },
        Traffic::default(),
    );
    g.closed(t(200), a, Outcome::Closed);
    // Member 1 carried a megabyte: the next three sessions go to member 2 (no traffic yet).
    for i in 0..3 {
        let (id, p) = open(&mut g, t(300), flow(10 + i));
        assert_eq!(p, 2);
        g.closed(t(300), id, Outcome::Closed);
    }
    // Once the window has passed, member 1's megabyte no longer counts: both are at 0 bytes,
    // and the tie goes in turn.
    let later: Vec<u16> = (0..2)
        .map(|i| open(&mut g, t(20_000), flow(20 + i)).1)
        .collect();
    assert!(later.contains(&1), "{later:?}");
}

#[test]
fn least_traffic_by_packets() {
    let cfg = CoreConfig {
        policy: LoadSharePolicy::LeastTraffic,
        traffic_metric: TrafficMetric::Packets,
        ..CoreConfig::default()
    };
    let mut g = gateway(cfg, vec![member(1), member(2)]);
    let (a, _) = open(&mut g, t(0), flow(1));
    let (b, _) = open(&mut g, t(0), flow(2));
    // Member 1 gets many small packets, member 2 few large ones.
    g.activity(
        t(1),
        a,
        Traffic {
            bytes: 100,
            packets: 100,
        },
        Traffic::default(),
    );
    g.activity(
        t(1),
        b,
        Traffic {
            bytes: 100_000,
            packets: 2,
        },
        Traffic::default(),
    );
    assert_eq!(open(&mut g, t(2), flow(3)).1, 2);
}

#[test]
fn route_cost_prefers_cheapest_and_never_uses_unreachable() {
    let mut g = gateway(
        policy(LoadSharePolicy::RouteCost),
        vec![
            member(1).cost(Cost::Finite(10)),
            member(2).cost(Cost::Finite(5)),
            member(3).cost(Cost::Unreachable),
        ],
    );
    let got = ports(&mut g, 4, false);
    // Cheapest first; with sessions piling up on it, cost still wins (sessions only break ties).
    assert_eq!(got, vec![2, 2, 2, 2]);
    // Unreachable is excluded under every policy.
    let mut g = gateway(
        policy(LoadSharePolicy::RoundRobin),
        vec![member(1), member(3).cost(Cost::Unreachable)],
    );
    assert_eq!(ports(&mut g, 3, true), vec![1, 1, 1]);
}

#[test]
fn random_policies_follow_weights_with_a_seeded_rng() {
    let mut g = gateway(
        policy(LoadSharePolicy::WeightedRandom),
        vec![member(1).weight(3), member(2).weight(1)],
    );
    let got = ports(&mut g, 1000, true);
    let ones = got.iter().filter(|p| **p == 1).count();
    assert!((650..=850).contains(&ones), "{ones}");
    let mut g = gateway(policy(LoadSharePolicy::Random), vec![member(1), member(2)]);
    let got = ports(&mut g, 1000, true);
    let ones = got.iter().filter(|p| **p == 1).count();
    assert!((400..=600).contains(&ones), "{ones}");
}

#[test]
fn pool_policy_uses_rserpool_values_and_refuses_without_them() {
    let with = |port: u16, p: PoolPolicy| {
        let mut s = member(port);
        s.pool_policy = Some(p);
        s
    };
    let mut g = gateway(
        policy(LoadSharePolicy::Pool),
        vec![
            with(1, PoolPolicy::LeastUsed { load: 0x8000_0000 }),
            with(2, PoolPolicy::LeastUsed { load: 0x1000_0000 }),
        ],
    );
    assert_eq!(ports(&mut g, 3, true), vec![2, 2, 2]);
    let mut g = gateway(
        policy(LoadSharePolicy::Pool),
        vec![
            with(1, PoolPolicy::Priority { priority: 1 }),
            with(2, PoolPolicy::Priority { priority: 9 }),
        ],
    );
    assert_eq!(ports(&mut g, 2, true), vec![2, 2]);
    let mut g = gateway(policy(LoadSharePolicy::Pool), vec![member(1)]);
    assert_eq!(g.open(t(0), flow(1)), Err(RefusalReason::PolicyUnavailable));
}

#[test]
fn persistence_keeps_a_client_network_on_its_member_until_the_timeout() {
    let mut cfg = policy(LoadSharePolicy::RoundRobin);
    cfg.persistence.timeout = Duration::from_secs(300);
    cfg.persistence.netmask_v4 = 24;
    let mut g = gateway(cfg, vec![member(1), member(2), member(3)]);
    let (a, pa) = open(&mut g, t(0), flow_from([192, 0, 2, 1], 1));
    // Same /24, other address and port: same member, chosen by persistence.
    let (b, pb) = open(&mut g, t(10), flow_from([192, 0, 2, 77], 2));
    assert_eq!(pa, pb);
    assert_eq!(g.receipt(b).unwrap().selected[0].by, "persistence");
    // Another network goes elsewhere.
    let (_, pc) = open(&mut g, t(10), flow_from([198, 51, 100, 1], 3));
    assert_ne!(pc, pa);
    g.closed(t(20), a, Outcome::Closed);
    g.closed(t(20), b, Outcome::Closed);
    // Within the timeout after the last session: still remembered.
    let (d, pd) = open(&mut g, t(200_000), flow_from([192, 0, 2, 5], 4));
    assert_eq!(pd, pa);
    g.closed(t(200_000), d, Outcome::Closed);
    // After it: chosen afresh by the policy.
    g.poll(t(600_000));
    let b = g.open(t(600_000), flow_from([192, 0, 2, 5], 5)).unwrap();
    assert_eq!(g.receipt(b.session).unwrap().selected[0].by, "round-robin");
}

#[test]
fn persistence_does_not_send_clients_to_a_dead_or_draining_member() {
    let mut cfg = policy(LoadSharePolicy::RoundRobin);
    cfg.persistence.timeout = Duration::from_secs(300);
    let mut g = gateway(cfg, vec![member(1), member(2)]);
    let (a, pa) = open(&mut g, t(0), flow(1));
    g.closed(t(1), a, Outcome::Closed);
    let id = g.member_id(&addr(pa).to_string()).unwrap();
    for _ in 0..3 {
        g.probe_result(t(2), id, Err("refused".into()));
    }
    let (_, pb) = open(&mut g, t(3), flow(2));
    assert_ne!(pb, pa);
}

#[test]
fn tcp_idle_timers_follow_the_session_state() {
    let mut cfg = CoreConfig::default();
    cfg.timers.tcp_established = Duration::from_secs(100);
    cfg.timers.tcp_transitory = Duration::from_secs(10);
    let mut g = gateway(cfg, vec![member(1)]);
    let (a, _) = open(&mut g, t(0), flow(1));
    let (b, _) = open(&mut g, t(0), flow(2));
    // Activity keeps a alive past b's deadline.
    g.activity(
        t(60_000),
        a,
        Traffic {
            bytes: 1,
            packets: 1,
        },
        Traffic::default(),
    );
    g.poll(t(100_000));
    assert_eq!(g.session_state(a), Some(SessionState::Established));
    assert_eq!(g.session_state(b), None);
    let actions = g.take_actions();
    assert_eq!(
        actions,
        vec![Action::Close {
            session: b,
            outcome: Outcome::IdleTimeout {
                state: "established"
            }
        }]
    );
    // Half-closed: the transitory timer applies.
    g.half_closed(t(100_000), a, Side::Client);
    g.poll(t(109_000));
    assert!(g.session_state(a).is_some());
    g.poll(t(110_001));
    assert!(g.session_state(a).is_none());
    assert_eq!(g.outcome_count("idle_timeout"), 2);
    assert_eq!(g.outcome_count("closed"), 0);
    assert_eq!(g.active_sessions(), 0);
}

#[test]
fn ended_sessions_leave_no_timer_behind_and_live_timers_still_fire() {
    // Sessions that end before their idle timer (every short connection; in NAT mode all of
    // them, since conntrack owns the timers) must not accumulate in the timer heap.
    let mut cfg = CoreConfig::default();
    cfg.timers.tcp_established = Duration::from_secs(100);
    cfg.timers.tcp_transitory = Duration::from_secs(10);
    let mut g = gateway(cfg, vec![member(1), member(2)]);
    let (kept, _) = open(&mut g, t(0), flow(1));
    for i in 0..50_000u32 {
        let f = flow_from([192, 0, 2, (i / 60_000) as u8 + 2], (i % 60_000) as u16 + 1);
        let (id, _) = open(&mut g, t(1), f);
        g.half_closed(t(1), id, Side::Client);
        g.closed(t(1), id, Outcome::Closed);
    }
    assert!(
        g.deadline_entries() <= 2 + 1024 + 1, // twice the live sessions, plus the slack
        "{} timer entries for one live session",
        g.deadline_entries()
    );
    // The live session's timer survived the compactions.
    g.poll(t(99_000));
    assert!(g.session_state(kept).is_some());
    g.poll(t(100_001));
    assert_eq!(g.session_state(kept), None);
    assert_eq!(g.outcome_count("idle_timeout"), 1);
    assert_eq!(g.outcome_count("closed"), 50_000);
}

#[test]
fn udp_flow_times_out_after_its_idle_timer() {
    let mut cfg = CoreConfig::default();
    cfg.timers.udp = Duration::from_secs(5);
    let mut g = gateway(cfg, vec![member(1)]);
    let b = g.open(t(0), udp_flow(1)).unwrap();
    assert_eq!(g.lookup(&udp_flow(1)).unwrap().session, b.session);
    g.activity(
        t(4_000),
        b.session,
        Traffic {
            bytes: 10,
            packets: 1,
        },
        Traffic::default(),
    );
    g.poll(t(8_000));
    assert!(g.lookup(&udp_flow(1)).is_some());
    g.poll(t(9_001));
    assert!(g.lookup(&udp_flow(1)).is_none());
    let r = g.recent_outcomes().last().unwrap();
    assert_eq!(r.outcome, Some(Outcome::IdleTimeout { state: "udp" }));
}

#[test]
fn reset_binding_lingers_without_holding_a_session_slot() {
    let mut cfg = CoreConfig::default();
    cfg.timers.tcp_rst_linger = Duration::from_secs(240);
    cfg.limits.max_sessions = 1;
    let mut g = gateway(cfg, vec![member(1)]);
    let (a, _) = open(&mut g, t(0), flow(1));
    g.closed(t(10), a, Outcome::Reset { by: Side::Member });
    // The binding is still found (a packet-level data plane routes stragglers by it)…
    assert_eq!(g.lookup(&flow(1)).map(|b| b.session), Some(a));
    assert_eq!(g.session_state(a), Some(SessionState::ResetLinger));
    // …but the slot is free.
    assert_eq!(g.active_sessions(), 0);
    assert!(g.open(t(20), flow(2)).is_ok());
    g.poll(t(250_011));
    assert!(g.lookup(&flow(1)).is_none());
    assert_eq!(g.outcome_count("reset"), 1);
}

fn dead_after_failures(g: &mut Gateway, id: MemberId, now: Time, n: u32) {
    for _ in 0..n {
        g.probe_result(now, id, Err("timed out".into()));
    }
}

#[test]
fn liveness_alive_suspect_dead_probation_alive() {
    let mut cfg = CoreConfig::default();
    cfg.health.liveness.fall = 3;
    cfg.health.liveness.rise = 2;
    cfg.health.liveness.slow_start = Duration::from_secs(10);
    let mut g = gateway(cfg, vec![member(1), member(2)]);
    let m1 = g.member_id(&addr(1).to_string()).unwrap();
    g.probe_result(t(0), m1, Err("refused".into()));
    assert_eq!(g.member_health(m1), Some(Health::Suspect));
    // Suspect is still eligible.
    assert!(ports(&mut g, 2, true).contains(&1));
    // A completed connect is not evidence of life: still suspect.
    assert_eq!(g.member_health(m1), Some(Health::Suspect));
    g.probe_result(t(1), m1, Err("refused".into()));
    g.probe_result(t(2), m1, Err("refused".into()));
    assert_eq!(g.member_health(m1), Some(Health::Dead));
    assert_eq!(ports(&mut g, 6, true), vec![2; 6]);
    // One success is not enough to come back (rise 2).
    g.probe_result(t(3), m1, Ok(()));
    assert_eq!(g.member_health(m1), Some(Health::Dead));
    g.probe_result(t(4), m1, Ok(()));
    assert_eq!(g.member_health(m1), Some(Health::Probation));
    // Probation ends after slow_start.
    g.poll(t(10_003));
    assert_eq!(g.member_health(m1), Some(Health::Probation));
    g.poll(t(10_004));
    assert_eq!(g.member_health(m1), Some(Health::Alive));
}

#[test]
fn a_failure_on_probation_is_dead_again() {
    let mut g = gateway(CoreConfig::default(), vec![member(1), member(2)]);
    let m1 = g.member_id(&addr(1).to_string()).unwrap();
    dead_after_failures(&mut g, m1, t(0), 3);
    g.probe_result(t(1), m1, Ok(()));
    g.probe_result(t(2), m1, Ok(()));
    assert_eq!(g.member_health(m1), Some(Health::Probation));
    g.probe_result(t(3), m1, Err("refused".into()));
    assert_eq!(g.member_health(m1), Some(Health::Dead));
}

#[test]
fn slow_start_gives_a_returning_member_a_rising_share() {
    let mut cfg = policy(LoadSharePolicy::LeastSessions);
    cfg.health.liveness.slow_start = Duration::from_secs(100);
    let mut g = gateway(cfg, vec![member(1), member(2)]);
    let m1 = g.member_id(&addr(1).to_string()).unwrap();
    dead_after_failures(&mut g, m1, t(0), 3);
    // Member 2 is loaded with 50 sessions while member 1 is dead.
    for i in 0..50 {
        open(&mut g, t(1), flow(i));
    }
    g.probe_result(t(2), m1, Ok(()));
    g.probe_result(t(2), m1, Ok(()));
    assert_eq!(g.member_health(m1), Some(Health::Probation));
    // Least-sessions alone would send everything to member 1 now; slow start holds it back.
    let count_to_1 = |g: &mut Gateway, at: u64, base: u16| {
        (0..200)
            .filter(|i| {
                let b = g.open(t(at), flow(base + i)).unwrap();
                let p = b.address.port();
                g.closed(t(at), b.session, Outcome::Closed);
                p == 1
            })
            .count()
    };
    let early = count_to_1(&mut g, 3_000, 1_000);
    let late = count_to_1(&mut g, 80_000, 2_000);
    assert!(early < 40, "early share {early}/200");
    assert!(late > 120, "late share {late}/200");
    assert!(late > early);
}

#[test]
fn revive_after_returns_a_dead_member_without_active_probes() {
    let mut cfg = CoreConfig::default();
    cfg.health.liveness.active_probes = false;
    cfg.health.liveness.revive_after = Duration::from_secs(30);
    cfg.health.liveness.slow_start = Duration::ZERO;
    let mut g = gateway(cfg, vec![member(1)]);
    let m1 = g.member_id(&addr(1).to_string()).unwrap();
    for _ in 0..3 {
        let b = g.open(t(0), flow(1)).unwrap();
        g.connect_failed(t(0), b.session, "connection refused");
    }
    assert_eq!(g.member_health(m1), Some(Health::Dead));
    assert_eq!(g.open(t(1), flow(2)), Err(RefusalReason::NoMember));
    g.poll(t(30_000));
    assert_eq!(g.member_health(m1), Some(Health::Alive));
    assert!(g.open(t(30_001), flow(3)).is_ok());
}

#[test]
fn draining_member_keeps_its_sessions_and_gets_no_new_ones() {
    let mut g = gateway(
        policy(LoadSharePolicy::RoundRobin),
        vec![member(1), member(2)],
    );
    let (a, pa) = open(&mut g, t(0), flow(1));
    assert_eq!(pa, 1);
    g.set_members(t(1), vec![member(1).weight(0), member(2)]);
    assert_eq!(ports(&mut g, 4, true), vec![2; 4]);
    // The bound session continues and ends normally.
    g.activity(
        t(2),
        a,
        Traffic {
            bytes: 5,
            packets: 1,
        },
        Traffic::default(),
    );
    assert!(g.closed(t(3), a, Outcome::Closed));
    let st = g.status(t(3));
    assert_eq!(st.members[0].state, "draining");
    // A removed member also drains, then leaves once its last session ends.
    let (b, pb) = open(&mut g, t(4), flow(9));
    assert_eq!(pb, 2);
    g.set_members(t(5), vec![member(1)]);
    assert!(g.member_id(&addr(2).to_string()).is_some());
    g.closed(t(6), b, Outcome::Closed);
    assert!(g.member_id(&addr(2).to_string()).is_none());
}

#[test]
fn panic_threshold_ignores_health_when_too_few_are_live() {
    let mut cfg = policy(LoadSharePolicy::RoundRobin);
    cfg.health.panic_threshold_percent = 50;
    let mut g = gateway(cfg, vec![member(1), member(2), member(3), member(4)]);
    let id = |g: &Gateway, p| g.member_id(&addr(p).to_string()).unwrap();
    let (m1, m2, m3) = (id(&g, 1), id(&g, 2), id(&g, 3));
    dead_after_failures(&mut g, m1, t(0), 3);
    dead_after_failures(&mut g, m2, t(0), 3);
    // 2 of 4 live = 50 %: not below the threshold, health is honoured.
    let got = ports(&mut g, 4, true);
    assert!(!got.contains(&1) && !got.contains(&2), "{got:?}");
    dead_after_failures(&mut g, m3, t(0), 3);
    // 1 of 4 live: panic, every member is a candidate again.
    let b = g.open(t(1), flow(99)).unwrap();
    assert!(g.receipt(b.session).unwrap().selected[0].panic);
    let got = ports(&mut g, 8, true);
    assert!(got.contains(&1) && got.contains(&4), "{got:?}");
    assert!(g
        .render_metrics()
        .contains("rserpool_lsnat_panic_selections_total 9"));
}

#[test]
fn limits_refuse_and_count() {
    let mut cfg = policy(LoadSharePolicy::RoundRobin);
    cfg.limits.max_sessions = 3;
    cfg.limits.max_sessions_per_member = 2;
    let mut spec = member(2);
    spec.max_sessions = Some(1);
    let mut g = gateway(cfg, vec![member(1), spec]);
    let got = ports(&mut g, 3, false);
    assert_eq!(got.iter().filter(|p| **p == 2).count(), 1, "{got:?}");
    assert_eq!(g.open(t(2), flow(50)), Err(RefusalReason::MaxSessions));
    assert_eq!(g.refused_count(RefusalReason::MaxSessions), 1);
    // Raise the overall limit: now both members are at their own ceilings.
    let mut cfg = policy(LoadSharePolicy::RoundRobin);
    cfg.limits.max_sessions_per_member = 1;
    let mut g = gateway(cfg, vec![member(1), member(2)]);
    ports(&mut g, 2, false);
    assert_eq!(g.open(t(2), flow(50)), Err(RefusalReason::MemberLimit));
    assert_eq!(g.outcome_count("refused"), 1);
    let r = g.recent_outcomes().last().unwrap();
    assert!(r.selected.is_empty() && r.bound.is_none());
    assert!(g
        .render_metrics()
        .contains("rserpool_lsnat_refused_total{reason=\"member_limit\"} 1"));
}

#[test]
fn session_on_a_member_that_dies_is_lost_never_completed() {
    let mut g = gateway(CoreConfig::default(), vec![member(1), member(2)]);
    let (a, pa) = open(&mut g, t(0), flow(1));
    g.client_data(t(1), a);
    g.reached(t(2), a);
    let (b, _) = open(&mut g, t(3), flow(2));
    let dying = g.member_id(&addr(pa).to_string()).unwrap();
    dead_after_failures(&mut g, dying, t(10), 3);
    let actions = g.take_actions();
    assert!(matches!(
        &actions[..],
        [Action::Close { session, outcome: Outcome::MemberLost { .. } }] if *session == a
    ));
    // The data plane reports the close afterwards: the first outcome stands.
    assert!(!g.closed(t(11), a, Outcome::Closed));
    assert_eq!(g.outcome_count("member_lost"), 1);
    assert_eq!(g.outcome_count("closed"), 0);
    let r = g
        .recent_outcomes()
        .find(|r| r.session == a)
        .unwrap()
        .clone();
    assert!(r.reached_ms.is_some(), "it was reached…");
    assert!(
        matches!(r.outcome, Some(Outcome::MemberLost { .. })),
        "…and still lost"
    );
    // The other member's session is untouched.
    assert!(g.receipt(b).is_some());
    let metrics = g.render_metrics();
    assert!(metrics.contains("rserpool_lsnat_outcomes_total{outcome=\"member_lost\"} 1"));
    assert!(metrics.contains("rserpool_lsnat_outcomes_total{outcome=\"closed\"} 0"));
}

#[test]
fn a_removed_member_with_sessions_is_probed_until_they_end_and_its_death_loses_them() {
    let mut g = gateway(
        policy(LoadSharePolicy::RoundRobin),
        vec![member(1), member(2)],
    );
    let (a, pa) = open(&mut g, t(0), flow(1));
    assert_eq!(pa, 1);
    g.reached(t(1), a);
    // The source no longer lists member 1 (an RSerPool PE the registrar removed): no new
    // sessions, but it is still probed while a session is bound to it.
    g.set_members(t(2), vec![member(2)]);
    let targets: Vec<SocketAddr> = g.probe_targets().into_iter().map(|(_, a)| a).collect();
    assert!(targets.contains(&addr(1)), "{targets:?}");
    assert_eq!(ports(&mut g, 3, true), vec![2; 3]);
    // Its probes fail: judged dead, the bound session is lost (not closed).
    let id = g.member_id(&addr(1).to_string()).unwrap();
    dead_after_failures(&mut g, id, t(3), 3);
    assert!(g.take_actions().iter().any(|x| matches!(
        x,
        Action::Close { session, outcome: Outcome::MemberLost { .. } } if *session == a
    )));
    assert!(!g.closed(t(4), a, Outcome::Closed));
    // With no session left, the removed member leaves and is not probed any more.
    assert!(g.member_id(&addr(1).to_string()).is_none());
    let targets: Vec<SocketAddr> = g.probe_targets().into_iter().map(|(_, a)| a).collect();
    assert_eq!(targets, vec![addr(2)]);
}

#[test]
fn receipts_keep_selected_bound_reached_and_outcome_apart() {
    let mut g = gateway(CoreConfig::default(), vec![member(1), member(2)]);
    let b = g.open(t(5), flow(1)).unwrap();
    let r = g.receipt(b.session).unwrap();
    assert_eq!(r.selected.len(), 1);
    assert_eq!(r.selected[0].candidates.len(), 2);
    assert!(r.bound.is_some());
    assert!(r.connected_ms.is_none() && r.reached_ms.is_none() && r.outcome.is_none());
    g.connected(t(6), b.session);
    let r = g.receipt(b.session).unwrap();
    assert_eq!(r.connected_ms, Some(6));
    assert!(r.reached_ms.is_none(), "a connect is not an answer");
    g.closed(t(7), b.session, Outcome::Closed);
    let r = g.recent_outcomes().last().unwrap();
    assert_eq!(
        (r.reached_ms, r.outcome.clone()),
        (None, Some(Outcome::Closed))
    );
}

#[test]
fn failed_connect_rebinds_once_then_fails() {
    let mut cfg = policy(LoadSharePolicy::RoundRobin);
    cfg.health.connect_retries = 1;
    let mut g = gateway(cfg, vec![member(1), member(2), member(3)]);
    let b = g.open(t(0), flow(1)).unwrap();
    assert_eq!(b.address.port(), 1);
    let b2 = g
        .connect_failed(t(1), b.session, "connection refused")
        .expect("rebound");
    assert_eq!(b2.session, b.session);
    assert_ne!(b2.address.port(), 1);
    let r = g.receipt(b.session).unwrap();
    assert_eq!((r.selected.len(), r.failed_attempts.len()), (2, 1));
    assert_eq!(g.connect_failed(t(2), b.session, "timed out"), None);
    assert_eq!(g.outcome_count("connect_failed"), 1);
    assert_eq!(g.active_sessions(), 0);
    assert!(g.status(t(3)).members.iter().all(|m| m.sessions == 0));
}

#[test]
fn unanswered_client_data_is_evidence_against_the_member() {
    let mut cfg = CoreConfig::default();
    cfg.health.response_timeout = Some(Duration::from_secs(2));
    cfg.health.liveness.fall = 2;
    let mut g = gateway(cfg, vec![member(1), member(2)]);
    let m1 = g.member_id(&addr(1).to_string()).unwrap();
    let mut counts: HashMap<&str, u32> = HashMap::new();
    for i in 0..2 {
        let (id, p) = open(&mut g, t(0), flow(i));
        if p == 1 {
            g.client_data(t(0), id);
            *counts.entry("m1").or_default() += 1;
        } else {
            g.client_data(t(0), id);
            g.reached(t(100), id);
        }
    }
    g.poll(t(2_001));
    assert_eq!(g.member_health(m1), Some(Health::Suspect));
    let (id, p) = open(&mut g, t(2_100), flow(10));
    assert_eq!(p, 1);
    g.client_data(t(2_100), id);
    g.poll(t(4_200));
    assert_eq!(g.member_health(m1), Some(Health::Dead));
}

#[test]
fn status_lists_members_bindings_and_recent_outcomes() {
    let mut g = gateway(CoreConfig::default(), vec![member(1), member(2)]);
    let (a, _) = open(&mut g, t(0), flow(1));
    let (b, _) = open(&mut g, t(0), flow(2));
    g.closed(t(1), b, Outcome::Closed);
    let st = g.status(t(2));
    assert_eq!(st.members.len(), 2);
    assert_eq!(st.bindings.len(), 1);
    assert_eq!(st.bindings[0].receipt.session, a);
    assert_eq!(st.recent_outcomes.len(), 1);
    let json = serde_json::to_value(&st).unwrap();
    assert_eq!(json["recent_outcomes"][0]["outcome"]["kind"], "closed");
    assert_eq!(json["members"][0]["liveness"]["health"], "alive");
}

#[test]
fn source_evidence_from_a_registrar_is_liveness_evidence() {
    let mut g = gateway(CoreConfig::default(), vec![member(1), member(2)]);
    let (a, pa) = open(&mut g, t(0), flow(1));
    let key = addr(pa).to_string();
    let id = g.member_id(&key).unwrap();
    // The registrar says the PE is gone: dead at once, its session lost.
    g.source_evidence(t(1), &key, false);
    assert_eq!(g.member_health(id), Some(Health::Dead));
    assert!(g.receipt(a).is_none());
    assert_eq!(g.outcome_count("member_lost"), 1);
    // Registered again (twice: rise 2): on probation.
    g.source_evidence(t(2), &key, true);
    g.source_evidence(t(3), &key, true);
    assert_eq!(g.member_health(id), Some(Health::Probation));
    // Unknown keys are ignored.
    g.source_evidence(t(4), "no such member", false);
}

#[test]
fn pool_elements_become_members_through_their_user_transport() {
    use rserpool_wire::{
        PoolElement, PoolElementId, RegistrarId, RegistrationLife, TransportAddress, UserTransport,
    };
    let pe = |id: u32, t: TransportAddress, policy: PoolPolicy| PoolElement {
        id: PoolElementId(id),
        home_registrar: RegistrarId(1),
        registration_life: RegistrationLife::Finite(Duration::from_secs(30)),
        user_transport: UserTransport::Address(t),
        policy,
        asap_transport: None,
    };
    let ip = "10.0.0.9".parse().unwrap();
    let tcp = pe(
        0x10,
        TransportAddress::tcp(7000, ip),
        PoolPolicy::WeightedRoundRobin { weight: 5 },
    );
    let m = MemberSpec::from_pool_element(&tcp, Protocol::Tcp).unwrap();
    assert_eq!(m.address, SocketAddr::new(ip, 7000));
    assert_eq!(m.weight, 5);
    assert_eq!(m.key, "pe:$00000010");
    assert_eq!(m.pool_element, Some(PoolElementId(0x10)));
    let e = MemberSpec::from_pool_element(&tcp, Protocol::Udp).unwrap_err();
    assert!(e.contains("does not carry udp"), "{e}");
    // Members built this way work with the "pool" policy.
    let ll = |id, load| {
        MemberSpec::from_pool_element(
            &pe(
                id,
                TransportAddress::tcp(7000 + id as u16, ip),
                PoolPolicy::LeastUsed { load },
            ),
            Protocol::Tcp,
        )
        .unwrap()
    };
    let mut g = gateway(policy(LoadSharePolicy::Pool), vec![ll(1, 900), ll(2, 100)]);
    assert_eq!(g.open(t(0), flow(1)).unwrap().address.port(), 7002);
}

#[test]
fn pool_policy_is_the_handlespace_selection() {
    let lud = |port: u16, load: u32| {
        let mut s = member(port);
        s.pool_policy = Some(PoolPolicy::LeastUsedDegradation {
            load,
            degradation: 0x1000_0000,
        });
        s
    };
    // Least Used with Degradation: the lighter member is chosen until its degradation counter
    // (grown per selection, RFC 5356 §5.2) lifts it to the other's load; equals then take turns.
    let mut g = gateway(
        policy(LoadSharePolicy::Pool),
        vec![lud(1, 0x2000_0000), lud(2, 0x4000_0000)],
    );
    let chosen = ports(&mut g, 6, true);
    assert_eq!(chosen, vec![1, 1, 2, 1, 2, 1]);
}

/// A session bound in panic mode to a member already judged dead is lost as soon as new
/// evidence says the member is still failing: the transition to dead, which ends a member's
/// sessions, does not come again while it stays dead (found by the simulator, gateway seed
/// 322: the session stayed bound to a dead host).
#[test]
fn a_session_bound_to_a_dead_member_in_panic_mode_is_lost_on_the_next_failure() {
    let mut cfg = policy(LoadSharePolicy::RoundRobin);
    cfg.health.panic_threshold_percent = 60;
    let mut g = gateway(cfg, vec![member(1), member(2)]);
    let m1 = g.member_id(&addr(1).to_string()).unwrap();
    dead_after_failures(&mut g, m1, t(0), 3);
    assert_eq!(g.member_health(m1), Some(Health::Dead));
    // 1 of 2 live: panic; round robin soon binds a session to the dead member, which accepts
    // it (one success: not enough to leave dead).
    let on_dead = (0..4)
        .find_map(|i| {
            let b = g.open(t(1), flow(2000 + i)).unwrap();
            (b.address.port() == 1).then_some(b.session)
        })
        .expect("a session on the dead member");
    assert!(g.receipt(on_dead).unwrap().selected[0].panic);
    g.connected(t(1), on_dead);
    assert_eq!(g.member_health(m1), Some(Health::Dead));
    assert!(g.take_actions().is_empty());
    // It fails again (its host died): the session is lost, not left bound.
    g.probe_result(t(2), m1, Err("timed out".into()));
    let actions = g.take_actions();
    assert!(
        matches!(
            actions.as_slice(),
            [Action::Close { session, outcome: Outcome::MemberLost { reason } }]
                if *session == on_dead && reason.contains("still dead")
        ),
        "{actions:?}"
    );
    assert_eq!(g.outcome_count("member_lost"), 1);
    assert_eq!(g.member_sessions(m1), Some(0));
}

#[test]
fn flow_keys_hash_by_every_field_of_the_tuple() {
    use std::hash::{DefaultHasher, Hash, Hasher};
    fn h(k: &FlowKey) -> u64 {
        let mut s = DefaultHasher::new();
        k.hash(&mut s);
        s.finish()
    }
    let base = flow(40000);
    assert_eq!(h(&base), h(&flow(40000)));
    let v6 = |client: &str, vip: &str| FlowKey {
        protocol: Protocol::Tcp,
        client: client.parse().unwrap(),
        virtual_address: vip.parse().unwrap(),
    };
    let variants = [
        flow(40001),
        flow_from([192, 0, 2, 2], 40000),
        FlowKey {
            protocol: Protocol::Udp,
            ..base
        },
        FlowKey {
            virtual_address: SocketAddr::from(([203, 0, 113, 1], 81)),
            ..base
        },
        FlowKey {
            virtual_address: SocketAddr::from(([203, 0, 113, 2], 80)),
            ..base
        },
        // The client's address and port swapped with the virtual ones.
        FlowKey {
            client: base.virtual_address,
            virtual_address: base.client,
            ..base
        },
        v6("[2001:db8::1]:40000", "[2001:db8::80]:80"),
        v6("[2001:db8::1]:40000", "[2001:db8::81]:80"),
    ];
    let mut seen: Vec<u64> = vec![h(&base)];
    for k in &variants {
        assert_ne!(*k, base);
        seen.push(h(k));
    }
    let n = seen.len();
    seen.sort();
    seen.dedup();
    assert_eq!(seen.len(), n, "every tuple hashes apart");
    // Equal keys hash equal whatever the IPv6 scope (which Eq compares and the hash leaves out).
    let a = v6("[fe80::1%2]:40000", "[fe80::80%2]:80");
    assert_eq!(h(&a), h(&a.clone()));
}
