//! What the agent reports on its Machine: `status.agent` and the `BootstrapReady` condition,
//! written with server-side apply under the agent's own field manager (so that it never
//! touches the controller's or the provider's fields), and only when it changed.
//!
//! Both go in every write: with server-side apply, a field its manager no longer sends is
//! removed. So until the agent has decided its readiness in this boot, nothing is written
//! (a write would drop the condition the previous boot left), and [`Reporter::report`]
//! says so ([`Reported::Skipped`]): a caller that needs its change on the Machine before
//! it acts (the reboot record) waits instead of taking the silence as written.

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

/// What a report did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reported {
    /// Written to the Machine's status.
    Written,
    /// The Machine's status already says this: this agent wrote it earlier.
    Unchanged,
    /// Nothing was written; the change is kept and goes out with the next write.
    Skipped(SkipReason),
}

/// Why a report wrote nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SkipReason {
    /// The agent has not decided its readiness in this boot yet (its first pass has not
    /// finished, e.g. its configuration version is not readable yet).
    ReadinessUnknown,
}

impl std::fmt::Display for SkipReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::ReadinessUnknown => {
                "the agent has not decided its readiness in this boot yet, and a status write without it would remove the BootstrapReady condition"
            }
        })
    }
}

/// What the agent wants on its Machine and what it last wrote there.
#[derive(Debug, Default)]
pub struct Ledger {
    agent: AgentStatus,
    readiness: Option<Readiness>,
    written: Option<(AgentStatus, Readiness)>,
}

/// What to do about a report.
#[derive(Debug, Clone, PartialEq)]
pub enum NextWrite {
    /// Write this.
    Write(Box<(AgentStatus, Readiness)>),
    /// Already written.
    Unchanged,
    /// Write nothing.
    Skip(SkipReason),
}

impl Ledger {
    /// A ledger that starts from `agent` and has written nothing.
    pub fn new(agent: AgentStatus) -> Self {
        Self {
            agent,
            ..Self::default()
        }
    }

    /// Takes a change (and the readiness, when known) and decides whether to write.
    pub fn next(
        &mut self,
        change: impl FnOnce(&mut AgentStatus),
        readiness: Option<Readiness>,
    ) -> NextWrite {
        change(&mut self.agent);
        if let Some(r) = readiness {
            self.readiness = Some(r);
        }
        let Some(readiness) = self.readiness.clone() else {
            return NextWrite::Skip(SkipReason::ReadinessUnknown);
        };
        let current = (self.agent.clone(), readiness);
        if self.written.as_ref() == Some(&current) {
            return NextWrite::Unchanged;
        }
        NextWrite::Write(Box::new(current))
    }

    /// Records a successful write.
    pub fn written(&mut self, agent: AgentStatus, readiness: Readiness) {
        self.written = Some((agent, readiness));
    }
}

/// Writes the agent's part of its Machine's status when it changed.
#[derive(Debug)]
pub struct Reporter {
    machines: Api<Machine>,
    machine: String,
    ledger: tokio::sync::Mutex<Ledger>,
}

impl Reporter {
    /// A reporter for `machine` that starts from `agent`.
    pub fn new(machines: Api<Machine>, machine: &str, agent: AgentStatus) -> Self {
        Self {
            machines,
            machine: machine.to_owned(),
            ledger: tokio::sync::Mutex::new(Ledger::new(agent)),
        }
    }

    /// Applies `change` (and `readiness`, when known) and writes when that changes what the
    /// Machine shows; says what it did.
    pub async fn report(
        &self,
        change: impl FnOnce(&mut AgentStatus),
        readiness: Option<Readiness>,
    ) -> Result<Reported, kube::Error> {
        let mut ledger = self.ledger.lock().await;
        let (agent, readiness) = match ledger.next(change, readiness) {
            NextWrite::Write(write) => *write,
            NextWrite::Unchanged => return Ok(Reported::Unchanged),
            NextWrite::Skip(reason) => return Ok(Reported::Skipped(reason)),
        };
        apply(&self.machines, &self.machine, &agent, &readiness, None).await?;
        ledger.written(agent, readiness);
        Ok(Reported::Written)
    }
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
    fn a_report_writes_only_with_a_known_readiness_and_only_on_change() {
        let ready = Readiness {
            ready: true,
            reason: reasons::CONTAINER_RUNNING.into(),
            message: "running".into(),
        };
        let record = |agent: &mut AgentStatus| {
            agent.reboot = Some(unbounded_api::AgentReboot {
                operation: "op".into(),
                from_boot_id: "a".into(),
            });
        };
        let mut ledger = Ledger::new(AgentStatus::default());
        assert_eq!(
            ledger.next(record, None),
            NextWrite::Skip(SkipReason::ReadinessUnknown),
            "the reboot record before the first pass decided readiness"
        );
        let NextWrite::Write(write) = ledger.next(|_| {}, Some(ready.clone())) else {
            panic!("the kept change goes out with the first readiness");
        };
        let (agent, readiness) = *write;
        assert_eq!(
            agent.reboot.as_ref().map(|r| r.operation.as_str()),
            Some("op")
        );
        assert_eq!(readiness, ready);
        assert!(
            matches!(ledger.next(|_| {}, None), NextWrite::Write(..)),
            "not written yet (the write failed or was not made): still to write"
        );
        ledger.written(agent, readiness);
        assert_eq!(ledger.next(record, None), NextWrite::Unchanged);
        assert!(matches!(
            ledger.next(|agent| agent.reboot = None, None),
            NextWrite::Write(..)
        ));
    }

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
