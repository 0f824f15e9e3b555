//! The local control plane really runs etcd, kube-apiserver and kube-controller-manager, and
//! Unbounded's manifests apply to it.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic is the test failure report

use k8s_openapi::api::core::v1::Namespace;
use kube::Api;
use unbounded_testbed::cluster::{LocalControlPlane, deploy_dir};

#[tokio::test]
async fn control_plane_serves_the_api_with_crds_installed() {
    let cp = LocalControlPlane::shared().expect("control plane");
    let version = cp
        .kubectl_output(&["version", "-o", "json"])
        .expect("kubectl version");
    assert!(
        version.contains("\"gitVersion\": \"v1.35.4\""),
        "server version: {version}"
    );

    let crds = cp
        .kubectl_output(&["get", "crd", "-o", "name"])
        .expect("list CRDs");
    for name in [
        "machines.unbounded-cloud.io",
        "machineconfigurations.unbounded-cloud.io",
        "machineconfigurationversions.unbounded-cloud.io",
        "machineoperations.unbounded-cloud.io",
        "machinepools.unbounded-cloud.io",
    ] {
        assert!(crds.contains(name), "{name} missing from {crds}");
    }

    let client = cp.client().await.expect("client");
    let namespaces: Api<Namespace> = Api::all(client);
    assert!(namespaces.get("kube-system").await.is_ok());
}

#[test]
fn controller_manager_runs_its_controllers() {
    let cp = LocalControlPlane::shared().expect("control plane");
    // The service-account controller and the token controller both belong to
    // kube-controller-manager: `default` exists only when it runs.
    let sa = cp
        .kubectl_output(&[
            "get",
            "serviceaccount",
            "default",
            "-n",
            "kube-system",
            "-o",
            "name",
        ])
        .expect("default service account in kube-system");
    assert_eq!(sa.trim(), "serviceaccount/default");
}

#[test]
fn deploy_kustomization_applies_and_examples_pass_dry_run() {
    let cp = LocalControlPlane::shared().expect("control plane");
    let deploy = deploy_dir();
    cp.kubectl_output(&[
        "apply",
        "--server-side",
        "-k",
        &deploy.display().to_string(),
    ])
    .expect("kubectl apply -k deploy/");
    let examples = deploy.join("examples");
    let out = cp
        .kubectl_output(&[
            "apply",
            "--dry-run=server",
            "-f",
            &examples.display().to_string(),
        ])
        .expect("server-side dry run of the examples");
    assert!(
        out.contains("machine.unbounded-cloud.io/rack1-node1"),
        "{out}"
    );
    assert!(
        out.contains("machine.unbounded-cloud.io/azure-node1"),
        "{out}"
    );
    assert!(
        out.contains("machineconfiguration.unbounded-cloud.io/general"),
        "{out}"
    );
    assert!(
        out.contains("machineoperation.unbounded-cloud.io/power-cycle-general"),
        "{out}"
    );
    for pool in ["general", "azure-general"] {
        assert!(
            out.contains(&format!("machinepool.unbounded-cloud.io/{pool}")),
            "{out}"
        );
    }
}

/// `testbed/overlay` (what the lab applies) renders over `deploy/` and the API server
/// accepts it: the bootserver on the appliance's interface and address, in-cluster clients
/// pointed at the API server's address on the bridge, the Azure provider without replicas.
#[test]
fn the_testbed_overlay_applies_over_deploy() {
    let cp = LocalControlPlane::shared().expect("control plane");
    let overlay = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("overlay");
    let rendered = cp
        .kubectl_output(&["kustomize", &overlay.display().to_string()])
        .expect("kubectl kustomize testbed/overlay");
    for expected in [
        "interface: prov0",
        "serverAddress: 10.99.0.2",
        "apiServer: https://10.99.0.1:6443",
        "name: KUBERNETES_SERVICE_HOST",
        "unbounded-cloud.io/bootserver: \"true\"",
    ] {
        assert!(
            rendered.contains(expected),
            "{expected} missing:\n{rendered}"
        );
    }
    // Every Deployment names the API server's address (three of them), and the Azure
    // provider runs no replica in the lab.
    assert_eq!(
        rendered.matches("value: 10.99.0.1").count(),
        3,
        "{rendered}"
    );
    assert!(rendered.contains("replicas: 0"), "{rendered}");
    cp.kubectl_output(&[
        "apply",
        "--server-side",
        "-k",
        &deploy_dir().display().to_string(),
    ])
    .expect("kubectl apply -k deploy/ (namespaces first)");
    let out = cp
        .kubectl_output(&[
            "apply",
            "--server-side",
            "--dry-run=server",
            "-k",
            &overlay.display().to_string(),
        ])
        .expect("server-side dry run of the testbed overlay");
    assert!(
        out.contains("deployment.apps/unbounded-bootserver"),
        "{out}"
    );
}

/// With `scheduler: true` the control plane runs kube-scheduler: a pod gets a Node (one
/// registered by hand, Ready, with room for it). Without it, pods stay Pending forever.
#[test]
fn the_scheduler_binds_pods_to_ready_nodes() {
    use unbounded_testbed::cluster::{Lifetime, PlaneOptions};
    let cp = LocalControlPlane::start_with(
        Lifetime::TiedToThread,
        PlaneOptions {
            scheduler: true,
            ..PlaneOptions::default()
        },
    )
    .expect("control plane with a scheduler");
    assert!(cp.pid("kube-scheduler").is_some());
    // A Node object as a kubelet registers it (its status through the status subresource).
    cp.kubectl_with_input(
        &["apply", "-f", "-"],
        Some("apiVersion: v1\nkind: Node\nmetadata: {name: tb-node, labels: {kubernetes.io/hostname: tb-node}}\n"),
    )
    .expect("node");
    cp.kubectl_output(&[
        "patch",
        "node",
        "tb-node",
        "--subresource=status",
        "--type=merge",
        "-p",
        r#"{"status":{"capacity":{"cpu":"2","memory":"2Gi","pods":"10"},"allocatable":{"cpu":"2","memory":"2Gi","pods":"10"},"conditions":[{"type":"Ready","status":"True","reason":"KubeletReady","message":"ready","lastHeartbeatTime":null,"lastTransitionTime":null}]}}"#,
    ])
    .expect("node status");
    cp.kubectl_output(&[
        "taint",
        "node",
        "tb-node",
        "node.kubernetes.io/not-ready-",
        "--overwrite",
    ])
    .ok();
    cp.kubectl_with_input(
        &["apply", "-f", "-"],
        Some("apiVersion: v1\nkind: Pod\nmetadata: {name: tb-pod, namespace: default}\nspec:\n  containers: [{name: c, image: example.invalid/none}]\n"),
    )
    .expect("pod");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let node = cp
            .kubectl_output(&[
                "get",
                "pod",
                "tb-pod",
                "-n",
                "default",
                "-o",
                "jsonpath={.spec.nodeName}",
            ])
            .unwrap_or_default();
        if node == "tb-node" {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the pod was not scheduled (nodeName {node:?}); scheduler log:\n{}",
            std::fs::read_to_string(cp.data_dir().join("kube-scheduler.log")).unwrap_or_default()
        );
        std::thread::sleep(std::time::Duration::from_millis(300));
    }
}
