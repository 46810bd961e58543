//! Endpoint configuration: which transport, where, and every limit.

use std::net::SocketAddr;
use std::time::Duration;

/// Default largest message, in bytes, that an endpoint sends or accepts: 64 KiB, the largest
/// ASAP/ENRP message (16-bit length) and the cookie limit of the VNFPOOL applicability text.
pub const DEFAULT_MAX_MESSAGE_SIZE: usize = 65_536;

/// Which transport an [`Endpoint`](crate::Endpoint) uses for its associations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TransportChoice {
    /// Kernel SCTP where the kernel supports it, else the TCP mapping. The choice and its reason
    /// are logged once, when the endpoint is created.
    Auto,
    /// Kernel SCTP; creating the endpoint fails where the kernel has none.
    Sctp,
    /// The TCP mapping of `docs/tcp-mapping.md`.
    Tcp,
}

/// Bounds on what an endpoint holds. Each one is enforced and reported when hit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// Largest message sent or received, in bytes. A peer sending a larger one loses its
    /// association ([`DownReason::Protocol`](crate::DownReason::Protocol)); a local send of a
    /// larger one fails with [`SendError::TooLarge`](crate::SendError::TooLarge).
    pub max_message_size: usize,
    /// Most associations open at once (inbound and outbound together). Inbound ones beyond it are
    /// refused (closed at once, counted in [`EndpointStats::refused`](crate::EndpointStats));
    /// [`EndpointHandle::connect`](crate::EndpointHandle::connect) beyond it fails.
    pub max_associations: usize,
    /// Capacity of the endpoint's event queue. When full, receiving pauses (the transports'
    /// flow control pushes back on peers) until the owner takes events.
    pub event_queue: usize,
    /// Messages queued per TCP association waiting to be written.
    /// [`Endpoint::try_send`](crate::EndpointHandle::try_send) fails with
    /// [`SendError::QueueFull`](crate::SendError::QueueFull) beyond it;
    /// [`EndpointHandle::send`](crate::EndpointHandle::send) waits.
    pub send_queue: usize,
    /// How long [`EndpointHandle::send`](crate::EndpointHandle::send) may wait for room (queue or kernel
    /// buffer) before failing with [`SendError::Timeout`](crate::SendError::Timeout).
    pub send_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_message_size: DEFAULT_MAX_MESSAGE_SIZE,
            max_associations: 10_000,
            event_queue: 1024,
            send_queue: 256,
            send_timeout: Duration::from_secs(5),
        }
    }
}

/// Kernel SCTP settings. How fast a dead peer is noticed follows from them: with heartbeats every
/// `heartbeat_interval` (plus up to one RTO of jitter), a path is marked unreachable after
/// `path_max_retrans` + 1 unanswered probes and the association is lost after
/// `association_max_retrans` + 1 retransmissions or heartbeats in a row, each waiting one RTO
/// (doubling from `rto_initial` up to `rto_max`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SctpConfig {
    /// Interval between heartbeats on an idle path (`SCTP_PEER_ADDR_PARAMS.spp_hbinterval`).
    /// `None` disables heartbeats.
    pub heartbeat_interval: Option<Duration>,
    /// Initial retransmission timeout (`SCTP_RTOINFO.srto_initial`).
    pub rto_initial: Duration,
    /// Lower bound of the retransmission timeout (`srto_min`).
    pub rto_min: Duration,
    /// Upper bound of the retransmission timeout (`srto_max`).
    pub rto_max: Duration,
    /// Retransmissions on one path before it is marked unreachable (`spp_pathmaxrxt`).
    pub path_max_retrans: u16,
    /// Retransmissions on the association before it is lost (`SCTP_ASSOCINFO.sasoc_asocmaxrxt`).
    pub association_max_retrans: u16,
    /// INIT retransmissions before a connect attempt fails (`SCTP_INITMSG.sinit_max_attempts`).
    pub init_max_attempts: u16,
    /// Longest INIT retransmission timeout (`sinit_max_init_timeo`).
    pub init_max_timeout: Duration,
    /// Outbound streams requested (`sinit_num_ostreams`).
    pub outbound_streams: u16,
    /// Inbound streams accepted (`sinit_max_instreams`).
    pub max_inbound_streams: u16,
    /// Disable Nagle-like bundling delays (`SCTP_NODELAY`): request/response traffic wants it.
    pub nodelay: bool,
    /// Socket send buffer (`SO_SNDBUF`), `None` for the kernel default.
    pub send_buffer: Option<usize>,
    /// Socket receive buffer (`SO_RCVBUF`), `None` for the kernel default.
    pub receive_buffer: Option<usize>,
}

impl Default for SctpConfig {
    /// RSPLIB-like defaults tuned for failover: heartbeat every 1 s, RTO 200 ms..1 s (initial
    /// 500 ms), 3 path and 6 association retransmissions. A silent peer is noticed within a few
    /// seconds rather than the kernel's default of minutes.
    fn default() -> Self {
        SctpConfig {
            heartbeat_interval: Some(Duration::from_secs(1)),
            rto_initial: Duration::from_millis(500),
            rto_min: Duration::from_millis(200),
            rto_max: Duration::from_secs(1),
            path_max_retrans: 3,
            association_max_retrans: 6,
            init_max_attempts: 4,
            init_max_timeout: Duration::from_secs(2),
            outbound_streams: 16,
            max_inbound_streams: 16,
            nodelay: true,
            send_buffer: None,
            receive_buffer: None,
        }
    }
}

/// Settings of the TCP mapping.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TcpConfig {
    /// Send a KEEPALIVE frame when nothing was received for this long. `None` disables
    /// keep-alives (and the timeout).
    pub keepalive_interval: Option<Duration>,
    /// Declare the peer dead ([`DownReason::KeepAliveTimeout`](crate::DownReason)) when nothing at
    /// all was received for this long.
    pub keepalive_timeout: Duration,
    /// Give up a connect attempt to one address after this long.
    pub connect_timeout: Duration,
    /// Disable Nagle's algorithm (`TCP_NODELAY`).
    pub nodelay: bool,
    /// Also accept plain-TCP ASAP (no frame header, RFC 5352 §3.3) on these addresses: the
    /// message length of the ASAP header frames each message, the PPID is 11 in both
    /// directions and only PPID 11 can be sent there. For a registrar's HANDLE_RESOLUTION service
    /// to pool users. Works beside SCTP and beside the TCP mapping.
    pub plain_asap_listen: Vec<SocketAddr>,
    /// Outbound connections leave from the port this endpoint listens on (`SO_REUSEPORT` on
    /// the listener and the connecting socket), so that the address the peer sees is one it
    /// can connect back to. A PE's ASAP address is where a registrar that took it over sends
    /// the H=1 keep-alive (RFC 5352 §3.4, RFC 5353 §3.5.2). Off by default: with it, another
    /// process of the same user could bind the same port.
    pub connect_from_listening_port: bool,
}

impl Default for TcpConfig {
    fn default() -> Self {
        TcpConfig {
            keepalive_interval: Some(Duration::from_secs(1)),
            keepalive_timeout: Duration::from_secs(5),
            connect_timeout: Duration::from_secs(5),
            nodelay: true,
            plain_asap_listen: Vec::new(),
            connect_from_listening_port: false,
        }
    }
}

/// Everything an [`Endpoint`](crate::Endpoint) needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EndpointConfig {
    /// SCTP, TCP, or decide at start.
    pub transport: TransportChoice,
    /// Local addresses. For SCTP all of them are bound to one socket (multi-homing); they must
    /// share one port (or 0 for "any", taken from the first). For TCP, with
    /// [`accept`](Self::accept) each gets a listener; outbound connections bind to the first
    /// address of the peer's family. Empty: the wildcard address with an ephemeral port.
    pub local_addrs: Vec<SocketAddr>,
    /// Accept inbound associations (listen).
    pub accept: bool,
    /// Sizes and queues.
    pub limits: Limits,
    /// Kernel SCTP settings.
    pub sctp: SctpConfig,
    /// TCP mapping settings, including the plain-TCP ASAP listeners.
    pub tcp: TcpConfig,
    /// TLS for every TCP association (mapped and plain ASAP, inbound and outbound); `None`
    /// for none. With TLS, [`TransportChoice::Auto`] picks the TCP mapping and
    /// [`TransportChoice::Sctp`] is refused ([`TlsError::OverSctp`](crate::TlsError)).
    pub tls: Option<crate::TlsSettings>,
}

impl EndpointConfig {
    /// Defaults for the given transport: no local address (ephemeral), not accepting.
    pub fn new(transport: TransportChoice) -> Self {
        EndpointConfig {
            transport,
            local_addrs: Vec::new(),
            accept: false,
            limits: Limits::default(),
            sctp: SctpConfig::default(),
            tcp: TcpConfig::default(),
            tls: None,
        }
    }

    /// A listening endpoint on the given addresses.
    pub fn listening(transport: TransportChoice, addrs: &[SocketAddr]) -> Self {
        let mut c = Self::new(transport);
        c.local_addrs = addrs.to_vec();
        c.accept = true;
        c
    }

    pub(crate) fn validate(&self) -> Result<(), crate::TransportError> {
        use crate::TransportError::Config;
        let l = &self.limits;
        if l.max_message_size == 0 || l.max_message_size > crate::tcp::frame::MAX_FRAME_PAYLOAD {
            return Err(Config(format!(
                "max_message_size must be 1..={} (is {})",
                crate::tcp::frame::MAX_FRAME_PAYLOAD,
                l.max_message_size
            )));
        }
        if l.max_associations == 0 || l.event_queue == 0 || l.send_queue == 0 {
            return Err(Config(
                "max_associations, event_queue and send_queue must be at least 1".into(),
            ));
        }
        let ports: Vec<u16> = self
            .local_addrs
            .iter()
            .map(|a| a.port())
            .filter(|&p| p != 0)
            .collect();
        if ports.windows(2).any(|w| w[0] != w[1]) {
            return Err(Config(format!(
                "local addresses must share one port (or use 0): {:?}",
                self.local_addrs
            )));
        }
        let s = &self.sctp;
        if s.rto_min > s.rto_initial || s.rto_initial > s.rto_max || s.rto_min.is_zero() {
            return Err(Config(format!(
                "SCTP RTO bounds must satisfy 0 < min <= initial <= max (min {:?}, initial {:?}, max {:?})",
                s.rto_min, s.rto_initial, s.rto_max
            )));
        }
        if s.outbound_streams == 0 || s.max_inbound_streams == 0 {
            return Err(Config("SCTP stream counts must be at least 1".into()));
        }
        if let Some(i) = self.tcp.keepalive_interval {
            if i.is_zero() || self.tcp.keepalive_timeout <= i {
                return Err(Config(format!(
                    "TCP keep-alive timeout ({:?}) must exceed the interval ({:?}) and both be > 0",
                    self.tcp.keepalive_timeout, i
                )));
            }
        }
        if let Some(t) = &self.tls {
            if t.handshake_timeout.is_zero() {
                return Err(Config("TLS handshake timeout must be > 0".into()));
            }
            if self.transport == TransportChoice::Sctp {
                return Err(crate::TlsError::OverSctp.into());
            }
            let listens = self.accept || !self.tcp.plain_asap_listen.is_empty();
            if listens && (t.certificate_chain.is_none() || t.private_key.is_none()) {
                return Err(crate::TlsError::ListenerWithoutCertificate.into());
            }
        }
        Ok(())
    }
}
