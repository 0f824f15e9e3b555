//! The Machine reconciler: records the resolved configuration version (locking it), the
//! Node, the conditions and the phase; annotates the Node; drains and deletes the Node when
//! the Machine is deleted; for a `manual` Machine (no provider holds it) waits for the wipe
//! of its disks before letting go.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::runtime::finalizer::{Event as FinalizerEvent, finalizer};
use kube::runtime::reflector::ObjectRef;
use kube::{Resource, ResourceExt};
use serde_json::json;
use unbounded_api::condition;
use unbounded_api::well_known::{annotations, conditions, field_managers, finalizers, reasons};
use unbounded_api::{
    Machine, MachineConfigurationVersion, MachinePhase, MachineProvider, ResolvedConfiguration,
};
use unbounded_runtime::release::{
    Configured, ReleaseStep, WipeTimeouts, decide_release, facts_of, wiping_version,
};

use crate::context::Context;
use crate::drain;
use crate::error::{Error, kube_err};
use crate::expectations::{Expectation, expecting};
use crate::index::catalog::OwnedCandidate;
use crate::lifecycle::{ConditionPlan, MachineFacts, ObservedNode, plan_machine};
use crate::repave;
use crate::selection::{self, Resolution};
use crate::skew;

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

/// The Node of a Machine: by name (`spec.nodeName`, default the Machine's name), else by
/// `spec.providerID`; never one this controller deleted for a repave that the watch still
/// shows.
pub fn find_node(machine: &Machine, ctx: &Context) -> Option<Arc<Node>> {
    let by_name = ctx.nodes.get(&ObjectRef::new(&machine.node_name()));
    let node = by_name.or_else(|| {
        let provider_id = machine.spec.provider_id.as_deref()?;
        let name = ctx.node_index.read().with_provider_id(provider_id)?;
        ctx.nodes.get(&ObjectRef::new(&name))
    })?;
    let deleted = node.metadata.uid.as_ref().is_some_and(|uid| {
        ctx.expectations
            .read()
            .deleted_nodes
            .pending(uid, Instant::now())
    });
    (!deleted).then_some(node)
}

fn node_is_ready(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
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
        &status,
        &plan.configuration,
        &plan.node_ref,
        kubelet_version.as_deref(),
        plan.phase,
        &[&plan.configuration_condition, &plan.node_condition]
            .into_iter()
            .chain(kubelet_plan.as_ref())
            .chain(discovered_plan.as_ref())
            .collect::<Vec<_>>(),
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

/// The `kubernetes.version` of a configuration version, from the cache.
fn kubernetes_version(
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
async fn refuse_skewed(
    plan: &mut crate::lifecycle::MachinePlan,
    status: &unbounded_api::MachineStatus,
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

fn condition_matches(current: &[Condition], plan: &ConditionPlan) -> bool {
    condition::find(current, plan.type_).is_some_and(|c| {
        c.status == if plan.status { "True" } else { "False" }
            && c.reason == plan.reason
            && c.message == plan.message
    })
}

/// Marks the version deployed (immutable) unless it already is.
async fn lock_version(
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

/// Annotates the Node with its configuration and version unless it already is.
async fn annotate_node(
    node: &Node,
    configuration: &ResolvedConfiguration,
    machine: &Machine,
    ctx: &Context,
) -> Result<(), Error> {
    let wanted: BTreeMap<&str, String> = BTreeMap::from([
        (
            annotations::MACHINE_CONFIGURATION,
            configuration.name.clone(),
        ),
        (
            annotations::MACHINE_CONFIGURATION_VERSION,
            configuration.version.to_string(),
        ),
        (annotations::MACHINE, machine.name_any()),
    ]);
    let current = node.annotations();
    if wanted.iter().all(|(k, v)| current.get(*k) == Some(v)) {
        return Ok(());
    }
    let api: Api<Node> = Api::all(ctx.client.clone());
    let node_name = node.name_any();
    api.patch(
        &node_name,
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"annotations": wanted}})),
    )
    .await
    .map_err(kube_err(format!("annotating Node {node_name}")))?;
    ctx.event(
        machine,
        EventType::Normal,
        reasons::NODE_ANNOTATED,
        format!(
            "annotated Node {node_name} with {} version {}",
            configuration.name, configuration.version
        ),
    )
    .await;
    Ok(())
}

/// Applies the controller's status fields (server-side apply, field manager
/// `unbounded-controller`) when they differ from what is recorded; waits instead when this
/// copy of the Machine is one an earlier write replaced ([`crate::status_writes`]).
#[allow(clippy::too_many_arguments)] // one per status field the controller owns
async fn write_status(
    machine: &Machine,
    current: &unbounded_api::MachineStatus,
    configuration: &Option<ResolvedConfiguration>,
    node_ref: &Option<unbounded_api::NodeRef>,
    kubelet_version: Option<&str>,
    phase: MachinePhase,
    plans: &[&ConditionPlan],
    ctx: &Context,
) -> Result<(), Error> {
    let generation = machine.metadata.generation;
    let mut merged = current.conditions.clone();
    let mut ours = Vec::with_capacity(plans.len());
    for plan in plans {
        let new = condition::new_condition(
            plan.type_,
            plan.status,
            plan.reason,
            plan.message.clone(),
            generation,
        );
        condition::set(&mut merged, new);
        if let Some(c) = condition::find(&merged, plan.type_) {
            ours.push(c.clone());
        }
    }
    let unchanged = current.phase == Some(phase)
        && &current.configuration == configuration
        && &current.node_ref == node_ref
        && current.kubelet_version.as_deref() == kubelet_version
        && current.observed_generation == generation
        && ours.iter().all(|c| {
            condition::find(&current.conditions, &c.type_)
                .is_some_and(|old| condition::same_meaning(old, c))
        });
    if unchanged {
        return Ok(());
    }
    let name = machine.name_any();
    let read_at = machine.resource_version().unwrap_or_default();
    if ctx
        .expectations
        .read()
        .machine_statuses
        .is_superseded(&name, &read_at, Instant::now())
    {
        // What the API server would answer (409) without the request ([`crate::status_writes`]).
        return Err(Error::Waiting(format!(
            "Machine {name}: status already written over this copy"
        )));
    }
    tracing::debug!(machine = %name, read_at = %read_at, "writing status");
    let mut status = serde_json::Map::new();
    status.insert("phase".into(), json!(phase.as_str()));
    status.insert("conditions".into(), json!(ours));
    if let Some(c) = configuration {
        status.insert("configuration".into(), json!(c));
    }
    if let Some(n) = node_ref {
        status.insert("nodeRef".into(), json!(n));
    }
    if let Some(v) = kubelet_version {
        status.insert("kubeletVersion".into(), json!(v));
    }
    if let Some(g) = generation {
        status.insert("observedGeneration".into(), json!(g));
    }
    // Written only over the Machine as read: a reconcile working from a stale copy must not
    // overwrite what a newer one recorded (the version is sticky).
    let body = json!({
        "apiVersion": Machine::api_version(&()),
        "kind": Machine::kind(&()),
        "metadata": {"resourceVersion": machine.resource_version()},
        "status": status,
    });
    let api: Api<Machine> = Api::all(ctx.client.clone());
    match api
        .patch_status(
            &name,
            &PatchParams::apply(field_managers::CONTROLLER).force(),
            &Patch::Apply(body),
        )
        .await
    {
        Ok(_) => {
            ctx.expectations.write().machine_statuses.wrote_over(
                &name,
                &[&read_at],
                Instant::now(),
            );
            Ok(())
        }
        Err(kube::Error::Api(s)) if s.code == 409 => {
            Err(Error::Waiting(format!("Machine {name} changed meanwhile")))
        }
        Err(e) => Err(kube_err(format!("writing the status of Machine {name}"))(e)),
    }
}

/// The `Discovered` condition this Machine's every status write carries
/// ([`crate::lifecycle::discovered_condition`] says why also while it is deleted).
fn discovered_plan(
    machine: &Machine,
    status: &unbounded_api::MachineStatus,
) -> Option<crate::lifecycle::ConditionPlan> {
    let has_condition = condition::find(&status.conditions, conditions::DISCOVERED).is_some();
    crate::lifecycle::discovered_condition(machine.labels(), has_condition)
}

/// Deletion: drain and delete the Node, then wait until every provider has released the
/// infrastructure (removed its own finalizer). Every step is idempotent.
async fn cleanup(machine: &Machine, ctx: &Context) -> Result<Action, Error> {
    let status = machine.status.clone().unwrap_or_default();
    let node_name = machine.node_name();
    let discovered = discovered_plan(machine, &status);
    write_status(
        machine,
        &status,
        &status.configuration,
        &status.node_ref,
        status.kubelet_version.as_deref(),
        MachinePhase::Deleting,
        &discovered.iter().collect::<Vec<_>>(),
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
async fn release_disks(
    machine: &Machine,
    status: &unbounded_api::MachineStatus,
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
    write_status(
        machine,
        status,
        &status.configuration,
        &status.node_ref,
        status.kubelet_version.as_deref(),
        MachinePhase::Deleting,
        &std::iter::once(&plan)
            .chain(discovered.as_ref())
            .collect::<Vec<_>>(),
        ctx,
    )
    .await?;
    match step {
        ReleaseStep::PowerOff { .. } => Ok(()),
        ReleaseStep::Wait { message } | ReleaseStep::Hold { message, .. } => {
            Err(Error::Waiting(message))
        }
    }
}
