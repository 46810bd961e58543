//! Registrar settings: profiles (RSPLIB-compatible or RFC text), timers, limits and rates.

use rserpool_handlespace::HandlespaceConfig;
use rserpool_wire::{CodecConfig, LifeUnit, RegistrarId};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

/// Which set of defaults and behaviours the registrar follows (docs/compat.md lists them).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Profile {
    /// Talks to RSPLIB 3.x: registration life in ms, RSPLIB's multicast groups and timers,
    /// ENDPOINT_UNREACHABLE counted until MAX-BAD-PE-REPORT, then the PE is probed.
    #[default]
    Rsplib,
    /// Follows the RFC text: registration life in s, IANA multicast groups, and an
    /// ENDPOINT_UNREACHABLE also makes the registrar probe the PE at once (RFC 5352 §3.5).
    Rfc,
}

impl Profile {
    /// The profile's name as the command line spells it.
    pub fn name(self) -> &'static str {
        match self {
            Profile::Rsplib => "rsplib",
            Profile::Rfc => "rfc",
        }
    }

    /// The default group and port for ASAP_SERVER_ANNOUNCE (RSPLIB 239.0.0.50:3863; IANA
    /// 224.0.1.185:3863).
    pub fn announce_group(self) -> SocketAddr {
        match self {
            Profile::Rsplib => SocketAddr::new(IpAddr::V4(Ipv4Addr::new(239, 0, 0, 50)), 3863),
            Profile::Rfc => SocketAddr::new(IpAddr::V4(Ipv4Addr::new(224, 0, 1, 185)), 3863),
        }
    }
}

/// How far an address reaches, narrowest first (the ranks RSPLIB's `-minaddressscope` uses).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum AddressScope {
    /// 0.0.0.0 and ::.
    Unspecified,
    /// 127.0.0.0/8 and ::1.
    Loopback,
    /// 169.254.0.0/16 and fe80::/10.
    LinkLocal,
    /// RFC 1918 private networks, fec0::/10 and unique local fc00::/7.
    SiteLocal,
    /// Everything else.
    Global,
}

impl AddressScope {
    /// The scope of an address (IPv4-mapped IPv6 addresses as their IPv4 address).
    pub fn of(address: &IpAddr) -> AddressScope {
        match address {
            IpAddr::V4(a) => {
                if a.is_unspecified() {
                    AddressScope::Unspecified
                } else if a.is_loopback() {
                    AddressScope::Loopback
                } else if a.is_link_local() {
                    AddressScope::LinkLocal
                } else if a.is_private() {
                    AddressScope::SiteLocal
                } else {
                    AddressScope::Global
                }
            }
            IpAddr::V6(a) => {
                if let Some(v4) = a.to_ipv4_mapped() {
                    return AddressScope::of(&IpAddr::V4(v4));
                }
                let first = a.segments()[0];
                if a.is_unspecified() {
                    AddressScope::Unspecified
                } else if a.is_loopback() {
                    AddressScope::Loopback
                } else if first & 0xffc0 == 0xfe80 {
                    AddressScope::LinkLocal
                } else if first & 0xffc0 == 0xfec0 || first & 0xfe00 == 0xfc00 {
                    AddressScope::SiteLocal
                } else {
                    AddressScope::Global
                }
            }
        }
    }

    /// The name the command line uses.
    pub fn name(self) -> &'static str {
        match self {
            AddressScope::Unspecified => "any",
            AddressScope::Loopback => "loopback",
            AddressScope::LinkLocal => "link-local",
            AddressScope::SiteLocal => "site-local",
            AddressScope::Global => "global",
        }
    }
}

/// A per-client rate limit: at most `rate` requests per second on average, bursts of `burst`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RateLimit {
    /// Requests per second allowed on average.
    pub rate: f64,
    /// Requests allowed at once (bucket size).
    pub burst: f64,
}

/// Everything the registrar core needs to know before it starts.
#[derive(Debug, Clone)]
pub struct RegistrarConfig {
    /// This registrar's identifier; 0 picks a random non-zero one.
    pub registrar_id: RegistrarId,
    /// Defaults and behaviours.
    pub profile: Profile,
    /// Codec limits and the registration-life unit.
    pub codec: CodecConfig,
    /// Handlespace limits (pools, PEs per pool, PEs in total).
    pub handlespace: HandlespaceConfig,
    /// Mean time between two ENDPOINT_KEEP_ALIVEs to a PE (RSPLIB: 5 s).
    pub keep_alive_interval: Duration,
    /// Each keep-alive interval is drawn uniformly from interval × (1 ± jitter) (RFC 5352 §3.4
    /// asks for randomised intervals so that keep-alives to many PEs do not synchronise).
    pub keep_alive_jitter: f64,
    /// How long a PE has to answer a keep-alive before it is removed (RSPLIB: 5 s).
    pub keep_alive_timeout: Duration,
    /// ENDPOINT_UNREACHABLE reports after which the registrar probes the PE with a keep-alive
    /// (MAX-BAD-PE-REPORT, RFC 5352 §3.5); the PE is removed only if that probe fails.
    pub max_bad_pe_reports: u32,
    /// Whether every ENDPOINT_UNREACHABLE, not only the one reaching
    /// [`RegistrarConfig::max_bad_pe_reports`], makes the registrar probe the PE at once
    /// (RFC 5352 §3.5; on in the `rfc` profile).
    pub probe_on_unreachable: bool,
    /// PEs returned by a handle resolution without a Handle Resolution option (or with Items
    /// 0): RSPLIB's `-maxhresitems`, default 3.
    pub default_handle_resolution_items: u32,
    /// The most PEs one handle resolution returns, whatever the PU asks (RSPLIB: 128); Items
    /// 0xffffffff ("all") gets this many.
    pub max_handle_resolution_items: u32,
    /// Per-client rate of ASAP_HANDLE_RESOLUTIONs (RSPLIB's `-maxhrrate`); `None` = unlimited.
    pub handle_resolution_rate: Option<RateLimit>,
    /// Per-client rate of ASAP_ENDPOINT_UNREACHABLEs (RSPLIB's `-maxeurate`; RFC 5355 asks for
    /// one); `None` = unlimited.
    pub endpoint_unreachable_rate: Option<RateLimit>,
    /// Rate of ASAP_HANDLE_RESOLUTIONs of all associations from one source address together
    /// (RFC 5355: one host flooding over many associations); `None` = unlimited.
    pub handle_resolution_rate_per_address: Option<RateLimit>,
    /// Per-association rate of ASAP_REGISTRATIONs, new and re-registrations alike (RFC 5355
    /// §3.1/§3.2: registration floods); refused ones are answered with cause 0xa. `None` =
    /// unlimited.
    pub registration_rate: Option<RateLimit>,
    /// Most associations (PEs and PUs together) served at once; more are refused.
    pub max_associations: usize,
    /// Most associations from one source address at once, so that one host cannot take all
    /// of [`RegistrarConfig::max_associations`]; 0 = no per-address limit.
    pub max_associations_per_address: usize,
    /// Most PEs registered over one association; more new ones are refused with cause 0x6.
    /// 0 = no per-association limit.
    pub max_pool_elements_per_association: usize,
    /// Most registrations from other associations that wait for one ownership probe; more
    /// are refused at once with cause 0xa.
    pub max_pending_claims: usize,
    /// How long the owner of a claimed PE has to answer the probe (at most
    /// [`RegistrarConfig::keep_alive_timeout`]). The claimant waits that long for its answer,
    /// so it must stay below the PEs' registration request timeout (RSPLIB: 3 s).
    pub ownership_probe_timeout: Duration,
    /// How many keep-alive probes ENDPOINT_UNREACHABLE reports may trigger for one PE within
    /// [`RegistrarConfig::unreachable_probe_interval`] (never more than one at a time).
    pub max_unreachable_probes: u32,
    /// The window [`RegistrarConfig::max_unreachable_probes`] counts in.
    pub unreachable_probe_interval: Duration,
    /// Whether a PE's user-transport addresses must be among its association's addresses
    /// (RFC 5352 §2.2.1). Addresses that are not are dropped from the registration; if none
    /// is left, the registration is refused (as RSPLIB does). Off for the plain-TCP mode.
    pub check_user_transport_addresses: bool,
    /// Narrowest address scope accepted in user and ASAP transports (RSPLIB's
    /// `-minaddressscope`, default site-local): narrower addresses are dropped.
    pub min_address_scope: AddressScope,
    /// Whether the registration life of the PEs this registrar is home for is enforced (RFC 5352
    /// §3.1; on in the `rfc` profile). RSPLIB relies on keep-alives alone for its own PEs, and
    /// its PEs take any unsolicited DEREGISTRATION_RESPONSE as a protocol error.
    pub enforce_registration_life: bool,
    /// ASAP_SERVER_ANNOUNCE by multicast; `None` turns announces off.
    pub announce: Option<AnnounceConfig>,
    /// Whether every answered handle resolution is reported as a
    /// [`crate::RegistrarEvent::HandleResolution`] with its selection (the PEs chosen and the
    /// inputs of the choice). Off, resolutions are only counted in the metrics, which spares a
    /// busy registrar a report per request nobody reads; the driver turns it on when debug logs
    /// are on.
    pub report_resolutions: bool,
    /// Rules by TLS certificate identity: who may register into which pools, who may peer over
    /// ENRP, whether pool users without a certificate may resolve. `None` (a registrar without
    /// TLS) checks nothing.
    pub access: Option<crate::access::AccessRules>,
    /// Seed of the registrar's random numbers (keep-alive jitter, random policies); `None`
    /// seeds from the operating system. Set it to make a run reproducible.
    pub seed: Option<u64>,
}

/// Server announces (RFC 5352 §3.6).
#[derive(Debug, Clone, PartialEq)]
pub struct AnnounceConfig {
    /// Group and port the announces go to.
    pub group: SocketAddr,
    /// T6, the announce cycle (1 s); with N ENRP peers known each registrar sends every
    /// (N+1)·T6.
    pub interval: Duration,
    /// Each cycle is drawn from interval × (1 ± jitter) (RSPLIB: 12.5 %).
    pub jitter: f64,
    /// Where this registrar accepts ASAP, as announced (empty: SCTP on the announce's source
    /// address and the well-known port).
    pub transports: Vec<rserpool_wire::TransportAddress>,
}

impl RegistrarConfig {
    /// The defaults of a profile.
    pub fn new(profile: Profile) -> Self {
        let codec = match profile {
            Profile::Rsplib => CodecConfig::default(),
            Profile::Rfc => CodecConfig {
                registration_life_unit: LifeUnit::Seconds,
                ..CodecConfig::default()
            },
        };
        RegistrarConfig {
            registrar_id: RegistrarId(0),
            profile,
            codec,
            handlespace: HandlespaceConfig::default(),
            keep_alive_interval: Duration::from_secs(5),
            keep_alive_jitter: 0.25,
            keep_alive_timeout: Duration::from_secs(5),
            max_bad_pe_reports: 3,
            probe_on_unreachable: profile == Profile::Rfc,
            default_handle_resolution_items: 3,
            max_handle_resolution_items: 128,
            handle_resolution_rate: None,
            endpoint_unreachable_rate: Some(RateLimit {
                rate: 10.0,
                burst: 20.0,
            }),
            handle_resolution_rate_per_address: Some(RateLimit {
                rate: 2000.0,
                burst: 4000.0,
            }),
            registration_rate: Some(RateLimit {
                rate: 100.0,
                burst: 200.0,
            }),
            max_associations: 10_000,
            max_associations_per_address: 256,
            max_pool_elements_per_association: 1024,
            max_pending_claims: 4,
            ownership_probe_timeout: Duration::from_secs(2),
            max_unreachable_probes: 3,
            unreachable_probe_interval: Duration::from_secs(30),
            check_user_transport_addresses: true,
            min_address_scope: AddressScope::SiteLocal,
            enforce_registration_life: profile == Profile::Rfc,
            announce: Some(AnnounceConfig {
                group: profile.announce_group(),
                interval: Duration::from_secs(1),
                jitter: 0.125,
                transports: Vec::new(),
            }),
            report_resolutions: true,
            access: None,
            seed: None,
        }
    }
}

impl Default for RegistrarConfig {
    fn default() -> Self {
        RegistrarConfig::new(Profile::Rsplib)
    }
}
