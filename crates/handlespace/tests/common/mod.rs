//! Builders shared by the integration tests.
#![allow(dead_code)]

use rserpool_wire::{
    PoolElement, PoolElementId, PoolPolicy, RegistrarId, RegistrationLife, TransportAddress,
    TransportUse, UserTransport,
};
use std::time::Duration;

pub const HOME: RegistrarId = RegistrarId(0x4b6b_12b3);

/// A PE on SCTP, data only, owned by `HOME`.
pub fn pe(id: u32, policy: PoolPolicy) -> PoolElement {
    pe_on(id, policy, HOME)
}

pub fn pe_on(id: u32, policy: PoolPolicy, home: RegistrarId) -> PoolElement {
    PoolElement {
        id: PoolElementId(id),
        home_registrar: home,
        registration_life: RegistrationLife::Finite(Duration::from_secs(90)),
        user_transport: UserTransport::Address(TransportAddress::sctp(
            7,
            TransportUse::DataOnly,
            vec![[10, 0, (id >> 8) as u8, id as u8].into()],
        )),
        policy,
        asap_transport: Some(TransportAddress::sctp(
            3863,
            TransportUse::DataOnly,
            vec![[10, 0, 0, 1].into()],
        )),
    }
}

pub fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

/// Pearson's chi-square statistic of observed counts against expected proportions.
pub fn chi_square(observed: &[u64], weights: &[f64]) -> f64 {
    let n: u64 = observed.iter().sum();
    let total: f64 = weights.iter().sum();
    observed
        .iter()
        .zip(weights)
        .map(|(&o, &w)| {
            let e = n as f64 * w / total;
            (o as f64 - e).powi(2) / e
        })
        .sum()
}

/// Upper 0.1 % points of the chi-square distribution, by degrees of freedom 1..=9.
pub const CHI2_999: [f64; 9] = [
    10.83, 13.82, 16.27, 18.47, 20.52, 22.46, 24.32, 26.12, 27.88,
];
