//! A kernel-side filter on the conntrack event socket: a classic BPF program, attached with
//! `SO_ATTACH_FILTER`, that lets through only the events of connections to a virtual address
//! and port of the gateway. The kernel still builds each event once for all its listeners, but
//! the events of the host's other connections are never queued to the gateway, never wake it
//! and are never decoded: its cost follows its own sessions, not the host's traffic.
//!
//! The program walks the netlink attributes with the kernel's own attribute search
//! (`SKF_AD_NLATTR`, `SKF_AD_NLATTR_NEST`, as libnetfilter_conntrack's filters do):
//! original tuple → IP → destination address, then original tuple → protocol → destination
//! port. It is coarse on purpose (any listener address with any listener port passes); the
//! event loop still checks each event exactly. A message the program cannot read (no
//! original tuple, no destination) passes, so that the decoder counts it rather than the
//! filter hiding it.

use std::net::{IpAddr, SocketAddr};

/// One classic BPF instruction (`struct sock_filter`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Insn {
    /// Operation.
    pub code: u16,
    /// Jump offset if true.
    pub jt: u8,
    /// Jump offset if false.
    pub jf: u8,
    /// Operand.
    pub k: u32,
}

/// Most instructions the program may have; more listeners than fit leave the socket
/// unfiltered (the event loop filters exactly anyway).
pub const MAX_INSNS: usize = 1024;

const LD_IMM: u16 = 0x00;
const LDX_IMM: u16 = 0x01;
const LD_ABS_W: u16 = 0x20;
const LD_IND_W: u16 = 0x40;
const LD_IND_H: u16 = 0x48;
const LD_MEM: u16 = 0x60;
const ST: u16 = 0x02;
const TAX: u16 = 0x07;
const JA: u16 = 0x05;
const JEQ_K: u16 = 0x15;
const RET_K: u16 = 0x06;
/// `SKF_AD_OFF + SKF_AD_NLATTR`: A = offset of the attribute of type X found from offset A.
const AD_NLATTR: u32 = (-0x1000i32 + 12) as u32;
/// `SKF_AD_OFF + SKF_AD_NLATTR_NEST`: A = offset of the attribute of type X nested in the
/// attribute at offset A.
const AD_NLATTR_NEST: u32 = (-0x1000i32 + 16) as u32;
/// The attributes start after `struct nlmsghdr` (16 bytes) and `struct nfgenmsg` (4).
const ATTRS: u32 = 20;
const CTA_TUPLE_ORIG: u32 = 1;
const CTA_TUPLE_IP: u32 = 1;
const CTA_TUPLE_PROTO: u32 = 2;
const CTA_IP_V4_DST: u32 = 2;
const CTA_IP_V6_DST: u32 = 4;
const CTA_PROTO_DST_PORT: u32 = 3;
/// Scratch memory: the original tuple's offset, the IP tuple's offset.
const M_ORIG: u32 = 0;
const M_IP: u32 = 1;

/// A jump target in the program being built.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Label {
    Next,
    Accept,
    Drop,
    V6,
    Port,
    At(usize),
}

struct Asm {
    code: Vec<(u16, Label, Label, u32)>,
    labels: Vec<(Label, usize)>,
}

impl Asm {
    fn op(&mut self, code: u16, k: u32) {
        self.code.push((code, Label::Next, Label::Next, k));
    }
    fn jeq(&mut self, k: u32, t: Label, f: Label) {
        self.code.push((JEQ_K, t, f, k));
    }
    fn ja(&mut self, to: Label) {
        self.code.push((JA, Label::Next, to, 0));
    }
    /// Passes the message when A is 0 (an attribute not found): a return right here, so
    /// that no jump has to reach the program's end.
    fn accept_if_zero(&mut self) {
        let skip = Label::At(self.code.len() + 2);
        self.jeq(0, Label::Next, skip);
        self.op(RET_K, u32::MAX);
    }
    fn here(&mut self, l: Label) {
        self.labels.push((l, self.code.len()));
    }
    fn finish(self) -> Option<Vec<Insn>> {
        let at = |l: Label, i: usize| -> Option<usize> {
            match l {
                Label::Next => Some(i + 1),
                Label::At(n) => Some(n),
                _ => self.labels.iter().find(|(x, _)| *x == l).map(|(_, n)| *n),
            }
        };
        let mut out = Vec::with_capacity(self.code.len());
        for (i, &(code, t, f, k)) in self.code.iter().enumerate() {
            let rel = |l| -> Option<u32> {
                let target = at(l, i)?;
                (target > i).then(|| (target - i - 1) as u32)
            };
            let insn = if code == JA {
                Insn {
                    code,
                    jt: 0,
                    jf: 0,
                    k: rel(f)?,
                }
            } else if code == JEQ_K {
                Insn {
                    code,
                    jt: u8::try_from(rel(t)?).ok()?,
                    jf: u8::try_from(rel(f)?).ok()?,
                    k,
                }
            } else {
                Insn {
                    code,
                    jt: 0,
                    jf: 0,
                    k,
                }
            };
            out.push(insn);
        }
        (out.len() <= MAX_INSNS).then_some(out)
    }
}

/// The program that passes the events of connections to any of `listeners`' addresses and
/// ports (and messages it cannot read). None when there are too many listeners for one
/// program: the socket then stays unfiltered.
pub fn program(listeners: &[SocketAddr]) -> Option<Vec<Insn>> {
    let mut v4: Vec<u32> = Vec::new();
    let mut v6: Vec<[u32; 4]> = Vec::new();
    let mut ports: Vec<u16> = Vec::new();
    for l in listeners {
        match l.ip() {
            IpAddr::V4(a) => v4.push(u32::from(a)),
            IpAddr::V6(a) => {
                let o = a.octets();
                let w = |i: usize| u32::from_be_bytes([o[i], o[i + 1], o[i + 2], o[i + 3]]);
                v6.push([w(0), w(4), w(8), w(12)]);
            }
        }
        ports.push(l.port());
    }
    v4.sort_unstable();
    v4.dedup();
    v6.sort_unstable();
    v6.dedup();
    ports.sort_unstable();
    ports.dedup();
    let mut a = Asm {
        code: Vec::new(),
        labels: Vec::new(),
    };
    // The original tuple and its IP part.
    a.op(LD_IMM, ATTRS);
    a.op(LDX_IMM, CTA_TUPLE_ORIG);
    a.op(LD_ABS_W, AD_NLATTR);
    a.accept_if_zero();
    a.op(ST, M_ORIG);
    a.op(LDX_IMM, CTA_TUPLE_IP);
    a.op(LD_ABS_W, AD_NLATTR_NEST);
    a.accept_if_zero();
    a.op(ST, M_IP);
    // IPv4 destination.
    a.op(LDX_IMM, CTA_IP_V4_DST);
    a.op(LD_ABS_W, AD_NLATTR_NEST);
    a.jeq(0, Label::V6, Label::Next);
    a.op(TAX, 0);
    a.op(LD_IND_W, 4);
    for ip in &v4 {
        a.jeq(*ip, Label::Port, Label::Next);
    }
    a.ja(Label::Drop);
    // IPv6 destination: four words, each compared in turn.
    a.here(Label::V6);
    a.op(LD_MEM, M_IP);
    a.op(LDX_IMM, CTA_IP_V6_DST);
    a.op(LD_ABS_W, AD_NLATTR_NEST);
    a.accept_if_zero();
    a.op(TAX, 0);
    for words in &v6 {
        // Each candidate: 8 instructions; a mismatch skips to the next candidate.
        let next = a.code.len() + 8;
        for (i, w) in words.iter().enumerate() {
            a.op(LD_IND_W, 4 + 4 * i as u32);
            let on_match = if i == 3 { Label::Port } else { Label::Next };
            a.jeq(*w, on_match, Label::At(next));
        }
    }
    a.ja(Label::Drop);
    // Destination port.
    a.here(Label::Port);
    a.op(LD_MEM, M_ORIG);
    a.op(LDX_IMM, CTA_TUPLE_PROTO);
    a.op(LD_ABS_W, AD_NLATTR_NEST);
    a.accept_if_zero();
    a.op(LDX_IMM, CTA_PROTO_DST_PORT);
    a.op(LD_ABS_W, AD_NLATTR_NEST);
    a.accept_if_zero();
    a.op(TAX, 0);
    a.op(LD_IND_H, 4);
    for p in &ports {
        a.jeq(u32::from(*p), Label::Accept, Label::Next);
    }
    a.here(Label::Drop);
    a.op(RET_K, 0);
    a.here(Label::Accept);
    a.op(RET_K, u32::MAX);
    a.finish()
}

/// Attaches `program` to the socket `fd` (`SO_ATTACH_FILTER`).
pub fn attach(fd: std::os::fd::RawFd, program: &[Insn]) -> std::io::Result<()> {
    let mut insns: Vec<libc::sock_filter> = program
        .iter()
        .map(|i| libc::sock_filter {
            code: i.code,
            jt: i.jt,
            jf: i.jf,
            k: i.k,
        })
        .collect();
    let prog = libc::sock_fprog {
        len: u16::try_from(insns.len()).map_err(|_| std::io::Error::other("program too long"))?,
        filter: insns.as_mut_ptr(),
    };
    // SAFETY: setsockopt on a socket the caller owns, with a sock_fprog that points at
    // `insns`, alive for the call; the kernel copies the program.
    let r = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_ATTACH_FILTER,
            &prog as *const libc::sock_fprog as *const libc::c_void,
            std::mem::size_of::<libc::sock_fprog>() as libc::socklen_t,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use netlink_packet_core::{NlaBuffer, NlasIterator};

    /// The kernel's `nla_find` over `data[from..]`: the offset of the first attribute of
    /// `kind`, or 0.
    fn nla_find(data: &[u8], from: usize, end: usize, kind: u16) -> u32 {
        if from >= end || end > data.len() {
            return 0;
        }
        let mut pos = from;
        for a in NlasIterator::new(&data[from..end]) {
            let Ok(a) = a else { return 0 };
            if a.kind() == kind {
                return pos as u32;
            }
            pos += (a.length() as usize + 3) & !3;
        }
        0
    }

    /// A classic BPF interpreter for the instructions the program uses, with the two
    /// netlink ancillary loads as the kernel defines them.
    fn run(prog: &[Insn], data: &[u8]) -> u32 {
        let (mut a, mut x, mut mem, mut pc) = (0u32, 0u32, [0u32; 16], 0usize);
        let load = |off: usize, n: usize| -> Option<u32> {
            let b = data.get(off..off + n)?;
            Some(b.iter().fold(0u32, |v, &c| (v << 8) | u32::from(c)))
        };
        loop {
            let i = prog[pc];
            pc += 1;
            match i.code {
                LD_IMM => a = i.k,
                LDX_IMM => x = i.k,
                ST => mem[i.k as usize] = a,
                LD_MEM => a = mem[i.k as usize],
                TAX => x = a,
                LD_ABS_W if i.k == AD_NLATTR => {
                    a = nla_find(data, a as usize, data.len(), x as u16);
                }
                LD_ABS_W if i.k == AD_NLATTR_NEST => {
                    let at = a as usize;
                    let Some(nest) = data.get(at..).and_then(|d| NlaBuffer::new_checked(d).ok())
                    else {
                        a = 0;
                        continue;
                    };
                    a = nla_find(data, at + 4, at + nest.length() as usize, x as u16);
                }
                LD_IND_W => match load(x as usize + i.k as usize, 4) {
                    Some(v) => a = v,
                    None => return 0,
                },
                LD_IND_H => match load(x as usize + i.k as usize, 2) {
                    Some(v) => a = v,
                    None => return 0,
                },
                JA => pc += i.k as usize,
                JEQ_K => pc += usize::from(if a == i.k { i.jt } else { i.jf }),
                RET_K => return i.k,
                other => panic!("instruction {other:#x} not interpreted"),
            }
        }
    }

    fn passes(prog: &[Insn], msg: &[u8]) -> bool {
        run(prog, msg) != 0
    }

    /// A conntrack message as the kernel sends it, encoded by netlink-packet-netfilter.
    fn event(src: &str, sp: u16, dst: &str, dp: u16, v6: bool) -> Vec<u8> {
        use netlink_packet_core::NetlinkMessage;
        use netlink_packet_netfilter::conntrack::{
            ConntrackAttribute, ConntrackMessage, IPTuple, ProtoTuple, Protocol, Tuple,
        };
        use netlink_packet_netfilter::{NetfilterHeader, NetfilterMessage, NetfilterProtoFamily};
        let t = |s: &str, sp, d: &str, dp| {
            vec![
                Tuple::Ip(vec![
                    IPTuple::SourceAddress(s.parse().unwrap()),
                    IPTuple::DestinationAddress(d.parse().unwrap()),
                ]),
                Tuple::Proto(vec![
                    ProtoTuple::Protocol(Protocol::Tcp),
                    ProtoTuple::SourcePort(sp),
                    ProtoTuple::DestinationPort(dp),
                ]),
            ]
        };
        let msg = ConntrackMessage::New(vec![
            ConntrackAttribute::CtaTupleOrig(t(src, sp, dst, dp)),
            ConntrackAttribute::CtaTupleReply(t(dst, dp, src, sp)),
        ]);
        let family = if v6 {
            NetfilterProtoFamily::IPv6
        } else {
            NetfilterProtoFamily::IPv4
        };
        let mut nl = NetlinkMessage::from(NetfilterMessage::new(
            NetfilterHeader::new(family, 0, 0),
            msg,
        ));
        nl.finalize();
        nl.header.message_type = 1 << 8;
        let mut buf = vec![0u8; nl.buffer_len()];
        nl.serialize(&mut buf);
        buf
    }

    #[test]
    fn only_events_to_a_listener_address_and_port_pass() {
        let prog = program(&[
            "10.0.1.2:8080".parse().unwrap(),
            "10.0.1.3:53".parse().unwrap(),
            "[fd00:231:1::2]:8080".parse().unwrap(),
        ])
        .unwrap();
        assert!(passes(
            &prog,
            &event("10.0.9.9", 40000, "10.0.1.2", 8080, false)
        ));
        assert!(passes(&prog, &event("10.0.9.9", 1, "10.0.1.3", 53, false)));
        assert!(passes(
            &prog,
            &event("fd00::9", 40000, "fd00:231:1::2", 8080, true)
        ));
        // Another address, another port, the reply direction of a listener's address.
        assert!(!passes(
            &prog,
            &event("10.0.9.9", 40000, "10.0.1.4", 8080, false)
        ));
        assert!(!passes(
            &prog,
            &event("10.0.9.9", 40000, "10.0.1.2", 8081, false)
        ));
        assert!(!passes(
            &prog,
            &event("10.0.1.2", 8080, "10.0.9.9", 40000, false)
        ));
        assert!(!passes(
            &prog,
            &event("fd00::9", 40000, "fd00:231:1::3", 8080, true)
        ));
        assert!(!passes(
            &prog,
            &event("fd00::9", 40000, "fd00:231:2::2", 8080, true)
        ));
        // An IPv4 virtual address is not an IPv6 one.
        let v4_only = program(&["10.0.1.2:8080".parse().unwrap()]).unwrap();
        assert!(!passes(
            &v4_only,
            &event("fd00::9", 1, "fd00:231:1::2", 8080, true)
        ));
        assert!(passes(
            &v4_only,
            &event("10.0.9.9", 1, "10.0.1.2", 8080, false)
        ));
        // Coarse by design: a listener's address with another listener's port passes (the
        // event loop checks the pair exactly).
        assert!(passes(&prog, &event("10.0.9.9", 1, "10.0.1.2", 53, false)));
    }

    #[test]
    fn unreadable_messages_pass_to_the_decoder_and_nothing_reads_out_of_bounds() {
        let prog = program(&["10.0.1.2:8080".parse().unwrap()]).unwrap();
        // No attributes at all: passed on, for the decoder to count as malformed.
        let mut bare = event("10.0.9.9", 1, "10.0.1.2", 8080, false);
        bare.truncate(20);
        bare[0..4].copy_from_slice(&20u32.to_ne_bytes());
        assert!(passes(&prog, &bare));
        // Every truncation runs to an answer.
        let full = event("10.0.9.9", 1, "10.0.1.2", 8080, false);
        for cut in 0..full.len() {
            let _ = run(&prog, &full[..cut]);
        }
    }

    #[test]
    fn jumps_stay_inside_the_program_and_too_many_listeners_leave_it_off() {
        let many: Vec<SocketAddr> = (0..200u16)
            .map(|i| SocketAddr::from(([10, 1, (i >> 8) as u8, i as u8], 1000 + i)))
            .collect();
        let prog = program(&many).unwrap();
        for (i, insn) in prog.iter().enumerate() {
            let reach = match insn.code {
                RET_K => continue,
                JA => insn.k as usize,
                JEQ_K => usize::from(insn.jt.max(insn.jf)),
                _ => 0,
            };
            assert!(i + 1 + reach < prog.len(), "instruction {i} jumps out");
        }
        assert!(passes(
            &prog,
            &event("10.0.9.9", 1, "10.1.0.199", 1199, false)
        ));
        assert!(!passes(
            &prog,
            &event("10.0.9.9", 1, "10.1.0.200", 1199, false)
        ));
        let too_many: Vec<SocketAddr> = (0..300u16)
            .map(|i| format!("[fd00::{i:x}]:80").parse().unwrap())
            .collect();
        assert_eq!(program(&too_many), None);
    }
}
