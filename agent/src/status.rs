//! What the agent reports on its Machine: `status.agent` and the `BootstrapReady` condition,
//! written with server-side apply under the agent's own field manager (so that it never
//! touches the controller's or the provider's fields), and only when it changed.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::Api;
use kube::api::{Patch, PatchParams};
use serde_json::json;
use unbounded_api::well_known::{conditions, field_managers};
use unbounded_api::{AgentStatus, Machine};

use crate::plan::{Action, ContainerState, Wait};

/// Reasons of the `BootstrapReady` condition the agent writes.
pub mod reasons {
    /// The container runs (True).
    pub const CONTAINER_RUNNING: &str = "ContainerRunning";
    /// A pave is in progress.
    pub const PAVING: &str = "Paving";
    /// The container is starting.
    pub const STARTING: &str = "Starting";
    /// Waiting for the controller (configuration, version, repave).
    pub const WAITING: &str = "Waiting";
    /// The container failed to start too often.
    pub const CONTAINER_FAILED: &str = "ContainerFailed";
    /// Credentials could not be obtained.
    pub const CREDENTIALS_FAILED: &str = "CredentialsFailed";
    /// The configuration cannot be rendered (bad kubelet flags, bind mounts, files).
    pub const INVALID_CONFIGURATION: &str = "InvalidConfiguration";
}

/// The condition for what the agent does or just did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Readiness {
    /// True or False.
    pub ready: bool,
    /// The reason.
    pub reason: String,
    /// The message.
    pub message: String,
}

/// The readiness that follows from a decision and the container's state.
pub fn readiness(action: &Action, container: ContainerState, paved: Option<&str>) -> Readiness {
    let paved = paved.unwrap_or("the node image");
    match (action, container) {
        (
            Action::Steady | Action::RecordJoin(_) | Action::RestartKubelet,
            ContainerState::Running,
        ) => Readiness {
            ready: true,
            reason: reasons::CONTAINER_RUNNING.into(),
            message: format!("node container paved with {paved} is running"),
        },
        (
            Action::Pave {
                configuration,
                reason,
            },
            _,
        ) => Readiness {
            ready: false,
            reason: reasons::PAVING.into(),
            message: format!(
                "paving with {} version {} ({})",
                configuration.name,
                configuration.version,
                reason.as_str()
            ),
        },
        (Action::Wait(wait @ Wait::ContainerFailed(_)), _) => Readiness {
            ready: false,
            reason: reasons::CONTAINER_FAILED.into(),
            message: wait.message(),
        },
        (Action::Wait(wait), _) => Readiness {
            ready: false,
            reason: if matches!(wait, Wait::ContainerStarting) {
                reasons::STARTING
            } else {
                reasons::WAITING
            }
            .into(),
            message: wait.message(),
        },
        (_, _) => Readiness {
            ready: false,
            reason: reasons::STARTING.into(),
            message: format!("starting the node container paved with {paved}"),
        },
    }
}

/// Server-side applies the agent's part of the Machine's status.
pub async fn apply(
    machines: &Api<Machine>,
    machine: &str,
    agent: &AgentStatus,
    readiness: &Readiness,
    observed_generation: Option<i64>,
) -> Result<(), kube::Error> {
    let condition = Condition {
        type_: conditions::BOOTSTRAP_READY.into(),
        status: if readiness.ready { "True" } else { "False" }.into(),
        reason: readiness.reason.clone(),
        message: readiness.message.chars().take(1000).collect(),
        observed_generation,
        last_transition_time: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            unbounded_api::condition::now(),
        ),
    };
    let patch = json!({
        "apiVersion": "unbounded-cloud.io/v1alpha1",
        "kind": "Machine",
        "metadata": {"name": machine},
        "status": {"agent": agent, "conditions": [condition]},
    });
    machines
        .patch_status(
            machine,
            &PatchParams::apply(field_managers::AGENT).force(),
            &Patch::Apply(&patch),
        )
        .await
        .map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::PaveReason;
    use unbounded_api::ResolvedConfiguration;

    #[test]
    fn readiness_table() {
        let v = ResolvedConfiguration {
            name: "general".into(),
            version: 2,
        };
        let cases = [
            (
                Action::Steady,
                ContainerState::Running,
                true,
                reasons::CONTAINER_RUNNING,
            ),
            (
                Action::Pave {
                    configuration: v.clone(),
                    reason: PaveReason::NodeDeleted,
                },
                ContainerState::Running,
                false,
                reasons::PAVING,
            ),
            (
                Action::Wait(Wait::ContainerFailed(5)),
                ContainerState::Failed,
                false,
                reasons::CONTAINER_FAILED,
            ),
            (
                Action::Wait(Wait::NoConfiguration),
                ContainerState::Absent,
                false,
                reasons::WAITING,
            ),
            (
                Action::Start,
                ContainerState::Stopped,
                false,
                reasons::STARTING,
            ),
        ];
        for (action, container, ready, reason) in cases {
            let r = readiness(&action, container, Some("general v2"));
            assert_eq!((r.ready, r.reason.as_str()), (ready, reason), "{action:?}");
        }
    }
}
