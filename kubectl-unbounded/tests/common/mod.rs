//! Shared by the plugin's integration tests: the local control plane (a real kube-apiserver
//! with etcd and the CRDs), the plugin binary run against it, and objects written the way
//! the controller, the providers and the agent write them.

#![allow(clippy::unwrap_used, clippy::expect_used, dead_code)] // a panic is the test failure report

use std::process::Stdio;
use std::time::Duration;

use kube::Client;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use unbounded_api::well_known::labels;
use unbounded_api::{Machine, MachineConfiguration, MachineOperation};
use unbounded_testbed::cluster::LocalControlPlane;

pub const TIMEOUT: Duration = unbounded_testbed::testkit::SLOW_TIMEOUT;

// Not every test binary uses it.
#[allow(unused_imports)]
pub use unbounded_testbed::testkit::create_node;
/// Polls `check` until it returns Some, or panics after [`TIMEOUT`] with `what`: the
/// testkit's wait for slow things (a run of the plugin), under the name the tests use.
pub use unbounded_testbed::testkit::wait_for_slow as wait_for;

pub fn control_plane() -> &'static LocalControlPlane {
    LocalControlPlane::shared().expect("local control plane")
}

pub async fn client() -> Client {
    control_plane().client().await.expect("client")
}

/// What one run of the plugin did.
#[derive(Debug)]
pub struct Run {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

/// Runs `kubectl-unbounded --kubeconfig <plane> <args>` with no terminal and no input.
pub async fn plugin(args: &[&str]) -> Run {
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_kubectl-unbounded"))
        .arg("--kubeconfig")
        .arg(control_plane().kubeconfig_path())
        .args(args)
        .env_remove("NO_COLOR")
        .stdin(Stdio::null())
        .output()
        .await
        .expect("run kubectl-unbounded");
    Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// The plugin started with `args` against the test control plane, its output piped, for a
/// test that reads it while it runs (stopped with [`interrupt`]).
pub fn spawn_plugin(args: &[&str]) -> tokio::process::Child {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_kubectl-unbounded"))
        .arg("--kubeconfig")
        .arg(control_plane().kubeconfig_path())
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap()
}

/// Ctrl-C to a running plugin; its exit and the output it had left.
pub async fn interrupt(child: tokio::process::Child) -> std::process::Output {
    let pid = child.id().unwrap();
    std::process::Command::new("kill")
        .args(["-INT", &pid.to_string()])
        .status()
        .unwrap();
    tokio::time::timeout(TIMEOUT, child.wait_with_output())
        .await
        .expect("the plugin ends on Ctrl-C")
        .unwrap()
}

/// Creates a Machine (`spec` merged over `provider: manual`).
pub async fn create_machine(client: &Client, name: &str, labels: Value, spec: Value) -> Machine {
    let mut full = json!({"provider": "manual"});
    for (k, v) in spec.as_object().cloned().unwrap_or_default() {
        full[k] = v;
    }
    let object: Machine = serde_json::from_value(json!({
        "apiVersion": "unbounded-cloud.io/v1alpha1", "kind": "Machine",
        "metadata": {"name": name, "labels": labels}, "spec": full,
    }))
    .unwrap();
    Api::<Machine>::all(client.clone())
        .create(&PostParams::default(), &object)
        .await
        .expect("create machine")
}

/// A PXE Machine, with or without a BMC.
pub async fn create_pxe_machine(client: &Client, name: &str, labels: Value, mac: u8, bmc: bool) {
    let mut pxe = json!({"macAddresses": [format!("52:54:00:29:00:{mac:02x}")]});
    if bmc {
        pxe["bmc"] = json!({"address": "ipmi://192.0.2.1:623",
            "credentialsSecretRef": {"namespace": "default", "name": "bmc"}});
    }
    create_machine(client, name, labels, json!({"provider": "pxe", "pxe": pxe})).await;
}

/// Writes a Machine's status as its components would (merge patch on the status).
pub async fn set_machine_status(client: &Client, name: &str, status: Value) {
    Api::<Machine>::all(client.clone())
        .patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": status})),
        )
        .await
        .expect("machine status");
}

/// A condition as the components write it.
pub fn condition(type_: &str, status: &str, reason: &str, message: &str) -> Value {
    json!({"type": type_, "status": status, "reason": reason, "message": message,
           "lastTransitionTime": "2026-01-01T00:00:00Z"})
}

/// Creates a MachineConfiguration.
pub async fn create_configuration(client: &Client, name: &str, spec: Value) {
    let object: MachineConfiguration = serde_json::from_value(json!({
        "apiVersion": "unbounded-cloud.io/v1alpha1", "kind": "MachineConfiguration",
        "metadata": {"name": name}, "spec": spec,
    }))
    .unwrap();
    Api::<MachineConfiguration>::all(client.clone())
        .create(&PostParams::default(), &object)
        .await
        .expect("create configuration");
}

/// Writes a configuration's status as the controller would: these versions, deployed or not.
pub async fn set_versions(client: &Client, name: &str, versions: &[(i64, bool)]) {
    let latest = versions.iter().map(|v| v.0).max().unwrap_or(0);
    let list: Vec<Value> = versions
        .iter()
        .map(|(v, d)| json!({"name": format!("{name}-v{v}"), "version": v, "deployed": d, "machineCount": 0}))
        .collect();
    Api::<MachineConfiguration>::all(client.clone())
        .patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"latestVersion": latest, "versions": list}})),
        )
        .await
        .expect("configuration status");
}

/// The MachineOperations on `machine` (by the label the plugin and the controller set).
pub async fn operations_on(client: &Client, machine: &str) -> Vec<MachineOperation> {
    Api::<MachineOperation>::all(client.clone())
        .list(&ListParams::default().labels(&format!("{}={machine}", labels::MACHINE)))
        .await
        .expect("list operations")
        .items
}

pub async fn machine(client: &Client, name: &str) -> Machine {
    Api::<Machine>::all(client.clone())
        .get(name)
        .await
        .expect("get machine")
}
