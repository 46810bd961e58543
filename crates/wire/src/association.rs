//! How an association is named and what carries it: one id type and one kind enum shared by the
//! transport (which allocates and reports them), the handlespace (which indexes PEs by owner
//! association) and the protocol cores (which take them as event arguments without a runtime).

use std::fmt;

/// Names one association of one endpoint. Allocated by the endpoint (never the kernel's SCTP
/// association id, which is reused), increasing, never reused by that endpoint. The handlespace
/// indexes PEs by it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AssociationId(pub u64);

impl fmt::Display for AssociationId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "#{}", self.0)
    }
}

/// The transport of an endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TransportKind {
    /// Kernel SCTP.
    Sctp,
    /// TCP (mapped or plain).
    Tcp,
}

impl fmt::Display for TransportKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            TransportKind::Sctp => "SCTP",
            TransportKind::Tcp => "TCP",
        })
    }
}

/// What carries one association.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AssociationKind {
    /// A kernel SCTP association: several paths possible, PPID and stream native; its peer
    /// addresses are all of the peer's addresses.
    Sctp,
    /// A TCP connection in the framed mapping of `docs/tcp-mapping.md`: PPID and stream carried
    /// in each frame, keep-alives.
    TcpMapped,
    /// A plain-TCP ASAP connection (RFC 5352 §3.3): no frame header, every message is ASAP
    /// (PPID 11) on stream 0; pool users' handle resolutions only.
    TcpPlain,
}

impl AssociationKind {
    /// SCTP or TCP.
    pub fn transport(self) -> TransportKind {
        match self {
            AssociationKind::Sctp => TransportKind::Sctp,
            AssociationKind::TcpMapped | AssociationKind::TcpPlain => TransportKind::Tcp,
        }
    }
}
