//! Prometheus text exposition of the core's counters: one family per receipt, never merged.

use super::receipt::Outcome;
use super::Gateway;
use std::fmt::Write;

fn esc(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

fn family(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

impl Gateway {
    /// The metrics in Prometheus text format (version 0.0.4).
    pub fn render_metrics(&self) -> String {
        let mut o = String::with_capacity(4096);
        let c = &self.counters;
        family(
            &mut o,
            "rserpool_lsnat_sessions_opened_total",
            "counter",
            "First packets of sessions seen (bound or refused).",
        );
        let _ = writeln!(o, "rserpool_lsnat_sessions_opened_total {}", c.opened);
        family(
            &mut o,
            "rserpool_lsnat_sessions_active",
            "gauge",
            "Sessions bound now.",
        );
        let _ = writeln!(o, "rserpool_lsnat_sessions_active {}", self.active);
        family(
            &mut o,
            "rserpool_lsnat_bindings_lingering",
            "gauge",
            "Reset bindings lingering (RFC 7857).",
        );
        let _ = writeln!(o, "rserpool_lsnat_bindings_lingering {}", self.lingering);
        family(
            &mut o,
            "rserpool_lsnat_refused_total",
            "counter",
            "Sessions refused before binding, by reason.",
        );
        for r in [
            "max_sessions",
            "member_limit",
            "no_member",
            "policy_unavailable",
        ] {
            let v = c.refused.get(r).copied().unwrap_or(0);
            let _ = writeln!(o, "rserpool_lsnat_refused_total{{reason=\"{r}\"}} {v}");
        }
        family(
            &mut o,
            "rserpool_lsnat_outcomes_total",
            "counter",
            "Sessions ended, by outcome.",
        );
        for (i, n) in Outcome::NAMES.iter().enumerate() {
            let _ = writeln!(
                o,
                "rserpool_lsnat_outcomes_total{{outcome=\"{n}\"}} {}",
                c.outcomes[i]
            );
        }
        family(
            &mut o,
            "rserpool_lsnat_persistence_hits_total",
            "counter",
            "Selections made by persistence.",
        );
        let _ = writeln!(
            o,
            "rserpool_lsnat_persistence_hits_total {}",
            c.persistence_hits
        );
        family(
            &mut o,
            "rserpool_lsnat_persistence_full_total",
            "counter",
            "Clients not remembered because the persistence table was full.",
        );
        let _ = writeln!(
            o,
            "rserpool_lsnat_persistence_full_total {}",
            c.persistence_full
        );
        family(
            &mut o,
            "rserpool_lsnat_persistence_entries",
            "gauge",
            "Persistence entries.",
        );
        let _ = writeln!(
            o,
            "rserpool_lsnat_persistence_entries {}",
            self.persistence.len()
        );
        family(
            &mut o,
            "rserpool_lsnat_panic_selections_total",
            "counter",
            "Selections that ignored health because too few members were live.",
        );
        let _ = writeln!(
            o,
            "rserpool_lsnat_panic_selections_total {}",
            c.panic_selections
        );
        family(
            &mut o,
            "rserpool_lsnat_slow_start_skips_total",
            "counter",
            "Times a member on probation was held back by slow start.",
        );
        let _ = writeln!(
            o,
            "rserpool_lsnat_slow_start_skips_total {}",
            c.slow_start_skips
        );
        family(
            &mut o,
            "rserpool_lsnat_connect_rebinds_total",
            "counter",
            "Sessions rebound to another member after a failed connect.",
        );
        let _ = writeln!(
            o,
            "rserpool_lsnat_connect_rebinds_total {}",
            c.connect_retries
        );
        family(
            &mut o,
            "rserpool_lsnat_linger_released_total",
            "counter",
            "Lingering reset bindings released.",
        );
        let _ = writeln!(
            o,
            "rserpool_lsnat_linger_released_total {}",
            c.linger_released
        );
        family(
            &mut o,
            "rserpool_lsnat_linger_skipped_total",
            "counter",
            "Reset bindings released at once because max_lingering was reached.",
        );
        let _ = writeln!(
            o,
            "rserpool_lsnat_linger_skipped_total {}",
            c.linger_skipped
        );
        family(
            &mut o,
            "rserpool_lsnat_bytes_total",
            "counter",
            "Bytes relayed, by direction.",
        );
        let _ = writeln!(
            o,
            "rserpool_lsnat_bytes_total{{direction=\"to_member\"}} {}",
            c.bytes_to_member
        );
        let _ = writeln!(
            o,
            "rserpool_lsnat_bytes_total{{direction=\"to_client\"}} {}",
            c.bytes_to_client
        );

        let members: Vec<_> = self.members.values().collect();
        let per = |o: &mut String,
                   name: &str,
                   kind: &str,
                   help: &str,
                   f: &dyn Fn(&super::Member) -> u64| {
            family(o, name, kind, help);
            for m in &members {
                let _ = writeln!(o, "{name}{{member=\"{}\"}} {}", esc(&m.spec.key), f(m));
            }
        };
        per(
            &mut o,
            "rserpool_lsnat_member_selected_total",
            "counter",
            "Selection receipts: the policy or persistence chose this member.",
            &|m| m.counters.selected,
        );
        per(
            &mut o,
            "rserpool_lsnat_member_bound_total",
            "counter",
            "Binding receipts: a session was bound to this member.",
            &|m| m.counters.bound,
        );
        per(
            &mut o,
            "rserpool_lsnat_member_connected_total",
            "counter",
            "The member accepted a relay connection.",
            &|m| m.counters.connected,
        );
        per(
            &mut o,
            "rserpool_lsnat_member_reached_total",
            "counter",
            "Reached receipts: the member's first byte or datagram of a session came back.",
            &|m| m.counters.reached,
        );
        per(
            &mut o,
            "rserpool_lsnat_member_sessions",
            "gauge",
            "Sessions bound to the member now.",
            &|m| u64::from(m.sessions),
        );
        per(
            &mut o,
            "rserpool_lsnat_member_weight",
            "gauge",
            "Configured weight (0 = draining).",
            &|m| u64::from(m.spec.weight),
        );
        per(
            &mut o,
            "rserpool_lsnat_member_bytes_to_member_total",
            "counter",
            "Bytes relayed to the member.",
            &|m| m.counters.bytes_to_member,
        );
        per(
            &mut o,
            "rserpool_lsnat_member_bytes_to_client_total",
            "counter",
            "Bytes relayed from the member.",
            &|m| m.counters.bytes_to_client,
        );
        family(
            &mut o,
            "rserpool_lsnat_member_outcomes_total",
            "counter",
            "Outcome receipts of the member's sessions.",
        );
        for m in &members {
            for (i, n) in Outcome::NAMES.iter().enumerate() {
                if n == &"refused" {
                    continue;
                }
                let _ = writeln!(
                    o,
                    "rserpool_lsnat_member_outcomes_total{{member=\"{}\",outcome=\"{n}\"}} {}",
                    esc(&m.spec.key),
                    m.counters.outcomes[i]
                );
            }
        }
        family(
            &mut o,
            "rserpool_lsnat_member_health",
            "gauge",
            "1 for the member's current liveness state.",
        );
        for m in &members {
            for st in ["alive", "suspect", "dead", "probation"] {
                let v = u8::from(m.liveness.health.name() == st);
                let _ = writeln!(
                    o,
                    "rserpool_lsnat_member_health{{member=\"{}\",state=\"{st}\"}} {v}",
                    esc(&m.spec.key)
                );
            }
        }
        family(
            &mut o,
            "rserpool_lsnat_member_evidence_total",
            "counter",
            "Liveness evidence observed, by kind.",
        );
        for m in &members {
            for (k, v) in &m.counters.evidence {
                let _ = writeln!(
                    o,
                    "rserpool_lsnat_member_evidence_total{{member=\"{}\",kind=\"{k}\"}} {v}",
                    esc(&m.spec.key)
                );
            }
        }
        family(
            &mut o,
            "rserpool_lsnat_member_transitions_total",
            "counter",
            "Liveness transitions, by state entered.",
        );
        for m in &members {
            for (k, v) in &m.counters.transitions {
                let _ = writeln!(
                    o,
                    "rserpool_lsnat_member_transitions_total{{member=\"{}\",to=\"{k}\"}} {v}",
                    esc(&m.spec.key)
                );
            }
        }
        o
    }
}
