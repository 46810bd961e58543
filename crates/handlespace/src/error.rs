//! Typed errors of handlespace operations and of the verifier.

use rserpool_wire::{CauseCode, ParameterType, PolicyType, PoolElementId, TransportUse};

/// Why a handlespace operation was refused. [`Error::cause_code`] gives the ASAP/ENRP error
/// cause (RFC 5352 §5, RFC 5354 §3.12) a registrar reports for it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// The pool handle is empty or longer than the configured maximum.
    #[error("pool handle of {len} bytes (1 to {max} accepted)")]
    InvalidPoolHandle {
        /// Length of the offered handle.
        len: usize,
        /// The configured maximum.
        max: usize,
    },
    /// PE identifier 0 is refused (RSPLIB treats it as "no identifier").
    #[error("PE identifier 0 is not a valid identifier")]
    InvalidPoolElementId,
    /// The policy type is not one this handlespace can select by.
    #[error("unsupported pool policy {0}")]
    UnsupportedPolicy(PolicyType),
    /// RFC 5352 §3.1: the pool's first PE fixed another policy.
    #[error("pool uses {pool}, registration asks for {requested}")]
    InconsistentPolicy {
        /// The pool's policy.
        pool: PolicyType,
        /// The registration's policy.
        requested: PolicyType,
    },
    /// RFC 5352 §3.1: the pool's first PE fixed another user transport type.
    #[error("pool uses {pool} as user transport, registration offers {requested}")]
    InconsistentTransportType {
        /// The pool's transport parameter type.
        pool: ParameterType,
        /// The registration's transport parameter type.
        requested: ParameterType,
    },
    /// RFC 5352 §3.1: the pool's first PE fixed another transport use (data only or data plus
    /// control).
    #[error("pool uses transport use {pool:?}, registration asks for {requested:?}")]
    InconsistentTransportUse {
        /// The pool's transport use.
        pool: TransportUse,
        /// The registration's transport use.
        requested: TransportUse,
    },
    /// Creating the pool would exceed [`max_pools`](crate::HandlespaceConfig::max_pools).
    #[error("pool limit of {limit} reached")]
    TooManyPools {
        /// The configured limit.
        limit: usize,
    },
    /// The pool already holds
    /// [`max_pool_elements_per_pool`](crate::HandlespaceConfig::max_pool_elements_per_pool) PEs.
    #[error("pool is full ({limit} PEs)")]
    PoolFull {
        /// The configured limit.
        limit: usize,
    },
    /// The handlespace already holds
    /// [`max_pool_elements`](crate::HandlespaceConfig::max_pool_elements) PEs.
    #[error("handlespace is full ({limit} PEs)")]
    HandlespaceFull {
        /// The configured limit.
        limit: usize,
    },
    /// No pool has this handle.
    #[error("unknown pool handle")]
    UnknownPoolHandle,
    /// The pool has no PE with this identifier.
    #[error("pool has no PE {0}")]
    UnknownPoolElement(PoolElementId),
    /// The [`EntryId`](crate::EntryId) names a PE that has been removed since.
    #[error("stale entry id: the PE has been removed")]
    StaleEntry,
}

impl Error {
    /// The error cause a registrar sends for this refusal.
    ///
    /// An unknown PE maps to 0x9 like an unknown pool, as RSPLIB answers both with its
    /// "not found" code; an invalid handle, PE identifier or unsupported policy maps to 0x3.
    pub fn cause_code(&self) -> CauseCode {
        match self {
            Error::InvalidPoolHandle { .. }
            | Error::InvalidPoolElementId
            | Error::UnsupportedPolicy(_) => CauseCode::InvalidValues,
            Error::InconsistentPolicy { .. } => CauseCode::InconsistentPoolingPolicy,
            Error::InconsistentTransportType { .. } => CauseCode::InconsistentTransportType,
            Error::InconsistentTransportUse { .. } => {
                CauseCode::InconsistentDataControlConfiguration
            }
            Error::TooManyPools { .. } | Error::PoolFull { .. } | Error::HandlespaceFull { .. } => {
                CauseCode::LackOfResources
            }
            Error::UnknownPoolHandle | Error::UnknownPoolElement(_) => CauseCode::UnknownPoolHandle,
            Error::StaleEntry => CauseCode::Unspecified,
        }
    }
}

/// An inconsistency found by [`Handlespace::verify`](crate::Handlespace::verify): an index or
/// checksum that disagrees with a full recomputation. It means a bug in this crate.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("handlespace inconsistent: {0}")]
pub struct VerifyError(pub String);
