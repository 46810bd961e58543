//! `rserpool monitor`: a live terminal view of registrars, pools, PEs, sessions and receipt
//! counters, fed by the daemons' status endpoints (`--status`, read every refresh: `/status`
//! JSON where served, `/metrics` Prometheus text) and by Component Status Protocol reports
//! received over UDP (`--csp`), so that RSPLIB's components show up beside ours.
//!
//! With `--once`, or when stdout is not a terminal, it prints one plain-text snapshot and exits.

mod model;
mod tui;

use crate::units::{human, DurationValue};
use anyhow::{bail, Context, Result};
use clap::Args;
use model::{parse_prometheus, State};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::Instant;

/// Options of `rserpool monitor`.
#[derive(Args, Debug)]
pub struct MonitorArgs {
    /// A daemon's status endpoint, ADDR:PORT (the `--metrics` address of `rserpool registrar`,
    /// `pe` or `lsnat`) or http://ADDR:PORT[/PATH]; repeat for several. `/status` (JSON) is
    /// read where served, and `/metrics`.
    #[arg(long = "status", value_name = "ADDR:PORT")]
    pub status: Vec<String>,
    /// Receive Component Status Protocol reports (UDP) here, from our daemons' and RSPLIB's
    /// `--csp-server`/`-cspserver`; `off` to receive none. Only this host by default: give
    /// e.g. 0.0.0.0:2960 to hear other hosts (anyone who can reach the port can then add
    /// components to the view).
    #[arg(long, value_name = "ADDR:PORT|off", default_value = "127.0.0.1:2960")]
    pub csp: String,
    /// How often the view and the status endpoints are refreshed, e.g. "1s", "500ms" or
    /// milliseconds; with --once, how long CSP reports are collected first.
    #[arg(long, value_name = "DURATION", default_value = "1s")]
    pub refresh: DurationValue,
    /// Print one plain-text snapshot and exit (also what happens when stdout is not a
    /// terminal).
    #[arg(long)]
    pub once: bool,
    /// Time one status endpoint has to answer.
    #[arg(long, value_name = "DURATION", default_value = "2s")]
    pub timeout: DurationValue,
    /// Most CSP components kept; reports of further ones are counted and ignored.
    ///
    #[arg(long, value_name = "N", default_value_t = 1024)]
    pub max_components: usize,
    /// A CSP component is forgotten after this long without a report, or after 10 of its
    /// report intervals if that is shorter (as cspmonitor's -purgeinterval).
    #[arg(long, value_name = "DURATION", default_value = "30s")]
    pub purge_interval: DurationValue,
    /// Largest status endpoint response read, in bytes.
    #[arg(long, value_name = "BYTES", default_value_t = 4 << 20)]
    pub max_response_size: usize,
}

/// Where an endpoint is and which paths to read.
#[derive(Debug, Clone)]
struct Target {
    host: String,
    paths: Vec<String>,
}

fn target(v: &str) -> Result<Target> {
    let rest = v.strip_prefix("http://").unwrap_or(v);
    if v.starts_with("https://") {
        bail!("status: {v:?}: https is not supported; give the plain HTTP address");
    }
    let (host, path) = match rest.find('/') {
        Some(i) => (&rest[..i], Some(&rest[i..])),
        None => (rest, None),
    };
    // An address, not a host name (docs/configuration.md): nothing to resolve at each refresh.
    if host.parse::<std::net::SocketAddr>().is_err() {
        bail!("status: {v:?} is not ADDR:PORT or http://ADDR:PORT[/PATH] (e.g. 127.0.0.1:9100)");
    }
    let paths = match path {
        Some(p) if p != "/" => vec![p.to_string()],
        _ => vec!["/status".into(), "/metrics".into()],
    };
    Ok(Target {
        host: host.to_string(),
        paths,
    })
}

/// `GET path` over HTTP/1.1, one request per connection; the body of a 200 answer, `None` for
/// 404, an error otherwise.
async fn get(host: &str, path: &str, limit: usize) -> Result<Option<Vec<u8>>> {
    let mut s = tokio::net::TcpStream::connect(host)
        .await
        .with_context(|| format!("connecting to {host}"))?;
    s.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .await?;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    loop {
        let n = s.read(&mut chunk).await?;
        if n == 0 {
            break;
        }
        if buf.len() + n > limit {
            bail!("{path}: the answer is larger than --max-response-size ({limit} bytes)");
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    let end = buf
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .with_context(|| format!("{path}: not an HTTP answer"))?;
    let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
    let code = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse::<u16>().ok())
        .with_context(|| format!("{path}: no HTTP status"))?;
    if head.contains("transfer-encoding: chunked") {
        bail!("{path}: chunked answers are not read");
    }
    match code {
        200 => Ok(Some(buf[end + 4..].to_vec())),
        404 => Ok(None),
        other => bail!("{path}: HTTP {other}"),
    }
}

/// Reads one endpoint into `source`.
async fn read_source(t: &Target, timeout: Duration, limit: usize) -> Result<model::Source> {
    let mut src = model::Source::new(String::new());
    let mut found = false;
    for path in &t.paths {
        let body = tokio::time::timeout(timeout, get(&t.host, path, limit))
            .await
            .map_err(|_| anyhow::anyhow!("no answer within {}", human(timeout)))??;
        let Some(body) = body else { continue };
        found = true;
        let text = String::from_utf8_lossy(&body);
        if path.ends_with("status") && text.trim_start().starts_with('{') {
            src.status =
                Some(serde_json::from_str(&text).with_context(|| format!("{path}: not JSON"))?);
        } else {
            src.metrics = Some(parse_prometheus(&text).0);
        }
    }
    if !found {
        bail!("none of {} is served", t.paths.join(", "));
    }
    Ok(src)
}

/// Reads every endpoint once, all at the same time, into the state.
async fn refresh(state: &Mutex<State>, targets: &[Target], timeout: Duration, limit: usize) {
    let reads: Vec<_> = targets
        .iter()
        .cloned()
        .map(|t| tokio::spawn(async move { read_source(&t, timeout, limit).await }))
        .collect();
    let mut results = Vec::with_capacity(reads.len());
    for r in reads {
        results.push(
            r.await
                .unwrap_or_else(|e| Err(anyhow::anyhow!("the read failed: {e}"))),
        );
    }
    let now = Instant::now();
    let Ok(mut st) = state.lock() else { return };
    for (s, r) in st.sources.iter_mut().zip(results) {
        match r {
            Ok(new) => {
                s.metrics = new.metrics;
                s.status = new.status;
                s.error = None;
                s.updated = Some(now);
            }
            Err(e) => s.error = Some(crate::describe(&e)),
        }
    }
    st.purge_csp(now);
}

/// Receives CSP reports into the state until the task is dropped.
async fn receive_csp(socket: tokio::net::UdpSocket, state: Arc<Mutex<State>>) {
    let mut buf = vec![0u8; 65536];
    loop {
        match socket.recv_from(&mut buf).await {
            Ok((n, from)) => {
                if let Ok(mut st) = state.lock() {
                    st.csp_datagram(&buf[..n], from, Instant::now());
                }
            }
            Err(e) => {
                tracing::debug!(error = %e, "CSP receive");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// Runs the monitor.
pub fn run(args: MonitorArgs) -> Result<()> {
    let targets: Vec<Target> = args
        .status
        .iter()
        .map(|s| target(s))
        .collect::<Result<_>>()?;
    let refresh_every = args.refresh.duration;
    if refresh_every < Duration::from_millis(100) {
        bail!("refresh: {} is shorter than 100ms", human(refresh_every));
    }
    let timeout = args.timeout.duration;
    if timeout.is_zero() {
        bail!("timeout: must be longer than 0s");
    }
    if args.max_components == 0 {
        bail!("max-components: must be at least 1");
    }
    let csp_addr: Option<std::net::SocketAddr> = match args.csp.as_str() {
        "off" | "none" => None,
        a => Some(
            a.parse()
                .map_err(|e| anyhow::anyhow!("csp: {a:?} is not ADDR:PORT or off: {e}"))?,
        ),
    };
    if targets.is_empty() && csp_addr.is_none() {
        bail!("nothing to show: give --status ADDR:PORT, or leave --csp on");
    }
    let once = args.once || !std::io::IsTerminal::is_terminal(&std::io::stdout());
    let state = Arc::new(Mutex::new(State::new(
        &args.status,
        args.max_components,
        args.purge_interval.duration,
    )));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    let limit = args.max_response_size;
    rt.block_on(async {
        let _csp_task = match csp_addr {
            Some(a) => {
                let socket = tokio::net::UdpSocket::bind(a).await.with_context(|| {
                    format!("csp: cannot receive CSP reports on {a} (is cspmonitor or another monitor there? give --csp ADDR:PORT or --csp off)")
                })?;
                let bound = socket.local_addr()?;
                eprintln!("receiving CSP reports on {bound}");
                if let Ok(mut st) = state.lock() {
                    st.csp_listen = Some(bound);
                }
                Some(AbortOnDrop(tokio::spawn(receive_csp(socket, state.clone()))))
            }
            None => None,
        };
        if once {
            if csp_addr.is_some() {
                tokio::time::sleep(refresh_every).await;
            }
            refresh(&state, &targets, timeout, limit).await;
            let st = state.lock().map_err(|_| anyhow::anyhow!("state poisoned"))?;
            let text = model::render_text(&model::panes(&st, Instant::now()));
            for line in text.lines() {
                outln!("{line}");
            }
            return Ok(());
        }
        let fetcher = {
            let state = state.clone();
            let targets = targets.clone();
            AbortOnDrop(tokio::spawn(async move {
                loop {
                    refresh(&state, &targets, timeout, limit).await;
                    tokio::time::sleep(refresh_every).await;
                }
            }))
        };
        let state2 = state.clone();
        let footer = format!(
            "refresh {} · CSP {}",
            human(refresh_every),
            csp_addr
                .map(|a| format!("on {a}"))
                .unwrap_or_else(|| "off".into())
        );
        let r = tokio::task::spawn_blocking(move || tui::run(state2, refresh_every, footer))
            .await
            .context("the view")?;
        drop(fetcher);
        r
    })
}

/// Aborts the task when dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
