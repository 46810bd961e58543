//! Active probes: TCP connect (optionally send and expect) or a UDP exchange, each bounded by
//! the probe timeout; results go to the core as liveness evidence.

use super::Shared;
use crate::config::{ProbeClose, ProbeConfig, ProbeKind};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpStream, UdpSocket};
use tokio::sync::watch;
use tokio::task::JoinSet;

/// Longest wait for the member's own close after a graceful probe's FIN (the probe has passed
/// by then; this only keeps the close polite).
const GRACEFUL_CLOSE_WAIT: Duration = Duration::from_millis(200);

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
            match cfg.close {
                // Abortively: no TIME_WAIT on either side, but a RST the member may log.
                ProbeClose::Reset => {
                    let _ = socket2::SockRef::from(&s).set_linger(Some(Duration::ZERO));
                }
                // As a client would: FIN, then what the member still sends is read (unread
                // data at close would turn the FIN into a RST), for a short while at most.
                // Apart from the probe, which has passed: its timeout does not cover this.
                ProbeClose::Graceful => {
                    tokio::spawn(async move {
                        let _ = s.shutdown().await;
                        let mut buf = [0u8; 1024];
                        let _ = tokio::time::timeout(GRACEFUL_CLOSE_WAIT, async {
                            while matches!(s.read(&mut buf).await, Ok(n) if n > 0) {}
                        })
                        .await;
                    });
                }
            }
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

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::net::TcpListener;

    fn config(close: ProbeClose) -> ProbeConfig {
        ProbeConfig {
            kind: ProbeKind::Tcp,
            interval: Duration::from_secs(1),
            timeout: Duration::from_secs(10),
            port: None,
            send: b"ping\n".to_vec(),
            expect: b"pong".to_vec(),
            close,
        }
    }

    /// What the member's application sees at the end of one probe: `Ok(())` for an ordinary
    /// close (end of file), the error otherwise.
    async fn member_sees(close: ProbeClose) -> std::io::Result<()> {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let target = l.local_addr().unwrap();
        let member = tokio::spawn(async move {
            let (mut s, _) = l.accept().await.unwrap();
            let mut buf = [0u8; 64];
            let n = s.read(&mut buf).await?;
            assert_eq!(&buf[..n], b"ping\n");
            s.write_all(b"pong\n").await?;
            // Until the probe's side closes.
            loop {
                if s.read(&mut buf).await? == 0 {
                    return Ok(());
                }
            }
        });
        probe(&config(close), target)
            .await
            .expect("the probe passes");
        tokio::time::timeout(Duration::from_secs(30), member)
            .await
            .expect("the member sees the close")
            .unwrap()
    }

    #[tokio::test]
    async fn a_graceful_probe_closes_like_a_client_and_a_reset_probe_resets() {
        member_sees(ProbeClose::Graceful)
            .await
            .expect("an ordinary close, nothing for the member to log");
        let e = member_sees(ProbeClose::Reset).await.unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::ConnectionReset);
    }
}
