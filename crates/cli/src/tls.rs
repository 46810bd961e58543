//! The TLS options every subcommand that speaks ASAP over the TCP mapping takes, spelled the same
//! everywhere (`--tls-cert --tls-key --tls-ca --tls-server-name --tls-handshake-timeout`), and
//! the registrar's identity rules (`[tls]` in its TOML file).

use anyhow::{bail, Context, Result};
use clap::Args;
use rserpool_registrar::access::{AccessRules, IdentityPattern, PoolPattern, RegistrationRule};
use rserpool_transport::TlsSettings;
use serde::Deserialize;
use std::path::PathBuf;

/// TLS on the TCP mapping (rustls; mutual authentication with certificates from PEM files).
/// Giving any of these turns TLS on; `--tls-ca` is then required. TLS runs over the TCP
/// mapping only: with `--transport auto` the TCP mapping is used, `--transport sctp` is refused.
#[derive(Args, Debug, Default, Clone)]
pub struct TlsArgs {
    /// PEM file with this side's certificate chain, leaf first (a registrar needs one; a pool
    /// element needs one to register; a pool user without one resolves only where the
    /// registrar allows it).
    #[arg(long, value_name = "PEM")]
    pub tls_cert: Option<PathBuf>,
    /// PEM file with the private key of `--tls-cert`.
    #[arg(long, value_name = "PEM")]
    pub tls_key: Option<PathBuf>,
    /// PEM file with the CA certificates to trust for peers' certificates (nothing else is
    /// trusted).
    #[arg(long, value_name = "PEM")]
    pub tls_ca: Option<PathBuf>,
    /// Name the registrar's certificate must carry (DNS name or IP address). [default: the
    /// address connected to]
    #[arg(long, value_name = "NAME")]
    pub tls_server_name: Option<String>,
    /// Longest a TLS handshake may take, e.g. `5s`, `500ms`. [default: 5s]
    #[arg(long, value_name = "DURATION")]
    pub tls_handshake_timeout: Option<String>,
}

impl TlsArgs {
    /// Whether any TLS option was given.
    pub fn given(&self) -> bool {
        self.tls_cert.is_some()
            || self.tls_key.is_some()
            || self.tls_ca.is_some()
            || self.tls_server_name.is_some()
            || self.tls_handshake_timeout.is_some()
    }

    /// The transport settings these options describe; `None` when none was given. Errors name
    /// the option.
    pub fn settings(&self) -> Result<Option<TlsSettings>> {
        if !self.given() {
            return Ok(None);
        }
        let Some(ca) = &self.tls_ca else {
            bail!("--tls-ca: required with TLS (the CA certificates that sign the peers' certificates)");
        };
        let mut s = TlsSettings::new(ca);
        match (&self.tls_cert, &self.tls_key) {
            (Some(c), Some(k)) => s = s.with_identity(c, k),
            (None, None) => {}
            (Some(_), None) => bail!("--tls-key: required with --tls-cert"),
            (None, Some(_)) => bail!("--tls-cert: required with --tls-key"),
        }
        s.server_name = self.tls_server_name.clone();
        if let Some(t) = &self.tls_handshake_timeout {
            s.handshake_timeout = crate::units::positive_duration("--tls-handshake-timeout", t)?;
        }
        Ok(Some(s))
    }
}

/// The registrar's own TLS options beside [`TlsArgs`]: client certificates and identity
/// rules.
#[derive(Args, Debug, Default, Clone)]
pub struct RegistrarTlsArgs {
    /// Refuse clients without a certificate during the handshake (pool users included).
    /// [default: off: they connect, and the identity rules decide what they may do]
    #[arg(long, value_name = "BOOL")]
    pub tls_require_client_cert: Option<bool>,
    /// Which certificate identities may register into which pools, as
    /// `IDENTITY=POOL[,POOL...]` with globs (`*`, `?`) and an optional `cn:`, `dns:` or `uri:`
    /// prefix on the identity, e.g. `dns:*.echo.example.net=EchoPool`. Repeat for more rules.
    /// [default: `*=*`: any certified identity, any pool]
    #[arg(long, value_name = "IDENTITY=POOLS")]
    pub tls_register: Vec<String>,
    /// Identity (glob, optional `cn:`/`dns:`/`uri:` prefix) allowed to peer over ENRP. Repeat
    /// for more. [default: `*`: any certified identity]
    #[arg(long, value_name = "IDENTITY")]
    pub tls_enrp_peer: Vec<String>,
    /// Whether pool users without a certificate may resolve handles (and report unreachable
    /// PEs). [default: true]
    #[arg(long, value_name = "BOOL")]
    pub tls_unauthenticated_resolve: Option<bool>,
}

/// The `[tls]` table of the registrar's TOML file.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct TlsFile {
    cert: Option<PathBuf>,
    key: Option<PathBuf>,
    ca: Option<PathBuf>,
    server_name: Option<String>,
    handshake_timeout: Option<String>,
    require_client_cert: Option<bool>,
    unauthenticated_resolve: Option<bool>,
    enrp_peers: Option<Vec<String>>,
    register: Option<Vec<RegisterEntry>>,
}

/// One `[[tls.register]]` entry.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct RegisterEntry {
    identity: String,
    pools: Vec<String>,
}

/// The registrar's TLS: transport settings and identity rules, from flags over the file.
pub fn registrar_tls(
    flags: &TlsArgs,
    rules: &RegistrarTlsArgs,
    file: Option<TlsFile>,
) -> Result<Option<(TlsSettings, AccessRules)>> {
    let file = file.unwrap_or_default();
    let merged = TlsArgs {
        tls_cert: flags.tls_cert.clone().or(file.cert),
        tls_key: flags.tls_key.clone().or(file.key),
        tls_ca: flags.tls_ca.clone().or(file.ca),
        tls_server_name: flags.tls_server_name.clone().or(file.server_name),
        tls_handshake_timeout: flags
            .tls_handshake_timeout
            .clone()
            .or(file.handshake_timeout),
    };
    let rules_given = rules.tls_require_client_cert.is_some()
        || !rules.tls_register.is_empty()
        || !rules.tls_enrp_peer.is_empty()
        || rules.tls_unauthenticated_resolve.is_some()
        || file.require_client_cert.is_some()
        || file.unauthenticated_resolve.is_some()
        || file.enrp_peers.is_some()
        || file.register.is_some();
    let Some(mut settings) = merged.settings()? else {
        if rules_given {
            bail!("TLS identity rules are set but TLS is not: give --tls-cert, --tls-key and --tls-ca (or cert, key and ca in [tls])");
        }
        return Ok(None);
    };
    if settings.certificate_chain.is_none() {
        bail!("--tls-cert and --tls-key: a registrar with TLS needs its own certificate and key");
    }
    settings.require_client_certificate = rules
        .tls_require_client_cert
        .or(file.require_client_cert)
        .unwrap_or(false);
    let mut access = AccessRules::default();
    if !rules.tls_register.is_empty() {
        access.registration = rules
            .tls_register
            .iter()
            .map(|r| RegistrationRule::parse(r).with_context(|| "--tls-register".to_string()))
            .collect::<Result<_>>()?;
    } else if let Some(entries) = file.register {
        access.registration = entries
            .into_iter()
            .map(|e| {
                Ok(RegistrationRule {
                    identity: IdentityPattern::parse(&e.identity)?,
                    pools: e
                        .pools
                        .iter()
                        .map(|p| PoolPattern::parse(p))
                        .collect::<Result<_, _>>()?,
                })
            })
            .collect::<Result<_, rserpool_registrar::access::PatternError>>()
            .context("[[tls.register]]")?;
    }
    let peers = if !rules.tls_enrp_peer.is_empty() {
        Some((rules.tls_enrp_peer.clone(), "--tls-enrp-peer"))
    } else {
        file.enrp_peers.map(|p| (p, "tls.enrp-peers"))
    };
    if let Some((peers, what)) = peers {
        access.enrp_peers = peers
            .iter()
            .map(|p| IdentityPattern::parse(p))
            .collect::<Result<_, _>>()
            .context(what)?;
    }
    if let Some(u) = rules
        .tls_unauthenticated_resolve
        .or(file.unauthenticated_resolve)
    {
        access.unauthenticated_resolution = u;
    }
    Ok(Some((settings, access)))
}
