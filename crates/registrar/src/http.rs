//! The registrar's HTTP endpoint (`--metrics ADDR`), on the shared `rserpool-observe` server:
//! `/metrics` from the counters the event loop publishes after every step, `/status` and
//! `/healthz` answered by the event loop itself (so a stuck loop shows as failing health).

use crate::core::Registrar;
use crate::enrp::metrics::EnrpMetrics;
use crate::metrics::{Metrics, RemovalCause};
use rserpool_observe::server::{Endpoint, Health};
use serde_json::{json, Value};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};

/// How long `/status` and `/healthz` wait for the event loop before saying it is stuck.
const LOOP_ANSWER: Duration = Duration::from_secs(2);

/// A request to the event loop for the status document.
pub(crate) type StatusRequest = oneshot::Sender<Value>;

/// The endpoint: metrics from `metrics` (with the transport's TLS counters read at the scrape),
/// status and health from the event loop over `requests`.
pub(crate) fn endpoint(
    metrics: Arc<Mutex<Metrics>>,
    transport: rserpool_transport::EndpointHandle,
    requests: mpsc::Sender<StatusRequest>,
) -> Endpoint {
    let ask = move |requests: mpsc::Sender<StatusRequest>| async move {
        let (tx, rx) = oneshot::channel();
        // A full queue means the loop has not taken the last requests: stuck or very busy.
        requests
            .try_send(tx)
            .map_err(|_| "the event loop has status requests waiting")?;
        match tokio::time::timeout(LOOP_ANSWER, rx).await {
            Ok(Ok(doc)) => Ok(doc),
            Ok(Err(_)) => Err("the event loop has stopped"),
            Err(_) => Err("the event loop did not answer within 2s"),
        }
    };
    let (status_requests, health_requests) = (requests.clone(), requests);
    Endpoint::new("registrar", move || {
        let mut m = metrics.lock().map(|m| m.clone()).unwrap_or_default();
        // The transport's counters (TLS handshakes) as of now: a refused handshake wakes no
        // registrar event that would copy them.
        m.set_transport(&transport.stats());
        m.render_prometheus()
    })
    .status_async(move || {
        let requests = status_requests.clone();
        Box::pin(async move {
            ask(requests)
                .await
                .unwrap_or_else(|e| json!({ "component": "registrar", "error": e }))
        })
    })
    .health_async(move || {
        let requests = health_requests.clone();
        Box::pin(async move {
            match ask(requests).await {
                Ok(_) => Health::Ok,
                Err(e) => Health::Failing(e.into()),
            }
        })
    })
}

/// The `/status` document: who this registrar is, its peers, its pools (at most `max_pools`,
/// in handle order, with PE counts and checksums) and a summary of its counters. Its size is
/// bounded by `max_pools` and the ENRP peer limit, whatever the handlespace holds.
pub(crate) fn status_document(
    core: &Registrar,
    metrics: &Metrics,
    enrp: Option<&EnrpMetrics>,
    uptime: Duration,
    max_pools: usize,
) -> Value {
    let hs = core.handlespace();
    let flavor = hs.config().checksum_flavor;
    let pools: Vec<Value> = hs
        .pools()
        .take(max_pools)
        .map(|p| {
            let handle = p.handle();
            let checksum = rserpool_handlespace::compute_checksum(
                p.elements().map(|e| (handle, e.id())),
                flavor,
            );
            json!({
                "handle": handle.to_string(),
                "policy": p.policy_type().to_string(),
                "pool_elements": p.len(),
                "checksum": format!("0x{:04x}", checksum.0),
            })
        })
        .collect();
    let owners: Vec<Value> = hs
        .owners()
        .take(max_pools)
        .map(|o| {
            json!({
                "home": o.owner.to_string(),
                "pool_elements": o.elements,
                "checksum": format!("0x{:04x}", o.checksum.0),
            })
        })
        .collect();
    let peers: Vec<Value> = enrp
        .map(|e| {
            e.peer_status
                .iter()
                .map(|s| {
                    json!({
                        "id": s.id.to_string(),
                        "sync": s.sync,
                        "pool_elements": s.pool_elements,
                        "announced_checksum": format!("0x{:04x}", s.announced_checksum.0),
                        "held_checksum": format!("0x{:04x}", s.held_checksum.0),
                    })
                })
                .collect()
        })
        .unwrap_or_default();
    let removals: serde_json::Map<String, Value> = RemovalCause::ALL
        .iter()
        .map(|c| (c.label().to_string(), json!(metrics.removals_by(*c))))
        .collect();
    let mut doc = json!({
        "component": "registrar",
        "registrar_id": core.id().to_string(),
        "profile": core.config().profile.name(),
        "uptime_seconds": uptime.as_secs(),
        "pool_count": hs.pool_count(),
        "pool_element_count": hs.len(),
        "associations": metrics.associations,
        "pools": pools,
        "pools_omitted": hs.pool_count().saturating_sub(max_pools),
        "homes": owners,
        "enrp": enrp.is_some(),
        "peers": peers,
        "counters": {
            "registrations": metrics.registrations,
            "reregistrations": metrics.reregistrations,
            "deregistrations": metrics.deregistrations,
            "removals": removals,
            "handle_resolutions": metrics.resolutions,
            "handle_resolutions_unknown_pool": metrics.resolutions_unknown_pool,
            "keep_alives_sent": metrics.keep_alives_sent,
            "keep_alives_missed": metrics.keep_alives_missed,
            "unreachable_reports": metrics.unreachable_reports,
            "malformed_messages": metrics.malformed_messages,
            "errors_sent": metrics.errors_sent,
            "pool_elements_adopted": metrics.adopted,
            "dropped_answers": metrics.dropped_answers,
        },
    });
    if let (Some(e), Some(map)) = (enrp, doc.as_object_mut()) {
        map.insert("starting_up".into(), json!(e.starting_up));
        map.insert(
            "takeovers".into(),
            crate::enrp::metrics::TakeoverOutcome::ALL
                .iter()
                .map(|o| (o.label().to_string(), json!(e.takeovers_of(*o))))
                .collect::<serde_json::Map<_, _>>()
                .into(),
        );
        map.insert("peers_dead".into(), json!(e.peers_dead));
    }
    doc
}
