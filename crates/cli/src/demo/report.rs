//! The demo's verdict and summary: a gateway session's receipts in words, the comparison of
//! what the gateway's client saw with what the gateway recorded, and the summary table.

use super::display::Out;
use super::users::{ClientEnd, GatewaySession, Loads, PoolUserResult};
use super::{ms, pct};
use rserpool_wire::PoolElementId;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::Duration;

pub(super) fn print_gateway_receipt(
    out: &Out,
    what: &str,
    r: &rserpool_lsnat::core::receipt::Receipt,
    loads: &Loads,
) {
    let sel = r.selected.last();
    let load_of = |key: &str| {
        loads
            .iter()
            .find(|(id, _)| format!("pe:{id}") == key)
            .map(|(_, p)| pct(p))
            .unwrap_or_else(|| "-".into())
    };
    let cands = sel
        .map(|s| {
            s.candidates
                .iter()
                .map(|c| format!("{} load {} {} sessions", c.key, load_of(&c.key), c.sessions))
                .collect::<Vec<_>>()
                .join(", ")
        })
        .unwrap_or_default();
    out.fact(format!(
        "{what} {} from {}: selected {} by policy {} from [{cands}]; bound to {}; reached at {} ms; \
         {} bytes to the member, {} to the client; outcome {}",
        r.session,
        r.client,
        sel.and_then(|s| s.candidates.iter().find(|c| c.member == s.member))
            .map(|c| c.key.to_string())
            .unwrap_or_else(|| "-".into()),
        sel.map(|s| s.by).unwrap_or("-"),
        r.bound
            .as_ref()
            .map(|b| format!("{} at {}", b.key, b.address))
            .unwrap_or_else(|| "nothing".into()),
        r.reached_ms
            .map(|t| t.saturating_sub(r.opened_ms).to_string())
            .unwrap_or_else(|| "-".into()),
        r.bytes_to_member,
        r.bytes_to_client,
        r.outcome
            .as_ref()
            .map(|o| o.to_string())
            .unwrap_or_else(|| "open".into()),
    ));
}

#[derive(Default)]
pub(super) struct GatewayReport {
    pings: u64,
    pongs: u64,
    sessions: usize,
    complete: usize,
    lost: usize,
    failed: usize,
    outcomes: HashMap<&'static str, usize>,
}

/// Compares what the gateway's client saw with the gateway's receipt of each session.
pub(super) fn check_gateway(
    out: &Out,
    sessions: &[GatewaySession],
    receipts: &HashMap<SocketAddr, rserpool_lsnat::core::receipt::Receipt>,
    victim_key: &str,
    problems: &mut Vec<String>,
) -> GatewayReport {
    let mut rep = GatewayReport {
        sessions: sessions.len(),
        ..GatewayReport::default()
    };
    for s in sessions {
        rep.pings += s.pings;
        rep.pongs += s.pongs;
        let receipt = receipts.get(&s.client);
        let outcome = receipt.and_then(|r| r.outcome.as_ref());
        if let Some(o) = outcome {
            *rep.outcomes.entry(o.name()).or_insert(0) += 1;
        }
        let key = receipt
            .and_then(|r| r.bound.as_ref())
            .map(|b| b.key.to_string())
            .unwrap_or_default();
        match &s.end {
            ClientEnd::Complete => {
                rep.complete += 1;
                if outcome.map(|o| o.name()) != Some("closed") {
                    problems.push(format!(
                        "gateway session from {}: the client got all {} Pongs, the gateway recorded {}",
                        s.client,
                        s.pongs,
                        outcome.map(|o| o.to_string()).unwrap_or_else(|| "no outcome".into())
                    ));
                }
            }
            ClientEnd::AnswerLost { seen } => {
                rep.lost += 1;
                let name = outcome.map(|o| o.name());
                out.fact(format!(
                    "gateway session from {} bound to {key}: {}/{} Pongs, then {seen}; the gateway's \
                     receipt: outcome {}",
                    s.client,
                    s.pongs,
                    s.pings,
                    outcome.map(|o| o.to_string()).unwrap_or_else(|| "none".into())
                ));
                if !matches!(name, Some("member_lost") | Some("reset")) {
                    problems.push(format!(
                        "gateway session from {}: the client lost its answers, the gateway recorded {}",
                        s.client,
                        outcome.map(|o| o.to_string()).unwrap_or_else(|| "no outcome".into())
                    ));
                }
                if key != victim_key {
                    problems.push(format!(
                        "gateway session from {} lost its member {key}, which did not crash",
                        s.client
                    ));
                }
            }
            ClientEnd::Failed(e) => {
                rep.failed += 1;
                problems.push(format!("gateway session: the client could not run: {e}"));
            }
        }
    }
    if rep.lost == 0 {
        problems.push(format!(
            "no gateway session was bound to {victim_key} when it crashed (nothing to compare)"
        ));
    }
    rep
}

pub(super) fn summary(
    out: &Out,
    pus: &[PoolUserResult],
    gw: &GatewayReport,
    takeover: Option<Duration>,
    rehomed: &[(PoolElementId, Duration)],
    orphans: usize,
) {
    out.line("\nSUMMARY");
    out.line(format!(
        "  {:<22} {:>6} {:>9} {:>15} {:>7} {:>11} {:>5}",
        "", "sent", "answered", "answered twice", "resent", "failed over", "lost"
    ));
    let (mut s, mut a, mut d, mut r, mut f, mut l) = (0, 0, 0, 0, 0, 0);
    for p in pus {
        out.line(format!(
            "  {:<22} {:>6} {:>9} {:>15} {:>7} {:>11} {:>5}",
            format!("{} (PingPong)", p.name),
            p.sent,
            p.answered,
            p.answered_twice,
            p.resent,
            p.failovers.len(),
            p.sent.saturating_sub(p.answered)
        ));
        s += p.sent;
        a += p.answered;
        d += p.answered_twice;
        r += p.resent;
        f += p.failovers.len();
        l += p.sent.saturating_sub(p.answered);
    }
    out.line(format!(
        "  {:<22} {:>6} {:>9} {:>15} {:>7} {:>11} {:>5}",
        "requests, all PUs", s, a, d, r, f, l
    ));
    out.line(format!(
        "  {:<22} {:>6} {:>9} {:>15} {:>7} {:>11} {:>5}",
        "gateway client",
        gw.pings,
        gw.pongs,
        "-",
        "-",
        "-",
        gw.pings.saturating_sub(gw.pongs)
    ));
    let mut outcomes: Vec<String> = gw
        .outcomes
        .iter()
        .map(|(k, v)| format!("{k} {v}"))
        .collect();
    outcomes.sort();
    out.line(format!(
        "  gateway sessions       {} ({} complete, {} lost their member and could not go on: \
         a bound TCP session cannot move, RFC 2391; {} could not run); gateway outcomes: {}",
        gw.sessions,
        gw.complete,
        gw.lost,
        gw.failed,
        outcomes.join(", ")
    ));
    let failovers: Vec<String> = pus
        .iter()
        .flat_map(|p| {
            p.failovers.iter().map(move |fo| {
                format!(
                    "{} {} → new association, {} → first Pong",
                    p.name,
                    ms(fo.record.completed.saturating_sub(fo.record.started)),
                    fo.to_first_pong.map(ms).unwrap_or_else(|| "-".into())
                )
            })
        })
        .collect();
    out.line(format!(
        "  failover times         {}",
        if failovers.is_empty() {
            "none".to_string()
        } else {
            format!(
                "{} (from the loss; the first Pong waits for the next Ping, every 200 ms)",
                failovers.join("; ")
            )
        }
    ));
    out.line(format!(
        "  takeover time          {}",
        match takeover {
            Some(t) => format!(
                "{} from the registrar's crash to the takeover; {}/{} PE(s) re-homed{}",
                ms(t),
                rehomed.len(),
                orphans,
                rehomed
                    .iter()
                    .map(|(_, t)| *t)
                    .max()
                    .map(|m| format!(", the last {} after the crash", ms(m)))
                    .unwrap_or_default()
            ),
            None => "no takeover".to_string(),
        }
    ));
}
