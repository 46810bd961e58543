//! Messages per second and round-trip latency of 100-byte messages over TCP (the mapping) and
//! kernel SCTP, with 1 and 100 associations to one server endpoint on the loopback.
//!
//! `cargo bench -p rserpool-transport --bench transport` (TCP, and SCTP where the kernel has
//! it); `scripts/bench-transport` runs it for SCTP inside the SCTP virtual machine.
//! Environment: BENCH_TRANSPORTS=tcp,sctp (default: both where available),
//! BENCH_MESSAGES (one-way messages per run, default 200000), BENCH_ROUNDTRIPS (per run,
//! default 20000).

use rserpool_transport::{Endpoint, EndpointConfig, Event, TransportChoice};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

const SIZE: usize = 100;
const PPID: u32 = 33;

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn config(choice: TransportChoice, listen: bool) -> EndpointConfig {
    let mut c = if listen {
        EndpointConfig::listening(choice, &["127.0.0.1:0".parse().unwrap()])
    } else {
        EndpointConfig::new(choice)
    };
    c.limits.event_queue = 4096;
    c.limits.send_queue = 4096;
    c.limits.send_timeout = Duration::from_secs(300);
    c
}

/// A server endpoint that echoes (`echo`) or counts messages; returns its address.
async fn server(
    choice: TransportChoice,
    echo: bool,
) -> (SocketAddr, tokio::sync::watch::Receiver<u64>) {
    let mut s = Endpoint::bind(config(choice, true)).await.expect("server");
    let addr = s.local_addrs()[0];
    let (tx, rx) = tokio::sync::watch::channel(0u64);
    tokio::spawn(async move {
        let mut n = 0u64;
        while let Some(e) = s.next_event().await {
            if let Event::Message {
                id,
                ppid,
                stream,
                data,
            } = e
            {
                n += 1;
                if echo {
                    let _ = s.send(id, ppid, stream, data).await;
                } else {
                    tx.send_replace(n);
                }
            }
        }
    });
    (addr, rx)
}

async fn connected(
    choice: TransportChoice,
    addr: SocketAddr,
) -> (Endpoint, rserpool_transport::AssociationId) {
    let mut c = Endpoint::bind(config(choice, false)).await.expect("client");
    let id = c.connect(&[addr]).await.expect("connect");
    match c.next_event().await {
        Some(Event::AssociationUp { .. }) => (c, id),
        e => panic!("association did not come up: {e:?}"),
    }
}

/// One-way throughput: `assocs` clients send `total` messages together; time until the server
/// has received them all.
async fn throughput(choice: TransportChoice, assocs: usize, total: usize) -> f64 {
    let (addr, mut count) = server(choice, false).await;
    let mut clients = Vec::new();
    for _ in 0..assocs {
        clients.push(connected(choice, addr).await);
    }
    let per = total / assocs;
    let total = per * assocs;
    let payload = bytes::Bytes::from(vec![0x42u8; SIZE]);
    let t0 = Instant::now();
    let mut tasks = Vec::new();
    for (c, id) in clients {
        let p = payload.clone();
        tasks.push(tokio::spawn(async move {
            for _ in 0..per {
                c.send(id, PPID, 0, p.clone()).await.expect("send");
            }
            c
        }));
    }
    let mut keep = Vec::new();
    for t in tasks {
        keep.push(t.await.unwrap());
    }
    while (*count.borrow() as usize) < total {
        if tokio::time::timeout(Duration::from_secs(60), count.changed())
            .await
            .is_err()
        {
            panic!("server stalled at {} of {total}", *count.borrow());
        }
    }
    let secs = t0.elapsed().as_secs_f64();
    drop(keep);
    total as f64 / secs
}

/// Round trips: `assocs` clients ping-pong concurrently, `total` round trips in all.
/// Returns (round trips per second, p50, p99).
async fn round_trips(
    choice: TransportChoice,
    assocs: usize,
    total: usize,
) -> (f64, Duration, Duration) {
    let (addr, _) = server(choice, true).await;
    let mut clients = Vec::new();
    for _ in 0..assocs {
        clients.push(connected(choice, addr).await);
    }
    let per = (total / assocs).max(1);
    let t0 = Instant::now();
    let mut tasks = Vec::new();
    for (mut c, id) in clients {
        tasks.push(tokio::spawn(async move {
            let p = bytes::Bytes::from(vec![0x42u8; SIZE]);
            let mut rtts = Vec::with_capacity(per);
            for _ in 0..per {
                let t = Instant::now();
                c.send(id, PPID, 0, p.clone()).await.expect("send");
                loop {
                    match c.next_event().await {
                        Some(Event::Message { .. }) => break,
                        Some(_) => continue,
                        None => panic!("client closed"),
                    }
                }
                rtts.push(t.elapsed());
            }
            rtts
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    let secs = t0.elapsed().as_secs_f64();
    all.sort();
    let pct = |q: f64| all[((all.len() as f64 - 1.0) * q) as usize];
    (all.len() as f64 / secs, pct(0.50), pct(0.99))
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let wanted = std::env::var("BENCH_TRANSPORTS").unwrap_or_else(|_| "tcp,sctp".into());
    let messages = env_usize("BENCH_MESSAGES", 200_000);
    let trips = env_usize("BENCH_ROUNDTRIPS", 20_000);
    println!(
        "rserpool-transport benchmark: {SIZE}-byte messages, loopback, {messages} one-way messages and {trips} round trips per row"
    );
    for name in wanted.split(',').map(str::trim) {
        let choice = match name {
            "tcp" => TransportChoice::Tcp,
            "sctp" => {
                if let Err(e) = rserpool_transport::sctp_available() {
                    println!("sctp: not run (no kernel SCTP: {e})");
                    continue;
                }
                TransportChoice::Sctp
            }
            other => {
                println!("unknown transport {other:?} (tcp, sctp)");
                continue;
            }
        };
        for assocs in [1usize, 100] {
            let mps = rt.block_on(throughput(choice, assocs, messages));
            let (rps, p50, p99) = rt.block_on(round_trips(choice, assocs, trips));
            println!(
                "{name:4} associations={assocs:3}  one-way {mps:>10.0} msg/s   round trips {rps:>8.0}/s  RTT p50 {:>7.1} us  p99 {:>8.1} us",
                p50.as_secs_f64() * 1e6,
                p99.as_secs_f64() * 1e6
            );
        }
    }
}
