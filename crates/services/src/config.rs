//! Settings of all services in one place (a TOML table in the pool element's or pool user's
//! configuration), and the constructors that turn them into service instances.

use crate::calcapp::{CalcAppClient, CalcAppClientConfig, CalcAppServer, CalcAppServerConfig};
use crate::cookie::{CookieKey, CookieSeal, HmacSeal, KeyError, PlainSeal};
use crate::pingpong::{PingPongClient, PingPongClientConfig, PingPongServer, PingPongServerConfig};
use crate::standard::{
    CharGenConfig, CharGenServer, DaytimeConfig, DaytimeServer, DiscardServer, EchoServer,
};
use crate::{ClientService, ServerService, ServiceKind};
use serde::Deserialize;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// How PingPong and CalcApp seal their cookies (TOML table `[cookie]`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "kebab-case")]
pub struct CookieConfig {
    /// File with the pool-wide key (hex text or raw bytes, at least 16 bytes). Unset: plain
    /// RSPLIB cookies, unsigned.
    pub key_file: Option<PathBuf>,
    /// Older keys still accepted for cookies (key rotation).
    pub previous_key_files: Vec<PathBuf>,
    /// How long a signed cookie stays valid after it was issued.
    #[serde(with = "humantime_serde")]
    pub lifetime: Duration,
    /// Bind signed cookies to the pool user's identity when the session layer knows it.
    pub bind: bool,
    /// Refuse signed cookies that are not bound to an identity.
    pub require_binding: bool,
    /// Tolerated difference between the pool elements' clocks.
    #[serde(with = "humantime_serde")]
    pub clock_skew: Duration,
    /// Largest cookie accepted in a COOKIE_ECHO, in bytes.
    pub max_size: usize,
}

impl Default for CookieConfig {
    fn default() -> Self {
        Self {
            key_file: None,
            previous_key_files: Vec::new(),
            lifetime: Duration::from_secs(300),
            bind: true,
            require_binding: false,
            clock_skew: Duration::from_secs(30),
            max_size: 4096,
        }
    }
}

impl CookieConfig {
    /// The seal these settings describe (reads the key files).
    pub fn seal(&self) -> Result<Arc<dyn CookieSeal>, ConfigError> {
        let Some(path) = &self.key_file else {
            return Ok(Arc::new(PlainSeal {
                max_size: self.max_size,
            }));
        };
        let mut seal = HmacSeal::new(CookieKey::from_file(path)?, self.lifetime);
        for previous in &self.previous_key_files {
            seal = seal.accept_previous(CookieKey::from_file(previous)?);
        }
        seal.bind = self.bind;
        seal.require_binding = self.require_binding;
        seal.clock_skew = self.clock_skew;
        seal.max_size = self.max_size;
        Ok(Arc::new(seal))
    }
}

/// Settings that cannot be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// A cookie key file is unusable.
    #[error(transparent)]
    Key(#[from] KeyError),
    /// A setting is outside what it allows.
    #[error("invalid setting {key}: {reason}")]
    Invalid {
        /// The TOML key, e.g. `calcapp.max-jobs`.
        key: &'static str,
        /// What it must be.
        reason: &'static str,
    },
}

/// Settings of every service, pool-element and pool-user side (TOML: `[cookie]`, `[pingpong]`,
/// `[pingpong-client]`, `[calcapp]`, `[calcapp-client]`, `[daytime]`, `[chargen]`).
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "kebab-case")]
pub struct ServiceConfig {
    /// Cookie sealing for PingPong and CalcApp.
    pub cookie: CookieConfig,
    /// PingPong pool element.
    pub pingpong: PingPongServerConfig,
    /// PingPong pool user.
    pub pingpong_client: PingPongClientConfig,
    /// CalcApp pool element.
    pub calcapp: CalcAppServerConfig,
    /// CalcApp pool user.
    pub calcapp_client: CalcAppClientConfig,
    /// Daytime pool element.
    pub daytime: DaytimeConfig,
    /// CharGen pool element.
    pub chargen: CharGenConfig,
}

impl ServiceConfig {
    /// Checks every setting; the error names the first bad one by its TOML key.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let checks: [(bool, &'static str, &'static str); 12] = [
            (
                self.calcapp.capacity.is_finite() && self.calcapp.capacity > 0.0,
                "calcapp.capacity",
                "a positive number of calculations per second",
            ),
            (self.calcapp.max_jobs >= 1, "calcapp.max-jobs", "at least 1"),
            (
                self.calcapp.keep_alive_interval >= Duration::from_millis(100),
                "calcapp.keep-alive-interval",
                "at least 100ms",
            ),
            (
                !self.calcapp.keep_alive_timeout.is_zero(),
                "calcapp.keep-alive-timeout",
                "more than 0",
            ),
            (
                self.calcapp.cookie_max_calculations.is_finite()
                    && self.calcapp.cookie_max_calculations > 0.0,
                "calcapp.cookie-max-calculations",
                "a positive number",
            ),
            (
                (1..=usize::from(u16::MAX)).contains(&self.chargen.message_size),
                "chargen.message-size",
                "1 to 65535 bytes",
            ),
            (self.chargen.burst >= 1, "chargen.burst", "at least 1"),
            (
                !self.pingpong_client.interval.is_zero(),
                "pingpong-client.interval",
                "more than 0",
            ),
            (
                self.pingpong_client.max_outstanding >= 1,
                "pingpong-client.max-outstanding",
                "at least 1",
            ),
            (
                self.calcapp_client.job_size.is_finite() && self.calcapp_client.job_size >= 1.0,
                "calcapp-client.job-size",
                "at least 1 calculation",
            ),
            (
                !self.cookie.lifetime.is_zero(),
                "cookie.lifetime",
                "more than 0",
            ),
            (
                self.cookie.max_size >= crate::cookie::SIGNED_OVERHEAD + 20,
                "cookie.max-size",
                "at least 88 bytes (a signed CalcApp cookie)",
            ),
        ];
        match checks.into_iter().find(|c| !c.0) {
            Some((_, key, reason)) => Err(ConfigError::Invalid { key, reason }),
            None => Ok(()),
        }
    }

    /// The pool-element side of `kind`, with the cookie seal from [`CookieConfig`]; checks the
    /// settings first ([`validate`](Self::validate)).
    pub fn server(&self, kind: ServiceKind) -> Result<Box<dyn ServerService>, ConfigError> {
        self.validate()?;
        Ok(self.server_with_seal(kind, self.cookie.seal()?))
    }

    /// The pool-element side of `kind` with a given seal (shared among instances).
    pub fn server_with_seal(
        &self,
        kind: ServiceKind,
        seal: Arc<dyn CookieSeal>,
    ) -> Box<dyn ServerService> {
        match kind {
            ServiceKind::Echo => Box::new(EchoServer::new()),
            ServiceKind::Discard => Box::new(DiscardServer::new()),
            ServiceKind::Daytime => Box::new(DaytimeServer::new(self.daytime.clone())),
            ServiceKind::CharGen => Box::new(CharGenServer::new(self.chargen.clone())),
            ServiceKind::PingPong => {
                Box::new(PingPongServer::with_seal(self.pingpong.clone(), seal))
            }
            ServiceKind::CalcApp => Box::new(CalcAppServer::with_seal(self.calcapp.clone(), seal)),
        }
    }

    /// The pool-user side of `kind`; `None` for services without one (Echo, Discard, Daytime
    /// and CharGen clients are plain byte streams: `rserpool pu` with stdin/stdout).
    pub fn client(&self, kind: ServiceKind) -> Option<Box<dyn ClientService>> {
        match kind {
            ServiceKind::PingPong => {
                Some(Box::new(PingPongClient::new(self.pingpong_client.clone())))
            }
            ServiceKind::CalcApp => Some(Box::new(CalcAppClient::new(self.calcapp_client.clone()))),
            _ => None,
        }
    }
}
