//! A configuration's `kubernetes.version` as the kubelet a Node runs, against a real
//! kube-apiserver (v1.35) with the controller binary running: a version the skew policy
//! refuses is never recorded (so nothing is paved with it), and the Machine reports the
//! kubelet version its Node runs and whether it is the one its version asks for.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic is the test failure report

mod common;

use common::*;
use k8s_openapi::api::core::v1::Node;
use kube::Client;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;
use unbounded_api::MachinePhase;
use unbounded_api::well_known::conditions;

fn template(version: &str) -> serde_json::Value {
    json!({"boot": {"kernelURL": "k", "initrdURL": "i"}, "kubernetes": {"version": version}})
}

async fn report_kubelet(client: &Client, node: &str, version: &str) {
    let info = json!({"machineID": "m", "systemUUID": "u", "bootID": "b", "kernelVersion": "6.1",
        "osImage": "unbounded", "containerRuntimeVersion": "containerd://2.0", "kubeletVersion": version,
        "kubeProxyVersion": "", "operatingSystem": "linux", "architecture": "amd64"});
    Api::<Node>::all(client.clone())
        .patch_status(
            node,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"nodeInfo": info}})),
        )
        .await
        .unwrap();
}

#[tokio::test]
async fn a_kubelet_newer_than_the_api_server_is_refused() {
    start_controller();
    let client = client().await;
    create_configuration(
        &client,
        "kv-newer",
        json!({"template": template("v1.99.0")}),
    )
    .await;
    create_machine(
        &client,
        "kv-newer-m",
        json!({}),
        json!({"configurationRef": {"name": "kv-newer"}}),
    )
    .await;
    let m = wait_for("the skew refusal", || async {
        let m = machine(&client, "kv-newer-m").await;
        let refused = condition(&m, conditions::CONFIGURATION_RESOLVED)
            .is_some_and(|c| c.status == "False" && c.reason == "KubeletNewerThanAPIServer");
        refused.then_some(m)
    })
    .await;
    let c = condition(&m, conditions::CONFIGURATION_RESOLVED).unwrap();
    assert!(
        c.message
            .contains("kubelet v1.99.0 is newer than the API server (v1.35"),
        "{}",
        c.message
    );
    let status = m.status.unwrap();
    assert_eq!(
        status.configuration, None,
        "nothing recorded, nothing paved"
    );
    assert_eq!(status.phase, Some(MachinePhase::Pending));
    let v1 = version(&client, "kv-newer-v1").await.unwrap();
    assert!(
        !v1.status.is_some_and(|s| s.deployed),
        "the version is not deployed"
    );

    // A configuration with a supported version (one minor older) is recorded.
    create_configuration(
        &client,
        "kv-older",
        json!({"template": template("v1.34.2")}),
    )
    .await;
    Api::<unbounded_api::Machine>::all(client.clone())
        .patch(
            "kv-newer-m",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"configurationRef": {"name": "kv-older"}}})),
        )
        .await
        .unwrap();
    wait_resolved(&client, "kv-newer-m", "kv-older", 1).await;
}

#[tokio::test]
async fn the_machine_reports_its_kubelet_and_flags_a_different_one() {
    start_controller();
    let client = client().await;
    create_configuration(
        &client,
        "kv-report",
        json!({"template": template("v1.35.4")}),
    )
    .await;
    create_machine(
        &client,
        "kv-report-m",
        json!({}),
        json!({"configurationRef": {"name": "kv-report"}}),
    )
    .await;
    wait_resolved(&client, "kv-report-m", "kv-report", 1).await;
    create_node(&client, "kv-report-m", true).await;
    report_kubelet(&client, "kv-report-m", "v1.34.2").await;
    let m = wait_for("the kubelet version flagged", || async {
        let m = machine(&client, "kv-report-m").await;
        let flagged = condition(&m, "KubeletVersion")
            .is_some_and(|c| c.status == "False" && c.reason == "KubeletVersionDiffers");
        flagged.then_some(m)
    })
    .await;
    assert_eq!(
        m.status.as_ref().unwrap().kubelet_version.as_deref(),
        Some("v1.34.2")
    );
    assert_eq!(
        condition(&m, "KubeletVersion").unwrap().message,
        "the Node runs kubelet v1.34.2, but its version asks for v1.35.4"
    );
    report_kubelet(&client, "kv-report-m", "v1.35.4").await;
    wait_for("the kubelet version matching", || async {
        let m = machine(&client, "kv-report-m").await;
        let ok = condition(&m, "KubeletVersion").is_some_and(|c| c.status == "True")
            && m.status?.kubelet_version.as_deref() == Some("v1.35.4");
        ok.then_some(())
    })
    .await;
    // kubectl get machines shows it.
    let table = common::rollout::kubectl(&["get", "machine", "kv-report-m"], None);
    assert!(
        table.contains("KUBELET") && table.contains("v1.35.4"),
        "{table}"
    );
}
