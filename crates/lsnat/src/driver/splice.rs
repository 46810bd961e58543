//! Zero-copy relay on Linux: `splice(2)` moves bytes socket → pipe → socket inside the kernel,
//! so the relay never copies the payload through user space. With `runtime.splice` on, a TCP
//! direction switches to it once one read fills the relay buffer (a bulk transfer); short
//! exchanges never pay for the pipe. The event loop (`relay`) drives it: it drains the pipe
//! into the destination and, while the destination is full, tops the pipe up from the source,
//! so the pipe (`runtime.pipe-size`) is the relay's buffer for a slow destination.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// A pipe used as the kernel buffer of one direction.
pub(crate) struct Pipe {
    read: OwnedFd,
    write: OwnedFd,
    /// Bytes the pipe holds (what the kernel granted, not what was asked for).
    capacity: usize,
}

impl Pipe {
    /// Moves up to `len` bytes from the socket `from` into the pipe (0: end of stream).
    pub(crate) fn fill(&self, from: &impl AsRawFd, len: usize) -> io::Result<usize> {
        splice(from.as_raw_fd(), self.write.as_raw_fd(), len)
    }

    /// Bytes the pipe holds.
    pub(crate) fn capacity(&self) -> usize {
        self.capacity
    }

    /// Moves up to `len` bytes from the pipe to the socket `to`.
    pub(crate) fn drain(&self, to: &impl AsRawFd, len: usize) -> io::Result<usize> {
        splice(self.read.as_raw_fd(), to.as_raw_fd(), len)
    }
}

impl Pipe {
    /// A non-blocking pipe of `size` bytes, or of what the kernel grants (a process over its
    /// user's pipe quota or asking more than `pipe-max-size` unprivileged keeps the default).
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
        // Failing to resize is harmless: the pipe keeps the size it has, read back below.
        // SAFETY: fcntl on a descriptor we own.
        let granted = unsafe {
            libc::fcntl(write.as_raw_fd(), libc::F_SETPIPE_SZ, size);
            libc::fcntl(write.as_raw_fd(), libc::F_GETPIPE_SZ)
        };
        let capacity = usize::try_from(granted).unwrap_or(0).max(4096);
        Ok(Pipe {
            read,
            write,
            capacity,
        })
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
