//! The Cluster API kinds' CRDs (`deploy/cluster-api/crds/`) against a real kube-apiserver:
//! they install, Cluster API finds each by the name and label its contract reads, and each
//! validation rule refuses what it is for (with its message) while a valid object goes in.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic is the test failure report

use std::path::Path;

use unbounded_testbed::cluster::LocalControlPlane;

fn control_plane() -> &'static LocalControlPlane {
    LocalControlPlane::shared().expect("control plane")
}

fn install() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/cluster-api/crds");
    let cp = control_plane();
    cp.kubectl_with_input(
        &["apply", "--server-side", "-f", &dir.display().to_string()],
        None,
    )
    .expect("apply the Cluster API CRDs");
    cp.kubectl_with_input(
        &[
            "wait",
            "--for=condition=Established",
            "crd",
            "-l",
            "cluster.x-k8s.io/v1beta2=v1alpha1",
            "--timeout=60s",
        ],
        None,
    )
    .expect("the CRDs are established");
}

/// Creates `yaml` (server-side dry run: nothing is kept); the API server's answer.
fn create(yaml: &str) -> Result<String, String> {
    control_plane()
        .kubectl_with_input(&["create", "--dry-run=server", "-f", "-"], Some(yaml))
        .map_err(|e| e.to_string())
}

fn machine(spec: &str) -> String {
    format!(
        "apiVersion: infrastructure.cluster.x-k8s.io/v1alpha1\nkind: UnboundedMachine\nmetadata: {{name: m, namespace: default}}\nspec: {spec}\n"
    )
}

#[test]
fn the_contract_finds_every_kind_by_its_crd_name_and_label() {
    install();
    let listed = control_plane()
        .kubectl_with_input(
            &[
                "get",
                "crd",
                "-l",
                "cluster.x-k8s.io/v1beta2=v1alpha1",
                "-o",
                "jsonpath={range .items[*]}{.metadata.name} {.spec.scope}{\"\\n\"}{end}",
            ],
            None,
        )
        .expect("list CRDs");
    let mut lines: Vec<_> = listed.lines().collect();
    lines.sort_unstable();
    assert_eq!(
        lines,
        [
            "unboundedclusters.infrastructure.cluster.x-k8s.io Namespaced",
            "unboundedclustertemplates.infrastructure.cluster.x-k8s.io Namespaced",
            "unboundedconfigs.bootstrap.cluster.x-k8s.io Namespaced",
            "unboundedconfigtemplates.bootstrap.cluster.x-k8s.io Namespaced",
            "unboundedcontrolplanes.controlplane.cluster.x-k8s.io Namespaced",
            "unboundedcontrolplanetemplates.controlplane.cluster.x-k8s.io Namespaced",
            "unboundedmachines.infrastructure.cluster.x-k8s.io Namespaced",
            "unboundedmachinetemplates.infrastructure.cluster.x-k8s.io Namespaced",
        ]
    );
}

#[test]
fn each_rule_refuses_what_it_is_for() {
    install();
    let refused = [
        (
            machine("{provider: manual}"),
            "spec.provider must be pxe or azure",
        ),
        (
            machine("{provider: pxe}"),
            "spec.pxe (with inventorySelector) is required",
        ),
        (
            machine("{provider: azure, pxe: {inventorySelector: {}}}"),
            "spec.azure is required",
        ),
        (
            machine("{provider: pxe, pxe: {inventorySelector: {}}, providerID: 52:54:00:00:00:01}"),
            "spec.providerID must look like",
        ),
        (
            "apiVersion: infrastructure.cluster.x-k8s.io/v1alpha1\nkind: UnboundedMachineTemplate\nmetadata: {name: t, namespace: default}\nspec: {template: {spec: {provider: pxe, pxe: {inventorySelector: {}}, providerID: 'pxe://52:54:00:00:00:01'}}}\n".to_owned(),
            "spec.template.spec.providerID may not be set",
        ),
        (
            "apiVersion: infrastructure.cluster.x-k8s.io/v1alpha1\nkind: UnboundedCluster\nmetadata: {name: c, namespace: default}\nspec: {controlPlaneEndpoint: {host: api.example, port: 0}}\n".to_owned(),
            "controlPlaneEndpoint.port must be between 1 and 65535",
        ),
        (
            "apiVersion: controlplane.cluster.x-k8s.io/v1alpha1\nkind: UnboundedControlPlane\nmetadata: {name: cp, namespace: default}\nspec: {controlPlaneEndpoint: {host: '', port: 6443}}\n".to_owned(),
            "controlPlaneEndpoint.host must be 1 to 512 characters",
        ),
        (
            "apiVersion: bootstrap.cluster.x-k8s.io/v1alpha1\nkind: UnboundedConfig\nmetadata: {name: b, namespace: default}\nspec: {configurationRef: {name: workers, version: 0}}\n".to_owned(),
            "configurationRef.version must be 1 or more",
        ),
    ];
    for (yaml, message) in refused {
        let answer = create(&yaml);
        assert!(
            answer.as_ref().is_err_and(|e| e.contains(message)),
            "{yaml}\nexpected a refusal saying {message:?}, got {answer:?}"
        );
    }
    let accepted = [
        machine(
            "{provider: pxe, pxe: {inventorySelector: {matchLabels: {rack: r1}}, hardwareRequirements: {minCPUs: 4}}}",
        ),
        "apiVersion: infrastructure.cluster.x-k8s.io/v1alpha1\nkind: UnboundedMachineTemplate\nmetadata: {name: t, namespace: default}\nspec: {template: {spec: {provider: pxe, pxe: {inventorySelector: {}}}}}\n".to_owned(),
        "apiVersion: infrastructure.cluster.x-k8s.io/v1alpha1\nkind: UnboundedCluster\nmetadata: {name: c, namespace: default}\nspec: {controlPlaneEndpoint: {host: api.example, port: 6443}}\n".to_owned(),
        "apiVersion: bootstrap.cluster.x-k8s.io/v1alpha1\nkind: UnboundedConfigTemplate\nmetadata: {name: b, namespace: default}\nspec: {template: {spec: {configurationRef: {name: workers}}}}\n".to_owned(),
        "apiVersion: controlplane.cluster.x-k8s.io/v1alpha1\nkind: UnboundedControlPlane\nmetadata: {name: cp, namespace: default}\nspec: {controlPlaneEndpoint: {host: 10.99.0.1, port: 6443}, version: v1.35.4}\n".to_owned(),
    ];
    for yaml in accepted {
        let answer = create(&yaml);
        assert!(answer.is_ok(), "{yaml}\nrefused: {answer:?}");
    }
}
