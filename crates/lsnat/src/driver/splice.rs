//! Zero-copy relay on Linux: `splice(2)` moves bytes socket → pipe → socket inside the kernel,
//! so the relay never copies the payload through user space. With `runtime.splice` on, a TCP
//! direction switches to it once one read fills the relay buffer (a bulk transfer); short
//! exchanges never pay for the pipe.

use super::tcp::{Ctx, RelayError};
use crate::core::receipt::Side;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use tokio::io::Interest;
use tokio::net::TcpStream;

/// Smallest pipe used (Linux's default pipe size): a bulk direction moves this much per call.
pub(crate) const MIN_PIPE: usize = 65_536;

/// A pipe used as the kernel buffer of one direction.
pub(crate) struct Pipe {
    read: OwnedFd,
    write: OwnedFd,
}

impl Pipe {
    /// A non-blocking pipe of (at least) `size` bytes.
    pub(crate) fn new(size: usize) -> io::Result<Pipe> {
        let mut fds = [0 as RawFd; 2];
        // SAFETY: pipe2 writes two descriptors into the array we pass.
        let r = unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_NONBLOCK | libc::O_CLOEXEC) };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: both descriptors are fresh and owned by nobody else.
        let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        let size = libc::c_int::try_from(size).unwrap_or(libc::c_int::MAX);
        // A larger pipe moves more per call; failing to resize is harmless.
        // SAFETY: fcntl on a descriptor we own.
        unsafe {
            libc::fcntl(write.as_raw_fd(), libc::F_SETPIPE_SZ, size);
        }
        Ok(Pipe { read, write })
    }
}

fn splice(from: RawFd, to: RawFd, len: usize) -> io::Result<usize> {
    // SAFETY: plain splice(2) between descriptors we hold; null offsets (sockets and pipes).
    let n = unsafe {
        libc::splice(
            from,
            std::ptr::null_mut(),
            to,
            std::ptr::null_mut(),
            len,
            libc::SPLICE_F_MOVE | libc::SPLICE_F_NONBLOCK,
        )
    };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

/// Relays `from` → `to` through `pipe` until EOF (then half-closes `to`) or an error. The
/// direction's first byte has already gone through the copying relay.
pub(crate) async fn pump(
    from: &TcpStream,
    to: &TcpStream,
    pipe: &Pipe,
    chunk: usize,
    side: Side,
    ctx: &Ctx<'_>,
) -> Result<(), RelayError> {
    let other = match side {
        Side::Client => Side::Member,
        Side::Member => Side::Client,
    };
    loop {
        // Socket → pipe (the pipe is empty here, so EAGAIN means the socket has nothing).
        let n = loop {
            from.readable().await.map_err(|e| (side, e))?;
            match from.try_io(Interest::READABLE, || {
                splice(from.as_raw_fd(), pipe.write.as_raw_fd(), chunk)
            }) {
                Ok(n) => break n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) => return Err((side, e)),
            }
        };
        if n == 0 {
            if !ctx.other_done(side) {
                let _ = socket2::SockRef::from(to).shutdown(std::net::Shutdown::Write);
            }
            ctx.half_closed(side);
            return Ok(());
        }
        // Pipe → socket, until the pipe is empty again.
        let mut left = n;
        while left > 0 {
            to.writable().await.map_err(|e| (other, e))?;
            match to.try_io(Interest::WRITABLE, || {
                splice(pipe.read.as_raw_fd(), to.as_raw_fd(), left)
            }) {
                Ok(0) => return Err((other, io::ErrorKind::WriteZero.into())),
                Ok(m) => left -= m.min(left),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) => return Err((other, e)),
            }
        }
        ctx.count(side, n);
    }
}
