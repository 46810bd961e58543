//! The timer index: one pending timer per PE at most, in a 4-ary min-heap ordered by
//! (deadline, entry index) with each entry's heap position kept beside it, so that arming,
//! re-arming and cancelling are O(log n) and "what is due next" is O(1).

use std::time::Duration;

const NIL: u32 = u32::MAX;
const ARITY: usize = 4;

/// What a PE's timer is for. A PE has at most one pending timer; arming another replaces it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum TimerKind {
    /// The registration life runs out (RFC 5352 §3.1: a PE that does not re-register in time
    /// is removed; registrars also expire PEs learned from peers this way).
    Expiry,
    /// Time for the home registrar to send the next ENDPOINT_KEEP_ALIVE (RFC 5352 §3.4).
    KeepAliveTransmission,
    /// An ENDPOINT_KEEP_ALIVE_ACK is overdue: the PE is considered dead.
    KeepAliveTimeout,
}

#[derive(Debug, Clone, Copy)]
pub(crate) struct Node {
    pub(crate) deadline: Duration,
    pub(crate) entry: u32,
    pub(crate) kind: TimerKind,
}

impl Node {
    #[inline]
    fn before(&self, other: &Node) -> bool {
        (self.deadline, self.entry) < (other.deadline, other.entry)
    }
}

#[derive(Debug, Clone, Default)]
pub(crate) struct TimerHeap {
    heap: Vec<Node>,
    /// Heap position per entry index (`NIL` = no timer).
    pos: Vec<u32>,
}

impl TimerHeap {
    pub(crate) fn len(&self) -> usize {
        self.heap.len()
    }

    pub(crate) fn peek(&self) -> Option<&Node> {
        self.heap.first()
    }

    pub(crate) fn get(&self, entry: u32) -> Option<&Node> {
        match self.pos.get(entry as usize) {
            Some(&p) if p != NIL => Some(&self.heap[p as usize]),
            _ => None,
        }
    }

    /// Arms or re-arms the timer of an entry.
    pub(crate) fn set(&mut self, entry: u32, kind: TimerKind, deadline: Duration) {
        let e = entry as usize;
        if self.pos.len() <= e {
            self.pos.resize(e + 1, NIL);
        }
        let node = Node {
            deadline,
            entry,
            kind,
        };
        let p = self.pos[e];
        if p == NIL {
            self.heap.push(node);
            let at = self.heap.len() - 1;
            self.pos[e] = at as u32;
            self.sift_up(at);
        } else {
            let at = p as usize;
            let earlier = node.before(&self.heap[at]);
            self.heap[at] = node;
            if earlier {
                self.sift_up(at);
            } else {
                self.sift_down(at);
            }
        }
    }

    /// Cancels the timer of an entry; returns it if one was armed.
    pub(crate) fn cancel(&mut self, entry: u32) -> Option<Node> {
        let p = *self.pos.get(entry as usize)?;
        if p == NIL {
            return None;
        }
        Some(self.remove_at(p as usize))
    }

    pub(crate) fn pop(&mut self) -> Option<Node> {
        if self.heap.is_empty() {
            None
        } else {
            Some(self.remove_at(0))
        }
    }

    fn remove_at(&mut self, at: usize) -> Node {
        let last = self.heap.len() - 1;
        self.heap.swap(at, last);
        let node = self.heap.pop().expect("non-empty heap");
        self.pos[node.entry as usize] = NIL;
        if at < self.heap.len() {
            self.pos[self.heap[at].entry as usize] = at as u32;
            if at > 0 && self.heap[at].before(&self.heap[(at - 1) / ARITY]) {
                self.sift_up(at);
            } else {
                self.sift_down(at);
            }
        }
        node
    }

    fn sift_up(&mut self, mut at: usize) {
        let node = self.heap[at];
        while at > 0 {
            let parent = (at - 1) / ARITY;
            if !node.before(&self.heap[parent]) {
                break;
            }
            self.heap[at] = self.heap[parent];
            self.pos[self.heap[at].entry as usize] = at as u32;
            at = parent;
        }
        self.heap[at] = node;
        self.pos[node.entry as usize] = at as u32;
    }

    fn sift_down(&mut self, mut at: usize) {
        let node = self.heap[at];
        let n = self.heap.len();
        loop {
            let first = at * ARITY + 1;
            if first >= n {
                break;
            }
            let mut best = first;
            for c in first + 1..(first + ARITY).min(n) {
                if self.heap[c].before(&self.heap[best]) {
                    best = c;
                }
            }
            if !self.heap[best].before(&node) {
                break;
            }
            self.heap[at] = self.heap[best];
            self.pos[self.heap[at].entry as usize] = at as u32;
            at = best;
        }
        self.heap[at] = node;
        self.pos[node.entry as usize] = at as u32;
    }

    /// Checks the heap order and the position index (for the verifier).
    pub(crate) fn check(&self) -> Result<(), String> {
        for (i, node) in self.heap.iter().enumerate() {
            if i > 0 && node.before(&self.heap[(i - 1) / ARITY]) {
                return Err(format!("timer heap order broken at {i}"));
            }
            if self.pos.get(node.entry as usize) != Some(&(i as u32)) {
                return Err(format!("timer position of entry {} wrong", node.entry));
            }
        }
        let armed = self.pos.iter().filter(|&&p| p != NIL).count();
        if armed != self.heap.len() {
            return Err(format!(
                "{armed} armed positions, {} heap nodes",
                self.heap.len()
            ));
        }
        Ok(())
    }
}
