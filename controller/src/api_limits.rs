//! The client-side limit on requests to the API server: a token bucket (`--api-qps`
//! requests per second on average, bursts of up to `--api-burst`), as client-go's QPS and
//! Burst. Requests beyond it wait in the client instead of piling onto the API server, so
//! that a cold start with thousands of Machines leaves room for everyone else using the
//! same API server (kubectl, kubelets, other controllers). Together with the bounded
//! reconcile concurrency ([`crate::context::Settings`]) it bounds both the rate and the
//! number of requests in flight.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::time::{Instant, Sleep};

/// A token bucket: `rate` tokens per second, holding at most `burst`.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenBucket {
    rate: f64,
    burst: f64,
    tokens: f64,
    last: Instant,
}

impl TokenBucket {
    /// A full bucket. A rate of zero or less means no limit.
    pub fn new(rate: f64, burst: u32, now: Instant) -> Self {
        let burst = f64::from(burst.max(1));
        Self {
            rate,
            burst,
            tokens: burst,
            last: now,
        }
    }

    /// Takes a token if there is one; otherwise says how long until there is.
    pub fn try_take(&mut self, now: Instant) -> Result<(), Duration> {
        if self.rate <= 0.0 {
            return Ok(());
        }
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.tokens = (self.tokens + elapsed * self.rate).min(self.burst);
        self.last = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            Ok(())
        } else {
            Err(Duration::from_secs_f64((1.0 - self.tokens) / self.rate))
        }
    }
}

/// A tower layer applying a [`TokenBucket`] to every request of a kube client (which puts
/// its stack behind one buffer, so the bucket is shared by all clones of the client).
#[derive(Debug, Clone, Copy)]
pub struct RateLimitLayer {
    rate: f64,
    burst: u32,
}

impl RateLimitLayer {
    /// `rate` requests per second (0: unlimited), bursts of `burst`.
    pub fn new(rate: f64, burst: u32) -> Self {
        Self { rate, burst }
    }
}

impl<S> tower::Layer<S> for RateLimitLayer {
    type Service = RateLimit<S>;

    fn layer(&self, inner: S) -> RateLimit<S> {
        RateLimit {
            inner,
            bucket: TokenBucket::new(self.rate, self.burst, Instant::now()),
            wait: None,
            holds_token: false,
        }
    }
}

/// The service of [`RateLimitLayer`].
#[derive(Debug)]
pub struct RateLimit<S> {
    inner: S,
    bucket: TokenBucket,
    wait: Option<Pin<Box<Sleep>>>,
    holds_token: bool,
}

impl<S, R> tower::Service<R> for RateLimit<S>
where
    S: tower::Service<R>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        while !self.holds_token {
            if let Some(wait) = &mut self.wait {
                if wait.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
                self.wait = None;
            }
            match self.bucket.try_take(Instant::now()) {
                Ok(()) => self.holds_token = true,
                Err(after) => self.wait = Some(Box::pin(tokio::time::sleep(after))),
            }
        }
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: R) -> Self::Future {
        self.holds_token = false;
        self.inner.call(request)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_bucket_table() {
        let start = Instant::now();
        let at = |ms: u64| start + Duration::from_millis(ms);
        // (case, rate, burst, takes at these milliseconds, expected outcomes)
        type Case = (&'static str, f64, u32, Vec<u64>, Vec<Result<(), Duration>>);
        let cases: Vec<Case> = vec![
            (
                "a burst, then one per 1/rate",
                10.0,
                2,
                vec![0, 0, 0, 100, 100],
                vec![
                    Ok(()),
                    Ok(()),
                    Err(Duration::from_millis(100)),
                    Ok(()),
                    Err(Duration::from_millis(100)),
                ],
            ),
            (
                "an idle bucket refills to its burst, not beyond",
                10.0,
                2,
                vec![0, 0, 10_000, 10_000, 10_000],
                vec![
                    Ok(()),
                    Ok(()),
                    Ok(()),
                    Ok(()),
                    Err(Duration::from_millis(100)),
                ],
            ),
            (
                "half a token means half the wait",
                10.0,
                1,
                vec![0, 50],
                vec![Ok(()), Err(Duration::from_millis(50))],
            ),
            (
                "no limit",
                0.0,
                1,
                vec![0, 0, 0],
                vec![Ok(()), Ok(()), Ok(())],
            ),
        ];
        for (case, rate, burst, times, expected) in cases {
            let mut bucket = TokenBucket::new(rate, burst, start);
            let got: Vec<Result<(), Duration>> = times
                .iter()
                .map(|t| {
                    bucket.try_take(at(*t)).map_err(|d| {
                        Duration::from_millis((d.as_secs_f64() * 1000.0).round() as u64)
                    })
                })
                .collect();
            assert_eq!(got, expected, "{case}");
        }
    }

    /// The layer holds requests back to the rate, in tokio's paused time.
    #[tokio::test(start_paused = true)]
    async fn layer_paces_requests() {
        use tower::{Layer, Service, ServiceExt};
        let mut service =
            RateLimitLayer::new(10.0, 2).layer(tower::service_fn(|n: u32| async move {
                Ok::<u32, std::convert::Infallible>(n)
            }));
        let start = Instant::now();
        for n in 0..6 {
            let ready = service.ready().await.unwrap_or_else(|never| match never {});
            assert_eq!(ready.call(n).await, Ok(n));
        }
        // Two at once, then four more at 100 ms each.
        assert_eq!(start.elapsed(), Duration::from_millis(400));
    }
}
