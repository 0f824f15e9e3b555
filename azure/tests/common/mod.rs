//! A local stand-in for Azure: the Microsoft identity platform's token endpoint and Azure
//! Resource Manager for VMs, NICs and disks, over HTTPS on 127.0.0.1 with a CA made for the
//! test. There is no emulator for Azure compute; this plays its documented behaviour
//! (fixtures in `tests/fixtures/`, see its README): asynchronous operations that succeed, fail
//! or never end, throttling, error bodies. Every request is recorded (never its
//! Authorization header) so that tests can check what the provider asked for.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

mod faults;
mod operations;
pub mod process;
mod resource_manager;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};

pub use faults::Fault;

pub const TENANT: &str = "72f988bf-86f1-41af-91ab-2d7cd011db47";
pub const CLIENT_ID: &str = "3f1e0b2c-5d7a-4c8e-9b6f-0a1b2c3d4e5f";

/// One request as the fake saw it.
#[derive(Debug, Clone)]
pub struct Recorded {
    pub method: String,
    pub path: String,
    pub query: String,
    pub body: Value,
    pub status: u16,
    pub at: Instant,
}

/// What the fake knows and has done.
#[derive(Debug, Default)]
pub struct State {
    /// Client secrets accepted for CLIENT_ID in TENANT.
    pub client_secrets: BTreeSet<String>,
    /// Federated tokens accepted (workload identity).
    pub federated_tokens: BTreeSet<String>,
    tokens: BTreeSet<String>,
    /// Resource groups that exist, as `subscription/group` (lower case).
    pub groups: BTreeSet<String>,
    /// Resource groups the identity may not write to, as `subscription/group` (lower case).
    pub denied_groups: BTreeSet<String>,
    /// Subnet IDs that exist (lower case).
    pub subnets: BTreeSet<String>,
    /// VM sizes whose quota is used up.
    pub quota_exhausted_sizes: BTreeSet<String>,
    /// Image SKUs that do not exist.
    pub unknown_skus: BTreeSet<String>,
    /// Resources by lower-case ID.
    pub resources: BTreeMap<String, Value>,
    operations: HashMap<String, operations::Operation>,
    custom_data: HashMap<String, String>,
    pub faults: Vec<Fault>,
    pub requests: Vec<Recorded>,
    counter: u64,
    /// How long an asynchronous operation runs.
    pub operation_time: Duration,
    pub origin: String,
}

impl State {
    fn next(&mut self) -> u64 {
        self.counter += 1;
        self.counter
    }
}

/// The fake, serving until dropped.
pub struct FakeAzure {
    pub origin: String,
    pub ca_file: PathBuf,
    pub state: Arc<Mutex<State>>,
    _dir: tempfile::TempDir,
    server: tokio::task::JoinHandle<()>,
}

impl Drop for FakeAzure {
    fn drop(&mut self) {
        self.server.abort();
    }
}

struct TlsListener {
    tcp: tokio::net::TcpListener,
    acceptor: TlsAcceptor,
}

impl axum::serve::Listener for TlsListener {
    type Io = tokio_rustls::server::TlsStream<tokio::net::TcpStream>;
    type Addr = std::net::SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            let Ok((stream, addr)) = self.tcp.accept().await else {
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            };
            if let Ok(Ok(tls)) =
                tokio::time::timeout(Duration::from_secs(10), self.acceptor.accept(stream)).await
            {
                return (tls, addr);
            }
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        self.tcp.local_addr()
    }
}

impl FakeAzure {
    /// Starts the fake on a free port of 127.0.0.1.
    pub async fn start() -> Self {
        let dir = tempfile::tempdir().unwrap();
        // A CA and a serving certificate for 127.0.0.1 (rustls refuses a CA as the server's own).
        let pki = unbounded_testbed::cluster::ca_and_server(dir.path(), "127.0.0.1").unwrap();
        let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&pki.cert)
            .unwrap()
            .map(Result::unwrap)
            .collect();
        let key = PrivateKeyDer::from_pem_file(&pki.key).unwrap();
        let config = tokio_rustls::rustls::ServerConfig::builder_with_provider(Arc::new(
            tokio_rustls::rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .unwrap();
        let tcp = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let origin = format!("https://127.0.0.1:{}", tcp.local_addr().unwrap().port());
        let state = Arc::new(Mutex::new(State {
            operation_time: Duration::from_millis(1500),
            origin: origin.clone(),
            ..State::default()
        }));
        let listener = TlsListener {
            tcp,
            acceptor: TlsAcceptor::from(Arc::new(config)),
        };
        let shared = state.clone();
        let app = axum::Router::new().fallback(
            move |method: Method, uri: Uri, headers: HeaderMap, body: Bytes| {
                let state = shared.clone();
                async move { handle(&state, &method, &uri, &headers, &body) }
            },
        );
        let server = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Self {
            origin,
            ca_file: pki.ca.clone(),
            state,
            _dir: dir,
            server,
        }
    }

    pub fn with<R>(&self, f: impl FnOnce(&mut State) -> R) -> R {
        f(&mut self.state.lock().unwrap())
    }

    pub fn add_fault(&self, fault: Fault) {
        self.with(|s| s.faults.push(fault));
    }

    pub fn requests(&self) -> Vec<Recorded> {
        self.with(|s| s.requests.clone())
    }

    /// Requests whose method matches and whose lower-case path contains `fragment`.
    pub fn requests_to(&self, method: &str, fragment: &str) -> Vec<Recorded> {
        let fragment = fragment.to_ascii_lowercase();
        self.requests()
            .into_iter()
            .filter(|r| r.method == method && r.path.to_ascii_lowercase().contains(&fragment))
            .collect()
    }

    pub fn resource(&self, id: &str) -> Option<Value> {
        self.with(|s| s.resources.get(&id.to_ascii_lowercase()).cloned())
    }

    /// Removes a resource behind the provider's back.
    pub fn remove(&self, id: &str) -> Option<Value> {
        self.with(|s| s.resources.remove(&id.to_ascii_lowercase()))
    }

    pub fn resource_ids(&self) -> Vec<String> {
        self.with(|s| s.resources.keys().cloned().collect())
    }
}

/// An ARM error body.
pub fn arm_error(status: u16, code: &str, message: &str) -> (u16, Vec<(String, String)>, Value) {
    (
        status,
        vec![],
        json!({"error": {"code": code, "message": message}}),
    )
}

fn handle(
    state: &Mutex<State>,
    method: &Method,
    uri: &Uri,
    headers: &HeaderMap,
    body: &[u8],
) -> Response {
    let mut state = state.lock().unwrap();
    let path = uri.path().to_owned();
    let query = uri.query().unwrap_or_default().to_owned();
    let parsed: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    let (status, extra_headers, answer) = if path.ends_with("/oauth2/v2.0/token") {
        token(&mut state, &path, body)
    } else {
        let bearer = headers
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .unwrap_or_default();
        if !state.tokens.contains(bearer) {
            arm_error(
                401,
                "InvalidAuthenticationToken",
                "The access token is invalid.",
            )
        } else {
            resource_manager::handle(&mut state, method.as_str(), &path, &query, &parsed)
        }
    };
    state.requests.push(Recorded {
        method: method.to_string(),
        path,
        query,
        // The token request's form carries the client secret: keep only its field names.
        body: if uri.path().ends_with("/token") {
            Value::Null
        } else {
            parsed
        },
        status,
        at: Instant::now(),
    });
    let mut response = (
        StatusCode::from_u16(status).unwrap(),
        if answer.is_null() {
            String::new()
        } else {
            answer.to_string()
        },
    )
        .into_response();
    let h = response.headers_mut();
    h.insert("content-type", "application/json".parse().unwrap());
    let id = state.next();
    h.insert("x-ms-request-id", format!("fake-{id}").parse().unwrap());
    for (name, value) in extra_headers {
        h.insert(
            axum::http::HeaderName::from_bytes(name.as_bytes()).unwrap(),
            value.parse().unwrap(),
        );
    }
    response
}

/// The identity platform's token endpoint (`/{tenant}/oauth2/v2.0/token`): client secrets and
/// client assertions (workload identity).
fn token(state: &mut State, path: &str, body: &[u8]) -> (u16, Vec<(String, String)>, Value) {
    let form: HashMap<String, String> = url::form_urlencoded::parse(body).into_owned().collect();
    let tenant_ok = path.trim_start_matches('/').starts_with(TENANT);
    let client_ok = form.get("client_id").map(String::as_str) == Some(CLIENT_ID);
    let secret_ok = form
        .get("client_secret")
        .is_some_and(|s| state.client_secrets.contains(s));
    let assertion_ok = form.get("client_assertion_type").map(String::as_str)
        == Some("urn:ietf:params:oauth:client-assertion-type:jwt-bearer")
        && form
            .get("client_assertion")
            .is_some_and(|a| state.federated_tokens.contains(a));
    let scope_ok = form
        .get("scope")
        .is_some_and(|s| *s == format!("{}/.default", state.origin));
    if !(tenant_ok && client_ok && scope_ok && (secret_ok || assertion_ok)) {
        return (
            401,
            vec![],
            json!({
                "error": "invalid_client",
                "error_description": "AADSTS7000215: Invalid client secret provided. Ensure the secret being sent in the request is the client secret value, not the client secret ID.",
                "error_codes": [7000215],
            }),
        );
    }
    let token = format!("fake-arm-token-{}", state.next());
    state.tokens.insert(token.clone());
    (
        200,
        vec![],
        json!({"token_type": "Bearer", "expires_in": 3599, "ext_expires_in": 3599, "access_token": token}),
    )
}

/// Waits for `check`, a bound on real progress; prints `context()` when it expires.
#[allow(unused_imports)] // not every test binary uses it
pub use unbounded_testbed::testkit::wait_until_explained as wait_until;
