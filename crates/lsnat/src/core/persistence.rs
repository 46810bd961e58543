//! Persistence (client affinity): the same client address, or client network, goes to the same
//! member for a set time after its last session, like IPVS `-p` with `-M`.

use super::member::MemberId;
use super::Time;
use std::collections::HashMap;
use std::net::IpAddr;
use std::time::Duration;

/// Persistence settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PersistenceParams {
    /// How long an entry outlives its client's last session; zero disables persistence.
    pub timeout: Duration,
    /// IPv4 prefix length that groups clients (32 = per address).
    pub netmask_v4: u8,
    /// IPv6 prefix length that groups clients (128 = per address).
    pub netmask_v6: u8,
    /// Most entries kept; past it, new clients are not remembered (counted).
    pub max_entries: usize,
}

impl Default for PersistenceParams {
    fn default() -> Self {
        PersistenceParams {
            timeout: Duration::ZERO,
            netmask_v4: 32,
            netmask_v6: 128,
            max_entries: 65_536,
        }
    }
}

/// The client network an address belongs to under the configured masks.
pub fn client_key(ip: IpAddr, p: &PersistenceParams) -> IpAddr {
    match ip {
        IpAddr::V4(v4) => {
            let bits = u32::from(v4);
            let m = u32::from(p.netmask_v4.min(32));
            let mask = if m == 0 { 0 } else { u32::MAX << (32 - m) };
            IpAddr::V4((bits & mask).into())
        }
        IpAddr::V6(v6) => {
            let bits = u128::from(v6);
            let m = u32::from(p.netmask_v6.min(128));
            let mask = if m == 0 { 0 } else { u128::MAX << (128 - m) };
            IpAddr::V6((bits & mask).into())
        }
    }
}

#[derive(Debug, Clone)]
struct Entry {
    member: MemberId,
    sessions: u32,
    last_used: Time,
}

/// Client network → member, with expiry.
#[derive(Debug, Default)]
pub struct PersistenceTable {
    entries: HashMap<IpAddr, Entry>,
}

impl PersistenceTable {
    /// The member remembered for `key`, if the entry is still valid at `now`.
    pub fn lookup(&self, key: IpAddr, now: Time, timeout: Duration) -> Option<MemberId> {
        let e = self.entries.get(&key)?;
        (e.sessions > 0 || now < e.last_used + timeout).then_some(e.member)
    }

    /// Records that `key` now has a session on `member`. Returns false if the table is full.
    pub fn bind(&mut self, key: IpAddr, member: MemberId, now: Time, max: usize) -> bool {
        if let Some(e) = self.entries.get_mut(&key) {
            if e.member != member {
                e.member = member;
                e.sessions = 0;
            }
            e.sessions += 1;
            e.last_used = now;
            return true;
        }
        if self.entries.len() >= max {
            return false;
        }
        self.entries.insert(
            key,
            Entry {
                member,
                sessions: 1,
                last_used: now,
            },
        );
        true
    }

    /// Records that a session of `key` on `member` ended.
    pub fn release(&mut self, key: IpAddr, member: MemberId, now: Time) {
        if let Some(e) = self.entries.get_mut(&key) {
            if e.member == member {
                e.sessions = e.sessions.saturating_sub(1);
                e.last_used = now;
            }
        }
    }

    /// Forgets `key` (its member can no longer take it).
    pub fn forget(&mut self, key: IpAddr) {
        self.entries.remove(&key);
    }

    /// Drops expired entries.
    pub fn expire(&mut self, now: Time, timeout: Duration) {
        self.entries
            .retain(|_, e| e.sessions > 0 || now < e.last_used + timeout);
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether the table is empty.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// Traffic over a sliding window, kept in ten buckets.
#[derive(Debug, Clone)]
pub struct TrafficWindow {
    buckets: [u64; 10],
    bucket_len: Duration,
    head: u64,
}

impl TrafficWindow {
    /// A window of `len` (at least 10 ms).
    pub fn new(len: Duration) -> Self {
        TrafficWindow {
            buckets: [0; 10],
            bucket_len: (len / 10).max(Duration::from_millis(1)),
            head: 0,
        }
    }

    fn advance(&mut self, now: Time) {
        let idx = (now.as_nanos() / self.bucket_len.as_nanos().max(1)) as u64;
        if idx <= self.head {
            return;
        }
        let steps = (idx - self.head).min(10);
        for k in 1..=steps {
            self.buckets[((self.head + k) % 10) as usize] = 0;
        }
        self.head = idx;
    }

    /// Adds `amount` at `now`.
    pub fn add(&mut self, now: Time, amount: u64) {
        self.advance(now);
        let slot = (self.head % 10) as usize;
        self.buckets[slot] = self.buckets[slot].saturating_add(amount);
    }

    /// The total over the window ending at `now`.
    pub fn total(&mut self, now: Time) -> u64 {
        self.advance(now);
        self.buckets.iter().fold(0u64, |a, b| a.saturating_add(*b))
    }
}
