//! Counters of an endpoint.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// A snapshot of an endpoint's counters since it was created. Each counts one kind of fact;
/// none implies another (an association that came up was not necessarily used, a message handed
/// to the kernel was not necessarily delivered).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EndpointStats {
    /// Associations that came up (inbound and outbound).
    pub associations_up: u64,
    /// Associations that went down (including connect attempts that failed).
    pub associations_down: u64,
    /// Inbound associations refused because of
    /// [`Limits::max_associations`](crate::Limits).
    pub refused: u64,
    /// Messages handed to the kernel (SCTP) or queued for writing (TCP).
    pub messages_sent: u64,
    /// Bytes of those messages (payload only).
    pub bytes_sent: u64,
    /// Whole messages received and queued as events.
    pub messages_received: u64,
    /// Bytes of those messages.
    pub bytes_received: u64,
    /// Messages reported undelivered ([`Event::SendFailed`](crate::Event::SendFailed)).
    pub send_failures: u64,
    /// Associations closed for bad input from the peer.
    pub protocol_errors: u64,
    /// Associations lost because the peer stopped answering (keep-alive or retransmission limit).
    pub timeouts: u64,
    /// TLS handshakes completed (inbound and outbound).
    pub tls_handshakes: u64,
    /// TLS handshakes that failed: bad, untrusted or missing certificate, wrong server name,
    /// protocol error, peer closed (timeouts not included).
    pub tls_handshake_failures: u64,
    /// TLS handshakes that did not finish within the handshake timeout.
    pub tls_handshake_timeouts: u64,
}

#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub associations_up: AtomicU64,
    pub associations_down: AtomicU64,
    pub refused: AtomicU64,
    pub messages_sent: AtomicU64,
    pub bytes_sent: AtomicU64,
    pub messages_received: AtomicU64,
    pub bytes_received: AtomicU64,
    pub send_failures: AtomicU64,
    pub protocol_errors: AtomicU64,
    pub timeouts: AtomicU64,
    pub tls_handshakes: AtomicU64,
    pub tls_handshake_failures: AtomicU64,
    pub tls_handshake_timeouts: AtomicU64,
}

impl Counters {
    pub fn add(c: &AtomicU64, n: u64) {
        c.fetch_add(n, Relaxed);
    }

    pub fn snapshot(&self) -> EndpointStats {
        EndpointStats {
            associations_up: self.associations_up.load(Relaxed),
            associations_down: self.associations_down.load(Relaxed),
            refused: self.refused.load(Relaxed),
            messages_sent: self.messages_sent.load(Relaxed),
            bytes_sent: self.bytes_sent.load(Relaxed),
            messages_received: self.messages_received.load(Relaxed),
            bytes_received: self.bytes_received.load(Relaxed),
            send_failures: self.send_failures.load(Relaxed),
            protocol_errors: self.protocol_errors.load(Relaxed),
            timeouts: self.timeouts.load(Relaxed),
            tls_handshakes: self.tls_handshakes.load(Relaxed),
            tls_handshake_failures: self.tls_handshake_failures.load(Relaxed),
            tls_handshake_timeouts: self.tls_handshake_timeouts.load(Relaxed),
        }
    }
}
