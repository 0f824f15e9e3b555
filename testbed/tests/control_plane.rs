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
