//! Carries out an `applyConfiguration` operation's step ([`super::decide_step`]): creates
//! the rolling update's operations and the agent's `applyFiles` child, patches the Node,
//! records the version on the Machine, and writes the operation's status.

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::runtime::reflector::ObjectRef;
use kube::{Resource, ResourceExt};
use serde_json::json;
use unbounded_api::condition::now;
use unbounded_api::in_place::{AgentApply, ApplyPlan, taints_after};
use unbounded_api::well_known::{annotations, field_managers, operations};
use unbounded_api::{Machine, MachineOperation, OperationState, ResolvedConfiguration};

use super::{
    APPLIED_IN_PLACE, AgentPart, ApplyFacts, ApplyStep, REPAVE_REQUIRED, agent_operation_name,
    applied_summary, decide_step, parameters, rollout_operation_name,
};
use crate::context::Context;
use crate::error::{Error, kube_err};
use crate::members::{resolve_target, resolved};

/// Creates the rolling update's `applyConfiguration` operation for a Machine unless it
/// exists.
pub async fn create_rollout_operation(
    machine: &str,
    target: &ResolvedConfiguration,
    ctx: &Context,
) -> Result<bool, Error> {
    let name = rollout_operation_name(machine, target.version);
    let object: MachineOperation = serde_json::from_value(json!({
        "apiVersion": MachineOperation::api_version(&()),
        "kind": MachineOperation::kind(&()),
        "metadata": {"name": name, "labels": {unbounded_api::well_known::labels::MACHINE: machine}},
        "spec": {"machineRef": {"name": machine}, "operationName": operations::APPLY_CONFIGURATION,
                 "parameters": {operations::VERSION_PARAMETER: target.version.to_string()},
                 "ttlSecondsAfterFinished": 3600},
    }))
    .map_err(|source| Error::Serialize {
        what: format!("MachineOperation {name}"),
        source,
    })?;
    let api: Api<MachineOperation> = Api::all(ctx.client.clone());
    match api.create(&kube::api::PostParams::default(), &object).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
        Err(e) => Err(kube_err(format!("creating MachineOperation {name}"))(e)),
    }
}

/// Runs (or resumes) one `applyConfiguration` operation on its Machine.
pub async fn run(
    operation: &MachineOperation,
    machine: Option<&Machine>,
    ctx: &Context,
) -> Result<Action, Error> {
    let Some(machine) = machine else {
        return finish(
            operation,
            OperationState::Failed,
            "the Machine does not exist".into(),
            ctx,
        )
        .await;
    };
    let machine_name = machine.name_any();
    let status = machine.status.clone().unwrap_or_default();
    let target = resolved(&resolve_target(
        ctx,
        machine.labels(),
        machine.spec.configuration_ref.as_ref(),
    ));
    let template = |c: Option<&ResolvedConfiguration>| {
        c.and_then(|c| ctx.versions.get(&ObjectRef::new(&c.version_name())))
            .map(|v| v.spec.template.clone())
    };
    let recorded_template = template(status.configuration.as_ref());
    let target_template = template(target.as_ref());
    let node = crate::machine::find_node(machine, ctx);
    let annotations = machine.annotations();
    let child_name = agent_operation_name(&operation.name_any());
    let child = ctx
        .operations
        .get(&ObjectRef::new(&child_name))
        .filter(|c| {
            c.metadata
                .owner_references
                .iter()
                .flatten()
                .any(|r| Some(r.uid.as_str()) == operation.metadata.uid.as_deref())
        });
    let child_status = child
        .as_ref()
        .and_then(|c| c.status.clone())
        .unwrap_or_default();
    let child_message = child_status.message.as_deref().unwrap_or("not started yet");
    let agent = match (&child, child_status.state) {
        (None, _) => AgentPart::Absent,
        (Some(_), Some(OperationState::Complete)) => AgentPart::Complete(child_message),
        (Some(_), Some(OperationState::Failed)) => AgentPart::Failed(child_message),
        (Some(_), _) => AgentPart::Running(child_message),
    };
    let step = decide_step(&ApplyFacts {
        parameters: parameters(&operation.spec.parameters),
        machine: &machine_name,
        recorded: status.configuration.as_ref(),
        target: target.as_ref(),
        recorded_template: recorded_template.as_ref(),
        target_template: target_template.as_ref(),
        has_node: node.is_some(),
        repaving: annotations.contains_key(annotations::REPAVE)
            || annotations.contains_key(annotations::REPAVING),
        phase: status.phase,
        agent,
    });
    tracing::debug!(operation = %operation.name_any(), ?step, "applyConfiguration");
    match step {
        ApplyStep::Fail(message) => {
            ctx.event(
                machine,
                EventType::Warning,
                REPAVE_REQUIRED,
                message.clone(),
            )
            .await;
            finish(operation, OperationState::Failed, message, ctx).await
        }
        ApplyStep::Complete(message) => {
            finish(operation, OperationState::Complete, message, ctx).await
        }
        ApplyStep::Wait(message) => {
            progress(operation, message, ctx).await?;
            Ok(Action::requeue(std::time::Duration::from_secs(2)))
        }
        ApplyStep::RequestRepave { why } => {
            crate::repave::request(
                ctx,
                format!("operation/{}", operation.name_any()),
                &machine_name,
                None,
                now(),
            )
            .await?;
            ctx.event(
                machine,
                EventType::Normal,
                REPAVE_REQUIRED,
                format!(
                    "{why}; repave requested by operation {}",
                    operation.name_any()
                ),
            )
            .await;
            progress(operation, format!("{why}: repaving"), ctx).await?;
            Ok(Action::requeue(std::time::Duration::from_secs(2)))
        }
        ApplyStep::StartAgent { apply, summary } => {
            create_agent_operation(operation, &child_name, &machine_name, &apply, ctx).await?;
            progress(
                operation,
                format!(
                    "applying {} version {} in place: the agent of Machine {machine_name} is to {summary} (operation {child_name})",
                    apply.configuration, apply.version
                ),
                ctx,
            )
            .await?;
            Ok(Action::requeue(std::time::Duration::from_secs(2)))
        }
        ApplyStep::ApplyInPlace {
            plan,
            target,
            agent,
        } => {
            // Claimed first (InProgress), so that the outcome is written over the claim.
            let claimed = progress(
                operation,
                format!(
                    "applying {} version {} in place",
                    target.name, target.version
                ),
                ctx,
            )
            .await?;
            if let Some(node) = node.as_deref() {
                patch_node(node, &plan, ctx).await?;
            }
            record(machine, &target, ctx).await?;
            let message = format!(
                "applied {} version {} in place ({}{})",
                target.name,
                target.version,
                applied_summary(&plan),
                agent
                    .map(|m| format!("; the agent: {m}"))
                    .unwrap_or_default()
            );
            ctx.event(
                machine,
                EventType::Normal,
                APPLIED_IN_PLACE,
                message.clone(),
            )
            .await;
            let operation = claimed.as_ref().unwrap_or(operation);
            finish(operation, OperationState::Complete, message, ctx).await
        }
    }
}

/// Creates the `applyFiles` child for the agent (owned by `operation`, so that it goes
/// with it; labelled with the Machine, so that the agent's watch sees it), unless it exists.
async fn create_agent_operation(
    operation: &MachineOperation,
    name: &str,
    machine: &str,
    apply: &AgentApply,
    ctx: &Context,
) -> Result<(), Error> {
    let owner = operation.controller_owner_ref(&()).ok_or_else(|| {
        Error::Waiting(format!(
            "MachineOperation {} has no UID yet",
            operation.name_any()
        ))
    })?;
    let object: MachineOperation = serde_json::from_value(json!({
        "apiVersion": MachineOperation::api_version(&()),
        "kind": MachineOperation::kind(&()),
        "metadata": {"name": name, "labels": {unbounded_api::well_known::labels::MACHINE: machine},
                     "ownerReferences": [owner]},
        "spec": {"machineRef": {"name": machine}, "operationName": operations::APPLY_FILES,
                 "parameters": apply.to_parameters(),
                 "activeDeadlineSeconds": operation.spec.active_deadline_seconds()},
    }))
    .map_err(|source| Error::Serialize {
        what: format!("MachineOperation {name}"),
        source,
    })?;
    let api: Api<MachineOperation> = Api::all(ctx.client.clone());
    match api.create(&kube::api::PostParams::default(), &object).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
        Err(e) => Err(kube_err(format!("creating MachineOperation {name}"))(e)),
    }
}

/// Patches the Node's labels and taints, over the Node as read (a taint list written
/// meanwhile by someone else is not overwritten: the write fails and is retried).
async fn patch_node(node: &Node, plan: &ApplyPlan, ctx: &Context) -> Result<(), Error> {
    let mut patch = json!({"metadata": {"resourceVersion": node.resource_version()}});
    if let Some(labels) = &plan.labels {
        let mut map = serde_json::Map::new();
        for (k, v) in &labels.set {
            map.insert(k.clone(), json!(v));
        }
        for k in &labels.remove {
            map.insert(k.clone(), serde_json::Value::Null);
        }
        patch["metadata"]["labels"] = serde_json::Value::Object(map);
    }
    let name = node.name_any();
    let api: Api<Node> = Api::all(ctx.client.clone());
    if let Some(change) = &plan.taints {
        // The cache keeps no taints (watches::trim_node): read the Node's own, and write over
        // that read, so that taints others set are kept.
        let fresh = api
            .get(&name)
            .await
            .map_err(kube_err(format!("reading Node {name}")))?;
        patch["metadata"]["resourceVersion"] = json!(fresh.resource_version());
        let current = fresh
            .spec
            .as_ref()
            .and_then(|s| s.taints.clone())
            .unwrap_or_default();
        patch["spec"] = json!({"taints": taints_after(&current, change)});
    }
    match api
        .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 409 => {
            Err(Error::Waiting(format!("Node {name} changed meanwhile")))
        }
        Err(e) => Err(kube_err(format!("patching Node {name}"))(e)),
    }
}

/// Records the version on the Machine, over the Machine as read.
async fn record(
    machine: &Machine,
    target: &ResolvedConfiguration,
    ctx: &Context,
) -> Result<(), Error> {
    let name = machine.name_any();
    let patch = json!({
        "metadata": {"resourceVersion": machine.resource_version()},
        "status": {"configuration": target},
    });
    let api: Api<Machine> = Api::all(ctx.client.clone());
    match api
        .patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 409 => {
            Err(Error::Waiting(format!("Machine {name} changed meanwhile")))
        }
        Err(e) => Err(kube_err(format!("recording the version of Machine {name}"))(e)),
    }
}

/// Marks the operation InProgress with the message; returns it as written (none when
/// nothing changed).
async fn progress(
    operation: &MachineOperation,
    message: String,
    ctx: &Context,
) -> Result<Option<MachineOperation>, Error> {
    let status = operation.status.clone().unwrap_or_default();
    if status.state == Some(OperationState::InProgress)
        && status.message.as_deref() == Some(&message)
    {
        return Ok(None);
    }
    let start = status.start_time.unwrap_or(Time(now()));
    crate::operation_status::write_status(
        operation,
        json!({"state": OperationState::InProgress, "message": message, "startTime": start,
               "handler": field_managers::CONTROLLER}),
        ctx,
    )
    .await
    .map(Some)
}

async fn finish(
    operation: &MachineOperation,
    state: OperationState,
    message: String,
    ctx: &Context,
) -> Result<Action, Error> {
    let status = operation.status.clone().unwrap_or_default();
    let start = status.start_time.unwrap_or(Time(now()));
    crate::operation_status::write_status(
        operation,
        json!({"state": state, "message": message, "startTime": start,
               "completionTime": Time(now()), "handler": field_managers::CONTROLLER}),
        ctx,
    )
    .await?;
    // Requeue for the TTL.
    Ok(Action::requeue(std::time::Duration::from_secs(1)))
}
