//! `rserpool pu`: a pool user. With `--service echo` (the default) it sends each line of stdin
//! to the pool and prints the replies, like RSPLIB's `rspterminal` but ending at the end of its
//! input; with `pingpong` or `calcapp` it is the client of that service, printing what
//! `pingpongclient` / `calcappclient` print. Failovers are automatic: each one is reported on
//! stderr (from which PE to which, why, with or without a cookie), and the session's receipts
//! (selected, bound, reached, failovers, outcome) are summed up at the end.

use crate::pe::{service_kind, transport_choice};
use anyhow::{bail, Context, Result};
use clap::Args;
use rserpool_endpoint::driver::{PoolUserClient, RegistrarAccess, SessionHandle, SessionSnapshot};
use rserpool_endpoint::pu::ResolverConfig;
use rserpool_endpoint::session::{
    CandidateSource, FailoverReason, FailoverRecord, SessionConfig, SessionEvent,
};
use rserpool_services::{ClientOutput, ClientReport, Now, ServiceConfig, ServiceKind};
use rserpool_transport::{EndpointConfig, TransportChoice};
use rserpool_wire::PoolHandle;
use serde::Deserialize;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::time::Instant;

/// Options of `rserpool pu`. Durations are written with a unit (`500ms`, `5s`).
#[derive(Args, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct PuArgs {
    /// TOML file with any of these options as keys and the clients' settings in a
    /// `[service-config]` table (`[service-config.pingpong-client]`, ...); flags win.
    #[arg(long, short = 'c', value_name = "FILE")]
    #[serde(skip)]
    pub config: Option<PathBuf>,
    /// The service: echo (lines from stdin), discard, daytime, chargen, pingpong, calcapp.
    /// [default: echo]
    #[arg(long)]
    pub service: Option<String>,
    /// The pool to use. [default: the service's, e.g. EchoPool, PingPongPool]
    #[arg(long)]
    pub pool_handle: Option<String>,
    /// Registrar to resolve the pool at (repeat for a list). [default: 127.0.0.1:3863]
    #[arg(long, value_name = "ADDR:PORT")]
    #[serde(default)]
    pub registrar: Vec<SocketAddr>,
    /// Transport to registrars and PEs: auto, sctp or tcp. [default: auto]
    #[arg(long, value_parser = ["auto", "sctp", "tcp"])]
    pub transport: Option<String>,
    /// pingpong: Pings answered before the end; calcapp: jobs completed; chargen: messages
    /// printed. [default: until stopped (echo/discard: until the end of input)]
    #[arg(long)]
    pub count: Option<u64>,
    /// pingpong: time between Pings (pingpongclient `-interval`). [default: 500ms]
    #[arg(long, value_parser = crate::units::duration_arg)]
    #[serde(default, with = "humantime_serde")]
    pub interval: Option<Duration>,
    /// Fail over when data was sent and nothing came back for this long (echo; the services
    /// have their own timeouts). [default: 5s for echo, off otherwise]
    #[arg(long, value_parser = crate::units::duration_arg)]
    #[serde(default, with = "humantime_serde")]
    pub answer_timeout: Option<Duration>,
    /// Connection attempts for one open or one failover before giving up. [default: 5]
    #[arg(long)]
    pub max_attempts: Option<u32>,
    /// How long connecting to a PE (or resolving) may take. [default: 5s]
    #[arg(long, value_parser = crate::units::duration_arg)]
    #[serde(default, with = "humantime_serde")]
    pub connect_timeout: Option<Duration>,
    /// Pause before a new resolution after a failed attempt, doubled each time. [default:
    /// 100ms]
    #[arg(long, value_parser = crate::units::duration_arg)]
    #[serde(default, with = "humantime_serde")]
    pub backoff: Option<Duration>,
    /// Serve handle resolutions from the cache for this long (the stale cache value).
    /// [default: 0s]
    #[arg(long, value_parser = crate::units::duration_arg)]
    #[serde(default, with = "humantime_serde")]
    pub stale_cache: Option<Duration>,
    /// Largest cookie kept, in bytes. [default: 65536]
    #[arg(long, value_name = "BYTES")]
    pub max_cookie_size: Option<usize>,
    /// Print no per-message lines, only failovers and the summary.
    #[arg(long)]
    pub quiet: Option<bool>,
    /// Begin each line printed with the time (seconds since the epoch), to measure e.g. the
    /// time from a PE's crash to the next reply.
    #[arg(long)]
    pub timestamps: Option<bool>,
    /// Serve the HTTP endpoint here while the session runs: http://ADDR:PORT/metrics
    /// (OpenMetrics), /status (JSON), /healthz.
    #[arg(long, value_name = "ADDR:PORT")]
    pub metrics: Option<SocketAddr>,
    /// Time a client of the HTTP endpoint has to send its request and read the answer, e.g.
    /// "5s". [default: 5s]
    #[arg(long, value_name = "DURATION", value_parser = crate::units::duration_arg)]
    #[serde(default, with = "humantime_serde")]
    pub metrics_timeout: Option<Duration>,
    /// HTTP endpoint connections served at once; further ones are closed. [default: 64]
    #[arg(long, value_name = "N")]
    pub metrics_max_connections: Option<usize>,
    /// Send Component Status Protocol reports to this monitor while the session runs (UDP;
    /// port 2960 when left out; RSPLIB's `-cspserver`). Alone, reports go every 250 ms.
    #[arg(long, value_name = "ADDR[:PORT]", env = "CSP_SERVER")]
    pub csp_server: Option<String>,
    /// Time between CSP reports, e.g. "1s", or milliseconds as `-cspinterval` takes them.
    /// Alone, reports go to 127.0.0.1:2960. [default: off; 250ms with --csp-server]
    #[arg(long, value_name = "DURATION", env = "CSP_INTERVAL")]
    pub csp_interval: Option<crate::units::DurationValue>,
    /// The clients' settings (file only).
    #[arg(skip)]
    #[serde(skip)]
    pub service_settings: Option<toml::Table>,
    /// TLS towards the registrars (flags only). ASAP then runs over the TCP mapping; the
    /// sessions with the PEs do not use TLS.
    #[command(flatten)]
    #[serde(skip)]
    pub tls: crate::tls::TlsArgs,
}

impl PuArgs {
    fn merged(mut self) -> Result<Self> {
        let Some(path) = self.config.clone() else {
            return Ok(self);
        };
        let (mut file, settings): (PuArgs, _) =
            crate::units::read_config_with_service_table(&path)?;
        macro_rules! merge {
            ($($f:ident),*) => { $( if self.$f.is_none() { self.$f = file.$f.take(); } )* };
        }
        merge!(
            service,
            pool_handle,
            transport,
            count,
            interval,
            answer_timeout,
            max_attempts,
            connect_timeout,
            backoff,
            stale_cache,
            max_cookie_size,
            quiet,
            timestamps,
            metrics,
            metrics_timeout,
            metrics_max_connections,
            csp_server,
            csp_interval
        );
        if self.registrar.is_empty() {
            self.registrar = file.registrar;
        }
        if settings.is_some() {
            self.service_settings = settings;
        }
        Ok(self)
    }
}

fn now_of(epoch: Instant) -> Now {
    Now::new(
        epoch.elapsed(),
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default(),
    )
}

/// Prints a line on stdout, with the time first when asked.
fn say(timestamps: bool, text: &str) {
    if timestamps {
        let t = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        println!("{}.{:06} {text}", t.as_secs(), t.subsec_micros());
    } else {
        println!("{text}");
    }
}

/// Prints a line on stderr, with the time first when asked.
fn esay(timestamps: bool, text: &str) {
    if timestamps {
        let t = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        eprintln!("{}.{:06} {text}", t.as_secs(), t.subsec_micros());
    } else {
        eprintln!("{text}");
    }
}

fn describe(f: &FailoverRecord) -> String {
    format!(
        "failover: PE {} -> PE {} ({}), {}, {} attempt(s), {:.1} ms",
        f.from,
        f.to,
        f.reason,
        if f.with_cookie {
            "cookie echoed"
        } else {
            "no cookie"
        },
        f.attempts.max(1),
        (f.completed - f.started).as_secs_f64() * 1e3
    )
}

/// The receipts of a session, one line each, for stderr.
fn summary(s: &SessionSnapshot) -> String {
    let r = &s.receipt;
    let count = |src: CandidateSource| r.selections.iter().filter(|x| x.source == src).count();
    let st = &s.stats;
    let outcome = match &r.outcome {
        Some(rserpool_endpoint::session::Outcome::Closed) => "closed".to_string(),
        Some(rserpool_endpoint::session::Outcome::Failed { reason }) => format!("failed: {reason}"),
        None => "open".to_string(),
    };
    format!(
        "session: selected {} (resolution {}, cache {}, business card {}), bound {}, reached {}, \
         failovers {} ({} with cookie), connect failures {}, unreachable reported {}, \
         cookies {}, messages sent {} received {}, outcome {outcome}",
        st.selected,
        count(CandidateSource::Resolution),
        count(CandidateSource::Cache),
        count(CandidateSource::BusinessCard),
        st.bound,
        st.reached,
        st.failovers,
        st.failovers_with_cookie,
        st.connect_failures,
        st.unreachable_reported,
        st.cookies,
        st.messages_sent,
        st.messages_received
    )
}

/// Runs the pool user.
pub fn run(args: PuArgs) -> Result<()> {
    let a = args.merged()?;
    let kind = service_kind(a.service.as_deref())?;
    let transport = transport_choice("transport", a.transport.as_deref())?;
    let pool = PoolHandle::from(
        a.pool_handle
            .clone()
            .unwrap_or_else(|| kind.default_pool_handle().to_string())
            .as_str(),
    );
    let mut service_config: ServiceConfig = match a.service_settings.clone() {
        Some(t) => toml::Value::Table(t)
            .try_into()
            .context("in the [service-config] table of the configuration")?,
        None => ServiceConfig::default(),
    };
    if let Some(i) = a.interval {
        if i.is_zero() {
            bail!("interval: must be more than 0s");
        }
        service_config.pingpong_client.interval = i;
    }
    if let Some(n) = a.count {
        service_config.pingpong_client.count = Some(n);
        service_config.calcapp_client.jobs = Some(n);
    }
    let mut config = SessionConfig::new(pool.clone());
    config.answer_timeout = match kind {
        ServiceKind::Echo => Some(a.answer_timeout.unwrap_or(Duration::from_secs(5))),
        _ => a.answer_timeout,
    };
    if let Some(n) = a.max_attempts {
        if n == 0 {
            bail!("max-attempts: must be at least 1");
        }
        config.max_attempts = n;
    }
    if let Some(t) = a.connect_timeout {
        config.connect_timeout = t;
    }
    if let Some(b) = a.backoff {
        config.backoff_initial = b;
    }
    if let Some(n) = a.max_cookie_size {
        config.max_cookie_size = n;
    }
    if kind.has_client() {
        // The client resends what is unanswered after a failover: nothing is held meanwhile.
        config.application_resends = true;
    }
    let registrars = if a.registrar.is_empty() {
        vec!["127.0.0.1:3863".parse()?]
    } else {
        a.registrar.clone()
    };
    let mut access = RegistrarAccess::single(registrars[0], transport);
    access.registrars = registrars.iter().map(|r| vec![*r]).collect();
    if let Some(tls) = a.tls.settings()? {
        // TLS runs over the TCP mapping only (docs/security.md#tls).
        access.transport = TransportChoice::Tcp;
        access.endpoint.tls = Some(tls);
    }
    let resolver = ResolverConfig {
        stale_cache: a.stale_cache.unwrap_or(Duration::ZERO),
        ..ResolverConfig::default()
    };
    let csp = crate::csp::config(a.csp_server.as_deref(), a.csp_interval)?;
    let quiet = a.quiet.unwrap_or(false);
    let timestamps = a.timestamps.unwrap_or(false);
    let count = a.count;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let metrics_addr = a.metrics;
    let http_limits = crate::units::http_limits(a.metrics_timeout, a.metrics_max_connections)?;
    rt.block_on(async move {
        // Bound first: a bad address is an error before any session is opened.
        let metrics_listener = match metrics_addr {
            Some(m) => Some(rserpool_observe::server::bind(m).await?),
            None => None,
        };
        let client = PoolUserClient::start(resolver, access)
            .await
            .context("starting the resolver")?;
        let session = SessionHandle::open(client, config, EndpointConfig::new(transport))
            .await
            .with_context(|| format!("opening a session to pool {pool}"))?;
        eprintln!(
            "session to pool {pool}: bound to PE {}",
            session.opened_pe()
        );
        let reporter = csp.map(|c| pool_user_reporter(c, &session, pool.clone(), kind, transport));
        let _http = match metrics_listener {
            Some(l) => {
                eprintln!("metrics at http://{}/metrics", l.local_addr()?);
                Some(
                    pool_user_endpoint(&session, pool.clone(), kind)
                        .limits(http_limits)
                        .spawn(l),
                )
            }
            None => None,
        };
        let result = if kind.has_client() {
            run_client(session, kind, &service_config, quiet, timestamps).await
        } else {
            run_lines(session, kind, count, quiet).await
        };
        if let Some(r) = reporter {
            r.finish().await;
        }
        match result {
            Ok(snapshot) => {
                eprintln!("{}", summary(&snapshot));
                match snapshot.receipt.outcome {
                    Some(rserpool_endpoint::session::Outcome::Failed { reason }) => {
                        bail!("the session failed: {reason}")
                    }
                    _ => Ok(()),
                }
            }
            Err(e) => Err(e),
        }
    })
}

/// CSP reports of this pool user: a random ID, the pool, the PE it uses now and since when.
/// The metrics (`rserpool_pu_…`) of a session snapshot.
fn pool_user_metrics(
    s: &SessionSnapshot,
    pool: &str,
    service: &str,
) -> rserpool_observe::MetricSet {
    let mut m = rserpool_observe::MetricSet::new();
    let pe = s.current_pe.map(|p| p.to_string()).unwrap_or_default();
    m.family(
        "rserpool_pu_info",
        rserpool_observe::Kind::Gauge,
        "This pool user: its pool, service and the PE it is bound to now.",
    )
    .sample(&[("pool", pool), ("service", service), ("pe", &pe)], 1);
    m.gauge(
        "rserpool_pu_session_open",
        "1 while the session runs (0 once it closed or failed).",
        u64::from(s.receipt.outcome.is_none()),
    );
    let st = &s.stats;
    for (name, help, v) in [
        (
            "selected_total",
            "Selection receipts: PEs selected.",
            st.selected,
        ),
        (
            "bound_total",
            "Binding receipts: associations to a PE that came up.",
            st.bound,
        ),
        (
            "reached_total",
            "Reached receipts: bindings on which the PE answered.",
            st.reached,
        ),
        ("failovers_total", "Failovers completed.", st.failovers),
        (
            "failovers_with_cookie_total",
            "Failovers that echoed a cookie.",
            st.failovers_with_cookie,
        ),
        (
            "connect_failures_total",
            "Connection attempts to PEs that failed.",
            st.connect_failures,
        ),
        (
            "unreachable_reported_total",
            "PEs reported unreachable to the registrar.",
            st.unreachable_reported,
        ),
        ("cookies_total", "Cookies received and kept.", st.cookies),
        (
            "cookies_refused_total",
            "Cookies refused (larger than --max-cookie-size).",
            st.cookies_refused,
        ),
        (
            "business_cards_total",
            "Business cards received.",
            st.business_cards,
        ),
        (
            "messages_sent_total",
            "Data messages sent.",
            st.messages_sent,
        ),
        (
            "messages_received_total",
            "Data messages received.",
            st.messages_received,
        ),
        (
            "protocol_errors_total",
            "Control-channel messages that could not be decoded or were not expected.",
            st.protocol_errors,
        ),
    ] {
        m.counter(&format!("rserpool_pu_{name}"), help, v);
    }
    m
}

/// The `/status` document of a session: the pool, the PE now, the counters and the last
/// failovers (at most 16: a long-running session's full history stays in its receipt).
fn pool_user_status(s: &SessionSnapshot, pool: &str, service: &str) -> serde_json::Value {
    let st = &s.stats;
    let outcome = match &s.receipt.outcome {
        Some(rserpool_endpoint::session::Outcome::Closed) => "closed".to_string(),
        Some(rserpool_endpoint::session::Outcome::Failed { reason }) => format!("failed: {reason}"),
        None => "open".to_string(),
    };
    let failovers: Vec<serde_json::Value> = s
        .receipt
        .failovers
        .iter()
        .rev()
        .take(16)
        .map(|f| {
            serde_json::json!({
                "from": f.from.to_string(),
                "to": f.to.to_string(),
                "reason": f.reason.to_string(),
                "with_cookie": f.with_cookie,
                "attempts": f.attempts,
                "milliseconds": (f.completed.saturating_sub(f.started)).as_secs_f64() * 1e3,
            })
        })
        .collect();
    serde_json::json!({
        "component": "pu",
        "pool": pool,
        "service": service,
        "pe": s.current_pe.map(|p| p.to_string()),
        "session": outcome,
        "counters": {
            "selected": st.selected,
            "bound": st.bound,
            "reached": st.reached,
            "failovers": st.failovers,
            "failovers_with_cookie": st.failovers_with_cookie,
            "connect_failures": st.connect_failures,
            "unreachable_reported": st.unreachable_reported,
            "cookies": st.cookies,
            "messages_sent": st.messages_sent,
            "messages_received": st.messages_received,
            "protocol_errors": st.protocol_errors,
        },
        "recent_failovers": failovers,
    })
}

/// The pool user's HTTP endpoint, fed by the session's snapshots.
fn pool_user_endpoint(
    session: &SessionHandle,
    pool: PoolHandle,
    kind: ServiceKind,
) -> rserpool_observe::server::Endpoint {
    let (s1, s2) = (session.snapshots(), session.snapshots());
    let (p1, p2) = (pool.to_string(), pool.to_string());
    let service = kind.name();
    rserpool_observe::server::Endpoint::new("pu", move || {
        pool_user_metrics(&s1.borrow(), &p1, service).render()
    })
    .status(move || pool_user_status(&s2.borrow(), &p2, service))
}

fn pool_user_reporter(
    c: crate::csp::CspConfig,
    session: &SessionHandle,
    pool: PoolHandle,
    kind: ServiceKind,
    transport: TransportChoice,
) -> crate::csp::Reporter {
    let snapshots = session.snapshots();
    let object = crate::csp::random_u64();
    let protocol = match transport {
        TransportChoice::Sctp => rserpool_wire::csp::PROTOCOL_SCTP,
        TransportChoice::Tcp => rserpool_wire::csp::PROTOCOL_TCP,
        _ if rserpool_transport::sctp_available().is_ok() => rserpool_wire::csp::PROTOCOL_SCTP,
        _ => rserpool_wire::csp::PROTOCOL_TCP,
    };
    let mut since: Option<(rserpool_wire::PoolElementId, Instant)> = None;
    crate::csp::Reporter::start(c, crate::csp::location(&[]), move || {
        let s = snapshots.borrow().clone();
        since = match (s.current_pe, since) {
            (Some(pe), Some((old, t))) if pe == old => Some((pe, t)),
            (Some(pe), _) => Some((pe, Instant::now())),
            (None, _) => None,
        };
        let ended = match &s.receipt.outcome {
            Some(rserpool_endpoint::session::Outcome::Closed) => Some("closed".to_string()),
            Some(rserpool_endpoint::session::Outcome::Failed { reason }) => {
                Some(format!("failed: {reason}"))
            }
            None => None,
        };
        crate::csp::pool_user_snapshot(
            object,
            &pool,
            since.map(|(pe, t)| (pe, t.elapsed())),
            s.stats.failovers,
            ended.as_deref(),
            protocol,
            kind.ppid().unwrap_or(0),
        )
    })
}

/// Echo, Discard, Daytime, CharGen: lines from stdin (echo, discard) or what the PE sends.
async fn run_lines(
    mut session: SessionHandle,
    kind: ServiceKind,
    count: Option<u64>,
    quiet: bool,
) -> Result<SessionSnapshot> {
    let mut stdin = BufReader::new(tokio::io::stdin()).lines();
    let mut stdout = tokio::io::stdout();
    let sends = matches!(kind, ServiceKind::Echo | ServiceKind::Discard);
    let mut input_open = sends;
    let (mut sent, mut answered, mut received) = (0u64, 0u64, 0u64);
    let stop = crate::shutdown_signal();
    tokio::pin!(stop);
    loop {
        if !input_open && kind == ServiceKind::Discard {
            break;
        }
        if !input_open && kind == ServiceKind::Echo && answered >= sent {
            break;
        }
        tokio::select! {
            _ = &mut stop => break,
            line = stdin.next_line(), if input_open => match line {
                Ok(Some(line)) => {
                    let mut data = line.into_bytes();
                    data.push(b'\n');
                    // rspterminal writes with PPID 0.
                    session.send(0, 0, data).await.context("sending")?;
                    sent += 1;
                }
                Ok(None) => input_open = false,
                Err(e) => bail!("reading stdin: {e}"),
            },
            ev = session.next_event() => match ev {
                None => break,
                Some(SessionEvent::Data { data, .. }) => {
                    received += 1;
                    answered += 1;
                    if !quiet {
                        stdout.write_all(&data).await?;
                        if kind == ServiceKind::CharGen {
                            stdout.write_all(b"\n").await?;
                        }
                        stdout.flush().await?;
                    }
                    if kind == ServiceKind::Daytime {
                        break;
                    }
                    if kind == ServiceKind::CharGen && count.is_some_and(|c| received >= c) {
                        break;
                    }
                }
                Some(SessionEvent::Failover(f)) => eprintln!("{}", describe(&f)),
                Some(SessionEvent::Failed { reason }) => {
                    eprintln!("session failed: {reason}");
                    break;
                }
                Some(SessionEvent::ProtocolError(e)) => eprintln!("warning: {e}"),
                Some(_) => {}
            },
        }
    }
    Ok(session.close().await)
}

/// PingPong and CalcApp: the service's client drives the session.
async fn run_client(
    mut session: SessionHandle,
    kind: ServiceKind,
    config: &ServiceConfig,
    quiet: bool,
    ts: bool,
) -> Result<SessionSnapshot> {
    let mut client = config.client(kind).context("this service has no client")?;
    let epoch = Instant::now();
    let mut pe = session.opened_pe();
    client.start(now_of(epoch));
    let (mut pongs, mut gaps, mut duplicates, mut resent, mut jobs, mut failovers) =
        (0u64, 0u64, 0u64, 0u64, 0u64, 0u64);
    let stop = crate::shutdown_signal();
    tokio::pin!(stop);
    'run: loop {
        while let Some(out) = client.poll_output() {
            match out {
                ClientOutput::Send { ppid, stream, data } => {
                    // Refused while moving to another PE: the client resends it afterwards.
                    let _ = session.send(ppid, stream, data).await;
                }
                ClientOutput::ClearCookie => session.clear_cookie().await,
                ClientOutput::Failover(reason) => {
                    let reason = match reason {
                        rserpool_services::FailoverReason::NoAnswer => FailoverReason::NoAnswer,
                        rserpool_services::FailoverReason::Rejected => FailoverReason::Rejected,
                        _ => FailoverReason::ProtocolError("the service's protocol".into()),
                    };
                    session.failover_because(reason).await;
                }
                ClientOutput::Report(r) => match r {
                    ClientReport::Pong {
                        message_no,
                        reply_no,
                        rtt,
                    } => {
                        pongs += 1;
                        if !quiet {
                            say(
                                ts,
                                &format!(
                                "Pong #{message_no}: reply {reply_no} from PE {pe}, rtt {:.1} ms",
                                rtt.as_secs_f64() * 1e3
                            ),
                            );
                        }
                    }
                    ClientReport::Gap { previous, reply_no } => {
                        gaps += 1;
                        say(ts, &format!("gap: reply {reply_no} after {previous}"));
                    }
                    ClientReport::DuplicatePong { message_no } => {
                        duplicates += 1;
                        say(ts, &format!("duplicate Pong #{message_no}"));
                    }
                    ClientReport::PingSent {
                        resent: true,
                        message_no,
                    } => {
                        resent += 1;
                        if !quiet {
                            say(ts, &format!("Ping #{message_no} resent"));
                        }
                    }
                    ClientReport::JobCompleted {
                        job_id,
                        job_size,
                        handling_time,
                        failovers,
                    } => {
                        jobs += 1;
                        say(ts, &format!(
                            "job {job_id} completed: {job_size} calculations in {:.3} s, {failovers} failover(s)",
                            handling_time.as_secs_f64()
                        ));
                    }
                    ClientReport::JobRejected { job_id } if !quiet => {
                        say(ts, &format!("job {job_id} rejected by PE {pe}"));
                    }
                    ClientReport::JobAccepted { job_id } if !quiet => {
                        say(ts, &format!("job {job_id} accepted by PE {pe}"));
                    }
                    ClientReport::Ignored(e) => esay(ts, &format!("warning: ignored: {e}")),
                    _ => {}
                },
                ClientOutput::Finished => break 'run,
                _ => {}
            }
        }
        let deadline = client
            .poll_timeout()
            .map(|d| epoch + d)
            .unwrap_or_else(|| Instant::now() + Duration::from_secs(3600));
        tokio::select! {
            _ = &mut stop => break,
            _ = tokio::time::sleep_until(deadline) => client.handle_timeout(now_of(epoch)),
            ev = session.next_event() => match ev {
                None => break,
                Some(SessionEvent::Data { ppid, stream, data }) => {
                    if let Err(e) = client.handle_message(now_of(epoch), ppid, stream, &data) {
                        esay(ts, &format!("warning: PE {pe}: {e}"));
                    }
                }
                Some(SessionEvent::Failover(f)) => {
                    failovers += 1;
                    pe = f.to;
                    esay(ts, &describe(&f));
                    client.failover_complete(now_of(epoch), f.with_cookie);
                }
                Some(SessionEvent::Failed { reason }) => {
                    esay(ts, &format!("session failed: {reason}"));
                    break;
                }
                Some(SessionEvent::Cookie { len }) if kind == ServiceKind::CalcApp && !quiet => {
                    esay(ts, &format!("cookie received from PE {pe} ({len} bytes)"));
                }
                Some(SessionEvent::BusinessCard { pes }) => {
                    let list: Vec<String> = pes.iter().map(|p| p.to_string()).collect();
                    esay(ts, &format!("business card from PE {pe}: {}", list.join(", ")));
                }
                Some(SessionEvent::ProtocolError(e)) => esay(ts, &format!("warning: {e}")),
                Some(_) => {}
            },
        }
    }
    match kind {
        ServiceKind::PingPong => say(ts, &format!(
            "pingpong: {pongs} answered, {resent} resent, {duplicates} duplicate(s), {gaps} gap(s), {failovers} failover(s)"
        )),
        _ => say(ts, &format!("calcapp: {jobs} job(s) completed, {failovers} failover(s)")),
    }
    Ok(session.close().await)
}
