//! Values given the same way in every command and configuration file (docs/configuration.md):
//! durations with units, e.g. "5s", "250ms", "1m 30s".

use serde::Deserialize;
use std::fmt;
use std::str::FromStr;
use std::time::Duration;

/// Reads the TOML configuration of `rserpool pe` or `rserpool pu`: the options as keys (into
/// `T`) and the services' `[service-config]` table, which the options do not describe.
pub fn read_config_with_service_table<T: serde::de::DeserializeOwned>(
    path: &std::path::Path,
) -> anyhow::Result<(T, Option<toml::Table>)> {
    use anyhow::Context;
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading the configuration {}", path.display()))?;
    let mut table: toml::Table = toml::from_str(&text)
        .with_context(|| format!("in the configuration {}", path.display()))?;
    let service = match table.remove("service-config") {
        Some(toml::Value::Table(t)) => Some(t),
        _ => None,
    };
    let options = toml::Value::Table(table)
        .try_into()
        .with_context(|| format!("in the configuration {}", path.display()))?;
    Ok((options, service))
}

/// A duration from a flag or a TOML key: a string with units (humantime syntax). A bare number,
/// the spelling of the first release, is still read in milliseconds and remembered, so that
/// the caller can warn that it is deprecated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DurationValue {
    /// The duration.
    pub duration: Duration,
    /// Whether it was written as a bare number of milliseconds (deprecated).
    pub bare_ms: bool,
}

impl DurationValue {
    /// The deprecation warning for `name`, when this value was a bare number.
    pub fn deprecation(&self, name: &str) -> Option<String> {
        self.bare_ms.then(|| {
            format!(
                "{name}: a bare number of milliseconds is deprecated; write \"{}\"",
                human(self.duration)
            )
        })
    }
}

/// A duration longer than zero for the option `name`, from a flag or a key: units or bare
/// milliseconds (as rspregistrar's options take them). The one parser of every command; its
/// errors name the option.
/// The HTTP endpoint's limits from `--metrics-timeout` and `--metrics-max-connections` (the
/// same two settings for every daemon; defaults of [`rserpool_observe::server::Limits`]).
pub fn http_limits(
    timeout: Option<Duration>,
    max_connections: Option<usize>,
) -> anyhow::Result<rserpool_observe::server::Limits> {
    let mut l = rserpool_observe::server::Limits::default();
    if let Some(t) = timeout {
        if t.is_zero() {
            anyhow::bail!("metrics-timeout: must be longer than 0s");
        }
        l.request_timeout = t;
    }
    if let Some(n) = max_connections {
        if n == 0 {
            anyhow::bail!("metrics-max-connections: must be at least 1");
        }
        l.max_connections = n;
    }
    Ok(l)
}

pub fn positive_duration(name: &str, text: &str) -> anyhow::Result<Duration> {
    let d = text
        .parse::<DurationValue>()
        .map_err(|e| anyhow::anyhow!("{name}: {e}"))?
        .duration;
    if d.is_zero() {
        anyhow::bail!("{name}: must be longer than 0");
    }
    Ok(d)
}

/// A duration (zero allowed, e.g. a stale-cache lifetime of "0s") as a clap value parser: the
/// same syntax as [`positive_duration`]; clap's message names the option.
pub fn duration_arg(text: &str) -> Result<Duration, String> {
    text.parse::<DurationValue>().map(|v| v.duration)
}

/// A duration as people write it ("5s", "1m 30s", "250ms").
pub fn human(d: Duration) -> String {
    if d.is_zero() {
        return "0s".into();
    }
    // Whole milliseconds: nothing here is more precise, and "1s 500ms" reads better than
    // "1s 500ms 12us 7ns".
    let d = if d >= Duration::from_millis(1) {
        Duration::from_millis(d.as_millis() as u64)
    } else {
        d
    };
    humantime::format_duration(d).to_string()
}

impl FromStr for DurationValue {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let t = s.trim();
        if !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit()) {
            let ms: u64 = t.parse().map_err(|_| format!("{s:?}: number too large"))?;
            return Ok(DurationValue {
                duration: Duration::from_millis(ms),
                bare_ms: true,
            });
        }
        humantime::parse_duration(t)
            .map(|duration| DurationValue {
                duration,
                bare_ms: false,
            })
            .map_err(|e| format!("{s:?} is not a duration ({e}); write e.g. \"5s\" or \"250ms\""))
    }
}

impl fmt::Display for DurationValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&human(self.duration))
    }
}

impl<'de> Deserialize<'de> for DurationValue {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Ms(u64),
            Text(String),
        }
        match Raw::deserialize(d).map_err(|_| {
            serde::de::Error::custom("expected a duration such as \"5s\" or \"250ms\"")
        })? {
            Raw::Ms(ms) => Ok(DurationValue {
                duration: Duration::from_millis(ms),
                bare_ms: true,
            }),
            Raw::Text(t) => t.parse().map_err(serde::de::Error::custom),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_have_units_and_bare_numbers_are_deprecated_milliseconds() {
        let v: DurationValue = "5s".parse().unwrap();
        assert_eq!(v.duration, Duration::from_secs(5));
        assert_eq!(v.deprecation("x"), None);
        let v: DurationValue = "1m 30s".parse().unwrap();
        assert_eq!(v.duration, Duration::from_secs(90));
        let v: DurationValue = "1500".parse().unwrap();
        assert_eq!(v.duration, Duration::from_millis(1500));
        assert_eq!(
            v.deprecation("announce-interval").unwrap(),
            "announce-interval: a bare number of milliseconds is deprecated; write \"1s 500ms\""
        );
        assert!("5 parsecs".parse::<DurationValue>().is_err());
        assert!("-5s".parse::<DurationValue>().is_err());
        assert_eq!(human(Duration::from_secs(7440)), "2h 4m");
        assert_eq!(human(Duration::ZERO), "0s");
    }

    #[test]
    fn one_parser_names_the_option_and_positive_ones_refuse_zero() {
        assert_eq!(
            positive_duration("peer-heartbeat-cycle", "2.444s").unwrap(),
            Duration::from_millis(2444)
        );
        assert_eq!(
            positive_duration("peer-heartbeat-cycle", "2444").unwrap(),
            Duration::from_millis(2444)
        );
        let e = positive_duration("ownership-probe-timeout", "0s").unwrap_err();
        assert_eq!(
            e.to_string(),
            "ownership-probe-timeout: must be longer than 0"
        );
        let e = positive_duration("--tls-handshake-timeout", "soon").unwrap_err();
        assert!(e
            .to_string()
            .starts_with("--tls-handshake-timeout: \"soon\" is not a duration"));
        assert_eq!(duration_arg("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(duration_arg("0s"), Ok(Duration::ZERO));
        assert!(duration_arg("soon").is_err());
    }
}
