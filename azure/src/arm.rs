//! The Azure Resource Manager client: bearer-token requests with retries ([`crate::retry`]),
//! long-running operations ([`crate::lro`]) and errors for a person ([`crate::error`]).
//!
//! Every method takes the credential of the Machine it works for, so that Machines with
//! different service principals share one client. The token goes only to the configured
//! endpoint: a polling URL on another origin is refused, never followed with the token.
//! Requests and errors are logged by what they do, never with their headers.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use azure_core::credentials::TokenCredential;
use reqwest::header::{HeaderMap, LOCATION, RETRY_AFTER};
use reqwest::{Method, Url};
use serde_json::Value;

use crate::error::{ArmError, error_parts};
use crate::lro::{self, Follow, Progress};
use crate::retry::{self, Decision, RetryPolicy};
use unbounded_runtime::error_text::with_causes;

/// A credential that gets tokens for Azure Resource Manager.
pub type Credential = Arc<dyn TokenCredential>;

/// How long-running operations are awaited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LroPolicy {
    /// The wait between polls when Azure sends no `Retry-After`.
    pub poll: Duration,
    /// The longest wait between polls.
    pub max_poll: Duration,
    /// How long one operation is awaited before the call gives up (Azure keeps working on it;
    /// the next reconcile finds the resource and waits again).
    pub timeout: Duration,
}

impl Default for LroPolicy {
    fn default() -> Self {
        Self {
            poll: Duration::from_secs(5),
            max_poll: Duration::from_secs(60),
            timeout: Duration::from_secs(20 * 60),
        }
    }
}

/// One answer.
#[derive(Debug)]
struct Answer {
    status: u16,
    headers: HeaderMap,
    body: String,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    fn retry_after(&self) -> Option<Duration> {
        self.headers
            .get(RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(retry::parse_retry_after)
    }

    fn json(&self, action: &str) -> Result<Value, ArmError> {
        if self.body.trim().is_empty() {
            return Ok(Value::Null);
        }
        serde_json::from_str(&self.body).map_err(|source| ArmError::NotJson {
            action: action.to_owned(),
            source,
        })
    }

    /// The answer, or Azure's error in it.
    fn ok(self, action: &str) -> Result<Self, ArmError> {
        if self.status < 400 {
            return Ok(self);
        }
        let (code, message) = error_parts(self.status, &self.body);
        Err(ArmError::Azure {
            action: action.to_owned(),
            status: self.status,
            code,
            message,
        })
    }
}

/// The Azure Resource Manager client.
#[derive(Debug)]
pub struct ArmClient {
    http: reqwest::Client,
    endpoint: Url,
    scope: String,
    retry: RetryPolicy,
    lro: LroPolicy,
    paused_until: Mutex<HashMap<String, Instant>>,
}

impl ArmClient {
    /// A client for `endpoint` (such as `https://management.azure.com`), whose tokens are
    /// asked for the scope `<endpoint>/.default`.
    pub fn new(http: reqwest::Client, endpoint: Url, retry: RetryPolicy, lro: LroPolicy) -> Self {
        let scope = format!("{}/.default", endpoint.as_str().trim_end_matches('/'));
        Self {
            http,
            endpoint,
            scope,
            retry,
            lro,
            paused_until: Mutex::new(HashMap::new()),
        }
    }

    /// The token scope.
    pub fn scope(&self) -> &str {
        &self.scope
    }

    fn url(&self, path_and_query: &str) -> String {
        format!(
            "{}{path_and_query}",
            self.endpoint.as_str().trim_end_matches('/')
        )
    }

    /// Reads a resource; `None` when it does not exist.
    pub async fn get(
        &self,
        credential: &Credential,
        action: &str,
        path: &str,
    ) -> Result<Option<Value>, ArmError> {
        let answer = self
            .send(credential, action, Method::GET, &self.url(path), None)
            .await?;
        if answer.status == 404 {
            return Ok(None);
        }
        answer.ok(action)?.json(action).map(Some)
    }

    /// Creates or updates a resource and waits until Azure is done; returns the resource.
    pub async fn put(
        &self,
        credential: &Credential,
        action: &str,
        path: &str,
        body: &Value,
    ) -> Result<Value, ArmError> {
        let url = self.url(path);
        let answer = self
            .send(credential, action, Method::PUT, &url, Some(body))
            .await?
            .ok(action)?;
        let first = answer.json(action)?;
        let how = lro::follow(
            true,
            answer.status,
            answer.header("azure-asyncoperation"),
            answer.header(LOCATION.as_str()),
            &first,
        );
        if how == Follow::Done && first.is_object() {
            return Ok(first);
        }
        self.wait(credential, action, how, &url, answer.retry_after(), false)
            .await?;
        self.get(credential, action, path)
            .await?
            .ok_or_else(|| ArmError::Protocol {
                action: action.to_owned(),
                message: "the resource was gone right after it was created".into(),
            })
    }

    /// Waits until a resource's provisioning state is final (a write someone started is
    /// still running).
    pub async fn wait_for_resource(
        &self,
        credential: &Credential,
        action: &str,
        path: &str,
    ) -> Result<(), ArmError> {
        self.wait(
            credential,
            action,
            Follow::Resource,
            &self.url(path),
            None,
            false,
        )
        .await
    }

    /// Runs an action (POST without a body) and waits until Azure is done.
    pub async fn post(
        &self,
        credential: &Credential,
        action: &str,
        path: &str,
    ) -> Result<(), ArmError> {
        let url = self.url(path);
        let answer = self
            .send(credential, action, Method::POST, &url, None)
            .await?
            .ok(action)?;
        let how = lro::follow(
            false,
            answer.status,
            answer.header("azure-asyncoperation"),
            answer.header(LOCATION.as_str()),
            &Value::Null,
        );
        self.wait(credential, action, how, &url, answer.retry_after(), false)
            .await
    }

    /// Deletes a resource and waits until it is gone; a resource that does not exist is
    /// deleted already.
    pub async fn delete(
        &self,
        credential: &Credential,
        action: &str,
        path: &str,
    ) -> Result<(), ArmError> {
        let url = self.url(path);
        let answer = self
            .send(credential, action, Method::DELETE, &url, None)
            .await?;
        if answer.status == 404 {
            return Ok(());
        }
        let answer = answer.ok(action)?;
        let how = lro::follow(
            false,
            answer.status,
            answer.header("azure-asyncoperation"),
            answer.header(LOCATION.as_str()),
            &Value::Null,
        );
        self.wait(credential, action, how, &url, answer.retry_after(), true)
            .await
    }

    /// Polls until the operation ends or the timeout passes.
    async fn wait(
        &self,
        credential: &Credential,
        action: &str,
        how: Follow,
        resource_url: &str,
        first_wait: Option<Duration>,
        deleting: bool,
    ) -> Result<(), ArmError> {
        let url = match &how {
            Follow::Done => return Ok(()),
            Follow::AsyncOperation(url) | Follow::Location(url) => url.clone(),
            Follow::Resource => resource_url.to_owned(),
        };
        if !same_origin(&self.endpoint, &url) {
            return Err(ArmError::Protocol {
                action: action.to_owned(),
                message: format!(
                    "Azure asked to poll {url}, which is not on {}; the token is not sent there",
                    self.endpoint
                ),
            });
        }
        let started = Instant::now();
        let mut wait = self.poll_wait(first_wait);
        loop {
            if started.elapsed() + wait > self.lro.timeout {
                return Err(ArmError::OperationTimedOut {
                    action: action.to_owned(),
                    seconds: self.lro.timeout.as_secs(),
                });
            }
            tokio::time::sleep(wait).await;
            let answer = self
                .send(credential, action, Method::GET, &url, None)
                .await?;
            wait = self.poll_wait(answer.retry_after());
            let progress = match &how {
                Follow::AsyncOperation(_) => {
                    lro::async_operation_progress(&answer.ok(action)?.json(action)?)
                }
                Follow::Location(_) => match lro::location_progress(answer.status, deleting) {
                    Some(progress) => progress,
                    None => return answer.ok(action).map(drop),
                },
                Follow::Resource | Follow::Done => {
                    if deleting && answer.status == 404 {
                        Progress::Succeeded
                    } else {
                        lro::resource_progress(&answer.ok(action)?.json(action)?)
                    }
                }
            };
            match progress {
                Progress::Running => {
                    tracing::debug!(action, wait_seconds = wait.as_secs(), "still running");
                }
                Progress::Succeeded => return Ok(()),
                Progress::Failed {
                    status,
                    code,
                    message,
                } => {
                    return Err(ArmError::OperationFailed {
                        action: action.to_owned(),
                        status,
                        code,
                        message,
                    });
                }
            }
        }
    }

    fn poll_wait(&self, retry_after: Option<Duration>) -> Duration {
        retry_after.unwrap_or(self.lro.poll).min(self.lro.max_poll)
    }

    async fn token(&self, credential: &Credential) -> Result<String, ArmError> {
        credential
            .get_token(&[self.scope.as_str()], None)
            .await
            .map(|t| t.token.secret().to_owned())
            .map_err(|source| ArmError::Authentication { source })
    }

    /// Sends one request, with retries of throttling and transient failures. Returns any
    /// answer that is not retried (a success or a final error).
    async fn send(
        &self,
        credential: &Credential,
        action: &str,
        method: Method,
        url: &str,
        body: Option<&Value>,
    ) -> Result<Answer, ArmError> {
        let subscription = subscription_of(url).unwrap_or_default().to_owned();
        let mut attempt = 1;
        loop {
            self.wait_for_pause(&subscription).await;
            let token = self.token(credential).await?;
            let mut request = self
                .http
                .request(method.clone(), url)
                .bearer_auth(token)
                .header(reqwest::header::ACCEPT, "application/json");
            if let Some(body) = body {
                request = request.json(body);
            } else if method == Method::POST {
                request = request.header(reqwest::header::CONTENT_LENGTH, "0");
            }
            let sent = request.send().await;
            let answer = match sent {
                Ok(response) => {
                    let status = response.status().as_u16();
                    let headers = response.headers().clone();
                    response.text().await.map(|body| Answer {
                        status,
                        headers,
                        body,
                    })
                }
                Err(e) => Err(e),
            };
            let answer = match answer {
                Ok(answer) => answer,
                Err(source) => {
                    match retry::decide_transport(&self.retry, attempt, retry::jitter()) {
                        Decision::RetryAfter(wait) => {
                            let message = with_causes(&source);
                            tracing::info!(action, attempt, %message, wait_ms = wait.as_millis() as u64, "Azure unreachable; retrying");
                            tokio::time::sleep(wait).await;
                            attempt += 1;
                            continue;
                        }
                        _ => {
                            return Err(ArmError::Unreachable {
                                action: action.to_owned(),
                                source,
                            });
                        }
                    }
                }
            };
            tracing::debug!(action, %method, status = answer.status, "ARM answered");
            self.note_ratelimit(&subscription, &answer.headers);
            let retry_after = answer.retry_after();
            match retry::decide(
                &self.retry,
                answer.status,
                retry_after,
                attempt,
                retry::jitter(),
            ) {
                Decision::Accept => return Ok(answer),
                Decision::RetryAfter(wait) => {
                    if answer.status == 429 {
                        tracing::info!(
                            action,
                            attempt,
                            wait_ms = wait.as_millis() as u64,
                            "Azure throttled the request (429); retrying after Retry-After"
                        );
                    } else {
                        let (code, message) = error_parts(answer.status, &answer.body);
                        tracing::info!(action, attempt, status = answer.status, %code, %message, wait_ms = wait.as_millis() as u64, "transient Azure failure; retrying");
                    }
                    tokio::time::sleep(wait).await;
                    attempt += 1;
                }
                Decision::GiveUp if answer.status == 429 => {
                    return Err(ArmError::Throttled {
                        action: action.to_owned(),
                        retry_after_seconds: retry_after.map(|d| d.as_secs()),
                    });
                }
                Decision::GiveUp => {
                    let (code, message) = error_parts(answer.status, &answer.body);
                    return Err(ArmError::Unavailable {
                        action: action.to_owned(),
                        message: format!("{} {code}: {message}", answer.status),
                    });
                }
            }
        }
    }

    /// Remembers to slow down when the subscription's remaining-requests headers run low.
    fn note_ratelimit(&self, subscription: &str, headers: &HeaderMap) {
        let pairs = headers
            .iter()
            .filter_map(|(name, value)| Some((name.as_str(), value.to_str().ok()?)));
        if let Some(pause) = retry::ratelimit_pause(&self.retry, pairs) {
            tracing::info!(
                subscription,
                pause_ms = pause.as_millis() as u64,
                "few Azure Resource Manager requests left for the subscription; pausing"
            );
            if let Ok(mut paused) = self.paused_until.lock() {
                paused.insert(subscription.to_owned(), Instant::now() + pause);
            }
        }
    }

    async fn wait_for_pause(&self, subscription: &str) {
        let until = self
            .paused_until
            .lock()
            .ok()
            .and_then(|p| p.get(subscription).copied());
        if let Some(until) = until {
            let now = Instant::now();
            if until > now {
                tokio::time::sleep(until - now).await;
            }
        }
    }
}

/// reqwest's error with its causes; it names the URL, which holds no secret.
/// The subscription a URL addresses (`/subscriptions/<id>/…`).
pub fn subscription_of(url: &str) -> Option<&str> {
    let rest = &url[url.find("/subscriptions/")? + "/subscriptions/".len()..];
    rest.split(['/', '?']).next().filter(|s| !s.is_empty())
}

/// Whether `url` is on the same scheme, host and port as `endpoint`.
pub fn same_origin(endpoint: &Url, url: &str) -> bool {
    Url::parse(url).is_ok_and(|u| {
        u.scheme() == endpoint.scheme()
            && u.host_str() == endpoint.host_str()
            && u.port_or_known_default() == endpoint.port_or_known_default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subscriptions_in_urls() {
        let cases = [
            (
                "https://m/subscriptions/abc/resourceGroups/g?api-version=1",
                Some("abc"),
            ),
            ("/subscriptions/abc?api-version=1", Some("abc")),
            ("/subscriptions/", None),
            ("https://m/providers/Microsoft.Compute/operations", None),
        ];
        for (url, expected) in cases {
            assert_eq!(subscription_of(url), expected, "{url}");
        }
    }

    #[test]
    fn polling_stays_on_the_endpoint() {
        let endpoint =
            Url::parse("https://management.azure.com").unwrap_or_else(|_| unreachable!());
        let cases = [
            (
                "https://management.azure.com/subscriptions/s/providers/Microsoft.Compute/locations/w/operations/1",
                true,
            ),
            ("https://management.azure.com:443/x", true),
            ("http://management.azure.com/x", false),
            ("https://evil.example/x", false),
            ("https://management.azure.com:8443/x", false),
            ("not a url", false),
        ];
        for (url, expected) in cases {
            assert_eq!(same_origin(&endpoint, url), expected, "{url}");
        }
    }
}
