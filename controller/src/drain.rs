//! Cordon and drain a Node through the Eviction API (which respects PodDisruptionBudgets),
//! and delete it.
//!
//! Listing the Node's pods is a per-Node LIST with a field selector; it happens only while a
//! Machine is being deleted, never on the reconcile hot path.

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, DeleteParams, EvictParams, ListParams, Patch, PatchParams};
use kube::{Client, ResourceExt};
use serde_json::json;

use crate::error::{Error, is_not_found, kube_err};

/// What a drain pass achieved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DrainOutcome {
    /// Pods that still have to go (eviction refused by a PodDisruptionBudget, or still
    /// terminating).
    pub remaining: usize,
}

/// Whether a pod is left alone by a drain: mirror pods (static pods, managed by the
/// kubelet) and DaemonSet pods (they would come straight back), and pods already finished.
pub fn skipped_by_drain(pod: &Pod) -> bool {
    let mirror = pod
        .annotations()
        .contains_key("kubernetes.io/config.mirror");
    let daemon_set = pod
        .owner_references()
        .iter()
        .any(|o| o.kind == "DaemonSet" && o.controller == Some(true));
    let finished = pod
        .status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .is_some_and(|p| p == "Succeeded" || p == "Failed");
    mirror || daemon_set || finished
}

/// Cordons the Node and asks to evict every pod on it; returns how many remain.
pub async fn drain(client: &Client, node_name: &str) -> Result<DrainOutcome, Error> {
    let nodes: Api<Node> = Api::all(client.clone());
    match nodes
        .patch(
            node_name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"unschedulable": true}})),
        )
        .await
    {
        Ok(_) => {}
        Err(e) if is_not_found(&e) => return Ok(DrainOutcome { remaining: 0 }),
        Err(e) => return Err(kube_err(format!("cordoning Node {node_name}"))(e)),
    }
    let pods: Api<Pod> = Api::all(client.clone());
    let on_node = pods
        .list(&ListParams::default().fields(&format!("spec.nodeName={node_name}")))
        .await
        .map_err(kube_err(format!("listing the pods on Node {node_name}")))?;
    let mut remaining = 0;
    for pod in on_node.items.iter().filter(|p| !skipped_by_drain(p)) {
        remaining += 1;
        if pod.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let namespace = pod.namespace().unwrap_or_default();
        let api: Api<Pod> = Api::namespaced(client.clone(), &namespace);
        match api.evict(&pod.name_any(), &EvictParams::default()).await {
            Ok(_) => {}
            // 429: a PodDisruptionBudget does not allow it now; 404: already gone.
            Err(kube::Error::Api(status)) if status.code == 429 || status.code == 404 => {}
            Err(e) => {
                return Err(kube_err(format!(
                    "evicting pod {namespace}/{}",
                    pod.name_any()
                ))(e));
            }
        }
    }
    Ok(DrainOutcome { remaining })
}

/// Deletes the Node; a Node that is already gone is fine.
pub async fn delete_node(client: &Client, node_name: &str) -> Result<(), Error> {
    let nodes: Api<Node> = Api::all(client.clone());
    match nodes.delete(node_name, &DeleteParams::default()).await {
        Ok(_) => Ok(()),
        Err(e) if is_not_found(&e) => Ok(()),
        Err(e) => Err(kube_err(format!("deleting Node {node_name}"))(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::PodStatus;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

    fn pod() -> Pod {
        Pod::default()
    }

    #[test]
    fn drain_skips_mirror_daemonset_and_finished_pods() {
        let mut mirror = pod();
        mirror
            .metadata
            .annotations
            .get_or_insert_with(Default::default)
            .insert("kubernetes.io/config.mirror".into(), "x".into());
        let mut ds = pod();
        ds.metadata.owner_references = Some(vec![OwnerReference {
            kind: "DaemonSet".into(),
            controller: Some(true),
            ..OwnerReference::default()
        }]);
        let mut done = pod();
        done.status = Some(PodStatus {
            phase: Some("Succeeded".into()),
            ..PodStatus::default()
        });
        let mut rs = pod();
        rs.metadata.owner_references = Some(vec![OwnerReference {
            kind: "ReplicaSet".into(),
            controller: Some(true),
            ..OwnerReference::default()
        }]);
        assert!(skipped_by_drain(&mirror));
        assert!(skipped_by_drain(&ds));
        assert!(skipped_by_drain(&done));
        assert!(!skipped_by_drain(&rs));
        assert!(!skipped_by_drain(&pod()));
    }
}
