//! ENRP settings, with the defaults of each profile (RSPLIB's `rspregistrar`, or RFC 5353 §7).

use crate::config::Profile;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

/// Who wins when two registrars try to take over the same dead peer (RFC 5353 §3.5.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Arbitration {
    /// The lower registrar ID wins (RSPLIB, and the Tüxen/Volkmer ENRP server).
    LowerIdWins,
    /// The higher registrar ID wins: the lower one acknowledges and aborts (RFC 5353 §3.5.1).
    HigherIdWins,
}

/// Everything the ENRP core needs to know before it starts.
#[derive(Debug, Clone, PartialEq)]
pub struct EnrpConfig {
    /// Defaults and behaviours.
    pub profile: Profile,
    /// PEER-HEARTBEAT-CYCLE: the PRESENCE interval (RSPLIB `-peerheartbeatcycle`: 2.444 s;
    /// RFC 5353 §7: 30 s).
    pub peer_heartbeat_cycle: Duration,
    /// Each cycle is drawn from cycle × (1 ± jitter) (RSPLIB: 12.5 %).
    pub peer_heartbeat_jitter: f64,
    /// MAX-TIME-LAST-HEARD: silence after which a peer gets a PRESENCE with R=1 (RSPLIB
    /// `-peermaxtimelastheard`: 5 s; RFC: 61 s).
    pub max_time_last_heard: Duration,
    /// MAX-TIME-NO-RESPONSE: no answer to that PRESENCE within this and the peer is dead
    /// (`-peermaxtimenoresponse`: 5 s in both).
    pub max_time_no_response: Duration,
    /// How long a starting registrar waits for a mentor before it serves on its own
    /// (`-mentordiscoverytimeout`: 5 s).
    pub mentor_discovery_timeout: Duration,
    /// A takeover not acknowledged by every peer within this is abandoned
    /// (`-takeoverexpiryinterval`: 5 s).
    pub takeover_expiry: Duration,
    /// Most PEs in one HANDLE_TABLE_RESPONSE (`-maxelementsperhtrequest`: 128).
    pub max_elements_per_handle_table_response: usize,
    /// Largest HANDLE_TABLE_RESPONSE in bytes (RSPLIB fills a 1400-byte buffer).
    pub max_handle_table_response_bytes: usize,
    /// Most peers known at once; more are ignored and reported.
    pub max_peers: usize,
    /// Most PEs learned from one peer; more are refused and reported.
    pub max_pool_elements_per_peer: usize,
    /// Static peers (`-peer=addr[,addr]:port`): each entry is one peer's ENRP addresses.
    pub static_peers: Vec<Vec<SocketAddr>>,
    /// Who wins a takeover race.
    pub arbitration: Arbitration,
    /// Whether HANDLE_UPDATEs with T=1 are sent and honoured
    /// (draft-dreibholz-rserpool-enrp-takeover; `-supporttakeoversuggestion`). Off by default.
    pub takeover_suggestion: bool,
    /// Whether PRESENCE goes to the ENRP multicast group too (the driver owns the socket).
    pub multicast: bool,
    /// Seed of the heartbeat jitter; `None` seeds from the operating system.
    pub seed: Option<u64>,
}

impl EnrpConfig {
    /// The defaults of a profile.
    pub fn new(profile: Profile) -> Self {
        let (cycle, last_heard, arbitration) = match profile {
            Profile::Rsplib => (
                Duration::from_micros(2_444_444),
                Duration::from_secs(5),
                Arbitration::LowerIdWins,
            ),
            Profile::Rfc => (
                Duration::from_secs(30),
                Duration::from_secs(61),
                Arbitration::HigherIdWins,
            ),
        };
        EnrpConfig {
            profile,
            peer_heartbeat_cycle: cycle,
            peer_heartbeat_jitter: 0.125,
            max_time_last_heard: last_heard,
            max_time_no_response: Duration::from_secs(5),
            mentor_discovery_timeout: Duration::from_secs(5),
            takeover_expiry: Duration::from_secs(5),
            max_elements_per_handle_table_response: 128,
            max_handle_table_response_bytes: 1400,
            max_peers: 64,
            max_pool_elements_per_peer: 1 << 20,
            static_peers: Vec::new(),
            arbitration,
            takeover_suggestion: false,
            multicast: false,
            seed: None,
        }
    }

    /// The ENRP multicast group of a profile (RSPLIB 239.0.0.51:9901; IANA 224.0.1.185:9901).
    pub fn multicast_group(profile: Profile) -> SocketAddr {
        match profile {
            Profile::Rsplib => SocketAddr::new(IpAddr::V4(Ipv4Addr::new(239, 0, 0, 51)), 9901),
            Profile::Rfc => SocketAddr::new(IpAddr::V4(Ipv4Addr::new(224, 0, 1, 185)), 9901),
        }
    }
}

impl Default for EnrpConfig {
    fn default() -> Self {
        EnrpConfig::new(Profile::Rsplib)
    }
}
