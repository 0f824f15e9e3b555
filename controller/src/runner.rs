//! Wires the reconcilers to the API: one watch per kind keeps a reflector store (what
//! reconciliation reads, so reconcile never LISTs) and turns every touched object, applied or
//! deleted, into triggers for the controllers whose decisions depend on it.
//!
//! Triggers go through channels into `Controller::reconcile_on` rather than kube-runtime's
//! shared streams, because shared streams do not pass deletions on, and a deleted Node
//! (repave) or a deleted Machine (version counts) must trigger a reconcile at once.

use std::collections::BTreeSet;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures::channel::mpsc::{UnboundedSender, unbounded};
use futures::{Stream, StreamExt, future};
use k8s_openapi::api::core::v1::Node;
use kube::api::Api;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use unbounded_api::{
    Machine, MachineConfiguration, MachineConfigurationVersion, MachineOperation, MachinePhase,
};

use crate::context::{Context, Settings};
use crate::error::Error;
use crate::metrics::{Metrics, PhaseLabels};
use crate::{configuration, machine, operation};

/// Watches one kind into its store and calls `on_touched` for every object that changed
/// or was deleted.
fn drive<K>(
    api: Api<K>,
    writer: reflector::store::Writer<K>,
    on_touched: impl Fn(&K) + Send + 'static,
) -> tokio::task::JoinHandle<()>
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static,
{
    let stream = watcher(api, watcher::Config::default())
        .default_backoff()
        .reflect(writer)
        .touched_objects();
    tokio::spawn(stream.for_each(move |event| {
        match event {
            Ok(object) => on_touched(&object),
            Err(error) => tracing::warn!(%error, kind = %K::kind(&()), "watch error; retrying"),
        }
        future::ready(())
    }))
}

fn send_all<K: kube::Resource>(
    tx: &UnboundedSender<ObjectRef<K>>,
    refs: impl IntoIterator<Item = ObjectRef<K>>,
) where
    K::DynamicType: Clone,
{
    for r in refs {
        // A closed channel means the controller is shutting down.
        let _ = tx.unbounded_send(r);
    }
}

/// Runs the Machine, MachineConfiguration and MachineOperation controllers until `shutdown`
/// resolves.
pub async fn run(
    client: Client,
    settings: Settings,
    metrics: Arc<Metrics>,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) -> Result<(), Error> {
    let (machines, machine_writer) = reflector::store::<Machine>();
    let (configurations, configuration_writer) = reflector::store::<MachineConfiguration>();
    let (versions, version_writer) = reflector::store::<MachineConfigurationVersion>();
    let (nodes, node_writer) = reflector::store::<Node>();
    let (operations, operation_writer) = reflector::store::<MachineOperation>();
    let (operation_tx, operation_rx) = unbounded::<ObjectRef<MachineOperation>>();
    let (machine_tx, machine_rx) = unbounded::<ObjectRef<Machine>>();
    let (configuration_tx, configuration_rx) = unbounded::<ObjectRef<MachineConfiguration>>();
    let (access_tx, access_rx) = unbounded::<ObjectRef<Machine>>();

    let watches = [
        drive(Api::<Machine>::all(client.clone()), machine_writer, {
            let (mtx, ctx_, otx, operations, atx) = (
                machine_tx.clone(),
                configuration_tx.clone(),
                operation_tx.clone(),
                operations.clone(),
                access_tx.clone(),
            );
            move |m: &Machine| {
                send_all(&mtx, [ObjectRef::from_obj(m)]);
                send_all(&atx, [ObjectRef::from_obj(m)]);
                send_all(&ctx_, configurations_of_machine(m));
                send_all(&otx, unfinished_operations_on(&operations, &m.name_any()));
            }
        }),
        drive(
            Api::<MachineOperation>::all(client.clone()),
            operation_writer,
            {
                let (otx, operations, atx) =
                    (operation_tx.clone(), operations.clone(), access_tx.clone());
                move |o: &MachineOperation| {
                    send_all(&otx, [ObjectRef::from_obj(o)]);
                    send_all(&otx, parent_of(o));
                    // Its agent's role lists the operations routed to it.
                    if let Some(r) = &o.spec.machine_ref {
                        send_all(&atx, [ObjectRef::new(&r.name)]);
                    }
                    // The next operation on the Machine may run once this one finishes.
                    if let Some(r) = &o.spec.machine_ref {
                        send_all(&otx, unfinished_operations_on(&operations, &r.name));
                    }
                }
            },
        ),
        drive(
            Api::<MachineConfiguration>::all(client.clone()),
            configuration_writer,
            {
                let (mtx, ctx_, machines) = (
                    machine_tx.clone(),
                    configuration_tx.clone(),
                    machines.clone(),
                );
                move |c: &MachineConfiguration| {
                    send_all(&ctx_, [ObjectRef::from_obj(c)]);
                    send_all(&mtx, machines_affected_by(&machines, &c.name_any()));
                }
            },
        ),
        drive(
            Api::<MachineConfigurationVersion>::all(client.clone()),
            version_writer,
            {
                let (mtx, ctx_, machines) = (
                    machine_tx.clone(),
                    configuration_tx.clone(),
                    machines.clone(),
                );
                move |v: &MachineConfigurationVersion| {
                    send_all(&ctx_, [ObjectRef::new(&v.spec.configuration_name)]);
                    send_all(
                        &mtx,
                        machines_affected_by(&machines, &v.spec.configuration_name),
                    );
                }
            },
        ),
        drive(Api::<Node>::all(client.clone()), node_writer, {
            let (mtx, machines) = (machine_tx.clone(), machines.clone());
            move |n: &Node| send_all(&mtx, machines_of_node(&machines, n))
        }),
    ];

    // Decisions need complete stores: a Node missing from a half-filled store would look
    // deleted and trigger a repave.
    machines
        .wait_until_ready()
        .await
        .map_err(|_| Error::StoreNotReady("Machine"))?;
    configurations
        .wait_until_ready()
        .await
        .map_err(|_| Error::StoreNotReady("MachineConfiguration"))?;
    versions
        .wait_until_ready()
        .await
        .map_err(|_| Error::StoreNotReady("MachineConfigurationVersion"))?;
    nodes
        .wait_until_ready()
        .await
        .map_err(|_| Error::StoreNotReady("Node"))?;
    operations
        .wait_until_ready()
        .await
        .map_err(|_| Error::StoreNotReady("MachineOperation"))?;
    tracing::info!("caches synced; reconciling");
    // Everything once at start (the drivers may have sent before the stores were complete).
    send_all(
        &machine_tx,
        machines
            .state()
            .iter()
            .map(|m| ObjectRef::from_obj(m.as_ref())),
    );
    send_all(
        &access_tx,
        machines
            .state()
            .iter()
            .map(|m| ObjectRef::from_obj(m.as_ref())),
    );
    send_all(
        &configuration_tx,
        configurations
            .state()
            .iter()
            .map(|c| ObjectRef::from_obj(c.as_ref())),
    );

    send_all(
        &operation_tx,
        operations
            .state()
            .iter()
            .map(|o| ObjectRef::from_obj(o.as_ref())),
    );

    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: "unbounded-controller".into(),
            instance: std::env::var("POD_NAME").ok(),
        },
    );
    let access_ctx = Arc::new(crate::agent_access::AccessContext::new(
        client.clone(),
        operations.clone(),
    ));
    let ctx = Arc::new(Context {
        client,
        machines: machines.clone(),
        configurations: configurations.clone(),
        versions: versions.clone(),
        nodes,
        operations: operations.clone(),
        recorder,
        metrics: metrics.clone(),
        settings,
    });

    let shutdown = futures::future::FutureExt::shared(Box::pin(shutdown));
    let machine_controller = Controller::for_stream(no_primary::<Machine>(), machines.clone())
        .reconcile_on(machine_rx)
        .graceful_shutdown_on(shutdown.clone())
        .run(machine::reconcile, error_policy, ctx.clone())
        .for_each(|_| future::ready(()));
    let configuration_controller =
        Controller::for_stream(no_primary::<MachineConfiguration>(), configurations)
            .reconcile_on(configuration_rx)
            .graceful_shutdown_on(shutdown.clone())
            .run(configuration::reconcile, error_policy, ctx.clone())
            .for_each(|_| future::ready(()));

    let operation_controller = Controller::for_stream(no_primary::<MachineOperation>(), operations)
        .reconcile_on(operation_rx)
        .graceful_shutdown_on(shutdown.clone())
        .run(operation::reconcile, error_policy, ctx.clone())
        .for_each(|_| future::ready(()));

    let access_controller = Controller::for_stream(no_primary::<Machine>(), machines.clone())
        .reconcile_on(access_rx)
        .graceful_shutdown_on(shutdown.clone())
        .run(
            crate::agent_access::reconcile,
            crate::agent_access::error_policy,
            access_ctx,
        )
        .for_each(|_| future::ready(()));

    let phase_gauge = count_phases(machines, metrics);

    tokio::select! {
        _ = future::join4(machine_controller, configuration_controller, operation_controller, access_controller) => {},
        _ = phase_gauge => {},
    }
    for watch in watches {
        watch.abort();
    }
    Ok(())
}

/// The controllers' triggers all come through `reconcile_on`; their primary stream is empty.
fn no_primary<K: Send + 'static>() -> impl Stream<Item = Result<K, watcher::Error>> + Send + 'static
{
    futures::stream::pending()
}

fn error_policy<K>(object: Arc<K>, error: &Error, ctx: Arc<Context>) -> Action
where
    K: kube::Resource<DynamicType = ()>,
{
    if error.is_waiting() {
        tracing::debug!(object = %object.meta().name.as_deref().unwrap_or_default(), %error, "waiting");
        return Action::requeue(Duration::from_secs(3));
    }
    let controller = match K::kind(&()).as_ref() {
        "Machine" => "machine",
        "MachineOperation" => "operation",
        _ => "configuration",
    };
    ctx.metrics
        .errors
        .get_or_create(&crate::metrics::ErrorLabels {
            controller: controller.to_owned(),
            error: error.metric_label().to_owned(),
        })
        .inc();
    tracing::warn!(object = %object.meta().name.as_deref().unwrap_or_default(), %error, "reconcile failed");
    Action::requeue(Duration::from_secs(10))
}

/// Machines whose Node this is (by name or provider ID).
fn machines_of_node(machines: &Store<Machine>, node: &Node) -> Vec<ObjectRef<Machine>> {
    let name = node.name_any();
    let provider_id = node.spec.as_ref().and_then(|s| s.provider_id.as_deref());
    machines
        .state()
        .iter()
        .filter(|m| {
            m.node_name() == name
                || (provider_id.is_some() && m.spec.provider_id.as_deref() == provider_id)
        })
        .map(|m| ObjectRef::from_obj(m.as_ref()))
        .collect()
}

/// Machines whose decision may change with this configuration: those it may be selected
/// for (no version recorded yet) and those that use or name it.
fn machines_affected_by(machines: &Store<Machine>, configuration: &str) -> Vec<ObjectRef<Machine>> {
    machines
        .state()
        .iter()
        .filter(|m| {
            let recorded = m.status.as_ref().and_then(|s| s.configuration.as_ref());
            recorded.is_none_or(|c| c.name == configuration)
                || m.spec
                    .configuration_ref
                    .as_ref()
                    .is_some_and(|r| r.name == configuration)
        })
        .map(|m| ObjectRef::from_obj(m.as_ref()))
        .collect()
}

/// The unfinished single-machine operations on a Machine.
fn unfinished_operations_on(
    operations: &Store<MachineOperation>,
    machine: &str,
) -> Vec<ObjectRef<MachineOperation>> {
    operations
        .state()
        .iter()
        .filter(|o| {
            o.spec
                .machine_ref
                .as_ref()
                .is_some_and(|r| r.name == machine)
                && !o
                    .status
                    .as_ref()
                    .and_then(|s| s.state)
                    .is_some_and(|s| s.is_finished())
        })
        .map(|o| ObjectRef::from_obj(o.as_ref()))
        .collect()
}

/// The selector operation a child belongs to.
fn parent_of(operation: &MachineOperation) -> Vec<ObjectRef<MachineOperation>> {
    operation
        .metadata
        .owner_references
        .iter()
        .flatten()
        .filter(|r| r.kind == "MachineOperation")
        .map(|r| ObjectRef::new(&r.name))
        .collect()
}

/// The configurations whose counts a Machine contributes to.
fn configurations_of_machine(machine: &Machine) -> Vec<ObjectRef<MachineConfiguration>> {
    let mut names = BTreeSet::new();
    if let Some(c) = machine
        .status
        .as_ref()
        .and_then(|s| s.configuration.as_ref())
    {
        names.insert(c.name.clone());
    }
    if let Some(r) = &machine.spec.configuration_ref {
        names.insert(r.name.clone());
    }
    names.into_iter().map(|n| ObjectRef::new(&n)).collect()
}

/// Keeps the machines-per-phase gauge current from the store.
async fn count_phases(machines: Store<Machine>, metrics: Arc<Metrics>) {
    loop {
        let mut counts = [0i64; MachinePhase::ALL.len()];
        for m in machines.state() {
            let phase = m
                .status
                .as_ref()
                .and_then(|s| s.phase)
                .unwrap_or(MachinePhase::Pending);
            if let Some(i) = MachinePhase::ALL.iter().position(|p| *p == phase) {
                counts[i] += 1;
            }
        }
        for (phase, count) in MachinePhase::ALL.iter().zip(counts) {
            metrics
                .machines
                .get_or_create(&PhaseLabels {
                    phase: phase.as_str().to_owned(),
                })
                .set(count);
        }
        tokio::time::sleep(Duration::from_secs(5)).await;
    }
}
