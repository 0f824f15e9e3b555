//! When to try an Azure Resource Manager request again, and how long to wait: pure decisions
//! over a response's status and headers, table-tested.
//!
//! - `429 Too Many Requests`: wait `Retry-After` (ARM always sends it), then retry.
//! - `500`, `502`, `503`, `504` and `408`: transient; wait the longer of `Retry-After` and a
//!   doubling backoff with jitter (so that many machines do not retry in step), then retry.
//! - Anything else is final: success, or an error for a person.
//! - Every answer carries `x-ms-ratelimit-remaining-*` headers (the subscription's reads,
//!   writes and deletes left, and Compute's per-resource buckets such as
//!   `Microsoft.Compute/HighCostGet3Min;107`): when one runs out, the client pauses requests to
//!   that subscription before ARM starts answering 429.
//!
//! Retries are bounded by [`RetryPolicy::attempts`]; a request still throttled or failing
//! after them becomes an error (reason `AzureThrottled` or `AzureUnavailable`), and the
//! provider loop backs off before its next try.

use std::time::Duration;

/// How requests are retried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Attempts in all, the first included.
    pub attempts: u32,
    /// The first backoff after a transient failure; it doubles.
    pub first_backoff: Duration,
    /// The longest backoff, and the longest `Retry-After` honoured in-process (a longer one
    /// ends the call with `AzureThrottled`; the provider loop waits it out).
    pub max_wait: Duration,
    /// How long to pause a subscription whose remaining-requests header reached zero.
    pub exhausted_pause: Duration,
    /// How long to pause a subscription with fewer than [`LOW_REMAINING`] requests left.
    pub low_pause: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            attempts: 5,
            first_backoff: Duration::from_secs(1),
            max_wait: Duration::from_secs(60),
            exhausted_pause: Duration::from_secs(10),
            low_pause: Duration::from_secs(1),
        }
    }
}

/// A remaining-requests count under which requests slow down.
pub const LOW_REMAINING: u64 = 10;

/// What to do with a response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Use it (a success or a final error).
    Accept,
    /// Wait, then send the request again.
    RetryAfter(Duration),
    /// Retryable, but the attempts or the longest wait are used up.
    GiveUp,
}

/// Whether a status is worth retrying.
pub fn retryable(status: u16) -> bool {
    matches!(status, 408 | 429 | 500 | 502 | 503 | 504)
}

/// Decides after attempt `attempt` (1-based) answered `status`, with `retry_after` from its
/// header and `jitter` in [0, 1).
pub fn decide(
    policy: &RetryPolicy,
    status: u16,
    retry_after: Option<Duration>,
    attempt: u32,
    jitter: f64,
) -> Decision {
    if !retryable(status) {
        return Decision::Accept;
    }
    if attempt >= policy.attempts {
        return Decision::GiveUp;
    }
    let wait = match (status, retry_after) {
        (429, Some(after)) => after,
        (_, after) => backoff(policy, attempt, jitter).max(after.unwrap_or_default()),
    };
    if wait > policy.max_wait {
        return Decision::GiveUp;
    }
    Decision::RetryAfter(wait)
}

/// The backoff after failed attempt `attempt`: doubling from `first_backoff`, capped at
/// `max_wait`, with up to half of it taken off at random.
pub fn backoff(policy: &RetryPolicy, attempt: u32, jitter: f64) -> Duration {
    let base = policy
        .first_backoff
        .saturating_mul(1u32 << attempt.saturating_sub(1).min(16))
        .min(policy.max_wait);
    base.mul_f64(1.0 - 0.5 * jitter.clamp(0.0, 1.0))
}

/// A transport failure (connection refused or reset, timeout) is retried like a 503.
pub fn decide_transport(policy: &RetryPolicy, attempt: u32, jitter: f64) -> Decision {
    decide(policy, 503, None, attempt, jitter)
}

/// `Retry-After` in seconds (ARM's form). An HTTP date, which ARM does not send, is ignored:
/// the backoff applies.
pub fn parse_retry_after(value: &str) -> Option<Duration> {
    value.trim().parse::<u64>().ok().map(Duration::from_secs)
}

/// How long to pause a subscription after a response with these headers (name, value), from
/// the `x-ms-ratelimit-remaining-*` counts: none when plenty are left.
pub fn ratelimit_pause<'a>(
    policy: &RetryPolicy,
    headers: impl IntoIterator<Item = (&'a str, &'a str)>,
) -> Option<Duration> {
    let lowest = headers
        .into_iter()
        .filter(|(name, _)| {
            name.to_ascii_lowercase()
                .starts_with("x-ms-ratelimit-remaining-")
        })
        .flat_map(|(_, value)| remaining_counts(value))
        .min()?;
    match lowest {
        0 => Some(policy.exhausted_pause),
        n if n < LOW_REMAINING => Some(policy.low_pause),
        _ => None,
    }
}

/// The counts in a remaining-requests header: a plain number
/// (`x-ms-ratelimit-remaining-subscription-writes: 1199`) or Compute's list of
/// `policy;count` pairs (`Microsoft.Compute/PutVM3Min;239,Microsoft.Compute/PutVM30Min;1199`).
fn remaining_counts(value: &str) -> Vec<u64> {
    value
        .split(',')
        .filter_map(|part| part.rsplit(';').next())
        .filter_map(|n| n.trim().parse::<u64>().ok())
        .collect()
}

/// A number in [0, 1) that differs from call to call (jitter needs no cryptography).
pub fn jitter() -> f64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    f64::from(nanos % 1000) / 1000.0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> RetryPolicy {
        RetryPolicy {
            attempts: 4,
            first_backoff: Duration::from_secs(1),
            max_wait: Duration::from_secs(30),
            exhausted_pause: Duration::from_secs(10),
            low_pause: Duration::from_secs(1),
        }
    }

    #[test]
    fn decisions() {
        let s = Duration::from_secs;
        let cases = [
            ("success", 200, None, 1, Decision::Accept),
            ("accepted", 202, None, 1, Decision::Accept),
            ("bad request is final", 400, Some(s(5)), 1, Decision::Accept),
            ("forbidden is final", 403, None, 1, Decision::Accept),
            ("not found is final", 404, None, 1, Decision::Accept),
            ("conflict is final", 409, None, 1, Decision::Accept),
            (
                "throttled: Retry-After",
                429,
                Some(s(7)),
                1,
                Decision::RetryAfter(s(7)),
            ),
            (
                "throttled without Retry-After: backoff",
                429,
                None,
                2,
                Decision::RetryAfter(s(2)),
            ),
            ("throttled too long", 429, Some(s(31)), 1, Decision::GiveUp),
            (
                "throttled, attempts used up",
                429,
                Some(s(1)),
                4,
                Decision::GiveUp,
            ),
            ("503: backoff", 503, None, 1, Decision::RetryAfter(s(1))),
            (
                "503: backoff doubles",
                503,
                None,
                3,
                Decision::RetryAfter(s(4)),
            ),
            (
                "503: Retry-After when longer",
                503,
                Some(s(9)),
                1,
                Decision::RetryAfter(s(9)),
            ),
            ("500", 500, None, 1, Decision::RetryAfter(s(1))),
            ("502", 502, None, 1, Decision::RetryAfter(s(1))),
            ("504", 504, None, 1, Decision::RetryAfter(s(1))),
            ("501 is final", 501, None, 1, Decision::Accept),
            ("5xx, attempts used up", 500, None, 4, Decision::GiveUp),
        ];
        for (case, status, after, attempt, expected) in cases {
            assert_eq!(
                decide(&policy(), status, after, attempt, 0.0),
                expected,
                "{case}"
            );
        }
    }

    #[test]
    fn backoff_doubles_to_the_cap_and_jitter_only_shortens() {
        let p = policy();
        let waits: Vec<u64> = (1..=7).map(|n| backoff(&p, n, 0.0).as_secs()).collect();
        assert_eq!(waits, [1, 2, 4, 8, 16, 30, 30]);
        for jitter in [0.0, 0.3, 0.999] {
            let wait = backoff(&p, 3, jitter);
            assert!(wait <= Duration::from_secs(4) && wait >= Duration::from_secs(2));
        }
    }

    #[test]
    fn retry_after_values() {
        assert_eq!(parse_retry_after("17"), Some(Duration::from_secs(17)));
        assert_eq!(parse_retry_after(" 0 "), Some(Duration::ZERO));
        assert_eq!(parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT"), None);
        assert_eq!(parse_retry_after("-1"), None);
    }

    #[test]
    fn ratelimit_pauses() {
        let p = policy();
        type Case<'a> = (&'a str, Vec<(&'a str, &'a str)>, Option<Duration>);
        let cases: [Case<'_>; 6] = [
            ("no headers", vec![], None),
            (
                "plenty left",
                vec![("x-ms-ratelimit-remaining-subscription-writes", "1199")],
                None,
            ),
            (
                "writes ran out",
                vec![
                    ("x-ms-ratelimit-remaining-subscription-reads", "11999"),
                    ("x-ms-ratelimit-remaining-subscription-writes", "0"),
                ],
                Some(Duration::from_secs(10)),
            ),
            (
                "few left",
                vec![("X-Ms-Ratelimit-Remaining-Subscription-Deletes", "3")],
                Some(Duration::from_secs(1)),
            ),
            (
                "a Compute bucket running low",
                vec![(
                    "x-ms-ratelimit-remaining-resource",
                    "Microsoft.Compute/PutVM3Min;4,Microsoft.Compute/PutVM30Min;1199",
                )],
                Some(Duration::from_secs(1)),
            ),
            (
                "other headers are ignored",
                vec![("x-ms-request-id", "0"), ("retry-after", "0")],
                None,
            ),
        ];
        for (case, headers, expected) in cases {
            assert_eq!(ratelimit_pause(&p, headers), expected, "{case}");
        }
    }
}
