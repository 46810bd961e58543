//! A growable Fenwick (binary indexed) tree of 64-bit weights over dense slots, with the entry
//! each slot holds: weighted random draws in O(log n), weight changes in O(log n), appends and
//! swap-removals in O(log n).

#[derive(Debug, Clone, Default)]
pub(crate) struct Fenwick {
    /// 1-based partial sums: `tree[i]` covers slots `(i - lowbit(i), i]` (1-based); `tree[0]`
    /// is unused.
    tree: Vec<u64>,
    /// Weight per slot (0-based).
    weights: Vec<u64>,
    /// Entry index per slot.
    entries: Vec<u32>,
    total: u64,
}

#[inline]
fn lowbit(i: usize) -> usize {
    i & i.wrapping_neg()
}

impl Fenwick {
    pub(crate) fn new() -> Self {
        Fenwick {
            tree: vec![0],
            weights: Vec::new(),
            entries: Vec::new(),
            total: 0,
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.weights.len()
    }

    pub(crate) fn total(&self) -> u64 {
        self.total
    }

    pub(crate) fn weight(&self, slot: usize) -> u64 {
        self.weights[slot]
    }

    pub(crate) fn entry(&self, slot: usize) -> u32 {
        self.entries[slot]
    }

    pub(crate) fn entries(&self) -> &[u32] {
        &self.entries
    }

    /// Appends a slot; returns its index.
    pub(crate) fn push(&mut self, entry: u32, weight: u64) -> usize {
        self.weights.push(weight);
        self.entries.push(entry);
        let i = self.weights.len();
        // tree[i] = weight + the nodes that partition (i - lowbit(i), i - 1].
        let stop = i - lowbit(i);
        let mut sum = weight;
        let mut j = i - 1;
        while j > stop {
            sum += self.tree[j];
            j -= lowbit(j);
        }
        self.tree.push(sum);
        self.total += weight;
        i - 1
    }

    /// Sets the weight of a slot.
    pub(crate) fn set(&mut self, slot: usize, weight: u64) {
        let old = self.weights[slot];
        if old == weight {
            return;
        }
        self.weights[slot] = weight;
        let delta = weight.wrapping_sub(old);
        self.total = self.total.wrapping_add(delta);
        let n = self.weights.len();
        let mut i = slot + 1;
        while i <= n {
            self.tree[i] = self.tree[i].wrapping_add(delta);
            i += lowbit(i);
        }
    }

    /// Removes a slot by moving the last slot into it. Returns the entry that moved into
    /// `slot`, if any.
    pub(crate) fn swap_remove(&mut self, slot: usize) -> Option<u32> {
        let last = self.weights.len() - 1;
        let moved = if slot != last {
            let (w, e) = (self.weights[last], self.entries[last]);
            self.set(slot, w);
            self.entries[slot] = e;
            Some(e)
        } else {
            None
        };
        // Nodes below the last index never cover it, so dropping its node drops its weight.
        self.total -= self.weights[last];
        self.weights.pop();
        self.entries.pop();
        self.tree.pop();
        moved
    }

    /// The slot in which the cumulative weight passes `r` (`r < total`): slot `s` is found
    /// with probability `weight(s) / total` for a uniform `r`. Zero-weight slots are never found.
    pub(crate) fn find(&self, r: u64) -> usize {
        let n = self.weights.len();
        let mut pos = 0usize;
        let mut rem = r;
        let mut step = if n == 0 {
            0
        } else {
            1usize << (usize::BITS - 1 - n.leading_zeros())
        };
        while step > 0 {
            let next = pos + step;
            if next <= n && self.tree[next] <= rem {
                pos = next;
                rem -= self.tree[next];
            }
            step >>= 1;
        }
        pos
    }

    /// Recomputes every partial sum from the weights and compares (for the verifier).
    pub(crate) fn check(&self) -> Result<(), String> {
        let n = self.weights.len();
        if self.tree.len() != n + 1 || self.entries.len() != n {
            return Err(format!(
                "fenwick sizes: tree {} weights {} entries {}",
                self.tree.len(),
                n,
                self.entries.len()
            ));
        }
        let mut prefix = vec![0u64; n + 1];
        for i in 1..=n {
            prefix[i] = prefix[i - 1] + self.weights[i - 1];
        }
        for i in 1..=n {
            let want = prefix[i] - prefix[i - lowbit(i)];
            if self.tree[i] != want {
                return Err(format!("fenwick node {i}: {} != {want}", self.tree[i]));
            }
        }
        if self.total != prefix[n] {
            return Err(format!("fenwick total {} != {}", self.total, prefix[n]));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn push_set_remove_find_agree_with_prefix_sums() {
        let mut f = Fenwick::new();
        let mut model: Vec<(u32, u64)> = Vec::new();
        let mut x = 12345u64;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for step in 0..3000u32 {
            match next() % 4 {
                0 | 1 => {
                    let w = next() % 50;
                    f.push(step, w);
                    model.push((step, w));
                }
                2 if !model.is_empty() => {
                    let s = (next() as usize) % model.len();
                    let w = next() % 50;
                    f.set(s, w);
                    model[s].1 = w;
                }
                _ if !model.is_empty() => {
                    let s = (next() as usize) % model.len();
                    let moved = f.swap_remove(s);
                    let last = model.len() - 1;
                    model.swap(s, last);
                    model.pop();
                    assert_eq!(moved, (s < model.len()).then(|| model[s].0));
                }
                _ => {}
            }
            f.check().unwrap();
            let total: u64 = model.iter().map(|m| m.1).sum();
            assert_eq!(f.total(), total);
            if total > 0 {
                let r = next() % total;
                let s = f.find(r);
                let before: u64 = model[..s].iter().map(|m| m.1).sum();
                assert!(before <= r && r < before + model[s].1, "find({r}) -> {s}");
                assert_eq!(f.entry(s), model[s].0);
            }
        }
    }
}
