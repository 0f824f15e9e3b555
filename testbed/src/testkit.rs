//! What every crate's tests share, so that no crate keeps a copy: waiting for a condition,
//! `kubectl` against the local control plane, a Node played by the test (registered, made
//! Ready or not), and the process's log kept in memory. (The control plane itself is
//! [`crate::cluster::LocalControlPlane`], its PKI [`crate::cluster`]'s.) A panic is a test's
//! failure report here, as in the tests.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::future::Future;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;
use kube::Client;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;

use crate::cluster::LocalControlPlane;

/// How long [`wait_for`] waits.
pub const TIMEOUT: Duration = Duration::from_secs(60);

/// Polls `check` every 200 ms until it gives a value; fails the test, naming `what`, after
/// [`TIMEOUT`].
pub async fn wait_for<T, F, Fut>(what: &str, check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    wait_for_within(what, TIMEOUT, check).await
}

/// [`wait_for`] with a timeout of its own.
pub async fn wait_for_within<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// How long [`wait_for_slow`] waits.
pub const SLOW_TIMEOUT: Duration = Duration::from_secs(90);

/// [`wait_for`] for what takes longer than a watch's event: a BMC emulator's read, a run of
/// the kubectl plugin; fails after [`SLOW_TIMEOUT`].
pub async fn wait_for_slow<T, F, Fut>(what: &str, check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    wait_for_within(what, SLOW_TIMEOUT, check).await
}

/// Runs kubectl against `cp` with `args` (and `stdin`); whether it succeeded, and what it
/// printed (standard output, then standard error).
pub fn kubectl(cp: &LocalControlPlane, args: &[&str], stdin: Option<&str>) -> (bool, String) {
    let output = crate::cluster::kubectl_output(cp.kubectl(), args, stdin).expect("kubectl");
    (
        output.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        ),
    )
}

/// kubectl that must succeed; its standard output (a failure names the command and what it
/// printed on standard error).
pub fn kubectl_ok(cp: &LocalControlPlane, args: &[&str], stdin: Option<&str>) -> String {
    cp.kubectl_with_input(args, stdin)
        .unwrap_or_else(|e| panic!("{e}"))
}

/// Plays the kubelet: registers a Node, Ready or not.
pub async fn create_node(client: &Client, name: &str, ready: bool) -> Node {
    let api: Api<Node> = Api::all(client.clone());
    api.create(&PostParams::default(), &unregistered(name))
        .await
        .expect("create node");
    patch_ready(client, name, ready, "2026-01-01T00:00:00Z")
        .await
        .expect("node status")
}

/// Plays a kubelet that comes up again: registers a Ready Node unless it exists (a test's
/// stand-in kubelet that may race its own earlier registration).
pub async fn create_node_unless_exists(client: &Client, name: &str) -> Result<(), kube::Error> {
    let api: Api<Node> = Api::all(client.clone());
    match api
        .create(&PostParams::default(), &unregistered(name))
        .await
    {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 409 => return Ok(()),
        Err(e) => return Err(e),
    }
    set_node_ready(client, name, true).await
}

/// Sets a Node's Ready condition, as its kubelet would (its heartbeat now).
pub async fn set_node_ready(client: &Client, name: &str, ready: bool) -> Result<(), kube::Error> {
    let now = k8s_openapi::jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string();
    patch_ready(client, name, ready, &now).await.map(drop)
}

fn unregistered(name: &str) -> Node {
    serde_json::from_value(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}}))
        .unwrap()
}

/// The Node's Ready condition, its heartbeat and transition at `at` (RFC 3339).
async fn patch_ready(
    client: &Client,
    name: &str,
    ready: bool,
    at: &str,
) -> Result<Node, kube::Error> {
    let api: Api<Node> = Api::all(client.clone());
    let status = if ready { "True" } else { "False" };
    let patch = json!({"status": {"conditions": [{
        "type": "Ready", "status": status, "reason": "KubeletReady", "message": "simulated",
        "lastHeartbeatTime": at, "lastTransitionTime": at}]}});
    api.patch_status(name, &PatchParams::default(), &Patch::Merge(patch))
        .await
}

/// This process's log, kept in memory (tracing's global subscriber, every thread's events),
/// so that a test can wait for what the code under test said, or scan it for a secret.
#[derive(Clone, Default)]
pub struct CapturedLog(Arc<Mutex<Vec<u8>>>);

impl CapturedLog {
    /// The process's capture, installed on first use with `filter` (an `EnvFilter`
    /// directive such as `debug,ipmi_rs=warn`); later calls get the same capture whatever
    /// their filter (a process has one global subscriber).
    pub fn install(filter: &str) -> &'static CapturedLog {
        static LOG: OnceLock<CapturedLog> = OnceLock::new();
        LOG.get_or_init(|| {
            let log = CapturedLog::default();
            let subscriber = tracing_subscriber::fmt()
                .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
                .with_ansi(false)
                .with_writer(log.clone())
                .finish();
            tracing::subscriber::set_global_default(subscriber).expect("the only subscriber");
            log
        })
    }

    /// Everything logged so far.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

impl std::fmt::Debug for CapturedLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CapturedLog").finish_non_exhaustive()
    }
}

impl std::io::Write for CapturedLog {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for CapturedLog {
    type Writer = CapturedLog;

    fn make_writer(&'a self) -> Self::Writer {
        self.clone()
    }
}

/// Polls `check` every 200 ms until it is true; fails the test, naming `what`, after
/// `timeout`.
pub async fn wait_until<F, Fut>(what: &str, timeout: Duration, check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    wait_until_explained(what, timeout, String::new, check).await;
}

/// [`wait_until`] that adds `context()` (a log, a state) to the failure, read only then.
pub async fn wait_until_explained<F, Fut>(
    what: &str,
    timeout: Duration,
    context: impl Fn() -> String,
    mut check: F,
) where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + timeout;
    while !check().await {
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}\n{}",
            context()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// [`wait_until`] for a test that does not run on tokio: polls `check` every 200 ms on this
/// thread.
pub fn wait_until_blocking(what: &str, timeout: Duration, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !check() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(200));
    }
}
