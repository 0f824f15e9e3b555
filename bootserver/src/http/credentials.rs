//! The agent's credential routes ([`crate::credentials`]): `POST
//! /machines/<name>/attestation` (a TPM-mode machine's challenge) and `POST
//! /machines/<name>/credentials`. Both are HTTPS-only where `http.tls` is set, answer only
//! for a Machine that is not waiting to be claimed, and say "retry" or "refused" the same
//! way ([`IssueError::status`]).

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use axum::extract::{ConnectInfo, Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::de::DeserializeOwned;

use super::AppState;
use super::peer::{Channel, https_only, is_secure, origin};
use crate::backend::MachineRecord;
use crate::credentials::{IssueError, Issuer, Origin};

/// What both routes establish before they ask the issuer.
struct Asker {
    issuer: Arc<Issuer>,
    machine: Arc<MachineRecord>,
    peer: IpAddr,
    origin: Origin,
}

fn reply(state: &AppState, route: &'static str, code: StatusCode, text: String) -> Response {
    state.metrics.http_request(route, code.as_u16());
    (code, format!("{text}\n")).into_response()
}

/// The issuer, the Machine and who asks; or the answer that ends the request here.
fn asker(
    state: &AppState,
    route: &'static str,
    channel: Option<axum::Extension<Channel>>,
    name: &str,
    peer: SocketAddr,
) -> Result<Asker, Box<Response>> {
    let secure = is_secure(channel);
    if let Some(refusal) = https_only(state, route, channel) {
        return Err(Box::new(refusal));
    }
    let Some(issuer) = state.issuer.clone() else {
        return Err(Box::new(reply(
            state,
            route,
            StatusCode::NOT_FOUND,
            "this bootserver issues no credentials (configure `credentials`)".into(),
        )));
    };
    let peer = peer.ip();
    let Some(machine) = state.backend.machine_by_name(name) else {
        return Err(Box::new(reply(
            state,
            route,
            StatusCode::NOT_FOUND,
            "no such machine".into(),
        )));
    };
    // Checked here, before any nonce, token or TPM: a Machine anyone on the network could
    // have created by posting an inventory never gets a credential, whatever it presents.
    if machine.discovery_waiting {
        return Err(Box::new(reply(
            state,
            route,
            StatusCode::FORBIDDEN,
            "this Machine was discovered and waits to be claimed: no credentials until it is claimed".into(),
        )));
    }
    let origin = Origin {
        secure,
        ..origin(state, &machine, peer)
    };
    Ok(Asker {
        issuer,
        machine,
        peer,
        origin,
    })
}

fn body<T: DeserializeOwned + Default>(
    state: &AppState,
    route: &'static str,
    bytes: &[u8],
) -> Result<T, Box<Response>> {
    if bytes.is_empty() {
        return Ok(T::default());
    }
    serde_json::from_slice(bytes).map_err(|e| {
        Box::new(reply(
            state,
            route,
            StatusCode::BAD_REQUEST,
            format!("request body: {e}"),
        ))
    })
}

fn answer<T: serde::Serialize>(
    state: &AppState,
    route: &'static str,
    asker: &Asker,
    result: Result<T, IssueError>,
) -> Response {
    match result {
        Ok(value) => {
            state.metrics.http_request(route, 200);
            (
                [
                    (header::CONTENT_TYPE, "application/json"),
                    (header::CACHE_CONTROL, "no-store"),
                ],
                serde_json::to_string(&value).unwrap_or_default(),
            )
                .into_response()
        }
        Err(error) => {
            let (machine, peer) = (&asker.machine.name, asker.peer);
            tracing::warn!(%machine, %peer, route, reason = error.reason(), %error, "credentials refused");
            if let IssueError::Attestation(refusal) = &error {
                state
                    .backend
                    .report_refusal(machine, refusal.reason(), refusal.to_string());
            }
            let code =
                StatusCode::from_u16(error.status()).unwrap_or(StatusCode::SERVICE_UNAVAILABLE);
            let mut response = reply(state, route, code, error.to_string());
            if let Some(seconds) = error.retry_after() {
                response
                    .headers_mut()
                    .insert(header::RETRY_AFTER, header::HeaderValue::from(seconds));
            }
            response
        }
    }
}

/// A TPM attestation challenge ([`crate::credentials::attestation`]).
pub(super) async fn machine_attestation(
    State(state): State<AppState>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    channel: Option<axum::Extension<Channel>>,
    Path(name): Path<String>,
    bytes: axum::body::Bytes,
) -> Response {
    const ROUTE: &str = "/machines/{name}/attestation";
    let asker = match asker(&state, ROUTE, channel, &name, peer) {
        Ok(asker) => asker,
        Err(response) => return *response,
    };
    let request: unbounded_api::identity::AttestationRequest = match body(&state, ROUTE, &bytes) {
        Ok(request) => request,
        Err(response) => return *response,
    };
    let result = asker.issuer.challenge(
        &asker.machine.name,
        &asker.machine.identity,
        asker.origin,
        &request,
    );
    answer(&state, ROUTE, &asker, result)
}

/// The agent's credentials.
pub(super) async fn machine_credentials(
    State(state): State<AppState>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    channel: Option<axum::Extension<Channel>>,
    Path(name): Path<String>,
    headers: HeaderMap,
    bytes: axum::body::Bytes,
) -> Response {
    const ROUTE: &str = "/machines/{name}/credentials";
    let asker = match asker(&state, ROUTE, channel, &name, peer) {
        Ok(asker) => asker,
        Err(response) => return *response,
    };
    let request: unbounded_api::agent::CredentialRequest = match body(&state, ROUTE, &bytes) {
        Ok(request) => request,
        Err(response) => return *response,
    };
    let bearer = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    let result = asker
        .issuer
        .credentials(
            &asker.machine.name,
            &asker.machine.identity,
            asker.origin,
            bearer,
            &request,
        )
        .await
        .map(|mut credentials| {
            // Over TLS, the certificates to accept from now on: a rotation's next one is
            // learned by every agent at its next refresh, before it is served.
            if let (true, Some(tls)) = (asker.origin.secure, &state.tls) {
                credentials.tls_sha256.clone_from(&tls.pins);
            }
            credentials
        });
    answer(&state, ROUTE, &asker, result)
}
