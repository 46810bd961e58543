//! Pool elements as tests register them: the wire element and the driver's configuration.

use rserpool_endpoint::driver::{PeStatus, PoolElementHandle, RegistrarAccess};
use rserpool_endpoint::pe::PoolElementConfig;
use rserpool_transport::TransportError;
use rserpool_wire::{
    PoolElement, PoolElementId, PoolHandle, PoolPolicy, RegistrarId, RegistrationLife,
    TransportAddress, UserTransport,
};
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

/// A PE as it registers over the TCP mapping: identifier `id`, TCP user transport on
/// `addr`:`port` (data only), round robin, a registration life of 90 s, no home yet and no ASAP
/// transport (the registrar records the association's).
pub fn tcp_pe(id: u32, addr: IpAddr, port: u16) -> PoolElement {
    PoolElement {
        id: PoolElementId(id),
        home_registrar: RegistrarId(0),
        registration_life: RegistrationLife::Finite(Duration::from_secs(90)),
        user_transport: UserTransport::Address(TransportAddress::tcp(port, addr)),
        policy: PoolPolicy::RoundRobin,
        asap_transport: None,
    }
}

/// The PE driver's configuration for a PE of `pool` serving TCP at `at` with `policy`.
pub fn pe_config(pool: &str, at: SocketAddr, policy: PoolPolicy) -> PoolElementConfig {
    PoolElementConfig::new(
        PoolHandle::from(pool),
        UserTransport::Address(TransportAddress::tcp(at.port(), at.ip())),
        policy,
    )
}

/// Why [`registered_pe`] has no registered PE.
#[derive(Debug, thiserror::Error)]
pub enum PeError {
    /// The driver could not start (its endpoint could not be bound).
    #[error("the PE driver does not start: {0}")]
    Start(#[from] TransportError),
    /// The registrar did not accept the PE in time.
    #[error("not registered within {within:?}: {status:?}")]
    NotRegistered {
        /// The time given.
        within: Duration,
        /// The driver's status then (the last reject, the registrar tried).
        status: Box<PeStatus>,
    },
}

/// Starts the endpoint crate's PE driver with `config` at `access` and waits up to `within`
/// until it is registered. The driver answers keep-alives and re-registers by itself.
pub async fn registered_pe(
    access: RegistrarAccess,
    config: PoolElementConfig,
    within: Duration,
) -> Result<PoolElementHandle, PeError> {
    let mut h = PoolElementHandle::start(config, access).await?;
    if h.wait_registered(within).await {
        Ok(h)
    } else {
        Err(PeError::NotRegistered {
            within,
            status: Box::new(h.status()),
        })
    }
}
