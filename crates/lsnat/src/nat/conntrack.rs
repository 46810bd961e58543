//! Conntrack events over netlink (ctnetlink): how NAT mode learns what the kernel did with
//! each session. NEW is the binding, an update with a reply seen is the member answering,
//! DESTROY carries the connection's counters and last state (the outcome).
//!
//! Events and dumps are decoded in place by a walk of their netlink attributes (the per-event
//! path of NAT mode); `netlink-packet-netfilter` builds the requests (dump, removal) and is,
//! in the tests, the full decode the walk is checked against.

use crate::core::Protocol;
use netlink_packet_core::NetlinkBuffer;
use netlink_packet_netfilter::conntrack::ConntrackMessage;
use netlink_packet_netfilter::NetfilterMessage;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::AsRawFd;

/// Which conntrack event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CtKind {
    /// A connection was created (the first packet passed, its NAT binding is set).
    New,
    /// A connection changed (status or TCP state).
    Update,
    /// A connection ended (timed out, closed, reset, or was deleted).
    Destroy,
}

/// TCP states as conntrack numbers them (`enum tcp_conntrack`).
pub mod tcp_state {
    /// SYN sent by the client, no answer yet.
    pub const SYN_SENT: u8 = 1;
    /// The member answered the SYN.
    pub const SYN_RECV: u8 = 2;
    /// Both directions open.
    pub const ESTABLISHED: u8 = 3;
    /// One FIN seen.
    pub const FIN_WAIT: u8 = 4;
    /// One FIN seen and acknowledged.
    pub const CLOSE_WAIT: u8 = 5;
    /// Both FINs seen, the last one unacknowledged.
    pub const LAST_ACK: u8 = 6;
    /// Both FINs seen and acknowledged: closed in order.
    pub const TIME_WAIT: u8 = 7;
    /// Reset (or closed by RST after FIN).
    pub const CLOSE: u8 = 8;
}

/// `IP_CT_TCP_FLAG_CLOSE_INIT`: this direction sent the first FIN.
const TCP_FLAG_CLOSE_INIT: u8 = 0x04;

const CTA_COUNTERS_ORIG: u16 = 9;
const CTA_COUNTERS_REPLY: u16 = 10;
const CTA_COUNTERS_PACKETS: u16 = 1;
const CTA_COUNTERS_BYTES: u16 = 2;
const CTA_ID: u16 = 12;

/// Packets and bytes of one direction of a connection.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counter {
    /// Packets.
    pub packets: u64,
    /// Bytes (IP packets, headers included).
    pub bytes: u64,
}

/// One conntrack event, reduced to what the gateway needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CtEvent {
    /// New, update or destroy.
    pub kind: CtKind,
    /// Conntrack's id for the connection, if sent.
    pub id: Option<u32>,
    /// TCP or UDP (other protocols are not reported).
    pub protocol: Protocol,
    /// The client (original source).
    pub client: SocketAddr,
    /// The address the client sent to (original destination: the virtual address).
    pub virtual_address: SocketAddr,
    /// Where the reply comes from (reply source: the member after DNAT).
    pub member: Option<SocketAddr>,
    /// A packet came back from the member.
    pub seen_reply: bool,
    /// Conntrack judged the connection assured (TCP: the handshake completed).
    pub assured: bool,
    /// The kernel translated the destination.
    pub dnat: bool,
    /// TCP state, if this is TCP and the event carries it.
    pub tcp_state: Option<u8>,
    /// TCP: which side sent the first FIN, if one did (true: the client).
    pub client_closed_first: Option<bool>,
    /// Client to member (only with `nf_conntrack_acct` on; DESTROY events).
    pub to_member: Option<Counter>,
    /// Member to client.
    pub to_client: Option<Counter>,
}

/// Why a message was not an event the gateway uses.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CtParseError {
    /// The bytes were not a netlink message.
    #[error("malformed netlink message: {0}")]
    Malformed(String),
    /// A message without the original or reply tuple.
    #[error("conntrack message without {0}")]
    Missing(&'static str),
}

const NLM_F_CREATE: u16 = 0x400;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const NLMSG_OVERRUN: u16 = 4;
const IPCTNL_MSG_CT_NEW: u16 = 0;
const IPCTNL_MSG_CT_DELETE: u16 = 2;

/// Decodes every message in one netlink datagram. Messages of other protocols than TCP and
/// UDP are skipped; malformed ones are reported, never a panic.
pub fn parse_datagram(buf: &[u8]) -> Vec<Result<CtEvent, CtParseError>> {
    let mut out = Vec::new();
    parse_datagram_into(buf, &mut out);
    out
}

/// As [`parse_datagram`], appending to `out` (the event loop reuses one vector).
///
/// The attributes are walked in place with `netlink-packet-core`'s iterator: nothing is
/// allocated per message, and only the attributes the receipts use are read (a decode into the
/// owned types of `netlink-packet-netfilter` cost about a third of the gateway's CPU per
/// connection under short-connection load). The tests check it against that full decode.
pub fn parse_datagram_into(buf: &[u8], out: &mut Vec<Result<CtEvent, CtParseError>>) {
    walk_messages(buf, out, |nb| {
        event_in_place(nb.message_type(), nb.flags(), nb.payload())
    });
}

/// Walks the netlink messages of one datagram: control messages (error, done, overrun) are
/// skipped, every other one goes to `decode` and its result, if any, is appended to `out`; a
/// message header that cannot be read ends the walk with an error.
fn walk_messages(
    mut buf: &[u8],
    out: &mut Vec<Result<CtEvent, CtParseError>>,
    mut decode: impl FnMut(&NetlinkBuffer<&[u8]>) -> Result<Option<CtEvent>, CtParseError>,
) {
    while buf.len() >= 16 {
        let nb = match NetlinkBuffer::new_checked(buf) {
            Ok(b) => b,
            Err(e) => {
                out.push(Err(CtParseError::Malformed(e.to_string())));
                break;
            }
        };
        let aligned = (nb.length() as usize + 3) & !3;
        let next = &buf[aligned.min(buf.len())..];
        let msg_type = nb.message_type();
        if !matches!(msg_type, NLMSG_ERROR | NLMSG_DONE | NLMSG_OVERRUN) && msg_type >= 16 {
            match decode(&nb) {
                Ok(Some(e)) => out.push(Ok(e)),
                Ok(None) => {}
                Err(e) => out.push(Err(e)),
            }
        }
        buf = next;
    }
}

/// `NFNL_SUBSYS_CTNETLINK`: the high byte of a conntrack message's type.
const SUBSYS_CTNETLINK: u16 = 1;
/// `struct nfgenmsg`: family, version, resource id, before the attributes.
const NFGENMSG_LEN: usize = 4;
const CTA_TUPLE_ORIG: u16 = 1;
const CTA_TUPLE_REPLY: u16 = 2;
const CTA_STATUS: u16 = 3;
const CTA_PROTOINFO: u16 = 4;
const CTA_TUPLE_IP: u16 = 1;
const CTA_TUPLE_PROTO: u16 = 2;
const CTA_IP_V4_SRC: u16 = 1;
const CTA_IP_V4_DST: u16 = 2;
const CTA_IP_V6_SRC: u16 = 3;
const CTA_IP_V6_DST: u16 = 4;
const CTA_PROTO_NUM: u16 = 1;
const CTA_PROTO_SRC_PORT: u16 = 2;
const CTA_PROTO_DST_PORT: u16 = 3;
const CTA_PROTOINFO_TCP: u16 = 1;
const CTA_PROTOINFO_TCP_STATE: u16 = 1;
const CTA_PROTOINFO_TCP_FLAGS_ORIGINAL: u16 = 4;
const CTA_PROTOINFO_TCP_FLAGS_REPLY: u16 = 5;
const IPS_SEEN_REPLY: u32 = 1 << 1;
const IPS_ASSURED: u32 = 1 << 2;
const IPS_DST_NAT: u32 = 1 << 5;

/// Mask of an attribute's type without its nested and byte-order flags.
const NLA_TYPE_MASK: u16 = 0x3fff;

/// The attributes of `value`, each checked against the bounds of its parent: (type, value)
/// pairs. A netlink attribute is a 16-bit length (header included) and a 16-bit type in host
/// order, then the value, padded to 4 bytes (RFC 3549 §2.3.2). Walked here rather than
/// through `netlink_packet_core`'s accessors: this is the NAT data plane's per-event path,
/// and a header that does not fit ends the walk with an error.
fn attributes(value: &[u8]) -> Attributes<'_> {
    Attributes { rest: value }
}

/// The iterator of [`attributes`].
struct Attributes<'a> {
    rest: &'a [u8],
}

impl<'a> Iterator for Attributes<'a> {
    type Item = Result<(u16, &'a [u8]), CtParseError>;

    fn next(&mut self) -> Option<Self::Item> {
        let rest = self.rest;
        if rest.is_empty() {
            return None;
        }
        let header = match rest {
            [a, b, c, d, ..] => Some((u16::from_ne_bytes([*a, *b]), u16::from_ne_bytes([*c, *d]))),
            _ => None,
        };
        let Some((len, kind)) =
            header.filter(|(len, _)| (4..=rest.len()).contains(&usize::from(*len)))
        else {
            self.rest = &[];
            return Some(Err(CtParseError::Malformed(format!(
                "an attribute that does not fit the {} bytes left of its parent",
                rest.len()
            ))));
        };
        let len = usize::from(len);
        self.rest = rest.get((len + 3) & !3..).unwrap_or(&[]);
        Some(Ok((kind & NLA_TYPE_MASK, &rest[4..len])))
    }
}

fn ip(v: &[u8]) -> Result<IpAddr, CtParseError> {
    match v.len() {
        4 => Ok(IpAddr::from(
            <[u8; 4]>::try_from(v).expect("length checked"),
        )),
        16 => Ok(IpAddr::from(
            <[u8; 16]>::try_from(v).expect("length checked"),
        )),
        n => Err(CtParseError::Malformed(format!(
            "an address attribute of {n} bytes"
        ))),
    }
}

fn be16(v: &[u8], what: &str) -> Result<u16, CtParseError> {
    <[u8; 2]>::try_from(v)
        .map(u16::from_be_bytes)
        .map_err(|_| CtParseError::Malformed(format!("{what} of {} bytes", v.len())))
}

/// A tuple (`CTA_TUPLE_*`) read in place.
fn tuple_in_place(value: &[u8]) -> Result<Endpoints, CtParseError> {
    let (mut src, mut dst, mut proto, mut sport, mut dport) = (None, None, None, None, None);
    for a in attributes(value) {
        let (kind, v) = a?;
        match kind {
            CTA_TUPLE_IP => {
                for x in attributes(v) {
                    let (kind, x) = x?;
                    match kind {
                        CTA_IP_V4_SRC | CTA_IP_V6_SRC => src = Some(ip(x)?),
                        CTA_IP_V4_DST | CTA_IP_V6_DST => dst = Some(ip(x)?),
                        _ => {}
                    }
                }
            }
            CTA_TUPLE_PROTO => {
                for x in attributes(v) {
                    let (kind, x) = x?;
                    match kind {
                        CTA_PROTO_NUM => {
                            let n = *x.first().ok_or(CtParseError::Malformed(
                                "an empty protocol number".into(),
                            ))?;
                            proto = Some(if matches!(n, 6 | 17) { n } else { 0 });
                        }
                        CTA_PROTO_SRC_PORT => sport = Some(be16(x, "a source port")?),
                        CTA_PROTO_DST_PORT => dport = Some(be16(x, "a destination port")?),
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
    Ok((src, dst, proto, sport, dport))
}

/// One conntrack message (its type, flags and payload) into an event, read in place.
fn event_in_place(
    message_type: u16,
    flags: u16,
    payload: &[u8],
) -> Result<Option<CtEvent>, CtParseError> {
    if message_type >> 8 != SUBSYS_CTNETLINK {
        return Ok(None);
    }
    let kind = match message_type & 0xff {
        IPCTNL_MSG_CT_NEW if flags & NLM_F_CREATE != 0 => CtKind::New,
        IPCTNL_MSG_CT_NEW => CtKind::Update,
        IPCTNL_MSG_CT_DELETE => CtKind::Destroy,
        _ => return Ok(None),
    };
    let attrs = payload.get(NFGENMSG_LEN..).ok_or_else(|| {
        CtParseError::Malformed(format!(
            "a conntrack message of {} bytes, shorter than its header",
            payload.len()
        ))
    })?;
    let mut orig = None;
    let mut reply = None;
    let mut status = 0u32;
    let mut tcp_state = None;
    let mut orig_flags = None;
    let mut reply_flags = None;
    let mut to_member = None;
    let mut to_client = None;
    let mut id = None;
    for a in attributes(attrs) {
        let (kind, v) = a?;
        match kind {
            CTA_TUPLE_ORIG => orig = Some(tuple_in_place(v)?),
            CTA_TUPLE_REPLY => reply = Some(tuple_in_place(v)?),
            CTA_STATUS => {
                status = <[u8; 4]>::try_from(v)
                    .map(u32::from_be_bytes)
                    .map_err(|_| {
                        CtParseError::Malformed(format!("a status of {} bytes", v.len()))
                    })?
            }
            CTA_PROTOINFO => {
                for p in attributes(v) {
                    let (kind, p) = p?;
                    if kind != CTA_PROTOINFO_TCP {
                        continue;
                    }
                    for t in attributes(p) {
                        let (kind, t) = t?;
                        let first = t.first().copied();
                        match kind {
                            CTA_PROTOINFO_TCP_STATE => tcp_state = first,
                            CTA_PROTOINFO_TCP_FLAGS_ORIGINAL => orig_flags = first,
                            CTA_PROTOINFO_TCP_FLAGS_REPLY => reply_flags = first,
                            _ => {}
                        }
                    }
                }
            }
            CTA_COUNTERS_ORIG => to_member = Some(counter(v)),
            CTA_COUNTERS_REPLY => to_client = Some(counter(v)),
            CTA_ID if v.len() >= 4 => id = Some(u32::from_be_bytes([v[0], v[1], v[2], v[3]])),
            _ => {}
        }
    }
    let (src, dst, proto, sport, dport) = orig.ok_or(CtParseError::Missing("original tuple"))?;
    let protocol = match proto {
        Some(6) => Protocol::Tcp,
        Some(17) => Protocol::Udp,
        _ => return Ok(None),
    };
    let (Some(src), Some(dst), Some(sport), Some(dport)) = (src, dst, sport, dport) else {
        return Err(CtParseError::Missing("original addresses or ports"));
    };
    let member = reply.and_then(|(rs, _, _, rsport, _)| Some(SocketAddr::new(rs?, rsport?)));
    let client_closed_first = match (orig_flags, reply_flags) {
        (Some(o), _) if o & TCP_FLAG_CLOSE_INIT != 0 => Some(true),
        (_, Some(r)) if r & TCP_FLAG_CLOSE_INIT != 0 => Some(false),
        _ => None,
    };
    Ok(Some(CtEvent {
        kind,
        id,
        protocol,
        client: SocketAddr::new(src, sport),
        virtual_address: SocketAddr::new(dst, dport),
        member,
        seen_reply: status & IPS_SEEN_REPLY != 0,
        assured: status & IPS_ASSURED != 0,
        dnat: status & IPS_DST_NAT != 0,
        tcp_state,
        client_closed_first,
        to_member,
        to_client,
    }))
}

/// Source, destination, protocol number (6, 17, or 0 for another), source port, destination
/// port of a tuple.
type Endpoints = (
    Option<IpAddr>,
    Option<IpAddr>,
    Option<u8>,
    Option<u16>,
    Option<u16>,
);

fn counter(value: &[u8]) -> Counter {
    let mut c = Counter::default();
    for (kind, v) in attributes(value).map_while(Result::ok) {
        if v.len() >= 8 {
            let n = u64::from_be_bytes([v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7]]);
            match kind {
                CTA_COUNTERS_PACKETS => c.packets = n,
                CTA_COUNTERS_BYTES => c.bytes = n,
                _ => {}
            }
        }
    }
    c
}

/// Buffers for [`Subscription::try_recv_batch`]: `COUNT` slots of a fixed size, allocated once.
pub struct RecvBatch {
    data: Vec<u8>,
    slot: usize,
    lens: Vec<usize>,
}

impl RecvBatch {
    /// Datagrams received by one call at most.
    pub const COUNT: usize = 64;

    /// Slots of `slot` bytes each (a conntrack event is a few hundred bytes; 8 KiB is ample).
    pub fn new(slot: usize) -> RecvBatch {
        RecvBatch {
            data: vec![0; slot * Self::COUNT],
            slot,
            lens: Vec::with_capacity(Self::COUNT),
        }
    }

    /// The datagrams the last call received.
    pub fn datagrams(&self) -> impl Iterator<Item = &[u8]> {
        self.lens
            .iter()
            .enumerate()
            .map(|(i, &n)| &self.data[i * self.slot..i * self.slot + n])
    }
}

/// `recvmmsg` on `fd` into `batch` (non-blocking); see [`Subscription::try_recv_batch`].
fn recv_batch(fd: std::os::fd::RawFd, batch: &mut RecvBatch) -> std::io::Result<usize> {
    batch.lens.clear();
    let slot = batch.slot;
    let base = batch.data.as_mut_ptr();
    let mut iov: [libc::iovec; RecvBatch::COUNT] = [libc::iovec {
        iov_base: std::ptr::null_mut(),
        iov_len: 0,
    }; RecvBatch::COUNT];
    // SAFETY: an all-zero mmsghdr is valid (null pointers, zero lengths).
    let mut msgs: [libc::mmsghdr; RecvBatch::COUNT] = unsafe { std::mem::zeroed() };
    for (i, (v, m)) in iov.iter_mut().zip(msgs.iter_mut()).enumerate() {
        // SAFETY: `data` holds COUNT slots of `slot` bytes; slot i is in bounds.
        v.iov_base = unsafe { base.add(i * slot) } as *mut libc::c_void;
        v.iov_len = slot;
        m.msg_hdr.msg_iov = v;
        m.msg_hdr.msg_iovlen = 1;
    }
    // SAFETY: recvmmsg on a socket we own, into COUNT headers whose single iovecs point
    // at disjoint slots of `data`, which outlives the call.
    let n = unsafe {
        libc::recvmmsg(
            fd,
            msgs.as_mut_ptr(),
            RecvBatch::COUNT as libc::c_uint,
            libc::MSG_DONTWAIT,
            std::ptr::null_mut(),
        )
    };
    if n < 0 {
        return Err(std::io::Error::last_os_error());
    }
    for m in &msgs[..n as usize] {
        // A datagram longer than its slot arrives cut (MSG_TRUNC); its declared length
        // then exceeds what is there and the decoder reports it as malformed.
        batch.lens.push((m.msg_len as usize).min(slot));
    }
    Ok(n as usize)
}

/// Multicast groups of ctnetlink (`NFNLGRP_CONNTRACK_*`).
const GROUP_NEW: u32 = 1;
const GROUP_UPDATE: u32 = 2;
const GROUP_DESTROY: u32 = 3;

/// A netlink socket subscribed to conntrack events.
pub struct Subscription {
    socket: netlink_sys::Socket,
}

fn set_int(fd: std::os::fd::RawFd, option: libc::c_int, value: libc::c_int) -> bool {
    // SAFETY: setsockopt on a socket we own, with a correctly sized int value.
    unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            option,
            &value as *const libc::c_int as *const libc::c_void,
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        ) == 0
    }
}

impl Subscription {
    /// Opens the socket, joins the NEW and DESTROY groups (and UPDATE with `updates`), asks
    /// for a receive buffer of `rcvbuf` bytes (forced past `rmem_max` where the process may)
    /// and a receive timeout so the reading thread can notice shutdown. Needs CAP_NET_ADMIN.
    pub fn open(
        rcvbuf: usize,
        timeout: std::time::Duration,
        updates: bool,
    ) -> std::io::Result<Subscription> {
        let mut socket = netlink_sys::Socket::new(netlink_sys::protocols::NETLINK_NETFILTER)?;
        socket.bind_auto()?;
        socket.add_membership(GROUP_NEW)?;
        if updates {
            socket.add_membership(GROUP_UPDATE)?;
        }
        socket.add_membership(GROUP_DESTROY)?;
        let s = Subscription { socket };
        s.set_buffer(rcvbuf);
        set_receive_timeout(s.socket.as_raw_fd(), timeout);
        Ok(s)
    }

    /// Asks for a receive buffer of `bytes` (forced past `rmem_max` where the process may).
    /// Returns the size the kernel granted (it counts overhead, so about twice what was asked).
    pub fn set_buffer(&self, bytes: usize) -> usize {
        let fd = self.socket.as_raw_fd();
        let size = bytes.min(i32::MAX as usize / 2) as libc::c_int;
        if !set_int(fd, libc::SO_RCVBUFFORCE, size) {
            set_int(fd, libc::SO_RCVBUF, size);
        }
        let mut got: libc::c_int = 0;
        let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: getsockopt into an int we own, with its size.
        unsafe {
            libc::getsockopt(
                fd,
                libc::SOL_SOCKET,
                libc::SO_RCVBUF,
                &mut got as *mut libc::c_int as *mut libc::c_void,
                &mut len,
            );
        }
        got.max(0) as usize
    }

    /// Receives one datagram (blocking up to the timeout; WouldBlock/TimedOut then).
    /// ENOBUFS means the kernel dropped events because the buffer was full.
    pub fn recv(&mut self, buf: &mut Vec<u8>) -> std::io::Result<usize> {
        buf.clear();
        self.socket.recv(buf, 0)
    }

    /// Receives one datagram if one is waiting (WouldBlock otherwise): a burst of events is
    /// read and applied as one batch.
    pub fn try_recv(&self, buf: &mut Vec<u8>) -> std::io::Result<usize> {
        buf.clear();
        self.socket.recv(buf, libc::MSG_DONTWAIT)
    }

    /// Receives every datagram waiting, up to the batch's size, in one system call
    /// (`recvmmsg`, non-blocking): the kernel sends each conntrack event as its own datagram,
    /// so reading them one `recv` at a time costs a system call per event. Returns how many
    /// were received (WouldBlock when none was waiting; ENOBUFS when the kernel dropped events
    /// before the first).
    pub fn try_recv_batch(&self, batch: &mut RecvBatch) -> std::io::Result<usize> {
        recv_batch(self.socket.as_raw_fd(), batch)
    }

    /// Makes the socket non-blocking, for polling it from an event loop.
    pub fn set_non_blocking(&self) -> std::io::Result<()> {
        self.socket.set_non_blocking(true)
    }
}

impl AsRawFd for Subscription {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        self.socket.as_raw_fd()
    }
}

/// The conntrack table's TCP and UDP entries of `family` now (a ctnetlink dump on its own
/// socket), as update events. Used to resynchronise after events were lost, and at start to
/// adopt sessions bound before a restart. Blocking; needs CAP_NET_ADMIN.
pub fn dump(
    family: super::plan::Family,
    timeout: std::time::Duration,
) -> std::io::Result<Vec<CtEvent>> {
    use netlink_packet_core::NetlinkMessage;
    use netlink_packet_netfilter::{NetfilterHeader, NetfilterProtoFamily};
    const NLM_F_REQUEST: u16 = 1;
    const NLM_F_DUMP: u16 = 0x300;
    const IPCTNL_MSG_CT_GET: u16 = 1;
    let socket = request_socket(timeout)?;
    let nf = NetfilterMessage::new(
        NetfilterHeader::new(
            match family {
                super::plan::Family::V4 => NetfilterProtoFamily::IPv4,
                super::plan::Family::V6 => NetfilterProtoFamily::IPv6,
            },
            0,
            0,
        ),
        ConntrackMessage::Get(vec![]),
    );
    let mut msg = NetlinkMessage::from(nf);
    msg.header.flags = NLM_F_REQUEST | NLM_F_DUMP;
    msg.header.sequence_number = 1;
    msg.finalize();
    msg.header.message_type = (1u16 << 8) | IPCTNL_MSG_CT_GET;
    let mut req = vec![0u8; msg.buffer_len()];
    msg.serialize(&mut req);
    socket.send(&req, 0)?;
    let mut out = Vec::new();
    let mut buf = Vec::with_capacity(1 << 16);
    loop {
        buf.clear();
        socket.recv(&mut buf, 0)?;
        let mut done = false;
        let mut rest: &[u8] = &buf;
        while rest.len() >= 16 {
            let Ok(nb) = NetlinkBuffer::new_checked(rest) else {
                break;
            };
            if matches!(nb.message_type(), NLMSG_DONE | NLMSG_ERROR) {
                done = true;
            }
            let aligned = ((nb.length() as usize) + 3) & !3;
            rest = &rest[aligned.min(rest.len())..];
        }
        out.extend(parse_datagram(&buf).into_iter().flatten());
        if done || buf.is_empty() {
            break;
        }
    }
    Ok(out)
}

/// A connection to remove from conntrack: its original tuple and, when known, conntrack's id
/// for it (so that a newer connection that reuses the tuple is left alone).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Removal {
    /// TCP or UDP.
    pub protocol: Protocol,
    /// The client (original source).
    pub client: SocketAddr,
    /// The virtual address (original destination).
    pub virtual_address: SocketAddr,
    /// Conntrack's id (`CTA_ID`), from the connection's events.
    pub id: Option<u32>,
}

/// The netlink request that deletes `r` (`IPCTNL_MSG_CT_DELETE` with the original tuple and
/// the id), asking for an acknowledgement; `seq` numbers it. The kernel answers ENOENT when
/// no connection has that tuple, or one with another id has.
pub fn removal_request(r: &Removal, seq: u32) -> Vec<u8> {
    use netlink_packet_core::{DefaultNla, NetlinkMessage};
    use netlink_packet_netfilter::conntrack::{
        ConntrackAttribute, IPTuple, ProtoTuple, Protocol as CtProto, Tuple,
    };
    use netlink_packet_netfilter::{NetfilterHeader, NetfilterProtoFamily};
    const NLM_F_REQUEST: u16 = 1;
    const NLM_F_ACK: u16 = 4;
    let family = match r.client.ip() {
        IpAddr::V4(_) => NetfilterProtoFamily::IPv4,
        IpAddr::V6(_) => NetfilterProtoFamily::IPv6,
    };
    let mut attributes = vec![ConntrackAttribute::CtaTupleOrig(vec![
        Tuple::Ip(vec![
            IPTuple::SourceAddress(r.client.ip()),
            IPTuple::DestinationAddress(r.virtual_address.ip()),
        ]),
        Tuple::Proto(vec![
            ProtoTuple::Protocol(match r.protocol {
                Protocol::Tcp => CtProto::Tcp,
                Protocol::Udp => CtProto::Udp,
            }),
            ProtoTuple::SourcePort(r.client.port()),
            ProtoTuple::DestinationPort(r.virtual_address.port()),
        ]),
    ])];
    if let Some(id) = r.id {
        attributes.push(ConntrackAttribute::Other(DefaultNla::new(
            CTA_ID,
            id.to_be_bytes().to_vec(),
        )));
    }
    let nf = NetfilterMessage::new(
        NetfilterHeader::new(family, 0, 0),
        ConntrackMessage::Delete(attributes),
    );
    let mut msg = NetlinkMessage::from(nf);
    msg.header.flags = NLM_F_REQUEST | NLM_F_ACK;
    msg.header.sequence_number = seq;
    msg.finalize();
    msg.header.message_type = (1u16 << 8) | IPCTNL_MSG_CT_DELETE;
    let mut out = vec![0u8; msg.buffer_len()];
    msg.serialize(&mut out);
    out
}

/// What [`remove`] did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Removed {
    /// Connections deleted.
    pub deleted: usize,
    /// Connections already gone: ended meanwhile (an expired one is reaped by the lookup and
    /// its DESTROY event follows as usual), or the tuple now belongs to a newer one.
    pub gone: Vec<Removal>,
}

/// Deletes connections from conntrack, each by its original tuple and id, and waits for the
/// kernel's answer to each (up to `timeout` for each read). The connection's DESTROY event
/// follows on the event socket as for any other end.
pub fn remove(removals: &[Removal], timeout: std::time::Duration) -> std::io::Result<Removed> {
    let socket = request_socket(timeout)?;
    let mut done = Removed::default();
    let mut buf = Vec::with_capacity(1 << 16);
    // A few dozen requests per datagram; each is answered by one error message (0: deleted)
    // that carries the request's number.
    const PER_DATAGRAM: usize = 64;
    let number = |chunk: usize, i: usize| (chunk * PER_DATAGRAM + i + 1) as u32;
    for (n, chunk) in removals.chunks(PER_DATAGRAM).enumerate() {
        let mut req = Vec::new();
        for (i, r) in chunk.iter().enumerate() {
            req.extend(removal_request(r, number(n, i)));
        }
        socket.send(&req, 0)?;
        let mut answered = 0;
        while answered < chunk.len() {
            buf.clear();
            socket.recv(&mut buf, 0)?;
            let mut rest: &[u8] = &buf;
            while rest.len() >= 16 {
                let Ok(nb) = NetlinkBuffer::new_checked(rest) else {
                    break;
                };
                if nb.message_type() == NLMSG_ERROR {
                    answered += 1;
                    let p = nb.payload();
                    let code = p
                        .get(..4)
                        .map_or(0, |b| i32::from_ne_bytes([b[0], b[1], b[2], b[3]]));
                    if code == 0 {
                        done.deleted += 1;
                    } else if code == -libc::ENOENT {
                        let i = nb.sequence_number().wrapping_sub(number(n, 0)) as usize;
                        if let Some(r) = chunk.get(i) {
                            done.gone.push(*r);
                        }
                    } else {
                        return Err(std::io::Error::from_raw_os_error(-code));
                    }
                }
                let aligned = ((nb.length() as usize) + 3) & !3;
                rest = &rest[aligned.min(rest.len())..];
            }
        }
    }
    Ok(done)
}

/// A ctnetlink socket for requests to the kernel (dump, delete), each read waiting at most
/// `timeout`.
fn request_socket(timeout: std::time::Duration) -> std::io::Result<netlink_sys::Socket> {
    let mut socket = netlink_sys::Socket::new(netlink_sys::protocols::NETLINK_NETFILTER)?;
    socket.bind_auto()?;
    socket.connect(&netlink_sys::SocketAddr::new(0, 0))?;
    set_receive_timeout(socket.as_raw_fd(), timeout);
    Ok(socket)
}

/// Sets `SO_RCVTIMEO` on a socket we own.
fn set_receive_timeout(fd: std::os::fd::RawFd, timeout: std::time::Duration) {
    let tv = libc::timeval {
        tv_sec: timeout.as_secs() as libc::time_t,
        tv_usec: timeout.subsec_micros() as libc::suseconds_t,
    };
    // SAFETY: setsockopt on a socket we own with a correctly sized timeval.
    unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            &tv as *const libc::timeval as *const libc::c_void,
            std::mem::size_of::<libc::timeval>() as libc::socklen_t,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The full decode into `netlink-packet-netfilter`'s owned types (what the gateway used
    /// before the in-place walk): the oracle for [`parse_datagram`].
    mod reference {
        use super::super::*;
        use netlink_packet_core::{NetlinkDeserializable, NetlinkHeader, Parseable};
        use netlink_packet_netfilter::conntrack::{
            ConntrackAttribute, IPTuple, ProtoInfo, ProtoInfoTCP, ProtoTuple, Tuple,
        };
        use netlink_packet_netfilter::conntrack::{Protocol as CtProto, Status};
        use netlink_packet_netfilter::NetfilterMessageInner;

        pub(super) fn reference_parse(buf: &[u8]) -> Vec<Result<CtEvent, CtParseError>> {
            let mut out = Vec::new();
            walk_messages(buf, &mut out, |nb| {
                let header =
                    NetlinkHeader::parse(nb).map_err(|e| CtParseError::Malformed(e.to_string()))?;
                let m = NetfilterMessage::deserialize(&header, nb.payload())
                    .map_err(|e| CtParseError::Malformed(e.to_string()))?;
                event(&header, m)
            });
            out
        }

        /// Source, destination, protocol number, source port, destination port of a tuple.
        type RefEndpoints = (
            Option<IpAddr>,
            Option<IpAddr>,
            Option<u8>,
            Option<u16>,
            Option<u16>,
        );

        fn endpoints(t: &[Tuple]) -> RefEndpoints {
            let (mut src, mut dst, mut proto, mut sport, mut dport) =
                (None, None, None, None, None);
            for x in t {
                match x {
                    Tuple::Ip(ips) => {
                        for ip in ips {
                            match ip {
                                IPTuple::SourceAddress(a) => src = Some(*a),
                                IPTuple::DestinationAddress(a) => dst = Some(*a),
                                _ => {}
                            }
                        }
                    }
                    Tuple::Proto(ps) => {
                        for p in ps {
                            match p {
                                ProtoTuple::Protocol(CtProto::Tcp) => proto = Some(6),
                                ProtoTuple::Protocol(CtProto::Udp) => proto = Some(17),
                                ProtoTuple::Protocol(_) => proto = Some(0),
                                ProtoTuple::SourcePort(x) => sport = Some(*x),
                                ProtoTuple::DestinationPort(x) => dport = Some(*x),
                                _ => {}
                            }
                        }
                    }
                    _ => {}
                }
            }
            (src, dst, proto, sport, dport)
        }

        fn event(
            header: &NetlinkHeader,
            m: NetfilterMessage,
        ) -> Result<Option<CtEvent>, CtParseError> {
            let msg = header.message_type & 0xff;
            let attrs = match m.inner {
                NetfilterMessageInner::Conntrack(ConntrackMessage::New(a)) => a,
                NetfilterMessageInner::Conntrack(ConntrackMessage::Delete(a)) => a,
                _ => return Ok(None),
            };
            let kind = match msg {
                IPCTNL_MSG_CT_NEW if header.flags & NLM_F_CREATE != 0 => CtKind::New,
                IPCTNL_MSG_CT_NEW => CtKind::Update,
                IPCTNL_MSG_CT_DELETE => CtKind::Destroy,
                _ => return Ok(None),
            };
            let mut orig = None;
            let mut reply = None;
            let mut status = None;
            let mut tcp_state = None;
            let mut orig_flags = None;
            let mut reply_flags = None;
            let mut to_member = None;
            let mut to_client = None;
            let mut id = None;
            for a in attrs {
                match a {
                    ConntrackAttribute::CtaTupleOrig(t) => orig = Some(endpoints(&t)),
                    ConntrackAttribute::CtaTupleReply(t) => reply = Some(endpoints(&t)),
                    ConntrackAttribute::CtaStatus(s) => status = Some(s),
                    ConntrackAttribute::CtaProtoInfo(pi) => {
                        for p in pi {
                            if let ProtoInfo::TCP(tcp) = p {
                                for t in tcp {
                                    match t {
                                        ProtoInfoTCP::State(s) => tcp_state = Some(s),
                                        ProtoInfoTCP::OriginalFlags(f) => {
                                            orig_flags = Some(f.flags)
                                        }
                                        ProtoInfoTCP::ReplyFlags(f) => reply_flags = Some(f.flags),
                                        _ => {}
                                    }
                                }
                            }
                        }
                    }
                    ConntrackAttribute::Other(nla) => {
                        use netlink_packet_core::Nla;
                        let mut v = vec![0u8; nla.value_len()];
                        nla.emit_value(&mut v);
                        match nla.kind() & 0x3fff {
                            CTA_COUNTERS_ORIG => to_member = Some(counter(&v)),
                            CTA_COUNTERS_REPLY => to_client = Some(counter(&v)),
                            CTA_ID if v.len() >= 4 => {
                                id = Some(u32::from_be_bytes([v[0], v[1], v[2], v[3]]))
                            }
                            _ => {}
                        }
                    }
                    _ => {}
                }
            }
            let (src, dst, proto, sport, dport) =
                orig.ok_or(CtParseError::Missing("original tuple"))?;
            let protocol = match proto {
                Some(6) => Protocol::Tcp,
                Some(17) => Protocol::Udp,
                _ => return Ok(None),
            };
            let (Some(src), Some(dst), Some(sport), Some(dport)) = (src, dst, sport, dport) else {
                return Err(CtParseError::Missing("original addresses or ports"));
            };
            let member =
                reply.and_then(|(rs, _, _, rsport, _)| Some(SocketAddr::new(rs?, rsport?)));
            let client_closed_first = match (orig_flags, reply_flags) {
                (Some(o), _) if o & TCP_FLAG_CLOSE_INIT != 0 => Some(true),
                (_, Some(r)) if r & TCP_FLAG_CLOSE_INIT != 0 => Some(false),
                _ => None,
            };
            let status = status.unwrap_or(Status::empty());
            Ok(Some(CtEvent {
                kind,
                id,
                protocol,
                client: SocketAddr::new(src, sport),
                virtual_address: SocketAddr::new(dst, dport),
                member,
                seen_reply: status.contains(Status::SeenReply),
                assured: status.contains(Status::Assured),
                dnat: status.contains(Status::DstNat),
                tcp_state,
                client_closed_first,
                to_member,
                to_client,
            }))
        }
    }
    use netlink_packet_core::{NetlinkMessage, NetlinkPayload};
    use netlink_packet_netfilter::conntrack::{
        ConntrackAttribute, IPTuple, ProtoInfo, ProtoInfoTCP, ProtoTuple, TCPFlags, Tuple,
    };
    use netlink_packet_netfilter::conntrack::{Protocol as CtProto, Status};
    use netlink_packet_netfilter::{NetfilterHeader, NetfilterProtoFamily};

    fn tuple(src: &str, sp: u16, dst: &str, dp: u16) -> Vec<Tuple> {
        tuple_of(CtProto::Tcp, src, sp, dst, dp)
    }

    fn tuple_of(proto: CtProto, src: &str, sp: u16, dst: &str, dp: u16) -> Vec<Tuple> {
        vec![
            Tuple::Ip(vec![
                IPTuple::SourceAddress(src.parse().unwrap()),
                IPTuple::DestinationAddress(dst.parse().unwrap()),
            ]),
            Tuple::Proto(vec![
                ProtoTuple::Protocol(proto),
                ProtoTuple::SourcePort(sp),
                ProtoTuple::DestinationPort(dp),
            ]),
        ]
    }

    fn encode(msg: ConntrackMessage, flags: u16) -> Vec<u8> {
        encode_family(NetfilterProtoFamily::IPv4, msg, flags)
    }

    fn encode_family(family: NetfilterProtoFamily, msg: ConntrackMessage, flags: u16) -> Vec<u8> {
        let kind: u8 = msg.message_type().into();
        let nf = NetfilterMessage::new(NetfilterHeader::new(family, 0, 0), msg);
        let mut nl = NetlinkMessage::from(nf);
        nl.header.flags = flags;
        nl.finalize();
        // finalize() computes the type from the payload; it is the subsystem and message.
        nl.header.message_type = (1u16 << 8) | u16::from(kind);
        let mut buf = vec![0u8; nl.buffer_len()];
        nl.serialize(&mut buf);
        let _ = NetlinkPayload::<NetfilterMessage>::Noop;
        buf
    }

    #[test]
    fn new_event_gives_client_virtual_and_member() {
        let m = ConntrackMessage::New(vec![
            ConntrackAttribute::CtaTupleOrig(tuple("10.0.1.1", 40000, "10.0.1.2", 8080)),
            ConntrackAttribute::CtaTupleReply(tuple("10.0.2.3", 7000, "10.0.1.1", 40000)),
            ConntrackAttribute::CtaStatus(Status::DstNat | Status::Confirmed),
        ]);
        let ev = parse_datagram(&encode(m, NLM_F_CREATE | 0x200));
        assert_eq!(ev.len(), 1);
        let e = ev[0].as_ref().unwrap();
        assert_eq!(e.kind, CtKind::New);
        assert_eq!(e.protocol, Protocol::Tcp);
        assert_eq!(e.client, "10.0.1.1:40000".parse().unwrap());
        assert_eq!(e.virtual_address, "10.0.1.2:8080".parse().unwrap());
        assert_eq!(e.member, Some("10.0.2.3:7000".parse().unwrap()));
        assert!(e.dnat);
        assert!(!e.seen_reply);
    }

    #[test]
    fn ipv6_events_give_ipv6_client_virtual_address_and_member() {
        let m = ConntrackMessage::New(vec![
            ConntrackAttribute::CtaTupleOrig(tuple("fd00:231:1::1", 40000, "fd00:231:1::2", 8080)),
            ConntrackAttribute::CtaTupleReply(tuple("fd00:231:2::3", 7000, "fd00:231:1::1", 40000)),
            ConntrackAttribute::CtaStatus(Status::DstNat | Status::Confirmed),
        ]);
        let bytes = encode_family(NetfilterProtoFamily::IPv6, m, NLM_F_CREATE | 0x200);
        let ev = parse_datagram(&bytes);
        assert_eq!(ev.len(), 1);
        let e = ev[0].as_ref().unwrap();
        assert_eq!(e.kind, CtKind::New);
        assert_eq!(e.protocol, Protocol::Tcp);
        assert_eq!(e.client, "[fd00:231:1::1]:40000".parse().unwrap());
        assert_eq!(e.virtual_address, "[fd00:231:1::2]:8080".parse().unwrap());
        assert_eq!(e.member, Some("[fd00:231:2::3]:7000".parse().unwrap()));
        assert!(e.dnat);
        // A UDP destroy of an IPv6 flow, with a reply seen.
        let m = ConntrackMessage::Delete(vec![
            ConntrackAttribute::CtaTupleOrig(tuple_of(
                CtProto::Udp,
                "fd00:231:1::1",
                5000,
                "fd00:231:1::2",
                5353,
            )),
            ConntrackAttribute::CtaTupleReply(tuple_of(
                CtProto::Udp,
                "fd00:231:2::2",
                5353,
                "fd00:231:1::1",
                5000,
            )),
            ConntrackAttribute::CtaStatus(Status::DstNat | Status::SeenReply),
        ]);
        let ev = parse_datagram(&encode_family(NetfilterProtoFamily::IPv6, m, 0));
        let e = ev[0].as_ref().unwrap();
        assert_eq!(e.kind, CtKind::Destroy);
        assert_eq!(e.protocol, Protocol::Udp);
        assert_eq!(e.member, Some("[fd00:231:2::2]:5353".parse().unwrap()));
        assert!(e.seen_reply);
        // An IPv6 message cut inside its address is an error, not a panic.
        let m = ConntrackMessage::New(vec![ConntrackAttribute::CtaTupleOrig(tuple(
            "fd00:231:1::1",
            1,
            "fd00:231:1::2",
            2,
        ))]);
        let b = encode_family(NetfilterProtoFamily::IPv6, m, NLM_F_CREATE);
        for cut in 16..b.len() {
            let mut t = b[..cut].to_vec();
            t[0..4].copy_from_slice(&(cut as u32).to_ne_bytes());
            let _ = parse_datagram(&t);
        }
    }

    #[test]
    fn update_without_create_flag_is_an_update_with_state_and_fin_side() {
        let m = ConntrackMessage::New(vec![
            ConntrackAttribute::CtaTupleOrig(tuple("10.0.1.1", 40000, "10.0.1.2", 8080)),
            ConntrackAttribute::CtaStatus(Status::SeenReply | Status::DstNat),
            ConntrackAttribute::CtaProtoInfo(vec![ProtoInfo::TCP(vec![
                ProtoInfoTCP::State(tcp_state::FIN_WAIT),
                ProtoInfoTCP::OriginalFlags(TCPFlags::parse(&[TCP_FLAG_CLOSE_INIT, 0xff]).unwrap()),
            ])]),
        ]);
        let ev = parse_datagram(&encode(m, 0));
        let e = ev[0].as_ref().unwrap();
        assert_eq!(e.kind, CtKind::Update);
        assert!(e.seen_reply);
        assert_eq!(e.tcp_state, Some(tcp_state::FIN_WAIT));
        assert_eq!(e.client_closed_first, Some(true));
    }

    #[test]
    fn a_removal_request_names_the_tuple_and_the_id_and_asks_for_an_answer() {
        // The request is the message a DESTROY event is (same type and tuple layout): our own
        // decoder reads back what was asked, for both families and protocols.
        for (protocol, client, vip, id) in [
            (
                Protocol::Tcp,
                "10.0.1.1:40000",
                "10.0.1.2:8080",
                Some(0xdead_beef),
            ),
            (Protocol::Udp, "[fd00::1]:5353", "[fd00::2]:53", None),
        ] {
            let r = Removal {
                protocol,
                client: client.parse().unwrap(),
                virtual_address: vip.parse().unwrap(),
                id,
            };
            let req = removal_request(&r, 7);
            let nb = NetlinkBuffer::new_checked(&req[..]).unwrap();
            assert_eq!(nb.message_type(), (1 << 8) | IPCTNL_MSG_CT_DELETE);
            assert_eq!(nb.flags(), 1 | 4, "NLM_F_REQUEST | NLM_F_ACK");
            assert_eq!(nb.sequence_number(), 7);
            let e = parse_datagram(&req).pop().unwrap().unwrap();
            assert_eq!(e.kind, CtKind::Destroy);
            assert_eq!(
                (e.protocol, e.client, e.virtual_address, e.id),
                (r.protocol, r.client, r.virtual_address, r.id)
            );
        }
    }

    #[test]
    fn destroy_carries_counters() {
        let mut counters = Vec::new();
        for (kind, packets, bytes) in [
            (CTA_COUNTERS_ORIG, 5u64, 420u64),
            (CTA_COUNTERS_REPLY, 4, 9000),
        ] {
            let mut v = Vec::new();
            for (k, n) in [(CTA_COUNTERS_PACKETS, packets), (CTA_COUNTERS_BYTES, bytes)] {
                v.extend_from_slice(&12u16.to_ne_bytes());
                v.extend_from_slice(&k.to_ne_bytes());
                v.extend_from_slice(&n.to_be_bytes());
            }
            counters.push(ConntrackAttribute::Other(
                netlink_packet_core::DefaultNla::new(kind | 0x8000, v),
            ));
        }
        let mut attrs = vec![ConntrackAttribute::CtaTupleOrig(tuple(
            "10.0.1.1", 1, "10.0.1.2", 2,
        ))];
        attrs.extend(counters);
        let ev = parse_datagram(&encode(ConntrackMessage::Delete(attrs), 0));
        let e = ev[0].as_ref().unwrap();
        assert_eq!(e.kind, CtKind::Destroy);
        assert_eq!(
            e.to_member,
            Some(Counter {
                packets: 5,
                bytes: 420
            })
        );
        assert_eq!(
            e.to_client,
            Some(Counter {
                packets: 4,
                bytes: 9000
            })
        );
    }

    /// Raw attribute of `kind` with `value` (for what the crate keeps as `Other`).
    fn raw(kind: u16, value: Vec<u8>) -> ConntrackAttribute {
        ConntrackAttribute::Other(netlink_packet_core::DefaultNla::new(kind, value))
    }

    fn counters_value(packets: u64, bytes: u64) -> Vec<u8> {
        let mut v = Vec::new();
        for (k, n) in [(CTA_COUNTERS_PACKETS, packets), (CTA_COUNTERS_BYTES, bytes)] {
            v.extend_from_slice(&12u16.to_ne_bytes());
            v.extend_from_slice(&k.to_ne_bytes());
            v.extend_from_slice(&n.to_be_bytes());
        }
        v
    }

    #[test]
    fn the_in_place_walk_decodes_as_the_full_decode_does() {
        // Every combination of kind, family, protocol, status, TCP state and flags, counters
        // and id, encoded by netlink-packet-netfilter, decodes to the same event both ways;
        // every truncation of each is refused or decoded alike, never a panic.
        let statuses = [
            Status::empty(),
            Status::DstNat | Status::Confirmed,
            Status::SeenReply | Status::Assured | Status::DstNat,
            Status::SeenReply,
        ];
        let mut checked = 0;
        for (family, a, b, m) in [
            (
                NetfilterProtoFamily::IPv4,
                "10.0.1.1",
                "10.0.1.2",
                "10.0.2.3",
            ),
            (
                NetfilterProtoFamily::IPv6,
                "fd00:231:1::1",
                "fd00:231:1::2",
                "fd00:231:2::3",
            ),
        ] {
            for proto in [CtProto::Tcp, CtProto::Udp, CtProto::Icmp] {
                for (si, status) in statuses.iter().enumerate() {
                    for variant in 0..4 {
                        let mut attrs = vec![
                            ConntrackAttribute::CtaTupleOrig(tuple_of(proto, a, 40000, b, 8080)),
                            ConntrackAttribute::CtaTupleReply(tuple_of(proto, m, 7000, a, 40000)),
                            ConntrackAttribute::CtaStatus(*status),
                        ];
                        if variant & 1 == 1 {
                            attrs.push(ConntrackAttribute::CtaProtoInfo(vec![ProtoInfo::TCP(
                                vec![
                                    ProtoInfoTCP::State(si as u8 + 3),
                                    ProtoInfoTCP::OriginalFlags(
                                        TCPFlags::parse(&[(si as u8) & TCP_FLAG_CLOSE_INIT, 0xff])
                                            .unwrap(),
                                    ),
                                    ProtoInfoTCP::ReplyFlags(
                                        TCPFlags::parse(&[TCP_FLAG_CLOSE_INIT, 0xff]).unwrap(),
                                    ),
                                ],
                            )]));
                        }
                        if variant & 2 == 2 {
                            attrs.push(raw(
                                CTA_COUNTERS_ORIG | 0x8000,
                                counters_value(5, 420 + si as u64),
                            ));
                            attrs.push(raw(CTA_COUNTERS_REPLY | 0x8000, counters_value(4, 9000)));
                            attrs.push(raw(CTA_ID, 0xdead_beef_u32.to_be_bytes().to_vec()));
                        }
                        for (msg, flags) in [
                            (ConntrackMessage::New(attrs.clone()), NLM_F_CREATE | 0x200),
                            (ConntrackMessage::New(attrs.clone()), 0),
                            (ConntrackMessage::Delete(attrs.clone()), 0),
                        ] {
                            let bytes = encode_family(family, msg, flags);
                            let ours = parse_datagram(&bytes);
                            assert_eq!(ours, reference::reference_parse(&bytes));
                            assert_eq!(ours.len(), usize::from(proto != CtProto::Icmp));
                            for cut in 16..bytes.len() {
                                let mut t = bytes[..cut].to_vec();
                                t[0..4].copy_from_slice(&(cut as u32).to_ne_bytes());
                                for (x, y) in parse_datagram(&t)
                                    .iter()
                                    .zip(reference::reference_parse(&t).iter())
                                {
                                    if let (Ok(x), Ok(y)) = (x, y) {
                                        assert_eq!(x, y, "cut at {cut}");
                                    }
                                }
                            }
                            checked += 1;
                        }
                    }
                }
            }
        }
        assert_eq!(checked, 2 * 3 * 4 * 4 * 3);
    }

    #[test]
    fn a_batch_receives_every_waiting_datagram_in_one_call_and_cuts_oversized_ones() {
        use std::os::unix::net::UnixDatagram;
        let (tx, rx) = UnixDatagram::pair().unwrap();
        // A full queue fails the test rather than hanging it.
        tx.set_nonblocking(true).unwrap();
        let mut batch = RecvBatch::new(64);
        let e = recv_batch(rx.as_raw_fd(), &mut batch).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::WouldBlock);
        for i in 0..(RecvBatch::COUNT + 3) {
            tx.send(&vec![i as u8; 1 + i % 50]).unwrap();
        }
        tx.send(&[7u8; 100]).unwrap();
        assert_eq!(
            recv_batch(rx.as_raw_fd(), &mut batch).unwrap(),
            RecvBatch::COUNT
        );
        for (i, d) in batch.datagrams().enumerate() {
            assert_eq!(d, &vec![i as u8; 1 + i % 50][..]);
        }
        assert_eq!(recv_batch(rx.as_raw_fd(), &mut batch).unwrap(), 4);
        let rest: Vec<&[u8]> = batch.datagrams().collect();
        assert_eq!(
            rest[2],
            &vec![(RecvBatch::COUNT + 2) as u8; 1 + (RecvBatch::COUNT + 2) % 50][..]
        );
        assert_eq!(rest[3], &[7u8; 64][..], "cut to the slot");
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        let mut junk = vec![0xffu8; 64];
        junk[0..4].copy_from_slice(&200u32.to_ne_bytes());
        let r = parse_datagram(&junk);
        assert!(r.iter().all(|x| x.is_err()));
        assert!(parse_datagram(&[1, 2, 3]).is_empty());
        // A message truncated inside its attributes.
        let m = ConntrackMessage::New(vec![ConntrackAttribute::CtaTupleOrig(tuple(
            "10.0.1.1", 1, "10.0.1.2", 2,
        ))]);
        let mut b = encode(m, NLM_F_CREATE);
        let n = b.len();
        b[0..4].copy_from_slice(&((n as u32) - 6).to_ne_bytes());
        let _ = parse_datagram(&b[..n - 6]);
    }
}
