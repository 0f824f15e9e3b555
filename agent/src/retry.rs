//! Waiting between attempts: exponential backoff with jitter, and a loop that retries a
//! Kubernetes call until it succeeds.

use std::time::Duration;

/// Exponential backoff with jitter, from `base` up to `max`.
pub fn backoff(attempt: u32, base: Duration, max: Duration) -> Duration {
    let exp = base.saturating_mul(1u32 << attempt.min(16)).min(max);
    // Up to 25 % less, so that many agents restarted together spread out.
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let jitter = exp.mul_f64(f64::from(nanos % 1000) / 4000.0);
    exp.saturating_sub(jitter)
}

/// Calls `f` until it succeeds, backing off from 1 s to 30 s and saying why on the console.
pub async fn loop_until<T, F, Fut>(what: &str, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, kube::Error>>,
{
    let mut attempt = 0;
    loop {
        match f().await {
            Ok(v) => return v,
            Err(error) => {
                let wait = backoff(attempt, Duration::from_secs(1), Duration::from_secs(30));
                attempt += 1;
                println!(
                    "unbounded-agent: {what}: {error}; retrying in {} s",
                    wait.as_secs()
                );
                tokio::time::sleep(wait).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_and_is_capped() {
        let base = Duration::from_secs(1);
        let max = Duration::from_secs(60);
        for attempt in 0..20 {
            let d = backoff(attempt, base, max);
            let ceiling = base.saturating_mul(1 << attempt.min(16)).min(max);
            assert!(
                d <= ceiling && d >= ceiling.mul_f64(0.74),
                "{attempt}: {d:?}"
            );
        }
    }
}
