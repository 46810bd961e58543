//! What `rserpool monitor` knows: the daemons' status endpoints as last read (Prometheus text,
//! JSON where served) and the CSP reports received, and the panes built from them. The live
//! view and the plain-text snapshot draw the same panes.

use rserpool_wire::csp::{ComponentGroup, ComponentId, Report};
use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::time::Duration;
use tokio::time::Instant;

/// One sample of the Prometheus text format: `name{label="value",...} value`.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Sample {
    /// Metric name.
    pub name: String,
    /// Labels in the order written.
    pub labels: Vec<(String, String)>,
    /// The value.
    pub value: f64,
}

impl Sample {
    /// The value of label `key`.
    pub fn label(&self, key: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

/// Parses the Prometheus text exposition format; lines that do not parse are skipped (and
/// counted).
pub(crate) fn parse_prometheus(text: &str) -> (Vec<Sample>, usize) {
    let mut out = Vec::new();
    let mut bad = 0;
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        match parse_sample(line) {
            Some(s) => out.push(s),
            None => bad += 1,
        }
    }
    (out, bad)
}

fn parse_sample(line: &str) -> Option<Sample> {
    let name_end = line
        .find(|c: char| c == '{' || c.is_whitespace())
        .unwrap_or(line.len());
    let name = &line[..name_end];
    if name.is_empty()
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
    {
        return None;
    }
    let mut rest = &line[name_end..];
    let mut labels = Vec::new();
    if let Some(r) = rest.strip_prefix('{') {
        let mut chars = r.char_indices().peekable();
        loop {
            // Skip separators.
            while let Some(&(_, c)) = chars.peek() {
                if c == ',' || c.is_whitespace() {
                    chars.next();
                } else {
                    break;
                }
            }
            let &(start, c) = chars.peek()?;
            if c == '}' {
                rest = &r[start + 1..];
                break;
            }
            let mut key_end = start;
            while let Some(&(i, c)) = chars.peek() {
                if c == '=' {
                    key_end = i;
                    break;
                }
                chars.next();
            }
            let key = r[start..key_end].trim().to_string();
            chars.next(); // '='
            if chars.next()?.1 != '"' {
                return None;
            }
            let mut value = String::new();
            loop {
                let (_, c) = chars.next()?;
                match c {
                    '"' => break,
                    '\\' => match chars.next()?.1 {
                        'n' => value.push('\n'),
                        other => value.push(other),
                    },
                    other => value.push(other),
                }
            }
            labels.push((key, value));
        }
    }
    let value = rest.split_whitespace().next()?;
    let value = match value {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        v => v.parse().ok()?,
    };
    Some(Sample {
        name: name.to_string(),
        labels,
        value,
    })
}

/// What a status endpoint serves, as far as the monitor can tell from its metric names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SourceKind {
    /// `rserpool registrar`.
    Registrar,
    /// `rserpool pe`.
    PoolElement,
    /// `rserpool lsnat`.
    Gateway,
    /// `rserpool pu` with `--metrics`.
    PoolUser,
    /// Something else serving Prometheus text.
    Other,
}

/// A status endpoint given with `--status`, as last read.
#[derive(Debug, Clone)]
pub(crate) struct Source {
    /// What was given, e.g. `127.0.0.1:9100`.
    pub target: String,
    /// The samples of `/metrics`, when it answered.
    pub metrics: Option<Vec<Sample>>,
    /// The `/status` document, where one is served.
    pub status: Option<serde_json::Value>,
    /// Why the last read failed.
    pub error: Option<String>,
    /// When it was last read successfully.
    pub updated: Option<Instant>,
}

impl Source {
    /// A source not read yet.
    pub fn new(target: String) -> Self {
        Source {
            target,
            metrics: None,
            status: None,
            error: None,
            updated: None,
        }
    }

    /// What it serves.
    pub fn kind(&self) -> SourceKind {
        // Every daemon's /status names it; older ones are told apart by their metric names.
        match self
            .status
            .as_ref()
            .and_then(|d| d.get("component"))
            .and_then(|c| c.as_str())
        {
            Some("registrar") => return SourceKind::Registrar,
            Some("pe") => return SourceKind::PoolElement,
            Some("lsnat") => return SourceKind::Gateway,
            Some("pu") => return SourceKind::PoolUser,
            _ => {}
        }
        let has = |prefix: &str| {
            self.metrics
                .as_ref()
                .is_some_and(|m| m.iter().any(|s| s.name.starts_with(prefix)))
        };
        if has("rserpool_registrar_") {
            SourceKind::Registrar
        } else if has("rserpool_pe_") {
            SourceKind::PoolElement
        } else if has("rserpool_pu_") {
            SourceKind::PoolUser
        } else if has("rserpool_lsnat_") || self.status.is_some() {
            SourceKind::Gateway
        } else {
            SourceKind::Other
        }
    }

    fn samples(&self) -> &[Sample] {
        self.metrics.as_deref().unwrap_or(&[])
    }

    /// The value of the unlabelled metric `name`.
    fn value(&self, name: &str) -> Option<f64> {
        self.samples()
            .iter()
            .find(|s| s.name == name && s.labels.is_empty())
            .map(|s| s.value)
    }

    /// A label of the first sample of `name`.
    fn info(&self, name: &str, label: &str) -> Option<String> {
        self.samples()
            .iter()
            .find(|s| s.name == name)
            .and_then(|s| s.label(label))
            .map(str::to_string)
    }
}

/// A component heard over CSP.
#[derive(Debug, Clone)]
pub(crate) struct CspEntry {
    /// Its last report.
    pub report: Report,
    /// Where that came from.
    pub from: SocketAddr,
    /// When it came.
    pub received: Instant,
}

/// Everything the monitor knows.
#[derive(Debug)]
pub(crate) struct State {
    /// The `--status` endpoints.
    pub sources: Vec<Source>,
    /// Components heard over CSP, by ID.
    pub csp: BTreeMap<ComponentId, CspEntry>,
    /// Where CSP reports are received (None: off).
    pub csp_listen: Option<SocketAddr>,
    /// Reports received.
    pub csp_reports: u64,
    /// Datagrams that were not CSP reports `cspmonitor` would show.
    pub csp_invalid: u64,
    /// Reports of new components ignored because `--max-components` were known.
    pub csp_over_limit: u64,
    /// The last invalid datagram, said.
    pub csp_last_invalid: Option<String>,
    /// Most components kept.
    pub max_components: usize,
    /// A component is forgotten after min(this, 10 × its report interval) without a report.
    pub purge: Duration,
}

impl State {
    /// A state with these endpoints and CSP settings.
    pub fn new(targets: &[String], max_components: usize, purge: Duration) -> Self {
        State {
            sources: targets.iter().cloned().map(Source::new).collect(),
            csp: BTreeMap::new(),
            csp_listen: None,
            csp_reports: 0,
            csp_invalid: 0,
            csp_over_limit: 0,
            csp_last_invalid: None,
            max_components,
            purge,
        }
    }

    /// Takes a datagram received on the CSP socket, as `cspmonitor` does: a FINAL report
    /// forgets its sender, any other report replaces the sender's last one.
    pub fn csp_datagram(&mut self, bytes: &[u8], from: SocketAddr, now: Instant) {
        match Report::decode(bytes) {
            Err(e) => {
                self.csp_invalid += 1;
                self.csp_last_invalid = Some(format!("from {from}: {e}"));
            }
            Ok(r) => {
                self.csp_reports += 1;
                if r.is_final() {
                    self.csp.remove(&r.sender);
                } else if self.csp.contains_key(&r.sender) || self.csp.len() < self.max_components {
                    self.csp.insert(
                        r.sender,
                        CspEntry {
                            report: r,
                            from,
                            received: now,
                        },
                    );
                } else {
                    self.csp_over_limit += 1;
                }
            }
        }
    }

    /// Forgets components silent for min(`purge`, 10 report intervals), but never sooner than
    /// after 1 s (a report interval of 0 would otherwise forget a component at once).
    pub fn purge_csp(&mut self, now: Instant) {
        let purge = self.purge;
        self.csp.retain(|_, e| {
            let limit = purge.min(Duration::from_micros(u64::from(e.report.interval_us)) * 10);
            now.saturating_duration_since(e.received) <= limit.max(Duration::from_secs(1))
        });
    }
}

/// One pane: a title, column names and rows of cells.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Pane {
    /// The title.
    pub title: String,
    /// Column names.
    pub header: Vec<&'static str>,
    /// Rows.
    pub rows: Vec<Vec<String>>,
}

/// A number as an integer when it is one.
fn num(v: Option<f64>) -> String {
    match v {
        Some(v) if v.fract() == 0.0 && v.abs() < 1e15 => format!("{}", v as i64),
        Some(v) => format!("{v}"),
        None => "-".into(),
    }
}

/// Seconds, one decimal.
fn age(d: Duration) -> String {
    format!("{:.1}s", d.as_secs_f64())
}

/// "PR $1deea448" → "$1deea448" (the pane says what it is).
fn short(id: ComponentId) -> String {
    let s = id.to_string();
    s.split_once(' ').map(|(_, r)| r.to_string()).unwrap_or(s)
}

/// Our PEs and PUs begin their CSP status with "POOL: "; RSPLIB's do not name the pool.
fn pool_of_status(status: &str) -> Option<&str> {
    status
        .split_once(": ")
        .map(|(p, _)| p)
        .filter(|p| !p.is_empty())
}

fn http(target: &str) -> String {
    if target.contains("://") {
        target.to_string()
    } else {
        format!("http://{target}")
    }
}

/// What the pools pane says of one pool. A session seen by its PE and by its PU is one
/// session: the two are counted in separate columns, never added.
#[derive(Default)]
struct PoolRow {
    pool_elements: u64,
    sessions_at_pes: u64,
    pool_users: u64,
    seen_by: BTreeSet<String>,
}

/// The panes: registrars, pools, PEs, sessions, counters.
pub(crate) fn panes(state: &State, now: Instant) -> Vec<Pane> {
    let mut registrars: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut pes: Vec<Vec<String>> = Vec::new();
    let mut sessions: Vec<Vec<String>> = Vec::new();
    let mut counters: Vec<Vec<String>> = Vec::new();
    let mut pools: BTreeMap<String, PoolRow> = BTreeMap::new();
    // What registrars' /status say of their pools: (pool, source) → PEs.
    let mut registrar_pools: Vec<(String, String, u64)> = Vec::new();

    for s in &state.sources {
        let src = http(&s.target);
        let status = match (&s.error, s.updated) {
            (Some(e), _) => format!("error: {e}"),
            (None, Some(t)) => format!("read {} ago", age(now.saturating_duration_since(t))),
            (None, None) => "not read yet".into(),
        };
        match s.kind() {
            SourceKind::Registrar => {
                let id = s
                    .info("rserpool_registrar_info", "id")
                    .unwrap_or_else(|| "?".into());
                let owned = s
                    .samples()
                    .iter()
                    .find(|x| {
                        x.name == "rserpool_registrar_enrp_pool_elements_by_home"
                            && x.label("home") == Some(id.as_str())
                    })
                    .map(|x| x.value);
                let has_enrp = s.value("rserpool_registrar_enrp_peers").is_some();
                let total = s.value("rserpool_registrar_pool_elements");
                let owned = owned.or(if has_enrp { Some(0.0) } else { total });
                for p in s
                    .status
                    .as_ref()
                    .and_then(|d| d.get("pools"))
                    .and_then(|p| p.as_array())
                    .map(|v| v.as_slice())
                    .unwrap_or(&[])
                {
                    if let (Some(h), Some(n)) = (
                        p.get("handle").and_then(|h| h.as_str()),
                        p.get("pool_elements").and_then(|n| n.as_u64()),
                    ) {
                        registrar_pools.push((h.to_string(), src.clone(), n));
                    }
                }
                registrars.insert(
                    format!("{id} {src}"),
                    vec![
                        id.clone(),
                        src.clone(),
                        format!("{}[{}]", num(total), num(owned)),
                        num(s.value("rserpool_registrar_pools")),
                        num(s.value("rserpool_registrar_enrp_peers").or(Some(0.0))),
                        num(s.value("rserpool_registrar_associations")),
                        status,
                    ],
                );
            }
            SourceKind::PoolElement => {
                let pool = s
                    .info("rserpool_pe_info", "pool")
                    .unwrap_or_else(|| "?".into());
                let n = s.value("rserpool_pe_sessions").unwrap_or(0.0) as u64;
                let e = pools.entry(pool.clone()).or_default();
                e.pool_elements += 1;
                e.sessions_at_pes += n;
                e.seen_by.insert(src.clone());
                let registered = s.value("rserpool_pe_registered") == Some(1.0);
                pes.push(vec![
                    s.info("rserpool_pe_info", "id")
                        .unwrap_or_else(|| "?".into()),
                    pool,
                    s.info("rserpool_pe_info", "home")
                        .filter(|h| !h.is_empty())
                        .unwrap_or_else(|| "-".into()),
                    s.info("rserpool_pe_info", "load")
                        .unwrap_or_else(|| "-".into()),
                    n.to_string(),
                    src.clone(),
                    if s.error.is_some() {
                        status
                    } else if registered {
                        "registered".into()
                    } else {
                        "looking for a registrar".into()
                    },
                ]);
            }
            SourceKind::Gateway => {
                let doc = s.status.as_ref();
                let members = doc
                    .and_then(|d| d.get("members"))
                    .and_then(|m| m.as_array())
                    .cloned()
                    .unwrap_or_default();
                let pool = format!("gateway {}", s.target.trim_start_matches("http://"));
                let e = pools.entry(pool.clone()).or_default();
                e.pool_elements += members.len() as u64;
                e.sessions_at_pes += doc
                    .and_then(|d| d.get("active_sessions"))
                    .and_then(|v| v.as_u64())
                    .unwrap_or(0);
                e.seen_by.insert(src.clone());
                for m in &members {
                    let text = |k: &str| {
                        m.get(k)
                            .map(|v| match v {
                                serde_json::Value::String(s) => s.clone(),
                                other => other.to_string(),
                            })
                            .unwrap_or_else(|| "-".into())
                    };
                    pes.push(vec![
                        text("key"),
                        pool.clone(),
                        "-".into(),
                        "-".into(),
                        text("sessions"),
                        src.clone(),
                        format!("member {} at {}", text("state"), text("address")),
                    ]);
                }
                for b in doc
                    .and_then(|d| d.get("bindings"))
                    .and_then(|b| b.as_array())
                    .map(|v| v.as_slice())
                    .unwrap_or(&[])
                {
                    let r = b.get("receipt");
                    let get = |v: Option<&serde_json::Value>, k: &str| {
                        v.and_then(|v| v.get(k))
                            .map(|v| match v {
                                serde_json::Value::String(s) => s.clone(),
                                other => other.to_string(),
                            })
                            .unwrap_or_else(|| "-".into())
                    };
                    let bound = r.and_then(|r| r.get("bound"));
                    sessions.push(vec![
                        get(r, "session"),
                        pool.clone(),
                        get(bound, "key"),
                        format!("client {}", get(r, "client")),
                        src.clone(),
                        get(Some(b), "state"),
                    ]);
                }
                if let Some(n) = doc
                    .and_then(|d| d.get("bindings_omitted"))
                    .and_then(|v| v.as_u64())
                    .filter(|n| *n > 0)
                {
                    sessions.push(vec![
                        format!("({n} more)"),
                        pool.clone(),
                        "-".into(),
                        "-".into(),
                        src.clone(),
                        "not listed by the gateway".into(),
                    ]);
                }
            }
            SourceKind::PoolUser => {
                let doc = s.status.as_ref();
                let text = |k: &str| {
                    doc.and_then(|d| d.get(k))
                        .and_then(|v| v.as_str())
                        .map(str::to_string)
                };
                let pool = text("pool")
                    .or_else(|| s.info("rserpool_pu_info", "pool"))
                    .unwrap_or_else(|| "?".into());
                let pe = text("pe")
                    .or_else(|| s.info("rserpool_pu_info", "pe").filter(|p| !p.is_empty()))
                    .unwrap_or_else(|| "-".into());
                let e = pools.entry(pool.clone()).or_default();
                e.pool_users += 1;
                e.seen_by.insert(src.clone());
                sessions.push(vec![
                    "PU".into(),
                    pool,
                    pe,
                    format!(
                        "{} failover(s)",
                        num(s.value("rserpool_pu_failovers_total").or(Some(0.0)))
                    ),
                    src.clone(),
                    if s.error.is_some() {
                        status
                    } else {
                        text("session").unwrap_or_else(|| "open".into())
                    },
                ]);
            }
            SourceKind::Other => {}
        }
        if let Some(e) = &s.error {
            if s.metrics.is_none() {
                counters.push(vec![src.clone(), "error".into(), e.clone()]);
            }
        }
        for x in s.samples() {
            if x.name.ends_with("_total") && x.value != 0.0 {
                let name = x
                    .name
                    .strip_prefix("rserpool_")
                    .unwrap_or(&x.name)
                    .to_string();
                let labels = if x.labels.is_empty() {
                    String::new()
                } else {
                    format!(
                        "{{{}}}",
                        x.labels
                            .iter()
                            .map(|(k, v)| format!("{k}={v}"))
                            .collect::<Vec<_>>()
                            .join(",")
                    )
                };
                counters.push(vec![
                    src.clone(),
                    format!("{name}{labels}"),
                    num(Some(x.value)),
                ]);
            }
        }
    }

    // A registrar knows every PE of its pools, those without an endpoint of their own too.
    for (pool, src, n) in registrar_pools {
        let e = pools.entry(pool).or_default();
        e.pool_elements = e.pool_elements.max(n);
        e.seen_by.insert(src);
    }

    for (id, e) in &state.csp {
        let r = &e.report;
        let src = format!("CSP from {}", e.from);
        let seen = format!(
            "{} (up {}, last {} ago)",
            r.status,
            uptime(r.timestamp_us),
            age(now.saturating_duration_since(e.received))
        );
        let registrar_of = |r: &Report| {
            r.associations
                .iter()
                .find(|a| a.receiver.group() == ComponentGroup::Registrar)
                .map(|a| short(a.receiver))
                .unwrap_or_else(|| "-".into())
        };
        let load = r
            .workload
            .fraction()
            .map(|l| format!("{:.0}%", l * 100.0))
            .unwrap_or_else(|| "-".into());
        match id.group() {
            ComponentGroup::Registrar => {
                let key = short(*id);
                let row = registrars
                    .iter_mut()
                    .find(|(k, _)| k.split(' ').next() == Some(key.as_str()));
                match row {
                    // The same registrar read over HTTP: one row, both sources.
                    Some((_, row)) => {
                        row[1] = format!("{}, {src}", row[1]);
                    }
                    None => {
                        registrars.insert(
                            format!("{key} {src}"),
                            vec![
                                key,
                                src.clone(),
                                "-".into(),
                                "-".into(),
                                r.associations
                                    .iter()
                                    .filter(|a| a.receiver.group() == ComponentGroup::Registrar)
                                    .count()
                                    .to_string(),
                                "-".into(),
                                seen.clone(),
                            ],
                        );
                    }
                }
            }
            ComponentGroup::PoolElement => {
                let key = short(*id);
                // The same PE read over HTTP (our PEs give both): one row, both sources.
                if let Some(row) = pes
                    .iter_mut()
                    .find(|row| row[0] == key && !row[5].contains("CSP"))
                {
                    row[5] = format!("{}, {src}", row[5]);
                    if row[2] == "-" {
                        row[2] = registrar_of(r);
                    }
                    if let Some(p) = pools.get_mut(&row[1]) {
                        p.seen_by.insert("CSP".into());
                    }
                    continue;
                }
                let pool = pool_of_status(&r.status).unwrap_or("?").to_string();
                let e = pools.entry(pool.clone()).or_default();
                e.pool_elements += 1;
                e.seen_by.insert("CSP".into());
                pes.push(vec![
                    short(*id),
                    pool,
                    registrar_of(r),
                    load,
                    "-".into(),
                    src,
                    seen,
                ]);
            }
            ComponentGroup::PoolUser | ComponentGroup::Other(_) => {
                let pool = pool_of_status(&r.status).unwrap_or("?").to_string();
                let e = pools.entry(pool.clone()).or_default();
                e.pool_users += 1;
                e.seen_by.insert("CSP".into());
                let pe = r
                    .associations
                    .iter()
                    .find(|a| a.receiver.group() == ComponentGroup::PoolElement);
                sessions.push(vec![
                    id.to_string(),
                    pool,
                    pe.map(|a| short(a.receiver)).unwrap_or_else(|| "-".into()),
                    pe.and_then(|a| a.duration_us)
                        .map(|d| format!("bound {}", uptime(d)))
                        .unwrap_or_else(|| "-".into()),
                    src,
                    seen,
                ]);
            }
        }
    }
    if let Some(l) = state.csp_listen {
        let src = format!("CSP on {l}");
        counters.push(vec![
            src.clone(),
            "reports".into(),
            state.csp_reports.to_string(),
        ]);
        counters.push(vec![
            src.clone(),
            "components now".into(),
            state.csp.len().to_string(),
        ]);
        if state.csp_invalid > 0 {
            counters.push(vec![
                src.clone(),
                "invalid datagrams".into(),
                format!(
                    "{} (last {})",
                    state.csp_invalid,
                    state.csp_last_invalid.as_deref().unwrap_or("-")
                ),
            ]);
        }
        if state.csp_over_limit > 0 {
            counters.push(vec![
                src,
                "ignored at --max-components".into(),
                state.csp_over_limit.to_string(),
            ]);
        }
    }
    vec![
        Pane {
            title: "Registrars".into(),
            header: vec![
                "Registrar",
                "Source",
                "PEs[own]",
                "Pools",
                "Peers",
                "Assocs",
                "Status",
            ],
            rows: registrars.into_values().collect(),
        },
        Pane {
            title: "Pools".into(),
            header: vec!["Pool", "PEs", "Sessions at PEs", "PUs", "Seen by"],
            rows: pools
                .into_iter()
                .map(|(p, r)| {
                    vec![
                        p,
                        r.pool_elements.to_string(),
                        r.sessions_at_pes.to_string(),
                        r.pool_users.to_string(),
                        r.seen_by.into_iter().collect::<Vec<_>>().join(", "),
                    ]
                })
                .collect(),
        },
        Pane {
            title: "Pool elements".into(),
            header: vec![
                "PE", "Pool", "Home PR", "Load", "Sessions", "Source", "Status",
            ],
            rows: pes,
        },
        Pane {
            title: "Sessions".into(),
            header: vec!["Session", "Pool", "PE", "Detail", "Source", "Status"],
            rows: sessions,
        },
        Pane {
            title: "Receipts and counters".into(),
            header: vec!["Source", "Counter", "Value"],
            rows: counters,
        },
    ]
}

/// µs as h:mm:ss, as `cspmonitor` shows uptimes.
fn uptime(us: u64) -> String {
    let s = us / 1_000_000;
    format!("{}:{:02}:{:02}", s / 3600, (s / 60) % 60, s % 60)
}

/// The panes as plain text: each a title line and a table with aligned columns.
pub(crate) fn render_text(panes: &[Pane]) -> String {
    let mut out = String::new();
    for p in panes {
        out.push_str(&format!("{} ({})\n", p.title, p.rows.len()));
        if p.rows.is_empty() {
            out.push_str("  (none)\n\n");
            continue;
        }
        let mut widths: Vec<usize> = p.header.iter().map(|h| h.chars().count()).collect();
        for r in &p.rows {
            for (i, c) in r.iter().enumerate() {
                if i < widths.len() {
                    widths[i] = widths[i].max(c.chars().count());
                }
            }
        }
        let line = |cells: Vec<&str>| {
            let mut l = String::from(" ");
            for (i, c) in cells.iter().enumerate() {
                l.push(' ');
                l.push_str(c);
                if i + 1 < cells.len() {
                    l.push_str(&" ".repeat(widths[i].saturating_sub(c.chars().count())));
                    l.push(' ');
                }
            }
            l.trim_end().to_string() + "\n"
        };
        out.push_str(&line(p.header.clone()));
        for r in &p.rows {
            out.push_str(&line(r.iter().map(String::as_str).collect()));
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use rserpool_wire::csp::{Association, Workload, FLAG_FINAL, PROTOCOL_SCTP};
    use rserpool_wire::{PoolElementId, RegistrarId};

    #[test]
    fn prometheus_text() {
        let (s, bad) = parse_prometheus(
            "# HELP x y\n# TYPE x counter\nrserpool_registrar_pools 2\n\
             rserpool_registrar_enrp_peer{id=\"$00000002\",sync=\"in \\\"sync\\\"\"} 3\n\
             broken{ 1\nrserpool_x_total{a=\"1\",} 4.5 1700000000\n",
        );
        assert_eq!(bad, 1);
        assert_eq!(s.len(), 3);
        assert_eq!(s[0].name, "rserpool_registrar_pools");
        assert_eq!(s[0].value, 2.0);
        assert_eq!(s[1].label("id"), Some("$00000002"));
        assert_eq!(s[1].label("sync"), Some("in \"sync\""));
        assert_eq!(s[2].value, 4.5);
        assert_eq!(s[2].label("a"), Some("1"));
    }

    #[test]
    fn prometheus_parser_takes_any_text_without_panic() {
        let tricky = "a{b=\"\\\"é\\\\\",c=\"x\"} 1e3 17\nz{=\"\"} 2\né{} +Inf\nq{k=\"v\" 3\n";
        for end in 0..=tricky.len() {
            if tricky.is_char_boundary(end) {
                let _ = parse_prometheus(&tricky[..end]);
            }
        }
        for b in 0u8..=255 {
            let text = format!("m{{a=\"{}\"}} 1", b as char);
            let _ = parse_prometheus(&text);
            let _ = parse_prometheus(&String::from_utf8_lossy(&[b'm', b'{', b, b'}', b' ', b'1']));
        }
        let (s, _) = parse_prometheus("a{b=\"\\\"é\\\\\",c=\"x\"} 1e3 17\n");
        assert_eq!(s[0].label("b"), Some("\"é\\"));
        assert_eq!(s[0].value, 1000.0);
    }

    fn report(id: ComponentId, status: &str, interval_us: u32) -> Report {
        let mut r = Report::new(id);
        r.status = status.into();
        r.interval_us = interval_us;
        r
    }

    #[test]
    fn csp_components_come_and_go_as_in_cspmonitor() {
        let t0 = Instant::now();
        let from: SocketAddr = "127.0.0.1:5000".parse().unwrap();
        let mut st = State::new(&[], 2, Duration::from_secs(30));
        let pr = ComponentId::registrar(RegistrarId(7));
        let mut pe = report(
            ComponentId::pool_element(PoolElementId(9)),
            "EchoPool: 0 Session(s)",
            1_000_000,
        );
        pe.workload = Workload::from_fraction(0.25);
        pe.associations.push(Association {
            receiver: pr,
            duration_us: Some(3_000_000),
            flags: 0,
            protocol: PROTOCOL_SCTP,
            ppid: 11,
        });
        st.csp_datagram(
            &report(pr, "1[1] PEs in 1 Pool, 0 Peers", 250_000)
                .encode()
                .unwrap(),
            from,
            t0,
        );
        st.csp_datagram(&pe.encode().unwrap(), from, t0);
        st.csp_datagram(
            &report(ComponentId::pool_user(1), "x", 1).encode().unwrap(),
            from,
            t0,
        );
        assert_eq!(st.csp.len(), 2, "the third is over --max-components");
        assert_eq!(st.csp_over_limit, 1);
        st.csp_datagram(&[1, 2, 3], from, t0);
        assert_eq!(st.csp_invalid, 1);
        let p = panes(&st, t0);
        assert_eq!(p[0].rows[0][0], "$00000007");
        assert_eq!(p[1].rows[0][0], "EchoPool");
        assert_eq!(p[2].rows[0][0], "$00000009");
        assert_eq!(p[2].rows[0][2], "$00000007", "home registrar");
        assert_eq!(p[2].rows[0][3], "25%");
        let text = render_text(&p);
        assert!(text.contains("Registrars (1)"), "{text}");
        assert!(text.contains("1[1] PEs in 1 Pool, 0 Peers"), "{text}");
        // The registrar reports every 250 ms: silent for 2.6 s, it is forgotten.
        st.purge_csp(t0 + Duration::from_millis(2600));
        assert_eq!(st.csp.len(), 1);
        let mut fin = Report::new(ComponentId::pool_element(PoolElementId(9)));
        fin.flags = FLAG_FINAL;
        st.csp_datagram(&fin.encode().unwrap(), from, t0);
        assert!(st.csp.is_empty(), "FINAL forgets at once");
    }

    #[test]
    fn registrar_pools_and_pool_users_from_status() {
        let mut st = State::new(
            &[
                "127.0.0.1:1".into(),
                "127.0.0.1:2".into(),
                "127.0.0.1:3".into(),
            ],
            10,
            Duration::from_secs(30),
        );
        let now = Instant::now();
        // A registrar whose /status lists two pools; one PE of EchoPool has its own endpoint.
        st.sources[0].metrics =
            Some(parse_prometheus("rserpool_registrar_info{id=\"$0000abcd\"} 1\n").0);
        st.sources[0].status = Some(serde_json::json!({
            "component": "registrar",
            "pools": [
                {"handle": "EchoPool", "pool_elements": 3},
                {"handle": "PingPongPool", "pool_elements": 1},
            ],
        }));
        st.sources[1].metrics = Some(
            parse_prometheus(
                "rserpool_pe_info{id=\"$00000001\",pool=\"EchoPool\",home=\"\",load=\"-\"} 1\n",
            )
            .0,
        );
        // A PU, told apart by its /status although its metrics say nothing yet.
        st.sources[2].status = Some(serde_json::json!({
            "component": "pu", "pool": "PingPongPool", "pe": "$00000002", "session": "open",
        }));
        assert_eq!(st.sources[2].kind(), SourceKind::PoolUser);
        for s in &mut st.sources {
            s.updated = Some(now);
        }
        let p = panes(&st, now);
        let pools = &p[1].rows;
        assert_eq!(
            pools[0][..2],
            ["EchoPool", "3"],
            "the registrar knows 3 PEs"
        );
        assert!(pools[0][4].contains("http://127.0.0.1:1"), "{pools:?}");
        assert_eq!(pools[1][..4], ["PingPongPool", "1", "0", "1"], "{pools:?}");
        assert!(p[3].rows.iter().any(|r| r[0] == "PU"
            && r[1] == "PingPongPool"
            && r[2] == "$00000002"
            && r[5] == "open"));
    }

    #[test]
    fn registrar_and_pe_from_metrics() {
        let mut st = State::new(
            &["127.0.0.1:1".into(), "127.0.0.1:2".into()],
            10,
            Duration::from_secs(30),
        );
        let now = Instant::now();
        st.sources[0].metrics = Some(
            parse_prometheus(
                "rserpool_registrar_info{id=\"$0000abcd\"} 1\nrserpool_registrar_pools 1\n\
                 rserpool_registrar_pool_elements 2\nrserpool_registrar_associations 3\n\
                 rserpool_registrar_registrations_total 2\n",
            )
            .0,
        );
        st.sources[0].updated = Some(now);
        st.sources[1].metrics = Some(
            parse_prometheus(
                "rserpool_pe_info{id=\"$00000001\",pool=\"EchoPool\",home=\"$0000abcd\",load=\"-\"} 1\n\
                 rserpool_pe_registered 1\nrserpool_pe_sessions 4\n",
            )
            .0,
        );
        let p = panes(&st, now);
        assert_eq!(
            p[0].rows[0][..6],
            ["$0000abcd", "http://127.0.0.1:1", "2[2]", "1", "0", "3"]
        );
        assert_eq!(
            p[2].rows[0][..5],
            ["$00000001", "EchoPool", "$0000abcd", "-", "4"]
        );
        assert_eq!(p[1].rows[0][..4], ["EchoPool", "1", "4", "0"]);
        assert!(p[4]
            .rows
            .iter()
            .any(|r| r[1] == "registrar_registrations_total" && r[2] == "2"));
        // The same PE and registrar heard over CSP too: still one row each, both sources.
        let from: SocketAddr = "127.0.0.1:5000".parse().unwrap();
        let mut pe = Report::new(ComponentId::pool_element(PoolElementId(1)));
        pe.status = "EchoPool: 4 Sessions".into();
        pe.interval_us = 1_000_000;
        st.csp_datagram(&pe.encode().unwrap(), from, now);
        let mut pr = Report::new(ComponentId::registrar(RegistrarId(0xabcd)));
        pr.interval_us = 1_000_000;
        st.csp_datagram(&pr.encode().unwrap(), from, now);
        let p = panes(&st, now);
        assert_eq!(p[0].rows.len(), 1);
        assert_eq!(
            p[0].rows[0][1],
            "http://127.0.0.1:1, CSP from 127.0.0.1:5000"
        );
        assert_eq!(p[2].rows.len(), 1);
        assert_eq!(
            p[2].rows[0][5],
            "http://127.0.0.1:2, CSP from 127.0.0.1:5000"
        );
        assert_eq!(
            p[1].rows[0][..4],
            ["EchoPool", "1", "4", "0"],
            "counted once"
        );
    }
}
