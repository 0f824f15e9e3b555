#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic is the test failure report
//! A `manual` Machine has no provider loop: the controller itself keeps a deleted one until
//! its agent reported its disks wiped, as its configuration says (`wipe: onRelease`), and
//! lets one with `wipe: never` go at once. Against the real API server and controller
//! binary; the agent's status writes are made as the agent makes them (server-side apply
//! under its field manager).

mod common;

use common::*;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use serde_json::{Value, json};
use unbounded_api::Machine;
use unbounded_api::well_known::{conditions, field_managers, finalizers, reasons};

async fn agent_writes(client: &kube::Client, name: &str, configuration: &str, wipe: Value) {
    let mut agent = json!({"bootID": "b-1", "paved": {"name": configuration, "version": 1}});
    if !wipe.is_null() {
        agent["releaseWipe"] = wipe;
    }
    Api::<Machine>::all(client.clone())
        .patch_status(
            name,
            &PatchParams::apply(field_managers::AGENT).force(),
            &Patch::Apply(json!({
                "apiVersion": "unbounded-cloud.io/v1alpha1", "kind": "Machine",
                "status": {"agent": agent},
            })),
        )
        .await
        .unwrap();
}

async fn gone(client: &kube::Client, name: &str) {
    wait_for(&format!("{name} gone"), || async {
        Api::<Machine>::all(client.clone())
            .get_opt(name)
            .await
            .unwrap()
            .is_none()
            .then_some(())
    })
    .await;
}

#[tokio::test]
async fn a_deleted_manual_machine_is_kept_until_its_disks_are_wiped() {
    start_controller();
    let client = client().await;
    for (configuration, wipe, label) in [
        ("wipe-on-release", "onRelease", "wipes"),
        ("wipe-never", "never", "keeps"),
    ] {
        let mut template = template("http://boot/vmlinuz");
        template["storage"] = json!({"wipe": wipe});
        create_configuration(
            &client,
            configuration,
            json!({"machineSelector": {"matchLabels": {"release-wipe": label}}, "template": template}),
        )
        .await;
    }
    create_machine(
        &client,
        "rw-wipes",
        json!({"release-wipe": "wipes"}),
        json!({}),
    )
    .await;
    create_machine(
        &client,
        "rw-keeps",
        json!({"release-wipe": "keeps"}),
        json!({}),
    )
    .await;
    wait_resolved(&client, "rw-wipes", "wipe-on-release", 1).await;
    wait_resolved(&client, "rw-keeps", "wipe-never", 1).await;
    agent_writes(&client, "rw-wipes", "wipe-on-release", Value::Null).await;
    agent_writes(&client, "rw-keeps", "wipe-never", Value::Null).await;

    let api: Api<Machine> = Api::all(client.clone());
    for name in ["rw-keeps", "rw-wipes"] {
        api.delete(name, &DeleteParams::default()).await.unwrap();
    }
    gone(&client, "rw-keeps").await;

    // The controller looked (it wrote WipePending) and kept its finalizer.
    let waiting = wait_for("rw-wipes: DisksWiped WipePending", || async {
        let m = machine(&client, "rw-wipes").await;
        (condition(&m, conditions::DISKS_WIPED)?.reason == reasons::WIPE_PENDING).then_some(m)
    })
    .await;
    assert!(
        waiting
            .finalizers()
            .iter()
            .any(|f| f == finalizers::MACHINE)
    );
    agent_writes(
        &client,
        "rw-wipes",
        "wipe-on-release",
        json!({"state": "Wiped", "method": "fast", "disks": ["sda"]}),
    )
    .await;
    gone(&client, "rw-wipes").await;
}

/// A PXE pool's release to the inventory: the controller drains the Node, asks the agent to
/// wipe under the *releasing* tenant's policy (`unbounded-cloud.io/release-wipe`), and
/// creates the `powerOff` only once the agent reported the wipe for this release. Before,
/// the machine was powered off at once and the wipe left to the next claim, under the
/// next tenant's policy.
#[tokio::test]
async fn a_pool_release_powers_off_only_after_the_releasing_tenants_wipe() {
    use std::sync::{Arc, Mutex};
    use unbounded_api::MachineOperation;
    use unbounded_api::well_known::{annotations, labels};

    start_controller();
    let client = client().await;
    let mut tenant = template("http://boot/vmlinuz");
    tenant["storage"] = json!({"wipe": "onRelease"});
    create_configuration(&client, "rel-tenant", json!({"template": tenant})).await;
    rollout::kubectl(
        &["apply", "-f", "-"],
        Some(
            r#"apiVersion: unbounded-cloud.io/v1alpha1
kind: Machine
metadata: {name: rel-inv-0, labels: {inv: rel}}
spec:
  provider: pxe
  pxe: {macAddresses: ["52:54:00:e1:00:01"]}
---
apiVersion: unbounded-cloud.io/v1alpha1
kind: MachinePool
metadata: {name: rel-pool}
spec:
  replicas: 1
  template:
    spec:
      provider: pxe
      pxe: {inventorySelector: {matchLabels: {inv: rel}}}
      configurationRef: {name: rel-tenant}
"#,
        ),
    );
    let name = "rel-inv-0";
    let kubelet = rollout::StandInKubelet::start(
        &client,
        vec![name.to_owned()],
        "rel-tenant",
        Arc::new(Mutex::new(1)),
        std::time::Duration::ZERO,
    );
    let _power = rollout::StandInPower::start(&client, kubelet.withheld.clone());
    rollout::wait_all_running_on(&client, &[name.to_owned()], "rel-tenant", 1, TIMEOUT).await;
    // The tenant's agent paved its version (onto a disk, as its storage says).
    agent_writes(&client, name, "rel-tenant", Value::Null).await;

    rollout::kubectl(&["scale", "mp/rel-pool", "--replicas=0"], None);
    let waiting = wait_for("the wipe requested, the power-off waiting", || async {
        let m = machine(&client, name).await;
        let pending = condition(&m, conditions::DISKS_WIPED)?.reason == reasons::WIPE_PENDING;
        (pending && m.annotations().contains_key(annotations::RELEASE_WIPE)).then_some(m)
    })
    .await;
    let request = waiting.annotations()[annotations::RELEASE_WIPE].clone();
    assert_eq!(
        waiting.annotations().get(annotations::RELEASE),
        Some(&request),
        "the request names the release"
    );
    let operations = Api::<MachineOperation>::all(client.clone());
    let power_offs = || async {
        operations
            .list(&kube::api::ListParams::default().labels(&format!("{}={name}", labels::MACHINE)))
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|o| o.spec.operation_name == "powerOff")
            .count()
    };
    assert_eq!(power_offs().await, 0, "powered off before the wipe");
    let nodes = Api::<k8s_openapi::api::core::v1::Node>::all(client.clone());
    assert!(
        nodes.get_opt(name).await.unwrap().is_some(),
        "the Node stays until the power-off"
    );

    // The agent reports the wipe of this release: the power-off follows, then the Node goes
    // and the release's marks with it.
    agent_writes(
        &client,
        name,
        "rel-tenant",
        json!({"state": "Wiped", "method": "fast", "disks": ["sda"], "request": request}),
    )
    .await;
    let released = wait_for("released: wiped, powered off, Node gone", || async {
        let m = machine(&client, name).await;
        let done = nodes.get_opt(name).await.unwrap().is_none()
            && !m.annotations().contains_key(annotations::RELEASE)
            && !m.annotations().contains_key(annotations::RELEASE_WIPE)
            && !m.annotations().contains_key(annotations::REPAVE);
        done.then_some(m)
    })
    .await;
    assert_eq!(power_offs().await, 1);
    let wiped = condition(&released, conditions::DISKS_WIPED).unwrap();
    assert_eq!(
        (wiped.status.as_str(), wiped.reason.as_str()),
        ("True", reasons::WIPED),
        "{wiped:?}"
    );
}
