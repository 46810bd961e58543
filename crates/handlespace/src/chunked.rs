//! An ordered map from `u64` keys to small values, stored as sorted runs ("chunks") of up to
//! [`CAP`] entries held contiguously: the first chunk held directly by the map, the others in a
//! `BTreeMap` by lower bound.
//!
//! Compared with a `BTreeMap<u64, V>` it keeps neighbouring keys together in memory however
//! the map was built, so walking the map from its start reads consecutive memory and, while
//! the walk stays in the first chunk, no index node; taking the first entry out costs O(1).
//! Lookups, insertions and removals are O(log n + CAP). Every chunk but a lone first one holds
//! at least [`MIN`] entries, so memory stays within a constant factor of the entries held.

use std::collections::{btree_map, BTreeMap};
use std::ops::Bound;

/// Most entries in one chunk.
pub(crate) const CAP: usize = 32;
/// Fewest entries in a chunk when there are several.
pub(crate) const MIN: usize = CAP / 4;

/// A sorted run of entries in the slots `start..end` of fixed arrays. Keys are kept apart from
/// values so that a search reads only keys; the free slots on both sides let an entry be
/// inserted or removed by moving the shorter side, and the first one be taken in O(1).
#[derive(Debug, Clone)]
struct Chunk<V> {
    start: usize,
    end: usize,
    keys: [u64; CAP],
    /// Slots outside `start..end` hold stale copies.
    values: [V; CAP],
}

impl<V: Copy + Default> Chunk<V> {
    fn empty() -> Box<Self> {
        Box::new(Chunk {
            start: 0,
            end: 0,
            keys: [0; CAP],
            values: [V::default(); CAP],
        })
    }

    #[inline]
    fn len(&self) -> usize {
        self.end - self.start
    }

    #[inline]
    fn first_key(&self) -> Option<u64> {
        (self.start < self.end).then(|| self.keys[self.start])
    }

    /// The slot of `key`, or the slot where it would be inserted.
    #[inline]
    fn search(&self, key: u64) -> Result<usize, usize> {
        match self.keys[self.start..self.end].binary_search(&key) {
            Ok(at) => Ok(self.start + at),
            Err(at) => Err(self.start + at),
        }
    }

    /// Inserts before slot `at` (`start..=end`); the chunk must not be full.
    fn insert(&mut self, at: usize, key: u64, value: V) {
        debug_assert!(self.len() < CAP);
        let at = if self.end < CAP && (self.start == 0 || at - self.start >= self.end - at) {
            self.keys.copy_within(at..self.end, at + 1);
            self.values.copy_within(at..self.end, at + 1);
            self.end += 1;
            at
        } else {
            self.keys.copy_within(self.start..at, self.start - 1);
            self.values.copy_within(self.start..at, self.start - 1);
            self.start -= 1;
            at - 1
        };
        self.keys[at] = key;
        self.values[at] = value;
    }

    /// Removes the entry in slot `at`.
    fn remove(&mut self, at: usize) -> V {
        let value = self.values[at];
        if at - self.start < self.end - 1 - at {
            self.keys.copy_within(self.start..at, self.start + 1);
            self.values.copy_within(self.start..at, self.start + 1);
            self.start += 1;
        } else {
            self.keys.copy_within(at + 1..self.end, at);
            self.values.copy_within(at + 1..self.end, at);
            self.end -= 1;
        }
        if self.start == self.end {
            (self.start, self.end) = (0, 0);
        }
        value
    }

    /// Moves the entries to the slots `to..to + len`.
    fn shift_to(&mut self, to: usize) {
        let len = self.len();
        self.keys.copy_within(self.start..self.end, to);
        self.values.copy_within(self.start..self.end, to);
        self.start = to;
        self.end = to + len;
    }

    /// Appends the first `n` entries of `other` (all of them greater than this chunk's).
    fn take_front_of(&mut self, other: &mut Chunk<V>, n: usize) {
        if self.end + n > CAP {
            self.shift_to(0);
        }
        let from = other.start..other.start + n;
        self.keys[self.end..self.end + n].copy_from_slice(&other.keys[from.clone()]);
        self.values[self.end..self.end + n].copy_from_slice(&other.values[from]);
        self.end += n;
        other.start += n;
    }

    /// Prepends the last `n` entries of `other` (all of them less than this chunk's).
    fn take_back_of(&mut self, other: &mut Chunk<V>, n: usize) {
        if self.start < n {
            self.shift_to(CAP - self.len());
        }
        let from = other.end - n..other.end;
        self.keys[self.start - n..self.start].copy_from_slice(&other.keys[from.clone()]);
        self.values[self.start - n..self.start].copy_from_slice(&other.values[from]);
        self.start -= n;
        other.end -= n;
    }

    /// Splits off the upper half into a new chunk.
    fn split(&mut self) -> Box<Chunk<V>> {
        let mid = self.start + self.len() / 2;
        let n = self.end - mid;
        let mut upper = Chunk::empty();
        upper.keys[..n].copy_from_slice(&self.keys[mid..self.end]);
        upper.values[..n].copy_from_slice(&self.values[mid..self.end]);
        upper.end = n;
        self.end = mid;
        upper
    }

    #[inline]
    fn entries(&self) -> (&[u64], &[V]) {
        (
            &self.keys[self.start..self.end],
            &self.values[self.start..self.end],
        )
    }

    #[inline]
    fn entries_mut(&mut self) -> (&[u64], &mut [V]) {
        (
            &self.keys[self.start..self.end],
            &mut self.values[self.start..self.end],
        )
    }
}

/// Which chunk: the first, or one of the others by its lower bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum At {
    First,
    Rest(u64),
}

#[derive(Debug, Clone)]
pub(crate) struct ChunkedMap<V> {
    /// The chunk of the smallest keys (below `second`); empty only if the map is.
    first: Box<Chunk<V>>,
    /// The other chunks by lower bound: each holds the keys from its bound up to the next
    /// chunk's bound.
    rest: BTreeMap<u64, Box<Chunk<V>>>,
    /// The smallest bound in `rest` (`u64::MAX` if it is empty).
    second: u64,
    len: usize,
}

impl<V: Copy + Default> Default for ChunkedMap<V> {
    fn default() -> Self {
        ChunkedMap {
            first: Chunk::empty(),
            rest: BTreeMap::new(),
            second: u64::MAX,
            len: 0,
        }
    }
}

/// Iterator over a [`ChunkedMap`] in key order.
pub(crate) struct Iter<'a, V> {
    /// The chunks after the first, once the walk gets there.
    rest: Option<btree_map::Values<'a, u64, Box<Chunk<V>>>>,
    map: &'a BTreeMap<u64, Box<Chunk<V>>>,
    entries: std::iter::Zip<std::slice::Iter<'a, u64>, std::slice::Iter<'a, V>>,
}

impl<'a, V: Copy + Default> Iter<'a, V> {
    /// Moves on to the next chunk.
    #[inline(never)]
    fn next_chunk(&mut self) -> Option<(u64, &'a V)> {
        let map = self.map;
        let rest = self.rest.get_or_insert_with(|| map.values());
        let (keys, values) = rest.next()?.entries();
        self.entries = keys.iter().zip(values);
        self.entries.next().map(|(&k, v)| (k, v))
    }
}

impl<'a, V: Copy + Default> Iterator for Iter<'a, V> {
    type Item = (u64, &'a V);

    #[inline]
    fn next(&mut self) -> Option<Self::Item> {
        match self.entries.next() {
            Some((&k, v)) => Some((k, v)),
            None => self.next_chunk(),
        }
    }
}

/// Iterator over a [`ChunkedMap`] in key order, values mutable.
pub(crate) struct IterMut<'a, V> {
    /// The chunks after the first, once the walk gets there.
    rest: Option<btree_map::ValuesMut<'a, u64, Box<Chunk<V>>>>,
    map: Option<&'a mut BTreeMap<u64, Box<Chunk<V>>>>,
    entries: std::iter::Zip<std::slice::Iter<'a, u64>, std::slice::IterMut<'a, V>>,
}

impl<'a, V: Copy + Default> IterMut<'a, V> {
    /// Moves on to the next chunk.
    #[inline(never)]
    fn next_chunk(&mut self) -> Option<(u64, &'a mut V)> {
        if let Some(map) = self.map.take() {
            self.rest = Some(map.values_mut());
        }
        let (keys, values) = self.rest.as_mut()?.next()?.entries_mut();
        self.entries = keys.iter().zip(values);
        self.entries.next().map(|(&k, v)| (k, v))
    }
}

impl<'a, V: Copy + Default> Iterator for IterMut<'a, V> {
    type Item = (u64, &'a mut V);

    #[inline]
    fn next(&mut self) -> Option<Self::Item> {
        match self.entries.next() {
            Some((&k, v)) => Some((k, v)),
            None => self.next_chunk(),
        }
    }
}

impl<V: Copy + Default> ChunkedMap<V> {
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The smallest key.
    pub(crate) fn first_key(&self) -> Option<u64> {
        self.first.first_key()
    }

    /// The chunk whose range holds `key`.
    #[inline]
    fn chunk_for(&mut self, key: u64) -> (At, &mut Chunk<V>) {
        if key < self.second || self.rest.is_empty() {
            return (At::First, &mut self.first);
        }
        let (&bound, chunk) = self
            .rest
            .range_mut(..=key)
            .next_back()
            .expect("a key from the second bound on has a chunk");
        (At::Rest(bound), chunk)
    }

    fn chunk_mut(&mut self, at: At) -> &mut Chunk<V> {
        match at {
            At::First => &mut self.first,
            At::Rest(bound) => self.rest.get_mut(&bound).expect("chunk"),
        }
    }

    pub(crate) fn get_mut(&mut self, key: u64) -> Option<&mut V> {
        let (_, chunk) = self.chunk_for(key);
        let at = chunk.search(key).ok()?;
        Some(&mut chunk.values[at])
    }

    /// Inserts `make()` under `key` if the key is absent, else applies `update` to its value.
    /// Returns `true` if it inserted.
    pub(crate) fn insert_or_update(
        &mut self,
        key: u64,
        make: impl FnOnce() -> V,
        update: impl FnOnce(&mut V),
    ) -> bool {
        let (_, chunk) = self.chunk_for(key);
        let at = match chunk.search(key) {
            Ok(at) => {
                update(&mut chunk.values[at]);
                return false;
            }
            Err(at) => at,
        };
        if chunk.len() < CAP {
            chunk.insert(at, key, make());
        } else {
            // Split: the upper half moves to a new chunk bounded by its first key.
            let mut upper = chunk.split();
            let bound = upper.keys[0];
            if key < bound {
                let at = chunk.search(key).expect_err("key absent");
                chunk.insert(at, key, make());
            } else {
                let at = upper.search(key).expect_err("key absent");
                upper.insert(at, key, make());
            }
            self.rest.insert(bound, upper);
            self.second = self.second.min(bound);
        }
        self.len += 1;
        true
    }

    /// Removes `key`; returns its value.
    pub(crate) fn remove(&mut self, key: u64) -> Option<V> {
        let (at, chunk) = self.chunk_for(key);
        // The first key (a least-used selection moving its choice) needs no search.
        let slot = if chunk.first_key() == Some(key) {
            chunk.start
        } else {
            chunk.search(key).ok()?
        };
        let value = chunk.remove(slot);
        let underfull = chunk.len() < MIN;
        self.len -= 1;
        if underfull {
            self.rebalance(at);
        }
        Some(value)
    }

    /// Restores the minimum fill of the chunk `at` (which just fell below it) by merging it
    /// with a neighbour or taking entries from one.
    fn rebalance(&mut self, at: At) {
        let bound = match at {
            At::First => None,
            At::Rest(bound) => Some(bound),
        };
        let next = match bound {
            None => self.rest.keys().next(),
            Some(b) => self
                .rest
                .range((Bound::Excluded(b), Bound::Unbounded))
                .next()
                .map(|(b, _)| b),
        }
        .copied();
        if let Some(next_bound) = next {
            let mut next = self.rest.remove(&next_bound).expect("next chunk");
            let chunk = self.chunk_mut(at);
            let (len, next_len) = (chunk.len(), next.len());
            if len + next_len <= CAP {
                chunk.take_front_of(&mut next, next_len);
            } else {
                // Take the next chunk's first entries; it is then bounded by its new first
                // key.
                chunk.take_front_of(&mut next, (next_len - len) / 2);
                self.rest.insert(next.keys[next.start], next);
            }
        } else if let Some(bound) = bound {
            // The last chunk, not the first: lean on the one before.
            let prev = match self.rest.range(..bound).next_back() {
                Some((&b, _)) => At::Rest(b),
                None => At::First,
            };
            let mut chunk = self.rest.remove(&bound).expect("chunk");
            let prev = self.chunk_mut(prev);
            let (len, prev_len) = (chunk.len(), prev.len());
            if len + prev_len <= CAP {
                prev.take_front_of(&mut chunk, len);
            } else {
                // Take the previous chunk's last entries; this chunk is then bounded by its
                // new first key.
                chunk.take_back_of(prev, (prev_len - len) / 2);
                self.rest.insert(chunk.keys[chunk.start], chunk);
            }
        }
        self.second = self.rest.keys().next().copied().unwrap_or(u64::MAX);
    }

    /// Entries in key order.
    pub(crate) fn iter(&self) -> Iter<'_, V> {
        let (keys, values) = self.first.entries();
        Iter {
            rest: None,
            map: &self.rest,
            entries: keys.iter().zip(values),
        }
    }

    /// Entries in key order, values mutable.
    pub(crate) fn iter_mut(&mut self) -> IterMut<'_, V> {
        let (keys, values) = self.first.entries_mut();
        IterMut {
            rest: None,
            map: Some(&mut self.rest),
            entries: keys.iter().zip(values),
        }
    }

    /// Checks bounds, order, fill and length (for the verifier).
    pub(crate) fn check(&self) -> Result<(), String> {
        if self.second != self.rest.keys().next().copied().unwrap_or(u64::MAX) {
            return Err("second chunk bound stale".into());
        }
        let chunks = std::iter::once((0, &self.first))
            .chain(self.rest.iter().map(|(&b, c)| (b, c)))
            .collect::<Vec<_>>();
        let mut count = 0;
        let mut last: Option<u64> = None;
        for (n, &(bound, chunk)) in chunks.iter().enumerate() {
            if chunk.start > chunk.end || chunk.end > CAP || (chunks.len() > 1 && chunk.len() < MIN)
            {
                return Err(format!("chunk at {bound} holds {} entries", chunk.len()));
            }
            let upper = chunks.get(n + 1).map(|c| c.0);
            for &key in chunk.entries().0 {
                if key < bound || upper.is_some_and(|u| key >= u) || last.is_some_and(|l| key <= l)
                {
                    return Err(format!("key {key} out of order or outside chunk {bound}"));
                }
                last = Some(key);
                count += 1;
            }
        }
        if count != self.len {
            return Err(format!("{count} entries, length {}", self.len));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn xorshift(x: &mut u64) -> u64 {
        *x ^= *x << 13;
        *x ^= *x >> 7;
        *x ^= *x << 17;
        *x
    }

    #[test]
    fn agrees_with_a_btree_map() {
        for (range, ops) in [(50u64, 4000), (5000, 20000), (u64::MAX, 20000)] {
            let mut m: ChunkedMap<u64> = ChunkedMap::default();
            let mut model: BTreeMap<u64, u64> = BTreeMap::new();
            let mut x = 0x9e37_79b9_7f4a_7c15u64;
            for step in 0..ops {
                let key = xorshift(&mut x) % range;
                match xorshift(&mut x) % 7 {
                    0..=2 => {
                        let inserted = m.insert_or_update(key, || step, |v| *v += 10);
                        assert_eq!(inserted, !model.contains_key(&key));
                        model.entry(key).and_modify(|v| *v += 10).or_insert(step);
                        assert_eq!(m.get_mut(key).copied(), model.get(&key).copied());
                    }
                    3 => {
                        if let Some(v) = m.get_mut(key) {
                            *v += 1;
                        }
                        if let Some(v) = model.get_mut(&key) {
                            *v += 1;
                        }
                    }
                    4 => {
                        // Take the first entry, as a least-used selection does.
                        let first = model.keys().next().copied();
                        assert_eq!(m.first_key(), first);
                        if let Some(k) = first {
                            assert_eq!(m.remove(k), model.remove(&k));
                        }
                    }
                    _ => assert_eq!(m.remove(key), model.remove(&key)),
                }
                m.check().unwrap();
                assert_eq!(m.len(), model.len());
                if step % 97 == 0 {
                    let got: Vec<(u64, u64)> = m.iter().map(|(k, v)| (k, *v)).collect();
                    let want: Vec<(u64, u64)> = model.iter().map(|(k, v)| (*k, *v)).collect();
                    assert_eq!(got, want);
                }
            }
            while let Some(k) = model.keys().next_back().copied() {
                assert_eq!(m.remove(k), model.remove(&k));
                m.check().unwrap();
            }
            assert_eq!(m.len(), 0);
            assert!(m.rest.is_empty() && m.first.len() == 0);
        }
    }

    #[test]
    fn extreme_keys() {
        let mut m: ChunkedMap<u64> = ChunkedMap::default();
        let keys: Vec<u64> = (0..200u64)
            .flat_map(|k| [k, u64::MAX - k, u64::MAX / 2 + k])
            .collect();
        for &k in &keys {
            assert!(m.insert_or_update(k, || k, |_| unreachable!()));
            m.check().unwrap();
        }
        assert_eq!(m.first_key(), Some(0));
        assert_eq!(m.get_mut(u64::MAX).copied(), Some(u64::MAX));
        for &k in keys.iter().rev() {
            assert_eq!(m.remove(k), Some(k));
            m.check().unwrap();
        }
        assert_eq!(m.len(), 0);
        assert!(m.insert_or_update(u64::MAX, || 1, |_| unreachable!()));
        assert_eq!(m.remove(u64::MAX), Some(1));
        m.check().unwrap();
    }

    #[test]
    fn iter_mut_walks_in_order() {
        let mut m: ChunkedMap<u64> = ChunkedMap::default();
        for k in (0..1000u64).rev() {
            m.insert_or_update(k * 3, || k, |_| unreachable!());
        }
        for (k, v) in m.iter_mut() {
            *v += k;
        }
        let got: Vec<(u64, u64)> = m.iter().map(|(k, v)| (k, *v)).collect();
        let want: Vec<(u64, u64)> = (0..1000u64).map(|k| (k * 3, k * 4)).collect();
        assert_eq!(got, want);
        m.check().unwrap();
    }
}
