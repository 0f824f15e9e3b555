//! The configuration version a Machine records: its Kubernetes version against the API
//! server's skew policy, and its lock (a version a Machine runs never changes).

use std::time::Instant;

use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::EventType;
use kube::runtime::reflector::ObjectRef;
use serde_json::json;
use unbounded_api::well_known::{conditions, reasons};
use unbounded_api::{
    Machine, MachineConfigurationVersion, MachinePhase, MachineStatus, ResolvedConfiguration,
};

use crate::context::Context;
use crate::error::{Error, kube_err};
use crate::expectations::{Expectation, expecting};
use crate::lifecycle::{ConditionPlan, MachinePlan};
use crate::skew;

/// The `kubernetes.version` of a configuration version, from the cache.
pub(super) fn kubernetes_version(
    configuration: Option<&ResolvedConfiguration>,
    ctx: &Context,
) -> Option<String> {
    let name = configuration?.version_name();
    ctx.versions
        .get(&ObjectRef::new(&name))?
        .spec
        .template
        .kubernetes
        .as_ref()?
        .version
        .clone()
}

/// Keeps what the Machine records (or nothing) instead of a version whose kubelet the
/// skew policy refuses against the API server's version, with a condition that says why.
pub(super) async fn refuse_skewed(
    plan: &mut MachinePlan,
    status: &MachineStatus,
    ctx: &Context,
) -> Result<(), Error> {
    let Some(wanted) = kubernetes_version(plan.configuration.as_ref(), ctx) else {
        return Ok(());
    };
    let apiserver = ctx
        .client
        .apiserver_version()
        .await
        .map_err(kube_err("reading the API server's version".to_owned()))?;
    let Err(refused) = skew::check(&wanted, &apiserver.git_version) else {
        return Ok(());
    };
    let (name, version) = plan
        .configuration
        .as_ref()
        .map(|c| (c.name.clone(), c.version))
        .unwrap_or_default();
    plan.configuration = status.configuration.clone();
    plan.repave = false;
    plan.configuration_condition = ConditionPlan {
        type_: conditions::CONFIGURATION_RESOLVED,
        status: false,
        reason: refused.reason(),
        message: format!("{name} version {version} is not applied: {refused}"),
    };
    if plan.configuration.is_none() {
        plan.phase = MachinePhase::Pending;
    }
    Ok(())
}

/// Marks the version deployed (immutable) unless it already is.
pub(super) async fn lock_version(
    configuration: &ResolvedConfiguration,
    machine: &Machine,
    ctx: &Context,
) -> Result<(), Error> {
    let name = configuration.version_name();
    let deployed = ctx
        .versions
        .get(&ObjectRef::new(&name))
        .and_then(|v| v.status.as_ref().map(|s| s.deployed))
        .unwrap_or(false);
    // Locked by an earlier reconcile whose write the cache has not shown yet.
    let locked = ctx
        .expectations
        .read()
        .locked_versions
        .pending(&name, Instant::now());
    if deployed || locked {
        return Ok(());
    }
    let api: Api<MachineConfigurationVersion> = Api::all(ctx.client.clone());
    let patch = json!({"status": {"deployed": true}});
    expecting(
        &ctx.expectations,
        Expectation::LockedVersion(name.clone()),
        api.patch_status(&name, &PatchParams::default(), &Patch::Merge(patch)),
    )
    .await
    .map_err(kube_err(format!(
        "locking MachineConfigurationVersion {name}"
    )))?;
    let note = format!(
        "{} version {} is deployed (now immutable): Machine {} is provisioned with it",
        configuration.name,
        configuration.version,
        machine.name_any()
    );
    ctx.event(
        machine,
        EventType::Normal,
        reasons::VERSION_LOCKED,
        note.clone(),
    )
    .await;
    if let Some(mc) = ctx.configurations.get(&ObjectRef::new(&configuration.name)) {
        ctx.event(
            mc.as_ref(),
            EventType::Normal,
            reasons::VERSION_LOCKED,
            note,
        )
        .await;
    }
    Ok(())
}
