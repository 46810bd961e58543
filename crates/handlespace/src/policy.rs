//! How each pool policy ranks or weighs a PE (RFC 5356 §4 and §5; RSPLIB's private policies).
//!
//! Ordered policies sort PEs by a 64-bit key (lower first) and break ties round robin: the PE
//! selected longest ago among equals comes first. Randomized policies draw PEs with a
//! probability proportional to a 64-bit weight. Loads, degradations and distance penalties
//! follow RSPLIB's arithmetic: sums saturate at 0xffffffff (100 %), and a randomized
//! least-used weight never drops below 1, so a fully loaded PE stays selectable.
//!
//! Where this differs from RSPLIB 3.4.4 on purpose:
//! - Weighted round robin interleaves the PEs of a round (A B A A … for weights 3 and 1) where
//!   RSPLIB serves each PE's whole credit in a burst; the proportions are the same.
//! - The randomized LUD policies degrade the drawn PE's weight per selection; RSPLIB computes
//!   the weight from a counter that its randomized policies never increment.
//! - A PE whose sort key changes on re-registration joins the back of its new key's list;
//!   RSPLIB places it by its old sequence number. Ties therefore favour PEs that did not change.

use rserpool_wire::{PolicyType, PoolPolicy};

const MAX: u128 = u32::MAX as u128;

/// How a policy selects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// Sorted by [`order_key`], ties round robin.
    Ordered {
        /// Selection increments the PE's degradation counter (LUD family).
        degrades: bool,
        /// Weighted round robin: the key is the PE's round.
        weighted_round_robin: bool,
    },
    /// Uniform draw (Random).
    Uniform,
    /// Draw proportional to [`draw_weight`].
    Weighted {
        /// Selection increments the PE's degradation counter (randomized LUD family).
        degrades: bool,
    },
}

/// The selection kind of a policy type, `None` for types this crate cannot select by.
pub(crate) fn kind(t: PolicyType) -> Option<Kind> {
    let ordered = |degrades| Kind::Ordered {
        degrades,
        weighted_round_robin: false,
    };
    Some(match t {
        PolicyType::ROUND_ROBIN
        | PolicyType::PRIORITY
        | PolicyType::LEAST_USED
        | PolicyType::PRIORITY_LEAST_USED
        | PolicyType::LEAST_USED_DPF
        | PolicyType::PRIORITY_LEAST_USED_DPF => ordered(false),
        PolicyType::LEAST_USED_DEGRADATION
        | PolicyType::PRIORITY_LEAST_USED_DEGRADATION
        | PolicyType::LEAST_USED_DEGRADATION_DPF
        | PolicyType::PRIORITY_LEAST_USED_DEGRADATION_DPF => ordered(true),
        PolicyType::WEIGHTED_ROUND_ROBIN => Kind::Ordered {
            degrades: false,
            weighted_round_robin: true,
        },
        PolicyType::RANDOM => Kind::Uniform,
        PolicyType::WEIGHTED_RANDOM
        | PolicyType::WEIGHTED_RANDOM_DPF
        | PolicyType::RANDOMIZED_LEAST_USED
        | PolicyType::RANDOMIZED_PRIORITY_LEAST_USED => Kind::Weighted { degrades: false },
        PolicyType::RANDOMIZED_LEAST_USED_DEGRADATION
        | PolicyType::RANDOMIZED_PRIORITY_LEAST_USED_DEGRADATION => {
            Kind::Weighted { degrades: true }
        }
        _ => return None,
    })
}

#[inline]
fn sat(v: u128) -> u64 {
    v.min(MAX) as u64
}

/// `distance × DPF`, the distance penalty of the DPF policies (draft-dreibholz-rserpool-delay).
#[inline]
fn penalty(distance: u32, dpf: u32) -> u128 {
    u128::from(distance) * u128::from(dpf)
}

/// The accumulated degradation `count × degradation` of the LUD policies.
#[inline]
fn accumulated(count: u32, degradation: u32) -> u128 {
    u128::from(count) * u128::from(degradation)
}

/// Sort key of an ordered policy (lower is selected first).
///
/// - Round Robin (RFC 5356 §4.1): 0, so only the round-robin tie order counts.
/// - Weighted Round Robin (§4.2): the PE's round; a PE of weight w stays w selections in a
///   round (weight 0 counts as 1).
/// - Priority (§4.5): `0xffffffff − priority`: the highest priority first.
/// - Least Used (§5.1): load. Least Used with Degradation (§5.2): load + counter × degradation.
///   Priority Least Used (§5.3): load + degradation. Priority LUD (RSPLIB): load + degradation
///   + counter × degradation. The DPF variants add distance × load DPF.
pub(crate) fn order_key(policy: &PoolPolicy, count: u32, round: u64) -> u64 {
    use PoolPolicy::*;
    let l = |v: u32| u128::from(v);
    match *policy {
        WeightedRoundRobin { .. } => round,
        Priority { priority } => u64::from(u32::MAX - priority),
        LeastUsed { load } => u64::from(load),
        LeastUsedDegradation { load, degradation } => {
            sat(l(load) + accumulated(count, degradation))
        }
        PriorityLeastUsed { load, degradation } => sat(l(load) + l(degradation)),
        PriorityLeastUsedDegradation { load, degradation } => {
            sat(l(load) + l(degradation) + accumulated(count, degradation))
        }
        LeastUsedDpf {
            load,
            load_dpf,
            distance,
        } => sat(l(load) + penalty(distance, load_dpf)),
        LeastUsedDegradationDpf {
            load,
            degradation,
            load_dpf,
            distance,
        } => sat(l(load) + accumulated(count, degradation) + penalty(distance, load_dpf)),
        PriorityLeastUsedDpf {
            load,
            degradation,
            load_dpf,
            distance,
        } => sat(l(load) + l(degradation) + penalty(distance, load_dpf)),
        PriorityLeastUsedDegradationDpf {
            load,
            degradation,
            load_dpf,
            distance,
        } => sat(l(load)
            + l(degradation)
            + accumulated(count, degradation)
            + penalty(distance, load_dpf)),
        _ => 0,
    }
}

/// `max(1, 0xffffffff − used)`: the weight of the randomized least-used policies.
#[inline]
fn spare(used: u128) -> u64 {
    (MAX.saturating_sub(used)).max(1) as u64
}

/// Draw weight of a randomized policy (a PE is drawn with probability weight / total).
///
/// - Weighted Random (RFC 5356 §4.4): the weight (0 = never drawn).
/// - Weighted Random DPF: weight − weight × distance × weight DPF / 0xffffffff, rounded, at
///   least 1 when the penalty exceeds the weight (as RSPLIB).
/// - Randomized Least Used (§5.4): 0xffffffff − load, at least 1; the randomized LUD and
///   priority variants subtract counter × degradation and degradation as their ordered
///   counterparts add them.
pub(crate) fn draw_weight(policy: &PoolPolicy, count: u32) -> u64 {
    use PoolPolicy::*;
    let l = |v: u32| u128::from(v);
    match *policy {
        WeightedRandom { weight } => u64::from(weight),
        WeightedRandomDpf {
            weight,
            weight_dpf,
            distance,
        } => {
            let w = l(weight);
            let p = (w * penalty(distance, weight_dpf) * 2 + MAX) / (2 * MAX);
            if p > w {
                1
            } else {
                (w - p) as u64
            }
        }
        RandomizedLeastUsed { load } => spare(l(load)),
        RandomizedLeastUsedDegradation { load, degradation } => {
            spare(l(load) + accumulated(count, degradation))
        }
        RandomizedPriorityLeastUsed { load, degradation } => spare(l(load) + l(degradation)),
        RandomizedPriorityLeastUsedDegradation { load, degradation } => {
            spare(l(load) + l(degradation) + accumulated(count, degradation))
        }
        _ => 1,
    }
}

/// Credit of a weighted-round-robin PE per round (weight 0 counts as 1).
pub(crate) fn wrr_credit(policy: &PoolPolicy) -> u32 {
    policy.weight().unwrap_or(1).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_known_policy_has_a_kind() {
        for t in [
            0x1u32,
            0x2,
            0x3,
            0x4,
            0x5,
            0x4000_0001,
            0x4000_0002,
            0x4000_0003,
            0x4000_0004,
            0xb000_1001,
            0xb000_1002,
            0xb000_1003,
            0xb000_1004,
            0xb000_2001,
            0xb000_2002,
            0xb000_2003,
            0xb000_2004,
            0xb000_2005,
        ] {
            assert!(kind(PolicyType(t)).is_some(), "{t:#x}");
        }
        assert_eq!(kind(PolicyType(0xb000_9999)), None);
    }

    #[test]
    fn keys_saturate_and_weights_stay_positive() {
        let p = PoolPolicy::LeastUsedDegradation {
            load: u32::MAX - 5,
            degradation: 10,
        };
        assert_eq!(order_key(&p, 0, 0), u64::from(u32::MAX - 5));
        assert_eq!(order_key(&p, 1, 0), u64::from(u32::MAX));
        let r = PoolPolicy::RandomizedLeastUsed { load: u32::MAX };
        assert_eq!(draw_weight(&r, 0), 1);
        let r = PoolPolicy::RandomizedLeastUsed { load: 0 };
        assert_eq!(draw_weight(&r, 0), u64::from(u32::MAX));
        let d = PoolPolicy::LeastUsedDpf {
            load: 100,
            load_dpf: 3,
            distance: 50,
        };
        assert_eq!(order_key(&d, 0, 0), 250);
        let w = PoolPolicy::WeightedRandomDpf {
            weight: 1000,
            weight_dpf: u32::MAX / 100, // 1 % per ms
            distance: 30,
        };
        assert_eq!(draw_weight(&w, 0), 700);
        let w = PoolPolicy::WeightedRandomDpf {
            weight: 1000,
            weight_dpf: u32::MAX / 100,
            distance: 300,
        };
        assert_eq!(draw_weight(&w, 0), 1);
    }
}
