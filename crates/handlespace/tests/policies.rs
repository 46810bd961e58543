//! Selection by every policy: order, fairness, counters, and weighted draws checked by
//! chi-square over 100 000 draws with fixed seeds.

mod common;

use common::{chi_square, pe, secs, CHI2_999};
use rand::rngs::SmallRng;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use rserpool_handlespace::{Handlespace, HandlespaceConfig, SelectionBasis};
use rserpool_wire::{PoolElementId, PoolHandle, PoolPolicy};
use std::collections::BTreeMap;

const MAX: u32 = u32::MAX;

fn pool() -> PoolHandle {
    PoolHandle::from("pool")
}

fn with(policies: &[PoolPolicy]) -> Handlespace {
    with_config(policies, HandlespaceConfig::default())
}

fn with_config(policies: &[PoolPolicy], config: HandlespaceConfig) -> Handlespace {
    let mut hs = Handlespace::new(config);
    for (i, p) in policies.iter().enumerate() {
        hs.register(&pool(), pe(i as u32 + 1, p.clone()), None, secs(0))
            .unwrap();
    }
    hs
}

fn ids(hs: &mut Handlespace, n: usize, rng: &mut impl rand::Rng) -> Vec<u32> {
    let s = hs.select(&pool(), n, rng).unwrap();
    s.elements.iter().map(|e| e.id.0).collect()
}

/// Counts of the first PE of `draws` single-PE selections, by PE id (1-based index).
fn first_counts(hs: &mut Handlespace, pes: usize, draws: usize, seed: u64) -> Vec<u64> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut counts = vec![0u64; pes];
    for _ in 0..draws {
        let s = hs.select(&pool(), 1, &mut rng).unwrap();
        counts[s.elements[0].id.0 as usize - 1] += 1;
    }
    counts
}

#[test]
fn round_robin_is_fair_over_k_times_n_selections() {
    let mut rng = SmallRng::seed_from_u64(1);
    for n in [1usize, 2, 7, 50] {
        let mut hs = with(&vec![PoolPolicy::RoundRobin; n]);
        let k = 13;
        let mut counts = BTreeMap::<u32, u64>::new();
        for _ in 0..k * n {
            for id in ids(&mut hs, 1, &mut rng) {
                *counts.entry(id).or_default() += 1;
            }
        }
        assert_eq!(counts.len(), n);
        assert!(
            counts.values().all(|&c| c == k as u64),
            "{n} PEs: {counts:?}"
        );
        hs.verify().unwrap();
    }
}

#[test]
fn round_robin_with_three_items_advances_by_max_increment() {
    let mut rng = SmallRng::seed_from_u64(1);
    // RSPLIB's default: each resolution starts one further.
    let mut hs = with(&vec![PoolPolicy::RoundRobin; 5]);
    assert_eq!(ids(&mut hs, 3, &mut rng), [1, 2, 3]);
    assert_eq!(ids(&mut hs, 3, &mut rng), [2, 3, 4]);
    assert_eq!(ids(&mut hs, 3, &mut rng), [3, 4, 5]);
    assert_eq!(ids(&mut hs, 3, &mut rng), [4, 5, 1]);
    // Fair over k·n resolutions: every PE appears 3k times, each position k times.
    let mut counts = BTreeMap::<u32, u64>::new();
    for _ in 0..5 * 11 {
        for id in ids(&mut hs, 3, &mut rng) {
            *counts.entry(id).or_default() += 1;
        }
    }
    assert!(counts.values().all(|&c| c == 33), "{counts:?}");

    // Advancing every returned PE walks the pool in disjoint steps.
    let config = HandlespaceConfig {
        max_increment: usize::MAX,
        ..HandlespaceConfig::default()
    };
    let mut hs = with_config(&vec![PoolPolicy::RoundRobin; 5], config);
    assert_eq!(ids(&mut hs, 3, &mut rng), [1, 2, 3]);
    assert_eq!(ids(&mut hs, 3, &mut rng), [4, 5, 1]);
    assert_eq!(ids(&mut hs, 10, &mut rng), [2, 3, 4, 5, 1]);
    hs.verify().unwrap();
}

#[test]
fn round_robin_position_survives_reregistration_with_the_same_values() {
    let mut rng = SmallRng::seed_from_u64(1);
    let mut hs = with(&vec![PoolPolicy::RoundRobin; 3]);
    assert_eq!(ids(&mut hs, 1, &mut rng), [1]);
    hs.register(&pool(), pe(2, PoolPolicy::RoundRobin), None, secs(1))
        .unwrap();
    assert_eq!(ids(&mut hs, 1, &mut rng), [2]);
    assert_eq!(ids(&mut hs, 1, &mut rng), [3]);
    // A new PE joins at the back.
    hs.register(&pool(), pe(4, PoolPolicy::RoundRobin), None, secs(1))
        .unwrap();
    assert_eq!(ids(&mut hs, 4, &mut rng), [1, 2, 3, 4]);
}

#[test]
fn weighted_round_robin_follows_integer_weights_exactly() {
    let mut rng = SmallRng::seed_from_u64(1);
    let weights = [1u32, 2, 3, 0];
    let policies: Vec<_> = weights
        .iter()
        .map(|&weight| PoolPolicy::WeightedRoundRobin { weight })
        .collect();
    let mut hs = with(&policies);
    // Weight 0 counts as 1: a round has 1 + 2 + 3 + 1 = 7 selections.
    let mut counts = [0u64; 4];
    for _ in 0..7 * 20 {
        for id in ids(&mut hs, 1, &mut rng) {
            counts[id as usize - 1] += 1;
        }
    }
    assert_eq!(counts, [20, 40, 60, 20]);
    // Within a round, PEs interleave rather than burst; PEs done with the last round first
    // come first.
    let round: Vec<u32> = (0..7).flat_map(|_| ids(&mut hs, 1, &mut rng)).collect();
    assert_eq!(round, [1, 4, 2, 3, 2, 3, 3]);
    hs.verify().unwrap();
}

#[test]
fn priority_prefers_the_highest_and_round_robins_among_equals() {
    let mut rng = SmallRng::seed_from_u64(1);
    let prios = [5u32, 9, 3, 9, 5];
    let policies: Vec<_> = prios
        .iter()
        .map(|&priority| PoolPolicy::Priority { priority })
        .collect();
    let mut hs = with(&policies);
    assert_eq!(ids(&mut hs, 1, &mut rng), [2]);
    assert_eq!(ids(&mut hs, 1, &mut rng), [4]);
    assert_eq!(ids(&mut hs, 1, &mut rng), [2]);
    let three = ids(&mut hs, 3, &mut rng);
    assert_eq!(three, [4, 2, 1]);
    let s = hs.select(&pool(), 5, &mut rng).unwrap();
    let got: Vec<u32> = s
        .elements
        .iter()
        .map(|e| e.policy.priority().unwrap())
        .collect();
    assert_eq!(got, [9, 9, 5, 5, 3]);
}

#[test]
fn least_used_returns_ascending_loads() {
    let mut rng = SmallRng::seed_from_u64(1);
    let loads = [MAX / 2, 10, MAX, 0, 10, 77];
    let policies: Vec<_> = loads
        .iter()
        .map(|&load| PoolPolicy::LeastUsed { load })
        .collect();
    let mut hs = with(&policies);
    let s = hs.select(&pool(), 6, &mut rng).unwrap();
    let got: Vec<u32> = s
        .elements
        .iter()
        .map(|e| e.policy.load().unwrap())
        .collect();
    assert_eq!(got, [0, 10, 10, 77, MAX / 2, MAX]);
    assert!(matches!(
        s.elements[0].basis,
        SelectionBasis::Rank { key: 0 }
    ));
    // Equal loads alternate: the first 10 % PE was advanced (it was not first).
    assert_eq!(ids(&mut hs, 1, &mut rng), [4]);
    assert_eq!(ids(&mut hs, 2, &mut rng), [4, 2]);
}

#[test]
fn lud_counters_grow_on_selection_and_reset_on_reregistration() {
    let mut rng = SmallRng::seed_from_u64(1);
    let d = MAX / 10;
    let lud = |load| PoolPolicy::LeastUsedDegradation {
        load,
        degradation: d,
    };
    let mut hs = with(&[lud(0), lud(0), lud(d / 2)]);
    // 1 (0) → key d; 2 (0) → key d; then 3 (d/2) → key 1.5d; then 1 and 2 at d in turn.
    let picks: Vec<u32> = (0..5).flat_map(|_| ids(&mut hs, 1, &mut rng)).collect();
    assert_eq!(picks, [1, 2, 3, 1, 2]);
    let e1 = hs.find(&pool(), PoolElementId(1)).unwrap();
    assert_eq!((e1.degradation_count(), e1.selection_count()), (2, 2));
    let s = hs.select(&pool(), 1, &mut rng).unwrap();
    assert_eq!(
        (s.elements[0].id.0, s.elements[0].degradation_count),
        (3, 1)
    );
    // Re-registration with the same values resets the counter: PE 1 is least used again.
    hs.register(&pool(), pe(1, lud(0)), None, secs(1)).unwrap();
    assert_eq!(
        hs.find(&pool(), PoolElementId(1))
            .unwrap()
            .degradation_count(),
        0
    );
    assert_eq!(ids(&mut hs, 1, &mut rng), [1]);
    hs.verify().unwrap();
}

#[test]
fn plu_and_dpf_variants_order_by_their_sums() {
    let mut rng = SmallRng::seed_from_u64(1);
    // PLU: load + degradation.
    let plu = |load, degradation| PoolPolicy::PriorityLeastUsed { load, degradation };
    let mut hs = with(&[plu(100, 50), plu(10, 500), plu(120, 0)]);
    assert_eq!(ids(&mut hs, 3, &mut rng), [3, 1, 2]);
    // LU-DPF: load + distance × DPF; the near PE wins despite its higher load.
    let dpf = |load, distance| PoolPolicy::LeastUsedDpf {
        load,
        load_dpf: 1000,
        distance,
    };
    let mut hs = with(&[dpf(1_000, 200), dpf(100_000, 10), dpf(150_000, 0)]);
    assert_eq!(ids(&mut hs, 3, &mut rng), [2, 3, 1]);
    // PLUD-DPF degrades with each selection.
    let p = |load| PoolPolicy::PriorityLeastUsedDegradationDpf {
        load,
        degradation: 100,
        load_dpf: 1,
        distance: 50,
    };
    let mut hs = with(&[p(0), p(150)]);
    let picks: Vec<u32> = (0..4).flat_map(|_| ids(&mut hs, 1, &mut rng)).collect();
    assert_eq!(picks, [1, 1, 2, 1]);
    hs.verify().unwrap();
}

#[test]
fn random_is_uniform() {
    let mut hs = with(&vec![PoolPolicy::Random; 8]);
    let counts = first_counts(&mut hs, 8, 100_000, 7);
    let chi = chi_square(&counts, &[1.0; 8]);
    assert!(chi < CHI2_999[7], "chi² {chi}: {counts:?}");
    hs.verify().unwrap();
}

#[test]
fn weighted_random_follows_weights() {
    let weights = [1u32, 2, 3, 4, 10];
    let policies: Vec<_> = weights
        .iter()
        .map(|&weight| PoolPolicy::WeightedRandom { weight })
        .collect();
    let mut hs = with(&policies);
    let counts = first_counts(&mut hs, 5, 100_000, 11);
    let w: Vec<f64> = weights.iter().map(|&w| f64::from(w)).collect();
    let chi = chi_square(&counts, &w);
    assert!(chi < CHI2_999[4], "chi² {chi}: {counts:?}");
    // A skewed expectation must be rejected by the same test (it has power).
    let wrong = chi_square(&counts, &[1.0, 2.0, 3.0, 4.0, 9.0]);
    assert!(
        wrong > CHI2_999[4],
        "chi² against wrong weights only {wrong}"
    );
}

#[test]
fn weighted_random_never_draws_weight_zero() {
    let mut rng = SmallRng::seed_from_u64(3);
    let mut hs = with(&[
        PoolPolicy::WeightedRandom { weight: 0 },
        PoolPolicy::WeightedRandom { weight: 5 },
    ]);
    for _ in 0..1000 {
        assert_eq!(ids(&mut hs, 2, &mut rng), [2]);
    }
    let mut hs = with(&[PoolPolicy::WeightedRandom { weight: 0 }]);
    assert!(ids(&mut hs, 1, &mut rng).is_empty());
}

#[test]
fn randomized_least_used_draws_proportional_to_spare_capacity() {
    let loads = [0u32, MAX / 4, MAX / 2, MAX / 4 * 3];
    let policies: Vec<_> = loads
        .iter()
        .map(|&load| PoolPolicy::RandomizedLeastUsed { load })
        .collect();
    let mut hs = with(&policies);
    let counts = first_counts(&mut hs, 4, 100_000, 13);
    let w: Vec<f64> = loads.iter().map(|&l| f64::from(MAX - l)).collect();
    let chi = chi_square(&counts, &w);
    assert!(chi < CHI2_999[3], "chi² {chi}: {counts:?}");
    let s = hs
        .select(&pool(), 1, &mut ChaCha8Rng::seed_from_u64(1))
        .unwrap();
    match s.elements[0].basis {
        SelectionBasis::Weighted { weight, total } => {
            assert_eq!(
                total,
                loads.iter().map(|&l| u64::from(MAX - l)).sum::<u64>()
            );
            assert_eq!(
                weight,
                u64::from(MAX - s.elements[0].policy.load().unwrap())
            );
        }
        other => panic!("weighted basis expected, got {other:?}"),
    }
}

#[test]
fn fully_loaded_pes_stay_selectable_under_rlu() {
    let mut rng = SmallRng::seed_from_u64(3);
    let mut hs = with(&[
        PoolPolicy::RandomizedLeastUsed { load: MAX },
        PoolPolicy::RandomizedLeastUsed { load: MAX },
    ]);
    let mut got = ids(&mut hs, 2, &mut rng);
    got.sort();
    assert_eq!(got, [1, 2]);
}

#[test]
fn weighted_random_dpf_follows_penalised_weights() {
    // Weight 1000 each; penalties of 0 %, 30 % and 60 % (distance × 1 % per ms).
    let dpf = u32::MAX / 100;
    let policies: Vec<_> = [0u32, 30, 60]
        .iter()
        .map(|&distance| PoolPolicy::WeightedRandomDpf {
            weight: 1000,
            weight_dpf: dpf,
            distance,
        })
        .collect();
    let mut hs = with(&policies);
    let counts = first_counts(&mut hs, 3, 100_000, 17);
    let chi = chi_square(&counts, &[1000.0, 700.0, 400.0]);
    assert!(chi < CHI2_999[2], "chi² {chi}: {counts:?}");
}

#[test]
fn randomized_lud_degrades_the_drawn_pe() {
    let d = MAX / 4;
    let mut hs = with(&[
        PoolPolicy::RandomizedLeastUsedDegradation {
            load: 0,
            degradation: d,
        },
        PoolPolicy::RandomizedLeastUsedDegradation {
            load: 0,
            degradation: d,
        },
    ]);
    let mut rng = SmallRng::seed_from_u64(5);
    let first = ids(&mut hs, 1, &mut rng)[0];
    let e = hs.find(&pool(), PoolElementId(first)).unwrap();
    assert_eq!(e.degradation_count(), 1);
    // The drawn PE now weighs 3/4 of the other: over many draws (each degrading the winner)
    // the two stay close to even.
    let counts = first_counts(&mut hs, 2, 10_000, 19);
    let diff = counts[0].abs_diff(counts[1]);
    assert!(diff < 200, "{counts:?}");
    hs.verify().unwrap();
}

#[test]
fn multi_pe_selections_have_no_duplicates_for_every_policy() {
    let all = [
        PoolPolicy::RoundRobin,
        PoolPolicy::WeightedRoundRobin { weight: 3 },
        PoolPolicy::Random,
        PoolPolicy::WeightedRandom { weight: 3 },
        PoolPolicy::Priority { priority: 3 },
        PoolPolicy::LeastUsed { load: 3 },
        PoolPolicy::LeastUsedDegradation {
            load: 3,
            degradation: 3,
        },
        PoolPolicy::PriorityLeastUsed {
            load: 3,
            degradation: 3,
        },
        PoolPolicy::RandomizedLeastUsed { load: 3 },
        PoolPolicy::RandomizedPriorityLeastUsed {
            load: 3,
            degradation: 3,
        },
        PoolPolicy::RandomizedLeastUsedDegradation {
            load: 3,
            degradation: 3,
        },
        PoolPolicy::PriorityLeastUsedDegradation {
            load: 3,
            degradation: 3,
        },
        PoolPolicy::RandomizedPriorityLeastUsedDegradation {
            load: 3,
            degradation: 3,
        },
        PoolPolicy::WeightedRandomDpf {
            weight: 3,
            weight_dpf: 3,
            distance: 3,
        },
        PoolPolicy::LeastUsedDpf {
            load: 3,
            load_dpf: 3,
            distance: 3,
        },
        PoolPolicy::LeastUsedDegradationDpf {
            load: 3,
            degradation: 3,
            load_dpf: 3,
            distance: 3,
        },
        PoolPolicy::PriorityLeastUsedDpf {
            load: 3,
            degradation: 3,
            load_dpf: 3,
            distance: 3,
        },
        PoolPolicy::PriorityLeastUsedDegradationDpf {
            load: 3,
            degradation: 3,
            load_dpf: 3,
            distance: 3,
        },
    ];
    let mut rng = SmallRng::seed_from_u64(9);
    for policy in all {
        let mut hs = with(&vec![policy.clone(); 6]);
        for n in [1, 3, 6, 10] {
            for _ in 0..20 {
                let mut got = ids(&mut hs, n, &mut rng);
                assert_eq!(got.len(), n.min(6), "{policy}");
                got.sort();
                got.dedup();
                assert_eq!(got.len(), n.min(6), "duplicates under {policy}");
            }
        }
        hs.verify().unwrap();
    }
}
