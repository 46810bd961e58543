//! Memory per PE at one million PEs, counted by a global allocator that tracks the bytes in
//! use (requested sizes; the allocator's own rounding comes on top, see the RSS column).
//!
//! Run: `cargo bench -p rserpool-handlespace --bench memory`.

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use rserpool_handlespace::{AssociationId, Handlespace, HandlespaceConfig, TimerKind};
use rserpool_wire::{
    PoolElement, PoolElementId, PoolHandle, PoolPolicy, RegistrarId, RegistrationLife,
    TransportAddress, TransportUse, UserTransport,
};
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

struct Counting;

static IN_USE: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards every call to the system allocator unchanged and only counts sizes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        IN_USE.fetch_add(layout.size(), Ordering::Relaxed);
        // SAFETY: same layout contract as the caller's.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        IN_USE.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: `ptr` came from `alloc` with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        IN_USE.fetch_add(new_size, Ordering::Relaxed);
        IN_USE.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: forwarded unchanged.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

const N: usize = 1_000_000;

fn rss_kib() -> usize {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
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

fn measure(label: &str, pools: usize, policy: impl Fn(&mut SmallRng) -> PoolPolicy) {
    let mut rng = SmallRng::seed_from_u64(1);
    let handles: Vec<PoolHandle> = (0..pools)
        .map(|p| PoolHandle::from(format!("Pool-{p:05}").as_str()))
        .collect();
    let config = HandlespaceConfig {
        max_pool_elements_per_pool: N,
        max_pool_elements: N,
        ..HandlespaceConfig::default()
    };
    let before = IN_USE.load(Ordering::Relaxed);
    let rss_before = rss_kib();
    let mut hs = Handlespace::new(config);
    let mut element_heap = 0usize;
    for i in 0..N {
        let start = IN_USE.load(Ordering::Relaxed);
        let e = element(0x1000_0000 + i as u32, policy(&mut rng));
        element_heap += IN_USE.load(Ordering::Relaxed) - start;
        let entry = hs
            .register(
                &handles[i % pools],
                e,
                Some(AssociationId((i % 1000) as u64)),
                Duration::ZERO,
            )
            .unwrap()
            .entry();
        hs.set_timer(
            entry,
            TimerKind::Expiry,
            Duration::from_secs(90 + (i % 60) as u64),
        )
        .unwrap();
    }
    let total = IN_USE.load(Ordering::Relaxed) - before;
    let rss = rss_kib().saturating_sub(rss_before) * 1024;
    println!(
        "| {label} | {:.0} | {:.0} | {:.0} | {:.0} |",
        total as f64 / N as f64,
        (total - element_heap) as f64 / N as f64,
        element_heap as f64 / N as f64,
        rss as f64 / N as f64,
    );
    drop(hs);
}

fn main() {
    println!(
        "Bytes per PE with {N} PEs, each with an association and an armed timer \
         (PoolElement inline size {} bytes).\n",
        std::mem::size_of::<PoolElement>()
    );
    println!("| workload | total | handlespace (slab + indexes) | the PE's own address lists | RSS growth |");
    println!("|---|---|---|---|---|");
    measure("1 pool, Round Robin", 1, |_| PoolPolicy::RoundRobin);
    measure("1 pool, Least Used (random loads)", 1, |r| {
        PoolPolicy::LeastUsed { load: r.random() }
    });
    measure("1 pool, Weighted Random", 1, |r| {
        PoolPolicy::WeightedRandom {
            weight: r.random_range(1..=1000),
        }
    });
    measure("10 000 pools × 100, Round Robin", 10_000, |_| {
        PoolPolicy::RoundRobin
    });
}
