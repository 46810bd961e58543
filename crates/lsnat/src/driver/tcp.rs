//! TCP listeners: one socket per virtual address, shared by the relay workers (the relay
//! itself is in `relay`).

use std::io;
use std::net::SocketAddr;

/// Binds a listening socket (IPv6 sockets are IPv6-only, so an IPv4 and an IPv6 listener on
/// the same port can coexist). No `SO_REUSEPORT`: a port another process listens on is refused
/// as in use, and no other process can join this one's accept queue later.
pub(crate) fn bind(addr: SocketAddr) -> io::Result<std::net::TcpListener> {
    let domain = socket2::Domain::for_address(addr);
    let s = socket2::Socket::new(domain, socket2::Type::STREAM, Some(socket2::Protocol::TCP))?;
    s.set_reuse_address(true)?;
    if addr.is_ipv6() {
        s.set_only_v6(true)?;
    }
    s.set_nonblocking(true)?;
    s.bind(&addr.into())?;
    s.listen(4096)?;
    Ok(s.into())
}
