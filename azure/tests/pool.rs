//! An Azure MachinePool end to end: the controller (in this process), the `unbounded-azure`
//! binary and the local fake of Azure. Scaling up creates Machines whose VMs the provider
//! creates; `kubectl scale` down deletes the annotated Machine first, its Node drained and
//! deleted, then its VM, NIC and disk.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::process::{ProviderProcess, get, kubectl};
use common::{CLIENT_ID, FakeAzure, TENANT, wait_until};
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube::api::{ListParams, PostParams};
use unbounded_api::Machine;
use unbounded_testbed::cluster::LocalControlPlane;

const CLIENT_SECRET: &str = "p00l-cl1ent-s3cret-value";
const SUB: &str = "7a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d";
const SUBNET: &str = "/subscriptions/7a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d/resourceGroups/rg-net/providers/Microsoft.Network/virtualNetworks/vnet/subnets/nodes";
const SSH_KEY: &str =
    "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIKq7bqZ9sS0Wm7mFsJkZq0QJtqgS3D6p2mW1Zl3f7cuA ops@example";
const WAIT: Duration = Duration::from_secs(90);

fn manifests() -> String {
    format!(
        r#"apiVersion: v1
kind: Secret
metadata: {{name: az-pool-sp, namespace: default}}
stringData: {{tenantID: {TENANT}, clientID: {CLIENT_ID}, clientSecret: {CLIENT_SECRET}}}
---
apiVersion: unbounded-cloud.io/v1alpha1
kind: MachineConfiguration
metadata: {{name: az-pool-mc}}
spec:
  template:
    kubernetes: {{version: v1.35.4}}
---
apiVersion: unbounded-cloud.io/v1alpha1
kind: MachinePool
metadata: {{name: azp}}
spec:
  replicas: 2
  template:
    metadata: {{labels: {{lab: azure-pool}}}}
    spec:
      provider: azure
      configurationRef: {{name: az-pool-mc}}
      azure:
        subscriptionID: {SUB}
        resourceGroup: rg-pool
        location: westeurope
        vmSize: Standard_D2s_v5
        image: {{publisher: Debian, offer: debian-12, sku: 12-gen2}}
        subnetID: {SUBNET}
        sshPublicKey: "{SSH_KEY}"
        credentialsSecretRef: {{namespace: default, name: az-pool-sp}}
"#
    )
}

fn members(cp: &LocalControlPlane) -> Vec<String> {
    let mut names: Vec<String> = cp
        .kubectl_output(&[
            "get",
            "machines",
            "-l",
            "unbounded-cloud.io/pool=azp",
            "-o",
            "jsonpath={.items[*].metadata.name}",
        ])
        .unwrap_or_default()
        .split_whitespace()
        .map(str::to_owned)
        .collect();
    names.sort();
    names
}

async fn register_node(client: &kube::Client, name: &str) {
    let node: Node = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Node", "metadata": {"name": name}
    }))
    .unwrap();
    Api::<Node>::all(client.clone())
        .create(&PostParams::default(), &node)
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn azure_pool_creates_and_deletes_vms_as_it_scales() {
    let cp = LocalControlPlane::shared().unwrap();
    let client = cp.client().await.unwrap();
    // The agents' namespace: the controller creates each Machine's ServiceAccount there
    // before the provider mints the VM's first credentials.
    let namespace = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/namespace.yaml");
    kubectl(cp, &["apply", "--server-side", "-f", namespace], None);
    tokio::spawn(unbounded_controller::runner::run(
        client.clone(),
        unbounded_controller::context::Settings::default(),
        Arc::new(unbounded_controller::metrics::Metrics::new(
            &mut prometheus_client::registry::Registry::default(),
        )),
        std::future::pending(),
    ));
    let fake = FakeAzure::start().await;
    fake.with(|s| {
        s.client_secrets.insert(CLIENT_SECRET.into());
        s.groups.insert(format!("{SUB}/rg-pool"));
        s.subnets.insert(SUBNET.to_ascii_lowercase());
    });
    let provider = ProviderProcess::start(cp, &fake);
    let logs = || format!("provider log:\n{}", provider.log());

    kubectl(cp, &["apply", "-f", "-"], Some(&manifests()));
    wait_until("two Machines", WAIT, logs, || async {
        members(cp) == ["azp-0", "azp-1"]
    })
    .await;
    for name in ["azp-0", "azp-1"] {
        wait_until(&format!("{name}'s VM ready"), WAIT, logs, || async {
            get(
                cp,
                "machine",
                name,
                "{.status.conditions[?(@.type==\"InfrastructureReady\")].status}",
            ) == "True"
        })
        .await;
        assert_eq!(
            fake.requests_to("PUT", &format!("virtualMachines/{name}"))
                .len(),
            1
        );
        assert_eq!(
            get(cp, "machine", name, "{.metadata.ownerReferences[0].name}"),
            "azp"
        );
    }

    // Up to 3 with kubectl: one more VM.
    kubectl(cp, &["scale", "mp/azp", "--replicas=3"], None);
    wait_until("azp-2's VM ready", WAIT, logs, || async {
        get(
            cp,
            "machine",
            "azp-2",
            "{.status.conditions[?(@.type==\"InfrastructureReady\")].status}",
        ) == "True"
    })
    .await;

    // Down to 2: the annotated Machine goes; its Node is drained and deleted, then its VM.
    register_node(&client, "azp-0").await;
    kubectl(
        cp,
        &[
            "annotate",
            "machine",
            "azp-0",
            "unbounded-cloud.io/delete-machine=yes",
        ],
        None,
    );
    kubectl(cp, &["scale", "mp/azp", "--replicas=2"], None);
    let machines: Api<Machine> = Api::all(client.clone());
    wait_until("azp-0 deleted", WAIT, logs, || async {
        machines.get_opt("azp-0").await.unwrap().is_none()
    })
    .await;
    assert!(
        Api::<Node>::all(client.clone())
            .get_opt("azp-0")
            .await
            .unwrap()
            .is_none(),
        "its Node went first"
    );
    for fragment in [
        "virtualMachines/azp-0",
        "networkInterfaces/azp-0-nic",
        "disks/azp-0-osdisk",
    ] {
        assert!(
            !fake.requests_to("DELETE", fragment).is_empty(),
            "DELETE {fragment}"
        );
    }
    assert_eq!(members(cp), ["azp-1", "azp-2"]);
    assert!(
        fake.requests_to("DELETE", "virtualMachines/azp-1")
            .is_empty()
    );
    wait_until("status.replicas 2", WAIT, logs, || async {
        get(cp, "mp", "azp", "{.status.replicas}") == "2"
    })
    .await;

    // Deleting the pool deletes its VMs.
    kubectl(cp, &["delete", "mp", "azp", "--wait=false"], None);
    wait_until("every pool Machine gone", WAIT, logs, || async {
        machines
            .list(&ListParams::default().labels("unbounded-cloud.io/pool=azp"))
            .await
            .unwrap()
            .items
            .is_empty()
    })
    .await;
    for name in ["azp-1", "azp-2"] {
        assert!(
            !fake
                .requests_to("DELETE", &format!("virtualMachines/{name}"))
                .is_empty(),
            "{name}'s VM deleted"
        );
    }
}
