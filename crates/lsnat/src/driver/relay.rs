//! The proxy's TCP data plane: one event loop per worker thread (mio over edge-triggered
//! epoll). The workers share each listening socket, registered in every worker's epoll with
//! `EPOLLEXCLUSIVE` (a new connection wakes one idle worker, not all, and not one that is
//! busy while another waits), and each relays the sessions it accepted until their end, or
//! hands a new one to a waiting worker with fewer sessions (`balance`). A session costs no
//! task, no timer and no waker: its two sockets are registered once for reading and writing
//! (two `epoll_ctl` calls) and leave epoll by being closed; the connect deadline sits in a
//! queue that is in deadline order by construction (one timeout for every connect still in
//! progress when it returns). The workers run under `SCHED_BATCH` unless `runtime.scheduling` says otherwise: on a busy
//! machine a woken worker waits for the running task's turn and then finds several events,
//! instead of preempting it for each one. Every decision is the core's; this module moves
//! bytes and reports what the sockets said.

use super::balance::Balance;
use super::Shared;
use crate::config::Scheduling;
use crate::core::receipt::{Outcome, Side};
use crate::core::{FlowKey, Gateway, Protocol, SessionId, Time, Traffic};
use mio::net::{TcpListener, TcpStream};
use mio::{Events, Interest, Poll, Token, Waker};
use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// What other threads ask of a worker.
pub(crate) enum Command {
    /// The core ended the session in `slot` (idle timeout, member lost, shutdown).
    Kill {
        slot: SlotId,
        session: SessionId,
        outcome: Outcome,
    },
    /// The gateway is stopping: accept no more, let the sessions end (at most two seconds).
    Stop,
    /// A connection another worker accepted and handed to this one (see `balance`).
    Adopt {
        client: TcpStream,
        peer: SocketAddr,
        fixed: Option<SocketAddr>,
    },
}

/// A worker's inbox: commands, and the waker of its event loop.
pub(crate) struct Mailbox {
    queue: Mutex<Vec<Command>>,
    waker: Waker,
}

impl Mailbox {
    /// Queues a command; the worker is woken when the queue was empty (otherwise a wake-up is
    /// pending already).
    pub(crate) fn send(&self, command: Command) {
        let mut q = self.queue.lock().unwrap_or_else(|e| e.into_inner());
        let was_empty = q.is_empty();
        q.push(command);
        drop(q);
        if was_empty {
            if let Err(e) = self.waker.wake() {
                tracing::error!(error = %e, "cannot wake a relay worker");
            }
        }
    }

    fn take(&self) -> Vec<Command> {
        std::mem::take(&mut *self.queue.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

/// A session's place in its worker: the slot and the slot's generation (a reused slot has a
/// new one, so a late command or event for an ended session finds nothing).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SlotId {
    index: u32,
    generation: u32,
}

const WAKER: Token = Token(usize::MAX);
/// Slot generations wrap at 2^30, so that sessions' tokens stay below the listeners' and the
/// waker's.
const GENERATIONS: usize = 0x3fff_ffff;
/// Listener `i` has token `LISTENERS - i`.
const LISTENERS: usize = usize::MAX - 1;
/// Most listeners per worker (tokens below are sessions' sockets).
const MAX_LISTENERS: usize = 1 << 16;
/// A stopping worker waits this long for its sessions to end.
const STOP_GRACE: Duration = Duration::from_secs(2);
/// After a failed accept (e.g. out of descriptors) the listeners are tried again this late.
const ACCEPT_RETRY: Duration = Duration::from_millis(20);
/// Connections accepted per listener event. The listener is level-triggered: one still
/// waiting is reported again by the next poll (with whatever else is ready), so accepting one
/// at a time costs no accept that only hears "would block", and a flood of connections
/// cannot starve the sessions of the worker.
const ACCEPT_BATCH: usize = 1;

fn token(slot: SlotId, side: Side) -> Token {
    let s = match side {
        Side::Client => 0,
        Side::Member => 1,
    };
    Token(((slot.generation as usize) << 33) | ((slot.index as usize) << 1) | s)
}

fn untoken(t: Token) -> (SlotId, Side) {
    let side = if t.0 & 1 == 0 {
        Side::Client
    } else {
        Side::Member
    };
    let slot = SlotId {
        index: ((t.0 >> 1) & 0xffff_ffff) as u32,
        generation: ((t.0 >> 33) & GENERATIONS) as u32,
    };
    (slot, side)
}

/// Sets SO_LINGER 0: the close that follows sends RST, so the peer sees an abortive end.
fn abort(stream: &TcpStream) {
    let _ = socket2::SockRef::from(stream).set_linger(Some(Duration::ZERO));
}

/// A receipt's words for a socket error.
pub(crate) fn io_reason(e: &io::Error) -> String {
    match e.kind() {
        io::ErrorKind::ConnectionRefused => "connection refused".into(),
        io::ErrorKind::ConnectionReset => "connection reset".into(),
        io::ErrorKind::TimedOut => "timed out".into(),
        _ => e.to_string(),
    }
}

/// One direction of a session: what was read and not yet written, and how far it got.
#[derive(Default)]
struct Dir {
    /// Bytes read that the destination did not take yet (its buffer was full).
    held: Vec<u8>,
    held_from: usize,
    /// Bulk mode: the pipe this direction splices through, and the bytes in it.
    pipe: Option<super::splice::Pipe>,
    in_pipe: usize,
    /// The destination said "would block" to the pipe and has not been writable since: an
    /// event from the source only tops the pipe up.
    dst_full: bool,
    /// The source said end of stream.
    eof: bool,
    /// The end was passed on (a FIN, or nothing needed as the other direction had ended).
    done: bool,
    /// Data has been seen (the first read was reported).
    seen: bool,
    /// The source may have something to read: an event said so and no read has found it
    /// empty since. A read shorter than the buffer empties a TCP socket (whatever arrives
    /// later raises a new edge), so it clears this unless the peer's FIN is known to be
    /// waiting (`fin`): no read per event only to hear "would block".
    readable: bool,
    /// The source's peer has closed (EPOLLRDHUP) or the socket has an error pending: read on
    /// to the end.
    fin: bool,
    /// The source has an error pending (a reset): its end is an abort, not a FIN.
    error: bool,
}

impl Dir {
    /// Whether the direction waits for its destination to take more.
    fn blocked(&self) -> bool {
        self.in_pipe > 0 || self.held_from < self.held.len()
    }

    /// Notes what an event said about the source.
    fn mark(&mut self, ev: &mio::event::Event) {
        if ev.is_readable() || ev.is_read_closed() || ev.is_error() {
            self.readable = true;
        }
        if ev.is_read_closed() || ev.is_error() {
            self.fin = true;
        }
        if ev.is_error() {
            self.error = true;
        }
    }

    /// After a read of `n` bytes into a buffer of `len`: whether the source may have more.
    fn after_read(&mut self, n: usize, len: usize) {
        if n < len && !self.fin {
            self.readable = false;
        }
    }
}

/// Writes to a socket; `more`: more is about to follow (`MSG_MORE`: the kernel holds a partial
/// segment until the next write, shutdown or close).
fn send(dst: &mut TcpStream, buf: &[u8], more: bool) -> io::Result<usize> {
    #[cfg(target_os = "linux")]
    if more {
        use std::os::fd::AsRawFd;
        // SAFETY: a valid descriptor and a buffer the kernel only reads.
        let n = unsafe {
            libc::send(
                dst.as_raw_fd(),
                buf.as_ptr().cast(),
                buf.len(),
                libc::MSG_MORE | libc::MSG_NOSIGNAL,
            )
        };
        return if n < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(n as usize)
        };
    }
    #[cfg(not(target_os = "linux"))]
    let _ = more;
    dst.write(buf)
}

/// What one run of a direction did.
#[derive(Default)]
struct Moved {
    bytes: u64,
    reads: u64,
    /// The direction's first data.
    first: bool,
    /// The end of stream was passed on.
    finished: bool,
}

/// A failed direction: reading its source, or writing its destination.
enum Failure {
    Read(io::Error),
    Write(io::Error),
}

/// Runs one direction until its source has nothing more or its destination is full.
/// `splice`: the pipe size a bulk direction splices through (None: it copies).
fn pump(
    d: &mut Dir,
    src: &mut TcpStream,
    dst: &mut TcpStream,
    other_done: bool,
    scratch: &mut [u8],
    splice: Option<usize>,
) -> Result<Moved, Failure> {
    let mut m = Moved::default();
    loop {
        // What is held goes first, in order.
        if d.in_pipe > 0 {
            let pipe = d.pipe.as_ref().expect("bytes in a pipe imply the pipe");
            if !d.dst_full {
                match pipe.drain(dst, d.in_pipe) {
                    Ok(0) => return Err(Failure::Write(io::ErrorKind::WriteZero.into())),
                    Ok(k) => d.in_pipe -= k.min(d.in_pipe),
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => d.dst_full = true,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(Failure::Write(e)),
                }
                continue;
            }
            // The destination is full: top the pipe up from the source meanwhile (one call),
            // so that the source's window stays open and the next drain finds a full pipe.
            let cap = pipe.capacity();
            if d.readable && !d.eof && d.in_pipe < cap {
                match pipe.fill(src, cap - d.in_pipe) {
                    Ok(0) => d.eof = true,
                    Ok(k) => {
                        d.in_pipe += k;
                        m.bytes += k as u64;
                        m.reads += 1;
                    }
                    // The socket is empty or the pipe's slots are full; a fill into the
                    // empty pipe will tell which.
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(Failure::Read(e)),
                }
            }
            return Ok(m);
        }
        if d.held_from < d.held.len() {
            match dst.write(&d.held[d.held_from..]) {
                Ok(0) => return Err(Failure::Write(io::ErrorKind::WriteZero.into())),
                Ok(k) => {
                    d.held_from += k;
                    if d.held_from == d.held.len() {
                        d.held.clear();
                        d.held_from = 0;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(m),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(Failure::Write(e)),
            }
            continue;
        }
        if d.eof {
            if !d.done {
                d.done = true;
                // Pass the FIN on, unless the other direction has ended too: then both
                // sockets are about to be closed, which sends it anyway.
                if !other_done {
                    let _ = dst.shutdown(std::net::Shutdown::Write);
                }
                m.finished = true;
            }
            return Ok(m);
        }
        if !d.readable {
            return Ok(m);
        }
        if let Some(pipe) = &d.pipe {
            match pipe.fill(src, pipe.capacity()) {
                Ok(0) => d.eof = true,
                // A short fill may mean the pipe's slots are full (one per socket buffer
                // fragment), not that the socket is empty: only "would block" says that.
                Ok(k) => {
                    d.in_pipe = k;
                    m.bytes += k as u64;
                    m.reads += 1;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    d.readable = false;
                    return Ok(m);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(Failure::Read(e)),
            }
            continue;
        }
        let n = match src.read(scratch) {
            Ok(0) => {
                d.eof = true;
                continue;
            }
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                d.readable = false;
                return Ok(m);
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(Failure::Read(e)),
        };
        d.after_read(n, scratch.len());
        if !d.seen {
            d.seen = true;
            m.first = true;
        }
        m.bytes += n as u64;
        m.reads += 1;
        let mut written = 0;
        // The source's FIN is known: the end of stream follows these bytes, and the shutdown
        // (or close) that passes it on sends them with the FIN in one segment. Not when the
        // source has an error pending: its end is passed on as a reset, which would discard
        // bytes the kernel still held.
        let more = d.fin && !d.error;
        while written < n {
            match send(dst, &scratch[written..n], more) {
                Ok(0) => return Err(Failure::Write(io::ErrorKind::WriteZero.into())),
                Ok(k) => written += k,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(Failure::Write(e)),
            }
        }
        if written < n {
            // The destination is full: hold the rest and wait for it to be writable.
            d.held.extend_from_slice(&scratch[written..n]);
            return Ok(m);
        }
        // A read that fills the buffer marks a bulk direction: move it into the kernel.
        if let Some(size) = splice.filter(|_| n == scratch.len()) {
            match super::splice::Pipe::new(size) {
                Ok(p) => d.pipe = Some(p),
                Err(e) => tracing::debug!(error = %e, "no pipe for splice; copying"),
            }
        }
    }
}

/// Traffic counted and not yet reported to the core.
#[derive(Default)]
struct Pending {
    to_member: Traffic,
    to_client: Traffic,
    /// When the core last heard (the core's clock, nanoseconds).
    reported_ns: u64,
}

impl Pending {
    fn take(&mut self) -> (Traffic, Traffic) {
        (
            std::mem::take(&mut self.to_member),
            std::mem::take(&mut self.to_client),
        )
    }

    fn report_into(&mut self, core: &mut Gateway, now: Time, id: SessionId) {
        let (m, c) = self.take();
        if m.bytes != 0 || c.bytes != 0 {
            core.activity(now, id, m, c);
        }
    }
}

/// A session on this worker.
struct Conn {
    id: SessionId,
    client: TcpStream,
    /// The member's socket (None between a failed connect and the next).
    member: Option<TcpStream>,
    /// Connect attempts so far; the deadline queue names the attempt it is for.
    attempt: u32,
    connecting: bool,
    /// Client → member.
    up: Dir,
    /// Member → client.
    down: Dir,
    pending: Pending,
}

struct Slot {
    generation: u32,
    conn: Option<Conn>,
}

/// A listener this worker waits on, and the virtual address its sessions are for.
struct Listener {
    socket: Arc<TcpListener>,
    /// The bound address when it is a specific one (no getsockname per connection).
    fixed: Option<SocketAddr>,
    /// Whether it is in this worker's epoll now (out while accepting fails, and once stopping).
    watched: bool,
}

/// Adds a shared listener to a worker's epoll: level-triggered and exclusive, so each new
/// connection wakes one waiting worker.
fn watch(poll: &Poll, listener: &TcpListener, t: Token) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let mut ev = libc::epoll_event {
        events: (libc::EPOLLIN | libc::EPOLLEXCLUSIVE) as u32,
        u64: t.0 as u64,
    };
    // SAFETY: epoll_ctl on descriptors that stay open for the call (the poll's and the
    // listener's); the kernel copies the event.
    let r = unsafe {
        libc::epoll_ctl(
            poll.as_raw_fd(),
            libc::EPOLL_CTL_ADD,
            listener.as_raw_fd(),
            &mut ev,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Takes a shared listener out of a worker's epoll (the socket stays open for the others).
fn unwatch(poll: &Poll, listener: &TcpListener) {
    use std::os::fd::AsRawFd;
    // SAFETY: as in `watch`; a null event is allowed for EPOLL_CTL_DEL.
    unsafe {
        libc::epoll_ctl(
            poll.as_raw_fd(),
            libc::EPOLL_CTL_DEL,
            listener.as_raw_fd(),
            std::ptr::null_mut(),
        );
    }
}

/// Applies `runtime.scheduling` to the calling thread. `Batch` replaces only the default
/// policy: a worker the operator started under a real-time or idle policy keeps it.
fn schedule(policy: Scheduling) -> io::Result<()> {
    #[cfg(target_os = "linux")]
    if policy == Scheduling::Batch {
        // SAFETY: pid 0 is the calling thread; the kernel only reads `param`.
        unsafe {
            if libc::sched_getscheduler(0) != libc::SCHED_OTHER {
                return Ok(());
            }
            let param = libc::sched_param { sched_priority: 0 };
            if libc::sched_setscheduler(0, libc::SCHED_BATCH, &param) != 0 {
                return Err(io::Error::last_os_error());
            }
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = policy;
    Ok(())
}

/// A worker: its event loop, its listeners and its sessions.
pub(crate) struct Worker {
    n: usize,
    shared: Arc<Shared>,
    balance: Arc<Balance>,
    mailbox: Arc<Mailbox>,
    poll: Poll,
    listeners: Vec<Listener>,
    slots: Vec<Slot>,
    free: Vec<u32>,
    live: usize,
    /// Connect deadlines in order: (deadline, slot, attempt).
    deadlines: VecDeque<(Instant, SlotId, u32)>,
    accept_retry: Option<Instant>,
    stopping: Option<Instant>,
    scratch: Box<[u8]>,
    /// The pipe size of a bulk direction (None: splice off).
    splice: Option<usize>,
    report_ns: u64,
    connect_timeout: Duration,
}

impl Worker {
    /// A worker for `listeners`, and the mailbox through which the core and the gateway reach
    /// it.
    pub(crate) fn new(
        n: usize,
        shared: Arc<Shared>,
        balance: Arc<Balance>,
        listeners: &[Arc<TcpListener>],
    ) -> io::Result<(Worker, Arc<Mailbox>)> {
        if listeners.len() > MAX_LISTENERS {
            return Err(io::Error::other(format!(
                "more than {MAX_LISTENERS} TCP listeners per worker"
            )));
        }
        let poll = Poll::new()?;
        let mailbox = Arc::new(Mailbox {
            queue: Mutex::new(Vec::new()),
            waker: Waker::new(poll.registry(), WAKER)?,
        });
        let mut ls = Vec::with_capacity(listeners.len());
        for (i, l) in listeners.iter().enumerate() {
            let fixed = l.local_addr().ok().filter(|a| !a.ip().is_unspecified());
            watch(&poll, l, Token(LISTENERS - i))?;
            ls.push(Listener {
                socket: l.clone(),
                fixed,
                watched: true,
            });
        }
        let rt = &shared.config.runtime;
        let worker = Worker {
            n,
            balance,
            mailbox: mailbox.clone(),
            poll,
            listeners: ls,
            slots: Vec::new(),
            free: Vec::new(),
            live: 0,
            deadlines: VecDeque::new(),
            accept_retry: None,
            stopping: None,
            scratch: vec![0u8; rt.buffer_size].into_boxed_slice(),
            splice: rt.splice.then_some(rt.pipe_size),
            report_ns: u64::try_from(rt.report_interval.as_nanos()).unwrap_or(u64::MAX),
            connect_timeout: shared.config.connect_timeout,
            shared,
        };
        Ok((worker, mailbox))
    }

    /// The worker's number (in its thread's name and its log lines).
    pub(crate) fn number(&self) -> usize {
        self.n
    }

    /// Runs the loop until the gateway stops and the sessions have ended (or the grace time
    /// has passed: what is left is closed).
    pub(crate) fn run(mut self) {
        if let Err(e) = schedule(self.shared.config.runtime.scheduling) {
            tracing::warn!(worker = self.n, error = %e, "cannot set the relay worker's scheduling policy");
        }
        let mut events = Events::with_capacity(256);
        loop {
            let now = Instant::now();
            if let Some(since) = self.stopping {
                if self.live == 0 || now >= since + STOP_GRACE {
                    break;
                }
            }
            let timeout = self.next_wake().map(|t| t.saturating_duration_since(now));
            self.balance.set_waiting(self.n, self.stopping.is_none());
            let polled = self.poll.poll(&mut events, timeout);
            self.balance.set_waiting(self.n, false);
            if let Err(e) = polled {
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                tracing::error!(worker = self.n, error = %e, "relay worker cannot poll; it stops");
                break;
            }
            for ev in events.iter() {
                match ev.token() {
                    WAKER => self.commands(),
                    Token(t) if t > LISTENERS - MAX_LISTENERS => self.accept(LISTENERS - t),
                    t => self.on_socket(t, ev),
                }
            }
            self.expire(Instant::now());
        }
        // A connection handed over as this worker stopped was never opened: it is refused like
        // one still in the listener's queue.
        for c in self.mailbox.take() {
            if let Command::Adopt { client, .. } = c {
                abort(&client);
            }
        }
        if self.live > 0 {
            tracing::warn!(
                worker = self.n,
                sessions = self.live,
                "relay worker stopped with sessions still open; they are closed"
            );
        }
    }

    fn next_wake(&self) -> Option<Instant> {
        [
            self.deadlines.front().map(|d| d.0),
            self.accept_retry,
            self.stopping.map(|s| s + STOP_GRACE),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    fn expire(&mut self, now: Instant) {
        while let Some(&(at, slot, attempt)) = self.deadlines.front() {
            if at > now {
                break;
            }
            self.deadlines.pop_front();
            let current = self
                .conn(slot)
                .is_some_and(|c| c.connecting && c.attempt == attempt);
            if current {
                let reason = format!("connect timed out after {:?}", self.connect_timeout);
                self.connect_failed(slot, reason);
            }
        }
        if self.accept_retry.is_some_and(|t| t <= now) {
            self.accept_retry = None;
            for (i, l) in self.listeners.iter_mut().enumerate() {
                if !l.watched {
                    match watch(&self.poll, &l.socket, Token(LISTENERS - i)) {
                        Ok(()) => l.watched = true,
                        Err(e) => {
                            tracing::error!(worker = self.n, error = %e, "cannot watch a listener again");
                            self.accept_retry = Some(now + ACCEPT_RETRY);
                        }
                    }
                }
            }
        }
    }

    fn conn(&self, slot: SlotId) -> Option<&Conn> {
        let s = self.slots.get(slot.index as usize)?;
        (s.generation == slot.generation)
            .then_some(s.conn.as_ref())
            .flatten()
    }

    fn conn_mut(&mut self, slot: SlotId) -> Option<&mut Conn> {
        let s = self.slots.get_mut(slot.index as usize)?;
        if s.generation == slot.generation {
            s.conn.as_mut()
        } else {
            None
        }
    }

    /// A free slot (not yet holding a session).
    fn reserve(&mut self) -> SlotId {
        let index = match self.free.pop() {
            Some(i) => i,
            None => {
                self.slots.push(Slot {
                    generation: 0,
                    conn: None,
                });
                u32::try_from(self.slots.len() - 1).expect("fewer than 2^32 sessions per worker")
            }
        };
        SlotId {
            index,
            generation: self.slots[index as usize].generation,
        }
    }

    /// Empties a slot; its next session gets a new generation.
    fn release(&mut self, slot: SlotId) -> Option<Conn> {
        let s = self.slots.get_mut(slot.index as usize)?;
        if s.generation != slot.generation {
            return None;
        }
        let conn = s.conn.take();
        s.generation = (s.generation + 1) & GENERATIONS as u32;
        self.free.push(slot.index);
        if conn.is_some() {
            self.live -= 1;
            self.balance.set_live(self.n, self.live);
        }
        conn
    }

    fn commands(&mut self) {
        for c in self.mailbox.take() {
            match c {
                Command::Kill {
                    slot,
                    session,
                    outcome,
                } => self.kill(slot, session, outcome),
                Command::Adopt {
                    client,
                    peer,
                    fixed,
                } => {
                    self.balance.taken(self.n);
                    self.open(client, peer, fixed);
                }
                Command::Stop => {
                    if self.stopping.is_none() {
                        self.stopping = Some(Instant::now());
                        for l in self.listeners.drain(..) {
                            if l.watched {
                                unwatch(&self.poll, &l.socket);
                            }
                        }
                        self.accept_retry = None;
                    }
                }
            }
        }
    }

    /// The core ended the session: it is recorded already; close the sockets as the outcome
    /// says (an idle timeout closes cleanly, anything else aborts).
    fn kill(&mut self, slot: SlotId, session: SessionId, outcome: Outcome) {
        if self.conn(slot).is_none_or(|c| c.id != session) {
            return;
        }
        let Some(mut c) = self.release(slot) else {
            return;
        };
        if c.connecting {
            if matches!(outcome, Outcome::MemberLost { .. }) {
                abort(&c.client);
            }
            return;
        }
        if !matches!(outcome, Outcome::IdleTimeout { .. }) {
            abort(&c.client);
            if let Some(m) = &c.member {
                abort(m);
            }
        }
        let (m, cl) = c.pending.take();
        if m.bytes != 0 || cl.bytes != 0 {
            self.shared
                .with(|core, now| core.activity(now, session, m, cl));
        }
    }

    /// Accepts what listener `i` has, up to a batch: the listener is level-triggered, so what
    /// is left wakes this worker or another again.
    fn accept(&mut self, i: usize) {
        for _ in 0..ACCEPT_BATCH {
            let Some(l) = self.listeners.get_mut(i) else {
                return;
            };
            match l.socket.accept() {
                Ok((client, peer)) => {
                    let fixed = l.fixed;
                    if let Some(client) = self.balance.offer(self.n, client, peer, fixed) {
                        self.open(client, peer, fixed);
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::ConnectionAborted => {}
                Err(e) => {
                    // Out of descriptors: keep serving the sessions there are, and stop
                    // watching the listener for a moment (it stays readable: watched, it
                    // would wake this loop without end).
                    tracing::warn!(error = %e, "accept failed");
                    unwatch(&self.poll, &l.socket);
                    l.watched = false;
                    self.accept_retry = Some(Instant::now() + ACCEPT_RETRY);
                    return;
                }
            }
        }
    }

    fn open(&mut self, client: TcpStream, peer: SocketAddr, fixed: Option<SocketAddr>) {
        let _ = client.set_nodelay(true);
        let virtual_address = fixed.or_else(|| client.local_addr().ok()).unwrap_or(peer);
        let flow = FlowKey {
            protocol: Protocol::Tcp,
            client: peer,
            virtual_address,
        };
        let slot = self.reserve();
        let bound = {
            let now = self.shared.now();
            let mut g = self.shared.lock();
            let r = g.core.open(now, flow);
            if let Ok(b) = &r {
                g.kills
                    .insert(b.session, super::Kill::Relay(self.mailbox.clone(), slot));
            }
            g.apply_actions();
            r
        };
        let binding = match bound {
            Ok(b) => b,
            Err(_) => {
                self.release(slot);
                abort(&client);
                return;
            }
        };
        let mut conn = Conn {
            id: binding.session,
            client,
            member: None,
            attempt: 0,
            connecting: false,
            up: Dir::default(),
            down: Dir::default(),
            pending: Pending {
                reported_ns: u64::try_from(self.shared.now().as_nanos()).unwrap_or(u64::MAX),
                ..Pending::default()
            },
        };
        let registered = self.poll.registry().register(
            &mut conn.client,
            token(slot, Side::Client),
            Interest::READABLE | Interest::WRITABLE,
        );
        self.slots[slot.index as usize].conn = Some(conn);
        self.live += 1;
        self.balance.set_live(self.n, self.live);
        if let Err(e) = registered {
            self.end(slot, Some((Side::Client, e)));
            return;
        }
        self.connect(slot, binding.address);
    }

    /// Starts a connect to `address` for the session in `slot`; failures go to the core,
    /// which may bind the session elsewhere.
    fn connect(&mut self, slot: SlotId, mut address: SocketAddr) {
        loop {
            let deadline = Instant::now() + self.connect_timeout;
            let started = TcpStream::connect(address).and_then(|mut s| {
                self.poll
                    .registry()
                    .register(
                        &mut s,
                        token(slot, Side::Member),
                        Interest::READABLE | Interest::WRITABLE,
                    )
                    .map(|()| s)
            });
            let Some(c) = self.conn_mut(slot) else {
                return;
            };
            match started {
                Ok(s) => {
                    // Over loopback or a local bridge the handshake is over before connect
                    // returns: the session starts now rather than an event later, reading
                    // what the client sent without waiting for an event (by the time a
                    // connection is accepted its first bytes are usually there; if not, the
                    // read hears "would block" and the next bytes raise an event).
                    let made = s.peer_addr().is_ok();
                    c.member = Some(s);
                    c.attempt += 1;
                    c.connecting = true;
                    c.up.readable |= made;
                    if made {
                        self.established(slot);
                    } else {
                        let attempt = c.attempt;
                        self.deadlines.push_back((deadline, slot, attempt));
                    }
                    return;
                }
                Err(e) => {
                    c.attempt += 1;
                    match self.rebind(slot, io_reason(&e)) {
                        Some(next) => address = next,
                        None => return,
                    }
                }
            }
        }
    }

    /// The connect in `slot` failed: the core records it and may bind the session to another
    /// member (the address returned), or ends it (None; the client is reset).
    fn rebind(&mut self, slot: SlotId, reason: String) -> Option<SocketAddr> {
        let c = self.conn_mut(slot)?;
        c.member = None;
        c.connecting = false;
        let id = c.id;
        tracing::debug!(session = %id, %reason, "connect failed");
        let next = self
            .shared
            .with(|core, now| core.connect_failed(now, id, &reason));
        match next {
            Some(b) => Some(b.address),
            None => {
                self.shared.lock().kills.remove(&id);
                if let Some(c) = self.release(slot) {
                    abort(&c.client);
                }
                None
            }
        }
    }

    fn connect_failed(&mut self, slot: SlotId, reason: String) {
        if let Some(next) = self.rebind(slot, reason) {
            self.connect(slot, next);
        }
    }

    /// The member's connection in `slot` is made: the core hears of it, and whatever either
    /// side sent meanwhile is relayed.
    fn established(&mut self, slot: SlotId) {
        let Some(c) = self.conn_mut(slot) else {
            return;
        };
        c.connecting = false;
        if let Some(m) = &c.member {
            let _ = m.set_nodelay(true);
        }
        let (up, down) = (c.up.readable, c.down.readable);
        let id = c.id;
        self.shared.with(|core, now| core.connected(now, id));
        if up {
            self.run_dir(slot, Side::Client);
        }
        if down {
            self.run_dir(slot, Side::Member);
        }
    }

    fn on_socket(&mut self, t: Token, ev: &mio::event::Event) {
        let (slot, side) = untoken(t);
        let Some(c) = self.conn_mut(slot) else {
            return;
        };
        if c.connecting {
            // The client's data waits in its socket until the member answers.
            if side == Side::Client {
                c.up.mark(ev);
                return;
            }
            // A failed connect reports an error or a hang-up. The member's FIN alone
            // (EPOLLRDHUP) is a connection made: the member answered and ended at once, and
            // its answer is read like any other.
            if ev.is_error() || ev.is_write_closed() {
                let reason = match c.member.as_ref().map(|m| m.take_error()) {
                    Some(Ok(Some(e))) | Some(Err(e)) => io_reason(&e),
                    _ => "connection closed during the handshake".into(),
                };
                self.connect_failed(slot, reason);
                return;
            }
            if !ev.is_writable() {
                return;
            }
            c.down.mark(ev);
            self.established(slot);
            return;
        }
        let from = match side {
            Side::Client => &mut c.up,
            Side::Member => &mut c.down,
        };
        from.mark(ev);
        // Only an event about reading runs the direction from this socket: one that waits with
        // data held is resumed by its destination's writable event instead.
        let reads = ev.is_readable() || ev.is_read_closed() || ev.is_error();
        let writes = ev.is_writable() || ev.is_write_closed() || ev.is_error();
        let other = match side {
            Side::Client => Side::Member,
            Side::Member => Side::Client,
        };
        // Reading this socket runs the direction from it; its being writable again runs the
        // direction into it, if that one was waiting.
        if reads {
            self.run_dir(slot, side);
        }
        if writes {
            let waiting = self.conn_mut(slot).is_some_and(|c| {
                let into = match other {
                    Side::Client => &mut c.up,
                    Side::Member => &mut c.down,
                };
                into.dst_full = false;
                into.blocked()
            });
            if waiting {
                self.run_dir(slot, other);
            }
        }
    }

    /// Runs the direction whose data comes from `from`, reports it, and ends the session when
    /// both directions have ended or one failed.
    fn run_dir(&mut self, slot: SlotId, from: Side) {
        let splice = self.splice;
        let report_ns = self.report_ns;
        let Some(s) = self.slots.get_mut(slot.index as usize) else {
            return;
        };
        let Some(c) = s.conn.as_mut().filter(|_| s.generation == slot.generation) else {
            return;
        };
        let Some(member) = c.member.as_mut() else {
            return;
        };
        let result = match from {
            Side::Client => pump(
                &mut c.up,
                &mut c.client,
                member,
                c.down.done,
                &mut self.scratch,
                splice,
            ),
            Side::Member => pump(
                &mut c.down,
                member,
                &mut c.client,
                c.up.done,
                &mut self.scratch,
                splice,
            ),
        };
        let moved = match result {
            Ok(m) => m,
            Err(Failure::Read(e)) => return self.end(slot, Some((from, e))),
            Err(Failure::Write(e)) => {
                let to = match from {
                    Side::Client => Side::Member,
                    Side::Member => Side::Client,
                };
                return self.end(slot, Some((to, e)));
            }
        };
        if moved.reads > 0 {
            let t = match from {
                Side::Client => &mut c.pending.to_member,
                Side::Member => &mut c.pending.to_client,
            };
            t.bytes += moved.bytes;
            t.packets += moved.reads;
        }
        let now_ns = if moved.reads > 0 {
            u64::try_from(self.shared.now().as_nanos()).unwrap_or(u64::MAX)
        } else {
            0
        };
        let due = moved.reads > 0 && now_ns.saturating_sub(c.pending.reported_ns) >= report_ns;
        let both_done = c.up.done && c.down.done;
        if (moved.first || moved.finished || due) && !both_done {
            if due {
                c.pending.reported_ns = now_ns;
            }
            let id = c.id;
            let pending = &mut c.pending;
            self.shared.with(|core, now| {
                if moved.first {
                    match from {
                        Side::Client => core.client_data(now, id),
                        Side::Member => core.reached(now, id),
                    }
                }
                if due || moved.finished {
                    pending.report_into(core, now, id);
                }
                if moved.finished {
                    core.half_closed(now, id, from);
                }
            });
        } else if both_done {
            // The last direction ended: one lock for its report and the session's end.
            let id = c.id;
            let mut c = self.release(slot).expect("the session is in its slot");
            let now = self.shared.now();
            let mut g = self.shared.lock();
            if moved.first {
                match from {
                    Side::Client => g.core.client_data(now, id),
                    Side::Member => g.core.reached(now, id),
                }
            }
            c.pending.report_into(&mut g.core, now, id);
            if moved.finished {
                g.core.half_closed(now, id, from);
            }
            g.core.closed(now, id, Outcome::Closed);
            g.kills.remove(&id);
            g.apply_actions();
        }
    }

    /// Ends the session in `slot` after a socket failed (`side`'s); None: both directions
    /// ended cleanly.
    fn end(&mut self, slot: SlotId, failed: Option<(Side, io::Error)>) {
        let Some(mut c) = self.release(slot) else {
            return;
        };
        let outcome = match failed {
            None => Outcome::Closed,
            Some((side, e)) => {
                // Pass an abortive end on to the other side.
                match side {
                    Side::Client => {
                        if let Some(m) = &c.member {
                            abort(m);
                        }
                    }
                    Side::Member => abort(&c.client),
                }
                let reset = matches!(
                    e.kind(),
                    io::ErrorKind::ConnectionReset | io::ErrorKind::BrokenPipe
                );
                if reset {
                    Outcome::Reset { by: side }
                } else if side == Side::Member {
                    Outcome::MemberLost {
                        reason: io_reason(&e),
                    }
                } else {
                    Outcome::Aborted {
                        by: side,
                        reason: io_reason(&e),
                    }
                }
            }
        };
        let id = c.id;
        let now = self.shared.now();
        let mut g = self.shared.lock();
        c.pending.report_into(&mut g.core, now, id);
        g.core.closed(now, id, outcome);
        g.kills.remove(&id);
        g.apply_actions();
    }
}
