//! A `manual` Machine's release: no provider loop holds it while its disks are wiped, so the
//! controller does, with the providers' decision ([`unbounded_runtime::release`]).

use kube::runtime::events::EventType;
use kube::runtime::reflector::ObjectRef;
use unbounded_api::condition;
use unbounded_api::well_known::conditions;
use unbounded_api::{Machine, MachineStatus};
use unbounded_runtime::release::{
    Configured, ReleaseStep, WipeTimeouts, decide_release, facts_of, wiping_version,
};

use super::status::{StatusPlan, discovered_plan, write_status};
use crate::context::Context;
use crate::error::Error;
use crate::lifecycle::ConditionPlan;

/// What the configuration version the Machine's disks may hold says about release (the
/// agent's paved version, else the resolved one), read from the controller's cache.
pub(crate) fn configured_for(machine: &Machine, ctx: &Context) -> Configured {
    match wiping_version(machine) {
        None => Configured::NoConfiguration,
        Some(resolved) => {
            let name = resolved.version_name();
            match ctx.versions.get(&ObjectRef::new(&name)) {
                Some(v) => Configured::from_storage(v.spec.template.storage.as_ref()),
                None => Configured::Unreadable(format!("{name} does not exist")),
            }
        }
    }
}

/// For a `manual` Machine being deleted, its Node gone: `Ok` once its disks are wiped as
/// its configuration says (or need no wipe, or a person said to skip it); otherwise it
/// waits, or is held after a failure or the timeout, with the `DisksWiped` condition.
pub(super) async fn release_disks(
    machine: &Machine,
    status: &MachineStatus,
    ctx: &Context,
) -> Result<(), Error> {
    let step = decide_release(&facts_of(
        machine,
        configured_for(machine, ctx),
        condition::now(),
        WipeTimeouts::default(),
    ));
    let plan = ConditionPlan {
        type_: conditions::DISKS_WIPED,
        status: step.condition_status(),
        reason: step.reason(),
        message: step.message().to_owned(),
    };
    let current = condition::find(&status.conditions, conditions::DISKS_WIPED);
    // A Machine that never waited lets go without a write (most have no storage).
    if current.is_none() && matches!(step, ReleaseStep::PowerOff { .. }) {
        return Ok(());
    }
    let changed = current.is_none_or(|c| c.reason != plan.reason || c.message != plan.message);
    if changed && let ReleaseStep::Hold { reason, message } = &step {
        ctx.event(machine, EventType::Warning, reason, message.clone())
            .await;
    }
    let discovered = discovered_plan(machine, status);
    let conditions = std::iter::once(&plan).chain(discovered.as_ref()).collect();
    write_status(machine, StatusPlan::deleting(status, conditions), ctx).await?;
    match step {
        ReleaseStep::PowerOff { .. } => Ok(()),
        ReleaseStep::Wait { message } | ReleaseStep::Hold { message, .. } => {
            Err(Error::Waiting(message))
        }
    }
}
