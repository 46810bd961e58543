//! The registrar's counters, kept by the core and rendered in the Prometheus text format.
//!
//! Each fact is its own counter: a registration is not a keep-alive answer, a handle resolution
//! that selected PEs says nothing about whether a PU reached them.

use std::fmt::Write;

/// Why a PE left the handlespace.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum RemovalCause {
    /// The PE sent ASAP_DEREGISTRATION.
    Deregistered,
    /// Its registration life ran out without re-registration.
    LifeExpired,
    /// It did not answer an ENDPOINT_KEEP_ALIVE in time.
    KeepAliveTimeout,
    /// The association it registered over was lost.
    AssociationLost,
    /// Pool users reported it unreachable MAX-BAD-PE-REPORT times.
    UnreachableReports,
}

impl RemovalCause {
    /// All causes, in the order metrics list them.
    pub const ALL: [RemovalCause; 5] = [
        RemovalCause::Deregistered,
        RemovalCause::LifeExpired,
        RemovalCause::KeepAliveTimeout,
        RemovalCause::AssociationLost,
        RemovalCause::UnreachableReports,
    ];

    /// Label value, e.g. `keep_alive_timeout`.
    pub fn label(self) -> &'static str {
        match self {
            RemovalCause::Deregistered => "deregistered",
            RemovalCause::LifeExpired => "life_expired",
            RemovalCause::KeepAliveTimeout => "keep_alive_timeout",
            RemovalCause::AssociationLost => "association_lost",
            RemovalCause::UnreachableReports => "unreachable_reports",
        }
    }
}

impl std::fmt::Display for RemovalCause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            RemovalCause::Deregistered => "deregistered",
            RemovalCause::LifeExpired => "registration life expired",
            RemovalCause::KeepAliveTimeout => "keep-alive timeout",
            RemovalCause::AssociationLost => "association lost",
            RemovalCause::UnreachableReports => "reported unreachable",
        })
    }
}

/// Which per-client rate limit refused a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RateLimited {
    /// ASAP_HANDLE_RESOLUTION (`-maxhrrate`).
    HandleResolution,
    /// ASAP_ENDPOINT_UNREACHABLE (`-maxeurate`).
    EndpointUnreachable,
}

/// Counters (monotonic) and gauges (current values) of a registrar.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Metrics {
    /// New PEs accepted.
    pub registrations: u64,
    /// Re-registrations of known PEs accepted.
    pub reregistrations: u64,
    /// Registrations refused, by cause code (index = cause code, 0x0–0xa; others at 11).
    pub registration_rejects: [u64; 12],
    /// ASAP_DEREGISTRATIONs of known PEs.
    pub deregistrations: u64,
    /// PEs removed, by cause (see [`RemovalCause::ALL`] for the order).
    pub removals: [u64; 5],
    /// ASAP_HANDLE_RESOLUTIONs answered with PEs.
    pub resolutions: u64,
    /// ASAP_HANDLE_RESOLUTIONs answered "Unknown Pool Handle".
    pub resolutions_unknown_pool: u64,
    /// PEs handed out in handle resolution responses (selected, not necessarily reached).
    pub resolved_pool_elements: u64,
    /// ENDPOINT_KEEP_ALIVEs sent.
    pub keep_alives_sent: u64,
    /// ENDPOINT_KEEP_ALIVE_ACKs received in time.
    pub keep_alives_acked: u64,
    /// Keep-alives not answered in time.
    pub keep_alives_missed: u64,
    /// ENDPOINT_UNREACHABLE reports counted against a known PE.
    pub unreachable_reports: u64,
    /// Requests refused by a per-client rate limit: handle resolutions, unreachable reports.
    pub rate_limited: [u64; 2],
    /// Messages that could not be decoded.
    pub malformed_messages: u64,
    /// ASAP_ERRORs sent.
    pub errors_sent: u64,
    /// Associations refused at the association limit.
    pub associations_refused: u64,
    /// Pools now.
    pub pools: u64,
    /// PEs now.
    pub pool_elements: u64,
    /// Associations now.
    pub associations: u64,
    /// ASAP_SERVER_ANNOUNCEs sent.
    pub announces_sent: u64,
    /// Answers waiting for room in the transport now (kept by the driver).
    pub held_answers: u64,
    /// Answers dropped because an association had too many waiting (kept by the driver).
    pub dropped_answers: u64,
    /// PEs taken over from a dead peer that answered the H=1 keep-alive and so adopted this
    /// registrar as their home (RFC 5353 §3.5.2).
    pub adopted: u64,
    /// ENRP counters and peer status, when ENRP runs (kept by the driver).
    pub enrp: Option<crate::enrp::EnrpMetrics>,
}

impl Metrics {
    pub(crate) fn removal(&mut self, cause: RemovalCause) {
        self.removals[cause as usize] += 1;
    }

    pub(crate) fn reject(&mut self, code: u16) {
        self.registration_rejects[usize::from(code).min(11)] += 1;
    }

    pub(crate) fn rate_limited(&mut self, what: RateLimited) {
        self.rate_limited[what as usize] += 1;
    }

    /// Removals with the given cause so far.
    pub fn removals_by(&self, cause: RemovalCause) -> u64 {
        self.removals[cause as usize]
    }

    /// Requests refused by the given rate limit so far.
    pub fn rate_limited_by(&self, what: RateLimited) -> u64 {
        self.rate_limited[what as usize]
    }

    /// The metrics in the Prometheus text exposition format.
    pub fn render_prometheus(&self) -> String {
        let mut out = String::new();
        let mut counter = |name: &str, help: &str, value: u64| {
            let _ = writeln!(out, "# HELP rserpool_registrar_{name} {help}");
            let _ = writeln!(out, "# TYPE rserpool_registrar_{name} counter");
            let _ = writeln!(out, "rserpool_registrar_{name} {value}");
        };
        counter(
            "registrations_total",
            "New PEs accepted.",
            self.registrations,
        );
        counter(
            "reregistrations_total",
            "Re-registrations of known PEs accepted.",
            self.reregistrations,
        );
        counter(
            "deregistrations_total",
            "ASAP_DEREGISTRATIONs of known PEs.",
            self.deregistrations,
        );
        counter(
            "handle_resolutions_total",
            "Handle resolutions answered with PEs.",
            self.resolutions,
        );
        counter(
            "handle_resolutions_unknown_pool_total",
            "Handle resolutions answered Unknown Pool Handle.",
            self.resolutions_unknown_pool,
        );
        counter(
            "resolved_pool_elements_total",
            "PEs handed out in handle resolution responses (selected, not reached).",
            self.resolved_pool_elements,
        );
        counter(
            "keep_alives_sent_total",
            "ENDPOINT_KEEP_ALIVEs sent.",
            self.keep_alives_sent,
        );
        counter(
            "keep_alives_acked_total",
            "ENDPOINT_KEEP_ALIVE_ACKs received in time.",
            self.keep_alives_acked,
        );
        counter(
            "keep_alives_missed_total",
            "Keep-alives not answered in time.",
            self.keep_alives_missed,
        );
        counter(
            "unreachable_reports_total",
            "ENDPOINT_UNREACHABLE reports counted against a known PE.",
            self.unreachable_reports,
        );
        counter(
            "malformed_messages_total",
            "Messages that could not be decoded.",
            self.malformed_messages,
        );
        counter("errors_sent_total", "ASAP_ERRORs sent.", self.errors_sent);
        counter(
            "associations_refused_total",
            "Associations refused at the association limit.",
            self.associations_refused,
        );
        counter(
            "server_announces_total",
            "ASAP_SERVER_ANNOUNCEs sent.",
            self.announces_sent,
        );
        counter(
            "pool_elements_adopted_total",
            "PEs taken over that answered the H=1 keep-alive (adopted this registrar).",
            self.adopted,
        );
        counter(
            "dropped_answers_total",
            "Answers dropped because too many waited for room in the transport.",
            self.dropped_answers,
        );
        let _ = writeln!(
            out,
            "# HELP rserpool_registrar_registration_rejects_total Registrations refused, by error cause."
        );
        let _ = writeln!(
            out,
            "# TYPE rserpool_registrar_registration_rejects_total counter"
        );
        for (code, n) in self.registration_rejects.iter().enumerate() {
            let label = if code == 11 {
                "other".to_string()
            } else {
                format!("0x{code:x}")
            };
            let _ = writeln!(
                out,
                "rserpool_registrar_registration_rejects_total{{cause=\"{label}\"}} {n}"
            );
        }
        let _ = writeln!(
            out,
            "# HELP rserpool_registrar_removals_total PEs removed, by cause."
        );
        let _ = writeln!(out, "# TYPE rserpool_registrar_removals_total counter");
        for cause in RemovalCause::ALL {
            let _ = writeln!(
                out,
                "rserpool_registrar_removals_total{{cause=\"{}\"}} {}",
                cause.label(),
                self.removals_by(cause)
            );
        }
        let _ = writeln!(
            out,
            "# HELP rserpool_registrar_rate_limited_total Requests refused by a per-client rate limit."
        );
        let _ = writeln!(out, "# TYPE rserpool_registrar_rate_limited_total counter");
        for (what, label) in [
            (RateLimited::HandleResolution, "handle_resolution"),
            (RateLimited::EndpointUnreachable, "endpoint_unreachable"),
        ] {
            let _ = writeln!(
                out,
                "rserpool_registrar_rate_limited_total{{request=\"{label}\"}} {}",
                self.rate_limited_by(what)
            );
        }
        for (name, help, value) in [
            ("pools", "Pools in the handlespace.", self.pools),
            (
                "pool_elements",
                "PEs in the handlespace.",
                self.pool_elements,
            ),
            ("associations", "Associations now open.", self.associations),
            (
                "held_answers",
                "Answers waiting for room in the transport.",
                self.held_answers,
            ),
        ] {
            let _ = writeln!(out, "# HELP rserpool_registrar_{name} {help}");
            let _ = writeln!(out, "# TYPE rserpool_registrar_{name} gauge");
            let _ = writeln!(out, "rserpool_registrar_{name} {value}");
        }
        if let Some(enrp) = &self.enrp {
            enrp.render_prometheus(&mut out);
        }
        out
    }
}
