//! The peer table (RFC 5353 §3.2): every registrar heard of, with its timer, its sync state and
//! the cursor of the handle table we are sending it.

use rserpool_handlespace::AssociationId;
use rserpool_wire::{PeChecksum, PoolElementId, PoolHandle, RegistrarId};
use rustc_hash::FxHashSet;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

/// Which of a peer's timers runs (RSPLIB keeps one per peer).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PeerTimer {
    /// MAX-TIME-LAST-HEARD: the peer has been silent this long.
    LastHeard,
    /// MAX-TIME-NO-RESPONSE: it did not answer our PRESENCE with R=1.
    NoResponse,
}

/// A handle table download from the peer in progress (start-up from the mentor, or an audit).
#[derive(Debug, Default)]
pub(crate) struct Download {
    /// W flag of the requests.
    pub own_children_only: bool,
    /// Whether the peer is our mentor (W=0 download at start-up).
    pub mentor: bool,
    /// The peer's PEs not yet confirmed by a response (audit: mark and sweep, RFC 5353 §3.6.3).
    pub marked: FxHashSet<(PoolHandle, PoolElementId)>,
    /// PEs taken in so far.
    pub received: usize,
    /// When the last request went out (a download that stalls is abandoned).
    pub requested_at: Duration,
}

/// Where the next HANDLE_TABLE_RESPONSE to this peer continues (RSPLIB keeps one per peer).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Cursor {
    /// W flag of the request that started the walk.
    pub own_children_only: bool,
    /// The last PE sent.
    pub after: (PoolHandle, PoolElementId),
}

/// One peer.
#[derive(Debug)]
pub(crate) struct Peer {
    /// Its ENRP transport addresses (from its Server Information or the configuration).
    pub addresses: Vec<SocketAddr>,
    /// The association its last message came over, if still up.
    pub association: Option<AssociationId>,
    /// Its timer and deadline.
    pub timer: (PeerTimer, Duration),
    /// The checksum it last announced.
    pub announced_checksum: PeChecksum,
    /// Who announced a takeover of it (INIT_TAKEOVER received).
    pub takeover_by: Option<RegistrarId>,
    /// Our download of its table, if one runs.
    pub download: Option<Download>,
    /// Our upload of our table to it, if one runs.
    pub cursor: Option<Cursor>,
    /// Whether we sent it a LIST_REQUEST.
    pub list_requested: bool,
}

/// The table, keyed by registrar ID (never 0).
#[derive(Debug, Default)]
pub(crate) struct Peers {
    pub by_id: BTreeMap<RegistrarId, Peer>,
}

impl Peers {
    /// Number of peers.
    pub fn len(&self) -> usize {
        self.by_id.len()
    }

    /// The peer, if known.
    pub fn get_mut(&mut self, id: RegistrarId) -> Option<&mut Peer> {
        self.by_id.get_mut(&id)
    }

    /// Whether known.
    pub fn contains(&self, id: RegistrarId) -> bool {
        self.by_id.contains_key(&id)
    }

    /// The earliest peer deadline.
    pub fn next_deadline(&self) -> Option<Duration> {
        self.by_id.values().map(|p| p.timer.1).min()
    }

    /// The first peer whose timer is due.
    pub fn due(&self, now: Duration) -> Option<(RegistrarId, PeerTimer)> {
        self.by_id
            .iter()
            .filter(|(_, p)| p.timer.1 <= now)
            .min_by_key(|(_, p)| p.timer.1)
            .map(|(id, p)| (*id, p.timer.0))
    }

    /// Forgets an association that went down.
    pub fn association_down(&mut self, association: AssociationId) {
        for p in self.by_id.values_mut() {
            if p.association == Some(association) {
                p.association = None;
            }
        }
    }

    /// Whether any known peer is reached at one of these addresses.
    pub fn knows_address(&self, addresses: &[SocketAddr]) -> bool {
        self.by_id
            .values()
            .any(|p| p.addresses.iter().any(|a| addresses.contains(a)))
    }
}
