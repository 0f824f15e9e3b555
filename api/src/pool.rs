//! `MachinePool`: a scalable group of Machines (Cluster API's MachinePool Machines), one
//! Machine per replica, with rolling updates and remediation.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::{AzureSpec, ConfigurationRef, MachineProvider};

/// Default of `strategy.rollingUpdate.progressDeadlineSeconds` (also of a
/// MachineConfiguration's): how long a repaved Machine may take to be Ready again before
/// its batch counts as failed and the rollout pauses.
pub const DEFAULT_PROGRESS_DEADLINE_SECONDS: i64 = 1800;

/// Default of `remediation.provisioningTimeoutSeconds`.
pub const DEFAULT_PROVISIONING_TIMEOUT_SECONDS: i64 = 1800;

/// A group of Machines kept at `replicas`, each an ordinary Machine owned by the pool.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "unbounded-cloud.io",
    version = "v1alpha1",
    kind = "MachinePool",
    shortname = "mp",
    category = "unbounded",
    status = "MachinePoolStatus",
    derive = "PartialEq",
    doc = "A MachinePool keeps spec.replicas Machines made from its template: Azure (and manual) pools create them, PXE pools claim free PXE Machines from the inventory. It rolls them to new configuration versions in batches and remediates unhealthy ones.",
    scale(
        spec_replicas_path = ".spec.replicas",
        status_replicas_path = ".status.replicas",
        label_selector_path = ".status.selector"
    ),
    printcolumn(name = "Replicas", type_ = "integer", json_path = ".spec.replicas", description = "Machines wanted"),
    printcolumn(name = "Current", type_ = "integer", json_path = ".status.replicas", description = "Machines in the pool (not being removed)"),
    printcolumn(name = "Ready", type_ = "integer", json_path = ".status.readyReplicas", description = "Machines whose Node is Ready"),
    printcolumn(name = "Updated", type_ = "integer", json_path = ".status.updatedReplicas", description = "Machines on the configuration version the template resolves to"),
    printcolumn(name = "Configuration", type_ = "string", json_path = ".spec.template.spec.configurationRef.name", description = "The MachineConfiguration the template names"),
    printcolumn(name = "Provider", type_ = "string", json_path = ".spec.template.spec.provider", priority = 1),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp"),
    validation = Rule::new("self.metadata.name.size() <= 63").message("a MachinePool name may be at most 63 characters: it is the value of its Machines' unbounded-cloud.io/pool label")
)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!has(self.strategy) || !has(self.strategy.rollingUpdate) || !has(self.strategy.rollingUpdate.maxSurge) || self.template.spec.provider != 'pxe'").message("strategy.rollingUpdate.maxSurge applies only to pools that create Machines (azure, manual): a pxe pool cannot add hardware"))]
pub struct MachinePoolSpec {
    /// How many Machines the pool keeps (0 or more). `kubectl scale mp/<name> --replicas=N`
    /// sets it.
    #[serde(default = "default_replicas")]
    #[x_kube(validation = Rule::new("self >= 0").message("spec.replicas must be 0 or more"))]
    pub replicas: i32,

    /// What every Machine of the pool is made from.
    pub template: MachinePoolTemplate,

    /// How Machines move to a new configuration version. Default: RollingUpdate with
    /// maxUnavailable 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub strategy: Option<PoolStrategy>,

    /// When and how unhealthy Machines are remediated (repaved for pxe, replaced for azure
    /// and manual). Without it, nothing is remediated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remediation: Option<Remediation>,

    /// Stops starting rollout batches (scaling and remediation go on); batches already
    /// started finish.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub paused: bool,
}

fn default_replicas() -> i32 {
    1
}

/// The template of the pool's Machines.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct MachinePoolTemplate {
    /// Labels and annotations every Machine of the pool carries (beside
    /// `unbounded-cloud.io/pool: <pool>`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<TemplateMetadata>,
    /// The Machines' spec.
    pub spec: PoolMachineSpec,
}

/// Labels and annotations of the pool's Machines.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct TemplateMetadata {
    /// Labels (added to every Machine; a configuration's machineSelector may match them).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[x_kube(validation = Rule::new("!('unbounded-cloud.io/pool' in self)").message("template labels may not set unbounded-cloud.io/pool: the pool sets it to its own name"))]
    pub labels: BTreeMap<String, String>,
    /// Annotations (added to every Machine).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

/// The spec of the pool's Machines.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("self.provider != 'pxe' || has(self.pxe)").message("spec.template.spec.pxe (with inventorySelector) is required when the provider is 'pxe'"))]
#[x_kube(validation = Rule::new("self.provider != 'azure' || has(self.azure)").message("spec.template.spec.azure is required when the provider is 'azure'"))]
#[x_kube(validation = Rule::new("!has(self.pxe) || self.provider == 'pxe'").message("spec.template.spec.pxe may only be set when the provider is 'pxe'"))]
#[x_kube(validation = Rule::new("!has(self.azure) || self.provider == 'azure'").message("spec.template.spec.azure may only be set when the provider is 'azure'"))]
pub struct PoolMachineSpec {
    /// `azure`: the pool creates Machines (VMs) and deletes them; `pxe`: the pool claims free
    /// PXE Machines from the inventory and releases them; `manual`: the pool creates Machines
    /// that someone else provisions. Immutable.
    #[x_kube(validation = Rule::new("self == oldSelf").message("spec.template.spec.provider is immutable: create another pool"))]
    pub provider: MachineProvider,

    /// The Azure VM of every Machine (`provider: azure`). Read when a Machine is created:
    /// changes apply to Machines created afterwards (scale up, replacement).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub azure: Option<AzureSpec>,

    /// Which PXE Machines the pool may claim (`provider: pxe`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pxe: Option<PoolPxeSpec>,

    /// The configuration (and optionally the version) every Machine runs. Without it, each
    /// Machine gets the configuration its labels select. Changing it rolls the pool
    /// (pointing it at an older version rolls back).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub configuration_ref: Option<ConfigurationRef>,
}

/// How a PXE pool finds its Machines.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PoolPxeSpec {
    /// The free `provider: pxe` Machines (no `unbounded-cloud.io/pool` label, no controlling
    /// owner) the pool may claim. `{}` matches every free PXE Machine.
    pub inventory_selector: LabelSelector,
    /// What a label selector cannot say: at least this many CPUs, GiB, disks, Mbit/s,
    /// checked against the Machines' hardware labels (`hardware.unbounded-cloud.io/…`, from
    /// their MachineInventory). A Machine without the label a requirement needs is not claimed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hardware_requirements: Option<crate::inventory::HardwareRequirements>,
}

/// How a pool moves its Machines to a new configuration version.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!has(self.rollingUpdate) || self.type == 'RollingUpdate'").message("strategy.rollingUpdate may only be set when strategy.type is RollingUpdate"))]
pub struct PoolStrategy {
    /// `RollingUpdate` (default): out-of-date Machines are repaved in batches.
    /// `OnDelete`: a Machine moves to the new version when its Node is deleted.
    #[serde(rename = "type", default)]
    pub type_: PoolStrategyType,
    /// Settings of RollingUpdate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rolling_update: Option<PoolRollingUpdate>,
}

/// Strategy types of a pool.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum PoolStrategyType {
    /// Repave out-of-date Machines in batches.
    #[default]
    RollingUpdate,
    /// Repave only when the Node is deleted.
    OnDelete,
}

/// Settings of a pool's rolling update.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PoolRollingUpdate {
    /// How many Machines (a number, or a percentage of replicas rounded down, at least 1
    /// unless maxSurge is set) may be unavailable at once. Default 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("type(self) == string ? self.matches('^(100|[1-9]?[0-9])%$') : self >= 0").message("maxUnavailable must be a number of Machines (0 or more) or a percentage such as 25%"))]
    pub max_unavailable: Option<IntOrString>,
    /// Pools that create Machines (azure, manual): how many Machines (or what percentage of
    /// replicas, rounded up) may be created above replicas during a rollout; out-of-date
    /// Machines are then replaced rather than repaved. Default 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("type(self) == string ? self.matches('^(100|[1-9]?[0-9])%$') : self >= 0").message("maxSurge must be a number of Machines (0 or more) or a percentage such as 25%"))]
    pub max_surge: Option<IntOrString>,
    /// A repaved Machine not available this many seconds after its repave was requested
    /// fails its batch, which pauses the rollout. Default 1800.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self >= 1").message("progressDeadlineSeconds must be 1 or more"))]
    pub progress_deadline_seconds: Option<i64>,
}

/// When and how a pool remediates unhealthy Machines.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Remediation {
    /// A Machine whose Node has one of these conditions for longer than its timeout is
    /// unhealthy.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 8))]
    pub unhealthy_conditions: Vec<UnhealthyCondition>,
    /// A Machine without a Ready Node this long after it was created, claimed or last
    /// repaved (stuck in Provisioning) is unhealthy. Default 1800.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self >= 1").message("provisioningTimeoutSeconds must be 1 or more"))]
    pub provisioning_timeout_seconds: Option<i64>,
    /// When more Machines than this (a number, or a percentage of replicas rounded down) are
    /// unhealthy at once, none is remediated (something larger is wrong); otherwise at most
    /// this many are remediated at a time. Default 100%.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("type(self) == string ? self.matches('^(100|[1-9]?[0-9])%$') : self >= 0").message("maxUnhealthy must be a number of Machines (0 or more) or a percentage such as 40%"))]
    pub max_unhealthy: Option<IntOrString>,
}

/// A Node condition that makes a Machine unhealthy after a timeout.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct UnhealthyCondition {
    /// The Node condition type (only `Ready` is watched).
    #[serde(rename = "type")]
    #[x_kube(validation = Rule::new("self == 'Ready'").message("only the Node condition Ready is watched"))]
    pub type_: String,
    /// `False` or `Unknown`.
    #[x_kube(validation = Rule::new("self == 'False' || self == 'Unknown'").message("status must be False or Unknown"))]
    pub status: String,
    /// How long the condition must hold.
    #[x_kube(validation = Rule::new("self >= 1").message("timeoutSeconds must be 1 or more"))]
    pub timeout_seconds: i64,
}

/// Observed state of a MachinePool.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MachinePoolStatus {
    /// Machines in the pool, not counting those being removed.
    #[serde(default)]
    pub replicas: i32,
    /// Of them, those whose Node is Ready.
    #[serde(default)]
    pub ready_replicas: i32,
    /// Of them, those Ready, not cordoned and not being repaved.
    #[serde(default)]
    pub available_replicas: i32,
    /// Of them, those on the configuration version the template resolves to.
    #[serde(default)]
    pub updated_replicas: i32,
    /// Of them, those unhealthy by `remediation`.
    #[serde(default)]
    pub unhealthy_replicas: i32,
    /// The label selector of the pool's Machines (for the scale subresource).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub selector: String,
    /// Conditions: Scaled, UpToDate, MachinesHealthy.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
    /// The spec generation the controller last acted on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

impl MachinePoolSpec {
    /// The strategy type with its default applied.
    pub fn strategy_type(&self) -> PoolStrategyType {
        self.strategy.as_ref().map(|s| s.type_).unwrap_or_default()
    }

    /// The rolling update settings (defaults when absent).
    pub fn rolling_update(&self) -> PoolRollingUpdate {
        self.strategy
            .as_ref()
            .and_then(|s| s.rolling_update.clone())
            .unwrap_or_default()
    }
}
