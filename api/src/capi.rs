//! Cluster API (contract v1beta2): Unbounded as an infrastructure provider
//! ([`UnboundedMachine`], [`UnboundedMachineTemplate`], [`UnboundedCluster`],
//! [`UnboundedClusterTemplate`], group `infrastructure.cluster.x-k8s.io`) and as a bootstrap
//! provider ([`UnboundedConfig`], [`UnboundedConfigTemplate`], group
//! `bootstrap.cluster.x-k8s.io`), and the control plane it joins
//! ([`UnboundedControlPlane`], [`UnboundedControlPlaneTemplate`], group
//! `controlplane.cluster.x-k8s.io`: a control plane that already runs). Every kind is namespaced, and its CRD carries the label
//! [`CONTRACT_LABEL`] = [`API_VERSION`] that tells the Cluster API controllers which of our
//! versions speaks their contract.
//!
//! An `UnboundedMachine` stands for one Unbounded [`crate::Machine`]: for `pxe` it claims one
//! from the inventory (a free PXE Machine that its selector and hardware requirements
//! match, by the pools' race-free claim), for `azure` it creates one. The Machine's provider
//! ID becomes the `UnboundedMachine`'s `spec.providerID`, which Cluster API copies to its
//! Machine and matches against the Node. An `UnboundedConfig` says what the agent runs: the
//! MachineConfiguration, and (from the Cluster API Machine's `version`) the Kubernetes
//! version; its data Secret holds the configuration reference the Machine takes, not a
//! cloud-init script (our node joins through the agent, not kubeadm).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::{AzureSpec, ConfigurationRef, MachineProvider, PoolPxeSpec};

/// The CRD label that maps Cluster API's contract version to ours.
pub const CONTRACT_LABEL: &str = "cluster.x-k8s.io/v1beta2";
/// Our version of every Cluster API kind (the label's value).
pub const API_VERSION: &str = "v1alpha1";
/// The infrastructure provider's API group.
pub const INFRASTRUCTURE_GROUP: &str = "infrastructure.cluster.x-k8s.io";
/// The control plane provider's API group.
pub const CONTROL_PLANE_GROUP: &str = "controlplane.cluster.x-k8s.io";
/// The bootstrap provider's API group.
pub const BOOTSTRAP_GROUP: &str = "bootstrap.cluster.x-k8s.io";
/// The annotation that pauses reconciliation of one object (Cluster API's).
pub const PAUSED_ANNOTATION: &str = "cluster.x-k8s.io/paused";
/// The label every object of a Cluster carries (Cluster API's).
pub const CLUSTER_NAME_LABEL: &str = "cluster.x-k8s.io/cluster-name";

/// One Cluster API Machine's infrastructure: an Unbounded Machine, claimed or created.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "infrastructure.cluster.x-k8s.io",
    version = "v1alpha1",
    kind = "UnboundedMachine",
    namespaced,
    category = "cluster-api",
    status = "UnboundedMachineStatus",
    derive = "PartialEq",
    doc = "The infrastructure of one Cluster API Machine: an Unbounded Machine, claimed from the PXE inventory by selector and hardware requirements, or created in Azure. Released (and wiped as its configuration says) when deleted.",
    printcolumn(
        name = "Cluster",
        type_ = "string",
        json_path = ".metadata.labels.cluster\\.x-k8s\\.io/cluster-name"
    ),
    printcolumn(name = "Provider", type_ = "string", json_path = ".spec.provider"),
    printcolumn(
        name = "Machine",
        type_ = "string",
        json_path = ".status.machineRef.name",
        description = "The Unbounded Machine this stands for"
    ),
    printcolumn(name = "ProviderID", type_ = "string", json_path = ".spec.providerID"),
    printcolumn(
        name = "Provisioned",
        type_ = "boolean",
        json_path = ".status.initialization.provisioned"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("self.provider != 'pxe' || has(self.pxe)").message("spec.pxe (with inventorySelector) is required when the provider is 'pxe'"))]
#[x_kube(validation = Rule::new("self.provider != 'azure' || has(self.azure)").message("spec.azure is required when the provider is 'azure'"))]
#[x_kube(validation = Rule::new("!has(self.pxe) || self.provider == 'pxe'").message("spec.pxe may only be set when the provider is 'pxe'"))]
#[x_kube(validation = Rule::new("!has(self.azure) || self.provider == 'azure'").message("spec.azure may only be set when the provider is 'azure'"))]
#[x_kube(validation = Rule::new("self.provider != 'manual'").message("spec.provider must be pxe or azure: a manual Machine has no infrastructure to provide"))]
pub struct UnboundedMachineSpec {
    /// `pxe`: claim a free PXE Machine from the inventory; `azure`: create an Azure VM.
    /// Immutable.
    #[x_kube(validation = Rule::new("self == oldSelf").message("spec.provider is immutable"))]
    pub provider: MachineProvider,
    /// Which PXE Machines may be claimed (`provider: pxe`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pxe: Option<PoolPxeSpec>,
    /// The VM to create (`provider: azure`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub azure: Option<AzureSpec>,
    /// The provider ID of the Unbounded Machine (`pxe://<mac>`, `azure://…`): set by the
    /// provider once it has one, then immutable. Cluster API copies it to its Machine.
    #[serde(
        default,
        rename = "providerID",
        skip_serializing_if = "Option::is_none"
    )]
    #[x_kube(validation = Rule::new("self == oldSelf").message("spec.providerID is immutable once set"))]
    #[x_kube(validation = Rule::new("self.matches('^[a-z0-9]+://')").message("spec.providerID must look like '<provider>://<id>'"))]
    pub provider_id: Option<String>,
}

/// Observed state of an `UnboundedMachine`, in the terms of the contract.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct UnboundedMachineStatus {
    /// The contract's initialization: `provisioned` once the Machine has its provider ID and
    /// is powered on to boot its configuration.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initialization: Option<MachineInitialization>,
    /// The Unbounded Machine this stands for (same namespace as the Machine: cluster-wide).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub machine_ref: Option<crate::MachineRef>,
    /// The Machine's addresses (`InternalIP`, `Hostname`), as Cluster API's MachineAddress.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub addresses: Vec<CapiMachineAddress>,
    /// Where the machine is (its inventory's rack, else the switch its NIC is cabled to).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_domain: Option<String>,
    /// `Ready` (which Cluster API mirrors into its Machine's `InfrastructureReady`),
    /// `MachineClaimed`, `Paused`. Never a terminal failure: a BMC that fails is a reason on
    /// `Ready`, retried.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

/// The contract's `status.initialization` of an infrastructure object.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MachineInitialization {
    /// The infrastructure is ready for the bootstrap to run on it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provisioned: Option<bool>,
}

/// One address, as Cluster API's `MachineAddress`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CapiMachineAddress {
    /// `Hostname`, `ExternalIP`, `InternalIP`, `ExternalDNS` or `InternalDNS`.
    #[serde(rename = "type")]
    pub type_: String,
    /// The address.
    pub address: String,
}

/// What `UnboundedMachine`s of a MachineDeployment or MachineSet are made from.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "infrastructure.cluster.x-k8s.io",
    version = "v1alpha1",
    kind = "UnboundedMachineTemplate",
    namespaced,
    category = "cluster-api",
    derive = "PartialEq",
    doc = "The template Cluster API stamps UnboundedMachines from (MachineDeployments, MachineSets, ClusterClass)."
)]
#[serde(rename_all = "camelCase")]
pub struct UnboundedMachineTemplateSpec {
    /// The machines' infrastructure.
    pub template: UnboundedMachineTemplateResource,
}

/// `spec.template` of an `UnboundedMachineTemplate`.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct UnboundedMachineTemplateResource {
    /// Labels and annotations for the objects made from it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<crate::TemplateMetadata>,
    /// The spec every `UnboundedMachine` made from it gets (without a provider ID: each
    /// machine's own).
    #[x_kube(validation = Rule::new("!has(self.providerID)").message("spec.template.spec.providerID may not be set: each UnboundedMachine gets its Machine's own"))]
    pub spec: UnboundedMachineSpec,
}

/// A Cluster's infrastructure: for Unbounded, where its control plane is reached (the
/// machines need no network of their own to be made).
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "infrastructure.cluster.x-k8s.io",
    version = "v1alpha1",
    kind = "UnboundedCluster",
    namespaced,
    category = "cluster-api",
    status = "UnboundedClusterStatus",
    derive = "PartialEq",
    doc = "A Cluster's infrastructure: the control plane endpoint its machines join. Nothing is created for it; it is provisioned as soon as the endpoint is set.",
    printcolumn(
        name = "Cluster",
        type_ = "string",
        json_path = ".metadata.labels.cluster\\.x-k8s\\.io/cluster-name"
    ),
    printcolumn(
        name = "Endpoint",
        type_ = "string",
        json_path = ".spec.controlPlaneEndpoint.host"
    ),
    printcolumn(
        name = "Provisioned",
        type_ = "boolean",
        json_path = ".status.initialization.provisioned"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct UnboundedClusterSpec {
    /// Where the Cluster's API server is reached (the contract's `controlPlaneEndpoint`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub control_plane_endpoint: Option<ApiEndpoint>,
}

/// The contract's `APIEndpoint`.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ApiEndpoint {
    /// DNS name or IP address.
    #[x_kube(validation = Rule::new("self.size() >= 1 && self.size() <= 512").message("controlPlaneEndpoint.host must be 1 to 512 characters"))]
    pub host: String,
    /// TCP port.
    #[x_kube(validation = Rule::new("self >= 1 && self <= 65535").message("controlPlaneEndpoint.port must be between 1 and 65535"))]
    pub port: i32,
}

/// Observed state of an `UnboundedCluster`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct UnboundedClusterStatus {
    /// The contract's initialization.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initialization: Option<MachineInitialization>,
    /// The failure domains the inventory has (racks), for Cluster API to spread Machines
    /// over.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub failure_domains: Vec<FailureDomain>,
    /// `Ready`, `Paused`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

/// The contract's `FailureDomain`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FailureDomain {
    /// Its name.
    pub name: String,
    /// Whether control plane Machines may go there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub control_plane: Option<bool>,
}

/// What `UnboundedCluster`s of a ClusterClass are made from.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "infrastructure.cluster.x-k8s.io",
    version = "v1alpha1",
    kind = "UnboundedClusterTemplate",
    namespaced,
    category = "cluster-api",
    derive = "PartialEq",
    doc = "The template a ClusterClass stamps UnboundedClusters from."
)]
#[serde(rename_all = "camelCase")]
pub struct UnboundedClusterTemplateSpec {
    /// The clusters' infrastructure.
    pub template: UnboundedClusterTemplateResource,
}

/// `spec.template` of an `UnboundedClusterTemplate`.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct UnboundedClusterTemplateResource {
    /// Labels and annotations for the objects made from it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<crate::TemplateMetadata>,
    /// The spec every `UnboundedCluster` made from it gets.
    pub spec: UnboundedClusterSpec,
}

/// The control plane of a Cluster whose machines Unbounded provides: the Kubernetes control
/// plane that already runs (the appliance's, or any whose API server the agents join), not
/// one made of Machines. It is initialized once Cluster API can reach it: its
/// `<cluster>-kubeconfig` Secret exists.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "controlplane.cluster.x-k8s.io",
    version = "v1alpha1",
    kind = "UnboundedControlPlane",
    namespaced,
    category = "cluster-api",
    status = "UnboundedControlPlaneStatus",
    derive = "PartialEq",
    doc = "The Kubernetes control plane a Cluster's Unbounded machines join: one that already runs (no Machines are made for it). Initialized once its <cluster>-kubeconfig Secret exists.",
    printcolumn(
        name = "Cluster",
        type_ = "string",
        json_path = ".metadata.labels.cluster\\.x-k8s\\.io/cluster-name"
    ),
    printcolumn(
        name = "Endpoint",
        type_ = "string",
        json_path = ".spec.controlPlaneEndpoint.host"
    ),
    printcolumn(
        name = "Initialized",
        type_ = "boolean",
        json_path = ".status.initialization.controlPlaneInitialized"
    ),
    printcolumn(name = "Version", type_ = "string", json_path = ".status.version"),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct UnboundedControlPlaneSpec {
    /// Where the API server is reached (the contract's `controlPlaneEndpoint`).
    pub control_plane_endpoint: ApiEndpoint,
    /// The Kubernetes version the control plane runs, as ClusterClass topologies set it;
    /// informational (the control plane is not upgraded from here).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
}

/// Observed state of an `UnboundedControlPlane`, in the terms of the contract.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct UnboundedControlPlaneStatus {
    /// The contract's initialization.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initialization: Option<ControlPlaneInitialization>,
    /// The version the API server reports.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// `Available`, `Paused`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

/// The contract's `status.initialization` of a control plane object.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ControlPlaneInitialization {
    /// The control plane accepts requests and Cluster API can reach it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub control_plane_initialized: Option<bool>,
}

/// What `UnboundedControlPlane`s of a ClusterClass are made from.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "controlplane.cluster.x-k8s.io",
    version = "v1alpha1",
    kind = "UnboundedControlPlaneTemplate",
    namespaced,
    category = "cluster-api",
    derive = "PartialEq",
    doc = "The template a ClusterClass stamps UnboundedControlPlanes from."
)]
#[serde(rename_all = "camelCase")]
pub struct UnboundedControlPlaneTemplateSpec {
    /// The control planes' spec.
    pub template: UnboundedControlPlaneTemplateResource,
}

/// `spec.template` of an `UnboundedControlPlaneTemplate`.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct UnboundedControlPlaneTemplateResource {
    /// Labels and annotations for the objects made from it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<crate::TemplateMetadata>,
    /// The spec every `UnboundedControlPlane` made from it gets.
    pub spec: UnboundedControlPlaneSpec,
}

/// What one Cluster API Machine's agent runs: the bootstrap provider's object.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "bootstrap.cluster.x-k8s.io",
    version = "v1alpha1",
    kind = "UnboundedConfig",
    namespaced,
    category = "cluster-api",
    status = "UnboundedConfigStatus",
    derive = "PartialEq",
    doc = "What the Unbounded agent of one Cluster API Machine runs: a MachineConfiguration, at the version whose Kubernetes version is the Machine's. Its data Secret holds that reference.",
    printcolumn(
        name = "Cluster",
        type_ = "string",
        json_path = ".metadata.labels.cluster\\.x-k8s\\.io/cluster-name"
    ),
    printcolumn(
        name = "Configuration",
        type_ = "string",
        json_path = ".spec.configurationRef.name"
    ),
    printcolumn(
        name = "DataSecret",
        type_ = "string",
        json_path = ".status.dataSecretName"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct UnboundedConfigSpec {
    /// The MachineConfiguration the machine runs. Without a version, the one whose
    /// Kubernetes version is the Cluster API Machine's `version`.
    pub configuration_ref: ConfigurationRef,
}

/// Observed state of an `UnboundedConfig`, in the terms of the contract.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct UnboundedConfigStatus {
    /// The contract's initialization: `dataSecretCreated` once the Secret exists.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initialization: Option<BootstrapInitialization>,
    /// The Secret (same namespace) with the bootstrap data.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_secret_name: Option<String>,
    /// `Ready`, `Paused`; `ConfigurationResolved` says which version the machine runs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

/// The contract's `status.initialization` of a bootstrap object.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BootstrapInitialization {
    /// The data Secret exists.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_secret_created: Option<bool>,
}

/// What `UnboundedConfig`s of a MachineDeployment or MachineSet are made from.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "bootstrap.cluster.x-k8s.io",
    version = "v1alpha1",
    kind = "UnboundedConfigTemplate",
    namespaced,
    category = "cluster-api",
    derive = "PartialEq",
    doc = "The template Cluster API stamps UnboundedConfigs from."
)]
#[serde(rename_all = "camelCase")]
pub struct UnboundedConfigTemplateSpec {
    /// The configs' spec.
    pub template: UnboundedConfigTemplateResource,
}

/// `spec.template` of an `UnboundedConfigTemplate`.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct UnboundedConfigTemplateResource {
    /// Labels and annotations for the objects made from it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<crate::TemplateMetadata>,
    /// The spec every `UnboundedConfig` made from it gets.
    pub spec: UnboundedConfigSpec,
}

/// The CRDs of the Cluster API kinds, each with the contract label.
pub fn crds()
-> Vec<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition>
{
    use kube::CustomResourceExt;
    let mut crds = vec![
        UnboundedCluster::crd(),
        UnboundedClusterTemplate::crd(),
        UnboundedMachine::crd(),
        UnboundedMachineTemplate::crd(),
        UnboundedControlPlane::crd(),
        UnboundedControlPlaneTemplate::crd(),
        UnboundedConfig::crd(),
        UnboundedConfigTemplate::crd(),
    ];
    for crd in &mut crds {
        crd.metadata
            .labels
            .get_or_insert_with(Default::default)
            .insert(CONTRACT_LABEL.to_owned(), API_VERSION.to_owned());
    }
    crds
}

/// Why no configuration version runs a Cluster API Machine's Kubernetes version.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "no version of MachineConfiguration {configuration} runs Kubernetes {kubernetes} (its versions run: {available})"
)]
pub struct NoVersionForKubernetes {
    /// The configuration.
    pub configuration: String,
    /// The Cluster API Machine's `spec.version`.
    pub kubernetes: String,
    /// What its versions run, newest first (`v3: v1.35.4`), or `none`.
    pub available: String,
}

/// The version of `configuration` an `UnboundedConfig` without a pinned version runs for a
/// Cluster API Machine of Kubernetes `kubernetes` (its `spec.version`): the newest version
/// whose template names that Kubernetes version (a leading `v` optional on either side). A
/// version that names none is never chosen: Cluster API says which Kubernetes a Machine
/// runs, and a default could be another.
pub fn version_for_kubernetes(
    versions: &[crate::MachineConfigurationVersion],
    configuration: &str,
    kubernetes: &str,
) -> Result<i64, NoVersionForKubernetes> {
    let wanted = kubernetes.trim_start_matches('v');
    let mut own: Vec<_> = versions
        .iter()
        .filter(|v| v.spec.configuration_name == configuration)
        .map(|v| {
            let runs = v
                .spec
                .template
                .kubernetes
                .as_ref()
                .and_then(|k| k.version.as_deref());
            (v.spec.version, runs)
        })
        .collect();
    own.sort_by_key(|(number, _)| std::cmp::Reverse(*number));
    own.iter()
        .find(|(_, runs)| runs.is_some_and(|r| r.trim_start_matches('v') == wanted))
        .map(|(number, _)| *number)
        .ok_or_else(|| NoVersionForKubernetes {
            configuration: configuration.to_owned(),
            kubernetes: kubernetes.to_owned(),
            available: if own.is_empty() {
                "none".to_owned()
            } else {
                own.iter()
                    .map(|(n, runs)| format!("v{n}: {}", runs.unwrap_or("no Kubernetes version")))
                    .collect::<Vec<_>>()
                    .join(", ")
            },
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Cluster API finds a provider's CRD by the name `contract.CalculateCRDName(group,
    /// kind)` gives (the lower-case plural, a dot, the group), and reads the contract label
    /// from it: both must be exactly so, and every kind namespaced.
    #[test]
    fn every_crd_speaks_the_v1beta2_contract() {
        let expected = [
            "unboundedclusters.infrastructure.cluster.x-k8s.io",
            "unboundedclustertemplates.infrastructure.cluster.x-k8s.io",
            "unboundedmachines.infrastructure.cluster.x-k8s.io",
            "unboundedmachinetemplates.infrastructure.cluster.x-k8s.io",
            "unboundedcontrolplanes.controlplane.cluster.x-k8s.io",
            "unboundedcontrolplanetemplates.controlplane.cluster.x-k8s.io",
            "unboundedconfigs.bootstrap.cluster.x-k8s.io",
            "unboundedconfigtemplates.bootstrap.cluster.x-k8s.io",
        ];
        let crds = crds();
        let names: Vec<_> = crds
            .iter()
            .map(|c| c.metadata.name.clone().unwrap_or_default())
            .collect();
        assert_eq!(names, expected);
        for crd in &crds {
            let labels = crd.metadata.labels.clone().unwrap_or_default();
            assert_eq!(
                labels.get(CONTRACT_LABEL).map(String::as_str),
                Some(API_VERSION),
                "{:?}",
                crd.metadata.name
            );
            assert_eq!(crd.spec.scope, "Namespaced", "{:?}", crd.metadata.name);
            assert!(
                crd.spec.versions.iter().any(|v| v.name == API_VERSION),
                "{:?}",
                crd.metadata.name
            );
            let categories = crd.spec.names.categories.clone().unwrap_or_default();
            assert!(categories.iter().any(|c| c == "cluster-api"));
        }
    }

    #[test]
    fn an_unbounded_machine_reads_as_the_contract_writes_it() {
        let machine: UnboundedMachine = serde_json::from_value(serde_json::json!({
            "apiVersion": "infrastructure.cluster.x-k8s.io/v1alpha1",
            "kind": "UnboundedMachine",
            "metadata": {"name": "md-0-abc", "namespace": "tenant-a"},
            "spec": {
                "provider": "pxe",
                "pxe": {"inventorySelector": {"matchLabels": {"rack": "r1"}}},
                "providerID": "pxe://52:54:00:00:00:01"
            },
            "status": {
                "initialization": {"provisioned": true},
                "addresses": [{"type": "InternalIP", "address": "10.99.0.21"}],
                "failureDomain": "r1"
            }
        }))
        .unwrap();
        assert_eq!(machine.spec.provider, MachineProvider::Pxe);
        assert_eq!(
            machine.spec.provider_id.as_deref(),
            Some("pxe://52:54:00:00:00:01")
        );
        let status = machine.status.unwrap();
        assert_eq!(
            status.initialization.and_then(|i| i.provisioned),
            Some(true)
        );
        assert_eq!(status.addresses[0].type_, "InternalIP");
    }

    fn version(
        configuration: &str,
        number: i64,
        kubernetes: Option<&str>,
    ) -> crate::MachineConfigurationVersion {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "unbounded-cloud.io/v1alpha1",
            "kind": "MachineConfigurationVersion",
            "metadata": {"name": format!("{configuration}-v{number}")},
            "spec": {
                "configurationName": configuration,
                "version": number,
                "template": kubernetes.map_or(serde_json::json!({}), |k| serde_json::json!({"kubernetes": {"version": k}})),
            }
        }))
        .unwrap()
    }

    #[test]
    fn a_machine_runs_the_newest_version_of_its_kubernetes() {
        let versions = [
            version("workers", 1, Some("v1.34.2")),
            version("workers", 2, Some("v1.35.4")),
            version("workers", 3, Some("v1.35.4")),
            version("workers", 4, Some("v1.36.0")),
            version("workers", 5, None),
            version("others", 9, Some("v1.35.4")),
        ];
        let pick = |k: &str| version_for_kubernetes(&versions, "workers", k);
        assert_eq!(pick("v1.35.4"), Ok(3));
        assert_eq!(pick("1.35.4"), Ok(3));
        assert_eq!(pick("v1.34.2"), Ok(1));
        assert_eq!(pick("v1.36.0"), Ok(4));
        let missing = pick("v1.33.0").unwrap_err();
        assert_eq!(
            missing.to_string(),
            "no version of MachineConfiguration workers runs Kubernetes v1.33.0 (its versions run: v5: no Kubernetes version, v4: v1.36.0, v3: v1.35.4, v2: v1.35.4, v1: v1.34.2)"
        );
        assert_eq!(
            version_for_kubernetes(&versions, "absent", "v1.35.4")
                .unwrap_err()
                .available,
            "none"
        );
    }
}
