//! A raw ASAP peer over the TCP mapping, for tests that must say exactly what a PE or PU sends.

use rserpool_transport::{
    AssociationId, Endpoint, EndpointConfig, Event, SendError, TransportChoice, TransportError,
};
use rserpool_wire::asap::AsapMessage;
use rserpool_wire::{Codec, DecodeError, EncodeError, Protocol};
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

/// Why an [`AsapClient`] could not connect, send or receive.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The local endpoint could not be bound, or the connection not started.
    #[error("transport: {0}")]
    Transport(#[from] TransportError),
    /// The registrar closed or refused the association before it came up.
    #[error("association refused: {0}")]
    Refused(String),
    /// The association is down (or the endpoint closed).
    #[error("association closed")]
    Closed,
    /// Nothing arrived within the time given.
    #[error("nothing received within {0:?}")]
    Timeout(Duration),
    /// The message could not be encoded.
    #[error("encode: {0}")]
    Encode(#[from] EncodeError),
    /// The transport did not take the message.
    #[error("send: {0}")]
    Send(#[from] SendError),
    /// What arrived is not ASAP this codec decodes.
    #[error("decode: {0}")]
    Decode(#[from] DecodeError),
}

impl ClientError {
    /// Whether nothing more came: the time ran out or the association is down (as opposed to a
    /// failure of the transport or the codec).
    pub fn is_quiet(&self) -> bool {
        matches!(self, ClientError::Timeout(_) | ClientError::Closed)
    }
}

/// One association to a registrar over the TCP mapping, speaking ASAP (PPID 11) with the
/// default codec. It answers nothing by itself (not even keep-alives): the test decides.
pub struct AsapClient {
    endpoint: Endpoint,
    assoc: AssociationId,
    codec: Codec,
}

impl AsapClient {
    /// Connects to `registrar` from an address the kernel chooses and waits until the
    /// association is up.
    pub async fn connect(registrar: SocketAddr) -> Result<AsapClient, ClientError> {
        Self::connect_with(registrar, EndpointConfig::new(TransportChoice::Tcp)).await
    }

    /// Connects to `registrar` from `from` (port chosen by the kernel), e.g. another loopback
    /// address to play a second host.
    pub async fn connect_from(
        registrar: SocketAddr,
        from: IpAddr,
    ) -> Result<AsapClient, ClientError> {
        let mut config = EndpointConfig::new(TransportChoice::Tcp);
        config.local_addrs = vec![SocketAddr::new(from, 0)];
        Self::connect_with(registrar, config).await
    }

    async fn connect_with(
        registrar: SocketAddr,
        config: EndpointConfig,
    ) -> Result<AsapClient, ClientError> {
        let mut endpoint = Endpoint::bind(config).await?;
        let assoc = endpoint.handle().connect(&[registrar]).await?;
        loop {
            match endpoint.next_event().await {
                Some(Event::AssociationUp { id, .. }) if id == assoc => break,
                Some(Event::AssociationDown { reason, .. }) => {
                    return Err(ClientError::Refused(reason.to_string()))
                }
                Some(_) => {}
                None => return Err(ClientError::Closed),
            }
        }
        Ok(AsapClient {
            endpoint,
            assoc,
            codec: Codec::default(),
        })
    }

    /// Sends `m`, encoded.
    pub async fn send(&self, m: &AsapMessage) -> Result<(), ClientError> {
        self.send_raw(self.codec.encode(m)?).await
    }

    /// Sends the bytes `b` as one ASAP message, as they are (for malformed input).
    pub async fn send_raw(&self, b: Vec<u8>) -> Result<(), ClientError> {
        self.endpoint
            .handle()
            .send(self.assoc, Protocol::Asap.ppid(), 0, b)
            .await?;
        Ok(())
    }

    /// The next message, decoded, within `within`.
    pub async fn recv(&mut self, within: Duration) -> Result<AsapMessage, ClientError> {
        let until = tokio::time::Instant::now() + within;
        loop {
            match tokio::time::timeout_at(until, self.endpoint.next_event()).await {
                Ok(Some(Event::Message { data, .. })) => {
                    return Ok(self.codec.decode::<AsapMessage>(&data)?.message)
                }
                Ok(Some(Event::AssociationDown { .. })) | Ok(None) => {
                    return Err(ClientError::Closed)
                }
                Ok(Some(_)) => {}
                Err(_) => return Err(ClientError::Timeout(within)),
            }
        }
    }

    /// The next message that is not an ASAP_ENDPOINT_KEEP_ALIVE (which this client never
    /// answers), within `within` in all.
    pub async fn answer(&mut self, within: Duration) -> Result<AsapMessage, ClientError> {
        let until = tokio::time::Instant::now() + within;
        loop {
            let left = until.saturating_duration_since(tokio::time::Instant::now());
            match self.recv(left).await {
                Ok(AsapMessage::EndpointKeepAlive(_)) => continue,
                Err(ClientError::Timeout(_)) => return Err(ClientError::Timeout(within)),
                other => return other,
            }
        }
    }

    /// Whether the association is still up: nothing pending says it is down (messages pending
    /// are dropped).
    pub async fn is_up(&mut self) -> bool {
        loop {
            match tokio::time::timeout(Duration::from_millis(1), self.endpoint.next_event()).await {
                Ok(Some(Event::AssociationDown { .. })) | Ok(None) => return false,
                Ok(Some(_)) => continue,
                Err(_) => return true,
            }
        }
    }
}
