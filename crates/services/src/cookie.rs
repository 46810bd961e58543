//! Sealing session cookies: what a pool element puts into ASAP_COOKIE and accepts back in
//! ASAP_COOKIE_ECHO (RFC 5352 §2.2.10, §2.2.11).
//!
//! The pool user stores the last cookie and hands it to the next pool element after a failover,
//! so a cookie is input from an untrusted party. RFC 5355 §3 (cookie security) asks that a pool
//! element be able to detect a cookie that was forged, altered or replayed. Two seals:
//!
//! - [`PlainSeal`]: the service's cookie as is, RSPLIB's format and RSPLIB's (lack of)
//!   protection; the service still checks the cookie's structure.
//! - [`HmacSeal`]: the service's cookie inside an envelope with the key's identifier, issue and
//!   expiry times (Unix seconds), an optional binding tag for the pool user's identity, and an
//!   HMAC-SHA256 over the service's name and all of the above under a pool-wide key. A pool user
//!   cannot forge or alter one, cannot use one after it expired, and cannot replay one issued to
//!   another pool user when binding is on.
//!
//! Envelope layout (all integers big-endian):
//!
//! ```text
//! offset size field
//!  0     4    magic "RSPC"
//!  4     1    version (1)
//!  5     1    flags (bit 0: bound to a pool-user identity)
//!  6     2    payload length
//!  8     4    key identifier (first 4 bytes of SHA-256("rserpool cookie key" || key))
//! 12     8    issued at, Unix seconds
//! 20     8    expires at, Unix seconds
//! 28     8    binding tag: first 8 bytes of HMAC-SHA256(key, "bind" 0x00 identity), or zeros
//! 36     n    payload (the service's own cookie, e.g. RSPLIB's 16-byte PingPong cookie)
//! 36+n   32   HMAC-SHA256(key, service name || 0x00 || bytes 0 .. 36+n)
//! ```

use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};
use std::fmt;
use std::path::Path;
use std::time::Duration;
use subtle::ConstantTimeEq;

type HmacSha256 = Hmac<Sha256>;

/// Magic at the start of a signed cookie.
pub const SIGNED_MAGIC: &[u8; 4] = b"RSPC";
/// Version of the signed envelope.
pub const SIGNED_VERSION: u8 = 1;
/// Bytes a signed cookie adds to its payload (header and MAC).
pub const SIGNED_OVERHEAD: usize = HEADER_LEN + MAC_LEN;
/// Smallest key accepted, in bytes.
pub const MIN_KEY_LEN: usize = 16;

const HEADER_LEN: usize = 36;
const MAC_LEN: usize = 32;
const FLAG_BOUND: u8 = 0x01;

/// What a seal needs to know besides the cookie.
#[derive(Debug, Clone, Copy)]
pub struct SealContext<'a> {
    /// The service's name ("pingpong", "calcapp"): a cookie of one service is not accepted by
    /// another under the same key.
    pub service: &'a str,
    /// The pool user's identity ([`SessionInfo::identity`](crate::SessionInfo::identity)).
    pub identity: Option<&'a [u8]>,
    /// Wall-clock time since the Unix epoch.
    pub unix_now: Duration,
}

/// Why a cookie was refused by its seal.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SealError {
    /// Not a well-formed envelope.
    #[error("malformed signed cookie: field {field}: {reason}")]
    Malformed {
        /// The envelope field that is wrong.
        field: &'static str,
        /// What is wrong.
        reason: &'static str,
    },
    /// Larger than the configured maximum cookie size.
    #[error("cookie of {size} bytes exceeds the limit of {limit}")]
    TooLarge {
        /// Its size.
        size: usize,
        /// The limit.
        limit: usize,
    },
    /// Sealed with a key this pool element does not have.
    #[error("cookie sealed with unknown key {key_id:08x}")]
    UnknownKey {
        /// The envelope's key identifier.
        key_id: u32,
    },
    /// The MAC does not match: altered, forged, or meant for another service.
    #[error("bad cookie MAC (altered, forged or for another service)")]
    BadMac,
    /// The cookie's lifetime is over.
    #[error("cookie expired at {expires_at} (now {now}, Unix seconds)")]
    Expired {
        /// Expiry, Unix seconds.
        expires_at: u64,
        /// Now, Unix seconds.
        now: u64,
    },
    /// Issued further in the future than the allowed clock skew.
    #[error("cookie issued at {issued_at}, in the future (now {now}, Unix seconds)")]
    NotYetValid {
        /// Issue time, Unix seconds.
        issued_at: u64,
        /// Now, Unix seconds.
        now: u64,
    },
    /// Bound to another pool user's identity (or bound while this session has none, or unbound
    /// while binding is required).
    #[error("cookie bound to another pool user")]
    WrongBinding,
}

/// Seals a service's cookie for ASAP_COOKIE and opens what comes back in ASAP_COOKIE_ECHO.
pub trait CookieSeal: Send + Sync + fmt::Debug {
    /// The bytes to send in ASAP_COOKIE for the service's cookie `payload` (at most 65 535
    /// bytes; the services' cookies are 16 and 20).
    fn seal(&self, context: &SealContext<'_>, payload: &[u8]) -> Vec<u8>;
    /// The service's cookie from the bytes of an ASAP_COOKIE_ECHO, or why it is refused.
    fn open(&self, context: &SealContext<'_>, sealed: &[u8]) -> Result<Vec<u8>, SealError>;
    /// Whether cookies are signed (for logs and status).
    fn is_signed(&self) -> bool;
}

/// No protection: the cookie travels as the service made it (RSPLIB's format and behaviour).
#[derive(Debug, Clone)]
pub struct PlainSeal {
    /// Largest cookie accepted back.
    pub max_size: usize,
}

impl Default for PlainSeal {
    fn default() -> Self {
        Self { max_size: 4096 }
    }
}

impl CookieSeal for PlainSeal {
    fn seal(&self, _context: &SealContext<'_>, payload: &[u8]) -> Vec<u8> {
        payload.to_vec()
    }

    fn open(&self, _context: &SealContext<'_>, sealed: &[u8]) -> Result<Vec<u8>, SealError> {
        if sealed.len() > self.max_size {
            return Err(SealError::TooLarge {
                size: sealed.len(),
                limit: self.max_size,
            });
        }
        Ok(sealed.to_vec())
    }

    fn is_signed(&self) -> bool {
        false
    }
}

/// A pool-wide cookie key: every pool element of the pool has the same one.
#[derive(Clone)]
pub struct CookieKey {
    bytes: Vec<u8>,
    id: u32,
}

impl fmt::Debug for CookieKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CookieKey({:08x})", self.id)
    }
}

/// A key that cannot be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KeyError {
    /// The key file cannot be read.
    #[error("cannot read cookie key file {path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// The key is shorter than [`MIN_KEY_LEN`] bytes.
    #[error("cookie key has {0} bytes, at least {MIN_KEY_LEN} are needed")]
    TooShort(usize),
}

impl CookieKey {
    /// A key from raw bytes (at least [`MIN_KEY_LEN`]).
    pub fn new(bytes: impl Into<Vec<u8>>) -> Result<Self, KeyError> {
        let bytes = bytes.into();
        if bytes.len() < MIN_KEY_LEN {
            return Err(KeyError::TooShort(bytes.len()));
        }
        let digest = Sha256::new()
            .chain_update(b"rserpool cookie key")
            .chain_update(&bytes)
            .finalize();
        let id = u32::from_be_bytes([digest[0], digest[1], digest[2], digest[3]]);
        Ok(Self { bytes, id })
    }

    /// A key from a file: if the file's content, trimmed, is hexadecimal of even length it is
    /// decoded (e.g. `openssl rand -hex 32`), otherwise the raw bytes are the key (e.g.
    /// `head -c 32 /dev/urandom`).
    pub fn from_file(path: &Path) -> Result<Self, KeyError> {
        let raw = std::fs::read(path).map_err(|source| KeyError::Io {
            path: path.display().to_string(),
            source,
        })?;
        Self::new(decode_hex(raw.trim_ascii()).unwrap_or(raw))
    }

    /// The key's identifier, as written into signed cookies (not secret).
    pub fn id(&self) -> u32 {
        self.id
    }

    fn mac(&self) -> HmacSha256 {
        HmacSha256::new_from_slice(&self.bytes).expect("HMAC takes keys of any length")
    }

    fn binding_tag(&self, identity: &[u8]) -> [u8; 8] {
        let mut mac = self.mac();
        mac.update(b"bind\0");
        mac.update(identity);
        let full = mac.finalize().into_bytes();
        let mut tag = [0; 8];
        tag.copy_from_slice(&full[..8]);
        tag
    }
}

fn decode_hex(text: &[u8]) -> Option<Vec<u8>> {
    if text.is_empty() || text.len() % 2 != 0 {
        return None;
    }
    text.chunks(2)
        .map(|pair| {
            let s = std::str::from_utf8(pair).ok()?;
            u8::from_str_radix(s, 16).ok()
        })
        .collect()
}

/// HMAC-SHA256 signed cookies with expiry and optional identity binding.
#[derive(Debug, Clone)]
pub struct HmacSeal {
    key: CookieKey,
    previous: Vec<CookieKey>,
    /// How long a cookie stays valid after it was issued.
    pub lifetime: Duration,
    /// Bind cookies to the pool user's identity when the session layer gives one; with
    /// `require_binding`, a cookie without binding is refused too.
    pub bind: bool,
    /// Refuse unbound cookies (and sessions without identity cannot restore state).
    pub require_binding: bool,
    /// Tolerated difference between pool elements' clocks.
    pub clock_skew: Duration,
    /// Largest sealed cookie accepted.
    pub max_size: usize,
}

impl HmacSeal {
    /// A seal with `key`, cookies valid for `lifetime`, bound when an identity is known.
    pub fn new(key: CookieKey, lifetime: Duration) -> Self {
        Self {
            key,
            previous: Vec::new(),
            lifetime,
            bind: true,
            require_binding: false,
            clock_skew: Duration::from_secs(30),
            max_size: 4096,
        }
    }

    /// Also accept cookies sealed with an older key (key rotation); new cookies use the
    /// current one.
    pub fn accept_previous(mut self, key: CookieKey) -> Self {
        self.previous.push(key);
        self
    }

    fn key_by_id(&self, id: u32) -> Option<&CookieKey> {
        std::iter::once(&self.key)
            .chain(&self.previous)
            .find(|k| k.id == id)
    }
}

fn mac_over(key: &CookieKey, service: &str, bytes: &[u8]) -> [u8; MAC_LEN] {
    let mut mac = key.mac();
    mac.update(service.as_bytes());
    mac.update(&[0]);
    mac.update(bytes);
    mac.finalize().into_bytes().into()
}

fn be_u64(b: &[u8], at: usize) -> u64 {
    let mut a = [0; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_be_bytes(a)
}

impl CookieSeal for HmacSeal {
    fn seal(&self, context: &SealContext<'_>, payload: &[u8]) -> Vec<u8> {
        let now = context.unix_now.as_secs();
        let bound = self.bind && context.identity.is_some();
        let len = u16::try_from(payload.len()).unwrap_or(u16::MAX);
        let payload = &payload[..usize::from(len)];
        let mut out = Vec::with_capacity(SIGNED_OVERHEAD + payload.len());
        out.extend_from_slice(SIGNED_MAGIC);
        out.push(SIGNED_VERSION);
        out.push(if bound { FLAG_BOUND } else { 0 });
        out.extend_from_slice(&len.to_be_bytes());
        out.extend_from_slice(&self.key.id.to_be_bytes());
        out.extend_from_slice(&now.to_be_bytes());
        out.extend_from_slice(&now.saturating_add(self.lifetime.as_secs()).to_be_bytes());
        match context.identity {
            Some(identity) if bound => out.extend_from_slice(&self.key.binding_tag(identity)),
            _ => out.extend_from_slice(&[0; 8]),
        }
        out.extend_from_slice(payload);
        let mac = mac_over(&self.key, context.service, &out);
        out.extend_from_slice(&mac);
        out
    }

    fn open(&self, context: &SealContext<'_>, sealed: &[u8]) -> Result<Vec<u8>, SealError> {
        let malformed = |field, reason| SealError::Malformed { field, reason };
        if sealed.len() > self.max_size {
            return Err(SealError::TooLarge {
                size: sealed.len(),
                limit: self.max_size,
            });
        }
        if sealed.len() < SIGNED_OVERHEAD {
            return Err(malformed("length", "shorter than a signed cookie"));
        }
        if &sealed[0..4] != SIGNED_MAGIC {
            return Err(malformed("magic", "not a signed cookie"));
        }
        if sealed[4] != SIGNED_VERSION {
            return Err(malformed("version", "unknown version"));
        }
        let flags = sealed[5];
        if flags & !FLAG_BOUND != 0 {
            return Err(malformed("flags", "unknown flags set"));
        }
        let len = usize::from(u16::from_be_bytes([sealed[6], sealed[7]]));
        if sealed.len() != SIGNED_OVERHEAD + len {
            return Err(malformed(
                "payload length",
                "disagrees with the cookie's size",
            ));
        }
        let key_id = u32::from_be_bytes([sealed[8], sealed[9], sealed[10], sealed[11]]);
        let key = self
            .key_by_id(key_id)
            .ok_or(SealError::UnknownKey { key_id })?;
        let (body, mac) = sealed.split_at(HEADER_LEN + len);
        let expected = mac_over(key, context.service, body);
        if !bool::from(expected.ct_eq(mac)) {
            return Err(SealError::BadMac);
        }
        // Authentic from here on: the fields are the issuing pool element's.
        let now = context.unix_now.as_secs();
        let issued_at = be_u64(sealed, 12);
        let expires_at = be_u64(sealed, 20);
        if issued_at > now.saturating_add(self.clock_skew.as_secs()) {
            return Err(SealError::NotYetValid { issued_at, now });
        }
        if now >= expires_at.saturating_add(self.clock_skew.as_secs()) {
            return Err(SealError::Expired { expires_at, now });
        }
        let tag = &sealed[28..36];
        if flags & FLAG_BOUND != 0 {
            let Some(identity) = context.identity else {
                return Err(SealError::WrongBinding);
            };
            if !bool::from(key.binding_tag(identity).ct_eq(tag)) {
                return Err(SealError::WrongBinding);
            }
        } else if self.require_binding {
            return Err(SealError::WrongBinding);
        }
        Ok(sealed[HEADER_LEN..HEADER_LEN + len].to_vec())
    }

    fn is_signed(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> CookieKey {
        CookieKey::new(*b"0123456789abcdef0123456789abcdef").unwrap()
    }

    fn ctx(identity: Option<&[u8]>, secs: u64) -> SealContext<'_> {
        SealContext {
            service: "pingpong",
            identity,
            unix_now: Duration::from_secs(secs),
        }
    }

    #[test]
    fn valid_cookie_opens() {
        let seal = HmacSeal::new(key(), Duration::from_secs(60));
        let sealed = seal.seal(&ctx(Some(b"pu-a"), 1000), b"state");
        assert_eq!(sealed.len(), SIGNED_OVERHEAD + 5);
        assert_eq!(
            seal.open(&ctx(Some(b"pu-a"), 1059), &sealed).unwrap(),
            b"state"
        );
    }

    #[test]
    fn every_altered_byte_is_refused() {
        let seal = HmacSeal::new(key(), Duration::from_secs(60));
        let sealed = seal.seal(&ctx(Some(b"pu-a"), 1000), b"state");
        for i in 0..sealed.len() {
            let mut bad = sealed.clone();
            bad[i] ^= 0x01;
            let err = seal.open(&ctx(Some(b"pu-a"), 1000), &bad).unwrap_err();
            assert!(
                matches!(
                    err,
                    SealError::BadMac | SealError::Malformed { .. } | SealError::UnknownKey { .. }
                ),
                "byte {i}: {err:?}"
            );
        }
    }

    #[test]
    fn replay_for_another_identity_is_refused() {
        let seal = HmacSeal::new(key(), Duration::from_secs(60));
        let sealed = seal.seal(&ctx(Some(b"pu-a"), 1000), b"state");
        assert_eq!(
            seal.open(&ctx(Some(b"pu-b"), 1000), &sealed),
            Err(SealError::WrongBinding)
        );
        assert_eq!(
            seal.open(&ctx(None, 1000), &sealed),
            Err(SealError::WrongBinding)
        );
    }

    #[test]
    fn expired_and_future_cookies_are_refused() {
        let mut seal = HmacSeal::new(key(), Duration::from_secs(60));
        seal.clock_skew = Duration::from_secs(5);
        let sealed = seal.seal(&ctx(None, 1000), b"state");
        assert!(seal.open(&ctx(None, 1064), &sealed).is_ok());
        assert_eq!(
            seal.open(&ctx(None, 1065), &sealed),
            Err(SealError::Expired {
                expires_at: 1060,
                now: 1065
            })
        );
        assert_eq!(
            seal.open(&ctx(None, 994), &sealed),
            Err(SealError::NotYetValid {
                issued_at: 1000,
                now: 994
            })
        );
    }

    #[test]
    fn other_service_and_other_key_are_refused() {
        let seal = HmacSeal::new(key(), Duration::from_secs(60));
        let sealed = seal.seal(&ctx(None, 1000), b"state");
        let mut calcapp = ctx(None, 1000);
        calcapp.service = "calcapp";
        assert_eq!(seal.open(&calcapp, &sealed), Err(SealError::BadMac));
        let other = HmacSeal::new(
            CookieKey::new(*b"another key of 32 bytes.........").unwrap(),
            Duration::from_secs(60),
        );
        assert!(matches!(
            other.open(&ctx(None, 1000), &sealed),
            Err(SealError::UnknownKey { .. })
        ));
        // After rotation the old key still opens old cookies.
        let rotated = other.accept_previous(key());
        assert_eq!(rotated.open(&ctx(None, 1000), &sealed).unwrap(), b"state");
    }

    #[test]
    fn require_binding_refuses_unbound() {
        let mut seal = HmacSeal::new(key(), Duration::from_secs(60));
        let unbound = seal.seal(&ctx(None, 1000), b"state");
        seal.require_binding = true;
        assert_eq!(
            seal.open(&ctx(Some(b"pu-a"), 1000), &unbound),
            Err(SealError::WrongBinding)
        );
    }

    #[test]
    fn plain_cookies_pass_through_up_to_the_limit() {
        let seal = PlainSeal { max_size: 16 };
        let sealed = seal.seal(&ctx(None, 0), b"<PP-TD1>\0\0\0\0\0\0\0\x01");
        assert_eq!(sealed, b"<PP-TD1>\0\0\0\0\0\0\0\x01");
        assert_eq!(seal.open(&ctx(None, 0), &sealed).unwrap(), sealed);
        assert!(matches!(
            seal.open(&ctx(None, 0), &[0; 17]),
            Err(SealError::TooLarge { .. })
        ));
    }

    #[test]
    fn key_files_hex_or_raw() {
        let dir = std::env::temp_dir().join(format!("rserpool-key-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let hex = dir.join("hex");
        std::fs::write(&hex, "00112233445566778899aabbccddeeff\n").unwrap();
        let k = CookieKey::from_file(&hex).unwrap();
        assert_eq!(k.bytes, (0..16).map(|i| i * 0x11).collect::<Vec<u8>>());
        let raw = dir.join("raw");
        std::fs::write(&raw, b"\x01\x02not hex at all, raw").unwrap();
        assert_eq!(CookieKey::from_file(&raw).unwrap().bytes.len(), 21);
        let short = dir.join("short");
        std::fs::write(&short, "abcd").unwrap();
        assert!(matches!(
            CookieKey::from_file(&short),
            Err(KeyError::TooShort(2))
        ));
        assert!(matches!(
            CookieKey::from_file(&dir.join("missing")),
            Err(KeyError::Io { .. })
        ));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
