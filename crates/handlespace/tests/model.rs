//! Long random operation sequences against a plain model: after every step the handlespace
//! verifies all its indexes and checksums, and agrees with the model on membership, owners,
//! associations, checksums, timers and what each selection may return.

mod common;

use common::{pe_on, secs};
use proptest::prelude::*;
use rand::rngs::SmallRng;
use rand::SeedableRng;
use rserpool_handlespace::{
    compute_checksum, AssociationId, ChecksumFlavor, Error, Handlespace, HandlespaceConfig,
    SelectionBasis, TimerKind,
};
use rserpool_wire::{
    PolicyType, PoolElementId, PoolHandle, PoolPolicy, RegistrarId, TransportAddress, UserTransport,
};
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

const POOLS: [&str; 3] = ["alpha", "beta", "gamma-pool"];

#[derive(Debug, Clone)]
enum Op {
    Register {
        pool: usize,
        id: u32,
        policy: PoolPolicy,
        owner: u32,
        association: Option<u64>,
        tcp: bool,
    },
    Deregister {
        pool: usize,
        id: u32,
    },
    Select {
        pool: usize,
        n: usize,
    },
    SetTimer {
        pool: usize,
        id: u32,
        at: u64,
    },
    CancelTimer {
        pool: usize,
        id: u32,
    },
    PopDue {
        now: u64,
    },
    LoseAssociation(u64),
    TakeOver {
        from: u32,
        to: u32,
    },
    RemoveOwner(u32),
    Unreachable {
        pool: usize,
        id: u32,
    },
}

fn policy() -> impl Strategy<Value = PoolPolicy> {
    let v = 0u32..4;
    let load = prop_oneof![Just(0u32), Just(u32::MAX), 0u32..1000, any::<u32>()];
    prop_oneof![
        Just(PoolPolicy::RoundRobin),
        (1u32..5).prop_map(|weight| PoolPolicy::WeightedRoundRobin { weight }),
        Just(PoolPolicy::Random),
        (1u32..5).prop_map(|weight| PoolPolicy::WeightedRandom { weight }),
        v.clone()
            .prop_map(|priority| PoolPolicy::Priority { priority }),
        load.clone().prop_map(|load| PoolPolicy::LeastUsed { load }),
        (load.clone(), 0u32..400).prop_map(|(load, degradation)| {
            PoolPolicy::LeastUsedDegradation { load, degradation }
        }),
        (load.clone(), 0u32..400)
            .prop_map(|(load, degradation)| PoolPolicy::PriorityLeastUsed { load, degradation }),
        load.clone()
            .prop_map(|load| PoolPolicy::RandomizedLeastUsed { load }),
        (load.clone(), any::<u32>()).prop_map(|(load, degradation)| {
            PoolPolicy::RandomizedLeastUsedDegradation { load, degradation }
        }),
        (load, 0u32..4, 0u32..4).prop_map(|(load, load_dpf, distance)| {
            PoolPolicy::LeastUsedDpf {
                load,
                load_dpf,
                distance,
            }
        }),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    let pool = 0usize..POOLS.len();
    let id = 1u32..10;
    prop_oneof![
        8 => (pool.clone(), id.clone(), policy(), 0u32..3, prop::option::of(0u64..4), prop::bool::weighted(0.05))
            .prop_map(|(pool, id, policy, owner, association, tcp)| Op::Register {
                pool, id, policy, owner, association, tcp
            }),
        3 => (pool.clone(), id.clone()).prop_map(|(pool, id)| Op::Deregister { pool, id }),
        6 => (pool.clone(), 0usize..6).prop_map(|(pool, n)| Op::Select { pool, n }),
        2 => (pool.clone(), id.clone(), 0u64..50).prop_map(|(pool, id, at)| Op::SetTimer { pool, id, at }),
        1 => (pool.clone(), id.clone()).prop_map(|(pool, id)| Op::CancelTimer { pool, id }),
        1 => (0u64..50).prop_map(|now| Op::PopDue { now }),
        1 => (0u64..4).prop_map(Op::LoseAssociation),
        1 => (0u32..3, 0u32..3).prop_map(|(from, to)| Op::TakeOver { from, to }),
        1 => (0u32..3).prop_map(Op::RemoveOwner),
        1 => (pool, id).prop_map(|(pool, id)| Op::Unreachable { pool, id }),
    ]
}

#[derive(Debug, Clone)]
struct ModelPe {
    policy: PoolPolicy,
    owner: u32,
    association: Option<u64>,
    timer: Option<u64>,
    reports: u32,
}

#[derive(Default)]
struct Model {
    pes: BTreeMap<(usize, u32), ModelPe>,
    /// Per pool: policy type and whether it is on TCP.
    pools: BTreeMap<usize, (PolicyType, bool)>,
}

fn handle(pool: usize) -> PoolHandle {
    PoolHandle::from(POOLS[pool])
}

fn owner(o: u32) -> RegistrarId {
    RegistrarId(0x100 + o)
}

fn run(ops: Vec<Op>, config: HandlespaceConfig, seed: u64) -> Result<(), TestCaseError> {
    let mut hs = Handlespace::new(config.clone());
    let mut model = Model::default();
    let mut rng = SmallRng::seed_from_u64(seed);
    for op in ops {
        match op.clone() {
            Op::Register {
                pool,
                id,
                policy,
                owner: o,
                association,
                tcp,
            } => {
                let mut element = pe_on(id, policy.clone(), owner(o));
                if tcp {
                    element.user_transport =
                        UserTransport::Address(TransportAddress::tcp(80, [10, 0, 0, 1].into()));
                }
                let result = hs.register(
                    &handle(pool),
                    element,
                    association.map(AssociationId),
                    secs(1),
                );
                let pool_size = model.pes.keys().filter(|k| k.0 == pool).count();
                let exists = model.pes.contains_key(&(pool, id));
                let expected: Result<(), Error> = match model.pools.get(&pool) {
                    Some(&(t, _)) if t != policy.policy_type() => Err(Error::InconsistentPolicy {
                        pool: t,
                        requested: policy.policy_type(),
                    }),
                    Some(&(_, on_tcp)) if on_tcp != tcp => {
                        let refused =
                            matches!(result, Err(Error::InconsistentTransportType { .. }));
                        prop_assert!(refused, "transport type change accepted");
                        continue;
                    }
                    None if model.pools.len() >= config.max_pools => Err(Error::TooManyPools {
                        limit: config.max_pools,
                    }),
                    _ if !exists && pool_size >= config.max_pool_elements_per_pool => {
                        Err(Error::PoolFull {
                            limit: config.max_pool_elements_per_pool,
                        })
                    }
                    _ if !exists && model.pes.len() >= config.max_pool_elements => {
                        Err(Error::HandlespaceFull {
                            limit: config.max_pool_elements,
                        })
                    }
                    _ => Ok(()),
                };
                prop_assert_eq!(
                    result.as_ref().map(|_| ()).map_err(Clone::clone),
                    expected.clone()
                );
                if expected.is_ok() {
                    prop_assert_eq!(result.unwrap().is_new(), !exists);
                    model.pools.insert(pool, (policy.policy_type(), tcp));
                    let old = model.pes.get(&(pool, id)).and_then(|p| p.timer);
                    model.pes.insert(
                        (pool, id),
                        ModelPe {
                            policy,
                            owner: o,
                            association,
                            timer: old,
                            reports: 0,
                        },
                    );
                }
            }
            Op::Deregister { pool, id } => {
                let result = hs.deregister(&handle(pool), PoolElementId(id));
                match model.pes.remove(&(pool, id)) {
                    Some(_) => {
                        let removed = result.expect("known PE deregisters");
                        prop_assert_eq!(removed.element.id, PoolElementId(id));
                        prop_assert!(hs.get(removed.entry).is_none());
                        if !model.pes.keys().any(|k| k.0 == pool) {
                            model.pools.remove(&pool);
                        }
                    }
                    None => prop_assert!(result.is_err()),
                }
            }
            Op::Select { pool, n } => {
                let members: BTreeMap<u32, ModelPe> = model
                    .pes
                    .iter()
                    .filter(|(k, _)| k.0 == pool)
                    .map(|(k, v)| (k.1, v.clone()))
                    .collect();
                let result = hs.select(&handle(pool), n, &mut rng);
                if members.is_empty() {
                    prop_assert_eq!(result.unwrap_err(), Error::UnknownPoolHandle);
                    continue;
                }
                let s = result.expect("selection in a known pool");
                prop_assert_eq!(s.pool_size, members.len());
                prop_assert_eq!(s.elements.len(), n.min(members.len()));
                let ids: BTreeSet<u32> = s.elements.iter().map(|e| e.id.0).collect();
                prop_assert_eq!(ids.len(), s.elements.len(), "duplicates");
                for e in &s.elements {
                    let m = members.get(&e.id.0);
                    prop_assert!(m.is_some(), "selected PE {} not in the pool", e.id);
                    prop_assert_eq!(&e.policy, &m.unwrap().policy);
                }
                // Ordered policies return ascending keys; Priority and Least Used start at the
                // best value in the pool.
                let keys: Vec<u64> = s
                    .elements
                    .iter()
                    .filter_map(|e| match e.basis {
                        SelectionBasis::Rank { key } => Some(key),
                        _ => None,
                    })
                    .collect();
                prop_assert!(keys.windows(2).all(|w| w[0] <= w[1]), "keys {:?}", keys);
                if let Some(first) = s.elements.first() {
                    match first.policy {
                        PoolPolicy::Priority { priority } => {
                            let best = members.values().filter_map(|m| m.policy.priority()).max();
                            prop_assert_eq!(Some(priority), best);
                        }
                        PoolPolicy::LeastUsed { load } => {
                            let best = members.values().filter_map(|m| m.policy.load()).min();
                            prop_assert_eq!(Some(load), best);
                        }
                        _ => {}
                    }
                }
            }
            Op::SetTimer { pool, id, at } => {
                if let Some(e) = hs.entry_id(&handle(pool), PoolElementId(id)) {
                    hs.set_timer(e, TimerKind::Expiry, secs(at)).unwrap();
                    model.pes.get_mut(&(pool, id)).unwrap().timer = Some(at);
                } else {
                    prop_assert!(!model.pes.contains_key(&(pool, id)));
                }
            }
            Op::CancelTimer { pool, id } => {
                if let Some(e) = hs.entry_id(&handle(pool), PoolElementId(id)) {
                    let old = hs.cancel_timer(e).unwrap().map(|t| t.deadline);
                    let m = model.pes.get_mut(&(pool, id)).unwrap();
                    prop_assert_eq!(old, m.timer.take().map(secs));
                }
            }
            Op::PopDue { now } => {
                let mut last = Duration::ZERO;
                while let Some(t) = hs.pop_due(secs(now)) {
                    prop_assert!(t.deadline <= secs(now) && t.deadline >= last);
                    last = t.deadline;
                    let e = hs.get(t.entry).expect("timer of a live PE");
                    let key = (
                        POOLS
                            .iter()
                            .position(|p| handle_eq(e.pool_handle(), p))
                            .unwrap(),
                        e.id().0,
                    );
                    let m = model.pes.get_mut(&key).unwrap();
                    prop_assert_eq!(m.timer.take().map(secs), Some(t.deadline));
                }
                prop_assert!(model
                    .pes
                    .values()
                    .all(|m| m.timer.is_none_or(|at| at > now)));
            }
            Op::LoseAssociation(a) => {
                let removed = hs.remove_association(AssociationId(a));
                let expected: BTreeSet<_> = model
                    .pes
                    .iter()
                    .filter(|(_, m)| m.association == Some(a))
                    .map(|(k, _)| *k)
                    .collect();
                prop_assert_eq!(removed.len(), expected.len());
                model.pes.retain(|_, m| m.association != Some(a));
                model
                    .pools
                    .retain(|p, _| model.pes.keys().any(|k| k.0 == *p));
            }
            Op::TakeOver { from, to } => {
                let moved = hs.take_over(owner(from), owner(to));
                let expected = model.pes.values().filter(|m| m.owner == from).count();
                prop_assert_eq!(moved, expected);
                for m in model.pes.values_mut() {
                    if m.owner == from {
                        m.owner = to;
                    }
                }
            }
            Op::RemoveOwner(o) => {
                let removed = hs.remove_owned_by(owner(o));
                prop_assert_eq!(
                    removed.len(),
                    model.pes.values().filter(|m| m.owner == o).count()
                );
                model.pes.retain(|_, m| m.owner != o);
                model
                    .pools
                    .retain(|p, _| model.pes.keys().any(|k| k.0 == *p));
            }
            Op::Unreachable { pool, id } => {
                if let Some(e) = hs.entry_id(&handle(pool), PoolElementId(id)) {
                    let m = model.pes.get_mut(&(pool, id)).unwrap();
                    m.reports += 1;
                    prop_assert_eq!(hs.report_unreachable(e).unwrap(), m.reports);
                }
            }
        }
        if let Err(e) = hs.verify() {
            return Err(TestCaseError::fail(format!("after {op:?}: {e}")));
        }
        check_against_model(&hs, &model, config.checksum_flavor)?;
    }
    Ok(())
}

fn handle_eq(h: &PoolHandle, name: &str) -> bool {
    h.as_bytes() == name.as_bytes()
}

fn check_against_model(
    hs: &Handlespace,
    model: &Model,
    flavor: ChecksumFlavor,
) -> Result<(), TestCaseError> {
    prop_assert_eq!(hs.len(), model.pes.len());
    prop_assert_eq!(hs.pool_count(), model.pools.len());
    for (&(pool, id), m) in &model.pes {
        let e = hs.find(&handle(pool), PoolElementId(id));
        prop_assert!(e.is_some(), "{}/{} missing", POOLS[pool], id);
        let e = e.unwrap();
        prop_assert_eq!(e.home_registrar(), owner(m.owner));
        prop_assert_eq!(e.association(), m.association.map(AssociationId));
        prop_assert_eq!(&e.element().policy, &m.policy);
        prop_assert_eq!(e.timer().map(|t| t.deadline), m.timer.map(secs));
        prop_assert_eq!(e.unreachability_reports(), m.reports);
    }
    for o in 0..3 {
        let handles: Vec<(PoolHandle, PoolElementId)> = model
            .pes
            .iter()
            .filter(|(_, m)| m.owner == o)
            .map(|(k, _)| (handle(k.0), PoolElementId(k.1)))
            .collect();
        let want = compute_checksum(handles.iter().map(|(h, id)| (h, *id)), flavor);
        prop_assert_eq!(hs.checksum(owner(o)), want);
        prop_assert_eq!(hs.owned_count(owner(o)), handles.len());
    }
    for a in 0..4 {
        let want = model
            .pes
            .values()
            .filter(|m| m.association == Some(a))
            .count();
        prop_assert_eq!(hs.registered_over(AssociationId(a)).count(), want);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 192, ..ProptestConfig::default() })]

    #[test]
    fn random_operation_sequences_keep_every_index_consistent(
        ops in prop::collection::vec(op(), 1..300),
        seed in any::<u64>(),
    ) {
        run(ops, HandlespaceConfig::default(), seed)?;
    }

    #[test]
    fn tight_limits_are_enforced_exactly(
        ops in prop::collection::vec(op(), 1..200),
        seed in any::<u64>(),
    ) {
        let config = HandlespaceConfig {
            max_pools: 2,
            max_pool_elements_per_pool: 4,
            max_pool_elements: 6,
            max_increment: 2,
            checksum_flavor: ChecksumFlavor::Rfc1071,
            ..HandlespaceConfig::default()
        };
        run(ops, config, seed)?;
    }
}
