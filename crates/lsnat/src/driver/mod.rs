//! The driver: listeners, relays, probes, timers and the status endpoint around the
//! sans-IO core. Every decision is the core's; this module moves bytes and reports what the
//! operating system said.

mod balance;
mod http;
mod probe;
mod relay;
mod splice;
mod tcp;
mod udp;

use crate::config::Config;
use crate::core::receipt::Outcome;
use crate::core::{Gateway, Protocol, SessionId, Status, Time};
use crate::source::{MemberSource, SourceUpdate};
use rand::SeedableRng;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinSet;

/// The core and the data plane's handles on its sessions, under one lock.
pub(crate) struct Inner {
    pub(crate) core: Gateway,
    /// How to stop a session's relay when the core ends it (idle timeout, member lost).
    pub(crate) kills: HashMap<SessionId, Kill>,
    /// The NAT data plane's counters, while it runs (NAT mode).
    pub(crate) nat: Option<crate::nat::Stats>,
    /// The relay workers' loads, while they run (TCP listeners in proxy mode).
    pub(crate) relay: Option<Arc<balance::Balance>>,
}

impl Inner {
    /// The gateway's metrics, and the NAT data plane's in NAT mode.
    pub(crate) fn metric_set(&self) -> rserpool_observe::MetricSet {
        let mut m = self.core.metric_set();
        if let Some(nat) = &self.nat {
            nat.encode(&mut m);
        }
        if let Some(relay) = &self.relay {
            relay.encode(&mut m);
        }
        m
    }
}

/// How the core's end of a session reaches the relay moving its bytes.
pub(crate) enum Kill {
    /// A task's channel (UDP flows).
    Task(oneshot::Sender<Outcome>),
    /// A TCP session on a relay worker's event loop.
    Relay(Arc<relay::Mailbox>, relay::SlotId),
}

impl Kill {
    /// Tells the relay of `session` that the core ended it with `outcome`.
    pub(crate) fn send(self, session: SessionId, outcome: Outcome) {
        match self {
            Kill::Task(tx) => {
                let _ = tx.send(outcome);
            }
            Kill::Relay(mailbox, slot) => mailbox.send(relay::Command::Kill {
                slot,
                session,
                outcome,
            }),
        }
    }
}

impl Inner {
    /// Hands the core's queued actions to the relays.
    pub(crate) fn apply_actions(&mut self) {
        if !self.core.has_actions() {
            return;
        }
        for action in self.core.take_actions() {
            match action {
                crate::core::Action::Close { session, outcome } => {
                    if let Some(kill) = self.kills.remove(&session) {
                        kill.send(session, outcome);
                    }
                }
            }
        }
    }
}

/// State shared by the driver's tasks.
pub(crate) struct Shared {
    inner: Mutex<Inner>,
    start: Instant,
    pub(crate) config: Config,
}

impl Shared {
    /// The core's clock: time since the gateway started.
    pub(crate) fn now(&self) -> Time {
        self.start.elapsed()
    }

    /// Locks the core (a poisoned lock is recovered: the core has no invariants a panic
    /// elsewhere could break halfway, and refusing service would be worse).
    pub(crate) fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs `f` on the core, then delivers any actions it queued.
    pub(crate) fn with<R>(&self, f: impl FnOnce(&mut Gateway, Time) -> R) -> R {
        let now = self.now();
        let mut g = self.lock();
        let r = f(&mut g.core, now);
        g.apply_actions();
        r
    }
}

/// A running gateway.
pub struct Running {
    shared: Arc<Shared>,
    listeners: Vec<(Protocol, SocketAddr)>,
    status: Option<SocketAddr>,
    shutdown: watch::Sender<bool>,
    tasks: JoinSet<()>,
    /// The TCP relay workers' mailboxes: told to stop on shutdown, or when this is dropped.
    workers: Vec<Arc<relay::Mailbox>>,
}

impl Drop for Running {
    fn drop(&mut self) {
        for w in &self.workers {
            w.send(relay::Command::Stop);
        }
    }
}

impl Running {
    /// The addresses actually bound (useful with port 0).
    pub fn listeners(&self) -> &[(Protocol, SocketAddr)] {
        &self.listeners
    }

    /// The first bound address of the given protocol.
    pub fn listener(&self, protocol: Protocol) -> Option<SocketAddr> {
        self.listeners
            .iter()
            .find(|(p, _)| *p == protocol)
            .map(|(_, a)| *a)
    }

    /// The status endpoint's bound address.
    pub fn status_address(&self) -> Option<SocketAddr> {
        self.status
    }

    /// The status document now.
    pub fn status(&self) -> Status {
        let now = self.shared.now();
        self.shared.lock().core.status(now)
    }

    /// The metrics now, in Prometheus text format.
    pub fn metrics(&self) -> String {
        self.shared.lock().metric_set().render()
    }

    /// Runs `f` on the core (read or adjust it from outside, e.g. in tests).
    pub fn with_core<R>(&self, f: impl FnOnce(&mut Gateway, Time) -> R) -> R {
        self.shared.with(f)
    }

    /// Stops listening, ends open sessions with outcome shutdown, and waits for the tasks.
    pub async fn shutdown(mut self) {
        let _ = self.shutdown.send(true);
        for w in &self.workers {
            w.send(relay::Command::Stop);
        }
        {
            let now = self.shared.now();
            let mut g = self.shared.lock();
            g.core.shutdown(now);
            for (session, kill) in g.kills.drain() {
                kill.send(session, Outcome::Shutdown);
            }
        }
        while self.tasks.join_next().await.is_some() {}
    }
}

/// Starts a gateway: binds the listeners and the status endpoint, starts the member source,
/// the timers and the probes. Returns once everything is listening.
pub async fn start(config: Config, source: Box<dyn MemberSource>) -> std::io::Result<Running> {
    let nat = prepare_nat(&config).await?;
    let core_config = match &nat {
        Some(_) => crate::nat::core_config(config.core.clone()),
        None => config.core.clone(),
    };
    let core = Gateway::new(core_config, Box::new(rand::rngs::StdRng::from_os_rng()));
    for w in &config.warnings {
        tracing::warn!("{w}");
    }
    // Everything is bound before anything is announced or started: a port in use stops the
    // gateway with the address named, not after a "listening" line.
    let bound = bind_all(&config, nat.is_none()).await?;
    let shared = Arc::new(Shared {
        inner: Mutex::new(Inner {
            core,
            kills: HashMap::new(),
            nat: None,
            relay: None,
        }),
        start: Instant::now(),
        config,
    });
    let (shutdown, shutdown_rx) = watch::channel(false);
    let mut tasks = JoinSet::new();

    // Members first, so the first session finds them.
    let (tx, mut rx) = mpsc::channel::<SourceUpdate>(64);
    tracing::info!(source = %source.describe(), "member source");
    let mut first = None;
    let src = source.run(tx);
    let mut src_handle = tokio::spawn(async move {
        if let Err(e) = src.await {
            tracing::error!(error = %e, "member source failed; keeping the last membership");
        }
    });
    tokio::select! {
        u = rx.recv() => first = u,
        _ = &mut src_handle => {}
    }
    if first.is_none() {
        first = rx.try_recv().ok();
    }
    if let Some(u) = first {
        apply_update(&shared, u);
    }
    {
        let shared = shared.clone();
        let mut stop = shutdown_rx.clone();
        tasks.spawn(async move {
            loop {
                tokio::select! {
                    u = rx.recv() => match u {
                        Some(u) => apply_update(&shared, u),
                        None => break,
                    },
                    _ = stop.changed() => break,
                }
            }
        });
    }

    let mut listeners = Vec::new();
    if let Some(prepared) = nat {
        // NAT mode: the kernel translates; nothing is bound in user space for the listeners.
        listeners = prepared.listeners();
        tasks.spawn(crate::nat::run(
            shared.clone(),
            prepared,
            shutdown_rx.clone(),
        ));
    }
    // One relay worker thread per CPU (runtime.worker_threads), each an event loop waiting on
    // every TCP listener (EPOLLEXCLUSIVE: a new connection wakes one idle worker): a connection
    // is relayed and closed on the thread that accepted it, or on a waiting worker it was
    // handed to (balance.rs). This runtime keeps the timers, probes, UDP and the endpoint.
    let mut tcp_listeners = Vec::new();
    for (p, local, listener) in bound.listeners {
        tracing::info!(address = %local, protocol = p.name(), "listening");
        listeners.push((p, local));
        match listener {
            BoundListener::Tcp(l) => {
                tcp_listeners.push(Arc::new(mio::net::TcpListener::from_std(l)));
            }
            BoundListener::Udp(s) => {
                tasks.spawn(udp::listener_loop(shared.clone(), s, shutdown_rx.clone()));
            }
        }
    }
    // Every worker is built before any runs, so that a failure leaves none behind.
    let mut workers = Vec::new();
    if !tcp_listeners.is_empty() {
        let balance = balance::Balance::new(bound.workers.max(1));
        for n in 0..bound.workers.max(1) {
            workers.push(relay::Worker::new(
                n,
                shared.clone(),
                balance.clone(),
                &tcp_listeners,
            )?);
        }
        balance.set_mailboxes(workers.iter().map(|(_, m)| m.clone()).collect());
        shared.lock().relay = Some(balance);
    }
    drop(tcp_listeners);
    let mailboxes: Vec<_> = workers.iter().map(|(_, m)| m.clone()).collect();
    for (worker, _) in workers {
        let name = format!("lsnat-worker-{}", worker.number());
        let spawned = std::thread::Builder::new()
            .name(name)
            .spawn(move || worker.run());
        let handle = match spawned {
            Ok(h) => h,
            Err(e) => {
                for m in &mailboxes {
                    m.send(relay::Command::Stop);
                }
                return Err(e);
            }
        };
        tasks.spawn(async move {
            let _ = tokio::task::spawn_blocking(move || handle.join()).await;
        });
    }
    let status = match bound.status {
        Some(l) => {
            let local = l.local_addr()?;
            tracing::info!(address = %local, "HTTP endpoint (GET /status, /metrics, /healthz)");
            tasks.spawn(http::serve(shared.clone(), l, shutdown_rx.clone()));
            Some(local)
        }
        None => None,
    };
    tasks.spawn(ticker(shared.clone(), shutdown_rx.clone()));
    if shared.config.probe.kind != crate::config::ProbeKind::None {
        tasks.spawn(probe::probe_loop(shared.clone(), shutdown_rx.clone()));
    }
    Ok(Running {
        shared,
        listeners,
        status,
        shutdown,
        tasks,
        workers: mailboxes,
    })
}

/// Worker threads for `config`: `runtime.worker_threads`, or one per CPU this process may run
/// on.
pub(crate) fn workers(config: &Config) -> usize {
    config.runtime.worker_threads.unwrap_or_else(|| {
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
    })
}

enum BoundListener {
    /// One socket, shared by the relay workers.
    Tcp(std::net::TcpListener),
    Udp(tokio::net::UdpSocket),
}

struct Bound {
    listeners: Vec<(Protocol, SocketAddr, BoundListener)>,
    status: Option<tokio::net::TcpListener>,
    workers: usize,
}

/// The error of a bind, with what was bound and where (the operating system's message alone
/// does not say which address is in use).
fn bind_error(what: &str, addr: SocketAddr, e: std::io::Error) -> std::io::Error {
    std::io::Error::new(e.kind(), format!("{what} {addr}: {e}"))
}

/// Binds the HTTP endpoint of `config` and, unless the kernel translates (NAT mode), its
/// listeners.
async fn bind_all(config: &Config, with_listeners: bool) -> std::io::Result<Bound> {
    let mut listeners = Vec::new();
    let workers = workers(config);
    for l in config.listeners.iter().filter(|_| with_listeners) {
        let (local, b) = match l.protocol {
            Protocol::Tcp => {
                let s =
                    tcp::bind(l.address).map_err(|e| bind_error("TCP listener", l.address, e))?;
                (s.local_addr()?, BoundListener::Tcp(s))
            }
            Protocol::Udp => {
                let s =
                    udp::bind(l.address).map_err(|e| bind_error("UDP listener", l.address, e))?;
                (s.local_addr()?, BoundListener::Udp(s))
            }
        };
        listeners.push((l.protocol, local, b));
    }
    let status = match config.status {
        Some(addr) => Some(
            tokio::net::TcpListener::bind(addr)
                .await
                .map_err(|e| bind_error("HTTP endpoint (metrics)", addr, e))?,
        ),
        None => None,
    };
    Ok(Bound {
        listeners,
        status,
        workers,
    })
}

/// Checks that everything `config` would bind can be bound now (`--check`), then lets go.
pub async fn try_bind(config: &Config) -> std::io::Result<()> {
    bind_all(config, config.mode != crate::config::Mode::Nat)
        .await
        .map(drop)
}

/// NAT mode where asked for and possible; None means the proxy serves (the reason is logged).
async fn prepare_nat(config: &Config) -> std::io::Result<Option<crate::nat::Prepared>> {
    if config.mode != crate::config::Mode::Nat {
        tracing::info!("proxy mode: the gateway relays each session in user space");
        return Ok(None);
    }
    let c = config.clone();
    let r = tokio::task::spawn_blocking(move || crate::nat::prepare(&c))
        .await
        .unwrap_or_else(|e| Err(e.to_string()));
    match r {
        Ok(p) => {
            tracing::info!("NAT mode: {}", crate::nat::describe(&config.nat));
            Ok(Some(p))
        }
        Err(reason) if config.nat.required => Err(std::io::Error::other(format!(
            "NAT mode cannot run: {reason} (nat.required is set)"
        ))),
        Err(reason) => {
            tracing::warn!(
                "NAT mode cannot run: {reason}; serving in PROXY mode instead (the userspace relay; set nat.required = true to refuse to start)"
            );
            Ok(None)
        }
    }
}

fn apply_update(shared: &Shared, u: SourceUpdate) {
    shared.with(|core, now| match u {
        SourceUpdate::Members(m) => core.set_members(now, m),
        SourceUpdate::Evidence { key, registered } => core.source_evidence(now, &key, registered),
    });
}

async fn ticker(shared: Arc<Shared>, mut stop: watch::Receiver<bool>) {
    let mut iv = tokio::time::interval(shared.config.runtime.tick);
    iv.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = iv.tick() => shared.with(|core, now| core.poll(now)),
            _ = stop.changed() => break,
        }
    }
}
