//! The registrar's counters, kept by the core and rendered in the Prometheus text format.
//!
//! Each fact is its own counter: a registration is not a keep-alive answer, a handle resolution
//! that selected PEs says nothing about whether a PU reached them.

use crate::access::AccessRefusal;
use rserpool_observe::{Kind, MetricSet};

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
    /// ASAP_REGISTRATION (`--max-registration-rate`).
    Registration,
    /// ASAP_HANDLE_RESOLUTION, all associations of one address together
    /// (`--max-hr-rate-per-address`).
    HandleResolutionPerAddress,
}

/// Why a request was refused to protect PEs or the registrar (RFC 5355), beside the rate
/// limits ([`RateLimited`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SecurityRefusal {
    /// ASAP_DEREGISTRATION of a PE that another association registered.
    ForeignDeregistration,
    /// ASAP_REGISTRATION of a PE identifier that another association owns, whose owner
    /// answered the ownership probe.
    ForeignRegistration,
    /// A claim on a PE while [`crate::RegistrarConfig::max_pending_claims`] already wait.
    PendingClaims,
    /// An association past [`crate::RegistrarConfig::max_associations_per_address`].
    AssociationsPerAddress,
    /// A new PE past [`crate::RegistrarConfig::max_pool_elements_per_association`].
    PoolElementsPerAssociation,
}

impl SecurityRefusal {
    /// All reasons, in the order metrics list them.
    pub const ALL: [SecurityRefusal; 5] = [
        SecurityRefusal::ForeignDeregistration,
        SecurityRefusal::ForeignRegistration,
        SecurityRefusal::PendingClaims,
        SecurityRefusal::AssociationsPerAddress,
        SecurityRefusal::PoolElementsPerAssociation,
    ];

    /// Label value, e.g. `foreign_deregistration`.
    pub fn label(self) -> &'static str {
        match self {
            SecurityRefusal::ForeignDeregistration => "foreign_deregistration",
            SecurityRefusal::ForeignRegistration => "foreign_registration",
            SecurityRefusal::PendingClaims => "pending_claims",
            SecurityRefusal::AssociationsPerAddress => "associations_per_address",
            SecurityRefusal::PoolElementsPerAssociation => "pool_elements_per_association",
        }
    }
}

impl std::fmt::Display for SecurityRefusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            SecurityRefusal::ForeignDeregistration => {
                "deregistration of a PE registered over another association"
            }
            SecurityRefusal::ForeignRegistration => {
                "registration of a PE identifier owned by another association that answered the probe"
            }
            SecurityRefusal::PendingClaims => "too many claims wait for the ownership probe",
            SecurityRefusal::AssociationsPerAddress => "too many associations from this address",
            SecurityRefusal::PoolElementsPerAssociation => {
                "too many PEs registered over this association"
            }
        })
    }
}

/// Counters (monotonic) and gauges (current values) of a registrar.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Metrics {
    /// The registrar's identifier (rendered as `rserpool_registrar_info{id="$…"}`, so that a
    /// monitor can tell registrars apart).
    pub registrar_id: rserpool_wire::RegistrarId,
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
    /// Requests refused by a per-client rate limit: handle resolutions, unreachable reports,
    /// registrations.
    pub rate_limited: [u64; 4],
    /// Requests and associations refused for security (see [`SecurityRefusal::ALL`]).
    pub security_refusals: [u64; 5],
    /// Keep-alives sent to a PE's owner because another association claimed the PE.
    pub ownership_probes: u64,
    /// Claims granted because the owner association was gone or failed the probe.
    pub claims_granted: u64,
    /// Keep-alives sent to a PE because pool users reported it unreachable.
    pub unreachable_probes: u64,
    /// Probes that reports would have triggered but the per-PE probe budget did not allow.
    pub unreachable_probes_suppressed: u64,
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
    /// Requests refused by the identity rules, by refusal (see [`AccessRefusal::ALL`] for the
    /// order).
    pub access_refusals: [u64; 5],
    /// TLS handshakes completed (kept by the driver from the transport).
    pub tls_handshakes: u64,
    /// TLS handshakes that failed: missing, untrusted or invalid certificate, protocol error
    /// (kept by the driver from the transport).
    pub tls_handshake_failures: u64,
    /// TLS handshakes that did not finish within the handshake timeout (kept by the driver).
    pub tls_handshake_timeouts: u64,
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

    pub(crate) fn refused(&mut self, why: SecurityRefusal) {
        self.security_refusals[why as usize] += 1;
    }

    /// Refusals for the given reason so far.
    pub fn refusals_by(&self, why: SecurityRefusal) -> u64 {
        self.security_refusals[why as usize]
    }

    /// Takes the transport's TLS counters.
    #[cfg(feature = "runtime")]
    pub(crate) fn set_transport(&mut self, s: &rserpool_transport::EndpointStats) {
        self.tls_handshakes = s.tls_handshakes;
        self.tls_handshake_failures = s.tls_handshake_failures;
        self.tls_handshake_timeouts = s.tls_handshake_timeouts;
    }

    pub(crate) fn access_refused(&mut self, refusal: AccessRefusal) {
        self.access_refusals[refusal as usize] += 1;
    }

    /// Requests refused by the identity rules for the given reason so far.
    pub fn access_refused_by(&self, refusal: AccessRefusal) -> u64 {
        self.access_refusals[refusal as usize]
    }

    /// Removals with the given cause so far.
    pub fn removals_by(&self, cause: RemovalCause) -> u64 {
        self.removals[cause as usize]
    }

    /// Requests refused by the given rate limit so far.
    pub fn rate_limited_by(&self, what: RateLimited) -> u64 {
        self.rate_limited[what as usize]
    }

    /// The metrics in the OpenMetrics text format, as `prometheus-client` encodes them.
    pub fn render_prometheus(&self) -> String {
        self.metric_set().render()
    }

    /// The metrics as of now, for the HTTP endpoint (`rserpool_registrar_…`).
    pub fn metric_set(&self) -> MetricSet {
        let mut m = MetricSet::new();
        m.family(
            "rserpool_registrar_info",
            Kind::Gauge,
            "The registrar's identifier.",
        )
        .sample(&[("id", &self.registrar_id.to_string())], 1);
        let mut counter = |name: &str, help: &str, value: u64| {
            m.counter(&format!("rserpool_registrar_{name}"), help, value);
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
            "ownership_probes_total",
            "Keep-alives sent to a PE's owner because another association claimed the PE.",
            self.ownership_probes,
        );
        counter(
            "claims_granted_total",
            "Claims on a PE granted because its owner was gone or failed the probe.",
            self.claims_granted,
        );
        counter(
            "unreachable_probes_total",
            "Keep-alives sent to a PE because pool users reported it unreachable.",
            self.unreachable_probes,
        );
        counter(
            "unreachable_probes_suppressed_total",
            "Probes reports would have triggered beyond the per-PE probe budget.",
            self.unreachable_probes_suppressed,
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
        counter(
            "tls_handshakes_total",
            "TLS handshakes completed.",
            self.tls_handshakes,
        );
        counter(
            "tls_handshake_failures_total",
            "TLS handshakes that failed (missing, untrusted or invalid certificate, protocol error).",
            self.tls_handshake_failures,
        );
        counter(
            "tls_handshake_timeouts_total",
            "TLS handshakes that did not finish within the handshake timeout.",
            self.tls_handshake_timeouts,
        );
        let mut f = m.family(
            "rserpool_registrar_access_refused_total",
            Kind::Counter,
            "Requests refused by the TLS identity rules, by reason.",
        );
        for refusal in AccessRefusal::ALL {
            f.sample(
                &[("reason", refusal.label())],
                self.access_refused_by(refusal),
            );
        }
        let mut f = m.family(
            "rserpool_registrar_registration_rejects_total",
            Kind::Counter,
            "Registrations refused, by error cause.",
        );
        for (code, n) in self.registration_rejects.iter().enumerate() {
            let label = if code == 11 {
                "other".to_string()
            } else {
                format!("0x{code:x}")
            };
            f.sample(&[("cause", &label)], *n);
        }
        let mut f = m.family(
            "rserpool_registrar_removals_total",
            Kind::Counter,
            "PEs removed, by cause.",
        );
        for cause in RemovalCause::ALL {
            f.sample(&[("cause", cause.label())], self.removals_by(cause));
        }
        let mut f = m.family(
            "rserpool_registrar_rate_limited_total",
            Kind::Counter,
            "Requests refused by a per-client rate limit.",
        );
        for (what, label) in [
            (RateLimited::HandleResolution, "handle_resolution"),
            (RateLimited::EndpointUnreachable, "endpoint_unreachable"),
            (RateLimited::Registration, "registration"),
            (
                RateLimited::HandleResolutionPerAddress,
                "handle_resolution_per_address",
            ),
        ] {
            f.sample(&[("request", label)], self.rate_limited_by(what));
        }
        let mut f = m.family(
            "rserpool_registrar_security_refusals_total",
            Kind::Counter,
            "Requests and associations refused to protect PEs or the registrar, by reason.",
        );
        for why in SecurityRefusal::ALL {
            f.sample(&[("reason", why.label())], self.refusals_by(why));
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
            m.gauge(&format!("rserpool_registrar_{name}"), help, value);
        }
        if let Some(enrp) = &self.enrp {
            enrp.encode(&mut m);
        }
        m
    }
}
