//! Unbounded as a Cluster API provider (contract v1beta2), run with `--cluster-api`:
//! infrastructure ([`machine`]: an `UnboundedMachine` claims a PXE Machine from the
//! inventory, or creates an Azure one, and releases it, wiped, when deleted; [`cluster`]:
//! an `UnboundedCluster` is provisioned by its endpoint), the control plane the machines
//! join ([`control_plane`]: one that already runs, initialized once Cluster API can reach
//! it) and bootstrap ([`bootstrap`]: an
//! `UnboundedConfig` resolves the configuration version the Cluster API Machine's
//! Kubernetes version maps onto and writes it into the bootstrap data Secret).
//!
//! Decisions are [`decide`]'s, pure; Cluster API's own objects are read untyped
//! ([`objects`]). The controllers share the main controller's stores (Machines, versions)
//! and its claim expectations, so that a pool and an UnboundedMachine never claim one
//! Machine, and the Machine watch wakes the UnboundedMachine a Machine's
//! `unbounded-cloud.io/capi-machine` annotation names. docs/cluster-api.md is the guide.

pub mod bootstrap;
pub mod cluster;
pub mod control_plane;
pub mod decide;
pub mod machine;
pub mod objects;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures::{StreamExt, future};
use kube::api::{Api, DynamicObject};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use unbounded_api::capi::{
    UnboundedCluster, UnboundedConfig, UnboundedControlPlane, UnboundedMachine,
};

use crate::context::Context;
use crate::error::Error;
use crate::work_queue::WorkReceiver;

/// The object a Cluster API Machine's reference (`spec.infrastructureRef`,
/// `spec.bootstrap.configRef`) names, when it is of `kind`.
fn referenced<K>(object: &DynamicObject, pointer: &str, kind: &str) -> Option<ObjectRef<K>>
where
    K: kube::Resource<DynamicType = ()>,
{
    let reference = object.data.pointer(pointer)?;
    if reference.get("kind").and_then(|k| k.as_str()) != Some(kind) {
        return None;
    }
    let name = reference.get("name")?.as_str()?;
    let namespace = object.metadata.namespace.as_deref()?;
    Some(ObjectRef::new(name).within(namespace))
}

/// Runs the UnboundedMachine, UnboundedConfig, UnboundedCluster and UnboundedControlPlane
/// controllers until
/// `shutdown` resolves. `machine_triggers` brings the UnboundedMachines whose Machine
/// changed.
pub async fn run(
    ctx: Arc<Context>,
    machine_triggers: WorkReceiver<ObjectRef<UnboundedMachine>>,
    shutdown: impl Future<Output = ()> + Send + Sync + Clone + 'static,
) {
    let client = ctx.client.clone();
    let capi_machines =
        || Api::<DynamicObject>::all_with(client.clone(), &objects::machine_resource());
    let machines = Controller::new(
        Api::<UnboundedMachine>::all(client.clone()),
        watcher::Config::default(),
    )
    .watches_with(
        capi_machines(),
        objects::machine_resource(),
        watcher::Config::default(),
        |m| referenced::<UnboundedMachine>(&m, "/spec/infrastructureRef", "UnboundedMachine"),
    )
    .reconcile_on(machine_triggers)
    .graceful_shutdown_on(shutdown.clone())
    .run(machine::reconcile, error_policy, ctx.clone())
    .for_each(|_| future::ready(()));
    let configs = Controller::new(
        Api::<UnboundedConfig>::all(client.clone()),
        watcher::Config::default(),
    )
    .watches_with(
        capi_machines(),
        objects::machine_resource(),
        watcher::Config::default(),
        |m| referenced::<UnboundedConfig>(&m, "/spec/bootstrap/configRef", "UnboundedConfig"),
    )
    .graceful_shutdown_on(shutdown.clone())
    .run(bootstrap::reconcile, error_policy, ctx.clone())
    .for_each(|_| future::ready(()));
    let clusters = Controller::new(
        Api::<UnboundedCluster>::all(client.clone()),
        watcher::Config::default(),
    )
    .graceful_shutdown_on(shutdown.clone())
    .run(cluster::reconcile, error_policy, ctx.clone())
    .for_each(|_| future::ready(()));
    let control_planes = Controller::new(
        Api::<UnboundedControlPlane>::all(client.clone()),
        watcher::Config::default(),
    )
    .graceful_shutdown_on(shutdown)
    .run(control_plane::reconcile, error_policy, ctx)
    .for_each(|_| future::ready(()));
    tracing::info!(
        "Cluster API provider: reconciling UnboundedMachines, UnboundedConfigs, UnboundedClusters and UnboundedControlPlanes"
    );
    future::join4(machines, configs, clusters, control_planes).await;
}

fn error_policy<K>(object: Arc<K>, error: &Error, ctx: Arc<Context>) -> Action
where
    K: kube::Resource<DynamicType = ()>,
{
    let name = object.meta().name.as_deref().unwrap_or_default();
    if error.is_waiting() {
        tracing::debug!(object = %name, %error, "waiting");
        return Action::requeue(Duration::from_secs(3));
    }
    ctx.metrics
        .errors
        .get_or_create(&crate::metrics::ErrorLabels {
            controller: format!("capi-{}", K::kind(&()).to_ascii_lowercase()),
            error: error.metric_label().to_owned(),
        })
        .inc();
    tracing::warn!(kind = %K::kind(&()), object = %name, %error, "reconcile failed");
    Action::requeue(Duration::from_secs(10))
}
