//! The Machine reconciler: records the resolved configuration version (locking it), the
//! Node, the conditions and the phase; annotates the Node; drains and deletes the Node when
//! the Machine is deleted; for a `manual` Machine (no provider holds it) waits for the wipe
//! of its disks before letting go.

mod node;
mod release;
pub mod status;
mod version;

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::api::Api;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::runtime::finalizer::{Event as FinalizerEvent, finalizer};
use kube::{Resource, ResourceExt};
use unbounded_api::condition;
use unbounded_api::well_known::{conditions, finalizers, reasons};
use unbounded_api::{Machine, MachineProvider};

use crate::context::Context;
use crate::drain;
use crate::error::Error;
use crate::index::catalog::OwnedCandidate;
use crate::lifecycle::{ConditionPlan, MachineFacts, ObservedNode, plan_machine};
use crate::repave;
use crate::selection::{self, Resolution};
use crate::skew;
pub use node::find_node;
use node::{annotate_node, node_is_ready};
pub(crate) use release::configured_for;
use release::release_disks;
use status::{StatusPlan, discovered_plan, write_status};
use version::{kubernetes_version, lock_version, refuse_skewed};

/// Reconciles one Machine.
#[tracing::instrument(skip_all, fields(machine = %machine.name_any()))]
pub async fn reconcile(machine: Arc<Machine>, ctx: Arc<Context>) -> Result<Action, Error> {
    let _timer = ctx.metrics.reconcile_timer("machine");
    let api: Api<Machine> = Api::all(ctx.client.clone());
    finalizer(&api, finalizers::MACHINE, machine, |event| async {
        match event {
            FinalizerEvent::Apply(machine) => apply(&machine, &ctx).await,
            FinalizerEvent::Cleanup(machine) => cleanup(&machine, &ctx).await,
        }
    })
    .await
    .map_err(|e| Error::Finalizer(Box::new(e)))
}

async fn apply(machine: &Machine, ctx: &Context) -> Result<Action, Error> {
    let name = machine.name_any();
    let status = machine.status.clone().unwrap_or_default();
    let owned = ctx.catalog.read().candidates_for(
        machine.labels(),
        machine
            .spec
            .configuration_ref
            .as_ref()
            .map(|r| r.name.as_str()),
    );
    let candidates: Vec<_> = owned.iter().map(OwnedCandidate::borrowed).collect();
    let resolution = selection::resolve(
        machine.labels(),
        machine.spec.configuration_ref.as_ref(),
        &candidates,
    );
    let mut node = find_node(machine, ctx);
    let node_name = machine.node_name();
    let request = repave::requested(machine, ctx).await;
    if let Some(request) = &request
        && repave::drain_and_delete(machine, &status, request, node.as_deref(), ctx).await?
    {
        node = None;
    }

    let mut plan = plan_machine(&MachineFacts {
        deleting: false,
        failed: status.failure_reason.is_some(),
        recorded: status.configuration.as_ref(),
        recorded_node: status.node_ref.as_ref(),
        resolution: &resolution,
        node: node.as_ref().map(|n| ObservedNode {
            name: n.name_any(),
            uid: n.metadata.uid.clone(),
            ready: node_is_ready(n),
        }),
        infrastructure_ready: condition::is_true(
            &status.conditions,
            conditions::INFRASTRUCTURE_READY,
        ),
        node_name: &node_name,
        repave_requested: request.is_some(),
    });

    // A version whose kubelet the API server's skew policy refuses is never recorded, so
    // nothing is paved with it.
    if plan.configuration.is_some() && plan.configuration != status.configuration {
        refuse_skewed(&mut plan, &status, ctx).await?;
    }
    let kubelet_version = node
        .as_ref()
        .and_then(|n| n.status.as_ref())
        .and_then(|s| s.node_info.as_ref())
        .map(|i| i.kubelet_version.clone())
        .filter(|v| !v.is_empty());
    let kubelet_plan = skew::kubelet_condition(
        kubernetes_version(plan.configuration.as_ref(), ctx).as_deref(),
        kubelet_version.as_deref(),
    )
    .map(|(ok, reason, message)| ConditionPlan {
        type_: skew::KUBELET_VERSION_CONDITION,
        status: ok,
        reason,
        message,
    });
    let discovered_plan = discovered_plan(machine, &status);

    // Lock first, then record: a Machine must never run a version that can still change.
    if let Some(configuration) = &plan.configuration {
        lock_version(configuration, machine, ctx).await?;
    }
    if let (Some(node), Some(configuration)) = (&node, &plan.configuration) {
        annotate_node(node, configuration, machine, ctx).await?;
    }

    write_status(
        machine,
        StatusPlan {
            phase: plan.phase,
            configuration: plan.configuration.clone(),
            node_ref: plan.node_ref.clone(),
            kubelet_version,
            conditions: [&plan.configuration_condition, &plan.node_condition]
                .into_iter()
                .chain(kubelet_plan.as_ref())
                .chain(discovered_plan.as_ref())
                .collect(),
        },
        ctx,
    )
    .await?;

    repave::settle(machine, request.as_ref(), plan.phase, ctx).await?;
    if plan.repave {
        repave::announce(machine, &node_name, plan.configuration.as_ref(), ctx).await;
    }
    if let Some(c) = &plan.configuration
        && plan.configuration != status.configuration
        && !plan.repave
    {
        ctx.event(
            machine,
            EventType::Normal,
            reasons::CONFIGURATION_RESOLVED,
            format!("resolved {} version {}", c.name, c.version),
        )
        .await;
    }
    if plan.configuration.is_none()
        && !condition_matches(&status.conditions, &plan.configuration_condition)
    {
        let type_ = if plan.configuration_condition.reason == reasons::CONFIGURATION_PENDING {
            EventType::Normal
        } else {
            EventType::Warning
        };
        ctx.event(
            machine,
            type_,
            plan.configuration_condition.reason,
            plan.configuration_condition.message.clone(),
        )
        .await;
    }
    tracing::debug!(machine = %name, phase = plan.phase.as_str(), "reconciled");

    Ok(match resolution {
        Resolution::AwaitingFirstVersion { .. } => Action::requeue(Duration::from_secs(2)),
        _ => Action::requeue(ctx.settings.resync),
    })
}

fn condition_matches(current: &[Condition], plan: &ConditionPlan) -> bool {
    condition::find(current, plan.type_).is_some_and(|c| {
        c.status == if plan.status { "True" } else { "False" }
            && c.reason == plan.reason
            && c.message == plan.message
    })
}

/// Deletion: drain and delete the Node, then wait until every provider has released the
/// infrastructure (removed its own finalizer). Every step is idempotent.
async fn cleanup(machine: &Machine, ctx: &Context) -> Result<Action, Error> {
    let status = machine.status.clone().unwrap_or_default();
    let node_name = machine.node_name();
    let discovered = discovered_plan(machine, &status);
    write_status(
        machine,
        StatusPlan::deleting(&status, discovered.iter().collect()),
        ctx,
    )
    .await?;

    if let Some(node) = find_node(machine, ctx) {
        let deadline_passed = machine.meta().deletion_timestamp.as_ref().is_some_and(|t| {
            let elapsed = condition::now().duration_since(t.0);
            elapsed.as_secs_f64() > ctx.settings.drain_timeout.as_secs_f64()
        });
        let outcome = drain::drain(&ctx.client, &node.name_any()).await?;
        if outcome.remaining > 0 && !deadline_passed {
            ctx.event(
                machine,
                EventType::Normal,
                reasons::DRAINING,
                format!(
                    "draining Node {}: {} pod(s) left",
                    node.name_any(),
                    outcome.remaining
                ),
            )
            .await;
            return Err(Error::Waiting(format!(
                "Node {} still has {} pod(s) to evict",
                node.name_any(),
                outcome.remaining
            )));
        }
        if outcome.remaining > 0 {
            ctx.event(
                machine,
                EventType::Warning,
                reasons::DRAINING,
                format!(
                    "drain timeout ({} s) passed with {} pod(s) left on Node {}; deleting it anyway",
                    ctx.settings.drain_timeout.as_secs(),
                    outcome.remaining,
                    node.name_any()
                ),
            )
            .await;
        }
        drain::delete_node(&ctx.client, &node.name_any()).await?;
        ctx.event(
            machine,
            EventType::Normal,
            "NodeDeleted",
            format!("deleted Node {}", node.name_any()),
        )
        .await;
    } else {
        tracing::debug!(node = %node_name, "no Node to drain");
    }

    let waiting_for: Vec<&str> = machine
        .finalizers()
        .iter()
        .filter_map(|f| {
            finalizers::PROVIDERS
                .iter()
                .find(|p| **p == f.as_str())
                .copied()
        })
        .collect();
    if !waiting_for.is_empty() {
        let why = format!(
            "waiting for the provider to release the infrastructure ({})",
            waiting_for.join(", ")
        );
        // Why a Machine stays Deleting, where a person looks (one series, not one event
        // per retry).
        ctx.event(
            machine,
            EventType::Normal,
            reasons::WAITING_FOR_PROVIDER,
            why.clone(),
        )
        .await;
        return Err(Error::Waiting(why));
    }
    // A `manual` Machine has no provider loop to hold it while its disks are wiped: the
    // controller does, with the same decision (`unbounded_runtime::release`).
    if machine.spec.provider == MachineProvider::Manual {
        release_disks(machine, &status, ctx).await?;
    }
    Ok(Action::await_change())
}
