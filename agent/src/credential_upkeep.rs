//! Keeping the agent's credentials: obtain them until they are issued, then refresh them
//! before they expire. Each failure waits as [`CredentialError::retry_hint`] says: exactly
//! the bootserver's `Retry-After` when it asked to retry (its nonce's mint is under way, the
//! API server is slow), a growing backoff after a network error, once a minute for what
//! nothing but an operator changes (a spent nonce, an expired token, a refusal).

use std::time::Duration;

use unbounded_api::agent::Credentials;

use crate::credentials::{self, CredentialError, RetryHint, Store};
use crate::identity::Identity;
use crate::retry::backoff;

/// The longest wait between two attempts.
const MAX_WAIT: Duration = Duration::from_secs(60);

/// How long to wait after `error` on attempt `attempt` (from 0).
pub fn wait_after(error: &CredentialError, attempt: u32) -> Duration {
    match error.retry_hint() {
        RetryHint::After(after) => after,
        RetryHint::Backoff => backoff(attempt, Duration::from_secs(1), MAX_WAIT),
        RetryHint::Slowly => MAX_WAIT,
    }
}

/// Obtains credentials (and stores them), trying until they are issued; each failure is
/// said on the console with the wait before the next attempt.
pub async fn obtain_until_issued(
    http: &reqwest::Client,
    identity: &Identity,
    store: &Store,
    bootstrap: bool,
) -> Credentials {
    let mut attempt = 0;
    loop {
        match credentials::obtain(http, identity, store, bootstrap).await {
            Ok(c) => return c,
            Err(error) => {
                let wait = wait_after(&error, attempt);
                attempt = attempt.saturating_add(1);
                // On the console too: a machine that cannot authenticate must say why.
                println!(
                    "unbounded-agent: {error}; trying again in {} s",
                    wait.as_secs()
                );
                tokio::time::sleep(wait).await;
            }
        }
    }
}

/// Refreshes the stored credentials before they expire, forever.
pub async fn refresh_forever(http: reqwest::Client, identity: Identity, store: Store) {
    loop {
        let now = credentials::now_unix();
        let at = store.meta().map_or(now + 60, |m| {
            credentials::refresh_at(m.expires_unix, m.lifetime_seconds)
        });
        tokio::time::sleep(Duration::from_secs(at.saturating_sub(now).max(5))).await;
        let _ = obtain_until_issued(&http, &identity, &store, false).await;
        tracing::info!("credentials refreshed");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_follow_the_hint() {
        let busy = CredentialError::RetryLater {
            status: 503,
            after: Duration::from_secs(2),
            message: String::new(),
        };
        assert_eq!(wait_after(&busy, 9), Duration::from_secs(2));
        let unreachable = CredentialError::Unreachable {
            bootserver: "http://b".into(),
            source: "connection refused".into(),
        };
        assert!(wait_after(&unreachable, 0) <= Duration::from_secs(1));
        assert!(wait_after(&unreachable, 10) <= MAX_WAIT);
        assert_eq!(wait_after(&CredentialError::Exhausted, 0), MAX_WAIT);
    }
}
