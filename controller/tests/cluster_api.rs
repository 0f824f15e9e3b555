//! Unbounded as a Cluster API provider, with Cluster API's real core controller (v1.13,
//! built from its Go module) and our controller binary (`--cluster-api`) against the real
//! control plane: a Cluster whose MachineDeployment of two claims PXE Machines from the
//! inventory until both Cluster API Machines run with a `nodeRef` (`clusterctl describe
//! cluster` shows them Ready), scaling to one releases one machine (drained, powered off,
//! free again), a new Kubernetes version rolls the deployment onto a new configuration
//! version, and a MachineHealthCheck replaces a Machine whose Node went unready.
//!
//! What stands in for the hardware is the PXE provider's and the kubelet's writes (a
//! provider ID, power on, `InfrastructureReady`, a Node with the provider ID); the
//! scenario `capi` does the same with VMs.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic is the test failure report

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::rollout::{StandInPower, kubectl};
use common::*;
use k8s_openapi::api::core::v1::Node;
use kube::api::{
    Api, ApiResource, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams, PostParams,
};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};
use unbounded_api::capi::UnboundedMachine;
use unbounded_api::well_known::{annotations, field_managers, labels};
use unbounded_api::{Machine, MachineOperation};
use unbounded_testbed::cluster::{ClusterApiBinaries, CoreManager};

const CLUSTER_API: &[&str] = &["--cluster-api"];
/// The controller runs under deploy/'s RBAC and the Cluster API component's.
const CONTROLLER_RBAC: &[&str] = &["rbac/controller.yaml", "cluster-api/rbac/controller.yaml"];

fn capi(kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("cluster.x-k8s.io", "v1beta2", kind),
        plural,
    )
}

/// The core manager, once for this test binary.
fn core_manager() -> &'static Mutex<CoreManager> {
    static MANAGER: std::sync::OnceLock<Mutex<CoreManager>> = std::sync::OnceLock::new();
    MANAGER.get_or_init(|| {
        Mutex::new(CoreManager::start(control_plane()).expect("Cluster API core manager"))
    })
}

/// Reports a Node's conditions as its kubelet does: Ready (or not) and no pressure (Cluster
/// API's NodeHealthy waits for all four).
async fn report_node(client: &Client, name: &str, ready: bool) -> Result<Node, kube::Error> {
    let now = k8s_openapi::jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string();
    let condition = |type_: &str, status: bool, reason: &str| {
        json!({"type": type_, "status": if status { "True" } else { "False" }, "reason": reason,
               "message": "stand-in kubelet", "lastHeartbeatTime": now, "lastTransitionTime": now})
    };
    let patch = json!({"status": {"conditions": [
        condition("Ready", ready, "KubeletReady"),
        condition("MemoryPressure", false, "KubeletHasSufficientMemory"),
        condition("DiskPressure", false, "KubeletHasNoDiskPressure"),
        condition("PIDPressure", false, "KubeletHasSufficientPID"),
    ]}});
    Api::<Node>::all(client.clone())
        .patch_status(name, &PatchParams::default(), &Patch::Merge(patch))
        .await
}

/// Plays the PXE provider and the kubelets of an inventory (label `inv=<group>`): a
/// claimed Machine gets its provider ID, is powered on with its infrastructure ready, and
/// once the controller has recorded its configuration its Node registers, Ready, with the
/// provider ID; Nodes report Ready every few seconds unless set down. A released Machine
/// (no claim label) registers nothing. Stops when dropped.
struct StandInHardware {
    task: tokio::task::JoinHandle<()>,
    down: Arc<Mutex<BTreeSet<String>>>,
    /// Machines whose BMC does not answer: powered off, `InfrastructureReady` false.
    bmc_down: Arc<Mutex<BTreeSet<String>>>,
}

impl StandInHardware {
    fn start(client: &Client, group: &str) -> Self {
        let client = client.clone();
        let selector = format!("inv={group}");
        let down = Arc::new(Mutex::new(BTreeSet::new()));
        let down2 = down.clone();
        let bmc_down = Arc::new(Mutex::new(BTreeSet::new()));
        let bmc_down2 = bmc_down.clone();
        let task = tokio::spawn(async move {
            let machines: Api<Machine> = Api::all(client.clone());
            let nodes: Api<Node> = Api::all(client.clone());
            let mut beat = std::time::Instant::now();
            loop {
                let list = machines
                    .list(&ListParams::default().labels(&selector))
                    .await;
                for m in list.map(|l| l.items).unwrap_or_default() {
                    let name = m.name_any();
                    let claimed = m.labels().contains_key(labels::CAPI_MACHINE);
                    if !claimed || m.metadata.deletion_timestamp.is_some() {
                        continue;
                    }
                    let mac = m
                        .spec
                        .pxe
                        .as_ref()
                        .map(|p| p.mac_addresses[0].clone())
                        .unwrap();
                    let id = format!("pxe://{mac}");
                    if m.spec.provider_id.is_none() {
                        let _ = machines
                            .patch(
                                &name,
                                &PatchParams::default(),
                                &Patch::Merge(json!({"spec": {"providerID": id}})),
                            )
                            .await;
                        continue;
                    }
                    let status = m.status.clone().unwrap_or_default();
                    let failing = bmc_down2.lock().unwrap().contains(&name);
                    let infrastructure_ready = status
                        .conditions
                        .iter()
                        .any(|c| c.type_ == "InfrastructureReady" && c.status == "True");
                    let reported_failing = status
                        .conditions
                        .iter()
                        .any(|c| c.type_ == "InfrastructureReady" && c.reason == "BmcUnreachable");
                    if failing && !reported_failing {
                        let body = json!({
                            "apiVersion": "unbounded-cloud.io/v1alpha1", "kind": "Machine",
                            "metadata": {"name": name},
                            "status": {"power": "Off", "conditions": [{
                                "type": "InfrastructureReady", "status": "False", "reason": "BmcUnreachable",
                                "message": "BMC 10.0.0.9: connection refused (retrying)",
                                "lastTransitionTime": "2026-11-29T10:00:00Z"}]},
                        });
                        let _ = machines
                            .patch_status(
                                &name,
                                &PatchParams::apply(field_managers::PXE_PROVIDER).force(),
                                &Patch::Apply(&body),
                            )
                            .await;
                        continue;
                    }
                    if failing {
                        continue;
                    }
                    if status.power != Some(unbounded_api::PowerState::On) || !infrastructure_ready
                    {
                        let body = json!({
                            "apiVersion": "unbounded-cloud.io/v1alpha1", "kind": "Machine",
                            "metadata": {"name": name},
                            "status": {"power": "On", "conditions": [{
                                "type": "InfrastructureReady", "status": "True", "reason": "PoweredOn",
                                "message": "", "lastTransitionTime": "2026-11-29T10:00:00Z"}]},
                        });
                        let _ = machines
                            .patch_status(
                                &name,
                                &PatchParams::apply(field_managers::PXE_PROVIDER).force(),
                                &Patch::Apply(&body),
                            )
                            .await;
                        continue;
                    }
                    if status.configuration.is_some()
                        && matches!(nodes.get_opt(&name).await, Ok(None))
                    {
                        let node: Node = serde_json::from_value(json!({
                            "apiVersion": "v1", "kind": "Node",
                            "metadata": {"name": name}, "spec": {"providerID": id},
                        }))
                        .unwrap();
                        if nodes.create(&PostParams::default(), &node).await.is_ok() {
                            down2.lock().unwrap().remove(&name);
                            let _ = report_node(&client, &name, true).await;
                        }
                    }
                }
                if beat.elapsed() > Duration::from_secs(5) {
                    beat = std::time::Instant::now();
                    let up: Vec<String> = nodes
                        .list(&ListParams::default())
                        .await
                        .map(|l| l.items.iter().map(|n| n.name_any()).collect())
                        .unwrap_or_default();
                    for name in up.iter().filter(|n| {
                        n.starts_with(&format!("{}-", selector.trim_start_matches("inv=")))
                    }) {
                        if !down2.lock().unwrap().contains(name) {
                            let _ = report_node(&client, name, true).await;
                        }
                    }
                }
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
        });
        Self {
            task,
            down,
            bmc_down,
        }
    }

    /// The BMC of `name` stops answering (`down`), or answers again.
    fn set_bmc_down(&self, name: &str, down: bool) {
        let mut set = self.bmc_down.lock().unwrap();
        if down {
            set.insert(name.to_owned());
        } else {
            set.remove(name);
        }
    }

    /// The kubelet of `name` stops: its Node goes NotReady and stays so.
    async fn stop_kubelet(&self, client: &Client, name: &str) {
        self.down.lock().unwrap().insert(name.to_owned());
        report_node(client, name, false).await.unwrap();
    }
}

impl Drop for StandInHardware {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn inventory(group: &str, count: usize, mac_base: u8) -> String {
    (0..count)
        .map(|i| {
            format!(
                "apiVersion: unbounded-cloud.io/v1alpha1\nkind: Machine\nmetadata: {{name: {group}-{i}, labels: {{inv: {group}}}}}\nspec:\n  provider: pxe\n  pxe: {{macAddresses: [\"52:54:00:{mac_base:02x}:00:{i:02x}\"]}}\n---\n"
            )
        })
        .collect()
}

/// The Cluster `name` in `namespace` ([`infrastructure`]) with a MachineDeployment `md` of
/// `replicas` over inventory `group`, at Kubernetes `version`.
fn cluster(namespace: &str, name: &str, group: &str, replicas: u32, version: &str) -> String {
    infrastructure(namespace, name, group) + &deployment(namespace, name, "md", replicas, version)
}

/// MachineDeployment `deployment` of Cluster `name` (its templates from [`infrastructure`]).
fn deployment(
    namespace: &str,
    name: &str,
    deployment: &str,
    replicas: u32,
    version: &str,
) -> String {
    format!(
        r#"---
apiVersion: cluster.x-k8s.io/v1beta2
kind: MachineDeployment
metadata: {{name: {deployment}, namespace: {namespace}, labels: {{cluster.x-k8s.io/cluster-name: {name}}}}}
spec:
  clusterName: {name}
  replicas: {replicas}
  selector: {{matchLabels: {{cluster.x-k8s.io/cluster-name: {name}, cluster.x-k8s.io/deployment-name: {deployment}}}}}
  rollout: {{strategy: {{type: RollingUpdate, rollingUpdate: {{maxSurge: 1, maxUnavailable: 0}}}}}}
  template:
    metadata: {{labels: {{cluster.x-k8s.io/cluster-name: {name}, cluster.x-k8s.io/deployment-name: {deployment}}}}}
    spec:
      clusterName: {name}
      version: {version}
      bootstrap: {{configRef: {{apiGroup: bootstrap.cluster.x-k8s.io, kind: UnboundedConfigTemplate, name: {name}-workers}}}}
      infrastructureRef: {{apiGroup: infrastructure.cluster.x-k8s.io, kind: UnboundedMachineTemplate, name: {name}-pxe}}
"#
    )
}

/// The Cluster `name` in `namespace`: its kubeconfig Secret, our control plane and
/// infrastructure, and the templates that claim from inventory `group` and run
/// configuration `<name>-workers`.
fn infrastructure(namespace: &str, name: &str, group: &str) -> String {
    let server = control_plane().server_url().to_owned();
    let url = url_host_port(&server);
    let kubeconfig = std::fs::read_to_string(control_plane().kubeconfig_path()).unwrap();
    // A JSON string is a YAML scalar.
    let kubeconfig = serde_json::to_string(&kubeconfig).unwrap();
    format!(
        r#"apiVersion: v1
kind: Namespace
metadata: {{name: {namespace}}}
---
apiVersion: v1
kind: Secret
metadata: {{name: {name}-kubeconfig, namespace: {namespace}, labels: {{cluster.x-k8s.io/cluster-name: {name}}}}}
type: cluster.x-k8s.io/secret
stringData: {{value: {kubeconfig}}}
---
apiVersion: controlplane.cluster.x-k8s.io/v1alpha1
kind: UnboundedControlPlane
metadata: {{name: {name}, namespace: {namespace}, labels: {{cluster.x-k8s.io/cluster-name: {name}}}}}
spec: {{controlPlaneEndpoint: {{host: "{host}", port: {port}}}}}
---
apiVersion: infrastructure.cluster.x-k8s.io/v1alpha1
kind: UnboundedCluster
metadata: {{name: {name}, namespace: {namespace}, labels: {{cluster.x-k8s.io/cluster-name: {name}}}}}
spec: {{controlPlaneEndpoint: {{host: "{host}", port: {port}}}}}
---
apiVersion: cluster.x-k8s.io/v1beta2
kind: Cluster
metadata: {{name: {name}, namespace: {namespace}}}
spec:
  controlPlaneRef: {{apiGroup: controlplane.cluster.x-k8s.io, kind: UnboundedControlPlane, name: {name}}}
  infrastructureRef: {{apiGroup: infrastructure.cluster.x-k8s.io, kind: UnboundedCluster, name: {name}}}
---
apiVersion: infrastructure.cluster.x-k8s.io/v1alpha1
kind: UnboundedMachineTemplate
metadata: {{name: {name}-pxe, namespace: {namespace}}}
spec: {{template: {{spec: {{provider: pxe, pxe: {{inventorySelector: {{matchLabels: {{inv: {group}}}}}}}}}}}}}
---
apiVersion: bootstrap.cluster.x-k8s.io/v1alpha1
kind: UnboundedConfigTemplate
metadata: {{name: {name}-workers, namespace: {namespace}}}
spec: {{template: {{spec: {{configurationRef: {{name: {name}-workers}}}}}}}}
"#,
        host = url.0,
        port = url.1,
    )
}

fn url_host_port(url: &str) -> (String, u16) {
    let rest = url.trim_start_matches("https://");
    let (host, port) = rest.rsplit_once(':').unwrap();
    (host.to_owned(), port.trim_end_matches('/').parse().unwrap())
}

/// The Cluster API Machines of deployment `md` in `namespace`.
async fn capi_machines(client: &Client, namespace: &str) -> Vec<DynamicObject> {
    capi_machines_of(client, namespace, "md").await
}

/// The Cluster API Machines of `deployment` in `namespace`.
async fn capi_machines_of(
    client: &Client,
    namespace: &str,
    deployment: &str,
) -> Vec<DynamicObject> {
    let api: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), namespace, &capi("Machine", "machines"));
    let mut items = api
        .list(
            &ListParams::default()
                .labels(&format!("cluster.x-k8s.io/deployment-name={deployment}")),
        )
        .await
        .unwrap()
        .items;
    items.sort_by_key(|m| m.name_any());
    items
}

fn text<'a>(object: &'a DynamicObject, pointer: &str) -> Option<&'a str> {
    object.data.pointer(pointer).and_then(Value::as_str)
}

/// `(name, phase, nodeRef, providerID)` of each Cluster API Machine.
fn summary(machines: &[DynamicObject]) -> Vec<(String, String, String, String)> {
    machines
        .iter()
        .map(|m| {
            (
                m.name_any(),
                text(m, "/status/phase").unwrap_or("").to_owned(),
                text(m, "/status/nodeRef/name").unwrap_or("").to_owned(),
                text(m, "/spec/providerID").unwrap_or("").to_owned(),
            )
        })
        .collect()
}

/// Waits until `decide` finds what it waits for in the Machines of `deployment`, printing
/// their summary as it changes, and on timeout the core manager's log.
async fn wait_capi<T>(
    client: &Client,
    namespace: &str,
    deployment: &str,
    what: &str,
    decide: impl Fn(&[DynamicObject]) -> Option<T>,
) -> T {
    let mut last = Vec::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(240);
    loop {
        let machines = capi_machines_of(client, namespace, deployment).await;
        if let Some(found) = decide(&machines) {
            return found;
        }
        let now = summary(&machines);
        if now != last {
            eprintln!("{namespace}/{deployment}: waiting for {what}: {now:?}");
            last = now;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting for {what} in {namespace}/{deployment}: {last:?}\ncore manager log: {}",
            core_manager().lock().unwrap().log_tail(40)
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Waits until deployment `md` has exactly `count` Machines, each Running with a nodeRef,
/// none being deleted.
async fn wait_running(client: &Client, namespace: &str, count: usize) -> Vec<DynamicObject> {
    wait_capi(
        client,
        namespace,
        "md",
        &format!("{count} Running"),
        |machines| {
            let running = machines.iter().all(|m| {
                text(m, "/status/phase") == Some("Running")
                    && text(m, "/status/nodeRef/name").is_some()
                    && m.metadata.deletion_timestamp.is_none()
            });
            (machines.len() == count && running).then(|| machines.to_vec())
        },
    )
    .await
}

/// The Unbounded Machines each Cluster API Machine stands for, by provider ID.
async fn claimed_by_provider_id(client: &Client, group: &str) -> BTreeMap<String, Machine> {
    Api::<Machine>::all(client.clone())
        .list(&ListParams::default().labels(&format!("inv={group},{}", labels::CAPI_MACHINE)))
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|m| Some((m.spec.provider_id.clone()?, m)))
        .collect()
}

async fn add_version(client: &Client, configuration: &str, kubernetes: &str) {
    set_template(
        client,
        configuration,
        json!({"boot": {"kernelURL": "k", "initrdURL": "initrd"}, "kubernetes": {"version": kubernetes}}),
    )
    .await;
}

/// What every test starts from: Cluster API's manager and our controller running (the
/// manager first: a few seconds, blocking), `count` PXE Machines of inventory `group`, and
/// configuration `configuration` whose version 1 runs Kubernetes v1.35.3.
async fn begin(group: &str, count: usize, mac_base: u8, configuration: &str) -> Client {
    tokio::task::spawn_blocking(|| {
        core_manager();
    })
    .await
    .unwrap();
    start_controller_as_service_account(CLUSTER_API, CONTROLLER_RBAC);
    let client = client().await;
    if count > 0 {
        kubectl(
            &["apply", "-f", "-"],
            Some(&inventory(group, count, mac_base)),
        );
    }
    create_configuration(
        &client,
        configuration,
        json!({"template": {"boot": {"kernelURL": "k", "initrdURL": "initrd"}, "kubernetes": {"version": "v1.35.3"}}}),
    )
    .await;
    wait_for(&format!("{configuration} v1"), || async {
        version(&client, &format!("{configuration}-v1")).await
    })
    .await;
    client
}

#[tokio::test]
async fn a_machine_deployment_claims_runs_scales_down_rolls_and_is_remediated() {
    let (namespace, group) = ("capi-md", "capi-md");
    let client = begin(group, 3, 0xc0, "c1-workers").await;
    let hardware = StandInHardware::start(&client, group);
    let _power = StandInPower::start(&client, Arc::new(Mutex::new(BTreeSet::new())));
    kubectl(
        &["apply", "-f", "-"],
        Some(&cluster(namespace, "c1", group, 2, "v1.35.3")),
    );

    // Two Cluster API Machines, each on its own PXE Machine, Running with a nodeRef.
    let running = wait_running(&client, namespace, 2).await;
    let claimed = claimed_by_provider_id(&client, group).await;
    let ids: BTreeSet<_> = running
        .iter()
        .map(|m| text(m, "/spec/providerID").unwrap().to_owned())
        .collect();
    assert_eq!(
        ids.len(),
        2,
        "two distinct provider IDs: {:?}",
        summary(&running)
    );
    for id in &ids {
        let m = claimed
            .get(id)
            .unwrap_or_else(|| panic!("no claimed Machine has {id}: {:?}", claimed.keys()));
        let reference = m.spec.configuration_ref.as_ref().unwrap();
        assert_eq!(
            (reference.name.as_str(), reference.version),
            ("c1-workers", Some(1))
        );
        assert_eq!(
            m.labels()
                .get("cluster.x-k8s.io/cluster-name")
                .map(String::as_str),
            Some("c1")
        );
        assert!(
            m.annotations()
                .get(annotations::CAPI_MACHINE)
                .unwrap()
                .starts_with("capi-md/")
        );
    }
    let infra: Vec<UnboundedMachine> =
        Api::<UnboundedMachine>::namespaced(client.clone(), namespace)
            .list(&ListParams::default())
            .await
            .unwrap()
            .items;
    for um in &infra {
        wait_event(&client, &um.name_any(), "Claimed").await;
        let status = um.status.as_ref().unwrap();
        assert_eq!(
            status.initialization.as_ref().unwrap().provisioned,
            Some(true),
            "{}",
            um.name_any()
        );
        assert!(
            status.addresses.iter().any(|a| a.type_ == "Hostname"),
            "{:?}",
            status.addresses
        );
        assert!(
            um.finalizers()
                .iter()
                .any(|f| f == "unboundedmachine.infrastructure.cluster.x-k8s.io")
        );
    }
    // Cluster API finds them Ready (the Node healthy), and `clusterctl describe cluster`
    // shows them so.
    wait_for("both Machines Ready", || async {
        let machines = capi_machines(&client, namespace).await;
        machines
            .iter()
            .all(|m| {
                m.data["status"]["conditions"].as_array().is_some_and(|c| {
                    c.iter()
                        .any(|c| c["type"] == "Ready" && c["status"] == "True")
                })
            })
            .then_some(())
    })
    .await;
    let binaries = ClusterApiBinaries::ensure().unwrap();
    let described = std::process::Command::new(&binaries.clusterctl)
        .args([
            "describe",
            "cluster",
            "c1",
            "-n",
            namespace,
            "--grouping=false",
            "--kubeconfig",
        ])
        .arg(control_plane().kubeconfig_path())
        .output()
        .unwrap();
    let described_text = String::from_utf8_lossy(&described.stdout);
    assert!(
        described.status.success(),
        "{described_text}{}",
        String::from_utf8_lossy(&described.stderr)
    );
    for m in &running {
        let line = described_text
            .lines()
            .find(|l| l.contains(&m.name_any()))
            .unwrap_or_else(|| panic!("{} not in:\n{described_text}", m.name_any()));
        assert!(
            line.contains("True"),
            "{} is not Ready in:\n{described_text}",
            m.name_any()
        );
    }

    // Scale to one: one machine goes back to the inventory, drained and powered off.
    kubectl(
        &[
            "scale",
            "-n",
            namespace,
            "machinedeployment/md",
            "--replicas=1",
        ],
        None,
    );
    let kept = wait_running(&client, namespace, 1).await;
    let kept_id = text(&kept[0], "/spec/providerID").unwrap().to_owned();
    let released_id = ids.iter().find(|id| **id != kept_id).unwrap().clone();
    let released = claimed[&released_id].name_any();
    let released_by = claimed[&released_id].annotations()[annotations::CAPI_MACHINE]
        .rsplit('/')
        .next()
        .unwrap()
        .to_owned();
    wait_event(&client, &released_by, "Released").await;
    let m = wait_for(&format!("{released} back in the inventory"), || async {
        let m = machine(&client, &released).await;
        let node = Api::<Node>::all(client.clone())
            .get_opt(&released)
            .await
            .unwrap();
        let done = node.is_none()
            && !m.labels().contains_key(labels::CAPI_MACHINE)
            && !m.annotations().contains_key(annotations::REPAVE);
        done.then_some(m)
    })
    .await;
    assert!(
        m.spec.configuration_ref.is_none(),
        "{:?}",
        m.spec.configuration_ref
    );
    assert!(!m.annotations().contains_key(annotations::CAPI_MACHINE));
    let power_off = Api::<MachineOperation>::all(client.clone())
        .list(&ListParams::default().labels(&format!("{}={released}", labels::MACHINE)))
        .await
        .unwrap()
        .items;
    assert!(
        power_off
            .iter()
            .any(|o| o.spec.operation_name == "powerOff"),
        "a powerOff operation for {released}"
    );

    // A new Kubernetes version: a new configuration version, and the deployment rolls onto
    // it one Machine at a time (surge one, never below one Running).
    add_version(&client, "c1-workers", "v1.35.4").await;
    wait_for("c1-workers v2", || async {
        version(&client, "c1-workers-v2").await
    })
    .await;
    kubectl(
        &[
            "patch",
            "-n",
            namespace,
            "machinedeployment/md",
            "--type",
            "merge",
            "-p",
            r#"{"spec":{"template":{"spec":{"version":"v1.35.4"}}}}"#,
        ],
        None,
    );
    let rolled = wait_capi(
        &client,
        namespace,
        "md",
        "the deployment on v1.35.4",
        |machines| {
            let ok = machines.len() == 1
                && machines.iter().all(|m| {
                    text(m, "/spec/version") == Some("v1.35.4")
                        && text(m, "/status/phase") == Some("Running")
                        && m.metadata.deletion_timestamp.is_none()
                });
            ok.then(|| machines.to_vec())
        },
    )
    .await;
    let rolled_id = text(&rolled[0], "/spec/providerID").unwrap().to_owned();
    assert_ne!(rolled_id, kept_id, "a new Machine, not the old one changed");
    let on_v2 = claimed_by_provider_id(&client, group).await;
    let reference = on_v2[&rolled_id].spec.configuration_ref.clone().unwrap();
    assert_eq!(
        reference.version,
        Some(2),
        "the version whose Kubernetes is v1.35.4"
    );

    // A MachineHealthCheck: the Machine whose kubelet stops is deleted by Cluster API,
    // released by us, and replaced from the inventory.
    kubectl(
        &["apply", "-f", "-"],
        Some(&format!(
            r#"apiVersion: cluster.x-k8s.io/v1beta2
kind: MachineHealthCheck
metadata: {{name: md-health, namespace: {namespace}}}
spec:
  clusterName: c1
  selector: {{matchLabels: {{cluster.x-k8s.io/deployment-name: md}}}}
  checks:
    unhealthyNodeConditions:
      - {{type: Ready, status: "False", timeoutSeconds: 5}}
      - {{type: Ready, status: Unknown, timeoutSeconds: 5}}
"#
        )),
    );
    let sick = on_v2[&rolled_id].name_any();
    let sick_claim = on_v2[&rolled_id].labels()[labels::CAPI_MACHINE].clone();
    let power_offs = |ops: &[MachineOperation]| {
        ops.iter()
            .filter(|o| o.spec.operation_name == "powerOff")
            .count()
    };
    let operations_of = |name: String| {
        let client = client.clone();
        async move {
            Api::<MachineOperation>::all(client)
                .list(&ListParams::default().labels(&format!("{}={name}", labels::MACHINE)))
                .await
                .unwrap()
                .items
        }
    };
    let powered_off_before = power_offs(&operations_of(sick.clone()).await);
    hardware.stop_kubelet(&client, &sick).await;
    let rolled_name = rolled[0].name_any();
    // A new Cluster API Machine runs; it may be on the same hardware, once that was
    // released, wiped and powered off (it is free again then), never before.
    let replaced = wait_capi(
        &client,
        namespace,
        "md",
        "the unhealthy Machine replaced",
        |machines| {
            let ok = machines.len() == 1
                && machines[0].name_any() != rolled_name
                && text(&machines[0], "/status/phase") == Some("Running");
            ok.then(|| machines.to_vec())
        },
    )
    .await;
    let released = power_offs(&operations_of(sick.clone()).await);
    assert!(
        released > powered_off_before,
        "{sick} was released (powered off) before it could serve again"
    );
    let now = claimed_by_provider_id(&client, group).await;
    let replacement = &now[text(&replaced[0], "/spec/providerID").unwrap()];
    assert_ne!(
        replacement.labels()[labels::CAPI_MACHINE],
        sick_claim,
        "claimed anew, by the new UnboundedMachine"
    );
    eprintln!("remediated: {:?}", summary(&replaced));
}

/// The UnboundedMachines of `namespace`.
async fn infrastructure_machines(client: &Client, namespace: &str) -> Vec<UnboundedMachine> {
    Api::<UnboundedMachine>::namespaced(client.clone(), namespace)
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
}

fn condition_of<'a>(
    um: &'a UnboundedMachine,
    type_: &str,
) -> Option<&'a k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition> {
    um.status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
}

#[tokio::test]
async fn a_failing_bmc_is_a_condition_and_a_host_gone_underneath_never_wedges_deletion() {
    let (namespace, group) = ("capi-gone", "capi-gone");
    let client = begin(group, 2, 0xc1, "c2-workers").await;
    let hardware = StandInHardware::start(&client, group);
    let _power = StandInPower::start(&client, Arc::new(Mutex::new(BTreeSet::new())));
    for i in 0..2 {
        hardware.set_bmc_down(&format!("{group}-{i}"), true);
    }
    kubectl(
        &["apply", "-f", "-"],
        Some(&cluster(namespace, "c2", group, 1, "v1.35.3")),
    );

    // The BMC fails: a reason on Ready, mirrored by Cluster API, never a failure.
    let failing = wait_for("Ready false for the BMC", || async {
        let all = infrastructure_machines(&client, namespace).await;
        let um = all.into_iter().next()?;
        let ready = condition_of(&um, "Ready")?;
        (ready.status == "False" && ready.message.contains("BmcUnreachable")).then_some(um)
    })
    .await;
    let ready = condition_of(&failing, "Ready").unwrap();
    assert_eq!(ready.reason, "Provisioning", "{ready:?}");
    assert_eq!(
        condition_of(&failing, "MachineClaimed").unwrap().status,
        "True"
    );
    let mirrored = wait_for("Cluster API mirrors it", || async {
        let machines = capi_machines(&client, namespace).await;
        let m = machines.into_iter().next()?;
        let conditions = m.data["status"]["conditions"].as_array()?.clone();
        conditions
            .into_iter()
            .find(|c| {
                c["type"] == "InfrastructureReady"
                    && c["message"]
                        .as_str()
                        .is_some_and(|t| t.contains("BmcUnreachable"))
            })
            .map(|c| (m, c))
    })
    .await;
    assert_eq!(mirrored.1["status"], "False", "{:?}", mirrored.1);
    assert_ne!(text(&mirrored.0, "/status/phase"), Some("Failed"));
    // Held for a while: still retried, never terminal.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let still = &capi_machines(&client, namespace).await[0];
    assert_eq!(
        text(still, "/status/phase"),
        Some("Provisioning"),
        "{:?}",
        still.data["status"]
    );
    assert!(
        still
            .data
            .pointer("/status/deprecated/v1beta1/failureReason")
            .is_none()
    );
    // The BMC answers again: provisioned, and Running.
    for i in 0..2 {
        hardware.set_bmc_down(&format!("{group}-{i}"), false);
    }
    let running = wait_running(&client, namespace, 1).await;
    let id = text(&running[0], "/spec/providerID").unwrap().to_owned();
    let host = claimed_by_provider_id(&client, group).await[&id].name_any();

    // The host is deleted underneath: the UnboundedMachine says so, claims nothing else...
    kubectl(
        &[
            "delete",
            "machines.unbounded-cloud.io",
            &host,
            "--wait=true",
            "--timeout=120s",
        ],
        None,
    );
    let gone = wait_for("MachineClaimed false: gone", || async {
        let um = infrastructure_machines(&client, namespace)
            .await
            .into_iter()
            .next()?;
        let c = condition_of(&um, "MachineClaimed")?;
        (c.status == "False" && c.reason == "MachineGone").then_some(um)
    })
    .await;
    assert_eq!(gone.spec.provider_id.as_deref(), Some(id.as_str()));
    let other = machine(
        &client,
        &format!("{group}-{}", if host.ends_with('0') { 1 } else { 0 }),
    )
    .await;
    assert!(
        !other.labels().contains_key(labels::CAPI_MACHINE),
        "no second claim behind Cluster API's back"
    );
    // ...and its deletion does not wait for a host that is not there.
    kubectl(
        &[
            "scale",
            "-n",
            namespace,
            "machinedeployment/md",
            "--replicas=0",
        ],
        None,
    );
    wait_for(
        "every Cluster API Machine and UnboundedMachine gone",
        || async {
            let none = capi_machines(&client, namespace).await.is_empty()
                && infrastructure_machines(&client, namespace).await.is_empty();
            none.then_some(())
        },
    )
    .await;
}

#[tokio::test]
async fn two_deployments_and_a_pool_racing_for_one_inventory_never_claim_a_machine_twice() {
    let (namespace, group) = ("capi-race", "capi-race");
    let client = begin(group, 5, 0xc2, "c3-workers").await;
    let _hardware = StandInHardware::start(&client, group);
    let _power = StandInPower::start(&client, Arc::new(Mutex::new(BTreeSet::new())));
    let pool = |replicas: u32| {
        format!(
            "---\napiVersion: unbounded-cloud.io/v1alpha1\nkind: MachinePool\nmetadata: {{name: capi-race-pool}}\nspec:\n  replicas: {replicas}\n  template:\n    spec:\n      provider: pxe\n      pxe: {{inventorySelector: {{matchLabels: {{inv: {group}}}}}}}\n      configurationRef: {{name: c3-workers}}\n"
        )
    };

    // Every claim as the API server holds it: no Machine in a pool and claimed by an
    // UnboundedMachine, and no two UnboundedMachines standing for one Machine.
    let check = || async {
        let machines = Api::<Machine>::all(client.clone())
            .list(&ListParams::default().labels(&format!("inv={group}")))
            .await
            .unwrap()
            .items;
        let infra = infrastructure_machines(&client, namespace).await;
        let mut by_machine: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for um in &infra {
            if let Some(r) = um.status.as_ref().and_then(|s| s.machine_ref.as_ref()) {
                by_machine
                    .entry(r.name.clone())
                    .or_default()
                    .push(um.name_any());
            }
        }
        for (machine, claimants) in &by_machine {
            assert_eq!(claimants.len(), 1, "{machine} stands for {claimants:?}");
        }
        let mut claimed = 0;
        for m in &machines {
            let in_pool = m.labels().contains_key(labels::POOL);
            let uid = m.labels().get(labels::CAPI_MACHINE);
            assert!(
                !(in_pool && uid.is_some()),
                "{} is in a pool and claimed by {uid:?}",
                m.name_any()
            );
            if let Some(uid) = uid {
                let owner = infra
                    .iter()
                    .find(|um| um.metadata.uid.as_ref() == Some(uid));
                // The UnboundedMachine may be deleted already (a release in progress keeps
                // no label): a label names a live claimant or none.
                if let Some(r) = owner.and_then(|um| um.status.as_ref()?.machine_ref.as_ref()) {
                    assert_eq!(r.name, m.name_any(), "claim label and machineRef disagree");
                }
            }
            claimed += usize::from(in_pool || uid.is_some());
        }
        claimed
    };
    for round in 0..3 {
        kubectl(
            &["apply", "-f", "-"],
            Some(
                &(if round == 0 {
                    infrastructure(namespace, "c3", group)
                } else {
                    String::new()
                } + &deployment(namespace, "c3", "md-a", 3, "v1.35.3")
                    + &deployment(namespace, "c3", "md-b", 3, "v1.35.3")
                    + &pool(2)),
            ),
        );
        // Eight wanted, five there: all five claimed, each once.
        let deadline = std::time::Instant::now() + Duration::from_secs(180);
        loop {
            let claimed = check().await;
            let standing = infrastructure_machines(&client, namespace)
                .await
                .iter()
                .filter(|um| {
                    um.status
                        .as_ref()
                        .and_then(|s| s.machine_ref.as_ref())
                        .is_some()
                })
                .count();
            let pooled = Api::<Machine>::all(client.clone())
                .list(&ListParams::default().labels(&format!("inv={group},{}", labels::POOL)))
                .await
                .unwrap()
                .items
                .len();
            if claimed == 5 && standing + pooled == 5 {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "round {round}: {claimed} claimed, {standing} UnboundedMachines and {pooled} pool members hold one"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        // The UnboundedMachines left over (six wanted by the deployments) say why.
        wait_for(
            &format!("round {round}: the ones left over say NoFreeMachine"),
            || async {
                let infra = infrastructure_machines(&client, namespace).await;
                let left: Vec<_> = infra
                    .iter()
                    .filter(|um| {
                        um.status
                            .as_ref()
                            .and_then(|s| s.machine_ref.as_ref())
                            .is_none()
                    })
                    .collect();
                let all_say = left.iter().all(|um| {
                    condition_of(um, "MachineClaimed").is_some_and(|c| c.reason == "NoFreeMachine")
                });
                (infra.len() == 6 && !left.is_empty() && all_say).then_some(())
            },
        )
        .await;
        check().await;
        // Everyone lets go; every Machine comes back free.
        kubectl(
            &[
                "scale",
                "-n",
                namespace,
                "machinedeployment/md-a",
                "machinedeployment/md-b",
                "--replicas=0",
            ],
            None,
        );
        kubectl(
            &[
                "scale",
                "machinepools.unbounded-cloud.io/capi-race-pool",
                "--replicas=0",
            ],
            None,
        );
        wait_for(
            &format!("round {round}: every Machine free again"),
            || async {
                let machines = Api::<Machine>::all(client.clone())
                    .list(&ListParams::default().labels(&format!("inv={group}")))
                    .await
                    .unwrap()
                    .items;
                let free = machines.iter().all(|m| {
                    !m.labels().contains_key(labels::POOL)
                        && !m.labels().contains_key(labels::CAPI_MACHINE)
                        && !m.annotations().contains_key(annotations::REPAVE)
                });
                (free && infrastructure_machines(&client, namespace).await.is_empty()).then_some(())
            },
        )
        .await;
        check().await;
    }
}

/// `docs/cluster-api.md`'s install: clusterctl reads the repository
/// `scripts/cluster-api-repository` writes (each provider's components and metadata, at
/// the workspace's version) and what it makes of them applies; and the kustomize component
/// turns the provider on in the controller's Deployment.
#[test]
fn clusterctl_reads_our_providers_and_the_component_turns_the_provider_on() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let out = tempfile::tempdir().unwrap();
    let written = std::process::Command::new(root.join("scripts/cluster-api-repository"))
        .arg(out.path())
        .output()
        .unwrap();
    assert!(
        written.status.success(),
        "{}",
        String::from_utf8_lossy(&written.stderr)
    );
    let binaries = ClusterApiBinaries::ensure().unwrap();
    let version = format!("unbounded:v{}", env!("CARGO_PKG_VERSION"));
    for (flag, provider, kinds) in [
        (
            "--infrastructure",
            "infrastructure-unbounded",
            &[
                "UnboundedMachine",
                "UnboundedMachineTemplate",
                "UnboundedCluster",
                "UnboundedClusterTemplate",
            ][..],
        ),
        (
            "--bootstrap",
            "bootstrap-unbounded",
            &["UnboundedConfig", "UnboundedConfigTemplate"][..],
        ),
        (
            "--control-plane",
            "control-plane-unbounded",
            &["UnboundedControlPlane", "UnboundedControlPlaneTemplate"][..],
        ),
    ] {
        let generated = std::process::Command::new(&binaries.clusterctl)
            .args(["generate", "provider", flag, &version, "--config"])
            .arg(out.path().join("clusterctl.yaml"))
            .output()
            .unwrap();
        let components = String::from_utf8_lossy(&generated.stdout).into_owned();
        assert!(
            generated.status.success(),
            "clusterctl {flag}: {}",
            String::from_utf8_lossy(&generated.stderr)
        );
        assert!(
            components.contains(&format!("cluster.x-k8s.io/provider: {provider}")),
            "{components}"
        );
        for kind in kinds {
            assert!(
                components.contains(&format!("kind: {kind}\n")),
                "{provider} lacks {kind}"
            );
        }
        control_plane()
            .kubectl_with_input(
                &["apply", "--server-side", "--dry-run=server", "-f", "-"],
                Some(&components),
            )
            .unwrap_or_else(|e| panic!("{provider}'s components do not apply: {e}"));
    }
    // Kustomize takes only relative paths to a base.
    let overlay = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let relative = |to: &str| relative_path(overlay.path(), &root.join(to));
    std::fs::write(
        overlay.path().join("kustomization.yaml"),
        format!(
            "resources: [{}]\ncomponents: [{}]\n",
            relative("deploy"),
            relative("deploy/cluster-api")
        ),
    )
    .unwrap();
    let rendered = control_plane()
        .kubectl_with_input(&["kustomize", &overlay.path().display().to_string()], None)
        .unwrap();
    let controller = rendered
        .split("\n---\n")
        .find(|d| d.contains("kind: Deployment") && d.contains("name: unbounded-controller\n"))
        .expect("the controller's Deployment");
    assert!(controller.contains("UNBOUNDED_CLUSTER_API"), "{controller}");
    assert!(rendered.contains("cluster.x-k8s.io/aggregate-to-manager: \"true\""));
    assert!(rendered.contains("name: unboundedmachines.infrastructure.cluster.x-k8s.io"));
}

/// `to` as a path relative to the directory `from` (both made absolute).
fn relative_path(from: &std::path::Path, to: &std::path::Path) -> String {
    let (from, to) = (from.canonicalize().unwrap(), to.canonicalize().unwrap());
    let common = from
        .components()
        .zip(to.components())
        .take_while(|(a, b)| a == b)
        .count();
    let ups = from.components().count() - common;
    let mut parts: Vec<String> = vec!["..".to_owned(); ups];
    parts.extend(
        to.components()
            .skip(common)
            .map(|c| c.as_os_str().to_string_lossy().into_owned()),
    );
    parts.join("/")
}

/// An Azure UnboundedMachine creates its Machine (named `<namespace>-<name>`, the claim
/// label and the configuration on it), waits for the provider's ID without failing, and its
/// deletion deletes the Machine and waits until it is gone.
#[tokio::test]
async fn an_azure_unbounded_machine_creates_its_machine_and_deletes_it() {
    let namespace = "capi-azure";
    let client = begin("none", 0, 0, "c4-workers").await;
    let azure = r#"{provider: azure, azure: {subscriptionID: 00000000-0000-0000-0000-000000000000, resourceGroup: rg-nodes, location: westeurope, vmSize: Standard_D4s_v5, image: {publisher: Debian, offer: debian-12, sku: 12-gen2}, subnetID: /subscriptions/00000000-0000-0000-0000-000000000000/resourceGroups/rg/providers/Microsoft.Network/virtualNetworks/v/subnets/nodes, sshPublicKey: ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIKq7bqZ9sS0Wm7mFsJkZq0QJtqgS3D6p2mW1Zl3f7cuA ops@example, credentialsSecretRef: {namespace: unbounded-system, name: azure-sp}}}"#;
    // The Cluster's infrastructure as for PXE, with the machine template made Azure.
    let objects = infrastructure(namespace, "c4", "none")
        .replace(
            "spec: {template: {spec: {provider: pxe, pxe: {inventorySelector: {matchLabels: {inv: none}}}}}}",
            &format!("spec: {{template: {{spec: {azure}}}}}"),
        )
        + &deployment(namespace, "c4", "md", 1, "v1.35.3");
    assert!(
        objects.contains("provider: azure"),
        "the template was not replaced:\n{objects}"
    );
    kubectl(&["apply", "-f", "-"], Some(&objects));
    let um = wait_for("the UnboundedMachine's Machine created", || async {
        let um = infrastructure_machines(&client, namespace)
            .await
            .into_iter()
            .next()?;
        let ready = condition_of(&um, "Ready")?;
        (ready.reason == "WaitingForProviderID").then_some(um)
    })
    .await;
    let name = format!("{namespace}-{}", um.name_any());
    let created = machine(&client, &name).await;
    assert_eq!(created.spec.provider, unbounded_api::MachineProvider::Azure);
    assert_eq!(
        created.labels().get(labels::CAPI_MACHINE),
        um.metadata.uid.as_ref()
    );
    let reference = created.spec.configuration_ref.clone().unwrap();
    assert_eq!(
        (reference.name.as_str(), reference.version),
        ("c4-workers", Some(1))
    );
    assert_eq!(
        created
            .spec
            .azure
            .as_ref()
            .map(|a| a.resource_group.as_str()),
        Some("rg-nodes")
    );
    // Waiting is not failing: the Cluster API Machine stays Provisioning.
    let capi_machine = &capi_machines(&client, namespace).await[0];
    assert_eq!(text(capi_machine, "/status/phase"), Some("Provisioning"));

    kubectl(
        &[
            "scale",
            "-n",
            namespace,
            "machinedeployment/md",
            "--replicas=0",
        ],
        None,
    );
    wait_for("the Machine and the UnboundedMachine gone", || async {
        let gone = Api::<Machine>::all(client.clone())
            .get_opt(&name)
            .await
            .unwrap()
            .is_none()
            && infrastructure_machines(&client, namespace).await.is_empty();
        gone.then_some(())
    })
    .await;
}
