//! Active probes: TCP connect (optionally send and expect) or a UDP exchange, each bounded by
//! the probe timeout; results go to the core as liveness evidence.

use super::Shared;
use crate::config::{ProbeConfig, ProbeKind};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpStream, UdpSocket};
use tokio::sync::watch;
use tokio::task::JoinSet;

/// Most bytes read while waiting for `expect`.
const MAX_PROBE_REPLY: usize = 4096;

pub(crate) async fn probe_loop(shared: Arc<Shared>, mut stop: watch::Receiver<bool>) {
    let cfg = shared.config.probe.clone();
    let mut iv = tokio::time::interval(cfg.interval);
    iv.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut running: JoinSet<()> = JoinSet::new();
    loop {
        tokio::select! {
            _ = iv.tick() => {}
            _ = stop.changed() => break,
        }
        // Reap finished probes; a probe still running (timeout > interval) is not doubled.
        while running.try_join_next().is_some() {}
        if !running.is_empty() {
            continue;
        }
        let targets = shared.lock().core.probe_targets();
        for (member, addr) in targets {
            let shared = shared.clone();
            let cfg = cfg.clone();
            running.spawn(async move {
                let target = SocketAddr::new(addr.ip(), cfg.port.unwrap_or(addr.port()));
                let result = probe(&cfg, target).await;
                if let Err(reason) = &result {
                    tracing::debug!(%target, %reason, "probe failed");
                }
                shared.with(|core, now| core.probe_result(now, member, result));
            });
        }
    }
    running.abort_all();
}

/// Runs one probe of `target`.
pub(crate) async fn probe(cfg: &ProbeConfig, target: SocketAddr) -> Result<(), String> {
    match tokio::time::timeout(cfg.timeout, probe_inner(cfg, target)).await {
        Ok(r) => r,
        Err(_) => Err(format!("timed out after {}", crate::human(cfg.timeout))),
    }
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    needle.is_empty() || hay.windows(needle.len()).any(|w| w == needle)
}

async fn probe_inner(cfg: &ProbeConfig, target: SocketAddr) -> Result<(), String> {
    match cfg.kind {
        ProbeKind::None => Ok(()),
        ProbeKind::Tcp => {
            let mut s = TcpStream::connect(target)
                .await
                .map_err(|e| match e.kind() {
                    std::io::ErrorKind::ConnectionRefused => "connection refused".to_string(),
                    _ => e.to_string(),
                })?;
            if !cfg.send.is_empty() {
                s.write_all(&cfg.send)
                    .await
                    .map_err(|e| format!("send: {e}"))?;
            }
            if !cfg.expect.is_empty() {
                let mut got = Vec::new();
                let mut buf = [0u8; 1024];
                while !contains(&got, &cfg.expect) {
                    let n = s.read(&mut buf).await.map_err(|e| format!("read: {e}"))?;
                    if n == 0 {
                        return Err("closed before the expected reply".into());
                    }
                    got.extend_from_slice(&buf[..n]);
                    if got.len() > MAX_PROBE_REPLY {
                        return Err("unexpected reply".into());
                    }
                }
            }
            // Close abortively: a probe should leave no TIME_WAIT behind on either side.
            let _ = socket2::SockRef::from(&s).set_linger(Some(Duration::ZERO));
            Ok(())
        }
        ProbeKind::Udp => {
            let unspecified: IpAddr = if target.is_ipv6() {
                Ipv6Addr::UNSPECIFIED.into()
            } else {
                Ipv4Addr::UNSPECIFIED.into()
            };
            let s = UdpSocket::bind((unspecified, 0))
                .await
                .map_err(|e| e.to_string())?;
            s.connect(target).await.map_err(|e| e.to_string())?;
            s.send(&cfg.send).await.map_err(|e| e.to_string())?;
            let mut buf = vec![0u8; 65_535];
            let n = s.recv(&mut buf).await.map_err(|e| match e.kind() {
                std::io::ErrorKind::ConnectionRefused => "connection refused".to_string(),
                _ => e.to_string(),
            })?;
            if contains(&buf[..n], &cfg.expect) {
                Ok(())
            } else {
                Err("unexpected reply".into())
            }
        }
    }
}
