//! ENRP counters and the registrar's peer status, rendered with the registrar's metrics.

use rserpool_observe::{Kind, MetricSet};
use rserpool_wire::enrp::EnrpMessageType;
use rserpool_wire::{PeChecksum, RegistrarId};

/// Takeover outcomes, in the order [`EnrpMetrics::takeovers`] counts them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TakeoverOutcome {
    /// Started (INIT_TAKEOVER sent).
    Started,
    /// Won: every peer acknowledged, TAKEOVER_SERVER sent.
    Won,
    /// Lost: another registrar won the arbitration or announced TAKEOVER_SERVER first.
    Lost,
    /// Abandoned: not every peer acknowledged before the takeover expired.
    Abandoned,
    /// Refuted: the target showed it is alive.
    Refuted,
}

impl TakeoverOutcome {
    /// All outcomes.
    pub const ALL: [TakeoverOutcome; 5] = [
        Self::Started,
        Self::Won,
        Self::Lost,
        Self::Abandoned,
        Self::Refuted,
    ];

    /// Label value.
    pub fn label(self) -> &'static str {
        match self {
            Self::Started => "started",
            Self::Won => "won",
            Self::Lost => "lost",
            Self::Abandoned => "abandoned",
            Self::Refuted => "refuted",
        }
    }
}

/// What the registrar knows of one peer, for the status output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerStatus {
    /// The peer's registrar ID.
    pub id: RegistrarId,
    /// The checksum of its PEs it last announced.
    pub announced_checksum: PeChecksum,
    /// The checksum of the PEs this registrar holds for it.
    pub held_checksum: PeChecksum,
    /// PEs held for it.
    pub pool_elements: u64,
    /// "synchronising", "in sync" or "differs".
    pub sync: &'static str,
}

/// ENRP counters (monotonic) and gauges (current values).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EnrpMetrics {
    /// Peers known now.
    pub peers: u64,
    /// Messages sent, by ENRP type (index = type − 1).
    pub sent: [u64; 10],
    /// Messages received, by ENRP type (index = type − 1).
    pub received: [u64; 10],
    /// Takeovers, by [`TakeoverOutcome`].
    pub takeovers: [u64; 5],
    /// Peers found dead (no answer to a PRESENCE with R=1).
    pub peers_dead: u64,
    /// Peers that owned no PEs forgotten when their association closed (visitors such as
    /// `rserpool dump` and RSPLIB's `hsdump`).
    pub peers_departed: u64,
    /// Handle table synchronisations started (mentor or audit).
    pub syncs_started: u64,
    /// Audits that found a checksum mismatch and started a resynchronisation (W=1).
    pub audit_mismatches: u64,
    /// PEs learned from peers (new ones; updates not counted).
    pub pool_elements_learned: u64,
    /// PEs dropped because their owner said so, a resynchronisation did not confirm them, or
    /// their owner died.
    pub pool_elements_dropped: u64,
    /// Updates or table entries refused (a PE we own, a limit, an inconsistent pool).
    pub updates_refused: u64,
    /// ENRP messages that could not be decoded.
    pub malformed: u64,
    /// ENRP messages ignored (unknown sender, unexpected).
    pub ignored: u64,
    /// ENRP_ERRORs sent.
    pub errors_sent: u64,
    /// Limits hit (peers, PEs per peer).
    pub limits_hit: u64,
    /// PEs in the handlespace by home registrar (ID, PEs, checksum).
    pub pool_elements_by_home: Vec<(RegistrarId, u64, PeChecksum)>,
    /// Each peer's state.
    pub peer_status: Vec<PeerStatus>,
    /// Whether the registrar is still in its start-up phase (mentor discovery).
    pub starting_up: bool,
}

impl EnrpMetrics {
    /// Counts a message sent.
    pub(crate) fn sent(&mut self, t: EnrpMessageType) {
        self.sent[t as usize - 1] += 1;
    }

    /// Counts a message received.
    pub(crate) fn received(&mut self, t: EnrpMessageType) {
        self.received[t as usize - 1] += 1;
    }

    /// Counts a takeover outcome.
    pub(crate) fn takeover(&mut self, o: TakeoverOutcome) {
        self.takeovers[o as usize] += 1;
    }

    /// Messages of a type sent so far.
    pub fn sent_of(&self, t: EnrpMessageType) -> u64 {
        self.sent[t as usize - 1]
    }

    /// Messages of a type received so far.
    pub fn received_of(&self, t: EnrpMessageType) -> u64 {
        self.received[t as usize - 1]
    }

    /// Takeovers with an outcome so far.
    pub fn takeovers_of(&self, o: TakeoverOutcome) -> u64 {
        self.takeovers[o as usize]
    }

    /// Adds the metrics (`rserpool_registrar_enrp_…`) to a scrape.
    pub fn encode(&self, m: &mut MetricSet) {
        let p = "rserpool_registrar_enrp";
        let mut simple = |name: &str, kind: &str, help: &str, value: u64| {
            let name = format!("{p}_{name}");
            match kind {
                "counter" => m.counter(&name, help, value),
                _ => m.gauge(&name, help, value),
            };
        };
        simple("peers", "gauge", "ENRP peers known.", self.peers);
        simple(
            "starting_up",
            "gauge",
            "1 while the registrar looks for a mentor.",
            u64::from(self.starting_up),
        );
        simple(
            "peers_dead_total",
            "counter",
            "Peers found dead (no answer to PRESENCE with R=1).",
            self.peers_dead,
        );
        simple(
            "peers_departed_total",
            "counter",
            "Peers owning no PEs forgotten when their association closed (e.g. rserpool dump).",
            self.peers_departed,
        );
        simple(
            "syncs_started_total",
            "counter",
            "Handle table synchronisations started (mentor or audit).",
            self.syncs_started,
        );
        simple(
            "audit_mismatches_total",
            "counter",
            "Checksum mismatches that started a resynchronisation.",
            self.audit_mismatches,
        );
        simple(
            "pool_elements_learned_total",
            "counter",
            "PEs learned from peers.",
            self.pool_elements_learned,
        );
        simple(
            "pool_elements_dropped_total",
            "counter",
            "Learned PEs dropped (owner said so, not confirmed by a resync, owner dead).",
            self.pool_elements_dropped,
        );
        simple(
            "updates_refused_total",
            "counter",
            "Peer updates or table entries refused.",
            self.updates_refused,
        );
        simple(
            "malformed_messages_total",
            "counter",
            "ENRP messages that could not be decoded.",
            self.malformed,
        );
        simple(
            "ignored_messages_total",
            "counter",
            "ENRP messages ignored (unknown sender, unexpected).",
            self.ignored,
        );
        simple(
            "errors_sent_total",
            "counter",
            "ENRP_ERRORs sent.",
            self.errors_sent,
        );
        simple(
            "limits_hit_total",
            "counter",
            "Peer or PE-per-peer limits hit.",
            self.limits_hit,
        );
        for (dir, counts) in [("sent", &self.sent), ("received", &self.received)] {
            let mut f = m.family(
                &format!("{p}_messages_{dir}_total"),
                Kind::Counter,
                &format!("ENRP messages {dir}, by type."),
            );
            for t in EnrpMessageType::ALL {
                f.sample(&[("type", t.name())], counts[t as usize - 1]);
            }
        }
        let mut f = m.family(
            &format!("{p}_takeovers_total"),
            Kind::Counter,
            "Takeovers, by outcome.",
        );
        for o in TakeoverOutcome::ALL {
            f.sample(&[("outcome", o.label())], self.takeovers_of(o));
        }
        let mut f = m.family(
            &format!("{p}_pool_elements_by_home"),
            Kind::Gauge,
            "PEs in the handlespace by home registrar.",
        );
        for (home, n, checksum) in &self.pool_elements_by_home {
            f.sample(
                &[
                    ("home", &home.to_string()),
                    ("checksum", &format!("0x{:04x}", checksum.0)),
                ],
                *n,
            );
        }
        let mut f = m.family(
            &format!("{p}_peer"),
            Kind::Gauge,
            "PEs held per peer, with its announced and held checksums and sync state.",
        );
        for s in &self.peer_status {
            f.sample(
                &[
                    ("id", &s.id.to_string()),
                    (
                        "announced_checksum",
                        &format!("0x{:04x}", s.announced_checksum.0),
                    ),
                    ("held_checksum", &format!("0x{:04x}", s.held_checksum.0)),
                    ("sync", s.sync),
                ],
                s.pool_elements,
            );
        }
    }
}
