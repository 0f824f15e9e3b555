//! `MachineOperation`: a Job-like operation (reboot, power cycle, ...) on one machine or on
//! every machine a selector matches.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, Time};
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Default for `spec.activeDeadlineSeconds`: how long an operation may stay unclaimed or
/// running before it fails.
pub const DEFAULT_ACTIVE_DEADLINE_SECONDS: i64 = 600;

/// An operation on one Machine (`machineRef`) or on every Machine a selector matches.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "unbounded-cloud.io",
    version = "v1alpha1",
    kind = "MachineOperation",
    shortname = "mo",
    category = "unbounded",
    status = "MachineOperationStatus",
    derive = "PartialEq",
    doc = "A MachineOperation runs one operation (reboot, shutdown, restartService, powerOn, powerOff, powerCycle or a provider's own) on one Machine, or on every Machine a selector matches through one child operation per Machine.",
    printcolumn(name = "Machine", type_ = "string", json_path = ".spec.machineRef.name", description = "Target machine (empty for a selector operation)"),
    printcolumn(name = "Operation", type_ = "string", json_path = ".spec.operationName"),
    printcolumn(name = "State", type_ = "string", json_path = ".status.state"),
    printcolumn(name = "Children", type_ = "integer", json_path = ".status.children.total", description = "Child operations of a selector operation"),
    printcolumn(name = "Complete", type_ = "integer", json_path = ".status.children.complete", priority = 1),
    printcolumn(name = "Failed", type_ = "integer", json_path = ".status.children.failed", priority = 1),
    printcolumn(name = "Message", type_ = "string", json_path = ".status.message", priority = 1),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp"),
    validation = Rule::new("self.metadata.name.size() <= 200").message("a MachineOperation name may be at most 200 characters, so that its per-machine children can be named <operation>-<machine>")
)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.machineRef) != has(self.machineSelector)").message("set exactly one of spec.machineRef and spec.machineSelector"))]
#[x_kube(validation = Rule::new("self.operationName != 'restartService' || ('service' in self.parameters && self.parameters['service'] != '')").message("restartService needs the parameter 'service', such as service: kubelet.service"))]
#[x_kube(validation = Rule::new("self.operationName != 'applyConfiguration' || ('version' in self.parameters && self.parameters['version'].matches('^[1-9][0-9]{0,17}$'))").message("applyConfiguration needs the parameter 'version', the target version number, such as version: \"2\""))]
#[x_kube(validation = Rule::new("self.operationName != 'applyConfiguration' || !('disruptive' in self.parameters) || self.parameters['disruptive'] in ['true', 'false']").message("the parameter 'disruptive' of applyConfiguration must be \"true\" or \"false\""))]
#[x_kube(validation = Rule::new("self.operationName != 'applyConfiguration' || self.parameters.all(k, k in ['version', 'disruptive'])").message("applyConfiguration takes only the parameters 'version' and 'disruptive'"))]
#[x_kube(validation = Rule::new("self == oldSelf").message("the spec of a MachineOperation is immutable: create a new operation instead"))]
pub struct MachineOperationSpec {
    /// The one Machine to operate on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub machine_ref: Option<MachineRef>,

    /// Operate on every Machine whose labels match, through one child operation per Machine
    /// named `<operation>-<machine>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub machine_selector: Option<LabelSelector>,

    /// What to do: `reboot`, `shutdown`, `restartService` (handled by the agent), `powerOn`,
    /// `powerOff`, `powerCycle` (handled by the Machine's provider), `applyConfiguration`
    /// (handled by the controller: parameters `version` and `disruptive`; its files and
    /// kubelet flags are written by the agent through an `applyFiles` child the controller
    /// creates, which a person does not create), or a provider's own name.
    #[schemars(length(max = 63))]
    #[x_kube(validation = Rule::new("self.size() >= 1").message("spec.operationName must not be empty"))]
    #[x_kube(validation = Rule::new("self.matches('^[A-Za-z][A-Za-z0-9-]*$')").message("spec.operationName must start with a letter and hold only letters, digits and '-'"))]
    pub operation_name: String,

    /// Parameters of the operation, such as `service` for restartService.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub parameters: BTreeMap<String, String>,

    /// Delete the operation (and its children) this many seconds after it finished.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self >= 0").message("spec.ttlSecondsAfterFinished must be 0 or more"))]
    pub ttl_seconds_after_finished: Option<i64>,

    /// Fail the operation when it has not finished this many seconds after it was created
    /// (also when no handler claims it). Default 600.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self >= 1 && self <= 604800").message("spec.activeDeadlineSeconds must be between 1 and 604800 (7 days)"))]
    pub active_deadline_seconds: Option<i64>,
}

impl MachineOperationSpec {
    /// `activeDeadlineSeconds` with its default applied.
    pub fn active_deadline_seconds(&self) -> i64 {
        self.active_deadline_seconds
            .unwrap_or(DEFAULT_ACTIVE_DEADLINE_SECONDS)
    }
}

/// Names one Machine.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct MachineRef {
    /// Name of the Machine.
    #[schemars(length(max = 253))]
    #[x_kube(validation = Rule::new("self.size() >= 1").message("machineRef.name must not be empty"))]
    pub name: String,
}

/// Observed state of a MachineOperation.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MachineOperationStatus {
    /// `Pending`, `InProgress`, `Complete` or `Failed`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<OperationState>,
    /// When a handler claimed the operation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_time: Option<Time>,
    /// When the operation finished.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completion_time: Option<Time>,
    /// What happened, for a person.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// The field manager of the handler that claimed the operation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub handler: Option<String>,
    /// Counts of the child operations of a selector operation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub children: Option<ChildCounts>,
    /// Who may claim the operation now: set by the controller when the operation's turn has
    /// come on its Machine (operations on one Machine run one at a time, in creation order).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub routed_to: Option<HandlerKind>,
}

/// Who executes an operation.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, JsonSchema)]
pub enum HandlerKind {
    /// The agent in the Machine's booted OS: `reboot`, `shutdown`, `restartService`.
    Agent,
    /// The Machine's provider: `powerOn`, `powerOff`, `powerCycle` and its own names.
    Provider,
}

impl HandlerKind {
    /// The name as written in `status.routedTo`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Agent => "Agent",
            Self::Provider => "Provider",
        }
    }
}

/// State of an operation.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, JsonSchema)]
pub enum OperationState {
    /// Waiting for a handler (or for an earlier operation on the same machine).
    Pending,
    /// Claimed by a handler and running.
    InProgress,
    /// Finished successfully.
    Complete,
    /// Finished unsuccessfully; see the message.
    Failed,
}

impl OperationState {
    /// Whether the operation has finished.
    pub fn is_finished(self) -> bool {
        matches!(self, Self::Complete | Self::Failed)
    }

    /// The name as written in `status.state`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "Pending",
            Self::InProgress => "InProgress",
            Self::Complete => "Complete",
            Self::Failed => "Failed",
        }
    }
}

/// Counts of a selector operation's children.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ChildCounts {
    /// All children.
    pub total: i64,
    /// Waiting for a handler.
    pub pending: i64,
    /// Claimed and running.
    pub active: i64,
    /// Finished successfully.
    pub complete: i64,
    /// Finished unsuccessfully.
    pub failed: i64,
}
