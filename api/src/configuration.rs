//! `MachineConfiguration`: what a class of machines runs, and `MachineConfigurationVersion`:
//! an immutable (once deployed) snapshot of it.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Taint;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Default for `spec.revisionHistoryLimit`.
pub const DEFAULT_REVISION_HISTORY_LIMIT: i32 = 10;

/// What a class of machines should run, which machines it applies to, and how changes roll out.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "unbounded-cloud.io",
    version = "v1alpha1",
    kind = "MachineConfiguration",
    shortname = "mc",
    category = "unbounded",
    status = "MachineConfigurationStatus",
    derive = "PartialEq",
    doc = "A MachineConfiguration says what a class of machines runs (host OS, node image, Kubernetes settings). Every change of spec.template is captured in a MachineConfigurationVersion.",
    printcolumn(
        name = "Priority",
        type_ = "integer",
        json_path = ".spec.priority",
        description = "Higher wins when several configurations match a Machine"
    ),
    printcolumn(
        name = "Latest",
        type_ = "integer",
        json_path = ".status.latestVersion",
        description = "Highest version number created"
    ),
    printcolumn(
        name = "Strategy",
        type_ = "string",
        json_path = ".spec.updateStrategy.type",
        priority = 1
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!has(self.updateStrategy) || !has(self.updateStrategy.rollingUpdate) || self.updateStrategy.type == 'RollingUpdate'").message("updateStrategy.rollingUpdate may only be set when updateStrategy.type is RollingUpdate"))]
pub struct MachineConfigurationSpec {
    /// Machines whose labels match get this configuration when they do not name one in
    /// `spec.configurationRef`. An empty selector (`{}`) matches every Machine; without a
    /// selector the configuration applies only to Machines that name it. Not versioned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub machine_selector: Option<LabelSelector>,

    /// When several configurations match a Machine, the highest priority wins; ties go to the
    /// name that sorts first. From -1000 to 1000, default 0. Not versioned.
    #[serde(default)]
    #[x_kube(validation = Rule::new("self >= -1000 && self <= 1000").message("priority must be between -1000 and 1000"))]
    pub priority: i32,

    /// How machines move to a new version. Not versioned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub update_strategy: Option<UpdateStrategy>,

    /// How many versions to keep (newest first); versions that a Machine references are never
    /// deleted. From 1 to 100, default 10.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self >= 1 && self <= 100").message("revisionHistoryLimit must be between 1 and 100"))]
    pub revision_history_limit: Option<i32>,

    /// What a version captures: every change here creates or updates a
    /// MachineConfigurationVersion.
    pub template: MachineTemplate,
}

impl MachineConfigurationSpec {
    /// `revisionHistoryLimit` with its default applied.
    pub fn revision_history_limit(&self) -> usize {
        usize::try_from(
            self.revision_history_limit
                .unwrap_or(DEFAULT_REVISION_HISTORY_LIMIT)
                .max(1),
        )
        .unwrap_or(1)
    }

    /// The rolling update settings (defaults when absent).
    pub fn rolling_update(&self) -> RollingUpdate {
        self.update_strategy
            .as_ref()
            .and_then(|s| s.rolling_update.clone())
            .unwrap_or_default()
    }

    /// The update strategy type with its default applied.
    pub fn update_strategy_type(&self) -> UpdateStrategyType {
        self.update_strategy
            .as_ref()
            .map(|s| s.type_)
            .unwrap_or_default()
    }
}

/// How machines move to a new configuration version.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct UpdateStrategy {
    /// `OnDelete` (default): a machine moves to a new version only when its Node is deleted
    /// (repave). `RollingUpdate`: the Machines it selects get its newest version, and the
    /// controller repaves the out-of-date ones in batches (cordon, drain, delete the Node) that
    /// keep at most `rollingUpdate.maxUnavailable` of them unavailable. Machines of a
    /// MachinePool follow their pool's strategy instead.
    #[serde(rename = "type", default)]
    pub type_: UpdateStrategyType,
    /// Settings for RollingUpdate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rolling_update: Option<RollingUpdate>,
}

/// Update strategy types.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum UpdateStrategyType {
    /// Repave only when the Node is deleted.
    #[default]
    OnDelete,
    /// Repave machines one batch at a time.
    RollingUpdate,
}

/// Settings of a rolling update.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct RollingUpdate {
    /// How many machines (a number, or a percentage of the Machines rounded down, at least 1)
    /// may be unavailable at once. Default 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("type(self) == string ? self.matches('^(100|[1-9]?[0-9])%$') : self >= 0").message("maxUnavailable must be a number of Machines (0 or more) or a percentage such as 25%"))]
    pub max_unavailable: Option<IntOrString>,
    /// A repaved Machine not available this many seconds after its repave was requested
    /// fails its batch, which pauses the rollout until it is available or the target changes.
    /// Default 1800.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self >= 1").message("progressDeadlineSeconds must be 1 or more"))]
    pub progress_deadline_seconds: Option<i64>,
}

/// Everything a configuration version captures.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct MachineTemplate {
    /// The host OS that PXE machines boot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boot: Option<BootSpec>,
    /// The node container image.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<ImageSpec>,
    /// Kubernetes settings of the Node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubernetes: Option<KubernetesSpec>,
    /// systemd-nspawn settings of the node container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nspawn: Option<NspawnSpec>,
    /// Extra files written into the node container before it starts.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    /// Paths are unique: the API server rejects a list that names one path twice.
    #[schemars(length(max = 64))]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["path"]))]
    pub files: Vec<FileSpec>,
    /// The local disk that holds the node's state (`/var/lib/machines`: the node container,
    /// with containerd's and kubelet's state inside it), and when it is wiped. Without it,
    /// the node's state lives in RAM.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage: Option<crate::storage::StorageSpec>,
    /// How the machines of this configuration prove who they are (`tpm` or `network`,
    /// trust on first use); a Machine's own `spec.pxe.identity` wins. An endorsement key is
    /// per machine: only on a Machine.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("!has(self.endorsementKey)").message("template.identity.endorsementKey: an endorsement key belongs to one machine; set it on the Machine (spec.pxe.identity)"))]
    pub identity: Option<crate::identity::IdentitySpec>,
}

/// The host OS a PXE machine boots.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct BootSpec {
    /// URL of the kernel (http or https), or a path relative to the bootserver's image
    /// directory.
    #[serde(rename = "kernelURL")]
    #[schemars(length(min = 1, max = 2048))]
    #[x_kube(validation = Rule::new("!self.contains('://') || self.startsWith('http://') || self.startsWith('https://')").message("kernelURL must be an http:// or https:// URL, or a path on the bootserver"))]
    pub kernel_url: String,
    /// URL of the initramfs (http or https), or a path relative to the bootserver's image
    /// directory.
    #[serde(rename = "initrdURL")]
    #[schemars(length(min = 1, max = 2048))]
    #[x_kube(validation = Rule::new("!self.contains('://') || self.startsWith('http://') || self.startsWith('https://')").message("initrdURL must be an http:// or https:// URL, or a path on the bootserver"))]
    pub initrd_url: String,
    /// Extra kernel command-line arguments. The bootserver adds the machine's identity and its
    /// own URL.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64), inner(length(max = 1024)))]
    pub kernel_args: Vec<String>,
    /// The PCR values (SHA-256 bank) this host OS produces on the firmware it boots on, one
    /// set per firmware path that is accepted. When any are listed, a TPM-mode machine gets
    /// credentials only with a quote whose PCRs match every value of one set
    /// (docs/security.md lists what each firmware measures).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "crate::identity::measurements_schema")]
    pub measurements: Vec<crate::identity::PcrValues>,
}

/// The node container image.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ImageSpec {
    /// URL of the image archive (http or https), or a path on the bootserver.
    #[schemars(length(min = 1, max = 2048))]
    pub url: String,
    /// SHA-256 of the archive, 64 lower-case hex digits; the agent refuses an image that does
    /// not match.
    #[schemars(length(max = 64))]
    #[x_kube(validation = Rule::new("self.matches('^[0-9a-f]{64}$')").message("image.sha256 must be 64 lower-case hex digits"))]
    pub sha256: String,
    /// The most bytes the agent downloads (the archive as served, before it is
    /// unpacked); a larger image is refused before anything of it is unpacked. Default
    /// 4 GiB.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self >= 1").message("image.maxSizeBytes must be 1 or more"))]
    pub max_size_bytes: Option<i64>,
}

/// Kubernetes settings of the Node.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct KubernetesSpec {
    /// Kubernetes (kubelet) version, such as `v1.35.4`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    #[x_kube(validation = Rule::new("self.matches('^v[0-9]+\\\\.[0-9]+\\\\.[0-9]+([-+][0-9A-Za-z.-]+)?$')").message("kubernetes.version must look like v1.35.4"))]
    pub version: Option<String>,
    /// Extra kubelet flags, without the leading `--` (`max-pods: "50"`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub kubelet_extra_args: BTreeMap<String, String>,
    /// Labels the Node registers with.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_labels: BTreeMap<String, String>,
    /// Taints the Node registers with.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub node_taints: Vec<Taint>,
}

/// systemd-nspawn settings of the node container.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct NspawnSpec {
    /// Host paths bound into the container.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub bind_mounts: Vec<BindMount>,
    /// Container networking: `host` (default: the container shares the host's network) or
    /// `private` (a veth pair).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<NspawnNetwork>,
}

/// A host path bound into the node container.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct BindMount {
    /// Absolute path on the host.
    #[schemars(length(max = 4096))]
    #[x_kube(validation = Rule::new("self.startsWith('/') && !self.contains('..')").message("bind mount source must be an absolute path without '..'"))]
    pub source: String,
    /// Absolute path inside the container (default: the same as source).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 4096))]
    #[x_kube(validation = Rule::new("self.startsWith('/') && !self.contains('..')").message("bind mount target must be an absolute path without '..'"))]
    pub target: Option<String>,
    /// Bind read-only.
    #[serde(default)]
    pub read_only: bool,
}

/// Networking of the node container.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum NspawnNetwork {
    /// Share the host's network namespace.
    #[default]
    Host,
    /// A private network namespace with a veth pair.
    Private,
}

/// A file written into the node container.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct FileSpec {
    /// Absolute path inside the container.
    #[schemars(length(max = 4096))]
    #[x_kube(validation = Rule::new("self.startsWith('/') && !self.contains('..')").message("file path must be an absolute path without '..'"))]
    pub path: String,
    /// File content (UTF-8 text).
    #[schemars(length(max = 65536))]
    pub content: String,
    /// Permission bits in octal, such as `0644` (default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 4))]
    #[x_kube(validation = Rule::new("self.matches('^0?[0-7]{3}$')").message("file mode must be octal permission bits such as 0644"))]
    pub mode: Option<String>,
    /// systemd units in the node container that read this file (`kubelet.service`,
    /// `containerd.service`): when an `applyConfiguration` operation changes the file in
    /// place, the agent restarts them. Without units, the file is written and nothing is
    /// restarted. Ignored at a pave (every unit starts with the file in place).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16), inner(length(max = 256)))]
    #[x_kube(validation = Rule::new("self.all(u, u.matches('^[A-Za-z0-9:_.@-]+\\\\.(service|socket|target|timer|path|mount)$'))").message("restartUnits must be systemd unit names with their suffix, such as containerd.service"))]
    pub restart_units: Vec<String>,
}

/// Observed state of a MachineConfiguration.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MachineConfigurationStatus {
    /// The highest version number ever created. Numbers are never reused, also after a
    /// version is deleted.
    #[serde(default)]
    pub latest_version: i64,
    /// The versions that exist, oldest first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "atomic"))]
    pub versions: Vec<VersionSummary>,
    /// Conditions, such as UpdateStrategySupported.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
    /// The spec generation the controller last acted on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// With RollingUpdate: the Machines it governs and how far the rollout is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout: Option<RolloutStatus>,
}

/// How far a configuration's rolling update is.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RolloutStatus {
    /// Machines the rollout governs (they resolve to this configuration and belong to no
    /// MachinePool).
    pub machines: i64,
    /// Of them, those recording the version they resolve to.
    pub updated: i64,
    /// Of them, those Ready, not cordoned and not being repaved.
    pub available: i64,
}

/// One version of a configuration, as listed in its status.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VersionSummary {
    /// Name of the MachineConfigurationVersion.
    pub name: String,
    /// Version number.
    pub version: i64,
    /// Whether a machine has been provisioned with it (its spec is then immutable).
    pub deployed: bool,
    /// How many Machines reference it.
    pub machine_count: i64,
}

/// One numbered snapshot of a MachineConfiguration's template.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "unbounded-cloud.io",
    version = "v1alpha1",
    kind = "MachineConfigurationVersion",
    shortname = "mcv",
    category = "unbounded",
    status = "MachineConfigurationVersionStatus",
    derive = "PartialEq",
    doc = "A MachineConfigurationVersion is one numbered snapshot of a MachineConfiguration's template, named <configuration>-v<N>. Its spec becomes immutable once a machine is provisioned with it.",
    printcolumn(name = "Configuration", type_ = "string", json_path = ".spec.configurationName"),
    printcolumn(name = "Version", type_ = "integer", json_path = ".spec.version"),
    printcolumn(name = "Deployed", type_ = "boolean", json_path = ".status.deployed"),
    printcolumn(name = "Machines", type_ = "integer", json_path = ".status.machineCount"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp"),
    validation = Rule::new("!has(oldSelf.status) || !has(oldSelf.status.deployed) || !oldSelf.status.deployed || self.spec == oldSelf.spec").message("the spec of a deployed MachineConfigurationVersion is immutable: change the MachineConfiguration instead, which creates a new version")
)]
#[serde(rename_all = "camelCase")]
pub struct MachineConfigurationVersionSpec {
    /// Name of the MachineConfiguration this version belongs to. Immutable.
    #[schemars(length(min = 1, max = 240))]
    #[x_kube(validation = Rule::new("self == oldSelf").message("spec.configurationName is immutable"))]
    pub configuration_name: String,
    /// Version number, from 1. Immutable.
    #[x_kube(validation = Rule::new("self >= 1").message("spec.version must be 1 or more"))]
    #[x_kube(validation = Rule::new("self == oldSelf").message("spec.version is immutable"))]
    pub version: i64,
    /// A copy of the configuration's template at this version.
    pub template: MachineTemplate,
}

/// Observed state of a configuration version.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct MachineConfigurationVersionStatus {
    /// True once a machine has been provisioned with this version; from then on its spec is
    /// immutable. Never goes back to false.
    #[serde(default)]
    #[x_kube(validation = Rule::new("self || !oldSelf").message("a deployed version stays deployed"))]
    pub deployed: bool,
    /// How many Machines reference this version. While it is above zero the version cannot be
    /// deleted.
    #[serde(default)]
    #[x_kube(validation = Rule::new("self >= 0").message("machineCount cannot be negative"))]
    pub machine_count: i64,
}

/// Name of the MachineConfigurationVersion that holds `version` of `configuration`.
pub fn version_name(configuration: &str, version: i64) -> String {
    format!("{configuration}-v{version}")
}
