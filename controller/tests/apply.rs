//! `applyConfiguration` against a real kube-apiserver with the controller binary running:
//! a label and taint change applied in place (the Node patched, its UID unchanged, the
//! version recorded, no repave), a change that needs a repave refused without `disruptive`,
//! and carried out with it (the Node cordoned, drained and deleted; the new version recorded).

#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic is the test failure report

mod common;

use common::*;
use k8s_openapi::api::core::v1::Node;
use kube::Client;
use kube::api::{Api, PostParams};
use serde_json::{Value, json};
use unbounded_api::well_known::annotations;
use unbounded_api::{MachineOperation, MachinePhase, OperationState};

fn template(tier: &str, kubernetes_version: &str, taint: bool) -> Value {
    let taints = if taint {
        json!([{"key": "dedicated", "value": tier, "effect": "NoSchedule"}])
    } else {
        json!([])
    };
    json!({"boot": {"kernelURL": "k", "initrdURL": "i"},
           "kubernetes": {"version": kubernetes_version, "nodeLabels": {"tier": tier}, "nodeTaints": taints}})
}

async fn apply(client: &Client, name: &str, machine: &str, parameters: Value) {
    let api: Api<MachineOperation> = Api::all(client.clone());
    let object: MachineOperation = serde_json::from_value(json!({
        "apiVersion": "unbounded-cloud.io/v1alpha1", "kind": "MachineOperation",
        "metadata": {"name": name},
        "spec": {"machineRef": {"name": machine}, "operationName": "applyConfiguration", "parameters": parameters},
    }))
    .unwrap();
    api.create(&PostParams::default(), &object).await.unwrap();
}

/// Waits until the operation has finished; returns its state and message.
async fn finished(client: &Client, name: &str) -> (OperationState, String) {
    let api: Api<MachineOperation> = Api::all(client.clone());
    wait_for(&format!("operation {name} to finish"), || async {
        let status = api.get(name).await.unwrap().status?;
        let state = status.state.filter(|s| s.is_finished())?;
        Some((state, status.message.unwrap_or_default()))
    })
    .await
}

async fn node(client: &Client, name: &str) -> Option<Node> {
    Api::<Node>::all(client.clone())
        .get_opt(name)
        .await
        .unwrap()
}

async fn running_on(client: &Client, machine_name: &str, version: i64) {
    wait_for(&format!("{machine_name} Running on v{version}"), || async {
        let s = machine(client, machine_name).await.status?;
        (s.phase == Some(MachinePhase::Running) && s.configuration?.version == version)
            .then_some(())
    })
    .await;
}

#[tokio::test]
async fn apply_configuration_in_place_refused_and_disruptive() {
    start_controller();
    let client = client().await;
    let (mc, m) = ("ap-mc", "ap-m1");
    create_configuration(
        &client,
        mc,
        json!({"template": template("a", "v1.35.4", false)}),
    )
    .await;
    create_machine(
        &client,
        m,
        json!({}),
        json!({"configurationRef": {"name": mc}}),
    )
    .await;
    wait_resolved(&client, m, mc, 1).await;
    let uid = create_node(&client, m, true).await.metadata.uid.unwrap();
    running_on(&client, m, 1).await;

    // v2 changes a label and adds a taint: applied in place.
    set_template(&client, mc, template("b", "v1.35.4", true)).await;
    wait_for("ap-mc-v2", || async { version(&client, "ap-mc-v2").await }).await;
    apply(&client, "ap-op-labels", m, json!({"version": "2"})).await;
    let (state, message) = finished(&client, "ap-op-labels").await;
    assert_eq!(state, OperationState::Complete, "{message}");
    assert!(message.contains("in place"), "{message}");
    let n = node(&client, m).await.expect("the Node is still there");
    assert_eq!(
        n.metadata.uid.as_deref(),
        Some(uid.as_str()),
        "the Node was not replaced"
    );
    let labels = n.metadata.labels.clone().unwrap_or_default();
    assert_eq!(labels.get("tier").map(String::as_str), Some("b"));
    let taints = n.spec.clone().and_then(|s| s.taints).unwrap_or_default();
    assert!(
        taints
            .iter()
            .any(|t| t.key == "dedicated" && t.value.as_deref() == Some("b")),
        "{taints:?}"
    );
    let recorded = machine(&client, m).await;
    assert_eq!(
        recorded
            .status
            .as_ref()
            .unwrap()
            .configuration
            .as_ref()
            .unwrap()
            .version,
        2
    );
    let machine_annotations = recorded.metadata.annotations.clone().unwrap_or_default();
    assert!(
        !machine_annotations.contains_key(annotations::REPAVE)
            && !machine_annotations.contains_key(annotations::REPAVING),
        "no repave: {machine_annotations:?}"
    );
    // The Node's version annotation follows the recorded version.
    wait_for("the Node annotated with version 2", || async {
        let n = node(&client, m).await?;
        (n.metadata
            .annotations?
            .get(annotations::MACHINE_CONFIGURATION_VERSION)?
            == "2")
            .then_some(())
    })
    .await;

    // v3 changes the Kubernetes version: refused without disruptive, nothing touched.
    set_template(&client, mc, template("b", "v1.34.2", true)).await;
    wait_for("ap-mc-v3", || async { version(&client, "ap-mc-v3").await }).await;
    apply(&client, "ap-op-refused", m, json!({"version": "3"})).await;
    let (state, message) = finished(&client, "ap-op-refused").await;
    assert_eq!(state, OperationState::Failed, "{message}");
    assert!(
        message.contains("needs a repave: kubernetes.version changed")
            && message.contains("disruptive"),
        "{message}"
    );
    let n = node(&client, m).await.expect("the Node is still there");
    assert_eq!(n.metadata.uid.as_deref(), Some(uid.as_str()));
    let recorded = machine(&client, m).await;
    assert_eq!(
        recorded
            .status
            .as_ref()
            .unwrap()
            .configuration
            .as_ref()
            .unwrap()
            .version,
        2
    );
    assert!(
        !recorded
            .metadata
            .annotations
            .unwrap_or_default()
            .contains_key(annotations::REPAVE)
    );

    // With disruptive: the Node is drained and deleted, the Machine records v3; the agent
    // (played here) registers the Node again and the operation completes.
    apply(
        &client,
        "ap-op-repave",
        m,
        json!({"version": "3", "disruptive": "true"}),
    )
    .await;
    wait_for("the Node deleted for the repave", || async {
        match node(&client, m).await {
            None => Some(()),
            Some(n) => (n.metadata.uid.as_deref() != Some(uid.as_str())).then_some(()),
        }
    })
    .await;
    wait_resolved(&client, m, mc, 3).await;
    create_node(&client, m, true).await;
    let (state, message) = finished(&client, "ap-op-repave").await;
    assert_eq!(state, OperationState::Complete, "{message}");
    running_on(&client, m, 3).await;
}

/// With RollingUpdate, a version whose changes are all in place rolls through
/// applyConfiguration operations: every Machine records it, no Node is replaced or
/// cordoned, no repave is requested.
#[tokio::test]
async fn rolling_update_applies_in_place_changes_without_repaves() {
    start_controller();
    let client = client().await;
    let mc = "ap-roll";
    let names = ["ap-roll-1", "ap-roll-2", "ap-roll-3"];
    create_configuration(
        &client,
        mc,
        json!({"machineSelector": {"matchLabels": {"ap": "roll"}},
               "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1}},
               "template": template("a", "v1.35.4", false)}),
    )
    .await;
    let mut uids = Vec::new();
    for name in names {
        create_machine(&client, name, json!({"ap": "roll"}), json!({})).await;
        wait_resolved(&client, name, mc, 1).await;
        uids.push(create_node(&client, name, true).await.metadata.uid.unwrap());
        running_on(&client, name, 1).await;
    }

    set_template(&client, mc, template("b", "v1.35.4", true)).await;
    for name in names {
        wait_resolved(&client, name, mc, 2).await;
        let op = format!("{name}-apply-v2");
        let (state, message) = finished(&client, &op).await;
        assert_eq!(state, OperationState::Complete, "{op}: {message}");
    }
    for (name, uid) in names.iter().zip(&uids) {
        let n = node(&client, name).await.expect("the Node is still there");
        assert_eq!(n.metadata.uid.as_ref(), Some(uid), "{name}: Node replaced");
        assert_eq!(
            n.metadata
                .labels
                .unwrap_or_default()
                .get("tier")
                .map(String::as_str),
            Some("b"),
            "{name}"
        );
        assert_ne!(
            n.spec.and_then(|s| s.unschedulable),
            Some(true),
            "{name} was cordoned"
        );
        let a = machine(&client, name)
            .await
            .metadata
            .annotations
            .unwrap_or_default();
        assert!(
            !a.contains_key(annotations::REPAVE) && !a.contains_key(annotations::REPAVING),
            "{name} was repaved: {a:?}"
        );
    }
}
