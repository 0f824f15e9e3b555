//! Cluster API's core manager (built from its Go module, run by the testbed without its
//! webhooks) reconciles a v1beta2 Cluster whose infrastructure is an `UnboundedCluster`
//! against the local control plane: it takes the Cluster with its finalizer, becomes the
//! UnboundedCluster's owner and, the infrastructure not being provisioned (no Unbounded
//! controller runs here), keeps the Cluster `Provisioning`.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic is the test failure report

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, PostParams};
use serde_json::{Value, json};
use unbounded_testbed::cluster::{CLUSTER_API_VERSION, CoreManager, LocalControlPlane};
use unbounded_testbed::testkit::wait_until_explained;

const NAMESPACE: &str = "default";
const NAME: &str = "capi-core";

/// How long the manager may take to reconcile the Cluster once ready.
const RECONCILE_TIMEOUT: Duration = Duration::from_secs(90);

fn resource(group: &str, version: &str, kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), plural)
}

fn object(value: Value) -> DynamicObject {
    serde_json::from_value(value).expect("a valid object")
}

#[tokio::test]
async fn the_core_manager_reconciles_a_cluster_onto_an_unbounded_cluster() {
    let began = Instant::now();
    let cp = LocalControlPlane::shared().expect("local control plane");
    let plane_took = began.elapsed();
    let mut manager = tokio::task::spawn_blocking(|| CoreManager::start(cp))
        .await
        .expect("the starting thread")
        .unwrap_or_else(|e| {
            panic!("starting Cluster API {CLUSTER_API_VERSION}'s core manager: {e}")
        });
    eprintln!(
        "control plane {:.1} s; CRDs applied and cluster-api-manager ready {:.1} s later (its /readyz {:.1} s after its start); log {}; flags: {}",
        plane_took.as_secs_f64(),
        (began.elapsed() - plane_took).as_secs_f64(),
        manager.startup().as_secs_f64(),
        manager.log_path().display(),
        manager.args().join(" ")
    );
    let client = cp.client().await.expect("client");

    let infra_resource = resource(
        "infrastructure.cluster.x-k8s.io",
        "v1alpha1",
        "UnboundedCluster",
        "unboundedclusters",
    );
    let infra: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), NAMESPACE, &infra_resource);
    infra
        .create(
            &PostParams::default(),
            &object(json!({
                "apiVersion": "infrastructure.cluster.x-k8s.io/v1alpha1",
                "kind": "UnboundedCluster",
                "metadata": {"name": NAME, "namespace": NAMESPACE},
                "spec": {"controlPlaneEndpoint": {"host": "127.0.0.1", "port": 6443}},
            })),
        )
        .await
        .expect("create the UnboundedCluster");

    let cluster_resource = resource("cluster.x-k8s.io", "v1beta2", "Cluster", "clusters");
    let clusters: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), NAMESPACE, &cluster_resource);
    // Complete as created: no defaulting webhook runs (see `CoreManager`).
    let created = clusters
        .create(
            &PostParams::default(),
            &object(json!({
                "apiVersion": "cluster.x-k8s.io/v1beta2",
                "kind": "Cluster",
                "metadata": {"name": NAME, "namespace": NAMESPACE},
                "spec": {
                    "infrastructureRef": {
                        "apiGroup": "infrastructure.cluster.x-k8s.io",
                        "kind": "UnboundedCluster",
                        "name": NAME,
                    },
                },
            })),
        )
        .await
        .expect("create the Cluster");
    let cluster_uid = created.metadata.uid.clone().expect("the Cluster's uid");
    let created_at = Instant::now();

    // What was last seen of both objects, for the failure report.
    let seen: Arc<Mutex<(Value, Value)>> = Arc::default();
    let explain = {
        let seen = Arc::clone(&seen);
        let log = manager.log_path().to_path_buf();
        move || {
            let (mut cluster, mut infra) = seen.lock().unwrap().clone();
            for object in [&mut cluster, &mut infra] {
                if let Some(metadata) = object["metadata"].as_object_mut() {
                    metadata.remove("managedFields");
                }
            }
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            format!(
                "Cluster: {cluster:#}\nUnboundedCluster: {infra:#}\nlast lines of {}:\n{}",
                log.display(),
                lines[lines.len().saturating_sub(40)..].join("\n")
            )
        }
    };
    wait_until_explained(
        "the Cluster taken (finalizer cluster.cluster.x-k8s.io), Provisioning, and the owner of its UnboundedCluster",
        RECONCILE_TIMEOUT,
        explain,
        || {
            let (clusters, infra, seen) = (clusters.clone(), infra.clone(), Arc::clone(&seen));
            let cluster_uid = cluster_uid.clone();
            async move {
                let cluster = serde_json::to_value(clusters.get(NAME).await.expect("get the Cluster"))
                    .unwrap();
                let unbounded = serde_json::to_value(
                    infra.get(NAME).await.expect("get the UnboundedCluster"),
                )
                .unwrap();
                let finalized = cluster["metadata"]["finalizers"]
                    .as_array()
                    .is_some_and(|f| f.iter().any(|f| f == "cluster.cluster.x-k8s.io"));
                let provisioning = cluster["status"]["phase"] == "Provisioning";
                // A plain owner reference (not `controller: true`), as v1.13 sets it.
                let owned = unbounded["metadata"]["ownerReferences"]
                    .as_array()
                    .is_some_and(|refs| {
                        refs.iter().any(|r| {
                            r["apiVersion"] == "cluster.x-k8s.io/v1beta2"
                                && r["kind"] == "Cluster"
                                && r["name"] == NAME
                                && r["uid"] == cluster_uid.as_str()
                        })
                    });
                *seen.lock().unwrap() = (cluster, unbounded);
                finalized && provisioning && owned
            }
        },
    )
    .await;
    let reconciled_in = created_at.elapsed();

    let (cluster, unbounded) = seen.lock().unwrap().clone();
    // The Cluster's name on the infrastructure it owns, as the contract has it.
    assert_eq!(
        unbounded["metadata"]["labels"]["cluster.x-k8s.io/cluster-name"], NAME,
        "UnboundedCluster: {unbounded:#}"
    );
    // Not provisioned: no Unbounded controller runs here to set `initialization.provisioned`.
    assert_ne!(
        cluster["status"]["initialization"]["infrastructureProvisioned"], true,
        "Cluster: {cluster:#}"
    );
    if let Some(status) = manager.exited() {
        panic!(
            "the manager exited ({status}); its log: {}",
            manager.log_tail(40)
        );
    }
    eprintln!(
        "reconciled {:.1} s after creation; whole test {:.1} s",
        reconciled_in.as_secs_f64(),
        began.elapsed().as_secs_f64()
    );
}
