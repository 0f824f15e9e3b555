//! What a repave does, carried out: an owner's request (with its expectation), the
//! Machine reconciler's drain and delete of the recorded Node, the follow-up operation, the
//! annotations when it is done, and the events that say so. The decisions are in the
//! parent module.

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::events::EventType;
use kube::{Resource, ResourceExt};
use serde_json::json;
use unbounded_api::condition;
use unbounded_api::well_known::{
    annotations, conditions, field_managers, labels, operations, reasons,
};
use unbounded_api::{
    Machine, MachineOperation, MachinePhase, MachineStatus, OperationState, ResolvedConfiguration,
};

use super::{
    RepaveRequest, RepaveStep, RequestState, follow_up_name, format_time, next_step, read_request,
    request_patch,
};
use crate::context::Context;
use crate::drain;
use crate::error::{Error, kube_err};
use crate::expectations::{Expectation, MemberChange, expecting};
use unbounded_runtime::release::{ReleaseStep, WipeTimeouts, decide_release, facts_of};

/// Requests a repave of `machine` for its owner (a rolling configuration's or a pool's
/// expectations key, [`crate::expectations`]): a merge patch of its annotations, expected
/// until the Machine watch shows it.
pub async fn request(
    ctx: &Context,
    owner: String,
    machine: &str,
    then: Option<&str>,
    now: Timestamp,
) -> Result<(), Error> {
    let expectation = Expectation::Member {
        owner,
        machine: machine.to_owned(),
        change: MemberChange::RepaveRequested(format_time(now)),
    };
    let api: Api<Machine> = Api::all(ctx.client.clone());
    let patch = request_patch(now, then);
    let write = async {
        api.patch(machine, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(kube_err(format!(
                "requesting a repave of Machine {machine}"
            )))
    };
    expecting(&ctx.expectations, expectation, write).await?;
    Ok(())
}

/// The Machine's repave request, if it carries a valid one; an invalid one is reported as
/// a Warning event and not acted on.
pub async fn requested(machine: &Machine, ctx: &Context) -> Option<RepaveRequest> {
    match read_request(machine.annotations()) {
        RequestState::Requested(request) => Some(request),
        RequestState::Invalid(why) => {
            ctx.event(
                machine,
                EventType::Warning,
                reasons::INVALID_REPAVE_REQUEST,
                why,
            )
            .await;
            None
        }
        RequestState::None => None,
    }
}

/// After the Machine's status is written: finishes its request, or removes the
/// `repaving` mark once it is Running again.
pub async fn settle(
    machine: &Machine,
    request: Option<&RepaveRequest>,
    phase: MachinePhase,
    ctx: &Context,
) -> Result<(), Error> {
    if let Some(request) = request {
        finish(machine, request, ctx).await
    } else if phase == MachinePhase::Running
        && machine.annotations().contains_key(annotations::REPAVING)
    {
        clear_repaving(machine, ctx).await
    } else {
        Ok(())
    }
}

/// Says on the Machine that its Node was deleted and what it repaves with.
pub async fn announce(
    machine: &Machine,
    node_name: &str,
    configuration: Option<&ResolvedConfiguration>,
    ctx: &Context,
) {
    let note = match configuration {
        Some(c) => format!(
            "Node {node_name} was deleted; repaving with {} version {}",
            c.name, c.version
        ),
        None => {
            format!("Node {node_name} was deleted; waiting for a configuration to repave with")
        }
    };
    ctx.event(machine, EventType::Normal, reasons::REPAVE, note)
        .await;
}

/// Carries out the request's last step: the follow-up operation, then the annotations
/// (`repave` and `repave-then` gone, `repaving` set, except after a `powerOff`: a Machine
/// switched off is not coming back by itself).
async fn finish(machine: &Machine, request: &RepaveRequest, ctx: &Context) -> Result<(), Error> {
    let name = machine.name_any();
    if let Some(operation) = &request.then {
        create_follow_up(machine, operation, request, ctx).await?;
    }
    let api: Api<Machine> = Api::all(ctx.client.clone());
    let powering_off =
        request.then.as_deref() == Some(unbounded_api::well_known::operations::POWER_OFF);
    // A release's marks go with it, a person's skip of its wipe too: the next release of
    // this hardware wipes again.
    let releasing = machine.annotations().contains_key(annotations::RELEASE);
    let mut marks = json!({
        annotations::REPAVE: null,
        annotations::REPAVE_THEN: null,
        annotations::REPAVING: (!powering_off).then_some(&request.value),
    });
    if releasing {
        for key in [
            annotations::RELEASE,
            annotations::RELEASE_WIPE,
            annotations::RELEASE_WITHOUT_WIPE,
        ] {
            marks[key] = serde_json::Value::Null;
        }
    }
    let patch = json!({"metadata": {"annotations": marks}});
    api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(kube_err(format!("finishing the repave of Machine {name}")))?;
    Ok(())
}

/// Removes the `repaving` mark of a Machine that is Running again.
async fn clear_repaving(machine: &Machine, ctx: &Context) -> Result<(), Error> {
    let name = machine.name_any();
    let api: Api<Machine> = Api::all(ctx.client.clone());
    let patch = json!({"metadata": {"annotations": {annotations::REPAVING: null}}});
    api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(kube_err(format!(
            "clearing the repaving mark of Machine {name}"
        )))?;
    Ok(())
}

/// Creates the follow-up operation if it does not exist yet and returns its state (`None`
/// while no handler has taken it).
async fn follow_up_state(
    machine: &Machine,
    operation: &str,
    request: &RepaveRequest,
    ctx: &Context,
) -> Result<Option<unbounded_api::OperationState>, Error> {
    create_follow_up(machine, operation, request, ctx).await?;
    let name = follow_up_name(&machine.name_any(), operation, request);
    let api: Api<MachineOperation> = Api::all(ctx.client.clone());
    let found = api
        .get_opt(&name)
        .await
        .map_err(kube_err(format!("reading MachineOperation {name}")))?;
    Ok(found.and_then(|o| o.status).and_then(|s| s.state))
}

async fn create_follow_up(
    machine: &Machine,
    operation: &str,
    request: &RepaveRequest,
    ctx: &Context,
) -> Result<(), Error> {
    let machine_name = machine.name_any();
    let name = follow_up_name(&machine_name, operation, request);
    let object: MachineOperation = serde_json::from_value(json!({
        "apiVersion": MachineOperation::api_version(&()),
        "kind": MachineOperation::kind(&()),
        "metadata": {"name": name, "labels": {labels::MACHINE: machine_name}},
        "spec": {"machineRef": {"name": machine_name}, "operationName": operation, "ttlSecondsAfterFinished": 86400},
    }))
    .map_err(|source| Error::Serialize {
        what: format!("MachineOperation {name}"),
        source,
    })?;
    let api: Api<MachineOperation> = Api::all(ctx.client.clone());
    match api.create(&PostParams::default(), &object).await {
        Ok(_) => {
            ctx.event(
                machine,
                EventType::Normal,
                reasons::REPAVE_REQUESTED,
                format!("Node deleted; created MachineOperation {name} ({operation})"),
            )
            .await;
            Ok(())
        }
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
        Err(e) => Err(kube_err(format!("creating MachineOperation {name}"))(e)),
    }
}

/// The gate of a pool's release, once the Node is drained: asks the agent to wipe
/// (`unbounded-cloud.io/release-wipe`, the release's time) and lets the power-off go only
/// once the wipe is reported for this release, or none is needed, or a person said to skip
/// it — the decision of a deletion (`unbounded_runtime::release`), under the releasing
/// tenant's policy (the version the agent paved). Until then an `Error::Waiting`, with the
/// `DisksWiped` condition (its own field manager) and, when held, a Warning Event.
async fn wipe_before_release(
    machine: &Machine,
    status: &MachineStatus,
    release: &str,
    ctx: &Context,
) -> Result<(), Error> {
    let name = machine.name_any();
    let api: Api<Machine> = Api::all(ctx.client.clone());
    if machine
        .annotations()
        .get(annotations::RELEASE_WIPE)
        .map(String::as_str)
        != Some(release)
    {
        let patch = json!({"metadata": {"annotations": {annotations::RELEASE_WIPE: release}}});
        api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(kube_err(format!(
                "asking the agent of Machine {name} to wipe"
            )))?;
        return Err(Error::Waiting(format!(
            "asked the agent of {name} to wipe its disks before the release's power-off"
        )));
    }
    let now = condition::now();
    let mut facts = facts_of(
        machine,
        crate::machine::configured_for(machine, ctx),
        now,
        WipeTimeouts::default(),
    );
    // A condition left False by an earlier release does not start this one's clock.
    let requested: Option<Timestamp> = release.parse().ok();
    facts.waiting_since = facts
        .waiting_since
        .filter(|since| requested.is_none_or(|r| *since >= r));
    let step = decide_release(&facts);
    let current = condition::find(&status.conditions, conditions::DISKS_WIPED);
    let mut wanted = condition::new_condition(
        conditions::DISKS_WIPED,
        step.condition_status(),
        step.reason(),
        step.message(),
        None,
    );
    // The transition time stays while the status does, within this release.
    let of_this_release = |c: &Condition| requested.is_none_or(|r| c.last_transition_time.0 >= r);
    if let Some(current) = current
        && current.status == wanted.status
        && of_this_release(current)
    {
        wanted.last_transition_time = current.last_transition_time.clone();
    }
    let unchanged = current.is_some_and(|c| {
        condition::same_meaning(c, &wanted) && c.last_transition_time == wanted.last_transition_time
    });
    // A release that needs no wipe and never waited writes nothing.
    let quiet = current.is_none() && matches!(step, ReleaseStep::PowerOff { .. });
    if !unchanged && !quiet {
        if let ReleaseStep::Hold { reason, message } = &step {
            ctx.event(machine, EventType::Warning, reason, message.clone())
                .await;
        }
        let body = json!({
            "apiVersion": Machine::api_version(&()),
            "kind": Machine::kind(&()),
            "status": {"conditions": [wanted]},
        });
        api.patch_status(
            &name,
            &PatchParams::apply(field_managers::CONTROLLER_RELEASE).force(),
            &Patch::Apply(&body),
        )
        .await
        .map_err(kube_err(format!(
            "writing the DisksWiped condition of Machine {name}"
        )))?;
    }
    match step {
        ReleaseStep::PowerOff { .. } => Ok(()),
        ReleaseStep::Wait { message } | ReleaseStep::Hold { message, .. } => {
            Err(Error::Waiting(format!("release of {name}: {message}")))
        }
    }
}

/// Drains and deletes the Machine's recorded Node for a repave request;
/// returns whether it deleted it. Waits (an error the runner retries soon) while pods
/// remain, until the drain timeout has passed since the request.
pub async fn drain_and_delete(
    machine: &Machine,
    status: &MachineStatus,
    request: &RepaveRequest,
    node: Option<&Node>,
    ctx: &Context,
) -> Result<bool, Error> {
    let recorded_uid = status.node_ref.as_ref().and_then(|n| n.uid.as_deref());
    let observed = node.map(|n| {
        (
            n.metadata.name.as_deref().unwrap_or_default(),
            n.metadata.uid.as_deref(),
        )
    });
    let step = next_step(
        request,
        recorded_uid,
        observed,
        ctx.settings.drain_timeout,
        condition::now(),
    );
    let RepaveStep::DrainAndDelete {
        node: node_name,
        timed_out,
    } = step
    else {
        return Ok(false);
    };
    let outcome = drain::drain(&ctx.client, &node_name).await?;
    if outcome.remaining > 0 && !timed_out {
        ctx.event(
            machine,
            EventType::Normal,
            reasons::DRAINING,
            format!(
                "repave requested at {}: draining Node {node_name}, {} pod(s) left",
                request.value, outcome.remaining
            ),
        )
        .await;
        return Err(Error::Waiting(format!(
            "Node {node_name} still has {} pod(s) to evict before its repave",
            outcome.remaining
        )));
    }
    if outcome.remaining > 0 {
        ctx.event(
            machine,
            EventType::Warning,
            reasons::DRAINING,
            format!(
                "drain timeout ({} s) passed with {} pod(s) left on Node {node_name}; deleting it for the repave anyway",
                ctx.settings.drain_timeout.as_secs(),
                outcome.remaining
            ),
        )
        .await;
    }
    if request.then.as_deref() == Some(operations::POWER_OFF) {
        if let Some(release) = machine.annotations().get(annotations::RELEASE) {
            wipe_before_release(machine, status, release, ctx).await?;
        }
        match follow_up_state(machine, operations::POWER_OFF, request, ctx).await? {
            Some(OperationState::Complete) => {}
            Some(OperationState::Failed) => {
                ctx.event(
                    machine,
                    EventType::Warning,
                    reasons::REPAVE_REQUESTED,
                    format!("powerOff failed; deleting Node {node_name} anyway (its kubelet may register it again)"),
                )
                .await;
            }
            _ => {
                return Err(Error::Waiting(format!(
                    "powering {} off before deleting Node {node_name}",
                    machine.name_any()
                )));
            }
        }
    }
    match recorded_uid {
        Some(uid) => {
            expecting(
                &ctx.expectations,
                Expectation::DeletedNode(uid.to_owned()),
                drain::delete_node(&ctx.client, &node_name),
            )
            .await?;
        }
        None => drain::delete_node(&ctx.client, &node_name).await?,
    }
    ctx.event(
        machine,
        EventType::Normal,
        reasons::REPAVE_REQUESTED,
        format!(
            "drained and deleted Node {node_name} for the repave requested at {}",
            request.value
        ),
    )
    .await;
    Ok(true)
}
