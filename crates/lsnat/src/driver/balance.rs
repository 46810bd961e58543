//! Which relay worker keeps a connection one of them accepted.
//!
//! The workers share each listener (`EPOLLEXCLUSIVE`), and the kernel wakes the first worker
//! waiting on it: while the gateway is idle that is the same worker every time, and in a burst
//! the worker already awake accepts faster than another can wake. Short connections even out
//! as they end, but long-lived ones (a client opening its kept-alive connections at once, a
//! pool of database connections arriving one by one) would stay where they landed: all on one
//! worker, relayed on one CPU while the others idle. So a worker that accepts a connection
//! while another worker is waiting in epoll with at least [`MARGIN`] fewer sessions hands the
//! connection over through that worker's mailbox. Only a waiting worker is offered one: one
//! that is busy relaying would take it no sooner than the worker that accepted it, and the
//! hand-over's wake-up would be paid for nothing (under a flood of short connections about
//! one in fifty is handed over).

use super::relay::{Command, Mailbox};
use mio::net::TcpStream;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

/// How many more sessions the accepting worker must have than a waiting one to hand it a
/// connection.
pub(crate) const MARGIN: usize = 2;

/// One worker's load as the others see it, on a cache line of its own (read by the other
/// workers on each accept, written by this one as its sessions come and go).
#[repr(align(64))]
#[derive(Default)]
struct Load {
    /// Sessions it relays now (written by the worker alone).
    live: AtomicUsize,
    /// Connections handed to it and not yet taken from its mailbox.
    incoming: AtomicUsize,
    /// Whether it waits in epoll (and is not stopping).
    waiting: AtomicBool,
    /// Connections handed to it, since the start.
    adopted: AtomicU64,
}

impl Load {
    fn sessions(&self) -> usize {
        self.live.load(Ordering::Relaxed) + self.incoming.load(Ordering::Relaxed)
    }
}

/// The relay workers' loads and mailboxes, shared by all of them.
pub(crate) struct Balance {
    loads: Box<[Load]>,
    mailboxes: OnceLock<Vec<Arc<Mailbox>>>,
}

impl Balance {
    /// The balance of `workers` workers; their mailboxes are set once all are built.
    pub(crate) fn new(workers: usize) -> Arc<Balance> {
        Arc::new(Balance {
            loads: (0..workers).map(|_| Load::default()).collect(),
            mailboxes: OnceLock::new(),
        })
    }

    /// Sets the workers' mailboxes, in worker order.
    pub(crate) fn set_mailboxes(&self, mailboxes: Vec<Arc<Mailbox>>) {
        let _ = self.mailboxes.set(mailboxes);
    }

    /// The worker that should relay a connection worker `n` accepted: None to keep it.
    fn elsewhere(&self, n: usize) -> Option<usize> {
        let mine = self.loads.get(n)?.sessions();
        let (j, least) = self
            .loads
            .iter()
            .enumerate()
            .filter(|(j, l)| *j != n && l.waiting.load(Ordering::Relaxed))
            .map(|(j, l)| (j, l.sessions()))
            .min_by_key(|(_, s)| *s)?;
        (least + MARGIN <= mine).then_some(j)
    }

    /// Offers a connection worker `n` accepted to a waiting worker with fewer sessions: the
    /// connection comes back when worker `n` keeps it.
    pub(crate) fn offer(
        &self,
        n: usize,
        client: TcpStream,
        peer: SocketAddr,
        fixed: Option<SocketAddr>,
    ) -> Option<TcpStream> {
        let Some(j) = self.elsewhere(n) else {
            return Some(client);
        };
        let Some(mailbox) = self.mailboxes.get().and_then(|m| m.get(j)) else {
            return Some(client);
        };
        let load = &self.loads[j];
        load.incoming.fetch_add(1, Ordering::Relaxed);
        load.adopted.fetch_add(1, Ordering::Relaxed);
        mailbox.send(Command::Adopt {
            client,
            peer,
            fixed,
        });
        None
    }

    /// Worker `n` took a handed-over connection from its mailbox.
    pub(crate) fn taken(&self, n: usize) {
        if let Some(l) = self.loads.get(n) {
            l.incoming.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// Worker `n` relays `live` sessions now.
    pub(crate) fn set_live(&self, n: usize, live: usize) {
        if let Some(l) = self.loads.get(n) {
            l.live.store(live, Ordering::Relaxed);
        }
    }

    /// Worker `n` is about to wait in epoll (true) or has woken (false).
    pub(crate) fn set_waiting(&self, n: usize, waiting: bool) {
        if let Some(l) = self.loads.get(n) {
            l.waiting.store(waiting, Ordering::Relaxed);
        }
    }

    /// Adds the relay's families to a scrape: sessions per worker and connections handed over.
    pub(crate) fn encode(&self, m: &mut rserpool_observe::MetricSet) {
        let mut f = m.family(
            "rserpool_lsnat_relay_sessions",
            rserpool_observe::Kind::Gauge,
            "TCP sessions each relay worker thread relays now.",
        );
        for (n, l) in self.loads.iter().enumerate() {
            f.sample(
                &[("worker", &n.to_string())],
                l.live.load(Ordering::Relaxed) as u64,
            );
        }
        let handed = self
            .loads
            .iter()
            .map(|l| l.adopted.load(Ordering::Relaxed))
            .sum();
        m.counter(
            "rserpool_lsnat_relay_handovers_total",
            "Connections a relay worker accepted and handed to a waiting worker with fewer sessions.",
            handed,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn balance(live: &[usize], waiting: &[bool]) -> Arc<Balance> {
        let b = Balance::new(live.len());
        for (n, (l, w)) in live.iter().zip(waiting).enumerate() {
            b.set_live(n, *l);
            b.set_waiting(n, *w);
        }
        b
    }

    #[test]
    fn a_connection_goes_to_the_least_loaded_waiting_worker_past_the_margin() {
        let b = balance(&[5, 1, 0], &[false, true, true]);
        assert_eq!(b.elsewhere(0), Some(2));
        // Within the margin: kept.
        let b = balance(&[2, 1], &[false, true]);
        assert_eq!(b.elsewhere(0), None);
        let b = balance(&[3, 1], &[false, true]);
        assert_eq!(b.elsewhere(0), Some(1));
    }

    #[test]
    fn a_busy_or_stopping_worker_is_never_offered_one() {
        let b = balance(&[9, 0, 4], &[false, false, true]);
        assert_eq!(b.elsewhere(0), Some(2));
        let b = balance(&[9, 0], &[false, false]);
        assert_eq!(b.elsewhere(0), None);
        // One worker: nobody to hand to.
        let b = balance(&[9], &[false]);
        assert_eq!(b.elsewhere(0), None);
    }

    #[test]
    fn connections_in_a_mailbox_count_until_taken() {
        let b = balance(&[4, 0], &[false, true]);
        b.loads[1].incoming.fetch_add(3, Ordering::Relaxed);
        assert_eq!(b.elsewhere(0), None);
        b.taken(1);
        b.taken(1);
        assert_eq!(b.elsewhere(0), Some(1));
    }
}
