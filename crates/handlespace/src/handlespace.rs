//! The handlespace: pools of PE entries and every index over them.
//!
//! Storage: PE entries live in one slab (a `Vec` of slots reused through a free list) and are
//! named by [`EntryId`] (slot index plus a generation, so a stale id is detected, never
//! misread). Each entry is split in two: a cold part (the [`PoolElement`], owner and association
//! links, times) and a 64-byte hot record holding everything a selection reads or writes, so
//! that each PE a selection returns costs one cache line. Pools live in a second slab. Every
//! index links entries by their 32-bit slot index, so a PE costs no allocation of its own
//! beyond what its [`PoolElement`] holds.
//!
//! Indexes, each kept in step by every operation and cross-checked by [`Handlespace::verify`]:
//!
//! | index | structure | cost |
//! |---|---|---|
//! | pool by handle | `BTreeMap<PoolHandle, pool>` | O(log P) |
//! | PE by pool and identifier | per pool `BTreeMap<PoolElementId, entry>` | O(log n) |
//! | selection order (ordered policies) | per pool sorted chunks of (sort key, FIFO list) (`chunked`) through the hot records | O(log k) per key change, O(1) per returned PE otherwise; k = distinct keys |
//! | selection weights (randomized policies) | per pool Fenwick tree over dense slots | O(log n) per draw and weight change |
//! | uniform draw (Random) | per pool dense slot array, partial Fisher–Yates | O(1) per returned PE |
//! | by owner (home registrar) | `BTreeMap<RegistrarId, list>` + intrusive list, with the checksum word sum | O(log owners) |
//! | by association | `BTreeMap<AssociationId, list>` + intrusive list | O(log associations) |
//! | timers | 4-ary min-heap with positions | O(log n), next due O(1) |
//!
//! Only ordered structures are used for lookups (`BTreeMap`s, and sorted arrays indexed by a
//! `BTreeMap`): iteration order is deterministic (simulations replay exactly) and keys chosen by
//! a peer cannot degrade them the way colliding hash keys can.
//!
//! The walk along an ordered pool's selection order reads each PE's hot record in key order,
//! which is unrelated to where the records lie in memory; in a pool too large for the caches
//! every selection fetches the record of the PE the next selection will return first, so that
//! it arrives while the current one completes.

use crate::checksum::{element_words, finish};
use crate::chunked::ChunkedMap;
use crate::fenwick::Fenwick;
use crate::policy::{self, Kind};
use crate::timer::{TimerHeap, TimerKind};
use crate::{Error, HandlespaceConfig, VerifyError};
use rand::Rng;
use rserpool_wire::{
    ParameterType, PeChecksum, PolicyType, PoolElement, PoolElementId, PoolHandle, PoolPolicy,
    RegistrarId, TransportUse,
};
use std::collections::{btree_map, BTreeMap};
use std::fmt;
use std::ops::Bound;
use std::time::Duration;

const NIL: u32 = u32::MAX;

/// The association (SCTP) or connection (TCP) a PE registered over, as the registrar numbers
/// them (the transport's id type). When it is lost, [`Handlespace::remove_association`] removes
/// its PEs.
pub use rserpool_wire::AssociationId;

/// Names one PE entry of a [`Handlespace`] for O(1) access. It stays valid until the PE is
/// removed; after that, operations given it fail with [`Error::StaleEntry`] (or return `None`),
/// even if the slot is reused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct EntryId {
    index: u32,
    generation: u32,
}

/// What [`Handlespace::register`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Registration {
    /// A new PE entry (and, if it is the pool's first PE, a new pool).
    New(EntryId),
    /// Re-registration of a known PE identifier: the entry now holds the new values, its LUD
    /// counter is reset, and `previous` is what it held before.
    Updated {
        /// The entry, unchanged.
        entry: EntryId,
        /// The PE as it was registered before.
        previous: PoolElement,
    },
}

impl Registration {
    /// The entry registered or updated.
    pub fn entry(&self) -> EntryId {
        match self {
            Registration::New(e) => *e,
            Registration::Updated { entry, .. } => *entry,
        }
    }

    /// Whether a new entry was created.
    pub fn is_new(&self) -> bool {
        matches!(self, Registration::New(_))
    }
}

/// A PE taken out of the handlespace, with what a registrar needs to report it. Operations
/// whose caller may not know the pool return its handle beside this.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemovedElement {
    /// The id it had (now stale).
    pub entry: EntryId,
    /// The PE as registered.
    pub element: PoolElement,
    /// The association it was registered over.
    pub association: Option<AssociationId>,
}

/// A pending PE timer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timer {
    /// The PE.
    pub entry: EntryId,
    /// What the timer is for.
    pub kind: TimerKind,
    /// When it is due (same epoch as the `now` values given to the handlespace).
    pub deadline: Duration,
}

/// A registrar that owns PEs: how many and their PE checksum (RFC 5353 §3.6.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OwnerSummary {
    /// The home registrar.
    pub owner: RegistrarId,
    /// Number of PEs it owns.
    pub elements: usize,
    /// Checksum over its PEs.
    pub checksum: PeChecksum,
}

/// What a selected PE was chosen on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SelectionBasis {
    /// Ordered policy: the PE's sort key at selection time (lower first; ties in round-robin
    /// order). The key is 0 for Round Robin, the round for Weighted Round Robin,
    /// 0xffffffff − priority for Priority, and the (degraded, penalised) load otherwise.
    Rank {
        /// The sort key.
        key: u64,
    },
    /// Random: a uniform draw among `candidates` PEs not yet chosen in this selection.
    Uniform {
        /// PEs the draw was among.
        candidates: usize,
    },
    /// Weighted draw: chosen with probability `weight / total`, `total` being the weight of
    /// the PEs not yet chosen in this selection.
    Weighted {
        /// The PE's draw weight.
        weight: u64,
        /// Total weight of the draw.
        total: u64,
    },
}

/// One PE returned by a selection, with the inputs of the choice.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SelectedElement {
    /// The entry (to read its transport addresses for the response).
    pub entry: EntryId,
    /// The PE identifier.
    pub id: PoolElementId,
    /// The PE's policy values (load, weight, priority, degradation, distance) as registered.
    pub policy: PoolPolicy,
    /// Times the PE had been selected before this selection.
    pub selection_count: u64,
    /// The LUD counter before this selection (selections since the last registration that
    /// degraded it).
    pub degradation_count: u32,
    /// What the choice was based on.
    pub basis: SelectionBasis,
}

/// The outcome of one policy selection: which PEs, in order, and what the choice was based on.
/// Selection is not binding: nothing here says a PE was reached.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Selection {
    /// The pool's policy.
    pub policy: PolicyType,
    /// PEs in the pool at selection time (the candidates).
    pub pool_size: usize,
    /// The chosen PEs, best first, without duplicates.
    pub elements: Vec<SelectedElement>,
}

impl Default for Selection {
    fn default() -> Self {
        Selection {
            policy: PolicyType(0),
            pool_size: 0,
            elements: Vec::new(),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Link {
    prev: u32,
    next: u32,
}

impl Link {
    const NONE: Link = Link {
        prev: NIL,
        next: NIL,
    };
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct ListHead {
    head: u32,
    tail: u32,
    len: u32,
}

impl ListHead {
    const EMPTY: ListHead = ListHead {
        head: NIL,
        tail: NIL,
        len: 0,
    };
}

impl Default for ListHead {
    fn default() -> Self {
        ListHead::EMPTY
    }
}

/// The cold part of a PE entry: what registration, owners, associations and lookups use.
#[derive(Debug, Clone)]
struct Entry {
    element: PoolElement,
    pool: u32,
    association: Option<AssociationId>,
    registered_at: Duration,
    updated_at: Duration,
    /// Checksum word sum of this PE (pool handle and identifier).
    words: u64,
    unreachability_reports: u32,
    /// Bumped whenever `element` changes (re-registration, new home registrar).
    revision: u32,
    owner: Link,
    assoc: Link,
}

/// The hot part of a PE entry: everything a selection reads or writes, in one cache line, so
/// that each returned PE costs one memory access however large the pool.
#[derive(Debug, Clone, Copy)]
#[repr(align(64))]
struct Hot {
    /// Ordered pools: the sort key. Weighted pools: the draw weight.
    key: u64,
    selection_count: u64,
    /// Ordered pools: neighbours in the key's FIFO list.
    sel: Link,
    id: PoolElementId,
    /// Bumped when the slot is freed, so that stale [`EntryId`]s are detected.
    generation: u32,
    degradation_count: u32,
    /// Weighted round robin: selections left in the current round.
    wrr_credit: u32,
    /// Ordered pools: 0. Other pools: the entry's slot. `NIL` for a free slot.
    place: u32,
    /// The policy's value fields in wire order (a mirror of the element's policy).
    values: [u32; 4],
}

impl Hot {
    const FREE: Hot = Hot {
        key: 0,
        selection_count: 0,
        sel: Link::NONE,
        id: PoolElementId(0),
        generation: 0,
        degradation_count: 0,
        wrr_credit: 0,
        place: NIL,
        values: [0; 4],
    };
}

#[derive(Debug, Clone)]
enum SelIndex {
    /// Sort key to the FIFO list of the entries with that key, in selection order.
    Ordered(ChunkedMap<ListHead>),
    Uniform(Vec<u32>),
    Weighted(Fenwick),
}

#[derive(Debug, Clone)]
struct Pool {
    handle: PoolHandle,
    policy: PolicyType,
    /// The policy type as a dense code.
    shape: Shape,
    kind: Kind,
    transport_type: ParameterType,
    transport_use: TransportUse,
    by_id: BTreeMap<PoolElementId, u32>,
    index: SelIndex,
}

#[derive(Debug, Clone, Copy)]
struct Owner {
    list: ListHead,
    words: u64,
}

/// The handlespace a registrar keeps: pools under pool handles, PE entries, and the indexes
/// and checksums that let it answer registrations, handle resolutions, audits and takeovers
/// quickly. No I/O, no clock (time comes in as a `Duration` since any fixed epoch), no global
/// randomness (selection takes an RNG).
#[derive(Clone)]
pub struct Handlespace {
    config: HandlespaceConfig,
    slots: Vec<Option<Entry>>,
    hot: Vec<Hot>,
    free: Vec<u32>,
    len: usize,
    pools: Vec<Option<Pool>>,
    free_pools: Vec<u32>,
    pool_index: BTreeMap<PoolHandle, u32>,
    owners: BTreeMap<RegistrarId, Owner>,
    associations: BTreeMap<AssociationId, ListHead>,
    timers: TimerHeap,
}

impl fmt::Debug for Handlespace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Handlespace")
            .field("pools", &self.pool_index.len())
            .field("pool_elements", &self.len)
            .field("owners", &self.owners.len())
            .field("associations", &self.associations.len())
            .field("timers", &self.timers.len())
            .finish()
    }
}

impl Default for Handlespace {
    fn default() -> Self {
        Handlespace::new(HandlespaceConfig::default())
    }
}

#[inline]
fn live(slots: &[Option<Entry>], i: u32) -> &Entry {
    slots[i as usize]
        .as_ref()
        .expect("index names a live entry")
}

#[inline]
fn live_mut(slots: &mut [Option<Entry>], i: u32) -> &mut Entry {
    slots[i as usize]
        .as_mut()
        .expect("index names a live entry")
}

type LinkOf = fn(&mut Entry) -> &mut Link;

fn owner_link(e: &mut Entry) -> &mut Link {
    &mut e.owner
}
fn assoc_link(e: &mut Entry) -> &mut Link {
    &mut e.assoc
}

#[inline]
fn push_back(slots: &mut [Option<Entry>], list: &mut ListHead, i: u32, link: LinkOf) {
    let tail = list.tail;
    *link(live_mut(slots, i)) = Link {
        prev: tail,
        next: NIL,
    };
    if tail == NIL {
        list.head = i;
    } else {
        link(live_mut(slots, tail)).next = i;
    }
    list.tail = i;
    list.len += 1;
}

#[inline]
fn unlink(slots: &mut [Option<Entry>], list: &mut ListHead, i: u32, link: LinkOf) {
    let Link { prev, next } = *link(live_mut(slots, i));
    if prev == NIL {
        list.head = next;
    } else {
        link(live_mut(slots, prev)).next = next;
    }
    if next == NIL {
        list.tail = prev;
    } else {
        link(live_mut(slots, next)).prev = prev;
    }
    *link(live_mut(slots, i)) = Link::NONE;
    list.len -= 1;
}

#[inline]
fn sel_push_back(hot: &mut [Hot], list: &mut ListHead, i: u32) {
    let tail = list.tail;
    hot[i as usize].sel = Link {
        prev: tail,
        next: NIL,
    };
    if tail == NIL {
        list.head = i;
    } else {
        hot[tail as usize].sel.next = i;
    }
    list.tail = i;
    list.len += 1;
}

#[inline]
fn sel_unlink(hot: &mut [Hot], list: &mut ListHead, i: u32) {
    let Link { prev, next } = hot[i as usize].sel;
    if prev == NIL {
        list.head = next;
    } else {
        hot[prev as usize].sel.next = next;
    }
    if next == NIL {
        list.tail = prev;
    } else {
        hot[next as usize].sel.prev = prev;
    }
    hot[i as usize].sel = Link::NONE;
    list.len -= 1;
}

/// A selectable policy type as a dense code, so that turning an entry's mirrored values back
/// into its policy ([`unpack`]) is a single jump.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Shape {
    RoundRobin,
    Random,
    WeightedRoundRobin,
    WeightedRandom,
    Priority,
    LeastUsed,
    RandomizedLeastUsed,
    LeastUsedDegradation,
    PriorityLeastUsed,
    RandomizedPriorityLeastUsed,
    RandomizedLeastUsedDegradation,
    PriorityLeastUsedDegradation,
    RandomizedPriorityLeastUsedDegradation,
    WeightedRandomDpf,
    LeastUsedDpf,
    LeastUsedDegradationDpf,
    PriorityLeastUsedDpf,
    PriorityLeastUsedDegradationDpf,
}

impl Shape {
    fn of(policy: PolicyType) -> Option<Shape> {
        Some(match policy {
            PolicyType::ROUND_ROBIN => Shape::RoundRobin,
            PolicyType::RANDOM => Shape::Random,
            PolicyType::WEIGHTED_ROUND_ROBIN => Shape::WeightedRoundRobin,
            PolicyType::WEIGHTED_RANDOM => Shape::WeightedRandom,
            PolicyType::PRIORITY => Shape::Priority,
            PolicyType::LEAST_USED => Shape::LeastUsed,
            PolicyType::RANDOMIZED_LEAST_USED => Shape::RandomizedLeastUsed,
            PolicyType::LEAST_USED_DEGRADATION => Shape::LeastUsedDegradation,
            PolicyType::PRIORITY_LEAST_USED => Shape::PriorityLeastUsed,
            PolicyType::RANDOMIZED_PRIORITY_LEAST_USED => Shape::RandomizedPriorityLeastUsed,
            PolicyType::RANDOMIZED_LEAST_USED_DEGRADATION => Shape::RandomizedLeastUsedDegradation,
            PolicyType::PRIORITY_LEAST_USED_DEGRADATION => Shape::PriorityLeastUsedDegradation,
            PolicyType::RANDOMIZED_PRIORITY_LEAST_USED_DEGRADATION => {
                Shape::RandomizedPriorityLeastUsedDegradation
            }
            PolicyType::WEIGHTED_RANDOM_DPF => Shape::WeightedRandomDpf,
            PolicyType::LEAST_USED_DPF => Shape::LeastUsedDpf,
            PolicyType::LEAST_USED_DEGRADATION_DPF => Shape::LeastUsedDegradationDpf,
            PolicyType::PRIORITY_LEAST_USED_DPF => Shape::PriorityLeastUsedDpf,
            PolicyType::PRIORITY_LEAST_USED_DEGRADATION_DPF => {
                Shape::PriorityLeastUsedDegradationDpf
            }
            _ => return None,
        })
    }
}

/// The policy of a pool's shape with the values an entry mirrors (the inverse of [`PoolPolicy::fields`]).
#[inline]
fn unpack(shape: Shape, v: &[u32; 4]) -> PoolPolicy {
    use PoolPolicy::*;
    let [a, b, c, d] = *v;
    match shape {
        Shape::RoundRobin => RoundRobin,
        Shape::Random => Random,
        Shape::WeightedRoundRobin => WeightedRoundRobin { weight: a },
        Shape::WeightedRandom => WeightedRandom { weight: a },
        Shape::Priority => Priority { priority: a },
        Shape::LeastUsed => LeastUsed { load: a },
        Shape::RandomizedLeastUsed => RandomizedLeastUsed { load: a },
        Shape::LeastUsedDegradation => LeastUsedDegradation {
            load: a,
            degradation: b,
        },
        Shape::PriorityLeastUsed => PriorityLeastUsed {
            load: a,
            degradation: b,
        },
        Shape::RandomizedPriorityLeastUsed => RandomizedPriorityLeastUsed {
            load: a,
            degradation: b,
        },
        Shape::RandomizedLeastUsedDegradation => RandomizedLeastUsedDegradation {
            load: a,
            degradation: b,
        },
        Shape::PriorityLeastUsedDegradation => PriorityLeastUsedDegradation {
            load: a,
            degradation: b,
        },
        Shape::RandomizedPriorityLeastUsedDegradation => RandomizedPriorityLeastUsedDegradation {
            load: a,
            degradation: b,
        },
        Shape::WeightedRandomDpf => WeightedRandomDpf {
            weight: a,
            weight_dpf: b,
            distance: c,
        },
        Shape::LeastUsedDpf => LeastUsedDpf {
            load: a,
            load_dpf: b,
            distance: c,
        },
        Shape::LeastUsedDegradationDpf => LeastUsedDegradationDpf {
            load: a,
            degradation: b,
            load_dpf: c,
            distance: d,
        },
        Shape::PriorityLeastUsedDpf => PriorityLeastUsedDpf {
            load: a,
            degradation: b,
            load_dpf: c,
            distance: d,
        },
        Shape::PriorityLeastUsedDegradationDpf => PriorityLeastUsedDegradationDpf {
            load: a,
            degradation: b,
            load_dpf: c,
            distance: d,
        },
    }
}

/// Takes an entry out of its key's list; drops the list when it empties.
fn group_unlink(order: &mut ChunkedMap<ListHead>, hot: &mut [Hot], i: u32) {
    let h = &mut hot[i as usize];
    if h.sel == Link::NONE {
        // Alone under its key.
        order.remove(h.key);
    } else {
        let list = order.get_mut(h.key).expect("entry's key has a list");
        sel_unlink(hot, list, i);
    }
    hot[i as usize].place = NIL;
}

/// Appends an entry to the list of `key`, creating it if needed.
fn group_push_back(order: &mut ChunkedMap<ListHead>, hot: &mut [Hot], i: u32, key: u64) {
    hot[i as usize].sel = Link::NONE;
    order.insert_or_update(
        key,
        || ListHead {
            head: i,
            tail: i,
            len: 1,
        },
        |list| sel_push_back(hot, list, i),
    );
    let h = &mut hot[i as usize];
    h.place = 0;
    h.key = key;
}

/// Puts an entry at the back of the list for `new_key` (its own list if the key is the same):
/// it has just been selected, or its key changed. Needs no lookup when the entry stays under
/// its key and is already last there.
#[inline]
fn move_to_back(order: &mut ChunkedMap<ListHead>, hot: &mut [Hot], i: u32, new_key: u64) {
    let (key, next) = (hot[i as usize].key, hot[i as usize].sel.next);
    if key == new_key {
        if next != NIL {
            let list = order.get_mut(new_key).expect("entry's key has a list");
            sel_unlink(hot, list, i);
            sel_push_back(hot, list, i);
        }
    } else {
        group_unlink(order, hot, i);
        group_push_back(order, hot, i, new_key);
    }
}

fn sel_insert(index: &mut SelIndex, shape: Shape, hot: &mut [Hot], i: u32) {
    let h = &mut hot[i as usize];
    let policy = unpack(shape, &h.values);
    match index {
        SelIndex::Ordered(order) => {
            // A new weighted-round-robin PE joins the current (lowest) round.
            let round = order.first_key().unwrap_or(0);
            let key = policy::order_key(&policy, h.degradation_count, round);
            group_push_back(order, hot, i, key);
        }
        SelIndex::Uniform(v) => {
            h.place = v.len() as u32;
            v.push(i);
        }
        SelIndex::Weighted(f) => {
            let w = policy::draw_weight(&policy, h.degradation_count);
            h.key = w;
            h.place = f.push(i, w) as u32;
        }
    }
}

fn sel_remove(index: &mut SelIndex, hot: &mut [Hot], i: u32) {
    match index {
        SelIndex::Ordered(order) => group_unlink(order, hot, i),
        SelIndex::Uniform(v) => {
            let slot = hot[i as usize].place as usize;
            v.swap_remove(slot);
            if let Some(&moved) = v.get(slot) {
                hot[moved as usize].place = slot as u32;
            }
        }
        SelIndex::Weighted(f) => {
            let slot = hot[i as usize].place as usize;
            if let Some(moved) = f.swap_remove(slot) {
                hot[moved as usize].place = slot as u32;
            }
        }
    }
    hot[i as usize].place = NIL;
}

/// Re-sorts or re-weighs an entry after its policy values or counters changed.
fn sel_rekey(index: &mut SelIndex, shape: Shape, hot: &mut [Hot], i: u32) {
    let h = hot[i as usize];
    let policy = unpack(shape, &h.values);
    match index {
        SelIndex::Ordered(order) => {
            // For weighted round robin the key is the round, which a new weight keeps.
            let key = policy::order_key(&policy, h.degradation_count, h.key);
            if key != h.key {
                move_to_back(order, hot, i, key);
            }
        }
        SelIndex::Uniform(_) => {}
        SelIndex::Weighted(f) => {
            let w = policy::draw_weight(&policy, h.degradation_count);
            if w != h.key {
                hot[i as usize].key = w;
                f.set(h.place as usize, w);
            }
        }
    }
}

/// Advances the policy state of a PE an ordered selection returned: its WRR credit or LUD
/// counter. Returns its key and the key it moves to.
#[inline]
fn advance_ordered(
    h: &mut Hot,
    chosen: &SelectedElement,
    weighted_round_robin: bool,
    degrades: bool,
) -> (u64, u64) {
    let key = h.key;
    let new_key = if weighted_round_robin {
        h.wrr_credit -= 1;
        if h.wrr_credit == 0 {
            h.wrr_credit = chosen.policy.weight().unwrap_or(1).max(1);
            key + 1
        } else {
            key
        }
    } else if degrades {
        h.degradation_count = h.degradation_count.saturating_add(1);
        policy::order_key(&chosen.policy, h.degradation_count, 0)
    } else {
        key
    };
    (key, new_key)
}

/// Ordered pools from this size on (64 KiB of hot records) fetch ahead the hot records the
/// next selection will read.
const PREFETCH_POOL_SIZE: usize = 1024;

/// Asks the CPU to bring the cache line of `x` in ahead of its use. A hint: it changes no
/// value and no behaviour, only when the memory is read.
#[inline(always)]
#[allow(unsafe_code)]
fn prefetch<T>(x: &T) {
    #[cfg(all(target_arch = "x86_64", target_feature = "sse"))]
    // SAFETY: `_mm_prefetch` is unsafe to call only because it needs the SSE target feature,
    // which the `cfg` above guarantees for the whole build (SSE is part of the x86_64
    // baseline). A prefetch never faults, reads nothing into the program and writes nothing;
    // the address is that of a live reference in any case.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
            (x as *const T).cast::<i8>(),
        );
    }
    #[cfg(not(all(target_arch = "x86_64", target_feature = "sse")))]
    let _ = x;
}

#[inline]
fn selected(hot: &[Hot], shape: Shape, i: u32, basis: SelectionBasis) -> SelectedElement {
    let h = &hot[i as usize];
    SelectedElement {
        entry: EntryId {
            index: i,
            generation: h.generation,
        },
        id: h.id,
        policy: unpack(shape, &h.values),
        selection_count: h.selection_count,
        degradation_count: h.degradation_count,
        basis,
    }
}

impl Handlespace {
    /// An empty handlespace with the given limits.
    pub fn new(config: HandlespaceConfig) -> Self {
        Handlespace {
            config,
            slots: Vec::new(),
            hot: Vec::new(),
            free: Vec::new(),
            len: 0,
            pools: Vec::new(),
            free_pools: Vec::new(),
            pool_index: BTreeMap::new(),
            owners: BTreeMap::new(),
            associations: BTreeMap::new(),
            timers: TimerHeap::default(),
        }
    }

    /// The limits and switches in force.
    pub fn config(&self) -> &HandlespaceConfig {
        &self.config
    }

    /// Number of PEs.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether there is no PE (and so no pool).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Number of pools.
    pub fn pool_count(&self) -> usize {
        self.pool_index.len()
    }

    fn limit(configured: usize) -> usize {
        // Entry and slot indexes are 32-bit with one value reserved.
        configured.min(NIL as usize - 1)
    }

    /// Registers a PE in a pool, or updates it if the pool already has its identifier
    /// (RFC 5352 §3.1, RFC 5353 §3.2 for PEs learned from peers).
    ///
    /// The PE's `home_registrar` is its owner (for the owner index and checksum). The first PE
    /// creates the pool and fixes its policy type, user transport type and transport use; a
    /// later PE that differs is refused with the matching cause (0x5, 0x7, 0x8). A
    /// re-registration replaces the entry's values, resets its LUD counter and unreachability
    /// reports, keeps its round-robin position unless its sort key changed (then it joins the
    /// back of its new key), and moves it between owners and associations as needed. Timers
    /// are left as they are: the caller arms them ([`Handlespace::set_timer`]).
    pub fn register(
        &mut self,
        pool_handle: &PoolHandle,
        element: PoolElement,
        association: Option<AssociationId>,
        now: Duration,
    ) -> Result<Registration, Error> {
        let len = pool_handle.len();
        if len == 0 || len > self.config.max_pool_handle_len {
            return Err(Error::InvalidPoolHandle {
                len,
                max: self.config.max_pool_handle_len,
            });
        }
        if element.id.0 == 0 {
            return Err(Error::InvalidPoolElementId);
        }
        let policy_type = element.policy.policy_type();
        let (Some(kind), Some(shape)) = (policy::kind(policy_type), Shape::of(policy_type)) else {
            return Err(Error::UnsupportedPolicy(policy_type));
        };
        let transport_type = element.user_transport.parameter_type();
        let transport_use = element.user_transport.transport_use();
        let total_limit = Self::limit(self.config.max_pool_elements);
        let pool_limit = Self::limit(self.config.max_pool_elements_per_pool);
        let p = match self.pool_index.get(pool_handle) {
            Some(&p) => {
                let pool = self.pools[p as usize].as_mut().expect("indexed pool");
                if pool.policy != policy_type {
                    return Err(Error::InconsistentPolicy {
                        pool: pool.policy,
                        requested: policy_type,
                    });
                }
                if pool.transport_type != transport_type {
                    return Err(Error::InconsistentTransportType {
                        pool: pool.transport_type,
                        requested: transport_type,
                    });
                }
                if pool.transport_use != transport_use {
                    return Err(Error::InconsistentTransportUse {
                        pool: pool.transport_use,
                        requested: transport_use,
                    });
                }
                let full = pool.by_id.len() >= pool_limit;
                // One search for both outcomes: update, or claim the slot the new entry gets.
                let i = match pool.by_id.entry(element.id) {
                    btree_map::Entry::Occupied(o) => {
                        let i = *o.get();
                        return Ok(self.update(i, element, association, now));
                    }
                    btree_map::Entry::Vacant(v) => {
                        if full {
                            return Err(Error::PoolFull { limit: pool_limit });
                        }
                        if self.len >= total_limit {
                            return Err(Error::HandlespaceFull { limit: total_limit });
                        }
                        let i = self.free.last().copied().unwrap_or(self.slots.len() as u32);
                        v.insert(i);
                        i
                    }
                };
                return Ok(Registration::New(self.insert(
                    p,
                    i,
                    element,
                    association,
                    now,
                )));
            }
            None => {
                if self.pool_index.len() >= self.config.max_pools {
                    return Err(Error::TooManyPools {
                        limit: self.config.max_pools,
                    });
                }
                if pool_limit == 0 {
                    return Err(Error::PoolFull { limit: pool_limit });
                }
                if self.len >= total_limit {
                    return Err(Error::HandlespaceFull { limit: total_limit });
                }
                let pool = Pool {
                    handle: pool_handle.clone(),
                    policy: policy_type,
                    shape,
                    kind,
                    transport_type,
                    transport_use,
                    by_id: BTreeMap::new(),
                    index: match kind {
                        Kind::Ordered { .. } => SelIndex::Ordered(ChunkedMap::default()),
                        Kind::Uniform => SelIndex::Uniform(Vec::new()),
                        Kind::Weighted { .. } => SelIndex::Weighted(Fenwick::new()),
                    },
                };
                let p = match self.free_pools.pop() {
                    Some(p) => {
                        self.pools[p as usize] = Some(pool);
                        p
                    }
                    None => {
                        self.pools.push(Some(pool));
                        (self.pools.len() - 1) as u32
                    }
                };
                self.pool_index.insert(pool_handle.clone(), p);
                p
            }
        };
        let i = self.free.last().copied().unwrap_or(self.slots.len() as u32);
        let pool = self.pools[p as usize].as_mut().expect("live pool");
        pool.by_id.insert(element.id, i);
        Ok(Registration::New(self.insert(
            p,
            i,
            element,
            association,
            now,
        )))
    }

    /// Fills slot `i` (the last free slot, or a new one at the end) with a new entry already
    /// indexed by identifier in pool `p`, and links it into every other index.
    #[inline]
    fn insert(
        &mut self,
        p: u32,
        i: u32,
        element: PoolElement,
        association: Option<AssociationId>,
        now: Duration,
    ) -> EntryId {
        let pool = self.pools[p as usize].as_mut().expect("live pool");
        let words = element_words(pool.handle.as_bytes(), element.id);
        let id = element.id;
        let owner = element.home_registrar;
        let hot = Hot {
            key: 0,
            selection_count: 0,
            sel: Link::NONE,
            id,
            generation: 0,
            degradation_count: 0,
            wrr_credit: policy::wrr_credit(&element.policy),
            place: NIL,
            values: element.policy.fields().padded(),
        };
        let entry = Entry {
            element,
            pool: p,
            association,
            registered_at: now,
            updated_at: now,
            words,
            unreachability_reports: 0,
            revision: 0,
            owner: Link::NONE,
            assoc: Link::NONE,
        };
        if self.free.last() == Some(&i) {
            self.free.pop();
            self.slots[i as usize] = Some(entry);
            let generation = self.hot[i as usize].generation;
            self.hot[i as usize] = Hot { generation, ..hot };
        } else {
            debug_assert_eq!(i as usize, self.slots.len());
            self.slots.push(Some(entry));
            self.hot.push(hot);
        }
        sel_insert(&mut pool.index, pool.shape, &mut self.hot, i);
        let o = self.owners.entry(owner).or_insert(Owner {
            list: ListHead::EMPTY,
            words: 0,
        });
        push_back(&mut self.slots, &mut o.list, i, owner_link);
        o.words += words;
        if let Some(a) = association {
            let list = self.associations.entry(a).or_insert(ListHead::EMPTY);
            push_back(&mut self.slots, list, i, assoc_link);
        }
        self.len += 1;
        EntryId {
            index: i,
            generation: self.hot[i as usize].generation,
        }
    }

    #[inline]
    fn update(
        &mut self,
        i: u32,
        element: PoolElement,
        association: Option<AssociationId>,
        now: Duration,
    ) -> Registration {
        let e = live_mut(&mut self.slots, i);
        let p = e.pool;
        let values_changed = e.element.policy != element.policy;
        let previous = std::mem::replace(&mut e.element, element);
        e.updated_at = now;
        e.unreachability_reports = 0;
        e.revision = e.revision.wrapping_add(1);
        let new_owner = e.element.home_registrar;
        let old_association = e.association;
        let h = &mut self.hot[i as usize];
        let had_degradation = h.degradation_count != 0;
        h.degradation_count = 0;
        h.values = e.element.policy.fields().padded();
        h.wrr_credit = h.wrr_credit.min(policy::wrr_credit(&e.element.policy));
        if values_changed || had_degradation {
            let pool = self.pools[p as usize].as_mut().expect("live pool");
            sel_rekey(&mut pool.index, pool.shape, &mut self.hot, i);
        }
        if previous.home_registrar != new_owner {
            self.move_owner(i, previous.home_registrar, new_owner);
        }
        if old_association != association {
            self.move_association(i, old_association, association);
        }
        Registration::Updated {
            entry: EntryId {
                index: i,
                generation: self.hot[i as usize].generation,
            },
            previous,
        }
    }

    fn move_owner(&mut self, i: u32, from: RegistrarId, to: RegistrarId) {
        let words = live(&self.slots, i).words;
        let o = self.owners.get_mut(&from).expect("owner has a list");
        unlink(&mut self.slots, &mut o.list, i, owner_link);
        o.words -= words;
        if o.list.len == 0 {
            self.owners.remove(&from);
        }
        let o = self.owners.entry(to).or_insert(Owner {
            list: ListHead::EMPTY,
            words: 0,
        });
        push_back(&mut self.slots, &mut o.list, i, owner_link);
        o.words += words;
    }

    fn move_association(&mut self, i: u32, from: Option<AssociationId>, to: Option<AssociationId>) {
        if let Some(a) = from {
            let list = self
                .associations
                .get_mut(&a)
                .expect("association has a list");
            unlink(&mut self.slots, list, i, assoc_link);
            if list.len == 0 {
                self.associations.remove(&a);
            }
        }
        if let Some(a) = to {
            let list = self.associations.entry(a).or_insert(ListHead::EMPTY);
            push_back(&mut self.slots, list, i, assoc_link);
        }
        live_mut(&mut self.slots, i).association = to;
    }

    fn index_of(&self, entry: EntryId) -> Result<u32, Error> {
        match self.hot.get(entry.index as usize) {
            Some(h) if h.generation == entry.generation && h.place != NIL => Ok(entry.index),
            _ => Err(Error::StaleEntry),
        }
    }

    /// Deregisters a PE (RFC 5352 §3.3) or drops one a peer deleted (RFC 5353 §3.2). The pool
    /// goes away with its last PE.
    pub fn deregister(
        &mut self,
        pool_handle: &PoolHandle,
        id: PoolElementId,
    ) -> Result<RemovedElement, Error> {
        let &p = self
            .pool_index
            .get(pool_handle)
            .ok_or(Error::UnknownPoolHandle)?;
        let pool = self.pools[p as usize].as_mut().expect("indexed pool");
        // One search finds and unindexes it.
        let i = pool
            .by_id
            .remove(&id)
            .ok_or(Error::UnknownPoolElement(id))?;
        Ok(self.remove_index(i, false, false).1)
    }

    /// Removes the PE an [`EntryId`] names (e.g. after a keep-alive timeout); returns it with
    /// its pool's handle.
    pub fn remove(&mut self, entry: EntryId) -> Result<(PoolHandle, RemovedElement), Error> {
        let i = self.index_of(entry)?;
        let (handle, removed) = self.remove_index(i, true, true);
        Ok((handle.expect("asked for the handle"), removed))
    }

    /// Removes entry `i`; returns the pool's handle too if `with_handle` (cloned unless the
    /// pool goes away with it). `indexed_by_id` is false when the caller already took it out
    /// of its pool's identifier index.
    #[inline(always)]
    fn remove_index(
        &mut self,
        i: u32,
        with_handle: bool,
        indexed_by_id: bool,
    ) -> (Option<PoolHandle>, RemovedElement) {
        let (p, id, owner, words, association) = {
            let e = live(&self.slots, i);
            (
                e.pool,
                e.element.id,
                e.element.home_registrar,
                e.words,
                e.association,
            )
        };
        let pool = self.pools[p as usize].as_mut().expect("live pool");
        if indexed_by_id {
            pool.by_id.remove(&id);
        }
        sel_remove(&mut pool.index, &mut self.hot, i);
        let pool_emptied = pool.by_id.is_empty();
        let o = self.owners.get_mut(&owner).expect("owner has a list");
        unlink(&mut self.slots, &mut o.list, i, owner_link);
        o.words -= words;
        if o.list.len == 0 {
            self.owners.remove(&owner);
        }
        if association.is_some() {
            self.move_association(i, association, None);
        }
        self.timers.cancel(i);
        let h = &mut self.hot[i as usize];
        let entry = EntryId {
            index: i,
            generation: h.generation,
        };
        *h = Hot {
            generation: h.generation.wrapping_add(1),
            ..Hot::FREE
        };
        let e = self.slots[i as usize].take().expect("live entry");
        self.free.push(i);
        self.len -= 1;
        let pool_handle = if pool_emptied {
            let pool = self.pools[p as usize].take().expect("live pool");
            self.pool_index.remove(&pool.handle);
            self.free_pools.push(p);
            with_handle.then_some(pool.handle)
        } else if with_handle {
            Some(
                self.pools[p as usize]
                    .as_ref()
                    .expect("live pool")
                    .handle
                    .clone(),
            )
        } else {
            None
        };
        (
            pool_handle,
            RemovedElement {
                entry,
                element: e.element,
                association,
            },
        )
    }

    /// The entry of a PE, by pool handle and identifier.
    pub fn entry_id(&self, pool_handle: &PoolHandle, id: PoolElementId) -> Option<EntryId> {
        let &p = self.pool_index.get(pool_handle)?;
        let &i = self.pools[p as usize].as_ref()?.by_id.get(&id)?;
        Some(EntryId {
            index: i,
            generation: self.hot[i as usize].generation,
        })
    }

    /// A PE by pool handle and identifier.
    pub fn find(&self, pool_handle: &PoolHandle, id: PoolElementId) -> Option<PoolElementRef<'_>> {
        self.get(self.entry_id(pool_handle, id)?)
    }

    /// A PE by entry id (`None` if it was removed).
    pub fn get(&self, entry: EntryId) -> Option<PoolElementRef<'_>> {
        let i = self.index_of(entry).ok()?;
        Some(self.element_ref(i))
    }

    fn element_ref(&self, i: u32) -> PoolElementRef<'_> {
        PoolElementRef {
            hs: self,
            index: i,
            entry: live(&self.slots, i),
        }
    }

    /// A pool by handle.
    pub fn pool(&self, pool_handle: &PoolHandle) -> Option<PoolRef<'_>> {
        let &p = self.pool_index.get(pool_handle)?;
        Some(PoolRef {
            hs: self,
            pool: self.pools[p as usize].as_ref()?,
        })
    }

    /// All pools in pool-handle order.
    pub fn pools(&self) -> impl Iterator<Item = PoolRef<'_>> + '_ {
        self.pools_in((Bound::Unbounded, Bound::Unbounded))
    }

    /// The pools whose handles sort after `after`, in order: resumes a chunked walk such as an
    /// ENRP HANDLE_TABLE_RESPONSE with the M flag (RFC 5353 §2.2.3).
    pub fn pools_after<'a>(
        &'a self,
        after: &'a PoolHandle,
    ) -> impl Iterator<Item = PoolRef<'a>> + 'a {
        self.pools_in((Bound::Excluded(after), Bound::Unbounded))
    }

    fn pools_in<'a>(
        &'a self,
        range: (Bound<&'a PoolHandle>, Bound<&'a PoolHandle>),
    ) -> impl Iterator<Item = PoolRef<'a>> + 'a {
        self.pool_index
            .range::<PoolHandle, _>(range)
            .map(move |(_, &p)| PoolRef {
                hs: self,
                pool: self.pools[p as usize].as_ref().expect("indexed pool"),
            })
    }

    /// Selects up to `n` distinct PEs of a pool by its policy (RFC 5356; RSPLIB's private
    /// policies), best first, and reports what the choice was based on.
    ///
    /// Ordered policies return the first `n` PEs by sort key, round robin among equal keys.
    /// Random draws uniformly without replacement; weighted and randomized least-used policies
    /// draw without replacement with probability proportional to the weight. The first
    /// [`max_increment`](HandlespaceConfig::max_increment) returned PEs advance their policy
    /// state: they move behind their equals, their LUD counter grows, their WRR credit shrinks.
    /// Every returned PE's selection count grows. O(log n) per returned PE.
    pub fn select<R: Rng + ?Sized>(
        &mut self,
        pool_handle: &PoolHandle,
        n: usize,
        rng: &mut R,
    ) -> Result<Selection, Error> {
        let mut selection = Selection::default();
        self.select_into(pool_handle, n, rng, &mut selection)?;
        Ok(selection)
    }

    /// [`Handlespace::select`] into a caller's buffer, reusing its allocation; the pool handle
    /// may be borrowed as bytes (straight from a request).
    pub fn select_into<R: Rng + ?Sized, H: Ord + ?Sized>(
        &mut self,
        pool_handle: &H,
        n: usize,
        rng: &mut R,
        out: &mut Selection,
    ) -> Result<(), Error>
    where
        PoolHandle: std::borrow::Borrow<H>,
    {
        out.elements.clear();
        let &p = self
            .pool_index
            .get(pool_handle)
            .ok_or(Error::UnknownPoolHandle)?;
        let pool = self.pools[p as usize].as_mut().expect("indexed pool");
        out.policy = pool.policy;
        out.pool_size = pool.by_id.len();
        let advance = self.config.increment();
        let shape = pool.shape;
        let hot = &mut self.hot;
        match (&mut pool.index, pool.kind) {
            (
                SelIndex::Ordered(order),
                Kind::Ordered {
                    degrades,
                    weighted_round_robin,
                },
            ) => {
                // In a large pool the hot records are mostly out of the caches: the PE a
                // selection will come to next is fetched ahead (below).
                let fetch_ahead = out.pool_size >= PREFETCH_POOL_SIZE;
                let mut groups = order.iter_mut();
                // The first key's list: the first PE returned moves within it without a
                // lookup when its key stays.
                let mut first_list = None;
                'groups: while out.elements.len() < n {
                    let Some((key, list)) = groups.next() else {
                        break;
                    };
                    let mut i = list.head;
                    if first_list.is_none() {
                        first_list = Some(list);
                    }
                    while i != NIL {
                        let basis = SelectionBasis::Rank { key };
                        out.elements.push(selected(hot, shape, i, basis));
                        let h = &mut hot[i as usize];
                        h.selection_count += 1;
                        let next = h.sel.next;
                        if out.elements.len() == n {
                            if fetch_ahead {
                                if next != NIL {
                                    prefetch(&hot[next as usize]);
                                } else {
                                    // The next two keys' first PEs: the next selection and the
                                    // one after reach them.
                                    for (_, l) in groups.by_ref().take(2) {
                                        prefetch(&hot[l.head as usize]);
                                    }
                                }
                            }
                            break 'groups;
                        }
                        i = next;
                    }
                }
                let mut advancing = out.elements.iter().take(advance);
                if let Some(chosen) = advancing.next() {
                    // The first PE returned heads the first key's list.
                    let i = chosen.entry.index;
                    let h = &mut hot[i as usize];
                    let (key, new_key) = advance_ordered(h, chosen, weighted_round_robin, degrades);
                    match first_list {
                        Some(list) if new_key == key => {
                            if h.sel.next != NIL {
                                sel_unlink(hot, list, i);
                                sel_push_back(hot, list, i);
                            }
                        }
                        _ => move_to_back(order, hot, i, new_key),
                    }
                }
                for chosen in advancing {
                    let i = chosen.entry.index;
                    let h = &mut hot[i as usize];
                    let (_, new_key) = advance_ordered(h, chosen, weighted_round_robin, degrades);
                    move_to_back(order, hot, i, new_key);
                }
            }
            (SelIndex::Uniform(v), _) => {
                let len = v.len();
                for k in 0..n.min(len) {
                    // Partial Fisher-Yates: the first k slots hold this selection's PEs.
                    let j = rng.random_range(k..len);
                    v.swap(k, j);
                    hot[v[k] as usize].place = k as u32;
                    hot[v[j] as usize].place = j as u32;
                    let basis = SelectionBasis::Uniform {
                        candidates: len - k,
                    };
                    out.elements.push(selected(hot, shape, v[k], basis));
                    hot[v[k] as usize].selection_count += 1;
                }
            }
            (SelIndex::Weighted(f), Kind::Weighted { degrades }) => {
                for _ in 0..n.min(f.len()) {
                    let total = f.total();
                    if total == 0 {
                        break;
                    }
                    let slot = f.find(rng.random_range(0..total));
                    let (i, weight) = (f.entry(slot), f.weight(slot));
                    let basis = SelectionBasis::Weighted { weight, total };
                    out.elements.push(selected(hot, shape, i, basis));
                    // Out of the remaining draws of this selection.
                    f.set(slot, 0);
                }
                for (k, chosen) in out.elements.iter().enumerate() {
                    let h = &mut hot[chosen.entry.index as usize];
                    h.selection_count += 1;
                    if degrades && k < advance {
                        h.degradation_count = h.degradation_count.saturating_add(1);
                        h.key = policy::draw_weight(&chosen.policy, h.degradation_count);
                    }
                    f.set(h.place as usize, h.key);
                }
            }
            _ => unreachable!("a pool's index always matches its policy kind"),
        }
        Ok(())
    }

    /// Arms (or re-arms) the PE's timer; a PE has at most one.
    pub fn set_timer(
        &mut self,
        entry: EntryId,
        kind: TimerKind,
        deadline: Duration,
    ) -> Result<(), Error> {
        let i = self.index_of(entry)?;
        self.timers.set(i, kind, deadline);
        Ok(())
    }

    /// Cancels the PE's timer; returns it if one was armed.
    pub fn cancel_timer(&mut self, entry: EntryId) -> Result<Option<Timer>, Error> {
        let i = self.index_of(entry)?;
        Ok(self.timers.cancel(i).map(|n| Timer {
            entry,
            kind: n.kind,
            deadline: n.deadline,
        }))
    }

    fn timer_of(&self, node: &crate::timer::Node) -> Timer {
        Timer {
            entry: EntryId {
                index: node.entry,
                generation: self.hot[node.entry as usize].generation,
            },
            kind: node.kind,
            deadline: node.deadline,
        }
    }

    /// The timer due first, if any ("when must the registrar wake up next").
    pub fn next_timer(&self) -> Option<Timer> {
        self.timers.peek().map(|n| self.timer_of(n))
    }

    /// Takes the earliest timer if it is due at or before `now` (it is disarmed). Call until
    /// `None` to handle everything due; the PE itself stays until the caller removes it.
    pub fn pop_due(&mut self, now: Duration) -> Option<Timer> {
        if self.timers.peek()?.deadline > now {
            return None;
        }
        let node = self.timers.pop()?;
        Some(self.timer_of(&node))
    }

    /// Number of armed timers.
    pub fn timer_count(&self) -> usize {
        self.timers.len()
    }

    /// Counts an ENDPOINT_UNREACHABLE report against the PE (RFC 5352 §3.5) and returns the
    /// count since its last registration, for comparison with MAX-BAD-PE-REPORT.
    pub fn report_unreachable(&mut self, entry: EntryId) -> Result<u32, Error> {
        let i = self.index_of(entry)?;
        let e = live_mut(&mut self.slots, i);
        e.unreachability_reports = e.unreachability_reports.saturating_add(1);
        Ok(e.unreachability_reports)
    }

    /// The PE checksum of an owner (RFC 5353 §3.6.2), as its ENRP PRESENCE carries it; 0xffff
    /// for an owner without PEs. O(1): kept as PEs come and go.
    pub fn checksum(&self, owner: RegistrarId) -> PeChecksum {
        let words = self.owners.get(&owner).map_or(0, |o| o.words);
        finish(words, self.config.checksum_flavor)
    }

    /// Number of PEs an owner has.
    pub fn owned_count(&self, owner: RegistrarId) -> usize {
        self.owners.get(&owner).map_or(0, |o| o.list.len as usize)
    }

    /// Every owner with its PE count and checksum, in identifier order.
    pub fn owners(&self) -> impl Iterator<Item = OwnerSummary> + '_ {
        self.owners.iter().map(|(&owner, o)| OwnerSummary {
            owner,
            elements: o.list.len as usize,
            checksum: finish(o.words, self.config.checksum_flavor),
        })
    }

    /// The PEs an owner (home registrar) has, in the order they came to it: for a HANDLE_TABLE
    /// _RESPONSE to a request with the W flag, audits and takeovers (RFC 5353 §3.5, §3.6).
    pub fn owned_by(&self, owner: RegistrarId) -> ListIter<'_> {
        ListIter {
            hs: self,
            next: self.owners.get(&owner).map_or(NIL, |o| o.list.head),
            link: |e| &e.owner,
        }
    }

    /// The PEs registered over an association, in registration order.
    pub fn registered_over(&self, association: AssociationId) -> ListIter<'_> {
        ListIter {
            hs: self,
            next: self.associations.get(&association).map_or(NIL, |l| l.head),
            link: |e| &e.assoc,
        }
    }

    /// Number of PEs registered over an association (O(log n)).
    pub fn registered_over_count(&self, association: AssociationId) -> usize {
        self.associations
            .get(&association)
            .map_or(0, |l| l.len as usize)
    }

    /// Number of associations that have PEs registered over them.
    pub fn association_count(&self) -> usize {
        self.associations.len()
    }

    /// Makes another registrar the PE's home (takeover, RFC 5353 §3.5; or a peer's update that
    /// says so). Returns the previous home.
    pub fn set_home_registrar(
        &mut self,
        entry: EntryId,
        home: RegistrarId,
    ) -> Result<RegistrarId, Error> {
        let i = self.index_of(entry)?;
        let old = live(&self.slots, i).element.home_registrar;
        if old != home {
            self.move_owner(i, old, home);
            let e = live_mut(&mut self.slots, i);
            e.element.home_registrar = home;
            e.revision = e.revision.wrapping_add(1);
        }
        Ok(old)
    }

    /// Moves every PE of `from` to `to` (the winner of a takeover, RFC 5353 §3.5). Returns
    /// how many moved. O(PEs moved).
    pub fn take_over(&mut self, from: RegistrarId, to: RegistrarId) -> usize {
        if from == to {
            return self.owned_count(from);
        }
        let Some(old) = self.owners.remove(&from) else {
            return 0;
        };
        let target = self.owners.entry(to).or_insert(Owner {
            list: ListHead::EMPTY,
            words: 0,
        });
        let mut i = old.list.head;
        while i != NIL {
            let e = live_mut(&mut self.slots, i);
            e.element.home_registrar = to;
            e.revision = e.revision.wrapping_add(1);
            i = e.owner.next;
        }
        // Splice the whole list behind the new owner's.
        if target.list.tail == NIL {
            target.list.head = old.list.head;
        } else {
            live_mut(&mut self.slots, target.list.tail).owner.next = old.list.head;
            live_mut(&mut self.slots, old.list.head).owner.prev = target.list.tail;
        }
        target.list.tail = old.list.tail;
        target.list.len += old.list.len;
        target.words += old.words;
        old.list.len as usize
    }

    /// Sets the association a PE is reached over (e.g. after a takeover the new home learns
    /// it). Returns the previous one.
    pub fn set_association(
        &mut self,
        entry: EntryId,
        association: Option<AssociationId>,
    ) -> Result<Option<AssociationId>, Error> {
        let i = self.index_of(entry)?;
        let old = live(&self.slots, i).association;
        if old != association {
            self.move_association(i, old, association);
        }
        Ok(old)
    }

    /// Removes every PE registered over a lost association (RFC 5352 §3.1: a PE's registration
    /// is bound to its association), each with its pool's handle. O(PEs removed × log n).
    pub fn remove_association(
        &mut self,
        association: AssociationId,
    ) -> Vec<(PoolHandle, RemovedElement)> {
        let mut removed = Vec::new();
        while let Some(list) = self.associations.get(&association) {
            let (handle, r) = self.remove_index(list.head, true, true);
            removed.push((handle.expect("asked for the handle"), r));
        }
        removed
    }

    /// Removes every PE an owner has (a peer found dead with nobody taking over, or a
    /// resynchronisation that replaces its PEs, RFC 5353 §3.6.3), each with its pool's handle.
    pub fn remove_owned_by(&mut self, owner: RegistrarId) -> Vec<(PoolHandle, RemovedElement)> {
        let mut removed = Vec::new();
        while let Some(o) = self.owners.get(&owner) {
            let (handle, r) = self.remove_index(o.list.head, true, true);
            removed.push((handle.expect("asked for the handle"), r));
        }
        removed
    }

    /// Cross-checks every index and checksum against a full recomputation: pools and their
    /// identifier indexes, selection lists and keys, Fenwick sums, owner lists and word sums,
    /// association lists, the timer heap, the slab and the limits. O(n log n); for tests and
    /// debugging.
    pub fn verify(&self) -> Result<(), VerifyError> {
        self.verify_inner().map_err(VerifyError)
    }

    fn verify_inner(&self) -> Result<(), String> {
        let occupied = self.slots.iter().filter(|s| s.is_some()).count();
        if self.hot.len() != self.slots.len() {
            return Err("hot and cold slabs differ in length".into());
        }
        for (i, (cold, hot)) in self.slots.iter().zip(&self.hot).enumerate() {
            match cold {
                Some(e) => {
                    if hot.place == NIL || hot.id != e.element.id {
                        return Err(format!("slot {i}: hot record does not match"));
                    }
                    if hot.values != e.element.policy.fields().padded() {
                        return Err(format!("slot {i}: policy values mirror stale"));
                    }
                }
                None if hot.place != NIL || hot.sel != Link::NONE => {
                    return Err(format!("free slot {i} still placed"));
                }
                None => {}
            }
        }
        if occupied != self.len {
            return Err(format!("{occupied} live slots, len {}", self.len));
        }
        let mut free_seen = vec![false; self.slots.len()];
        for &f in &self.free {
            let s = self
                .slots
                .get(f as usize)
                .ok_or("free index out of range")?;
            if s.is_some() || std::mem::replace(&mut free_seen[f as usize], true) {
                return Err(format!("free list entry {f} is live or repeated"));
            }
        }
        if self.free.len() + occupied != self.slots.len() {
            return Err("slots neither live nor free".into());
        }
        if self.pool_index.len() > self.config.max_pools
            || self.len > Self::limit(self.config.max_pool_elements)
        {
            return Err("limits exceeded".into());
        }
        let live_pools = self.pools.iter().filter(|p| p.is_some()).count();
        if live_pools != self.pool_index.len()
            || live_pools + self.free_pools.len() != self.pools.len()
        {
            return Err("pool slab and pool index disagree".into());
        }
        let mut in_pool = 0usize;
        for (handle, &p) in &self.pool_index {
            let pool = self.pools[p as usize]
                .as_ref()
                .ok_or("pool index names a free pool")?;
            if &pool.handle != handle {
                return Err(format!("pool {handle} stored as {}", pool.handle));
            }
            if pool.by_id.is_empty() {
                return Err(format!("empty pool {handle} kept"));
            }
            if pool.by_id.len() > Self::limit(self.config.max_pool_elements_per_pool) {
                return Err(format!("pool {handle} over its limit"));
            }
            if policy::kind(pool.policy) != Some(pool.kind)
                || Shape::of(pool.policy) != Some(pool.shape)
            {
                return Err(format!("pool {handle} kind does not match its policy"));
            }
            for (&id, &i) in &pool.by_id {
                let e = self.slots.get(i as usize).and_then(|s| s.as_ref());
                let e = e.ok_or_else(|| format!("{handle}/{id} names a free slot"))?;
                if e.pool != p || e.element.id != id {
                    return Err(format!("{handle}/{id} entry belongs elsewhere"));
                }
                if e.element.policy.policy_type() != pool.policy
                    || e.element.user_transport.parameter_type() != pool.transport_type
                    || e.element.user_transport.transport_use() != pool.transport_use
                {
                    return Err(format!("{handle}/{id} inconsistent with its pool"));
                }
                if e.words != element_words(handle.as_bytes(), id) {
                    return Err(format!("{handle}/{id} checksum words wrong"));
                }
            }
            in_pool += pool.by_id.len();
            self.verify_selection(handle, p, pool)?;
        }
        if in_pool != self.len {
            return Err(format!("{in_pool} PEs in pools, len {}", self.len));
        }
        // Owners: lists cover every PE once, with the right owner and word sum.
        let mut owned = 0usize;
        for (&owner, o) in &self.owners {
            let members = self.walk(o.list, |e| &e.owner, &format!("owner {owner}"))?;
            let mut words = 0u64;
            for &i in &members {
                let e = live(&self.slots, i);
                if e.element.home_registrar != owner {
                    return Err(format!("PE {} in owner list {owner}", e.element.id));
                }
                words += e.words;
            }
            if words != o.words || members.is_empty() {
                return Err(format!("owner {owner} word sum {} != {words}", o.words));
            }
            let recomputed = crate::compute_checksum(
                members.iter().map(|&i| {
                    let e = live(&self.slots, i);
                    (
                        &self.pools[e.pool as usize]
                            .as_ref()
                            .expect("live pool")
                            .handle,
                        e.element.id,
                    )
                }),
                self.config.checksum_flavor,
            );
            if recomputed != self.checksum(owner) {
                return Err(format!("owner {owner} checksum differs from recomputation"));
            }
            owned += members.len();
        }
        if owned != self.len {
            return Err(format!("{owned} PEs in owner lists, len {}", self.len));
        }
        let mut associated = 0usize;
        for (&a, list) in &self.associations {
            let members = self.walk(*list, |e| &e.assoc, &format!("association {a:?}"))?;
            if members.is_empty()
                || members
                    .iter()
                    .any(|&i| live(&self.slots, i).association != Some(a))
            {
                return Err(format!("association {a:?} list wrong"));
            }
            associated += members.len();
        }
        let with_association = self
            .slots
            .iter()
            .filter_map(|s| s.as_ref())
            .filter(|e| e.association.is_some())
            .count();
        if associated != with_association {
            return Err("association lists miss PEs".into());
        }
        self.timers.check()?;
        if let Some(n) = self.timers.peek() {
            if self
                .slots
                .get(n.entry as usize)
                .and_then(|s| s.as_ref())
                .is_none()
            {
                return Err("timer armed for a free slot".into());
            }
        }
        Ok(())
    }

    /// Walks an intrusive list checking back links and length; returns its members.
    fn walk(
        &self,
        list: ListHead,
        link: fn(&Entry) -> &Link,
        what: &str,
    ) -> Result<Vec<u32>, String> {
        let mut members = Vec::new();
        let mut prev = NIL;
        let mut i = list.head;
        while i != NIL {
            let e = self
                .slots
                .get(i as usize)
                .and_then(|s| s.as_ref())
                .ok_or_else(|| format!("{what}: list names a free slot"))?;
            if link(e).prev != prev {
                return Err(format!("{what}: back link broken"));
            }
            members.push(i);
            if members.len() > self.len {
                return Err(format!("{what}: list loops"));
            }
            prev = i;
            i = link(e).next;
        }
        if prev != list.tail || members.len() != list.len as usize {
            return Err(format!("{what}: tail or length wrong"));
        }
        Ok(members)
    }

    fn verify_selection(&self, handle: &PoolHandle, p: u32, pool: &Pool) -> Result<(), String> {
        let check_entry = |i: u32| -> Result<&Hot, String> {
            let h = self.hot.get(i as usize).ok_or("selection names no slot")?;
            match self.slots[i as usize].as_ref() {
                Some(e) if e.pool == p => Ok(h),
                _ => Err(format!("{handle}: selection names a PE of another pool")),
            }
        };
        match (&pool.index, pool.kind) {
            (
                SelIndex::Ordered(order),
                Kind::Ordered {
                    weighted_round_robin,
                    ..
                },
            ) => {
                order.check().map_err(|m| format!("{handle}: {m}"))?;
                let mut count = 0;
                for (key, group) in order.iter() {
                    let mut members = 0u32;
                    let mut prev = NIL;
                    let mut i = group.head;
                    while i != NIL {
                        let h = check_entry(i)?;
                        let policy = unpack(pool.shape, &h.values);
                        let want = policy::order_key(&policy, h.degradation_count, key);
                        if h.place != 0 || h.key != key || want != key || h.sel.prev != prev {
                            return Err(format!("{handle}/{}: key {key}, want {want}", h.id));
                        }
                        if weighted_round_robin
                            && (h.wrr_credit == 0 || h.wrr_credit > policy::wrr_credit(&policy))
                        {
                            return Err(format!("{handle}/{}: WRR credit wrong", h.id));
                        }
                        members += 1;
                        if members as usize > pool.by_id.len() {
                            return Err(format!("{handle}: selection list loops"));
                        }
                        prev = i;
                        i = h.sel.next;
                    }
                    if members == 0 || members != group.len || prev != group.tail {
                        return Err(format!("{handle}: list for key {key} broken"));
                    }
                    count += members as usize;
                }
                if count != pool.by_id.len() {
                    return Err(format!("{handle}: {count} PEs in selection lists"));
                }
            }
            (SelIndex::Uniform(v), Kind::Uniform) => {
                if v.len() != pool.by_id.len() {
                    return Err(format!("{handle}: {} uniform slots", v.len()));
                }
                for (slot, &i) in v.iter().enumerate() {
                    if check_entry(i)?.place as usize != slot {
                        return Err(format!("{handle}: uniform slot {slot} wrong"));
                    }
                }
            }
            (SelIndex::Weighted(f), Kind::Weighted { .. }) => {
                f.check().map_err(|m| format!("{handle}: {m}"))?;
                if f.len() != pool.by_id.len() {
                    return Err(format!("{handle}: {} weighted slots", f.len()));
                }
                for (slot, &i) in f.entries().iter().enumerate() {
                    let h = check_entry(i)?;
                    let policy = unpack(pool.shape, &h.values);
                    let want = policy::draw_weight(&policy, h.degradation_count);
                    if h.place as usize != slot || f.weight(slot) != want || h.key != want {
                        return Err(format!("{handle}/{}: weight or slot wrong", h.id));
                    }
                }
            }
            _ => return Err(format!("{handle}: selection index of the wrong kind")),
        }
        Ok(())
    }
}

/// Read access to one PE entry.
#[derive(Clone, Copy)]
pub struct PoolElementRef<'a> {
    hs: &'a Handlespace,
    index: u32,
    entry: &'a Entry,
}

impl<'a> PoolElementRef<'a> {
    /// The entry's id.
    pub fn entry_id(&self) -> EntryId {
        EntryId {
            index: self.index,
            generation: self.hs.hot[self.index as usize].generation,
        }
    }

    /// The PE as registered (identifier, home registrar, life, transports, policy values).
    pub fn element(&self) -> &'a PoolElement {
        &self.entry.element
    }

    /// The PE identifier.
    pub fn id(&self) -> PoolElementId {
        self.entry.element.id
    }

    /// The home registrar (owner).
    pub fn home_registrar(&self) -> RegistrarId {
        self.entry.element.home_registrar
    }

    /// The pool's handle.
    pub fn pool_handle(&self) -> &'a PoolHandle {
        &self.hs.pools[self.entry.pool as usize]
            .as_ref()
            .expect("live pool")
            .handle
    }

    /// The association it was registered over.
    pub fn association(&self) -> Option<AssociationId> {
        self.entry.association
    }

    /// When the entry was created.
    pub fn registered_at(&self) -> Duration {
        self.entry.registered_at
    }

    /// When it was last registered or re-registered (for audits: entries of a peer not
    /// refreshed since a resynchronisation began are stale).
    pub fn updated_at(&self) -> Duration {
        self.entry.updated_at
    }

    /// Changes whenever the PE's registered values may have changed (each re-registration, a
    /// new home registrar), and only then: what a caller derived from them, an encoded form
    /// say, is stale once this differs from when it was derived.
    pub fn revision(&self) -> u32 {
        self.entry.revision
    }

    /// Times it has been selected.
    pub fn selection_count(&self) -> u64 {
        self.hs.hot[self.index as usize].selection_count
    }

    /// Its LUD counter (selections since registration that degraded it).
    pub fn degradation_count(&self) -> u32 {
        self.hs.hot[self.index as usize].degradation_count
    }

    /// ENDPOINT_UNREACHABLE reports since its last registration.
    pub fn unreachability_reports(&self) -> u32 {
        self.entry.unreachability_reports
    }

    /// Its pending timer.
    pub fn timer(&self) -> Option<Timer> {
        self.hs.timers.get(self.index).map(|n| self.hs.timer_of(n))
    }
}

impl fmt::Debug for PoolElementRef<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.pool_handle(), self.entry.element)
    }
}

/// Read access to one pool.
#[derive(Clone, Copy)]
pub struct PoolRef<'a> {
    hs: &'a Handlespace,
    pool: &'a Pool,
}

impl<'a> PoolRef<'a> {
    /// The pool handle.
    pub fn handle(&self) -> &'a PoolHandle {
        &self.pool.handle
    }

    /// The policy its first PE fixed.
    pub fn policy_type(&self) -> PolicyType {
        self.pool.policy
    }

    /// The user transport parameter type its first PE fixed.
    pub fn transport_type(&self) -> ParameterType {
        self.pool.transport_type
    }

    /// The transport use its first PE fixed.
    pub fn transport_use(&self) -> TransportUse {
        self.pool.transport_use
    }

    /// Number of PEs.
    pub fn len(&self) -> usize {
        self.pool.by_id.len()
    }

    /// Whether the pool is empty (never true for a pool the handlespace holds).
    pub fn is_empty(&self) -> bool {
        self.pool.by_id.is_empty()
    }

    /// A PE by identifier.
    pub fn get(&self, id: PoolElementId) -> Option<PoolElementRef<'a>> {
        let hs = self.hs;
        self.pool.by_id.get(&id).map(|&i| hs.element_ref(i))
    }

    /// The PEs in identifier order.
    pub fn elements(&self) -> impl Iterator<Item = PoolElementRef<'a>> + 'a {
        let hs = self.hs;
        self.pool.by_id.values().map(move |&i| hs.element_ref(i))
    }

    /// The PEs with identifiers above `after`, in order (resumes a chunked handle table).
    pub fn elements_after(
        &self,
        after: PoolElementId,
    ) -> impl Iterator<Item = PoolElementRef<'a>> + 'a {
        let hs = self.hs;
        self.pool
            .by_id
            .range((Bound::Excluded(after), Bound::Unbounded))
            .map(move |(_, &i)| hs.element_ref(i))
    }
}

impl fmt::Debug for PoolRef<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "pool {} ({}, {}, {:?}, {} PEs)",
            self.pool.handle,
            self.pool.policy,
            self.pool.transport_type,
            self.pool.transport_use,
            self.len()
        )
    }
}

/// Iterator over the PEs of an owner or an association.
pub struct ListIter<'a> {
    hs: &'a Handlespace,
    next: u32,
    link: fn(&Entry) -> &Link,
}

impl<'a> Iterator for ListIter<'a> {
    type Item = PoolElementRef<'a>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.next == NIL {
            return None;
        }
        let r = self.hs.element_ref(self.next);
        self.next = (self.link)(r.entry).next;
        Some(r)
    }
}
