//! The Linux SCTP socket API (RFC 6458 as Linux implements it) over `libc`: the only module of
//! this crate with `unsafe` code.
//!
//! Every structure the kernel reads or writes is built or parsed here as bytes at the offsets of
//! `<linux/sctp.h>` (checked against the header: see the tests at the end), so the unsafe
//! surface is the system calls themselves, each with a pointer and a length that come from one
//! live Rust buffer.

use std::io;
use std::mem::size_of;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// `SOL_SCTP` / `IPPROTO_SCTP`.
pub const SOL_SCTP: libc::c_int = 132;
const IPPROTO_SCTP: libc::c_int = 132;

// Socket options (<linux/sctp.h>).
const SCTP_RTOINFO: libc::c_int = 0;
const SCTP_ASSOCINFO: libc::c_int = 1;
const SCTP_INITMSG: libc::c_int = 2;
const SCTP_NODELAY: libc::c_int = 3;
const SCTP_PEER_ADDR_PARAMS: libc::c_int = 9;
const SCTP_RECVRCVINFO: libc::c_int = 32;
const SCTP_SOCKOPT_BINDX_ADD: libc::c_int = 100;
const SCTP_GET_PEER_ADDRS: libc::c_int = 108;
const SCTP_GET_LOCAL_ADDRS: libc::c_int = 109;
const SCTP_SOCKOPT_CONNECTX3: libc::c_int = 111;
const SCTP_EVENT: libc::c_int = 127;

/// `SCTP_FUTURE_ASSOC`: socket defaults for associations not yet created.
const SCTP_FUTURE_ASSOC: i32 = 0;

// Control message types.
const SCTP_SNDINFO: libc::c_int = 2;
const SCTP_RCVINFO: libc::c_int = 3;

// Send flags (`snd_flags`).
/// Send an ABORT.
pub const SCTP_ABORT: u16 = 1 << 2;
/// Start a graceful SHUTDOWN (`MSG_FIN`).
pub const SCTP_EOF: u16 = 0x200;

/// `msg_flags` bit of a notification.
pub const MSG_NOTIFICATION: libc::c_int = 0x8000;

// Notification types.
/// `SCTP_ASSOC_CHANGE`.
pub const SCTP_ASSOC_CHANGE: u16 = 0x8001;
/// `SCTP_PEER_ADDR_CHANGE`.
pub const SCTP_PEER_ADDR_CHANGE: u16 = 0x8002;
/// `SCTP_REMOTE_ERROR`.
pub const SCTP_REMOTE_ERROR: u16 = 0x8004;
/// `SCTP_SHUTDOWN_EVENT`.
pub const SCTP_SHUTDOWN_EVENT: u16 = 0x8005;
/// `SCTP_SEND_FAILED_EVENT`.
pub const SCTP_SEND_FAILED_EVENT: u16 = 0x800d;

// Peer address parameter flags.
const SPP_HB_ENABLE: u32 = 1 << 0;
const SPP_HB_DISABLE: u32 = 1 << 1;

// Structure sizes and offsets, from <linux/sctp.h> on Linux (all architectures: only 16/32-bit
// fields and the packed sockaddr_storage).
const SIZEOF_SNDINFO: usize = 16;
const SIZEOF_RCVINFO: usize = 28;
const SIZEOF_PADDRPARAMS: usize = 156;
const SIZEOF_SOCKADDR_STORAGE: usize = 128;
const SIZEOF_SOCKADDR_IN: usize = 16;
const SIZEOF_SOCKADDR_IN6: usize = 28;

fn cvt(r: libc::c_int) -> io::Result<libc::c_int> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

fn cvt_size(r: libc::ssize_t) -> io::Result<usize> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r as usize)
    }
}

/// Registers the socket with tokio's reactor.
pub fn register(fd: OwnedFd) -> io::Result<tokio::io::unix::AsyncFd<OwnedFd>> {
    // SAFETY: an OwnedFd is an open descriptor that it alone owns; its as_raw_fd always returns
    // that descriptor, which stays open until the AsyncFd (its only owner) drops it.
    unsafe { tokio::io::unix::AsyncFd::register(fd) }.map_err(|e| e.into_parts().1)
}

/// Creates a non-blocking one-to-many (`SOCK_SEQPACKET`) SCTP socket.
pub fn socket(v6: bool) -> io::Result<OwnedFd> {
    let family = if v6 { libc::AF_INET6 } else { libc::AF_INET };
    // SAFETY: socket(2) takes plain integers; a non-negative result is a new descriptor that
    // nothing else owns, so OwnedFd may take it.
    unsafe {
        let fd = cvt(libc::socket(
            family,
            libc::SOCK_SEQPACKET | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            IPPROTO_SCTP,
        ))?;
        Ok(OwnedFd::from_raw_fd(fd))
    }
}

fn setsockopt_bytes(fd: RawFd, level: libc::c_int, opt: libc::c_int, val: &[u8]) -> io::Result<()> {
    // SAFETY: `val` is a live buffer of `val.len()` bytes for the duration of the call; the
    // kernel only reads it.
    cvt(unsafe {
        libc::setsockopt(
            fd,
            level,
            opt,
            val.as_ptr().cast(),
            val.len() as libc::socklen_t,
        )
    })
    .map(drop)
}

/// getsockopt into `buf`; returns the length the kernel reported.
fn getsockopt_bytes(fd: RawFd, opt: libc::c_int, buf: &mut [u8]) -> io::Result<usize> {
    let mut len = buf.len() as libc::socklen_t;
    // SAFETY: `buf` is a live, writable buffer of `len` bytes; the kernel writes at most `len`
    // bytes and updates `len`.
    cvt(unsafe { libc::getsockopt(fd, SOL_SCTP, opt, buf.as_mut_ptr().cast(), &mut len) })?;
    Ok(len as usize)
}

fn set_int(fd: RawFd, level: libc::c_int, opt: libc::c_int, v: libc::c_int) -> io::Result<()> {
    setsockopt_bytes(fd, level, opt, &v.to_ne_bytes())
}

/// Appends `addr` as a `sockaddr_in` or `sockaddr_in6`.
pub fn push_sockaddr(out: &mut Vec<u8>, addr: &SocketAddr) {
    match addr {
        SocketAddr::V4(a) => {
            out.extend_from_slice(&(libc::AF_INET as u16).to_ne_bytes());
            out.extend_from_slice(&a.port().to_be_bytes());
            out.extend_from_slice(&a.ip().octets());
            out.extend_from_slice(&[0u8; 8]);
        }
        SocketAddr::V6(a) => {
            out.extend_from_slice(&(libc::AF_INET6 as u16).to_ne_bytes());
            out.extend_from_slice(&a.port().to_be_bytes());
            out.extend_from_slice(&a.flowinfo().to_be_bytes());
            out.extend_from_slice(&a.ip().octets());
            out.extend_from_slice(&a.scope_id().to_ne_bytes());
        }
    }
}

/// Parses one `sockaddr_in`/`sockaddr_in6` at the start of `b`: the address (IPv4-mapped IPv6
/// addresses as IPv4) and the bytes it occupies.
pub fn parse_sockaddr(b: &[u8]) -> Option<(SocketAddr, usize)> {
    let family = i32::from(u16::from_ne_bytes([*b.first()?, *b.get(1)?]));
    if family == libc::AF_INET {
        let b = b.get(..SIZEOF_SOCKADDR_IN)?;
        let port = u16::from_be_bytes([b[2], b[3]]);
        let ip = Ipv4Addr::new(b[4], b[5], b[6], b[7]);
        Some((
            SocketAddr::V4(SocketAddrV4::new(ip, port)),
            SIZEOF_SOCKADDR_IN,
        ))
    } else if family == libc::AF_INET6 {
        let b = b.get(..SIZEOF_SOCKADDR_IN6)?;
        let port = u16::from_be_bytes([b[2], b[3]]);
        let flow = u32::from_be_bytes([b[4], b[5], b[6], b[7]]);
        let mut o = [0u8; 16];
        o.copy_from_slice(&b[8..24]);
        let ip = Ipv6Addr::from(o);
        let scope = u32::from_ne_bytes([b[24], b[25], b[26], b[27]]);
        let addr = match ip.to_ipv4_mapped() {
            Some(v4) => SocketAddr::V4(SocketAddrV4::new(v4, port)),
            None => SocketAddr::V6(SocketAddrV6::new(ip, port, flow, scope)),
        };
        Some((addr, SIZEOF_SOCKADDR_IN6))
    } else {
        None
    }
}

/// `sctp_bindx(fd, addrs, SCTP_BINDX_ADD_ADDR)`: binds (or adds) local addresses.
pub fn bindx_add(fd: RawFd, addrs: &[SocketAddr]) -> io::Result<()> {
    let mut buf = Vec::new();
    for a in addrs {
        push_sockaddr(&mut buf, a);
    }
    setsockopt_bytes(fd, SOL_SCTP, SCTP_SOCKOPT_BINDX_ADD, &buf)
}

/// `listen(2)`.
pub fn listen(fd: RawFd, backlog: i32) -> io::Result<()> {
    // SAFETY: plain integers.
    cvt(unsafe { libc::listen(fd, backlog) }).map(drop)
}

/// `sctp_connectx`: starts an association to one peer at `addrs` and returns the kernel's
/// association id (the socket is non-blocking: the handshake goes on in the background).
pub fn connectx(fd: RawFd, addrs: &[SocketAddr]) -> io::Result<i32> {
    let mut packed = Vec::new();
    for a in addrs {
        push_sockaddr(&mut packed, a);
    }
    // struct sctp_getaddrs_old { sctp_assoc_t assoc_id; int addr_num (bytes); struct sockaddr *addrs; }
    #[repr(C)]
    struct GetAddrsOld {
        assoc_id: i32,
        addr_num: libc::c_int,
        addrs: *mut libc::c_void,
    }
    let mut param = GetAddrsOld {
        assoc_id: 0,
        addr_num: packed.len() as libc::c_int,
        addrs: packed.as_mut_ptr().cast(),
    };
    let mut len = size_of::<GetAddrsOld>() as libc::socklen_t;
    // SAFETY: `param` is a live, writable struct of `len` bytes with the layout of
    // `struct sctp_getaddrs_old`; its `addrs` points at `packed`, live for the call, of
    // `addr_num` bytes. The kernel copies the addresses in and writes back `assoc_id`.
    let r = unsafe {
        libc::getsockopt(
            fd,
            SOL_SCTP,
            SCTP_SOCKOPT_CONNECTX3,
            (&mut param as *mut GetAddrsOld).cast(),
            &mut len,
        )
    };
    if r < 0 {
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EINPROGRESS) {
            return Err(e);
        }
    }
    Ok(param.assoc_id)
}

/// The local (`local = true`) or peer addresses of an association (`assoc_id` 0 with
/// `local = true`: the socket's bound addresses).
pub fn getaddrs(fd: RawFd, assoc_id: i32, local: bool) -> io::Result<Vec<SocketAddr>> {
    let opt = if local {
        SCTP_GET_LOCAL_ADDRS
    } else {
        SCTP_GET_PEER_ADDRS
    };
    let mut size = 4096;
    loop {
        // struct sctp_getaddrs { sctp_assoc_t assoc_id; __u32 addr_num; __u8 addrs[]; }
        let mut buf = vec![0u8; size];
        buf[..4].copy_from_slice(&assoc_id.to_ne_bytes());
        match getsockopt_bytes(fd, opt, &mut buf) {
            Ok(len) => {
                // The kernel reports in optlen the bytes of addresses it wrote, after the
                // 8-byte header.
                let n = u32::from_ne_bytes([buf[4], buf[5], buf[6], buf[7]]) as usize;
                let mut rest = &buf[8..(8 + len).min(size)];
                let mut out = Vec::with_capacity(n);
                for _ in 0..n {
                    let Some((a, used)) = parse_sockaddr(rest) else {
                        break;
                    };
                    out.push(a);
                    rest = &rest[used..];
                }
                return Ok(out);
            }
            Err(e) if e.raw_os_error() == Some(libc::ENOMEM) && size < 1 << 20 => size *= 4,
            Err(e) => return Err(e),
        }
    }
}

/// The tunables applied to a socket before it binds.
#[derive(Debug, Clone)]
pub struct Tuning {
    pub heartbeat_interval_ms: Option<u32>,
    pub rto_initial_ms: u32,
    pub rto_min_ms: u32,
    pub rto_max_ms: u32,
    pub path_max_retrans: u16,
    pub association_max_retrans: u16,
    pub init_max_attempts: u16,
    pub init_max_timeout_ms: u16,
    pub outbound_streams: u16,
    pub max_inbound_streams: u16,
    pub nodelay: bool,
    pub send_buffer: Option<usize>,
    pub receive_buffer: Option<usize>,
}

/// Subscribes to the notifications used, asks for `SCTP_RCVINFO` with each message, and
/// applies `t` as defaults for all future associations of the socket.
pub fn configure(fd: RawFd, t: &Tuning) -> io::Result<()> {
    // struct sctp_event { sctp_assoc_t se_assoc_id; uint16_t se_type; uint8_t se_on; } (8 bytes)
    for ty in [
        SCTP_ASSOC_CHANGE,
        SCTP_PEER_ADDR_CHANGE,
        SCTP_REMOTE_ERROR,
        SCTP_SHUTDOWN_EVENT,
        SCTP_SEND_FAILED_EVENT,
    ] {
        let mut ev = [0u8; 8];
        ev[0..4].copy_from_slice(&SCTP_FUTURE_ASSOC.to_ne_bytes());
        ev[4..6].copy_from_slice(&ty.to_ne_bytes());
        ev[6] = 1;
        setsockopt_bytes(fd, SOL_SCTP, SCTP_EVENT, &ev)?;
    }
    set_int(fd, SOL_SCTP, SCTP_RECVRCVINFO, 1)?;

    // struct sctp_initmsg { u16 num_ostreams, max_instreams, max_attempts, max_init_timeo; }
    let mut init = Vec::with_capacity(8);
    for v in [
        t.outbound_streams,
        t.max_inbound_streams,
        t.init_max_attempts,
        t.init_max_timeout_ms,
    ] {
        init.extend_from_slice(&v.to_ne_bytes());
    }
    setsockopt_bytes(fd, SOL_SCTP, SCTP_INITMSG, &init)?;

    // struct sctp_rtoinfo { sctp_assoc_t id; u32 initial, max, min; }. The kernel checks
    // min <= initial <= max against the current values, so widen first, then narrow.
    let rto = |initial: u32, max: u32, min: u32| {
        let mut b = Vec::with_capacity(16);
        b.extend_from_slice(&SCTP_FUTURE_ASSOC.to_ne_bytes());
        for v in [initial, max, min] {
            b.extend_from_slice(&v.to_ne_bytes());
        }
        b
    };
    setsockopt_bytes(
        fd,
        SOL_SCTP,
        SCTP_RTOINFO,
        &rto(t.rto_initial_ms, u32::MAX / 2, 1),
    )
    .or_else(|_| setsockopt_bytes(fd, SOL_SCTP, SCTP_RTOINFO, &rto(0, u32::MAX / 2, 1)))?;
    setsockopt_bytes(
        fd,
        SOL_SCTP,
        SCTP_RTOINFO,
        &rto(t.rto_initial_ms, t.rto_max_ms, t.rto_min_ms),
    )?;

    // struct sctp_assocparams { sctp_assoc_t id; u16 asocmaxrxt; u16 peer_dests; u32 peer_rwnd;
    // u32 local_rwnd; u32 cookie_life; } (20 bytes); zero fields are left unchanged.
    let mut ap = vec![0u8; 20];
    ap[0..4].copy_from_slice(&SCTP_FUTURE_ASSOC.to_ne_bytes());
    ap[4..6].copy_from_slice(&t.association_max_retrans.to_ne_bytes());
    setsockopt_bytes(fd, SOL_SCTP, SCTP_ASSOCINFO, &ap)?;

    // struct sctp_paddrparams (packed, 156 bytes): id @0, address @4 (zero: all), hbinterval
    // @132, pathmaxrxt @136, pathmtu @138, sackdelay @142, flags @146, flowlabel @150, dscp @154.
    let mut pp = vec![0u8; SIZEOF_PADDRPARAMS];
    pp[0..4].copy_from_slice(&SCTP_FUTURE_ASSOC.to_ne_bytes());
    let flags = match t.heartbeat_interval_ms {
        Some(ms) => {
            pp[132..136].copy_from_slice(&ms.max(1).to_ne_bytes());
            SPP_HB_ENABLE
        }
        None => SPP_HB_DISABLE,
    };
    pp[136..138].copy_from_slice(&t.path_max_retrans.to_ne_bytes());
    pp[146..150].copy_from_slice(&flags.to_ne_bytes());
    debug_assert_eq!(4 + SIZEOF_SOCKADDR_STORAGE, 132);
    setsockopt_bytes(fd, SOL_SCTP, SCTP_PEER_ADDR_PARAMS, &pp)?;

    set_int(fd, SOL_SCTP, SCTP_NODELAY, libc::c_int::from(t.nodelay))?;
    if let Some(n) = t.send_buffer {
        set_int(
            fd,
            libc::SOL_SOCKET,
            libc::SO_SNDBUF,
            n.min(i32::MAX as usize) as i32,
        )?;
    }
    if let Some(n) = t.receive_buffer {
        set_int(
            fd,
            libc::SOL_SOCKET,
            libc::SO_RCVBUF,
            n.min(i32::MAX as usize) as i32,
        )?;
    }
    Ok(())
}

/// Control-message buffer, aligned for `cmsghdr`.
#[repr(C, align(8))]
struct CmsgBuf([u8; 64]);

/// `sendmsg` of one message on an association, with `SCTP_SNDINFO` (PPID in network order, as
/// SCTP carries it). Non-blocking: `WouldBlock` when the send buffer is full.
pub fn send(
    fd: RawFd,
    assoc_id: i32,
    ppid: u32,
    stream: u16,
    flags: u16,
    data: &[u8],
    more: bool,
) -> io::Result<usize> {
    // struct sctp_sndinfo { u16 sid; u16 flags; u32 ppid; u32 context; sctp_assoc_t assoc_id; }
    let mut info = [0u8; SIZEOF_SNDINFO];
    info[0..2].copy_from_slice(&stream.to_ne_bytes());
    info[2..4].copy_from_slice(&flags.to_ne_bytes());
    info[4..8].copy_from_slice(&ppid.to_be_bytes());
    info[12..16].copy_from_slice(&assoc_id.to_ne_bytes());

    let mut cbuf = CmsgBuf([0u8; 64]);
    // SAFETY: CMSG_SPACE/CMSG_LEN are pure arithmetic.
    let space = unsafe { libc::CMSG_SPACE(SIZEOF_SNDINFO as u32) } as usize;
    assert!(space <= cbuf.0.len());
    let mut iov = libc::iovec {
        iov_base: data.as_ptr() as *mut libc::c_void,
        iov_len: data.len(),
    };
    // SAFETY: msghdr is plain data; zeroed is a valid empty header.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cbuf.0.as_mut_ptr().cast();
    msg.msg_controllen = space as _;
    // SAFETY: msg_control points at `cbuf` (aligned, `space` bytes), so CMSG_FIRSTHDR returns a
    // pointer inside it with room for a header and SIZEOF_SNDINFO data bytes (checked above).
    // The iovec points at `data`, which the kernel only reads; all buffers outlive the call.
    unsafe {
        let c = libc::CMSG_FIRSTHDR(&msg);
        (*c).cmsg_level = SOL_SCTP;
        (*c).cmsg_type = SCTP_SNDINFO;
        (*c).cmsg_len = libc::CMSG_LEN(SIZEOF_SNDINFO as u32) as _;
        std::ptr::copy_nonoverlapping(info.as_ptr(), libc::CMSG_DATA(c), SIZEOF_SNDINFO);
        let more = if more { libc::MSG_MORE } else { 0 };
        cvt_size(libc::sendmsg(
            fd,
            &msg,
            libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT | more,
        ))
    }
}

/// What `recvmsg` returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Received {
    /// Bytes written into the buffer.
    pub len: usize,
    /// A notification, not user data.
    pub notification: bool,
    /// The end of a message (or notification) was reached.
    pub end_of_record: bool,
    /// `SCTP_RCVINFO` of user data: (assoc id, stream, PPID in host order).
    pub info: Option<(i32, u16, u32)>,
}

/// Buffers for receiving several messages with one `recvmmsg`: up to `slots` messages (or
/// notifications) of up to `slot_size` bytes each; longer ones arrive in pieces, the last with
/// `end_of_record`.
pub struct RecvBatch {
    slot_size: usize,
    data: Vec<u8>,
    cmsgs: Vec<CmsgBuf>,
    iovs: Vec<libc::iovec>,
    hdrs: Vec<libc::mmsghdr>,
    got: Vec<Received>,
}

// SAFETY: the raw pointers in `iovs` and `hdrs` only ever point into the batch's own buffers and
// are rebuilt before each use; nothing is shared.
unsafe impl Send for RecvBatch {}

impl RecvBatch {
    /// Room for `slots` (at least 1) messages of `slot_size` (at least 1) bytes.
    pub fn new(slots: usize, slot_size: usize) -> Self {
        let (slots, slot_size) = (slots.max(1), slot_size.max(1));
        RecvBatch {
            slot_size,
            data: vec![0u8; slots * slot_size],
            cmsgs: (0..slots).map(|_| CmsgBuf([0u8; 64])).collect(),
            iovs: vec![
                libc::iovec {
                    iov_base: std::ptr::null_mut(),
                    iov_len: 0,
                };
                slots
            ],
            // SAFETY: mmsghdr is plain data; zeroed is a valid empty header.
            hdrs: (0..slots).map(|_| unsafe { std::mem::zeroed() }).collect(),
            got: Vec::with_capacity(slots),
        }
    }

    /// Non-blocking `recvmmsg`: receives what is queued, up to the batch's size; returns how
    /// many messages arrived (`WouldBlock` when none).
    pub fn recv(&mut self, fd: RawFd) -> io::Result<usize> {
        let slots = self.hdrs.len();
        for i in 0..slots {
            self.iovs[i] = libc::iovec {
                iov_base: self.data[i * self.slot_size..].as_mut_ptr().cast(),
                iov_len: self.slot_size,
            };
            // SAFETY: msghdr is plain data; zeroed is a valid empty header.
            let mut m: libc::msghdr = unsafe { std::mem::zeroed() };
            m.msg_iov = &mut self.iovs[i];
            m.msg_iovlen = 1;
            m.msg_control = self.cmsgs[i].0.as_mut_ptr().cast();
            m.msg_controllen = self.cmsgs[i].0.len() as _;
            self.hdrs[i] = libc::mmsghdr {
                msg_hdr: m,
                msg_len: 0,
            };
        }
        // SAFETY: each header's iovec points at its own `slot_size` bytes of `data` and its
        // control buffer at its own `CmsgBuf`; all live in `self`, outlive the call, and are
        // not otherwise borrowed during it. The kernel writes within the given lengths.
        let n = cvt(unsafe {
            libc::recvmmsg(
                fd,
                self.hdrs.as_mut_ptr(),
                slots as libc::c_uint,
                libc::MSG_DONTWAIT,
                std::ptr::null_mut(),
            )
        })? as usize;
        self.got.clear();
        for h in &self.hdrs[..n] {
            self.got
                .push(parse_received(&h.msg_hdr, h.msg_len as usize));
        }
        Ok(n)
    }

    /// The `i`-th message of the last [`recv`](Self::recv): what arrived and its bytes.
    pub fn message(&self, i: usize) -> (Received, &[u8]) {
        let r = self.got[i];
        let start = i * self.slot_size;
        (r, &self.data[start..start + r.len.min(self.slot_size)])
    }
}

/// What the kernel reported in one received header.
fn parse_received(msg: &libc::msghdr, len: usize) -> Received {
    let mut info = None;
    // SAFETY: after the receive, msg_control/msg_controllen describe the control data the kernel
    // wrote into the header's control buffer; CMSG_FIRSTHDR/CMSG_NXTHDR stay within it, and the
    // data is copied out only when cmsg_len covers a whole sctp_rcvinfo.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(msg);
        while !c.is_null() {
            if (*c).cmsg_level == SOL_SCTP
                && (*c).cmsg_type == SCTP_RCVINFO
                && (*c).cmsg_len as usize >= libc::CMSG_LEN(SIZEOF_RCVINFO as u32) as usize
            {
                let mut r = [0u8; SIZEOF_RCVINFO];
                std::ptr::copy_nonoverlapping(libc::CMSG_DATA(c), r.as_mut_ptr(), SIZEOF_RCVINFO);
                // struct sctp_rcvinfo { u16 sid @0; u16 ssn; u16 flags; u32 ppid @8; u32 tsn;
                // u32 cumtsn; u32 context; sctp_assoc_t assoc_id @24; }
                let sid = u16::from_ne_bytes([r[0], r[1]]);
                let ppid = u32::from_be_bytes([r[8], r[9], r[10], r[11]]);
                let assoc = i32::from_ne_bytes([r[24], r[25], r[26], r[27]]);
                info = Some((assoc, sid, ppid));
            }
            c = libc::CMSG_NXTHDR(msg, c);
        }
    }
    Received {
        len,
        notification: msg.msg_flags & MSG_NOTIFICATION != 0,
        end_of_record: msg.msg_flags & libc::MSG_EOR != 0,
        info,
    }
}

/// The local address a socket is bound to (`getsockname`).
pub fn local_name(fd: &impl AsRawFd) -> io::Result<SocketAddr> {
    let mut buf = [0u8; SIZEOF_SOCKADDR_STORAGE];
    let mut len = buf.len() as libc::socklen_t;
    // SAFETY: `buf` is writable for `len` bytes; the kernel writes at most that and updates len.
    cvt(unsafe { libc::getsockname(fd.as_raw_fd(), buf.as_mut_ptr().cast(), &mut len) })?;
    parse_sockaddr(&buf[..len as usize])
        .map(|(a, _)| a)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "unknown address family"))
}

fn ne_u16(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_ne_bytes(b.get(at..at + 2)?.try_into().ok()?))
}
fn ne_u32(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_ne_bytes(b.get(at..at + 4)?.try_into().ok()?))
}
fn ne_i32(b: &[u8], at: usize) -> Option<i32> {
    Some(i32::from_ne_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

/// A parsed notification.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Notification {
    /// `SCTP_ASSOC_CHANGE`.
    AssocChange {
        assoc_id: i32,
        state: u16,
        error: u16,
        outbound_streams: u16,
        /// Bytes after the fixed part (an ABORT chunk when the peer aborted).
        info_len: usize,
    },
    /// `SCTP_PEER_ADDR_CHANGE`.
    PeerAddrChange {
        assoc_id: i32,
        addr: Option<SocketAddr>,
        state: i32,
    },
    /// `SCTP_SEND_FAILED_EVENT`.
    SendFailed {
        assoc_id: i32,
        sent: bool,
        stream: u16,
        ppid: u32,
        data: Vec<u8>,
    },
    /// `SCTP_SHUTDOWN_EVENT`.
    Shutdown { assoc_id: i32 },
    /// `SCTP_REMOTE_ERROR`.
    RemoteError { assoc_id: i32, error: u16 },
    /// Anything else.
    Other(u16),
}

/// `sac_state` values.
pub mod assoc_state {
    /// The association is up.
    pub const COMM_UP: u16 = 0;
    /// It was lost (peer abort, retransmission limit).
    pub const COMM_LOST: u16 = 1;
    /// The peer restarted.
    pub const RESTART: u16 = 2;
    /// Graceful shutdown finished.
    pub const SHUTDOWN_COMP: u16 = 3;
    /// Setting it up failed.
    pub const CANT_STR_ASSOC: u16 = 4;
}

/// `spc_state` values.
pub mod addr_state {
    /// Reachable.
    pub const AVAILABLE: i32 = 0;
    /// Unreachable.
    pub const UNREACHABLE: i32 = 1;
    /// Removed.
    pub const REMOVED: i32 = 2;
    /// Added.
    pub const ADDED: i32 = 3;
    /// Made primary.
    pub const MADE_PRIM: i32 = 4;
    /// Confirmed.
    pub const CONFIRMED: i32 = 5;
    /// Potentially failed.
    pub const POTENTIALLY_FAILED: i32 = 6;
}

/// Parses a notification (`None` if it is shorter than its fixed part).
pub fn parse_notification(b: &[u8]) -> Option<Notification> {
    let ty = ne_u16(b, 0)?;
    let total = (ne_u32(b, 4)? as usize).min(b.len());
    let b = &b[..total];
    Some(match ty {
        // struct sctp_assoc_change: type, flags, length u32, state u16 @8, error u16 @10,
        // outbound u16 @12, inbound u16 @14, assoc_id @16, info[] @20
        SCTP_ASSOC_CHANGE => Notification::AssocChange {
            state: ne_u16(b, 8)?,
            error: ne_u16(b, 10)?,
            outbound_streams: ne_u16(b, 12)?,
            assoc_id: ne_i32(b, 16)?,
            info_len: total.saturating_sub(20),
        },
        // struct sctp_paddr_change (packed): aaddr @8 (128), state @136, error @140, assoc @144
        SCTP_PEER_ADDR_CHANGE => Notification::PeerAddrChange {
            addr: parse_sockaddr(b.get(8..136)?).map(|(a, _)| a),
            state: ne_i32(b, 136)?,
            assoc_id: ne_i32(b, 144)?,
        },
        // struct sctp_send_failed_event: flags u16 @2, error u32 @8, sndinfo @12 (sid @12,
        // flags @14, ppid @16, context @20, assoc @24), assoc_id @28, data @32
        SCTP_SEND_FAILED_EVENT => Notification::SendFailed {
            sent: ne_u16(b, 2)? != 0,
            stream: ne_u16(b, 12)?,
            ppid: u32::from_be_bytes(b.get(16..20)?.try_into().ok()?),
            assoc_id: ne_i32(b, 28)?,
            data: b.get(32..).unwrap_or_default().to_vec(),
        },
        // struct sctp_shutdown_event: assoc_id @8
        SCTP_SHUTDOWN_EVENT => Notification::Shutdown {
            assoc_id: ne_i32(b, 8)?,
        },
        // struct sctp_remote_error: error be16 @8, assoc_id @12
        SCTP_REMOTE_ERROR => Notification::RemoteError {
            error: u16::from_be_bytes(b.get(8..10)?.try_into().ok()?),
            assoc_id: ne_i32(b, 12)?,
        },
        other => Notification::Other(other),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sockaddr_round_trip_and_mapped_v4() {
        for a in [
            "127.0.0.1:3863".parse::<SocketAddr>().unwrap(),
            "[::1]:9901".parse().unwrap(),
            "[fe80::1%7]:1".parse().unwrap(),
        ] {
            let mut b = Vec::new();
            push_sockaddr(&mut b, &a);
            assert_eq!(b.len(), if a.is_ipv4() { 16 } else { 28 });
            assert_eq!(parse_sockaddr(&b), Some((a, b.len())));
        }
        let mut b = Vec::new();
        push_sockaddr(&mut b, &"[::ffff:10.0.0.1]:5".parse().unwrap());
        assert_eq!(parse_sockaddr(&b).unwrap().0, "10.0.0.1:5".parse().unwrap());
        assert_eq!(parse_sockaddr(&[0, 0, 1]), None);
    }

    #[test]
    fn notifications_parse_at_the_header_offsets() {
        // sctp_assoc_change: COMM_LOST, error 0, 10 outbound streams, assoc 7, no info.
        let mut b = Vec::new();
        b.extend_from_slice(&SCTP_ASSOC_CHANGE.to_ne_bytes());
        b.extend_from_slice(&0u16.to_ne_bytes());
        b.extend_from_slice(&20u32.to_ne_bytes());
        for v in [1u16, 0, 10, 5] {
            b.extend_from_slice(&v.to_ne_bytes());
        }
        b.extend_from_slice(&7i32.to_ne_bytes());
        assert_eq!(
            parse_notification(&b),
            Some(Notification::AssocChange {
                assoc_id: 7,
                state: 1,
                error: 0,
                outbound_streams: 10,
                info_len: 0
            })
        );
        assert_eq!(parse_notification(&b[..15]), None);

        // sctp_paddr_change: 148 bytes.
        let mut b = vec![0u8; 148];
        b[0..2].copy_from_slice(&SCTP_PEER_ADDR_CHANGE.to_ne_bytes());
        b[4..8].copy_from_slice(&148u32.to_ne_bytes());
        let mut sa = Vec::new();
        push_sockaddr(&mut sa, &"10.255.0.2:3863".parse().unwrap());
        b[8..8 + sa.len()].copy_from_slice(&sa);
        b[136..140].copy_from_slice(&1i32.to_ne_bytes());
        b[144..148].copy_from_slice(&3i32.to_ne_bytes());
        assert_eq!(
            parse_notification(&b),
            Some(Notification::PeerAddrChange {
                assoc_id: 3,
                addr: Some("10.255.0.2:3863".parse().unwrap()),
                state: 1
            })
        );

        // sctp_send_failed_event with 3 bytes of data.
        let mut b = vec![0u8; 35];
        b[0..2].copy_from_slice(&SCTP_SEND_FAILED_EVENT.to_ne_bytes());
        b[2..4].copy_from_slice(&1u16.to_ne_bytes());
        b[4..8].copy_from_slice(&35u32.to_ne_bytes());
        b[12..14].copy_from_slice(&2u16.to_ne_bytes());
        b[16..20].copy_from_slice(&11u32.to_be_bytes());
        b[28..32].copy_from_slice(&9i32.to_ne_bytes());
        b[32..35].copy_from_slice(b"abc");
        assert_eq!(
            parse_notification(&b),
            Some(Notification::SendFailed {
                assoc_id: 9,
                sent: true,
                stream: 2,
                ppid: 11,
                data: b"abc".to_vec()
            })
        );
    }
}
