//! Token buckets for the per-client rate limits of RFC 5355 (handle resolutions and unreachable
//! reports), driven by the time passed in.

use crate::config::RateLimit;
use std::time::Duration;

/// A token bucket: `burst` tokens at most, refilled at `rate` per second.
#[derive(Debug, Clone)]
pub(crate) struct TokenBucket {
    limit: RateLimit,
    tokens: f64,
    last: Duration,
}

impl TokenBucket {
    pub(crate) fn new(limit: RateLimit, now: Duration) -> Self {
        TokenBucket {
            limit,
            tokens: limit.burst.max(1.0),
            last: now,
        }
    }

    /// Takes one token if there is one.
    pub(crate) fn allow(&mut self, now: Duration) -> bool {
        let elapsed = now.saturating_sub(self.last).as_secs_f64();
        self.last = self.last.max(now);
        self.tokens = (self.tokens + elapsed * self.limit.rate).min(self.limit.burst.max(1.0));
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bursts_then_refills_at_the_rate() {
        let mut b = TokenBucket::new(
            RateLimit {
                rate: 2.0,
                burst: 3.0,
            },
            Duration::ZERO,
        );
        assert!((0..3).all(|_| b.allow(Duration::ZERO)));
        assert!(!b.allow(Duration::ZERO));
        assert!(!b.allow(Duration::from_millis(400)));
        assert!(b.allow(Duration::from_millis(500)));
        assert!(!b.allow(Duration::from_millis(500)));
        // A long pause refills to the burst size, not beyond.
        let later = Duration::from_secs(100);
        assert!((0..3).all(|_| b.allow(later)));
        assert!(!b.allow(later));
    }
}
