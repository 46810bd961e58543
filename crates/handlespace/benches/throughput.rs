//! Handlespace throughput in the shape of RSPLIB's measured figures (facts sheet §9):
//! registrations, re-registrations, handle resolutions of 3 PEs by each policy, and
//! deregistrations, at 100 to 100 000 PEs in one pool and 1 000 pools × 100 PEs.
//!
//! Run: `cargo bench -p rserpool-handlespace --bench throughput` (prints a Markdown table;
//! `-- --quick` runs fewer repetitions, `-- --sizes 100,1000` picks pool sizes,
//! `-- --policies LU,LUD` picks policies, `-- --no-multi` skips the 1 000-pool row).

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use rserpool_handlespace::{Handlespace, HandlespaceConfig, Selection};
use rserpool_wire::{
    PoolElement, PoolElementId, PoolHandle, PoolPolicy, RegistrarId, RegistrationLife,
    TransportAddress, TransportUse, UserTransport,
};
use std::hint::black_box;
use std::time::Duration;

const ITEMS: usize = 3;

/// CPU time of this thread, so that time spent descheduled on a shared machine does not
/// count.
#[derive(Clone, Copy)]
struct Instant(Duration);

impl Instant {
    fn now() -> Self {
        Instant(thread_cpu_time())
    }

    fn elapsed(&self) -> Duration {
        thread_cpu_time().saturating_sub(self.0)
    }
}

fn thread_cpu_time() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec into the valid, exclusively borrowed `ts`.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0, "CLOCK_THREAD_CPUTIME_ID unavailable");
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

fn element(id: u32, policy: PoolPolicy) -> PoolElement {
    PoolElement {
        id: PoolElementId(id),
        home_registrar: RegistrarId(0x4b6b_12b3),
        registration_life: RegistrationLife::Finite(Duration::from_secs(90)),
        user_transport: UserTransport::Address(TransportAddress::sctp(
            7,
            TransportUse::DataOnly,
            vec![[10, (id >> 16) as u8, (id >> 8) as u8, id as u8].into()],
        )),
        policy,
        asap_transport: Some(TransportAddress::sctp(
            3863,
            TransportUse::DataOnly,
            vec![[10, (id >> 16) as u8, (id >> 8) as u8, id as u8].into()],
        )),
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Policy {
    RoundRobin,
    Random,
    LeastUsed,
    Lud,
    Wrr,
    Wrand,
    Priority,
    Plu,
    Rlu,
}

impl Policy {
    const ALL: [Policy; 9] = [
        Policy::RoundRobin,
        Policy::Random,
        Policy::LeastUsed,
        Policy::Lud,
        Policy::Wrr,
        Policy::Wrand,
        Policy::Priority,
        Policy::Plu,
        Policy::Rlu,
    ];

    fn name(self) -> &'static str {
        match self {
            Policy::RoundRobin => "RR",
            Policy::Random => "Random",
            Policy::LeastUsed => "LU",
            Policy::Lud => "LUD",
            Policy::Wrr => "WRR",
            Policy::Wrand => "WRAND",
            Policy::Priority => "Priority",
            Policy::Plu => "PLU",
            Policy::Rlu => "RLU",
        }
    }

    /// Policy values as a pool of that kind would have them: random loads, weights 1–10,
    /// priorities 0–3 (ties), LUD and PLU degradation 1 %.
    fn values(self, rng: &mut SmallRng) -> PoolPolicy {
        let load = rng.random::<u32>();
        let degradation = u32::MAX / 100;
        match self {
            Policy::RoundRobin => PoolPolicy::RoundRobin,
            Policy::Random => PoolPolicy::Random,
            Policy::LeastUsed => PoolPolicy::LeastUsed { load },
            Policy::Lud => PoolPolicy::LeastUsedDegradation { load, degradation },
            Policy::Wrr => PoolPolicy::WeightedRoundRobin {
                weight: rng.random_range(1..=10),
            },
            Policy::Wrand => PoolPolicy::WeightedRandom {
                weight: rng.random_range(1..=1000),
            },
            Policy::Priority => PoolPolicy::Priority {
                priority: rng.random_range(0..4),
            },
            Policy::Plu => PoolPolicy::PriorityLeastUsed { load, degradation },
            Policy::Rlu => PoolPolicy::RandomizedLeastUsed { load },
        }
    }
}

/// A workload: `pools` pools of `per_pool` PEs.
#[derive(Clone, Copy)]
struct Shape {
    pools: usize,
    per_pool: usize,
}

impl Shape {
    fn total(self) -> usize {
        self.pools * self.per_pool
    }

    fn label(self) -> String {
        if self.pools == 1 {
            format!("{} PEs in 1 pool", self.per_pool)
        } else {
            format!("{} pools × {} PEs", self.pools, self.per_pool)
        }
    }
}

fn handles(shape: Shape) -> Vec<PoolHandle> {
    (0..shape.pools)
        .map(|p| {
            if shape.pools == 1 {
                PoolHandle::from("EchoPool")
            } else {
                PoolHandle::from(format!("Pool-{p:05}").as_str())
            }
        })
        .collect()
}

/// (pool index, element) in registration order: PEs spread round robin over the pools.
fn elements(shape: Shape, policy: Policy, seed: u64) -> Vec<(usize, PoolElement)> {
    let mut rng = SmallRng::seed_from_u64(seed);
    (0..shape.total())
        .map(|i| {
            (
                i % shape.pools,
                element(0x1000_0000 + i as u32, policy.values(&mut rng)),
            )
        })
        .collect()
}

fn config() -> HandlespaceConfig {
    HandlespaceConfig {
        max_pool_elements_per_pool: 1 << 24,
        max_pool_elements: 1 << 24,
        ..HandlespaceConfig::default()
    }
}

fn populate(shape: Shape, policy: Policy, handles: &[PoolHandle]) -> Handlespace {
    let mut hs = Handlespace::new(config());
    for (p, e) in elements(shape, policy, 1) {
        hs.register(&handles[p], e, None, Duration::ZERO).unwrap();
    }
    hs
}

/// Median of `runs` measurements of operations per second.
fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

/// Registers every PE of `shape` into one handlespace, re-registers them (same values) and
/// deregisters them, in rounds until 200 000 of each have been timed; each phase is timed on
/// its own. The first round grows the storage, later ones reuse it. Each round's PEs are built
/// just before it, as a registrar decodes a PE just before registering it (and as RSPLIB's
/// driver hands over address blocks it keeps in the cache).
fn measure_register(shape: Shape, runs: usize) -> (f64, f64, f64) {
    let handles = handles(shape);
    let rounds = (200_000 / shape.total()).max(1);
    let ops = (rounds * shape.total()) as f64;
    let (mut reg, mut rereg, mut dereg) = (Vec::new(), Vec::new(), Vec::new());
    for run in 0..runs {
        let mut hs = Handlespace::new(config());
        let (mut t_reg, mut t_rereg, mut t_dereg) =
            (Duration::ZERO, Duration::ZERO, Duration::ZERO);
        for r in 0..rounds {
            let fresh = elements(shape, Policy::RoundRobin, (run * rounds + r) as u64);
            let again = fresh.clone();
            let ids: Vec<(usize, PoolElementId)> = fresh.iter().map(|(p, e)| (*p, e.id)).collect();
            let t = Instant::now();
            for (p, e) in fresh {
                black_box(hs.register(&handles[p], e, None, Duration::ZERO).unwrap());
            }
            t_reg += t.elapsed();
            let t = Instant::now();
            for (p, e) in again {
                black_box(
                    hs.register(&handles[p], e, None, Duration::from_secs(1))
                        .unwrap(),
                );
            }
            t_rereg += t.elapsed();
            let t = Instant::now();
            for (p, id) in ids {
                black_box(hs.deregister(&handles[p], id).unwrap());
            }
            t_dereg += t.elapsed();
            assert!(hs.is_empty());
        }
        reg.push(ops / t_reg.as_secs_f64());
        rereg.push(ops / t_rereg.as_secs_f64());
        dereg.push(ops / t_dereg.as_secs_f64());
    }
    (median(reg), median(rereg), median(dereg))
}

fn measure_select(shape: Shape, policy: Policy, runs: usize, budget: Duration) -> f64 {
    let handles = handles(shape);
    let mut hs = populate(shape, policy, &handles);
    let mut rng = SmallRng::seed_from_u64(7);
    let mut selection = Selection::default();
    // Calibrate the batch to the time budget.
    let mut batch = 1_000usize;
    let mut p = 0;
    let mut next_pool = || {
        let current = p;
        p = if p + 1 == shape.pools { 0 } else { p + 1 };
        current
    };
    loop {
        let t = Instant::now();
        for _ in 0..batch {
            hs.select_into(&handles[next_pool()], ITEMS, &mut rng, &mut selection)
                .unwrap();
        }
        if t.elapsed() >= budget / 4 || batch >= 1 << 26 {
            break;
        }
        batch *= 4;
    }
    let mut rates = Vec::new();
    for _ in 0..runs {
        let t = Instant::now();
        for _ in 0..batch {
            hs.select_into(&handles[next_pool()], ITEMS, &mut rng, &mut selection)
                .unwrap();
            black_box(&selection);
        }
        rates.push(batch as f64 / t.elapsed().as_secs_f64());
    }
    assert_eq!(selection.elements.len(), ITEMS.min(shape.per_pool));
    median(rates)
}

/// RSPLIB 3.4.4's figures from the facts sheet §9 (ops/s; lower end of a range).
fn rsplib(shape: Shape, column: &str) -> Option<f64> {
    if shape.pools != 1 {
        return None;
    }
    let row = match shape.per_pool {
        100 => [1.2e6, 6.6e6, 1.7e6, 13.0e6, 7.9e6],
        1_000 => [1.5e6, 6.2e6, 1.2e6, 9.8e6, 5.5e6],
        10_000 => [1.0e6, 2.3e6, 0.6e6, 8.0e6, 3.7e6],
        100_000 => [0.6e6, 2.2e6, 0.18e6, 6.4e6, 2.6e6],
        _ => return None,
    };
    let i = ["register", "RR", "Random", "LU", "LUD"]
        .iter()
        .position(|c| *c == column)?;
    Some(row[i])
}

/// RSPLIB's upper figure where §9 gives a range.
fn rsplib_high(shape: Shape, column: &str) -> Option<f64> {
    if shape.pools != 1 {
        return None;
    }
    match (shape.per_pool, column) {
        (100, "register") => Some(1.6e6),
        (1_000, "register") => Some(1.7e6),
        (10_000, "register") => Some(1.3e6),
        (100_000, "register") => Some(0.9e6),
        (10_000, "RR") => Some(3.7e6),
        (10_000, "Random") => Some(0.7e6),
        _ => rsplib(shape, column),
    }
}

fn cell(shape: Shape, column: &str, rate: f64) -> String {
    match rsplib_high(shape, column) {
        Some(r) => format!("{:.2} M ({:.1}×)", rate / 1e6, rate / r),
        None => format!("{:.2} M", rate / 1e6),
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let quick = args.iter().any(|a| a == "--quick");
    let sizes: Vec<usize> = args
        .iter()
        .position(|a| a == "--sizes")
        .and_then(|i| args.get(i + 1))
        .map(|s| s.split(',').map(|n| n.parse().expect("size")).collect())
        .unwrap_or_else(|| vec![100, 1_000, 10_000, 100_000]);
    let only: Option<Vec<String>> = args
        .iter()
        .position(|a| a == "--policies")
        .and_then(|i| args.get(i + 1))
        .map(|s| s.split(',').map(str::to_owned).collect());
    let runs = if quick { 3 } else { 5 };
    let budget = Duration::from_millis(if quick { 100 } else { 400 });
    let mut shapes: Vec<Shape> = sizes
        .iter()
        .map(|&per_pool| Shape { pools: 1, per_pool })
        .collect();
    if !args.iter().any(|a| a == "--no-multi") {
        shapes.push(Shape {
            pools: 1_000,
            per_pool: 100,
        });
    }

    println!(
        "Millions of operations per CPU-second of the benchmark thread (median of {runs} runs);"
    );
    println!("in parentheses the ratio");
    println!("to RSPLIB 3.4.4's figure in the facts sheet §9 (upper end where it gives a range).");
    println!("Handle resolutions select {ITEMS} PEs.\n");
    let mut header = vec!["workload", "register", "re-register", "deregister"];
    header.extend(Policy::ALL.iter().map(|p| p.name()));
    println!("| {} |", header.join(" | "));
    println!("|{}", "---|".repeat(header.len()));
    for shape in shapes {
        let (reg, rereg, dereg) = measure_register(shape, runs);
        let mut row = vec![
            shape.label(),
            cell(shape, "register", reg),
            cell(shape, "re-register", rereg),
            cell(shape, "deregister", dereg),
        ];
        for policy in Policy::ALL {
            if only
                .as_ref()
                .is_some_and(|o| !o.iter().any(|n| n == policy.name()))
            {
                row.push("–".into());
                continue;
            }
            let rate = measure_select(shape, policy, runs, budget);
            row.push(cell(shape, policy.name(), rate));
        }
        println!("| {} |", row.join(" | "));
    }
}
