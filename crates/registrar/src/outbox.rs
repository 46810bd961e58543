//! The driver's outgoing messages per association: sent in order, an association's messages of
//! one turn bundled into as few SCTP packets as the kernel allows, and held back (up to a limit)
//! while the transport has no room instead of being dropped.

use bytes::Bytes;
use rserpool_handlespace::AssociationId;
use rserpool_transport::{EndpointHandle, SendError};
use rustc_hash::FxHashMap;
use std::collections::VecDeque;

/// How often held messages are retried while the transport has no room for them.
pub(crate) const RETRY: std::time::Duration = std::time::Duration::from_millis(5);

/// Messages waiting to be handed to the transport, per association.
#[derive(Debug)]
pub(crate) struct Outbox {
    /// Per association; kept (empty) until the association goes, so that a busy association
    /// does not allocate a queue per batch.
    queues: FxHashMap<AssociationId, VecDeque<(u32, Bytes)>>,
    /// The associations with messages queued, each once.
    pending: Vec<AssociationId>,
    /// Most messages held for one association; past it new messages are dropped.
    limit: usize,
    held: usize,
    dropped: u64,
}

impl Outbox {
    pub(crate) fn new(limit: usize) -> Self {
        Outbox {
            queues: FxHashMap::default(),
            pending: Vec::new(),
            limit: limit.max(1),
            held: 0,
            dropped: 0,
        }
    }

    /// Queues a message behind the association's earlier ones.
    pub(crate) fn push(&mut self, to: AssociationId, ppid: u32, bytes: Bytes) {
        let q = self.queues.entry(to).or_default();
        if q.len() >= self.limit {
            self.dropped += 1;
            tracing::warn!(
                association = to.0,
                limit = self.limit,
                "answer dropped: the association's queue of answers the transport has no room for is full"
            );
            return;
        }
        if q.is_empty() {
            self.pending.push(to);
        }
        q.push_back((ppid, bytes));
        self.held += 1;
    }

    /// Hands every queued message to the transport, association by association, in order. All
    /// but an association's last message go with the hint that more follow (SCTP `MSG_MORE`),
    /// so the last one sends them together. An association whose transport is full keeps the
    /// rest for the next call; one that is gone loses its queue.
    pub(crate) async fn send(&mut self, handle: &EndpointHandle) {
        let mut still_pending = 0;
        for i in 0..self.pending.len() {
            let a = self.pending[i];
            let Some(q) = self.queues.get_mut(&a) else {
                continue;
            };
            let id = a;
            let mut gone = false;
            while let Some((ppid, bytes)) = q.pop_front() {
                let more = !q.is_empty();
                let sent = handle.try_send_hinted(id, ppid, 0, bytes, more).await;
                match sent {
                    Ok(()) => self.held -= 1,
                    Err(SendError::QueueFull { data, .. }) => {
                        // Held for the next call; messages sent before it with the hint are
                        // flushed when the last one goes.
                        q.push_front((ppid, data));
                        break;
                    }
                    // The peer left before its answer: normal, and its removal is logged.
                    Err(e @ SendError::UnknownAssociation(_)) => {
                        tracing::debug!(association = a.0, error = %e, "cannot send");
                        self.held -= q.len() + 1;
                        q.clear();
                        gone = true;
                    }
                    Err(e) => {
                        self.held -= 1;
                        tracing::warn!(association = a.0, error = %e, "cannot send");
                    }
                }
            }
            if !q.is_empty() {
                self.pending[still_pending] = a;
                still_pending += 1;
            } else if gone {
                // Its queue was made after it went down (answers of the same batch).
                self.queues.remove(&a);
            }
        }
        self.pending.truncate(still_pending);
    }

    /// Forgets the messages of an association that went down.
    pub(crate) fn forget(&mut self, a: AssociationId) {
        if let Some(q) = self.queues.remove(&a) {
            self.held -= q.len();
            if !q.is_empty() {
                self.pending.retain(|p| *p != a);
            }
        }
    }

    /// Whether messages wait for room.
    pub(crate) fn is_empty(&self) -> bool {
        self.held == 0
    }

    /// Messages waiting for room now.
    pub(crate) fn held(&self) -> usize {
        self.held
    }

    /// Messages dropped so far because an association's queue was full.
    pub(crate) fn dropped(&self) -> u64 {
        self.dropped
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rserpool_transport::{Endpoint, EndpointConfig, TransportChoice};

    #[tokio::test]
    async fn answers_to_a_departed_association_leave_nothing_behind() {
        let endpoint = Endpoint::bind(EndpointConfig::new(TransportChoice::Tcp))
            .await
            .unwrap();
        let mut outbox = Outbox::new(8);
        let gone = AssociationId(42);
        for _ in 0..3 {
            outbox.push(gone, 11, Bytes::from(vec![0; 8]));
        }
        assert_eq!(outbox.held(), 3);
        outbox.send(&endpoint.handle()).await;
        assert!(outbox.is_empty());
        assert!(outbox.queues.is_empty() && outbox.pending.is_empty());
        assert_eq!(outbox.dropped(), 0);
    }

    #[tokio::test]
    async fn past_the_limit_answers_are_dropped_and_counted() {
        let endpoint = Endpoint::bind(EndpointConfig::new(TransportChoice::Tcp))
            .await
            .unwrap();
        let mut outbox = Outbox::new(2);
        for _ in 0..5 {
            outbox.push(AssociationId(7), 11, Bytes::from(vec![0; 8]));
        }
        assert_eq!((outbox.held(), outbox.dropped()), (2, 3));
        outbox.forget(AssociationId(7));
        assert!(outbox.is_empty() && outbox.pending.is_empty());
        drop(endpoint);
    }
}
