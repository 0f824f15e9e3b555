//! HTTP (axum): per-machine iPXE scripts, images with `Range` and `HEAD`, the iPXE builds for
//! UEFI HTTP boot, the agent's configuration route, health and metrics.
//!
//! | route | what |
//! |---|---|
//! | `GET /boot.ipxe?mac=<mac>` | the machine's iPXE script; without `mac`, a script that asks again with `${net0/mac}` |
//! | `GET /discover.ipxe?mac=<mac>` | with discovery on, the inspection boot of a MAC no Machine has (or a discovered Machine waiting to be claimed) |
//! | `POST /discovery/inventory` | an inspection agent's [`DiscoveryReport`] ([`crate::discovery_writes`]) |
//! | `GET,HEAD /images/<path>` | kernels, initrds, node images from the images directory |
//! | `GET,HEAD /ipxe/<path>` | the iPXE builds (UEFI HTTP boot) |
//! | `GET /machines/<name>/config` | the agent's configuration: only to the machine itself |
//! | `/healthz`, `/readyz`, `/metrics` | liveness, backend synced, Prometheus |
//!
//! The same three answer on the probe address (`--probe-addr`, [`probe_router`]) from the
//! moment the process starts: while the start-up check ([`crate::preflight`]) finds
//! problems, `/readyz` answers 503 with each problem on a line of its own.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::extract::{ConnectInfo, Path, Query, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use prometheus_client::registry::Registry;
use tower_http::catch_panic::CatchPanicLayer;
use tower_http::services::ServeDir;

use crate::backend::{MacAddr, MachineBackend};
use crate::boot;
use crate::config::Settings;
use crate::credentials::Issuer;
use crate::dhcp::settings::UnknownMachines;
use crate::discovery_writes::DiscoveryWriter;
use crate::files::{self, InlineFs};
use crate::identity::{self, PxeExchanges};
use crate::leases::Leases;
use crate::metrics::{Metrics, Service};
use crate::preflight::Readiness;
pub use peer::Channel;
use peer::{evidence, holds_address, https_only, unvouched_script};
use unbounded_api::identity::IdentityMode;
use unbounded_api::inventory::{DISCOVERY_CLAIM_PATH, DISCOVERY_REPORT_PATH};

mod credentials;
mod discovery;
mod peer;
pub mod sendfile;
pub mod settings;
pub mod tls;

/// What the handlers share.
#[derive(Clone)]
pub struct AppState {
    /// Settings.
    pub settings: Arc<Settings>,
    /// Machines.
    pub backend: Arc<dyn MachineBackend>,
    /// Leases, to know which address a machine has.
    pub leases: Arc<Leases>,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// The registry `/metrics` renders.
    pub registry: Arc<Registry>,
    /// Issues agent credentials (Kubernetes backend with `credentials` configured).
    pub issuer: Option<Arc<Issuer>>,
    /// Writes discovery reports (Kubernetes backend with `unknownMachines: discover`).
    pub discovery: Option<Arc<DiscoveryWriter>>,
    /// The PXE boot-server exchanges DHCP answered ([`crate::identity`]).
    pub exchanges: Arc<PxeExchanges>,
    /// The HTTPS endpoint for credentials and configuration, when `http.tls` is set.
    pub tls: Option<tls::TlsEndpoint>,
}

impl std::fmt::Debug for AppState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppState")
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

/// The router. Images are read on the request's task in large chunks ([`files`]), or sent
/// by the kernel when the connection came through [`sendfile::FileSendListener`]
/// ([`around_each_request`]). A panic in a handler is caught (tower-http's `CatchPanicLayer`): that
/// request gets a 500, the panic is logged and counted, and the server goes on.
pub fn router(state: AppState) -> Router {
    let images = ServeDir::with_backend(&state.settings.http.images_dir, InlineFs)
        .with_buf_chunk_size(files::CHUNK_BYTES);
    let ipxe = ServeDir::with_backend(&state.settings.tftp.root, InlineFs)
        .with_buf_chunk_size(files::CHUNK_BYTES);
    let panics = state.metrics.clone();
    let file_metrics = state.metrics.clone();
    let on_panic = move |panic: Box<dyn std::any::Any + Send + 'static>| {
        tracing::error!(
            panic = crate::dhcp::serve::panic_message(panic.as_ref()),
            "HTTP: a panic while handling a request; answered 500"
        );
        panics.panic(Service::Http);
        (StatusCode::INTERNAL_SERVER_ERROR, "internal error\n").into_response()
    };
    Router::new()
        .route("/boot.ipxe", get(boot_script))
        .route("/discover.ipxe", get(discovery::discover_script))
        .route(DISCOVERY_REPORT_PATH, post(discovery::discovery_report))
        .route(
            &format!("{DISCOVERY_CLAIM_PATH}/{{mac}}"),
            get(discovery::discovery_claim),
        )
        .route("/machines/{name}/config", get(machine_config))
        .route(
            "/machines/{name}/credentials",
            post(credentials::machine_credentials),
        )
        .route(
            "/machines/{name}/attestation",
            post(credentials::machine_attestation),
        )
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(ready))
        .route("/metrics", get(metrics))
        .nest_service("/images", images)
        .nest_service("/ipxe", ipxe)
        .with_state(state)
        .layer(axum::middleware::from_fn_with_state(
            file_metrics,
            around_each_request,
        ))
        .layer(CatchPanicLayer::custom(on_panic))
}

/// Around every request (one middleware: each costs a boxed service per request):
/// a path no file can have gets 404 ([`refuse_impossible_names`]); a request that came
/// through [`sendfile::FileSendListener`] gets the client's address as
/// `ConnectInfo<SocketAddr>` (what the handlers read), and a large file body sent with
/// `sendfile` in place of the one `ServeDir` read ([`sendfile`] has the why and the how).
async fn around_each_request(
    State(metrics): State<Arc<Metrics>>,
    mut request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    if let Some(refusal) = refuse_impossible_names(&request) {
        return refusal;
    }
    let Some(ConnectInfo(connection)) = request
        .extensions_mut()
        .remove::<ConnectInfo<sendfile::HttpConnection>>()
    else {
        return next.run(request).await;
    };
    request
        .extensions_mut()
        .insert(ConnectInfo(connection.peer));
    request.extensions_mut().insert(Channel {
        secure: connection.secure,
    });
    let Some(sends) = connection.sends else {
        return next.run(request).await;
    };
    let is_get = request.method() == axum::http::Method::GET;
    let (response, opened) = files::record_opened(next.run(request)).await;
    let Some(file) = opened.filter(|_| is_get) else {
        return response;
    };
    let Some((offset, length)) =
        sendfile::file_part(response.status().as_u16(), response.headers())
    else {
        return response;
    };
    if !sends.arm(file, offset, length, metrics.http_file_bytes_sent.clone()) {
        return response;
    }
    let (parts, _read_body) = response.into_parts();
    Response::from_parts(
        parts,
        axum::body::Body::new(sendfile::FileBody::new(length)),
    )
}

/// The longest file name Linux opens (`NAME_MAX`).
const NAME_MAX: usize = 255;

/// Whether any segment of a request path is, once percent-decoded, longer than a file name
/// can be.
fn has_overlong_segment(path: &str) -> bool {
    path.split('/').any(|segment| {
        let escapes = segment
            .as_bytes()
            .windows(3)
            .filter(|w| w[0] == b'%' && w[1].is_ascii_hexdigit() && w[2].is_ascii_hexdigit())
            .count();
        segment.len() - 2 * escapes > NAME_MAX
    })
}

/// Whether a request path names a file no file system can hold: a segment longer than
/// `NAME_MAX` once decoded, or a NUL byte (`%00`).
fn impossible_name(path: &str) -> bool {
    has_overlong_segment(path) || path.contains("%00")
}

/// 404 for a path no file can have. tower-http 0.7.1's `ServeDir` answers 500 when opening
/// such a name fails with `ENAMETOOLONG` (it maps only `NotFound` and `InvalidInput` to
/// 404), and to a `HEAD` of a name with a NUL byte (its `HEAD` path reads the metadata and
/// maps no error to 404); both found by the HTTP fuzz target
/// (`fuzz/regressions/http/file-name-too-long-500`, `head-of-a-nul-name-500`).
fn refuse_impossible_names(request: &axum::extract::Request) -> Option<Response> {
    impossible_name(request.uri().path())
        .then(|| (StatusCode::NOT_FOUND, "not found\n").into_response())
}

fn ipxe(state: &AppState, route: &str, script: String) -> Response {
    state.metrics.http_request(route, 200);
    (
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        script,
    )
        .into_response()
}

async fn boot_script(
    State(state): State<AppState>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    Query(query): Query<HashMap<String, String>>,
) -> Response {
    let base = state.settings.http_base_for(peer.ip());
    let Some(mac) = query.get("mac") else {
        return ipxe(&state, "/boot.ipxe", boot::chain_script(&base));
    };
    let Ok(mac) = mac.parse::<MacAddr>() else {
        return ipxe(
            &state,
            "/boot.ipxe",
            boot::refusal("the mac parameter is not a MAC address"),
        );
    };
    let discover = state.settings.dhcp.unknown_machines == UnknownMachines::Discover;
    let script = match state.backend.machine_by_mac(&mac) {
        // Discovered and not claimed: inspected again (its agent reports afresh), never
        // booted as itself, and no nonce.
        Some(machine) if machine.discovery_waiting => {
            if discover {
                format!("#!ipxe\nchain {base}/discover.ipxe?mac={mac}\n")
            } else {
                boot::refusal(&format!(
                    "machine {} was discovered and waits to be claimed; not booting it",
                    machine.name
                ))
            }
        }
        Some(machine) => {
            // A nonce only for a script that boots, served to the machine itself: a peer
            // the bootserver does not vouch for gets no script at all, and the reason.
            let nonce = match (&state.issuer, peer.ip(), &machine.boot) {
                (Some(issuer), peer, Some(_)) => {
                    let holds = holds_address(&state, &machine, peer);
                    match identity::vouch(&evidence(&state, &machine.macs, holds, peer)) {
                        Ok(()) => issuer.nonce_for_script(&machine.name, peer),
                        Err(why) => {
                            let script = unvouched_script(&state, &machine, peer, why);
                            return ipxe(&state, "/boot.ipxe", script);
                        }
                    }
                }
                _ => Ok(None),
            };
            // A TPM-mode machine's agent attests before it asks for credentials.
            let attest = state
                .issuer
                .as_ref()
                .is_some_and(|issuer| issuer.identity_mode(&machine.identity) == IdentityMode::Tpm);
            match (nonce, &state.tls) {
                // Over TLS the nonce stays here as this boot's ticket; the script carries
                // only where to redeem it and the certificate to trust there.
                (Ok(Some(_)), Some(tls)) => boot::machine_script(
                    &machine,
                    &base,
                    boot::AgentProof::Ticket {
                        url: tls.url_for(peer.ip()),
                        sha256: &tls.sha256_hex,
                    },
                    attest,
                ),
                (Ok(Some(nonce)), None) => {
                    boot::machine_script(&machine, &base, boot::AgentProof::Nonce(&nonce), attest)
                }
                (Ok(None), _) => {
                    boot::machine_script(&machine, &base, boot::AgentProof::None, attest)
                }
                // A script whose nonce could not be kept would boot an agent that can never
                // authenticate: iPXE asks again instead.
                (Err(error), _) => {
                    tracing::error!(machine = %machine.name, %error, "boot script withheld: its nonce could not be recorded");
                    boot::retry_later(&format!("{base}/boot.ipxe?mac={mac}"))
                }
            }
        }
        None if discover => {
            format!("#!ipxe\nchain {base}/discover.ipxe?mac={mac}\n")
        }
        None => boot::refusal(&format!("{mac} belongs to no Machine; not booting it")),
    };
    ipxe(&state, "/boot.ipxe", script)
}

/// The agent's configuration. A machine gets only its own: the request must come from an
/// address the machine holds (its reservation or its current lease). The agent issue adds
/// per-machine credentials on top.
async fn machine_config(
    State(state): State<AppState>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    channel: Option<axum::Extension<Channel>>,
    Path(name): Path<String>,
) -> Response {
    let route = "/machines/{name}/config";
    if let Some(refusal) = https_only(&state, route, channel) {
        return refusal;
    }
    let peer_ip = peer.ip();
    let machine = state.backend.machine_by_name(&name);
    let Some(machine) = machine else {
        state.metrics.http_request(route, 404);
        return (StatusCode::NOT_FOUND, "no such machine\n").into_response();
    };
    if machine.discovery_waiting {
        state.metrics.http_request(route, 403);
        return (
            StatusCode::FORBIDDEN,
            "this Machine was discovered and waits to be claimed: it has no configuration\n",
        )
            .into_response();
    }
    if !holds_address(&state, &machine, peer_ip) {
        state.metrics.http_request(route, 403);
        return (
            StatusCode::FORBIDDEN,
            "a machine may read only its own configuration\n",
        )
            .into_response();
    }
    state.metrics.http_request(route, 200);
    let body = serde_json::json!({
        "machine": machine.name,
        "hostname": machine.hostname,
        "bootserver": state.settings.http_base_for(peer_ip),
        "configuration": machine.boot.as_ref().and_then(|b| b.configuration.clone()),
    });
    (
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

/// The health routes on their own listener (`--probe-addr`): the kubelet probes the pod's
/// address, which with `hostNetwork` is the node's, not necessarily `serverAddress`; and
/// they must answer while the start-up check keeps the boot services off.
#[derive(Debug)]
pub struct Probe {
    /// The start-up check's problems.
    pub readiness: Arc<Readiness>,
    /// The running server's state, once it runs.
    serving: std::sync::OnceLock<AppState>,
}

impl Probe {
    /// A probe for a server that has not started.
    pub fn new(readiness: Arc<Readiness>) -> Self {
        Self {
            readiness,
            serving: std::sync::OnceLock::new(),
        }
    }

    /// Records that the server runs with `state`: `/readyz` and `/metrics` are then its own.
    pub fn serving(&self, state: AppState) {
        let _ = self.serving.set(state);
    }
}

/// `/healthz`, `/readyz` and `/metrics` for a [`Probe`].
pub fn probe_router(probe: Arc<Probe>) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(probe_ready))
        .route("/metrics", get(probe_metrics))
        .with_state(probe)
}

/// 503 with the start-up check's problems, one per line.
fn not_ready(problems: &[String]) -> Response {
    let mut body = String::from("not serving: the start-up check found problems\n");
    for problem in problems {
        body.push_str(problem);
        body.push('\n');
    }
    (StatusCode::SERVICE_UNAVAILABLE, body).into_response()
}

async fn probe_ready(State(probe): State<Arc<Probe>>) -> Response {
    let problems = probe.readiness.problems();
    if !problems.is_empty() {
        return not_ready(&problems);
    }
    match probe.serving.get() {
        Some(state) => ready(State(state.clone())).await,
        None => (StatusCode::SERVICE_UNAVAILABLE, "starting\n").into_response(),
    }
}

async fn probe_metrics(State(probe): State<Arc<Probe>>) -> Response {
    match probe.serving.get() {
        Some(state) => metrics(State(state.clone())).await,
        None => (StatusCode::SERVICE_UNAVAILABLE, "starting\n").into_response(),
    }
}

async fn ready(State(state): State<AppState>) -> Response {
    if !state.backend.is_ready() {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            "machine cache not synced\n",
        )
            .into_response();
    }
    if state.leases.log_health().0 {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            "the lease log cannot be written (disk full?): no DHCP ACK until it can\n",
        )
            .into_response();
    }
    (StatusCode::OK, "ready\n").into_response()
}

async fn metrics(State(state): State<AppState>) -> Response {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    state
        .metrics
        .active_leases
        .set(i64::try_from(state.leases.active(now).unwrap_or(0)).unwrap_or(i64::MAX));
    let (failing, failed_writes) = state.leases.log_health();
    state.metrics.dhcp_lease_log_failing.set(i64::from(failing));
    state
        .metrics
        .dhcp_lease_log_failed_writes
        .set(i64::try_from(failed_writes).unwrap_or(i64::MAX));
    let mut text = String::new();
    if prometheus_client::encoding::text::encode(&mut text, &state.registry).is_err() {
        return StatusCode::INTERNAL_SERVER_ERROR.into_response();
    }
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        text,
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overlong_segments_are_found_after_decoding() {
        let long = "a".repeat(256);
        let escaped = "%61".repeat(100);
        let cases = [
            ("/images/vmlinuz", false),
            (&*format!("/images/{}", "a".repeat(255)), false),
            (&*format!("/images/{long}"), true),
            (&*format!("/ipxe/{long}/x"), true),
            (&*format!("/images/{escaped}"), false),
            ("/images/%zz%", false),
        ];
        for (path, overlong) in cases {
            assert_eq!(has_overlong_segment(path), overlong, "{path}");
        }
        assert!(impossible_name("/images/a%00b"));
        assert!(!impossible_name("/images/a%200b"));
    }
}
