//! A pool's status: counts and the three conditions, decided from the plan; written with
//! server-side apply when it changed.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::ResourceExt;
use unbounded_api::condition;
use unbounded_api::well_known::{conditions, labels, reasons};
use unbounded_api::{MachinePool, MachinePoolStatus};

use super::plan::{HealthState, PoolPlan};
use crate::error::Error;
use crate::rollout::{RolloutState, some_names};

/// The counts of a pool's Machines (those not being removed).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    /// Machines.
    pub replicas: i32,
    /// Running on a Ready Node.
    pub ready: i32,
    /// Available.
    pub available: i32,
    /// Recording what they resolve to.
    pub updated: i32,
    /// Unhealthy.
    pub unhealthy: i32,
    /// Being removed (deleted).
    pub removing: i32,
}

/// A condition the pool controller sets, without its timestamps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolCondition {
    /// Type.
    pub type_: &'static str,
    /// True or False.
    pub status: bool,
    /// Reason.
    pub reason: &'static str,
    /// Message.
    pub message: String,
}

fn cond(type_: &'static str, status: bool, reason: &'static str, message: String) -> PoolCondition {
    PoolCondition {
        type_,
        status,
        reason,
        message,
    }
}

/// The pool's conditions.
pub fn pool_conditions(
    plan: &PoolPlan,
    counts: &Counts,
    replicas: i32,
    creates: bool,
    remediation: bool,
    progress_deadline_seconds: i64,
) -> [PoolCondition; 3] {
    let adding = if creates { "creating" } else { "claiming" };
    let removing = if creates { "deleting" } else { "releasing" };
    let scaled = if plan.short > 0 {
        cond(
            conditions::SCALED,
            false,
            reasons::INVENTORY_SHORT,
            format!(
                "holds {} of {replicas} Machines: {} more wanted, and no free pxe Machine matches spec.template.spec.pxe.inventorySelector",
                counts.replicas, plan.short
            ),
        )
    } else if counts.replicas < replicas || plan.add > 0 {
        cond(
            conditions::SCALED,
            false,
            reasons::SCALING_UP,
            format!(
                "holds {} of {replicas} Machines; {adding} {}",
                counts.replicas,
                (replicas - counts.replicas).max(0)
            ),
        )
    } else if counts.replicas > replicas || counts.removing > 0 || !plan.remove.is_empty() {
        cond(
            conditions::SCALED,
            false,
            reasons::SCALING_DOWN,
            format!(
                "holds {} of {replicas} Machines; {removing} {}",
                counts.replicas,
                (counts.replicas - replicas).max(0) + counts.removing
            ),
        )
    } else {
        cond(
            conditions::SCALED,
            true,
            reasons::AT_REPLICAS,
            format!("holds {replicas} Machines"),
        )
    };
    let up_to_date = match &plan.rollout {
        RolloutState::UpToDate => cond(
            conditions::UP_TO_DATE,
            true,
            reasons::UP_TO_DATE,
            "every Machine records the configuration version it resolves to".into(),
        ),
        RolloutState::RollingOut {
            updated,
            total,
            repaving,
        } => cond(
            conditions::UP_TO_DATE,
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
        RolloutState::Paused { outdated } => cond(
            conditions::UP_TO_DATE,
            false,
            reasons::PAUSED,
            format!("spec.paused: {outdated} out-of-date Machines wait"),
        ),
        RolloutState::Failed { machines } => cond(
            conditions::UP_TO_DATE,
            false,
            reasons::BATCH_FAILED,
            format!(
                "{} not available {progress_deadline_seconds} s after their repave: the rollout is paused until they are, or until the template points at another version (a rollback)",
                some_names(machines)
            ),
        ),
        RolloutState::WaitingForNodeDeletion { outdated } => cond(
            conditions::UP_TO_DATE,
            false,
            reasons::WAITING_FOR_NODE_DELETION,
            format!(
                "OnDelete: {outdated} out-of-date Machines move to the new version when their Node is deleted"
            ),
        ),
    };
    let healthy = match &plan.health {
        HealthState::Healthy if !remediation => cond(
            conditions::MACHINES_HEALTHY,
            true,
            reasons::HEALTHY,
            "remediation is not configured".into(),
        ),
        HealthState::Healthy => cond(
            conditions::MACHINES_HEALTHY,
            true,
            reasons::HEALTHY,
            "no Machine is unhealthy".into(),
        ),
        HealthState::Remediating { unhealthy } => cond(
            conditions::MACHINES_HEALTHY,
            false,
            reasons::REMEDIATING,
            format!("unhealthy: {}; remediating", some_names(unhealthy)),
        ),
        HealthState::TooManyUnhealthy { unhealthy, max } => cond(
            conditions::MACHINES_HEALTHY,
            false,
            reasons::TOO_MANY_UNHEALTHY,
            format!(
                "{} Machines unhealthy ({}), more than maxUnhealthy ({max}): none is remediated",
                unhealthy.len(),
                some_names(unhealthy)
            ),
        ),
    };
    [scaled, up_to_date, healthy]
}

/// Writes the status when it differs from what is recorded.
pub async fn write(
    pool: &MachinePool,
    counts: &Counts,
    planned: &[PoolCondition],
    client: &kube::Client,
) -> Result<(), Error> {
    let generation = pool.metadata.generation;
    let current = pool.status.clone().unwrap_or_default();
    let mut merged = current.conditions.clone();
    let mut ours: Vec<Condition> = Vec::new();
    for p in planned {
        condition::set(
            &mut merged,
            condition::new_condition(p.type_, p.status, p.reason, p.message.clone(), generation),
        );
        if let Some(c) = condition::find(&merged, p.type_) {
            ours.push(c.clone());
        }
    }
    let wanted = MachinePoolStatus {
        replicas: counts.replicas,
        ready_replicas: counts.ready,
        available_replicas: counts.available,
        updated_replicas: counts.updated,
        unhealthy_replicas: counts.unhealthy,
        selector: format!("{}={}", labels::POOL, pool.name_any()),
        conditions: ours,
        observed_generation: generation,
    };
    let unchanged = current.replicas == wanted.replicas
        && current.ready_replicas == wanted.ready_replicas
        && current.available_replicas == wanted.available_replicas
        && current.updated_replicas == wanted.updated_replicas
        && current.unhealthy_replicas == wanted.unhealthy_replicas
        && current.selector == wanted.selector
        && current.observed_generation == wanted.observed_generation
        && wanted.conditions.iter().all(|c| {
            condition::find(&current.conditions, &c.type_)
                .is_some_and(|old| condition::same_meaning(old, c))
        });
    if unchanged {
        return Ok(());
    }
    crate::status_apply::apply::<MachinePool, _>(client, &pool.name_any(), None, &wanted)
        .await
        .map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(rollout: RolloutState, health: HealthState) -> PoolPlan {
        PoolPlan {
            add: 0,
            short: 0,
            remove: vec![],
            remediate: vec![],
            repave: vec![],
            rollout,
            health,
        }
    }

    #[test]
    fn conditions_table() {
        let counts = Counts {
            replicas: 3,
            ready: 3,
            available: 3,
            updated: 3,
            ..Counts::default()
        };
        let [scaled, up, healthy] = pool_conditions(
            &plan(RolloutState::UpToDate, HealthState::Healthy),
            &counts,
            3,
            true,
            true,
            600,
        );
        assert!(scaled.status && up.status && healthy.status);
        assert_eq!(scaled.message, "holds 3 Machines");

        let short = PoolPlan {
            short: 2,
            ..plan(RolloutState::UpToDate, HealthState::Healthy)
        };
        let [scaled, _, _] = pool_conditions(&short, &counts, 5, false, false, 600);
        assert_eq!(scaled.reason, reasons::INVENTORY_SHORT);
        assert!(
            scaled
                .message
                .contains("holds 3 of 5 Machines: 2 more wanted")
        );

        let [scaled, up, healthy] = pool_conditions(
            &plan(
                RolloutState::Failed {
                    machines: vec!["m1".into()],
                },
                HealthState::TooManyUnhealthy {
                    unhealthy: vec!["a".into(), "b".into()],
                    max: 1,
                },
            ),
            &counts,
            2,
            true,
            true,
            600,
        );
        assert_eq!(scaled.reason, reasons::SCALING_DOWN);
        assert_eq!(up.reason, reasons::BATCH_FAILED);
        assert!(
            up.message
                .starts_with("m1 not available 600 s after their repave")
        );
        assert_eq!(healthy.reason, reasons::TOO_MANY_UNHEALTHY);
        assert!(
            healthy
                .message
                .contains("2 Machines unhealthy (a, b), more than maxUnhealthy (1)")
        );
    }
}
