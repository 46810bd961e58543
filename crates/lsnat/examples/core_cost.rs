//! What the core costs per NAT session (adopt, connected, reached, activity, closed), with 64
//! sessions open at a time and two members: nanoseconds per session, printed. A benchmark, not
//! a test. `cargo run --release -p rserpool-lsnat --example core_cost [sessions]`.

use rand::rngs::StdRng;
use rand::SeedableRng;
use rserpool_lsnat::core::member::MemberSpec;
use rserpool_lsnat::core::receipt::Outcome;
use rserpool_lsnat::core::{CoreConfig, FlowKey, Gateway, Protocol, SessionId, Traffic};
use std::collections::VecDeque;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

fn main() {
    let n: u64 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(2_000_000);
    let cfg = rserpool_lsnat::nat::core_config(CoreConfig::default());
    let mut g = Gateway::new(cfg, Box::new(StdRng::seed_from_u64(7)));
    let members = [
        SocketAddr::from(([10, 0, 0, 2], 80)),
        SocketAddr::from(([10, 0, 0, 3], 80)),
    ];
    g.set_members(
        Duration::ZERO,
        members.iter().map(|a| MemberSpec::new(*a)).collect(),
    );
    let mut open: VecDeque<SessionId> = VecDeque::new();
    let traffic = Traffic {
        bytes: 600,
        packets: 6,
    };
    let started = Instant::now();
    for i in 0..n {
        let now = Duration::from_micros(i * 30);
        let flow = FlowKey {
            protocol: Protocol::Tcp,
            client: SocketAddr::from(([10, 1, (i >> 24) as u8, (i >> 16) as u8], i as u16 | 1024)),
            virtual_address: SocketAddr::from(([10, 0, 0, 1], 80)),
        };
        let id = g
            .adopt(
                now,
                flow,
                members[(i % 2) as usize],
                "kernel-map:round-robin",
            )
            .expect("member exists");
        g.connected(now, id);
        g.reached(now, id);
        open.push_back(id);
        if open.len() > 64 {
            let old = open.pop_front().expect("open");
            g.activity(now, old, traffic, traffic);
            g.closed(now, old, Outcome::Closed);
        }
        if i % 1000 == 0 {
            g.poll(now);
        }
    }
    let took = started.elapsed();
    println!(
        "{n} sessions in {:.3} s: {:.0} ns per session",
        took.as_secs_f64(),
        took.as_nanos() as f64 / n as f64
    );
}
