//! Limits and behaviour switches of a [`Handlespace`](crate::Handlespace).

/// How the per-owner PE checksum (RFC 5353 §3.6.2) is folded.
///
/// Both flavors sum the same 16-bit words and agree while an owner's word sum stays below 2^32
/// (roughly 20 000 PEs with 8-byte pool handles). Beyond that RSPLIB's 32-bit accumulator wraps
/// before the end-around carry is folded in, and its checksum differs from RFC 1071's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum ChecksumFlavor {
    /// As RSPLIB computes it on little-endian hosts (the deployed registrars): the word sum is
    /// reduced modulo 2^32 before folding. Default, so that audits with RSPLIB peers agree.
    #[default]
    Rsplib,
    /// The RFC 1071 Internet checksum exactly, whatever the number of PEs.
    Rfc1071,
}

/// Limits and behaviour switches; every limit is enforced and reported with
/// [`CauseCode::LackOfResources`](rserpool_wire::CauseCode::LackOfResources) when hit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HandlespaceConfig {
    /// Most pools held at once; a registration that would create one more is refused.
    pub max_pools: usize,
    /// Most PEs in one pool.
    pub max_pool_elements_per_pool: usize,
    /// Most PEs in the whole handlespace.
    pub max_pool_elements: usize,
    /// Longest pool handle accepted, in bytes (RSPLIB accepts at most 32).
    pub max_pool_handle_len: usize,
    /// How many of the PEs returned by one selection advance their policy state (round-robin
    /// position, LUD counter, WRR credit), counted from the first. RSPLIB's registrar default
    /// is 1: a handle resolution for 3 PEs of a round-robin pool returns PEs i, i+1, i+2 and
    /// the next one starts at i+1. `usize::MAX` advances every returned PE; 0 acts as 1.
    pub max_increment: usize,
    /// How the per-owner PE checksum is folded.
    pub checksum_flavor: ChecksumFlavor,
}

impl HandlespaceConfig {
    /// The limits used by [`Default`]: 65 536 pools, 2^20 PEs per pool, 2^22 PEs in total,
    /// 32-byte pool handles, max increment 1, RSPLIB's checksum.
    pub const DEFAULT: HandlespaceConfig = HandlespaceConfig {
        max_pools: 1 << 16,
        max_pool_elements_per_pool: 1 << 20,
        max_pool_elements: 1 << 22,
        max_pool_handle_len: 32,
        max_increment: 1,
        checksum_flavor: ChecksumFlavor::Rsplib,
    };

    /// The effective max increment (at least 1).
    #[inline]
    pub(crate) fn increment(&self) -> usize {
        self.max_increment.max(1)
    }
}

impl Default for HandlespaceConfig {
    fn default() -> Self {
        Self::DEFAULT
    }
}
