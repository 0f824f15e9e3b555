//! How the loop paces itself ([`Settings`]), its errors ([`LoopError`]) and the wait after
//! each ([`requeue_after`]): waiting is not failing, failures back off.

use std::time::Duration;

use super::contract::ProviderError;
use crate::release::WipeTimeouts;

/// How the loop paces itself.
#[derive(Debug, Clone, Copy)]
pub struct Settings {
    /// How often a provisioned Machine is observed.
    pub poll: Duration,
    /// The first wait after a failure; it doubles up to `max_backoff`.
    pub first_backoff: Duration,
    /// The longest wait after failures.
    pub max_backoff: Duration,
    /// How often a deleted Machine whose Node still exists is looked at again (besides the
    /// Node watch): fixed, since waiting is not failing.
    pub wait: Duration,
    /// How long a deleted Machine waits for its agent's wipe of its disks before it is held.
    pub wipe_timeouts: WipeTimeouts,
    /// How often a Machine held for its wipe is looked at again (besides its own changes).
    pub held: Duration,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            poll: Duration::from_secs(30),
            first_backoff: Duration::from_secs(5),
            max_backoff: Duration::from_secs(300),
            wait: Duration::from_secs(5),
            wipe_timeouts: WipeTimeouts::default(),
            held: Duration::from_secs(60),
        }
    }
}

/// The wait after `failures` consecutive failures: doubling, capped, never zero.
pub fn backoff(settings: &Settings, failures: u32) -> Duration {
    settings
        .first_backoff
        .saturating_mul(1u32 << failures.saturating_sub(1).min(16))
        .min(settings.max_backoff)
}

/// When to look at a Machine again after `error`, the `failures`-th in a row: waiting
/// (for the Node) at the fixed [`Settings::wait`], failures with the backoff.
pub fn requeue_after(settings: &Settings, error: &LoopError, failures: u32) -> Duration {
    match error {
        LoopError::WaitingForNode(_) | LoopError::WaitingForWipe(_) => settings.wait,
        LoopError::WipeHeld { .. } => settings.held,
        LoopError::Provider(_) | LoopError::Kube { .. } | LoopError::Finalizer(_) => {
            backoff(settings, failures)
        }
    }
}

/// Errors of the loop itself.
#[derive(Debug, thiserror::Error)]
pub enum LoopError {
    /// The provider failed (reported in status and an Event already).
    #[error(transparent)]
    Provider(#[from] ProviderError),
    /// A call to the API server failed.
    #[error("{action}: {source}")]
    Kube {
        /// What was being done.
        action: String,
        /// Why it failed.
        #[source]
        source: kube::Error,
    },
    /// Adding or removing the provider's finalizer failed.
    #[error("{0}")]
    Finalizer(#[source] Box<kube::runtime::finalizer::Error<LoopError>>),
    /// The Node still exists: the controller drains and deletes it first.
    #[error("waiting for Node {0} to be drained and deleted")]
    WaitingForNode(String),
    /// The agent has not reported the disks wiped yet.
    #[error("{0}")]
    WaitingForWipe(String),
    /// The wipe failed or timed out: the Machine is kept (`DisksWiped=False`).
    #[error("{reason}: {message}")]
    WipeHeld {
        /// `WipeFailed` or `WipeTimedOut`.
        reason: &'static str,
        /// What happened and what to do.
        message: String,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_to_its_cap() {
        let s = Settings {
            poll: Duration::from_secs(30),
            first_backoff: Duration::from_secs(5),
            max_backoff: Duration::from_secs(60),
            wait: Duration::from_secs(3),
            ..Settings::default()
        };
        let waits: Vec<u64> = (1..=6).map(|n| backoff(&s, n).as_secs()).collect();
        assert_eq!(waits, [5, 10, 20, 40, 60, 60]);
    }

    #[test]
    fn waiting_for_the_node_is_not_a_failure() {
        let s = Settings::default();
        let waiting = LoopError::WaitingForNode("n".into());
        let failed = LoopError::Provider(ProviderError::new("BmcUnreachable", ""));
        let cases = [
            (&waiting, 1, s.wait),
            (&waiting, 40, s.wait),
            (&failed, 1, s.first_backoff),
            (&failed, 40, s.max_backoff),
            (&LoopError::WaitingForWipe("w".into()), 7, s.wait),
            (
                &LoopError::WipeHeld {
                    reason: "WipeFailed",
                    message: String::new(),
                },
                7,
                s.held,
            ),
            (
                &LoopError::Kube {
                    action: "x".into(),
                    source: kube::Error::TlsRequired,
                },
                2,
                s.first_backoff * 2,
            ),
        ];
        for (error, failures, expected) in cases {
            assert_eq!(
                requeue_after(&s, error, failures),
                expected,
                "{error} after {failures}"
            );
        }
    }
}
