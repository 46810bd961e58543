//! Component Status Protocol reports from our daemons (`--csp-server`, `--csp-interval`, as
//! RSPLIB names them): one task per daemon sends a report built by a status closure every
//! interval to a CSP monitor (RSPLIB's `cspmonitor` or `rserpool monitor`) over UDP, and a FINAL
//! report when the daemon stops, so that the monitor forgets it at once.
//!
//! What each report holds follows RSPLIB (rsplib-behaviour.md §4): a registrar reports its
//! registrar ID, "`<PEs>[<owned>] PEs in <n> Pool(s), <m> Peer(s)`" and one association per
//! ENRP peer; a PE its PE ID, pool handle, sessions and load, and its home registrar; a PU a
//! random ID, its pool handle and session state, and the PE it uses.

use crate::units::{human, DurationValue};
use anyhow::{bail, Result};
use rserpool_wire::csp::{
    Association, ComponentId, Report, Workload, CSP_PORT, FLAG_FINAL, PROTOCOL_SCTP, PROTOCOL_TCP,
};
use std::net::SocketAddr;
use std::time::Duration;
use tokio::sync::oneshot;
use tokio::time::Instant;

/// The report interval when only `--csp-server` is given: rspregistrar's.
pub(crate) const DEFAULT_INTERVAL: Duration = Duration::from_millis(250);
/// The shortest interval accepted: more often would flood the monitor.
pub(crate) const MIN_INTERVAL: Duration = Duration::from_millis(10);
/// The longest interval: the report's 32-bit field counts µs.
pub(crate) const MAX_INTERVAL: Duration = Duration::from_micros(u32::MAX as u64);
/// Where reports go when only `--csp-interval` is given: rspregistrar's default.
pub(crate) const DEFAULT_SERVER: &str = "127.0.0.1:2960";

/// Where and how often to report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CspConfig {
    /// The monitor's UDP address.
    pub server: SocketAddr,
    /// Time between reports.
    pub interval: Duration,
}

impl std::fmt::Display for CspConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "to {} every {}", self.server, human(self.interval))
    }
}

/// `ADDR[:PORT]`, port 2960 when left out (addresses, not host names, as every address of the
/// project: a name resolved once goes stale).
pub(crate) fn parse_server(v: &str) -> Result<SocketAddr> {
    let v = v.trim();
    if let Ok(a) = v.parse::<SocketAddr>() {
        return Ok(a);
    }
    v.trim_start_matches('[')
        .trim_end_matches(']')
        .parse()
        .map(|ip| SocketAddr::new(ip, CSP_PORT))
        .map_err(|_| anyhow::anyhow!("csp-server: {v:?} is not ADDR[:PORT] (e.g. 127.0.0.1:2960)"))
}

/// The reporting these options ask for: none without either; `--csp-server` alone reports
/// every 250 ms, `--csp-interval` alone to 127.0.0.1:2960 (both as rspregistrar does). A
/// bare number of the interval is milliseconds, as RSPLIB's `-cspinterval`.
pub(crate) fn config(
    server: Option<&str>,
    interval: Option<DurationValue>,
) -> Result<Option<CspConfig>> {
    if server.is_none() && interval.is_none() {
        return Ok(None);
    }
    let server = parse_server(server.unwrap_or(DEFAULT_SERVER))?;
    let interval = interval.map_or(DEFAULT_INTERVAL, |v| v.duration);
    if !(MIN_INTERVAL..=MAX_INTERVAL).contains(&interval) {
        bail!(
            "csp-interval: {} is not between {} and {}",
            human(interval),
            human(MIN_INTERVAL),
            human(MAX_INTERVAL)
        );
    }
    Ok(Some(CspConfig { server, interval }))
}

/// What the daemon reports now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Snapshot {
    /// The reporter's ID; nothing is sent while its object part is 0 (as RSPLIB).
    pub id: ComponentId,
    /// The status line.
    pub status: String,
    /// The load, or unknown.
    pub workload: Workload,
    /// Associations to registrars and PEs.
    pub associations: Vec<Association>,
}

/// The CSP protocol number of a transport.
pub(crate) fn protocol(kind: rserpool_transport::TransportKind) -> u16 {
    match kind {
        rserpool_transport::TransportKind::Sctp => PROTOCOL_SCTP,
        rserpool_transport::TransportKind::Tcp => PROTOCOL_TCP,
    }
}

/// "hostname: addr, addr" as RSPLIB's reporters fill the location, or "(local only)".
pub(crate) fn location(addrs: &[SocketAddr]) -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .or_else(|_| std::fs::read_to_string("/etc/hostname"))
        .map(|h| h.trim().to_string())
        .unwrap_or_default();
    if addrs.is_empty() {
        return if host.is_empty() {
            "(local only)".into()
        } else {
            format!("{host}: (local only)")
        };
    }
    let list = addrs
        .iter()
        .map(|a| a.to_string())
        .collect::<Vec<_>>()
        .join(", ");
    if host.is_empty() {
        list
    } else {
        format!("{host}: {list}")
    }
}

/// A random 64-bit value (PU IDs), from the standard library's per-process random keys.
pub(crate) fn random_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos(),
    );
    h.write_u32(std::process::id());
    h.finish()
}

/// A running reporter; [`Reporter::finish`] sends the FINAL report.
pub(crate) struct Reporter {
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
}

impl Reporter {
    /// Starts reporting: the first report at once, then one every interval. `status` is
    /// asked for each report.
    pub fn start(
        config: CspConfig,
        location: String,
        mut status: impl FnMut() -> Snapshot + Send + 'static,
    ) -> Reporter {
        let (stop_tx, mut stop_rx) = oneshot::channel();
        let task = tokio::spawn(async move {
            let bind: SocketAddr = if config.server.is_ipv4() {
                (std::net::Ipv4Addr::UNSPECIFIED, 0).into()
            } else {
                (std::net::Ipv6Addr::UNSPECIFIED, 0).into()
            };
            let socket = match tokio::net::UdpSocket::bind(bind).await {
                Ok(s) => s,
                Err(e) => {
                    tracing::warn!(error = %e, "CSP: cannot open a UDP socket; no status reports");
                    return;
                }
            };
            tracing::info!(server = %config.server, interval = %human(config.interval), "CSP: reporting");
            let started = Instant::now();
            let interval_us = u32::try_from(config.interval.as_micros()).unwrap_or(u32::MAX);
            let mut tick = tokio::time::interval(config.interval);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut failing = false;
            let mut last_id = None;
            loop {
                let final_report = tokio::select! {
                    _ = tick.tick() => false,
                    _ = &mut stop_rx => true,
                };
                let report = if final_report {
                    // As RSPLIB: the last ID, the FINAL flag, no text, no associations.
                    let Some(id) = last_id else { return };
                    let mut r = Report::new(id);
                    r.flags = FLAG_FINAL;
                    r.workload = Workload(0);
                    r
                } else {
                    let s = status();
                    if s.id.object() == 0 {
                        continue;
                    }
                    last_id = Some(s.id);
                    let mut r = Report::new(s.id);
                    r.location = location.clone();
                    r.status = s.status;
                    r.workload = s.workload;
                    r.associations = s.associations;
                    r.associations
                        .truncate(rserpool_wire::csp::MAX_ASSOCIATIONS);
                    r
                };
                let mut r = report;
                r.timestamp_us = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX);
                r.interval_us = interval_us;
                let bytes = match r.encode() {
                    Ok(b) => b,
                    Err(e) => {
                        tracing::warn!(error = %e, "CSP: report not sent");
                        continue;
                    }
                };
                match socket.send_to(&bytes, config.server).await {
                    Ok(_) if failing => {
                        failing = false;
                        tracing::info!(server = %config.server, "CSP: reports are sent again");
                    }
                    Ok(_) => {}
                    Err(e) if !failing => {
                        failing = true;
                        tracing::warn!(server = %config.server, error = %e, "CSP: cannot send the status report (said once until it works again)");
                    }
                    Err(e) => {
                        tracing::debug!(server = %config.server, error = %e, "CSP: report not sent")
                    }
                }
                if final_report {
                    return;
                }
            }
        });
        Reporter {
            stop: Some(stop_tx),
            task,
        }
    }

    /// Sends the FINAL report (the monitor forgets this component at once) and stops.
    pub async fn finish(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let _ = tokio::time::timeout(Duration::from_secs(1), &mut self.task).await;
    }
}

impl Drop for Reporter {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// "s" unless there is one.
fn plural(n: u64) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}

/// A registrar's report, from its counters: RSPLIB's status line and one association per
/// ENRP peer (duration unknown, PPID 12).
pub(crate) fn registrar_snapshot(
    id: rserpool_wire::RegistrarId,
    m: &rserpool_registrar::Metrics,
    protocol: u16,
) -> Snapshot {
    let enrp = m.enrp.as_ref();
    let owned = enrp
        .and_then(|e| {
            e.pool_elements_by_home
                .iter()
                .find(|(home, _, _)| *home == id)
                .map(|(_, n, _)| *n)
        })
        .unwrap_or(if enrp.is_some() { 0 } else { m.pool_elements });
    let peers: Vec<_> = enrp
        .map(|e| e.peer_status.iter().map(|p| p.id).collect())
        .unwrap_or_default();
    let n_peers = enrp.map_or(0, |e| e.peers.max(peers.len() as u64));
    Snapshot {
        id: ComponentId::registrar(id),
        status: format!(
            "{}[{owned}] PEs in {} Pool{}, {n_peers} Peer{}",
            m.pool_elements,
            m.pools,
            plural(m.pools),
            plural(n_peers)
        ),
        workload: Workload::UNKNOWN,
        associations: peers
            .into_iter()
            .map(|p| Association {
                receiver: ComponentId::registrar(p),
                duration_us: None,
                flags: 0,
                protocol,
                ppid: 12,
            })
            .collect(),
    }
}

/// A PE's report: "POOL: N Session(s)" (RSPLIB's words after the pool handle), or RSPLIB's
/// "Looking for Registrar ..." while it is not registered; the load where its policy uses one;
/// one association to its home registrar (PPID 11) while registered, up for `home.1`.
pub(crate) fn pool_element_snapshot(
    id: rserpool_wire::PoolElementId,
    pool: &rserpool_wire::PoolHandle,
    home: Option<(rserpool_wire::RegistrarId, Duration)>,
    sessions: u64,
    load: Option<f64>,
    protocol: u16,
) -> Snapshot {
    Snapshot {
        id: ComponentId::pool_element(id),
        status: match home {
            Some(_) => format!("{pool}: {sessions} Session{}", plural(sessions)),
            None => format!("{pool}: Looking for Registrar ..."),
        },
        workload: load.map_or(Workload::UNKNOWN, Workload::from_fraction),
        associations: home
            .filter(|(pr, _)| pr.0 != 0)
            .map(|(pr, up)| Association {
                receiver: ComponentId::registrar(pr),
                duration_us: Some(micros(up)),
                flags: 0,
                protocol,
                ppid: 11,
            })
            .into_iter()
            .collect(),
    }
}

/// A PU's report: "POOL: PE $… (N failover(s))" or what its session does, one association
/// to the PE it is bound to, up for `pe.1`, with the PPID of the service.
pub(crate) fn pool_user_snapshot(
    object: u64,
    pool: &rserpool_wire::PoolHandle,
    pe: Option<(rserpool_wire::PoolElementId, Duration)>,
    failovers: u64,
    ended: Option<&str>,
    protocol: u16,
    ppid: u32,
) -> Snapshot {
    let state = match (ended, pe) {
        (Some(how), _) => how.to_string(),
        (None, Some((pe, _))) => format!(
            "1 Session on PE {pe}, {failovers} failover{}",
            plural(failovers)
        ),
        (None, None) => "1 Session, failing over".to_string(),
    };
    Snapshot {
        id: ComponentId::pool_user(object),
        status: format!("{pool}: {state}"),
        workload: Workload::UNKNOWN,
        associations: pe
            .filter(|_| ended.is_none())
            .map(|(pe, up)| Association {
                receiver: ComponentId::pool_element(pe),
                duration_us: Some(micros(up)),
                flags: 0,
                protocol,
                ppid,
            })
            .into_iter()
            .collect(),
    }
}

/// µs in a duration, saturating.
pub(crate) fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_as_rsplib_reads_them() {
        assert_eq!(config(None, None).unwrap(), None);
        let c = config(Some("127.0.0.1"), None).unwrap().unwrap();
        assert_eq!(c.server, "127.0.0.1:2960".parse().unwrap());
        assert_eq!(c.interval, DEFAULT_INTERVAL);
        let c = config(None, Some("1000".parse().unwrap()))
            .unwrap()
            .unwrap();
        assert_eq!(c.server, DEFAULT_SERVER.parse().unwrap());
        assert_eq!(c.interval, Duration::from_secs(1), "a bare number is ms");
        let c = config(Some("[::1]:4000"), Some("2s".parse().unwrap()))
            .unwrap()
            .unwrap();
        assert_eq!(c.server, "[::1]:4000".parse().unwrap());
        assert_eq!(c.interval, Duration::from_secs(2));
        let e = config(Some("127.0.0.1"), Some("5ms".parse().unwrap()))
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("csp-interval: 5ms is not between"), "{e}");
        let e = config(Some("localhost:2960"), None)
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("csp-server: "), "{e}");
    }

    #[test]
    fn pe_and_pu_reports() {
        let pool = rserpool_wire::PoolHandle::from("EchoPool");
        let pe = rserpool_wire::PoolElementId(0x2a);
        let s = pool_element_snapshot(pe, &pool, None, 0, None, PROTOCOL_TCP);
        assert_eq!(s.status, "EchoPool: Looking for Registrar ...");
        assert!(s.associations.is_empty());
        assert_eq!(s.workload, Workload::UNKNOWN);
        let pr = rserpool_wire::RegistrarId(7);
        let s = pool_element_snapshot(
            pe,
            &pool,
            Some((pr, Duration::from_secs(2))),
            1,
            Some(0.5),
            PROTOCOL_SCTP,
        );
        assert_eq!(s.id.to_string(), "PE $0000002a");
        assert_eq!(s.status, "EchoPool: 1 Session");
        assert_eq!(s.workload, Workload(0x7fff));
        assert_eq!(s.associations[0].receiver.to_string(), "PR $00000007");
        assert_eq!(s.associations[0].duration_us, Some(2_000_000));
        assert_eq!(s.associations[0].ppid, 11);
        let s = pool_user_snapshot(
            5,
            &pool,
            Some((pe, Duration::ZERO)),
            2,
            None,
            PROTOCOL_TCP,
            0,
        );
        assert_eq!(s.id.to_string(), "PU $00000000000005");
        assert_eq!(s.status, "EchoPool: 1 Session on PE $0000002a, 2 failovers");
        assert_eq!(s.associations[0].receiver.to_string(), "PE $0000002a");
        let s = pool_user_snapshot(
            5,
            &pool,
            Some((pe, Duration::ZERO)),
            0,
            Some("closed"),
            PROTOCOL_TCP,
            0,
        );
        assert_eq!(s.status, "EchoPool: closed");
        assert!(s.associations.is_empty());
    }

    #[test]
    fn registrar_status_as_rsplib_words_it() {
        let mut m = rserpool_registrar::Metrics {
            pools: 1,
            pool_elements: 3,
            ..Default::default()
        };
        let id = rserpool_wire::RegistrarId(0x10);
        let s = registrar_snapshot(id, &m, PROTOCOL_TCP);
        assert_eq!(s.status, "3[3] PEs in 1 Pool, 0 Peers");
        assert_eq!(s.id, ComponentId(0x0100_0000_0000_0010));
        assert!(s.associations.is_empty());
        let mut e = rserpool_registrar::enrp::EnrpMetrics {
            peers: 1,
            ..Default::default()
        };
        e.pool_elements_by_home = vec![(id, 2, Default::default())];
        e.peer_status = vec![rserpool_registrar::enrp::PeerStatus {
            id: rserpool_wire::RegistrarId(0x20),
            announced_checksum: Default::default(),
            held_checksum: Default::default(),
            pool_elements: 1,
            sync: "in sync",
        }];
        m.enrp = Some(e);
        let s = registrar_snapshot(id, &m, PROTOCOL_TCP);
        assert_eq!(s.status, "3[2] PEs in 1 Pool, 1 Peer");
        assert_eq!(s.associations.len(), 1);
        assert_eq!(s.associations[0].receiver.to_string(), "PR $00000020");
        assert_eq!(s.associations[0].ppid, 12);
        assert_eq!(s.associations[0].protocol, PROTOCOL_TCP);
    }
}
