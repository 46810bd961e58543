//! Typed errors.

use crate::AssociationId;
use std::io;

/// Creating an endpoint, connecting, or asking about an association failed.
#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    /// The configuration is inconsistent; the text names the field.
    #[error("invalid transport configuration: {0}")]
    Config(String),
    /// SCTP was asked for but the kernel has none.
    #[error("kernel SCTP is not available: {0}")]
    SctpUnavailable(io::Error),
    /// Binding a local address failed.
    #[error("cannot bind {addr}: {source}")]
    Bind {
        /// The address.
        addr: String,
        /// The system's reason.
        source: io::Error,
    },
    /// [`EndpointHandle::connect`](crate::EndpointHandle::connect) was given no address.
    #[error("connect needs at least one peer address")]
    NoAddress,
    /// The endpoint holds [`Limits::max_associations`](crate::Limits) associations already.
    #[error("association limit reached ({0})")]
    TooManyAssociations(usize),
    /// No association with this id is open.
    #[error("no open association {0}")]
    UnknownAssociation(AssociationId),
    /// SCTP allows one association between two endpoints (local and peer port and addresses);
    /// this endpoint already has one with the peer at these addresses.
    #[error("already associated with the peer at {0}")]
    AlreadyAssociated(String),
    /// The endpoint has been shut down.
    #[error("endpoint closed")]
    Closed,
    /// A system call failed.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: &'static str,
        /// The system's reason.
        source: io::Error,
    },
    /// Sending failed.
    #[error(transparent)]
    Send(#[from] SendError),
    /// The TLS settings cannot be used (a file, a key, TLS over SCTP).
    #[error(transparent)]
    Tls(#[from] crate::TlsError),
}

impl TransportError {
    pub(crate) fn io(context: &'static str, source: io::Error) -> Self {
        TransportError::Io { context, source }
    }
}

/// A message could not be handed to the transport.
#[derive(Debug, thiserror::Error)]
pub enum SendError {
    /// No open association with this id.
    #[error("no open association {0}")]
    UnknownAssociation(AssociationId),
    /// The message exceeds [`Limits::max_message_size`](crate::Limits).
    #[error("message of {size} bytes exceeds the limit of {limit}")]
    TooLarge {
        /// Size of the message.
        size: usize,
        /// The configured limit.
        limit: usize,
    },
    /// The association's send queue (TCP) or the kernel's send buffer (SCTP) is full;
    /// [`try_send`](crate::EndpointHandle::try_send) only. Gives the message back, so that
    /// the caller can hold it and try again.
    #[error("send queue of association {id} is full")]
    QueueFull {
        /// The association.
        id: AssociationId,
        /// The message not sent.
        data: bytes::Bytes,
    },
    /// No room appeared within [`Limits::send_timeout`](crate::Limits).
    #[error("send to association {0} timed out")]
    Timeout(AssociationId),
    /// The stream number is not below the association's outbound stream count (SCTP), or not 0
    /// on a plain-TCP ASAP association.
    #[error("stream {stream} is not available on association {id}")]
    BadStream {
        /// The association.
        id: AssociationId,
        /// The stream asked for.
        stream: u16,
    },
    /// A plain-TCP ASAP association carries only PPID 11.
    #[error("association {id} is plain-TCP ASAP and cannot carry PPID {ppid}")]
    PpidNotCarried {
        /// The association.
        id: AssociationId,
        /// The PPID asked for.
        ppid: u32,
    },
    /// A plain-TCP ASAP message must be framed by its own ASAP header length.
    #[error("message is not one ASAP message framed by its header length")]
    NotAsapFramed,
    /// The kernel refused the message.
    #[error("send failed: {0}")]
    Io(#[from] io::Error),
}
