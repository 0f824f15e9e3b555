//! What the Machine reconciler records in a Machine's status: the fields it owns, decided
//! ([`StatusPlan`]), merged with what is recorded ([`owned_status`]), and applied when they
//! differ (`write_status`, through [`crate::status_apply`]).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::ResourceExt;
use serde::Serialize;
use unbounded_api::condition;
use unbounded_api::well_known::conditions;
use unbounded_api::{Machine, MachinePhase, MachineStatus, NodeRef, ResolvedConfiguration};

use crate::context::Context;
use crate::error::Error;
use crate::lifecycle::ConditionPlan;
use crate::status_apply::{OverCopy, apply_over_copy};

/// What the reconciler decided to record: the phase, the version, the Node, the kubelet
/// version, and its conditions (without timestamps).
#[derive(Debug, Clone, PartialEq)]
pub struct StatusPlan<'a> {
    /// The phase.
    pub phase: MachinePhase,
    /// The configuration version recorded.
    pub configuration: Option<ResolvedConfiguration>,
    /// The Node recorded.
    pub node_ref: Option<NodeRef>,
    /// The kubelet version the Node reports.
    pub kubelet_version: Option<String>,
    /// The conditions the controller sets (the others it owns are given up).
    pub conditions: Vec<&'a ConditionPlan>,
}

impl<'a> StatusPlan<'a> {
    /// A Machine being deleted: what is recorded stays, the phase is `Deleting`.
    pub fn deleting(current: &MachineStatus, conditions: Vec<&'a ConditionPlan>) -> Self {
        Self {
            phase: MachinePhase::Deleting,
            configuration: current.configuration.clone(),
            node_ref: current.node_ref.clone(),
            kubelet_version: current.kubelet_version.clone(),
            conditions,
        }
    }
}

/// The fields of a Machine's status the controller owns, as it applies them (`phase` and
/// `conditions` always; the others left out when there is none, which gives them up).
#[derive(Serialize, Debug, Clone, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct OwnedStatus {
    /// The phase.
    pub phase: MachinePhase,
    /// The controller's conditions, as they read once merged with the recorded ones.
    pub conditions: Vec<Condition>,
    /// The configuration version.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub configuration: Option<ResolvedConfiguration>,
    /// The Node.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node_ref: Option<NodeRef>,
    /// The kubelet version.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kubelet_version: Option<String>,
    /// The generation this status was decided for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

/// The status to apply for `plan` on a Machine of `generation` whose status is `current`:
/// each planned condition as it reads once set over the recorded ones (a condition whose
/// status did not change keeps its transition time).
pub fn owned_status(
    plan: &StatusPlan<'_>,
    current: &MachineStatus,
    generation: Option<i64>,
) -> OwnedStatus {
    let mut merged = current.conditions.clone();
    let mut ours = Vec::with_capacity(plan.conditions.len());
    for c in &plan.conditions {
        let new =
            condition::new_condition(c.type_, c.status, c.reason, c.message.clone(), generation);
        condition::set(&mut merged, new);
        if let Some(c) = condition::find(&merged, c.type_) {
            ours.push(c.clone());
        }
    }
    OwnedStatus {
        phase: plan.phase,
        conditions: ours,
        configuration: plan.configuration.clone(),
        node_ref: plan.node_ref.clone(),
        kubelet_version: plan.kubelet_version.clone(),
        observed_generation: generation,
    }
}

/// Whether `current` already says everything `wanted` would write (conditions compared by
/// meaning, not time).
pub fn unchanged(current: &MachineStatus, wanted: &OwnedStatus) -> bool {
    current.phase == Some(wanted.phase)
        && current.configuration == wanted.configuration
        && current.node_ref == wanted.node_ref
        && current.kubelet_version == wanted.kubelet_version
        && current.observed_generation == wanted.observed_generation
        && wanted.conditions.iter().all(|c| {
            condition::find(&current.conditions, &c.type_)
                .is_some_and(|old| condition::same_meaning(old, c))
        })
}

/// Applies the controller's status fields (server-side apply, field manager
/// `unbounded-controller`) when they differ from what is recorded; waits instead when this
/// copy of the Machine is one an earlier write replaced ([`crate::status_writes`]).
pub(crate) async fn write_status(
    machine: &Machine,
    plan: StatusPlan<'_>,
    ctx: &Context,
) -> Result<(), Error> {
    let recorded = MachineStatus::default();
    let current = machine.status.as_ref().unwrap_or(&recorded);
    let wanted = owned_status(&plan, current, machine.metadata.generation);
    if unchanged(current, &wanted) {
        return Ok(());
    }
    // Written only over the Machine as read: a reconcile working from a stale copy must not
    // overwrite what a newer one recorded (the version is sticky).
    let write = OverCopy {
        read: machine,
        rewritten: None,
        status: &wanted,
    };
    apply_over_copy(write, &ctx.client, &ctx.expectations).await
}

/// The `Discovered` condition this Machine's every status write carries
/// ([`crate::lifecycle::discovered_condition`] says why also while it is deleted).
pub(super) fn discovered_plan(machine: &Machine, status: &MachineStatus) -> Option<ConditionPlan> {
    let has_condition = condition::find(&status.conditions, conditions::DISCOVERED).is_some();
    crate::lifecycle::discovered_condition(machine.labels(), has_condition)
}

#[cfg(test)]
mod tests {
    use super::*;
    use unbounded_api::well_known::{conditions, reasons};

    fn resolved(version: i64) -> ResolvedConfiguration {
        ResolvedConfiguration {
            name: "general".into(),
            version,
        }
    }

    #[test]
    fn unchanged_compares_every_owned_field_and_conditions_by_meaning() {
        let ready = ConditionPlan {
            type_: conditions::CONFIGURATION_RESOLVED,
            status: true,
            reason: reasons::CONFIGURATION_RESOLVED,
            message: "general version 1".into(),
        };
        let plan = StatusPlan {
            phase: MachinePhase::Running,
            configuration: Some(resolved(1)),
            node_ref: None,
            kubelet_version: Some("v1.35.4".into()),
            conditions: vec![&ready],
        };
        let empty = MachineStatus::default();
        let written = owned_status(&plan, &empty, Some(3));
        assert!(!unchanged(&empty, &written), "nothing recorded yet");

        let recorded = MachineStatus {
            phase: Some(written.phase),
            conditions: written.conditions.clone(),
            configuration: written.configuration.clone(),
            kubelet_version: written.kubelet_version.clone(),
            observed_generation: Some(3),
            ..MachineStatus::default()
        };
        let again = owned_status(&plan, &recorded, Some(3));
        assert!(unchanged(&recorded, &again), "the same decision again");
        assert_eq!(
            again.conditions, recorded.conditions,
            "a condition that did not flip keeps its transition time"
        );

        let cases: [(&str, OwnedStatus); 4] = [
            (
                "another phase",
                OwnedStatus {
                    phase: MachinePhase::Deleting,
                    ..again.clone()
                },
            ),
            (
                "another version",
                OwnedStatus {
                    configuration: Some(resolved(2)),
                    ..again.clone()
                },
            ),
            ("a new generation", owned_status(&plan, &recorded, Some(4))),
            (
                "another message",
                OwnedStatus {
                    conditions: vec![Condition {
                        message: "general version 2".into(),
                        ..again.conditions[0].clone()
                    }],
                    ..again.clone()
                },
            ),
        ];
        for (case, wanted) in cases {
            assert!(!unchanged(&recorded, &wanted), "{case}");
        }
    }

    #[test]
    fn the_body_leaves_out_what_the_machine_does_not_have() {
        let status = owned_status(
            &StatusPlan::deleting(&MachineStatus::default(), vec![]),
            &MachineStatus::default(),
            None,
        );
        assert_eq!(
            serde_json::to_value(&status).unwrap(),
            serde_json::json!({"phase": "Deleting", "conditions": []})
        );
    }
}
