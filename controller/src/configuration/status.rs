//! What the MachineConfiguration reconciler records in a configuration's status: the fields
//! it owns, decided ([`StatusPlan`]), merged with what is recorded ([`owned_status`]), and
//! applied when they differ (`write_status`, through [`crate::status_apply`]).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::runtime::events::EventType;
use serde::Serialize;
use unbounded_api::condition;
use unbounded_api::well_known::{conditions, reasons};
use unbounded_api::{
    MachineConfiguration, MachineConfigurationStatus, RolloutStatus, UpdateStrategyType,
    VersionSummary,
};

use crate::context::Context;
use crate::error::Error;
use crate::rolling::Rollout;
use crate::rollout::{RolloutState, some_names};
use crate::status_apply::{OverCopy, apply_over_copy};

/// What the reconciler decided to record.
#[derive(Debug, Clone)]
pub struct StatusPlan<'a> {
    /// The highest version number ever created.
    pub latest: i64,
    /// The versions that remain (the pruned ones left out), in any order.
    pub versions: Vec<VersionSummary>,
    /// With `RollingUpdate`: where the rollout stands.
    pub rollout: Option<&'a Rollout>,
}

/// The fields of a configuration's status the controller owns, as it applies them.
#[derive(Serialize, Debug, Clone, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct OwnedStatus {
    /// The highest version number ever created.
    pub latest_version: i64,
    /// The versions, oldest first.
    pub versions: Vec<VersionSummary>,
    /// `UpdateStrategySupported`, and `UpToDate` with a rollout, as they read once merged
    /// with the recorded ones.
    pub conditions: Vec<Condition>,
    /// The generation this status was decided for.
    pub observed_generation: Option<i64>,
    /// The rollout's counts; left out rather than null when there is none (the apply then
    /// drops it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rollout: Option<RolloutStatus>,
}

/// The UpToDate condition of a rolling configuration.
fn up_to_date_condition(
    state: &RolloutState,
    deadline_seconds: i64,
    generation: Option<i64>,
) -> Condition {
    let (status, reason, message) = match state {
        RolloutState::UpToDate => (
            true,
            reasons::UP_TO_DATE,
            "every Machine records the version it resolves to".to_owned(),
        ),
        RolloutState::RollingOut {
            updated,
            total,
            repaving,
        } => (
            false,
            reasons::ROLLING_OUT,
            if repaving.is_empty() {
                format!("{updated} of {total} Machines up to date")
            } else {
                format!(
                    "{updated} of {total} Machines up to date; repaving {}",
                    some_names(repaving)
                )
            },
        ),
        RolloutState::Failed { machines } => (
            false,
            reasons::BATCH_FAILED,
            format!(
                "{} not available {deadline_seconds} s after their repave: the rollout is paused until they are, or until they resolve to another version (a rollback)",
                some_names(machines)
            ),
        ),
        RolloutState::Paused { outdated } | RolloutState::WaitingForNodeDeletion { outdated } => (
            false,
            reasons::WAITING_FOR_NODE_DELETION,
            format!("{outdated} out-of-date Machines wait"),
        ),
    };
    condition::new_condition(conditions::UP_TO_DATE, status, reason, message, generation)
}

/// The status to apply for `plan` on `configuration`.
pub fn owned_status(configuration: &MachineConfiguration, plan: &StatusPlan<'_>) -> OwnedStatus {
    let mut versions = plan.versions.clone();
    versions.sort_by_key(|s| s.version);
    let generation = configuration.metadata.generation;
    let strategy = match configuration.spec.update_strategy_type() {
        UpdateStrategyType::OnDelete => condition::new_condition(
            conditions::UPDATE_STRATEGY_SUPPORTED,
            true,
            reasons::SUPPORTED,
            "OnDelete: a Machine moves to a new version when its Node is deleted (repave)",
            generation,
        ),
        UpdateStrategyType::RollingUpdate => condition::new_condition(
            conditions::UPDATE_STRATEGY_SUPPORTED,
            true,
            reasons::SUPPORTED,
            "RollingUpdate: out-of-date Machines (not in a MachinePool) are repaved in batches of at most maxUnavailable",
            generation,
        ),
    };
    let deadline_seconds = configuration
        .spec
        .rolling_update()
        .progress_deadline_seconds
        .unwrap_or(unbounded_api::pool::DEFAULT_PROGRESS_DEADLINE_SECONDS);
    let mut planned = vec![strategy];
    if let Some(r) = plan.rollout {
        planned.push(up_to_date_condition(&r.state, deadline_seconds, generation));
    }
    let mut merged = configuration
        .status
        .as_ref()
        .map(|s| s.conditions.clone())
        .unwrap_or_default();
    for c in &planned {
        condition::set(&mut merged, c.clone());
    }
    merged.retain(|c| planned.iter().any(|p| p.type_ == c.type_));
    OwnedStatus {
        latest_version: plan.latest,
        versions,
        conditions: merged,
        observed_generation: generation,
        rollout: plan.rollout.map(|r| r.status.clone()),
    }
}

/// Whether `current` already says everything `wanted` would write (conditions compared by
/// meaning, not time; an `UpToDate` without a rollout is to go).
pub fn unchanged(current: &MachineConfigurationStatus, wanted: &OwnedStatus) -> bool {
    current.latest_version == wanted.latest_version
        && current.versions == wanted.versions
        && current.observed_generation == wanted.observed_generation
        && current.rollout == wanted.rollout
        && wanted.conditions.iter().all(|p| {
            condition::find(&current.conditions, &p.type_)
                .is_some_and(|c| condition::same_meaning(c, p))
        })
        && (wanted.rollout.is_some()
            || condition::find(&current.conditions, conditions::UP_TO_DATE).is_none())
}

/// Whether `wanted` reports a failed batch that `current` did not: the moment for a
/// Warning.
fn batch_failed_now<'a>(
    current: &MachineConfigurationStatus,
    wanted: &'a OwnedStatus,
) -> Option<&'a Condition> {
    let failed_before = condition::find(&current.conditions, conditions::UP_TO_DATE)
        .is_some_and(|c| c.reason == reasons::BATCH_FAILED);
    condition::find(&wanted.conditions, conditions::UP_TO_DATE)
        .filter(|c| c.reason == reasons::BATCH_FAILED && !failed_before)
}

/// Applies the controller's status fields when they differ from what is recorded, over
/// `over` (the copy as read, or the one this reconcile's `latestVersion` write made, so that
/// a stale copy never rolls `latestVersion` back); waits instead when the copy read is one
/// an earlier write replaced ([`crate::status_writes`]). Warns once when a batch fails.
pub(crate) async fn write_status(
    configuration: &MachineConfiguration,
    over: Option<&str>,
    plan: StatusPlan<'_>,
    ctx: &Context,
) -> Result<(), Error> {
    let recorded = MachineConfigurationStatus::default();
    let current = configuration.status.as_ref().unwrap_or(&recorded);
    let wanted = owned_status(configuration, &plan);
    if let Some(failed) = batch_failed_now(current, &wanted) {
        ctx.event(
            configuration,
            EventType::Warning,
            reasons::BATCH_FAILED,
            failed.message.clone(),
        )
        .await;
    }
    if unchanged(current, &wanted) {
        return Ok(());
    }
    let write = OverCopy {
        read: configuration,
        rewritten: over,
        status: &wanted,
    };
    apply_over_copy(write, &ctx.client, &ctx.expectations).await
}
