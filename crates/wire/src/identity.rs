//! Who the peer of an association proved to be. The transport fills it in from a verified TLS
//! certificate; the registrar's access rules match its names. Plain data, so that cores that
//! check identities compile without the TLS stack.

use std::fmt;

/// Who the peer of an association proved to be: the names in the leaf certificate it presented
/// and verified against the trusted CAs. Rules (which identities may register into which pools,
/// which may peer over ENRP) match these names.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PeerIdentity {
    /// Common names (CN) of the certificate's subject.
    pub common_names: Vec<String>,
    /// DNS names of the subject alternative name extension.
    pub dns_names: Vec<String>,
    /// URIs of the subject alternative name extension (e.g. SPIFFE ids).
    pub uris: Vec<String>,
    /// SHA-256 of the leaf certificate (DER), for logs and pinning.
    pub fingerprint: [u8; 32],
}

impl PeerIdentity {
    /// Every name, tagged with its kind: `("cn", …)`, `("dns", …)`, `("uri", …)`.
    pub fn names(&self) -> impl Iterator<Item = (&'static str, &str)> {
        self.common_names
            .iter()
            .map(|n| ("cn", n.as_str()))
            .chain(self.dns_names.iter().map(|n| ("dns", n.as_str())))
            .chain(self.uris.iter().map(|n| ("uri", n.as_str())))
    }
}

impl fmt::Display for PeerIdentity {
    /// `cn:pe1 dns:pe1.example.net sha256:0a1b2c3d…`: every name, then the start of the
    /// fingerprint.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (kind, name) in self.names() {
            write!(f, "{kind}:{} ", name.escape_debug())?;
        }
        f.write_str("sha256:")?;
        for b in &self.fingerprint[..8] {
            write!(f, "{b:02x}")?;
        }
        f.write_str("…")
    }
}
