//! The HTTP endpoint of every daemon (`--metrics ADDR`): `GET /metrics` (OpenMetrics text),
//! `GET /healthz` (liveness) and `GET /status` (JSON), on hyper and axum.
//!
//! Every connection is bounded: the request head must arrive within
//! [`Limits::request_timeout`] and fit in [`Limits::max_request_bytes`], the whole exchange
//! must end within the same timeout, and at most [`Limits::max_connections`] are served at once
//! (further ones are closed at once). One request per connection, as Prometheus and the
//! monitor need no more; a slow or hostile client costs one connection slot for a few seconds
//! and never holds the daemon's state.

use crate::METRICS_CONTENT_TYPE;
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

/// A boxed future, for status and health answers that ask a daemon's event loop.
pub type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// The limits of the endpoint, the same for every daemon.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Time a client has to send its request and read the answer.
    pub request_timeout: Duration,
    /// Largest request head (request line and headers), in bytes; larger gets 431.
    pub max_request_bytes: usize,
    /// Connections served at once; further ones are closed without an answer.
    pub max_connections: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            request_timeout: Duration::from_secs(5),
            max_request_bytes: 8192,
            max_connections: 64,
        }
    }
}

/// Whether the daemon is alive, for `/healthz`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Health {
    /// Serving (200 "ok").
    Ok,
    /// Not serving, and why (503 with the reason).
    Failing(String),
}

type MetricsFn = Arc<dyn Fn() -> String + Send + Sync>;
type StatusFn = Arc<dyn Fn() -> BoxFuture<serde_json::Value> + Send + Sync>;
type HealthFn = Arc<dyn Fn() -> BoxFuture<Health> + Send + Sync>;

/// What one daemon serves: build it with its component name and the three answers, then
/// [`serve`](Self::serve) it on a listener from [`bind`].
#[derive(Clone)]
pub struct Endpoint {
    component: &'static str,
    metrics: MetricsFn,
    status: StatusFn,
    health: HealthFn,
    limits: Limits,
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Endpoint")
            .field("component", &self.component)
            .field("limits", &self.limits)
            .finish()
    }
}

impl Endpoint {
    /// An endpoint of `component` (`registrar`, `lsnat`, `pe`, `pu`) whose `/metrics` answer
    /// is `metrics()` (OpenMetrics text, e.g. [`crate::MetricSet::render`]); `/status` answers
    /// `{"component": …}` and `/healthz` "ok" until set otherwise.
    pub fn new(
        component: &'static str,
        metrics: impl Fn() -> String + Send + Sync + 'static,
    ) -> Self {
        Endpoint {
            component,
            metrics: Arc::new(metrics),
            status: Arc::new(move || {
                Box::pin(async move { serde_json::json!({ "component": component }) })
            }),
            health: Arc::new(|| Box::pin(async { Health::Ok })),
            limits: Limits::default(),
        }
    }

    /// The `/status` document, computed at each request. A `component` field naming the
    /// daemon is added where the document is an object without one.
    pub fn status(mut self, f: impl Fn() -> serde_json::Value + Send + Sync + 'static) -> Self {
        let f = Arc::new(f);
        self.status = Arc::new(move || {
            let f = f.clone();
            Box::pin(async move { f() })
        });
        self
    }

    /// The `/status` document from a future, for daemons whose state lives in an event loop
    /// that must be asked.
    pub fn status_async(
        mut self,
        f: impl Fn() -> BoxFuture<serde_json::Value> + Send + Sync + 'static,
    ) -> Self {
        self.status = Arc::new(f);
        self
    }

    /// The `/healthz` answer from a future.
    pub fn health_async(
        mut self,
        f: impl Fn() -> BoxFuture<Health> + Send + Sync + 'static,
    ) -> Self {
        self.health = Arc::new(f);
        self
    }

    /// Other limits than [`Limits::default`].
    pub fn limits(mut self, limits: Limits) -> Self {
        self.limits = limits;
        self
    }

    /// The router: `/metrics`, `/healthz`, `/status`, `/` (an index); anything else 404, other
    /// methods than GET and HEAD 405.
    pub fn router(&self) -> Router {
        Router::new()
            .route("/metrics", get(metrics))
            .route("/healthz", get(healthz))
            .route("/status", get(status))
            .route("/", get(index))
            .fallback(not_found)
            .with_state(self.clone())
    }

    /// Serves connections from `listener` until `shutdown` completes.
    pub async fn serve(self, listener: TcpListener, shutdown: impl Future<Output = ()> + Send) {
        let limits = self.limits;
        let slots = Arc::new(Semaphore::new(limits.max_connections.max(1)));
        let service = TowerToHyperService::new(self.router());
        let mut builder = hyper::server::conn::http1::Builder::new();
        builder
            .timer(TokioTimer::new())
            .header_read_timeout(limits.request_timeout)
            .max_buf_size(limits.max_request_bytes.max(8192))
            .keep_alive(false);
        let builder = Arc::new(builder);
        tokio::pin!(shutdown);
        loop {
            let (stream, peer) = tokio::select! {
                r = listener.accept() => match r {
                    Ok(x) => x,
                    Err(e) => {
                        // Out of descriptors, typically: wait a little rather than spin.
                        tracing::warn!(error = %e, component = self.component, "HTTP endpoint: accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                },
                _ = &mut shutdown => break,
            };
            let Ok(permit) = slots.clone().try_acquire_owned() else {
                tracing::debug!(%peer, "HTTP endpoint: connection limit reached, closing");
                drop(stream);
                continue;
            };
            let (service, builder) = (service.clone(), builder.clone());
            tokio::spawn(async move {
                let conn = builder.serve_connection(TokioIo::new(stream), service);
                match tokio::time::timeout(limits.request_timeout, conn).await {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => tracing::debug!(%peer, error = %e, "HTTP endpoint: connection"),
                    Err(_) => tracing::debug!(%peer, "HTTP endpoint: connection timed out"),
                }
                drop(permit);
            });
        }
    }

    /// Spawns [`serve`](Self::serve) on the current runtime; the task ends when the handle is
    /// dropped or `shutdown` completes.
    pub fn spawn(self, listener: TcpListener) -> ServerHandle {
        ServerHandle(tokio::spawn(self.serve(listener, std::future::pending())))
    }
}

/// A served endpoint; dropping it stops serving.
#[derive(Debug)]
pub struct ServerHandle(tokio::task::JoinHandle<()>);

impl Drop for ServerHandle {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The error of [`bind`]: the address and what the system said.
#[derive(Debug)]
pub struct BindError {
    /// The address asked for.
    pub addr: SocketAddr,
    /// What the operating system said.
    pub source: std::io::Error,
}

impl std::error::Error for BindError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.source)
    }
}

impl std::fmt::Display for BindError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "metrics: cannot listen on {} for the HTTP endpoint: {}",
            self.addr, self.source
        )
    }
}

/// Binds the listener of `--metrics ADDR`; the error names the option and the address.
pub async fn bind(addr: SocketAddr) -> Result<TcpListener, BindError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| BindError { addr, source })
}

async fn metrics(State(e): State<Endpoint>) -> Response {
    let m = e.metrics.clone();
    // Rendering a big gateway's per-member families takes a moment: off the async workers.
    let body = tokio::task::spawn_blocking(move || m())
        .await
        .unwrap_or_default();
    ([(header::CONTENT_TYPE, METRICS_CONTENT_TYPE)], body).into_response()
}

async fn healthz(State(e): State<Endpoint>) -> Response {
    match (e.health)().await {
        Health::Ok => text(StatusCode::OK, "ok\n".into()),
        Health::Failing(why) => text(StatusCode::SERVICE_UNAVAILABLE, format!("failing: {why}\n")),
    }
}

async fn status(State(e): State<Endpoint>) -> Response {
    let mut doc = (e.status)().await;
    if let Some(map) = doc.as_object_mut() {
        map.entry("component")
            .or_insert_with(|| serde_json::Value::String(e.component.into()));
    }
    let mut body = serde_json::to_vec_pretty(&doc).unwrap_or_else(|_| b"{}".to_vec());
    body.push(b'\n');
    ([(header::CONTENT_TYPE, "application/json")], body).into_response()
}

async fn index(State(e): State<Endpoint>) -> Response {
    text(
        StatusCode::OK,
        format!(
            "rserpool {}: GET /metrics (OpenMetrics text), GET /status (JSON), GET /healthz\n",
            e.component
        ),
    )
}

async fn not_found() -> Response {
    text(
        StatusCode::NOT_FOUND,
        "not found: GET /metrics, /status or /healthz\n".into(),
    )
}

fn text(code: StatusCode, body: String) -> Response {
    (
        code,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        body,
    )
        .into_response()
}
