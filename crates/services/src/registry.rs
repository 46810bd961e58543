//! The services by name: default pool handles, PPIDs, RSPLIB's option names.

use std::fmt;
use std::str::FromStr;

/// One of the example services.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ServiceKind {
    /// Echo: messages back unchanged (RSPLIB's default service).
    Echo,
    /// Discard: messages dropped.
    Discard,
    /// Daytime: one line of time, then close.
    Daytime,
    /// CharGen: a stream of characters.
    CharGen,
    /// PingPong (PPID 33), state in cookies.
    PingPong,
    /// CalcApp (PPID 34), jobs with progress in cookies.
    CalcApp,
}

impl ServiceKind {
    /// Every service, in RSPLIB's order.
    pub const ALL: [ServiceKind; 6] = [
        Self::Echo,
        Self::Discard,
        Self::Daytime,
        Self::CharGen,
        Self::PingPong,
        Self::CalcApp,
    ];

    /// The name used on the command line and in configuration (`pingpong`).
    pub fn name(self) -> &'static str {
        match self {
            Self::Echo => "echo",
            Self::Discard => "discard",
            Self::Daytime => "daytime",
            Self::CharGen => "chargen",
            Self::PingPong => "pingpong",
            Self::CalcApp => "calcapp",
        }
    }

    /// RSPLIB's default pool handle for the service (`rspserver` and its clients).
    pub fn default_pool_handle(self) -> &'static str {
        match self {
            Self::Echo => "EchoPool",
            Self::Discard => "DiscardPool",
            Self::Daytime => "DaytimePool",
            Self::CharGen => "CharGenPool",
            Self::PingPong => "PingPongPool",
            Self::CalcApp => "CalcAppPool",
        }
    }

    /// The PPID the service's own messages carry: PingPong 33, CalcApp 34, Daytime and CharGen 0
    /// (as RSPLIB sends them; IANA's 40/41 are not used by RSPLIB); `None` for Echo (answers
    /// with the PPID of each request) and Discard (sends nothing).
    pub fn ppid(self) -> Option<u32> {
        match self {
            Self::Echo | Self::Discard => None,
            Self::Daytime | Self::CharGen => Some(0),
            Self::PingPong => Some(crate::PPID_PINGPONG),
            Self::CalcApp => Some(crate::PPID_CALCAPP),
        }
    }

    /// The IANA PPID registered for the service (RSPLIB itself does not use 38–41).
    pub fn iana_ppid(self) -> u32 {
        match self {
            Self::Echo => 38,
            Self::Discard => 39,
            Self::Daytime => 40,
            Self::CharGen => 41,
            Self::PingPong => crate::PPID_PINGPONG,
            Self::CalcApp => crate::PPID_CALCAPP,
        }
    }

    /// The `rspserver` option that selects the service (`-pingpong`).
    pub fn rspserver_option(self) -> &'static str {
        match self {
            Self::Echo => "-echo",
            Self::Discard => "-discard",
            Self::Daytime => "-daytime",
            Self::CharGen => "-chargen",
            Self::PingPong => "-pingpong",
            Self::CalcApp => "-calcapp",
        }
    }

    /// Whether the service keeps session state in cookies.
    pub fn uses_cookies(self) -> bool {
        matches!(self, Self::PingPong | Self::CalcApp)
    }

    /// Whether this crate has a client side for it ([`crate::ClientService`]).
    pub fn has_client(self) -> bool {
        self.uses_cookies()
    }
}

impl fmt::Display for ServiceKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A name that is not a service.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown service {0:?} (known: echo, discard, daytime, chargen, pingpong, calcapp)")]
pub struct UnknownService(pub String);

impl FromStr for ServiceKind {
    type Err = UnknownService;

    /// Accepts the names of [`ServiceKind::name`] in any case, with or without RSPLIB's dash.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let name = s.trim_start_matches('-').to_ascii_lowercase();
        Self::ALL
            .into_iter()
            .find(|k| k.name() == name)
            .ok_or_else(|| UnknownService(s.to_string()))
    }
}
