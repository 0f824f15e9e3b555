//! The bootstrap controller outside the cluster, and waiting for Nodes, pods and the
//! controller's Lease.

use std::fs;
use std::time::{Duration, Instant};

use super::{ApplianceOptions, CONTROLLER_LEASE, SYSTEM_NAMESPACE, kubectl, step};
use crate::cluster::LocalControlPlane;
use crate::failure::Failure;
use crate::lab::base::LabError;
use crate::process::Process;

/// The controller binary with the controller's ServiceAccount (deploy/'s RBAC), outside the
/// cluster, competing for the same Lease as its pods will.
pub(super) fn bootstrap_controller(
    plane: &LocalControlPlane,
    options: &ApplianceOptions,
) -> Result<Process, LabError> {
    let ca = plane.data_dir().join("pki/ca.crt");
    let kubeconfig = options.dir.join("bootstrap-controller.kubeconfig");
    let text = crate::lab::base::service_account_kubeconfig(
        plane,
        "unbounded-controller",
        plane.server_url(),
        &ca,
    )?;
    fs::write(&kubeconfig, text).map_err(|e| Failure::new(kubeconfig.display(), e))?;
    let metrics_port = crate::bmc::free_port(false).map_err(Failure::of)?;
    Process::spawn(
        "controller (outside the cluster)",
        None,
        &options.controller,
        &[
            "--metrics-addr".into(),
            format!("127.0.0.1:{metrics_port}"),
            "--leader-election-identity".into(),
            "testbed-first-join".into(),
        ],
        &[
            ("KUBECONFIG", kubeconfig.display().to_string()),
            ("RUST_LOG", "info".into()),
        ],
        options.dir.join("bootstrap-controller.log"),
    )
}

/// Waits until `check` holds; on timeout the error names `what`, the last value seen and
/// `context()`.
pub(crate) fn wait_for(
    what: &str,
    timeout: Duration,
    mut check: impl FnMut() -> (bool, String),
    context: impl Fn() -> String,
) -> Result<(), LabError> {
    let deadline = Instant::now() + timeout;
    loop {
        let (done, seen) = check();
        if done {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(step(format!(
                "timed out after {} s waiting for {what}; last seen: {seen}\n{}",
                timeout.as_secs(),
                context()
            )));
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// Whether a Node exists (`Some`) and is Ready.
pub(super) fn node_ready(plane: &LocalControlPlane, name: &str) -> Option<bool> {
    let status = kubectl(
        plane,
        &[
            "get",
            "node",
            name,
            "-o",
            "jsonpath={.status.conditions[?(@.type==\"Ready\")].status}",
        ],
        None,
    )
    .ok()?;
    Some(status == "True")
}

/// Every Deployment of the project's namespace has all its replicas available.
pub(super) fn wait_for_pods(
    plane: &LocalControlPlane,
    timeout: Duration,
    context: impl Fn() -> String,
) -> Result<(), LabError> {
    wait_for(
        "every Deployment of unbounded-system available",
        timeout,
        || {
            let listing = kubectl(
                plane,
                &[
                    "get",
                    "deployments",
                    "-n",
                    SYSTEM_NAMESPACE,
                    "-o",
                    "jsonpath={range .items[*]}{.metadata.name}|{.spec.replicas}|{.status.availableReplicas}{\"\\n\"}{end}",
                ],
                None,
            )
            .unwrap_or_default();
            (deployments_available(&listing), pod_summary(plane))
        },
        context,
    )
}

/// Whether every `name|replicas|available` line has all its replicas available (and there is
/// at least one line).
pub fn deployments_available(listing: &str) -> bool {
    let mut any = false;
    for line in listing.lines().filter(|l| !l.trim().is_empty()) {
        any = true;
        let mut fields = line.split('|').skip(1);
        let wanted: u32 = fields.next().and_then(|v| v.parse().ok()).unwrap_or(1);
        let available: u32 = fields.next().and_then(|v| v.parse().ok()).unwrap_or(0);
        if available < wanted {
            return false;
        }
    }
    any
}

/// One line per pod of the project's namespace: name, phase, node and why a container waits.
pub(crate) fn pod_summary(plane: &LocalControlPlane) -> String {
    kubectl(
        plane,
        &[
            "get",
            "pods",
            "-n",
            SYSTEM_NAMESPACE,
            "-o",
            "jsonpath={range .items[*]}{.metadata.name} {.status.phase} on {.spec.nodeName}: {.status.containerStatuses[*].state.waiting.reason} {.status.containerStatuses[*].state.waiting.message}{\"\\n\"}{end}",
        ],
        None,
    )
    .unwrap_or_default()
}

/// The controller Lease's holder, or empty.
pub(super) fn lease_holder(plane: &LocalControlPlane) -> String {
    kubectl(
        plane,
        &[
            "get",
            "lease",
            "-n",
            SYSTEM_NAMESPACE,
            CONTROLLER_LEASE,
            "-o",
            "jsonpath={.spec.holderIdentity}",
        ],
        None,
    )
    .unwrap_or_default()
}

/// The names of the controller's pods.
pub(super) fn controller_pods(plane: &LocalControlPlane) -> Vec<String> {
    kubectl(
        plane,
        &[
            "get",
            "pods",
            "-n",
            SYSTEM_NAMESPACE,
            "-l",
            "app.kubernetes.io/name=unbounded-controller",
            "-o",
            "jsonpath={.items[*].metadata.name}",
        ],
        None,
    )
    .unwrap_or_default()
    .split_whitespace()
    .map(str::to_owned)
    .collect()
}
