//! The core's counters as metrics (`rserpool_lsnat_…`): one family per receipt, never merged.
//! Encoded by `prometheus-client` through [`rserpool_observe::MetricSet`].

use super::receipt::Outcome;
use super::Gateway;
use rserpool_observe::{Kind, MetricSet};

impl Gateway {
    /// The metrics in the OpenMetrics text format (what `/metrics` serves).
    pub fn render_metrics(&self) -> String {
        self.metric_set().render()
    }

    /// The metrics as of now.
    pub fn metric_set(&self) -> MetricSet {
        let mut m = MetricSet::new();
        let c = &self.counters;
        m.counter(
            "rserpool_lsnat_sessions_opened_total",
            "First packets of sessions seen (bound or refused).",
            c.opened,
        );
        m.gauge(
            "rserpool_lsnat_sessions_active",
            "Sessions bound now.",
            self.active as u64,
        );
        m.gauge(
            "rserpool_lsnat_bindings_lingering",
            "Reset bindings lingering (RFC 7857).",
            self.lingering as u64,
        );
        let mut f = m.family(
            "rserpool_lsnat_refused_total",
            Kind::Counter,
            "Sessions refused before binding, by reason.",
        );
        for r in [
            "max_sessions",
            "member_limit",
            "no_member",
            "policy_unavailable",
        ] {
            f.sample(&[("reason", r)], c.refused.get(r).copied().unwrap_or(0));
        }
        let mut f = m.family(
            "rserpool_lsnat_outcomes_total",
            Kind::Counter,
            "Sessions ended, by outcome.",
        );
        for (i, n) in Outcome::NAMES.iter().enumerate() {
            f.sample(&[("outcome", n)], c.outcomes[i]);
        }
        m.counter(
            "rserpool_lsnat_persistence_hits_total",
            "Selections made by persistence.",
            c.persistence_hits,
        );
        m.counter(
            "rserpool_lsnat_persistence_full_total",
            "Clients not remembered because the persistence table was full.",
            c.persistence_full,
        );
        m.gauge(
            "rserpool_lsnat_persistence_entries",
            "Persistence entries.",
            self.persistence.len() as u64,
        );
        m.counter(
            "rserpool_lsnat_panic_selections_total",
            "Selections that ignored health because too few members were live.",
            c.panic_selections,
        );
        m.counter(
            "rserpool_lsnat_slow_start_skips_total",
            "Times a member on probation was held back by slow start.",
            c.slow_start_skips,
        );
        m.counter(
            "rserpool_lsnat_connect_rebinds_total",
            "Sessions rebound to another member after a failed connect.",
            c.connect_retries,
        );
        m.counter(
            "rserpool_lsnat_linger_released_total",
            "Lingering reset bindings released.",
            c.linger_released,
        );
        m.counter(
            "rserpool_lsnat_linger_skipped_total",
            "Reset bindings released at once because max_lingering was reached.",
            c.linger_skipped,
        );
        m.family(
            "rserpool_lsnat_bytes_total",
            Kind::Counter,
            "Bytes relayed, by direction.",
        )
        .sample(&[("direction", "to_member")], c.bytes_to_member)
        .sample(&[("direction", "to_client")], c.bytes_to_client);

        let members: Vec<_> = self.members.values().collect();
        let mut per = |name: &str, kind: Kind, help: &str, f: &dyn Fn(&super::Member) -> u64| {
            let mut fam = m.family(name, kind, help);
            for x in &members {
                fam.sample(&[("member", &x.spec.key)], f(x));
            }
        };
        per(
            "rserpool_lsnat_member_selected_total",
            Kind::Counter,
            "Selection receipts: the policy or persistence chose this member.",
            &|m| m.counters.selected,
        );
        per(
            "rserpool_lsnat_member_bound_total",
            Kind::Counter,
            "Binding receipts: a session was bound to this member.",
            &|m| m.counters.bound,
        );
        per(
            "rserpool_lsnat_member_connected_total",
            Kind::Counter,
            "The member accepted a relay connection.",
            &|m| m.counters.connected,
        );
        per(
            "rserpool_lsnat_member_reached_total",
            Kind::Counter,
            "Reached receipts: the member's first byte or datagram of a session came back.",
            &|m| m.counters.reached,
        );
        per(
            "rserpool_lsnat_member_sessions",
            Kind::Gauge,
            "Sessions bound to the member now.",
            &|m| u64::from(m.sessions),
        );
        per(
            "rserpool_lsnat_member_weight",
            Kind::Gauge,
            "Configured weight (0 = draining).",
            &|m| u64::from(m.spec.weight),
        );
        per(
            "rserpool_lsnat_member_bytes_to_member_total",
            Kind::Counter,
            "Bytes relayed to the member.",
            &|m| m.counters.bytes_to_member,
        );
        per(
            "rserpool_lsnat_member_bytes_to_client_total",
            Kind::Counter,
            "Bytes relayed from the member.",
            &|m| m.counters.bytes_to_client,
        );
        let mut f = m.family(
            "rserpool_lsnat_member_outcomes_total",
            Kind::Counter,
            "Outcome receipts of the member's sessions.",
        );
        for x in &members {
            for (i, n) in Outcome::NAMES.iter().enumerate() {
                if n == &"refused" {
                    continue;
                }
                f.sample(
                    &[("member", &x.spec.key), ("outcome", n)],
                    x.counters.outcomes[i],
                );
            }
        }
        let mut f = m.family(
            "rserpool_lsnat_member_health",
            Kind::Gauge,
            "1 for the member's current liveness state.",
        );
        for x in &members {
            for st in ["alive", "suspect", "dead", "probation"] {
                let v = u64::from(x.liveness.health.name() == st);
                f.sample(&[("member", &x.spec.key), ("state", st)], v);
            }
        }
        let mut f = m.family(
            "rserpool_lsnat_member_evidence_total",
            Kind::Counter,
            "Liveness evidence observed, by kind.",
        );
        for x in &members {
            for (k, v) in &x.counters.evidence {
                f.sample(&[("member", &x.spec.key), ("kind", k)], *v);
            }
        }
        let mut f = m.family(
            "rserpool_lsnat_member_transitions_total",
            Kind::Counter,
            "Liveness transitions, by state entered.",
        );
        for x in &members {
            for (k, v) in &x.counters.transitions {
                f.sample(&[("member", &x.spec.key), ("to", k)], *v);
            }
        }
        m
    }
}
