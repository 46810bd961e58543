//! The gateway's HTTP endpoint (`--metrics ADDR`) on the shared `rserpool-observe` server:
//! `GET /metrics` (the core's and the NAT data plane's counters), `GET /status` (the core's
//! status document: members, sessions with their receipts) and `GET /healthz`.

use super::Shared;
use std::sync::Arc;
use tokio::net::TcpListener;
use tokio::sync::watch;

/// Serves the endpoint until `stop` turns true.
pub(crate) async fn serve(shared: Arc<Shared>, l: TcpListener, mut stop: watch::Receiver<bool>) {
    let limits = shared.config.http_limits;
    let (m, s) = (shared.clone(), shared);
    rserpool_observe::server::Endpoint::new("lsnat", move || m.lock().metric_set().render())
        .status(move || {
            let now = s.now();
            let status = s.lock().core.status(now);
            serde_json::to_value(&status)
                .unwrap_or_else(|e| serde_json::json!({ "error": e.to_string() }))
        })
        .limits(limits)
        .serve(l, async move {
            let _ = stop.changed().await;
        })
        .await;
}
