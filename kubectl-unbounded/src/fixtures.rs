//! Objects for the unit tests, written as the API server would return them.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic is the test failure report

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::jiff::Timestamp;
use serde_json::{Value, json};
use unbounded_api::{Machine, MachineConfiguration, MachineOperation, MachinePool};

/// The moment the tests call "now".
pub fn now() -> Timestamp {
    "2026-11-26T12:00:00Z".parse().unwrap()
}

/// A Machine with `spec` (provider manual unless given) and `status`.
pub fn machine(name: &str, labels: Value, spec: Value, status: Value) -> Machine {
    let mut full_spec = json!({"provider": "manual"});
    for (k, v) in spec.as_object().cloned().unwrap_or_default() {
        full_spec[k] = v;
    }
    let mut object = json!({
        "apiVersion": "unbounded-cloud.io/v1alpha1", "kind": "Machine",
        "metadata": {"name": name, "labels": labels}, "spec": full_spec,
    });
    if !status.is_null() {
        object["status"] = status;
    }
    serde_json::from_value(object).unwrap()
}

/// A condition as the controller writes it.
pub fn condition(type_: &str, status: &str, reason: &str, message: &str, since: &str) -> Value {
    json!({"type": type_, "status": status, "reason": reason, "message": message,
           "lastTransitionTime": since})
}

/// A Running machine on `configuration` v`version` with every condition True.
pub fn running(name: &str, configuration: &str, version: i64) -> Machine {
    let t = "2026-11-26T10:00:00Z";
    machine(
        name,
        json!({}),
        json!({}),
        json!({
            "phase": "Running",
            "configuration": {"name": configuration, "version": version},
            "nodeRef": {"name": name},
            "power": "On",
            "agent": {"version": "0.1.0", "bootID": "b1", "containerState": "running"},
            "conditions": [
                condition("ConfigurationResolved", "True", "ConfigurationResolved", "", t),
                condition("InfrastructureReady", "True", "Ready", "", t),
                condition("BootstrapReady", "True", "Paved", "", t),
                condition("NodeReady", "True", "NodeReady", "", t),
            ],
        }),
    )
}

/// A MachineConfiguration with `versions` (number, deployed) and a machine selector.
pub fn configuration(
    name: &str,
    priority: i32,
    selector: Option<Value>,
    versions: &[(i64, bool)],
) -> MachineConfiguration {
    let latest = versions.iter().map(|v| v.0).max().unwrap_or(0);
    let mut spec = json!({"priority": priority, "template": {}});
    if let Some(s) = selector {
        spec["machineSelector"] = s;
    }
    serde_json::from_value(json!({
        "apiVersion": "unbounded-cloud.io/v1alpha1", "kind": "MachineConfiguration",
        "metadata": {"name": name}, "spec": spec,
        "status": {"latestVersion": latest, "versions": versions.iter().map(|(v, d)| json!({
            "name": format!("{name}-v{v}"), "version": v, "deployed": d, "machineCount": 0,
        })).collect::<Vec<_>>()},
    }))
    .unwrap()
}

/// A Node, Ready or not.
pub fn node(name: &str, ready: bool) -> Node {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Node", "metadata": {"name": name},
        "status": {"conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}]},
    }))
    .unwrap()
}

/// A MachinePool of `provider`.
pub fn pool(name: &str, provider: &str, replicas: i32, ready: i32) -> MachinePool {
    let mut template = json!({"provider": provider});
    if provider == "pxe" {
        template["pxe"] = json!({"inventorySelector": {}});
    }
    serde_json::from_value(json!({
        "apiVersion": "unbounded-cloud.io/v1alpha1", "kind": "MachinePool",
        "metadata": {"name": name},
        "spec": {"replicas": replicas, "template": {"spec": template}},
        "status": {"replicas": replicas, "readyReplicas": ready, "updatedReplicas": replicas},
    }))
    .unwrap()
}

/// A MachineOperation on `machine` in `state` (none: no status yet).
pub fn operation(
    name: &str,
    machine: &str,
    operation: &str,
    state: Option<&str>,
) -> MachineOperation {
    let mut object = json!({
        "apiVersion": "unbounded-cloud.io/v1alpha1", "kind": "MachineOperation",
        "metadata": {"name": name},
        "spec": {"machineRef": {"name": machine}, "operationName": operation},
    });
    if let Some(state) = state {
        object["status"] = json!({"state": state, "message": format!("{operation} {state}")});
    }
    serde_json::from_value(object).unwrap()
}
