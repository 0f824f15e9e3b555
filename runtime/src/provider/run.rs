//! The loop: watches Machines of the provider's kind (and Nodes, for the deleted ones that
//! wait for theirs), holds the provider's finalizer, calls the provider and writes what it
//! answered.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::api::Api;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::finalizer::{Event as Finalizer, finalizer};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Client, Resource, ResourceExt};
use unbounded_api::well_known::conditions;
use unbounded_api::{Machine, MachineConfigurationVersion, condition};

use super::contract::{Provider, ProviderError, Step, next_step};
use super::pacing::{LoopError, Settings, requeue_after};
use super::provider_id::record_provider_id;
use super::status::{write_release_condition, write_status};
use crate::release::{Configured, ReleaseStep, decide_release, facts_of, wiping_version};

/// Runs a provider as both providers do, until one part ends (each is meant to run for
/// ever, so the end is logged): a watch of every Machine into a store, the MachineOperation
/// handler that `operations` builds over that store (operations run by this provider, under
/// its field manager), and the provider loop over `provider`.
pub async fn run_with_operations<P, E>(
    client: Client,
    provider: Arc<P>,
    settings: Settings,
    operations: impl FnOnce(kube::runtime::reflector::Store<Machine>) -> E,
) where
    P: Provider,
    E: crate::handler::Execute,
{
    use kube::runtime::WatchStreamExt;
    let (machines, writer) = kube::runtime::reflector::store::<Machine>();
    let reflect = watcher(
        Api::<Machine>::all(client.clone()),
        watcher::Config::default(),
    )
    .default_backoff()
    .reflect(writer)
    .touched_objects()
    .for_each(|_| futures::future::ready(()));
    let handler = crate::handler::OperationHandler::new(
        client.clone(),
        unbounded_api::HandlerKind::Provider,
        P::FIELD_MANAGER,
        None,
        operations(machines),
    );
    let handle_operations = async move {
        if let Err(error) = handler.run().await {
            tracing::error!(provider = ?P::KIND, %error, "the operation handler stopped");
        }
    };
    tokio::select! {
        () = reflect => tracing::error!(provider = ?P::KIND, "the Machine watch of the provider ended"),
        () = handle_operations => {}
        () = run(client, provider, settings) => tracing::error!(provider = ?P::KIND, "the provider loop ended"),
    }
}

struct Context<P> {
    provider: P,
    client: Client,
    recorder: Recorder,
    settings: Settings,
    failures: Mutex<HashMap<String, u32>>,
}

/// Runs the loop for every Machine of `P::KIND` until the watch ends.
pub async fn run<P: Provider>(client: Client, provider: P, settings: Settings) {
    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: P::FIELD_MANAGER.into(),
            instance: None,
        },
    );
    let context = Arc::new(Context {
        provider,
        client: client.clone(),
        recorder,
        settings,
        failures: Mutex::new(HashMap::new()),
    });
    let controller = Controller::new(
        Api::<Machine>::all(client.clone()),
        watcher::Config::default(),
    );
    let machines = controller.store();
    // A deleted Machine waits for its Node: reconcile it the moment the Node changes or
    // goes. Only Machines being deleted, so Node status updates never poll a BMC.
    let waiting_on = move |node: Node| {
        let name = node.name_any();
        machines
            .state()
            .into_iter()
            .filter(|m| m.metadata.deletion_timestamp.is_some() && m.node_name() == name)
            .map(|m| ObjectRef::from_obj(m.as_ref()))
            .collect::<Vec<_>>()
    };
    controller
        .watches(
            Api::<Node>::all(client),
            watcher::Config::default(),
            waiting_on,
        )
        .run(reconcile::<P>, error_policy::<P>, context)
        .for_each(|_| async {})
        .await;
}

async fn reconcile<P: Provider>(
    machine: Arc<Machine>,
    ctx: Arc<Context<P>>,
) -> Result<Action, LoopError> {
    // `spec.provider` is immutable (CEL), so a Machine is ours for its whole life or never.
    if machine.spec.provider != P::KIND {
        return Ok(Action::await_change());
    }
    let api: Api<Machine> = Api::all(ctx.client.clone());
    let result = finalizer(&api, P::FINALIZER, machine, |event| async {
        match event {
            Finalizer::Apply(m) => apply(&m, &ctx).await,
            Finalizer::Cleanup(m) => cleanup(&m, &ctx).await,
        }
    })
    .await;
    match result {
        Ok(action) => Ok(action),
        Err(kube::runtime::finalizer::Error::ApplyFailed(e))
        | Err(kube::runtime::finalizer::Error::CleanupFailed(e)) => Err(e),
        Err(e) => Err(LoopError::Finalizer(Box::new(e))),
    }
}

async fn apply<P: Provider>(machine: &Machine, ctx: &Context<P>) -> Result<Action, LoopError> {
    let step = next_step(machine);
    let result = match step {
        Step::Create => ctx.provider.create(machine).await,
        Step::Observe => ctx.provider.observe(machine).await,
        // Retrying cannot help; a change of the spec brings the Machine back here.
        Step::Failed => return Ok(Action::await_change()),
    };
    let name = machine.name_any();
    let result = match result {
        Ok(observed) => record_provider_id::<P>(&ctx.client, machine, &observed)
            .await
            .map(|()| observed),
        Err(error) => Err(error),
    };
    match result {
        Ok(observed) => {
            if step == Step::Create {
                event(
                    ctx,
                    machine,
                    EventType::Normal,
                    "Provisioned",
                    "infrastructure created and powered on",
                )
                .await;
            }
            write_status::<P>(&ctx.client, machine, Some(&observed), None).await?;
            if let Ok(mut f) = ctx.failures.lock() {
                f.remove(&name);
            }
            Ok(Action::requeue(ctx.settings.poll))
        }
        Err(error) => {
            warn(ctx, machine, &error).await;
            write_status::<P>(&ctx.client, machine, None, Some((&error, step))).await?;
            Err(error.into())
        }
    }
}

async fn cleanup<P: Provider>(machine: &Machine, ctx: &Context<P>) -> Result<Action, LoopError> {
    let node = machine.node_name();
    let nodes: Api<Node> = Api::all(ctx.client.clone());
    if nodes
        .get_opt(&node)
        .await
        .map_err(|source| LoopError::Kube {
            action: format!("reading Node {node}"),
            source,
        })?
        .is_some()
    {
        return Err(LoopError::WaitingForNode(node));
    }
    // By default, never provisioned (its BMC refused us, say): nothing was powered on,
    // nothing to release, and a broken BMC set-up must not keep the Machine from going away.
    if ctx.provider.must_release(machine) {
        release_disks(machine, ctx).await?;
        if let Err(error) = ctx.provider.delete(machine).await {
            warn(ctx, machine, &error).await;
            return Err(error.into());
        }
        event(
            ctx,
            machine,
            EventType::Normal,
            "Released",
            "infrastructure released",
        )
        .await;
    }
    Ok(Action::await_change())
}

/// What the configuration the Machine's disk was paved with says
/// ([`crate::release::wiping_version`]).
async fn configured<P>(machine: &Machine, ctx: &Context<P>) -> Configured {
    let Some(resolved) = wiping_version(machine) else {
        return Configured::NoConfiguration;
    };
    let name = resolved.version_name();
    match Api::<MachineConfigurationVersion>::all(ctx.client.clone())
        .get_opt(&name)
        .await
    {
        Ok(Some(version)) => Configured::from_storage(version.spec.template.storage.as_ref()),
        Ok(None) => Configured::Unreadable(format!("{name} does not exist")),
        Err(e) => Configured::Unreadable(format!("reading {name}: {e}")),
    }
}

/// The release of the disks ([`crate::release`]): `Ok` once the machine may be powered off;
/// the `DisksWiped` condition says why it waits or is held.
async fn release_disks<P: Provider>(machine: &Machine, ctx: &Context<P>) -> Result<(), LoopError> {
    let configured = configured(machine, ctx).await;
    let step = decide_release(&facts_of(
        machine,
        configured,
        condition::now(),
        ctx.settings.wipe_timeouts,
    ));
    let wanted = condition::new_condition(
        conditions::DISKS_WIPED,
        step.condition_status(),
        step.reason(),
        step.message(),
        machine.metadata.generation,
    );
    let current = machine
        .status
        .as_ref()
        .and_then(|s| condition::find(&s.conditions, conditions::DISKS_WIPED));
    if current.is_none_or(|c| !condition::same_meaning(c, &wanted)) {
        if let ReleaseStep::Hold { reason, message } = &step {
            event(ctx, machine, EventType::Warning, reason, message).await;
        }
        write_release_condition::<P>(&ctx.client, machine, wanted).await?;
    }
    match step {
        ReleaseStep::PowerOff { .. } => Ok(()),
        ReleaseStep::Wait { message } => Err(LoopError::WaitingForWipe(message)),
        ReleaseStep::Hold { reason, message } => Err(LoopError::WipeHeld { reason, message }),
    }
}

fn error_policy<P: Provider>(
    machine: Arc<Machine>,
    error: &LoopError,
    ctx: Arc<Context<P>>,
) -> Action {
    if let LoopError::WaitingForNode(_)
    | LoopError::WaitingForWipe(_)
    | LoopError::WipeHeld { .. } = error
    {
        tracing::debug!(machine = %machine.name_any(), %error, "waiting");
        return Action::requeue(requeue_after(&ctx.settings, error, 0));
    }
    let failures = ctx.failures.lock().map_or(1, |mut f| {
        let n = f.entry(machine.name_any()).or_insert(0);
        *n = n.saturating_add(1);
        *n
    });
    tracing::info!(machine = %machine.name_any(), %error, failures, "provider reconcile failed");
    Action::requeue(requeue_after(&ctx.settings, error, failures))
}

/// A provider failure as a Warning Event (its reason and message, never a credential).
async fn warn<P>(ctx: &Context<P>, machine: &Machine, error: &ProviderError) {
    event(
        ctx,
        machine,
        EventType::Warning,
        &error.reason,
        &error.message,
    )
    .await;
}

async fn event<P>(ctx: &Context<P>, machine: &Machine, type_: EventType, reason: &str, note: &str) {
    let _ = ctx
        .recorder
        .publish(
            &Event {
                type_,
                reason: reason.into(),
                note: Some(note.into()),
                action: "Provision".into(),
                secondary: None,
            },
            &machine.object_ref(&()),
        )
        .await;
}
