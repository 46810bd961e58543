//! `rserpool demo`: a registrar, three pool elements running an echo service and a pool user,
//! all in this process over the TCP mapping on loopback. Shows registration, handle resolution
//! by policy, the echo, and what happens when a PE dies — each fact reported as what it is.

use anyhow::{anyhow, Context, Result};
use rserpool_endpoint::driver::{PoolElementHandle, PoolUserClient, RegistrarAccess};
use rserpool_endpoint::pe::PoolElementConfig;
use rserpool_endpoint::pu::ResolverConfig;
use rserpool_registrar::driver::{run, DriverConfig};
use rserpool_registrar::{AddressScope, Profile, RegistrarConfig, RemovalCause};
use rserpool_transport::TransportChoice;
use rserpool_wire::{PoolHandle, PoolPolicy, TransportAddress, UserTransport};
use std::net::SocketAddr;
use std::time::{Duration, Instant};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};

/// An echo service on loopback; returns its address and the task serving it.
async fn echo_service() -> Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let task = tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let (r, mut w) = stream.into_split();
                let mut lines = BufReader::new(r).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    if w.write_all(format!("{addr} echoes: {line}\n").as_bytes())
                        .await
                        .is_err()
                    {
                        break;
                    }
                }
            });
        }
    });
    Ok((addr, task))
}

/// Sends a line to a PE and reads the answer: "reached" is only claimed when bytes come back.
async fn talk(addr: SocketAddr, line: &str) -> Result<(String, Duration)> {
    let start = Instant::now();
    let mut s = tokio::time::timeout(Duration::from_secs(2), TcpStream::connect(addr))
        .await
        .map_err(|_| anyhow!("connect timed out"))??;
    s.write_all(format!("{line}\n").as_bytes()).await?;
    let mut reply = String::new();
    tokio::time::timeout(
        Duration::from_secs(2),
        BufReader::new(&mut s).read_line(&mut reply),
    )
    .await
    .map_err(|_| anyhow!("no answer"))??;
    Ok((reply.trim_end().to_string(), start.elapsed()))
}

/// Runs the demo.
pub fn demo() -> Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(run_demo())
}

async fn run_demo() -> Result<()> {
    outln!("rserpool demo: a registrar, 3 pool elements (echo service) and a pool user, in one");
    outln!("process, over the TCP mapping on 127.0.0.1.\n");

    let mut core = RegistrarConfig::new(Profile::Rsplib);
    core.min_address_scope = AddressScope::Loopback;
    core.announce = None;
    core.keep_alive_interval = Duration::from_millis(500);
    core.keep_alive_timeout = Duration::from_millis(500);
    let mut config = DriverConfig::new(core);
    config.transport = TransportChoice::Tcp;
    config.asap_listen = vec!["127.0.0.1:0".parse()?];
    let (started_tx, started_rx) = tokio::sync::oneshot::channel();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let registrar = tokio::spawn(run(config, started_tx, async {
        let _ = stop_rx.await;
    }));
    let running = started_rx.await.context("starting the registrar")?;
    let reg_addr = running.asap_addrs[0];
    outln!(
        "1. registrar {} listens on {reg_addr} ({})",
        running.registrar_id,
        running.transport
    );

    let access = RegistrarAccess::single(reg_addr, TransportChoice::Tcp);
    let pool = PoolHandle::from("EchoPool");
    let mut pes = Vec::new();
    for load in [10u32, 50, 90] {
        let (addr, service) = echo_service().await?;
        let policy = PoolPolicy::LeastUsed {
            load: (u64::from(u32::MAX) * u64::from(load) / 100) as u32,
        };
        let mut pe = PoolElementHandle::start(
            PoolElementConfig::new(
                pool.clone(),
                UserTransport::Address(TransportAddress::tcp(addr.port(), addr.ip())),
                policy,
            ),
            access.clone(),
        )
        .await?;
        if !pe.wait_registered(Duration::from_secs(5)).await {
            anyhow::bail!("PE on {addr} did not get registered");
        }
        outln!(
            "2. PE {} registered in {pool}: echo service on {addr}, policy Least Used, load {load}%",
            pe.id()
        );
        pes.push((pe, service, addr));
    }

    let pu = PoolUserClient::start(
        ResolverConfig {
            items: Some(3),
            ..ResolverConfig::default()
        },
        access.clone(),
    )
    .await?;
    let r = pu.resolve(pool.clone()).await?;
    outln!(
        "\n3. pool user resolves {pool}: the registrar selects {} PE(s), least used first",
        r.pool_elements.len()
    );
    for pe in &r.pool_elements {
        outln!("   selected: PE {} — {}", pe.id, pe.policy);
    }
    let first = &r.pool_elements[0];
    let addr = SocketAddr::new(
        first.user_transport.addresses()[0],
        port_of(&first.user_transport),
    );
    let (reply, rtt) = talk(addr, "hello pool").await?;
    outln!(
        "   reached:  PE {} answered in {:.1} ms: {reply:?}",
        first.id,
        rtt.as_secs_f64() * 1e3
    );

    tokio::time::sleep(Duration::from_millis(1200)).await;
    let m = running
        .metrics
        .lock()
        .map(|m| m.clone())
        .unwrap_or_default();
    outln!(
        "   meanwhile the registrar checks its PEs: {} keep-alives sent, {} answered",
        m.keep_alives_sent,
        m.keep_alives_acked
    );

    // The least-loaded PE dies: its service stops and its association is aborted, without a
    // deregistration.
    let (dead_pe, service, dead_addr) = pes.remove(0);
    let dead_id = dead_pe.id();
    service.abort();
    dead_pe.abort().await;
    outln!(
        "\n4. PE {dead_id} crashes (its service on {dead_addr} stops, its association is aborted)"
    );
    let outcome = talk(dead_addr, "anyone?").await;
    outln!(
        "   a session bound to it now: {}",
        match outcome {
            Ok((reply, _)) => format!("answered {reply:?}"),
            Err(e) => format!("lost ({e}) — reported as lost, not as done"),
        }
    );
    let metrics = running.metrics.clone();
    let until = Instant::now() + Duration::from_secs(5);
    while metrics.lock().map(|m| m.pool_elements).unwrap_or(0) > 2 && Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let lost = metrics
        .lock()
        .map(|m| m.removals_by(RemovalCause::AssociationLost))
        .unwrap_or(0);
    outln!("   the registrar removed it (cause: association lost, {lost} so far)");
    let r = pu.resolve(pool.clone()).await?;
    outln!(
        "   a new resolution selects {} PE(s): {}",
        r.pool_elements.len(),
        r.pool_elements
            .iter()
            .map(|p| p.id.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    );
    let first = &r.pool_elements[0];
    let addr = SocketAddr::new(
        first.user_transport.addresses()[0],
        port_of(&first.user_transport),
    );
    let (reply, _) = talk(addr, "hello again").await?;
    outln!("   reached:  PE {}: {reply:?}", first.id);

    let mut leaving = Vec::new();
    for (pe, _, _) in pes.drain(..) {
        leaving.push(pe.id().to_string());
        pe.deregister().await;
    }
    let until = Instant::now() + Duration::from_secs(5);
    while metrics.lock().map(|m| m.pool_elements).unwrap_or(0) > 0 && Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    outln!(
        "   the other PEs stop and deregister: {} (the pool is now empty)",
        leaving.join(", ")
    );
    let m = metrics.lock().map(|m| m.clone()).unwrap_or_default();
    outln!("\n5. the registrar's own counters (each fact counted apart):");
    outln!(
        "   registrations {}, re-registrations {}, handle resolutions {}, PEs handed out {}",
        m.registrations,
        m.reregistrations,
        m.resolutions,
        m.resolved_pool_elements
    );
    outln!(
        "   keep-alives sent {}, answered {}, missed {}",
        m.keep_alives_sent,
        m.keep_alives_acked,
        m.keep_alives_missed
    );
    outln!(
        "   removals: deregistered {}, association lost {}, keep-alive timeout {}, reported unreachable {}",
        m.removals_by(RemovalCause::Deregistered),
        m.removals_by(RemovalCause::AssociationLost),
        m.removals_by(RemovalCause::KeepAliveTimeout),
        m.removals_by(RemovalCause::UnreachableReports)
    );
    let _ = stop_tx.send(());
    registrar.await??;
    outln!("\ndemo done. Next: `rserpool registrar --help`, `rserpool resolve --help`,");
    outln!("`rserpool decode` (RSPLIB's own traffic decoded).");
    Ok(())
}

fn port_of(t: &UserTransport) -> u16 {
    t.as_address().map(|a| a.port).unwrap_or(0)
}
