//! The simulator's agenda: events ordered by virtual time, ties broken by the order they were
//! scheduled in, so that a seed replays exactly.

use std::cmp::Ordering;
use std::collections::BinaryHeap;
use std::time::Duration;

/// Events waiting for their virtual time; earliest first, first scheduled first among equals.
pub(crate) struct EventQueue<E> {
    heap: BinaryHeap<Queued<E>>,
    seq: u64,
}

struct Queued<E> {
    at: Duration,
    seq: u64,
    ev: E,
}

impl<E> EventQueue<E> {
    /// An empty agenda.
    pub(crate) fn new() -> Self {
        EventQueue {
            heap: BinaryHeap::new(),
            seq: 0,
        }
    }

    /// Schedules `ev` at `at`.
    pub(crate) fn push(&mut self, at: Duration, ev: E) {
        self.seq += 1;
        self.heap.push(Queued {
            at,
            seq: self.seq,
            ev,
        });
    }

    /// The next event and its time.
    pub(crate) fn pop(&mut self) -> Option<(Duration, E)> {
        self.heap.pop().map(|q| (q.at, q.ev))
    }
}

impl<E> PartialEq for Queued<E> {
    fn eq(&self, o: &Self) -> bool {
        self.at == o.at && self.seq == o.seq
    }
}
impl<E> Eq for Queued<E> {}
impl<E> PartialOrd for Queued<E> {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl<E> Ord for Queued<E> {
    // Earliest first out of a max-heap.
    fn cmp(&self, o: &Self) -> Ordering {
        o.at.cmp(&self.at).then(o.seq.cmp(&self.seq))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn earliest_first_and_ties_in_scheduling_order() {
        let mut q = EventQueue::new();
        q.push(Duration::from_secs(2), "late");
        q.push(Duration::from_secs(1), "first");
        q.push(Duration::from_secs(1), "second");
        let order: Vec<_> = std::iter::from_fn(|| q.pop()).map(|(_, e)| e).collect();
        assert_eq!(order, ["first", "second", "late"]);
    }
}
