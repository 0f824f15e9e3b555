//! The MachineOperation reconciler: labels single-machine operations with their Machine,
//! routes each to its handler when its turn comes, fails what nobody can or did run, fans
//! selector operations out into children and aggregates their states, and deletes finished
//! operations after their TTL. The decisions are [`crate::dispatch`]'s.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{OwnerReference, Time};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::runtime::reflector::ObjectRef;
use kube::{Resource, ResourceExt};
use serde_json::json;
use unbounded_api::condition::now;
use unbounded_api::well_known::{labels, reasons};
use unbounded_api::{Machine, MachineOperation, MachineOperationSpec, MachineRef, OperationState};

use crate::context::Context;
use crate::dispatch::{
    Child, Clock, ParentFacts, ParentPlan, SingleFacts, SinglePlan, TargetMachine, child_name,
    plan_parent, plan_single,
};
use crate::error::{Error, kube_err};
use crate::operation_status::write_status;

/// Reconciles one MachineOperation.
#[tracing::instrument(skip_all, fields(operation = %operation.name_any()))]
pub async fn reconcile(
    operation: Arc<MachineOperation>,
    ctx: Arc<Context>,
) -> Result<Action, Error> {
    let _timer = ctx.metrics.reconcile_timer("operation");
    if operation.metadata.deletion_timestamp.is_some() {
        Ok(Action::await_change())
    } else if operation.spec.machine_selector.is_some() {
        reconcile_parent(&operation, &ctx).await
    } else {
        reconcile_single(&operation, &ctx).await
    }
}

fn clock(operation: &MachineOperation) -> Clock {
    let status = operation.status.as_ref();
    let now = now();
    Clock {
        now,
        created: operation
            .metadata
            .creation_timestamp
            .as_ref()
            .map_or(now, |t| t.0),
        state: status.and_then(|s| s.state),
        completed: status.and_then(|s| s.completion_time.as_ref()).map(|t| t.0),
        ttl_seconds: operation.spec.ttl_seconds_after_finished,
    }
}

/// Creation order of operations: creation time, then name (creation times have only
/// second resolution).
fn creation_key(operation: &MachineOperation) -> (i64, String) {
    (
        operation
            .metadata
            .creation_timestamp
            .as_ref()
            .map_or(i64::MAX, |t| t.0.as_second()),
        operation.name_any(),
    )
}

/// The earliest unfinished operation on the same Machine created before this one.
fn blocked_by(operation: &MachineOperation, machine: &str, ctx: &Context) -> Option<String> {
    let own = creation_key(operation);
    let on_machine = ctx.operation_index.read().on_machine(machine);
    on_machine
        .iter()
        .filter_map(|name| ctx.operations.get(&ObjectRef::new(name)))
        .filter(|o| {
            o.spec
                .machine_ref
                .as_ref()
                .is_some_and(|r| r.name == machine)
                && o.metadata.deletion_timestamp.is_none()
                && !o
                    .status
                    .as_ref()
                    .and_then(|s| s.state)
                    .is_some_and(OperationState::is_finished)
                && creation_key(o) < own
        })
        .min_by_key(|o| creation_key(o))
        .map(|o| o.name_any())
}

/// The single-machine operation on the same Machine that owns this one (an
/// `applyConfiguration` owns its `applyFiles`), if any. A selector operation's children are
/// owned by an operation without a `machineRef`: not this.
fn part_of(operation: &MachineOperation, machine: &str, ctx: &Context) -> Option<String> {
    operation
        .metadata
        .owner_references
        .iter()
        .flatten()
        .filter(|r| r.kind == MachineOperation::kind(&()))
        .find_map(|r| {
            let owner = ctx.operations.get(&ObjectRef::new(&r.name))?;
            (owner.metadata.uid.as_deref() == Some(r.uid.as_str())
                && owner
                    .spec
                    .machine_ref
                    .as_ref()
                    .is_some_and(|m| m.name == machine))
            .then(|| owner.name_any())
        })
}

/// The Machine from the cache, confirmed by a read when the cache does not have it (an
/// operation created right after its Machine may arrive first).
async fn find_machine(name: &str, ctx: &Context) -> Result<Option<Arc<Machine>>, Error> {
    if let Some(m) = ctx.machines.get(&ObjectRef::new(name)) {
        return Ok(Some(m));
    }
    let api: Api<Machine> = Api::all(ctx.client.clone());
    Ok(api
        .get_opt(name)
        .await
        .map_err(kube_err(format!("reading Machine {name}")))?
        .map(Arc::new))
}

async fn reconcile_single(operation: &MachineOperation, ctx: &Context) -> Result<Action, Error> {
    let Some(machine_name) = operation.spec.machine_ref.as_ref().map(|r| r.name.as_str()) else {
        return Ok(Action::await_change());
    };
    ensure_machine_label(operation, machine_name, ctx).await?;
    let machine = find_machine(machine_name, ctx).await?;
    let status = operation.status.clone().unwrap_or_default();
    let earlier = blocked_by(operation, machine_name, ctx);
    let owner = part_of(operation, machine_name, ctx);
    let plan = plan_single(&SingleFacts {
        clock: clock(operation),
        operation_name: &operation.spec.operation_name,
        machine_name,
        machine: machine.as_ref().map(|m| TargetMachine {
            provider: m.spec.provider,
            deleting: m.metadata.deletion_timestamp.is_some(),
        }),
        deadline_seconds: operation.spec.active_deadline_seconds(),
        routed_to: status.routed_to,
        handler: status.handler.as_deref(),
        blocked_by: earlier.as_deref(),
        part_of: owner.as_deref(),
    });
    let name = operation.name_any();
    tracing::debug!(operation = %name, ?plan, "planned");
    match plan {
        SinglePlan::Wait(after) => Ok(after.map_or_else(Action::await_change, Action::requeue)),
        SinglePlan::Route {
            to,
            message,
            requeue,
        } => {
            write_status(
                operation,
                json!({"state": OperationState::Pending, "routedTo": to, "message": message}),
                ctx,
            )
            .await?;
            Ok(Action::requeue(requeue))
        }
        SinglePlan::Queue { message, requeue } => {
            if status.state != Some(OperationState::Pending)
                || status.message.as_deref() != Some(message.as_str())
            {
                write_status(
                    operation,
                    json!({"state": OperationState::Pending, "message": message}),
                    ctx,
                )
                .await?;
            }
            Ok(Action::requeue(requeue))
        }
        SinglePlan::Fail(message) => {
            write_status(
                operation,
                json!({
                    "state": OperationState::Failed,
                    "routedTo": status.routed_to,
                    "message": message,
                    "completionTime": Time(now()),
                }),
                ctx,
            )
            .await?;
            ctx.event(
                operation,
                EventType::Warning,
                reasons::OPERATION_FAILED,
                message,
            )
            .await;
            // Requeue for the TTL.
            Ok(Action::requeue(Duration::from_secs(1)))
        }
        // The run looks again within seconds while it waits, well before the deadline.
        SinglePlan::RunHere { .. } => crate::apply::run(operation, machine.as_deref(), ctx).await,
        SinglePlan::Delete => delete(operation, ctx).await,
    }
}

/// Every single-machine operation carries the Machine's label, so that an agent's watch
/// sees only its own.
async fn ensure_machine_label(
    operation: &MachineOperation,
    machine: &str,
    ctx: &Context,
) -> Result<(), Error> {
    if operation.labels().get(labels::MACHINE).map(String::as_str) == Some(machine) {
        return Ok(());
    }
    let api: Api<MachineOperation> = Api::all(ctx.client.clone());
    api.patch(
        &operation.name_any(),
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {labels::MACHINE: machine}}})),
    )
    .await
    .map_err(kube_err(format!(
        "labelling MachineOperation {}",
        operation.name_any()
    )))?;
    Ok(())
}

async fn delete(operation: &MachineOperation, ctx: &Context) -> Result<Action, Error> {
    let name = operation.name_any();
    let api: Api<MachineOperation> = Api::all(ctx.client.clone());
    // Background propagation: the garbage collector deletes a parent's children.
    match api.delete(&name, &DeleteParams::background()).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 404 => {}
        Err(source) => {
            return Err(Error::Kube {
                action: format!("deleting MachineOperation {name} after its TTL"),
                source,
            });
        }
    }
    tracing::info!(operation = %name, "deleted after ttlSecondsAfterFinished");
    Ok(Action::await_change())
}

fn is_child_of(child: &MachineOperation, parent: &MachineOperation) -> bool {
    let uid = parent.metadata.uid.as_deref();
    child
        .metadata
        .owner_references
        .as_ref()
        .is_some_and(|refs| refs.iter().any(|r| Some(r.uid.as_str()) == uid))
}

async fn reconcile_parent(operation: &MachineOperation, ctx: &Context) -> Result<Action, Error> {
    let status = operation.status.clone().unwrap_or_default();
    let child_names = operation
        .metadata
        .uid
        .as_deref()
        .map(|uid| ctx.operation_index.read().children_of(uid))
        .unwrap_or_default();
    let children: Vec<Arc<MachineOperation>> = child_names
        .iter()
        .filter_map(|name| ctx.operations.get(&ObjectRef::new(name)))
        .filter(|o| is_child_of(o, operation))
        .collect();
    let selector = operation.spec.machine_selector.as_ref();
    let mut matched: Vec<String> = {
        let index = ctx.machine_index.read();
        index
            .matching(selector)
            .into_iter()
            .filter(|name| index.get(name).is_some_and(|k| !k.deleting))
            .map(str::to_owned)
            .collect()
    };
    matched.sort_unstable();
    let plan = plan_parent(&ParentFacts {
        clock: clock(operation),
        matched: matched.iter().map(String::as_str).collect(),
        recorded_total: status.children.as_ref().map(|c| c.total),
        children: children
            .iter()
            .filter_map(|c| {
                Some(Child {
                    machine: c.spec.machine_ref.as_ref()?.name.as_str(),
                    name: c.metadata.name.as_deref()?,
                    state: c.status.as_ref().and_then(|s| s.state),
                    message: c.status.as_ref().and_then(|s| s.message.as_deref()),
                })
            })
            .collect(),
        message: status.message.as_deref(),
        counts: status.children.as_ref(),
    });
    let name = operation.name_any();
    tracing::debug!(operation = %name, ?plan, "planned");
    match plan {
        ParentPlan::Wait(after) => Ok(after.map_or_else(Action::await_change, Action::requeue)),
        ParentPlan::CreateChildren(machines) => {
            for machine in &machines {
                create_child(operation, machine, ctx).await?;
            }
            ctx.event(
                operation,
                EventType::Normal,
                reasons::FANNED_OUT,
                format!("created {} child operations", machines.len()),
            )
            .await;
            // The children's watch events bring the next reconcile; this is the safety net.
            Ok(Action::requeue(Duration::from_secs(2)))
        }
        ParentPlan::Report {
            state,
            message,
            counts,
        } => {
            let t = Time(now());
            let start_time = status
                .start_time
                .clone()
                .or_else(|| (state != OperationState::Pending).then(|| t.clone()));
            let completion_time = state.is_finished().then_some(t);
            write_status(
                operation,
                json!({
                    "state": state,
                    "message": message,
                    "children": counts,
                    "startTime": start_time,
                    "completionTime": completion_time,
                }),
                ctx,
            )
            .await?;
            if state.is_finished() {
                let type_ = if state == OperationState::Failed {
                    EventType::Warning
                } else {
                    EventType::Normal
                };
                ctx.event(operation, type_, state.as_str(), message).await;
                return Ok(Action::requeue(Duration::from_secs(1)));
            }
            Ok(Action::await_change())
        }
        ParentPlan::Delete => delete(operation, ctx).await,
    }
}

async fn create_child(
    parent: &MachineOperation,
    machine: &str,
    ctx: &Context,
) -> Result<(), Error> {
    let name = child_name(&parent.name_any(), machine);
    let mut child = MachineOperation::new(
        &name,
        MachineOperationSpec {
            machine_ref: Some(MachineRef {
                name: machine.to_owned(),
            }),
            machine_selector: None,
            operation_name: parent.spec.operation_name.clone(),
            parameters: parent.spec.parameters.clone(),
            // Children go with their parent, whose TTL counts.
            ttl_seconds_after_finished: None,
            active_deadline_seconds: parent.spec.active_deadline_seconds,
        },
    );
    child.metadata.labels = Some(
        [
            (labels::MACHINE.to_owned(), machine.to_owned()),
            (labels::PARENT_OPERATION.to_owned(), parent.name_any()),
        ]
        .into(),
    );
    child.metadata.owner_references = Some(vec![OwnerReference {
        api_version: MachineOperation::api_version(&()).into_owned(),
        kind: MachineOperation::kind(&()).into_owned(),
        name: parent.name_any(),
        uid: parent.metadata.uid.clone().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }]);
    let api: Api<MachineOperation> = Api::all(ctx.client.clone());
    match api.create(&PostParams::default(), &child).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 409 => {
            // Ours from an earlier attempt (the cache has not seen it yet), or someone
            // else's object with that name.
            let existing = api
                .get(&name)
                .await
                .map_err(kube_err(format!("reading MachineOperation {name}")))?;
            if is_child_of(&existing, parent) {
                Ok(())
            } else {
                Err(Error::Waiting(format!(
                    "MachineOperation {name} exists and is not a child of {}",
                    parent.name_any()
                )))
            }
        }
        Err(source) => Err(Error::Kube {
            action: format!("creating MachineOperation {name}"),
            source,
        }),
    }
}
