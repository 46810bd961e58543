//! TLS on the TCP mapping (RFC 5352 §5 / RFC 5353 §9 / RFC 5355: mutual authentication between
//! PE and registrar and between registrars), built on rustls with the *ring* provider.
//!
//! An endpoint carries [`TlsSettings`] in its [`EndpointConfig`](crate::EndpointConfig); every TCP
//! association it accepts or starts (mapped or plain ASAP) then runs inside TLS, and the peer's
//! certificate identity ([`PeerIdentity`]) is reported with
//! [`Event::AssociationUp`](crate::Event::AssociationUp). A handshake that fails or times out closes that one
//! connection, is counted ([`EndpointStats`](crate::EndpointStats)) and logged with the peer's
//! address and the reason; other associations are not held up (each handshake runs in the
//! connection's own task, bounded by [`TlsSettings::handshake_timeout`]).
//!
//! Kernel SCTP is not wrapped: an endpoint refuses to start with TLS over SCTP
//! ([`TlsError::OverSctp`]); docs/security.md explains why and what to use instead.

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// Default bound on one TLS handshake.
pub const DEFAULT_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);

/// What an endpoint needs for TLS: its own certificate (optional for a client that does not
/// authenticate itself), the CA certificates it trusts, the name it expects in a server's
/// certificate, a bound on the handshake, and whether clients must present a certificate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsSettings {
    /// PEM file with this endpoint's certificate chain, leaf first. Required to accept
    /// associations; a client without one connects unauthenticated.
    pub certificate_chain: Option<PathBuf>,
    /// PEM file with the private key of the leaf certificate (PKCS#8, PKCS#1 or SEC1).
    pub private_key: Option<PathBuf>,
    /// PEM file with the CA certificates trusted to sign peers' certificates (servers' and
    /// clients' alike). Nothing else is trusted: there are no system roots.
    pub ca: PathBuf,
    /// The name a server's certificate must carry (a DNS name or an IP address). `None`: the
    /// IP address connected to.
    pub server_name: Option<String>,
    /// Longest a handshake may take; the connection is dropped (and counted) after it.
    pub handshake_timeout: Duration,
    /// Whether a client without a certificate is refused during the handshake. Off, a client
    /// may connect without one (and is reported with no [`PeerIdentity`]); a certificate that
    /// is presented is verified either way.
    pub require_client_certificate: bool,
}

impl TlsSettings {
    /// Settings that trust the CAs in `ca`, with no own certificate, the default handshake
    /// timeout and client certificates required.
    pub fn new(ca: impl Into<PathBuf>) -> Self {
        TlsSettings {
            certificate_chain: None,
            private_key: None,
            ca: ca.into(),
            server_name: None,
            handshake_timeout: DEFAULT_HANDSHAKE_TIMEOUT,
            require_client_certificate: true,
        }
    }

    /// The same settings with this endpoint's certificate chain and key.
    pub fn with_identity(
        mut self,
        certificate_chain: impl Into<PathBuf>,
        private_key: impl Into<PathBuf>,
    ) -> Self {
        self.certificate_chain = Some(certificate_chain.into());
        self.private_key = Some(private_key.into());
        self
    }

    /// Reads the files and builds the rustls configurations; errors name the file and what
    /// was wrong with it.
    pub(crate) fn load(&self) -> Result<TlsContext, TlsError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut roots = RootCertStore::empty();
        let ca = read_certificates(&self.ca)?;
        for c in ca {
            roots.add(c).map_err(|e| TlsError::Certificate {
                path: self.ca.clone(),
                reason: e.to_string(),
            })?;
        }
        let roots = Arc::new(roots);
        let own = match (&self.certificate_chain, &self.private_key) {
            (Some(c), Some(k)) => Some((read_certificates(c)?, read_key(k)?, c.clone())),
            (None, None) => None,
            (Some(_), None) => return Err(TlsError::Incomplete("a certificate without its key")),
            (None, Some(_)) => return Err(TlsError::Incomplete("a key without its certificate")),
        };
        let server_name = match &self.server_name {
            Some(n) => {
                Some(ServerName::try_from(n.clone()).map_err(|_| TlsError::ServerName(n.clone()))?)
            }
            None => None,
        };
        let rustls_err = |what: &'static str| {
            move |e: rustls::Error| TlsError::Config {
                what,
                reason: e.to_string(),
            }
        };
        let client = ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(rustls_err("client protocol versions"))?
            .with_root_certificates(roots.clone());
        let client = match &own {
            Some((chain, key, _)) => client
                .with_client_auth_cert(chain.clone(), key.clone_key())
                .map_err(rustls_err("client certificate and key"))?,
            None => client.with_no_client_auth(),
        };
        let server = match own {
            Some((chain, key, path)) => {
                let verifier =
                    WebPkiClientVerifier::builder_with_provider(roots.clone(), provider.clone());
                let verifier = if self.require_client_certificate {
                    verifier
                } else {
                    verifier.allow_unauthenticated()
                };
                let verifier = verifier.build().map_err(|e| TlsError::Certificate {
                    path: self.ca.clone(),
                    reason: e.to_string(),
                })?;
                let server = ServerConfig::builder_with_provider(provider)
                    .with_safe_default_protocol_versions()
                    .map_err(rustls_err("server protocol versions"))?
                    .with_client_cert_verifier(verifier)
                    .with_single_cert(chain, key)
                    .map_err(|e| TlsError::Certificate {
                        path,
                        reason: e.to_string(),
                    })?;
                Some(tokio_rustls::TlsAcceptor::from(Arc::new(server)))
            }
            None => None,
        };
        Ok(TlsContext {
            acceptor: server,
            connector: tokio_rustls::TlsConnector::from(Arc::new(client)),
            server_name,
            handshake_timeout: self.handshake_timeout,
        })
    }
}

fn read_certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let pem_err = |e: rustls::pki_types::pem::Error| TlsError::Pem {
        path: path.to_path_buf(),
        reason: e.to_string(),
    };
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(pem_err)?
        .collect::<Result<Vec<_>, _>>()
        .map_err(pem_err)?;
    if certs.is_empty() {
        return Err(TlsError::Pem {
            path: path.to_path_buf(),
            reason: "no CERTIFICATE block".into(),
        });
    }
    Ok(certs)
}

fn read_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    PrivateKeyDer::from_pem_file(path).map_err(|e| TlsError::Pem {
        path: path.to_path_buf(),
        reason: match e {
            rustls::pki_types::pem::Error::NoItemsFound => "no PRIVATE KEY block".into(),
            e => e.to_string(),
        },
    })
}

/// The loaded form of [`TlsSettings`], shared by every connection of an endpoint.
#[derive(Clone)]
pub(crate) struct TlsContext {
    /// For inbound connections; `None` without an own certificate.
    pub acceptor: Option<tokio_rustls::TlsAcceptor>,
    pub connector: tokio_rustls::TlsConnector,
    pub server_name: Option<ServerName<'static>>,
    pub handshake_timeout: Duration,
}

impl fmt::Debug for TlsContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsContext")
            .field("accepts", &self.acceptor.is_some())
            .field("server_name", &self.server_name)
            .field("handshake_timeout", &self.handshake_timeout)
            .finish_non_exhaustive()
    }
}

/// TLS settings that cannot be used. Each names the file or setting at fault.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TlsError {
    /// A PEM file could not be read or holds nothing usable.
    #[error("TLS: {}: {reason}", path.display())]
    Pem {
        /// The file.
        path: PathBuf,
        /// What was wrong.
        reason: String,
    },
    /// A certificate (or a key with it) was refused by rustls.
    #[error("TLS: {}: {reason}", path.display())]
    Certificate {
        /// The file.
        path: PathBuf,
        /// What was wrong.
        reason: String,
    },
    /// Only one of certificate and key was given.
    #[error("TLS: {0} (give both --tls-cert and --tls-key, or neither)")]
    Incomplete(&'static str),
    /// An endpoint that accepts associations has no certificate of its own.
    #[error("TLS: a listening endpoint needs its own certificate and key (--tls-cert, --tls-key)")]
    ListenerWithoutCertificate,
    /// The expected server name is neither a DNS name nor an IP address.
    #[error("TLS: server name {0:?} is neither a DNS name nor an IP address")]
    ServerName(String),
    /// rustls refused the combination of settings.
    #[error("TLS: {what}: {reason}")]
    Config {
        /// Which part.
        what: &'static str,
        /// rustls's reason.
        reason: String,
    },
    /// TLS was asked for over kernel SCTP, which this implementation does not offer.
    #[error(
        "TLS over kernel SCTP is not supported: rustls has no DTLS (RFC 6083) and RFC 3436 TLS \
         over one SCTP stream would lose the PPID multiplexing of ASAP and session data; use the \
         TCP mapping with TLS (--transport tcp) for an authenticated, encrypted association"
    )]
    OverSctp,
}

pub use rserpool_wire::PeerIdentity;

/// Reads the names of a DER-encoded certificate into a [`PeerIdentity`]. A certificate rustls
/// accepted always parses; `None` only for bytes that are not a certificate.
pub fn peer_identity_from_der(der: &[u8]) -> Option<PeerIdentity> {
    use x509_parser::extensions::GeneralName;
    let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
    let common_names = cert
        .subject()
        .iter_common_name()
        .filter_map(|a| a.as_str().ok().map(str::to_owned))
        .collect();
    let mut dns_names = Vec::new();
    let mut uris = Vec::new();
    if let Ok(Some(san)) = cert.subject_alternative_name() {
        for n in &san.value.general_names {
            match n {
                GeneralName::DNSName(d) => dns_names.push((*d).to_owned()),
                GeneralName::URI(u) => uris.push((*u).to_owned()),
                _ => {}
            }
        }
    }
    let digest = ring::digest::digest(&ring::digest::SHA256, der);
    let mut fingerprint = [0u8; 32];
    fingerprint.copy_from_slice(digest.as_ref());
    Some(PeerIdentity {
        common_names,
        dns_names,
        uris,
        fingerprint,
    })
}

/// The identity in the first certificate of a verified chain.
pub(crate) fn identity_of(certs: Option<&[CertificateDer<'_>]>) -> Option<Arc<PeerIdentity>> {
    let leaf = certs?.first()?;
    peer_identity_from_der(leaf.as_ref()).map(Arc::new)
}

/// A rustls error inside an I/O error (how tokio-rustls reports TLS failures), as text.
pub(crate) fn tls_reason(e: &std::io::Error) -> Option<String> {
    e.get_ref()
        .and_then(|inner| inner.downcast_ref::<rustls::Error>())
        .map(|r| r.to_string())
}
