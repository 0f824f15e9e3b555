//! What `scenario capi` writes (Cluster API's objects, complete as its webhooks would have
//! left them: the lab's core manager runs without them, as in `controller/tests/cluster_api.rs`)
//! and what it reads back (Cluster API Machines, the lab's Machines, Nodes), as plain data.

use serde_json::Value;
use unbounded_api::well_known::{annotations, conditions, labels};

use crate::lab::base::{LAB_ADDRESS, LAB_API_PORT, LAB_LABEL};

/// The namespace of the scenario's Cluster API objects.
pub const NAMESPACE: &str = "tb-capi";
/// The Cluster.
pub const CLUSTER: &str = "tb-capi";
/// Its MachineDeployment.
pub const DEPLOYMENT: &str = "tb-capi-md";
/// Its MachineHealthCheck.
pub const HEALTH_CHECK: &str = "tb-capi-health";
/// The lab's configuration, which the UnboundedConfigTemplate names without a version.
pub const CONFIGURATION: &str = "testbed";

/// Cluster API's kinds and the lab's Machines, fully qualified: with Cluster API's CRDs
/// installed, `machine` (and `machinepool`) name two kinds, and kubectl picks Cluster API's.
pub mod kinds {
    /// Cluster API's Machines.
    pub const CAPI_MACHINES: &str = "machines.cluster.x-k8s.io";
    /// The lab's (Unbounded's) Machines.
    pub const MACHINES: &str = "machines.unbounded-cloud.io";
    /// Cluster API's MachineDeployments.
    pub const DEPLOYMENTS: &str = "machinedeployments.cluster.x-k8s.io";
    /// Cluster API's Clusters.
    pub const CLUSTERS: &str = "clusters.cluster.x-k8s.io";
}

/// The Namespace, the Cluster's kubeconfig Secret (`admin_kubeconfig`, the lab's, which
/// reaches the API server from the host where the core manager runs), the
/// UnboundedControlPlane (the lab's control plane, at the address the machines join),
/// UnboundedCluster, Cluster, the templates (claim from the lab's inventory, run the lab's
/// configuration) and a MachineDeployment of `replicas` at Kubernetes `version`
/// (RollingUpdate, maxSurge 1, maxUnavailable 0).
pub fn cluster_yaml(admin_kubeconfig: &str, replicas: u32, version: &str) -> String {
    // A JSON string is a YAML scalar.
    let kubeconfig = Value::String(admin_kubeconfig.to_owned()).to_string();
    format!(
        r#"apiVersion: v1
kind: Namespace
metadata: {{name: {NAMESPACE}}}
---
apiVersion: v1
kind: Secret
metadata: {{name: {CLUSTER}-kubeconfig, namespace: {NAMESPACE}, labels: {{cluster.x-k8s.io/cluster-name: {CLUSTER}}}}}
type: cluster.x-k8s.io/secret
stringData: {{value: {kubeconfig}}}
---
apiVersion: controlplane.cluster.x-k8s.io/v1alpha1
kind: UnboundedControlPlane
metadata: {{name: {CLUSTER}, namespace: {NAMESPACE}, labels: {{cluster.x-k8s.io/cluster-name: {CLUSTER}}}}}
spec: {{controlPlaneEndpoint: {{host: "{LAB_ADDRESS}", port: {LAB_API_PORT}}}}}
---
apiVersion: infrastructure.cluster.x-k8s.io/v1alpha1
kind: UnboundedCluster
metadata: {{name: {CLUSTER}, namespace: {NAMESPACE}, labels: {{cluster.x-k8s.io/cluster-name: {CLUSTER}}}}}
spec: {{controlPlaneEndpoint: {{host: "{LAB_ADDRESS}", port: {LAB_API_PORT}}}}}
---
apiVersion: cluster.x-k8s.io/v1beta2
kind: Cluster
metadata: {{name: {CLUSTER}, namespace: {NAMESPACE}}}
spec:
  controlPlaneRef: {{apiGroup: controlplane.cluster.x-k8s.io, kind: UnboundedControlPlane, name: {CLUSTER}}}
  infrastructureRef: {{apiGroup: infrastructure.cluster.x-k8s.io, kind: UnboundedCluster, name: {CLUSTER}}}
---
apiVersion: infrastructure.cluster.x-k8s.io/v1alpha1
kind: UnboundedMachineTemplate
metadata: {{name: {CLUSTER}-pxe, namespace: {NAMESPACE}}}
spec: {{template: {{spec: {{provider: pxe, pxe: {{inventorySelector: {{matchLabels: {{{LAB_LABEL}: "true"}}}}}}}}}}}}
---
apiVersion: bootstrap.cluster.x-k8s.io/v1alpha1
kind: UnboundedConfigTemplate
metadata: {{name: {CLUSTER}-workers, namespace: {NAMESPACE}}}
spec: {{template: {{spec: {{configurationRef: {{name: {CONFIGURATION}}}}}}}}}
---
apiVersion: cluster.x-k8s.io/v1beta2
kind: MachineDeployment
metadata: {{name: {DEPLOYMENT}, namespace: {NAMESPACE}, labels: {{cluster.x-k8s.io/cluster-name: {CLUSTER}}}}}
spec:
  clusterName: {CLUSTER}
  replicas: {replicas}
  selector: {{matchLabels: {{cluster.x-k8s.io/cluster-name: {CLUSTER}, cluster.x-k8s.io/deployment-name: {DEPLOYMENT}}}}}
  rollout: {{strategy: {{type: RollingUpdate, rollingUpdate: {{maxSurge: 1, maxUnavailable: 0}}}}}}
  template:
    metadata: {{labels: {{cluster.x-k8s.io/cluster-name: {CLUSTER}, cluster.x-k8s.io/deployment-name: {DEPLOYMENT}}}}}
    spec:
      clusterName: {CLUSTER}
      version: {version}
      bootstrap: {{configRef: {{apiGroup: bootstrap.cluster.x-k8s.io, kind: UnboundedConfigTemplate, name: {CLUSTER}-workers}}}}
      infrastructureRef: {{apiGroup: infrastructure.cluster.x-k8s.io, kind: UnboundedMachineTemplate, name: {CLUSTER}-pxe}}
"#
    )
}

/// A MachineHealthCheck over the deployment: a Node not Ready (False or Unknown) for
/// `seconds` is unhealthy.
pub fn health_check_yaml(seconds: u32) -> String {
    format!(
        r#"apiVersion: cluster.x-k8s.io/v1beta2
kind: MachineHealthCheck
metadata: {{name: {HEALTH_CHECK}, namespace: {NAMESPACE}}}
spec:
  clusterName: {CLUSTER}
  selector: {{matchLabels: {{cluster.x-k8s.io/deployment-name: {DEPLOYMENT}}}}}
  checks:
    unhealthyNodeConditions:
      - {{type: Ready, status: "False", timeoutSeconds: {seconds}}}
      - {{type: Ready, status: Unknown, timeoutSeconds: {seconds}}}
"#
    )
}

fn text(value: &Value, pointer: &str) -> String {
    value
        .pointer(pointer)
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned()
}

/// `status/reason` of condition `type_` (empty when absent).
fn condition(value: &Value, type_: &str) -> String {
    value
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .and_then(|all| all.iter().find(|c| c["type"] == type_))
        .map(|c| format!("{}/{}", text(c, "/status"), text(c, "/reason")))
        .unwrap_or_default()
}

fn items(list: &Value) -> &[Value] {
    list.get("items")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default()
}

/// A Cluster API Machine as the scenario follows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CapiMachine {
    /// Its name.
    pub name: String,
    /// `status.phase`.
    pub phase: String,
    /// `status.nodeRef.name`.
    pub node: String,
    /// `spec.providerID`.
    pub provider_id: String,
    /// `spec.version`.
    pub version: String,
    /// Being deleted.
    pub deleting: bool,
    /// Its `Ready` condition, `status/reason`.
    pub ready: String,
}

impl CapiMachine {
    /// Running with a nodeRef, not being deleted.
    pub fn running(&self) -> bool {
        self.phase == "Running" && !self.node.is_empty() && !self.deleting
    }

    /// One line: name, phase, node, version, Ready.
    pub fn summary(&self) -> String {
        format!(
            "{} {}{} node={} {} Ready={}",
            self.name,
            self.phase,
            if self.deleting { " (deleting)" } else { "" },
            self.node,
            self.version,
            self.ready
        )
    }
}

/// The Cluster API Machines of a `kubectl get -o json` list, by name.
pub fn capi_machines(list: &Value) -> Vec<CapiMachine> {
    let mut machines: Vec<CapiMachine> = items(list)
        .iter()
        .map(|m| CapiMachine {
            name: text(m, "/metadata/name"),
            phase: text(m, "/status/phase"),
            node: text(m, "/status/nodeRef/name"),
            provider_id: text(m, "/spec/providerID"),
            version: text(m, "/spec/version"),
            deleting: m.pointer("/metadata/deletionTimestamp").is_some(),
            ready: condition(m, "Ready"),
        })
        .collect();
    machines.sort_by(|a, b| a.name.cmp(&b.name));
    machines
}

/// One of the lab's (Unbounded's) Machines: the hardware.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Host {
    /// Its name (and its Node's).
    pub name: String,
    /// `spec.providerID`.
    pub provider_id: String,
    /// The claiming UnboundedMachine's UID (label `unbounded-cloud.io/capi-machine`).
    pub claim: String,
    /// `spec.configurationRef`: name and version (0 when it names none).
    pub configuration: Option<(String, i64)>,
    /// `status.power`.
    pub power: String,
    /// `status.phase`.
    pub phase: String,
    /// `status.configuration.version` (0 when none).
    pub recorded: i64,
    /// A repave (or a release's) is requested and not done.
    pub repave: bool,
    /// `DisksWiped`, `status/reason` (empty when the release needed no wipe).
    pub disks_wiped: String,
}

impl Host {
    /// Free again after a release: no claim, no repave pending, powered off.
    pub fn released(&self) -> bool {
        self.claim.is_empty() && !self.repave && self.power == "Off"
    }
}

/// The lab's Machines of a `kubectl get -o json` list, by name.
pub fn hosts(list: &Value) -> Vec<Host> {
    let mut hosts: Vec<Host> = items(list)
        .iter()
        .map(|m| {
            let reference = m.pointer("/spec/configurationRef");
            Host {
                name: text(m, "/metadata/name"),
                provider_id: text(m, "/spec/providerID"),
                claim: m
                    .pointer("/metadata/labels")
                    .and_then(|l| l.get(labels::CAPI_MACHINE))
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_owned(),
                configuration: reference.map(|r| {
                    (
                        text(r, "/name"),
                        r.get("version").and_then(Value::as_i64).unwrap_or(0),
                    )
                }),
                power: text(m, "/status/power"),
                phase: text(m, "/status/phase"),
                recorded: m
                    .pointer("/status/configuration/version")
                    .and_then(Value::as_i64)
                    .unwrap_or(0),
                repave: m
                    .pointer("/metadata/annotations")
                    .and_then(|a| a.get(annotations::REPAVE))
                    .is_some(),
                disks_wiped: condition(m, conditions::DISKS_WIPED),
            }
        })
        .collect();
    hosts.sort_by(|a, b| a.name.cmp(&b.name));
    hosts
}

/// A Node: name, Ready status, kubelet version, provider ID.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeView {
    /// Its name.
    pub name: String,
    /// `Ready` is True.
    pub ready: bool,
    /// `status.nodeInfo.kubeletVersion`.
    pub kubelet: String,
    /// `spec.providerID`.
    pub provider_id: String,
}

/// The Nodes of a `kubectl get -o json` list.
pub fn nodes(list: &Value) -> Vec<NodeView> {
    items(list)
        .iter()
        .map(|n| NodeView {
            name: text(n, "/metadata/name"),
            ready: condition(n, "Ready").starts_with("True/"),
            kubelet: text(n, "/status/nodeInfo/kubeletVersion"),
            provider_id: text(n, "/spec/providerID"),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn capi_machines_are_read_with_their_phase_node_and_deletion() {
        let list = json!({"items": [
            {"metadata": {"name": "b", "deletionTimestamp": "2026-11-29T10:00:00Z"},
             "spec": {"providerID": "pxe://2", "version": "v1.34.4"},
             "status": {"phase": "Deleting", "nodeRef": {"name": "machine-2"}}},
            {"metadata": {"name": "a"}, "spec": {"providerID": "pxe://1", "version": "v1.35.4"},
             "status": {"phase": "Running", "nodeRef": {"name": "machine-1"},
                        "conditions": [{"type": "Ready", "status": "True", "reason": "Ready"}]}},
            {"metadata": {"name": "c"}, "spec": {}, "status": {"phase": "Provisioning"}},
        ]});
        let machines = capi_machines(&list);
        assert_eq!(
            machines.iter().map(|m| m.name.as_str()).collect::<Vec<_>>(),
            ["a", "b", "c"]
        );
        assert!(machines[0].running());
        assert_eq!(machines[0].ready, "True/Ready");
        assert!(!machines[1].running(), "being deleted");
        assert!(!machines[2].running(), "no nodeRef");
        assert_eq!(capi_machines(&json!({})), vec![]);
    }

    #[test]
    fn hosts_show_their_claim_configuration_and_release() {
        let list = json!({"items": [{
            "metadata": {"name": "machine-1", "labels": {"unbounded-cloud.io/capi-machine": "uid-1"},
                         "annotations": {"unbounded-cloud.io/repave": "t"}},
            "spec": {"providerID": "pxe://1", "configurationRef": {"name": "testbed", "version": 3}},
            "status": {"power": "On", "phase": "Running", "configuration": {"version": 3},
                       "conditions": [{"type": "DisksWiped", "status": "True", "reason": "Wiped"}]}
        }, {
            "metadata": {"name": "machine-2"}, "spec": {}, "status": {"power": "Off"}
        }]});
        let hosts = hosts(&list);
        assert_eq!(hosts[0].claim, "uid-1");
        assert_eq!(hosts[0].configuration, Some(("testbed".into(), 3)));
        assert_eq!(hosts[0].recorded, 3);
        assert_eq!(hosts[0].disks_wiped, "True/Wiped");
        assert!(hosts[0].repave && !hosts[0].released());
        assert!(hosts[1].released());
        assert_eq!(hosts[1].configuration, None);
        assert_eq!(hosts[1].disks_wiped, "");
    }

    #[test]
    fn the_objects_are_complete_as_written() {
        let yaml = cluster_yaml("apiVersion: v1\nkind: Config\n", 2, "v1.35.4");
        assert!(yaml.contains(r#"stringData: {value: "apiVersion: v1\nkind: Config\n"}"#));
        assert!(yaml.contains("replicas: 2"));
        assert!(yaml.contains("version: v1.35.4"));
        assert!(yaml.contains("maxSurge: 1, maxUnavailable: 0"));
        assert!(yaml.contains(r#"host: "10.99.0.1", port: 6443"#));
        assert!(yaml.contains("configurationRef: {name: testbed}"));
        assert!(health_check_yaml(30).contains("status: Unknown, timeoutSeconds: 30"));
    }
}
