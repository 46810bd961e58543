//! TCP listeners: one socket per relay worker on each virtual address (the relay itself is in
//! `relay`).

use std::io;
use std::net::SocketAddr;

/// Binds a listening socket (IPv6 sockets are IPv6-only, so an IPv4 and an IPv6 listener on
/// the same port can coexist). With `reuse_port`, the socket joins the port's SO_REUSEPORT
/// group: each worker thread has its own socket and accept queue, and the kernel spreads new
/// connections over them.
pub(crate) fn bind(addr: SocketAddr, reuse_port: bool) -> io::Result<std::net::TcpListener> {
    let domain = socket2::Domain::for_address(addr);
    let s = socket2::Socket::new(domain, socket2::Type::STREAM, Some(socket2::Protocol::TCP))?;
    s.set_reuse_address(true)?;
    #[cfg(unix)]
    if reuse_port {
        s.set_reuse_port(true)?;
    }
    #[cfg(not(unix))]
    let _ = reuse_port;
    if addr.is_ipv6() {
        s.set_only_v6(true)?;
    }
    s.set_nonblocking(true)?;
    s.bind(&addr.into())?;
    s.listen(4096)?;
    Ok(s.into())
}

/// Binds `workers` listening sockets on `addr`, one per worker thread (SO_REUSEPORT where
/// there is more than one). The port is first bound alone, without SO_REUSEPORT, so that a
/// port another process listens on is refused as "in use" (not shared with it); with port 0
/// that first bind picks the port all workers then share.
pub(crate) fn bind_group(
    addr: SocketAddr,
    workers: usize,
) -> io::Result<Vec<std::net::TcpListener>> {
    if workers <= 1 || cfg!(not(unix)) {
        return Ok(vec![bind(addr, false)?]);
    }
    let resolved = {
        let domain = socket2::Domain::for_address(addr);
        let s = socket2::Socket::new(domain, socket2::Type::STREAM, Some(socket2::Protocol::TCP))?;
        s.set_reuse_address(true)?;
        if addr.is_ipv6() {
            s.set_only_v6(true)?;
        }
        s.bind(&addr.into())?;
        s.local_addr()?
            .as_socket()
            .ok_or_else(|| io::Error::other("bound address is not an IP address"))?
    };
    (0..workers).map(|_| bind(resolved, true)).collect()
}
