//! Pool Member Selection Policy parameter (RFC 5354 §3.8) with every policy of RFC 5356 and
//! RSPLIB's private ones (policy type bit 31 set).
//!
//! Loads, weights' fixed-point fractions and degradations are 32-bit fixed point where
//! 0xffffffff stands for 100 % (RFC 5356 §5).

use crate::codec::{in_param, Ctx, Tlv, Writer};
use crate::error::{DecodeError, DecodeErrorKind, EncodeError};
use crate::types::ParameterType;
use std::fmt;

/// A policy type number (RFC 5356 §4 and §5, IANA's registry; RSPLIB for the private ones).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PolicyType(pub u32);

impl PolicyType {
    /// Round Robin (RFC 5356 §4.1).
    pub const ROUND_ROBIN: Self = Self(0x0000_0001);
    /// Weighted Round Robin (RFC 5356 §4.2).
    pub const WEIGHTED_ROUND_ROBIN: Self = Self(0x0000_0002);
    /// Random (RFC 5356 §4.3).
    pub const RANDOM: Self = Self(0x0000_0003);
    /// Weighted Random (RFC 5356 §4.4).
    pub const WEIGHTED_RANDOM: Self = Self(0x0000_0004);
    /// Priority (RFC 5356 §4.5).
    pub const PRIORITY: Self = Self(0x0000_0005);
    /// Least Used (RFC 5356 §5.1).
    pub const LEAST_USED: Self = Self(0x4000_0001);
    /// Least Used with Degradation (RFC 5356 §5.2).
    pub const LEAST_USED_DEGRADATION: Self = Self(0x4000_0002);
    /// Priority Least Used (RFC 5356 §5.3).
    pub const PRIORITY_LEAST_USED: Self = Self(0x4000_0003);
    /// Randomized Least Used (RFC 5356 §5.4).
    pub const RANDOMIZED_LEAST_USED: Self = Self(0x4000_0004);
    /// Randomized Priority Least Used (RSPLIB).
    pub const RANDOMIZED_PRIORITY_LEAST_USED: Self = Self(0xb000_1001);
    /// Randomized Least Used with Degradation (RSPLIB).
    pub const RANDOMIZED_LEAST_USED_DEGRADATION: Self = Self(0xb000_1002);
    /// Priority Least Used with Degradation (RSPLIB).
    pub const PRIORITY_LEAST_USED_DEGRADATION: Self = Self(0xb000_1003);
    /// Randomized Priority Least Used with Degradation (RSPLIB).
    pub const RANDOMIZED_PRIORITY_LEAST_USED_DEGRADATION: Self = Self(0xb000_1004);
    /// Weighted Random with Distance Penalty Factor (draft-dreibholz-rserpool-delay).
    pub const WEIGHTED_RANDOM_DPF: Self = Self(0xb000_2001);
    /// Least Used with Distance Penalty Factor (draft-dreibholz-rserpool-delay).
    pub const LEAST_USED_DPF: Self = Self(0xb000_2002);
    /// Least Used with Degradation and Distance Penalty Factor (RSPLIB).
    pub const LEAST_USED_DEGRADATION_DPF: Self = Self(0xb000_2003);
    /// Priority Least Used with Distance Penalty Factor (RSPLIB).
    pub const PRIORITY_LEAST_USED_DPF: Self = Self(0xb000_2004);
    /// Priority Least Used with Degradation and Distance Penalty Factor (RSPLIB).
    pub const PRIORITY_LEAST_USED_DEGRADATION_DPF: Self = Self(0xb000_2005);

    /// Every policy type this codec knows, in numeric order.
    pub const KNOWN: [PolicyType; 18] = [
        Self::ROUND_ROBIN,
        Self::WEIGHTED_ROUND_ROBIN,
        Self::RANDOM,
        Self::WEIGHTED_RANDOM,
        Self::PRIORITY,
        Self::LEAST_USED,
        Self::LEAST_USED_DEGRADATION,
        Self::PRIORITY_LEAST_USED,
        Self::RANDOMIZED_LEAST_USED,
        Self::RANDOMIZED_PRIORITY_LEAST_USED,
        Self::RANDOMIZED_LEAST_USED_DEGRADATION,
        Self::PRIORITY_LEAST_USED_DEGRADATION,
        Self::RANDOMIZED_PRIORITY_LEAST_USED_DEGRADATION,
        Self::WEIGHTED_RANDOM_DPF,
        Self::LEAST_USED_DPF,
        Self::LEAST_USED_DEGRADATION_DPF,
        Self::PRIORITY_LEAST_USED_DPF,
        Self::PRIORITY_LEAST_USED_DEGRADATION_DPF,
    ];

    /// Bit 30: the policy adapts to the PEs' reported load (the adaptive policies of RFC 5356 §5).
    pub const fn is_adaptive(self) -> bool {
        self.0 & 0x4000_0000 != 0
    }

    /// Bit 31: a private policy outside the RFC's registry.
    pub const fn is_private(self) -> bool {
        self.0 & 0x8000_0000 != 0
    }

    /// The policy's name, if it is one this codec knows.
    pub const fn name(self) -> Option<&'static str> {
        Some(match self.0 {
            0x0000_0001 => "Round Robin",
            0x0000_0002 => "Weighted Round Robin",
            0x0000_0003 => "Random",
            0x0000_0004 => "Weighted Random",
            0x0000_0005 => "Priority",
            0x4000_0001 => "Least Used",
            0x4000_0002 => "Least Used with Degradation",
            0x4000_0003 => "Priority Least Used",
            0x4000_0004 => "Randomized Least Used",
            0xb000_1001 => "Randomized Priority Least Used",
            0xb000_1002 => "Randomized Least Used with Degradation",
            0xb000_1003 => "Priority Least Used with Degradation",
            0xb000_1004 => "Randomized Priority Least Used with Degradation",
            0xb000_2001 => "Weighted Random with DPF",
            0xb000_2002 => "Least Used with DPF",
            0xb000_2003 => "Least Used with Degradation and DPF",
            0xb000_2004 => "Priority Least Used with DPF",
            0xb000_2005 => "Priority Least Used with Degradation and DPF",
            _ => return None,
        })
    }

    /// Number of 32-bit value fields after the policy type, for known types.
    const fn field_count(self) -> Option<usize> {
        Some(match self.0 {
            0x0000_0001 | 0x0000_0003 => 0,
            0x0000_0002 | 0x0000_0004 | 0x0000_0005 | 0x4000_0001 | 0x4000_0004 => 1,
            0x4000_0002 | 0x4000_0003 | 0xb000_1001..=0xb000_1004 => 2,
            0xb000_2001 | 0xb000_2002 => 3,
            0xb000_2003..=0xb000_2005 => 4,
            _ => return None,
        })
    }
}

impl fmt::Display for PolicyType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(n) => f.write_str(n),
            None => write!(f, "policy {:#010x}", self.0),
        }
    }
}

impl fmt::Debug for PolicyType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PolicyType({:#010x} {self})", self.0)
    }
}

/// The value fields of a policy (0 to 4 of them), without allocating.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PolicyFields {
    values: [u32; 4],
    len: usize,
}

impl PolicyFields {
    /// The fields in wire order.
    pub fn as_slice(&self) -> &[u32] {
        &self.values[..self.len]
    }

    /// All four slots, the unused ones 0 (for code that indexes by position).
    pub fn padded(&self) -> [u32; 4] {
        self.values
    }
}

impl std::ops::Deref for PolicyFields {
    type Target = [u32];

    fn deref(&self) -> &[u32] {
        self.as_slice()
    }
}

/// A pool member selection policy with its per-PE values.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[allow(missing_docs)] // the field names are the RFC's: load, degradation, weight, priority…
pub enum PoolPolicy {
    RoundRobin,
    WeightedRoundRobin {
        weight: u32,
    },
    Random,
    WeightedRandom {
        weight: u32,
    },
    Priority {
        priority: u32,
    },
    LeastUsed {
        load: u32,
    },
    LeastUsedDegradation {
        load: u32,
        degradation: u32,
    },
    PriorityLeastUsed {
        load: u32,
        degradation: u32,
    },
    RandomizedLeastUsed {
        load: u32,
    },
    RandomizedPriorityLeastUsed {
        load: u32,
        degradation: u32,
    },
    RandomizedLeastUsedDegradation {
        load: u32,
        degradation: u32,
    },
    PriorityLeastUsedDegradation {
        load: u32,
        degradation: u32,
    },
    RandomizedPriorityLeastUsedDegradation {
        load: u32,
        degradation: u32,
    },
    WeightedRandomDpf {
        weight: u32,
        weight_dpf: u32,
        distance: u32,
    },
    LeastUsedDpf {
        load: u32,
        load_dpf: u32,
        distance: u32,
    },
    LeastUsedDegradationDpf {
        load: u32,
        degradation: u32,
        load_dpf: u32,
        distance: u32,
    },
    PriorityLeastUsedDpf {
        load: u32,
        degradation: u32,
        load_dpf: u32,
        distance: u32,
    },
    PriorityLeastUsedDegradationDpf {
        load: u32,
        degradation: u32,
        load_dpf: u32,
        distance: u32,
    },
    /// A policy type this codec does not know, with its value bytes as received.
    Other {
        policy_type: u32,
        data: Vec<u8>,
    },
}

impl PoolPolicy {
    /// The policy type number.
    pub fn policy_type(&self) -> PolicyType {
        use PoolPolicy::*;
        match self {
            RoundRobin => PolicyType::ROUND_ROBIN,
            WeightedRoundRobin { .. } => PolicyType::WEIGHTED_ROUND_ROBIN,
            Random => PolicyType::RANDOM,
            WeightedRandom { .. } => PolicyType::WEIGHTED_RANDOM,
            Priority { .. } => PolicyType::PRIORITY,
            LeastUsed { .. } => PolicyType::LEAST_USED,
            LeastUsedDegradation { .. } => PolicyType::LEAST_USED_DEGRADATION,
            PriorityLeastUsed { .. } => PolicyType::PRIORITY_LEAST_USED,
            RandomizedLeastUsed { .. } => PolicyType::RANDOMIZED_LEAST_USED,
            RandomizedPriorityLeastUsed { .. } => PolicyType::RANDOMIZED_PRIORITY_LEAST_USED,
            RandomizedLeastUsedDegradation { .. } => PolicyType::RANDOMIZED_LEAST_USED_DEGRADATION,
            PriorityLeastUsedDegradation { .. } => PolicyType::PRIORITY_LEAST_USED_DEGRADATION,
            RandomizedPriorityLeastUsedDegradation { .. } => {
                PolicyType::RANDOMIZED_PRIORITY_LEAST_USED_DEGRADATION
            }
            WeightedRandomDpf { .. } => PolicyType::WEIGHTED_RANDOM_DPF,
            LeastUsedDpf { .. } => PolicyType::LEAST_USED_DPF,
            LeastUsedDegradationDpf { .. } => PolicyType::LEAST_USED_DEGRADATION_DPF,
            PriorityLeastUsedDpf { .. } => PolicyType::PRIORITY_LEAST_USED_DPF,
            PriorityLeastUsedDegradationDpf { .. } => {
                PolicyType::PRIORITY_LEAST_USED_DEGRADATION_DPF
            }
            Other { policy_type, .. } => PolicyType(*policy_type),
        }
    }

    /// The 32-bit value fields after the type, in wire order (none for `Other`).
    pub fn fields(&self) -> PolicyFields {
        use PoolPolicy::*;
        let (values, len) = match *self {
            RoundRobin | Random | Other { .. } => ([0; 4], 0),
            WeightedRoundRobin { weight } | WeightedRandom { weight } => ([weight, 0, 0, 0], 1),
            Priority { priority } => ([priority, 0, 0, 0], 1),
            LeastUsed { load } | RandomizedLeastUsed { load } => ([load, 0, 0, 0], 1),
            LeastUsedDegradation { load, degradation }
            | PriorityLeastUsed { load, degradation }
            | RandomizedPriorityLeastUsed { load, degradation }
            | RandomizedLeastUsedDegradation { load, degradation }
            | PriorityLeastUsedDegradation { load, degradation }
            | RandomizedPriorityLeastUsedDegradation { load, degradation } => {
                ([load, degradation, 0, 0], 2)
            }
            WeightedRandomDpf {
                weight,
                weight_dpf,
                distance,
            } => ([weight, weight_dpf, distance, 0], 3),
            LeastUsedDpf {
                load,
                load_dpf,
                distance,
            } => ([load, load_dpf, distance, 0], 3),
            LeastUsedDegradationDpf {
                load,
                degradation,
                load_dpf,
                distance,
            }
            | PriorityLeastUsedDpf {
                load,
                degradation,
                load_dpf,
                distance,
            }
            | PriorityLeastUsedDegradationDpf {
                load,
                degradation,
                load_dpf,
                distance,
            } => ([load, degradation, load_dpf, distance], 4),
        };
        PolicyFields { values, len }
    }

    /// Builds a known policy from its type and value fields (as [`PoolPolicy::fields`] gives
    /// them); `None` if the type is unknown or the number of fields is wrong.
    pub fn from_fields(policy_type: PolicyType, f: &[u32]) -> Option<PoolPolicy> {
        use PoolPolicy::*;
        if policy_type.field_count()? != f.len() {
            return None;
        }
        Some(match policy_type {
            PolicyType::ROUND_ROBIN => RoundRobin,
            PolicyType::WEIGHTED_ROUND_ROBIN => WeightedRoundRobin { weight: f[0] },
            PolicyType::RANDOM => Random,
            PolicyType::WEIGHTED_RANDOM => WeightedRandom { weight: f[0] },
            PolicyType::PRIORITY => Priority { priority: f[0] },
            PolicyType::LEAST_USED => LeastUsed { load: f[0] },
            PolicyType::LEAST_USED_DEGRADATION => LeastUsedDegradation {
                load: f[0],
                degradation: f[1],
            },
            PolicyType::PRIORITY_LEAST_USED => PriorityLeastUsed {
                load: f[0],
                degradation: f[1],
            },
            PolicyType::RANDOMIZED_LEAST_USED => RandomizedLeastUsed { load: f[0] },
            PolicyType::RANDOMIZED_PRIORITY_LEAST_USED => RandomizedPriorityLeastUsed {
                load: f[0],
                degradation: f[1],
            },
            PolicyType::RANDOMIZED_LEAST_USED_DEGRADATION => RandomizedLeastUsedDegradation {
                load: f[0],
                degradation: f[1],
            },
            PolicyType::PRIORITY_LEAST_USED_DEGRADATION => PriorityLeastUsedDegradation {
                load: f[0],
                degradation: f[1],
            },
            PolicyType::RANDOMIZED_PRIORITY_LEAST_USED_DEGRADATION => {
                RandomizedPriorityLeastUsedDegradation {
                    load: f[0],
                    degradation: f[1],
                }
            }
            PolicyType::WEIGHTED_RANDOM_DPF => WeightedRandomDpf {
                weight: f[0],
                weight_dpf: f[1],
                distance: f[2],
            },
            PolicyType::LEAST_USED_DPF => LeastUsedDpf {
                load: f[0],
                load_dpf: f[1],
                distance: f[2],
            },
            PolicyType::LEAST_USED_DEGRADATION_DPF => LeastUsedDegradationDpf {
                load: f[0],
                degradation: f[1],
                load_dpf: f[2],
                distance: f[3],
            },
            PolicyType::PRIORITY_LEAST_USED_DPF => PriorityLeastUsedDpf {
                load: f[0],
                degradation: f[1],
                load_dpf: f[2],
                distance: f[3],
            },
            PolicyType::PRIORITY_LEAST_USED_DEGRADATION_DPF => PriorityLeastUsedDegradationDpf {
                load: f[0],
                degradation: f[1],
                load_dpf: f[2],
                distance: f[3],
            },
            _ => return None,
        })
    }

    /// The PE's load (0xffffffff = 100 %), for the Least Used family.
    pub fn load(&self) -> Option<u32> {
        use PoolPolicy::*;
        match *self {
            LeastUsed { load }
            | RandomizedLeastUsed { load }
            | LeastUsedDegradation { load, .. }
            | PriorityLeastUsed { load, .. }
            | RandomizedPriorityLeastUsed { load, .. }
            | RandomizedLeastUsedDegradation { load, .. }
            | PriorityLeastUsedDegradation { load, .. }
            | RandomizedPriorityLeastUsedDegradation { load, .. }
            | LeastUsedDpf { load, .. }
            | LeastUsedDegradationDpf { load, .. }
            | PriorityLeastUsedDpf { load, .. }
            | PriorityLeastUsedDegradationDpf { load, .. } => Some(load),
            _ => None,
        }
    }

    /// The load degradation (load increment per selection, or the priority offset of PLU).
    pub fn degradation(&self) -> Option<u32> {
        use PoolPolicy::*;
        match *self {
            LeastUsedDegradation { degradation, .. }
            | PriorityLeastUsed { degradation, .. }
            | RandomizedPriorityLeastUsed { degradation, .. }
            | RandomizedLeastUsedDegradation { degradation, .. }
            | PriorityLeastUsedDegradation { degradation, .. }
            | RandomizedPriorityLeastUsedDegradation { degradation, .. }
            | LeastUsedDegradationDpf { degradation, .. }
            | PriorityLeastUsedDpf { degradation, .. }
            | PriorityLeastUsedDegradationDpf { degradation, .. } => Some(degradation),
            _ => None,
        }
    }

    /// The weight, for the weighted policies.
    pub fn weight(&self) -> Option<u32> {
        use PoolPolicy::*;
        match *self {
            WeightedRoundRobin { weight }
            | WeightedRandom { weight }
            | WeightedRandomDpf { weight, .. } => Some(weight),
            _ => None,
        }
    }

    /// The priority, for the Priority policy.
    pub fn priority(&self) -> Option<u32> {
        match *self {
            PoolPolicy::Priority { priority } => Some(priority),
            _ => None,
        }
    }

    /// Distance (ms) and distance penalty factor, for the DPF family.
    pub fn distance_penalty(&self) -> Option<(u32, u32)> {
        use PoolPolicy::*;
        match *self {
            WeightedRandomDpf {
                weight_dpf,
                distance,
                ..
            } => Some((distance, weight_dpf)),
            LeastUsedDpf {
                load_dpf, distance, ..
            }
            | LeastUsedDegradationDpf {
                load_dpf, distance, ..
            }
            | PriorityLeastUsedDpf {
                load_dpf, distance, ..
            }
            | PriorityLeastUsedDegradationDpf {
                load_dpf, distance, ..
            } => Some((distance, load_dpf)),
            _ => None,
        }
    }

    /// The Pool Member Selection Policy parameter on its own, e.g. to quote it in the error cause
    /// "Inconsistent Pooling Policy" (RFC 5354 §3.12).
    pub fn to_parameter(&self) -> Result<Vec<u8>, EncodeError> {
        crate::codec::parameter_bytes(|w| self.encode(w))
    }

    pub(crate) fn decode(ctx: &mut Ctx<'_>, tlv: &Tlv<'_>) -> Result<Self, DecodeError> {
        let mut r = ctx.reader(tlv.value_offset(), tlv.end());
        let result = (|| {
            let type_offset = r.pos;
            let t = PolicyType(r.u32(ctx)?);
            if t.0 == 0 || t.0 == 0x4000_0000 {
                return Err(ctx.err(
                    type_offset,
                    DecodeErrorKind::InvalidValue {
                        field: "policy type",
                        value: u64::from(t.0),
                    },
                ));
            }
            let Some(n) = t.field_count() else {
                return Ok(PoolPolicy::Other {
                    policy_type: t.0,
                    data: r.rest().to_vec(),
                });
            };
            if r.remaining() != 4 * n {
                return Err(ctx.err(
                    tlv.offset + 2,
                    DecodeErrorKind::BadLength {
                        length: tlv.value.len() + 4,
                        expected: ["8", "12", "16", "20", "24"][n],
                    },
                ));
            }
            let mut f = [0u32; 4];
            for v in f.iter_mut().take(n) {
                *v = r.u32(ctx)?;
            }
            Ok(PoolPolicy::from_fields(t, &f[..n]).expect("field count checked"))
        })();
        result.map_err(|e| in_param(e, tlv))
    }

    pub(crate) fn encode(&self, w: &mut Writer<'_>) -> Result<(), EncodeError> {
        let t = self.policy_type();
        if t.0 == 0 || t.0 == 0x4000_0000 {
            return Err(EncodeError::InvalidValue {
                field: "policy type",
                reason: "0x00000000 and 0x40000000 are reserved",
            });
        }
        let mark = w.begin_tlv(ParameterType::POOL_MEMBER_SELECTION_POLICY);
        w.u32(t.0);
        match self {
            PoolPolicy::Other { data, .. } => {
                if t.field_count().is_some() {
                    return Err(EncodeError::InvalidValue {
                        field: "policy type",
                        reason: "a known policy type must use its own variant",
                    });
                }
                w.bytes(data);
            }
            _ => {
                for &v in self.fields().iter() {
                    w.u32(v);
                }
            }
        }
        w.end_tlv(mark)
    }
}

impl fmt::Display for PoolPolicy {
    /// `Least Used (load 25.00%)`: the policy name and its values, loads as percentages.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.policy_type())?;
        let pct = |v: u32| 100.0 * f64::from(v) / f64::from(u32::MAX);
        let mut parts = Vec::new();
        if let Some(w) = self.weight() {
            parts.push(format!("weight {w}"));
        }
        if let Some(p) = self.priority() {
            parts.push(format!("priority {p}"));
        }
        if let Some(l) = self.load() {
            parts.push(format!("load {:.2}%", pct(l)));
        }
        if let Some(d) = self.degradation() {
            parts.push(format!("degradation {:.2}%", pct(d)));
        }
        if let Some((distance, dpf)) = self.distance_penalty() {
            parts.push(format!(
                "distance {distance} ms, dpf {:.5}",
                f64::from(dpf) / f64::from(u32::MAX)
            ));
        }
        if let PoolPolicy::Other { data, .. } = self {
            parts.push(format!("{} value bytes", data.len()));
        }
        if !parts.is_empty() {
            write!(f, " ({})", parts.join(", "))?;
        }
        Ok(())
    }
}
