//! Who may do what, by TLS certificate identity (RFC 5355 §3: registration spoofing,
//! unauthorised registration, malicious ENRP servers; DESIGN principle 9).
//!
//! A registrar with TLS knows, per association, the identity its peer proved
//! ([`PeerIdentity`]: subject common names, DNS and URI subject alternative names) or that the
//! peer presented no certificate. [`AccessRules`] decide:
//!
//! - which identities may register PEs into which pool handles ([`RegistrationRule`]); the same
//!   rule covers deregistration;
//! - which identities may peer over ENRP ([`AccessRules::may_peer`]);
//! - whether pool users without a certificate may resolve handles (and report unreachable PEs).
//!
//! Patterns ([`IdentityPattern`], [`PoolPattern`]) are globs: `*` matches any run of
//! characters (dots included), `?` one character. An identity pattern may name the kind of name
//! it matches, `cn:`, `dns:` or `uri:`; without a prefix it matches any of the certificate's
//! names. DNS names and common names compare without regard to ASCII case; URIs and pool handles
//! compare exactly.

use rserpool_wire::PeerIdentity;
use std::fmt;

/// A glob over certificate names, optionally limited to one kind of name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdentityPattern {
    kind: Option<NameKind>,
    glob: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum NameKind {
    Cn,
    Dns,
    Uri,
}

impl NameKind {
    fn tag(self) -> &'static str {
        match self {
            NameKind::Cn => "cn",
            NameKind::Dns => "dns",
            NameKind::Uri => "uri",
        }
    }
}

/// A pattern that is not usable; the text says why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("pattern {pattern:?}: {reason}")]
pub struct PatternError {
    /// The pattern as given.
    pub pattern: String,
    /// What is wrong with it.
    pub reason: &'static str,
}

impl IdentityPattern {
    /// Parses `[cn:|dns:|uri:]GLOB`.
    pub fn parse(s: &str) -> Result<Self, PatternError> {
        let err = |reason| PatternError {
            pattern: s.to_owned(),
            reason,
        };
        let (kind, glob) = match s.split_once(':') {
            Some(("cn", g)) => (Some(NameKind::Cn), g),
            Some(("dns", g)) => (Some(NameKind::Dns), g),
            Some(("uri", g)) => (Some(NameKind::Uri), g),
            _ => (None, s),
        };
        if glob.is_empty() {
            return Err(err("empty (use * to match any identity)"));
        }
        Ok(IdentityPattern {
            kind,
            glob: glob.to_owned(),
        })
    }

    /// Whether any name of `identity` of the pattern's kind matches.
    pub fn matches(&self, identity: &PeerIdentity) -> bool {
        identity.names().any(|(tag, name)| {
            let kind_ok = self.kind.is_none_or(|k| k.tag() == tag);
            kind_ok
                && if tag == "uri" {
                    glob(self.glob.as_bytes(), name.as_bytes(), false)
                } else {
                    glob(self.glob.as_bytes(), name.as_bytes(), true)
                }
        })
    }
}

impl fmt::Display for IdentityPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(k) = self.kind {
            write!(f, "{}:", k.tag())?;
        }
        f.write_str(&self.glob)
    }
}

/// A glob over pool handles (compared byte for byte).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolPattern(Vec<u8>);

impl PoolPattern {
    /// Parses a glob; the empty pattern is refused.
    pub fn parse(s: &str) -> Result<Self, PatternError> {
        if s.is_empty() {
            return Err(PatternError {
                pattern: String::new(),
                reason: "empty (use * to match any pool handle)",
            });
        }
        Ok(PoolPattern(s.as_bytes().to_vec()))
    }

    /// Whether the pool handle matches.
    pub fn matches(&self, pool_handle: &[u8]) -> bool {
        glob(&self.0, pool_handle, false)
    }
}

impl fmt::Display for PoolPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&String::from_utf8_lossy(&self.0))
    }
}

/// Identities matching `identity` may register into pools matching any of `pools`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegistrationRule {
    /// Whose registrations the rule allows.
    pub identity: IdentityPattern,
    /// Into which pools.
    pub pools: Vec<PoolPattern>,
}

impl RegistrationRule {
    /// Parses `IDENTITY=POOL[,POOL...]`, the command-line form.
    pub fn parse(s: &str) -> Result<Self, PatternError> {
        let (identity, pools) = s.split_once('=').ok_or(PatternError {
            pattern: s.to_owned(),
            reason: "expected IDENTITY=POOL[,POOL...]",
        })?;
        Ok(RegistrationRule {
            identity: IdentityPattern::parse(identity)?,
            pools: pools
                .split(',')
                .map(PoolPattern::parse)
                .collect::<Result<_, _>>()?,
        })
    }
}

/// Why a request was refused by the [`AccessRules`]; each is counted separately.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AccessRefusal {
    /// A (de)registration over an association without a certificate.
    RegistrationWithoutIdentity,
    /// A (de)registration by an identity no rule allows for that pool.
    PoolNotAllowed,
    /// A handle resolution (or unreachable report) without a certificate, where
    /// [`AccessRules::unauthenticated_resolution`] is off.
    ResolutionWithoutIdentity,
    /// An ENRP peer without a certificate.
    PeerWithoutIdentity,
    /// An ENRP peer whose identity no pattern of [`AccessRules::enrp_peers`] matches.
    PeerNotAllowed,
}

impl AccessRefusal {
    /// All refusals, in the order the metrics list them.
    pub const ALL: [AccessRefusal; 5] = [
        AccessRefusal::RegistrationWithoutIdentity,
        AccessRefusal::PoolNotAllowed,
        AccessRefusal::ResolutionWithoutIdentity,
        AccessRefusal::PeerWithoutIdentity,
        AccessRefusal::PeerNotAllowed,
    ];

    /// Metric label, e.g. `pool_not_allowed`.
    pub fn label(self) -> &'static str {
        match self {
            AccessRefusal::RegistrationWithoutIdentity => "registration_without_identity",
            AccessRefusal::PoolNotAllowed => "pool_not_allowed",
            AccessRefusal::ResolutionWithoutIdentity => "resolution_without_identity",
            AccessRefusal::PeerWithoutIdentity => "enrp_peer_without_identity",
            AccessRefusal::PeerNotAllowed => "enrp_peer_not_allowed",
        }
    }
}

impl fmt::Display for AccessRefusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            AccessRefusal::RegistrationWithoutIdentity => {
                "registration needs a TLS client certificate"
            }
            AccessRefusal::PoolNotAllowed => "identity not allowed to register into this pool",
            AccessRefusal::ResolutionWithoutIdentity => {
                "handle resolution needs a TLS client certificate"
            }
            AccessRefusal::PeerWithoutIdentity => "ENRP peering needs a TLS certificate",
            AccessRefusal::PeerNotAllowed => "identity not allowed to peer over ENRP",
        })
    }
}

/// The registrar's identity rules. Without them (`RegistrarConfig::access` `None`, a
/// registrar without TLS) nothing is checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AccessRules {
    /// Which identities may register into which pools; a registration needs one matching rule.
    /// Empty: no registration is allowed.
    pub registration: Vec<RegistrationRule>,
    /// Identities allowed as ENRP peers; empty: none.
    pub enrp_peers: Vec<IdentityPattern>,
    /// Whether pool users without a certificate may resolve handles and report unreachable PEs.
    pub unauthenticated_resolution: bool,
}

impl Default for AccessRules {
    /// Any identity the trusted CAs certified may register into any pool and peer over ENRP;
    /// pool users without a certificate may resolve. A PE without a certificate cannot
    /// register.
    fn default() -> Self {
        AccessRules {
            registration: vec![RegistrationRule {
                identity: IdentityPattern::parse("*").expect("valid"),
                pools: vec![PoolPattern::parse("*").expect("valid")],
            }],
            enrp_peers: vec![IdentityPattern::parse("*").expect("valid")],
            unauthenticated_resolution: true,
        }
    }
}

impl AccessRules {
    /// Whether the peer may register (or deregister) PEs in `pool_handle`.
    pub fn may_register(
        &self,
        identity: Option<&PeerIdentity>,
        pool_handle: &[u8],
    ) -> Result<(), AccessRefusal> {
        let identity = identity.ok_or(AccessRefusal::RegistrationWithoutIdentity)?;
        let allowed = self.registration.iter().any(|r| {
            r.identity.matches(identity) && r.pools.iter().any(|p| p.matches(pool_handle))
        });
        allowed.then_some(()).ok_or(AccessRefusal::PoolNotAllowed)
    }

    /// Whether the peer may resolve handles (and report unreachable PEs).
    pub fn may_resolve(&self, identity: Option<&PeerIdentity>) -> Result<(), AccessRefusal> {
        if identity.is_some() || self.unauthenticated_resolution {
            Ok(())
        } else {
            Err(AccessRefusal::ResolutionWithoutIdentity)
        }
    }

    /// Whether a registrar with this identity may peer over ENRP (RFC 5353 §9, RFC 5355 §3.4
    /// "malicious ENRP server joins the group"). The ENRP driver calls it when a peer's
    /// association comes up, before any of its messages is taken, and closes the association
    /// on a refusal.
    pub fn may_peer(&self, identity: Option<&PeerIdentity>) -> Result<(), AccessRefusal> {
        let identity = identity.ok_or(AccessRefusal::PeerWithoutIdentity)?;
        self.enrp_peers
            .iter()
            .any(|p| p.matches(identity))
            .then_some(())
            .ok_or(AccessRefusal::PeerNotAllowed)
    }
}

/// Glob match: `*` any run, `?` one byte; `fold` compares ASCII case-insensitively.
/// Iterative with one backtrack point, so it is linear in practice and never recursive.
fn glob(pattern: &[u8], text: &[u8], fold: bool) -> bool {
    let eq = |a: u8, b: u8| {
        if fold {
            a.eq_ignore_ascii_case(&b)
        } else {
            a == b
        }
    };
    let (mut p, mut t) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while t < text.len() {
        if p < pattern.len() && (pattern[p] == b'?' || eq(pattern[p], text[t])) {
            p += 1;
            t += 1;
        } else if p < pattern.len() && pattern[p] == b'*' {
            star = Some((p, t));
            p += 1;
        } else if let Some((sp, st)) = star {
            p = sp + 1;
            t = st + 1;
            star = Some((sp, st + 1));
        } else {
            return false;
        }
    }
    pattern[p..].iter().all(|&c| c == b'*')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(cn: &[&str], dns: &[&str], uris: &[&str]) -> PeerIdentity {
        let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect();
        PeerIdentity {
            common_names: s(cn),
            dns_names: s(dns),
            uris: s(uris),
            fingerprint: [0; 32],
        }
    }

    #[test]
    fn globs() {
        assert!(glob(b"*", b"", false));
        assert!(glob(b"*", b"anything", false));
        assert!(glob(b"pe-*.example.net", b"pe-12.example.net", false));
        assert!(glob(b"pe-*.example.net", b"pe-.example.net", false));
        assert!(!glob(b"pe-*.example.net", b"pe-1.example.org", false));
        assert!(glob(b"a?c", b"abc", false));
        assert!(!glob(b"a?c", b"ac", false));
        assert!(glob(b"*a*b*c*", b"xxaxxbxxcxx", false));
        assert!(!glob(b"*a*b*c", b"xxaxxbxxcxx", false));
        assert!(glob(b"Echo*", b"EchoPool", false));
        assert!(!glob(b"echo*", b"EchoPool", false));
        assert!(glob(b"echo*", b"EchoPool", true));
        // No catastrophic backtracking on hostile input.
        let text = vec![b'a'; 10_000];
        assert!(!glob(b"*a*a*a*a*a*b", &text, false));
    }

    #[test]
    fn identity_patterns_match_by_kind() {
        let pe = id(&["pe-1"], &["pe-1.pool.test"], &["spiffe://pool.test/pe/1"]);
        let m = |p: &str| IdentityPattern::parse(p).unwrap().matches(&pe);
        assert!(m("*"));
        assert!(m("pe-1"));
        assert!(m("PE-1.POOL.TEST"), "DNS names ignore case");
        assert!(m("cn:pe-*"));
        assert!(!m("cn:*.pool.test"), "the CN is not a DNS name");
        assert!(m("dns:*.pool.test"));
        assert!(m("uri:spiffe://pool.test/pe/*"));
        assert!(!m("uri:SPIFFE://pool.test/pe/*"), "URIs compare exactly");
        assert!(!m("pe-2"));
        assert!(IdentityPattern::parse("dns:").is_err());
        assert_eq!(
            IdentityPattern::parse("dns:*.x").unwrap().to_string(),
            "dns:*.x"
        );
        // An unknown prefix is part of the glob (a URI pattern without the uri: prefix).
        assert!(m("spiffe://pool.test/*"));
    }

    #[test]
    fn registration_rules() {
        let rules = AccessRules {
            registration: vec![
                RegistrationRule::parse("dns:*.echo.test=EchoPool").unwrap(),
                RegistrationRule::parse("cn:calc-*=Calc*,Shared").unwrap(),
            ],
            enrp_peers: vec![],
            unauthenticated_resolution: false,
        };
        let echo = id(&["e1"], &["e1.echo.test"], &[]);
        let calc = id(&["calc-7"], &[], &[]);
        assert_eq!(rules.may_register(Some(&echo), b"EchoPool"), Ok(()));
        assert_eq!(
            rules.may_register(Some(&echo), b"CalcAppPool"),
            Err(AccessRefusal::PoolNotAllowed)
        );
        assert_eq!(rules.may_register(Some(&calc), b"CalcAppPool"), Ok(()));
        assert_eq!(rules.may_register(Some(&calc), b"Shared"), Ok(()));
        assert_eq!(
            rules.may_register(Some(&calc), b"SharedX"),
            Err(AccessRefusal::PoolNotAllowed)
        );
        assert_eq!(
            rules.may_register(None, b"EchoPool"),
            Err(AccessRefusal::RegistrationWithoutIdentity)
        );
        assert_eq!(
            rules.may_resolve(None),
            Err(AccessRefusal::ResolutionWithoutIdentity)
        );
        assert_eq!(rules.may_resolve(Some(&echo)), Ok(()));
        assert!(RegistrationRule::parse("no-equals-sign").is_err());
        assert!(RegistrationRule::parse("pe=").is_err());
        assert!(RegistrationRule::parse("=Pool").is_err());
    }

    #[test]
    fn enrp_peering() {
        let rules = AccessRules {
            enrp_peers: vec![
                IdentityPattern::parse("dns:registrar-*.example.net").unwrap(),
                IdentityPattern::parse("uri:spiffe://example.net/registrar/*").unwrap(),
            ],
            ..AccessRules::default()
        };
        let r1 = id(&["r1"], &["registrar-1.example.net"], &[]);
        let r2 = id(&[], &[], &["spiffe://example.net/registrar/2"]);
        let pe = id(&["registrar-3.example.net"], &["pe.example.net"], &[]);
        assert_eq!(rules.may_peer(Some(&r1)), Ok(()));
        assert_eq!(rules.may_peer(Some(&r2)), Ok(()));
        assert_eq!(
            rules.may_peer(Some(&pe)),
            Err(AccessRefusal::PeerNotAllowed),
            "a CN that looks like a registrar's DNS name is not a DNS name"
        );
        assert_eq!(
            rules.may_peer(None),
            Err(AccessRefusal::PeerWithoutIdentity)
        );
        let closed = AccessRules {
            enrp_peers: vec![],
            ..AccessRules::default()
        };
        assert_eq!(
            closed.may_peer(Some(&r1)),
            Err(AccessRefusal::PeerNotAllowed)
        );
    }

    #[test]
    fn defaults_need_a_certificate_to_register_only() {
        let rules = AccessRules::default();
        let any = id(&["whoever"], &[], &[]);
        assert_eq!(rules.may_register(Some(&any), b"AnyPool"), Ok(()));
        assert_eq!(
            rules.may_register(None, b"AnyPool"),
            Err(AccessRefusal::RegistrationWithoutIdentity)
        );
        assert_eq!(rules.may_resolve(None), Ok(()));
        assert_eq!(rules.may_peer(Some(&any)), Ok(()));
        assert_eq!(
            rules.may_peer(None),
            Err(AccessRefusal::PeerWithoutIdentity)
        );
    }
}
