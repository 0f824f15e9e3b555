//! Readiness of a component that only talks to the API server (the controller, the Azure
//! provider): ready while the API server answers it. A replica cut off from the API server
//! (a partition, a revoked credential) then shows as not ready, leader or follower alike,
//! and a rollout waits for it. Kubelet asks once per probe period; each question is one
//! cheap request (`GET /version`), bounded by a timeout shorter than the probe's.

use std::time::Duration;

use kube::Client;

/// How long a readiness check waits for the API server.
pub const READY_TIMEOUT: Duration = Duration::from_secs(2);

/// `Ok` when the API server answered `client` within `timeout`; otherwise why not (no
/// credential in it: kube's errors name the URL and the status).
pub async fn api_server_answers(client: &Client, timeout: Duration) -> Result<(), String> {
    match tokio::time::timeout(timeout, client.apiserver_version()).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(error)) => Err(format!("the API server refused or failed: {error}")),
        Err(_) => Err(format!(
            "the API server did not answer within {} s",
            timeout.as_secs()
        )),
    }
}

/// The answer to `GET /readyz`: 200 `ok`, or 503 with why not.
pub async fn readyz(client: Client) -> (http::StatusCode, String) {
    match api_server_answers(&client, READY_TIMEOUT).await {
        Ok(()) => (http::StatusCode::OK, "ok".to_owned()),
        Err(why) => (http::StatusCode::SERVICE_UNAVAILABLE, why),
    }
}
