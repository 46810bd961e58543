//! Waiting for a condition with a deadline, never a fixed sleep before an assertion.

use std::time::Duration;

/// How often a condition is polled.
const POLL: Duration = Duration::from_millis(10);

/// Waits until `f` holds, polling every 10 ms; panics with "timed out waiting for `what`" once
/// `within` has passed.
pub async fn wait_for(what: &str, within: Duration, mut f: impl FnMut() -> bool) {
    let end = tokio::time::Instant::now() + within;
    while !f() {
        assert!(
            tokio::time::Instant::now() < end,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(POLL).await;
    }
}

/// [`wait_for`] with a condition that must itself wait (it talks to a server), polled every
/// 50 ms.
pub async fn until(what: &str, within: Duration, mut f: impl AsyncFnMut() -> bool) {
    let end = tokio::time::Instant::now() + within;
    while !f().await {
        assert!(
            tokio::time::Instant::now() < end,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(5 * POLL).await;
    }
}
