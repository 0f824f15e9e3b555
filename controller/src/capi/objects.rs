//! What the Cluster API reconcilers read of Cluster API's own objects (its Machines and
//! Clusters, group `cluster.x-k8s.io`, read untyped: we depend on the contract's fields,
//! not on its Go types), and how they write their own objects' status.

use std::fmt::Debug;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams};
use kube::{Client, Resource};
use serde::Serialize;
use serde::de::DeserializeOwned;
use unbounded_api::capi::PAUSED_ANNOTATION;
use unbounded_api::well_known::field_managers;

use crate::error::{Error, kube_err};

/// Cluster API's core group.
pub const CAPI_GROUP: &str = "cluster.x-k8s.io";
/// The version of Cluster API's core kinds the contract v1beta2 speaks.
pub const CAPI_VERSION: &str = "v1beta2";

/// Cluster API's `Machine`.
pub fn machine_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(CAPI_GROUP, CAPI_VERSION, "Machine"),
        "machines",
    )
}

/// Cluster API's `Cluster`.
pub fn cluster_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(CAPI_GROUP, CAPI_VERSION, "Cluster"),
        "clusters",
    )
}

/// The Cluster API Machine that owns an object (its owner reference of kind `Machine` in
/// group `cluster.x-k8s.io`, any version), by name in the object's namespace.
pub fn owning_machine(meta: &ObjectMeta) -> Option<&str> {
    meta.owner_references.as_ref()?.iter().find_map(|o| {
        let group = o.api_version.split('/').next().unwrap_or_default();
        (o.kind == "Machine" && group == CAPI_GROUP).then_some(o.name.as_str())
    })
}

/// What an UnboundedMachine and an UnboundedConfig read of their Cluster API Machine.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CapiMachine {
    /// `spec.bootstrap.dataSecretName`.
    pub data_secret_name: Option<String>,
    /// `spec.version`: its Kubernetes version.
    pub version: Option<String>,
    /// `spec.clusterName`.
    pub cluster_name: Option<String>,
}

impl CapiMachine {
    /// Reads the contract's fields from an untyped Machine.
    pub fn from_object(object: &DynamicObject) -> Self {
        let text = |pointer: &str| {
            object
                .data
                .pointer(pointer)
                .and_then(|v| v.as_str())
                .map(str::to_owned)
        };
        Self {
            data_secret_name: text("/spec/bootstrap/dataSecretName"),
            version: text("/spec/version"),
            cluster_name: text("/spec/clusterName"),
        }
    }
}

/// The Cluster API Machine `name` in `namespace`, or `None` when there is none (yet, or
/// any more).
pub async fn read_machine(
    client: &Client,
    namespace: &str,
    name: &str,
) -> Result<Option<CapiMachine>, Error> {
    let api: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), namespace, &machine_resource());
    let object = api.get_opt(name).await.map_err(kube_err(format!(
        "reading Cluster API Machine {namespace}/{name}"
    )))?;
    Ok(object.as_ref().map(CapiMachine::from_object))
}

/// Whether an object is paused: its own `cluster.x-k8s.io/paused` annotation, or its
/// Cluster's `spec.paused` (the contract asks for both).
pub async fn is_paused(
    client: &Client,
    meta: &ObjectMeta,
    cluster_name: Option<&str>,
) -> Result<bool, Error> {
    if meta
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(PAUSED_ANNOTATION))
    {
        return Ok(true);
    }
    let (Some(namespace), Some(cluster)) = (meta.namespace.as_deref(), cluster_name) else {
        return Ok(false);
    };
    let api: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), namespace, &cluster_resource());
    let object = api.get_opt(cluster).await.map_err(kube_err(format!(
        "reading Cluster API Cluster {namespace}/{cluster}"
    )))?;
    Ok(object.is_some_and(|c| {
        c.data
            .pointer("/spec/paused")
            .and_then(|v| v.as_bool())
            .unwrap_or(false)
    }))
}

/// The cluster an object belongs to: its `cluster.x-k8s.io/cluster-name` label.
pub fn cluster_label(meta: &ObjectMeta) -> Option<&str> {
    meta.labels
        .as_ref()?
        .get(unbounded_api::capi::CLUSTER_NAME_LABEL)
        .map(String::as_str)
}

/// Writes a namespaced object's status with server-side apply under the controller's field
/// manager (forced), unless it already says so: a write would wake the object's own watch
/// and decide again for nothing.
pub async fn write_status<K, S>(
    client: &Client,
    object: &K,
    current: Option<&S>,
    status: &S,
) -> Result<(), Error>
where
    K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + DeserializeOwned
        + Debug,
    S: Serialize + PartialEq + Debug,
{
    if current == Some(status) {
        return Ok(());
    }
    let meta = object.meta();
    let name = meta.name.clone().unwrap_or_default();
    let namespace = meta.namespace.clone().unwrap_or_default();
    let body = serde_json::json!({
        "apiVersion": K::api_version(&()),
        "kind": K::kind(&()),
        "metadata": {"name": name, "namespace": namespace},
        "status": status,
    });
    let api: Api<K> = Api::namespaced(client.clone(), &namespace);
    let params = PatchParams::apply(field_managers::CONTROLLER).force();
    api.patch_status(&name, &params, &Patch::Apply(&body))
        .await
        .map_err(kube_err(format!(
            "writing the status of {} {namespace}/{name}",
            K::kind(&())
        )))?;
    Ok(())
}
