//! UDP multicast for registrar auto-configuration: ASAP_SERVER_ANNOUNCE (RFC 5352 §3.6) and
//! ENRP_PRESENCE (RFC 5353 §3.2) datagrams on the groups of the active profile.
//!
//! Announces carry no security: whatever arrives here is untrusted input (RFC 5355), to be
//! decoded with the bounded decoder of `rserpool-wire` and rate-limited by the caller.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use rserpool_transport::multicast::{MulticastConfig, MulticastSocket, Profile};
//! use rserpool_wire::Protocol;
//!
//! let config = MulticastConfig::for_profile(Profile::Rsplib, Protocol::Asap); // 239.0.0.50:3863
//! let socket = MulticastSocket::open(&config)?;
//! socket.send(&[0x0a, 0x00, 0x00, 0x08, 0x1d, 0xee, 0xa4, 0x48]).await?; // a SERVER_ANNOUNCE
//! let datagram = socket.recv().await?;
//! println!("{} bytes from {}", datagram.data.len(), datagram.source);
//! # Ok(()) }
//! ```

use crate::error::TransportError;
use bytes::Bytes;
use rserpool_wire::Protocol;
use socket2::{Domain, Protocol as SockProtocol, SockAddr, Socket, Type};
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use tokio::net::UdpSocket;

/// Which set of defaults to follow.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Profile {
    /// Interoperate with RSPLIB: ASAP announces on 239.0.0.50:3863, ENRP presence on
    /// 239.0.0.51:9901 (organisation-local scope).
    Rsplib,
    /// The IANA assignment: 224.0.1.185 (IPv4) and FF0X::133 (IPv6) on the well-known ports.
    Rfc,
}

/// RSPLIB's ASAP announce group, 239.0.0.50.
pub const RSPLIB_ASAP_GROUP: Ipv4Addr = Ipv4Addr::new(239, 0, 0, 50);
/// RSPLIB's ENRP presence group, 239.0.0.51.
pub const RSPLIB_ENRP_GROUP: Ipv4Addr = Ipv4Addr::new(239, 0, 0, 51);
/// The IANA IPv4 group for RSerPool, 224.0.1.185 (ASAP and ENRP, told apart by port).
pub const IANA_GROUP_V4: Ipv4Addr = Ipv4Addr::new(224, 0, 1, 185);
/// IPv6 multicast scope of FF0X::133 (the X).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Ipv6Scope {
    /// FF02::133
    LinkLocal,
    /// FF05::133
    SiteLocal,
    /// FF08::133
    OrganizationLocal,
    /// FF0E::133
    Global,
}

/// The IANA IPv6 group FF0X::133 for the given scope.
pub const fn iana_group_v6(scope: Ipv6Scope) -> Ipv6Addr {
    let x = match scope {
        Ipv6Scope::LinkLocal => 0xff02,
        Ipv6Scope::SiteLocal => 0xff05,
        Ipv6Scope::OrganizationLocal => 0xff08,
        Ipv6Scope::Global => 0xff0e,
    };
    Ipv6Addr::new(x, 0, 0, 0, 0, 0, 0, 0x133)
}

/// The default IPv4 group and port of `protocol` in `profile`.
pub fn default_group_v4(profile: Profile, protocol: Protocol) -> SocketAddr {
    let ip = match (profile, protocol) {
        (Profile::Rsplib, Protocol::Asap) => RSPLIB_ASAP_GROUP,
        (Profile::Rsplib, Protocol::Enrp) => RSPLIB_ENRP_GROUP,
        (Profile::Rfc, _) => IANA_GROUP_V4,
    };
    SocketAddr::V4(SocketAddrV4::new(ip, protocol.well_known_port()))
}

/// The default IPv6 group and port of `protocol` (FF0X::133 in both profiles: RSPLIB has no
/// IPv6 group of its own).
pub fn default_group_v6(scope: Ipv6Scope, protocol: Protocol) -> SocketAddr {
    SocketAddr::V6(SocketAddrV6::new(
        iana_group_v6(scope),
        protocol.well_known_port(),
        0,
        0,
    ))
}

/// An interface to join a group on and send from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Interface {
    /// Let the kernel choose (the interface of the route to the group).
    Default,
    /// An IPv4 interface, named by one of its addresses (`127.0.0.1` is the loopback).
    V4(Ipv4Addr),
    /// An IPv6 interface, by index (`1` is usually the loopback).
    V6Index(u32),
}

/// How to open a multicast socket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MulticastConfig {
    /// Group and port.
    pub group: SocketAddr,
    /// Interfaces to join the group on; the first one is also where datagrams are sent.
    pub interfaces: Vec<Interface>,
    /// TTL (IPv4) or hop limit (IPv6) of sent datagrams; 1 keeps announces on the local link.
    pub ttl: u32,
    /// Receive our own datagrams (needed when several registrars share one host).
    pub loopback: bool,
    /// Largest datagram accepted; longer ones are dropped and reported as an error.
    pub max_datagram: usize,
}

impl MulticastConfig {
    /// The IPv4 group of `protocol` in `profile`, default interface, TTL 1, loopback on.
    pub fn for_profile(profile: Profile, protocol: Protocol) -> Self {
        MulticastConfig {
            group: default_group_v4(profile, protocol),
            interfaces: vec![Interface::Default],
            ttl: 1,
            loopback: true,
            max_datagram: 65_535,
        }
    }
}

/// One datagram received.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Datagram {
    /// Its payload.
    pub data: Bytes,
    /// Who sent it (untrusted: any host in the scope can claim to be a registrar).
    pub source: SocketAddr,
}

/// A UDP socket joined to one group, sending to it and receiving from it.
#[derive(Debug)]
pub struct MulticastSocket {
    socket: UdpSocket,
    group: SocketAddr,
    max_datagram: usize,
}

fn err(context: &'static str) -> impl Fn(io::Error) -> TransportError {
    move |e| TransportError::io(context, e)
}

impl MulticastSocket {
    /// Opens the socket: `SO_REUSEADDR`/`SO_REUSEPORT` (several receivers on one host), bound to
    /// the group's port (and, on Linux, the group address, so unicast to that port is not
    /// mixed in), joined on each interface, with TTL and loopback set. Must be called inside a
    /// tokio runtime.
    pub fn open(config: &MulticastConfig) -> Result<MulticastSocket, TransportError> {
        let group = config.group;
        if !group.ip().is_multicast() {
            return Err(TransportError::Config(format!(
                "{} is not a multicast address",
                group.ip()
            )));
        }
        if config.interfaces.is_empty() {
            return Err(TransportError::Config(
                "multicast needs at least one interface (Interface::Default for any)".into(),
            ));
        }
        let domain = if group.is_ipv4() {
            Domain::IPV4
        } else {
            Domain::IPV6
        };
        let s = Socket::new(domain, Type::DGRAM, Some(SockProtocol::UDP))
            .map_err(err("multicast socket"))?;
        s.set_reuse_address(true).map_err(err("SO_REUSEADDR"))?;
        #[cfg(all(unix, not(target_os = "solaris"), not(target_os = "illumos")))]
        s.set_reuse_port(true).map_err(err("SO_REUSEPORT"))?;
        s.set_nonblocking(true).map_err(err("O_NONBLOCK"))?;
        let bind_ip = if cfg!(target_os = "linux") {
            group.ip()
        } else if group.is_ipv4() {
            IpAddr::V4(Ipv4Addr::UNSPECIFIED)
        } else {
            IpAddr::V6(Ipv6Addr::UNSPECIFIED)
        };
        let bind = SocketAddr::new(bind_ip, group.port());
        s.bind(&SockAddr::from(bind))
            .map_err(|e| TransportError::Bind {
                addr: bind.to_string(),
                source: e,
            })?;
        match group.ip() {
            IpAddr::V4(g) => {
                #[cfg(target_os = "linux")]
                s.set_multicast_all_v4(false)
                    .map_err(err("IP_MULTICAST_ALL"))?;
                for i in &config.interfaces {
                    let ifa = match i {
                        Interface::Default => Ipv4Addr::UNSPECIFIED,
                        Interface::V4(a) => *a,
                        Interface::V6Index(_) => {
                            return Err(TransportError::Config(
                                "an IPv6 interface index for an IPv4 group".into(),
                            ))
                        }
                    };
                    s.join_multicast_v4(&g, &ifa)
                        .map_err(err("IP_ADD_MEMBERSHIP"))?;
                }
                if let Interface::V4(a) = config.interfaces[0] {
                    s.set_multicast_if_v4(&a).map_err(err("IP_MULTICAST_IF"))?;
                }
                s.set_multicast_ttl_v4(config.ttl)
                    .map_err(err("IP_MULTICAST_TTL"))?;
                s.set_multicast_loop_v4(config.loopback)
                    .map_err(err("IP_MULTICAST_LOOP"))?;
            }
            IpAddr::V6(g) => {
                #[cfg(target_os = "linux")]
                s.set_multicast_all_v6(false)
                    .map_err(err("IPV6_MULTICAST_ALL"))?;
                for i in &config.interfaces {
                    let idx = match i {
                        Interface::Default => 0,
                        Interface::V6Index(n) => *n,
                        Interface::V4(_) => {
                            return Err(TransportError::Config(
                                "an IPv4 interface for an IPv6 group".into(),
                            ))
                        }
                    };
                    s.join_multicast_v6(&g, idx)
                        .map_err(err("IPV6_JOIN_GROUP"))?;
                }
                if let Interface::V6Index(n) = config.interfaces[0] {
                    s.set_multicast_if_v6(n).map_err(err("IPV6_MULTICAST_IF"))?;
                }
                s.set_multicast_hops_v6(config.ttl)
                    .map_err(err("IPV6_MULTICAST_HOPS"))?;
                s.set_multicast_loop_v6(config.loopback)
                    .map_err(err("IPV6_MULTICAST_LOOP"))?;
            }
        }
        let socket = UdpSocket::from_std(s.into()).map_err(err("registering the UDP socket"))?;
        let interfaces: Vec<String> = config
            .interfaces
            .iter()
            .map(|i| match i {
                Interface::Default => "chosen by the kernel".to_string(),
                Interface::V4(a) => a.to_string(),
                Interface::V6Index(n) => format!("interface index {n}"),
            })
            .collect();
        tracing::info!(%group, interfaces = %interfaces.join(", "), ttl = config.ttl, "multicast joined");
        Ok(MulticastSocket {
            socket,
            group,
            max_datagram: config.max_datagram,
        })
    }

    /// The group and port.
    pub fn group(&self) -> SocketAddr {
        self.group
    }

    /// The interface datagrams go out on, as the kernel has it (`IP_MULTICAST_IF`;
    /// 0.0.0.0 = chosen by the route). IPv4 groups only; `None` for IPv6.
    pub fn sending_interface(&self) -> io::Result<Option<Ipv4Addr>> {
        if !self.group.is_ipv4() {
            return Ok(None);
        }
        socket2::SockRef::from(&self.socket)
            .multicast_if_v4()
            .map(Some)
    }

    /// The TTL (IPv4) or hop limit (IPv6) of sent datagrams, as the kernel has it.
    pub fn ttl(&self) -> io::Result<u32> {
        let s = socket2::SockRef::from(&self.socket);
        if self.group.is_ipv4() {
            s.multicast_ttl_v4()
        } else {
            s.multicast_hops_v6()
        }
    }

    /// Sends one datagram to the group.
    pub async fn send(&self, data: &[u8]) -> io::Result<()> {
        let n = self.socket.send_to(data, self.group).await?;
        if n != data.len() {
            return Err(io::Error::new(
                io::ErrorKind::WriteZero,
                format!("datagram cut short: {n} of {} bytes sent", data.len()),
            ));
        }
        Ok(())
    }

    /// Receives the next datagram. A datagram longer than
    /// [`MulticastConfig::max_datagram`] is dropped and reported as `InvalidData` (the next call
    /// goes on with the following one).
    pub async fn recv(&self) -> io::Result<Datagram> {
        let mut buf = vec![0u8; self.max_datagram + 1];
        let (n, source) = self.socket.recv_from(&mut buf).await?;
        if n > self.max_datagram {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "datagram from {source} longer than {} bytes dropped",
                    self.max_datagram
                ),
            ));
        }
        buf.truncate(n);
        Ok(Datagram {
            data: Bytes::from(buf),
            source,
        })
    }
}

/// The IPv4 addresses of the interfaces that are up and can send multicast (loopback
/// included), as `getifaddrs(3)` lists them; empty where the list cannot be read.
pub fn ipv4_multicast_interfaces() -> Vec<Ipv4Addr> {
    let mut out = Vec::new();
    #[cfg(unix)]
    // SAFETY: getifaddrs allocates a list that is only read here and freed once with
    // freeifaddrs; every pointer is checked for null before it is read.
    unsafe {
        let mut list: *mut libc::ifaddrs = std::ptr::null_mut();
        if libc::getifaddrs(&mut list) != 0 {
            return out;
        }
        let mut cur = list;
        while !cur.is_null() {
            let ifa = &*cur;
            let flags = ifa.ifa_flags as libc::c_int;
            let up = flags & libc::IFF_UP != 0;
            let usable = flags & (libc::IFF_MULTICAST | libc::IFF_LOOPBACK) != 0;
            if up && usable && !ifa.ifa_addr.is_null() {
                let sa = &*ifa.ifa_addr;
                if libc::c_int::from(sa.sa_family) == libc::AF_INET {
                    let sin = &*(ifa.ifa_addr as *const libc::sockaddr_in);
                    let ip = Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr));
                    if !out.contains(&ip) {
                        out.push(ip);
                    }
                }
            }
            cur = ifa.ifa_next;
        }
        libc::freeifaddrs(list);
    }
    out
}

/// The interfaces (by IPv4 address) announces for a server listening on `listen` go out on:
/// the announces follow the listening addresses. A loopback address gives the loopback
/// interface (127.0.0.1), a specific address its own interface, a wildcard address every
/// interface in `host_interfaces` (see [`ipv4_multicast_interfaces`]). IPv6 addresses give
/// none (announces are IPv4 here). Each interface appears once, in the order met.
pub fn announce_interfaces(listen: &[SocketAddr], host_interfaces: &[Ipv4Addr]) -> Vec<Ipv4Addr> {
    let mut out: Vec<Ipv4Addr> = Vec::new();
    let mut push = |ip: Ipv4Addr| {
        if !out.contains(&ip) {
            out.push(ip);
        }
    };
    for a in listen {
        match a.ip() {
            IpAddr::V4(ip) if ip.is_loopback() => push(Ipv4Addr::LOCALHOST),
            IpAddr::V4(ip) if ip.is_unspecified() => host_interfaces.iter().for_each(|i| push(*i)),
            IpAddr::V4(ip) => push(ip),
            IpAddr::V6(ip) => match ip.to_ipv4_mapped() {
                Some(v4) if v4.is_loopback() => push(Ipv4Addr::LOCALHOST),
                Some(v4) => push(v4),
                None if ip.is_loopback() => push(Ipv4Addr::LOCALHOST),
                None if ip.is_unspecified() => host_interfaces.iter().for_each(|i| push(*i)),
                None => {}
            },
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn profile_groups() {
        assert_eq!(
            default_group_v4(Profile::Rsplib, Protocol::Asap),
            "239.0.0.50:3863".parse().unwrap()
        );
        assert_eq!(
            default_group_v4(Profile::Rsplib, Protocol::Enrp),
            "239.0.0.51:9901".parse().unwrap()
        );
        assert_eq!(
            default_group_v4(Profile::Rfc, Protocol::Asap),
            "224.0.1.185:3863".parse().unwrap()
        );
        assert_eq!(
            default_group_v4(Profile::Rfc, Protocol::Enrp),
            "224.0.1.185:9901".parse().unwrap()
        );
        assert_eq!(
            default_group_v6(Ipv6Scope::SiteLocal, Protocol::Asap),
            "[ff05::133]:3863".parse().unwrap()
        );
        assert_eq!(
            iana_group_v6(Ipv6Scope::Global),
            "ff0e::133".parse::<Ipv6Addr>().unwrap()
        );
    }

    #[test]
    fn announces_follow_the_listening_addresses() {
        let host = [Ipv4Addr::LOCALHOST, Ipv4Addr::new(192, 168, 1, 5)];
        let a = |s: &str| s.parse::<SocketAddr>().unwrap();
        assert_eq!(
            announce_interfaces(&[a("127.0.0.1:3863")], &host),
            vec![Ipv4Addr::LOCALHOST]
        );
        assert_eq!(
            announce_interfaces(&[a("127.0.0.5:3863"), a("[::1]:3863")], &host),
            vec![Ipv4Addr::LOCALHOST],
            "every loopback address is the loopback interface"
        );
        assert_eq!(
            announce_interfaces(&[a("10.1.2.3:3863")], &host),
            vec![Ipv4Addr::new(10, 1, 2, 3)],
            "a specific address: its interface only"
        );
        assert_eq!(
            announce_interfaces(&[a("0.0.0.0:3863")], &host),
            host.to_vec()
        );
        assert!(announce_interfaces(&[a("[2001:db8::1]:3863")], &host).is_empty());
        assert!(ipv4_multicast_interfaces().contains(&Ipv4Addr::LOCALHOST));
    }
}
