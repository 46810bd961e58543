//! Certificates made in the test: a CA and leaf certificates with chosen names, written as PEM
//! files into a temporary directory that lives as long as the [`Pki`].
#![allow(dead_code)]

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose, SanType,
};
use rserpool_transport::TlsSettings;
use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

/// A certificate authority and the directory its files are written to.
pub struct Pki {
    pub dir: tempfile::TempDir,
    issuer: CertifiedIssuer<'static, KeyPair>,
    /// The CA certificate (PEM), to trust.
    pub ca: PathBuf,
}

/// The names a leaf certificate carries.
#[derive(Default, Clone)]
pub struct Names<'a> {
    pub cn: &'a str,
    pub dns: &'a [&'a str],
    pub uris: &'a [&'a str],
    pub ips: &'a [IpAddr],
}

impl Pki {
    /// A new CA named `name`.
    pub fn new(name: &str) -> Pki {
        let dir = tempfile::tempdir().expect("temporary directory");
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let issuer = CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap();
        let ca = dir.path().join(format!("{name}-ca.pem"));
        std::fs::write(&ca, issuer.pem()).unwrap();
        Pki { dir, issuer, ca }
    }

    /// Issues a leaf certificate (client and server use) and writes `stem.pem` and
    /// `stem.key`; returns their paths.
    pub fn issue(&self, stem: &str, names: Names<'_>) -> (PathBuf, PathBuf) {
        let mut params =
            CertificateParams::new(names.dns.iter().map(|s| s.to_string()).collect::<Vec<_>>())
                .unwrap();
        if !names.cn.is_empty() {
            params.distinguished_name.push(DnType::CommonName, names.cn);
        }
        for u in names.uris {
            params
                .subject_alt_names
                .push(SanType::URI((*u).try_into().unwrap()));
        }
        for ip in names.ips {
            params.subject_alt_names.push(SanType::IpAddress(*ip));
        }
        params.use_authority_key_identifier_extension = true;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        let cert_path = self.dir.path().join(format!("{stem}.pem"));
        let key_path = self.dir.path().join(format!("{stem}.key"));
        std::fs::write(&cert_path, cert.pem()).unwrap();
        std::fs::write(&key_path, key.serialize_pem()).unwrap();
        (cert_path, key_path)
    }

    /// TLS settings that trust this CA and present a fresh certificate with `names`.
    pub fn settings(&self, stem: &str, names: Names<'_>) -> TlsSettings {
        let (c, k) = self.issue(stem, names);
        self.anonymous().with_identity(c, k)
    }

    /// TLS settings that trust this CA and present no certificate.
    pub fn anonymous(&self) -> TlsSettings {
        let mut s = TlsSettings::new(&self.ca);
        // Generous: loaded CI machines.
        s.handshake_timeout = Duration::from_secs(20);
        s
    }
}

/// A registrar-like server certificate for 127.0.0.1 and `registrar.test`.
pub fn server_names() -> Names<'static> {
    const IPS: &[IpAddr] = &[IpAddr::V4(std::net::Ipv4Addr::LOCALHOST)];
    Names {
        cn: "registrar",
        dns: &["registrar.test"],
        uris: &[],
        ips: IPS,
    }
}
