//! Wires the reconcilers to the API: one watch per kind keeps a reflector store and an index
//! ([`crate::watches`]), the watches' triggers feed one kube-runtime `Controller` per kind,
//! and configuration recounts are sent on in batches ([`crate::recount`]).

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::work_queue::{WorkSender, work_queue};
use futures::{Stream, StreamExt, future};
use k8s_openapi::api::core::v1::Node;
use kube::Client;
use kube::api::Api;
use kube::runtime::controller::{self, Action, Controller};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::watcher;
use unbounded_api::{
    Machine, MachineConfiguration, MachineConfigurationVersion, MachineOperation, MachinePool,
};

use crate::context::{Context, Settings};
use crate::error::Error;
use crate::events::EventPublisher;
use crate::expectations::Expectations;
use crate::index::Shared;
use crate::index::catalog::Catalog;
use crate::index::machines::MachineIndex;
use crate::index::operations::{NodeIndex, OperationIndex};
use crate::index::pools::PoolIndex;
use crate::metrics::{Metrics, PhaseLabels};
use crate::recount::{PendingRecounts, RecountTiming};
use crate::triggers::Lookups;
use crate::watches::{self, Triggers, drive};
use crate::{configuration, machine, operation, pool};

/// Tasks that end when their owner is dropped: [`run`] is the leadership's work, and dropping
/// it must stop everything it started (the Event publisher writes).
struct AbortOnDrop(Vec<tokio::task::AbortHandle>);

impl AbortOnDrop {
    fn add<T>(&mut self, task: &tokio::task::JoinHandle<T>) {
        self.0.push(task.abort_handle());
    }
}

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        for task in &self.0 {
            task.abort();
        }
    }
}

/// Runs the Machine, MachineConfiguration and MachineOperation controllers until `shutdown`
/// resolves. Dropping the returned future stops everything it started.
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
    let (pools, pool_writer) = reflector::store::<MachinePool>();
    let pool_index = Shared::new(PoolIndex::default());
    let machine_index = Shared::new(MachineIndex::default());
    let catalog = Shared::new(Catalog::default());
    let node_index = Shared::new(NodeIndex::default());
    let operation_index = Shared::new(OperationIndex::default());
    let expectations = Shared::new(Expectations::default());
    let (operation_tx, operation_rx) = work_queue::<ObjectRef<MachineOperation>>();
    let (machine_tx, machine_rx) = work_queue::<ObjectRef<Machine>>();
    let (configuration_tx, configuration_rx) = work_queue::<ObjectRef<MachineConfiguration>>();
    let (access_tx, access_rx) = work_queue::<ObjectRef<Machine>>();
    let (pool_tx, pool_rx) = work_queue::<ObjectRef<MachinePool>>();
    let (capi_tx, capi_rx) = if settings.cluster_api {
        let (tx, rx) = work_queue::<ObjectRef<unbounded_api::capi::UnboundedMachine>>();
        (Some(tx), Some(rx))
    } else {
        (None, None)
    };
    let triggers = Triggers {
        access: access_tx.clone(),
        pools: pool_tx.clone(),
        machines: machine_tx.clone(),
        configurations: configuration_tx.clone(),
        operations: operation_tx.clone(),
        capi_machines: capi_tx,
        recount: Shared::new(PendingRecounts::default()),
        live: Arc::new(AtomicBool::new(false)),
        machines_live: Arc::new(AtomicBool::new(false)),
    };

    let lookups = Lookups {
        machines: machine_index.clone(),
        pools: pool_index.clone(),
        catalog: catalog.clone(),
        operation_index: operation_index.clone(),
        operations: operations.clone(),
    };
    let watches = [
        drive(
            Api::<Machine>::all(client.clone()),
            machine_writer,
            watches::trim_machine,
            triggers.on_machine(lookups.clone(), expectations.clone()),
        ),
        drive(
            Api::<MachinePool>::all(client.clone()),
            pool_writer,
            watches::trim_pool,
            triggers.on_pool(pool_index.clone()),
        ),
        drive(
            Api::<MachineOperation>::all(client.clone()),
            operation_writer,
            watches::trim_operation,
            triggers.on_operation(lookups.clone()),
        ),
        drive(
            Api::<MachineConfiguration>::all(client.clone()),
            configuration_writer,
            watches::trim_configuration,
            triggers.on_configuration(lookups.clone(), expectations.clone()),
        ),
        drive(
            Api::<MachineConfigurationVersion>::all(client.clone()),
            version_writer,
            watches::trim_version,
            triggers.on_version(lookups.clone(), expectations.clone()),
        ),
        drive(
            Api::<Node>::all(client.clone()),
            node_writer,
            watches::trim_node,
            triggers.on_node(node_index.clone(), lookups, expectations.clone()),
        ),
    ];
    let mut tasks = AbortOnDrop(Vec::new());
    for watch in &watches {
        tasks.add(watch);
    }

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
    pools
        .wait_until_ready()
        .await
        .map_err(|_| Error::StoreNotReady("MachinePool"))?;
    // From now on every change triggers; then everything once ([`initial_pass`]), which
    // covers what changed while the stores filled.
    triggers.live.store(true, Ordering::Release);
    tracing::info!(
        machines = machines.len(),
        configurations = configurations.len(),
        versions = versions.len(),
        nodes = nodes.len(),
        operations = operations.len(),
        "caches synced; reconciling"
    );
    let initial = tokio::spawn(initial_pass(
        catalog.clone(),
        triggers.machines_live.clone(),
        (configurations.clone(), configuration_tx.clone()),
        (operations.clone(), operation_tx.clone()),
        (machines.clone(), machine_tx.clone()),
        access_tx.clone(),
        (pools.clone(), pool_tx.clone()),
    ));
    tasks.add(&initial);
    let recounts = send_recounts(
        triggers.recount.clone(),
        configuration_tx.clone(),
        settings.recount,
    );

    let (recorder, event_worker) = EventPublisher::new(
        client.clone(),
        "unbounded-controller",
        std::env::var("POD_NAME").ok(),
        settings.events,
        metrics.events_dropped.clone(),
    );
    let event_worker = tokio::spawn(event_worker.run());
    tasks.add(&event_worker);
    let access_ctx = Arc::new(crate::agent_access::AccessContext::new(
        client.clone(),
        operations.clone(),
        operation_index.clone(),
    ));
    let ctx = Arc::new(Context {
        client,
        machines: machines.clone(),
        configurations: configurations.clone(),
        versions: versions.clone(),
        nodes,
        operations: operations.clone(),
        pools: pools.clone(),
        pool_index,
        machine_index: machine_index.clone(),
        catalog,
        node_index,
        operation_index,
        expectations,
        recorder,
        metrics: metrics.clone(),
        settings: settings.clone(),
    });

    let shutdown = futures::future::FutureExt::shared(Box::pin(shutdown));
    let config = |concurrency: u16| controller::Config::default().concurrency(concurrency);
    let access_controller = Controller::for_stream(no_primary::<Machine>(), machines.clone())
        .with_config(config(settings.machine_concurrency))
        .reconcile_on(access_rx)
        .graceful_shutdown_on(shutdown.clone())
        .run(
            crate::agent_access::reconcile,
            crate::agent_access::error_policy,
            access_ctx,
        )
        .for_each(|_| future::ready(()));
    let machine_controller = Controller::for_stream(no_primary::<Machine>(), machines)
        .with_config(config(settings.machine_concurrency))
        .reconcile_on(machine_rx)
        .graceful_shutdown_on(shutdown.clone())
        .run(machine::reconcile, error_policy, ctx.clone())
        .for_each(|_| future::ready(()));
    let configuration_controller =
        Controller::for_stream(no_primary::<MachineConfiguration>(), configurations)
            .with_config(config(settings.configuration_concurrency))
            .reconcile_on(configuration_rx)
            .graceful_shutdown_on(shutdown.clone())
            .run(configuration::reconcile, error_policy, ctx.clone())
            .for_each(|_| future::ready(()));

    let operation_controller = Controller::for_stream(no_primary::<MachineOperation>(), operations)
        .with_config(config(settings.operation_concurrency))
        .reconcile_on(operation_rx)
        .graceful_shutdown_on(shutdown.clone())
        .run(operation::reconcile, error_policy, ctx.clone())
        .for_each(|_| future::ready(()));

    let pool_controller = Controller::for_stream(no_primary::<MachinePool>(), pools)
        .with_config(config(settings.pool_concurrency))
        .reconcile_on(pool_rx)
        .graceful_shutdown_on(shutdown.clone())
        .run(pool::reconcile, error_policy, ctx.clone())
        .for_each(|_| future::ready(()));

    let phase_gauge = count_phases(machine_index, metrics);
    let cluster_api = async move {
        match capi_rx {
            Some(rx) => crate::capi::run(ctx, rx, shutdown).await,
            None => future::pending().await,
        }
    };

    tokio::select! {
        _ = future::join5(machine_controller, configuration_controller, operation_controller, access_controller, pool_controller) => {},
        () = cluster_api => {},
        _ = phase_gauge => {},
        _ = recounts => {},
    }
    drop(tasks);
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
        "MachinePool" => "pool",
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

fn send_all<K: kube::Resource<DynamicType = ()>>(
    tx: &WorkSender<ObjectRef<K>>,
    refs: impl IntoIterator<Item = ObjectRef<K>>,
) {
    for r in refs {
        tx.send(r);
    }
}

/// How long the first pass waits for new configurations' first versions before it
/// reconciles the Machines anyway.
const FIRST_VERSIONS_WAIT: Duration = Duration::from_secs(10);

type Feed<K> = (Store<K>, WorkSender<ObjectRef<K>>);

/// Everything once, configurations first: a Machine reconciled before its configuration's
/// first version exists records `ConfigurationPending` and later its version, two status
/// writes and one event more for each such Machine of a cold start.
async fn initial_pass(
    catalog: Shared<Catalog>,
    machines_live: Arc<AtomicBool>,
    configurations: Feed<MachineConfiguration>,
    operations: Feed<MachineOperation>,
    machines: Feed<Machine>,
    access: WorkSender<ObjectRef<Machine>>,
    pools: Feed<MachinePool>,
) {
    fn send_every<K: kube::Resource<DynamicType = ()> + Clone>((store, tx): &Feed<K>) {
        send_all(
            tx,
            store
                .state()
                .iter()
                .map(|o| ObjectRef::from_obj(o.as_ref())),
        );
    }
    send_every(&configurations);
    send_every(&operations);
    let deadline = tokio::time::Instant::now() + FIRST_VERSIONS_WAIT;
    while catalog.read().awaiting_first_version() > 0 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Live first, then everything: a Machine that appears in between is sent twice, never
    // not at all.
    machines_live.store(true, Ordering::Release);
    send_every(&machines);
    send_every(&(machines.0.clone(), access));
    send_every(&pools);
}

/// Sends the configurations whose Machines changed on for a recount when their batch is
/// due ([`crate::recount`]).
async fn send_recounts(
    pending: Shared<PendingRecounts>,
    tx: WorkSender<ObjectRef<MachineConfiguration>>,
    timing: RecountTiming,
) {
    let mut ticks = tokio::time::interval(RECOUNT_TICK);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        let due = pending.write().take_due(std::time::Instant::now(), timing);
        send_all(&tx, due.iter().map(|name| ObjectRef::new(name)));
    }
}

/// How often due recounts are looked for.
const RECOUNT_TICK: Duration = Duration::from_millis(250);

/// Keeps the machines-per-phase gauge current from the index.
async fn count_phases(index: Shared<MachineIndex>, metrics: Arc<Metrics>) {
    loop {
        let counts = index.read().phase_counts();
        for phase in unbounded_api::MachinePhase::ALL {
            metrics
                .machines
                .get_or_create(&PhaseLabels {
                    phase: phase.as_str().to_owned(),
                })
                .set(counts.get(&phase).copied().unwrap_or(0));
        }
        tokio::time::sleep(Duration::from_secs(5)).await;
    }
}
